//! Remote states: the walk of an object fetched a few ranges at a time by a Python callable
//! (`fetch(ranges) -> list of bytes`, see `kvfast.remote`), and the fetching every pass does
//! before it runs: the rows of the records it reads, the pages not fetched yet, in parallel
//! requests. The pass then checks its rows are there (kvfast-core's `State::require`).

use kvfast_core::plan::select::{jobs, Selection};
use kvfast_core::source::sparse::Sparse;
use std::path::Path;

use kvfast_core::source::state::{fill_fetched, walk_step, Policy, Step, METADATA_LIMIT};
use kvfast_core::{State, WalkOptions};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{Error, Result};

/// Fetch `ranges` with the Python callable and fill them into `sparse`.
fn fetch_into(
    py: Python<'_>,
    fetch: &Py<PyAny>,
    sparse: &Sparse,
    ranges: &[(u64, u64)],
) -> Result<()> {
    let got = fetch.call1(py, (ranges.to_vec(),))?;
    let got: Vec<Bound<'_, PyBytes>> = got.bind(py).extract()?;
    let slices: Vec<&[u8]> = got.iter().map(|b| b.as_bytes()).collect();
    Ok(fill_fetched(sparse, ranges, &slices)?)
}

/// Walk an object of `size` bytes at `url`, fetching with `fetch` what the walk reads (a few
/// rounds, `metadata` bytes at most: else a `RemoteError`); the state fetches with it what later
/// passes read (`State::require`). An object too large to map is a `RemoteError` naming its size.
pub fn open(
    py: Python<'_>,
    url: &Path,
    size: u64,
    fetch: &Py<PyAny>,
    opts: WalkOptions,
    metadata: Option<u64>,
) -> Result<State> {
    let sparse = Sparse::new(size).map_err(|e| {
        crate::errors::remote_error(
            ENOMEM,
            format!(
                "{}: the object is {size} bytes ({}), more than this machine can map as the \
                 sparse copy kvfast reads a remote state into ({e}); read it from a local copy, \
                 or where a map of that size fits",
                url.display(),
                human(size)
            ),
            url,
        )
    })?;
    let policy = Policy {
        metadata: metadata.unwrap_or(METADATA_LIMIT),
        ..Policy::default()
    };
    let layout = loop {
        match walk_step(&sparse, opts, policy) {
            Step::Done(layout) => break (*layout)?,
            Step::Fetch(ranges) => fetch_into(py, fetch, &sparse, &ranges)?,
            Step::Refused(r) => {
                return Err(crate::errors::remote_error(
                    EFBIG,
                    format!(
                        "{}: {r}; storage_options={{'kvfast': {{'metadata_limit': N}}}} lets an \
                         open fetch N bytes",
                        url.display()
                    ),
                    url,
                )
                .into())
            }
        }
    };
    let mut sf = State::from_sparse(sparse, layout);
    let f = fetch.clone_ref(py);
    sf.set_fetch(Box::new(move |ranges: &[(u64, u64)]| {
        // from a pass, the GIL released: take it for the Python callable
        Python::attach(|py| -> PyResult<Vec<Vec<u8>>> {
            let got = f.call1(py, (ranges.to_vec(),))?;
            let got: Vec<Bound<'_, PyBytes>> = got.bind(py).extract()?;
            Ok(got.iter().map(|b| b.as_bytes().to_vec()).collect())
        })
        // the exception goes back to Python as it was raised (errors.rs)
        .map_err(|e| kvfast_core::Error::Io(std::io::Error::other(e)))
    }));
    Ok(sf)
}

const ENOMEM: i32 = 12;
const EFBIG: i32 = 27;

/// A size in bytes as people say it (1.0 TB, 8.6 GB).
fn human(n: u64) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} bytes")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Fetch what is not fetched yet of `wanted` (offset, length) ranges; nothing for a local state.
pub fn ready(
    py: Python<'_>,
    fetch: Option<&Py<PyAny>>,
    sf: &State,
    wanted: &[(u64, u64)],
) -> Result<()> {
    let (Some(fetch), Some(sparse)) = (fetch, sf.sparse()) else {
        return Ok(());
    };
    let ranges = sf.to_fetch(wanted, Policy::default());
    if ranges.is_empty() {
        return Ok(());
    }
    fetch_into(py, fetch, sparse, &ranges)
}

/// The rows of every record a selection reads (every stream of each selected cache, layer and
/// kind; heads, geometry and transforms do not change which bytes are read).
pub fn selected_rows(sf: &State, sel: &Selection) -> Result<Vec<(u64, u64)>> {
    let plain = Selection {
        caches: sel.caches.clone(),
        layers: sel.layers.clone(),
        kinds: sel.kinds.clone(),
        ..Selection::default()
    };
    Ok(jobs(&sf.layout, &plain)
        .map_err(Error::from)?
        .iter()
        .map(|j| (j.rec.data_offset, j.rec.data_len))
        .collect())
}

/// Bytes fetched, rounds of fetching and ranges fetched (zeros for a local state).
pub fn fetched(sf: &State) -> (u64, u64, u64) {
    match sf.sparse() {
        Some(s) => {
            let (rounds, ranges) = s.rounds();
            (s.filled_bytes(), rounds, ranges)
        }
        None => (0, 0, 0),
    }
}
