//! One worker's queue to an out-of-place device: each request of the
//! engine becomes one sub-request per page, to the slot the map names (a
//! read) or to a fresh slot (a write).
//!
//! Owns: the requests of one worker (*parents*), their sub-requests to the
//! device's queue and the ones that did not fit in it yet. A sub-request's
//! tag is `parent << 24 | page index`. Reads of pages never written are
//! answered with zeros without I/O.
//!
//! Never: hands out a write's completion before the map points at every
//! page it wrote (a later read would find the old version), or a flush's
//! or durable write's before the device's barrier made them durable.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Remap, NO_PAGE};
use crate::io::{AlignedBuf, Completion, IoBuf, IoQueue, Placement, Rejected, Request};
use crate::{Error, OpKind, Result};

/// Bits of a sub-request's tag that hold its page index.
const INDEX_BITS: u32 = 24;

/// A request of the caller's.
struct Parent {
    tag: u64,
    op: OpKind,
    offset: u64,
    len: usize,
    durable: bool,
    /// A write's class.
    placement: Placement,
    /// The caller's buffer while no sub-request holds it.
    buf: Option<IoBuf>,
    /// The caller's buffer as a region the sub-requests share.
    region: Option<(Arc<AlignedBuf>, usize, bool)>,
    /// Per page: the slot read or written (NO_PAGE: zeros, no I/O).
    slots: Vec<u64>,
    pending: usize,
    error: Option<Error>,
}

impl Parent {
    fn take_buf(&mut self) -> Result<Option<IoBuf>> {
        if let Some(b) = self.buf.take() {
            return Ok(Some(b));
        }
        match self.region.take() {
            Some((r, off, owned)) => IoBuf::from_region(r, off, self.len, owned).map(Some),
            None => Ok(None),
        }
    }
}

/// A worker's queue to one out-of-place device.
pub struct RemapQueue {
    remap: Arc<Remap>,
    inner: Box<dyn IoQueue>,
    parents: Vec<Option<Parent>>,
    free: Vec<usize>,
    /// Sub-requests the device's queue had no room for yet.
    backlog: VecDeque<Request>,
    ready: VecDeque<Completion>,
    outstanding: usize,
    queued: usize,
    reaped: Vec<Completion>,
}

impl RemapQueue {
    pub(super) fn new(remap: Arc<Remap>, inner: Box<dyn IoQueue>) -> Result<RemapQueue> {
        Ok(RemapQueue {
            remap,
            inner,
            parents: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            ready: VecDeque::new(),
            outstanding: 0,
            queued: 0,
            reaped: Vec::new(),
        })
    }

    fn page(&self) -> usize {
        self.remap.config.page_size as usize
    }

    /// The buffer of page `i` of parent `p`, for its sub-request.
    fn sub_buf(&mut self, p: usize, i: usize, pages: usize) -> Result<IoBuf> {
        let page = self.page();
        let parent = self.parents[p].as_mut().expect("a live parent");
        if pages == 1 {
            return parent
                .buf
                .take()
                .ok_or_else(|| Error::InvalidArgument("a request without a buffer".into()));
        }
        if parent.region.is_none() {
            let buf = parent
                .buf
                .take()
                .ok_or_else(|| Error::InvalidArgument("a request without a buffer".into()))?;
            parent.region = Some(buf.into_region());
        }
        let (region, off, _) = parent.region.as_ref().expect("shared above");
        // The caller handed the whole buffer to this queue until the
        // parent's completion; the region goes back only when every
        // sub-request of the parent was reaped.
        // SAFETY: so each sub-request's page is its own.
        unsafe { IoBuf::shared(region.clone(), off + i * page, page) }
    }

    /// Fills page `i` of parent `p` with zeros (a read of a page never
    /// written).
    fn zero_page(&mut self, p: usize, i: usize, pages: usize) -> Result<()> {
        let buf = self.sub_buf(p, i, pages)?;
        // SAFETY: this queue holds the caller's buffer for a read until its
        // completion; no request holds this page of it.
        unsafe { buf.bytes_mut().fill(0) };
        if pages == 1 {
            self.parents[p].as_mut().expect("a live parent").buf = Some(buf);
        }
        Ok(())
    }

