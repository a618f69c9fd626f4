//! What llama.cpp's writer guarantees about the cells and caches of a state, checked on a reading
//! that parsed: a reading that breaks one is not what llama.cpp wrote, so it fails like a parse.
//!
//! - A sequence state (raw sequence bytes, GGSQ) holds the cells of one sequence: every cell lists
//!   that sequence alone (the header's seq_id when there is one), or, in builds before mid-2025,
//!   every cell lists none (`llama_kv_cache::state_write_meta`; `state_read_meta` refuses a cell
//!   with n_seq_id != 1).
//! - A whole-context state (raw state bytes, GGSN) writes occupied cells only, and a cell is
//!   occupied while some sequence holds it: every cell lists at least one sequence.
//! - An empty KV cache is never followed by one holding cells: of an iSWA pair the full-attention
//!   cache comes first and holds every position the sliding-window one does.
//! - A cache of no layer is the full-attention cache of a hybrid iSWA model whose attention layers
//!   all slide (LFM2 with a sliding window): its sliding-window cache follows it.
//! - The recurrent part (`llama_memory_recurrent`) keeps one cell per sequence (several
//!   sequences may share it, after `seq_cp`): a sequence state's part holds at most one cell,
//!   listing no sequence (`state_write_meta` writes n_seq_id 0 for a single sequence, in every
//!   era; `state_read_meta` refuses another count); a whole-context state's cells each list at
//!   least one sequence, and no sequence twice. (This tells a recurrent part from a KV cache of
//!   2025 builds, whose bytes are alike: cell count, cells, a 0, n_layer, two records per layer.)
//!
//! Not checked, because llama.cpp does not guarantee it: that a (sequence, position) pair appears
//! once. M-RoPE image tokens share a position (their x, y differ) and `llama_memory_seq_div`
//! (self-extend, llama-completion's `--grp-attn-n`) maps several positions to one; llama.cpp's own
//! index of a sequence's positions (`seq_pos` in llama-kv-cells.h) holds (pos, cell) pairs for that.

use crate::error::{Error, Result};
use crate::format::layout::{Cache, Container, Stream};
use crate::format::recurrent::AT as RECURRENT;

