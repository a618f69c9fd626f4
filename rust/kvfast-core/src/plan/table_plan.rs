//! The value table's plan: the type of its values column and the head size it is split in, and for
//! each record whether its rows are a view of the state's bytes or decoded into fresh memory.

use std::collections::BTreeSet;

use crate::format::layout::Record;
use crate::format::types::GgmlType;
use crate::plan::select::{Job, PlanError};

/// What the caller asked values to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dtype {
    /// f16 and f32 as stored, everything else decoded to f32.
    Stored,
    F32,
}

/// The element type of a record's rows as handed out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Out {
    F16,
    F32,
}

impl Out {
    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Out::F16 => 2,
            Out::F32 => 4,
        }
    }
}

/// The type `ty` rows are handed out in: f16 stays f16 when asked for as stored and read as stored
/// (an f16 record read with llama.cpp's rotation undone, which no llama.cpp writes, is decoded).
pub fn out_type(ty: GgmlType, dtype: Dtype, rotation: usize) -> Out {
    match (ty, dtype) {
        (GgmlType::F16, Dtype::Stored) if rotation == 0 => Out::F16,
        _ => Out::F32,
    }
}

/// How one record's rows become cell-major rows of its out type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RowSource {
    /// The bytes are the rows: f16 or f32 per cell, kept as stored (zero-copy where aligned).
    View,
    /// The bytes are the values, element-major (V without flash attention): transposed.
    Transpose,
    /// Rows decoded to f32 (and the rotation undone), in parallel.
    Decode,
    /// Element-major float values decoded to f32 and transposed.
    DecodeTransposed,
}

/// How `rec`'s rows become `out` values when read in groups of `rotation` (0: as stored).
pub fn row_source(rec: &Record, out: Out, rotation: usize) -> RowSource {
    let stored = rotation == 0
        && matches!(
            (rec.ty, out),
            (GgmlType::F16, Out::F16) | (GgmlType::F32, Out::F32)
        );
    match (stored, rec.transposed) {
        (true, false) => RowSource::View,
        (true, true) => RowSource::Transpose,
        (false, false) => RowSource::Decode,
        (false, true) => RowSource::DecodeTransposed,
    }
}

/// The values column of a table of selected records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TablePlan {
    /// Its element type: f16 only when every record is f16 kept as stored.
    pub out: Out,
    /// Values per list item (1 when nothing is selected).
    pub head_dim: usize,
    /// What each record is read as: `Dtype::F32` when the column is f32 (f16 records decode too).
    pub dtype: Dtype,
    /// Records of different head sizes: each row's list is its own head size long (`head_dim` is
    /// then the largest).
    pub ragged: bool,
}

impl TablePlan {
    /// How `job`'s rows are read under this plan.
    pub fn rows(&self, job: &Job) -> (Out, RowSource) {
        let out = out_type(job.rec.ty, self.dtype, job.transform());
        (out, row_source(job.rec, out, job.transform()))
    }
}

/// Plan the values column of `jobs`: one head size (K and V of different sizes cannot share a
/// fixed-size column), f16 only when every record is f16 kept as stored.
pub fn plan(jobs: &[Job], dtype: Dtype) -> Result<TablePlan, PlanError> {
    let dims: BTreeSet<usize> = jobs.iter().map(|j| j.head_dim).collect();
    if dims.len() > 1 {
        return Err(PlanError::HeadSizes(dims));
    }
    Ok(plan_ragged(jobs, dtype))
}

