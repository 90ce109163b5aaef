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
//!    fail for space fails here, and recovery, which re-applies logged
//!    commits, never needs more space than the database had), then the
//!    most log bytes it can append ([`Wal::admit`]: waits for a
//!    checkpoint if the log is too full);
//! 4. append one commit record holding all the writes (this is the commit
//!    point: recovery re-applies every commit record it finds);
//! 5. apply the writes to the trees (their page changes are logged after
//!    the commit record, so no page change of an uncommitted transaction
//!    ever reaches the log or the disk);
//! 6. release the locks and the reservation, then, with `Sync` durability, await the group
//!    flush that makes the commit record durable.
//!
//! Isolation: read committed, plus validation of every key a transaction
//! read and then wrote. Reads see committed data and the transaction's own
//! writes. Another commit's writes become visible to readers once its
//! record is in the log, before it is durable (early lock release): a
//! transaction that read them commits after it in the log, so a crash can
//! never keep the reader and lose the writer. A plain read outside a
//! transaction can see a write that a crash then loses (it was never
//! acknowledged). Not serializable: reads of keys a transaction does not
//! write are not validated, and scans take no range locks.
//!
//! Never: applies a write before its commit record is appended, or
//! acknowledges a `Sync` commit before its record is durable.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::btree::BTree;
use crate::buffer::BufferPool;
use crate::sched;
use crate::wal::record::{self, Write};
use crate::wal::{Durability, Wal};
use crate::{Error, Result};

/// Number of key lock stripes.
const STRIPES: usize = 4096;

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

    /// Locks the stripes of `keys`, yielding while one is taken.
    async fn lock<'a>(&'a self, keys: impl Iterator<Item = (u64, &'a [u8])>) -> StripeGuard<'a> {
        let mut s: Vec<usize> = keys.map(|(t, k)| Self::stripe(t, k)).collect();
        s.sort_unstable();
        s.dedup();
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
    pub(crate) wal: Option<Arc<Wal>>,
    pub(crate) locks: KeyLocks,
    pub(crate) durability: Durability,
    /// The database was opened read-only: every commit fails.
    pub(crate) read_only: bool,
    /// The database was closed: every handle fails.
    pub(crate) closed: AtomicBool,
    /// Roots of the trees dropped since open: reads and commits through a
    /// stale handle fail with [`Error::NoSuchTree`], and none is handed
    /// out as a new tree's root.
    pub(crate) dropped: Mutex<HashSet<u64>>,
    /// True once `dropped` has an entry (false, the common case: no lock
    /// taken).
    pub(crate) any_dropped: AtomicBool,
}

/// What applying one write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The key existed before.
    Replaced,
    /// The key did not exist.
    Fresh,
}

impl Committer {
    /// [`Error::Closed`] once closed; [`Error::ReadOnly`] for a write on
    /// a read-only database.
    pub(crate) fn live(&self, write: bool) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if write && self.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// [`Error::NoSuchTree`] if the tree at `root` was dropped.
    pub(crate) fn tree_alive(&self, root: u64) -> Result<()> {
        if self.was_dropped(root) {
            return Err(Error::NoSuchTree(format!(
                "the tree whose root was page {root} (dropped)"
            )));
        }
        Ok(())
    }

