//! Reads in flight, by page id, so that concurrent faults on one page cause
//! one read; and [`IoWait`], what a task awaits for an I/O to finish.
//!
//! Owns: a table partitioned by page id (one mutex per partition, no global
//! lock). An entry exists from the moment a task wins EVICTED -> LOADING
//! until the worker that reaps the read removes it and completes the wait.
//! Never: completes a wait twice.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::Result;

const PARTITIONS: usize = 64;

#[derive(Default)]
struct WaitState {
    done: Option<Result<()>>,
    reaped: Option<Instant>,
    wakers: Vec<Waker>,
}

/// The outcome of one I/O that any number of tasks may await.
#[derive(Default)]
pub struct IoWait {
    state: Mutex<WaitState>,
}

impl IoWait {
    /// Completes the wait and wakes every waiter.
    pub fn complete(&self, result: Result<()>, reaped: Instant) {
        let wakers = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            debug_assert!(s.done.is_none(), "IoWait completed twice");
            s.done = Some(result);
            s.reaped = Some(reaped);
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// A future that resolves with the outcome (and when it was reaped).
    pub fn wait(self: &Arc<Self>) -> WaitFuture {
        WaitFuture(self.clone())
    }
}

/// Resolves when its [`IoWait`] completes.
pub struct WaitFuture(Arc<IoWait>);

impl Future for WaitFuture {
    type Output = (Result<()>, Option<Instant>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        match &s.done {
            Some(Ok(())) => Poll::Ready((Ok(()), s.reaped)),
            Some(Err(e)) => Poll::Ready((Err(e.duplicate()), s.reaped)),
            None => {
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    s.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Page id -> the read in flight for it.
pub(crate) struct InFlight {
    parts: Vec<Mutex<HashMap<u64, Arc<IoWait>>>>,
}

impl InFlight {
    pub(crate) fn new() -> InFlight {
        InFlight {
            parts: (0..PARTITIONS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn part(&self, pid: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<IoWait>>> {
        let i = (pid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % PARTITIONS;
        self.parts[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the read of `pid` (by the task that won LOADING).
    pub(crate) fn insert(&self, pid: u64) -> Arc<IoWait> {
        let w = Arc::new(IoWait::default());
        let prev = self.part(pid).insert(pid, w.clone());
        debug_assert!(prev.is_none(), "two reads in flight for page {pid}");
        w
    }

    /// The read in flight for `pid`, if any.
    pub(crate) fn get(&self, pid: u64) -> Option<Arc<IoWait>> {
        self.part(pid).get(&pid).cloned()
    }

    /// Removes and returns the entry (by the worker that reaped the read).
    pub(crate) fn remove(&self, pid: u64) -> Option<Arc<IoWait>> {
        self.part(pid).remove(&pid)
    }
}
