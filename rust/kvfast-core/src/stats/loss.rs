//! What B loses against A, row by row (a head of a cell) and summed over many rows: the sums
//! behind the error columns that `quant_error` (A a state, B its quantize round trip) and
//! `compare` (B another state) share, and those columns.
//!
//! Both give, per group of rows, `rows` (rows summed), `count` (values), `mse`, `max_abs`, the
//! pooled `rel` = ||B - A|| / ||A|| and `cosine` over every value of the group together, and the
//! per-row `rel_mean`, `rel_max`, `cosine_mean`, `cosine_min` over the rows where they are defined
//! (a row of A that is all zeros has no relative error, a zero row on either side no cosine).
//!
//! NaN (the rule of `moments`): a value that is NaN in A (for `compare`, in A or B) is left out of
//! every sum and counted in `nan`; `count` is the values compared. A group with no value compared
//! has NaN errors (`mse`, `max_abs` as well). A NaN B makes of a value of A (a round trip's NaN
//! scale) is an error, and makes the errors it enters NaN.

use crate::plan::columns::{Table, Values};

/// What one row (one head of one cell) of A loses against B: the sums over its values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowLoss {
    /// Values of the row compared (not NaN).
    pub n: u64,
    /// Values of the row left out (NaN).
    pub nan: u64,
    /// Sum of (a - b)^2.
    pub se: f64,
    pub max_abs: f64,
    /// Sums of a^2, b^2 and a * b.
    pub aa: f64,
    pub bb: f64,
    pub ab: f64,
}

/// ||a - b|| / ||a|| from the sums; NaN where ||a|| = 0 (no relative error of a zero row).
pub fn rel_of(se: f64, aa: f64) -> f64 {
    if aa > 0.0 {
        (se / aa).sqrt()
    } else {
        f64::NAN
    }
}

/// a . b / (||a|| ||b||) from the sums; NaN where either norm is 0 (no angle to a zero row).
pub fn cosine_of(aa: f64, bb: f64, ab: f64) -> f64 {
    if aa > 0.0 && bb > 0.0 {
        ab / (aa.sqrt() * bb.sqrt())
    } else {
        f64::NAN
    }
}

impl RowLoss {
    /// Add the pair (a, b) of one value: left out (counted in `nan`) when `left_out`.
    #[inline(always)]
    pub fn add(&mut self, a: f32, b: f32, left_out: bool) {
        if left_out {
            self.nan += 1;
            return;
        }
        let (x, y) = (a as f64, b as f64);
        let d = x - y;
        self.n += 1;
        self.se += d * d;
        self.max_abs = self.max_abs.max(d.abs());
        self.aa += x * x;
        self.bb += y * y;
        self.ab += x * y;
    }

    /// The largest |a - b|: NaN of no value compared.
    pub fn max_abs(&self) -> f64 {
        unless_none(self.n, self.max_abs)
    }

    pub fn rel(&self) -> f64 {
        rel_of(self.se, self.aa)
    }

    pub fn cosine(&self) -> f64 {
        cosine_of(self.aa, self.bb, self.ab)
    }
}

/// The sums of many rows' losses (`RowLoss`), per head or per layer: pooled (`count` values: the
/// squared errors and products summed over every value) and per row (`rows` rows: the sum, max
/// and min of each row's relative error and cosine, over the rows where they are defined, so that
/// the means `rel_mean` and `cosine_mean` are per-cell means).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossSums {
    pub count: u64,
    /// Values left out (NaN).
    pub nan: u64,
    pub se: f64,
    pub max_abs: f64,
    pub aa: f64,
    pub bb: f64,
    pub ab: f64,
    pub rows: u64,
    /// Rows with a relative error (||a|| > 0), their sum and maximum.
    pub rel_rows: u64,
    pub rel_sum: f64,
    pub rel_max: f64,
    /// Rows with a cosine (both norms > 0), their sum and minimum.
    pub cos_rows: u64,
    pub cos_sum: f64,
    pub cos_min: f64,
}

impl Default for LossSums {
    fn default() -> Self {
        LossSums {
            count: 0,
            nan: 0,
            se: 0.0,
            max_abs: 0.0,
            aa: 0.0,
            bb: 0.0,
            ab: 0.0,
            rows: 0,
            rel_rows: 0,
            rel_sum: 0.0,
            rel_max: f64::NAN,
            cos_rows: 0,
            cos_sum: 0.0,
            cos_min: f64::NAN,
        }
    }
}

