//! Walking the KV CACHE blocks of a state (section 2 of the format doc), rows skipped.

use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::layout::{Cache, Layer, Record, Stream};
use crate::types::{type_list, GgmlType};

/// llama.cpp's LLAMA_MAX_SEQ: bounds n_stream, n_seq_id and sequence ids.
pub const MAX_SEQ: u32 = 256;
/// More layers than any model has; bounds n_layer.
pub const MAX_LAYERS: u32 = 4096;
/// More values per row than any model has.
pub const MAX_EMBD: u64 = 1 << 24;
/// More caches than any memory writes.
pub const MAX_CACHES: usize = 8;

/// One way of reading a KV cache's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The cache starts with u32 n_stream (builds from mid-2025 on).
    pub n_stream: bool,
    /// Bytes of the cell extension (0, 8 or 12).
    pub ext_bytes: u8,
}

impl Reading {
    pub fn describe(&self) -> String {
        format!(
            "{}, {}",
            if self.n_stream {
                "caches with n_stream"
            } else {
                "caches without n_stream"
            },
            match self.ext_bytes {
                0 => "no cell extension".to_string(),
                n => format!("{n}-byte cell extension"),
            }
        )
    }
}

/// Parse every KV cache from `start` to the end of `buf`.
pub fn parse_caches(buf: &[u8], start: usize, reading: Reading) -> Result<Vec<Cache>> {
    let mut caches = Vec::new();
    parse_from(buf, start, reading, &mut caches)?;
    Ok(caches)
}

fn parse_from(buf: &[u8], start: usize, reading: Reading, out: &mut Vec<Cache>) -> Result<()> {
    let mut pos = start;
    loop {
        if out.len() == MAX_CACHES {
            return Err(Error::format(
                "end of the state",
                pos,
                format!("at most {MAX_CACHES} KV caches, then the end of the bytes"),
                format!("{} more bytes", buf.len() - pos),
            ));
        }
        let (cache, end) = parse_cache(&mut Cursor::new(buf, pos), reading, out.len())?;
        out.push(cache);
        if end == buf.len() {
            return Ok(());
        }
        pos = end;
    }
}

/// How far into a stream's structure an error lies: a reading that got past the cells to the
/// layer records is the likelier one, whatever the byte offsets of the two errors.
fn depth(e: &Error) -> u8 {
    match e.field() {
        Some(f) if f.contains(" layer ") => 2,
        Some(f) if f.contains("v_trans") || f.contains("n_layer") => 1,
        _ => 0,
    }
}

/// Of two errors of different readings, the more informative one: the one deeper into the
/// structure, then the one further into the bytes.
pub fn furthest(a: Option<Error>, b: Error) -> Error {
    match a {
        Some(a) if (depth(&a), a.offset().unwrap_or(0)) >= (depth(&b), b.offset().unwrap_or(0)) => {
            a
        }
        _ => b,
    }
}

fn parse_cache(cur: &mut Cursor, reading: Reading, ci: usize) -> Result<(Cache, usize)> {
    let offset = cur.pos();
    let n_stream = if reading.n_stream {
        cur.u32_in(&format!("cache {ci} n_stream"), 1, MAX_SEQ)?
    } else {
        1
    };
    let mut streams = Vec::with_capacity(n_stream as usize);
    for s in 0..n_stream {
        streams.push(parse_stream(cur, reading, ci, s)?);
    }
    streams_agree(ci, &streams)?;
    Ok((
        Cache {
            offset: offset as u64,
            has_n_stream: reading.n_stream,
            streams,
        },
        cur.pos(),
    ))
}

fn parse_stream(cur: &mut Cursor, reading: Reading, ci: usize, s: u32) -> Result<Stream> {
    let at = format!("cache {ci} stream {s}");
    let offset = cur.pos();
    let cell_count = cur.u32(&format!("{at} cell_count"))?;
    let mut stream = Stream {
        index: s,
        offset: offset as u64,
        cell_count,
        meta_offset: cur.pos() as u64,
        meta_len: 0,
        pos: Vec::new(),
        seq_start: Vec::new(),
        seq_ids: Vec::new(),
        ext: None,
        ext_width: reading.ext_bytes as usize / 4,
        layer_header_offset: cur.pos() as u64,
        v_trans: false,
        layers: Vec::new(),
    };
    if cell_count == 0 {
        return Ok(stream);
    }
    // Every cell takes at least this much: check before allocating by the count.
    let min_cell = 8 + reading.ext_bytes as u64;
    let needed = cell_count as u64 * min_cell;
    if needed > cur.remaining() as u64 {
        return Err(Error::Truncated {
            field: format!("{at} cell meta ({cell_count} cells)"),
            offset: cur.pos() as u64,
            needed,
            available: cur.remaining() as u64,
        });
    }
    parse_cells(cur, &at, &mut stream)?;
    stream.meta_len = cur.pos() as u64 - stream.meta_offset;
    stream.layer_header_offset = cur.pos() as u64;
    stream.v_trans = cur.u32_in(&format!("{at} v_trans"), 0, 1)? == 1;
    let n_layer = cur.u32_in(&format!("{at} n_layer"), 1, MAX_LAYERS)?;
    if n_layer as u64 * 12 > cur.remaining() as u64 {
        return Err(Error::Truncated {
            field: format!("{at} K records ({n_layer} layers)"),
            offset: cur.pos() as u64,
            needed: n_layer as u64 * 12,
            available: cur.remaining() as u64,
        });
    }
    let mut ks = Vec::with_capacity(n_layer as usize);
    for l in 0..n_layer {
        ks.push(row_record(cur, &format!("{at} layer {l} k"), cell_count)?);
    }
    // Every layer has a V record. (Models without V, such as MLA ones, are not read: a state cut
    // between its K and V records would read as one of them.)
    let mut vs: Vec<Option<Record>> = Vec::with_capacity(n_layer as usize);
    for l in 0..n_layer {
        let field = format!("{at} layer {l} v");
        vs.push(Some(if stream.v_trans {
            trans_record(cur, &field, cell_count)?
        } else {
            row_record(cur, &field, cell_count)?
        }));
    }
    stream.layers = ks
        .into_iter()
        .zip(vs)
        .map(|(k, v)| Layer { k, v })
        .collect();
    Ok(stream)
}

