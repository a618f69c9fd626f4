//! A state as owned parts, taken from a walked layout, and its bytes in any container and version
//! kvfast reads. Edits on the parts are in [`super::edit`].
//!
//! The parts hold every field llama.cpp writes, so that writing the parts of a walked state with
//! its own format gives back the state's bytes exactly. The rows are not copied: each record's are
//! read from the source's bytes as the state is written, with their edits ([`super::rows`]), so a
//! write needs memory for the cells, not the rows.

use std::io::Write;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::container::{GGSN_MAGIC, GGSQ_MAGIC, IO_MAGIC};
use crate::format::layout::{Cache, Container, Layout, Memory, Record};
use crate::write::WriteError;

pub use crate::write::rows::{Rows, SourceBytes, Span};

/// One cell: its position, its sequences (none in a per-sequence save of the recurrent part or of
/// a 2025 build) and its extension (x, y[, tok]; empty when the cache keeps none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub pos: i32,
    pub seqs: Vec<i32>,
    pub ext: Vec<i32>,
}

/// One stream: its cells, then (when it has cells) v_trans and the records of its layers.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamParts {
    pub cells: Vec<Cell>,
    pub v_trans: bool,
    /// Per layer, the K (R) record and the V (S) record (None in a V-less cache).
    pub layers: Vec<(Rows, Option<Rows>)>,
    /// Offset of the stream's cell count in the source (for errors).
    pub at: u64,
}

/// An attention cache or the recurrent part.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheParts {
    pub memory: Memory,
    pub streams: Vec<StreamParts>,
    pub at: u64,
}

/// The outputs block of a 2025 whole state (GGSN 9 before February 2026).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputParts {
    pub output_pos: Vec<i32>,
    /// f32 logits, as stored.
    pub logits: Span,
    /// f32 embeddings, as stored.
    pub embd: Span,
}

/// The containers the writer writes and the versions of each it writes (raw bytes have none).
pub const WRITE_VERSIONS: [(Container, &[u32]); 4] = [
    (Container::RawSeq, &[]),
    (Container::Ggsq, &[2, 3]),
    (Container::Ggsn, &[9, 10]),
    (Container::RawState, &[]),
];

/// What a container looks like in one llama.cpp build: which fields surround the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub container: Container,
    /// GGSQ 2 or 3, GGSN 9 or 10 (None for raw bytes).
    pub version: Option<u32>,
    /// Raw sequence bytes start with the io magic and the sequence id (builds from May 2026).
    pub io_magic: bool,
    /// A whole state carries the outputs block (builds before February 2026).
    pub outputs: bool,
    /// Attention caches start with u32 n_stream (builds from mid-2025).
    pub n_stream: bool,
    /// Bytes of the cell extension of attention cells that have one (8: x, y; 12: x, y, tok).
    pub ext_bytes: u8,
    /// Every header and cell, no row (raw sequence bytes written with
    /// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`: llama.cpp keeps the rows in its own buffers).
    pub device: bool,
}

impl Format {
    /// The format of a walked state: writing its parts in it gives its bytes back.
    pub fn of(layout: &Layout) -> Format {
        let has = |f: &str| layout.features.contains(&f);
        Format {
            container: layout.container,
            version: layout.version,
            io_magic: has("io magic"),
            outputs: layout.outputs.is_some(),
            n_stream: !has("no n_stream"),
            ext_bytes: layout.ext_bytes,
            device: layout.rows_on_device,
        }
    }

    /// What the newest llama.cpp kvfast knows (October 2026, llama-cpp-python 0.3.36) writes:
    /// GGSQ 3, GGSN 10, raw sequence bytes with the io magic, no outputs, n_stream, 12-byte cell
    /// extensions.
    pub fn newest(container: Container) -> Format {
        Format {
            container,
            version: match container {
                Container::Ggsq => Some(3),
                Container::Ggsn => Some(10),
                _ => None,
            },
            io_magic: container == Container::RawSeq,
            outputs: false,
            n_stream: true,
            ext_bytes: 12,
            device: false,
        }
    }

