//! `PyState` (Python's `kvfast._kvfast.State`): a mapped, walked state, as Python sees it.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use kvfast_arrow::rows::record_rows;
use kvfast_arrow::table::{batches, TableRequest};
use kvfast_core::format::recurrent::RecurrentHint;
use kvfast_core::model::layer_map::{model_layer, LayerMap};
use kvfast_core::open::{OpenOptions, Opened};
use kvfast_core::plan::records::{records, records_table};
use kvfast_core::plan::select::{jobs, Selection};
use kvfast_core::plan::table_plan::{out_type, Dtype, Out};
use kvfast_core::values::rope::{rope_of, CellRope};
use kvfast_core::values::rotation_decide::Mode;
use kvfast_core::{GgmlType, Kind, Record, State, WalkOptions};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::byte_view::{i32s, ByteView};
use crate::columns::finish;
use crate::errors::{Error, Result};
use crate::stream::ArrowStream;

#[pyclass(frozen, name = "State", module = "kvfast._kvfast")]
/// An opened state for Python (`kvfast._kvfast.State`): kvfast-core's [`Opened`], everything
/// decided at open (geometry, layer map, rotation, RoPE); immutable until closed.
pub struct PyState {
    /// None once closed.
    inner: RwLock<Option<Arc<Opened>>>,
    /// A remote state's `fetch(ranges) -> list of bytes` (see `remote.rs`); None: a local one.
    fetch: Option<Py<PyAny>>,
}

fn parse_dtype(dtype: Option<&str>) -> Result<Dtype> {
    match dtype {
        None => Ok(Dtype::Stored),
        Some("float32") | Some("f32") => Ok(Dtype::F32),
        Some(d) => Err(Error::Dtype(d.to_string())),
    }
}

pub(crate) fn parse_kind(kind: &str) -> Result<Kind> {
    Kind::parse(kind).ok_or_else(|| Error::Kind(kind.to_string()))
}

/// The kinds Python selected (None: K then V).
pub(crate) fn parse_kinds(kinds: Option<Vec<String>>) -> Result<Vec<Kind>> {
    match kinds {
        None => Ok(Kind::BOTH.to_vec()),
        Some(ks) => ks.iter().map(|k| parse_kind(k)).collect(),
    }
}

impl PyState {
    /// The opened state, checked unchanged on disk since open (every pass starts here).
    pub(crate) fn get(&self) -> Result<Arc<Opened>> {
        let op = self
            .inner
            .read()
            .expect("lock")
            .clone()
            .ok_or(Error::Closed)?;
        op.check_unchanged()?;
        Ok(op)
    }

    /// An opened state (`fetch`: a remote one's fetching callable).
    pub(crate) fn wrap(op: Opened, fetch: Option<Py<PyAny>>) -> Self {
        PyState {
            inner: RwLock::new(Some(Arc::new(op))),
            fetch,
        }
    }

    /// A walked state opened with no option: values as stored, one head per row.
    fn plain(py: Python<'_>, sf: State, fetch: Option<Py<PyAny>>) -> Result<Self> {
        let opts = OpenOptions {
            rotation: Mode::None,
            ..OpenOptions::default()
        };
        let op = py.detach(|| Opened::new(sf, opts))?;
        Ok(PyState::wrap(op, fetch))
    }

    /// Fetch the rows a pass over `sel` reads that are not fetched yet (a remote state).
    pub(crate) fn ready(&self, py: Python<'_>, sf: &State, sel: &Selection) -> Result<()> {
        if self.fetch.is_none() {
            return Ok(());
        }
        let rows = crate::remote::selected_rows(sf, sel)?;
        crate::remote::ready(py, self.fetch.as_ref(), sf, &rows)
    }

    /// Fetch what is not fetched yet of byte ranges (offset, length) (a remote state).
    pub(crate) fn ready_ranges(
        &self,
        py: Python<'_>,
        sf: &State,
        ranges: &[(u64, u64)],
    ) -> Result<()> {
        crate::remote::ready(py, self.fetch.as_ref(), sf, ranges)
    }

