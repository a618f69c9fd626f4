//! Attention over an opened state (kvfast-core's `attention`): the model's attention layers as
//! kvfast reads them, and a pass of query vectors over the cache, computed with the GIL released.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use kvfast_core::attention::dense;
use kvfast_core::attention::params::LayerAttn;
use kvfast_core::attention::pass::run_many;
use kvfast_core::attention::request::{Block, Incomplete, Queries, Reduce, Request};
use kvfast_core::model::geometry::Model;
use kvfast_core::open::Opened;
use kvfast_core::Kind;
use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::columns::stream;
use crate::errors::{Error, Result};
use crate::state::PyState;
use crate::stream::ArrowStream;

/// The attention layers of a model, as kvfast computes their softmax: per layer a dict of
/// model_layer, n_head, n_head_kv, head_dim, scale, softcap, window (its kind) and window_size.
#[pyfunction]
pub fn attention_layers<'py>(py: Python<'py>, model: PathBuf) -> Result<Vec<Bound<'py, PyDict>>> {
    let m = py.detach(|| Model::read(&model))?;
    let layers = LayerAttn::of_model(&m).map_err(Error::Model)?;
    let mut out = vec![];
    for l in layers {
        let d = PyDict::new(py);
        d.set_item("model_layer", l.model_layer)?;
        d.set_item("n_head", l.n_head)?;
        d.set_item("n_head_kv", l.n_head_kv)?;
        d.set_item("head_dim", l.head_dim)?;
        d.set_item("scale", l.scale)?;
        d.set_item("softcap", l.softcap)?;
        d.set_item("window", l.window.kind())?;
        d.set_item("window_size", l.window.size())?;
        out.push(d);
    }
    Ok(out)
}

fn incomplete_of(incomplete: &str) -> Result<Incomplete> {
    match incomplete {
        "error" => Ok(Incomplete::Error),
        "skip" => Ok(Incomplete::Skip),
        other => Err(Error::Python(pyo3::exceptions::PyValueError::new_err(
            format!("incomplete must be 'error' or 'skip', not {other:?}"),
        ))),
    }
}

/// The model's attention layers, with the scale and sinks given per model layer in place of its own.
fn model_layers(
    py: Python<'_>,
    model: &PathBuf,
    scale: Option<HashMap<u32, f64>>,
    sinks: Option<HashMap<u32, Vec<f64>>>,
) -> Result<Vec<LayerAttn>> {
    let m = py.detach(|| Model::read(model))?;
    let mut attn = LayerAttn::of_model(&m).map_err(Error::Model)?;
    for l in &mut attn {
        if let Some(s) = scale.as_ref().and_then(|s| s.get(&l.model_layer)) {
            l.scale = *s;
        }
        if let Some(s) = sinks.as_ref().and_then(|s| s.get(&l.model_layer)) {
            l.sinks = Some(s.clone());
        }
    }
    Ok(attn)
}

/// What a pass takes beside the query vectors: the state (a remote one's K rows fetched first),
/// the model's attention layers (with the scales and sinks given) and each layer's block of a row.
fn inputs(
    py: Python<'_>,
    state: &PyState,
    model: &PathBuf,
    scale: Option<HashMap<u32, f64>>,
    sinks: Option<HashMap<u32, Vec<f64>>>,
    blocks: Vec<(u32, usize, usize, usize)>,
) -> Result<(Arc<Opened>, Vec<LayerAttn>, Vec<Block>)> {
    let sf = state.get()?;
    let sel = sf.selection(None, None, vec![Kind::K], None);
    state.ready(py, &sf, &sel)?;
    let attn = model_layers(py, model, scale, sinks)?;
    let blocks = blocks
        .into_iter()
        .map(|(model_layer, offset, n_head, head_dim)| Block {
            model_layer,
            offset,
            n_head,
            head_dim,
        })
        .collect();
    Ok((sf, attn, blocks))
}

/// A C-contiguous buffer's items, borrowed for as long as the buffer is held.
fn items<'a, T: Element>(buf: &'a PyBuffer<T>, what: &str) -> Result<&'a [T]> {
    if buf.item_count() == 0 {
        return Ok(&[]);
    }
    let ptr = buf.as_slice_ptr().ok_or_else(|| {
        Error::Python(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} must be C-contiguous"
        )))
    })?;
    // SAFETY: the buffer is held (and so its memory kept) for as long as the borrow of `buf`;
    // the caller (kvfast.attn) hands read-only arrays, which nothing writes while a pass runs.
    Ok(unsafe { &*ptr.as_ptr() })
}

