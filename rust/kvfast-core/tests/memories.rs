//! Memories other than one plain KV cache: V-less MLA caches, recurrent parts, hybrids; on the
//! states llama.cpp wrote (tests/data, make_memories.py) and on bytes cut from them.

use std::path::PathBuf;

use kvfast_core::format::layout::{Kind, Memory};
use kvfast_core::format::recurrent::RecurrentHint;
use kvfast_core::{walk, Error, Layout, WalkOptions};

const FILES: [&str; 4] = ["seq-0.bin", "seq-0.ggsq", "state.bin", "state.ggsn"];

fn bytes(folder: &str, file: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(folder)
        .join(file);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn v_less() -> WalkOptions {
    WalkOptions {
        v_less: Some(true),
        ..WalkOptions::default()
    }
}

fn hint(n_layer: u32, layers: u32) -> WalkOptions {
    WalkOptions {
        recurrent: Some(RecurrentHint { n_layer, layers }),
        ..WalkOptions::default()
    }
}

fn walk_ok(b: &[u8], opts: WalkOptions, what: &str) -> Layout {
    walk(b, opts).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// (record kinds of each layer, records' values per row) of every cache's first filled stream.
fn shape(l: &Layout) -> Vec<(&'static str, Vec<(Kind, u64)>)> {
    l.caches
        .iter()
        .map(|c| {
            let s = c
                .streams
                .iter()
                .find(|s| !s.layers.is_empty())
                .or(c.streams.first());
            let recs = s.map_or(vec![], |s| {
                Kind::ALL
                    .iter()
                    .flat_map(|&k| s.layers.iter().filter_map(move |ly| ly.record(k)))
                    .map(|r| (r.kind, r.n_embd))
                    .collect()
            });
            (c.memory.name(), recs)
        })
        .collect()
}

#[test]
fn a_v_less_mla_cache_opens_with_the_model_and_says_so_without_it() {
    for folder in [
        "deepseek2mla-f16-fa",
        "deepseek2mla-q8_0-fa",
        "deepseek2mla-f16-nofa",
    ] {
        for f in FILES {
            let b = bytes(folder, f);
            let l = walk_ok(&b, v_less(), &format!("{folder}/{f}"));
            assert_eq!(shape(&l), vec![("kv", vec![(Kind::K, 192); 2])]);
            assert!(l.features.contains(&"V-less"));
            let s = &l.caches[0].streams[0];
            assert_eq!(s.v_trans, folder.ends_with("nofa"));
            assert!(s.layers.iter().all(|ly| ly.v.is_none()));
            // without the model: the bytes are also those of a cache cut before its V records
            match walk(&b, WalkOptions::default()) {
                Err(Error::Ambiguous {
                    field,
                    offset,
                    readings,
                }) => {
                    assert!(field.contains("model="), "{field}");
                    assert_eq!(offset, b.len() as u64);
                    assert!(readings[0].contains("V-less"), "{readings:?}");
                    assert!(readings[1].contains("cut"), "{readings:?}");
                }
                other => panic!("{folder}/{f}: expected ambiguity, got {other:?}"),
            }
            // a model with V: the state is cut short
            let with_v = WalkOptions {
                v_less: Some(false),
                ..WalkOptions::default()
            };
            match walk(&b, with_v) {
                Err(Error::Truncated { field, offset, .. }) => {
                    assert!(
                        field.starts_with("cache 0 stream 0 layer 0 v type"),
                        "{field}"
                    );
                    assert_eq!(offset, b.len() as u64);
                }
                other => panic!("{folder}/{f}: expected a truncation, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_state_cut_between_k_and_v_never_reads_as_v_less() {
    // a plain qwen3 state cut after its K records
    let b = bytes("qwen3tiny-f16-fa", "seq-0.bin");
    let l = walk_ok(&b, WalkOptions::default(), "qwen3tiny");
    let s = &l.caches[0].streams[0];
    let last_k = s.layers.last().unwrap().k.clone();
    let cut = &b[..(last_k.data_offset + last_k.data_len) as usize];
    assert!(matches!(
        walk(cut, WalkOptions::default()),
        Err(Error::Ambiguous { .. })
    ));
    // every other cut is a plain error
    for n in [cut.len() - 1, cut.len() + 1, cut.len() + 12] {
        let e = walk(&b[..n], WalkOptions::default()).unwrap_err();
        assert!(!matches!(e, Error::Ambiguous { .. }), "{n}: {e}");
    }
}

#[test]
fn a_recurrent_memory_opens_with_or_without_the_model() {
    for (folder, files) in [
        ("mamba2tiny-f32", &FILES[..]),
        (
            "mamba2tiny-2seq",
            &[
                "seq-0.bin",
                "seq-1.bin",
                "seq-0.ggsq",
                "seq-1.ggsq",
                "state.bin",
                "state.ggsn",
            ][..],
        ),
    ] {
        for f in files {
            let b = bytes(folder, f);
            for opts in [WalkOptions::default(), hint(2, 2)] {
                let l = walk_ok(&b, opts, &format!("{folder}/{f}"));
                assert_eq!(
                    shape(&l),
                    vec![(
                        "recurrent",
                        vec![
                            (Kind::R, 480),
                            (Kind::R, 480),
                            (Kind::S, 2048),
                            (Kind::S, 2048)
                        ]
                    )]
                );
                let c = &l.caches[0];
                assert_eq!(c.memory, Memory::Recurrent { n_layer: 2 });
                assert!(!c.has_n_stream);
                let s = &c.streams[0];
                let whole = f.starts_with("state");
                let two = folder.ends_with("2seq");
                assert_eq!(s.cell_count, if whole && two { 2 } else { 1 });
                if whole {
                    assert_eq!(s.cell_seqs(0), &[0]);
                } else {
                    assert!(s.cell_seqs(0).is_empty());
                }
                assert!(l.features.contains(&"recurrent part"));
                assert!(!l.features.contains(&"n_stream"));
            }
            // a model of other layers
            assert!(walk(&b, hint(3, 3)).is_err());
            assert!(walk(&b, hint(2, 1)).is_err());
        }
    }
}

#[test]
fn hybrids_hold_attention_caches_then_the_recurrent_part() {
    let kv = |n: usize, w: u64| {
        let mut v = vec![(Kind::K, w); n];
        v.extend(vec![(Kind::V, w); n]);
        v
    };
    let rec = |n: usize, r: u64, s: u64| {
        let mut v = vec![(Kind::R, r); n];
        v.extend(vec![(Kind::S, s); n]);
        ("recurrent", v)
    };
    for (folders, n_layer, want) in [
        (
            &[
                "qwen35tiny-f16-fa",
                "qwen35tiny-q8_0-fa",
                "qwen35tiny-f16-nofa",
                "qwen35tiny-2seq",
            ][..],
            4,
            vec![("kv", kv(1, 64)), rec(3, 384, 1024)],
        ),
        (
            &["lfm2tiny-f16-fa", "lfm2tiny-q8_0-fa"][..],
            5,
            vec![("kv", kv(2, 64)), rec(3, 128, 0)],
        ),
        (
            &["lfm2swatiny-f16-fa"][..],
            5,
            vec![("kv", vec![]), ("kv", kv(2, 64)), rec(3, 128, 0)],
        ),
    ] {
        for folder in folders {
            for f in FILES {
                let b = bytes(folder, f);
                for opts in [WalkOptions::default(), hint(n_layer, 3)] {
                    let l = walk_ok(&b, opts, &format!("{folder}/{f}"));
                    assert_eq!(shape(&l), want, "{folder}/{f}");
                    let (ri, r) = l.recurrent().expect("a recurrent part");
                    assert_eq!(ri, l.caches.len() - 1);
                    assert_eq!(r.memory, Memory::Recurrent { n_layer });
                    assert_eq!(
                        l.ext_bytes,
                        if folder.starts_with("qwen35") { 12 } else { 0 }
                    );
                }
                // regions tile the file, the recurrent records named r and s
                let l = walk_ok(&b, WalkOptions::default(), folder);
                let mut at = 0;
                for r in l.regions() {
                    assert_eq!(r.offset, at, "{folder}/{f} {}", r.what);
                    at += r.nbytes;
                }
                assert_eq!(at, b.len() as u64);
                let whats: Vec<_> = l.regions().iter().map(|r| r.what).collect();
                assert!(whats.contains(&"recurrent header") && whats.contains(&"s rows"));
            }
        }
    }
}

#[test]
fn cuts_of_a_recurrent_state_are_errors() {
    let b = bytes("mamba2tiny-f32", "seq-0.bin");
    let l = walk_ok(&b, WalkOptions::default(), "mamba2");
    let s = &l.caches[0].streams[0];
    // every byte of the metadata, every 13th of the rows, and both sides of each record header
    let mut cuts: Vec<usize> = (0..s.layer_header_offset as usize + 12).collect();
    cuts.extend((0..b.len()).step_by(13));
    for ly in &s.layers {
        for r in [&ly.k, ly.v.as_ref().unwrap()] {
            let h = r.header_offset as usize;
            cuts.extend([h - 1, h, h + 1, h + 12]);
        }
    }
    for n in cuts {
        let cut = &b[..n];
        for opts in [WalkOptions::default(), hint(2, 2)] {
            match walk(cut, opts) {
                Ok(l) => panic!("{n} bytes read as {:?}", shape(&l)),
                Err(e) => assert!(e.offset().unwrap() <= n as u64, "{n}: {e}"),
            }
        }
    }
    // cut after the R records: R and S of one width, which only the model tells apart
    let r_only = &b[..s.layers[0].v.as_ref().unwrap().header_offset as usize];
    match walk(r_only, WalkOptions::default()) {
        Err(Error::Ambiguous { field, .. }) => assert!(field.contains("model="), "{field}"),
        other => panic!("expected ambiguity, got {other:?}"),
    }
}

#[test]
fn a_recurrent_arch_takes_no_attention_cache_and_every_layer() {
    // the whole state of mamba2: its arch says every layer has records
    let b = bytes("mamba2tiny-f32", "state.bin");
    let l = walk_ok(&b, WalkOptions::default(), "mamba2 state");
    let s = &l.caches[0].streams[0];
    // drop S 1 and R 1: the records of one layer, cut out
    let r1 = &s.layers[1].k;
    let s1 = s.layers[1].v.as_ref().unwrap();
    let mut cut = b[..r1.header_offset as usize].to_vec();
    cut.extend(&b[(r1.data_offset + r1.data_len) as usize..s1.header_offset as usize]);
    let e = walk(&cut, WalkOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("each of the 2 layers of mamba2"),
        "{e}"
    );
}

#[test]
fn a_hybrid_cut_after_its_attention_cache_needs_the_model_to_say_so() {
    let b = bytes("lfm2tiny-f16-fa", "seq-0.bin");
    let l = walk_ok(&b, WalkOptions::default(), "lfm2");
    let (_, r) = l.recurrent().unwrap();
    let cut = &b[..r.offset as usize];
    // the bytes alone: a plain state of one attention cache (as an iSWA state cut after its
    // first cache reads as one cache)
    let plain = walk_ok(cut, WalkOptions::default(), "lfm2 cut");
    assert_eq!(plain.caches.len(), 1);
    assert!(plain.recurrent().is_none());
    // the model says a recurrent part follows
    let e = walk(cut, hint(5, 3)).unwrap_err();
    assert!(e.field().unwrap().contains("recurrent part"), "{e}");
    // the arch of a whole state says so too
    let b = bytes("lfm2tiny-f16-fa", "state.bin");
    let l = walk_ok(&b, WalkOptions::default(), "lfm2 state");
    let (_, r) = l.recurrent().unwrap();
    assert!(walk(&b[..r.offset as usize], WalkOptions::default()).is_err());
    // and every cut inside the recurrent part is an error with or without the model
    let b = bytes("lfm2tiny-f16-fa", "seq-0.bin");
    let l = walk_ok(&b, WalkOptions::default(), "lfm2");
    let (_, r) = l.recurrent().unwrap();
    for n in (r.offset as usize + 1..b.len()).step_by(7) {
        for opts in [WalkOptions::default(), hint(5, 3)] {
            assert!(walk(&b[..n], opts).is_err(), "{n}");
        }
    }
}
