//! The online rebuild of one copy of a mirrored group from its healthy
//! copies, while the engine goes on reading and writing.
//!
//! Owns: the copy loop, the fence that orders it with the engine's writes,
//! and the rebuild's progress in the labels. Never: reads the copy being
//! rebuilt, or lets a range copied from a healthy copy land over a newer
//! write of the engine.
//!
//! The copy goes in ranges of [`RANGE`] bytes. For each range:
//! 1. the range is *fenced*: a write to it that starts from now on goes to
//!    the healthy copies at once and to the rebuilding copy only after the
//!    range is copied (the queues hold that part back, `queue.rs`);
//! 2. the epoch turns and the rebuild waits until every write to the
//!    rebuilding copy that started before the fence has completed;
//! 3. the range is read from a healthy copy (it holds every write that
//!    completed, and perhaps some of those in flight: either is fine,
//!    since a held-back write lands after) and written to the copy;
//! 4. the fence is released and the held-back writes go out.
//!
//! Every [`RECORD_EVERY`] bytes (and at the end) the copy is synced and its
//! progress recorded in every working copy's label, so a rebuild cut by a
//! crash or a close resumes from the last recorded range (writes below it
//! reached the copy like any copy, and recovery compares the copies of
//! what it touches: `Mirror::set_verify_all`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::array::{open_queue, Backend, Target};
use super::super::device::{Device, DeviceOptions};
use super::super::{AlignedBuf, IoBuf, Request};
use super::{sync_io, CopyState, Mirror, Role, LABEL_BYTES};
use crate::{Error, Result};

/// Bytes copied per fenced range.
const RANGE: u64 = 1 << 20;
/// Bytes between two records of the progress in the labels.
const RECORD_EVERY: u64 = 64 << 20;
/// Longest wait for the writes that started before a fence.
const FENCE_WAIT: Duration = Duration::from_secs(60);

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildReport {
    /// The group.
    pub role: Role,
    /// The copy rebuilt.
    pub copy: usize,
    /// Where it started (bytes already rebuilt when it resumed; 0 for a
    /// new rebuild).
    pub resumed_from: u64,
    /// Bytes copied by this run.
    pub bytes: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Releases the fence however the copy of a range ends.
struct FenceGuard<'a>(&'a Mirror);

impl Drop for FenceGuard<'_> {
    fn drop(&mut self) {
        let f = &self.0.fence;
        f.hi.store(0, Ordering::SeqCst);
        f.lo.store(0, Ordering::SeqCst);
        f.released.fetch_add(1, Ordering::SeqCst);
    }
}

