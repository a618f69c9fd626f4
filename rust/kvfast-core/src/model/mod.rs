//! What the model tells: a GGUF file's header and the model's index of the cache layers.

pub mod gguf;
pub mod layer_map;
