//! Mirrored devices: every write goes to every working copy, a read to the
//! least loaded one; a copy that fails is dropped without stopping the
//! engine, recorded durably on the others, and rebuilt online.
//!
//! Owns: a group of copies of one device (a data device of the array or a
//! log), the state of each copy ([`CopyState`]) and its durable record in
//! the copies' labels (`label.rs`: generation-numbered, two slots per
//! copy), the choice of the copy a read goes to, the verification and
//! repair of pages read (through a [`PageCheck`] that the layers above
//! install: the mirror knows no page format), the background thread that
//! records a state change (`Labeller`), and the rebuild of a replaced copy
//! (`rebuild.rs`). [`MirrorQueue`] (`queue.rs`) is the per-worker queue
//! that fans requests out to the copies' own queues.
//!
//! Why here, below the buffer pool and the log: a mirrored group is one
//! [`Target`] like any device, so the pool, the log, large
//! values, recovery and the checker use it unchanged; and only this layer
//! sees which copy a request went to, which is what a repair needs.
//!
//! Invariants:
//! - A write (or flush) is reported complete only when every copy it went
//!   to has completed it, and, if a copy failed on the way, only once
//!   every label says so ([`Mirror::labels_durable`]): after a crash, a
//!   copy that missed an acknowledged write is never taken for a good one.
//! - A copy marked failed is never read again until it is rebuilt; a
//!   rebuilding copy is written but never read.
//! - The last working copy is never marked failed: its errors go up to the
//!   caller, as an unmirrored device's would.
//!
//! Never: blocks a worker (label writes and rebuild copies run on threads
//! of their own), or reports a write durable that reached no copy.

mod label;
mod queue;
mod rebuild;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

pub use label::{Label, Role, LABEL_BYTES, MAX_COPIES};
pub use queue::MirrorQueue;
pub use rebuild::RebuildReport;

use super::array::{open_queue, Backend, Target};
use super::{sync_io, AlignedBuf, Alignment, IoBuf, Request};
use crate::{Error, Result};

/// The state of one copy of a mirrored group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// Written and read.
    Healthy,
    /// Failed (I/O errors, or missing at open): neither written nor read
    /// until rebuilt.
    Failed,
    /// Being rebuilt from the healthy copies: written, never read; the
    /// first `done` bytes are copied.
    Rebuilding {
        /// Bytes copied so far (recorded in the labels now and then; a
        /// rebuild cut short resumes from the last recorded value).
        done: u64,
    },
}

impl CopyState {
    fn writable(self) -> bool {
        !matches!(self, CopyState::Failed)
    }
}

/// Checks page-sized blocks read from a mirrored data device (installed by
/// the layer that knows the page format).
pub trait PageCheck: Send + Sync {
    /// Bytes of one page: verified reads are checked in blocks of this.
    fn page_size(&self) -> usize;
    /// The block read at logical byte `offset` of the device: `Some(lsn)`
    /// if it is a valid page (its log sequence number ranks versions),
    /// `None` if it is damaged or not a page.
    fn check(&self, offset: u64, bytes: &[u8]) -> Option<u64>;
}

/// Counters of one copy.
#[derive(Debug, Default)]
struct CopyCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    errors: AtomicU64,
    repairs: AtomicU64,
}

/// What [`Mirror::status`] reports of one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyStatus {
    /// The copy's index in its group.
    pub copy: usize,
    /// Its file's path, or a description (a simulated device).
    pub name: String,
    /// Its state.
    pub state: CopyState,
    /// Reads it served.
    pub reads: u64,
    /// Writes it completed.
    pub writes: u64,
    /// Requests that failed on it.
    pub errors: u64,
    /// Blocks rewritten on it from another copy (a failed check, a read
    /// error, or a difference found after a crash).
    pub repairs: u64,
    /// Why it failed (a failed copy).
    pub failure: Option<String>,
}

/// What [`Mirror::status`] reports of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorStatus {
    /// What the group holds.
    pub role: Role,
    /// The generation of its state (raised by every recorded change).
    pub generation: u64,
    /// The generation every working copy's label holds (equal to
    /// `generation` unless a change is being recorded).
    pub durable_generation: u64,
    /// Bytes of the device (each copy holds them after its label).
    pub size: u64,
    /// Reads that found a copy's block damaged, or copies differing after
    /// a crash, and read the block from another copy.
    pub mismatches: u64,
    /// Every copy.
    pub copies: Vec<CopyStatus>,
}

/// The state shared by every queue of a group, under one lock.
struct State {
    states: Vec<CopyState>,
    /// `None`: a copy missing at open (failed until a rebuild gives it a
    /// device).
    targets: Vec<Option<Target>>,
    /// Why each failed copy failed.
    failures: Vec<Option<String>>,
    /// Raised when a copy's target is replaced (queues reopen theirs).
    replaced: Vec<u64>,
    generation: u64,
    /// The last failure to record a state change (no working copy took
    /// the label): writes fail from then on.
    label_error: Option<String>,
    labeller_running: bool,
    /// A state change made by the open, not yet in the labels: written
    /// before the first write to any copy ([`Mirror::commit_open_labels`]),
    /// so an open refused after it (data and log from different moments,
    /// say) changes no label. A copy missing at open, labelled failed at
    /// once, stayed failed when the refused open's files were put right,
    /// and the current copy put back was taken for a stale one (an
    /// outside probe).
    labels_deferred: bool,
    /// Copies failed as stale while labels were deferred: each gets its
    /// own label too when they are written ([`Mirror::fail_stale_copy`]).
    stale: Vec<usize>,
}

