//! The public transaction: reads and buffered writes over one or more
//! trees, committed atomically through [`crate::txn`]'s protocol.
//!
//! Owns: the read set, the write set and the inserts a transaction
//! checks at commit. Never: touches a page (it reads through the public
//! [`crate::Tree`] and commits through the committer).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::btree::tree::Cursor;
use crate::buffer::PageStamp;
use crate::txn::{Committer, Expect};
use crate::validate::{Isolation, PointRead, RangeRead, ReadSet};
use crate::wal::record::Write;
use crate::wal::Durability;
use crate::Result;

/// A transaction: reads see committed data and this transaction's own
/// writes; writes stay private until [`crate::Db::commit`]. What another
/// commit wrote becomes visible key by key as it is applied (see
/// [`crate::Isolation`]). A commit that fails after its record was logged
/// (an I/O error while applying it or while waiting for the log) is in
/// doubt: some of its writes may be visible, the database stops taking
/// writes where part of it was applied (`Error::Poisoned`), and the next
/// open completes or drops it as the log says.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// let (a, b) = (db.create_tree("a").unwrap(), db.create_tree("b").unwrap());
/// a.put(b"alice", &100u64.to_le_bytes()).unwrap();
/// // Move 30 from alice (tree a) to bob (tree b), atomically.
/// db.transaction(|tx| {
///     let v = tx.get(&a, b"alice")?.unwrap();
///     let n = u64::from_le_bytes(v.try_into().unwrap());
///     // The closure may run on a view its commit then refuses (and runs
///     // again): it must not panic on values no serial order gives.
///     tx.put(&a, b"alice", &n.saturating_sub(30).to_le_bytes())?;
///     tx.put(&b, b"bob", &30u64.to_le_bytes())?;
///     Ok(())
/// }).unwrap();
/// assert_eq!(b.get(b"bob").unwrap(), Some(30u64.to_le_bytes().to_vec()));
/// ```
pub struct Transaction {
    committer: Arc<Committer>,
    /// Keys read: the value seen and the stamp of the leaf it came from.
    reads: BTreeMap<(u64, Vec<u8>), Seen>,
    writes: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    inserts: BTreeMap<(u64, Vec<u8>), ()>,
    durability: Durability,
    isolation: Isolation,
    /// Ranges scanned (kept for serializable transactions only).
    ranges: Vec<RangeRead>,
    /// The most GSN of a leaf this transaction read: its commit depends
    /// on every log up to there (it may have read another worker's write
    /// that its log has not made durable yet).
    read_gsn: u64,
    /// [`Transaction::set_isolation`] was called after a read: the commit
    /// fails (its reads were recorded for another isolation).
    isolation_after_read: bool,
}

/// A value read (None: absent) and the stamp of the leaf it came from.
type Seen = (Option<Vec<u8>>, Option<PageStamp>);

/// Entries of a scan in the scan's order: `(key, value)`.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

impl Transaction {
    pub(crate) fn new(committer: Arc<Committer>) -> Transaction {
        let durability = match committer.durability {
            Durability::Off => Durability::Sync,
            d => d,
        };
        Transaction {
            committer,
            reads: BTreeMap::new(),
            writes: BTreeMap::new(),
            inserts: BTreeMap::new(),
            durability,
            isolation: Isolation::ReadCommitted,
            ranges: Vec::new(),
            read_gsn: 0,
            isolation_after_read: false,
        }
    }

