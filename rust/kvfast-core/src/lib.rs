//! kvfast-core: read llama.cpp KV-cache state bytes without Python.
//!
//! [`State::open`] maps a state and walks its layout (metadata only, no row read);
//! [`values::decode`] turns rows of any cache type into f32.

pub mod attention;
pub mod compare;
pub mod error;
pub mod format;
pub mod model;
pub mod open;
pub mod parallel;
pub mod plan;
pub mod source;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod values;
pub mod write;

pub use error::{Error, Result};
pub use format::container::{walk, WalkOptions};
pub use format::layout::{Cache, Container, Kind, Layer, Layout, Record, Region, Stream};
pub use format::types::GgmlType;
pub use source::state::State;
