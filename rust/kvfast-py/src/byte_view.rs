//! A read-only byte buffer Python sees through the buffer protocol (NumPy views it without copying).

use std::os::raw::{c_int, c_void};
use std::ptr;

use arrow_buffer::Buffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Bytes owned by Rust: a view of the memory map, or decoded values.
#[pyclass(frozen, module = "kvfast._kvfast")]
pub struct ByteView {
    pub data: Buffer,
}

#[pymethods]
impl ByteView {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// Address of the first byte (to tell a view of the map from a copy).
    #[getter]
    fn address(&self) -> usize {
        self.data.as_ptr() as usize
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("kvfast buffers are read-only"));
        }
        let (p, len) = {
            let b = slf.get();
            (b.data.as_ptr(), b.data.len())
        };
        // SAFETY: `view` is non-null and ours to fill; the buffer lives as long as `obj`.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = p as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if (flags & ffi::PyBUF_FORMAT) == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if (flags & ffi::PyBUF_ND) == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                ptr::null_mut()
            };
            (*view).strides = if (flags & ffi::PyBUF_STRIDES) == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                ptr::null_mut()
            };
            (*view).suboffsets = ptr::null_mut();
            (*view).internal = ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl From<Vec<i32>> for ByteView {
    fn from(v: Vec<i32>) -> Self {
        ByteView {
            data: Buffer::from_vec(v),
        }
    }
}

/// Little-endian i32 values as a buffer.
pub fn i32s(v: &[i32]) -> ByteView {
    ByteView::from(v.to_vec())
}
