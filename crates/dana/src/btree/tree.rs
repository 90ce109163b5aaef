//! A B+tree on buffer-pool pages.
//!
//! Owns: the algorithms over nodes: descent with optimistic lock coupling,
//! leaf latching, insert / put / update / delete, splits and merges, and
//! range cursors. The node byte format is [`super::node`]'s.
//!
//! Concurrency: a descent reads inner nodes optimistically (no latch: read,
//! then validate the version; after fixing a child, validate the parent,
//! else restart from the root). The leaf is then latched shared (reads) or
//! exclusive (writes) and the parent validated once more, so the leaf is
//! the right one. A full leaf is split pessimistically: the operation
//! releases its leaf, latches parent and node exclusively (splitting the
//! parent first if it has no room for the separator), splits, and restarts.
//! The root never moves: a root split moves its contents into two new
//! children, so the catalogue never changes on a split.
//!
//! Point reads look in the pool's record cache first
//! ([`crate::buffer::records`]) and fill it from the leaf on a miss; every
//! write of a key invalidates it there while the key's leaf is latched
//! exclusively (the cache's coherence rests on that).
//!
//! Never: holds a latch while waiting for another latch in the reverse
//! order (parent before child, left before right, always); trusts node
//! bytes it read optimistically before validating them.

use std::ops::Bound;
use std::sync::Arc;

use super::node::{self, Node, NodeMut};
use crate::buffer::blob::BlobRef;
use crate::buffer::records::{Lookup, Ticket};
use crate::buffer::{
    page, BufferPool, PageMut, PageOptimistic, PageRef, PageStamp, PageType, StructureGuard,
};
use crate::sched;
use crate::{Error, Result};

/// Restarts of one descent before it is reported as a problem.
const MAX_RESTARTS: usize = 100_000;
/// No tree is this tall (a fanout of at least 4 at 2^64 pages).
pub const MAX_HEIGHT: u32 = 40;

/// The error of a path from the root longer than [`MAX_HEIGHT`] (a cycle
/// of child pointers), found at inner node `pid`.
fn too_deep(pid: u64) -> Error {
    Error::Corrupt {
        page: pid,
        what: format!("a path longer than {MAX_HEIGHT} levels (a cycle of child pointers?)"),
    }
}
/// Unexplained descents (see `find_leaf`) before the tree is called corrupt.
const STABLE_MISSES: u32 = 3;
/// Latch or validation retries of one operation between two yields.
const SPINS_PER_YIELD: u32 = 8;
/// Optimistic descents of one operation undone (a node changed or left
/// the pool under it) before it descends holding its path
/// ([`Tree::find_leaf`]'s held descent).
const HOLD_AFTER: u32 = 16;
/// Most leaves a cursor reads ahead. It starts with one and doubles with
/// every leaf it moves to (like the OS's file read-ahead), so a short scan
/// does not read leaves it will never visit.
const READ_AHEAD: usize = 8;
/// Most leaves a cursor told how many entries its caller wants
/// ([`Cursor::with_len_hint`]) reads ahead: as many as those entries
/// need, estimated from the entries per leaf of the leaf just read.
const READ_AHEAD_HINTED: usize = 32;
/// A leaf below this fill factor after a delete is merged with its right
/// sibling if the two fit in one page.
const MERGE_BELOW: f64 = 0.25;

/// The longest value a tree holds (a large value: stored outside the
/// leaves, see `buffer/blob.rs`).
pub const MAX_VALUE_LEN: usize = 1 << 32;

/// What a key holds: a value in the leaf, or a large value's reference.
enum Stored {
    Value(Vec<u8>),
    Reference(BlobRef),
}

/// A B+tree whose root lives at a fixed page id.
#[derive(Clone)]
pub struct BTree {
    pool: Arc<BufferPool>,
    root: u64,
    /// Splits may take pages reserved for a commit (the caller holds a
    /// [`crate::buffer::alloc::Reservation`] covering them).
    reserved: bool,
    /// Nonzero: the LSN of the commit record whose apply this is; leaf
    /// changes are covered by it (not logged again).
    cover: u64,
    /// A commit's apply (or its redo): it may replace or delete a large
    /// value's reference (the commit frees the extents). Other writes may
    /// not: they would leak them.
    commit: bool,
}

/// What an optimistic look at an inner node found.
enum Step {
    Leaf,
    Child(u64),
    NotCovered,
    Corrupt(String),
}

fn corrupt(pid: u64) -> impl FnOnce(node::Corrupt) -> Error {
    move |c| c.into_error(pid)
}

/// Checks the node in latched page `pid` for the write path
/// ([`node::check_writable`], and its page type against its leaf flag),
/// once since the page came into its frame
/// ([`PageMut::contents_checked`]). `NodeMut`'s arithmetic trusts slot
/// offsets and lengths, the heap's use and the prefix, which the header
/// check of [`Node::new`] does not cover: a page forged with a valid
/// checksum made an insert or an update panic (a review's finding;
/// `node::split`, `merge` and `cut_leaf` check their inputs whole). One
/// check per arrival, not per change: a resident leaf's inserts pay
/// nothing.
pub(crate) fn checked(g: &PageMut<'_>, pid: u64) -> Result<()> {
    if g.contents_checked() {
        return Ok(());
    }
    node::check_writable(g).map_err(corrupt(pid))?;
    let leaf = Node::new(g).map_err(corrupt(pid))?.is_leaf();
    let kind = if leaf {
        PageType::Leaf
    } else {
        PageType::Inner
    };
    if page::page_type(g) != Some(kind) {
        return Err(Error::Corrupt {
            page: pid,
            what: format!(
                "a node whose flags say {kind:?} in a page of type {:?}",
                page::page_type(g)
            ),
        });
    }
    g.set_contents_checked();
    Ok(())
}

/// A [`NodeMut`] over latched page `pid`, [`checked`] first.
pub(crate) fn node_mut<'a>(g: &'a mut PageMut<'_>, pid: u64) -> Result<NodeMut<'a>> {
    checked(g, pid)?;
    NodeMut::new(g).map_err(corrupt(pid))
}

/// True if `e`, met fixing a page that node `named_by` named, says only
/// that the page was freed and reused since (a free page, or a large
/// value's bytes that fail the page checksum): the node no longer
/// validates, so the caller looks again. With the node still valid (or
/// none: the root) the error is real.
fn freed_since(e: &Error, named_by: Option<&impl Watched>) -> bool {
    matches!(e, Error::Corrupt { .. }) && named_by.is_some_and(|n| !n.still_valid())
}

/// A node on a held descent's path that does not cover the key: nothing
/// changes under the latches, so only damage explains it.
fn off_path_under_latches(pid: u64) -> Error {
    Error::Corrupt {
        page: pid,
        what: "the node on the path does not cover the key".into(),
    }
}

/// A node whose child id a descent followed, watched for changes.
trait Watched {
    /// True if the node is unchanged since its child's id was read.
    fn still_valid(&self) -> bool;
}

impl Watched for PageOptimistic<'_> {
    fn still_valid(&self) -> bool {
        self.validate()
    }
}

/// What one optimistic look for a node's parent found.
enum Look {
    /// The parent, or None: the node is no longer on the key's path.
    Found(Option<u64>),
    /// A node changed under the look: look again.
    Undone,
}

/// The parent a descent found a leaf through: watched optimistically, or
/// latched shared by a held descent (with the pool's structure guard,
/// which allows its holder to wait for frames while it holds latches):
/// then it cannot change, nor leave the pool, until dropped.
enum Parent<'a> {
    Watched(PageOptimistic<'a>),
    Held {
        _latch: PageRef<'a>,
        _guard: StructureGuard<'a>,
    },
}

impl Watched for Parent<'_> {
    fn still_valid(&self) -> bool {
        match self {
            Parent::Watched(p) => p.validate(),
            Parent::Held { .. } => true,
        }
    }
}

/// The slot of child `pid` on `key`'s path in inner node `p` and the id
/// of its right sibling under `p`; None when `pid` is the upper child (no
/// right sibling here) or no longer on the path.
fn right_sibling(p: &Node, pid: u64, key: &[u8]) -> Option<(usize, u64)> {
    let (i, _) = p.lower_bound(key);
    if p.is_leaf() || i >= p.len() || p.child_at(i) != pid {
        return None;
    }
    let right = if i + 1 < p.len() {
        p.child_at(i + 1)
    } else {
        p.upper_child()
    };
    Some((i, right))
}

fn look(bytes: &[u8], key: &[u8]) -> Step {
    match Node::new(bytes) {
        Ok(n) if !n.covers(key) => Step::NotCovered,
        Ok(n) if n.is_leaf() => Step::Leaf,
        Ok(n) => Step::Child(n.child_for(key)),
        Err(e) => Step::Corrupt(e.to_string()),
    }
}

/// The key just above `k` (for moving to the next leaf).
fn successor(k: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(k.len() + 1);
    v.extend_from_slice(k);
    v.push(0);
    v
}

/// Most times [`BTree::update`] runs its function on a key that keeps
/// changing under it (only unlogged bulk writes can: every other write of
/// the key waits for the stripe the update holds).
const UPDATE_ATTEMPTS: usize = 64;

