//! `dana crashtest`: cut the power (simulated) or kill the process
//! (SIGKILL) in the middle of a transactional workload, recover, and check
//! that every acknowledged commit is there byte for byte, that no
//! transaction is there in part, and that the trees are valid.
//!
//! Owns: the deterministic workload (a seed gives the same transactions),
//! the oracle (the model of what acknowledged commits wrote), the
//! simulated runs (crash points enumerated over the I/Os of a run, each
//! write at the cut kept, dropped or torn at 512 bytes with garbage), the
//! kill -9 runs (a child process acknowledges commits over a pipe), and
//! the injected I/O errors. Every failure names its seed and crash point;
//! `--seed S --point P` replays it.
//!
//! Never: counts a run as passed without comparing the whole database
//! with the oracle.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::sim::{Fault, PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Error, OpKind, Options};

use crate::rng::XorShift;
use crate::{CliError, CliResult};

/// Arguments of `dana crashtest`.
#[derive(Args, Debug, Clone)]
pub struct CrashArgs {
    /// Simulated crash points (spread evenly over the I/Os of a run, then
    /// random ones).
    #[arg(long, default_value_t = 2000)]
    pub points: u64,
    /// kill -9 cycles on real files with io_uring.
    #[arg(long, default_value_t = 50)]
    pub kills: u64,
    /// Transactions per simulated run.
    #[arg(long, default_value_t = 80)]
    pub txns: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay one simulated crash point (with --seed).
    #[arg(long)]
    pub point: Option<u64>,
    /// Directory for the kill -9 runs (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Internal: run as the child of a kill -9 cycle.
    #[arg(long, hide = true)]
    pub child: bool,
    /// Internal: first transaction of the child.
    #[arg(long, hide = true, default_value_t = 0)]
    pub start: u64,
}

const TREES: [&str; 2] = ["a", "b"];
const KEYS: u64 = 400;

/// One transaction of the workload: (tree index, key, value or delete).
type Txn = Vec<(usize, Vec<u8>, Option<Vec<u8>>)>;

/// Transaction `i` of the workload with `seed`.
fn txn(seed: u64, i: u64) -> Txn {
    let mut r = XorShift::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i);
    let n = 1 + r.next_u64() % 4;
    (0..n)
        .map(|_| {
            let t = (r.next_u64() % 2) as usize;
            let k = r.next_u64() % KEYS;
            let key = format!("key{k:05}").into_bytes();
            let value = if r.next_u64() % 6 == 0 {
                None
            } else {
                let len = 1 + (r.next_u64() % 300) as usize;
                let b = (i as u8).wrapping_mul(31) ^ k as u8;
                let mut v = format!("t{i}:").into_bytes();
                v.resize(len.max(v.len()), b);
                Some(v)
            };
            (t, key, value)
        })
        .collect()
}

/// The state of the trees: one map per tree.
type Model = [BTreeMap<Vec<u8>, Vec<u8>>; 2];

fn apply(model: &mut Model, t: &Txn) {
    for (tree, k, v) in t {
        match v {
            Some(v) => model[*tree].insert(k.clone(), v.clone()),
            None => model[*tree].remove(k),
        };
    }
}

fn commit(db: &Db, trees: &[dana::Tree], t: &Txn) -> dana::Result<()> {
    let mut tx = db.begin();
    for (i, k, v) in t {
        match v {
            Some(v) => tx.put(&trees[*i], k, v)?,
            None => tx.delete(&trees[*i], k)?,
        }
    }
    db.commit(tx)
}

fn contents(db: &Db) -> dana::Result<Model> {
    let mut out: Model = Default::default();
    for (i, name) in TREES.iter().enumerate() {
        let t = db.tree(name)?;
        for (k, v) in t.range(
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            true,
            usize::MAX,
        )? {
            out[i].insert(k, v);
        }
    }
    Ok(out)
}

