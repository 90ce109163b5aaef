//! Creating and dropping trees so that a crash at any point leaks no page.
//!
//! Owns: the catalogue's root slot and the two intent slots of the meta
//! page, the crash-safe order of `create_tree` and `drop_tree`, and the
//! completion of an interrupted one when a database opens. Never: runs
//! two of these at once (the caller serializes them), or frees a page that
//! anything still reachable points to.
//!
//! A tree's root page is allocated before the catalogue commit that names
//! it, and a dropped tree's pages are freed after the commit that removes
//! its name; a crash in between would leave pages that nothing owns. So
//! each operation first records its intent in the meta page, in the same
//! log group as its first page change:
//! - **create**: the root is allocated, initialised and named in slot
//!   [`CREATING_SLOT`] in one group; then the catalogue commit; then the
//!   slot is cleared (or, if the commit failed, the root freed with it).
//!   At open, a set slot whose page the catalogue names is cleared, and
//!   one the catalogue does not name is freed.
//! - **drop**: the root is named in [`DROPPING_SLOT`]; the catalogue
//!   commit removes the name; every commit still writing to the tree is
//!   waited for (all key stripes taken once) and later ones are refused;
//!   a checkpoint moves the redo point past every commit that wrote to the
//!   tree; then the pages are freed bottom-up, each in one group with the
//!   zeroing of its parent's pointer to it, the root last with the slot
//!   cleared. At any crash the tree still reachable from the slot holds
//!   only live pages, so the next open resumes the frees after its own
//!   checkpoint. A set slot that the catalogue still names (the drop's
//!   commit did not survive) is simply cleared.
//!
//! A slot a failed clearing left set is resolved by the session's next
//! create or drop the way an open resolves it, and a drop clears a create
//! slot naming the tree it drops in the group that sets its own slot.

use std::sync::Arc;

use crate::btree::node::{self, Node};
use crate::btree::BTree;
use crate::buffer::alloc::SpaceGuard;
use crate::buffer::alloc::META_PAGE;
use crate::buffer::blob::{self, BlobRef};
use crate::buffer::page::PageType;
use crate::buffer::{BufferPool, PageMut};
use crate::txn::{Committer, Expect};
use crate::wal::record::Write;
use crate::wal::Durability;
use crate::{Error, Result};

/// Root slot of the catalogue (tree name -> root page id).
pub(crate) const CATALOG_SLOT: usize = 0;
/// Root slot naming the root of a tree being created (0: none).
pub const CREATING_SLOT: usize = 1;
/// Root slot naming the root of a tree being dropped (0: none).
pub const DROPPING_SLOT: usize = 2;

/// Creates the tree `name` and returns its root page id. Runs on a worker.
pub(crate) async fn create(committer: &Committer, catalog: &BTree, name: &[u8]) -> Result<u64> {
    let pool = &committer.pool;
    if catalog.get(name).await?.is_some() {
        return Err(Error::KeyExists);
    }
    resolve_stale_create(pool, catalog).await?;
    let root = allocate_root(committer).await?;
    let w = Write::new(
        catalog.root(),
        name.to_vec(),
        Some(root.to_le_bytes().to_vec()),
    );
    let check = (catalog.root(), name.to_vec(), Expect::Absent);
    let done = committer
        .commit(vec![w], vec![check], Durability::Sync)
        .await;
    match done {
        // The commit may be in the log: the next open decides.
        Err(e) if pool.poisoned().is_some() => Err(e),
        // The tree exists (the commit is durable): a failed clear leaves a
        // slot the next create or open resolves, not a create to report
        // as failed (a caller would take the tree for absent).
        Ok(_) => {
            let _left_to_the_next_create = clear_intent(pool, CREATING_SLOT, None).await;
            Ok(root)
        }
        Err(e) => {
            clear_intent(pool, CREATING_SLOT, Some(root)).await?;
            Err(e)
        }
    }
}

