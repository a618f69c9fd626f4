//! Statistics over rows: the passes, their tables, the kernels and the moments they fill.

pub mod kernels;
pub mod loss;
pub mod moments;
pub mod passes;
pub mod tables;
