//! ggml's reference quantizers (`quantize_row_*_ref`), bit for bit: what a cheaper cache type would
//! store for the same values. Plain f32 arithmetic, no fused multiply-add (ggml's x86-64 builds).

use half::f16;

use crate::format::types::GgmlType;
use crate::values::decode::IQ4NL;

/// A block's f16 scale as the reference quantizers store it (GGML_FP32_TO_FP16, ggml's
/// ggml_compute_fp32_to_fp16): to nearest even, and a NaN as 0x7e00 with its sign, its payload
/// dropped.
fn put_f16(out: &mut [u8], at: usize, x: f32) {
    let h = if x.is_nan() {
        ((x.to_bits() >> 16) & 0x8000) as u16 | 0x7e00
    } else {
        f16::from_f32(x).to_bits()
    };
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
}

/// ggml's GGML_FP32_TO_BF16: round to nearest even, NaN kept quiet.
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// Quantize `x` (whole blocks of `ty`) into `out` (`ty`'s bytes for them).
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::Bf16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            for (b, xs) in out.chunks_exact_mut(34).zip(x.chunks_exact(32)) {
                let d = q8_0_amax(xs) / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                for j in 0..32 {
                    b[2 + j] = c_i8((xs[j] * id).round()) as u8;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let five = ty == GgmlType::Q5_0;
            let bb = ty.block_bytes();
            for (b, xs) in out.chunks_exact_mut(bb).zip(x.chunks_exact(32)) {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in xs {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = if five { max / -16.0 } else { max / -8.0 };
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                let (top, off) = if five {
                    (31u8, 16.5f32)
                } else {
                    (15u8, 8.5f32)
                };
                let q = |v: f32| ((v * id + off) as i8 as u8).min(top);
                pack(b, xs, five, 2, q);
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let five = ty == GgmlType::Q5_1;
            let bb = ty.block_bytes();
            for (b, xs) in out.chunks_exact_mut(bb).zip(x.chunks_exact(32)) {
                let (mut min, mut max) = (f32::MAX, -f32::MAX);
                for &v in xs {
                    min = min.min(v);
                    max = max.max(v);
                }
                let d = (max - min) / if five { 31.0 } else { 15.0 };
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                put_f16(b, 2, min);
                if five {
                    pack(b, xs, true, 4, |v| ((v - min) * id + 0.5) as u8);
                } else {
                    pack(b, xs, false, 4, |v| {
                        (((v - min) * id + 0.5) as i8 as u8).min(15)
                    });
                }
            }
        }
        GgmlType::Iq4Nl => {
            let mut l = [0u8; 32]; // ggml keeps the previous block's indices for an all-zero block
            for (b, xs) in out.chunks_exact_mut(18).zip(x.chunks_exact(32)) {
                iq4_nl_block(xs, b, &mut l);
            }
        }
    }
}

/// The absmax of a q8_0 block as quantize_row_q8_0_ref folds it, `amax = MAX(amax, fabsf(v))`
/// with ggml's `MAX(a, b) = a > b ? a : b`: a NaN makes it NaN and the next value replaces it. So
/// a block of NaNs, or one whose last value is NaN, has a NaN scale (every value decodes to NaN),
/// and one with a NaN elsewhere the absmax of the values after its last NaN. (`f32::max` would
/// drop the NaN: a zero scale for a block of NaNs.)
fn q8_0_amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0f32, |a, v| {
        let v = v.abs();
        if a > v {
            a
        } else {
            v
        }
    })
}

/// C's conversion of a float to int8_t as ggml's x86-64 builds do it: to int32 (CVTTSS2SI: NaN and
/// values out of its range give 0x80000000), then its low byte. Only a block whose absmax was
/// reset by a NaN has values past ±127.5 to convert (they wrap, as in ggml); `as i8` would
/// saturate them.
fn c_i8(q: f32) -> i8 {
    if q.is_nan() || !(-2147483648.0..2147483648.0).contains(&q) {
        return 0;
    }
    q as i32 as i8
}

