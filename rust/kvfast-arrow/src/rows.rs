//! The rows of one record as an Arrow buffer: a view of the map where the bytes allow it,
//! else decoded (in parallel) into fresh memory.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use kvfast_core::plan::table_plan::{out_type, row_source, Dtype, Out, RowSource};
use kvfast_core::values::alloc::{fresh_bytes, fresh_f32};
use kvfast_core::values::decode::{decode_rows, decode_transposed, transpose_bytes};
use kvfast_core::values::rope::CellRope;
use kvfast_core::{Record, State};

/// `cells` rows of `n_embd` values of type `out`, cell-major (the record's cells `first..`).
pub struct Rows {
    pub buf: Buffer,
    pub out: Out,
    pub n_embd: usize,
    pub cells: usize,
    /// The buffer is a view of the memory map.
    pub zero_copy: bool,
}

/// `rec`'s rows of the cells `span` (of its stream's `cells`) as `dtype` asks, read in groups of `rotation` (0: as stored), as
/// kvfast-core's plan says (`out_type`, `row_source`): a view of the map where the bytes are the rows
/// and their offset is aligned for the type, else decoded or transposed into fresh memory, in
/// parallel.
pub fn record_rows(
    sf: &State,
    rec: &Record,
    cells: usize,
    span: Range<usize>,
    dtype: Dtype,
    rotation: usize,
    rope: Option<CellRope>,
) -> kvfast_core::Result<Rows> {
    // the rows must be there (a remote state's are fetched before the pass)
    sf.require_record(rec)?;
    // a RoPE to undo, as a rotation, makes the values f32 and decoded
    let transform = rotation.max(usize::from(rope.is_some()));
    let out = out_type(rec.ty, dtype, transform);
    let all = &sf.bytes()[rec.data_offset as usize..(rec.data_offset + rec.data_len) as usize];
    let n_embd = rec.n_embd as usize;
    let span = span.start.min(cells)..span.end.min(cells);
    let n = span.len();
    // the span's rows of a cell-major record (a transposed one's runs span all its cells)
    let rb = rec.row_bytes as usize;
    let src = if rec.transposed {
        all
    } else {
        let end = span.end.saturating_mul(rb).min(all.len());
        &all[span.start.saturating_mul(rb).min(end)..end]
    };
    let (buf, zero_copy) = match row_source(rec, out, transform) {
        RowSource::View if src.is_empty() || (src.as_ptr() as usize) % out.size() != 0 => {
            // Not aligned for the value type (or nothing to view): copy into aligned memory.
            (Buffer::from(src), false)
        }
        RowSource::View => {
            let ptr = NonNull::new(src.as_ptr() as *mut u8).expect("mapped bytes are not null");
            let owner: Arc<dyn arrow_buffer::alloc::Allocation> = sf.data.clone();
            // SAFETY: `ptr..ptr+len` lies inside the map, which `owner` keeps alive and unchanged.
            (
                unsafe { Buffer::from_custom_allocation(ptr, src.len(), owner) },
                true,
            )
        }
        RowSource::Transpose => {
            let mut m = fresh_bytes(n * n_embd * out.size());
            transpose_bytes(src, out.size(), (cells, span.start), n_embd, &mut m);
            (Buffer::from_vec(m), false)
        }
        RowSource::Decode => {
            let mut v = fresh_f32(n * n_embd);
            decode_rows(rec.ty, src, rb, n_embd, rotation, &mut v);
            if let Some(r) = rope {
                r.undo(span.start, n_embd, &mut v);
            }
            (Buffer::from_vec(v), false)
        }
        RowSource::DecodeTransposed => {
            let mut v = fresh_f32(n * n_embd);
            decode_transposed(rec.ty, src, (cells, span.start), n_embd, &mut v);
            (Buffer::from_vec(v), false)
        }
    };
    Ok(Rows {
        buf,
        out,
        n_embd,
        cells: n,
        zero_copy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{state, value};
    use kvfast_core::GgmlType;

    #[test]
    fn aligned_f16_rows_are_a_view_of_the_bytes() {
        let sf = state(2, 1, 8, GgmlType::F16);
        let rec = &sf.layout.caches[0].streams[0].layers[0].k;
        let r = record_rows(&sf, rec, 2, 0..2, Dtype::Stored, 0, None).unwrap();
        assert_eq!((r.out, r.n_embd, r.cells), (Out::F16, 8, 2));
        let at = sf.bytes()[rec.data_offset as usize..].as_ptr();
        assert_eq!(r.zero_copy, (at as usize) % 2 == 0);
        if r.zero_copy {
            assert_eq!(r.buf.as_ptr(), at);
        }
        let f = record_rows(&sf, rec, 2, 0..2, Dtype::F32, 0, None).unwrap();
        assert!(!f.zero_copy);
        let vals: &[f32] = f.buf.typed_data();
        assert_eq!(vals[8 + 3], value(1, 0, "k", 3));
    }

    #[test]
    fn quantized_rows_decode_to_f32() {
        let sf = state(1, 1, 32, GgmlType::Q8_0);
        let rec = &sf.layout.caches[0].streams[0].layers[0].k;
        assert_eq!(out_type(rec.ty, Dtype::Stored, 0), Out::F32);
        let r = record_rows(&sf, rec, 1, 0..1, Dtype::Stored, 0, None).unwrap();
        assert!(!r.zero_copy);
        let vals: &[f32] = r.buf.typed_data();
        assert_eq!(vals[31], value(0, 0, "k", 31));
    }
}
