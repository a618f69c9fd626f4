//! The states `llama_state_seq_get_data_ext`'s flags give (PARTIAL_ONLY: the part of a memory that
//! cannot be recomputed cheaply; ON_DEVICE: headers and cells, no row) and the states of an empty
//! sequence, on the states llama.cpp wrote (tests/data/*-partial, make_partial.py), opened with
//! and without their model.

use std::path::PathBuf;

use kvfast_core::model::geometry::Model;
use kvfast_core::open::{OpenOptions, Opened};
use kvfast_core::{Error, State, WalkOptions};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel)
}

/// The cache a PARTIAL_ONLY state lacks and its model layers (None: the flag changes nothing).
type Absent = Option<(&'static str, &'static [i32])>;

/// (folder, model, what its PARTIAL_ONLY state lacks).
const RUNS: [(&str, &str, Absent); 6] = [
    (
        "gemma3tiny-partial",
        "tiny-gemma3.gguf",
        Some(("full-attention cache", &[1, 3])),
    ),
    (
        "qwen35tiny-partial",
        "tiny-qwen35.gguf",
        Some(("attention cache", &[3])),
    ),
    (
        "lfm2tiny-partial",
        "tiny-lfm2.gguf",
        Some(("attention cache", &[2, 4])),
    ),
    (
        "lfm2swatiny-partial",
        "tiny-lfm2-swa.gguf",
        Some(("full-attention cache", &[])),
    ),
    ("mamba2tiny-partial", "tiny-mamba2.gguf", None),
    ("qwen3tiny-partial", "tiny-qwen3.gguf", None),
];

const FILES: [&str; 8] = [
    "seq-0.bin",
    "seq-0.partial.bin",
    "seq-0.device.bin",
    "seq-0.partial-device.bin",
    "seq-1.bin",
    "seq-1.ggsq",
    "seq-1.partial.bin",
    "state-empty.bin",
];

