//! Which cells each query sees in a cache layer: the rules of llama.cpp's mask (a cell of the
//! query's sequence, at a position not after the query's, inside the layer's window), and the
//! check that the cache holds every cell the query saw in llama.cpp.

use std::collections::HashMap;

use crate::attention::kernel::Seen;
use crate::attention::request::{Incomplete, Request, Task};
use crate::attention::tile::Run;
use crate::attention::AttnError;
use crate::format::layout::Stream;
use crate::open::Opened;

/// Per sequence, every position any attention cache holds a cell of (sorted, once each): what a
/// query saw, for the check that a cache holds all of it.
pub(super) fn positions(op: &Opened) -> HashMap<i32, Vec<i32>> {
    let own = op.state.layout.own_seq();
    let mut out: HashMap<i32, Vec<i32>> = HashMap::new();
    for cache in op.state.layout.attention() {
        for s in &cache.streams {
            for c in 0..s.cell_count as usize {
                let seqs = s.cell_seqs(c);
                if seqs.is_empty() {
                    if let Some(q) = own {
                        out.entry(q).or_default().push(s.pos[c]);
                    }
                }
                for q in seqs {
                    out.entry(*q).or_default().push(s.pos[c]);
                }
            }
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    out
}

/// A cache layer's cells in a row (every stream's, in stream then cell order): each column's
/// stream and cell and position, and per sequence of the queries which columns are its.
pub(super) struct Cells {
    pub(super) cols: Vec<Seen>,
    pub(super) pos: Vec<i32>,
    mine: HashMap<i32, Vec<bool>>,
}

impl Cells {
    pub(super) fn new(req: &Request, streams: &[&Stream]) -> Cells {
        let own = req.opened.state.layout.own_seq();
        let (mut cols, mut pos) = (vec![], vec![]);
        for (si, s) in streams.iter().enumerate() {
            for c in 0..s.cell_count as usize {
                cols.push((si as u32, c as u32));
                pos.push(s.pos[c]);
            }
        }
        let mut mine = HashMap::new();
        for &sq in req.queries.seq {
            mine.entry(sq).or_insert_with(|| {
                cols.iter()
                    .map(|&(si, c)| {
                        let seqs = streams[si as usize].cell_seqs(c as usize);
                        if seqs.is_empty() {
                            own.is_none_or(|o| o == sq)
                        } else {
                            seqs.contains(&sq)
                        }
                    })
                    .collect::<Vec<bool>>()
            });
        }
        Cells { cols, pos, mine }
    }
}

/// The cells query `r` sees in a task's cache, as runs of columns of `cells`, checked against
/// what its sequence holds (`held`, see [`positions`]): Ok(false) for a query left out.
pub(super) fn seen(
    req: &Request,
    t: &Task,
    cells: &Cells,
    held: &HashMap<i32, Vec<i32>>,
    r: usize,
    out: &mut Vec<Run>,
) -> Result<bool, AttnError> {
    let (p1, sq) = (req.queries.pos[r], req.queries.seq[r]);
    let w = t.attn.window;
    out.clear();
    let mut n = 0usize;
    if let Some(mine) = cells.mine.get(&sq) {
        let mut open: Option<u32> = None;
        for (col, (&p0, &is)) in cells.pos.iter().zip(mine).enumerate() {
            let sees = is && p0 <= p1 && !w.masks(p0, p1);
            match (sees, open) {
                (true, None) => open = Some(col as u32),
                (false, Some(a)) => {
                    out.push((a, col as u32));
                    n += col - a as usize;
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(a) = open {
            out.push((a, cells.pos.len() as u32));
            n += cells.pos.len() - a as usize;
        }
    }
    let expected = held.get(&sq).map_or(0, |ps| {
        let upto = &ps[..ps.partition_point(|p0| *p0 <= p1)];
        upto.iter().filter(|p0| !w.masks(**p0, p1)).count()
    });
    if n >= expected && n > 0 {
        return Ok(true);
    }
    out.clear();
    match req.incomplete {
        Incomplete::Skip => Ok(false),
        Incomplete::Error => Err(AttnError::Incomplete(if expected == 0 {
            format!(
                "cache {} layer {} (model layer {}): the query of sequence {sq} at position {p1} \
                 sees no cell of the state",
                t.cache, t.layer, t.attn.model_layer
            )
        } else {
            format!(
                "cache {} layer {} (model layer {}): the query of sequence {sq} at position {p1} \
                 saw {expected} cells in llama.cpp, the cache holds {n} of them (a sequence save \
                 keeps only the sliding window of its last position: use a whole-context state, \
                 or incomplete='skip')",
                t.cache, t.layer, t.attn.model_layer
            )
        })),
    }
}

/// The runs of every query of a task (empty: left out), in parallel.
pub(super) fn all(
    req: &Request,
    t: &Task,
    cells: &Cells,
    held: &HashMap<i32, Vec<i32>>,
) -> Result<Vec<Vec<Run>>, AttnError> {
    use rayon::prelude::*;
    (0..req.queries.pos.len())
        .into_par_iter()
        .map(|r| {
            let mut out = vec![];
            seen(req, t, cells, held, r, &mut out)?;
            Ok(out)
        })
        .collect()
}
