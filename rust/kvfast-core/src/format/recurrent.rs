//! The recurrent part of a state (`llama_memory_recurrent::state_write`): the whole memory of a
//! recurrent model (Mamba, RWKV), the end of a hybrid one (after its attention caches).
//!
//! `u32 cell_count` (no n_stream), per cell `i32 pos`, `u32 n_seq_id` and the sequence ids (a
//! per-sequence save writes n_seq_id 0), `u32 s_trans` (0), `u32 n_layer` (every layer of the
//! model, attention layers included), then for each layer that has one an R record (`i32 type`,
//! `u64 row bytes`, a row per cell: the conv / token-shift state), then for each such layer an S
//! record (the SSM / WKV / delta-net state). Which layers have records is not in the bytes: the
//! reading counts them (the part ends the state, so the records run to the end: half R, half S).
//! A part of no cell (an empty sequence) still writes s_trans, n_layer and every record header,
//! each of 0 rows; one written with `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` writes its headers and no row.

use crate::error::{Error, Result};
use crate::format::cells::{read_cells, MAX_EMBD, MAX_LAYERS, MAX_SEQ};
use crate::format::cursor::Cursor;
use crate::format::layout::{Cache, Kind, Layer, Memory, Record, Stream};
use crate::format::types::{type_list, GgmlType};

/// Field names of the recurrent part start with this.
pub const AT: &str = "recurrent part";

/// What the model says about its recurrent part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentHint {
    /// The model's layers (`hparams.n_layer()`, what the part's n_layer field holds).
    pub n_layer: u32,
    /// How many of them have R and S records (0: the memory has no recurrent part).
    pub layers: u32,
}

/// Parse the recurrent part from the cursor to the end of the bytes; `device`: its records hold
/// no row (written with `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`).
pub fn parse_recurrent(
    cur: &mut Cursor,
    hint: Option<RecurrentHint>,
    device: bool,
) -> Result<Cache> {
    let offset = cur.pos();
    // llama.cpp keeps max(1, n_seq_max) recurrent cells (create_memory): at most LLAMA_MAX_SEQ
    let cell_count = cur.u32_in(&format!("{AT} cell_count"), 0, MAX_SEQ)?;
    let mut stream = Stream::new(0, offset as u64, cell_count, cur.pos() as u64, 0);
    read_cells(cur, AT, &mut stream)?;
    // llama.cpp writes 0 (its reader refuses a transposed S)
    cur.u32_in(&format!("{AT} s_trans"), 0, 0)?;
    let n_off = cur.pos();
    let n_layer = cur.u32_in(&format!("{AT} n_layer"), 1, MAX_LAYERS)?;
    if let Some(h) = hint {
        if h.n_layer != n_layer {
            return Err(Error::format(
                format!("{AT} n_layer"),
                n_off,
                format!("{} (the model's layers)", h.n_layer),
                n_layer,
            ));
        }
    }
    let rows_of = if device { 0 } else { cell_count };
    let mut records = Vec::new();
    let mut stride = None;
    match hint {
        Some(h) => {
            for i in 0..2 * h.layers {
                let field = if i < h.layers {
                    format!("{AT} r {i}")
                } else {
                    format!("{AT} s {}", i - h.layers)
                };
                let r = record(cur, &field, rows_of)?;
                crate::format::cursor::predict(cur, &r, &mut stride, 2 * h.layers - i);
                records.push(r);
            }
            if !cur.at_end() {
                return Err(Error::format(
                    format!("{AT} end"),
                    cur.pos(),
                    format!(
                        "the end of the state after the R and S records of {} layers",
                        h.layers
                    ),
                    format!("{} more bytes", cur.remaining()),
                ));
            }
        }
        None => {
            while !cur.at_end() {
                if records.len() == 2 * n_layer as usize {
                    return Err(Error::format(
                        format!("{AT} end"),
                        cur.pos(),
                        format!("the end of the state after at most {n_layer} R and S records"),
                        format!("{} more bytes", cur.remaining()),
                    ));
                }
                let field = format!("{AT} record {}", records.len());
                let r = record(cur, &field, rows_of)?;
                let left = 2 * n_layer - records.len() as u32;
                crate::format::cursor::predict(cur, &r, &mut stride, left);
                records.push(r);
            }
        }
    }
    let k = records.len() / 2;
    if records.len() % 2 == 1 || k == 0 {
        let at = records
            .last()
            .map_or(cur.pos(), |r| r.header_offset as usize);
        return Err(Error::format(
            format!("{AT} records"),
            at,
            "an R and an S record for each recurrent layer (an even count, at least 2)",
            format!("{} records", records.len()),
        ));
    }
    let mut s = records.split_off(k);
    if hint.is_none() && records[0].ty == s[0].ty && records[0].row_bytes == s[0].row_bytes {
        // R and S rows of one width: the records could be the R records alone of a state cut
        // short (its R and S records are told apart by their widths only)
        return Err(Error::Ambiguous {
            field: format!(
                "{AT} records (R and S rows of one width: the model tells how many layers have \
                 them; give it: model= in Python, --model on the command line)"
            ),
            offset: s[0].header_offset,
            readings: vec![
                format!("the R and S records of {k} layers"),
                format!("the first {} records of a state cut short", 2 * k),
            ],
        });
    }
    for (kind, recs) in [(Kind::R, &mut records), (Kind::S, &mut s)] {
        let first = recs[0].clone();
        for (i, r) in recs.iter_mut().enumerate() {
            r.kind = kind;
            agrees(kind, i, r, &first)?;
        }
    }
    stream.layers = records
        .into_iter()
        .zip(s)
        .map(|(k, v)| Layer { k, v: Some(v) })
        .collect();
    Ok(Cache {
        offset: offset as u64,
        has_n_stream: false,
        memory: Memory::Recurrent { n_layer },
        streams: vec![stream],
    })
}

