//! The bytes of a state held elsewhere (object storage), fetched a range at a time into an
//! anonymous map of the object's size (pages never filled cost no memory), with a record of which
//! pages hold the object's bytes; and the probe a walk of such bytes reads through, which records
//! what the walk would have read of pages not fetched yet instead of reading them.
//!
//! The invariant: nothing reads a page that was not filled. The walk reads through a
//! [`crate::format::cursor::Cursor`] whose probe refuses such reads (a walk that refused one is not a
//! result, only a list of ranges to fetch); every pass over rows asks
//! [`crate::State::require`] first, which fails with [`Error::NotFetched`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use memmap2::{MmapMut, MmapRaw};

use crate::error::{Error, Result};

/// Byte ranges: (offset, length).
pub type Ranges = Vec<(u64, u64)>;

/// The unit of filling: a fetched range starts on a page and ends on one (or at the end).
pub const PAGE: u64 = 4096;

/// A sparse copy of an object's bytes.
pub struct Sparse {
    /// None for an object of 0 bytes (an anonymous map cannot be empty).
    map: Option<MmapRaw>,
    len: u64,
    /// One bit per page: filled.
    bits: Vec<AtomicU64>,
    /// Serializes fills (two threads fetching one page write it once).
    fill: Mutex<()>,
    /// Bytes written by `fill` (each page counted once).
    filled: AtomicU64,
    /// Rounds of fetching (each one set of ranges fetched in parallel) and ranges fetched.
    rounds: AtomicU64,
    ranges: AtomicU64,
}

impl Sparse {
    /// An empty copy of an object of `len` bytes; an error naming the size where this machine
    /// cannot map that many (the map, or its page bits, cannot be had: never an abort).
    pub fn new(len: u64) -> Result<Self> {
        let too_large = |why: String| {
            Error::format(
                "object size",
                0,
                "a size this machine can map",
                format!("{len} bytes ({why})"),
            )
        };
        let map = if len == 0 {
            None
        } else {
            let n = usize::try_from(len)
                .map_err(|_| too_large("more than the address space".into()))?;
            let map = MmapMut::map_anon(n).map_err(|e| too_large(format!("mmap: {e}")))?;
            Some(MmapRaw::from(map))
        };
        let words = len.div_ceil(PAGE).div_ceil(64) as usize;
        let mut bits = Vec::new();
        bits.try_reserve_exact(words)
            .map_err(|_| too_large(format!("{words} words of page bits cannot be allocated")))?;
        bits.extend((0..words).map(|_| AtomicU64::new(0)));
        Ok(Sparse {
            map,
            len,
            bits,
            fill: Mutex::new(()),
            filled: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            ranges: AtomicU64::new(0),
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every byte, filled or not (read only the filled ones: see the module's invariant).
    pub fn bytes(&self) -> &[u8] {
        match &self.map {
            // SAFETY: the map spans `len` bytes and lives as long as `self`; pages are written
            // only by `fill`, and only while they are not filled, so no reader that checked
            // `is_filled` sees a byte change (the same standard as a shared map of a file).
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), self.len as usize) },
            None => &[],
        }
    }

    /// Bytes written by `fill` so far.
    pub fn filled_bytes(&self) -> u64 {
        self.filled.load(Ordering::Acquire)
    }

    /// Count a round of fetching `ranges` ranges.
    pub fn count_round(&self, ranges: u64) {
        self.rounds.fetch_add(1, Ordering::AcqRel);
        self.ranges.fetch_add(ranges, Ordering::AcqRel);
    }

    /// (rounds, ranges) fetched so far.
    pub fn rounds(&self) -> (u64, u64) {
        (
            self.rounds.load(Ordering::Acquire),
            self.ranges.load(Ordering::Acquire),
        )
    }

    fn page_filled(&self, page: u64) -> bool {
        let w = self.bits[(page / 64) as usize].load(Ordering::Acquire);
        w & (1 << (page % 64)) != 0
    }

    /// Whether every byte of `offset..offset + len` is filled (an empty range is; a range past
    /// the end is not).
    pub fn is_filled(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = offset.checked_add(len).filter(|e| *e <= self.len) else {
            return false;
        };
        (offset / PAGE..=(end - 1) / PAGE).all(|p| self.page_filled(p))
    }

    /// How many bytes from `offset` on (at most `max`) are filled, without a gap.
    pub fn filled_run(&self, offset: u64, max: u64) -> u64 {
        let end = offset.saturating_add(max).min(self.len);
        let mut p = offset / PAGE;
        while p * PAGE < end && self.page_filled(p) {
            p += 1;
        }
        (p * PAGE).min(end).saturating_sub(offset)
    }

    /// The pages of `offset..offset + len` not filled yet, as page-aligned ranges (the last one
    /// ending at the end of the object at most), adjacent pages merged.
    pub fn gaps(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len).min(self.len);
        let mut out: Vec<(u64, u64)> = Vec::new();
        if offset >= end {
            return out;
        }
        for p in offset / PAGE..=(end - 1) / PAGE {
            if self.page_filled(p) {
                continue;
            }
            let (s, e) = (p * PAGE, ((p + 1) * PAGE).min(self.len));
            match out.last_mut() {
                Some(last) if last.0 + last.1 == s => last.1 = e - last.0,
                _ => out.push((s, e - s)),
            }
        }
        out
    }