/// Resolves a create slot left set by a create of this session whose
/// clearing failed (an I/O error latching the meta page), the way an open
/// does: cleared if the catalogue names its page, the page freed with it
/// if not. Every later create failed `Corrupt` until a reopen, and a drop
/// of the tree left the slot naming a freed page, which the next open
/// freed again, maybe from another tree that had taken it (a review's
/// finding).
async fn resolve_stale_create(pool: &BufferPool, catalog: &BTree) -> Result<()> {
    let stale = pool.root(CREATING_SLOT).await?;
    if stale == 0 {
        return Ok(());
    }
    let orphan = !catalogue_roots(catalog).await?.contains(&stale);
    clear_intent(pool, CREATING_SLOT, orphan.then_some(stale)).await
}

/// Fails unless root slot `slot` of the latched meta page `m` is clear
/// (the caller serializes creates and drops; a set slot is damage).
fn no_intent(pool: &BufferPool, m: &SpaceGuard<'_>, slot: usize) -> Result<()> {
    match pool.root_in(m, slot)? {
        0 => Ok(()),
        pid => Err(Error::Corrupt {
            page: META_PAGE,
            what: format!("root slot {slot} already records a create or drop (page {pid})"),
        }),
    }
}

/// Clears intent slot `slot`, freeing page `free` in the same log group.
async fn clear_intent(pool: &BufferPool, slot: usize, free: Option<u64>) -> Result<()> {
    if let Some(pid) = free {
        // Its values first, each in a group of its own.
        free_leaf_values(pool, pid).await?;
    }
    let mut m = pool.lock_space().await?;
    // Every wait and check first, the slot cleared last: a change made
    // before an error is logged alone when its page is unlatched, and the
    // slot cleared before a failed fix left the page it named used and
    // named by nothing, lost for good (a review's finding).
    match free {
        None => {
            pool.set_root_in(&mut m, slot, 0)?;
            pool.log_with_space(&mut [], &mut m)
        }
        Some(pid) => {
            let mut p = pool.fix_exclusive(pid).await?;
            no_values_left(pool, &p, pid)?;
            pool.free_in(&mut m, &mut p).await?;
            pool.set_root_in(&mut m, slot, 0)?;
            pool.log_with_space(&mut [&mut p], &mut m)
        }
    }
}

/// Frees the large values leaf `pid` holds (nothing for an inner node),
/// one value per log group: its entry removed from the leaf with the map
/// bits of its extents, so that a resumed drop never frees a value twice.
/// The group freeing the leaf then holds no value's map pages: with all
/// of the leaf's values in it, one map page per 127 MiB group their
/// extents lie in and an admission of 4 pages, a leaf naming values in
/// ~30 groups of a database with a 1 MiB log made a change past the
/// log's record limit, which stopped the database, and every open
/// resumed the drop with the same change: it could no longer open (a
/// review of large values; no test: it takes values spread over more
/// than 4 GiB).
///
/// A value whose extents lie in more groups than one change may latch or
/// log ([`BufferPool::map_pages_per_change`]) is freed a tail at a time,
/// its reference cut to the extents left in the same group (its length
/// with them: a reference whose bytes no longer match its checksum, in a
/// tree nobody reads any more). In one group it was refused, and a drop
/// resumed at open failed every open with that pool (a review's finding).
async fn free_leaf_values(pool: &BufferPool, pid: u64) -> Result<()> {
    let per_change = pool.map_pages_per_change();
    let geo = crate::buffer::space_map::Geometry::new(pool.page_size());
    // Each turn removes one entry, or frees at least one page of a value.
    for _ in 0..pool.page_size() as u64 + pool.array().pages() {
        let groups = match leaf_value(pool, &pool.fix_shared(pid).await?, pid)? {
            Some((_, r)) => {
                let (_, freed) = blob::split_tail(&r.extents, geo, per_change);
                blob::map_groups(geo, &freed).len() as u64
            }
            None => return Ok(()),
        };
        // The leaf, the meta page and the map pages of the tail freed (the
        // leaf changes only here: the tree is gone). An extent may span
        // many groups (it counted two per extent; a review's finding).
        let _room = pool.admit_log(2 + groups).await?;
        let mut m = pool.lock_space().await?;
        let mut leaf = pool.fix_exclusive(pid).await?;
        let Some((i, r)) = leaf_value(pool, &leaf, pid)? else {
            return Ok(());
        };
        let (kept, freed) = blob::split_tail(&r.extents, geo, per_change);
        let tail = !kept.is_empty();
        let mut n = crate::btree::tree::node_mut(&mut leaf, pid)?;
        if kept.is_empty() {
            pool.blob_space_in(&mut m, &[], &freed, -1).await?;
            n.remove_at(i);
        } else {
            let rest = BlobRef {
                len: kept.iter().map(|e| u64::from(e.pages)).sum::<u64>() * pool.page_size() as u64,
                crc: r.crc,
                extents: kept,
            }
            .encode();
            // Checked before the map bits change: an update that failed
            // after them left the bits logged clear while the leaf still
            // named the extents, and every resumed drop, so every open,
            // failed `Corrupt` (a review's finding). Shorter than the
            // reference it replaces, it is written in place.
            if rest.len() > n.as_node().payload_at(i).len() {
                return Err(Error::Corrupt {
                    page: pid,
                    what: "a shortened large value's reference is longer than the reference".into(),
                });
            }
            pool.blob_space_in(&mut m, &[], &freed, 0).await?;
            // An update clears the mark of a reference.
            n.update_at(i, &rest).map_err(|_| Error::Corrupt {
                page: pid,
                what: "a shortened large value's reference did not fit".into(),
            })?;
            n.set_ref_at(i, true);
        }
        pool.log_with_space(&mut [&mut leaf], &mut m)?;
        pool.retire(freed);
        if tail {
            pool.tail_freed()?;
        }
    }
    Err(Error::Corrupt {
        page: pid,
        what: "a leaf held more large values than a page has bytes".into(),
    })
}

