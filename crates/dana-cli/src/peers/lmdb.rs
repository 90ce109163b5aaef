//! LMDB 0.9 through its C API (`lmdb.h`), linked against the system
//! `liblmdb`.
//!
//! Configuration: `MDB_NOSYNC | MDB_NORDAHEAD | MDB_NOTLS` (without
//! `MDB_NOSYNC` when [`PeerConfig::durability`] is `Sync`: every commit
//! synced; LMDB has no log, so `Async` runs as `Off`), page = the OS
//! page (4 KiB), no compression (LMDB has none), map size = records ×
//! (value + key + node overhead, or whole overflow pages for large
//! values) × 2, plus 1 GiB for YCSB inserts, and at least twice the
//! existing file. Load: `MDB_APPEND` in key order, one write transaction
//! per batch, then `mdb_env_sync(force)`. Reads: a read-only transaction
//! per call, taken from a per-thread pool of reset transactions
//! (`mdb_txn_renew` / `mdb_txn_reset`, which `MDB_NOTLS` allows on any
//! thread). Puts: one write transaction each (LMDB has a single writer).
//!
//! Not comparable: LMDB has no direct I/O and no cache of its own; reads
//! are served from the OS page cache, whatever the cache budget (see
//! [`PeerEngine::caveat`]).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::ptr;

use super::{
    already_loaded, engine_dir, write_marker, LoadKeys, PeerConfig, PeerEngine, Pool, LOAD_BATCH,
};
use crate::{CliError, CliResult};

#[repr(C)]
pub(super) struct MdbEnv {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct MdbTxn {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct MdbCursor {
    _private: [u8; 0],
}
pub(super) type MdbDbi = c_uint;

/// `MDB_val`.
#[repr(C)]
pub(super) struct MdbVal {
    mv_size: usize,
    mv_data: *mut c_void,
}

impl MdbVal {
    pub(super) fn of(b: &[u8]) -> Self {
        MdbVal {
            mv_size: b.len(),
            mv_data: b.as_ptr() as *mut c_void,
        }
    }
    pub(super) fn empty() -> Self {
        MdbVal {
            mv_size: 0,
            mv_data: ptr::null_mut(),
        }
    }

    /// The bytes the value points at.
    ///
    /// # Safety
    /// The value must point at `mv_size` readable bytes (LMDB's values
    /// stay valid until their transaction ends or writes) for as long as
    /// the slice lives.
    pub(super) unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.mv_size == 0 {
            return &[];
        }
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.mv_data as *const u8, self.mv_size) }
    }
}

pub(super) const MDB_NOSYNC: c_uint = 0x10000;
pub(super) const MDB_RDONLY: c_uint = 0x20000;
pub(super) const MDB_NOTLS: c_uint = 0x200000;
pub(super) const MDB_NORDAHEAD: c_uint = 0x800000;
const MDB_APPEND: c_uint = 0x20000;
pub(super) const MDB_NOTFOUND: c_int = -30798;
/// `MDB_cursor_op` values.
pub(super) const MDB_FIRST: c_int = 0;
pub(super) const MDB_LAST: c_int = 6;
pub(super) const MDB_NEXT: c_int = 8;
pub(super) const MDB_PREV: c_int = 12;
pub(super) const MDB_SET_RANGE: c_int = 17;

#[link(name = "lmdb")]
extern "C" {
    pub(super) fn mdb_env_set_flags(env: *mut MdbEnv, flags: c_uint, onoff: c_int) -> c_int;
    pub(super) fn mdb_del(
        txn: *mut MdbTxn,
        dbi: MdbDbi,
        key: *mut MdbVal,
        data: *mut MdbVal,
    ) -> c_int;
    pub(super) fn mdb_strerror(err: c_int) -> *const c_char;
    pub(super) fn mdb_env_create(env: *mut *mut MdbEnv) -> c_int;
    pub(super) fn mdb_env_set_mapsize(env: *mut MdbEnv, size: usize) -> c_int;
    pub(super) fn mdb_env_set_maxreaders(env: *mut MdbEnv, readers: c_uint) -> c_int;
    pub(super) fn mdb_env_open(
        env: *mut MdbEnv,
        path: *const c_char,
        flags: c_uint,
        mode: c_uint,
    ) -> c_int;
    pub(super) fn mdb_env_sync(env: *mut MdbEnv, force: c_int) -> c_int;
    pub(super) fn mdb_env_close(env: *mut MdbEnv);
    pub(super) fn mdb_txn_begin(
        env: *mut MdbEnv,
        parent: *mut MdbTxn,
        flags: c_uint,
        txn: *mut *mut MdbTxn,
    ) -> c_int;
    pub(super) fn mdb_txn_commit(txn: *mut MdbTxn) -> c_int;
    pub(super) fn mdb_txn_abort(txn: *mut MdbTxn);
    pub(super) fn mdb_txn_reset(txn: *mut MdbTxn);
    pub(super) fn mdb_txn_renew(txn: *mut MdbTxn) -> c_int;
    pub(super) fn mdb_dbi_open(
        txn: *mut MdbTxn,
        name: *const c_char,
        flags: c_uint,
        dbi: *mut MdbDbi,
    ) -> c_int;
    pub(super) fn mdb_get(
        txn: *mut MdbTxn,
        dbi: MdbDbi,
        key: *mut MdbVal,
        data: *mut MdbVal,
    ) -> c_int;
    pub(super) fn mdb_put(
        txn: *mut MdbTxn,
        dbi: MdbDbi,
        key: *mut MdbVal,
        data: *mut MdbVal,
        flags: c_uint,
    ) -> c_int;
    pub(super) fn mdb_cursor_open(
        txn: *mut MdbTxn,
        dbi: MdbDbi,
        cursor: *mut *mut MdbCursor,
    ) -> c_int;
    pub(super) fn mdb_cursor_close(cursor: *mut MdbCursor);
    pub(super) fn mdb_cursor_get(
        cursor: *mut MdbCursor,
        key: *mut MdbVal,
        data: *mut MdbVal,
        op: c_int,
    ) -> c_int;
}

