//! `kvfast._kvfast.open`: one call opens a state (local or remote) with every option and returns
//! it with all that Python shows of it, decided by kvfast-core's [`Opened`].

use std::path::PathBuf;

use kvfast_core::model::geometry::{Geometry, Model};
use kvfast_core::model::memory::{Basis, Indexer};
use kvfast_core::open::{OpenError, OpenOptions, Opened};
use kvfast_core::values::rope::Rope;
use kvfast_core::values::rotation_decide::{BuildHint, Mode};
use kvfast_core::WalkOptions;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{Error, Result};
use crate::model_read::geometry_dict;
use crate::rope_args::RopeArgs;
use crate::state::{caches_list, info_dict, walk_file, PyState};

/// A model's geometry as Python's `ModelGeometry` holds it (its fields, by name).
#[derive(FromPyObject)]
pub struct GeometryArg {
    #[pyo3(attribute)]
    arch: String,
    #[pyo3(attribute)]
    n_layer: usize,
    #[pyo3(attribute)]
    head_dim_k: u64,
    #[pyo3(attribute)]
    head_dim_v: u64,
    #[pyo3(attribute)]
    n_head_kv: Vec<u64>,
    #[pyo3(attribute)]
    swa: Vec<bool>,
    #[pyo3(attribute)]
    recurrent: Option<Vec<bool>>,
    #[pyo3(attribute)]
    attention: Option<Vec<bool>>,
    #[pyo3(attribute)]
    v_less: Option<bool>,
    #[pyo3(attribute)]
    n_layer_trunk: Option<usize>,
    #[pyo3(attribute)]
    head_dims_swa: Option<(u64, u64)>,
    #[pyo3(attribute)]
    indexer: Option<IndexerArg>,
}

/// A `ModelGeometry`'s `IndexerGeometry` (its fields, by name).
#[derive(FromPyObject)]
pub struct IndexerArg {
    #[pyo3(attribute)]
    layers: Vec<bool>,
    #[pyo3(attribute)]
    head_dim_k: u64,
    #[pyo3(attribute)]
    head_dim_v: Option<u64>,
    #[pyo3(attribute)]
    k_rotation: usize,
}

impl From<GeometryArg> for Geometry {
    fn from(g: GeometryArg) -> Geometry {
        Geometry {
            arch: g.arch,
            n_layer: g.n_layer,
            head_dim_k: g.head_dim_k,
            head_dim_v: g.head_dim_v,
            n_head_kv: g.n_head_kv,
            swa: g.swa,
            recurrent: g.recurrent,
            attention: g.attention,
            v_less: g.v_less,
            n_layer_trunk: g.n_layer_trunk,
            head_dims_swa: g.head_dims_swa.map(|(k, v)| [k, v]),
            indexer: g.indexer.map(|i| Indexer {
                layers: i.layers,
                head_dim_k: i.head_dim_k,
                head_dim_v: i.head_dim_v,
                k_basis: if i.k_rotation > 0 {
                    Basis::Rotated(i.k_rotation)
                } else {
                    Basis::AsComputed
                },
            }),
        }
    }
}

/// `model=`: a `ModelGeometry`, or the path of a GGUF that kvfast-core reads (once: its geometry
/// and, for keys before RoPE, its RoPE). Made once per open: the size of its geometry variant
/// does not matter.
#[derive(FromPyObject)]
#[allow(clippy::large_enum_variant)]
pub enum ModelSource {
    Given(GeometryArg),
    Path(PathBuf),
}

/// The global and sliding-window RoPE, as `kvfast.pre_rope.model_rope` gives them.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct RopePair {
    global: RopeArgs,
    swa: RopeArgs,
}

fn parse_mode(mode: &str) -> Result<Mode> {
    Mode::parse(mode).ok_or_else(|| {
        Error::Python(PyValueError::new_err(format!(
            "rotation must be 'auto', 'hadamard' or 'none', not '{mode}'"
        )))
    })
}

