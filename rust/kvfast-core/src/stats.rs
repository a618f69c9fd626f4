//! Statistics over a record's rows, streamed a chunk of cells at a time in parallel: memory stays
//! bounded by the chunk size times the number of threads, plus the results.

use rayon::prelude::*;

use crate::view::RecordView;

/// Statistics of one head of one cell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CellStat {
    pub l2: f64,
    pub mean: f64,
    pub std: f64,
    pub min: f32,
    pub max: f32,
    pub absmax: f32,
    /// The channel (within the head) of the absmax.
    pub argmax: u32,
}

/// Per-(cell, head) statistics of the cells in `cells` (indices into the record), in that order.
pub fn cell_stats(v: &RecordView, cells: &[usize], head_dim: usize) -> Vec<CellStat> {
    let n = v.n_embd;
    let heads = n / head_dim;
    cells
        .par_chunks(v.chunk_cells())
        .flat_map_iter(|chunk| {
            let mut row = vec![0f32; n];
            let mut out = Vec::with_capacity(chunk.len() * heads);
            for &c in chunk {
                v.decode(c, c + 1, &mut row);
                for h in row.chunks_exact(head_dim) {
                    out.push(one_cell(h));
                }
            }
            out
        })
        .collect()
}

fn one_cell(x: &[f32]) -> CellStat {
    let (mut sum, mut sq) = (0f64, 0f64);
    let (mut min, mut max, mut absmax, mut argmax) =
        (f32::INFINITY, f32::NEG_INFINITY, -1f32, 0u32);
    for (j, &v) in x.iter().enumerate() {
        let d = v as f64;
        sum += d;
        sq += d * d;
        min = min.min(v);
        max = max.max(v);
        if v.abs() > absmax {
            absmax = v.abs();
            argmax = j as u32;
        }
    }
    let mean = sum / x.len() as f64;
    let m2: f64 = x
        .iter()
        .map(|&v| (v as f64 - mean) * (v as f64 - mean))
        .sum();
    CellStat {
        l2: sq.sqrt(),
        mean,
        std: (m2 / x.len() as f64).sqrt(),
        min,
        max,
        absmax: absmax.max(0.0),
        argmax,
    }
}

/// Running moments of a set of values (Chan et al.'s parallel merge).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub count: u64,
    pub mean: f64,
    pub m2: f64,
    pub min: f32,
    pub max: f32,
    pub absmax: f32,
}

impl Default for Moments {
    fn default() -> Self {
        Moments {
            count: 0,
            mean: 0.0,
            m2: 0.0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            absmax: 0.0,
        }
    }
}

impl Moments {
    pub fn merge(&mut self, o: &Moments) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        let n = (self.count + o.count) as f64;
        let delta = o.mean - self.mean;
        self.mean += delta * o.count as f64 / n;
        self.m2 += o.m2 + delta * delta * self.count as f64 * o.count as f64 / n;
        self.count += o.count;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.absmax = self.absmax.max(o.absmax);
    }

    /// Population standard deviation (ddof = 0).
    pub fn std(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            (self.m2 / self.count as f64).sqrt()
        }
    }
}

/// Per-channel moments of a record over some cells, plus per-head sums of cell L2 norms.
#[derive(Debug, Clone, PartialEq)]
pub struct Accum {
    pub channels: Vec<Moments>,
    /// Per head: (sum of L2 norms of its cell rows, largest L2 norm, rows).
    pub l2: Vec<(f64, f64, u64)>,
}

impl Accum {
    pub fn new(n_embd: usize, heads: usize) -> Self {
        Accum {
            channels: vec![Moments::default(); n_embd],
            l2: vec![(0.0, 0.0, 0); heads],
        }
    }

    pub fn merge(&mut self, o: &Accum) {
        for (a, b) in self.channels.iter_mut().zip(&o.channels) {
            a.merge(b);
        }
        for (a, b) in self.l2.iter_mut().zip(&o.l2) {
            a.0 += b.0;
            a.1 = a.1.max(b.1);
            a.2 += b.2;
        }
    }

    /// Moments of every value of head `h` (all its channels merged).
    pub fn head(&self, h: usize, head_dim: usize) -> Moments {
        let mut m = Moments::default();
        for c in &self.channels[h * head_dim..(h + 1) * head_dim] {
            m.merge(c);
        }
        m
    }
}

