//! Python exceptions for core errors: field, offset and kind kept as attributes.

use kvfast_core::Error;
use pyo3::create_exception;
use std::path::Path;

use pyo3::exceptions::{PyException, PyOSError};
use pyo3::prelude::*;

create_exception!(
    _kvfast,
    KvfastError,
    PyException,
    "Base class of every kvfast error."
);
create_exception!(
    _kvfast,
    FormatError,
    KvfastError,
    "The bytes are not a valid llama.cpp state."
);
create_exception!(
    _kvfast,
    TruncatedError,
    FormatError,
    "The bytes end before a field does."
);
create_exception!(
    _kvfast,
    AmbiguousError,
    FormatError,
    "More than one reading of the bytes parses."
);
create_exception!(
    _kvfast,
    UnsupportedVersionError,
    KvfastError,
    "A container version kvfast does not read."
);
create_exception!(
    _kvfast,
    FileChangedError,
    KvfastError,
    "The mapped state file changed (size, modification time or inode) after it was opened."
);

/// An `OSError` of the right subclass (FileNotFoundError, PermissionError, ...) with `errno`,
/// `strerror` and `filename` set, as Python's own `open` raises it.
fn os_error(path: &Path, errno: i32, strerror: String) -> PyErr {
    PyOSError::new_err((errno, strerror, path.as_os_str().to_os_string()))
}

fn io_error(path: &Path, e: &std::io::Error) -> PyErr {
    use std::io::ErrorKind as K;
    if let Some(code) = e.raw_os_error() {
        let text = e.to_string();
        let suffix = format!(" (os error {code})");
        let strerror = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
        return os_error(path, code, strerror);
    }
    let code = match e.kind() {
        K::NotFound => libc_errno::ENOENT,
        K::PermissionDenied => libc_errno::EACCES,
        K::IsADirectory => libc_errno::EISDIR,
        _ => libc_errno::EIO,
    };
    os_error(path, code, e.to_string())
}

/// The errno values Python maps to OSError subclasses (the same on every Unix kvfast builds for).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
}

/// Convert a core error; I/O errors stay `OSError` (and its subclasses), with the path.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    let err = match &e {
        Error::Io(_) => {
            let Error::Io(io) = e else { unreachable!() };
            return PyErr::from(io);
        }
        Error::File { path, source } => return io_error(path, source),
        Error::NotAFile { path, what } => {
            return os_error(
                path,
                libc_errno::EINVAL,
                format!("{what}, not a regular file (kvfast reads state and model files)"),
            )
        }
        Error::Changed { .. } => FileChangedError::new_err(msg),
        Error::Truncated { .. } => TruncatedError::new_err(msg),
        Error::Format { .. } => FormatError::new_err(msg),
        Error::Ambiguous { .. } => AmbiguousError::new_err(msg),
        Error::UnsupportedVersion { .. } => UnsupportedVersionError::new_err(msg),
    };
    Python::attach(|py| {
        let v = err.value(py);
        let _ = v.setattr("offset", e.offset());
        let _ = v.setattr("field", e.field());
        let _ = v.setattr("kind", e.kind());
        if let Error::Changed { path, .. } = &e {
            let _ = v.setattr("filename", path.as_os_str());
        }
    });
    err
}

/// A usage error (bad argument) raised as ValueError.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(msg.into())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KvfastError", py.get_type::<KvfastError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("TruncatedError", py.get_type::<TruncatedError>())?;
    m.add("AmbiguousError", py.get_type::<AmbiguousError>())?;
    m.add(
        "UnsupportedVersionError",
        py.get_type::<UnsupportedVersionError>(),
    )?;
    m.add("FileChangedError", py.get_type::<FileChangedError>())?;
    Ok(())
}
