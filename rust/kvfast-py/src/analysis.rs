//! Statistics, comparisons and quantization losses, computed in Rust with the GIL released.

use std::collections::HashMap;

use kvfast_core::layer_map::{model_layer, LayerMap};
use kvfast_core::match_position::{match_positions, PositionIndex};
use kvfast_core::matching::{check_geometry, match_cells, CellIndex, Matched, Mismatch};
use kvfast_core::quantize::quantize_row;
use kvfast_core::rope::{rope_of, CellRope};
use kvfast_core::round_trip::RoundTrip;
use kvfast_core::select::{cell_seq_pairs, cells_from, grouped, jobs, Job, Selection};
use kvfast_core::stats::{
    accumulate, cell_stats as stats_of_cells, compare as compare_rows, round_trip_loss, Accum,
    CellStats, LossSums, Moments,
};
use kvfast_core::{Cache, GgmlType, Kind, StateFile, Stream};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::columns::Columns;
use crate::errors::{Error, Result};
use crate::state::{parse_kinds, State};
use crate::stream::ArrowStream;

/// What to compute over, as Python passes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct Select {
    caches: Option<Vec<u32>>,
    layers: Option<Vec<u32>>,
    kinds: Option<Vec<String>>,
}

/// A pass over one state: kvfast-core's selection (in the state's rotation and geometry) and the
/// model's layer map for the model_layer column.
pub(crate) struct Pass {
    pub(crate) sel: Selection,
    model_layers: LayerMap,
}

impl Select {
    pub(crate) fn pass(self, state: &State) -> Result<Pass> {
        let g = state.geometry();
        Ok(Pass {
            sel: Selection {
                caches: self.caches,
                layers: self.layers,
                kinds: parse_kinds(self.kinds)?,
                heads: None,
                head_dim_k: g.head_dim_k,
                head_dim_v: g.head_dim_v,
                rotation: state.rotation_groups(),
                rope: state.rope_spec(),
            },
            model_layers: g.model_layers,
        })
    }
}

impl Pass {
    pub(crate) fn model_layer(&self, job: &Job) -> Option<i32> {
        model_layer(&self.model_layers, job.cache, job.layer)
    }
}

/// One row per (cache, stream, layer, kind, cell, sequence, head).
#[pyfunction]
pub fn cell_stats(
    py: Python<'_>,
    state: &State,
    sel: Select,
    skip_first: i32,
) -> Result<ArrowStream> {
    let sf = state.get()?;
    let pass = sel.pass(state)?;
    state.ready(py, &sf, &pass.sel)?;
    py.detach(|| {
        let mut batches = vec![];
        for job in jobs(&sf.layout, &pass.sel)? {
            let pairs = cell_seq_pairs(job.stream, sf.layout.own_seq(), skip_first);
            let cells: Vec<usize> = pairs.iter().map(|p| p.0).collect();
            let stats = stats_of_cells(&sf.view(&job)?, &cells, job.head_dim);
            batches.push(cell_batch(&job, pass.model_layer(&job), &pairs, stats));
        }
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => cell_batch(&empty_job(&sf)?, None, &[], CellStats::default()).schema(),
        };
        Ok(ArrowStream { schema, batches })
    })
}

/// A stand-in job to give an empty result its schema.
fn empty_job(sf: &StateFile) -> Result<Job<'_>> {
    let stream = sf
        .layout
        .caches
        .iter()
        .flat_map(|c| &c.streams)
        .find(|s| !s.layers.is_empty())
        .ok_or(Error::NoCells)?;
    Ok(Job {
        cache: 0,
        stream,
        layer: 0,
        kind: Kind::K,
        rec: &stream.layers[0].k,
        head_dim: 1,
        rotation: 0,
        rope: None,
    })
}

/// One record's cell statistics as a batch: index columns, then the statistics.
fn cell_batch(
    job: &Job,
    model_layer: Option<i32>,
    pairs: &[(usize, Option<i32>)],
    stats: CellStats,
) -> arrow_array::RecordBatch {
    let nh = job.n_heads();
    let n = pairs.len() * nh;
    let mut keys = Keys::default();
    keys.extend(job, model_layer, n);
    let (mut cell, mut pos, mut seq, mut head) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (c, q) in pairs {
        cell.extend(std::iter::repeat_n(*c as i32, nh));
        pos.extend(std::iter::repeat_n(job.stream.pos[*c], nh));
        seq.extend(std::iter::repeat_n(*q, nh));
        head.extend(0..nh as i32);
    }
    let mut out = Columns::default();
    let Keys {
        cache,
        layer,
        model_layer,
        kind,
    } = keys;
    out.i32("cache", cache);
    out.i32("stream", vec![job.stream.index as i32; n]);
    out.i32("layer", layer);
    out.opt_i32("model_layer", model_layer);
    out.kind("kind", &kind);
    out.i32("cell", cell);
    out.i32("pos", pos);
    out.opt_i32("seq_id", seq);
    out.i32("head", head);
    out.f64("l2", stats.l2);
    out.f64("mean", stats.mean);
    out.f64("std", stats.std);
    out.f32("min", stats.min);
    out.f32("max", stats.max);
    out.f32("absmax", stats.absmax);
    out.u32("argmax", stats.argmax);
    out.batch()
}

