//! One write-ahead log: appending records, group commit, and the state of
//! checkpoints. A database has one log per worker ([`LogSet`]); this is
//! one of them.
//!
//! Owns: the records appended and not yet flushed (unsealed: their place
//! in the file is given when a flush takes them), the flushes in flight
//! (at most [`crate::Options::log_flushes_in_flight`]; each one durable
//! write, `RWF_DSYNC`, when it is small, else write(s) then fdatasync:
//! [`crate::Options::log_write_through_max`]; through a worker's queue to
//! the log's device), the durable end, the tasks waiting for it, the
//! sticky log error, the LSN where a checkpoint's redo starts, and the
//! log space promised to admitted commits ([`Wal::admit`]).
//!
//! Sequence numbers: every record gets a GSN from the counter all logs
//! share, under this log's lock, so a log's records are in GSN order. A
//! record may *depend* on the records of other logs up to a GSN (it
//! changes a page, or commits a read, whose last change another log holds
//! and has not made durable): a flush takes records only up to the first
//! one whose dependency is not durable in every other log yet, and asks
//! those logs to flush. So a record is never durable before what it
//! depends on, and recovery never finds a record without its past: the
//! logs never need to be cut back to a common point.
//!
//! Group commit: a committing task appends its record, gets its GSN and
//! awaits [`Wal::wait_durable`]; it never flushes itself. A worker's
//! system step ([`Wal::pump`]) starts a flush when someone waits, when
//! write-back or another log needs records durable, or when async commits
//! have waited a whole window; the flush takes every record appended so
//! far (up to a blocked dependency), so one durable write (or one write
//! and one fdatasync) makes a whole group durable and wakes all of it.
//! While the most flushes allowed are in flight new commits gather for the
//! next one. No thread ever blocks on a flush.
//!
//! Flushes in flight at once: a later flush may complete first, but the
//! durable end moves only over a prefix of completed flushes, so a commit
//! is acknowledged only when every byte before its record is durable too.
//! A crash may keep a later flush and tear an earlier one: recovery ends
//! the log at the break, because the later flush's marker names only what
//! was durable when it was issued (before the torn one). The price: damage
//! to a flush is told from a torn tail only by a marker issued after that
//! flush completed, so the flushes that were in flight together at a
//! crash are, like the last one, judged torn rather than damaged.
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
//! (so log writes stay plain overwrites), then records the new size in a
//! control block (so a file cut back to the old size is damage, not a log
//! that ends there), and a flush that would write past the recorded range
//! waits for it. After the first lap the file holds
//! the whole capacity and never changes size again.
//!
//! Never: writes a record into space the last completed checkpoint still
//! needs, writes past the recorded end of a growing log file, makes a
//! record durable before the records of other logs it depends on,
//! acknowledges a commit before its flush completed, or retries after
//! a failed log write or sync (the error is sticky: every later append and
//! wait fails with [`Error::Poisoned`]).

pub mod control;
pub mod record;
pub mod recover;
pub mod set;

pub use set::LogSet;

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::buffer::page;
use crate::buffer::page_log::PageChange;
use crate::io::grower::Grower;
use crate::io::{AlignedBuf, Completion, IoBuf, Placement, Request, ReusableBuf};
use crate::sched;
use crate::sched::{RequestKind, WakerList};
use crate::{Error, Result};

/// Bytes at the start of the log file that hold the control blocks.
pub const CONTROL_BYTES: u64 = 2 * control::BLOCK;

/// Stream bytes a new log file starts with (it grows to its capacity).
pub const INITIAL_LOG_BYTES: u64 = 1 << 20;

/// The most logs a database has (one per worker).
pub const MAX_LOGS: usize = 64;
// The meta page records each log's end (`buffer::alloc`).
const _: () = assert!(MAX_LOGS <= crate::buffer::alloc::META_LOG_ENDS);

/// Most checkpoint shards ([`crate::Options::checkpoint_shards`]).
pub const MAX_CHECKPOINT_SHARDS: usize = 64;

/// Bytes in use of a log of `capacity` that ask for a checkpoint (and
/// that over the shards, appended since the last checkpoint began, asks
/// for the next shard's): 3/8 of the log, or a quarter where every page
/// is written whole (`pages_whole`: out of place, or untorn writes). So
/// the redo point follows the log end by about that much, which recovery
/// reads and re-applies (more when commits outrun the checkpoints: up to
/// admission's limit).
///
/// Admission counts the commit records in use twice (recovery may append
/// them again) and stops at three quarters of the log ([`Wal::admit`]).
/// Where pages are written whole no torn-page image is logged and the log
/// is nearly all commit records: at 3/8 in use they count as 3/4, and
/// commits would be refused before the checkpoint was asked for (found in
/// review); a quarter leaves them a quarter of the log while it runs.
/// Where full page images fill the log (in place, the default), 3/8: a
/// quarter, the value until 2026-11-27, ran the checkpoints half as often
/// again, which cost 1.12x of the sync inserts under `dana bench commit`
/// (five pairs; docs/PERF.md), each checkpoint syncing the data file on
/// the disk the log syncs to and each round of shards bringing back a
/// full page image per page changed. The choice is fixed per open, not
/// taken from the mix of records in use: a trigger that moved with that
/// mix could be passed by a checkpoint's end rather than by an append,
/// and the seeded crash test's runs then differed (found by
/// `tests/crashtest.rs::a_seeded_crash_point_replays_exactly`).
pub fn checkpoint_trigger(capacity: u64, pages_whole: bool) -> u64 {
    if pages_whole {
        capacity / 4
    } else {
        capacity / 8 * 3
    }
}

/// What one checkpoint covers: every page, or the pages of one shard
/// (page id modulo the number of shards: continuous checkpointing writes
/// the dirty pages of one shard at a time, round robin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointScope {
    /// Every page (a checkpoint asked for by `Db::checkpoint`, close,
    /// recovery or a dropped tree).
    All,
    /// The pages whose id modulo the shard count is this.
    Shard(usize),
}

impl CheckpointScope {
    /// True if page `pid` is in this scope, of `shards` shards.
    pub fn holds(self, pid: u64, shards: usize) -> bool {
        match self {
            CheckpointScope::All => true,
            CheckpointScope::Shard(s) => shard_of(pid, shards) == s,
        }
    }
}

/// The checkpoint shard of page `pid`, of `shards`.
fn shard_of(pid: u64, shards: usize) -> usize {
    (pid % shards.max(1) as u64) as usize
}

/// The fewest pages of `page_size` a log's stream holds: its longest
/// record ([`Wal::max_record`], an eighth of it) then holds 32 whole
/// pages. With 64 KiB pages a 1 MiB log's longest record held two, and a
/// large value stored after a checkpoint (the leaf's, the map page's and
/// the meta page's images in one change) failed `TooLarge`.
pub const MIN_LOG_PAGES: u64 = 256;

/// Stream bytes of each of `count` logs sharing `total` (whole control
/// blocks, at least 1 MiB and [`MIN_LOG_PAGES`] pages of `page_size`
/// each).
pub fn per_log_bytes(total: u64, count: usize, page_size: usize) -> u64 {
    let block = control::BLOCK;
    let least = (MIN_LOG_PAGES * page_size as u64).max(1 << 20);
    (total / count.max(1) as u64 / block * block).max(least)
}

/// How long a failed growth of the log file answers for the next ones.
const LOG_GROWTH_RETRY: Duration = Duration::from_secs(1);

/// How long a flush waits for a log file that cannot grow (its growths
/// keep failing) before the log gives up with `NoSpace`: the records no
/// commit reserved room for (recovery's, a checkpoint's) waited for ever,
/// and opens and closes hung (an outside probe).
const LOG_GROWTH_STALL: Duration = Duration::from_secs(5);

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
    /// Since when a flush has waited for the file to grow.
    blocked_since: Mutex<Option<Instant>>,
    growths: Arc<AtomicU64>,
}

/// How commits wait for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A commit returns once its record is on stable storage (default).
    Sync,
    /// A commit returns at once; a flush starts within the database's
    /// async window ([`crate::Options::async_window`]), so a crash loses
    /// the commits of that window and of the flush then in progress.
    /// With several logs, a commit that read a write another log holds,
    /// not yet durable (a get, a scan, an insert's or update's check), or
    /// that split a leaf such a write is in, returns once that log is
    /// durable past it (its own log's flush it does not wait for): its
    /// records can be durable only after what they depend on, and commits
    /// on two workers that each depended on the other's last would chain,
    /// one flush per link, far behind the window.
    /// With one log the commits lost are the last ones acknowledged; with
    /// several ([`crate::Options::logs`]) each log loses its own last
    /// ones, so a commit may survive that was acknowledged after one lost
    /// on another log (docs/FORMAT.md, "The log files", says what
    /// recovery keeps of the records of several logs).
    Async,
    /// No log at all: changes reach storage by write-back and
    /// [`crate::Db::flush`] only, and a crash can leave any mix of them
    /// (the mode of the papers' benchmarks).
    Off,
}

/// The log's own ids of its requests (kind [`RequestKind::Log`]): a
/// flush's write(s) and its sync, of log `index`, flush `seq` (modulo
/// 2^39): `seq << 20 | index << 1 | what`.
const FLUSH_WRITE: u64 = 0;
const FLUSH_SYNC: u64 = 1;
const REQUEST_SEQ_SHIFT: u32 = 20;
const REQUEST_SEQ_MASK: u64 = (1 << 39) - 1;

// The log index fits below the sequence, and the id in a tag's 60 bits.
const _: () = assert!(MAX_LOGS < 1 << (REQUEST_SEQ_SHIFT - 1));
const _: () = assert!(REQUEST_SEQ_SHIFT as u64 + 39 <= 60);

fn request_id(index: usize, seq: u64, what: u64) -> u64 {
    (seq & REQUEST_SEQ_MASK) << REQUEST_SEQ_SHIFT | (index as u64) << 1 | what
}

/// The log a request id of [`request_id`] belongs to.
pub(crate) fn log_of_request(id: u64) -> usize {
    ((id & ((1 << REQUEST_SEQ_SHIFT) - 1)) >> 1) as usize
}

/// The most flushes of one log in flight at once
/// ([`crate::Options::log_flushes_in_flight`]).
pub const MAX_FLUSHES_IN_FLIGHT: usize = 8;

/// Counters of the log.
#[derive(Debug, Default)]
pub struct WalStats {
    records: AtomicU64,
    bytes: AtomicU64,
    flushes: AtomicU64,
    overlapped_flushes: AtomicU64,
    commits: AtomicU64,
    commit_bytes: AtomicU64,
    page_bytes: AtomicU64,
    images: AtomicU64,
    compressed_images: AtomicU64,
    admit_waits: AtomicU64,
    applies_continued: AtomicU64,
    checkpoints: AtomicU64,
    checkpoints_skipped: AtomicU64,
    trimmed_bytes: AtomicU64,
    trim_failures: AtomicU64,
}

/// A copy of the log's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStatsSnapshot {
    /// Records appended.
    pub records: u64,
    /// Bytes appended (records and padding).
    pub bytes: u64,
    /// Flushes completed (one durable write, or write(s) + one
    /// fdatasync, each).
    pub flushes: u64,
    /// Flushes started while another flush of the same log was in flight
    /// (`Options::log_flushes_in_flight` above 1).
    pub overlapped_flushes: u64,
    /// Commit records appended.
    pub commits: u64,
    /// Bytes of commit records.
    pub commit_bytes: u64,
    /// Bytes of page records (physical changes and full images).
    pub page_bytes: u64,
    /// Full page images logged (new pages, first changes since a
    /// checkpoint on in-place devices, structure changes of pages with
    /// covered changes).
    pub images: u64,
    /// Of the full images, those logged compressed
    /// (`Options::compress_log_images`).
    pub compressed_images: u64,
    /// Commits that waited for log space (for a checkpoint to free some).
    pub admit_waits: u64,
    /// Commits whose apply had itself logged a quarter of the log in page
    /// records, and so appended the writes it had left as a commit record
    /// of their own and waited for checkpoints to move the redo point
    /// (very large transactions only).
    pub applies_continued: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Steps of the checkpoint starter that found a checkpoint due and
    /// did not start it, because it would have raised no redo floor: the
    /// oldest commit being applied held the floors of its shards, and no
    /// redo point could have moved (it would only have spent log space).
    /// Every worker counts every such step, so one long apply counts many.
    pub checkpoints_skipped: u64,
    /// Stream bytes the checkpoints trimmed behind them (a log device
    /// that takes discards cheaply: a block device or the simulator).
    pub trimmed_bytes: u64,
    /// Trims the device refused (the blocks stay; nothing reads them).
    pub trim_failures: u64,
    /// Times the log file grew (on its first lap).
    pub file_growths: u64,
    /// Stream bytes from the last checkpoint's redo point to the end,
    /// summed over the logs: what recovery would read after a crash now.
    pub in_use: u64,
    /// Every record (and commit) with a GSN below this is durable, in
    /// every log.
    pub durable: u64,
    /// The next GSN to be assigned.
    pub end: u64,
}

impl WalStatsSnapshot {
    /// Adds another log's counters to these.
    pub fn add(&mut self, o: &WalStatsSnapshot) {
        self.records += o.records;
        self.bytes += o.bytes;
        self.flushes += o.flushes;
        self.overlapped_flushes += o.overlapped_flushes;
        self.commits += o.commits;
        self.commit_bytes += o.commit_bytes;
        self.page_bytes += o.page_bytes;
        self.images += o.images;
        self.compressed_images += o.compressed_images;
        self.admit_waits += o.admit_waits;
        self.applies_continued += o.applies_continued;
        self.checkpoints += o.checkpoints;
        self.checkpoints_skipped += o.checkpoints_skipped;
        self.trimmed_bytes += o.trimmed_bytes;
        self.trim_failures += o.trim_failures;
        self.file_growths += o.file_growths;
        self.in_use += o.in_use;
    }

