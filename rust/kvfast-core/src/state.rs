//! A state file mapped into memory, with its walked layout.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::container::{walk, WalkOptions};
use crate::error::Result;
use crate::layout::Layout;

/// The bytes of a state: a read-only memory map, or owned bytes (tests, in-memory states).
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
}

impl StateFile {
    /// Map `path` and walk it. Costs time in proportion to the metadata, not the rows.
    pub fn open(path: impl AsRef<Path>, opts: WalkOptions) -> Result<Self> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(
                std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory").into(),
            );
        }
        let len = meta.len();
        let data = if len == 0 {
            Data::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; a file truncated by another process while mapped is
            // outside what any reader of a mapped file can defend against.
            Data::Map(unsafe { Mmap::map(&file)? })
        };
        Self::from_data(data, opts)
    }

    pub fn from_bytes(bytes: Vec<u8>, opts: WalkOptions) -> Result<Self> {
        Self::from_data(Data::Owned(bytes), opts)
    }

    fn from_data(data: Data, opts: WalkOptions) -> Result<Self> {
        let layout = walk(&data, opts)?;
        Ok(StateFile {
            data: Arc::new(data),
            layout,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}
