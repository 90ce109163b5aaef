//! The page table: one state word and one frame index per page id.
//!
//! Owns: two arrays indexed by page id, mapped with `MAP_NORESERVE` so that
//! only the parts of a huge device that are used cost memory (untouched
//! pages of the mapping read as zero, and zero means "evicted, version 0").
//!
//! The state word: `version << 8 | lock`, where lock is
//!
//! | lock      | meaning                                  |
//! |-----------|------------------------------------------|
//! | 0         | EVICTED: not in memory                   |
//! | 1         | UNLOCKED: resident, nobody holds it      |
//! | 2..=250   | SHARED(n): resident, n = lock - 1 readers|
//! | 251       | LOADING: a read into a frame is in flight|
//! | 252       | EXCLUSIVE: resident, one writer          |
//!
//! Transitions and who makes them:
//! - EVICTED -> LOADING: the task that faults the page (CAS; the loser
//!   waits for the in-flight read).
//! - LOADING -> UNLOCKED: the worker that reaps the read (checksum ok);
//!   LOADING -> EVICTED on a failed read.
//! - EVICTED -> EXCLUSIVE: allocation of a brand-new page (no read).
//! - UNLOCKED/SHARED(n) -> SHARED(n+1) -> ... -> UNLOCKED: readers.
//! - UNLOCKED -> EXCLUSIVE -> UNLOCKED with version + 1: writers.
//! - UNLOCKED -> EXCLUSIVE -> UNLOCKED, same version: write-back of a dirty
//!   page (sealed and copied under the latch; the write goes from the copy
//!   and the frame's `writing` flag, not the latch, marks it in flight).
//! - UNLOCKED -> EXCLUSIVE -> EVICTED with version + 1: eviction of a clean
//!   page.
//!
//! Optimistic readers remember the version of an UNLOCKED/SHARED word and
//! validate that it is unchanged and not EXCLUSIVE/EVICTED afterwards.
//! Never: changes a page's frame index while the page is resident.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::{Error, Result};

pub(crate) const EVICTED: u64 = 0;
pub(crate) const UNLOCKED: u64 = 1;
pub(crate) const MAX_SHARED: u64 = 250;
pub(crate) const LOADING: u64 = 251;
pub(crate) const EXCLUSIVE: u64 = 252;

#[inline]
pub(crate) fn lock_of(s: u64) -> u64 {
    s & 0xff
}

#[inline]
pub(crate) fn version_of(s: u64) -> u64 {
    s >> 8
}

#[inline]
pub(crate) fn make(version: u64, lock: u64) -> u64 {
    version << 8 | lock
}

/// The types a [`LazyArray`] may hold: atomic integers, for which zeroed
/// memory is a valid value and which are shared between threads by design.
/// Implemented for nothing else, so the array's `unsafe` rests on its
/// bound, not on how the table happens to use it.
trait ZeroedAtomic: Sync {}
impl ZeroedAtomic for AtomicU64 {}
impl ZeroedAtomic for AtomicU32 {}

/// An anonymous, lazily backed mapping of `T`s that start as zero.
struct LazyArray<T: ZeroedAtomic> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the mapping holds only atomics (`ZeroedAtomic`), which are
// Sync; the pointer is never reassigned.
unsafe impl<T: ZeroedAtomic> Send for LazyArray<T> {}
// SAFETY: as above.
unsafe impl<T: ZeroedAtomic> Sync for LazyArray<T> {}

