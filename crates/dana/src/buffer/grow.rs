//! Growth of the data files on demand.
//!
//! Owns: when the array grows (the pages the allocator can still hand out,
//! less those promised to commits, fall under a low-water mark, or a
//! commit's reservation does not fit), by how much (a step of
//! `clamp(size / 32, 16 MiB, 1 GiB)`, or more if one commit needs more),
//! the growth thread, and the tasks waiting for it. A growth runs on its
//! own short-lived thread, because `fallocate` and `fdatasync` block; the
//! array's size moves only after every device's new size is durable
//! ([`crate::io::Array::grow_to`]), and only then do the new pages count
//! as available. So no page in a new range is allocated, logged or written
//! before its range exists after a crash.
//!
//! A failed growth (a full file system) is remembered for
//! [`RETRY_AFTER`]: meanwhile, writes that need space fail at once with
//! [`Error::NoSpace`]; after it, the next one tries again (space may have
//! been freed).
//!
//! Never: runs a blocking syscall on a worker, runs two growths at once,
//! or counts pages as available before their device holds them durably.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::alloc::AllocState;
use super::BufferPool;
use crate::io::grower::{Grower, SpaceReserve};
use crate::sched::WakerList;
use crate::{Error, Result};

/// The smallest growth step, all devices together.
pub const MIN_STEP_BYTES: u64 = 16 << 20;
/// The largest growth step.
pub const MAX_STEP_BYTES: u64 = 1 << 30;
/// How long a failed growth answers for the next ones.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The state of growth, shared with the growth thread.
#[derive(Default)]
pub(crate) struct Growth {
    /// The growth thread, one at a time, and the last failure.
    grower: Grower,
    /// Room the data files' growth leaves on their file system for the
    /// log's own growth (see [`SpaceReserve`]), set once at open.
    reserve: std::sync::OnceLock<SpaceReserve>,
    /// Growths finished, succeeded or failed (waiters wait for it to move).
    rounds: AtomicU64,
    /// Growths that added pages.
    grown: AtomicU64,
    /// Tasks waiting for a growth to finish.
    waiters: WakerList,
}

impl Growth {
    /// Growths that added pages so far.
    pub(crate) fn count(&self) -> u64 {
        self.grown.load(Ordering::Relaxed)
    }
}

/// The growth step in pages for an array of `pages` pages of `page_size`
/// bytes: `clamp(size / 32, 16 MiB, 1 GiB)`.
pub fn step_pages(pages: u64, page_size: u64) -> u64 {
    let bytes = (pages.saturating_mul(page_size) / 32).clamp(MIN_STEP_BYTES, MAX_STEP_BYTES);
    (bytes / page_size).max(1)
}

/// Below this many free (unpromised) pages a growth starts ahead of need:
/// a quarter of a step, or of the array while it is smaller than that.
pub fn low_water_pages(pages: u64, page_size: u64) -> u64 {
    (step_pages(pages, page_size) / 4).min(pages / 4).max(1)
}

impl BufferPool {
    /// Pages the allocator can hand out and no commit has been promised.
    fn unpromised_pages(&self) -> u64 {
        let a = &self.alloc;
        a.available
            .load(Ordering::Acquire)
            .saturating_sub(a.reserved.load(Ordering::Acquire))
    }

    /// Starts a growth ahead of need if free pages ran under the low-water
    /// mark (called after each allocation; one load when there is room).
    pub(crate) fn grow_if_low(&self) {
        let pages = self.array.pages();
        if self.unpromised_pages() < low_water_pages(pages, self.page_size as u64) {
            let _ = self.start_growth(0);
        }
    }

