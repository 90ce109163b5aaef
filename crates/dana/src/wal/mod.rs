//! The write-ahead log: appending records, group commit, and the state of
//! checkpoints.
//!
//! Owns: the log tail in memory (records not yet handed to a write), the
//! one flush in flight (write(s), then fdatasync, through the worker's
//! queue to the log device), the durable LSN, the tasks waiting for it,
//! the sticky log error, the LSNs a checkpoint needs (where redo starts;
//! below which a page's next change logs a full image), the log space
//! promised to admitted commits ([`Wal::admit`]), and the encoding of the
//! page changes the buffer pool hands over (its `PageLog` implementation).
//!
//! Group commit: a committing task appends its record, gets its LSN and
//! awaits [`Wal::wait_durable`]; it never flushes itself. A worker's
//! system step ([`Wal::pump`]) starts a flush when someone waits, when
//! write-back needs a page's record durable, or when async commits have
//! waited a whole window; the flush takes every record appended so far, so
//! one write and one fdatasync make a whole group durable and wake all of
//! it. While a flush is in flight new commits gather for the next one. No
//! thread ever blocks on a flush.
//!
//! The log file: two control blocks ([`control`]) then a circular stream
//! of `capacity` bytes. A record at stream position (LSN) `l` lies at file
//! offset `CONTROL_BYTES + l % capacity`. Every flush is padded to the
//! device's block so that no later write rewrites a block holding durable
//! records (a torn rewrite could destroy them).
//!
//! A log in a regular file starts with the first MiB of its stream
//! ([`INITIAL_LOG_BYTES`]) and grows, on the first lap only, ahead of the
//! flushes: a growth thread writes zeros over the next range and syncs it
//! (so log writes stay plain overwrites), and a flush that would write
//! past the grown range waits for it. After the first lap the file holds
//! the whole capacity and never changes size again.
//!
//! Never: writes a record into space the last completed checkpoint still
//! needs, writes past the durable end of a growing log file, acknowledges a commit before its fdatasync completed, or retries
//! after a failed log write or sync (the error is sticky: every later
//! append and wait fails with [`Error::Poisoned`]).

pub mod control;
pub mod record;
pub mod recover;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::buffer::page;
use crate::buffer::page_log::PageChange;
use crate::io::grower::Grower;
use crate::io::{AlignedBuf, Completion, IoBuf, Request};
use crate::sched;
use crate::sched::{CompletionHandler, IoTiming, RequestKind, SystemTask, WakerList};
use crate::{Error, Result};

/// Bytes at the start of the log file that hold the control blocks.
pub const CONTROL_BYTES: u64 = 2 * control::BLOCK;

/// Stream bytes a new log file starts with (it grows to its capacity).
pub const INITIAL_LOG_BYTES: u64 = 1 << 20;

/// How long a failed growth of the log file answers for the next ones.
const LOG_GROWTH_RETRY: Duration = Duration::from_secs(1);

/// Growth of a log file that is shorter than its capacity.
struct LogGrowth {
    file: crate::io::Target,
    /// Stream bytes the file holds, zero-filled and durable.
    allocated: Arc<AtomicU64>,
    /// The growth thread and the last failure (a full file system). Its
    /// thread is joined before the log goes away: one still writing zeros
    /// after a close could overwrite the records of the next open.
    grower: Grower,
    /// A flush is waiting for the file to grow.
    blocked: AtomicBool,
    growths: Arc<AtomicU64>,
}

/// How commits wait for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A commit returns once its record is on stable storage (default).
    Sync,
    /// A commit returns at once; a flush follows within the database's
    /// async window ([`crate::Options::async_window`]), so a crash loses
    /// at most the commits of that window.
    Async,
    /// No log at all: changes reach storage by write-back and
    /// [`crate::Db::flush`] only, and a crash can leave any mix of them
    /// (the mode of the papers' benchmarks).
    Off,
}

/// The log's own ids of its requests (kind [`RequestKind::Log`]): a
/// flush's write(s) and its sync.
const FLUSH_WRITE: u64 = 0;
const FLUSH_SYNC: u64 = 1;

/// Counters of the log.
#[derive(Debug, Default)]
pub struct WalStats {
    records: AtomicU64,
    bytes: AtomicU64,
    flushes: AtomicU64,
    commits: AtomicU64,
    commit_bytes: AtomicU64,
    page_bytes: AtomicU64,
    images: AtomicU64,
    admit_waits: AtomicU64,
    checkpoints: AtomicU64,
}

