//! Freed pages trimmed once their free is behind the redo point: the SSD
//! below then stops counting them as valid, and its collection never
//! copies them.
//!
//! Owns: the list of pages freed since the last trim (tree pages freed by
//! merges and drops, extents of large values replaced or deleted; at open,
//! the free pages an out-of-place device still maps) and the trim itself,
//! which a checkpoint runs after its control blocks.
//!
//! When a page may be trimmed: its bit in the free-space map page is
//! clear, the record of its last free is durable in the log (noted with
//! its GSN when the free's space guard is logged, while the guard still
//! latches the map page; the trim latches the map page and looks at every
//! note of the page made so far, so a free after the one it holds is
//! never missed) and lies below the redo GSN that the control blocks of
//! the checkpoint running the trim name, so that recovery never redoes a
//! record of the page from before its free and a crash finds it free in
//! the map page (recovery rewrites a free page that fails its checksum as
//! a clean free page), and the in-memory map has it free (no allocation chose it
//! and no large value holds it). *Why below the redo GSN*: the continuous
//! checkpoints move the redo point one shard at a time, so it can lie far
//! behind a durable free, and recovery then redoes the page's earlier
//! records onto whatever the trimmed page reads as: out of place, an
//! older version that passes its checksum once the segment of its last
//! extent is freed (a leaf cut redone there failed, or keys of the wrong
//! version survived: ~1 in 1,000 kill -9 cycles, reproduced by
//! `tests/trim_freed.rs::shard_checkpoints_never_trim_a_page_recovery_may_redo`);
//! the first version waited only for the free to be durable. This leans
//! on recovery dropping the page records below the newest redo GSN any
//! control block names (`wal/recover.rs`), which it must keep doing. It is then marked used in memory while its trim runs,
//! so nothing can write it in between, and its frame is dropped unwritten
//! (a write-back in flight is waited for first): a free page written back
//! after its trim would undo it for nothing (out of place it maps the
//! page again).
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
//! (advice: the page stays as it is, not counted as trimmed).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use super::alloc::SpaceGuard;
use super::{page, BufferPool};
use crate::Result;

/// Most page runs waiting for a trim. Past it every waiting note is
/// dropped, not only the new ones: an older note of a page freed again
/// must never outlive the newer free it would hide (a trim by the older
/// note after the newer free, not yet durable, lost the page's content
/// at a crash; found in review). Dropped notes are advice lost: the
/// device copies those pages until they are rewritten.
const MAX_WAITING: usize = 1 << 16;
/// Pages of an out-of-place device's map looked at under one hold of its
/// lock by [`BufferPool::note_free_mapped_pages`].
const SCAN_STEP: u64 = 1 << 16;
/// Most pages an open notes (4 GiB of 4 KiB pages): a trim pass keeps a
/// map entry per page it looks at (~50 bytes).
const MAX_OPEN_PAGES: u64 = 1 << 20;

impl BufferPool {
    /// True if freed pages are trimmed: a log, and every data device takes
    /// discards cheaply.
    fn trims_freed_pages(&self) -> bool {
        self.wal.get().is_some() && self.array.targets().iter().all(|t| t.discards_cheaply())
    }

    /// Notes the pages freed under `space`, whose record was just
    /// appended (the meta page, which every free changes, holds its GSN),
    /// for a later trim. Called while the guard still latches the map
    /// pages: a trim that latches one finds every earlier free of its
    /// pages noted.
    pub(super) fn note_freed(&self, space: &mut SpaceGuard<'_>) {
        if space.freed.is_empty() {
            return;
        }
        let runs = std::mem::take(&mut space.freed);
        if !self.trims_freed_pages() {
            return;
        }
        let gsn = page::page_lsn(&space.meta);
        let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() + runs.len() > MAX_WAITING {
            w.clear();
            self.alloc.freed_dropped.fetch_add(1, Ordering::AcqRel);
            return;
        }
        w.extend(runs.into_iter().map(|(first, len)| (first, len, gsn)));
    }

