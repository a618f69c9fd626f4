//! A model's geometry and RoPE, read from its GGUF header by kvfast-core (`kvfast.model`,
//! `kvfast.pre_rope` build on them).

use std::path::PathBuf;

use kvfast_core::model::geometry::{
    Geometry, Metadata, Model, ModelRope, MAX_MODEL_LAYERS, MAX_MODEL_VALUES,
};
use kvfast_core::model::gguf::read_metadata;
use kvfast_core::model::memory::Basis;
use kvfast_core::values::rope::Rope;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::Result;

/// The geometry of a model: `ModelGeometry`'s fields (tuples per layer).
#[pyfunction]
pub fn read_model<'py>(py: Python<'py>, path: PathBuf) -> Result<Bound<'py, PyDict>> {
    let g = py.detach(|| Model::read(&path))?.geometry;
    geometry_dict(py, &g)
}

/// `ModelGeometry`'s fields of a geometry (tuples per layer).
pub(crate) fn geometry_dict<'py>(py: Python<'py>, g: &Geometry) -> Result<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("arch", &g.arch)?;
    d.set_item("n_layer", g.n_layer)?;
    d.set_item("head_dim_k", g.head_dim_k)?;
    d.set_item("head_dim_v", g.head_dim_v)?;
    d.set_item("n_head_kv", PyTuple::new(py, &g.n_head_kv)?)?;
    d.set_item("swa", PyTuple::new(py, &g.swa)?)?;
    let flags = |f: &Option<Vec<bool>>| f.as_ref().map(|f| PyTuple::new(py, f)).transpose();
    d.set_item("recurrent", flags(&g.recurrent)?)?;
    d.set_item("attention", flags(&g.attention)?)?;
    d.set_item("v_less", g.v_less)?;
    d.set_item("n_layer_trunk", g.n_layer_trunk)?;
    d.set_item("head_dims_swa", g.head_dims_swa.map(|[k, v]| (k, v)))?;
    let indexer = match &g.indexer {
        None => None,
        Some(i) => {
            let e = PyDict::new(py);
            e.set_item("layers", PyTuple::new(py, &i.layers)?)?;
            e.set_item("head_dim_k", i.head_dim_k)?;
            e.set_item("head_dim_v", i.head_dim_v)?;
            let group = match i.k_basis {
                Basis::Rotated(g) => g,
                _ => 0,
            };
            e.set_item("k_rotation", group)?;
            Some(e)
        }
    };
    d.set_item("indexer", indexer)?;
    Ok(d)
}

fn rope_dict<'py>(py: Python<'py>, r: &Rope) -> Result<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_dims", r.n_dims)?;
    d.set_item("head_dim", r.head_dim)?;
    d.set_item("freq_base", r.freq_base)?;
    d.set_item("freq_scale", r.freq_scale)?;
    d.set_item("neox", r.neox)?;
    d.set_item("ext_factor", r.ext_factor)?;
    d.set_item("attn_factor", r.attn_factor)?;
    d.set_item("beta_fast", r.beta_fast)?;
    d.set_item("beta_slow", r.beta_slow)?;
    d.set_item("n_ctx_orig", r.n_ctx_orig)?;
    d.set_item("sections", r.sections.to_vec())?;
    d.set_item("imrope", r.imrope)?;
    Ok(d)
}

/// The model's rope parameters for K heads of `head_dim_k` values: `global` and `swa` (the
/// sliding-window layers'), each a dict of kvfast-core's Rope fields as `State.set_rope` takes
/// them.
#[pyfunction]
pub fn model_rope<'py>(
    py: Python<'py>,
    path: PathBuf,
    head_dim_k: usize,
) -> Result<Bound<'py, PyDict>> {
    let rope = py.detach(|| -> Result<ModelRope> {
        let meta = Metadata::new(read_metadata(&path)?);
        Ok(ModelRope::from_metadata(
            &path.display().to_string(),
            &meta,
            head_dim_k,
        )?)
    })?;
    let d = PyDict::new(py);
    d.set_item("global", rope_dict(py, &rope.global)?)?;
    d.set_item("swa", rope_dict(py, &rope.swa)?)?;
    Ok(d)
}

/// The module's bounds on a model's header: block_count, and head sizes and counts.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_LAYERS", MAX_MODEL_LAYERS)?;
    m.add("MAX_VALUES", MAX_MODEL_VALUES)?;
    m.add_function(wrap_pyfunction!(read_model, m)?)?;
    m.add_function(wrap_pyfunction!(model_rope, m)?)?;
    Ok(())
}