    fn dispatch(&mut self, p: usize) -> Result<()> {
        let page = self.page();
        let (op, offset, len, placement) = {
            let pr = self.parents[p].as_ref().expect("a live parent");
            (pr.op, pr.offset, pr.len, pr.placement)
        };
        if len % page != 0 || offset % page as u64 != 0 {
            return Err(Error::Misaligned {
                what: "out-of-place request (whole pages only)",
                value: offset,
                align: page as u64,
                device: self.inner.device(),
            });
        }
        let pages = len / page;
        if pages >= 1 << INDEX_BITS {
            return Err(Error::InvalidArgument(format!(
                "a request of {pages} pages (at most {})",
                (1u64 << INDEX_BITS) - 1
            )));
        }
        let first = offset / page as u64;
        for i in 0..pages {
            let logical = first + i as u64;
            let slot = match op {
                OpKind::Read => self.remap.read_slot(logical),
                _ => Some(self.fresh_slot(placement)?),
            };
            let pr = self.parents[p].as_mut().expect("a live parent");
            pr.slots.push(slot.unwrap_or(NO_PAGE));
            let Some(slot) = slot else {
                self.zero_page(p, i, pages)?;
                continue;
            };
            let buf = self.sub_buf(p, i, pages)?;
            let tag = (p as u64) << INDEX_BITS | i as u64;
            let at = slot * page as u64;
            let req = match op {
                OpKind::Read => Request::read(tag, at, buf),
                _ => Request::write(tag, at, buf).placed(placement),
            };
            self.parents[p].as_mut().expect("a live parent").pending += 1;
            self.backlog.push_back(req);
        }
        Ok(())
    }

    /// A fresh slot for a write; when the free segments run low, lets
    /// this queue's requests in flight end (its reads pin their segments,
    /// and nobody else reaps them while this worker collects), then runs
    /// the collection.
    fn fresh_slot(&mut self, placement: Placement) -> Result<u64> {
        // Bounded: each round hands a slot out or the collection frees a
        // segment (it fails when it cannot).
        for _ in 0..=self.remap.segments() {
            if let Some(slot) = self.remap.write_slot(placement) {
                return Ok(slot);
            }
            self.settle()?;
            self.remap.collect(1)?;
        }
        Err(Error::NoSpace(
            "out-of-place device: the collection frees no segment".into(),
        ))
    }

    /// Waits until every sub-request this queue sent has completed, and
    /// takes the completions in.
    fn settle(&mut self) -> Result<()> {
        self.feed();
        // Bounded: each pass waits for at least one completion.
        while self.inner.in_flight() + self.inner.queued() > 0 || !self.backlog.is_empty() {
            self.inner.submit()?;
            self.inner.wait(1, None)?;
            self.pump();
        }
        Ok(())
    }

    /// Moves sub-requests from the backlog into the device's queue.
    fn feed(&mut self) {
        while let Some(req) = self.backlog.pop_front() {
            if let Err(rej) = self.inner.push(req) {
                self.backlog.push_front(rej.request);
                break;
            }
        }
    }

    /// Reaps the device's completions into the parents, and finishes the
    /// parents that are done.
    fn pump(&mut self) {
        self.feed();
        let mut reaped = std::mem::take(&mut self.reaped);
        self.inner.reap(&mut reaped);
        for c in reaped.drain(..) {
            let p = (c.tag >> INDEX_BITS) as usize;
            let i = (c.tag & ((1 << INDEX_BITS) - 1)) as usize;
            let page = self.page() as u64;
            let pr = self.parents[p]
                .as_mut()
                .expect("a completion of a live parent");
            let slot = pr.slots[i];
            let ok = c.result.is_ok();
            match pr.op {
                OpKind::Read => self.remap.read_done(slot),
                _ => self
                    .remap
                    .write_done(pr.offset / page + i as u64, slot, ok, None),
            }
            if let Err(e) = c.result {
                pr.error.get_or_insert(e);
            }
            if pr.len as u64 == page {
                pr.buf = c.buf;
            } else {
                // A page of the shared region: released before the region
                // goes back whole.
                drop(c.buf);
            }
            pr.pending -= 1;
            if pr.pending == 0 {
                self.finish(p);
            }
        }
        self.reaped = reaped;
        self.feed();
    }

