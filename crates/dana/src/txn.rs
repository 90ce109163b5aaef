//! Transactions: writes buffered until commit, committed atomically
//! through the log.
//!
//! Owns: the transaction's read and write sets, the key lock table, and
//! the commit protocol:
//! 1. lock the stripes of every written key (in stripe order: no
//!    deadlock);
//! 2. validate: every written key the transaction read still has the
//!    value it read (else [`Error::Conflict`]; no lost update), and every
//!    `insert` key is still absent (else [`Error::KeyExists`]);
//! 3. reserve the most pages the writes' apply can allocate (else
//!    [`Error::NoSpace`], before anything is logged: a commit that can
//!    fail for space fails here; recovery re-applies of each key only its
//!    last logged write, which goes where the running database's went:
//!    `recovery::last_writes`), then the
//!    most log bytes it can append ([`crate::wal::Wal::admit`]: waits for a
//!    checkpoint if the log is too full);
//! 4. append one commit record holding all the writes (this is the commit
//!    point: recovery re-applies every commit record it finds);
//! 5. apply the writes to the trees (their page changes are logged after
//!    the commit record, so no page change of an uncommitted transaction
//!    ever reaches the log or the disk);
//! 6. release the locks and the reservation, then, with `Sync` durability, await the group
//!    flush that makes the commit record durable.
//!
//! Isolation, chosen per transaction ([`crate::Isolation`]):
//! - read committed (the default): reads see committed data and the
//!   transaction's own writes; every key a transaction read (with `get`,
//!   or within a range a scan read) and then wrote is validated in step 2
//!   (no lost update). Reads of keys it does not write, and the rest of
//!   its scans, are not validated: phantoms and write skew are possible;
//! - serializable: after step 1 the commit registers its keys as in
//!   flight, and step 2 also validates every key read and every range
//!   scanned, against the trees and the other commits in flight
//!   (`validate.rs` says why that is serializable).
//!
//! Another commit's writes become visible to readers once its record is
//! in the log, before it is durable (early lock release): a transaction
//! that read them commits after it in the log, so a crash can never keep
//! the reader and lose the writer. A plain read outside a transaction can
//! see a write that a crash then loses (it was never acknowledged).
//!
//! Never: applies a write before its commit record is appended, or
//! acknowledges a `Sync` commit before its record is durable.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::btree::tree::MAX_VALUE_LEN;
use crate::btree::{node, BTree};
use crate::buffer::alloc::Reservation;
use crate::buffer::blob::{self, BlobHold, BlobRef, Extent};
use crate::buffer::BufferPool;
use crate::read_fence::{FenceGuard, ReadFence};
use crate::sched;
use crate::validate::{self, InFlight, ReadSet};
use crate::wal::record::{self, Write};
use crate::wal::{self, Durability, LogReservation, LogSet, Wal};
use crate::{Error, Result};

/// Number of key lock stripes.
const STRIPES: usize = 4096;

/// Places a large value may be tried in before one whose bytes read as a
/// valid dana page in each is refused (`BufferPool::page_look_alike`):
/// bytes that do so by chance move at the first retry; only bytes built
/// for the allocator's next choices can match in every place.
const LOOK_ALIKE_TRIES: usize = 4;

/// Striped key locks, held from validation until the writes are applied.
pub(crate) struct KeyLocks {
    stripes: Box<[AtomicBool]>,
}

impl KeyLocks {
    pub(crate) fn new() -> KeyLocks {
        KeyLocks {
            stripes: (0..STRIPES).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn stripe(tree: u64, key: &[u8]) -> usize {
        let h = crc32c::crc32c_append(tree as u32 ^ (tree >> 32) as u32, key);
        h as usize % STRIPES
    }

    /// Takes every stripe once, in order, and releases them: every commit
    /// that held a stripe when this began has finished applying.
    async fn barrier(&self) {
        for i in 0..STRIPES {
            self.acquire(i).await;
            self.stripes[i].store(false, Ordering::Release);
        }
    }

    /// Takes stripe `i`, yielding while another holds it.
    async fn acquire(&self, i: usize) {
        while self.stripes[i].swap(true, Ordering::Acquire) {
            sched::yield_now().await;
        }
    }

    /// The stripes of `keys`, sorted, each once.
    fn stripes_of<'k>(keys: impl Iterator<Item = (u64, &'k [u8])>) -> Vec<usize> {
        let mut s: Vec<usize> = keys.map(|(t, k)| Self::stripe(t, k)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Locks the stripes of `keys`, yielding while one is taken.
    async fn lock<'k>(&self, keys: impl Iterator<Item = (u64, &'k [u8])>) -> StripeGuard<'_> {
        let s = Self::stripes_of(keys);
        let mut g = StripeGuard {
            locks: self,
            held: Vec::with_capacity(s.len()),
        };
        for i in s {
            self.acquire(i).await;
            g.held.push(i);
        }
        g
    }

    /// Locks the stripes of `keys` if none is taken now; None (holding
    /// none) otherwise.
    fn try_lock<'k>(&self, keys: impl Iterator<Item = (u64, &'k [u8])>) -> Option<StripeGuard<'_>> {
        let s = Self::stripes_of(keys);
        let mut g = StripeGuard {
            locks: self,
            held: Vec::with_capacity(s.len()),
        };
        for i in s {
            if self.stripes[i].swap(true, Ordering::Acquire) {
                return None;
            }
            g.held.push(i);
        }
        Some(g)
    }
}

