//! Attention over a state's cache: the weights of query vectors (captured from llama.cpp by the
//! probe runner, or given) over the cells each may see, as llama.cpp computes its softmax, and
//! their reductions (attention mass per cell, entropy per query, the top cells of each query).
//!
//! [`params`] reads how the model attends (heads, scale, soft-cap, window) from its GGUF header;
//! [`seen`] says which cells each query sees; [`keys`] reads one KV head's keys; [`tile`] is the
//! kernel (a tile of queries against the keys: f32 matrix products, the online softmax, with the
//! vector loops of [`simd`]); [`pass`] runs a pass over an opened state in parallel and reduces
//! the weights (with [`kernel`]'s top cells); [`dense`] gives one layer's weights as a dense
//! `[head, query, cell]` array.

pub mod dense;
pub mod finite;
pub mod kernel;
pub mod keys;
pub mod params;
pub mod pass;
pub mod request;
pub mod seen;
pub mod simd;
pub mod tile;

use crate::model::geometry::ModelError;
use crate::plan::select::PlanError;

/// Why attention cannot be computed as asked.
#[derive(Debug, thiserror::Error)]
pub enum AttnError {
    /// The state's bytes (a remote state's rows not fetched).
    #[error(transparent)]
    Read(#[from] crate::Error),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The model's header does not say how it attends, or asks what kvfast does not compute.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Queries (or a request) that do not fit the model or the state: `field` names the argument.
    #[error("{message}")]
    Queries {
        field: &'static str,
        message: String,
    },
    /// A query would see fewer cells than it saw in llama.cpp.
    #[error("{0}")]
    Incomplete(String),
}
