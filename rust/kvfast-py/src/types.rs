//! The ggml type table, for Python (it lives in kvfast-core's `types.rs`).

use kvfast_core::format::types::ALL_TYPES;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Every type a cache can hold, in kvfast-core's order: name -> (ggml type id, values per block,
/// bytes per block, offset of the quant bytes in a block).
#[pyfunction]
pub fn ggml_types(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for t in ALL_TYPES {
        d.set_item(
            t.name(),
            (t.id(), t.block_len(), t.block_bytes(), t.quants_at()),
        )?;
    }
    Ok(d)
}
