//! Matching two states' cells for a comparison: by (sequence, position), never by cell order, since
//! two runs over the same tokens may place them in different cells and streams.

use std::collections::{BTreeMap, HashMap};

use crate::format::layout::{Cache, Layout, Stream};
use crate::plan::select::cell_seq_pairs;

/// Why two states cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("A has {a} KV caches, B has {b}")]
    Caches { a: usize, b: usize },
    #[error("cache {cache}: A has {a} layers, B has {b}")]
    Layers { cache: usize, a: usize, b: usize },
    #[error("cache {cache} layer {layer}: A has {a:?} values per K/V row, B has {b:?}")]
    Rows {
        cache: usize,
        layer: usize,
        a: (u64, Option<u64>),
        b: (u64, Option<u64>),
    },
    #[error("cannot match the states: {missing} (sequence, position) pairs of A's cache {cache} stream {stream} have no cell in B (first: sequence {seq}, position {pos})", seq = .seq.map_or("none".to_string(), |q| q.to_string()))]
    Cells {
        missing: usize,
        cache: u32,
        stream: u32,
        seq: Option<i32>,
        pos: i32,
    },
}

/// (K values, V values) per row of each layer of a cache's first stream that holds cells.
fn shape(c: &Cache) -> Vec<(u64, Option<u64>)> {
    c.streams
        .iter()
        .find(|s| s.cell_count > 0)
        .map(|s| {
            s.layers
                .iter()
                .map(|l| (l.k.n_embd, l.v.as_ref().map(|v| v.n_embd)))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether A and B have the same caches, layers and row widths (the walk has checked that the
/// streams of one cache agree).
pub fn check_geometry(a: &Layout, b: &Layout) -> Result<(), Mismatch> {
    let (ca, cb) = (&a.caches, &b.caches);
    if ca.len() != cb.len() {
        return Err(Mismatch::Caches {
            a: ca.len(),
            b: cb.len(),
        });
    }
    for (i, (x, y)) in ca.iter().zip(cb).enumerate() {
        let (sx, sy) = (shape(x), shape(y));
        if sx.len() != sy.len() {
            return Err(Mismatch::Layers {
                cache: i,
                a: sx.len(),
                b: sy.len(),
            });
        }
        for (l, (p, q)) in sx.iter().zip(&sy).enumerate() {
            if p != q {
                return Err(Mismatch::Rows {
                    cache: i,
                    layer: l,
                    a: *p,
                    b: *q,
                });
            }
        }
    }
    Ok(())
}

/// Where each (sequence, position) of one cache of B lives: (stream, cell). A pair held by several
/// cells (M-RoPE image tokens, self-extend) maps to the last of them. A sequence state whose
/// sequence nothing names (a GGSQ of a recurrent model: its one cell lists none) has its cells
/// under sequence None, matched by position alone.
pub struct CellIndex {
    at: HashMap<(Option<i32>, i32), (usize, usize)>,
    by_pos: HashMap<i32, (usize, usize)>,
}

impl CellIndex {
    /// `seq_default`: the sequence of cells that list none (B's own, in a sequence state).
    pub fn new(cache: &Cache, seq_default: Option<i32>) -> Self {
        let (mut at, mut by_pos) = (HashMap::new(), HashMap::new());
        for (si, s) in cache.streams.iter().enumerate() {
            for (c, q) in cell_seq_pairs(s, seq_default, i32::MIN) {
                at.insert((q, s.pos[c]), (si, c));
                by_pos.insert(s.pos[c], (si, c));
            }
        }
        CellIndex { at, by_pos }
    }

    /// B's cell of (sequence, position): a sequence None on either side (a sequence state's own,
    /// not named) matches by position.
    fn get(&self, q: Option<i32>, pos: i32) -> Option<(usize, usize)> {
        let found = self.at.get(&(q, pos)).or_else(|| match q {
            None => self.by_pos.get(&pos),
            Some(_) => self.at.get(&(None, pos)),
        });
        found.copied()
    }
}

/// The cells of one stream of B matched to cells of A.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    /// B's stream (its index in the cache).
    pub stream: usize,
    /// (A's cell, B's cell), in A's order.
    pub cells: Vec<(usize, usize)>,
    /// The sequence of each pair.
    pub seqs: Vec<Option<i32>>,
}

/// Match every (cell, sequence) of A's `stream` (of cache `cache`) to B's cell of the same
/// (sequence, position), grouped by B's stream in stream order; fails naming the first pair B
/// lacks.
pub fn match_cells(
    cache: u32,
    stream: &Stream,
    seq_default: Option<i32>,
    b: &CellIndex,
) -> Result<Vec<Matched>, Mismatch> {
    match_with(cache, stream, seq_default, None, |q, pos| b.get(q, pos))
}

/// Match every (cell, sequence) of A's `stream` whose position is below `below` (all when None)
/// to the (stream, cell) of B that `find` gives for its (sequence, position), grouped by B's stream
/// in stream order; fails naming the first pair B lacks.
pub(crate) fn match_with(
    cache: u32,
    stream: &Stream,
    seq_default: Option<i32>,
    below: Option<i32>,
    find: impl Fn(Option<i32>, i32) -> Option<(usize, usize)>,
) -> Result<Vec<Matched>, Mismatch> {
    let mut by_stream: BTreeMap<usize, Matched> = BTreeMap::new();
    let mut missing = vec![];
    for (c, q) in cell_seq_pairs(stream, seq_default, i32::MIN) {
        let pos = stream.pos[c];
        if below.is_some_and(|n| pos >= n) {
            continue;
        }
        match find(q, pos) {
            Some((si, cb)) => {
                let m = by_stream.entry(si).or_insert_with(|| Matched {
                    stream: si,
                    cells: vec![],
                    seqs: vec![],
                });
                m.cells.push((c, cb));
                m.seqs.push(q);
            }
            None => missing.push((q, pos)),
        }
    }
    if let Some(&(seq, pos)) = missing.first() {
        return Err(Mismatch::Cells {
            missing: missing.len(),
            cache,
            stream: stream.index,
            seq,
            pos,
        });
    }
    Ok(by_stream.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{layout, stream};

    #[test]
    fn cells_match_by_sequence_and_position_across_streams() {
        // A: one stream; B: the same tokens spread over two streams, in another order
        let a = layout(vec![vec![stream(
            0,
            &[0, 1, 2],
            &[&[0], &[0, 1], &[1]],
            &[(8, Some(8))],
        )]]);
        let b = layout(vec![vec![
            stream(0, &[2, 1], &[&[1], &[1]], &[(8, Some(8))]),
            stream(1, &[1, 0], &[&[0], &[0]], &[(8, Some(8))]),
        ]]);
        check_geometry(&a, &b).unwrap();
        let index = CellIndex::new(&b.caches[0], None);
        let m = match_cells(0, &a.caches[0].streams[0], None, &index).unwrap();
        assert_eq!(
            m,
            vec![
                Matched {
                    stream: 0,
                    cells: vec![(1, 1), (2, 0)],
                    seqs: vec![Some(1), Some(1)]
                },
                Matched {
                    stream: 1,
                    cells: vec![(0, 1), (1, 0)],
                    seqs: vec![Some(0), Some(0)]
                },
            ]
        );
    }

    #[test]
    fn a_pair_b_lacks_is_named() {
        let a = layout(vec![vec![stream(
            0,
            &[0, 1, 9],
            &[&[], &[], &[]],
            &[(8, None)],
        )]]);
        let b = layout(vec![vec![stream(0, &[0, 1], &[&[4], &[4]], &[(8, None)])]]);
        let index = CellIndex::new(&b.caches[0], None);
        // A's cells list no sequence: they are A's own (4), as B's are
        let e = match_cells(0, &a.caches[0].streams[0], Some(4), &index).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot match the states: 1 (sequence, position) pairs of A's cache 0 stream 0 have no cell in B (first: sequence 4, position 9)"
        );
        // A's own sequence unnamed (a GGSQ whose cells list none): matched by position alone
        let e = match_cells(0, &a.caches[0].streams[0], None, &index).unwrap_err();
        assert!(
            e.to_string().contains("1 (sequence, position) pairs"),
            "{e}"
        );
        assert!(
            e.to_string().contains("first: sequence none, position 9"),
            "{e}"
        );
    }

    #[test]
    fn geometry_must_agree() {
        let one = |k: u64, v: Option<u64>, layers: usize| {
            layout(vec![vec![stream(0, &[0], &[&[0]], &vec![(k, v); layers])]])
        };
        assert_eq!(
            check_geometry(&one(8, Some(8), 2), &layout(vec![])),
            Err(Mismatch::Caches { a: 1, b: 0 })
        );
        assert_eq!(
            check_geometry(&one(8, Some(8), 2), &one(8, Some(8), 3))
                .unwrap_err()
                .to_string(),
            "cache 0: A has 2 layers, B has 3"
        );
        assert_eq!(
            check_geometry(&one(8, Some(8), 1), &one(8, None, 1))
                .unwrap_err()
                .to_string(),
            "cache 0 layer 0: A has (8, Some(8)) values per K/V row, B has (8, None)"
        );
    }
}
