//! `dana bench commit`: group commit at work, and what the log costs.
//!
//! Owns: two measurements on one database directory. (1) Commits per
//! second with `Sync` durability for each number of concurrent committing
//! tasks (each commit one 8-byte key and 120-byte value, random keys; the
//! value 60 random bytes and a copy of them, so that it compresses about
//! 2x, as the report says), with
//! the flushes they took, next to a loop of one 4 KiB O_DIRECT durable
//! write per commit on a file in the same directory, by the primitive the
//! log flushes with (an `O_DSYNC` write, or a write plus fdatasync): what
//! a commit costs without group commit. (2) Inserts per second by the same tasks
//! with the log off, async and sync, so the log's cost shows as a ratio;
//! then async and sync again for each further checkpoint shard count
//! asked, in the same invocation (continuous against whole checkpoints). Each insert
//! run also reports its commit latency percentiles, its slowest 100 ms
//! against its mean, and the log in use (what recovery would read after a
//! crash) sampled every 100 ms.
//! Never: reports a figure it did not measure in this invocation.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::AlignedBuf;
use dana::wal::WalStatsSnapshot;
use dana::{Db, Durability, Options};
use hdrhistogram::Histogram;

use crate::report::process_cpu_seconds;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

/// Arguments of `dana bench commit`.
#[derive(Args, Debug, Clone)]
pub struct CommitArgs {
    /// Database directory (recreated).
    #[arg(long, default_value = "dana-data/commit")]
    pub path: PathBuf,
    /// Concurrent committing tasks, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub tasks: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Buffer pool bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub pool_bytes: usize,
    /// Write-ahead logs (0: one per worker; see `Options::logs`).
    #[arg(long, default_value_t = 1)]
    pub logs: usize,
    /// Checkpoint shards (`Options::checkpoint_shards`; 1: whole
    /// checkpoints). The first runs every measurement; each further one
    /// runs the async and sync inserts again.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub checkpoint_shards: Vec<usize>,
    /// Log flushes of at most this many bytes are durable writes, larger
    /// ones write + fdatasync (`Options::log_write_through_max`; default:
    /// the option's). The raw loop uses the primitive of a 4 KiB flush:
    /// an O_DSYNC write, or a write + fdatasync.
    #[arg(long, default_value_t = Options::default().log_write_through_max_value())]
    pub log_write_through_max: u64,
    /// The unit the log pads each flush to (`Options::log_flush_block`;
    /// 0: the device's alignment).
    #[arg(long, default_value_t = 0)]
    pub log_flush_block: u64,
    /// The most flushes of the log in flight at once
    /// (`Options::log_flushes_in_flight`).
    #[arg(long, default_value_t = Options::default().log_flushes_in_flight_value())]
    pub log_flushes_in_flight: usize,
    /// Bytes of the log (`Options::log_bytes`), preallocated before the
    /// run.
    #[arg(long, default_value_t = 256 << 20)]
    pub log_bytes: u64,
    /// Log full page images compressed (`Options::compress_log_images`).
    #[arg(long, default_value_t = Options::default().compress_log_images_value(), action = clap::ArgAction::Set)]
    pub compress_log_images: bool,
    /// Where page writes land (`Options::write_mode`): `in-place`,
    /// `out-of-place` (append-only segments in a file of fixed capacity,
    /// 4 GiB here; a write-back cannot tear a page's last good version, so
    /// the log holds no torn-page images) or `out-of-place-lz4`.
    #[arg(long, value_enum, default_value = "in-place")]
    pub write_mode: crate::bench::waf::WriteMode,
}

fn options(a: &CommitArgs, d: Durability) -> Options {
    options_sharded(a, d, a.checkpoint_shards.first().copied().unwrap_or(8))
}

