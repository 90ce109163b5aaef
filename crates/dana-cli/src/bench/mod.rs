//! `dana bench`: workloads on the engine, each measured next to the
//! device's own limit in the same invocation.
//!
//! Owns: what the benchmarks share: the device-limit measurement (raw
//! io_uring random reads on the same files, swept over depths before and
//! after the engine's run: [`LimitProbe`]), simulated devices in place of
//! files ([`SimArgs`]), the
//! per-second sampler that turns engine, kernel and CPU counters into a
//! timeline and a measured window, and the report types. Each workload
//! lives in its own module. Never: reports a figure it did not measure;
//! when a counter is unavailable the field is absent.

pub mod blob;
pub mod commit;
pub mod diskstats;
pub mod lookup;
pub mod mirror;
pub mod pages;
pub mod timeline;
pub mod tpcc;
pub mod waf;
pub mod ycsb;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use dana::buffer::PoolStatsSnapshot;
use dana::io::device::DeviceOptions;
use dana::io::sim::{Latency as SimLatency, SimConfig, SimDisk};
use dana::io::Device;
use dana::io::{Array, Target};
use dana::stats::{Histogram, HistogramSnapshot};
use dana::Db;
use serde::Serialize;

use crate::iostudy::reads::{random_reads, Submit};
use crate::report::process_cpu_seconds;
use crate::{CliError, CliResult};
use diskstats::{Disk, DiskCounters};
use timeline::Second;

/// `dana bench ...`
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Random point lookups on data many times the buffer pool (the
    /// VLDB 2023 paper's headline experiment), next to the device limit.
    Lookup(lookup::LookupArgs),
    /// Random page reads through the buffer manager (no tree), data 10x
    /// the pool, next to raw io_uring reads at their best depth.
    Pages(pages::PagesArgs),
    /// The YCSB core workloads A-F (or `all`) on data 10x the pool:
    /// reads, updates, inserts, short scans, read-modify-writes.
    Ycsb(ycsb::YcsbArgs),
    /// Commits per second with sync durability for 1, 16 and 256
    /// concurrent committing tasks (group commit), next to one durable
    /// 4 KiB write per commit on the same file system (the log's flush
    /// primitive); and the log's cost on inserts.
    Commit(commit::CommitArgs),
    /// Large values (4 KiB to 64 MiB) written one per durable commit and
    /// read whole, next to raw O_DIRECT writes and reads of the same
    /// shape with the same syncs, on the same file system.
    Blob(blob::BlobArgs),
    /// Mirrored devices on simulated devices: a mirrored pair against one
    /// device and a striped pair (reads, synced commits), and a mirrored
    /// pair losing a device mid-run (rate before and after, errors seen by
    /// clients).
    Mirror(mirror::MirrorArgs),
    /// TPC-C: the nine tables and two indexes as trees, the five
    /// transactions in the standard mix (serializable, log on), then the
    /// spec's consistency conditions.
    Tpcc(tpcc::TpccArgs),
    /// Flash writes per operation: YCSB-A on simulated devices behind an
    /// FTL model, at several fill levels (write amplification of dana's
    /// in-place page writes).
    Waf(waf::WafArgs),
}

/// Runs a benchmark.
pub fn run(args: &BenchArgs) -> CliResult<()> {
    match &args.command {
        BenchCommand::Lookup(a) => lookup::run(a),
        BenchCommand::Pages(a) => pages::run(a),
        BenchCommand::Ycsb(a) => ycsb::run(a),
        BenchCommand::Commit(a) => commit::run(a),
        BenchCommand::Blob(a) => blob::run(a),
        BenchCommand::Mirror(a) => mirror::run(a),
        BenchCommand::Tpcc(a) => tpcc::run(a),
        BenchCommand::Waf(a) => waf::run(a),
    }
}

/// The engine's settings every benchmark takes.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrent client tasks per worker.
    #[arg(long, default_value_t = 64, value_parser = parse_tasks_per_worker)]
    pub tasks_per_worker: usize,
    /// Most requests in flight per device: `auto` (the engine finds and
    /// tracks the device's best depth, starting at 32) or a fixed number.
    #[arg(long, default_value = "auto", value_parser = parse_device_budget)]
    pub device_budget: DeviceBudgetArg,
    /// Submit each read on its own (one syscall per I/O) instead of one
    /// batch per device per worker round.
    #[arg(long)]
    pub submit_each: bool,
    /// The engine's log: off (no log, the mode of the papers'
    /// benchmarks), async or sync.
    #[arg(long, default_value = "off", value_parser = parse_durability)]
    pub durability: dana::Durability,
    /// The buffer pool's eviction policy: watt (write-aware, the default)
    /// or clock (second chance, the baseline).
    #[arg(long, default_value = "watt", value_parser = parse_eviction)]
    pub eviction: dana::EvictionPolicy,
    /// Log full page images compressed (`Options::compress_log_images`).
    #[arg(long, default_value_t = dana::Options::default().compress_log_images_value(), action = clap::ArgAction::Set)]
    pub compress_log_images: bool,
    /// Out of place: collect segments in a thread of each device's own
    /// (`Options::background_collection`), or only in the workers whose
    /// writes find the free segments run out (`false`).
    #[arg(long, default_value_t = dana::Options::default().background_collection_value(), action = clap::ArgAction::Set)]
    pub background_collection: bool,
}

