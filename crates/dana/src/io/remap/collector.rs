//! The background collection of one out-of-place device: a thread of its
//! own that keeps free segments ahead of the engine's writes, so that a
//! worker writing a page seldom runs the collection, and its barriers'
//! flushes, itself while its other tasks wait (#14's throughput on a
//! disk: those waits cost a worker ~13% of its time on YCSB-A).
//!
//! Owns: the thread, its wake-up signal, and the device's watermarks
//! (when the thread starts collecting, when it stops, how many emptied
//! segments one barrier frees).
//!
//! Never: holds the device's own queue across more than one step (one
//! victim's copy, or one barrier); waits for reads in flight that pin an
//! emptied segment (it comes
//! back later, where the workers' own collection would wait for them);
//! keeps the device alive (it holds a weak reference, and ends when the
//! device is dropped).
//!
//! A worker's own collection ([`super::Remap::collect`], when only the
//! collection's reserve of free segments is left) stays as the fallback
//! when this thread falls behind or fails: so nothing waits on it, and an
//! error it meets is met again, and returned, by the write that needs the
//! room. The thread is the engine's own code: a plain `std::thread` with
//! a `Condvar`.
//!
//! # Watermarks
//! `room` is the segments the live data does not need (beyond the open
//! segments and the reserve); `ahead = room / 16`, from 1 to 64. A write
//! that leaves fewer than `reserve + ahead` segments free wakes the thread,
//! which collects until `reserve + 2 * ahead` are free, freeing the emptied
//! segments by a barrier every `ahead / 2` of them. At 90% fill `room` is
//! small and so is what the thread keeps back from the greedy collection
//! (a segment kept free is one the victims' live data cannot spread into);
//! on a half-full device of 2,000 segments it keeps 62 (31 MiB) ahead.
//! On a tiny one (crashtest's 23 segments) `ahead` is 1: the thread is
//! woken about when the writers run out, and races their own collection
//! more than it runs ahead of it.
//!
//! The device's queue is a plain mutex, not a fair one: the thread takes
//! it again right after a step, so an engine flush (its barrier) or a
//! writer's own collection that waits for it may wait for the rest of a
//! run (up to `ahead` segments' copies and barriers), not one step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Remap;
use crate::{Error, Result};

/// How long the thread sleeps without a wake-up before it looks at the
/// free segments anyway (a wake-up is never lost, this is a backstop).
const IDLE_CHECK: Duration = Duration::from_millis(50);
/// Idle checks between two workings-out of the watermarks (they follow
/// the live data, and cost a pass over the segments).
const REFRESH_EVERY: u32 = 20;
/// How long it rests after a failed step before it tries again.
const FAILURE_REST: Duration = Duration::from_millis(100);
/// `ahead`'s bounds (see the module comment).
const AHEAD_MIN: usize = 1;
const AHEAD_MAX: usize = 64;

/// The watermarks of a device's background collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Watermarks {
    /// Fewer free segments than this wake the thread.
    pub low: usize,
    /// It collects until this many are free.
    pub high: usize,
    /// Emptied segments one of its barriers frees (fewer at the end).
    pub batch: usize,
}

impl Watermarks {
    /// The watermarks of a device with `room` segments beyond what its live
    /// data needs, the open segments and a `reserve` of free ones.
    pub(super) fn of(room: usize, reserve: usize) -> Watermarks {
        let ahead = (room / 16).clamp(AHEAD_MIN, AHEAD_MAX);
        Watermarks {
            low: reserve + ahead,
            high: reserve + 2 * ahead,
            batch: (ahead / 2).max(1),
        }
    }
}

/// What a writer and the thread share.
#[derive(Debug, Default)]
pub(super) struct Signal {
    /// A wake-up asked and not yet taken (a writer skips the notify).
    asked: Mutex<bool>,
    wake: Condvar,
    /// Set once: the thread ends after its step.
    stop: AtomicBool,
}

impl Signal {
    /// Wakes the thread (cheap when it was already asked).
    pub(super) fn ask(&self) {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        if !*asked {
            *asked = true;
            self.wake.notify_one();
        }
    }