    /// The format a request names: a container of [`WRITE_VERSIONS`] by name, in `version` (None:
    /// the newest, as [`Format::newest`]).
    pub fn named(name: &str, version: Option<u32>) -> std::result::Result<Format, WriteError> {
        let Some(&(container, versions)) = WRITE_VERSIONS.iter().find(|(c, _)| c.name() == name)
        else {
            return Err(WriteError::request(
                "container",
                format!("'seq', 'ggsq', 'ggsn' or 'state', not {name:?}"),
            ));
        };
        let mut f = Format::newest(container);
        match version {
            None => {}
            Some(v) if !versions.contains(&v) => {
                return Err(WriteError::request(
                    "version",
                    format!(
                        "GGSQ 2 or 3, GGSN 9 (without outputs) or 10; raw bytes have none, not \
                         {name} {v}"
                    ),
                ))
            }
            // GGSQ 2 and GGSN 9 are the builds before August 2026, whose cell extension is x, y
            Some(v @ (2 | 9)) => {
                f.version = Some(v);
                f.ext_bytes = 8;
            }
            Some(v) => f.version = Some(v),
        }
        Ok(f)
    }

    /// A sequence state (raw sequence bytes or GGSQ): one sequence, no arch.
    pub fn is_sequence(&self) -> bool {
        matches!(self.container, Container::RawSeq | Container::Ggsq)
    }
}

/// A whole state as owned parts.
#[derive(Debug, Clone, PartialEq)]
pub struct StateParts {
    pub format: Format,
    /// The io header's sequence id (raw sequence bytes with the io magic).
    pub seq_id: Option<i32>,
    /// The GGSQ / GGSN token array, word for word (a llama-server packed blob stays packed).
    pub token_words: Option<Vec<i32>>,
    pub arch: Option<String>,
    pub outputs: Option<OutputParts>,
    pub caches: Vec<CacheParts>,
}

