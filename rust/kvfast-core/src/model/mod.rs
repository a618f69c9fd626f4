//! What the model tells: a GGUF file's header, what llama.cpp's per-architecture rules make of it
//! (the geometry, the RoPE) and the model's index of the cache layers.

pub mod arch;
pub mod geometry;
pub mod gguf;
pub mod layer_map;
pub mod memory;
