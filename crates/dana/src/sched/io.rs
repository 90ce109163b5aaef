//! A worker's I/O: its queue to every device, requests waiting for the
//! device's in-flight budget, and the hand-off of completions.
//!
//! Owns: the thread-local `WorkerIo` of each worker and the
//! [`DeviceBudgets`] shared by all workers. Tasks call [`enqueue`]; the
//! worker loop calls `submit_all` (one batch per device) and `reap_all`.
//!
//! The budget: each device has a limit of requests in flight across all
//! workers, split into equal fixed shares per worker. Beyond its share a
//! worker's requests wait here, in the engine, and the time they waited is
//! recorded. Fixed shares keep a worker from ever waiting on another
//! worker's completions (a shared pool starved one worker while the other
//! refilled: p99 engine queueing of 31 ms in `dana bench lookup`). Piling more requests on a device than it serves
//! best only adds latency (this machine's disk gives ~150k reads/s at depth
//! 16-32 but ~78k at depth 128).
//!
//! Never: blocks, or holds the thread-local borrow while calling a
//! completion handler or polling a task.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::io::{Completion, IoQueue, Request};
use crate::stats::Histogram;
use crate::Error;

/// When a request entered the engine, reached the device and came back.
#[derive(Debug, Clone, Copy)]
pub struct IoTiming {
    /// Handed to [`enqueue`].
    pub enqueued: Instant,
    /// Submitted to the device's queue.
    pub submitted: Instant,
    /// Its completion was reaped.
    pub reaped: Instant,
}

/// In-flight limits per device, shared by all workers.
pub struct DeviceBudgets {
    in_flight: Vec<AtomicUsize>,
    limit: usize,
    share: usize,
    /// Hand each request to the kernel as soon as it is queued (one
    /// `io_uring_enter` per request) instead of one per device per round.
    submit_each: bool,
    /// How long requests waited in the engine for the budget.
    pub queue_wait: Histogram,
}

impl DeviceBudgets {
    pub(crate) fn new(
        devices: usize,
        limit: usize,
        workers: usize,
        submit_each: bool,
    ) -> DeviceBudgets {
        let limit = limit.max(1);
        DeviceBudgets {
            submit_each,
            in_flight: (0..devices).map(|_| AtomicUsize::new(0)).collect(),
            limit,
            share: (limit / workers.max(1)).max(1),
            queue_wait: Histogram::default(),
        }
    }

