//! The I/O layer: devices, arrays, and per-worker queues to every device.
//!
//! Owns: opening files and block devices with `O_DIRECT`, the page ->
//! (device, offset) mapping of an array, and the queues that move requests
//! to a device and completions back. Every backend (io_uring, blocking
//! syscalls, the simulated device) implements [`IoQueue`].
//!
//! Invariants:
//! - A request's buffer stays alive until its completion has been reaped:
//!   the queue holds the [`IoBuf`] (and through it the memory) while the
//!   kernel or the simulator may touch it, and hands it back in the
//!   [`Completion`]. Dropping a queue with requests in flight waits for them.
//! - Offsets, lengths and buffer addresses are checked against the device's
//!   direct-I/O alignment before a request is queued: a misaligned request
//!   is rejected with [`Error::Misaligned`], never passed to the kernel.
//! - One queue belongs to one worker and one device (all-to-all): no lock
//!   on the I/O path.
//!
//! Never: retries a failed request, or reports a completion for a request
//! that was not pushed.

pub mod aligned;
pub mod array;
pub mod blocking;
pub mod device;
pub mod eventfd;
pub mod ftl;
pub mod grower;
pub mod mirror;
pub mod placement;
pub mod remap;
pub mod sim;
pub mod uring;

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

pub use aligned::{AlignedBuf, FrameMemory};
pub use array::{open_queue, Array, Backend, Target};
pub use device::Device;
pub use eventfd::EventFd;
pub use placement::Placement;
pub use sim::{
    Clock, CutWrite, DiscardFailure, Fault, FaultEffect, Latency, PowerCutPolicy, PowerCutReport,
    SectorFate, SimConfig, SimDisk, SimQueue, SimStats, Trigger, WriteFate,
};

use crate::{Error, OpKind, Result};

/// What keeps the memory of an [`IoBuf`] alive.
enum Keep {
    Owned(AlignedBuf),
    /// Held only to keep the region alive while the request is in flight.
    Shared(#[allow(dead_code)] Arc<AlignedBuf>),
}

/// The memory one request reads into or writes from.
///
/// Either an owned [`AlignedBuf`] (handed back in the completion for reuse)
/// or a range of a shared region such as the buffer pool's frames, kept
/// alive by an `Arc` until the completion is reaped.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    keep: Keep,
}

// SAFETY: the memory is owned (AlignedBuf is Send) or kept alive by an Arc of
// a Send + Sync allocation; the pointer is only dereferenced by the queue
// that owns the IoBuf.
unsafe impl Send for IoBuf {}

/// An aligned buffer lent to requests and refilled only when none holds
/// it: memory reused from one write to the next without allocating, and
/// without `unsafe` at the caller (the log's flush buffer).
pub struct ReusableBuf(Arc<AlignedBuf>);

impl ReusableBuf {
    /// `len` zeroed bytes aligned to `align`.
    pub fn new(len: usize, align: usize) -> Result<ReusableBuf> {
        AlignedBuf::new(len, align).map(|b| ReusableBuf(Arc::new(b)))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false (a buffer is never empty).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The bytes, to fill, if no request holds the buffer any more.
    pub fn get_mut(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.0).map(|b| &mut b[..])
    }

    /// A request buffer over `len` bytes at `offset`.
    pub fn lend(&self, offset: usize, len: usize) -> Result<IoBuf> {
        // The region is reachable only through this type, whose one access
        // to the bytes, `get_mut`, needs the only reference to it; the
        // returned buffer holds one until its request is reaped and dropped.
        // SAFETY: so nobody writes the lent bytes while a request holds them.
        unsafe { IoBuf::shared(self.0.clone(), offset, len) }
    }
}

impl IoBuf {
    /// A request buffer that owns its memory.
    pub fn owned(buf: AlignedBuf) -> IoBuf {
        let ptr = NonNull::new(buf.raw()).expect("AlignedBuf pointer is never null");
        let len = buf.len();
        IoBuf {
            ptr,
            len,
            keep: Keep::Owned(buf),
        }
    }

