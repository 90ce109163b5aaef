//! What the buffer pool needs from a write-ahead log, as a trait the log
//! implements (`wal::Wal`), so that the pool never depends on the log's
//! code or its record format.
//!
//! Owns: the contract between a latched page's change and the log. A
//! change comes in one of two kinds:
//! - **covered**: a leaf change made by applying a commit whose record is
//!   already in the log (recovery re-applies that record through the
//!   trees, so the change itself is not logged again). The pool hands the
//!   log the page ([`PageLog::log_covered`]) and gives it the commit's LSN
//!   itself; the log appends a full image only if this is the page's
//!   first change since a checkpoint began (a torn write-back of it must
//!   be rebuildable).
//! - **physical**: any other change (a split, a merge, an allocation, the
//!   meta page, a catalogue change). When the exclusive latch is released
//!   (or a group of latched pages is released together), the pool hands
//!   the log each changed page as latched (if it kept a copy) and as it
//!   is now; the log records a difference or a full image.
//!
//! Either way the record's LSN (or the commit's) becomes the page LSN
//! before the latch drops; write-back then waits until the log is durable
//! past a page's LSN (the WAL rule). A database may have several logs
//! (one per worker, `wal::LogSet`): a page's LSN is then the global
//! sequence number (GSN) of its last change, which orders the records of
//! every log, and "durable past it" means durable in every log. Never: encodes a record (the log
//! does) or does the log's I/O (the log's requests and their completions
//! are routed by the scheduler to the log itself).

use std::future::Future;
use std::pin::Pin;

use crate::Result;

/// Room held in the log for a change about to be made; given back when
/// dropped.
pub type LogRoom = Box<dyn Send + Sync>;

/// The wait for [`LogRoom`].
pub type Admission<'a> = Pin<Box<dyn Future<Output = Result<LogRoom>> + Send + 'a>>;

/// One exclusively latched page's change.
pub struct PageChange<'a> {
    /// The page id.
    pub pid: u64,
    /// The page as it was latched or last logged (None: no copy kept: a
    /// brand-new page, or a leaf, whose changes since its last image may be
    /// covered ones that no physical record holds; the log then records
    /// the whole page).
    pub before: Option<&'a [u8]>,
    /// The page now.
    pub after: &'a [u8],
    /// A brand-new page: the log must record all of it.
    pub fresh: bool,
    /// The change is a leaf of the tree rooted at `.0` cut at key `.1`
    /// (the left half of a split: every key above went to a new page of
    /// the same record). The log may record just that instead of the
    /// page, when the page has a full image since the last checkpoint
    /// began to redo the cut on; the pool then treats the page as having
    /// unlogged changes (its bytes are not what redo rebuilds).
    pub cut: Option<(u64, &'a [u8])>,
}

/// The write-ahead log as the buffer pool sees it.
pub trait PageLog: Send + Sync {
    /// Appends one record that redoes `changes` together (all or none).
    /// `Ok(None)`: nothing changed, nothing appended; `Ok(Some(lsn))`: the
    /// record's LSN, which becomes every page's LSN.
    fn log_changes(&self, changes: &[PageChange<'_>]) -> Result<Option<u64>>;
    /// Appends a commit record whose writes the log itself encoded
    /// (`commit`: the record as built so far, handed through unchanged),
    /// holding `changes` too, redone together with it: the free-space
    /// map's changes for a commit's large values. Returns the record's LSN
    /// (every page's LSN) and the LSN after it; registers the commit as
    /// being applied, like any commit record.
    /// `dep`: the most GSN of a page the transaction read (the record
    /// depends on the other logs up to there).
    fn log_commit(
        &self,
        commit: Vec<u8>,
        changes: &[PageChange<'_>],
        dep: u64,
    ) -> Result<(u64, u64)>;
    /// A covered change of page `page` (its bytes now, its page LSN still
    /// the one before the change), redone at recovery by the commit record
    /// at `cover` that covers it. Returns the LSN of a full image if the
    /// log appended one (the page's first change since a checkpoint
    /// began), else None.
    fn log_covered(&self, pid: u64, page: &[u8], cover: u64) -> Result<Option<u64>>;
    /// Waits until the log can take up to `bytes` of page records of a
    /// change about to be made that is not a commit (commits are admitted
    /// by the transaction layer), so that such writes cannot fill the log
    /// past what a checkpoint can free; the room is held until the
    /// returned value drops. Call it before latching anything.
    fn admit(&self, bytes: u64) -> Admission<'_>;
    /// The longest record the log takes, in bytes (the shortest of its
    /// logs' limits).
    fn max_record(&self) -> u64;
    /// Everything before this LSN is on stable storage.
    fn durable(&self) -> u64;
    /// The LSN the next record will get: every LSN assigned so far lies
    /// below it, so a page read with an LSN at or past it was written by
    /// changes this log never held (data files newer than the log).
    fn next_lsn(&self) -> u64;
    /// Asks for a flush up to `lsn` without waiting.
    fn want(&self, lsn: u64);
    /// Parks `waker` until [`PageLog::durable`] next moves or the log
    /// stops. The caller looks at the durable point after registering
    /// too, so that a move in between is not missed.
    fn wake_when_durable(&self, waker: &std::task::Waker);
    /// The error that stopped the log, if any (the pool then writes no
    /// page any more).
    fn poisoned(&self) -> Option<crate::Error>;
}