impl EngineArgs {
    /// Engine options for a benchmark with `pool_bytes` of buffer pool
    /// (at least 64 pages) and `tasks_per_worker` clients per worker.
    pub fn options(&self, pool_bytes: u64) -> dana::Options {
        self.device_budget
            .apply(dana::Options::default())
            .pool_bytes(pool_bytes.max(64 * 4096) as usize)
            .workers(self.workers)
            .submit_each(self.submit_each)
            .max_tasks_per_worker(self.tasks_per_worker.max(16) * 2)
            .durability(self.durability)
            .eviction(self.eviction)
            .compress_log_images(self.compress_log_images)
            .background_collection(self.background_collection)
    }
}

/// `--device-budget`: adaptive or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceBudgetArg {
    /// The engine adapts each device's limit, starting at 32.
    Auto,
    /// A fixed limit per device.
    Fixed(usize),
}

impl DeviceBudgetArg {
    /// `opts` with this budget.
    pub fn apply(self, opts: dana::Options) -> dana::Options {
        match self {
            DeviceBudgetArg::Auto => opts.adaptive_device_budget(32),
            DeviceBudgetArg::Fixed(n) => opts.device_budget(n),
        }
    }
}

impl std::fmt::Display for DeviceBudgetArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceBudgetArg::Auto => f.write_str("auto"),
            DeviceBudgetArg::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for DeviceBudgetArg {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Parses `auto` or a number >= 1.
pub fn parse_device_budget(s: &str) -> Result<DeviceBudgetArg, String> {
    if s == "auto" {
        return Ok(DeviceBudgetArg::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(DeviceBudgetArg::Fixed(n)),
        _ => Err(format!(
            "device budget must be auto or a number >= 1, not {s:?}"
        )),
    }
}

/// Runs a benchmark on simulated devices instead of files.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Run on this many simulated devices instead of files: memory and no
    /// kernel, each device starting at most `--sim-iops` requests a second,
    /// each taking `--sim-latency-us` (the engine's own cost shows, not
    /// this machine's disk). The data is made in every invocation, the
    /// log is off, and the device limit is the simulator's configured
    /// rate. 0: files.
    #[arg(long, default_value_t = 0)]
    pub sim_devices: usize,
    /// Requests per second each simulated device starts.
    #[arg(long, default_value_t = 1_500_000)]
    pub sim_iops: u32,
    /// Service time of each simulated request, µs.
    #[arg(long, default_value_t = 80)]
    pub sim_latency_us: u64,
}

impl SimArgs {
    /// The devices asked for, each of `capacity / devices` bytes (None:
    /// files).
    pub fn devices(&self, capacity: u64) -> CliResult<Option<Arc<Vec<Arc<SimDisk>>>>> {
        if self.sim_devices == 0 {
            return Ok(None);
        }
        if self.sim_iops == 0 {
            return Err(CliError("--sim-iops must be > 0".into()));
        }
        let per_device = capacity.div_ceil(self.sim_devices as u64).div_ceil(4096) * 4096;
        let cfg = SimConfig {
            latency: SimLatency::Fixed(Duration::from_micros(self.sim_latency_us)),
            iops: Some(self.sim_iops),
            ..SimConfig::default()
        };
        Ok(Some(Arc::new(
            (0..self.sim_devices)
                .map(|i| SimDisk::new(i, per_device, cfg))
                .collect(),
        )))
    }

    /// What the report says of the simulator (None: files).
    pub fn info(&self) -> Option<SimInfo> {
        (self.sim_devices > 0).then_some(SimInfo {
            devices: self.sim_devices,
            iops: self.sim_iops,
            latency_us: self.sim_latency_us,
        })
    }
}

/// Opens a database (no log) on simulated devices.
pub fn open_sim(disks: &[Arc<SimDisk>], opts: dana::Options, create: bool) -> CliResult<Db> {
    let targets = disks.iter().map(|d| Target::Sim(d.clone())).collect();
    Ok(Db::open_array(Array::new(targets, 4096)?, opts, create)?)
}

/// The simulated devices' configured rate, when a run is simulated.
#[derive(Debug, Clone, Serialize)]
pub struct SimInfo {
    /// Devices.
    pub devices: usize,
    /// Requests per second each starts at most.
    pub iops: u32,
    /// Service time of a request, µs.
    pub latency_us: u64,
}

impl SimInfo {
    /// The device limit: devices x iops.
    pub fn limit(&self) -> f64 {
        self.devices as f64 * f64::from(self.iops)
    }

    /// One line for the human reports.
    pub fn describe(&self) -> String {
        format!(
            "simulated devices (memory, no kernel): {} x {} requests/s, {} us each; the device limit is their configured rate, {} reads/s\n",
            self.devices,
            thousands(f64::from(self.iops)),
            self.latency_us,
            thousands(self.limit())
        )
    }
}

/// Parses `watt` or `clock`.
pub fn parse_eviction(s: &str) -> Result<dana::EvictionPolicy, String> {
    match s {
        "watt" => Ok(dana::EvictionPolicy::Watt),
        "clock" => Ok(dana::EvictionPolicy::Clock),
        _ => Err(format!("eviction must be watt or clock, not {s:?}")),
    }
}

/// Fails once a report is printed if dana's operations failed in it (the
/// sum of its `errors` fields, the peers' aside): a run whose lookups or
/// updates failed printed ERRORS and still exited 0 before.
pub fn fail_on_errors(report: &impl Serialize) -> CliResult<()> {
    fn sum(v: &serde_json::Value) -> u64 {
        match v {
            serde_json::Value::Object(m) => m
                .iter()
                .filter(|(k, _)| k.as_str() != "peers")
                .map(|(k, x)| match k.as_str() {
                    "errors" => x.as_u64().unwrap_or(0),
                    _ => sum(x),
                })
                .sum(),
            serde_json::Value::Array(a) => a.iter().map(sum).sum(),
            _ => 0,
        }
    }
    let v =
        serde_json::to_value(report).map_err(|e| CliError(format!("encoding the report: {e}")))?;
    match sum(&v) {
        0 => Ok(()),
        n => Err(CliError(format!(
            "{n} operations failed (the report's ERRORS lines name the first)"
        ))),
    }
}

/// Most tasks per worker a bench spawns: every task live at once on the
/// workers (`Options::max_tasks_per_worker`'s default); more would block
/// their spawning for good.
pub const MAX_TASKS_PER_WORKER: usize = 1024;

/// Parses `--tasks-per-worker`: from 1 to [`MAX_TASKS_PER_WORKER`] (0
/// ran the whole window with no task and printed zeros).
pub fn parse_tasks_per_worker(s: &str) -> Result<usize, String> {
    parse_count(s, "tasks per worker", MAX_TASKS_PER_WORKER)
}

/// Parses a count of `what` from 1 to `max`.
fn parse_count(s: &str, what: &str, max: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        Ok(v) if max == usize::MAX => Err(format!("{v} {what}: give at least 1")),
        Ok(v) => Err(format!("{v} {what}: give from 1 to {max}")),
        Err(_) => Err(format!("{s:?} is not a number of {what}")),
    }
}

