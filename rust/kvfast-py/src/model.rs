//! A GGUF model's metadata for Python (only the header is read).

use kvfast_core::model::geometry::Geometry;
use kvfast_core::model::gguf::{read_metadata, Value};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::Result;
use crate::open::GeometryArg;

fn to_object<'py>(py: Python<'py>, v: &Value) -> Result<Option<Bound<'py, PyAny>>> {
    Ok(Some(match v {
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Str(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let l = PyList::empty(py);
            for it in items {
                if let Some(o) = to_object(py, it)? {
                    l.append(o)?;
                }
            }
            l.into_any()
        }
        Value::SkippedArray(_) => return Ok(None),
    }))
}

/// The key-value metadata of a GGUF file (arrays longer than 65,536 items, vocabularies, left out).
#[pyfunction]
pub fn gguf_metadata<'py>(py: Python<'py>, path: std::path::PathBuf) -> Result<Bound<'py, PyDict>> {
    let kv = py.detach(|| read_metadata(&path))?;
    let d = PyDict::new(py);
    for (k, v) in &kv {
        if let Some(o) = to_object(py, v)? {
            d.set_item(k, o)?;
        }
    }
    Ok(d)
}

/// A GGUF model's vocabulary (`tokenizer.ggml.tokens`, the piece of each token id), read from the
/// header alone; None when the model has none.
#[pyfunction]
pub fn gguf_vocab(py: Python<'_>, path: std::path::PathBuf) -> Result<Option<Vec<String>>> {
    Ok(py.detach(|| kvfast_core::model::gguf::read_vocab(&path))?)
}

/// The model layer of every layer of each attention cache, given each cache's layer count, for a
/// `ModelGeometry` (kvfast-core's map of its layers).
#[pyfunction]
pub fn attention_map(model: GeometryArg, cache_layers: Vec<usize>) -> Result<Vec<Vec<i32>>> {
    Ok(Geometry::from(model)
        .layers()
        .attention_map(&cache_layers)?)
}

/// What the walk cannot tell from the bytes, as a `ModelGeometry` says it: whether the caches hold
/// V, and the recurrent part's (n_layer field, layers with records); kvfast-core's rule.
#[pyfunction]
pub fn walk_hints(model: GeometryArg) -> (Option<bool>, Option<(u32, u32)>) {
    let (v_less, rec) = Geometry::from(model).walk_hints();
    (v_less, rec.map(|r| (r.n_layer, r.layers)))
}
