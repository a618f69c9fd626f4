//! Statistics, comparisons and quantization losses: kvfast-core's tables (`stats_tables`,
//! `compare_table`) over a state's selection, computed with the GIL released, handed out as Arrow.

use kvfast_core::compare::matching::Mismatch;
use kvfast_core::compare::table::{compare as compare_table, Match, Other};
use kvfast_core::open::Opened;
use kvfast_core::plan::select::Selection;
use kvfast_core::stats::tables::{
    aggregate, cell_stats as cell_tables, quant_error as loss_table, Pass,
};
use kvfast_core::values::quantize::quantize_row;
use kvfast_core::GgmlType;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::columns::{finish, stream};
use crate::errors::{Error, Result};
use crate::state::{parse_kinds, PyState};
use crate::stream::ArrowStream;

/// What to compute over, as Python passes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SelectArg {
    caches: Option<Vec<u32>>,
    layers: Option<Vec<u32>>,
    kinds: Option<Vec<String>>,
}

impl SelectArg {
    /// kvfast-core's selection, in the opened state's geometry, rotation and RoPE.
    pub(crate) fn selection(self, op: &Opened) -> Result<Selection> {
        Ok(op.selection(self.caches, self.layers, parse_kinds(self.kinds)?, None))
    }
}

/// One row per (cache, stream, layer, kind, cell, sequence, head).
#[pyfunction]
pub fn cell_stats(
    py: Python<'_>,
    state: &PyState,
    sel: SelectArg,
    skip_first: i32,
) -> Result<ArrowStream> {
    let sf = state.get()?;
    let sel = sel.selection(&sf)?;
    state.ready(py, &sf, &sel)?; // a remote state fetches the selected rows first
    let map = &sf.model_layers;
    py.detach(|| {
        let p = Pass {
            sf: &sf,
            sel: &sel,
            map,
        };
        Ok(stream(cell_tables(&p, skip_first)?))
    })
}

/// Channel, head and layer tables from one pass over the selected records.
#[pyfunction]
pub fn aggregate_stats(
    py: Python<'_>,
    state: &PyState,
    sel: SelectArg,
    skip_first: i32,
) -> Result<(ArrowStream, ArrowStream, ArrowStream)> {
    let sf = state.get()?;
    let sel = sel.selection(&sf)?;
    state.ready(py, &sf, &sel)?; // a remote state fetches the selected rows first
    let map = &sf.model_layers;
    py.detach(|| {
        let p = Pass {
            sf: &sf,
            sel: &sel,
            map,
        };
        let [chan, head, layer] = aggregate(&p, skip_first)?;
        Ok((finish(chan), finish(head), finish(layer)))
    })
}

fn parse_type(name: &str) -> Result<GgmlType> {
    GgmlType::from_name(name).ok_or_else(|| Error::UnknownType(name.to_string()))
}

/// What quantizing each row with `type_name` (ggml's reference quantizer) would lose: per head and
/// per layer. `rotate` = (K group, V group): where nonzero, the pipeline is llama.cpp's for a
/// rotated cache: rotate, quantize, dequantize, rotate back (the Hadamard matrix is its own
/// inverse).
#[pyfunction]
pub fn quant_error(
    py: Python<'_>,
    state: &PyState,
    type_name: &str,
    sel: SelectArg,
    skip_first: i32,
    rotate: (usize, usize),
) -> Result<(ArrowStream, ArrowStream)> {
    let sf = state.get()?;
    let sel = sel.selection(&sf)?;
    state.ready(py, &sf, &sel)?; // a remote state fetches the selected rows first
    let map = &sf.model_layers;
    let ty = parse_type(type_name)?;
    py.detach(|| {
        let p = Pass {
            sf: &sf,
            sel: &sel,
            map,
        };
        let [head, layer] = loss_table(&p, ty, skip_first, rotate)?;
        Ok((finish(head), finish(layer)))
    })
}

/// Quantize f32 values (whole blocks) with ggml's reference quantizer for `type_name`.
#[pyfunction]
pub fn quantize<'py>(
    py: Python<'py>,
    type_name: &str,
    values: Vec<f32>,
) -> Result<Bound<'py, PyBytes>> {
    let ty = parse_type(type_name)?;
    let rb = ty
        .row_bytes(values.len() as u64)
        .ok_or(Error::NotWholeBlocks {
            n: values.len(),
            ty,
        })?;
    let mut out = vec![0u8; rb as usize];
    quantize_row(ty, &values, &mut out);
    Ok(PyBytes::new(py, &out))
}

