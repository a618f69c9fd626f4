//! The rows of one record as an Arrow buffer: a view of the map where the bytes allow it,
//! else decoded (in parallel) into fresh memory.

use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;
use kvfast_core::alloc::{fresh_bytes, fresh_f32};
use kvfast_core::decode::{decode_rows, decode_transposed, transpose_bytes};
use kvfast_core::{GgmlType, Record, StateFile};

/// What the caller asked values to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dtype {
    /// f16 and f32 as stored, everything else decoded to f32.
    Stored,
    F32,
}

/// The element type of decoded rows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Out {
    F16,
    F32,
}

impl Out {
    pub fn size(self) -> usize {
        match self {
            Out::F16 => 2,
            Out::F32 => 4,
        }
    }
}

/// `cells` rows of `n_embd` values of type `out`, cell-major.
pub struct Rows {
    pub buf: Buffer,
    pub out: Out,
    pub n_embd: usize,
    pub cells: usize,
    /// The buffer is a view of the memory map.
    pub zero_copy: bool,
}

pub fn out_type(ty: GgmlType, dtype: Dtype) -> Out {
    match (ty, dtype) {
        (GgmlType::F16, Dtype::Stored) => Out::F16,
        _ => Out::F32,
    }
}

/// `rotation`: undo llama.cpp's rotation in groups of that many values (0: as stored); only
/// quantized records are ever rotated, so f16 and f32 views stay views.
pub fn record_rows(
    sf: &StateFile,
    rec: &Record,
    cells: usize,
    dtype: Dtype,
    rotation: usize,
) -> Rows {
    let out = out_type(rec.ty, dtype);
    let src = &sf.bytes()[rec.data_offset as usize..(rec.data_offset + rec.data_len) as usize];
    let n_embd = rec.n_embd as usize;
    let stored = rotation == 0
        && ((rec.ty == GgmlType::F16 && out == Out::F16)
            || (rec.ty == GgmlType::F32 && out == Out::F32));
    let (buf, zero_copy) = if stored && !rec.transposed {
        if src.is_empty() || (src.as_ptr() as usize) % out.size() != 0 {
            // Not aligned for the value type (or nothing to view): copy into aligned memory.
            (Buffer::from(src), false)
        } else {
            let ptr = NonNull::new(src.as_ptr() as *mut u8).expect("mapped bytes are not null");
            let owner: Arc<dyn arrow_buffer::alloc::Allocation> = sf.data.clone();
            // SAFETY: `ptr..ptr+len` lies inside the map, which `owner` keeps alive and unchanged.
            (
                unsafe { Buffer::from_custom_allocation(ptr, src.len(), owner) },
                true,
            )
        }
    } else if stored {
        let mut m = fresh_bytes(src.len());
        transpose_bytes(src, out.size(), cells, n_embd, &mut m);
        (Buffer::from_vec(m), false)
    } else {
        let mut v = fresh_f32(cells * n_embd);
        if rec.transposed {
            decode_transposed(rec.ty, src, cells, n_embd, &mut v);
        } else {
            decode_rows(
                rec.ty,
                src,
                rec.row_bytes as usize,
                n_embd,
                rotation,
                &mut v,
            );
        }
        (Buffer::from_vec(v), false)
    };
    Rows {
        buf,
        out,
        n_embd,
        cells,
        zero_copy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{state, value};

    #[test]
    fn aligned_f16_rows_are_a_view_of_the_bytes() {
        let sf = state(2, 1, 8, GgmlType::F16);
        let rec = &sf.layout.caches[0].streams[0].layers[0].k;
        let r = record_rows(&sf, rec, 2, Dtype::Stored, 0);
        assert_eq!((r.out, r.n_embd, r.cells), (Out::F16, 8, 2));
        let at = sf.bytes()[rec.data_offset as usize..].as_ptr();
        assert_eq!(r.zero_copy, (at as usize) % 2 == 0);
        if r.zero_copy {
            assert_eq!(r.buf.as_ptr(), at);
        }
        let f = record_rows(&sf, rec, 2, Dtype::F32, 0);
        assert!(!f.zero_copy);
        let vals: &[f32] = f.buf.typed_data();
        assert_eq!(vals[8 + 3], value(1, 0, "k", 3));
    }

    #[test]
    fn quantized_rows_decode_to_f32() {
        let sf = state(1, 1, 32, GgmlType::Q8_0);
        let rec = &sf.layout.caches[0].streams[0].layers[0].k;
        assert_eq!(out_type(rec.ty, Dtype::Stored), Out::F32);
        let r = record_rows(&sf, rec, 1, Dtype::Stored, 0);
        assert!(!r.zero_copy);
        let vals: &[f32] = r.buf.typed_data();
        assert_eq!(vals[31], value(0, 0, "k", 31));
    }
}
