//! A worker's I/O: its queue to every device, requests waiting for the
//! device's in-flight budget, and the hand-off of completions.
//!
//! Owns: the thread-local `WorkerIo` of each worker and the
//! [`DeviceBudgets`] shared by all workers. Tasks call [`enqueue`]; the
//! worker loop calls `submit_all` (one batch per device) and `reap_all`.
//!
//! The budget: each device has a limit of requests in flight across all
//! workers ([`DeviceBudgets`]), fixed or adapted to the device while the
//! engine runs (`sched/depth.rs`), and shared by the workers that have
//! requests for it. Beyond its share a worker's requests wait here, in the
//! engine, reads and the log's requests before page write-backs, and the
//! time they waited is recorded. Piling more requests on a device than it
//! serves best only adds latency; too few leave throughput unused, and
//! where the best depth lies drifts (this machine's disk has peaked at
//! depth 16-32 on some days and 64-256 on others: docs/PERF.md).
//!
//! Never: blocks, or holds the thread-local borrow while calling a
//! completion handler or polling a task.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::depth::{DepthControl, Epoch, Reason};
use super::route::RequestKind;
use super::RuntimeConfig;
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

/// Length of an epoch of the adaptive law (longer on a slow device: at
/// least [`EPOCH_COMPLETIONS`] completions, at most [`EPOCH_MAX`]).
const EPOCH: Duration = Duration::from_millis(50);
/// Fewest completions an epoch measures (a slow device's epoch lasts
/// longer, up to [`EPOCH_MAX`]).
const EPOCH_COMPLETIONS: u64 = 256;
/// Longest epoch.
const EPOCH_MAX: Duration = Duration::from_secs(1);
/// How soon a worker retries a submission the kernel refused for the
/// moment (EAGAIN, EBUSY, EINTR) when nothing else would wake it.
const SUBMIT_RETRY: Duration = Duration::from_millis(1);
/// Changes of limit kept for reports (the oldest are dropped).
const HISTORY: usize = 4096;

/// One change of a device's in-flight limit (adaptive budgets only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitChange {
    /// Time since the runtime started.
    pub at: Duration,
    /// The device.
    pub device: usize,
    /// The limit from then on.
    pub limit: usize,
    /// Why.
    pub reason: Reason,
    /// Completions per second in the epoch that decided it.
    pub throughput: f64,
}

/// One device's budget: the limit, the requests in flight under it, and
/// the epoch being measured for the adaptive law.
struct DeviceBudget {
    in_flight: AtomicUsize,
    limit: AtomicUsize,
    /// Bit `w % 64` set while worker `w` has requests waiting or in flight
    /// on this device.
    demand: AtomicU64,
    completions: AtomicU64,
    latency_ns: AtomicU64,
    deferred: AtomicU64,
    /// Start of the epoch, nanoseconds since the runtime started.
    epoch_start: AtomicU64,
    control: Option<Mutex<DepthControl>>,
}

/// In-flight limits per device, shared by all workers.
///
/// Each device has a limit of requests in flight across all workers: fixed
/// ([`RuntimeConfig::adaptive_budget`] off) or chosen and tracked while the
/// engine runs by `DepthControl` (`sched/depth.rs`), from one request per
/// worker (each worker is always granted one: a lower limit would not
/// change the depth, so its trials would measure nothing and could hold
/// the limit there) to the workers' queue capacity. Every request counts:
/// page reads, background page writes, the log's writes and syncs. The limit is shared by demand:
/// each worker with requests for the device gets an equal share of it, and
/// a worker alone may fill the device. Below its *floor* (its equal part
/// of the limit among all workers) a worker's request is always granted,
/// even when another worker borrowed the rest: so no worker ever waits on
/// another's completions (it would sleep with nothing of its own in
/// flight to wake it; and a free-for-all pool starved one worker while
/// the other refilled: p99 engine queueing of 31 ms in `dana bench
/// lookup`). The cost: for about one device latency after a worker's
/// demand appears, the device can hold up to twice its limit.
pub struct DeviceBudgets {
    devices: Vec<DeviceBudget>,
    /// Hand each request to the kernel as soon as it is queued (one
    /// `io_uring_enter` per request) instead of one per device per round.
    submit_each: bool,
    workers: usize,
    started: Instant,
    history: Mutex<VecDeque<LimitChange>>,
    /// How long requests waited in the engine for the budget.
    pub queue_wait: Histogram,
}