/// The rebuild's fence: writes to the range being copied go to the
/// rebuilding copy only after the copy of that range landed (`rebuild.rs`).
#[derive(Default)]
struct Fence {
    epoch: AtomicU64,
    /// Writes to the rebuilding copy in flight, by the epoch they started
    /// in (parity).
    started: [AtomicU64; 2],
    /// The range being copied (logical bytes, `lo < hi`), or `hi == 0`.
    lo: AtomicU64,
    hi: AtomicU64,
    /// Raised each time a copied range is released.
    released: AtomicU64,
}

impl Fence {
    /// Registers a write to the rebuilding copy in the current epoch;
    /// returns the epoch's parity, to [`Fence::finish`] with.
    fn start(&self) -> usize {
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            let slot = (e & 1) as usize;
            self.started[slot].fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == e {
                return slot;
            }
            self.started[slot].fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn finish(&self, slot: usize) {
        let before = self.started[slot].fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "a rebuild fence slot released more than taken");
    }

    /// True if `[offset, offset + len)` meets the range being copied.
    fn blocks(&self, offset: u64, len: u64) -> bool {
        let hi = self.hi.load(Ordering::SeqCst);
        let lo = self.lo.load(Ordering::SeqCst);
        hi != 0 && offset < hi && offset + len > lo
    }
}

/// A group of copies of one device.
pub struct Mirror {
    role: Role,
    /// Index of the device among the engine's devices (for errors).
    index: usize,
    set_id: u64,
    names: Vec<String>,
    paths: Vec<Option<PathBuf>>,
    state: Mutex<State>,
    /// Raised whenever the states or targets change (queues look again).
    seq: AtomicU64,
    /// Bit `c`: copy `c` is healthy (reads may go to it).
    readable: AtomicU64,
    /// Bit `c`: copy `c` is healthy or rebuilding (writes go to it).
    writable: AtomicU64,
    /// Bit `c`: copy `c` is rebuilding (its writes pass the fence).
    rebuilding: AtomicU64,
    /// The generation of the state in memory, and the one every working
    /// copy's label holds.
    generation: AtomicU64,
    durable: AtomicU64,
    label_failed: AtomicBool,
    in_flight: Vec<AtomicUsize>,
    counters: Vec<CopyCounters>,
    mismatches: AtomicU64,
    check: RwLock<Option<Arc<dyn PageCheck>>>,
    /// Every read goes to every readable copy and the copies are compared
    /// (recovery: see [`Mirror::set_verify_all`]).
    verify_all: AtomicBool,
    fence: Fence,
    labeller: Mutex<Vec<JoinHandle<()>>>,
    /// One writer of labels at a time, from its snapshot of the state to
    /// its last label: the labeller and a rebuild step both write them,
    /// and a slow writer's older generation could land on the slot a
    /// newer one used (a review's finding).
    label_writes: Mutex<()>,
    /// A hint that labels are deferred (`State::labels_deferred` decides),
    /// read on every write so the common case takes no lock.
    labels_pending: AtomicBool,
    /// One rebuild at a time.
    rebuild_lock: Mutex<()>,
    /// Held by a growth, and by a rebuild from its copy's preparation to
    /// its Rebuilding state: a growth in between (it grows working copies
    /// only) left the rebuilding copy shorter than the others, the
    /// device's size fell back to it and every request past it was
    /// refused (a review's finding).
    growth: Mutex<()>,
    /// Tests: run once by the next write's dispatch, after it read which
    /// copies to write (a preemption there, made to order).
    #[cfg(test)]
    pub(crate) dispatch_pause: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// A read-only open: nothing is written (no repair, no label).
    read_only: AtomicBool,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("role", &self.role)
            .field("copies", &self.names)
            .field("states", &self.states())
            .finish()
    }
}

/// A mirrored group being opened: one entry per copy.
pub struct CopySpec {
    /// The copy's device; `None` if it is missing (a file not there).
    pub target: Option<Target>,
    /// Its path, if it is a file (a failed copy is reopened from it for a
    /// rebuild).
    pub path: Option<PathBuf>,
}

impl CopySpec {
    /// A copy on `target` with no path (a simulated or caller-owned
    /// device).
    pub fn of(target: Target) -> CopySpec {
        CopySpec {
            target: Some(target),
            path: None,
        }
    }
}

fn name_of(spec: &CopySpec, copy: usize) -> String {
    match (&spec.path, &spec.target) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(Target::File(d))) => d.path().display().to_string(),
        (None, Some(Target::Sim(d))) => format!("simulated device {}", d.index()),
        (None, Some(Target::Mirror(_) | Target::Remap(_))) | (None, None) => format!("copy {copy}"),
    }
}

/// Reads `len` bytes at raw `offset` of `target` (label area included).
fn read_raw(target: &Target, offset: u64, len: usize) -> Result<AlignedBuf> {
    let mut q = open_queue(target, &Backend::Blocking, 2)?;
    let align = target.alignment().mem.max(4096) as usize;
    let buf = AlignedBuf::new(len, align)?;
    let c = sync_io(q.as_mut(), Request::read(0, offset, IoBuf::owned(buf)))?;
    c.result?;
    c.buf
        .and_then(IoBuf::into_owned)
        .ok_or_else(|| Error::InvalidArgument("a read completed without its buffer".into()))
}

