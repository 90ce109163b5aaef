//! `dana bench pages`: random page reads through the buffer manager, with
//! no tree on top: data 10x the pool, O_DIRECT, many tasks per worker.
//!
//! It isolates what the engine's core costs per page miss (scheduler,
//! page table, in-flight table, eviction, completion handling) by putting
//! it next to raw io_uring reads of the same files at their best depth
//! (swept before and after the run by the same command), or on simulated
//! devices, next to its CPU. Never: counts a page that holds another
//! page's id as a success (free-space map pages among the raw ones are
//! skipped).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::buffer::space_map::Geometry;
use dana::buffer::{PageType, PAGE_HEADER_SIZE};
use dana::io::sim::SimDisk;
use dana::{Db, Error, Options};
use serde::Serialize;

use super::diskstats::Disk;
use super::timeline::write_csv;
use super::{
    bar, clear_dana_files, data_files, describe_sweep, lower_best, sample, thousands, DepthSweep,
    DeviceLimit, LimitProbe, Measured, RunState,
};
use crate::report::Machine;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

const PAGE: usize = 4096;

/// Arguments of `dana bench pages`.
#[derive(Args, Debug, Clone)]
pub struct PagesArgs {
    /// Directory of the page file (created on first use).
    #[arg(long, default_value = "./dana-data/pages")]
    pub path: PathBuf,
    /// Buffer pool size in MiB.
    #[arg(long, default_value_t = 256)]
    pub pool_mib: u64,
    /// Data size as a multiple of the pool.
    #[arg(long, default_value_t = 10.0)]
    pub data_over_pool: f64,
    /// Measured seconds.
    #[arg(long, default_value_t = 15.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Warm-up seconds.
    #[arg(long, default_value_t = 3.0, value_parser = crate::bench::parse_seconds)]
    pub warmup: f64,
    /// Seconds of the raw io_uring measurement.
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_seconds)]
    pub limit_seconds: f64,
    /// Small and short (for tests).
    #[arg(long)]
    pub quick: bool,
    /// Simulated devices in place of files.
    #[command(flatten)]
    pub sim_args: super::SimArgs,
    /// Engine settings.
    #[command(flatten)]
    pub engine: super::EngineArgs,
    /// Output settings.
    #[command(flatten)]
    pub output: super::OutputArgs,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct PagesReport {
    /// Machine facts.
    pub machine: Machine,
    /// Pages of data.
    pub pages: u64,
    /// Pool bytes.
    pub pool_bytes: u64,
    /// Data bytes.
    pub data_bytes: u64,
    /// Workers.
    pub workers: usize,
    /// Tasks per worker.
    pub tasks_per_worker: usize,
    /// `--device-budget`.
    pub device_budget: super::DeviceBudgetArg,
    /// Raw reads swept over depths before the engine's run.
    pub sweep_before: Option<DepthSweep>,
    /// The same after it.
    pub sweep_after: Option<DepthSweep>,
    /// The simulated devices (None: files); the limit is then their
    /// configured rate.
    pub sim: Option<super::SimInfo>,
    /// The device limit: the lower of the two sweeps' best (None on
    /// simulated devices).
    pub device_limit: Option<DeviceLimit>,
    /// Engine page reads/s / raw reads/s.
    pub iops_vs_limit: f64,
    /// Raw reads with each read submitted at once (fio's pattern), at the
    /// best depth of the sweep before.
    pub device_limit_each: Option<DeviceLimit>,
    /// Engine page reads/s / that.
    pub iops_vs_limit_each: Option<f64>,
    /// The window's figures (ops = page fixes).
    pub run: Measured,
}

