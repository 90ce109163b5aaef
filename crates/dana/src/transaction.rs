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
        }
    }

    /// How this transaction's commit waits: [`Durability::Sync`] (the
    /// database's default) or [`Durability::Async`]. Without a log
    /// (`Off`), commits are atomic in memory only.
    pub fn set_durability(&mut self, d: Durability) {
        self.durability = d;
    }

    /// The value of `key` in `tree` as this transaction sees it (its own
    /// write, else the committed value; the latter is remembered and
    /// validated at commit if the transaction also writes the key). For
    /// use inside a task.
    pub async fn get_async(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let v = tree.get_async(key).await?;
        self.reads.entry(id).or_insert_with(|| v.clone());
        Ok(v)
    }

    /// [`Transaction::get_async`] from any thread.
    pub fn get(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let id = (tree.root(), key.to_vec());
        if let Some(v) = self.writes.get(&id) {
            return Ok(v.clone());
        }
        let v = tree.get(key)?;
        self.reads.entry(id).or_insert_with(|| v.clone());
        Ok(v)
    }

    fn check(tree: &crate::Tree, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        tree.unlogged_btree().check_sizes(key, value)
    }

    /// Sets `key` to `value` in `tree` at commit.
    pub fn put(&mut self, tree: &crate::Tree, key: &[u8], value: &[u8]) -> Result<()> {
        Self::check(tree, key, Some(value))?;
        self.writes
            .insert((tree.root(), key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    /// Inserts `key` at commit; the commit fails with
    /// [`crate::Error::KeyExists`] if the key exists then.
    pub fn insert(&mut self, tree: &crate::Tree, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(tree, key, value)?;
        self.inserts.insert((tree.root(), key.to_vec()), ());
        Ok(())
    }

    /// Removes `key` from `tree` at commit.
    pub fn delete(&mut self, tree: &crate::Tree, key: &[u8]) -> Result<()> {
        Self::check(tree, key, None)?;
        self.writes.insert((tree.root(), key.to_vec()), None);
        self.inserts.remove(&(tree.root(), key.to_vec()));
        Ok(())
    }

    /// Number of buffered writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// True if the transaction writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Commits inside a task: all writes or none. Fails with
    /// [`crate::Error::Conflict`] if a key it read and wrote changed meanwhile
    /// (nothing applied; run the transaction again).
    pub async fn commit_async(self) -> Result<()> {
        self.commit_lsn_async().await.map(|_| ())
    }

    /// [`Transaction::commit_async`], returning the LSN just after its
    /// commit record (0 without a log, or for a transaction that writes
    /// nothing). With [`Durability::Async`] the commit is durable once the
    /// log's durable LSN ([`crate::Db::wal_stats`]) reaches it.
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
            .map(|((tree, key), value)| Write { tree, key, value })
            .collect();
        self.committer
            .commit_at(writes, checks, self.durability)
            .await
            .map(|(_, lsn)| lsn)
    }
}