fn open(folder: &str, file: &str, model: Option<&Model>) -> Opened {
    let walk = match model {
        Some(m) => {
            let (v_less, recurrent) = m.geometry.walk_hints();
            WalkOptions {
                v_less,
                recurrent,
                ..WalkOptions::default()
            }
        }
        None => WalkOptions::default(),
    };
    let what = format!("{folder}/{file} (model: {})", model.is_some());
    let st = State::open(data(folder).join(file), walk).unwrap_or_else(|e| panic!("{what}: {e}"));
    let opts = OpenOptions {
        model: model.map(|m| &m.geometry),
        ..OpenOptions::default()
    };
    Opened::new(st, opts).unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn every_flagged_and_empty_state_opens_with_and_without_its_model() {
    for (folder, model, absent) in RUNS {
        let m = Model::read(data("models").join(model)).unwrap();
        let whole = open(folder, "seq-0.bin", Some(&m));
        assert_eq!(whole.partial, None, "{folder}");
        for file in FILES {
            let plain = open(folder, file, None);
            let op = open(folder, file, Some(&m));
            let what = format!("{folder}/{file}");
            // the cells are the bytes' whatever the model says
            let cells = |o: &Opened| -> Vec<(Vec<i32>, Vec<i32>)> {
                o.layout
                    .caches
                    .iter()
                    .flat_map(|c| &c.streams)
                    .map(|s| (s.pos.clone(), s.seq_ids.clone()))
                    .collect()
            };
            assert_eq!(cells(&plain), cells(&op), "{what}");
            let device = file.contains("device");
            assert_eq!(op.layout.rows_on_device, device, "{what}");
            assert_eq!(op.layout.features.contains(&"rows on device"), device);
            let flagged = file.contains("partial");
            let want = if flagged { absent } else { None };
            let got = op
                .partial
                .as_ref()
                .map(|p| (p.absent, p.model_layers.as_slice()));
            assert_eq!(got, want, "{what}");
            // every layer the state holds has its model layer, and the layers absent are not there
            let mut held: Vec<i32> = op
                .model_layers
                .iter()
                .flatten()
                .flatten()
                .copied()
                .collect();
            held.sort_unstable();
            let mut all: Vec<i32> = whole
                .model_layers
                .iter()
                .flatten()
                .flatten()
                .copied()
                .collect();
            all.sort_unstable();
            if let Some(p) = &op.partial {
                all.retain(|l| !p.model_layers.contains(l));
                // a hybrid keeps its recurrent layers, an iSWA model its sliding-window ones
                assert_eq!(held, all, "{what}");
            } else if !file.starts_with("seq-1") && file != "state-empty.bin" {
                assert_eq!(held, all, "{what}");
            }
        }
    }
}

#[test]
fn a_partial_state_holds_the_whole_states_rows_of_what_it_keeps() {
    // PARTIAL_ONLY writes the same cells and rows of the caches it keeps as the whole state
    for (folder, model, absent) in RUNS {
        let m = Model::read(data("models").join(model)).unwrap();
        let whole = open(folder, "seq-0.bin", Some(&m));
        let part = open(folder, "seq-0.partial.bin", Some(&m));
        let skip = match absent {
            Some((_, _)) => whole.layout.caches.len() - part.layout.caches.len(),
            None => 0,
        };
        for (c, w) in part.layout.caches.iter().zip(&whole.layout.caches[skip..]) {
            assert_eq!(c.memory, w.memory, "{folder}");
            for (s, t) in c.streams.iter().zip(&w.streams) {
                assert_eq!((&s.pos, &s.seq_ids), (&t.pos, &t.seq_ids), "{folder}");
                for (a, b) in s.layers.iter().zip(&t.layers) {
                    let rows = |o: &Opened, r: &kvfast_core::format::layout::Record| {
                        o.bytes()[r.data_offset as usize..(r.data_offset + r.data_len) as usize]
                            .to_vec()
                    };
                    assert_eq!(rows(&part, &a.k), rows(&whole, &b.k), "{folder}");
                    if let (Some(x), Some(y)) = (&a.v, &b.v) {
                        assert_eq!(rows(&part, x), rows(&whole, y), "{folder}");
                    }
                }
            }
        }
        let pm = &part.model_layers;
        assert_eq!(pm[..], whole.model_layers[skip..], "{folder}");
    }
}

#[test]
fn an_empty_recurrent_part_writes_every_record_header() {
    // s_trans, n_layer and an R and an S header per recurrent layer, each of 0 rows
    let m = Model::read(data("models/tiny-qwen35.gguf")).unwrap();
    let op = open("qwen35tiny-partial", "seq-1.partial.bin", Some(&m));
    let (_, r) = op.layout.recurrent().unwrap();
    let s = &r.streams[0];
    assert_eq!(s.cell_count, 0);
    assert_eq!(s.layers.len(), 3);
    assert!(s
        .layers
        .iter()
        .all(|l| l.k.data_len == 0 && l.k.row_bytes > 0));
    // io header 8, cell_count 4, s_trans 4, n_layer 4, 6 record headers of 12
    assert_eq!(op.layout.size, 8 + 4 + 4 + 4 + 6 * 12);
    assert_eq!(op.model_layers, vec![Some(vec![0, 1, 2])]);
}

#[test]
fn rows_kept_on_the_device_are_not_read_as_values() {
    let m = Model::read(data("models/tiny-qwen35.gguf")).unwrap();
    let op = open("qwen35tiny-partial", "seq-0.device.bin", Some(&m));
    let host = open("qwen35tiny-partial", "seq-0.bin", Some(&m));
    let (a, b) = (&op.layout.caches, &host.layout.caches);
    for (c, d) in a.iter().zip(b) {
        for (s, t) in c.streams.iter().zip(&d.streams) {
            assert_eq!((s.cell_count, &s.pos), (t.cell_count, &t.pos));
            for (x, y) in s.layers.iter().zip(&t.layers) {
                assert_eq!((x.k.ty, x.k.n_embd, x.k.data_len), (y.k.ty, y.k.n_embd, 0));
            }
        }
    }
    // the bytes are the host state's less its rows
    let (rows, _, _) = host.layout.byte_totals();
    assert_eq!(op.layout.size, host.layout.size - rows);
    let rec = &a[0].streams[0].layers[0].k;
    match op.require_record(rec) {
        Err(Error::NoRows { field, .. }) => assert_eq!(field, "k rows"),
        other => panic!("expected NoRows, got {other:?}"),
    }
}
