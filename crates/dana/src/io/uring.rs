//! The io_uring backend.
//!
//! Owns: one ring per (worker, device), the table of requests in flight on
//! it (slot index = `user_data`), and the registrations (the device's file,
//! long-lived memory regions, an eventfd). Batching: `push` only fills the
//! submission queue; `submit` hands the whole batch to the kernel in one
//! `io_uring_enter` (none at all with SQPOLL while the poller is awake).
//!
//! Completions are deferred task work (`IORING_SETUP_DEFER_TASKRUN`,
//! Linux 6.1+, unless [`UringOptions::defer_taskrun`] is off): the kernel
//! posts them when the ring's thread enters with GETEVENTS (`reap` does
//! when the ring's TASKRUN flag is up), instead of interrupting that
//! thread once per completion. Such a ring has one submitter, the thread
//! that first pushes to it or waits on it: it is created disabled and
//! enabled then, so that the thread that opens a database can make its
//! workers' rings. It must never be used from another thread after that.
//!
//! Invariant: a slot holds the request's [`IoBuf`] from `push` until its
//! completion is reaped, so the memory the kernel reads or writes is alive
//! for as long as the kernel may touch it; `Drop` waits for every request in
//! flight before the slots (and buffers) are freed.
//!
//! IOPOLL works only for `O_DIRECT` I/O on devices with polled queues (NVMe
//! with `poll_queues` > 0); elsewhere the kernel fails each request with
//! `EOPNOTSUPP`, which reaches the requester as an error naming the device.

use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::device::Device;
use super::{completion_result, AlignedBuf, Completion, IoBuf, IoQueue, Rejected, Request};
use crate::{Error, OpKind, Result};

/// The most bytes one registered buffer may span (a kernel limit).
const MAX_REGISTERED_BUFFER: usize = 1 << 30;

/// io_uring settings.
#[derive(Debug, Clone, Copy)]
pub struct UringOptions {
    /// A kernel thread polls the submission queue (no syscall to submit).
    pub sqpoll: bool,
    /// Idle time in ms before the SQPOLL thread sleeps.
    pub sqpoll_idle_ms: u32,
    /// Completions are polled from the device instead of interrupts.
    pub iopoll: bool,
    /// Register the device's file descriptor with the ring.
    pub register_files: bool,
    /// Completions wait in the ring until its thread asks for them
    /// (`IORING_SETUP_DEFER_TASKRUN`, Linux 6.1+; an older kernel gets a
    /// plain ring): no interrupt of the running thread per completion.
    /// The thread that first uses the queue becomes its only submitter.
    pub defer_taskrun: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            sqpoll: false,
            sqpoll_idle_ms: 10,
            iopoll: false,
            register_files: true,
            defer_taskrun: true,
        }
    }
}

struct Slot {
    tag: u64,
    op: OpKind,
    offset: u64,
    buf: Option<IoBuf>,
}

/// A region registered with the ring: (start address, length, buffer index).
struct Registered {
    start: usize,
    len: usize,
    index: u16,
}

/// A queue to one device over one io_uring instance.
pub struct UringQueue {
    ring: IoUring,
    device: Arc<Device>,
    capacity: usize,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    queued: usize,
    in_flight: usize,
    fixed_file: bool,
    registered: Vec<Registered>,
    /// Keeps registered regions alive as long as the ring may use them.
    regions: Vec<Arc<AlignedBuf>>,
    options: UringOptions,
    /// Completions are deferred task work, run only by an enter with
    /// GETEVENTS from this ring's thread.
    deferred: bool,
    /// The ring is created disabled (its submitter is the thread that
    /// enables it): true until the first push or wait enables it on the
    /// thread that makes it.
    disabled: bool,
    /// The last reap could not post the deferred completions waiting.
    deferred_left: bool,
}

fn backend_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Backend {
        backend: "uring",
        what,
        source,
    }
}

/// The most requests a ring is made for (a larger depth is cut to this).
pub const MAX_DEPTH: u32 = 4096;