fn slice(buf: &[u8], offset: u64, len: u64) -> Result<&[u8]> {
    let (a, b) = (offset as usize, (offset + len) as usize);
    buf.get(a..b).ok_or_else(|| Error::Truncated {
        field: "rows".into(),
        offset,
        needed: len,
        available: (buf.len() as u64).saturating_sub(offset),
    })
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The rows of a record, read from `src` when written.
fn rows_of(src: &SourceBytes, rec: &Record, cells: usize, on_device: bool) -> Result<Rows> {
    // no row at all: a state whose rows stayed on the device (LLAMA_STATE_SEQ_FLAGS_ON_DEVICE)
    let cells = if on_device { 0 } else { cells };
    let rows = Rows::from_source(
        rec.kind,
        rec.ty,
        rec.n_embd,
        src.clone(),
        rec.data_offset,
        cells,
        rec.transposed,
        rec.header_offset,
    )?;
    if rows.byte_len() as u64 != rec.data_len {
        return Err(Error::format(
            format!("{} record rows", rec.kind),
            rec.header_offset as usize,
            format!("{cells} rows of {} bytes", rows.row_bytes()),
            format!("{} bytes", rec.data_len),
        ));
    }
    Ok(rows)
}

fn cache_parts(src: &SourceBytes, cache: &Cache, on_device: bool) -> Result<CacheParts> {
    let mut streams = Vec::with_capacity(cache.streams.len());
    for s in &cache.streams {
        let n = s.cell_count as usize;
        let cells = (0..n)
            .map(|i| Cell {
                pos: s.pos[i],
                seqs: s.cell_seqs(i).to_vec(),
                ext: s.ext.as_ref().map_or(Vec::new(), |e| {
                    e[i * s.ext_width..(i + 1) * s.ext_width].to_vec()
                }),
            })
            .collect();
        let mut layers = Vec::with_capacity(s.layers.len());
        for l in &s.layers {
            let k = rows_of(src, &l.k, n, on_device)?;
            let v =
                l.v.as_ref()
                    .map(|v| rows_of(src, v, n, on_device))
                    .transpose()?;
            layers.push((k, v));
        }
        streams.push(StreamParts {
            cells,
            v_trans: s.v_trans,
            layers,
            at: s.offset,
        });
    }
    Ok(CacheParts {
        memory: cache.memory,
        streams,
        at: cache.offset,
    })
}

impl StateParts {
    /// The parts of a walked state (`buf` its bytes, `layout` their walk), the bytes copied once
    /// (see [`StateParts::from_source`], which does not copy them).
    pub fn from_layout(buf: &[u8], layout: &Layout) -> Result<StateParts> {
        StateParts::from_source(Arc::new(buf.to_vec()), layout)
    }

    /// The parts of a walked state (`src` its bytes, `layout` their walk): the rows and the
    /// outputs block are read from `src` when written, never copied.
    pub fn from_source(src: SourceBytes, layout: &Layout) -> Result<StateParts> {
        let buf: &[u8] = (*src).as_ref();
        let token_words = match layout.prefix.iter().find(|r| r.what == "tokens") {
            Some(r) => Some(i32s(slice(buf, r.offset, r.nbytes)?)),
            None => None,
        };
        let outputs = match &layout.outputs {
            Some(o) => Some(OutputParts {
                output_pos: o.output_pos.clone(),
                logits: Span::of(&src, o.logits_offset, o.n_logits * 4, "logits")?,
                embd: Span::of(&src, o.embd_offset, o.n_embd * 4, "embeddings")?,
            }),
            None => None,
        };
        let caches = layout
            .caches
            .iter()
            .map(|c| cache_parts(&src, c, layout.rows_on_device))
            .collect::<Result<Vec<_>>>()?;
        Ok(StateParts {
            format: Format::of(layout),
            seq_id: layout.seq_id,
            token_words,
            arch: layout.arch.clone(),
            outputs,
            caches,
        })
    }

    /// The state's bytes in its format.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Write the state's bytes in its format.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        let f = self.format;
        let u32_ = |w: &mut dyn Write, v: u32| w.write_all(&v.to_le_bytes());
        let words = |w: &mut dyn Write, t: &[i32]| -> std::io::Result<()> {
            u32_(w, t.len() as u32)?;
            t.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
        };
        let none: &[i32] = &[];
        let tokens = self.token_words.as_deref().unwrap_or(none);
        match f.container {
            Container::RawSeq => {
                if f.io_magic {
                    u32_(w, IO_MAGIC)?;
                    w.write_all(&self.seq_id.unwrap_or(0).to_le_bytes())?;
                }
            }
            Container::Ggsq => {
                u32_(w, GGSQ_MAGIC)?;
                u32_(w, f.version.unwrap_or(3))?;
                words(w, tokens)?;
            }
            Container::Ggsn => {
                u32_(w, GGSN_MAGIC)?;
                u32_(w, f.version.unwrap_or(10))?;
                words(w, tokens)?;
            }
            Container::RawState => {}
        }
        if !f.is_sequence() {
            let arch = self.arch.as_deref().ok_or_else(|| {
                Error::format(
                    "arch",
                    0,
                    "an architecture name (a whole state starts with it)",
                    "none",
                )
            })?;
            u32_(w, arch.len() as u32)?;
            w.write_all(arch.as_bytes())?;
            if f.outputs {
                let empty = OutputParts {
                    output_pos: vec![],
                    logits: Span::empty(),
                    embd: Span::empty(),
                };
                let o = self.outputs.as_ref().unwrap_or(&empty);
                words(w, &o.output_pos)?;
                w.write_all(&(o.logits.len() as u64 / 4).to_le_bytes())?;
                w.write_all(o.logits.bytes())?;
                w.write_all(&(o.embd.len() as u64 / 4).to_le_bytes())?;
                w.write_all(o.embd.bytes())?;
            }
        }
        for (ci, c) in self.caches.iter().enumerate() {
            write_cache(w, f, ci, c)?;
        }
        Ok(())
    }
}

