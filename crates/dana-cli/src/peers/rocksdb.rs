//! RocksDB 7.8 through its C API (`rocksdb/c.h`), linked against the
//! system `librocksdb`.
//!
//! Configuration (see the fairness rules in the parent module):
//! block-based table, `block_size` 4096, LRU block cache of
//! `cache_bytes` with index and filter blocks charged to it
//! (`cache_index_and_filter_blocks`), full bloom filter of 10 bits/key, no
//! compression (`compression = none`; `bottommost_compression` stays
//! "disabled", i.e. follows it), `max_open_files -1`,
//! `increase_parallelism(threads)`, `use_direct_reads` and
//! `use_direct_io_for_flush_and_compaction` when direct I/O is asked for.
//! With [`PeerConfig::memtables_in_budget`] (benchmarks that write) the
//! block cache is three quarters of the budget and the memtables an
//! eighth each, at most two, so both stay within it; without it
//! (read-only benchmarks) the cache is the whole budget. Everything else
//! is RocksDB's default (level compaction). Load: write batches with the WAL disabled, then a flush
//! and a full `compact_range`. Reads: `fill_cache` true, checksums
//! verified (the default). Puts by [`PeerConfig::durability`]: without
//! the WAL (`Off`), WAL not synced (`Async`), synced (`Sync`,
//! `WriteOptions::sync`).

use std::ffi::{c_char, c_int, c_uchar, c_void, CStr};
use std::path::PathBuf;
use std::ptr;

use super::{
    already_loaded, engine_dir, write_marker, LoadKeys, PeerConfig, PeerEngine, LOAD_BATCH,
};
use crate::{CliError, CliResult};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub(super) struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    Db,
    Options,
    BlockOptions,
    Cache,
    FilterPolicy,
    ReadOptions,
    WriteOptions,
    WriteBatch,
    FlushOptions,
    Iterator,
    PinnableSlice
);