/// A pass of queries over `state`'s cache, a stream for each of `what` ("weights", "mass",
/// "entropy" or "top_k", of `k` cells), every query head's weights computed once for all. `values`: float32 rows of `row_len` values, `pos` / `seq` (int32) per row;
/// `blocks`: (model_layer, offset, n_head, head_dim) of each layer's heads in a row; `scale`,
/// `sinks`: per model layer, in place of the model's.
#[pyfunction]
#[pyo3(signature = (state, model, values, row_len, pos, seq, blocks, what, k=0, layers=None, heads=None, scale=None, sinks=None, incomplete="error", chunk=64))]
#[allow(clippy::too_many_arguments)]
pub fn attention(
    py: Python<'_>,
    state: &PyState,
    model: PathBuf,
    values: PyBuffer<f32>,
    row_len: usize,
    pos: PyBuffer<i32>,
    seq: PyBuffer<i32>,
    blocks: Vec<(u32, usize, usize, usize)>,
    what: Vec<String>,
    k: usize,
    layers: Option<Vec<u32>>,
    heads: Option<Vec<u32>>,
    scale: Option<HashMap<u32, f64>>,
    sinks: Option<HashMap<u32, Vec<f64>>>,
    incomplete: &str,
    chunk: usize,
) -> Result<Vec<ArrowStream>> {
    let whats = what
        .iter()
        .map(|w| match w.as_str() {
            "weights" => Ok(Reduce::Weights),
            "mass" => Ok(Reduce::Mass),
            "entropy" => Ok(Reduce::Entropy),
            "top_k" => Ok(Reduce::TopK(k)),
            other => Err(Error::Python(pyo3::exceptions::PyValueError::new_err(
                format!("what must be 'weights', 'mass', 'entropy' or 'top_k', not {other:?}"),
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    let incomplete = incomplete_of(incomplete)?;
    let (sf, attn, blocks) = inputs(py, state, &model, scale, sinks, blocks)?;
    let (values, pos, seq) = (
        items(&values, "values")?,
        items(&pos, "pos")?,
        items(&seq, "seq")?,
    );
    py.detach(|| {
        let req = Request {
            opened: &sf,
            layers: &attn,
            queries: Queries {
                values,
                row_len,
                pos,
                seq,
                blocks: &blocks,
            },
            model_layers: layers.as_deref(),
            heads: heads.as_deref(),
            incomplete,
            chunk,
        };
        Ok(run_many(&req, &whats)?.into_iter().map(stream).collect())
    })
}

/// One model layer's weights as a dense float32 NumPy array `[head, query, cell]` (NaN where a
/// query does not see a cell), over the cache's cells `cells` (start, stop of every stream's
/// cells in order, as a Python slice reads them; None: all), and a dict of what its axes are (kvfast-core's
/// `attention::dense`). The arguments are those of [`attention`].
#[pyfunction]
#[pyo3(signature = (state, model, values, row_len, pos, seq, blocks, layer, heads=None, scale=None, sinks=None, incomplete="error", chunk=64, cells=None))]
#[allow(clippy::too_many_arguments)]
pub fn attention_dense<'py>(
    py: Python<'py>,
    state: &PyState,
    model: PathBuf,
    values: PyBuffer<f32>,
    row_len: usize,
    pos: PyBuffer<i32>,
    seq: PyBuffer<i32>,
    blocks: Vec<(u32, usize, usize, usize)>,
    layer: u32,
    heads: Option<Vec<u32>>,
    scale: Option<HashMap<u32, f64>>,
    sinks: Option<HashMap<u32, Vec<f64>>>,
    incomplete: &str,
    chunk: usize,
    cells: Option<(Option<i64>, Option<i64>)>,
) -> Result<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
    let incomplete = incomplete_of(incomplete)?;
    let (sf, attn, blocks) = inputs(py, state, &model, scale, sinks, blocks)?;
    let (values, pos, seq) = (
        items(&values, "values")?,
        items(&pos, "pos")?,
        items(&seq, "seq")?,
    );
    let only = [layer];
    let req = Request {
        opened: &sf,
        layers: &attn,
        queries: Queries {
            values,
            row_len,
            pos,
            seq,
            blocks: &blocks,
        },
        model_layers: Some(&only),
        heads: heads.as_deref(),
        incomplete,
        chunk,
    };
    let prepared = py.detach(|| dense::prepare(&req, cells))?;
    let sh = &prepared.shape;
    let dims = (sh.heads.len(), sh.queries, sh.cell.len());
    let arr = py
        .import("numpy")?
        .getattr("empty")?
        .call1((dims, "float32"))?;
    let buf = PyBuffer::<f32>::get(&arr)?;
    if buf.readonly() || !buf.is_c_contiguous() || buf.item_count() != sh.len() {
        return Err(Error::Python(pyo3::exceptions::PyRuntimeError::new_err(
            "numpy.empty gave no writable C-contiguous array",
        )));
    }
    let ptr = buf.buf_ptr() as usize;
    let n = buf.item_count();
    py.detach(|| {
        // SAFETY: `arr` was just made here and no other reference to it exists; `buf` keeps its
        // memory alive and writable (checked above) for `n` f32 values until the fill returns.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, n) };
        dense::fill(&req, &prepared, out)
    })?;
    drop(buf);
    let d = PyDict::new(py);
    d.set_item("cache", sh.cache)?;
    d.set_item("layer", sh.layer)?;
    d.set_item("model_layer", sh.model_layer)?;
    d.set_item("heads", sh.heads.clone())?;
    d.set_item("stream", sh.stream.clone())?;
    d.set_item("cell", sh.cell.clone())?;
    d.set_item("pos", sh.pos.clone())?;
    Ok((arr, d))
}
