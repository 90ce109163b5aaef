//! `dana bench mirror`: a mirrored pair of devices against one device and
//! against a striped pair, and a mirrored pair losing a device mid-run, on
//! simulated devices (#16).
//!
//! Owns: four layouts of the same data on simulated devices whose rate is
//! the bottleneck (`--sim-iops` requests a second each, `--sim-latency-us`
//! each): one data device; two striped; two mirrored copies of one; and the
//! mirrored pair again with one copy of the data and of the log failing
//! for good a third into the run. Each layout is loaded with the same
//! records (in key order, without a log), reopened with a log (on its own
//! simulated device, mirrored for the mirrored layouts) and measured:
//! random reads of data `--records` large, several times the pool
//! (lookups/s against the layout's device limit, device reads/s,
//! latency), then random updates committed with a synced log
//! (commits/s, latency). The failing layout runs half reads and half
//! updates and reports the rate before and after the failure, and every
//! error a client saw (there must be none).
//!
//! Never: reports a figure it did not measure in this invocation, or
//! counts an error as an operation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::mirror::{CopySpec, CopyState, Mirror, Role, LABEL_BYTES};
use dana::io::sim::{Fault, Latency as SimLatency, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::stats::Histogram;
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Options};
use serde::Serialize;

use super::thousands;
use crate::report::process_cpu_seconds;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

const PAGE: u64 = 4096;
const LOG_BYTES: u64 = 32 << 20;

/// Arguments of `dana bench mirror`.
#[derive(Args, Debug, Clone)]
pub struct MirrorArgs {
    /// Records (8-byte keys).
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Bytes of each value.
    #[arg(long, default_value_t = 120)]
    pub value_size: usize,
    /// Buffer pool bytes (the data is several times larger).
    #[arg(long, default_value_t = 16 << 20)]
    pub pool_bytes: usize,
    /// Seconds per measured window.
    #[arg(long, default_value_t = 4.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Tasks issuing operations (spread over the workers).
    #[arg(long, default_value_t = 256)]
    pub tasks: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Requests per second each simulated device starts.
    #[arg(long, default_value_t = 40_000)]
    pub sim_iops: u32,
    /// Service time of each simulated request, µs.
    #[arg(long, default_value_t = 100)]
    pub sim_latency_us: u64,
    /// A few seconds on small data.
    #[arg(long)]
    pub quick: bool,
    /// Print every figure as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How the data sits on the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Layout {
    /// One device.
    Single,
    /// Two devices, pages striped.
    Striped,
    /// Two copies of one device (and of the log).
    Mirrored,
    /// Two copies, one failing for good during the run.
    MirroredFailing,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Single => "one device",
            Layout::Striped => "striped pair",
            Layout::Mirrored => "mirrored pair",
            Layout::MirroredFailing => "mirrored pair, one copy failing",
        }
    }

    /// Devices whose reads add up (the read limit).
    fn read_devices(self) -> u32 {
        match self {
            Layout::Single => 1,
            _ => 2,
        }
    }
}

/// One measured window.
#[derive(Debug, Clone, Default, Serialize)]
struct Window {
    ops_per_s: f64,
    device_reads_per_s: f64,
    device_writes_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
    cpu_us_per_op: f64,
}

/// One layout's figures.
#[derive(Debug, Clone, Serialize)]
struct LayoutRun {
    layout: Layout,
    /// Reads/s the layout's devices allow (devices that serve reads x
    /// their rate).
    read_limit: f64,
    reads: Window,
    commits: Window,
    /// The failing layout: the mixed run before and after the failure.
    before_failure: Option<Window>,
    after_failure: Option<Window>,
    /// The failing layout: each group's copies at the end.
    states_after: Vec<String>,
    /// Mirrored layouts: reads each copy of the data device served over
    /// the whole run.
    copy_reads: Vec<u64>,
}

