//! `dana bench ycsb`: the YCSB core workloads A-F on dana, on data many
//! times the buffer pool.
//!
//! Owns: the command (arguments, load, run, report). The generators live
//! in [`gen`], the engine-independent operation mixes and key/value
//! layout in [`workload`]. Never: counts a read of a wrong or missing
//! record, a failed write or an empty scan as a success.
//!
//! Data: `--records` records, 8-byte keys, `--value-size`-byte values
//! (`--fields-10x100`: YCSB's 10 fields x 100 bytes, stored as one
//! 1000-byte value). Keys are an invertible hash of the key number
//! (YCSB's default `insertorder=hashed`), so the inserts of D and E land
//! all over the tree. Every engine, dana and the peers, is loaded with
//! the same keys in ascending key order (the peers' bulk loaders need
//! sorted input; a B+tree loaded that way fills its leaves, ~92%, where
//! a load in hashed order leaves them ~70% full). dana's load goes
//! through the async API from one task (one ascending stream: ascending
//! ranges in parallel tasks fill leaves to half, ARCHITECTURE.md), into a
//! database without a log (a run with a log formats one when it opens),
//! and is reused by later runs (a marker file records the loaded and the
//! current record count); a log-off run reloads data that has a log,
//! since such a database keeps using it.
//!
//! Runs change the data (updates, RMWs, inserts), as in YCSB; a later run
//! reuses the changed database, which YCSB allows. After a workload that
//! inserts, the marker holds the new record count (all key numbers
//! `0..count` present); if an insert failed or the run was interrupted,
//! the marker is gone and the next run reloads. `all` follows YCSB's
//! recommended order: load, A, B, C, F, D, then a fresh load for E.

pub mod gen;
pub mod peer;
pub mod workload;

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dana::buffer::records::RecordCacheStats;
use dana::stats::{Histogram, HistogramSnapshot};
use dana::Tree;
use dana::{Db, Error, Options};
use serde::Serialize;

use super::diskstats::Disk;
use super::timeline::write_timeline;
use super::{
    bar, clear_dana_files, data_files, sample_with, thousands, Latency, Measured, RunState,
};
use crate::report::Machine;
use crate::{CliError, CliResult, Context};
use workload::{
    fill_value, key_of, modify, numbers_in_key_order, value_ok, Mix, Op, OpKind, Shared, Workload,
};

const TREE: &str = "ycsb";
const PAGE: usize = 4096;
const KEY_BYTES: usize = 8;

/// `--workload`: one core workload or all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadChoice {
    /// 50% read / 50% update, zipfian.
    A,
    /// 95% read / 5% update, zipfian.
    B,
    /// 100% read, zipfian.
    C,
    /// 95% read / 5% insert, latest.
    D,
    /// 95% scan (1..100 records) / 5% insert, zipfian.
    E,
    /// 50% read / 50% read-modify-write, zipfian.
    F,
    /// A, B, C, F, D on one load, then E on a fresh load.
    All,
}

impl WorkloadChoice {
    fn workloads(self) -> Vec<Workload> {
        match self {
            WorkloadChoice::A => vec![Workload::A],
            WorkloadChoice::B => vec![Workload::B],
            WorkloadChoice::C => vec![Workload::C],
            WorkloadChoice::D => vec![Workload::D],
            WorkloadChoice::E => vec![Workload::E],
            WorkloadChoice::F => vec![Workload::F],
            WorkloadChoice::All => Workload::ALL_IN_ORDER.to_vec(),
        }
    }
}

