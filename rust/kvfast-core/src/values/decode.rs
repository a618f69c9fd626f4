//! Rows of every cache type to f32, bit for bit as ggml's `dequantize_row_*` computes them.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rayon::prelude::*;

use crate::format::types::GgmlType;

/// iq4_nl's value table (ggml's kvalues_iq4nl).
pub const IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[inline]
fn h(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// f16 to f32 with the CPU's conversion instructions where it has them (F16C), else in software;
/// both are exact.
fn f16_row(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has F16C and AVX.
        unsafe { f16_row_f16c(src, dst) };
        return;
    }
    let n = dst.len().min(src.len() / 2);
    #[cfg(target_endian = "little")]
    if (src.as_ptr() as usize) % 2 == 0 {
        // SAFETY: `src` is 2-aligned and holds at least `n` little-endian u16 values.
        let bits: &[u16] = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u16, n) };
        bits.reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut dst[..n]);
        return;
    }
    let mut tmp = [0u16; 256];
    for (d, s) in dst.chunks_mut(256).zip(src.chunks(512)) {
        for (t, c) in tmp.iter_mut().zip(s.chunks_exact(2)) {
            *t = u16::from_le_bytes([c[0], c[1]]);
        }
        tmp[..d.len()]
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(d);
    }
}

/// Eight values at a time with VCVTPH2PS; unaligned loads, so any file offset works. Converts the
/// values both slices hold (the smaller of `dst.len()` and `src.len() / 2`), whatever their lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_row_f16c(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = dst.len().min(src.len() / 2);
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= n, so `src` holds the 16 bytes read and `dst` the 8 values written.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for i in whole..n {
        dst[i] = f16::from_bits(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])).to_f32();
    }
}

/// q8_0 blocks to f32: value j is `q_j * d`, with AVX2 and F16C where the CPU has them (the same
/// products: an i8 and an f16 scale are exact in f32).
fn q8_0_rows(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C.
        unsafe { q8_0_rows_avx2(src, dst) };
        return;
    }
    for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
        let d = h(b, 0);
        for j in 0..32 {
            o[j] = (b[2 + j] as i8) as f32 * d;
        }
    }
}

/// The blocks both hold, eight values at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_0_rows_avx2(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
        let bits = u16::from_le_bytes([b[0], b[1]]);
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)));
        for k in 0..4 {
            // SAFETY: the block holds 34 bytes (8 read at 2 + 8k <= 26) and `o` 32 values.
            unsafe {
                let q = _mm_loadl_epi64(b.as_ptr().add(2 + 8 * k) as *const __m128i);
                let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), _mm256_mul_ps(f, d));
            }
        }
    }
}

/// Decode one row: the whole blocks of `ty` in `src` into their values in `dst`, as many blocks as
/// both hold. Values of `dst` that no whole block of `src` covers are set to NaN (never the case
/// for the rows of a walked record, whose bytes hold exactly its blocks). Returns how many values
/// were decoded. Never reads outside `src`, whatever the lengths.
pub fn decode_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> usize {
    let bb = ty.block_bytes();
    let bl = ty.block_len();
    let blocks = (src.len() / bb).min(dst.len() / bl);
    let (dst, rest) = dst.split_at_mut(blocks * bl);
    rest.fill(f32::NAN);
    let src = &src[..blocks * bb];
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => f16_row(src, dst),
        GgmlType::Bf16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        GgmlType::Q8_0 => q8_0_rows(src, dst),
        GgmlType::Q4_0 | GgmlType::Iq4Nl => {
            let nl = ty == GgmlType::Iq4Nl;
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = h(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    let (lo, hi) = ((q & 0x0F) as usize, (q >> 4) as usize);
                    if nl {
                        o[j] = d * IQ4NL[lo] as f32;
                        o[j + 16] = d * IQ4NL[hi] as f32;
                    } else {
                        o[j] = (lo as i32 - 8) as f32 * d;
                        o[j + 16] = (hi as i32 - 8) as f32 * d;
                    }
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                let (d, m) = (h(b, 0), h(b, 2));
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = (q & 0x0F) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let one = ty == GgmlType::Q5_1;
            let bb = ty.block_bytes();
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(bb)) {
                let d = h(b, 0);
                let (m, qh_at) = if one { (h(b, 2), 4) } else { (0.0, 2) };
                let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
                let qs = &b[qh_at + 4..qh_at + 20];
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    let x0 = ((qs[j] & 0x0F) | xh0) as i32;
                    let x1 = ((qs[j] >> 4) | xh1) as i32;
                    if one {
                        o[j] = x0 as f32 * d + m;
                        o[j + 16] = x1 as f32 * d + m;
                    } else {
                        o[j] = (x0 - 16) as f32 * d;
                        o[j + 16] = (x1 - 16) as f32 * d;
                    }
                }
            }
        }
    }
    blocks * bl
}

