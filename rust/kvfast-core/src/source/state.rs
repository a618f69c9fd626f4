//! A state file mapped into memory (or read into it), with its walked layout.

use std::io::Read;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::format::container::{walk, walk_bytes, WalkOptions};
use crate::format::cursor::Bytes;
use crate::format::layout::{Layout, Record};
use crate::plan::select::Job;
use crate::source::file::{open_regular, Watched};
use crate::source::sparse::{plan, Probe, Sparse, PAGE};
use crate::values::view::RecordView;

/// The bytes of a state: a read-only memory map, owned bytes (read from a file, tests,
/// in-memory states), or the sparse copy of a remote object (only the pages fetched hold its
/// bytes: see [`crate::source::sparse`]).
pub enum Data {
    Map(Mmap),
    Owned(Vec<u8>),
    Sparse(Sparse),
}

impl Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Map(m) => m,
            Data::Owned(v) => v,
            Data::Sparse(s) => s.bytes(),
        }
    }
}

impl AsRef<[u8]> for Data {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// How a remote object is fetched: bytes of its start fetched in the first round of its walk,
/// bytes fetched after each read the walk missed (it reads on from there), the largest range one
/// request fetches (longer ones are split, to be fetched in parallel), and the most bytes a walk
/// may fetch in all (the head included): a state's metadata (12 bytes a cell, a header a
/// record) is a small part of it, so a header claiming more cells than a state of its object
/// can hold is refused before its cells are fetched, not after gigabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub head: u64,
    pub ahead: u64,
    pub piece: u64,
    pub metadata: u64,
}

/// The bytes a remote walk fetches at most by default: the metadata of a state of 20 million
/// cells (see [`Policy`]).
pub const METADATA_LIMIT: u64 = 256 << 20;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            head: 256 << 10,
            ahead: 64 << 10,
            piece: 8 << 20,
            metadata: METADATA_LIMIT,
        }
    }
}

/// One step of walking a remote object: the layout (or the error the walk ends with), the
/// ranges to fetch before walking again, or a refusal to fetch them (more than
/// [`Policy::metadata`] in all).
pub enum Step {
    Done(Box<Result<Layout>>),
    Fetch(Vec<(u64, u64)>),
    Refused(Refusal),
}

/// A walk that would fetch more metadata than it may: what it fetched, what it would fetch
/// next, the limit, and what the header claims that needs it (the largest claim, where one
/// said so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub fetched: u64,
    pub wanted: u64,
    pub at: u64,
    pub limit: u64,
    pub claim: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "walking its metadata would fetch {} more bytes from byte {} after {} ({}), more than \
             the {} bytes a remote open fetches at most (a state's metadata, 12 bytes a cell and \
             a header a record, is a small part of it)",
            self.wanted,
            self.at,
            self.fetched,
            self.claim
                .as_deref()
                .unwrap_or("the walk's reads and the record headers it predicts"),
            self.limit
        )
    }
}

/// Walk the sparse copy `sparse` as far as it is fetched. A walk that read no byte not fetched
/// is the walk of the whole object (it read the same bytes); otherwise its result means nothing,
/// and the ranges it missed (widened by `policy.ahead`) and those it hinted are to be fetched,
/// unless that brings what was fetched past `policy.metadata`.
/// Nothing fetched yet: the object's first `policy.head` bytes.
pub fn walk_step(sparse: &Sparse, opts: WalkOptions, policy: Policy) -> Step {
    if sparse.filled_bytes() == 0 && !sparse.is_empty() {
        let head = policy.head.max(1).min(policy.metadata.max(PAGE));
        return Step::Fetch(plan(sparse, &[(0, head)], 0, policy.piece));
    }
    let probe = Probe::new(sparse);
    let walked = walk_bytes(Bytes::probed(&probe), opts);
    let (misses, hints, claim) = probe.take();
    if misses.is_empty() {
        return Step::Done(Box::new(walked));
    }
    // one plan for both, so that no page is fetched twice
    let mut wanted: Vec<(u64, u64)> = misses
        .iter()
        .map(|&(o, n)| (o, n.saturating_add(policy.ahead)))
        .collect();
    wanted.extend(hints);
    let want = plan(sparse, &wanted, 0, policy.piece);
    if want.is_empty() {
        // never: a miss is a read of a page not fetched, which the plan fetches
        let (offset, len) = misses[0];
        return Step::Done(Box::new(Err(Error::NotFetched {
            field: "the walk".into(),
            offset,
            len,
        })));
    }
    let more: u64 = want.iter().map(|r| r.1).sum();
    if sparse.filled_bytes().saturating_add(more) > policy.metadata {
        return Step::Refused(Refusal {
            fetched: sparse.filled_bytes(),
            wanted: more,
            at: want[0].0,
            limit: policy.metadata,
            claim,
        });
    }
    Step::Fetch(want)
}

