//! Each cache's part of the model's memory, as Python shows it (`State.parts`).

use kvfast_core::model::memory::Basis;
use kvfast_core::open::Opened;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Per cache (the recurrent part last), a dict of its `role`, `model_layers`, `head_dims` ([K, V];
/// V None: K only) and `k_basis` ("rule", "rotated N", "as computed"), or None where the model is
/// not known.
pub fn parts_list<'py>(py: Python<'py>, op: &Opened) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for p in &op.parts {
        let Some(p) = p else {
            out.append(py.None())?;
            continue;
        };
        let d = PyDict::new(py);
        d.set_item("role", p.role.name())?;
        d.set_item("model_layers", p.model_layers.clone())?;
        d.set_item("head_dims", (p.head_dims[0], p.head_dims[1]))?;
        let basis = match p.k_basis {
            Basis::Rule => "rule".to_string(),
            Basis::Rotated(g) => format!("rotated {g}"),
            Basis::AsComputed => "as computed".to_string(),
        };
        d.set_item("k_basis", basis)?;
        out.append(d)?;
    }
    Ok(out)
}