/// Arguments of `dana bench ycsb`.
#[derive(Args, Debug, Clone)]
pub struct YcsbArgs {
    /// Which core workload (a-f), or `all`.
    #[arg(long, value_enum)]
    pub workload: WorkloadChoice,
    /// Directory of the database (created and loaded on first use).
    #[arg(long, default_value = "./dana-data/ycsb")]
    pub path: PathBuf,
    /// Engines: dana and peers (rocksdb, wiredtiger, lmdb; each needs its
    /// cargo feature). Peers get dana's cache budget and keys, loaded in
    /// the same order, and run at each of `--peer-threads` (see
    /// `ycsb/peer.rs`).
    #[arg(long, value_delimiter = ',', default_value = "dana")]
    pub engines: Vec<String>,
    /// Client thread counts each peer engine runs every workload at (one
    /// synchronous operation at a time per thread); a ratio uses the
    /// peer's best count in the invocation.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32,128")]
    pub peer_threads: Vec<usize>,
    /// Records to load (8-byte keys). The default loads in about a minute
    /// on 2 workers.
    #[arg(long, default_value_t = 10_000_000)]
    pub records: u64,
    /// Value size in bytes (at least 8).
    #[arg(long, default_value_t = 120)]
    pub value_size: usize,
    /// YCSB's record layout: 10 fields x 100 bytes, stored as one
    /// 1000-byte value (overrides --value-size).
    #[arg(long = "fields-10x100")]
    pub fields_10x100: bool,
    /// dana's memory (buffer pool and record cache) as a fraction of the
    /// data; the peers get the same bytes.
    #[arg(long, default_value_t = 0.1)]
    pub pool_fraction: f64,
    /// Share of that memory given to dana's cache of hot records
    /// (`Options::record_cache_bytes`); the pool gets the rest. 0: no
    /// record cache, the whole budget is the pool.
    #[arg(long, default_value_t = 0.0)]
    pub record_cache_share: f64,
    /// Where dana's page writes land (`Options::write_mode`; set when
    /// the data is loaded, which a change of mode forces): `in-place`,
    /// `out-of-place` (append-only segments in a file of fixed capacity,
    /// twice the load's estimate) or `out-of-place-lz4` (the same, each
    /// page compressed and packed at 512 bytes).
    #[arg(long, value_enum, default_value = "in-place")]
    pub write_mode: crate::bench::waf::WriteMode,
    /// Bytes of dana's log (`Options::log_bytes`), used when the log is
    /// formatted: by the first run with `--durability async|sync` on a
    /// load (a database keeps the size its log was formatted with).
    #[arg(long, default_value_t = Options::default().log_bytes_value())]
    pub log_bytes: u64,
    /// Measured seconds per workload.
    #[arg(long, default_value_t = 20.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Warm-up seconds before each measured window.
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_seconds)]
    pub warmup: f64,
    /// Small and short: at most 200k records, 2 s per workload (for tests).
    #[arg(long)]
    pub quick: bool,
    /// Where the timeline CSV and SVG go (default: <path>/../bench-out).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Engine settings.
    #[command(flatten)]
    pub engine: crate::bench::EngineArgs,
    /// Output settings.
    #[command(flatten)]
    pub output: crate::bench::OutputArgs,
}

impl YcsbArgs {
    fn effective(&self) -> YcsbArgs {
        let mut a = self.clone();
        if a.fields_10x100 {
            a.value_size = 1000;
        }
        if a.quick {
            a.records = a.records.min(200_000);
            a.seconds = a.seconds.min(2.0);
            a.warmup = a.warmup.min(0.5);
        }
        a
    }
}

/// The data set a workload ran on.
#[derive(Debug, Clone, Serialize)]
pub struct LoadInfo {
    /// Records the load wrote.
    pub records_loaded: u64,
    /// Records present when the workload started (more after inserts).
    pub records_at_start: u64,
    /// Value size, bytes.
    pub value_size: usize,
    /// True if loaded for this workload (false: reused).
    pub loaded_now: bool,
    /// Load time, s (0 when reused).
    pub seconds: f64,
    /// Records per second while loading (0 when reused).
    pub records_per_s: f64,
    /// Bytes of pages in use when the workload started.
    pub data_bytes: u64,
}

/// Count, rate and latency of one operation kind in the window.
#[derive(Debug, Clone, Serialize)]
pub struct KindFigures {
    /// Operations of this kind in the window.
    pub count: u64,
    /// Per second.
    pub ops_per_s: f64,
    /// Latency, µs.
    pub latency: Latency,
}

/// Per-kind figures; a kind the workload does not issue is absent.
#[derive(Debug, Clone, Serialize, Default)]
pub struct PerOp {
    /// Point reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<KindFigures>,
    /// Updates (whole value overwritten).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update: Option<KindFigures>,
    /// Inserts of new keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insert: Option<KindFigures>,
    /// Short scans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scan: Option<KindFigures>,
    /// Read-modify-writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmw: Option<KindFigures>,
}

impl PerOp {
    /// The figures of `kind`, if the workload issues it.
    pub fn get(&self, kind: OpKind) -> Option<&KindFigures> {
        match kind {
            OpKind::Read => self.read.as_ref(),
            OpKind::Update => self.update.as_ref(),
            OpKind::Insert => self.insert.as_ref(),
            OpKind::Scan => self.scan.as_ref(),
            OpKind::Rmw => self.rmw.as_ref(),
        }
    }
}