/// Runs `dana bench pages`.
pub fn run(args: &PagesArgs) -> CliResult<()> {
    let mut a = args.clone();
    if a.quick {
        a.pool_mib = a.pool_mib.min(8);
        a.seconds = a.seconds.min(2.0);
        a.warmup = a.warmup.min(0.5);
        a.limit_seconds = a.limit_seconds.min(1.0);
    }
    let pool_bytes = a.pool_mib << 20;
    let pages = ((pool_bytes as f64 * a.data_over_pool) as u64 / PAGE as u64).max(16);
    let sim = a
        .sim_args
        .devices((pages + 1024 + pages / 16_000) * PAGE as u64)?;
    if sim.is_some() && a.engine.durability != dana::Durability::Off {
        return Err(CliError("--sim-devices runs without a log".into()));
    }
    let first = ensure_pages(&a, pages, sim.as_deref().map(Vec::as_slice))?;
    let files = if sim.is_some() {
        Vec::new()
    } else {
        data_files(&a.path)
    };
    let data_bytes = (first + pages) * PAGE as u64;
    let probe = LimitProbe::new(
        &files,
        data_bytes / files.len().max(1) as u64,
        a.limit_seconds,
    );
    let (sweep_before, limit_each) = probe.before()?;

    let opts = a
        .engine
        .device_budget
        .apply(Options::default())
        .pool_bytes(pool_bytes as usize)
        .workers(a.engine.workers)
        .submit_each(a.engine.submit_each)
        .max_tasks_per_worker(a.engine.tasks_per_worker * 2)
        .durability(a.engine.durability);
    let db = match &sim {
        Some(d) => super::open_sim(d, opts, false)?,
        None => Db::open(&a.path, opts)?,
    };
    let disk = files.first().and_then(|f| Disk::of(f));
    if let Some(f) = files.first() {
        crate::report::note_memory_backed(f);
    }
    let state = Arc::new(RunState::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let tasks = a.engine.workers * a.engine.tasks_per_worker;
    for t in 0..tasks {
        let (pool, state, tx) = (db.pool().clone(), state.clone(), tx.clone());
        db.spawn_on(t % a.engine.workers, async move {
            let mut rng = XorShift::new(0xFACE + t as u64);
            let map = Geometry::new(PAGE);
            while !state.stop.load(Ordering::Relaxed) {
                let pid = first + rng.below(pages);
                if map.is_reserved(pid) {
                    // A free-space map page among the raw ones (every
                    // 32,512th page): not part of the data set.
                    continue;
                }
                let t0 = Instant::now();
                let r = pool
                    .fix_shared(pid)
                    .await
                    .map(|g| g[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + 8] == pid.to_le_bytes());
                state.latency.record(t0.elapsed());
                match r {
                    Ok(true) => {}
                    Ok(false) => state.fail(format!("page {pid} holds another page")),
                    Err(e) => state.fail(format!("page {pid}: {e}")),
                }
                state.ops.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        })?;
    }
    drop(tx);
    let total = Duration::from_secs_f64(a.warmup + a.seconds);
    let pb = bar(
        a.output.quiet || a.output.json,
        total.as_millis() as u64,
        "page reads",
    );
    let m = sample(
        &db,
        &state,
        Duration::from_secs_f64(a.warmup),
        Duration::from_secs_f64(a.seconds),
        PAGE,
        disk.as_ref(),
        Some(&pb),
    );
    pb.finish_and_clear();
    state.stop.store(true, Ordering::Relaxed);
    for _ in 0..tasks {
        rx.recv_timeout(Duration::from_secs(30))
            .map_err(|_| CliError("a page task did not stop".into()))?;
    }
    db.close()?;
    let sweep_after = probe.sweep()?;
    let limit = lower_best(&sweep_before, &sweep_after);
    let sim_info = a.sim_args.info();
    let limit_iops = match (&sim_info, &limit) {
        (Some(s), _) => s.limit(),
        (None, Some(l)) => l.iops,
        (None, None) => return Err(CliError("no device limit measured".into())),
    };
    let out = a
        .path
        .parent()
        .map_or(PathBuf::from("."), |p| p.to_path_buf())
        .join("bench-out");
    std::fs::create_dir_all(&out).context(format!("creating {}", out.display()))?;
    write_csv(&out.join("pages.csv"), &m.timeline)?;
    let report = PagesReport {
        machine: Machine::probe(),
        pages,
        pool_bytes,
        data_bytes,
        workers: a.engine.workers,
        tasks_per_worker: a.engine.tasks_per_worker,
        iops_vs_limit: m.engine_reads_per_s / limit_iops.max(1e-9),
        iops_vs_limit_each: limit_each
            .as_ref()
            .map(|l| m.engine_reads_per_s / l.iops.max(1e-9)),
        sim: sim_info,
        device_limit_each: limit_each,
        device_limit: limit,
        device_budget: a.engine.device_budget,
        sweep_before,
        sweep_after,
        run: m,
    };
    if a.output.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("encoding the report")?
        );
    } else {
        print!("{}", render(&report));
    }
    crate::bench::fail_on_errors(&report)
}