/// Fill `sparse` with the bytes fetched for `ranges`, each checked to be as long as asked (a
/// shorter answer: the object changed while it was read).
pub fn fill_fetched(sparse: &Sparse, ranges: &[(u64, u64)], got: &[&[u8]]) -> Result<()> {
    if got.len() != ranges.len() {
        return Err(Error::format(
            "fetched ranges",
            0,
            format!("{} ranges", ranges.len()),
            got.len(),
        ));
    }
    for (&(o, n), b) in ranges.iter().zip(got) {
        if b.len() as u64 != n {
            return Err(Error::Changed {
                path: "the remote object".into(),
                what: format!(
                    "{n} bytes asked at byte {o} of its {} bytes, {} came back",
                    sparse.len(),
                    b.len()
                ),
            });
        }
        sparse.fill(o, b)?;
    }
    sparse.count_round(ranges.len() as u64);
    Ok(())
}

/// A walked state: its bytes (shared, so views can outlive the handle) and its layout.
pub struct State {
    pub data: Arc<Data>,
    pub layout: Layout,
    /// The mapped file, watched for changes (None for owned bytes, which cannot change).
    source: Option<Watched>,
    /// How a remote state fetches bytes a pass needs that are not fetched yet (None: it does
    /// not, and such a read fails with [`Error::NotFetched`]).
    fetch: Option<Box<Fetch>>,
}

/// Fetch byte ranges (offset, length) of a remote object: their bytes, in order.
pub type Fetch = dyn Fn(&[(u64, u64)]) -> Result<Vec<Vec<u8>>> + Send + Sync;

impl State {
    /// Map `path` and walk it. Costs time in proportion to the metadata, not the rows.
    ///
    /// Only a regular file is opened (a FIFO or a device is refused, never waited on). The map
    /// is shared with the file: another process that truncates or rewrites the file changes
    /// what the map holds, so [`State::check_unchanged`] is called before each pass.
    pub fn open(path: impl AsRef<Path>, opts: WalkOptions) -> Result<Self> {
        let path = path.as_ref();
        let (file, meta) = open_regular(path)?;
        let data = if meta.len() == 0 {
            Data::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only. Another process may still truncate or rewrite the
            // file while it is mapped; `check_unchanged` detects that before each pass, and
            // `read` gives a copy immune to it.
            Data::Map(unsafe { Mmap::map(&file) }.map_err(|source| Error::File {
                path: path.to_path_buf(),
                source,
            })?)
        };
        let watched = Watched::new(path.to_path_buf(), file, &meta);
        let mut sf = Self::from_data(data, opts)?;
        sf.source = Some(watched);
        Ok(sf)
    }