/// Parses an amount of device capacities written (`bench waf`'s
/// `--warmup-devices`, `--measure-devices`): finite, from 0 to 1,000;
/// `positive` refuses 0 (a measured window of no writes printed a WAF of
/// 1.00 that nothing had measured).
fn parse_devices(s: &str, positive: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of device capacities"))?;
    if !v.is_finite() || !(0.0..=1000.0).contains(&v) || (positive && v == 0.0) {
        let least = if positive { "more than 0" } else { "from 0" };
        return Err(format!(
            "{s} device capacities: give a number {least} up to 1000"
        ));
    }
    Ok(v)
}

/// [`parse_devices`] for a warm-up (0 allowed).
pub fn parse_warmup_devices(s: &str) -> Result<f64, String> {
    parse_devices(s, false)
}

/// [`parse_devices`] for a measured window (more than 0).
pub fn parse_measure_devices(s: &str) -> Result<f64, String> {
    parse_devices(s, true)
}

/// Parses a count of concurrent clients: at least 1.
pub fn parse_clients(s: &str) -> Result<usize, String> {
    parse_count(s, "clients", usize::MAX)
}

/// Checks a `--tasks` count against the workers that run them.
pub fn check_tasks(tasks: usize, workers: usize) -> CliResult<()> {
    if tasks == 0 || tasks > workers.max(1) * MAX_TASKS_PER_WORKER {
        return Err(CliError(format!(
            "--tasks {tasks}: from 1 to {MAX_TASKS_PER_WORKER} per worker ({workers} workers)"
        )));
    }
    Ok(())
}

/// Most seconds any duration option takes (about 11.6 days).
pub const MAX_SECONDS: f64 = 1e6;

/// Parses a duration option in seconds: a finite number from 0 to
/// [`MAX_SECONDS`] (NaN, infinities and negatives made
/// `Duration::from_secs_f64` panic deep inside a run).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || !(0.0..=MAX_SECONDS).contains(&v) {
        return Err(format!(
            "{s} seconds: give a finite number from 0 to {MAX_SECONDS}"
        ));
    }
    Ok(v)
}

/// Parses a measured window in seconds: as [`parse_seconds`], and more
/// than 0 (a window of 0 s printed rates over a few microseconds, and
/// ratios of NaN; an outside probe's finding).
pub fn parse_window(s: &str) -> Result<f64, String> {
    let v = parse_seconds(s)?;
    if v <= 0.0 {
        return Err(format!(
            "{s} seconds: a measured window must be longer than 0"
        ));
    }
    Ok(v)
}

/// Parses `off`, `async` or `sync`.
pub fn parse_durability(s: &str) -> Result<dana::Durability, String> {
    match s {
        "off" => Ok(dana::Durability::Off),
        "async" => Ok(dana::Durability::Async),
        "sync" => Ok(dana::Durability::Sync),
        _ => Err(format!("durability must be off, async or sync, not {s:?}")),
    }
}

/// A report's field naming a durability as `--durability` takes it.
pub fn serialize_durability<S: serde::Serializer>(
    d: &dana::Durability,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(match d {
        dana::Durability::Off => "off",
        dana::Durability::Async => "async",
        dana::Durability::Sync => "sync",
    })
}

/// How a benchmark reports.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Print one JSON document with every figure instead of tables.
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// What raw io_uring reads reached on the devices.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceLimit {
    /// Total requests in flight (split evenly over the devices).
    pub depth: u32,
    /// 4 KiB random reads per second, all devices together.
    pub iops: f64,
    /// Mean latency, µs.
    pub lat_mean_us: f64,
    /// Process CPU per read, µs.
    pub cpu_us_per_io: f64,
    /// How refills were submitted.
    pub submit: Submit,
}