/// An LMDB return code as a result.
pub(super) fn check(rc: c_int, what: impl std::fmt::Display) -> CliResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(error(rc, what))
    }
}

/// The error for LMDB return code `rc` (non-zero).
pub(super) fn error(rc: c_int, what: impl std::fmt::Display) -> CliError {
    // SAFETY: mdb_strerror returns a static (or strerror) NUL-terminated
    // string for any code.
    let msg = unsafe { CStr::from_ptr(mdb_strerror(rc)) }
        .to_string_lossy()
        .into_owned();
    CliError(format!("lmdb: {what}: {msg} ({rc})"))
}

/// Creates and opens the environment in `dir` with `flags`, and opens
/// its main database. The caller owns the environment (and closes it
/// with `mdb_env_close`); on error nothing is left open.
pub(super) fn open_env(
    dir: &std::path::Path,
    mapsize: usize,
    readers: c_uint,
    flags: c_uint,
) -> CliResult<(*mut MdbEnv, MdbDbi)> {
    let cpath = super::c_path(dir)?;
    let mut env = ptr::null_mut();
    // SAFETY: `env` is an out-pointer.
    check(
        unsafe { mdb_env_create(&mut env) },
        "creating the environment",
    )?;
    let opened = (|| {
        // SAFETY: the environment is live and not yet open.
        check(
            unsafe { mdb_env_set_mapsize(env, mapsize) },
            "setting the map size",
        )?;
        // SAFETY: as above.
        check(
            unsafe { mdb_env_set_maxreaders(env, readers) },
            "setting max readers",
        )?;
        // SAFETY: `cpath` is NUL-terminated and outlives the call.
        let rc = unsafe { mdb_env_open(env, cpath.as_ptr(), flags, 0o644) };
        check(rc, format_args!("opening {}", dir.display()))?;
        let mut txn = ptr::null_mut();
        // SAFETY: the environment is open; `txn` is an out-pointer.
        check(
            unsafe { mdb_txn_begin(env, ptr::null_mut(), 0, &mut txn) },
            "begin",
        )?;
        let mut dbi = 0;
        // SAFETY: `txn` is a live write transaction; null name = main DB.
        let rc = unsafe { mdb_dbi_open(txn, ptr::null(), 0, &mut dbi) };
        if rc != 0 {
            // SAFETY: the transaction is live and not used again.
            unsafe { mdb_txn_abort(txn) };
            return Err(error(rc, "opening the main database"));
        }
        // SAFETY: the transaction is live; commit frees it.
        check(
            unsafe { mdb_txn_commit(txn) },
            "committing the database open",
        )?;
        Ok(dbi)
    })();
    match opened {
        Ok(dbi) => Ok((env, dbi)),
        Err(e) => {
            // SAFETY: no transaction of the environment is left; closed once.
            unsafe { mdb_env_close(env) };
            Err(e)
        }
    }
}

/// A reset read-only transaction waiting in the pool.
struct Reader(*mut MdbTxn);

// SAFETY: with MDB_NOTLS a read transaction is not bound to the thread
// that made it; the pool hands each to one thread at a time.
unsafe impl Send for Reader {}

/// LMDB behind [`PeerEngine`].
pub struct Lmdb {
    env: *mut MdbEnv,
    dbi: MdbDbi,
    readers: Pool<Reader>,
    dir: PathBuf,
}

