//! RocksDB 7.8's pessimistic `TransactionDB` through its C API, behind
//! [`TxPeer`] (the TPC-C peer).
//!
//! Configuration: the block-table options of the parent binding (4 KiB
//! blocks, bloom filters, no compression, direct reads and direct
//! flush/compaction when asked), an LRU block cache of three quarters of
//! the budget and memtables of an eighth each, at most two
//! (`write_buffer_size`, `max_write_buffer_number`), so cache plus
//! memtables stay within the budget; background threads: one per core
//! (`increase_parallelism`). Settling (after the load and before each
//! measured run): a flush, then a wait until no compaction is pending or
//! running. Transactions: `set_snapshot` (reads
//! see the snapshot taken at begin; a write or a read-for-update of a key
//! written since conflicts), deadlock detection on, RocksDB's default lock
//! timeout (1 s). A durable commit uses `WriteOptions::sync` (the WAL is
//! fsynced; concurrent commits share one sync through RocksDB's write
//! group); a non-durable one writes the WAL unsynced.
//!
//! A busy key, a lock timeout, a deadlock or a snapshot conflict comes
//! back from RocksDB as a status "Resource busy", "Operation timed out"
//! or "Operation failed. Try again": those, and only those, are
//! [`PeerTxError::Conflict`].

use std::ffi::{c_char, c_int, c_uchar, c_void};
use std::ops::Bound;
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;

use super::rocksdb::{
    base_options, budget_split, check, rocksdb_cache_destroy, rocksdb_flushoptions_create,
    rocksdb_flushoptions_destroy, rocksdb_flushoptions_set_wait, rocksdb_free,
    rocksdb_iter_destroy, rocksdb_iter_get_error, rocksdb_iter_key, rocksdb_iter_next,
    rocksdb_iter_seek, rocksdb_iter_valid, rocksdb_iter_value, rocksdb_options_destroy,
    rocksdb_options_set_max_write_buffer_number, rocksdb_options_set_write_buffer_size,
    rocksdb_pinnableslice_destroy, rocksdb_pinnableslice_value, rocksdb_readoptions_create,
    rocksdb_readoptions_destroy, rocksdb_writeoptions_create, rocksdb_writeoptions_destroy,
    rocksdb_writeoptions_set_sync, Cache, FlushOptions, Iterator, Options, Owned, PinnableSlice,
    ReadOptions, WriteOptions,
};
use super::txn::{
    fresh_dir, scan_step, Entries, PeerTx, PeerTxError, PeerTxResult, ScanStep, TxPeer,
};
use super::PeerConfig;
use crate::{CliError, CliResult};

#[repr(C)]
struct TxnDb {
    _private: [u8; 0],
}
#[repr(C)]
struct TxnDbOptions {
    _private: [u8; 0],
}
#[repr(C)]
struct TxnOptions {
    _private: [u8; 0],
}
#[repr(C)]
struct Txn {
    _private: [u8; 0],
}
#[repr(C)]
struct Snapshot {
    _private: [u8; 0],
}

#[link(name = "rocksdb")]
extern "C" {
    fn rocksdb_readoptions_set_snapshot(r: *mut ReadOptions, s: *const Snapshot);

    fn rocksdb_transactiondb_options_create() -> *mut TxnDbOptions;
    fn rocksdb_transactiondb_options_destroy(o: *mut TxnDbOptions);
    fn rocksdb_transactiondb_open(
        o: *const Options,
        t: *const TxnDbOptions,
        name: *const c_char,
        errptr: *mut *mut c_char,
    ) -> *mut TxnDb;
    fn rocksdb_transactiondb_close(db: *mut TxnDb);
    fn rocksdb_transactiondb_property_int(
        db: *mut TxnDb,
        name: *const c_char,
        out: *mut u64,
    ) -> c_int;
    fn rocksdb_transactiondb_flush(
        db: *mut TxnDb,
        f: *const FlushOptions,
        errptr: *mut *mut c_char,
    );

    fn rocksdb_transaction_options_create() -> *mut TxnOptions;
    fn rocksdb_transaction_options_destroy(o: *mut TxnOptions);
    fn rocksdb_transaction_options_set_set_snapshot(o: *mut TxnOptions, v: c_uchar);
    fn rocksdb_transaction_options_set_deadlock_detect(o: *mut TxnOptions, v: c_uchar);

    fn rocksdb_transaction_begin(
        db: *mut TxnDb,
        w: *const WriteOptions,
        t: *const TxnOptions,
        old: *mut Txn,
    ) -> *mut Txn;
    fn rocksdb_transaction_get_snapshot(t: *mut Txn) -> *const Snapshot;
    fn rocksdb_transaction_get_pinned(
        t: *mut Txn,
        r: *const ReadOptions,
        key: *const c_char,
        klen: usize,
        errptr: *mut *mut c_char,
    ) -> *mut PinnableSlice;
    fn rocksdb_transaction_get_pinned_for_update(
        t: *mut Txn,
        r: *const ReadOptions,
        key: *const c_char,
        klen: usize,
        exclusive: c_uchar,
        errptr: *mut *mut c_char,
    ) -> *mut PinnableSlice;
    fn rocksdb_transaction_put(
        t: *mut Txn,
        key: *const c_char,
        klen: usize,
        val: *const c_char,
        vlen: usize,
        errptr: *mut *mut c_char,
    );
    fn rocksdb_transaction_delete(
        t: *mut Txn,
        key: *const c_char,
        klen: usize,
        errptr: *mut *mut c_char,
    );
    fn rocksdb_transaction_create_iterator(t: *mut Txn, r: *const ReadOptions) -> *mut Iterator;
    fn rocksdb_transaction_commit(t: *mut Txn, errptr: *mut *mut c_char);
    fn rocksdb_transaction_rollback(t: *mut Txn, errptr: *mut *mut c_char);
    fn rocksdb_transaction_destroy(t: *mut Txn);

    fn rocksdb_iter_seek_to_first(it: *mut Iterator);
    fn rocksdb_iter_seek_to_last(it: *mut Iterator);
    fn rocksdb_iter_seek_for_prev(it: *mut Iterator, k: *const c_char, klen: usize);
    fn rocksdb_iter_prev(it: *mut Iterator);
}