/// A copy of the log's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStatsSnapshot {
    /// Records appended.
    pub records: u64,
    /// Bytes appended (records and padding).
    pub bytes: u64,
    /// Flushes completed (one write + one fdatasync each).
    pub flushes: u64,
    /// Commit records appended.
    pub commits: u64,
    /// Bytes of commit records.
    pub commit_bytes: u64,
    /// Bytes of page records (physical changes and full images).
    pub page_bytes: u64,
    /// Full page images logged (new pages, first changes since a
    /// checkpoint, structure changes of pages with covered changes).
    pub images: u64,
    /// Commits that waited for log space (for a checkpoint to free some).
    pub admit_waits: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Times the log file grew (on its first lap).
    pub file_growths: u64,
    /// The durable LSN.
    pub durable: u64,
    /// The next LSN to be assigned.
    pub end: u64,
}

impl WalStatsSnapshot {
    /// Counters accumulated since `earlier` (`durable` and `end` stay
    /// this snapshot's).
    pub fn since(&self, earlier: &WalStatsSnapshot) -> WalStatsSnapshot {
        WalStatsSnapshot {
            records: self.records - earlier.records,
            bytes: self.bytes - earlier.bytes,
            flushes: self.flushes - earlier.flushes,
            commits: self.commits - earlier.commits,
            commit_bytes: self.commit_bytes - earlier.commit_bytes,
            page_bytes: self.page_bytes - earlier.page_bytes,
            images: self.images - earlier.images,
            admit_waits: self.admit_waits - earlier.admit_waits,
            checkpoints: self.checkpoints - earlier.checkpoints,
            file_growths: self.file_growths - earlier.file_growths,
            ..*self
        }
    }
}

struct Flushing {
    end: u64,
    writes: usize,
}

struct State {
    /// Next LSN to assign.
    end: u64,
    /// Checksum of the last record (the next record's chain).
    last_crc: u32,
    /// Bytes of `[buf_start, end)`, not yet handed to a write.
    buf: Vec<u8>,
    buf_start: u64,
    flushing: Option<Flushing>,
    /// When the oldest record in `buf` was appended.
    since: Option<Instant>,
    /// Redo LSN of the last completed checkpoint: the log before it may
    /// be overwritten.
    redo: u64,
    /// Commit LSNs whose writes are being applied (a checkpoint's redo
    /// point may not pass them).
    applying: BTreeMap<u64, u32>,
}

/// The write-ahead log of one database.
pub struct Wal {
    device: usize,
    log_id: u64,
    /// Where the log resumed, and the end of the valid records before it:
    /// a flush marker never claims the gap between them durable.
    resumed_at: u64,
    resumed_valid_end: u64,
    block: u64,
    capacity: u64,
    window: Duration,
    state: Mutex<State>,
    durable: AtomicU64,
    fpi_below: AtomicU64,
    /// Log bytes promised to commits admitted and not yet applied.
    reserved: AtomicU64,
    wanted: AtomicU64,
    waiters: Mutex<Vec<(u64, Waker)>>,
    has_waiters: AtomicBool,
    /// Commits waiting in [`Wal::admit`] for log space.
    space_waiters: Arc<WakerList>,
    poisoned: AtomicBool,
    poison: Mutex<Option<String>>,
    control_seq: AtomicU64,
    checkpoint_wanted: AtomicBool,
    /// Between `begin_checkpoint` and `finish_checkpoint`.
    in_checkpoint: AtomicBool,
    /// Set for a log file shorter than its capacity.
    growth: Option<LogGrowth>,
    stats: WalStats,
}