    /// Starts a growth that adds at least `need` pages (and at least a
    /// step), unless one is running. Err when none can start: the array is
    /// at its maximum, or the last growth failed under [`RETRY_AFTER`] ago
    /// (the error says which).
    fn start_growth(&self, need: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let pages = self.array.pages();
        if pages >= self.array.max_pages() {
            // The limit named as it is set (without a maximum size the
            // message sent the caller to an option never set; an outside
            // probe).
            return Err(Error::NoSpace(format!(
                "the database holds its maximum of {} pages ({} bytes; set by {})",
                self.array.max_pages(),
                self.array.max_pages() * self.page_size as u64,
                self.array.max_pages_set_by()
            )));
        }
        let growth = &self.alloc.growth;
        if let Some(what) = growth.grower.recent_failure(RETRY_AFTER) {
            return Err(Error::NoSpace(what));
        }
        let target = pages + need.max(step_pages(pages, self.page_size as u64));
        let least = pages + need.max(1);
        let (array, alloc) = (self.array.clone(), self.alloc.clone());
        let done_alloc = self.alloc.clone();
        let geometry = super::space_map::Geometry::new(self.page_size);
        let page_size = self.page_size as u64;
        growth
            .grower
            .start(
                "dana-grow",
                move || {
                    let (target, least) = within_reserve(&array, &alloc, page_size, target, least)?;
                    grow(&array, &alloc, geometry, target, least)
                },
                move |r| {
                    let g = &done_alloc.growth;
                    if r.is_ok() {
                        g.grown.fetch_add(1, Ordering::Relaxed);
                    }
                    g.rounds.fetch_add(1, Ordering::AcqRel);
                    g.waiters.wake_all();
                },
            )
            .map_err(Error::NoSpace)?;
        Ok(())
    }

    /// Keeps room on the data files' file system for the files of
    /// `reserve` (the log's first lap) when the data files grow.
    pub fn reserve_space(&self, reserve: SpaceReserve) {
        let _ = self.alloc.growth.reserve.set(reserve);
    }

    /// Waits for a growth in progress to finish (at close: no thread may
    /// touch the files once their locks are released).
    pub fn finish_growth(&self) {
        self.alloc.growth.grower.finish();
    }

    /// Grows the array by a step (or waits for the growth under way) and
    /// fails with [`Error::NoSpace`] if it did not grow: for an allocation
    /// that must pass over the free pages there are (the roots of trees
    /// dropped since open), which the count of available pages holds, so
    /// no growth came for them (an outside probe: `create_tree` failed
    /// with `NoSpace` after ~250 creates and drops in one session).
    pub(crate) async fn grow_now(&self) -> Result<()> {
        self.grow_by(1).await
    }

    /// Grows the array by at least `need` pages (and at least a step), or
    /// fails with [`Error::NoSpace`]: for a large value whose free pages
    /// lie in more runs than its reference can name (see
    /// `BufferPool::blob_hold`), and for [`BufferPool::grow_now`].
    pub(crate) async fn grow_by(&self, need: u64) -> Result<()> {
        let pages = self.array.pages();
        let growth = &self.alloc.growth;
        // Two rounds at most: one that was under way, then ours.
        for _ in 0..2 {
            let round = growth.rounds.load(Ordering::Acquire);
            self.start_growth(need)?;
            growth.waiters.until_changed(&growth.rounds, round).await;
            if self.array.pages() >= pages + need {
                return Ok(());
            }
        }
        Err(Error::NoSpace(format!(
            "all {pages} pages of the array are in use or to be passed over, and it did not grow \
             by {need}"
        )))
    }

    /// Waits until `pages` more pages than those promised are available,
    /// growing the array as needed. Fails with [`Error::NoSpace`] when the
    /// array cannot grow enough. Bounded: each round either succeeds,
    /// fails, or waits for a growth that adds pages or fails.
    pub(crate) async fn wait_for_space(&self, pages: u64) -> Result<()> {
        loop {
            // Extents of holds whose writes have ended (and retired ones
            // readers no longer see) first: a growth is not started for
            // pages about to come back (a review's finding).
            self.release_retired();
            let free = self.unpromised_pages();
            if free >= pages {
                return Ok(());
            }
            let growth = &self.alloc.growth;
            let round = growth.rounds.load(Ordering::Acquire);
            self.start_growth(pages - free)?;
            growth.waiters.until_changed(&growth.rounds, round).await;
            // A growth finished. If it failed, the next round's
            // start_growth reports it.
        }
    }
}