/// Channel moments and head L2 sums of the cells in `cells`.
pub fn accumulate(v: &RecordView, cells: &[usize], head_dim: usize) -> Accum {
    let n = v.n_embd;
    let heads = n / head_dim;
    cells
        .par_chunks(v.chunk_cells())
        .map(|chunk| {
            let mut buf = vec![0f32; chunk.len() * n];
            for (i, &c) in chunk.iter().enumerate() {
                v.decode(c, c + 1, &mut buf[i * n..(i + 1) * n]);
            }
            let mut acc = Accum::new(n, heads);
            let k = chunk.len() as f64;
            let mut sums = vec![0f64; n];
            for row in buf.chunks_exact(n) {
                for (s, &x) in sums.iter_mut().zip(row) {
                    *s += x as f64;
                }
                for (h, hv) in row.chunks_exact(head_dim).enumerate() {
                    let l2 = hv
                        .iter()
                        .map(|&x| (x as f64) * (x as f64))
                        .sum::<f64>()
                        .sqrt();
                    let e = &mut acc.l2[h];
                    e.0 += l2;
                    e.1 = e.1.max(l2);
                    e.2 += 1;
                }
            }
            for (j, m) in acc.channels.iter_mut().enumerate() {
                m.count = chunk.len() as u64;
                m.mean = sums[j] / k;
            }
            for row in buf.chunks_exact(n) {
                for (m, &x) in acc.channels.iter_mut().zip(row) {
                    let d = x as f64 - m.mean;
                    m.m2 += d * d;
                    m.min = m.min.min(x);
                    m.max = m.max.max(x);
                    m.absmax = m.absmax.max(x.abs());
                }
            }
            acc
        })
        .reduce(
            || Accum::new(n, heads),
            |mut a, b| {
                a.merge(&b);
                a
            },
        )
}

/// Errors between matched rows of two records, per head.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairStat {
    pub mse: f64,
    pub max_abs: f64,
    pub cosine: f64,
    /// ||a - b|| / ||a||.
    pub rel: f64,
}

fn pair(a: &[f32], b: &[f32]) -> PairStat {
    let (mut se, mut max_abs, mut aa, mut bb, mut ab) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        let d = x - y;
        se += d * d;
        max_abs = max_abs.max(d.abs());
        aa += x * x;
        bb += y * y;
        ab += x * y;
    }
    let cosine = if aa > 0.0 && bb > 0.0 {
        ab / (aa.sqrt() * bb.sqrt())
    } else {
        f64::NAN
    };
    PairStat {
        mse: se / a.len() as f64,
        max_abs,
        cosine,
        rel: if aa > 0.0 { (se / aa).sqrt() } else { f64::NAN },
    }
}

/// Per-(pair, head) errors of `b`'s cell against `a`'s for every `(cell_a, cell_b)` pair.
pub fn compare(
    a: &RecordView,
    b: &RecordView,
    pairs: &[(usize, usize)],
    head_dim: usize,
) -> Vec<PairStat> {
    let n = a.n_embd;
    pairs
        .par_chunks(a.chunk_cells())
        .flat_map_iter(|chunk| {
            let (mut ra, mut rb) = (vec![0f32; n], vec![0f32; n]);
            let mut out = Vec::with_capacity(chunk.len() * (n / head_dim));
            for &(ca, cb) in chunk {
                a.decode(ca, ca + 1, &mut ra);
                b.decode(cb, cb + 1, &mut rb);
                for (ha, hb) in ra.chunks_exact(head_dim).zip(rb.chunks_exact(head_dim)) {
                    out.push(pair(ha, hb));
                }
            }
            out
        })
        .collect()
}

/// Per-head sums for what a row loses through a round trip `f` (quantize, then dequantize).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossSums {
    pub count: u64,
    pub se: f64,
    pub max_abs: f64,
    pub aa: f64,
    pub bb: f64,
    pub ab: f64,
}

impl LossSums {
    pub fn merge(&mut self, o: &LossSums) {
        self.count += o.count;
        self.se += o.se;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.aa += o.aa;
        self.bb += o.bb;
        self.ab += o.ab;
    }
}

/// Per-head losses of the round trip `f(row, out)` over the cells in `cells`.
pub fn round_trip_loss(
    v: &RecordView,
    cells: &[usize],
    head_dim: usize,
    f: &(dyn Fn(&[f32], &mut [f32]) + Sync),
) -> Vec<LossSums> {
    let n = v.n_embd;
    let heads = n / head_dim;
    cells
        .par_chunks(v.chunk_cells())
        .map(|chunk| {
            let (mut row, mut back) = (vec![0f32; n], vec![0f32; n]);
            let mut acc = vec![LossSums::default(); heads];
            for &c in chunk {
                v.decode(c, c + 1, &mut row);
                f(&row, &mut back);
                for (h, (x, y)) in row
                    .chunks_exact(head_dim)
                    .zip(back.chunks_exact(head_dim))
                    .enumerate()
                {
                    let e = &mut acc[h];
                    for (&x, &y) in x.iter().zip(y) {
                        let (x, y) = (x as f64, y as f64);
                        e.se += (x - y) * (x - y);
                        e.max_abs = e.max_abs.max((x - y).abs());
                        e.aa += x * x;
                        e.bb += y * y;
                        e.ab += x * y;
                    }
                    e.count += head_dim as u64;
                }
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
}