    fn record<'a>(
        sf: &'a State,
        cache: usize,
        stream: usize,
        layer: usize,
        kind: &str,
    ) -> Result<(&'a Record, Kind)> {
        let c = sf.layout.caches.get(cache).ok_or(Error::NoCache(cache))?;
        let s = c
            .streams
            .get(stream)
            .ok_or(Error::NoStream { cache, stream })?;
        let l = s.layers.get(layer).ok_or(Error::NoLayer {
            cache,
            stream,
            layers: s.layers.len(),
            layer,
        })?;
        let kind = parse_kind(kind)?;
        let rec = l.record(kind).ok_or_else(|| Error::NoRecord {
            cache,
            layer,
            kind,
            why: match (c.memory.is_recurrent(), kind) {
                (true, _) => "it is the recurrent part, whose records are R and S",
                (false, Kind::V) => {
                    "the cache is V-less (MLA: its K rows hold the compressed latent and the RoPE \
                     part, from which attention computes V)"
                }
                (false, _) => "it is an attention cache, whose records are K and V",
            },
        })?;
        Ok((rec, kind))
    }
}

/// Walk the state file at `path`, mapped (`mmap`) or read into memory, the GIL released.
pub(crate) fn walk_file(
    py: Python<'_>,
    path: &std::path::Path,
    mmap: bool,
    opts: WalkOptions,
) -> Result<State> {
    Ok(py.detach(|| {
        if mmap {
            State::open(path, opts)
        } else {
            State::read(path, opts)
        }
    })?)
}

fn walk_options(
    cell_ext: Option<bool>,
    v_less: Option<bool>,
    recurrent: Option<(u32, u32)>,
) -> WalkOptions {
    WalkOptions {
        cell_ext,
        v_less,
        recurrent: recurrent.map(|(n_layer, layers)| RecurrentHint { n_layer, layers }),
    }
}

fn type_name(t: Option<GgmlType>) -> Option<&'static str> {
    t.map(|t| t.name())
}

