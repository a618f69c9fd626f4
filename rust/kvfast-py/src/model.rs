//! A GGUF model's metadata for Python (only the header is read).

use kvfast_core::model::gguf::{read_metadata, Value};
use kvfast_core::model::layer_map::ModelLayers;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::Result;

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

/// What a model says about its layers, as `ModelGeometry.layers()` gives it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct ModelArg {
    arch: String,
    n_layer: usize,
    attention: Option<Vec<bool>>,
    swa: Vec<bool>,
    recurrent: Option<Vec<bool>>,
}

impl From<ModelArg> for ModelLayers {
    fn from(m: ModelArg) -> Self {
        ModelLayers {
            arch: m.arch,
            n_layer: m.n_layer,
            attention: m.attention,
            swa: m.swa,
            recurrent: m.recurrent,
        }
    }
}

/// The model layer of every layer of each attention cache, given each cache's layer count.
#[pyfunction]
pub fn attention_map(model: ModelArg, cache_layers: Vec<usize>) -> Result<Vec<Vec<i32>>> {
    Ok(ModelLayers::from(model).attention_map(&cache_layers)?)
}
