//! The per-core scheduler: worker threads running thousands of user tasks
//! that yield instead of blocking, with the system tasks between them.
//!
//! Owns: the worker threads, their task slabs, ready queues, bounded
//! injector queues and eventfds, and each worker's I/O queues (one per
//! device, see [`io`]).
//!
//! A task's life: `spawn` puts the boxed future in a worker's injector
//! (blocking a calling thread while it is full: back-pressure, not
//! unbounded memory; a calling task gets `QueueFull` instead, since a
//! worker must not block) -> the worker admits it into its slab, queued -> polled; it
//! returns `Pending` when it needs a page that is not resident, a free
//! frame, or a latch someone else holds, after arranging to be woken
//! (waker registered with the in-flight read, the free-frame waiters, or a
//! plain yield) -> woken (from any thread) back into its worker's ready
//! queue -> polled again ... -> `Ready`: removed from the slab. A task never
//! moves to another worker.
//!
//! The worker loop: admit new tasks; run every ready task once; submit all
//! queued I/O in one batch per device; run the step of every system task
//! (eviction, log flush, checkpoint start; see `route`); reap
//! completions and hand each to the handler of its request kind, which
//! wakes exactly the tasks waiting for it. With nothing to run it
//! sleeps in the kernel on its eventfd, which io_uring, other workers and
//! spawners signal: an idle worker burns no CPU.
//!
//! Never: busy-polls while idle, blocks a worker thread on I/O, or polls a
//! task on another worker's thread.

mod depth;
pub mod io;
mod route;
mod task;
mod wait;

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

pub use depth::Reason as LimitReason;
pub use io::{device_limits_total, enqueue, on_worker, DeviceBudgets, IoTiming, LimitChange};
pub use route::{perform, CompletionHandler, RequestKind, Services, SystemTask, TAG_ID_MASK};
pub use wait::{IoWait, WaitFuture, WakerList};

use crate::io::{open_queue, Backend, EventFd, FrameMemory, Target};
use crate::{Error, Result};
use task::{
    Job, Slab, TaskKey, CURRENT_RUNTIME, CURRENT_WORKER, CURRENT_WORKER_SHARED, LOCAL_READY,
    LOCAL_SPAWNED,
};

/// Task polls between two looks at the completion queues.
const POLLS_BETWEEN_REAPS: usize = 8;

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Worker threads (one per core you give the engine).
    pub workers: usize,
    /// Capacity of each worker's queue to each device.
    pub queue_depth: u32,
    /// Most requests in flight per device across all workers: the fixed
    /// limit, or the adaptive limit's starting point.
    pub device_budget: usize,
    /// Adapt each device's limit while running (`sched/depth.rs`), from 1
    /// to `queue_depth * workers`, starting at `device_budget`.
    pub adaptive_budget: bool,
    /// Most live tasks per worker; more wait in the injector.
    pub max_tasks_per_worker: usize,
    /// Capacity of each worker's injector queue.
    pub injector_capacity: usize,
    /// Submit each request on its own (one syscall per I/O) instead of
    /// batching a round's requests per device. Costs CPU; on a virtio disk
    /// it lowers device latency under load (docs/PERF.md). Default off.
    pub submit_each: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 2,
            queue_depth: 128,
            // Where the adaptive limit starts: this machine's disk has
            // peaked at a total depth of 16-32 on some days and 64-256 on
            // others (docs/PERF.md), so the engine finds it while it runs.
            device_budget: 32,
            adaptive_budget: true,
            max_tasks_per_worker: 4096,
            injector_capacity: 4096,
            submit_each: false,
        }
    }
}

/// Counters of one worker.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Task polls.
    pub polls: AtomicU64,
    /// Tasks completed.
    pub tasks_done: AtomicU64,
    /// Times the worker went to sleep.
    pub sleeps: AtomicU64,
    /// Tasks that panicked (dropped; their callers see an error).
    pub panics: AtomicU64,
}

/// A job waiting in a worker's injector.
struct Injected {
    job: Job,
    /// Polled already on its caller's thread, where it may have taken
    /// what the worker's tasks wait for (a key's stripe, a latch): it
    /// must not wait for a task slot they hold (review 20's hang).
    started: bool,
}