// SAFETY: an MDB_env may be shared by threads; read transactions are
// per-call (pooled, one thread at a time, allowed by MDB_NOTLS) and write
// transactions are serialised by LMDB's writer lock.
unsafe impl Send for Lmdb {}
// SAFETY: as for Send.
unsafe impl Sync for Lmdb {}

/// A read transaction borrowed from the pool; reset and returned on drop.
struct ReadTxn<'a> {
    db: &'a Lmdb,
    txn: *mut MdbTxn,
}

impl Drop for ReadTxn<'_> {
    fn drop(&mut self) {
        // SAFETY: the transaction is live and renewed; reset releases its
        // snapshot but keeps the reader slot for the next renew.
        unsafe { mdb_txn_reset(self.txn) };
        self.db.readers.give(Reader(self.txn));
    }
}

impl Lmdb {
    /// Opens or creates the environment under `cfg.dir/lmdb/`.
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = engine_dir(cfg, "lmdb")?;
        let existing = std::fs::metadata(dir.join("data.mdb"))
            .map(|m| m.len())
            .unwrap_or(0);
        let mapsize = (existing as usize).saturating_mul(2).max(1 << 30);
        // A reader slot for every client thread a benchmark may run
        // (`--peer-threads` up to 4,096), whatever `threads` sizes: sized
        // from it, 128 client threads shared 68 slots.
        let readers = (cfg.threads.max(1) * 2 + 64).clamp(4096 + 64, 1 << 16) as c_uint;
        // Synced writes: LMDB's durable commit (data fdatasync, then the
        // meta page), one writer at a time.
        let nosync = if cfg.durability == dana::Durability::Sync {
            0
        } else {
            MDB_NOSYNC
        };
        let flags = nosync | MDB_NORDAHEAD | MDB_NOTLS;
        let (env, dbi) = open_env(&dir, mapsize, readers, flags)?;
        Ok(Lmdb {
            env,
            dbi,
            readers: Pool::new(),
            dir,
        })
    }

    /// A read-only transaction for this thread: a pooled one renewed, or
    /// a new one.
    fn reader(&self) -> CliResult<ReadTxn<'_>> {
        if let Some(Reader(txn)) = self.readers.take() {
            // SAFETY: a reset transaction of this environment.
            let rc = unsafe { mdb_txn_renew(txn) };
            if rc != 0 {
                // SAFETY: the transaction is not used again.
                unsafe { mdb_txn_abort(txn) };
                return Err(error(rc, "renewing a read transaction"));
            }
            return Ok(ReadTxn { db: self, txn });
        }
        let mut txn = ptr::null_mut();
        // SAFETY: the environment is open; `txn` is an out-pointer.
        let rc = unsafe { mdb_txn_begin(self.env, ptr::null_mut(), MDB_RDONLY, &mut txn) };
        check(rc, "beginning a read transaction")?;
        Ok(ReadTxn { db: self, txn })
    }

    /// Runs `f` in a write transaction and commits it (aborts on error).
    fn write<T>(&self, f: impl FnOnce(*mut MdbTxn) -> CliResult<T>) -> CliResult<T> {
        let mut txn = ptr::null_mut();
        // SAFETY: the environment is open; `txn` is an out-pointer.
        check(
            unsafe { mdb_txn_begin(self.env, ptr::null_mut(), 0, &mut txn) },
            "begin",
        )?;
        match f(txn) {
            Ok(t) => {
                // SAFETY: the transaction is live; commit frees it.
                check(unsafe { mdb_txn_commit(txn) }, "commit")?;
                Ok(t)
            }
            Err(e) => {
                // SAFETY: the transaction is live; abort frees it.
                unsafe { mdb_txn_abort(txn) };
                Err(e)
            }
        }
    }
}

impl Drop for Lmdb {
    fn drop(&mut self) {
        for Reader(txn) in self.readers.drain() {
            // SAFETY: pooled transactions are reset and owned by the pool.
            unsafe { mdb_txn_abort(txn) };
        }
        // SAFETY: no transaction is left (`&mut self`: no call in flight);
        // the environment is closed once.
        unsafe { mdb_env_close(self.env) };
    }
}