/// One value of a plain float type from its first bytes (for the element-major V of one cell);
/// NaN for a block type, whose values mean nothing one at a time, or for too few bytes.
#[inline(always)]
pub(crate) fn float_at(ty: GgmlType, b: &[u8]) -> f32 {
    match (ty, b) {
        (GgmlType::F32, [a, b, c, d, ..]) => f32::from_le_bytes([*a, *b, *c, *d]),
        (GgmlType::F16, [a, b, ..]) => f16::from_bits(u16::from_le_bytes([*a, *b])).to_f32(),
        (GgmlType::Bf16, [a, b, ..]) => f32::from_bits((u16::from_le_bytes([*a, *b]) as u32) << 16),
        _ => f32::NAN,
    }
}

/// Rows per parallel task: enough work to amortize scheduling, small enough to balance.
fn rows_per_task(row_values: usize) -> usize {
    (16384 / row_values.max(1)).max(1)
}

/// Decode `src` (whole rows of `row_bytes` each) into `dst` (`n_embd` values per row), in parallel;
/// with `rotation` > 0, each row is then taken back to the model's basis (groups of that size).
pub fn decode_rows(
    ty: GgmlType,
    src: &[u8],
    row_bytes: usize,
    n_embd: usize,
    rotation: usize,
    dst: &mut [f32],
) {
    // Rows that `src` does not hold decode to NaN (never the case for a walked record's rows).
    if n_embd == 0 || row_bytes == 0 {
        dst.fill(f32::NAN);
        return;
    }
    let held = (src.len() / row_bytes).min(dst.len() / n_embd) * n_embd;
    let (dst, rest) = dst.split_at_mut(held);
    rest.fill(f32::NAN);
    let per = rows_per_task(n_embd);
    crate::parallel::install(|| {
        dst.par_chunks_mut(per * n_embd)
            .zip(src.par_chunks(per * row_bytes))
            .for_each(|(o, s)| {
                for (orow, srow) in o.chunks_exact_mut(n_embd).zip(s.chunks_exact(row_bytes)) {
                    decode_row(ty, srow, orow);
                    if rotation > 0 {
                        crate::values::rotation::hadamard_groups(orow, rotation);
                    }
                }
            })
    });
}

/// Whether `src` holds `n_embd` runs of `cells` elements of `el` bytes: then element `j * cells + c`
/// of every `j < n_embd` and `c < cells` lies inside it.
fn holds_transposed(src: &[u8], el: usize, cells: usize, n_embd: usize) -> bool {
    el > 0
        && n_embd > 0
        && n_embd
            .checked_mul(cells)
            .and_then(|v| v.checked_mul(el))
            .is_some_and(|need| need <= src.len())
}

