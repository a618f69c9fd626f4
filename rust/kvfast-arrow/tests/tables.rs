//! The value table and the core's plain tables as Arrow, on real llama.cpp states (tests/data):
//! schema, rows and values against the core's own walk and decode.

use std::path::PathBuf;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Int32Type, UInt16Type, UInt32Type, UInt8Type};
use arrow_array::{Array, FixedSizeListArray, RecordBatch};
use arrow_schema::DataType;
use kvfast_arrow::columns::{batch, batches as table_batches};
use kvfast_arrow::rows::record_rows;
use kvfast_arrow::table::{batches, each_batch, TableRequest, VALUES};
use kvfast_arrow::Error;
use kvfast_core::model::layer_map::layer_map;
use kvfast_core::plan::records::{records, records_table};
use kvfast_core::plan::select::{jobs, PlanError, Selection};
use kvfast_core::plan::table_plan::{Dtype, Out};
use kvfast_core::values::decode::decode_row;
use kvfast_core::{Kind, State, WalkOptions};

fn open(rel: &str) -> State {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel);
    State::open(&p, WalkOptions::default()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every record, heads of `hd` values, as `dtype` asks.
fn request(sf: &State, hd: u64, dtype: Dtype) -> TableRequest {
    TableRequest {
        sel: Selection {
            head_dim_k: Some(hd),
            head_dim_v: Some(hd),
            ..Selection::default()
        },
        dtype,
        model_layers: layer_map(&sf.layout, None).unwrap(),
        with_values: true,
        ragged: false,
    }
}

/// The values of a batch's values column as f32 (f16 widened).
fn values_of(b: &RecordBatch) -> (DataType, Vec<f32>) {
    let list: &FixedSizeListArray = b.column(VALUES).as_fixed_size_list();
    let v = list.values();
    let got = match v.data_type() {
        DataType::Float16 => v
            .as_primitive::<Float16Type>()
            .values()
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        DataType::Float32 => v.as_primitive::<Float32Type>().values().to_vec(),
        t => panic!("values of {t}"),
    };
    (v.data_type().clone(), got)
}

/// One record's expected rows: kind, layer, cell and head of each row, the values.
type Expected = (Kind, u32, Vec<u32>, Vec<u16>, Vec<f32>);

/// What the value table should hold for `sf` with heads of `hd`: per record (the core's jobs, in
/// order), its rows decoded by the core, cell by cell, head by head.
fn expected(sf: &State, hd: usize) -> Vec<Expected> {
    let js = jobs(&sf.layout, &Selection::default()).unwrap();
    js.iter()
        .map(|j| {
            let (n, rb) = (j.rec.n_embd as usize, j.rec.row_bytes as usize);
            let cells = j.stream.cell_count as usize;
            let (mut cell, mut head, mut vals) = (vec![], vec![], vec![]);
            for c in 0..cells {
                let at = j.rec.data_offset as usize + c * rb;
                let mut row = vec![0f32; n];
                decode_row(j.rec.ty, &sf.bytes()[at..at + rb], &mut row);
                for h in 0..n / hd {
                    cell.push(c as u32);
                    head.push(h as u16);
                }
                vals.extend(row);
            }
            (j.kind, j.layer, cell, head, vals)
        })
        .collect()
}

fn check_table(rel: &str, dtype: Dtype, item: DataType) {
    let sf = open(rel);
    let hd = 32; // tiny-qwen3: 2 KV heads of 32 values
    let (schema, out) = batches(&sf, &request(&sf, hd, dtype), sf.layout.own_seq()).unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "cache",
            "stream",
            "layer",
            "model_layer",
            "kind",
            "cell",
            "pos",
            "seq_id",
            "head",
            "values"
        ]
    );
    assert_eq!(
        schema.field(VALUES).data_type(),
        &DataType::FixedSizeList(
            std::sync::Arc::new(arrow_schema::Field::new("item", item.clone(), false)),
            hd as i32
        )
    );
    let want = expected(&sf, hd as usize);
    assert_eq!(out.len(), want.len());
    assert_eq!(out.len(), 4, "2 layers, K and V");
    for (b, (kind, layer, cell, head, vals)) in out.iter().zip(want) {
        assert_eq!(b.schema(), schema);
        assert_eq!(b.num_rows(), 7 * 2, "7 cells of 2 heads");
        let kinds = b.column(4).as_dictionary::<UInt8Type>();
        let key = kinds.keys().value(0) as usize;
        let word = kinds.values().as_string::<i32>().value(key);
        assert_eq!(word, kind.to_string());
        assert!(b
            .column(2)
            .as_primitive::<UInt16Type>()
            .values()
            .iter()
            .all(|&l| l as u32 == layer));
        assert_eq!(
            b.column(5).as_primitive::<UInt32Type>().values().to_vec(),
            cell
        );
        assert_eq!(
            b.column(8).as_primitive::<UInt16Type>().values().to_vec(),
            head
        );
        let pos = b.column(6).as_primitive::<Int32Type>();
        assert_eq!(pos.value(2), 1, "cell 1 at position 1");
        let (ty, got) = values_of(b);
        assert_eq!(ty, item);
        assert_eq!(got.len(), vals.len());
        // f16 values are exact in f32: every value equals the core's decode, bit for bit
        for (i, (g, w)) in got.iter().zip(&vals).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{kind} layer {layer} value {i}");
        }
    }
}

