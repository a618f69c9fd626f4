//! The RoPE parameters Python gives `open` (kvfast.pre_rope reads them from the model's GGUF
//! header); kvfast-core checks them against the state's K rows.

use kvfast_core::values::rope::Rope;
use pyo3::prelude::*;

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

impl From<RopeArgs> for Rope {
    fn from(r: RopeArgs) -> Rope {
        Rope {
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
        }
    }
}