/// One workload's run.
#[derive(Debug, Clone, Serialize)]
pub struct YcsbRun {
    /// a-f.
    pub workload: Workload,
    /// Its operation mix.
    pub mix: Mix,
    /// The data it ran on.
    pub load: LoadInfo,
    /// Pool size / data size.
    pub pool_fraction: f64,
    /// Pool bytes.
    pub pool_bytes: u64,
    /// Record cache bytes (the memory budget is both).
    pub record_cache_bytes: u64,
    /// The record cache over the window, if it had a budget.
    pub record_cache: Option<RecordCacheFigures>,
    /// Data bytes / pool bytes.
    pub data_over_pool: f64,
    /// Records present after the run.
    pub records_at_end: u64,
    /// Records returned by scans per second.
    pub scanned_records_per_s: f64,
    /// Per operation kind.
    pub per_op: PerOp,
    /// The window's figures (all kinds together).
    #[serde(flatten)]
    pub m: Measured,
}

/// dana's record cache over a run's window.
#[derive(Debug, Clone, Serialize)]
pub struct RecordCacheFigures {
    /// Lookups answered by the cache / all lookups: point reads, and the
    /// reads a commit makes (a read-modify-write's check of the value it
    /// read, an insert's check that the key is absent).
    pub hit_rate: f64,
    /// Records entered per second.
    pub fills_per_s: f64,
    /// Records dropped by writes per second.
    pub invalidations_per_s: f64,
    /// Records held at the end.
    pub entries: u64,
    /// Bytes held at the end, each entry's overhead counted.
    pub bytes: u64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct YcsbReport {
    /// Machine facts.
    pub machine: Machine,
    /// Workers.
    pub workers: usize,
    /// Client tasks per worker.
    pub tasks_per_worker: usize,
    /// Device budget (reads in flight per device).
    pub device_budget: crate::bench::DeviceBudgetArg,
    /// The buffer pool's eviction policy.
    pub eviction: String,
    /// Where page writes land (`--write-mode`).
    pub write_mode: &'static str,
    /// Key size, bytes.
    pub key_bytes: usize,
    /// Value size, bytes.
    pub value_size: usize,
    /// How keys are derived from key numbers.
    pub insert_order: &'static str,
    /// Database files.
    pub files: Vec<PathBuf>,
    /// One entry per workload, in running order.
    pub runs: Vec<YcsbRun>,
    /// Peer engines, per workload.
    pub peers: Vec<peer::PeerYcsbRun>,
}

fn options(a: &YcsbArgs, pool_bytes: u64) -> Options {
    a.engine.options(pool_bytes).log_bytes(a.log_bytes)
}

/// Runs `dana bench ycsb`.
pub fn run(args: &YcsbArgs) -> CliResult<()> {
    let a = args.effective();
    crate::peers::check_engines(&a.engines)?;
    if !a.pool_fraction.is_finite() || a.pool_fraction <= 0.0 {
        return Err(CliError("--pool-fraction must be > 0".into()));
    }
    if !(0.0..0.95).contains(&a.record_cache_share) {
        return Err(CliError(
            "--record-cache-share must be at least 0 and below 0.95 (the pool needs room)".into(),
        ));
    }
    if a.value_size < 8 {
        return Err(CliError(
            "--value-size must be at least 8 (values start with their key number)".into(),
        ));
    }
    if a.records == 0 || a.engine.workers == 0 || a.engine.tasks_per_worker == 0 {
        return Err(CliError(
            "--records, --workers and --tasks-per-worker must be > 0".into(),
        ));
    }
    if a.peer_threads.is_empty() || a.peer_threads.iter().any(|&t| t == 0 || t > 4096) {
        return Err(CliError(
            "--peer-threads must name thread counts of 1 to 4,096".into(),
        ));
    }
    // Peer engines (`--engines`) plug in here: for each `PeerEngine`, load
    // with `PeerEngine::load(records, value_size, hashed_load_keys(..),
    // &fill_value(k, 0, ..))` (keys `key_of(k)` in key order), then run
    // the same `Shared::op_gen` streams
    // from plain threads (one `OpGen` per client thread) executing
    // Read/Update/Insert/Scan/Rmw through get/put/scan (Rmw = get + put),
    // timing each op into the same per-kind histograms as `run_workload`.
    let mut runs = Vec::new();
    let mut fresh_done = false;
    crate::report::note_memory_backed(&a.path);
    for w in a.workload.workloads() {
        // `all`: E starts from a fresh load, as YCSB recommends.
        let force = a.workload == WorkloadChoice::All && w == Workload::E && fresh_done;
        let load = ensure_loaded(&a, force)?;
        fresh_done = true;
        let files = data_files(&a.path);
        let disk = files.first().and_then(|f| Disk::of(f));
        runs.push(run_workload(&a, w, load, disk.as_ref())?);
    }
    let report = YcsbReport {
        machine: Machine::probe(),
        workers: a.engine.workers,
        tasks_per_worker: a.engine.tasks_per_worker,
        device_budget: a.engine.device_budget,
        eviction: format!("{:?}", a.engine.eviction).to_lowercase(),
        write_mode: a.write_mode.name(),
        key_bytes: KEY_BYTES,
        value_size: a.value_size,
        insert_order:
            "hashed (key = big-endian splitmix64 finaliser of the key number; loaded in key order)",
        files: data_files(&a.path),
        peers: run_peers(&a, &runs)?,
        runs,
    };
    write_outputs(&a, &report)?;
    if a.output.json {
        let s = serde_json::to_string_pretty(&report).context("encoding the report")?;
        println!("{s}");
    } else {
        print!("{}", render(&report));
    }
    crate::bench::fail_on_errors(&report)
}

/// Each peer engine on each workload that dana ran, at each of
/// `--peer-threads`; the best count per workload is marked.
///
/// Each peer runs what dana ran: its inserts go on from the records it
/// holds (carried from run to run and, in [`PEER_RECORDS`], from
/// invocation to invocation, as dana's load marker carries its count), E
/// under `all` starts from a fresh load as dana's does, and each workload
/// opens the engine with that workload's budget (dana's pool and record
/// cache, sized from the data at its start). Before, every run started
/// its inserts at `--records` again (the later thread counts of D and E
/// overwrote keys the first had inserted) and E ran on the data D grew
/// (a review's finding).
fn run_peers(a: &YcsbArgs, runs: &[YcsbRun]) -> CliResult<Vec<peer::PeerYcsbRun>> {
    let mut out = Vec::new();
    let files = data_files(&a.path);
    let disk = files.first().and_then(|f| Disk::of(f));
    // The peers' writes cost their logs what dana's cost its own.
    let durability = a.engine.durability;
    // `threads` sizes the engines' background work: one per core.
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let quiet = a.output.quiet || a.output.json;
    for name in a.engines.iter().filter(|e| e.as_str() != "dana") {
        let rss0 = crate::report::rss_bytes();
        let mut fresh_done = false;
        for r in runs {
            let cache = r.pool_bytes + r.record_cache_bytes;
            let cfg = crate::peers::PeerConfig {
                dir: a.path.join("peers"),
                cache_bytes: cache as usize,
                threads: cores,
                direct_io: true,
                durability,
                // YCSB writes: the budget covers RocksDB's memtables too.
                memtables_in_budget: true,
            };
            // A run that inserted and did not end left no count: reloaded.
            let unknown = cfg.dir.join(name).exists()
                && peer::records_held(name, &cfg)? == peer::RecordsHeld::Unknown;
            if unknown
                || (a.workload == WorkloadChoice::All && r.workload == Workload::E && fresh_done)
            {
                crate::peers::wipe(name, &cfg)?;
            }
            fresh_done = true;
            let engine = peer::open_loaded(name, &cfg, a.records, a.value_size, quiet)?;
            let mut records = match peer::records_held(name, &cfg)? {
                peer::RecordsHeld::Known(n) => n,
                _ => a.records,
            };
            let first = out.len();
            for &threads in &a.peer_threads {
                peer::note_records_held(name, &cfg, None)?;
                let mut p = peer::run(
                    &*engine,
                    r.workload,
                    records,
                    a.value_size,
                    threads,
                    cache,
                    Duration::from_secs_f64(a.warmup),
                    Duration::from_secs_f64(a.seconds),
                    disk.as_ref(),
                    quiet,
                )?;
                records = p.records_after;
                peer::note_records_held(name, &cfg, Some(records))?;
                p.dana_over_peer = Some(r.m.ops_per_s / p.ops_per_s.max(1e-9));
                p.durability = durability;
                p.rss_added_bytes = crate::report::rss_bytes().saturating_sub(rss0);
                out.push(p);
            }
            mark_best(&mut out[first..]);
        }
    }
    Ok(out)
}

/// Marks the run with the most operations per second.
fn mark_best(runs: &mut [peer::PeerYcsbRun]) {
    let best = (0..runs.len()).max_by(|&x, &y| runs[x].ops_per_s.total_cmp(&runs[y].ops_per_s));
    if let Some(b) = best {
        runs[b].best = true;
    }
}

fn marker_prefix(a: &YcsbArgs) -> String {
    format!(
        "ycsb loaded={} value_size={} page_size={PAGE} order=keys mode={} records=",
        a.records,
        a.value_size,
        a.write_mode.name()
    )
}

fn write_marker(a: &YcsbArgs, records: u64) -> CliResult<()> {
    std::fs::write(
        a.path.join("LOADED"),
        format!("{}{records}\n", marker_prefix(a)),
    )
    .context("writing the load marker")
}

async fn data_bytes(db_pool: Arc<dana::buffer::BufferPool>) -> Result<u64, Error> {
    Ok(db_pool.space().await?.next_unused * PAGE as u64)
}

/// Loads the data set unless a matching one is there (or `force`).
fn ensure_loaded(a: &YcsbArgs, force: bool) -> CliResult<LoadInfo> {
    let marker = a.path.join("LOADED");
    let current = std::fs::read_to_string(&marker).ok().and_then(|s| {
        s.trim_end()
            .strip_prefix(&marker_prefix(a))
            .and_then(|n| n.parse::<u64>().ok())
    });
    // A database that has a log keeps using it (`Durability::Off` then
    // means async commits): a log-off run needs data loaded without one.
    let has_log = a.path.join("dana.wal").exists();
    let force = force || (a.engine.durability == dana::Durability::Off && has_log);
    if let (Some(records), false) = (current, force) {
        let db = Db::open(&a.path, options(a, 16 << 20))?;
        let bytes = db.block_on(data_bytes(db.pool().clone()))??;
        db.close()?;
        return Ok(LoadInfo {
            records_loaded: a.records,
            records_at_start: records,
            value_size: a.value_size,
            loaded_now: false,
            seconds: 0.0,
            records_per_s: 0.0,
            data_bytes: bytes,
        });
    }
    std::fs::create_dir_all(&a.path).context(format!("creating {}", a.path.display()))?;
    clear_dana_files(&a.path)?;
    // A load in key order fills leaves ~92%, the random inserts of D and
    // E ~70%; size the files with room for both.
    let per_record = (KEY_BYTES + a.value_size + 12) as u64;
    let estimate = a.records * per_record * 100 / 65 + (8 << 20);
    let capacity = estimate * 2 + (64 << 20);
    let pool = (estimate + estimate / 4).min(12 << 30);
    // The load is a bulk path: unlogged writes, then a flush, into a
    // database without a log (as the peers load with their logs off); a
    // run with `--durability async|sync` formats the log when it opens.
    // Loading through a log would log every page the load fills (see
    // ARCHITECTURE.md, known limits): ~12x slower, and no part of any
    // measured run.
    let db = Db::open(
        &a.path,
        a.write_mode.apply(
            options(a, pool)
                .capacity_bytes(capacity)
                .durability(dana::Durability::Off),
        ),
    )?;
    let tree = db.create_tree(TREE)?.unlogged_btree().clone();
    let sorted = Arc::new(numbers_in_key_order(a.records));
    let record: crate::bench::RecordFn = Arc::new(move |i, v| {
        let k = sorted[i as usize];
        fill_value(k, 0, v);
        key_of(k)
    });
    let seconds = crate::bench::load_records(
        &db,
        &tree,
        a.records,
        // One ascending stream, as the peers load (ascending ranges in
        // parallel tasks would leave leaves half full).
        1,
        a.value_size,
        record,
        a.output.quiet || a.output.json,
    )?;

    let bytes = db.block_on(data_bytes(db.pool().clone()))??;
    db.close()?;
    write_marker(a, a.records)?;
    Ok(LoadInfo {
        records_loaded: a.records,
        records_at_start: a.records,
        value_size: a.value_size,
        loaded_now: true,
        seconds,
        records_per_s: a.records as f64 / seconds,
        data_bytes: bytes,
    })
}

/// Per-kind latency histograms and scanned-record count of a run.
#[derive(Default)]
struct KindStats {
    latency: [Histogram; 5],
    scanned: AtomicU64,
}

/// Executes one op on dana; Err is a failure to count.
async fn execute(
    tree: &Tree,
    op: Op,
    value_size: usize,
    buf: &mut [u8],
    salt: u8,
    shared: &Shared,
    stats: &KindStats,
) -> Result<(), String> {
    match op {
        // Reads go to the B+tree directly (no copy of the value); writes
        // are commits through the `Tree` (durable per the database's
        // durability).
        Op::Read(k) => match tree
            .unlogged_btree()
            .get_with(&key_of(k), |v| value_ok(k, value_size, v))
            .await
        {
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => Err(format!("read {k}: wrong value")),
            Ok(None) => Err(format!("read {k}: missing")),
            Err(e) => Err(format!("read {k}: {e}")),
        },
        Op::Update(k) => {
            fill_value(k, salt, buf);
            match tree.put_async(&key_of(k), buf).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!("update {k}: the record was missing")),
                Err(e) => Err(format!("update {k}: {e}")),
            }
        }
        Op::Insert(k) => {
            fill_value(k, 0, buf);
            let r = tree.insert_async(&key_of(k), buf).await;
            // Acknowledged even on failure, so `latest` does not stall;
            // the failure is counted and the marker is not rewritten.
            shared.counter.acknowledge(k);
            r.map_err(|e| format!("insert {k}: {e}"))
        }
        Op::Scan(k, len) => {
            let key = key_of(k);
            let mut c = match tree.cursor(Bound::Included(&key[..]), Bound::Unbounded, true) {
                Ok(c) => c.with_len_hint(len),
                Err(e) => return Err(format!("scan {k}: {e}")),
            };
            let mut n = 0usize;
            while n < len {
                match c.next().await {
                    Ok(Some((rk, _))) => {
                        if n == 0 && rk != key {
                            return Err(format!("scan {k}: started at another key"));
                        }
                        n += 1;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(format!("scan {k}: {e}")),
                }
            }
            stats.scanned.fetch_add(n as u64, Ordering::Relaxed);
            if n == 0 {
                return Err(format!("scan {k}: no records"));
            }
            Ok(())
        }
        Op::Rmw(k) => match tree
            .update_async(&key_of(k), |v| {
                if value_ok(k, value_size, v) {
                    modify(v)
                } else {
                    v.to_vec()
                }
            })
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("rmw {k}: missing")),
            Err(e) => Err(format!("rmw {k}: {e}")),
        },
    }
}

