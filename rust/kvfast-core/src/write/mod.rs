//! Writing states llama.cpp loads back: a state as owned parts and its bytes, and edits on the parts.

pub mod check;
pub mod edit;
pub mod parts;
pub mod rows;

use crate::format::cells::MAX_SEQ;

/// What writing a state can fail with: a request the writer cannot make (an edit that does not fit
/// the state, a container or version it does not write), or the source's bytes.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A bad request, not bad bytes: `field` names the argument at fault (kvfast's `WriteError`).
    #[error("{field}: {message}")]
    Request { field: String, message: String },
    /// Reading the source's bytes or writing the target's.
    #[error(transparent)]
    Read(#[from] crate::Error),
}

impl WriteError {
    /// A bad request of the argument `field`.
    pub fn request(field: impl Into<String>, message: impl Into<String>) -> Self {
        WriteError::Request {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Read(e.into())
    }
}

/// The writer's results.
pub type Result<T> = std::result::Result<T, WriteError>;

/// A request the writer cannot make: `what` it is about, in the argument `field`.
pub(crate) fn err(
    what: impl Into<String>,
    field: impl Into<String>,
    expected: impl Into<String>,
    found: impl std::fmt::Display,
) -> WriteError {
    let (what, field) = (what.into(), field.into());
    let expected = expected.into();
    let message = if what == field {
        format!("expected {expected}, found {found}")
    } else {
        format!("{what}: expected {expected}, found {found}")
    };
    WriteError::Request { field, message }
}

/// A sequence id llama.cpp takes (0 to LLAMA_MAX_SEQ - 1), as the `seq_id` a request gives.
pub fn seq_id(id: i64) -> Result<i32> {
    match i32::try_from(id) {
        Ok(q) if (0..MAX_SEQ as i32).contains(&q) => Ok(q),
        _ => Err(WriteError::request(
            "seq_id",
            format!(
                "sequence ids 0 to {} (llama.cpp's LLAMA_MAX_SEQ), not {id}",
                MAX_SEQ - 1
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::parts::Format;
    use super::*;
    use crate::Container;

    fn field(e: WriteError) -> String {
        match e {
            WriteError::Request { field, .. } => field,
            other => panic!("expected a refused request, got {other:?}"),
        }
    }

    #[test]
    fn containers_versions_and_sequence_ids_are_checked_here() {
        assert_eq!(field(Format::named("gguf", None).unwrap_err()), "container");
        assert_eq!(
            field(Format::named("ggsq", Some(4)).unwrap_err()),
            "version"
        );
        assert_eq!(field(Format::named("seq", Some(3)).unwrap_err()), "version");
        let f = Format::named("ggsq", Some(2)).unwrap();
        assert_eq!(
            (f.container, f.version, f.ext_bytes),
            (Container::Ggsq, Some(2), 8)
        );
        assert_eq!(
            Format::named("ggsn", None).unwrap(),
            Format::newest(Container::Ggsn)
        );
        assert_eq!(seq_id(255).unwrap(), 255);
        for bad in [-1, 256, 1 << 40] {
            assert_eq!(field(seq_id(bad).unwrap_err()), "seq_id");
        }
        assert_eq!(
            seq_id(256).unwrap_err().to_string(),
            "seq_id: sequence ids 0 to 255 (llama.cpp's LLAMA_MAX_SEQ), not 256"
        );
    }
}
