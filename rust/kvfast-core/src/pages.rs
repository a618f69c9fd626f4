//! Pages of the memory map, asked for ahead of reading them.

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
