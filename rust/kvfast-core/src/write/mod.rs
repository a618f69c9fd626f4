//! Writing states llama.cpp loads back: a state as owned parts and its bytes, and edits on the parts.

pub mod edit;
pub mod parts;