/// Checks a recovered database against the oracle: it must equal
/// `acked`, or `acked` plus the one transaction in doubt, and pass the
/// checker. Returns which of the two it matched (true: with the doubt).
fn verify(db: &Db, acked: &Model, doubt: Option<&Txn>) -> Result<bool, String> {
    let report = db
        .check()
        .map_err(|e| format!("check failed to run: {e}"))?;
    if !report.is_ok() {
        return Err(format!("check found problems: {:?}", report.findings));
    }
    let got = contents(db).map_err(|e| format!("reading the trees: {e}"))?;
    if &got == acked {
        return Ok(false);
    }
    if let Some(t) = doubt {
        let mut with = acked.clone();
        apply(&mut with, t);
        if got == with {
            return Ok(true);
        }
    }
    let diff = (0..2)
        .flat_map(|i| {
            let (g, a) = (&got[i], &acked[i]);
            let missing = a.iter().filter(|(k, v)| g.get(*k) != Some(v)).count();
            let extra = g.keys().filter(|k| !a.contains_key(*k)).count();
            [format!(
                "tree {}: {missing} acknowledged entries missing or different, {extra} extra",
                TREES[i]
            )]
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(format!("the database matches neither the acknowledged commits nor them plus the one in doubt: {diff}"))
}

// ---- simulated power cuts -------------------------------------------------

fn sim_options() -> Options {
    Options::default()
        .pool_bytes(24 * 4096)
        .workers(1)
        .log_bytes(1 << 20)
        .durability(Durability::Sync)
}

struct SimRig {
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
}

impl SimRig {
    fn new(seed: u64) -> SimRig {
        SimRig {
            data: SimDisk::new(0, 4 << 20, SimConfig::deterministic(seed)),
            log: SimDisk::new(
                1,
                CONTROL_BYTES + (1 << 20),
                SimConfig::deterministic(seed ^ 1),
            ),
        }
    }

    fn open(&self, create: bool) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        Db::open_array_with_log(
            array,
            Some(Target::Sim(self.log.clone())),
            sim_options(),
            create,
        )
    }
}

/// The outcome of one simulated run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimOutcome {
    /// Requests submitted before the cut (the run's length if no cut).
    pub ios: u64,
    /// Commits acknowledged before the cut.
    pub acked: u64,
    /// Acknowledged commits found after recovery (all, or the run failed).
    pub found: u64,
    /// True if the transaction in doubt was found applied.
    pub doubt_applied: bool,
}

/// One run: format, set up the trees, run `txns` transactions with the
/// power cut at request `point` (0: never), recover and verify.
pub fn sim_run(seed: u64, point: u64, txns: u64) -> Result<SimOutcome, String> {
    let rig = SimRig::new(seed);
    let fail = |what: String| format!("seed {seed} point {point}: {what}");
    {
        let db = rig.open(true).map_err(|e| fail(format!("create: {e}")))?;
        for n in TREES {
            db.create_tree(n)
                .map_err(|e| fail(format!("create tree: {e}")))?;
        }
        db.checkpoint()
            .map_err(|e| fail(format!("checkpoint: {e}")))?;
        db.close().map_err(|e| fail(format!("close: {e}")))?;
    }
    let policy = PowerCutPolicy::Random {
        keep: 1.0,
        drop: 1.0,
        tear: 1.0,
    };
    let switch = PowerSwitch::new(point, policy, seed);
    switch.attach(&rig.data);
    switch.attach(&rig.log);
    let mut acked: Model = Default::default();
    let mut doubt = None;
    let mut n_acked = 0;
    // A cut during this open (a crash in recovery) is a crash point too.
    match rig.open(false) {
        Err(_) if switch.fired() => {}
        Err(e) => return Err(fail(format!("reopen before the run: {e}"))),
        Ok(db) => {
            let trees: Vec<_> = match TREES.iter().map(|n| db.tree(n)).collect::<Result<_, _>>() {
                Ok(t) => t,
                Err(_) if switch.fired() => Vec::new(),
                Err(e) => return Err(fail(format!("open trees: {e}"))),
            };
            for i in (0..txns).take_while(|_| !trees.is_empty()) {
                let t = txn(seed, i);
                match commit(&db, &trees, &t) {
                    Ok(()) => {
                        apply(&mut acked, &t);
                        n_acked += 1;
                    }
                    Err(e) => {
                        if !switch.fired() {
                            return Err(fail(format!("commit {i} failed without a crash: {e}")));
                        }
                        doubt = Some(t);
                        break;
                    }
                }
            }
            // Dropping the database after a cut must not hang or panic.
        }
    }
    let ios = switch.count();
    if !switch.fired() && point != 0 {
        // The run ended before the crash point: cut now (nothing pending).
        switch.cut();
    }
    rig.data.power_on();
    rig.log.power_on();
    let db = rig
        .open(false)
        .map_err(|e| fail(format!("recovery: {e}")))?;
    let doubt_applied = verify(&db, &acked, doubt.as_ref()).map_err(fail)?;
    db.close()
        .map_err(|e| fail(format!("close after recovery: {e}")))?;
    Ok(SimOutcome {
        ios,
        acked: n_acked,
        found: n_acked,
        doubt_applied,
    })
}

