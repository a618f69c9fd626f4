//! `write_state`: kvfast-core's writer (`write`, `write_edit`) as Python calls it. Python plans
//! the edits (kvfast.write); this converts them and runs them with the GIL released, writing to
//! the file Python gives (the temporary file of `kvfast.writing.output`, which checks the path
//! and renames the file into place). The rows are read from the sources' bytes as they are
//! written (kvfast-core's `write::rows`): memory for the cells and a few rows, not the state.

use std::path::PathBuf;

use kvfast_core::format::cells::MAX_SEQ;
use kvfast_core::write::edit::{concat, Replace, Retype};
use kvfast_core::write::parts::{Format, SourceBytes, StateParts, WRITE_VERSIONS};
use kvfast_core::write::seq_id;
use kvfast_core::GgmlType;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::errors::{Error, Result};
use crate::state::{parse_kind, PyState};

/// The edits of one source state, in the order they are made.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SourceEdits {
    /// Store V transposed (flash attention off) or not (None: as it is).
    v_trans: Option<bool>,
    /// (cache, kind, type, group stored in now, group the type is stored in).
    retype: Vec<(usize, String, String, usize, usize)>,
    /// (cache, stream, layer, kind, f32 little-endian values, group).
    values: Vec<(usize, usize, usize, String, PyBackedBytes, usize)>,
    /// Per cache, per stream, per cell: keep it ([] for a cache: every cell).
    keep: Option<Vec<Vec<Vec<bool>>>>,
    /// Keep this sequence alone.
    extract: Option<i64>,
    /// (from, to) sequence renames.
    seq_map: Vec<(i32, i64)>,
}

/// What is written: the container (None: the first source's, as it is), its version, and the
/// fields Python chose.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct Target {
    container: Option<String>,
    version: Option<u32>,
    seq_id: Option<i64>,
    arch: Option<String>,
    token_words: Option<Vec<i32>>,
    /// Tokens by position, for the token of a 12-byte cell extension made from an 8-byte one.
    ext_tokens: Option<Vec<i32>>,
    /// Joined sources: cells alike in every record become one cell of several sequences.
    share: bool,
}

fn bad(msg: String) -> Error {
    Error::Python(pyo3::exceptions::PyValueError::new_err(msg))
}

fn ty(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| Error::UnknownType(name.to_string()))
}

fn edit(sf: &kvfast_core::State, e: SourceEdits) -> Result<StateParts> {
    sf.require(0, sf.layout.size, || "the state written".into())?;
    let src: SourceBytes = sf.data.clone();
    let mut p = StateParts::from_source(src, &sf.layout)?;
    // the cells of a sequence state that list no sequence (its recurrent part's, a 2025 build's)
    // are its sequence's: renamed and joined with it
    p.own_sequence();
    // V untransposed before it is requantized (a quantized V is never transposed), transposed after
    if e.v_trans == Some(false) {
        p.set_v_trans(false)?;
    }
    for (cache, kind, t, from_group, to_group) in e.retype {
        p.retype(Retype {
            cache,
            kind: parse_kind(&kind)?,
            ty: ty(&t)?,
            from_group,
            to_group,
        })?;
    }
    if e.v_trans == Some(true) {
        p.set_v_trans(true)?;
    }
    for (cache, stream, layer, kind, bytes, group) in e.values {
        let values = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        p.replace(&Replace {
            cache,
            stream,
            layer,
            kind: parse_kind(&kind)?,
            values,
            group,
        })?;
    }
    if let Some(keep) = e.keep {
        p.keep(&keep)?;
    }
    if let Some(seq) = e.extract {
        p.extract(seq_id(seq)?)?;
    }
    if !e.seq_map.is_empty() {
        let map = e
            .seq_map
            .into_iter()
            .map(|(from, to)| Ok((from, seq_id(to)?)))
            .collect::<Result<Vec<_>>>()?;
        p.rename(&map)?;
    }
    Ok(p)
}

/// Write the edited sources (joined, when more than one) to `path` (made or truncated, as it is:
/// kvfast.write gives a temporary file it renames into place); returns the bytes written.
#[pyfunction]
pub fn write_state(
    py: Python<'_>,
    sources: Vec<PyRef<'_, PyState>>,
    edits: Vec<SourceEdits>,
    path: PathBuf,
    target: Target,
) -> Result<u64> {
    if sources.len() != edits.len() || sources.is_empty() {
        return Err(bad(format!(
            "{} sources and {} edits: one edit per source, at least one",
            sources.len(),
            edits.len()
        )));
    }
    let files = sources
        .iter()
        .map(|s| s.get())
        .collect::<Result<Vec<_>>>()?;
    // a remote source is written from all of its bytes
    for (s, sf) in sources.iter().zip(&files) {
        s.ready_ranges(py, sf, &[(0, sf.layout.size)])?;
    }
    // the container and version first: a request the writer cannot make is refused before any edit
    let named = target
        .container
        .as_deref()
        .map(|name| Format::named(name, target.version))
        .transpose()?;
    let seq = target.seq_id.map(seq_id).transpose()?;
    py.detach(move || {
        let mut parts = Vec::with_capacity(files.len());
        for (sf, e) in files.iter().zip(edits) {
            parts.push(edit(sf, e)?);
        }
        let first = parts[0].format;
        let mut p = if parts.len() == 1 {
            parts.pop().expect("one state")
        } else {
            concat(parts, target.share)?
        };
        if let Some(a) = target.arch.clone() {
            p.arch = Some(a);
        }
        p.to_format(named.unwrap_or(first), target.ext_tokens.as_deref())?;
        if let Some(q) = seq {
            p.seq_id = Some(q);
        }
        if let Some(words) = target.token_words {
            p.token_words = Some(words);
        }
        let io = |source| kvfast_core::Error::File {
            path: path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        p.write_to(&mut w)?;
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        // the rows were read from the sources' maps while written: they must not have changed
        for sf in &files {
            sf.check_unchanged()?;
        }
        Ok(f.metadata().map_err(io)?.len())
    })
}

/// The writer's rules Python reads: `MAX_SEQ` (llama.cpp's LLAMA_MAX_SEQ, sequence ids below it)
/// and `WRITE_VERSIONS` (each container's name, and the versions written of it), and `write_state`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_SEQ", MAX_SEQ)?;
    let versions = pyo3::types::PyDict::new(m.py());
    for (c, vs) in WRITE_VERSIONS {
        versions.set_item(c.name(), vs.to_vec())?;
    }
    m.add("WRITE_VERSIONS", versions)?;
    m.add_function(wrap_pyfunction!(write_state, m)?)?;
    Ok(())
}
