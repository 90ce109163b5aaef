//! Who owns a completion, and the system work a worker runs between tasks.
//!
//! Owns: the request kinds and the tag layout that names them, the
//! [`Services`] a runtime is started with (one completion handler per
//! kind, the list of [`SystemTask`]s), and the awaited single requests
//! ([`perform`]), whose completions the scheduler itself hands back.
//!
//! A request's tag is `kind << KIND_SHIFT | id`: the kind picks the owner,
//! the id is the owner's own (a frame, a flush's part). A worker hands
//! each completion to the handler of its kind, on the worker that issued
//! it; it runs every system task's step once per loop round and sleeps no
//! longer than the nearest deadline any of them names.
//!
//! Never: lets one layer route another's completions (the buffer pool
//! knows nothing of the log's requests), or blocks in a step (a step only
//! starts work: I/O goes through the queues, long work is spawned as a
//! task with [`super::spawn_here`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::io::{enqueue, IoTiming};
use super::wait::IoWait;
use crate::io::{Completion, Request};
use crate::{Error, Result};

/// Bits of a tag that name the kind of request.
const KIND_SHIFT: u32 = 60;
/// The owner's part of a tag.
pub const TAG_ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// What a request is for, which decides whose handler completes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RequestKind {
    /// A page read into a frame (the buffer pool).
    PageRead = 0,
    /// A page write-back (the buffer pool).
    PageWrite = 1,
    /// A log flush's writes and its sync (the log).
    Log = 2,
    /// One request a task awaits ([`perform`]): completed by the scheduler.
    Awaited = 3,
}

/// Kinds with a handler slot in [`Services`] (all but `Awaited`).
const HANDLED_KINDS: usize = 3;

impl RequestKind {
    /// The tag of a request of this kind with the owner's id `id`.
    pub fn tag(self, id: u64) -> u64 {
        debug_assert!(id <= TAG_ID_MASK, "tag id {id:#x} too large");
        (self as u64) << KIND_SHIFT | (id & TAG_ID_MASK)
    }

    /// The kind a tag names (None: a tag no kind owns).
    pub fn of(tag: u64) -> Option<RequestKind> {
        Some(match tag >> KIND_SHIFT {
            0 => RequestKind::PageRead,
            1 => RequestKind::PageWrite,
            2 => RequestKind::Log,
            3 => RequestKind::Awaited,
            _ => return None,
        })
    }
}

/// Receives the completions of one or more kinds of request, on the worker
/// that issued them.
pub trait CompletionHandler: Send + Sync + 'static {
    /// A request of `kind` with the owner's id `id` completed (or failed).
    fn complete(&self, kind: RequestKind, id: u64, completion: Completion, timing: IoTiming);
}

/// Work a worker runs between tasks: a step that starts what is due
/// (eviction, a log flush, a checkpoint) and returns at once.
pub trait SystemTask: Send + Sync + 'static {
    /// Its name, for diagnostics.
    fn name(&self) -> &'static str;
    /// Starts what is due; true when it did something.
    fn step(&self) -> bool;
    /// How soon time alone makes a step due (an async commit's flush
    /// window); None: only an event (a completion, a task) can.
    fn due_in(&self) -> Option<Duration> {
        None
    }
}

/// The owners a runtime routes to: a handler per request kind and the
/// system tasks. Fixed when the runtime starts (no lock on the path of a
/// completion).
#[derive(Default, Clone)]
pub struct Services {
    handlers: [Option<Arc<dyn CompletionHandler>>; HANDLED_KINDS],
    tasks: Vec<Arc<dyn SystemTask>>,
}

impl Services {
    /// No handlers, no system tasks (only [`perform`]ed requests).
    pub fn new() -> Services {
        Services::default()
    }

    /// Routes completions of `kind` to `handler`. `Awaited` requests are
    /// the scheduler's own and cannot be handed elsewhere.
    pub fn handle(mut self, kind: RequestKind, handler: Arc<dyn CompletionHandler>) -> Services {
        assert!(
            kind != RequestKind::Awaited,
            "awaited requests are completed by the scheduler"
        );
        self.handlers[kind as usize] = Some(handler);
        self
    }

    /// Adds a system task; steps run in the order they were added.
    pub fn system_task(mut self, task: Arc<dyn SystemTask>) -> Services {
        self.tasks.push(task);
        self
    }

