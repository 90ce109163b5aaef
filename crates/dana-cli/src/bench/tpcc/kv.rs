//! The small transactional key-value interface the TPC-C transactions are
//! written against, and dana's implementation of it.
//!
//! Owns: [`KvTx`] (reads, buffered writes, range scans that see the
//! transaction's own writes, commit) and [`DanaTx`]. A peer engine joins
//! the benchmark by implementing the same trait. Never: hides a conflict
//! as another error, or another error as a conflict (the runner retries
//! exactly the conflicts).

use std::future::Future;
use std::ops::Bound;
use std::sync::Arc;

use dana::{Db, Durability, Error, Isolation, Transaction, Tree};

use super::schema::Table;
use crate::peers::txn::{PeerTx, PeerTxError, TxPeer};
use crate::CliResult;

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

/// One transaction of an engine. Its futures are `Send`, so generic code
/// can run them as dana tasks.
pub trait KvTx: Send {
    /// The value of `key`, as this transaction sees it.
    fn get(
        &mut self,
        t: Table,
        key: &[u8],
    ) -> impl Future<Output = TxResult<Option<Vec<u8>>>> + Send;
    /// [`KvTx::get`] of a key the transaction will write: an engine with
    /// locks may lock it now (RocksDB's `GetForUpdate`).
    fn get_for_update(
        &mut self,
        t: Table,
        key: &[u8],
    ) -> impl Future<Output = TxResult<Option<Vec<u8>>>> + Send {
        self.get(t, key)
    }
    /// Sets `key` at commit.
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> TxResult<()>;
    /// Removes `key` at commit.
    fn delete(&mut self, t: Table, key: &[u8]) -> TxResult<()>;
    /// Up to `limit` entries with keys in `[lo, hi]` (each bound
    /// inclusive, exclusive or open), forward or backward, as this
    /// transaction sees them.
    fn scan(
        &mut self,
        t: Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> impl Future<Output = TxResult<Entries>> + Send;
    /// [`KvTx::scan`] of the keys that start with `prefix`.
    fn scan_prefix(
        &mut self,
        t: Table,
        prefix: &[u8],
        forward: bool,
        limit: usize,
    ) -> impl Future<Output = TxResult<Entries>> + Send {
        let (lo, hi) = dana::iter::prefix_bounds(prefix);
        async move {
            self.scan(
                t,
                lo.as_ref().map(Vec::as_slice),
                hi.as_ref().map(Vec::as_slice),
                forward,
                limit,
            )
            .await
        }
    }
    /// Commits: all the writes or none.
    fn commit(self) -> impl Future<Output = TxResult<()>> + Send;
}

pub use crate::peers::txn::Entries;

/// What [`Engine::each`] calls with each key and value.
pub type EntryFn<'a> = dyn FnMut(&[u8], &[u8]) -> CliResult<()> + 'a;

/// An engine the TPC-C benchmark runs: it begins transactions, runs the
/// benchmark's tasks (dana: as tasks on its workers; a peer: one OS
/// thread per task) and reads whole tables for the consistency check.
pub trait Engine: Send + Sync + 'static {
    type Tx: KvTx + 'static;
    /// The isolation a transaction begun at `isolation` really runs at,
    /// for the report.
    fn isolation_label(&self, isolation: Isolation) -> String;
    /// A transaction at `isolation` (or the engine's nearest level),
    /// committing with `durability`; `read_only` if it will not write
    /// (a hint: LMDB runs those beside its one writer).
    fn begin(
        self: &Arc<Self>,
        isolation: Isolation,
        durability: Durability,
        read_only: bool,
    ) -> TxResult<Self::Tx>;
    /// Runs `task` (number `n`) to its end, concurrently with the caller.
    fn spawn(
        self: &Arc<Self>,
        n: usize,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> CliResult<()>;
    /// Waits a moment after the `attempt`th conflict of one input,
    /// before the retry.
    fn after_conflict(&self, attempt: u32) -> impl Future<Output = ()> + Send;
    /// Calls `f` with every entry of table `t`, in key order, on a
    /// quiescent database.
    fn each(&self, t: Table, f: &mut EntryFn<'_>) -> CliResult<()>;
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
}

impl Engine for DanaTables {
    type Tx = DanaTx;

    fn isolation_label(&self, isolation: Isolation) -> String {
        isolation.to_string()
    }

    /// dana ignores the hint: its readers and writers run alike.
    fn begin(
        self: &Arc<Self>,
        isolation: Isolation,
        durability: Durability,
        _read_only: bool,
    ) -> TxResult<DanaTx> {
        let mut tx = self.db.begin();
        tx.set_isolation(isolation);
        if durability != Durability::Off {
            tx.set_durability(durability);
        }
        Ok(DanaTx {
            tx,
            tables: self.clone(),
        })
    }

    fn spawn(
        self: &Arc<Self>,
        n: usize,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> CliResult<()> {
        let workers = self.db.runtime().workers();
        Ok(self.db.spawn_on(n % workers, task)?)
    }

    /// dana lets the worker's other tasks run, once.
    fn after_conflict(&self, _attempt: u32) -> impl Future<Output = ()> + Send {
        dana::sched::yield_now()
    }

    fn each(&self, t: Table, f: &mut EntryFn<'_>) -> CliResult<()> {
        for e in self.tree(t).iter() {
            let (k, v) = e?;
            f(&k, &v)?;
        }
        Ok(())
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
    ) -> TxResult<Entries> {
        Ok(self
            .tx
            .scan_async(self.tables.tree(t), lo, hi, forward, limit)
            .await?)
    }

    async fn commit(self) -> TxResult<()> {
        Ok(self.tx.commit_async().await?)
    }
}

impl From<PeerTxError> for TxError {
    fn from(e: PeerTxError) -> TxError {
        match e {
            PeerTxError::Conflict(_) => TxError::Conflict,
            PeerTxError::Failed(e) => TxError::Failed(e.0),
        }
    }
}

/// A peer engine's TPC-C database: one key space, each key prefixed by
/// its table's number (so each table is a contiguous key range).
pub struct PeerTables {
    pub peer: Arc<dyn TxPeer>,
}

/// The peer key of `key` in table `t`.
fn peer_key(t: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(t.index() as u8);
    k.extend_from_slice(key);
    k
}

/// A bound on table `t`'s keys as a bound on the peer key space: an
/// open bound becomes the table's own end.
fn peer_bound(t: Table, b: Bound<&[u8]>, low: bool) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(k) => Bound::Included(peer_key(t, k)),
        Bound::Excluded(k) => Bound::Excluded(peer_key(t, k)),
        Bound::Unbounded if low => Bound::Included(vec![t.index() as u8]),
        Bound::Unbounded => Bound::Excluded(vec![t.index() as u8 + 1]),
    }
}

/// Drives a future that never waits (a peer's calls block the thread)
/// to its end on this thread.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

impl Engine for PeerTables {
    type Tx = PeerKvTx;

