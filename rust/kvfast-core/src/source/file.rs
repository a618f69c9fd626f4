//! Opening the files kvfast reads: regular files only, opened without blocking (a FIFO, a socket
//! or a device never hangs the reader), every I/O error naming its path; and telling whether a
//! file changed after it was opened.

use std::fs::{File, Metadata, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Open `path` for reading if it is a regular file; returns the file and its metadata.
pub fn open_regular(path: &Path) -> Result<(File, Metadata)> {
    let at = |source: std::io::Error| Error::File {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer comes; O_NONBLOCK returns at once, and
        // changes nothing for the regular files read afterwards.
        opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = opts.open(path).map_err(at)?;
    let meta = file.metadata().map_err(at)?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(at(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory, not a state or model file",
        )));
    }
    if !ft.is_file() {
        return Err(Error::NotAFile {
            path: path.to_path_buf(),
            what: file_kind(&meta),
        });
    }
    Ok((file, meta))
}

fn file_kind(meta: &Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let ft = meta.file_type();
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
    }
    let _ = meta;
    "not a regular file"
}

/// What identifies a file's contents at open: its device and inode, size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    pub fn of(meta: &Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Stamp {
                dev: meta.dev(),
                ino: meta.ino(),
                len: meta.len(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
            }
        }
        #[cfg(not(unix))]
        {
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or((0, 0), |d| (d.as_secs() as i64, d.subsec_nanos() as i64));
            Stamp {
                dev: 0,
                ino: 0,
                len: meta.len(),
                mtime,
            }
        }
    }
}

/// A file kept open with its stamp at open, to tell whether it changed since.
pub struct Watched {
    pub path: PathBuf,
    file: File,
    stamp: Stamp,
}

impl Watched {
    pub fn new(path: PathBuf, file: File, meta: &Metadata) -> Self {
        Watched {
            path,
            file,
            stamp: Stamp::of(meta),
        }
    }

    /// Fails with [`Error::Changed`] when the open file's size or modification time differ from
    /// those at open, or when the path no longer names that file (replaced, renamed or removed).
    pub fn check(&self) -> Result<()> {
        let changed = |what: String| Error::Changed {
            path: self.path.clone(),
            what,
        };
        let now = Stamp::of(&self.file.metadata().map_err(|source| Error::File {
            path: self.path.clone(),
            source,
        })?);
        if now.len != self.stamp.len {
            return Err(changed(format!(
                "its size went from {} to {} bytes",
                self.stamp.len, now.len
            )));
        }
        if now.mtime != self.stamp.mtime {
            return Err(changed(
                "it was written to (its modification time moved)".into(),
            ));
        }
        match std::fs::metadata(&self.path) {
            Ok(m) => {
                let at = Stamp::of(&m);
                if (at.dev, at.ino) != (self.stamp.dev, self.stamp.ino) {
                    return Err(changed("the path now names another file".into()));
                }
            }
            Err(_) => return Err(changed("the path no longer names it".into())),
        }
        Ok(())
    }
}
