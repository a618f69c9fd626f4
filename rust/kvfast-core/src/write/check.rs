//! What the parts of a state must hold to be written: a state kvfast writes means in llama.cpp what
//! was asked, and keeps the guarantees of llama.cpp's own writer that kvfast's reader checks
//! (`format/guarantees.rs`), so that it reads back.
//!
//! - A sequence state holds one sequence: llama.cpp's `state_read_meta` puts every cell of it in
//!   the sequence it is loaded into, whatever sequence a cell lists (cells of two sequences would
//!   become one sequence holding each position twice).
//! - An empty KV cache is never followed by one holding cells: llama.cpp's full-attention cache of
//!   an iSWA pair, written first, holds every position the sliding-window one does (llama.cpp
//!   loads a state whose full-attention cache is empty, but never writes one, and the reader
//!   tells the caches of a state apart by this).
//! - The recurrent part keeps one cell per sequence: a sequence state's part holds at most one
//!   cell, a whole state's cells each list a sequence no other cell lists (llama.cpp refuses a
//!   second: "duplicate tail for seq_id").

use crate::write::parts::StateParts;
use crate::write::{Result, WriteError};

/// The sequences the cells of every cache list, sorted, each once.
pub fn sequences(p: &StateParts) -> Vec<i32> {
    let mut v: Vec<i32> = p
        .caches
        .iter()
        .flat_map(|c| &c.streams)
        .flat_map(|s| &s.cells)
        .flat_map(|c| c.seqs.iter().copied())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Refuse parts whose cells list more than one sequence as a sequence state.
pub fn one_sequence(p: &StateParts) -> Result<()> {
    let held = sequences(p);
    if held.len() > 1 {
        return Err(WriteError::request(
            "container",
            format!(
                "a sequence state holds one sequence (llama.cpp loads every cell of it into the one \
                 sequence it is loaded as), and these cells hold sequences {held:?}: write a whole \
                 state (container 'state' or 'ggsn') or one sequence (seq_id=)"
            ),
        ));
    }
    Ok(())
}

/// Refuse parts that break what llama.cpp's writer guarantees (`sequence`: as a sequence state).
pub fn guarantees(p: &StateParts, sequence: bool) -> Result<()> {
    let cells = |c: &crate::write::parts::CacheParts| -> usize {
        c.streams.iter().map(|s| s.cells.len()).sum()
    };
    let attention: Vec<usize> = p
        .caches
        .iter()
        .filter(|c| !c.memory.is_recurrent())
        .map(cells)
        .collect();
    if let Some(empty) = attention.iter().position(|&n| n == 0) {
        if let Some(j) = (empty + 1..attention.len()).find(|&j| attention[j] > 0) {
            return Err(WriteError::request(
                "keep",
                format!(
                    "attention cache {empty} would hold no cell while cache {j} after it holds {}: \
                     llama.cpp's full-attention cache holds every position its sliding-window cache \
                     does, and never writes such a state (keep some of cache {empty}'s cells, or \
                     drop the same tokens from every cache with sync=True)",
                    attention[j]
                ),
            ));
        }
    }
    for c in p.caches.iter().filter(|c| c.memory.is_recurrent()) {
        let n = cells(c);
        if sequence && n > 1 {
            return Err(WriteError::request(
                "container",
                format!(
                    "a sequence state's recurrent part holds one cell (one sequence), not {n}: \
                     write a whole state or one sequence"
                ),
            ));
        }
        if sequence {
            continue;
        }
        let mut seen: Vec<i32> = Vec::new();
        for (i, cell) in c.streams.iter().flat_map(|s| &s.cells).enumerate() {
            if cell.seqs.is_empty() {
                return Err(WriteError::request(
                    "seq_id",
                    format!("recurrent cell {i} of a whole state lists no sequence"),
                ));
            }
            if let Some(q) = cell.seqs.iter().find(|q| seen.contains(q)) {
                return Err(WriteError::request(
                    "seq_id",
                    format!(
                        "one recurrent cell per sequence (llama.cpp refuses a second: duplicate \
                         tail for seq_id {q}), and recurrent cell {i} lists sequence {q} again"
                    ),
                ));
            }
            seen.extend(&cell.seqs);
        }
    }
    Ok(())
}
