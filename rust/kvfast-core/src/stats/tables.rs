//! The statistics tables of a pass: per (cell, head), per channel, per head, per layer, and the
//! losses of a quantize round trip, as plain columns (kvfast-core's `columns`): the kernels of
//! `passes` over the records `select` chooses, grouped and keyed here.

use rayon::prelude::*;

use crate::format::layout::{Kind, Layout};
use crate::format::types::GgmlType;
use crate::model::layer_map::model_layer;
use crate::plan::columns::{self, Keys, Table, Values};
use crate::plan::select::{cell_seq_pairs, cells_from, grouped, jobs, Job, PlanError, Selection};
use crate::source::state::State;
use crate::stats::loss::LossColumns;
use crate::stats::passes::{
    accumulate, cell_stats as stats_of_cells, round_trip_loss, Accum, CellStats, LossSums, Moments,
};
use crate::values::round_trip::RoundTrip;

/// A pass over one state's records: the state, the selection and the model-layer map.
pub struct Pass<'a> {
    pub sf: &'a State,
    pub sel: &'a Selection,
    pub map: &'a [Option<Vec<i32>>],
}

impl<'a> Pass<'a> {
    fn model_layer(&self, job: &Job) -> Option<i32> {
        model_layer(self.map, job.cache, job.layer)
    }

    pub(crate) fn layout(&self) -> &'a Layout {
        &self.sf.layout
    }

    pub(crate) fn jobs(&self) -> Result<Vec<Job<'a>>, PlanError> {
        jobs(&self.sf.layout, self.sel)
    }
}

/// Why a table cannot be made: a selection that does not fit, rows not there (a remote state's
/// rows not fetched), or two states that cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Core(#[from] crate::Error),
    #[error(transparent)]
    Mismatch(#[from] crate::compare::matching::Mismatch),
}

