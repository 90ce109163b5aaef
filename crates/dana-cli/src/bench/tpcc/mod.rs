//! `dana bench tpcc`: TPC-C on dana: the nine tables and two secondary
//! indexes as trees, the five transactions in the standard mix, each one
//! dana transaction (serializable but Stock-Level, which the spec lets
//! run at read committed), with the log on, then the spec's consistency
//! conditions over the whole database. With `--engines`, the peers
//! (RocksDB's `TransactionDB`, WiredTiger's snapshot transactions) run
//! the same load, transactions and check in the same invocation, each
//! at several client thread counts.
//!
//! Owns: the command (arguments, load, run, report, timelines). The tables live in
//! [`schema`], the inputs in [`gen`], the transactions in [`txns`]
//! (written against [`kv::KvTx`], so a peer engine can run the same
//! code), the load in [`load`], the conditions in [`check`]. Never:
//! reports a run whose consistency check failed as a success (the
//! command fails), or counts a rolled-back or abandoned transaction as
//! committed.
//!
//! Research engines' way of running it: no keying or think times, each
//! worker runs many transaction tasks; task `i` has home warehouse
//! `i % W + 1`. A conflict (`Error::Conflict`) runs the same input
//! again; every retry is counted per type.

pub mod check;
pub mod crash;
pub mod gen;
pub mod kv;
pub mod load;
pub mod schema;
pub mod txns;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use dana::{Db, Durability, Isolation, Options};
use serde::Serialize;

use super::diskstats::Disk;
use super::timeline::{write_timeline, Second};
use super::{thousands, Latency};
use crate::report::{num, process_cpu_seconds, Machine, Table as TextTable};
use crate::{CliError, CliResult, Context};
use gen::{Gen, NuRandC};
use kv::{DanaTables, Engine, KvTx, PeerTables, TxError};
use txns::{Input, Kind, Outcome};

/// Bytes one loaded warehouse takes in dana (measured: see PERF.md),
/// used to size the default run.
pub const WAREHOUSE_BYTES: u64 = 128 << 20;

