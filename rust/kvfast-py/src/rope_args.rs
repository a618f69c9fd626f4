//! The RoPE parameters Python passes to `State.set_rope` (kvfast.pre_rope reads them from the
//! model's GGUF header), checked against the state's K rows.

use kvfast_core::values::rope::{Rope, RopeSpec};
use kvfast_core::State;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{Error, Result};

/// One layer's rope, as a dict of kvfast-core's `Rope` fields.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct RopeArgs {
    n_dims: usize,
    head_dim: usize,
    freq_base: f32,
    freq_scale: f32,
    neox: bool,
    ext_factor: f32,
    attn_factor: f32,
    beta_fast: f32,
    beta_slow: f32,
    n_ctx_orig: u32,
    sections: [u32; 4],
    imrope: bool,
}

fn bad(msg: String) -> Error {
    Error::Python(PyValueError::new_err(msg))
}

/// The spec, checked: an entry per cache and layer at most, head sizes dividing the K rows, an
/// even number of roped dimensions within the head, finite positive bases and scales.
pub fn rope_spec(sf: &State, spec: Vec<Vec<Option<RopeArgs>>>) -> Result<RopeSpec> {
    if spec.len() > sf.layout.caches.len() {
        return Err(bad(format!(
            "RoPE parameters for {} caches, the state has {}",
            spec.len(),
            sf.layout.caches.len()
        )));
    }
    let mut out = vec![];
    for (ci, layers) in spec.into_iter().enumerate() {
        let cache = &sf.layout.caches[ci];
        let mut row = vec![];
        for (li, r) in layers.into_iter().enumerate() {
            let Some(r) = r else {
                row.push(None);
                continue;
            };
            let n_embd = cache
                .streams
                .iter()
                .find_map(|s| s.layers.get(li).map(|l| l.k.n_embd as usize));
            let fits = n_embd.is_some_and(|n| r.head_dim > 0 && n % r.head_dim == 0);
            if !fits || r.n_dims % 2 != 0 || r.n_dims > r.head_dim {
                return Err(bad(format!(
                    "cache {ci} layer {li}: RoPE of {} dimensions in heads of {} does not fit K rows of {n_embd:?} values",
                    r.n_dims, r.head_dim
                )));
            }
            let finite = [r.freq_base, r.freq_scale, r.attn_factor, r.ext_factor]
                .iter()
                .all(|v| v.is_finite());
            if !finite || r.freq_base <= 0.0 || r.freq_scale <= 0.0 || r.attn_factor == 0.0 {
                return Err(bad(format!(
                    "cache {ci} layer {li}: RoPE base, scale and factors must be finite and positive"
                )));
            }
            row.push(Some(Rope {
                n_dims: r.n_dims,
                head_dim: r.head_dim,
                freq_base: r.freq_base,
                freq_scale: r.freq_scale,
                neox: r.neox,
                ext_factor: r.ext_factor,
                attn_factor: r.attn_factor,
                beta_fast: r.beta_fast,
                beta_slow: r.beta_slow,
                n_ctx_orig: r.n_ctx_orig,
                sections: r.sections,
                imrope: r.imrope,
            }));
        }
        out.push(row);
    }
    Ok(out)
}