struct StripeGuard<'a> {
    locks: &'a KeyLocks,
    held: Vec<usize>,
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        for &i in &self.held {
            self.locks.stripes[i].store(false, Ordering::Release);
        }
    }
}

/// A precondition checked under the locks at commit.
#[derive(Debug, Clone)]
pub(crate) enum Expect {
    /// The key still has this value (None: absent): else `Conflict`.
    Value(Option<Vec<u8>>),
    /// The key is absent: else `KeyExists`.
    Absent,
}

/// What commits need from the database.
pub(crate) struct Committer {
    pub(crate) pool: Arc<BufferPool>,
    pub(crate) wal: Option<Arc<LogSet>>,
    pub(crate) locks: KeyLocks,
    pub(crate) durability: Durability,
    /// The database was opened read-only: every commit fails.
    pub(crate) read_only: bool,
    /// The database was closed: every handle fails.
    pub(crate) closed: AtomicBool,
    /// Writes (commits, plain writes, a whole tree drop) in progress,
    /// entered before their check of `closed`: `Db::close` waits for them
    /// before its last flush. Per-worker counts (`read_fence.rs`): a
    /// single shared counter was one contended cache line per write.
    pub(crate) writers: ReadFence,
    /// Roots of the trees dropped since open: reads and commits through a
    /// stale handle fail with [`Error::NoSuchTree`], and none is handed
    /// out as a new tree's root. With each, the tree's name (for the
    /// error).
    pub(crate) dropped: Mutex<HashMap<u64, String>>,
    /// True once `dropped` has an entry (false, the common case: no lock
    /// taken).
    pub(crate) any_dropped: AtomicBool,
    /// Reads of trees in flight, which a drop waits for before it frees
    /// the tree's pages (`read_fence.rs`).
    pub(crate) readers: Arc<ReadFence>,
    /// Keys of the commits between validation and the end of their
    /// apply, for serializable transactions.
    pub(crate) in_flight: InFlight,
    /// The identity of the runtime serving this database
    /// ([`crate::sched::Runtime::id`]).
    pub(crate) runtime: usize,
    /// A commit's future was dropped part way through its apply: the trees
    /// hold part of it, and every read is refused (the next open applies
    /// it whole, or not at all).
    pub(crate) torn: AtomicBool,
}

/// What applying one write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    /// The key existed before.
    pub replaced: bool,
    /// The GSN of the leaf the write changed, before the change: the
    /// answer was read there, from the change that last wrote or removed
    /// the key, maybe another log's and not yet durable.
    pub read_gsn: u64,
}

impl Committer {
    /// Runs `write`, a tree write outside a commit (no log, no large
    /// values), holding its key's stripe: a commit checks its keys under
    /// their stripes and applies later, and a plain write landing in
    /// between was overwritten by the apply (two inserts of one key both
    /// succeeded, an update was lost; a review's finding).
    pub(crate) async fn with_key_locked<T>(
        &self,
        tree: u64,
        key: &[u8],
        write: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let _writing = self.begin_write()?;
        let _stripe = self.locks.lock(std::iter::once((tree, key))).await;
        write.await
    }

    /// [`Error::Closed`] once closed; [`Error::ReadOnly`] for a write on
    /// a read-only database.
    pub(crate) fn live(&self, write: bool) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if crate::sched::current_runtime().is_some_and(|r| r != self.runtime) {
            // Its pages would be read and written through the other
            // database's device queues (the same indices name other files).
            return Err(Error::InvalidArgument(
                "a handle of this database used inside a task of another database".into(),
            ));
        }
        if write && self.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Enters a write: [`Error::Closed`] once closed, else a guard that
    /// `Db::close` waits for. The write enters the fence before the check
    /// and close marks before it moves the fence's epoch (all `SeqCst`): a
    /// write that finds the database open is always waited for.
    pub(crate) fn begin_write(&self) -> Result<FenceGuard<&ReadFence>> {
        let writing = FenceGuard::enter(&self.writers);
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(writing)
    }

    /// Marks the database closed: every write that starts from now on
    /// fails with [`Error::Closed`]. False if it was closed already.
    pub(crate) fn mark_closed(&self) -> bool {
        !self.closed.swap(true, Ordering::SeqCst)
    }

    /// Waits (on a thread, never a worker) until the writes that entered
    /// before [`Committer::mark_closed`] ended. Unbounded in time, not in
    /// what it waits for: no write enters after the mark, and each one in
    /// progress ends on its own while the workers and the checkpoints run
    /// (the caller stops them only after). A time limit (60 s at first)
    /// let a slow but legitimate write, acknowledged after the last
    /// flush, be lost (a review's finding).
    pub(crate) fn wait_writes_ended(&self) {
        self.writers.wait_all_entered();
    }

    /// [`Error::NoSuchTree`] if the tree at `root` was dropped.
    pub(crate) fn tree_alive(&self, root: u64) -> Result<()> {
        match self.dropped_name(root) {
            // The handle's name, said to be dropped (it read "the tree
            // whose root was page 1909 (dropped)"; an outside probe).
            Some(name) => Err(Error::NoSuchTree(format!(
                "{name} (dropped; this handle is stale)"
            ))),
            None => Ok(()),
        }
    }