    /// How this transaction's reads are validated at commit: see
    /// [`Isolation`]. Set it before the first read.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// use dana::Isolation;
    /// let (a, b) = (db.create_tree("a").unwrap(), db.create_tree("b").unwrap());
    /// a.put(b"on-call", b"alice").unwrap();
    /// let mut tx = db.begin();
    /// tx.set_isolation(Isolation::Serializable);
    /// let who = tx.get(&a, b"on-call").unwrap().unwrap(); // validated at commit
    /// tx.put(&b, b"paged", &who).unwrap();
    /// a.put(b"on-call", b"bob").unwrap(); // another commit changes what it read
    /// assert!(matches!(db.commit(tx), Err(dana::Error::Conflict(_))));
    /// assert_eq!(b.get(b"paged").unwrap(), None); // nothing applied
    /// ```
    ///
    /// Set after a read, it changes nothing and the commit fails with
    /// [`crate::Error::InvalidArgument`] (the reads before were recorded
    /// for the other isolation; a debug build panicked, a release build
    /// validated them as they were recorded).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// tx.get(&t, b"k").unwrap();
    /// tx.set_isolation(dana::Isolation::Serializable);
    /// tx.put(&t, b"k", b"v").unwrap();
    /// assert!(matches!(db.commit(tx), Err(dana::Error::InvalidArgument(_))));
    /// assert_eq!(t.get(b"k").unwrap(), None);
    /// ```
    pub fn set_isolation(&mut self, isolation: Isolation) {
        if self.reads.is_empty() && self.ranges.is_empty() {
            self.isolation = isolation;
        } else if isolation != self.isolation {
            self.isolation_after_read = true;
        }
    }