impl DeviceBudgets {
    pub(crate) fn new(devices: usize, config: &RuntimeConfig) -> DeviceBudgets {
        let initial = config.device_budget.max(1);
        let max = (config.queue_depth as usize * config.workers.max(1)).max(initial);
        DeviceBudgets {
            submit_each: config.submit_each,
            devices: (0..devices)
                .map(|_| {
                    let control = config
                        .adaptive_budget
                        .then(|| DepthControl::new(initial, config.workers.max(1), max));
                    DeviceBudget {
                        in_flight: AtomicUsize::new(0),
                        limit: AtomicUsize::new(control.as_ref().map_or(initial, |c| c.limit())),
                        demand: AtomicU64::new(0),
                        completions: AtomicU64::new(0),
                        latency_ns: AtomicU64::new(0),
                        deferred: AtomicU64::new(0),
                        epoch_start: AtomicU64::new(0),
                        control: control.map(Mutex::new),
                    }
                })
                .collect(),
            workers: config.workers.max(1),
            started: Instant::now(),
            history: Mutex::new(VecDeque::new()),
            queue_wait: Histogram::default(),
        }
    }

    /// Takes one unit of `device`'s budget for a worker that has `mine`
    /// requests on it: always granted below the worker's floor (its equal
    /// part of the limit), else only while the device is under its limit.
    fn try_acquire(&self, device: usize, mine: usize) -> bool {
        let b = &self.devices[device];
        let limit = b.limit.load(Ordering::Relaxed);
        if mine < self.floor(limit) {
            b.in_flight.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        let mut cur = b.in_flight.load(Ordering::Relaxed);
        loop {
            if cur >= limit {
                return false;
            }
            match b.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// A worker's guaranteed part of a limit.
    fn floor(&self, limit: usize) -> usize {
        (limit / self.workers).max(1)
    }

    fn release(&self, device: usize) {
        let prev = self.devices[device]
            .in_flight
            .fetch_sub(1, Ordering::AcqRel);
        // Control-plane invariant, checked in release builds too: a release
        // without an acquire would let the budget grow past its limit.
        assert!(
            prev > 0,
            "device {device}: budget released more often than acquired"
        );
    }

    /// Marks whether worker `worker` has requests for `device`.
    fn set_demand(&self, device: usize, worker: usize, on: bool) {
        let bit = 1u64 << (worker % 64);
        let d = &self.devices[device].demand;
        if on {
            d.fetch_or(bit, Ordering::AcqRel);
        } else {
            d.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Adds a worker's measurements of one round to the device's epoch and
    /// ends the epoch when it is long enough.
    fn account(
        &self,
        device: usize,
        completions: u64,
        latency: Duration,
        deferred: u64,
        now: Instant,
    ) {
        let b = &self.devices[device];
        let Some(control) = &b.control else {
            return;
        };
        if completions > 0 {
            b.completions.fetch_add(completions, Ordering::Relaxed);
            b.latency_ns
                .fetch_add(latency.as_nanos() as u64, Ordering::Relaxed);
        }
        if deferred > 0 {
            b.deferred.fetch_add(deferred, Ordering::Relaxed);
        }
        let now_ns = now.saturating_duration_since(self.started).as_nanos() as u64;
        let start = b.epoch_start.load(Ordering::Relaxed);
        let elapsed = Duration::from_nanos(now_ns.saturating_sub(start));
        if elapsed < EPOCH
            || (elapsed < EPOCH_MAX && b.completions.load(Ordering::Relaxed) < EPOCH_COMPLETIONS)
        {
            return;
        }
        // One worker ends the epoch; the others go on.
        let Ok(mut control) = control.try_lock() else {
            return;
        };
        if b.epoch_start.load(Ordering::Relaxed) != start {
            return;
        }
        let epoch = Epoch {
            completions: b.completions.swap(0, Ordering::Relaxed),
            latency_sum: b.latency_ns.swap(0, Ordering::Relaxed) as f64 * 1e-9,
            seconds: elapsed.as_secs_f64(),
            deferred: b.deferred.swap(0, Ordering::Relaxed),
        };
        b.epoch_start.store(now_ns, Ordering::Relaxed);
        if elapsed > EPOCH_MAX * 2 {
            // Nothing came to end the epoch for longer than any epoch
            // lasts: the device sat idle (or the runtime just started),
            // and a throughput over that gap says nothing about its depth.
            // Dropped; the next epoch starts now.
            return;
        }
        if let Some((limit, reason)) = control.observe(&epoch) {
            b.limit.store(limit, Ordering::Relaxed);
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            if h.len() == HISTORY {
                h.pop_front();
            }
            h.push_back(LimitChange {
                at: Duration::from_nanos(now_ns),
                device,
                limit,
                reason,
                throughput: epoch.throughput(),
            });
        }
    }

    /// Requests in flight on `device` across all workers.
    pub fn in_flight(&self, device: usize) -> usize {
        self.devices[device].in_flight.load(Ordering::Relaxed)
    }

    /// The limit of requests in flight on `device` now.
    pub fn limit(&self, device: usize) -> usize {
        self.devices[device].limit.load(Ordering::Relaxed)
    }

    /// The limit of every device now.
    pub fn limits(&self) -> Vec<usize> {
        (0..self.devices.len()).map(|d| self.limit(d)).collect()
    }

    /// Whether the limits adapt to the devices (else they stay fixed).
    pub fn is_adaptive(&self) -> bool {
        self.devices.iter().any(|b| b.control.is_some())
    }

    /// Each worker's share of `device`'s limit now: the limit split equally
    /// among the workers with requests for it.
    pub fn share(&self, device: usize) -> usize {
        let b = &self.devices[device];
        let workers = b.demand.load(Ordering::Relaxed).count_ones().max(1) as usize;
        let limit = b.limit.load(Ordering::Relaxed);
        limit.div_ceil(workers).max(self.floor(limit))
    }

    /// Time since the runtime started, on the clock of
    /// [`LimitChange::at`].
    pub fn clock(&self) -> Duration {
        self.started.elapsed()
    }

    /// The changes of limit so far (the last 4,096), oldest first.
    pub fn changes(&self) -> Vec<LimitChange> {
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        h.iter().copied().collect()
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
    background: bool,
}

/// One device's queue and the bookkeeping around it.
struct DeviceIo {
    queue: Box<dyn IoQueue>,
    /// Requests a task waits for: page reads, the log's writes and syncs,
    /// awaited requests. Served first.
    urgent: VecDeque<Waiting>,
    /// Page write-backs: served after the urgent ones, but always with up
    /// to a quarter of the worker's share when they wait (eviction needs
    /// them to free frames for the reads); with a share of one, every
    /// other pick while both wait.
    background: VecDeque<Waiting>,
    background_in_flight: usize,
    /// Whether the last request picked was a write-back.
    last_background: bool,
    /// Whether this worker's demand bit is set for the device.
    demand: bool,
    meta: Vec<Option<Meta>>,
    free_meta: Vec<u32>,
}

impl DeviceIo {
    fn new(queue: Box<dyn IoQueue>) -> DeviceIo {
        let cap = queue.capacity();
        DeviceIo {
            queue,
            urgent: VecDeque::new(),
            background: VecDeque::new(),
            background_in_flight: 0,
            last_background: false,
            demand: false,
            meta: vec![None; cap],
            free_meta: (0..cap as u32).rev().collect(),
        }
    }

    fn waiting(&self) -> usize {
        self.urgent.len() + self.background.len()
    }

    /// The next request to submit, reads first (see `background`), given
    /// the worker's share of the device.
    fn next(&mut self, share: usize) -> Option<(Waiting, bool)> {
        // A share of one slot would go to the write-backs every time it
        // frees (none in flight then): reads and log writes would wait for
        // the whole write-back queue. There the two take turns.
        let background_due =
            self.background_in_flight < (share / 4).max(1) && (share > 1 || !self.last_background);
        let picked = if !self.background.is_empty() && (self.urgent.is_empty() || background_due) {
            self.background.pop_front().map(|w| (w, true))
        } else {
            self.urgent.pop_front().map(|w| (w, false))
        };
        if let Some((_, background)) = &picked {
            self.last_background = *background;
        }
        picked
    }

    fn put_back(&mut self, w: Waiting, background: bool) {
        if background {
            self.background.push_front(w);
        } else {
            self.urgent.push_front(w);
        }
    }
}

/// The I/O state of one worker thread.
pub(crate) struct WorkerIo {
    index: usize,
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
            let background = RequestKind::of(req.tag) == Some(RequestKind::PageWrite);
            let dev = &mut w.devices[device];
            let waiting = Waiting {
                req,
                enqueued: Instant::now(),
            };
            if background {
                dev.background.push_back(waiting);
            } else {
                dev.urgent.push_back(waiting);
            }
            Ok(())
        }
        _ => Err(req),
    })
}

/// The in-flight limits of devices `devices` summed, as they stand now
/// (they adapt: [`DeviceBudgets`]); None off a worker thread.
pub fn device_limits_total(devices: std::ops::Range<usize>) -> Option<usize> {
    IO.with(|io| {
        io.borrow().as_ref().map(|w| {
            devices
                .filter(|&d| d < w.devices.len())
                .map(|d| w.budgets.limit(d))
                .sum()
        })
    })
}

/// True on a worker thread (where [`enqueue`] works).
pub fn on_worker() -> bool {
    IO.with(|io| io.borrow().is_some())
}

impl WorkerIo {
    pub(crate) fn new(
        index: usize,
        queues: Vec<Box<dyn IoQueue>>,
        budgets: std::sync::Arc<DeviceBudgets>,
    ) -> WorkerIo {
        WorkerIo {
            index,
            devices: queues.into_iter().map(DeviceIo::new).collect(),
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
    /// queue capacity allow, reads first, then submits each device's batch
    /// with one call.
    pub(crate) fn submit_all(&mut self) -> usize {
        let mut total = 0;
        // Read the clock only when something waits (a worker's loop calls
        // this every round, mostly with nothing to do).
        if self
            .devices
            .iter()
            .all(|d| d.waiting() == 0 && d.queue.unsent() == 0)
        {
            return 0;
        }
        let now = Instant::now();
        for (d, dev) in self.devices.iter_mut().enumerate() {
            let mut pushed = 0;
            if dev.waiting() > 0 && !dev.demand {
                dev.demand = true;
                self.budgets.set_demand(d, self.index, true);
            }
            let share = self.budgets.share(d);
            while dev.waiting() > 0
                && !dev.free_meta.is_empty()
                && dev.queue.in_flight() + dev.queue.queued() < share
            {
                if !self
                    .budgets
                    .try_acquire(d, dev.queue.in_flight() + dev.queue.queued())
                {
                    break;
                }
                let Some((w, background)) = dev.next(share) else {
                    self.budgets.release(d);
                    break;
                };
                let Some(slot) = dev.free_meta.pop() else {
                    dev.put_back(w, background);
                    self.budgets.release(d);
                    break;
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
                            background,
                        });
                        dev.background_in_flight += usize::from(background);
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
            if dev.waiting() > 0 {
                // Left waiting: the budget (or the queue) bound this round.
                self.budgets.account(d, 0, Duration::ZERO, 1, now);
            }
            if pushed > 0 || dev.queue.unsent() > 0 {
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

    /// Reaps every device's completions into `out`, restoring user tags,
    /// and feeds each device's latencies to its adaptive budget.
    pub(crate) fn reap_all(&mut self, out: &mut Vec<(Completion, IoTiming)>) -> usize {
        let before = out.len();
        out.append(&mut self.rejected);
        // Read the clock only once something completed.
        let mut now = None;
        for (d, dev) in self.devices.iter_mut().enumerate() {
            self.scratch.clear();
            dev.queue.reap(&mut self.scratch);
            let (mut done, mut latency) = (0u64, Duration::ZERO);
            for mut c in self.scratch.drain(..) {
                let now = *now.get_or_insert_with(Instant::now);
                let slot = c.tag as usize;
                let Some(meta) = dev.meta.get_mut(slot).and_then(Option::take) else {
                    debug_assert!(false, "completion for unknown slot {slot}");
                    continue;
                };
                dev.free_meta.push(slot as u32);
                dev.background_in_flight -= usize::from(meta.background);
                self.budgets.release(d);
                done += 1;
                latency += now.saturating_duration_since(meta.submitted);
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
            if let Some(now) = now.filter(|_| done > 0) {
                self.budgets.account(d, done, latency, 0, now);
            }
            if dev.demand && dev.waiting() == 0 && dev.queue.in_flight() + dev.queue.queued() == 0 {
                dev.demand = false;
                self.budgets.set_demand(d, self.index, false);
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
        self.devices.iter().map(DeviceIo::waiting).sum::<usize>() + self.rejected.len()
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
        if self.devices.iter().any(|d| d.queue.unsent() > 0) {
            // A submission the kernel refused for now (busy, interrupted):
            // nothing will signal the eventfd for it, so retry soon.
            return Some(SUBMIT_RETRY);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::{SimConfig, SimDisk};
    use crate::io::{AlignedBuf, IoBuf};
    use crate::sched::TAG_ID_MASK;

    fn waiting(kind: RequestKind, id: u64) -> Waiting {
        let buf = IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
        Waiting {
            req: Request::read(kind.tag(id), 0, buf),
            enqueued: Instant::now(),
        }
    }

    /// A queue whose first `refusals` submits send nothing (a ring that
    /// answered EAGAIN, EBUSY or EINTR), keeping the requests queued.
    struct Balky {
        inner: Box<dyn IoQueue>,
        refusals: usize,
    }

    impl IoQueue for Balky {
        fn device(&self) -> usize {
            self.inner.device()
        }
        fn backend(&self) -> &'static str {
            "balky"
        }
        fn capacity(&self) -> usize {
            self.inner.capacity()
        }
        fn push(&mut self, req: Request) -> std::result::Result<(), crate::io::Rejected> {
            self.inner.push(req)
        }
        fn submit(&mut self) -> crate::Result<usize> {
            if self.refusals > 0 {
                self.refusals -= 1;
                return Ok(0);
            }
            self.inner.submit()
        }
        fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
            self.inner.reap(out)
        }
        fn wait(&mut self, min: usize, timeout: Option<Duration>) -> crate::Result<()> {
            self.inner.wait(min, timeout)
        }
        fn queued(&self) -> usize {
            self.inner.queued()
        }
        fn in_flight(&self) -> usize {
            self.inner.in_flight()
        }
        fn ready_in(&self) -> Option<Duration> {
            self.inner.ready_in()
        }
    }

    /// A submission the device refused for the moment stays queued, the
    /// worker is told to come back soon (nothing else would wake it), and
    /// the next round sends it.
    #[test]
    fn a_refused_submission_is_retried_soon() {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let budgets = std::sync::Arc::new(DeviceBudgets::new(1, &RuntimeConfig::default()));
        let queue = Balky {
            inner: Box::new(disk.queue(64)),
            refusals: 2,
        };
        let mut w = WorkerIo::new(0, vec![Box::new(queue)], budgets);
        w.devices[0]
            .urgent
            .push_back(waiting(RequestKind::PageRead, 7));
        let mut out = Vec::new();
        for round in 0..2 {
            w.submit_all();
            assert_eq!(w.devices[0].queue.unsent(), 1, "round {round}");
            assert_eq!(w.ready_in(), Some(SUBMIT_RETRY), "round {round}");
            assert_eq!(w.reap_all(&mut out), 0);
        }
        w.submit_all();
        assert_eq!(w.devices[0].queue.unsent(), 0);
        for _ in 0..1000 {
            if w.reap_all(&mut out) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.tag & TAG_ID_MASK, 7);
        assert!(out[0].0.result.is_ok());
    }

    /// A device with write-backs 0..4 and reads 10..14 waiting.
    fn writes_and_reads_waiting() -> DeviceIo {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let mut dev = DeviceIo::new(Box::new(disk.queue(64)));
        for i in 0..4 {
            dev.background.push_back(waiting(RequestKind::PageWrite, i));
        }
        for i in 0..4 {
            dev.urgent.push_back(waiting(RequestKind::PageRead, 10 + i));
        }
        dev
    }

    /// Reads go before write-backs, except that write-backs always have
    /// up to a quarter of the share in flight when they wait.
    #[test]
    fn reads_first_and_write_backs_keep_a_quarter_of_the_share() {
        let mut dev = writes_and_reads_waiting();
        let share = 8; // a quarter: 2 write-backs
        let mut order = Vec::new();
        while let Some((w, background)) = dev.next(share) {
            dev.background_in_flight += usize::from(background);
            order.push(w.req.tag & TAG_ID_MASK);
        }
        // Two write-backs take their quarter, the reads go, then the rest
        // of the write-backs (nothing else waits).
        assert_eq!(order, [0, 1, 10, 11, 12, 13, 2, 3]);
        assert_eq!(dev.waiting(), 0);
    }

    /// With a share of one request, each pick completing before the next,
    /// write-backs and reads take turns: the write-backs never hold the
    /// one slot while reads wait.
    #[test]
    fn with_a_share_of_one_reads_and_write_backs_take_turns() {
        let mut dev = writes_and_reads_waiting();
        let mut order = Vec::new();
        while let Some((w, _)) = dev.next(1) {
            // Completed before the next pick: nothing in flight.
            order.push(w.req.tag & TAG_ID_MASK);
        }
        assert_eq!(order, [0, 10, 1, 11, 2, 12, 3, 13]);
    }

    /// An adaptive limit starts and stays at one request per worker or
    /// more (a worker is always granted one, so a lower limit changes
    /// nothing the law could measure), and an epoch that spans an idle
    /// gap longer than any epoch is dropped, not judged.
    #[test]
    fn an_adaptive_limit_keeps_one_request_per_worker_and_skips_idle_gaps() {
        let config = RuntimeConfig {
            workers: 2,
            device_budget: 1,
            adaptive_budget: true,
            ..RuntimeConfig::default()
        };
        let b = DeviceBudgets::new(1, &config);
        assert_eq!(b.limit(0), 2);
        // A short burst that waited for the budget, then 5 s of nothing.
        let t0 = b.started;
        b.account(
            0,
            10,
            Duration::from_micros(100),
            1,
            t0 + Duration::from_millis(10),
        );
        b.account(
            0,
            1,
            Duration::from_micros(100),
            0,
            t0 + Duration::from_secs(5),
        );
        assert_eq!(b.changes(), [], "an idle gap was judged as an epoch");
        // Busy epochs after it are judged: a device as fast at any depth
        // (all past its knee) draws trials and moves down, never below 2.
        let mut t = t0 + Duration::from_secs(5);
        for _ in 0..2_000 {
            t += EPOCH + Duration::from_millis(1);
            let limit = b.limit(0) as u32;
            b.account(0, 5_000, Duration::from_millis(51) * limit, 1, t);
            assert!(b.limit(0) >= 2, "limit {}", b.limit(0));
        }
        assert!(!b.changes().is_empty());
        assert_eq!(b.limit(0), 2);
    }
}