    /// Enters a read of the tree at `root` (see `read_fence.rs`): hold
    /// the guard until its pages are read. [`Error::NoSuchTree`] if the
    /// tree was dropped.
    pub(crate) fn read_tree(&self, root: u64) -> Result<FenceGuard<&ReadFence>> {
        let fence = FenceGuard::enter(&*self.readers);
        self.tree_alive(root)?;
        self.refuse_torn()?;
        Ok(fence)
    }

    /// [`Error::Poisoned`] once a commit was dropped part way through its
    /// apply: reads then saw half of it (an outside probe read `a` moved
    /// and `b` not, of one transaction).
    fn refuse_torn(&self) -> Result<()> {
        if self.torn.load(Ordering::Acquire) {
            return Err(self.pool.poisoned().unwrap_or_else(|| {
                Error::Poisoned("a commit was dropped part way through its apply".into())
            }));
        }
        Ok(())
    }

    /// [`Committer::read_tree`] with a guard that owns the fence (for
    /// cursors, which ask at every leaf).
    pub(crate) fn read_tree_owned(&self, root: u64) -> Result<FenceGuard<Arc<ReadFence>>> {
        let fence = FenceGuard::enter(self.readers.clone());
        self.tree_alive(root)?;
        self.refuse_torn()?;
        Ok(fence)
    }

    /// The roots of the trees dropped since open (a copy).
    pub(crate) fn dropped_roots(&self) -> HashSet<u64> {
        if !self.any_dropped.load(Ordering::Acquire) {
            return HashSet::new();
        }
        self.dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// True if the tree at `root` was dropped since open.
    pub(crate) fn was_dropped(&self, root: u64) -> bool {
        self.dropped_name(root).is_some()
    }

    /// The name of the tree at `root` if it was dropped since open (no
    /// lock taken while none was).
    fn dropped_name(&self, root: u64) -> Option<String> {
        if !self.any_dropped.load(Ordering::Acquire) {
            return None;
        }
        self.dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&root)
            .cloned()
    }

    /// Refuses every later commit to the tree at `root` and waits for the
    /// commits writing to it now (`name`: the tree's, for the errors of
    /// stale handles). Must run on a worker.
    pub(crate) async fn mark_dropped(&self, root: u64, name: &[u8]) {
        {
            let mut d = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
            d.insert(root, String::from_utf8_lossy(name).into_owned());
            self.any_dropped.store(true, Ordering::Release);
        }
        self.locks.barrier().await;
        // Every commit appended before now has finished applying, not only
        // those to the tree: the drop's checkpoint puts its redo point at
        // the oldest commit still applying, and one of another tree
        // appended before the tree's last commit (which the barrier waited
        // for) held it there: recovery would re-apply that last commit
        // into the tree's freed, maybe reused, pages (a review's finding).
        if let Some(w) = &self.wal {
            let end = w.next_gsn();
            while w.oldest_applying().is_some_and(|a| a < end) {
                if self.pool.poisoned().is_some() {
                    // No commit finishes applying; the drop's checkpoint
                    // fails on the poison.
                    break;
                }
                sched::yield_now().await;
            }
        }
    }

    /// Commits `writes` atomically after checking `checks`. Returns, per
    /// write, whether the key existed. Must run on a worker.
    pub(crate) async fn commit(
        &self,
        writes: Vec<Write<'_>>,
        checks: Vec<(u64, Vec<u8>, Expect)>,
        durability: Durability,
    ) -> Result<Vec<Applied>> {
        self.commit_at(writes, checks, durability, 0, None)
            .await
            .map(|(a, _)| a)
    }