/// The (cache, layer, model_layer, kind) columns of a per-record table.
#[derive(Default)]
struct Keys {
    cache: Vec<i32>,
    layer: Vec<i32>,
    model_layer: Vec<Option<i32>>,
    kind: Vec<&'static str>,
}

impl Keys {
    fn push(&mut self, job: &Job, model_layer: Option<i32>) {
        self.extend(job, model_layer, 1);
    }

    fn extend(&mut self, job: &Job, model_layer: Option<i32>, n: usize) {
        self.cache.extend(std::iter::repeat_n(job.cache as i32, n));
        self.layer.extend(std::iter::repeat_n(job.layer as i32, n));
        self.model_layer.extend(std::iter::repeat_n(model_layer, n));
        self.kind.extend(std::iter::repeat_n(job.kind.name(), n));
    }

    fn write(self, out: &mut Columns) {
        out.i32("cache", self.cache);
        out.i32("layer", self.layer);
        out.opt_i32("model_layer", self.model_layer);
        out.kind("kind", &self.kind);
    }
}

/// count, mean, std, min, max, absmax columns.
#[derive(Default)]
struct MomentCols {
    count: Vec<u64>,
    mean: Vec<f64>,
    std: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
    absmax: Vec<f64>,
}

impl MomentCols {
    fn push(&mut self, m: &Moments) {
        self.count.push(m.count);
        self.mean.push(if m.count == 0 { f64::NAN } else { m.mean });
        self.std.push(m.std());
        self.min.push(m.min as f64);
        self.max.push(m.max as f64);
        self.absmax.push(m.absmax as f64);
    }

    fn write(self, out: &mut Columns) {
        out.u64("count", self.count);
        out.f64("mean", self.mean);
        out.f64("std", self.std);
        out.f64("min", self.min);
        out.f64("max", self.max);
        out.f64("absmax", self.absmax);
    }
}

/// One aggregate table: keys, sub-indices (head, channel), moments and L2 norms.
#[derive(Default)]
struct Aggregate {
    keys: Keys,
    head: Vec<i32>,
    channel: Vec<i32>,
    moments: MomentCols,
    l2_mean: Vec<f64>,
    l2_max: Vec<f64>,
}

impl Aggregate {
    fn finish(self, with_head: bool, with_channel: bool) -> ArrowStream {
        let mut out = Columns::default();
        self.keys.write(&mut out);
        if with_head {
            out.i32("head", self.head);
        }
        if with_channel {
            out.i32("channel", self.channel);
        }
        self.moments.write(&mut out);
        if !with_channel {
            out.f64("l2_mean", self.l2_mean);
            out.f64("l2_max", self.l2_max);
        }
        out.finish()
    }
}

fn mean_of(sum: f64, n: u64) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// Channel, head and layer tables from one pass over the selected records.
#[pyfunction]
pub fn aggregate_stats(
    py: Python<'_>,
    state: &State,
    sel: Select,
    skip_first: i32,
) -> Result<(ArrowStream, ArrowStream, ArrowStream)> {
    let sf = state.get()?;
    let pass = sel.pass(state)?;
    state.ready(py, &sf, &pass.sel)?;
    py.detach(|| {
        let (mut chan, mut head, mut layer) = (
            Aggregate::default(),
            Aggregate::default(),
            Aggregate::default(),
        );
        for group in grouped(jobs(&sf.layout, &pass.sel)?) {
            let j0 = &group[0];
            let (hd, n) = (j0.head_dim, j0.rec.n_embd as usize);
            let mut acc = Accum::new(n, n / hd);
            for job in &group {
                let cells = cells_from(job.stream, skip_first);
                acc.merge(&accumulate(&sf.view(job)?, &cells, hd));
            }
            let ml = pass.model_layer(j0);
            for (c, m) in acc.channels.iter().enumerate() {
                chan.keys.push(j0, ml);
                chan.head.push((c / hd) as i32);
                chan.channel.push((c % hd) as i32);
                chan.moments.push(m);
            }
            let mut all = Moments::default();
            let (mut l2_sum, mut l2_max, mut rows) = (0f64, 0f64, 0u64);
            for (h, &(sum, max, r)) in acc.l2.iter().enumerate() {
                let m = acc.head(h, hd);
                all.merge(&m);
                head.keys.push(j0, ml);
                head.head.push(h as i32);
                head.moments.push(&m);
                head.l2_mean.push(mean_of(sum, r));
                head.l2_max.push(max);
                l2_sum += sum;
                l2_max = l2_max.max(max);
                rows += r;
            }
            layer.keys.push(j0, ml);
            layer.moments.push(&all);
            layer.l2_mean.push(mean_of(l2_sum, rows));
            layer.l2_max.push(l2_max);
        }
        Ok((
            chan.finish(true, true),
            head.finish(true, false),
            layer.finish(false, false),
        ))
    })
}

