//! A pass of attention over an opened state: each query's weights over the cells it may see in
//! each attention layer, handed out as a table or reduced without keeping them.
//!
//! Layers are taken one at a time, and in a layer one KV head at a time: its keys (every stream of
//! the cache) are decoded into f32 in the model's basis, then tiles of queries (the query heads
//! of that KV head x a block of query rows) run in parallel through the kernel ([`super::tile`]),
//! each row's weights reduced as the tile hands them out. Memory: one KV head's keys, a tile's
//! logits per thread, the rows handed out, and (for the mass per cell) one heads x cells
//! accumulator per thread.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::attention::kernel::{top_k, Seen};
use crate::attention::keys::Keys;
use crate::attention::request::{Reduce, Request, Task};
use crate::attention::seen::{self, positions, Cells};
use crate::attention::simd::add_scaled;
use crate::attention::tile::{hull, rows_per_tile, tile, Group, Run, Scratch};
use crate::attention::AttnError;
use crate::plan::columns::{Table, Values};

/// The output columns of a pass (those of its reduction filled).
#[derive(Default)]
struct Rows {
    cache: Vec<u8>,
    stream: Vec<u8>,
    layer: Vec<u16>,
    model_layer: Vec<u16>,
    head: Vec<u16>,
    query_pos: Vec<i32>,
    seq: Vec<u8>,
    rank: Vec<u16>,
    cell: Vec<u32>,
    pos: Vec<i32>,
    weight: Vec<f64>,
    cells: Vec<u32>,
    queries: Vec<u32>,
}

impl Rows {
    fn append(&mut self, mut o: Rows) {
        self.cache.append(&mut o.cache);
        self.stream.append(&mut o.stream);
        self.layer.append(&mut o.layer);
        self.model_layer.append(&mut o.model_layer);
        self.head.append(&mut o.head);
        self.query_pos.append(&mut o.query_pos);
        self.seq.append(&mut o.seq);
        self.rank.append(&mut o.rank);
        self.cell.append(&mut o.cell);
        self.pos.append(&mut o.pos);
        self.weight.append(&mut o.weight);
        self.cells.append(&mut o.cells);
        self.queries.append(&mut o.queries);
    }

    fn key(&mut self, t: &Task, head: usize, n: usize) {
        self.cache.extend(std::iter::repeat_n(t.cache as u8, n));
        self.layer.extend(std::iter::repeat_n(t.layer as u16, n));
        self.model_layer
            .extend(std::iter::repeat_n(t.attn.model_layer as u16, n));
        self.head.extend(std::iter::repeat_n(head as u16, n));
    }

    fn table(self, what: Reduce) -> Table {
        let mut t = Table::default();
        t.push("cache", Values::U8(self.cache));
        if !matches!(what, Reduce::Entropy) {
            t.push("stream", Values::U8(self.stream));
        }
        t.push("layer", Values::U16(self.layer));
        t.push("model_layer", Values::U16(self.model_layer));
        t.push("head", Values::U16(self.head));
        if !matches!(what, Reduce::Mass) {
            t.push("query_pos", Values::I32(self.query_pos));
            t.push("seq_id", Values::U8(self.seq));
        }
        match what {
            Reduce::Weights | Reduce::TopK(_) => {
                if matches!(what, Reduce::TopK(_)) {
                    t.push("rank", Values::U16(self.rank));
                }
                t.push("cell", Values::U32(self.cell));
                t.push("pos", Values::I32(self.pos));
                t.push("weight", Values::F64(self.weight));
            }
            Reduce::Mass => {
                t.push("cell", Values::U32(self.cell));
                t.push("pos", Values::I32(self.pos));
                t.push("mass", Values::F64(self.weight));
                t.push("queries", Values::U32(self.queries));
            }
            Reduce::Entropy => {
                t.push("entropy", Values::F64(self.weight));
                t.push("cells", Values::U32(self.cells));
            }
        }
        t
    }
}

