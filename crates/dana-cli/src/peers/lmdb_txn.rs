//! LMDB 0.9 transactions through its C API, behind [`TxPeer`] (the TPC-C
//! peer). Uses the declarations of the parent binding.
//!
//! Configuration: `MDB_NORDAHEAD | MDB_NOTLS`, 4 KiB pages (the OS
//! page), a map of [`MAP_BYTES`] of address space (the file grows as pages
//! are used), [`READERS`] reader slots, one unnamed database.
//!
//! LMDB is a copy-on-write B+tree with one writer at a time: a read-write
//! transaction holds the environment's writer lock from its begin to its
//! commit or abort, so writers run one after another and never conflict
//! (serializable). A read-only transaction (the benchmark says which:
//! Order-Status, Stock-Level and the checker's scans) reads a committed
//! snapshot beside the writer. Durability: a durable commit is LMDB's own
//! (`fdatasync` of the data file, then the meta page through an `O_DSYNC`
//! descriptor: two device flushes per commit, and no group commit, since
//! one writer has nothing to group); a non-durable one runs with
//! `MDB_NOSYNC` set on the environment, switched under the writer lock.
//!
//! Not comparable out of memory: LMDB has no direct I/O and no cache of
//! its own; its reads are served by the OS page cache whatever the budget
//! ([`TxPeer::caveat`]).
//!
//! A write transaction must end on the thread that began it (the writer
//! lock is a mutex): [`LmdbTx`] checks that and panics otherwise (the
//! benchmark runs each client on one OS thread).

use std::ffi::{c_int, c_uint};
use std::ops::Bound;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use super::lmdb::{
    check, error, mdb_cursor_close, mdb_cursor_get, mdb_cursor_open, mdb_del, mdb_env_close,
    mdb_env_set_flags, mdb_env_sync, mdb_get, mdb_put, mdb_txn_abort, mdb_txn_begin,
    mdb_txn_commit, open_env, MdbDbi, MdbEnv, MdbTxn, MdbVal, MDB_FIRST, MDB_LAST, MDB_NEXT,
    MDB_NORDAHEAD, MDB_NOSYNC, MDB_NOTFOUND, MDB_NOTLS, MDB_PREV, MDB_RDONLY, MDB_SET_RANGE,
};
use super::txn::{
    below, fresh_dir, scan_step, Entries, PeerTx, PeerTxError, PeerTxResult, ScanStep, TxPeer,
};
use super::PeerConfig;
use crate::{CliError, CliResult};

/// Address space the map reserves: the most the database may grow to.
const MAP_BYTES: usize = 256 << 30;

/// Reader slots: one per client thread (the sweep reaches 128) plus the
/// checker's, with room to spare.
const READERS: c_uint = 1024;

/// LMDB with transactions behind [`TxPeer`].
pub struct LmdbTxDb {
    env: *mut MdbEnv,
    dbi: MdbDbi,
    /// Whether `MDB_NOSYNC` is set on the environment now; read and
    /// switched only under the writer lock.
    nosync: AtomicBool,
}

// SAFETY: an MDB_env may be shared by threads; read transactions are not
// bound to a thread (MDB_NOTLS); a write transaction is begun and ended
// on one thread (checked by LmdbTx).
unsafe impl Send for LmdbTxDb {}
// SAFETY: as for Send.
unsafe impl Sync for LmdbTxDb {}

impl LmdbTxDb {
    /// Creates a fresh database under `cfg.dir/lmdb/` (wiping any).
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = fresh_dir(cfg, "lmdb")?;
        Self::open_dir(&dir)
    }

    /// Opens the database under `cfg.dir/lmdb/` as it is.
    #[cfg(test)]
    pub fn reopen(cfg: &PeerConfig) -> CliResult<Self> {
        Self::open_dir(&cfg.dir.join("lmdb"))
    }

    fn open_dir(dir: &std::path::Path) -> CliResult<Self> {
        let (env, dbi) = open_env(dir, MAP_BYTES, READERS, MDB_NORDAHEAD | MDB_NOTLS)?;
        Ok(LmdbTxDb {
            env,
            dbi,
            nosync: AtomicBool::new(false),
        })
    }
}

impl Drop for LmdbTxDb {
    fn drop(&mut self) {
        // SAFETY: every transaction holds an Arc of this, so none is left;
        // the environment is closed once.
        unsafe { mdb_env_close(self.env) };
    }
}