/// Check a parsed reading of a state of `container` (with the header's `seq_id`, if any).
pub fn check(container: Container, seq_id: Option<i32>, caches: &[Cache]) -> Result<()> {
    let per_sequence = matches!(container, Container::RawSeq | Container::Ggsq);
    let (recurrent, caches): (Vec<&Cache>, Vec<&Cache>) =
        caches.iter().partition(|c| c.memory.is_recurrent());
    if let Some(r) = recurrent.first() {
        recurrent_cells(r, per_sequence)?;
    }
    empty_cache_last(&caches)?;
    no_layer_then_a_cache(&caches)?;
    // The sequence every cell must list, and where it was first seen.
    let mut want: Option<(i32, String)> = seq_id.map(|s| (s, "the seq_id of the header".into()));
    // Whether the cells list their sequence (false: builds before mid-2025), from the first cell.
    let mut era: Option<(bool, String)> = None;
    for (ci, cache) in caches.iter().enumerate() {
        for s in &cache.streams {
            // Only the cells that can break a guarantee are looked at one by one: of a
            // whole-context state the first listing no sequence, if any; of a sequence state
            // whose cells all list what its first lists, the first (the others pass or fail alike).
            let n = s.cell_count as usize;
            let cells = match per_sequence {
                false => first_without_seq(s)..n,
                true if lists_as_first(s) => 0..n.min(1),
                true => 0..n,
            };
            for i in cells {
                // named only when a cell breaks a guarantee (a state holds millions of cells)
                let at = || format!("cache {ci} stream {} cell {i}", s.index);
                let ids = s.cell_seqs(i);
                let n_off = cell_offset(s, i) + 4;
                if !per_sequence {
                    if ids.is_empty() {
                        return Err(Error::format(
                            format!("{} n_seq_id", at()),
                            n_off as usize,
                            "1 or more: every cell of a whole-context state belongs to a sequence",
                            0,
                        ));
                    }
                    continue;
                }
                if ids.len() > 1 {
                    return Err(Error::format(
                        format!("{} n_seq_id", at()),
                        n_off as usize,
                        "0 or 1: a sequence state's cells list its own sequence only",
                        ids.len(),
                    ));
                }
                let lists = ids.len() == 1;
                match &era {
                    None => era = Some((lists, at())),
                    Some((e, first)) if *e != lists => {
                        return Err(Error::format(
                            format!("{} n_seq_id", at()),
                            n_off as usize,
                            format!(
                                "{} as in {first}: a sequence state's cells all list its sequence, \
                                 or (builds before mid-2025) none does",
                                *e as u32
                            ),
                            ids.len(),
                        ));
                    }
                    Some(_) => {}
                }
                let Some(&id) = ids.first() else { continue };
                match &want {
                    None => want = Some((id, format!("{} seq_id", at()))),
                    Some((w, source)) if *w != id => {
                        return Err(Error::format(
                            format!("{} seq_id", at()),
                            (n_off + 4 + s.ext_width as u64 * 4) as usize,
                            format!("{w} as in {source}: a sequence state holds one sequence"),
                            id,
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// The first cell of `s` that lists no sequence (its cell count when every cell lists one).
fn first_without_seq(s: &Stream) -> usize {
    s.seq_start
        .windows(2)
        .position(|w| w[1] == w[0])
        .unwrap_or(s.cell_count as usize)
}

/// Whether every cell of `s` lists what its first lists: no sequence, or the same one.
fn lists_as_first(s: &Stream) -> bool {
    let (Some(&a), Some(&b)) = (s.seq_start.first(), s.seq_start.get(1)) else {
        return true;
    };
    let k = b.wrapping_sub(a);
    k <= 1
        && s.seq_start.windows(2).all(|w| w[1].wrapping_sub(w[0]) == k)
        && s.seq_ids.windows(2).all(|w| w[0] == w[1])
}

/// Byte offset of cell `i`'s meta (its pos field).
fn cell_offset(s: &Stream, i: usize) -> u64 {
    let per_cell = 8 + s.ext_width as u64 * 4;
    s.meta_offset + i as u64 * per_cell + 4 * s.seq_start[i] as u64
}

fn cells(c: &Cache) -> u64 {
    c.streams.iter().map(|s| s.cell_count as u64).sum()
}

/// One cell per sequence: see the module's notes.
fn recurrent_cells(c: &Cache, per_sequence: bool) -> Result<()> {
    let Some(s) = c.streams.first() else {
        return Ok(());
    };
    if per_sequence && s.cell_count > 1 {
        return Err(Error::format(
            format!("{RECURRENT} cell_count"),
            s.offset as usize,
            "0 or 1: a sequence has one recurrent state",
            s.cell_count,
        ));
    }
    let mut seen: Vec<(i32, usize)> = Vec::new();
    for i in 0..s.cell_count as usize {
        let ids = s.cell_seqs(i);
        let n_off = cell_offset(s, i) + 4;
        let at = format!("{RECURRENT} cell {i} n_seq_id");
        if per_sequence && !ids.is_empty() {
            return Err(Error::format(
                at,
                n_off as usize,
                "0: a sequence state's recurrent cell lists no sequence",
                ids.len(),
            ));
        }
        if !per_sequence && ids.is_empty() {
            return Err(Error::format(
                at,
                n_off as usize,
                "1 or more: every recurrent cell of a whole-context state belongs to a sequence",
                0,
            ));
        }
        for &id in ids {
            if let Some(&(_, first)) = seen.iter().find(|(q, _)| *q == id) {
                return Err(Error::format(
                    format!("{RECURRENT} cell {i} seq_id"),
                    n_off as usize + 4,
                    format!(
                        "a sequence other than {id}: it has its recurrent state in cell {first}"
                    ),
                    id,
                ));
            }
            seen.push((id, i));
        }
    }
    Ok(())
}

fn no_layer_then_a_cache(caches: &[&Cache]) -> Result<()> {
    let Some((ci, last)) = caches.iter().enumerate().next_back() else {
        return Ok(());
    };
    if let Some(s) = last
        .streams
        .iter()
        .find(|s| s.cell_count > 0 && s.layers.is_empty())
    {
        return Err(Error::format(
            format!("cache {ci} stream {} n_layer", s.index),
            s.layer_header_offset as usize + 4,
            "1 or more: a cache of no layer is the full-attention half of an iSWA pair, and its \
             sliding-window cache follows it",
            0,
        ));
    }
    Ok(())
}

fn empty_cache_last(caches: &[&Cache]) -> Result<()> {
    let Some(first_empty) = caches.iter().position(|c| cells(c) == 0) else {
        return Ok(());
    };
    if let Some((j, later)) = caches
        .iter()
        .enumerate()
        .skip(first_empty + 1)
        .find(|(_, c)| cells(c) > 0)
    {
        let c = caches[first_empty];
        let s0 = c.streams.first().map_or(c.offset, |s| s.offset);
        return Err(Error::format(
            format!("cache {first_empty} stream 0 cell_count"),
            s0 as usize,
            "cells: an empty KV cache is never followed by one holding cells (the full-attention \
             cache, written first, holds every position the sliding-window one does)",
            format!("0, and cache {j} after it holds {} cells", cells(later)),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::container::{walk, WalkOptions};

    /// A raw sequence state (io magic, seq_id `seq`) of one f16 cache, cells given as
    /// (pos, seq ids), one layer of 2 values.
    fn seq_state(seq: i32, cells: &[(i32, &[i32])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(0xAF14_3CD8u32.to_le_bytes());
        b.extend(seq.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(cache_body(cells));
        b
    }

    fn cache_body(cells: &[(i32, &[i32])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((cells.len() as u32).to_le_bytes());
        if cells.is_empty() {
            return b;
        }
        for (pos, ids) in cells {
            b.extend(pos.to_le_bytes());
            b.extend((ids.len() as u32).to_le_bytes());
            for id in *ids {
                b.extend(id.to_le_bytes());
            }
        }
        b.extend(0u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        for _ in 0..2 {
            b.extend(1i32.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend(std::iter::repeat_n(0x11u8, 4 * cells.len()));
        }
        b
    }

    fn format_err(b: &[u8]) -> (String, u64, String) {
        match walk(b, WalkOptions::default()) {
            Err(Error::Format {
                field,
                offset,
                expected,
                ..
            }) => (field, offset, expected),
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn a_sequence_state_of_its_own_sequence_opens() {
        let b = seq_state(3, &[(0, &[3]), (1, &[3]), (2, &[3])]);
        assert_eq!(walk(&b, WalkOptions::default()).unwrap().seq_id, Some(3));
    }

    #[test]
    fn a_cell_of_two_sequences_in_a_sequence_state_is_refused() {
        // The S1 reproducer in miniature: cell 0's n_seq_id 1 -> 2 swallows cell 1's pos as a
        // second sequence, and cell 1 reads with no sequence.
        let mut b = seq_state(0, &[(0, &[0]), (1, &[0]), (2, &[0])]);
        let n_seq = 16 + 4;
        b[n_seq..n_seq + 4].copy_from_slice(&2u32.to_le_bytes());
        let (field, offset, expected) = format_err(&b);
        assert_eq!(field, "cache 0 stream 0 cell 0 n_seq_id");
        assert_eq!(offset, n_seq as u64);
        assert!(expected.contains("own sequence only"), "{expected}");
    }

    #[test]
    fn a_foreign_sequence_or_a_mixed_era_is_refused() {
        let b = seq_state(0, &[(0, &[0]), (1, &[1])]);
        let (field, offset, expected) = format_err(&b);
        assert_eq!(field, "cache 0 stream 0 cell 1 seq_id");
        assert_eq!(offset, 16 + 12 + 8);
        assert!(expected.starts_with("0 as in the seq_id of the header"));
        let b = seq_state(0, &[(0, &[0]), (1, &[])]);
        let (field, _, _) = format_err(&b);
        assert_eq!(field, "cache 0 stream 0 cell 1 n_seq_id");
        let b = seq_state(5, &[(0, &[0])]);
        assert_eq!(format_err(&b).0, "cache 0 stream 0 cell 0 seq_id");
    }

    #[test]
    fn an_empty_cache_before_a_filled_one_is_refused() {
        let mut b = seq_state(0, &[]);
        b.extend(1u32.to_le_bytes());
        b.extend(cache_body(&[(0, &[0])]));
        let (field, offset, expected) = format_err(&b);
        assert_eq!(
            (field.as_str(), offset),
            ("cache 0 stream 0 cell_count", 12)
        );
        assert!(expected.contains("never followed"), "{expected}");
        // two empty caches (an empty sequence of an iSWA model) are fine
        let mut b = seq_state(0, &[]);
        b.extend(1u32.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        assert_eq!(walk(&b, WalkOptions::default()).unwrap().caches.len(), 2);
    }

    #[test]
    fn a_whole_state_cell_without_a_sequence_is_refused() {
        let mut b = Vec::new();
        b.extend(5u32.to_le_bytes());
        b.extend(b"qwen3");
        b.extend(1u32.to_le_bytes());
        b.extend(cache_body(&[(0, &[0, 1]), (1, &[])]));
        let (field, offset, _) = format_err(&b);
        assert!(
            field.starts_with("cache 0 stream 0 cell 1 n_seq_id"),
            "{field}"
        );
        assert_eq!(offset, 9 + 8 + 16 + 4);
        let mut b = Vec::new();
        b.extend(5u32.to_le_bytes());
        b.extend(b"qwen3");
        b.extend(1u32.to_le_bytes());
        b.extend(cache_body(&[(0, &[0, 1]), (1, &[1])]));
        assert!(walk(&b, WalkOptions::default()).is_ok());
    }
}