/// Totals over many runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// Runs (crash points).
    pub points: u64,
    /// Commits acknowledged.
    pub acked: u64,
    /// Acknowledged commits found after recovery.
    pub found: u64,
    /// Runs whose transaction in doubt was found applied.
    pub doubts_applied: u64,
}

/// `points` crash points for `seed`: spread evenly over a run's I/Os,
/// each with its own tear pattern. Stops at the first failure.
pub fn sim_sweep(seed: u64, points: u64, txns: u64) -> Result<Totals, String> {
    let full = sim_run(seed, 0, txns)?;
    let mut t = Totals::default();
    for p in 0..points {
        let point = 1 + (p * full.ios.max(1)) / points.max(1);
        // Vary the tear pattern with the point, keep it replayable.
        let s = seed.wrapping_add(p << 20);
        if std::env::var_os("DANA_CRASHTEST_TRACE").is_some() {
            eprintln!("crash point: --seed {s} --point {point}");
        }
        let o = sim_run(s, point, txns)?;
        t.points += 1;
        t.acked += o.acked;
        t.found += o.found;
        t.doubts_applied += o.doubt_applied as u64;
    }
    Ok(t)
}

// ---- injected I/O errors --------------------------------------------------

/// Injects one failing request (once or forever) at each of `count`
/// positions into a run and checks that nothing acknowledged is lost and
/// that errors are clean (no panic, no hang, the database refuses writes
/// after a failed log write or sync).
pub fn fault_run(
    seed: u64,
    op: OpKind,
    nth: u64,
    sticky: bool,
    txns: u64,
) -> Result<(u64, u64), String> {
    let rig = SimRig::new(seed);
    let fail = |what: String| format!("seed {seed} fault {op:?} #{nth} sticky={sticky}: {what}");
    {
        let db = rig.open(true).map_err(|e| fail(format!("create: {e}")))?;
        for n in TREES {
            db.create_tree(n)
                .map_err(|e| fail(format!("create tree: {e}")))?;
        }
        db.close().map_err(|e| fail(format!("close: {e}")))?;
    }
    let mut fault = Fault::nth(Some(op), nth);
    if sticky {
        fault = fault.sticky();
    }
    rig.data.inject(fault.clone());
    rig.log.inject(fault);
    let mut acked: Model = Default::default();
    let mut doubt: Option<Txn> = None;
    let mut n_acked = 0;
    let mut errors = 0;
    // A fault during the open (recovery's own I/O) must fail it cleanly.
    if let Ok(db) = rig.open(false) {
        let trees: Vec<_> = TREES
            .iter()
            .map(|n| db.tree(n))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        for i in (0..txns).take_while(|_| trees.len() == TREES.len()) {
            let t = txn(seed, i);
            match commit(&db, &trees, &t) {
                Ok(()) => {
                    if doubt.is_some() {
                        // A commit after a failure is possible only for a
                        // failed read (which loses nothing); the doubt of a
                        // failed commit is then settled by this one's order.
                        if let Some(d) = doubt.take() {
                            apply(&mut acked, &d);
                        }
                    }
                    apply(&mut acked, &t);
                    n_acked += 1;
                }
                Err(e) => {
                    errors += 1;
                    if matches!(e, Error::Poisoned(_)) || doubt.is_some() {
                        if doubt.is_none() {
                            doubt = Some(t);
                        }
                        break;
                    }
                    doubt = Some(t);
                }
            }
        }
    }
    rig.data.clear_faults();
    rig.log.clear_faults();
    let db = rig
        .open(false)
        .map_err(|e| fail(format!("recovery: {e}")))?;
    verify(&db, &acked, doubt.as_ref()).map_err(fail)?;
    db.close()
        .map_err(|e| fail(format!("close after recovery: {e}")))?;
    Ok((n_acked, errors))
}

// ---- kill -9 --------------------------------------------------------------

fn kill_options() -> Options {
    Options::default()
        .pool_bytes(64 * 4096)
        .capacity_bytes(32 << 20)
        .log_bytes(4 << 20)
        .workers(2)
        .durability(Durability::Sync)
}

/// The child: commits transactions from `start` on, printing each index
/// once its commit returned, until killed.
fn child(dir: &Path, seed: u64, start: u64) -> CliResult<()> {
    let db = Db::open(dir, kill_options())?;
    let trees: Vec<_> = TREES
        .iter()
        .map(|n| db.tree_or_create(n))
        .collect::<Result<_, _>>()?;
    println!("ready");
    let mut out = std::io::stdout().lock();
    for i in start.. {
        commit(&db, &trees, &txn(seed, i))?;
        writeln!(out, "{i}").map_err(|e| CliError(format!("pipe: {e}")))?;
        out.flush().map_err(|e| CliError(format!("pipe: {e}")))?;
    }
    Ok(())
}

