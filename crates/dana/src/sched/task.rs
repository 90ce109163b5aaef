//! User tasks: boxed futures in a per-worker slab, and their wakers.
//!
//! Owns: the task slab of one worker and the [`TaskCell`] that a task's
//! waker points to. A task lives on the worker that first ran it for its
//! whole life (no migration); it can be woken from any thread.
//! Never: polls a task that is not in the ready queue, or polls a task on
//! a thread other than its worker's.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use super::WorkerShared;

/// A unit of work handed to a worker.
pub(crate) type Job = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Identifies a task slot and its generation: `slot | generation << 32`.
pub(crate) type TaskKey = u64;

thread_local! {
    /// The worker index of this thread, if it is a worker.
    pub(crate) static CURRENT_WORKER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    /// The identity of the runtime whose worker runs this thread (0: none).
    pub(crate) static CURRENT_RUNTIME: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The address of this thread's [`WorkerShared`] (0: not a worker).
    /// A wake is local only if it names this very worker: two databases'
    /// runtimes both have a worker 0.
    pub(crate) static CURRENT_WORKER_SHARED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Tasks woken on their own worker's thread.
    pub(crate) static LOCAL_READY: RefCell<VecDeque<TaskKey>> = const { RefCell::new(VecDeque::new()) };
    /// Tasks spawned on this worker by its system steps, to be admitted.
    pub(crate) static LOCAL_SPAWNED: RefCell<Vec<Job>> = const { RefCell::new(Vec::new()) };
}

/// What a task's waker points to.
pub(crate) struct TaskCell {
    pub(crate) worker: Arc<WorkerShared>,
    pub(crate) key: TaskKey,
    /// Set while the task is in a ready queue, so that many wake-ups queue
    /// it once.
    pub(crate) queued: AtomicBool,
}

impl Wake for TaskCell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mine = Arc::as_ptr(&self.worker) as usize;
        if CURRENT_WORKER_SHARED.with(|c| c.get()) == mine {
            LOCAL_READY.with(|r| r.borrow_mut().push_back(self.key));
        } else {
            self.worker.wake_remote(self.key);
        }
    }
}

/// One live task.
pub(crate) struct Task {
    pub(crate) future: Job,
    pub(crate) cell: Arc<TaskCell>,
    pub(crate) waker: Waker,
}

/// The tasks of one worker.
pub(crate) struct Slab {
    slots: Vec<Option<Task>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl Slab {
    pub(crate) fn new() -> Slab {
        Slab {
            slots: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Stores a new task and returns its key (the task starts queued).
    pub(crate) fn insert(&mut self, worker: &Arc<WorkerShared>, future: Job) -> TaskKey {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.generations.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let generation = self.generations[slot as usize];
        let key = slot as u64 | (generation as u64) << 32;
        let cell = Arc::new(TaskCell {
            worker: worker.clone(),
            key,
            queued: AtomicBool::new(true),
        });
        let waker = Waker::from(cell.clone());
        debug_assert!(self.slots[slot as usize].is_none());
        self.slots[slot as usize] = Some(Task {
            future,
            cell,
            waker,
        });
        self.live += 1;
        key
    }

    /// The task for `key`, unless it finished since the key was queued.
    pub(crate) fn get_mut(&mut self, key: TaskKey) -> Option<&mut Task> {
        let slot = (key & 0xffff_ffff) as usize;
        let generation = (key >> 32) as u32;
        if self.generations.get(slot) != Some(&generation) {
            return None;
        }
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Removes a finished task.
    pub(crate) fn remove(&mut self, key: TaskKey) {
        let slot = (key & 0xffff_ffff) as usize;
        if let Some(t) = self.slots.get_mut(slot).and_then(Option::take) {
            drop(t);
            self.generations[slot] = self.generations[slot].wrapping_add(1);
            self.free.push(slot as u32);
            self.live -= 1;
        }
    }

    /// Drops every task (at shutdown).
    pub(crate) fn clear(&mut self) {
        let keys: Vec<TaskKey> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some())
            .map(|(i, _)| i as u64 | (self.generations[i] as u64) << 32)
            .collect();
        for k in keys {
            self.remove(k);
        }
    }
}
