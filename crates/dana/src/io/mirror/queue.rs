//! One worker's queue to a mirrored device: each request fans out to the
//! copies' own queues, and one completion comes back when the copies have
//! answered.
//!
//! Owns: the requests of one worker to one mirrored group (*parents*) and
//! their sub-requests to the copies; the choice of copy for a read (the
//! least loaded healthy one); the retry of a failed or damaged read on
//! another copy and the rewrite of the bad copy before the read completes;
//! the comparison of every copy's version while the mirror verifies all
//! reads (recovery); the writes held back by the rebuild's fence; and the
//! write completions held until a copy's failure is recorded in the labels.
//!
//! A parent's tag goes back to the caller; a sub-request's tag is
//! `parent << 8 | copy << 3 | kind`. A parent slot is reused only after
//! every sub-request of it was reaped, so no late completion meets another
//! parent.
//!
//! Never: hands out a write's completion before every copy it went to has
//! answered, or a read's before the repair of a copy that answered it
//! badly has landed (a later write of the page could otherwise be
//! overwritten by the repair).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::array::{open_queue, Backend};
use super::super::{AlignedBuf, Completion, IoBuf, IoQueue, Placement, Rejected, Request};
use super::{CopyState, Mirror, LABEL_BYTES};
use crate::{Error, OpKind, Result};

/// What a sub-request does for its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    /// The read of one copy.
    Read = 0,
    /// A write (or a flush) to one copy.
    Write = 1,
    /// The rewrite of a copy that answered a read badly.
    Repair = 2,
    /// One copy's version, while every read is compared.
    Version = 3,
}

impl Sub {
    fn of(bits: u64) -> Sub {
        match bits {
            0 => Sub::Read,
            1 => Sub::Write,
            2 => Sub::Repair,
            _ => Sub::Version,
        }
    }
}

fn sub_tag(parent: usize, copy: usize, kind: Sub) -> u64 {
    (parent as u64) << 8 | (copy as u64) << 3 | kind as u64
}

/// How long a worker waits before looking again at writes held for a
/// label or a fence (both are rare: a copy failing, a rebuild's copy).
const POLL: Duration = Duration::from_millis(1);

/// A request of the caller's, and where its sub-requests are.
struct Parent {
    tag: u64,
    op: OpKind,
    offset: u64,
    len: usize,
    durable: bool,
    pages: bool,
    /// The write's class, passed to every copy's sub-request.
    placement: Placement,
    /// The one copy the caller asked for ([`Request::copy`]).
    only: Option<usize>,
    /// The caller's buffer, while no sub-request holds it.
    buf: Option<IoBuf>,
    /// The caller's buffer as a region that sub-requests share: (region,
    /// offset, owned).
    region: Option<(Arc<AlignedBuf>, usize, bool)>,
    /// Sub-requests pushed or held back, not yet answered.
    pending: usize,
    /// Copies that completed a write, or were read.
    done_mask: u64,
    /// Copies a read went to.
    tried: u64,
    /// Copies that answered a read with damaged pages or an error, to
    /// rewrite once another copy answered well.
    bad: u64,
    /// The error to report: the first error no other copy made up for.
    error: Option<Error>,
    /// A read answered with damaged pages by every copy: returned as read
    /// (the layer above reports the damage).
    damaged_only: bool,
    /// The rebuild fence's slot this write holds until it completes on
    /// every copy (see `dispatch_write`).
    fence_slot: Option<usize>,
    /// Each copy's version (compared reads).
    versions: Vec<(usize, Option<IoBuf>, Option<Error>)>,
    /// The copy whose version is read into the caller's buffer (compared
    /// reads).
    caller_copy: Option<usize>,
}

impl Parent {
    fn new(req: Request) -> Parent {
        let len = req.len();
        Parent {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len,
            durable: req.durable,
            pages: req.pages,
            placement: req.placement,
            only: req.copy.map(usize::from),
            buf: req.buf,
            region: None,
            pending: 0,
            done_mask: 0,
            tried: 0,
            bad: 0,
            error: None,
            damaged_only: false,
            fence_slot: None,
            versions: Vec::new(),
            caller_copy: None,
        }
    }

    /// The caller's buffer as a region, for sub-requests to share.
    fn share(&mut self) -> Option<(Arc<AlignedBuf>, usize)> {
        if self.region.is_none() {
            let buf = self.buf.take()?;
            self.region = Some(buf.into_region());
        }
        self.region.as_ref().map(|(r, o, _)| (r.clone(), *o))
    }