/// Raw 4 KiB O_DIRECT random reads over the first `span` bytes of each
/// file, `depth` in flight in total, one thread per device.
pub fn device_limit(
    files: &[PathBuf],
    span: u64,
    depth: u32,
    duration: Duration,
    submit: Submit,
) -> CliResult<DeviceLimit> {
    let per_dev = (depth as usize).div_ceil(files.len().max(1)).max(1) as u32;
    let runs = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                s.spawn(move || {
                    let opts = DeviceOptions {
                        direct: true,
                        create_size: None,
                        read_only: true,
                        lock: false,
                    };
                    let dev = Arc::new(Device::open(f, i, opts)?);
                    random_reads(&dev, per_dev, 4096, span, duration, 7 + i as u64, submit)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| CliError("device-limit thread panicked".into()))?
            })
            .collect::<CliResult<Vec<_>>>()
    })?;
    let iops = runs.iter().map(|r| r.iops).sum();
    let n = runs.len().max(1) as f64;
    // Each thread's CPU is the whole process's over its window (the
    // windows run together): their mean over all the threads' reads.
    // Each thread's own per-read figure divided the whole process's CPU
    // by its reads alone, N files counting it ~N times over (a review's
    // finding).
    let cpu = runs.iter().map(|r| r.cpu_seconds).sum::<f64>() / n;
    let ios: u64 = runs.iter().map(|r| r.ios).sum();
    Ok(DeviceLimit {
        depth: per_dev * files.len() as u32,
        iops,
        lat_mean_us: runs.iter().map(|r| r.lat_mean_us).sum::<f64>() / n,
        cpu_us_per_io: if ios > 0 { cpu * 1e6 / ios as f64 } else { 0.0 },
        submit,
    })
}

/// Total depths of the raw sweep that finds the device's best depth.
pub const SWEEP_DEPTHS: [u32; 6] = [8, 16, 32, 64, 128, 256];

/// The device limit at its best depth: raw reads swept over
/// [`SWEEP_DEPTHS`], each for `per_depth`.
#[derive(Debug, Clone, Serialize)]
pub struct DepthSweep {
    /// Every depth measured.
    pub points: Vec<DeviceLimit>,
    /// The depth with the most reads per second.
    pub best: DeviceLimit,
}

/// The raw device limit around an engine run: a depth sweep before it
/// (with reads submitted one by one, fio's pattern, at its best depth) and
/// one after it; the engine is measured against the lower best.
pub struct LimitProbe<'a> {
    files: &'a [PathBuf],
    span: u64,
    seconds: f64,
}

impl<'a> LimitProbe<'a> {
    /// Over the first `span` bytes of each of `files`, a third of
    /// `seconds` per depth (no probe when `files` is empty or `seconds`
    /// is not positive).
    pub fn new(files: &'a [PathBuf], span: u64, seconds: f64) -> LimitProbe<'a> {
        LimitProbe {
            files,
            span,
            seconds,
        }
    }

    /// Raw reads swept over [`SWEEP_DEPTHS`] (see [`device_limit`]), a
    /// third of `seconds` each, keeping the best; `None` if this probe
    /// does not measure.
    pub fn sweep(&self) -> CliResult<Option<DepthSweep>> {
        if self.files.is_empty() || self.seconds <= 0.0 {
            return Ok(None);
        }
        let per_depth = Duration::from_secs_f64(self.seconds / 3.0);
        let points = SWEEP_DEPTHS
            .iter()
            .map(|&d| device_limit(self.files, self.span, d, per_depth, Submit::Batch))
            .collect::<CliResult<Vec<_>>>()?;
        let best = points
            .iter()
            .max_by(|a, b| a.iops.total_cmp(&b.iops))
            .cloned()
            .ok_or_else(|| CliError("empty depth sweep".into()))?;
        Ok(Some(DepthSweep { points, best }))
    }

    /// The sweep before the run, and reads submitted one by one at its
    /// best depth.
    pub fn before(&self) -> CliResult<(Option<DepthSweep>, Option<DeviceLimit>)> {
        let Some(sweep) = self.sweep()? else {
            return Ok((None, None));
        };
        let window = Duration::from_secs_f64(self.seconds);
        let each = device_limit(
            self.files,
            self.span,
            sweep.best.depth,
            window,
            Submit::Each,
        )?;
        Ok((Some(sweep), Some(each)))
    }
}

/// The lower of two sweeps' best (the device limit an engine run is
/// measured against).
pub fn lower_best(a: &Option<DepthSweep>, b: &Option<DepthSweep>) -> Option<DeviceLimit> {
    [a, b]
        .into_iter()
        .flatten()
        .map(|s| s.best.clone())
        .min_by(|x, y| x.iops.total_cmp(&y.iops))
}

/// "8:41k 16:52k ... best 64" for the human reports.
pub fn describe_sweep(s: &DepthSweep) -> String {
    let mut out: String = s
        .points
        .iter()
        .map(|p| format!("{}:{:.1}k ", p.depth, p.iops / 1e3))
        .collect();
    out += &format!("(best {:.0}/s at {})", s.best.iops, s.best.depth);
    out
}

/// Shared state of a run's tasks.
#[derive(Default)]
pub struct RunState {
    /// Operations finished.
    pub ops: AtomicU64,
    /// Operations that failed or returned something unexpected.
    pub errors: AtomicU64,
    /// The first failure, for the report.
    pub first_error: Mutex<Option<String>>,
    /// Latency of every operation.
    pub latency: Histogram,
    /// Tasks stop when set.
    pub stop: AtomicBool,
}

impl RunState {
    /// Records a failed operation.
    pub fn fail(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut e = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        e.get_or_insert(what);
    }
}

/// A latency distribution in µs. The quantiles are the lower edges of
/// `dana::stats::Histogram`'s buckets (eighths of an octave): up to 12.5%
/// below the true quantile, the same for dana and the peers (ratios are
/// fair; absolute values read low, and repeat as the same edges).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
}

