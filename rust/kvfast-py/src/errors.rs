//! The binding's errors, and the one place they become Python exceptions: core errors keep their
//! KvfastError subclass (field, offset and kind as attributes) or OSError; kvfast-arrow's are the
//! core's, OSError for a Parquet file's, or usage errors; an open error is the `kvfast.errors`
//! class of its kind; every other error is a usage error, raised as ValueError.

use std::path::Path;

use kvfast_core::compare::matching::Mismatch;
use kvfast_core::open::OpenError;
use kvfast_core::plan::select::PlanError;
use kvfast_core::GgmlType;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

/// What a binding call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the state or a model: a KvfastError subclass, or OSError with the path.
    #[error(transparent)]
    Core(#[from] kvfast_core::Error),
    /// Building Arrow tables or writing Parquet: the core's errors as above, a Parquet file's as
    /// OSError, the others usage errors.
    #[error(transparent)]
    Tables(#[from] kvfast_arrow::Error),
    /// The selection does not fit the state (head sizes, heads, a type's blocks).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A model whose layers do not fit the state's caches (kvfast makes it a ModelMismatchError).
    #[error(transparent)]
    Map(#[from] kvfast_core::model::layer_map::MapError),
    /// A model's metadata that is not what a model's is (kvfast's ModelMismatchError), a RoPE
    /// kvfast does not undo (PreRopeError), or its header that cannot be read (a core error).
    #[error(transparent)]
    Model(#[from] kvfast_core::model::geometry::ModelError),
    /// A write the core's writer cannot make (kvfast's WriteError, `field` the argument), or the
    /// bytes it reads (a core error).
    #[error(transparent)]
    Write(#[from] kvfast_core::write::WriteError),
    /// Two states that cannot be compared (kvfast.compare makes it a MatchError).
    #[error(transparent)]
    Mismatch(#[from] Mismatch),
    /// A state that cannot be opened as asked (its model, head size, rotation or RoPE).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// Attention that cannot be computed as asked (kvfast.attention).
    #[error(transparent)]
    Attention(#[from] kvfast_core::attention::AttnError),
    #[error("the state is closed")]
    Closed,
    #[error("the state holds no cells")]
    NoCells,
    #[error("dtype must be None or 'float32', not {0:?}")]
    Dtype(String),
    #[error(
        "kind must be 'k', 'v' (attention caches), 'r' or 's' (the recurrent part), not {0:?}"
    )]
    Kind(String),
    #[error("unknown cache type {0:?}: expected {list}", list = type_names())]
    UnknownType(String),
    #[error("{n} values are not whole {ty} blocks")]
    NotWholeBlocks { n: usize, ty: GgmlType },
    #[error("{given} rotation entries for {caches} caches")]
    RotationEntries { given: usize, caches: usize },
    #[error("rotation group {group} of cache {cache}: expected 0 or a power of two >= 64")]
    RotationGroup { group: usize, cache: usize },
    #[error("rotation group {group} does not divide the {n} values of cache {cache} layer {layer} {kind} rows")]
    RotationDivide {
        group: usize,
        n: u64,
        cache: usize,
        layer: usize,
        kind: &'static str,
    },
    #[error("no cache {0}")]
    NoCache(usize),
    #[error("cache {cache} has no stream {stream}")]
    NoStream { cache: usize, stream: usize },
    #[error("cache {cache} stream {stream} has {layers} layers, no layer {layer}")]
    NoLayer {
        cache: usize,
        stream: usize,
        layers: usize,
        layer: usize,
    },
    #[error("cache {cache} layer {layer} has no {kind} record: {why}")]
    NoRecord {
        cache: usize,
        layer: usize,
        kind: kvfast_core::Kind,
        why: &'static str,
    },
    #[error("range outside the state")]
    OutsideState,
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// An exception raised by Python itself (building dicts and lists).
    #[error(transparent)]
    Python(#[from] PyErr),
}

pub type Result<T> = std::result::Result<T, Error>;

/// "f32, f16, ..., q5_1 or iq4_nl": every type a cache can hold.
fn type_names() -> String {
    let names: Vec<&str> = kvfast_core::format::types::ALL_TYPES
        .iter()
        .map(|t| t.name())
        .collect();
    match names.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl From<kvfast_core::stats::tables::TableError> for Error {
    fn from(e: kvfast_core::stats::tables::TableError) -> Self {
        use kvfast_core::stats::tables::TableError as E;
        match e {
            E::Plan(p) => Error::Plan(p),
            E::Core(c) => Error::Core(c),
            E::Mismatch(m) => Error::Mismatch(m),
        }
    }
}

impl From<std::convert::Infallible> for Error {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Core(e) => core_to_py(e),
            Error::Tables(e) => arrow_to_py(e),
            Error::Open(e) => open_to_py(e),
            // a selection the state's records do not have: the one error for a bad selection
            Error::Plan(e) => kvfast_error("SelectionError", e.to_string(), None),
            Error::Mismatch(m) => mismatch_to_py(m),
            Error::Map(e) => kvfast_error("ModelMismatchError", e.to_string(), None),
            Error::Model(e) => model_to_py(e),
            Error::Write(e) => write_to_py(e),
            Error::Attention(e) => attention_to_py(e),
            Error::Python(e) => e,
            other => PyValueError::new_err(other.to_string()),
        }
    }
}

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

create_exception!(
    _kvfast,
    NotFetchedError,
    KvfastError,
    "A pass read bytes of a remote state that were not fetched (a check: never zeros in their place)."
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

/// Convert a kvfast-arrow error: the core's as the core's, a Parquet file's (making, writing,
/// closing it; the writer's settings) OSError, the others ValueError.
fn arrow_to_py(e: kvfast_arrow::Error) -> PyErr {
    use kvfast_arrow::Error as E;
    match e {
        E::Core(c) => core_to_py(c),
        e @ (E::Write { .. } | E::Parquet(_)) => PyOSError::new_err(e.to_string()),
        E::Plan(e) => kvfast_error("SelectionError", e.to_string(), None),
        e @ (E::Arrow(_) | E::MixedValues { .. }) => PyValueError::new_err(e.to_string()),
    }
}

/// Convert a core error; I/O errors stay `OSError` (and its subclasses), with the path.
fn core_to_py(e: kvfast_core::Error) -> PyErr {
    use kvfast_core::Error;
    let msg = e.to_string();
    let err = match &e {
        Error::Io(_) => {
            let Error::Io(io) = e else { unreachable!() };
            // a Python exception raised while fetching a remote state's bytes: as raised
            if io.get_ref().is_some_and(|inner| inner.is::<PyErr>()) {
                if let Some(Ok(py_err)) = io.into_inner().map(|inner| inner.downcast::<PyErr>()) {
                    return *py_err;
                }
                unreachable!("checked to hold a PyErr");
            }
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
        // an allocation that failed (a memory limit): Python's own MemoryError, never an abort
        Error::NoMemory { .. } => return pyo3::exceptions::PyMemoryError::new_err(msg),
        Error::Changed { .. } => FileChangedError::new_err(msg),
        Error::Truncated { .. } => TruncatedError::new_err(msg),
        Error::Format { .. } => FormatError::new_err(msg),
        Error::Ambiguous { .. } => AmbiguousError::new_err(msg),
        Error::UnsupportedVersion { .. } => UnsupportedVersionError::new_err(msg),
        Error::NotFetched { .. } => NotFetchedError::new_err(msg),
        // values asked of a state that holds none: what was asked is not in this state
        Error::NoRows { field, .. } => {
            return kvfast_error("SelectionError", msg, Some(field.clone()))
        }
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

/// An exception of `kvfast.errors` (the classes defined in Python), with `field` set if given.
fn kvfast_error(name: &str, message: String, field: Option<String>) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("kvfast.errors")
            .and_then(|m| m.getattr(name))
            .and_then(|cls| cls.call1((message.clone(),)));
        match made {
            Ok(v) => {
                if v.setattr("field", field).is_err() {
                    return PyValueError::new_err(message);
                }
                PyErr::from_value(v)
            }
            Err(e) => e,
        }
    })
}

/// `kvfast.errors.RemoteError(errno, message, url)`: object storage could not give a state's
/// bytes as asked (an object too large to map, more metadata than an open fetches).
pub fn remote_error(errno: i32, message: String, url: &Path) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("kvfast.errors")
            .and_then(|m| m.getattr("RemoteError"))
            .and_then(|cls| cls.call1((errno, message.clone(), url.as_os_str())));
        match made {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        }
    })
}

/// Two states that cannot be compared: a MatchError; where the cells of one sequence have no
/// match in the other, it says how states of different sequences compare.
fn mismatch_to_py(m: Mismatch) -> PyErr {
    let hint = match m {
        Mismatch::Cells { .. } => {
            " (states of different sequences compare with match='position' or match='tokens')"
        }
        _ => "",
    };
    kvfast_error("MatchError", format!("{m}{hint}"), None)
}

/// Convert an open error: the bytes' errors as [`core_to_py`] does, every other to its class.
fn open_to_py(e: OpenError) -> PyErr {
    let msg = e.to_string();
    match e {
        OpenError::Read(e) => core_to_py(e),
        OpenError::Map(_) => kvfast_error("ModelMismatchError", msg, None),
        OpenError::Model { field, .. } => kvfast_error("ModelMismatchError", msg, field),
        OpenError::Selection(_) => kvfast_error("SelectionError", msg, None),
        OpenError::Rotation(_) => kvfast_error("RotationError", msg, None),
        OpenError::Rope { field, .. } => kvfast_error("PreRopeError", msg, field),
        OpenError::Other(inner) => match inner.downcast::<PyErr>() {
            Ok(py_err) => *py_err,
            Err(other) => PyValueError::new_err(other.to_string()),
        },
    }
}

/// A model error as kvfast's Python exception of its kind, `field` set: ModelMismatchError
/// (metadata) or PreRopeError (RoPE), both in `kvfast.errors`.
fn model_to_py(e: kvfast_core::model::geometry::ModelError) -> PyErr {
    use kvfast_core::model::geometry::ModelError as E;
    match e {
        E::Read(e) => core_to_py(e),
        E::Metadata { field, message } => kvfast_error("ModelMismatchError", message, Some(field)),
        E::Rope { field, message } => kvfast_error("PreRopeError", message, Some(field)),
    }
}

/// A write error as kvfast's: a bad request `kvfast.errors.WriteError(field, message)`, the bytes'
/// errors as [`core_to_py`] makes them.
fn write_to_py(e: kvfast_core::write::WriteError) -> PyErr {
    use kvfast_core::write::WriteError as E;
    match e {
        E::Read(e) => core_to_py(e),
        E::Request { field, message } => Python::attach(|py| {
            let made = py
                .import("kvfast.errors")
                .and_then(|m| m.getattr("WriteError"))
                .and_then(|cls| cls.call1((field, message)));
            match made {
                Ok(v) => PyErr::from_value(v),
                Err(e) => e,
            }
        }),
    }
}

/// An attention error: the bytes' as [`core_to_py`] makes them, the model's as [`model_to_py`],
/// queries that do not fit the model a ModelMismatchError, the others a SelectionError, `field`
/// naming the argument.
fn attention_to_py(e: kvfast_core::attention::AttnError) -> PyErr {
    use kvfast_core::attention::AttnError as E;
    let msg = e.to_string();
    match e {
        E::Read(e) => core_to_py(e),
        E::Plan(_) => kvfast_error("SelectionError", msg, None),
        E::Model(e) => model_to_py(e),
        E::Queries { field: "model", .. } => {
            kvfast_error("ModelMismatchError", msg, Some("model".into()))
        }
        // a query, scale, soft-cap or sink that is no finite number
        E::Queries {
            field: field @ ("values" | "scale" | "softcap" | "sinks"),
            ..
        } => kvfast_error("QueriesError", msg, Some(field.into())),
        E::Queries { field, .. } => kvfast_error("SelectionError", msg, Some(field.into())),
        E::Incomplete(_) => kvfast_error("SelectionError", msg, Some("incomplete".into())),
    }
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
    m.add("NotFetchedError", py.get_type::<NotFetchedError>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_say_what_was_expected() {
        assert_eq!(
            Error::UnknownType("q3_k".into()).to_string(),
            "unknown cache type \"q3_k\": expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl"
        );
        assert_eq!(
            Error::NotWholeBlocks {
                n: 48,
                ty: GgmlType::Q4_1
            }
            .to_string(),
            "48 values are not whole q4_1 blocks"
        );
        assert_eq!(
            Error::from(PlanError::HeadSizes([64, 128].into())).to_string(),
            "the selected records have different head sizes {64, 128}: select kinds=['k'] or ['v'] separately"
        );
    }

    #[test]
    fn core_plan_errors_keep_their_messages() {
        let e = Error::from(Mismatch::Cells {
            missing: 3,
            cache: 0,
            stream: 1,
            seq: None,
            pos: 7,
        });
        assert!(matches!(e, Error::Mismatch(_)));
        assert_eq!(
            e.to_string(),
            "cannot match the states: 3 (sequence, position) pairs of A's cache 0 stream 1 have no cell in B (first: sequence none, position 7)"
        );
        let e = Error::from(PlanError::Head {
            head: 9,
            layer: 3,
            kind: kvfast_core::Kind::V,
            n: 2,
        });
        assert_eq!(e.to_string(), "head 9 out of range: layer 3 v has 2 heads");
    }

    #[test]
    fn core_errors_stay_core_errors() {
        let e = kvfast_core::State::from_bytes(vec![1, 2, 3], Default::default())
            .err()
            .expect("three bytes are no state");
        let kind = e.kind();
        match Error::from(e) {
            Error::Core(c) => assert_eq!(c.kind(), kind),
            other => panic!("expected a core error, got {other:?}"),
        }
    }
}