    /// The caller's buffer back in one piece.
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

/// Parent `p` of a queue, borrowing only the parents (the mirror and the
/// copies' queues stay usable beside it).
macro_rules! parent {
    ($q:expr, $p:expr) => {
        $q.parents[$p]
            .as_mut()
            .expect("a sub-request of a parent that is gone")
    };
}

/// The queue to one copy, and the device it was opened on.
struct CopyQueue {
    queue: Option<Box<dyn IoQueue>>,
    /// [`super::State::replaced`] of the device the queue is on.
    replaced: u64,
    /// The copy's device was replaced and this queue, still on the old
    /// one, could not be reopened yet (requests in flight): nothing may go
    /// to it.
    stale: bool,
}

impl CopyQueue {
    /// The queue, if requests may go to it.
    fn usable(&self) -> bool {
        self.queue.is_some() && !self.stale
    }
}

/// A worker's queue to a mirrored group.
pub struct MirrorQueue {
    mirror: Arc<Mirror>,
    backend: Backend,
    depth: u32,
    copies: Vec<CopyQueue>,
    /// [`Mirror::seq`] and the fence's release count when last looked at.
    seq: u64,
    released: u64,
    eventfd: Option<RawFd>,
    notify: bool,
    region: Option<Arc<AlignedBuf>>,
    parents: Vec<Option<Parent>>,
    free: Vec<usize>,
    /// Parents pushed and not submitted.
    queued: usize,
    /// Parents pushed and not yet handed out.
    outstanding: usize,
    /// Parents answered, to hand out.
    ready: VecDeque<Completion>,
    /// Write completions held until the labels record every failure.
    held: Vec<Completion>,
    /// Sub-writes held back by the rebuild's fence: (parent, copy, request).
    deferred: Vec<(usize, usize, Request)>,
    /// Sub-requests a copy's queue refused at push, answered at the next
    /// pump: answered inline, the last one could free its parent while
    /// the caller still looped over its copies (a panic; a review's
    /// finding).
    refused: Vec<Completion>,
    scratch: Vec<Completion>,
}

impl MirrorQueue {
    pub(super) fn new(mirror: Arc<Mirror>, backend: Backend, depth: u32) -> Result<MirrorQueue> {
        let n = mirror.copies();
        let mut q = MirrorQueue {
            seq: u64::MAX,
            released: mirror.fence.released.load(Ordering::SeqCst),
            mirror,
            backend,
            depth,
            copies: (0..n)
                .map(|_| CopyQueue {
                    queue: None,
                    replaced: 0,
                    stale: false,
                })
                .collect(),
            eventfd: None,
            notify: false,
            region: None,
            parents: Vec::new(),
            free: Vec::new(),
            queued: 0,
            outstanding: 0,
            ready: VecDeque::new(),
            held: Vec::new(),
            deferred: Vec::new(),
            refused: Vec::new(),
            scratch: Vec::new(),
        };
        q.refresh();
        if q.copies.iter().all(|c| c.queue.is_none()) {
            return Err(Error::Mirror(format!(
                "{}: no copy could be opened",
                q.mirror.role
            )));
        }
        Ok(q)
    }

    /// Opens queues to copies that became writable or whose device was
    /// replaced, when the mirror's state changed.
    fn refresh(&mut self) {
        let seq = self.mirror.seq.load(Ordering::SeqCst);
        if seq == self.seq {
            return;
        }
        self.seq = seq;
        let (states, targets, replaced) = {
            let s = self.mirror.lock();
            (s.states.clone(), s.targets.clone(), s.replaced.clone())
        };
        for c in 0..self.copies.len() {
            let cq = &mut self.copies[c];
            let stale = cq.queue.is_some() && cq.replaced != replaced[c];
            cq.stale = stale;
            let busy = cq
                .queue
                .as_ref()
                .is_some_and(|q| q.in_flight() + q.queued() > 0);
            if busy && stale {
                // Reopened once its requests are in: look again then.
                self.seq = u64::MAX;
            }
            if !states[c].writable() || (cq.queue.is_some() && !stale) || busy {
                continue;
            }
            let Some(target) = &targets[c] else {
                continue;
            };
            match self.open_copy(target) {
                Ok(q) => {
                    self.copies[c].queue = Some(q);
                    self.copies[c].replaced = replaced[c];
                    self.copies[c].stale = false;
                }
                Err(e) => {
                    self.copies[c].queue = None;
                    self.mirror.fail_copy(c, &e);
                }
            }
        }
    }