    /// A request buffer over `len` bytes at `offset` of a shared region.
    ///
    /// # Safety
    /// Until the completion of the request that carries this buffer has been
    /// reaped, nobody else may write these bytes (for a read request: nobody
    /// may read or write them, but for the buffer manager's optimistic
    /// readers below). The buffer manager guarantees this with the page
    /// state of the frame. The one exception, the design's: an optimistic
    /// reader of the frame's previous page (`PageOptimistic::with_bytes`)
    /// may still be reading while a read fills the frame. It reads
    /// through panic-free decoders and throws its result away when its
    /// version no longer validates, which the frame's reuse made sure of;
    /// it is a data race in Rust's memory model all the same (see
    /// `with_bytes`).
    pub unsafe fn shared(region: Arc<AlignedBuf>, offset: usize, len: usize) -> Result<IoBuf> {
        let end = offset.checked_add(len);
        if len == 0 || end.is_none_or(|e| e > region.len()) {
            return Err(Error::InvalidArgument(format!(
                "range {offset}+{len} outside a region of {} bytes",
                region.len()
            )));
        }
        // SAFETY: offset + len <= region.len(), so the pointer stays inside
        // the allocation.
        let ptr = unsafe { NonNull::new_unchecked(region.raw().add(offset)) };
        Ok(IoBuf {
            ptr,
            len,
            keep: Keep::Shared(region),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address (for alignment checks and for the kernel).
    pub fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The owned buffer, if this request buffer owns its memory.
    pub fn as_owned(&self) -> Option<&AlignedBuf> {
        match &self.keep {
            Keep::Owned(b) => Some(b),
            Keep::Shared(_) => None,
        }
    }

    /// The owned buffer, for filling before a write.
    pub fn as_owned_mut(&mut self) -> Option<&mut AlignedBuf> {
        match &mut self.keep {
            Keep::Owned(b) => Some(b),
            Keep::Shared(_) => None,
        }
    }

    /// Turns the buffer into a region that several requests can share
    /// (a mirrored write goes to every copy from the same memory): the
    /// region, the buffer's offset in it, and whether the buffer owned it.
    /// [`IoBuf::from_region`] turns it back.
    pub(crate) fn into_region(self) -> (Arc<AlignedBuf>, usize, bool) {
        match self.keep {
            Keep::Owned(b) => (Arc::new(b), 0, true),
            Keep::Shared(region) => {
                let offset = self.ptr.as_ptr() as usize - region.raw() as usize;
                (region, offset, false)
            }
        }
    }

    /// The buffer [`IoBuf::into_region`] made the region of, once no other
    /// request holds the region (an owned one is owned again).
    pub(crate) fn from_region(
        region: Arc<AlignedBuf>,
        offset: usize,
        len: usize,
        owned: bool,
    ) -> Result<IoBuf> {
        if owned {
            match Arc::try_unwrap(region) {
                Ok(b) => return Ok(IoBuf::owned(b)),
                Err(region) => {
                    return Err(Error::InvalidArgument(format!(
                        "a request buffer still shared by {} holders",
                        Arc::strong_count(&region)
                    )))
                }
            }
        }
        // SAFETY: the region was this buffer's before `into_region`; its
        // holder's guarantee (nobody else writes the bytes while a request
        // holds them) carries over.
        unsafe { IoBuf::shared(region, offset, len) }
    }

    /// Gives the owned buffer back (None for a shared region).
    pub fn into_owned(self) -> Option<AlignedBuf> {
        match self.keep {
            Keep::Owned(b) => Some(b),
            Keep::Shared(_) => None,
        }
    }

    /// The bytes of the buffer.
    ///
    /// # Safety
    /// For a shared region, nobody may be writing these bytes concurrently.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len lies inside the live allocation kept by
        // `keep`; the caller rules out concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes of the buffer, for writing.
    ///
    /// # Safety
    /// For a shared region, nobody else may access these bytes concurrently.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("owned", &matches!(self.keep, Keep::Owned(_)))
            .finish()
    }
}

/// One I/O request on one device.
#[derive(Debug)]
pub struct Request {
    /// Chosen by the requester; comes back in the completion.
    pub tag: u64,
    /// Read, write or flush.
    pub op: OpKind,
    /// Byte offset on the device (ignored for flush).
    pub offset: u64,
    /// The memory to read into or write from (`None` for flush).
    pub buf: Option<IoBuf>,
    /// A write that is durable once it completes (write-through:
    /// `RWF_DSYNC`, which the kernel turns into FUA or a cache flush after
    /// the write). Whoever asks relies on nothing more than this write's
    /// own bytes being durable. False for reads and flushes.
    pub durable: bool,
    /// A read of whole pages: a mirrored device checks each page
    /// ([`mirror::PageCheck`]) and reads a damaged one from another copy
    /// (repairing the bad copy). Other backends ignore it.
    pub pages: bool,
    /// On a mirrored device: this copy alone (a read of it, or a write to
    /// it: the repair of a large value's pages found damaged there). Other
    /// backends ignore it.
    pub copy: Option<u8>,
    /// A write's class, for devices that place writes by expected life
    /// (write streams, the simulator's FTL handles). Advice only: it never
    /// changes where the bytes go in the device's address space or when
    /// they are durable. Reads and flushes ignore it.
    pub placement: Placement,
    /// A write that must land whole or not at all (`RWF_ATOMIC`): the
    /// engine asks for it only on devices that said they can
    /// ([`Target::untorn_writes`]), for page write-backs whose torn-page
    /// images it no longer logs. A device that cannot fails it
    /// (`EINVAL`), never writes it tearable. False for reads and flushes.
    pub atomic: bool,
}

impl Request {
    /// Read `buf.len()` bytes at `offset` into `buf`.
    pub fn read(tag: u64, offset: u64, buf: IoBuf) -> Request {
        Request {
            tag,
            op: OpKind::Read,
            offset,
            buf: Some(buf),
            durable: false,
            pages: false,
            copy: None,
            placement: Placement::Unsorted,
            atomic: false,
        }
    }

    /// Read whole pages at `offset` into `buf` (see [`Request::pages`]).
    pub fn read_pages(tag: u64, offset: u64, buf: IoBuf) -> Request {
        Request {
            pages: true,
            ..Request::read(tag, offset, buf)
        }
    }

    /// Write `buf` at `offset`.
    pub fn write(tag: u64, offset: u64, buf: IoBuf) -> Request {
        Request {
            tag,
            op: OpKind::Write,
            offset,
            buf: Some(buf),
            durable: false,
            pages: false,
            copy: None,
            placement: Placement::Unsorted,
            atomic: false,
        }
    }

    /// Write `buf` at `offset`, durable when it completes (no flush
    /// needed for these bytes; see [`Request::durable`]).
    pub fn write_durable(tag: u64, offset: u64, buf: IoBuf) -> Request {
        Request {
            durable: true,
            ..Request::write(tag, offset, buf)
        }
    }

    /// This write, untorn (see [`Request::atomic`]) if `atomic`.
    pub fn untorn(self, atomic: bool) -> Request {
        Request { atomic, ..self }
    }

    /// This request with placement class `placement` (see
    /// [`Request::placement`]).
    pub fn placed(self, placement: Placement) -> Request {
        Request { placement, ..self }
    }

    /// Make every write completed before this request durable.
    pub fn flush(tag: u64) -> Request {
        Request {
            tag,
            op: OpKind::Flush,
            offset: 0,
            buf: None,
            durable: false,
            pages: false,
            copy: None,
            placement: Placement::Unsorted,
            atomic: false,
        }
    }

    /// Bytes transferred by this request (0 for flush).
    pub fn len(&self) -> usize {
        self.buf.as_ref().map_or(0, IoBuf::len)
    }

    /// True for a flush.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The outcome of one request.
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The request's operation.
    pub op: OpKind,
    /// The request's offset.
    pub offset: u64,
    /// The request's buffer, handed back.
    pub buf: Option<IoBuf>,
    /// Bytes transferred, or the error (naming device and offset). A short
    /// read or write is reported as [`Error::ShortIo`].
    pub result: Result<usize>,
}

/// A request the queue would not take, with the reason; the caller gets its
/// request (and buffer) back.
#[derive(Debug)]
pub struct Rejected {
    /// Why the request was not queued.
    pub error: Error,
    /// The request, untouched.
    pub request: Request,
}

impl Rejected {
    /// Lets `req` into a queue only if it meets the device's alignment,
    /// the queue has room, and it is no write to a device opened
    /// `read_only`; otherwise hands it back with the reason. (A write sent
    /// to a read-only file came back EBADF, and a mirror's copies waited
    /// for good on it: refused here, it is [`Error::ReadOnly`].)
    pub(crate) fn admit(
        req: Request,
        align: &Alignment,
        full: bool,
        capacity: usize,
        read_only: bool,
    ) -> std::result::Result<Request, Rejected> {
        if let Err(error) = align.check(&req) {
            return Err(Rejected {
                error,
                request: req,
            });
        }
        if read_only && req.op == OpKind::Write {
            return Err(Rejected {
                error: Error::ReadOnly,
                request: req,
            });
        }
        if full {
            return Err(Rejected {
                error: Error::InvalidArgument(format!(
                    "queue to device {} is full ({capacity} requests)",
                    align.device
                )),
                request: req,
            });
        }
        Ok(req)
    }
}

/// A submission/completion queue from one worker to one device.
pub trait IoQueue: Send {
    /// Index of the device in its array.
    fn device(&self) -> usize;

    /// Name of the backend ("uring", "blocking", "sim", ...).
    fn backend(&self) -> &'static str;

    /// Most requests that may be queued or in flight at once.
    fn capacity(&self) -> usize;

    /// Queues a request (not yet submitted to the device). Fails, handing
    /// the request back, when it is misaligned, out of range, or the queue
    /// is full.
    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected>;

    /// Submits every queued request to the device in one batch. Returns how
    /// many were submitted.
    fn submit(&mut self) -> Result<usize>;

    /// Moves finished requests into `out` without blocking. Returns how many.
    fn reap(&mut self, out: &mut Vec<Completion>) -> usize;

    /// Submits what is queued and blocks until at least `min` completions
    /// can be reaped or `timeout` passes.
    fn wait(&mut self, min: usize, timeout: Option<Duration>) -> Result<()>;

    /// Requests pushed but not yet submitted.
    fn queued(&self) -> usize;

    /// Requests that a later [`IoQueue::submit`] must send: this queue's
    /// own queued ones, and those a queue it wraps kept back (a ring that
    /// answered busy or interrupted). A worker does not sleep for good
    /// while any are left.
    fn unsent(&self) -> usize {
        self.queued()
    }

    /// Requests submitted whose completions have not been reaped.
    fn in_flight(&self) -> usize;

    /// Asks the queue to signal `eventfd` when a completion arrives while
    /// notifications are enabled, so that a worker can sleep on one fd for
    /// all of its queues. Backends that complete synchronously ignore it.
    fn attach_eventfd(&mut self, _eventfd: std::os::fd::RawFd) -> Result<()> {
        Ok(())
    }

    /// Turns eventfd notification on (before the worker sleeps) or off
    /// (while it is busy, to spare the kernel the signal).
    fn set_notify(&mut self, _on: bool) {}

    /// How long until a completion is certain to be ready, for backends that
    /// know (the simulator's clock, a synchronous backend); `Some(ZERO)`
    /// when one is ready now; `None` when only the eventfd can tell.
    fn ready_in(&self) -> Option<Duration>;

    /// Registers a long-lived region (the buffer pool's frames) with the
    /// kernel, so that requests into it skip per-request page pinning.
    /// Returns false when the backend has no use for it.
    fn register_memory(&mut self, _region: &Arc<AlignedBuf>) -> Result<bool> {
        Ok(false)
    }
}

/// Direct-I/O alignment rules of one device, checked before queueing.
#[derive(Debug, Clone, Copy)]
pub struct Alignment {
    /// Device index (for errors).
    pub device: usize,
    /// Offsets and lengths must be multiples of this.
    pub io: u64,
    /// Buffer addresses must be multiples of this.
    pub mem: u64,
    /// Device size in bytes.
    pub size: u64,
}

impl Alignment {
    /// Checks a request against the rules.
    pub fn check(&self, req: &Request) -> Result<()> {
        let Some(buf) = &req.buf else {
            return match req.op {
                OpKind::Flush => Ok(()),
                op => Err(Error::InvalidArgument(format!(
                    "{op} request without a buffer"
                ))),
            };
        };
        if req.op == OpKind::Flush {
            return Err(Error::InvalidArgument("flush request with a buffer".into()));
        }
        let len = buf.len() as u64;
        let misaligned = |what, value| Error::Misaligned {
            what,
            value,
            align: self.io,
            device: self.device,
        };
        if req.offset % self.io != 0 {
            return Err(misaligned("offset", req.offset));
        }
        if len % self.io != 0 {
            return Err(misaligned("length", len));
        }
        let addr = buf.addr() as u64;
        if addr % self.mem != 0 {
            return Err(Error::Misaligned {
                what: "buffer address",
                value: addr,
                align: self.mem,
                device: self.device,
            });
        }
        if req
            .offset
            .checked_add(len)
            .is_none_or(|end| end > self.size)
        {
            return Err(Error::OutOfRange {
                op: req.op,
                device: self.device,
                offset: req.offset,
                len: buf.len(),
                size: self.size,
            });
        }
        Ok(())
    }
}

/// Runs one request to completion on a queue of the caller's own
/// (opening, recovery, labels and rebuild copies: off the workers).
/// Bounded in time: every backend completes a request (a simulated device
/// that lost power completes it with an error). The request goes out
/// under a tag of its own, and its completion comes back with the
/// caller's: a completion of an earlier request the queue still held (one
/// whose caller gave up on a failed wait) is dropped, never taken for
/// this one's (a flush's, say).
pub fn sync_io(q: &mut dyn IoQueue, mut req: Request) -> Result<Completion> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let tag = req.tag;
    let own = 1 << 63 | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    req.tag = own;
    q.push(req).map_err(|r| r.error)?;
    q.submit()?;
    let mut out = Vec::with_capacity(1);
    loop {
        q.reap(&mut out);
        if let Some(i) = out.iter().position(|c| c.tag == own) {
            let mut c = out.swap_remove(i);
            c.tag = tag;
            return Ok(c);
        }
        out.clear();
        q.wait(1, None)?;
    }
}

/// Turns a syscall-style result (bytes or -errno) into a completion result.
pub(crate) fn completion_result(
    op: OpKind,
    device: usize,
    offset: u64,
    len: usize,
    res: i64,
) -> Result<usize> {
    if res < 0 {
        return Err(Error::io(op, device, offset, len, (-res) as i32));
    }
    let done = res as usize;
    if op != OpKind::Flush && done != len {
        return Err(Error::ShortIo {
            op,
            device,
            offset,
            len,
            done,
        });
    }
    Ok(done)
}

/// The machine's physical memory in bytes (`u64::MAX` if unknown).
pub(crate) fn physical_memory_bytes() -> u64 {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page <= 0 {
        return u64::MAX;
    }
    (pages as u64).saturating_mul(page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Alignment {
        Alignment {
            device: 3,
            io: 4096,
            mem: 4096,
            size: 1 << 20,
        }
    }

    /// A completion of an earlier request still in the queue is never
    /// taken for the one `sync_io` runs (the first version took the first
    /// completion it reaped: a stale write's could pass for a flush's).
    #[test]
    fn sync_io_takes_its_own_completion_only() {
        let d = sim::SimDisk::new(0, 1 << 20, sim::SimConfig::deterministic(1));
        let mut q = d.queue(8);
        let buf = IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
        q.push(Request::write(7, 0, buf)).unwrap();
        q.submit().unwrap();
        let c = sync_io(&mut q, Request::flush(3)).unwrap();
        assert_eq!((c.tag, c.op), (3, OpKind::Flush));
        c.result.unwrap();
    }

    #[test]
    fn alignment_errors_name_what_is_wrong() {
        let buf = IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
        let err = rules().check(&Request::read(0, 100, buf)).unwrap_err();
        assert!(matches!(
            err,
            Error::Misaligned {
                what: "offset",
                device: 3,
                ..
            }
        ));

        let buf = IoBuf::owned(AlignedBuf::new(1000, 4096).unwrap());
        let err = rules().check(&Request::read(0, 0, buf)).unwrap_err();
        assert!(matches!(err, Error::Misaligned { what: "length", .. }));

        let region = Arc::new(AlignedBuf::new(3 * 4096, 4096).unwrap());
        // SAFETY: the region is used by nothing else in this test.
        let buf = unsafe { IoBuf::shared(region, 512, 4096) }.unwrap();
        let err = rules().check(&Request::write(0, 0, buf)).unwrap_err();
        assert!(matches!(
            err,
            Error::Misaligned {
                what: "buffer address",
                ..
            }
        ));

        let buf = IoBuf::owned(AlignedBuf::new(8192, 4096).unwrap());
        let err = rules()
            .check(&Request::read(0, (1 << 20) - 4096, buf))
            .unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }));
    }

    #[test]
    fn shared_range_is_bounds_checked() {
        let region = Arc::new(AlignedBuf::new(4096, 4096).unwrap());
        // SAFETY: the range is never used for I/O.
        assert!(unsafe { IoBuf::shared(region, 4096, 1) }.is_err());
    }

    #[test]
    fn short_io_is_an_error() {
        let r = completion_result(OpKind::Read, 1, 4096, 4096, 512);
        assert!(matches!(r, Err(Error::ShortIo { done: 512, .. })));
        let r = completion_result(OpKind::Write, 1, 4096, 4096, -5);
        assert!(matches!(r, Err(Error::Io { device: 1, .. })));
    }
}
