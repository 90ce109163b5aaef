//! The buffer manager: pages of an array served from a DRAM pool much
//! smaller than the data.
//!
//! Owns: the frame memory (one aligned allocation, registered with the
//! kernel), the per-frame metadata, the page table (`page_table`: state
//! word + frame index per page id), the reads in flight ([`inflight`]),
//! the free-frame list, clock eviction and write-back, and the meta page
//! with persistent page allocation ([`alloc`]).
//!
//! A page is fixed from inside a task with [`BufferPool::fix_shared`],
//! [`BufferPool::fix_exclusive`] or [`BufferPool::fix_optimistic`]. A miss
//! takes a free frame, moves the page EVICTED -> LOADING, queues a read on
//! the current worker's queue for the page's device and awaits it; other
//! tasks faulting the same page await the same read. The worker that reaps
//! the read verifies checksum and page id, publishes the frame and wakes
//! the waiters. Eviction (second chance over frames, in batches) runs as a
//! system task in every worker loop when free frames fall below a low
//! watermark: clean victims are freed at once; dirty ones are written back
//! asynchronously from a copy taken under the exclusive latch (released at
//! once, a `writing` flag guarding the frame until the write completes)
//! and become clean candidates once it completed (freed on a later pass if
//! nobody touched them).
//!
//! Invariants:
//! - A frame holds at most one page; `frames[f].pid == p` and
//!   `table.frame(p) == f` while `p` is resident.
//! - Frame bytes are written only under an exclusive latch or while the
//!   page is LOADING (by the kernel); write-back seals the checksum and
//!   copies the page under the exclusive latch, then releases it without
//!   a new version (the content is unchanged) and writes the copy.
//! - A dirty page is never evicted before its write completed.
//!
//! Never: returns a page whose checksum or page id did not verify, blocks a
//! thread, or retries a failed write silently (a failed write poisons the
//! pool: [`Error::Poisoned`] for every later write-back and flush).

pub mod alloc;
pub mod blob;
mod grow;
pub mod inflight;
pub mod page;
pub mod page_log;
mod page_table;
pub mod policy;
pub mod records;
mod scrub;
pub(crate) use scrub::{newest_version, PageRepair};
pub mod space_map;
mod stall;
mod trim;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::io::{AlignedBuf, Array, Completion, FrameMemory, IoBuf, Placement, Request};
use crate::sched::{self, CompletionHandler, IoTiming, RequestKind, SystemTask};
use crate::sched::{IoWait, WakerList};
use crate::stats::{Histogram, HistogramSnapshot, StripedCounter};
use crate::{Error, Result};
use alloc::SpaceGuard;
use inflight::InFlight;
use page_log::{PageChange, PageLog};
use page_table::{
    lock_of, version_of, PageTable, EVICTED, EXCLUSIVE, LOADING, MAX_SHARED, UNLOCKED,
};

pub use page::{PageType, PAGE_HEADER_SIZE};
pub use policy::EvictionPolicy;
use policy::{watt_value, History};
use records::RecordCache;
use stall::WriteStall;

/// A value alone on its cache line.
#[repr(align(64))]
struct Padded<T>(T);

const NO_PAGE: u64 = u64::MAX;
/// WATT: frames compared for each eviction.
const WATT_SAMPLE: usize = 8;

/// A frame of a WATT sample.
struct Candidate {
    value: u32,
    frame: u32,
    pid: u64,
    dirty: bool,
}

/// Buffer pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Number of page frames (pool bytes = frames x page size).
    pub frames: usize,
    /// Dirty pages one eviction batch may start writing.
    pub max_writes_per_batch: usize,
    /// Never write a page (a read-only open): a write-back fails with
    /// [`Error::ReadOnly`].
    pub read_only: bool,
    /// Write pages back untorn ([`crate::io::Request::atomic`]): every
    /// data device offers it, and the log relies on it (no torn-page
    /// images).
    pub untorn_writes: bool,
    /// How pages are chosen for eviction and write-back.
    pub eviction: EvictionPolicy,
    /// WATT: how many reads one write of a page weighs.
    pub write_weight: u32,
    /// WATT: the fewest write-backs eviction may keep in flight; the cap
    /// is half the devices' in-flight limits as they adapt, when that is
    /// more (the rest stays with reads, which the scheduler also serves
    /// first). Checkpoints are not limited.
    pub max_writes_in_flight: usize,
    /// Bytes for hot records beside the frames ([`records`]; 0: none).
    pub record_cache_bytes: usize,
    /// Without a log attached (a read-only open): the logs' end. A page
    /// read with an LSN at or past it fails as newer than the log, as
    /// with a log attached (None: no check).
    pub lsn_end: Option<u64>,
}

impl PoolConfig {
    /// A pool of `frames` frames.
    pub fn with_frames(frames: usize) -> PoolConfig {
        PoolConfig {
            frames,
            max_writes_per_batch: 64,
            read_only: false,
            untorn_writes: false,
            eviction: EvictionPolicy::default(),
            write_weight: 4,
            max_writes_in_flight: 16,
            record_cache_bytes: 0,
            lsn_end: None,
        }
    }
}

struct FrameMeta {
    pid: AtomicU64,
    /// Clock: fixed since the hand last passed.
    referenced: AtomicBool,
    /// WATT: epochs of the last fixes and of the last logged changes.
    reads: History,
    writes: History,
    dirty: AtomicBool,
    writing: AtomicBool,
    /// The layer above checked the page's contents whole since it came
    /// into this frame ([`PageMut::contents_checked`]); cleared when a
    /// page arrives.
    checked: AtomicBool,
}

/// Counters of the buffer pool.
#[derive(Default)]
pub struct PoolStats {
    /// Bumped at every fix served from memory, by every worker: striped.
    hits: StripedCounter,
    misses: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    writebacks: AtomicU64,
    hot_writebacks: AtomicU64,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    frame_waits: AtomicU64,
    held_descents: AtomicU64,
    prefetches: AtomicU64,
    /// Large-value I/Os and their bytes (never through frames).
    blob_reads: AtomicU64,
    blob_read_bytes: AtomicU64,
    blob_writes: AtomicU64,
    blob_write_bytes: AtomicU64,
    blob_repairs: AtomicU64,
    page_copy_repairs: AtomicU64,
    page_copy_repairs_left: AtomicU64,
    /// Data-file syncs ([`BufferPool::sync_devices`], one per device).
    device_syncs: AtomicU64,
    flush_log_waits: AtomicU64,
    eviction_writes_in_flight_max: AtomicU64,
    /// How long each wait for a free frame took.
    frame_wait: Histogram,
    /// Submit -> reap of page reads: time in the kernel and the device.
    device_read: Histogram,
    /// Reap -> the faulting task runs again: time waiting to be resumed.
    resume: Histogram,
    /// Fault -> the faulting task has its page: the whole miss.
    miss: Histogram,
}

/// A copy of the pool's counters.
#[derive(Debug, Clone, Default)]
pub struct PoolStatsSnapshot {
    /// Fixes served from memory.
    pub hits: u64,
    /// Fixes that started a read.
    pub misses: u64,
    /// Page reads completed.
    pub reads: u64,
    /// Page writes completed.
    pub writes: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Dirty pages written back by eviction or flush.
    pub writebacks: u64,
    /// Of those, the ones placed as hot (the rest as cold): see
    /// `policy::HeatSplit`.
    pub hot_writebacks: u64,
    /// Reads that failed (I/O error or verification).
    pub read_errors: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// Times a task waited for a free frame.
    pub frame_waits: u64,
    /// How long those waits took.
    pub frame_wait: HistogramSnapshot,
    /// Tree descents that held their path under the structure guard
    /// (optimistic ones kept being undone: [`BufferPool::structure_change`]).
    pub held_descents: u64,
    /// Reads started ahead of need by scans.
    pub prefetches: u64,
    /// Free frames now.
    pub free_frames: usize,
    /// Frames holding a dirty page now.
    pub dirty_frames: usize,
    /// Times the data files grew.
    pub growths: u64,
    /// Pages the array holds now.
    pub array_pages: u64,
    /// Submit -> reap of page reads (kernel + device).
    pub device_read: HistogramSnapshot,
    /// Reap -> task resumed.
    pub resume: HistogramSnapshot,
    /// Whole miss, fault -> page available.
    pub miss: HistogramSnapshot,
    /// Large-value reads (one I/O each, up to 1 MiB).
    pub blob_reads: u64,
    /// Bytes those reads moved.
    pub blob_read_bytes: u64,
    /// Large-value writes (one I/O each, up to 1 MiB).
    pub blob_writes: u64,
    /// Bytes those writes moved.
    pub blob_write_bytes: u64,
    /// Large values found damaged on one copy of mirrored devices, read
    /// whole from another and written back over the damaged one.
    pub blob_repairs: u64,
    /// Pages whose damaged copies on mirrored devices were written from a
    /// valid version: the pool's clean one, or the valid copies' (`Db::rebuild`).
    pub page_copy_repairs: u64,
    /// Pages with a damaged copy that `Db::rebuild` left because freed
    /// pages kept changing hands while it looked (large values written,
    /// trims): a later rebuild, or a read that meets the damaged copy,
    /// repairs them.
    pub page_copy_repairs_left: u64,
    /// Syncs of the data files (one per device per
    /// [`BufferPool::sync_devices`]: large values before their commit,
    /// checkpoints).
    pub device_syncs: u64,
    /// Times a flush of the pool ([`BufferPool::flush_where`]: a
    /// checkpoint) asked to wait for the log to be durable past pages it
    /// found changed since the log's last flush (a wait returns at once
    /// where the log got there first): one covers every such page its
    /// scan set aside, and one more every page changed again since.
    pub flush_log_waits: u64,
    /// The most page writes in flight at once right after eviction started
    /// one: at most eviction's write cap (half the data devices' in-flight
    /// limits as they adapt, at least [`PoolConfig::max_writes_in_flight`]).
    pub eviction_writes_in_flight_max: u64,
}

/// The buffer pool.
pub struct BufferPool {
    array: Array,
    page_size: usize,
    memory: FrameMemory,
    frames: Box<[FrameMeta]>,
    table: PageTable,
    inflight: InFlight,
    free: Mutex<Vec<u32>>,
    free_count: AtomicUsize,
    frame_waiters: WakerList,
    /// 1 while a task holds the [`StructureGuard`], else 0.
    structure: AtomicU64,
    /// Tasks waiting for the [`StructureGuard`].
    structure_waiters: WakerList,
    clock: AtomicUsize,
    /// WATT's time: one epoch per `epoch_unit` evictions, modulo
    /// [`policy::EPOCH_MODULUS`] (its own cache line: every fix reads it,
    /// eviction rarely writes it).
    epoch: Padded<AtomicU64>,
    epoch_unit: u64,
    /// Sorts write-backs into hot and cold placement classes.
    heat: policy::HeatSplit,
    policy: EvictionPolicy,
    write_weight: u32,
    max_writes_in_flight: usize,
    /// Frames holding a dirty page.
    dirty_frames: AtomicUsize,
    /// WATT: above this many dirty frames, eviction also writes back the
    /// coldest dirty page of each sample, however valuable.
    dirty_limit: usize,
    /// Write-backs in flight, and whether the last eviction batch freed
    /// nothing and started no write while some were: batches are skipped
    /// until one completes (a batch that scans the whole pool for nothing,
    /// every loop round, burned 70% of the CPU).
    writes: WriteStall,
    /// Tasks waiting for a write-back to complete (a checkpoint's flush
    /// waiting for its writes, a large value taking a page being
    /// written): woken by every write completion. Polling the `writing`
    /// flag instead had a checkpoint's flush yield ~2 times per insert in
    /// `dana bench commit`, and kept its worker from sleeping.
    writes_done: WakerList,
    low_water: usize,
    high_water: usize,
    max_writes_per_batch: usize,
    read_only: bool,
    /// See [`PoolConfig::lsn_end`].
    lsn_end: Option<u64>,
    /// [`PoolConfig::untorn_writes`].
    untorn_writes: bool,
    stats: PoolStats,
    poison: Mutex<Option<String>>,
    poisoned: AtomicBool,
    alloc: Arc<alloc::AllocState>,
    wal: std::sync::OnceLock<Arc<dyn PageLog>>,
    /// Hot records beside the frames (the trees fill and invalidate it).
    records: RecordCache,
}

