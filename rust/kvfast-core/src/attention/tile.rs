//! The kernel: one tile of queries (every query head of one KV head's group x a block of query
//! rows) against the keys of that KV head, as FlashAttention and llama.cpp's CPU flash attention
//! tile it. The logits of a block of key columns come from one f32 matrix product (the `gemm`
//! crate), then each row's visible columns are scaled (and soft-capped) and exponentiated against
//! the row's running maximum, its sums kept in f64 and rescaled when the maximum grows (the online
//! softmax). Only this tile's exponentials are held (rows x the columns the tile sees); a row's
//! weights are handed out as pieces of them with one factor per block of columns,
//! `exp(m_block - m_row) / sum` (f64: a row's weights sum to 1 in f64), so no weight matrix is
//! formed. Each row's entropy comes from the same running sums (`sum e * (x - m)`), without a
//! logarithm per weight. Blocks of columns start at multiples of [`COLS`] and every product has
//! at least two rows, so each product takes the same path of the GEMM and a row's numbers do not
//! depend on the tile it is in (a dense array of some rows equals the table of all).

use std::ops::Range;

#[cfg(doc)]
use crate::attention::keys::Keys;
use crate::attention::keys::COLS;
use crate::attention::params::LayerAttn;
use crate::attention::request::Queries;
use crate::attention::simd::{exp_sums, scale_max};

/// Columns `a..b` of a row of every stream's cells (a stream's cell `c` is column
/// `starts[stream] + c`) that a query sees, in order.
pub type Run = (u32, u32);

/// Bytes of every thread's tile of logits together (rows x the columns each sees): each thread's
/// share, at most 8 MiB (at least 1 MiB), chooses the rows of a tile; more rows make the matrix
/// products faster (64 rows a product run about 1.3 times faster than 16).
pub const TILES_BYTES: usize = 16 << 20;

/// The query heads of one KV head, and its keys.
pub struct Group<'a> {
    pub attn: &'a LayerAttn,
    /// The query heads (model head indices) that read this KV head.
    pub heads: &'a [usize],
    /// The KV head's keys, `head_dim` f32 values per column (every stream's cells in a row),
    /// zeros after the last up to a whole block of [`COLS`] (see [`Keys::head`]).
    pub keys: &'a [f32],
    /// Where the layer's query heads lie in a query row.
    pub offset: usize,
}

/// Buffers a thread reuses from tile to tile.
#[derive(Default)]
pub struct Scratch {
    a: Vec<f32>,
    strip: Vec<f32>,
    m_block: Vec<f32>,
    factors: Vec<f64>,
    segs: Vec<Vec<Range<usize>>>,
    cursor: Vec<usize>,
}

/// One (head, query) row's weights, handed out once its softmax is known.
pub struct Row<'a> {
    /// The columns the query sees.
    pub runs: &'a [Run],
    strip: &'a [f32],
    first: usize,
    /// The block of columns `factors[0]` is of (blocks of [`COLS`] columns from column 0).
    b0: usize,
    factors: &'a [f64],
    /// The entropy (nats) of its weights.
    pub entropy: f64,
    /// How many cells it sees.
    pub cells: u32,
}

impl Row<'_> {
    /// Each piece of the row's weights: `f(first column, e, factor)`, the weight of column
    /// `first + i` being `e[i] * factor`; pieces in column order.
    #[inline]
    pub fn pieces(&self, mut f: impl FnMut(usize, &[f32], f64)) {
        for &(a, b) in self.runs {
            let (mut a, b) = (a as usize, b as usize);
            while a < b {
                let blk = a / COLS;
                let end = b.min((blk + 1) * COLS);
                f(
                    a,
                    &self.strip[a - self.first..end - self.first],
                    self.factors[blk - self.b0],
                );
                a = end;
            }
        }
    }

    /// The weight of every column seen, in column order, into `out` (f64).
    pub fn weights(&self, out: &mut Vec<f64>) {
        out.clear();
        self.pieces(|_, e, f| out.extend(e.iter().map(|x| f64::from(*x) * f)));
    }
}

/// The columns any of `runs` covers, first to last (None: none).
pub fn hull(runs: &[&[Run]]) -> Option<Range<usize>> {
    let a = runs.iter().filter_map(|r| r.first()).map(|r| r.0).min()?;
    let b = runs.iter().filter_map(|r| r.last()).map(|r| r.1).max()?;
    Some(a as usize..b as usize)
}