/// A dropped pool leaves no growth thread behind (it may be dropped
/// without a close, and its files' locks go right after).
impl Drop for BufferPool {
    fn drop(&mut self) {
        self.finish_growth();
    }
}

/// The growth's `target` and `least` pages cut to what leaves the reserve
/// free on the data files' file system (the first device's); an error if
/// even `least` would eat into it. Without a reserve, or on another file
/// system, or when the kernel does not say, unchanged.
fn within_reserve(
    array: &crate::io::Array,
    alloc: &Arc<AllocState>,
    page_size: u64,
    target: u64,
    least: u64,
) -> std::result::Result<(u64, u64), String> {
    let Some(reserve) = alloc.growth.reserve.get() else {
        return Ok((target, least));
    };
    // The first data device's files on the reserve's file system: one, or
    // a mirror's copies, each taking a page's bytes per page.
    let files: Vec<_> = array
        .targets()
        .first()
        .map(|t| t.files(0))
        .unwrap_or_default()
        .into_iter()
        .filter(|(f, _)| f.file_system() == Some(reserve.file_system))
        .collect();
    let Some((d, _)) = files.first() else {
        return Ok((target, least));
    };
    let (Some(free), needed) = (d.free_bytes(), reserve.needed()) else {
        return Ok((target, least));
    };
    let pages = array.pages();
    let room = free.saturating_sub(needed) / (page_size * files.len() as u64);
    if pages + room >= target {
        return Ok((target, least));
    }
    if pages + room >= least {
        return Ok((pages + room, least));
    }
    // The reserve is only kept from the data files: other files on the
    // file system may have taken it (the message read "0 bytes free,
    // 4194304 of them kept"; an outside probe).
    let kept = if free >= needed {
        format!("{needed} of them kept for the log to grow into (its first lap)")
    } else {
        format!(
            "less than the {needed} the data files leave for the log to grow into (its first \
             lap): other files took it"
        )
    };
    Err(format!(
        "the file system of {} is nearly full: {free} bytes free, {kept}; delete data to make \
         room in the database, or free space on the file system",
        d.path().display(),
    ))
}

/// The growth thread: grows the array to `target` pages (or, if the file
/// system has no room for that, to the `least` pages asked for) and
/// publishes the new pages.
fn grow(
    array: &crate::io::Array,
    alloc: &Arc<AllocState>,
    geometry: super::space_map::Geometry,
    target: u64,
    least: u64,
) -> std::result::Result<(), String> {
    let before = array.pages();
    let r = match array.grow_to(target) {
        Err(Error::NoSpace(_)) if least < target => array.grow_to(least),
        r => r,
    };
    r.map(|after| {
        // The new pages lie past the high-water mark; the map pages among
        // them are never handed out.
        alloc
            .available
            .fetch_add(geometry.usable(before, after), Ordering::AcqRel);
    })
    .map_err(|e| match e {
        Error::NoSpace(what) => what,
        other => format!("growing the data files failed: {other}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_a_32nd_of_the_size_within_bounds() {
        let ps = 4096;
        assert_eq!(step_pages(256, ps), (16 << 20) / ps, "small: 16 MiB");
        assert_eq!(step_pages((16u64 << 30) / ps, ps), (512 << 20) / ps);
        assert_eq!(
            step_pages((1u64 << 40) / ps, ps),
            (1 << 30) / ps,
            "capped at 1 GiB"
        );
        assert_eq!(low_water_pages(256, ps), 64, "a quarter of a small array");
        assert_eq!(
            low_water_pages(1 << 20, ps),
            (128 << 20) / ps / 4,
            "4 GiB: 128 MiB steps"
        );
    }
}