    /// [`Committer::commit`], also returning the GSN just after the commit
    /// record (0 without a log or without writes). `read_gsn`: the most
    /// GSN of a leaf the transaction read (its commit record depends on
    /// every log up to there).
    pub(crate) async fn commit_at(
        &self,
        mut writes: Vec<Write<'_>>,
        checks: Vec<(u64, Vec<u8>, Expect)>,
        durability: Durability,
        read_gsn: u64,
        reads: Option<&ReadSet>,
    ) -> Result<(Vec<Applied>, u64)> {
        // A transaction that wrote nothing only validates (serializable)
        // or does nothing at all (read committed): a read-only database
        // allows it. (A read-committed one was refused as a write.)
        self.live(!writes.is_empty())?;
        // Close waits for it: acknowledged, it is in close's last flush.
        let _writing = self.begin_write()?;
        if !sched::on_worker() {
            return Err(Error::WouldBlock);
        }
        if let Some(e) = self.pool.poisoned() {
            return Err(e);
        }
        if reads.is_some() && !self.in_flight.is_ready() {
            // The first serializable commits: wait out the commits that
            // may have skipped registering (they hold their stripes). Each
            // one until a barrier has ended, not only the one that turned
            // registration on: a second one validating during the first's
            // barrier could see half of a commit that had not registered
            // (found in review).
            self.in_flight.start();
            self.locks.barrier().await;
            self.in_flight.set_ready();
        }
        // This task's worker's log: admission, the record and the wait
        // are all on it.
        let log = self.wal.as_ref().map(|w| w.local().clone());
        let page_bytes = (self.pool.page_size() + record::HEADER + 16) as u64;
        // Room found while holding no stripe, after a pass that found none
        // under them.
        let mut held: Option<Room<'_>> = None;
        let (guard, registered, dep, large, pages, room) = loop {
            let keys = || writes.iter().map(|w| (w.tree, w.key.as_slice()));
            // Never wait for a stripe holding room: a large-value commit
            // waits for room under its stripes, and a commit that held the
            // room it needed while spinning on one of them deadlocked with
            // it (`dana crashtest --tasks 32 --seed 115343361 --point 1525
            // --log-sync`).
            let guard = match held.is_some().then(|| self.locks.try_lock(keys())) {
                Some(Some(g)) => g,
                Some(None) => {
                    held = None;
                    self.locks.lock(keys()).await
                }
                None => self.locks.lock(keys()).await,
            };
            // Registered until applied: what serializable commits validate
            // against besides the trees.
            let registered = self.in_flight.register(&writes);
            for w in &writes {
                self.tree_alive(w.tree)?;
            }
            // The commit depends on what it read, and on what it validated.
            let mut dep = read_gsn;
            if let Some(r) = reads.filter(|r| !r.is_empty()) {
                // Validation reads the trees read: a dropped one's pages may
                // be another tree's by now. Fenced like any read
                // (`read_fence.rs`): a drop frees none of their pages
                // until the validation is done.
                let _fence = FenceGuard::enter(&*self.readers);
                let read_trees = r.points.iter().map(|p| p.tree);
                for tree in read_trees.chain(r.ranges.iter().map(|r| r.tree)) {
                    self.tree_alive(tree)?;
                }
                dep = dep.max(validate::validate(&self.pool, &self.in_flight, r, &writes).await?);
            }
            for (tree, key, expect) in &checks {
                let (now, gsn) = BTree::open(&self.pool, *tree).get_versioned(key).await?;
                dep = dep.max(gsn);
                match expect {
                    Expect::Absent if now.is_some() => {
                        // An answer read from the trees (an insert's "the
                        // key exists"): a Sync one is given once what it
                        // was read from is durable, as a read-only
                        // transaction's, holding no stripe meanwhile.
                        drop((registered, guard, held));
                        self.wait_read_durable(dep, durability).await?;
                        return Err(Error::KeyExists);
                    }
                    Expect::Value(v) if *v != now => {
                        return Err(Error::Conflict(format!(
                            "a key of tree {tree} changed after this transaction read it"
                        )))
                    }
                    _ => {}
                }
            }
            let large = self.store_large_values_prepare(&writes).await?;
            let pages = pages_needed(&self.pool, &writes).await? + large.pages;
            if !large.writes.is_empty() || !large.freed.is_empty() {
                // Large values: their record is known only once they are
                // stored (under the stripes), so their log room is
                // admitted there. Their pages are promised here: from room
                // held from an earlier pass if it covers them (its log
                // room goes), else now, else after waiting holding no
                // stripe, as any commit does. (Promised under the
                // stripes, a commit failed with NoSpace at once when the
                // free pages were promised to commits in flight: `dana
                // crashtest --out-of-place`. Held room kept beside a new
                // promise counted its pages twice: a review's finding.)
                let space = match held.take() {
                    Some(r) if r.pages.pages() >= pages => Some(r.pages),
                    other => {
                        drop(other);
                        self.pool.reserve_now(pages)
                    }
                };
                if let Some(space) = space {
                    break (guard, registered, dep, large, pages, Prepared::Large(space));
                }
                drop(large);
                drop(registered);
                drop(guard);
                held = Some(Room::wait(&self.pool, None, pages, 0).await?);
                continue;
            }
            let head = commit_head(log.is_some(), &writes);
            let log_bytes = log_promise(head.as_ref(), pages + writes.len() as u64, page_bytes);
            let room = match held.take() {
                Some(r) if r.covers(pages, log_bytes) => Some(r),
                _ => Room::now(&self.pool, log.as_deref(), pages, log_bytes)?,
            };
            if let Some(room) = room {
                break (
                    guard,
                    registered,
                    dep,
                    large,
                    pages,
                    Prepared::Small(room, head),
                );
            }
            // No room now: wait for it holding no stripe (a commit parked
            // on a full log under its stripes had every commit that wanted
            // one of them spin: 17 task polls per insert in `dana bench
            // commit`'s async inserts), then validate again.
            drop(registered);
            drop(guard);
            held = Some(Room::wait(&self.pool, log.as_deref(), pages, log_bytes).await?);
        };
        // Under the stripes, before anything is logged: a commit dropped
        // part way through its apply stops the pool before it lets its
        // stripes go, so a commit on its keys, whose validation passed
        // against what the trees held then, stops here. Appended, recovery
        // applied the dropped commit whole and then this one over it: the
        // torn state for good (an outside probe: a pair of counters one
        // apart after a reopen).
        if let Some(e) = self.pool.poisoned() {
            return Err(e);
        }
        let (space, stored, head, log_space) = match room {
            Prepared::Small(room, head) => (room.pages, Written::none(), head, room.log),
            Prepared::Large(space) => {
                let stored = self.store_large_values(&mut writes, &large).await?;
                let head = commit_head(log.is_some(), &writes);
                if let (Some(w), Some(h)) = (&log, &head) {
                    // The log's limit, checked before the map pages change:
                    // past that, a record the log refuses stops the
                    // database (one oversized transaction with a large
                    // value poisoned it; a review's finding). At most the
                    // map pages and the meta page as images join it.
                    let most = h.len() as u64 + (stored.map_pages + 1) * page_bytes;
                    let max = w.max_record();
                    if most > max {
                        return Err(Error::TooLarge {
                            what: "commit record",
                            len: most as usize,
                            max: max as usize,
                        });
                    }
                }
                let log_space = match (&log, &head) {
                    (Some(w), Some(_)) => {
                        // The map pages of large values may log images too;
                        // the values' own pages are written around the log
                        // (counted, every large-value commit asked a quarter
                        // of the log: three at a time; a review's finding).
                        let touched = pages - large.pages + writes.len() as u64 + stored.map_pages;
                        Some(
                            w.admit(log_promise(head.as_ref(), touched, page_bytes))
                                .await?,
                        )
                    }
                    _ => None,
                };
                (space, stored, head, log_space)
            }
        };
        let changes_space = stored.changes_space();
        // The log the record goes to, which the commit then waits for and
        // marks applied: the one chosen above, or, through the pool (large
        // values), this worker's log when it is polled now. They differ if
        // the future moved to another worker since (the sync API moves a
        // first attempt that yielded on the calling thread to a worker):
        // the commit waited on a log that did not hold its record, and
        // left the other log's entry applying for good (a review's
        // finding).
        let mut appended_to = log.clone();
        let mut logged = if changes_space {
            // The map bits of the extents taken and freed go into the
            // commit record: durable exactly when the commit is.
            let mut s = self.pool.lock_space().await?;
            self.pool
                .blob_space_in(&mut s, &stored.taken, &large.freed, stored.delta)
                .await?;
            match head {
                Some(h) => {
                    // No await from here to the append: the same worker.
                    appended_to = self.wal.as_ref().map(|w| w.local().clone());
                    Some(self.pool.log_commit(&mut s, h.into_raw(), dep)?)
                }
                None => None,
            }
        } else {
            match (&log, head) {
                (Some(w), Some(mut h)) => {
                    h.u32(0);
                    Some(w.append_commit(h.into_unsealed(), dep)?)
                }
                _ => None,
            }
        };
        let log = appended_to;
        // The map bits are set in the commit: the extents are the values'.
        for h in stored.holds {
            h.keep();
        }
        // The record is logged: a caller dropping this future now (a
        // select, a timeout) would leave the trees without writes the log
        // holds, the key locks let go, and the log unable to checkpoint
        // past the commit. The guard stops the database instead; the
        // next open finishes the commit from its record. Without a log
        // the trees would keep part of the commit (and a large value's
        // map bits without its reference): the database stops too.
        // A single write without a large value is safe to drop (a split
        // makes its changes after its last await): no guard then (an
        // early version stopped the database for every such dropped write
        // on a database holding a large value; a review's finding).
        // Applied in part if stopped part way: several writes, or a large
        // value's map bits.
        let partial = changes_space || writes.len() > 1;
        let unapplied = (logged.is_some() || partial).then(|| DroppedMidApply {
            pool: &self.pool,
            logged: logged.is_some(),
            torn: partial.then_some(&self.torn),
        });
        // What the commit depends on, with what the page records its apply
        // appended depend on (an async commit waits for it below).
        let mut own = crate::wal::OwnAppends::default();
        let applied = crate::wal::own_appends(
            async {
                match (&log, logged.as_mut()) {
                    (Some(w), Some(at)) => apply_logged(&self.pool, w, &writes, at).await,
                    _ => apply(&self.pool, &writes, true, 0).await,
                }
            },
            &mut own,
        )
        .await;
        let dep = dep.max(own.dep);
        if let Some(guard) = unapplied {
            guard.disarm();
        }
        if applied.is_ok() {
            // No leaf names the replaced values' extents any more.
            self.pool.retire(large.freed);
        }
        drop(space);
        drop(log_space);
        // The log that holds the commit record (`appended_to`).
        if let (Some(w), Some((gsn, _))) = (&log, logged) {
            w.applied(gsn);
        }
        drop(registered);
        drop(guard);
        let applied = match applied {
            Ok(a) => a,
            Err(e) => {
                // The commit record is in the log but the trees lack some
                // of its writes: refuse further writes; recovery on the
                // next open completes the commit. Without a log, a commit
                // whose large values changed the map (the old value's
                // extents free, leaves not yet updated naming them) stops
                // the database too (a review's finding), and so does one
                // of several writes: those applied before the failure
                // stayed, the rest did not, and the database went on with
                // the transaction in part (a review's finding).
                if logged.is_some() || changes_space || writes.len() > 1 {
                    self.pool.poison(&Error::Poisoned(format!(
                        "a commit could not be applied: {e}"
                    )));
                }
                return Err(e);
            }
        };
        match (&log, logged, durability) {
            (Some(w), Some((_, end)), Durability::Sync) => w.wait_durable(end).await?,
            // Nothing logged (a transaction that only read): acknowledged
            // once what it read is durable in every log, as a commit
            // record depending on it would be. Returning at once answered
            // a read of a commit a crash could still lose (a review's
            // finding); a leaf changed only by durable commits waits for
            // nothing.
            (Some(_), None, Durability::Sync) if dep > 0 => {
                self.wait_read_durable(dep, durability).await?
            }
            // An async commit that read another log's write not durable
            // yet, or whose splits or full images depend on one (what `dep`
            // holds), waits for that log's flush (one window at most), not
            // for its own: its record cannot be durable before
            // what it depends on, so a flush takes records only up to the
            // first such record. Returning at once let committers on two
            // workers build chains of records each depending on the other
            // log's last, which drained one flush per link: with a log per
            // worker an outside probe saw commits stall for 5-16 s and the
            // durable point 20,000 commits behind, all of them lost by a
            // kill -9 (the window promises 10 ms).
            (Some(w), Some(_), Durability::Async) if dep > 0 => {
                if let Some(set) = &self.wal {
                    set.wait_others_durable(w, dep + 1).await?;
                }
            }
            _ => {}
        }
        Ok((applied, logged.map_or(0, |(_, end)| end)))
    }