impl PeerEngine for Lmdb {
    fn name(&self) -> &'static str {
        "lmdb"
    }

    fn load(
        &self,
        records: u64,
        value_size: usize,
        keys: LoadKeys<'_>,
        value: &(dyn Fn(u64, &mut [u8]) + Sync),
        progress: &(dyn Fn(u64) + Sync),
    ) -> CliResult<()> {
        if already_loaded(&self.dir, records, value_size, keys)? {
            progress(records);
            return Ok(());
        }
        // Bytes per record: a leaf node (8-byte header + key + value) plus
        // its 2-byte slot, or for large values whole overflow pages.
        let per = if value_size + 8 + 10 > 2000 {
            (value_size + 16).div_ceil(4096) * 4096 + 8 + 10
        } else {
            value_size + 8 + 10
        };
        let mapsize = (records as usize).saturating_mul(per).saturating_mul(2) + (1 << 30);
        // Pooled readers hold no snapshot (they are reset), so the map can
        // be resized; drop them anyway so none sees the old mapping.
        for Reader(txn) in self.readers.drain() {
            // SAFETY: pooled transactions are reset and owned by the pool.
            unsafe { mdb_txn_abort(txn) };
        }
        // SAFETY: no transaction of this environment is active (loads run
        // before the measured phase, alone).
        check(
            unsafe { mdb_env_set_mapsize(self.env, mapsize) },
            "growing the map",
        )?;
        let mut buf = vec![0u8; value_size];
        let mut i = 0u64;
        while i < records {
            let end = (i + LOAD_BATCH * 8).min(records);
            self.write(|txn| {
                for j in i..end {
                    let k = keys.number(j);
                    value(k, &mut buf);
                    let key = (keys.key)(k);
                    let (mut k, mut v) = (MdbVal::of(&key), MdbVal::of(&buf));
                    // SAFETY: `txn` is the live write transaction; key and
                    // value are valid for their sizes and copied by LMDB.
                    let rc = unsafe { mdb_put(txn, self.dbi, &mut k, &mut v, MDB_APPEND) };
                    check(rc, format_args!("loading key {j}"))?;
                }
                Ok(())
            })?;
            i = end;
            progress(i);
        }
        // SAFETY: the environment is open.
        check(unsafe { mdb_env_sync(self.env, 1) }, "syncing the load")?;
        write_marker(&self.dir, records, value_size, keys)
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> CliResult<bool> {
        let r = self.reader()?;
        let (mut k, mut v) = (MdbVal::of(key), MdbVal::empty());
        // SAFETY: `r.txn` is a live read transaction used by this thread
        // only; key is valid for its size.
        let rc = unsafe { mdb_get(r.txn, self.dbi, &mut k, &mut v) };
        if rc == MDB_NOTFOUND {
            return Ok(false);
        }
        check(rc, "get")?;
        // SAFETY: the value points into the map and stays valid until the
        // transaction ends (when `r` drops, after the copy).
        let data = unsafe { v.bytes() };
        out.clear();
        out.extend_from_slice(data);
        Ok(true)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> CliResult<()> {
        self.write(|txn| {
            let (mut k, mut v) = (MdbVal::of(key), MdbVal::of(value));
            // SAFETY: `txn` is the live write transaction; key and value
            // are valid for their sizes and copied by LMDB.
            check(unsafe { mdb_put(txn, self.dbi, &mut k, &mut v, 0) }, "put")
        })
    }

    fn scan(&self, start: &[u8], n: usize) -> CliResult<usize> {
        let r = self.reader()?;
        let mut cursor = ptr::null_mut();
        // SAFETY: `r.txn` is a live read transaction; `cursor` is an
        // out-pointer.
        check(
            unsafe { mdb_cursor_open(r.txn, self.dbi, &mut cursor) },
            "opening a cursor",
        )?;
        let (mut k, mut v) = (MdbVal::of(start), MdbVal::empty());
        let mut read = 0usize;
        let mut bytes = 0usize;
        let mut op = MDB_SET_RANGE;
        let mut rc = 0;
        while read < n {
            // SAFETY: the cursor is live; k/v are in/out values that point
            // into the map until the transaction ends.
            rc = unsafe { mdb_cursor_get(cursor, &mut k, &mut v, op) };
            if rc != 0 {
                break;
            }
            bytes += std::hint::black_box(k.mv_size + v.mv_size);
            read += 1;
            op = MDB_NEXT;
        }
        std::hint::black_box(bytes);
        // SAFETY: the cursor is live and closed once, before its
        // transaction ends.
        unsafe { mdb_cursor_close(cursor) };
        if rc != 0 && rc != MDB_NOTFOUND {
            check(rc, "scan")?;
        }
        Ok(read)
    }

    fn caveat(&self) -> Option<String> {
        Some(
            "LMDB has no direct I/O: reads are served by the OS page cache, not limited \
             to the cache budget; its numbers are not comparable when data exceeds the \
             budget"
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use dana::Durability;

    #[test]
    fn peers_lmdb_conformance() {
        super::super::tests::conformance("lmdb", Durability::Off);
    }

    #[test]
    fn peers_lmdb_conformance_with_an_unsynced_log() {
        super::super::tests::conformance("lmdb", Durability::Async);
    }

    #[test]
    fn peers_lmdb_conformance_with_synced_writes() {
        super::super::tests::conformance("lmdb", Durability::Sync);
    }
}