    fn open_copy(&self, target: &super::super::Target) -> Result<Box<dyn IoQueue>> {
        let mut q = open_queue(target, &self.backend, self.depth)?;
        if let Some(fd) = self.eventfd {
            q.attach_eventfd(fd)?;
        }
        if let Some(r) = &self.region {
            q.register_memory(r)?;
        }
        q.set_notify(self.notify);
        Ok(q)
    }

    /// Pushes a sub-request to copy `c`; a refusal counts as that copy's
    /// failure, answered at once.
    fn push_sub(&mut self, p: usize, c: usize, kind: Sub, mut req: Request) {
        req.tag = sub_tag(p, c, kind);
        req.offset += LABEL_BYTES;
        parent!(self, p).pending += 1;
        self.mirror.in_flight[c].fetch_add(1, Ordering::Relaxed);
        let pushed = match self.copies[c].queue.as_mut() {
            Some(q) => q.push(req).map_err(|r| (r.error, r.request)),
            None => Err((
                Error::Mirror(format!("{} copy {c} has no queue", self.mirror.role)),
                req,
            )),
        };
        if let Err((error, req)) = pushed {
            self.refused.push(Completion {
                tag: req.tag,
                op: req.op,
                offset: req.offset,
                buf: req.buf,
                result: Err(error),
            });
        }
    }

    /// The least loaded healthy copy not yet tried for parent `p`.
    fn pick_read_copy(&self, tried: u64, offset: u64) -> Option<usize> {
        let readable = self.mirror.readable.load(Ordering::SeqCst);
        (0..self.copies.len())
            .filter(|&c| readable & (1 << c) != 0 && tried & (1 << c) == 0)
            .filter(|&c| self.copies[c].usable())
            .min_by_key(|&c| {
                // Ties alternate by block, so equal loads spread.
                let load = self.mirror.in_flight[c].load(Ordering::Relaxed);
                let spread = ((offset / 4096) as usize + c) % self.copies.len();
                (load, spread)
            })
    }

    /// Copies that hold `[offset, offset + len)`: healthy ones, and a
    /// rebuilding one below what it has rebuilt.
    fn holders(&self, offset: u64, len: usize) -> Vec<usize> {
        let s = self.mirror.lock();
        (0..self.copies.len())
            .filter(|&c| self.copies[c].usable())
            .filter(|&c| match s.states[c] {
                CopyState::Healthy => true,
                CopyState::Rebuilding { done } => offset + len as u64 <= done,
                CopyState::Failed => false,
            })
            .collect()
    }

    fn dispatch_read(&mut self, p: usize) {
        let (tried, offset, only) = {
            let pr = parent!(self, p);
            (pr.tried, pr.offset, pr.only)
        };
        // A read of one copy tries that one alone.
        let tried = match only {
            Some(c) => tried | !(1u64 << c),
            None => tried,
        };
        let Some(c) = self.pick_read_copy(tried, offset) else {
            return self.finish_read_without_copy(p);
        };
        let pr = parent!(self, p);
        pr.tried |= 1 << c;
        let buf = pr
            .buf
            .take()
            .expect("a read's buffer is home between copies");
        let mut req = Request::read(0, pr.offset, buf);
        req.pages = pr.pages;
        self.push_sub(p, c, Sub::Read, req);
    }

    /// No copy left to read: the damaged bytes of the last copy (the layer
    /// above reports the damage), or the error.
    fn finish_read_without_copy(&mut self, p: usize) {
        let pr = parent!(self, p);
        if pr.damaged_only && pr.buf.is_some() {
            pr.error = None;
        } else if pr.error.is_none() {
            pr.error = Some(Error::Mirror(format!(
                "{}: no healthy copy to read from",
                self.mirror.role
            )));
        }
        self.finish(p);
    }

    fn dispatch_compared(&mut self, p: usize, holders: Vec<usize>) {
        let (offset, len, mem) = {
            let pr = parent!(self, p);
            (pr.offset, pr.len, self.mirror.alignment().mem as usize)
        };
        for (i, &c) in holders.iter().enumerate() {
            let buf = if i == 0 {
                parent!(self, p).caller_copy = Some(c);
                parent!(self, p).buf.take()
            } else {
                AlignedBuf::new(len, mem.max(4096)).ok().map(IoBuf::owned)
            };
            let Some(buf) = buf else {
                // No memory for a version: compare what the others give.
                continue;
            };
            parent!(self, p).tried |= 1 << c;
            self.push_sub(p, c, Sub::Version, Request::read(0, offset, buf));
        }
    }