    /// With `Sync` durability and a log: waits until every log is durable
    /// past GSN `read` (what an answer was read from: a leaf's GSN), so
    /// that the answer survives a crash; at once if it is already. With
    /// one log a commit's own flush covers what it read; with a log per
    /// worker the change read may be another log's.
    pub(crate) async fn wait_read_durable(&self, read: u64, durability: Durability) -> Result<()> {
        match &self.wal {
            Some(set) if durability == Durability::Sync && read >= set.durable_below() => {
                set.wait_all_durable(read + 1).await
            }
            _ => Ok(()),
        }
    }
}

/// Armed while a commit is being applied: dropped armed (the commit's
/// future dropped by its caller mid-apply), it poisons the pool, which
/// refuses every later write and write-back. Logged (`.1`), so that no
/// checkpoint moves past the commit's record and the next open applies it
/// whole. Without a log, because the trees may hold part of the commit,
/// and its large values' map bits changed while leaves not yet updated
/// still name the extents it freed (an outside probe: later writes failed
/// with `Corrupt`, and `check` found tree pages free in the map).
struct DroppedMidApply<'a> {
    pool: &'a BufferPool,
    logged: bool,
    /// [`Committer::torn`], set before the commit's stripes are let go,
    /// for a commit that can be applied in part (several writes, or a
    /// large value's map bits): a single write is applied or not.
    torn: Option<&'a AtomicBool>,
}