    /// Walk a remote object of `size` bytes, fetching with `fetch` (ranges in, their bytes out,
    /// in order) only what the walk reads: the head, the cell metadata and the record headers.
    pub fn remote(
        size: u64,
        opts: WalkOptions,
        policy: Policy,
        mut fetch: impl FnMut(&[(u64, u64)]) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Self> {
        let sparse = Sparse::new(size)?;
        loop {
            match walk_step(&sparse, opts, policy) {
                Step::Done(layout) => return Ok(Self::from_sparse(sparse, (*layout)?)),
                Step::Refused(r) => {
                    return Err(Error::format(
                        "remote metadata",
                        r.at as usize,
                        format!("at most {} bytes fetched to open", r.limit),
                        r,
                    ))
                }
                Step::Fetch(ranges) => {
                    let got = fetch(&ranges)?;
                    let got: Vec<&[u8]> = got.iter().map(|b| b.as_slice()).collect();
                    fill_fetched(&sparse, &ranges, &got)?;
                }
            }
        }
    }

    /// A remote object's sparse copy and the layout its walk found.
    pub fn from_sparse(sparse: Sparse, layout: Layout) -> Self {
        State {
            data: Arc::new(Data::Sparse(sparse)),
            layout,
            source: None,
            fetch: None,
        }
    }

    /// Give a remote state the means to fetch what a pass reads and is not fetched yet
    /// ([`State::require`] calls it).
    pub fn set_fetch(&mut self, fetch: Box<Fetch>) {
        self.fetch = Some(fetch);
    }

    /// The sparse copy of a remote state (None: the bytes are all there).
    pub fn sparse(&self) -> Option<&Sparse> {
        match &*self.data {
            Data::Sparse(s) => Some(s),
            _ => None,
        }
    }

    /// Make sure every byte of `offset..offset + len` is there before a pass reads it: a mapped
    /// or owned state's always are; a remote state fetches the pages not fetched yet (with
    /// [`State::set_fetch`]'s fetch) and fails with [`Error::NotFetched`] if they are still
    /// not there (no fetch given, or it gave less). Every pass asks before it reads.
    pub fn require(&self, offset: u64, len: u64, field: impl FnOnce() -> String) -> Result<()> {
        let Some(s) = self.sparse() else {
            return Ok(());
        };
        if s.is_filled(offset, len) {
            return Ok(());
        }
        if let Some(fetch) = &self.fetch {
            let ranges = plan(s, &[(offset, len)], 0, Policy::default().piece);
            let got = fetch(&ranges)?;
            let got: Vec<&[u8]> = got.iter().map(|b| b.as_slice()).collect();
            fill_fetched(s, &ranges, &got)?;
        }
        if s.is_filled(offset, len) {
            return Ok(());
        }
        Err(Error::NotFetched {
            field: field(),
            offset,
            len,
        })
    }

    /// [`State::require`] for a record's rows.
    pub fn require_record(&self, rec: &Record) -> Result<()> {
        if self.layout.rows_on_device && rec.row_bytes > 0 {
            return Err(Error::NoRows {
                field: format!("{} rows", rec.kind.name()),
                offset: rec.data_offset,
            });
        }
        self.require(rec.data_offset, rec.data_len, || {
            format!("{} rows at byte {}", rec.kind.name(), rec.data_offset)
        })
    }

    /// A job's rows, checked to be there (see [`State::require`]).
    pub fn view<'a>(&'a self, job: &Job<'a>) -> Result<RecordView<'a>> {
        self.require_record(job.rec)?;
        Ok(job.view(self.bytes()))
    }

    /// A record's rows (`cells` of them), checked to be there.
    pub fn record_view<'a>(&'a self, rec: &Record, cells: usize) -> Result<RecordView<'a>> {
        self.require_record(rec)?;
        Ok(RecordView::new(self.bytes(), rec, cells))
    }

    /// The ranges to fetch before reading `wanted` (offset, length) ranges: the pages not
    /// fetched yet, in requests of at most `policy.piece` bytes (none for a local state).
    pub fn to_fetch(&self, wanted: &[(u64, u64)], policy: Policy) -> Vec<(u64, u64)> {
        match self.sparse() {
            Some(s) => plan(s, wanted, 0, policy.piece),
            None => Vec::new(),
        }
    }

    /// Read `path` into memory and walk it: a private copy, immune to later changes of the file.
    pub fn read(path: impl AsRef<Path>, opts: WalkOptions) -> Result<Self> {
        let path = path.as_ref();
        let (mut file, meta) = open_regular(path)?;
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(|source| Error::File {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_data(Data::Owned(bytes), opts)
    }

    pub fn from_bytes(bytes: Vec<u8>, opts: WalkOptions) -> Result<Self> {
        Self::from_data(Data::Owned(bytes), opts)
    }

    fn from_data(data: Data, opts: WalkOptions) -> Result<Self> {
        let layout = walk(&data, opts)?;
        Ok(State {
            data: Arc::new(data),
            layout,
            source: None,
            fetch: None,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Whether the bytes are a map of a file (false: owned bytes).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.data, Data::Map(_))
    }

    /// Fail with [`Error::Changed`] if the mapped file's size or modification time changed since
    /// it was opened, or its path now names another file. Owned bytes never change.
    ///
    /// A check, not a lock: a file truncated after it still faults (SIGBUS) on the pages past
    /// its new end; only [`State::read`] is immune.
    pub fn check_unchanged(&self) -> Result<()> {
        match &self.source {
            Some(w) if self.is_mapped() => w.check(),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tmp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvfast-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// A minimal valid raw sequence state: io magic, seq 0, one stream of one f16 cell.
    fn state_bytes() -> Vec<u8> {
        let mut b = Vec::new();
        for w in [0xAF14_3CD8u32, 0, 1, 1, 0, 1, 0, 0, 1] {
            b.extend(w.to_le_bytes());
        }
        for _ in 0..2 {
            b.extend(1i32.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend([0u8; 4]);
        }
        b
    }

    #[test]
    fn a_fifo_is_refused_without_waiting() {
        let p = tmp("fifo");
        let _ = std::fs::remove_file(&p);
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a plain libc call on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for r in [
            State::open(&p, WalkOptions::default()).err(),
            State::read(&p, WalkOptions::default()).err(),
        ] {
            match r {
                Some(Error::NotAFile { path, what }) => {
                    assert_eq!(path, p);
                    assert_eq!(what, "a FIFO");
                }
                other => panic!("expected NotAFile, got {:?}", other.map(|e| e.to_string())),
            }
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn io_errors_name_the_path() {
        let p = tmp("missing.bin");
        match State::open(&p, WalkOptions::default()) {
            Err(Error::File { path, source }) => {
                assert_eq!(path, p);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected a file error, got {:?}", other.err()),
        }
        let d = tmp("");
        assert!(matches!(
            State::open(&d, WalkOptions::default()),
            Err(Error::File { .. })
        ));
    }

    #[test]
    fn changes_after_open_are_detected_and_copies_are_immune() {
        let p = tmp("changing.bin");
        std::fs::write(&p, state_bytes()).unwrap();
        let mapped = State::open(&p, WalkOptions::default()).unwrap();
        let copy = State::read(&p, WalkOptions::default()).unwrap();
        assert!(mapped.is_mapped() && !copy.is_mapped());
        mapped.check_unchanged().unwrap();
        // grow it (a truncation is the same test of the size, without the fault risk here)
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[0u8; 4]).unwrap();
        drop(f);
        match mapped.check_unchanged() {
            Err(Error::Changed { path, what }) => {
                assert_eq!(path, p);
                assert!(what.contains("size"), "{what}");
            }
            other => panic!("expected Changed, got {other:?}"),
        }
        copy.check_unchanged().unwrap();
        // replaced under the same name
        std::fs::write(&p, state_bytes()).unwrap();
        let mapped = State::open(&p, WalkOptions::default()).unwrap();
        let q = tmp("other.bin");
        std::fs::write(&q, state_bytes()).unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert!(matches!(
            mapped.check_unchanged(),
            Err(Error::Changed { .. })
        ));
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(
            mapped.check_unchanged(),
            Err(Error::Changed { .. })
        ));
    }
}
