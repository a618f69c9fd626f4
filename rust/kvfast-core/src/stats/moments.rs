//! The plain results the statistics kernels fill and merge: a cell's head statistics, running
//! moments, and (re-exported from `loss`) the sums of a round trip's loss (no kernel here:
//! `kernels` and `passes` both use them), and the plain per-row loops the kernels fall back on.
//!
//! NaN, one rule for every statistic: a NaN value is left out of every statistic and counted (the
//! `nan` of each result); the statistics are over the other values, and a group with no other value
//! has NaN for each (and no argmax), never an infinity or 0. Infinities are values: they give the
//! infinite (or NaN, inf - inf) results float arithmetic gives.

pub use crate::stats::loss::{LossSums, RowLoss};

/// Statistics of one head of one cell (its NaN values left out).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CellStat {
    pub l2: f64,
    pub mean: f64,
    pub std: f64,
    pub min: f32,
    pub max: f32,
    pub absmax: f32,
    /// The channel (within the head) of the absmax; None when the head holds NaNs only.
    pub argmax: Option<u32>,
    /// The head's NaN values.
    pub nan: u32,
}

impl CellStat {
    /// A head of NaNs only.
    pub fn none(nan: u32) -> Self {
        CellStat {
            l2: f64::NAN,
            mean: f64::NAN,
            std: f64::NAN,
            min: f32::NAN,
            max: f32::NAN,
            absmax: f32::NAN,
            argmax: None,
            nan,
        }
    }
}

/// `x` where it is not negative (rounding's -1e-17 of a variance is 0); NaN stays NaN.
#[inline(always)]
pub fn not_negative(x: f64) -> f64 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// Running moments of a set of values (Chan et al.'s parallel merge): `count` values, their NaN
/// values left out and counted in `nan`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub count: u64,
    pub nan: u64,
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
            nan: 0,
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
        self.nan += o.nan;
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = Moments {
                nan: self.nan,
                ..*o
            };
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

    /// Population standard deviation (ddof = 0); NaN of no value.
    pub fn std(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            (self.m2 / self.count as f64).sqrt()
        }
    }

    /// The mean, min, max and absmax as reported: NaN of no value.
    pub fn reported(&self) -> (f64, f64, f64, f64) {
        if self.count == 0 {
            return (f64::NAN, f64::NAN, f64::NAN, f64::NAN);
        }
        (
            self.mean,
            self.min as f64,
            self.max as f64,
            self.absmax as f64,
        )
    }
}

const LANES: usize = 8;

/// Population standard deviation from float64 sums of x and x^2 over n values. The squares of f32
/// values are exact in f64, so the only error is the sums' rounding (~1e-14 of E[x^2]).
#[inline(always)]
pub fn std_of(sum: f64, sq: f64, n: f64) -> f64 {
    let mean = sum / n;
    not_negative(sq / n - mean * mean).sqrt()
}

/// Sum and sum of squares in f64 of the values that are not NaN, and how many are NaN, in
/// independent lanes so that the loop vectorizes.
#[inline(always)]
pub fn sum_sq(x: &[f32]) -> (f64, f64, u32) {
    let (mut s, mut q) = ([0f64; LANES], [0f64; LANES]);
    let mut nan = [0u32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let is_nan = c[i].is_nan();
            let v = if is_nan { 0.0 } else { c[i] as f64 };
            s[i] += v;
            q[i] += v * v;
            nan[i] += is_nan as u32;
        }
    }
    for &v in rest {
        if v.is_nan() {
            nan[0] += 1;
            continue;
        }
        s[0] += v as f64;
        q[0] += (v as f64) * (v as f64);
    }
    (s.iter().sum(), q.iter().sum(), nan.iter().sum())
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
    let (sum, sq, nan) = sum_sq(x);
    cell_stat(x.len(), (sum, sq, nan), min_max(x), |absmax| {
        first_abs_equal(x, absmax)
    })
}

/// A cell's statistics from its sums over the values that are not NaN (`nan` of its `len` are),
/// extremes (which leave NaN out), and a search for the channel of its absmax.
#[inline(always)]
pub fn cell_stat(
    len: usize,
    (sum, sq, nan): (f64, f64, u32),
    (min, max): (f32, f32),
    find: impl FnOnce(f32) -> usize,
) -> CellStat {
    let counted = len - nan as usize;
    if counted == 0 {
        return CellStat::none(nan);
    }
    let n = counted as f64;
    let absmax = (-min).max(max).max(0.0);
    CellStat {
        l2: sq.sqrt(),
        mean: sum / n,
        std: std_of(sum, sq, n),
        min,
        max,
        absmax,
        argmax: Some(find(absmax) as u32),
        nan,
    }
}
