//! Recovery: finding the log at open, redoing it, re-applying its commits.
//!
//! Owns: the open's log decisions (format, identity, read-only refusal)
//! and recovery's second part (`reapply`). Never: opens files (`open.rs`
//! does) or decides when a checkpoint runs (`checkpoint.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::buffer::BufferPool;
use crate::checkpoint::checkpoint;
use crate::io::{Array, Target};
use crate::wal::record::{self, Write};
use crate::wal::recover::{self, LogPlace, Recovered};
use crate::wal::{CheckpointScope, LogSet, Resume, Wal};
use crate::{Error, Options, Result};

/// What recovery did when the database opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Log records read from the last checkpoint's redo LSN.
    pub records: u64,
    /// Pages whose logged changes were redone.
    pub pages_redone: u64,
    /// Pages that failed their checksum and were rebuilt from a full image.
    pub pages_repaired: u64,
    /// Leaf cuts (the left halves of splits, logged as their cut key)
    /// redone.
    pub leaf_cuts: u64,
    /// Keys that leaf cuts left out because the leaf as found held more
    /// than it did at its split; each is written again by a re-applied
    /// commit.
    pub keys_left_to_reapply: u64,
    /// Flushes found whole after where a log ended: flushes that were in
    /// flight beside an earlier one the crash tore
    /// (`Options::log_flushes_in_flight`); none of their commits had been
    /// acknowledged, and the log resumes before them. A lower bound: the
    /// intact flush markers past the end, less one for the torn flush's
    /// own (`wal::recover::Scan::flushes_past_end`).
    pub flushes_past_end: u64,
    /// Commit records re-applied through the trees.
    pub commits: u64,
    /// Commit records this recovery appended again at the log end, to
    /// checkpoint while it re-applied commits (the log was short of room).
    pub commits_appended_again: u64,
    /// Commit records an earlier recovery appended again, ignored here:
    /// a crash came before the checkpoint after them finished (their
    /// first copies, still in the log, were re-applied instead).
    pub appended_again_ignored: u64,
    /// The GSN after the last valid record of every log (where the
    /// database's sequence numbers go on).
    pub log_end: u64,
}

/// What [`prepare_logs`] found.
#[derive(Default)]
pub(crate) struct Prepared {
    /// Where the logs resume (None: no log to use).
    pub(crate) start: Option<LogStart>,
    /// What recovery found.
    pub(crate) recovered: Option<Recovered>,
    /// The identity of logs it formatted.
    pub(crate) new_id: Option<u64>,
    /// A read-only open's logs' end: pages with an LSN at or past it are
    /// newer than the log.
    pub(crate) read_only_end: Option<u64>,
}

/// Where the logs resume: each log's stream position, and the next GSN.
pub(crate) struct LogStart {
    pub(crate) resume: Vec<Resume>,
    pub(crate) next_gsn: u64,
}

