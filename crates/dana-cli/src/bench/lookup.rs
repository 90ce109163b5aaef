//! `dana bench lookup`: uniformly random point lookups on data many times
//! the buffer pool, the experiment the VLDB 2023 paper leads with.
//!
//! Steps: (1) load N records once (8-byte big-endian keys 0..N, values of
//! `--value-size` bytes derived from the key) under `--path`, reusing a
//! loaded database on later runs (on `--sim-devices`, in every
//! invocation); (2) sweep raw io_uring 4 KiB random reads over depths
//! 8-256 on the same files; (3) for each pool fraction, reopen with that
//! pool and run lookups from many tasks per worker, warm-up first; (4)
//! sweep again: the device limit is the lower of the two bests; (5) reopen
//! with the whole data set cached and measure the in-memory rate for
//! contrast.
//! Never: counts a lookup that returned a wrong value as a success.

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::sim::SimDisk;
use dana::{Db, Error, Options};
use serde::Serialize;

use super::diskstats::Disk;
use super::timeline::{write_timeline, Chart};
use super::{
    bar, clear_dana_files, data_files, describe_sweep, lower_best, sample, thousands, DepthSweep,
    DeviceLimit, LimitProbe, Measured, RunState,
};
use crate::report::Machine;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

const TREE: &str = "lookup";
const PAGE: usize = 4096;

/// Arguments of `dana bench lookup`.
#[derive(Args, Debug, Clone)]
pub struct LookupArgs {
    /// Directory of the database (created and loaded on first use).
    #[arg(long, default_value = "./dana-data/lookup")]
    pub path: PathBuf,
    /// Put the database on these files or block devices (repeatable;
    /// striped by page) instead of `dana.N` files in `--path`, which then
    /// holds only the load marker, peers and outputs. Block devices are
    /// overwritten.
    #[arg(long = "device")]
    pub devices: Vec<PathBuf>,
    /// Records to load (8-byte keys).
    #[arg(long, default_value_t = 20_000_000)]
    pub records: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 120)]
    pub value_size: usize,
    /// Buffer pool size as a fraction of the data; a list runs the
    /// out-of-memory sweep (e.g. 1,0.5,0.25,0.1,0.05,0.025).
    #[arg(long, value_delimiter = ',', default_value = "0.1")]
    pub pool_fraction: Vec<f64>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 20.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Warm-up seconds before each measured window.
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_seconds)]
    pub warmup: f64,
    /// Seconds of the in-memory contrast run (0: skip it).
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_seconds)]
    pub memory_seconds: f64,
    /// Simulated devices in place of files.
    #[command(flatten)]
    pub sim_args: super::SimArgs,
    /// The simulated devices of this invocation (made by `effective`).
    #[arg(skip)]
    pub sim: Option<Arc<Vec<Arc<SimDisk>>>>,
    /// Seconds of the device-limit measurement.
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_seconds)]
    pub limit_seconds: f64,
    /// Order of the load: `ascending` (fills leaves ~95%) or `random`
    /// (a permutation of the keys: the insert pattern of a real index).
    #[arg(long, default_value = "ascending")]
    pub load_order: LoadOrder,
    /// Tasks loading in parallel, each over its own key range. One task
    /// gives the fullest leaves (see docs/PERF.md).
    #[arg(long, default_value_t = 1)]
    pub load_tasks: usize,
    /// Engines to run in this invocation: dana and peers (rocksdb,
    /// wiredtiger, lmdb; each needs its cargo feature). Peers get the
    /// same records, the cache budget of dana's first pool fraction and
    /// direct I/O where they have it, and run at each of
    /// `--peer-threads`.
    #[arg(long, value_delimiter = ',', default_value = "dana")]
    pub engines: Vec<String>,
    /// Client thread counts each peer engine runs at (one synchronous
    /// lookup at a time per thread: its reads in flight); a ratio uses
    /// the peer's best count in the invocation. (Peers ran at
    /// `--workers` threads before: 2 reads in flight against dana's
    /// device budget; a review's finding.)
    #[arg(long, value_delimiter = ',', default_value = "2,8,32,128")]
    pub peer_threads: Vec<usize>,
    /// Small and short: 200k records, ~2 s per phase (for tests).
    #[arg(long)]
    pub quick: bool,
    /// Where the timeline CSV and SVG go (default: <path>/../bench-out).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Engine settings.
    #[command(flatten)]
    pub engine: super::EngineArgs,
    /// Output settings.
    #[command(flatten)]
    pub output: super::OutputArgs,
}

