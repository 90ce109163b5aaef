//! Peer engines: RocksDB, LMDB and WiredTiger behind one small trait,
//! [`PeerEngine`], so the lookup and YCSB benchmarks can run them in the
//! same invocation as dana and print the numbers side by side.
//!
//! This module owns the trait, the engine registry ([`available`],
//! [`open`]), the "already loaded" marker that lets a run reuse a database
//! loaded earlier, and a small per-thread handle pool. Each engine is a
//! hand-written binding to the engine's C API, linked against the system
//! library from Debian's packages (`librocksdb-dev` 7.8.3,
//! `liblmdb-dev` 0.9.24, `libwiredtiger-dev` 3.2.1), and compiled only
//! with the cargo feature of the same name (`rocksdb`, `lmdb`,
//! `wiredtiger`; none by default). `unsafe` lives in the binding files
//! only (`rocksdb.rs`, `lmdb.rs`, `wiredtiger.rs`, and the transactional
//! `rocksdb_txn.rs`, `wiredtiger_txn.rs` that TPC-C uses through
//! [`txn::TxPeer`]).
//!
//! # Fairness rules
//!
//! Every engine gets the same data and the same budget:
//!
//! - Keys are `i as u64` big-endian (8 bytes), values are `value_size`
//!   bytes made by the benchmark's value function; records `0..records`
//!   are loaded once, in ascending key order, by one thread, in large
//!   batches; the load ends with the database settled (RocksDB flushed and
//!   fully compacted, WiredTiger checkpointed, LMDB synced), so the
//!   measured phase reads a normal, quiescent database.
//! - Cache budget = [`PeerConfig::cache_bytes`]: RocksDB's LRU block cache
//!   (index and filter blocks are charged to it too), WiredTiger's
//!   `cache_size`. LMDB has no cache of its own (it reads through the OS
//!   page cache): see its caveat.
//! - No compression; 4 KiB blocks/pages (RocksDB `block_size`, WiredTiger
//!   allocation and page sizes, LMDB's page = the OS page).
//! - Direct I/O for data reads where the engine has it (RocksDB
//!   `use_direct_reads` and direct flush/compaction, WiredTiger
//!   `direct_io=[data]`), when [`PeerConfig::direct_io`] is set.
//! - Durability follows [`PeerConfig::durability`], dana's three modes:
//!   - `Off` (dana writes no log): no engine logs a write; RocksDB's puts
//!     skip its WAL (`WriteOptions::disableWAL`; its memtables flush at
//!     close), WiredTiger runs without a log (updates durable at
//!     checkpoints), LMDB runs with `MDB_NOSYNC` (it has no log).
//!   - `Async` (dana's log written, not synced per commit): RocksDB writes
//!     its WAL unsynced, WiredTiger logs with `transaction_sync` off,
//!     LMDB runs with `MDB_NOSYNC` (no log to write: its caveat).
//!   - `Sync` (dana with its log synced): every write returns after the
//!     engine's log is on the device, grouped with concurrent writes
//!     where the engine groups them: RocksDB `WriteOptions::sync` (its
//!     writers join one WAL sync), WiredTiger with its log enabled and
//!     `transaction_sync=(enabled=true,method=fsync)` (each auto-committed
//!     write syncs; concurrent commits share the flush), LMDB without
//!     `MDB_NOSYNC` (one writer at a time, each commit synced).
//!
//!   Before, one flag mapped `Off` and `Async` alike: RocksDB logged where
//!   dana did not, WiredTiger did not log where dana did (a review's
//!   finding). The loads skip every log.
//! - Reads are callable from many threads at once: RocksDB's handle is
//!   thread-safe; WiredTiger sessions and LMDB read transactions are
//!   single-threaded, so each thread borrows its own from a pool.
//!
//! Where an engine falls short of these rules, [`PeerEngine::caveat`]
//! says so and the benchmark prints it next to the engine's numbers.
//!
//! # Reuse
//!
//! Each engine keeps its files under `dir/<engine name>/`. After a
//! complete load it writes a marker file with `records` and `value_size`;
//! a later [`PeerEngine::load`] with the same parameters returns at once.
//! A directory without a marker holds an interrupted load and is wiped
//! when the engine opens; a marker with other parameters is an error
//! (remove the directory to reload).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::{CliError, CliResult, Context};