/// Creates `pages` raw pages holding their own id (once), returns the
/// first page id.
fn ensure_pages(a: &PagesArgs, pages: u64, sim: Option<&[Arc<SimDisk>]>) -> CliResult<u64> {
    let marker = a.path.join("LOADED");
    let want = format!("pages={pages} page_size={PAGE}\n");
    let first_of = |s: &str| {
        s.lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("first="))
            .and_then(|v| v.parse().ok())
    };
    if let (Ok(s), None) = (std::fs::read_to_string(&marker), sim) {
        if s.starts_with(&want) {
            if let Some(first) = first_of(&s) {
                return Ok(first);
            }
        }
    }
    if sim.is_none() {
        std::fs::create_dir_all(&a.path).context(format!("creating {}", a.path.display()))?;
        clear_dana_files(&a.path)?;
    }
    let capacity = (pages + 1024) * PAGE as u64;
    let opts = Options::default()
        .pool_bytes(((pages + 4096) * PAGE as u64).min(8 << 30) as usize)
        .workers(1)
        .capacity_bytes(capacity)
        .durability(dana::Durability::Off);
    let db = match sim {
        Some(d) => super::open_sim(d, opts, true)?,
        None => Db::open(&a.path, opts)?,
    };
    let pool = db.pool().clone();
    let first = db.block_on(async move {
        let mut first = None;
        for _ in 0..pages {
            let mut g = pool.allocate(PageType::Raw).await?;
            let pid = g.pid();
            first.get_or_insert(pid);
            g[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + 8].copy_from_slice(&pid.to_le_bytes());
        }
        pool.flush_all().await?;
        Ok::<_, Error>(first.unwrap_or(0))
    })??;
    db.close()?;
    if sim.is_none() {
        std::fs::write(&marker, format!("{want}first={first}\n")).context("writing the marker")?;
    }
    Ok(first)
}

/// The human report.
pub fn render(r: &PagesReport) -> String {
    let m = &r.run;
    let mut s = format!(
        "dana bench pages: {} pages ({:.2} GiB), pool {} MiB ({:.1}x smaller), {} workers x {} tasks\n",
        thousands(r.pages as f64),
        r.data_bytes as f64 / (1u64 << 30) as f64,
        r.pool_bytes >> 20,
        r.data_bytes as f64 / r.pool_bytes as f64,
        r.workers,
        r.tasks_per_worker
    );
    if let Some(sim) = &r.sim {
        s += &sim.describe();
    }
    if let (Some(b), Some(a)) = (&r.sweep_before, &r.sweep_after) {
        s += &format!(
            "raw depth sweep before: {}\nraw depth sweep after: {}\n",
            describe_sweep(b),
            describe_sweep(a)
        );
    }
    if let Some(l) = &r.device_limit {
        s += &format!(
            "device limit (the lower best of the two sweeps), depth {}: {} reads/s, {:.2} CPU us/read\n",
            l.depth,
            thousands(l.iops),
            l.cpu_us_per_io
        );
    }
    if let (Some(l), Some(ratio)) = (&r.device_limit_each, r.iops_vs_limit_each) {
        s += &format!(
            "raw, each read submitted at once (fio's pattern): {} reads/s, {:.2} CPU us/read; dana = {:.1}% of it\n",
            thousands(l.iops),
            l.cpu_us_per_io,
            ratio * 100.0
        );
    }
    s += &format!(
        "dana: {} page fixes/s, {} page reads/s = {:.1}% of the device limit; hit rate {:.3}; {:.2} CPU us per page miss, {} page fixes per second of whole-process CPU\n",
        thousands(m.ops_per_s),
        thousands(m.engine_reads_per_s),
        r.iops_vs_limit * 100.0,
        m.hit_rate,
        m.cpu_us_per_io,
        thousands(m.ops_per_cpu_s)
    );
    s += &format!(
        "fix latency us: p50 {:.0}, p99 {:.0}, p99.9 {:.0}\n",
        m.latency.p50_us, m.latency.p99_us, m.latency.p999_us
    );
    s += &format!(
        "task wait per miss (mean / p50 / p99 us): whole {:.0} / {:.0} / {:.0}; queued in engine {:.0} / {:.0} / {:.0}; kernel+device {:.0} / {:.0} / {:.0}; waiting to resume {:.0} / {:.0} / {:.0}\n",
        m.miss.mean_us, m.miss.p50_us, m.miss.p99_us,
        m.miss_queued.mean_us, m.miss_queued.p50_us, m.miss_queued.p99_us,
        m.miss_device.mean_us, m.miss_device.p50_us, m.miss_device.p99_us,
        m.miss_resume.mean_us, m.miss_resume.p50_us, m.miss_resume.p99_us
    );
    s += &format!(
        "device budget ({}): {}\n",
        r.device_budget,
        m.budget.describe()
    );
    if let Some(d) = m.disk_reads_per_s {
        s += &format!("block device (/proc/diskstats): {} reads/s\n", thousands(d));
    }
    if m.errors > 0 {
        s += &format!(
            "ERRORS: {}; first: {}\n",
            m.errors,
            m.first_error.as_deref().unwrap_or("?")
        );
    }
    s
}
