//! Statistics, comparisons and quantization losses, computed in Rust with the GIL released.

use std::collections::HashMap;

use kvfast_core::decode::decode_row;
use kvfast_core::quantize::quantize_row;
use kvfast_core::rotation::hadamard_groups;
use kvfast_core::stats::{
    accumulate, cell_stats as stats_of_cells, compare as compare_rows, round_trip_loss, Accum,
    CellStats, Moments,
};
use kvfast_core::view::RecordView;
use kvfast_core::{GgmlType, StateFile};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::columns::Columns;
use crate::errors::{Error, Mismatch, Result};
use crate::rows::Dtype;
use crate::state::{parse_kind, State};
use crate::stream::ArrowStream;
use crate::table::{cell_seq_pairs, jobs, model_layer, Job, Selection};

/// What to compute over, as Python passes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct Select {
    caches: Option<Vec<u32>>,
    layers: Option<Vec<u32>>,
    kinds: Option<Vec<String>>,
    head_dim_k: Option<u64>,
    head_dim_v: Option<u64>,
    model_layers: Option<Vec<Vec<i32>>>,
}

impl Select {
    fn selection(self, state: &State) -> Result<Selection> {
        let kinds = match self.kinds {
            None => vec!["k", "v"],
            Some(ks) => ks.iter().map(|k| parse_kind(k)).collect::<Result<_>>()?,
        };
        Ok(Selection {
            caches: self.caches,
            layers: self.layers,
            kinds,
            heads: None,
            dtype: Dtype::F32,
            head_dim_k: self.head_dim_k,
            head_dim_v: self.head_dim_v,
            model_layers: self.model_layers,
            with_values: true,
            rotation: state.rotation_groups(),
        })
    }
}

fn view<'a>(sf: &'a StateFile, job: &Job<'a>) -> RecordView<'a> {
    RecordView::new(sf.bytes(), job.rec, job.stream.cell_count as usize).with_rotation(job.rotation)
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
    let sel = sel.selection(state)?;
    py.detach(|| {
        let mut batches = vec![];
        for job in jobs(&sf, &sel)? {
            let pairs = cell_seq_pairs(job.stream, sf.layout.seq_id, skip_first);
            let cells: Vec<usize> = pairs.iter().map(|p| p.0).collect();
            let stats = stats_of_cells(&view(&sf, &job), &cells, job.head_dim);
            batches.push(cell_batch(&sf, &sel, &job, &pairs, stats));
        }
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => cell_batch(&sf, &sel, &empty_job(&sf)?, &[], CellStats::default()).schema(),
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
        kind: "k",
        rec: &stream.layers[0].k,
        head_dim: 1,
        rotation: 0,
    })
}

