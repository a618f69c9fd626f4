//! Comparing two states: matching their cells and the table of their values' errors.

pub mod by_position;
pub mod matching;
pub mod table;
