//! Fresh output memory for decoding: zeroed by the kernel (no write pass), and on Linux backed by
//! transparent huge pages where the system allows it (as NumPy does), so that filling it costs one
//! page fault per 2 MiB rather than per 4 KiB.

/// A zeroed vector of `n` f32 values, not yet touched.
pub fn fresh_f32(n: usize) -> Vec<f32> {
    let v = vec![0f32; n]; // large sizes come from calloc/mmap: zero pages, nothing written
    advise_huge(v.as_ptr() as usize, n * 4);
    v
}

/// A zeroed byte vector of `n` bytes, not yet touched.
pub fn fresh_bytes(n: usize) -> Vec<u8> {
    let v = vec![0u8; n];
    advise_huge(v.as_ptr() as usize, n);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    if len < 2 * HUGE {
        return;
    }
    let start = (addr + HUGE - 1) & !(HUGE - 1);
    let end = (addr + len) & !(HUGE - 1);
    if end > start {
        // SAFETY: the range lies inside an allocation we own; MADV_HUGEPAGE only changes how the
        // kernel backs it, never its contents. A failure (THP disabled) is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_addr: usize, _len: usize) {}