/// Finds the logs and runs recovery's first part (the redo of page
/// records): formats the logs of a new database (or one that never had
/// any), checks the identity and place of existing ones against
/// `db_log_id` (the meta page's) and their number, and the data files'
/// `checkpoint_stamp` (the meta page's; 0: unknown) against their moment
/// (`buffer::alloc`'s module doc), refuses a read-only open that would
/// need recovery. Returns where the logs resume (None: no
/// log to use), what recovery found, the identity of logs it
/// formatted, and on a read-only open of a database with logs, the logs'
/// end (no page read may carry an LSN at or past it).
pub(crate) fn prepare_logs(
    array: &Array,
    logs: &[Target],
    db_log_id: u64,
    checkpoint_stamp: u64,
    log_ends: &[u64],
    create: bool,
    opts: &Options,
) -> Result<Prepared> {
    if logs.is_empty() {
        return Ok(Prepared::default());
    }
    let count = logs.len() as u32;
    if create || db_log_id == 0 {
        // A new database, or one that never had a log: whatever the files
        // hold is not ours; format them.
        if opts.read_only {
            return Ok(Prepared::default());
        }
        let id = opts.log_identity.unwrap_or_else(new_log_id);
        let per_log = crate::wal::per_log_bytes(opts.log_bytes, logs.len(), opts.page_size);
        let mut resume = Vec::with_capacity(logs.len());
        for (i, t) in logs.iter().enumerate() {
            let block = flush_block(t, opts)?;
            let place = LogPlace {
                index: i as u32,
                count,
                next_gsn: 1,
            };
            resume.push(recover::format(t, per_log, block, id, place)?);
        }
        let start = LogStart {
            resume,
            next_gsn: 1,
        };
        return Ok(Prepared {
            start: Some(start),
            new_id: Some(id),
            ..Prepared::default()
        });
    }
    let views;
    let logs: &[Target] = if !opts.read_only {
        // A crash can leave a mirrored log's copies different, each valid
        // alone: recovery reads one, and every copy must hold it.
        for (i, t) in logs.iter().enumerate() {
            recover::resync_mirror(t).map_err(recover::in_log(t, i))?;
        }
        logs
    } else {
        // Read-only, the copies stay as they are: the copy a writable
        // open would keep is read alone.
        views = logs
            .iter()
            .enumerate()
            .map(|(i, t)| recover::read_only_view(t).map_err(recover::in_log(t, i)))
            .collect::<Result<Vec<_>>>()?;
        &views
    };
    let mut ctls = Vec::with_capacity(logs.len());
    for (i, t) in logs.iter().enumerate() {
        let name = recover::log_name(t, i);
        let ctl = recover::read_control(t)
            .map_err(recover::in_log(t, i))?
            .ok_or_else(|| Error::CorruptLog {
                offset: 0,
                what: format!(
                    "both control blocks of {name} are damaged; the database's log cannot be \
                     found"
                ),
            })?;
        if ctl.log_id != db_log_id {
            return Err(Error::Log(format!(
                "{name} belongs to another database (log id {:016x}, this database's is \
                 {db_log_id:016x})",
                ctl.log_id
            )));
        }
        if ctl.index != i as u32 || ctl.count != count {
            return Err(Error::Log(format!(
                "{name} says it is log {} of {}; the database has {count} logs",
                ctl.index, ctl.count
            )));
        }
        ctls.push((t.clone(), ctl));
    }
    recover::check_not_older(checkpoint_stamp, &ctls)?;
    if opts.read_only {
        // The log's end: past its newest control block's next GSN and
        // every change record after the redo LSN (a checkpoint cut before
        // its control block leaves its stamp's record there).
        let mut end = ctls.iter().map(|(_, c)| c.next_gsn).max().unwrap_or(0);
        for (i, (t, ctl)) in ctls.iter().enumerate() {
            let durable = log_ends.get(i).copied().unwrap_or(0);
            match recover::needs_recovery(array, t, *ctl, durable).map_err(recover::in_log(t, i))? {
                Some(e) => end = end.max(e),
                None => {
                    return Err(Error::NeedsRecovery(format!(
                        "log {i} holds changes after the last checkpoint"
                    )))
                }
            }
        }
        recover::check_not_newer(checkpoint_stamp, end)?;
        return Ok(Prepared {
            read_only_end: Some(end),
            ..Prepared::default()
        });
    }
    let r = recover::recover(array, &ctls, cut_leaf, checkpoint_stamp, log_ends)?;
    let start = LogStart {
        resume: r.resume.clone(),
        next_gsn: r.next_gsn,
    };
    Ok(Prepared {
        start: Some(start),
        recovered: Some(r),
        ..Prepared::default()
    })
}

/// The flush block a new log on `t` gets: the device's alignment (at least
/// 512), or [`Options::log_flush_block`] if larger.
fn flush_block(t: &Target, opts: &Options) -> Result<u64> {
    let align = t.alignment().io.max(512);
    let asked = opts.log_flush_block;
    if asked != 0 && (!asked.is_power_of_two() || asked > crate::wal::control::BLOCK) {
        return Err(Error::InvalidArgument(format!(
            "log flush block {asked}: a power of two up to {} bytes",
            crate::wal::control::BLOCK
        )));
    }
    Ok(align.max(asked))
}

