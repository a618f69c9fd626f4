//! llama.cpp's attention rotation (744c0c731, April 2026): a quantized cache stores K and V
//! multiplied, a group of `n` consecutive values at a time, by the orthonormal Walsh-Hadamard
//! matrix of order `n` (`ggml_gen_hadamard`: Sylvester order, entries +-1/sqrt(n), symmetric, so
//! H·H = I and undoing it is applying it again).
//!
//! The rule (`llama_kv_cache` constructor, `build_input_k_rot` / `build_input_v_rot`): K is rotated
//! when the K type is quantized, every layer of the cache has the same K head size and it is a
//! multiple of 64; the group is the largest power of two >= 64 dividing that head size. V likewise
//! with the V type and head size, always in groups of 64. Only the inputs of the attention that
//! rotate apply it: K-only attention (`llm_graph_input_attn_k`, the V-less MLA cache of deepseek2
//! and the like) stores K as computed, whatever `attn_rot_k` says ([`k_only`]). Nothing in the
//! bytes records it.

use crate::format::layout::{Container, Kind, Layout};
use crate::format::types::GgmlType;

/// What a state's container says about when it was written, relative to the rotation (April 2026).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// Written by a build with the rotation.
    After,
    /// Written by a build before it.
    Before,
    /// The container was written both before and after it.
    Either,
}

impl Era {
    pub fn name(self) -> &'static str {
        match self {
            Era::After => "after",
            Era::Before => "before",
            Era::Either => "either",
        }
    }
}

/// The era of a state, and the evidence for it.
pub fn era(layout: &Layout) -> (Era, &'static str) {
    let has = |f: &str| layout.features.contains(&f);
    match (layout.container, layout.version) {
        (Container::Ggsq, Some(3)) => (Era::After, "GGSQ version 3 (llama.cpp from August 2026)"),
        (Container::Ggsn, Some(10)) => (Era::After, "GGSN version 10 (llama.cpp from autumn 2026)"),
        (Container::RawSeq, _) if has("io magic") => (
            Era::After,
            "raw sequence bytes with the io magic (llama.cpp from May 2026)",
        ),
        _ if layout.outputs.is_some() => (
            Era::Before,
            "the outputs block (llama.cpp before February 2026)",
        ),
        _ if has("no n_stream") => (Era::Before, "caches without n_stream (llama.cpp of 2025)"),
        (Container::Ggsq, _) => (Era::Either, "GGSQ version 2 (written until August 2026)"),
        (Container::Ggsn, _) => (
            Era::Either,
            "GGSN version 9 without outputs (February to autumn 2026)",
        ),
        (Container::RawSeq, _) => (
            Era::Either,
            "raw sequence bytes without the io magic (written until May 2026)",
        ),
        (Container::RawState, _) => (
            Era::Either,
            "raw whole state without outputs (written since February 2026)",
        ),
    }
}

/// The smallest group llama.cpp rotates.
pub const MIN_GROUP: usize = 64;

/// The group llama.cpp rotates K rows of a cache in, or None where it does not rotate them:
/// `head_dim` is the one K head size shared by every layer of the cache (None if they differ).
pub fn k_group(ty: GgmlType, head_dim: Option<u64>) -> Option<usize> {
    let hd = head_dim? as usize;
    if !ty.is_quantized() || hd == 0 || hd % MIN_GROUP != 0 {
        return None;
    }
    let mut n = MIN_GROUP;
    while hd % (n * 2) == 0 {
        n *= 2;
    }
    Some(n)
}

/// The group llama.cpp rotates V rows in (always 64), or None where it does not rotate them.
pub fn v_group(ty: GgmlType, head_dim: Option<u64>) -> Option<usize> {
    let hd = head_dim? as usize;
    (ty.is_quantized() && hd != 0 && hd % MIN_GROUP == 0).then_some(MIN_GROUP)
}

/// Whether llama.cpp reads cache `cache` through its K-only attention input, which never rotates:
/// a V-less (MLA) cache that is the state's only attention cache. (An iSWA pair of V-less caches
/// is read through the K-only iSWA input, which rotates K; a cache with V through the KV input.)
pub fn k_only(layout: &Layout, cache: usize) -> bool {
    let mut attention = layout
        .caches
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.memory.is_recurrent());
    let (Some((ci, c)), None) = (attention.next(), attention.next()) else {
        return false;
    };
    let mut layers = c.streams.iter().flat_map(|s| &s.layers).peekable();
    ci == cache && layers.peek().is_some() && layers.all(|l| l.v.is_none())
}