impl From<&HistogramSnapshot> for Latency {
    fn from(h: &HistogramSnapshot) -> Latency {
        Latency {
            count: h.count,
            mean_us: h.mean_ns() as f64 / 1e3,
            p50_us: h.quantile_ns(0.5) as f64 / 1e3,
            p99_us: h.quantile_ns(0.99) as f64 / 1e3,
            p999_us: h.quantile_ns(0.999) as f64 / 1e3,
        }
    }
}

/// Everything measured in the window after the warm-up.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Length of the window, s.
    pub seconds: f64,
    /// Operations in the window.
    pub ops: u64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Failed operations.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Per-operation latency.
    pub latency: Latency,
    /// Page reads completed by the engine per second.
    pub engine_reads_per_s: f64,
    /// MB/s those reads moved (10^6 bytes).
    pub engine_read_mb_per_s: f64,
    /// Page writes by the engine per second.
    pub engine_writes_per_s: f64,
    /// Reads the block device completed per second (/proc/diskstats).
    pub disk_reads_per_s: Option<f64>,
    /// MB/s the block device read.
    pub disk_read_mb_per_s: Option<f64>,
    /// Device reads per operation.
    pub reads_per_op: f64,
    /// Page writes (write-back) per operation.
    pub writes_per_op: f64,
    /// Log bytes appended per operation (0 without a log).
    pub log_bytes_per_op: f64,
    /// Full page images logged per operation (torn-page images, split
    /// halves; 0 without a log).
    pub log_images_per_op: f64,
    /// Checkpoints (of a shard or whole) finished per second.
    pub checkpoints_per_s: f64,
    /// Flushes of the log per second (each a group commit).
    pub log_flushes_per_s: f64,
    /// Waits for a free frame per page miss.
    pub frame_waits_per_miss: f64,
    /// How long the waits for a free frame took.
    pub frame_wait: Latency,
    /// Share of the pool's frames dirty at the end of the window.
    pub dirty_fraction: f64,
    /// Share of page fixes served from the pool.
    pub hit_rate: f64,
    /// Process CPU seconds in the window (user + system, all threads).
    pub cpu_s: f64,
    /// CPU µs per operation.
    pub cpu_us_per_op: f64,
    /// Operations per second of whole-process CPU (user + system, every
    /// thread: workers, kernel workers such as io-wq, a simulator).
    pub ops_per_cpu_s: f64,
    /// CPU µs per device read.
    pub cpu_us_per_io: f64,
    /// Whole page miss: fault -> page available to the task.
    pub miss: Latency,
    /// Part of a miss spent queued in the engine (device budget).
    pub miss_queued: Latency,
    /// Part spent in the kernel and device (submit -> reap).
    pub miss_device: Latency,
    /// Part spent waiting to be resumed (reap -> task runs).
    pub miss_resume: Latency,
    /// The devices' in-flight limits in the window.
    pub budget: BudgetSeen,
    /// Out of place: what the collection of segments did in the window.
    pub collection: Option<CollectionSeen>,
    /// One entry per second, warm-up included (negative t).
    pub timeline: Vec<Second>,
}

/// What the device budget did in a measured window.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetSeen {
    /// Whether the limits adapted (else they were fixed).
    pub adaptive: bool,
    /// Each device's limit at the end of the window.
    pub limits: Vec<usize>,
    /// Each device's limit averaged over the window's time.
    pub mean_limits: Vec<f64>,
    /// Changes of limit in the window, trials and returns from them
    /// included.
    pub changes: usize,
    /// Moves of the limit in the window (trials and returns from them
    /// not counted).
    pub moves: usize,
    /// The lowest and highest limit any device had in the window.
    pub range: (usize, usize),
    /// The changes in the window (the first 1,000): seconds since the
    /// window began, device, new limit, why, and the completions per
    /// second of the epoch that decided it.
    pub history: Vec<(f64, usize, usize, String, f64)>,
}