#[pymethods]
impl PyState {
    /// `v_less` and `recurrent` ((the model's n_layer, its layers with R and S records)) say what
    /// the model says where the bytes cannot tell (see kvfast_core::WalkOptions).
    #[new]
    #[pyo3(signature = (path, cell_ext=None, mmap=true, v_less=None, recurrent=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        cell_ext: Option<bool>,
        mmap: bool,
        v_less: Option<bool>,
        recurrent: Option<(u32, u32)>,
    ) -> Result<Self> {
        let opts = walk_options(cell_ext, v_less, recurrent);
        let sf = walk_file(py, &path, mmap, opts)?;
        PyState::plain(py, sf, None)
    }

    /// (bytes, rounds, ranges) fetched of a remote state; zeros for a local one.
    #[getter]
    fn fetched(&self) -> Result<(u64, u64, u64)> {
        Ok(crate::remote::fetched(&*self.get()?))
    }

    /// Fetch the rows of the selected records that are not fetched yet (nothing for a local
    /// state); every pass does it for what it reads.
    #[pyo3(signature = (caches=None, layers=None, kinds=None))]
    fn prefetch(
        &self,
        py: Python<'_>,
        caches: Option<Vec<u32>>,
        layers: Option<Vec<u32>>,
        kinds: Option<Vec<String>>,
    ) -> Result<()> {
        let sf = self.get()?;
        let sel = Selection {
            caches,
            layers,
            kinds: parse_kinds(kinds)?,
            ..Selection::default()
        };
        self.ready(py, &sf, &sel)
    }

    /// Walk state bytes held in memory.
    #[staticmethod]
    #[pyo3(signature = (data, cell_ext=None, v_less=None, recurrent=None))]
    fn from_bytes(
        py: Python<'_>,
        data: Vec<u8>,
        cell_ext: Option<bool>,
        v_less: Option<bool>,
        recurrent: Option<(u32, u32)>,
    ) -> Result<Self> {
        let opts = walk_options(cell_ext, v_less, recurrent);
        let sf = py.detach(|| State::from_bytes(data, opts))?;
        PyState::plain(py, sf, None)
    }

    /// The head sizes decided at open (K, V).
    #[getter]
    fn head_dims(&self) -> Result<(Option<u64>, Option<u64>)> {
        let [k, v] = self.get()?.head_dims;
        Ok((k, v))
    }

    /// Per cache (the recurrent part last), the model layer of each cache layer (None: not known).
    #[getter]
    fn model_layers(&self) -> Result<LayerMap> {
        Ok(self.get()?.model_layers.clone())
    }

    /// One row per (cache, layer, kind), every stream's bytes summed (kvfast-core's records):
    /// cache, layer, model_layer, kind, type, n_embd, nbytes.
    fn records(&self) -> Result<ArrowStream> {
        let sf = self.get()?;
        Ok(finish(records_table(&records(
            &sf.layout,
            &sf.model_layers,
        ))))
    }

    /// The rotation groups decided at open.
    #[getter]
    fn rotation(&self) -> Result<Vec<[usize; 2]>> {
        Ok(self.get()?.rotation_groups().to_vec())
    }

    /// The group llama.cpp stores `kind` rows of type `type_name` of cache `cache` in (0: as
    /// computed), by its rule in this state's head sizes (None: a head size not known decides).
    fn rule_group(&self, cache: usize, kind: &str, type_name: &str) -> Result<Option<usize>> {
        let ty = GgmlType::from_name(type_name)
            .ok_or_else(|| Error::UnknownType(type_name.to_string()))?;
        Ok(self.get()?.rule_group(cache, parse_kind(kind)?, ty))
    }

    fn close(&self) {
        *self.inner.write().expect("lock") = None;
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().expect("lock").is_none()
    }

    /// Address of the first byte of the mapped state (to tell views of the map from copies).
    #[getter]
    fn map_address(&self) -> Result<usize> {
        Ok(self.get()?.bytes().as_ptr() as usize)
    }

    /// Container, version and the other scalars of the state.
    fn info<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        info_dict(py, &self.get()?.state)
    }

    /// `n` f32 values starting at byte `offset` (logits, embeddings), copied.
    fn floats_at(&self, py: Python<'_>, offset: u64, n: u64) -> Result<ByteView> {
        let sf = self.get()?;
        let end = offset
            .checked_add(n.saturating_mul(4))
            .filter(|e| *e <= sf.layout.size);
        let end = end.ok_or(Error::OutsideState)?;
        self.ready_ranges(py, &sf, &[(offset, end - offset)])?;
        sf.require(offset, end - offset, || "floats".into())?;
        Ok(ByteView {
            data: arrow_buffer::Buffer::from(&sf.bytes()[offset as usize..end as usize]),
        })
    }

    /// Caches as lists of stream dicts (metadata arrays as little-endian i32 buffers).
    fn caches<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyList>> {
        let sf = self.get()?;
        caches_list(py, &sf, &sf.model_layers)
    }

    /// The file's regions in file order, as columns.
    fn regions<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        let sf = self.get()?;
        let rs = sf.layout.regions();
        let d = PyDict::new(py);
        d.set_item("offset", rs.iter().map(|r| r.offset).collect::<Vec<_>>())?;
        d.set_item("nbytes", rs.iter().map(|r| r.nbytes).collect::<Vec<_>>())?;
        d.set_item("what", rs.iter().map(|r| r.what).collect::<Vec<_>>())?;
        d.set_item("role", rs.iter().map(|r| r.role).collect::<Vec<_>>())?;
        d.set_item("cache", rs.iter().map(|r| r.cache).collect::<Vec<_>>())?;
        d.set_item("stream", rs.iter().map(|r| r.stream).collect::<Vec<_>>())?;
        d.set_item("kind", rs.iter().map(|r| r.kind).collect::<Vec<_>>())?;
        d.set_item("layer", rs.iter().map(|r| r.layer).collect::<Vec<_>>())?;
        d.set_item(
            "type",
            rs.iter().map(|r| type_name(r.ty)).collect::<Vec<_>>(),
        )?;
        Ok(d)
    }

    /// One record's rows: (buffer, numpy dtype name, values per row, cells, zero_copy); in the
    /// model's basis, or as stored with `stored=True`.
    #[pyo3(signature = (cache, stream, layer, kind, dtype=None, stored=false))]
    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        py: Python<'_>,
        cache: usize,
        stream: usize,
        layer: usize,
        kind: &str,
        dtype: Option<&str>,
        stored: bool,
    ) -> Result<(ByteView, &'static str, usize, usize, bool)> {
        let sf = self.get()?;
        let dtype = parse_dtype(dtype)?;
        let (rec, kind) = Self::record(&sf, cache, stream, layer, kind)?;
        let rec = rec.clone();
        self.ready_ranges(py, &sf, &[(rec.data_offset, rec.data_len)])?;
        let cells = sf.layout.caches[cache].streams[stream].cell_count as usize;
        let rot = if stored {
            0
        } else {
            sf.rotation_groups()
                .get(cache)
                .map_or(0, |g| g[kind.index()])
        };
        let spec = if stored { vec![] } else { sf.rope.clone() };
        let st = &sf.layout.caches[cache].streams[stream];
        let rope =
            rope_of(&spec, cache as u32, layer as u32, kind).map(|rope| CellRope::of(rope, st));
        let r = py.detach(|| record_rows(&sf, &rec, cells, 0..cells, dtype, rot, rope))?;
        let name = if r.out == Out::F16 {
            "float16"
        } else {
            "float32"
        };
        Ok((
            ByteView { data: r.buf },
            name,
            r.n_embd,
            r.cells,
            r.zero_copy,
        ))
    }

    /// The values column of this state's whole value table (every K and V record, as stored, in
    /// the geometry, rotation and RoPE set on the state), by table_plan's rule: (numpy dtype name,
    /// the head sizes, ascending: one for a table to be planned); None for a state of no K or V
    /// record (the recurrent part alone). Callers over many states agree them.
    fn value_plan(&self) -> Result<Option<(&'static str, Vec<usize>)>> {
        let sf = self.get()?;
        let sel = sf.everything();
        let jobs = jobs(&sf.layout, &sel)?;
        if jobs.is_empty() {
            return Ok(None);
        }
        let f16 = jobs
            .iter()
            .all(|j| out_type(j.rec.ty, Dtype::Stored, j.transform()) == Out::F16);
        let dims: std::collections::BTreeSet<usize> = jobs.iter().map(|j| j.head_dim).collect();
        let name = if f16 { "float16" } else { "float32" };
        Ok(Some((name, dims.into_iter().collect())))
    }

    /// The long value table as Arrow batches.
    #[pyo3(signature = (caches=None, layers=None, kinds=None, heads=None, dtype=None, with_values=true))]
    #[allow(clippy::too_many_arguments)]
    fn table(
        &self,
        py: Python<'_>,
        caches: Option<Vec<u32>>,
        layers: Option<Vec<u32>>,
        kinds: Option<Vec<String>>,
        heads: Option<Vec<u32>>,
        dtype: Option<&str>,
        with_values: bool,
    ) -> Result<ArrowStream> {
        let sf = self.get()?;
        let req = TableRequest {
            sel: sf.selection(caches, layers, parse_kinds(kinds)?, heads),
            dtype: parse_dtype(dtype)?,
            model_layers: sf.model_layers.clone(),
            with_values,
            // a memory's parts of different head sizes share one table (a list column)
            ragged: true,
        };
        let seq_default = sf.layout.own_seq();
        if req.with_values {
            self.ready(py, &sf, &req.sel)?;
        }
        let (schema, batches) = py.detach(|| batches(&sf, &req, seq_default))?;
        Ok(ArrowStream { schema, batches })
    }
}