/// How a page is latched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Shared,
    Exclusive,
}

impl BufferPool {
    /// A pool of `config.frames` frames over `array`. No I/O happens until
    /// pages are fixed from inside the workers' tasks.
    pub fn new(array: Array, config: &PoolConfig) -> Result<Arc<BufferPool>> {
        if config.frames < 4 {
            return Err(Error::InvalidArgument(format!(
                "a buffer pool needs at least 4 frames, not {}",
                config.frames
            )));
        }
        if config.frames > u32::MAX as usize / 2 {
            return Err(Error::InvalidArgument("too many frames".into()));
        }
        let page_size = array.page_size() as usize;
        let bytes = config
            .frames
            .checked_mul(page_size)
            .ok_or_else(|| Error::InvalidArgument("pool size overflows".into()))?;
        let memory = FrameMemory::new(AlignedBuf::new(bytes, page_size.max(4096))?);
        let frames = (0..config.frames)
            .map(|_| FrameMeta {
                pid: AtomicU64::new(NO_PAGE),
                referenced: AtomicBool::new(false),
                reads: History::default(),
                writes: History::default(),
                dirty: AtomicBool::new(false),
                writing: AtomicBool::new(false),
                checked: AtomicBool::new(false),
            })
            .collect();
        // Sized for the most the array can grow to (the mapping costs
        // memory only where pages are used), capped at 2^36 page ids.
        let table = PageTable::new(array.max_pages().min(1 << 36))?;
        let low_water = (config.frames / 32).clamp(2, 4096);
        let high_water = (low_water * 2).min(config.frames / 2).max(low_water + 1);
        Ok(Arc::new(BufferPool {
            page_size,
            memory,
            frames,
            table,
            inflight: InFlight::new(),
            free: Mutex::new((0..config.frames as u32).rev().collect()),
            free_count: AtomicUsize::new(config.frames),
            frame_waiters: WakerList::default(),
            structure: AtomicU64::new(0),
            structure_waiters: WakerList::default(),
            clock: AtomicUsize::new(0),
            epoch: Padded(AtomicU64::new(0)),
            epoch_unit: (config.frames as u64 / 64).max(1),
            heat: policy::HeatSplit::default(),
            policy: config.eviction,
            write_weight: config.write_weight,
            max_writes_in_flight: config.max_writes_in_flight.max(1),
            dirty_frames: AtomicUsize::new(0),
            dirty_limit: (config.frames / 4 * 3).max(1),
            writes: WriteStall::default(),
            writes_done: WakerList::default(),
            low_water,
            high_water,
            max_writes_per_batch: config.max_writes_per_batch.max(1),
            read_only: config.read_only,
            lsn_end: config.lsn_end,
            untorn_writes: config.untorn_writes,
            stats: PoolStats::default(),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            alloc: Arc::default(),
            wal: std::sync::OnceLock::new(),
            // Values up to a quarter page: small records, the ones whose
            // leaf a cache spares (a larger value fills its leaf anyway).
            records: RecordCache::new(config.record_cache_bytes, page_size / 4),
            array,
        }))
    }

    /// The frame memory (to register with the I/O queues).
    pub fn memory(&self) -> &FrameMemory {
        &self.memory
    }

    /// The array the pages live on.
    pub fn array(&self) -> &Array {
        &self.array
    }