/// One table per record (one stream's K or V of one layer): a row per (cell, sequence, head) of
/// the cells at positions >= `skip_first`; index columns, then l2, mean, std, min, max, absmax,
/// argmax (null for a head of NaNs only) and nan (the head's NaN values, left out of the rest: see
/// `moments`). No record: one table of no rows.
pub fn cell_stats(p: &Pass, skip_first: i32) -> Result<Vec<Table>, TableError> {
    // the records in parallel too: a record's index columns are built on one thread, so one
    // record at a time would leave the other threads idle while they are
    let jobs = p.jobs()?;
    let mut out = crate::parallel::install(|| {
        jobs.par_iter()
            .map(|job| -> Result<Table, TableError> {
                let pairs = cell_seq_pairs(job.stream, p.layout().own_seq(), skip_first);
                let cells: Vec<usize> = pairs.iter().map(|c| c.0).collect();
                let stats = stats_of_cells(&p.sf.view(job)?, &cells, job.head_dim);
                let heads: Vec<u32> = (0..job.n_heads() as u32).collect();
                let mut t = columns::value_index(job, &pairs, &heads, p.model_layer(job));
                push_cell_stats(&mut t, stats);
                Ok(t)
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    if out.is_empty() {
        let mut t = columns::empty_value_index();
        push_cell_stats(&mut t, CellStats::default());
        out.push(t);
    }
    Ok(out)
}

/// The l2, mean, std, min, max, absmax, argmax and nan columns of per-(cell, head) statistics.
fn push_cell_stats(t: &mut Table, stats: CellStats) {
    t.push("l2", Values::F64(stats.l2));
    t.push("mean", Values::F64(stats.mean));
    t.push("std", Values::F64(stats.std));
    t.push("min", Values::F32(stats.min));
    t.push("max", Values::F32(stats.max));
    t.push("absmax", Values::F32(stats.absmax));
    t.push_opt_u32("argmax", stats.argmax);
    t.push("nan", Values::U32(stats.nan));
}

/// count, cells, nan, mean, std, min, max, absmax columns: `count` values summarized over `cells`
/// cells, `nan` values left out (NaN); NaN statistics of no value.
#[derive(Default)]
struct MomentCols {
    count: Vec<u64>,
    nan: Vec<u64>,
    cells: Vec<u64>,
    mean: Vec<f64>,
    std: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
    absmax: Vec<f64>,
}

impl MomentCols {
    fn push(&mut self, m: &Moments, cells: u64) {
        let (mean, min, max, absmax) = m.reported();
        self.count.push(m.count);
        self.nan.push(m.nan);
        self.cells.push(cells);
        self.mean.push(mean);
        self.std.push(m.std());
        self.min.push(min);
        self.max.push(max);
        self.absmax.push(absmax);
    }

    fn write(self, out: &mut Table) {
        out.push("count", Values::U64(self.count));
        out.push("cells", Values::U64(self.cells));
        out.push("nan", Values::U64(self.nan));
        out.push("mean", Values::F64(self.mean));
        out.push("std", Values::F64(self.std));
        out.push("min", Values::F64(self.min));
        out.push("max", Values::F64(self.max));
        out.push("absmax", Values::F64(self.absmax));
    }
}

/// One aggregate table: keys, sub-indices (head, channel), moments and L2 norms.
#[derive(Default)]
struct Aggregate {
    keys: Keys,
    head: Vec<u16>,
    channel: Vec<u32>,
    moments: MomentCols,
    l2_mean: Vec<f64>,
    l2_max: Vec<f64>,
}

impl Aggregate {
    fn key(&mut self, job: &Job, ml: Option<i32>) {
        self.keys.extend(job.cache, job.layer, ml, job.kind, 1);
    }

    fn finish(self, with_head: bool, with_channel: bool) -> Table {
        let mut out = Table::default();
        self.keys.write(&mut out, None);
        if with_head {
            out.push("head", Values::U16(self.head));
        }
        if with_channel {
            out.push("channel", Values::U32(self.channel));
        }
        self.moments.write(&mut out);
        if !with_channel {
            out.push("l2_mean", Values::F64(self.l2_mean));
            out.push("l2_max", Values::F64(self.l2_max));
        }
        out
    }
}

fn mean_of(sum: f64, n: u64) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// The channel, head and layer tables of one pass over the selected records (each (cache, layer,
/// kind) merged over its streams), cells at positions >= `skip_first`.
pub fn aggregate(p: &Pass, skip_first: i32) -> Result<[Table; 3], TableError> {
    let (mut chan, mut head, mut layer) = (
        Aggregate::default(),
        Aggregate::default(),
        Aggregate::default(),
    );
    let groups = grouped(p.jobs()?);
    // the groups' sums in parallel too (each is parallel inside: a small record alone would
    // leave threads idle), then the rows in order
    let accs = crate::parallel::install(|| {
        groups
            .par_iter()
            .map(|group| -> Result<Accum, TableError> {
                let j0 = &group[0];
                let (hd, n) = (j0.head_dim, j0.rec.n_embd as usize);
                let mut acc = Accum::new(n, n / hd);
                for job in group {
                    let cells = cells_from(job.stream, skip_first);
                    acc.merge(&accumulate(&p.sf.view(job)?, &cells, hd));
                }
                Ok(acc)
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    for (group, acc) in groups.iter().zip(accs) {
        let j0 = &group[0];
        let hd = j0.head_dim;
        let ml = p.model_layer(j0);
        for (c, m) in acc.channels.iter().enumerate() {
            chan.key(j0, ml);
            chan.head.push((c / hd) as u16);
            chan.channel.push((c % hd) as u32);
            chan.moments.push(m, acc.cells);
        }
        let mut all = Moments::default();
        let (mut l2_sum, mut l2_max, mut rows) = (0f64, 0f64, 0u64);
        for (h, &(sum, max, r)) in acc.l2.iter().enumerate() {
            let m = acc.head(h, hd);
            all.merge(&m);
            head.key(j0, ml);
            head.head.push(h as u16);
            head.moments.push(&m, acc.cells);
            head.l2_mean.push(mean_of(sum, r));
            head.l2_max.push(if r == 0 { f64::NAN } else { max });
            l2_sum += sum;
            l2_max = l2_max.max(max);
            rows += r;
        }
        layer.key(j0, ml);
        layer.moments.push(&all, acc.cells);
        layer.l2_mean.push(mean_of(l2_sum, rows));
        layer.l2_max.push(if rows == 0 { f64::NAN } else { l2_max });
    }
    Ok([
        chan.finish(true, true),
        head.finish(true, false),
        layer.finish(false, false),
    ])
}

/// What quantizing each row as `ty` (ggml's reference quantizer) would lose: a table per (cache,
/// layer, kind, head) and one per (cache, layer, kind), with `loss`'s error columns (pooled and
/// per-row), the head table also with the sums behind them. `rotate` = (K group, V group): where
/// nonzero, llama.cpp's pipeline for a rotated cache: rotate, quantize, dequantize, rotate back.
pub fn quant_error(
    p: &Pass,
    ty: GgmlType,
    skip_first: i32,
    rotate: (usize, usize),
) -> Result<[Table; 2], TableError> {
    let (mut keys, mut layer_keys) = (Keys::default(), Keys::default());
    let mut head = vec![];
    let (mut heads, mut layers) = (LossColumns::default(), LossColumns::default());
    let mut sums_cols: [Vec<f64>; 4] = Default::default();
    for group in grouped(p.jobs()?) {
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
            let s = round_trip_loss(&p.sf.view(job)?, &cells, j0.head_dim, &trip);
            for (a, b) in sums.iter_mut().zip(&s) {
                a.merge(b);
            }
        }
        let ml = p.model_layer(j0);
        let mut all = LossSums::default();
        for (h, s) in sums.iter().enumerate() {
            keys.extend(j0.cache, j0.layer, ml, j0.kind, 1);
            head.push(h as u16);
            heads.push(s);
            all.merge(s);
            for (col, v) in sums_cols.iter_mut().zip([s.se, s.aa, s.bb, s.ab]) {
                col.push(v);
            }
        }
        layer_keys.extend(j0.cache, j0.layer, ml, j0.kind, 1);
        layers.push(&all);
    }
    let mut out = Table::default();
    keys.write(&mut out, None);
    out.push("head", Values::U16(head));
    heads.write(&mut out);
    let names = ["sum_sq_err", "sum_sq", "sum_sq_quant", "sum_prod"];
    for (name, col) in names.into_iter().zip(sums_cols) {
        out.push(name, Values::F64(col));
    }
    let mut by_layer = Table::default();
    layer_keys.write(&mut by_layer, None);
    layers.write(&mut by_layer);
    Ok([out, by_layer])
}
