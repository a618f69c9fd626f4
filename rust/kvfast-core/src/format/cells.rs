//! Bounds of a state's counts, and the cells of a stream (an attention cache's or the recurrent
//! part's): position, sequences and extension of each.

use crate::error::{Error, Result};
use crate::format::cursor::Cursor;
use crate::format::layout::Stream;

/// llama.cpp's LLAMA_MAX_SEQ: bounds n_stream, n_seq_id and sequence ids.
pub const MAX_SEQ: u32 = 256;
/// More layers than any model has; bounds n_layer.
pub const MAX_LAYERS: u32 = 4096;
/// More values per row than any model has.
pub const MAX_EMBD: u64 = 1 << 24;
/// More caches than any memory writes.
pub const MAX_CACHES: usize = 8;

/// One i32 of cell `i`; the field's name is only formatted when the bytes end (a state holds
/// millions of cells: naming each field up front costs more than reading it).
fn cell_i32(cur: &mut Cursor, at: &str, i: usize, what: &str) -> Result<i32> {
    if cur.remaining() >= 4 {
        cur.i32(what)
    } else {
        cur.i32(&format!("{at} cell {i} {what}"))
    }
}

/// A stream's cell metadata from the cursor (which stands at `stream.meta_offset`): the count
/// checked against the bytes left before anything is allocated by it, then the cells, then where
/// they end.
pub fn read_cells(cur: &mut Cursor, at: &str, stream: &mut Stream) -> Result<()> {
    // Every cell takes at least this much: pos, n_seq_id and the extension.
    let cell_count = stream.cell_count;
    let needed = cell_count as u64 * (8 + 4 * stream.ext_width as u64);
    if needed > cur.remaining() as u64 {
        return Err(Error::Truncated {
            field: format!("{at} cell meta ({cell_count} cells)"),
            offset: cur.pos() as u64,
            needed,
            available: cur.remaining() as u64,
        });
    }
    // a remote state fetches the cells in one round (one sequence id each, as most cells have)
    let count_at = stream.offset;
    cur.hint_claimed(
        cur.pos() as u64,
        needed.saturating_add(cell_count as u64 * 4),
        || {
            format!(
                "{at} cell_count at byte {count_at} claims {cell_count} cells, \
                 {needed} bytes of cell metadata or more"
            )
        },
    );
    parse_cells(cur, at, stream)?;
    stream.meta_len = cur.pos() as u64 - stream.meta_offset;
    stream.layer_header_offset = cur.pos() as u64;
    Ok(())
}

/// Cells: position, sequences and (`stream.ext_width`) extension of each.
pub fn parse_cells(cur: &mut Cursor, at: &str, stream: &mut Stream) -> Result<()> {
    let (done, used) = fast_cells(cur.rest(), stream);
    cur.take(used as u64, at)?;
    if done == stream.cell_count as usize {
        return Ok(());
    }
    // cell `done` is cut short or out of range: read on from it, naming the field that fails
    checked_cells(cur, at, stream, done)
}

/// The cells of well-formed bytes, read straight from the slice (a state holds millions of cells;
/// the walk reads them once per reading it tries): how many cells were read, and their bytes (the
/// cells before the first that breaks a bound or is cut short). A cell is checked whole before
/// anything of it is kept.
fn fast_cells(b: &[u8], stream: &mut Stream) -> (usize, usize) {
    let n = stream.cell_count as usize;
    let width = stream.ext_width;
    stream.pos.reserve_exact(n);
    stream.seq_start.reserve_exact(n + 1);
    stream.seq_start.push(0);
    stream.seq_ids.reserve(n);
    let mut ext = (width > 0).then(|| Vec::with_capacity(n * width));
    let mut o = 0usize;
    let mut i = 0usize;
    while i < n {
        let Some(head) = b.get(o..).and_then(|r| r.first_chunk::<8>()) else {
            break;
        };
        let [p0, p1, p2, p3, n0, n1, n2, n3] = *head;
        let pos = i32::from_le_bytes([p0, p1, p2, p3]);
        let n_seq = u32::from_le_bytes([n0, n1, n2, n3]);
        if pos < 0 || n_seq > MAX_SEQ {
            break;
        }
        // extension words, then the sequence ids
        let end = o + 8 + (width + n_seq as usize) * 4;
        let Some(rest) = b.get(o + 8..end) else {
            break;
        };
        let (ext_words, ids) = rest.split_at(width * 4);
        if ids
            .chunks_exact(4)
            .any(|w| !(0..MAX_SEQ as i32).contains(&word(w)))
        {
            break;
        }
        stream.seq_ids.extend(ids.chunks_exact(4).map(word));
        if let Some(ext) = ext.as_mut() {
            ext.extend(ext_words.chunks_exact(4).map(word));
        }
        stream.pos.push(pos);
        stream.seq_start.push(stream.seq_ids.len() as u32);
        o = end;
        i += 1;
    }
    stream.ext = ext;
    (i, o)
}