    /// The cache of hot records beside the frames (see [`records`]).
    pub fn records(&self) -> &RecordCache {
        &self.records
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of frames.
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    /// A copy of the counters.
    pub fn stats(&self) -> PoolStatsSnapshot {
        let s = &self.stats;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolStatsSnapshot {
            hits: s.hits.get(),
            misses: l(&s.misses),
            reads: l(&s.reads),
            writes: l(&s.writes),
            evictions: l(&s.evictions),
            writebacks: l(&s.writebacks),
            hot_writebacks: l(&s.hot_writebacks),
            read_errors: l(&s.read_errors),
            write_errors: l(&s.write_errors),
            frame_waits: l(&s.frame_waits),
            frame_wait: s.frame_wait.snapshot(),
            held_descents: l(&s.held_descents),
            prefetches: l(&s.prefetches),
            free_frames: self.free_count.load(Ordering::Relaxed),
            dirty_frames: self.dirty_frames.load(Ordering::Relaxed),
            growths: self.alloc.growth.count(),
            array_pages: self.array.pages(),
            device_read: s.device_read.snapshot(),
            resume: s.resume.snapshot(),
            miss: s.miss.snapshot(),
            blob_reads: l(&s.blob_reads),
            blob_read_bytes: l(&s.blob_read_bytes),
            blob_writes: l(&s.blob_writes),
            blob_write_bytes: l(&s.blob_write_bytes),
            blob_repairs: l(&s.blob_repairs),
            page_copy_repairs: l(&s.page_copy_repairs),
            page_copy_repairs_left: l(&s.page_copy_repairs_left),
            device_syncs: l(&s.device_syncs),
            flush_log_waits: l(&s.flush_log_waits),
            eviction_writes_in_flight_max: l(&s.eviction_writes_in_flight_max),
        }
    }

    /// What a runtime serving this pool routes to it: the completions of
    /// page reads and write-backs, and the eviction step.
    pub fn services(self: &Arc<Self>) -> sched::Services {
        sched::Services::new()
            .handle(RequestKind::PageRead, self.clone())
            .handle(RequestKind::PageWrite, self.clone())
            .system_task(self.clone())
    }

    /// Attaches the write-ahead log: from now on every page change is
    /// logged when its exclusive latch is released, and write-back waits
    /// for a page's records to be durable. Set once, before use.
    pub fn attach_wal(&self, wal: Arc<dyn PageLog>) -> Result<()> {
        self.wal
            .set(wal)
            .map_err(|_| Error::InvalidArgument("the pool already has a log".into()))
    }

    /// True if write-back may write frame `f` (latched by the caller) now:
    /// no log, or the page's last record is durable. Otherwise asks the log
    /// for a flush and returns false.
    fn log_allows_write(&self, f: u32) -> bool {
        self.log_blocks_write(f).is_none()
    }

    /// None if frame `f` may be written (see [`BufferPool::log_allows_write`]),
    /// else the page LSN the log must be durable past first (a flush of
    /// it is asked for).
    fn log_blocks_write(&self, f: u32) -> Option<u64> {
        let wal = self.wal.get()?;
        // SAFETY: the caller holds the exclusive latch on the frame's page.
        let lsn = page::page_lsn(unsafe { self.frame_bytes(f) });
        if lsn < wal.durable() {
            return None;
        }
        wal.want(lsn + 1);
        Some(lsn)
    }

    /// Waits until the log is durable past `lsn`, or has stopped.
    async fn log_durable_past(&self, lsn: u64) {
        let Some(wal) = self.wal.get() else {
            return;
        };
        let done = || wal.durable() > lsn || wal.poisoned().is_some();
        std::future::poll_fn(|cx| {
            if done() {
                return Poll::Ready(());
            }
            wal.wake_when_durable(cx.waker());
            // A flush's end between the first look and the register.
            if done() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Logs the changes of several exclusively latched pages as one record
    /// (redone together or not at all: a split, a merge, an allocation).
    /// Call before the guards drop; their later drops log only what changes
    /// after this call.
    pub fn log_group(&self, pages: &mut [&mut PageMut<'_>]) -> Result<()> {
        let Some(wal) = self.wal.get() else {
            return Ok(());
        };
        self.log_pages_with(pages, |changes| {
            wal.log_changes(changes).map(|l| l.map(|lsn| (lsn, lsn)))
        })
        .map(|_| ())
    }

    /// Waits for room in the log for a change of up to `pages` pages that
    /// is not a commit (see [`PageLog::admit`]); None without a log. Hold
    /// the room until the change is logged; take it before any latch.
    pub async fn admit_log(&self, pages: u64) -> Result<Option<page_log::LogRoom>> {
        match self.wal.get() {
            Some(wal) => {
                let bytes = pages * (self.page_size as u64 + 64);
                Ok(Some(wal.admit(bytes).await?))
            }
            None => Ok(None),
        }
    }

    /// Appends the commit record `commit` (its writes, encoded by the log;
    /// the log adds the page changes) with the changes of the space
    /// guard's pages in it, so that they are redone exactly when the commit
    /// is: the map bits of a commit's large values. Returns the record's
    /// LSN and the LSN after it ((0, 0) without a log).
    pub fn log_commit<'a>(
        &'a self,
        space: &mut SpaceGuard<'a>,
        commit: Vec<u8>,
        dep: u64,
    ) -> Result<(u64, u64)> {
        let Some(wal) = self.wal.get() else {
            return Ok((0, 0));
        };
        let mut all: Vec<&mut PageMut<'a>> = vec![&mut space.meta];
        all.extend(space.maps.iter_mut());
        let mut commit = Some(commit);
        let logged = self.log_pages_with(&mut all, |changes| {
            let c = commit.take().unwrap_or_default();
            wal.log_commit(c, changes, dep).map(Some)
        })?;
        self.note_freed(space);
        Ok(logged.unwrap_or((0, 0)))
    }

    /// Hands the changes of `pages` to `append` (which logs them in one
    /// record and returns its LSN and the LSN after it, or None if it
    /// appended nothing) and gives the record's LSN to the pages it holds.
    fn log_pages_with(
        &self,
        pages: &mut [&mut PageMut<'_>],
        append: impl FnOnce(&[PageChange<'_>]) -> Result<Option<(u64, u64)>>,
    ) -> Result<Option<(u64, u64)>> {
        // Which pages the record holds: only they take its LSN. (A page
        // whose LSN moved without a record of it could skip the full image
        // its first change after a checkpoint owes: a crash run found
        // such a torn page that recovery could not rebuild.)
        // No allocation for the usual group (a split: up to 5 pages).
        let (mut small, mut large) = ([false; 16], Vec::new());
        let held: &mut [bool] = if pages.len() <= small.len() {
            &mut small[..pages.len()]
        } else {
            large.resize(pages.len(), false);
            &mut large
        };
        let logged = {
            let mut changes: Vec<PageChange<'_>> = Vec::with_capacity(pages.len());
            for (i, g) in pages.iter_mut().enumerate() {
                if let Some(c) = g.change() {
                    held[i] = true;
                    changes.push(c);
                }
            }
            append(&changes)
        };
        match logged {
            Ok(None) => Ok(None),
            Ok(Some((lsn, end))) => {
                for (i, g) in pages.iter_mut().enumerate() {
                    g.after_logged(held[i].then_some(lsn));
                }
                Ok(Some((lsn, end)))
            }
            Err(e) => {
                for g in pages.iter_mut() {
                    g.after_logged(None);
                }
                self.poison_with(&e);
                Err(e)
            }
        }
    }

    /// The error that poisoned the pool, if any.
    pub fn poisoned(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        let p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        p.as_ref().map(|m| Error::Poisoned(m.clone()))
    }

    /// The pool's error, or the log's.
    fn poisoned_with_log(&self) -> Option<Error> {
        self.poisoned()
            .or_else(|| self.wal.get().and_then(|w| w.poisoned()))
    }

    /// Makes the pool refuse every later write-back and flush.
    pub(crate) fn poison(&self, e: &Error) {
        self.poison_with(e)
    }

    fn poison_with(&self, e: &Error) {
        let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_none() {
            *p = Some(match e {
                // Not "poisoned by ... poisoned by ...".
                Error::Poisoned(m) => m.clone(),
                e => e.to_string(),
            });
        }
        drop(p);
        self.poisoned.store(true, Ordering::Release);
        // Tasks waiting for a frame: none may come (no more write-back).
        self.frame_waiters.wake_all();
    }

    /// Fails for a page id past the array's current size (the page table
    /// is mapped for its maximum size, so its length is not the bound).
    fn check_pid(&self, pid: u64) -> Result<()> {
        let pages = self.array.pages().min(self.table.len());
        if pid >= pages {
            return Err(Error::InvalidArgument(format!(
                "page {pid} is beyond the end of the array ({pages} pages)"
            )));
        }
        Ok(())
    }

    #[inline]
    fn frame_ptr(&self, f: u32) -> *mut u8 {
        debug_assert!((f as usize) < self.frames.len());
        // SAFETY: f < frames, so the offset lies inside the allocation.
        unsafe { self.memory.region().raw().add(f as usize * self.page_size) }
    }

    /// The bytes of frame `f`.
    ///
    /// # Safety
    /// The caller holds a latch on the page in `f` (shared: no writer) or
    /// owns the frame (LOADING, free).
    #[inline]
    unsafe fn frame_bytes(&self, f: u32) -> &[u8] {
        // SAFETY: the frame is page_size bytes inside the live allocation;
        // the caller rules out concurrent writers.
        unsafe { std::slice::from_raw_parts(self.frame_ptr(f), self.page_size) }
    }

    /// The bytes of frame `f`, for writing.
    ///
    /// # Safety
    /// The caller holds the exclusive latch on the page in `f`, or owns the
    /// frame.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn frame_bytes_mut(&self, f: u32) -> &mut [u8] {
        // SAFETY: as frame_bytes, and the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.frame_ptr(f), self.page_size) }
    }

    /// Sets frame `f`'s second-chance bit, writing the shared cache line
    /// only when the bit is clear (most fixes of a hot page find it set).
    #[inline]
    fn touch(&self, f: u32) {
        let meta = &self.frames[f as usize];
        match self.policy {
            EvictionPolicy::Clock => {
                if !meta.referenced.load(Ordering::Relaxed) {
                    meta.referenced.store(true, Ordering::Relaxed);
                }
            }
            EvictionPolicy::Watt => meta.reads.record(self.now()),
        }
    }

    /// Marks frame `f` dirty or clean, keeping the count of dirty frames
    /// (no read-modify-write when the flag already says so: most changes
    /// are to a page dirty already).
    fn set_dirty(&self, f: u32, dirty: bool) {
        let flag = &self.frames[f as usize].dirty;
        if flag.load(Ordering::Acquire) == dirty {
            return;
        }
        let was = flag.swap(dirty, Ordering::AcqRel);
        match (was, dirty) {
            (false, true) => {
                self.dirty_frames.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.dirty_frames.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// WATT's current epoch.
    #[inline]
    fn now(&self) -> u16 {
        self.epoch.0.load(Ordering::Relaxed) as u16
    }

    /// A page arrived in frame `f` (read, or created when `written`): its
    /// histories start now.
    fn arrived(&self, f: u32, written: bool) {
        let meta = &self.frames[f as usize];
        meta.referenced.store(true, Ordering::Relaxed);
        let now = self.now();
        meta.reads.reset(Some(now));
        meta.writes.reset(written.then_some(now));
    }

    // ---- free frames --------------------------------------------------

    fn take_frame(&self) -> Option<u32> {
        if self.free_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        // The count moves with the list, under its lock: moved after the
        // unlock, a pop could take it below zero for a moment (three
        // threads; a review's finding).
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let f = free.pop();
        if f.is_some() {
            self.free_count.fetch_sub(1, Ordering::SeqCst);
        }
        f
    }

    fn return_frames(&self, fs: &[u32]) {
        if fs.is_empty() {
            return;
        }
        for &f in fs {
            debug_assert_eq!(self.frames[f as usize].pid.load(Ordering::Relaxed), NO_PAGE);
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.extend_from_slice(fs);
        self.free_count.fetch_add(fs.len(), Ordering::SeqCst);
        drop(free);
        self.frame_waiters.wake_all();
    }

    /// The right to wait for a free frame while holding page latches, one
    /// task at a time: a structure change (a split, a merge) takes it
    /// before it latches its first page, and keeps it until it let them
    /// all go.
    ///
    /// Why: a task that waits for a frame while holding latches keeps
    /// those frames from eviction. Splits did (the parent latched while
    /// the child is read back, both while the meta page is read and a
    /// frame is taken for the new page): in a small pool, enough splits
    /// at once latched every frame, each waiting for a frame none could
    /// free, and every task slept for good (256 tasks inserting into a
    /// pool of [`crate::MIN_POOL_FRAMES`] frames). With the guard at most
    /// one task waits for a frame while latching tree pages, and the
    /// others that latch then wait (the meta page's holders, one at a
    /// time) hold a handful of pages: eviction always finds an unlatched
    /// frame. Splits already took the meta page's latch one at a time;
    /// the guard widens that to their descent to the parent.
    pub async fn structure_change(&self) -> StructureGuard<'_> {
        loop {
            if self
                .structure
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return StructureGuard { pool: self };
            }
            self.structure_waiters
                .until_changed(&self.structure, 1)
                .await;
        }
    }

    /// Counts a descent that holds its path ([`PoolStatsSnapshot::held_descents`]).
    pub fn note_held_descent(&self) {
        self.stats.held_descents.fetch_add(1, Ordering::Relaxed);
    }

    async fn wait_for_frame(&self) {
        self.stats.frame_waits.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        FrameWait {
            pool: self,
            registered: false,
        }
        .await;
        self.stats.frame_wait.record(started.elapsed());
    }

    // ---- fixing pages -------------------------------------------------

    /// Fixes page `pid` with a shared latch (many readers).
    pub async fn fix_shared(&self, pid: u64) -> Result<PageRef<'_>> {
        let frame = self.fix(pid, Mode::Shared).await?;
        Ok(PageRef {
            pool: self,
            pid,
            frame,
        })
    }

    /// Fixes page `pid` with the exclusive latch (one writer).
    pub async fn fix_exclusive(&self, pid: u64) -> Result<PageMut<'_>> {
        let mut g = self.fix_exclusive_covered(pid).await?;
        g.snapshot();
        Ok(g)
    }

    /// Fixes page `pid` with the exclusive latch for a change that a
    /// commit record will cover ([`PageMut::cover`]): keeps no copy of the
    /// page (a covered change is not diffed; any physical change made
    /// through this guard is logged as a full image).
    pub async fn fix_exclusive_covered(&self, pid: u64) -> Result<PageMut<'_>> {
        let frame = self.fix(pid, Mode::Exclusive).await?;
        Ok(self.guard_of(pid, frame))
    }

    /// The guard of page `pid`, resident in `frame` and latched
    /// exclusively by the caller: no copy kept yet, nothing touched.
    fn guard_of(&self, pid: u64, frame: u32) -> PageMut<'_> {
        PageMut {
            pool: self,
            pid,
            frame,
            before: None,
            fresh: false,
            touched: false,
            cover: 0,
            cut: None,
        }
    }

    /// Page `pid` latched exclusively if it is resident and unlatched now,
    /// without ever reading it (a page being handed out again: its bytes
    /// on the device may be trimmed zeros or a large value's).
    fn try_latch_resident(&self, pid: u64) -> Option<PageMut<'_>> {
        if !self.table.try_lock_exclusive(pid) {
            return None;
        }
        let frame = self.table.frame(pid);
        self.touch(frame);
        let mut g = self.guard_of(pid, frame);
        g.snapshot();
        Some(g)
    }

    /// Waits for the read of `pid` in flight and returns its outcome; with
    /// no entry (the read's completion is publishing the page) yields once.
    async fn wait_for_read(&self, pid: u64) -> Result<()> {
        match self.inflight.get(pid) {
            Some(w) => w.wait().await.0,
            None => {
                sched::yield_now().await;
                Ok(())
            }
        }
    }

    /// Waits for the read of `pid` if it is being read, whatever the
    /// read's outcome; else yields once (a latch holder lets go).
    async fn read_settled(&self, pid: u64) {
        if lock_of(self.table.state(pid).load(Ordering::Acquire)) == LOADING {
            let _ = self.wait_for_read(pid).await;
        } else {
            sched::yield_now().await;
        }
    }

    /// True if the page of `stamp` still has the stamped version and no
    /// writer holds it now: its bytes are those the stamp's latch saw. A
    /// false answer says nothing (changed, evicted, or being written):
    /// read the page again.
    pub fn unchanged(&self, stamp: PageStamp) -> bool {
        if stamp.pid >= self.table.len() {
            return false;
        }
        let s = self.table.state(stamp.pid).load(Ordering::Acquire);
        version_of(s) == stamp.version && (UNLOCKED..=MAX_SHARED).contains(&lock_of(s))
    }

    /// Makes page `pid` resident and returns an optimistic handle: reads
    /// take no latch and must be validated afterwards.
    pub async fn fix_optimistic(&self, pid: u64) -> Result<PageOptimistic<'_>> {
        if pid >= self.table.len() {
            // Past the page table (a damaged pointer, a caller's bad id):
            // the same error as a fix, never an index out of range.
            self.check_pid(pid)?;
        }
        loop {
            let s = self.table.state(pid).load(Ordering::Acquire);
            let l = lock_of(s);
            if (UNLOCKED..=MAX_SHARED).contains(&l) {
                let frame = self.table.frame(pid);
                self.touch(frame);
                self.stats.hits.add(1);
                return Ok(PageOptimistic {
                    pool: self,
                    pid,
                    frame,
                    version: version_of(s),
                });
            }
            if l == EXCLUSIVE {
                sched::yield_now().await;
                continue;
            }
            // Not resident: fault it in with a shared latch and drop it.
            drop(self.fix_shared(pid).await?);
        }
    }

    async fn fix(&self, pid: u64, mode: Mode) -> Result<u32> {
        self.check_pid(pid)?;
        let mut missed = false;
        loop {
            let latched = match mode {
                Mode::Shared => self.table.try_lock_shared(pid),
                Mode::Exclusive => self.table.try_lock_exclusive(pid),
            };
            if latched {
                let f = self.table.frame(pid);
                debug_assert_eq!(self.frames[f as usize].pid.load(Ordering::Relaxed), pid);
                self.touch(f);
                if !missed {
                    self.stats.hits.add(1);
                }
                return Ok(f);
            }
            let s = self.table.state(pid).load(Ordering::Acquire);
            match lock_of(s) {
                EVICTED => {
                    missed = true;
                    self.load(pid).await?;
                }
                LOADING => {
                    missed = true;
                    self.wait_for_read(pid).await?;
                }
                _ => sched::yield_now().await,
            }
        }
    }

    /// Reads page `pid` into a free frame (or waits for whoever does).
    ///
    /// Off the workers (a sync call's inline attempt) it fails with
    /// [`Error::WouldBlock`] before touching anything: publishing LOADING
    /// and an in-flight entry for a read that cannot be queued would hand
    /// that `WouldBlock` to every worker task already waiting on the entry.
    async fn load(&self, pid: u64) -> Result<()> {
        if !sched::on_worker() {
            return Err(Error::WouldBlock);
        }
        let Some(f) = self.take_frame() else {
            if let Some(e) = self.poisoned() {
                // No write-back will free a frame any more.
                return Err(e);
            }
            self.wait_for_frame().await;
            return Ok(());
        };
        let started = Instant::now();
        let Some(wait) = self.start_read(pid, f)? else {
            return Ok(());
        };
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let (result, reaped) = wait.wait().await;
        let now = Instant::now();
        self.stats.miss.record(now - started);
        if let Some(r) = reaped {
            self.stats.resume.record(now.saturating_duration_since(r));
        }
        result
    }

    /// Starts reading page `pid` into free frame `f`. Returns None (and
    /// gives the frame back) when another task got there first.
    fn start_read(&self, pid: u64, f: u32) -> Result<Option<Arc<IoWait>>> {
        // Checked before the page is published as LOADING (see `load`).
        if !sched::on_worker() {
            self.return_frames(&[f]);
            return Err(Error::WouldBlock);
        }
        if !self.table.try_transition(pid, EVICTED, LOADING) {
            self.return_frames(&[f]);
            return Ok(None);
        }
        let wait = self.inflight.insert(pid);
        self.frames[f as usize]
            .checked
            .store(false, Ordering::Release);
        self.frames[f as usize].pid.store(pid, Ordering::Release);
        let (device, offset) = self.array.locate(pid);
        // Frame f came off the free list and its page is LOADING. Only an
        // optimistic reader of the frame's previous page may still read
        // it; the eviction raised that page's version, so the reader
        // throws what it read away (`PageOptimistic::with_bytes`).
        // SAFETY: nobody else writes these bytes until the completion.
        let buf = unsafe {
            IoBuf::shared(
                self.memory.region().clone(),
                f as usize * self.page_size,
                self.page_size,
            )
        };
        let tag = RequestKind::PageRead.tag(f as u64);
        let queued = buf.and_then(|b| {
            // A page a large value is being written over is read plain:
            // the mirror's repair of a checked read could put the old tree
            // page found on one copy over the value's bytes on another.
            let req = if self.being_written_around(pid) {
                Request::read(tag, offset, b)
            } else {
                Request::read_pages(tag, offset, b)
            };
            sched::enqueue(device, req).map_err(|_| Error::WouldBlock)
        });
        if let Err(e) = queued {
            self.inflight.remove(pid);
            self.frames[f as usize]
                .pid
                .store(NO_PAGE, Ordering::Release);
            self.table.set_lock(pid, EVICTED);
            self.return_frames(&[f]);
            wait.complete(Err(e.duplicate()), Instant::now());
            return Err(e);
        }
        Ok(Some(wait))
    }

    /// Starts reading page `pid` if it is neither resident nor being read
    /// and a frame is free, without waiting (scans read ahead with it).
    /// Returns true if a read was started.
    pub fn prefetch(&self, pid: u64) -> bool {
        if pid >= self.table.len()
            || !sched::on_worker()
            || lock_of(self.table.state(pid).load(Ordering::Acquire)) != EVICTED
            || self.free_count.load(Ordering::Acquire) <= self.low_water
        {
            return false;
        }
        let Some(f) = self.take_frame() else {
            return false;
        };
        match self.start_read(pid, f) {
            Ok(Some(_)) => {
                self.stats.prefetches.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    // ---- write-back and eviction ----------------------------------------

    /// Starts writing frame `f` (page `pid`, latched exclusively by the
    /// caller): seals the checksum, downgrades to shared, queues the write.
    /// On failure (only possible off a worker: a bug) the page stays dirty,
    /// the latch is released and the error returned.
    fn start_writeback(&self, f: u32, pid: u64) -> Result<()> {
        if self.read_only {
            // The latch is released; the page stays dirty in memory.
            self.table.unlock_exclusive(pid);
            return Err(Error::ReadOnly);
        }
        if let Some(e) = self.poisoned() {
            // Looked at under the latch: a writer whose record could not
            // be logged poisons the pool before it lets the page go, so a
            // change no record holds is never written (a look before the
            // latch, as a flush made, could miss it).
            self.table.unlock_exclusive(pid);
            return Err(e);
        }
        if let Some(wal) = self.wal.get() {
            // The WAL rule, checked in release builds: a page is written
            // only once the record of its last change is durable.
            // SAFETY: the caller holds the exclusive latch on pid (frame f).
            let lsn = page::page_lsn(unsafe { self.frame_bytes(f) });
            assert!(
                lsn < wal.durable(),
                "write-back of page {pid} with LSN {lsn} before the log is durable past it ({})",
                wal.durable()
            );
        }
        let meta = &self.frames[f as usize];
        meta.writing.store(true, Ordering::Release);
        self.set_dirty(f, false);
        let (device, offset) = self.array.locate(pid);
        let placement = self.place_writeback(f);
        // The write goes from a copy, and the latch is released at once
        // (same version: the content is unchanged but for the checksum).
        // Holding a shared latch until the write completed, as the first
        // version did, kept writers of the page waiting for the device
        // (milliseconds on a disk), spinning.
        let tag = RequestKind::PageWrite.tag(f as u64);
        // Counted before it is queued: its completion cannot come first.
        self.writes.started();
        let queued = AlignedBuf::new(self.page_size, self.page_size).and_then(|mut b| {
            // SAFETY: the caller holds the exclusive latch on pid, whose
            // frame is f.
            b.copy_from_slice(unsafe { self.frame_bytes(f) });
            let req = Request::write(tag, offset, IoBuf::owned(b))
                .placed(placement)
                .untorn(self.untorn_writes);
            sched::enqueue(device, req).map_err(|_| Error::WouldBlock)
        });
        self.table.set_lock(pid, UNLOCKED);
        if let Err(e) = queued {
            self.set_dirty(f, true);
            meta.writing.store(false, Ordering::Release);
            self.writes.completed();
            self.writes_done.wake_all();
            return Err(e);
        }
        Ok(())
    }

    /// The placement class of frame `f`'s write-back, by how long its
    /// last version lived (see [`policy::HeatSplit`]); stamps the write
    /// clock in the page and seals it. The write clock is the log's
    /// durable point (it runs on across restarts), or without a log the
    /// count of write-backs.
    fn place_writeback(&self, f: u32) -> Placement {
        let clock = match self.wal.get() {
            Some(wal) => wal.durable(),
            None => self.stats.writebacks.load(Ordering::Relaxed) + 1,
        };
        // SAFETY: the caller holds the exclusive latch on the frame's page.
        let bytes = unsafe { self.frame_bytes_mut(f) };
        let life = match page::written_at(bytes) {
            0 => u64::MAX,
            at => clock.saturating_sub(at),
        };
        page::set_written_at(bytes, clock);
        page::seal(bytes);
        let placement = self.heat.classify(life);
        if placement == Placement::Hot {
            self.stats.hot_writebacks.fetch_add(1, Ordering::Relaxed);
        }
        placement
    }

    /// One batch of eviction when free frames run low (or tasks wait for
    /// one), by the configured policy. Returns true if it freed a frame or
    /// started a write.
    fn evict_batch(&self) -> bool {
        // SeqCst, as the stall flag and the frame waiters' list: a waiter
        // registers then looks at the count, a completion clears the stall
        // then eviction looks at the count and the list (`stall.rs`).
        let free = self.free_count.load(Ordering::SeqCst);
        let waiters = self.frame_waiters.has_waiters();
        if free >= self.low_water && !waiters {
            return false;
        }
        if self.writes.is_stalled() {
            return false;
        }
        let want = self.high_water.saturating_sub(free).max(1);
        let (freed, writes) = match self.policy {
            EvictionPolicy::Clock => self.evict_clock(want),
            EvictionPolicy::Watt => match self.evict_watt(want) {
                // WATT tries only the sample's least valuable pages, and
                // skips no latched frame when it samples: when those are
                // latched (the pages of the very commit waiting for a
                // frame), it frees nothing, and in a pool small enough
                // that every sample is the same frames it chose them
                // again at every step, for good (one committer hung on a
                // 9-frame pool). Then, with no write in flight whose end
                // would step eviction again, the clock hand visits every
                // frame (with writes in flight, WATT's pace holds).
                (freed, 0) if freed.is_empty() && self.writes.in_flight() == 0 => {
                    self.evict_clock(want)
                }
                done => done,
            },
        };
        if !freed.is_empty() {
            let before = self
                .stats
                .evictions
                .fetch_add(freed.len() as u64, Ordering::Relaxed);
            let epoch = (before + freed.len() as u64) / self.epoch_unit;
            if epoch != before / self.epoch_unit {
                self.epoch
                    .0
                    .store(epoch % policy::EPOCH_MODULUS, Ordering::Relaxed);
            }
        }
        let progress = !freed.is_empty() || writes > 0;
        if !progress {
            self.writes.stall_if_writing();
        }
        self.return_frames(&freed);
        progress
    }

    /// Most write-backs WATT keeps in flight now: half the devices'
    /// in-flight limits as the scheduler holds them (they follow the
    /// devices: `sched::DeviceBudgets`), at least the configured
    /// `max_writes_in_flight`. A cap fixed at half the starting limit left
    /// the write-back rate, and so every miss's wait for a clean frame,
    /// at 16 writes per device latency while the adapted limit was 64-128.
    fn write_cap(&self) -> usize {
        // The data devices are the runtime's first ones (the logs follow).
        let data = 0..self.array.targets().len();
        sched::device_limits_total(data).map_or(self.max_writes_in_flight, |l| {
            (l / 2).max(self.max_writes_in_flight)
        })
    }

    /// A frame the eviction scan may consider: its page, if resident,
    /// unlatched and not being written.
    fn candidate(&self, f: u32) -> Option<u64> {
        let meta = &self.frames[f as usize];
        let pid = meta.pid.load(Ordering::Acquire);
        if pid == NO_PAGE
            || meta.writing.load(Ordering::Acquire)
            || lock_of(self.table.state(pid).load(Ordering::Acquire)) != UNLOCKED
        {
            return None;
        }
        Some(pid)
    }

    /// Latches page `pid` in frame `f` for eviction or write-back; false if
    /// someone holds it or it moved.
    fn latch_victim(&self, f: u32, pid: u64) -> bool {
        if !self.table.try_lock_exclusive(pid) {
            return false;
        }
        // Holding the exclusive latch: re-check that pid is still in f, and
        // that no write-back of it is in flight (a write-back holds no
        // latch: evicting the page now could have it read back before the
        // write lands, and writing it again could land the writes out of
        // order).
        let meta = &self.frames[f as usize];
        if self.table.frame(pid) != f
            || meta.pid.load(Ordering::Acquire) != pid
            || meta.writing.load(Ordering::Acquire)
        {
            self.table.unlock_exclusive(pid);
            return false;
        }
        true
    }

    /// Frees frame `f` if its page is still there, unlatched and clean.
    fn try_evict(&self, f: u32, pid: u64) -> bool {
        if !self.latch_victim(f, pid) {
            return false;
        }
        let meta = &self.frames[f as usize];
        if meta.dirty.load(Ordering::Acquire) {
            self.table.unlock_exclusive(pid);
            return false;
        }
        meta.pid.store(NO_PAGE, Ordering::Release);
        self.table.mark_evicted(pid);
        true
    }

    /// Starts writing back the dirty page `pid` in frame `f` if it is
    /// unlatched, the pool healthy and the log durable past its LSN (else
    /// a flush is asked for). Err: the write could not be queued (a bug:
    /// the pool stops writing, the page stays dirty).
    fn try_write_back(&self, f: u32, pid: u64) -> Result<bool> {
        if !self.latch_victim(f, pid) {
            return Ok(false);
        }
        if !self.frames[f as usize].dirty.load(Ordering::Acquire)
            || self.poisoned.load(Ordering::Acquire)
            || !self.log_allows_write(f)
        {
            self.table.unlock_exclusive(pid);
            return Ok(false);
        }
        if let Err(e) = self.start_writeback(f, pid) {
            // Eviction runs on workers only: this is a bug, and the page
            // must not be lost; stop writing altogether.
            let e = Error::Poisoned(format!("write-back of page {pid} could not be queued: {e}"));
            self.poison_with(&e);
            return Err(e);
        }
        self.stats.writebacks.fetch_add(1, Ordering::Relaxed);
        let in_flight = self.writes.in_flight() as u64;
        let most = &self.stats.eviction_writes_in_flight_max;
        // Written only at a new maximum: no shared write per write-back.
        if in_flight > most.load(Ordering::Relaxed) {
            most.fetch_max(in_flight, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Second chance: the hand clears referenced bits; an unreferenced
    /// clean page is evicted, an unreferenced dirty one written back (at
    /// most `max_writes_per_batch`). Returns the frames freed and the
    /// writes started.
    fn evict_clock(&self, want: usize) -> (Vec<u32>, usize) {
        let n = self.frames.len();
        let budget = (want * 4 + 64).min(2 * n);
        let mut freed = Vec::new();
        let mut writes = 0;
        for _ in 0..budget {
            if freed.len() >= want {
                break;
            }
            let f = (self.clock.fetch_add(1, Ordering::Relaxed) % n) as u32;
            let meta = &self.frames[f as usize];
            let Some(pid) = self.candidate(f) else {
                continue;
            };
            if meta.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            if !meta.dirty.load(Ordering::Acquire) {
                if self.try_evict(f, pid) {
                    freed.push(f);
                }
            } else if writes < self.max_writes_per_batch {
                match self.try_write_back(f, pid) {
                    Ok(started) => writes += usize::from(started),
                    Err(_) => break,
                }
            }
        }
        (freed, writes)
    }

    /// WATT: the hand visits frames in samples of [`WATT_SAMPLE`]. In
    /// each, the least valuable clean page is evicted if it is worth
    /// little more than the sample's least valuable page (at most twice its
    /// value plus one access this epoch); the least valuable page, if
    /// dirty, is written back (to be evicted when next met, if still cold),
    /// and so is the least valuable dirty page once more than
    /// `dirty_limit` frames are dirty; while fewer than
    /// `max_writes_in_flight` write-backs are in flight.
    /// So a write-hot page (its writes weigh `write_weight` reads) stays
    /// dirty in memory instead of being written again and again, and a hot
    /// clean page (an inner node) is never evicted because the cold pages
    /// around it happen to be dirty: a first version evicted the coldest
    /// clean page of every sample, and with the pool mostly dirty under
    /// YCSB-A that was the inner nodes (3.7 reads per operation).
    /// Returns the frames freed and the writes started.
    fn evict_watt(&self, want: usize) -> (Vec<u32>, usize) {
        let n = self.frames.len();
        let now = self.now();
        // About one sample per frame wanted: a batch is cheap, and the
        // next round samples again.
        let budget = (want * WATT_SAMPLE + 64).min(n);
        let mut freed = Vec::new();
        let mut writes = 0;
        let mut visits = 0;
        let mut sample: Vec<Candidate> = Vec::with_capacity(WATT_SAMPLE);
        let write_cap = self.write_cap();
        // The frames this worker visits next: taken from the shared hand
        // a sample's worth at a time (one contended atomic per sample, not
        // one per frame: the hand's cache line bounces between workers).
        let (mut hand, mut hand_end) = (0usize, 0usize);
        while freed.len() < want && visits < budget {
            sample.clear();
            while sample.len() < WATT_SAMPLE && visits < budget {
                visits += 1;
                if hand == hand_end {
                    hand = self.clock.fetch_add(WATT_SAMPLE, Ordering::Relaxed);
                    hand_end = hand.wrapping_add(WATT_SAMPLE);
                }
                let f = (hand % n) as u32;
                hand = hand.wrapping_add(1);
                // Unlike `candidate`, no look at the page's latch: that is
                // a random access into the page table per frame sampled
                // (12% of a worker's CPU in an out-of-memory lookup run on
                // the simulated array), and the one frame chosen is
                // latched, checked again, anyway (`latch_victim`).
                let meta = &self.frames[f as usize];
                let pid = meta.pid.load(Ordering::Acquire);
                if pid == NO_PAGE || meta.writing.load(Ordering::Acquire) {
                    continue;
                }
                meta.reads.scrub(now);
                meta.writes.scrub(now);
                sample.push(Candidate {
                    value: watt_value(&meta.reads, &meta.writes, now, self.write_weight),
                    frame: f,
                    pid,
                    dirty: meta.dirty.load(Ordering::Acquire),
                });
            }
            let Some(coldest) = sample.iter().map(|c| c.value).min() else {
                continue;
            };
            let bar = coldest.saturating_mul(2).saturating_add(1 << 10);
            let clean = sample
                .iter()
                .filter(|c| !c.dirty && c.value <= bar)
                .min_by_key(|c| c.value);
            if let Some(c) = clean {
                if self.try_evict(c.frame, c.pid) {
                    freed.push(c.frame);
                }
            }
            // Written back: the sample's least valuable page if dirty; with
            // too many dirty pages, the least valuable dirty one however
            // valuable (frames must keep coming without every eviction
            // waiting for a write).
            let write_bar = if self.dirty_frames.load(Ordering::Relaxed) > self.dirty_limit {
                sample.iter().filter(|c| c.dirty).map(|c| c.value).min()
            } else {
                Some(coldest)
            };
            for c in &sample {
                if !c.dirty || write_bar.is_none_or(|b| c.value > b) {
                    continue;
                }
                if self.writes.in_flight() >= write_cap {
                    break;
                }
                match self.try_write_back(c.frame, c.pid) {
                    Ok(started) => writes += usize::from(started),
                    Err(_) => return (freed, writes),
                }
            }
            if clean.is_none() && self.writes.in_flight() >= write_cap {
                // Nothing to free here and no write can start: wait for
                // the writes in flight rather than scan on.
                break;
            }
        }
        (freed, writes)
    }

    /// Writes back every dirty page and makes the writes durable (one
    /// fdatasync per device). Must run inside a task.
    pub async fn flush_all(&self) -> Result<()> {
        self.flush_where(|_| true).await
    }

    /// Writes back every dirty page whose id `chosen` accepts (a
    /// checkpoint's shard) and makes the writes durable (one fdatasync
    /// per device). Must run inside a task.
    ///
    /// A page changed since the log's last flush cannot be written yet
    /// (its records first). The scan sets such a page aside and goes on;
    /// after it, one wait for the log covers every page set aside, and
    /// a page changed again since (a hot one) is then written under its
    /// latch: latched, it cannot change while the log catches up, so one
    /// more wait covers all of those. Waiting for each such page in turn,
    /// as the first version did, cost one log flush per recently changed
    /// page, and a page changed by every commit was never caught between
    /// two flushes: `dana bench commit`'s first shard checkpoint waited
    /// 1,426 times (2.1 s of its 2.2 s) while the log filled behind it and
    /// every committer then waited for log space.
    pub async fn flush_where(&self, chosen: impl Fn(u64) -> bool) -> Result<()> {
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        let mut started = Vec::new();
        let mut deferred = Vec::new();
        let mut past = 0;
        let mut slice = Instant::now();
        for f in 0..self.frames.len() as u32 {
            if let Look::Blocked(lsn) = self.flush_frame(f, &chosen, &mut started, false).await? {
                deferred.push(f);
                past = past.max(lsn);
            }
            if f % 64 == 63 && slice.elapsed() >= FLUSH_SLICE {
                // A steady pace: let foreground tasks run between slices.
                sched::yield_now().await;
                slice = Instant::now();
            }
        }
        // Rounds over the pages set aside. Each either writes a page, holds
        // it latched for the round's one wait, or (latched by another
        // task: waiting for that latch while holding others could
        // deadlock) sets it aside for the next round.
        while !deferred.is_empty() {
            if past > 0 {
                self.stats.flush_log_waits.fetch_add(1, Ordering::Relaxed);
                self.log_durable_past(past).await;
            } else {
                sched::yield_now().await;
            }
            // Released when dropped, however the round ends (an error, a
            // panic of the task): a leaked latch would stall every later
            // access to its page.
            let mut held = HeldLatches {
                table: &self.table,
                pages: Vec::new(),
            };
            past = 0;
            for f in std::mem::take(&mut deferred) {
                match self.flush_frame(f, &chosen, &mut started, true).await? {
                    Look::Done => {}
                    // (Blocked only without `hold`.)
                    Look::Busy | Look::Blocked(_) => deferred.push(f),
                    Look::Held(pid, lsn) => {
                        held.pages.push((f, pid));
                        past = past.max(lsn);
                    }
                }
            }
            if held.pages.is_empty() {
                continue;
            }
            // Latched pages cannot change: the log's flush (which needs no
            // page latch) passes their records, and they are written.
            self.stats.flush_log_waits.fetch_add(1, Ordering::Relaxed);
            self.log_durable_past(past).await;
            while let Some(&(f, pid)) = held.pages.last() {
                if let Some(e) = self.poisoned_with_log() {
                    return Err(e);
                }
                // The log set's durable point is looked at again here, as
                // start_writeback asserts it, and waited for again, still
                // latched, if it stands lower than the wait saw. (It no
                // longer moves backwards, see `wal::Shared::durable_below`;
                // before, it could.)
                if let Some(lsn) = self.log_blocks_write(f) {
                    self.log_durable_past(lsn).await;
                    continue;
                }
                held.pages.pop();
                // Releases the latch, also when it fails.
                self.start_writeback(f, pid)?;
                self.stats.writebacks.fetch_add(1, Ordering::Relaxed);
                started.push(f);
            }
        }
        // Wait for this flush's writes (eviction write-backs in flight were
        // waited for above).
        for f in started {
            self.write_finished(f).await;
        }
        if let Some(e) = self.poisoned_with_log() {
            return Err(e);
        }
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        self.sync_devices().await
    }

    /// One frame of [`BufferPool::flush_where`]: starts its page's
    /// write-back (pushed on `started`) if the page is chosen and dirty,
    /// after waiting for an eviction's write of it in flight. If the log
    /// is not yet durable past the page's last change it starts nothing:
    /// with `hold`, it keeps the page latched and says so (the caller
    /// waits for the log and writes it); without, it lets the page go
    /// and returns its LSN. With `hold` it never waits, for a latch
    /// another task has nor for a write-back in flight ([`Look::Busy`]):
    /// the caller may hold other pages' latches.
    async fn flush_frame(
        &self,
        f: u32,
        chosen: &impl Fn(u64) -> bool,
        started: &mut Vec<u32>,
        hold: bool,
    ) -> Result<Look> {
        let meta = &self.frames[f as usize];
        loop {
            let pid = meta.pid.load(Ordering::Acquire);
            if pid != NO_PAGE && !chosen(pid) {
                return Ok(Look::Done);
            }
            // A write-back in flight (an eviction's: it cleared the
            // dirty flag when it started) must complete before the
            // sync below, or the sync does not cover it: a checkpoint
            // would then move the redo LSN past the page's last
            // change while its write is still unsynced, and a torn
            // write of it could not be rebuilt (found by `dana
            // crashtest --tasks 32 --async`, seed 9437185 point 987).
            // The dirty flag is read first: a write-back sets
            // `writing` and then clears `dirty`, so a clear dirty flag
            // seen here means its `writing` is seen too. Read the other
            // way round, a write-back starting between the two loads
            // looked like a clean page that no write covered, and the
            // sync below went ahead without it (found in review).
            // A clean page latched exclusively may hold a change already
            // logged (before this checkpoint began) that its writer has
            // not marked dirty yet: a page turns dirty only once its
            // change is logged, still under the latch. Taken for done,
            // the checkpoint skipped it and its redo point passed the
            // change (a review's finding). The latch is read before the
            // flags: read unlatched (Acquire, against the writer's
            // release), the flag set before that release is seen.
            let latched = pid != NO_PAGE
                && lock_of(self.table.state(pid).load(Ordering::Acquire)) == EXCLUSIVE;
            let dirty = meta.dirty.load(Ordering::Acquire);
            let writing = meta.writing.load(Ordering::Acquire);
            if pid == NO_PAGE || (!writing && !dirty) {
                if latched && self.table.frame(pid) == f {
                    // Looked at again once the latch is let go: set aside
                    // (without waiting for the log) or, holding others,
                    // busy.
                    return Ok(if hold { Look::Busy } else { Look::Blocked(0) });
                }
                return Ok(Look::Done);
            }
            // A failed log or write stops the flush (it could wait
            // forever for a durable log or a write that never comes).
            if let Some(e) = self.poisoned_with_log() {
                return Err(e);
            }
            if writing {
                if hold {
                    // Not while the caller holds latches: the pages they
                    // keep would wait for this device write too.
                    return Ok(Look::Busy);
                }
                self.write_finished(f).await;
                continue;
            }
            if !self.table.try_lock_exclusive(pid) {
                if hold {
                    return Ok(Look::Busy);
                }
                sched::yield_now().await;
                continue;
            }
            if self.table.frame(pid) != f || !meta.dirty.load(Ordering::Acquire) {
                self.table.unlock_exclusive(pid);
                return Ok(Look::Done);
            }
            if meta.writing.load(Ordering::Acquire) {
                // Started between the look above and the latch.
                self.table.unlock_exclusive(pid);
                continue;
            }
            if let Some(lsn) = self.log_blocks_write(f) {
                // Changed since the log's last flush (which this asked
                // for).
                if hold {
                    return Ok(Look::Held(pid, lsn));
                }
                self.table.unlock_exclusive(pid);
                return Ok(Look::Blocked(lsn));
            }
            self.start_writeback(f, pid)?;
            self.stats.writebacks.fetch_add(1, Ordering::Relaxed);
            started.push(f);
            return Ok(Look::Done);
        }
    }

    /// One fdatasync per device, awaited (all in flight together).
    pub async fn sync_devices(&self) -> Result<()> {
        let mut syncs = Vec::new();
        for d in 0..self.array.width() {
            self.stats.device_syncs.fetch_add(1, Ordering::Relaxed);
            syncs.push(sched::perform(d, Request::flush(0)));
        }
        let mut first_err = None;
        for s in syncs {
            if let Err(e) = s.await {
                self.poison_with(&e);
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn complete_read(&self, f: u32, c: Completion, t: IoTiming) {
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.stats
            .device_read
            .record(t.reaped.saturating_duration_since(t.submitted));
        let meta = &self.frames[f as usize];
        let pid = meta.pid.load(Ordering::Acquire);
        debug_assert_eq!(
            lock_of(self.table.state(pid).load(Ordering::Relaxed)),
            LOADING
        );
        // The page is LOADING and its read has completed: this worker is
        // the only one touching frame f.
        let result = c
            .result
            .and_then(|_| {
                // SAFETY: frame f is this worker's alone until published.
                let bytes = unsafe { self.frame_bytes(f) };
                page::verify(bytes, pid)?;
                self.check_lsn_logged(pid, page::page_lsn(bytes))
            })
            .map_err(|e| match e {
                // Where it was read from, for whoever has to look at it.
                Error::Corrupt { page, what } => Error::Corrupt {
                    page,
                    what: format!("{what} (read from {})", self.array.describe_page(page)),
                },
                e => e,
            });
        // The entry goes before the page's state is published: once the
        // page is UNLOCKED (or EVICTED) another worker may evict it and
        // start a new read of it, whose entry this one must not be (a
        // crash run of `bench lookup` on 2 workers found the old order:
        // "two reads in flight", and in release builds the new read's
        // waiters woken with this read's result). A task that finds the
        // page LOADING with no entry yields until it is published.
        let waiters = self.inflight.remove(pid);
        match &result {
            Ok(()) => {
                meta.dirty.store(false, Ordering::Relaxed);
                self.arrived(f, false);
                self.table.set_frame(pid, f);
                self.table.set_lock(pid, UNLOCKED);
            }
            Err(_) => {
                self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                meta.pid.store(NO_PAGE, Ordering::Release);
                self.table.set_lock(pid, EVICTED);
                self.return_frames(&[f]);
            }
        }
        if let Some(w) = waiters {
            w.complete(result, t.reaped);
        }
    }

    /// A page read with an LSN the log never assigned was written by
    /// changes this log does not hold: the data files are newer than the
    /// log (restored from different moments). An error on its read,
    /// before a change logged below its LSN could go over it (which the
    /// page LSN's order forbids) or its write-back waited for a durable
    /// point the log never reaches.
    /// A read-only open checks against the logs' end it found (it had
    /// no check: its reads served such pages; a review's finding).
    fn check_lsn_logged(&self, pid: u64, lsn: u64) -> Result<()> {
        let next = match (self.wal.get(), self.lsn_end) {
            (Some(wal), _) => wal.next_lsn(),
            (None, Some(end)) => end,
            (None, None) => return Ok(()),
        };
        if lsn >= next {
            return Err(Error::Corrupt {
                page: pid,
                what: format!(
                    "its LSN {lsn} is past the log's end (the next LSN is {next}): the data \
                     files are newer than the log (restored from different moments?)"
                ),
            });
        }
        Ok(())
    }

    fn complete_write(&self, f: u32, c: Completion) {
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        let meta = &self.frames[f as usize];
        if let Err(e) = c.result {
            self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            self.set_dirty(f, true);
            self.poison_with(&e);
        }
        meta.writing.store(false, Ordering::Release);
        // A write finished: eviction has something to look at again.
        self.writes.completed();
        self.writes_done.wake_all();
    }

    /// Waits until frame `f` has no write-back in flight.
    pub(crate) async fn write_finished(&self, f: u32) {
        let writing = || self.frames[f as usize].writing.load(Ordering::Acquire);
        std::future::poll_fn(|cx| {
            if !writing() {
                return Poll::Ready(());
            }
            self.writes_done.register(cx.waker());
            // A completion between the first look and the register.
            if writing() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await
    }
}

/// The pool owns the completions of page reads and write-backs.
impl CompletionHandler for BufferPool {
    fn complete(&self, kind: RequestKind, id: u64, c: Completion, t: IoTiming) {
        match kind {
            RequestKind::PageRead => self.complete_read(id as u32, c, t),
            RequestKind::PageWrite => self.complete_write(id as u32, c),
            _ => unreachable!("the pool is registered for page reads and writes only"),
        }
    }
}

/// Eviction and write-back, a system task every worker steps.
impl SystemTask for BufferPool {
    fn name(&self) -> &'static str {
        "eviction"
    }

    fn step(&self) -> bool {
        if let Some(e) = self.wal.get().and_then(|w| w.poisoned()) {
            if !self.poisoned.load(Ordering::Acquire) {
                // The log failed: no page may be written any more.
                self.poison_with(&e);
            }
        }
        self.evict_batch()
    }
}

/// Held by the one task allowed to wait for a free frame while it holds
/// page latches ([`BufferPool::structure_change`]).
pub struct StructureGuard<'a> {
    pool: &'a BufferPool,
}

impl Drop for StructureGuard<'_> {
    fn drop(&mut self) {
        self.pool.structure.store(0, Ordering::SeqCst);
        self.pool.structure_waiters.wake_all();
    }
}

/// Resolves once a frame was freed (or is free already).
struct FrameWait<'a> {
    pool: &'a BufferPool,
    registered: bool,
}

impl Future for FrameWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.registered || self.pool.free_count.load(Ordering::SeqCst) > 0 {
            return Poll::Ready(());
        }
        self.pool.frame_waiters.register(cx.waker());
        self.registered = true;
        // A frame freed between the check and the registration would not
        // wake us: look again. So would a poisoning (it wakes only the
        // waiters registered by then), after which no write-back frees a
        // frame: the waiter slept for good (a review's finding); the
        // caller sees the poison once woken.
        if self.pool.free_count.load(Ordering::SeqCst) > 0 || self.pool.poisoned().is_some() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// A page fixed with a shared latch. Derefs to the page's bytes.
pub struct PageRef<'a> {
    pool: &'a BufferPool,
    pid: u64,
    frame: u32,
}

impl PageRef<'_> {
    /// The page id.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// The page's version as this latch holds it (no writer can change
    /// it while the latch lives): see [`BufferPool::unchanged`].
    pub fn stamp(&self) -> PageStamp {
        let s = self.pool.table.state(self.pid).load(Ordering::Acquire);
        PageStamp {
            pid: self.pid,
            version: version_of(s),
        }
    }
}

/// A page id and the version a latch saw. Every exclusive latch, and
/// every eviction, raises a page's version (the page table keeps it per
/// page id, across evictions): while the version is the same, so are the
/// page's node bytes (a write-back rewrites the page header's checksum
/// and write stamp under the same version), which is what a
/// transaction's validation needs to know
/// about a leaf it read (Silo's record versions, at page grain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageStamp {
    /// The page id.
    pub pid: u64,
    /// Its version when stamped.
    pub version: u64,
}

impl std::ops::Deref for PageRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the shared latch on pid (whose frame is self.frame) keeps
        // writers out while this guard lives.
        unsafe { self.pool.frame_bytes(self.frame) }
    }
}

impl Drop for PageRef<'_> {
    fn drop(&mut self) {
        self.pool.table.unlock_shared(self.pid);
    }
}

/// A page fixed with the exclusive latch. Derefs to the page's bytes;
/// mutable access marks the page dirty.
pub struct PageMut<'a> {
    pool: &'a BufferPool,
    pid: u64,
    frame: u32,
    /// The page as it was when latched or last logged (with a log only,
    /// and never for a leaf: see [`PageMut::snapshot`]).
    before: Option<Box<[u8]>>,
    /// A brand-new page: its first record is a full image.
    fresh: bool,
    /// Written through this guard since it was latched or last logged.
    touched: bool,
    /// Nonzero: the changes since the last record are covered by the
    /// commit record at this LSN ([`PageMut::cover`]).
    cover: u64,
    /// The change since the last record is this leaf cut at a key
    /// ([`PageMut::log_as_cut`]): the tree's root and the key.
    cut: Option<(u64, Vec<u8>)>,
}

thread_local! {
    /// Spare before-image buffers (one allocation per thread, reused).
    static SPARE_IMAGES: std::cell::RefCell<Vec<Box<[u8]>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a before-image buffer for the next latch on this thread.
fn recycle_image(b: Box<[u8]>) {
    SPARE_IMAGES.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < 16 {
            s.push(b);
        }
    });
}

impl PageMut<'_> {
    /// The page id.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// True once the layer above checked this page's contents whole since
    /// the page came into its frame ([`PageMut::set_contents_checked`]):
    /// bytes read from a device may be damaged or forged (with a valid
    /// checksum), and the B-tree's write path checks a node's whole
    /// structure once per arrival rather than at every change.
    pub fn contents_checked(&self) -> bool {
        self.pool.frames[self.frame as usize]
            .checked
            .load(Ordering::Acquire)
    }

