//! The blocking backend: one pread/pwrite/fdatasync per request.
//!
//! This is the baseline the papers start from (one syscall per I/O, a
//! thread blocked while it runs). Requests run, in order, when
//! [`IoQueue::submit`] is called; their completions are ready at once.
//! Never: reorders requests or runs them before `submit`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::device::Device;
use super::{completion_result, Completion, IoQueue, Rejected, Request};
use crate::{OpKind, Result};

/// A queue that executes requests with blocking syscalls.
pub struct BlockingQueue {
    device: Arc<Device>,
    capacity: usize,
    queued: Vec<Request>,
    done: VecDeque<Completion>,
}

impl BlockingQueue {
    /// A queue on `device` holding at most `depth` requests.
    pub fn new(device: Arc<Device>, depth: u32) -> BlockingQueue {
        BlockingQueue {
            device,
            capacity: depth.max(1) as usize,
            queued: Vec::new(),
            done: VecDeque::new(),
        }
    }

    fn execute(&self, req: Request) -> Completion {
        let fd = self.device.fd();
        let len = req.len();
        let res: i64 = match (&req.op, &req.buf) {
            // SAFETY: the buffer is owned by the request for the duration of
            // the call and is `len` bytes long.
            (OpKind::Read, Some(b)) => unsafe {
                libc::pread(fd, b.addr().cast(), len, req.offset as libc::off_t) as i64
            },
            // SAFETY: as above; pwrite only reads the buffer.
            (OpKind::Write, Some(b)) if !req.durable && !req.atomic => unsafe {
                libc::pwrite(fd, b.addr().cast(), len, req.offset as libc::off_t) as i64
            },
            // SAFETY: as above; the iovec names the request's buffer, which
            // pwritev2 only reads.
            (OpKind::Write, Some(b)) => unsafe {
                let iov = libc::iovec {
                    iov_base: b.addr().cast(),
                    iov_len: len,
                };
                let durable = if req.durable { libc::RWF_DSYNC } else { 0 };
                let atomic = if req.atomic { libc::RWF_ATOMIC } else { 0 };
                libc::pwritev2(fd, &iov, 1, req.offset as libc::off_t, durable | atomic) as i64
            },
            // SAFETY: fdatasync takes only the descriptor.
            (OpKind::Flush, _) => unsafe { libc::fdatasync(fd) as i64 },
            _ => unreachable!("Alignment::check rejects a read or write without buffer"),
        };
        let res = if res < 0 {
            -(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO) as i64)
        } else {
            res
        };
        let res = self.device.vetted(req.op, res);
        Completion {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            result: completion_result(req.op, self.device.index(), req.offset, len, res),
            buf: req.buf,
        }
    }
}

impl IoQueue for BlockingQueue {
    fn device(&self) -> usize {
        self.device.index()
    }

    fn backend(&self) -> &'static str {
        "blocking"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected> {
        let full = self.queued.len() + self.done.len() >= self.capacity;
        let req = self.device.admit(req, full, self.capacity)?;
        self.queued.push(req);
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        let reqs = std::mem::take(&mut self.queued);
        let n = reqs.len();
        for req in reqs {
            let c = self.execute(req);
            self.done.push_back(c);
        }
        Ok(n)
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    fn wait(&mut self, _min: usize, _timeout: Option<Duration>) -> Result<()> {
        self.submit().map(|_| ())
    }

    fn queued(&self) -> usize {
        self.queued.len()
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn ready_in(&self) -> Option<Duration> {
        (!self.done.is_empty() || !self.queued.is_empty()).then_some(Duration::ZERO)
    }
}