/// Container, version and the other scalars of the state.
pub(crate) fn info_dict<'py>(py: Python<'py>, sf: &State) -> Result<Bound<'py, PyDict>> {
    let l = &sf.layout;
    let d = PyDict::new(py);
    d.set_item("size", l.size)?;
    d.set_item("container", l.container.name())?;
    d.set_item("version", l.version)?;
    d.set_item("arch", l.arch.clone())?;
    d.set_item("seq_id", l.seq_id)?;
    d.set_item("ext_bytes", l.ext_bytes)?;
    d.set_item("features", l.features.clone())?;
    d.set_item("rows_on_device", l.rows_on_device)?;
    d.set_item("tokens", l.tokens.as_ref().map(|t| i32s(t)))?;
    let (era, evidence) = kvfast_core::values::rotation::era(l);
    d.set_item("era", era.name())?;
    d.set_item("era_evidence", evidence)?;
    if let Some(st) = &l.server_tokens {
        let media = PyList::empty(py);
        for m in &st.media {
            media.append((m.start, m.offset, m.nbytes))?;
        }
        d.set_item("server_tokens_version", st.version)?;
        d.set_item("media", media)?;
    }
    let (rows, outputs, meta) = l.byte_totals();
    d.set_item("row_bytes", rows)?;
    d.set_item("output_bytes", outputs)?;
    d.set_item("meta_bytes", meta)?;
    if let Some(o) = &l.outputs {
        d.set_item("output_pos", i32s(&o.output_pos))?;
        d.set_item("n_logits", o.n_logits)?;
        d.set_item("logits_offset", o.logits_offset)?;
        d.set_item("n_embeddings", o.n_embd)?;
        d.set_item("embeddings_offset", o.embd_offset)?;
    }
    Ok(d)
}

