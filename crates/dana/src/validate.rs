//! Serializable transactions: the read set, and the validation of it at
//! commit against the trees and against the commits in flight.
//!
//! Owns: [`Isolation`], a transaction's `ReadSet` (keys read with the
//! value seen, ranges scanned with the entries seen) and the registry of
//! keys being written by commits between their validation and the end of
//! their apply (`InFlight`).
//!
//! The protocol (optimistic, after Silo, Tu et al., SOSP 2013, with
//! value comparison in place of record versions):
//! 1. a committing transaction locks the stripes of the keys it writes
//!    (`txn.rs`) and then *registers* them here; they stay registered
//!    until its apply is done;
//! 2. a serializable transaction then validates: every key it read still
//!    has the value it saw, every range it scanned still holds exactly
//!    the entries it saw, and no *other* registered commit writes a key
//!    it read or one inside a range it scanned; any difference is
//!    [`Error::Conflict`] and nothing is applied.
//!
//! Why this is serializable: the transaction's point of serialization is
//! the end of its validation, when every read is current (equal values
//! are the same state for the reader: a value changed and changed back
//! by others is read as their last write, and they order before it).
//! A commit registered before that point either shows in the trees
//! (applied: compared) or in the registry (conflict); one registered
//! after it validates after this one's registration, so if it read a key
//! this one writes, it fails instead. Of two transactions that each read
//! what the other writes, the one that validates second fails.
//!
//! Never: blocks (a conflict fails at once; the caller retries), or holds
//! a registry lock across an await.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::btree::BTree;
use crate::buffer::{BufferPool, PageStamp};
use crate::wal::record::Write;
use crate::{Error, Result};

/// How much a transaction's reads are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Reads see committed data; a key the transaction reads and then
    /// writes is validated at commit (no lost update). Neither other
    /// reads nor scans are validated: phantoms and write skew are
    /// possible. Nothing is kept for keys only read. Another commit's
    /// writes become visible key by key as it applies them (after its
    /// record is logged, in tree and key order): two reads can see one
    /// of its writes and not another (a torn view of it), which only
    /// serializable validation refuses.
    #[default]
    ReadCommitted,
    /// Every read and every scanned range is validated at commit: the
    /// transaction commits only if the whole of what it read was still
    /// current at its commit, else [`Error::Conflict`] (run it again).
    /// The outcome is that of some serial order of the transactions
    /// (level 3 of ANSI SQL, what TPC-C asks of four of its five
    /// transactions). Read-only transactions are validated too: commit
    /// them to learn whether what they read was consistent. The
    /// transaction's own code runs before that: it may see a torn view
    /// of a commit being applied and is refused only at its commit, so it
    /// must not fail (panic, overflow) on values no serial order gives.
    Serializable,
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isolation::ReadCommitted => "read committed",
            Isolation::Serializable => "serializable",
        })
    }
}

/// A range a transaction scanned: bounds as far as the scan got, and the
/// tree's entries in them (not the transaction's own writes).
#[derive(Debug, Clone)]
pub(crate) struct RangeRead {
    pub(crate) tree: u64,
    pub(crate) lower: Bound<Vec<u8>>,
    pub(crate) upper: Bound<Vec<u8>>,
    /// The entries in the range, in ascending key order.
    pub(crate) seen: Vec<(Vec<u8>, Vec<u8>)>,
    /// The stamps of the leaves the scan read, which cover the range
    /// (None: not known, or a large value was read).
    pub(crate) leaves: Option<Vec<PageStamp>>,
}

/// A key a transaction read from a tree.
#[derive(Debug, Clone)]
pub(crate) struct PointRead {
    pub(crate) tree: u64,
    pub(crate) key: Vec<u8>,
    /// The value seen (None: absent).
    pub(crate) seen: Option<Vec<u8>>,
    /// The stamp of the leaf it was read from (None for a large value).
    pub(crate) stamp: Option<PageStamp>,
}

/// What a serializable transaction read, validated at its commit.
#[derive(Debug, Default)]
pub(crate) struct ReadSet {
    /// Keys read from the trees.
    pub(crate) points: Vec<PointRead>,
    /// Ranges scanned.
    pub(crate) ranges: Vec<RangeRead>,
}