fn write_cache(w: &mut impl Write, f: Format, ci: usize, c: &CacheParts) -> Result<()> {
    let u32_ = |w: &mut dyn Write, v: u32| w.write_all(&v.to_le_bytes());
    let recurrent = c.memory.is_recurrent();
    if !recurrent {
        if f.n_stream {
            u32_(w, c.streams.len() as u32)?;
        } else if c.streams.len() != 1 {
            return Err(Error::format(
                format!("cache {ci} n_stream"),
                c.at as usize,
                "one stream (the format has no n_stream field)",
                c.streams.len(),
            ));
        }
    }
    let ext_width = f.ext_bytes as usize / 4;
    for s in &c.streams {
        u32_(w, s.cells.len() as u32)?;
        if s.cells.is_empty() && !recurrent {
            continue;
        }
        for cell in &s.cells {
            w.write_all(&cell.pos.to_le_bytes())?;
            u32_(w, cell.seqs.len() as u32)?;
            if !recurrent && !cell.ext.is_empty() {
                for j in 0..ext_width {
                    let v = cell.ext.get(j).copied().unwrap_or(-1);
                    w.write_all(&v.to_le_bytes())?;
                }
            }
            for q in &cell.seqs {
                w.write_all(&q.to_le_bytes())?;
            }
        }
        let n_layer = match c.memory {
            Memory::Recurrent { n_layer } => n_layer,
            Memory::Attention => s.layers.len() as u32,
        };
        u32_(w, s.v_trans as u32)?;
        u32_(w, n_layer)?;
        let n = s.cells.len();
        // rows kept on the device: the headers alone
        let rows = if f.device { 0 } else { n };
        for (k, _) in &s.layers {
            write_rows(w, k, rows, false)?;
        }
        for (_, v) in &s.layers {
            if let Some(v) = v {
                write_rows(w, v, rows, s.v_trans && !recurrent)?;
            }
        }
    }
    Ok(())
}

fn write_rows(w: &mut impl Write, r: &Rows, cells: usize, transposed: bool) -> Result<()> {
    w.write_all(&r.ty.id().to_le_bytes())?;
    let rb = r.row_bytes();
    if r.cells() != cells {
        return Err(Error::format(
            format!("{} record rows", r.kind),
            r.at as usize,
            format!("{cells} rows of {rb} bytes"),
            format!("{} rows", r.cells()),
        ));
    }
    if transposed {
        w.write_all(&(r.ty.block_bytes() as u32).to_le_bytes())?;
        w.write_all(&(r.n_embd as u32).to_le_bytes())?;
    } else {
        w.write_all(&(rb as u64).to_le_bytes())?;
    }
    r.write_rows(w, transposed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::container::{walk, WalkOptions};

    /// A whole state of one stream of two f16 cells, V transposed.
    fn state(v_trans: bool) -> Vec<u8> {
        let mut b = Vec::new();
        let mut w = |v: u32| b.extend(v.to_le_bytes());
        w(5);
        b.extend(b"qwen3");
        let mut w = |v: u32| b.extend(v.to_le_bytes());
        for v in [1, 2, 0, 1, 0, 1, 1, 0, v_trans as u32, 1] {
            w(v);
        }
        b.extend(1i32.to_le_bytes());
        b.extend(4u64.to_le_bytes());
        b.extend([1, 2, 3, 4, 5, 6, 7, 8]);
        b.extend(1i32.to_le_bytes());
        if v_trans {
            b.extend(2u32.to_le_bytes());
            b.extend(2u32.to_le_bytes());
        } else {
            b.extend(4u64.to_le_bytes());
        }
        b.extend([9, 10, 11, 12, 13, 14, 15, 16]);
        b
    }

    #[test]
    fn parts_write_back_the_same_bytes() {
        for t in [false, true] {
            let b = state(t);
            let layout = walk(&b, WalkOptions::default()).unwrap();
            let parts = StateParts::from_layout(&b, &layout).unwrap();
            assert_eq!(parts.to_bytes().unwrap(), b);
            let v = parts.caches[0].streams[0].layers[0].1.as_ref().unwrap();
            if t {
                // element 0 of both cells, then element 1: cell 0's row is elements (9 10, 13 14)
                assert_eq!(&*v.row(0), &[9, 10, 13, 14]);
            } else {
                assert_eq!(&*v.row(0), &[9, 10, 11, 12]);
            }
        }
    }

    #[test]
    fn a_whole_state_needs_its_arch() {
        let b = state(false);
        let layout = walk(&b, WalkOptions::default()).unwrap();
        let mut parts = StateParts::from_layout(&b, &layout).unwrap();
        parts.arch = None;
        assert_eq!(parts.to_bytes().unwrap_err().kind(), "format");
        parts.format = Format::newest(Container::RawSeq);
        let seq = parts.to_bytes().unwrap();
        assert_eq!(&seq[..4], &IO_MAGIC.to_le_bytes());
    }
}