/// Writes `bytes` at raw `offset` of `target`, then makes it durable.
fn write_raw_durably(target: &Target, offset: u64, bytes: &[u8]) -> Result<()> {
    let mut q = open_queue(target, &Backend::Blocking, 2)?;
    let align = target.alignment().mem.max(4096) as usize;
    let mut buf = AlignedBuf::new(bytes.len(), align)?;
    buf.copy_from_slice(bytes);
    sync_io(q.as_mut(), Request::write(0, offset, IoBuf::owned(buf)))?.result?;
    sync_io(q.as_mut(), Request::flush(0))?.result?;
    Ok(())
}

/// The label of copy `t`, if it has one.
pub fn read_label(t: &Target) -> Result<Option<Label>> {
    if t.size() < LABEL_BYTES {
        return Ok(None);
    }
    let area = read_raw(t, 0, LABEL_BYTES as usize)?;
    Ok(Label::newest(&area))
}

/// True if the first block of `t` is a mirrored copy's label (valid or
/// damaged): its files belong to a mirrored database.
pub fn is_labelled(t: &Target) -> Result<bool> {
    if t.size() < LABEL_BYTES {
        return Ok(false);
    }
    let area = read_raw(t, 0, LABEL_BYTES as usize)?;
    Ok(Label::looks_like_label(&area))
}

impl Mirror {
    /// Formats a new group over `copies` (2 to [`MAX_COPIES`], each at
    /// least [`LABEL_BYTES`] plus one page long): every copy healthy,
    /// generation 1, labels written and synced. `index` names the device
    /// in errors.
    pub fn create(role: Role, index: usize, copies: Vec<CopySpec>) -> Result<Arc<Mirror>> {
        use rand::RngCore;
        check_count(copies.len())?;
        if copies.iter().any(|c| c.target.is_none()) {
            return Err(Error::Mirror(format!(
                "{role}: every copy is needed to create a mirrored device"
            )));
        }
        let set_id = rand::rngs::OsRng.next_u64() | 1;
        let states = vec![CopyState::Healthy; copies.len()];
        let m = Mirror::build(role, index, set_id, copies, states, 1);
        m.write_labels_now()?;
        Ok(m)
    }