/// The group llama.cpp stores `kind` rows of type `ty` of cache `cache` in (0: as computed), by
/// its rule, given the cache's head size of that kind (None: not known); None where that depends
/// on the head size (a quantized type, rows a group of 64 divides, a head size not known).
pub fn rule_group(
    layout: &Layout,
    cache: usize,
    kind: Kind,
    ty: GgmlType,
    head_dim: Option<u64>,
) -> Option<usize> {
    let recurrent = layout
        .caches
        .get(cache)
        .is_none_or(|c| c.memory.is_recurrent());
    if recurrent
        || kind.is_recurrent()
        || !ty.is_quantized()
        || (kind == Kind::K && k_only(layout, cache))
    {
        return Some(0);
    }
    if head_dim.is_some() {
        let g = match kind {
            Kind::K => k_group(ty, head_dim),
            _ => v_group(ty, head_dim),
        };
        return Some(g.unwrap_or(0));
    }
    // no head size: a row no group of 64 divides has no head size llama.cpp rotates
    let c = &layout.caches[cache];
    let divisible = c
        .streams
        .iter()
        .flat_map(|s| &s.layers)
        .filter_map(|l| l.record(kind))
        .any(|r| r.n_embd > 0 && r.n_embd % MIN_GROUP as u64 == 0);
    if divisible {
        None
    } else {
        Some(0)
    }
}

/// Multiply every group of `n` consecutive values of `row` by the orthonormal Hadamard matrix of
/// order `n` (a power of two); a trailing partial group is left as it is (never the case for a row
/// llama.cpp rotated). O(n log n) per group: the fast Walsh-Hadamard transform, eight lanes at a
/// time with AVX and FMA where the CPU has them.
pub fn hadamard_groups(row: &mut [f32], n: usize) {
    if n < 2 || !n.is_power_of_two() {
        return;
    }
    let scale = 1.0 / (n as f32).sqrt();
    #[cfg(target_arch = "x86_64")]
    if n >= 16
        && std::arch::is_x86_feature_detected!("avx")
        && std::arch::is_x86_feature_detected!("fma")
    {
        for g in row.chunks_exact_mut(n) {
            // SAFETY: the CPU has AVX and FMA; `g` holds n values, n a power of two >= 16.
            unsafe {
                match n {
                    64 => fwht_avx_regs::<8>(g, scale),
                    128 => fwht_avx_regs::<16>(g, scale),
                    _ => fwht_avx(g, scale),
                }
            }
        }
        return;
    }
    for g in row.chunks_exact_mut(n) {
        fwht(g);
        for x in g.iter_mut() {
            *x *= scale;
        }
    }
}

/// In-place unnormalized Walsh-Hadamard transform in natural (Sylvester) order.
fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        h *= 2;
    }
}

/// Stages h = 1, 2, 4 of the transform within one register of eight values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
#[inline]
unsafe fn within8(a: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let m1 = _mm256_setr_ps(1., -1., 1., -1., 1., -1., 1., -1.);
    let m2 = _mm256_setr_ps(1., 1., -1., -1., 1., 1., -1., -1.);
    let m4 = _mm256_setr_ps(1., 1., 1., 1., -1., -1., -1., -1.);
    // a * (+-1) + b in one rounding: the product is exact, so the same as a multiply then an add
    let a = _mm256_fmadd_ps(a, m1, _mm256_permute_ps(a, 0b10_11_00_01));
    let a = _mm256_fmadd_ps(a, m2, _mm256_permute_ps(a, 0b01_00_11_10));
    _mm256_fmadd_ps(a, m4, _mm256_permute2f128_ps(a, a, 1))
}

