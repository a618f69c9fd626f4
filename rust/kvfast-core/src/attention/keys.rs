//! The keys of one cache layer, read one KV head at a time: the kernel holds one KV head's keys in
//! f32 (every stream's cells in a row), never the layer's.

use rayon::prelude::*;

use crate::format::layout::Stream;
use crate::values::decode::decode_row;
use crate::values::rotation::hadamard_groups;
use crate::values::view::RecordView;

/// Key columns per matrix product: a block of logits of a tile stays in the core's cache.
pub const COLS: usize = 256;

/// The K rows of one cache layer, per stream, as stored.
pub struct Keys<'a> {
    pub views: Vec<RecordView<'a>>,
    /// Per stream: the stream's cell metadata.
    pub streams: Vec<&'a Stream>,
    pub n_embd: usize,
}

/// Cells decoded per parallel job.
const CELLS: usize = 256;

impl Keys<'_> {
    /// How many cells, every stream's.
    pub fn cells(&self) -> usize {
        self.streams.iter().map(|s| s.cell_count as usize).sum()
    }

    /// KV head `g`'s keys (`d` values from value `g * d` of each row) of every stream's cells, in
    /// the model's basis, into `out` (`d` values per cell, stream then cell order, then zeros up
    /// to a whole block of the kernel's columns), in parallel.
    pub fn head(&self, g: usize, d: usize, out: &mut Vec<f32>) {
        out.clear();
        out.resize(self.cells().next_multiple_of(COLS).max(COLS) * d, 0.0);
        let mut rest = &mut out[..];
        for (v, s) in self.views.iter().zip(&self.streams) {
            let (mine, tail) = rest.split_at_mut(s.cell_count as usize * d);
            rest = tail;
            mine.par_chunks_mut(CELLS * d)
                .enumerate()
                .for_each_init(Vec::new, |row, (j, o)| {
                    let c0 = j * CELLS;
                    decode_head(v, (g, d), c0, o, row)
                });
        }
    }
}

/// Cells `c0..` (as many as `out` holds `d` values of) of KV head `g` of `v`: straight from the
/// head's bytes where its values are whole blocks and the rotation (if any) stays inside it,
/// else whole rows decoded into `row` and the head's values copied.
fn decode_head(
    v: &RecordView,
    (g, d): (usize, usize),
    c0: usize,
    out: &mut [f32],
    row: &mut Vec<f32>,
) {
    let (bl, bb) = (v.ty.block_len(), v.ty.block_bytes());
    let sliced = !v.transposed
        && v.rope.is_none()
        && d % bl == 0
        && (v.rotation == 0 || (v.rotation <= d && d % v.rotation == 0));
    if sliced {
        let (at, len) = (g * d / bl * bb, d / bl * bb);
        for (c, o) in (c0..).zip(out.chunks_exact_mut(d)) {
            let src = c
                .checked_mul(v.row_bytes)
                .and_then(|s| s.checked_add(at))
                .and_then(|s| v.data.get(s..s.checked_add(len)?))
                .filter(|_| at + len <= v.row_bytes);
            match src {
                Some(src) => {
                    decode_row(v.ty, src, o);
                    if v.rotation > 0 {
                        hadamard_groups(o, v.rotation);
                    }
                }
                None => o.fill(f32::NAN),
            }
        }
        return;
    }
    let n = out.len() / d.max(1);
    row.resize(n * v.n_embd, 0.0);
    v.decode(c0, c0 + n, row);
    for (o, r) in out.chunks_exact_mut(d).zip(row.chunks_exact(v.n_embd)) {
        o.copy_from_slice(&r[g * d..(g + 1) * d]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::types::GgmlType;

    #[test]
    fn a_head_read_from_its_bytes_equals_the_head_of_whole_rows() {
        // 3 cells of 2 KV heads of 32 f16 values, then q8_0 (one block a head)
        let vals: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
        let f16: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let stream = Stream::new(0, 0, 3, 0, 0);
        for (ty, data, row_bytes) in [
            (GgmlType::F16, f16.clone(), 128),
            (
                GgmlType::F32,
                vals.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
                256,
            ),
        ] {
            let view = RecordView {
                ty,
                data: &data,
                cells: 3,
                n_embd: 64,
                row_bytes,
                transposed: false,
                rotation: 0,
                rope: None,
            };
            let mut whole = vec![0f32; 3 * 64];
            view.decode(0, 3, &mut whole);
            let keys = Keys {
                views: vec![view, view.with_rotation(64)],
                streams: vec![&stream, &stream],
                n_embd: 64,
            };
            let mut out = vec![];
            keys.head(1, 32, &mut out);
            assert_eq!(out.len(), COLS * 32);
            assert!(out[6 * 32..].iter().all(|v| *v == 0.0));
            let mut rotated = vec![0f32; 3 * 64];
            view.with_rotation(64).decode(0, 3, &mut rotated);
            for c in 0..3 {
                assert_eq!(out[c * 32..(c + 1) * 32], whole[c * 64 + 32..(c + 1) * 64]);
                // a rotation wider than the head: whole rows, then the head
                assert_eq!(
                    out[(3 + c) * 32..(4 + c) * 32],
                    rotated[c * 64 + 32..(c + 1) * 64]
                );
            }
        }
    }
}
