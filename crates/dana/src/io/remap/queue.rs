//! One worker's queue to an out-of-place device: each request of the
//! engine becomes sub-requests to the extents the map names (a read) or
//! to fresh ones (a write).
//!
//! Owns: the requests of one worker (*parents*), their sub-requests to the
//! device's queue and the ones that did not fit in it yet, and on a
//! compressed device the chunk each stream packs its pages into until the
//! next submit. A sub-request's tag is its index in `subs`. On a plain
//! device a page is read into and written from the caller's buffer; on a
//! compressed one a page is compressed into a chunk, and a compressed
//! extent is read into a buffer of its own and decompressed into the
//! caller's page when it completes. Reads of pages never written are
//! answered with zeros without I/O.
//!
//! Never: hands out a write's completion before the map points at every
//! page it wrote (a later read would find the old version), or a flush's
//! or durable write's before the device's barrier made them durable; or
//! keeps a packed page waiting past the submit that follows its request.
//!
//! Callers' contract, as on any device: two writes of one page in flight
//! at once land in either order (the map follows their completions, which
//! the device below may reorder). The engine never issues them: a page's
//! write-back waits for the one before.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pack::{compress_page, decompress_page};
use super::{Chunk, Remap, GC_RESERVE, OPEN_SEGMENTS};
use crate::io::{AlignedBuf, Completion, IoBuf, IoQueue, Rejected, Request};
use crate::{Error, OpKind, Result};

/// Bits of a packed page's owner note that hold its page index (the rest
/// is its parent).
const INDEX_BITS: u32 = 24;

/// A request of the caller's.
struct Parent {
    tag: u64,
    op: OpKind,
    offset: u64,
    len: usize,
    durable: bool,
    /// A write's class.
    placement: crate::io::Placement,
    /// The caller's buffer while no sub-request holds it.
    buf: Option<IoBuf>,
    /// The caller's buffer as a region the sub-requests share.
    region: Option<(Arc<AlignedBuf>, usize, bool)>,
    /// Pages not done yet (and, while it is dispatched, one more).
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

/// A request to the device's queue, and what its completion means.
enum Sub {
    /// Page `i` of parent `p`, read into or written from the caller's
    /// buffer, at extent `loc`.
    Page { p: usize, i: usize, loc: u64 },
    /// Page `i` of parent `p`, compressed at extent `loc`: read into a
    /// buffer of its own, then decompressed into `page`.
    Packed {
        p: usize,
        i: usize,
        loc: u64,
        page: IoBuf,
    },
    /// A chunk of packed pages (their owners: parent and page index).
    Chunk(Chunk),
}

/// A worker's queue to one out-of-place device.
pub struct RemapQueue {
    remap: Arc<Remap>,
    inner: Box<dyn IoQueue>,
    parents: Vec<Option<Parent>>,
    free: Vec<usize>,
    subs: Vec<Option<Sub>>,
    free_subs: Vec<usize>,
    /// Sub-requests the device's queue had no room for yet.
    backlog: VecDeque<Request>,
    ready: VecDeque<Completion>,
    outstanding: usize,
    queued: usize,
    reaped: Vec<Completion>,
    /// Per stream, the chunk being packed (compressed devices).
    chunks: [Option<Chunk>; OPEN_SEGMENTS],
    /// A compressed page, before it goes into its chunk.
    scratch: Vec<u8>,
}

impl RemapQueue {
    pub(super) fn new(remap: Arc<Remap>, inner: Box<dyn IoQueue>) -> Result<RemapQueue> {
        Ok(RemapQueue {
            remap,
            inner,
            parents: Vec::new(),
            free: Vec::new(),
            subs: Vec::new(),
            free_subs: Vec::new(),
            backlog: VecDeque::new(),
            ready: VecDeque::new(),
            outstanding: 0,
            queued: 0,
            reaped: Vec::new(),
            chunks: Default::default(),
            scratch: Vec::new(),
        })
    }

    fn page(&self) -> usize {
        self.remap.config.page_size as usize
    }

    fn parent(&mut self, p: usize) -> &mut Parent {
        self.parents[p].as_mut().expect("a live parent")
    }