impl BTree {
    /// Creates an empty tree (one leaf, which is its root forever).
    pub async fn create(pool: &Arc<BufferPool>) -> Result<BTree> {
        let mut root = pool.allocate(PageType::Leaf).await?;
        node::init(&mut root, true, None, None, 0);
        let pid = root.pid();
        drop(root);
        Ok(BTree::open(pool, pid))
    }

    /// The tree whose root is page `root`.
    pub fn open(pool: &Arc<BufferPool>, root: u64) -> BTree {
        BTree {
            pool: pool.clone(),
            root,
            reserved: false,
            cover: 0,
            commit: false,
        }
    }

    /// The tree at `root` for applying the commit whose record is at LSN
    /// `commit` (0: no log): its leaf changes are covered by that record
    /// (see [`PageMut::cover`]: not logged again), and with `reserved` its
    /// splits may take the pages the commit reserved.
    pub(crate) fn for_commit(
        pool: &Arc<BufferPool>,
        root: u64,
        commit: u64,
        reserved: bool,
    ) -> BTree {
        BTree {
            pool: pool.clone(),
            root,
            reserved,
            cover: commit,
            commit: true,
        }
    }

    /// Room in the log for a write that is not a commit's apply (a
    /// commit's was admitted with its commit): the leaf, a split
    /// cascade's pages and the meta and map pages, as full images.
    /// None for a commit's apply or without a log.
    /// Fails once the pool is stopped ([`BufferPool::poisoned`]): such a
    /// write could never reach the disk (a stopped database without a
    /// log acknowledged plain writes that its close then dropped; an
    /// outside probe).
    async fn admit_unlogged(&self) -> Result<Option<crate::buffer::page_log::LogRoom>> {
        if self.commit {
            return Ok(None);
        }
        if let Some(e) = self.pool.poisoned() {
            return Err(e);
        }
        self.pool.admit_log(8).await
    }

