//! What the buffer pool needs from a write-ahead log, as a trait the log
//! implements (`wal::Wal`), so that the pool never depends on the log's
//! code or its record format.
//!
//! Owns: the contract between a latched page's change and the log: when
//! an exclusive latch is released (or a group of latched pages is
//! released together), the pool hands the log each page's bytes as
//! latched and as they are now; the log decides how to record them (diff
//! or full image) and returns the record's LSN, which the pool stores in
//! the page before the latch drops. Write-back then waits until the log
//! is durable past a page's LSN (the WAL rule). Never: encodes a record
//! (the log does) or does I/O (the log's requests go through the worker
//! queues; their completions come back through the pool's handler).

use std::time::Duration;

use crate::io::Completion;
use crate::Result;

/// One exclusively latched page's change.
pub struct PageChange<'a> {
    /// The page id.
    pub pid: u64,
    /// The page as it was latched (None: no copy kept, a brand-new page).
    pub before: Option<&'a [u8]>,
    /// The page now.
    pub after: &'a [u8],
    /// A brand-new page: the log must record all of it.
    pub fresh: bool,
}

/// The write-ahead log as the buffer pool sees it.
pub trait PageLog: Send + Sync {
    /// Appends one record that redoes `changes` together (all or none).
    /// `Ok(None)`: nothing changed, nothing appended; `Ok(Some(lsn))`: the
    /// record's LSN, which becomes every page's LSN.
    fn log_changes(&self, changes: &[PageChange<'_>]) -> Result<Option<u64>>;
    /// Everything before this LSN is on stable storage.
    fn durable(&self) -> u64;
    /// Asks for a flush up to `lsn` without waiting.
    fn want(&self, lsn: u64);
    /// The error that stopped the log, if any (the pool then writes no
    /// page any more).
    fn poisoned(&self) -> Option<crate::Error>;
    /// True if a completion with this tag is the log's.
    fn owns_tag(&self, tag: u64) -> bool;
    /// A completion of one of the log's requests.
    fn complete(&self, c: Completion);
    /// Starts a flush if one is due (a worker's system step); true if it
    /// started one.
    fn pump(&self) -> bool;
    /// How long an idle worker may sleep before the log needs it.
    fn sleep_limit(&self) -> Option<Duration>;
}
