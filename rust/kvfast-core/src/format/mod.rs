//! The state format: containers, caches, cells, the recurrent part, the guarantees of llama.cpp's writer, and the walked layout.

pub mod cache;
pub mod cells;
pub mod container;
pub mod cursor;
pub mod guarantees;
pub mod layout;
pub mod recurrent;
pub mod server_tokens;
pub mod types;
