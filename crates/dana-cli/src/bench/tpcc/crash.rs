//! `dana crashtest --workload tpcc`: TPC-C killed with kill -9 at random
//! times, recovered, and checked.
//!
//! Owns: the kill cycles of the TPC-C workload: one warehouse loaded
//! once into a pool much smaller than the data (so pages are evicted and
//! written back while it runs), then per cycle a child process that opens
//! the database (recovering the last cycle's crash), runs the mix with
//! the log synced and prints every New-Order whose commit returned; the
//! parent kills it (every third cycle while it opens), opens a copy of
//! the files (the next child recovers the files themselves) and requires: the consistency conditions hold, every
//! acknowledged New-Order's order is there, and no line of a rolled-back
//! New-Order is. Never: counts a cycle whose check failed as passed.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dana::{Db, Durability, Options};

use super::kv::DanaTables;
use super::schema::{key, Table};
use super::{check, create_and_load, run_mix, Mix, OrderHook};
use crate::crashtest::{copy_of, spawn_child};
use crate::rng::XorShift;
use crate::{CliError, CliResult};

/// Warehouses of the crash runs.
const WAREHOUSES: u32 = 1;

fn options() -> Options {
    Options::default()
        .pool_bytes(32 << 20)
        .capacity_bytes(2 << 30)
        .log_bytes(64 << 20)
        .workers(2)
        // One log per worker: New-Orders read and write what the other
        // worker's log may not have made durable yet.
        .logs(2)
        .max_tasks_per_worker(64)
        .durability(Durability::Sync)
}

/// The child: opens the database, prints `ready`, runs the mix and
/// prints `order W D O` for each New-Order acknowledged, until killed.
pub fn child(dir: &Path, seed: u64) -> CliResult<()> {
    let db = Db::open(dir, options())?;
    let tables = DanaTables::open(&db)?;
    // What this open redid (the parent judges a copy: these are the files
    // the last kill left).
    let (commits, pages) = db
        .recovery()
        .map_or((0, 0), |r| (r.commits, r.pages_redone));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    {
        let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(o, "recovered {commits} {pages}\nready")
            .and_then(|_| o.flush())
            .map_err(|e| CliError(format!("pipe: {e}")))?;
    }
    let hook: OrderHook = Arc::new(move |w, d, o| {
        let mut p = out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed pipe means the parent is gone: nothing to tell.
        let _ = writeln!(p, "order {w} {d} {o}").and_then(|_| p.flush());
    });
    let mix = Mix {
        warehouses: WAREHOUSES,
        workers: 2,
        tasks_per_worker: 4,
        durability: Durability::Sync,
        seconds: 3600.0,
        seed,
        // The cycle's seed, not the load's (the child is not told it):
        // valid inputs are all a crash test needs.
        load_seed: seed,
    };
    run_mix(&tables, mix, Some(hook), None)?;
    Ok(())
}

/// What the kill cycles saw.
#[derive(Debug, Default)]
pub struct KillTotals {
    pub cycles: u64,
    pub killed_while_opening: u64,
    /// Children whose open redid commits or pages.
    pub opens_with_redo: u64,
    /// New-Orders acknowledged before a kill.
    pub acknowledged: u64,
    /// Of those, found after recovery.
    pub found: u64,
    pub rows_checked: u64,
}

/// Loads the database into `dir`, then runs `cycles` kill cycles.
pub fn kill_cycles(dir: &Path, seed: u64, cycles: u64) -> Result<KillTotals, String> {
    let (db, _, _, _) = create_and_load(dir, options(), WAREHOUSES, seed, true).map_err(|e| e.0)?;
    db.close().map_err(|e| format!("close after load: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let mut rng = XorShift::new(seed);
    let mut t = KillTotals::default();
    for c in 0..cycles {
        let fail = |what: String| {
            format!(
                "tpcc kill cycle {c} (seed {seed}, dir {}): {what}",
                dir.display()
            )
        };
        let (mut child, rx, reader) = spawn_child(
            Command::new(&exe)
                .args(["crashtest", "--child", "--workload", "tpcc", "--seed"])
                .arg((seed + c).to_string())
                .arg("--dir")
                .arg(dir),
        )
        .map_err(fail)?;
        let early = c % 3 == 2;
        let mut lines = Vec::new();
        if early {
            std::thread::sleep(Duration::from_millis(1 + rng.below(150)));
        } else {
            let started = Instant::now();
            loop {
                match rx.recv_timeout(Duration::from_secs(120)) {
                    Ok(l) if l == "ready" => break,
                    Ok(l) => lines.push(l),
                    Err(e) => {
                        let _ = child.kill();
                        return Err(fail(format!(
                            "the child did not open in {:.0} s: {e}",
                            started.elapsed().as_secs_f64()
                        )));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        }
        // SIGKILL: no destructor, no flush.
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        lines.extend(rx.try_iter());
        let mut acked = Vec::new();
        let mut ready = !early;
        for l in &lines {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["ready"] => ready = true,
                ["recovered", c, p] => {
                    let redid = c.parse::<u64>().unwrap_or(0) + p.parse::<u64>().unwrap_or(0);
                    t.opens_with_redo += u64::from(redid > 0);
                }
                ["order", w, d, o] => {
                    let p = |s: &str| {
                        s.parse::<u32>()
                            .map_err(|_| fail(format!("bad line {l:?}")))
                    };
                    acked.push((p(w)?, p(d)?, p(o)?));
                }
                _ => {}
            }
        }
        t.killed_while_opening += u64::from(!ready);
        // Judged on a copy: the next child recovers the files the kill
        // left, so a kill while it opens lands in a real redo.
        let judged_dir = copy_of(dir).map_err(fail)?;
        let db = Db::open(&judged_dir, options()).map_err(|e| fail(format!("recovery: {e}")))?;
        let tables = DanaTables::open(&db).map_err(|e| fail(e.0))?;
        let orders = tables.tree(Table::Order);
        let mut missing = Vec::new();
        for &(w, d, o) in &acked {
            if orders
                .get(&key(&[w, d, o]))
                .map_err(|e| fail(format!("reading order: {e}")))?
                .is_none()
            {
                missing.push((w, d, o));
            }
        }
        let consistency = check::check(&*tables).map_err(|e| fail(e.0))?;
        db.close().map_err(|e| fail(format!("close: {e}")))?;
        std::fs::remove_dir_all(&judged_dir)
            .map_err(|e| fail(format!("removing {}: {e}", judged_dir.display())))?;
        t.cycles += 1;
        t.acknowledged += acked.len() as u64;
        t.found += (acked.len() - missing.len()) as u64;
        t.rows_checked += consistency.rows;
        if !missing.is_empty() {
            return Err(fail(format!(
                "{} of {} acknowledged New-Orders lost, first {:?}",
                missing.len(),
                acked.len(),
                &missing[..missing.len().min(5)]
            )));
        }
        consistency.ok().map_err(|e| fail(e.0))?;
    }
    // The files themselves, recovered and closed (they must open, and
    // hold the conditions as their copy did).
    let db = Db::open(dir, options()).map_err(|e| format!("after the cycles: recovery: {e}"))?;
    let tables = DanaTables::open(&db).map_err(|e| e.0)?;
    check::check(&*tables)
        .map_err(|e| e.0)?
        .ok()
        .map_err(|e| format!("after the cycles: {}", e.0))?;
    db.close()
        .map_err(|e| format!("after the cycles: close: {e}"))?;
    Ok(t)
}