    /// Notes for a trim every page free in the map that an out-of-place
    /// device still maps: the notes of frees live in memory only, so a
    /// crash or a close before their trim dropped them, and an unmap is
    /// not durable either ([`crate::io::remap::Remap::discard`]): without
    /// this such pages stayed mapped for good, their extents copied by
    /// every collection (an outside probe: 9,809 pages mapped with 5 in
    /// use after a kill, ~5x the collection's copies after). Called at
    /// open, after recovery, before the open's checkpoint (which trims
    /// them: every free recovered lies below the GSN noted, and that
    /// checkpoint's redo GSN is past it). Bounded: at most
    /// [`MAX_WAITING`] runs and [`MAX_OPEN_PAGES`] pages (the trim takes
    /// memory per page; the rest wait for the next open); scans the map of
    /// each out-of-place device in steps of [`SCAN_STEP`] pages.
    pub(crate) fn note_free_mapped_pages(&self) {
        let Some(wal) = self.wal.get() else {
            return;
        };
        if !self.trims_freed_pages() {
            return;
        }
        let gsn = wal.next_lsn().saturating_sub(1);
        let targets = self.array.targets();
        let n = targets.len() as u64;
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        let mut pages = 0;
        let mirror = self.mirror();
        let mark = mirror.next_unused();
        'devices: for (d, t) in targets.iter().enumerate() {
            let crate::io::Target::Remap(r) = t else {
                continue;
            };
            // Device page q holds page q * n + d (`Array::locate`).
            let end = mark.div_ceil(n);
            let mut first = 0;
            while first < end {
                let step_end = (first + SCAN_STEP).min(end);
                for q in r.mapped_in(first, step_end) {
                    let pid = q * n + d as u64;
                    if pid >= mark || mirror.is_used(pid) {
                        continue;
                    }
                    if pages >= MAX_OPEN_PAGES {
                        break 'devices;
                    }
                    pages += 1;
                    match runs.last_mut() {
                        Some((f, len, _)) if *f + *len == pid => *len += 1,
                        _ => {
                            if runs.len() >= MAX_WAITING {
                                break 'devices;
                            }
                            runs.push((pid, 1, gsn));
                        }
                    }
                }
                first = step_end;
            }
        }
        drop(mirror);
        if runs.is_empty() {
            return;
        }
        let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
        // Nothing else notes before the open's checkpoint; kept within
        // the bound anyway.
        let room = MAX_WAITING.saturating_sub(w.len());
        runs.truncate(room);
        w.extend(runs);
    }

    /// Pages trimmed since the pool opened.
    pub fn pages_trimmed(&self) -> u64 {
        self.alloc.trimmed.load(Ordering::Relaxed)
    }

    /// Trims the freed pages whose last free is durable and below `redo`,
    /// the redo GSN the control blocks just written name (see the module
    /// doc); the others wait for the next call. Run by a checkpoint after
    /// its control blocks; blocking for the discards themselves.
    pub(crate) async fn trim_freed(&self, redo: u64) -> Result<()> {
        let Some(wal) = self.wal.get() else {
            return Ok(());
        };
        // A failed log may have left a free unlogged in a map page.
        if self.poisoned().is_some() {
            return Ok(());
        }
        let (waiting, dropped) = {
            let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
            (
                std::mem::take(&mut *w),
                self.alloc.freed_dropped.load(Ordering::Acquire),
            )
        };
        if waiting.is_empty() {
            return Ok(());
        }
        let geo = self.geometry();
        // Per map page, per page: the GSN of its last free noted.
        let mut by_map: BTreeMap<u64, HashMap<u64, u64>> = BTreeMap::new();
        for &(first, len, gsn) in &waiting {
            for pid in first..first + len {
                let last = by_map.entry(geo.map_page_of(pid)).or_default();
                let g = last.entry(pid).or_insert(gsn);
                *g = (*g).max(gsn);
            }
        }
        let mut later = Vec::new();
        for (map_pid, pids) in by_map {
            let (held, n): (Vec<u64>, u64) = {
                let map = self.fix_shared(map_pid).await?;
                let durable = wal.durable();
                // Frees noted since the list was taken: with the map page
                // latched, every free of its pages so far is noted.
                let newer: HashMap<u64, u64> = {
                    let w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
                    // Notes dropped since the list was taken: a newer free
                    // of one of these pages may be among them. Nothing
                    // more is trimmed in this pass, nor put back.
                    if self.alloc.freed_dropped.load(Ordering::Acquire) != dropped {
                        return Ok(());
                    }
                    let mut m = HashMap::new();
                    for &(first, len, gsn) in w.iter() {
                        for pid in first..first + len {
                            if pids.contains_key(&pid) {
                                let g = m.entry(pid).or_insert(gsn);
                                *g = (*g).max(gsn);
                            }
                        }
                    }
                    m
                };
                let mut mirror = self.mirror();
                // Only pages no reservation counts on: a reservation is a
                // count of available pages, and a commit holding one must
                // find its pages free in memory (the held pages are not);
                // holding them all failed a commit's apply with NoSpace on
                // an array that could not grow, which stops the database
                // (a review's finding). No allocation runs while the
                // in-memory map is locked here.
                let a = &self.alloc;
                let budget = a
                    .available
                    .load(Ordering::Acquire)
                    .saturating_sub(a.reserved.load(Ordering::Acquire));
                let mut held: Vec<(u64, u64)> = Vec::new();
                let mut sorted: Vec<(u64, u64)> = pids.into_iter().collect();
                sorted.sort_unstable();
                for (pid, gsn) in sorted {
                    if newer.contains_key(&pid) {
                        // Freed again since: that note decides.
                        continue;
                    }
                    if gsn >= durable || gsn >= redo {
                        // Back as runs: a large value's pages, freed
                        // together, wait for several checkpoints now.
                        match later.last_mut() {
                            Some((first, len, g)) if *first + *len == pid && *g == gsn => {
                                *len += 1;
                            }
                            _ => later.push((pid, 1, gsn)),
                        }
                        continue;
                    }
                    let (at, mask) = geo.bit(pid);
                    if map[at] & mask != 0 {
                        continue; // allocated again
                    }
                    if held.len() as u64 >= budget {
                        later.push((pid, 1, gsn));
                        continue;
                    }
                    if mirror.set(pid) {
                        held.push((pid, gsn));
                    } else {
                        // Still in use in memory: a large value's extent
                        // that readers may be in, or a page being handed
                        // out (its map bit is set by the next call).
                        later.push((pid, 1, gsn));
                    }
                }
                // Held as used in memory for the trim, so off the count of
                // available pages too (else commits were admitted against
                // pages no allocation could find). A reservation made
                // since the budget was read gets its pages back at once.
                let mut n = self.take_available(held.len() as u64);
                let over = a
                    .reserved
                    .load(Ordering::Acquire)
                    .saturating_sub(a.available.load(Ordering::Acquire));
                let back = (over.min(held.len() as u64)) as usize;
                for (pid, gsn) in held.drain(held.len() - back..) {
                    mirror.clear(pid);
                    later.push((pid, 1, gsn));
                }
                let give = (back as u64).min(n);
                a.available.fetch_add(give, Ordering::AcqRel);
                n -= give;
                (held.into_iter().map(|(pid, _)| pid).collect(), n)
            };
            // Their frames go without a write: a free page written back
            // after its trim undid it (out of place it mapped the page
            // again: in one test 461 of 790 trimmed pages came back), and
            // its bytes matter to nobody (a crash may leave a trimmed page
            // reading as anything; recovery rewrites a free page that fails
            // its checksum). A frame that stays latched is trimmed anyway.
            self.note_handover(held.iter().copied());
            for &pid in &held {
                let _ = self.discard(pid).await;
            }
            let trimmed = self.discard_pages(&held);
            let mut mirror = self.mirror();
            for &pid in &held {
                mirror.clear(pid);
            }
            drop(mirror);
            self.alloc.available.fetch_add(n, Ordering::AcqRel);
            self.alloc.trimmed.fetch_add(trimmed, Ordering::Relaxed);
        }
        if !later.is_empty() {
            let mut w = self.alloc.freed.lock().unwrap_or_else(|e| e.into_inner());
            if self.alloc.freed_dropped.load(Ordering::Acquire) == dropped
                && w.len() + later.len() <= MAX_WAITING
            {
                w.extend(later);
            }
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
