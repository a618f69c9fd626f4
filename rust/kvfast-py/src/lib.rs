//! `kvfast._kvfast`: the thin PyO3 layer over kvfast-core.

mod analysis;
mod attention;
mod byte_view;
mod columns;
mod compare_modes;
mod errors;
mod model;
mod model_read;
mod open;
mod parquet_write;
mod parts;
mod remote;
mod rope_args;
mod rotation;
mod state;
mod stream;
mod types;
mod write;

use pyo3::prelude::*;

#[pymodule]
fn _kvfast(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<state::PyState>()?;
    m.add_function(wrap_pyfunction!(open::open, m)?)?;
    m.add_class::<byte_view::ByteView>()?;
    m.add_class::<stream::ArrowStream>()?;
    m.add_function(wrap_pyfunction!(model::gguf_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(model::gguf_vocab, m)?)?;
    m.add_function(wrap_pyfunction!(model::attention_map, m)?)?;
    m.add_function(wrap_pyfunction!(model::walk_hints, m)?)?;
    m.add_function(wrap_pyfunction!(analysis::cell_stats, m)?)?;
    m.add_function(wrap_pyfunction!(analysis::aggregate_stats, m)?)?;
    m.add_function(wrap_pyfunction!(analysis::quant_error, m)?)?;
    m.add_function(wrap_pyfunction!(analysis::quantize, m)?)?;
    m.add_function(wrap_pyfunction!(analysis::compare, m)?)?;
    m.add_function(wrap_pyfunction!(attention::attention, m)?)?;
    m.add_function(wrap_pyfunction!(attention::attention_dense, m)?)?;
    m.add_function(wrap_pyfunction!(attention::attention_layers, m)?)?;
    m.add_function(wrap_pyfunction!(compare_modes::compare_positions, m)?)?;
    m.add_function(wrap_pyfunction!(rotation::rotation_group, m)?)?;
    m.add_function(wrap_pyfunction!(types::ggml_types, m)?)?;
    write::register(m)?;
    m.add_function(wrap_pyfunction!(parquet_write::write_parquet, m)?)?;
    model_read::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // the index columns' types, the record kinds and the loss columns, as kvfast-core defines them
    let index = pyo3::types::PyDict::new(m.py());
    for (name, ty) in kvfast_core::plan::columns::INDEX {
        index.set_item(name, ty.name())?;
    }
    m.add("INDEX_COLUMNS", index)?;
    let kinds: Vec<&str> = kvfast_core::Kind::ALL.iter().map(|k| k.name()).collect();
    m.add("KINDS", kinds)?;
    // the error columns quant_error and compare share, in their order
    let loss = kvfast_core::stats::loss::LOSS_COUNTS
        .iter()
        .chain(&kvfast_core::stats::loss::LOSS_NAMES);
    m.add("LOSS_COLUMNS", loss.copied().collect::<Vec<&str>>())?;
    Ok(())
}
