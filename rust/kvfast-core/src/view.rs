//! One record's rows, borrowed from the state's bytes, decodable a range of cells at a time.

use crate::decode::decode_row;
use crate::layout::Record;
use crate::types::GgmlType;

#[derive(Clone, Copy)]
pub struct RecordView<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub cells: usize,
    pub n_embd: usize,
    pub row_bytes: usize,
    pub transposed: bool,
}

impl<'a> RecordView<'a> {
    pub fn new(bytes: &'a [u8], rec: &Record, cells: usize) -> Self {
        let start = rec.data_offset as usize;
        RecordView {
            ty: rec.ty,
            data: &bytes[start..start + rec.data_len as usize],
            cells,
            n_embd: rec.n_embd as usize,
            row_bytes: rec.row_bytes as usize,
            transposed: rec.transposed,
        }
    }

    /// Cells per chunk: about 256 KiB of f32 values, so a chunk stays in cache.
    pub fn chunk_cells(&self) -> usize {
        (65_536 / self.n_embd.max(1)).max(1)
    }

    /// Map the pages of cells `c0..=c1` in one call (MADV_POPULATE_READ) instead of a page fault
    /// per 4 KiB; a no-op where the kernel lacks it. Transposed records are populated whole.
    pub fn populate(&self, c0: usize, c1: usize) {
        let (start, end) = if self.transposed {
            (0, self.data.len())
        } else {
            (
                c0 * self.row_bytes,
                ((c1 + 1) * self.row_bytes).min(self.data.len()),
            )
        };
        populate(&self.data[start..end]);
    }

    /// Decode cells `c0..c1` into `out` (`(c1 - c0) * n_embd` values, cell-major).
    pub fn decode(&self, c0: usize, c1: usize, out: &mut [f32]) {
        let n = self.n_embd;
        if !self.transposed {
            let src = &self.data[c0 * self.row_bytes..c1 * self.row_bytes];
            for (o, s) in out
                .chunks_exact_mut(n)
                .zip(src.chunks_exact(self.row_bytes))
            {
                decode_row(self.ty, s, o);
            }
        } else {
            let el = self.ty.block_bytes();
            for (ci, o) in out.chunks_exact_mut(n).enumerate() {
                let c = c0 + ci;
                for (j, v) in o.iter_mut().enumerate() {
                    let s = (j * self.cells + c) * el;
                    decode_row(self.ty, &self.data[s..s + el], std::slice::from_mut(v));
                }
            }
        }
    }
}

/// Ask the kernel to map `bytes`' pages now (Linux 5.14+), so that reading them faults no more.
pub fn populate(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        const MADV_POPULATE_READ: i32 = 22;
        let addr = bytes.as_ptr() as usize;
        let start = addr & !(PAGE - 1);
        let end = addr + bytes.len();
        if end > start {
            // SAFETY: the range covers pages of a live mapping we hold; populating changes no content.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_READ);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}
