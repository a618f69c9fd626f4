//! Streams of one cache must agree on their layers: a state whose streams differ (a row width, a
//! type, v_trans, the layer count) is refused at open, naming the field and its byte offset,
//! because every kernel that reads a cache's records takes their geometry from one of them.

use kvfast_core::stats::passes::{accumulate, cell_stats};
use kvfast_core::values::view::RecordView;
use kvfast_core::{walk, Error, State, WalkOptions};

/// One stream: `cells` cells of sequence 0, `layers` layers of K and V records, each
/// `(type id, row_bytes)`; `v_trans` writes V element-major (f16, el_bytes 2, n_embd = row/2).
struct StreamSpec {
    cells: u32,
    v_trans: bool,
    records: Vec<((i32, u64), (i32, u64))>,
}

fn stream(cells: u32, k: (i32, u64), v: (i32, u64)) -> StreamSpec {
    StreamSpec {
        cells,
        v_trans: false,
        records: vec![(k, v)],
    }
}

/// A raw sequence state with the io magic and one cache of the given streams; row bytes count up.
fn state(streams: &[StreamSpec]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(0xAF14_3CD8u32.to_le_bytes());
    b.extend(0i32.to_le_bytes());
    b.extend((streams.len() as u32).to_le_bytes());
    let mut fill = 0u8;
    let mut rows = |b: &mut Vec<u8>, n: u64| {
        for _ in 0..n {
            // small f16 values (high byte 0x3C: 1.0 to 2.0), valid in every type's scales
            fill = fill.wrapping_add(1);
            b.push(if b.len() % 2 == 0 { fill } else { 0x3C });
        }
    };
    for s in streams {
        b.extend(s.cells.to_le_bytes());
        if s.cells == 0 {
            continue; // an empty stream is its cell_count alone
        }
        for p in 0..s.cells {
            b.extend((p as i32).to_le_bytes());
            b.extend(1u32.to_le_bytes());
            b.extend(0i32.to_le_bytes());
        }
        b.extend((s.v_trans as u32).to_le_bytes());
        b.extend((s.records.len() as u32).to_le_bytes());
        for ((ty, rb), _) in &s.records {
            b.extend(ty.to_le_bytes());
            b.extend(rb.to_le_bytes());
            rows(&mut b, rb * s.cells as u64);
        }
        for (_, (ty, rb)) in &s.records {
            b.extend(ty.to_le_bytes());
            if s.v_trans {
                b.extend(2u32.to_le_bytes());
                b.extend((*rb as u32 / 2).to_le_bytes());
            } else {
                b.extend(rb.to_le_bytes());
            }
            rows(&mut b, rb * s.cells as u64);
        }
    }
    b
}

const F16: i32 = 1;
const Q8_0: i32 = 8;

/// The reproducer of the hole: two streams whose layer 0 rows are 8 and 64 f16 values wide. Before
/// the check, stream 1's rows were decoded into stream 0's width (and quant_error's round trip
/// read past its buffer).
fn two_widths() -> Vec<u8> {
    state(&[
        stream(2, (F16, 16), (F16, 16)),
        stream(2, (F16, 128), (F16, 128)),
    ])
}

