//! Repair of a page's damaged copies on mirrored devices, through the pool.
//!
//! Owns: [`BufferPool::repair_page_copies`], which `Db::rebuild` runs for
//! every page whose healthy copies differ while some copy is a valid page.
//! A mirrored read repairs a damaged copy only when it happens to read
//! that copy; otherwise the damage stays until the other copy is lost too.
//!
//! The repair writes the pool's own version of a page already in the
//! pool, under its exclusive latch, and only while the page is clean and
//! no write-back of it is in flight: then the frame holds what every
//! healthy copy held when the page was last written, and no write-back
//! can start (it takes the exclusive latch) and land a newer version that
//! the repair would then overwrite with an older one on one copy. A dirty
//! page, or one being written, needs nothing: its write-back writes every
//! copy. A page not in the pool is left alone (the first read that meets
//! its damaged copy repairs it): read in for the repair, it could be one
//! freed since the comparison and taken by a large value whose write has
//! not landed yet (a review's finding), whereas a resident frame, latched,
//! holds off the discard that precedes such a write.
//!
//! Never: reads a page in, writes a version other than the pool's clean
//! one, writes a copy that holds a valid page (only the damaged ones
//! named), or marks a page dirty without a logged change (a write with no
//! record since the checkpoint could tear the good copies with nothing to
//! rebuild them).

use std::sync::atomic::Ordering;

use super::page_table::{lock_of, EVICTED, LOADING};
use super::{page, BufferPool, PageMut};
use crate::io::{AlignedBuf, IoBuf, Placement, Request};
use crate::sched;
use crate::Result;

/// Times the repair looks again at a page latched by someone else before
/// it leaves it (yielding between looks).
const LATCH_TRIES: usize = 1000;

impl BufferPool {
    /// Writes the pool's clean version of page `pid` over its copies
    /// `damaged` (copy numbers of the page's mirrored device), if the page
    /// is in the pool, clean, not being written and a valid page; returns
    /// whether it wrote them. Holds the page's exclusive latch until the
    /// writes are done (one page: the readers of it wait that long).
    pub(crate) async fn repair_page_copies(&self, pid: u64, damaged: &[u8]) -> Result<bool> {
        if damaged.is_empty() || self.read_only || self.check_pid(pid).is_err() {
            return Ok(false);
        }
        let Some(guard) = self.latch_resident(pid).await else {
            return Ok(false);
        };
        let meta = &self.frames[guard.frame as usize];
        if meta.dirty.load(Ordering::Acquire) || meta.writing.load(Ordering::Acquire) {
            return Ok(false);
        }
        let bytes: &[u8] = &guard;
        if page::verify(bytes, pid).is_err() {
            return Ok(false);
        }
        let (device, offset) = self.array.locate(pid);
        for &c in damaged {
            let mut buf = AlignedBuf::new(self.page_size, self.page_size)?;
            buf.copy_from_slice(bytes);
            let mut req = Request::write(0, offset, IoBuf::owned(buf)).placed(Placement::Unsorted);
            req.copy = Some(c);
            sched::perform(device, req).await?;
        }
        drop(guard);
        self.stats.page_copy_repairs.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Page `pid`'s exclusive latch if the page is in the pool (never a
    /// read); None if it is not, or stays latched by others.
    async fn latch_resident(&self, pid: u64) -> Option<PageMut<'_>> {
        for _ in 0..LATCH_TRIES {
            if self.table.try_lock_exclusive(pid) {
                return Some(self.guard_of(pid, self.table.frame(pid)));
            }
            match lock_of(self.table.state(pid).load(Ordering::Acquire)) {
                EVICTED | LOADING => return None,
                _ => sched::yield_now().await,
            }
        }
        None
    }
}
