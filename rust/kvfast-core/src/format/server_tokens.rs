//! llama-server's packed token blob (5d9e5ac30, August 2026; `server_tokens::serialize` in
//! tools/server/server-common.cpp): since then a slot save passes these int32 words as the GGSQ
//! token array instead of the tokens themselves:
//!
//! ```text
//! i32 -1 (marker), u32 version (1), u32 n, i32 tokens[n], u32 n_media, u32 start[n_media],
//! then per media chunk: u32 nbytes, nbytes bytes; the whole blob zero-padded to 4 bytes
//! ```
//!
//! A first word other than -1 is a plain token list (older servers, the C API).

use crate::error::{Error, Result};

/// The only blob version llama.cpp writes (SERVER_TOKENS_STATE_VERSION).
pub const VERSION: u32 = 1;

/// One media chunk (an image or audio clip) of a multimodal prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    /// Index of the chunk's first token in the token list.
    pub start: u32,
    /// Byte offset of the chunk's bytes in the file.
    pub offset: u64,
    pub nbytes: u64,
}

/// What a packed blob holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTokens {
    pub version: u32,
    pub tokens: Vec<i32>,
    pub media: Vec<Media>,
}

/// Unpack `words` (the GGSQ token array, whose first word is at byte `at` of the file), or None
/// when they are a plain token list.
pub fn unpack(words: &[i32], at: usize) -> Result<Option<ServerTokens>> {
    if words.first() != Some(&-1) {
        return Ok(None);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut r = Reader {
        b: &bytes,
        pos: 4,
        at,
    };
    let version = r.u32("server token blob version")?;
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            container: "llama-server token blob",
            offset: (at + 4) as u64,
            version,
            supported: "1",
        });
    }
    let n = r.count("server token blob n_tokens", 4)?;
    let tokens = (0..n)
        .map(|_| r.u32("server token blob token").map(|t| t as i32))
        .collect::<Result<Vec<_>>>()?;
    let n_media = r.count("server token blob n_media", 4)?;
    let starts_at = r.pos;
    let starts = (0..n_media)
        .map(|_| r.u32("server token blob media start"))
        .collect::<Result<Vec<_>>>()?;
    let mut media = Vec::with_capacity(starts.len());
    for (i, start) in starts.into_iter().enumerate() {
        if start as usize >= tokens.len() {
            return Err(Error::format(
                format!("server token blob media {i} start"),
                at + starts_at + 4 * i,
                format!("a token index below {}", tokens.len()),
                start,
            ));
        }
        let len = r.count(&format!("server token blob media {i} size"), 1)?;
        if len == 0 {
            return Err(Error::format(
                format!("server token blob media {i} size"),
                at + r.pos - 4,
                "a non-empty media chunk",
                0,
            ));
        }
        media.push(Media {
            start,
            offset: (at + r.pos) as u64,
            nbytes: len as u64,
        });
        r.pos += len;
    }
    let rest = &bytes[r.pos..];
    if rest.len() >= 4 || rest.iter().any(|b| *b != 0) {
        return Err(Error::format(
            "server token blob end",
            at + r.pos,
            "the end of the token array (at most 3 zero bytes of padding)",
            format!("{} more bytes", rest.len()),
        ));
    }
    Ok(Some(ServerTokens {
        version,
        tokens,
        media,
    }))
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self, field: &str) -> Result<u32> {
        let Some(s) = self.b.get(self.pos..self.pos + 4) else {
            return Err(self.truncated(field, 4));
        };
        self.pos += 4;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// A count of items of `size` bytes, checked against the bytes left before anything is
    /// allocated by it.
    fn count(&mut self, field: &str, size: usize) -> Result<usize> {
        let n = self.u32(field)? as usize;
        let left = self.b.len() - self.pos;
        if n.saturating_mul(size) > left {
            return Err(Error::Truncated {
                field: format!("{field} ({n} items)"),
                offset: (self.at + self.pos) as u64,
                needed: (n as u64).saturating_mul(size as u64),
                available: left as u64,
            });
        }
        Ok(n)
    }

    fn truncated(&self, field: &str, needed: u64) -> Error {
        Error::Truncated {
            field: field.to_string(),
            offset: (self.at + self.pos) as u64,
            needed,
            available: (self.b.len() - self.pos) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(tokens: &[i32], media: &[(u32, &[u8])], version: u32) -> Vec<i32> {
        let mut b: Vec<u8> = vec![];
        b.extend((-1i32).to_le_bytes());
        b.extend(version.to_le_bytes());
        b.extend((tokens.len() as u32).to_le_bytes());
        tokens.iter().for_each(|t| b.extend(t.to_le_bytes()));
        b.extend((media.len() as u32).to_le_bytes());
        media.iter().for_each(|m| b.extend(m.0.to_le_bytes()));
        for m in media {
            b.extend((m.1.len() as u32).to_le_bytes());
            b.extend(m.1);
        }
        while b.len() % 4 != 0 {
            b.push(0);
        }
        b.chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn plain_lists_pass_through() {
        assert_eq!(unpack(&[2, 818, 5279], 12).unwrap(), None);
        assert_eq!(unpack(&[], 12).unwrap(), None);
    }

    #[test]
    fn tokens_and_media() {
        let w = blob(&[2, 818, 5279, 7], &[(1, b"abcde")], 1);
        let st = unpack(&w, 12).unwrap().unwrap();
        assert_eq!(st.tokens, vec![2, 818, 5279, 7]);
        assert_eq!(st.media.len(), 1);
        assert_eq!(st.media[0].start, 1);
        assert_eq!(st.media[0].nbytes, 5);
        // marker, version, n, 4 tokens, n_media, start, size: 10 words before the bytes
        assert_eq!(st.media[0].offset, 12 + 40);
    }

    #[test]
    fn bad_blobs_are_errors() {
        let e = unpack(&blob(&[2], &[], 2), 12).unwrap_err();
        assert_eq!(e.kind(), "unsupported_version");
        let mut w = blob(&[2, 3], &[], 1);
        w[2] = 1000;
        assert_eq!(unpack(&w, 12).unwrap_err().kind(), "truncated");
        let mut w = blob(&[2, 3], &[], 1);
        w.push(0);
        assert_eq!(unpack(&w, 12).unwrap_err().kind(), "format");
    }
}
