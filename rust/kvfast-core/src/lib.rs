//! kvfast-core: read llama.cpp KV-cache state bytes without Python.
//!
//! [`State::open`] maps a state and walks its layout (metadata only, no row read);
//! [`decode`] turns rows of any cache type into f32.

pub mod alloc;
pub mod arch;
pub mod cache;
pub mod cells;
pub mod columns;
pub mod compare_table;
pub mod container;
pub mod cursor;
pub mod decode;
pub mod error;
pub mod file;
pub mod geometry;
pub mod gguf;
pub mod guarantees;
pub mod kernels;
pub mod layer_map;
pub mod layout;
pub mod match_position;
pub mod matching;
pub mod moments;
pub mod quantize;
pub mod records;
pub mod recurrent;
pub mod rope;
pub mod rotation;
pub mod round_trip;
pub mod select;
pub mod server_tokens;
pub mod sparse;
pub mod state;
pub mod stats;
pub mod stats_tables;
pub mod table_plan;
#[cfg(test)]
mod testing;
pub mod types;
pub mod view;
pub mod write;
pub mod write_edit;

pub use container::{walk, WalkOptions};
pub use error::{Error, Result};
pub use layout::{Cache, Container, Kind, Layer, Layout, Record, Region, Stream};
pub use state::State;
pub use types::GgmlType;