impl LookupArgs {
    fn effective(&self) -> CliResult<LookupArgs> {
        let mut a = self.clone();
        if a.quick {
            a.records = a.records.min(200_000);
            a.seconds = a.seconds.min(2.0);
            a.warmup = a.warmup.min(0.5);
            a.memory_seconds = a.memory_seconds.min(1.0);
            a.limit_seconds = a.limit_seconds.min(1.0);
        }
        if a.sim.is_none() {
            a.sim = a.sim_args.devices(sizes(&a).1)?;
        }
        Ok(a)
    }
}

/// (estimated bytes of the loaded data, capacity to give the devices).
fn sizes(a: &LookupArgs) -> (u64, u64) {
    // Leaves fill ~95% on an ascending load; size the devices with room.
    let per_record = (8 + a.value_size + 12) as u64;
    // Random inserts leave leaves ~2/3 full; ascending ones ~95%.
    let fill_pct = if a.load_order == LoadOrder::Random {
        60
    } else {
        85
    };
    let estimate = a.records * per_record * 100 / fill_pct + (8 << 20);
    (estimate, estimate * 3 / 2 + (64 << 20))
}

/// Key order of the load.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadOrder {
    /// Keys 0, 1, 2, ...
    Ascending,
    /// Keys in a pseudo-random permutation of 0..N.
    Random,
}