    /// True if the tree at `root` was dropped since open.
    pub(crate) fn was_dropped(&self, root: u64) -> bool {
        self.any_dropped.load(Ordering::Acquire)
            && self
                .dropped
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&root)
    }

    /// Refuses every later commit to the tree at `root` and waits for the
    /// commits writing to it now. Must run on a worker.
    pub(crate) async fn mark_dropped(&self, root: u64) {
        {
            let mut d = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
            d.insert(root);
            self.any_dropped.store(true, Ordering::Release);
        }
        self.locks.barrier().await;
    }

    /// Commits `writes` atomically after checking `checks`. Returns, per
    /// write, whether the key existed. Must run on a worker.
    pub(crate) async fn commit(
        &self,
        writes: Vec<Write>,
        checks: Vec<(u64, Vec<u8>, Expect)>,
        durability: Durability,
    ) -> Result<Vec<Applied>> {
        self.commit_at(writes, checks, durability)
            .await
            .map(|(a, _)| a)
    }

    /// [`Committer::commit`], also returning the LSN just after the commit
    /// record (0 without a log or without writes).
    pub(crate) async fn commit_at(
        &self,
        writes: Vec<Write>,
        checks: Vec<(u64, Vec<u8>, Expect)>,
        durability: Durability,
    ) -> Result<(Vec<Applied>, u64)> {
        self.live(true)?;
        if !sched::on_worker() {
            return Err(Error::WouldBlock);
        }
        if let Some(e) = self.pool.poisoned() {
            return Err(e);
        }
        let guard = self
            .locks
            .lock(writes.iter().map(|w| (w.tree, w.key.as_slice())))
            .await;
        for w in &writes {
            self.tree_alive(w.tree)?;
        }
        for (tree, key, expect) in &checks {
            let now = BTree::open(&self.pool, *tree).get(key).await?;
            match expect {
                Expect::Absent if now.is_some() => return Err(Error::KeyExists),
                Expect::Value(v) if *v != now => {
                    return Err(Error::Conflict(format!(
                        "a key of tree {tree} changed after this transaction read it"
                    )))
                }
                _ => {}
            }
        }
        let pages = pages_needed(&self.pool, &writes).await?;
        let space = self.pool.reserve(pages).await?;
        let (logged, log_space) = match &self.wal {
            Some(w) if !writes.is_empty() => {
                let rec = record::commit(&writes).into_unsealed();
                // Every page the apply touches or allocates may log a full
                // image.
                let page_bytes = (self.pool.page_size() + record::HEADER + 16) as u64;
                let touched = pages + writes.len() as u64;
                let r = w.admit(rec.len() as u64 + touched * page_bytes).await?;
                (Some(w.append_commit(rec)?), Some(r))
            }
            _ => (None, None),
        };
        let cover = logged.map_or(0, |(lsn, _)| lsn);
        let applied = apply(&self.pool, &writes, true, cover).await;
        drop(space);
        drop(log_space);
        if let (Some(w), Some((lsn, _))) = (&self.wal, logged) {
            w.applied(lsn);
        }
        drop(guard);
        let applied = match applied {
            Ok(a) => a,
            Err(e) => {
                // The commit record is in the log but the trees lack some
                // of its writes: refuse further writes; recovery on the
                // next open completes the commit.
                if logged.is_some() {
                    self.pool.poison(&Error::Poisoned(format!(
                        "a commit could not be applied: {e}"
                    )));
                }
                return Err(e);
            }
        };
        if let (Some(w), Some((_, end)), Durability::Sync) = (&self.wal, logged, durability) {
            w.wait_durable(end).await?;
        }
        Ok((applied, logged.map_or(0, |(_, end)| end)))
    }
}

/// The most pages applying `writes` can allocate: per insert or update,
/// one split per level plus a second page for a root split, plus one level
/// of slack for a root split by a concurrent commit; deletes allocate
/// nothing (merges only free).
async fn pages_needed(pool: &Arc<BufferPool>, writes: &[Write]) -> Result<u64> {
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

/// Applies writes to their trees, in order. `reserved`: the caller holds
/// a reservation covering the pages this may allocate (a commit); false
/// for recovery, which re-applies commits that had one. `commit`: the LSN
/// of the commit record holding `writes` (0: no log), which covers their
/// leaf changes (the log's format: FORMAT.md).
pub(crate) async fn apply(
    pool: &Arc<BufferPool>,
    writes: &[Write],
    reserved: bool,
    commit: u64,
) -> Result<Vec<Applied>> {
    let mut out = Vec::with_capacity(writes.len());
    for w in writes {
        let t = BTree::for_commit(pool, w.tree, commit, reserved);
        let existed = match &w.value {
            Some(v) => t.put(&w.key, v).await?,
            None => t.delete(&w.key).await?,
        };
        out.push(if existed {
            Applied::Replaced
        } else {
            Applied::Fresh
        });
    }
    Ok(out)
}