fn parse_type(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| Error::UnknownType(name.to_string()))
}

/// What quantizing each row with `type_name` (ggml's reference quantizer) would lose, per head.
/// `rotate` = (K group, V group): where nonzero, the pipeline is llama.cpp's for a rotated cache:
/// rotate, quantize, dequantize, rotate back (the Hadamard matrix is its own inverse).
#[pyfunction]
pub fn quant_error(
    py: Python<'_>,
    state: &State,
    type_name: &str,
    sel: Select,
    skip_first: i32,
    rotate: (usize, usize),
) -> Result<ArrowStream> {
    let sf = state.get()?;
    let pass = sel.pass(state)?;
    let ty = parse_type(type_name)?;
    state.ready(py, &sf, &pass.sel)?;
    py.detach(|| {
        let mut out = Columns::default();
        let (mut cache, mut layer, mut ml, mut kind, mut head) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut cols: [Vec<f64>; 8] = Default::default();
        let mut count = vec![];
        for group in grouped(jobs(&sf.layout, &pass.sel)?) {
            let j0 = &group[0];
            let n = j0.rec.n_embd as usize;
            let rot = match j0.kind {
                Kind::K => rotate.0,
                Kind::V => rotate.1,
                // llama.cpp never rotates the recurrent part
                Kind::R | Kind::S => 0,
            };
            let rt = RoundTrip::new(ty, rot, n, j0.layer, j0.kind)?;
            let trip = move |x: &[f32], y: &mut [f32]| rt.apply(x, y);
            let mut sums = vec![LossSums::default(); n / j0.head_dim];
            for job in &group {
                let cells = cells_from(job.stream, skip_first);
                let s = round_trip_loss(&sf.view(job)?, &cells, j0.head_dim, &trip);
                for (a, b) in sums.iter_mut().zip(&s) {
                    a.merge(b);
                }
            }
            for (h, s) in sums.iter().enumerate() {
                cache.push(j0.cache as i32);
                layer.push(j0.layer as i32);
                ml.push(pass.model_layer(j0));
                kind.push(j0.kind.name());
                head.push(h as i32);
                count.push(s.count);
                let c = s.count as f64;
                let cosine = s.ab / (s.aa.sqrt() * s.bb.sqrt());
                for (col, v) in cols.iter_mut().zip([
                    s.se / c,
                    s.max_abs,
                    (s.se / s.aa).sqrt(),
                    cosine,
                    s.se,
                    s.aa,
                    s.bb,
                    s.ab,
                ]) {
                    col.push(v);
                }
            }
        }
        out.i32("cache", cache);
        out.i32("layer", layer);
        out.opt_i32("model_layer", ml);
        out.kind("kind", &kind);
        out.i32("head", head);
        out.u64("count", count);
        let [mse, max_abs, rel, cosine, se, aa, bb, ab] = cols;
        out.f64("mse", mse);
        out.f64("max_abs", max_abs);
        out.f64("rel", rel);
        out.f64("cosine", cosine);
        out.f64("sum_sq_err", se);
        out.f64("sum_sq", aa);
        out.f64("sum_sq_quant", bb);
        out.f64("sum_prod", ab);
        Ok(out.finish())
    })
}

/// Quantize f32 values (whole blocks) with ggml's reference quantizer for `type_name`.
#[pyfunction]
pub fn quantize<'py>(
    py: Python<'py>,
    type_name: &str,
    values: Vec<f32>,
) -> Result<Bound<'py, PyBytes>> {
    let ty = parse_type(type_name)?;
    let rb = ty
        .row_bytes(values.len() as u64)
        .ok_or(Error::NotWholeBlocks {
            n: values.len(),
            ty,
        })?;
    let mut out = vec![0u8; rb as usize];
    quantize_row(ty, &values, &mut out);
    Ok(PyBytes::new(py, &out))
}