/// `cycles` kill -9 cycles on `dir`: each starts a child, kills it after a
/// random delay, reopens the database and checks it against the oracle.
pub fn kill_cycles(dir: &Path, seed: u64, cycles: u64) -> Result<Totals, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let mut rng = crate::rng::XorShift::new(seed);
    let mut model: Model = Default::default();
    let mut next = 0u64;
    let mut t = Totals::default();
    for c in 0..cycles {
        let fail = |what: String| {
            format!(
                "kill cycle {c} (seed {seed}, dir {}): {what}",
                dir.display()
            )
        };
        let mut child = Command::new(&exe)
            .args([
                "crashtest",
                "--child",
                "--seed",
                &seed.to_string(),
                "--start",
                &next.to_string(),
                "--dir",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail(format!("spawn: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| fail("no pipe".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until the child has opened (and recovered) the database.
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l == "ready" => {}
            other => {
                let _ = child.kill();
                return Err(fail(format!("child did not start: {other:?}")));
            }
        }
        let delay = Duration::from_millis(20 + rng.next_u64() % 200);
        std::thread::sleep(delay);
        // SIGKILL: no destructor, no flush.
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        let acks: Vec<u64> = rx.try_iter().filter_map(|l| l.parse().ok()).collect();
        let mut acked = model.clone();
        let mut last = next;
        for i in &acks {
            if *i != last {
                return Err(fail(format!(
                    "acknowledgement {i} out of order (expected {last})"
                )));
            }
            apply(&mut acked, &txn(seed, *i));
            last += 1;
        }
        let doubt = txn(seed, last);
        let db = Db::open(dir, kill_options()).map_err(|e| fail(format!("recovery: {e}")))?;
        let applied = verify(&db, &acked, Some(&doubt)).map_err(fail)?;
        db.close().map_err(|e| fail(format!("close: {e}")))?;
        if applied {
            apply(&mut acked, &doubt);
            last += 1;
            t.doubts_applied += 1;
        }
        t.points += 1;
        t.acked += acks.len() as u64;
        t.found += acks.len() as u64;
        model = acked;
        next = last;
    }
    Ok(t)
}

/// `dana crashtest`.
pub fn run(args: &CrashArgs) -> CliResult<()> {
    if args.child {
        let dir = args
            .dir
            .as_ref()
            .ok_or_else(|| CliError("--child needs --dir".into()))?;
        return child(dir, args.seed, args.start);
    }
    if let Some(point) = args.point {
        let o = sim_run(args.seed, point, args.txns).map_err(CliError)?;
        println!(
            "seed {} point {point}: passed ({} commits acknowledged, all found)",
            args.seed, o.acked
        );
        return Ok(());
    }
    let started = Instant::now();
    let sim = sim_sweep(args.seed, args.points, args.txns).map_err(CliError)?;
    println!(
        "simulated power cuts: {} crash points, {} commits acknowledged, {} found, lost 0 ({} in-doubt commits found applied) in {:.1} s",
        sim.points, sim.acked, sim.found, sim.doubts_applied, started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut faults = 0;
    for (op, sticky) in [
        (OpKind::Write, false),
        (OpKind::Write, true),
        (OpKind::Flush, false),
        (OpKind::Flush, true),
        (OpKind::Read, false),
        (OpKind::Read, true),
    ] {
        for nth in [0, 3, 10, 30, 100] {
            fault_run(args.seed, op, nth, sticky, args.txns.min(40)).map_err(CliError)?;
            faults += 1;
        }
    }
    println!(
        "injected I/O errors: {faults} runs (reads, writes, syncs; once and forever), nothing acknowledged lost, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if args.kills > 0 {
        let tmp;
        let dir = match &args.dir {
            Some(d) => d.clone(),
            None => {
                tmp = tempdir()?;
                tmp.clone()
            }
        };
        let started = Instant::now();
        let k = kill_cycles(&dir, args.seed, args.kills).map_err(CliError)?;
        println!(
            "kill -9: {} cycles, {} commits acknowledged, {} found, lost 0 ({} in-doubt commits found applied) in {:.1} s",
            k.points, k.acked, k.found, k.doubts_applied, started.elapsed().as_secs_f64()
        );
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(())
}

fn tempdir() -> CliResult<PathBuf> {
    let base = std::env::temp_dir().join(format!("dana-crashtest-{}", std::process::id()));
    std::fs::create_dir_all(&base).map_err(|e| CliError(format!("{}: {e}", base.display())))?;
    Ok(base)
}