/// A little-endian i32 of (the first) four bytes.
#[inline(always)]
fn word(w: &[u8]) -> i32 {
    w.first_chunk::<4>().map_or(-1, |c| i32::from_le_bytes(*c))
}

/// Cells read field by field, failing with the field's name, offset and bound.
/// (`first`: the cells before it are read already.)
fn checked_cells(cur: &mut Cursor, at: &str, stream: &mut Stream, first: usize) -> Result<()> {
    let n = stream.cell_count as usize;
    let width = stream.ext_width;
    let mut ext = stream.ext.take();
    for i in first..n {
        let off = cur.pos();
        let pos = cell_i32(cur, at, i, "pos")?;
        if pos < 0 {
            return Err(Error::format(
                format!("{at} cell {i} pos"),
                off,
                "a position >= 0",
                pos,
            ));
        }
        // Sequence states of builds before mid-2025 write 0 here: the cell is the state's sequence.
        let n_off = cur.pos();
        let n_seq = cell_i32(cur, at, i, "n_seq_id")? as u32;
        if n_seq > MAX_SEQ {
            return Err(Error::format(
                format!("{at} cell {i} n_seq_id"),
                n_off,
                format!("0 to {MAX_SEQ}"),
                n_seq,
            ));
        }
        if let Some(ext) = ext.as_mut() {
            for _ in 0..width {
                ext.push(cell_i32(cur, at, i, "extension")?);
            }
        }
        for _ in 0..n_seq {
            let off = cur.pos();
            let id = cell_i32(cur, at, i, "seq_id")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(cells: u32, ext_width: usize) -> Stream {
        Stream::new(0, 0, cells, 0, ext_width)
    }

    fn words(w: &[i32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn the_fast_reading_and_the_checked_one_agree() {
        // cell 0: pos 5, seqs [0, 3]; cell 1: pos 6, no seq; each with a 1-word extension
        let b = words(&[5, 2, 70, 0, 3, 6, 0, 71, 99]);
        let (mut fast, mut checked) = (stream(2, 1), stream(2, 1));
        let mut cur = Cursor::new(&b, 0);
        parse_cells(&mut cur, "s", &mut fast).unwrap();
        assert_eq!(cur.pos(), 32);
        // the checked reading from cell 0, as parse_cells starts it when cell 0 is bad
        checked.seq_start.push(0);
        checked.ext = Some(Vec::new());
        checked_cells(&mut Cursor::new(&b, 0), "s", &mut checked, 0).unwrap();
        assert_eq!(fast, checked);
        assert_eq!(fast.pos, vec![5, 6]);
        assert_eq!(fast.seq_start, vec![0, 2, 2]);
        assert_eq!(fast.seq_ids, vec![0, 3]);
        assert_eq!(fast.ext, Some(vec![70, 71]));
    }

    #[test]
    fn cells_of_one_sequence_and_others_mixed_read_alike() {
        // no extension: one-sequence cells around cells of two and of none
        let b = words(&[5, 1, 0, 6, 2, 0, 3, 7, 0, 8, 1, 3]);
        let (mut fast, mut checked) = (stream(4, 0), stream(4, 0));
        let mut cur = Cursor::new(&b, 0);
        parse_cells(&mut cur, "s", &mut fast).unwrap();
        assert_eq!(cur.pos(), b.len());
        checked.seq_start.push(0);
        checked_cells(&mut Cursor::new(&b, 0), "s", &mut checked, 0).unwrap();
        assert_eq!(fast, checked);
        assert_eq!(fast.pos, vec![5, 6, 7, 8]);
        assert_eq!(fast.seq_start, vec![0, 1, 3, 3, 4]);
        assert_eq!(fast.seq_ids, vec![0, 0, 3, 3]);
        // a one-sequence cell with a bad position or id is named, not read
        for (bad, field) in [
            ([5, 1, 0, -1, 1, 0], "cell 1 pos"),
            ([5, 1, 0, 6, 1, 256], "cell 1 seq_id"),
        ] {
            let e = parse_cells(&mut Cursor::new(&words(&bad), 0), "s", &mut stream(2, 0));
            let e = e.unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn a_bad_cell_is_named_by_the_checked_reading() {
        let b = words(&[5, 1, 0, 6, 1, 300]);
        let e = parse_cells(
            &mut Cursor::new(&b, 0),
            "cache 0 stream 0",
            &mut stream(2, 0),
        );
        let e = e.unwrap_err().to_string();
        assert!(e.contains("cache 0 stream 0 cell 1 seq_id"), "{e}");
        assert!(e.contains("20"), "{e}");
        let cut = words(&[5, 1, 0, 6]);
        let e = parse_cells(&mut Cursor::new(&cut, 0), "s", &mut stream(2, 0)).unwrap_err();
        assert!(e.to_string().contains("s cell 1 n_seq_id"), "{e}");
    }
}
