//! Remote states: the walk of a sparse copy, fetched a range at a time, is the walk of the whole
//! bytes (same layout, or the same error) for every fixture, hostile input and cut of them; it
//! fetches the metadata, not the rows; and no pass reads a byte that was not fetched.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use kvfast_core::plan::select::{jobs, Selection};
use kvfast_core::source::sparse::PAGE;
use kvfast_core::source::state::{Policy, METADATA_LIMIT};
use kvfast_core::{walk, Error, Kind, State, WalkOptions};

fn states(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            states(&p, out);
        } else if !matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("gguf" | "json" | "py" | "md" | "txt" | "parquet")
        ) {
            out.push(p);
        }
    }
}

fn all_inputs() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    states(&root.join("../../tests/data"), &mut out);
    states(&root.join("tests/fuzz-inputs"), &mut out);
    out.sort();
    out
}

/// The walk of `b` fetched a range at a time, with the bytes fetched.
fn remote(b: &[u8], opts: WalkOptions, policy: Policy) -> (Result<State, Error>, u64) {
    let fetched = Cell::new(0u64);
    let sf = State::remote(b.len() as u64, opts, policy, |ranges| {
        Ok(ranges
            .iter()
            .map(|&(o, n)| {
                fetched.set(fetched.get() + n);
                b[o as usize..(o + n) as usize].to_vec()
            })
            .collect())
    });
    (sf, fetched.get())
}

/// A fetch as small as it gets: one page at the start, nothing read ahead.
const TIGHT: Policy = Policy {
    head: PAGE,
    ahead: 0,
    piece: PAGE,
    metadata: METADATA_LIMIT,
};

fn same_walk(b: &[u8], what: &str, policy: Policy) {
    let whole = walk(b, WalkOptions::default());
    let (sparse, _) = remote(b, WalkOptions::default(), policy);
    match (whole, sparse) {
        (Ok(a), Ok(sf)) => assert_eq!(a, sf.layout, "{what}"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!(
            "{what}: whole {:?}, remote {:?}",
            a.map(|_| "a layout").map_err(|e| e.to_string()),
            b.map(|_| "a layout").map_err(|e| e.to_string())
        ),
    }
}

#[test]
fn every_fixture_and_hostile_input_walks_the_same_remote() {
    let inputs = all_inputs();
    assert!(inputs.len() > 50, "{} inputs", inputs.len());
    for p in inputs {
        let b = std::fs::read(&p).unwrap();
        let what = p.display().to_string();
        same_walk(&b, &what, TIGHT);
        same_walk(&b, &what, Policy::default());
    }
}

#[test]
fn cut_states_fail_the_same_remote() {
    for p in all_inputs().iter().step_by(7) {
        let b = std::fs::read(p).unwrap();
        for n in [
            0,
            3,
            4,
            9,
            b.len() / 3,
            b.len() / 2,
            b.len().saturating_sub(1),
        ] {
            let n = n.min(b.len());
            same_walk(&b[..n], &format!("{} cut at {n}", p.display()), TIGHT);
        }
    }
}

/// A raw sequence state with the io magic: one cache, one stream, f16 rows of `n` values.
fn seq_bytes(cells: u32, layers: u32, n: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for w in [0xAF14_3CD8u32, 0, 1, cells] {
        b.extend(w.to_le_bytes());
    }
    for p in 0..cells {
        for w in [p, 1, 0] {
            b.extend(w.to_le_bytes());
        }
    }
    b.extend(0u32.to_le_bytes());
    b.extend(layers.to_le_bytes());
    for l in 0..2 * layers {
        b.extend(1i32.to_le_bytes());
        b.extend((n * 2).to_le_bytes());
        b.extend(std::iter::repeat_n(
            l as u8,
            (n * 2 * cells as u64) as usize,
        ));
    }
    b
}

#[test]
fn the_walk_fetches_metadata_in_a_few_rounds_and_passes_need_their_rows() {
    // 28 layers of 256 cells x 1024 f16 values: 1 MiB per record
    let b = seq_bytes(256, 28, 1024);
    let (sf, fetched) = remote(&b, WalkOptions::default(), Policy::default());
    let sf = sf.unwrap();
    assert_eq!(sf.layout, walk(&b, WalkOptions::default()).unwrap());
    let s = sf.sparse().unwrap();
    let (rounds, _) = s.rounds();
    // the head, then every predicted header at once, then the walk ends
    assert!(rounds <= 3, "{rounds} rounds");
    // the head, a page per record header and a read-ahead per miss (of each reading tried): no rows
    assert!(
        fetched <= (256 << 10) + 57 * PAGE + 4 * (64 << 10),
        "{fetched} bytes fetched of {}",
        b.len()
    );
    assert_eq!(fetched, s.filled_bytes());
    // a pass over layer 3's K needs its rows: refused until they are fetched
    let sel = Selection {
        layers: Some(vec![3]),
        kinds: vec![Kind::K],
        ..Selection::default()
    };
    let js = jobs(&sf.layout, &sel).unwrap();
    assert_eq!(js.len(), 1);
    match sf.view(&js[0]) {
        Err(Error::NotFetched { offset, len, .. }) => {
            assert_eq!((offset, len), (js[0].rec.data_offset, js[0].rec.data_len));
        }
        Err(e) => panic!("expected NotFetched, got {e}"),
        Ok(_) => panic!("expected NotFetched, got a view"),
    }
    let want = sf.to_fetch(
        &[(js[0].rec.data_offset, js[0].rec.data_len)],
        Policy::default(),
    );
    let got: Vec<Vec<u8>> = want
        .iter()
        .map(|&(o, n)| b[o as usize..(o + n) as usize].to_vec())
        .collect();
    let got: Vec<&[u8]> = got.iter().map(|v| v.as_slice()).collect();
    kvfast_core::source::state::fill_fetched(s, &want, &got).unwrap();
    let v = sf.view(&js[0]).unwrap();
    let mut out = vec![0f32; 1024];
    v.decode(5, 6, &mut out);
    assert_eq!(out[0], half::f16::from_bits(0x0303).to_f32());
    // the record and about a page on each side, no more
    let rec = js[0].rec.data_len;
    assert!(s.filled_bytes() - fetched <= rec + 2 * PAGE);
    // the next layer is still not there
    let other = jobs(
        &sf.layout,
        &Selection {
            layers: Some(vec![4]),
            ..sel
        },
    )
    .unwrap();
    assert!(matches!(sf.view(&other[0]), Err(Error::NotFetched { .. })));
    // a short answer is an object that changed, not a loop
    let e = State::remote(b.len() as u64, WalkOptions::default(), TIGHT, |r| {
        Ok(r.iter().map(|_| vec![0u8; 10]).collect())
    })
    .err()
    .unwrap();
    assert!(matches!(e, Error::Changed { .. }), "{e}");
}

#[test]
fn a_state_with_a_fetch_fetches_what_a_pass_reads() {
    let b = std::sync::Arc::new(seq_bytes(256, 4, 1024));
    let (sf, before) = remote(&b, WalkOptions::default(), Policy::default());
    let mut sf = sf.unwrap();
    let src = b.clone();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = asked.clone();
    sf.set_fetch(Box::new(move |ranges: &[(u64, u64)]| {
        Ok(ranges
            .iter()
            .map(|&(o, n)| {
                count.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                src[o as usize..(o + n) as usize].to_vec()
            })
            .collect())
    }));
    let js = jobs(
        &sf.layout,
        &Selection {
            layers: Some(vec![2]),
            kinds: vec![Kind::V],
            ..Selection::default()
        },
    )
    .unwrap();
    let rec = js[0].rec;
    let fetched_before = sf.sparse().unwrap().filled_bytes();
    let v = sf.view(&js[0]).unwrap();
    let mut out = vec![0f32; 1024];
    v.decode(0, 1, &mut out);
    // layer 2's V is the 7th record (K 0..4, then V 0..4)
    assert_eq!(out[0], half::f16::from_bits(0x0606).to_f32());
    let got = asked.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        got + 2 * PAGE >= rec.data_len && got <= rec.data_len + 2 * PAGE,
        "{got}"
    );
    assert_eq!(sf.sparse().unwrap().filled_bytes(), fetched_before + got);
    assert!(before < b.len() as u64);
}

