//! Statistics over a record's rows, streamed a chunk of cells at a time in parallel: memory stays
//! bounded by the chunk size times the number of threads, plus the results.

use rayon::prelude::*;

pub use crate::stats::moments::{min_max, one_cell, sum_sq, CellStat, LossSums, Moments};

use crate::format::types::GgmlType;
use crate::stats::kernels::{head_stats, loss_sums, vector_heads, ChannelSums, Sink, Values};
use crate::stats::loss::RowLoss;
use crate::values::view::RecordView;

/// Per-(cell, head) statistics as columns (NaN values left out and counted: see `moments`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellStats {
    pub l2: Vec<f64>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub min: Vec<f32>,
    pub max: Vec<f32>,
    pub absmax: Vec<f32>,
    /// None for a head of NaNs only.
    pub argmax: Vec<Option<u32>>,
    pub nan: Vec<u32>,
}

impl CellStats {
    pub fn len(&self) -> usize {
        self.l2.len()
    }

    pub fn is_empty(&self) -> bool {
        self.l2.is_empty()
    }
}

/// Per-(cell, head) statistics of the cells in `cells` (indices into the record), in that order;
/// `n_embd / head_dim` heads per cell (none for a head_dim of 0). A cell the view's bytes do not
/// hold reads as NaN.
pub fn cell_stats(v: &RecordView, cells: &[usize], head_dim: usize) -> CellStats {
    let n = v.n_embd;
    let heads = n.checked_div(head_dim).unwrap_or(0);
    if heads == 0 {
        return CellStats::default();
    }
    let rows = cells.len() * heads;
    let mut all = CellStats {
        l2: vec![0.0; rows],
        mean: vec![0.0; rows],
        std: vec![0.0; rows],
        min: vec![0.0; rows],
        max: vec![0.0; rows],
        absmax: vec![0.0; rows],
        argmax: vec![None; rows],
        nan: vec![0; rows],
    };
    let per = v.chunk_cells();
    let cols = &mut all;
    crate::parallel::install(|| stats_chunks(v, cells, head_dim, per, cols));
    all
}

/// `cell_stats`'s chunks of `per` cells, in parallel, into `all`'s columns.
fn stats_chunks(v: &RecordView, cells: &[usize], head_dim: usize, per: usize, all: &mut CellStats) {
    let n = v.n_embd;
    let k = per * n.checked_div(head_dim).unwrap_or(0);
    all.l2
        .par_chunks_mut(k)
        .zip(all.mean.par_chunks_mut(k))
        .zip(all.std.par_chunks_mut(k))
        .zip(all.min.par_chunks_mut(k))
        .zip(all.max.par_chunks_mut(k))
        .zip(all.absmax.par_chunks_mut(k))
        .zip(all.argmax.par_chunks_mut(k))
        .zip(all.nan.par_chunks_mut(k))
        .zip(cells.par_chunks(per))
        .for_each(
            |((((((((l2, mean), std), min), max), absmax), argmax), nan), chunk)| {
                let mut out = StatsOut {
                    at: 0,
                    l2,
                    mean,
                    std,
                    min,
                    max,
                    absmax,
                    argmax,
                    nan,
                };
                let direct = direct_f16(v, head_dim);
                let mut row = vec![0f32; n];
                for &c in chunk {
                    match direct.then(|| stored_row(v, c)).flatten() {
                        Some(bytes) => head_stats(Values::F16(bytes), head_dim, &mut out),
                        None => {
                            decode_cell(v, c, &mut row);
                            head_stats(Values::F32(&row), head_dim, &mut out);
                        }
                    }
                }
            },
        );
}

/// Where a chunk's statistics go: windows into the result columns.
struct StatsOut<'a> {
    at: usize,
    l2: &'a mut [f64],
    mean: &'a mut [f64],
    std: &'a mut [f64],
    min: &'a mut [f32],
    max: &'a mut [f32],
    absmax: &'a mut [f32],
    argmax: &'a mut [Option<u32>],
    nan: &'a mut [u32],
}

impl Sink for StatsOut<'_> {
    #[inline(always)]
    fn push(&mut self, s: CellStat) {
        let i = self.at;
        self.l2[i] = s.l2;
        self.mean[i] = s.mean;
        self.std[i] = s.std;
        self.min[i] = s.min;
        self.max[i] = s.max;
        self.absmax[i] = s.absmax;
        self.argmax[i] = s.argmax;
        self.nan[i] = s.nan;
        self.at += 1;
    }
}

