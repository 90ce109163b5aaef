//! The logs of a database, one per worker, as one write-ahead log.
//!
//! Owns: which log a task appends to (its worker's: group commit is per
//! log and needs no lock any other worker takes), the GSN counter and
//! full-image bound the logs share (`Shared`), the page-change contract
//! the buffer pool sees ([`PageLog`]: a page's GSN is the GSN of its last
//! change, in whichever log; write-back waits until every log is durable
//! past it), the routing of the logs' completions, and the flush step
//! every worker runs.
//!
//! Dependencies between logs (the remote flushes of Haubenschild et al.,
//! SIGMOD 2020): a record that changes a page, or a commit that read a
//! page, whose GSN names a change another log has not made durable,
//! depends on the other logs up to that GSN; its log flushes it only once
//! they are durable there (`Wal::pump`). A change to a page whose last
//! change is durable depends on nothing: the common case, in which a
//! commit waits for its own log only. A page carries its GSN, not the log
//! that wrote it, so a change to a page whose last change is not durable
//! depends on the other logs up to it even when that change is in the
//! task's own log (the remote flush the paper avoids with a per-page log
//! id; not done here).
//!
//! Never: lets a page be written back before every log is durable past
//! its GSN, or a record become durable before what it depends on.

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use super::{CheckpointScope, Shared, Wal, WalStatsSnapshot};
use crate::buffer::page;
use crate::buffer::page_log::{PageChange, PageLog};
use crate::io::Completion;
use crate::sched::{self, CompletionHandler, IoTiming, RequestKind, SystemTask};
use crate::{Error, Result};

/// The logs of one database.
pub struct LogSet {
    logs: Vec<Arc<Wal>>,
    pub(super) shared: Arc<Shared>,
    /// Workers of the runtime (log `i` belongs to worker `i % workers`).
    workers: usize,
}

impl LogSet {
    /// The shared state for `count` logs whose GSNs start at `next_gsn`,
    /// checkpointed in `shards` shards; `pages_whole` if no write-back can
    /// tear a page (every data device out of place): no full images then.
    pub(crate) fn shared(
        count: usize,
        next_gsn: u64,
        shards: usize,
        pages_whole: bool,
    ) -> Arc<Shared> {
        Shared::new(count, next_gsn, shards, pages_whole)
    }

    /// The set of `logs` (log `i` at index `i`) sharing `shared`, flushed
    /// by `workers` workers.
    pub(crate) fn new(
        logs: Vec<Arc<Wal>>,
        shared: Arc<Shared>,
        workers: usize,
    ) -> Result<Arc<LogSet>> {
        if logs.is_empty() || logs.iter().enumerate().any(|(i, l)| l.index() != i) {
            return Err(Error::InvalidArgument(
                "a log set needs logs 0..n in order".into(),
            ));
        }
        Ok(Arc::new(LogSet {
            logs,
            shared,
            workers: workers.max(1),
        }))
    }

    /// The logs.
    pub fn logs(&self) -> &[Arc<Wal>] {
        &self.logs
    }

    /// True if worker `w` keeps log `i`'s async window: the log it
    /// appends to, and the logs it owns (log `i` belongs to worker
    /// `i % workers`, so a log no worker appends to still flushes). With
    /// fewer logs than workers several workers append to one log, and
    /// each of them keeps its window (an async commit's worker must wake
    /// for it: another may sleep with no deadline).
    fn tends(&self, w: usize, i: usize) -> bool {
        w % self.logs.len() == i || i % self.workers == w % self.workers
    }

    /// The log of the calling task's worker (log 0 off a worker).
    pub fn local(&self) -> &Arc<Wal> {
        let w = sched::current_worker().unwrap_or(0);
        &self.logs[w % self.logs.len()]
    }

    /// The next GSN to be assigned.
    pub fn next_gsn(&self) -> u64 {
        self.shared.next_gsn()
    }