impl DroppedMidApply<'_> {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for DroppedMidApply<'_> {
    fn drop(&mut self) {
        let what = if self.logged {
            "a commit's future was dropped after its record was logged and before it was \
             applied; reopen the database to finish it from the log"
        } else {
            "a commit's future was dropped while it was being applied (no log: the trees may \
             hold part of it); reopen the database (with Durability::Off, what was not \
             flushed may be lost)"
        };
        self.pool.poison(&Error::Poisoned(what.into()));
        // Reads are refused: the trees may hold part of the commit
        // (`Committer::refuse_torn`).
        if let Some(torn) = self.torn {
            torn.store(true, Ordering::Release);
        }
    }
}

/// What a commit's large values need, found under its key locks before
/// anything is reserved.
struct LargePlan {
    /// Indexes of the writes whose values go outside the leaves.
    writes: Vec<usize>,
    /// Pages they take.
    pages: u64,
    /// Extents of the references the commit replaces or deletes.
    freed: Vec<Extent>,
    /// References replaced or deleted.
    freed_values: i64,
}

/// The commit record's head for `writes` when the commit is logged.
fn commit_head(logged: bool, writes: &[Write<'_>]) -> Option<record::RecordBuilder> {
    (logged && !writes.is_empty()).then(|| record::commit_head(writes))
}

/// Log bytes a commit with record head `head` may append: the record, and
/// a full image of every one of `touched` pages the apply touches or
/// allocates (each `page_bytes` with its record header); 0 unlogged.
fn log_promise(head: Option<&record::RecordBuilder>, touched: u64, page_bytes: u64) -> u64 {
    head.map_or(0, |h| h.len() as u64 + 8 + touched * page_bytes)
}

/// What a commit's pass under its stripes found room for.
enum Prepared<'a> {
    /// Pages and log bytes, and the commit record's head.
    Small(Room<'a>, Option<record::RecordBuilder>),
    /// The pages of a commit storing or freeing large values (its log
    /// room is admitted once the values are stored).
    Large(Reservation<'a>),
}

/// The room a commit's apply may take: pages, and log bytes when logged.
struct Room<'a> {
    pages: Reservation<'a>,
    log: Option<LogReservation<'a>>,
}

impl<'a> Room<'a> {
    /// The room if it is there now (never waits: the caller holds key
    /// stripes); `log_bytes` 0 admits nothing to the log.
    fn now(
        pool: &'a BufferPool,
        log: Option<&'a Wal>,
        pages: u64,
        log_bytes: u64,
    ) -> Result<Option<Room<'a>>> {
        let Some(space) = pool.reserve_now(pages) else {
            return Ok(None);
        };
        let log = match log.filter(|_| log_bytes > 0) {
            Some(w) => match w.admit_now(log_bytes) {
                Some(r) => Some(r?),
                None => return Ok(None),
            },
            None => None,
        };
        Ok(Some(Room { pages: space, log }))
    }

    /// The room, waiting for it (the caller holds no stripe and no room:
    /// it may wait for other commits' promises of pages to end).
    async fn wait(
        pool: &'a BufferPool,
        log: Option<&'a Wal>,
        pages: u64,
        log_bytes: u64,
    ) -> Result<Room<'a>> {
        let space = pool.reserve_after_promises(pages).await?;
        let log = match log.filter(|_| log_bytes > 0) {
            Some(w) => Some(w.admit(log_bytes).await?),
            None => None,
        };
        Ok(Room { pages: space, log })
    }

    /// True if this room suffices for `pages` and `log_bytes`.
    fn covers(&self, pages: u64, log_bytes: u64) -> bool {
        self.pages.pages() >= pages
            && match &self.log {
                Some(l) => l.covers(log_bytes),
                None => log_bytes == 0,
            }
    }
}

