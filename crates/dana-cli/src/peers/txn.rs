//! Transactional peer engines for `dana bench tpcc`: one small interface,
//! [`TxPeer`] and [`PeerTx`], that RocksDB's `TransactionDB`,
//! WiredTiger's snapshot transactions and LMDB's serial writers
//! implement, so the TPC-C transactions written for dana run unchanged on
//! them.
//!
//! Owns: the interface, the registry ([`open_tx`]) and the conformance
//! test every transactional engine passes. Never: turns a conflict into
//! another error or another error into a conflict (the benchmark retries
//! exactly the conflicts), or lets a transaction that was not committed
//! leave a write behind (dropping a [`PeerTx`] rolls it back).
//!
//! # Fairness rules (beyond the parent module's)
//!
//! - Memory budget = [`PeerConfig::cache_bytes`], dana's buffer pool:
//!   RocksDB's block cache plus its memtables, WiredTiger's cache (which
//!   holds dirty pages too).
//! - Durability: a commit asked to be durable returns after the engine's
//!   log is synced to the device (RocksDB `WriteOptions::sync`, WiredTiger
//!   `commit_transaction("sync=on")` with its log enabled); both engines
//!   group concurrent commits into one sync.
//! - Isolation: snapshot isolation with first-writer-wins conflicts on
//!   RocksDB and WiredTiger (TPC-C is serializable under snapshot
//!   isolation: Fekete et al., TODS 2005). RocksDB also locks a row read
//!   for update, as MyRocks does for `SELECT ... FOR UPDATE`. LMDB runs
//!   one writer at a time (serializable); its read-only transactions read
//!   a snapshot beside the writer.
//! - LMDB has no direct I/O and no cache budget (the OS page cache serves
//!   it): the report flags it ([`TxPeer::caveat`]).
//! - Client threads: one OS thread per client, each running one
//!   transaction at a time.

use std::ops::Bound;
use std::sync::Arc;

use super::PeerConfig;
use crate::{CliError, CliResult};

/// Why a peer operation failed.
#[derive(Debug)]
// Without an engine feature nothing constructs a conflict.
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "wiredtiger", feature = "lmdb")),
    allow(dead_code)
)]
pub enum PeerTxError {
    /// A conflict with a concurrent transaction (a write-write conflict, a
    /// lock timeout, a deadlock): roll back and run it again.
    Conflict(String),
    /// Anything else.
    Failed(CliError),
}

impl From<CliError> for PeerTxError {
    fn from(e: CliError) -> Self {
        PeerTxError::Failed(e)
    }
}

pub type PeerTxResult<T> = Result<T, PeerTxError>;

/// Key-value pairs a scan returned, in scan order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A transactional engine.
pub trait TxPeer: Send + Sync {
    fn name(&self) -> &'static str;
    /// The isolation level its transactions run at, for the report.
    fn isolation(&self) -> &'static str;
    /// How it is configured, for the report.
    fn config(&self) -> String;
    /// Why its figures are not comparable with the others', if they are
    /// not (LMDB: the OS page cache serves it).
    fn caveat(&self) -> Option<String> {
        None
    }
    /// Starts a transaction; its commit syncs the log if `sync`. A
    /// `read_only` one never writes (LMDB runs it beside the writer; the
    /// others ignore the hint). The transaction keeps the engine alive.
    fn begin(self: Arc<Self>, sync: bool, read_only: bool) -> PeerTxResult<Box<dyn PeerTx>>;
    /// Makes everything committed so far durable and settles the engine,
    /// after the load and before each measured run (RocksDB: flush the
    /// memtables and wait for pending compactions; WiredTiger: a
    /// checkpoint; LMDB: a forced sync).
    fn settle(&self) -> CliResult<()>;
}

/// One transaction, used by one thread at a time. Dropping it without
/// [`PeerTx::commit`] rolls it back.
pub trait PeerTx: Send {
    /// The value of `key` as this transaction sees it; `for_update` says
    /// the transaction will write the key (RocksDB locks it now).
    fn get(&mut self, key: &[u8], for_update: bool) -> PeerTxResult<Option<Vec<u8>>>;
    fn put(&mut self, key: &[u8], value: &[u8]) -> PeerTxResult<()>;
    fn delete(&mut self, key: &[u8]) -> PeerTxResult<()>;
    /// Up to `limit` entries with keys within the bounds, ascending if
    /// `forward`, else descending, as this transaction sees them (its own
    /// writes included).
    fn scan(
        &mut self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> PeerTxResult<Entries>;
    fn commit(self: Box<Self>) -> PeerTxResult<()>;
}

/// True if `key` is at or above `lo`.
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "wiredtiger", feature = "lmdb")),
    allow(dead_code)
)]
pub fn above(key: &[u8], lo: Bound<&[u8]>) -> bool {
    match lo {
        Bound::Included(b) => key >= b,
        Bound::Excluded(b) => key > b,
        Bound::Unbounded => true,
    }
}

