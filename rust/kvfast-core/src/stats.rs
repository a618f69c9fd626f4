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
    /// The channel (within the head) of the absmax; 0 when no value has it (NaNs only).
    pub argmax: u32,
}

/// Per-(cell, head) statistics as columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellStats {
    pub l2: Vec<f64>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    pub min: Vec<f32>,
    pub max: Vec<f32>,
    pub absmax: Vec<f32>,
    pub argmax: Vec<u32>,
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
        argmax: vec![0; rows],
    };
    let per = v.chunk_cells();
    let k = per * heads;
    all.l2
        .par_chunks_mut(k)
        .zip(all.mean.par_chunks_mut(k))
        .zip(all.std.par_chunks_mut(k))
        .zip(all.min.par_chunks_mut(k))
        .zip(all.max.par_chunks_mut(k))
        .zip(all.absmax.par_chunks_mut(k))
        .zip(all.argmax.par_chunks_mut(k))
        .zip(cells.par_chunks(per))
        .for_each(
            |(((((((l2, mean), std), min), max), absmax), argmax), chunk)| {
                populate_chunk(v, chunk);
                let mut out = StatsOut {
                    at: 0,
                    l2,
                    mean,
                    std,
                    min,
                    max,
                    absmax,
                    argmax,
                };
                let mut row = vec![0f32; n];
                for &c in chunk {
                    decode_cell(v, c, &mut row);
                    stats_of_row(&row, head_dim, &mut out);
                }
            },
        );
    all
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
    argmax: &'a mut [u32],
}

impl StatsOut<'_> {
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

/// Populate the pages of a chunk of (ascending or not) cells.
fn populate_chunk(v: &RecordView, chunk: &[usize]) {
    let (lo, hi) = chunk
        .iter()
        .fold((usize::MAX, 0), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    if lo <= hi {
        v.populate(lo, hi);
    }
}

const LANES: usize = 8;

/// Population standard deviation from float64 sums of x and x^2. The squares of f32 values are
/// exact in f64, so the only error is the sums' rounding (~1e-14 of E[x^2]).
#[inline(always)]
fn std_of(sum: f64, sq: f64, n: f64) -> f64 {
    let mean = sum / n;
    ((sq / n - mean * mean).max(0.0)).sqrt()
}

/// The statistics of every head of one row, with AVX2 where the CPU has it (same results: the
/// arithmetic is the same, only wider).
fn stats_of_row(row: &[f32], head_dim: usize, out: &mut StatsOut) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { stats_of_row_avx2(row, head_dim, out) };
        return;
    }
    stats_of_row_generic(row, head_dim, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stats_of_row_avx2(row: &[f32], head_dim: usize, out: &mut StatsOut) {
    for x in row.chunks_exact(head_dim) {
        // SAFETY: this function only runs where the CPU has AVX2.
        let (min, max) = unsafe { min_max_avx(x) };
        out.push(cell_stat(x.len(), sum_sq(x), (min, max), |absmax| unsafe {
            first_abs_equal_avx(x, absmax)
        }));
    }
}

/// Smallest and largest value, eight lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn min_max_avx(x: &[f32]) -> (f32, f32) {
    use std::arch::x86_64::*;
    let whole = x.len() / 8 * 8;
    let (mut lo, mut hi) = (
        _mm256_set1_ps(f32::INFINITY),
        _mm256_set1_ps(f32::NEG_INFINITY),
    );
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= x.len().
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
    // SAFETY: both arrays hold eight f32.
    unsafe {
        _mm256_storeu_ps(l.as_mut_ptr(), lo);
        _mm256_storeu_ps(h.as_mut_ptr(), hi);
    }
    let mut mn = l.iter().fold(f32::INFINITY, |a, &b| a.min(b));
    let mut mx = h.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &x[whole..] {
        mn = mn.min(v);
        mx = mx.max(v);
    }
    (mn, mx)
}

/// Index of the first value of magnitude `target` (0 when none has it), eight lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn first_abs_equal_avx(x: &[f32], target: f32) -> usize {
    use std::arch::x86_64::*;
    let whole = x.len() / 8 * 8;
    let t = _mm256_set1_ps(target);
    let sign = _mm256_set1_ps(-0.0);
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= x.len().
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
        let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, v), t));
        if m != 0 {
            return i + m.trailing_zeros() as usize;
        }
    }
    x[whole..]
        .iter()
        .position(|v| v.abs() == target)
        .map_or(0, |p| whole + p)
}

#[inline(always)]
fn stats_of_row_generic(row: &[f32], head_dim: usize, out: &mut StatsOut) {
    for h in row.chunks_exact(head_dim) {
        out.push(one_cell(h));
    }
}

/// Sum and sum of squares in f64, in independent lanes so that the loop vectorizes.
#[inline(always)]
pub fn sum_sq(x: &[f32]) -> (f64, f64) {
    let (mut s, mut q) = ([0f64; LANES], [0f64; LANES]);
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let v = c[i] as f64;
            s[i] += v;
            q[i] += v * v;
        }
    }
    for &v in rest {
        s[0] += v as f64;
        q[0] += (v as f64) * (v as f64);
    }
    (s.iter().sum(), q.iter().sum())
}

