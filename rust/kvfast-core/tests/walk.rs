//! The walker on real llama.cpp states (tests/data) and on hand-built bytes.

use std::path::PathBuf;

use kvfast_core::{walk, Container, Error, GgmlType, State, WalkOptions};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel)
}

fn open(rel: &str) -> State {
    State::open(data(rel), WalkOptions::default()).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A raw sequence state with the io magic: one cache, one stream, f16 rows of `n` values.
fn seq_bytes(cells: u32, layers: u32, n: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(0xAF14_3CD8u32.to_le_bytes());
    b.extend(0i32.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    b.extend(cells.to_le_bytes());
    for p in 0..cells {
        b.extend((p as i32).to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(0i32.to_le_bytes());
    }
    b.extend(0u32.to_le_bytes());
    b.extend(layers.to_le_bytes());
    for _ in 0..2 * layers {
        b.extend(1i32.to_le_bytes());
        b.extend((n * 2).to_le_bytes());
        b.extend(std::iter::repeat_n(0u8, (n * 2 * cells as u64) as usize));
    }
    b
}

#[test]
fn worked_example_of_the_format_doc() {
    let b = seq_bytes(7, 28, 1024);
    assert_eq!(b.len(), 803_596);
    let l = walk(&b, WalkOptions::default()).unwrap();
    assert_eq!(l.byte_totals(), (802_816, 0, 780));
    assert_eq!(l.caches[0].streams[0].layers[0].k.data_offset, 120);
    let regions = l.regions();
    let mut at = 0;
    for r in &regions {
        assert_eq!(r.offset, at);
        at += r.nbytes;
    }
    assert_eq!(at, 803_596);
}

#[test]
fn every_truncation_is_an_error_with_an_offset() {
    let b = seq_bytes(3, 2, 32);
    for n in 0..b.len() {
        let e = walk(&b[..n], WalkOptions::default()).expect_err("truncated bytes must not parse");
        assert!(e.offset().unwrap() <= n as u64, "{e}");
    }
}

#[test]
fn huge_counts_fail_before_allocating() {
    let mut b = seq_bytes(3, 2, 32);
    b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        walk(&b, WalkOptions::default()),
        Err(Error::Truncated { offset: 16, .. })
    ));
    let mut b = seq_bytes(3, 2, 32);
    let nl = 16 + 3 * 12 + 4;
    b[nl..nl + 4].copy_from_slice(&4000u32.to_le_bytes());
    assert!(walk(&b, WalkOptions::default()).is_err());
}

#[test]
fn fixtures_of_every_era() {
    let s = open("qwen3tiny-f16-fa/seq-0.bin");
    assert_eq!(s.layout.container, Container::RawSeq);
    assert_eq!(s.layout.seq_id, Some(0));
    let s = open("qwen3tiny-f16-fa-2025may/seq-0.ggsq");
    assert_eq!(
        (s.layout.container, s.layout.version),
        (Container::Ggsq, Some(2))
    );
    assert!(!s.layout.caches[0].has_n_stream);
    let s = open("qwen3tiny-f16-fa-2025/state.ggsn");
    assert_eq!(s.layout.outputs.as_ref().unwrap().n_logits, 256);
    let s = open("gemma3-270m-f16-fa/state.bin");
    assert_eq!(s.layout.caches.len(), 2);
    assert_eq!(s.layout.arch.as_deref(), Some("gemma3"));
    let s = open("qwen3tiny-q4_0-q4_1-fa/seq-0.ggsq");
    let l = &s.layout.caches[0].streams[0].layers[1];
    assert_eq!(
        (l.k.ty, l.v.as_ref().unwrap().ty),
        (GgmlType::Q4_0, GgmlType::Q4_1)
    );
    let s = open("qwen2vltiny-f16-fa/state.ggsn");
    assert_eq!(s.layout.ext_bytes, 12);
    let s = open("qwen3tiny-f16-nofa/seq-0.bin");
    assert!(
        s.layout.caches[0].streams[0].layers[0]
            .v
            .as_ref()
            .unwrap()
            .transposed
    );
}

/// A deterministic fuzz pass: random byte flips, splices and truncations of every fixture must
/// give a layout or an error, never a panic, and an accepted layout must tile the bytes.
#[test]
fn random_mutations_never_panic() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).into_iter().flatten())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("bin" | "ggsq" | "ggsn")
            )
        })
        .collect();
    files.sort();
    assert!(files.len() >= 30);
    for path in files {
        let orig = std::fs::read(&path).unwrap();
        for _ in 0..300 {
            let mut b = orig.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % b.len() as u64) as usize;
                match next() % 3 {
                    0 => b[at] = next() as u8,
                    1 => b[at] ^= 1 << (next() % 8),
                    _ => {
                        let v = [0u8, 0xFF, 0x7F, 0x80][(next() % 4) as usize];
                        let end = (at + 4).min(b.len());
                        b[at..end].fill(v);
                    }
                }
            }
            if next() % 5 == 0 {
                b.truncate((next() % b.len() as u64) as usize);
            }
            if let Ok(layout) = walk(&b, WalkOptions::default()) {
                let total: u64 = layout.regions().iter().map(|r| r.nbytes).sum();
                assert_eq!(total, b.len() as u64, "{}", path.display());
            }
        }
    }
}