/// Large values written and synced, ready for the commit record.
struct Written<'a> {
    holds: Vec<BlobHold<'a>>,
    taken: Vec<Extent>,
    /// Change of the count of large values.
    delta: i64,
    /// Map pages the space change may touch, plus the meta page.
    map_pages: u64,
}

impl Written<'_> {
    /// No large value written, none freed.
    fn none() -> Self {
        Written {
            holds: Vec::new(),
            taken: Vec::new(),
            delta: 0,
            map_pages: 0,
        }
    }

    /// True if the commit takes or frees extents.
    fn changes_space(&self) -> bool {
        self.map_pages > 0
    }
}

impl Committer {
    /// Finds the large values among `writes` and the references under
    /// their keys (only if the database holds any: the key locks make the
    /// count current for these keys).
    async fn store_large_values_prepare(&self, writes: &[Write<'_>]) -> Result<LargePlan> {
        let ps = self.pool.page_size();
        let inline_max = node::max_payload_len(ps);
        let mut plan = LargePlan {
            writes: Vec::new(),
            pages: 0,
            freed: Vec::new(),
            freed_values: 0,
        };
        for (i, w) in writes.iter().enumerate() {
            if let Some(v) = w.value.as_ref().filter(|v| v.len() > inline_max) {
                if v.len() > MAX_VALUE_LEN {
                    return Err(Error::ValueTooLarge {
                        len: v.len(),
                        max: MAX_VALUE_LEN,
                    });
                }
                plan.writes.push(i);
                plan.pages += (v.len() as u64).div_ceil(ps as u64);
            }
        }
        if self.pool.large_values() > 0 {
            for w in writes {
                if let Some(r) = BTree::open(&self.pool, w.tree).reference(&w.key).await? {
                    plan.freed.extend(r.extents);
                    plan.freed_values += 1;
                }
            }
        }
        Ok(plan)
    }

    /// Writes the large values of `plan` to extents held for them, syncs
    /// the devices, and puts their references in `writes`. Pages a tree
    /// or value used before are written only once the log is durable
    /// past their freeing (else a crash could bring back a page whose
    /// bytes this overwrote).
    async fn store_large_values<'a>(
        &'a self,
        writes: &mut [Write<'_>],
        plan: &LargePlan,
    ) -> Result<Written<'a>> {
        let ps = self.pool.page_size();
        let max_extents = blob::max_extents(node::max_payload_len(ps));
        let mut holds = Vec::with_capacity(plan.writes.len());
        for &i in &plan.writes {
            let v = writes[i].value.as_deref().unwrap_or(&[]);
            let pages = (v.len() as u64).div_ceil(ps as u64);
            let mut hold = self.pool.blob_hold(pages, max_extents).await?;
            // Bytes that would read as a valid page where they land go
            // elsewhere (`BufferPool::page_look_alike`): the holds tried
            // are kept until the value has its own, so each try takes
            // other pages.
            // Each try's pages are promised first, as the commit's were:
            // taken unpromised, they could be pages promised to commits
            // in flight (a review's finding).
            let mut tried = Vec::new();
            while let Some(pid) = self.pool.page_look_alike(hold.extents(), v) {
                if tried.len() + 1 == LOOK_ALIKE_TRIES {
                    return Err(Error::InvalidArgument(format!(
                        "a large value whose bytes read as a dana page wherever it was \
                         placed ({LOOK_ALIKE_TRIES} places; page {pid} the last): after a \
                         crash they could be taken for a page of the tree"
                    )));
                }
                let Some(promise) = self.pool.reserve_now(pages) else {
                    return Err(Error::NoSpace(format!(
                        "a large value whose bytes read as a dana page where it was placed \
                         (page {pid}) finds no room elsewhere"
                    )));
                };
                let other = self.pool.blob_hold(pages, max_extents).await?;
                tried.push((std::mem::replace(&mut hold, other), promise));
            }
            drop(tried);
            holds.push(hold);
        }
        // The map pages of every value and every freed extent, before
        // any byte is written (each hold checked its own only; a review's
        // finding).
        let taken: Vec<Extent> = holds
            .iter()
            .flat_map(|h| h.extents().iter().copied())
            .collect();
        self.pool.check_space_change(&taken, &plan.freed)?;
        if let (Some(w), true) = (&self.wal, holds.iter().any(BlobHold::reused)) {
            w.wait_all_durable(w.next_gsn()).await?;
        }
        for (h, &i) in holds.iter_mut().zip(&plan.writes) {
            let Some(v) = writes[i].value.take() else {
                continue;
            };
            let crc = h.write(&v).await?;
            let r = BlobRef {
                len: v.len() as u64,
                crc,
                extents: h.extents().to_vec(),
            };
            writes[i].value = Some(Cow::Owned(r.encode()));
            writes[i].reference = true;
        }
        if !holds.is_empty() {
            self.pool.sync_devices().await?;
        }
        let groups = blob::map_groups(self.pool.space_geometry(), taken.iter().chain(&plan.freed));
        let delta = holds.len() as i64 - plan.freed_values;
        // Every large value taken or freed has an extent, so no groups
        // means no space change at all.
        let map_pages = if groups.is_empty() {
            0
        } else {
            groups.len() as u64 + 1
        };
        Ok(Written {
            holds,
            taken,
            delta,
            map_pages,
        })
    }
}

