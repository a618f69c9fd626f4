//! The vector loops of the tiled kernel over one row's f32 logits: the scale and the largest, the
//! exponentials and their sums (an f32 exponential eight lanes at a time, Cephes' polynomial as
//! llama.cpp's `ggml_v_expf` and most SIMD libraries use it), and the weights' sums. Each is
//! compiled twice, for AVX2 with FMA (chosen at run time) and for the baseline.

/// `exp(x)` for `x <= 0`, in f32 (relative error under 2e-7), 0 below -87 (where f32 would leave
/// its normal range): the scalar form of the vector loop, for the tail and other machines.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    if x < -87.0 {
        return 0.0;
    }
    // 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2
    let t = x * std::f32::consts::LOG2_E + 12_582_912.0; // 1.5 * 2^23: rounds to an integer
    let n = t - 12_582_912.0;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = poly(r);
    let bits = ((t.to_bits() as i32 - 0x4B40_0000 + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

#[inline(always)]
fn poly(r: f32) -> f32 {
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_2e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    (p * r).mul_add(r, r) + 1.0
}

/// Multiply `x` by `scale` in place, soft-cap it (`cap * tanh(x / cap)`) where given, and give its
/// largest value (-inf for none).
pub fn scale_max(x: &mut [f32], scale: f32, cap: Option<f32>) -> f32 {
    if let Some(c) = cap {
        let mut m = f32::NEG_INFINITY;
        for v in x.iter_mut() {
            *v = c * (*v * scale / c).tanh();
            m = m.max(*v);
        }
        return m;
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        return unsafe { scale_max_avx2(x, scale) };
    }
    scale_max_body(x, scale)
}

#[inline(always)]
fn scale_max_body(x: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (v, l) in c.iter_mut().zip(lanes.iter_mut()) {
            *v *= scale;
            *l = if *v > *l { *v } else { *l };
        }
    }
    let mut m = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in chunks.into_remainder() {
        *v *= scale;
        m = m.max(*v);
    }
    m
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_max_avx2(x: &mut [f32], scale: f32) -> f32 {
    scale_max_body(x, scale)
}

/// Replace each `x` by `e = exp(x - m)` (every `x <= m`) and give `(sum e, sum e * (x - m))`.
pub fn exp_sums(x: &mut [f32], m: f32) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        return unsafe { exp_sums_avx2(x, m) };
    }
    let (mut s, mut t) = (0f64, 0f64);
    for v in x.iter_mut() {
        let y = *v - m;
        *v = exp_neg(y);
        s += f64::from(*v);
        t += f64::from(*v * y);
    }
    (s, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sums_avx2(x: &mut [f32], m: f32) -> (f64, f64) {
    use std::arch::x86_64::*;
    let mv = _mm256_set1_ps(m);
    let (log2e, magic) = (
        _mm256_set1_ps(std::f32::consts::LOG2_E),
        _mm256_set1_ps(12_582_912.0),
    );
    let (c1, c2) = (_mm256_set1_ps(0.693_359_4), _mm256_set1_ps(-2.121_944_4e-4));
    let k = [
        1.987_569_1e-4f32,
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    let (one, low) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-87.0));
    let bias = _mm256_set1_epi32(127 - 0x4B40_0000);
    // the sum in f64 (a row's weights then sum to 1 in f64), the other in f32
    let (mut s0, mut s1, mut t) = (
        _mm256_setzero_pd(),
        _mm256_setzero_pd(),
        _mm256_setzero_ps(),
    );
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let p = c.as_mut_ptr();
        // SAFETY: `c` holds 8 values.
        let y = _mm256_sub_ps(unsafe { _mm256_loadu_ps(p) }, mv);
        let tt = _mm256_fmadd_ps(y, log2e, magic);
        let n = _mm256_sub_ps(tt, magic);
        let r = _mm256_fnmadd_ps(n, c2, _mm256_fnmadd_ps(n, c1, y));
        let mut q = _mm256_set1_ps(k[0]);
        for kk in &k[1..] {
            q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(*kk));
        }
        let q = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(q, r), r, r), one);
        let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_castps_si256(tt), bias));
        let e = _mm256_mul_ps(q, _mm256_castsi256_ps(two_n));
        let e = _mm256_and_ps(e, _mm256_cmp_ps::<_CMP_GE_OQ>(y, low));
        // SAFETY: as the load.
        unsafe { _mm256_storeu_ps(p, e) };
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
        t = _mm256_fmadd_ps(e, y, t);
    }
    let (mut ls, mut lt) = ([0f64; 4], [0f32; 8]);
    // SAFETY: arrays of 4 f64 and 8 f32 values.
    unsafe {
        _mm256_storeu_pd(ls.as_mut_ptr(), _mm256_add_pd(s0, s1));
        _mm256_storeu_ps(lt.as_mut_ptr(), t);
    }
    let mut out = (
        ls.iter().sum::<f64>(),
        lt.iter().map(|v| f64::from(*v)).sum::<f64>(),
    );
    for v in chunks.into_remainder() {
        let y = *v - m;
        *v = exp_neg(y);
        out.0 += f64::from(*v);
        out.1 += f64::from(*v * y);
    }
    out
}

/// `acc += e * f` in f64, value by value.
pub fn add_scaled(acc: &mut [f64], e: &[f32], f: f64) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        return unsafe { add_scaled_avx2(acc, e, f) };
    }
    add_scaled_body(acc, e, f)
}

#[inline(always)]
fn add_scaled_body(acc: &mut [f64], e: &[f32], f: f64) {
    for (a, x) in acc.iter_mut().zip(e) {
        *a += f64::from(*x) * f;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_scaled_avx2(acc: &mut [f64], e: &[f32], f: f64) {
    add_scaled_body(acc, e, f)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponential_is_f32_exact_to_two_units_and_zero_far_below() {
        let xs: Vec<f32> = (0..20_000).map(|i| -(i as f32) * 0.004_37).collect();
        let mut v = xs.clone();
        v.push(-100.0);
        v.push(-0.0);
        let (s, t) = exp_sums(&mut v, 0.0);
        let (mut s64, mut t64) = (0f64, 0f64);
        for (x, e) in xs.iter().zip(&v) {
            let want = f64::from(*x).exp();
            s64 += want;
            t64 += want * f64::from(*x);
            if want > 1e-37 {
                assert!(
                    ((f64::from(*e) - want) / want).abs() < 2.5e-7,
                    "{x}: {e} {want}"
                );
            }
            let one = f64::from(exp_neg(*x));
            assert!(
                want <= 1e-37 || ((one - want) / want).abs() < 2.5e-7,
                "{x}: {one} {want}"
            );
        }
        assert_eq!(v[v.len() - 2], 0.0);
        assert_eq!(v[v.len() - 1], 1.0);
        assert!(((s - 1.0 - s64) / s64).abs() < 1e-6 && ((t - t64) / t64).abs() < 1e-6);
        let mut x = vec![1.0f32, -3.0, 2.0, 0.5, 7.0, -1.0, 0.0, 4.0, 6.5];
        assert_eq!(scale_max(&mut x, 0.5, None), 3.5);
        assert_eq!(x[8], 3.25);
        let mut x = vec![100.0f32, -100.0];
        assert!((scale_max(&mut x, 1.0, Some(2.0)) - 2.0).abs() < 1e-6);
        let mut acc = vec![1.0f64; 11];
        add_scaled(&mut acc, &[2.0; 11], 0.25);
        assert!(acc.iter().all(|a| *a == 1.5));
    }
}