#[cfg(feature = "lmdb")]
#[allow(unsafe_code)]
mod lmdb;
#[cfg(feature = "lmdb")]
#[allow(unsafe_code)]
mod lmdb_txn;
#[cfg(feature = "rocksdb")]
#[allow(unsafe_code)]
mod rocksdb;
#[cfg(feature = "rocksdb")]
#[allow(unsafe_code)]
mod rocksdb_txn;
pub mod txn;
#[cfg(feature = "wiredtiger")]
#[allow(unsafe_code)]
mod wiredtiger;
#[cfg(feature = "wiredtiger")]
#[allow(unsafe_code)]
mod wiredtiger_txn;

/// The keys a load writes: the key of each key number, and the order of
/// the key numbers that is ascending key order (the engines' bulk loaders
/// need sorted input, and dana's loaders fill leaves best that way). Its
/// scheme is recorded in the load marker, so a load of other keys is
/// never reused.
#[derive(Clone, Copy)]
pub struct LoadKeys<'a> {
    /// Name recorded in the marker (`plain`, `hashed`).
    pub scheme: &'static str,
    /// The 8-byte key of key number `k`.
    #[allow(dead_code)] // unused without engine features
    pub key: fn(u64) -> [u8; 8],
    /// Key numbers `0..records` in ascending order of their keys; `None`
    /// when that is `0..records` itself.
    pub sorted: Option<&'a [u64]>,
}

impl LoadKeys<'static> {
    /// Key number `k`'s key is `k` big-endian: number order is key order.
    pub const PLAIN: LoadKeys<'static> = LoadKeys {
        scheme: "plain",
        key: u64::to_be_bytes,
        sorted: None,
    };
}

impl LoadKeys<'_> {
    /// The key number of the `i`-th key in ascending key order.
    #[allow(dead_code)] // unused without engine features
    pub fn number(&self, i: u64) -> u64 {
        self.sorted.map_or(i, |s| s[i as usize])
    }
}

/// A key-value engine the benchmarks compare dana with.
pub trait PeerEngine: Send + Sync {
    fn name(&self) -> &'static str;
    /// Loads key numbers 0..records, keyed as `keys` says (8 bytes) and
    /// written in ascending key order, with `value_size`-byte values made
    /// by `value(k, &mut buf)` for key number `k`; calls progress(done)
    /// now and then. Bulk-load-friendly (batches, ascending order) but the
    /// result is a normal, queryable database. Returns at once if the
    /// directory already holds this load (see the module doc).
    fn load(
        &self,
        records: u64,
        value_size: usize,
        keys: LoadKeys<'_>,
        value: &(dyn Fn(u64, &mut [u8]) + Sync),
        progress: &(dyn Fn(u64) + Sync),
    ) -> CliResult<()>;
    /// Point lookup; fills `out` with the value; false if absent. Callable
    /// concurrently from many threads.
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> CliResult<bool>;
    /// Upsert (for YCSB updates/inserts).
    fn put(&self, key: &[u8], value: &[u8]) -> CliResult<()>;
    /// Forward scan of up to n entries from key (YCSB E); returns how many
    /// were read.
    fn scan(&self, start: &[u8], n: usize) -> CliResult<usize>;
    /// A note printed next to this engine's numbers when they are not
    /// comparable; None when the engine follows the fairness rules.
    fn caveat(&self) -> Option<String>;
}