    /// Hands a completion to its owner.
    pub(crate) fn complete(&self, c: Completion, t: IoTiming) {
        let id = c.tag & TAG_ID_MASK;
        // Control-plane invariants (a completion nobody owns would leave
        // its waiters asleep for ever): every tag names a kind with an
        // owner, and every awaited request was registered by `perform` on
        // this worker before it was queued.
        let kind = RequestKind::of(c.tag)
            .unwrap_or_else(|| panic!("completion tag {:#x} names no kind", c.tag));
        if kind == RequestKind::Awaited {
            let w = AWAITED.with(|a| a.borrow_mut().waits.remove(&id));
            let w = w.unwrap_or_else(|| panic!("awaited request {id} completed unregistered"));
            w.complete(c.result.map(|_| ()), t.reaped);
            return;
        }
        match &self.handlers[kind as usize] {
            Some(h) => h.complete(kind, id, c, t),
            None => panic!("completion of a {kind:?} request, which has no handler"),
        }
    }

    /// Runs every system task's step once; true if any did something.
    pub(crate) fn step_all(&self) -> bool {
        let mut progress = false;
        for t in &self.tasks {
            progress |= t.step();
        }
        progress
    }

    /// The nearest deadline any system task names.
    pub(crate) fn due_in(&self) -> Option<Duration> {
        self.tasks.iter().filter_map(|t| t.due_in()).min()
    }

    /// The system tasks' names, in step order.
    pub fn system_task_names(&self) -> Vec<&'static str> {
        self.tasks.iter().map(|t| t.name()).collect()
    }
}

#[derive(Default)]
struct Awaited {
    next: u64,
    waits: HashMap<u64, Arc<IoWait>>,
}

thread_local! {
    /// This worker's awaited requests in flight (a request completes on
    /// the worker that queued it, so no lock is needed).
    static AWAITED: RefCell<Awaited> = RefCell::new(Awaited::default());
}

/// Queues `req` (its tag is replaced) on device `device` from the current
/// worker at once, and returns a future that resolves with its outcome:
/// for one-off requests a task awaits (a data device's sync, a control
/// block write). Several can be in flight together. Resolves to
/// `WouldBlock` off a worker.
pub fn perform(device: usize, mut req: Request) -> impl Future<Output = Result<()>> {
    let wait = Arc::new(IoWait::default());
    let id = AWAITED.with(|a| {
        let mut a = a.borrow_mut();
        let id = a.next & TAG_ID_MASK;
        a.next = a.next.wrapping_add(1);
        a.waits.insert(id, wait.clone());
        id
    });
    req.tag = RequestKind::Awaited.tag(id);
    let queued = match enqueue(device, req) {
        Ok(()) => Ok(wait),
        Err(_) => {
            AWAITED.with(|a| a.borrow_mut().waits.remove(&id));
            Err(Error::WouldBlock)
        }
    };
    async move {
        match queued {
            Ok(w) => w.wait().await.0,
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_kind_and_id() {
        for kind in [
            RequestKind::PageRead,
            RequestKind::PageWrite,
            RequestKind::Log,
            RequestKind::Awaited,
        ] {
            for id in [0, 1, 12345, TAG_ID_MASK] {
                let t = kind.tag(id);
                assert_eq!(RequestKind::of(t), Some(kind));
                assert_eq!(t & TAG_ID_MASK, id);
            }
        }
        assert_eq!(RequestKind::of(15 << KIND_SHIFT), None);
    }

    struct Due(Option<Duration>);
    impl SystemTask for Due {
        fn name(&self) -> &'static str {
            "due"
        }
        fn step(&self) -> bool {
            self.0.is_some()
        }
        fn due_in(&self) -> Option<Duration> {
            self.0
        }
    }

    #[test]
    fn the_nearest_deadline_wins() {
        let s = Services::new()
            .system_task(Arc::new(Due(None)))
            .system_task(Arc::new(Due(Some(Duration::from_millis(7)))))
            .system_task(Arc::new(Due(Some(Duration::from_millis(3)))));
        assert_eq!(s.due_in(), Some(Duration::from_millis(3)));
        assert!(s.step_all());
        assert_eq!(s.system_task_names(), ["due", "due", "due"]);
        assert_eq!(Services::new().due_in(), None);
        assert!(!Services::new().step_all());
    }
}