impl TxPeer for LmdbTxDb {
    fn name(&self) -> &'static str {
        "lmdb"
    }

    fn isolation(&self) -> &'static str {
        "serializable (one writer at a time)"
    }

    fn config(&self) -> String {
        format!(
            "map {} GiB, 4 KiB pages, MDB_NORDAHEAD, no cache of its own (the OS page \
             cache), durable commit = fdatasync + O_DSYNC meta write, no direct I/O",
            MAP_BYTES >> 30
        )
    }

    fn caveat(&self) -> Option<String> {
        Some(
            "LMDB has no direct I/O and no cache budget: the OS page cache serves its \
             reads, so out of memory it is not held to the budget the others get"
                .into(),
        )
    }

    fn begin(self: Arc<Self>, sync: bool, read_only: bool) -> PeerTxResult<Box<dyn PeerTx>> {
        let mut txn = ptr::null_mut();
        let flags = if read_only { MDB_RDONLY } else { 0 };
        // SAFETY: the environment is open while `self` lives; `txn` is an
        // out-pointer. A write begin waits for the writer lock.
        let rc = unsafe { mdb_txn_begin(self.env, ptr::null_mut(), flags, &mut txn) };
        check(rc, "beginning a transaction")?;
        Ok(Box::new(LmdbTx {
            txn,
            read_only,
            sync,
            thread: std::thread::current().id(),
            db: self,
        }))
    }

    fn settle(&self) -> CliResult<()> {
        // SAFETY: the environment is open; a forced sync flushes whatever
        // MDB_NOSYNC commits left unsynced.
        check(unsafe { mdb_env_sync(self.env, 1) }, "syncing")
    }
}

/// One LMDB transaction.
struct LmdbTx {
    /// Live until commit or drop (both end it).
    txn: *mut MdbTxn,
    read_only: bool,
    sync: bool,
    thread: ThreadId,
    /// Keeps the environment open.
    db: Arc<LmdbTxDb>,
}

// SAFETY: a read-only transaction may move between threads (MDB_NOTLS);
// a write transaction checks it ends on its own thread.
unsafe impl Send for LmdbTx {}

impl LmdbTx {
    /// Control-plane check: the writer lock is released by its owner.
    fn on_own_thread(&self) {
        assert!(
            self.read_only || std::thread::current().id() == self.thread,
            "an LMDB write transaction must end on the thread that began it"
        );
    }

    fn writable(&self, what: &str) -> PeerTxResult<()> {
        if self.read_only {
            return Err(PeerTxError::Failed(CliError(format!(
                "lmdb: {what} in a read-only transaction"
            ))));
        }
        Ok(())
    }
}