/// [`Error::Corrupt`] if leaf `pid`, about to be freed, still names a
/// large value ([`free_leaf_values`] freed them all: its extents would
/// stay allocated for good).
fn no_values_left(pool: &BufferPool, page: &[u8], pid: u64) -> Result<()> {
    match leaf_value(pool, page, pid)? {
        None => Ok(()),
        Some(_) => Err(Error::Corrupt {
            page: pid,
            what: "a leaf being freed still names a large value".into(),
        }),
    }
}

/// The first large value's entry and reference in `page` (leaf `pid`),
/// None if it holds none or is not a leaf.
fn leaf_value(pool: &BufferPool, page: &[u8], pid: u64) -> Result<Option<(usize, BlobRef)>> {
    let n = Node::new(page).map_err(|c| c.into_error(pid))?;
    if !n.is_leaf() {
        return Ok(None);
    }
    match (0..n.len()).find(|&i| n.is_ref_at(i)) {
        Some(i) => Ok(Some((
            i,
            BlobRef::read(n.payload_at(i), pool.page_size(), pid)?,
        ))),
        None => Ok(None),
    }
}

/// Allocates and initialises a root leaf named in [`CREATING_SLOT`], all
/// in one log group. A page that was the root of a tree dropped since
/// open is never handed out as a new root (a stale handle of the dropped
/// tree would write into the new one): the allocation passes over them.
/// (It took each such page and freed it again in the same group: a loop
/// of creates and drops latched and logged one more page per create,
/// until the group outgrew the log's record limit and stopped the
/// database; a review's finding.)
async fn allocate_root(committer: &Committer) -> Result<u64> {
    let pool = &committer.pool;
    let dropped = committer.dropped_roots();
    let mut m = pool.lock_space().await?;
    no_intent(pool, &m, CREATING_SLOT)?;
    let mut root = pool
        .allocate_in_except(&mut m, PageType::Leaf, false, |pid| dropped.contains(&pid))
        .await?;
    node::init(&mut root, true, None, None, 0);
    let pid = root.pid();
    pool.set_root_in(&mut m, CREATING_SLOT, pid)?;
    pool.log_with_space(&mut [&mut root], &mut m)?;
    Ok(pid)
}

