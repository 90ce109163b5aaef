//! `dana bench commit`: group commit at work, and what the log costs.
//!
//! Owns: two measurements on one database directory. (1) Commits per
//! second with `Sync` durability for each number of concurrent committing
//! tasks (each commit one 8-byte key and 120-byte value, random keys), with
//! the flushes they took, next to a loop of one 4 KiB O_DIRECT write plus
//! fdatasync per commit on a file in the same directory (what a commit
//! costs without group commit). (2) Inserts per second by the same tasks
//! with the log off, async and sync, so the log's cost shows as a ratio.
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
    #[arg(long, default_value_t = 5.0)]
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
}

fn options(a: &CommitArgs, d: Durability) -> Options {
    Options::default()
        .pool_bytes(a.pool_bytes)
        .workers(a.workers)
        .logs(a.logs)
        .capacity_bytes(4 << 30)
        .log_bytes(256 << 20)
        // Whole and zero-filled before the run: this measures the log's
        // steady state, not the growth of a new log file's first lap.
        .log_preallocate(true)
        .max_tasks_per_worker(1024)
        .durability(d)
}

/// Runs `tasks` tasks committing one-write transactions for `secs`;
/// returns commits/s, the commits counted and what the log did meanwhile.
fn commit_rate(
    db: &Db,
    tasks: usize,
    secs: f64,
    seed: u64,
) -> CliResult<(f64, u64, WalStatsSnapshot)> {
    let tree = db.tree_or_create("t")?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let before = db.wal_stats().unwrap_or_default();
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
            while !stop.load(Ordering::Relaxed) {
                let mut txn = d.begin();
                let key = r.next_u64().to_be_bytes();
                let ok =
                    txn.put(&tree, &key, &[7u8; 120]).is_ok() && txn.commit_async().await.is_ok();
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = tx.send(());
        })?;
    }
    drop(tx);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let n = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let after = db.wal_stats().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    for _ in rx {}
    if failed.load(Ordering::Relaxed) > 0 {
        return Err(CliError(format!(
            "{} commits failed",
            failed.load(Ordering::Relaxed)
        )));
    }
    Ok((n as f64 / elapsed, n, after.since(&before)))
}

/// One 4 KiB O_DIRECT write plus fdatasync per commit, for `secs`.
fn fdatasync_rate(path: &std::path::Path, secs: f64) -> CliResult<f64> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .context(format!("opening {}", path.display()))?;
    let mut buf = AlignedBuf::new(4096, 4096)?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        buf[0..8].copy_from_slice(&n.to_le_bytes());
        f.write_all_at(&buf, (n % 1024) * 4096).context("write")?;
        f.sync_data().context("fdatasync")?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Runs `dana bench commit`.
pub fn run(a: &CommitArgs) -> CliResult<()> {
    let _ = std::fs::remove_dir_all(&a.path);
    std::fs::create_dir_all(&a.path).context(format!("creating {}", a.path.display()))?;
    println!(
        "dana bench commit: {} workers, {} logs, pool {} MiB, {} s per point, 8-byte keys, 120-byte values, one write per commit",
        a.workers,
        options(a, Durability::Sync).logs_value(),
        a.pool_bytes >> 20,
        a.seconds
    );
    let base = fdatasync_rate(&a.path.join("fdatasync-probe"), a.seconds)?;
    println!(
        "one 4 KiB O_DIRECT write + fdatasync per commit (same file system): {base:.0} commits/s"
    );
    println!(
        "{:>6} {:>12} {:>10} {:>14} {:>10}",
        "tasks", "commits/s", "x fsync", "commits/flush", "log B/c"
    );
    {
        let db = Db::open(a.path.join("db"), options(a, Durability::Sync))?;
        for &t in &a.tasks {
            let (rate, n, u) = commit_rate(&db, t, a.seconds, t as u64)?;
            let commits = n.max(1) as f64;
            println!(
                "{t:>6} {rate:>12.0} {:>10.2} {:>14.1} {:>10.0}",
                rate / base,
                commits / u.flushes.max(1) as f64,
                u.bytes as f64 / commits
            );
        }
        db.close()?;
    }
    let t = *a.tasks.iter().max().unwrap_or(&256);
    println!("inserts with {t} tasks, each insert its own commit:");
    let mut off = 0.0;
    for (name, d) in [
        ("off", Durability::Off),
        ("async", Durability::Async),
        ("sync", Durability::Sync),
    ] {
        let dir = a.path.join(format!("insert-{name}"));
        let db = Db::open(&dir, options(a, d))?;
        let (rate, n, u) = commit_rate(&db, t, a.seconds, 99)?;
        if d == Durability::Off {
            off = rate;
        }
        let n = n.max(1) as f64;
        println!(
            "  log {name:<5} {rate:>10.0} inserts/s  {:>5.2} of log off  {:>6.0} log bytes/insert \
             (commit records {:.0}, page records {:.0}, full images per 1,000 inserts {:.0}, \
             checkpoints {}, commits that waited for log space {})",
            rate / off.max(1.0),
            u.bytes as f64 / n,
            u.commit_bytes as f64 / n,
            u.page_bytes as f64 / n,
            u.images as f64 * 1000.0 / n,
            u.checkpoints,
            u.admit_waits
        );
        db.close()?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_file(a.path.join("fdatasync-probe"));
    Ok(())
}