    /// Sends a write (or flush) to every working copy. A write registers
    /// with the rebuild's fence before any part of it goes out and stays
    /// registered until every copy has it: a rebuild copies a range from a
    /// healthy copy only after the
    /// writes that started before the range was fenced completed on every
    /// copy (else it could read a healthy copy before such a write landed
    /// there, and overwrite the rebuilding copy's newer bytes with the
    /// older: a test caught exactly that with the registration dropped at
    /// the rebuilding copy's completion). A write that meets the fenced
    /// range goes to the rebuilding copy only after the range's copy
    /// landed (held back here); it gives its registration up at once,
    /// since the rebuild waits for the registered writes before it
    /// releases the range.
    ///
    /// It registers first, then reads which copies to write and which
    /// rebuild: registered in the epoch before a rebuild's fence, the
    /// rebuild waits for it whatever copies it chose; registered after,
    /// it sees the rebuilding copy and the fenced range. Registered after
    /// reading them (until 2026-11-29), a write preempted in between saw
    /// the copy still failed, registered in the fence's new epoch, which
    /// the rebuild does not wait for, and went to the healthy copy alone
    /// after the rebuild had copied that range: acknowledged, and missing
    /// from a copy marked healthy (a helper's finding, from a test that
    /// failed once under load).
    fn dispatch_write(&mut self, p: usize) {
        if parent!(self, p).op == OpKind::Write {
            // Every write registers, rebuild or not: one that went out
            // before a copy became writable reaches only the healthy
            // copies, and the rebuild must still wait for it to land there
            // before it reads them (a test lost a log flush that way).
            let slot = self.mirror.fence.start();
            parent!(self, p).fence_slot = Some(slot);
        }
        // The masks are published after the change count moves
        // (`Mirror::publish`): a mask read here that names a copy made
        // writable by a change is followed by a count that shows the
        // change, so the queues are reopened before the copy is written.
        let mut writable = self.mirror.writable.load(Ordering::SeqCst);
        for _ in 0..4 {
            if self.mirror.seq.load(Ordering::SeqCst) == self.seq {
                break;
            }
            self.refresh();
            writable = self.mirror.writable.load(Ordering::SeqCst);
        }
        if let Some(c) = parent!(self, p).only {
            writable &= 1 << c;
        }
        // A writable copy without a usable queue cannot take this write: it
        // fails, rather than miss the write and later pass for a copy that
        // holds it (a rebuild that saw it fail starts over).
        for c in 0..self.copies.len() {
            if writable & (1 << c) != 0 && !self.copies[c].usable() {
                let e = Error::Mirror(format!(
                    "{} copy {c}: no queue to its device",
                    self.mirror.role
                ));
                self.mirror.fail_copy(c, &e);
                writable &= !(1 << c);
            }
        }
        let targets: Vec<usize> = (0..self.copies.len())
            .filter(|&c| writable & (1 << c) != 0)
            .collect();
        if targets.is_empty() {
            let pr = parent!(self, p);
            pr.error = Some(Error::Mirror(format!(
                "{}: no working copy to write to",
                self.mirror.role
            )));
            return self.finish(p);
        }
        let rebuilding = self.mirror.rebuilding.load(Ordering::SeqCst) & writable;
        #[cfg(test)]
        self.mirror.run_dispatch_pause();
        let (op, offset, len) = {
            let pr = parent!(self, p);
            (pr.op, pr.offset, pr.len as u64)
        };
        let mut hold_back = false;
        if op == OpKind::Write && rebuilding != 0 && self.mirror.fence.blocks(offset, len) {
            if let Some(slot) = parent!(self, p).fence_slot.take() {
                self.mirror.fence.finish(slot);
            }
            hold_back = true;
        }
        for c in targets {
            let req = self.sub_write(p);
            if hold_back && rebuilding & (1 << c) != 0 {
                parent!(self, p).pending += 1;
                self.deferred.push((p, c, req));
            } else {
                self.push_sub(p, c, Sub::Write, req);
            }
        }
    }