    fn isolation_label(&self, _isolation: Isolation) -> String {
        self.peer.isolation().to_string()
    }

    fn begin(
        self: &Arc<Self>,
        _isolation: Isolation,
        durability: Durability,
        read_only: bool,
    ) -> TxResult<PeerKvTx> {
        let sync = durability == Durability::Sync;
        Ok(PeerKvTx {
            tx: self.peer.clone().begin(sync, read_only)?,
        })
    }

    fn spawn(
        self: &Arc<Self>,
        n: usize,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> CliResult<()> {
        std::thread::Builder::new()
            .name(format!("{}-{n}", self.peer.name()))
            .spawn(move || block_on(task))
            .map(|_| ())
            .map_err(|e| crate::CliError(format!("starting client thread {n}: {e}")))
    }

    /// A peer's client thread backs off exponentially, from 20 µs to
    /// about 5 ms: retrying a hot row at once only conflicts again (the
    /// way an application retries a MongoDB or MyRocks write conflict).
    fn after_conflict(&self, attempt: u32) -> impl Future<Output = ()> + Send {
        std::thread::sleep(std::time::Duration::from_micros(20 << attempt.min(8)));
        std::future::ready(())
    }

    fn each(&self, t: Table, f: &mut EntryFn<'_>) -> CliResult<()> {
        const CHUNK: usize = 4096;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut tx = self.peer.clone().begin(false, true).map_err(peer_failed)?;
            let lo = match after.take() {
                Some(k) => Bound::Excluded(k),
                None => peer_bound(t, Bound::Unbounded, true),
            };
            let hi = peer_bound(t, Bound::Unbounded, false);
            let chunk = tx
                .scan(bound_ref(&lo), bound_ref(&hi), true, CHUNK)
                .map_err(peer_failed)?;
            for (k, v) in &chunk {
                f(&k[1..], v)?;
            }
            if chunk.len() < CHUNK {
                return Ok(());
            }
            after = chunk.last().map(|(k, _)| k.clone());
        }
    }
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(Vec::as_slice)
}

fn peer_failed(e: PeerTxError) -> crate::CliError {
    match e {
        PeerTxError::Conflict(m) => {
            crate::CliError(format!("a conflict while reading a quiescent table: {m}"))
        }
        PeerTxError::Failed(e) => e,
    }
}

/// A peer transaction over the TPC-C tables.
pub struct PeerKvTx {
    tx: Box<dyn PeerTx>,
}

impl KvTx for PeerKvTx {
    async fn get(&mut self, t: Table, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        Ok(self.tx.get(&peer_key(t, key), false)?)
    }

    async fn get_for_update(&mut self, t: Table, key: &[u8]) -> TxResult<Option<Vec<u8>>> {
        Ok(self.tx.get(&peer_key(t, key), true)?)
    }

    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> TxResult<()> {
        Ok(self.tx.put(&peer_key(t, key), value)?)
    }

    fn delete(&mut self, t: Table, key: &[u8]) -> TxResult<()> {
        Ok(self.tx.delete(&peer_key(t, key))?)
    }

    async fn scan(
        &mut self,
        t: Table,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> TxResult<Entries> {
        let (lo, hi) = (peer_bound(t, lo, true), peer_bound(t, hi, false));
        let mut found = self
            .tx
            .scan(bound_ref(&lo), bound_ref(&hi), forward, limit)?;
        for (k, _) in &mut found {
            k.remove(0);
        }
        Ok(found)
    }

    async fn commit(self) -> TxResult<()> {
        Ok(self.tx.commit()?)
    }
}