    fn try_acquire(&self, device: usize) -> bool {
        let c = &self.in_flight[device];
        let mut cur = c.load(Ordering::Relaxed);
        loop {
            if cur >= self.limit {
                return false;
            }
            match c.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    fn release(&self, device: usize) {
        let prev = self.in_flight[device].fetch_sub(1, Ordering::AcqRel);
        // Control-plane invariant, checked in release builds too: a release
        // without an acquire would let the budget grow past its limit.
        assert!(
            prev > 0,
            "device {device}: budget released more often than acquired"
        );
    }

    /// Requests in flight on `device` across all workers.
    pub fn in_flight(&self, device: usize) -> usize {
        self.in_flight[device].load(Ordering::Relaxed)
    }

    /// The per-device limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Each worker's share of the per-device limit.
    pub fn share(&self) -> usize {
        self.share
    }
}

struct Waiting {
    req: Request,
    enqueued: Instant,
}

#[derive(Clone, Copy)]
struct Meta {
    tag: u64,
    enqueued: Instant,
    submitted: Instant,
}

/// One device's queue and the bookkeeping around it.
struct DeviceIo {
    queue: Box<dyn IoQueue>,
    waiting: VecDeque<Waiting>,
    meta: Vec<Option<Meta>>,
    free_meta: Vec<u32>,
}

/// The I/O state of one worker thread.
pub(crate) struct WorkerIo {
    devices: Vec<DeviceIo>,
    budgets: std::sync::Arc<DeviceBudgets>,
    scratch: Vec<Completion>,
    rejected: Vec<(Completion, IoTiming)>,
    submit_errors: u64,
    last_submit_error: Option<Error>,
}

thread_local! {
    static IO: RefCell<Option<WorkerIo>> = const { RefCell::new(None) };
}

/// Queues `req` for device `device` on the current worker. Returns the
/// request back when the calling thread is not a worker.
pub fn enqueue(device: usize, req: Request) -> Result<(), Request> {
    IO.with(|io| match io.borrow_mut().as_mut() {
        Some(w) if device < w.devices.len() => {
            w.devices[device].waiting.push_back(Waiting {
                req,
                enqueued: Instant::now(),
            });
            Ok(())
        }
        _ => Err(req),
    })
}

/// True on a worker thread (where [`enqueue`] works).
pub fn on_worker() -> bool {
    IO.with(|io| io.borrow().is_some())
}

impl WorkerIo {
    pub(crate) fn new(
        queues: Vec<Box<dyn IoQueue>>,
        budgets: std::sync::Arc<DeviceBudgets>,
    ) -> WorkerIo {
        WorkerIo {
            devices: queues
                .into_iter()
                .map(|queue| {
                    let cap = queue.capacity();
                    DeviceIo {
                        queue,
                        waiting: VecDeque::new(),
                        meta: vec![None; cap],
                        free_meta: (0..cap as u32).rev().collect(),
                    }
                })
                .collect(),
            budgets,
            scratch: Vec::new(),
            rejected: Vec::new(),
            submit_errors: 0,
            last_submit_error: None,
        }
    }

    /// Installs this state as the current thread's.
    pub(crate) fn install(self) {
        IO.with(|io| *io.borrow_mut() = Some(self));
    }

    /// Removes the current thread's state (dropping queues waits for their
    /// requests in flight).
    pub(crate) fn uninstall() -> Option<WorkerIo> {
        IO.with(|io| io.borrow_mut().take())
    }

    /// Runs `f` on the current thread's state.
    pub(crate) fn with<R>(f: impl FnOnce(&mut WorkerIo) -> R) -> Option<R> {
        IO.with(|io| io.borrow_mut().as_mut().map(f))
    }

    /// Moves waiting requests into the device queues as far as budgets and
    /// queue capacity allow, then submits each device's batch with one call.
    pub(crate) fn submit_all(&mut self) -> usize {
        let mut total = 0;
        // Read the clock only when something waits (a worker's loop calls
        // this every round, mostly with nothing to do).
        if self
            .devices
            .iter()
            .all(|d| d.waiting.is_empty() && d.queue.queued() == 0)
        {
            return 0;
        }
        let now = Instant::now();
        for (d, dev) in self.devices.iter_mut().enumerate() {
            let mut pushed = 0;
            while !dev.waiting.is_empty()
                && !dev.free_meta.is_empty()
                && dev.queue.in_flight() + dev.queue.queued() < self.budgets.share
            {
                if !self.budgets.try_acquire(d) {
                    break;
                }
                let Some(w) = dev.waiting.pop_front() else {
                    self.budgets.release(d);
                    break;
                };
                let Some(slot) = dev.free_meta.pop() else {
                    unreachable!("checked free_meta is non-empty")
                };
                self.budgets
                    .queue_wait
                    .record(now.saturating_duration_since(w.enqueued));
                let user_tag = w.req.tag;
                let mut req = w.req;
                req.tag = slot as u64;
                match dev.queue.push(req) {
                    Ok(()) => {
                        dev.meta[slot as usize] = Some(Meta {
                            tag: user_tag,
                            enqueued: w.enqueued,
                            submitted: now,
                        });
                        pushed += 1;
                        if self.budgets.submit_each {
                            if let Err(e) = dev.queue.submit() {
                                self.submit_errors += 1;
                                self.last_submit_error = Some(e);
                            }
                        }
                    }
                    Err(rej) => {
                        // Misaligned or out of range: fail this request
                        // alone, with the queue's error.
                        self.budgets.release(d);
                        dev.free_meta.push(slot);
                        let r = rej.request;
                        self.rejected.push((
                            Completion {
                                tag: user_tag,
                                op: r.op,
                                offset: r.offset,
                                buf: r.buf,
                                result: Err(rej.error),
                            },
                            IoTiming {
                                enqueued: w.enqueued,
                                submitted: now,
                                reaped: now,
                            },
                        ));
                    }
                }
            }
            if pushed > 0 || dev.queue.queued() > 0 {
                if let Err(e) = dev.queue.submit() {
                    // The ring itself failed (not a busy or interrupted
                    // call, which return 0). The requests stay in its
                    // submission queue and are tried again next round; the
                    // error is kept for the statistics.
                    self.submit_errors += 1;
                    self.last_submit_error = Some(e);
                }
            }
            total += pushed;
        }
        total
    }

    /// Reaps every device's completions into `out`, restoring user tags.
    pub(crate) fn reap_all(&mut self, out: &mut Vec<(Completion, IoTiming)>) -> usize {
        let before = out.len();
        out.append(&mut self.rejected);
        // Read the clock only once something completed.
        let mut now = None;
        for (d, dev) in self.devices.iter_mut().enumerate() {
            self.scratch.clear();
            dev.queue.reap(&mut self.scratch);
            for mut c in self.scratch.drain(..) {
                let now = *now.get_or_insert_with(Instant::now);
                let slot = c.tag as usize;
                let Some(meta) = dev.meta.get_mut(slot).and_then(Option::take) else {
                    debug_assert!(false, "completion for unknown slot {slot}");
                    continue;
                };
                dev.free_meta.push(slot as u32);
                self.budgets.release(d);
                c.tag = meta.tag;
                out.push((
                    c,
                    IoTiming {
                        enqueued: meta.enqueued,
                        submitted: meta.submitted,
                        reaped: now,
                    },
                ));
            }
        }
        out.len() - before
    }

    /// Requests submitted and not yet reaped, on all devices.
    pub(crate) fn in_flight(&self) -> usize {
        self.devices.iter().map(|d| d.queue.in_flight()).sum()
    }

    /// Requests waiting in the engine (for budget or queue space).
    pub(crate) fn waiting(&self) -> usize {
        self.devices.iter().map(|d| d.waiting.len()).sum::<usize>() + self.rejected.len()
    }

    /// Registers the worker's eventfd with every queue.
    pub(crate) fn attach_eventfd(&mut self, fd: std::os::fd::RawFd) -> crate::Result<()> {
        for d in &mut self.devices {
            d.queue.attach_eventfd(fd)?;
        }
        Ok(())
    }

    /// Turns completion notification on or off on every queue.
    pub(crate) fn set_notify(&mut self, on: bool) {
        for d in &mut self.devices {
            d.queue.set_notify(on);
        }
    }

    /// The soonest moment a queue knows a completion will be ready.
    pub(crate) fn ready_in(&self) -> Option<Duration> {
        self.devices
            .iter()
            .filter(|d| d.queue.in_flight() + d.queue.queued() > 0)
            .filter_map(|d| d.queue.ready_in())
            .min()
    }

    /// Registers long-lived memory (frames) with every queue.
    pub(crate) fn register_memory(
        &mut self,
        region: &std::sync::Arc<crate::io::AlignedBuf>,
    ) -> crate::Result<bool> {
        let mut all = true;
        for d in &mut self.devices {
            all &= d.queue.register_memory(region)?;
        }
        Ok(all)
    }
}