fn format_error(b: &[u8]) -> (String, u64, String) {
    match walk(b, WalkOptions::default()) {
        Err(Error::Format {
            field,
            offset,
            expected,
            ..
        }) => (field, offset, expected),
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn the_reproducer_is_small() {
    assert!(two_widths().len() < 800, "{}", two_widths().len());
}

#[test]
fn streams_of_different_row_widths_are_refused_at_open() {
    let b = two_widths();
    let (field, offset, expected) = format_error(&b);
    assert_eq!(field, "cache 0 stream 1 layer 0 k row_bytes");
    assert!(expected.contains("16 as in stream 0"), "{expected}");
    // the stream 1 K header: io header, n_stream, stream 0 (4 + 2 cells + 8 + 2 records),
    // stream 1's cell_count, cells and layer header; row_bytes 4 bytes into the record header
    let s0 = 4 + 2 * 12 + 8 + 2 * (12 + 32);
    let k1 = 12 + s0 + 4 + 2 * 12 + 8;
    assert_eq!(offset, (k1 + 4) as u64);
    assert_eq!(&b[k1 + 4..k1 + 12], &128u64.to_le_bytes());
    let err = State::from_bytes(b, WalkOptions::default())
        .err()
        .expect("the two-width state must not open");
    assert_eq!(err.kind(), "format");
}

#[test]
fn streams_of_different_v_widths_types_and_layouts_are_refused() {
    // V differs only
    let b = state(&[
        stream(1, (F16, 16), (F16, 16)),
        stream(1, (F16, 16), (F16, 32)),
    ]);
    assert_eq!(format_error(&b).0, "cache 0 stream 1 layer 0 v row_bytes");
    // a type differs (same bytes per row: 34 bytes of q8_0 against 17 f16 values)
    let b = state(&[
        stream(1, (F16, 68), (F16, 16)),
        stream(1, (Q8_0, 68), (F16, 16)),
    ]);
    let (field, offset, expected) = format_error(&b);
    assert_eq!(field, "cache 0 stream 1 layer 0 k type");
    assert_eq!(
        i32::from_le_bytes(b[offset as usize..][..4].try_into().unwrap()),
        Q8_0
    );
    assert!(expected.contains("f16 as in stream 0"), "{expected}");
    // v_trans differs
    let mut t = stream(1, (F16, 16), (F16, 16));
    t.v_trans = true;
    let b = state(&[stream(1, (F16, 16), (F16, 16)), t]);
    assert_eq!(format_error(&b).0, "cache 0 stream 1 v_trans");
    // transposed V of different widths
    let (mut a, mut c) = (
        stream(1, (F16, 16), (F16, 16)),
        stream(1, (F16, 16), (F16, 32)),
    );
    (a.v_trans, c.v_trans) = (true, true);
    let b = state(&[a, c]);
    let (field, offset, _) = format_error(&b);
    assert_eq!(field, "cache 0 stream 1 layer 0 v n_embd_v_gqa");
    assert_eq!(
        u32::from_le_bytes(b[offset as usize..][..4].try_into().unwrap()),
        16
    );
    // layer counts differ
    let mut two = stream(1, (F16, 16), (F16, 16));
    two.records.push(((F16, 16), (F16, 16)));
    let b = state(&[stream(1, (F16, 16), (F16, 16)), two]);
    let (field, offset, _) = format_error(&b);
    assert_eq!(field, "cache 0 stream 1 n_layer");
    assert_eq!(
        u32::from_le_bytes(b[offset as usize..][..4].try_into().unwrap()),
        2
    );
}

#[test]
fn agreeing_and_empty_streams_open() {
    let b = state(&[
        stream(2, (Q8_0, 68), (F16, 128)),
        stream(0, (F16, 16), (F16, 16)),
        stream(3, (Q8_0, 68), (F16, 128)),
    ]);
    let sf = State::from_bytes(b, WalkOptions::default()).unwrap();
    let streams = &sf.layout.caches[0].streams;
    assert_eq!(streams.len(), 3);
    assert!(streams[1].layers.is_empty());
    assert_eq!(streams[2].layers[0].k.n_embd, 64);
}

/// A view whose geometry contradicts its bytes (as a caller may build by hand) decodes what its
/// bytes hold and NaN for the rest: no read past them, no panic.
#[test]
fn views_that_lie_about_their_bytes_stay_in_bounds() {
    let b = state(&[stream(2, (F16, 16), (F16, 16))]);
    let sf = State::from_bytes(b, WalkOptions::default()).unwrap();
    let rec = &sf.layout.caches[0].streams[0].layers[0].k;
    let honest = RecordView::new(sf.bytes(), rec, 2);
    let mut row = vec![0f32; 8];
    honest.decode(1, 2, &mut row);
    assert!(row.iter().all(|v| v.is_finite()));
    for lie in [
        RecordView {
            n_embd: 4096,
            ..honest
        },
        RecordView {
            cells: 1 << 40,
            transposed: true,
            ..honest
        },
        RecordView {
            row_bytes: 0,
            ..honest
        },
        RecordView {
            n_embd: 0,
            ..honest
        },
    ] {
        let n = lie.n_embd;
        let mut out = vec![0f32; n * 3];
        lie.decode(0, 3, &mut out);
        lie.decode(usize::MAX - 1, usize::MAX, &mut out);
        let cells = [0, 1, 2, usize::MAX];
        for hd in [0, 1, 8, 5000] {
            let s = cell_stats(&lie, &cells, hd);
            assert_eq!(s.len(), cells.len() * n.checked_div(hd).unwrap_or(0));
            let a = accumulate(&lie, &cells, hd);
            for h in 0..a.l2.len() {
                a.head(h, hd);
            }
        }
    }
}
