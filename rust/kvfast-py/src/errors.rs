//! Python exceptions for core errors: field, offset and kind kept as attributes.

use kvfast_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
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

/// Convert a core error; I/O errors stay `OSError` (and its subclasses).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    let err = match &e {
        Error::Io(_) => {
            let Error::Io(io) = e else { unreachable!() };
            return PyErr::from(io);
        }
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
    Ok(())
}