    /// A sub-request doing parent `p`'s write (or flush) from its buffer.
    fn sub_write(&mut self, p: usize) -> Request {
        let pr = parent!(self, p);
        let (op, offset, len, durable, placement) =
            (pr.op, pr.offset, pr.len, pr.durable, pr.placement);
        match op {
            OpKind::Flush => Request::flush(0),
            _ => {
                let (region, at) = pr.share().expect("a write carries a buffer");
                // SAFETY: the caller of the parent request guarantees
                // nobody writes its buffer until the parent completes, and
                // the parent completes only after this sub-request.
                let buf = unsafe { IoBuf::shared(region, at, len) }
                    .expect("a sub-request covers its parent's buffer");
                let mut req = Request::write(0, offset, buf).placed(placement);
                req.durable = durable;
                req
            }
        }
    }

    /// Sends writes the fence held back, once the range they meet is
    /// copied.
    fn release_deferred(&mut self) {
        let released = self.mirror.fence.released.load(Ordering::SeqCst);
        if released == self.released || self.deferred.is_empty() {
            self.released = released;
            return;
        }
        self.released = released;
        let writable = self.mirror.writable.load(Ordering::SeqCst);
        for (p, c, req) in std::mem::take(&mut self.deferred) {
            parent!(self, p).pending -= 1;
            if writable & (1 << c) == 0 || !self.copies[c].usable() {
                // The copy failed meanwhile: the write is done without it.
                self.settle(p);
                continue;
            }
            // Registered again, as in `dispatch_write`: its part on the
            // healthy copies may not have landed yet, and a write across
            // two ranges meets the next one the rebuild fences, which
            // must wait for it before it reads them (unregistered, the
            // rebuild could copy the older bytes over it; a review's
            // finding).
            let fence = &self.mirror.fence;
            let slot = fence.start();
            if fence.blocks(req.offset, req.len() as u64) {
                // Another range meets it now (the rebuild restarted, or
                // the write spans the next range).
                fence.finish(slot);
                parent!(self, p).pending += 1;
                self.deferred.push((p, c, req));
                continue;
            }
            let pr = parent!(self, p);
            if pr.fence_slot.is_none() {
                pr.fence_slot = Some(slot);
            } else {
                fence.finish(slot);
            }
            self.push_sub(p, c, Sub::Write, req);
        }
    }

    /// Handles one sub-request's answer.
    fn answer(&mut self, mut comp: Completion) {
        let p = (comp.tag >> 8) as usize;
        let c = ((comp.tag >> 3) & 7) as usize;
        let kind = Sub::of(comp.tag & 7);
        self.mirror.in_flight[c].fetch_sub(1, Ordering::Relaxed);
        let mirror = self.mirror.clone();
        let counters = &mirror.counters[c];
        parent!(self, p).pending -= 1;
        match kind {
            Sub::Read => {
                let verdict = comp.result.as_ref().map(|_| ()).map_err(|e| e.duplicate());
                let buf = comp.buf.take();
                let pages = parent!(self, p).pages;
                let damaged = verdict.is_ok() && pages && !self.pages_valid(p, buf.as_ref());
                let pr = parent!(self, p);
                pr.buf = buf;
                match verdict {
                    Ok(()) if !damaged => {
                        counters.reads.fetch_add(1, Ordering::Relaxed);
                        pr.done_mask |= 1 << c;
                        pr.error = None;
                        pr.damaged_only = false;
                        if pr.bad != 0 {
                            return self.repair(p);
                        }
                        return self.finish(p);
                    }
                    Ok(()) => {
                        mirror.mismatches.fetch_add(1, Ordering::Relaxed);
                        pr.bad |= 1 << c;
                        if pr.error.is_none() {
                            pr.damaged_only = true;
                        }
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        pr.bad |= 1 << c;
                        if pr.error.is_none() && !pr.damaged_only {
                            pr.error = Some(e);
                        }
                    }
                }
                if parent!(self, p).buf.is_none() {
                    // A read that came back without its buffer (a bug of a
                    // backend): nothing to read into again.
                    return self.finish(p);
                }
                self.dispatch_read(p);
            }
            Sub::Version => {
                let error = comp.result.as_ref().err().map(Error::duplicate);
                parent!(self, p).versions.push((c, comp.buf.take(), error));
                if parent!(self, p).pending == 0 {
                    self.compare(p);
                }
            }
            Sub::Write => {
                match comp.result {
                    Ok(_) => {
                        if comp.op == OpKind::Write {
                            counters.writes.fetch_add(1, Ordering::Relaxed);
                        }
                        parent!(self, p).done_mask |= 1 << c;
                    }
                    Err(e) => {
                        if !mirror.fail_copy(c, &e) {
                            // The last healthy copy failed: the caller
                            // gets its error.
                            let pr = parent!(self, p);
                            if pr.error.is_none() {
                                pr.error = Some(e);
                            }
                        }
                    }
                }
                drop(comp.buf);
                self.settle(p);
            }
            Sub::Repair => {
                match comp.result {
                    Ok(_) => {
                        counters.repairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        // A copy that cannot take a repair is failing.
                        mirror.fail_copy(c, &e);
                    }
                }
                drop(comp.buf);
                if parent!(self, p).pending == 0 {
                    self.finish(p);
                }
            }
        }
    }