/// The i-th key of the load: i itself, or a permutation of 0..n
/// (multiplication by a large prime coprime to n, modulo n).
fn load_key(i: u64, n: u64, order: LoadOrder) -> u64 {
    match order {
        LoadOrder::Ascending => i,
        LoadOrder::Random => {
            let mut p: u64 = 0x9E37_79B9_7F4A_7C15 % n.max(1);
            while gcd(p, n) != 1 {
                p += 1;
            }
            ((i as u128 * p as u128) % n.max(1) as u128) as u64
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// How the data set was loaded.
#[derive(Debug, Clone, Serialize)]
pub struct LoadInfo {
    /// Records in the tree.
    pub records: u64,
    /// Value size.
    pub value_size: usize,
    /// True if this invocation loaded it (false: reused).
    pub loaded_now: bool,
    /// Load time, s (0 when reused).
    pub seconds: f64,
    /// Records per second while loading.
    pub records_per_s: f64,
    /// Bytes of pages in use (the data size).
    pub data_bytes: u64,
    /// Key order of the load.
    pub order: LoadOrder,
    /// Average leaf fill factor after the load (0 when reused).
    pub leaf_fill: f64,
    /// Leaf pages.
    pub leaves: u64,
}

/// One lookup run.
#[derive(Debug, Clone, Serialize)]
pub struct LookupRun {
    /// Pool size / data size.
    pub pool_fraction: f64,
    /// Pool bytes.
    pub pool_bytes: u64,
    /// Data bytes / pool bytes.
    pub data_over_pool: f64,
    /// Engine page reads per second / device limit (batched submission,
    /// the engine's own pattern).
    pub iops_vs_limit: Option<f64>,
    /// Engine page reads per second / device limit with each read
    /// submitted at once (fio's pattern).
    pub iops_vs_limit_each: Option<f64>,
    /// The window's figures.
    #[serde(flatten)]
    pub m: Measured,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LookupReport {
    /// Machine facts.
    pub machine: Machine,
    /// Workers.
    pub workers: usize,
    /// Lookup tasks per worker.
    pub tasks_per_worker: usize,
    /// Device budget (`auto` or the fixed requests in flight per device).
    pub device_budget: super::DeviceBudgetArg,
    /// Database files.
    pub files: Vec<PathBuf>,
    /// The data set.
    pub load: LoadInfo,
    /// The device limit: the lower of the best raw-read rates of the
    /// sweeps before and after the engine's runs (refills batched per
    /// reap, as the engine submits).
    pub device_limit: Option<DeviceLimit>,
    /// Raw reads at the best depth of the sweep before, each read
    /// submitted at once (as fio does).
    pub device_limit_each: Option<DeviceLimit>,
    /// The simulated devices (None: files): the device limit is then
    /// their configured rate, devices x iops.
    pub sim: Option<super::SimInfo>,
    /// The raw depth sweep before the engine's runs.
    pub sweep_before: Option<DepthSweep>,
    /// The same after them.
    pub sweep_after: Option<DepthSweep>,
    /// One run per pool fraction.
    pub runs: Vec<LookupRun>,
    /// With the whole data set cached.
    pub in_memory: Option<LookupRun>,
    /// With the whole data set cached, through the sync API: `--workers`
    /// plain threads calling `Tree::get` (served on the calling thread
    /// when every page is resident).
    pub in_memory_sync: Option<SyncRun>,
    /// Peer engines measured in the same invocation.
    pub peers: Vec<PeerRun>,
}

/// Lookups through the sync API.
#[derive(Debug, Clone, Serialize)]
pub struct SyncRun {
    /// Client threads.
    pub threads: usize,
    /// Lookups per second, all threads.
    pub ops_per_s: f64,
    /// Lookups per second per thread.
    pub ops_per_s_per_thread: f64,
    /// Process CPU µs per lookup.
    pub cpu_us_per_op: f64,
    /// Failed lookups.
    pub errors: u64,
}

/// A peer engine's lookups, measured the same way (process CPU, block
/// device counters) from `--workers` threads each doing one synchronous
/// lookup at a time.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    /// Engine name.
    pub engine: String,
    /// Why the numbers may not be comparable, if they are not.
    pub caveat: Option<String>,
    /// Cache budget given, bytes.
    pub cache_bytes: u64,
    /// Threads.
    pub threads: usize,
    /// Load time this invocation (0: reused).
    pub load_seconds: f64,
    /// Lookups in the window.
    pub ops: u64,
    /// Lookups per second.
    pub ops_per_s: f64,
    /// Failed or wrong lookups.
    pub errors: u64,
    /// Lookup latency.
    pub latency: super::Latency,
    /// Block device reads per second (/proc/diskstats).
    pub disk_reads_per_s: Option<f64>,
    /// Block device reads per lookup.
    pub disk_reads_per_op: Option<f64>,
    /// Process CPU µs per lookup.
    pub cpu_us_per_op: f64,
    /// dana's lookups/s (first pool fraction) / this engine's.
    pub dana_over_peer: Option<f64>,
    /// The engine's best thread count in the invocation (the run a
    /// ratio is quoted from).
    pub best: bool,
}

fn value_of(i: u64, out: &mut [u8]) {
    let k = i.to_le_bytes();
    for (j, b) in out.iter_mut().enumerate() {
        *b = k[j % 8] ^ (j as u8);
    }
}

fn options(a: &LookupArgs, pool_bytes: u64) -> Options {
    a.engine.options(pool_bytes)
}

/// Runs `dana bench lookup`.
pub fn run(args: &LookupArgs) -> CliResult<()> {
    let a = args.effective()?;
    if a.records == 0 {
        return Err(CliError("--records must be at least 1".into()));
    }
    if a.pool_fraction.iter().any(|f| !f.is_finite() || *f <= 0.0) {
        return Err(CliError("--pool-fraction values must be > 0".into()));
    }
    if a.sim.is_some() {
        if a.engines.iter().any(|e| e != "dana") {
            return Err(CliError(
                "peers run on files: --sim-devices runs dana alone".into(),
            ));
        }
        if a.engine.durability != dana::Durability::Off || !a.devices.is_empty() {
            return Err(CliError(
                "--sim-devices runs without a log and without --device".into(),
            ));
        }
    }
    crate::peers::check_engines(&a.engines)?;
    if a.peer_threads.is_empty() || a.peer_threads.iter().any(|&t| t == 0 || t > 4096) {
        return Err(CliError(
            "--peer-threads must name thread counts of 1 to 4,096".into(),
        ));
    }
    let load = ensure_loaded(&a)?;
    let files = db_files(&a);
    let disk = files.first().and_then(|f| Disk::of(f));
    if let Some(f) = files.first() {
        crate::report::note_memory_backed(f);
    }
    // The device's limit at its best depth, swept before and after the
    // engine's runs (the disk drifts); the engine is measured against the
    // lower of the two.
    let probe = LimitProbe::new(
        &files,
        load.data_bytes / files.len().max(1) as u64,
        a.limit_seconds,
    );
    let (sweep_before, limit_each) = probe.before()?;
    let mut runs = Vec::new();
    for &f in &a.pool_fraction {
        let pool = ((load.data_bytes as f64 * f) as u64).max(64 * PAGE as u64);
        let m = lookups(&a, &load, pool, a.seconds, a.warmup, false, disk.as_ref())?;
        runs.push(LookupRun {
            pool_fraction: f,
            pool_bytes: pool,
            data_over_pool: load.data_bytes as f64 / pool as f64,
            iops_vs_limit: None,
            iops_vs_limit_each: limit_each
                .as_ref()
                .map(|l| m.engine_reads_per_s / l.iops.max(1e-9)),
            m,
        });
    }
    let sweep_after = probe.sweep()?;
    let limit = lower_best(&sweep_before, &sweep_after);
    let sim = a.sim_args.info();
    let limit_iops = match &sim {
        Some(s) => Some(s.limit()),
        None => limit.as_ref().map(|l| l.iops),
    };
    for r in &mut runs {
        r.iops_vs_limit = limit_iops.map(|l| r.m.engine_reads_per_s / l.max(1e-9));
    }
    let mut in_memory_sync = None;
    let in_memory = if a.memory_seconds > 0.0 {
        let pool = load.data_bytes + load.data_bytes / 8 + (16 << 20);
        let (m, sync) = lookups_in_memory(&a, &load, pool, disk.as_ref())?;
        in_memory_sync = Some(sync);
        Some(LookupRun {
            pool_fraction: pool as f64 / load.data_bytes as f64,
            pool_bytes: pool,
            data_over_pool: load.data_bytes as f64 / pool as f64,
            iops_vs_limit: None,
            iops_vs_limit_each: None,
            m,
        })
    } else {
        None
    };
    let mut peers = Vec::new();
    for name in a.engines.iter().filter(|e| e.as_str() != "dana") {
        let cache = runs.first().map_or(load.data_bytes / 10, |r| r.pool_bytes);
        let first = peers.len();
        for mut p in peer_runs(&a, name, &load, cache)? {
            p.dana_over_peer = runs.first().map(|r| r.m.ops_per_s / p.ops_per_s.max(1e-9));
            peers.push(p);
        }
        let best =
            (first..peers.len()).max_by(|&x, &y| peers[x].ops_per_s.total_cmp(&peers[y].ops_per_s));
        if let Some(b) = best {
            peers[b].best = true;
        }
    }
    let report = LookupReport {
        machine: Machine::probe(),
        workers: a.engine.workers,
        tasks_per_worker: a.engine.tasks_per_worker,
        device_budget: a.engine.device_budget,
        files,
        load,
        device_limit: limit,
        device_limit_each: limit_each,
        sweep_before,
        sweep_after,
        sim,
        runs,
        in_memory,
        in_memory_sync,
        peers,
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

/// Loads (or reuses) the data set in a peer engine and measures lookups
/// at each of `--peer-threads`.
fn peer_runs(
    a: &LookupArgs,
    name: &str,
    load: &LoadInfo,
    cache_bytes: u64,
) -> CliResult<Vec<PeerRun>> {
    use crate::peers::{self, PeerConfig};
    // `threads` sizes the engines' background work: one per core (as
    // ycsb and tpcc do; sized for the most client threads, WiredTiger ran
    // 20 eviction threads on 2 cores).
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let cfg = PeerConfig {
        dir: a.path.join("peers"),
        cache_bytes: cache_bytes as usize,
        threads: cores,
        direct_io: true,
        durability: dana::Durability::Off,
        memtables_in_budget: false,
    };
    let engine = peers::open(name, &cfg)?;
    // The peers' own disk (their files may not be on dana's device),
    // found once the engine made its directory.
    let disk = Disk::of(&cfg.dir.join(name));
    let pb = bar(
        a.output.quiet || a.output.json,
        load.records,
        &format!("loading {name}"),
    );
    let t0 = Instant::now();
    engine.load(
        load.records,
        load.value_size,
        peers::LoadKeys::PLAIN,
        &value_of,
        &|d| pb.set_position(d),
    )?;
    let load_seconds = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let mut out = Vec::new();
    for &threads in &a.peer_threads {
        let mut p = peer_window(a, name, &*engine, load, threads, disk.as_ref())?;
        p.cache_bytes = cache_bytes;
        p.load_seconds = if out.is_empty() { load_seconds } else { 0.0 };
        out.push(p);
    }
    Ok(out)
}

/// One measured window of lookups on a loaded peer engine from `threads`
/// threads.
fn peer_window(
    a: &LookupArgs,
    name: &str,
    engine: &dyn crate::peers::PeerEngine,
    load: &LoadInfo,
    threads: usize,
    disk: Option<&Disk>,
) -> CliResult<PeerRun> {
    let state = RunState::default();
    let (warmup, window) = (
        Duration::from_secs_f64(a.warmup),
        Duration::from_secs_f64(a.seconds),
    );
    let measured = std::thread::scope(|s| {
        for t in 0..threads {
            let state = &state;
            s.spawn(move || {
                let mut rng = XorShift::new(0xBEEF + t as u64);
                let (mut out, mut want) = (Vec::new(), vec![0u8; load.value_size]);
                while !state.stop.load(Ordering::Relaxed) {
                    let i = rng.below(load.records);
                    value_of(i, &mut want);
                    let t0 = Instant::now();
                    let r = engine.get(&i.to_be_bytes(), &mut out);
                    state.latency.record(t0.elapsed());
                    match r {
                        Ok(true) if out == want => {}
                        Ok(true) => state.fail(format!("{name}: key {i}: wrong value")),
                        Ok(false) => state.fail(format!("{name}: key {i}: missing")),
                        Err(e) => state.fail(format!("{name}: key {i}: {e}")),
                    }
                    state.ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let pb = bar(
            a.output.quiet || a.output.json,
            (warmup + window).as_millis() as u64,
            &format!("{name} x{threads}"),
        );
        std::thread::sleep(warmup);
        let (ops0, cpu0, lat0, d0) = (
            state.ops.load(Ordering::Relaxed),
            crate::report::process_cpu_seconds(),
            state.latency.snapshot(),
            disk.and_then(Disk::read),
        );
        let t0 = Instant::now();
        while t0.elapsed() < window {
            std::thread::sleep(Duration::from_millis(200));
            pb.set_position((warmup + t0.elapsed()).as_millis() as u64);
        }
        let secs = t0.elapsed().as_secs_f64();
        let ops = state.ops.load(Ordering::Relaxed) - ops0;
        let cpu = crate::report::process_cpu_seconds() - cpu0;
        let lat = state.latency.snapshot().since(&lat0);
        let d = match (disk.and_then(Disk::read), d0) {
            (Some(e), Some(s)) => Some(e.since(&s)),
            _ => None,
        };
        state.stop.store(true, Ordering::Relaxed);
        pb.finish_and_clear();
        (secs, ops, cpu, lat, d)
    });
    let (secs, ops, cpu, lat, d) = measured;
    Ok(PeerRun {
        engine: name.to_string(),
        caveat: engine.caveat(),
        cache_bytes: 0,
        threads,
        load_seconds: 0.0,
        ops,
        ops_per_s: ops as f64 / secs,
        errors: state.errors.load(Ordering::Relaxed),
        latency: super::Latency::from(&lat),
        disk_reads_per_s: d.map(|d| d.reads as f64 / secs),
        disk_reads_per_op: d.map(|d| d.reads as f64 / ops.max(1) as f64),
        cpu_us_per_op: if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 },
        dana_over_peer: None,
        best: false,
    })
}

/// Opens the database: the simulated devices, files in `--path`, or the
/// `--device`s.
fn open_db(a: &LookupArgs, opts: Options, create: bool) -> CliResult<Db> {
    if let Some(sim) = &a.sim {
        return super::open_sim(sim, opts, create);
    }
    Ok(if a.devices.is_empty() {
        Db::open(&a.path, opts)?
    } else {
        Db::open_devices(&a.devices, opts, create)?
    })
}

/// The database's files or devices.
fn db_files(a: &LookupArgs) -> Vec<PathBuf> {
    if a.sim.is_some() {
        Vec::new()
    } else if a.devices.is_empty() {
        data_files(&a.path)
    } else {
        a.devices.clone()
    }
}

/// Loads the data set unless a matching one is there.
fn ensure_loaded(a: &LookupArgs) -> CliResult<LoadInfo> {
    let marker = a.path.join("LOADED");
    let want = format!(
        "records={} value_size={} page_size={PAGE}\n",
        a.records, a.value_size
    );
    if a.sim.is_none() && std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        let db = open_db(a, options(a, 16 << 20), false)?;
        let pool = db.pool().clone();
        let space = db.block_on(async move { pool.space().await })??;
        db.close()?;
        return Ok(LoadInfo {
            records: a.records,
            value_size: a.value_size,
            loaded_now: false,
            seconds: 0.0,
            records_per_s: 0.0,
            data_bytes: space.next_unused * PAGE as u64,
            order: a.load_order,
            leaf_fill: 0.0,
            leaves: 0,
        });
    }
    std::fs::create_dir_all(&a.path).context(format!("creating {}", a.path.display()))?;
    if a.devices.is_empty() && a.sim.is_none() {
        clear_dana_files(&a.path)?;
    }
    let (estimate, capacity) = sizes(a);
    let pool = (estimate + estimate / 4).min(12 << 30);
    let db = open_db(a, options(a, pool).capacity_bytes(capacity), true)?;
    // The load is a bulk path: unlogged writes, then a flush.
    let tree = db.create_tree(TREE)?.unlogged_btree().clone();
    let (order, n) = (a.load_order, a.records);
    let record: super::RecordFn = Arc::new(move |j, v| {
        let i = load_key(j, n, order);
        value_of(i, v);
        i.to_be_bytes()
    });
    let seconds = super::load_records(
        &db,
        &tree,
        a.records,
        a.load_tasks as u64,
        a.value_size,
        record,
        a.output.quiet || a.output.json,
    )?;

    let pool = db.pool().clone();
    let space = db.block_on(async move { pool.space().await })??;
    let (leaves, leaf_fill) = leaf_fill(&db, &tree)?;
    db.close()?;
    if a.sim.is_none() {
        std::fs::write(&marker, want).context("writing the load marker")?;
    }
    Ok(LoadInfo {
        records: a.records,
        value_size: a.value_size,
        loaded_now: true,
        seconds,
        records_per_s: a.records as f64 / seconds,
        data_bytes: space.next_unused * PAGE as u64,
        order: a.load_order,
        leaf_fill,
        leaves,
    })
}

/// (leaf pages, average leaf fill factor) of a tree.
fn leaf_fill(db: &Db, tree: &dana::btree::BTree) -> CliResult<(u64, f64)> {
    let t = tree.clone();
    let (leaves, sum) = db.block_on(async move {
        let (mut leaves, mut sum) = (0u64, 0.0f64);
        t.walk(|pid, bytes| {
            let n = dana::btree::node::Node::new(bytes).map_err(|c| c.into_error(pid))?;
            if n.is_leaf() {
                leaves += 1;
                sum += n.fill_factor();
            }
            Ok(())
        })
        .await?;
        Ok::<_, Error>((leaves, sum))
    })??;
    Ok((leaves, if leaves > 0 { sum / leaves as f64 } else { 0.0 }))
}

/// The in-memory contrast: the async run, then the sync API from plain
/// threads on the same warm pool.
fn lookups_in_memory(
    a: &LookupArgs,
    load: &LoadInfo,
    pool_bytes: u64,
    disk: Option<&Disk>,
) -> CliResult<(Measured, SyncRun)> {
    let db = open_db(a, options(a, pool_bytes), false)?;
    let m = lookups_on(
        &db,
        a,
        load,
        pool_bytes,
        a.memory_seconds,
        a.warmup.min(1.0),
        true,
        disk,
    )?;
    let tree = db.tree(TREE)?;
    let state = RunState::default();
    let window = Duration::from_secs_f64(a.memory_seconds);
    let (ops, secs, cpu) = std::thread::scope(|s| {
        for t in 0..a.engine.workers {
            let (tree, state) = (&tree, &state);
            s.spawn(move || {
                let mut rng = XorShift::new(0xC0FFEE + t as u64);
                let mut want = vec![0u8; load.value_size];
                while !state.stop.load(Ordering::Relaxed) {
                    let i = rng.below(load.records);
                    value_of(i, &mut want);
                    match tree.get(&i.to_be_bytes()) {
                        Ok(Some(v)) if v == want => {}
                        other => state.fail(format!("key {i}: {other:?}")),
                    }
                    state.ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let (o0, c0, t0) = (
            state.ops.load(Ordering::Relaxed),
            crate::report::process_cpu_seconds(),
            Instant::now(),
        );
        std::thread::sleep(window);
        let r = (
            state.ops.load(Ordering::Relaxed) - o0,
            t0.elapsed().as_secs_f64(),
            crate::report::process_cpu_seconds() - c0,
        );
        state.stop.store(true, Ordering::Relaxed);
        r
    });
    db.close()?;
    let per_s = ops as f64 / secs;
    Ok((
        m,
        SyncRun {
            threads: a.engine.workers,
            ops_per_s: per_s,
            ops_per_s_per_thread: per_s / a.engine.workers.max(1) as f64,
            cpu_us_per_op: if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 },
            errors: state.errors.load(Ordering::Relaxed),
        },
    ))
}

/// One run of lookups with a pool of `pool_bytes`.
fn lookups(
    a: &LookupArgs,
    load: &LoadInfo,
    pool_bytes: u64,
    seconds: f64,
    warmup: f64,
    warm_all: bool,
    disk: Option<&Disk>,
) -> CliResult<Measured> {
    let db = open_db(a, options(a, pool_bytes), false)?;
    let m = lookups_on(&db, a, load, pool_bytes, seconds, warmup, warm_all, disk)?;
    db.close()?;
    Ok(m)
}

/// Lookups on an open database.
#[allow(clippy::too_many_arguments)]
fn lookups_on(
    db: &Db,
    a: &LookupArgs,
    load: &LoadInfo,
    pool_bytes: u64,
    seconds: f64,
    warmup: f64,
    warm_all: bool,
    disk: Option<&Disk>,
) -> CliResult<Measured> {
    let tree = db.tree(TREE)?.unlogged_btree().clone();
    if warm_all {
        // Read every leaf once (the cursor reads ahead).
        let t = tree.clone();
        let n = db.block_on(async move { t.count(Bound::Unbounded, Bound::Unbounded).await })??;
        if n != load.records {
            return Err(CliError(format!(
                "tree holds {n} records, expected {}",
                load.records
            )));
        }
    }
    let state = Arc::new(RunState::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let tasks = a.engine.workers * a.engine.tasks_per_worker;
    for t in 0..tasks {
        let (tree, state, tx) = (tree.clone(), state.clone(), tx.clone());
        let (records, vs) = (load.records, load.value_size);
        db.spawn_on(t % a.engine.workers, async move {
            let mut rng = XorShift::new(0x5EED + t as u64);
            let mut want = vec![0u8; vs];
            while !state.stop.load(Ordering::Relaxed) {
                let i = rng.below(records);
                value_of(i, &mut want);
                let t0 = Instant::now();
                let r = tree
                    .get_with(&i.to_be_bytes(), |v| v == want.as_slice())
                    .await;
                state.latency.record(t0.elapsed());
                match r {
                    Ok(Some(true)) => {}
                    Ok(Some(false)) => state.fail(format!("key {i}: wrong value")),
                    Ok(None) => state.fail(format!("key {i}: missing")),
                    Err(e) => state.fail(format!("key {i}: {e}")),
                }
                state.ops.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        })?;
    }
    drop(tx);
    let total = Duration::from_secs_f64(warmup + seconds);
    let what = format!(
        "lookups, pool {:.0} MiB{}",
        pool_bytes as f64 / (1 << 20) as f64,
        if warm_all { " (in memory)" } else { "" }
    );
    let pb = bar(
        a.output.quiet || a.output.json,
        total.as_millis() as u64,
        &what,
    );
    let m = sample(
        db,
        &state,
        Duration::from_secs_f64(warmup),
        Duration::from_secs_f64(seconds),
        PAGE,
        disk,
        Some(&pb),
    );
    pb.finish_and_clear();
    state.stop.store(true, Ordering::Relaxed);
    for _ in 0..tasks {
        rx.recv_timeout(Duration::from_secs(30))
            .map_err(|_| CliError("a lookup task did not stop".into()))?;
    }
    Ok(m)
}

fn write_outputs(a: &LookupArgs, r: &LookupReport) -> CliResult<()> {
    let out = a.out.clone().unwrap_or_else(|| {
        a.path
            .parent()
            .map_or(PathBuf::from("."), |p| p.to_path_buf())
            .join("bench-out")
    });
    std::fs::create_dir_all(&out).context(format!("creating {}", out.display()))?;
    for run in &r.runs {
        let stem = format!("lookup-pool{:.3}", run.pool_fraction);
        let title = format!(
            "dana bench lookup: {} records, pool {:.1}% of data",
            r.load.records,
            run.pool_fraction * 100.0
        );
        write_timeline(&out, &stem, &title, "lookups/s", &run.m.timeline)?;
    }
    if r.runs.len() > 1 {
        let chart = Chart {
            title: "dana bench lookup: out-of-memory sweep",
            x_label: "data size / pool size (log scale)",
            xs: r.runs.iter().map(|x| x.data_over_pool).collect(),
            series: vec![
                ("lookups/s", r.runs.iter().map(|x| x.m.ops_per_s).collect()),
                (
                    "device reads/s",
                    r.runs.iter().map(|x| x.m.engine_reads_per_s).collect(),
                ),
            ],
            log_x: true,
        };
        std::fs::write(out.join("lookup-sweep.svg"), chart.svg())
            .context("writing the sweep SVG")?;
    }
    Ok(())
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("-".into(), f)
}

/// The human report.
pub fn render(r: &LookupReport) -> String {
    let mut s = String::new();
    let l = &r.load;
    s += &format!(
        "dana bench lookup: {} records, {}-byte values, data {:.2} GiB in {} file(s); {} workers x {} tasks; device budget {}\n",
        thousands(l.records as f64),
        l.value_size,
        l.data_bytes as f64 / (1u64 << 30) as f64,
        r.files.len(),
        r.workers,
        r.tasks_per_worker,
        r.device_budget
    );
    if l.loaded_now {
        s += &format!(
            "load ({:?} keys): {:.1} s, {} records/s; {} leaves, average leaf fill {:.1}%\n",
            l.order,
            l.seconds,
            thousands(l.records_per_s),
            thousands(l.leaves as f64),
            l.leaf_fill * 100.0
        );
    } else {
        s += "load: reused the loaded database\n";
    }
    if let Some(sim) = &r.sim {
        s += &sim.describe();
    }
    for (when, sw) in [("before", &r.sweep_before), ("after", &r.sweep_after)] {
        if let Some(sw) = sw {
            s += &format!("raw depth sweep {when} the runs: {}\n", describe_sweep(sw));
        }
    }
    if let Some(d) = &r.device_limit {
        s += &format!(
            "device limit (the lower best of the two sweeps; raw io_uring 4 KiB random reads, depth {}): {} reads/s, mean {:.0} us, {:.2} CPU us/read\n",
            d.depth,
            thousands(d.iops),
            d.lat_mean_us,
            d.cpu_us_per_io
        );
    }
    if let Some(d) = &r.device_limit_each {
        let ratio = r.runs.first().map_or(String::new(), |x| {
            format!(
                "; dana = {:.0}% of it",
                x.m.engine_reads_per_s / d.iops.max(1e-9) * 100.0
            )
        });
        s += &format!(
            "device limit, each read submitted at once (fio's pattern): {} reads/s, mean {:.0} us, {:.2} CPU us/read{ratio}\n",
            thousands(d.iops),
            d.lat_mean_us,
            d.cpu_us_per_io
        );
    }
    s += "\n pool/data  data/pool   lookups/s  dev reads/s  vs limit  disk reads/s  reads/lookup  hit rate  p50 us  p99 us  p99.9 us  CPU us/lookup  CPU us/IO\n";
    let rows = r
        .runs
        .iter()
        .map(|x| ("", x))
        .chain(r.in_memory.iter().map(|x| (" (in memory)", x)));
    for (tag, x) in rows {
        let m = &x.m;
        s += &format!(
            " {:>8.3}  {:>9.1}  {:>10}  {:>11}  {:>8}  {:>12}  {:>12.2}  {:>8.3}  {:>6.0}  {:>6.0}  {:>8.0}  {:>13.2}  {:>9.2}{}\n",
            x.pool_fraction,
            x.data_over_pool,
            thousands(m.ops_per_s),
            thousands(m.engine_reads_per_s),
            opt(x.iops_vs_limit, |v| format!("{:.0}%", v * 100.0)),
            opt(m.disk_reads_per_s, thousands),
            m.reads_per_op,
            m.hit_rate,
            m.latency.p50_us,
            m.latency.p99_us,
            m.latency.p999_us,
            m.cpu_us_per_op,
            m.cpu_us_per_io,
            tag
        );
        s += &format!(
            "            {} lookups per second of whole-process CPU; miss p99 {:.0} us (queued in the engine p99 {:.0} us, device p99 {:.0} us); device budget {}\n",
            thousands(m.ops_per_cpu_s),
            m.miss.p99_us,
            m.miss_queued.p99_us,
            m.miss_device.p99_us,
            m.budget.describe()
        );
    }
    if let Some(sy) = &r.in_memory_sync {
        s += &format!(
            "in memory, sync API ({} plain threads calling Tree::get): {} lookups/s, {} per thread, {:.2} CPU us/lookup{}\n",
            sy.threads,
            thousands(sy.ops_per_s),
            thousands(sy.ops_per_s_per_thread),
            sy.cpu_us_per_op,
            if sy.errors > 0 { format!(", {} ERRORS", sy.errors) } else { String::new() }
        );
    }
    if !r.peers.is_empty() {
        s += "\n peers (* = the engine's best thread count, which its ratio uses):\n";
        s += " engine      threads  cache MiB   lookups/s  disk reads/s  reads/lookup  p50 us  p99 us  p99.9 us  CPU us/lookup  dana/peer\n";
        for p in &r.peers {
            s += &format!(
                " {:<10}  {:>6}{}  {:>9}  {:>10}  {:>12}  {:>12}  {:>6.0}  {:>6.0}  {:>8.0}  {:>13.2}  {:>9}\n",
                p.engine,
                p.threads,
                if p.best { "*" } else { " " },
                p.cache_bytes >> 20,
                thousands(p.ops_per_s),
                opt(p.disk_reads_per_s, thousands),
                opt(p.disk_reads_per_op, |v| format!("{v:.2}")),
                p.latency.p50_us,
                p.latency.p99_us,
                p.latency.p999_us,
                p.cpu_us_per_op,
                opt(p.dana_over_peer, |v| format!("{v:.1}x"))
            );
            if let Some(c) = p.caveat.as_ref().filter(|_| p.best) {
                s += &format!("   {}: {c}\n", p.engine);
            }
            if p.errors > 0 {
                s += &format!("   {}: {} failed lookups\n", p.engine, p.errors);
            }
        }
    }
    for x in &r.runs {
        let m = &x.m;
        s += &format!(
            "\npool {:.1}% of data: where a miss's time goes (mean / p99 us): queued in engine {:.0} / {:.0}, kernel+device {:.0} / {:.0}, waiting to resume {:.0} / {:.0}; whole miss {:.0} / {:.0}\n",
            x.pool_fraction * 100.0,
            m.miss_queued.mean_us,
            m.miss_queued.p99_us,
            m.miss_device.mean_us,
            m.miss_device.p99_us,
            m.miss_resume.mean_us,
            m.miss_resume.p99_us,
            m.miss.mean_us,
            m.miss.p99_us
        );
        if m.errors > 0 {
            s += &format!(
                "ERRORS: {} failed lookups; first: {}\n",
                m.errors,
                m.first_error.as_deref().unwrap_or("?")
            );
        }
    }
    s += &format!(
        "\nnotes: CPU = getrusage(RUSAGE_SELF) user+sys over the window, all threads; dev reads = engine page reads; disk reads = /proc/diskstats of {}; MB = 10^6 bytes.{}\n",
        r.files
            .first()
            .and_then(|f| Disk::of(f))
            .map_or("?".into(), |d| d.name),
        r.files
            .first()
            .and_then(|f| crate::report::memory_file_system(f))
            .map_or(String::new(), |fs| format!(
                " The files are on {fs}: memory-backed figures, not a disk's."
            ))
    );
    s
}