/// A query head's rows of the cells `ix` (indices into its `cells` and weights `w`), with their
/// rank where `rank`.
#[allow(clippy::too_many_arguments)]
fn emit(
    rows: &mut Rows,
    t: &Task,
    keys: &Keys,
    (h, p1, sq): (usize, i32, u8),
    cells: &[Seen],
    w: &[f64],
    ix: &[usize],
    rank: bool,
) {
    rows.key(t, h, ix.len());
    rows.query_pos.extend(std::iter::repeat_n(p1, ix.len()));
    rows.seq.extend(std::iter::repeat_n(sq, ix.len()));
    for (k, &j) in ix.iter().enumerate() {
        let (s, c) = cells[j];
        rows.stream.push(keys.streams[s as usize].index as u8);
        rows.cell.push(c);
        rows.pos.push(keys.streams[s as usize].pos[c as usize]);
        rows.weight.push(w[j]);
        if rank {
            rows.rank.push(k as u16);
        }
    }
}

/// The cells of `runs` (columns of `cells`), in order, into `out`.
pub(super) fn expand(runs: &[Run], cells: &Cells, out: &mut Vec<Seen>) {
    out.clear();
    for &(a, b) in runs {
        out.extend_from_slice(&cells.cols[a as usize..b as usize]);
    }
}

/// What a thread of a KV head's pass gathers: per reduction and head of the group its rows, the
/// mass per head and column, and its buffers.
struct Part {
    rows: Vec<Vec<Rows>>,
    mass: Vec<f64>,
    scratch: Scratch,
    w: Vec<f64>,
    cells: Vec<Seen>,
}

impl Part {
    fn merge(mut self, o: Part) -> Part {
        for (a, b) in self.rows.iter_mut().zip(o.rows) {
            for (x, y) in a.iter_mut().zip(b) {
                x.append(y);
            }
        }
        if self.mass.is_empty() {
            self.mass = o.mass;
        } else {
            for (x, y) in self.mass.iter_mut().zip(&o.mass) {
                *x += y;
            }
        }
        self
    }
}