/// How many query rows a tile of `heads` heads over `cols` columns takes (at most `chunk`), with
/// `threads` threads computing tiles at once.
pub fn rows_per_tile(heads: usize, cols: usize, chunk: usize, threads: usize) -> usize {
    let bytes = (TILES_BYTES / threads.max(1)).clamp(1 << 20, 8 << 20);
    (bytes / (4 * heads.max(1) * (cols + 2 * COLS)))
        .clamp(1, 256)
        .min(chunk.max(1))
}

/// Compute one tile: query rows `rows` (indices into `q`), each seeing the columns `runs[i]`
/// (none: the row is left out), for every head of `g`; `emit(head index in g.heads, i, row)` for
/// each row that sees a cell, heads outer.
pub fn tile(
    g: &Group,
    q: &Queries,
    rows: &[usize],
    runs: &[&[Run]],
    s: &mut Scratch,
    mut emit: impl FnMut(usize, usize, &Row),
) {
    let Some(hull) = hull(runs) else {
        return;
    };
    let d = g.attn.head_dim;
    let (nr, nh) = (rows.len(), g.heads.len());
    let m = nr * nh;
    // whole blocks of COLS columns from column 0, and at least two rows: every product takes the
    // same path of the GEMM, so a row's numbers do not depend on its tile
    let b0 = hull.start / COLS;
    let nb = (hull.end - 1) / COLS + 1 - b0;
    let (first, width) = (b0 * COLS, nb * COLS);
    let mp = m.max(2);
    // the queries, [head, row, d]
    s.a.clear();
    for &h in g.heads {
        for &r in rows {
            let o = r * q.row_len + g.offset + h * d;
            s.a.extend_from_slice(&q.values[o..o + d]);
        }
    }
    s.a.resize(mp * d, 0.0);
    if s.strip.len() < mp * width {
        s.strip.resize(mp * width, 0.0); // every value read is written first: never cleared
    }
    s.m_block.clear();
    s.m_block.resize(m * nb, f32::NEG_INFINITY);
    // per row: running max, sum (with the sink), sum over cells, sum of e * (x - max)
    let mut st: Vec<(f32, f64, f64, f64)> = g
        .heads
        .iter()
        .flat_map(|&h| {
            let sink = g.attn.sinks.as_ref().map(|s| s[h] as f32);
            let init = sink.map_or((f32::NEG_INFINITY, 0.0, 0.0, 0.0), |v| (v, 1.0, 0.0, 0.0));
            std::iter::repeat_n(init, nr)
        })
        .collect();
    s.segs.resize_with(nr, Vec::new);
    s.cursor.clear();
    s.cursor.resize(nr, 0);
    let (scale, cap) = (g.attn.scale as f32, g.attn.softcap.map(|c| c as f32));
    for b in 0..nb {
        let c0 = ((b0 + b) * COLS).max(hull.start);
        let c1 = ((b0 + b + 1) * COLS).min(hull.end);
        // the visible pieces of each row in this block
        let mut any = false;
        for (i, rr) in runs.iter().enumerate() {
            let segs = &mut s.segs[i];
            segs.clear();
            let k = &mut s.cursor[i];
            while *k < rr.len() && (rr[*k].1 as usize) <= c0 {
                *k += 1;
            }
            for &(a, e) in &rr[*k..] {
                if a as usize >= c1 {
                    break;
                }
                segs.push((a as usize).max(c0) - first..(e as usize).min(c1) - first);
            }
            any |= !segs.is_empty();
        }
        if !any {
            continue;
        }
        // SAFETY: `a` holds mp rows of d values, the keys hold whole blocks of COLS columns of d
        // values each (see `Group`), and the strip mp rows of `width` values, of which this
        // product writes the block's COLS columns.
        unsafe {
            gemm::gemm(
                mp,
                COLS,
                d,
                s.strip.as_mut_ptr().add(b * COLS),
                1,
                width as isize,
                false,
                s.a.as_ptr(),
                1,
                d as isize,
                g.keys.as_ptr().add((b0 + b) * COLS * d),
                d as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        for (row, (mx, l, lc, u)) in st.iter_mut().enumerate() {
            let segs = &s.segs[row % nr];
            if segs.is_empty() {
                s.m_block[row * nb + b] = *mx;
                continue;
            }
            let x = &mut s.strip[row * width..(row + 1) * width];
            let mut bm = f32::NEG_INFINITY;
            for sg in segs {
                bm = bm.max(scale_max(&mut x[sg.clone()], scale, cap));
            }
            if bm > *mx {
                if *mx > f32::NEG_INFINITY {
                    let dm = f64::from(*mx) - f64::from(bm);
                    let f = dm.exp();
                    *u = f * (*u + *lc * dm);
                    *l *= f;
                    *lc *= f;
                }
                *mx = bm;
            }
            for sg in segs {
                let (se, te) = exp_sums(&mut x[sg.clone()], *mx);
                *l += se;
                *lc += se;
                *u += te;
            }
            s.m_block[row * nb + b] = *mx;
        }
    }
    for (row, &(mx, l, lc, u)) in st.iter().enumerate() {
        let (hh, i) = (row / nr, row % nr);
        if runs[i].is_empty() {
            continue;
        }
        s.factors.clear();
        s.factors.extend(
            s.m_block[row * nb..(row + 1) * nb]
                .iter()
                .map(|mb| (f64::from(*mb) - f64::from(mx)).exp() / l),
        );
        let plogp = u / l - l.ln() * lc / l;
        let r = Row {
            runs: runs[i],
            strip: &s.strip[row * width..(row + 1) * width],
            first,
            b0,
            factors: &s.factors,
            entropy: if plogp < 0.0 { -plogp } else { 0.0 },
            cells: runs[i].iter().map(|(a, b)| b - a).sum(),
        };
        emit(hh, i, &r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::params::Window;

    /// Each row's weights and entropy from a tile, against f64 (head `h` of the group reads row
    /// `r`'s values at `h * d`).
    #[test]
    fn a_tile_gives_each_row_the_softmax_of_its_cells_capped_with_a_sink() {
        let d = 4;
        let n = 300; // two blocks of columns, the second partial
        let mut keys: Vec<f32> = (0..n * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        keys.resize(COLS * 2 * d, 0.0);
        let values: Vec<f32> = (0..3 * 2 * d)
            .map(|i| (i as f32 * 0.7).sin() * 3.0)
            .collect();
        let attn = LayerAttn {
            model_layer: 0,
            n_head: 2,
            n_head_kv: 1,
            head_dim: d,
            scale: 0.5,
            softcap: Some(4.0),
            window: Window::None,
            sinks: Some(vec![0.0, 1.5]),
        };
        let q = Queries {
            values: &values,
            row_len: 2 * d,
            pos: &[0, 0, 0],
            seq: &[0, 0, 0],
            blocks: &[],
        };
        let g = Group {
            attn: &attn,
            heads: &[0, 1],
            keys: &keys,
            offset: 0,
        };
        let runs: [&[Run]; 3] = [&[(0, 300)], &[], &[(5, 9), (250, 270)]];
        let mut got = vec![];
        let mut s = Scratch::default();
        tile(&g, &q, &[0, 1, 2], &runs, &mut s, |hh, i, row| {
            let mut w = vec![];
            row.weights(&mut w);
            got.push((hh, i, w, row.entropy, row.cells));
        });
        assert_eq!(got.len(), 4); // row 1 sees nothing
        for (hh, i, w, h, cells) in &got {
            let qv = &values[i * 2 * d + hh * d..][..d];
            let cols: Vec<usize> = runs[*i]
                .iter()
                .flat_map(|(a, b)| *a as usize..*b as usize)
                .collect();
            let lg: Vec<f64> = cols
                .iter()
                .map(|c| {
                    let dot: f64 = (0..d)
                        .map(|k| f64::from(qv[k]) * f64::from(keys[c * d + k]))
                        .sum();
                    4.0 * (0.5 * dot / 4.0).tanh()
                })
                .collect();
            let sink = [0.0, 1.5][*hh];
            let m = lg.iter().copied().fold(sink, f64::max);
            let den: f64 = lg.iter().map(|x| (x - m).exp()).sum::<f64>() + (sink - m).exp();
            let want: Vec<f64> = lg.iter().map(|x| (x - m).exp() / den).collect();
            assert_eq!(*cells as usize, cols.len());
            for (a, b) in w.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * b + 1e-12, "{a} {b}");
            }
            let hw: f64 = -want.iter().map(|x| x * x.ln()).sum::<f64>();
            assert!((h - hw).abs() < 1e-5 * hw, "{h} {hw}");
        }
        // the same row alone in its tile: the same numbers
        tile(&g, &q, &[2], &runs[2..], &mut s, |hh, _, row| {
            let mut w = vec![];
            row.weights(&mut w);
            let first = got.iter().find(|x| x.0 == hh && x.1 == 2).unwrap();
            assert_eq!(w, first.2);
        });
    }
}