/// Errors of `b` against `a`, cells matched by (sequence, position) (kvfast-core's `matching`).
#[pyfunction]
pub fn compare(py: Python<'_>, a: &State, b: &State, sel: Select) -> Result<ArrowStream> {
    compare_matched(py, a, b, sel, Match::Sequence)
}

/// How `compare_matched` pairs A's cells with B's.
pub(crate) enum Match {
    /// By (sequence, position).
    Sequence,
    /// By position alone, only A's cells below the position when given.
    Position(Option<i32>),
}

/// B's cells of one cache, indexed the way `Match` pairs them.
enum Index {
    Cells(CellIndex),
    Positions(PositionIndex, Option<i32>),
}

impl Index {
    fn new(how: &Match, cache: &Cache, seq_default: Option<i32>) -> Self {
        match how {
            Match::Sequence => Index::Cells(CellIndex::new(cache, seq_default)),
            Match::Position(below) => Index::Positions(PositionIndex::new(cache), *below),
        }
    }

    fn matched(
        &self,
        cache: u32,
        stream: &Stream,
        seq_default: Option<i32>,
    ) -> std::result::Result<Vec<Matched>, Mismatch> {
        match self {
            Index::Cells(ib) => match_cells(cache, stream, seq_default, ib),
            Index::Positions(ib, below) => match_positions(cache, stream, seq_default, ib, *below),
        }
    }
}

/// Errors of `b` against `a`, cells paired as `how` says: the columns of `compare`.
pub(crate) fn compare_matched(
    py: Python<'_>,
    a: &State,
    b: &State,
    sel: Select,
    how: Match,
) -> Result<ArrowStream> {
    let (sa, sb) = (a.get()?, b.get()?);
    let pass = sel.pass(a)?;
    a.ready(py, &sa, &pass.sel)?;
    b.ready(py, &sb, &pass.sel)?;
    let rot_b = b.rotation_groups();
    let rope_b = b.rope_spec();
    py.detach(|| {
        check_geometry(&sa.layout, &sb.layout)?;
        let mut out = Columns::default();
        let mut idx: [Vec<i32>; 5] = Default::default();
        let (mut ml, mut kinds, mut seqs) = (vec![], vec![], vec![]);
        let mut cols: [Vec<f64>; 4] = Default::default();
        let mut index_b: HashMap<u32, Index> = HashMap::new();
        for job in jobs(&sa.layout, &pass.sel)? {
            let cb = &sb.layout.caches[job.cache as usize];
            let ib = index_b
                .entry(job.cache)
                .or_insert_with(|| Index::new(&how, cb, sb.layout.own_seq()));
            let matched = ib.matched(job.cache, job.stream, sa.layout.own_seq())?;
            let va = sa.view(&job)?;
            let nh = job.n_heads();
            let m = pass.model_layer(&job);
            for part in matched {
                let s_b = &cb.streams[part.stream];
                let Some(rec_b) = s_b
                    .layers
                    .get(job.layer as usize)
                    .and_then(|l| l.record(job.kind))
                else {
                    continue; // never: the geometry and the walk make B's streams agree with A's
                };
                let vb = sb
                    .record_view(rec_b, s_b.cell_count as usize)?
                    .with_rotation(
                        rot_b
                            .get(job.cache as usize)
                            .map_or(0, |g| g[job.kind.index()]),
                    )
                    .with_rope(
                        rope_of(&rope_b, job.cache, job.layer, job.kind)
                            .map(|rope| CellRope::of(rope, s_b)),
                    );
                let stats = compare_rows(&va, &vb, &part.cells, job.head_dim);
                for (i, st) in stats.iter().enumerate() {
                    let (ca, _) = part.cells[i / nh];
                    for (col, v) in idx.iter_mut().zip([
                        job.cache as i32,
                        job.layer as i32,
                        ca as i32,
                        job.stream.pos[ca],
                        (i % nh) as i32,
                    ]) {
                        col.push(v);
                    }
                    ml.push(m);
                    kinds.push(job.kind.name());
                    seqs.push(part.seqs[i / nh]);
                    for (col, v) in cols.iter_mut().zip([st.mse, st.max_abs, st.cosine, st.rel]) {
                        col.push(v);
                    }
                }
            }
        }
        let [cache, layer, cell, pos, head] = idx;
        out.i32("cache", cache);
        out.i32("layer", layer);
        out.opt_i32("model_layer", ml);
        out.kind("kind", &kinds);
        out.i32("cell", cell);
        out.i32("pos", pos);
        out.opt_i32("seq_id", seqs);
        out.i32("head", head);
        let [mse, max_abs, cosine, rel] = cols;
        out.f64("mse", mse);
        out.f64("max_abs", max_abs);
        out.f64("cosine", cosine);
        out.f64("rel", rel);
        Ok(out.finish())
    })
}