/// The transform of a group of `8 * R` values (llama.cpp's 64 and 128) held whole in registers:
/// one load and one store per value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
unsafe fn fwht_avx_regs<const R: usize>(g: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    debug_assert_eq!(g.len(), 8 * R);
    let p = g.as_mut_ptr();
    let mut r = [_mm256_setzero_ps(); R];
    for (i, x) in r.iter_mut().enumerate() {
        // SAFETY: g holds 8 * R values.
        *x = within8(unsafe { _mm256_loadu_ps(p.add(8 * i)) });
    }
    let mut h = 1;
    while h < R {
        let mut base = 0;
        while base < R {
            for j in base..base + h {
                let (u, v) = (r[j], r[j + h]);
                r[j] = _mm256_add_ps(u, v);
                r[j + h] = _mm256_sub_ps(u, v);
            }
            base += 2 * h;
        }
        h *= 2;
    }
    let s = _mm256_set1_ps(scale);
    for (i, x) in r.iter().enumerate() {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(p.add(8 * i), _mm256_mul_ps(*x, s)) };
    }
}

/// The transform of one group, scaled: the stages within eight consecutive values (h = 1, 2, 4)
/// as lane permutations inside one register, the stages across registers (h >= 8) as plain
/// vector adds and subtracts, the scale folded into the last stage.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
unsafe fn fwht_avx(g: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    let n = g.len();
    let p = g.as_mut_ptr();
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n (n is a multiple of 8); unaligned loads and stores.
        unsafe { _mm256_storeu_ps(p.add(i), within8(_mm256_loadu_ps(p.add(i)))) };
    }
    let s = _mm256_set1_ps(scale);
    let mut h = 8;
    while h < n {
        let last = 2 * h == n;
        for base in (0..n).step_by(2 * h) {
            for j in (base..base + h).step_by(8) {
                // SAFETY: j + h + 8 <= base + 2h <= n.
                unsafe {
                    let u = _mm256_loadu_ps(p.add(j));
                    let v = _mm256_loadu_ps(p.add(j + h));
                    let (mut x, mut y) = (_mm256_add_ps(u, v), _mm256_sub_ps(u, v));
                    if last {
                        x = _mm256_mul_ps(x, s);
                        y = _mm256_mul_ps(y, s);
                    }
                    _mm256_storeu_ps(p.add(j), x);
                    _mm256_storeu_ps(p.add(j + h), y);
                }
            }
        }
        h *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrix exactly as `ggml_gen_hadamard` builds it.
    fn ggml_hadamard(n: usize) -> Vec<f32> {
        let mut d = vec![0f32; n * n];
        d[0] = 1.0 / (n as f32).sqrt();
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let v = d[i * n + j];
                    d[(i + s) * n + j] = v;
                    d[i * n + j + s] = v;
                    d[(i + s) * n + j + s] = -v;
                }
            }
            s *= 2;
        }
        d
    }

    #[test]
    fn matches_ggml_matrix_and_is_an_involution() {
        for n in [64usize, 128, 256] {
            let h = ggml_hadamard(n);
            let x: Vec<f32> = (0..2 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let mut y = x.clone();
            hadamard_groups(&mut y, n);
            for g in 0..2 {
                for i in 0..n {
                    let want: f64 = (0..n)
                        .map(|j| h[i * n + j] as f64 * x[g * n + j] as f64)
                        .sum();
                    assert!((y[g * n + i] as f64 - want).abs() < 1e-4, "n={n} i={i}");
                }
            }
            hadamard_groups(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn fast_path_equals_the_plain_transform() {
        for n in [16usize, 64, 128, 256, 512] {
            let x: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 7919 % 263) as f32 - 131.0) / 17.0)
                .collect();
            let mut fast = x.clone();
            hadamard_groups(&mut fast, n);
            let scale = 1.0 / (n as f32).sqrt();
            let mut plain = x.clone();
            for g in plain.chunks_exact_mut(n) {
                fwht(g);
                g.iter_mut().for_each(|v| *v *= scale);
            }
            for (a, b) in fast.iter().zip(&plain) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "n={n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn groups_follow_llama_cpp() {
        use GgmlType::*;
        assert_eq!(k_group(Q8_0, Some(128)), Some(128));
        assert_eq!(k_group(Q8_0, Some(256)), Some(256));
        assert_eq!(k_group(Q4_0, Some(192)), Some(64));
        assert_eq!(k_group(Q4_0, Some(576)), Some(64));
        assert_eq!(k_group(Q8_0, Some(32)), None);
        assert_eq!(k_group(F16, Some(128)), None);
        assert_eq!(k_group(Q8_0, None), None);
        assert_eq!(v_group(Q4_1, Some(256)), Some(64));
        assert_eq!(v_group(Bf16, Some(256)), None);
        assert_eq!(v_group(Iq4Nl, Some(96)), None);
    }
}
