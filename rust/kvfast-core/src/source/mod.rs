//! Where a state's bytes come from: files opened, mapped or read, and remote pages fetched.

pub mod file;
pub mod sparse;
pub mod state;
