//! The public transaction: reads and buffered writes over one or more
//! trees, committed atomically through [`crate::txn`]'s protocol.
//!
//! Owns: the read set, the write set and the inserts a transaction
//! checks at commit. Never: touches a page (it reads through the public
//! [`crate::Tree`] and commits through the committer).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::txn::{Committer, Expect};
use crate::wal::record::Write;
use crate::wal::Durability;
use crate::Result;

/// A transaction: reads see committed data and this transaction's own
/// writes; writes stay private until [`crate::Db::commit`].
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
///     tx.put(&a, b"alice", &(n - 30).to_le_bytes())?;
///     tx.put(&b, b"bob", &30u64.to_le_bytes())?;
///     Ok(())
/// }).unwrap();
/// assert_eq!(b.get(b"bob").unwrap(), Some(30u64.to_le_bytes().to_vec()));
/// ```
pub struct Transaction {
    committer: Arc<Committer>,
    reads: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    writes: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    inserts: BTreeMap<(u64, Vec<u8>), ()>,
    durability: Durability,
    /// The most GSN of a leaf this transaction read: its commit depends
    /// on every log up to there (it may have read another worker's write
    /// that its log has not made durable yet).
    read_gsn: u64,
}

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
            read_gsn: 0,
        }
    }

    /// How this transaction's commit waits: [`Durability::Sync`] (the
    /// database's default) or [`Durability::Async`]. Without a log
    /// (`Off`), commits are atomic in memory only.
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
        self.durability = d;
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
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let (v, gsn) = tree.get_versioned_async(key).await?;
        self.read_gsn = self.read_gsn.max(gsn);
        self.reads.entry(id).or_insert_with(|| v.clone());
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
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let (v, gsn) = tree.get_versioned(key)?;
        self.read_gsn = self.read_gsn.max(gsn);
        self.reads.entry(id).or_insert_with(|| v.clone());
        Ok(v)
    }

    fn check(tree: &crate::Tree, key: &[u8], value: Option<&[u8]>) -> Result<()> {
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
        Self::check(tree, key, Some(value))?;
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
    pub fn insert(&mut self, tree: &crate::Tree, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(tree, key, value)?;
        self.inserts.insert((tree.root(), key.to_vec()), ());
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
        Self::check(tree, key, None)?;
        self.writes.insert((tree.root(), key.to_vec()), None);
        self.inserts.remove(&(tree.root(), key.to_vec()));
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
        let mut checks = Vec::new();
        for (id, v) in &self.reads {
            if self.writes.contains_key(id) {
                checks.push((id.0, id.1.clone(), Expect::Value(v.clone())));
            }
        }
        for id in self.inserts.keys() {
            if !self.reads.contains_key(id) {
                checks.push((id.0, id.1.clone(), Expect::Absent));
            }
        }
        let writes = self
            .writes
            .into_iter()
            .map(|((tree, key), value)| Write::new(tree, key, value))
            .collect();
        self.committer
            .commit_at(writes, checks, self.durability, self.read_gsn)
            .await
            .map(|(_, lsn)| lsn)
    }
}