impl crate::buffer::page_log::PageLog for Wal {
    fn log_changes(&self, changes: &[PageChange<'_>]) -> Result<Option<u64>> {
        let mut b = record::RecordBuilder::new(record::Kind::Pages);
        if self.put_pages(&mut b, changes) == 0 {
            return Ok(None);
        }
        let rec = b.into_unsealed();
        self.stats
            .page_bytes
            .fetch_add(rec.len() as u64, Ordering::Relaxed);
        self.append(rec).map(|(lsn, _)| Some(lsn))
    }

    fn log_commit(&self, commit: Vec<u8>, changes: &[PageChange<'_>]) -> Result<(u64, u64)> {
        let mut b = record::RecordBuilder::from_raw(commit, record::Kind::Commit)?;
        self.put_pages(&mut b, changes);
        self.append_commit(b.into_unsealed())
    }

    fn log_covered(&self, pid: u64, page: &[u8]) -> Result<Option<u64>> {
        if page::page_lsn(page) >= self.full_image_below() {
            return Ok(None);
        }
        self.log_changes(&[PageChange {
            pid,
            before: None,
            after: page,
            fresh: true,
        }])
    }

    fn durable(&self) -> u64 {
        Wal::durable(self)
    }

    fn want(&self, lsn: u64) {
        Wal::want(self, lsn);
    }

    fn poisoned(&self) -> Option<Error> {
        Wal::poisoned(self)
    }
}

/// The log owns the completions of its flushes' writes and syncs.
impl CompletionHandler for Wal {
    fn complete(&self, kind: RequestKind, id: u64, c: Completion, _: IoTiming) {
        debug_assert_eq!(kind, RequestKind::Log);
        self.flush_completed(id, c);
    }
}

/// Group commit's flush, a system task every worker steps.
impl SystemTask for Wal {
    fn name(&self) -> &'static str {
        "log flush"
    }

    fn step(&self) -> bool {
        self.pump()
    }

    /// The end of the async window of the oldest unflushed record (no
    /// deadline while a flush is in flight: its completion wakes the
    /// worker, and nothing to flush needs none).
    fn due_in(&self) -> Option<Duration> {
        if self
            .growth
            .as_ref()
            .is_some_and(|g| g.blocked.load(Ordering::Acquire))
        {
            // A flush waits for the log file to grow: look again soon.
            return Some(Duration::from_millis(1));
        }
        let st = self.lock();
        match (&st.flushing, st.since) {
            (None, Some(t)) => Some(self.window.saturating_sub(t.elapsed())),
            _ => None,
        }
    }
}

/// Log bytes promised to one admitted commit ([`Wal::admit`]); released on
/// drop.
pub struct LogReservation<'a> {
    wal: &'a Wal,
    bytes: u64,
}

impl Drop for LogReservation<'_> {
    fn drop(&mut self) {
        let prev = self.wal.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
        assert!(prev >= self.bytes, "log reservations released twice");
        self.wal.space_waiters.wake_all();
    }
}