    /// Finishes a write or flush once every copy answered: done if a copy
    /// took it and no failure was left to the caller.
    fn settle(&mut self, p: usize) {
        let pr = parent!(self, p);
        if pr.pending > 0 {
            return;
        }
        if pr.done_mask == 0 && pr.error.is_none() {
            pr.error = Some(Error::Mirror(format!(
                "{}: no copy took the {}",
                self.mirror.role, pr.op
            )));
        }
        self.finish(p);
    }

    /// True if every page of `buf` passes the installed check (no check:
    /// true).
    fn pages_valid(&mut self, p: usize, buf: Option<&IoBuf>) -> bool {
        let Some(check) = self.mirror.page_check() else {
            return true;
        };
        let Some(buf) = buf else {
            return false;
        };
        let offset = parent!(self, p).offset;
        let ps = check.page_size();
        // SAFETY: the read completed and its parent has not: the buffer is
        // this queue's until the parent's completion is handed out.
        let bytes = unsafe { buf.bytes() };
        bytes
            .chunks(ps)
            .enumerate()
            .all(|(i, page)| check.check(offset + (i * ps) as u64, page).is_some())
    }

    /// Rewrites the copies that answered parent `p`'s read badly with the
    /// bytes read from a good one; the read completes after.
    fn repair(&mut self, p: usize) {
        let (bad, offset, len) = {
            let pr = parent!(self, p);
            (std::mem::take(&mut pr.bad), pr.offset, pr.len)
        };
        // Nothing is repaired before the labels the open deferred are
        // written (a read during the open's checks leaves the copies as
        // they are if the open is then refused; the repair is at best).
        if self.mirror.read_only.load(Ordering::SeqCst) || self.mirror.commit_open_labels().is_err()
        {
            return self.finish(p);
        }
        let writable = self.mirror.writable.load(Ordering::SeqCst);
        let copies: Vec<usize> = (0..self.copies.len())
            .filter(|&c| bad & (1 << c) != 0 && writable & (1 << c) != 0)
            .collect();
        for c in copies {
            let (region, at) = parent!(self, p).share().expect("a read carries a buffer");
            // SAFETY: the read is answered and its parent not handed out:
            // nobody else touches the buffer; repairs only read it.
            let buf = unsafe { IoBuf::shared(region, at, len) }
                .expect("a repair covers its read's buffer");
            self.push_sub(p, c, Sub::Repair, Request::write(0, offset, buf));
        }
        if parent!(self, p).pending == 0 {
            self.finish(p);
        }
    }