/// How to open a peer engine.
#[derive(Debug, Clone)]
// Without any engine feature nothing reads the fields.
#[cfg_attr(
    not(any(feature = "rocksdb", feature = "lmdb", feature = "wiredtiger")),
    allow(dead_code)
)]
pub struct PeerConfig {
    /// Parent directory; the engine uses `dir/<engine name>/`.
    pub dir: PathBuf,
    /// The engine's cache budget in bytes.
    pub cache_bytes: usize,
    /// Threads the benchmark will use (sizes background work).
    pub threads: usize,
    /// Direct I/O for data reads where the engine has it.
    pub direct_io: bool,
    /// What a write costs the engine's log, as dana's `Durability` does
    /// (module doc, fairness rules). Read by the [`PeerEngine`] bindings;
    /// the transactional ones ([`txn`]) take durability per commit
    /// instead.
    pub durability: dana::Durability,
    /// RocksDB: the budget covers its memtables too (a block cache of
    /// three quarters, at most two memtables of an eighth each), as a
    /// benchmark that writes needs for a fair budget; false: the whole
    /// budget is block cache (read-only benchmarks). The other engines'
    /// caches hold dirty pages already.
    pub memtables_in_budget: bool,
}

/// Every engine this module knows, compiled in or not.
pub const ENGINES: [&str; 3] = ["rocksdb", "lmdb", "wiredtiger"];

/// The engines compiled into this binary.
pub fn available() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "rocksdb") {
        v.push("rocksdb");
    }
    if cfg!(feature = "lmdb") {
        v.push("lmdb");
    }
    if cfg!(feature = "wiredtiger") {
        v.push("wiredtiger");
    }
    v
}

/// Opens (creating if needed) engine `name` under `cfg.dir/<name>/`.
pub fn open(name: &str, cfg: &PeerConfig) -> CliResult<Box<dyn PeerEngine>> {
    match name {
        "rocksdb" => {
            #[cfg(feature = "rocksdb")]
            return Ok(Box::new(rocksdb::RocksDb::open(cfg)?));
            #[cfg(not(feature = "rocksdb"))]
            return Err(not_compiled(name, cfg));
        }
        "lmdb" => {
            #[cfg(feature = "lmdb")]
            return Ok(Box::new(lmdb::Lmdb::open(cfg)?));
            #[cfg(not(feature = "lmdb"))]
            return Err(not_compiled(name, cfg));
        }
        "wiredtiger" => {
            #[cfg(feature = "wiredtiger")]
            return Ok(Box::new(wiredtiger::WiredTiger::open(cfg)?));
            #[cfg(not(feature = "wiredtiger"))]
            return Err(not_compiled(name, cfg));
        }
        _ => Err(CliError(format!(
            "unknown engine {name:?}: known engines are {}",
            ENGINES.join(", ")
        ))),
    }
}

/// Checks `--engines` before anything runs: each name other than `dana`
/// a known engine compiled into this binary. (Checked when a peer
/// opened, a bad name failed after minutes of dana's runs, whose results
/// were lost; a review's finding.)
pub fn check_engines(names: &[String]) -> CliResult<()> {
    let have = available();
    for name in names.iter().filter(|n| n.as_str() != "dana") {
        if !ENGINES.contains(&name.as_str()) {
            return Err(CliError(format!(
                "unknown engine {name:?}: known engines are dana, {}",
                ENGINES.join(", ")
            )));
        }
        if !have.contains(&name.as_str()) {
            return Err(missing(name));
        }
    }
    Ok(())
}

#[allow(dead_code)] // unused when every engine is compiled in
fn not_compiled(name: &str, _cfg: &PeerConfig) -> CliError {
    missing(name)
}

/// The error for an engine not compiled into this binary.
fn missing(name: &str) -> CliError {
    let have = available();
    let have = if have.is_empty() {
        "none".to_string()
    } else {
        have.join(", ")
    };
    CliError(format!(
        "engine {name} not compiled in: rebuild with --features {name} (compiled in: {have})"
    ))
}

/// `dir` as a C string for an engine's open call.
#[allow(dead_code)] // unused without engine features
fn c_path(dir: &Path) -> CliResult<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| CliError(format!("{}: path contains NUL", dir.display())))
}