/// Caches as lists of stream dicts (metadata arrays as little-endian i32 buffers).
pub(crate) fn caches_list<'py>(
    py: Python<'py>,
    sf: &State,
    map: &LayerMap,
) -> Result<Bound<'py, PyList>> {
    let caches = PyList::empty(py);
    for (ci, c) in sf.layout.caches.iter().enumerate() {
        let streams = PyList::empty(py);
        for s in &c.streams {
            let d = PyDict::new(py);
            d.set_item("index", s.index)?;
            d.set_item("offset", s.offset)?;
            d.set_item("cell_count", s.cell_count)?;
            d.set_item("pos", i32s(&s.pos))?;
            let starts: Vec<i32> = s.seq_start.iter().map(|x| *x as i32).collect();
            d.set_item("seq_start", ByteView::from(starts))?;
            d.set_item("seq_ids", i32s(&s.seq_ids))?;
            d.set_item("ext", s.ext.as_ref().map(|e| i32s(e)))?;
            d.set_item("ext_width", s.ext_width)?;
            d.set_item("v_trans", s.v_trans)?;
            let layers = PyList::empty(py);
            // k_* and v_* keys (None: no V), or r_* and s_* in the recurrent part
            let kinds = if c.memory.is_recurrent() {
                Kind::RECURRENT
            } else {
                Kind::BOTH
            };
            for (li, l) in s.layers.iter().enumerate() {
                let ld = PyDict::new(py);
                ld.set_item(intern!(py, "index"), li)?;
                let ml = model_layer(map, ci as u32, li as u32);
                ld.set_item(intern!(py, "model_layer"), ml)?;
                for kind in kinds {
                    let r = l.record(kind);
                    let [ty, n_embd, offset, nbytes, row_bytes] = record_keys(py, kind);
                    ld.set_item(ty, type_name(r.map(|r| r.ty)))?;
                    ld.set_item(n_embd, r.map(|r| r.n_embd))?;
                    ld.set_item(offset, r.map(|r| r.data_offset))?;
                    ld.set_item(nbytes, r.map(|r| r.data_len))?;
                    ld.set_item(row_bytes, r.map(|r| r.row_bytes))?;
                }
                layers.append(ld)?;
            }
            d.set_item("layers", layers)?;
            streams.append(d)?;
        }
        let cd = PyDict::new(py);
        cd.set_item("offset", c.offset)?;
        cd.set_item("has_n_stream", c.has_n_stream)?;
        cd.set_item("memory", c.memory.name())?;
        if let kvfast_core::format::layout::Memory::Recurrent { n_layer } = c.memory {
            cd.set_item("n_layer", n_layer)?;
        }
        cd.set_item("streams", streams)?;
        caches.append(cd)?;
    }
    Ok(caches)
}

/// A layer dict's keys of one kind's record: type, values per row, offset, bytes, row bytes
/// (interned: open makes a dict per layer).
fn record_keys(py: Python<'_>, kind: Kind) -> [&Bound<'_, PyString>; 5] {
    macro_rules! keys {
        ($k:literal) => {
            [
                intern!(py, concat!($k, "_type")),
                intern!(py, concat!("n_embd_", $k)),
                intern!(py, concat!($k, "_offset")),
                intern!(py, concat!($k, "_nbytes")),
                intern!(py, concat!($k, "_row_bytes")),
            ]
        };
    }
    match kind {
        Kind::K => keys!("k"),
        Kind::V => keys!("v"),
        Kind::R => keys!("r"),
        Kind::S => keys!("s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_dtypes() {
        assert_eq!(parse_kind("K").unwrap(), Kind::K);
        assert_eq!(parse_kind("v").unwrap(), Kind::V);
        assert_eq!(parse_kinds(None).unwrap(), vec![Kind::K, Kind::V]);
        assert_eq!(
            parse_kinds(Some(vec!["V".into(), "k".into()])).unwrap(),
            vec![Kind::V, Kind::K]
        );
        assert_eq!(
            parse_kind("q").err().unwrap().to_string(),
            "kind must be 'k', 'v' (attention caches), 'r' or 's' (the recurrent part), not \"q\""
        );
        assert_eq!(parse_dtype(None).unwrap(), Dtype::Stored);
        assert_eq!(parse_dtype(Some("f32")).unwrap(), Dtype::F32);
        assert!(matches!(parse_dtype(Some("f16")), Err(Error::Dtype(_))));
    }
}