/// One task's tables, a KV head at a time: its keys decoded, then tiles of queries in parallel,
/// each head's weights computed once for every reduction of `whats`.
fn layer(
    req: &Request,
    t: &Task,
    keys: &Keys,
    held: &HashMap<i32, Vec<i32>>,
    whats: &[Reduce],
) -> Result<Vec<Rows>, AttnError> {
    let q = &req.queries;
    let cells = Cells::new(req, &keys.streams);
    let runs = seen::all(req, t, &cells, held)?;
    let n_cols = cells.cols.len();
    let want_mass = whats.contains(&Reduce::Mass);
    let nh = t.heads.len();
    let mut per_head: Vec<Vec<Rows>> = whats
        .iter()
        .map(|_| (0..nh).map(|_| Rows::default()).collect())
        .collect();
    let mut mass = vec![0f64; if want_mass { nh * n_cols } else { 0 }];
    let mut kv = vec![];
    for g in 0..t.attn.n_head_kv {
        let his: Vec<usize> = (0..nh)
            .filter(|hi| t.attn.kv_head(t.heads[*hi]) == g)
            .collect();
        if his.is_empty() {
            continue;
        }
        let heads: Vec<usize> = his.iter().map(|hi| t.heads[*hi]).collect();
        keys.head(g, t.attn.head_dim, &mut kv);
        let group = Group {
            attn: t.attn,
            heads: &heads,
            keys: &kv,
            offset: t.block.offset,
        };
        let per = rows_per_tile(heads.len(), n_cols, req.chunk, rayon::current_num_threads());
        let n = q.pos.len();
        let tiles: Vec<_> = (0..n).step_by(per).map(|a| a..(a + per).min(n)).collect();
        let width = if want_mass { heads.len() * n_cols } else { 0 };
        let empty = || Part {
            rows: whats
                .iter()
                .map(|_| heads.iter().map(|_| Rows::default()).collect())
                .collect(),
            mass: vec![],
            scratch: Scratch::default(),
            w: vec![],
            cells: vec![],
        };
        let part = tiles
            .into_par_iter()
            .fold(empty, |mut p, range| {
                let rows: Vec<usize> = range.collect();
                let rr: Vec<&[Run]> = rows.iter().map(|r| runs[*r].as_slice()).collect();
                if hull(&rr).is_none() {
                    return p;
                }
                if want_mass {
                    p.mass.resize(width, 0.0);
                }
                let Part {
                    rows: out,
                    mass: acc,
                    scratch,
                    w,
                    cells: seen_cells,
                    ..
                } = &mut p;
                tile(&group, q, &rows, &rr, scratch, |hh, i, row| {
                    let (h, r) = (heads[hh], rows[i]);
                    let (p1, sq) = (q.pos[r], q.seq[r] as u8);
                    for (k, what) in whats.iter().enumerate() {
                        let o = &mut out[k][hh];
                        match *what {
                            Reduce::Weights => {
                                row.weights(w);
                                expand(row.runs, &cells, seen_cells);
                                let ix: Vec<usize> = (0..w.len()).collect();
                                emit(o, t, keys, (h, p1, sq), seen_cells, w, &ix, false);
                            }
                            Reduce::TopK(k) => {
                                row.weights(w);
                                expand(row.runs, &cells, seen_cells);
                                let ix = top_k(w, k);
                                emit(o, t, keys, (h, p1, sq), seen_cells, w, &ix, true);
                            }
                            Reduce::Entropy => {
                                o.key(t, h, 1);
                                o.query_pos.push(p1);
                                o.seq.push(sq);
                                o.weight.push(row.entropy);
                                o.cells.push(row.cells);
                            }
                            Reduce::Mass => {
                                let acc = &mut acc[hh * n_cols..(hh + 1) * n_cols];
                                row.pieces(|c, e, f| add_scaled(&mut acc[c..c + e.len()], e, f));
                            }
                        }
                    }
                });
                p
            })
            .reduce(empty, Part::merge);
        for (k, rows) in part.rows.into_iter().enumerate() {
            for (hh, r) in rows.into_iter().enumerate() {
                per_head[k][his[hh]] = r;
            }
        }
        for (hh, &hi) in his.iter().enumerate() {
            if let Some(m) = part.mass.get(hh * n_cols..(hh + 1) * n_cols) {
                mass[hi * n_cols..(hi + 1) * n_cols].copy_from_slice(m);
            }
        }
    }
    let mut out = vec![];
    for (what, heads) in whats.iter().zip(per_head) {
        if *what == Reduce::Mass {
            out.push(mass_rows(t, keys, &cells, &runs, &mass));
            continue;
        }
        let mut all = Rows::default();
        for r in heads {
            all.append(r);
        }
        out.push(all);
    }
    Ok(out)
}

/// A task's mass rows from its sums per head and column: a row per cell some query saw, with
/// how many saw it.
fn mass_rows(t: &Task, keys: &Keys, cells: &Cells, runs: &[Vec<Run>], mass: &[f64]) -> Rows {
    let n_cols = cells.cols.len();
    let mut count = vec![0i64; n_cols + 1];
    for &(a, b) in runs.iter().flatten() {
        count[a as usize] += 1;
        count[b as usize] -= 1;
    }
    let mut k = 0;
    let seen: Vec<u32> = count[..n_cols]
        .iter()
        .map(|c| {
            k += c;
            k as u32
        })
        .collect();
    let mut m = Rows::default();
    for (hi, &h) in t.heads.iter().enumerate() {
        for (col, &(si, c)) in cells.cols.iter().enumerate() {
            if seen[col] == 0 {
                continue;
            }
            let s = keys.streams[si as usize];
            m.key(t, h, 1);
            m.stream.push(s.index as u8);
            m.cell.push(c);
            m.pos.push(cells.pos[col]);
            m.weight.push(mass[hi * n_cols + col]);
            m.queries.push(seen[col]);
        }
    }
    m
}

/// Run a pass: one table per computed cache layer, in cache and layer order (a pass of nothing
/// to compute gives one table of no rows).
pub fn run(req: &Request, what: Reduce) -> Result<Vec<Table>, AttnError> {
    let mut out = run_many(req, &[what])?;
    Ok(out.pop().unwrap_or_default())
}

