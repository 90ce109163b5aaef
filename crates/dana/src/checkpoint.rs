//! Checkpoints: what one does, one at a time, and the system task that
//! starts one when the log asks.
//!
//! Owns: the order of a checkpoint (full images from the log end, the
//! data files' checkpoint stamp, write back, sync, record, control block), the flag that keeps checkpoints
//! one at a time, and [`Checkpointer`], the system task every worker
//! steps, which checkpoints continuously: one shard of the pages (page
//! id modulo [`crate::Options::checkpoint_shards`]) each time, round
//! robin (Haubenschild et al., SIGMOD 2020), so the redo point follows
//! the log end without a burst that writes every dirty page at once.
//! Never: decides when one is due (the log does: a share of it appended
//! since the last one began, [`crate::wal::checkpoint_trigger`] of it in
//! use, or a commit short of space; the starter only declines one that
//! would raise no redo floor) or blocks a worker (a checkpoint runs as a task; the step only
//! starts it).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::buffer::alloc::META_PAGE;
use crate::buffer::BufferPool;
use crate::sched::{self, SystemTask};
use crate::wal::record;
use crate::wal::{CheckpointScope, LogSet};
use crate::{Error, Result};

/// A checkpoint of `scope`: every page of it dirty when it starts is
/// written back (at the pace of write-back, after its records are durable
/// in every log), the data devices are synced, each log's checkpoint
/// record is made durable and its control block names it. Recovery then
/// starts each log at its redo LSN: for a shard, where the shard
/// checkpointed longest ago began (see `LogSet::begin_checkpoint`). (A
/// crash between two logs' control blocks leaves some logs at the
/// previous checkpoint: they are scanned from further back, and recovery
/// redoes their records only from the newest redo GSN any block names,
/// `wal::recover`; redoing their older page records once brought old full
/// images back over large values.)
pub(crate) async fn checkpoint(
    pool: &BufferPool,
    wal: &Arc<LogSet>,
    scope: CheckpointScope,
) -> Result<()> {
    // Checkpoints run one at a time: nothing else moves the floors until
    // this one ends.
    let floors = wal.redo_floors();
    let (bound, redo) = wal.begin_checkpoint(scope);
    let mut began = Began {
        wal,
        floors: Some(floors),
        finishing: false,
    };
    write_back_and_record(pool, wal, scope, bound, redo).await?;
    began.finishing = true;
    for l in wal.logs() {
        l.finish_checkpoint().await?;
    }
    began.ended();
    // Advice to the devices: a map page that cannot be read now is an
    // error for whoever needs it next, not a failed checkpoint.
    let _ = pool.trim_freed(redo).await;
    Ok(())
}

/// A checkpoint begun and not yet ended: undone (`LogSet::abandon_checkpoint`)
/// however it stops short of its control blocks, by an error or by its
/// future being dropped. (Undone on an error alone, a checkpoint dropped
/// mid-way, as a task that panics is, left every floor of its scope
/// raised with no page written, and the next checkpoint of another shard
/// named a redo GSN past commits no checkpoint had written: lost at the
/// next crash. It also left `in_checkpoint` set for good; a review's
/// finding.) Stopped while it writes its control blocks, it stops the
/// logs instead (see `finishing`).
struct Began<'a> {
    wal: &'a LogSet,
    /// The floors from before it began; `None` once it ended.
    floors: Option<Vec<u64>>,
    /// Set once it writes its control blocks: stopped from then on, the
    /// logs stop instead. Some control blocks may name this checkpoint's
    /// redo point already; floors put back below it let the next
    /// checkpoint name an older redo GSN while those logs' redo points
    /// skip their records before this one's, and recovery re-applied the
    /// other logs' commits of that span without theirs, undoing later
    /// values (a review's finding).
    finishing: bool,
}

impl Began<'_> {
    fn ended(mut self) {
        self.floors = None;
    }
}

impl Drop for Began<'_> {
    fn drop(&mut self) {
        if let Some(floors) = self.floors.take() {
            if self.finishing {
                self.wal.poison_with(&Error::Poisoned(
                    "a checkpoint stopped while it wrote its control blocks; reopen the \
                     database (recovery finishes what the log holds)"
                        .into(),
                ));
            } else {
                self.wal.abandon_checkpoint(&floors);
            }
        }
    }
}