    /// Levels from the root to the leaves (1: the root is a leaf), read
    /// along the leftmost path without latches.
    pub async fn height(&self) -> Result<u32> {
        let mut restarts = 0u64;
        'restart: loop {
            restarts += 1;
            if restarts > 1 {
                sched::yield_now().await;
            }
            if restarts > MAX_RESTARTS as u64 {
                return Err(Error::Corrupt {
                    page: self.root,
                    what: "the leftmost path keeps changing".into(),
                });
            }
            let mut pid = self.root;
            let mut levels = 1u32;
            let mut parent: Option<PageOptimistic<'_>> = None;
            loop {
                let cur = match self.pool.fix_optimistic(pid).await {
                    Ok(c) => c,
                    Err(e) if freed_since(&e, parent.as_ref()) => continue 'restart,
                    Err(e) => return Err(e),
                };
                let Some(step) = cur.with_bytes(|b| look(b, &[])) else {
                    continue 'restart;
                };
                // A merge may have freed this node (zeroed, or reused)
                // after the parent named it: only a parent unchanged since
                // makes what was read here its child (a false Corrupt
                // failed innocent commits; a review's finding).
                if parent.as_ref().is_some_and(|p| !p.validate()) {
                    continue 'restart;
                }
                match step {
                    Step::Leaf => return Ok(levels),
                    Step::Child(c) => {
                        if !cur.validate() {
                            continue 'restart;
                        }
                        parent = Some(cur);
                        pid = c;
                        levels += 1;
                        if levels > MAX_HEIGHT {
                            return Err(too_deep(pid));
                        }
                    }
                    Step::NotCovered => continue 'restart,
                    Step::Corrupt(what) => return Err(Error::Corrupt { page: pid, what }),
                }
            }
        }
    }

    /// The root page id.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// The buffer pool.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// Longest key accepted.
    pub fn max_key_len(&self) -> usize {
        node::max_key_len(self.pool.page_size())
    }

    /// Longest value accepted.
    pub fn max_value_len(&self) -> usize {
        node::max_payload_len(self.pool.page_size())
    }

    /// Checks a key and an optional value against the size limits.
    pub fn check_sizes(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.check_key(key)?;
        value.map_or(Ok(()), |v| self.check_value(v))
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        let max = self.max_key_len();
        if key.len() > max {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        let max = self.max_value_len();
        if value.len() > max {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max,
            });
        }
        Ok(())
    }

    // ---- descent --------------------------------------------------------

    /// Descends to the leaf covering `key` and returns its page id and the
    /// optimistic handle of its parent (None when the root is the leaf).
    /// Also reports the page ids of the leaf's siblings under the same
    /// parent, in `ahead`'s direction, when `ahead` is given (as many as
    /// it asks, and only those that can hold keys within its bound).
    async fn find_leaf(
        &self,
        key: &[u8],
        mut ahead: Option<&mut Siblings<'_>>,
        hold: bool,
    ) -> Result<(u64, Option<Parent<'_>>)> {
        if hold {
            return self.find_leaf_held(key, ahead).await;
        }
        let mut restarts = 0u64;
        // Descents that found a node not covering the key while it and
        // its parent were both unchanged: only damage explains that, so a
        // few of them (never contention alone) end the descent with an
        // error.
        let mut stable_misses = 0;
        #[allow(clippy::never_loop)]
        'restart: loop {
            restarts += 1;
            if stable_misses >= STABLE_MISSES {
                return Err(Error::Corrupt {
                    page: self.root,
                    what: "no node on the path covers the key".into(),
                });
            }
            if restarts > 1 {
                sched::yield_now().await;
            }
            if restarts > HOLD_AFTER as u64 {
                return self.find_leaf_held(key, ahead).await;
            }
            let mut parent: Option<PageOptimistic<'_>> = None;
            let mut pid = self.root;
            let mut cur = self.pool.fix_optimistic(pid).await?;
            let mut levels = 0u32;
            loop {
                let Some(step) = cur.with_bytes(|b| look(b, key)) else {
                    continue 'restart;
                };
                match step {
                    Step::Leaf => {
                        if let Some(p) = &parent {
                            if !p.validate() {
                                continue 'restart;
                            }
                        }
                        return Ok((pid, parent.map(Parent::Watched)));
                    }
                    Step::Child(child) => {
                        if let Some(ahead) = ahead.as_deref_mut() {
                            ahead.pids.clear();
                            // A torn optimistic read leaves a partial list:
                            // the validation below restarts the descent.
                            cur.with_bytes(|b| ahead.collect(b, key));
                        }
                        let next = match self.pool.fix_optimistic(child).await {
                            Ok(n) => n,
                            Err(e) if freed_since(&e, Some(&cur)) => continue 'restart,
                            Err(e) => return Err(e),
                        };
                        if !cur.validate() {
                            continue 'restart;
                        }
                        levels += 1;
                        if levels > MAX_HEIGHT {
                            // A cycle of child pointers (damage that kept
                            // its checksums), or a path no tree has: an
                            // error, never a descent that does not end.
                            return Err(too_deep(pid));
                        }
                        parent = Some(cur);
                        cur = next;
                        pid = child;
                    }
                    Step::NotCovered => {
                        if cur.validate() && parent.as_ref().is_none_or(|p| p.validate()) {
                            stable_misses += 1;
                        }
                        continue 'restart;
                    }
                    Step::Corrupt(what) => {
                        // A merge may have freed this node after we read
                        // its id: only a still-valid parent makes it real.
                        if parent.as_ref().is_some_and(|p| !p.validate()) {
                            continue 'restart;
                        }
                        return Err(Error::Corrupt { page: pid, what });
                    }
                }
            }
        }
    }

    /// [`Tree::find_leaf`] holding its path: each node latched shared
    /// until its child is latched, the leaf's parent still latched on
    /// return, under the pool's structure guard (the reads may wait for
    /// frames while a latch is held: only the guard's holder may).
    ///
    /// For a descent that optimistic ones cannot finish: in a pool with
    /// fewer frames than the tasks' paths need, the pages a descent read
    /// were evicted by the others' misses before it reached the leaf,
    /// and its parent's check failed again and again (256 tasks putting
    /// 1,000-byte values into a pool of [`crate::MIN_POOL_FRAMES`]
    /// frames made ~47 page reads per put, ~500 puts a second; with
    /// held descents ~16 and ~900). A held path cannot be evicted under
    /// it, so each held descent ends; one at a time, so the held pages
    /// stay few.
    async fn find_leaf_held(
        &self,
        key: &[u8],
        mut ahead: Option<&mut Siblings<'_>>,
    ) -> Result<(u64, Option<Parent<'_>>)> {
        let guard = self.pool.structure_change().await;
        self.pool.note_held_descent();
        let mut pid = self.root;
        let mut cur = self.pool.fix_shared(pid).await?;
        let mut parent: Option<PageRef<'_>> = None;
        let mut levels = 0u32;
        loop {
            match look(&cur, key) {
                Step::Leaf => {
                    drop(cur);
                    return Ok((
                        pid,
                        parent.map(|p| Parent::Held {
                            _latch: p,
                            _guard: guard,
                        }),
                    ));
                }
                Step::Child(child) => {
                    if let Some(ahead) = ahead.as_deref_mut() {
                        ahead.pids.clear();
                        ahead.collect(&cur, key);
                    }
                    levels += 1;
                    if levels > MAX_HEIGHT {
                        return Err(too_deep(pid));
                    }
                    let next = self.pool.fix_shared(child).await?;
                    // The grandparent goes; the parent stays latched.
                    parent = Some(cur);
                    cur = next;
                    pid = child;
                }
                // Nothing changes under the latches: only damage explains
                // a node that does not cover the key.
                Step::NotCovered => return Err(off_path_under_latches(pid)),
                Step::Corrupt(what) => return Err(Error::Corrupt { page: pid, what }),
            }
        }
    }

    /// The leaf covering `key`, latched shared.
    async fn leaf_shared(
        &self,
        key: &[u8],
        mut ahead: Option<&mut Siblings<'_>>,
    ) -> Result<PageRef<'_>> {
        let mut tries = 0u32;
        loop {
            tries = tries.wrapping_add(1);
            let hold = tries > HOLD_AFTER;
            let (pid, parent) = self.find_leaf(key, ahead.as_deref_mut(), hold).await?;
            let g = match self.pool.fix_shared(pid).await {
                Ok(g) => g,
                Err(e) if freed_since(&e, parent.as_ref()) => continue,
                Err(e) => return Err(e),
            };
            if parent.as_ref().is_none_or(|p| p.still_valid()) {
                let n = Node::new(&g).map_err(corrupt(pid))?;
                if n.is_leaf() && n.covers(key) {
                    return Ok(g);
                }
            }
            drop(g);
            // A held parent (its latch and the structure guard) goes
            // before the yield.
            drop(parent);
            if tries % SPINS_PER_YIELD == 0 {
                sched::yield_now().await;
            }
        }
    }

    /// The leaf covering `key`, latched exclusively.
    async fn leaf_exclusive(&self, key: &[u8]) -> Result<PageMut<'_>> {
        let mut tries = 0u32;
        loop {
            tries = tries.wrapping_add(1);
            let hold = tries > HOLD_AFTER;
            let (pid, parent) = self.find_leaf(key, None, hold).await?;
            // A commit's apply: the change is covered, no page copy needed.
            let fixed = if self.cover != 0 {
                self.pool.fix_exclusive_covered(pid).await
            } else {
                self.pool.fix_exclusive(pid).await
            };
            let g = match fixed {
                Ok(g) => g,
                Err(e) if freed_since(&e, parent.as_ref()) => continue,
                Err(e) => return Err(e),
            };
            if parent.as_ref().is_none_or(|p| p.still_valid()) {
                let n = Node::new(&g).map_err(corrupt(pid))?;
                if n.is_leaf() && n.covers(key) {
                    // Every write of `key` latches its leaf here: the
                    // cached record goes while the leaf is ours (the
                    // cache's coherence, `buffer::records`).
                    self.pool.records().invalidate(self.root, key);
                    return Ok(g);
                }
            }
            drop(g);
            // A held parent (its latch and the structure guard) goes
            // before the yield.
            drop(parent);
            if tries % SPINS_PER_YIELD == 0 {
                sched::yield_now().await;
            }
        }
    }

    // ---- reads ----------------------------------------------------------

    /// The value of `key`, if present (a large value is read whole from
    /// its extents and its checksum verified).
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.get_raw(key).await?.0 {
            Some((_, true)) => self.get_large(key).await,
            other => Ok(other.map(|(v, _)| v)),
        }
    }

    /// [`BTree::get`], with the GSN of the leaf read (at least the GSN of
    /// the change that wrote the value returned, or removed it): a commit
    /// that used the value depends on the logs up to there.
    pub async fn get_versioned(&self, key: &[u8]) -> Result<(Option<Vec<u8>>, u64)> {
        let (v, gsn, _) = self.get_stamped(key).await?;
        Ok((v, gsn))
    }

    /// [`BTree::get_versioned`], and the stamp of the leaf the value (or
    /// its absence) was read from: while that leaf is unchanged
    /// ([`BufferPool::unchanged`]) so is what `key` holds. None for a
    /// large value (its bytes live outside the leaf).
    pub async fn get_stamped(
        &self,
        key: &[u8],
    ) -> Result<(Option<Vec<u8>>, u64, Option<PageStamp>)> {
        match self.get_raw(key).await? {
            (Some((_, true)), gsn, _) => {
                let v = self.get_large(key).await?;
                // The leaf again: the value may have changed in between.
                let (_, again, _) = self.get_raw(key).await?;
                Ok((v, gsn.max(again), None))
            }
            (other, gsn, stamp) => Ok((other.map(|(v, _)| v), gsn, stamp)),
        }
    }

    /// Applies `f` to the value of `key` (no copy for a value stored in
    /// the leaf), if present.
    pub async fn get_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        self.check_key(key)?;
        let records = self.pool.records();
        let ticket = match self.cached(key) {
            Ok((v, _)) => return Ok(Some(f(&v))),
            Err(ticket) => ticket,
        };
        {
            let g = self.leaf_shared(key, None).await?;
            let n = Node::new(&g).map_err(corrupt(g.pid()))?;
            match n.get_entry(key) {
                None => return Ok(None),
                Some((v, false)) => {
                    if let Some(t) = ticket {
                        records.fill(t, self.root, key, v, page::page_lsn(&g));
                    }
                    return Ok(Some(f(v)));
                }
                Some((_, true)) => {}
            }
        }
        Ok(self.get_large(key).await?.map(|v| f(&v)))
    }

    /// `key`'s record from the cache (value, and the GSN its leaf had), or
    /// the ticket to fill it with after reading the leaf (None: no cache).
    fn cached(&self, key: &[u8]) -> std::result::Result<(Vec<u8>, u64), Option<Ticket>> {
        match self.pool.records().lookup(self.root, key) {
            Lookup::Hit(v, gsn) => Ok((v, gsn)),
            Lookup::Miss(t) => Err(Some(t)),
            Lookup::Off => Err(None),
        }
    }

    /// The stored payload of `key` and whether it is a large value's
    /// reference, if present, the GSN of the leaf it was read from, and
    /// that leaf's stamp (None: the value came from the record cache,
    /// with the GSN its leaf had when it was read there).
    async fn get_raw(
        &self,
        key: &[u8],
    ) -> Result<(Option<(Vec<u8>, bool)>, u64, Option<PageStamp>)> {
        self.check_key(key)?;
        let records = self.pool.records();
        let ticket = match self.cached(key) {
            Ok((v, gsn)) => return Ok((Some((v, false)), gsn, None)),
            Err(ticket) => ticket,
        };
        let g = self.leaf_shared(key, None).await?;
        let n = Node::new(&g).map_err(corrupt(g.pid()))?;
        let raw = n.get_entry(key).map(|(v, r)| (v.to_vec(), r));
        let gsn = page::page_lsn(&g);
        if let (Some(t), Some((v, false))) = (ticket, &raw) {
            records.fill(t, self.root, key, v, gsn);
        }
        Ok((raw, gsn, Some(g.stamp())))
    }

    /// What `key` holds: a value, or a large value's reference. To use the
    /// reference's extents, read it inside a reader epoch
    /// ([`BufferPool::blob_reader`]) so that they stay its own.
    async fn stored(&self, key: &[u8]) -> Result<Option<Stored>> {
        Ok(self.stored_versioned(key).await?.0)
    }

    /// [`BTree::stored`], with the GSN of the leaf it was read from.
    async fn stored_versioned(&self, key: &[u8]) -> Result<(Option<Stored>, u64)> {
        let (raw, gsn, _) = self.get_raw(key).await?;
        let stored = match raw {
            None => None,
            Some((v, false)) => Some(Stored::Value(v)),
            Some((raw, true)) => Some(Stored::Reference(BlobRef::read(
                &raw,
                self.pool.page_size(),
                self.root,
            )?)),
        };
        Ok((stored, gsn))
    }

    /// The reference of the large value under `key`, if it holds one (a
    /// commit reads the one it replaces under the key's lock).
    pub(crate) async fn reference(&self, key: &[u8]) -> Result<Option<BlobRef>> {
        Ok(match self.stored(key).await? {
            Some(Stored::Reference(r)) => Some(r),
            _ => None,
        })
    }

    /// [`BTree::get`] of a key that held a reference when last seen.
    async fn get_large(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_large_versioned(key).await?.0)
    }

    /// [`BTree::get_large`], with the GSN of the leaf the reference (or
    /// the value, or the key's absence) was read from.
    async fn get_large_versioned(&self, key: &[u8]) -> Result<(Option<Vec<u8>>, u64)> {
        let _reader = self.pool.blob_reader();
        let (r, gsn) = match self.stored_versioned(key).await? {
            (None, gsn) => return Ok((None, gsn)),
            (Some(Stored::Value(v)), gsn) => return Ok((Some(v), gsn)),
            (Some(Stored::Reference(r)), gsn) => (r, gsn),
        };
        let len = usize::try_from(r.len)
            .ok()
            .filter(|&l| l <= MAX_VALUE_LEN)
            .ok_or_else(|| Error::Corrupt {
                page: r.extents.first().map_or(self.root, |e| e.start),
                what: format!("a large value of {} bytes, beyond the limit", r.len),
            })?;
        // Extents past the array's end (a damaged or forged reference
        // with a valid checksum) are refused before a buffer of up to 4
        // GiB is taken for them (a review's finding).
        self.pool.blob_within_array(&r)?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).map_err(|_| {
            Error::InvalidArgument(format!(
                "no memory for a large value of {len} bytes (Tree::read_value reads it in parts)"
            ))
        })?;
        out.resize(len, 0);
        self.pool.read_blob_checked(&r, &mut out).await?;
        Ok((Some(out), gsn))
    }

    /// The length of the value of `key`, if present.
    pub async fn value_len(&self, key: &[u8]) -> Result<Option<u64>> {
        Ok(self.stored(key).await?.map(|s| match s {
            Stored::Value(v) => v.len() as u64,
            Stored::Reference(r) => r.len,
        }))
    }

    /// Reads the bytes of the value of `key` from `offset` into `out` (as
    /// many as there are, up to `out.len()`); returns how many, or None if
    /// the key is absent. Of a large value only the pages covering the
    /// range are read (its checksum covers the whole value and is checked
    /// by [`BTree::get`] only).
    pub async fn read_value(
        &self,
        key: &[u8],
        offset: u64,
        out: &mut [u8],
    ) -> Result<Option<usize>> {
        let _reader = self.pool.blob_reader();
        match self.stored(key).await? {
            None => Ok(None),
            Some(Stored::Value(v)) => {
                let from = (offset.min(v.len() as u64)) as usize;
                let n = (v.len() - from).min(out.len());
                out[..n].copy_from_slice(&v[from..from + n]);
                Ok(Some(n))
            }
            Some(Stored::Reference(r)) => {
                let n = r.len.saturating_sub(offset).min(out.len() as u64) as usize;
                if n == 0 {
                    // At or past the end: nothing, as for an inline value.
                    return Ok(Some(0));
                }
                self.pool.read_blob(&r, offset, &mut out[..n]).await?;
                Ok(Some(n))
            }
        }
    }

    // ---- writes ---------------------------------------------------------

    /// Inserts `key` -> `value`; fails with [`Error::KeyExists`] if the key
    /// is present.
    pub async fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(key, value, WriteMode::Insert).await.map(|_| ())
    }

    /// Inserts or replaces `key` -> `value`. Returns true if it replaced.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(key, value, WriteMode::Put).await
    }

    /// [`BTree::put`], with the GSN the leaf had before the change: at
    /// least that of the change that last wrote or removed `key`, which
    /// the answer was read from (a commit's apply).
    pub(crate) async fn put_versioned(&self, key: &[u8], value: &[u8]) -> Result<(bool, u64)> {
        self.write_entry(key, value, false, WriteMode::Put).await
    }

    /// Inserts or replaces `key` -> `reference`, a large value's
    /// reference (a commit's apply only), as [`BTree::put_versioned`].
    pub(crate) async fn put_reference(&self, key: &[u8], reference: &[u8]) -> Result<(bool, u64)> {
        self.write_entry(key, reference, true, WriteMode::Put).await
    }

    async fn write(&self, key: &[u8], value: &[u8], mode: WriteMode) -> Result<bool> {
        self.write_entry(key, value, false, mode)
            .await
            .map(|(replaced, _)| replaced)
    }

    /// The error for a write outside a commit that would drop a large
    /// value's reference (its extents would leak).
    fn refuse_reference(&self) -> Error {
        Error::InvalidArgument(format!(
            "a write to tree {} outside a commit would replace or delete a large value \
             (write it through a transaction)",
            self.root
        ))
    }

    async fn write_entry(
        &self,
        key: &[u8],
        value: &[u8],
        is_ref: bool,
        mode: WriteMode,
    ) -> Result<(bool, u64)> {
        let _room = self.admit_unlogged().await?;
        self.check_key(key)?;
        self.check_value(value)?;
        loop {
            let mut leaf = self.leaf_exclusive(key).await?;
            let pid = leaf.pid();
            let before = page::page_lsn(&leaf);
            let mut n = node_mut(&mut leaf, pid)?;
            let (i, present) = n.as_node().lower_bound(key);
            if present && !self.commit && n.as_node().is_ref_at(i) {
                leaf.unchanged();
                return Err(self.refuse_reference());
            }
            let res = match (present, mode) {
                (true, WriteMode::Insert) => {
                    leaf.unchanged();
                    return Err(Error::KeyExists);
                }
                (true, WriteMode::Put) => n.update_at(i, value).map(|_| true),
                (false, _) => n.insert(key, value).map(|_| false),
            };
            match res {
                Ok(replaced) => {
                    // An insert or update clears the mark; a reference
                    // sets it again.
                    if is_ref {
                        let (i, _) = n.as_node().lower_bound(key);
                        n.set_ref_at(i, true);
                    }
                    leaf.cover(self.cover);
                    return Ok((replaced, before));
                }
                Err(node::Full) => {
                    // Full is found before anything moves.
                    leaf.unchanged();
                    drop(leaf);
                    self.split(pid, key).await?;
                }
            }
        }
    }

    /// Replaces the value of `key` with `f(old)` atomically: the new
    /// value is written only while the key still holds the `old` that `f`
    /// was given, else `f` runs again on what it holds now. Returns false
    /// if `key` is absent.
    ///
    /// `f` runs with no latch held: it may read the tree, and a panic in
    /// it changes nothing. (It ran under the leaf's exclusive latch: a
    /// read of a key of the same leaf inside it spun for ever, and a
    /// panic stopped the database, which without a log then lost every
    /// write since the last flush; an outside probe.) The caller holds
    /// the key's stripe (`Committer::with_key_locked`), so
    /// only an unlogged bulk write can change the key in between. Through
    /// `Tree::unlogged_btree` no stripe is held: an update of a key other
    /// writers keep changing fails with [`Error::Conflict`] after
    /// `UPDATE_ATTEMPTS` tries.
    pub async fn update(&self, key: &[u8], mut f: impl FnMut(&[u8]) -> Vec<u8>) -> Result<bool> {
        let _room = self.admit_unlogged().await?;
        self.check_key(key)?;
        for _ in 0..UPDATE_ATTEMPTS {
            let old = match self.get_raw(key).await?.0 {
                None => return Ok(false),
                Some((_, true)) => return Err(self.refuse_reference()),
                Some((old, false)) => old,
            };
            let new = f(&old);
            self.check_value(&new)?;
            loop {
                let mut leaf = self.leaf_exclusive(key).await?;
                let pid = leaf.pid();
                let mut n = node_mut(&mut leaf, pid)?;
                let (i, found) = n.as_node().lower_bound(key);
                if !found {
                    leaf.unchanged();
                    return Ok(false);
                }
                if n.as_node().is_ref_at(i) || n.as_node().payload_at(i) != old.as_slice() {
                    // Changed since `f` read it: `f` again.
                    leaf.unchanged();
                    break;
                }
                match n.update_at(i, &new) {
                    Ok(()) => {
                        leaf.cover(self.cover);
                        return Ok(true);
                    }
                    Err(node::Full) => {
                        // Full is found before anything moves.
                        leaf.unchanged();
                        drop(leaf);
                        self.split(pid, key).await?;
                    }
                }
            }
        }
        Err(Error::Conflict(format!(
            "key of tree {} changed {UPDATE_ATTEMPTS} times while its update ran",
            self.root
        )))
    }

    /// Removes `key`. Returns true if it was present.
    pub async fn delete(&self, key: &[u8]) -> Result<bool> {
        self.delete_versioned(key).await.map(|(present, _)| present)
    }

    /// [`BTree::delete`], with the GSN the leaf had before (as
    /// [`BTree::put_versioned`]).
    pub(crate) async fn delete_versioned(&self, key: &[u8]) -> Result<(bool, u64)> {
        let _room = self.admit_unlogged().await?;
        self.check_key(key)?;
        let mut leaf = self.leaf_exclusive(key).await?;
        let pid = leaf.pid();
        let before = page::page_lsn(&leaf);
        let mut n = node_mut(&mut leaf, pid)?;
        let (i, present) = n.as_node().lower_bound(key);
        if !present {
            leaf.unchanged();
            return Ok((false, before));
        }
        if !self.commit && n.as_node().is_ref_at(i) {
            leaf.unchanged();
            return Err(self.refuse_reference());
        }
        n.remove_at(i);
        let underfull = n.as_node().fill_factor() < MERGE_BELOW;
        leaf.cover(self.cover);
        drop(leaf);
        if underfull && pid != self.root {
            // Best effort: a merge that fails (I/O off a worker, a read
            // error on the neighbour) is skipped: the delete itself is
            // done, and an error here told the caller it failed (a
            // commit's apply then stopped the database over a leaf it
            // never touched; a review's finding). It changes no page
            // before everything that can fail has passed.
            let _ = self.try_merge(pid, key).await;
        }
        Ok((true, before))
    }

    // ---- structure changes ------------------------------------------------

    /// The parent of `target` on the path to `key`, or None if `target` is
    /// the root or no longer on that path.
    ///
    /// After [`HOLD_AFTER`] undone looks it descends holding its path, as
    /// [`Tree::find_leaf_held`] does.
    async fn find_parent(&self, target: u64, key: &[u8]) -> Result<Option<u64>> {
        self.find_parent_guarded(target, key, None).await
    }

    /// [`Tree::find_parent`] by a caller that may hold the structure guard
    /// already.
    async fn find_parent_guarded(
        &self,
        target: u64,
        key: &[u8],
        held: Option<&StructureGuard<'_>>,
    ) -> Result<Option<u64>> {
        if target == self.root {
            return Ok(None);
        }
        for restarts in 0..MAX_RESTARTS {
            if restarts >= HOLD_AFTER as usize {
                return match held {
                    Some(_) => self.find_parent_held(target, key).await,
                    None => {
                        let _guard = self.pool.structure_change().await;
                        self.find_parent_held(target, key).await
                    }
                };
            }
            match self.find_parent_once(target, key).await? {
                Look::Found(parent) => return Ok(parent),
                Look::Undone => sched::yield_now().await,
            }
        }
        Ok(None)
    }

    /// One optimistic look for [`Tree::find_parent`].
    async fn find_parent_once(&self, target: u64, key: &[u8]) -> Result<Look> {
        let mut pid = self.root;
        let mut cur = self.pool.fix_optimistic(pid).await?;
        let mut levels = 0u32;
        loop {
            let Some(step) = cur.with_bytes(|b| look(b, key)) else {
                return Ok(Look::Undone);
            };
            match step {
                Step::Child(c) if c == target => return Ok(Look::Found(Some(pid))),
                Step::Child(c) => {
                    let next = match self.pool.fix_optimistic(c).await {
                        Ok(n) => n,
                        Err(e) if freed_since(&e, Some(&cur)) => return Ok(Look::Undone),
                        Err(e) => return Err(e),
                    };
                    if !cur.validate() {
                        return Ok(Look::Undone);
                    }
                    levels += 1;
                    if levels > MAX_HEIGHT {
                        return Err(too_deep(pid));
                    }
                    cur = next;
                    pid = c;
                }
                Step::Leaf | Step::NotCovered => return Ok(Look::Found(None)),
                Step::Corrupt(what) => return Err(Error::Corrupt { page: pid, what }),
            }
        }
    }

    /// [`Tree::find_parent`] holding its path (each node latched shared
    /// until its child is); its caller holds the pool's structure guard.
    async fn find_parent_held(&self, target: u64, key: &[u8]) -> Result<Option<u64>> {
        self.pool.note_held_descent();
        let mut pid = self.root;
        let mut cur = self.pool.fix_shared(pid).await?;
        for _ in 0..=MAX_HEIGHT {
            match look(&cur, key) {
                Step::Child(c) if c == target => return Ok(Some(pid)),
                Step::Child(c) => {
                    cur = self.pool.fix_shared(c).await?;
                    pid = c;
                }
                Step::Leaf => return Ok(None),
                Step::NotCovered => return Err(off_path_under_latches(pid)),
                Step::Corrupt(what) => return Err(Error::Corrupt { page: pid, what }),
            }
        }
        Err(too_deep(pid))
    }

    /// Splits node `pid` (which covers `key`), splitting ancestors first
    /// when they have no room for the separator. The caller restarts its
    /// operation afterwards (and splits again if the node is still full).
    async fn split(&self, pid: u64, key: &[u8]) -> Result<()> {
        match self.try_split(pid, key).await? {
            SplitOutcome::Done => Ok(()),
            SplitOutcome::Retry => {
                sched::yield_now().await;
                Ok(())
            }
            SplitOutcome::ParentFull(parent) => Box::pin(self.split(parent, key)).await,
        }
    }

    /// Latches `parent_pid` exclusively, which [`Tree::find_parent`] named
    /// as the parent of `pid` on the path to `key`; None if it no longer
    /// is: changed, or freed since (a free page, or a page a large value
    /// took, whose bytes fail the page checksum) and a fresh look names
    /// another parent. Damage to the page that still is the parent is an
    /// error.
    async fn latch_parent(
        &self,
        parent_pid: u64,
        pid: u64,
        key: &[u8],
        guard: &StructureGuard<'_>,
    ) -> Result<Option<PageMut<'_>>> {
        let damage = match self.pool.fix_exclusive(parent_pid).await {
            Ok(g) => {
                let still =
                    Node::new(&g).map(|p| !p.is_leaf() && p.covers(key) && p.child_for(key) == pid);
                match still {
                    Ok(true) => return Ok(Some(g)),
                    Ok(false) => return Ok(None),
                    Err(c) => c.into_error(parent_pid),
                }
            }
            Err(e @ Error::Corrupt { .. }) => e,
            Err(e) => return Err(e),
        };
        if self.find_parent_guarded(pid, key, Some(guard)).await? == Some(parent_pid) {
            return Err(damage);
        }
        Ok(None)
    }

    async fn try_split(&self, pid: u64, key: &[u8]) -> Result<SplitOutcome> {
        if pid == self.root {
            let guard = self.pool.structure_change().await;
            return self.split_root(&guard).await.map(|_| SplitOutcome::Done);
        }
        let Some(parent_pid) = self.find_parent(pid, key).await? else {
            return Ok(SplitOutcome::Retry);
        };
        let ps = self.pool.page_size();
        // Before the first latch: the reads below may wait for frames.
        let guard = self.pool.structure_change().await;
        let Some(mut parent) = self.latch_parent(parent_pid, pid, key, &guard).await? else {
            return Ok(SplitOutcome::Retry);
        };
        // Under the parent's latch the child cannot be freed.
        // (`node::split` checks it whole.)
        let mut child = self.pool.fix_exclusive(pid).await?;
        {
            let c = Node::new(&child).map_err(corrupt(pid))?;
            if c.len() < 2 {
                // Nothing to split (a single huge entry cannot be the
                // problem: sizes are limited so two always fit).
                return Ok(SplitOutcome::Retry);
            }
        }
        let mut left = vec![0u8; ps];
        let mut right_tmp = vec![0u8; ps];
        let sep = node::split(&child, &mut left, &mut right_tmp).map_err(|e| Error::Corrupt {
            page: pid,
            what: format!("split failed: {e}"),
        })?;
        {
            let p = Node::new(&parent).map_err(corrupt(parent_pid))?;
            if p.free_space_after_compaction() < p.space_needed(sep.len(), node::CHILD_ID_SIZE) {
                drop(child);
                drop(parent);
                return Ok(SplitOutcome::ParentFull(parent_pid));
            }
        }
        // The parent's whole-node check (the write path's, first run here
        // on a parent read in) before any page changes: failed after the
        // child was cut and the right page taken, it left the keys above
        // the separator on a page no tree names, logged so, with the
        // database going on (a review's finding).
        checked(&parent, parent_pid)?;
        let kind = page::page_type(&child).unwrap_or(PageType::Leaf);
        let mut space = self.pool.lock_space_under(&guard).await?;
        let mut right = self
            .pool
            .allocate_in_for(&mut space, kind, self.reserved)
            .await?;
        let right_pid = right.pid();
        right[page::PAGE_HEADER_SIZE..].copy_from_slice(&right_tmp[page::PAGE_HEADER_SIZE..]);
        child[page::PAGE_HEADER_SIZE..].copy_from_slice(&left[page::PAGE_HEADER_SIZE..]);
        let mut p = node_mut(&mut parent, parent_pid)?;
        let (i, _) = p.as_node().lower_bound(key);
        if i < p.as_node().len() {
            p.set_child_at(i, right_pid);
        } else {
            p.set_upper_child(right_pid);
        }
        p.insert_separator(&sep, pid).map_err(|_| Error::Corrupt {
            page: parent_pid,
            what: "separator did not fit after the room check".into(),
        })?;
        if kind == PageType::Leaf {
            // The left half is the leaf cut at the separator: the log may
            // record just that (the right half is imaged whole).
            child.log_as_cut(self.root, sep);
        }
        // One log record for the whole split: redone together or not at all.
        self.pool
            .log_with_space(&mut [&mut parent, &mut child, &mut right], &mut space)?;
        Ok(SplitOutcome::Done)
    }

    /// Splits the root in place: its contents move to two new children.
    async fn split_root(&self, guard: &StructureGuard<'_>) -> Result<()> {
        let ps = self.pool.page_size();
        let mut root = self.pool.fix_exclusive(self.root).await?;
        let (is_leaf, len) = {
            let n = Node::new(&root).map_err(corrupt(self.root))?;
            (n.is_leaf(), n.len())
        };
        if len < 2 {
            return Ok(());
        }
        let kind = if is_leaf {
            PageType::Leaf
        } else {
            PageType::Inner
        };
        let mut left_tmp = vec![0u8; ps];
        let mut right_tmp = vec![0u8; ps];
        let sep =
            node::split(&root, &mut left_tmp, &mut right_tmp).map_err(|e| Error::Corrupt {
                page: self.root,
                what: format!("root split failed: {e}"),
            })?;
        let space = self.pool.lock_space_under(guard).await?;
        // The first new page is given back if the second allocation fails
        // or this future is dropped while it waits (a frame, a growth, a
        // map page): dropped as it was, it was logged (or written) used and
        // named by no tree (a lost page).
        let mut first = FirstOfTwo {
            pool: &self.pool,
            space: Some(space),
            page: None,
        };
        let s = first.space.as_mut().expect("held");
        let left = self.pool.allocate_in_for(s, kind, self.reserved).await?;
        first.page = Some(left);
        let s = first.space.as_mut().expect("held");
        let mut right = self.pool.allocate_in_for(s, kind, self.reserved).await?;
        let mut left = first.page.take().expect("the first allocation");
        let mut space = first.space.take().expect("held");
        left[page::PAGE_HEADER_SIZE..].copy_from_slice(&left_tmp[page::PAGE_HEADER_SIZE..]);
        right[page::PAGE_HEADER_SIZE..].copy_from_slice(&right_tmp[page::PAGE_HEADER_SIZE..]);
        page::set_page_type(&mut root, PageType::Inner);
        let mut r = node::init(&mut root, false, None, None, right.pid());
        r.insert_separator(&sep, left.pid())
            .map_err(|_| Error::Corrupt {
                page: self.root,
                what: "a fresh root cannot hold one separator".into(),
            })?;
        self.pool
            .log_with_space(&mut [&mut root, &mut left, &mut right], &mut space)
    }

    /// Merges leaf `pid` (covering `key`) into its right sibling if both
    /// fit one page. Best effort: gives up quietly when the structure
    /// changed or the pair does not fit.
    async fn try_merge(&self, pid: u64, key: &[u8]) -> Result<()> {
        let Some(parent_pid) = self.find_parent(pid, key).await? else {
            return Ok(());
        };
        if self.merge_cannot_fit(parent_pid, pid, key).await? {
            return Ok(());
        }
        // Before the first latch (as a split's).
        let guard = self.pool.structure_change().await;
        let Some(mut parent) = self.latch_parent(parent_pid, pid, key, &guard).await? else {
            return Ok(());
        };
        let p = Node::new(&parent).map_err(corrupt(parent_pid))?;
        let Some((i, right_pid)) = right_sibling(&p, pid, key) else {
            return Ok(());
        };
        if right_pid == pid || right_pid == parent_pid {
            // Latching it would wait for the latch this task holds.
            return Err(Error::Corrupt {
                page: parent_pid,
                what: format!("leaf {pid}'s right sibling is {right_pid}"),
            });
        }
        // (`node::merge` checks both whole.)
        let mut left = self.pool.fix_exclusive(pid).await?;
        let mut right = self.pool.fix_exclusive(right_pid).await?;
        let ps = self.pool.page_size();
        let mut merged = vec![0u8; ps];
        if node::merge(&left, &right, &mut merged).is_err() {
            return Ok(());
        }
        let mut space = self.pool.lock_space_under(&guard).await?;
        // What can fail comes first: the left page's free reads its map
        // page, and a failure there after the right page and the parent
        // changed left the left page lost (used, in no tree) and the
        // merge logged as two records (a review's finding).
        let mut p = node_mut(&mut parent, parent_pid)?;
        self.pool.free_in(&mut space, &mut left).await?;
        right[page::PAGE_HEADER_SIZE..].copy_from_slice(&merged[page::PAGE_HEADER_SIZE..]);
        p.remove_at(i);
        // One log record for the whole merge.
        self.pool
            .log_with_space(&mut [&mut parent, &mut right, &mut left], &mut space)
    }

    /// True if leaf `pid` and its right sibling under `parent_pid` were
    /// seen, unchanged, not to fit one page: the merge is skipped before
    /// it takes the structure guard (every delete from an underfull leaf
    /// next to a full one took it). Read from validated copies, without
    /// latches; false whenever unsure (the merge then checks under its
    /// latches).
    async fn merge_cannot_fit(&self, parent_pid: u64, pid: u64, key: &[u8]) -> Result<bool> {
        let parent = self.pool.fix_optimistic(parent_pid).await?;
        let right =
            parent.with_bytes(|b| Node::new(b).ok().and_then(|p| right_sibling(&p, pid, key)));
        let Some(Some((_, right_pid))) = right else {
            return Ok(false);
        };
        let mut pages = [Vec::new(), Vec::new()];
        for (copy, at) in pages.iter_mut().zip([pid, right_pid]) {
            let page = match self.pool.fix_optimistic(at).await {
                Ok(p) => p,
                Err(e) if freed_since(&e, Some(&parent)) => return Ok(false),
                Err(e) => return Err(e),
            };
            match page.with_bytes(<[u8]>::to_vec) {
                Some(bytes) => *copy = bytes,
                None => return Ok(false),
            }
        }
        // The parent unchanged since: the copies are adjacent siblings.
        if !parent.validate() {
            return Ok(false);
        }
        let both_leaves = pages
            .iter()
            .all(|b| Node::new(b).is_ok_and(|n| n.is_leaf()));
        let mut merged = vec![0u8; self.pool.page_size()];
        Ok(both_leaves && node::merge(&pages[0], &pages[1], &mut merged).is_err())
    }

    // ---- scans ------------------------------------------------------------

    /// A cursor over `[lower, upper]` (each bound inclusive, exclusive or
    /// open), moving forward or backward.
    pub fn cursor(&self, lower: Bound<&[u8]>, upper: Bound<&[u8]>, forward: bool) -> Cursor {
        Cursor {
            tree: self.clone(),
            lower: lower.map(<[u8]>::to_vec),
            upper: upper.map(<[u8]>::to_vec),
            forward,
            next_key: None,
            buffered: Vec::new(),
            large: Vec::new(),
            pos: 0,
            done: false,
            read_ahead: 1,
            wanted: None,
            max_gsn: 0,
            stamps: None,
            guard: None,
            keys_only: false,
        }
    }

    /// Number of keys in `[lower, upper]` (a large value's key counts by
    /// its reference; the value is not read).
    pub async fn count(&self, lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> Result<u64> {
        self.cursor(lower, upper, true).count_keys().await
    }

    /// Visits every page of the tree (for check and drop): calls `f` with
    /// each page id and its bytes, parents before children.
    pub async fn walk(&self, mut f: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let mut stack = vec![(self.root, 0u32)];
        while let Some((pid, depth)) = stack.pop() {
            if depth > MAX_HEIGHT {
                return Err(too_deep(pid));
            }
            let g = self.pool.fix_shared(pid).await?;
            f(pid, &g)?;
            let n = Node::new(&g).map_err(corrupt(pid))?;
            if !n.is_leaf() {
                stack.push((n.upper_child(), depth + 1));
                for i in (0..n.len()).rev() {
                    stack.push((n.child_at(i), depth + 1));
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum WriteMode {
    Insert,
    Put,
}

enum SplitOutcome {
    Done,
    Retry,
    ParentFull(u64),
}

/// What a descent collects for a cursor's read-ahead: the children next
/// to the one covering the key in the last inner node on the way, in the
/// cursor's direction (the leaf's siblings under its parent).
struct Siblings<'a> {
    /// The page ids found, nearest first (cleared at each level: the
    /// last one stays).
    pids: Vec<u64>,
    /// At most this many.
    max: usize,
    /// Right siblings (a forward cursor) or left ones.
    forward: bool,
    /// Only children that can hold keys within this bound: the range's
    /// upper bound going forward, its lower bound going backward.
    bound: Bound<&'a [u8]>,
    /// A separator key (reused).
    separator: Vec<u8>,
}

impl<'a> Siblings<'a> {
    fn new(max: usize, forward: bool, bound: Bound<&'a [u8]>) -> Siblings<'a> {
        Siblings {
            pids: Vec::with_capacity(max),
            max,
            forward,
            bound,
            separator: Vec::new(),
        }
    }

    /// Collects from inner node `bytes` the children next to child `i`,
    /// the one covering `key`. Child `j` holds the keys above separator
    /// `j - 1` and up to separator `j`: going forward, the first child
    /// whose lower separator is at or past the upper bound ends the list;
    /// going backward, the first whose upper separator is below the lower
    /// bound.
    fn collect(&mut self, bytes: &[u8], key: &[u8]) {
        let Ok(n) = Node::new(bytes) else {
            return;
        };
        let (i, _) = n.lower_bound(key);
        let bounded = !matches!(self.bound, Bound::Unbounded);
        if self.forward {
            let mut j = i + 1;
            while self.pids.len() < self.max && j <= n.len() {
                if bounded {
                    n.key_at(j - 1, &mut self.separator);
                    if !continues_above_bound(&self.separator, self.bound) {
                        break;
                    }
                }
                self.pids.push(if j < n.len() {
                    n.child_at(j)
                } else {
                    n.upper_child()
                });
                j += 1;
            }
        } else {
            let mut j = i.min(n.len());
            while self.pids.len() < self.max && j > 0 {
                j -= 1;
                if bounded {
                    n.key_at(j, &mut self.separator);
                    if !continues_below_bound(&self.separator, self.bound) {
                        break;
                    }
                }
                self.pids.push(n.child_at(j));
            }
        }
    }
}

fn as_slice_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(Vec::as_slice)
}

/// True if keys above fence `u` can still be in range.
fn continues_above(u: &[u8], upper: &Bound<Vec<u8>>) -> bool {
    continues_above_bound(u, as_slice_bound(upper))
}

/// [`continues_above`] with a borrowed bound.
fn continues_above_bound(u: &[u8], upper: Bound<&[u8]>) -> bool {
    match upper {
        Bound::Included(b) | Bound::Excluded(b) => b > u,
        Bound::Unbounded => true,
    }
}

/// True if keys at or below fence `l` can still be in range.
fn continues_below(l: &[u8], lower: &Bound<Vec<u8>>) -> bool {
    continues_below_bound(l, as_slice_bound(lower))
}

/// [`continues_below`] with a borrowed bound.
fn continues_below_bound(l: &[u8], lower: Bound<&[u8]>) -> bool {
    match lower {
        Bound::Included(b) => b <= l,
        Bound::Excluded(b) => b < l,
        Bound::Unbounded => true,
    }
}

/// A range cursor. It copies one leaf's matching entries at a time (no
/// latch is held between calls) and moves to the next leaf by descending
/// again with the leaf's fence key; the next leaves under the same parent,
/// in its direction, are read ahead asynchronously.
pub struct Cursor {
    tree: BTree,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    forward: bool,
    /// The key whose leaf comes next (None: start at the bound).
    next_key: Option<Vec<u8>>,
    buffered: Vec<(Vec<u8>, Vec<u8>)>,
    /// Per buffered entry: its payload is still a large value's
    /// reference, read when the entry is handed out (one value at a time:
    /// loading a leaf read every large value in it whole, up to ~100 of up
    /// to 4 GiB each).
    large: Vec<bool>,
    pos: usize,
    done: bool,
    /// Leaves to read ahead at the next move (grows to READ_AHEAD).
    read_ahead: usize,
    /// Entries the caller still wants beyond those loaded, if it said
    /// ([`Cursor::with_len_hint`]): read-ahead stops there.
    wanted: Option<usize>,
    /// The most page GSN of the leaves read: what a transaction that
    /// used the entries depends on (another worker's log may not have
    /// made that change durable yet).
    max_gsn: u64,
    /// The stamps of every leaf read, in order, if asked for
    /// ([`Cursor::stamped`]; None again once a large value was read: its
    /// bytes live outside the leaves).
    stamps: Option<Vec<PageStamp>>,
    /// Asked before every move to a leaf, if set ([`Cursor::guarded`]).
    guard: Option<CursorGuard>,
    /// Keys only ([`BTree::count`]): payloads are not copied and large
    /// values not read (a count read every large value of the range
    /// whole, up to 4 GiB each; a review's finding).
    keys_only: bool,
}

/// What a cursor asks before it moves to a leaf: an error stops it (its
/// tree was dropped, its database closed). A dropped tree's pages go back
/// to the free space, and another tree may hold them by the time a stale
/// cursor would read them. The token it returns is held until the leaf
/// is read and copied: the drop waits for it before it frees the pages.
pub(crate) type CursorGuard = Arc<dyn Fn() -> Result<Box<dyn Send>> + Send + Sync>;

impl Cursor {
    /// The next entry, or None at the end of the range.
    pub async fn next(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        loop {
            if self.pos < self.buffered.len() {
                if !self.resolve(self.pos).await? {
                    // Deleted since its leaf was read: no longer committed.
                    self.pos += 1;
                    continue;
                }
                let e = std::mem::take(&mut self.buffered[self.pos]);
                self.pos += 1;
                return Ok(Some(e));
            }
            if !self.advance_leaf().await? {
                return Ok(None);
            }
        }
    }

    /// Reads the large value of buffered entry `i` if it holds one, under
    /// the cursor's guard. False if its key was deleted since its leaf
    /// was read. A failed read leaves the entry as it was: the next call
    /// tries it again.
    async fn resolve(&mut self, i: usize) -> Result<bool> {
        if !self.large[i] {
            return Ok(true);
        }
        // Held while the value is read (a drop of the tree waits for it).
        let _fence = match &self.guard {
            Some(guard) => Some(guard()?),
            None => None,
        };
        let (value, gsn) = self.tree.get_large_versioned(&self.buffered[i].0).await?;
        // The leaf as the value was read: a commit may have replaced it
        // since the cursor copied its leaf (not yet durable in its log);
        // what used it depends on it.
        self.max_gsn = self.max_gsn.max(gsn);
        self.large[i] = false;
        match value {
            Some(v) => {
                self.buffered[i].1 = v;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The entries not yet returned of the current leaf, or else all the
    /// matching entries of the next leaf, in the cursor's direction (None
    /// at the end of the range). One leaf at a time: what a streaming
    /// iterator fetches per round trip.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<(Vec<u8>, Vec<u8>)>>> {
        // Bounded by the entries of the range: each round hands out one
        // or skips one deleted entry, or loads the next leaf.
        loop {
            if self.pos >= self.buffered.len() && !self.advance_leaf().await? {
                return Ok(None);
            }
            // A batch ends after its first large value (read here, one at
            // a time), so that a batch holds at most one.
            let end = match self.large[self.pos..].iter().position(|&l| l) {
                Some(0) => {
                    if !self.resolve(self.pos).await? {
                        self.pos += 1;
                        continue;
                    }
                    self.pos + 1
                }
                Some(j) => self.pos + j,
                None => self.buffered.len(),
            };
            let batch = self.buffered[self.pos..end]
                .iter_mut()
                .map(std::mem::take)
                .collect();
            self.pos = end;
            return Ok(Some(batch));
        }
    }

    /// Tells the cursor its caller will read about `n` entries (a scan
    /// with a limit): it then reads ahead the leaves those entries need,
    /// estimated from the entries per leaf it meets (at most 32, and at
    /// most a sixteenth of the pool), and none past them. Without the
    /// hint, read-ahead grows from one leaf to eight as the cursor moves
    /// on, which overshoots a short scan; a caller that reads past its
    /// hint gets that read-ahead from there on. Either way no leaf outside
    /// the range's bounds is read ahead, in either direction. A hint only,
    /// not a limit: the cursor still returns every entry of its range.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
    /// use std::ops::Bound::{Included, Unbounded};
    /// let t = db.create_tree("t").unwrap();
    /// for i in 0u32..1000 {
    ///     t.put(&i.to_be_bytes(), &[0u8; 100]).unwrap();
    /// }
    /// let from = 500u32.to_be_bytes();
    /// let mut c = t.cursor(Included(&from[..]), Unbounded, true).unwrap().with_len_hint(50);
    /// let n = db.block_on(async move {
    ///     let mut n = 0;
    ///     while n < 50 && c.next().await?.is_some() {
    ///         n += 1;
    ///     }
    ///     Ok::<_, dana::Error>(n)
    /// }).unwrap().unwrap();
    /// assert_eq!(n, 50);
    /// ```
    pub fn with_len_hint(mut self, n: usize) -> Cursor {
        self.wanted = Some(n);
        self
    }

    /// This cursor, asking `guard` before every move to a leaf.
    pub(crate) fn guarded(mut self, guard: CursorGuard) -> Cursor {
        self.guard = Some(guard);
        self
    }

    /// The most leaves the next move may read ahead (how many siblings
    /// its descent collects). A caller that reads past its hint gets the
    /// unhinted read-ahead from then on, not none.
    fn most_ahead(&mut self) -> usize {
        match self.wanted {
            Some(0) => {
                self.wanted = None;
                self.read_ahead
            }
            Some(_) => {
                // A small pool is not filled by one cursor's read-ahead.
                let share = (self.tree.pool.frames() / 16).max(1);
                READ_AHEAD_HINTED.min(share)
            }
            None => self.read_ahead,
        }
    }

    /// How many of the siblings collected (at most [`Cursor::most_ahead`])
    /// to read ahead after loading a leaf of `entries` entries, `loaded`
    /// of them returned to the caller.
    fn leaves_ahead(&mut self, entries: usize, loaded: usize) -> usize {
        match self.wanted.as_mut() {
            None => {
                let n = self.read_ahead;
                self.read_ahead = (self.read_ahead * 2).min(READ_AHEAD);
                n
            }
            Some(wanted) => {
                *wanted = wanted.saturating_sub(loaded);
                wanted.div_ceil(entries.max(1))
            }
        }
    }

    /// The most page GSN of the leaves this cursor has read.
    pub(crate) fn max_gsn(&self) -> u64 {
        self.max_gsn
    }

    /// This cursor keeps the stamps of the leaves it reads
    /// ([`Cursor::leaf_stamps`]).
    pub(crate) fn stamped(mut self) -> Cursor {
        self.stamps = Some(Vec::new());
        self
    }

    /// The stamps of the leaves this cursor has read, in order: they
    /// cover every key from where it started to where it is (the leaves
    /// are contiguous), so while all are unchanged the entries between
    /// are too. None if not [`Cursor::stamped`] or a large value was read.
    pub(crate) fn leaf_stamps(&self) -> Option<&[PageStamp]> {
        self.stamps.as_deref()
    }

    /// Number of keys from here to the end of the range (see
    /// [`BTree::count`]), leaf by leaf: a guarded cursor asks its guard
    /// before each leaf only, so a long count holds no fence between
    /// leaves (a count under one fence made every drop wait for the
    /// whole walk, and fail past the drop's patience; a review's finding).
    pub(crate) async fn count_keys(mut self) -> Result<u64> {
        self.keys_only = true;
        let mut n = (self.buffered.len() - self.pos) as u64;
        self.pos = self.buffered.len();
        while self.advance_leaf().await? {
            n += self.buffered.len() as u64;
            self.pos = self.buffered.len();
        }
        Ok(n)
    }

    /// Loads the matching entries of the next leaf. False at the end.
    async fn advance_leaf(&mut self) -> Result<bool> {
        loop {
            if self.done {
                return Ok(false);
            }
            // Held until the leaf is read and copied (a drop waits for it).
            let _fence = match &self.guard {
                Some(guard) => Some(guard()?),
                None => None,
            };
            let start: Vec<u8> = match (&self.next_key, self.forward) {
                (Some(k), _) => k.clone(),
                (None, true) => match &self.lower {
                    Bound::Included(k) | Bound::Excluded(k) => k.clone(),
                    Bound::Unbounded => Vec::new(),
                },
                (None, false) => match &self.upper {
                    Bound::Included(k) | Bound::Excluded(k) => k.clone(),
                    // The largest possible key: one longer than allowed,
                    // all 0xff, sorts above every stored key.
                    Bound::Unbounded => vec![0xff; self.tree.max_key_len() + 1],
                },
            };
            let most = self.most_ahead();
            let bound = if self.forward {
                &self.upper
            } else {
                &self.lower
            };
            let mut ahead = Siblings::new(most, self.forward, as_slice_bound(bound));
            let g = self
                .tree
                .leaf_shared(&start, (most > 0).then_some(&mut ahead))
                .await?;
            let ahead = ahead.pids;
            let n = Node::new(&g).map_err(corrupt(g.pid()))?;
            self.max_gsn = self.max_gsn.max(page::page_lsn(&g));
            if let Some(s) = self.stamps.as_mut() {
                s.push(g.stamp());
            }
            self.buffered.clear();
            self.large.clear();
            self.pos = 0;
            let within = n.range(as_slice_bound(&self.lower), as_slice_bound(&self.upper));
            for i in within {
                if self.keys_only {
                    self.buffered.push((n.key_vec_at(i), Vec::new()));
                    self.large.push(false);
                    continue;
                }
                self.large.push(n.is_ref_at(i));
                self.buffered
                    .push((n.key_vec_at(i), n.payload_at(i).to_vec()));
            }
            if self.large.contains(&true) {
                // Its bytes live outside the leaves: stamps cannot vouch
                // for it.
                self.stamps = None;
            }
            // Where the next leaf starts, and whether the range goes on.
            // The fence becomes a hard bound: if this leaf merges into its
            // neighbour before we get there, the neighbour also holds the
            // keys returned already, and the bound keeps them out.
            if self.forward {
                match n.upper_fence() {
                    Some(u) if continues_above(u, &self.upper) => {
                        self.next_key = Some(successor(u));
                        self.lower = Bound::Excluded(u.to_vec());
                    }
                    _ => self.done = true,
                }
            } else {
                match n.lower_fence() {
                    Some(l) if continues_below(l, &self.lower) => {
                        self.next_key = Some(l.to_vec());
                        self.upper = Bound::Included(l.to_vec());
                    }
                    _ => self.done = true,
                }
            }
            let leaf_entries = n.len();
            drop(g);
            // Read ahead only if the range goes on past this leaf.
            let leaves = self.leaves_ahead(leaf_entries, self.buffered.len());
            if !self.done {
                for &pid in ahead.iter().take(leaves) {
                    self.tree.pool.prefetch(pid);
                }
            }
            // Large values are read one at a time as their entries are
            // handed out (`Cursor::resolve`).
            if !self.forward {
                self.buffered.reverse();
                self.large.reverse();
            }
            if !self.buffered.is_empty() {
                return Ok(true);
            }
        }
    }
}

/// The space guard of a root split and its first new page until the
/// second is allocated: dropped holding both (the second allocation
/// failed, or the split's future was dropped while it waited), it gives
/// the first page back under the guard before either is logged.
struct FirstOfTwo<'a> {
    pool: &'a BufferPool,
    space: Option<crate::buffer::alloc::SpaceGuard<'a>>,
    page: Option<PageMut<'a>>,
}

impl Drop for FirstOfTwo<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A panic in the second allocation may have left the guard's
            // pages half changed: logged with the page given back, the
            // change would reach the log; dropped as they are, they stop
            // the pool (`PageMut`'s drop).
            return;
        }
        if let (Some(s), Some(p)) = (self.space.as_mut(), self.page.as_mut()) {
            if !self.pool.unallocate_in(s, p) {
                self.pool.poison(&Error::Poisoned(format!(
                    "a root split stopped after allocating page {} could not give it back",
                    p.pid()
                )));
            }
            // The page given back, the meta page and the map pages in one
            // record (a failed append poisons the pool).
            let _poisons_on_failure = self.pool.log_with_space(&mut [p], s);
        }
        // The page drops (logged, or dirty as a free page), then the guard.
        self.page.take();
        self.space.take();
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Waker};

    use super::*;
    use crate::buffer::test_pool;
    use crate::io::sim::{SimConfig, SimDisk};
    use crate::io::{Array, Target};

    /// A root split whose future is dropped between its two allocations
    /// (the second waits for a frame; a caller's timeout or select around
    /// a plain write) loses no page: before, the first new page, its map
    /// bit set and logged or written, was named by no tree (a review's
    /// finding).
    #[test]
    fn a_root_split_dropped_between_its_allocations_loses_no_page() {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, rt) = test_pool(array, 64);
        let p = pool.clone();
        let (used, named, pending_at) = rt
            .block_on(async move {
                p.format().await?;
                let t = BTree::create(&p).await?;
                // One frame free: a root split takes two.
                let taken = p.take_free_frames_but(1);
                let mut i = 0u32;
                let pending_at = loop {
                    let key = i.to_be_bytes();
                    let mut f = std::pin::pin!(t.put(&key, &[7u8; 200]));
                    let mut cx = Context::from_waker(Waker::noop());
                    if f.as_mut().poll(&mut cx).is_pending() {
                        break i; // dropped here, mid-split
                    }
                    i += 1;
                    assert!(i < 1000, "no put waited");
                };
                p.give_back_frames(&taken);
                // The write again, whole this time.
                t.put(&pending_at.to_be_bytes(), &[7u8; 200]).await?;
                let s = p.space().await?;
                let mut named = 2; // the meta page and the first map page
                t.walk(|_, _| {
                    named += 1;
                    Ok(())
                })
                .await?;
                Ok::<_, Error>((s.next_unused - s.free_pages, named, pending_at))
            })
            .unwrap()
            .unwrap();
        assert!(pending_at > 0);
        assert_eq!(
            used, named,
            "pages used in the map that no tree names (the put dropped at key {pending_at})"
        );
    }

    /// A split whose parent fails the write path's whole-node check
    /// (`checked`, first run at the split) leaves every key readable and
    /// takes no page: the check ran after the child was cut and the new
    /// right page allocated (a review's finding).
    #[test]
    fn a_split_failing_its_parent_check_loses_no_key() {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let array = Array::new(vec![Target::Sim(disk)], 4096).unwrap();
        let (pool, rt) = test_pool(array, 64);
        let p = pool.clone();
        let out = rt
            .block_on(async move {
                p.format().await?;
                let t = BTree::create(&p).await?;
                let mut n = 0u32;
                while t.height().await? < 2 {
                    t.put(&n.to_be_bytes(), &[7u8; 200]).await?;
                    n += 1;
                }
                let root = t.root();
                // Damage the root's heap-bytes count by one (the node
                // header's H_USED, at 6): Node::new accepts it, the
                // write path's check does not.
                {
                    let mut g = p.fix_exclusive(root).await?;
                    let at = page::PAGE_HEADER_SIZE + 6;
                    let used = u16::from_le_bytes([g[at], g[at + 1]]);
                    g[at..at + 2].copy_from_slice(&(used - 1).to_le_bytes());
                }
                p.flush_all().await?;
                p.drop_frame(root).await?;
                let before = p.space().await?;
                // Keys go to the upper leaf until it splits.
                let mut err = None;
                for _ in 0..100 {
                    match t.put(&n.to_be_bytes(), &[7u8; 200]).await {
                        Ok(_) => n += 1,
                        Err(e) => {
                            err = Some(e);
                            break;
                        }
                    }
                }
                let after = p.space().await?;
                let mut missing = Vec::new();
                p.records().clear();
                for k in 0..n {
                    match t.get(&k.to_be_bytes()).await {
                        Ok(Some(_)) => {}
                        other => missing.push((k, format!("{other:?}"))),
                    }
                }
                Ok::<_, Error>((err, before, after, missing, n))
            })
            .unwrap()
            .unwrap();
        let (err, before, after, missing, n) = out;
        assert!(err.is_some(), "no split met the damaged parent");
        assert_eq!(
            after.next_unused - after.free_pages,
            before.next_unused - before.free_pages,
            "a page was taken by the failed split"
        );
        assert!(
            missing.is_empty(),
            "of {n} keys, these read wrong: {:?}",
            &missing[..missing.len().min(5)]
        );
    }
}