    /// Write the object's bytes `data` at `offset` (a page boundary; `data` whole pages, or
    /// reaching the end of the object). Pages already filled are left as they are.
    pub fn fill(&self, offset: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        let end = offset.checked_add(len).filter(|e| *e <= self.len);
        let aligned = offset % PAGE == 0 && (len % PAGE == 0 || end == Some(self.len));
        let (Some(end), true) = (end, aligned) else {
            return Err(Error::format(
                "fetched range",
                offset as usize,
                format!(
                    "whole {PAGE}-byte pages inside the object's {} bytes",
                    self.len
                ),
                format!("{len} bytes at {offset}"),
            ));
        };
        let Some(map) = &self.map else {
            return Ok(());
        };
        let _guard = self.fill.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = offset / PAGE;
        while p * PAGE < end {
            let (s, e) = (p * PAGE, ((p + 1) * PAGE).min(end));
            if !self.page_filled(p) {
                let src = &data[(s - offset) as usize..(e - offset) as usize];
                // SAFETY: `s..e` lies inside the map; the page is not filled, so no pass reads it
                // (passes read filled pages only), and fills are serialized by the lock.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        map.as_mut_ptr().add(s as usize),
                        src.len(),
                    );
                }
                self.bits[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::Release);
                self.filled.fetch_add(e - s, Ordering::AcqRel);
            }
            p += 1;
        }
        Ok(())
    }
}

/// What a walk of sparse bytes would have read of pages not filled: the reads it was refused
/// (`misses`: the walk is no result until they are fetched) and ranges it will likely read next
/// (`hints`: the record headers a stride predicts, a stream's cell metadata), fetched in the same
/// round so that a walk takes a few rounds, not one per record.
pub struct Probe<'a> {
    pub sparse: &'a Sparse,
    misses: Mutex<Vec<(u64, u64)>>,
    hints: Mutex<Vec<(u64, u64)>>,
    /// The largest hint that said what it is (its length and what the header claims), named in
    /// the error of a walk that would fetch more metadata than it may.
    claim: Mutex<Option<(u64, String)>>,
}

impl<'a> Probe<'a> {
    pub fn new(sparse: &'a Sparse) -> Self {
        Probe {
            sparse,
            misses: Mutex::new(Vec::new()),
            hints: Mutex::new(Vec::new()),
            claim: Mutex::new(None),
        }
    }

    /// A read of `offset..offset + len` that found a page not filled.
    pub fn miss(&self, offset: u64, len: u64) {
        self.misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((offset, len));
    }

    /// Bytes likely read next: kept when not filled yet (whether they were).
    pub fn hint(&self, offset: u64, len: u64) -> bool {
        let len = len.min(self.sparse.len.saturating_sub(offset));
        let keep = len > 0 && !self.sparse.is_filled(offset, len);
        if keep {
            self.hints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((offset, len));
        }
        keep
    }

    /// [`Probe::hint`] of bytes a header claims (`what`: the field, its offset and what it
    /// claims, formatted only when the hint is the largest yet).
    pub fn hint_claimed(&self, offset: u64, len: u64, what: impl FnOnce() -> String) {
        if !self.hint(offset, len) {
            return;
        }
        let mut claim = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        if claim.as_ref().is_none_or(|(n, _)| len > *n) {
            *claim = Some((len, what()));
        }
    }

