//! The long value table: one row per (cache, stream, layer, kind, cell, sequence, head).

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int32Array, RecordBatch, StringArray,
};
use arrow_buffer::{Buffer, MutableBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use kvfast_core::{Record, StateFile, Stream};

use crate::errors::{PlanError, Result};
use crate::rows::{out_type, record_rows, Dtype, Out, Rows};

/// Which records and heads to put in the table.
pub struct Selection {
    pub caches: Option<Vec<u32>>,
    pub layers: Option<Vec<u32>>,
    pub kinds: Vec<&'static str>,
    pub heads: Option<Vec<u32>>,
    pub dtype: Dtype,
    pub head_dim_k: Option<u64>,
    pub head_dim_v: Option<u64>,
    /// The model's own layer index of each cache's layers (iSWA caches interleave).
    pub model_layers: Option<Vec<Vec<i32>>>,
    /// Build the values column (else only the index columns).
    pub with_values: bool,
    /// Per cache, the [K, V] groups llama.cpp's rotation is undone in (0: values as stored).
    pub rotation: Vec<[usize; 2]>,
}

/// One record to turn into a batch.
pub struct Job<'a> {
    pub cache: u32,
    pub stream: &'a Stream,
    pub layer: u32,
    pub kind: &'static str,
    pub rec: &'a Record,
    pub head_dim: usize,
    /// Undo the rotation in groups of this many values (0: as stored).
    pub rotation: usize,
}

fn head_dim(
    rec: &Record,
    given: Option<u64>,
    kind: &'static str,
    layer: u32,
) -> std::result::Result<usize, PlanError> {
    match given {
        None => Ok(rec.n_embd as usize),
        Some(0) => Err(PlanError::HeadDimZero),
        Some(h) if rec.n_embd % h != 0 => Err(PlanError::HeadDim {
            head_dim: h,
            n: rec.n_embd,
            kind,
            layer,
        }),
        Some(h) => Ok(h as usize),
    }
}

/// Index of the values column.
pub const VALUES: usize = 9;

pub fn schema(out: Out, head_dim: usize) -> SchemaRef {
    let item = Arc::new(Field::new(
        "item",
        if out == Out::F16 {
            DataType::Float16
        } else {
            DataType::Float32
        },
        false,
    ));
    let i32f = |n: &str, null: bool| Field::new(n, DataType::Int32, null);
    Arc::new(Schema::new(vec![
        i32f("cache", false),
        i32f("stream", false),
        i32f("layer", false),
        i32f("model_layer", true),
        Field::new("kind", DataType::Utf8, false),
        i32f("cell", false),
        i32f("pos", false),
        i32f("seq_id", true),
        i32f("head", false),
        Field::new(
            "values",
            DataType::FixedSizeList(item, head_dim as i32),
            false,
        ),
    ]))
}

/// The values column of the selected records: one head size (K and V of different sizes cannot
/// share a fixed-size column) and f16 only when every record is f16 kept as stored.
fn plan(jobs: &[Job], dtype: Dtype) -> std::result::Result<(Out, usize), PlanError> {
    let dims: BTreeSet<usize> = jobs.iter().map(|j| j.head_dim).collect();
    if dims.len() > 1 {
        return Err(PlanError::HeadSizes(dims));
    }
    let hd = dims.into_iter().next().unwrap_or(1);
    let all_f16 = !jobs.is_empty() && jobs.iter().all(|j| out_type(j.rec.ty, dtype) == Out::F16);
    Ok((if all_f16 { Out::F16 } else { Out::F32 }, hd))
}