#[derive(Debug, Serialize)]
struct MirrorReport {
    records: u64,
    value_size: usize,
    pool_bytes: usize,
    data_bytes: u64,
    sim_iops: u32,
    sim_latency_us: u64,
    tasks: usize,
    workers: usize,
    seconds: f64,
    runs: Vec<LayoutRun>,
}

/// Devices and the database on them.
struct Rig {
    data: Vec<Arc<SimDisk>>,
    log: Vec<Arc<SimDisk>>,
    groups: Vec<Arc<Mirror>>,
    array: Array,
    log_target: Target,
}

fn sim(index: usize, bytes: u64, a: &MirrorArgs) -> Arc<SimDisk> {
    let cfg = SimConfig {
        latency: SimLatency::Fixed(Duration::from_micros(a.sim_latency_us)),
        iops: Some(a.sim_iops),
        ..SimConfig::default()
    };
    SimDisk::new(index, bytes, cfg)
}

impl Rig {
    fn new(layout: Layout, data_bytes: u64, a: &MirrorArgs) -> CliResult<Rig> {
        let log_bytes = CONTROL_BYTES + LOG_BYTES;
        let mirrored = matches!(layout, Layout::Mirrored | Layout::MirroredFailing);
        let (data, log, groups, array, log_target) = if mirrored {
            let data: Vec<_> = (0..2)
                .map(|i| sim(i, LABEL_BYTES + data_bytes, a))
                .collect();
            let log: Vec<_> = (0..2)
                .map(|i| sim(2 + i, LABEL_BYTES + log_bytes, a))
                .collect();
            let specs = |d: &[Arc<SimDisk>]| {
                d.iter()
                    .map(|d| CopySpec::of(Target::Sim(d.clone())))
                    .collect::<Vec<_>>()
            };
            let dm = Mirror::create(Role::Data(0), 0, specs(&data))?;
            let lm = Mirror::create(Role::Log(0), 1, specs(&log))?;
            let array = Array::new(vec![Target::Mirror(dm.clone())], PAGE)?;
            (data, log, vec![dm, lm.clone()], array, Target::Mirror(lm))
        } else {
            let n = if layout == Layout::Striped { 2 } else { 1 };
            let per = (data_bytes / n as u64).div_ceil(PAGE) * PAGE;
            let data: Vec<_> = (0..n).map(|i| sim(i, per, a)).collect();
            let log = vec![sim(n, log_bytes, a)];
            let targets = data.iter().map(|d| Target::Sim(d.clone())).collect();
            let array = Array::new(targets, PAGE)?;
            let lt = Target::Sim(log[0].clone());
            (data, log, Vec::new(), array, lt)
        };
        Ok(Rig {
            data,
            log,
            groups,
            array,
            log_target,
        })
    }

    fn all(&self) -> impl Iterator<Item = &Arc<SimDisk>> {
        self.data.iter().chain(&self.log)
    }

    /// (reads, writes) completed by every device so far.
    fn io_counts(&self) -> (u64, u64) {
        self.all().fold((0, 0), |(r, w), d| {
            let s = d.stats();
            (r + s.reads, w + s.writes)
        })
    }
}