    /// Counters accumulated since `earlier` (`durable` and `end` stay
    /// this snapshot's).
    pub fn since(&self, earlier: &WalStatsSnapshot) -> WalStatsSnapshot {
        WalStatsSnapshot {
            records: self.records - earlier.records,
            bytes: self.bytes - earlier.bytes,
            flushes: self.flushes - earlier.flushes,
            overlapped_flushes: self.overlapped_flushes - earlier.overlapped_flushes,
            commits: self.commits - earlier.commits,
            commit_bytes: self.commit_bytes - earlier.commit_bytes,
            page_bytes: self.page_bytes - earlier.page_bytes,
            images: self.images - earlier.images,
            compressed_images: self.compressed_images - earlier.compressed_images,
            admit_waits: self.admit_waits - earlier.admit_waits,
            applies_continued: self.applies_continued - earlier.applies_continued,
            checkpoints: self.checkpoints - earlier.checkpoints,
            checkpoints_skipped: self.checkpoints_skipped - earlier.checkpoints_skipped,
            trimmed_bytes: self.trimmed_bytes - earlier.trimmed_bytes,
            trim_failures: self.trim_failures - earlier.trim_failures,
            file_growths: self.file_growths - earlier.file_growths,
            ..*self
        }
    }
}

/// What every log of a database shares: the GSN counter, the bounds
/// below which a page's next change logs a full image, and each log's
/// durable point, flush request and dependency block.
pub(crate) struct Shared {
    /// The next GSN to assign.
    next_gsn: AtomicU64,
    /// Per checkpoint shard: a page of it whose GSN is below this logs a
    /// full image at its next change (set when a checkpoint of the shard
    /// begins, under every log's lock).
    fpi_below: Box<[AtomicU64]>,
    /// Per checkpoint shard: recovery must re-apply the commits from this
    /// GSN on for the shard's pages to be whole (its last checkpoint's
    /// bound, or the oldest commit being applied when it began: that
    /// commit's changes to the shard's pages may have missed the
    /// checkpoint's write-back, and they are redone only from its record).
    redo_floor: Box<[AtomicU64]>,
    /// Moves with every bound (under every log's lock): a record whose
    /// pages were encoded against older bounds is encoded again before it
    /// takes a GSN (`Wal::append_checked`).
    fpi_epoch: AtomicU64,
    /// Per log: a GSN at or below its first record not yet durable
    /// (u64::MAX: none; an idle log about to take a GSN publishes the next
    /// GSN first, see `Wal::append_checked`). Set under the log's lock.
    unflushed: Box<[AtomicU64]>,
    /// The largest set-wide durable point returned so far (see
    /// [`Shared::durable_below`]).
    durable_floor: AtomicU64,
    /// Per log: a flush is wanted of its records below this GSN.
    wanted: Box<[AtomicU64]>,
    /// Per log: records wait for other logs to become durable.
    blocked: Box<[AtomicBool]>,
    /// Every data device writes a page whole or not at all (out of place:
    /// a write-back goes to a fresh slot, and the map names it only once
    /// it is durable, see `io::remap`). No write-back can then tear a
    /// page, so no change logs a full image to repair one: a checkpoint
    /// asks for none, and a page's changes build on its last record
    /// whenever a checkpoint began (FORMAT.md, "What is logged").
    pages_whole: bool,
    /// Full page images are logged LZ4-compressed where that makes them
    /// smaller (`Options::compress_log_images`; FORMAT.md, page entries).
    pub(crate) compress_images: AtomicBool,
    /// A log failed: every log stops (records of the others may depend
    /// on its records, which will never be durable).
    poisoned: AtomicBool,
    /// The first failed log's error, which the others name.
    first_failure: Mutex<Option<String>>,
    /// Tasks waiting for the set's durable point to move (a checkpoint's
    /// write-back of a page changed since the last flush): woken at every
    /// flush's end and when a log stops.
    durable_waiters: WakerList,
}

impl Shared {
    pub(crate) fn new(
        count: usize,
        next_gsn: u64,
        shards: usize,
        pages_whole: bool,
    ) -> Arc<Shared> {
        let shards = shards.clamp(1, MAX_CHECKPOINT_SHARDS);
        Arc::new(Shared {
            next_gsn: AtomicU64::new(next_gsn.max(1)),
            fpi_below: (0..shards)
                .map(|_| AtomicU64::new(next_gsn.max(1)))
                .collect(),
            redo_floor: (0..shards)
                .map(|_| AtomicU64::new(next_gsn.max(1)))
                .collect(),
            fpi_epoch: AtomicU64::new(0),
            pages_whole,
            compress_images: AtomicBool::new(false),
            unflushed: (0..count).map(|_| AtomicU64::new(u64::MAX)).collect(),
            durable_floor: AtomicU64::new(0),
            wanted: (0..count).map(|_| AtomicU64::new(0)).collect(),
            blocked: (0..count).map(|_| AtomicBool::new(false)).collect(),
            poisoned: AtomicBool::new(false),
            first_failure: Mutex::new(None),
            durable_waiters: WakerList::default(),
        })
    }

    /// Parks `waker` until the durable point of the set next moves or a
    /// log stops (see [`WakerList`] for the protocol).
    pub(crate) fn wake_when_durable(&self, waker: &Waker) {
        self.durable_waiters.register(waker);
    }

    /// Every record of every log other than `me` below this GSN is
    /// durable (`me` out of range: of every log); at most the next GSN.
    ///
    /// The next GSN is read first: a log publishes a bound at or below a
    /// GSN before it takes it (`Wal::append_checked`), so every GSN below
    /// the value read was taken after its log's bound was visible, and the
    /// scan sees that bound (or a later one, once the record is durable).
    /// Read the other way round, or with a log's bound published after
    /// its GSN was taken, a scan could pass an idle log between the two
    /// and count a record not yet durable as durable, and the durable
    /// point then moved backwards (seen as a possible false alarm of
    /// `start_writeback`'s assert of the write-ahead rule).
    fn others_durable_below(&self, me: usize) -> u64 {
        let next = self.next_gsn.load(Ordering::Acquire);
        self.unflushed
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != me)
            .map(|(_, u)| u.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX)
            .min(next)
    }

    /// Every record of every log below this GSN is durable; never less
    /// than a value returned before.
    ///
    /// Each scan gives a true bound, but two scans can disagree backwards:
    /// an idle log that read the next GSN as B and was preempted before
    /// publishing it can publish B after another log took B and made it
    /// durable, and a scan in between gave B + 1 (found in review). A
    /// write-back checks the point and then asserts it, so a point moving
    /// backwards would fire that assert; the floor keeps the largest bound
    /// seen (a bound stays true: durable records stay durable).
    pub(crate) fn durable_below(&self) -> u64 {
        let now = self.others_durable_below(usize::MAX);
        let floor = self.durable_floor.load(Ordering::Acquire);
        if now <= floor {
            return floor;
        }
        self.durable_floor.fetch_max(now, Ordering::AcqRel).max(now)
    }

    /// The next GSN to assign.
    pub(crate) fn next_gsn(&self) -> u64 {
        self.next_gsn.load(Ordering::Acquire)
    }

    /// Checkpoint shards.
    pub(crate) fn shards(&self) -> usize {
        self.fpi_below.len()
    }

    /// Page `pid` logs a full image at its next change if its GSN is below
    /// this (see [`Shared::fpi_below`]); 0 (never) when write-backs cannot
    /// tear pages ([`Shared::pages_whole`]).
    pub(crate) fn full_image_below(&self, pid: u64) -> u64 {
        if self.pages_whole {
            return 0;
        }
        self.fpi_below[shard_of(pid, self.shards())].load(Ordering::Acquire)
    }

    /// Where recovery must start re-applying commits for every shard's
    /// pages to be whole: the lowest redo floor of any shard.
    pub(crate) fn redo_gsn(&self) -> u64 {
        self.redo_floor
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }

    /// Whether a checkpoint of `scope` begun now, with `applying` the
    /// oldest commit being applied in any log, would raise the redo floor
    /// of a shard it holds (see [`Shared::begin_full_images`]). If not,
    /// no log's redo point would move: the last checkpoint that began
    /// computed the same lowest floor.
    pub(crate) fn floor_would_rise(&self, scope: CheckpointScope, applying: Option<u64>) -> bool {
        let now = self.next_gsn();
        let floor = applying.map_or(now, |a| a.min(now));
        let shards = self.shards();
        (0..shards).any(|s| {
            scope.holds(s as u64, shards) && self.redo_floor[s].load(Ordering::Acquire) < floor
        })
    }

    /// Every shard's redo floor (taken before a checkpoint begins, to put
    /// back if it fails).
    pub(crate) fn redo_floors(&self) -> Vec<u64> {
        self.redo_floor
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .collect()
    }

    /// Puts back the floors a checkpoint that failed had moved: its pages
    /// may not have been written, and a later checkpoint naming the lowest
    /// floor as its redo point would have skipped their changes at
    /// recovery (a review's finding). Never raises a floor.
    pub(crate) fn restore_redo_floors(&self, floors: &[u64]) {
        for (f, &old) in self.redo_floor.iter().zip(floors) {
            f.fetch_min(old, Ordering::AcqRel);
        }
    }

    /// See [`Shared::fpi_epoch`]: read before the bounds a record is
    /// encoded against.
    fn fpi_epoch(&self) -> u64 {
        self.fpi_epoch.load(Ordering::Acquire)
    }

    /// From now on, pages of `scope` changed before now log a full image
    /// at their next change (a checkpoint of them began), and their redo
    /// floor is now or `applying` (the oldest commit being applied, if
    /// older); returns the bound. The caller holds every log's lock.
    pub(crate) fn begin_full_images(&self, scope: CheckpointScope, applying: Option<u64>) -> u64 {
        let now = self.next_gsn();
        let floor = applying.map_or(now, |a| a.min(now));
        let shards = self.shards();
        for s in 0..shards {
            if scope.holds(s as u64, shards) {
                self.fpi_below[s].fetch_max(now, Ordering::AcqRel);
                // Never lower than before: a commit applying now that was
                // appended before the shard's last checkpoint was applying
                // then too, and that floor is at or below it.
                let old = self.redo_floor[s].swap(floor, Ordering::AcqRel);
                debug_assert!(
                    old <= floor,
                    "shard {s}: redo floor {old} moved back to {floor}"
                );
            }
        }
        self.fpi_epoch.fetch_add(1, Ordering::AcqRel);
        now
    }

    /// Asks every log but `me` to flush its records up to GSN `dep`.
    fn want_others(&self, me: usize, dep: u64) {
        for (j, w) in self.wanted.iter().enumerate() {
            if j != me {
                w.fetch_max(dep + 1, Ordering::SeqCst);
            }
        }
        // See `Wal::want`.
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// An append's GSN and the GSN after it, or the record back (its page
/// entries were encoded against full-image bounds a checkpoint moved).
type Appended = std::result::Result<(u64, u64), Vec<u8>>;

/// What [`Wal::put_pages`] put into a record.
struct PutPages {
    /// Page entries.
    entries: u32,
    /// Of which full images.
    images: u64,
    /// Of which compressed.
    compressed: u64,
    /// The full-image bounds the entries were encoded against (None: all
    /// whole, right whatever the bounds).
    epoch: Option<u64>,
}

/// A flush in flight.
struct Flushing {
    /// Its number among the log's flushes (request ids carry it).
    seq: u64,
    /// The stream's end after it.
    end: u64,
    /// The GSN of its first record: until it is durable, the log is
    /// durable only below it.
    first_gsn: u64,
    /// Writes not yet completed.
    writes: usize,
    /// Its writes are durable writes: no fdatasync follows them.
    durable_writes: bool,
    /// Durable (its last write or its sync completed), perhaps before an
    /// earlier flush: the durable end passes it only with them.
    done: bool,
}

/// A record appended and not yet taken by a flush.
struct Queued {
    len: usize,
    gsn: u64,
    /// Other logs must be durable up to this GSN first (0: nothing).
    dep: u64,
    kind: Queue,
}

/// What a queued record is, to the log itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// A commit record (being applied until `Wal::applied`).
    Commit,
    /// A checkpoint record (the control block names its LSN).
    Checkpoint,
    /// Any other.
    Other,
}

/// Where the running checkpoint's redo starts in this log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedoAt {
    /// No checkpoint runs.
    Idle,
    /// At this LSN (a commit still being applied when it began).
    Fixed(u64),
    /// At the first record sealed with a GSN at or past the redo GSN
    /// (once found).
    Watch(Option<u64>),
}