pub fn jobs<'a>(
    sf: &'a StateFile,
    sel: &Selection,
) -> std::result::Result<Vec<Job<'a>>, PlanError> {
    let mut out = Vec::new();
    for (ci, cache) in sf.layout.caches.iter().enumerate() {
        let ci = ci as u32;
        if sel.caches.as_ref().is_some_and(|c| !c.contains(&ci)) {
            continue;
        }
        for stream in &cache.streams {
            for kind in &sel.kinds {
                for (li, layer) in stream.layers.iter().enumerate() {
                    let li = li as u32;
                    if sel.layers.as_ref().is_some_and(|l| !l.contains(&li)) {
                        continue;
                    }
                    let (rec, given) = if *kind == "k" {
                        (Some(&layer.k), sel.head_dim_k)
                    } else {
                        (layer.v.as_ref(), sel.head_dim_v)
                    };
                    let Some(rec) = rec else { continue };
                    let head_dim = head_dim(rec, given, kind, li)?;
                    if let Some(hs) = &sel.heads {
                        let n = rec.n_embd as usize / head_dim;
                        if let Some(h) = hs.iter().find(|h| **h as usize >= n) {
                            return Err(PlanError::Head {
                                head: *h,
                                layer: li,
                                kind,
                                n,
                            });
                        }
                    }
                    let ki = usize::from(*kind == "v");
                    out.push(Job {
                        cache: ci,
                        stream,
                        layer: li,
                        kind,
                        rec,
                        head_dim,
                        rotation: sel.rotation.get(ci as usize).map_or(0, |r| r[ki]),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Build every selected batch (decoding in parallel inside each record).
pub fn batches(
    sf: &StateFile,
    sel: &Selection,
    seq_default: Option<i32>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let jobs = jobs(sf, sel)?;
    let (out_ty, hd) = plan(&jobs, sel.dtype)?;
    let full = schema(out_ty, hd);
    let DataType::FixedSizeList(item, _) = full.field(VALUES).data_type().clone() else {
        unreachable!()
    };
    let dtype = if out_ty == Out::F16 {
        sel.dtype
    } else {
        Dtype::F32
    };
    let schema = if sel.with_values {
        full
    } else {
        Arc::new(full.project(&(0..VALUES).collect::<Vec<_>>())?)
    };
    let mut out = Vec::new();
    for job in jobs {
        let rows = sel.with_values.then(|| {
            record_rows(
                sf,
                job.rec,
                job.stream.cell_count as usize,
                dtype,
                job.rotation,
            )
        });
        let model_layer = model_layer(sf, sel, job.cache, job.layer);
        out.push(batch(
            &schema,
            &job,
            rows,
            sel.heads.as_deref(),
            seq_default,
            model_layer,
            (&item, hd),
        )?);
    }
    Ok((schema, out))
}

fn batch(
    schema: &SchemaRef,
    job: &Job,
    rows: Option<Rows>,
    heads: Option<&[u32]>,
    seq_default: Option<i32>,
    model_layer: Option<i32>,
    (item, hd): (&FieldRef, usize),
) -> Result<RecordBatch> {
    let s = job.stream;
    let n_heads = job.rec.n_embd as usize / hd;
    let all_heads: Vec<u32> = (0..n_heads as u32).collect();
    let heads = heads.unwrap_or(&all_heads);
    let pairs = cell_seq_pairs(s, seq_default, 0);
    let mut columns = index_columns(job, &pairs, heads, model_layer);
    if let Some(rows) = rows {
        columns.push(values(item, rows, &pairs, heads, hd)?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The values of the selected (cell, sequence) pairs and heads, as a fixed-size list column: the
/// record's own buffer when nothing is repeated or left out, else a gathered copy.
fn values(
    item: &FieldRef,
    rows: Rows,
    pairs: &[(usize, Option<i32>)],
    heads: &[u32],
    hd: usize,
) -> Result<ArrayRef> {
    let n_heads = rows.n_embd / hd;
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
                let start = (c * rows.n_embd + *h as usize * hd) * es;
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
    let list = FixedSizeListArray::try_new(item.clone(), hd as i32, values, None)?;
    Ok(Arc::new(list))
}

/// cache, stream, layer, model_layer, kind, cell, pos, seq_id, head.
fn index_columns(
    job: &Job,
    pairs: &[(usize, Option<i32>)],
    heads: &[u32],
    model_layer: Option<i32>,
) -> Vec<ArrayRef> {
    let s = job.stream;
    let n = pairs.len() * heads.len();
    let constant = |v: i32| Arc::new(Int32Array::from(vec![v; n])) as ArrayRef;
    let mut cell = Vec::with_capacity(n);
    let mut pos = Vec::with_capacity(n);
    let mut seq = Vec::with_capacity(n);
    let mut head = Vec::with_capacity(n);
    for (c, q) in pairs {
        for h in heads {
            cell.push(*c as i32);
            pos.push(s.pos[*c]);
            seq.push(*q);
            head.push(*h as i32);
        }
    }
    vec![
        constant(job.cache as i32),
        constant(s.index as i32),
        constant(job.layer as i32),
        Arc::new(Int32Array::from(vec![model_layer; n])),
        Arc::new(repeated_str(job.kind, n)),
        Arc::new(Int32Array::from(cell)),
        Arc::new(Int32Array::from(pos)),
        Arc::new(optional_i32(seq)),
        Arc::new(Int32Array::from(head)),
    ]
}

/// `n` copies of a one-byte string, built from its buffers.
pub fn repeated_str(s: &'static str, n: usize) -> StringArray {
    let offsets: Vec<i32> = (0..=n as i32).map(|i| i * s.len() as i32).collect();
    let values = s.as_bytes().repeat(n);
    StringArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from_vec(values),
        None,
    )
}

/// Optional values, with no validity bitmap when none is missing.
pub fn optional_i32(v: Vec<Option<i32>>) -> Int32Array {
    if v.iter().all(Option::is_some) {
        Int32Array::from(v.into_iter().map(|x| x.unwrap_or(0)).collect::<Vec<_>>())
    } else {
        Int32Array::from(v)
    }
}

/// (cell, seq) pairs of the cells at positions >= `skip_first`: a cell of several sequences
/// appears once per sequence; a cell that lists none belongs to the state's own sequence.
pub fn cell_seq_pairs(
    s: &Stream,
    seq_default: Option<i32>,
    skip_first: i32,
) -> Vec<(usize, Option<i32>)> {
    let mut pairs = Vec::with_capacity(s.cell_count as usize);
    for c in 0..s.cell_count as usize {
        if s.pos[c] < skip_first {
            continue;
        }
        let seqs = s.cell_seqs(c);
        if seqs.is_empty() {
            pairs.push((c, seq_default));
        } else {
            pairs.extend(seqs.iter().map(|q| (c, Some(*q))));
        }
    }
    pairs
}

/// The model layer of a job: from the model's map, or the layer itself in a one-cache state.
pub fn model_layer(sf: &StateFile, sel: &Selection, cache: u32, layer: u32) -> Option<i32> {
    match &sel.model_layers {
        Some(m) => m
            .get(cache as usize)
            .and_then(|c| c.get(layer as usize))
            .copied(),
        None if sf.layout.caches.len() == 1 => Some(layer as i32),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{state, value};
    use arrow_array::Array;
    use kvfast_core::GgmlType;

    fn selection(heads: Option<Vec<u32>>, dtype: Dtype, with_values: bool) -> Selection {
        Selection {
            caches: None,
            layers: None,
            kinds: vec!["k", "v"],
            heads,
            dtype,
            head_dim_k: Some(4),
            head_dim_v: Some(4),
            model_layers: None,
            with_values,
            rotation: vec![],
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
        let model_layer = b.column(3).as_any().downcast_ref::<Int32Array>().unwrap();
        assert_eq!(model_layer.value(0), 1); // one cache: the layer itself
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
        let head = v.column(8).as_any().downcast_ref::<Int32Array>().unwrap();
        assert_eq!(head.values().to_vec(), vec![1, 1]);
    }

    #[test]
    fn a_quantized_record_makes_the_column_float32_and_index_only_has_no_values() {
        let sf = state(1, 1, 32, GgmlType::Q8_0);
        let sel = Selection {
            head_dim_k: Some(32),
            head_dim_v: Some(32),
            ..selection(None, Dtype::Stored, true)
        };
        let (schema, out) = batches(&sf, &sel, None).unwrap();
        let DataType::FixedSizeList(item, 32) = schema.field(VALUES).data_type() else {
            panic!("values of 32 per head")
        };
        assert_eq!(item.data_type(), &DataType::Float32);
        let want: Vec<f32> = (0..32).map(|j| value(0, 0, "k", j)).collect();
        assert_eq!(values_of(&out[0]), want);
        let sel = Selection {
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
        let sel = Selection {
            head_dim_k: Some(3),
            ..selection(None, Dtype::Stored, true)
        };
        let e = batches(&sf, &sel, None).err().unwrap();
        assert_eq!(
            e.to_string(),
            "head_dim 3 does not divide the 8 values per k row of layer 0"
        );
    }

    #[test]
    fn repeated_strings_and_optional_ints() {
        let s = repeated_str("v", 3);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![Some("v"); 3]);
        assert!(optional_i32(vec![Some(1), Some(2)]).nulls().is_none());
        let o = optional_i32(vec![Some(1), None]);
        assert_eq!(o.null_count(), 1);
    }
}