/// The steps of [`checkpoint`] after it began, up to its records durable
/// (its control blocks follow).
async fn write_back_and_record(
    pool: &BufferPool,
    wal: &Arc<LogSet>,
    scope: CheckpointScope,
    bound: u64,
    redo: u64,
) -> Result<()> {
    let shards = wal.checkpoint_shards();
    // Each log's end, durable before the meta page that records it is
    // written: a log found ending before it at open is older than the data
    // files. With several logs the stamp's check takes the newest log's
    // end, so one log put back from an older copy passed it beside the
    // others, and its acknowledged commits were lost with no error (an
    // outside probe's finding).
    let ends: Vec<u64> = wal.logs().iter().map(|l| l.appended_end()).collect();
    wal.wait_all_durable(wal.next_gsn()).await?;
    // The data files' stamp of this moment, written with every shard
    // (`buffer::alloc`'s module doc): synced before any control block
    // names the redo GSN.
    pool.stamp_checkpoint(redo, &ends).await?;
    pool.flush_where(|pid| pid == META_PAGE || scope.holds(pid, shards))
        .await?;
    let mut ends = Vec::with_capacity(wal.logs().len());
    for l in wal.logs() {
        let (_, end) = l.append_checkpoint(record::checkpoint(bound).into_unsealed())?;
        l.want(end);
        ends.push(end);
    }
    for (l, &end) in wal.logs().iter().zip(&ends) {
        l.wait_durable(end).await?;
    }
    Ok(())
}

/// [`checkpoint`] of every page, one at a time.
pub(crate) async fn exclusive_checkpoint(
    pool: &BufferPool,
    wal: &Arc<LogSet>,
    busy: &AtomicBool,
) -> Result<()> {
    while busy.swap(true, Ordering::SeqCst) {
        sched::yield_now().await;
    }
    let _busy = Busy(busy);
    checkpoint(pool, wal, CheckpointScope::All).await
}

/// Clears the one-at-a-time flag when a checkpoint ends, however it ends.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // SeqCst, as every access to the flag and to the log's
        // `checkpoint_wanted`: a step that finds the flag set and a
        // checkpoint's end that finds nothing wanted must not both miss
        // (store then load on each side; see `buffer/stall.rs`).
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The system task that starts a checkpoint of the next shard (as a task
/// on the worker that steps it) when the log asks for one and none runs.
/// A failed checkpoint stops the pool and the log (the next open
/// recovers); one refused by a pool already stopped leaves the log.
pub(crate) struct Checkpointer {
    pub(crate) pool: Arc<BufferPool>,
    pub(crate) wal: Arc<LogSet>,
    /// Set while a checkpoint runs (shared with `Db::checkpoint`).
    pub(crate) busy: Arc<AtomicBool>,
    /// Set when the database closes: no checkpoint starts any more.
    pub(crate) stop: Arc<AtomicBool>,
    /// The shard the next checkpoint writes (round robin).
    pub(crate) next_shard: AtomicUsize,
}

impl SystemTask for Checkpointer {
    fn name(&self) -> &'static str {
        "checkpoint"
    }

    fn step(&self) -> bool {
        if !self.wal.checkpoint_due()
            || self.stop.load(Ordering::Acquire)
            || self.wal.poisoned().is_some()
        {
            return false;
        }
        if let Some(e) = self.pool.poisoned() {
            // Every checkpoint would fail at once, and each failure
            // woke the commits waiting for room to look again.
            self.wal.stop_checkpoints(&e);
            return false;
        }
        let shards = self.wal.checkpoint_shards();
        let scope = match shards {
            1 => CheckpointScope::All,
            n => CheckpointScope::Shard(self.next_shard.load(Ordering::Relaxed) % n),
        };
        // Looked at before the flag is taken: a commit being applied
        // holds the redo points, and the step of the worker that ends its
        // apply (a worker steps after polling tasks) starts the
        // checkpoint. Looked at under the flag, that step could find the
        // flag taken by this one, which then skipped: neither started it
        // (a review's finding).
        if !self.wal.checkpoint_would_move(scope) {
            return false;
        }
        if self.busy.swap(true, Ordering::SeqCst) {
            return false;
        }
        let (pool, wal, busy) = (self.pool.clone(), self.wal.clone(), self.busy.clone());
        self.next_shard.fetch_add(1, Ordering::Relaxed);
        let started = sched::spawn_here(async move {
            let _busy = Busy(&busy);
            if let Err(e) = checkpoint(&pool, &wal, scope).await {
                // A checkpoint refused by a pool stopped elsewhere leaves
                // the log running: its records are whole commits, which
                // `Db::close` still makes durable for the next open.
                if !matches!(e, Error::Poisoned(_)) {
                    wal.poison_with(&e);
                }
                pool.poison(&e);
            }
        });
        if started.is_err() {
            // Only off a worker, where no system task is stepped.
            self.busy.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }
}