fn options_sharded(a: &CommitArgs, d: Durability, shards: usize) -> Options {
    a.write_mode
        .apply(Options::default())
        .checkpoint_shards(shards)
        .pool_bytes(a.pool_bytes)
        .workers(a.workers)
        .logs(a.logs)
        .capacity_bytes(4 << 30)
        .log_bytes(a.log_bytes)
        // Whole and zero-filled before the run: this measures the log's
        // steady state, not the growth of a new log file's first lap.
        .log_preallocate(true)
        .log_write_through_max(a.log_write_through_max)
        .log_flush_block(a.log_flush_block)
        .log_flushes_in_flight(a.log_flushes_in_flight)
        .compress_log_images(a.compress_log_images)
        .max_tasks_per_worker(super::MAX_TASKS_PER_WORKER)
        .durability(d)
}

/// What one run of [`commit_rate`] saw besides the rate.
struct RunShape {
    /// Commit latency, µs (acknowledged commits).
    latency: Histogram<u64>,
    /// Commits in the slowest 100 ms window, per second.
    slowest_window: f64,
    /// Log in use (redo point to end), sampled every 100 ms: most and mean.
    in_use_max: u64,
    in_use_mean: f64,
    /// Whole-process CPU seconds (getrusage: every thread, the kernel's
    /// io_uring workers included) over the window.
    cpu_seconds: f64,
    /// Task polls of the engine's workers over the window.
    polls: u64,
    /// Pages the buffer pool wrote back over the window (eviction and
    /// checkpoints).
    page_writes: u64,
}

/// Task polls of every worker so far.
fn polls(db: &Db) -> u64 {
    let rt = db.runtime();
    (0..rt.workers())
        .map(|i| rt.worker_stats(i).polls.load(Ordering::Relaxed))
        .sum()
}

/// Runs `tasks` tasks committing one-write transactions for `secs`;
/// returns commits/s, the commits counted, what the log did meanwhile and
/// the run's shape.
fn commit_rate(
    db: &Db,
    tasks: usize,
    secs: f64,
    seed: u64,
) -> CliResult<(f64, u64, WalStatsSnapshot, RunShape)> {
    let tree = db.tree_or_create("t")?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let before = db.wal_stats().unwrap_or_default();
    let (cpu_before, polls_before) = (process_cpu_seconds(), polls(db));
    let writes_before = db.pool_stats().writebacks;
    let started = Instant::now();
    for t in 0..tasks {
        let (tree, stop, done, failed, tx) = (
            tree.clone(),
            stop.clone(),
            done.clone(),
            failed.clone(),
            tx.clone(),
        );
        let d = db.clone();
        db.spawn(async move {
            let mut r = XorShift::new(seed ^ ((t as u64 + 1) * 7919));
            let mut lat = latency_histogram();
            let mut value = [0u8; 120];
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                let mut txn = d.begin();
                let key = r.next_u64().to_be_bytes();
                half_random(&mut r, &mut value);
                let ok = txn.put(&tree, &key, &value).is_ok() && txn.commit_async().await.is_ok();
                if ok {
                    // Counted and timed only inside the window: a commit
                    // ending after it closed is in neither (its latency
                    // was recorded, uncounted; a review's finding).
                    if !stop.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                        lat.saturating_record(began.elapsed().as_micros() as u64);
                    }
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = tx.send(lat);
        })?;
    }
    drop(tx);
    // Sample the rate and the log in use every 100 ms.
    let window = Duration::from_millis(100);
    let (mut slowest, mut last, mut in_use_max, mut in_use_sum, mut samples) =
        (f64::INFINITY, 0u64, 0u64, 0u64, 0u64);
    while started.elapsed().as_secs_f64() + window.as_secs_f64() <= secs {
        let t0 = Instant::now();
        std::thread::sleep(window);
        let now = done.load(Ordering::Relaxed);
        // Not the first window: the tasks were still being spawned.
        if samples > 0 {
            slowest = slowest.min((now - last) as f64 / t0.elapsed().as_secs_f64());
        }
        last = now;
        let in_use = db.wal_stats().map_or(0, |s| s.in_use);
        in_use_max = in_use_max.max(in_use);
        in_use_sum += in_use;
        samples += 1;
    }
    let rest = secs - started.elapsed().as_secs_f64();
    if rest > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(rest));
    }
    stop.store(true, Ordering::Relaxed);
    let n = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let after = db.wal_stats().unwrap_or_default();
    let (cpu_seconds, polls) = (process_cpu_seconds() - cpu_before, polls(db) - polls_before);
    let page_writes = db.pool_stats().writebacks - writes_before;
    let mut latency = latency_histogram();
    for h in rx {
        latency
            .add(&h)
            .map_err(|e| CliError(format!("merging latencies: {e}")))?;
    }
    if failed.load(Ordering::Relaxed) > 0 {
        return Err(CliError(format!(
            "{} commits failed",
            failed.load(Ordering::Relaxed)
        )));
    }
    let shape = RunShape {
        latency,
        slowest_window: if slowest.is_finite() { slowest } else { 0.0 },
        in_use_max,
        in_use_mean: in_use_sum as f64 / samples.max(1) as f64,
        cpu_seconds,
        polls,
        page_writes,
    };
    Ok((n as f64 / elapsed, n, after.since(&before), shape))
}

