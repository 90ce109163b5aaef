//! `dana crashtest`: cut the power (simulated) or kill the process
//! (SIGKILL) in the middle of a concurrent transactional workload, recover,
//! and count how many of the commits that had to survive did.
//!
//! Owns: the deterministic workload (a seed gives the same transactions;
//! each committer writes its own keys, in two trees, values up to the
//! largest a tree takes), the judge (for each committer, the recovered
//! state must equal its first `j` transactions for some `j` at least the
//! number that had to survive: every acknowledged commit with `Sync`,
//! every commit at or below a durable LSN the engine reported with
//! `Async`; in-doubt ones only as a prefix of what followed), the
//! simulated runs (crash points over the I/Os of a run, each unsynced
//! write kept, dropped or torn at 512 bytes), damage outside the crash
//! model (a flipped byte in a durable log record must be reported as
//! corruption; a planted loss of one synced log block must make the run
//! fail), injected I/O errors, and kill -9 cycles on real files, some of
//! them killing the process while it recovers.
//!
//! Every count printed is counted: "found" is the number of commits that
//! had to survive and were read back and verified, "lost" is the
//! difference. A run with anything lost, a state that is no prefix, or an
//! undetected flip exits non-zero, naming the seed; `--seed S --point P`
//! replays one simulated crash point and prints its trace hash.
//!
//! Never: counts a run as passed without comparing the whole database
//! with the model.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::mirror::CopyState;
use dana::io::sim::{Fault, PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::control::Control;
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Error, OpKind, Options};

use crate::bench::tpcc;
use crate::rng::XorShift;
use crate::{CliError, CliResult};

/// Arguments of `dana crashtest`.
#[derive(Args, Debug, Clone)]
pub struct CrashArgs {
    /// Simulated crash points (spread evenly over the I/Os of a run);
    /// half run with durability Sync, half with Async, and in each half
    /// every other one flushes the log by write + fdatasync instead of
    /// durable writes (the same mix for the kill -9 cycles); half of them
    /// (16 points in turn) on simulated disks with FUA, whose durable
    /// writes carry nothing else (`SimConfig::fua`).
    #[arg(long, default_value_t = 2000)]
    pub points: u64,
    /// kill -9 cycles on real files with io_uring (every third one kills
    /// the process while it opens and recovers).
    #[arg(long, default_value_t = 50)]
    pub kills: u64,
    /// Transactions per committer per simulated run.
    #[arg(long, default_value_t = 40)]
    pub txns: u64,
    /// Concurrent committers.
    #[arg(long, default_value_t = 4)]
    pub tasks: u64,
    /// Flipped bytes in durable log records (each must be reported as
    /// corruption on the next open).
    #[arg(long, default_value_t = 40)]
    pub flips: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay one simulated crash point (with --seed; --async for Async).
    #[arg(long)]
    pub point: Option<u64>,
    /// With --point: durability Async.
    #[arg(long = "async")]
    pub async_durability: bool,
    /// With --point: the log flushes by write + fdatasync
    /// (`Options::log_write_through_max(0)`) instead of durable writes for
    /// flushes up to the default size.
    #[arg(long)]
    pub log_sync: bool,
    /// The unit every log of the run pads its flushes to
    /// (`Options::log_flush_block`; 0: the device's alignment, 512 bytes
    /// here): the torn-tail and padding rules of recovery at another block.
    #[arg(long, default_value_t = 0)]
    pub log_flush_block: u64,
    /// The most flushes of one log in flight at once in every log of the
    /// run (`Options::log_flushes_in_flight`; 0: the default for the
    /// kill -9 cycles, and for the simulated power cuts 1, 2 or 4 by the
    /// point, 32 points in turn): recovery of a later flush kept beside an
    /// earlier one torn.
    #[arg(long, default_value_t = 0)]
    pub log_flushes_in_flight: usize,
    /// Check the checker: drop one synced log block holding a commit that
    /// had to survive, in each simulated run; the run must then fail.
    #[arg(long)]
    pub plant_loss: bool,
    /// Mirror every file of the kill -9 cycles (two copies:
    /// `Options::mirrored`), and between cycles damage copy 1: a byte
    /// flipped in a random page of the data file's copy, or (every fifth
    /// cycle) a copy file removed, so the next child opens degraded and
    /// rebuilds it while committing (a kill can land mid-rebuild, which
    /// the next open resumes). Copy 0 is never touched, so nothing may be
    /// lost. After the cycles the database is rebuilt and checked: the
    /// copies may differ only where copy 1 holds a flipped byte not read
    /// since. Only the kill -9 cycles run (simulated power cuts on
    /// mirrored devices: `crates/dana/tests/mirror.rs`).
    #[arg(long)]
    pub mirrored: bool,
    /// Write the kill -9 cycles' data file out of place
    /// (`Options::write_mode(WriteMode::OutOfPlace)`: append-only
    /// segments, collected under the run). Only the kill -9 cycles run
    /// (simulated power cuts on out-of-place devices:
    /// `crates/dana/tests/out_of_place.rs`).
    #[arg(long, conflicts_with = "mirrored")]
    pub out_of_place: bool,
    /// With `--out-of-place`: compress every page (LZ4) and pack it at
    /// 512 bytes (`Options::compress_pages`).
    #[arg(long, requires = "out_of_place")]
    pub compress_pages: bool,
    /// With `--out-of-place`: collect segments in a thread of the
    /// device's own (`Options::background_collection`), or only in the
    /// workers whose writes find the free segments run out (`false`).
    #[arg(long, default_value_t = dana::Options::default().background_collection_value(), action = clap::ArgAction::Set)]
    pub background_collection: bool,
    /// The simulated power cuts' data disk writes 4 KiB untorn
    /// (`RWF_ATOMIC`, as an NVMe drive with a 4 KiB atomic write unit): a
    /// cut keeps or drops each page write whole, and the log holds no
    /// torn-page images (`Options::untorn_page_writes`). Log writes and
    /// everything else are still torn.
    #[arg(long)]
    pub untorn_writes: bool,
    /// Log full page images compressed (`Options::compress_log_images`):
    /// torn pages are rebuilt from LZ4 blocks, in the simulated power cuts
    /// and the kill -9 cycles.
    #[arg(long)]
    pub compress_log_images: bool,
    /// The simulated power cuts run two workers, each appending to a log
    /// of its own on a simulated disk of its own (`Options::logs`), the
    /// committers spread over both; a cut takes both logs at once, each
    /// at its own point. Two threads: a crash point no longer replays
    /// exactly. The log damage and injected I/O errors keep one log.
    #[arg(long, conflicts_with = "plant_loss")]
    pub worker_logs: bool,
    /// Directory for the kill -9 runs (default: a temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// What the committers run: `default` (the simulated power cuts, log
    /// damage, injected I/O errors and kill -9 cycles of transactions over
    /// two trees) or `tpcc` (only kill -9 cycles, `--kills` of them, of a
    /// TPC-C run on one warehouse: consistency conditions, every
    /// acknowledged New-Order present, no rolled-back one).
    #[arg(long, value_enum, default_value_t = Workload::Default)]
    pub workload: Workload,
    /// Internal: run as the child of a kill -9 cycle.
    #[arg(long, hide = true)]
    pub child: bool,
    /// Internal: the first transaction of each committer of the child.
    #[arg(long, hide = true, value_delimiter = ',')]
    pub starts: Vec<u64>,
}

/// `--workload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Transactions over two trees, checked against a model.
    Default,
    /// TPC-C, checked by its consistency conditions.
    Tpcc,
}

const TREES: [&str; 2] = ["a", "b"];
/// Keys per committer.
const KEYS: u64 = 300;
/// Keys preloaded in each tree of a simulated run (no committer's): they
/// make the trees three levels deep, so cuts hit splits and merges below
/// inner nodes, and must all be there after every recovery.
const PRELOAD: u64 = 6000;

fn preload_key(k: u64) -> Vec<u8> {
    format!("b{k:05}").into_bytes()
}

fn preload_value(k: u64) -> Vec<u8> {
    vec![(k % 251) as u8; 100 + (k % 200) as usize]
}

/// Fails unless both trees hold exactly the preloaded keys and values.
fn preload_intact(got: &Model) -> Result<(), String> {
    for (i, t) in got.iter().enumerate() {
        let pre: Vec<_> = t.range(b"b".to_vec()..b"c".to_vec()).collect();
        let bad = (0..PRELOAD)
            .filter(|&k| {
                pre.get(k as usize)
                    .is_none_or(|(key, v)| **key != preload_key(k) || **v != preload_value(k))
            })
            .count();
        if bad > 0 || pre.len() as u64 != PRELOAD {
            return Err(format!(
                "tree {}: {} of {PRELOAD} preloaded keys missing or changed ({} there)",
                TREES[i],
                bad,
                pre.len()
            ));
        }
    }
    Ok(())
}
/// Bytes of the simulated log's record stream.
const SIM_LOG: u64 = 1 << 20;

/// One transaction: (tree index, key, value or delete).
type Txn = Vec<(usize, Vec<u8>, Option<Vec<u8>>)>;

/// Most bytes a large value of the workload has past the largest inline
/// value (a few pages: written around the pool and the log, synced
/// before the commit record).
const LARGE_EXTRA: u64 = 20_000;

