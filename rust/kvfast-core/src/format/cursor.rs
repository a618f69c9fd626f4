//! A bounds-checked little-endian reader over a byte slice.
//!
//! Over the sparse bytes of a remote state ([`Bytes::probed`]) every read is also checked against
//! the pages fetched: a read of a page not fetched records what it needed in the probe and fails
//! with [`Error::NotFetched`] instead of reading (a walk that failed so is no result, only a list
//! of ranges to fetch). Skipping bytes (rows) reads nothing and needs nothing fetched.

use crate::error::{Error, Result};
use crate::source::sparse::Probe;

/// Bytes a walk reads: a slice, and for the sparse bytes of a remote state the probe that
/// checks each read against the pages fetched.
#[derive(Clone, Copy)]
pub struct Bytes<'a> {
    pub buf: &'a [u8],
    pub probe: Option<&'a Probe<'a>>,
}

impl<'a> Bytes<'a> {
    /// Bytes that are all there (a mapped or owned state).
    pub fn whole(buf: &'a [u8]) -> Self {
        Bytes { buf, probe: None }
    }

    /// The sparse bytes of a remote state, read through `probe`.
    pub fn probed(probe: &'a Probe<'a>) -> Self {
        Bytes {
            buf: probe.sparse.bytes(),
            probe: Some(probe),
        }
    }
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf
    }
}

#[derive(Clone, Copy)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    probe: Option<&'a Probe<'a>>,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], pos: usize) -> Self {
        Cursor {
            buf,
            pos,
            probe: None,
        }
    }

    /// A cursor over `bytes` (checked against the pages fetched when they are sparse).
    pub fn at(bytes: Bytes<'a>, pos: usize) -> Self {
        Cursor {
            buf: bytes.buf,
            pos,
            probe: bytes.probe,
        }
    }

    /// Say that `len` bytes from `offset` will likely be read soon (a remote state fetches them
    /// in the round that fetches what was missed); nothing for bytes that are all there.
    pub fn hint(&self, offset: u64, len: u64) {
        if let Some(p) = self.probe {
            let _ = p.hint(offset, len);
        }
    }

    /// [`Cursor::hint`] of bytes a header claims, `what` naming the field and the claim (said
    /// when a remote walk would fetch more than it may).
    pub fn hint_claimed(&self, offset: u64, len: u64, what: impl FnOnce() -> String) {
        if let Some(p) = self.probe {
            p.hint_claimed(offset, len, what);
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Hint the `header` bytes at each of `count` records of `stride` bytes from `from` on: the
    /// headers a run of equal records will have (a remote state's walk fetches them in one round
    /// instead of one round per record; a wrong guess costs a page, and a round later).
    pub fn hint_strided(&self, from: u64, stride: u64, count: u64, header: u64) {
        if self.probe.is_none() || stride == 0 {
            return;
        }
        for k in 0..count {
            let at = from.saturating_add(k.saturating_mul(stride));
            if at >= self.buf.len() as u64 {
                break;
            }
            self.hint(at, header);
        }
    }

    /// The bytes not read yet (of sparse bytes: as far as they are fetched without a gap).
    pub fn rest(&self) -> &'a [u8] {
        match self.probe {
            None => &self.buf[self.pos..],
            Some(p) => {
                let run = p
                    .sparse
                    .filled_run(self.pos as u64, self.remaining() as u64);
                &self.buf[self.pos..self.pos + run as usize]
            }
        }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// Fail naming `field` unless `n` bytes are left.
    fn need(&self, n: u64, field: &str) -> Result<()> {
        let available = self.remaining() as u64;
        if n > available {
            return Err(Error::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                needed: n,
                available,
            });
        }
        Ok(())
    }

    /// Take `n` bytes, or fail naming `field`.
    pub fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        self.need(n, field)?;
        let start = self.pos;
        if let Some(p) = self.probe {
            if !p.sparse.is_filled(start as u64, n) {
                p.miss(start as u64, n);
                return Err(Error::NotFetched {
                    field: field.to_string(),
                    offset: start as u64,
                    len: n,
                });
            }
        }
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    /// Step over `n` bytes (rows) without reading them, or fail naming `field`.
    pub fn skip(&mut self, n: u64, field: &str) -> Result<usize> {
        self.need(n, field)?;
        let start = self.pos;
        self.pos += n as usize;
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

/// Hint the headers of the `count` records after `rec` (read last), taken to be of its size,
/// when its size differs from the last one hinted (`stride`): a remote state's walk then fetches
/// a stream's record headers in a round or two, not one round per record.
pub(crate) fn predict(
    cur: &Cursor,
    rec: &crate::format::layout::Record,
    stride: &mut Option<u64>,
    count: u32,
) {
    let size = rec.header_len + rec.data_len;
    if *stride != Some(size) {
        *stride = Some(size);
        cur.hint_strided(cur.pos() as u64, size, count as u64, rec.header_len);
    }
}
