//! A GGUF model's metadata for Python (only the header is read).

use kvfast_core::gguf::{read_metadata, Value};
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
    Ok(py.detach(|| kvfast_core::gguf::read_vocab(&path))?)
}