    /// The oldest GSN of a commit any log is still applying, if any.
    pub(crate) fn oldest_applying(&self) -> Option<u64> {
        self.logs
            .iter()
            .filter_map(|l| Wal::oldest_applying(&l.lock()))
            .min()
    }

    /// Every record of every log below this GSN is durable (the next GSN
    /// if nothing waits; never moving backwards, see
    /// `Shared::durable_below`, which caps it at the next GSN itself).
    pub fn durable_below(&self) -> u64 {
        self.shared.durable_below()
    }

    /// Page `pid` logs a full image at its next change if its GSN is
    /// below this.
    pub fn full_image_below(&self, pid: u64) -> u64 {
        self.shared.full_image_below(pid)
    }

    /// Checkpoint shards (continuous checkpointing writes one at a time).
    pub fn checkpoint_shards(&self) -> usize {
        self.shared.shards()
    }

    /// Starts a checkpoint of `scope` in every log and, from now on, makes
    /// every page of `scope` changed before now log a full image at its
    /// next change; returns that bound (a GSN). Under every log's lock at
    /// once: the bounds move, and the checkpoint's redo GSN is picked:
    /// the lowest redo floor of any shard. A shard's floor is its last
    /// checkpoint's bound, or the oldest commit any log was still applying
    /// then (its covered changes are redone only from its record, and may
    /// have missed that checkpoint's write-back); the floor of a shard
    /// checkpointed longer ago is older, and its pages may hold changes
    /// since then logged as differences or covered. Every log's redo point
    /// then lies at or before its first record with a GSN from the redo
    /// GSN on, so every record past any shard's bound lies past its log's
    /// redo point (the first change of a page after its shard's checkpoint
    /// began, a full image, is where recovery will read) and recovery
    /// re-applies one suffix of the commits of all logs.
    /// Returns (the full-image bound, the redo GSN this checkpoint's
    /// control blocks will name: recovery redoes page records from it).
    pub(crate) fn begin_checkpoint(&self, scope: CheckpointScope) -> (u64, u64) {
        let mut states: Vec<_> = self.logs.iter().map(|l| l.lock()).collect();
        let applying = states
            .iter()
            .filter_map(|st| Wal::oldest_applying(st))
            .min();
        let bound = self.shared.begin_full_images(scope, applying);
        let g = self.shared.redo_gsn();
        for (l, st) in self.logs.iter().zip(states.iter_mut()) {
            l.begin_checkpoint_in(st, g);
        }
        (bound, g)
    }

    /// Whether a checkpoint of `scope` begun now would raise a redo floor
    /// of its shards (without that, no log's redo point can move);
    /// counted in the local log's `checkpoints_skipped` when not. A
    /// continuous checkpoint that would not is not started: its records
    /// would spend log space for nothing, and while a commit being
    /// applied held the floors (a long apply), back-to-back checkpoints
    /// filled the last quarter of a log that admission keeps for
    /// operations in progress, until no checkpoint could be flushed and
    /// every commit hung (`dana crashtest --worker-logs --tasks 64`).
    pub(crate) fn checkpoint_would_move(&self, scope: CheckpointScope) -> bool {
        let applying = self
            .logs
            .iter()
            .filter_map(|l| l.oldest_applying_now())
            .min();
        let moves = self.shared.floor_would_rise(scope, applying);
        if !moves {
            self.local().count_skipped_checkpoint();
        }
        moves
    }

    /// Every shard's redo floor now ([`LogSet::abandon_checkpoint`]).
    pub(crate) fn redo_floors(&self) -> Vec<u64> {
        self.shared.redo_floors()
    }

    /// Undoes [`LogSet::begin_checkpoint`] for a checkpoint that failed
    /// before its control blocks: the floors go back to `floors` (taken
    /// before it began), and every log's redo point stays the last
    /// checkpoint's. (Left moved, the next checkpoint of another shard
    /// named a redo point past changes of pages this one never wrote: an
    /// acknowledged commit was lost at the next crash; a review's finding.)
    pub(crate) fn abandon_checkpoint(&self, floors: &[u64]) {
        self.shared.restore_redo_floors(floors);
        for l in &self.logs {
            l.abandon_checkpoint();
        }
    }