    /// Parent `p` is done: its completion goes out.
    fn finish(&mut self, p: usize) {
        let mut pr = self.parents[p].take().expect("a live parent");
        self.free.push(p);
        let mut result = match pr.error.take() {
            Some(e) => Err(e),
            None => Ok(pr.len),
        };
        if result.is_ok() && pr.op == OpKind::Write && pr.durable {
            if let Err(e) = self.remap.barrier() {
                result = Err(e);
            }
        }
        let buf = match pr.take_buf() {
            Ok(b) => b,
            Err(e) => {
                result = Err(e);
                None
            }
        };
        self.ready.push_back(Completion {
            tag: pr.tag,
            op: pr.op,
            offset: pr.offset,
            buf,
            result,
        });
    }
}

impl IoQueue for RemapQueue {
    fn device(&self) -> usize {
        self.inner.device()
    }

    fn backend(&self) -> &'static str {
        "out-of-place"
    }

    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected> {
        let full = self.outstanding >= self.capacity();
        let req = Rejected::admit(req, &self.remap.alignment(), full, self.capacity())?;
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                self.parents.push(None);
                self.parents.len() - 1
            }
        };
        self.outstanding += 1;
        self.queued += 1;
        if req.op == OpKind::Flush {
            // This queue's reads in flight could pin segments a collection
            // on another worker waits for while this one waits for it.
            let result = self.settle().and_then(|_| self.remap.barrier()).map(|_| 0);
            self.free.push(p);
            self.ready.push_back(Completion {
                tag: req.tag,
                op: req.op,
                offset: req.offset,
                buf: None,
                result,
            });
            return Ok(());
        }
        self.parents[p] = Some(Parent {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.len(),
            durable: req.durable,
            placement: req.placement,
            buf: req.buf,
            region: None,
            slots: Vec::new(),
            pending: 0,
            error: None,
        });
        // Held while its pages are dispatched: a collection on the way
        // reaps this queue's completions, and must not finish the parent
        // before all its pages went out.
        self.parents[p].as_mut().expect("a live parent").pending = 1;
        let dispatched = self.dispatch(p);
        let pr = self.parents[p].as_mut().expect("a live parent");
        if let Err(e) = dispatched {
            pr.error.get_or_insert(e);
        }
        pr.pending -= 1;
        if pr.pending == 0 {
            self.finish(p);
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        self.feed();
        self.inner.submit()?;
        Ok(std::mem::take(&mut self.queued))
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        self.pump();
        let n = self.ready.len();
        self.outstanding -= n;
        out.extend(self.ready.drain(..));
        n
    }

    fn wait(&mut self, min: usize, timeout: Option<Duration>) -> Result<()> {
        self.submit()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        // Bounded: every pass waits for the device's queue or returns.
        loop {
            self.pump();
            let want = min.min(self.in_flight() + self.queued);
            if self.ready.len() >= want || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            if self.inner.in_flight() + self.inner.queued() == 0 && self.backlog.is_empty() {
                return Ok(());
            }
            self.inner.submit()?;
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            self.inner.wait(1, left)?;
        }
    }

    fn queued(&self) -> usize {
        self.queued
    }

    fn in_flight(&self) -> usize {
        // Requests answered at once (flushes, reads of unwritten pages) may
        // be reaped before the submit that counts them as sent.
        self.outstanding.saturating_sub(self.queued)
    }

    fn attach_eventfd(&mut self, eventfd: RawFd) -> Result<()> {
        self.inner.attach_eventfd(eventfd)
    }

    fn set_notify(&mut self, on: bool) {
        self.inner.set_notify(on);
    }

    fn ready_in(&self) -> Option<Duration> {
        if !self.ready.is_empty() || !self.backlog.is_empty() {
            return Some(Duration::ZERO);
        }
        self.inner.ready_in()
    }

    fn register_memory(&mut self, region: &Arc<AlignedBuf>) -> Result<bool> {
        self.inner.register_memory(region)
    }
}
