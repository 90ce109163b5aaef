//! `dana rebuild`: repopulates the failed copies of a mirrored database
//! from its healthy ones (`Db::rebuild`), printing progress.
//!
//! The database is opened writable (recovery runs first if it crashed),
//! every copy that is not healthy is rebuilt (a failed copy onto the file
//! at its path: a replaced file, or a new one where the old was removed),
//! and the database is closed. A rebuild cut short (a crash, a kill, a
//! close) resumes where its last recorded range ended the next time the
//! database opens. The library rebuilds online (`Db::rebuild` from a
//! thread of its own while the database serves); this command is that
//! call with nothing else running.
//!
//! Never: opens a database that is not mirrored as if it were, or reports
//! a copy healthy that the labels do not say is.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::mirror::{CopyState, MirrorStatus};
use dana::{Db, Options};

use crate::{CliError, CliResult, Context};

/// Options of `dana rebuild`.
#[derive(Args, Debug)]
pub struct RebuildArgs {
    /// The database directory.
    #[arg(long)]
    pub path: PathBuf,
    /// Buffer pool while rebuilding.
    #[arg(long, default_value_t = 64 << 20)]
    pub pool_bytes: usize,
    /// The database's page size (`Options::page_size` when it was
    /// created).
    #[arg(long, default_value_t = 4096)]
    pub page_size: usize,
    /// The log's path, for a database created with `Options::log_path`.
    #[arg(long)]
    pub log_path: Option<PathBuf>,
}

fn print_status(status: &[MirrorStatus]) {
    for g in status {
        let copies: Vec<String> = g
            .copies
            .iter()
            .map(|c| match c.state {
                CopyState::Rebuilding { done } => format!(
                    "{}: rebuilding {:.1}% ({})",
                    c.copy,
                    100.0 * done as f64 / g.size.max(1) as f64,
                    c.name
                ),
                s => format!("{}: {s:?} ({})", c.copy, c.name),
            })
            .collect();
        println!(
            "{}: generation {}; {}",
            g.role,
            g.generation,
            copies.join("; ")
        );
    }
}

/// `dana rebuild`.
pub fn run(args: &RebuildArgs) -> CliResult<()> {
    if !args.path.join("dana.0").exists() && !args.path.join("dana.0.m1").exists() {
        return Err(CliError(format!(
            "{} is not a dana database (no dana.0)",
            args.path.display()
        )));
    }
    let mut opts = Options::default()
        .pool_bytes(args.pool_bytes)
        .page_size(args.page_size);
    if let Some(log) = &args.log_path {
        opts = opts.log_path(log);
    }
    // Read-only first: a database that is not mirrored is left as it was
    // (the first version opened it writable, formatting a log for a
    // database without one, before finding nothing to rebuild). One that
    // needs recovery is recovered by the writable open below.
    match Db::open(&args.path, opts.clone().read_only()) {
        Ok(db) => {
            let mirrored = !db.mirror_status().is_empty();
            db.close()?;
            if !mirrored {
                return Err(CliError(format!(
                    "{} is not mirrored: nothing to rebuild",
                    args.path.display()
                )));
            }
        }
        Err(dana::Error::NeedsRecovery(_)) => {}
        Err(e) => return Err(e).context(format!("opening {}", args.path.display())),
    }
    let db = Db::open(&args.path, opts).context(format!("opening {}", args.path.display()))?;
    let status = db.mirror_status();
    if status.is_empty() {
        db.close()?;
        return Err(CliError(format!(
            "{} is not mirrored: nothing to rebuild",
            args.path.display()
        )));
    }
    print_status(&status);
    let started = Instant::now();
    let stats_before = db.pool_stats();
    let reports = std::thread::scope(|s| {
        let job = s.spawn(|| db.rebuild());
        let mut last = Instant::now();
        while !job.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
            if last.elapsed() >= Duration::from_secs(2) {
                print_status(&db.mirror_status());
                last = Instant::now();
            }
        }
        job.join()
            .map_err(|_| CliError("the rebuild thread panicked".into()))
    })?;
    let reports = reports.context("rebuilding")?;
    for r in &reports {
        println!(
            "{} copy {}: {:.1} MiB copied{} in {:.1} s",
            r.role,
            r.copy,
            r.bytes as f64 / (1 << 20) as f64,
            if r.resumed_from > 0 {
                format!(
                    " (resumed at {:.1} MiB)",
                    r.resumed_from as f64 / (1 << 20) as f64
                )
            } else {
                String::new()
            },
            r.seconds
        );
    }
    let stats = db.pool_stats();
    let repaired = stats.blob_repairs - stats_before.blob_repairs;
    if repaired > 0 {
        println!("large values whose damaged copies were written from a whole one: {repaired}");
    }
    let repaired = stats.page_copy_repairs - stats_before.page_copy_repairs;
    if repaired > 0 {
        println!("pages whose damaged copies were written from a valid version: {repaired}");
    }
    let left = stats.page_copy_repairs_left - stats_before.page_copy_repairs_left;
    if left > 0 {
        println!(
            "pages with a damaged copy left as they are (freed pages changed hands while the repair looked; rebuild again): {left}"
        );
    }
    let status = db.mirror_status();
    print_status(&status);
    db.close()?;
    let healthy = status
        .iter()
        .all(|g| g.copies.iter().all(|c| c.state == CopyState::Healthy));
    if !healthy {
        return Err(CliError("some copies are still not healthy".into()));
    }
    println!(
        "{}: every copy healthy ({} rebuilt in {:.1} s)",
        args.path.display(),
        reports.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