    /// Records that this page's contents were checked whole (they stay
    /// so: only the layer that checked them changes them until the page
    /// leaves its frame).
    pub fn set_contents_checked(&self) {
        self.pool.frames[self.frame as usize]
            .checked
            .store(true, Ordering::Release);
    }

    /// Makes this guard's page a new one: its first record is a full
    /// image flagged `FRESH` (a page handed out new, FORMAT.md).
    fn make_fresh(&mut self) {
        self.fresh = true;
        if let Some(b) = self.before.take() {
            recycle_image(b);
        }
    }

    /// Keeps a copy of the page as latched, to log the difference later.
    /// Not for a page with covered changes since its last record
    /// ([`page::UNLOGGED`]): a difference against it would not compose at
    /// redo, so its next physical change is logged as a full image.
    fn snapshot(&mut self) {
        if self.pool.wal.get().is_none() || self.fresh || page::unlogged(self) {
            return;
        }
        let ps = self.pool.page_size;
        let mut b = SPARE_IMAGES
            .with(|s| s.borrow_mut().pop())
            .filter(|b| b.len() == ps)
            .unwrap_or_else(|| vec![0u8; ps].into_boxed_slice());
        b.copy_from_slice(self);
        self.before = Some(b);
    }

    /// This page's change since it was latched or last logged, for the
    /// log (None: not written since). Clears [`page::UNLOGGED`]: the record
    /// holds the page (a page without a copy is logged whole).
    fn change(&mut self) -> Option<PageChange<'_>> {
        if !self.touched && !self.fresh {
            return None;
        }
        if page::unlogged(self) {
            debug_assert!(self.before.is_none());
            page::set_unlogged(self, false);
        }
        Some(PageChange {
            pid: self.pid,
            before: self.before.as_deref(),
            // SAFETY: the exclusive latch is held while this guard lives.
            after: unsafe { self.pool.frame_bytes(self.frame) },
            fresh: self.fresh,
            cut: self.cut.as_ref().map(|(t, k)| (*t, &k[..])),
        })
    }

    /// Declares the change made through this guard since it was latched
    /// or last logged to be a cut of this leaf (of the tree rooted at
    /// `tree`) at `key`: the left half of a split, whose upper half goes to
    /// a new page logged in the same record. The log may record only the
    /// cut (redone at recovery on the leaf as it finds it), so once the
    /// record is appended the page counts as holding unlogged changes
    /// ([`page::UNLOGGED`]): its next physical change is a full image.
    pub fn log_as_cut(&mut self, tree: u64, key: Vec<u8>) {
        debug_assert!(!self.fresh, "page {}: a new page is not cut", self.pid);
        self.cut = Some((tree, key));
    }

    /// Once a record holding this page's change is appended (`logged`) or
    /// failed: a cut's page bytes are not what redo rebuilds (see
    /// [`PageMut::log_as_cut`]).
    fn after_cut_logged(&mut self, logged: bool) {
        if self.cut.take().is_some() && logged {
            page::set_unlogged(self, true);
        }
    }

    /// Declares the changes made through this guard so far redone by the
    /// commit record at LSN `commit` (already appended): recovery
    /// re-applies that record through the trees, so the change is not
    /// logged again, except as a full image if it is the page's first
    /// change since a checkpoint began. For leaf changes made by a
    /// commit's apply only; `commit` 0 does nothing.
    pub fn cover(&mut self, commit: u64) {
        debug_assert!(
            commit == 0 || self.before.is_none(),
            "page {}: a covered change needs a guard without a copy (fix_exclusive_covered)",
            self.pid
        );
        self.cover = commit;
    }

    /// Declares that no byte was written through this guard since it was
    /// latched or last logged, although it was borrowed mutably (a node
    /// opened for a change that turned out not to be needed): its drop
    /// logs nothing.
    pub fn unchanged(&mut self) {
        self.touched = false;
    }

    /// Logs a covered change: a full image if the log asks for one; the
    /// page LSN becomes the newest of its own, the commit's and the
    /// image's (never smaller: records of this page below it are in it).
    fn log_covered(&mut self, wal: &dyn PageLog) -> Result<()> {
        // An image (if the log takes one) holds the page with the flag
        // clear; without one, the change is in no page record.
        page::set_unlogged(self, false);
        // SAFETY: the exclusive latch is held while this guard lives.
        let bytes = unsafe { self.pool.frame_bytes(self.frame) };
        let image = wal.log_covered(self.pid, bytes, self.cover)?;
        if image.is_none() {
            page::set_unlogged(self, true);
        }
        let lsn = image.unwrap_or(0).max(self.cover);
        if lsn > page::page_lsn(self) {
            page::set_page_lsn(self, lsn);
        }
        self.mark_dirty();
        self.touched = false;
        self.cover = 0;
        Ok(())
    }

    /// After a record with this page's change got `lsn` (None: the append
    /// failed): sets the page LSN and starts a new before-image.
    fn after_logged(&mut self, lsn: Option<u64>) {
        self.fresh = false;
        self.cover = 0;
        if let Some(lsn) = lsn {
            self.advance_lsn(lsn);
        }
        self.after_cut_logged(lsn.is_some());
        self.touched = false;
        if let Some(b) = self.before.take() {
            recycle_image(b);
        }
        self.snapshot();
    }

    /// Sets the page LSN to that of a record just appended with its
    /// change, and marks the page dirty. Page LSNs only grow (records are
    /// appended under the exclusive latch): checked in release builds,
    /// since redo and the WAL rule both rely on it.
    fn advance_lsn(&mut self, lsn: u64) {
        let old = page::page_lsn(self);
        assert!(
            lsn > old,
            "page {}: LSN {lsn} logged after LSN {old}",
            self.pid
        );
        page::set_page_lsn(self, lsn);
        self.mark_dirty();
    }

    /// Marks the page dirty: its change is logged (or there is no log).
    /// Only then: a page borrowed mutably but left unchanged
    /// ([`PageMut::unchanged`]) or whose difference came out empty stays
    /// clean, because writing it again could tear it after a checkpoint
    /// while no record since that checkpoint's redo LSN can rebuild it (a
    /// crash run lost a commit's covered change that way).
    fn mark_dirty(&self) {
        self.pool.set_dirty(self.frame, true);
        self.pool.frames[self.frame as usize]
            .writes
            .record(self.pool.now());
    }
}