    /// The buffer of page `i` of parent `p`, for its sub-request.
    fn sub_buf(&mut self, p: usize, i: usize, pages: usize) -> Result<IoBuf> {
        let page = self.page();
        let parent = self.parent(p);
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

    /// Gives page `i`'s buffer back to parent `p` once no request holds
    /// it (a one-page parent keeps it whole; a page of a shared region is
    /// released before the region goes back whole).
    fn page_back(&mut self, p: usize, buf: Option<IoBuf>) {
        let page = self.page();
        let pr = self.parent(p);
        if pr.len == page {
            pr.buf = buf;
        }
    }

    /// Fills page `i` of parent `p` with zeros (a read of a page never
    /// written).
    fn zero_page(&mut self, p: usize, i: usize, pages: usize) -> Result<()> {
        let buf = self.sub_buf(p, i, pages)?;
        // SAFETY: this queue holds the caller's buffer for a read until its
        // completion; no request holds this page of it.
        unsafe { buf.bytes_mut().fill(0) };
        self.page_back(p, Some(buf));
        Ok(())
    }

    /// Sends `req` for `sub` (its tag set here).
    fn send(&mut self, sub: Sub, mut req: Request) {
        let t = match self.free_subs.pop() {
            Some(t) => t,
            None => {
                self.subs.push(None);
                self.subs.len() - 1
            }
        };
        self.subs[t] = Some(sub);
        req.tag = t as u64;
        self.backlog.push_back(req);
    }

    fn dispatch(&mut self, p: usize) -> Result<()> {
        let page = self.page();
        let (op, offset, len) = {
            let pr = self.parent(p);
            (pr.op, pr.offset, pr.len)
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
        match op {
            OpKind::Read => self.dispatch_read(p, pages),
            _ if self.remap.compressed() => self.dispatch_packed_write(p, pages),
            _ => self.dispatch_write(p, pages),
        }
    }

    fn dispatch_read(&mut self, p: usize, pages: usize) -> Result<()> {
        let first = self.parent(p).offset / self.page() as u64;
        for i in 0..pages {
            let Some(e) = self.remap.read_extent(first + i as u64) else {
                self.zero_page(p, i, pages)?;
                continue;
            };
            let bufs = self.sub_buf(p, i, pages).and_then(|page| {
                let bounce = match e.packed {
                    true => Some(IoBuf::owned(self.remap.buf(e.len)?)),
                    false => None,
                };
                Ok((page, bounce))
            });
            let (page, bounce) = match bufs {
                Ok(b) => b,
                Err(err) => {
                    self.remap.read_done(e.loc);
                    return Err(err);
                }
            };
            self.parent(p).pending += 1;
            match bounce {
                Some(b) => self.send(
                    Sub::Packed {
                        p,
                        i,
                        loc: e.loc,
                        page,
                    },
                    Request::read(0, e.at, b),
                ),
                None => self.send(Sub::Page { p, i, loc: e.loc }, Request::read(0, e.at, page)),
            }
        }
        Ok(())
    }

    /// A plain device: each page goes from the caller's buffer to a fresh
    /// page-sized extent.
    fn dispatch_write(&mut self, p: usize, pages: usize) -> Result<()> {
        let page = self.page() as u64;
        let (first, placement) = {
            let pr = self.parent(p);
            (pr.offset / page, pr.placement)
        };
        for i in 0..pages {
            let (e, handle) = self.fresh_slot(first + i as u64, placement)?;
            let buf = match self.sub_buf(p, i, pages) {
                Ok(b) => b,
                Err(err) => {
                    self.remap.write_done(first + i as u64, e.loc, false, None);
                    return Err(err);
                }
            };
            self.parent(p).pending += 1;
            let req = Request::write(0, e.at, buf).placed(handle);
            self.send(Sub::Page { p, i, loc: e.loc }, req);
        }
        Ok(())
    }

    /// A compressed device: each page is compressed into its stream's
    /// chunk; the chunks are written at the next submit (or once full).
    fn dispatch_packed_write(&mut self, p: usize, pages: usize) -> Result<()> {
        let page = self.page();
        let unit = self.remap.unit();
        let (first, placement) = {
            let pr = self.parent(p);
            (pr.offset / page as u64, pr.placement)
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut closed = Vec::new();
        let mut result = Ok(());
        for i in 0..pages {
            {
                let pr = self.parents[p].as_ref().expect("a live parent");
                let Some(buf) = pr.buf.as_ref() else {
                    result = Err(Error::InvalidArgument("a request without a buffer".into()));
                    break;
                };
                // SAFETY: the caller handed this buffer to the queue until
                // the parent's completion and writes none of it meanwhile;
                // no request holds it (a packed write reads it here only).
                let bytes = unsafe { &buf.bytes()[i * page..(i + 1) * page] };
                compress_page(bytes, unit, &mut scratch);
            }
            let owner = (p as u64) << INDEX_BITS | i as u64;
            let logical = first + i as u64;
            let stream = self.remap.write_stream(logical, placement);
            // Bounded: each round packs the page or the collection frees a
            // segment (it fails when it cannot).
            let mut placed = false;
            for _ in 0..=self.remap.segments() {
                let open = &mut self.chunks[stream];
                match self.remap.pack(
                    open,
                    &mut closed,
                    stream,
                    false,
                    logical,
                    &scratch,
                    owner,
                    GC_RESERVE,
                ) {
                    Ok(true) => {
                        placed = true;
                        break;
                    }
                    Ok(false) => {
                        self.emit(&mut closed);
                        let collected = self.settle().and_then(|_| self.remap.collect(1));
                        if let Err(e) = collected {
                            result = Err(e);
                            break;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            if result.is_err() {
                break;
            }
            if !placed {
                result = Err(Error::NoSpace(
                    "out-of-place device: the collection frees no segment".into(),
                ));
                break;
            }
            self.parent(p).pending += 1;
        }
        scratch.clear();
        self.scratch = scratch;
        self.emit(&mut closed);
        result
    }

    /// Sends the write of each chunk in `closed` (a chunk that holds no
    /// page just ends).
    fn emit(&mut self, closed: &mut Vec<Chunk>) {
        for c in closed.drain(..) {
            match self.remap.chunk_write(&c) {
                Some((at, buf)) => {
                    let req = Request::write(0, at, buf).placed(c.placement());
                    self.send(Sub::Chunk(c), req);
                }
                None => self.remap.chunk_written(&c, true),
            }
        }
    }

    /// Closes every stream's chunk and sends its write.
    fn close_chunks(&mut self) {
        let mut closed: Vec<Chunk> = self.chunks.iter_mut().filter_map(Option::take).collect();
        if !closed.is_empty() {
            self.emit(&mut closed);
        }
    }

    /// A fresh extent for a write on a plain device; when the free
    /// segments run low, lets this queue's requests in flight end (its
    /// reads pin their segments, and nobody else reaps them while this
    /// worker collects), then runs the collection.
    fn fresh_slot(
        &mut self,
        page: u64,
        placement: crate::io::Placement,
    ) -> Result<(super::Extent, crate::io::Placement)> {
        // Bounded: each round hands an extent out or the collection frees
        // a segment (it fails when it cannot).
        for _ in 0..=self.remap.segments() {
            if let Some(e) = self.remap.write_slot(page, placement) {
                return Ok(e);
            }
            self.settle()?;
            self.remap.collect(1)?;
        }
        Err(Error::NoSpace(
            "out-of-place device: the collection frees no segment".into(),
        ))
    }

    /// Sends the open chunks, waits until every sub-request this queue
    /// sent has completed, and takes the completions in.
    fn settle(&mut self) -> Result<()> {
        self.close_chunks();
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

    /// Page `i` of parent `p` ended (with `error`, if it failed); the
    /// parent finishes when it was its last.
    fn page_done(&mut self, p: usize, error: Option<Error>) {
        let pr = self.parent(p);
        if let Some(e) = error {
            pr.error.get_or_insert(e);
        }
        pr.pending -= 1;
        if pr.pending == 0 {
            self.finish(p);
        }
    }

    /// Reaps the device's completions into the parents, and finishes the
    /// parents that are done.
    fn pump(&mut self) {
        self.feed();
        let mut reaped = std::mem::take(&mut self.reaped);
        self.inner.reap(&mut reaped);
        for c in reaped.drain(..) {
            let t = c.tag as usize;
            let sub = self.subs[t]
                .take()
                .expect("a completion of a live sub-request");
            self.free_subs.push(t);
            match sub {
                Sub::Page { p, i, loc } => {
                    let page = self.page() as u64;
                    let (op, offset) = {
                        let pr = self.parent(p);
                        (pr.op, pr.offset)
                    };
                    match op {
                        OpKind::Read => self.remap.read_done(loc),
                        _ => {
                            let logical = offset / page + i as u64;
                            self.remap.write_done(logical, loc, c.result.is_ok(), None);
                        }
                    }
                    self.page_back(p, c.buf);
                    self.page_done(p, c.result.err());
                }
                Sub::Packed { p, i, loc, page } => {
                    self.remap.read_done(loc);
                    let logical = self.parent(p).offset / self.page() as u64 + i as u64;
                    let unpacked = c.result.and_then(|_| {
                        let bounce = c.buf.as_ref().and_then(IoBuf::as_owned).ok_or_else(|| {
                            Error::InvalidArgument("a read handed back no buffer".into())
                        })?;
                        // SAFETY: this queue holds the caller's buffer for
                        // a read until its completion; no request holds
                        // this page of it (its read went to `bounce`).
                        let out = unsafe { page.bytes_mut() };
                        decompress_page(bounce, out).map_err(|what| Error::Corrupt {
                            page: logical,
                            what: format!("out-of-place extent at byte {}: {what}", c.offset),
                        })
                    });
                    self.page_back(p, Some(page));
                    self.page_done(p, unpacked.err());
                }
                Sub::Chunk(chunk) => {
                    let ok = c.result.is_ok();
                    // Every page is mapped before any parent finishes (a
                    // durable parent's barrier must cover them all).
                    self.remap.chunk_written(&chunk, ok);
                    let len = c.buf.as_ref().map_or(0, IoBuf::len);
                    for placed in &chunk.placed {
                        let p = (placed.owner >> INDEX_BITS) as usize;
                        let error = c
                            .result
                            .as_ref()
                            .err()
                            .map(|e| share_error(e, self.inner.device(), c.offset, len));
                        self.page_done(p, error);
                    }
                }
            }
        }
        self.reaped = reaped;
        self.feed();
        // Sub-requests fed from the backlog go out now: the worker submits
        // only when this queue counts parents not yet sent, and these
        // belong to parents sent already (a request of more pages than the
        // device's queue holds hung for good without this: the worker slept
        // with them queued and nothing in flight). A failed submit leaves
        // them queued; `ready_in` then brings the worker back.
        if self.inner.queued() > 0 {
            let _ = self.inner.submit();
        }
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

/// The failure of a chunk's write, told to each request that had a page
/// in it (errors are not `Clone`: the errno, or the message, carries
/// over).
fn share_error(e: &Error, device: usize, offset: u64, len: usize) -> Error {
    let source = match e {
        Error::NoSpace(m) => return Error::NoSpace(m.clone()),
        Error::Io { source, .. } => match source.raw_os_error() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(source.kind(), source.to_string()),
        },
        other => std::io::Error::other(other.to_string()),
    };
    Error::Io {
        op: OpKind::Write,
        device,
        offset,
        len,
        source,
    }
}

impl RemapQueue {
    /// Ends `sub` as failed, without I/O: its extent's write or read is
    /// given up on, its chunk released.
    fn abandon(&mut self, sub: Sub) {
        match sub {
            Sub::Page { p, i, loc } => {
                let page = self.page() as u64;
                match self.parents[p].as_ref().map(|pr| (pr.op, pr.offset)) {
                    Some((OpKind::Read, _)) | None => self.remap.read_done(loc),
                    Some((_, offset)) => {
                        self.remap
                            .write_done(offset / page + i as u64, loc, false, None)
                    }
                }
            }
            Sub::Packed { loc, .. } => self.remap.read_done(loc),
            Sub::Chunk(c) => self.remap.chunk_written(&c, false),
        }
    }
}

impl Drop for RemapQueue {
    fn drop(&mut self) {
        // Chunks and requests never sent: their pages were never written
        // (or read), and their segments must not stay pending or pinned.
        for c in self.chunks.iter_mut().filter_map(Option::take) {
            self.remap.chunk_written(&c, false);
        }
        let unsent: Vec<Request> = self.backlog.drain(..).collect();
        for req in unsent {
            if let Some(sub) = self.subs.get_mut(req.tag as usize).and_then(Option::take) {
                self.free_subs.push(req.tag as usize);
                self.abandon(sub);
            }
        }
        // Requests in flight end as they complete (no write of a segment
        // lands after its room was given back), for as long as the device
        // answers; what it never answers is given up on.
        for _ in 0..100 {
            if self.inner.in_flight() + self.inner.queued() == 0 {
                break;
            }
            let waited = self
                .inner
                .submit()
                .and_then(|_| self.inner.wait(1, Some(Duration::from_millis(100))));
            if waited.is_err() {
                break;
            }
            self.pump();
        }
        let left: Vec<Sub> = self.subs.iter_mut().filter_map(Option::take).collect();
        for sub in left {
            self.abandon(sub);
        }
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
        let req = Rejected::admit(req, &self.remap.alignment(), full, self.capacity(), false)?;
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
            // Held while its pages are dispatched: a collection on the way
            // reaps this queue's completions, and must not finish the
            // parent before all its pages went out.
            pending: 1,
            error: None,
        });
        let dispatched = self.dispatch(p);
        if let Err(e) = dispatched {
            self.parent(p).error.get_or_insert(e);
        }
        if self.parent(p).durable {
            // Its pages must not wait for a later submit in a chunk.
            self.close_chunks();
        }
        self.page_done(p, None);
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        self.close_chunks();
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

    fn unsent(&self) -> usize {
        self.queued + self.inner.unsent()
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
        let packing = self.chunks.iter().any(Option::is_some);
        let unsent = !self.backlog.is_empty() || self.inner.queued() > 0;
        if !self.ready.is_empty() || unsent || packing {
            return Some(Duration::ZERO);
        }
        self.inner.ready_in()
    }

    fn register_memory(&mut self, region: &Arc<AlignedBuf>) -> Result<bool> {
        self.inner.register_memory(region)
    }
}