fn key(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

fn value(k: u64, salt: u8, len: usize) -> Vec<u8> {
    let mut v = vec![salt; len];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v
}

fn options(a: &MirrorArgs, pool: usize) -> Options {
    Options::default()
        .pool_bytes(pool)
        .workers(a.workers)
        .max_tasks_per_worker(a.tasks.max(64))
        .log_bytes(LOG_BYTES)
}

/// Loads the records in key order without a log, then reopens with a
/// synced log on the rig's log device.
fn load(rig: &Rig, a: &MirrorArgs) -> CliResult<Db> {
    let db = Db::open_array(rig.array.clone(), options(a, 256 << 20), true)?;
    let tree = db.create_tree("t")?.unlogged_btree().clone();
    let (records, vs) = (a.records, a.value_size);
    db.block_on(async move {
        for k in 0..records {
            tree.insert(&key(k), &value(k, 0, vs)).await?;
        }
        Ok::<_, dana::Error>(())
    })??;
    db.close()?;
    let opts = options(a, a.pool_bytes).durability(Durability::Sync);
    Ok(Db::open_array_with_logs(
        rig.array.clone(),
        vec![rig.log_target.clone()],
        opts,
        false,
    )?)
}

/// What one run of tasks counts.
struct Counters {
    ops: AtomicU64,
    errors: AtomicU64,
    latency: Histogram,
}

/// Runs `a.tasks` tasks doing reads (`write_share` 0), updates (1) or a
/// mix until `stop`, counting into `c`.
fn start_tasks(
    db: &Db,
    a: &MirrorArgs,
    write_share: f64,
    stop: &Arc<AtomicBool>,
    c: &Arc<Counters>,
) -> CliResult<std::sync::mpsc::Receiver<()>> {
    let t = db.tree("t")?;
    let (send, recv) = std::sync::mpsc::channel();
    for task in 0..a.tasks {
        let (t, stop, c, send) = (t.clone(), stop.clone(), c.clone(), send.clone());
        let (records, vs) = (a.records, a.value_size);
        db.spawn(async move {
            let mut rng = XorShift::new(0x5eed ^ task as u64);
            while !stop.load(Ordering::Relaxed) {
                let k = rng.next_u64() % records;
                let write = (rng.next_u64() % 1000) as f64 / 1000.0 < write_share;
                let started = Instant::now();
                let ok = if write {
                    t.put_async(&key(k), &value(k, (task % 251) as u8, vs))
                        .await
                        .is_ok()
                } else {
                    matches!(t.get_async(&key(k)).await, Ok(Some(v)) if v.get(..8) == Some(&k.to_le_bytes()[..]))
                };
                if ok {
                    c.latency.record(started.elapsed());
                    c.ops.fetch_add(1, Ordering::Relaxed);
                } else {
                    c.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = send.send(());
        })?;
    }
    Ok(recv)
}

/// Measures `seconds` of the running tasks: the window's rate, device
/// I/O, latency and CPU.
fn measure(rig: &Rig, c: &Counters, seconds: f64) -> Window {
    let (ops0, err0, lat0) = (
        c.ops.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
        c.latency.snapshot(),
    );
    let (r0, w0) = rig.io_counts();
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let dt = t0.elapsed().as_secs_f64();
    let ops = c.ops.load(Ordering::Relaxed) - ops0;
    let (r1, w1) = rig.io_counts();
    let lat = c.latency.snapshot().since(&lat0);
    let cpu = process_cpu_seconds() - cpu0;
    Window {
        ops_per_s: ops as f64 / dt,
        device_reads_per_s: (r1 - r0) as f64 / dt,
        device_writes_per_s: (w1 - w0) as f64 / dt,
        p50_us: lat.quantile_ns(0.5) as f64 / 1e3,
        p99_us: lat.quantile_ns(0.99) as f64 / 1e3,
        errors: c.errors.load(Ordering::Relaxed) - err0,
        cpu_us_per_op: cpu * 1e6 / (ops.max(1)) as f64,
    }
}

/// One window of tasks with `write_share`, after a warm-up of a quarter.
fn window(db: &Db, rig: &Rig, a: &MirrorArgs, write_share: f64) -> CliResult<Window> {
    let stop = Arc::new(AtomicBool::new(false));
    let c = Arc::new(Counters {
        ops: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        latency: Histogram::default(),
    });
    let done = start_tasks(db, a, write_share, &stop, &c)?;
    std::thread::sleep(Duration::from_secs_f64(a.seconds / 4.0));
    let w = measure(rig, &c, a.seconds);
    stop.store(true, Ordering::Relaxed);
    for _ in 0..a.tasks {
        done.recv_timeout(Duration::from_secs(60))
            .map_err(|_| CliError("a benchmark task did not stop".into()))?;
    }
    Ok(w)
}

fn run_layout(layout: Layout, a: &MirrorArgs, data_bytes: u64) -> CliResult<LayoutRun> {
    let rig = Rig::new(layout, data_bytes, a)?;
    let db = load(&rig, a).context(format!("loading the {}", layout.name()))?;
    let read_limit = f64::from(a.sim_iops) * f64::from(layout.read_devices());
    let mut run = LayoutRun {
        layout,
        read_limit,
        reads: Window::default(),
        commits: Window::default(),
        before_failure: None,
        after_failure: None,
        states_after: Vec::new(),
        copy_reads: Vec::new(),
    };
    if layout == Layout::MirroredFailing {
        // Half reads, half updates; the second copy of the data and of the
        // log fail for good a third into the run.
        let stop = Arc::new(AtomicBool::new(false));
        let c = Arc::new(Counters {
            ops: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: Histogram::default(),
        });
        let done = start_tasks(&db, a, 0.5, &stop, &c)?;
        std::thread::sleep(Duration::from_secs_f64(a.seconds / 4.0));
        run.before_failure = Some(measure(&rig, &c, a.seconds / 2.0));
        rig.data[1].inject(Fault::nth(None, 0).sticky());
        rig.log[1].inject(Fault::nth(None, 0).sticky());
        // The failure is noticed and recorded in the first moments after.
        std::thread::sleep(Duration::from_millis(200));
        run.after_failure = Some(measure(&rig, &c, a.seconds / 2.0));
        stop.store(true, Ordering::Relaxed);
        for _ in 0..a.tasks {
            done.recv_timeout(Duration::from_secs(60))
                .map_err(|_| CliError("a benchmark task did not stop".into()))?;
        }
        let total_errors = c.errors.load(Ordering::Relaxed);
        if let Some(w) = run.after_failure.as_mut() {
            // Every error any client saw, from the start.
            w.errors = total_errors;
        }
        run.states_after = rig
            .groups
            .iter()
            .map(|g| {
                let s: Vec<String> = g.states().iter().map(|s| format!("{s:?}")).collect();
                format!("{}: [{}]", g.role(), s.join(", "))
            })
            .collect();
        let failed = rig
            .groups
            .iter()
            .all(|g| g.states()[1] == CopyState::Failed);
        db.close().ok();
        if !failed {
            return Err(CliError(
                "the injected failure did not fail the copies it should have".into(),
            ));
        }
        return Ok(run);
    }
    run.reads = window(&db, &rig, a, 0.0)?;
    run.commits = window(&db, &rig, a, 1.0)?;
    run.copy_reads = rig.groups.first().map_or(Vec::new(), |g| {
        g.status().copies.iter().map(|c| c.reads).collect()
    });
    db.close()?;
    Ok(run)
}

fn render(r: &MirrorReport) -> String {
    let mut s = format!(
        "dana bench mirror: {} records of {} bytes ({:.0} MiB of pages), pool {} MiB, {} tasks on {} workers; simulated devices (memory, no kernel): {} requests/s each, {} us each; log synced, on its own device (two copies for the mirrored layouts)\n\n",
        thousands(r.records as f64),
        r.value_size,
        r.data_bytes as f64 / (1 << 20) as f64,
        r.pool_bytes >> 20,
        r.tasks,
        r.workers,
        thousands(f64::from(r.sim_iops)),
        r.sim_latency_us
    );
    s += &format!(
        "{:<16} {:>11} {:>12} {:>9} {:>15} {:>11} {:>13} {:>15}\n",
        "layout",
        "lookups/s",
        "dev reads/s",
        "of limit",
        "read p50/p99us",
        "commits/s",
        "dev writes/s",
        "commit p50/p99us"
    );
    for run in r
        .runs
        .iter()
        .filter(|x| x.layout != Layout::MirroredFailing)
    {
        s += &format!(
            "{:<16} {:>11} {:>12} {:>8.0}% {:>15} {:>11} {:>13} {:>15}\n",
            run.layout.name(),
            thousands(run.reads.ops_per_s),
            thousands(run.reads.device_reads_per_s),
            100.0 * run.reads.device_reads_per_s / run.read_limit,
            format!("{:.0}/{:.0}", run.reads.p50_us, run.reads.p99_us),
            thousands(run.commits.ops_per_s),
            thousands(run.commits.device_writes_per_s),
            format!("{:.0}/{:.0}", run.commits.p50_us, run.commits.p99_us),
        );
    }
    let by = |l| r.runs.iter().find(|x| x.layout == l);
    if let (Some(one), Some(st), Some(mi)) = (
        by(Layout::Single),
        by(Layout::Striped),
        by(Layout::Mirrored),
    ) {
        s += &format!(
            "\nmirrored pair: reads {:.2}x one device, {:.2}x the striped pair; commits {:.2}x one device (commit p99 {:.0} against {:.0} us)\n",
            mi.reads.ops_per_s / one.reads.ops_per_s.max(1e-9),
            mi.reads.ops_per_s / st.reads.ops_per_s.max(1e-9),
            mi.commits.ops_per_s / one.commits.ops_per_s.max(1e-9),
            mi.commits.p99_us,
            one.commits.p99_us
        );
    }
    if let Some(f) = by(Layout::MirroredFailing) {
        if let (Some(b), Some(a)) = (&f.before_failure, &f.after_failure) {
            s += &format!(
                "mirrored pair, half reads and half updates, copy 1 of the data and of the log failing for good mid-run: {} ops/s before, {} ops/s after (p99 {:.0} -> {:.0} us); errors seen by clients: {}; at the end {}\n",
                thousands(b.ops_per_s),
                thousands(a.ops_per_s),
                b.p99_us,
                a.p99_us,
                a.errors,
                f.states_after.join("; ")
            );
        }
    }
    s
}

/// `dana bench mirror`.
pub fn run(a: &MirrorArgs) -> CliResult<()> {
    let mut a = a.clone();
    if a.quick {
        a.records = a.records.min(200_000);
        a.seconds = a.seconds.min(1.0);
        a.pool_bytes = a.pool_bytes.min(4 << 20);
    }
    if a.records == 0 || a.value_size < 8 || a.tasks == 0 || a.sim_iops == 0 {
        return Err(CliError(
            "--records, --tasks and --sim-iops must be > 0 and --value-size >= 8".into(),
        ));
    }
    // Pages of the data: ~70 records of 120 bytes a page in key order;
    // sized with room for the updates.
    let per_page = (4000 / (a.value_size + 24)).max(1) as u64;
    let data_bytes = (a.records / per_page + 1024) * PAGE * 2 + (16 << 20);
    let mut runs = Vec::new();
    for layout in [
        Layout::Single,
        Layout::Striped,
        Layout::Mirrored,
        Layout::MirroredFailing,
    ] {
        if !a.json {
            eprintln!("{} ...", layout.name());
        }
        runs.push(run_layout(layout, &a, data_bytes)?);
    }
    let report = MirrorReport {
        records: a.records,
        value_size: a.value_size,
        pool_bytes: a.pool_bytes,
        data_bytes: (a.records / per_page) * PAGE,
        sim_iops: a.sim_iops,
        sim_latency_us: a.sim_latency_us,
        tasks: a.tasks,
        workers: a.workers,
        seconds: a.seconds,
        runs,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print!("{}", render(&report));
    }
    let errors: u64 = report
        .runs
        .iter()
        .flat_map(|r| {
            [
                Some(&r.reads),
                Some(&r.commits),
                r.before_failure.as_ref(),
                r.after_failure.as_ref(),
            ]
        })
        .flatten()
        .map(|w| w.errors)
        .sum();
    if errors > 0 {
        return Err(CliError(format!(
            "{errors} operations failed: a client saw an error"
        )));
    }
    Ok(())
}
