//! Evidence for the group a K row is stored rotated in when the head size is not known: RoPE's
//! pairs.
//!
//! llama.cpp's NEOX RoPE (Qwen, Gemma and most models since) turns channel `c` of a head of `d`
//! with channel `c + d/2` by an angle `p * theta_i` at position `p`: in the model's basis the
//! complex number `z = x_c + i x_(c+d/2)` of pair `i` advances by `+theta_i` from one position to
//! the next, and `theta_0` is 1 radian whatever the base (the first pairs of a head turn fastest).
//! Real keys have a mean (a bias, the common direction of every token's key), so over consecutive
//! cells `Im(z_(t+1) conj(z_t)) / (|z_(t+1)| |z_t|)` averages to about `sin theta_i` on the first
//! pairs of the true heads. Read in any other basis it averages to about 0: undone in half the
//! group, a head's pairs are mixed by a reflection (the advance turns negative) and with pairs of
//! other frequencies; in twice the group, a channel is mixed with the same channel of the next
//! head, whose mean points elsewhere; with the wrong head size, `c + d/2` is not `c`'s partner.
//! So the reading (group, head size) whose first pairs advance clearly more than every other
//! reading's is llama.cpp's. Keys without a mean (zero-mean outlier channels alone) show no
//! advance in any reading: then this tells nothing, and the caller leaves the values as stored.

/// One reading of K rows: undone in groups of `group` (0: as stored), in heads of `head` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub group: usize,
    pub head: usize,
}

/// The smallest mean advance by which the winner must lead every reading of another group, and
/// how many standard errors that lead must be (measured on real Gemma 3 and tiny models: true
/// readings lead by 0.13-0.39 at 4-15 standard errors; keys without a mean by at most 0.08, 1.5).
const LEAD: f64 = 0.08;
const LEAD_SE: f64 = 3.0;
/// Consecutive cell pairs a record's sample must have for its advances to count.
const MIN_STEPS: usize = 4;

/// The largest power of two dividing `n`.
fn pow2(n: usize) -> usize {
    n & n.wrapping_neg()
}

/// The readings llama.cpp's rule allows for rows of `widths` values whose K may be undone in
/// `groups`: as stored, or undone in a group `g` with heads `d` of which `g` is the largest power
/// of two dividing `d` (both dividing every width); heads are multiples of 64.
pub fn readings(widths: &[u64], groups: &[usize]) -> Vec<Reading> {
    let Some(&w) = widths.iter().min() else {
        return vec![];
    };
    let heads: Vec<usize> = (1..=w as usize / 64)
        .map(|k| 64 * k)
        .filter(|&d| widths.iter().all(|&n| n as usize % d == 0))
        .collect();
    let mut out: Vec<Reading> = heads
        .iter()
        .map(|&head| Reading { group: 0, head })
        .collect();
    for &g in groups {
        out.extend(
            heads
                .iter()
                .filter(|&&d| pow2(d) == g)
                .map(|&head| Reading { group: g, head }),
        );
    }
    out
}

/// Running sums of the normalised advances of one reading.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Advances {
    sum: f64,
    sum_sq: f64,
    n: usize,
}

impl Advances {
    pub fn add(&mut self, o: &Advances) {
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
        self.n += o.n;
    }

    fn mean(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }

    /// The standard error of the mean.
    fn se(&self) -> f64 {
        if self.n < 2 {
            return f64::INFINITY;
        }
        let n = self.n as f64;
        let var = (self.sum_sq / n - self.mean().powi(2)).max(0.0);
        (var / (n - 1.0)).sqrt()
    }
}

/// The advances of the first `max(1, head / 16)` pairs of every head of `rows` (cells of `width`
/// values, read in the reading's basis), over the consecutive cells one position apart.
pub fn advances(rows: &[f32], width: usize, pos: &[i32], head: usize) -> Advances {
    let mut out = Advances::default();
    let cells = rows.len().checked_div(width).unwrap_or(0).min(pos.len());
    if head < 2 || width % head != 0 {
        return out;
    }
    let steps: Vec<usize> = (1..cells)
        .filter(|&t| pos[t].checked_sub(pos[t - 1]) == Some(1))
        .collect();
    if steps.len() < MIN_STEPS {
        return out;
    }
    let half = head / 2;
    let pairs = (head / 16).max(1);
    // per pair (head h, pair i): the sums of Im(z_(t+1) conj(z_t)) and |z_(t+1)| |z_t|
    let n = width / head * pairs;
    let (mut im, mut mag) = (vec![0f64; n], vec![0f64; n]);
    for &t in &steps {
        let (r0, r1) = (
            &rows[(t - 1) * width..t * width],
            &rows[t * width..(t + 1) * width],
        );
        for h in 0..width / head {
            for i in 0..pairs {
                let (ca, cb) = (h * head + i, h * head + i + half);
                let (a0, b0, a1, b1) = (r0[ca] as f64, r0[cb] as f64, r1[ca] as f64, r1[cb] as f64);
                let k = h * pairs + i;
                im[k] += b1 * a0 - a1 * b0;
                mag[k] += ((a0 * a0 + b0 * b0) * (a1 * a1 + b1 * b1)).sqrt();
            }
        }
    }
    for (&im, &mag) in im.iter().zip(&mag) {
        if mag > 0.0 && mag.is_finite() && im.is_finite() {
            let c = im / mag;
            out.sum += c;
            out.sum_sq += c * c;
            out.n += 1;
        }
    }
    out
}