impl ReadSet {
    /// True if nothing is to be validated.
    pub(crate) fn is_empty(&self) -> bool {
        self.points.is_empty() && self.ranges.is_empty()
    }
}

/// Registered keys by tree root.
type Shard = HashMap<u64, BTreeSet<Vec<u8>>>;

/// Number of registry shards (by tree).
const SHARDS: usize = 16;
/// Registration counters by a hash of tree and key: a validation's pass
/// over its point reads is whole only if none of its keys' counters moved.
const KEY_COUNTERS: usize = 4096;
/// Passes a validation makes before it gives up with a conflict, each
/// redone because a commit registered one of its keys (or a key of a
/// tree it scanned) meanwhile.
const VALIDATION_PASSES: usize = 8;

/// Keys of commits between registration and the end of their apply.
///
/// Commits register only once a serializable transaction has committed in
/// this database ([`InFlight::start`]): until then nobody looks, and the
/// registry costs nothing.
pub(crate) struct InFlight {
    shards: Box<[Mutex<Shard>]>,
    /// Registrations so far, by [`InFlight::key_counter`].
    key_registrations: Box<[AtomicU64]>,
    /// Registrations so far, by shard (tree).
    tree_registrations: Box<[AtomicU64]>,
    on: AtomicBool,
    /// Set once a barrier that began after `on` has ended: no commit that
    /// skipped registering is left.
    ready: AtomicBool,
}

/// Registered keys of one commit; unregistered on drop.
pub(crate) struct Registered<'a> {
    in_flight: &'a InFlight,
    keys: Vec<(u64, Vec<u8>)>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.in_flight.each_key(&self.keys, |s, tree, key| {
            if let Some(set) = s.get_mut(&tree) {
                set.remove(key);
                if set.is_empty() {
                    s.remove(&tree);
                }
            }
        });
    }
}

impl InFlight {
    pub(crate) fn new() -> InFlight {
        InFlight {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            key_registrations: (0..KEY_COUNTERS).map(|_| AtomicU64::new(0)).collect(),
            tree_registrations: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
            on: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        }
    }

