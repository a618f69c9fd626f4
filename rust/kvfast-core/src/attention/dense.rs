//! One model layer's attention weights as a dense array `[head, query, cell]` (float32), what
//! `output_attentions=True` gives in Hugging Face: for the queries given, over a range of the
//! cache's cells, in the memory of that array and one layer's keys.
//!
//! Each query's softmax runs over every cell it sees (the range only chooses which columns are
//! kept), exactly as [`super::pass`] computes it; a cell the query does not see (a later
//! position, another sequence, outside a sliding window) and a query left out (`incomplete`
//! skip) are NaN.

use std::collections::HashMap;
use std::ops::Range;

use rayon::prelude::*;

use crate::attention::keys::Keys;
use crate::attention::request::{Request, Task};
use crate::attention::seen::{self, positions, Cells};
use crate::attention::tile::{rows_per_tile, tile, Group, Run, Scratch};
use crate::attention::AttnError;

/// What a dense array holds, known before it is computed.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub cache: u32,
    /// The cache's layer, and the model layer it is.
    pub layer: u32,
    pub model_layer: u32,
    /// The query heads, in the order of the array's first axis.
    pub heads: Vec<u32>,
    /// How many queries (the array's second axis: the request's query rows, in order).
    pub queries: usize,
    /// Per column (the third axis): the stream's index in the cache, the cell and its position.
    pub stream: Vec<u32>,
    pub cell: Vec<u32>,
    pub pos: Vec<i32>,
}

impl Shape {
    /// The number of values of the array.
    pub fn len(&self) -> usize {
        self.heads.len() * self.queries * self.cell.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A layer ready to compute: its keys decoded, its cells in a row, the columns chosen.
pub struct Prepared<'a> {
    task: Task<'a>,
    keys: Keys<'a>,
    cells: Cells,
    held: HashMap<i32, Vec<i32>>,
    /// The columns kept, as indices into a row of every stream's cells (stream then cell order).
    cols: Range<usize>,
    pub shape: Shape,
}

/// A range as a Python slice reads it: None is an end, a negative bound counts from the end, and
/// bounds past either end are clamped.
pub fn span(start: Option<i64>, stop: Option<i64>, n: usize) -> Range<usize> {
    let at = |x: i64| -> usize {
        let n = n as i64;
        (if x < 0 { (x + n).max(0) } else { x.min(n) }) as usize
    };
    let a = start.map_or(0, at);
    a..stop.map_or(n, at).max(a)
}

/// Check the request (one model layer, in `req.model_layers`), decode the layer's keys and
/// choose the columns `cols` (a [`span`] of the cache's cells of every stream, in stream then
/// cell order; None: all).
pub fn prepare<'a>(
    req: &'a Request<'a>,
    cols: Option<(Option<i64>, Option<i64>)>,
) -> Result<Prepared<'a>, AttnError> {
    req.check()?;
    let err = |message: String| AttnError::Queries {
        field: "layers",
        message,
    };
    let Some(&[ml]) = req.model_layers else {
        return Err(err("a dense array is of one model layer".into()));
    };
    let mut tasks = req.tasks()?;
    let task = match (tasks.pop(), tasks.is_empty()) {
        (Some(t), true) => t,
        _ => return Err(err(format!("model layer {ml} is in several caches"))),
    };
    let keys = req.keys(&task)?;
    let cells = Cells::new(req, &keys.streams);
    let total = cells.cols.len();
    let cols = cols.map_or(0..total, |(a, b)| span(a, b, total));
    let kept = &cells.cols[cols.clone()];
    let shape = Shape {
        cache: task.cache,
        layer: task.layer,
        model_layer: task.attn.model_layer,
        heads: task.heads.iter().map(|h| *h as u32).collect(),
        queries: req.queries.pos.len(),
        stream: kept
            .iter()
            .map(|(si, _)| keys.streams[*si as usize].index)
            .collect(),
        cell: kept.iter().map(|(_, c)| *c).collect(),
        pos: cells.pos[cols.clone()].to_vec(),
    };
    Ok(Prepared {
        held: positions(req.opened),
        task,
        keys,
        cells,
        cols,
        shape,
    })
}

