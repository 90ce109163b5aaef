//! YCSB on a peer engine: the same operation streams (`Shared::op_gen`) run
//! from plain threads (each of `--peer-threads` in turn) through the
//! [`PeerEngine`] trait, one synchronous operation at a time per thread
//! (the engines' own API), with every write synced when dana's log is.
//!
//! Keys are dana's: [`key_of`] of the key number (hashed), loaded by
//! [`PeerEngine::load`] in ascending key order as dana's load is (the
//! peers' bulk loaders need sorted input). Reads, updates and
//! read-modify-writes pick the same key numbers with the same
//! distributions, inserts add the same keys, and scans read `len` records
//! in key order from the same key. Never: counts a wrong or missing value
//! as a success.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dana::stats::{Histogram, HistogramSnapshot};
use serde::Serialize;

use super::workload::{
    fill_value, hashed_load_keys, key_of, modify, numbers_in_key_order, value_ok, Op, OpKind,
    Shared, Workload,
};
use crate::bench::diskstats::Disk;
use crate::bench::{bar, Latency, RunState};
use crate::peers::{self, PeerConfig, PeerEngine};
use crate::report::process_cpu_seconds;
use crate::{CliError, CliResult};

/// One workload on one peer engine.
#[derive(Debug, Clone, Serialize)]
pub struct PeerYcsbRun {
    /// Engine name.
    pub engine: String,
    /// a-f.
    pub workload: Workload,
    /// Why the numbers may not be comparable.
    pub caveat: Option<String>,
    /// Cache budget, bytes.
    pub cache_bytes: u64,
    /// Client threads.
    pub threads: usize,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Failed operations.
    pub errors: u64,
    /// Latency per operation kind (read, update, insert, scan, rmw).
    pub per_kind: Vec<(String, u64, Latency)>,
    /// Block device reads per second.
    pub disk_reads_per_s: Option<f64>,
    /// Block device writes per operation (data, log, compaction: all of
    /// the device's writes in the window, /proc/diskstats).
    pub disk_writes_per_op: Option<f64>,
    /// Block device bytes written per operation.
    pub disk_write_bytes_per_op: Option<f64>,
    /// What each write cost the engine's log, as dana's durability
    /// (`peers` module doc: fairness rules).
    #[serde(serialize_with = "crate::bench::serialize_durability")]
    pub durability: dana::Durability,
    /// Records the engine held after the run (the next insert's key
    /// number): where the next run's inserts go on.
    pub records_after: u64,
    /// The process's resident memory at the end of the run over what it
    /// was before the engine opened (its cache, memtables, threads).
    pub rss_added_bytes: u64,
    /// Process CPU µs per operation.
    pub cpu_us_per_op: f64,
    /// dana's ops/s on the same workload / this engine's.
    pub dana_over_peer: Option<f64>,
    /// The engine's best thread count on this workload in the
    /// invocation (the run a ratio is quoted from).
    pub best: bool,
}

const KINDS: [(&str, OpKind); 5] = [
    ("read", OpKind::Read),
    ("update", OpKind::Update),
    ("insert", OpKind::Insert),
    ("scan", OpKind::Scan),
    ("rmw", OpKind::Rmw),
];

/// Opens `name` as `cfg` says, loading `records` if needed.
pub fn open_loaded(
    name: &str,
    cfg: &PeerConfig,
    records: u64,
    value_size: usize,
    quiet: bool,
) -> CliResult<Box<dyn PeerEngine>> {
    let engine = peers::open(name, cfg)?;
    let pb = bar(quiet, records, &format!("loading {name}"));
    let sorted = numbers_in_key_order(records);
    engine.load(
        records,
        value_size,
        hashed_load_keys(&sorted),
        &|k, buf| fill_value(k, 0, buf),
        &|d| pb.set_position(d),
    )?;
    pb.finish_and_clear();
    Ok(engine)
}

/// The file in a peer's directory naming the records it holds once YCSB
/// inserted some (absent: the load's count; [`IN_RUN`]: a run that
/// inserts did not end, and nobody knows).
pub const PEER_RECORDS: &str = "dana-ycsb-records";
const IN_RUN: &str = "in-run";

/// What a peer's directory says of the records it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordsHeld {
    /// As loaded.
    Loaded,
    /// This many (key numbers `0..n`).
    Known(u64),
    /// A run that inserts did not end: reload it.
    Unknown,
}

