//! A record's values: decoded, quantized, rotated, un-roped, viewed, round-tripped, and the memory they are decoded into.

pub mod alloc;
pub mod decode;
pub mod quantize;
pub mod rope;
pub mod rope_pairs;
pub mod rotation;
pub mod rotation_decide;
pub mod round_trip;
pub mod view;