/// The marker file written after a complete load.
const MARKER: &str = "dana-peer-loaded";

/// Creates `dir/<name>/` for an engine and returns it. A directory without
/// a marker holds an interrupted load: it is wiped.
#[allow(dead_code)] // unused without engine features
fn engine_dir(cfg: &PeerConfig, name: &str) -> CliResult<PathBuf> {
    let dir = cfg.dir.join(name);
    if dir.exists() && read_marker(&dir)?.is_none() {
        std::fs::remove_dir_all(&dir).context(format_args!(
            "removing the partial load in {}",
            dir.display()
        ))?;
    }
    std::fs::create_dir_all(&dir).context(format_args!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Removes engine `name`'s files under `cfg.dir` (the next open loads it
/// afresh).
pub fn wipe(name: &str, cfg: &PeerConfig) -> CliResult<()> {
    let dir = cfg.dir.join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CliError(format!("removing {}: {e}", dir.display()))),
    }
}

/// The `(records, value_size, key scheme)` of the marker in `dir`, if
/// any (a marker without a scheme predates it: plain keys).
fn read_marker(dir: &Path) -> CliResult<Option<(u64, usize, String)>> {
    let path = dir.join(MARKER);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CliError(format!("reading {}: {e}", path.display()))),
    };
    let mut records = None;
    let mut value_size = None;
    let mut scheme = LoadKeys::PLAIN.scheme.to_string();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("records=") {
            records = v.trim().parse::<u64>().ok();
        } else if let Some(v) = line.strip_prefix("value_size=") {
            value_size = v.trim().parse::<usize>().ok();
        } else if let Some(v) = line.strip_prefix("keys=") {
            scheme = v.trim().to_string();
        }
    }
    match (records, value_size) {
        (Some(r), Some(v)) => Ok(Some((r, v, scheme))),
        _ => Err(CliError(format!(
            "{}: malformed marker (remove the directory to reload)",
            path.display()
        ))),
    }
}

/// True if `dir` already holds exactly this load; an error if it holds
/// another one.
#[allow(dead_code)] // unused without engine features
fn already_loaded(dir: &Path, records: u64, value_size: usize, keys: LoadKeys) -> CliResult<bool> {
    match read_marker(dir)? {
        None => Ok(false),
        Some((r, v, k)) if r == records && v == value_size && k == keys.scheme => Ok(true),
        Some((r, v, k)) => Err(CliError(format!(
            "{} holds a load of {r} records of {v} bytes with {k} keys, not {records} \
             of {value_size} with {} keys: remove the directory to reload",
            dir.display(),
            keys.scheme
        ))),
    }
}

/// Records a complete load (written last, atomically).
#[allow(dead_code)] // unused without engine features
fn write_marker(dir: &Path, records: u64, value_size: usize, keys: LoadKeys) -> CliResult<()> {
    let tmp = dir.join(format!("{MARKER}.tmp"));
    let path = dir.join(MARKER);
    std::fs::write(
        &tmp,
        format!(
            "records={records}\nvalue_size={value_size}\nkeys={}\n",
            keys.scheme
        ),
    )
    .context(format_args!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).context(format_args!("renaming to {}", path.display()))
}

/// Records per load batch (write batch, transaction) and between progress
/// calls.
#[allow(dead_code)] // unused without engine features
const LOAD_BATCH: u64 = 16 * 1024;

/// A pool of single-threaded handles (WiredTiger sessions, LMDB read
/// transactions): a thread takes one, uses it alone, and gives it back.
/// Sharded by thread so that threads rarely meet on a lock; each shard
/// holds the handles its threads made, so a steady set of threads reuses
/// a steady set of handles.
#[allow(dead_code)] // unused without engine features
struct Pool<T> {
    shards: Vec<Mutex<Vec<T>>>,
}

#[allow(dead_code)] // unused without engine features
impl<T> Pool<T> {
    const SHARDS: usize = 64;

