//! The statistics' inner loops over rows, eight values at a time with AVX2 (FMA, F16C) where the
//! CPU has them: f16 rows are read as stored (VCVTPH2PS, no decoded copy), f32 rows as they are.
//! Each public function checks its lengths and falls back to plain Rust elsewhere.
//!
//! Sums stay float64: every f32 value (and its square, exact in f64) is widened before it is
//! added, in eight lanes added pairwise at the end (the plain loops, `passes::sum_sq`, add the same
//! lanes in order: equal to float64 rounding). NaN values are left out of every statistic and
//! counted (see `moments`): the sums add 0 for them, and minima and maxima ignore them, as
//! `f32::min` does: MINPS / MAXPS return their second operand when either is NaN, and the running
//! one is second.

use crate::stats::moments::{not_negative, CellStat, LossSums, Moments, RowLoss};

/// One row of values as a kernel reads them.
#[derive(Clone, Copy)]
pub enum Values<'a> {
    /// Little-endian f16 bytes, two per value (any alignment).
    F16(&'a [u8]),
    F32(&'a [f32]),
}

impl Values<'_> {
    pub fn len(&self) -> usize {
        match self {
            Values::F16(b) => b.len() / 2,
            Values::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the CPU runs the vector kernels (AVX2, FMA and F16C).
#[inline]
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the vector kernels take rows split in heads of `head_dim` (a positive multiple of 8).
#[inline]
pub fn vector_heads(head_dim: usize) -> bool {
    head_dim > 0 && head_dim % 8 == 0 && simd()
}

fn to_f32(row: Values<'_>) -> std::borrow::Cow<'_, [f32]> {
    match row {
        Values::F32(v) => std::borrow::Cow::Borrowed(v),
        Values::F16(b) => {
            let mut out = vec![0f32; b.len() / 2];
            crate::values::decode::decode_row(crate::GgmlType::F16, b, &mut out);
            std::borrow::Cow::Owned(out)
        }
    }
}

/// Where `head_stats` puts each head's statistics, in order.
pub trait Sink {
    fn push(&mut self, s: CellStat);
}

impl Sink for Vec<CellStat> {
    #[inline(always)]
    fn push(&mut self, s: CellStat) {
        Vec::push(self, s)
    }
}

/// The statistics of each whole head of `head_dim` values of `row`, in order, to `out`.
pub fn head_stats(row: Values, head_dim: usize, out: &mut impl Sink) {
    if head_dim == 0 {
        return;
    }
    let whole = row.len() / head_dim * head_dim;
    #[cfg(target_arch = "x86_64")]
    if vector_heads(head_dim) {
        // SAFETY: the CPU has AVX2, FMA and F16C; the loads stay below `whole` <= row.len().
        unsafe {
            match row {
                Values::F16(b) => x86::head_stats(x86::F16Ptr(b.as_ptr()), whole, head_dim, out),
                Values::F32(v) => x86::head_stats(x86::F32Ptr(v.as_ptr()), whole, head_dim, out),
            }
        }
        return;
    }
    for h in to_f32(row)[..whole].chunks_exact(head_dim) {
        out.push(crate::stats::moments::one_cell(h));
    }
}

/// Per-channel sums of a run of rows (a chunk of cells), shifted by the run's first row so that
/// the variance of a channel far from zero keeps its digits (the shifted sums are as exact as a
/// two-pass one), and per-head sums of the rows' L2 norms.
pub struct ChannelSums {
    n: usize,
    head_dim: usize,
    rows: u64,
    shift: Vec<f64>,
    s1: Vec<f64>,
    s2: Vec<f64>,
    lo: Vec<f32>,
    hi: Vec<f32>,
    /// Per channel: the NaN values left out.
    nan: Vec<u64>,
    /// Per head: (sum of row L2 norms, largest, rows), over the rows whose head holds a value
    /// that is not NaN.
    pub l2: Vec<(f64, f64, u64)>,
}

impl ChannelSums {
    /// Sums of rows of `n` values, in heads of `head_dim` (a positive divisor of `n`).
    pub fn new(n: usize, head_dim: usize) -> Self {
        let heads = n.checked_div(head_dim).unwrap_or(0);
        ChannelSums {
            n,
            head_dim,
            rows: 0,
            shift: vec![0.0; n],
            s1: vec![0.0; n],
            s2: vec![0.0; n],
            lo: vec![f32::INFINITY; n],
            hi: vec![f32::NEG_INFINITY; n],
            nan: vec![0; n],
            l2: vec![(0.0, 0.0, 0); heads],
        }
    }

    /// The rows added (the cells).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Add rows, each of exactly `n` values (a row of another length is not added); four at a
    /// time, so that the sums are loaded and stored once for four rows.
    pub fn add(&mut self, rows: &[Values]) {
        let mut rest = rows;
        while !rest.is_empty() {
            let k = match rest.len() {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            let (group, tail) = rest.split_at(k);
            rest = tail;
            self.add_group(group);
        }
    }

    /// One, two or four rows.
    fn add_group(&mut self, g: &[Values]) {
        let n = self.n;
        let f16 = g.iter().all(|r| matches!(r, Values::F16(_)));
        let f32 = g.iter().all(|r| matches!(r, Values::F32(_)));
        if g.len() > 1 && !(g.iter().all(|r| r.len() == n) && (f16 || f32)) {
            for r in g {
                self.add_group(std::slice::from_ref(r));
            }
            return;
        }
        let Some(&first) = g.first() else { return };
        if first.len() != n || self.head_dim == 0 {
            return;
        }
        if self.rows == 0 {
            // (a NaN shifts by 0: the shift is any value near the channel's)
            for (s, x) in self.shift.iter_mut().zip(to_f32(first).iter()) {
                *s = if x.is_nan() { 0.0 } else { *x as f64 };
            }
        }
        self.rows += g.len() as u64;
        #[cfg(target_arch = "x86_64")]
        if vector_heads(self.head_dim) {
            let p16 = |i: usize| match g[i] {
                Values::F16(b) => x86::F16Ptr(b.as_ptr()),
                Values::F32(_) => x86::F16Ptr(std::ptr::null()), // never: the rows are all f16
            };
            let p32 = |i: usize| match g[i] {
                Values::F32(v) => x86::F32Ptr(v.as_ptr()),
                Values::F16(_) => x86::F32Ptr(std::ptr::null()), // never: the rows are all f32
            };
            // SAFETY: the CPU has AVX2, FMA and F16C; every row holds n values (checked) of the
            // layout its pointer reads; the sums hold n each.
            unsafe {
                match (f16, g.len()) {
                    (true, 4) => x86::channel_rows(self, std::array::from_fn::<_, 4, _>(p16)),
                    (true, 2) => x86::channel_rows(self, std::array::from_fn::<_, 2, _>(p16)),
                    (true, _) => x86::channel_rows(self, [p16(0)]),
                    (false, 4) => x86::channel_rows(self, std::array::from_fn::<_, 4, _>(p32)),
                    (false, 2) => x86::channel_rows(self, std::array::from_fn::<_, 2, _>(p32)),
                    (false, _) => x86::channel_rows(self, [p32(0)]),
                }
            }
            return;
        }
        for &row in g {
            let row = to_f32(row);
            for j in 0..n {
                let x = row[j];
                if x.is_nan() {
                    self.nan[j] += 1;
                    continue;
                }
                let d = x as f64 - self.shift[j];
                self.s1[j] += d;
                self.s2[j] += d * d;
                self.lo[j] = self.lo[j].min(x);
                self.hi[j] = self.hi[j].max(x);
            }
            for (h, hv) in row.chunks_exact(self.head_dim).enumerate() {
                let (_, sq, nan) = crate::stats::moments::sum_sq(hv);
                if nan as usize == hv.len() {
                    continue; // no value: no norm
                }
                let l2 = sq.sqrt();
                let e = &mut self.l2[h];
                e.0 += l2;
                e.1 = e.1.max(l2);
                e.2 += 1;
            }
        }
    }

    /// The moments of each channel over the rows added, its NaN values left out.
    pub fn moments(&self) -> Vec<Moments> {
        (0..self.n)
            .map(|j| {
                let (count, nan) = (self.rows - self.nan[j], self.nan[j]);
                if count == 0 {
                    return Moments {
                        nan,
                        ..Moments::default()
                    };
                }
                let n = count as f64;
                let (s1, s2) = (self.s1[j], self.s2[j]);
                Moments {
                    count,
                    nan,
                    mean: self.shift[j] + s1 / n,
                    m2: not_negative(s2 - s1 * s1 / n),
                    min: self.lo[j],
                    max: self.hi[j],
                    absmax: (-self.lo[j]).max(self.hi[j]).max(0.0),
                }
            })
            .collect()
    }
}

/// Add what the round trip of `x` to `y` loses, per head of `head_dim` values, to `acc` (one entry
/// per head; rows of other lengths add nothing). A NaN of `x` is left out (and counted); a NaN the
/// round trip makes of a value is part of the loss.
pub fn loss_sums(x: &[f32], y: &[f32], head_dim: usize, acc: &mut [LossSums]) {
    if head_dim == 0 || x.len() != y.len() || x.len() / head_dim > acc.len() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if vector_heads(head_dim) {
        // SAFETY: the CPU has AVX2 and FMA; x and y hold the same number of values, acc a slot
        // per whole head.
        unsafe { x86::loss_sums(x, y, head_dim, acc) };
        return;
    }
    for (e, (x, y)) in acc
        .iter_mut()
        .zip(x.chunks_exact(head_dim).zip(y.chunks_exact(head_dim)))
    {
        let mut r = RowLoss::default();
        for (&x, &y) in x.iter().zip(y) {
            // a value the state does not hold: left out
            r.add(x, y, x.is_nan());
        }
        e.add_row(&r);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ChannelSums;
    use crate::stats::moments::{cell_stat, LossSums, RowLoss};

    /// Eight values at a time from a row.
    pub(super) trait Load: Copy {
        /// Bytes a value.
        const SIZE: usize;

        /// Values i..i + 8 as f32.
        unsafe fn load8(self, i: usize) -> __m256;

        /// Ask for the cache line `ahead` bytes past value i (any address: a prefetch never
        /// faults, and the pointer is never read).
        fn prefetch(self, i: usize, ahead: usize);

        /// The offset from `base` of the first of values base..end (end - base a multiple of 8)
        /// whose magnitude is `target` (never NaN), or None.
        #[inline(always)]
        unsafe fn first_abs_equal(self, base: usize, end: usize, target: f32) -> Option<usize> {
            let sign = _mm256_set1_ps(-0.0);
            let t = _mm256_set1_ps(target);
            let mut i = base;
            while i < end {
                // SAFETY: the caller keeps end within the row.
                let v = unsafe { self.load8(i) };
                let m =
                    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, v), t));
                if m != 0 {
                    return Some(i - base + m.trailing_zeros() as usize);
                }
                i += 8;
            }
            None
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct F16Ptr(pub *const u8);

    impl Load for F16Ptr {
        const SIZE: usize = 2;

        #[inline(always)]
        fn prefetch(self, i: usize, ahead: usize) {
            let p = self.0.wrapping_add(2 * i + ahead) as *const i8;
            // SAFETY: SSE; a prefetch reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p) }
        }

        #[inline(always)]
        unsafe fn load8(self, i: usize) -> __m256 {
            // SAFETY: the caller keeps i + 8 within the row.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(2 * i) as *const __m128i)) }
        }

        /// Sixteen values at a time, on the f16 bits: `target` is one of the row's magnitudes (or
        /// 0), so exactly an f16, and |x| == target is (bits & 0x7fff) == target's bits (a NaN's
        /// bits equal no number's).
        #[inline(always)]
        unsafe fn first_abs_equal(self, base: usize, end: usize, target: f32) -> Option<usize> {
            let bits = _mm_extract_epi16::<0>(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(
                _mm_set_ss(target),
            ));
            // masked too: a target of -0.0 is 0
            let t = _mm256_set1_epi16((bits & 0x7fff) as i16);
            let magnitude = _mm256_set1_epi16(0x7fff);
            // Windows of up to 128 values, each compared whole into a bitmap (two bits a value)
            // before one search of it: no branch on where the match lies, which is random.
            let mut at = base;
            while at < end {
                let w = (end - at).min(128);
                let (mut lo, mut hi) = (0u128, 0u128);
                let mut j = 0;
                while j + 16 <= w {
                    // SAFETY: the caller keeps end within the row: 32 bytes at 2(at + j).
                    let v =
                        unsafe { _mm256_loadu_si256(self.0.add(2 * (at + j)) as *const __m256i) };
                    let m =
                        _mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_and_si256(v, magnitude), t));
                    let m = m as u32 as u128;
                    if j < 64 {
                        lo |= m << (2 * j);
                    } else {
                        hi |= m << (2 * (j - 64));
                    }
                    j += 16;
                }
                if j < w {
                    // SAFETY: eight values left: 16 bytes at 2(at + j).
                    let v = unsafe { _mm_loadu_si128(self.0.add(2 * (at + j)) as *const __m128i) };
                    let m = _mm_movemask_epi8(_mm_cmpeq_epi16(
                        _mm_and_si128(v, _mm256_castsi256_si128(magnitude)),
                        _mm256_castsi256_si128(t),
                    ));
                    let m = m as u32 as u128;
                    if j < 64 {
                        lo |= m << (2 * j);
                    } else {
                        hi |= m << (2 * (j - 64));
                    }
                }
                if lo | hi != 0 {
                    let k = if lo != 0 {
                        lo.trailing_zeros()
                    } else {
                        128 + hi.trailing_zeros()
                    };
                    return Some(at - base + k as usize / 2);
                }
                at += w;
            }
            None
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct F32Ptr(pub *const f32);

    impl Load for F32Ptr {
        const SIZE: usize = 4;

        #[inline(always)]
        fn prefetch(self, i: usize, ahead: usize) {
            let p = (self.0 as *const u8).wrapping_add(4 * i + ahead) as *const i8;
            // SAFETY: SSE; a prefetch reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p) }
        }

        #[inline(always)]
        unsafe fn load8(self, i: usize) -> __m256 {
            // SAFETY: the caller keeps i + 8 within the row.
            unsafe { _mm256_loadu_ps(self.0.add(i)) }
        }
    }

    #[inline(always)]
    unsafe fn widen(v: __m256) -> (__m256d, __m256d) {
        (
            _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
            _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)),
        )
    }

    /// The sum of the eight lanes of (lo, hi).
    #[inline(always)]
    unsafe fn lanes_sum(lo: __m256d, hi: __m256d) -> f64 {
        let v = _mm256_add_pd(lo, hi);
        let h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
        _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)))
    }

    /// `v` with its NaN lanes 0 (they add nothing to a sum), counting them in `nan` (rare: a
    /// branch not taken).
    #[inline(always)]
    unsafe fn valued(v: __m256, nan: &mut u32) -> __m256 {
        let bad = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        let m = _mm256_movemask_ps(bad);
        if m == 0 {
            return v;
        }
        *nan += m.count_ones();
        _mm256_andnot_ps(bad, v)
    }

    /// The smallest lane (the lanes hold no NaN: the loops below never let one in).
    #[inline(always)]
    unsafe fn lanes_min(v: __m256) -> f32 {
        let h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_min_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_min_ss(h, _mm_shuffle_ps::<1>(h, h)))
    }

    /// The largest lane (no NaN, as above).
    #[inline(always)]
    unsafe fn lanes_max(v: __m256) -> f32 {
        let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)))
    }

    /// Per-head statistics of values 0..len (len a multiple of head_dim, head_dim of 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn head_stats<L: Load>(
        row: L,
        len: usize,
        head_dim: usize,
        out: &mut impl super::Sink,
    ) {
        let mut base = 0;
        while base < len {
            let end = base + head_dim;
            let (mut s0, mut s1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let (mut q0, mut q1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let mut lo = _mm256_set1_ps(f32::INFINITY);
            let mut hi = _mm256_set1_ps(f32::NEG_INFINITY);
            // A second set of sums for every other eight values: two chains of adds, not one.
            let (mut s2, mut s3) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let (mut q2, mut q3) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let mut nan = 0u32;
            let mut i = base;
            while i + 16 <= end {
                // SAFETY: i + 16 <= end <= len.
                let (v, w) = unsafe { (row.load8(i), row.load8(i + 8)) };
                i += 16;
                lo = _mm256_min_ps(v, lo);
                hi = _mm256_max_ps(v, hi);
                lo = _mm256_min_ps(w, lo);
                hi = _mm256_max_ps(w, hi);
                // SAFETY: AVX.
                let (v, w) = unsafe { (valued(v, &mut nan), valued(w, &mut nan)) };
                // SAFETY: AVX.
                let ((a, b), (c, d)) = unsafe { (widen(v), widen(w)) };
                s0 = _mm256_add_pd(s0, a);
                s1 = _mm256_add_pd(s1, b);
                q0 = _mm256_fmadd_pd(a, a, q0);
                q1 = _mm256_fmadd_pd(b, b, q1);
                s2 = _mm256_add_pd(s2, c);
                s3 = _mm256_add_pd(s3, d);
                q2 = _mm256_fmadd_pd(c, c, q2);
                q3 = _mm256_fmadd_pd(d, d, q3);
            }
            if i < end {
                // SAFETY: i + 8 == end <= len.
                let v = unsafe { row.load8(i) };
                lo = _mm256_min_ps(v, lo);
                hi = _mm256_max_ps(v, hi);
                // SAFETY: AVX.
                let v = unsafe { valued(v, &mut nan) };
                // SAFETY: AVX.
                let (a, b) = unsafe { widen(v) };
                s0 = _mm256_add_pd(s0, a);
                s1 = _mm256_add_pd(s1, b);
                q0 = _mm256_fmadd_pd(a, a, q0);
                q1 = _mm256_fmadd_pd(b, b, q1);
            }
            s0 = _mm256_add_pd(s0, s2);
            s1 = _mm256_add_pd(s1, s3);
            q0 = _mm256_add_pd(q0, q2);
            q1 = _mm256_add_pd(q1, q3);
            // SAFETY: AVX.
            let (sum, sq, min, max) = unsafe {
                (
                    lanes_sum(s0, s1),
                    lanes_sum(q0, q1),
                    lanes_min(lo),
                    lanes_max(hi),
                )
            };
            let find = |absmax: f32| {
                // SAFETY: base..end lies within the row.
                unsafe { row.first_abs_equal(base, end, absmax) }.unwrap_or(0)
            };
            out.push(cell_stat(head_dim, (sum, sq, nan), (min, max), find));
            base = end;
        }
    }

    /// Add the K rows to the sums: every value of the rows (acc.n of each, acc.n a multiple of
    /// acc.head_dim, a multiple of 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn channel_rows<L: Load, const K: usize>(
        acc: &mut ChannelSums,
        rows: [L; K],
    ) {
        let (n, hd) = (acc.n, acc.head_dim);
        let (shift, s1, s2) = (acc.shift.as_ptr(), acc.s1.as_mut_ptr(), acc.s2.as_mut_ptr());
        let (lo, hi) = (acc.lo.as_mut_ptr(), acc.hi.as_mut_ptr());
        let nan = acc.nan.as_mut_ptr();
        // the rows two groups on (a record's rows follow each other)
        let ahead = 2 * K * n * L::SIZE;
        for (h, e) in acc.l2.iter_mut().enumerate().take(n / hd) {
            let (base, end) = (h * hd, (h + 1) * hd);
            let mut q = [[_mm256_setzero_pd(); 2]; K];
            // per row: its NaN values in this head
            let mut row_nan = [0usize; K];
            let mut i = base;
            while i < end {
                // SAFETY: i + 8 <= n: inside each row and each sum.
                unsafe {
                    let (k0, k1) = (
                        _mm256_loadu_pd(shift.add(i)),
                        _mm256_loadu_pd(shift.add(i + 4)),
                    );
                    let (mut t0, mut t1) =
                        (_mm256_loadu_pd(s1.add(i)), _mm256_loadu_pd(s1.add(i + 4)));
                    let (mut u0, mut u1) =
                        (_mm256_loadu_pd(s2.add(i)), _mm256_loadu_pd(s2.add(i + 4)));
                    let mut l = _mm256_loadu_ps(lo.add(i));
                    let mut g = _mm256_loadu_ps(hi.add(i));
                    if (i * L::SIZE) % 64 == 0 {
                        for r in &rows {
                            r.prefetch(i, ahead);
                        }
                    }
                    for ((r, q), row_nan) in rows.iter().zip(q.iter_mut()).zip(&mut row_nan) {
                        let v = r.load8(i);
                        l = _mm256_min_ps(v, l);
                        g = _mm256_max_ps(v, g);
                        let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                        let (mut x0, mut x1) = widen(v);
                        let (mut d0, mut d1) = (_mm256_sub_pd(x0, k0), _mm256_sub_pd(x1, k1));
                        if m != 0 {
                            // NaN lanes add nothing (0 to each sum), counted per channel and row
                            let b0 = _mm256_cmp_pd::<_CMP_UNORD_Q>(x0, x0);
                            let b1 = _mm256_cmp_pd::<_CMP_UNORD_Q>(x1, x1);
                            x0 = _mm256_andnot_pd(b0, x0);
                            x1 = _mm256_andnot_pd(b1, x1);
                            d0 = _mm256_andnot_pd(b0, d0);
                            d1 = _mm256_andnot_pd(b1, d1);
                            for b in 0..8 {
                                *nan.add(i + b) += ((m >> b) & 1) as u64;
                            }
                            *row_nan += m.count_ones() as usize;
                        }
                        q[0] = _mm256_fmadd_pd(x0, x0, q[0]);
                        q[1] = _mm256_fmadd_pd(x1, x1, q[1]);
                        t0 = _mm256_add_pd(t0, d0);
                        t1 = _mm256_add_pd(t1, d1);
                        u0 = _mm256_fmadd_pd(d0, d0, u0);
                        u1 = _mm256_fmadd_pd(d1, d1, u1);
                    }
                    _mm256_storeu_pd(s1.add(i), t0);
                    _mm256_storeu_pd(s1.add(i + 4), t1);
                    _mm256_storeu_pd(s2.add(i), u0);
                    _mm256_storeu_pd(s2.add(i + 4), u1);
                    _mm256_storeu_ps(lo.add(i), l);
                    _mm256_storeu_ps(hi.add(i), g);
                }
                i += 8;
            }
            for (q, &bad) in q.iter().zip(&row_nan) {
                if bad == hd {
                    continue; // the row's head holds NaNs only: no norm
                }
                // SAFETY: AVX.
                let l2 = unsafe { lanes_sum(q[0], q[1]) }.sqrt();
                e.0 += l2;
                e.1 = e.1.max(l2);
                e.2 += 1;
            }
        }
    }

    /// Loss sums of x against y per head (x.len() == y.len(), acc a slot per whole head, head_dim
    /// a multiple of 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn loss_sums(x: &[f32], y: &[f32], head_dim: usize, acc: &mut [LossSums]) {
        let abs = _mm256_set1_pd(-0.0);
        let heads = x.len() / head_dim;
        let (px, py) = (F32Ptr(x.as_ptr()), F32Ptr(y.as_ptr()));
        for (h, e) in acc.iter_mut().enumerate().take(heads) {
            let z = _mm256_setzero_pd();
            let (mut se, mut mx, mut aa, mut bb, mut ab) = ([z; 2], [z; 2], [z; 2], [z; 2], [z; 2]);
            let (mut i, end) = (h * head_dim, (h + 1) * head_dim);
            let mut nan = 0u64;
            while i < end {
                // SAFETY: i + 8 <= heads * head_dim <= x.len() == y.len().
                let (xs, ys) = unsafe { (px.load8(i), py.load8(i)) };
                i += 8;
                let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(xs, xs));
                nan += m.count_ones() as u64;
                // SAFETY: AVX.
                let (a, b) = unsafe { (widen(xs), widen(ys)) };
                for (k, (u, v)) in [(a.0, b.0), (a.1, b.1)].into_iter().enumerate() {
                    // a NaN of x is left out: 0 against 0
                    let (u, v) = if m != 0 {
                        let bad = _mm256_cmp_pd::<_CMP_UNORD_Q>(u, u);
                        (_mm256_andnot_pd(bad, u), _mm256_andnot_pd(bad, v))
                    } else {
                        (u, v)
                    };
                    let d = _mm256_sub_pd(u, v);
                    se[k] = _mm256_fmadd_pd(d, d, se[k]);
                    mx[k] = _mm256_max_pd(mx[k], _mm256_andnot_pd(abs, d));
                    aa[k] = _mm256_fmadd_pd(u, u, aa[k]);
                    bb[k] = _mm256_fmadd_pd(v, v, bb[k]);
                    ab[k] = _mm256_fmadd_pd(u, v, ab[k]);
                }
            }
            // SAFETY: AVX.
            let r = unsafe {
                let mut m = [0f64; 8];
                _mm256_storeu_pd(m.as_mut_ptr(), mx[0]);
                _mm256_storeu_pd(m.as_mut_ptr().add(4), mx[1]);
                RowLoss {
                    n: head_dim as u64 - nan,
                    nan,
                    se: lanes_sum(se[0], se[1]),
                    max_abs: m.iter().fold(0.0, |a, &b| a.max(b)),
                    aa: lanes_sum(aa[0], aa[1]),
                    bb: lanes_sum(bb[0], bb[1]),
                    ab: lanes_sum(ab[0], ab[1]),
                }
            };
            e.add_row(&r);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::stats::passes::one_cell;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let k = (i * 7919 + seed * 104_729) % 2003;
                let x = (k as f32 - 1001.0) / 97.0;
                if k % 41 == 0 {
                    x * 300.0 + 1000.0 // outliers far from the rest
                } else {
                    f16::from_f32(x).to_f32()
                }
            })
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
    }

    #[test]
    fn head_stats_equal_the_plain_loops_for_f16_and_f32_rows() {
        for head_dim in [8usize, 16, 24, 128, 5] {
            let x = values(head_dim * 6, head_dim);
            let mut x16: Vec<f32> = x.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
            x16[3] = f32::NAN;
            let bytes: Vec<u8> = x16
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
                .collect();
            for (row, plain) in [
                (Values::F32(&x), &x),
                (Values::F16(&bytes[1..]), &x16),
                (Values::F16(&bytes), &x16),
            ] {
                let mut got = vec![];
                head_stats(row, head_dim, &mut got);
                let whole = row.len() / head_dim;
                assert_eq!(got.len(), whole);
                if row.len() != plain.len() {
                    continue; // the unaligned slice: lengths only
                }
                for (g, h) in got.iter().zip(plain.chunks_exact(head_dim)) {
                    let want = one_cell(h);
                    assert_eq!(
                        (g.min, g.max, g.absmax, g.argmax),
                        (want.min, want.max, want.absmax, want.argmax)
                    );
                    if h.iter().all(|v| !v.is_nan()) {
                        assert!(
                            close(g.l2, want.l2) && close(g.mean, want.mean),
                            "{g:?} {want:?}"
                        );
                        assert!((g.std - want.std).abs() <= 1e-9 * want.std.max(1.0));
                    }
                }
            }
        }
    }

    #[test]
    fn argmax_of_f16_rows_with_zeros_nans_and_ties() {
        let mut x = vec![0f32; 48];
        x[5] = -0.0;
        x[20] = f32::NAN;
        let mut y = x.clone();
        y[17] = -3.5;
        y[40] = 3.5;
        // an infinity after a tie of finite magnitudes; a head of NaN only; subnormals
        let mut z = y.clone();
        z[44] = f32::NEG_INFINITY;
        z[..8].fill(f32::NAN);
        z[9] = -f16::from_bits(1).to_f32();
        z[12] = f16::from_bits(1).to_f32();
        for x in [&x, &y, &z] {
            let bytes: Vec<u8> = x
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
                .collect();
            for hd in [8usize, 24, 48] {
                let mut got = vec![];
                head_stats(Values::F16(&bytes), hd, &mut got);
                for (g, h) in got.iter().zip(x.chunks_exact(hd)) {
                    let want = one_cell(h);
                    assert_eq!((g.argmax, g.nan), (want.argmax, want.nan));
                    assert_eq!(g.absmax.to_bits(), want.absmax.to_bits());
                }
            }
        }
    }

    /// The statistics of `h` with its NaNs removed, by the plain rule (two-pass, in f64).
    fn without_nan(h: &[f32]) -> (usize, f64, f64, f64, f32, f32) {
        let kept: Vec<f64> = h
            .iter()
            .filter(|v| !v.is_nan())
            .map(|&v| v as f64)
            .collect();
        let n = kept.len() as f64;
        let mean = kept.iter().sum::<f64>() / n;
        let var = kept.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let l2 = kept.iter().map(|v| v * v).sum::<f64>().sqrt();
        let lo = kept.iter().cloned().fold(f64::INFINITY, f64::min) as f32;
        let hi = kept.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32;
        (h.len() - kept.len(), l2, mean, var.sqrt(), lo, hi)
    }

    #[test]
    fn nan_values_are_left_out_of_head_statistics_and_counted() {
        for head_dim in [8usize, 16, 24, 5] {
            let mut x = values(head_dim * 4, head_dim);
            // head 0: NaN only; head 1: one NaN; head 2: all but one NaN; head 3: none
            x[..head_dim].fill(f32::NAN);
            x[head_dim + 3] = f32::NAN;
            x[2 * head_dim..3 * head_dim - 1].fill(f32::NAN);
            let x16: Vec<f32> = x.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
            let bytes: Vec<u8> = x16
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes())
                .collect();
            for (row, plain) in [(Values::F32(&x), &x), (Values::F16(&bytes), &x16)] {
                let mut got = vec![];
                head_stats(row, head_dim, &mut got);
                let none = got[0];
                assert_eq!((none.argmax, none.nan), (None, head_dim as u32));
                assert!([none.l2, none.mean, none.std].iter().all(|v| v.is_nan()));
                assert!([none.min, none.max, none.absmax].iter().all(|v| v.is_nan()));
                for (g, h) in got.iter().zip(plain.chunks_exact(head_dim)).skip(1) {
                    let (nan, l2, mean, std, lo, hi) = without_nan(h);
                    assert_eq!(g.nan as usize, nan);
                    assert!(close(g.l2, l2) && close(g.mean, mean), "{g:?}");
                    assert!((g.std - std).abs() <= 1e-9 * std.max(1.0), "{g:?} {std}");
                    assert_eq!((g.min, g.max, g.absmax), (lo, hi, (-lo).max(hi)));
                    let a = g.argmax.unwrap() as usize;
                    assert_eq!(h[a].abs(), g.absmax);
                }
                assert_eq!(got[3].nan, 0);
            }
        }
    }

    #[test]
    fn infinities_are_values() {
        let mut x = vec![1f32; 16];
        x[2] = f32::INFINITY;
        let mut got = vec![];
        head_stats(Values::F32(&x), 8, &mut got);
        let s = got[0];
        assert_eq!(
            (s.l2, s.mean, s.max, s.absmax, s.nan),
            (
                f64::INFINITY,
                f64::INFINITY,
                f32::INFINITY,
                f32::INFINITY,
                0
            )
        );
        assert_eq!(s.argmax, Some(2));
        assert!(s.std.is_nan(), "inf - inf is no deviation: {s:?}");
        x[3] = f32::NEG_INFINITY;
        got.clear();
        head_stats(Values::F32(&x), 8, &mut got);
        assert!(got[0].mean.is_nan() && got[0].min == f32::NEG_INFINITY);
    }

    #[test]
    fn channel_sums_leave_nan_out_and_count_it() {
        let (n, hd, rows) = (32usize, 8usize, 7usize);
        let mut x = values(n * rows, 5);
        for r in 0..rows {
            x[r * n] = f32::NAN; // channel 0: NaN in every row
            if r % 3 == 0 {
                x[r * n + 9] = f32::NAN; // channel 9: in some
            }
        }
        x[2 * n + 16..2 * n + 24].fill(f32::NAN); // row 2's head 2: NaN only
        let vals: Vec<Values> = x.chunks_exact(n).map(Values::F32).collect();
        for simd in [true, false] {
            let mut s = ChannelSums::new(n, hd);
            if simd {
                s.add(&vals);
            } else {
                for r in &vals {
                    s.add(std::slice::from_ref(r));
                }
            }
            let m = s.moments();
            assert_eq!((m[0].count, m[0].nan), (0, rows as u64));
            assert_eq!(m[0].reported().0.to_bits(), f64::NAN.to_bits());
            assert!(m[0].std().is_nan());
            for j in 1..n {
                let col: Vec<f32> = x.chunks_exact(n).map(|r| r[j]).collect();
                let (nan, _, mean, std, lo, hi) = without_nan(&col);
                assert_eq!(
                    (m[j].nan as usize, m[j].count as usize),
                    (nan, rows - nan),
                    "{j}"
                );
                assert!(
                    (m[j].mean - mean).abs() < 1e-12 * mean.abs().max(1.0),
                    "{j}"
                );
                assert!((m[j].std() - std).abs() <= 1e-9 * std.max(1.0), "{j}");
                assert_eq!((m[j].min, m[j].max), (lo, hi));
            }
            // head 2's norms: six rows (row 2 holds NaNs only there); head 0's: NaN left out
            assert_eq!(s.l2[2].2, rows as u64 - 1);
            assert_eq!(s.l2[0].2, rows as u64);
            let norm0: f64 = x
                .chunks_exact(n)
                .map(|r| {
                    r[1..hd]
                        .iter()
                        .map(|v| (*v as f64).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .sum();
            assert!(close(s.l2[0].0, norm0));
        }
    }

    #[test]
    fn loss_sums_leave_the_states_nan_out() {
        let (mut x, y) = (values(64, 1), values(64, 2));
        x[5] = f32::NAN;
        x[40..48].fill(f32::NAN);
        for hd in [32usize, 12] {
            let heads = 64 / hd;
            let mut got = vec![LossSums::default(); heads];
            loss_sums(&x, &y, hd, &mut got);
            for (h, g) in got.iter().enumerate() {
                let pairs: Vec<(f64, f64)> = x[h * hd..(h + 1) * hd]
                    .iter()
                    .zip(&y[h * hd..(h + 1) * hd])
                    .filter(|(p, _)| !p.is_nan())
                    .map(|(p, q)| (*p as f64, *q as f64))
                    .collect();
                let se: f64 = pairs.iter().map(|(p, q)| (p - q).powi(2)).sum();
                assert_eq!(
                    (g.count as usize, g.nan as usize),
                    (pairs.len(), hd - pairs.len())
                );
                assert!(close(g.se, se), "{} {}", g.se, se);
            }
        }
    }

    #[test]
    fn channel_sums_equal_two_pass_moments() {
        let (n, hd, rows) = (64usize, 16usize, 7usize);
        let x = values(n * rows, 3);
        for pair in [true, false] {
            let mut s = ChannelSums::new(n, hd);
            let vals: Vec<Values> = x.chunks_exact(n).map(Values::F32).collect();
            if pair {
                s.add(&vals); // 4, 2, 1
            } else {
                for r in &vals {
                    s.add(std::slice::from_ref(r));
                }
            }
            let m = s.moments();
            for j in 0..n {
                let col: Vec<f64> = x.chunks_exact(n).map(|r| r[j] as f64).collect();
                let mean = col.iter().sum::<f64>() / rows as f64;
                let m2: f64 = col.iter().map(|v| (v - mean) * (v - mean)).sum();
                assert_eq!(m[j].count, rows as u64);
                assert!(close(m[j].mean, mean) || (m[j].mean - mean).abs() < 1e-12);
                assert!(
                    (m[j].m2 - m2).abs() <= 1e-10 * m2.max(1.0),
                    "{} {}",
                    m[j].m2,
                    m2
                );
                let lo = col.iter().cloned().fold(f64::INFINITY, f64::min) as f32;
                assert_eq!(m[j].min, lo);
            }
            for h in 0..n / hd {
                let norms: Vec<f64> = x
                    .chunks_exact(n)
                    .map(|r| {
                        r[h * hd..(h + 1) * hd]
                            .iter()
                            .map(|v| (*v as f64).powi(2))
                            .sum::<f64>()
                            .sqrt()
                    })
                    .collect();
                assert!(close(s.l2[h].0, norms.iter().sum()));
                assert_eq!(s.l2[h].2, rows as u64);
            }
        }
        // rows of another width add nothing
        let mut s = ChannelSums::new(n, hd);
        s.add(&[Values::F32(&x[..n - 1])]);
        assert_eq!(s.moments()[0].count, 0);
    }

    #[test]
    fn loss_sums_equal_the_plain_loop() {
        let (x, y) = (values(256, 1), values(256, 2));
        for hd in [128usize, 12] {
            let mut got = vec![LossSums::default(); 256 / hd];
            loss_sums(&x, &y, hd, &mut got);
            for (h, g) in got.iter().enumerate() {
                let (a, b) = (&x[h * hd..(h + 1) * hd], &y[h * hd..(h + 1) * hd]);
                let se: f64 = a
                    .iter()
                    .zip(b)
                    .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
                    .sum();
                let mx = a
                    .iter()
                    .zip(b)
                    .map(|(p, q)| (*p as f64 - *q as f64).abs())
                    .fold(0.0, f64::max);
                assert!(close(g.se, se) && g.max_abs == mx && g.count == hd as u64);
                // one row: its own relative error and cosine are the pooled ones
                assert_eq!((g.rows, g.rel_rows, g.cos_rows), (1, 1, 1));
                assert!(close(g.rel_mean(), g.rel()) && close(g.cosine_mean(), g.cosine()));
                assert!(close(g.rel_max, g.rel()) && close(g.cos_min, g.cosine()));
            }
            // a second row adds a row to every head
            loss_sums(&y, &x, hd, &mut got);
            assert!(got.iter().all(|g| g.rows == 2 && g.count == 2 * hd as u64));
        }
    }
}