/// Transaction `i` of committer `task` with `seed`; values up to `max`
/// bytes inline, and one write in twelve a large value of up to
/// `max + LARGE_EXTRA` bytes.
fn txn(seed: u64, task: u64, i: u64, max: usize) -> Txn {
    let mut r =
        XorShift::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (task << 40) ^ i ^ 0x5bd1_e995);
    let n = 1 + r.next_u64() % 4;
    (0..n)
        .map(|_| {
            let t = (r.next_u64() % 2) as usize;
            let k = r.next_u64() % KEYS;
            let key = format!("c{task:02}k{k:05}").into_bytes();
            let value = match r.next_u64() % 12 {
                0 | 1 => None,
                2 => Some(max),
                3 => Some(max + 1 + (r.next_u64() % LARGE_EXTRA) as usize),
                _ => Some(1 + (r.next_u64() % 300) as usize),
            }
            .map(|len| {
                let b = (i as u8).wrapping_mul(31) ^ k as u8;
                let mut v = format!("{task}:{i}:").into_bytes();
                let cap = if len > max { len } else { max };
                v.resize(len.max(v.len()).min(cap), b);
                // Large values differ page by page, so a page of one
                // value read in place of another shows.
                for (p, chunk) in v.chunks_mut(4096).enumerate().skip(1) {
                    chunk[0] = p as u8;
                }
                v
            });
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

/// The part of `m` written by committer `task`.
fn of_task(m: &Model, task: u64) -> Model {
    let prefix = format!("c{task:02}k").into_bytes();
    let pick = |t: &BTreeMap<Vec<u8>, Vec<u8>>| {
        t.iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    [pick(&m[0]), pick(&m[1])]
}

fn contents(db: &Db) -> dana::Result<Model> {
    let mut out: Model = Default::default();
    for (i, name) in TREES.iter().enumerate() {
        let t = db.tree(name)?;
        for (k, v) in t.scan(
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

/// What one committer did before the crash.
#[derive(Debug, Clone, Default)]
struct TaskLog {
    task: u64,
    /// Its transactions from its start, in order, as far as submitted.
    txns: Vec<Txn>,
    /// How many of them had to survive.
    required: usize,
    /// The commit LSN (GSN) of each acknowledged one, in order (0:
    /// unknown).
    lsns: Vec<u64>,
    /// The worker (so the log) its commits went through: the state is a
    /// prefix of each log's order, not of the order across logs.
    log: u64,
}

/// What the judge found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Judged {
    /// Commits that had to survive.
    pub required: u64,
    /// Of those, read back and verified.
    pub found: u64,
    /// In-doubt commits found applied (as a prefix of what followed).
    pub doubts_applied: u64,
    /// Committers whose state is no prefix of their transactions.
    pub not_prefix: u64,
    /// Acknowledged commits missing while one with a later LSN (of any
    /// committer) is there: the state is no prefix of the log order.
    pub out_of_order: u64,
}

impl Judged {
    /// required - found.
    pub fn lost(&self) -> u64 {
        self.required - self.found
    }

    fn add(&mut self, o: &Judged) {
        self.required += o.required;
        self.found += o.found;
        self.doubts_applied += o.doubts_applied;
        self.not_prefix += o.not_prefix;
        self.out_of_order += o.out_of_order;
    }

    /// Every committer's state is a prefix of its transactions, and all
    /// together a prefix of the log order.
    pub fn ordered(&self) -> bool {
        self.not_prefix == 0 && self.out_of_order == 0
    }
}

/// Judges a recovered database: `base` is the state before these
/// committers' transactions (per committer, as their own keys). Returns
/// the counts and, per committer, how many of its transactions the state
/// holds (None: no prefix matches).
fn judge(
    db: &Db,
    base: &Model,
    logs: &[TaskLog],
    preloaded: bool,
) -> Result<(Judged, Vec<Option<usize>>), String> {
    let report = db
        .check()
        .map_err(|e| format!("check failed to run: {e}"))?;
    // A mirror's degraded or differing copies are judged after the
    // cycles (`final_mirror_check`); the data itself must be whole.
    if !report.data_ok() {
        return Err(format!("check found problems: {:?}", report.findings));
    }
    let got = contents(db).map_err(|e| format!("reading the trees: {e}"))?;
    if preloaded {
        preload_intact(&got)?;
    }
    let mut out = Judged::default();
    let mut matched = Vec::with_capacity(logs.len());
    let mut spans = Vec::with_capacity(logs.len());
    for log in logs {
        let want = of_task(&got, log.task);
        let mut m = of_task(base, log.task);
        let mut best = (m == want).then_some(0);
        let mut first = best;
        let mut models = vec![m.clone()];
        for (j, t) in log.txns.iter().enumerate() {
            apply(&mut m, t);
            if m == want {
                best = Some(j + 1);
                first.get_or_insert(j + 1);
            }
            models.push(m.clone());
        }
        out.required += log.required as u64;
        match best {
            Some(j) if j >= log.required => {
                out.found += log.required as u64;
                out.doubts_applied += (j - log.required) as u64;
            }
            Some(j) => out.found += j as u64,
            None => {
                // No prefix: count the required commits whose last writes
                // are all there, for the report.
                out.not_prefix += 1;
                out.found += verified_commits(&want, &models, &log.txns[..log.required]) as u64;
            }
        }
        matched.push(best);
        spans.push(first.zip(best));
    }
    out.out_of_order = out_of_order(logs, &spans);
    Ok((out, matched))
}

/// Across committers of one log: the acknowledged commits (with a known
/// LSN) that are missing although one with a later LSN in the same log
/// survived (the logs of a database become durable independently, so
/// only within one log is the state a prefix of the order). `spans`: per
/// committer, the fewest and the most of its transactions whose prefix
/// equals the state (they differ when transactions change nothing, such
/// as deletes of absent keys; those in between are neither counted
/// present nor absent).
fn out_of_order(logs: &[TaskLog], spans: &[Option<(usize, usize)>]) -> u64 {
    let mut groups: BTreeMap<u64, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for (log, span) in logs.iter().zip(spans) {
        let Some((fewest, most)) = *span else {
            continue;
        };
        let (present, absent) = groups.entry(log.log).or_default();
        for (i, &lsn) in log.lsns.iter().enumerate().filter(|(_, &l)| l != 0) {
            if i < fewest {
                present.push(lsn);
            } else if i >= most {
                absent.push(lsn);
            }
        }
    }
    groups
        .values()
        .map(|(present, absent)| {
            present.iter().max().map_or(0, |&newest| {
                absent.iter().filter(|&&l| l < newest).count() as u64
            })
        })
        .sum()
}

/// Commits of `txns` each of whose writes not overwritten by a later one
/// of `txns` is in `got`.
fn verified_commits(got: &Model, models: &[Model], txns: &[Txn]) -> usize {
    let Some(end) = models.get(txns.len()) else {
        return 0;
    };
    (0..txns.len())
        .filter(|&i| {
            txns[i].iter().all(|(t, k, _)| {
                let overwritten = txns[i + 1..]
                    .iter()
                    .any(|later| later.iter().any(|(t2, k2, _)| t2 == t && k2 == k));
                overwritten || got[*t].get(k) == end[*t].get(k)
            })
        })
        .count()
}

/// Commits `t` as committer code would: a transaction, or, for one
/// write, the tree's async API. Returns the commit's LSN (0 if unknown).
async fn commit_async(
    db: &Db,
    trees: &[dana::Tree],
    t: &Txn,
    lsn_needed: bool,
) -> dana::Result<u64> {
    if t.len() == 1 && !lsn_needed {
        let (i, k, v) = &t[0];
        match v {
            Some(v) => trees[*i].put_async(k, v).await?,
            None => trees[*i].delete_async(k).await?,
        };
        return Ok(0);
    }
    let mut tx = db.begin();
    for (i, k, v) in t {
        match v {
            Some(v) => tx.put(&trees[*i], k, v)?,
            None => tx.delete(&trees[*i], k)?,
        }
    }
    tx.commit_lsn_async().await
}

// ---- simulated power cuts -------------------------------------------------

/// `--log-flush-block` of this process (set once, before any run; the
/// simulated runs' base image and every kill -9 child format their logs
/// with it).
static LOG_FLUSH_BLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn log_flush_block() -> u64 {
    LOG_FLUSH_BLOCK.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--log-flushes-in-flight` (0: the default).
static LOG_FLUSHES_IN_FLIGHT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// `--worker-logs`.
static WORKER_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Logs (and workers) of a simulated power-cut run: 2 with
/// `--worker-logs`, else 1.
fn sim_logs() -> usize {
    1 + WORKER_LOGS.load(std::sync::atomic::Ordering::Relaxed) as usize
}

/// `--mirrored`.
static MIRRORED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn mirrored() -> bool {
    MIRRORED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Committers of the kill -9 cycles (the parent's `--tasks`, the child's
/// `--starts`): the data files are sized by them.
static COMMITTERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(4);

/// `--out-of-place`.
static OUT_OF_PLACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn out_of_place() -> bool {
    OUT_OF_PLACE.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--compress-pages`.
static COMPRESS_PAGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn compress_pages() -> bool {
    COMPRESS_PAGES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--background-collection`.
static BACKGROUND_COLLECTION: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

fn background_collection() -> bool {
    BACKGROUND_COLLECTION.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--compress-log-images`.
static COMPRESS_LOG_IMAGES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn compress_log_images() -> bool {
    COMPRESS_LOG_IMAGES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most flushes in flight a simulated run takes, one of these by its
/// seed ([`sim_flushes_in_flight`]): the flag's, or if 0 the default, 2
/// or 4 (a review found the sweep ran one in flight only; replayable
/// disks complete every request at the next reap, so even this does not
/// show the durable end moving past an earlier flush still in flight).
fn sim_flight_choices() -> [usize; 4] {
    match LOG_FLUSHES_IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => [log_flushes_in_flight(), 2, log_flushes_in_flight(), 4],
        n => [n; 4],
    }
}

/// The flushes in flight of the simulated run of seed `seed` (the sweep's
/// seed moves by 2^20 a point: 32 points each), so that `--seed S
/// --point N` replays it.
fn sim_flushes_in_flight(seed: u64) -> usize {
    sim_flight_choices()[(seed >> 25) as usize & 3]
}

/// The most flushes in flight every log of the kill -9 cycles takes.
fn log_flushes_in_flight() -> usize {
    match LOG_FLUSHES_IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Options::default().log_flushes_in_flight_value(),
        n => n,
    }
}

fn sim_options(durability: Durability, log_sync: bool, workers: usize, flights: usize) -> Options {
    let o = Options::default()
        .log_flush_block(log_flush_block())
        .log_flushes_in_flight(flights)
        .compress_log_images(compress_log_images())
        .log_identity(0x51_4d_5e_ed)
        .pool_bytes(48 * 4096)
        .workers(workers)
        .log_bytes(SIM_LOG)
        .log_write_through_max(if log_sync {
            0
        } else {
            Options::default().log_write_through_max_value()
        })
        .durability(durability);
    match durability {
        // No timer-driven flush: the schedule depends on the seed only.
        Durability::Sync => o.async_window(Duration::from_secs(3600)),
        _ => o.async_window(Duration::from_millis(2)),
    }
}

/// Durable images of a data disk and its logs' disks.
type Image = Vec<Vec<u8>>;

struct SimRig {
    data: Arc<SimDisk>,
    /// Log `i` is worker `i`'s (one worker per log).
    logs: Vec<Arc<SimDisk>>,
    /// The most flushes of a log in flight ([`sim_flushes_in_flight`]).
    flights: usize,
}

impl SimRig {
    /// A rig of one log.
    fn new(seed: u64) -> SimRig {
        SimRig::with(seed, false, 1)
    }

    /// A rig of `logs` logs (and as many workers) whose data disk writes
    /// 4 KiB untorn if `untorn`.
    fn with(seed: u64, untorn: bool, logs: usize) -> SimRig {
        // Replayable: every request completes at the next reap. Half the
        // points' disks have FUA (a durable write carries only itself), by
        // the seed (the sweep's moves by 2^20 a point: 16 points with, 16
        // without), so that `--seed S --point N` replays it.
        let fua = (seed >> 24) & 1 == 1;
        let config = |seed| SimConfig {
            fua,
            ..SimConfig::replayable(seed)
        };
        let data = SimConfig {
            atomic_write_max: if untorn { 4096 } else { 0 },
            ..config(seed)
        };
        SimRig {
            data: SimDisk::new(0, 16 << 20, data),
            logs: (1..=logs)
                .map(|i| SimDisk::new(i, CONTROL_BYTES + SIM_LOG, config(seed ^ i as u64)))
                .collect(),
            flights: sim_flushes_in_flight(seed),
        }
    }

    /// Log 0 (the only one of a rig of one log).
    fn log(&self) -> &Arc<SimDisk> {
        &self.logs[0]
    }

    /// The data disk and the logs.
    fn disks(&self) -> impl Iterator<Item = &Arc<SimDisk>> {
        std::iter::once(&self.data).chain(&self.logs)
    }

    fn open(&self, create: bool, d: Durability, log_sync: bool) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        let logs = self.logs.iter().map(|l| Target::Sim(l.clone())).collect();
        let workers = self.logs.len();
        Db::open_array_with_logs(
            array,
            logs,
            sim_options(d, log_sync, workers, self.flights),
            create,
        )
    }

    /// Puts the base image on the disks: the trees, each preloaded with
    /// [`PRELOAD`] keys (built once per process and number of logs).
    fn setup(&self) -> dana::Result<()> {
        static BASE: [OnceLock<Result<Image, String>>; 2] = [OnceLock::new(), OnceLock::new()];
        let n = self.logs.len();
        assert!((1..=2).contains(&n), "a rig of one or two logs");
        let base = BASE[n - 1].get_or_init(|| {
            let rig = SimRig::with(0, false, n);
            rig.build_base().map_err(|e| e.to_string())?;
            Ok(rig
                .disks()
                .map(|d| d.read_durable(0, d.size() as usize))
                .collect())
        });
        let images = base
            .as_ref()
            .map_err(|e| Error::InvalidArgument(format!("building the base image: {e}")))?;
        for (disk, image) in self.disks().zip(images) {
            disk.overwrite_durable(0, image);
        }
        Ok(())
    }

    /// Formats the database, creates the trees and preloads them.
    fn build_base(&self) -> dana::Result<()> {
        let db = self.open(true, Durability::Sync, false)?;
        let trees = TREES
            .iter()
            .map(|n| db.create_tree(n))
            .collect::<dana::Result<Vec<_>>>()?;
        // One task on the one worker, the trees created before it (no
        // background checkpoint yet): the image is the same every time.
        let d = db.clone();
        db.block_on(async move {
            for t in &trees {
                for from in (0..PRELOAD).step_by(200) {
                    let mut tx = d.begin();
                    for k in from..(from + 200).min(PRELOAD) {
                        tx.put(t, &preload_key(k), &preload_value(k))?;
                    }
                    tx.commit_async().await?;
                }
            }
            Ok::<_, Error>(())
        })??;
        let report = db.check()?;
        if let Some(t) = report.trees.iter().find(|t| t.height < 3) {
            return Err(Error::InvalidArgument(format!(
                "the preloaded tree {} is {} levels deep, not 3",
                t.name, t.height
            )));
        }
        db.close()
    }

    /// The log file offset of the byte just before stream LSN `lsn`.
    fn log_offset(lsn: u64) -> u64 {
        CONTROL_BYTES + (lsn - 1) % SIM_LOG
    }

    /// For each commit record in the durable log image after the redo
    /// point: the GSN after it (what its commit returned) and the stream
    /// LSN after it (where its bytes end).
    fn commit_ends(&self) -> BTreeMap<u64, u64> {
        let Some(c) = self.control() else {
            return BTreeMap::new();
        };
        let mut stream = self.log().read_durable(CONTROL_BYTES, SIM_LOG as usize);
        stream.rotate_left((c.redo % c.capacity) as usize);
        let Ok(scan) = dana::wal::recover::scan(&stream, &c) else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (lsn, off) in scan.changes {
            if let dana::wal::record::Parsed::Record(r) =
                dana::wal::record::parse(&stream[off..], lsn)
            {
                if r.kind == dana::wal::record::Kind::Commit {
                    out.insert(r.gsn + 1, lsn + r.len as u64);
                }
            }
        }
        out
    }

    /// The newest control block of the durable log image.
    fn control(&self) -> Option<Control> {
        Control::newest(&self.log().read_durable(0, CONTROL_BYTES as usize))
    }
}

/// One simulated run's settings.
#[derive(Debug, Clone, Copy)]
pub struct SimRun {
    /// Seed of the workload, the disks and the tear pattern.
    pub seed: u64,
    /// Request at which the power is cut (0: after the run).
    pub point: u64,
    /// Transactions per committer.
    pub txns: u64,
    /// Concurrent committers.
    pub tasks: u64,
    /// Durability of the run.
    pub durability: Durability,
    /// The log flushes by write + fdatasync instead of durable writes.
    pub log_sync: bool,
    /// Drop the synced log block of the newest commit that had to survive.
    pub plant_loss: bool,
    /// The data disk writes 4 KiB untorn (`--untorn-writes`).
    pub untorn: bool,
}

/// What a simulated run found.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimOutcome {
    /// Requests counted before the cut (the run's length if none).
    pub ios: u64,
    /// The judge's counts.
    pub judged: Judged,
    /// The data disk's trace hash after recovery.
    pub trace: u64,
    /// With a planted loss: the open after it failed with a corruption
    /// error, or the checker found the damage (the loss was caught there
    /// rather than counted).
    pub open_caught: bool,
    /// Leaf cuts (split left halves) the recovery redid, and the keys
    /// they left out for re-applied commits to write again.
    pub leaf_cuts: (u64, u64),
    /// Later flushes the recovery found whole past where a log ended (in
    /// flight beside a torn one; a lower bound, see
    /// `RecoveryReport::flushes_past_end`).
    pub flushes_past_end: u64,
    /// Commit records the recovery appended again, short of log room
    /// (`RecoveryReport::commits_appended_again`).
    pub appended_again: u64,
    /// A recovery crashed before the one judged: the write (or flush) it
    /// was cut at, of how many a recovery of the same disks made.
    pub recovery_cut: Option<(u64, u64)>,
}

/// One run: format, set up the trees, run `tasks` committers of `txns`
/// transactions each with the power cut at request `point`, recover and
/// judge.
pub fn sim_run(cfg: SimRun) -> Result<SimOutcome, String> {
    let SimRun {
        seed,
        point,
        txns,
        tasks,
        durability,
        log_sync,
        plant_loss,
        untorn,
    } = cfg;
    let rig = SimRig::with(seed, untorn, sim_logs());
    let fail = |what: String| {
        format!(
            "seed {seed} point {point}{}: {what}",
            mode_flags(durability, log_sync)
        )
    };
    rig.setup().map_err(|e| fail(format!("create: {e}")))?;
    // One run in four tears each unsynced write after a random prefix of
    // its sectors (a device writing front to back): a long flush then
    // survives as many whole records, which sectors torn at random
    // rarely leave. Chosen by the seed (the sweep's seed moves by 2^20 a
    // point: one group of four points in four, each of the four modes),
    // so that `--seed S --point N` replays it.
    let policy = if (seed >> 22) & 3 == 3 {
        PowerCutPolicy::Prefix
    } else {
        PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 1.0,
        }
    };
    let switch = PowerSwitch::new(point, policy, seed);
    for d in rig.disks() {
        switch.attach(d);
    }
    // (txn, commit LSN) acknowledged per committer, and the submitted ones.
    let acks: Arc<Mutex<Vec<Vec<u64>>>> = Arc::new(Mutex::new(vec![Vec::new(); tasks as usize]));
    let submitted = Arc::new(Mutex::new(vec![0u64; tasks as usize]));
    let durable_seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut max = 0;
    // A cut during this open (a crash in recovery) is a crash point too.
    match rig.open(false, durability, log_sync) {
        Err(_) if switch.fired() => {}
        Err(e) => return Err(fail(format!("reopen before the run: {e}"))),
        Ok(db) => {
            let trees: Vec<_> = match TREES.iter().map(|n| db.tree(n)).collect::<Result<_, _>>() {
                Ok(t) => t,
                Err(_) if switch.fired() => Vec::new(),
                Err(e) => return Err(fail(format!("open trees: {e}"))),
            };
            max = trees.first().map_or(0, |t| t.max_inline_value_len());
            let (tx, rx) = std::sync::mpsc::channel();
            type Job = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
            let mut jobs: Vec<Job> = Vec::new();
            for task in (0..tasks).take_while(|_| !trees.is_empty()) {
                let (db2, trees, acks, submitted, durable_seen, errors, sw, tx) = (
                    db.clone(),
                    trees.clone(),
                    acks.clone(),
                    submitted.clone(),
                    durable_seen.clone(),
                    errors.clone(),
                    switch.clone(),
                    tx.clone(),
                );
                jobs.push(Box::pin(async move {
                    for i in 0..txns {
                        let t = txn(seed, task, i, max);
                        submitted.lock().unwrap_or_else(|e| e.into_inner())[task as usize] += 1;
                        let lsn_needed = durability == Durability::Async || plant_loss;
                        match commit_async(&db2, &trees, &t, lsn_needed).await {
                            Ok(lsn) => {
                                acks.lock().unwrap_or_else(|e| e.into_inner())[task as usize]
                                    .push(lsn);
                                if let Some(s) = db2.wal_stats() {
                                    durable_seen
                                        .fetch_max(s.durable, std::sync::atomic::Ordering::AcqRel);
                                }
                            }
                            Err(e) => {
                                if !sw.fired() {
                                    errors
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .push(format!(
                                            "committer {task} txn {i} failed without a crash: {e}"
                                        ));
                                }
                                break;
                            }
                        }
                    }
                    let _ = tx.send(());
                }));
            }
            // Spawned from one task on worker 0, so that the committers
            // start in the same order every time; committer i on worker
            // i mod the workers (its log).
            let (d, workers) = (db.clone(), rig.logs.len());
            let spawned = db.spawn_on(0, async move {
                for (i, j) in jobs.into_iter().enumerate() {
                    let _ = d.spawn_on(i % workers, j);
                }
            });
            if spawned.is_err() && !switch.fired() {
                return Err(fail("spawn failed without a crash".into()));
            }
            drop(tx);
            for _ in rx {}
            // What the engine reports durable now was synced before any
            // cut (the durable LSN moves only when a sync completed). Async
            // commits become durable within the window: wait for it.
            if durability == Durability::Async {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(s) = db.wal_stats() {
                durable_seen.fetch_max(s.durable, std::sync::atomic::Ordering::AcqRel);
            }
            // Dropping the database after a cut must not hang or panic.
        }
    }
    if let Some(e) = errors.lock().unwrap_or_else(|e| e.into_inner()).first() {
        return Err(fail(e.clone()));
    }
    let ios = switch.count();
    let durable = durable_seen.load(std::sync::atomic::Ordering::Acquire);
    let acks = acks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let submitted = submitted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if std::env::var_os("DANA_CRASHTEST_DEBUG").is_some() {
        eprintln!("durable seen {durable}, acks {acks:?}");
    }
    let logs: Vec<TaskLog> = (0..tasks)
        .map(|task| {
            let a = &acks[task as usize];
            let required = match durability {
                Durability::Async => a.iter().take_while(|&&l| l != 0 && l <= durable).count(),
                _ => a.len(),
            };
            TaskLog {
                task,
                txns: (0..submitted[task as usize])
                    .map(|i| txn(seed, task, i, max))
                    .collect(),
                required,
                lsns: a.clone(),
                // Committer i runs on worker i mod the workers.
                log: task % rig.logs.len() as u64,
            }
        })
        .collect();
    if !switch.fired() {
        // The run ended before the crash point: cut now.
        switch.cut();
    }
    if plant_loss {
        // The newest commit that had to survive: zero its synced block.
        let newest = logs
            .iter()
            .filter(|l| l.required > 0)
            .map(|l| acks[l.task as usize][l.required - 1])
            .max();
        // Commits return GSNs: find where the record lies in the log.
        let ends = rig.commit_ends();
        if let Some(&lsn) = newest.filter(|&l| l > 0).and_then(|g| ends.get(&g)) {
            let at = SimRig::log_offset(lsn) / 512 * 512;
            rig.log().overwrite_durable(at, &[0u8; 512]);
        }
    }
    rig.disks().for_each(|d| d.power_on());
    // One run in two crashes its recovery too, then recovers again: a
    // recovery writes (pages repaired and redone, commits appended again,
    // its checkpoint) and must leave what the next one can finish.
    let recovery_cut = if !plant_loss && (seed >> 24) & 1 == 1 {
        cut_recovery(&rig, seed, untorn, durability, log_sync, policy).map_err(fail)?
    } else {
        None
    };
    let reopened = rig.open(false, durability, log_sync);
    // The trace up to the end of recovery: what follows (the judge's reads
    // from this thread racing the worker's evictions) is not seeded.
    let trace = rig
        .disks()
        .enumerate()
        .fold(0, |h, (i, d)| h ^ d.trace_hash().rotate_left(i as u32));
    let db = match reopened {
        Ok(db) => db,
        Err(e @ (Error::CorruptLog { .. } | Error::Corrupt { .. })) if plant_loss => {
            let _ = e;
            return Ok(SimOutcome {
                ios,
                judged: Judged::default(),
                trace,
                open_caught: true,
                leaf_cuts: (0, 0),
                flushes_past_end: 0,
                appended_again: 0,
                recovery_cut,
            });
        }
        Err(e) => return Err(fail(format!("recovery: {e}"))),
    };
    let leaf_cuts = db
        .recovery()
        .map_or((0, 0), |r| (r.leaf_cuts, r.keys_left_to_reapply));
    let flushes_past_end = db.recovery().map_or(0, |r| r.flushes_past_end);
    let appended_again = db.recovery().map_or(0, |r| r.commits_appended_again);
    let judged = match judge(&db, &Default::default(), &logs, true) {
        Ok((j, _)) => j,
        // The checker or the trees caught the planted loss.
        Err(_) if plant_loss => {
            return Ok(SimOutcome {
                ios,
                judged: Judged::default(),
                trace,
                open_caught: true,
                leaf_cuts: (0, 0),
                flushes_past_end: 0,
                appended_again: 0,
                recovery_cut,
            })
        }
        Err(e) => return Err(fail(e)),
    };
    db.close()
        .map_err(|e| fail(format!("close after recovery: {e}")))?;
    if !judged.ordered() && !plant_loss {
        return Err(fail(format!(
            "{} committers' state is no prefix of their transactions, {} acknowledged commits missing before a later one that survived ({} of {} required commits verified)",
            judged.not_prefix, judged.out_of_order, judged.found, judged.required
        )));
    }
    Ok(SimOutcome {
        ios,
        judged,
        trace,
        open_caught: false,
        leaf_cuts,
        flushes_past_end,
        appended_again,
        recovery_cut,
    })
}

/// Crashes a recovery of what the run's cut left on `rig`: counts the
/// writes and flushes of one recovery on a copy of its disks
/// (replayable, so the rig's own recovery makes the same ones), then cuts
/// the power of the rig's disks at one of them, chosen by `seed`, and
/// restores it. Returns (the request cut at, the copy's count), or None
/// if the copy's recovery wrote nothing.
fn cut_recovery(
    rig: &SimRig,
    seed: u64,
    untorn: bool,
    durability: Durability,
    log_sync: bool,
    policy: PowerCutPolicy,
) -> Result<Option<(u64, u64)>, String> {
    let copy = SimRig::with(seed, untorn, rig.logs.len());
    for (to, from) in copy.disks().zip(rig.disks()) {
        to.copy_durable_from(from)
            .map_err(|e| format!("copying the disks for a recovery to count: {e}"))?;
    }
    let counter = PowerSwitch::at_write(0, policy, seed);
    copy.disks().for_each(|d| counter.attach(d));
    let db = copy
        .open(false, durability, log_sync)
        .map_err(|e| format!("recovery (of a copy, counting its requests): {e}"))?;
    let made = counter.count();
    drop(db);
    if made == 0 {
        return Ok(None);
    }
    let at = 1 + (seed ^ (seed >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15) % made;
    let switch = PowerSwitch::at_write(at, policy, seed ^ 0x005e_c07d);
    rig.disks().for_each(|d| switch.attach(d));
    let fired = match rig.open(false, durability, log_sync) {
        // Dropped after the cut: that must not hang or panic. Not fired
        // yet (two workers' writes vary from run to run): the recovery
        // finished whole, and this cut is an ordinary one.
        Ok(_db) => {
            let fired = switch.fired();
            switch.cut();
            fired
        }
        Err(_) if switch.fired() => true,
        Err(e) => return Err(format!("recovery cut at write {at} of {made}: {e}")),
    };
    rig.disks().for_each(|d| d.power_on());
    Ok(fired.then_some((at, made)))
}

/// Totals of a sweep.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// Runs (crash points, cycles).
    pub runs: u64,
    /// Runs with durability Async.
    pub async_runs: u64,
    /// Runs whose planted loss the open caught as corruption.
    pub open_caught: u64,
    /// kill -9 cycles that killed the process before it had opened.
    pub early_kills: u64,
    /// kill -9 cycles that killed the process before it had opened, on
    /// files with commits or pages to redo (a kill in a real recovery).
    pub kills_in_redo: u64,
    /// kill -9 children whose open redid commits or pages (they opened
    /// the files the last kill left).
    pub opens_with_redo: u64,
    /// Runs whose log flushed by write + fdatasync.
    pub log_sync_runs: u64,
    /// The judge's counts, summed.
    pub judged: Judged,
    /// Leaf cuts redone by the recoveries, and keys they left out.
    pub leaf_cuts: (u64, u64),
    /// Later flushes found past where a log ended, summed.
    pub flushes_past_end: u64,
    /// Commit records the recoveries appended again, summed.
    pub appended_again: u64,
    /// Runs whose first recovery was cut (a crash in recovery).
    pub recoveries_cut: u64,
    /// `--mirrored`: bytes flipped in copy 1.
    pub flipped: u64,
    /// `--mirrored`: copy files removed.
    pub removed: u64,
    /// `--mirrored`: opens that found a copy failed or rebuilding.
    pub degraded_opens: u64,
}

/// The mode of crash point or kill cycle `n`: Sync and Async alternate,
/// and every other pair flushes the log by write + fdatasync.
fn mode_of(n: u64) -> (Durability, bool) {
    let durability = if n % 2 == 0 {
        Durability::Sync
    } else {
        Durability::Async
    };
    (durability, n / 2 % 2 == 1)
}

/// The `dana crashtest` flags that replay a mode.
fn mode_flags(durability: Durability, log_sync: bool) -> String {
    let mut flags = String::new();
    if durability == Durability::Async {
        flags.push_str(" --async");
    }
    if log_sync {
        flags.push_str(" --log-sync");
    }
    let in_flight = LOG_FLUSHES_IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed);
    if in_flight != 0 {
        flags.push_str(&format!(" --log-flushes-in-flight {in_flight}"));
    }
    flags
}

/// `points` crash points for `seed`, half Sync and half Async, half of
/// each with the log flushed by write + fdatasync ([`mode_of`]): spread
/// over a run's I/Os, each with its own tear pattern. Stops at the first
/// failure.
pub fn sim_sweep(
    seed: u64,
    points: u64,
    txns: u64,
    tasks: u64,
    plant_loss: bool,
    untorn: bool,
) -> Result<Totals, String> {
    let mut t = Totals::default();
    let base = SimRun {
        seed,
        point: 0,
        txns,
        tasks,
        durability: Durability::Sync,
        log_sync: false,
        plant_loss: false,
        untorn,
    };
    // The length of a run without a cut, in each mode.
    let mut full = [0u64; 4];
    for (m, len) in full.iter_mut().enumerate() {
        let (durability, log_sync) = mode_of(m as u64);
        *len = sim_run(SimRun {
            durability,
            log_sync,
            ..base
        })?
        .ios;
    }
    for p in 0..points {
        let (durability, log_sync) = mode_of(p);
        let len = full[(p % 4) as usize].max(1);
        let point = 1 + (p / 4 * 4 * len) / points.max(1) % len;
        // Vary the tear pattern with the point, keep it replayable.
        let s = seed.wrapping_add(p << 20);
        if std::env::var_os("DANA_CRASHTEST_TRACE").is_some() {
            eprintln!(
                "crash point: --seed {s} --point {point}{}",
                mode_flags(durability, log_sync)
            );
        }
        let o = sim_run(SimRun {
            seed: s,
            point,
            durability,
            log_sync,
            plant_loss,
            ..base
        })?;
        t.runs += 1;
        t.async_runs += (durability == Durability::Async) as u64;
        t.log_sync_runs += log_sync as u64;
        t.open_caught += o.open_caught as u64;
        t.judged.add(&o.judged);
        t.leaf_cuts.0 += o.leaf_cuts.0;
        t.leaf_cuts.1 += o.leaf_cuts.1;
        t.flushes_past_end += o.flushes_past_end;
        t.appended_again += o.appended_again;
        t.recoveries_cut += o.recovery_cut.is_some() as u64;
    }
    Ok(t)
}

/// `flips` runs: a clean run, then one byte flipped in a durable commit
/// record that later flushes followed (after the last checkpoint's redo
/// point); each reopen must fail with a corruption error. Returns
/// (flips made, detected).
pub fn flip_sweep(seed: u64, flips: u64, txns: u64) -> Result<(u64, u64), String> {
    let (mut made, mut detected) = (0, 0);
    for f in 0..flips {
        let s = seed.wrapping_add(f << 24) ^ 0xf11;
        let rig = SimRig::new(s);
        let fail = |what: String| format!("flip seed {s}: {what}");
        rig.setup().map_err(|e| fail(format!("create: {e}")))?;
        let mut lsns = Vec::new();
        {
            let db = rig
                .open(false, Durability::Sync, false)
                .map_err(|e| fail(format!("open: {e}")))?;
            let trees: Vec<_> = TREES
                .iter()
                .map(|n| db.tree(n))
                .collect::<Result<_, _>>()
                .map_err(|e| fail(format!("trees: {e}")))?;
            let max = trees[0].max_inline_value_len();
            for i in 0..txns {
                let t = txn(s, 0, i, max);
                let (d2, tr) = (db.clone(), trees.clone());
                let lsn = db
                    .block_on(async move { commit_async(&d2, &tr, &t, true).await })
                    .and_then(|r| r)
                    .map_err(|e| fail(format!("commit {i}: {e}")))?;
                lsns.push(lsn);
            }
            // Dropped without close: no checkpoint moves the redo point.
        }
        let redo = rig.control().map(|c| c.redo).unwrap_or(0);
        // Commits return GSNs: where each record ends in the log.
        let ends = rig.commit_ends();
        let after: Vec<u64> = lsns
            .iter()
            .filter_map(|g| ends.get(g).copied())
            .filter(|&l| l > redo + 64)
            .collect();
        // A commit in the first half of those after the redo point: many
        // flushes followed it.
        let Some(&lsn) = after.get((s as usize) % (after.len() / 2).max(1)) else {
            continue;
        };
        let at = SimRig::log_offset(lsn) - (s % 16);
        let mut b = rig.log().read_durable(at, 1);
        b[0] ^= 1 << (s % 8);
        rig.log().overwrite_durable(at, &b);
        made += 1;
        match rig.open(false, Durability::Sync, false) {
            Err(Error::CorruptLog { .. }) => detected += 1,
            Err(e) => return Err(fail(format!("the open failed, but not as log damage: {e}"))),
            Ok(_) => {}
        }
    }
    Ok((made, detected))
}

// ---- injected I/O errors --------------------------------------------------

/// Injects one failing request (once or forever) at position `nth` into a
/// run of one committer: nothing acknowledged may be lost, errors are
/// clean (no panic, no hang; a failed log write or sync refuses writes).
/// `log_sync`: the log flushes by write + fdatasync (with durable log
/// writes, a failed flush can only be the data disk's).
pub fn fault_run(
    seed: u64,
    op: OpKind,
    nth: u64,
    sticky: bool,
    txns: u64,
    log_sync: bool,
) -> Result<Judged, String> {
    let rig = SimRig::new(seed);
    let fail = |what: String| {
        format!("seed {seed} fault {op:?} #{nth} sticky={sticky} log_sync={log_sync}: {what}")
    };
    rig.setup().map_err(|e| fail(format!("create: {e}")))?;
    let mut fault = Fault::nth(Some(op), nth);
    if sticky {
        fault = fault.sticky();
    }
    rig.data.inject(fault.clone());
    rig.log().inject(fault);
    let mut log = TaskLog::default();
    let mut max = 0;
    // A fault during the open (recovery's own I/O) must fail it cleanly.
    if let Ok(db) = rig.open(false, Durability::Sync, log_sync) {
        let trees: Vec<_> = TREES
            .iter()
            .map(|n| db.tree(n))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        max = trees.first().map_or(0, |t| t.max_inline_value_len());
        for i in (0..txns).take_while(|_| trees.len() == TREES.len()) {
            let t = txn(seed, 0, i, max);
            log.txns.push(t.clone());
            let (d2, tr) = (db.clone(), trees.clone());
            match db
                .block_on(async move { commit_async(&d2, &tr, &t, false).await })
                .and_then(|r| r)
            {
                Ok(_) => log.required += 1,
                // In doubt; nothing more is committed after a failure.
                Err(_) => break,
            }
        }
    }
    let _ = max;
    rig.data.clear_faults();
    rig.log().clear_faults();
    // The power goes before the reopen: every write no flush made durable
    // is gone, so a commit acknowledged over a failed flush is missed
    // (without the cut the reopen read the device's cache, and found it).
    rig.data.power_cut(PowerCutPolicy::DropAll, seed);
    rig.log().power_cut(PowerCutPolicy::DropAll, seed ^ 1);
    rig.data.power_on();
    rig.log().power_on();
    let db = rig
        .open(false, Durability::Sync, false)
        .map_err(|e| fail(format!("recovery: {e}")))?;
    let (j, _) = judge(&db, &Default::default(), &[log], true).map_err(fail)?;
    db.close()
        .map_err(|e| fail(format!("close after recovery: {e}")))?;
    if !j.ordered() || j.lost() > 0 {
        return Err(fail(format!(
            "{} of {} acknowledged commits found",
            j.found, j.required
        )));
    }
    Ok(j)
}

// ---- kill -9 --------------------------------------------------------------

fn kill_options(durability: Durability, log_sync: bool) -> Options {
    let o = if mirrored() {
        Options::default().mirrored()
    } else {
        Options::default()
    };
    // Out of place, a file small enough (12 MiB per 8 committers: ~1,800
    // pages for the engine, 23 segments) that the children's page writes
    // wrap it many times: the collection runs under the kills. Each
    // committer's keys hold ~200 pages at most (300 keys in each of two
    // trees, one value in twelve large): a file of 12 MiB whatever the
    // committers stopped 16 of them with a true `NoSpace`.
    let committers = COMMITTERS.load(std::sync::atomic::Ordering::Relaxed);
    let (o, capacity) = if out_of_place() {
        let o = o.write_mode(dana::WriteMode::OutOfPlace);
        let o = o
            .compress_pages(compress_pages())
            .background_collection(background_collection());
        (o, (12 << 20) * committers.div_ceil(8).max(1))
    } else {
        (o, (64 << 20) * committers.div_ceil(64).max(1))
    };
    o.log_flush_block(log_flush_block())
        .log_flushes_in_flight(log_flushes_in_flight())
        .compress_log_images(compress_log_images())
        .log_write_through_max(if log_sync {
            0
        } else {
            Options::default().log_write_through_max_value()
        })
        .pool_bytes(64 * 4096)
        .capacity_bytes(capacity)
        .log_bytes(4 << 20)
        .workers(2)
        // One log per worker: kill -9 across logs that become durable
        // independently.
        .logs(2)
        .durability(durability)
}

/// The child: one thread per committer, committing its transactions from
/// its start on and printing `ack TASK LSN` once each commit returned and
/// `durable LSN` after it, until killed.
fn child(
    dir: &Path,
    seed: u64,
    starts: &[u64],
    durability: Durability,
    log_sync: bool,
) -> CliResult<()> {
    let db = Db::open(dir, kill_options(durability, log_sync))?;
    let trees: Vec<_> = TREES
        .iter()
        .map(|n| db.tree_or_create(n))
        .collect::<Result<_, _>>()?;
    let max = trees[0].max_inline_value_len();
    let degraded = db
        .mirror_status()
        .iter()
        .any(|g| g.copies.iter().any(|c| c.state != CopyState::Healthy));
    if degraded {
        // Rebuild the copy the parent removed while the committers run:
        // the kill may land in the middle of it.
        let db = db.clone();
        std::thread::spawn(move || db.rebuild());
    }
    // What this open redid: the files the last child left, not a
    // database closed cleanly since (the parent judges a copy).
    let (commits, pages) = db
        .recovery()
        .map_or((0, 0), |r| (r.commits, r.pages_redone));
    println!("recovered {commits} {pages}");
    println!("ready");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let threads: Vec<_> = starts
        .iter()
        .enumerate()
        .map(|(task, &start)| {
            let (db, trees, out) = (db.clone(), trees.clone(), out.clone());
            std::thread::spawn(move || -> CliResult<()> {
                {
                    let home = db.runtime().home_worker();
                    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                    writeln!(o, "home {task} {home}")
                        .and_then(|_| o.flush())
                        .map_err(|e| CliError(format!("pipe: {e}")))?;
                }
                for i in start.. {
                    let t = txn(seed, task as u64, i, max);
                    let committed = (|| {
                        let mut tx = db.begin();
                        for (ti, k, v) in &t {
                            match v {
                                Some(v) => tx.put(&trees[*ti], k, v)?,
                                None => tx.delete(&trees[*ti], k)?,
                            }
                        }
                        db.commit_lsn(tx)
                    })();
                    let lsn = match committed {
                        Ok(lsn) => lsn,
                        Err(e) => {
                            // Told to the parent: a committer that stops
                            // on an error acknowledges nothing more, and
                            // its cycles would pass with nothing to judge.
                            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = writeln!(o, "error {task} {e}").and_then(|_| o.flush());
                            return Err(e.into());
                        }
                    };
                    let durable = db.wal_stats().map_or(0, |s| s.durable);
                    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                    writeln!(o, "ack {task} {lsn}\ndurable {durable}")
                        .and_then(|_| o.flush())
                        .map_err(|e| CliError(format!("pipe: {e}")))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| CliError("a committer panicked".into()))??;
    }
    Ok(())
}

/// Starts a kill cycle's child with its stdout piped to a thread that
/// sends each line; stderr is dropped.
pub fn spawn_child(
    cmd: &mut Command,
) -> Result<
    (
        std::process::Child,
        std::sync::mpsc::Receiver<String>,
        std::thread::JoinHandle<()>,
    ),
    String,
> {
    let mut child = cmd
        .stdout(Stdio::piped())
        // Read only when the child fails to start (what it said about
        // why): a child writes nothing there otherwise.
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = child.stdout.take().ok_or("no pipe")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx, reader))
}

/// `cycles` kill -9 cycles on `dir` with `tasks` committers: each starts a
/// child, kills it (every third one while it opens and recovers, the
/// others after a random delay), opens a copy of the files and judges it
/// (the next child recovers the files themselves).
pub fn kill_cycles(dir: &Path, seed: u64, cycles: u64, tasks: u64) -> Result<Totals, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    COMMITTERS.store(tasks, std::sync::atomic::Ordering::Relaxed);
    let mut rng = XorShift::new(seed);
    let mut model: Model = Default::default();
    let mut next = vec![0u64; tasks as usize];
    let mut max = 0usize;
    let mut t = Totals::default();
    // `--mirrored`: the file offsets of the bytes flipped in copy 1 of the
    // data file (forgotten when that file is removed).
    let mut flips = Vec::new();
    // Commits and pages the last judging open redid: what the next child
    // redoes from the same files.
    let mut redo_left = 0u64;
    for c in 0..cycles {
        let (durability, log_sync) = mode_of(c);
        let fail = |what: String| {
            format!(
                "kill cycle {c} (seed {seed}, dir {}): {what}",
                dir.display()
            )
        };
        if mirrored() && c > 0 {
            damage_copy_1(dir, c, &mut rng, &mut t, &mut flips).map_err(fail)?;
        }
        let starts: Vec<String> = next.iter().map(u64::to_string).collect();
        let mut cmd = Command::new(&exe);
        cmd.args([
            "crashtest",
            "--child",
            "--seed",
            &seed.to_string(),
            "--starts",
            &starts.join(","),
        ]);
        if durability == Durability::Async {
            cmd.arg("--async");
        }
        if log_sync {
            cmd.arg("--log-sync");
        }
        if log_flush_block() != 0 {
            cmd.args(["--log-flush-block", &log_flush_block().to_string()]);
        }
        cmd.args([
            "--log-flushes-in-flight",
            &log_flushes_in_flight().to_string(),
        ]);
        if mirrored() {
            cmd.arg("--mirrored");
        }
        if out_of_place() {
            cmd.arg("--out-of-place");
        }
        if compress_pages() {
            cmd.arg("--compress-pages");
        }
        cmd.args([
            "--background-collection",
            &background_collection().to_string(),
        ]);
        if compress_log_images() {
            cmd.arg("--compress-log-images");
        }
        let (mut child, rx, reader) = spawn_child(cmd.arg("--dir").arg(dir)).map_err(fail)?;
        let early = c % 3 == 2;
        let mut seen = Vec::new();
        if early {
            // Kill it while it opens: recovery of the last cycle's log.
            std::thread::sleep(Duration::from_millis(1 + rng.next_u64() % 25));
        } else {
            // Up to `ready`, kept to be read with the rest.
            loop {
                match rx.recv_timeout(Duration::from_secs(60)) {
                    Ok(l) if l == "ready" => {
                        seen.push(l);
                        break;
                    }
                    Ok(l) if l.starts_with("recovered ") => seen.push(l),
                    other => {
                        let _ = child.kill();
                        let _ = child.wait();
                        let mut said = String::new();
                        if let Some(mut e) = child.stderr.take() {
                            let _ = std::io::Read::read_to_string(&mut e, &mut said);
                        }
                        return Err(fail(format!(
                            "child did not start: {other:?}: {}",
                            said.trim()
                        )));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20 + rng.next_u64() % 200));
            // Committing until killed: a child that already exited stopped
            // on an error (its cycle would judge nothing).
            if let Ok(Some(status)) = child.try_wait() {
                let lines: Vec<String> = rx.try_iter().filter(|l| l.starts_with("error")).collect();
                return Err(fail(format!(
                    "the child exited before the kill ({status}): {lines:?}"
                )));
            }
        }
        // SIGKILL: no destructor, no flush.
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        let mut acks = vec![Vec::new(); tasks as usize];
        let mut homes = vec![0u64; tasks as usize];
        let mut durable = 0u64;
        let mut ready = false;
        for line in seen.into_iter().chain(rx.try_iter()) {
            let mut w = line.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("ready"), ..) => ready = true,
                (Some("recovered"), Some(c), Some(p)) => {
                    let redid = c.parse::<u64>().unwrap_or(0) + p.parse::<u64>().unwrap_or(0);
                    t.opens_with_redo += u64::from(redid > 0);
                }
                (Some("ack"), Some(task), Some(lsn)) => {
                    let (task, lsn): (usize, u64) = (
                        task.parse()
                            .map_err(|_| fail(format!("bad line {line:?}")))?,
                        lsn.parse()
                            .map_err(|_| fail(format!("bad line {line:?}")))?,
                    );
                    acks.get_mut(task)
                        .ok_or_else(|| fail(format!("bad task in {line:?}")))?
                        .push(lsn);
                }
                (Some("home"), Some(task), Some(w)) => {
                    if let (Ok(task), Ok(w)) = (task.parse::<usize>(), w.parse()) {
                        if let Some(h) = homes.get_mut(task) {
                            *h = w;
                        }
                    }
                }
                (Some("durable"), Some(d), _) => durable = durable.max(d.parse().unwrap_or(0)),
                (Some("error"), ..) => {
                    return Err(fail(format!("a committer stopped on an error: {line}")));
                }
                _ => {}
            }
        }
        t.early_kills += (early && !ready) as u64;
        t.kills_in_redo += (early && !ready && redo_left > 0) as u64;
        // Judged on a copy: the crashed files stay as the kill left them,
        // and the next child recovers them itself, so a kill while it
        // opens lands in a real redo. (The parent used to reopen and close
        // the files themselves: every child then opened a database closed
        // cleanly, with nothing to redo.)
        let judged_dir = copy_of(dir).map_err(fail)?;
        let db = Db::open(&judged_dir, kill_options(Durability::Sync, false))
            .map_err(|e| fail(format!("recovery: {e}")))?;
        redo_left = db.recovery().map_or(0, |r| r.commits + r.pages_redone);
        if max == 0 {
            max = db
                .tree(TREES[0])
                .map(|t| t.max_inline_value_len())
                .unwrap_or(1024);
        }
        let logs: Vec<TaskLog> = (0..tasks)
            .map(|task| {
                let a = &acks[task as usize];
                let required = match durability {
                    Durability::Async => a.iter().take_while(|&&l| l <= durable).count(),
                    _ => a.len(),
                };
                let from = next[task as usize];
                TaskLog {
                    task,
                    txns: (from..from + a.len() as u64 + 1)
                        .map(|i| txn(seed, task, i, max))
                        .collect(),
                    required,
                    lsns: a.clone(),
                    log: homes[task as usize],
                }
            })
            .collect();
        t.degraded_opens += u64::from(
            db.mirror_status()
                .iter()
                .any(|g| g.copies.iter().any(|c| c.state != CopyState::Healthy)),
        );
        let (judged, matched) = judge(&db, &model, &logs, false).map_err(fail)?;
        db.close().map_err(|e| fail(format!("close: {e}")))?;
        std::fs::remove_dir_all(&judged_dir)
            .map_err(|e| fail(format!("removing {}: {e}", judged_dir.display())))?;
        t.runs += 1;
        t.async_runs += (durability == Durability::Async) as u64;
        t.log_sync_runs += log_sync as u64;
        t.judged.add(&judged);
        if !judged.ordered() || judged.lost() > 0 {
            return Err(fail(format!(
                "{} of {} commits that had to survive found; {} committers' state is no prefix; {} acknowledged commits missing before a later one that survived",
                judged.found, judged.required, judged.not_prefix, judged.out_of_order
            )));
        }
        // The new base: each committer's transactions as far as found.
        for (log, j) in logs.iter().zip(matched) {
            let j = j.unwrap_or(log.required);
            let mut m = of_task(&model, log.task);
            for tx in &log.txns[..j] {
                apply(&mut m, tx);
            }
            for (tree, part) in m.into_iter().enumerate() {
                let prefix = format!("c{:02}k", log.task).into_bytes();
                model[tree].retain(|k, _| !k.starts_with(&prefix));
                model[tree].extend(part);
            }
            next[log.task as usize] += j as u64;
        }
    }
    // The files themselves, recovered and closed at last: the state judged
    // on the last cycle's copy, exactly.
    let db = Db::open(dir, kill_options(Durability::Sync, false))
        .map_err(|e| format!("after the kill cycles: recovery: {e}"))?;
    let got = contents(&db).map_err(|e| format!("after the kill cycles: reading: {e}"))?;
    db.close()
        .map_err(|e| format!("after the kill cycles: close: {e}"))?;
    if got != model {
        return Err(format!(
            "after the kill cycles: the files recovered to another state than their copy \
             ({} and {} keys, {} and {} judged)",
            got[0].len(),
            got[1].len(),
            model[0].len(),
            model[1].len()
        ));
    }
    if mirrored() {
        final_mirror_check(dir, &flips).map_err(|e| format!("after the kill cycles: {e}"))?;
    }
    Ok(t)
}

/// A copy of the database files in `dir`, beside it (`DIR.judged`, made
/// afresh), for the parent to open and judge.
pub fn copy_of(dir: &Path) -> Result<PathBuf, String> {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".judged");
    let to = dir.with_file_name(name);
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        if e.file_type().map_err(|e| e.to_string())?.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name()))
                .map_err(|err| format!("copying {}: {err}", e.path().display()))?;
        }
    }
    Ok(to)
}