/// Status texts that mean "conflict: run it again".
const CONFLICTS: [&str; 3] = [
    ": Resource busy",
    ": Operation timed out",
    ": Operation failed. Try again",
];

/// A RocksDB `errptr` as a transaction result.
fn outcome(err: *mut c_char, what: &str) -> PeerTxResult<()> {
    check(err, what).map_err(|e| {
        if CONFLICTS.iter().any(|c| e.0.contains(c)) {
            PeerTxError::Conflict(e.0)
        } else {
            PeerTxError::Failed(e)
        }
    })
}

/// RocksDB's `TransactionDB` behind [`TxPeer`].
pub struct RocksTxDb {
    db: *mut TxnDb,
    options: *mut Options,
    cache: *mut Cache,
    txn_options: *mut TxnOptions,
    sync_write: *mut WriteOptions,
    write: *mut WriteOptions,
    cache_bytes: usize,
    memtable_bytes: usize,
    direct_io: bool,
    dir: PathBuf,
}

// SAFETY: a TransactionDB may be used from many threads at once (each
// transaction by one thread at a time); the option objects are only read
// after open and freed in Drop, which has `&mut self` (no transaction is
// alive then: each holds an `Arc` of this).
unsafe impl Send for RocksTxDb {}
// SAFETY: as for Send.
unsafe impl Sync for RocksTxDb {}

impl RocksTxDb {
    /// Creates a fresh database under `cfg.dir/rocksdb/` (wiping any).
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = fresh_dir(cfg, "rocksdb")?;
        Self::open_dir(cfg, dir)
    }

    /// Opens the database under `cfg.dir/rocksdb/` as it is.
    #[cfg(test)]
    pub fn reopen(cfg: &PeerConfig) -> CliResult<Self> {
        Self::open_dir(cfg, cfg.dir.join("rocksdb"))
    }

    fn open_dir(cfg: &PeerConfig, dir: PathBuf) -> CliResult<Self> {
        let cpath = super::c_path(&dir)?;
        let (cache_bytes, memtable_bytes) = budget_split(cfg.cache_bytes);
        let (options, cache) = base_options(cfg, cache_bytes);
        // SAFETY: setters and constructors on objects created here; each
        // is owned by `me` below (freed in Drop) or by a guard.
        let (db, err, txn_options, sync_write, write) = unsafe {
            rocksdb_options_set_write_buffer_size(options, memtable_bytes);
            rocksdb_options_set_max_write_buffer_number(options, 2);
            let db_options = Owned(
                rocksdb_transactiondb_options_create(),
                rocksdb_transactiondb_options_destroy,
            );
            let mut err = ptr::null_mut();
            let db = rocksdb_transactiondb_open(options, db_options.0, cpath.as_ptr(), &mut err);
            let txn_options = rocksdb_transaction_options_create();
            rocksdb_transaction_options_set_set_snapshot(txn_options, 1);
            rocksdb_transaction_options_set_deadlock_detect(txn_options, 1);
            let sync_write = rocksdb_writeoptions_create();
            rocksdb_writeoptions_set_sync(sync_write, 1);
            (
                db,
                err,
                txn_options,
                sync_write,
                rocksdb_writeoptions_create(),
            )
        };
        // From here on Drop frees everything (db may be null).
        let me = RocksTxDb {
            db,
            options,
            cache,
            txn_options,
            sync_write,
            write,
            cache_bytes,
            memtable_bytes,
            direct_io: cfg.direct_io,
            dir,
        };
        check(err, format_args!("opening {}", me.dir.display()))?;
        if me.db.is_null() {
            return Err(CliError(format!(
                "rocksdb: opening {} failed",
                me.dir.display()
            )));
        }
        Ok(me)
    }
}

