//! The small transactional key-value interface the TPC-C transactions are
//! written against, and dana's implementation of it.
//!
//! Owns: [`KvTx`] (reads, buffered writes, range scans that see the
//! transaction's own writes, commit) and [`DanaTx`]. A peer engine joins
//! the benchmark by implementing the same trait. Never: hides a conflict
//! as another error, or another error as a conflict (the runner retries
//! exactly the conflicts).

use std::ops::Bound;
use std::sync::Arc;

use dana::{Db, Durability, Error, Isolation, Transaction, Tree};

use super::schema::Table;

/// Why a transaction did not commit.
#[derive(Debug)]
pub enum TxError {
    /// A conflict with a concurrent transaction: run it again.
    Conflict,
    /// Anything else: the run fails.
    Failed(String),
}

impl From<Error> for TxError {
    fn from(e: Error) -> TxError {
        match e {
            Error::Conflict(_) => TxError::Conflict,
            e => TxError::Failed(e.to_string()),
        }
    }
}

impl From<crate::CliError> for TxError {
    fn from(e: crate::CliError) -> TxError {
        TxError::Failed(e.0)
    }
}

pub type TxResult<T> = Result<T, TxError>;

/// One transaction of an engine.
#[allow(async_fn_in_trait)]
pub trait KvTx {
    /// The value of `key`, as this transaction sees it.
    async fn get(&mut self, t: Table, key: &[u8]) -> TxResult<Option<Vec<u8>>>;
    /// Sets `key` at commit.
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> TxResult<()>;
    /// Removes `key` at commit.
    fn delete(&mut self, t: Table, key: &[u8]) -> TxResult<()>;
    /// Up to `limit` entries with keys in `[lo, hi]` (each bound
    /// inclusive, exclusive or open), forward or backward, as this
    /// transaction sees them.
    async fn scan(
        &mut self,
        t: Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> TxResult<Vec<(Vec<u8>, Vec<u8>)>>;
    /// [`KvTx::scan`] of the keys that start with `prefix`.
    async fn scan_prefix(
        &mut self,
        t: Table,
        prefix: &[u8],
        forward: bool,
        limit: usize,
    ) -> TxResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let (lo, hi) = dana::iter::prefix_bounds(prefix);
        self.scan(
            t,
            lo.as_ref().map(Vec::as_slice),
            hi.as_ref().map(Vec::as_slice),
            forward,
            limit,
        )
        .await
    }
    /// Commits: all the writes or none.
    async fn commit(self) -> TxResult<()>;
}

/// The trees of the TPC-C database in dana, by [`Table::index`].
pub struct DanaTables {
    pub db: Db,
    trees: Vec<Tree>,
}

impl DanaTables {
    /// Opens (creating if needed) the eleven trees.
    pub fn open(db: &Db) -> crate::CliResult<Arc<DanaTables>> {
        let trees = Table::ALL
            .iter()
            .map(|t| db.tree_or_create(t.name()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(DanaTables {
            db: db.clone(),
            trees,
        }))
    }

    /// The tree of table `t`.
    pub fn tree(&self, t: Table) -> &Tree {
        &self.trees[t.index()]
    }

    /// A transaction at `isolation`, committing with `durability`.
    pub fn begin(self: &Arc<Self>, isolation: Isolation, durability: Durability) -> DanaTx {
        let mut tx = self.db.begin();
        tx.set_isolation(isolation);
        if durability != Durability::Off {
            tx.set_durability(durability);
        }
        DanaTx {
            tx,
            tables: self.clone(),
        }
    }
}

/// A dana transaction over the TPC-C trees.
pub struct DanaTx {
    tx: Transaction,
    tables: Arc<DanaTables>,
}

impl KvTx for DanaTx {
    async fn get(&mut self, t: Table, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        Ok(self.tx.get_async(self.tables.tree(t), key).await?)
    }

    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> TxResult<()> {
        Ok(self.tx.put(self.tables.tree(t), key, value)?)
    }

    fn delete(&mut self, t: Table, key: &[u8]) -> TxResult<()> {
        Ok(self.tx.delete(self.tables.tree(t), key)?)
    }

    async fn scan(
        &mut self,
        t: Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> TxResult<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .tx
            .scan_async(self.tables.tree(t), lo, hi, forward, limit)
            .await?)
    }

    async fn commit(self) -> TxResult<()> {
        Ok(self.tx.commit_async().await?)
    }
}