#[test]
fn an_f16_state_as_stored_is_float16_and_equals_the_core_decode() {
    check_table(
        "qwen3tiny-f16-fa/seq-0.bin",
        Dtype::Stored,
        DataType::Float16,
    );
}

#[test]
fn an_f16_state_as_float32_equals_the_core_decode() {
    check_table("qwen3tiny-f16-fa/seq-0.bin", Dtype::F32, DataType::Float32);
}

#[test]
fn a_q8_0_state_decodes_to_float32_as_the_core_does() {
    check_table(
        "qwen3tiny-q8_0-fa/state.bin",
        Dtype::Stored,
        DataType::Float32,
    );
}

#[test]
fn batches_of_at_most_max_bytes_cover_every_row_once() {
    let sf = open("qwen3tiny-f16-fa/seq-0.bin");
    let req = request(&sf, 32, Dtype::Stored);
    let (_, whole) = batches(&sf, &req, sf.layout.own_seq()).unwrap();
    // a row of 64 f16 values is 128 bytes: 300 bytes hold 2 cells (4 table rows)
    let mut parts = Vec::new();
    each_batch::<Error>(&sf, &req, sf.layout.own_seq(), 300, |b| {
        parts.push(b);
        Ok(())
    })
    .unwrap();
    let rows: Vec<usize> = parts.iter().map(|b| b.num_rows()).collect();
    assert_eq!(rows, [4, 4, 4, 2].repeat(4));
    for (k, w) in whole.iter().enumerate() {
        let got: Vec<f32> = parts[k * 4..(k + 1) * 4]
            .iter()
            .flat_map(|b| values_of(b).1)
            .collect();
        assert_eq!(got, values_of(w).1);
    }
    // fewer bytes than a row: still a cell a batch
    let mut n = 0;
    each_batch::<Error>(&sf, &req, sf.layout.own_seq(), 1, |b| {
        assert_eq!(b.num_rows(), 2);
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 4 * 7);
}

#[test]
fn the_callback_error_stops_the_pass() {
    let sf = open("qwen3tiny-f16-fa/seq-0.bin");
    let req = request(&sf, 32, Dtype::Stored);
    #[derive(Debug)]
    enum Mine {
        Stop(usize),
        Table(Error),
    }
    impl From<Error> for Mine {
        fn from(e: Error) -> Self {
            Mine::Table(e)
        }
    }
    let mut seen = 0;
    let r = each_batch(&sf, &req, None, usize::MAX, |_| {
        seen += 1;
        if seen == 2 {
            Err(Mine::Stop(seen))
        } else {
            Ok(())
        }
    });
    assert!(matches!(r, Err(Mine::Stop(2))), "{r:?}");
    assert_eq!(seen, 2);
    // the table's own errors come back through the callback's type
    let r = each_batch(
        &sf,
        &request(&sf, 5, Dtype::Stored),
        None,
        usize::MAX,
        |_| Ok::<(), Mine>(()),
    );
    let Err(Mine::Table(e)) = r else {
        panic!("{r:?}")
    };
    assert!(matches!(e, Error::Plan(_)));
}

#[test]
fn impossible_requests_are_errors_not_panics() {
    let sf = open("qwen3tiny-f16-fa/seq-0.bin");
    let e = batches(&sf, &request(&sf, 5, Dtype::Stored), None).unwrap_err();
    assert!(matches!(e, Error::Plan(PlanError::HeadDim { .. })), "{e:?}");
    assert_eq!(
        e.to_string(),
        "head_dim 5 does not divide the 64 values per k row of layer 0"
    );
    let mut req = request(&sf, 32, Dtype::Stored);
    req.sel.heads = Some(vec![7]);
    let e = batches(&sf, &req, None).unwrap_err();
    assert!(matches!(e, Error::Plan(_)), "{e:?}");
    let mut req = request(&sf, 32, Dtype::Stored);
    // a layer the state does not have selects nothing (no error, no batch)
    req.sel.layers = Some(vec![9]);
    assert_eq!(batches(&sf, &req, None).unwrap().1.len(), 0);
}

#[test]
fn a_record_row_span_is_clamped_and_a_view_where_aligned() {
    let sf = open("qwen3tiny-f16-fa/seq-0.bin");
    let js = jobs(&sf.layout, &Selection::default()).unwrap();
    let j = &js[0];
    let cells = j.stream.cell_count as usize;
    let r = record_rows(&sf, j.rec, cells, 5..100, Dtype::Stored, 0, None).unwrap();
    assert_eq!((r.out, r.n_embd, r.cells), (Out::F16, 64, 2));
    let at = sf.bytes()[j.rec.data_offset as usize + 5 * 128..].as_ptr();
    assert_eq!(r.zero_copy, (at as usize) % 2 == 0);
    assert_eq!(r.buf.len(), 2 * 128);
    let r = record_rows(&sf, j.rec, cells, 0..cells, Dtype::F32, 0, None).unwrap();
    assert_eq!((r.out, r.cells, r.zero_copy), (Out::F32, 7, false));
    let mut row = vec![0f32; 64];
    let src = &sf.bytes()[j.rec.data_offset as usize + 3 * 128..][..128];
    decode_row(j.rec.ty, src, &mut row);
    let got: &[f32] = r.buf.typed_data();
    assert_eq!(&got[3 * 64..4 * 64], &row[..]);
}

#[test]
fn the_records_table_as_arrow_keeps_its_columns_and_kind_enumeration() {
    let sf = open("qwen3tiny-f16-fa/state.bin");
    let map = layer_map(&sf.layout, None).unwrap();
    let t = records_table(&records(&sf.layout, &map));
    let n_cols = t.columns.len();
    let b = batch(t.clone());
    assert_eq!(b.num_columns(), n_cols);
    assert_eq!(b.num_rows(), 4);
    let kind = b.schema().field_with_name("kind").unwrap().clone();
    assert_eq!(kind.metadata()["_PL_ENUM_VALUES2"], "1;k1;v1;r1;s");
    let (schema, bs) = table_batches(vec![t.clone(), t]);
    assert_eq!((schema.fields().len(), bs.len()), (n_cols, 2));
    let (schema, bs) = table_batches(vec![]);
    assert_eq!((schema.fields().len(), bs.len()), (0, 0));
}
