//! A bounds-checked little-endian reader over a byte slice.

use crate::error::{Error, Result};

#[derive(Clone, Copy)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], pos: usize) -> Self {
        Cursor { buf, pos }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// Take `n` bytes, or fail naming `field`.
    pub fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        let available = self.remaining() as u64;
        if n > available {
            return Err(Error::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    pub fn skip(&mut self, n: u64, field: &str) -> Result<usize> {
        let start = self.pos;
        self.take(n, field)?;
        Ok(start)
    }

    pub fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32(&mut self, field: &str) -> Result<i32> {
        Ok(self.u32(field)? as i32)
    }

    pub fn u64(&mut self, field: &str) -> Result<u64> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Read a u32 that must lie in `lo..=hi`, or fail naming the field, its offset and the range.
    pub fn u32_in(&mut self, field: &str, lo: u32, hi: u32) -> Result<u32> {
        let at = self.pos;
        let v = self.u32(field)?;
        if v < lo || v > hi {
            let expected = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return Err(Error::format(field, at, expected, v));
        }
        Ok(v)
    }

    /// Read `n` i32 values, `n` checked against the bytes left before anything is allocated.
    pub fn i32_array(&mut self, n: u64, field: &str) -> Result<Vec<i32>> {
        let bytes = n.checked_mul(4).ok_or_else(|| Error::Truncated {
            field: field.to_string(),
            offset: self.pos as u64,
            needed: u64::MAX,
            available: self.remaining() as u64,
        })?;
        let b = self.take(bytes, field)?;
        Ok(b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
