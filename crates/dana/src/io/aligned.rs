//! Aligned, zero-initialised heap memory for direct I/O.
//!
//! Owns: one allocation per [`AlignedBuf`], aligned to a power of two (the
//! page size or the device's direct-I/O alignment). Never: reallocates or
//! moves its memory while alive, so a pointer handed to the kernel stays
//! valid until the buffer is dropped.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::{Error, Result};

/// A zeroed heap buffer whose address is a multiple of `align`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); moving
// it to another thread or sharing `&AlignedBuf` is as safe as for a Box.
unsafe impl Send for AlignedBuf {}
// SAFETY: outside the crate a shared reference gives out `&[u8]` only, and
// mutation needs `&mut`. Inside it, `raw` writes through a shared buffer
// (frames under their latches, regions under an in-flight I/O); a buffer
// written so is never handed out as a `&AlignedBuf` a reader could
// dereference: the pool's frames leave the crate only as [`FrameMemory`],
// which has no `Deref`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    /// `len` must be non-zero.
    pub fn new(len: usize, align: usize) -> Result<AlignedBuf> {
        if len == 0 {
            return Err(Error::InvalidArgument("buffer length must be > 0".into()));
        }
        let layout = Layout::from_size_align(len, align).map_err(|_| {
            Error::InvalidArgument(format!(
                "buffer of {len} bytes with alignment {align}: alignment must be a power of two"
            ))
        })?;
        // SAFETY: layout has a non-zero size (checked above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::InvalidArgument(format!("cannot allocate {len} bytes aligned to {align}"))
        })?;
        Ok(AlignedBuf { ptr, layout })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Raw start pointer of the allocation. Writing through it while other
    /// references to the buffer exist is the caller's responsibility (the
    /// buffer manager's frame latches, an in-flight I/O's exclusive range).
    /// Crate-private: a writer through a shared buffer must know every
    /// reader of it.
    pub(crate) fn raw(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

/// The buffer pool's frame memory, as the I/O queues register it
/// (io_uring fixed buffers): an opaque handle. The engine writes frames
/// through raw pointers while the memory is shared (under the frames'
/// latches, and the kernel into frames being read), so no reference to
/// its bytes ever leaves the crate; an `Arc<AlignedBuf>` did, and safe
/// code could read frames while they were written (review 19).
///
/// Its size is all safe code sees:
///
/// ```
/// fn frame_bytes(m: &dana::io::FrameMemory) -> usize {
///     m.len()
/// }
/// ```
///
/// and its bytes stay out of reach:
///
/// ```compile_fail
/// fn frame_bytes(m: &dana::io::FrameMemory) -> &[u8] {
///     &m[..]
/// }
/// ```
#[derive(Clone)]
pub struct FrameMemory(std::sync::Arc<AlignedBuf>);

impl FrameMemory {
    pub(crate) fn new(buf: AlignedBuf) -> FrameMemory {
        FrameMemory(std::sync::Arc::new(buf))
    }

    /// The allocation, for the queues that register it and the pool.
    pub(crate) fn region(&self) -> &std::sync::Arc<AlignedBuf> {
        &self.0
    }

    /// Bytes of frame memory.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: the pool has at least one frame.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for FrameMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameMemory")
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and not freed.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len())
            .field("align", &self.align())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::new(8192, 4096).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(AlignedBuf::new(0, 4096).is_err());
        assert!(AlignedBuf::new(4096, 3000).is_err());
    }
}