    fn key_counter(tree: u64, key: &[u8]) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        tree.hash(&mut h);
        key.hash(&mut h);
        h.finish() as usize % KEY_COUNTERS
    }

    /// The registration counters a validation of `reads` depends on.
    fn counters<'a>(&'a self, reads: &ReadSet) -> Vec<&'a AtomicU64> {
        let points = (reads.points.iter())
            .map(|p| &self.key_registrations[Self::key_counter(p.tree, &p.key)]);
        let ranges =
            (reads.ranges.iter()).map(|r| &self.tree_registrations[Self::shard_of(r.tree)]);
        points.chain(ranges).collect()
    }

    fn shard_of(tree: u64) -> usize {
        (tree ^ (tree >> 17)) as usize % SHARDS
    }

    fn shard(&self, tree: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[Self::shard_of(tree)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on each of `keys` under its tree's shard lock, taking a
    /// shard once per run of keys in it (a commit's writes come sorted by
    /// tree) and never two at once.
    fn each_key(&self, keys: &[(u64, Vec<u8>)], mut f: impl FnMut(&mut Shard, u64, &[u8])) {
        let mut held: Option<(usize, std::sync::MutexGuard<'_, Shard>)> = None;
        for (tree, key) in keys {
            let i = Self::shard_of(*tree);
            let s = match &mut held {
                Some((h, s)) if *h == i => s,
                _ => {
                    // Release the shard held before taking the next.
                    held = None;
                    &mut held.insert((i, self.shard(*tree))).1
                }
            };
            f(s, *tree, key);
        }
    }

    /// True if commits register their keys.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Turns registration on. Until a barrier begun after it has ended
    /// ([`InFlight::set_ready`]), a validating commit must wait for the
    /// commits that may have skipped registering (those holding key
    /// stripes now: `KeyLocks::barrier`), holding no stripe itself.
    pub(crate) fn start(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// True once a barrier begun after registration was on has ended
    /// ([`InFlight::set_ready`]): every commit in flight registered.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Records that a barrier begun after [`InFlight::start`] ended.
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Registers the keys of `writes` (the caller holds their stripes) if
    /// registration is on.
    pub(crate) fn register(&self, writes: &[Write<'_>]) -> Registered<'_> {
        let mut keys = Vec::new();
        if self.is_on() {
            keys = writes.iter().map(|w| (w.tree, w.key.clone())).collect();
            self.each_key(&keys, |s, tree, key| {
                // Counted under the shard's lock, before the key shows.
                self.key_registrations[Self::key_counter(tree, key)].fetch_add(1, Ordering::SeqCst);
                self.tree_registrations[Self::shard_of(tree)].fetch_add(1, Ordering::SeqCst);
                s.entry(tree).or_default().insert(key.to_vec());
            });
        }
        Registered {
            in_flight: self,
            keys,
        }
    }

    /// True if a commit other than the caller (whose writes are `own`,
    /// sorted by tree and key) is writing `key` of `tree`.
    fn other_writes(&self, tree: u64, key: &[u8], own: &[(u64, &[u8])]) -> bool {
        let s = self.shard(tree);
        s.get(&tree).is_some_and(|set| set.contains(key)) && !owns(own, tree, key)
    }

    /// True if a commit other than the caller writes a key of `tree` in
    /// the range.
    fn other_writes_in(
        &self,
        tree: u64,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        own: &[(u64, &[u8])],
    ) -> bool {
        let s = self.shard(tree);
        let Some(set) = s.get(&tree) else {
            return false;
        };
        if !range_valid(lower, upper) {
            return false;
        }
        let r = (as_slice(lower), as_slice(upper));
        let hit = set
            .range::<[u8], _>(r)
            .any(|k| !owns(own, tree, k.as_slice()));
        hit
    }
}

/// True if `(tree, key)` is among `own` (sorted).
fn owns(own: &[(u64, &[u8])], tree: u64, key: &[u8]) -> bool {
    own.binary_search_by(|(t, k)| (*t, *k).cmp(&(tree, key)))
        .is_ok()
}

fn as_slice(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// False for a range that holds no key (BTreeSet::range panics on one
/// whose start is past its end).
pub(crate) fn range_valid<T: Ord>(lower: &Bound<T>, upper: &Bound<T>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l <= u,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u)) => l < u,
        _ => true,
    }
}

fn conflict(what: &str, tree: u64) -> Error {
    Error::Conflict(format!(
        "{what} of tree {tree} changed after this transaction read it"
    ))
}

/// Validates `reads` for a commit whose writes are `writes` (registered
/// already, when registration is on). Returns the most page GSN seen (the
/// commit depends on it). Must run on a worker.
///
/// A pass compares key by key, so it is whole only if no commit applied a
/// write to a key it read while it ran. A commit registered before the
/// pass began is either seen registered at one of its keys (a conflict)
/// or was applied before the pass reached its first key; one that
/// registered since moved a registration counter of the pass's keys, and
/// the pass runs again (at most [`VALIDATION_PASSES`] times, then a
/// conflict). Values compared, not versions: a key written and written
/// back reads as before, so without this a pass could find every key as
/// seen while those it compared early and late came from either side of
/// a commit, and a read-only audit of transfers committed a total off by
/// one (an outside probe: 1-2 in 55k-80k audits, in 6 of 16 runs).
pub(crate) async fn validate(
    pool: &Arc<BufferPool>,
    in_flight: &InFlight,
    reads: &ReadSet,
    writes: &[Write<'_>],
) -> Result<u64> {
    debug_assert!(in_flight.is_on(), "validation without registration");
    let counters = in_flight.counters(reads);
    let now = || counters.iter().map(|c| c.load(Ordering::SeqCst));
    for _ in 0..VALIDATION_PASSES {
        let before: Vec<u64> = now().collect();
        let dep = validation_pass(pool, in_flight, reads, writes).await?;
        if now().eq(before) {
            return Ok(dep);
        }
    }
    Err(Error::Conflict(format!(
        "other commits wrote keys this transaction read while it validated, {VALIDATION_PASSES} times"
    )))
}

/// One pass of [`validate`].
async fn validation_pass(
    pool: &Arc<BufferPool>,
    in_flight: &InFlight,
    reads: &ReadSet,
    writes: &[Write<'_>],
) -> Result<u64> {
    let mut own: Vec<(u64, &[u8])> = writes.iter().map(|w| (w.tree, w.key.as_slice())).collect();
    own.sort_unstable();
    let mut dep = 0;
    for p in &reads.points {
        if in_flight.other_writes(p.tree, &p.key, &own) {
            return Err(conflict("a key", p.tree));
        }
        // The leaf unchanged since the read: so is the key's value (the
        // read's GSN is in the transaction's read GSN already).
        if p.stamp.is_some_and(|s| pool.unchanged(s)) {
            continue;
        }
        let (now, gsn) = BTree::open(pool, p.tree).get_versioned(&p.key).await?;
        dep = dep.max(gsn);
        if now != p.seen {
            return Err(conflict("a key", p.tree));
        }
    }
    for r in &reads.ranges {
        if in_flight.other_writes_in(r.tree, &r.lower, &r.upper, &own) {
            return Err(conflict("a scanned range", r.tree));
        }
        // Every leaf the scan read unchanged: so are the entries between.
        if r.leaves
            .as_ref()
            .is_some_and(|l| l.iter().all(|&s| pool.unchanged(s)))
        {
            continue;
        }
        let t = BTree::open(pool, r.tree);
        let mut c = t.cursor(as_slice(&r.lower), as_slice(&r.upper), true);
        let mut seen = r.seen.iter();
        loop {
            let now = c.next().await?;
            let same = match (&now, seen.next()) {
                (None, None) => break,
                (Some((k, v)), Some((sk, sv))) => k == sk && v == sv,
                _ => false,
            };
            if !same {
                return Err(conflict("a scanned range", r.tree));
            }
        }
        dep = dep.max(c.max_gsn());
    }
    Ok(dep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_sees_others_not_the_caller() {
        let f = InFlight::new();
        assert!(!f.is_on());
        f.start();
        assert!(f.is_on() && !f.is_ready());
        let w = [
            Write::new(7, b"b".to_vec(), Some(b"1".to_vec())),
            Write::new(7, b"d".to_vec(), None),
        ];
        let g = f.register(&w);
        let none: [(u64, &[u8]); 0] = [];
        let mine: [(u64, &[u8]); 2] = [(7, b"b"), (7, b"d")];
        assert!(f.other_writes(7, b"b", &none));
        assert!(!f.other_writes(7, b"b", &mine));
        assert!(!f.other_writes(7, b"c", &none));
        assert!(!f.other_writes(8, b"b", &none));
        let inc = |k: &[u8]| Bound::Included(k.to_vec());
        let exc = |k: &[u8]| Bound::Excluded(k.to_vec());
        assert!(f.other_writes_in(7, &inc(b"a"), &inc(b"b"), &none));
        assert!(!f.other_writes_in(7, &inc(b"a"), &exc(b"b"), &none));
        assert!(!f.other_writes_in(7, &exc(b"b"), &exc(b"d"), &none));
        assert!(f.other_writes_in(7, &Bound::Unbounded, &Bound::Unbounded, &none));
        assert!(!f.other_writes_in(7, &Bound::Unbounded, &Bound::Unbounded, &mine));
        // An empty range (start past end) holds nothing and does not panic.
        assert!(!f.other_writes_in(7, &inc(b"z"), &inc(b"a"), &none));
        assert!(!f.other_writes_in(7, &exc(b"b"), &inc(b"b"), &none));
        drop(g);
        assert!(!f.other_writes(7, b"b", &none));
        assert!(f.shard(7).is_empty());
    }

    #[test]
    fn nothing_registers_until_a_serializable_commit_starts_it() {
        let f = InFlight::new();
        let w = [Write::new(1, b"k".to_vec(), None)];
        let g = f.register(&w);
        assert!(g.keys.is_empty());
        assert!(!f.other_writes(1, b"k", &[]));
    }
}
