//! [`IoWait`]: the outcome of one I/O that any number of tasks await;
//! [`WakerList`]: tasks parked until a condition may have changed (a free
//! frame, room in the log).
//!
//! Owns: the waiters of one request and its result, completed once by the
//! worker that reaps it; the wakers of a parked condition. Never:
//! completes a wait twice, or blocks a thread (waiters are tasks, woken by
//! their wakers).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::Result;

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

/// Tasks parked until a condition may have changed, woken all at once.
///
/// The protocol, which loses no wake-up: a waiter checks the condition,
/// [`WakerList::register`]s, checks again, and only then returns
/// `Pending`; whoever changes the condition then calls
/// [`WakerList::wake_all`]. Both touch the flag with a read-modify-write,
/// so a `wake_all` that finds no waiter is ordered before the register,
/// and the waiter's second check sees the change.
#[derive(Default)]
pub struct WakerList {
    wakers: Mutex<Vec<Waker>>,
    any: AtomicBool,
}

impl WakerList {
    /// Parks `waker` until the next [`WakerList::wake_all`].
    pub fn register(&self, waker: &Waker) {
        let mut w = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.any.swap(true, Ordering::SeqCst);
    }

    /// True if some task is parked (a hint: it may be woken meanwhile).
    pub fn has_waiters(&self) -> bool {
        self.any.load(Ordering::SeqCst)
    }

    /// Parks the calling task until `value` no longer holds `seen` (the
    /// protocol above, with the value as the condition; whoever changes
    /// it calls [`WakerList::wake_all`] after the change).
    pub async fn until_changed(&self, value: &AtomicU64, seen: u64) {
        std::future::poll_fn(|cx| {
            if value.load(Ordering::SeqCst) != seen {
                return Poll::Ready(());
            }
            self.register(cx.waker());
            if value.load(Ordering::SeqCst) != seen {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await
    }

    /// Wakes every parked task (cheap when none is).
    pub fn wake_all(&self) {
        if !self.any.swap(false, Ordering::SeqCst) {
            return;
        }
        let woken = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in woken {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Count(AtomicU64);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_waker_registered_twice_is_woken_once_and_only_by_the_next_wake_all() {
        let list = WakerList::default();
        list.wake_all();
        let c = Arc::new(Count(AtomicU64::new(0)));
        let w = Waker::from(c.clone());
        list.register(&w);
        list.register(&w);
        assert!(list.has_waiters());
        list.wake_all();
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(!list.has_waiters());
        list.wake_all();
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
    }
}