/// `dana bench tpcc`
#[derive(Args, Debug, Clone)]
pub struct TpccArgs {
    /// Database directory (recreated).
    #[arg(long, default_value = "dana-data/tpcc")]
    pub path: PathBuf,
    /// Warehouses (default: data about 10x the buffer pool).
    #[arg(long)]
    pub warehouses: Option<u32>,
    /// Buffer pool bytes.
    #[arg(long, default_value_t = 128 << 20)]
    pub pool_bytes: u64,
    /// Buffer pool as a fraction of the estimated data (overrides
    /// `--pool-bytes`).
    #[arg(long)]
    pub pool_fraction: Option<f64>,
    /// The log during the run: off, async or sync (a New-Order
    /// acknowledged is on disk). The load always commits async and ends
    /// with a checkpoint. Peers keep their log on: off runs them as
    /// async (commits not synced).
    #[arg(long, default_value = "sync", value_parser = super::parse_durability)]
    pub durability: Durability,
    /// dana's requests in flight per device: `auto` (adapted to the
    /// device while it runs) or a fixed number.
    #[arg(long, default_value = "auto", value_parser = super::parse_device_budget)]
    pub device_budget: super::DeviceBudgetArg,
    /// Seconds of the measured run.
    #[arg(long, default_value_t = 10.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Transaction tasks per worker.
    #[arg(long, default_value_t = 8)]
    pub tasks_per_worker: usize,
    /// Seed of the load and of the inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Engines to run in this invocation, each on its own database:
    /// dana and the peers (rocksdb, wiredtiger, lmdb; the binary needs their
    /// cargo features).
    #[arg(long, value_delimiter = ',', default_value = "dana")]
    pub engines: Vec<String>,
    /// Client threads each peer engine runs, one measured run per count;
    /// the comparison uses its best.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32,128")]
    pub peer_threads: Vec<usize>,
    /// Parent directory of the peers' databases (recreated).
    #[arg(long, default_value = "dana-data/tpcc-peers")]
    pub peer_path: PathBuf,
    /// Where the timeline CSV and SVG files go (default:
    /// <path>/../bench-out).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Per-type results.
#[derive(Debug, Serialize, Clone)]
pub struct TypeReport {
    pub name: &'static str,
    pub isolation: String,
    pub committed: u64,
    /// New-Orders rolled back by the spec's unused item.
    pub rolled_back: u64,
    /// Attempts that failed with a conflict and ran again.
    pub conflicts: u64,
    /// Inputs given up after [`MAX_ATTEMPTS`] conflicts.
    pub abandoned: u64,
    /// Committed transactions, from the input drawn to the commit's
    /// return (retries included).
    pub latency: Latency,
}

/// One measured run of the mix on one engine.
#[derive(Debug, Serialize, Clone)]
pub struct RunReport {
    /// Transactions running at once (dana tasks, peer client threads).
    pub clients: usize,
    /// OS threads running them (dana workers, peer client threads).
    pub threads: usize,
    pub seconds: f64,
    pub transactions_per_s: f64,
    pub transactions_per_s_per_thread: f64,
    pub tpmc: f64,
    pub types: Vec<TypeReport>,
    pub disk_reads_per_tx: Option<f64>,
    pub disk_writes_per_tx: Option<f64>,
    /// CPU of the whole process per transaction (the engine's background
    /// threads included).
    pub cpu_us_per_tx: f64,
    /// Per second: transactions/s, device reads/s (`/proc/diskstats`),
    /// New-Order p99 µs.
    pub timeline: Vec<Second>,
}

/// dana's part of the report.
#[derive(Debug, Serialize)]
pub struct DanaReport {
    pub workers: usize,
    pub tasks: usize,
    /// Bytes of dana's files after the load and after the run.
    pub data_bytes_loaded: u64,
    pub data_bytes_after: u64,
    /// Bytes of the pages in use after the load (below the high-water
    /// mark): the data the pool is compared with.
    pub data_bytes_used_loaded: u64,
    pub load_rows: u64,
    pub load_seconds: f64,
    pub run: RunReport,
    pub page_reads_per_tx: f64,
    pub page_writes_per_tx: f64,
    pub log_bytes_per_tx: f64,
    pub log_flushes_per_tx: f64,
    pub writebacks_per_s: f64,
    pub consistency: check::Consistency,
}

/// A peer engine's part of the report.
#[derive(Debug, Serialize)]
pub struct PeerReport {
    pub engine: &'static str,
    pub isolation: String,
    pub config: String,
    /// Why its figures are not comparable with dana's, if they are not
    /// (LMDB: the OS page cache serves it, beyond the memory budget).
    pub caveat: Option<String>,
    pub load_rows: u64,
    pub load_seconds: f64,
    /// Bytes of the engine's files after the load and after the runs.
    pub data_bytes_loaded: u64,
    pub data_bytes_after: u64,
    /// Resident memory the process gained from opening the engine to the
    /// end of its runs (its cache, memtables, threads' stacks).
    pub rss_added_bytes: u64,
    /// One run per client thread count, in the order given.
    pub runs: Vec<RunReport>,
    /// Index in `runs` of the most transactions/s.
    pub best: usize,
    /// dana's transactions/s over this engine's best (when dana ran).
    pub dana_over_best: Option<f64>,
    pub consistency: check::Consistency,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct TpccReport {
    pub machine: Machine,
    pub warehouses: u32,
    pub durability: String,
    /// dana's buffer pool, and each peer's memory budget.
    pub pool_bytes: u64,
    pub dana: Option<DanaReport>,
    pub peers: Vec<PeerReport>,
}

/// Called with (warehouse, district, order id) once a New-Order's
/// commit returned (with `Sync` durability: once it is durable).
pub type OrderHook = Arc<dyn Fn(u32, u32, u32) + Send + Sync>;

/// Conflicts after which an input is given up (counted, not committed).
pub const MAX_ATTEMPTS: u32 = 1000;

/// What the tasks count, per transaction type ([`Kind::index`]), shared
/// by all of them.
#[derive(Default)]
struct Counts {
    committed: [AtomicU64; 5],
    rolled_back: [AtomicU64; 5],
    conflicts: [AtomicU64; 5],
    abandoned: [AtomicU64; 5],
    /// Input drawn to commit, retries included.
    latency: [dana::stats::Histogram; 5],
}

fn bump(counter: &[AtomicU64; 5], k: Kind) {
    counter[k.index()].fetch_add(1, Ordering::Relaxed);
}

fn total(counter: &[AtomicU64; 5]) -> u64 {
    counter.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// The isolation each type runs at.
pub fn isolation_of(k: Kind) -> Isolation {
    match k {
        Kind::StockLevel => Isolation::ReadCommitted,
        _ => Isolation::Serializable,
    }
}

/// Runs one input to its end: committed, rolled back or abandoned.
async fn run_one<E: Engine>(
    tables: &Arc<E>,
    input: &Input,
    durability: Durability,
    history_id: u64,
    counts: &Counts,
    on_order: Option<&OrderHook>,
) -> Result<(), String> {
    let k = input.kind();
    let began = Instant::now();
    for attempt in 0..MAX_ATTEMPTS {
        let mut tx = match tables.begin(isolation_of(k), durability, k.read_only()) {
            Ok(tx) => tx,
            Err(TxError::Conflict) => {
                bump(&counts.conflicts, k);
                tables.after_conflict(attempt).await;
                continue;
            }
            Err(TxError::Failed(m)) => return Err(format!("{}: {m}", k.name())),
        };
        let outcome = match txns::run(&mut tx, input, history_id).await {
            Ok(Outcome::Rollback) => {
                drop(tx);
                bump(&counts.rolled_back, k);
                return Ok(());
            }
            Ok(Outcome::Commit(order)) => tx.commit().await.map(|()| order),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(order) => {
                if let (Some(hook), Some((w, d, o))) = (on_order, order) {
                    hook(w, d, o);
                }
                bump(&counts.committed, k);
                counts.latency[k.index()].record(began.elapsed());
                return Ok(());
            }
            Err(TxError::Conflict) => {
                bump(&counts.conflicts, k);
                tables.after_conflict(attempt).await;
            }
            Err(TxError::Failed(m)) => return Err(format!("{}: {m}", k.name())),
        }
    }
    bump(&counts.abandoned, k);
    Ok(())
}

/// Opens a fresh database for `warehouses` and loads it. Returns the
/// tables, the rows loaded and the seconds the load took.
pub fn create_and_load(
    path: &std::path::Path,
    opts: Options,
    warehouses: u32,
    seed: u64,
    quiet: bool,
) -> CliResult<(Db, Arc<DanaTables>, u64, f64)> {
    crate::bench::fresh_bench_dir(path)?;
    let db = Db::open(path, opts)?;
    let tables = DanaTables::open(&db)?;
    let started = Instant::now();
    let tasks = db.runtime().workers() * 8;
    let mut last = Instant::now();
    let rows = load::load(&tables, warehouses, tasks, seed, |n| {
        if !quiet && last.elapsed() >= Duration::from_secs(5) {
            eprintln!("  loading: {} rows", thousands(n as f64));
            last = Instant::now();
        }
    })?;
    db.checkpoint()?;
    Ok((db, tables, rows, started.elapsed().as_secs_f64()))
}

/// The run's counters: per-type stats plus what the engine and the disk
/// did.
pub struct RunResult {
    counts: Arc<Counts>,
    seconds: f64,
    /// Per second: transactions/s, device reads/s, New-Order p99.
    timeline: Vec<Second>,
}

impl RunResult {
    /// Transactions that ended (committed or rolled back as the spec
    /// asks of 1% of New-Orders).
    pub fn transactions(&self) -> u64 {
        total(&self.counts.committed) + total(&self.counts.rolled_back)
    }
}

/// Tasks (and peer threads) a TPC-C run's history ids tell apart: they
/// keep 12 bits of a task's number.
pub const HISTORY_TASKS: usize = 1 << 12;

/// The key part of a History row written by the run with `seed`, task
/// `task`, its `n`th transaction.
fn history_id(seed: u64, task: usize, n: u64) -> u64 {
    debug_assert!(task < HISTORY_TASKS && n < 1 << 28);
    (1 << 63)
        | ((seed & ((1 << 23) - 1)) << 40)
        | ((task as u64 & 0xfff) << 28)
        | (n & ((1 << 28) - 1))
}

/// How to run the mix.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub warehouses: u32,
    pub workers: usize,
    pub tasks_per_worker: usize,
    pub durability: Durability,
    pub seconds: f64,
    /// Seed of the inputs; it also names the run in History keys, so
    /// runs on one database must differ in it.
    pub seed: u64,
    /// Seed the database was loaded with: the run's NURand constants
    /// derive from the load's (clause 2.1.6.1: C_LAST of the run differs
    /// from the load's by 65..=119, not 96 or 112), the same for every
    /// run on that load, dana's and each peer's. (They derived from the
    /// run's seed, so only dana's run, whose seed was the load's, kept
    /// the rule, and each peer run drew last names another way; a
    /// review's finding.)
    pub load_seed: u64,
}

/// Runs the mix for `m.seconds` with `m.workers * m.tasks_per_worker`
/// tasks; `on_order` hears of every New-Order acknowledged.
pub fn run_mix<E: Engine>(
    tables: &Arc<E>,
    m: Mix,
    on_order: Option<OrderHook>,
    disk: Option<&Disk>,
) -> CliResult<RunResult> {
    let Mix {
        warehouses,
        workers,
        tasks_per_worker,
        durability,
        seconds,
        seed,
        load_seed,
    } = m;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let counts = Arc::new(Counts::default());
    let load_c = NuRandC::load(load_seed);
    let run_c = NuRandC::run(load_c, load_seed);
    let tasks = workers * tasks_per_worker;
    let started = Instant::now();
    for t in 0..tasks {
        let (task_tables, stop, done, failure, counts, on_order) = (
            tables.clone(),
            stop.clone(),
            done.clone(),
            failure.clone(),
            counts.clone(),
            on_order.clone(),
        );
        tables.spawn(t, async move {
            let tables = task_tables;
            let mut g = Gen::new(seed ^ ((t as u64 + 1) << 20), run_c);
            let w = (t as u32 % warehouses) + 1;
            let mut history = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = Kind::draw(&mut g);
                let input = Input::draw(k, &mut g, w, warehouses);
                history += 1;
                // Unique across tasks and runs of one database (the
                // seed names the run: a crash test's cycles differ in
                // it) and apart from the load's ids (customer numbers,
                // below 2^32): run 23 bits, task 12, count 28.
                let hid = history_id(seed, t, history);
                if let Err(m) =
                    run_one(&tables, &input, durability, hid, &counts, on_order.as_ref()).await
                {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
                    stop.store(true, Ordering::Relaxed);
                }
            }
            done.fetch_add(1, Ordering::Release);
        })?;
    }
    let mut timeline = Vec::new();
    let mut sampler = Sampler::new(&counts, disk);
    while started.elapsed().as_secs_f64() < seconds && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if sampler.due() {
            timeline.push(sampler.second(&counts, disk, started));
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Each task finishes the input it is running.
    let stopped = Instant::now();
    while done.load(Ordering::Acquire) < tasks as u64 {
        if stopped.elapsed() > Duration::from_secs(300) {
            return Err(CliError(format!(
                "{} of {tasks} TPC-C tasks did not stop within 300 s",
                tasks as u64 - done.load(Ordering::Acquire)
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The window ends when the last task has: the transactions counted
    // include those finished after the stop (timed to the stop, the rate
    // counted the drain's transactions in a shorter time; a review's
    // finding).
    let seconds = started.elapsed().as_secs_f64();
    if let Some(m) = failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(CliError(format!("a TPC-C transaction failed: {m}")));
    }
    Ok(RunResult {
        counts,
        seconds,
        timeline,
    })
}

/// Takes a run's per-second samples.
struct Sampler {
    at: Instant,
    transactions: u64,
    reads: Option<u64>,
    new_order: dana::stats::HistogramSnapshot,
}

impl Sampler {
    fn new(c: &Counts, disk: Option<&Disk>) -> Sampler {
        Sampler {
            at: Instant::now(),
            transactions: total(&c.committed) + total(&c.rolled_back),
            reads: disk.and_then(Disk::read).map(|d| d.reads),
            new_order: c.latency[Kind::NewOrder.index()].snapshot(),
        }
    }

    fn due(&self) -> bool {
        self.at.elapsed() >= Duration::from_secs(1)
    }

    /// The second since the last sample; starts the next one.
    fn second(&mut self, c: &Counts, disk: Option<&Disk>, run_started: Instant) -> Second {
        let next = Sampler::new(c, disk);
        let dt = next.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let s = Second {
            t: next.at.duration_since(run_started).as_secs_f64(),
            ops_per_s: next.transactions.saturating_sub(self.transactions) as f64 / dt,
            reads_per_s: match (self.reads, next.reads) {
                (Some(a), Some(b)) => b.saturating_sub(a) as f64 / dt,
                _ => 0.0,
            },
            p99_us: next.new_order.since(&self.new_order).quantile_ns(0.99) as f64 / 1e3,
        };
        *self = next;
        s
    }
}

fn options(a: &TpccArgs, pool: u64, warehouses: u32) -> Options {
    a.device_budget
        .apply(Options::default())
        .pool_bytes(pool as usize)
        .workers(a.workers)
        .max_tasks_per_worker((a.tasks_per_worker * 2).max(64))
        .capacity_bytes(u64::from(warehouses) * WAREHOUSE_BYTES * 4 + (1 << 30))
        .log_bytes(256 << 20)
        .durability(a.durability)
}

/// Runs `dana bench tpcc`.
pub fn run(a: &TpccArgs) -> CliResult<()> {
    let quiet = a.json;
    crate::report::note_memory_backed(&a.path);
    let (warehouses, pool) = match (a.warehouses, a.pool_fraction) {
        (Some(w), Some(f)) => (w, (u64::from(w) * WAREHOUSE_BYTES) as f64 * f),
        (Some(w), None) => (w, a.pool_bytes as f64),
        (None, Some(f)) => (
            (a.pool_bytes * 10).div_ceil(WAREHOUSE_BYTES) as u32,
            (a.pool_bytes * 10) as f64 * f,
        ),
        (None, None) => (
            (a.pool_bytes * 10).div_ceil(WAREHOUSE_BYTES) as u32,
            a.pool_bytes as f64,
        ),
    };
    let pool = (pool as u64).max(4 << 20);
    if warehouses == 0 {
        return Err(CliError("--warehouses must be at least 1".into()));
    }
    if a.workers * a.tasks_per_worker >= HISTORY_TASKS || a.workers * a.tasks_per_worker == 0 {
        return Err(CliError(
            "--workers x --tasks-per-worker must be 1 to 4,095 (history ids)".into(),
        ));
    }
    if a.peer_threads.iter().any(|&t| t == 0 || t >= HISTORY_TASKS) {
        return Err(CliError(
            "--peer-threads must each be 1 to 4,095 (history ids)".into(),
        ));
    }
    for e in &a.engines {
        if e != "dana" && !crate::peers::txn::TX_ENGINES.contains(&e.as_str()) {
            return Err(CliError(format!(
                "unknown engine {e:?}: TPC-C runs dana, {}",
                crate::peers::txn::TX_ENGINES.join(", ")
            )));
        }
    }
    if !quiet {
        println!(
            "dana bench tpcc: {warehouses} warehouses (estimated before the load: {} MiB in dana), memory {} MiB, \
             durability {:?}, {} s per run, engines {}",
            (u64::from(warehouses) * WAREHOUSE_BYTES) >> 20,
            pool >> 20,
            a.durability,
            a.seconds,
            a.engines.join(",")
        );
    }
    let dana = if a.engines.iter().any(|e| e == "dana") {
        Some(run_dana(a, warehouses, pool)?)
    } else {
        None
    };
    let mut peers = Vec::new();
    for name in a.engines.iter().filter(|e| e.as_str() != "dana") {
        let mut p = run_peer(a, name, warehouses, pool)?;
        if let Some(d) = &dana {
            let best = p.runs[p.best].transactions_per_s;
            p.dana_over_best = Some(d.run.transactions_per_s / best.max(1e-9));
        }
        if !quiet {
            print_peer(&p);
        }
        peers.push(p);
    }
    let report = TpccReport {
        machine: Machine::probe(),
        warehouses,
        durability: format!("{:?}", a.durability),
        pool_bytes: pool,
        dana,
        peers,
    };
    write_timelines(a, &report)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print_summary(&report);
    }
    if let Some(d) = &report.dana {
        d.consistency.ok()?;
    }
    for p in &report.peers {
        p.consistency
            .ok()
            .map_err(|e| CliError(format!("{}: {}", p.engine, e.0)))?;
    }
    Ok(())
}

/// Writes `tpcc-<engine>[-<threads>].csv/.svg` for every run.
fn write_timelines(a: &TpccArgs, r: &TpccReport) -> CliResult<()> {
    let out = a.out.clone().unwrap_or_else(|| {
        a.path
            .parent()
            .map_or(PathBuf::from("."), |p| p.to_path_buf())
            .join("bench-out")
    });
    std::fs::create_dir_all(&out).context(format!("creating {}", out.display()))?;
    let what = format!(
        "{} warehouses, memory {} MiB, durability {}",
        r.warehouses,
        r.pool_bytes >> 20,
        r.durability
    );
    if let Some(d) = &r.dana {
        let title = format!(
            "dana bench tpcc: dana, {} tasks, {what} (p99: New-Order)",
            d.tasks
        );
        write_timeline(&out, "tpcc-dana", &title, "transactions/s", &d.run.timeline)?;
    }
    for p in &r.peers {
        for run in &p.runs {
            let title = format!(
                "dana bench tpcc: {}, {} threads, {what} (p99: New-Order)",
                p.engine, run.threads
            );
            let stem = format!("tpcc-{}-{}", p.engine, run.threads);
            write_timeline(&out, &stem, &title, "transactions/s", &run.timeline)?;
        }
    }
    Ok(())
}

/// Runs `m` on `tables` and measures it: per-type counts and latencies,
/// CPU and (if `disk` is known) device I/O per transaction.
fn measure<E: Engine>(
    tables: &Arc<E>,
    m: Mix,
    threads: usize,
    disk: Option<&Disk>,
) -> CliResult<RunReport> {
    let (d0, c0) = (disk.and_then(Disk::read), process_cpu_seconds());
    let r = run_mix(tables, m, None, disk)?;
    let (d1, c1) = (disk.and_then(Disk::read), process_cpu_seconds());
    let c = &r.counts;
    let txs = total(&c.committed) + total(&c.rolled_back);
    let per = |v: u64| v as f64 / txs.max(1) as f64;
    let disk_delta = match (d0, d1) {
        (Some(a0), Some(a1)) => Some(a1.since(&a0)),
        _ => None,
    };
    let types = Kind::ALL
        .iter()
        .map(|&k| {
            let n = |a: &[AtomicU64; 5]| a[k.index()].load(Ordering::Relaxed);
            TypeReport {
                name: k.name(),
                isolation: tables.isolation_label(isolation_of(k)),
                committed: n(&c.committed),
                rolled_back: n(&c.rolled_back),
                conflicts: n(&c.conflicts),
                abandoned: n(&c.abandoned),
                latency: Latency::from(&c.latency[k.index()].snapshot()),
            }
        })
        .collect();
    let tx_per_s = txs as f64 / r.seconds;
    Ok(RunReport {
        clients: m.workers * m.tasks_per_worker,
        threads,
        seconds: r.seconds,
        transactions_per_s: tx_per_s,
        transactions_per_s_per_thread: tx_per_s / threads.max(1) as f64,
        tpmc: (c.committed[Kind::NewOrder.index()].load(Ordering::Relaxed)
            + c.rolled_back[Kind::NewOrder.index()].load(Ordering::Relaxed)) as f64
            / r.seconds
            * 60.0,
        types,
        disk_reads_per_tx: disk_delta.map(|d| per(d.reads)),
        disk_writes_per_tx: disk_delta.map(|d| per(d.writes)),
        cpu_us_per_tx: (c1 - c0) * 1e6 / txs.max(1) as f64,
        timeline: r.timeline,
    })
}

/// Pages dana's database uses (below its high-water mark).
fn used_pages(db: &Db) -> CliResult<u64> {
    let pool = db.pool().clone();
    Ok(db.block_on(async move { pool.space().await.map(|s| s.next_unused) })??)
}

/// Transactions (committed and rolled back) a run counted.
fn transactions(r: &RunReport) -> u64 {
    r.types.iter().map(|t| t.committed + t.rolled_back).sum()
}

/// dana: load, run, check.
fn run_dana(a: &TpccArgs, warehouses: u32, pool: u64) -> CliResult<DanaReport> {
    let quiet = a.json;
    let (db, tables, load_rows, load_seconds) = create_and_load(
        &a.path,
        options(a, pool, warehouses),
        warehouses,
        a.seed,
        quiet,
    )?;
    let page = db.pool().page_size() as u64;
    let loaded_bytes = db.pool_stats().array_pages * page;
    // The pages in use (below the high-water mark), not the files with
    // their growth slack: what "x the pool" compares (a review found the
    // files' size there).
    let used_bytes = used_pages(&db)? * page;
    if !quiet {
        println!(
            "dana: loaded {} rows in {:.1} s ({} rows/s); data {} MiB in use ({:.1}x the pool), files {} MiB",
            thousands(load_rows as f64),
            load_seconds,
            thousands(load_rows as f64 / load_seconds.max(1e-9)),
            used_bytes >> 20,
            used_bytes as f64 / pool as f64,
            loaded_bytes >> 20,
        );
    }
    let disk = Disk::of(&a.path);
    let (p0, w0) = (db.pool_stats(), db.wal_stats().unwrap_or_default());
    let mix = Mix {
        warehouses,
        workers: a.workers,
        tasks_per_worker: a.tasks_per_worker,
        durability: a.durability,
        seconds: a.seconds,
        seed: a.seed,
        load_seed: a.seed,
    };
    let run = measure(&tables, mix, a.workers, disk.as_ref())?;
    let (p1, w1) = (db.pool_stats(), db.wal_stats().unwrap_or_default());
    let per = |v: u64| v as f64 / transactions(&run).max(1) as f64;
    if !quiet {
        println!("dana: checking the consistency conditions ...");
    }
    let consistency = check::check(&*tables)?;
    let report = DanaReport {
        workers: a.workers,
        tasks: a.workers * a.tasks_per_worker,
        data_bytes_loaded: loaded_bytes,
        data_bytes_after: p1.array_pages * page,
        data_bytes_used_loaded: used_bytes,
        load_rows,
        load_seconds,
        page_reads_per_tx: per(p1.reads - p0.reads),
        page_writes_per_tx: per(p1.writes - p0.writes),
        log_bytes_per_tx: per(w1.bytes - w0.bytes),
        log_flushes_per_tx: per(w1.flushes - w0.flushes),
        writebacks_per_s: (p1.writebacks - p0.writebacks) as f64 / run.seconds,
        run,
        consistency,
    };
    db.close()?;
    if !quiet {
        print_dana(&report);
    }
    Ok(report)
}

/// A peer engine: a fresh load with the same loader, then one run per
/// client thread count, then the same check.
fn run_peer(a: &TpccArgs, name: &str, warehouses: u32, pool: u64) -> CliResult<PeerReport> {
    let quiet = a.json;
    let rss0 = crate::report::rss_bytes();
    // `threads` sizes the engines' background work: one per core.
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let cfg = crate::peers::PeerConfig {
        dir: a.peer_path.clone(),
        cache_bytes: pool as usize,
        threads: cores,
        direct_io: true,
        durability: dana::Durability::Off,
        memtables_in_budget: true,
    };
    let peer = crate::peers::txn::open_tx(name, &cfg)?;
    let dir = a.peer_path.join(name);
    let tables = Arc::new(PeerTables { peer });
    if !quiet {
        println!("\n{name}: {}", tables.peer.config());
    }
    let started = Instant::now();
    let mut last = Instant::now();
    let load_rows = load::load(&tables, warehouses, 8, a.seed, |n| {
        if !quiet && last.elapsed() >= Duration::from_secs(5) {
            eprintln!("  {name} loading: {} rows", thousands(n as f64));
            last = Instant::now();
        }
    })?;
    // Load time includes making the load durable and settled.
    tables.peer.settle()?;
    let load_seconds = started.elapsed().as_secs_f64();
    let data_bytes_loaded = crate::report::dir_bytes(&dir);
    if !quiet {
        println!(
            "{name}: loaded {} rows in {load_seconds:.1} s; files {} MiB",
            thousands(load_rows as f64),
            data_bytes_loaded >> 20
        );
    }
    let disk = Disk::of(&dir);
    let mut runs = Vec::new();
    for (i, &threads) in a.peer_threads.iter().enumerate() {
        // Each run names its History rows by its own seed.
        let mix = Mix {
            warehouses,
            workers: threads,
            tasks_per_worker: 1,
            durability: a.durability,
            seconds: a.seconds,
            seed: a.seed.wrapping_add(i as u64 + 1),
            load_seed: a.seed,
        };
        // Each run starts settled, as dana's starts after its load's
        // checkpoint: no run pays for the compactions or checkpoints of
        // the writes before it.
        tables.peer.settle()?;
        let r = measure(&tables, mix, threads, disk.as_ref())?;
        if !quiet {
            println!(
                "{name}: {threads} threads: {} transactions/s",
                thousands(r.transactions_per_s)
            );
        }
        runs.push(r);
    }
    let rss_added_bytes = crate::report::rss_bytes().saturating_sub(rss0);
    if !quiet {
        println!("{name}: checking the consistency conditions ...");
    }
    let consistency = check::check(&*tables)?;
    let best = (0..runs.len())
        .max_by(|&x, &y| {
            runs[x]
                .transactions_per_s
                .total_cmp(&runs[y].transactions_per_s)
        })
        .unwrap_or(0);
    let report = PeerReport {
        engine: tables.peer.name(),
        isolation: tables.peer.isolation().to_string(),
        config: tables.peer.config(),
        caveat: tables.peer.caveat(),
        load_rows,
        load_seconds,
        data_bytes_loaded,
        data_bytes_after: crate::report::dir_bytes(&dir),
        rss_added_bytes,
        runs,
        best,
        dana_over_best: None,
        consistency,
    };
    if report.runs.is_empty() {
        return Err(CliError("--peer-threads names no thread count".into()));
    }
    Ok(report)
}

fn print_types(r: &RunReport) {
    let mut t = TextTable::new(
        &[
            "type",
            "isolation",
            "committed",
            "rolled back",
            "conflicts",
            "abandoned",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
        ],
        2,
    );
    for ty in &r.types {
        t.row(vec![
            ty.name.to_string(),
            ty.isolation.clone(),
            thousands(ty.committed as f64),
            thousands(ty.rolled_back as f64),
            thousands(ty.conflicts as f64),
            thousands(ty.abandoned as f64),
            thousands(ty.latency.p50_us),
            thousands(ty.latency.p99_us),
            thousands(ty.latency.p999_us),
        ]);
    }
    print!("{}", t.render());
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| num(v, 2))
}

fn print_consistency(c: &check::Consistency) {
    println!(
        "consistency conditions {:?}: {} rows read, {} violations",
        c.conditions, c.rows, c.violations
    );
    for v in &c.first {
        println!("  VIOLATION {v}");
    }
}

fn print_dana(r: &DanaReport) {
    let run = &r.run;
    println!(
        "\ndana: {} transactions/s ({} per worker), tpmC {} (New-Orders per minute, \
         rollbacks included), {:.1} s, {} tasks on {} workers",
        thousands(run.transactions_per_s),
        thousands(run.transactions_per_s_per_thread),
        thousands(run.tpmc),
        run.seconds,
        r.tasks,
        r.workers
    );
    print_types(run);
    println!(
        "per transaction: page reads {}, page writes {}, disk reads {}, disk writes {}, \
         log bytes {}, log flushes {}, CPU {} µs (whole process)",
        num(r.page_reads_per_tx, 2),
        num(r.page_writes_per_tx, 2),
        opt(run.disk_reads_per_tx),
        opt(run.disk_writes_per_tx),
        num(r.log_bytes_per_tx, 0),
        num(r.log_flushes_per_tx, 3),
        num(run.cpu_us_per_tx, 1)
    );
    println!(
        "dirty write-back {}/s; data {} MiB after load, {} MiB after the run",
        thousands(r.writebacks_per_s),
        r.data_bytes_loaded >> 20,
        r.data_bytes_after >> 20
    );
    print_consistency(&r.consistency);
}

fn print_peer(p: &PeerReport) {
    println!(
        "\n{} ({}), isolation: {}; files {} MiB after load, {} MiB after the runs; \
         RSS +{} MiB",
        p.engine,
        p.config,
        p.isolation,
        p.data_bytes_loaded >> 20,
        p.data_bytes_after >> 20,
        p.rss_added_bytes >> 20
    );
    if let Some(c) = &p.caveat {
        println!("caveat: {c}");
    }
    let mut t = TextTable::new(
        &[
            "threads",
            "tx/s",
            "tpmC",
            "conflicts/tx",
            "New-Order p99 µs",
            "disk reads/tx",
            "disk writes/tx",
            "CPU µs/tx",
        ],
        1,
    );
    for r in &p.runs {
        let conflicts: u64 = r.types.iter().map(|t| t.conflicts).sum();
        t.row(vec![
            r.threads.to_string(),
            thousands(r.transactions_per_s),
            thousands(r.tpmc),
            num(conflicts as f64 / transactions(r).max(1) as f64, 2),
            thousands(r.types[Kind::NewOrder.index()].latency.p99_us),
            opt(r.disk_reads_per_tx),
            opt(r.disk_writes_per_tx),
            num(r.cpu_us_per_tx, 1),
        ]);
    }
    print!("{}", t.render());
    println!(
        "{} at its best ({} threads):",
        p.engine, p.runs[p.best].threads
    );
    print_types(&p.runs[p.best]);
    print_consistency(&p.consistency);
}

fn print_summary(r: &TpccReport) {
    if r.peers.is_empty() {
        return;
    }
    println!(
        "\nsummary ({} warehouses, durability {}, memory {} MiB each):",
        r.warehouses,
        r.durability,
        r.pool_bytes >> 20
    );
    let mut t = TextTable::new(
        &[
            "engine",
            "isolation",
            "clients",
            "tx/s",
            "tpmC",
            "dana / engine",
        ],
        2,
    );
    if let Some(d) = &r.dana {
        t.row(vec![
            "dana".into(),
            "serializable (Stock-Level: read committed)".into(),
            d.tasks.to_string(),
            thousands(d.run.transactions_per_s),
            thousands(d.run.tpmc),
            // dana's own row: no ratio to print (a literal 1.00 was).
            "-".into(),
        ]);
    }
    for p in &r.peers {
        let b = &p.runs[p.best];
        t.row(vec![
            p.engine.to_string(),
            p.isolation.clone(),
            b.clients.to_string(),
            thousands(b.transactions_per_s),
            thousands(b.tpmc),
            p.dana_over_best.map_or("-".into(), |v| num(v, 2))
                + if p.caveat.is_some() { " (*)" } else { "" },
        ]);
    }
    print!("{}", t.render());
    for p in r.peers.iter().filter(|p| p.caveat.is_some()) {
        println!("(*) {}: {}", p.engine, p.caveat.as_deref().unwrap_or(""));
    }
}

#[cfg(test)]
mod tests {
    use super::schema::{key, District, Table};
    use super::*;

    /// Each transactional peer compiled in: one warehouse loaded with
    /// the same loader, the mix run by 4 client threads with synced
    /// commits, the same consistency conditions checked.
    #[test]
    fn peers_run_the_same_mix_and_stay_consistent() {
        let compiled = crate::peers::available();
        for name in crate::peers::txn::TX_ENGINES {
            if !compiled.contains(&name) {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let cfg = crate::peers::PeerConfig {
                dir: dir.path().to_path_buf(),
                cache_bytes: 32 << 20,
                threads: 4,
                direct_io: false,
                durability: dana::Durability::Off,
                memtables_in_budget: true,
            };
            let tables = Arc::new(PeerTables {
                peer: crate::peers::txn::open_tx(name, &cfg).unwrap(),
            });
            let rows = load::load(&tables, 1, 4, 7, |_| {}).unwrap();
            assert!(rows > 600_000, "{name}: {rows} rows loaded");
            tables.peer.settle().unwrap();
            let mix = Mix {
                warehouses: 1,
                workers: 4,
                tasks_per_worker: 1,
                durability: Durability::Sync,
                seconds: 1.5,
                seed: 8,
                load_seed: 7,
            };
            let r = measure(&tables, mix, 4, None).unwrap();
            for t in &r.types {
                assert!(t.committed > 0, "{name}: no {} committed", t.name);
            }
            let c = check::check(&*tables).unwrap();
            assert_eq!(c.violations, 0, "{name}: {:?}", c.first);
            assert!(c.rows > 400_000, "{name}: {} rows checked", c.rows);
        }
    }

    /// One warehouse loaded, the mix run with the log synced, the
    /// conditions checked; then a district's YTD changed behind the
    /// transactions' back must be found (conditions 1 and 9).
    #[test]
    fn a_short_run_stays_consistent_and_a_planted_error_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default()
            .pool_bytes(64 << 20)
            .workers(2)
            .max_tasks_per_worker(64)
            .log_bytes(64 << 20)
            .durability(Durability::Sync);
        let (db, tables, rows, _) = create_and_load(dir.path(), opts, 1, 7, true).unwrap();
        assert!(rows > 600_000, "{rows} rows loaded");
        let r = run_mix(
            &tables,
            Mix {
                warehouses: 1,
                workers: 2,
                tasks_per_worker: 4,
                durability: Durability::Sync,
                seconds: 1.5,
                seed: 7,
                load_seed: 7,
            },
            None,
            None,
        )
        .unwrap();
        assert!(!r.timeline.is_empty(), "no second sampled");
        for k in Kind::ALL {
            assert!(
                r.counts.committed[k.index()].load(Ordering::Relaxed) > 0,
                "no {} committed",
                k.name()
            );
        }
        let c = check::check(&*tables).unwrap();
        assert_eq!(c.violations, 0, "{:?}", c.first);
        c.ok().unwrap();
        let t = tables.tree(Table::District);
        let k = key(&[1, 3]);
        let mut d = District::decode(&t.get(&k).unwrap().unwrap()).unwrap();
        d.ytd += 1;
        t.put(&k, &d.encode()).unwrap();
        let c = check::check(&*tables).unwrap();
        assert_eq!(c.violations, 2, "{:?}", c.first);
        assert!(c.first.iter().any(|v| v.starts_with("condition 1:")));
        assert!(c.first.iter().any(|v| v.starts_with("condition 9:")));
        assert!(c.ok().is_err());
        db.close().unwrap();
    }
}