#[test]
fn a_header_claiming_more_cells_than_the_metadata_limit_is_refused_before_they_are_fetched() {
    // 10^8 cells claimed at byte 12 of a 1 GiB object of zeros after the header: the cells'
    // metadata (800 MB or more) would fit the object, so the walk alone would fetch it all
    let size = 1u64 << 30;
    let mut head = Vec::new();
    for w in [0xAF14_3CD8u32, 0, 1, 100_000_000] {
        head.extend(w.to_le_bytes());
    }
    let fetched = Cell::new(0u64);
    let r = State::remote(size, WalkOptions::default(), Policy::default(), |ranges| {
        Ok(ranges
            .iter()
            .map(|&(o, n)| {
                fetched.set(fetched.get() + n);
                let mut v = vec![0u8; n as usize];
                for (i, b) in v.iter_mut().enumerate() {
                    *b = head.get(o as usize + i).copied().unwrap_or(0);
                }
                v
            })
            .collect())
    });
    let e = r.err().expect("refused");
    let text = e.to_string();
    assert!(matches!(e, Error::Format { .. }), "{text}");
    assert!(
        text.contains("cache 0 stream 0 cell_count at byte 12 claims 100000000 cells"),
        "{text}"
    );
    assert!(text.contains(&METADATA_LIMIT.to_string()), "{text}");
    // the head only
    assert_eq!(fetched.get(), Policy::default().head);
    // a real state whose cells take more than a (small) limit: refused; with the default, read
    let small = seq_bytes(2000, 1, 8);
    let tight = Policy {
        metadata: 16 << 10,
        ..Policy::default()
    };
    let (r, got) = remote(&small, WalkOptions::default(), tight);
    assert!(got <= 16 << 10, "{got}");
    let text = r.err().expect("refused").to_string();
    assert!(text.contains("claims 2000 cells"), "{text}");
    let (r, _) = remote(&small, WalkOptions::default(), Policy::default());
    assert_eq!(
        r.unwrap().layout,
        walk(&small, WalkOptions::default()).unwrap()
    );
}