/// Errors of `b` against `a`, cells matched by (sequence, position) (kvfast-core's `matching`):
/// per (cell, head) and per layer.
#[pyfunction]
pub fn compare(
    py: Python<'_>,
    a: &PyState,
    b: &PyState,
    sel: SelectArg,
) -> Result<(ArrowStream, ArrowStream)> {
    compare_matched(py, a, b, sel, Match::Sequence)
}

/// Errors of `b` against `a`, cells paired as `how` says: the tables of `compare`.
pub(crate) fn compare_matched(
    py: Python<'_>,
    a: &PyState,
    b: &PyState,
    sel: SelectArg,
    how: Match,
) -> Result<(ArrowStream, ArrowStream)> {
    let (sa, sb) = (a.get()?, b.get()?);
    let sel = sel.selection(&sa)?;
    a.ready(py, &sa, &sel)?;
    b.ready(py, &sb, &sel)?;
    let map = &sa.model_layers;
    let (rot_b, rope_b) = (sb.rotation_groups(), &sb.rope);
    py.detach(|| {
        let pa = Pass {
            sf: &sa,
            sel: &sel,
            map,
        };
        let ob = Other {
            sf: &sb,
            rotation: rot_b,
            rope: rope_b,
        };
        let [cells, layer] = compare_table(&pa, &ob, how)?;
        Ok((finish(cells), finish(layer)))
    })
    .map_err(|e| by_position(py, how, e))
}

/// A comparison by position alone that finds no cell of B at one of A's positions: said as
/// positions (sequences play no part), not with the hint of a comparison by sequence (which
/// suggests the mode that failed).
fn by_position(py: Python<'_>, how: Match, e: Error) -> Error {
    let Match::Position(below) = how else {
        return e;
    };
    let Error::Mismatch(Mismatch::Cells {
        missing,
        cache,
        stream,
        pos,
        ..
    }) = e
    else {
        return e;
    };
    let (mode, why) = match below {
        None => (
            "position",
            "B holds fewer positions than A, or other ones (a pruned state?)",
        ),
        Some(_) => (
            "tokens",
            "B lacks cells of the positions whose tokens A and B share (a pruned state?)",
        ),
    };
    let message = format!(
        "cannot match the states by position (match='{mode}'): {missing} positions of A's cache {cache} \
         stream {stream} have no cell in B (first: position {pos}): {why}"
    );
    let made = py
        .import("kvfast.errors")
        .and_then(|m| m.getattr("MatchError"))
        .and_then(|cls| cls.call1((message,)));
    Error::Python(match made {
        Ok(v) => PyErr::from_value(v),
        Err(err) => err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvfast_arrow::testing::state;

    #[test]
    fn an_empty_selection_gives_every_column_and_no_row() {
        let sf = state(3, 2, 8, GgmlType::F16);
        let sel = Selection {
            layers: Some(vec![]),
            ..Selection::default()
        };
        let p = Pass {
            sf: &sf,
            sel: &sel,
            map: &[],
        };
        let t = cell_tables(&p, 0).unwrap();
        assert_eq!((t.len(), t[0].rows()), (1, 0));
        let names: Vec<_> = t[0].columns.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), 17); // the index, 7 statistics and nan
        assert_eq!(
            &names[..5],
            ["cache", "stream", "layer", "model_layer", "kind"]
        );
        let [c, h, ly] = aggregate(&p, 0).unwrap();
        assert_eq!((c.rows(), h.rows(), ly.rows()), (0, 0, 0));
        assert_eq!((c.columns[4].name, c.columns[5].name), ("head", "channel"));
    }

    #[test]
    fn cell_statistics_per_record_keyed_narrow() {
        let sf = state(3, 2, 8, GgmlType::F16);
        let sel = Selection::default();
        let map = vec![Some(vec![0, 1])];
        let p = Pass {
            sf: &sf,
            sel: &sel,
            map: &map,
        };
        let t = cell_tables(&p, 1).unwrap();
        assert_eq!(t.len(), 4); // K, V of 2 layers
        assert_eq!(t[0].rows(), 2); // cells at positions >= 1
        let b = kvfast_arrow::columns::batch(t[1].clone());
        assert_eq!(
            b.schema().field(2).data_type(),
            &arrow_schema::DataType::UInt16
        );
    }
}