fn parse_cells(cur: &mut Cursor, at: &str, stream: &mut Stream) -> Result<()> {
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

fn read_type(cur: &mut Cursor, field: &str) -> Result<GgmlType> {
    let off = cur.pos();
    let id = cur.i32(&format!("{field} type"))?;
    GgmlType::from_id(id).ok_or_else(|| {
        Error::format(
            format!("{field} type"),
            off,
            format!("a cache type id: {}", type_list()),
            id,
        )
    })
}

fn rows(cur: &mut Cursor, field: &str, row_bytes: u64, cells: u32) -> Result<(u64, u64)> {
    let len = row_bytes.saturating_mul(cells as u64);
    let off = cur.skip(
        len,
        &format!("{field} rows ({cells} cells x {row_bytes} bytes)"),
    )?;
    Ok((off as u64, len))
}

fn row_record(cur: &mut Cursor, field: &str, cells: u32) -> Result<Record> {
    let header_offset = cur.pos();
    let ty = read_type(cur, field)?;
    let rb_off = cur.pos();
    let row_bytes = cur.u64(&format!("{field} row_bytes"))?;
    let n_embd = match ty.values_in(row_bytes) {
        Some(n) if n > 0 && n <= MAX_EMBD => n,
        _ => {
            return Err(Error::format(
                format!("{field} row_bytes"),
                rb_off,
                format!(
                    "a positive multiple of {} ({} block) for at most {MAX_EMBD} values",
                    ty.block_bytes(),
                    ty
                ),
                row_bytes,
            ))
        }
    };
    let (data_offset, data_len) = rows(cur, field, row_bytes, cells)?;
    Ok(Record {
        ty,
        n_embd,
        row_bytes,
        header_offset: header_offset as u64,
        header_len: 12,
        data_offset,
        data_len,
        transposed: false,
    })
}

fn trans_record(cur: &mut Cursor, field: &str, cells: u32) -> Result<Record> {
    let header_offset = cur.pos();
    let ty = read_type(cur, field)?;
    if !ty.is_float() {
        return Err(Error::format(
            format!("{field} type"),
            header_offset,
            "f32, f16 or bf16 (only plain float V can be transposed)",
            ty,
        ));
    }
    let bb = ty.block_bytes() as u32;
    let el = cur.u32_in(&format!("{field} el_bytes ({ty})"), bb, bb)?;
    let n_embd = cur.u32_in(&format!("{field} n_embd_v_gqa"), 1, MAX_EMBD as u32)? as u64;
    let row_bytes = n_embd * el as u64;
    let (data_offset, data_len) = rows(cur, field, row_bytes, cells)?;
    Ok(Record {
        ty,
        n_embd,
        row_bytes,
        header_offset: header_offset as u64,
        header_len: 12,
        data_offset,
        data_len,
        transposed: true,
    })
}

/// Every stream of a cache holds the same layers (llama.cpp keeps one tensor per layer and splits
/// it by stream), so a stream whose layers differ from the first filled stream's in count, type,
/// row width or transposition is not a state llama.cpp wrote; reading it would give one stream's
/// rows another's widths. Called once all of a cache's streams have parsed.
fn streams_agree(ci: usize, streams: &[Stream]) -> Result<()> {
    let mut filled = streams.iter().filter(|s| !s.layers.is_empty());
    let Some(first) = filled.next() else {
        return Ok(());
    };
    for s in filled {
        let at = format!("cache {ci} stream {}", s.index);
        let like = format!("as in stream {}", first.index);
        let header = s.layer_header_offset as usize;
        if s.v_trans != first.v_trans {
            return Err(Error::format(
                format!("{at} v_trans"),
                header,
                format!("{} {like}", first.v_trans as u32),
                s.v_trans as u32,
            ));
        }
        if s.layers.len() != first.layers.len() {
            return Err(Error::format(
                format!("{at} n_layer"),
                header + 4,
                format!("{} {like}", first.layers.len()),
                s.layers.len(),
            ));
        }
        for (l, (a, b)) in first.layers.iter().zip(&s.layers).enumerate() {
            record_agrees(&format!("{at} layer {l} k"), &a.k, &b.k, &like)?;
            if let (Some(a), Some(b)) = (&a.v, &b.v) {
                record_agrees(&format!("{at} layer {l} v"), a, b, &like)?;
            }
        }
    }
    Ok(())
}

/// One record against the same record of the cache's first filled stream: type, then width
/// (transposition is the streams' v_trans, checked before).
fn record_agrees(field: &str, want: &Record, got: &Record, like: &str) -> Result<()> {
    let at = got.header_offset as usize;
    if got.ty != want.ty {
        return Err(Error::format(
            format!("{field} type"),
            at,
            format!("{} {like}", want.ty),
            got.ty,
        ));
    }
    if got.n_embd != want.n_embd || got.row_bytes != want.row_bytes {
        let (name, off, w, g) = if got.transposed {
            ("n_embd_v_gqa", at + 8, want.n_embd, got.n_embd)
        } else {
            ("row_bytes", at + 4, want.row_bytes, got.row_bytes)
        };
        return Err(Error::format(
            format!("{field} {name}"),
            off,
            format!("{w} {like}"),
            g,
        ));
    }
    Ok(())
}