/// Every R record has the first one's type and width (`n_embd_r` is the model's, not the
/// layer's), and so has every S record.
fn agrees(kind: Kind, i: usize, got: &Record, want: &Record) -> Result<()> {
    let at = got.header_offset as usize;
    if got.ty != want.ty {
        return Err(Error::format(
            format!("{AT} {kind} {i} type"),
            at,
            format!("{} as the first {kind} record", want.ty),
            got.ty,
        ));
    }
    if got.row_bytes != want.row_bytes {
        return Err(Error::format(
            format!("{AT} {kind} {i} row_bytes"),
            at + 4,
            format!(
                "{} as the first {kind} record (every recurrent layer's rows are alike)",
                want.row_bytes
            ),
            got.row_bytes,
        ));
    }
    Ok(())
}

/// One R or S record: type, row bytes (0 for a state the model does not keep, as LFM2's S), rows.
fn record(cur: &mut Cursor, field: &str, cells: u32) -> Result<Record> {
    let header_offset = cur.pos();
    let id = cur.i32(&format!("{field} type"))?;
    let ty = GgmlType::from_id(id).ok_or_else(|| {
        Error::format(
            format!("{field} type"),
            header_offset,
            format!("a type id: {}", type_list()),
            id,
        )
    })?;
    let rb_off = cur.pos();
    let row_bytes = cur.u64(&format!("{field} row_bytes"))?;
    let n_embd = match ty.values_in(row_bytes) {
        Some(n) if n <= MAX_EMBD => n,
        _ => {
            return Err(Error::format(
                format!("{field} row_bytes"),
                rb_off,
                format!(
                    "a multiple of {} ({ty} block) for at most {MAX_EMBD} values",
                    ty.block_bytes()
                ),
                row_bytes,
            ))
        }
    };
    let len = row_bytes.saturating_mul(cells as u64);
    let data_offset = cur.skip(
        len,
        &format!("{field} rows ({cells} cells x {row_bytes} bytes)"),
    )?;
    Ok(Record {
        kind: Kind::R,
        ty,
        n_embd,
        row_bytes,
        header_offset: header_offset as u64,
        header_len: 12,
        data_offset: data_offset as u64,
        data_len: len,
        transposed: false,
    })
}
