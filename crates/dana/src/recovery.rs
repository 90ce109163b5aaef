//! Recovery: finding the log at open, redoing it, re-applying its commits.
//!
//! Owns: the open's log decisions (format, identity, read-only refusal)
//! and recovery's second part (`reapply`). Never: opens files (`open.rs`
//! does) or decides when a checkpoint runs (`checkpoint.rs`).

use std::sync::Arc;

use crate::buffer::BufferPool;
use crate::checkpoint::checkpoint;
use crate::io::{Array, Target};
use crate::wal::record::{self, Write};
use crate::wal::recover::{self, Recovered};
use crate::wal::{Resume, Wal};
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
    /// Commit records re-applied through the trees.
    pub commits: u64,
    /// Where the valid log ended.
    pub log_end: u64,
}

/// Finds the log and runs recovery's first part (the redo of page
/// records): formats a log for a new database (or one that never had
/// one), checks the identity of an existing one against `db_log_id` (the
/// meta page's), refuses a read-only open that would need recovery.
/// Returns where the log resumes (None: no log to use), what recovery
/// found, and the identity of a log it formatted.
pub(crate) fn prepare_log(
    array: &Array,
    log: Option<&Target>,
    db_log_id: u64,
    create: bool,
    opts: &Options,
) -> Result<(Option<Resume>, Option<Recovered>, Option<u64>)> {
    let read_only = opts.read_only;
    let mut recovered = None;
    let mut new_id = None;
    let resume = match log {
        None => None,
        Some(t) => {
            let block = t.alignment().io.max(512);
            if create || db_log_id == 0 {
                // A new database, or one that never had a log: whatever
                // the file holds is not ours; format it.
                if read_only {
                    None
                } else {
                    let id = opts.log_identity.unwrap_or_else(new_log_id);
                    new_id = Some(id);
                    Some(recover::format(t, opts.log_bytes, block, id)?)
                }
            } else {
                let ctl = recover::read_control(t)?.ok_or_else(|| Error::CorruptLog {
                    offset: 0,
                    what: "both control blocks of the log are damaged; the database's log \
                           cannot be found"
                        .into(),
                })?;
                if ctl.log_id != db_log_id {
                    return Err(Error::Log(format!(
                        "the log belongs to another database (log id {:016x}, this \
                         database's is {db_log_id:016x})",
                        ctl.log_id
                    )));
                }
                if read_only {
                    if recover::needs_recovery(t, ctl)? {
                        return Err(Error::NeedsRecovery(
                            "the log holds changes after the last checkpoint".into(),
                        ));
                    }
                    None
                } else {
                    let r = recover::recover(array, t, ctl)?;
                    let resume = r.resume;
                    recovered = Some(r);
                    resume
                }
            }
        }
    };
    Ok((resume, recovered, new_id))
}

/// Recovery, part two: re-applies `commits` (LSN, writes), in log order.
///
/// Their page changes are logged (full images first: a page written back
/// now may tear), so the log grows. When it is three quarters full, the
/// commits still to re-apply are appended again at the log end and a
/// checkpoint moves the redo LSN to the first of them: everything before
/// is on the pages, and the log is back to those commit records. (The
/// first version re-applied everything in one go: with 32 committers a
/// crashed run's commits needed more log than there was, the log could not
/// be flushed, and the open hung. Checkpoints with the redo LSN at the
/// next old commit freed too little: the new records sit after the old
/// ones.)
pub(crate) async fn reapply(
    pool: &Arc<BufferPool>,
    wal: Option<&Arc<Wal>>,
    commits: &[(u64, Vec<Write<'static>>)],
) -> Result<()> {
    // LSN of each commit's record, and whether the log counts it as being
    // applied (only after it was appended again).
    let mut lsns: Vec<u64> = commits.iter().map(|c| c.0).collect();
    let mut registered = false;
    for i in 0..commits.len() {
        if let Some(w) = wal.filter(|w| w.used() > w.capacity() / 4 * 3) {
            for j in i..commits.len() {
                let (lsn, _) = w.append_commit(record::commit(&commits[j].1).into_unsealed())?;
                if registered {
                    w.applied(lsns[j]);
                }
                lsns[j] = lsn;
            }
            registered = true;
            checkpoint(pool, w).await?;
        }
        // Without a log (`Durability::Off` on a database that has none)
        // nothing is logged, so no LSN covers the changes.
        let cover = if wal.is_some() { lsns[i] } else { 0 };
        crate::txn::apply(pool, &commits[i].1, false, cover).await?;
        if let (Some(w), true) = (wal, registered) {
            w.applied(lsns[i]);
        }
    }
    Ok(())
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
