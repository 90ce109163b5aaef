//! The fence between reads of a tree and the drop that frees its pages.
//!
//! Owns: per-slot counts of reads in flight, in two epochs. A read enters
//! ([`FenceGuard::enter`]: counts itself in its slot's count for the
//! current epoch), then checks that its tree is alive, reads, and leaves
//! when its guard drops. A drop marks the tree dropped, then
//! [`ReadFence::wait_readers`] moves the epoch on and waits until every
//! read that entered in the old epoch has left: a read that passed the
//! liveness check before the mark is among them, and one that enters
//! after the move sees the mark. Only then are the tree's pages freed, so
//! no read of a dropped tree meets one of its pages reused by another
//! tree (a review found reads in flight across a drop reading freed
//! pages, even another tree's leaves).
//!
//! Slots: one per worker and one for every other thread, each on its own
//! cache line, so entering costs two uncontended atomic increments and
//! two loads of an epoch that moves only at a drop.
//!
//! The same fence stands between writes and `Db::close`
//! (`Committer::writers`): a write enters before it checks that the
//! database is open, and close marks it closed, then waits for every
//! write that entered before ([`ReadFence::wait_all_entered`]).
//!
//! Never: blocks a read; waits on a worker (drops and closes run from a
//! thread of their own); waits for reads without bound (a read stuck
//! longer than [`WAIT_LIMIT`] fails the wait, and the drop's pages stay
//! until the next open completes it).

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The longest a drop waits for the reads in flight (2 s in unit tests,
/// which hold a read past it).
#[cfg(not(test))]
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(60);
#[cfg(test)]
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(2);

/// Reads in flight of one slot, per epoch parity, on a cache line of its
/// own.
#[repr(align(128))]
#[derive(Default)]
struct Slot([AtomicU64; 2]);

/// See the module doc.
pub(crate) struct ReadFence {
    epoch: AtomicU64,
    slots: Box<[Slot]>,
    /// A wait gave up: reads it waited for may still count in the parity
    /// the epoch does not use now (no read enters there until the epoch
    /// moves), and the next wait waits for them first.
    gave_up: AtomicBool,
}

/// Where a read in flight is counted.
#[derive(Clone, Copy)]
struct Entered {
    slot: usize,
    parity: usize,
}

/// A read in flight, entered through `F` (a borrow of the fence, or an
/// `Arc` of it for a guard that outlives the borrow: a cursor's, held per
/// leaf); leaves the fence when dropped.
pub(crate) struct FenceGuard<F: Deref<Target = ReadFence>> {
    fence: F,
    at: Entered,
    /// Entered on a thread that is not a worker: that thread's count of
    /// reads it holds in this fence (wherever the guard drops).
    here: Option<Arc<AtomicU64>>,
}

impl<F: Deref<Target = ReadFence>> FenceGuard<F> {
    /// Enters a read: hold the guard from before the tree's liveness
    /// check until the read of its pages is done.
    pub(crate) fn enter(fence: F) -> FenceGuard<F> {
        let at = fence.enter_at();
        let here = crate::sched::current_worker()
            .is_none()
            .then(|| held_here(&fence))
            .flatten();
        if let Some(h) = &here {
            h.fetch_add(1, Ordering::SeqCst);
        }
        FenceGuard { fence, at, here }
    }
}

impl<F: Deref<Target = ReadFence>> Drop for FenceGuard<F> {
    fn drop(&mut self) {
        self.fence.slots[self.at.slot].0[self.at.parity].fetch_sub(1, Ordering::SeqCst);
        if let Some(h) = &self.here {
            h.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

thread_local! {
    /// Per fence (by address), the reads this thread entered and still
    /// holds: a drop asked for inside one (from `Tree::update`'s closure)
    /// would wait for itself.
    static HELD_HERE: RefCell<Vec<(usize, Arc<AtomicU64>)>> = const { RefCell::new(Vec::new()) };
}

/// This thread's count of reads held in `fence` (None while the thread's
/// locals are being destroyed: not counted). A fence met for the first
/// time drops, on the way, the entries of fences with no read held and no
/// guard left (a fence's address may be reused only once nothing holds
/// it); a fence met before costs a lookup.
fn held_here(fence: &ReadFence) -> Option<Arc<AtomicU64>> {
    let at = fence as *const ReadFence as usize;
    HELD_HERE
        .try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some((_, c)) = h.iter().find(|(a, _)| *a == at) {
                return c.clone();
            }
            h.retain(|(_, c)| Arc::strong_count(c) > 1 || c.load(Ordering::SeqCst) > 0);
            let c = Arc::new(AtomicU64::new(0));
            h.push((at, c.clone()));
            c
        })
        .ok()
}

impl ReadFence {
    /// A fence for `workers` workers (and every other thread).
    pub(crate) fn new(workers: usize) -> ReadFence {
        ReadFence {
            epoch: AtomicU64::new(0),
            slots: (0..=workers).map(|_| Slot::default()).collect(),
            gave_up: AtomicBool::new(false),
        }
    }

    /// [`Error::InvalidArgument`] if this thread (not a worker) holds a
    /// read in this fence: a drop it asked for would wait for that read,
    /// its own, for [`WAIT_LIMIT`] and then fail, its tree already gone
    /// from the catalogue (an outside probe's finding). Called before a
    /// drop changes anything.
    pub(crate) fn refuse_read_held_here(&self) -> Result<()> {
        let at = self as *const ReadFence as usize;
        let held = HELD_HERE
            .try_with(|h| {
                h.borrow()
                    .iter()
                    .any(|(a, c)| *a == at && c.load(Ordering::SeqCst) > 0)
            })
            .unwrap_or(false);
        if held {
            return Err(Error::InvalidArgument(
                "a tree dropped while this thread holds a read of the database (inside \
                 Tree::update's closure): the drop would wait for that read, its own"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Counts a read in its slot for the current epoch.
    fn enter_at(&self) -> Entered {
        let last = self.slots.len() - 1;
        let slot = crate::sched::current_worker().map_or(last, |w| w.min(last));
        // Bounded: the epoch moves only at a drop, one at a time.
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            let parity = (e % 2) as usize;
            self.slots[slot].0[parity].fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == e {
                return Entered { slot, parity };
            }
            self.slots[slot].0[parity].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Moves the epoch on and waits until every read that entered before
    /// has left. One caller at a time (drops hold the catalogue's lock);
    /// never on a worker. A read still in flight after [`WAIT_LIMIT`] is
    /// an error naming the wait.
    pub(crate) fn wait_readers(&self) -> Result<()> {
        if self.wait_entered(Some(WAIT_LIMIT)) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "a read of the dropped tree was still in flight after {} s: its pages \
             stay allocated until the next open completes the drop",
            WAIT_LIMIT.as_secs()
        )))
    }

    /// Moves the epoch on and waits until everything that entered before
    /// has left, for as long as it takes (close's wait for the writes in
    /// progress, each of which ends on its own). One caller at a time;
    /// never on a worker.
    pub(crate) fn wait_all_entered(&self) {
        self.wait_entered(None);
    }

    /// Moves the epoch on and waits until the old epoch's counts are all
    /// zero, at most `limit`; false if they were not.
    ///
    /// After a wait that gave up, the reads it waited for still count in
    /// the parity the epoch left; moved on once more, the epoch would send
    /// new reads there and the next wait would look at the other parity
    /// only, ending at once under those reads (a drop that followed a
    /// failed one freed the pages under them: a review's finding). So that
    /// parity is drained first, before the epoch moves, while no read
    /// enters it.
    fn wait_entered(&self, limit: Option<Duration>) -> bool {
        let started = Instant::now();
        if self.gave_up.load(Ordering::SeqCst) {
            let left = ((self.epoch.load(Ordering::SeqCst) + 1) % 2) as usize;
            if !self.drained(left, started, limit) {
                return false;
            }
            self.gave_up.store(false, Ordering::SeqCst);
        }
        let old = self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.drained((old % 2) as usize, started, limit) {
            return true;
        }
        self.gave_up.store(true, Ordering::SeqCst);
        false
    }

    /// Waits until every slot's count of `parity` is zero; false if
    /// `limit` after `started` it was not.
    fn drained(&self, parity: usize, started: Instant, limit: Option<Duration>) -> bool {
        while self
            .slots
            .iter()
            .any(|s| s.0[parity].load(Ordering::SeqCst) != 0)
        {
            if limit.is_some_and(|l| started.elapsed() > l) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_waits_for_reads_that_entered_before_it_only() {
        let f = Arc::new(ReadFence::new(2));
        let before = FenceGuard::enter(&*f);
        let f2 = f.clone();
        // Timed from here: the thread may start late on a busy machine,
        // while the read below leaves 50 ms from now at the earliest.
        let t = Instant::now();
        let waiter = std::thread::spawn(move || {
            f2.wait_readers().unwrap();
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        // A read entering after the wait began does not hold it up.
        let after = FenceGuard::enter(f.clone());
        assert!(
            !waiter.is_finished(),
            "the wait ended with a read in flight"
        );
        drop(before);
        let waited = waiter.join().unwrap();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        drop(after);
        // Nothing in flight: the next wait ends at once.
        f.wait_readers().unwrap();
    }

    /// A wait that gave up on a read still in flight leaves it counted:
    /// the next wait fails too while the read lasts, and succeeds once it
    /// left, however many epochs went by. (The next wait ended at once:
    /// the epoch had moved the read's parity out of its sight.)
    #[test]
    fn a_wait_after_one_that_gave_up_still_waits_for_its_read() {
        let f = ReadFence::new(2);
        let stuck = FenceGuard::enter(&f);
        assert!(f.wait_readers().is_err());
        let later = FenceGuard::enter(&f);
        drop(later);
        let t = Instant::now();
        assert!(
            f.wait_readers().is_err(),
            "the second wait ended under the read"
        );
        assert!(t.elapsed() >= WAIT_LIMIT);
        drop(stuck);
        f.wait_readers().unwrap();
        f.wait_readers().unwrap();
    }
}