impl LossSums {
    /// Add one row's loss.
    pub fn add_row(&mut self, r: &RowLoss) {
        self.count += r.n;
        self.nan += r.nan;
        self.se += r.se;
        self.max_abs = self.max_abs.max(r.max_abs);
        self.aa += r.aa;
        self.bb += r.bb;
        self.ab += r.ab;
        self.rows += 1;
        let rel = r.rel();
        if !rel.is_nan() {
            self.rel_rows += 1;
            self.rel_sum += rel;
            self.rel_max = self.rel_max.max(rel); // f64::max of NaN and x is x
        }
        let cos = r.cosine();
        if !cos.is_nan() {
            self.cos_rows += 1;
            self.cos_sum += cos;
            self.cos_min = self.cos_min.min(cos);
        }
    }

    pub fn merge(&mut self, o: &LossSums) {
        self.count += o.count;
        self.nan += o.nan;
        self.se += o.se;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.aa += o.aa;
        self.bb += o.bb;
        self.ab += o.ab;
        self.rows += o.rows;
        self.rel_rows += o.rel_rows;
        self.rel_sum += o.rel_sum;
        self.rel_max = self.rel_max.max(o.rel_max);
        self.cos_rows += o.cos_rows;
        self.cos_sum += o.cos_sum;
        self.cos_min = self.cos_min.min(o.cos_min);
    }

    /// The mean squared error over every value (NaN of none).
    pub fn mse(&self) -> f64 {
        self.se / self.count as f64
    }

    /// The largest |a - b| over every value (NaN of none).
    pub fn max_abs(&self) -> f64 {
        unless_none(self.count, self.max_abs)
    }

    /// Pooled: ||B - A|| / ||A|| over every value (the Frobenius norms of the rows together).
    pub fn rel(&self) -> f64 {
        rel_of(self.se, self.aa)
    }

    /// Pooled: the cosine of A and B as vectors of every value.
    pub fn cosine(&self) -> f64 {
        cosine_of(self.aa, self.bb, self.ab)
    }

    /// The mean of the rows' relative errors (NaN when no row has one).
    pub fn rel_mean(&self) -> f64 {
        unless_none(self.rel_rows, self.rel_sum / self.rel_rows as f64)
    }

    /// The mean of the rows' cosines (NaN when no row has one).
    pub fn cosine_mean(&self) -> f64 {
        unless_none(self.cos_rows, self.cos_sum / self.cos_rows as f64)
    }
}

/// `x`, a statistic of `n` things: NaN when there are none (never the 0 or the -inf of an empty
/// sum or fold).
fn unless_none(n: u64, x: f64) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        x
    }
}

/// The error columns of `LossSums` rows, in their order.
#[derive(Debug, Default)]
pub struct LossColumns {
    rows: Vec<u64>,
    count: Vec<u64>,
    nan: Vec<u64>,
    f: [Vec<f64>; 8],
}

/// The names of `LossColumns`' count columns (UInt64), in order: before `LOSS_NAMES`.
pub const LOSS_COUNTS: [&str; 3] = ["rows", "count", "nan"];

/// The names of `LossColumns`' float columns, in order.
pub const LOSS_NAMES: [&str; 8] = [
    "mse",
    "max_abs",
    "rel",
    "cosine",
    "rel_mean",
    "rel_max",
    "cosine_mean",
    "cosine_min",
];

impl LossColumns {
    pub fn push(&mut self, s: &LossSums) {
        self.rows.push(s.rows);
        self.count.push(s.count);
        self.nan.push(s.nan);
        let values = [
            s.mse(),
            s.max_abs(),
            s.rel(),
            s.cosine(),
            s.rel_mean(),
            s.rel_max,
            s.cosine_mean(),
            s.cos_min,
        ];
        for (col, v) in self.f.iter_mut().zip(values) {
            col.push(v);
        }
    }

