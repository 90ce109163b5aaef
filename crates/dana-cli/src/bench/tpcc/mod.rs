//! `dana bench tpcc`: TPC-C on dana: the nine tables and two secondary
//! indexes as trees, the five transactions in the standard mix, each one
//! dana transaction (serializable but Stock-Level, which the spec lets
//! run at read committed), with the log on, then the spec's consistency
//! conditions over the whole database.
//!
//! Owns: the command (arguments, load, run, report). The tables live in
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
use super::{thousands, Latency};
use crate::report::{num, process_cpu_seconds, Machine, Table as TextTable};
use crate::{CliError, CliResult, Context};
use gen::{Gen, NuRandC};
use kv::{DanaTables, KvTx, TxError};
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
    /// with a checkpoint.
    #[arg(long, default_value = "sync", value_parser = super::parse_durability)]
    pub durability: Durability,
    /// Seconds of the measured run.
    #[arg(long, default_value_t = 10.0)]
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

/// The whole report.
#[derive(Debug, Serialize)]
pub struct TpccReport {
    pub machine: Machine,
    pub warehouses: u32,
    pub workers: usize,
    pub tasks: usize,
    pub durability: String,
    pub pool_bytes: u64,
    pub data_bytes_loaded: u64,
    pub data_bytes_after: u64,
    pub load_rows: u64,
    pub load_seconds: f64,
    pub seconds: f64,
    pub transactions_per_s: f64,
    pub tpmc: f64,
    pub types: Vec<TypeReport>,
    pub page_reads_per_tx: f64,
    pub page_writes_per_tx: f64,
    pub disk_reads_per_tx: Option<f64>,
    pub disk_writes_per_tx: Option<f64>,
    pub log_bytes_per_tx: f64,
    pub log_flushes_per_tx: f64,
    pub writebacks_per_s: f64,
    pub cpu_us_per_tx: f64,
    pub consistency: check::Consistency,
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
async fn run_one(
    tables: &Arc<DanaTables>,
    input: &Input,
    durability: Durability,
    history_id: u64,
    counts: &Counts,
    on_order: Option<&OrderHook>,
) -> Result<(), String> {
    let k = input.kind();
    let began = Instant::now();
    for _ in 0..MAX_ATTEMPTS {
        let mut tx = tables.begin(isolation_of(k), durability);
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
                dana::sched::yield_now().await;
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
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).context(format!("creating {}", path.display()))?;
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
}

/// The key part of a History row written by the run with `seed`, task
/// `task`, its `n`th transaction.
fn history_id(seed: u64, task: usize, n: u64) -> u64 {
    debug_assert!(task < 1 << 12 && n < 1 << 28);
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
}

/// Runs the mix for `m.seconds` with `m.workers * m.tasks_per_worker`
/// tasks; `on_order` hears of every New-Order acknowledged.
pub fn run_mix(
    tables: &Arc<DanaTables>,
    m: Mix,
    on_order: Option<OrderHook>,
) -> CliResult<RunResult> {
    let Mix {
        warehouses,
        workers,
        tasks_per_worker,
        durability,
        seconds,
        seed,
    } = m;
    let db = &tables.db;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let counts = Arc::new(Counts::default());
    let load_c = NuRandC::load(seed);
    let run_c = NuRandC::run(load_c, seed);
    let tasks = workers * tasks_per_worker;
    let started = Instant::now();
    for t in 0..tasks {
        let (tables, stop, done, failure, counts, on_order) = (
            tables.clone(),
            stop.clone(),
            done.clone(),
            failure.clone(),
            counts.clone(),
            on_order.clone(),
        );
        db.spawn_on(t % workers, async move {
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
    while started.elapsed().as_secs_f64() < seconds && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
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
    if let Some(m) = failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(CliError(format!("a TPC-C transaction failed: {m}")));
    }
    Ok(RunResult { counts, seconds })
}

fn options(a: &TpccArgs, pool: u64, warehouses: u32) -> Options {
    Options::default()
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
    if a.workers * a.tasks_per_worker >= 1 << 12 || a.workers * a.tasks_per_worker == 0 {
        return Err(CliError(
            "--workers x --tasks-per-worker must be 1 to 4,095 (history ids)".into(),
        ));
    }
    if !quiet {
        println!(
            "dana bench tpcc: {warehouses} warehouses (about {} MiB), pool {} MiB, \
             durability {:?}, {} workers x {} tasks, {} s",
            (u64::from(warehouses) * WAREHOUSE_BYTES) >> 20,
            pool >> 20,
            a.durability,
            a.workers,
            a.tasks_per_worker,
            a.seconds
        );
    }
    let (db, tables, load_rows, load_seconds) = create_and_load(
        &a.path,
        options(a, pool, warehouses),
        warehouses,
        a.seed,
        quiet,
    )?;
    let page = db.pool().page_size() as u64;
    let loaded_bytes = db.pool_stats().array_pages * page;
    if !quiet {
        println!(
            "loaded {} rows in {:.1} s ({} rows/s); data {} MiB ({:.1}x the pool)",
            thousands(load_rows as f64),
            load_seconds,
            thousands(load_rows as f64 / load_seconds.max(1e-9)),
            loaded_bytes >> 20,
            loaded_bytes as f64 / pool as f64
        );
    }
    let disk = Disk::of(&a.path);
    let (p0, w0, d0, c0) = (
        db.pool_stats(),
        db.wal_stats().unwrap_or_default(),
        disk.as_ref().and_then(Disk::read),
        process_cpu_seconds(),
    );
    let mix = Mix {
        warehouses,
        workers: a.workers,
        tasks_per_worker: a.tasks_per_worker,
        durability: a.durability,
        seconds: a.seconds,
        seed: a.seed,
    };
    let r = run_mix(&tables, mix, None)?;
    let (p1, w1, d1, c1) = (
        db.pool_stats(),
        db.wal_stats().unwrap_or_default(),
        disk.as_ref().and_then(Disk::read),
        process_cpu_seconds(),
    );
    let after_bytes = p1.array_pages * page;
    let c = &r.counts;
    let txs = total(&c.committed) + total(&c.rolled_back);
    let per = |v: u64| v as f64 / txs.max(1) as f64;
    let disk_delta = match (d0, d1) {
        (Some(a0), Some(a1)) => Some(a1.since(&a0)),
        _ => None,
    };
    let types: Vec<TypeReport> = Kind::ALL
        .iter()
        .map(|&k| {
            let (i, n) = (k.index(), |a: &[AtomicU64; 5]| {
                a[k.index()].load(Ordering::Relaxed)
            });
            TypeReport {
                name: k.name(),
                isolation: isolation_of(k).to_string(),
                committed: n(&c.committed),
                rolled_back: n(&c.rolled_back),
                conflicts: n(&c.conflicts),
                abandoned: n(&c.abandoned),
                latency: Latency::from(&c.latency[i].snapshot()),
            }
        })
        .collect();
    if !quiet {
        println!("checking the consistency conditions ...");
    }
    let consistency = check::check(&tables)?;
    let report = TpccReport {
        machine: Machine::probe(),
        warehouses,
        workers: a.workers,
        tasks: a.workers * a.tasks_per_worker,
        durability: format!("{:?}", a.durability),
        pool_bytes: pool,
        data_bytes_loaded: loaded_bytes,
        data_bytes_after: after_bytes,
        load_rows,
        load_seconds,
        seconds: r.seconds,
        transactions_per_s: txs as f64 / r.seconds,
        tpmc: (c.committed[Kind::NewOrder.index()].load(Ordering::Relaxed)
            + c.rolled_back[Kind::NewOrder.index()].load(Ordering::Relaxed)) as f64
            / r.seconds
            * 60.0,
        types,
        page_reads_per_tx: per(p1.reads - p0.reads),
        page_writes_per_tx: per(p1.writes - p0.writes),
        disk_reads_per_tx: disk_delta.map(|d| per(d.reads)),
        disk_writes_per_tx: disk_delta.map(|d| per(d.writes)),
        log_bytes_per_tx: per(w1.bytes - w0.bytes),
        log_flushes_per_tx: per(w1.flushes - w0.flushes),
        writebacks_per_s: (p1.writebacks - p0.writebacks) as f64 / r.seconds,
        cpu_us_per_tx: (c1 - c0) * 1e6 / txs.max(1) as f64,
        consistency,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print_report(&report);
    }
    db.close()?;
    report.consistency.ok()
}

fn print_report(r: &TpccReport) {
    println!(
        "\n{} transactions/s, tpmC {} (New-Orders per minute, rollbacks included), {:.1} s, \
         {} tasks",
        thousands(r.transactions_per_s),
        thousands(r.tpmc),
        r.seconds,
        r.tasks
    );
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
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| num(v, 2));
    println!(
        "per transaction: page reads {}, page writes {}, disk reads {}, disk writes {}, \
         log bytes {}, log flushes {}, CPU {} µs (whole process)",
        num(r.page_reads_per_tx, 2),
        num(r.page_writes_per_tx, 2),
        opt(r.disk_reads_per_tx),
        opt(r.disk_writes_per_tx),
        num(r.log_bytes_per_tx, 0),
        num(r.log_flushes_per_tx, 3),
        num(r.cpu_us_per_tx, 1)
    );
    println!(
        "dirty write-back {}/s; data {} MiB after load, {} MiB after the run",
        thousands(r.writebacks_per_s),
        r.data_bytes_loaded >> 20,
        r.data_bytes_after >> 20
    );
    println!(
        "consistency conditions {:?}: {} rows read, {} violations",
        r.consistency.conditions, r.consistency.rows, r.consistency.violations
    );
    for v in &r.consistency.first {
        println!("  VIOLATION {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::schema::{key, District, Table};
    use super::*;

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
            },
            None,
        )
        .unwrap();
        for k in Kind::ALL {
            assert!(
                r.counts.committed[k.index()].load(Ordering::Relaxed) > 0,
                "no {} committed",
                k.name()
            );
        }
        let c = check::check(&tables).unwrap();
        assert_eq!(c.violations, 0, "{:?}", c.first);
        c.ok().unwrap();
        let t = tables.tree(Table::District);
        let k = key(&[1, 3]);
        let mut d = District::decode(&t.get(&k).unwrap().unwrap()).unwrap();
        d.ytd += 1;
        t.put(&k, &d.encode()).unwrap();
        let c = check::check(&tables).unwrap();
        assert_eq!(c.violations, 2, "{:?}", c.first);
        assert!(c.first.iter().any(|v| v.starts_with("condition 1:")));
        assert!(c.first.iter().any(|v| v.starts_with("condition 9:")));
        assert!(c.ok().is_err());
        db.close().unwrap();
    }
}