impl BudgetSeen {
    fn measure(db: &Db, start: Duration, start_limits: &[usize]) -> BudgetSeen {
        let b = db.runtime().budgets();
        let end = b.clock();
        let changes: Vec<_> = b
            .changes()
            .into_iter()
            .filter(|c| c.at >= start && c.at <= end)
            .collect();
        let span = (end.saturating_sub(start)).as_secs_f64().max(1e-9);
        let mut range = (usize::MAX, 0);
        let mean_limits = start_limits
            .iter()
            .enumerate()
            .map(|(d, &first)| {
                let (mut at, mut limit, mut sum) = (start, first, 0.0);
                range = (range.0.min(limit), range.1.max(limit));
                for c in changes.iter().filter(|c| c.device == d) {
                    sum += (c.at - at).as_secs_f64() * limit as f64;
                    (at, limit) = (c.at, c.limit);
                    range = (range.0.min(limit), range.1.max(limit));
                }
                sum += (end.saturating_sub(at)).as_secs_f64() * limit as f64;
                sum / span
            })
            .collect();
        BudgetSeen {
            adaptive: b.is_adaptive(),
            limits: b.limits(),
            mean_limits,
            history: changes
                .iter()
                .take(1000)
                .map(|c| {
                    (
                        (c.at.saturating_sub(start)).as_secs_f64(),
                        c.device,
                        c.limit,
                        format!("{:?}", c.reason),
                        c.throughput,
                    )
                })
                .collect(),
            changes: changes.len(),
            moves: changes
                .iter()
                .filter(|c| c.reason == dana::sched::LimitReason::Moved)
                .count(),
            range: if range.0 == usize::MAX { (0, 0) } else { range },
        }
    }

    /// "auto 48-160, mean 97" or "fixed 32", for the human reports.
    pub fn describe(&self) -> String {
        let mean = self.mean_limits.iter().sum::<f64>() / self.mean_limits.len().max(1) as f64;
        if self.adaptive {
            format!(
                "auto: {}-{} in flight per device, mean {:.0}, end {:?}; {} moves ({} changes with trials)",
                self.range.0, self.range.1, mean, self.limits, self.moves, self.changes
            )
        } else {
            format!("fixed: {:?}", self.limits)
        }
    }
}

/// Samples counters every second for `warmup + window` and returns the
/// window's figures. Tasks must already be running.
pub fn sample(
    db: &Db,
    state: &RunState,
    warmup: Duration,
    window: Duration,
    page_size: usize,
    disk: Option<&Disk>,
    progress: Option<&indicatif::ProgressBar>,
) -> Measured {
    sample_with(
        db,
        state,
        warmup,
        window,
        page_size,
        disk,
        progress,
        &mut || {},
    )
}

/// [`sample`], calling `on_window` once right when the measured window
/// starts (after the warm-up), so a workload can snapshot counters of its
/// own at the same moment.
#[allow(clippy::too_many_arguments)]
pub fn sample_with(
    db: &Db,
    state: &RunState,
    warmup: Duration,
    window: Duration,
    page_size: usize,
    disk: Option<&Disk>,
    progress: Option<&indicatif::ProgressBar>,
    on_window: &mut dyn FnMut(),
) -> Measured {
    let start = Instant::now();
    let mut timeline = Vec::new();
    let mut last = (
        Instant::now(),
        state.ops.load(Ordering::Relaxed),
        db.pool_stats().reads,
        state.latency.snapshot(),
    );
    let mut base: Option<Base> = None;
    let end = start + warmup + window;
    loop {
        let now = Instant::now();
        if base.is_none() && now >= start + warmup {
            on_window();
            base = Some(Base::take(db, state, disk));
        }
        if now >= end {
            break;
        }
        let next = (last.0 + Duration::from_secs(1)).min(end).max(now);
        let nb = if base.is_none() {
            (start + warmup).min(next)
        } else {
            next
        };
        std::thread::sleep(nb.saturating_duration_since(Instant::now()));
        let t = Instant::now();
        let ops = state.ops.load(Ordering::Relaxed);
        let reads = db.pool_stats().reads;
        let lat = state.latency.snapshot();
        let dt = (t - last.0).as_secs_f64().max(1e-9);
        timeline.push(Second {
            t: (t - start).as_secs_f64() - warmup.as_secs_f64(),
            ops_per_s: (ops - last.1) as f64 / dt,
            reads_per_s: (reads - last.2) as f64 / dt,
            p99_us: lat.since(&last.3).quantile_ns(0.99) as f64 / 1e3,
        });
        if let Some(p) = progress {
            p.set_position((t - start).as_millis() as u64);
            p.set_message(format!("{:.0} ops/s", (ops - last.1) as f64 / dt));
        }
        last = (t, ops, reads, lat);
    }
    let b = base.unwrap_or_else(|| {
        on_window();
        Base::take(db, state, disk)
    });
    let e = Base::take(db, state, disk);
    let budget = BudgetSeen::measure(db, b.budget_clock, &b.limits);
    e.since(&b, state, timeline, page_size, budget)
}

/// What the out-of-place devices' collection did in a measured window.
#[derive(Debug, Clone, Serialize)]
pub struct CollectionSeen {
    /// Segments freed per second.
    pub segments_freed_per_s: f64,
    /// Extents copied out of victims per operation.
    pub copies_per_op: f64,
    /// Barriers per second (the engine's flushes and the collection's).
    pub barriers_per_s: f64,
    /// Writes that found no free segment and collected themselves, per
    /// second (the rest was collected in the background).
    pub write_stalls_per_s: f64,
    /// Runs of the background collection per second.
    pub background_runs_per_s: f64,
    /// Failed steps of the background collection in the window.
    pub background_failures: u64,
}

struct Base {
    at: Instant,
    remap: Option<dana::io::remap::RemapStats>,
    ops: u64,
    errors: u64,
    cpu: f64,
    pool: PoolStatsSnapshot,
    frames: usize,
    log_bytes: u64,
    log_images: u64,
    checkpoints: u64,
    log_flushes: u64,
    queue: HistogramSnapshot,
    lat: HistogramSnapshot,
    disk: Option<DiskCounters>,
    budget_clock: Duration,
    limits: Vec<usize>,
}