    /// This transaction's isolation.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// assert_eq!(db.begin().isolation(), dana::Isolation::ReadCommitted);
    /// ```
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// This transaction's own writes to `tree` in the range, in the
    /// scan's order (None: a delete).
    fn own_writes_in(
        &self,
        root: u64,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        forward: bool,
    ) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let key = |b: Bound<&[u8]>| b.map(|k| (root, k.to_vec()));
        let lo = match key(lower) {
            Bound::Unbounded => Bound::Included((root, Vec::new())),
            b => b,
        };
        let hi = match key(upper) {
            Bound::Unbounded => match root.checked_add(1) {
                Some(next) => Bound::Excluded((next, Vec::new())),
                None => Bound::Unbounded,
            },
            b => b,
        };
        if !crate::validate::range_valid(&lo, &hi) {
            return Vec::new();
        }
        let mut own: Vec<_> = self
            .writes
            .range((lo, hi))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        if !forward {
            own.reverse();
        }
        own
    }

    /// Up to `limit` entries of `tree` in `[lower, upper]`, forward or
    /// backward, as this transaction sees them (its own writes merged in).
    /// For use inside a task. A serializable transaction's commit
    /// validates the range as far as the scan went (an entry added,
    /// changed or removed there by another commit meanwhile fails it with
    /// [`crate::Error::Conflict`]: no phantoms).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// use std::ops::Bound::{Included, Unbounded};
    /// let t = db.create_tree("t").unwrap();
    /// for k in [b"a", b"b", b"c"] {
    ///     t.put(k, b"1").unwrap();
    /// }
    /// let mut tx = db.begin();
    /// let t2 = t.clone();
    /// let last_two = db.block_on(async move {
    ///     tx.delete(&t2, b"c")?;
    ///     tx.put(&t2, b"bb", b"2")?;
    ///     tx.scan_async(&t2, Included(&b"a"[..]), Unbounded, false, 2).await
    /// }).unwrap().unwrap();
    /// assert_eq!(last_two, vec![(b"bb".to_vec(), b"2".to_vec()), (b"b".to_vec(), b"1".to_vec())]);
    /// ```
    pub async fn scan_async(
        &mut self,
        tree: &crate::Tree,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> Result<Entries> {
        let done = self
            .scan_start(tree, lower, upper, forward, limit)?
            .run()
            .await?;
        Ok(self.scanned(done))
    }

    /// [`Transaction::scan_async`] from any thread.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// use std::ops::Bound::{Excluded, Included};
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k1", b"x").unwrap();
    /// let mut tx = db.begin();
    /// tx.put(&t, b"k2", b"y").unwrap();
    /// let keys: Vec<_> = tx.scan(&t, Included(&b"k"[..]), Excluded(&b"l"[..]), true, 10).unwrap()
    ///     .into_iter().map(|(k, _)| k).collect();
    /// assert_eq!(keys, vec![b"k1".to_vec(), b"k2".to_vec()]);
    /// ```
    pub fn scan(
        &mut self,
        tree: &crate::Tree,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> Result<Entries> {
        let scan = self.scan_start(tree, lower, upper, forward, limit)?;
        let done = tree.block_on(scan.run())?;
        Ok(self.scanned(done))
    }

    /// A scan of `tree` with this transaction's writes in the range.
    fn scan_start(
        &self,
        tree: &crate::Tree,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> Result<Scan> {
        self.own(tree)?;
        let own = self.own_writes_in(tree.root(), lower, upper, forward);
        // Each own write hides or replaces at most one of the tree's
        // entries, and the merge pulls one entry ahead: the cursor is
        // read for at most this many.
        let wanted = limit.saturating_add(own.len()).saturating_add(1);
        let cursor = tree.cursor(lower, upper, forward)?.with_len_hint(wanted);
        Ok(Scan {
            cursor: if self.isolation == Isolation::Serializable {
                cursor.stamped()
            } else {
                cursor
            },
            tree: tree.root(),
            lower: lower.map(<[u8]>::to_vec),
            upper: upper.map(<[u8]>::to_vec),
            forward,
            own,
            limit,
        })
    }

    /// Records what a scan read; returns its entries.
    fn scanned(&mut self, done: Scanned) -> Entries {
        self.read_gsn = self.read_gsn.max(done.gsn);
        self.ranges.extend(done.read);
        done.entries
    }

    /// How this transaction's commit waits: [`Durability::Sync`] (the
    /// database's default) or [`Durability::Async`]; [`Durability::Off`]
    /// is taken as `Async` (a database with a log keeps logging). Without
    /// a log, commits are atomic in memory only, whatever is set here.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// tx.set_durability(dana::Durability::Async); // returns before the log is flushed
    /// tx.put(&t, b"k", b"v").unwrap();
    /// let lsn = db.commit_lsn(tx).unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec())); // visible at once
    /// db.checkpoint().unwrap();
    /// assert!(db.wal_stats().unwrap().durable >= lsn); // durable by now
    /// ```
    pub fn set_durability(&mut self, d: Durability) {
        // `Off` skipped every wait of an async commit, the one for the
        // other logs it depends on too (a review's finding).
        self.durability = match d {
            Durability::Off => Durability::Async,
            d => d,
        };
    }

    /// The value of `key` in `tree` as this transaction sees it (its own
    /// write, else the committed value; the latter is remembered and
    /// validated at commit if the transaction also writes the key). For
    /// use inside a task.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"a", b"1").unwrap();
    /// let mut tx = db.begin();
    /// let (a, b) = db.block_on(async move {
    ///     tx.put(&t, b"b", b"2")?;
    ///     Ok::<_, dana::Error>((tx.get_async(&t, b"a").await?, tx.get_async(&t, b"b").await?))
    /// }).unwrap().unwrap();
    /// assert_eq!((a, b), (Some(b"1".to_vec()), Some(b"2".to_vec())));
    /// ```
    pub async fn get_async(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.own(tree)?;
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let (v, gsn, stamp) = tree.get_stamped_async(key).await?;
        self.read_gsn = self.read_gsn.max(gsn);
        self.reads.entry(id).or_insert_with(|| (v.clone(), stamp));
        Ok(v)
    }

    /// [`Transaction::get_async`] from any thread.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"old").unwrap();
    /// let mut tx = db.begin();
    /// assert_eq!(tx.get(&t, b"k").unwrap(), Some(b"old".to_vec())); // committed value
    /// tx.put(&t, b"k", b"new").unwrap();
    /// assert_eq!(tx.get(&t, b"k").unwrap(), Some(b"new".to_vec())); // its own write
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"old".to_vec())); // others see the old one
    /// ```
    pub fn get(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.own(tree)?;
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let (v, gsn, stamp) = tree.get_stamped(key)?;
        self.read_gsn = self.read_gsn.max(gsn);
        self.reads.entry(id).or_insert_with(|| (v.clone(), stamp));
        Ok(v)
    }

    /// True if this transaction was begun on the database of `committer`.
    pub(crate) fn belongs_to(&self, committer: &Arc<Committer>) -> bool {
        Arc::ptr_eq(&self.committer, committer)
    }

    /// Fails unless `tree` belongs to this transaction's database: a tree
    /// is named by its root page id, which another database may use for
    /// another tree (the first version wrote such a put into whatever tree
    /// of this database had that root).
    fn own(&self, tree: &crate::Tree) -> Result<()> {
        if Arc::ptr_eq(&self.committer, tree.committer()) {
            return Ok(());
        }
        Err(crate::Error::InvalidArgument(format!(
            "tree {:?} belongs to another database than this transaction",
            tree.name()
        )))
    }

    fn check(&self, tree: &crate::Tree, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        // After `close`, `Closed` at once, as every handle answers (it was
        // buffered, and refused only at the commit; a docs review).
        self.committer.live(false)?;
        self.own(tree)?;
        tree.unlogged_btree().check_sizes(key, None)?;
        match value {
            Some(v) if v.len() > tree.max_value_len() => Err(crate::Error::ValueTooLarge {
                len: v.len(),
                max: tree.max_value_len(),
            }),
            _ => Ok(()),
        }
    }

    /// Sets `key` to `value` in `tree` at commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// tx.put(&t, b"k", b"v").unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), None); // private until commit
    /// db.commit(tx).unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub fn put(&mut self, tree: &crate::Tree, key: &[u8], value: &[u8]) -> Result<()> {
        self.check(tree, key, Some(value))?;
        self.writes
            .insert((tree.root(), key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    /// Inserts `key` at commit; the commit fails with
    /// [`crate::Error::KeyExists`] if the key exists then.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"v").unwrap();
    /// let mut tx = db.begin();
    /// tx.insert(&t, b"k", b"w").unwrap(); // checked at commit, not here
    /// tx.put(&t, b"other", b"x").unwrap();
    /// assert!(matches!(db.commit(tx), Err(dana::Error::KeyExists)));
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// assert_eq!(t.get(b"other").unwrap(), None); // nothing applied
    /// ```
    ///
    /// The transaction's own writes count, as its reads see them: an
    /// insert of a key it wrote fails at once with
    /// [`crate::Error::KeyExists`], and one of a key it deleted replaces
    /// the delete (the key is absent in its view; the first version
    /// checked the tree, where the deleted key still was, so replacing a
    /// row by a delete and an insert could never commit).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"row", b"old").unwrap();
    /// let mut tx = db.begin();
    /// tx.delete(&t, b"row").unwrap();
    /// tx.insert(&t, b"row", b"new").unwrap();
    /// tx.put(&t, b"mine", b"x").unwrap();
    /// assert!(matches!(tx.insert(&t, b"mine", b"y"), Err(dana::Error::KeyExists)));
    /// db.commit(tx).unwrap();
    /// assert_eq!(t.get(b"row").unwrap(), Some(b"new".to_vec()));
    /// ```
    pub fn insert(&mut self, tree: &crate::Tree, key: &[u8], value: &[u8]) -> Result<()> {
        let id = (tree.root(), key.to_vec());
        match self.writes.get(&id) {
            Some(Some(_)) => return Err(crate::Error::KeyExists),
            // Deleted by this transaction: absent in its view, whatever
            // the tree holds (an insert before that delete keeps its
            // check of the tree).
            Some(None) => return self.put(tree, key, value),
            None => {}
        }
        self.put(tree, key, value)?;
        self.inserts.insert(id, ());
        Ok(())
    }

    /// Removes `key` from `tree` at commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"v").unwrap();
    /// let mut tx = db.begin();
    /// tx.delete(&t, b"k").unwrap();
    /// assert_eq!(tx.get(&t, b"k").unwrap(), None);
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec())); // until commit
    /// db.commit(tx).unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), None);
    /// ```
    pub fn delete(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<()> {
        self.check(tree, key, None)?;
        // An insert's check of the tree stays: the key had to be absent
        // there for the insert to be right (dropping it turned a failed
        // insert into a delete of another commit's key).
        self.writes.insert((tree.root(), key.to_vec()), None);
        Ok(())
    }

    /// Number of buffered writes.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// tx.put(&t, b"a", b"1").unwrap();
    /// tx.put(&t, b"a", b"2").unwrap(); // same key: one write
    /// tx.delete(&t, b"b").unwrap();
    /// assert_eq!(tx.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// True if the transaction writes nothing.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// assert!(tx.is_empty());
    /// tx.get(&t, b"k").unwrap(); // reads are not writes
    /// assert!(tx.is_empty());
    /// tx.put(&t, b"k", b"v").unwrap();
    /// assert!(!tx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Commits inside a task: all writes or none. Fails with
    /// [`crate::Error::Conflict`] if a key it read and wrote changed meanwhile
    /// (nothing applied; run the transaction again).
    ///
    /// Do not drop the future before it completes (a `select` or a
    /// timeout around it): dropped after its record was logged and before
    /// it was applied, it stops the database ([`crate::Error::Poisoned`]
    /// for every later write, and for every read if it had several writes,
    /// `Db::close` too) until a reopen, which applies the commit whole. The
    /// same holds for every `*_async` write of [`crate::Tree`].
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let mut tx = db.begin();
    /// let t2 = t.clone();
    /// db.block_on(async move {
    ///     tx.put(&t2, b"k", b"v")?;
    ///     tx.commit_async().await
    /// }).unwrap().unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub async fn commit_async(self) -> Result<()> {
        self.commit_lsn_async().await.map(|_| ())
    }

    /// [`Transaction::commit_async`], returning the sequence number (GSN)
    /// just after its commit record (0 without a log, or for a transaction
    /// that writes nothing). The commit is durable once the durable GSN
    /// of every log ([`crate::Db::wal_stats`]) reaches it (or, sooner,
    /// once its own worker's log's does: a `Sync` commit returns then).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// let (mut tx, empty) = (db.begin(), db.begin());
    /// let (lsn, none) = db.block_on(async move {
    ///     tx.put(&t, b"k", b"v")?;
    ///     Ok::<_, dana::Error>((tx.commit_lsn_async().await?, empty.commit_lsn_async().await?))
    /// }).unwrap().unwrap();
    /// assert!(lsn > 0);
    /// assert_eq!(none, 0); // it wrote nothing
    /// db.checkpoint().unwrap(); // every log durable past it
    /// assert!(db.wal_stats().unwrap().durable >= lsn);
    /// ```
    pub async fn commit_lsn_async(self) -> Result<u64> {
        if self.isolation_after_read {
            return Err(crate::Error::InvalidArgument(
                "Transaction::set_isolation after a read: set it before the first read".into(),
            ));
        }
        let serializable = self.isolation == Isolation::Serializable;
        let mut checks = Vec::new();
        if !serializable {
            for (id, (v, _)) in &self.reads {
                if self.writes.contains_key(id) {
                    checks.push((id.0, id.1.clone(), Expect::Value(v.clone())));
                }
            }
            // Keys written that a scan read, present or absent, must still
            // be as every scan that read them saw them (the first version
            // validated only keys read with `get`: a read-modify-write
            // over a scan lost updates; the next one only the last scan's
            // view: a write computed from an earlier scan lost the update
            // made between the two, a review's finding). Scans that saw
            // the key differ can never both hold: the commit conflicts.
            for id in self.writes.keys() {
                let mut seen_before: Vec<Option<&[u8]>> = Vec::new();
                for r in self.ranges.iter().filter(|r| {
                    r.tree == id.0
                        && std::ops::RangeBounds::contains(
                            &(
                                r.lower.as_ref().map(Vec::as_slice),
                                r.upper.as_ref().map(Vec::as_slice),
                            ),
                            &id.1.as_slice(),
                        )
                }) {
                    let seen = r
                        .seen
                        .binary_search_by(|(k, _)| k.as_slice().cmp(&id.1))
                        .ok()
                        .map(|i| r.seen[i].1.as_slice());
                    if !seen_before.contains(&seen) {
                        seen_before.push(seen);
                        checks.push((id.0, id.1.clone(), Expect::Value(seen.map(<[u8]>::to_vec))));
                    }
                }
            }
        }
        // Every insert checks that its key is absent, read before or not:
        // a read that saw the key present validates that it still is, and
        // the insert must then fail (the first version skipped the check
        // for a key read, and such an insert overwrote the value).
        for id in self.inserts.keys() {
            checks.push((id.0, id.1.clone(), Expect::Absent));
        }
        let read_set = serializable.then(|| ReadSet {
            points: self
                .reads
                .into_iter()
                .map(|((tree, key), (seen, stamp))| PointRead {
                    tree,
                    key,
                    seen,
                    stamp,
                })
                .collect(),
            ranges: self.ranges,
        });
        let writes = self
            .writes
            .into_iter()
            .map(|((tree, key), value)| Write::new(tree, key, value))
            .collect();
        self.committer
            .commit_at(
                writes,
                checks,
                self.durability,
                self.read_gsn,
                read_set.as_ref(),
            )
            .await
            .map(|(_, lsn)| lsn)
    }
}