    /// (misses, hints, the largest claim).
    pub fn take(self) -> (Ranges, Ranges, Option<String>) {
        (
            self.misses.into_inner().unwrap_or_else(|e| e.into_inner()),
            self.hints.into_inner().unwrap_or_else(|e| e.into_inner()),
            self.claim
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .map(|(_, w)| w),
        )
    }
}

/// The ranges to fetch for `wanted` (offset, length) ranges of `sparse`: each widened by
/// `ahead` bytes after it, then cut to the pages not filled, merged where they touch and split
/// into pieces of at most `piece` bytes (fetched in parallel).
pub fn plan(sparse: &Sparse, wanted: &[(u64, u64)], ahead: u64, piece: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = wanted
        .iter()
        .map(|&(o, l)| (o, o.saturating_add(l).saturating_add(ahead)))
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in spans {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let piece = piece.max(PAGE) / PAGE * PAGE;
    let mut out = Vec::new();
    for (s, e) in merged {
        for (o, l) in sparse.gaps(s, e - s) {
            let mut at = o;
            while at < o + l {
                let n = piece.min(o + l - at);
                out.push((at, n));
                at += n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_pages_and_reports_gaps() {
        let s = Sparse::new(3 * PAGE + 10).unwrap();
        assert!(!s.is_filled(0, 1));
        assert!(s.is_filled(5, 0));
        assert_eq!(s.gaps(0, s.len()), vec![(0, 3 * PAGE + 10)]);
        let page: Vec<u8> = (0..PAGE).map(|i| i as u8).collect();
        s.fill(PAGE, &page).unwrap();
        assert!(s.is_filled(PAGE, PAGE));
        assert!(!s.is_filled(PAGE, PAGE + 1));
        assert_eq!(s.bytes()[PAGE as usize + 7], 7);
        assert_eq!(s.filled_run(PAGE + 4, 1 << 20), PAGE - 4);
        assert_eq!(s.filled_run(0, 10), 0);
        assert_eq!(s.gaps(0, s.len()), vec![(0, PAGE), (2 * PAGE, PAGE + 10)]);
        // the tail: a short last page
        s.fill(3 * PAGE, &[9u8; 10]).unwrap();
        assert!(s.is_filled(3 * PAGE, 10));
        assert!(!s.is_filled(3 * PAGE, 11));
        assert_eq!(s.filled_bytes(), PAGE + 10);
        // refilling a filled page changes nothing and counts nothing
        s.fill(PAGE, &vec![0u8; PAGE as usize]).unwrap();
        assert_eq!(s.bytes()[PAGE as usize + 7], 7);
        assert_eq!(s.filled_bytes(), PAGE + 10);
        // unaligned fills are refused
        assert!(s.fill(1, &[0u8; 4]).is_err());
        assert!(s.fill(0, &[0u8; 4]).is_err());
        assert!(s.fill(3 * PAGE, &[0u8; 11]).is_err());
    }

    #[test]
    fn plans_merge_widen_and_split() {
        let s = Sparse::new(10 * PAGE).unwrap();
        s.fill(2 * PAGE, &vec![0u8; PAGE as usize]).unwrap();
        // two reads close together, widened by a page, the filled page left out
        let p = plan(&s, &[(10, 4), (PAGE + 5, 4)], PAGE, 1 << 20);
        assert_eq!(p, vec![(0, 2 * PAGE)]);
        let p = plan(&s, &[(0, 10 * PAGE)], 0, 3 * PAGE);
        assert_eq!(
            p,
            vec![
                (0, 2 * PAGE),
                (3 * PAGE, 3 * PAGE),
                (6 * PAGE, 3 * PAGE),
                (9 * PAGE, PAGE)
            ]
        );
        assert!(plan(&s, &[], 0, PAGE).is_empty());
    }

    #[test]
    fn sizes_that_cannot_be_mapped_are_errors_naming_the_size() {
        for len in [1u64 << 60, 1_000_000_000_000_000_000, u64::MAX] {
            let e = Sparse::new(len).err().expect("no map of that size");
            let text = e.to_string();
            assert!(text.contains(&format!("{len} bytes")), "{text}");
            assert!(text.contains("object size"), "{text}");
        }
    }

    #[test]
    fn an_empty_object_has_no_pages() {
        let s = Sparse::new(0).unwrap();
        assert!(s.bytes().is_empty());
        assert!(s.is_filled(0, 0));
        assert!(!s.is_filled(0, 1));
        s.fill(0, &[]).unwrap();
    }
}