/// `--mirrored`, between two kill cycles: flips a byte in a random page of
/// the data file's copy 1, or (every fifth cycle) removes one of copy 1's
/// files. Copy 0 is never touched. `flips` gets the offset of each byte
/// flipped, and is cleared when the data file's copy 1 is removed.
fn damage_copy_1(
    dir: &Path,
    cycle: u64,
    rng: &mut XorShift,
    t: &mut Totals,
    flips: &mut Vec<u64>,
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    if cycle % 5 == 3 {
        let files = ["dana.0.m1", "dana.wal.m1", "dana.wal.1.m1"];
        let name = files[(rng.next_u64() % files.len() as u64) as usize];
        let f = dir.join(name);
        if f.exists() {
            std::fs::remove_file(&f).map_err(|e| format!("removing {}: {e}", f.display()))?;
            t.removed += 1;
            if name == "dana.0.m1" {
                flips.clear();
            }
        }
        return Ok(());
    }
    let path = dir.join("dana.0.m1");
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return Ok(()); // removed, rebuilt by a later child
    };
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let label = dana::io::mirror::LABEL_BYTES;
    if len <= label + 4096 {
        return Ok(());
    }
    let at = label + rng.next_u64() % (len - label);
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, at).map_err(|e| e.to_string())?;
    file.write_all_at(&[b[0] ^ 0x40], at)
        .map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())?;
    t.flipped += 1;
    flips.push(at);
    Ok(())
}

