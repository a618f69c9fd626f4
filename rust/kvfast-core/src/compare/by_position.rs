//! Matching two states' cells by position alone, sequences ignored: two states of different
//! sequences (two prompts of one probe batch, sequences 0 and 1) compare position for position,
//! optionally only below a position (the aligned common token prefix).

use std::collections::HashMap;

use crate::compare::matching::{match_with, Matched, Mismatch};
use crate::format::layout::{Cache, Stream};

/// Where each position of one cache of B lives: (stream, cell), whatever its sequences. A position
/// held by several cells (several sequences, M-RoPE image tokens) maps to the last of them.
pub struct PositionIndex(HashMap<i32, (usize, usize)>);

impl PositionIndex {
    pub fn new(cache: &Cache) -> Self {
        let mut at = HashMap::new();
        for (si, s) in cache.streams.iter().enumerate() {
            for c in 0..s.cell_count as usize {
                at.insert(s.pos[c], (si, c));
            }
        }
        PositionIndex(at)
    }
}

/// Match every (cell, sequence) of A's `stream` whose position is below `below` (all when None) to
/// B's cell of the same position, grouped by B's stream in stream order; fails naming the first
/// position B lacks.
pub fn match_positions(
    cache: u32,
    stream: &Stream,
    seq_default: Option<i32>,
    b: &PositionIndex,
    below: Option<i32>,
) -> Result<Vec<Matched>, Mismatch> {
    match_with(cache, stream, seq_default, below, |_, pos| {
        b.0.get(&pos).copied()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{layout, stream};

    #[test]
    fn cells_of_other_sequences_match_by_position() {
        // A holds sequence 0, B sequence 1 over two streams, in another order
        let a = layout(vec![vec![stream(
            0,
            &[0, 1, 2],
            &[&[0], &[0], &[0]],
            &[(8, Some(8))],
        )]]);
        let b = layout(vec![vec![
            stream(0, &[2, 1], &[&[1], &[1]], &[(8, Some(8))]),
            stream(1, &[0], &[&[1]], &[(8, Some(8))]),
        ]]);
        let index = PositionIndex::new(&b.caches[0]);
        let m = match_positions(0, &a.caches[0].streams[0], None, &index, None).unwrap();
        assert_eq!(
            m,
            vec![
                Matched {
                    stream: 0,
                    cells: vec![(1, 1), (2, 0)],
                    seqs: vec![Some(0), Some(0)]
                },
                Matched {
                    stream: 1,
                    cells: vec![(0, 0)],
                    seqs: vec![Some(0)]
                },
            ]
        );
        // below 2: position 2 is left out
        let m = match_positions(0, &a.caches[0].streams[0], None, &index, Some(2)).unwrap();
        assert_eq!(m[0].cells, vec![(1, 1)]);
        assert_eq!(m[1].cells, vec![(0, 0)]);
    }

    #[test]
    fn a_position_b_lacks_is_named() {
        let a = layout(vec![vec![stream(
            0,
            &[0, 1, 9],
            &[&[0], &[0], &[0]],
            &[(8, None)],
        )]]);
        let b = layout(vec![vec![stream(0, &[0, 1], &[&[4], &[4]], &[(8, None)])]]);
        let index = PositionIndex::new(&b.caches[0]);
        let e = match_positions(0, &a.caches[0].streams[0], None, &index, None).unwrap_err();
        assert!(
            e.to_string().contains("first: sequence 0, position 9"),
            "{e}"
        );
        // below the missing position, all match
        assert!(match_positions(0, &a.caches[0].streams[0], None, &index, Some(9)).is_ok());
    }
}