#[link(name = "rocksdb")]
extern "C" {
    fn rocksdb_options_create() -> *mut Options;
    pub(super) fn rocksdb_options_destroy(o: *mut Options);
    fn rocksdb_options_set_create_if_missing(o: *mut Options, v: c_uchar);
    fn rocksdb_options_increase_parallelism(o: *mut Options, total_threads: c_int);
    fn rocksdb_options_set_compression(o: *mut Options, v: c_int);
    fn rocksdb_options_set_max_open_files(o: *mut Options, v: c_int);
    fn rocksdb_options_set_use_direct_reads(o: *mut Options, v: c_uchar);
    fn rocksdb_options_set_use_direct_io_for_flush_and_compaction(o: *mut Options, v: c_uchar);
    fn rocksdb_options_set_block_based_table_factory(o: *mut Options, t: *mut BlockOptions);

    fn rocksdb_block_based_options_create() -> *mut BlockOptions;
    fn rocksdb_block_based_options_destroy(t: *mut BlockOptions);
    fn rocksdb_block_based_options_set_block_size(t: *mut BlockOptions, size: usize);
    fn rocksdb_block_based_options_set_block_cache(t: *mut BlockOptions, c: *mut Cache);
    fn rocksdb_block_based_options_set_filter_policy(t: *mut BlockOptions, f: *mut FilterPolicy);
    fn rocksdb_block_based_options_set_cache_index_and_filter_blocks(
        t: *mut BlockOptions,
        v: c_uchar,
    );
    fn rocksdb_filterpolicy_create_bloom(bits_per_key: f64) -> *mut FilterPolicy;
    fn rocksdb_cache_create_lru(capacity: usize) -> *mut Cache;
    pub(super) fn rocksdb_cache_destroy(c: *mut Cache);

    fn rocksdb_open(o: *const Options, name: *const c_char, errptr: *mut *mut c_char) -> *mut Db;
    fn rocksdb_close(db: *mut Db);
    pub(super) fn rocksdb_free(p: *mut c_void);

    pub(super) fn rocksdb_readoptions_create() -> *mut ReadOptions;
    pub(super) fn rocksdb_readoptions_destroy(r: *mut ReadOptions);
    fn rocksdb_readoptions_set_fill_cache(r: *mut ReadOptions, v: c_uchar);
    pub(super) fn rocksdb_writeoptions_create() -> *mut WriteOptions;
    pub(super) fn rocksdb_writeoptions_destroy(w: *mut WriteOptions);
    pub(super) fn rocksdb_writeoptions_disable_WAL(w: *mut WriteOptions, disable: c_int);
    pub(super) fn rocksdb_writeoptions_set_sync(w: *mut WriteOptions, v: c_uchar);
    pub(super) fn rocksdb_options_set_write_buffer_size(o: *mut Options, v: usize);
    pub(super) fn rocksdb_options_set_max_write_buffer_number(o: *mut Options, v: c_int);
    pub(super) fn rocksdb_flushoptions_create() -> *mut FlushOptions;
    pub(super) fn rocksdb_flushoptions_destroy(f: *mut FlushOptions);
    pub(super) fn rocksdb_flushoptions_set_wait(f: *mut FlushOptions, v: c_uchar);

    fn rocksdb_writebatch_create() -> *mut WriteBatch;
    fn rocksdb_writebatch_destroy(b: *mut WriteBatch);
    fn rocksdb_writebatch_clear(b: *mut WriteBatch);
    fn rocksdb_writebatch_put(
        b: *mut WriteBatch,
        key: *const c_char,
        klen: usize,
        val: *const c_char,
        vlen: usize,
    );
    fn rocksdb_write(
        db: *mut Db,
        w: *const WriteOptions,
        b: *mut WriteBatch,
        errptr: *mut *mut c_char,
    );
    fn rocksdb_put(
        db: *mut Db,
        w: *const WriteOptions,
        key: *const c_char,
        klen: usize,
        val: *const c_char,
        vlen: usize,
        errptr: *mut *mut c_char,
    );
    fn rocksdb_flush(db: *mut Db, f: *const FlushOptions, errptr: *mut *mut c_char);
    fn rocksdb_compact_range(
        db: *mut Db,
        start: *const c_char,
        start_len: usize,
        limit: *const c_char,
        limit_len: usize,
    );

    fn rocksdb_get_pinned(
        db: *mut Db,
        r: *const ReadOptions,
        key: *const c_char,
        klen: usize,
        errptr: *mut *mut c_char,
    ) -> *mut PinnableSlice;
    pub(super) fn rocksdb_pinnableslice_value(
        s: *const PinnableSlice,
        vlen: *mut usize,
    ) -> *const c_char;
    pub(super) fn rocksdb_pinnableslice_destroy(s: *mut PinnableSlice);

    fn rocksdb_create_iterator(db: *mut Db, r: *const ReadOptions) -> *mut Iterator;
    pub(super) fn rocksdb_iter_destroy(it: *mut Iterator);
    pub(super) fn rocksdb_iter_seek(it: *mut Iterator, k: *const c_char, klen: usize);
    pub(super) fn rocksdb_iter_valid(it: *const Iterator) -> c_uchar;
    pub(super) fn rocksdb_iter_next(it: *mut Iterator);
    pub(super) fn rocksdb_iter_key(it: *const Iterator, klen: *mut usize) -> *const c_char;
    pub(super) fn rocksdb_iter_value(it: *const Iterator, vlen: *mut usize) -> *const c_char;
    pub(super) fn rocksdb_iter_get_error(it: *const Iterator, errptr: *mut *mut c_char);
}

/// Turns a RocksDB `errptr` into a result, freeing the message.
pub(super) fn check(err: *mut c_char, what: impl std::fmt::Display) -> CliResult<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null errptr is a NUL-terminated string RocksDB
    // allocated (strdup); it is read once here, then freed once below.
    let msg = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `err` came from RocksDB, is not used after this.
    unsafe { rocksdb_free(err.cast()) };
    Err(CliError(format!("rocksdb: {what}: {msg}")))
}

/// Calls `free` on a RocksDB object when dropped (temporary objects on
/// every path, including errors).
pub(super) struct Owned<T>(pub(super) *mut T, pub(super) unsafe extern "C" fn(*mut T));

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from the matching *_create and is
            // destroyed exactly once, here.
            unsafe { (self.1)(self.0) };
        }
    }
}

/// RocksDB behind [`PeerEngine`].
pub struct RocksDb {
    db: *mut Db,
    options: *mut Options,
    cache: *mut Cache,
    read: *mut ReadOptions,
    write: *mut WriteOptions,
    dir: PathBuf,
    direct_io: bool,
}

// SAFETY: `rocksdb_t` is thread-safe (RocksDB's DB methods may be called
// concurrently without external synchronisation); the option objects are
// only read after open and freed in Drop, which has `&mut self`.
unsafe impl Send for RocksDb {}
// SAFETY: as for Send.
unsafe impl Sync for RocksDb {}