/// Compute a prepared layer into `out` (`shape.len()` values, `[head, query, column]`): a KV head
/// at a time, tiles of at most `req.chunk` queries in parallel through the kernel.
pub fn fill(req: &Request, p: &Prepared, out: &mut [f32]) -> Result<(), AttnError> {
    let (nh, nq, nc) = (p.shape.heads.len(), p.shape.queries, p.shape.cell.len());
    if out.len() != nh * nq * nc {
        return Err(AttnError::Queries {
            field: "out",
            message: format!("{} values for an array of {nh} x {nq} x {nc}", out.len()),
        });
    }
    out.fill(f32::NAN);
    if out.is_empty() {
        return Ok(());
    }
    let t = &p.task;
    let total = p.cells.cols.len();
    crate::parallel::install(|| {
        let runs = seen::all(req, t, &p.cells, &p.held)?;
        // per head (of the array's first axis), its rows
        let mut per_head: Vec<Option<&mut [f32]>> = out.chunks_mut(nq * nc).map(Some).collect();
        let mut kv = vec![];
        for g in 0..t.attn.n_head_kv {
            let his: Vec<usize> = (0..nh)
                .filter(|hi| t.attn.kv_head(t.heads[*hi]) == g)
                .collect();
            if his.is_empty() {
                continue;
            }
            let heads: Vec<usize> = his.iter().map(|hi| t.heads[*hi]).collect();
            p.keys.head(g, t.attn.head_dim, &mut kv);
            let group = Group {
                attn: t.attn,
                heads: &heads,
                keys: &kv,
                offset: t.block.offset,
            };
            let per = rows_per_tile(heads.len(), total, req.chunk, rayon::current_num_threads());
            // per tile of queries, its rows of every head of the group: disjoint slices of `out`
            let mut slabs: Vec<_> = his
                .iter()
                .filter_map(|hi| per_head[*hi].take())
                .map(|h| h.chunks_mut(per * nc))
                .collect();
            let mut jobs = vec![];
            for a in (0..nq).step_by(per) {
                let s: Vec<&mut [f32]> = slabs.iter_mut().filter_map(|it| it.next()).collect();
                jobs.push((a..(a + per).min(nq), s));
            }
            jobs.into_par_iter()
                .for_each_init(Scratch::default, |s, (qs, mut slabs)| {
                    let rows: Vec<usize> = qs.clone().collect();
                    let rr: Vec<&[Run]> = rows.iter().map(|r| runs[*r].as_slice()).collect();
                    tile(&group, &req.queries, &rows, &rr, s, |hh, i, row| {
                        let o = &mut slabs[hh][i * nc..(i + 1) * nc];
                        row.pieces(|c, e, f| {
                            // the piece's columns inside the array's
                            let a = c.max(p.cols.start);
                            let b = (c + e.len()).min(p.cols.end);
                            for at in a..b {
                                o[at - p.cols.start] = (f64::from(e[at - c]) * f) as f32;
                            }
                        });
                    });
                });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::pass::run;
    use crate::attention::request::{Block, Incomplete, Queries, Reduce};
    use crate::plan::columns::Values;
    use crate::testing::tiny_qwen3_attention as opened;

    #[test]
    fn the_dense_array_holds_the_pass_weights_and_nan_where_unseen() {
        let (op, layers) = opened();
        let blocks = [Block {
            model_layer: 1,
            offset: 0,
            n_head: 4,
            head_dim: 32,
        }];
        let mut x = 7u32;
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
            model_layers: Some(&[1]),
            heads: Some(&[3, 1]),
            incomplete: Incomplete::Error,
            chunk: 3,
        };
        assert_eq!(span(Some(-2), None, 7), 5..7);
        assert_eq!(span(Some(5), Some(2), 7), 5..5);
        assert_eq!(span(None, Some(-9), 7), 0..0);
        let p = prepare(&req, Some((Some(2), Some(6)))).unwrap();
        assert_eq!(p.shape.heads, [3, 1]);
        assert_eq!(p.shape.cell, [2, 3, 4, 5]);
        let mut out = vec![0f32; p.shape.len()];
        fill(&req, &p, &mut out).unwrap();
        let table = &run(&req, Reduce::Weights).unwrap()[0];
        let col = |n: &str| &table.columns.iter().find(|c| c.name == n).unwrap().values;
        let (Values::U16(head), Values::I32(qp), Values::U32(cell), Values::F64(wt)) =
            (col("head"), col("query_pos"), col("cell"), col("weight"))
        else {
            panic!()
        };
        let mut checked = 0;
        for i in 0..wt.len() {
            let hi = if head[i] == 3 { 0 } else { 1 };
            let c = cell[i] as usize;
            if (2..6).contains(&c) {
                let v = out[(hi * 7 + qp[i] as usize) * 4 + c - 2];
                assert_eq!(v, wt[i] as f32);
                checked += 1;
            }
        }
        let seen = out.iter().filter(|v| !v.is_nan()).count();
        assert_eq!(seen, checked);
        assert_eq!(seen, 2 * (1 + 2 + 3 + 4 + 4)); // query at pos p sees cells 2..=min(p, 5)
        assert_eq!(
            prepare(&req, Some((Some(5), Some(9)))).unwrap().shape.cell,
            [5, 6]
        );
        let two = Request {
            model_layers: None,
            ..req
        };
        assert!(prepare(&two, None).is_err());
    }
}