/// The first part of dropping the tree `name` at `root`: the intent, the
/// catalogue commit, the barrier against writers. The caller then takes
/// a checkpoint and calls [`destroy`]. Runs on a worker.
pub(crate) async fn begin_drop(
    committer: &Committer,
    catalog: &BTree,
    name: &[u8],
    root: u64,
) -> Result<()> {
    let pool = &committer.pool;
    let stale = pool.root(DROPPING_SLOT).await?;
    // A drop of this session whose commit failed and whose clearing failed
    // too left the slot naming a tree the catalogue still names (the
    // caller finished any drop that did commit): nothing to resume, and
    // every later drop failed `Corrupt` until a reopen.
    let resolved = stale != 0 && catalogue_roots(catalog).await?.contains(&stale);
    {
        let mut m = pool.lock_space().await?;
        if !(resolved && pool.root_in(&m, DROPPING_SLOT)? == stale) {
            no_intent(pool, &m, DROPPING_SLOT)?;
        }
        pool.set_root_in(&mut m, DROPPING_SLOT, root)?;
        // A create slot left naming this tree (its clearing failed) would
        // have the next open free the root again once the drop freed it,
        // maybe from a tree that took the page since.
        if pool.root_in(&m, CREATING_SLOT)? == root {
            pool.set_root_in(&mut m, CREATING_SLOT, 0)?;
        }
        pool.log_with_space(&mut [], &mut m)?;
    }
    let w = Write::new(catalog.root(), name.to_vec(), None);
    let check = (
        catalog.root(),
        name.to_vec(),
        Expect::Value(Some(root.to_le_bytes().to_vec())),
    );
    if let Err(e) = committer
        .commit(vec![w], vec![check], Durability::Sync)
        .await
    {
        if pool.poisoned().is_none() {
            clear_intent(pool, DROPPING_SLOT, None).await?;
        }
        return Err(e);
    }
    committer.mark_dropped(root, name).await;
    Ok(())
}

/// Frees every page of the tree at `root` (named in [`DROPPING_SLOT`]),
/// bottom-up: each page in one log group with the zeroing of its parent's
/// pointer to it, the root last with the slot cleared. Resumable after a
/// crash at any point. Runs on a worker; nothing else may use the tree.
pub(crate) async fn destroy(pool: &Arc<BufferPool>, root: u64) -> Result<()> {
    // Each turn frees at least one page; a tree has fewer pages than the
    // array.
    for _ in 0..=pool.array().pages() {
        // Descend along the first remaining child to a leaf, or to an
        // inner node whose children are all gone.
        let (mut parent, mut pid, mut leaf) = (None, root, false);
        for _ in 0..crate::btree::tree::MAX_HEIGHT {
            let g = pool.fix_shared(pid).await?;
            let n = Node::new(&g).map_err(|c| c.into_error(pid))?;
            leaf = n.is_leaf();
            let Some((slot, child)) = first_child(&n).filter(|_| !leaf) else {
                break;
            };
            parent = Some((pid, slot));
            pid = child;
        }
        match parent {
            // The root, last (a leaf, or an inner node emptied).
            None => {
                clear_intent(pool, DROPPING_SLOT, Some(root)).await?;
                // The root may name another tree later: none of this
                // one's records may stay cached (fills in flight too).
                pool.records().clear();
                return Ok(());
            }
            // A leaf: its parent's children are all leaves; free them all.
            Some((ppid, _)) if leaf => free_leaf_children(pool, ppid).await?,
            Some((ppid, slot)) => free_child(pool, ppid, slot, pid).await?,
        }
    }
    Err(Error::Corrupt {
        page: root,
        what: "dropping the tree freed more pages than the array has (a cycle)".into(),
    })
}

/// Frees `child`, the child at `slot` of inner node `pid`, in one group
/// with the zeroing of the pointer to it.
async fn free_child(pool: &BufferPool, pid: u64, slot: ChildSlot, child: u64) -> Result<()> {
    if child == pid {
        // Latching both would wait for good (a damaged or forged node
        // naming itself; a review's finding).
        return Err(Error::Corrupt {
            page: pid,
            what: "an inner node names itself as its child".into(),
        });
    }
    free_leaf_values(pool, child).await?;
    // Room in the log for the group (the parent, the child, the map and
    // meta pages), taken before any latch: a large tree's drop must not
    // outrun the checkpoints (without it, a drop many times the log
    // filled it past what a checkpoint could free, and the log and the
    // close's checkpoint waited for each other: `tests/wal.rs`, about 1 run
    // in 20 under load).
    let _room = pool.admit_log(4).await?;
    let mut m = pool.lock_space().await?;
    let mut par = pool.fix_exclusive(pid).await?;
    let mut c = pool.fix_exclusive(child).await?;
    // Every wait and check first, the changes last: a change made before
    // an error is logged alone when its page is unlatched, and the pointer
    // cleared before `free_in` failed (latching the map page: an I/O
    // error) left the child used and named by nothing, lost for good (a
    // review's finding). `free_in` changes nothing unless it succeeds.
    child_of(&mut par, pid, slot)?;
    no_values_left(pool, &c, child)?;
    pool.free_in(&mut m, &mut c).await?;
    clear_child(&mut par, pid, slot)?;
    pool.log_with_space(&mut [&mut par, &mut c], &mut m)
}