impl UringQueue {
    /// A ring for `device` with room for `depth` requests.
    pub fn new(device: Arc<Device>, depth: u32, options: UringOptions) -> Result<UringQueue> {
        let depth = depth.clamp(1, MAX_DEPTH);
        let entries = depth.next_power_of_two();
        let mut builder = IoUring::builder();
        builder.setup_cqsize(entries * 2);
        if options.sqpoll {
            builder.setup_sqpoll(options.sqpoll_idle_ms);
        }
        if options.iopoll {
            if !device.is_direct() {
                return Err(Error::Unsupported(
                    "IOPOLL needs O_DIRECT (open the device with direct I/O)".into(),
                ));
            }
            builder.setup_iopoll();
        }
        // No COOP_TASKRUN: with it the kernel posts completions only when
        // this thread next enters the kernel, and a worker asleep in
        // poll() on its eventfd would never see them (a load hung that
        // way). DEFER_TASKRUN is different: a completion added to the
        // ring's empty list of deferred work signals the eventfd, and the
        // TASKRUN flag tells `reap` to enter for the rest. The ring is
        // created disabled, so that the worker thread that first uses it
        // (not the thread that opens the database) is its one submitter.
        let setup_failed = |e| backend_err(format!("setting up a ring of {entries} entries"))(e);
        let deferred_ring = if options.defer_taskrun && !options.sqpoll && !options.iopoll {
            let mut b = builder.clone();
            b.setup_single_issuer()
                .setup_defer_taskrun()
                .setup_taskrun_flag()
                .setup_r_disabled();
            match b.build(entries) {
                Ok(r) => Some(r),
                // A kernel before 6.1 refuses the flags: a plain ring.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
                Err(e) => return Err(setup_failed(e)),
            }
        } else {
            None
        };
        let deferred = deferred_ring.is_some();
        let ring = match deferred_ring {
            Some(r) => r,
            None => builder.build(entries).map_err(setup_failed)?,
        };
        let mut fixed_file = false;
        if options.register_files {
            ring.submitter()
                .register_files(&[device.fd()])
                .map_err(backend_err("registering the device file"))?;
            fixed_file = true;
        }
        let capacity = depth as usize;
        Ok(UringQueue {
            ring,
            device,
            capacity,
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity as u32).rev().collect(),
            queued: 0,
            in_flight: 0,
            fixed_file,
            registered: Vec::new(),
            regions: Vec::new(),
            options,
            deferred,
            disabled: deferred,
            deferred_left: false,
        })
    }

    /// Enables a ring created disabled, making the calling thread its
    /// submitter (once).
    fn enable(&mut self) -> Result<()> {
        if self.disabled {
            self.ring
                .submitter()
                .register_enable_rings()
                .map_err(backend_err("enabling the ring on its worker"))?;
            self.disabled = false;
        }
        Ok(())
    }

    fn registered_index(&self, addr: usize, len: usize) -> Option<u16> {
        self.registered
            .iter()
            .find(|r| addr >= r.start && addr + len <= r.start + r.len)
            .map(|r| r.index)
    }

    fn entry(&self, req: &Request, user_data: u64) -> squeue::Entry {
        let fd = self.device.fd();
        macro_rules! with_fd {
            ($build:expr) => {
                if self.fixed_file {
                    $build(types::Fixed(0))
                } else {
                    $build(types::Fd(fd))
                }
            };
        }
        let entry = match (&req.op, &req.buf) {
            (OpKind::Read, Some(b)) => {
                let (ptr, len) = (b.addr(), b.len() as u32);
                match self.registered_index(ptr as usize, b.len()) {
                    Some(i) => with_fd!(|f| opcode::ReadFixed::new(f, ptr, len, i)
                        .offset(req.offset)
                        .build()),
                    None => with_fd!(|f| opcode::Read::new(f, ptr, len).offset(req.offset).build()),
                }
            }
            (OpKind::Write, Some(b)) => {
                let (ptr, len) = (b.addr() as *const u8, b.len() as u32);
                // A durable write asks the kernel for write-through
                // (RWF_DSYNC: FUA, or a cache flush after the write).
                let mut flags = if req.durable { libc::RWF_DSYNC } else { 0 };
                // An untorn write (a page whose torn-page image the log
                // no longer holds): RWF_ATOMIC, which fails rather than
                // tears on a device that cannot.
                if req.atomic {
                    flags |= libc::RWF_ATOMIC;
                }
                // The class's write stream on a block device that offers
                // streams (Linux 6.16+); 0, no stream, everywhere else.
                let stream = req.placement.stream(self.device.write_streams());
                match self.registered_index(ptr as usize, b.len()) {
                    Some(i) => with_fd!(|f| opcode::WriteFixed::new(f, ptr, len, i)
                        .offset(req.offset)
                        .rw_flags(flags)
                        .write_stream(stream)
                        .build()),
                    None => with_fd!(|f| opcode::Write::new(f, ptr, len)
                        .offset(req.offset)
                        .rw_flags(flags)
                        .write_stream(stream)
                        .build()),
                }
            }
            (OpKind::Flush, _) => with_fd!(|f| opcode::Fsync::new(f)
                .flags(types::FsyncFlags::DATASYNC)
                .build()),
            _ => unreachable!("Alignment::check rejects a read or write without buffer"),
        };
        entry.user_data(user_data)
    }

    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> Result<usize> {
        let res = match timeout {
            Some(t) if want > 0 => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
            _ => self.ring.submitter().submit_and_wait(want),
        };
        match res {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN)
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(backend_err("submitting requests")(e)),
        }
    }
}