impl std::ops::Deref for PageMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the exclusive latch is held while this guard lives.
        unsafe { self.pool.frame_bytes(self.frame) }
    }
}

impl std::ops::DerefMut for PageMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.touched = true;
        // SAFETY: the exclusive latch is held and &mut self makes this the
        // only reference handed out by the guard.
        unsafe { self.pool.frame_bytes_mut(self.frame) }
    }
}

impl Drop for PageMut<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() && (self.touched || self.fresh || self.cut.is_some()) {
            // A task panicked while changing this page: the change may be
            // half made. Neither log it nor let it reach storage; the pool
            // stops (the log holds only whole changes, which the next
            // open redoes).
            self.pool.poison_with(&Error::Poisoned(format!(
                "a task panicked while changing page {}",
                self.pid
            )));
            if let Some(b) = self.before.take() {
                recycle_image(b);
            }
            self.pool.table.unlock_exclusive(self.pid);
            return;
        }
        if let Some(wal) = self.pool.wal.get() {
            let logged = if self.cover != 0 && self.touched {
                self.log_covered(wal.as_ref())
            } else {
                let logged = self.change().map(|c| wal.log_changes(&[c]));
                match logged {
                    Some(Ok(Some(lsn))) => {
                        self.advance_lsn(lsn);
                        self.after_cut_logged(true);
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    None | Some(Ok(None)) => Ok(()),
                }
            };
            // The change is in memory but not in the log: never let it
            // reach storage.
            if let Err(e) = logged {
                self.pool.poison_with(&e);
            }
            if let Some(b) = self.before.take() {
                recycle_image(b);
            }
        } else if self.touched || self.fresh {
            self.mark_dirty();
        }
        self.pool.table.unlock_exclusive(self.pid);
    }
}