/// Smallest and largest value, in lanes.
#[inline(always)]
pub fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            lo[i] = lo[i].min(c[i]);
            hi[i] = hi[i].max(c[i]);
        }
    }
    for &v in rest {
        lo[0] = if v < lo[0] { v } else { lo[0] };
        hi[0] = if v > hi[0] { v } else { hi[0] };
    }
    let lo = lo
        .iter()
        .fold(f32::INFINITY, |a, &b| if b < a { b } else { a });
    let hi = hi
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    (lo, hi)
}

/// Index of the first value whose magnitude is `target` (0 when none has it, as in a head of
/// NaNs), scanning a lane-wide chunk at a time.
#[inline(always)]
fn first_abs_equal(x: &[f32], target: f32) -> usize {
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.len() * LANES;
    for (k, c) in chunks.enumerate() {
        let mut hit = false;
        for v in c {
            hit |= v.abs() == target;
        }
        if hit {
            return k * LANES + c.iter().position(|v| v.abs() == target).unwrap_or(0);
        }
    }
    x[tail..]
        .iter()
        .position(|v| v.abs() == target)
        .map_or(0, |p| tail + p)
}

#[inline(always)]
pub fn one_cell(x: &[f32]) -> CellStat {
    cell_stat(x.len(), sum_sq(x), min_max(x), |absmax| {
        first_abs_equal(x, absmax)
    })
}

/// A cell's statistics from its sums, extremes, and a search for the channel of its absmax.
#[inline(always)]
fn cell_stat(
    len: usize,
    (sum, sq): (f64, f64),
    (min, max): (f32, f32),
    find: impl FnOnce(f32) -> usize,
) -> CellStat {
    let n = len as f64;
    let absmax = (-min).max(max).max(0.0);
    CellStat {
        l2: sq.sqrt(),
        mean: sum / n,
        std: std_of(sum, sq, n),
        min,
        max,
        absmax,
        argmax: find(absmax) as u32,
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

/// Moments of one chunk of decoded rows (`buf`, `n` values each) into a fresh `acc`, with AVX2
/// where the CPU has it (the same arithmetic, wider).
fn chunk_moments(buf: &[f32], n: usize, head_dim: usize, acc: &mut Accum) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { chunk_moments_avx2(buf, n, head_dim, acc) };
        return;
    }
    chunk_moments_generic(buf, n, head_dim, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_moments_avx2(buf: &[f32], n: usize, head_dim: usize, acc: &mut Accum) {
    chunk_moments_generic(buf, n, head_dim, acc)
}

#[inline(always)]
fn chunk_moments_generic(buf: &[f32], n: usize, head_dim: usize, acc: &mut Accum) {
    let rows = (buf.len() / n) as f64;
    let mut sums = vec![0f64; n];
    for row in buf.chunks_exact(n) {
        for (s, &x) in sums.iter_mut().zip(row) {
            *s += x as f64;
        }
        for (h, hv) in row.chunks_exact(head_dim).enumerate() {
            let l2 = sum_sq(hv).1.sqrt();
            let e = &mut acc.l2[h];
            e.0 += l2;
            e.1 = e.1.max(l2);
            e.2 += 1;
        }
    }
    let means: Vec<f64> = sums.iter().map(|s| s / rows).collect();
    let mut m2 = vec![0f64; n];
    let (mut lo, mut hi) = (vec![f32::INFINITY; n], vec![f32::NEG_INFINITY; n]);
    for row in buf.chunks_exact(n) {
        for ((((m, l), h), &mean), &x) in
            m2.iter_mut().zip(&mut lo).zip(&mut hi).zip(&means).zip(row)
        {
            let d = x as f64 - mean;
            *m += d * d;
            *l = l.min(x);
            *h = h.max(x);
        }
    }
    for (j, m) in acc.channels.iter_mut().enumerate() {
        *m = Moments {
            count: rows as u64,
            mean: means[j],
            m2: m2[j],
            min: lo[j],
            max: hi[j],
            absmax: (-lo[j]).max(hi[j]).max(0.0),
        };
    }
}

/// Channel moments and head L2 sums of the cells in `cells` (nothing for a head_dim of 0).
pub fn accumulate(v: &RecordView, cells: &[usize], head_dim: usize) -> Accum {
    let n = v.n_embd;
    let heads = n.checked_div(head_dim).unwrap_or(0);
    if n == 0 || head_dim == 0 {
        return Accum::new(n, heads);
    }
    cells
        .par_chunks(v.chunk_cells())
        .map(|chunk| {
            populate_chunk(v, chunk);
            let mut buf = vec![0f32; chunk.len() * n];
            for (i, &c) in chunk.iter().enumerate() {
                decode_cell(v, c, &mut buf[i * n..(i + 1) * n]);
            }
            let mut acc = Accum::new(n, heads);
            chunk_moments(&buf, n, head_dim, &mut acc);
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
    pairs
        .par_chunks(a.chunk_cells())
        .flat_map_iter(|chunk| {
            let (a0, a1) = chunk
                .iter()
                .fold((usize::MAX, 0), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
            a.populate(a0, a1);
            let (b0, b1) = chunk
                .iter()
                .fold((usize::MAX, 0), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
            b.populate(b0, b1);
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
    let Some(heads) = n.checked_div(head_dim) else {
        return Vec::new();
    };
    cells
        .par_chunks(v.chunk_cells())
        .map(|chunk| {
            populate_chunk(v, chunk);
            let (mut row, mut back) = (vec![0f32; n], vec![0f32; n]);
            let mut acc = vec![LossSums::default(); heads];
            for &c in chunk {
                decode_cell(v, c, &mut row);
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