/// The most pages applying `writes` can allocate: per insert or update,
/// one split per level plus a second page for a root split, plus one level
/// of slack for a root split by a concurrent commit; deletes allocate
/// nothing (merges only free).
async fn pages_needed(pool: &Arc<BufferPool>, writes: &[Write<'_>]) -> Result<u64> {
    let mut heights: BTreeMap<u64, u64> = BTreeMap::new();
    let mut pages = 0;
    for w in writes.iter().filter(|w| w.value.is_some()) {
        let h = match heights.get(&w.tree) {
            Some(&h) => h,
            None => {
                let h = u64::from(BTree::open(pool, w.tree).height().await?);
                heights.insert(w.tree, h);
                h
            }
        };
        pages += h + 2;
    }
    Ok(pages)
}

/// Applies a logged commit's writes to their trees, in order, as
/// [`apply`] with `reserved`; `at`: the GSN of the commit record and the
/// GSN after it, moved to the record of the writes left when the apply
/// appends one. The caller holds the log bytes admitted for the commit
/// (at most a quarter of the log) until the apply ends.
///
/// The commit record holds the redo point at or before it until the apply
/// ends, and the apply logs page images (a full image of every leaf at
/// its first change after a checkpoint began, and the pages of every
/// split and merge): a transaction touching more pages than the log holds
/// would fill it with records no checkpoint could get past, and the log
/// could no longer be flushed (one transaction deleting a key on each of
/// ~600 leaves of a 1 MiB log hung every commit for good; a review's
/// finding). So when the apply itself has appended a quarter of the log
/// (the most that admission counts one commit for; what other tasks
/// appended meanwhile is theirs, admitted), everything appended is made
/// durable, the writes left are appended as a commit record of their own
/// (in a later flush), which takes over as the one being applied, and the
/// apply waits until checkpoints have moved the redo point past the first
/// record: each writes back every page the writes before changed. Then it
/// goes on, within the room it was admitted with. (Waiting for admission
/// instead, for a new quarter, hung: the record being applied held the
/// redo point, and small commits admitted meanwhile could keep the log
/// too full for it for good; a review's finding.) Recovery re-applies
/// whichever records lie past its redo point: both (the first one's
/// writes again, then the rest again: the same keys, in the same order,
/// end the same), or the second alone (the first one's changes are on
/// the pages). Either is durable before a checkpoint that needs it: the
/// records lie in the log in that order, before the checkpoint's own.
async fn apply_logged(
    pool: &Arc<BufferPool>,
    log: &Arc<Wal>,
    writes: &[Write<'_>],
    at: &mut (u64, u64),
) -> Result<Vec<Applied>> {
    if writes.len() < 2 {
        // Nothing to continue after the first write: no look at the log
        // (its mutex, once per commit on the hot path of single-key
        // commits, for a mark no check would read).
        return apply(pool, writes, true, at.0).await;
    }
    let limit = log.capacity() / 4;
    // Bytes this apply appended since its record (or the last one).
    let mut own = wal::OwnAppends::default();
    let mut out = Vec::with_capacity(writes.len());
    for (i, w) in writes.iter().enumerate() {
        if i > 0 && own.bytes > limit {
            // Every flush from here on starts at or past `durable`.
            let durable = log.appended_end();
            log.flush_appended().await?;
            let rest = &writes[i..];
            let (gsn, end) = log.append_commit(record::commit(rest).into_unsealed(), 0)?;
            log.applied(at.0);
            log.count_continued_apply();
            *at = (gsn, end);
            own = wal::OwnAppends::default();
            log.wait_redo_past(durable).await?;
        }
        let applied = wal::own_appends(apply(pool, std::slice::from_ref(w), true, at.0), &mut own);
        out.extend(applied.await?);
    }
    Ok(out)
}

/// Applies writes to their trees, in order. `reserved`: the caller holds
/// a reservation covering the pages this may allocate (a commit); false
/// for recovery, which re-applies commits that had one (each key's last
/// write). `commit`: the LSN
/// of the commit record holding `writes` (0: no log), which covers their
/// leaf changes (the log's format: FORMAT.md).
pub(crate) async fn apply(
    pool: &Arc<BufferPool>,
    writes: &[Write<'_>],
    reserved: bool,
    commit: u64,
) -> Result<Vec<Applied>> {
    let mut out = Vec::with_capacity(writes.len());
    for w in writes {
        let t = BTree::for_commit(pool, w.tree, commit, reserved);
        let (replaced, read_gsn) = match &w.value {
            Some(v) if w.reference => t.put_reference(&w.key, v).await?,
            Some(v) => t.put_versioned(&w.key, v).await?,
            None => t.delete_versioned(&w.key).await?,
        };
        out.push(Applied { replaced, read_gsn });
    }
    Ok(out)
}