/// One record's cell statistics as a batch: index columns, then the statistics.
fn cell_batch(
    sf: &StateFile,
    sel: &Selection,
    job: &Job,
    pairs: &[(usize, Option<i32>)],
    stats: CellStats,
) -> arrow_array::RecordBatch {
    let nh = job.rec.n_embd as usize / job.head_dim;
    let n = pairs.len() * nh;
    let mut keys = Keys::default();
    keys.extend(job, model_layer(sf, sel, job.cache, job.layer), n);
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

/// Group the selected records by (cache, layer, kind) across streams, in first-seen order.
fn grouped<'a>(sf: &'a StateFile, sel: &Selection) -> Result<Vec<Vec<Job<'a>>>> {
    let mut order: Vec<(u32, u32, &str)> = vec![];
    let mut groups: HashMap<(u32, u32, &str), Vec<Job<'a>>> = HashMap::new();
    for job in jobs(sf, sel)? {
        let key = (job.cache, job.layer, job.kind);
        if !groups.contains_key(&key) {
            order.push(key);
        }
        groups.entry(key).or_default().push(job);
    }
    Ok(order
        .into_iter()
        .map(|k| groups.remove(&k).expect("grouped"))
        .collect())
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
        self.kind.extend(std::iter::repeat_n(job.kind, n));
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
    let sel = sel.selection(state)?;
    py.detach(|| {
        let (mut chan, mut head, mut layer) = (
            Aggregate::default(),
            Aggregate::default(),
            Aggregate::default(),
        );
        for group in grouped(&sf, &sel)? {
            let j0 = &group[0];
            let (hd, n) = (j0.head_dim, j0.rec.n_embd as usize);
            let mut acc = Accum::new(n, n / hd);
            for job in &group {
                let cells: Vec<usize> = (0..job.stream.cell_count as usize)
                    .filter(|c| job.stream.pos[*c] >= skip_first)
                    .collect();
                acc.merge(&accumulate(&view(&sf, job), &cells, hd));
            }
            let ml = model_layer(&sf, &sel, j0.cache, j0.layer);
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
    let sel = sel.selection(state)?;
    let ty = parse_type(type_name)?;
    py.detach(|| {
        let mut out = Columns::default();
        let (mut cache, mut layer, mut ml, mut kind, mut head) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut cols: [Vec<f64>; 8] = Default::default();
        let mut count = vec![];
        for group in grouped(&sf, &sel)? {
            let j0 = &group[0];
            let n = j0.rec.n_embd as usize;
            if ty.row_bytes(n as u64).is_none() {
                return Err(Error::RowsNotWholeBlocks {
                    layer: j0.layer,
                    kind: j0.kind,
                    n,
                    ty,
                });
            }
            let rot = if j0.kind == "k" { rotate.0 } else { rotate.1 };
            if rot > 0 && (!rot.is_power_of_two() || n % rot != 0) {
                return Err(Error::SimulatedRotation {
                    group: rot,
                    n,
                    layer: j0.layer,
                    kind: j0.kind,
                });
            }
            // The quantized row is sized from the row itself (every stream's rows have one width:
            // the walk checks it), so no row is ever read into another's width.
            let trip = move |x: &[f32], y: &mut [f32]| {
                let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap_or(0) as usize];
                if rot > 0 {
                    let mut r = x.to_vec();
                    hadamard_groups(&mut r, rot);
                    quantize_row(ty, &r, &mut q);
                    decode_row(ty, &q, y);
                    hadamard_groups(y, rot);
                } else {
                    quantize_row(ty, x, &mut q);
                    decode_row(ty, &q, y);
                }
            };
            let mut sums = vec![Default::default(); n / j0.head_dim];
            for job in &group {
                let cells: Vec<usize> = (0..job.stream.cell_count as usize)
                    .filter(|c| job.stream.pos[*c] >= skip_first)
                    .collect();
                let s = round_trip_loss(&view(&sf, job), &cells, j0.head_dim, &trip);
                for (a, b) in sums.iter_mut().zip(&s) {
                    kvfast_core::stats::LossSums::merge(a, b);
                }
            }
            for (h, s) in sums.iter().enumerate() {
                cache.push(j0.cache as i32);
                layer.push(j0.layer as i32);
                ml.push(model_layer(&sf, &sel, j0.cache, j0.layer));
                kind.push(j0.kind);
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

type Key = (Option<i32>, i32);

/// Errors of `b` against `a`, cells matched by (sequence, position).
#[pyfunction]
pub fn compare(py: Python<'_>, a: &State, b: &State, sel: Select) -> Result<ArrowStream> {
    let (sa, sb) = (a.get()?, b.get()?);
    let sel = sel.selection(a)?;
    let rot_b = b.rotation_groups();
    py.detach(|| {
        check_geometry(&sa, &sb)?;
        let mut out = Columns::default();
        let mut idx: [Vec<i32>; 5] = Default::default();
        let (mut ml, mut kinds, mut seqs) = (vec![], vec![], vec![]);
        let mut cols: [Vec<f64>; 4] = Default::default();
        for job in jobs(&sa, &sel)? {
            let cb = &sb.layout.caches[job.cache as usize];
            let mut where_b: HashMap<Key, (usize, usize)> = HashMap::new();
            for (si, s) in cb.streams.iter().enumerate() {
                for (c, q) in cell_seq_pairs(s, sb.layout.seq_id, i32::MIN) {
                    where_b.insert((q, s.pos[c]), (si, c));
                }
            }
            let pairs_a = cell_seq_pairs(job.stream, sa.layout.seq_id, i32::MIN);
            let mut by_stream: HashMap<usize, Vec<(usize, usize, Option<i32>)>> = HashMap::new();
            let mut missing = vec![];
            for (c, q) in &pairs_a {
                match where_b.get(&(*q, job.stream.pos[*c])) {
                    Some((si, cbi)) => by_stream.entry(*si).or_default().push((*c, *cbi, *q)),
                    None => missing.push((*q, job.stream.pos[*c])),
                }
            }
            if let Some((q, p)) = missing.first() {
                return Err(Mismatch::Cells {
                    missing: missing.len(),
                    cache: job.cache,
                    stream: job.stream.index,
                    seq: *q,
                    pos: *p,
                }
                .into());
            }
            let mut streams: Vec<_> = by_stream.into_iter().collect();
            streams.sort_by_key(|s| s.0);
            let va = view(&sa, &job);
            for (si, triples) in streams {
                let s_b = &cb.streams[si];
                let lb = &s_b.layers[job.layer as usize];
                let rec_b = if job.kind == "k" {
                    &lb.k
                } else {
                    lb.v.as_ref().expect("geometry checked")
                };
                let ki = usize::from(job.kind == "v");
                let vb = RecordView::new(sb.bytes(), rec_b, s_b.cell_count as usize)
                    .with_rotation(rot_b.get(job.cache as usize).map_or(0, |g| g[ki]));
                let pairs: Vec<(usize, usize)> = triples.iter().map(|t| (t.0, t.1)).collect();
                let stats = compare_rows(&va, &vb, &pairs, job.head_dim);
                let nh = job.rec.n_embd as usize / job.head_dim;
                let m = model_layer(&sa, &sel, job.cache, job.layer);
                for (i, st) in stats.iter().enumerate() {
                    let (ca, _, q) = triples[i / nh];
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
                    kinds.push(job.kind);
                    seqs.push(q);
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

fn check_geometry(a: &StateFile, b: &StateFile) -> std::result::Result<(), Mismatch> {
    let (ca, cb) = (&a.layout.caches, &b.layout.caches);
    if ca.len() != cb.len() {
        return Err(Mismatch::Caches {
            a: ca.len(),
            b: cb.len(),
        });
    }
    for (i, (x, y)) in ca.iter().zip(cb).enumerate() {
        let shape = |c: &kvfast_core::Cache| -> Vec<(u64, Option<u64>)> {
            c.streams
                .iter()
                .find(|s| s.cell_count > 0)
                .map(|s| {
                    s.layers
                        .iter()
                        .map(|l| (l.k.n_embd, l.v.as_ref().map(|v| v.n_embd)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (sx, sy) = (shape(x), shape(y));
        if sx.len() != sy.len() {
            return Err(Mismatch::Layers {
                cache: i,
                a: sx.len(),
                b: sy.len(),
            });
        }
        for (l, (p, q)) in sx.iter().zip(&sy).enumerate() {
            if p != q {
                return Err(Mismatch::Rows {
                    cache: i,
                    layer: l,
                    a: *p,
                    b: *q,
                });
            }
        }
    }
    Ok(())
}