/// Write 32 quants: low nibbles into qs, the 5th bits (for 5-bit types) into qh before qs.
fn pack(b: &mut [u8], xs: &[f32], five: bool, at: usize, q: impl Fn(f32) -> u8) {
    let mut qh = 0u32;
    let qs_at = if five { at + 4 } else { at };
    for j in 0..16 {
        let (x0, x1) = (q(xs[j]), q(xs[j + 16]));
        b[qs_at + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    if five {
        b[at..at + 4].copy_from_slice(&qh.to_le_bytes());
    }
}

fn best_index(x: f32) -> u8 {
    let val = &IQ4NL;
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < (val[mu] as f32) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// quantize_row_iq4_nl_impl with super block = block = 32, no weights, ntry = -1 (the _ref path).
fn iq4_nl_block(xs: &[f32], b: &mut [u8], l: &mut [u8; 32]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut scale = 0f32;
    if amax >= 1e-15 {
        let d = max / IQ4NL[0] as f32;
        let id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let k = best_index(id * xs[j]);
            l[j] = k;
            let q = IQ4NL[k as usize] as f32;
            let w = xs[j] * xs[j];
            sumqx += w * q * xs[j];
            sumq2 += w * q * q;
        }
        scale = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    }
    put_f16(b, 0, scale);
    for j in 0..16 {
        b[2 + j] = l[j] | (l[16 + j] << 4);
    }
}

/// `y` = `x` quantized to q8_0 with ggml's reference quantizer and dequantized, bit for bit
/// `quantize_row(Q8_0)` then `decode_row(Q8_0)` without the bytes between: value j of a block is
/// `round(x_j * id) * d`, `d` the block's scale as its f16 holds it. Whole blocks of both; values
/// of `y` past them are left as they are.
pub fn q8_0_round_trip(x: &[f32], y: &mut [f32]) {
    let blocks = x.len().min(y.len()) / 32;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C.
        unsafe { q8_0_round_trip_avx2(&x[..32 * blocks], &mut y[..32 * blocks]) };
        return;
    }
    for (xs, ys) in x.chunks_exact(32).zip(y.chunks_exact_mut(32)).take(blocks) {
        q8_0_block(xs, ys);
    }
}

/// One block of `q8_0_round_trip`, as ggml computes it.
fn q8_0_block(xs: &[f32], ys: &mut [f32]) {
    let d = q8_0_amax(xs) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let dd = f16::from_f32(d).to_f32();
    for (y, x) in ys.iter_mut().zip(xs) {
        *y = c_i8((x * id).round()) as f32 * dd;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_0_round_trip_avx2(x: &[f32], y: &mut [f32]) {
    for (xs, ys) in x.chunks_exact(32).zip(y.chunks_exact_mut(32)) {
        // SAFETY: the CPU has AVX2 and F16C; both blocks hold 32 values.
        if !unsafe { q8_0_block_avx2(xs, ys) } {
            q8_0_block(xs, ys);
        }
    }
}

/// One block with AVX2: the same arithmetic (roundf's halves away from zero rebuilt from a
/// truncation and the exact remainder). Returns false, writing nothing, for a block holding a
/// NaN or an infinity, which the plain code takes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn q8_0_block_avx2(xs: &[f32], ys: &mut [f32]) -> bool {
    use std::arch::x86_64::*;
    if xs.len() < 32 || ys.len() < 32 {
        return false;
    }
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: xs holds 32 values.
    let v: [__m256; 4] =
        std::array::from_fn(|k| unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * k)) });
    let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for &x in &v {
        let a = _mm256_andnot_ps(sign, x);
        m = _mm256_max_ps(m, a);
        // |x| not below infinity: NaN or infinite
        bad = _mm256_or_ps(
            bad,
            _mm256_cmp_ps::<_CMP_NLT_UQ>(a, _mm256_set1_ps(f32::INFINITY)),
        );
    }
    if _mm256_movemask_ps(bad) != 0 {
        return false;
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    // d to f16 (to nearest, ties to even, as half's from_f32) and back
    let dh = _mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(d));
    let dd = _mm256_broadcastss_ps(_mm_cvtph_ps(dh));
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    for (k, &x) in v.iter().enumerate() {
        let p = _mm256_mul_ps(x, id);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
        let rest = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
        let away = _mm256_or_ps(_mm256_and_ps(p, sign), one);
        let r = _mm256_add_ps(
            t,
            _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(rest, half), away),
        );
        // SAFETY: ys holds 32 values.
        unsafe { _mm256_storeu_ps(ys.as_mut_ptr().add(8 * k), _mm256_mul_ps(r, dd)) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::decode::decode_row;

    #[test]
    fn q8_0_round_trip_is_quantize_then_decode() {
        let mut x: Vec<f32> = (0..32 * 40)
            .map(|i| {
                ((i * 7919 % 1013) as f32 - 506.0) / 37.0 * if i % 97 == 0 { 40.0 } else { 1.0 }
            })
            .collect();
        // halves exactly: a block whose amax is 127 makes id 1
        for (j, v) in x[32..64].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        x[63] = 127.0;
        x[64..96].fill(0.0);
        x[96..128].fill(-2.5);
        x[130] = f32::NAN;
        x[170] = f32::INFINITY;
        x[200] = -0.0;
        let mut q = vec![0u8; 34 * 40];
        quantize_row(GgmlType::Q8_0, &x, &mut q);
        let mut want = vec![0f32; x.len()];
        decode_row(GgmlType::Q8_0, &q, &mut want);
        let mut got = vec![0f32; x.len()];
        q8_0_round_trip(&x, &mut got);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}: {a} vs {b}");
        }
    }

    /// quantize_row_q8_0_ref's bytes for one block (its scale's f16 bits, its quants).
    fn q8_0(xs: &[f32]) -> (u16, Vec<i8>) {
        let mut q = vec![0u8; 34];
        quantize_row(GgmlType::Q8_0, xs, &mut q);
        let d = u16::from_le_bytes([q[0], q[1]]);
        (d, q[2..].iter().map(|&b| b as i8).collect())
    }

    #[test]
    fn q8_0_nan_blocks_as_ggml() {
        let base: Vec<f32> = (0..32).map(|j| (j as f32 - 10.0) / 3.0).collect();
        // a block of NaNs: a NaN scale (f32::max folded it to 0, a zero scale), ggml's 0x7e00
        // whatever the NaN's payload
        let (d, qs) = q8_0(&[f32::NAN; 32]);
        assert_eq!(d, 0x7e00);
        assert!(qs.iter().all(|&q| q == 0));
        assert_eq!(q8_0(&[f32::from_bits(0xffc1_2345); 32]).0, 0x7e00);
        // the last value NaN: MAX(amax, NaN) is NaN, a NaN scale
        let mut x = base.clone();
        x[31] = f32::NAN;
        let (d, qs) = q8_0(&x);
        assert!(f16::from_bits(d).is_nan());
        assert!(qs.iter().all(|&q| q == 0));
        // a NaN before the largest values: dropped from the absmax (7 = x[31]), quant 0
        let mut x = base.clone();
        x[2] = 40.0;
        x[10] = f32::NAN;
        let (d, qs) = q8_0(&x);
        assert_eq!(f16::from_bits(d), f16::from_f32(7.0 / 127.0));
        assert_eq!((qs[10], qs[31]), (0, 127));
        // a NaN after the largest: the absmax is the values' after it, and 40 / d wraps as
        // ggml's int8_t conversion does: round(725.7) = 726 = 0x2d6, low byte 0xd6 = -42
        assert_eq!(qs[2], -42);
        assert_eq!(qs[0], -60);
        // the round trip decodes the same bytes
        let mut q = vec![0u8; 34];
        quantize_row(GgmlType::Q8_0, &x, &mut q);
        let mut want = vec![0f32; 32];
        decode_row(GgmlType::Q8_0, &q, &mut want);
        let mut got = vec![0f32; 32];
        q8_0_round_trip(&x, &mut got);
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        let mut got = vec![0f32; 32];
        q8_0_round_trip(&[f32::NAN; 32], &mut got);
        assert!(got.iter().all(|v| v.is_nan()));
    }
}