/// What the advances say: the reading that leads every reading of another group clearly (None:
/// none does), and the measurements as text.
pub fn judge(readings: &[Reading], sums: &[Advances]) -> (Option<Reading>, String) {
    let mut order: Vec<usize> = (0..readings.len()).filter(|&i| sums[i].n > 0).collect();
    order.sort_by(|&a, &b| sums[b].mean().total_cmp(&sums[a].mean()));
    let name = |r: &Reading| match r.group {
        0 => format!("as stored in heads of {}", r.head),
        g => format!("groups of {g}, heads of {}", r.head),
    };
    let text = {
        let shown: Vec<String> = order
            .iter()
            .take(3)
            .map(|&i| format!("{:+.3} {}", sums[i].mean(), name(&readings[i])))
            .collect();
        format!("RoPE pairs advance {}", shown.join(", "))
    };
    let Some(&best) = order.first() else {
        return (
            None,
            "RoPE pairs: too few consecutive cells to measure".into(),
        );
    };
    let b = &sums[best];
    let clear = match order
        .iter()
        .find(|&&i| readings[i].group != readings[best].group)
    {
        Some(&next) => {
            let o = &sums[next];
            let lead = b.mean() - o.mean();
            lead >= LEAD && lead >= LEAD_SE * b.se().hypot(o.se())
        }
        None => b.mean() >= LEAD && b.mean() >= LEAD_SE * b.se(),
    };
    (clear.then_some(readings[best]), text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::rotation::hadamard_groups;

    #[test]
    fn readings_follow_the_rule() {
        let r = readings(&[256], &[64, 128, 256]);
        let got: Vec<(usize, usize)> = r.iter().map(|r| (r.group, r.head)).collect();
        assert_eq!(
            got,
            vec![
                (0, 64),
                (0, 128),
                (0, 256),
                (64, 64),
                (128, 128),
                (256, 256)
            ]
        );
        let r = readings(&[576], &[64]);
        let got: Vec<(usize, usize)> = r.iter().map(|r| (r.group, r.head)).collect();
        assert_eq!(
            got,
            vec![(0, 64), (0, 192), (0, 576), (64, 64), (64, 192), (64, 576)]
        );
        assert!(readings(&[], &[64]).is_empty());
        assert_eq!(pow2(384), 128);
    }

    /// Keys of `heads` heads of `d` with a mean per head, NEOX-roped at positions 0.., as
    /// llama.cpp computes them (base 10000).
    fn roped(cells: usize, heads: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut rnd = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        let mean: Vec<f64> = (0..heads * d).map(|_| rnd() * 2.0).collect();
        let mut out = vec![0f32; cells * heads * d];
        for p in 0..cells {
            for h in 0..heads {
                for i in 0..d / 2 {
                    let theta = p as f64 * 10000f64.powf(-2.0 * i as f64 / d as f64);
                    let a = mean[h * d + i] + rnd() * 0.5;
                    let b = mean[h * d + i + d / 2] + rnd() * 0.5;
                    let row = &mut out[p * heads * d + h * d..];
                    row[i] = (a * theta.cos() - b * theta.sin()) as f32;
                    row[i + d / 2] = (a * theta.sin() + b * theta.cos()) as f32;
                }
            }
        }
        out
    }

    fn verdict(stored: &[f32], width: usize, groups: &[usize]) -> Option<Reading> {
        let pos: Vec<i32> = (0..(stored.len() / width) as i32).collect();
        let rs = readings(&[width as u64], groups);
        let sums: Vec<Advances> = rs
            .iter()
            .map(|r| {
                let mut x = stored.to_vec();
                hadamard_groups(&mut x, r.group);
                advances(&x, width, &pos, r.head)
            })
            .collect();
        judge(&rs, &sums).0
    }

    #[test]
    fn the_true_reading_leads_when_keys_have_a_mean() {
        for (heads, d) in [(1usize, 256usize), (2, 128), (4, 64), (2, 192)] {
            let w = heads * d;
            let keys = roped(32, heads, d, 7 + d as u64);
            let g = pow2(d);
            let mut stored = keys.clone();
            hadamard_groups(&mut stored, g);
            let groups: Vec<usize> = [64usize, 128, 256, 512]
                .into_iter()
                .filter(|g| w % g == 0)
                .collect();
            assert_eq!(
                verdict(&stored, w, &groups),
                Some(Reading { group: g, head: d }),
                "{heads} x {d}"
            );
            // not rotated: as stored, in heads of d
            assert_eq!(
                verdict(&keys, w, &groups),
                Some(Reading { group: 0, head: d })
            );
        }
    }

    #[test]
    fn keys_without_a_mean_or_cells_tell_nothing() {
        let mut s = 1u64;
        let noise: Vec<f32> = (0..32 * 256)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((s >> 40) as f32 / (1u32 << 24) as f32) - 0.5
            })
            .collect();
        assert_eq!(verdict(&noise, 256, &[64, 128, 256]), None);
        // positions not one apart: no step counts
        let keys = roped(32, 1, 256, 3);
        let pos: Vec<i32> = (0..32).map(|p| 2 * p).collect();
        assert_eq!(advances(&keys, 256, &pos, 256).n, 0);
        let (r, text) = judge(&[Reading { group: 0, head: 64 }], &[Advances::default()]);
        assert_eq!(r, None);
        assert!(text.contains("too few"));
    }
}