/// The records `name` holds past its load ([`PEER_RECORDS`]).
pub fn records_held(name: &str, cfg: &PeerConfig) -> CliResult<RecordsHeld> {
    let path = cfg.dir.join(name).join(PEER_RECORDS);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim() == IN_RUN => Ok(RecordsHeld::Unknown),
        Ok(t) => t
            .trim()
            .parse::<u64>()
            .map(RecordsHeld::Known)
            .map_err(|_| CliError(format!("{}: not a record count", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RecordsHeld::Loaded),
        Err(e) => Err(CliError(format!("reading {}: {e}", path.display()))),
    }
}

/// Records that `name` holds `records` now, or (None) that a run which
/// may insert is under way ([`PEER_RECORDS`]).
pub fn note_records_held(name: &str, cfg: &PeerConfig, records: Option<u64>) -> CliResult<()> {
    let path = cfg.dir.join(name).join(PEER_RECORDS);
    let text = records.map_or(IN_RUN.to_string(), |n| n.to_string());
    std::fs::write(&path, format!("{text}\n"))
        .map_err(|e| CliError(format!("writing {}: {e}", path.display())))
}

fn execute(
    engine: &dyn PeerEngine,
    op: Op,
    value_size: usize,
    out: &mut Vec<u8>,
    buf: &mut [u8],
    salt: u8,
    shared: &Shared,
) -> Result<(), String> {
    let key = key_of;
    match op {
        Op::Read(k) => match engine.get(&key(k), out) {
            Ok(true) if value_ok(k, value_size, out) => Ok(()),
            Ok(true) => Err(format!("read {k}: wrong value")),
            Ok(false) => Err(format!("read {k}: missing")),
            Err(e) => Err(format!("read {k}: {e}")),
        },
        Op::Update(k) => {
            fill_value(k, salt, buf);
            engine
                .put(&key(k), buf)
                .map_err(|e| format!("update {k}: {e}"))
        }
        Op::Insert(k) => {
            fill_value(k, 0, buf);
            let r = engine.put(&key(k), buf);
            shared.counter.acknowledge(k);
            r.map_err(|e| format!("insert {k}: {e}"))
        }
        Op::Scan(k, len) => match engine.scan(&key(k), len) {
            Ok(0) => Err(format!("scan {k}: no records")),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("scan {k}: {e}")),
        },
        Op::Rmw(k) => match engine.get(&key(k), out) {
            Ok(true) => {
                let v = if value_ok(k, value_size, out) {
                    modify(out)
                } else {
                    out.clone()
                };
                engine.put(&key(k), &v).map_err(|e| format!("rmw {k}: {e}"))
            }
            Ok(false) => Err(format!("rmw {k}: missing")),
            Err(e) => Err(format!("rmw {k}: {e}")),
        },
    }
}

/// Runs workload `w` on `engine` for `warmup + window`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    engine: &dyn PeerEngine,
    w: Workload,
    records: u64,
    value_size: usize,
    threads: usize,
    cache_bytes: u64,
    warmup: Duration,
    window: Duration,
    disk: Option<&Disk>,
    quiet: bool,
) -> CliResult<PeerYcsbRun> {
    let shared = Shared::new(w, records);
    let state = RunState::default();
    let lat: [Histogram; 5] = Default::default();
    let seq = AtomicU64::new(0);
    let (secs, ops, cpu, d, snaps) = std::thread::scope(|s| {
        for t in 0..threads {
            let (shared, state, lat, seq) = (&shared, &state, &lat, &seq);
            s.spawn(move || {
                let mut gen =
                    shared.op_gen(0xA11CE + t as u64 + seq.fetch_add(1, Ordering::Relaxed));
                let (mut out, mut buf) = (Vec::new(), vec![0u8; value_size]);
                while !state.stop.load(Ordering::Relaxed) {
                    let op = gen.next_op();
                    let salt = gen.salt();
                    let kind = op.kind();
                    let t0 = Instant::now();
                    let r = execute(engine, op, value_size, &mut out, &mut buf, salt, shared);
                    lat[kind as usize].record(t0.elapsed());
                    if let Err(e) = r {
                        state.fail(e);
                    }
                    state.ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let pb = bar(
            quiet,
            (warmup + window).as_millis() as u64,
            &format!("{} {}", engine.name(), w.letter()),
        );
        std::thread::sleep(warmup);
        let base: [HistogramSnapshot; 5] = std::array::from_fn(|i| lat[i].snapshot());
        let (o0, c0, d0, t0) = (
            state.ops.load(Ordering::Relaxed),
            process_cpu_seconds(),
            disk.and_then(Disk::read),
            Instant::now(),
        );
        while t0.elapsed() < window {
            std::thread::sleep(Duration::from_millis(200));
            pb.set_position((warmup + t0.elapsed()).as_millis() as u64);
        }
        let secs = t0.elapsed().as_secs_f64();
        let ops = state.ops.load(Ordering::Relaxed) - o0;
        let cpu = process_cpu_seconds() - c0;
        let d = match (disk.and_then(Disk::read), d0) {
            (Some(e), Some(s)) => Some(e.since(&s)),
            _ => None,
        };
        let snaps: Vec<HistogramSnapshot> =
            (0..5).map(|i| lat[i].snapshot().since(&base[i])).collect();
        state.stop.store(true, Ordering::Relaxed);
        pb.finish_and_clear();
        (secs, ops, cpu, d, snaps)
    });
    if ops == 0 {
        return Err(CliError(format!(
            "{}: no operation finished in the window",
            engine.name()
        )));
    }
    Ok(PeerYcsbRun {
        engine: engine.name().to_string(),
        workload: w,
        caveat: engine.caveat(),
        cache_bytes,
        threads,
        ops_per_s: ops as f64 / secs,
        errors: state.errors.load(Ordering::Relaxed),
        per_kind: KINDS
            .iter()
            .filter(|(_, k)| snaps[*k as usize].count > 0)
            .map(|(n, k)| {
                (
                    n.to_string(),
                    snaps[*k as usize].count,
                    Latency::from(&snaps[*k as usize]),
                )
            })
            .collect(),
        disk_reads_per_s: d.map(|d| d.reads as f64 / secs),
        disk_writes_per_op: d.map(|d| d.writes as f64 / ops as f64),
        disk_write_bytes_per_op: d.map(|d| d.write_bytes as f64 / ops as f64),
        durability: dana::Durability::Off,
        records_after: shared.counter.issued(),
        rss_added_bytes: 0,
        cpu_us_per_op: cpu * 1e6 / ops as f64,
        dana_over_peer: None,
        best: false,
    })
}