/// A resident page read without a latch: the crate reads it with
/// `with_bytes`, which validates the version afterwards; a failed
/// validation means a writer or eviction intervened. Outside the crate
/// only its version can be checked: the bytes stay out of reach.
///
/// ```compile_fail
/// async fn bytes(pool: &dana::buffer::BufferPool) -> Option<usize> {
///     let page = pool.fix_optimistic(1).await.ok()?;
///     page.with_bytes(|b| b.len())
/// }
/// ```
pub struct PageOptimistic<'a> {
    pool: &'a BufferPool,
    pid: u64,
    frame: u32,
    version: u64,
}

impl PageOptimistic<'_> {
    /// The page id.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// Runs `f` over the page's bytes without a latch and returns its
    /// result if no writer or eviction intervened (`None` otherwise: the
    /// caller restarts). `f` may see bytes change under it and must not
    /// trust what it reads: every decoder it uses bounds-checks, and its
    /// result is thrown away unless the version validates afterwards.
    /// Crate-private: the read races the page's writers (see below), and
    /// safe code outside must not hold frame bytes unlatched (review 21).
    pub(crate) fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        // The frame is page_size bytes inside the pool's live allocation.
        // A writer may modify the bytes concurrently: a latched writer, a
        // write-back sealing the header, a new page on a reused frame, or
        // the kernel reading another page into it. This is the seqlock
        // read of the design (LeanStore's optimistic latches), and in
        // Rust's memory model it is a data race, so undefined behaviour:
        // a review proved the race with ThreadSanitizer. Rust has no sound
        // seqlock over plain bytes (a byte-wise atomic memcpy, RFC 3301,
        // is not in the language, and it would need the writers' stores
        // atomic too); copying the page out first would cost the descent
        // ~4 KiB per level and race all the same. What keeps it harmless
        // in practice: the slice never outlives this call and is only
        // read; every decoder run over it (`Node`, `look`) bounds-checks
        // each access against lengths it read once and never panics on
        // torn bytes; and the result is discarded unless validate()
        // proves no writer or eviction intervened.
        // SAFETY: in bounds of a live allocation; the race above is the
        // one accepted exception to the crate's aliasing rules.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.pool.frame_ptr(self.frame), self.pool.page_size)
        };
        let r = f(bytes);
        self.validate().then_some(r)
    }

    /// True if no writer or eviction touched the page since the fix.
    pub fn validate(&self) -> bool {
        std::sync::atomic::fence(Ordering::Acquire);
        let s = self.pool.table.state(self.pid).load(Ordering::Acquire);
        version_of(s) == self.version && (UNLOCKED..=MAX_SHARED).contains(&lock_of(s))
    }
}

