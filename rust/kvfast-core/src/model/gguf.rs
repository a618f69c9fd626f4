//! The key-value header of a GGUF model file (the tensors are never read).

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::cursor::Cursor;
use crate::source::file::open_regular;

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Arrays longer than this (vocabularies) are skipped, their length kept.
const MAX_KEPT_ARRAY: u64 = 65_536;
/// How much of the file a header may span.
const MAX_HEADER: u64 = 1 << 30;
/// The first read of a header; each further one reads four times as much (headers of real
/// models, vocabularies included, span a few MiB).
const FIRST_READ: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    /// An array too long to keep (a vocabulary): its element count.
    SkippedArray(u64),
}

/// Read a GGUF file's metadata: `(key, value)` in file order.
///
/// Only a regular file is opened (a FIFO is refused, never waited on), and only as much of it is
/// read as the header spans: 1 MiB first, then four times more while the header runs past what
/// was read, up to the file's size and at most 1 GiB. Memory is bounded by the header, not the
/// file; every count in the header is checked against the bytes before anything is allocated.
pub fn read_metadata(path: impl AsRef<Path>) -> Result<Vec<(String, Value)>> {
    read_header(path.as_ref(), None)
}

/// The model's vocabulary (`tokenizer.ggml.tokens`: the piece of each token id), read from the
/// header alone with the same bounds as [`read_metadata`]; None when the model has none.
pub fn read_vocab(path: impl AsRef<Path>) -> Result<Option<Vec<String>>> {
    let kvs = read_header(path.as_ref(), Some(VOCAB))?;
    for (k, v) in kvs {
        if k == VOCAB {
            return match v {
                Value::Array(items) => Ok(Some(
                    items
                        .into_iter()
                        .map(|i| match i {
                            Value::Str(s) => s,
                            other => format!("{other:?}"),
                        })
                        .collect(),
                )),
                _ => Err(Error::format(
                    VOCAB,
                    0,
                    "an array of strings",
                    "another type",
                )),
            };
        }
    }
    Ok(None)
}

/// The key of a GGUF model's vocabulary.
pub const VOCAB: &str = "tokenizer.ggml.tokens";

fn read_header(path: &Path, keep: Option<&str>) -> Result<Vec<(String, Value)>> {
    let (mut file, meta) = open_regular(path)?;
    let limit = meta.len().min(MAX_HEADER);
    let mut buf = Vec::new();
    let mut want = FIRST_READ.min(limit);
    loop {
        let have = buf.len() as u64;
        (&mut file)
            .take(want - have)
            .read_to_end(&mut buf)
            .map_err(|source| Error::File {
                path: path.to_path_buf(),
                source,
            })?;
        match parse_header(&buf, meta.len(), keep) {
            Err(Error::Truncated { .. }) if buf.len() as u64 == want && want < limit => {
                want = want.saturating_mul(4).min(limit);
            }
            r => return r,
        }
    }
}

/// Parse a whole GGUF header held in `buf`.
pub fn parse_metadata(buf: &[u8]) -> Result<Vec<(String, Value)>> {
    parse_header(buf, buf.len() as u64, None)
}

/// A cursor over the first bytes of a file of `file_len` bytes: a count that cannot fit the file
/// is a format error, one that only runs past the bytes read so far is a truncation (read more).
struct Header<'a> {
    cur: Cursor<'a>,
    file_len: u64,
    /// An array key kept whatever its length (the vocabulary, when asked for).
    keep: Option<&'a str>,
}

impl Header<'_> {
    /// Check that `n` more bytes (what a count at `off` asks for) can follow.
    fn fits(&self, n: u64, field: &str, off: usize) -> Result<()> {
        let in_file = self.file_len.saturating_sub(self.cur.pos() as u64);
        if n > in_file {
            return Err(Error::format(
                field,
                off,
                format!("a count that fits the file ({in_file} bytes left)"),
                format!("one needing {n} bytes"),
            ));
        }
        if n > self.cur.remaining() as u64 {
            return Err(Error::Truncated {
                field: field.to_string(),
                offset: off as u64,
                needed: n,
                available: self.cur.remaining() as u64,
            });
        }
        Ok(())
    }
}

fn parse_header<'a>(
    buf: &'a [u8],
    file_len: u64,
    keep: Option<&'a str>,
) -> Result<Vec<(String, Value)>> {
    let mut h = Header {
        cur: Cursor::new(buf, 0),
        file_len,
        keep,
    };
    let cur = &mut h.cur;
    let magic = cur.take(4, "GGUF magic")?;
    if magic != GGUF_MAGIC {
        return Err(Error::format(
            "GGUF magic",
            0,
            "\"GGUF\"",
            String::from_utf8_lossy(magic).escape_debug(),
        ));
    }
    let version = cur.u32("GGUF version")?;
    if !(2..=3).contains(&version) {
        return Err(Error::UnsupportedVersion {
            container: "GGUF",
            offset: 4,
            version,
            supported: "2 and 3",
        });
    }
    let _n_tensors = cur.u64("GGUF n_tensors")?;
    let n_kv_off = cur.pos();
    let n_kv = cur.u64("GGUF n_kv")?;
    // Each pair takes at least 12 bytes.
    h.fits(n_kv.saturating_mul(12), "GGUF n_kv", n_kv_off)?;
    let mut out = Vec::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = string(&mut h, &format!("GGUF key {i}"))?;
        let t_off = h.cur.pos();
        let ty = h.cur.u32(&format!("GGUF type of {key}"))?;
        let v = value(&mut h, ty, t_off, &key)?;
        out.push((key, v));
    }
    Ok(out)
}

