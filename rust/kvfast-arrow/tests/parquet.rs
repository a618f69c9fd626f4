//! The Parquet writer on a real llama.cpp state (tests/data): files read back with the parquet
//! crate's Arrow reader hold the value table's rows and columns, one row group per record (or per
//! `row_group_bytes` of its values), and its failures come back as errors.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Int32Type, UInt16Type, UInt32Type, UInt8Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use kvfast_arrow::export_columns::{layer_types, CellTokens};
use kvfast_arrow::parquet::{check_zstd, write_part, Part, Rec, Settings, Shared};
use kvfast_arrow::table::{batches, TableRequest};
use kvfast_arrow::Error;
use kvfast_core::model::layer_map::layer_map;
use kvfast_core::plan::select::{jobs, Selection};
use kvfast_core::plan::table_plan::Dtype;
use kvfast_core::{Kind, State, WalkOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const FIXTURE: &str = "qwen3tiny-f16-fa/seq-0.bin";

fn open(rel: &str) -> State {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel);
    State::open(&p, WalkOptions::default()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A fresh folder of this test's own.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvfast-arrow-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The index columns as kvfast's Python side gives them (what Polars hands a writer): dump and
/// path first, strings as views, every field nullable, kind's enumeration metadata kept, then
/// the columns an export adds (the cache types a dictionary, token and piece).
fn index_schema(sf: &State) -> SchemaRef {
    let (table, _) = batches(sf, &request(sf, Dtype::Stored, false), None).unwrap();
    let mut fields = vec![
        Field::new("dump", DataType::Utf8View, true),
        Field::new("path", DataType::Utf8View, true),
    ];
    for f in table.fields().iter() {
        let ty = match f.data_type() {
            DataType::Dictionary(k, _) => {
                DataType::Dictionary(k.clone(), Box::new(DataType::Utf8View))
            }
            t => t.clone(),
        };
        fields.push(Field::new(f.name(), ty, true).with_metadata(f.metadata().clone()));
    }
    let types = DataType::Dictionary(Box::new(DataType::UInt8), Box::new(DataType::Utf8View));
    fields.push(Field::new("k_type", types.clone(), true));
    fields.push(Field::new("v_type", types, true));
    fields.push(Field::new("token", DataType::Int32, true));
    fields.push(Field::new("piece", DataType::Utf8View, true));
    Arc::new(Schema::new_with_metadata(fields, HashMap::new()))
}

fn selection(hd_k: u64, hd_v: u64) -> Selection {
    Selection {
        head_dim_k: Some(hd_k),
        head_dim_v: Some(hd_v),
        ..Selection::default()
    }
}

fn request(sf: &State, dtype: Dtype, with_values: bool) -> TableRequest {
    TableRequest {
        sel: selection(32, 32),
        dtype,
        model_layers: layer_map(&sf.layout, None).unwrap(),
        with_values,
        ragged: false,
    }
}

/// One record per (layer, kind) of cache 0, kinds outside (the value table's order).
fn records(sf: &State, base: &Selection) -> Vec<Rec> {
    let mut out = vec![];
    for kind in [Kind::K, Kind::V] {
        for layer in 0..2 {
            let sel = Selection {
                caches: Some(vec![0]),
                layers: Some(vec![layer]),
                kinds: vec![kind],
                ..base.clone()
            };
            // (an impossible selection: no bytes; the writer reports the plan's error)
            let nbytes = jobs(&sf.layout, &sel)
                .map(|js| js.iter().map(|j| j.rec.data_len).sum())
                .unwrap_or(0);
            let (k_type, v_type) = layer_types(&sf.layout, 0, layer);
            out.push(Rec {
                sel,
                nbytes,
                k_type,
                v_type,
            });
        }
    }
    out
}

fn settings(row_group_bytes: usize) -> Settings {
    Settings {
        zstd: Some(1),
        split: false,
        page_bytes: 1 << 16,
        row_group_bytes,
    }
}

/// What a partition's write gave: rows written and the values' type.
type Written = Result<(u64, Option<&'static str>), Error>;

/// Tokens of the fixture's stream 0 of cache 0: cell i holds token 100 + i, and piece "p<i>" but
/// the last cell's, unknown.
fn tokens(sf: &State) -> CellTokens {
    let n = sf.layout.caches[0].streams[0].cell_count as i32;
    CellTokens {
        cells: [((0, 0), (0..n).map(|i| (100 + i, i)).collect())].into(),
        pieces: (0..n - 1).map(|i| format!("p{i}")).collect(),
    }
}

/// Write `part`, counting the progress calls and their bytes.
fn write(sf: &State, part: &Part, settings: Settings) -> (Written, usize, u64) {
    let toks = tokens(sf);
    let shared = Shared {
        sf,
        tokens: &toks,
        model_layers: layer_map(&sf.layout, None).unwrap(),
        seq_default: sf.layout.own_seq(),
        dump: "dump-1",
        path: "/states/seq-0.bin",
        index: index_schema(sf),
        settings,
    };
    let (calls, bytes) = (AtomicUsize::new(0), AtomicU64::new(0));
    let r = write_part::<Error>(&shared, part, |n| {
        calls.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    });
    (r, calls.into_inner(), bytes.into_inner())
}

fn read(path: &Path) -> (Vec<usize>, Vec<RecordBatch>) {
    let b = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let groups = b
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as usize)
        .collect();
    let batches = b.build().unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    (groups, batches)
}

fn floats(a: &dyn Array) -> Vec<f32> {
    let list = a.as_fixed_size_list();
    let v = list.values();
    match v.data_type() {
        DataType::Float16 => v
            .as_primitive::<Float16Type>()
            .values()
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        DataType::Float32 => v.as_primitive::<Float32Type>().values().to_vec(),
        t => panic!("values of {t}"),
    }
}

fn strings(a: &dyn Array) -> Vec<String> {
    match a.data_type() {
        DataType::Utf8View => a
            .as_string_view()
            .iter()
            .map(|s| s.unwrap().to_string())
            .collect(),
        DataType::Utf8 => a
            .as_string::<i32>()
            .iter()
            .map(|s| s.unwrap().to_string())
            .collect(),
        DataType::LargeUtf8 => a
            .as_string::<i64>()
            .iter()
            .map(|s| s.unwrap().to_string())
            .collect(),
        t => panic!("strings of {t}"),
    }
}

/// The file's rows equal the value table's, column by column.
fn check_same_rows(file: &[RecordBatch], table: &[RecordBatch]) {
    let col = |bs: &[RecordBatch], name: &str| -> Vec<Arc<dyn Array>> {
        bs.iter()
            .map(|b| b.column_by_name(name).unwrap().clone())
            .collect()
    };
    let n: usize = table.iter().map(|b| b.num_rows()).sum();
    assert_eq!(file.iter().map(|b| b.num_rows()).sum::<usize>(), n);
    for name in ["dump", "path"] {
        let got: Vec<String> = col(file, name)
            .iter()
            .flat_map(|a| strings(a.as_ref()))
            .collect();
        let want = if name == "dump" {
            "dump-1"
        } else {
            "/states/seq-0.bin"
        };
        assert_eq!(got, vec![want.to_string(); n]);
    }
    macro_rules! same {
        ($name:literal, $t:ty) => {{
            let got: Vec<_> = col(file, $name)
                .iter()
                .flat_map(|a| a.as_primitive::<$t>().values().to_vec())
                .collect();
            let want: Vec<_> = col(table, $name)
                .iter()
                .flat_map(|a| a.as_primitive::<$t>().values().to_vec())
                .collect();
            assert_eq!(got, want, $name);
        }};
    }
    same!("cache", UInt8Type);
    same!("layer", UInt16Type);
    same!("model_layer", UInt16Type);
    same!("cell", UInt32Type);
    same!("head", UInt16Type);
    let kinds = |bs: &[RecordBatch]| -> Vec<String> {
        col(bs, "kind")
            .iter()
            .flat_map(|a| {
                let d = a.as_dictionary::<UInt8Type>();
                let words = strings(d.values().as_ref());
                d.keys()
                    .values()
                    .iter()
                    .map(|&k| words[k as usize].clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert_eq!(kinds(file), kinds(table));
    check_added_columns(
        &col(file, "k_type"),
        &col(file, "v_type"),
        &col(file, "token"),
        &col(file, "piece"),
        &col(file, "cell"),
    );
    let got: Vec<f32> = col(file, "values")
        .iter()
        .flat_map(|a| floats(a.as_ref()))
        .collect();
    let want: Vec<f32> = col(table, "values")
        .iter()
        .flat_map(|a| floats(a.as_ref()))
        .collect();
    assert_eq!(got.len(), want.len());
    assert!(got
        .iter()
        .zip(&want)
        .all(|(g, w)| g.to_bits() == w.to_bits()));
}

/// The fixture's types (f16 K and V) on every row; each row's token and piece its cell's (as
/// [`tokens`] gives them), the last cell's piece null.
fn check_added_columns(
    k: &[Arc<dyn Array>],
    v: &[Arc<dyn Array>],
    token: &[Arc<dyn Array>],
    piece: &[Arc<dyn Array>],
    cell: &[Arc<dyn Array>],
) {
    let words = |a: &Arc<dyn Array>| -> Vec<String> {
        let d = a.as_dictionary::<UInt8Type>();
        let words = strings(d.values().as_ref()); // the file's dictionary: the words it uses
        assert_eq!(d.null_count(), 0);
        d.keys()
            .values()
            .iter()
            .map(|&k| words[k as usize].clone())
            .collect()
    };
    for types in [k, v] {
        assert!(types.iter().flat_map(words).all(|t| t == "f16"));
    }
    let cells: Vec<u32> = cell
        .iter()
        .flat_map(|a| a.as_primitive::<UInt32Type>().values().to_vec())
        .collect();
    let tokens: Vec<Option<i32>> = token
        .iter()
        .flat_map(|a| a.as_primitive::<Int32Type>().iter().collect::<Vec<_>>())
        .collect();
    let pieces: Vec<Option<String>> = piece
        .iter()
        .flat_map(|a| {
            a.as_string_view()
                .iter()
                .map(|s| s.map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    let last = cells.iter().max().copied().unwrap();
    for ((c, t), p) in cells.iter().zip(&tokens).zip(&pieces) {
        assert_eq!(*t, Some(100 + *c as i32));
        assert_eq!(*p, (*c < last).then(|| format!("p{c}")));
    }
}

#[test]
fn a_partition_read_back_holds_the_value_table_one_row_group_per_record() {
    let sf = open(FIXTURE);
    let dir = scratch("whole");
    let dest = dir.join("layer=all/part.parquet"); // its folder made as needed
    let recs = records(&sf, &selection(32, 32));
    let want_bytes: u64 = recs.iter().map(|r| r.nbytes).sum();
    let part = Part {
        dest: dest.clone(),
        records: recs,
        dtype: Dtype::Stored,
    };
    let (r, calls, bytes) = write(&sf, &part, settings(64 << 20));
    assert_eq!(r.unwrap(), (4 * 14, Some("float16")));
    assert_eq!((calls, bytes), (4, want_bytes));
    let (groups, file) = read(&dest);
    assert_eq!(groups, [14; 4], "a row group per record: 7 cells x 2 heads");
    let schema = file[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "dump",
            "path",
            "cache",
            "stream",
            "layer",
            "model_layer",
            "kind",
            "cell",
            "pos",
            "seq_id",
            "head",
            "k_type",
            "v_type",
            "token",
            "piece",
            "values"
        ]
    );
    let DataType::FixedSizeList(item, 32) = schema.field(15).data_type() else {
        panic!("values: {}", schema.field(15).data_type())
    };
    assert_eq!(
        (item.name().as_str(), item.data_type()),
        ("element", &DataType::Float16)
    );
    assert_eq!(
        schema.field_with_name("kind").unwrap().metadata()["_PL_ENUM_VALUES2"],
        "1;k1;v1;r1;s"
    );
    let (_, table) = batches(&sf, &request(&sf, Dtype::Stored, true), sf.layout.own_seq()).unwrap();
    check_same_rows(&file, &table);
}

#[test]
fn row_groups_split_at_row_group_bytes_whole_cells_each() {
    let sf = open(FIXTURE);
    let dir = scratch("split");
    let (_, table) = batches(&sf, &request(&sf, Dtype::F32, true), sf.layout.own_seq()).unwrap();
    // f32 rows of 64 values: 256 bytes a cell; 600 bytes hold 2 cells (4 rows of 2 heads)
    for (k, s) in [
        settings(600),
        Settings {
            zstd: None,
            split: true,
            page_bytes: 1,
            row_group_bytes: 600,
        },
        Settings {
            zstd: Some(3),
            split: true,
            page_bytes: 300,
            row_group_bytes: 600,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let dest = dir.join(format!("{k}.parquet"));
        let part = Part {
            dest: dest.clone(),
            records: records(&sf, &selection(32, 32)),
            dtype: Dtype::F32,
        };
        let (r, _, _) = write(&sf, &part, s);
        assert_eq!(r.unwrap(), (56, Some("float32")));
        let (groups, file) = read(&dest);
        assert_eq!(groups, [4, 4, 4, 2].repeat(4), "{s:?}");
        check_same_rows(&file, &table);
    }
    // less than a cell: a cell per row group
    let dest = dir.join("small.parquet");
    let part = Part {
        dest: dest.clone(),
        records: records(&sf, &selection(32, 32)),
        dtype: Dtype::F32,
    };
    write(&sf, &part, settings(1)).0.unwrap();
    assert_eq!(read(&dest).0, [2; 28]);
}

#[test]
fn a_partition_of_no_record_writes_no_file() {
    let sf = open(FIXTURE);
    let dest = scratch("empty").join("none.parquet");
    let part = Part {
        dest: dest.clone(),
        records: vec![],
        dtype: Dtype::Stored,
    };
    let (r, calls, _) = write(&sf, &part, settings(64 << 20));
    assert_eq!((r.unwrap(), calls), ((0, None), 0));
    assert!(!dest.exists());
}

#[test]
fn failures_are_errors_with_their_messages() {
    let sf = open(FIXTURE);
    let dir = scratch("errors");
    // K in heads of 32, V in heads of 16: two values types in one file
    let dest = dir.join("mixed.parquet");
    let part = Part {
        dest: dest.clone(),
        records: records(&sf, &selection(32, 16)),
        dtype: Dtype::Stored,
    };
    let (r, calls, _) = write(&sf, &part, settings(64 << 20));
    let e = r.unwrap_err();
    assert!(matches!(e, Error::MixedValues { .. }), "{e:?}");
    assert_eq!(
        calls, 2,
        "the two K records were written before the first V"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: the partition's records have values of different types or head sizes \
             (FixedSizeList(32 x non-null Float16) and FixedSizeList(16 x non-null Float16)): \
             partition by kind too (partition_by=(\"layer\", \"kind\"))",
            dest.display()
        )
    );
    // a folder that cannot be made (a file is in the way)
    std::fs::write(dir.join("file"), b"x").unwrap();
    let dest = dir.join("file/part.parquet");
    let part = Part {
        dest: dest.clone(),
        records: records(&sf, &selection(32, 32)),
        dtype: Dtype::Stored,
    };
    let e = write(&sf, &part, settings(64 << 20)).0.unwrap_err();
    assert!(matches!(e, Error::Write { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("writing {}: ", dest.display())),
        "{e}"
    );
    // an impossible selection: the plan's error
    let part = Part {
        dest: dir.join("hd.parquet"),
        records: records(&sf, &selection(5, 32)),
        dtype: Dtype::Stored,
    };
    let e = write(&sf, &part, settings(64 << 20)).0.unwrap_err();
    assert_eq!(
        e.to_string(),
        "head_dim 5 does not divide the 64 values per k row of layer 0"
    );
    // a zstd level the writer refuses
    assert!(matches!(check_zstd(1000), Err(Error::Parquet(_))));
    assert!(check_zstd(3).is_ok());
}

#[test]
fn the_progress_callback_error_stops_the_write() {
    let sf = open(FIXTURE);
    let part = Part {
        dest: scratch("stop").join("p.parquet"),
        records: records(&sf, &selection(32, 32)),
        dtype: Dtype::Stored,
    };
    let toks = CellTokens::default();
    let shared = Shared {
        sf: &sf,
        tokens: &toks,
        model_layers: layer_map(&sf.layout, None).unwrap(),
        seq_default: None,
        dump: "d",
        path: "p",
        index: index_schema(&sf),
        settings: settings(64 << 20),
    };
    let calls = AtomicUsize::new(0);
    let r = write_part(&shared, &part, |_| {
        calls.fetch_add(1, Ordering::Relaxed);
        Err(Error::Write {
            path: "stopped".into(),
            message: "by the caller".into(),
        })
    });
    assert_eq!(r.unwrap_err().to_string(), "writing stopped: by the caller");
    assert_eq!(calls.into_inner(), 1);
}