/// How long [`BufferPool::flush_where`]'s scan runs (wall time, its own
/// waits included) before it lets the worker's other tasks run. By time,
/// not by frames: a yield costs the
/// scan a whole round of the worker's ready tasks (~1 ms with 128 busy
/// committers), and a yield every 64 frames made the scan of a 256 MiB
/// pool (1,024 yields) take a second under `dana bench commit`'s async
/// inserts, with the log filling behind it.
const FLUSH_SLICE: Duration = Duration::from_micros(500);

/// What [`BufferPool::flush_where`] did with one frame.
enum Look {
    /// Written (its write-back started), or nothing to write.
    Done,
    /// Its page waits for the log to be durable past this LSN; let go.
    Blocked(u64),
    /// Its page (this id) waits for the log past this LSN, latched.
    Held(u64, u64),
    /// Latched by another task, or being written (only when asked to
    /// hold).
    Busy,
}

/// Pages a checkpoint's round holds exclusively latched (frame, page id)
/// while it waits for the log; unlatched when dropped.
struct HeldLatches<'a> {
    table: &'a PageTable,
    pages: Vec<(u32, u64)>,
}

impl Drop for HeldLatches<'_> {
    fn drop(&mut self) {
        for &(_, pid) in &self.pages {
            self.table.unlock_exclusive(pid);
        }
    }
}