/// Open a state: `path` mapped (`mmap=False`: read into memory), or a remote object of `size`
/// bytes fetched by `fetch(ranges) -> list of bytes` (its walk fetching `metadata_limit` bytes
/// at most); `model` a `ModelGeometry` (or None);
/// `model` a `ModelGeometry` or a GGUF's path (read here, once); `hint` (rotates, evidence) from a
/// probe manifest; `pre_rope` asks for keys before RoPE, whose parameters are the GGUF's, or
/// `rope(head_dim_k)`'s where given. Returns the state and a dict of what Python shows of it: the
/// info scalars, `caches`, `model_layers`, `partial` ((absent cache, its model layers) of a
/// PARTIAL_ONLY state, or None), `head_dims`, `rotation` (a dict per decision),
/// `rotation_warning` ((what is undecided with the advice, this state's evidence) or None), and
/// `model` (the geometry read from a GGUF; None otherwise).
#[pyfunction]
#[pyo3(signature = (
    path, *, size=None, fetch=None, cell_ext=None, mmap=true, head_dim=None, model=None,
    rotation="auto", hint=None, pre_rope=false, rope=None, metadata_limit=None
))]
#[allow(clippy::too_many_arguments)]
pub fn open<'py>(
    py: Python<'py>,
    path: PathBuf,
    size: Option<u64>,
    fetch: Option<Py<PyAny>>,
    cell_ext: Option<bool>,
    mmap: bool,
    head_dim: Option<u64>,
    model: Option<ModelSource>,
    rotation: &str,
    hint: Option<(bool, String)>,
    pre_rope: bool,
    rope: Option<Py<PyAny>>,
    metadata_limit: Option<u64>,
) -> Result<(PyState, Bound<'py, PyDict>)> {
    let mode = parse_mode(rotation)?;
    let (read, given): (Option<Model>, Option<Geometry>) = match model {
        None => (None, None),
        Some(ModelSource::Path(p)) => (Some(py.detach(|| Model::read(&p))?), None),
        Some(ModelSource::Given(g)) => (None, Some(g.into())),
    };
    let geometry = read.as_ref().map(|m| &m.geometry).or(given.as_ref());
    if let Some(g) = geometry {
        kvfast_core::open::read_memory(g)?;
    }
    let (v_less, recurrent) = geometry.map_or((None, None), Geometry::walk_hints);
    let walk = WalkOptions {
        cell_ext,
        v_less,
        recurrent,
    };
    let sf = match (&fetch, size) {
        (Some(f), Some(size)) => crate::remote::open(py, &path, size, f, walk, metadata_limit)?,
        _ => walk_file(py, &path, mmap, walk)?,
    };
    let hint = hint.map(|(rotates, evidence)| BuildHint { rotates, evidence });
    // the RoPE: given (a geometry has no header to read it from), or the GGUF's
    let rope_of = |head_dim_k: u64| -> std::result::Result<[Rope; 2], OpenError> {
        if let Some(f) = &rope {
            return Python::attach(|py| {
                let got = f.call1(py, (head_dim_k,)).map_err(py_to_open)?;
                let pair: RopePair = got.bind(py).extract().map_err(py_to_open)?;
                Ok([pair.global.into(), pair.swa.into()])
            });
        }
        let Some(m) = &read else {
            return Err(OpenError::rope(
                "pre_rope=True needs the model's GGUF (model=PATH; --model on the command line): \
                 the rope parameters and head size are in its header",
                Some("model"),
            ));
        };
        let r = m.rope(head_dim_k as usize)?;
        Ok([r.global, r.swa])
    };
    let opts = OpenOptions {
        head_dim,
        model: geometry,
        rotation: mode,
        hint: hint.as_ref(),
        pre_rope: pre_rope.then_some(Some(&rope_of as _)),
    };
    let reads = Opened::reads(&sf.layout, &opts);
    crate::remote::ready(py, fetch.as_ref(), &sf, &reads)?;
    let op = py.detach(|| Opened::new(sf, opts))?;
    let d = info_dict(py, &op)?;
    d.set_item("caches", caches_list(py, &op, &op.model_layers)?)?;
    d.set_item("model_layers", op.model_layers.clone())?;
    // what of the model's memory a partial state (PARTIAL_ONLY) lacks: (cache, model layers)
    let partial = op
        .partial
        .as_ref()
        .map(|p| (p.absent, p.model_layers.clone()));
    d.set_item("partial", partial)?;
    d.set_item("head_dims", (op.head_dims[0], op.head_dims[1]))?;
    d.set_item("parts", crate::parts::parts_list(py, &op)?)?;
    let decisions = PyList::empty(py);
    for r in &op.rotation {
        let e = PyDict::new(py);
        e.set_item("cache", r.cache)?;
        e.set_item("kind", r.kind.name())?;
        e.set_item("type", r.ty)?;
        e.set_item("undone", r.undone)?;
        e.set_item("group", r.group)?;
        e.set_item("evidence", &r.evidence)?;
        e.set_item("certain", r.certain)?;
        decisions.append(e)?;
    }
    d.set_item("rotation", decisions)?;
    d.set_item(
        "rotation_warning",
        op.rotation_warning
            .as_ref()
            .map(|n| (n.text.clone(), n.evidence.clone())),
    )?;
    let read = read.as_ref().map(|m| geometry_dict(py, &m.geometry));
    d.set_item("model", read.transpose()?)?;
    Ok((PyState::wrap(op, fetch), d))
}

/// A Python exception raised while computing the RoPE (a `PreRopeError` keeps its field).
fn py_to_open(e: PyErr) -> OpenError {
    OpenError::Other(Box::new(e))
}
