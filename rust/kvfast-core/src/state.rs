//! A state file mapped into memory (or read into it), with its walked layout.

use std::io::Read;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::container::{walk, WalkOptions};
use crate::error::{Error, Result};
use crate::file::{open_regular, Watched};
use crate::layout::Layout;

/// The bytes of a state: a read-only memory map, or owned bytes (read from a file, tests,
/// in-memory states).
pub enum Data {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Map(m) => m,
            Data::Owned(v) => v,
        }
    }
}

/// A walked state: its bytes (shared, so views can outlive the handle) and its layout.
pub struct StateFile {
    pub data: Arc<Data>,
    pub layout: Layout,
    /// The mapped file, watched for changes (None for owned bytes, which cannot change).
    source: Option<Watched>,
}

impl StateFile {
    /// Map `path` and walk it. Costs time in proportion to the metadata, not the rows.
    ///
    /// Only a regular file is opened (a FIFO or a device is refused, never waited on). The map
    /// is shared with the file: another process that truncates or rewrites the file changes
    /// what the map holds, so [`StateFile::check_unchanged`] is called before each pass.
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
        Ok(StateFile {
            data: Arc::new(data),
            layout,
            source: None,
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
    /// its new end; only [`StateFile::read`] is immune.
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
            StateFile::open(&p, WalkOptions::default()).err(),
            StateFile::read(&p, WalkOptions::default()).err(),
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
        match StateFile::open(&p, WalkOptions::default()) {
            Err(Error::File { path, source }) => {
                assert_eq!(path, p);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected a file error, got {:?}", other.err()),
        }
        let d = tmp("");
        assert!(matches!(
            StateFile::open(&d, WalkOptions::default()),
            Err(Error::File { .. })
        ));
    }

    #[test]
    fn changes_after_open_are_detected_and_copies_are_immune() {
        let p = tmp("changing.bin");
        std::fs::write(&p, state_bytes()).unwrap();
        let mapped = StateFile::open(&p, WalkOptions::default()).unwrap();
        let copy = StateFile::read(&p, WalkOptions::default()).unwrap();
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
        let mapped = StateFile::open(&p, WalkOptions::default()).unwrap();
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