    /// Every copy's version of a compared read is in: the best goes into
    /// the caller's buffer and over every copy that differs.
    fn compare(&mut self, p: usize) {
        let check = self.mirror.page_check();
        let pr = parent!(self, p);
        let mut versions = std::mem::take(&mut pr.versions);
        let (offset, caller_copy) = (pr.offset, pr.caller_copy);
        let Some(ci) = versions.iter().position(|v| Some(v.0) == caller_copy) else {
            pr.error = Some(Error::Mirror("a compared read lost its buffer".into()));
            return self.finish(p);
        };
        let good: Vec<usize> = (0..versions.len())
            .filter(|&i| versions[i].2.is_none() && versions[i].1.is_some())
            .collect();
        if good.is_empty() {
            let error = versions.iter_mut().find_map(|v| v.2.take());
            let pr = parent!(self, p);
            pr.buf = versions.swap_remove(ci).1;
            pr.error =
                error.or_else(|| Some(Error::Mirror("a compared read got no version".into())));
            return self.finish(p);
        }
        let (best, bad) = {
            let bytes: Vec<&[u8]> = good
                .iter()
                .map(|&i| {
                    let v = versions[i].1.as_ref().expect("a good version");
                    // SAFETY: every version's read completed and the parent
                    // has not: these buffers are this queue's alone.
                    unsafe { v.bytes() }
                })
                .collect();
            let len = bytes[0].len();
            let unit = check
                .as_ref()
                .map_or(len, |k| k.page_size().min(len))
                .max(1);
            // The best version of each page: a valid page with the highest
            // LSN (the lowest copy on a tie), else the first copy's bytes.
            let mut best = vec![0u8; len];
            let mut bad = 0u64;
            for at in (0..len).step_by(unit) {
                let end = (at + unit).min(len);
                let pick = check
                    .as_ref()
                    .and_then(|k| {
                        (0..bytes.len())
                            .filter_map(|g| {
                                k.check(offset + at as u64, &bytes[g][at..end])
                                    .map(|l| (l, g))
                            })
                            .max_by_key(|&(lsn, g)| (lsn, std::cmp::Reverse(g)))
                            .map(|(_, g)| g)
                    })
                    .unwrap_or(0);
                best[at..end].copy_from_slice(&bytes[pick][at..end]);
                for (g, b) in bytes.iter().enumerate() {
                    if b[at..end] != best[at..end] {
                        bad |= 1 << versions[good[g]].0;
                    }
                }
            }
            for v in versions.iter().filter(|v| v.2.is_some()) {
                bad |= 1 << v.0;
            }
            (best, bad)
        };
        for &i in &good {
            self.mirror.counters[versions[i].0]
                .reads
                .fetch_add(1, Ordering::Relaxed);
        }
        if bad != 0 {
            self.mirror.mismatches.fetch_add(1, Ordering::Relaxed);
        }
        let Some(caller) = versions.swap_remove(ci).1 else {
            let pr = parent!(self, p);
            pr.error = Some(Error::Mirror("a compared read lost its buffer".into()));
            return self.finish(p);
        };
        // SAFETY: as above: the read is answered, the parent is not.
        unsafe { caller.bytes_mut() }.copy_from_slice(&best);
        let pr = parent!(self, p);
        pr.buf = Some(caller);
        pr.bad = bad;
        if bad != 0 {
            return self.repair(p);
        }
        self.finish(p);
    }

    /// Hands parent `p`'s completion out (or holds a write's until the
    /// labels record every failure) and frees its slot.
    fn finish(&mut self, p: usize) {
        let mut pr = self.parents[p].take().expect("a parent finished twice");
        debug_assert_eq!(pr.pending, 0, "a parent finished with sub-requests out");
        if let Some(slot) = pr.fence_slot.take() {
            self.mirror.fence.finish(slot);
        }
        self.free.push(p);
        let buf = match pr.take_buf() {
            Ok(b) => b,
            Err(e) => {
                pr.error.get_or_insert(e);
                None
            }
        };
        let result = match pr.error.take() {
            Some(e) => Err(e),
            None => Ok(if pr.op == OpKind::Flush { 0 } else { pr.len }),
        };
        let c = Completion {
            tag: pr.tag,
            op: pr.op,
            offset: pr.offset,
            buf,
            result,
        };
        if pr.op != OpKind::Read && !self.mirror.labels_durable() {
            self.held.push(c);
        } else {
            self.ready.push_back(c);
        }
    }

    /// Reaps the copies' queues and answers their sub-requests; releases
    /// fenced and held requests whose wait is over.
    fn pump(&mut self) {
        self.refresh();
        self.release_deferred();
        // Bounded: a refused retry joins the list for the next pump.
        for comp in std::mem::take(&mut self.refused) {
            self.answer(comp);
        }
        for c in 0..self.copies.len() {
            let Some(q) = self.copies[c].queue.as_mut() else {
                continue;
            };
            q.reap(&mut self.scratch);
            for comp in std::mem::take(&mut self.scratch) {
                self.answer(comp);
            }
        }
        // Retries and repairs queued while answering go out now.
        for cq in &mut self.copies {
            if let Some(q) = cq.queue.as_mut().filter(|q| q.queued() > 0) {
                if let Err(e) = q.submit() {
                    // The queue could not reach the kernel: its requests
                    // come back as errors at the next reap (the backends
                    // fail what they cannot submit).
                    let _ = e;
                }
            }
        }
        if !self.held.is_empty() {
            if let Some(e) = self.mirror.label_failure() {
                for mut c in self.held.drain(..) {
                    c.result = Err(e.duplicate());
                    self.ready.push_back(c);
                }
            } else if self.mirror.labels_durable() {
                self.ready.extend(self.held.drain(..));
            }
        }
    }
}

impl IoQueue for MirrorQueue {
    fn device(&self) -> usize {
        self.mirror.index
    }