/// Frees every child of inner node `pid` (all leaves), each in one group
/// with the zeroing of its pointer.
async fn free_leaf_children(pool: &Arc<BufferPool>, pid: u64) -> Result<()> {
    loop {
        let next = {
            let g = pool.fix_shared(pid).await?;
            let n = Node::new(&g).map_err(|c| c.into_error(pid))?;
            first_child(&n)
        };
        let Some((slot, child)) = next else {
            return Ok(());
        };
        free_child(pool, pid, slot, child).await?;
    }
}

/// Which child pointer of an inner node: entry `i`, or the upper child.
#[derive(Clone, Copy)]
enum ChildSlot {
    Entry(usize),
    Upper,
}

/// The first child pointer of inner node `n` that is not zero.
fn first_child(n: &Node<'_>) -> Option<(ChildSlot, u64)> {
    (0..n.len())
        .map(|i| (ChildSlot::Entry(i), n.child_at(i)))
        .chain(std::iter::once((ChildSlot::Upper, n.upper_child())))
        .find(|&(_, c)| c != 0)
}

fn clear_child(page: &mut PageMut<'_>, pid: u64, slot: ChildSlot) -> Result<()> {
    child_of(page, pid, slot)?;
    let mut n = crate::btree::tree::node_mut(page, pid)?;
    match slot {
        ChildSlot::Entry(i) => n.set_child_at(i, 0),
        ChildSlot::Upper => n.set_upper_child(0),
    }
    Ok(())
}

/// Checks that inner node `pid` (`page`) has child pointer `slot`,
/// changing nothing: what [`clear_child`] needs to succeed.
fn child_of(page: &mut PageMut<'_>, pid: u64, slot: ChildSlot) -> Result<()> {
    let n = crate::btree::tree::node_mut(page, pid)?;
    if let ChildSlot::Entry(i) = slot {
        if n.as_node().payload_at(i).len() != 8 {
            return Err(Error::Corrupt {
                page: pid,
                what: format!("inner entry {i} does not hold a page id"),
            });
        }
    }
    Ok(())
}

/// Completes a create or drop that a crash interrupted (see the module
/// doc). Runs on a worker at open, after recovery and the open
/// checkpoint, before any user operation.
pub(crate) async fn finish_interrupted(pool: &Arc<BufferPool>, catalog: &BTree) -> Result<()> {
    let (creating, dropping) = (
        pool.root(CREATING_SLOT).await?,
        pool.root(DROPPING_SLOT).await?,
    );
    if creating == 0 && dropping == 0 {
        return Ok(());
    }
    let named = catalogue_roots(catalog).await?;
    if creating != 0 {
        let orphan = (!named.contains(&creating)).then_some(creating);
        clear_intent(pool, CREATING_SLOT, orphan).await?;
    }
    if dropping != 0 {
        if named.contains(&dropping) {
            clear_intent(pool, DROPPING_SLOT, None).await?;
        } else {
            destroy(pool, dropping).await?;
        }
    }
    Ok(())
}

/// The root a drop of this session named and did not finish (its wait
/// for readers, its checkpoint or its freeing failed), if any: the
/// intent slot still holds it, and every later drop refused to start.
pub(crate) async fn unfinished_drop(committer: &Committer) -> Result<Option<u64>> {
    let root = committer.pool.root(DROPPING_SLOT).await?;
    Ok((root != 0 && committer.was_dropped(root)).then_some(root))
}

/// Root page ids of every tree the catalogue names.
async fn catalogue_roots(catalog: &BTree) -> Result<Vec<u64>> {
    let mut c = catalog.cursor(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, true);
    let mut out = Vec::new();
    while let Some((_, v)) = c.next().await? {
        if let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) {
            out.push(u64::from_le_bytes(b));
        }
    }
    Ok(out)
}
