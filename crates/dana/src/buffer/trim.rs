//! Freed pages trimmed once their free is durable: the SSD below then
//! stops counting them as valid, and its collection never copies them.
//!
//! Owns: the list of pages freed since the last trim (tree pages freed by
//! merges and drops, extents of large values replaced or deleted) and the
//! trim itself, which a checkpoint runs after its control blocks.
//!
//! When a page may be trimmed: its bit in the free-space map page is
//! clear, that map page's last change is durable in the log (so a crash
//! finds the page free, whatever control block recovery starts from: the
//! free is redone from the log or already in the map page, and recovery
//! rewrites a free page that fails its checksum as a clean free page), and
//! the in-memory map has it free (no allocation chose it and no large
//! value holds it). It is then marked used in memory while its trim runs,
//! so nothing can write it in between; a write of it issued before (the
//! free page's own write-back) may land after the trim, which only costs
//! that write.
//!
//! Only on devices that take discards cheaply (a block device's TRIM, the
//! simulator's FTL: [`crate::io::Target::discards_cheaply`]); never on a
//! file, where a punched hole would make the next write there allocate,
//! nor without a log. A reader that follows a stale page id to a trimmed
//! page reads zeros, which fail the page checksum: the trees look again
//! when the node that named it no longer validates, as they do for pages
//! a large value took.
//!
//! Never: trims a page whose free might not survive a crash, or one that
//! is allocated or held; never errs for a device that refuses a trim
//! (advice: counted, the page stays as it is).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{page, BufferPool};
use crate::Result;

/// Most page runs waiting for a trim; runs freed beyond it are not
/// trimmed (counted in `AllocState::trims_missed`).
const MAX_WAITING: usize = 1 << 16;

impl BufferPool {
    /// True if freed pages are trimmed: a log, and every data device takes
    /// discards cheaply.
    fn trims_freed_pages(&self) -> bool {
        self.wal.get().is_some() && self.array.targets().iter().all(|t| t.discards_cheaply())
    }

    /// Notes `len` pages from `first`, just freed (their free logged with
    /// the change that made it), for a later trim.
    pub(super) fn note_freed(&self, first: u64, len: u64) {
        if len == 0 || !self.trims_freed_pages() {
            return;
        }
        let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() >= MAX_WAITING {
            self.alloc.trims_missed.fetch_add(len, Ordering::Relaxed);
            return;
        }
        w.push((first, len));
    }

    /// Pages trimmed since the pool opened.
    pub fn pages_trimmed(&self) -> u64 {
        self.alloc.trimmed.load(Ordering::Relaxed)
    }

    /// Trims the freed pages whose free is durable (see the module doc);
    /// the others wait for the next call. Run by a checkpoint after its
    /// control blocks; blocking for the discards themselves.
    pub(crate) async fn trim_freed(&self) -> Result<()> {
        let Some(wal) = self.wal.get() else {
            return Ok(());
        };
        // A failed log may have left a free unlogged in a map page.
        if self.poisoned().is_some() {
            return Ok(());
        }
        let waiting =
            std::mem::take(&mut *self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner()));
        if waiting.is_empty() {
            return Ok(());
        }
        let geo = self.geometry();
        let mut by_map: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &(first, len) in &waiting {
            for pid in first..first + len {
                by_map.entry(geo.map_page_of(pid)).or_default().push(pid);
            }
        }
        let mut later = Vec::new();
        for (map_pid, pids) in by_map {
            let durable = wal.durable();
            let held: Vec<u64> = {
                let map = self.fix_shared(map_pid).await?;
                if page::page_lsn(&map) >= durable {
                    later.extend(pids.iter().map(|&p| (p, 1)));
                    continue;
                }
                let mut mirror = self.mirror();
                pids.into_iter()
                    .filter(|&pid| {
                        let (at, mask) = geo.bit(pid);
                        map[at] & mask == 0 && mirror.set(pid)
                    })
                    .collect()
            };
            let trimmed = self.discard_pages(&held);
            let mut mirror = self.mirror();
            for &pid in &held {
                mirror.clear(pid);
            }
            drop(mirror);
            self.alloc.trimmed.fetch_add(trimmed, Ordering::Relaxed);
        }
        if !later.is_empty() {
            let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
            let room = MAX_WAITING.saturating_sub(w.len());
            let dropped = later.len().saturating_sub(room) as u64;
            w.extend(later.into_iter().take(room));
            self.alloc
                .trims_missed
                .fetch_add(dropped, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Discards `pids` (ascending) on their devices, runs of pages
    /// contiguous on one device in one call; returns the pages the devices
    /// took.
    fn discard_pages(&self, pids: &[u64]) -> u64 {
        let ps = self.page_size as u64;
        let mut runs: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
        for &pid in pids {
            let (dev, offset) = self.array.locate(pid);
            let r = runs.entry(dev).or_default();
            match r.last_mut() {
                Some((start, len)) if *start + *len == offset => *len += ps,
                _ => r.push((offset, ps)),
            }
        }
        let mut taken = 0;
        for (dev, list) in runs {
            let t = &self.array.targets()[dev];
            for (offset, len) in list {
                if t.discard(offset, len).is_ok() {
                    taken += len / ps;
                }
            }
        }
        taken
    }
}
