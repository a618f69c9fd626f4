//! Errors of the reader: every one names the field, the byte offset and what was expected.

use std::fmt;

/// What went wrong while reading state bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes end before a field does.
    #[error("truncated: {field} at byte {offset} needs {needed} bytes, only {available} left")]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A field holds a value the format does not allow.
    #[error("bad {field} at byte {offset}: expected {expected}, found {found}")]
    Format {
        field: String,
        offset: u64,
        expected: String,
        found: String,
    },
    /// A container whose version this reader does not know.
    #[error("unsupported {container} version {version} at byte {offset}: supported {supported}")]
    UnsupportedVersion {
        container: &'static str,
        offset: u64,
        version: u32,
        supported: &'static str,
    },
    /// More than one reading of the bytes parses; the reader refuses to guess.
    #[error("ambiguous {field} at byte {offset}: the bytes parse as {}", .readings.join(" and as "))]
    Ambiguous {
        field: String,
        offset: u64,
        readings: Vec<String>,
    },
    /// An I/O error opening or reading a file, with its path.
    #[error("{}: {source}", .path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The path names something that is not a regular file (a FIFO, a socket, a device).
    #[error("{}: {what}, not a regular file (kvfast reads state and model files)", .path.display())]
    NotAFile {
        path: std::path::PathBuf,
        what: &'static str,
    },
    /// The file changed after it was opened: its mapped bytes are no longer the ones walked.
    #[error("{} changed since it was opened: {what}; open it again", .path.display())]
    Changed {
        path: std::path::PathBuf,
        what: String,
    },
    /// A read of bytes of a remote state that were not fetched (kvfast fetches what each pass
    /// reads before it runs: this is a check that it did, never a zero read in their place).
    #[error("{field}: bytes {offset} to {} of the remote state were not fetched; expected every byte a pass reads to be fetched before it runs", .offset + .len)]
    NotFetched {
        field: String,
        offset: u64,
        len: u64,
    },
    /// Rows asked of a state whose bytes hold none: written with
    /// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`, llama.cpp kept them in its own buffers.
    #[error(
        "{field} at byte {offset}: not in the bytes: the state was written with \
         LLAMA_STATE_SEQ_FLAGS_ON_DEVICE, which keeps the rows in llama.cpp's own buffers and \
         writes only the headers and cells"
    )]
    NoRows { field: String, offset: u64 },
    /// An allocation that failed: the memory `what` needs (`bytes`) could not be had (a process
    /// under a memory limit). Made by the fallible allocations of large buffers ([`try_buffer`]),
    /// never an abort.
    #[error("out of memory: {what} needs {bytes} bytes")]
    NoMemory { what: String, bytes: u64 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A buffer of `len` zero bytes, or [`Error::NoMemory`] naming `what` when the allocation fails.
pub fn try_buffer<T: Clone + Default>(len: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(len).is_err() {
        return Err(Error::NoMemory {
            what: what(),
            bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        });
    }
    v.resize(len, T::default());
    Ok(v)
}

impl Error {
    pub fn format(
        field: impl Into<String>,
        offset: usize,
        expected: impl Into<String>,
        found: impl fmt::Display,
    ) -> Self {
        Error::Format {
            field: field.into(),
            offset: offset as u64,
            expected: expected.into(),
            found: found.to_string(),
        }
    }

    /// The byte offset the error names (None for I/O errors).
    pub fn offset(&self) -> Option<u64> {
        match self {
            Error::Truncated { offset, .. }
            | Error::Format { offset, .. }
            | Error::UnsupportedVersion { offset, .. }
            | Error::Ambiguous { offset, .. }
            | Error::NotFetched { offset, .. }
            | Error::NoRows { offset, .. } => Some(*offset),
            Error::Io(_)
            | Error::File { .. }
            | Error::NotAFile { .. }
            | Error::Changed { .. }
            | Error::NoMemory { .. } => None,
        }
    }

    /// The field the error names.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Truncated { field, .. }
            | Error::Format { field, .. }
            | Error::Ambiguous { field, .. }
            | Error::NotFetched { field, .. }
            | Error::NoRows { field, .. } => Some(field),
            Error::UnsupportedVersion { .. } => Some("version"),
            Error::NoMemory { what, .. } => Some(what),
            Error::Io(_) | Error::File { .. } | Error::NotAFile { .. } | Error::Changed { .. } => {
                None
            }
        }
    }

    /// A stable machine-readable kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Truncated { .. } => "truncated",
            Error::Format { .. } => "format",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::Ambiguous { .. } => "ambiguous",
            Error::Io(_) | Error::File { .. } => "io",
            Error::NotAFile { .. } => "not_a_file",
            Error::Changed { .. } => "changed",
            Error::NotFetched { .. } => "not_fetched",
            Error::NoRows { .. } => "no_rows",
            Error::NoMemory { .. } => "memory",
        }
    }

    /// Prefix the field with the reading that was attempted.
    pub(crate) fn in_reading(mut self, reading: &str) -> Self {
        match &mut self {
            Error::Truncated { field, .. } | Error::Format { field, .. } => {
                *field = format!("{field} (reading the bytes as {reading})");
            }
            _ => {}
        }
        self
    }
}

pub type Result<T> = std::result::Result<T, Error>;