struct State {
    /// The LSN the next sealed record takes.
    end: u64,
    /// Checksum of the last sealed record (the next record's chain).
    last_crc: u32,
    /// Records appended, unsealed, in GSN order.
    pending: Vec<u8>,
    queue: VecDeque<Queued>,
    /// The flushes in flight, in stream order (at most
    /// `Wal::max_in_flight`).
    flushing: VecDeque<Flushing>,
    /// The number the next flush takes.
    next_flush: u64,
    /// When the oldest record in `pending` was appended.
    since: Option<Instant>,
    /// The stream below this is trimmed (or was never trimmed, on a
    /// device that does not take discards cheaply).
    trimmed_to: u64,
    /// Redo LSN of the last completed checkpoint: the log before it may
    /// be overwritten.
    redo: u64,
    /// GSNs of the commits whose writes are being applied: a
    /// checkpoint's redo GSN may not pass them.
    applying: BTreeSet<u64>,
    /// The running checkpoint's redo point.
    redo_at: RedoAt,
    /// The running checkpoint's redo GSN (see `LogSet::begin_checkpoint`).
    redo_gsn: u64,
    /// Each flush since the last checkpoint's redo LSN: where it starts,
    /// the most GSN it holds (a checkpoint finds where its redo GSN's
    /// records start among those already sealed) and its commit records'
    /// bytes.
    batches: VecDeque<(u64, u64, u64)>,
    /// Bytes of the commit records from the redo LSN to the end (sealed
    /// or not): what recovery would append again to re-apply them (see
    /// [`Wal::admit`]).
    commit_bytes: u64,
    /// LSN of the last checkpoint record sealed.
    checkpoint_lsn: u64,
    /// The stream's end when the last checkpoint began (or the log
    /// resumed): continuous checkpointing starts the next shard's once the
    /// log has grown by its share past it.
    last_begin: u64,
}

/// How a log's flushes are written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlushPolicy {
    /// Every flush is padded to this many bytes (the device's block).
    pub block: u64,
    /// Async commits wait at most this long for a flush.
    pub window: Duration,
    /// A flush of at most this many bytes is a durable write
    /// (write-through) and no fdatasync follows; a larger one is
    /// write(s), then one fdatasync.
    pub write_through_max: u64,
    /// The most flushes in flight at once (1 to
    /// [`MAX_FLUSHES_IN_FLIGHT`]).
    pub max_in_flight: usize,
}

/// One write-ahead log of a database.
pub struct Wal {
    /// Which log of the database this is (of `shared`'s).
    index: usize,
    shared: Arc<Shared>,
    device: usize,
    log_id: u64,
    /// Where the log resumed, and the end of the valid records before it:
    /// a flush marker never claims the gap between them durable.
    resumed_at: u64,
    resumed_valid_end: u64,
    block: u64,
    capacity: u64,
    window: Duration,
    /// Flushes of at most this many bytes are durable writes (no
    /// fdatasync after them); larger ones are write(s) + fdatasync.
    write_through_max: u64,
    /// The most flushes in flight at once.
    max_in_flight: usize,
    state: Mutex<State>,
    /// The LSN up to which the stream is durable.
    durable: AtomicU64,
    /// Flushes in flight (`State::flushing`'s length, readable without
    /// the lock).
    in_flight: AtomicUsize,
    /// The GSN of the first record appended and not yet taken by a flush
    /// (`u64::MAX`: none), readable without the lock.
    queued_from: AtomicU64,
    /// Log bytes promised to commits admitted and not yet applied.
    reserved: AtomicU64,
    waiters: Mutex<Vec<(u64, Waker)>>,
    has_waiters: AtomicBool,
    /// Commits waiting in [`Wal::admit`] for log space.
    space_waiters: Arc<WakerList>,
    poisoned: AtomicBool,
    poison: Mutex<Option<String>>,
    /// Why no checkpoint can run any more (the buffer pool stopped), once
    /// one cannot: admission then refuses a commit the log has no room
    /// for instead of waiting for a checkpoint that will never come.
    checkpoints_stopped: Mutex<Option<String>>,
    /// Writes the control blocks: a checkpoint's finish, a growth.
    control: Arc<control::Writer>,
    checkpoint_wanted: AtomicBool,
    /// Between `begin_checkpoint` and `finish_checkpoint`.
    in_checkpoint: AtomicBool,
    /// Set for a log file shorter than its capacity.
    growth: Option<LogGrowth>,
    /// The log's device, when it takes discards cheaply
    /// ([`crate::io::Target::discards_cheaply`]): each checkpoint trims
    /// the stream it frees, so the device's collection never copies dead
    /// log blocks.
    trim: Option<crate::io::Target>,
    /// Buffers kept from one flush for the next, so a flush allocates
    /// nothing in the steady state.
    flush_buffers: Mutex<FlushBuffers>,
    stats: WalStats,
}

/// What one flush needs besides the log's state; kept between flushes.
/// Allocating them per flush cost `dana bench commit` ~0.5 µs of CPU per
/// insert: the records' vector grew from empty each time (reallocations
/// and copies), and fresh large allocations came back zeroed from the
/// kernel (page faults).
#[derive(Default)]
struct FlushBuffers {
    /// Empty, with the capacity of an earlier flush's records: the next
    /// records go into it.
    records: Vec<u8>,
    /// The aligned buffers earlier flushes wrote from (at most one more
    /// than the flushes in flight): one is reused once no request holds
    /// it any more.
    aligned: Vec<ReusableBuf>,
}

/// A records vector larger than this is not kept for the next flush.
const KEEP_RECORDS_MAX: usize = 4 << 20;
/// The smallest aligned flush buffer allocated (most flushes then fit the
/// one kept).
const FLUSH_BUFFER_MIN: usize = 256 << 10;

/// Log bytes promised to one admitted commit ([`Wal::admit`]); released on
/// drop.
pub struct LogReservation<'a> {
    wal: &'a Wal,
    bytes: u64,
}

impl LogReservation<'_> {
    /// True if this reservation admits a commit that asks `bytes` (as
    /// [`Wal::admit`] caps it).
    pub fn covers(&self, bytes: u64) -> bool {
        self.bytes >= bytes.min(self.wal.capacity / 4)
    }
}

impl Drop for LogReservation<'_> {
    fn drop(&mut self) {
        self.wal.release(self.bytes);
    }
}

/// Log bytes promised to one admitted change that owns its log handle
/// ([`Wal::admit_owned`]: a write that is not a commit); released on drop.
pub struct OwnedLogReservation {
    wal: Arc<Wal>,
    bytes: u64,
}

impl Drop for OwnedLogReservation {
    fn drop(&mut self) {
        self.wal.release(self.bytes);
    }
}

/// Where a log resumes, from recovery or a fresh format.
#[derive(Debug, Clone, Copy)]
pub struct Resume {
    /// The next LSN (block aligned).
    pub end: u64,
    /// Checksum of the last valid record.
    pub last_crc: u32,
    /// The last control block written (the newest valid one): the redo
    /// LSN of the last completed checkpoint, the stream's capacity, the
    /// log's identity, the unit flushes are padded to.
    pub control: control::Control,
    /// The end of the valid records found (at or below `end`: the bytes in
    /// between are whatever a torn flush left, skipped by recovery).
    pub valid_end: u64,
}

/// How many records at the head of `queue` a flush may take when every
/// other log is durable below GSN `others`, their bytes, and the
/// dependency of the first record it may not take (0: it takes all).
fn flushable(queue: &VecDeque<Queued>, others: u64) -> (usize, usize, u64) {
    let (mut n, mut bytes) = (0, 0);
    for q in queue {
        if q.dep != 0 && q.dep >= others {
            return (n, bytes, q.dep);
        }
        n += 1;
        bytes += q.len;
    }
    (n, bytes, 0)
}

/// How soon a worker looks again at a log whose async window ended while
/// a flush of it was in flight (see [`Wal::due_in`]).
const FLUSH_RECHECK: Duration = Duration::from_millis(1);

/// What the records appended to any log while a future was polled add up
/// to ([`own_appends`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnAppends {
    /// Their bytes.
    pub(crate) bytes: u64,
    /// The largest dependency on other logs' records not yet durable that
    /// one of them carried (0: none).
    pub(crate) dep: u64,
}

impl OwnAppends {
    fn add(&mut self, o: OwnAppends) {
        self.bytes += o.bytes;
        self.dep = self.dep.max(o.dep);
    }
}

thread_local! {
    /// The records this thread appended to any log since the innermost
    /// [`own_appends`] around it was polled.
    static APPENDED_HERE: std::cell::Cell<OwnAppends> =
        const { std::cell::Cell::new(OwnAppends { bytes: 0, dep: 0 }) };
}