/// [`plan`] of records that may have different head sizes (a memory's parts: an MLA cache and its
/// indexer, Gemma 4's full and sliding-window caches, K and V of different sizes): a list column
/// whose length is each row's head size where they differ.
pub fn plan_ragged(jobs: &[Job], dtype: Dtype) -> TablePlan {
    let dims: BTreeSet<usize> = jobs.iter().map(|j| j.head_dim).collect();
    let ragged = dims.len() > 1;
    let head_dim = dims.into_iter().next_back().unwrap_or(1);
    let all_f16 = !jobs.is_empty()
        && jobs
            .iter()
            .all(|j| out_type(j.rec.ty, dtype, j.transform()) == Out::F16);
    if all_f16 {
        TablePlan {
            out: Out::F16,
            head_dim,
            dtype,
            ragged,
        }
    } else {
        TablePlan {
            out: Out::F32,
            head_dim,
            dtype: Dtype::F32,
            ragged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::layout::Kind;
    use crate::plan::select::{jobs, Selection};
    use crate::testing::{layout, record, stream};

    #[test]
    fn f16_stays_f16_only_as_stored_and_unrotated() {
        assert_eq!(out_type(GgmlType::F16, Dtype::Stored, 0), Out::F16);
        assert_eq!(out_type(GgmlType::F16, Dtype::F32, 0), Out::F32);
        assert_eq!(out_type(GgmlType::F16, Dtype::Stored, 64), Out::F32);
        assert_eq!(out_type(GgmlType::Bf16, Dtype::Stored, 0), Out::F32);
        assert_eq!(out_type(GgmlType::Q8_0, Dtype::Stored, 0), Out::F32);
        assert_eq!(out_type(GgmlType::F32, Dtype::Stored, 0), Out::F32);
    }

    #[test]
    fn views_where_the_bytes_are_the_rows() {
        let mut r = record(GgmlType::F16, 8);
        assert_eq!(row_source(&r, Out::F16, 0), RowSource::View);
        assert_eq!(row_source(&r, Out::F32, 0), RowSource::Decode);
        r.transposed = true;
        assert_eq!(row_source(&r, Out::F16, 0), RowSource::Transpose);
        assert_eq!(row_source(&r, Out::F32, 0), RowSource::DecodeTransposed);
        let f = record(GgmlType::F32, 8);
        assert_eq!(row_source(&f, Out::F32, 0), RowSource::View);
        assert_eq!(row_source(&f, Out::F32, 64), RowSource::Decode);
        let q = record(GgmlType::Q8_0, 64);
        assert_eq!(row_source(&q, Out::F32, 0), RowSource::Decode);
    }

    #[test]
    fn one_head_size_and_f16_only_when_every_record_is() {
        let mut s = stream(0, &[0, 1], &[&[0], &[0]], &[(8, Some(4)), (8, Some(4))]);
        let l = layout(vec![vec![s.clone()]]);
        let all = jobs(&l, &Selection::default()).unwrap();
        assert_eq!(
            plan(&all, Dtype::Stored).unwrap_err().to_string(),
            "the selected records have different head sizes {4, 8}: select kinds=['k'] or ['v'] separately"
        );
        let k = Selection {
            kinds: vec![Kind::K],
            head_dim_k: Some(4),
            ..Selection::default()
        };
        let p = plan(&jobs(&l, &k).unwrap(), Dtype::Stored).unwrap();
        assert_eq!(
            p,
            TablePlan {
                out: Out::F16,
                head_dim: 4,
                dtype: Dtype::Stored,
                ragged: false,
            }
        );
        // a memory's parts of different head sizes share one ragged table
        let r = plan_ragged(&all, Dtype::Stored);
        assert_eq!((r.ragged, r.head_dim), (true, 8));
        let p = plan(&jobs(&l, &k).unwrap(), Dtype::F32).unwrap();
        assert_eq!((p.out, p.dtype), (Out::F32, Dtype::F32));
        // one q8_0 layer makes the whole column f32, and its f16 layers decode
        s.layers[1].k = record(GgmlType::Q8_0, 64);
        s.layers[0].k = record(GgmlType::F16, 64);
        let l = layout(vec![vec![s]]);
        let js = jobs(
            &l,
            &Selection {
                head_dim_k: Some(32),
                ..k
            },
        )
        .unwrap();
        let p = plan(&js, Dtype::Stored).unwrap();
        assert_eq!((p.out, p.head_dim, p.dtype), (Out::F32, 32, Dtype::F32));
        assert_eq!(p.rows(&js[0]), (Out::F32, RowSource::Decode));
        // nothing selected: an f32 column of one value
        assert_eq!(plan(&[], Dtype::Stored).unwrap().head_dim, 1);
        assert_eq!(plan(&[], Dtype::Stored).unwrap().out, Out::F32);
    }
}
