//! Repair of a page's damaged copies on mirrored devices, through the pool.
//!
//! Owns: [`BufferPool::repair_page_copies`], which `Db::rebuild` runs for
//! every page whose healthy copies differ while some copy is a valid page.
//! A mirrored read repairs a damaged copy only when it happens to read
//! that copy; otherwise the damage stays until the other copy is lost too.
//!
//! The repair writes the pool's own version of the page, under its
//! exclusive latch, and only while the page is clean and no write-back of
//! it is in flight: then the frame holds what every healthy copy held when
//! the page was last written, and no write-back can start (it takes the
//! exclusive latch) and land a newer version that the repair would then
//! overwrite with an older one on one copy. A dirty page, or one being
//! written, needs nothing: its write-back writes every copy.
//!
//! Never: writes a version other than the pool's clean one, writes a copy
//! that holds a valid page (only the damaged ones named), or marks a page
//! dirty without a logged change (a write with no record since the
//! checkpoint could tear the good copies with nothing to rebuild them).

use std::sync::atomic::Ordering;

use super::{page, BufferPool};
use crate::io::{AlignedBuf, IoBuf, Placement, Request};
use crate::sched;
use crate::Result;

impl BufferPool {
    /// Writes the pool's clean version of page `pid` over its copies
    /// `damaged` (copy numbers of the page's mirrored device), if the page
    /// is clean, not being written and a valid page; returns whether it
    /// wrote them. Holds the page's exclusive latch until the writes are
    /// done (one page: the readers of it wait that long).
    pub(crate) async fn repair_page_copies(&self, pid: u64, damaged: &[u8]) -> Result<bool> {
        if damaged.is_empty() || self.read_only {
            return Ok(false);
        }
        // Reads the page if it is not resident: through the mirror, which
        // takes a valid copy (and repairs the one it read, if damaged).
        let guard = self.fix_exclusive_covered(pid).await?;
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
}