    fn backend(&self) -> &'static str {
        "mirror"
    }

    fn capacity(&self) -> usize {
        self.copies
            .iter()
            .filter_map(|c| c.queue.as_ref().map(|q| q.capacity()))
            .min()
            .unwrap_or(self.depth as usize)
    }

    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected> {
        self.refresh();
        let full = self.outstanding >= self.capacity();
        // A write on a read-only open is refused here: sent on, the
        // copies' files (opened without write access) answered EBADF, the
        // copy was failed in memory, and its completion was held for a
        // label update a read-only open never writes.
        let read_only = self.mirror.read_only.load(Ordering::SeqCst);
        let req = Rejected::admit(
            req,
            &self.mirror.alignment(),
            full,
            self.capacity(),
            read_only,
        )?;
        // The labels the open deferred go first: no copy changes before
        // they say which copies are current (a read's repairs: `repair`).
        if req.op != OpKind::Read {
            if let Err(error) = self.mirror.commit_open_labels() {
                return Err(Rejected {
                    error,
                    request: req,
                });
            }
        }
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                self.parents.push(None);
                self.parents.len() - 1
            }
        };
        let op = req.op;
        let (offset, len) = (req.offset, req.len());
        self.parents[p] = Some(Parent::new(req));
        self.outstanding += 1;
        self.queued += 1;
        match op {
            OpKind::Read => {
                let holders = self.holders(offset, len);
                let one = parent!(self, p).only.is_some();
                if self.mirror.verify_all.load(Ordering::SeqCst) && holders.len() > 1 && !one {
                    self.dispatch_compared(p, holders);
                    if self.parents[p].as_ref().is_some_and(|pr| pr.pending == 0) {
                        self.finish_read_without_copy(p);
                    }
                } else {
                    self.dispatch_read(p);
                }
            }
            OpKind::Write | OpKind::Flush => self.dispatch_write(p),
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        self.release_deferred();
        let mut first_err = None;
        for cq in &mut self.copies {
            if let Some(q) = cq.queue.as_mut() {
                if let Err(e) = q.submit() {
                    first_err.get_or_insert(e);
                }
            }
        }
        let n = std::mem::take(&mut self.queued);
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
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
        loop {
            self.pump();
            let want = min.min(self.in_flight());
            if self.ready.len() >= want || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            let busy = self
                .copies
                .iter_mut()
                .filter_map(|c| c.queue.as_mut())
                .find(|q| q.in_flight() + q.queued() > 0);
            match busy {
                Some(q) => q.wait(1, Some(POLL))?,
                None => std::thread::sleep(POLL),
            }
        }
    }

    fn queued(&self) -> usize {
        self.queued
    }

    fn unsent(&self) -> usize {
        self.queued
            + self
                .copies
                .iter()
                .filter_map(|c| c.queue.as_ref())
                .map(|q| q.unsent())
                .sum::<usize>()
    }

    fn in_flight(&self) -> usize {
        self.outstanding - self.queued
    }

    fn attach_eventfd(&mut self, eventfd: RawFd) -> Result<()> {
        self.eventfd = Some(eventfd);
        for q in self.copies.iter_mut().filter_map(|c| c.queue.as_mut()) {
            q.attach_eventfd(eventfd)?;
        }
        Ok(())
    }

    fn set_notify(&mut self, on: bool) {
        self.notify = on;
        for q in self.copies.iter_mut().filter_map(|c| c.queue.as_mut()) {
            q.set_notify(on);
        }
    }

    fn ready_in(&self) -> Option<Duration> {
        if !self.ready.is_empty() || !self.refused.is_empty() {
            return Some(Duration::ZERO);
        }
        let inner = self
            .copies
            .iter()
            .filter_map(|c| c.queue.as_ref())
            .filter(|q| q.in_flight() + q.queued() > 0)
            .filter_map(|q| q.ready_in())
            .min();
        if !self.held.is_empty() || !self.deferred.is_empty() {
            return Some(inner.map_or(POLL, |d| d.min(POLL)));
        }
        inner
    }

    fn register_memory(&mut self, region: &Arc<AlignedBuf>) -> Result<bool> {
        self.region = Some(region.clone());
        let mut all = true;
        for q in self.copies.iter_mut().filter_map(|c| c.queue.as_mut()) {
            all &= q.register_memory(region)?;
        }
        Ok(all)
    }
}