impl RocksDb {
    /// Opens or creates the database under `cfg.dir/rocksdb/`.
    pub fn open(cfg: &PeerConfig) -> CliResult<Self> {
        let dir = engine_dir(cfg, "rocksdb")?;
        let cpath = super::c_path(&dir)?;
        let (options, cache) = if cfg.memtables_in_budget {
            let (cache_bytes, memtable_bytes) = budget_split(cfg.cache_bytes);
            let (options, cache) = base_options(cfg, cache_bytes);
            // SAFETY: setters on the options object created just above.
            unsafe {
                rocksdb_options_set_write_buffer_size(options, memtable_bytes);
                rocksdb_options_set_max_write_buffer_number(options, 2);
            }
            (options, cache)
        } else {
            base_options(cfg, cfg.cache_bytes)
        };
        let mut err = ptr::null_mut();
        // SAFETY: `options` is valid, `cpath` is NUL-terminated and lives
        // across the call; `err` is a valid out-pointer.
        let db = unsafe { rocksdb_open(options, cpath.as_ptr(), &mut err) };
        // SAFETY: the read/write options are plain objects created here.
        let (read, write) = unsafe {
            let read = rocksdb_readoptions_create();
            rocksdb_readoptions_set_fill_cache(read, 1);
            let write = rocksdb_writeoptions_create();
            rocksdb_writeoptions_set_sync(
                write,
                c_uchar::from(cfg.durability == dana::Durability::Sync),
            );
            // No log where dana writes none (module doc, fairness rules).
            rocksdb_writeoptions_disable_WAL(
                write,
                c_int::from(cfg.durability == dana::Durability::Off),
            );
            (read, write)
        };
        // From here on Drop frees everything (db may be null).
        let me = RocksDb {
            db,
            options,
            cache,
            read,
            write,
            dir,
            direct_io: cfg.direct_io,
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

/// A memory budget split into (block cache, memtable) bytes: memtables
/// of an eighth each, at most two of them, and the rest block cache, so
/// cache plus memtables stay within the budget.
pub(super) fn budget_split(budget: usize) -> (usize, usize) {
    let memtable_bytes = (budget / 8).max(1 << 20);
    let cache_bytes = budget.saturating_sub(2 * memtable_bytes).max(1 << 20);
    (cache_bytes, memtable_bytes)
}

/// The options both RocksDB bindings share (see the module doc), with an
/// LRU block cache of `cache_bytes`. The caller owns both objects: it
/// destroys the options, then, after closing the database, the cache.
pub(super) fn base_options(cfg: &PeerConfig, cache_bytes: usize) -> (*mut Options, *mut Cache) {
    let threads = cfg.threads.clamp(1, 1024) as c_int;
    let direct = c_uchar::from(cfg.direct_io);
    // The filter policy is handed to (owned by) the table options, the
    // table options are copied into `options` and destroyed by the
    // guard, the cache is shared (refcounted) and destroyed by the owner.
    // SAFETY: plain constructors and setters on objects created here.
    unsafe {
        let options = rocksdb_options_create();
        let cache = rocksdb_cache_create_lru(cache_bytes.max(1 << 20));
        let table = Owned(
            rocksdb_block_based_options_create(),
            rocksdb_block_based_options_destroy,
        );
        rocksdb_block_based_options_set_block_size(table.0, 4096);
        rocksdb_block_based_options_set_block_cache(table.0, cache);
        rocksdb_block_based_options_set_cache_index_and_filter_blocks(table.0, 1);
        rocksdb_block_based_options_set_filter_policy(
            table.0,
            rocksdb_filterpolicy_create_bloom(10.0),
        );
        rocksdb_options_set_block_based_table_factory(options, table.0);
        rocksdb_options_set_create_if_missing(options, 1);
        rocksdb_options_increase_parallelism(options, threads);
        rocksdb_options_set_compression(options, 0);
        rocksdb_options_set_max_open_files(options, -1);
        rocksdb_options_set_use_direct_reads(options, direct);
        rocksdb_options_set_use_direct_io_for_flush_and_compaction(options, direct);
        (options, cache)
    }
}

impl Drop for RocksDb {
    fn drop(&mut self) {
        // SAFETY: every pointer was created in `open` and is freed exactly
        // once; the database is closed before the cache and options it
        // uses. `&mut self` means no other thread is inside a call.
        unsafe {
            if !self.db.is_null() {
                rocksdb_close(self.db);
            }
            rocksdb_readoptions_destroy(self.read);
            rocksdb_writeoptions_destroy(self.write);
            rocksdb_options_destroy(self.options);
            rocksdb_cache_destroy(self.cache);
        }
    }
}

impl PeerEngine for RocksDb {
    fn name(&self) -> &'static str {
        "rocksdb"
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
        // SAFETY: constructors; the guards destroy them on every path.
        let (wo, batch) = unsafe {
            let wo = Owned(rocksdb_writeoptions_create(), rocksdb_writeoptions_destroy);
            rocksdb_writeoptions_disable_WAL(wo.0, 1);
            (
                wo,
                Owned(rocksdb_writebatch_create(), rocksdb_writebatch_destroy),
            )
        };
        let mut buf = vec![0u8; value_size];
        for i in 0..records {
            let k = keys.number(i);
            value(k, &mut buf);
            let key = (keys.key)(k);
            // SAFETY: the batch is live; key and value are valid for their
            // lengths and copied into the batch.
            unsafe {
                rocksdb_writebatch_put(
                    batch.0,
                    key.as_ptr().cast(),
                    8,
                    buf.as_ptr().cast(),
                    buf.len(),
                )
            };
            if (i + 1) % LOAD_BATCH == 0 || i + 1 == records {
                let mut err = ptr::null_mut();
                // SAFETY: db, options and batch are live; err is an out-pointer.
                unsafe {
                    rocksdb_write(self.db, wo.0, batch.0, &mut err);
                    rocksdb_writebatch_clear(batch.0);
                }
                check(err, "loading")?;
                progress(i + 1);
            }
        }
        let mut err = ptr::null_mut();
        // SAFETY: flush options created and destroyed here; db is live.
        unsafe {
            let fo = Owned(rocksdb_flushoptions_create(), rocksdb_flushoptions_destroy);
            rocksdb_flushoptions_set_wait(fo.0, 1);
            rocksdb_flush(self.db, fo.0, &mut err);
        }
        check(err, "flushing the load")?;
        // SAFETY: null start/limit means the whole key range; blocks until
        // the manual compaction is done.
        unsafe { rocksdb_compact_range(self.db, ptr::null(), 0, ptr::null(), 0) };
        write_marker(&self.dir, records, value_size, keys)
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> CliResult<bool> {
        let mut err = ptr::null_mut();
        // SAFETY: db and read options are live; key is valid for its length.
        let slice = unsafe {
            Owned(
                rocksdb_get_pinned(self.db, self.read, key.as_ptr().cast(), key.len(), &mut err),
                rocksdb_pinnableslice_destroy,
            )
        };
        check(err, "get")?;
        if slice.0.is_null() {
            return Ok(false);
        }
        let mut len = 0usize;
        // SAFETY: the slice is live until the guard drops; the value
        // pointer is valid for `len` bytes while the slice lives.
        let v = unsafe {
            let p = rocksdb_pinnableslice_value(slice.0, &mut len);
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        };
        out.clear();
        out.extend_from_slice(v);
        Ok(true)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> CliResult<()> {
        let mut err = ptr::null_mut();
        // SAFETY: db and write options are live; key and value are valid
        // for their lengths and copied by RocksDB.
        unsafe {
            rocksdb_put(
                self.db,
                self.write,
                key.as_ptr().cast(),
                key.len(),
                value.as_ptr().cast(),
                value.len(),
                &mut err,
            )
        };
        check(err, "put")
    }

    fn scan(&self, start: &[u8], n: usize) -> CliResult<usize> {
        // SAFETY: db and read options are live; the guard destroys the
        // iterator on every path.
        let it = unsafe {
            Owned(
                rocksdb_create_iterator(self.db, self.read),
                rocksdb_iter_destroy,
            )
        };
        let mut read = 0usize;
        let mut bytes = 0usize;
        // SAFETY: the iterator is live; key/value are read only while it
        // is valid and not kept past the next move.
        unsafe {
            rocksdb_iter_seek(it.0, start.as_ptr().cast(), start.len());
            while read < n && rocksdb_iter_valid(it.0) != 0 {
                let (mut kl, mut vl) = (0usize, 0usize);
                let k = rocksdb_iter_key(it.0, &mut kl);
                let v = rocksdb_iter_value(it.0, &mut vl);
                bytes += std::hint::black_box(kl + vl + (k as usize & 1) + (v as usize & 1));
                read += 1;
                rocksdb_iter_next(it.0);
            }
        }
        std::hint::black_box(bytes);
        let mut err = ptr::null_mut();
        // SAFETY: the iterator is live; err is an out-pointer.
        unsafe { rocksdb_iter_get_error(it.0, &mut err) };
        check(err, "scan")?;
        Ok(read)
    }

    fn caveat(&self) -> Option<String> {
        (!self.direct_io).then(|| {
            "RocksDB without direct I/O: reads also hit the OS page cache, \
             beyond the cache budget"
                .to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use dana::Durability;

    #[test]
    fn peers_rocksdb_conformance() {
        super::super::tests::conformance("rocksdb", Durability::Off);
    }

    #[test]
    fn peers_rocksdb_conformance_with_an_unsynced_log() {
        super::super::tests::conformance("rocksdb", Durability::Async);
    }

    #[test]
    fn peers_rocksdb_conformance_with_synced_writes() {
        super::super::tests::conformance("rocksdb", Durability::Sync);
    }
}
