//! One record's rows, borrowed from the state's bytes, decodable a range of cells at a time.

use crate::format::layout::Record;
use crate::format::types::GgmlType;
use crate::values::decode::{decode_row, float_at};
use crate::values::rope::CellRope;
use crate::values::rotation::hadamard_groups;

#[derive(Clone, Copy)]
pub struct RecordView<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub cells: usize,
    pub n_embd: usize,
    pub row_bytes: usize,
    pub transposed: bool,
    /// Undo llama.cpp's attention rotation in groups of this many values (0: values as stored).
    pub rotation: usize,
    /// Undo llama.cpp's RoPE of each cell after the rotation (None: as stored).
    pub rope: Option<CellRope<'a>>,
}

impl<'a> RecordView<'a> {
    /// The view of `rec`'s rows in `bytes`; a record that does not lie inside them (never one the
    /// walk of those bytes found) gets no bytes, so every value decodes to NaN.
    pub fn new(bytes: &'a [u8], rec: &Record, cells: usize) -> Self {
        let start = rec.data_offset as usize;
        let end = start.saturating_add(rec.data_len as usize);
        RecordView {
            ty: rec.ty,
            data: bytes.get(start..end).unwrap_or(&[]),
            cells,
            n_embd: rec.n_embd as usize,
            row_bytes: rec.row_bytes as usize,
            transposed: rec.transposed,
            rotation: 0,
            rope: None,
        }
    }

    /// The same rows with each cell's RoPE undone (keys before RoPE), after any rotation.
    pub fn with_rope(self, rope: Option<CellRope<'a>>) -> Self {
        RecordView { rope, ..self }
    }

    /// The same rows, read in the model's basis: every group of `n` values multiplied by the
    /// Hadamard matrix of order `n` after decoding (0: as stored).
    pub fn with_rotation(self, n: usize) -> Self {
        RecordView {
            rotation: n,
            ..self
        }
    }

    /// Cells per chunk: about 256 KiB of f32 values, so a chunk stays in cache.
    pub fn chunk_cells(&self) -> usize {
        (65_536 / self.n_embd.max(1)).max(1)
    }

    /// Decode cells `c0..c1` into `out` (`(c1 - c0) * n_embd` values, cell-major), in the basis
    /// the view was asked for.
    pub fn decode(&self, c0: usize, c1: usize, out: &mut [f32]) {
        self.decode_stored(c0, c1, out);
        if self.rotation > 0 && self.n_embd > 0 {
            for row in out.chunks_exact_mut(self.n_embd) {
                hadamard_groups(row, self.rotation);
            }
        }
        if let Some(r) = &self.rope {
            r.undo(c0, self.n_embd, out);
        }
    }

    /// Whatever the fields say, only `data` is read: a value whose bytes are not there (a cell
    /// past the record, a row wider than its bytes) decodes to NaN.
    fn decode_stored(&self, c0: usize, c1: usize, out: &mut [f32]) {
        let (n, rb) = (self.n_embd, self.row_bytes);
        if n == 0 {
            return;
        }
        let rows = out.chunks_exact_mut(n).zip(c0..c1);
        if !self.transposed {
            for (o, c) in rows {
                let s = c.checked_mul(rb).and_then(|s| Some(s..s.checked_add(rb)?));
                match s.and_then(|s| self.data.get(s)) {
                    Some(s) => {
                        decode_row(self.ty, s, o);
                    }
                    None => o.fill(f32::NAN),
                }
            }
        } else {
            let el = self.ty.block_bytes();
            // Cell c's value j is element j * cells + c: all inside `data` when the whole record is.
            let whole = n
                .checked_mul(self.cells)
                .and_then(|v| v.checked_mul(el))
                .is_some_and(|need| need <= self.data.len());
            for (o, c) in rows {
                if !whole || c >= self.cells {
                    o.fill(f32::NAN);
                    continue;
                }
                for (j, v) in o.iter_mut().enumerate() {
                    let s = (j * self.cells + c) * el;
                    *v = float_at(self.ty, &self.data[s..s + el]);
                }
            }
        }
    }
}