/// Where the log resumes, from recovery or a fresh format.
#[derive(Debug, Clone, Copy)]
pub struct Resume {
    /// The next LSN (block aligned).
    pub end: u64,
    /// Checksum of the last valid record.
    pub last_crc: u32,
    /// Redo LSN of the last completed checkpoint.
    pub redo: u64,
    /// Sequence number of the last control block written.
    pub control_seq: u64,
    /// Bytes of the circular record stream.
    pub capacity: u64,
    /// The log's identity (written into every control block).
    pub log_id: u64,
    /// The end of the valid records found (at or below `end`: the bytes in
    /// between are whatever a torn flush left, skipped by recovery).
    pub valid_end: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Wal {
    /// A log on queue index `device` (of every worker), resuming at
    /// `resume` (its capacity included), flushes padded to `block` bytes.
    /// `file`: the log's target, if it may be shorter than its capacity
    /// and grow (a regular file; see [`recover::is_growable`]).
    pub fn new(
        device: usize,
        block: u64,
        window: Duration,
        resume: Resume,
        file: Option<crate::io::Target>,
    ) -> Result<Arc<Wal>> {
        let capacity = resume.capacity;
        if !block.is_power_of_two() || block > control::BLOCK || capacity % control::BLOCK != 0 {
            return Err(Error::InvalidArgument(format!(
                "log block {block} / capacity {capacity}: the block must be a power of two up to \
                 {} and the capacity a multiple of it",
                control::BLOCK
            )));
        }
        Ok(Arc::new(Wal {
            device,
            log_id: resume.log_id,
            resumed_at: resume.end,
            resumed_valid_end: resume.valid_end.min(resume.end),
            block,
            capacity,
            window,
            state: Mutex::new(State {
                end: resume.end,
                last_crc: resume.last_crc,
                buf: Vec::new(),
                buf_start: resume.end,
                flushing: None,
                since: None,
                redo: resume.redo,
                applying: BTreeMap::new(),
            }),
            durable: AtomicU64::new(resume.end),
            fpi_below: AtomicU64::new(resume.end),
            reserved: AtomicU64::new(0),
            wanted: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            has_waiters: AtomicBool::new(false),
            space_waiters: Arc::default(),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(None),
            control_seq: AtomicU64::new(resume.control_seq),
            checkpoint_wanted: AtomicBool::new(false),
            in_checkpoint: AtomicBool::new(false),
            growth: file
                .filter(|f| recover::is_growable(f) && f.size() < CONTROL_BYTES + resume.capacity)
                .map(|f| LogGrowth {
                    allocated: Arc::new(AtomicU64::new(f.size().saturating_sub(CONTROL_BYTES))),
                    file: f,
                    grower: Grower::default(),
                    blocked: AtomicBool::new(false),
                    growths: Arc::default(),
                }),
            stats: WalStats::default(),
        }))
    }

    /// True if the stream up to LSN `end` lies in the part of the file
    /// that exists (always, once the first lap is grown: a flush that wraps
    /// follows a first lap written whole).
    fn has_room(&self, end: u64) -> bool {
        self.growth
            .as_ref()
            .is_none_or(|g| end.min(self.capacity) <= g.allocated.load(Ordering::Acquire))
    }

    /// Starts growing the log file if the stream end `end` comes within
    /// the growth margin of the file's end (a 64th of the log, at least
    /// 256 KiB, at most half of what the file has), unless a growth runs
    /// or one failed under a second ago. A growth at least doubles the
    /// file, so a log reaches its capacity in a few steps.
    fn grow_ahead(&self, end: u64) {
        let Some(g) = &self.growth else { return };
        let allocated = g.allocated.load(Ordering::Acquire);
        let margin = (self.capacity / 64).max(256 << 10).min(allocated / 2);
        if allocated >= self.capacity || end + margin <= allocated {
            return;
        }
        if g.grower.recent_failure(LOG_GROWTH_RETRY).is_some() {
            return;
        }
        let mib = |v: u64| {
            v.div_ceil(1 << 20)
                .saturating_mul(1 << 20)
                .min(self.capacity)
        };
        let target = mib((end + 2 * margin).max(allocated * 2));
        // If the file system has no room for that, what this flush needs.
        let least = mib(end + margin);
        let (file, alloc, growths) = (g.file.clone(), g.allocated.clone(), g.growths.clone());
        let work = move || {
            let grown = match file.grow_zeroed(CONTROL_BYTES + target) {
                Err(Error::NoSpace(_)) if least < target => {
                    file.grow_zeroed(CONTROL_BYTES + least).map(|()| least)
                }
                r => r.map(|()| target),
            };
            grown.map_err(|e| e.to_string()).map(|grown| {
                alloc.fetch_max(grown, Ordering::AcqRel);
                growths.fetch_add(1, Ordering::Relaxed);
            })
        };
        // Commits waiting for log room look again when it ends. A failure
        // to start is recorded by the grower: admission reports it and the
        // next pump tries again after the retry delay.
        let waiters = self.space_waiters.clone();
        let _ = g
            .grower
            .start("dana-log-grow", work, move |_| waiters.wake_all());
    }

    /// Waits for a growth of the log file in progress to finish (at close:
    /// no thread may write to the file once its lock is released).
    pub fn finish_growth(&self) {
        if let Some(g) = &self.growth {
            g.grower.finish();
        }
    }

    /// Whether the stream up to LSN `upto` (and a margin for the records
    /// no commit promised: flush markers, checkpoints) fits in the log
    /// file: Some(Ok) if it does, None if the file is growing to it (the
    /// growth wakes the space waiters), Some(Err(NoSpace)) if its last
    /// growth failed under a second ago.
    fn log_room(&self, upto: u64) -> Option<Result<()>> {
        let Some(g) = &self.growth else {
            return Some(Ok(()));
        };
        let upto = upto + (self.capacity / 64).max(256 << 10);
        if self.has_room(upto) {
            return Some(Ok(()));
        }
        let failed = || {
            g.grower
                .recent_failure(LOG_GROWTH_RETRY)
                .map(|what| Err(Error::NoSpace(format!("the log file cannot grow: {what}"))))
        };
        if let Some(e) = failed() {
            return Some(e);
        }
        self.grow_ahead(upto);
        // A growth thread that could not start is a failure now (no
        // completion would wake the caller).
        failed()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stream bytes of the log file.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Everything before this LSN is on stable storage.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// A page whose LSN is below this logs a full image at its next change.
    pub fn full_image_below(&self) -> u64 {
        self.fpi_below.load(Ordering::Acquire)
    }

    /// The error that stopped the log, if any.
    pub fn poisoned(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        let p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        Some(Error::Poisoned(
            p.clone().unwrap_or_else(|| "log failure".into()),
        ))
    }

    /// Stops the log for good: every later append and wait fails.
    pub fn poison_with(&self, e: &Error) {
        {
            let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
            if p.is_none() {
                *p = Some(format!("log: {e}"));
            }
        }
        self.poisoned.store(true, Ordering::Release);
        self.wake_waiters(true);
        self.space_waiters.wake_all();
    }

    /// Counters.
    pub fn stats(&self) -> WalStatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let end = self.lock().end;
        WalStatsSnapshot {
            records: l(&self.stats.records),
            bytes: l(&self.stats.bytes),
            flushes: l(&self.stats.flushes),
            commits: l(&self.stats.commits),
            commit_bytes: l(&self.stats.commit_bytes),
            page_bytes: l(&self.stats.page_bytes),
            images: l(&self.stats.images),
            admit_waits: l(&self.stats.admit_waits),
            checkpoints: l(&self.stats.checkpoints),
            file_growths: self.growth.as_ref().map_or(0, |g| l(&g.growths)),
            durable: self.durable(),
            end,
        }
    }

    /// Appends a page section to `b`: a count, then one entry per changed
    /// page of `changes` (a difference, or a full image where the rules of
    /// FORMAT.md ask for one). Returns the entries written.
    fn put_pages(&self, b: &mut record::RecordBuilder, changes: &[PageChange<'_>]) -> u32 {
        let count_at = b.len();
        b.u32(0);
        let mut n = 0u32;
        let mut images = 0;
        let fpi_below = self.full_image_below();
        for c in changes {
            // A new page, the first change since a checkpoint began (a
            // torn write-back of it can be rebuilt), or a page the pool
            // kept no copy of (covered changes since its last record are
            // in no page record, so a difference would not compose at
            // redo): the whole page.
            let before = match c.before {
                Some(b) if !c.fresh && page::page_lsn(c.after) >= fpi_below => Some(b),
                _ => None,
            };
            let full = before.is_none();
            let segs = match before {
                Some(b) => record::diff(b, c.after),
                None => record::image(c.after),
            };
            if !full && segs.is_empty() {
                continue;
            }
            let flags = if full { record::FULL_IMAGE } else { 0 };
            record::put_page_entry(b, c.pid, flags, c.after, &segs);
            n += 1;
            images += u64::from(full);
        }
        b.set_u32_at(count_at, n);
        self.stats.images.fetch_add(images, Ordering::Relaxed);
        n
    }

    /// Appends an unsealed record; returns its LSN and the LSN after it.
    pub fn append(&self, record: Vec<u8>) -> Result<(u64, u64)> {
        self.append_inner(record, false)
    }

    /// Appends a commit record and registers it as being applied until
    /// [`Wal::applied`].
    pub fn append_commit(&self, record: Vec<u8>) -> Result<(u64, u64)> {
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats
            .commit_bytes
            .fetch_add(record.len() as u64, Ordering::Relaxed);
        self.append_inner(record, true)
    }

    fn append_inner(&self, mut record: Vec<u8>, applying: bool) -> Result<(u64, u64)> {
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        let len = record.len() as u64;
        if len > self.capacity / 8 {
            return Err(Error::TooLarge {
                what: "log record",
                len: record.len(),
                max: (self.capacity / 8) as usize,
            });
        }
        let mut st = self.lock();
        let lsn = st.end;
        st.last_crc = record::seal(&mut record, lsn, st.last_crc);
        st.buf.extend_from_slice(&record);
        st.end += len;
        st.since.get_or_insert_with(Instant::now);
        if applying {
            *st.applying.entry(lsn).or_insert(0) += 1;
        }
        let end = st.end;
        drop(st);
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(len, Ordering::Relaxed);
        Ok((lsn, end))
    }

    /// The commit at `lsn` is fully applied to the pages.
    pub fn applied(&self, lsn: u64) {
        let mut st = self.lock();
        if let Some(n) = st.applying.get_mut(&lsn) {
            *n -= 1;
            if *n == 0 {
                st.applying.remove(&lsn);
            }
        }
    }

    /// Waits until the log is durable up to `end` (an LSN returned by an
    /// append). Fails if the log is poisoned.
    pub fn wait_durable(self: &Arc<Self>, end: u64) -> DurableWait {
        DurableWait {
            wal: self.clone(),
            end,
        }
    }

    /// Asks for a flush up to `lsn` without waiting (write-back of a page
    /// whose record is not yet durable).
    pub fn want(&self, lsn: u64) {
        self.wanted.fetch_max(lsn, Ordering::AcqRel);
    }

    /// Stream bytes in use: appended since the last checkpoint's redo LSN.
    pub fn used(&self) -> u64 {
        let st = self.lock();
        st.end - st.redo
    }

    /// Admits a commit that may append up to `bytes` (its record and the
    /// page changes of its apply): waits (asking for a checkpoint) until
    /// the log in use plus every admitted commit's promise plus `bytes`
    /// fits in three quarters of the log. So however many commits run at
    /// once, the log never fills with records a checkpoint cannot get
    /// past: a full log could not be flushed, and a checkpoint needs a
    /// flush (the first version admitted whoever came while the log was
    /// under half full; 32 committers overran it). A promise larger than
    /// a quarter of the log counts as a quarter (one huge transaction
    /// still runs, with less margin). Released when the returned
    /// reservation drops.
    pub async fn admit(&self, bytes: u64) -> Result<LogReservation<'_>> {
        let bytes = bytes.min(self.capacity / 4);
        let mut waited = false;
        std::future::poll_fn(|cx| {
            if let Some(r) = self.try_admit(bytes) {
                return std::task::Poll::Ready(r);
            }
            if !waited {
                waited = true;
                self.stats.admit_waits.fetch_add(1, Ordering::Relaxed);
            }
            // Parked until a reservation drops, a checkpoint frees log or
            // the log fails; the second look catches a change made before
            // the registration.
            self.space_waiters.register(cx.waker());
            match self.try_admit(bytes) {
                Some(r) => std::task::Poll::Ready(r),
                None => std::task::Poll::Pending,
            }
        })
        .await
    }

    /// One attempt of [`Wal::admit`]: None if the log has no room now.
    fn try_admit(&self, bytes: u64) -> Option<Result<LogReservation<'_>>> {
        let limit = self.capacity / 4 * 3;
        // Loops only when another commit changed `reserved` in between.
        loop {
            if let Some(e) = self.poisoned() {
                return Some(Err(e));
            }
            let (end, used) = {
                let st = self.lock();
                (st.end, st.end - st.redo)
            };
            if used > self.capacity / 2 {
                self.request_checkpoint();
            }
            let cur = self.reserved.load(Ordering::Acquire);
            // Every admitted commit's bytes fit in the file as grown: a
            // flush never waits for a growth that may fail.
            match self.log_room(end + cur + bytes) {
                Some(Ok(())) => {}
                Some(Err(e)) => return Some(Err(e)),
                None => return None,
            }
            if used + cur + bytes > limit {
                return None;
            }
            if self
                .reserved
                .compare_exchange(cur, cur + bytes, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(Ok(LogReservation { wal: self, bytes }));
            }
        }
    }