impl PeerTx for LmdbTx {
    fn get(&mut self, key: &[u8], _for_update: bool) -> PeerTxResult<Option<Vec<u8>>> {
        let (mut k, mut v) = (MdbVal::of(key), MdbVal::empty());
        // SAFETY: the transaction is live and used by this thread; the key
        // is valid for its size.
        let rc = unsafe { mdb_get(self.txn, self.db.dbi, &mut k, &mut v) };
        if rc == MDB_NOTFOUND {
            return Ok(None);
        }
        check(rc, "get")?;
        // SAFETY: the value points into the map (or the transaction's dirty
        // page) until the next write; copied now.
        Ok(Some(unsafe { v.bytes() }.to_vec()))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> PeerTxResult<()> {
        self.writable("put")?;
        let (mut k, mut v) = (MdbVal::of(key), MdbVal::of(value));
        // SAFETY: the write transaction is live; LMDB copies key and value.
        let rc = unsafe { mdb_put(self.txn, self.db.dbi, &mut k, &mut v, 0) };
        check(rc, "put").map_err(Into::into)
    }

    fn delete(&mut self, key: &[u8]) -> PeerTxResult<()> {
        self.writable("delete")?;
        let mut k = MdbVal::of(key);
        // SAFETY: as for put; a null data deletes the key.
        let rc = unsafe { mdb_del(self.txn, self.db.dbi, &mut k, ptr::null_mut()) };
        if rc == MDB_NOTFOUND {
            return Ok(());
        }
        check(rc, "delete").map_err(Into::into)
    }

    fn scan(
        &mut self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> PeerTxResult<Entries> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let mut cursor = ptr::null_mut();
        // SAFETY: the transaction is live; `cursor` is an out-pointer.
        check(
            unsafe { mdb_cursor_open(self.txn, self.db.dbi, &mut cursor) },
            "opening a cursor",
        )?;
        let near = if forward { lo } else { hi };
        let step = if forward { MDB_NEXT } else { MDB_PREV };
        let (mut k, mut v) = (MdbVal::empty(), MdbVal::empty());
        // SAFETY: the cursor is live until closed below; k and v point into
        // the map or the transaction's pages until the next write, and are
        // copied before the cursor moves.
        let rc = unsafe {
            let mut rc = match near {
                Bound::Included(b) | Bound::Excluded(b) => {
                    k = MdbVal::of(b);
                    let rc = mdb_cursor_get(cursor, &mut k, &mut v, MDB_SET_RANGE);
                    match (rc, forward) {
                        // Nothing at or above the upper bound: start at
                        // the last key.
                        (MDB_NOTFOUND, false) => mdb_cursor_get(cursor, &mut k, &mut v, MDB_LAST),
                        // Landed above the upper bound: step back.
                        (0, false) if !below(k.bytes(), hi) => {
                            mdb_cursor_get(cursor, &mut k, &mut v, MDB_PREV)
                        }
                        _ => rc,
                    }
                }
                Bound::Unbounded => {
                    let op = if forward { MDB_FIRST } else { MDB_LAST };
                    mdb_cursor_get(cursor, &mut k, &mut v, op)
                }
            };
            while rc == 0 && out.len() < limit {
                let key = k.bytes();
                match scan_step(key, lo, hi, forward) {
                    ScanStep::Stop => break,
                    ScanStep::Skip => {}
                    ScanStep::Take => {
                        out.push((key.to_vec(), v.bytes().to_vec()));
                    }
                }
                rc = mdb_cursor_get(cursor, &mut k, &mut v, step);
            }
            mdb_cursor_close(cursor);
            rc
        };
        if rc != 0 && rc != MDB_NOTFOUND {
            return Err(error(rc, "scan").into());
        }
        Ok(out)
    }

    fn commit(mut self: Box<Self>) -> PeerTxResult<()> {
        self.on_own_thread();
        let txn = std::mem::replace(&mut self.txn, ptr::null_mut());
        if !self.read_only {
            // The writer lock is held: no other commit reads the flag now.
            let nosync = !self.sync;
            if self.db.nosync.load(Ordering::Relaxed) != nosync {
                // SAFETY: the environment is open; MDB_NOSYNC may be
                // changed at any time (lmdb.h), and only writers read it.
                let rc = unsafe { mdb_env_set_flags(self.db.env, MDB_NOSYNC, c_int::from(nosync)) };
                if rc != 0 {
                    // SAFETY: the transaction is live; abort ends it.
                    unsafe { mdb_txn_abort(txn) };
                    return Err(error(rc, "switching MDB_NOSYNC").into());
                }
                self.db.nosync.store(nosync, Ordering::Relaxed);
            }
        }
        // SAFETY: the transaction is live; commit ends it whatever it
        // returns (a failed commit aborts).
        let rc = unsafe { mdb_txn_commit(txn) };
        check(rc, "commit").map_err(Into::into)
    }
}

impl Drop for LmdbTx {
    fn drop(&mut self) {
        if self.txn.is_null() {
            return;
        }
        self.on_own_thread();
        // SAFETY: the transaction is live and not used again; abort rolls
        // it back and releases the writer lock (or the reader slot).
        unsafe { mdb_txn_abort(self.txn) };
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::*;
    use std::sync::Arc;

    use super::super::txn::{tests::conformance, TxPeer};
    use super::super::PeerConfig;
    use super::LmdbTxDb;

    #[test]
    fn peers_lmdb_transactions_conform() {
        conformance("lmdb", false);
    }

    /// A read-only transaction reads the snapshot it began on while a
    /// writer commits beside it; writes in it are refused.
    #[test]
    fn peers_lmdb_readers_keep_their_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = PeerConfig {
            dir: dir.path().to_path_buf(),
            cache_bytes: 16 << 20,
            threads: 2,
            direct_io: false,
            durability: dana::Durability::Off,
            memtables_in_budget: true,
        };
        let db: Arc<dyn TxPeer> = Arc::new(LmdbTxDb::open(&cfg).unwrap());
        let mut w = db.clone().begin(true, false).unwrap();
        w.put(b"a", b"1").unwrap();
        w.commit().unwrap();
        let mut r = db.clone().begin(false, true).unwrap();
        assert!(r.put(b"x", b"y").is_err());
        let mut w = db.clone().begin(true, false).unwrap();
        w.put(b"b", b"2").unwrap();
        w.commit().unwrap();
        let seen = r.scan(Unbounded, Unbounded, true, 10).unwrap();
        assert_eq!(seen, vec![(b"a".to_vec(), b"1".to_vec())]);
        drop(r);
        let mut r = db.clone().begin(false, true).unwrap();
        assert_eq!(r.scan(Unbounded, Unbounded, false, 10).unwrap().len(), 2);
        assert_eq!(r.get(b"b", false).unwrap(), Some(b"2".to_vec()));
    }
}