    /// The error of a log that stopped, if any: a log's own (the
    /// lowest-numbered that failed itself), else one that names the first
    /// failure.
    pub fn poisoned(&self) -> Option<Error> {
        // A log that failed itself names its own error; the others name
        // the first failure as another log's.
        let own = self
            .logs
            .iter()
            .find(|l| l.poisoned.load(std::sync::atomic::Ordering::Acquire));
        own.into_iter()
            .chain(self.logs.iter())
            .find_map(|l| l.poisoned())
    }

    /// See [`Wal::stop_checkpoints`]: for every log.
    pub(crate) fn stop_checkpoints(&self, why: &Error) {
        for l in &self.logs {
            l.stop_checkpoints(why);
        }
    }

    /// Stops every log for good.
    pub fn poison_with(&self, e: &Error) {
        for l in &self.logs {
            l.poison_with(e);
        }
    }

    /// Waits until every log is durable below GSN `end`.
    pub async fn wait_all_durable(&self, end: u64) -> Result<()> {
        self.wait_durable_but(None, end).await
    }

    /// Waits until every log but `me` is durable below GSN `end`: what an
    /// `Async` commit appended to `me` depends on (see `txn::Committer`).
    pub(crate) async fn wait_others_durable(&self, me: &Arc<Wal>, end: u64) -> Result<()> {
        self.wait_durable_but(Some(me), end).await
    }

    /// Waits until every log but `but` is durable below GSN `end`, every
    /// one asked first, so that they flush together, not in turn.
    async fn wait_durable_but(&self, but: Option<&Arc<Wal>>, end: u64) -> Result<()> {
        let logs = || {
            self.logs
                .iter()
                .filter(move |l| but.is_none_or(|b| !Arc::ptr_eq(l, b)))
        };
        for l in logs() {
            l.want(end);
        }
        for l in logs() {
            l.wait_durable(end).await?;
        }
        Ok(())
    }

    /// True when a log asks for a checkpoint.
    pub fn checkpoint_due(&self) -> bool {
        self.logs.iter().any(|l| l.checkpoint_due())
    }

    /// Waits for growths of the log files in progress to finish.
    pub fn finish_growth(&self) {
        for l in &self.logs {
            l.finish_growth();
        }
    }

    /// The logs' counters, summed (`durable`: every record below it is
    /// durable in every log; `end`: the next GSN).
    pub fn stats(&self) -> WalStatsSnapshot {
        let mut s = WalStatsSnapshot::default();
        for l in &self.logs {
            s.add(&l.stats());
        }
        // A checkpoint covers every log: count it once.
        s.checkpoints /= self.logs.len() as u64;
        s.end = self.next_gsn();
        s.durable = self.durable_below();
        s
    }