/// True if `key` is at or below `hi`.
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "wiredtiger", feature = "lmdb")),
    allow(dead_code)
)]
pub fn below(key: &[u8], hi: Bound<&[u8]>) -> bool {
    match hi {
        Bound::Included(b) => key <= b,
        Bound::Excluded(b) => key < b,
        Bound::Unbounded => true,
    }
}

/// What a scan does with a key its cursor reached.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "wiredtiger", feature = "lmdb")),
    allow(dead_code)
)]
pub enum ScanStep {
    /// Short of the near bound (only the excluded bound itself, where the
    /// cursor started): skip it and go on.
    Skip,
    /// Within both bounds.
    Take,
    /// Past the far bound: the scan is done.
    Stop,
}

/// Where `key` stands for a scan between `lo` and `hi` that walks up
/// (`forward`) or down.
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "wiredtiger", feature = "lmdb")),
    allow(dead_code)
)]
pub fn scan_step(key: &[u8], lo: Bound<&[u8]>, hi: Bound<&[u8]>, forward: bool) -> ScanStep {
    let (inside_far, inside_near) = if forward {
        (below(key, hi), above(key, lo))
    } else {
        (above(key, lo), below(key, hi))
    };
    match (inside_far, inside_near) {
        (false, _) => ScanStep::Stop,
        (true, false) => ScanStep::Skip,
        (true, true) => ScanStep::Take,
    }
}

/// The transactional engines this module knows, compiled in or not.
pub const TX_ENGINES: [&str; 3] = ["rocksdb", "wiredtiger", "lmdb"];

/// Opens (creating, after wiping what is there) transactional engine
/// `name` under `cfg.dir/<name>/`.
pub fn open_tx(name: &str, cfg: &PeerConfig) -> CliResult<Arc<dyn TxPeer>> {
    match name {
        "rocksdb" => {
            #[cfg(feature = "rocksdb")]
            return Ok(Arc::new(super::rocksdb_txn::RocksTxDb::open(cfg)?));
            #[cfg(not(feature = "rocksdb"))]
            return Err(super::not_compiled(name, cfg));
        }
        "wiredtiger" => {
            #[cfg(feature = "wiredtiger")]
            return Ok(Arc::new(super::wiredtiger_txn::WtTxDb::open(cfg)?));
            #[cfg(not(feature = "wiredtiger"))]
            return Err(super::not_compiled(name, cfg));
        }
        "lmdb" => {
            #[cfg(feature = "lmdb")]
            return Ok(Arc::new(super::lmdb_txn::LmdbTxDb::open(cfg)?));
            #[cfg(not(feature = "lmdb"))]
            return Err(super::not_compiled(name, cfg));
        }
        _ => Err(CliError(format!(
            "engine {name:?} has no transactional binding: the TPC-C peers are {}",
            TX_ENGINES.join(", ")
        ))),
    }
}