    fn new() -> Self {
        Pool {
            shards: (0..Self::SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// This thread's shard.
    fn shard(&self) -> &Mutex<Vec<T>> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        let slot = SLOT.with(|s| *s);
        &self.shards[slot % self.shards.len()]
    }

    /// A handle from this thread's shard, if one is free.
    fn take(&self) -> Option<T> {
        self.shard().lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Gives a handle back to this thread's shard.
    fn give(&self, t: T) {
        self.shard()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
    }

    /// Every free handle (to close them).
    fn drain(&self) -> Vec<T> {
        let mut all = Vec::new();
        for s in &self.shards {
            all.append(&mut s.lock().unwrap_or_else(|e| e.into_inner()));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> PeerConfig {
        PeerConfig {
            dir: dir.to_path_buf(),
            cache_bytes: 8 << 20,
            threads: 2,
            direct_io: true,
            durability: dana::Durability::Off,
            memtables_in_budget: true,
        }
    }

    #[test]
    fn peers_unknown_engine_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = open("leveldb", &cfg(dir.path())).err().unwrap();
        assert!(e.to_string().contains("unknown engine"), "{e}");
    }

    #[cfg(not(feature = "rocksdb"))]
    #[test]
    fn peers_rocksdb_without_the_feature_says_how_to_get_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = open("rocksdb", &cfg(dir.path())).err().unwrap();
        assert!(
            e.to_string()
                .starts_with("engine rocksdb not compiled in: rebuild with --features rocksdb"),
            "{e}"
        );
        assert!(!available().contains(&"rocksdb"));
    }

    #[test]
    fn peers_marker_round_trip_and_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let plain = LoadKeys::PLAIN;
        assert!(!already_loaded(dir.path(), 10, 100, plain).unwrap());
        write_marker(dir.path(), 10, 100, plain).unwrap();
        assert!(already_loaded(dir.path(), 10, 100, plain).unwrap());
        let e = already_loaded(dir.path(), 11, 100, plain).unwrap_err();
        assert!(e.to_string().contains("remove the directory"), "{e}");
        // Other keys are another load, never reused.
        let other = LoadKeys {
            scheme: "hashed",
            ..plain
        };
        let e = already_loaded(dir.path(), 10, 100, other).unwrap_err();
        assert!(e.to_string().contains("with plain keys"), "{e}");
        // A marker written before schemes were recorded holds plain keys.
        std::fs::write(dir.path().join(MARKER), "records=10\nvalue_size=100\n").unwrap();
        assert!(already_loaded(dir.path(), 10, 100, plain).unwrap());
    }

    #[test]
    fn peers_engine_dir_wipes_a_partial_load() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let d = engine_dir(&c, "x").unwrap();
        std::fs::write(d.join("junk"), b"half").unwrap();
        let d = engine_dir(&c, "x").unwrap();
        assert!(!d.join("junk").exists());
        std::fs::write(d.join("junk"), b"kept").unwrap();
        write_marker(&d, 1, 1, LoadKeys::PLAIN).unwrap();
        let d = engine_dir(&c, "x").unwrap();
        assert!(d.join("junk").exists());
    }

    /// The shared conformance test every engine runs (see each engine's
    /// tests), at a `durability`: load 20k records, get present/absent
    /// keys byte for byte, put then get, scan, reopen reuses the marker
    /// and keeps the puts. WiredTiger must have written its log exactly
    /// when the durability has one (`Async`, `Sync`).
    #[allow(dead_code)] // unused without engine features
    pub(super) fn conformance(name: &str, durability: dana::Durability) {
        const N: u64 = 20_000;
        const VS: usize = 100;
        fn value(i: u64, buf: &mut [u8]) {
            for (j, b) in buf.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(j as u8);
            }
        }
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let c = PeerConfig {
            durability,
            ..cfg(dir.path())
        };
        {
            let e = open(name, &c).unwrap();
            assert_eq!(e.name(), name);
            let last = AtomicUsize::new(0);
            e.load(N, VS, LoadKeys::PLAIN, &value, &|d| {
                last.store(d as usize, Ordering::Relaxed)
            })
            .unwrap();
            assert_eq!(last.load(Ordering::Relaxed) as u64, N);
            let mut out = Vec::new();
            let mut want = vec![0u8; VS];
            for i in [0, 1, 77, 12_345, N - 1] {
                assert!(e.get(&i.to_be_bytes(), &mut out).unwrap(), "key {i}");
                value(i, &mut want);
                assert_eq!(out, want, "key {i}");
            }
            for i in [N, N + 1, u64::MAX] {
                assert!(!e.get(&i.to_be_bytes(), &mut out).unwrap(), "key {i}");
            }
            assert!(!e.get(b"abc", &mut out).unwrap());
            // Upsert: overwrite one key, insert a new one.
            e.put(&5u64.to_be_bytes(), b"five").unwrap();
            assert!(e.get(&5u64.to_be_bytes(), &mut out).unwrap());
            assert_eq!(out, b"five");
            e.put(&(N + 10).to_be_bytes(), b"new").unwrap();
            assert!(e.get(&(N + 10).to_be_bytes(), &mut out).unwrap());
            assert_eq!(out, b"new");
            assert_eq!(e.scan(&100u64.to_be_bytes(), 10).unwrap(), 10);
            assert_eq!(e.scan(&(N - 3).to_be_bytes(), 10).unwrap(), 4);
            assert_eq!(e.scan(&(N + 11).to_be_bytes(), 10).unwrap(), 0);
            // Concurrent readers.
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let e = &e;
                    s.spawn(move || {
                        let mut out = Vec::new();
                        let mut want = vec![0u8; VS];
                        for i in (t..N).step_by(97) {
                            if i == 5 {
                                continue;
                            }
                            assert!(e.get(&i.to_be_bytes(), &mut out).unwrap());
                            value(i, &mut want);
                            assert_eq!(out, want);
                        }
                    });
                }
            });
            assert!(e.caveat().is_none() || name == "lmdb");
            if name == "rocksdb" {
                // The two puts above went to the WAL exactly when dana's
                // durability writes a log (the load skips it).
                let wal: u64 = std::fs::read_dir(dir.path().join(name))
                    .unwrap()
                    .map(|f| f.unwrap())
                    .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
                    .map(|f| f.metadata().unwrap().len())
                    .sum();
                assert_eq!(
                    wal > 0,
                    durability != dana::Durability::Off,
                    "RocksDB WAL bytes: {wal}"
                );
            }
            if name == "wiredtiger" {
                let logs = std::fs::read_dir(dir.path().join(name))
                    .unwrap()
                    .filter(|f| {
                        let f = f.as_ref().unwrap().file_name();
                        f.to_string_lossy().starts_with("WiredTigerLog.")
                    })
                    .count();
                assert_eq!(
                    logs > 0,
                    durability != dana::Durability::Off,
                    "WiredTiger log files: {logs}"
                );
            }
        }
        // Reopen: the marker makes load a no-op, the data is still there.
        let e = open(name, &c).unwrap();
        let calls = AtomicUsize::new(0);
        e.load(
            N,
            VS,
            LoadKeys::PLAIN,
            &|_, _| {
                calls.fetch_add(1, Ordering::Relaxed);
            },
            &|_| {},
        )
        .unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 0, "load was not reused");
        let mut out = Vec::new();
        let mut want = vec![0u8; VS];
        value(9_999, &mut want);
        assert!(e.get(&9_999u64.to_be_bytes(), &mut out).unwrap());
        assert_eq!(out, want);
        assert!(e.get(&5u64.to_be_bytes(), &mut out).unwrap());
        assert_eq!(out, b"five");
        assert!(e.get(&(N + 10).to_be_bytes(), &mut out).unwrap());
        assert_eq!(out, b"new");
        assert!(e.load(N + 1, VS, LoadKeys::PLAIN, &value, &|_| {}).is_err());
    }
}