/// Runs one workload with a pool of `--pool-fraction` of the data.
fn run_workload(
    a: &YcsbArgs,
    w: Workload,
    load: LoadInfo,
    disk: Option<&Disk>,
) -> CliResult<YcsbRun> {
    let memory = ((load.data_bytes as f64 * a.pool_fraction) as u64).max(128 * PAGE as u64);
    let record_cache_bytes = (memory as f64 * a.record_cache_share) as u64;
    let pool_bytes = (memory - record_cache_bytes).max(64 * PAGE as u64);
    let db = Db::open(
        &a.path,
        options(a, pool_bytes).record_cache_bytes(record_cache_bytes as usize),
    )?;
    let tree = db
        .tree(TREE)
        .context(format!("opening tree {TREE:?} of {}", a.path.display()))?;
    if w.inserts() {
        // Until the run ends cleanly the record count is unknown: an
        // interrupted run makes the next one reload.
        let _ = std::fs::remove_file(a.path.join("LOADED"));
    }
    let shared = Arc::new(Shared::new(w, load.records_at_start));
    let state = Arc::new(RunState::default());
    let stats = Arc::new(KindStats::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let tasks = a.engine.workers * a.engine.tasks_per_worker;
    for t in 0..tasks {
        let (tree, state, stats, shared, tx) = (
            tree.clone(),
            state.clone(),
            stats.clone(),
            shared.clone(),
            tx.clone(),
        );
        let mut gen = shared.op_gen(t as u64);
        let vs = a.value_size;
        db.spawn_on(t % a.engine.workers, async move {
            let mut buf = vec![0u8; vs];
            while !state.stop.load(Ordering::Relaxed) {
                let op = gen.next_op();
                let salt = gen.salt();
                let t0 = Instant::now();
                let r = execute(&tree, op, vs, &mut buf, salt, &shared, &stats).await;
                let d = t0.elapsed();
                state.latency.record(d);
                stats.latency[op.kind() as usize].record(d);
                if let Err(e) = r {
                    state.fail(e);
                }
                state.ops.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        })?;
    }
    drop(tx);
    let total = Duration::from_secs_f64(a.warmup + a.seconds);
    let what = format!("ycsb {}", w.letter());
    let pb = bar(
        a.output.quiet || a.output.json,
        total.as_millis() as u64,
        &what,
    );
    let mut base: Option<([HistogramSnapshot; 5], u64, RecordCacheStats)> = None;
    let m = sample_with(
        &db,
        &state,
        Duration::from_secs_f64(a.warmup),
        Duration::from_secs_f64(a.seconds),
        PAGE,
        disk,
        Some(&pb),
        &mut || {
            base = Some((
                std::array::from_fn(|i| stats.latency[i].snapshot()),
                stats.scanned.load(Ordering::Relaxed),
                db.pool().records().stats(),
            ))
        },
    );
    let end: [HistogramSnapshot; 5] = std::array::from_fn(|i| stats.latency[i].snapshot());
    let scanned_end = stats.scanned.load(Ordering::Relaxed);
    let records_end = db.pool().records().stats();
    pb.finish_and_clear();
    state.stop.store(true, Ordering::Relaxed);
    for _ in 0..tasks {
        rx.recv_timeout(Duration::from_secs(60))
            .map_err(|_| CliError(format!("a ycsb {} task did not stop", w.letter())))?;
    }
    db.close()?;
    let records_at_end = shared.counter.issued();
    if w.inserts() && state.errors.load(Ordering::Relaxed) == 0 {
        write_marker(a, records_at_end)?;
    }
    let (base, scanned_base, records_base) =
        base.ok_or_else(|| CliError("the sampler never started".into()))?;
    let record_cache = (records_end.budget > 0).then(|| {
        let (hits, misses) = (
            records_end.hits - records_base.hits,
            records_end.misses - records_base.misses,
        );
        RecordCacheFigures {
            hit_rate: hits as f64 / (hits + misses).max(1) as f64,
            fills_per_s: (records_end.fills - records_base.fills) as f64 / m.seconds,
            invalidations_per_s: (records_end.invalidations - records_base.invalidations) as f64
                / m.seconds,
            entries: records_end.entries,
            bytes: records_end.bytes,
        }
    });
    let mix = w.mix();
    let share = [mix.read, mix.update, mix.insert, mix.scan, mix.rmw];
    let fig = |k: OpKind| {
        (share[k as usize] > 0.0).then(|| {
            let s = end[k as usize].since(&base[k as usize]);
            KindFigures {
                count: s.count,
                ops_per_s: s.count as f64 / m.seconds,
                latency: Latency::from(&s),
            }
        })
    };
    Ok(YcsbRun {
        workload: w,
        mix,
        pool_fraction: a.pool_fraction,
        pool_bytes,
        record_cache_bytes,
        record_cache,
        data_over_pool: load.data_bytes as f64 / pool_bytes as f64,
        records_at_end,
        scanned_records_per_s: (scanned_end - scanned_base) as f64 / m.seconds,
        per_op: PerOp {
            read: fig(OpKind::Read),
            update: fig(OpKind::Update),
            insert: fig(OpKind::Insert),
            scan: fig(OpKind::Scan),
            rmw: fig(OpKind::Rmw),
        },
        load,
        m,
    })
}

fn write_outputs(a: &YcsbArgs, r: &YcsbReport) -> CliResult<()> {
    let out = a.out.clone().unwrap_or_else(|| {
        a.path
            .parent()
            .map_or(PathBuf::from("."), |p| p.to_path_buf())
            .join("bench-out")
    });
    std::fs::create_dir_all(&out).context(format!("creating {}", out.display()))?;
    for run in &r.runs {
        let stem = format!("ycsb-{}", run.workload.letter());
        let title = format!(
            "dana bench ycsb {}: {} records, pool {:.1}% of data",
            run.workload.letter().to_ascii_uppercase(),
            run.load.records_at_start,
            run.pool_fraction * 100.0
        );
        write_timeline(&out, &stem, &title, "ops/s", &run.m.timeline)?;
    }
    Ok(())
}

/// The human report.
pub fn render(r: &YcsbReport) -> String {
    let mut s = format!(
        "dana bench ycsb: {}-byte keys ({}), {}-byte values; {} workers x {} tasks; device budget {}; pages written {}\n",
        r.key_bytes,
        r.insert_order,
        r.value_size,
        r.workers,
        r.tasks_per_worker,
        r.device_budget,
        r.write_mode
    );
    for run in &r.runs {
        let l = &run.load;
        s += &format!(
            "\nworkload {}: {} records at start ({}), data {:.2} GiB, pool {:.1}% ({:.0} MiB, data/pool {:.1})\n",
            run.workload.letter().to_ascii_uppercase(),
            thousands(l.records_at_start as f64),
            if l.loaded_now {
                format!("loaded now in {:.1} s, {} records/s", l.seconds, thousands(l.records_per_s))
            } else {
                "reused".into()
            },
            l.data_bytes as f64 / (1u64 << 30) as f64,
            run.pool_fraction * 100.0,
            run.pool_bytes as f64 / (1 << 20) as f64,
            run.data_over_pool
        );
        if let Some(c) = &run.record_cache {
            s += &format!(
                "  record cache {:.0} MiB: {:.3} of lookups hit; {} records held ({:.0} MiB); {}/s entered, {}/s dropped by writes\n",
                run.record_cache_bytes as f64 / (1 << 20) as f64,
                c.hit_rate,
                thousands(c.entries as f64),
                c.bytes as f64 / (1 << 20) as f64,
                thousands(c.fills_per_s),
                thousands(c.invalidations_per_s)
            );
        }
        let m = &run.m;
        s += &format!(
            "  {} ops/s; dev reads/s {}, writes/s {}, disk reads/s {}; {:.2} reads/op; hit rate {:.3}; CPU {:.2} us/op, {:.2} us/IO\n",
            thousands(m.ops_per_s),
            thousands(m.engine_reads_per_s),
            thousands(m.engine_writes_per_s),
            m.disk_reads_per_s.map_or("-".into(), thousands),
            m.reads_per_op,
            m.hit_rate,
            m.cpu_us_per_op,
            m.cpu_us_per_io
        );
        s += &format!(
            "  eviction {}: {:.3} page writes/op, {:.0} log bytes/op ({:.3} page images/op, {:.0} log flushes/s, {:.1} checkpoints/s); frame waits {:.2} per 100 misses, p99 wait {:.0} us; {:.0}% of frames dirty at the end\n",
            r.eviction,
            m.writes_per_op,
            m.log_bytes_per_op,
            m.log_images_per_op,
            m.log_flushes_per_s,
            m.checkpoints_per_s,
            m.frame_waits_per_miss * 100.0,
            m.frame_wait.p99_us,
            m.dirty_fraction * 100.0
        );
        if let Some(c) = &m.collection {
            s += &format!(
                "  collection: {:.0} segments freed/s, {:.3} copies/op, {:.0} barriers/s; writes that collected themselves {:.1}/s, background runs {:.1}/s{}\n",
                c.segments_freed_per_s,
                c.copies_per_op,
                c.barriers_per_s,
                c.write_stalls_per_s,
                c.background_runs_per_s,
                if c.background_failures > 0 {
                    format!(", {} failed background steps", c.background_failures)
                } else {
                    String::new()
                }
            );
        }
        s += "  op        count       ops/s   p50 us   p99 us  p99.9 us\n";
        for kind in OpKind::ALL {
            if let Some(f) = run.per_op.get(kind) {
                s += &format!(
                    "  {:<6} {:>10}  {:>10}  {:>7.0}  {:>7.0}  {:>8.0}\n",
                    kind.name(),
                    thousands(f.count as f64),
                    thousands(f.ops_per_s),
                    f.latency.p50_us,
                    f.latency.p99_us,
                    f.latency.p999_us
                );
            }
        }
        if run.per_op.scan.is_some() {
            s += &format!(
                "  scans returned {} records/s\n",
                thousands(run.scanned_records_per_s)
            );
        }
        if m.errors > 0 {
            s += &format!(
                "  ERRORS: {} failed operations; first: {}\n",
                m.errors,
                m.first_error.as_deref().unwrap_or("?")
            );
        }
    }
    if !r.peers.is_empty() {
        let durability = r
            .peers
            .first()
            .map_or(dana::Durability::Off, |p| p.durability);
        s += &format!(
            "\n peers ({}; * = the engine's best thread count on the workload, which its ratio uses):\n",
            match durability {
                dana::Durability::Sync =>
                    "every write synced: RocksDB WriteOptions::sync, WiredTiger log with transaction_sync, LMDB synced commits",
                dana::Durability::Async =>
                    "writes logged, not synced: RocksDB WAL unsynced, WiredTiger log without transaction_sync, LMDB MDB_NOSYNC (no log)",
                dana::Durability::Off =>
                    "no log, as dana's: RocksDB without its WAL, WiredTiger without a log, LMDB MDB_NOSYNC",
            }
        );
        s += " engine      workload threads    ops/s  disk reads/s  disk writes/op  CPU us/op  RSS+ MiB  dana/peer  per kind: p50 / p99 us\n";
        for p in &r.peers {
            let kinds: Vec<String> = p
                .per_kind
                .iter()
                .map(|(n, _, l)| format!("{n} {:.0} / {:.0}", l.p50_us, l.p99_us))
                .collect();
            s += &format!(
                " {:<10}  {:>8} {:>6}{} {:>8}  {:>12}  {:>14}  {:>9.2}  {:>8}  {:>9}  {}{}\n",
                p.engine,
                p.workload.letter(),
                p.threads,
                if p.best { "*" } else { " " },
                thousands(p.ops_per_s),
                p.disk_reads_per_s.map_or("-".into(), thousands),
                p.disk_writes_per_op
                    .map_or("-".into(), |v| format!("{v:.3}")),
                p.cpu_us_per_op,
                p.rss_added_bytes >> 20,
                p.dana_over_peer.map_or("-".into(), |v| format!("{v:.1}x")),
                kinds.join(", "),
                if p.errors > 0 {
                    format!("  ({} ERRORS)", p.errors)
                } else {
                    String::new()
                }
            );
        }
        let mut noted = Vec::new();
        for p in &r.peers {
            if let Some(c) = &p.caveat {
                if !noted.contains(&p.engine) {
                    s += &format!("   {}: {c}\n", p.engine);
                    noted.push(p.engine.clone());
                }
            }
        }
        s += "   every engine: the same hashed keys, loaded in key order; peers: one synchronous operation at a time per thread.\n";
    }
    s += "\nnotes: zipfian = scrambled zipfian (0.99) over the records present at the start; latest follows the inserts; updates overwrite the whole value; rmw is one atomic Tree::update; CPU = getrusage user+sys over the window; MB = 10^6 bytes.\n";
    s
}