/// Transpose element-major V (`n_embd` runs of `cells` elements of `el` bytes) into cell-major
/// rows of the same bytes, cells `first..` (as many as `dst` holds), in parallel. Rows `src` does
/// not hold (cells past `cells`, or all of them when `src` is shorter than the runs) are 0xFF
/// bytes: NaN in every float type.
pub fn transpose_bytes(
    src: &[u8],
    el: usize,
    (cells, first): (usize, usize),
    n_embd: usize,
    dst: &mut [u8],
) {
    if !holds_transposed(src, el, cells, n_embd) {
        dst.fill(0xFF);
        return;
    }
    let per = rows_per_task(n_embd);
    crate::parallel::install(|| {
        dst.par_chunks_mut(per * n_embd * el)
            .enumerate()
            .for_each(|(t, o)| {
                let c0 = first.saturating_add(t * per);
                for (ci, orow) in o.chunks_exact_mut(n_embd * el).enumerate() {
                    let c = c0.saturating_add(ci);
                    if c >= cells {
                        orow.fill(0xFF);
                        continue;
                    }
                    for j in 0..n_embd {
                        let s = (j * cells + c) * el;
                        orow[j * el..(j + 1) * el].copy_from_slice(&src[s..s + el]);
                    }
                }
            })
    })
}

/// Transpose element-major float V into cell-major f32 rows, cells `first..` (as many as `dst`
/// holds), in parallel. Rows `src` does not hold are NaN.
pub fn decode_transposed(
    ty: GgmlType,
    src: &[u8],
    (cells, first): (usize, usize),
    n_embd: usize,
    dst: &mut [f32],
) {
    let el = ty.block_bytes();
    if !holds_transposed(src, el, cells, n_embd) {
        dst.fill(f32::NAN);
        return;
    }
    let per = rows_per_task(n_embd);
    crate::parallel::install(|| {
        dst.par_chunks_mut(per * n_embd)
            .enumerate()
            .for_each(|(t, o)| {
                let c0 = first.saturating_add(t * per);
                for (ci, orow) in o.chunks_exact_mut(n_embd).enumerate() {
                    let c = c0.saturating_add(ci);
                    if c >= cells {
                        orow.fill(f32::NAN);
                        continue;
                    }
                    for (j, v) in orow.iter_mut().enumerate() {
                        let s = (j * cells + c) * el;
                        *v = float_at(ty, &src[s..s + el]);
                    }
                }
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn q8_0_block() {
        let mut b = vec![];
        b.extend(f16b(0.5));
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut out = [0f32; 32];
        decode_row(GgmlType::Q8_0, &b, &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, (i as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q4_0_and_iq4_nl_nibbles() {
        let mut b = vec![];
        b.extend(f16b(2.0));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        decode_row(GgmlType::Q4_0, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 2.0);
            assert_eq!(out[j + 16], (15.0 - j as f32 - 8.0) * 2.0);
        }
        decode_row(GgmlType::Iq4Nl, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], IQ4NL[j] as f32 * 2.0);
            assert_eq!(out[j + 16], IQ4NL[15 - j] as f32 * 2.0);
        }
    }

    #[test]
    fn q5_1_high_bits_and_min() {
        let mut b = vec![];
        b.extend(f16b(1.0));
        b.extend(f16b(-3.0));
        b.extend(0x8000_0001u32.to_le_bytes()); // value 0 and value 31 get bit 4
        b.extend([0u8; 16]);
        let mut out = [0f32; 32];
        decode_row(GgmlType::Q5_1, &b, &mut out);
        assert_eq!(out[0], 16.0 - 3.0);
        assert_eq!(out[31], 16.0 - 3.0);
        assert_eq!(out[1], -3.0);
    }

    #[test]
    fn bf16_and_transpose() {
        let vals = [1.5f32, -2.25, 3.0, 0.125, 7.0, -1.0];
        let src: Vec<u8> = vals
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        // element-major: 2 elements x 3 cells
        let mut out = [0f32; 6];
        decode_transposed(GgmlType::Bf16, &src, (3, 0), 2, &mut out);
        assert_eq!(out, [1.5, 0.125, -2.25, 7.0, 3.0, -1.0]);
    }
}