    /// True once the collector was told to stop.
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps until asked, stopped or `timeout`, and takes the wake-up.
    fn sleep(&self, timeout: Duration) {
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        let (mut asked, _) = self
            .wake
            .wait_timeout_while(asked, timeout, |asked| !*asked && !self.stopped())
            .unwrap_or_else(|e| e.into_inner());
        *asked = false;
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_all();
    }
}

/// The background collection of one device, running until this handle
/// is dropped or [`Collector::stop`]ped (it then ends after its step and
/// is joined). See [`Remap::start_collector`].
#[derive(Debug)]
pub struct Collector {
    signal: Arc<Signal>,
    device: Weak<Remap>,
    thread: Option<JoinHandle<()>>,
}

impl Collector {
    /// Starts the thread of `remap`'s background collection.
    pub(super) fn start(remap: &Arc<Remap>, signal: Arc<Signal>) -> Result<Collector> {
        let device: Weak<Remap> = Arc::downgrade(remap);
        let shared = signal.clone();
        let thread = std::thread::Builder::new()
            .name("dana-collect".into())
            .spawn(move || run(device, &shared))
            .map_err(|source| Error::Backend {
                backend: "remap",
                what: "starting the collection thread".into(),
                source,
            })?;
        Ok(Collector {
            signal,
            device: Arc::downgrade(remap),
            thread: Some(thread),
        })
    }

    /// Stops the thread after its step and joins it. The device's writers
    /// collect for themselves from then on.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.signal.stop();
        if let Some(t) = self.thread.take() {
            // A panic on the thread is a bug that already printed itself;
            // the writers' own collection still works.
            let _ = t.join();
        }
        if let Some(r) = self.device.upgrade() {
            r.collector_stopped();
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The thread: sleeps, then collects ahead when the device asks for it
/// (or at least every [`IDLE_CHECK`]); ends at the stop or when the device
/// is gone.
fn run(device: Weak<Remap>, signal: &Signal) {
    let mut pass = 0u32;
    // Bounded by the stop, or the device's drop: each pass sleeps first.
    loop {
        pass = pass.wrapping_add(1);
        signal.sleep(IDLE_CHECK);
        if signal.stopped() {
            return;
        }
        let Some(remap) = device.upgrade() else {
            return;
        };
        let outcome = remap.collect_ahead(signal, pass % REFRESH_EVERY == 0);
        drop(remap);
        if outcome.is_err() {
            // Counted by the device; the write that needs the room meets
            // the error again and returns it.
            std::thread::sleep(FAILURE_REST);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_grow_with_the_room_and_stay_bounded() {
        let tight = Watermarks::of(10, 2);
        assert_eq!(
            tight,
            Watermarks {
                low: 3,
                high: 4,
                batch: 1
            }
        );
        let half_full = Watermarks::of(1_360, 2);
        assert_eq!(half_full.low, 2 + 64);
        assert_eq!(half_full.high, 2 + 128);
        assert_eq!(half_full.batch, 32);
        let mid = Watermarks::of(320, 2);
        assert_eq!((mid.low, mid.high, mid.batch), (22, 42, 10));
        for room in [0, 1, 15, 16, 17, 100, 1_000, 1 << 30] {
            let w = Watermarks::of(room, 2);
            assert!(2 < w.low && w.low < w.high && w.batch >= 1);
            assert!(w.high - 2 <= 2 * AHEAD_MAX);
        }
    }

    #[test]
    fn an_ask_wakes_a_sleeper_and_a_stop_ends_it() {
        let signal = Arc::new(Signal::default());
        let s = signal.clone();
        let t = std::thread::spawn(move || {
            s.sleep(Duration::from_secs(60));
            s.sleep(Duration::from_secs(60));
            s.stopped()
        });
        signal.ask();
        // The first sleep took the ask (or it was asked before the sleep:
        // then it returned at once); the stop ends the second.
        std::thread::sleep(Duration::from_millis(20));
        signal.stop();
        assert!(t.join().unwrap());
    }
}
