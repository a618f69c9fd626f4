//! llama.cpp's rotation rule, for Python to plan with (the rule lives in kvfast-core).

use kvfast_core::values::rotation::{k_group, v_group};
use kvfast_core::Kind;
use pyo3::prelude::*;

use crate::errors::{Error, Result};
use crate::state::parse_kind;

/// The group llama.cpp rotates `kind` rows of cache type `type_name` in, given the head size
/// shared by every layer of the cache (None: it does not rotate them).
#[pyfunction]
pub fn rotation_group(kind: &str, type_name: &str, head_dim: Option<u64>) -> Result<Option<usize>> {
    let ty = kvfast_core::GgmlType::from_name(type_name)
        .ok_or_else(|| Error::UnknownType(type_name.to_string()))?;
    Ok(match parse_kind(kind)? {
        Kind::K => k_group(ty, head_dim),
        Kind::V => v_group(ty, head_dim),
        // the recurrent part is never rotated
        Kind::R | Kind::S => None,
    })
}