/// Run one pass for several reductions: for each of `whats` (in order) the tables of [`run`],
/// each query head's weights computed once for all of them.
pub fn run_many(req: &Request, whats: &[Reduce]) -> Result<Vec<Vec<Table>>, AttnError> {
    req.check()?;
    let tasks = req.tasks()?;
    let held = positions(req.opened);
    let mut out: Vec<Vec<Table>> = whats.iter().map(|_| vec![]).collect();
    for t in &tasks {
        let keys = req.keys(t)?;
        let rows = crate::parallel::install(|| layer(req, t, &keys, &held, whats))?;
        for ((tables, what), rows) in out.iter_mut().zip(whats).zip(rows) {
            tables.push(rows.table(*what));
        }
    }
    for (tables, what) in out.iter_mut().zip(whats) {
        if tables.is_empty() {
            tables.push(Rows::default().table(*what));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::request::{Block, Incomplete, Queries};
    use crate::testing::tiny_qwen3_attention as opened;

    #[test]
    fn a_zero_query_spreads_its_weight_evenly_over_the_cells_it_sees() {
        let (op, layers) = opened();
        let blocks = [Block {
            model_layer: 1,
            offset: 0,
            n_head: 4,
            head_dim: 32,
        }];
        let values = vec![0f32; 3 * 128];
        let req = Request {
            opened: &op,
            layers: &layers,
            queries: Queries {
                values: &values,
                row_len: 128,
                pos: &[0, 3, 6],
                seq: &[0, 0, 0],
                blocks: &blocks,
            },
            model_layers: None,
            heads: Some(&[2]),
            incomplete: Incomplete::Error,
            chunk: 2,
        };
        let w = &run(&req, Reduce::Weights).unwrap()[0];
        assert_eq!(w.rows(), 1 + 4 + 7);
        let weight = w.columns.iter().find(|c| c.name == "weight").unwrap();
        let Values::F64(ws) = &weight.values else {
            panic!()
        };
        assert_eq!(ws[0], 1.0);
        assert!(ws[1..5].iter().all(|x| (x - 0.25).abs() < 1e-15));
        let m = &run(&req, Reduce::Mass).unwrap()[0];
        let mass = m.columns.iter().find(|c| c.name == "mass").unwrap();
        let Values::F64(ms) = &mass.values else {
            panic!()
        };
        let want = 1.0 + 0.25 + 1.0 / 7.0; // cell 0: seen by all three queries (f32 weights)
        assert!((ms[0] - want).abs() < 1e-7 && ms.len() == 7);
        // a query of a sequence the state does not hold: refused, or left out
        let req = Request {
            queries: Queries {
                seq: &[0, 0, 4],
                ..req.queries
            },
            ..req
        };
        assert!(matches!(
            run(&req, Reduce::Entropy),
            Err(AttnError::Incomplete(_))
        ));
        let skip = Request {
            incomplete: Incomplete::Skip,
            ..req
        };
        assert_eq!(run(&skip, Reduce::Entropy).unwrap()[0].rows(), 2);
    }

    #[test]
    fn one_pass_of_several_reductions_equals_a_pass_of_each() {
        let (op, layers) = opened();
        let blocks = [Block {
            model_layer: 0,
            offset: 0,
            n_head: 4,
            head_dim: 32,
        }];
        // queries at every position, values of no pattern (a fixed LCG)
        let mut x = 12345u32;
        let values: Vec<f32> = (0..7 * 128)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 8) as f32 / (1 << 24) as f32 - 0.5
            })
            .collect();
        let req = Request {
            opened: &op,
            layers: &layers,
            queries: Queries {
                values: &values,
                row_len: 128,
                pos: &[0, 1, 2, 3, 4, 5, 6],
                seq: &[0; 7],
                blocks: &blocks,
            },
            model_layers: None,
            heads: None,
            incomplete: Incomplete::Error,
            chunk: 64, // one chunk: the same sums in the same order
        };
        let whats = [
            Reduce::Mass,
            Reduce::TopK(3),
            Reduce::Entropy,
            Reduce::Weights,
        ];
        let many = run_many(&req, &whats).unwrap();
        assert_eq!(many.len(), whats.len());
        for (tables, what) in many.iter().zip(whats) {
            assert_eq!(*tables, run(&req, what).unwrap());
            assert!(tables[0].rows() > 0);
        }
        assert_eq!(run_many(&req, &[]).unwrap().len(), 0);
    }
}