/// The part of a worker other threads touch.
pub(crate) struct WorkerShared {
    pub(crate) index: usize,
    eventfd: EventFd,
    sleeping: AtomicBool,
    remote: Mutex<Vec<TaskKey>>,
    has_remote: AtomicBool,
    injector: Mutex<VecDeque<Injected>>,
    /// Set, under the injector's lock, when the worker stops with its
    /// injector empty: later pushes fail instead of queueing a job nobody
    /// will run (a `block_on` racing `stop` then waited for good).
    stopped: AtomicBool,
    injected: AtomicUsize,
    /// Of them, started jobs (at the front): a worker with no free slot
    /// looks at its injector only when one waits.
    started: AtomicUsize,
    not_full: Condvar,
    injector_capacity: usize,
    stats: WorkerStats,
}

impl WorkerShared {
    pub(crate) fn wake_remote(&self, key: TaskKey) {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(key);
        self.has_remote.store(true, Ordering::SeqCst);
        self.notify();
    }

    fn notify(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.eventfd.signal();
        }
    }

    fn push_job(&self, job: Job, shutdown: &AtomicBool, started: bool) -> Result<()> {
        let mut q = self.injector.lock().unwrap_or_else(|e| e.into_inner());
        if started {
            // Past the capacity and ahead of every new job: one per thread
            // blocked in `block_on_started`, so bounded by the caller's
            // threads, and it may hold what the tasks before it wait for.
            if self.stopped.load(Ordering::Acquire) {
                return Err(Error::Shutdown);
            }
            q.push_front(Injected { job, started });
            self.started.fetch_add(1, Ordering::SeqCst);
            self.injected.fetch_add(1, Ordering::SeqCst);
            drop(q);
            self.notify();
            return Ok(());
        }
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return Err(Error::Shutdown);
            }
            if q.len() < self.injector_capacity {
                break;
            }
            if shutdown.load(Ordering::Acquire) {
                return Err(Error::Shutdown);
            }
            if CURRENT_WORKER.with(|c| c.get()).is_some() {
                // A worker must not block: waiting here for its own
                // injector (or for one whose worker waits for it) never
                // ends. The task yields and tries again.
                return Err(Error::QueueFull {
                    worker: self.index,
                    capacity: self.injector_capacity,
                });
            }
            q = self
                .not_full
                .wait_timeout(q, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        q.push_back(Injected { job, started });
        self.injected.fetch_add(1, Ordering::SeqCst);
        drop(q);
        self.notify();
        Ok(())
    }

    /// Marks the worker stopped if its injector is empty (under its lock:
    /// no push can slip in between). False if a job came in meanwhile.
    fn stop_if_idle(&self) -> bool {
        let q = self.injector.lock().unwrap_or_else(|e| e.into_inner());
        if !q.is_empty() {
            return false;
        }
        self.stopped.store(true, Ordering::Release);
        true
    }

    /// The next job; with `full` (the worker has no free task slot), only
    /// a started one (`Runtime::block_on_started`).
    fn pop_job(&self, full: bool) -> Option<Job> {
        let waiting = if full { &self.started } else { &self.injected };
        if waiting.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut q = self.injector.lock().unwrap_or_else(|e| e.into_inner());
        if full && !q.front().is_some_and(|j| j.started) {
            return None;
        }
        let job = q.pop_front()?;
        if job.started {
            self.started.fetch_sub(1, Ordering::AcqRel);
        }
        self.injected.fetch_sub(1, Ordering::AcqRel);
        self.not_full.notify_one();
        Some(job.job)
    }

    fn take_remote(&self, into: &mut Vec<TaskKey>) {
        if !self.has_remote.swap(false, Ordering::SeqCst) {
            return;
        }
        into.append(&mut self.remote.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn has_work(&self) -> bool {
        self.injected.load(Ordering::SeqCst) > 0 || self.has_remote.load(Ordering::SeqCst)
    }
}

struct RuntimeShared {
    workers: Vec<Arc<WorkerShared>>,
    next: AtomicUsize,
    shutdown: AtomicBool,
    budgets: Arc<DeviceBudgets>,
    max_tasks: usize,
}

/// The running scheduler.
pub struct Runtime {
    shared: Arc<RuntimeShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Runtime {
    /// Starts `config.workers` threads, each with one queue per target
    /// (an array's devices, then the log's) over `backend`. `frames`, if given, is registered with every
    /// queue (io_uring fixed buffers). Completions go to the handler of
    /// their kind in `services`, whose system tasks every worker runs.
    pub fn start(
        config: &RuntimeConfig,
        targets: &[Target],
        backend: &Backend,
        services: Services,
        frames: Option<&FrameMemory>,
    ) -> Result<Runtime> {
        if config.workers == 0 {
            return Err(Error::InvalidArgument(
                "at least one worker is needed".into(),
            ));
        }
        if let Backend::Uring(o) = backend {
            if o.iopoll {
                return Err(Error::Unsupported(
                    "the engine's workers sleep on completion interrupts; IOPOLL is available \
                     to the raw I/O benchmarks only"
                        .into(),
                ));
            }
        }
        let budgets = Arc::new(DeviceBudgets::new(targets.len(), config));
        let mut workers = Vec::new();
        let mut ios = Vec::new();
        for index in 0..config.workers {
            let eventfd = EventFd::new()?;
            let queues = targets
                .iter()
                .map(|t| open_queue(t, backend, config.queue_depth))
                .collect::<Result<Vec<_>>>()?;
            let mut wio = io::WorkerIo::new(index, queues, budgets.clone());
            wio.attach_eventfd(eventfd.raw())?;
            if let Some(f) = frames {
                wio.register_memory(f.region())?;
            }
            ios.push(wio);
            workers.push(Arc::new(WorkerShared {
                index,
                eventfd,
                sleeping: AtomicBool::new(false),
                remote: Mutex::new(Vec::new()),
                has_remote: AtomicBool::new(false),
                injector: Mutex::new(VecDeque::new()),
                stopped: AtomicBool::new(false),
                injected: AtomicUsize::new(0),
                started: AtomicUsize::new(0),
                not_full: Condvar::new(),
                injector_capacity: config.injector_capacity.max(1),
                stats: WorkerStats::default(),
            }));
        }
        let shared = Arc::new(RuntimeShared {
            workers,
            next: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            budgets,
            max_tasks: config.max_tasks_per_worker.max(1),
        });
        let services = Arc::new(services);
        let mut threads = Vec::new();
        for (index, wio) in ios.into_iter().enumerate() {
            let shared = shared.clone();
            let services = services.clone();
            let t = std::thread::Builder::new()
                .name(format!("dana-worker-{index}"))
                .spawn(move || worker_main(index, shared, wio, services))
                .map_err(|source| Error::Backend {
                    backend: "sched",
                    what: "starting a worker thread".into(),
                    source,
                })?;
            threads.push(t);
        }
        Ok(Runtime {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// This runtime's identity (what [`current_runtime`] returns on its
    /// workers).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.shared.workers.len()
    }

    /// The per-device in-flight budgets (and the engine-queue wait times).
    pub fn budgets(&self) -> &DeviceBudgets {
        &self.shared.budgets
    }

    /// Counters of worker `i`.
    pub fn worker_stats(&self, i: usize) -> &WorkerStats {
        &self.shared.workers[i].stats
    }

    /// Runs `future` as a task on the next worker (round robin). Blocks
    /// while that worker's injector is full; called from a task (on a
    /// worker), fails with [`Error::QueueFull`] instead.
    pub fn spawn<F>(&self, future: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let w = self.shared.next.fetch_add(1, Ordering::Relaxed) % self.shared.workers.len();
        self.spawn_on(w, future)
    }

    /// Runs `future` as a task on worker `worker` (blocking, or
    /// [`Error::QueueFull`] from a task, as [`Runtime::spawn`]).
    pub fn spawn_on<F>(&self, worker: usize, future: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.push_on(worker, Box::pin(future), false)
    }

    /// Queues `job` on worker `worker` (`started`: see
    /// [`Runtime::block_on_started`]).
    fn push_on(&self, worker: usize, job: Job, started: bool) -> Result<()> {
        if self.shared.shutdown.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        let w = self
            .shared
            .workers
            .get(worker)
            .ok_or_else(|| Error::InvalidArgument(format!("no worker {worker}")))?;
        w.push_job(job, &self.shared.shutdown, started)
    }

    /// The worker that [`Runtime::block_on`] runs the calling thread's
    /// futures on: each thread gets one on its first call (threads are
    /// spread round robin) and keeps it, so that one thread's commits go
    /// through one worker's log, in order.
    pub fn home_worker(&self) -> usize {
        static NEXT_HOME: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        thread_local! {
            static HOME: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
        }
        let home = HOME.with(|h| match h.get() {
            Some(home) => home,
            None => {
                let home = NEXT_HOME.fetch_add(1, Ordering::Relaxed);
                h.set(Some(home));
                home
            }
        });
        home % self.shared.workers.len()
    }

    /// Runs `future` on the calling thread's home worker
    /// ([`Runtime::home_worker`]) and waits for its output. Must not be
    /// called from a worker thread (it would block the worker).
    pub fn block_on<T, F>(&self, future: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.block_on_in(future, false)
    }

    /// [`Runtime::block_on`] for a future already polled on the calling
    /// thread and pending: it may hold what tasks wait for (a key's
    /// stripe, a page latch, the structure guard), so the worker admits it
    /// at once, ahead of new tasks and past `max_tasks_per_worker`. Queued
    /// behind tasks that filled every slot waiting for it, it never ran
    /// (review 20).
    pub(crate) fn block_on_started<T, F>(&self, future: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.block_on_in(future, true)
    }

    fn block_on_in<T, F>(&self, future: F, started: bool) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        if CURRENT_WORKER.with(|c| c.get()).is_some() {
            return Err(Error::InvalidArgument(
                "a blocking call inside a task would block its worker (`Db::block_on`, or a \
                 call without `_async`: `Tree::get`, `Tree::scan`, `Iter::next`, ...): use the \
                 `_async` form, or call it from a thread of its own"
                    .into(),
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // A panic in the future goes on in the caller, as in a call that
        // ran on its thread: it was the worker's to catch, and the caller
        // got `Error::Shutdown`, which says the engine is stopping (an
        // outside probe).
        let mut future = Box::pin(future);
        let caught = std::future::poll_fn(move |cx| {
            match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
                Err(payload) => Poll::Ready(Err(payload)),
            }
        });
        let job = async move {
            let _ = tx.send(caught.await);
        };
        self.push_on(self.home_worker(), Box::pin(job), started)?;
        match rx.recv() {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            Err(_) => Err(Error::Shutdown),
        }
    }

    /// Stops the workers once their tasks have finished, and waits.
    pub fn shutdown(self) {
        self.stop();
    }

    /// Stops the workers once their tasks have finished, and waits (from
    /// any thread but a worker; later calls return at once). Every later
    /// spawn fails with [`Error::Shutdown`].
    pub fn stop(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for w in &self.shared.workers {
            w.eventfd.signal();
        }
        if CURRENT_WORKER.with(|c| c.get()).is_some() {
            return;
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    /// Takes the worker threads' handles, for a caller on a worker that
    /// must have another thread wait for them after [`Runtime::stop`]
    /// (which cannot wait there: its own worker is among them). Later
    /// stops find none to wait for.
    pub(crate) fn take_threads(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Gives other tasks a turn: returns `Pending` once after waking itself.
pub fn yield_now() -> impl Future<Output = ()> {
    struct YieldNow(bool);
    impl Future for YieldNow {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
    YieldNow(false)
}

/// Runs `future` as a task on the current worker, admitted at the start
/// of its next loop round (for system steps that start long work, such as
/// a checkpoint; never blocks). Fails off a worker.
pub fn spawn_here<F>(future: F) -> Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    if CURRENT_WORKER.with(|c| c.get()).is_none() {
        return Err(Error::InvalidArgument(
            "spawn_here runs only on a worker".into(),
        ));
    }
    LOCAL_SPAWNED.with(|s| s.borrow_mut().push(Box::pin(future)));
    Ok(())
}

/// Index of the worker running the current thread, if any.
pub fn current_worker() -> Option<usize> {
    CURRENT_WORKER.with(|c| c.get())
}

/// The identity ([`Runtime::id`]) of the runtime whose worker runs the
/// current thread, if any.
pub fn current_runtime() -> Option<usize> {
    Some(CURRENT_RUNTIME.with(|c| c.get())).filter(|&r| r != 0)
}

fn worker_main(index: usize, rt: Arc<RuntimeShared>, wio: io::WorkerIo, services: Arc<Services>) {
    let me = rt.workers[index].clone();
    CURRENT_WORKER.with(|c| c.set(Some(index)));
    CURRENT_RUNTIME.with(|c| c.set(Arc::as_ptr(&rt) as usize));
    CURRENT_WORKER_SHARED.with(|c| c.set(Arc::as_ptr(&me) as usize));
    wio.install();
    let mut slab = Slab::new();
    let mut completions = Vec::new();
    let mut remote = Vec::new();
    loop {
        let mut progress = false;

        // Tasks the system steps started (bounded by them: one checkpoint
        // at a time), then new tasks while there is room.
        LOCAL_SPAWNED.with(|s| {
            for job in s.borrow_mut().drain(..) {
                let key = slab.insert(&me, job);
                LOCAL_READY.with(|r| r.borrow_mut().push_back(key));
            }
        });
        // A started job (`block_on_started`) is admitted past the limit.
        while let Some(job) = me.pop_job(slab.live() >= rt.max_tasks) {
            let key = slab.insert(&me, job);
            LOCAL_READY.with(|r| r.borrow_mut().push_back(key));
        }
        me.take_remote(&mut remote);
        if !remote.is_empty() {
            LOCAL_READY.with(|r| r.borrow_mut().extend(remote.drain(..)));
        }

        // Run each ready task once; every few polls, reap completions and
        // refill the device queues, so that a read that finished is not
        // left waiting behind a long round of tasks.
        let ready = LOCAL_READY.with(|r| r.borrow().len());
        for n in 0..ready {
            if n > 0 && n % POLLS_BETWEEN_REAPS == 0 {
                io::WorkerIo::with(|w| {
                    w.submit_all();
                    w.reap_all(&mut completions)
                });
                for (c, t) in completions.drain(..) {
                    services.complete(c, t);
                }
            }
            let Some(key) = LOCAL_READY.with(|r| r.borrow_mut().pop_front()) else {
                break;
            };
            let Some(task) = slab.get_mut(key) else {
                continue;
            };
            progress = true;
            task.cell.queued.store(false, Ordering::Release);
            let waker = task.waker.clone();
            let mut cx = Context::from_waker(&waker);
            me.stats.polls.fetch_add(1, Ordering::Relaxed);
            let res =
                std::panic::catch_unwind(AssertUnwindSafe(|| task.future.as_mut().poll(&mut cx)));
            match res {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) => {
                    me.stats.tasks_done.fetch_add(1, Ordering::Relaxed);
                    slab.remove(key);
                }
                Err(_) => {
                    me.stats.panics.fetch_add(1, Ordering::Relaxed);
                    slab.remove(key);
                }
            }
        }

        // System tasks (eviction, log flush, checkpoint start): submit,
        // step each, reap.
        io::WorkerIo::with(|w| w.submit_all());
        progress |= services.step_all();
        io::WorkerIo::with(|w| w.submit_all());
        io::WorkerIo::with(|w| w.reap_all(&mut completions));
        if !completions.is_empty() {
            progress = true;
            for (c, t) in completions.drain(..) {
                services.complete(c, t);
            }
            // The completions freed budget: send requests already waiting
            // in the engine now, not after the woken tasks have run.
            io::WorkerIo::with(|w| w.submit_all());
        }
        if progress {
            continue;
        }

        let (in_flight, waiting) =
            io::WorkerIo::with(|w| (w.in_flight(), w.waiting())).unwrap_or((0, 0));
        if rt.shutdown.load(Ordering::Acquire)
            && slab.live() == 0
            && in_flight == 0
            && waiting == 0
            && !me.has_work()
            && LOCAL_SPAWNED.with(|s| s.borrow().is_empty())
            && me.stop_if_idle()
        {
            break;
        }

        // Sleep until a completion, a wake-up or new work. Announce the
        // sleep first, then look once more (Dekker-style with wakers).
        me.sleeping.store(true, Ordering::SeqCst);
        io::WorkerIo::with(|w| w.set_notify(true));
        let ready_now = me.has_work()
            || LOCAL_READY.with(|r| !r.borrow().is_empty())
            || io::WorkerIo::with(|w| w.reap_all(&mut completions)).unwrap_or(0) > 0;
        if !ready_now && !rt.shutdown.load(Ordering::Acquire) {
            // Requests waiting for this worker's budget share are sent when
            // its own completions arrive, which signal the eventfd.
            let timeout = match (
                io::WorkerIo::with(|w| w.ready_in()).flatten(),
                services.due_in(),
            ) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            me.stats.sleeps.fetch_add(1, Ordering::Relaxed);
            me.eventfd.wait(timeout);
        }
        me.sleeping.store(false, Ordering::SeqCst);
        io::WorkerIo::with(|w| w.set_notify(false));
        if !completions.is_empty() {
            for (c, t) in completions.drain(..) {
                services.complete(c, t);
            }
            io::WorkerIo::with(|w| w.submit_all());
        }
    }
    slab.clear();
    drop(io::WorkerIo::uninstall());
    CURRENT_WORKER.with(|c| c.set(None));
    CURRENT_RUNTIME.with(|c| c.set(0));
    CURRENT_WORKER_SHARED.with(|c| c.set(0));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::task::Waker;

    fn runtime(config: RuntimeConfig) -> Runtime {
        Runtime::start(&config, &[], &Backend::default(), Services::new(), None).unwrap()
    }

    fn one_worker() -> RuntimeConfig {
        RuntimeConfig {
            workers: 1,
            ..Default::default()
        }
    }

    /// A task of one runtime woken from a worker of another, with the same
    /// worker index, is queued on its own worker (it was queued on the
    /// waking worker's ready list, under a key of another slab, and never
    /// ran again).
    #[test]
    fn a_wake_from_another_runtimes_worker_reaches_the_task() {
        let (a, b) = (runtime(one_worker()), runtime(one_worker()));
        let slot: Arc<Mutex<(bool, Option<Waker>)>> = Arc::new(Mutex::new((false, None)));
        let (tx, rx) = mpsc::channel();
        let waiting = slot.clone();
        a.spawn(async move {
            std::future::poll_fn(|cx| {
                let mut s = waiting.lock().unwrap();
                if s.0 {
                    return Poll::Ready(());
                }
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
            tx.send(()).unwrap();
        })
        .unwrap();
        for _ in 0..1000 {
            if slot.lock().unwrap().1.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let waking = slot.clone();
        b.block_on(async move {
            let waker = {
                let mut s = waking.lock().unwrap();
                s.0 = true;
                s.1.take().expect("the task registered its waker")
            };
            waker.wake();
        })
        .unwrap();
        let ran = rx.recv_timeout(Duration::from_secs(10)).is_ok();
        if !ran {
            // Stopping would wait for the lost task forever.
            std::mem::forget((a, b));
        }
        assert!(ran, "the woken task never ran");
    }

    /// A task that spawns onto a worker whose injector is full gets
    /// `QueueFull` instead of blocking its worker for good (its own
    /// worker cannot admit the job while it waits).
    #[test]
    fn a_task_spawning_into_a_full_injector_is_refused_not_blocked() {
        let rt = Arc::new(runtime(RuntimeConfig {
            workers: 1,
            max_tasks_per_worker: 1,
            injector_capacity: 1,
            ..Default::default()
        }));
        let (tx, rx) = mpsc::channel();
        let (ran_tx, ran_rx) = mpsc::channel();
        let inner = rt.clone();
        rt.spawn(async move {
            let ran = ran_tx.clone();
            let first = inner.spawn(async move { ran.send(()).unwrap() });
            let second = inner.spawn(async {});
            tx.send((first, second)).unwrap();
        })
        .unwrap();
        let (first, second) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the spawning task did not block its worker");
        assert!(first.is_ok(), "{first:?}");
        assert!(
            matches!(
                second,
                Err(Error::QueueFull {
                    worker: 0,
                    capacity: 1
                })
            ),
            "{second:?}"
        );
        ran_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the queued task ran once its spawner finished");
    }
}
