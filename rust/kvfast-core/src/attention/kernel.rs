//! One query head's attention over the cells it sees: logits in f64 (`scale * q . k`, soft-capped
//! where the model caps), then the softmax with the layer's sink logit where it has one.

use crate::attention::params::LayerAttn;

/// The keys of one cache layer, every stream's cells decoded (f32, the model's basis).
pub struct Keys<'a> {
    /// Per stream: its cells' K rows, `n_head_kv * head_dim` values each.
    pub rows: Vec<Vec<f32>>,
    /// Per stream: the stream's cell metadata.
    pub streams: Vec<&'a crate::format::layout::Stream>,
    pub n_embd: usize,
}

/// A cell a query sees: (stream index among the cache's, cell).
pub type Seen = (u32, u32);

/// `scale * q . k` of each seen cell, soft-capped (`cap * tanh(x / cap)`), into `logits`.
pub fn logits(
    layer: &LayerAttn,
    keys: &Keys,
    head: usize,
    q: &[f32],
    seen: &[Seen],
    logits: &mut Vec<f64>,
) {
    block_logits(layer, keys, head, &[q], seen, logits);
}

/// [`logits`] of a block of queries (of one head) over the union of the cells they see, each K
/// row read once for all of them: `out[i * seen.len() + u]` for query `i` and cell `seen[u]`.
pub fn block_logits(
    layer: &LayerAttn,
    keys: &Keys,
    head: usize,
    qs: &[&[f32]],
    seen: &[Seen],
    out: &mut Vec<f64>,
) {
    let d = layer.head_dim;
    let at = layer.kv_head(head) * d;
    out.clear();
    out.resize(qs.len() * seen.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { dots_avx2(keys, at, d, qs, seen, out) };
        } else {
            dots(keys, at, d, qs, seen, out);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    dots(keys, at, d, qs, seen, out);
    for x in out.iter_mut() {
        let v = layer.scale * *x;
        *x = match layer.softcap {
            Some(cap) => cap * (v / cap).tanh(),
            None => v,
        };
    }
}

/// Every query's `q . k` with every seen cell's K row (`d` values from `at`).
#[inline(always)]
fn dots(keys: &Keys, at: usize, d: usize, qs: &[&[f32]], seen: &[Seen], out: &mut [f64]) {
    let n = seen.len();
    for (u, &(s, c)) in seen.iter().enumerate() {
        let row = &keys.rows[s as usize][c as usize * keys.n_embd + at..][..d];
        for (i, q) in qs.iter().enumerate() {
            out[i * n + u] = dot(q, row);
        }
    }
}

/// [`dots`] compiled for AVX2 and FMA (four f64 products a vector, fused adds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(
    keys: &Keys,
    at: usize,
    d: usize,
    qs: &[&[f32]],
    seen: &[Seen],
    out: &mut [f64],
) {
    dots(keys, at, d, qs, seen, out)
}

/// `a . b` in f64, over eight running sums (which the compiler keeps in vector registers).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += f64::from(*x) * f64::from(*y);
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// The softmax of `logits` in place, with `sink` (a logit that takes its share of the mass and
/// no cell's) in the denominator where given.
pub fn softmax(logits: &mut [f64], sink: Option<f64>) {
    let mut m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if let Some(s) = sink {
        m = m.max(s);
    }
    let mut sum = sink.map_or(0.0, |s| (s - m).exp());
    for l in logits.iter_mut() {
        *l = (*l - m).exp();
        sum += *l;
    }
    for l in logits.iter_mut() {
        *l /= sum;
    }
}

/// The entropy (nats) of weights.
pub fn entropy(w: &[f64]) -> f64 {
    -w.iter()
        .filter(|x| **x > 0.0)
        .map(|x| x * x.ln())
        .sum::<f64>()
}

/// The indices of the `k` largest weights, largest first (ties: the earlier cell first).
pub fn top_k(w: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..w.len()).collect();
    let by = |a: &usize, b: &usize| w[*b].total_cmp(&w[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::params::Window;

    #[test]
    fn softmax_with_and_without_a_sink() {
        let mut l = vec![0.0, 2f64.ln()];
        softmax(&mut l, None);
        assert!((l[0] - 1.0 / 3.0).abs() < 1e-15 && (l[1] - 2.0 / 3.0).abs() < 1e-15);
        let mut l = vec![0.0, 0.0];
        softmax(&mut l, Some(0.0));
        assert!((l[0] - 1.0 / 3.0).abs() < 1e-15);
        let mut big = vec![1000.0, 1000.0];
        softmax(&mut big, None);
        assert_eq!(big, [0.5, 0.5]);
        assert!((entropy(&[0.5, 0.5]) - 2f64.ln()).abs() < 1e-15);
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), [1, 2, 3]);
        assert_eq!(top_k(&[0.1, 0.5], 5), [1, 0]);
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert_eq!(dot(&a, &b), want);
    }

    #[test]
    fn logits_read_the_kv_head_of_their_group_and_cap() {
        let layer = LayerAttn {
            model_layer: 0,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 2,
            scale: 0.5,
            softcap: None,
            window: Window::None,
            sinks: None,
        };
        let stream = crate::format::layout::Stream::new(0, 0, 1, 0, 0);
        // one cell: KV head 0 = (1, 0), KV head 1 = (0, 1)
        let keys = Keys {
            rows: vec![vec![1.0, 0.0, 0.0, 1.0]],
            streams: vec![&stream],
            n_embd: 4,
        };
        let mut out = vec![];
        logits(&layer, &keys, 1, &[2.0, 4.0], &[(0, 0)], &mut out);
        assert_eq!(out, [1.0]); // head 1 reads KV head 0
        logits(&layer, &keys, 2, &[2.0, 4.0], &[(0, 0)], &mut out);
        assert_eq!(out, [2.0]);
        let capped = LayerAttn {
            softcap: Some(1.0),
            ..layer
        };
        logits(&capped, &keys, 2, &[2.0, 4.0], &[(0, 0)], &mut out);
        assert_eq!(out, [2f64.tanh()]);
    }
}