/// `--mirrored`, after the cycles: every copy rebuilt, and the copies of
/// the data file differing only where copy 1 holds a flipped byte that no
/// read met since: copy 0 a valid page and copy 1 not, or (a page of a
/// large value's extent, which has no page checksum, so neither copy
/// passes as a page) copy 1 differing from copy 0 only at bytes `flips`
/// names.
fn final_mirror_check(dir: &Path, flips: &[u64]) -> Result<(), String> {
    let db =
        Db::open(dir, kill_options(Durability::Sync, false)).map_err(|e| format!("open: {e}"))?;
    db.rebuild().map_err(|e| format!("rebuild: {e}"))?;
    db.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    let report = db.check().map_err(|e| format!("check: {e}"))?;
    db.close().map_err(|e| format!("close: {e}"))?;
    if report.mirrors.is_empty() {
        return Err("the database is not mirrored".into());
    }
    for m in &report.mirrors {
        if m.states.iter().any(|s| *s != CopyState::Healthy) {
            return Err(format!(
                "{} still degraded after the rebuild: {:?}",
                m.role, m.states
            ));
        }
        let flipped_only = |page: u64| only_flipped_bytes(dir, page, flips);
        if let Some((page, valid)) = m
            .divergent
            .iter()
            .find(|(p, v)| v[..] != [true, false] && !(v[..] == [false, false] && flipped_only(*p)))
        {
            return Err(format!(
                "page {page} of {} differs between the copies (valid: {valid:?}): not a flipped byte of copy 1",
                m.role
            ));
        }
    }
    if !report.data_ok() {
        return Err(format!("check: {:?}", report.findings));
    }
    Ok(())
}