/// Redoes a leaf cut (the left half of a split) with the trees' node code:
/// the log's recovery hands every cut it redoes here.
fn cut_leaf(
    page: &mut [u8],
    key: &[u8],
    rewritten: &dyn Fn(&[u8]) -> bool,
) -> std::result::Result<u64, String> {
    crate::btree::node::cut_leaf(page, key, rewritten)
        .map(|n| n as u64)
        .map_err(|c| c.what)
}

/// Recovery, part two: re-applies `commits` (GSN, writes), in GSN order;
/// returns how many commit records it appended again (below).
///
/// Their page changes are logged (full images first: a page written back
/// now may tear), so the log grows. Before the log in use plus the commit
/// records still to re-apply pass three quarters of it, those records are
/// appended again at the log end and a checkpoint moves the redo LSN to
/// the first of them: everything before is on the pages, and the log is
/// back to those commit records. Looked at before every write, not every
/// commit: one commit's images alone can outgrow the log, and the first
/// record appended again then holds only the writes it has left. Admission counted the commit records in
/// use twice for this: they and the log in use fit in three quarters when
/// the crash came, so appending them again fits, and leaves them about
/// three eighths of the log at most, so the next time fits too. (An
/// earlier version appended them again only once the log was three
/// quarters full: with continuous checkpoints a 32-committer crash run's
/// open filled the log that way and hung. The first version re-applied
/// everything in one go: with 32 committers a crashed run's commits
/// needed more log than there was, the log could not be flushed, and the
/// open hung. Checkpoints with the redo LSN at the next old commit freed
/// too little: the new records sit after the old ones.)
pub(crate) async fn reapply(
    pool: &Arc<BufferPool>,
    wal: Option<&Arc<LogSet>>,
    commits: Vec<(u64, Vec<Write<'static>>)>,
) -> Result<u64> {
    let commits = &last_writes(commits);
    // GSN of each commit's record, and whether the log counts it as being
    // applied (only after it was appended again). Page records go to this
    // task's log; commits appended again may go to any log (below).
    let mut lsns: Vec<u64> = commits.iter().map(|c| c.0).collect();
    // The log each commit was appended to again (registered there as
    // being applied).
    let mut again_in: Vec<Option<Arc<Wal>>> = vec![None; commits.len()];
    let mut appended_again = 0u64;
    let local = wal.map(|w| w.local().clone());
    // Room for the page images of one write's re-application (a split
    // cascade's pages and the meta and map pages, as full images).
    let images_room = 8 * (pool.page_size() as u64 + record::HEADER as u64 + 16);
    // Bytes of the commit records from each one to the last: what
    // appending the rest again costs.
    let mut rest = vec![0u64; commits.len() + 1];
    if wal.is_some() {
        for i in (0..commits.len()).rev() {
            rest[i] = rest[i + 1] + record::commit(&commits[i].1).into_unsealed().len() as u64;
        }
    }
    for i in 0..commits.len() {
        let writes = &commits[i].1;
        // Write by write: one commit's page images alone can outgrow the
        // log (a transaction that changed more pages than the log holds:
        // its apply appended the writes it had left as records of their
        // own, `txn::apply_logged`, but its first record holds them all).
        for k in 0..writes.len() {
            // Appended again once the logs' room below the admission mark
            // (every log's: with a log per worker the commits left came
            // from all of them) would not hold them all, or this task's
            // log, where every page image of the re-application goes,
            // has no room left for one write's images (the room of the
            // others let it overflow: a review's finding).
            let short = |set: &LogSet, w: &Arc<Wal>| {
                let mine = room_of(w);
                let others: u64 = set
                    .logs()
                    .iter()
                    .filter(|l| !Arc::ptr_eq(l, w))
                    .map(|l| room_of(l))
                    .sum();
                mine < images_room || mine + others < rest[i]
            };
            let due = match (wal, local.as_ref()) {
                (Some(set), Some(w)) if short(set, w) => Some((set, w)),
                _ => None,
            };
            if let Some((set, w)) = due {
                // Everything appended so far durable first: the records
                // appended again start a flush of their own, where the
                // checkpoint's redo point can be (the start of the flush
                // holding its redo GSN), not behind the page images.
                w.flush_appended().await?;
                // With a log per worker the commits left came from every
                // log, and this one alone may not hold them again: its
                // flush then waited for room no checkpoint could free, and
                // the open spun for ever (`dana crashtest --worker-logs`).
                // Each goes to the first log with room for it below the
                // admission mark, this task's last (it takes the page
                // images), else to the first with room below its capacity
                // (less a reserve for the checkpoint's records: the quarter
                // admission leaves is for this); GSNs keep their order.
                let mut logs: Vec<(Arc<Wal>, u64, u64)> = set
                    .logs()
                    .iter()
                    .filter(|l| !Arc::ptr_eq(l, w))
                    .chain(std::iter::once(w))
                    .cloned()
                    .map(|l| {
                        let (room, whole) = (room_of(&l), whole_room_of(&l, images_room));
                        (l, room, whole)
                    })
                    .collect();
                for j in i..commits.len() {
                    let left = if j == i {
                        &writes[k..]
                    } else {
                        &commits[j].1[..]
                    };
                    // Flagged, so that a recovery after a crash before
                    // the checkpoint below moved the redo point here
                    // ignores the batch (`recover::drop_unfinished_batches`):
                    // its flush may survive as a prefix.
                    let mut again = record::commit(left).into_unsealed();
                    record::set_flags(
                        &mut again,
                        if j == i {
                            record::APPENDED_AGAIN | record::FIRST_APPENDED_AGAIN
                        } else {
                            record::APPENDED_AGAIN
                        },
                    );
                    let len = again.len() as u64;
                    let to = logs
                        .iter()
                        .position(|(_, room, _)| *room >= len)
                        .or_else(|| logs.iter().position(|(_, _, whole)| *whole >= len))
                        .unwrap_or_else(|| {
                            // None has room left: the one with the most.
                            (0..logs.len()).max_by_key(|&t| logs[t].2).unwrap_or(0)
                        });
                    let (log, room, whole) = &mut logs[to];
                    *room = room.saturating_sub(len);
                    *whole = whole.saturating_sub(len);
                    let (lsn, _) = log.append_commit(again, 0)?;
                    appended_again += 1;
                    if let Some(before) = again_in[j].replace(log.clone()) {
                        before.applied(lsns[j]);
                    }
                    lsns[j] = lsn;
                }
                checkpoint(pool, set, CheckpointScope::All).await?;
            }
            // Without a log (`Durability::Off` on a database that has
            // none) nothing is logged, so no LSN covers the changes.
            let cover = if wal.is_some() { lsns[i] } else { 0 };
            crate::txn::apply(pool, &writes[k..=k], false, cover).await?;
        }
        if let Some(log) = &again_in[i] {
            log.applied(lsns[i]);
        }
    }
    Ok(appended_again)
}

/// Bytes log `l` can take before three quarters of it are in use (what
/// admission leaves for operations in progress).
fn room_of(l: &Wal) -> u64 {
    (l.capacity() / 4 * 3).saturating_sub(l.used())
}

/// Bytes log `l` can take before it is full, less `reserve`.
fn whole_room_of(l: &Wal, reserve: u64) -> u64 {
    l.capacity().saturating_sub(l.used() + reserve)
}

/// The writes of `commits` (in GSN order) that re-application needs: of
/// each key of each tree, its last write alone, in its commit, in GSN
/// order; commits left with no write are left out.
///
/// Re-applying every write from the redo point on gives the same final
/// state, but not the same states on the way: the leaves it writes into
/// may have been written back later than the redo point, holding keys
/// that later commits inserted, and re-inserting beside them a key that a
/// later commit deleted built leaves the database never had, which split
/// and needed pages. On a full disk such a recovery failed with
/// `NoSpace`, and the database could not be opened at all, neither read
/// nor shrunk (an outside probe: 712 commits re-applied with 2 pages
/// free, three splits of keys deleted later). A key's last write alone
/// goes where the running database's did.
fn last_writes(commits: Vec<(u64, Vec<Write<'static>>)>) -> Vec<(u64, Vec<Write<'static>>)> {
    let keep: Vec<Vec<bool>> = {
        let mut last: HashMap<(u64, &[u8]), (usize, usize)> = HashMap::new();
        for (i, (_, writes)) in commits.iter().enumerate() {
            for (k, w) in writes.iter().enumerate() {
                last.insert((w.tree, &w.key), (i, k));
            }
        }
        commits
            .iter()
            .enumerate()
            .map(|(i, (_, writes))| {
                (0..writes.len())
                    .map(|k| last.get(&(writes[k].tree, writes[k].key.as_slice())) == Some(&(i, k)))
                    .collect()
            })
            .collect()
    };
    commits
        .into_iter()
        .zip(keep)
        .filter_map(|((gsn, writes), keep)| {
            let kept: Vec<Write<'static>> = writes
                .into_iter()
                .zip(keep)
                .filter_map(|(w, k)| k.then_some(w))
                .collect();
            (!kept.is_empty()).then_some((gsn, kept))
        })
        .collect()
}

/// A fresh log identity: nonzero, unlikely to repeat across databases.
fn new_log_id() -> u64 {
    use rand::RngCore;
    loop {
        let id = rand::rngs::OsRng.next_u64();
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Writes of random commits (tree 1 or 2, one of six keys, a put of a
    /// small value or a delete).
    fn commits() -> impl Strategy<Value = Vec<(u64, Vec<Write<'static>>)>> {
        let write = (1u64..3, 0u8..6, proptest::option::of(any::<u8>()))
            .prop_map(|(tree, key, value)| Write::new(tree, vec![key], value.map(|v| vec![v])));
        proptest::collection::vec(proptest::collection::vec(write, 1..4), 0..24).prop_map(|cs| {
            cs.into_iter()
                .enumerate()
                .map(|(i, ws)| (10 + 3 * i as u64, ws))
                .collect()
        })
    }

    /// Every write of `commits` applied in order to `base`.
    fn replay(
        base: &BTreeMap<(u64, Vec<u8>), Vec<u8>>,
        commits: &[(u64, Vec<Write<'static>>)],
    ) -> BTreeMap<(u64, Vec<u8>), Vec<u8>> {
        let mut m = base.clone();
        for w in commits.iter().flat_map(|c| &c.1) {
            match &w.value {
                Some(v) => m.insert((w.tree, w.key.clone()), v.to_vec()),
                None => m.remove(&(w.tree, w.key.clone())),
            };
        }
        m
    }

    proptest! {
        /// A key's last write alone gives the state every write gives,
        /// from any state the pages held; the commits kept stay in GSN
        /// order, none empty, and no key is written twice.
        #[test]
        fn last_writes_give_the_state_of_all_writes(cs in commits(), base in proptest::collection::btree_map((1u64..3, proptest::collection::vec(0u8..6, 1)), proptest::collection::vec(any::<u8>(), 1), 0..8)) {
            let kept = last_writes(cs.clone());
            prop_assert_eq!(replay(&base, &kept), replay(&base, &cs));
            prop_assert!(kept.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert!(kept.iter().all(|c| !c.1.is_empty()));
            let mut seen = std::collections::HashSet::new();
            for w in kept.iter().flat_map(|c| &c.1) {
                prop_assert!(seen.insert((w.tree, w.key.clone())), "{:?} written twice", w.key);
            }
        }
    }
}