    fn wake_waiters(&self, all: bool) {
        let durable = self.durable();
        let woken: Vec<Waker> = {
            let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = Vec::new();
            w.retain(|(end, waker)| {
                if all || *end <= durable {
                    out.push(waker.clone());
                    false
                } else {
                    true
                }
            });
            self.has_waiters.store(!w.is_empty(), Ordering::Release);
            out
        };
        for w in woken {
            w.wake();
        }
    }

    /// Starts a flush if one is needed and none is in flight. Runs on a
    /// worker (it queues I/O). Returns true if it started one.
    pub fn pump(&self) -> bool {
        if self.poisoned.load(Ordering::Acquire) {
            return false;
        }
        let mut st = self.lock();
        // A quarter of the log in use asks for a checkpoint, unless one is
        // running (it frees the log only when it finishes; asking again
        // would start a second one right after it).
        if !self.checkpoint_wanted.load(Ordering::Acquire)
            && !self.in_checkpoint.load(Ordering::Acquire)
            && st.end - st.redo > self.capacity / 4
        {
            drop(st);
            self.request_checkpoint();
            st = self.lock();
        }
        if st.flushing.is_some() || st.buf.is_empty() {
            return false;
        }
        let durable = self.durable();
        let need = self.has_waiters.load(Ordering::Acquire)
            || self.wanted.load(Ordering::Acquire) > durable
            || st.since.is_some_and(|t| t.elapsed() >= self.window);
        if !need {
            return false;
        }
        let start = st.buf_start;
        let end = align_up(st.end + record::FLUSH_MARKER_LEN as u64, self.block);
        self.grow_ahead(end);
        if !self.has_room(end) {
            // The log file has not grown that far yet: the flush waits
            // for the growth thread (due_in polls meanwhile).
            if let Some(g) = &self.growth {
                g.blocked.store(true, Ordering::Release);
            }
            return false;
        }
        if let Some(g) = &self.growth {
            g.blocked.store(false, Ordering::Release);
        }
        if end - st.redo > self.capacity {
            // The records would overwrite log space the last checkpoint
            // still needs. Admission keeps half of the log free for
            // operations in progress; getting here means it did not.
            drop(st);
            self.request_checkpoint();
            return false;
        }
        // The flush's last record names the LSN durable now: recovery tells
        // damage to durable records from a torn last flush with it.
        let proven = if durable <= self.resumed_at {
            self.resumed_valid_end
        } else {
            durable
        };
        let mut marker = record::flush_marker(proven).into_unsealed();
        let at = st.end;
        st.last_crc = record::seal(&mut marker, at, st.last_crc);
        st.buf.extend_from_slice(&marker);
        st.end += marker.len() as u64;
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(marker.len() as u64, Ordering::Relaxed);
        let pad = (end - st.end) as usize;
        let new_len = st.buf.len() + pad;
        st.buf.resize(new_len, 0);
        st.end = end;
        st.buf_start = end;
        st.since = None;
        let data = std::mem::take(&mut st.buf);
        // Split at the file's wrap point.
        let mut pieces = Vec::new();
        let mut at = start;
        while at < end {
            let in_lap = at % self.capacity;
            let n = (end - at).min(self.capacity - in_lap);
            pieces.push((CONTROL_BYTES + in_lap, (at - start) as usize, n as usize));
            at += n;
        }
        st.flushing = Some(Flushing {
            end,
            writes: pieces.len(),
        });
        drop(st);
        self.stats.bytes.fetch_add(pad as u64, Ordering::Relaxed);
        for (offset, from, len) in pieces {
            let queued = AlignedBuf::new(len, control::BLOCK as usize).and_then(|mut b| {
                b[..len].copy_from_slice(&data[from..from + len]);
                let tag = RequestKind::Log.tag(FLUSH_WRITE);
                sched::enqueue(self.device, Request::write(tag, offset, IoBuf::owned(b)))
                    .map_err(|_| Error::WouldBlock)
            });
            if let Err(e) = queued {
                self.poison_with(&e);
                return false;
            }
        }
        true
    }