    /// Opens an existing group: reads every copy's label, takes the state
    /// from the newest generation, marks missing or unlabelled copies
    /// failed, and records the state in every working copy's label if the
    /// copies disagreed. Fails if no copy holds a label of the group, or
    /// the labels name another role or group.
    ///
    /// With `read_only`, nothing is written: the state is taken as found
    /// (changes stay in memory), and reads repair nothing.
    pub fn open(
        role: Role,
        index: usize,
        copies: Vec<CopySpec>,
        read_only: bool,
    ) -> Result<Arc<Mirror>> {
        check_count(copies.len())?;
        let mut labels = Vec::with_capacity(copies.len());
        for (c, spec) in copies.iter().enumerate() {
            let label = match &spec.target {
                // A copy that cannot even be read counts as failed.
                Some(t) => read_label(t).ok().flatten(),
                None => None,
            };
            if let Some(l) = &label {
                if l.role != role || l.copy != c || l.states.len() != copies.len() {
                    return Err(Error::Mirror(format!(
                        "{}: the label says copy {} of {} of {}, not copy {c} of {} of {role}",
                        name_of(spec, c),
                        l.copy,
                        l.states.len(),
                        l.role,
                        copies.len()
                    )));
                }
            }
            labels.push(label);
        }
        let newest = labels
            .iter()
            .flatten()
            .max_by_key(|l| l.generation)
            .cloned()
            .ok_or_else(|| {
                Error::Mirror(format!(
                    "{role}: no copy holds a valid label ({})",
                    copies
                        .iter()
                        .enumerate()
                        .map(|(c, s)| name_of(s, c))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if labels.iter().flatten().any(|l| l.set_id != newest.set_id) {
            // Which copy is the stranger, the labels cannot say (both say
            // generation 1 after a creation): every copy is named with its
            // set. The first version named copy 0 as the stranger whenever
            // the other was newer or as new, the genuine copy when a file
            // of another database was put in place of copy 1 (an outside
            // probe).
            let sets: Vec<String> = labels
                .iter()
                .enumerate()
                .map(|(c, l)| match l {
                    Some(l) => format!("{} in set {:016x}", name_of(&copies[c], c), l.set_id),
                    None => format!("{} without a label", name_of(&copies[c], c)),
                })
                .collect();
            return Err(Error::Mirror(format!(
                "{role}: the copies belong to different mirrored groups ({}): one is a file of \
                 another database; put the right file in its place",
                sets.join(", ")
            )));
        }
        let mut states = newest.states.clone();
        let mut changed = false;
        for (c, s) in states.iter_mut().enumerate() {
            // A copy without its own label (missing, unreadable, never
            // labelled) cannot be trusted: failed until rebuilt.
            if labels[c].is_none() && *s != CopyState::Failed {
                *s = CopyState::Failed;
                changed = true;
            }
        }
        if !states.contains(&CopyState::Healthy) {
            return Err(Error::Mirror(format!(
                "{role}: no healthy copy left (states {states:?})"
            )));
        }
        // A rebuild's progress past the healthy copies' size (a damaged or
        // forged label with a valid checksum) would mark the copy healthy
        // with nothing copied, and reads would take its bytes below it (a
        // review's finding): such a rebuild starts again from the start.
        let healthy_size = states
            .iter()
            .zip(&copies)
            .filter(|(s, _)| **s == CopyState::Healthy)
            .filter_map(|(_, spec)| spec.target.as_ref())
            .map(|t| t.size().saturating_sub(LABEL_BYTES))
            .min()
            .unwrap_or(0);
        for (s, spec) in states.iter_mut().zip(&copies) {
            if matches!(*s, CopyState::Rebuilding { done } if done > healthy_size) {
                *s = CopyState::Rebuilding { done: 0 };
                changed = true;
            }
            // A rebuilding copy shorter than the healthy ones (they grew
            // while it was failed, before its rebuild began) is grown to
            // them, or failed (a read-only open writes nothing): counted
            // as it is, it made the device that short, and the meta page
            // named pages past its end (a review's finding).
            let short = spec
                .target
                .as_ref()
                .filter(|t| t.size() < LABEL_BYTES + healthy_size);
            if let (CopyState::Rebuilding { .. }, Some(t)) = (*s, short) {
                if read_only || t.grow(LABEL_BYTES + healthy_size).is_err() {
                    *s = CopyState::Failed;
                    changed = true;
                }
            }
        }
        let disagree = labels.iter().enumerate().any(|(c, l)| {
            states[c].writable() && l.as_ref().map(|l| l.generation) != Some(newest.generation)
        });
        let generation = newest.generation + u64::from(changed || disagree);
        let m = Mirror::build(role, index, newest.set_id, copies, states, generation);
        m.read_only.store(read_only, Ordering::SeqCst);
        if !read_only {
            // What the open changes (here, or as its checks fail a stale
            // or short copy) is recorded before its first write, not at
            // once: the open may still be refused.
            m.lock().labels_deferred = true;
            m.durable.store(newest.generation, Ordering::SeqCst);
            m.labels_pending.store(true, Ordering::SeqCst);
        }
        Ok(m)
    }

    fn build(
        role: Role,
        index: usize,
        set_id: u64,
        copies: Vec<CopySpec>,
        states: Vec<CopyState>,
        generation: u64,
    ) -> Arc<Mirror> {
        let n = copies.len();
        let names = copies
            .iter()
            .enumerate()
            .map(|(c, s)| name_of(s, c))
            .collect();
        let paths = copies.iter().map(|s| s.path.clone()).collect();
        let failures = copies
            .iter()
            .map(|s| {
                s.target
                    .is_none()
                    .then(|| "missing when the database was opened".to_string())
            })
            .collect();
        let targets: Vec<Option<Target>> = copies.into_iter().map(|s| s.target).collect();
        let m = Arc::new(Mirror {
            role,
            index,
            set_id,
            names,
            paths,
            state: Mutex::new(State {
                states: states.clone(),
                targets,
                failures,
                replaced: vec![0; n],
                generation,
                label_error: None,
                labeller_running: false,
                labels_deferred: false,
                stale: Vec::new(),
            }),
            seq: AtomicU64::new(0),
            readable: AtomicU64::new(0),
            writable: AtomicU64::new(0),
            rebuilding: AtomicU64::new(0),
            generation: AtomicU64::new(generation),
            durable: AtomicU64::new(generation),
            label_failed: AtomicBool::new(false),
            in_flight: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            counters: (0..n).map(|_| CopyCounters::default()).collect(),
            mismatches: AtomicU64::new(0),
            check: RwLock::new(None),
            verify_all: AtomicBool::new(false),
            fence: Fence::default(),
            labeller: Mutex::new(Vec::new()),
            label_writes: Mutex::new(()),
            labels_pending: AtomicBool::new(false),
            rebuild_lock: Mutex::new(()),
            growth: Mutex::new(()),
            read_only: AtomicBool::new(false),
            #[cfg(test)]
            dispatch_pause: Mutex::new(None),
        });
        m.publish(&states);
        m
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the masks of `states` for the queues' lock-free checks.
    fn publish(&self, states: &[CopyState]) {
        // The count first: a queue that reads a new mask then reads a new
        // count, and reopens its copies' queues before it uses the mask
        // (`queue.rs`, `dispatch_write`).
        self.seq.fetch_add(1, Ordering::SeqCst);
        let mask = |f: &dyn Fn(CopyState) -> bool| {
            states
                .iter()
                .enumerate()
                .filter(|(_, s)| f(**s))
                .fold(0u64, |m, (c, _)| m | 1 << c)
        };
        self.readable
            .store(mask(&|s| s == CopyState::Healthy), Ordering::SeqCst);
        self.writable
            .store(mask(&|s| s.writable()), Ordering::SeqCst);
        self.rebuilding.store(
            mask(&|s| matches!(s, CopyState::Rebuilding { .. })),
            Ordering::SeqCst,
        );
    }

    /// What the group holds.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Number of copies.
    pub fn copies(&self) -> usize {
        self.names.len()
    }

    /// Every copy's state.
    pub fn states(&self) -> Vec<CopyState> {
        self.lock().states.clone()
    }

    /// The copies' devices (copy `c` at index `c`; a failed copy's may be
    /// a dead device, or none if it was missing).
    pub fn targets(&self) -> Vec<Option<Target>> {
        self.lock().targets.clone()
    }

    fn writable_targets(&self) -> Vec<Target> {
        let s = self.lock();
        s.targets
            .iter()
            .zip(&s.states)
            .filter(|(_, st)| st.writable())
            .filter_map(|(t, _)| t.clone())
            .collect()
    }

    /// Tests: runs [`Mirror::dispatch_pause`] if one is set.
    #[cfg(test)]
    pub(crate) fn run_dispatch_pause(&self) {
        let pause = self
            .dispatch_pause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(f) = pause {
            f();
        }
    }

    /// Bytes of the device: the smallest working copy's, less its label.
    pub fn size(&self) -> u64 {
        self.writable_targets()
            .iter()
            .map(|t| t.size().saturating_sub(LABEL_BYTES))
            .min()
            .unwrap_or(0)
    }

    /// The most bytes the device can grow to.
    pub fn max_size(&self) -> u64 {
        self.writable_targets()
            .iter()
            .map(|t| t.max_size().saturating_sub(LABEL_BYTES))
            .min()
            .unwrap_or(0)
    }

    /// Grows every working copy so that the device holds `bytes` (see
    /// [`Target::grow`]).
    pub fn grow(&self, bytes: u64) -> Result<()> {
        self.grow_each(bytes, Target::grow)
    }

    /// Grows every working copy with zeros over the new range.
    pub fn grow_zeroed(&self, bytes: u64) -> Result<()> {
        self.grow_each(bytes, Target::grow_zeroed)
    }

    /// Grows each working copy shorter than `bytes` (plus its label) with
    /// `grow`, then looks again: a copy whose rebuild started meanwhile
    /// (a failed copy is not grown) may have been rebuilt to the old size
    /// while the others grew, and would leave the device that short (a
    /// growing log then reads as cut short, and its next flush there is
    /// refused). One more round than there are copies at most.
    fn grow_each(&self, bytes: u64, grow: impl Fn(&Target, u64) -> Result<()>) -> Result<()> {
        let _no_rebuild_starting = self.growth.lock().unwrap_or_else(|e| e.into_inner());
        let want = bytes + LABEL_BYTES;
        for _ in 0..=MAX_COPIES {
            let short: Vec<Target> = self
                .writable_targets()
                .into_iter()
                .filter(|t| t.size() < want)
                .collect();
            if short.is_empty() {
                return Ok(());
            }
            for t in short {
                grow(&t, want)?;
            }
        }
        Err(Error::Mirror(format!(
            "{}: copies kept coming short of {bytes} bytes while it grew",
            self.role
        )))
    }

    /// True if every working copy is a regular file (the log grows it).
    pub fn is_growable(&self) -> bool {
        let t = self.writable_targets();
        !t.is_empty() && t.iter().all(Target::is_growable)
    }

    /// Direct-I/O alignment: the strictest copy's, over the device's
    /// logical size.
    pub fn alignment(&self) -> Alignment {
        let targets: Vec<Target> = self.targets().into_iter().flatten().collect();
        let io = targets
            .iter()
            .map(|t| t.alignment().io)
            .max()
            .unwrap_or(512);
        let mem = targets
            .iter()
            .map(|t| t.alignment().mem)
            .max()
            .unwrap_or(512);
        Alignment {
            device: self.index,
            io: io.max(512),
            mem: mem.max(512),
            size: self.size(),
        }
    }

    /// Installs the check of page-sized blocks (data devices): verified
    /// reads that fail it are read from another copy and the bad copy is
    /// rewritten.
    pub fn set_page_check(&self, check: Arc<dyn PageCheck>) {
        *self.check.write().unwrap_or_else(|e| e.into_inner()) = Some(check);
    }

    fn page_check(&self) -> Option<Arc<dyn PageCheck>> {
        self.check.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// While on, every read goes to every copy that holds the block
    /// (healthy ones, and a rebuilding one below its rebuilt bytes), the
    /// copies are compared, the best version (a valid page with the
    /// highest LSN; else the first healthy copy's bytes) is returned and
    /// written over the copies that differ before the read completes.
    /// Recovery turns it on: copies of a block written since the last
    /// checkpoint may differ after a crash (the write reached one copy and
    /// not the other), both valid, and every such block is read by
    /// recovery before anything else reads it.
    pub fn set_verify_all(&self, on: bool) {
        self.verify_all.store(on, Ordering::SeqCst);
    }

    fn generation_durable(&self) -> bool {
        self.durable.load(Ordering::SeqCst) == self.generation.load(Ordering::SeqCst)
    }

    /// True once every working copy's label holds the state in memory
    /// (no change of state is being recorded).
    pub fn labels_durable(&self) -> bool {
        self.generation_durable()
    }

    /// The error every write gets once no copy can record a state change.
    fn label_failure(&self) -> Option<Error> {
        if !self.label_failed.load(Ordering::SeqCst) {
            return None;
        }
        let what = self.lock().label_error.clone().unwrap_or_default();
        Some(Error::Mirror(format!(
            "{}: no copy could record a change of state: {what}",
            self.role
        )))
    }

    /// Marks copy `c` failed after `error` (a write, flush, repair or label
    /// write on it failed), unless it is the last healthy copy, and has
    /// the change recorded in the labels (by the labeller thread, started
    /// if none runs). Returns true if the copy is failed now (the caller
    /// may go on without it); false if it was the last one (the error is
    /// the caller's).
    fn fail_copy(self: &Arc<Self>, c: usize, error: &Error) -> bool {
        match self.mark_failed(c, error) {
            Some(true) if self.read_only.load(Ordering::SeqCst) => {
                // Nothing is written: the failure stays in memory, and
                // counts as recorded (no label will ever be written, so
                // completions held for one would be held for good).
                self.lock().labeller_running = false;
                self.durable
                    .fetch_max(self.generation.load(Ordering::SeqCst), Ordering::SeqCst);
                true
            }
            Some(true) => {
                self.start_labeller();
                true
            }
            Some(false) => true,
            None => false,
        }
    }

    /// The state change of [`Mirror::fail_copy`]: Some(true) if the caller
    /// must start the labeller, Some(false) if the copy was failed already
    /// or a labeller runs, None if `c` is the last healthy copy.
    fn mark_failed(&self, c: usize, error: &Error) -> Option<bool> {
        let mut s = self.lock();
        if s.states[c] == CopyState::Failed {
            return Some(false);
        }
        let others_healthy = s
            .states
            .iter()
            .enumerate()
            .any(|(i, st)| i != c && *st == CopyState::Healthy);
        if !others_healthy {
            return None;
        }
        s.states[c] = CopyState::Failed;
        s.failures[c] = Some(error.to_string());
        s.generation += 1;
        self.generation.store(s.generation, Ordering::SeqCst);
        let states = s.states.clone();
        // Deferred (the open's state): the open's first write records it.
        let start = !s.labeller_running && !s.labels_deferred;
        if start {
            s.labeller_running = true;
        }
        drop(s);
        self.counters[c].errors.fetch_add(1, Ordering::Relaxed);
        self.publish(&states);
        Some(start)
    }

    /// Records the state in memory in every working copy's label, on a
    /// thread of its own, until the state stops changing.
    fn start_labeller(self: &Arc<Self>) {
        let m = self.clone();
        let spawned = std::thread::Builder::new()
            .name("dana-mirror-label".into())
            .spawn(move || m.label_until_settled());
        match spawned {
            Ok(h) => self
                .labeller
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(h),
            Err(e) => {
                let mut s = self.lock();
                s.labeller_running = false;
                s.label_error = Some(format!("no thread to record the state: {e}"));
                self.label_failed.store(true, Ordering::SeqCst);
            }
        }
    }

    fn label_until_settled(self: Arc<Self>) {
        loop {
            let (generation, written) = self.write_current_labels();
            match written {
                Ok(()) => {}
                Err((c, e)) => {
                    // The copy that did not take its label fails too; if
                    // it was the last, writes fail from now on.
                    if self.mark_failed(c, &e).is_none() {
                        self.lock().labeller_running = false;
                        self.fail_labels(&e);
                        return;
                    }
                    continue;
                }
            }
            let mut s = self.lock();
            if s.generation == generation {
                self.durable.fetch_max(generation, Ordering::SeqCst);
                s.labeller_running = false;
                return;
            }
        }
    }

    /// No copy can record a change of state: every write fails from now
    /// on with `e` (the writes held for the change are answered with it).
    fn fail_labels(&self, e: &Error) {
        self.lock().label_error = Some(e.to_string());
        self.label_failed.store(true, Ordering::SeqCst);
    }

    /// Writes the labels of the state in memory (taken under the writers'
    /// lock, so no older generation lands after a newer one): the
    /// generation written, and the copy that failed with its error.
    fn write_current_labels(&self) -> (u64, std::result::Result<(), (usize, Error)>) {
        let _one_writer = self.label_writes.lock().unwrap_or_else(|e| e.into_inner());
        let (generation, states, targets) = {
            let s = self.lock();
            (s.generation, s.states.clone(), s.targets.clone())
        };
        (generation, self.write_labels(generation, &states, &targets))
    }

    /// Writes the label of `generation` and `states` to every working
    /// copy, durably. On a failure, the copy and its error.
    fn write_labels(
        &self,
        generation: u64,
        states: &[CopyState],
        targets: &[Option<Target>],
    ) -> std::result::Result<(), (usize, Error)> {
        for (c, t) in targets.iter().enumerate() {
            let Some(t) = t.as_ref().filter(|_| states[c].writable()) else {
                continue;
            };
            let label = Label {
                set_id: self.set_id,
                role: self.role,
                copy: c,
                generation,
                states: states.to_vec(),
            };
            let offset = (label.slot() * label::SLOT_BYTES) as u64;
            write_raw_durably(t, offset, &label.encode()).map_err(|e| (c, e))?;
        }
        Ok(())
    }

    /// Writes the current state's labels from the calling thread (opening,
    /// creating, rebuild steps): a copy that does not take its label is
    /// failed; Err if none does.
    fn write_labels_now(self: &Arc<Self>) -> Result<()> {
        loop {
            let (generation, written) = self.write_current_labels();
            match written {
                Ok(()) => {
                    let mut s = self.lock();
                    if s.generation == generation {
                        self.durable.fetch_max(generation, Ordering::SeqCst);
                        s.labels_deferred = false;
                        let stale = std::mem::take(&mut s.stale);
                        drop(s);
                        self.labels_pending.store(false, Ordering::SeqCst);
                        for c in stale {
                            self.write_stale_label(c);
                        }
                        return Ok(());
                    }
                }
                Err((c, e)) => {
                    if self.mark_failed(c, &e).is_none() {
                        // The state in memory is ahead of every label and
                        // no labeller runs: without this, the writes held
                        // for it waited for good (a review's finding).
                        self.fail_labels(&e);
                        return Err(Error::Mirror(format!(
                            "{}: no copy could record its label: {e}",
                            self.role
                        )));
                    }
                }
            }
        }
    }

    /// Sets copy `c`'s state and records it durably (rebuild steps).
    fn set_state(self: &Arc<Self>, c: usize, state: CopyState) -> Result<()> {
        self.set_state_if(c, state, |_| true)
    }

    /// [`Mirror::set_state`] only while copy `c`'s state passes `when`
    /// (checked and changed under one lock); else an error naming it.
    fn set_state_if(
        self: &Arc<Self>,
        c: usize,
        state: CopyState,
        when: impl Fn(CopyState) -> bool,
    ) -> Result<()> {
        let states = {
            let mut s = self.lock();
            if !when(s.states[c]) {
                return Err(Error::Mirror(format!(
                    "{} copy {c} is {:?}: not moved to {state:?}",
                    self.role, s.states[c]
                )));
            }
            s.states[c] = state;
            s.generation += 1;
            self.generation.store(s.generation, Ordering::SeqCst);
            s.states.clone()
        };
        self.publish(&states);
        self.write_labels_now()
    }

    /// Replaces copy `c`'s device (a replaced disk, or a simulated one for
    /// tests) ahead of a rebuild. Only a failed copy can be replaced.
    pub fn replace_copy(&self, c: usize, target: Target) -> Result<()> {
        let mut s = self.lock();
        if c >= s.states.len() {
            return Err(Error::InvalidArgument(format!(
                "{}: no copy {c} (it has {})",
                self.role,
                s.states.len()
            )));
        }
        if s.states[c] != CopyState::Failed {
            return Err(Error::InvalidArgument(format!(
                "{} copy {c} is {:?}: only a failed copy is replaced",
                self.role, s.states[c]
            )));
        }
        s.targets[c] = Some(target);
        s.replaced[c] += 1;
        drop(s);
        self.seq.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The path copy `c` was opened from, if a file.
    pub fn copy_path(&self, c: usize) -> Option<&PathBuf> {
        self.paths.get(c).and_then(Option::as_ref)
    }

    /// A status report: states, generations and per-copy counters.
    pub fn status(&self) -> MirrorStatus {
        let (states, generation, failures) = {
            let s = self.lock();
            (s.states.clone(), s.generation, s.failures.clone())
        };
        MirrorStatus {
            role: self.role,
            generation,
            durable_generation: self.durable.load(Ordering::SeqCst),
            size: self.size(),
            mismatches: self.mismatches.load(Ordering::Relaxed),
            copies: states
                .iter()
                .enumerate()
                .map(|(c, s)| {
                    let k = &self.counters[c];
                    CopyStatus {
                        copy: c,
                        name: self.names[c].clone(),
                        state: *s,
                        reads: k.reads.load(Ordering::Relaxed),
                        writes: k.writes.load(Ordering::Relaxed),
                        errors: k.errors.load(Ordering::Relaxed),
                        repairs: k.repairs.load(Ordering::Relaxed),
                        failure: failures[c].clone(),
                    }
                })
                .collect(),
        }
    }

    /// Opens a queue for one worker (fanning out to a queue per copy).
    pub fn queue(self: &Arc<Self>, backend: &Backend, depth: u32) -> Result<MirrorQueue> {
        MirrorQueue::new(self.clone(), *backend, depth)
    }

    /// A view of copy `c` alone: a group whose other copies count as
    /// failed, that writes nothing (no label, no repair). Recovery reads
    /// each copy of a log through one to choose the copy to trust.
    pub fn only(&self, c: usize) -> Result<Arc<Mirror>> {
        let (targets, states) = {
            let s = self.lock();
            (s.targets.clone(), s.states.clone())
        };
        if targets.get(c).and_then(Option::as_ref).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{}: no device for copy {c}",
                self.role
            )));
        }
        let specs = targets
            .into_iter()
            .enumerate()
            .map(|(i, t)| CopySpec {
                target: if i == c { t } else { None },
                path: self.paths[i].clone(),
            })
            .collect();
        let only: Vec<CopyState> = (0..states.len())
            .map(|i| {
                if i == c {
                    CopyState::Healthy
                } else {
                    CopyState::Failed
                }
            })
            .collect();
        let m = Mirror::build(
            self.role,
            self.index,
            self.set_id,
            specs,
            only,
            self.generation.load(Ordering::SeqCst),
        );
        m.read_only.store(true, Ordering::SeqCst);
        Ok(m)
    }

    /// Writes `bytes` at logical `offset` of copy `c` alone and syncs it,
    /// from the calling thread (recovery makes a log's copies identical
    /// with it).
    pub fn write_copy(self: &Arc<Self>, c: usize, offset: u64, bytes: &[u8]) -> Result<()> {
        if self.read_only.load(Ordering::SeqCst) {
            return Err(Error::ReadOnly);
        }
        self.commit_open_labels()?;
        let t = self.targets().get(c).cloned().flatten().ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no device for copy {c}", self.role))
        })?;
        write_raw_durably(&t, offset + LABEL_BYTES, bytes)?;
        self.counters[c].repairs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Counts a difference between copies found outside the queues
    /// (recovery's comparison of a log's copies).
    pub fn note_mismatch(&self) {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
    }

    /// Fails copy `c` because it holds an older moment than the database
    /// (`why`: a copy put back from an older backup beside the others), as
    /// an I/O error would; false if it is the last healthy copy (nothing
    /// changes then).
    pub fn fail_stale_copy(self: &Arc<Self>, c: usize, why: String) -> bool {
        if !self.fail_copy(c, &Error::Mirror(why)) {
            return false;
        }
        if !self.read_only.load(Ordering::SeqCst) {
            // The copy is whole enough to be written (older or cut short,
            // not failing): its own label says it failed too. Left naming
            // it healthy, it opened as the only copy once every other
            // copy went missing, an older moment served as the database.
            {
                let mut s = self.lock();
                if s.labels_deferred {
                    // With the others', before the open's first write.
                    s.stale.push(c);
                    return true;
                }
            }
            self.write_stale_label(c);
        }
        true
    }

    /// Writes the state's label on failed copy `c` itself, at best: a copy
    /// that does not take it is failed already ([`Mirror::fail_stale_copy`]).
    fn write_stale_label(&self, c: usize) {
        let _one_writer = self.label_writes.lock().unwrap_or_else(|e| e.into_inner());
        let (generation, states, target) = {
            let s = self.lock();
            (s.generation, s.states.clone(), s.targets[c].clone())
        };
        if let Some(t) = target {
            let label = Label {
                set_id: self.set_id,
                role: self.role,
                copy: c,
                generation,
                states,
            };
            let offset = (label.slot() * label::SLOT_BYTES) as u64;
            let _at_best = write_raw_durably(&t, offset, &label.encode());
        }
    }

    /// Writes the labels the open deferred (a copy missing or stale, a
    /// copy's label behind), if it has not yet: called before every write
    /// to a copy (the queues' writes, recovery's [`Mirror::write_copy`]),
    /// so no copy changes before the labels say which copies are current.
    /// Once per open; a no-op after (one atomic load).
    pub fn commit_open_labels(self: &Arc<Self>) -> Result<()> {
        if !self.labels_pending.load(Ordering::SeqCst) {
            return Ok(());
        }
        {
            let mut s = self.lock();
            if !s.labels_deferred {
                return Ok(());
            }
            if s.generation == self.durable.load(Ordering::SeqCst) {
                // Nothing changed: the labels on disk are the state.
                s.labels_deferred = false;
                drop(s);
                self.labels_pending.store(false, Ordering::SeqCst);
                return Ok(());
            }
        }
        self.write_labels_now()
    }

    /// Reads `len` bytes at logical `offset` from copy `c` alone, from the
    /// calling thread (the checker compares copies with it).
    pub fn read_copy(&self, c: usize, offset: u64, len: usize) -> Result<AlignedBuf> {
        let t = self.targets().get(c).cloned().flatten().ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no device for copy {c}", self.role))
        })?;
        read_raw(&t, offset + LABEL_BYTES, len)
    }

