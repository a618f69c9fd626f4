//! Walking the memory of a state, rows skipped: its KV CACHE blocks (section 2 of the format doc),
//! then, for a recurrent or hybrid model, its recurrent part (`recurrent`). A stream of no cell
//! ends at its cell count (no v_trans, no n_layer: an empty sequence's caches say nothing of their
//! layers); with `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` every header is written and no row
//! ([`Reading::device`]); with `PARTIAL_ONLY` some caches are not written at all (the model tells
//! which: [`crate::model::layer_map`]).

use crate::error::{Error, Result};
use crate::format::cells::read_cells;
use crate::format::cursor::{predict, Bytes, Cursor};
use crate::format::layout::{Cache, Kind, Layer, Memory, Record, Stream};
use crate::format::recurrent::{parse_recurrent, RecurrentHint};
use crate::format::types::{type_list, GgmlType};

pub use crate::format::cells::{MAX_CACHES, MAX_EMBD, MAX_LAYERS, MAX_SEQ};

/// One way of reading a state's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The cache starts with u32 n_stream (builds from mid-2025 on).
    pub n_stream: bool,
    /// Bytes of the cell extension (0, 8 or 12).
    pub ext_bytes: u8,
    /// The attention caches hold K records only (a V-less MLA cache).
    pub v_less: bool,
    /// The memory ends with a recurrent part (a recurrent or hybrid model).
    pub recurrent: bool,
    /// Every header and cell, and no row: `llama_state_seq_get_data_ext` with
    /// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` keeps the rows in llama.cpp's own buffers
    /// (`llama_io_write_device::write_tensor` writes nothing) for a later `set_data_ext` with the
    /// flag in the same context.
    pub device: bool,
}

impl Reading {
    /// A reading of attention caches alone, with V records.
    pub const fn kv(n_stream: bool, ext_bytes: u8) -> Self {
        Reading {
            n_stream,
            ext_bytes,
            v_less: false,
            recurrent: false,
            device: false,
        }
    }

    pub fn describe(&self) -> String {
        let mut out = format!(
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
        );
        if self.v_less {
            out.push_str(", K records only (V-less)");
        }
        if self.recurrent {
            out.push_str(", then a recurrent part");
        }
        if self.device {
            out.push_str(", rows on the device (ON_DEVICE: no row in the bytes)");
        }
        out
    }
}

/// What one reading of the memory gave: the memory as attention caches alone, and as attention
/// caches then a recurrent part (None: not asked for).
pub struct Parsed {
    pub kv: Option<Result<Vec<Cache>>>,
    pub recurrent: Option<Result<Vec<Cache>>>,
}

/// Parse the memory from `start` to the end of `buf` under `reading` (its n_stream, extension and
/// V-less flag; `reading.recurrent` is not looked at): as KV caches alone (`kv`), and as KV caches
/// then a recurrent part (`recurrent`), every count of KV caches before it tried (exactly one must
/// consume the bytes). The KV caches are parsed once for both.
pub fn parse_memory(
    buf: Bytes,
    start: usize,
    reading: Reading,
    kv: bool,
    recurrent: bool,
    hint: Option<RecurrentHint>,
) -> Parsed {
    let mut kv_out: Option<Result<Vec<Cache>>> = None;
    let mut done: Vec<Vec<Cache>> = Vec::new();
    let mut rec_err = None;
    let mut caches = Vec::new();
    let mut pos = start;
    loop {
        if recurrent {
            match parse_recurrent(&mut Cursor::at(buf, pos), hint, reading.device) {
                Ok(r) => {
                    let mut all = caches.clone();
                    all.push(r);
                    done.push(all);
                }
                Err(e) => rec_err = Some(furthest(rec_err, e)),
            }
        }
        if kv_out.is_some() || (!kv && pos == buf.len()) {
            break;
        }
        if caches.len() == MAX_CACHES {
            kv_out = Some(Err(Error::format(
                "end of the state",
                pos,
                format!("at most {MAX_CACHES} KV caches, then the end of the bytes"),
                format!("{} more bytes", buf.len() - pos),
            )));
            break;
        }
        match parse_cache(&mut Cursor::at(buf, pos), reading, caches.len()) {
            Ok((cache, end)) => {
                caches.push(cache);
                pos = end;
                if end == buf.len() {
                    // the KV reading ends here; the recurrent one tries a part after it (and fails)
                    kv_out = Some(Ok(caches.clone()));
                }
            }
            Err(e) => {
                // the KV reading's error; the recurrent reading's only when it is the one asked for
                if kv {
                    kv_out = Some(Err(e));
                } else {
                    rec_err = Some(furthest(rec_err, e));
                }
                break;
            }
        }
    }
    let rec = recurrent.then(|| match done.len() {
        0 => Err(rec_err.unwrap_or_else(|| {
            Error::format(
                "recurrent part",
                buf.len(),
                "a recurrent part after the KV caches",
                "the end of the state",
            )
        })),
        1 => Ok(done.pop().expect("one reading")),
        _ => Err(Error::Ambiguous {
            field: "recurrent part".into(),
            offset: done[0].last().map_or(start as u64, |c| c.offset),
            readings: done
                .iter()
                .map(|d| format!("{} KV caches, then the recurrent part", d.len() - 1))
                .collect(),
        }),
    });
    Parsed {
        kv: if kv { kv_out } else { None },
        recurrent: rec,
    }
}

