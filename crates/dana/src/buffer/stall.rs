//! Eviction's stall flag and the count of write-backs in flight.
//!
//! Owns: the number of page write-backs queued and not yet completed, and
//! the flag by which eviction stops scanning when a round freed nothing
//! and started no write while writes were in flight (nothing it looks at
//! can change before one of them completes); each completion clears it.
//! Never: leaves the flag set with no write in flight. A flag stuck that
//! way stops eviction for good: tasks waiting for a free frame park, the
//! workers sleep, and nothing wakes them (a rare hang of
//! `tests/races.rs` on clean-clone CI runs).
//!
//! Why every access is `SeqCst`: the stalling side stores the flag and
//! then loads the count; the completing side changes the count and then
//! stores the flag. With release stores and acquire loads the stalling
//! side's load may be served before its store is visible (x86's store
//! buffer does exactly this), so it can read a count of 1 from before the
//! completion while its `true` lands after the completion's `false`:
//! flag set, nothing in flight. In one total order of `SeqCst`
//! operations, if the stalling load sees the write still in flight, the
//! flag's store precedes the completion's decrement and so its clearing
//! store. `stall_protocol_never_leaves_the_flag_set_with_nothing_in_flight`
//! fails with the weaker orderings (on this project's 2-core x86 host:
//! about one round in ten).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// Write-backs in flight and eviction's stall flag (see the module doc).
#[derive(Default)]
pub(crate) struct WriteStall {
    in_flight: AtomicUsize,
    stalled: AtomicBool,
}

impl WriteStall {
    /// A write-back is about to be queued. Counted before it is queued, so
    /// that its completion can never be counted first.
    pub(crate) fn started(&self) {
        self.in_flight.fetch_add(1, SeqCst);
    }

    /// A write-back completed (or could not be queued after
    /// [`WriteStall::started`]): eviction may find something to do again.
    pub(crate) fn completed(&self) {
        let before = self.in_flight.fetch_sub(1, SeqCst);
        assert!(before > 0, "a write-back completed that was never started");
        self.stalled.store(false, SeqCst);
    }

    /// Write-backs queued and not yet completed.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    /// True while eviction waits for a write-back to complete.
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(SeqCst)
    }

    /// After an eviction round that freed nothing and started no write:
    /// stalls eviction if write-backs are in flight (their completions
    /// clear it). Returns true if it stalled.
    pub(crate) fn stall_if_writing(&self) -> bool {
        if self.in_flight.load(SeqCst) == 0 {
            return false;
        }
        self.stalled.store(true, SeqCst);
        // The last write may have completed before the flag was set.
        if self.in_flight.load(SeqCst) == 0 {
            self.stalled.store(false, SeqCst);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// One write in flight; one thread completes it while another stalls
    /// on it, started together round after round. Whatever the order,
    /// the flag must end clear (nothing is in flight).
    #[test]
    fn stall_protocol_never_leaves_the_flag_set_with_nothing_in_flight() {
        const ROUNDS: u64 = 50_000;
        // Spins, then yields: on a busy machine the other side may be
        // descheduled, and spinning through its time slice would stretch
        // the test from a fraction of a second to minutes.
        fn wait_until(cond: impl Fn() -> bool) {
            let mut spins = 0u32;
            while !cond() {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let stall = Arc::new(WriteStall::default());
        // Round r starts when `go` reaches 2r+1 (set by the main thread);
        // each side bumps `done` when it finished its half.
        let go = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let completer = {
            let (stall, go, done) = (stall.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                for r in 0..ROUNDS {
                    wait_until(|| go.load(SeqCst) > 2 * r);
                    stall.completed();
                    done.fetch_add(1, SeqCst);
                }
            })
        };
        let mut stuck = 0;
        for r in 0..ROUNDS {
            stall.started();
            go.store(2 * r + 1, SeqCst);
            stall.stall_if_writing();
            wait_until(|| done.load(SeqCst) > r);
            if stall.is_stalled() && stall.in_flight() == 0 {
                stuck += 1;
                stall.stalled.store(false, SeqCst);
            }
            go.store(2 * r + 2, SeqCst);
        }
        completer.join().unwrap();
        assert_eq!(
            stuck, 0,
            "rounds that left eviction stalled with no write in flight"
        );
    }

    #[test]
    fn a_completion_clears_the_stall_and_nothing_stalls_without_writes() {
        let s = WriteStall::default();
        assert!(!s.stall_if_writing());
        assert!(!s.is_stalled());
        s.started();
        s.started();
        assert!(s.stall_if_writing());
        s.completed();
        assert!(!s.is_stalled());
        assert_eq!(s.in_flight(), 1);
        assert!(s.stall_if_writing());
        s.completed();
        assert!(!s.is_stalled() && s.in_flight() == 0);
    }
}