    /// A completion of one of a flush's requests (`id`: which).
    fn flush_completed(&self, id: u64, c: Completion) {
        if let Err(e) = c.result {
            self.lock().flushing = None;
            self.poison_with(&e);
            return;
        }
        if id == FLUSH_WRITE {
            let all_written = {
                let mut st = self.lock();
                match st.flushing.as_mut() {
                    Some(f) => {
                        f.writes -= 1;
                        f.writes == 0
                    }
                    None => false,
                }
            };
            if all_written {
                let tag = RequestKind::Log.tag(FLUSH_SYNC);
                if sched::enqueue(self.device, Request::flush(tag)).is_err() {
                    self.poison_with(&Error::WouldBlock);
                }
            }
            return;
        }
        // The fdatasync completed: the flushed range is durable.
        let end = self.lock().flushing.take().map(|f| f.end);
        if let Some(end) = end {
            self.durable.fetch_max(end, Ordering::AcqRel);
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
        self.wake_waiters(false);
        self.pump();
    }

    // ---- checkpoints ----------------------------------------------------

    /// True when a checkpoint should run: the flush step saw a quarter of
    /// the log in use, or a commit short of space asked (one atomic load:
    /// every worker's checkpoint step asks every round).
    pub fn checkpoint_due(&self) -> bool {
        self.checkpoint_wanted.load(Ordering::Acquire)
    }

    /// Asks for a checkpoint (the checkpoint step starts one).
    pub fn request_checkpoint(&self) {
        self.checkpoint_wanted.store(true, Ordering::Release);
    }

    /// Starts a checkpoint: its redo LSN (the end of the log, or the
    /// oldest commit still being applied). From now on the first change
    /// of every page last changed before the log end logs a full image:
    /// the bound is the log end, not the redo LSN, because a page changed
    /// between the two is written back by this checkpoint and its next
    /// change is the first record after the redo LSN that can rebuild it
    /// from a torn write.
    pub fn begin_checkpoint(&self) -> u64 {
        self.checkpoint_wanted.store(false, Ordering::Release);
        self.in_checkpoint.store(true, Ordering::Release);
        let st = self.lock();
        let redo = st
            .applying
            .keys()
            .next()
            .copied()
            .unwrap_or(st.end)
            .min(st.end);
        self.fpi_below.fetch_max(st.end, Ordering::AcqRel);
        redo
    }

    /// The LSN after the last record appended.
    pub fn end(&self) -> u64 {
        self.lock().end
    }

    /// Ends a checkpoint whose record is durable at `lsn`: writes the
    /// control block naming it, syncs it, and frees the log before `redo`.
    pub async fn finish_checkpoint(&self, lsn: u64, redo: u64) -> Result<()> {
        let seq = self.control_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let block = control::Control {
            seq,
            checkpoint: lsn,
            redo,
            capacity: self.capacity,
            block: self.block,
            log_id: self.log_id,
        }
        .encode();
        let offset = (seq % 2) * control::BLOCK;
        let mut buf = AlignedBuf::new(control::BLOCK as usize, control::BLOCK as usize)?;
        buf[..block.len()].copy_from_slice(&block);
        self.op(Request::write(0, offset, IoBuf::owned(buf)))
            .await?;
        self.op(Request::flush(0)).await?;
        let mut st = self.lock();
        st.redo = st.redo.max(redo);
        drop(st);
        self.in_checkpoint.store(false, Ordering::Release);
        self.space_waiters.wake_all();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One request on the log device, awaited; a failure poisons the log.
    async fn op(&self, req: Request) -> Result<()> {
        let r = sched::perform(self.device, req).await;
        if let Err(e) = &r {
            self.poison_with(e);
        }
        r
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.finish_growth();
    }
}

/// Resolves once the log is durable up to an LSN.
pub struct DurableWait {
    wal: Arc<Wal>,
    end: u64,
}

impl Future for DurableWait {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let wal = &self.wal;
        if let Some(e) = wal.poisoned() {
            return Poll::Ready(Err(e));
        }
        if wal.durable() >= self.end {
            return Poll::Ready(Ok(()));
        }
        {
            let mut w = wal.waiters.lock().unwrap_or_else(|e| e.into_inner());
            w.push((self.end, cx.waker().clone()));
            wal.has_waiters.store(true, Ordering::Release);
        }
        // A flush may have completed between the check and the push.
        if wal.durable() >= self.end || wal.poisoned.load(Ordering::Acquire) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::record::{self, Write};

    fn wal() -> Arc<Wal> {
        Wal::new(
            0,
            512,
            Duration::from_secs(3600),
            Resume {
                end: 512,
                last_crc: 0,
                redo: 512,
                control_seq: 0,
                capacity: 1 << 20,
                log_id: 1,
                valid_end: 512,
            },
            None,
        )
        .unwrap()
    }

    fn commit() -> Vec<u8> {
        let w = Write::new(1, b"k".to_vec(), Some(b"v".to_vec()));
        record::commit(&[w]).into_unsealed()
    }

    /// A waker that counts its wake-ups.
    struct CountingWaker(AtomicU64);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A commit that finds no room in the log parks (no spinning) and is
    /// woken when a reservation drops; it then gets in.
    #[test]
    fn admit_parks_until_a_reservation_drops() {
        let w = wal();
        let quarter = w.capacity() / 4;
        let held: Vec<_> = (0..3)
            .map(|_| {
                let mut f = std::pin::pin!(w.admit(quarter));
                let noop = std::task::Waker::noop();
                match f.as_mut().poll(&mut std::task::Context::from_waker(noop)) {
                    std::task::Poll::Ready(r) => r.unwrap(),
                    std::task::Poll::Pending => panic!("three quarters fit"),
                }
            })
            .collect();
        let counter = Arc::new(CountingWaker(AtomicU64::new(0)));
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut f = std::pin::pin!(w.admit(64));
        assert!(f.as_mut().poll(&mut cx).is_pending(), "the log is full");
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(counter.0.load(Ordering::Relaxed), 0);
        assert_eq!(w.stats().admit_waits, 1, "one commit waited");
        drop(held);
        assert!(counter.0.load(Ordering::Relaxed) >= 1, "woken");
        let admitted = matches!(f.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(_)));
        assert!(admitted, "room after the drop");
    }

    /// A checkpoint whose redo LSN stays at a commit still being applied
    /// must still ask for full images of every page changed before it
    /// began: those pages are written back by this checkpoint, and their
    /// next change is the first the log has after the redo LSN that could
    /// rebuild them from a torn write. (The first version used the redo
    /// LSN as the bound: pages changed between it and the log end logged
    /// diffs only, and a 16-committer crash test found a torn page that
    /// recovery could not rebuild.)
    #[test]
    fn a_checkpoint_behind_an_applying_commit_asks_full_images_up_to_the_log_end() {
        let w = wal();
        let (slow, _) = w.append_commit(commit()).unwrap();
        let (_, end) = w.append_commit(commit()).unwrap();
        w.applied(end - 1); // not the slow one's LSN: no effect
        let redo = w.begin_checkpoint();
        assert_eq!(
            redo, slow,
            "the redo LSN waits for the commit being applied"
        );
        assert!(
            w.full_image_below() >= end,
            "pages changed up to the log end ({end}) must log a full image at their next change, \
             but only those below {} do",
            w.full_image_below()
        );
    }
}