/// Runs `f`, adding to `own` the records appended to any log while it was
/// polled: its own records (a task appends while it is polled, on its
/// worker's thread), not those other tasks appended while it waited.
/// Their bytes: `txn::apply_logged` counted the log's end moved by other
/// tasks as its own until 2026-11-29 (with 64 committers on a 1 MiB log,
/// two-write commits went on from records of their own and waited for
/// checkpoints, which each spent log space while those commits held the
/// redo point, until no checkpoint could be flushed and every commit hung:
/// `dana crashtest --worker-logs --tasks 64`). Their dependencies: an
/// async commit waits for the other logs past those of the page records
/// its apply appended (a split, a full image of a page another log changed
/// last), as for what it read; else the chain of such records across two
/// logs drained one flush per link (see `txn::Committer`).
pub(crate) async fn own_appends<F: Future>(f: F, own: &mut OwnAppends) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        let outer = APPENDED_HERE.with(|a| a.replace(OwnAppends::default()));
        let polled = f.as_mut().poll(cx);
        let mine = APPENDED_HERE.with(|a| a.get());
        own.add(mine);
        let mut all = outer;
        all.add(mine);
        APPENDED_HERE.with(|a| a.set(all));
        polled
    })
    .await
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Wal {
    /// Log `index` of those sharing `shared`, on queue index `device` (of
    /// every worker), resuming at `resume` (its capacity included),
    /// flushing as `flush` says. `file`: the log's target, if it
    /// may be shorter than its capacity and grow (a regular file; see
    /// [`recover::is_growable`]).
    pub(crate) fn new(
        index: usize,
        shared: Arc<Shared>,
        device: usize,
        flush: FlushPolicy,
        resume: Resume,
        file: Option<crate::io::Target>,
    ) -> Result<Arc<Wal>> {
        let FlushPolicy {
            block,
            window,
            write_through_max,
            max_in_flight,
        } = flush;
        if !(1..=MAX_FLUSHES_IN_FLIGHT).contains(&max_in_flight) {
            return Err(Error::InvalidArgument(format!(
                "log flushes in flight: {max_in_flight}, must be 1 to {MAX_FLUSHES_IN_FLIGHT}"
            )));
        }
        let capacity = resume.control.capacity;
        if !block.is_power_of_two() || block > control::BLOCK || capacity % control::BLOCK != 0 {
            return Err(Error::InvalidArgument(format!(
                "log block {block} / capacity {capacity}: the block must be a power of two up to \
                 {} and the capacity a multiple of it",
                control::BLOCK
            )));
        }
        assert!(index < shared.unflushed.len());
        Ok(Arc::new(Wal {
            index,
            shared,
            device,
            log_id: resume.control.log_id,
            resumed_at: resume.end,
            resumed_valid_end: resume.valid_end.min(resume.end),
            block,
            capacity,
            window,
            write_through_max,
            max_in_flight,
            state: Mutex::new(State {
                end: resume.end,
                last_crc: resume.last_crc,
                pending: Vec::new(),
                queue: VecDeque::new(),
                flushing: VecDeque::new(),
                next_flush: 0,
                since: None,
                redo: resume.control.redo,
                trimmed_to: 0,
                applying: BTreeSet::new(),
                redo_at: RedoAt::Idle,
                redo_gsn: 0,
                batches: VecDeque::new(),
                commit_bytes: 0,
                checkpoint_lsn: 0,
                last_begin: resume.end,
            }),
            durable: AtomicU64::new(resume.end),
            in_flight: AtomicUsize::new(0),
            queued_from: AtomicU64::new(u64::MAX),
            reserved: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            has_waiters: AtomicBool::new(false),
            space_waiters: Arc::default(),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(None),
            checkpoints_stopped: Mutex::new(None),
            control: Arc::new(control::Writer::new(resume.control)),
            checkpoint_wanted: AtomicBool::new(false),
            in_checkpoint: AtomicBool::new(false),
            trim: file.as_ref().filter(|f| f.discards_cheaply()).cloned(),
            growth: file
                .filter(|f| {
                    recover::is_growable(f) && f.size() < CONTROL_BYTES + resume.control.capacity
                })
                .map(|f| LogGrowth {
                    // More than the control block records after a growth
                    // cut before its block: the open's checkpoint, before
                    // any commit, records it. Whole MiB: a part of one
                    // past them is a growth cut short (recovery reads up to
                    // the MiB below), which the next growth writes again.
                    allocated: Arc::new(AtomicU64::new({
                        let stream = f.size().saturating_sub(CONTROL_BYTES);
                        stream - stream % INITIAL_LOG_BYTES
                    })),
                    file: f,
                    grower: Grower::default(),
                    blocked: AtomicBool::new(false),
                    blocked_since: Mutex::new(None),
                    growths: Arc::default(),
                }),
            flush_buffers: Mutex::default(),
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
        let control = self.control.clone();
        let work = move || {
            let grown = match file.grow_zeroed(CONTROL_BYTES + target) {
                Err(Error::NoSpace(_)) if least < target => {
                    file.grow_zeroed(CONTROL_BYTES + least).map(|()| least)
                }
                r => r.map(|()| target),
            };
            // The new size on record before any flush writes past the
            // old one: a file cut back to it is then found cut short.
            let grown = grown
                .and_then(|grown| recover::record_growth(&file, &control, grown).map(|()| grown));
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

    /// Which log of the database this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Stream bytes of the log file.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The longest record this log takes (an eighth of it).
    pub fn max_record(&self) -> u64 {
        self.capacity / 8
    }

    /// Every record of this log below this GSN is durable.
    pub fn durable_below(&self) -> u64 {
        self.shared.unflushed[self.index].load(Ordering::Acquire)
    }

    /// The error that stopped the log, if any (another log's failure
    /// stops this one too).
    pub fn poisoned(&self) -> Option<Error> {
        if !self.poisoned.load(Ordering::Acquire) {
            if self.shared.poisoned.load(Ordering::Acquire) {
                let first = self
                    .shared
                    .first_failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_default();
                return Some(Error::Poisoned(format!(
                    "another log of the database failed: {first}"
                )));
            }
            return None;
        }
        let p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        Some(Error::Poisoned(
            p.clone().unwrap_or_else(|| "log failure".into()),
        ))
    }

    /// No checkpoint can run any more, for `why` (the pool that writes
    /// the pages back stopped; the log itself still runs, so that closing
    /// makes its commits durable): commits waiting for room, which only a
    /// checkpoint frees, fail with it now, and so does every later one
    /// the log has no room for. (They waited for good, and a worker woken
    /// by each checkpoint refused spun at full CPU: found by a power cut
    /// in the middle of a transaction larger than the log.)
    pub(crate) fn stop_checkpoints(&self, why: &Error) {
        let mut s = self
            .checkpoints_stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(match why {
                Error::Poisoned(m) => m.clone(),
                e => e.to_string(),
            });
            drop(s);
            self.space_waiters.wake_all();
        }
    }

    /// True once another log of the database failed and this one has not
    /// yet stopped (its waiters wait for nothing).
    pub(crate) fn stopped_by_another(&self) -> bool {
        self.shared.poisoned.load(Ordering::Acquire) && !self.poisoned.load(Ordering::Acquire)
    }

    /// Stops the log for good: every later append and wait fails.
    pub fn poison_with(&self, e: &Error) {
        {
            let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
            if p.is_none() {
                *p = Some(format!("log: {e}"));
            }
        }
        {
            let mut f = self
                .shared
                .first_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if f.is_none() {
                *f = Some(format!("log {}: {e}", self.index));
            }
        }
        self.poisoned.store(true, Ordering::Release);
        self.shared.poisoned.store(true, Ordering::Release);
        self.control.stop();
        self.wake_waiters(true);
        self.space_waiters.wake_all();
    }

    /// Counters (`durable`: this log's durable point; `end`: the next GSN).
    pub fn stats(&self) -> WalStatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let end = self.shared.next_gsn();
        WalStatsSnapshot {
            records: l(&self.stats.records),
            bytes: l(&self.stats.bytes),
            flushes: l(&self.stats.flushes),
            overlapped_flushes: l(&self.stats.overlapped_flushes),
            commits: l(&self.stats.commits),
            commit_bytes: l(&self.stats.commit_bytes),
            page_bytes: l(&self.stats.page_bytes),
            images: l(&self.stats.images),
            compressed_images: l(&self.stats.compressed_images),
            admit_waits: l(&self.stats.admit_waits),
            applies_continued: l(&self.stats.applies_continued),
            checkpoints: l(&self.stats.checkpoints),
            checkpoints_skipped: l(&self.stats.checkpoints_skipped),
            trimmed_bytes: l(&self.stats.trimmed_bytes),
            trim_failures: l(&self.stats.trim_failures),
            file_growths: self.growth.as_ref().map_or(0, |g| l(&g.growths)),
            in_use: self.used(),
            durable: self.durable_below().min(end),
            end,
        }
    }

    /// Appends a page section to `b`: a count, then one entry per changed
    /// page of `changes` (a difference, or a full image where the rules of
    /// FORMAT.md ask for one; every entry whole with `all_full`).
    fn put_pages(
        &self,
        b: &mut record::RecordBuilder,
        changes: &[PageChange<'_>],
        all_full: bool,
    ) -> PutPages {
        // Read before the bounds: an append checks it did not move.
        let epoch = self.shared.fpi_epoch();
        let count_at = b.len();
        b.u32(0);
        let mut put = PutPages {
            entries: 0,
            images: 0,
            compressed: 0,
            epoch: (!all_full).then_some(epoch),
        };
        for c in changes {
            // Not a new page, and logged whole since a checkpoint of its
            // shard began (a torn write-back of it can be rebuilt from
            // that image): a record may build on the page's last one.
            let builds_on_image = !all_full
                && !c.fresh
                && page::page_lsn(c.after) >= self.shared.full_image_below(c.pid);
            // A leaf cut at a key (a split's left half) is then recorded as
            // the cut alone: recovery redoes it on the leaf as it finds it.
            if let (Some((tree, key)), true) = (c.cut, builds_on_image) {
                record::put_cut_entry(b, c.pid, tree, key);
                put.entries += 1;
                continue;
            }
            // Otherwise a difference, unless the page must be whole: not
            // building on an image, or the pool kept no copy (covered
            // changes since its last record are in no page record, so a
            // difference would not compose at redo).
            let before = c.before.filter(|_| builds_on_image);
            let full = before.is_none();
            let segs = match before {
                Some(b) => record::diff(b, c.after),
                None => record::image(c.after),
            };
            if !full && segs.is_empty() {
                continue;
            }
            if full {
                let compress = self.shared.compress_images.load(Ordering::Relaxed);
                put.compressed += u64::from(record::put_image_entry(
                    b, c.pid, c.after, &segs, compress, c.fresh,
                ));
            } else {
                record::put_page_entry(b, c.pid, 0, c.after, &segs);
            }
            put.entries += 1;
            put.images += u64::from(full);
        }
        b.set_u32_at(count_at, put.entries);
        if put.entries == 0 {
            put.epoch = None;
        }
        put
    }

    /// Appends an unsealed record that depends on the other logs up to GSN
    /// `dep` (0: on nothing); returns its GSN and the GSN after it.
    pub fn append(&self, record: Vec<u8>, dep: u64) -> Result<(u64, u64)> {
        self.append_inner(record, Queue::Other, dep)
    }

    /// Appends a checkpoint record (its LSN goes into the control block).
    pub(crate) fn append_checkpoint(&self, record: Vec<u8>) -> Result<(u64, u64)> {
        self.append_inner(record, Queue::Checkpoint, 0)
    }

    /// Appends a commit record (depending on the other logs up to `dep`)
    /// and registers it as being applied until [`Wal::applied`].
    pub fn append_commit(&self, record: Vec<u8>, dep: u64) -> Result<(u64, u64)> {
        self.append_inner(record, Queue::Commit, dep)
    }

    /// Appends a page record of `changes` (None if no page changed);
    /// returns its GSN.
    pub(crate) fn append_pages(&self, changes: &[PageChange<'_>], dep: u64) -> Result<Option<u64>> {
        let b = record::RecordBuilder::new(record::Kind::Pages);
        let r = self.append_with_pages(b, record::Kind::Pages, changes, dep)?;
        Ok(r.map(|(gsn, _)| gsn))
    }

    /// Appends the commit record `commit` (built up to its page section)
    /// with the page section of `changes`, as [`Wal::append_commit`].
    pub(crate) fn append_commit_with_pages(
        &self,
        commit: Vec<u8>,
        changes: &[PageChange<'_>],
        dep: u64,
    ) -> Result<(u64, u64)> {
        let b = record::RecordBuilder::from_raw(commit, record::Kind::Commit)?;
        self.append_with_pages(b, record::Kind::Commit, changes, dep)?
            .ok_or_else(|| Error::Log("a commit record was not appended".into()))
    }

    /// Appends `b` (a record of `kind` built up to its page section) with
    /// the page section of `changes`: encoded once more, every page whole,
    /// if a checkpoint moved the full-image bounds between the encoding
    /// and the append (see `Wal::append_checked`; whole pages are right
    /// whatever the bounds). A page record with no page changed is not
    /// appended (None).
    fn append_with_pages(
        &self,
        mut b: record::RecordBuilder,
        kind: record::Kind,
        changes: &[PageChange<'_>],
        dep: u64,
    ) -> Result<Option<(u64, u64)>> {
        let queue = match kind {
            record::Kind::Commit => Queue::Commit,
            _ => Queue::Other,
        };
        let head = b.len();
        for all_full in [false, true] {
            let put = self.put_pages(&mut b, changes, all_full);
            if put.entries == 0 && queue == Queue::Other {
                return Ok(None);
            }
            let rec = b.into_unsealed();
            let len = rec.len() as u64;
            match self.append_checked(rec, queue, dep, put.epoch)? {
                Ok(r) => {
                    self.stats.images.fetch_add(put.images, Ordering::Relaxed);
                    self.stats
                        .compressed_images
                        .fetch_add(put.compressed, Ordering::Relaxed);
                    if queue == Queue::Other {
                        self.stats.page_bytes.fetch_add(len, Ordering::Relaxed);
                    }
                    return Ok(Some(r));
                }
                Err(stale) => {
                    b = record::RecordBuilder::from_raw(stale, kind)?;
                    b.truncate(head);
                }
            }
        }
        Err(Error::Log("a record of whole pages came back stale".into()))
    }

    fn append_inner(&self, record: Vec<u8>, kind: Queue, dep: u64) -> Result<(u64, u64)> {
        self.append_checked(record, kind, dep, None)?
            .map_err(|_| Error::Log("a record encoded against no bounds came back stale".into()))
    }

    /// Appends `record` unless its page entries were encoded against the
    /// full-image bounds of `epoch` and a checkpoint moved them since (the
    /// record comes back: the caller encodes again). Checked under the
    /// log's lock, where the record takes its GSN and where a checkpoint
    /// moves the bounds: a difference encoded before a checkpoint began and
    /// appended after it would be a page's first record past the
    /// checkpoint's redo point without being a full image, and a torn
    /// write-back of the page could not be rebuilt.
    fn append_checked(
        &self,
        mut record: Vec<u8>,
        kind: Queue,
        dep: u64,
        epoch: Option<u64>,
    ) -> Result<Appended> {
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        let len = record.len();
        if len as u64 > self.max_record() {
            return Err(Error::TooLarge {
                what: "log record",
                len,
                max: self.max_record() as usize,
            });
        }
        let mut st = self.lock();
        if epoch.is_some_and(|e| e != self.shared.fpi_epoch()) {
            return Ok(Err(record));
        }
        let mut published = u64::MAX;
        if st.queue.is_empty() && st.flushing.is_empty() {
            // An idle log publishes a bound at or below the GSN it is about
            // to take before taking it, so the set's durable point never
            // passes that GSN (see `Shared::others_durable_below`); the
            // exact GSN replaces it below.
            published = self.shared.next_gsn.load(Ordering::Acquire);
            self.shared.unflushed[self.index].store(published, Ordering::Release);
        }
        let gsn = self.shared.next_gsn.fetch_add(1, Ordering::AcqRel);
        record::set_gsn(&mut record, gsn);
        // A dependency on records the other logs already made durable is
        // none (the common case: remote flushes are avoided).
        let dep = if dep != 0 && dep >= self.shared.others_durable_below(self.index) {
            dep
        } else {
            0
        };
        if st.queue.is_empty() {
            if st.flushing.is_empty() {
                self.shared.unflushed[self.index].store(gsn, Ordering::Release);
            }
            self.queued_from.store(gsn, Ordering::Release);
        }
        st.pending.extend_from_slice(&record);
        st.queue.push_back(Queued {
            len,
            gsn,
            dep,
            kind,
        });
        st.since.get_or_insert_with(Instant::now);
        if kind == Queue::Commit {
            st.applying.insert(gsn);
            st.commit_bytes += len as u64;
        }
        drop(st);
        if kind == Queue::Commit {
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            self.stats
                .commit_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
        }
        if dep != 0 {
            // The logs this record waits for flush without waiting for
            // their own windows.
            self.shared.want_others(self.index, dep);
        }
        if published < gsn {
            // Other logs took GSNs between the two loads, and for a moment
            // this log's bound held the set's durable point below them:
            // a log blocked on it, or a task waiting for the point, was
            // not woken when the exact GSN replaced it. This log's flush
            // is asked for, whose completion pumps and wakes them; and as
            // that flush may itself wait for a log so blocked (found in
            // review), the other logs' blocked flags are cleared, so that
            // a worker pumps them again (a pump sets the flag again if a
            // log really is blocked), and the set's waiters look again.
            // Else they waited for an async window. Rare: only with
            // several logs, another taking a GSN between the two loads.
            self.want(gsn + 1);
            for (j, blocked) in self.shared.blocked.iter().enumerate() {
                if j != self.index {
                    blocked.store(false, Ordering::SeqCst);
                }
            }
            std::sync::atomic::fence(Ordering::SeqCst);
            self.shared.durable_waiters.wake_all();
        }
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
        APPENDED_HERE.with(|a| {
            let mut here = a.get();
            here.add(OwnAppends {
                bytes: len as u64,
                dep,
            });
            a.set(here);
        });
        Ok(Ok((gsn, gsn + 1)))
    }

    /// Counts a commit whose apply went on from a record of its own
    /// ([`WalStatsSnapshot::applies_continued`]).
    pub(crate) fn count_continued_apply(&self) {
        self.stats.applies_continued.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a checkpoint not started ([`WalStatsSnapshot::checkpoints_skipped`]).
    pub(crate) fn count_skipped_checkpoint(&self) {
        self.stats
            .checkpoints_skipped
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The commit with GSN `gsn` is fully applied to the pages.
    pub fn applied(&self, gsn: u64) {
        self.lock().applying.remove(&gsn);
    }

    /// Waits until this log is durable below GSN `end` (the second value
    /// an append returned). Fails if the log is poisoned.
    pub fn wait_durable(self: &Arc<Self>, end: u64) -> DurableWait {
        DurableWait {
            wal: self.clone(),
            end,
        }
    }

    /// Asks for a flush of this log's records below GSN `end` without
    /// waiting.
    pub fn want(&self, end: u64) {
        self.shared.wanted[self.index].fetch_max(end, Ordering::SeqCst);
        // Pairs with the fence in `flush_completed`: either this side's
        // `wants_flush` sees the flush's end, or the completion's `pump`
        // sees what is wanted (store then load on each side).
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Makes every record appended to this log so far durable: the next
    /// record appended starts a later flush, and a checkpoint can put its
    /// redo point there, past them (a checkpoint's redo point is the start
    /// of the flush holding its redo GSN).
    pub async fn flush_appended(self: &Arc<Self>) -> Result<()> {
        let end = self.shared.next_gsn();
        self.want(end);
        self.wait_durable(end).await
    }

    /// Waits until a checkpoint has moved this log's redo point to `lsn`
    /// or past, asking for checkpoints meanwhile (as many as it takes: a
    /// shard's floor moves with each). Fails if the log stops, or if no
    /// checkpoint can run any more ([`Wal::stop_checkpoints`]).
    pub(crate) async fn wait_redo_past(&self, lsn: u64) -> Result<()> {
        let look = || {
            if let Some(e) = self.poisoned() {
                return Some(Err(e));
            }
            if self.lock().redo >= lsn {
                return Some(Ok(()));
            }
            if let Some(e) = self.checkpoints_stopped_error("a record") {
                return Some(Err(e));
            }
            self.request_checkpoint();
            None
        };
        std::future::poll_fn(|cx| {
            if let Some(r) = look() {
                return Poll::Ready(r);
            }
            // Woken when a checkpoint frees log (or a reservation drops);
            // the second look catches a change made before registering.
            self.space_waiters.register(cx.waker());
            look().map_or(Poll::Pending, Poll::Ready)
        })
        .await
    }

    /// The error for `what` (a commit, a record) that needs a checkpoint
    /// to free the log, once none can run ([`Wal::stop_checkpoints`]).
    fn checkpoints_stopped_error(&self, what: &str) -> Option<Error> {
        let why = self
            .checkpoints_stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(Error::Poisoned(format!(
            "the log has no room for {what} and no checkpoint can free it: {why}"
        )))
    }

    /// The stream position just past the last record appended, flushed
    /// or not.
    pub fn appended_end(&self) -> u64 {
        let st = self.lock();
        st.end + st.pending.len() as u64
    }

    /// Stream bytes in use: appended since the last checkpoint's redo LSN.
    pub fn used(&self) -> u64 {
        let st = self.lock();
        st.end + st.pending.len() as u64 - st.redo
    }

    /// Admits a commit that may append up to `bytes` (its record and the
    /// page changes of its apply): waits (asking for a checkpoint) until
    /// the log in use, plus its commit records once more (what recovery
    /// would append again), plus every admitted commit's promise plus
    /// `bytes` fits in three quarters of the log. So however many commits
    /// run at once, the log never fills with records a checkpoint cannot get
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

    /// [`Wal::admit`] if the log has room now, else None (never waits: for
    /// a caller holding locks, which lets them go and calls `admit`).
    pub fn admit_now(&self, bytes: u64) -> Option<Result<LogReservation<'_>>> {
        self.try_admit(bytes.min(self.capacity / 4))
    }

    /// [`Wal::admit`] for a holder that owns the log handle (a write that
    /// is not a commit: `Tree::unlogged_btree()`, a tree's drop), whose
    /// page records would otherwise be appended with no bound and could
    /// fill the log past what a checkpoint can free: a checkpoint needs a
    /// flush, and a flush would need the space (found by `dana bench waf`:
    /// a bulk load into a 64 MiB log spun both workers forever).
    pub async fn admit_owned(self: Arc<Self>, bytes: u64) -> Result<OwnedLogReservation> {
        let held = self.admit(bytes).await?;
        let bytes = held.bytes;
        std::mem::forget(held);
        Ok(OwnedLogReservation { wal: self, bytes })
    }

    /// Gives back `bytes` of admitted log space and wakes the waiters.
    /// All of them: waking only as many as the room left admits (tried on
    /// 2026-11-25) can spend its wake-ups on a task that left the list's
    /// waiters without being woken there (woken by another source, then
    /// admitted), and leave the real waiters parked.
    fn release(&self, bytes: u64) {
        let prev = self.reserved.fetch_sub(bytes, Ordering::AcqRel);
        assert!(prev >= bytes, "log reservations released twice");
        self.space_waiters.wake_all();
    }

    /// One attempt of [`Wal::admit`]: None if the log has no room now.
    fn try_admit(&self, bytes: u64) -> Option<Result<LogReservation<'_>>> {
        let limit = self.capacity / 4 * 3;
        // Loops only when another commit changed `reserved` in between.
        loop {
            if let Some(e) = self.poisoned() {
                return Some(Err(e));
            }
            let (end, used, commits) = {
                let st = self.lock();
                let end = st.end + st.pending.len() as u64;
                (end, end - st.redo, st.commit_bytes)
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
            // The commit records in use count twice: after a crash,
            // recovery appends them again before a checkpoint can move the
            // redo LSN past them (`recovery::reapply`), and that must fit.
            if used + commits + cur + bytes > limit {
                // A commit the log itself is too full for asks for a
                // checkpoint. Not only past half the log: the limit counts
                // the commit records twice, so it can refuse while the
                // log in use is under the flush step's own trigger; with
                // nothing appended meanwhile no one else would ask, and
                // every committer would wait for good (a trial that raised
                // the flush step's trigger to half the log hung `dana
                // bench commit` so). Not when other commits' promises make
                // the difference: a checkpoint cannot free those, and
                // their release wakes this commit to look again.
                if used + commits + bytes > limit {
                    if let Some(e) = self.checkpoints_stopped_error("this commit") {
                        return Some(Err(e));
                    }
                    self.request_checkpoint();
                }
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
        let durable = self.durable_below();
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
        self.shared.durable_waiters.wake_all();
    }

    /// True if a flush of this log may be worth a look now: records wait,
    /// fewer than the most flushes allowed are in flight, and someone
    /// wants them (cheap: atomics only). A
    /// log whose records wait for another log is not: that log's flush
    /// completion pumps it (no worker polls meanwhile).
    pub(crate) fn wants_flush(&self) -> bool {
        let first = self.queued_from.load(Ordering::Acquire);
        first != u64::MAX
            && self.in_flight.load(Ordering::Acquire) < self.max_in_flight
            && !self.is_blocked()
            && (self.has_waiters.load(Ordering::Acquire)
                || self.shared.wanted[self.index].load(Ordering::Acquire) > first)
    }

    /// Records of this log wait for other logs to become durable.
    pub(crate) fn is_blocked(&self) -> bool {
        self.shared.blocked[self.index].load(Ordering::SeqCst)
    }

    /// How long until this log's async window asks for a flush (None:
    /// nothing waits for the window). While a flush is in flight, at least
    /// [`FLUSH_RECHECK`].
    pub(crate) fn due_in(&self) -> Option<Duration> {
        if self
            .growth
            .as_ref()
            .is_some_and(|g| g.blocked.load(Ordering::Acquire))
        {
            // A flush waits for the log file to grow: look again soon.
            return Some(Duration::from_millis(1));
        }
        if self.wants_flush() {
            return Some(Duration::ZERO);
        }
        let st = self.lock();
        let left = self.window.saturating_sub(st.since?.elapsed());
        if st.flushing.is_empty() {
            return Some(left);
        }
        // A flush is in flight: its completion pumps this log, but on the
        // worker that issued it, which need not be one that tends this
        // log and then keeps no deadline for it. So the window's end is
        // kept here too, no sooner than a millisecond while the flush
        // lasts (a worker sleeping with no deadline left an async commit
        // in memory for good: `tests/worker_logs.rs`).
        Some(left.max(FLUSH_RECHECK))
    }

    /// Starts a flush if one is needed and fewer than the most allowed are
    /// in flight. Runs on a worker (it queues I/O). Returns true if it
    /// started one.
    pub fn pump(&self) -> bool {
        if self.poisoned.load(Ordering::Acquire) || self.shared.poisoned.load(Ordering::Acquire) {
            return false;
        }
        let mut guard = self.lock();
        // The trigger's share of the log in use asks for a checkpoint, and
        // so does each share of it (the trigger over the shards) appended
        // since the last one began: continuous checkpointing writes one
        // shard's pages each time, so that the redo point keeps about the
        // trigger's share of the log behind the end without a burst of
        // writes. Unless one is running (it frees the log only when it
        // finishes; asking again would start a second one right after it).
        let end = guard.end + guard.pending.len() as u64;
        let trigger = checkpoint_trigger(self.capacity, self.shared.pages_whole);
        if !self.checkpoint_wanted.load(Ordering::Acquire)
            && !self.in_checkpoint.load(Ordering::Acquire)
            && (end - guard.redo > trigger
                || end - guard.last_begin > trigger / self.shared.shards() as u64)
        {
            drop(guard);
            self.request_checkpoint();
            guard = self.lock();
        }
        let st = &mut *guard;
        let Some(front) = st.queue.front() else {
            return false;
        };
        if st.flushing.len() >= self.max_in_flight {
            return false;
        }
        let need = self.has_waiters.load(Ordering::Acquire)
            || self.shared.wanted[self.index].load(Ordering::Acquire) > front.gsn
            || self.shared.blocked[self.index].load(Ordering::Acquire)
            || st.since.is_some_and(|t| t.elapsed() >= self.window);
        if !need {
            return false;
        }
        // The records whose dependencies are durable in every other log.
        let mut others = self.shared.others_durable_below(self.index);
        let (mut n, mut bytes, mut blocked_on) = flushable(&st.queue, others);
        if blocked_on != 0 {
            // Blocked: the completion of the flush of a log this waits for
            // pumps this one. Set the flag, then look again: the fences
            // here and in `flush_completed` make sure that a flush
            // completing meanwhile either sees the flag or is seen here
            // (else neither would pump, and nothing would wake this log).
            self.shared.blocked[self.index].store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            let now = self.shared.others_durable_below(self.index);
            if now != others {
                others = now;
                (n, bytes, blocked_on) = flushable(&st.queue, others);
            }
        }
        if blocked_on == 0 {
            self.shared.blocked[self.index].store(false, Ordering::Release);
        } else {
            self.shared.want_others(self.index, blocked_on);
        }
        if n == 0 {
            return false;
        }
        let start = st.end;
        let end = align_up(
            st.end + (bytes + record::FLUSH_MARKER_LEN) as u64,
            self.block,
        );
        self.grow_ahead(end);
        if !self.has_room(end) {
            // The log file has not grown that far yet: the flush waits
            // for the growth thread (due_in polls meanwhile), but not for
            // ever where every growth fails (a full file system): the
            // log then stops with `NoSpace`, as after a failed write.
            if let Some(g) = &self.growth {
                g.blocked.store(true, Ordering::Release);
                let since = *g
                    .blocked_since
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(Instant::now);
                if since.elapsed() >= LOG_GROWTH_STALL {
                    if let Some(what) = g.grower.recent_failure(LOG_GROWTH_RETRY) {
                        drop(guard);
                        self.poison_with(&Error::NoSpace(format!(
                            "the log file cannot grow to hold records no commit reserved \
                             room for (recovery's, a checkpoint's): {what}; free space on \
                             its file system and open the database again"
                        )));
                    }
                }
            }
            return false;
        }
        if let Some(g) = &self.growth {
            // The wait's start forgotten only after a wait (no lock per
            // flush).
            if g.blocked.swap(false, Ordering::AcqRel) {
                *g.blocked_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        if end - st.redo > self.capacity {
            // The records would overwrite log space the last checkpoint
            // still needs. Admission keeps a quarter of the log free for
            // operations in progress; getting here means it did not.
            let first = align_up(
                st.end + (front.len + record::FLUSH_MARKER_LEN) as u64,
                self.block,
            );
            if first - st.redo > self.capacity
                && self.in_checkpoint.load(Ordering::Acquire)
                && st.checkpoint_lsn < st.last_begin
            {
                // Not even the first record fits while a checkpoint runs
                // whose record here is not sealed yet: it cannot end (it
                // waits for this log to be durable, then for its own
                // record here), and only a checkpoint's end frees the log.
                // (Once its record is sealed, its end moves the redo point
                // soon: another log's finish may still be running; a
                // review's finding.)
                // Stopped with an error rather than spinning for ever (an
                // outside probe kept a database whose log was full to its
                // capacity, left so by checkpoints that spent its last
                // quarter, fixed since: every open hung in recovery's
                // last checkpoint). The log's records stay as they are;
                // an open of such a database fails the same way (this
                // build cannot repair it).
                let what = format!(
                    "log {} is full: {} bytes from its redo point, its capacity; the \
                     running checkpoint, which alone frees it, cannot end",
                    self.index,
                    st.end - st.redo
                );
                drop(guard);
                self.poison_with(&Error::Log(what));
                return false;
            }
            drop(guard);
            self.request_checkpoint();
            return false;
        }
        // Seal the records taken at their places in the stream.
        let first_gsn = front.gsn;
        let batch_max = st.queue.get(n - 1).map_or(0, |q| q.gsn);
        let batch_commits = st
            .queue
            .iter()
            .take(n)
            .filter(|q| q.kind == Queue::Commit)
            .map(|q| q.len as u64)
            .sum();
        st.batches.push_back((st.end, batch_max, batch_commits));
        let mut data = std::mem::take(&mut self.buffers().records);
        if n == st.queue.len() {
            std::mem::swap(&mut data, &mut st.pending);
        } else {
            data.extend_from_slice(&st.pending[..bytes]);
            st.pending.drain(..bytes);
        }
        let mut at = 0;
        for q in st.queue.drain(..n) {
            let lsn = st.end + at as u64;
            st.last_crc = record::seal(&mut data[at..at + q.len], lsn, st.last_crc);
            if q.kind == Queue::Checkpoint {
                st.checkpoint_lsn = lsn;
            }
            if st.redo_at == RedoAt::Watch(None) && q.gsn >= st.redo_gsn {
                st.redo_at = RedoAt::Watch(Some(lsn));
            }
            at += q.len;
        }
        st.end += bytes as u64;
        // The flush's last record names the LSN durable now: recovery tells
        // damage to durable records from a torn last flush with it.
        let durable = self.durable.load(Ordering::Acquire);
        let proven = if durable <= self.resumed_at {
            self.resumed_valid_end
        } else {
            durable
        };
        let mut marker = record::flush_marker(proven).into_unsealed();
        st.last_crc = record::seal(&mut marker, st.end, st.last_crc);
        data.extend_from_slice(&marker);
        st.end += marker.len() as u64;
        self.stats.records.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(marker.len() as u64, Ordering::Relaxed);
        let pad = (end - st.end) as usize;
        data.resize(data.len() + pad, 0);
        st.end = end;
        if st.queue.is_empty() {
            st.since = None;
        }
        let queued_from = st.queue.front().map_or(u64::MAX, |q| q.gsn);
        self.queued_from.store(queued_from, Ordering::Release);
        // Split at the file's wrap point.
        let mut pieces = Vec::new();
        let mut at = start;
        while at < end {
            let in_lap = at % self.capacity;
            let n = (end - at).min(self.capacity - in_lap);
            pieces.push((CONTROL_BYTES + in_lap, (at - start) as usize, n as usize));
            at += n;
        }
        let durable_writes = end - start <= self.write_through_max;
        let seq = st.next_flush;
        st.next_flush += 1;
        if !st.flushing.is_empty() {
            self.stats
                .overlapped_flushes
                .fetch_add(1, Ordering::Relaxed);
        }
        st.flushing.push_back(Flushing {
            seq,
            end,
            first_gsn,
            writes: pieces.len(),
            durable_writes,
            done: false,
        });
        self.in_flight.store(st.flushing.len(), Ordering::Release);
        drop(guard);
        self.stats.bytes.fetch_add(pad as u64, Ordering::Relaxed);
        let aligned = self.flush_buffer(&data);
        data.clear();
        let mut bufs = self.buffers();
        if data.capacity() <= KEEP_RECORDS_MAX {
            bufs.records = data;
        }
        let aligned = match aligned {
            Ok(a) => a,
            Err(e) => {
                self.poison_with(&e);
                return false;
            }
        };
        drop(bufs);
        for (offset, from, len) in pieces {
            let queued = aligned.lend(from, len).and_then(|buf| {
                let tag = RequestKind::Log.tag(request_id(self.index, seq, FLUSH_WRITE));
                let req = if durable_writes {
                    Request::write_durable(tag, offset, buf)
                } else {
                    Request::write(tag, offset, buf)
                }
                .placed(Placement::Log);
                sched::enqueue(self.device, req).map_err(|_| Error::WouldBlock)
            });
            if let Err(e) = queued {
                self.poison_with(&e);
                return false;
            }
        }
        let mut bufs = self.buffers();
        if bufs.aligned.len() <= self.max_in_flight {
            bufs.aligned.push(aligned);
        }
        true
    }

    fn buffers(&self) -> MutexGuard<'_, FlushBuffers> {
        self.flush_buffers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An aligned buffer holding `data`: an earlier flush's that no
    /// request holds any more and is large enough, else a new one.
    fn flush_buffer(&self, data: &[u8]) -> Result<ReusableBuf> {
        let kept = {
            let mut bufs = self.buffers();
            let free = bufs
                .aligned
                .iter_mut()
                .position(|b| b.len() >= data.len() && b.get_mut().is_some());
            free.map(|i| bufs.aligned.swap_remove(i))
        };
        let mut buf = match kept {
            Some(b) => b,
            None => ReusableBuf::new(
                data.len()
                    .max(FLUSH_BUFFER_MIN)
                    .next_multiple_of(control::BLOCK as usize),
                control::BLOCK as usize,
            )?,
        };
        let bytes = buf.get_mut().expect("a buffer no request holds");
        bytes[..data.len()].copy_from_slice(data);
        Ok(buf)
    }

    /// A completion of one of a flush's requests (`id`: the request id
    /// [`request_id`] gave it).
    pub(crate) fn flush_completed(&self, id: u64, c: Completion) {
        if let Err(e) = c.result {
            // The failed flush stays in `flushing`, so nothing moves the
            // durable point past it again: not another flush's completion
            // (ignored below once poisoned) and not an append, which moves
            // `unflushed` to its own record only while no flush is in
            // flight. The first version cleared the flushes here; an
            // append in the moment before the poison flag was set then
            // declared its record the first not durable, and a commit of
            // the failed flush was acknowledged (lost after the restart:
            // `tests/flushes_in_flight.rs`, about once in 10,000 rounds).
            self.poison_with(&e);
            return;
        }
        if self.poisoned.load(Ordering::Acquire) {
            // A flush failed before this one completed: nothing is durable
            // past the failed one.
            return;
        }
        let seq = (id >> REQUEST_SEQ_SHIFT) & REQUEST_SEQ_MASK;
        let mut st = self.lock();
        let Some(f) = st
            .flushing
            .iter_mut()
            .find(|f| f.seq & REQUEST_SEQ_MASK == seq)
        else {
            // Not a flush in flight (a control-plane bug: every completion
            // is of a flush this log started and has not retired).
            debug_assert!(false, "completion of flush {seq}, not in flight");
            return;
        };
        if id & 1 == FLUSH_WRITE {
            f.writes -= 1;
            if f.writes > 0 {
                return;
            }
            if !f.durable_writes {
                drop(st);
                let tag = RequestKind::Log.tag(request_id(self.index, seq, FLUSH_SYNC));
                if sched::enqueue(self.device, Request::flush(tag)).is_err() {
                    self.poison_with(&Error::WouldBlock);
                }
                return;
            }
        }
        // The fdatasync completed, or the last durable write: the flushed
        // range is durable; the durable end passes it once every flush
        // before it is durable too.
        f.done = true;
        let mut passed = 0;
        while st.flushing.front().is_some_and(|f| f.done) {
            let f = st.flushing.pop_front().expect("a front flush");
            self.durable.fetch_max(f.end, Ordering::AcqRel);
            passed += 1;
        }
        if passed == 0 {
            return;
        }
        self.stats.flushes.fetch_add(passed, Ordering::Relaxed);
        let first = match st.flushing.front() {
            Some(f) => f.first_gsn,
            None => st.queue.front().map_or(u64::MAX, |q| q.gsn),
        };
        self.shared.unflushed[self.index].store(first, Ordering::SeqCst);
        self.in_flight.store(st.flushing.len(), Ordering::Release);
        drop(st);
        // Pairs with the fence in `pump`: the caller (`LogSet`) reads the
        // other logs' blocked flags after this.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.wake_waiters(false);
        self.pump();
    }

    // ---- checkpoints ----------------------------------------------------

    /// True when a checkpoint should run: the flush step saw a share of the
    /// log ([`checkpoint_trigger`] over the checkpoint shards) appended
    /// since the last one began or the trigger's bytes of it in use, or a
    /// commit short of space asked (one atomic load: every worker's
    /// checkpoint step asks every round).
    pub fn checkpoint_due(&self) -> bool {
        self.checkpoint_wanted.load(Ordering::SeqCst)
    }

    /// Asks for a checkpoint (the checkpoint step starts one).
    pub fn request_checkpoint(&self) {
        // SeqCst: see the checkpoint's busy flag (`checkpoint::Busy`).
        self.checkpoint_wanted.store(true, Ordering::SeqCst);
    }

    /// The GSN of this log's oldest commit being applied, if any.
    pub(crate) fn oldest_applying_now(&self) -> Option<u64> {
        Self::oldest_applying(&self.lock())
    }

    /// True if the commit record at `gsn` is this log's and still being
    /// applied.
    pub(crate) fn is_applying(&self, gsn: u64) -> bool {
        self.lock().applying.contains(&gsn)
    }

    /// The oldest GSN of a commit this log is still applying, if any.
    fn oldest_applying(st: &State) -> Option<u64> {
        st.applying.first().copied()
    }

    /// Starts a checkpoint in this log, whose state `st` the caller holds
    /// ([`LogSet::begin_checkpoint`] holds every log's while it picks the
    /// checkpoint's redo GSN `g` and moves the full-image bound): redo
    /// will start at the first flush that holds a record with a GSN at or
    /// past `g`, or, if none is sealed yet, at the first record sealed
    /// from now on with such a GSN. Every log's redo covers every record
    /// from `g` on, so recovery re-applies the same suffix of the commits
    /// of all logs (re-applying a commit without a later one on the same
    /// key would undo the later one).
    /// Ends a checkpoint that failed before its control block: the redo
    /// point stays the last one's, and another checkpoint may begin (the
    /// log asks again if it is due).
    pub(crate) fn abandon_checkpoint(&self) {
        self.lock().redo_at = RedoAt::Idle;
        self.in_checkpoint.store(false, Ordering::Release);
        self.space_waiters.wake_all();
    }

    fn begin_checkpoint_in(&self, st: &mut State, g: u64) {
        self.checkpoint_wanted.store(false, Ordering::Release);
        self.in_checkpoint.store(true, Ordering::Release);
        st.last_begin = st.end + st.pending.len() as u64;
        st.redo_gsn = g;
        st.redo_at = match st.batches.iter().find(|b| b.1 >= g) {
            Some(&(start, _, _)) => RedoAt::Fixed(start),
            None => RedoAt::Watch(None),
        };
    }

    /// The running checkpoint's redo LSN in this log, once its record is
    /// sealed (the record's GSN is past the bound, so the watch found one).
    /// Never before the last checkpoint's: a watched redo LSN lies inside
    /// a flush, and the next checkpoint, with the same redo GSN, finds
    /// that flush's start; the records there from before the last redo
    /// LSN have lower GSNs (a log's GSNs rise along it), and its finish
    /// trims them (a power-cut test found a control block naming trimmed
    /// log once the checkpoint stamp made watched redo points common).
    fn checkpoint_redo(&self) -> u64 {
        let st = self.lock();
        match st.redo_at {
            RedoAt::Fixed(lsn) | RedoAt::Watch(Some(lsn)) => lsn.max(st.redo),
            // Not reached; the previous redo point is always safe.
            RedoAt::Idle | RedoAt::Watch(None) => {
                debug_assert!(false, "a checkpoint finished before its record was sealed");
                st.redo
            }
        }
    }

    /// Ends a checkpoint whose record is durable: writes the control block
    /// naming it and the redo LSN, syncs it, and frees the log before the
    /// redo LSN.
    pub async fn finish_checkpoint(&self) -> Result<()> {
        if let Some(e) = self.poisoned() {
            // A stopped log writes nothing more, not even a control block
            // whose checkpoint record is durable.
            return Err(e);
        }
        let redo = self.checkpoint_redo();
        let (lsn, redo_gsn) = {
            let st = self.lock();
            (st.checkpoint_lsn, st.redo_gsn)
        };
        let turn = self.control.turn().await;
        let last = turn.last();
        let block = control::Control {
            seq: last.seq + 1,
            checkpoint: lsn,
            redo,
            capacity: self.capacity,
            block: self.block,
            log_id: self.log_id,
            next_gsn: self.shared.next_gsn(),
            index: self.index as u32,
            count: self.shared.unflushed.len() as u32,
            redo_gsn,
            stream_bytes: self.growth.as_ref().map_or(self.capacity, |g| {
                g.allocated
                    .load(Ordering::Acquire)
                    .min(self.capacity)
                    .max(last.stream_bytes)
            }),
        };
        let bytes = block.encode();
        let mut buf = AlignedBuf::new(control::BLOCK as usize, control::BLOCK as usize)?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        self.op(Request::write(0, block.offset(), IoBuf::owned(buf)))
            .await?;
        self.op(Request::flush(0)).await?;
        turn.written(block);
        drop(turn);
        let mut st = self.lock();
        // The stream before the previous checkpoint's redo LSN is dead
        // now: neither control block names it (this one replaced the block
        // that did). Trimmed one checkpoint late, so the other block's log
        // stays whole for a recovery that finds this one damaged; blocks
        // a flush reused since are skipped, and the lock keeps a new flush
        // from being issued until the trim is done.
        let old_redo = st.redo;
        let from = st.trimmed_to.max(st.end.saturating_sub(self.capacity));
        self.trim_stream(from, old_redo);
        st.trimmed_to = st.trimmed_to.max(old_redo);
        st.redo = st.redo.max(redo);
        st.redo_at = RedoAt::Idle;
        // Flushes wholly before the redo LSN are no longer needed.
        while st.batches.get(1).is_some_and(|b| b.0 <= st.redo) {
            if let Some((_, _, commits)) = st.batches.pop_front() {
                st.commit_bytes -= commits;
            }
        }
        drop(st);
        self.in_checkpoint.store(false, Ordering::Release);
        self.space_waiters.wake_all();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Trims the whole 4 KiB blocks of the stream `[from, to)` on a log
    /// device that takes discards cheaply. Advice: a failure is counted,
    /// never an error (the blocks stay as they are, and nothing reads
    /// them). Blocking: one call per lap piece, under the log's lock (a
    /// block device's TRIM of a checkpoint's stretch holds commits' appends
    /// that long).
    fn trim_stream(&self, from: u64, to: u64) {
        const UNIT: u64 = 4096;
        let Some(t) = &self.trim else { return };
        let (from, to) = (from.div_ceil(UNIT) * UNIT, to / UNIT * UNIT);
        // At most one lap: anything older was overwritten since.
        let from = from.max(to.saturating_sub(self.capacity));
        let mut at = from;
        while at < to {
            let in_lap = at % self.capacity;
            let n = (to - at).min(self.capacity - in_lap);
            match t.discard(CONTROL_BYTES + in_lap, n) {
                Ok(()) => self.stats.trimmed_bytes.fetch_add(n, Ordering::Relaxed),
                Err(_) => self.stats.trim_failures.fetch_add(1, Ordering::Relaxed),
            };
            at += n;
        }
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

/// Resolves once a log is durable below a GSN.
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
        if wal.durable_below() >= self.end {
            return Poll::Ready(Ok(()));
        }
        {
            let mut w = wal.waiters.lock().unwrap_or_else(|e| e.into_inner());
            w.push((self.end, cx.waker().clone()));
            wal.has_waiters.store(true, Ordering::Release);
        }
        // A flush may have completed between the check and the push.
        if wal.durable_below() >= self.end || wal.poisoned().is_some() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::record::{self, Write};

    fn logs(n: usize) -> Arc<LogSet> {
        sharded_logs(n, 1)
    }

    fn sharded_logs(n: usize, shards: usize) -> Arc<LogSet> {
        logs_with(n, shards, false)
    }

    /// `n` logs of `shards` checkpoint shards, on data devices that write
    /// pages whole if `pages_whole`.
    fn logs_with(n: usize, shards: usize, pages_whole: bool) -> Arc<LogSet> {
        let shared = Shared::new(n, 1, shards, pages_whole);
        let logs = (0..n)
            .map(|i| {
                Wal::new(
                    i,
                    shared.clone(),
                    i,
                    FlushPolicy {
                        block: 512,
                        window: Duration::from_secs(3600),
                        write_through_max: 0,
                        max_in_flight: 1,
                    },
                    Resume {
                        end: 512,
                        last_crc: 0,
                        control: control::Control {
                            seq: 0,
                            checkpoint: 0,
                            redo: 512,
                            capacity: 1 << 20,
                            block: 512,
                            log_id: 1,
                            next_gsn: 1,
                            index: i as u32,
                            count: n as u32,
                            redo_gsn: 0,
                            stream_bytes: 0,
                        },
                        valid_end: 512,
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        LogSet::new(logs, shared, n).unwrap()
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

    /// What a future appended while polled is counted as its own; what
    /// was appended between its polls (other tasks, while it waited) is
    /// not. Counted from the log's end, a small commit's apply took the
    /// other committers' records as its own and went on from a record of
    /// its own (`txn::apply_logged`).
    #[test]
    fn own_appends_counts_what_the_future_appended_not_what_others_did() {
        let set = logs(1);
        let w = set.logs()[0].clone();
        let mine = commit().len() as u64;
        let mut own = OwnAppends::default();
        {
            let w2 = w.clone();
            let f = own_appends(
                async move {
                    w2.append_commit(commit(), 0).unwrap();
                    crate::sched::yield_now().await;
                    w2.append_commit(commit(), 0).unwrap();
                },
                &mut own,
            );
            let mut f = std::pin::pin!(f);
            let mut cx = Context::from_waker(Waker::noop());
            assert!(f.as_mut().poll(&mut cx).is_pending());
            // Another task's records, appended while the future waits.
            for _ in 0..50 {
                w.append(vec![7u8; 200], 0).unwrap();
            }
            assert!(f.as_mut().poll(&mut cx).is_ready());
        }
        assert_eq!(own.bytes, 2 * mine, "the future's two records, no more");
    }

    /// A checkpoint is started only if it would raise a redo floor of a
    /// shard it holds. While a commit is being applied whose GSN every
    /// shard's floor has reached, none would: each would only have spent
    /// log space, and back-to-back ones behind a long apply filled a log
    /// until no checkpoint could be flushed (`dana crashtest
    /// --worker-logs --tasks 64`). Once the commit is applied, they would
    /// again.
    #[test]
    fn a_checkpoint_that_would_raise_no_floor_is_not_started() {
        let set = sharded_logs(2, 4);
        let shard = |s| CheckpointScope::Shard(s);
        let (first, _) = set.logs()[0].append_commit(commit(), 0).unwrap();
        set.logs()[0].applied(first);
        assert!(
            set.checkpoint_would_move(shard(0)),
            "a floor below the end rises"
        );
        let (held, _) = set.logs()[1].append_commit(commit(), 0).unwrap();
        set.logs()[0].append_commit(commit(), 0).unwrap();
        set.logs()[0].applied(held + 1);
        for s in 0..4 {
            assert!(
                set.checkpoint_would_move(shard(s)),
                "shard {s}'s floor is below the commit"
            );
            set.shared.begin_full_images(shard(s), Some(held));
        }
        for s in 0..4 {
            assert!(
                !set.checkpoint_would_move(shard(s)),
                "shard {s}: the commit being applied holds the floor"
            );
        }
        assert!(!set.checkpoint_would_move(CheckpointScope::All));
        assert_eq!(set.local().stats().checkpoints_skipped, 5);
        set.logs()[1].applied(held);
        for s in 0..4 {
            assert!(
                set.checkpoint_would_move(shard(s)),
                "shard {s}, once applied"
            );
        }
    }

    /// A log full to its capacity cannot flush even its first record
    /// while a checkpoint runs: that checkpoint can never end (it waits
    /// for the log to be durable, then for its own record there), and
    /// only a checkpoint's end frees the log. The log stops with an error
    /// naming this; it spun for ever asking for a checkpoint (an outside
    /// probe's database, whose every open hung in recovery's last
    /// checkpoint). With no checkpoint running, or one whose record here
    /// is sealed, a full log only waits.
    #[test]
    fn a_full_log_under_a_running_checkpoint_stops_with_an_error() {
        let set = logs(1);
        let w = &set.logs()[0];
        let (g, end) = w.append_commit(commit(), 0).unwrap();
        w.applied(g);
        {
            let mut st = w.lock();
            // Everything from the redo point on was flushed: the log full.
            st.end = st.redo + w.capacity();
        }
        w.want(end);
        assert!(!w.pump(), "nothing fits");
        assert!(
            w.poisoned().is_none(),
            "no checkpoint waits: it only asks for one"
        );
        assert!(w.checkpoint_due());
        set.begin_checkpoint(CheckpointScope::All);
        {
            // Its record sealed here: its end (after another log's,
            // perhaps) moves the redo point soon.
            let mut st = w.lock();
            st.checkpoint_lsn = st.last_begin;
        }
        assert!(!w.pump());
        assert!(w.poisoned().is_none(), "the checkpoint's record is sealed");
        w.lock().checkpoint_lsn = 0;
        assert!(!w.pump());
        match set.poisoned() {
            Some(Error::Poisoned(what)) => assert!(what.contains("log 0 is full"), "{what}"),
            other => panic!("{other:?}"),
        }
    }

    /// A commit that finds no room in the log parks (no spinning) and is
    /// woken when a reservation drops; it then gets in.
    #[test]
    fn admit_parks_until_a_reservation_drops() {
        let set = logs(1);
        let w = &set.logs()[0];
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
        assert!(
            !w.checkpoint_due(),
            "promises alone refused it: a checkpoint cannot free them"
        );
        drop(held);
        assert!(counter.0.load(Ordering::Relaxed) >= 1, "woken");
        let admitted = matches!(f.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(_)));
        assert!(admitted, "room after the drop");
    }

    /// A commit the log itself is too full for asks for a checkpoint, also
    /// while the log in use is under half (where the admission asked
    /// before): commit records count twice, so the log can refuse at ~3/8
    /// in use. Without the request nobody asks and every committer waits
    /// for good (a trial trigger at half the log hung `dana bench commit`
    /// so). The test clears what the appends asked and never pumps, so
    /// only the refusal can ask.
    #[test]
    fn a_commit_the_log_is_too_full_for_asks_for_a_checkpoint() {
        let set = logs(1);
        let w = &set.logs()[0];
        let cap = w.capacity();
        let big = || {
            let wr = Write::new(1, b"k".to_vec(), Some(vec![7u8; 4000]));
            record::commit(&[wr]).into_unsealed()
        };
        while w.used() < cap * 7 / 16 {
            w.append_commit(big(), 0).unwrap();
        }
        assert!(w.used() <= cap / 2, "under half the log");
        // Whatever the appends asked is forgotten: the refusal must ask.
        w.checkpoint_wanted.store(false, Ordering::SeqCst);
        let noop = std::task::Waker::noop();
        let mut f = std::pin::pin!(w.admit(64));
        assert!(f
            .as_mut()
            .poll(&mut std::task::Context::from_waker(noop))
            .is_pending());
        assert!(w.checkpoint_due(), "the refusal asked for a checkpoint");
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
        let set = logs(2);
        let (a, b) = (&set.logs()[0], &set.logs()[1]);
        let (slow, _) = a.append_commit(commit(), 0).unwrap();
        let (_, end) = b.append_commit(commit(), 0).unwrap();
        b.applied(end - 1);
        set.begin_checkpoint(CheckpointScope::All);
        for l in [a, b] {
            let st = l.lock();
            assert_eq!(
                (st.redo_at, st.redo_gsn),
                (RedoAt::Watch(None), slow),
                "every log's redo waits for the slow commit's GSN: recovery re-applies one \
                 suffix of the commits of all logs"
            );
        }
        // Once a flush holding records from that GSN on is sealed, it pins
        // its log's redo LSN.
        a.lock().batches.push_back((4096, slow, 0));
        b.lock().batches.push_back((2048, slow - 1, 0));
        set.begin_checkpoint(CheckpointScope::All);
        assert_eq!(a.lock().redo_at, RedoAt::Fixed(4096));
        let st = b.lock();
        assert_eq!(
            (st.redo_at, st.redo_gsn),
            (RedoAt::Watch(None), slow),
            "log 1's sealed flush holds only older records"
        );
        drop(st);
        assert!(
            set.full_image_below(7) >= end,
            "pages changed up to the newest GSN ({end}) must log a full image at their next \
             change, but only those below {} do",
            set.full_image_below(7)
        );
    }

    /// A checkpoint of one shard moves that shard's full-image bound only,
    /// and its redo GSN is the oldest bound of any shard: the pages of the
    /// other shards may hold changes since their own bounds logged as
    /// differences, which recovery must read from there.
    #[test]
    fn a_shard_checkpoint_moves_its_bound_and_redoes_from_the_oldest() {
        let set = sharded_logs(1, 4);
        let l = &set.logs()[0];
        let start = set.full_image_below(0);
        let advance = || {
            let (g, _) = l.append_commit(commit(), 0).unwrap();
            l.applied(g);
        };
        advance();
        let (b2, _) = set.begin_checkpoint(CheckpointScope::Shard(2));
        assert!(b2 > start);
        assert_eq!(set.full_image_below(6), b2, "page 6 is in shard 2");
        assert_eq!(
            set.full_image_below(5),
            start,
            "page 5 (shard 1) keeps its bound"
        );
        assert_eq!(
            l.lock().redo_gsn,
            start,
            "shards 0, 1 and 3 are still at the start"
        );
        for s in [0, 1, 3] {
            advance();
            set.begin_checkpoint(CheckpointScope::Shard(s));
        }
        assert_eq!(
            l.lock().redo_gsn,
            b2,
            "every shard checkpointed once: the oldest bound is shard 2's"
        );
        assert!(CheckpointScope::Shard(1).holds(9, 4) && !CheckpointScope::Shard(1).holds(10, 4));
    }

    /// A checkpoint that fails after it began (its write-back or its
    /// record) puts the redo floors back: left moved, the next checkpoint
    /// of another shard named a redo GSN past a commit whose pages the
    /// failed one never wrote, and a crash then lost it (a review's
    /// finding).
    #[test]
    fn a_failed_checkpoint_leaves_the_redo_point_where_it_was() {
        let set = sharded_logs(1, 8);
        let l = &set.logs()[0];
        let (c, _) = l.append_commit(commit(), 0).unwrap();
        l.applied(c);
        let floors = set.redo_floors();
        set.begin_checkpoint(CheckpointScope::All);
        // Its write-back fails: abandoned.
        set.abandon_checkpoint(&floors);
        assert!(!l.in_checkpoint.load(Ordering::Acquire));
        for _ in 0..3 {
            let (g, _) = l.append_commit(commit(), 0).unwrap();
            l.applied(g);
        }
        let (_, redo) = set.begin_checkpoint(CheckpointScope::Shard(1));
        assert!(
            redo <= c,
            "redo GSN {redo} past commit {c}, whose pages no checkpoint wrote"
        );
    }

    /// A commit still being applied when its shard's checkpoint began may
    /// have changed a page of that shard after the checkpoint's
    /// write-back passed it, in no page record: the redo GSN stays at or
    /// before that commit until the shard is checkpointed again, however
    /// many other shards are checkpointed after the commit is applied.
    /// (With the redo GSN taken as the oldest shard bound alone, the
    /// second round below moved it past the commit, and a crash would
    /// lose its change.)
    #[test]
    fn a_commit_applying_when_its_shard_was_checkpointed_stays_redone_until_the_next_round() {
        let set = sharded_logs(1, 2);
        let l = &set.logs()[0];
        let (slow, _) = l.append_commit(commit(), 0).unwrap();
        set.begin_checkpoint(CheckpointScope::Shard(0));
        l.applied(slow);
        for _ in 0..3 {
            let (g, _) = l.append_commit(commit(), 0).unwrap();
            l.applied(g);
        }
        set.begin_checkpoint(CheckpointScope::Shard(1));
        assert!(
            l.lock().redo_gsn <= slow,
            "shard 0's pages may lack the commit {slow}: recovery must re-apply it"
        );
        set.begin_checkpoint(CheckpointScope::Shard(0));
        assert!(
            l.lock().redo_gsn > slow,
            "both shards written back since it was applied"
        );
    }

    /// A page record encoded against the full-image bounds before a
    /// checkpoint began comes back when appended after: its differences
    /// would be the first records of their pages past the checkpoint's
    /// redo point, and a torn write-back could not be rebuilt from them.
    /// Encoded again whole, it is appended.
    #[test]
    fn a_record_encoded_before_a_checkpoint_began_is_encoded_again_whole() {
        let set = logs(1);
        let l = &set.logs()[0];
        let mut before = vec![0u8; 4096];
        page::init_page(&mut before, 3, page::PageType::Leaf);
        page::set_page_lsn(&mut before, set.next_gsn());
        let mut after = before.clone();
        after[100] = 7;
        let change = [PageChange {
            pid: 3,
            before: Some(&before),
            after: &after,
            fresh: false,
            cut: None,
        }];
        let mut b = record::RecordBuilder::new(record::Kind::Pages);
        let put = l.put_pages(&mut b, &change, false);
        assert_eq!((put.entries, put.images), (1, 0), "a difference");
        let (g, _) = l.append_commit(commit(), 0).unwrap();
        l.applied(g);
        set.begin_checkpoint(CheckpointScope::All);
        let stale = l
            .append_checked(b.into_unsealed(), Queue::Other, 0, put.epoch)
            .unwrap();
        assert!(stale.is_err(), "the bounds moved: the record comes back");
        let mut b = record::RecordBuilder::new(record::Kind::Pages);
        let put = l.put_pages(&mut b, &change, false);
        assert_eq!(
            (put.entries, put.images),
            (1, 1),
            "now the page's first change since"
        );
        assert!(l
            .append_checked(b.into_unsealed(), Queue::Other, 0, put.epoch)
            .unwrap()
            .is_ok());
        // Through the log set: appended, as a full image.
        set.begin_checkpoint(CheckpointScope::All);
        let images = l.stats().images;
        let mut after2 = after.clone();
        page::set_page_lsn(&mut after2, set.next_gsn() - 1);
        after2[200] = 9;
        let change = [PageChange {
            pid: 3,
            before: Some(&after),
            after: &after2,
            fresh: false,
            cut: None,
        }];
        assert!(
            crate::buffer::page_log::PageLog::log_changes(&*set, &change)
                .unwrap()
                .is_some()
        );
        assert_eq!(l.stats().images, images + 1);
    }

    /// With flushes in flight at once, one that completes before an
    /// earlier one moves nothing: the durable end (and the GSN below
    /// which the log is durable) passes it only with the earlier one.
    #[test]
    fn the_durable_end_moves_only_over_a_prefix_of_completed_flushes() {
        let set = logs(1);
        let l = &set.logs()[0];
        let flushing = |seq, end, first_gsn| Flushing {
            seq,
            end,
            first_gsn,
            writes: 1,
            durable_writes: true,
            done: false,
        };
        {
            let mut st = l.lock();
            st.flushing.push_back(flushing(7, 1024, 5));
            st.flushing.push_back(flushing(8, 2048, 9));
            st.flushing.push_back(flushing(9, 2560, 12));
            l.in_flight.store(3, Ordering::Release);
        }
        l.shared.unflushed[0].store(5, Ordering::Release);
        let done = |seq| {
            l.flush_completed(
                request_id(0, seq, FLUSH_WRITE),
                Completion {
                    tag: 0,
                    op: crate::OpKind::Write,
                    offset: 0,
                    buf: None,
                    result: Ok(512),
                },
            )
        };
        done(8);
        assert_eq!(
            l.durable.load(Ordering::Acquire),
            512,
            "flush 7 is in flight"
        );
        assert_eq!(l.durable_below(), 5);
        assert_eq!(l.in_flight.load(Ordering::Acquire), 3);
        done(7);
        assert_eq!(
            l.durable.load(Ordering::Acquire),
            2048,
            "7 and 8 are durable"
        );
        assert_eq!(l.durable_below(), 12, "flush 9 holds GSN 12 on");
        assert_eq!(l.in_flight.load(Ordering::Acquire), 1);
        assert_eq!(l.stats().flushes, 2);
        done(9);
        assert_eq!(l.durable.load(Ordering::Acquire), 2560);
        assert_eq!(l.durable_below(), u64::MAX, "nothing waits");
        assert_eq!(l.in_flight.load(Ordering::Acquire), 0);
    }

    /// A flush that fails holds the durable point where it was for good:
    /// neither a later flush's completion nor an append moves it past the
    /// failed flush's records. (The first version cleared the flushes in
    /// flight at a failure; an append that had passed its poison check
    /// then saw no flush in flight and declared its own record the first
    /// not durable, and a commit of the failed flush was acknowledged:
    /// `tests/flushes_in_flight.rs` lost one about once in 10,000 rounds.)
    #[test]
    fn a_failed_flush_holds_the_durable_point_for_good() {
        let set = logs(1);
        let l = &set.logs()[0];
        let flushing = |seq, end, first_gsn| Flushing {
            seq,
            end,
            first_gsn,
            writes: 1,
            durable_writes: true,
            done: false,
        };
        let (first, _) = l.append(commit(), 0).unwrap();
        {
            let mut st = l.lock();
            st.queue.clear();
            st.pending.clear();
            st.flushing.push_back(flushing(7, 1024, first));
            st.flushing.push_back(flushing(8, 2048, first + 1));
            l.in_flight.store(2, Ordering::Release);
        }
        l.shared.unflushed[0].store(first, Ordering::Release);
        let complete = |seq, result: Result<usize>| {
            l.flush_completed(
                request_id(0, seq, FLUSH_WRITE),
                Completion {
                    tag: 0,
                    op: crate::OpKind::Write,
                    offset: 0,
                    buf: None,
                    result,
                },
            )
        };
        complete(
            7,
            Err(Error::io(crate::OpKind::Write, 0, 0, 512, libc::EIO)),
        );
        assert!(l.poisoned().is_some());
        complete(8, Ok(512));
        assert_eq!(l.durable_below(), first, "a later flush moved it");
        // An append that passed its poison check before the failure.
        l.poisoned.store(false, Ordering::Release);
        l.shared.poisoned.store(false, Ordering::Release);
        l.append(commit(), 0).unwrap();
        assert_eq!(l.durable_below(), first, "an append moved it");
    }

    #[test]
    fn a_request_id_names_its_log_and_flush() {
        for (index, seq) in [(0, 0), (63, 5), (17, REQUEST_SEQ_MASK + 3)] {
            for what in [FLUSH_WRITE, FLUSH_SYNC] {
                let id = request_id(index, seq, what);
                assert_eq!(log_of_request(id), index);
                assert_eq!(id & 1, what);
                assert_eq!(
                    (id >> REQUEST_SEQ_SHIFT) & REQUEST_SEQ_MASK,
                    seq & REQUEST_SEQ_MASK
                );
                assert!(id < 1 << 60);
            }
        }
    }

    /// A record that depends on another log's records not yet durable is
    /// not flushed, nor is anything after it; records before it are.
    #[test]
    fn a_flush_stops_at_a_record_whose_dependency_is_not_durable() {
        let q = |gsn, dep| Queued {
            len: 64,
            gsn,
            dep,
            kind: Queue::Other,
        };
        let queue: VecDeque<Queued> = [q(10, 0), q(12, 11), q(14, 0)].into_iter().collect();
        assert_eq!(
            flushable(&queue, 11),
            (1, 64, 11),
            "GSN 11 is not durable yet"
        );
        assert_eq!(
            flushable(&queue, 12),
            (3, 192, 0),
            "every log is durable below 12"
        );
        assert_eq!(
            flushable(&queue, u64::MAX),
            (3, 192, 0),
            "the other logs are idle"
        );
    }

    /// The set's durable point never moves backwards and never passes a
    /// record not yet durable, while idle logs take GSNs and another
    /// thread reads the point: a log publishes a bound before it takes a
    /// GSN, the reader reads the next GSN before the bounds, and the set
    /// keeps the largest point it returned. (The first version published
    /// after taking, and read the next GSN after the bounds: a read
    /// between the two counted the new record as durable, and the next
    /// read did not.) Each writer's record is made durable at once, as a
    /// flush's completion does. With one writer, the GSN it will take is
    /// known before it takes it, so the reader also checks that the point
    /// never passes it; with two, only that the point never moves back.
    /// (The race the set's floor covers, a whole flush of another log
    /// between an idle log's two loads, is too narrow for this test: it
    /// passes without the floor.)
    #[test]
    fn the_durable_point_of_several_logs_never_moves_backwards() {
        for writers in [1, 2] {
            durable_point_under(writers, 100_000);
        }
    }

    fn durable_point_under(writers: usize, rounds: usize) {
        let set = logs(3);
        let finished = AtomicU64::new(0);
        // Writer 0's record not yet durable, or at or above the GSN it is
        // about to take (u64::MAX: none). Cleared before the record is
        // durable, so a reader that sees it set knows the record is not.
        let pending = AtomicU64::new(u64::MAX);
        std::thread::scope(|s| {
            for i in 0..writers {
                let (set, finished, pending) = (&set, &finished, &pending);
                s.spawn(move || {
                    let w = &set.logs()[i];
                    for _ in 0..rounds {
                        if i == 0 {
                            pending.store(set.shared.next_gsn(), Ordering::SeqCst);
                        }
                        w.append(commit(), 0).unwrap();
                        let mut st = w.lock();
                        st.queue.clear();
                        st.pending.clear();
                        if i == 0 {
                            pending.store(u64::MAX, Ordering::SeqCst);
                        }
                        // As a flush's completion: every record is durable.
                        set.shared.unflushed[i].store(u64::MAX, Ordering::SeqCst);
                    }
                    finished.fetch_add(1, Ordering::SeqCst);
                });
            }
            let mut last = 0;
            loop {
                let done = finished.load(Ordering::SeqCst) == writers as u64;
                let now = set.shared.durable_below();
                assert!(now >= last, "durable point moved from {last} to {now}");
                last = now;
                let not_durable = pending.load(Ordering::SeqCst);
                if writers == 1 {
                    // Set after the point was read: the record was not
                    // durable then, and its GSN is at least this.
                    assert!(
                        now <= not_durable,
                        "durable point {now} passed record {not_durable}, not durable"
                    );
                }
                if done {
                    break;
                }
            }
        });
    }

    /// The checkpoint trigger: 3/8 of the log, a quarter where pages are
    /// written whole (the log then nearly all commit records, which
    /// admission counts twice).
    #[test]
    fn the_checkpoint_trigger_keeps_a_quarter_of_the_log_for_admission() {
        let cap = 1 << 20;
        assert_eq!(checkpoint_trigger(cap, false), cap / 8 * 3);
        assert_eq!(checkpoint_trigger(cap, true), cap / 4);
    }

    /// A log 5/16 full of commit records on devices that write pages whole
    /// asks for a checkpoint (counted twice, its commits near admission's
    /// limit of three quarters); in place, where torn-page images fill the
    /// log, the same log does not (under 3/8).
    #[test]
    fn a_log_of_commit_records_asks_for_a_checkpoint_sooner() {
        let big = || {
            let wr = Write::new(1, b"k".to_vec(), Some(vec![7u8; 4000]));
            record::commit(&[wr]).into_unsealed()
        };
        for pages_whole in [true, false] {
            let set = logs_with(1, 1, pages_whole);
            let w = &set.logs()[0];
            let cap = w.capacity();
            while w.used() < cap * 5 / 16 {
                w.append_commit(big(), 0).unwrap();
            }
            assert!(w.used() < cap / 8 * 3);
            w.checkpoint_wanted.store(false, Ordering::SeqCst);
            w.pump();
            assert_eq!(
                w.checkpoint_due(),
                pages_whole,
                "pages whole: {pages_whole}"
            );
        }
    }

    /// Appending to one log makes a dependency on another log's record not
    /// yet durable; one on a durable record, or on the log's own, is none.
    #[test]
    fn dependencies_are_kept_only_on_other_logs_records_not_yet_durable() {
        let set = logs(2);
        let (a, b) = (&set.logs()[0], &set.logs()[1]);
        let (ga, _) = a.append(commit(), 0).unwrap();
        // b depends on a's record, which is not durable: kept.
        let (gb, _) = b.append(commit(), ga).unwrap();
        assert_eq!(b.lock().queue.back().unwrap().dep, ga);
        assert!(
            set.shared.wanted[0].load(Ordering::Acquire) > ga,
            "log 0 is asked to flush what log 1 waits for"
        );
        // a depends on its own record and on b's: b's is not durable.
        a.append(commit(), gb).unwrap();
        assert_eq!(a.lock().queue.back().unwrap().dep, gb);
        // Once log 1 is durable past gb, a dependency below it is none.
        set.shared.unflushed[1].store(u64::MAX, Ordering::Release);
        a.append(commit(), gb).unwrap();
        assert_eq!(a.lock().queue.back().unwrap().dep, 0);
        assert_eq!(set.durable_below(), ga, "log 0 holds the oldest record");
    }
}
