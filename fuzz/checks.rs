//! What the fuzz targets check, one function per target, each taking the fuzzer's bytes: the
//! targets in fuzz_targets/ call them, and rust/kvfast-core/tests/fuzz_regressions.rs runs them
//! on every input a fuzzer once crashed on. A check panics on the first property that fails.

#![allow(dead_code)]

use kvfast_core::format::layout::{Kind, Record};
use kvfast_core::format::types::ALL_TYPES;
use kvfast_core::stats::passes::{
    accumulate, cell_stats, compare as compare_records, round_trip_loss,
};
use kvfast_core::values::decode::{decode_row, decode_rows, decode_transposed, transpose_bytes};
use kvfast_core::values::quantize::quantize_row;
use kvfast_core::values::view::RecordView;
use kvfast_core::{GgmlType, State, WalkOptions};

/// Takes fields off the front of the fuzzer's bytes; zeros once they run out.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// One of the cache types.
    pub fn ty(&mut self) -> GgmlType {
        ALL_TYPES[self.u8() as usize % ALL_TYPES.len()]
    }

    /// The bytes left, copied: an allocation of exactly their length, so that a read one byte
    /// past them is a read past the allocation (AddressSanitizer reports it).
    pub fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0).to_vec()
    }
}

/// Walk `bytes` as a state file does (a copy it owns).
pub fn walk(bytes: &[u8]) -> Option<State> {
    State::from_bytes(bytes.to_vec(), WalkOptions::default()).ok()
}

/// One record of a walked state, as the statistics read it.
pub struct Rec<'a> {
    pub cache: usize,
    pub layer: usize,
    pub cells: usize,
    pub view: RecordView<'a>,
}

/// Every record of every stream of every cache, K then V per layer.
pub fn records(sf: &State) -> Vec<Rec<'_>> {
    let mut out = vec![];
    for (ci, cache) in sf.layout.caches.iter().enumerate() {
        for s in &cache.streams {
            for (li, layer) in s.layers.iter().enumerate() {
                for rec in std::iter::once(&layer.k).chain(layer.v.as_ref()) {
                    // What every view of a walked record may rely on.
                    assert_eq!(rec.data_len, rec.row_bytes * s.cell_count as u64);
                    assert!(rec.data_offset + rec.data_len <= sf.bytes().len() as u64);
                    let cells = s.cell_count as usize;
                    let view = RecordView::new(sf.bytes(), rec, cells);
                    assert_eq!(view.data.len() as u64, rec.data_len);
                    out.push(Rec {
                        cache: ci,
                        layer: li,
                        cells,
                        view,
                    });
                }
            }
        }
    }
    out
}

/// Head sizes to try on rows of `n` values: the whole row, the largest power of two dividing
/// it, and one from the input that need not divide it (0 included).
pub fn head_dims(n: usize, pick: u8) -> Vec<usize> {
    let pow = if n == 0 {
        1
    } else {
        1 << n.trailing_zeros().min(8)
    };
    let mut out = vec![n.max(1), pow, pick as usize];
    out.dedup();
    out
}

