//! An eventfd: the one file descriptor a worker sleeps on.
//!
//! Owns: the descriptor. Other threads `signal` it (new work, a remote
//! wake-up); io_uring rings signal it on completion while notifications are
//! enabled. Never: blocks in `signal`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::{Error, Result};

/// A non-blocking eventfd.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates a non-blocking, close-on-exec eventfd.
    pub fn new() -> Result<EventFd> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Backend {
                backend: "eventfd",
                what: "creating an eventfd".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a freshly created descriptor owned by nobody else.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The raw descriptor (for io_uring registration).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Wakes the sleeper (never blocks; a saturated counter is already a
    /// pending wake-up).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to a valid descriptor.
        unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }

    /// Clears pending signals without blocking.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local; the fd is
        // non-blocking, so this returns EAGAIN when nothing is pending.
        unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Sleeps until signalled or `timeout` passes (None: no limit), then
    /// clears the signal. Returns true when it was signalled.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| {
            // Round up so that a short timeout does not become a busy poll.
            t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        // SAFETY: pfd is a live pollfd and we pass a count of 1.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            self.drain();
            return true;
        }
        false
    }
}