    /// [`Mirror::read_copy`] of each of `copies` (a comparison's reads):
    /// a copy whose read fails is failed, as the engine's own reads fail
    /// one, and `Ok(Err(c))` names it; an error (naming the copy's file)
    /// only if it was the last healthy copy. A copy cut short while the
    /// database ran failed every `Db::rebuild` with a `ShortIo` naming no
    /// file, and stayed healthy (an outside probe's finding).
    pub fn read_copies(
        self: &Arc<Self>,
        copies: &[usize],
        offset: u64,
        len: usize,
    ) -> Result<std::result::Result<Vec<AlignedBuf>, usize>> {
        let mut out = Vec::with_capacity(copies.len());
        for &c in copies {
            match self.read_copy(c, offset, len) {
                Ok(b) => out.push(b),
                Err(e) => {
                    if let Some(n) = self.counters.get(c) {
                        n.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if self.fail_copy(c, &e) {
                        return Ok(Err(c));
                    }
                    return Err(Error::Mirror(format!(
                        "{} copy {c} ({}), its last healthy copy, cannot be read: {e}",
                        self.role,
                        self.copy_name(c)
                    )));
                }
            }
        }
        Ok(Ok(out))
    }

    /// Copy `c`'s file, or "copy c" if it has no path.
    pub fn copy_name(&self, c: usize) -> String {
        self.copy_path(c)
            .map_or_else(|| format!("copy {c}"), |p| p.display().to_string())
    }

    /// Joins the threads that recorded states and releases the copies'
    /// file locks (at close, once the workers stopped; a copy reopened by
    /// a rebuild holds a lock the open did not take).
    pub fn finish(&self) {
        for t in self.targets().into_iter().flatten() {
            if let Target::File(d) = t {
                d.unlock();
            }
        }
        let threads = std::mem::take(&mut *self.labeller.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn check_count(n: usize) -> Result<()> {
    if !(2..=MAX_COPIES).contains(&n) {
        return Err(Error::InvalidArgument(format!(
            "a mirrored device has 2 to {MAX_COPIES} copies, not {n}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
