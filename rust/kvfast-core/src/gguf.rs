//! The key-value header of a GGUF model file (the tensors are never read).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::cursor::Cursor;
use crate::error::{Error, Result};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Arrays longer than this (vocabularies) are skipped, their length kept.
const MAX_KEPT_ARRAY: u64 = 65_536;
/// How much of the file a header may span.
const MAX_HEADER: u64 = 1 << 30;

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
pub fn read_metadata(path: impl AsRef<Path>) -> Result<Vec<(String, Value)>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut buf = Vec::new();
    file.take(len.min(MAX_HEADER)).read_to_end(&mut buf)?;
    parse_metadata(&buf)
}

pub fn parse_metadata(buf: &[u8]) -> Result<Vec<(String, Value)>> {
    let mut cur = Cursor::new(buf, 0);
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
    if n_kv.saturating_mul(12) > cur.remaining() as u64 {
        return Err(Error::format(
            "GGUF n_kv",
            n_kv_off,
            "a count that fits the file",
            n_kv,
        ));
    }
    let mut out = Vec::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = string(&mut cur, &format!("GGUF key {i}"))?;
        let t_off = cur.pos();
        let ty = cur.u32(&format!("GGUF type of {key}"))?;
        let v = value(&mut cur, ty, t_off, &key)?;
        out.push((key, v));
    }
    Ok(out)
}

fn string(cur: &mut Cursor, field: &str) -> Result<String> {
    let n = cur.u64(&format!("{field} length"))?;
    let b = cur.take(n, field)?;
    Ok(String::from_utf8_lossy(b).into_owned())
}

fn value(cur: &mut Cursor, ty: u32, t_off: usize, key: &str) -> Result<Value> {
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
        8 => Value::Str(string(cur, key)?),
        9 => {
            let et_off = cur.pos();
            let et = cur.u32(&format!("{key} element type"))?;
            if et == 9 {
                return Err(Error::format(
                    format!("{key} element type"),
                    et_off,
                    "a scalar or string type",
                    et,
                ));
            }
            let n = cur.u64(&format!("{key} length"))?;
            if n > cur.remaining() as u64 {
                return Err(Error::format(
                    format!("{key} length"),
                    et_off + 4,
                    "a count that fits the file",
                    n,
                ));
            }
            if n > MAX_KEPT_ARRAY {
                for _ in 0..n {
                    value(cur, et, et_off, key)?;
                }
                Value::SkippedArray(n)
            } else {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(value(cur, et, et_off, key)?);
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