    /// The most GSN any of `changes` had before the change: the record
    /// that logs them depends on the logs up to there.
    fn dep_of(changes: &[PageChange<'_>]) -> u64 {
        changes
            .iter()
            .map(|c| page::page_lsn(c.after))
            .max()
            .unwrap_or(0)
    }
}

impl PageLog for LogSet {
    fn log_changes(&self, changes: &[PageChange<'_>]) -> Result<Option<u64>> {
        self.local().append_pages(changes, Self::dep_of(changes))
    }

    fn log_commit(
        &self,
        commit: Vec<u8>,
        changes: &[PageChange<'_>],
        dep: u64,
    ) -> Result<(u64, u64)> {
        let dep = dep.max(Self::dep_of(changes));
        self.local().append_commit_with_pages(commit, changes, dep)
    }

    fn log_covered(&self, pid: u64, page: &[u8], cover: u64) -> Result<Option<u64>> {
        // Checked outside the log's lock: if a checkpoint of this page's
        // shard begins right after, the covering commit is one it sees
        // applying (its record came first), so the checkpoint's redo GSN
        // is at or before it and the page, dirty with the change, is
        // written back by the checkpoint before its control block names
        // it; the page's next change logs an image.
        if page::page_lsn(page) >= self.full_image_below(pid) {
            return Ok(None);
        }
        // Not a page handed out new (no `FRESH` flag: a review found the
        // flag on these images); whole all the same, with no copy to
        // build on and its LSN below the shard's bound.
        let change = PageChange {
            pid,
            before: None,
            after: page,
            fresh: false,
            cut: None,
        };
        // The image holds the covering commit's change too: it depends on
        // that commit's record unless the record is in this log, before it
        // (it depended on the other logs up to the commit's GSN, so every
        // first change of a leaf after a checkpoint made them flush
        // records nothing read; a review's finding). Recovery applies
        // commits appended again to other logs.
        let local = self.local();
        let dep = page::page_lsn(page);
        let dep = if local.is_applying(cover) {
            dep
        } else {
            dep.max(cover)
        };
        local.append_pages(&[change], dep)
    }

    fn admit(&self, bytes: u64) -> crate::buffer::page_log::Admission<'_> {
        let wal = self.local().clone();
        Box::pin(async move {
            let room: crate::buffer::page_log::LogRoom = Box::new(wal.admit_owned(bytes).await?);
            Ok(room)
        })
    }

    fn next_lsn(&self) -> u64 {
        self.shared.next_gsn()
    }

    fn max_record(&self) -> u64 {
        self.logs.iter().map(|l| l.max_record()).min().unwrap_or(0)
    }

    fn durable(&self) -> u64 {
        self.shared.durable_below()
    }

    fn want(&self, end: u64) {
        for l in &self.logs {
            l.want(end);
        }
    }

    fn wake_when_durable(&self, waker: &Waker) {
        self.shared.wake_when_durable(waker);
    }

    fn poisoned(&self) -> Option<Error> {
        LogSet::poisoned(self)
    }
}

/// The logs own the completions of their flushes' writes and syncs.
impl CompletionHandler for LogSet {
    fn complete(&self, kind: RequestKind, id: u64, c: Completion, _: IoTiming) {
        debug_assert_eq!(kind, RequestKind::Log);
        let index = super::log_of_request(id);
        let Some(log) = self.logs.get(index) else {
            debug_assert!(false, "a log completion for log {index}");
            return;
        };
        log.flush_completed(id, c);
        if let Some(e) = log.poisoned() {
            self.poison_with(&e);
            return;
        }
        // A log whose records waited for this one may go on now.
        for l in &self.logs {
            if l.is_blocked() {
                l.pump();
            }
        }
    }
}

/// Group commit's flushes, a system task every worker steps: its own
/// logs (log `i` belongs to worker `i % workers`), and any other that
/// someone waits for.
impl SystemTask for LogSet {
    fn name(&self) -> &'static str {
        "log flush"
    }

    fn step(&self) -> bool {
        // A log failed: stop the others, waking whoever waits on them.
        if let Some(e) = self
            .logs
            .iter()
            .find(|l| l.stopped_by_another())
            .and(self.poisoned())
        {
            self.poison_with(&e);
        }
        let me = sched::current_worker().unwrap_or(0);
        let mut started = false;
        for (i, l) in self.logs.iter().enumerate() {
            if self.tends(me, i) || l.wants_flush() {
                started |= l.pump();
            }
        }
        started
    }

    /// The nearest deadline of the logs this worker tends.
    fn due_in(&self) -> Option<Duration> {
        let me = sched::current_worker().unwrap_or(0);
        self.logs
            .iter()
            .enumerate()
            .filter(|(i, l)| self.tends(me, *i) || l.wants_flush())
            .filter_map(|(_, l)| l.due_in())
            .min()
    }
}
