//! [`IoWait`]: the outcome of one I/O that any number of tasks await.
//!
//! Owns: the waiters of one request and its result, completed once by the
//! worker that reaps it. Never: completes a wait twice, or blocks a
//! thread (waiters are tasks, woken by their wakers).

use std::future::Future;
use std::pin::Pin;
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