impl IoQueue for UringQueue {
    fn device(&self) -> usize {
        self.device.index()
    }

    fn backend(&self) -> &'static str {
        "uring"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected> {
        if let Err(error) = self.enable() {
            return Err(Rejected {
                error,
                request: req,
            });
        }
        let full = self.free.is_empty();
        let req = self.device.admit(req, full, self.capacity)?;
        let Some(slot) = self.free.pop() else {
            unreachable!("admit checked that a slot is free")
        };
        // Checked before the entry is published: a panic after the push
        // would drop req.buf while the kernel may use it (review 19).
        debug_assert!(self.slots[slot as usize].is_none());
        let entry = self.entry(&req, slot as u64);
        // The entry points into req.buf, which is moved into the slot below
        // and stays there until the completion for this slot is reaped
        // (Drop waits for all of them), so the memory outlives the kernel's
        // use. The SQ has `entries >= capacity` places and at most
        // `capacity` requests are queued or in flight, so it cannot be full.
        // SAFETY: the buffer outlives the request, as argued above.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        debug_assert!(pushed.is_ok(), "SQ sized to capacity cannot overflow");
        if pushed.is_err() {
            self.free.push(slot);
            return Err(Rejected {
                error: Error::InvalidArgument("submission queue full".into()),
                request: req,
            });
        }
        self.slots[slot as usize] = Some(Slot {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            buf: req.buf,
        });
        self.queued += 1;
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        if self.queued == 0 {
            return Ok(0);
        }
        let n = self.queued;
        if self.options.sqpoll {
            // The kernel thread picks entries up; submit() only wakes it
            // when it sleeps.
            self.ring
                .submit()
                .map_err(backend_err("waking the SQPOLL thread"))?;
        } else {
            // A busy or interrupted call consumes nothing (0): what it
            // left stays queued, in the submission queue, for the next
            // call (the worker retries each round and does not sleep
            // past it, see `WorkerIo::ready_in`). Counting it in flight
            // would leave a worker asleep waiting for completions of
            // requests the kernel never saw.
            let mut done = 0;
            while done < n {
                let k = self.enter(0, None)?;
                if k == 0 {
                    break;
                }
                done += k;
            }
            let done = done.min(n);
            self.queued = n - done;
            self.in_flight += done;
            return Ok(done);
        }
        self.queued = 0;
        self.in_flight += n;
        Ok(n)
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let device = self.device.index();
        if self.deferred && !self.disabled && self.ring.submission().taskrun() {
            // Completions wait as deferred work: an enter with GETEVENTS
            // (nothing to submit, nothing to wait for) posts them. An
            // error leaves them for the next reap or wait, and the worker
            // does not sleep on them (`ready_in`).
            // SAFETY: no submission entries are handed over (0) and no
            // argument is passed; the call only runs this ring's work.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            self.deferred_left = entered.is_err();
        } else {
            self.deferred_left = false;
        }
        let mut n = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let slot_index = cqe.user_data() as usize;
            let Some(slot) = self.slots.get_mut(slot_index).and_then(Option::take) else {
                debug_assert!(false, "completion for an empty slot {slot_index}");
                continue;
            };
            self.free.push(slot_index as u32);
            let len = slot.buf.as_ref().map_or(0, IoBuf::len);
            let res = self.device.vetted(slot.op, cqe.result() as i64);
            out.push(Completion {
                tag: slot.tag,
                op: slot.op,
                offset: slot.offset,
                result: completion_result(slot.op, device, slot.offset, len, res),
                buf: slot.buf,
            });
            n += 1;
        }
        self.in_flight -= n;
        n
    }

    fn wait(&mut self, min: usize, timeout: Option<Duration>) -> Result<()> {
        if self.in_flight + self.queued == 0 {
            return Ok(());
        }
        self.enable()?;
        self.in_flight += self.queued;
        self.queued = 0;
        let ready = self.ring.completion().len();
        let want = min.min(self.in_flight).saturating_sub(ready);
        if want == 0 && !self.ring.submission().is_empty() {
            self.enter(0, None)?;
        } else if want > 0 {
            self.enter(want, timeout)?;
        }
        Ok(())
    }

    fn queued(&self) -> usize {
        self.queued
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn attach_eventfd(&mut self, eventfd: std::os::fd::RawFd) -> Result<()> {
        self.ring
            .submitter()
            .register_eventfd(eventfd)
            .map_err(backend_err("registering an eventfd"))?;
        self.ring.completion().disable_eventfd();
        Ok(())
    }

    fn set_notify(&mut self, on: bool) {
        if on {
            self.ring.completion().enable_eventfd();
        } else {
            self.ring.completion().disable_eventfd();
        }
    }

    fn ready_in(&self) -> Option<Duration> {
        // Deferred completions the last reap left (its enter failed): the
        // eventfd was signalled only for the first of them, perhaps while
        // notifications were off, so no sleep. (Those that come after the
        // reap find the list empty and signal.)
        self.deferred_left.then_some(Duration::ZERO)
    }

    fn register_memory(&mut self, region: &Arc<AlignedBuf>) -> Result<bool> {
        if !self.registered.is_empty() {
            return Err(Error::InvalidArgument(
                "a ring registers memory once (io_uring replaces the whole table)".into(),
            ));
        }
        let base = region.raw() as usize;
        let iovecs: Vec<libc::iovec> = (0..region.len())
            .step_by(MAX_REGISTERED_BUFFER)
            .map(|off| libc::iovec {
                iov_base: (base + off) as *mut libc::c_void,
                iov_len: (region.len() - off).min(MAX_REGISTERED_BUFFER),
            })
            .collect();
        // SAFETY: every iovec lies inside `region`, which is kept alive in
        // self.regions for as long as the ring exists.
        let res = unsafe { self.ring.submitter().register_buffers(&iovecs) };
        if let Err(e) = res {
            // Locked-memory limits can refuse this; requests then use
            // unregistered buffers, which is correct, only slower.
            if matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM)) {
                return Ok(false);
            }
            return Err(backend_err("registering buffers")(e));
        }
        for (i, v) in iovecs.iter().enumerate() {
            self.registered.push(Registered {
                start: v.iov_base as usize,
                len: v.iov_len,
                index: i as u16,
            });
        }
        self.regions.push(region.clone());
        Ok(true)
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        // Wait for the kernel to finish with every buffer before the slots
        // (and the memory they keep alive) are freed.
        let mut sink = Vec::new();
        let mut stuck = 0;
        while self.in_flight + self.queued > 0 {
            if self.wait(1, Some(Duration::from_millis(100))).is_err() {
                stuck += 1;
            }
            sink.clear();
            if self.reap(&mut sink) == 0 {
                stuck += 1;
            }
            if stuck > 100 {
                // The kernel still owns these buffers: leak them rather than
                // free memory it may write to.
                for slot in self.slots.drain(..) {
                    std::mem::forget(slot);
                }
                std::mem::forget(std::mem::take(&mut self.regions));
                return;
            }
        }
        // The ring's teardown runs in the kernel after its fd closes, and
        // a file registered with it stays open until then: a file system
        // unmounted right after `Db::close` was busy for ~50 ms (an
        // outside probe). Unregistered now, the file goes with the
        // device's own descriptor. (An error leaves it to the teardown.)
        if self.fixed_file {
            let _ = self.ring.submitter().unregister_files();
        }
    }
}
