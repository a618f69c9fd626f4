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

/// `scale * q . k` of each seen cell, soft-capped, into `logits` (cleared first).
pub fn logits(
    layer: &LayerAttn,
    keys: &Keys,
    head: usize,
    q: &[f32],
    seen: &[Seen],
    logits: &mut Vec<f64>,
) {
    let d = layer.head_dim;
    let at = layer.kv_head(head) * d;
    logits.clear();
    logits.extend(seen.iter().map(|&(s, c)| {
        let row = &keys.rows[s as usize][c as usize * keys.n_embd + at..][..d];
        let dot: f64 = q
            .iter()
            .zip(row)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let x = layer.scale * dot;
        match layer.softcap {
            Some(cap) => cap * (x / cap).tanh(),
            None => x,
        }
    }));
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