impl Base {
    fn take(db: &Db, state: &RunState, disk: Option<&Disk>) -> Base {
        Base {
            at: Instant::now(),
            remap: db.out_of_place_stats(),
            ops: state.ops.load(Ordering::Relaxed),
            errors: state.errors.load(Ordering::Relaxed),
            cpu: process_cpu_seconds(),
            pool: db.pool_stats(),
            frames: db.pool().frames(),
            log_bytes: db.wal_stats().map_or(0, |w| w.bytes),
            log_images: db.wal_stats().map_or(0, |w| w.images),
            checkpoints: db.wal_stats().map_or(0, |w| w.checkpoints),
            log_flushes: db.wal_stats().map_or(0, |w| w.flushes),
            queue: db.runtime().budgets().queue_wait.snapshot(),
            lat: state.latency.snapshot(),
            disk: disk.and_then(Disk::read),
            budget_clock: db.runtime().budgets().clock(),
            limits: db.runtime().budgets().limits(),
        }
    }

    fn since(
        &self,
        b: &Base,
        state: &RunState,
        timeline: Vec<Second>,
        page_size: usize,
        budget: BudgetSeen,
    ) -> Measured {
        let secs = (self.at - b.at).as_secs_f64().max(1e-9);
        let ops = self.ops - b.ops;
        let reads = self.pool.reads - b.pool.reads;
        let fixes = (self.pool.hits - b.pool.hits) + (self.pool.misses - b.pool.misses);
        let cpu = self.cpu - b.cpu;
        let disk = match (&self.disk, &b.disk) {
            (Some(e), Some(s)) => Some(e.since(s)),
            _ => None,
        };
        let per = |x: f64, n: u64| if n > 0 { x / n as f64 } else { 0.0 };
        Measured {
            seconds: secs,
            ops,
            ops_per_s: ops as f64 / secs,
            errors: self.errors - b.errors,
            first_error: state
                .first_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            latency: Latency::from(&self.lat.since(&b.lat)),
            engine_reads_per_s: reads as f64 / secs,
            engine_read_mb_per_s: (reads * page_size as u64) as f64 / 1e6 / secs,
            engine_writes_per_s: (self.pool.writes - b.pool.writes) as f64 / secs,
            disk_reads_per_s: disk.map(|d| d.reads as f64 / secs),
            disk_read_mb_per_s: disk.map(|d| d.read_bytes as f64 / 1e6 / secs),
            reads_per_op: per(reads as f64, ops),
            writes_per_op: per((self.pool.writes - b.pool.writes) as f64, ops),
            log_bytes_per_op: per((self.log_bytes - b.log_bytes) as f64, ops),
            log_images_per_op: per((self.log_images - b.log_images) as f64, ops),
            checkpoints_per_s: (self.checkpoints - b.checkpoints) as f64 / secs,
            log_flushes_per_s: (self.log_flushes - b.log_flushes) as f64 / secs,
            frame_waits_per_miss: per(
                (self.pool.frame_waits - b.pool.frame_waits) as f64,
                self.pool.misses - b.pool.misses,
            ),
            frame_wait: Latency::from(&self.pool.frame_wait.since(&b.pool.frame_wait)),
            collection: match (&self.remap, &b.remap) {
                (Some(e), Some(s)) => {
                    let d = e.since(s);
                    Some(CollectionSeen {
                        segments_freed_per_s: d.segments_freed as f64 / secs,
                        copies_per_op: per(d.gc_copies as f64, ops),
                        barriers_per_s: d.barriers as f64 / secs,
                        write_stalls_per_s: d.write_stalls as f64 / secs,
                        background_runs_per_s: d.background_runs as f64 / secs,
                        background_failures: d.background_failures,
                    })
                }
                _ => None,
            },
            dirty_fraction: per(self.pool.dirty_frames as f64, self.frames as u64),
            hit_rate: per((self.pool.hits - b.pool.hits) as f64, fixes),
            cpu_s: cpu,
            cpu_us_per_op: per(cpu * 1e6, ops),
            ops_per_cpu_s: if cpu > 0.0 { ops as f64 / cpu } else { 0.0 },
            cpu_us_per_io: per(cpu * 1e6, reads),
            miss: Latency::from(&self.pool.miss.since(&b.pool.miss)),
            miss_queued: Latency::from(&self.queue.since(&b.queue)),
            miss_device: Latency::from(&self.pool.device_read.since(&b.pool.device_read)),
            miss_resume: Latency::from(&self.pool.resume.since(&b.pool.resume)),
            budget,
            timeline,
        }
    }
}

/// A progress bar on stderr (hidden when quiet or not a terminal).
pub fn bar(quiet: bool, len: u64, what: &str) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// Makes record `j` of a load: fills the value, returns the key.
pub type RecordFn = Arc<dyn Fn(u64, &mut [u8]) -> [u8; 8] + Send + Sync>;

