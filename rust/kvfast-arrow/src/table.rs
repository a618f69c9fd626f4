//! The long value table as Arrow batches: one row per (cache, stream, layer, kind, cell, sequence,
//! head). kvfast-core plans it (`select`: which records; `table_plan`: the values column and how each
//! record's rows are read); this builds the arrays.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, FixedSizeListArray, Float16Array, Float32Array, ListArray, RecordBatch,
};
use arrow_buffer::{Buffer, MutableBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use kvfast_core::model::layer_map::{model_layer, LayerMap};
use kvfast_core::plan::columns::{empty_value_index, value_index};
use kvfast_core::plan::select::{cell_seq_pairs, jobs, Job, Selection};
use kvfast_core::plan::table_plan::{plan, plan_ragged, Dtype, Out};
use kvfast_core::State;

use crate::columns::arrays;
use crate::error::{Error, Result};
use crate::rows::{record_rows, Rows};

/// A value table as Python asks for it.
pub struct TableRequest {
    pub sel: Selection,
    pub dtype: Dtype,
    /// The model's own layer index of each cache's layers (iSWA caches interleave).
    pub model_layers: LayerMap,
    /// Build the values column (else only the index columns).
    pub with_values: bool,
    /// Records of different head sizes may share the table: its values column is then a list of
    /// each row's own head size (else they are refused, as a fixed-size column cannot hold them).
    pub ragged: bool,
}

/// Index of the values column.
pub const VALUES: usize = 9;

pub fn schema(out: Out, head_dim: usize) -> SchemaRef {
    schema_of(out, head_dim, false)
}

/// [`schema`], its values a variable-length list where `ragged` (records of different head sizes).
pub fn schema_of(out: Out, head_dim: usize, ragged: bool) -> SchemaRef {
    let item = Arc::new(Field::new(
        "item",
        if out == Out::F16 {
            DataType::Float16
        } else {
            DataType::Float32
        },
        false,
    ));
    let (mut fields, _) = arrays(empty_value_index());
    let values = if ragged {
        DataType::List(item)
    } else {
        DataType::FixedSizeList(item, head_dim as i32)
    };
    fields.push(Field::new("values", values, false));
    Arc::new(Schema::new(fields))
}

/// Build every selected batch (decoding in parallel inside each record).
pub fn batches(
    sf: &State,
    req: &TableRequest,
    seq_default: Option<i32>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let mut out = Vec::new();
    let schema = each_batch::<Error>(sf, req, seq_default, usize::MAX, |b| {
        out.push(b);
        Ok(())
    })?;
    Ok((schema, out))
}

/// Hand `f` each selected record's rows in batches of at most `max_bytes` of values (at least a
/// cell each), decoded a batch at a time: what is held is bounded by a batch, not a record.
/// Returns the schema of the batches; `f`'s error (any that this crate's converts into) stops the
/// pass.
pub fn each_batch<E: From<Error>>(
    sf: &State,
    req: &TableRequest,
    seq_default: Option<i32>,
    max_bytes: usize,
    mut f: impl FnMut(RecordBatch) -> std::result::Result<(), E>,
) -> std::result::Result<SchemaRef, E> {
    let jobs = jobs(&sf.layout, &req.sel).map_err(Error::from)?;
    let p = if req.ragged {
        plan_ragged(&jobs, req.dtype)
    } else {
        plan(&jobs, req.dtype).map_err(Error::from)?
    };
    let full = schema_of(p.out, p.head_dim, p.ragged);
    let (DataType::FixedSizeList(item, _) | DataType::List(item)) =
        full.field(VALUES).data_type().clone()
    else {
        unreachable!()
    };
    let schema = if req.with_values {
        full
    } else {
        Arc::new(
            full.project(&(0..VALUES).collect::<Vec<_>>())
                .map_err(Error::from)?,
        )
    };
    for job in &jobs {
        let cells = job.stream.cell_count as usize;
        let (out, _) = p.rows(job);
        let row_bytes = (job.rec.n_embd as usize).saturating_mul(out.size()).max(1);
        let step = if req.with_values {
            (max_bytes / row_bytes).max(1)
        } else {
            usize::MAX
        };
        let model_layer = model_layer(&req.model_layers, job.cache, job.layer);
        let pairs = cell_seq_pairs(job.stream, seq_default, 0);
        let mut at = 0usize;
        // a record of no cells still gives its (empty) batch
        loop {
            let span = at..at.saturating_add(step).min(cells);
            let rows = if req.with_values {
                Some(
                    record_rows(
                        sf,
                        job.rec,
                        cells,
                        span.clone(),
                        p.dtype,
                        job.rotation,
                        job.cell_rope(),
                    )
                    .map_err(Error::from)?,
                )
            } else {
                None
            };
            // the pairs of the span's cells (in cell order)
            let lo = pairs.partition_point(|(c, _)| *c < span.start);
            let hi = pairs.partition_point(|(c, _)| *c < span.end);
            f(batch(
                &schema,
                job,
                rows,
                (&pairs[lo..hi], span.start),
                req.sel.heads.as_deref(),
                model_layer,
                (&item, job.head_dim, p.ragged),
            )?)?;
            at = span.end;
            if at >= cells {
                break;
            }
        }
    }
    Ok(schema)
}

fn batch(
    schema: &SchemaRef,
    job: &Job,
    rows: Option<Rows>,
    (pairs, first): (&[(usize, Option<i32>)], usize),
    heads: Option<&[u32]>,
    model_layer: Option<i32>,
    (item, hd, ragged): (&FieldRef, usize, bool),
) -> Result<RecordBatch> {
    // rows of 0 values (LFM2's S) have no head, so no row in the table
    let n_heads = (job.rec.n_embd as usize).checked_div(hd).unwrap_or(0);
    let all_heads: Vec<u32> = (0..n_heads as u32).collect();
    let heads = heads.unwrap_or(&all_heads);
    let (_, mut columns) = arrays(value_index(job, pairs, heads, model_layer));
    if let Some(rows) = rows {
        columns.push(values(item, rows, (pairs, first), heads, (hd, ragged))?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The values of the selected (cell, sequence) pairs and heads, as a fixed-size list column: the
/// rows' own buffer when nothing is repeated or left out, else a gathered copy. The rows are of the
/// cells `first..`.
fn values(
    item: &FieldRef,
    rows: Rows,
    (pairs, first): (&[(usize, Option<i32>)], usize),
    heads: &[u32],
    (hd, ragged): (usize, bool),
) -> Result<ArrayRef> {
    let n_heads = rows.n_embd.checked_div(hd).unwrap_or(0);
    let n = pairs.len() * heads.len();
    let identity = pairs.len() == rows.cells && heads.len() == n_heads;
    let values_buf = if identity {
        rows.buf
    } else {
        let es = rows.out.size();
        let mut m = MutableBuffer::with_capacity(n * hd * es);
        let src = rows.buf.as_slice();
        for (c, _) in pairs {
            for h in heads {
                let start = ((c - first) * rows.n_embd + *h as usize * hd) * es;
                m.extend_from_slice(&src[start..start + hd * es]);
            }
        }
        Buffer::from(m)
    };
    let values: ArrayRef = match rows.out {
        Out::F16 => Arc::new(Float16Array::new(
            ScalarBuffer::new(values_buf, 0, n * hd),
            None,
        )),
        Out::F32 => Arc::new(Float32Array::new(
            ScalarBuffer::new(values_buf, 0, n * hd),
            None,
        )),
    };
    if ragged {
        let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(hd, n));
        return Ok(Arc::new(ListArray::try_new(
            item.clone(),
            offsets,
            values,
            None,
        )?));
    }
    let list = FixedSizeListArray::try_new(item.clone(), hd as i32, values, None)?;
    Ok(Arc::new(list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{state, value};
    use arrow_array::{Array, UInt16Array};
    use kvfast_core::GgmlType;

    fn selection(heads: Option<Vec<u32>>, dtype: Dtype, with_values: bool) -> TableRequest {
        TableRequest {
            sel: Selection {
                heads,
                head_dim_k: Some(4),
                head_dim_v: Some(4),
                ..Selection::default()
            },
            dtype,
            model_layers: vec![Some(vec![0, 1])],
            with_values,
            ragged: false,
        }
    }

    fn values_of(b: &RecordBatch) -> Vec<f32> {
        let list = b
            .column(VALUES)
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .unwrap();
        let v = list.values();
        if let Some(h) = v.as_any().downcast_ref::<Float16Array>() {
            h.values().iter().map(|x| x.to_f32()).collect()
        } else {
            let f = v.as_any().downcast_ref::<Float32Array>().unwrap();
            f.values().to_vec()
        }
    }

    #[test]
    fn f16_records_stay_f16_one_row_per_cell_and_head() {
        let sf = state(3, 2, 8, GgmlType::F16);
        let (schema, out) = batches(&sf, &selection(None, Dtype::Stored, true), Some(0)).unwrap();
        let DataType::FixedSizeList(item, 4) = schema.field(VALUES).data_type() else {
            panic!("values of 4 per head")
        };
        assert_eq!(item.data_type(), &DataType::Float16);
        assert_eq!(out.len(), 4); // 2 layers x K, V
        let b = &out[1]; // K of layer 1 (kinds outside, layers inside)
        assert_eq!(b.num_rows(), 3 * 2);
        let want: Vec<f32> = (0..3)
            .flat_map(|c| (0..8).map(move |j| value(c, 1, "k", j)))
            .collect();
        assert_eq!(values_of(b), want);
        let model_layer = b.column(3).as_any().downcast_ref::<UInt16Array>().unwrap();
        assert_eq!(model_layer.value(0), 1); // from the layer map
    }

    #[test]
    fn chosen_heads_are_gathered_and_float32_decodes() {
        let sf = state(2, 1, 8, GgmlType::F16);
        let (schema, out) =
            batches(&sf, &selection(Some(vec![1]), Dtype::F32, true), None).unwrap();
        let DataType::FixedSizeList(item, 4) = schema.field(VALUES).data_type() else {
            panic!("values of 4 per head")
        };
        assert_eq!(item.data_type(), &DataType::Float32);
        let v = &out[1]; // V of layer 0
        let want: Vec<f32> = (0..2)
            .flat_map(|c| (4..8).map(move |j| value(c, 0, "v", j)))
            .collect();
        assert_eq!(values_of(v), want);
        let head = v.column(8).as_any().downcast_ref::<UInt16Array>().unwrap();
        assert_eq!(head.values().to_vec(), vec![1, 1]);
    }

    #[test]
    fn a_quantized_record_makes_the_column_float32_and_index_only_has_no_values() {
        let sf = state(1, 1, 32, GgmlType::Q8_0);
        let mut sel = selection(None, Dtype::Stored, true);
        sel.sel.head_dim_k = Some(32);
        sel.sel.head_dim_v = Some(32);
        let (schema, out) = batches(&sf, &sel, None).unwrap();
        let DataType::FixedSizeList(item, 32) = schema.field(VALUES).data_type() else {
            panic!("values of 32 per head")
        };
        assert_eq!(item.data_type(), &DataType::Float32);
        let want: Vec<f32> = (0..32).map(|j| value(0, 0, "k", j)).collect();
        assert_eq!(values_of(&out[0]), want);
        let sel = TableRequest {
            with_values: false,
            ..sel
        };
        let (schema, out) = batches(&sf, &sel, None).unwrap();
        assert_eq!(schema.fields().len(), VALUES);
        assert_eq!(out[0].num_columns(), VALUES);
    }

    #[test]
    fn a_head_size_that_does_not_divide_is_refused() {
        let sf = state(1, 1, 8, GgmlType::F16);
        let mut sel = selection(None, Dtype::Stored, true);
        sel.sel.head_dim_k = Some(3);
        let e = batches(&sf, &sel, None).err().unwrap();
        assert_eq!(
            e.to_string(),
            "head_dim 3 does not divide the 8 values per k row of layer 0"
        );
    }

    #[test]
    fn narrow_index_columns_kind_an_enumeration() {
        let sf = state(2, 1, 8, GgmlType::F16);
        let (schema, out) = batches(&sf, &selection(None, Dtype::Stored, false), Some(0)).unwrap();
        let types: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().to_string())
            .collect();
        assert_eq!(
            types,
            [
                "UInt8",
                "UInt8",
                "UInt16",
                "UInt16",
                "Dictionary(UInt8, Utf8)",
                "UInt32",
                "Int32",
                "UInt8",
                "UInt16"
            ]
        );
        assert_eq!(
            schema.field(4).metadata()["_PL_ENUM_VALUES2"],
            "1;k1;v1;r1;s"
        );
        let kind = out[1]
            .column(4)
            .as_any()
            .downcast_ref::<arrow_array::DictionaryArray<arrow_array::types::UInt8Type>>()
            .unwrap();
        assert_eq!(kind.keys().value(0), 1); // V of layer 0
    }
}