#[cfg(test)]
impl BufferPool {
    /// Takes every free frame but `keep` off the free list (a test that
    /// makes allocations wait for a frame); give them back with
    /// [`BufferPool::give_back_frames`].
    pub(crate) fn take_free_frames_but(&self, keep: usize) -> Vec<u32> {
        let mut taken = Vec::new();
        while let Some(f) = self.take_frame() {
            taken.push(f);
        }
        let kept = taken.len().min(keep);
        self.return_frames(&taken[..kept]);
        taken.split_off(kept)
    }

    /// Gives back frames [`BufferPool::take_free_frames_but`] took.
    pub(crate) fn give_back_frames(&self, frames: &[u32]) {
        self.return_frames(frames);
    }

    /// Drops page `pid`'s frame without writing it (a test whose next
    /// latch of the page must read it from the device; flush it first).
    pub(crate) async fn drop_frame(&self, pid: u64) -> Result<()> {
        self.discard(pid).await
    }
}

/// Formats the pool's array, allocates 20 raw pages and frees the sixth;
/// returns their ids (the buffer modules' unit tests).
#[cfg(test)]
async fn twenty_pages_the_sixth_freed(p: &BufferPool) -> Result<Vec<u64>> {
    p.format().await?;
    let mut pids = Vec::new();
    for _ in 0..20 {
        pids.push(p.allocate(PageType::Raw).await?.pid());
    }
    let freed = p.fix_exclusive(pids[5]).await?;
    p.free_page(freed).await?;
    Ok(pids)
}

/// A pool of `frames` frames over `array`, on a runtime of one worker
/// (the buffer modules' unit tests).
#[cfg(test)]
pub(crate) fn test_pool(array: Array, frames: usize) -> (Arc<BufferPool>, sched::Runtime) {
    let pool = BufferPool::new(array.clone(), &PoolConfig::with_frames(frames)).unwrap();
    let rt = sched::Runtime::start(
        &sched::RuntimeConfig {
            workers: 1,
            ..Default::default()
        },
        array.targets(),
        &crate::io::Backend::default(),
        pool.services(),
        Some(pool.memory()),
    )
    .unwrap();
    (pool, rt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log that appends nothing anywhere: it notes which pages each
    /// record holds, and is durable at once.
    #[derive(Default)]
    struct RecordingLog {
        next: std::sync::atomic::AtomicU64,
        records: Mutex<Vec<Vec<u64>>>,
    }

    impl PageLog for RecordingLog {
        fn log_changes(&self, changes: &[PageChange<'_>]) -> Result<Option<u64>> {
            if changes.is_empty() {
                return Ok(None);
            }
            let pids = changes.iter().map(|c| c.pid).collect();
            self.records.lock().unwrap().push(pids);
            Ok(Some(self.next.fetch_add(1, Ordering::SeqCst) + 1))
        }
        fn log_commit(&self, _: Vec<u8>, _: &[PageChange<'_>], _: u64) -> Result<(u64, u64)> {
            Err(Error::InvalidArgument("no commits here".into()))
        }
        fn log_covered(&self, _: u64, _: &[u8], _: u64) -> Result<Option<u64>> {
            Ok(None)
        }
        fn admit(&self, _: u64) -> page_log::Admission<'_> {
            Box::pin(async { Ok(Box::new(()) as page_log::LogRoom) })
        }
        fn max_record(&self) -> u64 {
            1 << 30
        }
        fn durable(&self) -> u64 {
            u64::MAX
        }
        fn next_lsn(&self) -> u64 {
            self.next.load(Ordering::SeqCst) + 1
        }
        fn want(&self, _: u64) {}
        fn wake_when_durable(&self, waker: &std::task::Waker) {
            waker.wake_by_ref();
        }
        fn poisoned(&self) -> Option<Error> {
            None
        }
    }

    /// A space guard dropped without being logged, after an allocation
    /// moved the high-water mark into a new map group (an error or a
    /// dropped future after the allocation), logs the meta page and the
    /// group's new map page in one record: one each, a crash between them
    /// kept the mark past a map page never written, and every open failed
    /// `Corrupt` (a review's finding).
    #[test]
    fn a_space_guard_dropped_unlogged_logs_its_pages_in_one_record() {
        use crate::io::sim::{SimConfig, SimDisk};
        use crate::io::Target;
        // Sparse: only the pages written take memory.
        let disk = SimDisk::new(0, 1 << 30, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, rt) = test_pool(array, 64);
        let log = Arc::new(RecordingLog::default());
        let p = pool.clone();
        let l = log.clone();
        let map_pid = rt
            .block_on(async move {
                p.format().await?;
                p.attach_wal(l.clone())?;
                let geo = p.geometry();
                // The mark near the end of the first group, then one page
                // at a time up to it.
                let _hold = p.blob_hold(geo.per_group() - 100, 84).await?;
                for _ in 0..200 {
                    let next = p.space().await?.next_unused;
                    let mut s = p.lock_space().await?;
                    let mut page = p.allocate_in(&mut s, page::PageType::Leaf).await?;
                    if geo.is_reserved(next) {
                        // Crossed: page and guard dropped unlogged.
                        l.records.lock().unwrap().clear();
                        drop(page);
                        drop(s);
                        return Ok(next);
                    }
                    p.log_with_space(&mut [&mut page], &mut s)?;
                }
                Err(Error::InvalidArgument(
                    "the mark never reached a map page".into(),
                ))
            })
            .unwrap()
            .unwrap();
        let records = log.records.lock().unwrap().clone();
        assert!(
            records
                .iter()
                .any(|r| r.contains(&0) && r.contains(&map_pid)),
            "the meta page and map page {map_pid} in separate records: {records:?}"
        );
    }

    /// A wait for a free frame that registers after the pool was poisoned
    /// ends: the poisoning woke only the waiters registered before it,
    /// and no write-back frees a frame any more (the waiter slept for
    /// good, and a close behind it; a review's finding).
    #[test]
    fn a_frame_wait_that_starts_after_a_poisoning_ends() {
        use crate::io::sim::{SimConfig, SimDisk};
        use crate::io::Target;
        use std::task::{Context, Poll, Waker};
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, _rt) = test_pool(array, 16);
        let mut taken = Vec::new();
        while let Some(f) = pool.take_frame() {
            taken.push(f);
        }
        assert_eq!(pool.free_count.load(Ordering::SeqCst), 0);
        pool.poison(&Error::Poisoned("a write-back failed".into()));
        let mut wait = std::pin::pin!(FrameWait {
            pool: &pool,
            registered: false,
        });
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Ready(()));
        pool.return_frames(&taken);
    }

    /// An allocation that fails after choosing its page (here: the read
    /// of the page's free-space map page fails) leaves the page used in
    /// memory until the next open, and takes it off the count of pages
    /// available too: counted there, a commit would later be admitted for
    /// a page that does not exist (a review's finding).
    #[test]
    fn a_failed_allocation_takes_its_page_off_the_count_available() {
        use crate::io::sim::{Fault, SimConfig, SimDisk};
        use crate::io::Target;
        use crate::OpKind;
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk.clone())], 4096).unwrap();
        let (pool, rt) = test_pool(array, 16);
        let p = pool.clone();
        let (failed, map_pid) = rt
            .block_on(async move {
                let pids = twenty_pages_the_sixth_freed(&p).await?;
                p.flush_all().await?;
                let map_pid = p.geometry().map_page_of(pids[5]);
                p.discard(map_pid).await?;
                disk.inject(
                    Fault::range(Some(OpKind::Read), map_pid * 4096..(map_pid + 1) * 4096).sticky(),
                );
                let failed = p.allocate(PageType::Raw).await.map(|g| g.pid());
                disk.clear_faults();
                Ok::<_, Error>((failed, map_pid))
            })
            .unwrap()
            .unwrap();
        assert!(failed.is_err(), "the allocation read map page {map_pid}");
        let (next, free) = {
            let m = pool.mirror();
            (m.next_unused(), m.free_below_mark())
        };
        let geo = pool.geometry();
        assert_eq!(
            pool.alloc.available.load(Ordering::SeqCst),
            geo.usable(next, pool.array.pages()) + free,
            "pages counted available that memory holds used"
        );
    }

    /// An allocation dropped while its new page waits for a stale reader
    /// (the page was freed and is still latched shared) gives back the
    /// frame it took: before, the pool was one frame smaller until the
    /// next open (a review of cancellation safety).
    #[test]
    fn an_allocation_dropped_while_it_waits_gives_its_frame_back() {
        use crate::io::sim::{SimConfig, SimDisk};
        use crate::io::Target;
        use std::future::Future;
        use std::task::{Context, Waker};
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, rt) = test_pool(array, 64);
        let p = pool.clone();
        let (before, after) = rt
            .block_on(async move {
                let pids = twenty_pages_the_sixth_freed(&p).await?;
                let stale = p.fix_shared(pids[5]).await?;
                let before = p.free_count.load(Ordering::SeqCst);
                {
                    let mut f = std::pin::pin!(p.allocate(PageType::Raw));
                    let mut cx = Context::from_waker(Waker::noop());
                    assert!(
                        f.as_mut().poll(&mut cx).is_pending(),
                        "the freed page is latched"
                    );
                }
                drop(stale);
                Ok::<_, Error>((before, p.free_count.load(Ordering::SeqCst)))
            })
            .unwrap()
            .unwrap();
        assert_eq!(
            after, before,
            "free frames before the allocation and after it was dropped"
        );
    }

    /// A task that panics while it holds a page latched for writing, after
    /// changing it, leaves a change that may be half made: the pool stops
    /// (no write-back, no log record of it) instead of marking the page
    /// dirty for a later write-back.
    #[test]
    fn a_panic_while_changing_a_page_stops_the_pool() {
        use crate::io::sim::{SimConfig, SimDisk};
        use crate::io::Target;
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, rt) = test_pool(array, 16);
        let p = pool.clone();
        let (flushed_before, poisoned, flushed_after) = rt
            .block_on(async move {
                p.format().await?;
                let pid = {
                    let mut g = p.allocate(PageType::Raw).await?;
                    g[page::PAGE_HEADER_SIZE] = 1;
                    g.pid()
                };
                let flushed_before = p.flush_all().await.is_ok();
                let g = p.fix_exclusive(pid).await?;
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    let mut g = g;
                    g[page::PAGE_HEADER_SIZE] = 2;
                    panic!("a bug in the middle of a change");
                }));
                assert!(caught.is_err());
                let poisoned = p.poisoned().is_some();
                let flushed_after = p.flush_all().await.is_ok();
                Ok::<_, Error>((flushed_before, poisoned, flushed_after))
            })
            .unwrap()
            .unwrap();
        assert!(flushed_before);
        assert!(poisoned, "the pool kept going after a half-made change");
        assert!(!flushed_after, "a half-made change could reach storage");
    }
}