impl<T: ZeroedAtomic> LazyArray<T> {
    fn new(len: usize) -> Result<LazyArray<T>> {
        let bytes = len.max(1) * std::mem::size_of::<T>();
        // SAFETY: an anonymous private mapping with no address hint; the
        // result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Backend {
                backend: "buffer",
                what: format!("mapping a page table of {bytes} bytes"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(LazyArray { ptr: p.cast(), len })
    }

    #[inline]
    fn get(&self, i: usize) -> &T {
        assert!(
            i < self.len,
            "page table index {i} out of range {}",
            self.len
        );
        // SAFETY: i < len, the mapping is live for &self's lifetime, and
        // zeroed memory is a valid T (an atomic integer: `ZeroedAtomic`).
        unsafe { &*self.ptr.add(i) }
    }
}

impl<T: ZeroedAtomic> Drop for LazyArray<T> {
    fn drop(&mut self) {
        let bytes = self.len.max(1) * std::mem::size_of::<T>();
        // SAFETY: unmaps exactly the mapping made in new().
        unsafe { libc::munmap(self.ptr.cast(), bytes) };
    }
}

/// State words and frame indices for every page id of the array.
pub(crate) struct PageTable {
    states: LazyArray<AtomicU64>,
    frames: LazyArray<AtomicU32>,
}

impl PageTable {
    pub(crate) fn new(pages: u64) -> Result<PageTable> {
        let n = usize::try_from(pages)
            .map_err(|_| Error::InvalidArgument(format!("{pages} pages is too many")))?;
        Ok(PageTable {
            states: LazyArray::new(n)?,
            frames: LazyArray::new(n)?,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.states.len as u64
    }

    #[inline]
    pub(crate) fn state(&self, pid: u64) -> &AtomicU64 {
        self.states.get(pid as usize)
    }

    #[inline]
    pub(crate) fn frame(&self, pid: u64) -> u32 {
        self.frames.get(pid as usize).load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn set_frame(&self, pid: u64, frame: u32) {
        self.frames
            .get(pid as usize)
            .store(frame, Ordering::Release)
    }

    /// UNLOCKED/SHARED(n) -> SHARED(n+1). False if not possible now.
    #[inline]
    pub(crate) fn try_lock_shared(&self, pid: u64) -> bool {
        let st = self.state(pid);
        let s = st.load(Ordering::Acquire);
        let l = lock_of(s);
        if (UNLOCKED..MAX_SHARED).contains(&l) {
            return st
                .compare_exchange(s, s + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        }
        false
    }

    #[inline]
    pub(crate) fn unlock_shared(&self, pid: u64) {
        let prev = self.state(pid).fetch_sub(1, Ordering::AcqRel);
        debug_assert!(
            (UNLOCKED + 1..=MAX_SHARED).contains(&lock_of(prev)),
            "unlock_shared of page {pid} in state {prev:#x}"
        );
    }

    /// UNLOCKED -> EXCLUSIVE. False if not possible now.
    #[inline]
    pub(crate) fn try_lock_exclusive(&self, pid: u64) -> bool {
        let st = self.state(pid);
        let s = st.load(Ordering::Acquire);
        if lock_of(s) != UNLOCKED {
            return false;
        }
        st.compare_exchange(
            s,
            make(version_of(s), EXCLUSIVE),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// EXCLUSIVE -> UNLOCKED with a new version.
    #[inline]
    pub(crate) fn unlock_exclusive(&self, pid: u64) {
        let st = self.state(pid);
        let s = st.load(Ordering::Relaxed);
        debug_assert_eq!(lock_of(s), EXCLUSIVE, "unlock_exclusive of page {pid}");
        st.store(make(version_of(s) + 1, UNLOCKED), Ordering::Release);
    }

    /// EXCLUSIVE -> EVICTED with a new version.
    pub(crate) fn mark_evicted(&self, pid: u64) {
        let st = self.state(pid);
        let s = st.load(Ordering::Relaxed);
        debug_assert_eq!(lock_of(s), EXCLUSIVE, "evict of page {pid}");
        st.store(make(version_of(s) + 1, EVICTED), Ordering::Release);
    }

    /// Sets the lock part, keeping the version (LOADING -> UNLOCKED or
    /// EVICTED).
    pub(crate) fn set_lock(&self, pid: u64, lock: u64) {
        let st = self.state(pid);
        let s = st.load(Ordering::Relaxed);
        st.store(make(version_of(s), lock), Ordering::Release);
    }

    /// CAS of the lock part from `from` to `to`, keeping the version.
    pub(crate) fn try_transition(&self, pid: u64, from: u64, to: u64) -> bool {
        let st = self.state(pid);
        let s = st.load(Ordering::Acquire);
        if lock_of(s) != from {
            return false;
        }
        st.compare_exchange(
            s,
            make(version_of(s), to),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_table_costs_nothing_until_used() {
        // 2^32 pages of 4 KiB = 16 TiB of storage: 48 GiB of virtual
        // table, of which only the touched pages are backed.
        let t = PageTable::new(1 << 32).unwrap();
        assert_eq!(
            lock_of(t.state(123_456_789).load(Ordering::Relaxed)),
            EVICTED
        );
    }

    #[test]
    fn latch_transitions() {
        let t = PageTable::new(16).unwrap();
        assert!(!t.try_lock_shared(3), "evicted pages cannot be latched");
        assert!(t.try_transition(3, EVICTED, LOADING));
        t.set_lock(3, UNLOCKED);
        assert!(t.try_lock_shared(3));
        assert!(t.try_lock_shared(3));
        assert!(!t.try_lock_exclusive(3));
        t.unlock_shared(3);
        t.unlock_shared(3);
        let v0 = version_of(t.state(3).load(Ordering::Relaxed));
        assert!(t.try_lock_exclusive(3));
        assert!(!t.try_lock_shared(3));
        t.unlock_exclusive(3);
        assert_eq!(version_of(t.state(3).load(Ordering::Relaxed)), v0 + 1);
    }
}