/// Inserts records `0..records` into `tree` from `tasks` tasks on the
/// workers, each over its own range of record numbers, with a progress
/// bar; then flushes. Returns the seconds it took.
pub fn load_records(
    db: &Db,
    tree: &dana::btree::BTree,
    records: u64,
    tasks: u64,
    value_size: usize,
    record: RecordFn,
    quiet: bool,
) -> CliResult<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks = tasks.max(1);
    let per = records.div_ceil(tasks);
    let (tx, rx) = std::sync::mpsc::channel();
    for c in 0..tasks {
        let (tree, done, tx, record) = (tree.clone(), done.clone(), tx.clone(), record.clone());
        let (lo, hi) = (c * per, ((c + 1) * per).min(records));
        db.spawn(async move {
            let r: Result<(), dana::Error> = async {
                let mut v = vec![0u8; value_size];
                for j in lo..hi {
                    let key = record(j, &mut v);
                    tree.insert(&key, &v).await?;
                    if (j - lo) % 1024 == 1023 {
                        done.fetch_add(1024, Ordering::Relaxed);
                    }
                }
                Ok(())
            }
            .await;
            let _ = tx.send(r.map_err(|e| CliError(format!("loading records {lo}..{hi}: {e}"))));
        })?;
    }
    drop(tx);
    let pb = bar(quiet, records, "loading");
    let mut finished = 0;
    while finished < tasks {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => {
                r?;
                finished += 1;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => return Err(CliError("a load task stopped without a result".into())),
        }
        let d = done.load(Ordering::Relaxed).min(records);
        pb.set_position(d);
        pb.set_message(format!(
            "{:.0} records/s",
            d as f64 / started.elapsed().as_secs_f64()
        ));
    }
    pb.finish_and_clear();
    db.flush()?;
    Ok(started.elapsed().as_secs_f64())
}

/// The file a bench leaves in a directory it made: only a directory that
/// holds it (or is empty, or new) is ever cleared by a bench.
pub const BENCH_MARKER: &str = ".dana-bench";

/// Marks `dir` (which exists) as a bench's own.
fn mark_bench_dir(dir: &Path) -> CliResult<()> {
    std::fs::write(
        dir.join(BENCH_MARKER),
        b"made by a dana bench or crashtest: the next run clears this directory\n",
    )
    .map_err(|e| CliError(format!("marking {}: {e}", dir.display())))
}

/// True if `dir` may be cleared by a bench: missing, empty, or marked as
/// a bench's own ([`BENCH_MARKER`]). A user's directory (a real database,
/// a home directory given as `--path`) is never.
fn is_bench_dir(dir: &Path) -> CliResult<bool> {
    if !dir.exists() {
        return Ok(true);
    }
    if !dir.is_dir() {
        return Err(CliError(format!("{} is not a directory", dir.display())));
    }
    let mut entries =
        std::fs::read_dir(dir).map_err(|e| CliError(format!("reading {}: {e}", dir.display())))?;
    Ok(entries.next().is_none() || dir.join(BENCH_MARKER).exists())
}

/// Makes `dir` a new, empty directory of a bench, marked as its own.
/// Refuses (changing nothing) a directory that holds files and no
/// marker: the first version removed whatever `--path` named (`dana bench
/// commit --path .` emptied the working directory).
pub fn fresh_bench_dir(dir: &Path) -> CliResult<()> {
    if !is_bench_dir(dir)? {
        return Err(CliError(format!(
            "refusing to clear {}: it holds files and was not made by dana (no {BENCH_MARKER} \
             in it); give a new or empty directory",
            dir.display()
        )));
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| CliError(format!("clearing {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError(format!("creating {}: {e}", dir.display())))?;
    mark_bench_dir(dir)
}

/// Removes dana's own files from a benchmark directory (never anything
/// else), so a reload starts clean. Refuses (changing nothing) a
/// directory that holds files and was not made by a bench: neither marked
/// as one nor holding a bench's loaded data (`LOADED`). The first version
/// refused only a directory holding `dana.0`: any other it marked as a
/// bench's, deleting every `dana.*` file in it, and a later `bench commit`
/// there removed the whole directory (an outside review's finding).
pub fn clear_dana_files(dir: &Path) -> CliResult<()> {
    if !is_bench_dir(dir)? && !dir.join("LOADED").exists() {
        return Err(CliError(format!(
            "refusing to load into {}: it holds files and no dana bench made it (no \
             {BENCH_MARKER} or LOADED in it); give a new or empty directory",
            dir.display()
        )));
    }
    if dir.is_dir() {
        mark_bench_dir(dir)?;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_engine_file(&name) {
            std::fs::remove_file(e.path())
                .map_err(|err| CliError(format!("removing {}: {err}", e.path().display())))?;
        }
    }
    Ok(())
}

/// True for the names of the files a database and its bench load make:
/// `dana.N` and `dana.wal` (with a log's number `.N` and a copy's `.mN`),
/// the creation marker `dana.creating`, and `LOADED`.
fn is_engine_file(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if name == "LOADED" || name == "dana.creating" {
        return true;
    }
    let Some(rest) = name.strip_prefix("dana.") else {
        return false;
    };
    let mut parts = rest.split('.');
    let first = parts.next().unwrap_or("");
    (digits(first) || first == "wal")
        && parts.all(|p| digits(p) || p.strip_prefix('m').is_some_and(digits))
}

/// Files of the database in `dir`.
pub fn data_files(dir: &Path) -> Vec<PathBuf> {
    (0..)
        .map(|i| dir.join(format!("dana.{i}")))
        .take_while(|p| p.exists())
        .collect()
}

/// Formats a number with thousands separators.
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}