/// Fills `value` with random bytes in its first half and a copy of them in
/// its second: a value that compresses about 2x, neither as well as one
/// byte repeated nor as badly as noise.
fn half_random(r: &mut XorShift, value: &mut [u8]) {
    let half = value.len() / 2;
    for chunk in value[..half].chunks_mut(8) {
        let x = r.next_u64().to_le_bytes();
        chunk.copy_from_slice(&x[..chunk.len()]);
    }
    value.copy_within(..half, half);
}

/// Commit latencies in µs, 1 µs to 100 s.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// One 4 KiB O_DIRECT write plus its sync per commit, for `secs`: the
/// flush primitive dana's log uses (`write_through`: one O_DSYNC write,
/// which is RWF_DSYNC on every write; else the write, then fdatasync).
fn sync_loop_rate(path: &std::path::Path, secs: f64, write_through: bool) -> CliResult<f64> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | if write_through { libc::O_DSYNC } else { 0 })
        .open(path)
        .context(format!("opening {}", path.display()))?;
    let mut buf = AlignedBuf::new(4096, 4096)?;
    buf.fill(0x5a);
    // The loop's 4 MiB written and synced first: its writes are then plain
    // overwrites, like those of dana's preallocated log.
    if f.metadata().context("stat")?.len() < 1024 * 4096 {
        for b in 0..1024u64 {
            f.write_all_at(&buf, b * 4096).context("write")?;
        }
        f.sync_all().context("fsync")?;
    }
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        buf[0..8].copy_from_slice(&n.to_le_bytes());
        let at = (n % 1024) * 4096;
        f.write_all_at(&buf, at).context("write")?;
        if !write_through {
            f.sync_data().context("fdatasync")?;
        }
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Runs `dana bench commit`.
pub fn run(a: &CommitArgs) -> CliResult<()> {
    for &t in &a.tasks {
        super::check_tasks(t, a.workers)?;
    }
    super::fresh_bench_dir(&a.path)?;
    crate::report::note_memory_backed(&a.path);
    println!(
        "dana bench commit: {} workers, {} logs, pool {} MiB, {} s per point, 8-byte keys, \
         120-byte values (60 random bytes, then a copy), one write per commit, log images {}, \
         pages {}",
        a.workers,
        options(a, Durability::Sync).logs_value(),
        a.pool_bytes >> 20,
        a.seconds,
        if a.compress_log_images {
            "compressed"
        } else {
            "plain"
        },
        a.write_mode.name()
    );
    let write_through = a.log_write_through_max >= 4096;
    let probe = a.path.join("sync-probe");
    // The raw loop before and after dana's points (the disk drifts); the
    // ratios use the higher of the two, the one less kind to dana.
    // (Measured once before, a review's finding.)
    let base_before = sync_loop_rate(&probe, a.seconds, write_through)?;
    let mut rows = Vec::new();
    {
        let db = Db::open(a.path.join("db"), options(a, Durability::Sync))?;
        for &t in &a.tasks {
            rows.push((t, commit_rate(&db, t, a.seconds, t as u64)?));
        }
        db.close()?;
    }
    let base_after = sync_loop_rate(&probe, a.seconds, write_through)?;
    let base = base_before.max(base_after);
    let primitive = if write_through {
        "O_DSYNC write"
    } else {
        "write + fdatasync"
    };
    println!(
        "one 4 KiB O_DIRECT {primitive} per commit (same file system, dana's log flush primitive): \
         {base_before:.0} commits/s before dana's points, {base_after:.0} after; x raw is of the \
         higher"
    );
    println!(
        "{:>6} {:>12} {:>10} {:>14} {:>10} {:>10}",
        "tasks", "commits/s", "x raw", "commits/flush", "log B/c", "pages/c"
    );
    for (t, (rate, n, u, shape)) in rows {
        let commits = n.max(1) as f64;
        println!(
            "{t:>6} {rate:>12.0} {:>10.2} {:>14.1} {:>10.0} {:>10.3}",
            rate / base,
            commits / u.flushes.max(1) as f64,
            u.bytes as f64 / commits,
            shape.page_writes as f64 / commits
        );
    }
    let t = *a.tasks.iter().max().unwrap_or(&256);
    let first = a.checkpoint_shards.first().copied().unwrap_or(8);
    println!(
        "inserts with {t} tasks, each insert its own commit ({first} checkpoint shards unless \
         said):"
    );
    let mut off = 0.0;
    let mut runs: Vec<(String, Durability, usize)> = [
        ("off", Durability::Off),
        ("async", Durability::Async),
        ("sync", Durability::Sync),
    ]
    .into_iter()
    .map(|(n, d)| (n.to_string(), d, first))
    .collect();
    for &s in a.checkpoint_shards.iter().skip(1) {
        runs.push((format!("async, {s} shards"), Durability::Async, s));
        runs.push((format!("sync, {s} shards"), Durability::Sync, s));
    }
    for (name, d, shards) in runs {
        let dir = a.path.join("insert");
        let _ = std::fs::remove_dir_all(&dir);
        let db = Db::open(&dir, options_sharded(a, d, shards))?;
        let (rate, n, u, shape) = commit_rate(&db, t, a.seconds, 99)?;
        if d == Durability::Off {
            off = rate;
        }
        let n = n.max(1) as f64;
        let q = |p: f64| shape.latency.value_at_quantile(p);
        println!(
            "  log {name:<5} {rate:>10.0} inserts/s  {:>5.2} of log off  {:>6.0} log bytes/insert \
             (commit records {:.0}, page records {:.0}, full images per 1,000 inserts {:.0} \
             ({:.0} compressed), checkpoints {}, commits that waited for log space {})",
            rate / off.max(1.0),
            u.bytes as f64 / n,
            u.commit_bytes as f64 / n,
            u.page_bytes as f64 / n,
            u.images as f64 * 1000.0 / n,
            u.compressed_images as f64 * 1000.0 / n,
            u.checkpoints,
            u.admit_waits
        );
        println!(
            "      CPU µs/insert {:.2} (whole process), task polls/insert {:.2}, page writes/insert \
             {:.3}; latency µs p50 {} \
             p99 {} p99.9 {} max {}; slowest 100 ms {:.2} of the mean; log in use (recovery's \
             read) mean {:.1} MiB, most {:.1} MiB",
            shape.cpu_seconds * 1e6 / n,
            shape.polls as f64 / n,
            shape.page_writes as f64 / n,
            q(0.5),
            q(0.99),
            q(0.999),
            shape.latency.max(),
            shape.slowest_window / rate.max(1.0),
            shape.in_use_mean / (1 << 20) as f64,
            shape.in_use_max as f64 / (1 << 20) as f64
        );
        db.close()?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_file(a.path.join("sync-probe"));
    Ok(())
}