/// A fresh `dir/<name>/` for a transactional engine: whatever was there
/// is removed (TPC-C always loads anew).
#[allow(dead_code)] // unused without engine features
pub(super) fn fresh_dir(cfg: &PeerConfig, name: &str) -> CliResult<std::path::PathBuf> {
    use crate::Context;
    let dir = cfg.dir.join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CliError(format!("removing {}: {e}", dir.display()))),
    }
    std::fs::create_dir_all(&dir).context(format_args!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn cfg(dir: &std::path::Path) -> PeerConfig {
        PeerConfig {
            dir: dir.to_path_buf(),
            cache_bytes: 16 << 20,
            threads: 4,
            direct_io: false,
            durability: dana::Durability::Off,
            memtables_in_budget: true,
        }
    }

    #[test]
    fn peers_txn_unknown_engine_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = open_tx("leveldb", &cfg(dir.path())).err().unwrap();
        assert!(e.0.contains("no transactional binding"), "{}", e.0);
    }

    #[test]
    fn peers_txn_bounds() {
        use Bound::*;
        assert!(above(b"b", Included(b"b")) && !above(b"b", Excluded(b"b")));
        assert!(above(b"c", Excluded(b"b")) && above(b"", Unbounded));
        assert!(below(b"b", Included(b"b")) && !below(b"b", Excluded(b"b")));
        assert!(below(b"a", Excluded(b"b")) && below(b"zz", Unbounded));
        let (lo, hi) = (Excluded(b"b".as_slice()), Included(b"d".as_slice()));
        assert_eq!(scan_step(b"b", lo, hi, true), ScanStep::Skip);
        assert_eq!(scan_step(b"c", lo, hi, true), ScanStep::Take);
        assert_eq!(scan_step(b"e", lo, hi, true), ScanStep::Stop);
        assert_eq!(scan_step(b"b", lo, hi, false), ScanStep::Stop);
        assert_eq!(scan_step(b"d", lo, Excluded(b"d"), false), ScanStep::Skip);
    }

    fn keys(e: &Entries) -> Vec<&[u8]> {
        e.iter().map(|(k, _)| k.as_slice()).collect()
    }

    /// What every transactional engine must do: reads see committed data
    /// and the transaction's own writes; scans honour bounds, direction
    /// and limit and merge own writes; a dropped transaction leaves
    /// nothing; if writers run concurrently (`concurrent_writers`; LMDB's
    /// do not, they wait for the writer lock), two transactions writing
    /// one key conflict (the second gets `Conflict`, never another
    /// error); committed data survives a reopen.
    #[allow(dead_code)] // unused without engine features
    pub(in crate::peers) fn conformance(name: &str, concurrent_writers: bool) {
        use Bound::*;
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let e = open_tx(name, &c).unwrap();
        assert_eq!(e.name(), name);
        let mut t = e.clone().begin(false, false).unwrap();
        for i in 0..10u8 {
            t.put(&[b'k', i], &[i; 3]).unwrap();
        }
        assert_eq!(t.get(b"k\x03", false).unwrap(), Some(vec![3; 3]));
        t.commit().unwrap();
        e.settle().unwrap();

        let mut t = e.clone().begin(true, false).unwrap();
        assert_eq!(t.get(b"k\x04", true).unwrap(), Some(vec![4; 3]));
        assert_eq!(t.get(b"nope", false).unwrap(), None);
        t.delete(b"k\x02").unwrap();
        t.put(b"k\x0a", b"own").unwrap();
        assert_eq!(t.get(b"k\x02", false).unwrap(), None);
        let all = t
            .scan(Included(b"k"), Excluded(b"l"), true, usize::MAX)
            .unwrap();
        assert_eq!(all.len(), 10, "{:?}", keys(&all));
        assert_eq!(all.last().unwrap().1, b"own");
        let some = t
            .scan(Excluded(b"k\x01"), Included(b"k\x05"), true, 2)
            .unwrap();
        assert_eq!(keys(&some), vec![b"k\x03".as_slice(), b"k\x04"]);
        let back = t
            .scan(Included(b"k\x01"), Excluded(b"k\x05"), false, 3)
            .unwrap();
        assert_eq!(keys(&back), vec![b"k\x04".as_slice(), b"k\x03", b"k\x01"]);
        let last = t.scan(Unbounded, Unbounded, false, 1).unwrap();
        assert_eq!(keys(&last), vec![b"k\x0a".as_slice()]);
        drop(t); // rolled back
        let mut t = e.clone().begin(false, false).unwrap();
        assert_eq!(t.get(b"k\x02", false).unwrap(), Some(vec![2; 3]));
        assert_eq!(t.get(b"k\x0a", false).unwrap(), None);
        drop(t);

        // Write-write conflict: the second writer of a key conflicts.
        if concurrent_writers {
            let mut a = e.clone().begin(false, false).unwrap();
            let mut b = e.clone().begin(false, false).unwrap();
            assert!(b.get(b"k\x05", false).unwrap().is_some());
            a.put(b"k\x05", b"a").unwrap();
            a.commit().unwrap();
            let r = b.get(b"k\x05", true).and_then(|_| b.put(b"k\x05", b"b"));
            let r = r.and_then(|()| b.commit());
            assert!(
                matches!(r, Err(PeerTxError::Conflict(_))),
                "expected a conflict, got {r:?}"
            );
        } else {
            let mut a = e.clone().begin(false, false).unwrap();
            a.put(b"k\x05", b"a").unwrap();
            a.commit().unwrap();
        }
        let mut t = e.clone().begin(false, false).unwrap();
        assert_eq!(t.get(b"k\x05", false).unwrap(), Some(b"a".to_vec()));
        drop(t);

        // Durable across a reopen (without settle).
        let mut t = e.clone().begin(true, false).unwrap();
        t.put(b"z", b"synced").unwrap();
        t.commit().unwrap();
        drop(e);
        let e = reopen(name, &c);
        let mut t = e.clone().begin(false, false).unwrap();
        assert_eq!(t.get(b"z", false).unwrap(), Some(b"synced".to_vec()));
        assert_eq!(t.get(b"k\x05", false).unwrap(), Some(b"a".to_vec()));
    }

    /// Opens `name` again without wiping its directory.
    #[allow(dead_code)] // unused without engine features
    fn reopen(name: &str, c: &PeerConfig) -> Arc<dyn TxPeer> {
        match name {
            #[cfg(feature = "rocksdb")]
            "rocksdb" => Arc::new(super::super::rocksdb_txn::RocksTxDb::reopen(c).unwrap()),
            #[cfg(feature = "wiredtiger")]
            "wiredtiger" => Arc::new(super::super::wiredtiger_txn::WtTxDb::reopen(c).unwrap()),
            #[cfg(feature = "lmdb")]
            "lmdb" => Arc::new(super::super::lmdb_txn::LmdbTxDb::reopen(c).unwrap()),
            _ => panic!("no engine {name} (config {c:?})"),
        }
    }
}