/// Decode cell `c` into `row` (NaN for a cell the view does not hold).
fn decode_cell(v: &RecordView, c: usize, row: &mut [f32]) {
    match c.checked_add(1) {
        Some(end) => v.decode(c, end, row),
        None => row.fill(f32::NAN),
    }
}

/// Whether `v`'s rows are read as stored f16 bytes by the vector kernels: f16, not transposed,
/// nothing to undo, rows of exactly their values' bytes, heads the kernels take.
fn direct_f16(v: &RecordView, head_dim: usize) -> bool {
    v.ty == GgmlType::F16
        && !v.transposed
        && v.rotation == 0
        && v.rope.is_none()
        && v.n_embd.checked_mul(2) == Some(v.row_bytes)
        && vector_heads(head_dim)
}

/// The stored bytes of cell `c`'s row, where the view holds them.
fn stored_row<'a>(v: &RecordView<'a>, c: usize) -> Option<&'a [u8]> {
    let s = c.checked_mul(v.row_bytes)?;
    v.data.get(s..s.checked_add(v.row_bytes)?)
}

/// Per-channel moments of a record over some cells, plus per-head sums of cell L2 norms.
#[derive(Debug, Clone, PartialEq)]
pub struct Accum {
    pub channels: Vec<Moments>,
    /// Per head: (sum of L2 norms of its cell rows, largest L2 norm, rows), over the rows whose
    /// head holds a value that is not NaN.
    pub l2: Vec<(f64, f64, u64)>,
    /// The cells summed (each once).
    pub cells: u64,
}

impl Accum {
    pub fn new(n_embd: usize, heads: usize) -> Self {
        Accum {
            channels: vec![Moments::default(); n_embd],
            l2: vec![(0.0, 0.0, 0); heads],
            cells: 0,
        }
    }

    pub fn merge(&mut self, o: &Accum) {
        self.cells += o.cells;
        for (a, b) in self.channels.iter_mut().zip(&o.channels) {
            a.merge(b);
        }
        for (a, b) in self.l2.iter_mut().zip(&o.l2) {
            a.0 += b.0;
            a.1 = a.1.max(b.1);
            a.2 += b.2;
        }
    }

    /// Moments of every value of head `h` (all its channels merged; those of them there are).
    pub fn head(&self, h: usize, head_dim: usize) -> Moments {
        let len = self.channels.len();
        let lo = h.saturating_mul(head_dim).min(len);
        let hi = lo.saturating_add(head_dim).min(len);
        let mut m = Moments::default();
        for c in &self.channels[lo..hi] {
            m.merge(c);
        }
        m
    }
}

/// Channel moments and head L2 sums of the cells in `cells` (nothing for a head_dim of 0).
pub fn accumulate(v: &RecordView, cells: &[usize], head_dim: usize) -> Accum {
    let n = v.n_embd;
    let heads = n.checked_div(head_dim).unwrap_or(0);
    if n == 0 || head_dim == 0 {
        return Accum::new(n, heads);
    }
    let direct = direct_f16(v, head_dim);
    // One task's sums merge once: tasks of several chunks, decoded (where they must be) a chunk
    // at a time into the task's buffer.
    let sub = v.chunk_cells();
    crate::parallel::install(|| accumulate_chunks(v, cells, head_dim, direct, sub))
}

/// `accumulate`'s tasks of `4 * sub` cells, in parallel, merged.
fn accumulate_chunks(
    v: &RecordView,
    cells: &[usize],
    head_dim: usize,
    direct: bool,
    sub: usize,
) -> Accum {
    let n = v.n_embd;
    let heads = n / head_dim;
    cells
        .par_chunks(sub * 4)
        .map_init(Vec::new, |buf: &mut Vec<f32>, chunk| {
            let mut sums = ChannelSums::new(n, head_dim);
            if direct {
                buf.clear();
                buf.resize(n, f32::NAN); // the row of a cell the view does not hold
                let row = |c: usize| stored_row(v, c).map_or(Values::F32(buf), Values::F16);
                add_rows(&mut sums, chunk.iter().map(|&c| row(c)));
            } else {
                buf.resize(sub * n, 0.0);
                for part in chunk.chunks(sub) {
                    for (i, &c) in part.iter().enumerate() {
                        decode_cell(v, c, &mut buf[i * n..(i + 1) * n]);
                    }
                    add_rows(
                        &mut sums,
                        buf[..part.len() * n].chunks_exact(n).map(Values::F32),
                    );
                }
            }
            Accum {
                channels: sums.moments(),
                cells: sums.rows(),
                l2: sums.l2,
            }
        })
        .reduce(
            || Accum::new(n, heads),
            |mut a, b| {
                a.merge(&b);
                a
            },
        )
}

