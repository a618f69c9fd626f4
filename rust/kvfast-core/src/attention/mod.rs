//! Attention over a state's cache: the weights of query vectors (captured from llama.cpp by the
//! probe runner, or given) over the cells each may see, as llama.cpp computes its softmax, and
//! their reductions (attention mass per cell, entropy per query, the top cells of each query).
//!
//! [`params`] reads how the model attends (heads, scale, soft-cap, window) from its GGUF header;
//! [`kernel`] is one query head's logits and softmax in f64; [`pass`] runs a pass over an opened
//! state in parallel, one layer's keys at a time; [`dense`] gives one layer's weights as a dense
//! `[head, query, cell]` array.

pub mod dense;
pub mod finite;
pub mod kernel;
pub mod params;
pub mod pass;

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