/// Walk arbitrary bytes: an error or a layout whose regions tile the bytes exactly and whose
/// records lie inside them; never a panic, a hang or a read out of bounds.
pub fn open(data: &[u8]) {
    let memories = [None, Some(true)].into_iter().map(|v_less| WalkOptions {
        v_less,
        ..WalkOptions::default()
    });
    let exts = [Some(false), Some(true)]
        .into_iter()
        .map(|cell_ext| WalkOptions {
            cell_ext,
            ..WalkOptions::default()
        });
    for opts in memories.chain(exts) {
        let Ok(sf) = State::from_bytes(data.to_vec(), opts) else {
            continue;
        };
        let l = &sf.layout;
        let mut at = 0;
        for r in l.regions() {
            assert_eq!(r.offset, at, "regions tile the bytes");
            at += r.nbytes;
        }
        assert_eq!(at, data.len() as u64);
        let (rows, outputs, meta) = l.byte_totals();
        assert_eq!(rows + outputs + meta, data.len() as u64);
        for cache in &l.caches {
            let first = cache.streams.iter().find(|s| !s.layers.is_empty());
            for s in &cache.streams {
                let n = s.cell_count as usize;
                assert_eq!(s.pos.len(), n);
                if n > 0 {
                    assert_eq!(s.seq_start.len(), n + 1);
                    for c in 0..n {
                        let _ = s.cell_seqs(c);
                    }
                }
                if let Some(ext) = &s.ext {
                    assert_eq!(ext.len(), n * s.ext_width);
                }
                // Every filled stream of a cache has the first one's layers.
                if let (Some(f), false) = (first, s.layers.is_empty()) {
                    assert_eq!(f.layers.len(), s.layers.len());
                    for (a, b) in f.layers.iter().zip(&s.layers) {
                        assert_eq!(
                            (a.k.ty, a.k.n_embd, a.k.row_bytes),
                            (b.k.ty, b.k.n_embd, b.k.row_bytes)
                        );
                        let v = |r: &kvfast_core::Layer| {
                            r.v.as_ref()
                                .map(|v| (v.ty, v.n_embd, v.row_bytes, v.transposed))
                        };
                        assert_eq!(v(a), v(b));
                    }
                }
                for layer in &s.layers {
                    for rec in std::iter::once(&layer.k).chain(layer.v.as_ref()) {
                        assert_eq!(rec.data_len, rec.row_bytes * s.cell_count as u64);
                        assert!(rec.data_offset + rec.data_len <= data.len() as u64);
                        match rec.kind {
                            Kind::K | Kind::V => assert!(rec.n_embd > 0),
                            // the recurrent part's: no values for a state the model does not
                            // keep (LFM2's S), and then no bytes
                            Kind::R | Kind::S => {
                                assert_eq!(rec.n_embd == 0, rec.row_bytes == 0)
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Equal bits, or both NaN (NaN payloads may differ between conversion paths).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every decoding kernel on arbitrary bytes and arbitrary geometry, of every type: values from
/// the whole blocks the source holds, NaN for the rest, never a read past the source.
pub fn decode(data: &[u8]) {
    let mut inp = Input(data);
    let ty = inp.ty();
    let mode = inp.u8();
    let (bb, bl) = (ty.block_bytes(), ty.block_len());
    match mode % 4 {
        0 => {
            // One row into a destination of any length; each block decodes as it does alone.
            let n = inp.u16() as usize;
            let src = inp.rest();
            let mut dst = vec![0f32; n];
            let done = decode_row(ty, &src, &mut dst);
            assert!(done <= n && done % bl == 0 && done / bl * bb <= src.len());
            assert!(dst[done..].iter().all(|v| v.is_nan()));
            let mut one = vec![0f32; bl];
            for (i, block) in src.chunks_exact(bb).take(done / bl).enumerate() {
                assert_eq!(decode_row(ty, block, &mut one), bl);
                for (a, b) in one.iter().zip(&dst[i * bl..]) {
                    assert!(same(*a, *b));
                }
            }
        }
        1 => {
            // Rows of any width over bytes of any length, with or without a rotation.
            let row_bytes = inp.u16() as usize % 4096;
            let n_embd = inp.u16() as usize % 4096;
            let cells = inp.u8() as usize;
            let rotation = [0, 2, 64, 128, 3][inp.u8() as usize % 5];
            let src = inp.rest();
            let mut dst = vec![0f32; cells * n_embd];
            decode_rows(ty, &src, row_bytes, n_embd, rotation, &mut dst);
        }
        2 => {
            // Element-major V of any geometry: in bounds or all NaN (0xFF bytes).
            let n_embd = inp.u16() as usize % 4096;
            let cells = inp.u16() as usize;
            let rows = inp.u8() as usize;
            let first = inp.u16() as usize;
            let src = inp.rest();
            let mut dst = vec![0f32; rows * n_embd];
            decode_transposed(ty, &src, (cells, first), n_embd, &mut dst);
            let el = [bb, 0, 1, 3][mode as usize / 4 % 4];
            let mut raw = vec![0u8; rows * n_embd * el];
            transpose_bytes(&src, el, (cells, first), n_embd, &mut raw);
            let holds = |el: usize| {
                el > 0
                    && n_embd > 0
                    && n_embd
                        .checked_mul(cells)
                        .and_then(|v| v.checked_mul(el))
                        .is_some_and(|need| need <= src.len())
            };
            if !holds(el) {
                assert!(raw.iter().all(|&b| b == 0xFF));
            }
            if !holds(bb) || bl > 1 {
                assert!(dst.iter().all(|v| v.is_nan()));
            }
        }
        _ => {
            // A record view whose fields are arbitrary: its own bytes only.
            let cells = inp.u16() as usize;
            let n_embd = inp.u16() as usize % 4096;
            let row_bytes = inp.u16() as usize;
            let transposed = inp.u8() % 2 == 1;
            let c0 = inp.u16() as usize;
            let c1 = c0 + inp.u8() as usize % 16;
            let rotation = [0, 64, 7][inp.u8() as usize % 3];
            let src = inp.rest();
            let rec = Record {
                kind: Kind::K,
                ty,
                n_embd: n_embd as u64,
                row_bytes: row_bytes as u64,
                header_offset: 0,
                header_len: 0,
                data_offset: 0,
                data_len: src.len() as u64,
                transposed,
            };
            let v = RecordView::new(&src, &rec, cells).with_rotation(rotation);
            let mut out = vec![0f32; (c1 - c0) * n_embd];
            v.decode(c0, c1, &mut out);
            // A record whose bytes end early: cells past them are NaN.
            let short = RecordView {
                data: &src[..src.len() / 2],
                ..v
            };
            short.decode(c0, c1, &mut out);
        }
    }
}

/// Cell statistics, channel moments and round-trip losses over every record of a walked state,
/// for head sizes that divide the rows and ones that do not: shapes as documented, channels of
/// the absmax inside their head, no read out of bounds.
pub fn stats(data: &[u8]) {
    let Some(sf) = walk(data) else { return };
    // The last byte (a row byte of most states) picks the odd head size.
    let pick = data.last().copied().unwrap_or(0);
    for r in records(&sf) {
        let n = r.view.n_embd;
        // every cell, then one past the record (NaN) and the same cell twice
        let mut cells: Vec<usize> = (0..r.cells.min(256)).collect();
        cells.push(r.cells);
        cells.push(0);
        for hd in head_dims(n, pick) {
            let heads = n.checked_div(hd).unwrap_or(0);
            for v in [r.view, r.view.with_rotation(64)] {
                let s = cell_stats(&v, &cells, hd);
                assert_eq!(s.len(), cells.len() * heads);
                for i in 0..s.len() {
                    // NaN values left out and counted: a head of NaNs only has no statistic
                    assert!(s.nan[i] as usize <= hd);
                    if s.nan[i] as usize == hd {
                        assert!(s.argmax[i].is_none() && s.l2[i].is_nan() && s.absmax[i].is_nan());
                    } else {
                        assert!(s.argmax[i].is_some_and(|a| (a as usize) < hd));
                        assert!(!s.min[i].is_nan() && !s.max[i].is_nan() && !s.l2[i].is_nan());
                        assert!(s.absmax[i] >= 0.0 && s.min[i] <= s.max[i]);
                    }
                }
                let acc = accumulate(&v, &cells, hd);
                if hd > 0 {
                    assert_eq!(acc.channels.len(), n);
                    assert_eq!(acc.l2.len(), heads);
                    assert!(acc
                        .channels
                        .iter()
                        .all(|m| m.count + m.nan == cells.len() as u64));
                    assert!(acc.channels.iter().all(|m| m.count == 0
                        || !m.mean.is_nan()
                        || m.min.is_infinite()
                        || m.max.is_infinite()));
                    assert!(acc
                        .l2
                        .iter()
                        .all(|&(_, _, rows)| rows <= cells.len() as u64));
                }
                for h in 0..=heads {
                    acc.head(h, hd);
                }
                let loss = round_trip_loss(&v, &cells, hd, &|x, y| y.copy_from_slice(x));
                assert_eq!(loss.len(), if hd == 0 { 0 } else { heads });
                for l in &loss {
                    assert_eq!(l.count + l.nan, (cells.len() * hd) as u64);
                    // the identity loses nothing of the values it counts
                    assert!(l.se == 0.0 || l.se.is_nan());
                }
            }
        }
        let _ = (r.cache, r.layer);
    }
}

/// ggml's reference quantizers on arbitrary f32 values (NaN, infinities, subnormals included), then
/// back: no panic, the round trip decodes every value, and finite values of moderate size come
/// back finite (and exact for f32, as f16's rounding for f16).
pub fn quantize(data: &[u8]) {
    let mut inp = Input(data);
    let ty = inp.ty();
    let odd = inp.u8();
    let raw = inp.rest();
    let x: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (bb, bl) = (ty.block_bytes(), ty.block_len());
    let n = x.len() / bl * bl;
    let x = &x[..n];
    let mut q = vec![0u8; n / bl * bb];
    quantize_row(ty, x, &mut q);
    let mut y = vec![0f32; n];
    assert_eq!(decode_row(ty, &q, &mut y), n);
    if x.iter().all(|v| v.is_finite() && v.abs() <= 1000.0) {
        assert!(y.iter().all(|v| v.is_finite()), "{ty}: {x:?} -> {y:?}");
    }
    match ty {
        GgmlType::F32 => assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits())),
        GgmlType::F16 => {
            for (a, b) in x.iter().zip(&y) {
                let want = half::f16::from_f32(*a).to_f32();
                assert!(want.to_bits() == b.to_bits() || (want.is_nan() && b.is_nan()));
            }
        }
        _ => {}
    }
    // Buffers of the wrong sizes: whatever whole blocks both hold, no panic.
    let mut short = vec![0u8; q.len().saturating_sub(odd as usize)];
    quantize_row(ty, x, &mut short);
    let mut long = vec![0u8; q.len() + odd as usize];
    quantize_row(ty, &x[..n.saturating_sub(odd as usize).min(n)], &mut long);
}

/// Two walked states compared record by record (their geometry matching or not), with cell pairs
/// inside and outside the records: per-(pair, head) errors for records of one width, nothing for
/// records of two, zero error of a finite record against itself.
pub fn compare(data: &[u8]) {
    // u32 length of A, a byte for the odd head size, then A's bytes and B's.
    let mut inp = Input(data);
    let split = inp.u32() as usize;
    let pick = inp.u8();
    let rest = inp.rest();
    let (a, b) = rest.split_at(split.min(rest.len()));
    let (Some(sa), Some(sb)) = (walk(a), walk(b)) else {
        return;
    };
    let (ra, rb) = (records(&sa), records(&sb));
    for (x, y) in ra.iter().zip(&rb) {
        let n = x.view.n_embd;
        let mut pairs: Vec<(usize, usize)> = (0..x.cells.min(y.cells).min(256))
            .map(|c| (c, y.cells.min(x.cells) - 1 - c))
            .collect();
        pairs.push((x.cells, 0));
        pairs.push((0, y.cells));
        for hd in head_dims(n, pick) {
            let heads = n.checked_div(hd).unwrap_or(0);
            let out = compare_records(&x.view, &y.view, &pairs, hd);
            if y.view.n_embd == n {
                assert_eq!(out.len(), pairs.len() * heads);
            } else {
                assert!(out.is_empty());
            }
            let own: Vec<(usize, usize)> = (0..x.cells.min(64)).map(|c| (c, c)).collect();
            for s in compare_records(&x.view, &x.view, &own, hd) {
                assert!(s.mse == 0.0 || s.mse.is_nan());
            }
        }
    }
}