fn string(h: &mut Header, field: &str) -> Result<String> {
    let off = h.cur.pos();
    let n = h.cur.u64(&format!("{field} length"))?;
    h.fits(n, &format!("{field} length"), off)?;
    let b = h.cur.take(n, field)?;
    Ok(String::from_utf8_lossy(b).into_owned())
}

/// Bytes of one value of a scalar type (a string: its length field at least).
fn min_size(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        _ => 8,
    }
}

fn value(h: &mut Header, ty: u32, t_off: usize, key: &str) -> Result<Value> {
    let cur = &mut h.cur;
    Ok(match ty {
        0 => Value::Int(cur.take(1, key)?[0] as i64),
        1 => Value::Int(cur.take(1, key)?[0] as i8 as i64),
        2 => {
            let b = cur.take(2, key)?;
            Value::Int(u16::from_le_bytes([b[0], b[1]]) as i64)
        }
        3 => {
            let b = cur.take(2, key)?;
            Value::Int(i16::from_le_bytes([b[0], b[1]]) as i64)
        }
        4 => Value::Int(cur.u32(key)? as i64),
        5 => Value::Int(cur.i32(key)? as i64),
        6 => Value::Float(f32::from_bits(cur.u32(key)?) as f64),
        7 => Value::Bool(cur.take(1, key)?[0] != 0),
        8 => Value::Str(string(h, key)?),
        9 => {
            let et_off = cur.pos();
            let et = cur.u32(&format!("{key} element type"))?;
            if et == 9 || et > 12 {
                return Err(Error::format(
                    format!("{key} element type"),
                    et_off,
                    "a scalar or string type (0 to 8, 10 to 12)",
                    et,
                ));
            }
            let n = cur.u64(&format!("{key} length"))?;
            h.fits(
                n.saturating_mul(min_size(et)),
                &format!("{key} length ({n} array elements)"),
                et_off + 4,
            )?;
            if n > MAX_KEPT_ARRAY && h.keep != Some(key) {
                for _ in 0..n {
                    value(h, et, et_off, key)?;
                }
                Value::SkippedArray(n)
            } else {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(value(h, et, et_off, key)?);
                }
                Value::Array(items)
            }
        }
        10 => Value::Int(cur.u64(key)? as i64),
        11 => Value::Int(cur.u64(key)? as i64),
        12 => Value::Float(f64::from_bits(cur.u64(key)?)),
        _ => {
            return Err(Error::format(
                format!("GGUF type of {key}"),
                t_off,
                "a GGUF value type 0 to 12",
                ty,
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        b
    }

    #[test]
    fn counts_past_the_file_are_format_errors_and_past_the_buffer_truncations() {
        let arr = |n: u64| {
            let mut v = 4u32.to_le_bytes().to_vec();
            v.extend(n.to_le_bytes());
            v
        };
        let b = header(&[("a", 9, arr(1 << 40))]);
        match parse_header(&b, b.len() as u64, None) {
            Err(Error::Format { field, offset, .. }) => {
                assert!(field.starts_with("a length"), "{field}");
                assert_eq!(offset, 24 + 8 + 1 + 4 + 4);
            }
            other => panic!("{other:?}"),
        }
        // the same count in the first MiB of a file that has the bytes: read more
        let b = header(&[("a", 9, arr(1000))]);
        assert!(matches!(
            parse_header(&b, 1 << 20, None),
            Err(Error::Truncated { .. })
        ));
        let mut b = header(&[]);
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            parse_metadata(&b),
            Err(Error::Format { offset: 16, .. })
        ));
    }

    #[test]
    fn a_header_larger_than_the_first_read_is_read_whole() {
        // a 3 MB string, then a key after it
        let mut long = 3_000_000u64.to_le_bytes().to_vec();
        long.extend(std::iter::repeat_n(b'x', 3_000_000));
        let b = header(&[("s", 8, long), ("k", 4, 7u32.to_le_bytes().to_vec())]);
        let dir = std::env::temp_dir().join(format!("kvfast-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("long.gguf");
        let mut file = b.clone();
        file.extend(std::iter::repeat_n(0u8, 5_000_000)); // tensor data, never read
        std::fs::write(&p, &file).unwrap();
        let kv = read_metadata(&p).unwrap();
        assert_eq!(kv[1], ("k".to_string(), Value::Int(7)));
        std::fs::remove_file(&p).unwrap();
    }
}
