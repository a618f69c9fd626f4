//! Comparisons whose cells match by position alone (sequences ignored), optionally below a
//! position: `kvfast.compare(match="position" | "tokens")` (kvfast-core's `match_position`).

use pyo3::prelude::*;

use kvfast_core::compare::table::Match;

use crate::analysis::{compare_matched, SelectArg};
use crate::errors::Result;
use crate::state::PyState;
use crate::stream::ArrowStream;

/// Errors of `b` against `a`, cells matched by position alone; only A's cells below `below` when
/// given. The tables of `compare`.
#[pyfunction]
#[pyo3(signature = (a, b, sel, below=None))]
pub fn compare_positions(
    py: Python<'_>,
    a: &PyState,
    b: &PyState,
    sel: SelectArg,
    below: Option<i32>,
) -> Result<(ArrowStream, ArrowStream)> {
    compare_matched(py, a, b, sel, Match::Position(below))
}