    /// `LOSS_COUNTS`, then `LOSS_NAMES`.
    pub fn write(self, out: &mut Table) {
        for (name, col) in LOSS_COUNTS
            .into_iter()
            .zip([self.rows, self.count, self.nan])
        {
            out.push(name, Values::U64(col));
        }
        for (name, col) in LOSS_NAMES.into_iter().zip(self.f) {
            out.push(name, Values::F64(col));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(a: &[f64], b: &[f64]) -> RowLoss {
        let mut r = RowLoss {
            n: a.len() as u64,
            ..RowLoss::default()
        };
        for (&x, &y) in a.iter().zip(b) {
            r.se += (x - y) * (x - y);
            r.max_abs = r.max_abs.max((x - y).abs());
            r.aa += x * x;
            r.bb += y * y;
            r.ab += x * y;
        }
        r
    }

    /// A row through `RowLoss::add`, a pair left out where either is NaN (as `compare` does).
    fn row32(a: &[f32], b: &[f32]) -> RowLoss {
        let mut r = RowLoss::default();
        for (&x, &y) in a.iter().zip(b) {
            r.add(x, y, x.is_nan() || y.is_nan());
        }
        r
    }

    #[test]
    fn pooled_and_per_row_differ_as_they_should() {
        // a large row with a small error and a small row with a large one: the pooled relative
        // error is dominated by the large row, the per-row mean is not
        let (r1, r2) = (
            row(&[10.0, 0.0], &[10.1, 0.0]),
            row(&[0.1, 0.0], &[0.2, 0.0]),
        );
        let mut s = LossSums::default();
        s.add_row(&r1);
        s.add_row(&r2);
        assert_eq!((s.rows, s.count), (2, 4));
        assert!((s.rel() - (0.02f64 / 100.01).sqrt()).abs() < 1e-12);
        assert!((s.rel_mean() - (0.01 + 1.0) / 2.0).abs() < 1e-12);
        assert!((s.rel_max - 1.0).abs() < 1e-12);
        assert!((s.mse() - 0.02 / 4.0).abs() < 1e-12);
        let mut halves = LossSums::default();
        halves.add_row(&r1);
        let mut other = LossSums::default();
        other.add_row(&r2);
        halves.merge(&other);
        assert_eq!(halves, s);
    }

    #[test]
    fn zero_rows_count_but_have_no_relative_error_or_cosine() {
        let mut s = LossSums::default();
        s.add_row(&row(&[0.0, 0.0], &[0.0, 0.0]));
        assert!(s.rel().is_nan() && s.rel_mean().is_nan() && s.rel_max.is_nan());
        assert!(s.cosine().is_nan() && s.cosine_mean().is_nan() && s.cos_min.is_nan());
        s.add_row(&row(&[1.0, 0.0], &[0.0, 0.0])); // B zero: a relative error of 1, no cosine
        assert_eq!((s.rows, s.rel_rows, s.cos_rows), (2, 1, 0));
        assert_eq!((s.rel(), s.rel_mean(), s.rel_max), (1.0, 1.0, 1.0));
        s.add_row(&row(&[1.0, 1.0], &[1.0, 1.0]));
        assert_eq!(s.cos_rows, 1);
        assert!((s.cos_min - 1.0).abs() < 1e-12);
    }

    #[test]
    fn nan_values_are_left_out_and_counted() {
        let mut s = LossSums::default();
        s.add_row(&row32(&[f32::NAN, 3.0, 4.0], &[1.0, 3.0, 5.0]));
        assert_eq!((s.rows, s.count, s.nan), (1, 2, 1));
        assert_eq!((s.mse(), s.max_abs()), (0.5, 1.0));
        assert!((s.rel() - 1.0 / 5.0).abs() < 1e-12);
        // a row of NaNs only: counted, no value compared, no error
        let mut none = LossSums::default();
        none.add_row(&row32(&[f32::NAN, f32::NAN], &[1.0, 2.0]));
        assert_eq!((none.rows, none.count, none.nan), (1, 0, 2));
        assert!(none.mse().is_nan() && none.max_abs().is_nan() && none.rel().is_nan());
        assert!(none.cosine().is_nan() && none.rel_mean().is_nan());
        s.merge(&none);
        assert_eq!((s.rows, s.count, s.nan, s.max_abs()), (2, 2, 3, 1.0));
        let mut cols = LossColumns::default();
        cols.push(&none);
        let mut t = Table::default();
        cols.write(&mut t);
        let names: Vec<_> = t.columns.iter().map(|c| c.name).collect();
        assert_eq!(&names[..4], ["rows", "count", "nan", "mse"]);
    }
}