impl Mirror {
    /// Rebuilds copy `c` (failed, or rebuilding after a crash or a close)
    /// from the healthy copies, online: call it from a thread of its own
    /// while the engine serves. A failed copy is rebuilt onto the device
    /// [`Mirror::replace_copy`] gave it, else onto the file at its path
    /// (reopened if the file there was replaced, created if missing).
    /// Returns once the copy is healthy; a copy already healthy returns at
    /// once. When `stop` is set, the rebuild records its progress and
    /// returns [`Error::Shutdown`] (the next rebuild of the copy resumes
    /// there). Blocking; one rebuild of a group at a time.
    pub fn rebuild(self: &Arc<Self>, c: usize, stop: &AtomicBool) -> Result<RebuildReport> {
        let _one_at_a_time = self.rebuild_lock.lock().unwrap_or_else(|e| e.into_inner());
        if c >= self.copies() {
            return Err(Error::InvalidArgument(format!(
                "{}: no copy {c} (it has {})",
                self.role,
                self.copies()
            )));
        }
        if self.read_only.load(Ordering::SeqCst) {
            return Err(Error::ReadOnly);
        }
        let started = Instant::now();
        let from = match self.states()[c] {
            CopyState::Healthy => {
                return Ok(RebuildReport {
                    role: self.role,
                    copy: c,
                    resumed_from: 0,
                    bytes: 0,
                    seconds: 0.0,
                })
            }
            CopyState::Rebuilding { done } => done,
            CopyState::Failed => {
                let _no_growth = self.growth.lock().unwrap_or_else(|e| e.into_inner());
                self.prepare_copy(c)?;
                self.set_state(c, CopyState::Rebuilding { done: 0 })?;
                0
            }
        };
        let target = self.targets()[c]
            .clone()
            .ok_or_else(|| Error::Mirror(format!("{} copy {c} has no device", self.role)))?;
        let mut to = open_queue(&target, &Backend::Blocking, 2)?;
        let mut done = from;
        let mut recorded = from;
        loop {
            if stop.load(Ordering::SeqCst) {
                self.record_progress(c, done, to.as_mut())?;
                return Err(Error::Shutdown);
            }
            // The healthy copies' size, grown onto this copy first: a
            // growth between `prepare_copy` and the Rebuilding state left
            // it out (a failed copy is not grown), and a copy rebuilt to
            // the old size alone would make the device that much shorter
            // (a growing log's file then reads as cut short).
            let size = self.healthy_size().ok_or_else(|| {
                Error::Mirror(format!(
                    "{}: no healthy copy to rebuild copy {c} from",
                    self.role
                ))
            })?;
            if target.size() < LABEL_BYTES + size {
                if let Err(e) = target.grow(LABEL_BYTES + size) {
                    self.fail_copy(c, &e);
                    return Err(e);
                }
            }
            if done >= size {
                break;
            }
            if !is_rebuilding(self.states()[c]) {
                return Err(Error::Mirror(format!(
                    "{} copy {c} failed during its rebuild",
                    self.role
                )));
            }
            let hi = (done + RANGE).min(size);
            {
                let _fence = self.fence_range(done, hi)?;
                let bytes = self.read_healthy(done, (hi - done) as usize)?;
                let written = sync_io(
                    to.as_mut(),
                    Request::write(0, done + LABEL_BYTES, IoBuf::owned(bytes)),
                )
                .and_then(|c| c.result);
                if let Err(e) = written {
                    self.fail_copy(c, &e);
                    return Err(e);
                }
            }
            done = hi;
            self.set_progress(c, done);
            if done - recorded >= RECORD_EVERY {
                self.record_progress(c, done, to.as_mut())?;
                recorded = done;
            }
        }
        if let Err(e) = sync_io(to.as_mut(), Request::flush(0)).and_then(|c| c.result) {
            self.fail_copy(c, &e);
            return Err(e);
        }
        // Healthy only if nothing failed the copy meanwhile (a write it
        // could not take): else its bytes may lack that write.
        self.set_state_if(c, CopyState::Healthy, is_rebuilding)?;
        self.lock().failures[c] = None;
        Ok(RebuildReport {
            role: self.role,
            copy: c,
            resumed_from: from,
            bytes: done - from,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Gives failed copy `c` a device to rebuild onto, grown to the
    /// group's size.
    fn prepare_copy(&self, c: usize) -> Result<()> {
        let current = self.targets()[c].clone();
        let target = match (self.copy_path(c), current) {
            (Some(path), current) => {
                let same_file = match (&current, std::fs::metadata(path)) {
                    (Some(Target::File(d)), Ok(m)) => same_inode(d, &m),
                    _ => false,
                };
                match current {
                    Some(t) if same_file => t,
                    _ => {
                        let opts = DeviceOptions {
                            direct: true,
                            create_size: Some(LABEL_BYTES + self.size()),
                            read_only: false,
                            lock: true,
                        };
                        let d = Device::open(path, self.index, opts)?;
                        let t = Target::File(Arc::new(d));
                        self.replace_copy(c, t.clone())?;
                        t
                    }
                }
            }
            (None, Some(t)) => t,
            (None, None) => {
                return Err(Error::Mirror(format!(
                    "{} copy {c} has no device to rebuild onto (give it one with \
                     Mirror::replace_copy)",
                    self.role
                )))
            }
        };
        let want = LABEL_BYTES + self.size();
        if target.size() < want {
            target.grow(want)?;
        }
        Ok(())
    }

    /// Bytes of the healthy copies, less the label (the smallest one's:
    /// they grow together): what a rebuilt copy must hold. None without a
    /// healthy copy.
    fn healthy_size(&self) -> Option<u64> {
        let s = self.lock();
        s.targets
            .iter()
            .zip(&s.states)
            .filter(|(_, st)| **st == CopyState::Healthy)
            .filter_map(|(t, _)| t.as_ref())
            .map(|t| t.size().saturating_sub(LABEL_BYTES))
            .min()
    }

    /// Fences `[lo, hi)` and waits for the writes to the rebuilding copy
    /// that started before it.
    fn fence_range(&self, lo: u64, hi: u64) -> Result<FenceGuard<'_>> {
        let f = &self.fence;
        f.lo.store(lo, Ordering::SeqCst);
        f.hi.store(hi, Ordering::SeqCst);
        let guard = FenceGuard(self);
        let old = (f.epoch.fetch_add(1, Ordering::SeqCst) & 1) as usize;
        let deadline = Instant::now() + FENCE_WAIT;
        while f.started[old].load(Ordering::SeqCst) > 0 {
            if Instant::now() > deadline {
                return Err(Error::Mirror(format!(
                    "{}: writes to the rebuilding copy did not complete within {} s",
                    self.role,
                    FENCE_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(guard)
    }

    /// Reads `len` bytes at logical `offset` from a healthy copy, trying
    /// each in turn.
    fn read_healthy(&self, offset: u64, len: usize) -> Result<AlignedBuf> {
        let (states, targets) = {
            let s = self.lock();
            (s.states.clone(), s.targets.clone())
        };
        let mem = self.alignment().mem.max(4096) as usize;
        let mut last = None;
        for (c, t) in targets.iter().enumerate() {
            let Some(t) = t.as_ref().filter(|_| states[c] == CopyState::Healthy) else {
                continue;
            };
            let mut q = open_queue(t, &Backend::Blocking, 2)?;
            let buf = IoBuf::owned(AlignedBuf::new(len, mem)?);
            let comp = sync_io(q.as_mut(), Request::read(0, offset + LABEL_BYTES, buf))?;
            match comp.result {
                Ok(_) => {
                    self.counters[c].reads.fetch_add(1, Ordering::Relaxed);
                    return comp.buf.and_then(IoBuf::into_owned).ok_or_else(|| {
                        Error::InvalidArgument("a read completed without its buffer".into())
                    });
                }
                Err(e) => {
                    self.counters[c].errors.fetch_add(1, Ordering::Relaxed);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::Mirror(format!("{}: no healthy copy to rebuild from", self.role))
        }))
    }

    /// Notes in memory that copy `c` is rebuilt up to `done` (compared
    /// reads may use it below that).
    fn set_progress(&self, c: usize, done: u64) {
        let mut s = self.lock();
        if let CopyState::Rebuilding { done: d } = &mut s.states[c] {
            *d = done;
        }
    }

    /// Syncs the copy and records `done` in every working copy's label.
    fn record_progress(
        self: &Arc<Self>,
        c: usize,
        done: u64,
        to: &mut dyn super::super::IoQueue,
    ) -> Result<()> {
        if let Err(e) = sync_io(to, Request::flush(0)).and_then(|c| c.result) {
            self.fail_copy(c, &e);
            return Err(e);
        }
        self.set_state_if(c, CopyState::Rebuilding { done }, is_rebuilding)
    }
}

/// True for a copy being rebuilt (not failed meanwhile).
fn is_rebuilding(s: CopyState) -> bool {
    matches!(s, CopyState::Rebuilding { .. })
}

/// True if the open device `d` is the file `m` describes (not replaced
/// by another file at its path).
fn same_inode(d: &Device, m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // The descriptor's own file, even if its name is gone.
    std::fs::metadata(format!("/proc/self/fd/{}", d.fd()))
        .is_ok_and(|open| open.ino() == m.ino() && open.dev() == m.dev())
}