/// How far into a stream's structure an error lies: a reading that got past the cells to the
/// layer records is the likelier one, whatever the byte offsets of the two errors.
fn depth(e: &Error) -> u8 {
    match e.field() {
        Some(f) if f.contains(" layer ") || f.contains(" record ") => 2,
        Some(f) if f.starts_with(crate::format::recurrent::AT) && f.contains("record") => 2,
        Some(f) if f.contains(" r ") || f.contains(" s ") => 2,
        Some(f) if f.contains("v_trans") || f.contains("s_trans") || f.contains("n_layer") => 1,
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
            memory: Memory::Attention,
            streams,
        },
        cur.pos(),
    ))
}

fn parse_stream(cur: &mut Cursor, reading: Reading, ci: usize, s: u32) -> Result<Stream> {
    let at = format!("cache {ci} stream {s}");
    let offset = cur.pos();
    let cell_count = cur.u32(&format!("{at} cell_count"))?;
    let mut stream = Stream::new(
        s,
        offset as u64,
        cell_count,
        cur.pos() as u64,
        reading.ext_bytes as usize / 4,
    );
    if cell_count == 0 {
        return Ok(stream);
    }
    read_cells(cur, &at, &mut stream)?;
    stream.v_trans = cur.u32_in(&format!("{at} v_trans"), 0, 1)? == 1;
    // 0 layers: the full-attention cache of a hybrid iSWA model whose attention layers all slide
    // (LFM2 with a sliding window) still lists its cells.
    let n_layer = cur.u32_in(&format!("{at} n_layer"), 0, MAX_LAYERS)?;
    if n_layer as u64 * 12 > cur.remaining() as u64 {
        return Err(Error::Truncated {
            field: format!("{at} K records ({n_layer} layers)"),
            offset: cur.pos() as u64,
            needed: n_layer as u64 * 12,
            available: cur.remaining() as u64,
        });
    }
    // the cells whose rows the bytes hold (none when they stayed on the device)
    let rows_of = if reading.device { 0 } else { cell_count };
    let mut ks = Vec::with_capacity(n_layer as usize);
    let mut stride = None;
    for l in 0..n_layer {
        let k = row_record(cur, &format!("{at} layer {l} k"), rows_of, Kind::K)?;
        // the following K headers (and the first V one) of records of this size
        predict(cur, &k, &mut stride, n_layer - l);
        ks.push(k);
    }
    stride = None;
    // Every layer has a V record, or (a V-less MLA cache) none has: llama.cpp keeps V for all of a
    // cache's layers or none. The bytes of a V-less cache are those of a cache cut before its V
    // records, so the V-less reading is the model's to choose (WalkOptions::v_less).
    let mut vs: Vec<Option<Record>> = Vec::with_capacity(n_layer as usize);
    for l in 0..n_layer {
        if reading.v_less {
            vs.push(None);
            continue;
        }
        let field = format!("{at} layer {l} v");
        let v = if stream.v_trans {
            trans_record(cur, &field, rows_of)?
        } else {
            row_record(cur, &field, rows_of, Kind::V)?
        };
        predict(cur, &v, &mut stride, n_layer - l);
        vs.push(Some(v));
    }
    stream.layers = ks
        .into_iter()
        .zip(vs)
        .map(|(k, v)| Layer { k, v })
        .collect();
    Ok(stream)
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

fn row_record(cur: &mut Cursor, field: &str, cells: u32, kind: Kind) -> Result<Record> {
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
        kind,
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
        kind: Kind::V,
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
