//! Bounds of a state's counts, and the cells of a stream (an attention cache's or the recurrent
//! part's): position, sequences and extension of each.

use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::layout::Stream;

/// llama.cpp's LLAMA_MAX_SEQ: bounds n_stream, n_seq_id and sequence ids.
pub const MAX_SEQ: u32 = 256;
/// More layers than any model has; bounds n_layer.
pub const MAX_LAYERS: u32 = 4096;
/// More values per row than any model has.
pub const MAX_EMBD: u64 = 1 << 24;
/// More caches than any memory writes.
pub const MAX_CACHES: usize = 8;

/// Cells: position, sequences and (`stream.ext_width`) extension of each.
pub fn parse_cells(cur: &mut Cursor, at: &str, stream: &mut Stream) -> Result<()> {
    let n = stream.cell_count as usize;
    stream.pos.reserve_exact(n);
    stream.seq_start.reserve_exact(n + 1);
    stream.seq_start.push(0);
    stream.seq_ids.reserve(n);
    let width = stream.ext_width;
    let mut ext = if width > 0 {
        Some(Vec::with_capacity(n * width))
    } else {
        None
    };
    for i in 0..n {
        let off = cur.pos();
        let pos = cur.i32(&format!("{at} cell {i} pos"))?;
        if pos < 0 {
            return Err(Error::format(
                format!("{at} cell {i} pos"),
                off,
                "a position >= 0",
                pos,
            ));
        }
        // Sequence states of builds before mid-2025 write 0 here: the cell is the state's sequence.
        let n_seq = cur.u32_in(&format!("{at} cell {i} n_seq_id"), 0, MAX_SEQ)?;
        if let Some(ext) = ext.as_mut() {
            for _ in 0..width {
                ext.push(cur.i32(&format!("{at} cell {i} extension"))?);
            }
        }
        for _ in 0..n_seq {
            let off = cur.pos();
            let id = cur.i32(&format!("{at} cell {i} seq_id"))?;
            if id < 0 || id as u32 >= MAX_SEQ {
                return Err(Error::format(
                    format!("{at} cell {i} seq_id"),
                    off,
                    format!("0 to {}", MAX_SEQ - 1),
                    id,
                ));
            }
            stream.seq_ids.push(id);
        }
        stream.pos.push(pos);
        stream.seq_start.push(stream.seq_ids.len() as u32);
    }
    stream.ext = ext;
    Ok(())
}