/// A scan inside a transaction, ready to run on a worker.
struct Scan {
    cursor: Cursor,
    tree: u64,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    forward: bool,
    /// The transaction's writes in the range, in the scan's order.
    own: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    limit: usize,
}

/// What a scan returned and read.
struct Scanned {
    entries: Entries,
    /// The most GSN of the leaves read.
    gsn: u64,
    /// The range as far as the scan got, with the tree's entries there
    /// (None: a scan of no entries, `limit` 0).
    read: Option<RangeRead>,
}

impl Scan {
    /// Pulls entries from the cursor and merges the transaction's own
    /// writes until `limit` entries. The range read ends at the last
    /// entry pulled, or is the scan's whole range if the cursor ended.
    async fn run(mut self) -> Result<Scanned> {
        let mut entries = Vec::new();
        let mut seen: Entries = Vec::new();
        if self.limit == 0 {
            return Ok(Scanned {
                entries,
                gsn: 0,
                read: None,
            });
        }
        let forward = self.forward;
        let mut own = std::mem::take(&mut self.own).into_iter().peekable();
        let mut next = self.pull(&mut seen).await?;
        let mut ended = next.is_none();
        while entries.len() < self.limit {
            let take_own = match (&next, own.peek()) {
                (None, None) => break,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some((tk, _)), Some((ok, _))) => {
                    if forward {
                        ok <= tk
                    } else {
                        ok >= tk
                    }
                }
            };
            let emitted = if take_own {
                let (k, v) = own.next().expect("peeked");
                let shadows = next.as_ref().is_some_and(|(tk, _)| *tk == k);
                if shadows {
                    next = None;
                }
                v.map(|v| (k, v))
            } else {
                next.take()
            };
            if next.is_none() && !ended {
                next = self.pull(&mut seen).await?;
                ended = next.is_none();
            }
            entries.extend(emitted);
        }
        // What the tree held, kept at both levels: serializable validates
        // the range, read committed the keys it writes within it.
        let read = Some({
            // The range the result depends on: as far as the cursor went.
            let (mut lo, mut hi) = (self.lower, self.upper);
            if let (false, Some((k, _))) = (ended, seen.last()) {
                match forward {
                    true => hi = Bound::Included(k.clone()),
                    false => lo = Bound::Included(k.clone()),
                }
            }
            if !forward {
                seen.reverse();
            }
            RangeRead {
                tree: self.tree,
                lower: lo,
                upper: hi,
                seen,
                leaves: self.cursor.leaf_stamps().map(<[_]>::to_vec),
            }
        });
        Ok(Scanned {
            entries,
            gsn: self.cursor.max_gsn(),
            read,
        })
    }

    /// The cursor's next entry, also kept in `seen`.
    async fn pull(&mut self, seen: &mut Entries) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let next = self.cursor.next().await?;
        seen.extend(next.clone());
        Ok(next)
    }
}