impl Drop for RocksTxDb {
    fn drop(&mut self) {
        // SAFETY: every pointer was created in `open_dir` and is freed
        // exactly once; the database is closed before the cache and the
        // options it uses; no transaction is alive (each holds an Arc).
        unsafe {
            if !self.db.is_null() {
                rocksdb_transactiondb_close(self.db);
            }
            rocksdb_transaction_options_destroy(self.txn_options);
            rocksdb_writeoptions_destroy(self.sync_write);
            rocksdb_writeoptions_destroy(self.write);
            rocksdb_options_destroy(self.options);
            rocksdb_cache_destroy(self.cache);
        }
    }
}

impl TxPeer for RocksTxDb {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn isolation(&self) -> &'static str {
        "snapshot (TransactionDB, row locks on writes and reads for update)"
    }

    fn config(&self) -> String {
        format!(
            "TransactionDB (pessimistic), block cache {} MiB + 2 memtables of {} MiB, \
             4 KiB blocks, bloom 10 bits/key, no compression, direct I/O {}",
            self.cache_bytes >> 20,
            self.memtable_bytes >> 20,
            if self.direct_io { "on" } else { "off" }
        )
    }

    fn begin(self: Arc<Self>, sync: bool, _read_only: bool) -> PeerTxResult<Box<dyn PeerTx>> {
        let write = if sync { self.sync_write } else { self.write };
        // SAFETY: the database and options are live (we hold the Arc);
        // the transaction, its snapshot and its read options are owned by
        // the `RocksTx`, which frees them once.
        let (txn, snapshot, read) = unsafe {
            let txn = rocksdb_transaction_begin(self.db, write, self.txn_options, ptr::null_mut());
            let snapshot = rocksdb_transaction_get_snapshot(txn);
            let read = rocksdb_readoptions_create();
            rocksdb_readoptions_set_snapshot(read, snapshot);
            (txn, snapshot, read)
        };
        if txn.is_null() {
            return Err(PeerTxError::Failed(CliError(
                "rocksdb: beginning a transaction failed".into(),
            )));
        }
        Ok(Box::new(RocksTx {
            txn,
            snapshot,
            read,
            _db: self,
        }))
    }

    fn settle(&self) -> CliResult<()> {
        let mut err = ptr::null_mut();
        // SAFETY: flush options created and destroyed here; db is live.
        unsafe {
            let fo = Owned(rocksdb_flushoptions_create(), rocksdb_flushoptions_destroy);
            rocksdb_flushoptions_set_wait(fo.0, 1);
            rocksdb_transactiondb_flush(self.db, fo.0, &mut err);
        }
        check(err, "flushing")?;
        // Then wait, bounded, until no compaction is pending or running,
        // so that no run pays for the compaction debt of the writes before
        // it.
        let started = std::time::Instant::now();
        loop {
            let (mut pending, mut running) = (0u64, 0u64);
            // SAFETY: db is live; property names are NUL-terminated
            // statics; the outputs are valid out-pointers.
            let rc = unsafe {
                rocksdb_transactiondb_property_int(
                    self.db,
                    c"rocksdb.compaction-pending".as_ptr(),
                    &mut pending,
                ) | rocksdb_transactiondb_property_int(
                    self.db,
                    c"rocksdb.num-running-compactions".as_ptr(),
                    &mut running,
                )
            };
            if rc != 0 {
                return Err(CliError(
                    "rocksdb: reading the compaction properties failed".into(),
                ));
            }
            if pending == 0 && running == 0 {
                return Ok(());
            }
            if started.elapsed() > std::time::Duration::from_secs(900) {
                return Err(CliError(
                    "rocksdb: compactions still pending 900 s after a flush".into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// One RocksDB transaction.
struct RocksTx {
    txn: *mut Txn,
    snapshot: *const Snapshot,
    read: *mut ReadOptions,
    /// Keeps the database open while the transaction lives (dropped
    /// last, after the fields above are freed in Drop).
    _db: Arc<RocksTxDb>,
}

// SAFETY: a RocksDB transaction may move between threads; it is used by
// one at a time (`&mut self`).
unsafe impl Send for RocksTx {}

impl RocksTx {
    /// Copies a pinned value out and frees the slice.
    fn value(slice: *mut PinnableSlice) -> Option<Vec<u8>> {
        if slice.is_null() {
            return None;
        }
        let slice = Owned(slice, rocksdb_pinnableslice_destroy);
        let mut len = 0usize;
        // SAFETY: the slice is live until the guard drops; the value
        // pointer is valid for `len` bytes while the slice lives.
        let v = unsafe {
            let p = rocksdb_pinnableslice_value(slice.0, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        };
        Some(v.to_vec())
    }
}

impl PeerTx for RocksTx {
    fn get(&mut self, key: &[u8], for_update: bool) -> PeerTxResult<Option<Vec<u8>>> {
        let mut err = ptr::null_mut();
        let (k, kl) = (key.as_ptr().cast(), key.len());
        // SAFETY: the transaction and read options are live; the key is
        // valid for its length during the call.
        let slice = unsafe {
            if for_update {
                rocksdb_transaction_get_pinned_for_update(self.txn, self.read, k, kl, 1, &mut err)
            } else {
                rocksdb_transaction_get_pinned(self.txn, self.read, k, kl, &mut err)
            }
        };
        let v = Self::value(slice);
        outcome(err, "get")?;
        Ok(v)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> PeerTxResult<()> {
        let mut err = ptr::null_mut();
        // SAFETY: the transaction is live; key and value are valid for
        // their lengths and copied by RocksDB.
        unsafe {
            rocksdb_transaction_put(
                self.txn,
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr().cast(),
                value.len(),
                &mut err,
            )
        };
        outcome(err, "put")
    }

    fn delete(&mut self, key: &[u8]) -> PeerTxResult<()> {
        let mut err = ptr::null_mut();
        // SAFETY: the transaction is live; the key is valid for its length.
        unsafe { rocksdb_transaction_delete(self.txn, key.as_ptr().cast(), key.len(), &mut err) };
        outcome(err, "delete")
    }

    fn scan(
        &mut self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> PeerTxResult<Entries> {
        // SAFETY: the transaction and read options are live; the guard
        // destroys the iterator on every path.
        let it = unsafe {
            Owned(
                rocksdb_transaction_create_iterator(self.txn, self.read),
                rocksdb_iter_destroy,
            )
        };
        let mut out = Vec::new();
        // SAFETY: the iterator is live; keys and values are copied while
        // it is valid, before it moves.
        unsafe {
            match (forward, lo, hi) {
                (true, Bound::Included(b) | Bound::Excluded(b), _) => {
                    rocksdb_iter_seek(it.0, b.as_ptr().cast(), b.len())
                }
                (true, Bound::Unbounded, _) => rocksdb_iter_seek_to_first(it.0),
                (false, _, Bound::Included(b) | Bound::Excluded(b)) => {
                    rocksdb_iter_seek_for_prev(it.0, b.as_ptr().cast(), b.len())
                }
                (false, _, Bound::Unbounded) => rocksdb_iter_seek_to_last(it.0),
            }
            while out.len() < limit && rocksdb_iter_valid(it.0) != 0 {
                let (mut kl, mut vl) = (0usize, 0usize);
                let k = rocksdb_iter_key(it.0, &mut kl);
                let k = std::slice::from_raw_parts(k.cast::<u8>(), kl);
                match scan_step(k, lo, hi, forward) {
                    ScanStep::Stop => break,
                    ScanStep::Skip => {}
                    ScanStep::Take => {
                        let v = rocksdb_iter_value(it.0, &mut vl);
                        let v = std::slice::from_raw_parts(v.cast::<u8>(), vl);
                        out.push((k.to_vec(), v.to_vec()));
                    }
                }
                if forward {
                    rocksdb_iter_next(it.0);
                } else {
                    rocksdb_iter_prev(it.0);
                }
            }
        }
        let mut err = ptr::null_mut();
        // SAFETY: the iterator is live; err is an out-pointer.
        unsafe { rocksdb_iter_get_error(it.0, &mut err) };
        outcome(err, "scan")?;
        Ok(out)
    }

    fn commit(self: Box<Self>) -> PeerTxResult<()> {
        let mut err = ptr::null_mut();
        // SAFETY: the transaction is live; Drop then frees it (a
        // rollback after a commit, failed or not, is harmless).
        unsafe { rocksdb_transaction_commit(self.txn, &mut err) };
        outcome(err, "commit")
    }
}

impl Drop for RocksTx {
    fn drop(&mut self) {
        let mut err = ptr::null_mut();
        // SAFETY: each object was created in `begin` and is freed exactly
        // once, the read options before the snapshot they point at; the
        // database outlives them (`self._db` drops after this body).
        unsafe {
            rocksdb_transaction_rollback(self.txn, &mut err);
            if !err.is_null() {
                rocksdb_free(err.cast::<c_void>());
            }
            rocksdb_readoptions_destroy(self.read);
            rocksdb_free(self.snapshot as *mut c_void);
            rocksdb_transaction_destroy(self.txn);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn peers_rocksdb_transactions_conform() {
        super::super::txn::tests::conformance("rocksdb", true);
    }
}