/// Add rows four at a time.
fn add_rows<'a>(sums: &mut ChannelSums, rows: impl Iterator<Item = Values<'a>>) {
    let mut group: [Values; 4] = [Values::F32(&[]); 4];
    let mut k = 0;
    for r in rows {
        group[k] = r;
        k += 1;
        if k == 4 {
            sums.add(&group);
            k = 0;
        }
    }
    sums.add(&group[..k]);
}

/// Errors between matched rows of two records, per head, over the pairs of values of which
/// neither is NaN (`nan` counts the pairs left out; none left: every error NaN).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairStat {
    pub mse: f64,
    pub max_abs: f64,
    pub cosine: f64,
    /// ||a - b|| / ||a||.
    pub rel: f64,
    /// The sums the above come from (summed over many rows by `LossSums`), with `nan`: the
    /// pairs left out.
    pub loss: RowLoss,
}

fn pair(a: &[f32], b: &[f32]) -> PairStat {
    let mut r = RowLoss::default();
    for (&x, &y) in a.iter().zip(b) {
        r.add(x, y, x.is_nan() || y.is_nan());
    }
    PairStat {
        mse: r.se / r.n as f64,
        max_abs: r.max_abs(),
        cosine: r.cosine(),
        rel: r.rel(),
        loss: r,
    }
}

/// Per-(pair, head) errors of `b`'s cell against `a`'s for every `(cell_a, cell_b)` pair. Records
/// of different widths have no rows to match: nothing (nor for a head_dim of 0).
pub fn compare(
    a: &RecordView,
    b: &RecordView,
    pairs: &[(usize, usize)],
    head_dim: usize,
) -> Vec<PairStat> {
    let n = a.n_embd;
    if head_dim == 0 || b.n_embd != n {
        return Vec::new();
    }
    crate::parallel::install(|| {
        pairs
            .par_chunks(a.chunk_cells())
            .flat_map_iter(|chunk| {
                let (mut ra, mut rb) = (vec![0f32; n], vec![0f32; n]);
                let mut out = Vec::with_capacity(chunk.len() * (n / head_dim));
                for &(ca, cb) in chunk {
                    decode_cell(a, ca, &mut ra);
                    decode_cell(b, cb, &mut rb);
                    for (ha, hb) in ra.chunks_exact(head_dim).zip(rb.chunks_exact(head_dim)) {
                        out.push(pair(ha, hb));
                    }
                }
                out
            })
            .collect()
    })
}

/// Per-head losses of the round trip `f(row, out)` over the cells in `cells`.
pub fn round_trip_loss(
    v: &RecordView,
    cells: &[usize],
    head_dim: usize,
    f: &(dyn Fn(&[f32], &mut [f32]) + Sync),
) -> Vec<LossSums> {
    let n = v.n_embd;
    let Some(heads) = n.checked_div(head_dim) else {
        return Vec::new();
    };
    crate::parallel::install(|| {
        cells
            .par_chunks(v.chunk_cells())
            .map(|chunk| {
                let (mut row, mut back) = (vec![0f32; n], vec![0f32; n]);
                let mut acc = vec![LossSums::default(); heads];
                for &c in chunk {
                    decode_cell(v, c, &mut row);
                    f(&row, &mut back);
                    loss_sums(&row, &back, head_dim, &mut acc);
                }
                acc
            })
            .reduce(
                || vec![LossSums::default(); heads],
                |mut a, b| {
                    for (x, y) in a.iter_mut().zip(&b) {
                        x.merge(y);
                    }
                    a
                },
            )
    })
}