/// True if page `page` of the data file's two copies differs only at
/// bytes of copy 1 that `flips` names, each the flip of copy 0's (a
/// byte flipped twice is equal again). False if either cannot be read.
/// The crash runs have one data device (`dana.0`, stripe width 1), so
/// page `page` lies at `LABEL_BYTES + page * page size` in both copies.
fn only_flipped_bytes(dir: &Path, page: u64, flips: &[u64]) -> bool {
    use std::os::unix::fs::FileExt;
    let ps = kill_options(Durability::Sync, false).page_size_value() as u64;
    let at = dana::io::mirror::LABEL_BYTES + page * ps;
    let mut copies = [vec![0u8; ps as usize], vec![0u8; ps as usize]];
    for (name, buf) in ["dana.0", "dana.0.m1"].iter().zip(copies.iter_mut()) {
        let read = std::fs::File::open(dir.join(name)).and_then(|f| f.read_exact_at(buf, at));
        if read.is_err() {
            return false;
        }
    }
    (0..ps).all(|i| {
        let (a, b) = (copies[0][i as usize], copies[1][i as usize]);
        a == b || (b == a ^ 0x40 && flips.contains(&(at + i)))
    })
}

/// `dana crashtest`.
pub fn run(args: &CrashArgs) -> CliResult<()> {
    // Committers are tasks spawned from a worker into its own queue: past
    // its bound the spawn would wait for good.
    if args.tasks == 0 || args.tasks > 1024 {
        return Err(CliError(format!("--tasks {}: from 1 to 1,024", args.tasks)));
    }
    LOG_FLUSH_BLOCK.store(args.log_flush_block, std::sync::atomic::Ordering::Relaxed);
    MIRRORED.store(args.mirrored, std::sync::atomic::Ordering::Relaxed);
    WORKER_LOGS.store(args.worker_logs, std::sync::atomic::Ordering::Relaxed);
    OUT_OF_PLACE.store(args.out_of_place, std::sync::atomic::Ordering::Relaxed);
    COMPRESS_PAGES.store(args.compress_pages, std::sync::atomic::Ordering::Relaxed);
    BACKGROUND_COLLECTION.store(
        args.background_collection,
        std::sync::atomic::Ordering::Relaxed,
    );
    COMPRESS_LOG_IMAGES.store(
        args.compress_log_images,
        std::sync::atomic::Ordering::Relaxed,
    );
    LOG_FLUSHES_IN_FLIGHT.store(
        args.log_flushes_in_flight,
        std::sync::atomic::Ordering::Relaxed,
    );
    let durability = if args.async_durability {
        Durability::Async
    } else {
        Durability::Sync
    };
    if args.child {
        let dir = args
            .dir
            .as_ref()
            .ok_or_else(|| CliError("--child needs --dir".into()))?;
        COMMITTERS.store(
            args.starts.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        return match args.workload {
            Workload::Tpcc => tpcc::crash::child(dir, args.seed),
            Workload::Default => child(dir, args.seed, &args.starts, durability, args.log_sync),
        };
    }
    if args.workload == Workload::Tpcc {
        return tpcc_kills(args);
    }
    if args.mirrored {
        return mirrored_kills(args);
    }
    if args.out_of_place {
        let dir = kill_dir(args)?;
        let started = Instant::now();
        let k = kill_cycles(&dir, args.seed, args.kills, args.tasks).map_err(CliError)?;
        let line = if args.compress_pages {
            "kill -9, out of place, compressed"
        } else {
            "kill -9, out of place"
        };
        print_kills(line, &k, args.tasks, started);
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return lost_is_failure(k.judged.lost(), false);
    }
    if let Some(point) = args.point {
        let o = sim_run(SimRun {
            seed: args.seed,
            point,
            txns: args.txns,
            tasks: args.tasks,
            durability,
            log_sync: args.log_sync,
            plant_loss: args.plant_loss,
            untorn: args.untorn_writes,
        })
        .map_err(CliError)?;
        let j = o.judged;
        println!(
            "seed {} point {point}: {} commits required, {} found, lost {}, {} in-doubt found applied{}; trace {:016x}",
            args.seed,
            j.required,
            j.found,
            j.lost(),
            j.doubts_applied,
            o.recovery_cut.map_or(String::new(), |(at, made)| format!(
                "; its recovery was cut at write {at} of {made} and recovered again"
            )),
            o.trace
        );
        return lost_is_failure(j.lost(), o.open_caught);
    }
    let started = Instant::now();
    let sim = sim_sweep(
        args.seed,
        args.points,
        args.txns,
        args.tasks,
        args.plant_loss,
        args.untorn_writes,
    )
    .map_err(CliError)?;
    let j = sim.judged;
    println!(
        "simulated power cuts{}: {} crash points ({} sync, {} async; {} with the log flushed by write + fdatasync), {} committers: {} commits required, {} found, lost {}, {} in-doubt commits found applied, {} missing before a later survivor; recoveries redid {} leaf cuts ({} keys left out for re-applied commits), appended {} commit records again short of log room and found {} later flushes kept past a torn one (log flushes in flight: up to {}); {} recoveries crashed and recovered again; in {:.1} s",
        if args.untorn_writes {
            " (data disk writing 4 KiB untorn, no torn-page images logged)"
        } else if args.compress_log_images {
            " (full page images logged compressed)"
        } else {
            ""
        },
        sim.runs,
        sim.runs - sim.async_runs,
        sim.async_runs,
        sim.log_sync_runs,
        args.tasks,
        j.required,
        j.found,
        j.lost(),
        j.doubts_applied,
        j.out_of_order,
        sim.leaf_cuts.0,
        sim.leaf_cuts.1,
        sim.appended_again,
        sim.flushes_past_end,
        sim_flight_choices().into_iter().max().unwrap_or(1),
        sim.recoveries_cut,
        started.elapsed().as_secs_f64()
    );
    if args.plant_loss {
        println!(
            "planted losses: {} runs, lost {} (counted), {} caught by the open or the checker as damage",
            sim.runs,
            j.lost(),
            sim.open_caught
        );
        return lost_is_failure(j.lost(), sim.open_caught > 0);
    }
    let mut lost = j.lost();
    let started = Instant::now();
    let (made, detected) =
        flip_sweep(args.seed, args.flips, args.txns.max(20)).map_err(CliError)?;
    println!(
        "log damage: {made} bytes flipped in durable commit records, {detected} detected, missed {} in {:.1} s",
        made - detected,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut faults = Judged::default();
    let mut runs = 0;
    for (op, sticky) in [
        (OpKind::Write, false),
        (OpKind::Write, true),
        (OpKind::Flush, false),
        (OpKind::Flush, true),
        (OpKind::Read, false),
        (OpKind::Read, true),
    ] {
        for (k, nth) in [0, 3, 10, 30, 100].into_iter().enumerate() {
            // Log syncs exist only with write + fdatasync; writes and
            // reads fail under both flush primitives.
            let log_sync = op == OpKind::Flush || k % 2 == 1;
            let txns = args.txns.min(40);
            faults.add(&fault_run(args.seed, op, nth, sticky, txns, log_sync).map_err(CliError)?);
            runs += 1;
        }
    }
    lost += faults.lost();
    println!(
        "injected I/O errors: {runs} runs (reads, writes, syncs; once and forever): {} commits acknowledged, {} found, lost {} in {:.1} s",
        faults.required,
        faults.found,
        faults.lost(),
        started.elapsed().as_secs_f64()
    );
    if args.kills > 0 {
        let dir = kill_dir(args)?;
        let started = Instant::now();
        let k = kill_cycles(&dir, args.seed, args.kills, args.tasks).map_err(CliError)?;
        lost += k.judged.lost();
        print_kills("kill -9", &k, args.tasks, started);
        if args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    if made != detected {
        return Err(CliError(format!(
            "{} flipped log bytes went undetected",
            made - detected
        )));
    }
    lost_is_failure(lost, false)
}

/// Prints the counts of a run of kill -9 cycles, as `label: ...`.
fn print_kills(label: &str, k: &Totals, tasks: u64, started: Instant) {
    println!(
        "{label}: {} cycles ({} async, {} with the log flushed by write + fdatasync, {} killed while opening, {} of them with commits or pages to redo; {} opens redid some), {} committers: {} commits required, {} found, lost {}, {} in-doubt commits found applied in {:.1} s",
        k.runs,
        k.async_runs,
        k.log_sync_runs,
        k.early_kills,
        k.kills_in_redo,
        k.opens_with_redo,
        tasks,
        k.judged.required,
        k.judged.found,
        k.judged.lost(),
        k.judged.doubts_applied,
        started.elapsed().as_secs_f64()
    );
}

/// `dana crashtest --mirrored`: the kill -9 cycles on mirrored files,
/// copy 1 damaged between cycles.
fn mirrored_kills(args: &CrashArgs) -> CliResult<()> {
    let dir = kill_dir(args)?;
    let started = Instant::now();
    let k = kill_cycles(&dir, args.seed, args.kills, args.tasks).map_err(CliError)?;
    println!(
        "kill -9, mirrored: {} cycles ({} async, {} killed while opening), {} committers; copy 1 damaged between cycles: {} bytes flipped, {} files removed; {} opens found a copy failed or rebuilding; {} commits required, {} found, lost {}, and after the cycles every copy rebuilt and the copies identical but for flipped bytes not read since; in {:.1} s",
        k.runs,
        k.async_runs,
        k.early_kills,
        args.tasks,
        k.flipped,
        k.removed,
        k.degraded_opens,
        k.judged.required,
        k.judged.found,
        k.judged.lost(),
        started.elapsed().as_secs_f64()
    );
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    lost_is_failure(k.judged.lost(), false)
}

/// The directory of the kill -9 cycles: `--dir`, or a new temporary one
/// (removed by the caller after a passing run).
fn kill_dir(args: &CrashArgs) -> CliResult<PathBuf> {
    match &args.dir {
        // New, empty, or one a crashtest made: never a user's database
        // (the mirrored cycles flip bytes in copy 1 and remove files).
        Some(d) => crate::bench::fresh_bench_dir(d).map(|()| d.clone()),
        None => tempdir(),
    }
}

/// `dana crashtest --workload tpcc`.
fn tpcc_kills(args: &CrashArgs) -> CliResult<()> {
    let dir = kill_dir(args)?;
    let started = Instant::now();
    let r = tpcc::crash::kill_cycles(&dir, args.seed, args.kills);
    if args.dir.is_none() && r.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let k = r.map_err(CliError)?;
    println!(
        "kill -9 during TPC-C: {} cycles ({} killed while opening; {} opens redid some): {} New-Orders acknowledged, \
         {} found, lost {}; consistency conditions held after every recovery ({} rows checked) \
         in {:.1} s",
        k.cycles,
        k.killed_while_opening,
        k.opens_with_redo,
        k.acknowledged,
        k.found,
        k.acknowledged - k.found,
        k.rows_checked,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Exit status: any loss (counted, or caught by an open as damage) fails.
fn lost_is_failure(lost: u64, caught: bool) -> CliResult<()> {
    if lost > 0 || caught {
        return Err(CliError(format!(
            "lost {lost} commits that had to survive{}",
            if caught {
                "; an open reported log damage"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

fn tempdir() -> CliResult<PathBuf> {
    let base = std::env::temp_dir().join(format!("dana-crashtest-{}", std::process::id()));
    std::fs::create_dir_all(&base).map_err(|e| CliError(format!("{}: {e}", base.display())))?;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::{out_of_order, TaskLog};

    fn log(task: u64, lsns: &[u64]) -> TaskLog {
        TaskLog {
            task,
            txns: Vec::new(),
            required: lsns.len(),
            lsns: lsns.to_vec(),
            log: 0,
        }
    }

    /// Two logs become durable independently: a commit missing in one
    /// while a later one of the other survived is no disorder.
    #[test]
    fn order_is_judged_within_each_log() {
        let mut logs = [log(0, &[10, 30, 50]), log(1, &[20, 40, 60])];
        logs[1].log = 1;
        assert_eq!(out_of_order(&logs, &[Some((1, 1)), Some((3, 3))]), 0);
        logs[1].log = 0;
        assert_eq!(out_of_order(&logs, &[Some((1, 1)), Some((3, 3))]), 2);
    }

    #[test]
    fn a_state_that_is_a_prefix_of_the_log_order_is_in_order() {
        let logs = [log(0, &[10, 30, 50]), log(1, &[20, 40, 60])];
        // Everything up to LSN 40 survived.
        assert_eq!(out_of_order(&logs, &[Some((2, 2)), Some((2, 2))]), 0);
        // Unknown LSNs (0) are not judged.
        let logs = [log(0, &[10, 0, 50]), log(1, &[20, 40])];
        assert_eq!(out_of_order(&logs, &[Some((1, 1)), Some((2, 2))]), 0);
    }

    #[test]
    fn a_missing_commit_before_a_survivor_of_another_committer_is_out_of_order() {
        let logs = [log(0, &[10, 30, 50]), log(1, &[20, 40, 60])];
        // Committer 0 lost LSN 30 and 50, committer 1 kept 40 and 60.
        assert_eq!(out_of_order(&logs, &[Some((1, 1)), Some((3, 3))]), 2);
        // A committer with no matching prefix is left to the prefix check.
        assert_eq!(out_of_order(&logs, &[None, Some((3, 3))]), 0);
        // Transactions that change nothing (1..3 match equally) are
        // neither present nor absent.
        assert_eq!(out_of_order(&logs, &[Some((1, 3)), Some((3, 3))]), 0);
    }
}
