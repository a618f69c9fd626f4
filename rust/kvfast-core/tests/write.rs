//! The writer on the states llama.cpp wrote (tests/data): every state's parts, written in its own
//! format, are its bytes; written as the newest format of each container, they walk again with
//! the same cells and rows.

use std::path::PathBuf;

use kvfast_core::write::parts::{Format, StateParts};
use kvfast_core::{walk, Container, Layout, WalkOptions};

fn states() -> Vec<PathBuf> {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    let mut out = vec![];
    for d in std::fs::read_dir(&data).unwrap().flatten() {
        if !d.path().is_dir() || d.file_name() == "models" {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            let p = f.path();
            if matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("bin" | "ggsq" | "ggsn")
            ) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The walk with no model, or as a V-less cache (the MLA fixtures); None for the memories whose
/// walk needs the model's recurrent layers.
fn walked(b: &[u8]) -> Option<Layout> {
    walk(b, WalkOptions::default()).ok().or_else(|| {
        let v_less = WalkOptions {
            v_less: Some(true),
            ..WalkOptions::default()
        };
        walk(b, v_less).ok()
    })
}

#[test]
fn every_state_is_written_back_byte_for_byte() {
    let mut n = 0;
    for p in states() {
        let b = std::fs::read(&p).unwrap();
        let Some(layout) = walked(&b) else { continue };
        let parts = StateParts::from_layout(&b, &layout).unwrap();
        assert!(parts.to_bytes().unwrap() == b, "{}", p.display());
        n += 1;
    }
    assert!(n >= 90, "only {n} states walked");
}

#[test]
fn the_newest_formats_walk_with_the_same_cells() {
    for p in states() {
        let b = std::fs::read(&p).unwrap();
        let Some(layout) = walked(&b) else { continue };
        if layout.caches.iter().any(|c| c.memory.is_recurrent()) {
            continue;
        }
        let opts = WalkOptions {
            v_less: Some(layout.features.contains(&"V-less")),
            ..WalkOptions::default()
        };
        for c in [
            Container::RawSeq,
            Container::Ggsq,
            Container::Ggsn,
            Container::RawState,
        ] {
            let mut parts = StateParts::from_layout(&b, &layout).unwrap();
            if parts.arch.is_none() {
                parts.arch = Some("qwen3".into());
            }
            if layout.rows_on_device && c != Container::RawSeq {
                // its rows are in llama.cpp's buffers: only the raw sequence bytes name them
                let e = parts.to_format(Format::newest(c), None).unwrap_err();
                assert!(e.to_string().contains("ON_DEVICE"), "{}: {e}", p.display());
                continue;
            }
            if matches!(c, Container::RawSeq | Container::Ggsq) {
                let seqs: Vec<i32> = layout.caches[0]
                    .streams
                    .iter()
                    .flat_map(|s| s.seq_ids.clone())
                    .collect();
                if seqs.iter().any(|q| *q != seqs[0]) {
                    parts.extract(seqs[0]).unwrap();
                }
            }
            parts.to_format(Format::newest(c), None).unwrap();
            let out = parts.to_bytes().unwrap();
            let again =
                walk(&out, opts).unwrap_or_else(|e| panic!("{} as {}: {e}", p.display(), c.name()));
            assert_eq!(again.container, c);
            for (x, y) in again.caches.iter().zip(&layout.caches) {
                for (s, t) in x.streams.iter().zip(&y.streams) {
                    if seqs_of(t).len() <= 1 {
                        assert_eq!(s.pos, t.pos, "{} as {}", p.display(), c.name());
                    }
                }
            }
        }
    }
}

fn seqs_of(s: &kvfast_core::Stream) -> Vec<i32> {
    let mut v = s.seq_ids.clone();
    v.sort_unstable();
    v.dedup();
    v
}

/// Bytes changed at random that still walk are written back as they are: the writer emits every
/// field the walk read, whatever its value.
#[test]
fn changed_bytes_that_walk_are_written_back_as_they_are() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut held = 0;
    for p in states() {
        let orig = std::fs::read(&p).unwrap();
        if orig.len() > 20_000 {
            continue;
        }
        for _ in 0..40 {
            let mut b = orig.clone();
            for _ in 0..1 + next() % 3 {
                let i = (next() % b.len() as u64) as usize;
                b[i] ^= 1 << (next() % 8);
            }
            let Some(layout) = walked(&b) else { continue };
            let parts = StateParts::from_layout(&b, &layout).unwrap();
            assert!(parts.to_bytes().unwrap() == b, "{}", p.display());
            held += 1;
        }
    }
    assert!(held > 500, "only {held} changed states walked");
}
