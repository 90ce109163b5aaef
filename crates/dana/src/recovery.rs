//! Checkpoints and recovery: finding the log at open, redoing it,
//! re-applying its commits, and the checkpoints that bound all of it.
//!
//! Owns: the order of a checkpoint (full images from the log end, write
//! back, sync, record, control block), the open's log decisions (format,
//! identity, read-only refusal), and recovery's second part (`reapply`).
//! Never: decides when a checkpoint is due (the log asks) or opens files
//! (`open.rs` does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::buffer::BufferPool;
use crate::io::{Array, Target};
use crate::sched;
use crate::wal::record::{self, Write};
use crate::wal::recover::{self, Recovered};
use crate::wal::{Resume, Wal};
use crate::{Error, Options, Result};

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

/// A checkpoint: every page dirty when it starts is written back (at the
/// pace of write-back, after its records are durable), the data devices
/// are synced, the checkpoint record is made durable and the control block
/// names it. Recovery then starts at its redo LSN.
pub(crate) async fn checkpoint(pool: &BufferPool, wal: &Arc<Wal>) -> Result<()> {
    let redo = wal.begin_checkpoint();
    pool.flush_all().await?;
    let (lsn, end) = wal.append(record::checkpoint(redo).into_unsealed())?;
    wal.want(end);
    wal.wait_durable(end).await?;
    wal.finish_checkpoint(lsn, redo).await
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
    commits: &[(u64, Vec<Write>)],
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

/// [`checkpoint`], one at a time.
pub(crate) async fn exclusive_checkpoint(
    pool: &BufferPool,
    wal: &Arc<Wal>,
    busy: &AtomicBool,
) -> Result<()> {
    struct Busy<'a>(&'a AtomicBool);
    impl Drop for Busy<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    while busy.swap(true, Ordering::AcqRel) {
        sched::yield_now().await;
    }
    let _busy = Busy(busy);
    checkpoint(pool, wal).await
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
