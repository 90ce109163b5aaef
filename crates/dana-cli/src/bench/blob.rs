//! `dana bench blob`: large values written and read through the engine,
//! next to the device's own limits for the same access shape, measured in
//! the same invocation on the same file system.
//!
//! Owns: for each value size, four measurements. (1) Raw writes: each
//! client writes a value's bytes with O_DIRECT into a fresh, preallocated
//! file in pieces of at most 1 MiB, 8 in flight, then `fdatasync`s the
//! file, then writes 4 KiB to a log file and `fdatasync`s it: the syncs a
//! durable large-value commit needs (data before the commit record, then
//! the record). (2) dana: the same number of client tasks inserting one
//! value per commit with `Sync` durability; then, untimed, more values in
//! transactions of many values until the data is several times the pool.
//! (3) dana: the clients read random values whole into their own buffers
//! (`read_value_async`), each checked. (4) Raw reads of the same shape over
//! dana's own data file (blocks that were written): 4 KiB values as 4 KiB
//! random reads at the engine's device budget; larger ones as value-sized
//! reads at random value-aligned offsets, 1 MiB pieces, 8 in flight per
//! client. Never: reports a figure it did not measure in this invocation.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use dana::io::array::open_queue;
use dana::io::device::DeviceOptions;
use dana::io::uring::UringOptions;
use dana::io::{AlignedBuf, Backend, Device, IoBuf, Request, Target};
use dana::{Db, Durability, Options};
use serde::Serialize;

use super::diskstats::{Disk, DiskCounters};
use super::{data_files, device_limit};
use crate::iostudy::reads::Submit;
use crate::report::{num, process_cpu_seconds, Machine, Table};
use crate::{CliError, CliResult, Context};

/// Largest piece of one I/O, raw and in the engine.
const PIECE: u64 = 1 << 20;
/// Pieces in flight per client, raw and in the engine.
const DEPTH: usize = 8;

/// Arguments of `dana bench blob`.
#[derive(Args, Debug, Clone)]
pub struct BlobArgs {
    /// Directory for the database and the raw files (recreated).
    #[arg(long, default_value = "dana-data/blob")]
    pub path: PathBuf,
    /// Value sizes (bytes, or with a KiB/MiB/GiB suffix).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,64MiB", value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Seconds of each timed phase (two writes, two reads per size).
    #[arg(long, default_value_t = 4.0, value_parser = crate::bench::parse_window)]
    pub seconds: f64,
    /// Most bytes a timed write phase writes.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Buffer pool bytes (the data read is at least `--data-factor` times
    /// this).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    pub pool_bytes: u64,
    /// The data read is at least this many times the pool.
    #[arg(long, default_value_t = 4.0)]
    pub data_factor: f64,
    /// Concurrent clients per size (default: the device budget for
    /// values under 64 KiB, 8 under 8 MiB, else 1).
    #[arg(long, value_parser = crate::bench::parse_clients)]
    pub clients: Option<usize>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Most engine reads in flight per device, and the depth of the raw
    /// 4 KiB random reads.
    #[arg(long, default_value_t = 32)]
    pub device_budget: usize,
    /// The engine's log (the raw loop always syncs as `sync` does).
    #[arg(long, default_value = "sync", value_parser = super::parse_durability)]
    pub durability: Durability,
    /// Small and short: values up to 1 MiB, 1 s phases, 64 MiB per write
    /// phase, an 8 MiB pool.
    #[arg(long)]
    pub quick: bool,
    /// Output settings.
    #[command(flatten)]
    pub output: super::OutputArgs,
}

/// Parses `4096`, `4KiB`, `64MiB`, `1GiB` (also `K`, `M`, `G`, `KB`...:
/// powers of two).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a size (like 4096, 64KiB, 1MiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (B, KiB, MiB, GiB)")),
    };
    n.checked_shl(shift)
        .filter(|v| v >> shift == n && *v > 0)
        .ok_or_else(|| format!("{s:?} is zero or too large"))
}

impl BlobArgs {
    fn effective(&self) -> BlobArgs {
        let mut a = self.clone();
        if a.quick {
            a.sizes.retain(|&s| s <= 1 << 20);
            if a.sizes.is_empty() {
                a.sizes = vec![4096];
            }
            a.seconds = a.seconds.min(1.0);
            a.max_bytes = a.max_bytes.min(64 << 20);
            a.pool_bytes = a.pool_bytes.min(8 << 20);
        }
        a
    }

    fn clients_for(&self, size: u64) -> usize {
        self.clients.unwrap_or(if size < 64 << 10 {
            self.device_budget.max(1)
        } else if size < 8 << 20 {
            8
        } else {
            1
        })
    }
}

/// One timed phase, raw or through the engine.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Phase {
    /// Values written or read.
    pub values: u64,
    /// Seconds the phase ran.
    pub seconds: f64,
    /// Values per second.
    pub values_per_s: f64,
    /// MB/s of value bytes (10^6 bytes).
    pub mb_per_s: f64,
    /// Process CPU µs per MB of value bytes.
    pub cpu_us_per_mb: f64,
    /// Block-device requests per value (/proc/diskstats; all I/O of the
    /// machine's disk, the log's included), when readable.
    pub disk_ios_per_value: Option<f64>,
    /// Engine I/Os of value bytes per value (engine phases only).
    pub engine_ios_per_value: Option<f64>,
    /// Data-file syncs per value (engine phases only).
    pub data_syncs_per_value: Option<f64>,
    /// Log flushes (fdatasync) per value (engine phases only).
    pub log_flushes_per_value: Option<f64>,
}

/// The four phases of one value size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    /// Value bytes.
    pub value_bytes: u64,
    /// Concurrent clients.
    pub clients: usize,
    /// Raw writes (bytes, data sync, log write, log sync per value).
    pub raw_write: Phase,
    /// dana, one value per commit.
    pub dana_write: Phase,
    /// dana write MB/s over raw write MB/s.
    pub write_ratio: f64,
    /// Bytes of values in the database when the reads ran.
    pub data_bytes: u64,
    /// dana, whole values into the client's buffer.
    pub dana_read: Phase,
    /// Raw reads of the same shape over dana's data file.
    pub raw_read: Phase,
    /// dana read MB/s over raw read MB/s.
    pub read_ratio: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BlobReport {
    /// Machine facts.
    pub machine: Machine,
    /// Buffer pool bytes.
    pub pool_bytes: u64,
    /// Worker threads.
    pub workers: usize,
    /// Engine device budget (and raw 4 KiB read depth).
    pub device_budget: usize,
    /// Durability of the engine's commits.
    pub durability: String,
    /// One entry per value size.
    pub sizes: Vec<SizeReport>,
}

/// Counters taken at the start and end of a phase.
struct Mark {
    at: Instant,
    cpu: f64,
    disk: Option<DiskCounters>,
    engine: Option<(dana::buffer::PoolStatsSnapshot, u64)>,
}

impl Mark {
    fn take(disk: Option<&Disk>, db: Option<&Db>) -> Mark {
        Mark {
            at: Instant::now(),
            cpu: process_cpu_seconds(),
            disk: disk.and_then(Disk::read),
            engine: db.map(|d| (d.pool_stats(), d.wal_stats().map_or(0, |w| w.flushes))),
        }
    }

    /// The phase from `self` to `end`, in which `values` values of `size`
    /// bytes moved; `write` picks the direction of the counters.
    fn phase(&self, end: &Mark, values: u64, size: u64, write: bool) -> Phase {
        let secs = (end.at - self.at).as_secs_f64().max(1e-9);
        let mb = (values * size) as f64 / 1e6;
        let per = |x: u64| {
            if values > 0 {
                x as f64 / values as f64
            } else {
                0.0
            }
        };
        let disk = match (&end.disk, &self.disk) {
            (Some(e), Some(s)) => {
                let d = e.since(s);
                Some(per(if write { d.writes } else { d.reads }))
            }
            _ => None,
        };
        let engine = match (&end.engine, &self.engine) {
            (Some((e, ef)), Some((s, sf))) => Some((
                per(if write {
                    e.blob_writes - s.blob_writes
                } else {
                    e.blob_reads - s.blob_reads
                }),
                per(e.device_syncs - s.device_syncs),
                per(ef - sf),
            )),
            _ => None,
        };
        Phase {
            values,
            seconds: secs,
            values_per_s: values as f64 / secs,
            mb_per_s: mb / secs,
            cpu_us_per_mb: if mb > 0.0 {
                (end.cpu - self.cpu) * 1e6 / mb
            } else {
                0.0
            },
            disk_ios_per_value: disk,
            engine_ios_per_value: engine.map(|e| e.0),
            data_syncs_per_value: engine.map(|e| e.1),
            log_flushes_per_value: engine.map(|e| e.2),
        }
    }
}

/// The bytes of value `k` (its number in the first 8 bytes, then a fill
/// that differs per value).
fn fill_value(buf: &mut [u8], k: u64) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&k.to_le_bytes()[..n]);
    let b = (k as u8) | 1;
    for (i, x) in buf.iter_mut().enumerate().skip(8).step_by(512) {
        *x = b.wrapping_add(i as u8);
    }
}

/// Checks what [`fill_value`] wrote for value `k`: the number and every
/// filled byte.
fn check_value(buf: &[u8], k: u64) -> bool {
    let n = buf.len().min(8);
    let b = (k as u8) | 1;
    buf[..n] == k.to_le_bytes()[..n]
        && buf
            .iter()
            .enumerate()
            .skip(8)
            .step_by(512)
            .all(|(i, &x)| x == b.wrapping_add(i as u8))
}

/// A well-mixed number from a counter (splitmix64): random value numbers
/// for any number of clients without per-client state.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs `clients` threads, each doing `op(client)` until it returns
/// `Ok(false)` or time is up; returns the values done.
fn raw_clients(
    clients: usize,
    end: Instant,
    op: &(dyn Fn(usize, &mut RawClient) -> CliResult<bool> + Sync),
    dev: &Arc<Device>,
    size: u64,
) -> CliResult<u64> {
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let done = &done;
                s.spawn(move || -> CliResult<()> {
                    let mut client = RawClient::new(dev, size)?;
                    while Instant::now() < end {
                        if !op(c, &mut client)? {
                            break;
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| CliError("a raw client thread panicked".into()))??;
        }
        Ok::<_, CliError>(())
    })?;
    Ok(done.load(Ordering::Relaxed))
}

/// One raw client: its own io_uring queue on the data file and buffers
/// for up to [`DEPTH`] pieces of one value.
struct RawClient {
    queue: Box<dyn dana::io::IoQueue>,
    bufs: Vec<AlignedBuf>,
    piece: u64,
    size: u64,
    out: Vec<dana::io::Completion>,
}

impl RawClient {
    fn new(dev: &Arc<Device>, size: u64) -> CliResult<RawClient> {
        let piece = size.min(PIECE).next_multiple_of(4096);
        let pieces = size.div_ceil(piece) as usize;
        let mut bufs = Vec::new();
        for i in 0..pieces.min(DEPTH) {
            let mut b = AlignedBuf::new(piece as usize, 4096)?;
            fill_value(&mut b, i as u64);
            bufs.push(b);
        }
        Ok(RawClient {
            queue: open_queue(
                &Target::File(dev.clone()),
                &Backend::Uring(UringOptions::default()),
                DEPTH as u32,
            )?,
            bufs,
            piece,
            size,
            out: Vec::new(),
        })
    }

    /// Reads or writes the value at byte `offset` of the file: its pieces
    /// with up to [`DEPTH`] in flight.
    fn value_io(&mut self, offset: u64, write: bool) -> CliResult<()> {
        let pieces = self.size.div_ceil(self.piece);
        let mut next = 0u64;
        let mut done = 0u64;
        while done < pieces {
            while next < pieces {
                let Some(buf) = self.bufs.pop() else { break };
                let at = offset + next * self.piece;
                let buf = IoBuf::owned(buf);
                let req = if write {
                    Request::write(next, at, buf)
                } else {
                    Request::read(next, at, buf)
                };
                self.queue
                    .push(req)
                    .map_err(|r| CliError(r.error.to_string()))?;
                next += 1;
            }
            self.queue.wait(1, None)?;
            self.queue.reap(&mut self.out);
            for c in self.out.drain(..) {
                c.result
                    .map_err(|e| CliError(e.to_string()))
                    .context(if write { "raw write" } else { "raw read" })?;
                self.bufs.push(
                    c.buf
                        .and_then(IoBuf::into_owned)
                        .ok_or_else(|| CliError("buffer not handed back".into()))?,
                );
                done += 1;
            }
        }
        Ok(())
    }
}

/// Raw writes for `secs`: values at consecutive value-aligned offsets of
/// a fresh preallocated file, each followed by a data sync and a synced
/// 4 KiB log write. Returns the phase.
fn raw_write(
    dir: &Path,
    size: u64,
    clients: usize,
    a: &BlobArgs,
    disk: Option<&Disk>,
) -> CliResult<Phase> {
    let slot = size.next_multiple_of(4096);
    let slots = (a.max_bytes / slot).max(clients as u64);
    let data_path = dir.join("raw-data");
    let log_path = dir.join("raw-log");
    let dev = Arc::new(Device::open(
        &data_path,
        0,
        DeviceOptions {
            direct: true,
            create_size: Some(slots * slot),
            read_only: false,
            lock: false,
        },
    )?);
    // The log file is written with zeros first, like dana's log, so its
    // syncs are plain overwrites.
    std::fs::write(&log_path, vec![0u8; clients * 4096])
        .context(format!("writing {}", log_path.display()))?;
    let log = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&log_path)
        .context(format!("opening {}", log_path.display()))?;
    log.sync_all().context("syncing the raw log")?;
    let next = AtomicU64::new(0);
    let op = |c: usize, client: &mut RawClient| -> CliResult<bool> {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= slots {
            return Ok(false);
        }
        client.value_io(k * slot, true)?;
        dev.sync()?;
        let rec = &client.bufs[0][..4096];
        log.write_all_at(rec, c as u64 * 4096)
            .context("raw log write")?;
        log.sync_data().context("raw log fdatasync")?;
        Ok(true)
    };
    let start = Mark::take(disk, None);
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let values = raw_clients(clients, end, &op, &dev, size)?;
    let stop = Mark::take(disk, None);
    drop(dev);
    let _ = std::fs::remove_file(&data_path);
    let _ = std::fs::remove_file(&log_path);
    Ok(start.phase(&stop, values, size, true))
}

/// Raw reads of the same shape as the engine's over the first `span`
/// bytes of dana's data files (written blocks only).
fn raw_read(
    files: &[PathBuf],
    span: u64,
    size: u64,
    clients: usize,
    a: &BlobArgs,
    disk: Option<&Disk>,
) -> CliResult<Phase> {
    let secs = Duration::from_secs_f64(a.seconds);
    if size <= 4096 {
        let start = Mark::take(disk, None);
        let l = device_limit(files, span, a.device_budget as u32, secs, Submit::Batch)?;
        let stop = Mark::take(disk, None);
        let values = (l.iops * (stop.at - start.at).as_secs_f64()).round() as u64;
        let mut p = start.phase(&stop, values, size, false);
        p.values_per_s = l.iops;
        p.mb_per_s = l.iops * size as f64 / 1e6;
        return Ok(p);
    }
    let file = files
        .first()
        .ok_or_else(|| CliError("no data file to read".into()))?;
    let dev = Arc::new(Device::open(
        file,
        0,
        DeviceOptions {
            direct: true,
            create_size: None,
            read_only: true,
            lock: false,
        },
    )?);
    let slot = size.next_multiple_of(4096);
    let slots = (span / slot).max(1);
    let draws = AtomicU64::new(1 << 40);
    let op = |_: usize, client: &mut RawClient| -> CliResult<bool> {
        let k = mix(draws.fetch_add(1, Ordering::Relaxed)) % slots;
        client.value_io(k * slot, false)?;
        Ok(true)
    };
    let start = Mark::take(disk, None);
    let end = Instant::now() + secs;
    let values = raw_clients(clients, end, &op, &dev, size)?;
    let stop = Mark::take(disk, None);
    Ok(start.phase(&stop, values, size, false))
}

/// Runs `clients` engine tasks, each calling `op(client, value number)`
/// with the next value number until `op` returns false or `end`; returns
/// the values done and the first error.
fn engine_clients<F, Fut>(db: &Db, clients: usize, end: Instant, op: F) -> CliResult<u64>
where
    F: Fn(usize, Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = dana::Result<(bool, Vec<u8>)>> + Send + 'static,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    for c in 0..clients {
        let (op, done, stop, tx) = (op.clone(), done.clone(), stop.clone(), tx.clone());
        db.spawn(async move {
            let mut buf = Vec::new();
            let r = async {
                while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                    let (more, b) = op(c, std::mem::take(&mut buf)).await?;
                    buf = b;
                    if !more {
                        break;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, dana::Error>(())
            }
            .await;
            if r.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            let _ = tx.send(r);
        })?;
    }
    drop(tx);
    let mut first = None;
    for r in rx {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(CliError(format!("a client failed: {e}"))),
        None => Ok(done.load(Ordering::Relaxed)),
    }
}

/// Measures one value size.
fn run_size(a: &BlobArgs, size: u64, disk: Option<&Disk>) -> CliResult<SizeReport> {
    let clients = a.clients_for(size);
    let dir = a.path.join(format!("{size}"));
    super::fresh_bench_dir(&dir)?;
    let raw_write = raw_write(&dir, size, clients, a, disk)?;

    let db_dir = dir.join("db");
    let db = Db::open(
        &db_dir,
        Options::default()
            .pool_bytes(a.pool_bytes as usize)
            .workers(a.workers)
            .device_budget(a.device_budget)
            .max_tasks_per_worker(clients.max(16) * 2)
            .durability(a.durability),
    )?;
    let tree = db.create_tree("values")?;
    let max_values = (a.max_bytes / size).max(clients as u64);
    let next = Arc::new(AtomicU64::new(0));
    let start = Mark::take(disk, Some(&db));
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let written = {
        let (tree, next) = (tree.clone(), next.clone());
        engine_clients(&db, clients, end, move |_, mut buf| {
            let (tree, next) = (tree.clone(), next.clone());
            async move {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= max_values {
                    return Ok((false, buf));
                }
                buf.resize(size as usize, 0);
                fill_value(&mut buf, k);
                tree.insert_async(&k.to_be_bytes(), &buf).await?;
                Ok((true, buf))
            }
        })?
    };
    let stop = Mark::take(disk, Some(&db));
    let dana_write = start.phase(&stop, written, size, true);

    // Untimed: more values, many per commit, until the data is several
    // times the pool.
    let want = ((a.pool_bytes as f64 * a.data_factor) as u64).div_ceil(size);
    let mut values = next.load(Ordering::Relaxed).min(max_values);
    if values < want {
        let per_txn = ((4 << 20) / size).clamp(1, 256);
        let from = Arc::new(AtomicU64::new(values));
        let (tree2, from2, db2) = (tree.clone(), from.clone(), db.clone());
        engine_clients(
            &db,
            clients.min(8),
            Instant::now() + Duration::from_secs(3600),
            move |_, mut buf| {
                let (tree, from, db) = (tree2.clone(), from2.clone(), db2.clone());
                async move {
                    let k0 = from.fetch_add(per_txn, Ordering::Relaxed);
                    if k0 >= want {
                        return Ok((false, buf));
                    }
                    buf.resize(size as usize, 0);
                    let mut txn = db.begin();
                    for k in k0..(k0 + per_txn).min(want) {
                        fill_value(&mut buf, k);
                        txn.put(&tree, &k.to_be_bytes(), &buf)?;
                    }
                    txn.commit_async().await?;
                    Ok((true, buf))
                }
            },
        )?;
        values = want;
    }
    // Values 0..values all exist: check a few before timing reads.
    for k in [0, values / 2, values - 1] {
        match tree.value_len(&k.to_be_bytes())? {
            Some(n) if n == size => {}
            other => {
                return Err(CliError(format!(
                    "value {k} of {values} has length {other:?}, not {size}"
                )))
            }
        }
    }

    let bad = Arc::new(AtomicU64::new(0));
    let draws = Arc::new(AtomicU64::new(0));
    let start = Mark::take(disk, Some(&db));
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let read = {
        let (tree, bad, draws) = (tree.clone(), bad.clone(), draws.clone());
        engine_clients(&db, clients, end, move |_, mut buf| {
            let (tree, bad, draws) = (tree.clone(), bad.clone(), draws.clone());
            async move {
                buf.resize(size as usize, 0);
                let k = mix(draws.fetch_add(1, Ordering::Relaxed)) % values;
                let n = tree.read_value_async(&k.to_be_bytes(), 0, &mut buf).await?;
                if n != Some(size as usize) || !check_value(&buf, k) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                Ok((true, buf))
            }
        })?
    };
    let stop = Mark::take(disk, Some(&db));
    if bad.load(Ordering::Relaxed) > 0 {
        return Err(CliError(format!(
            "{} of {read} values read back wrong",
            bad.load(Ordering::Relaxed)
        )));
    }
    let dana_read = start.phase(&stop, read, size, false);
    let data_bytes = values * size;
    db.close()?;

    let files = data_files(&db_dir);
    let span = data_bytes.min(
        files
            .iter()
            .map(|f| f.metadata().map_or(0, |m| m.len()))
            .sum(),
    );
    let raw_read = raw_read(&files, span, size, clients, a, disk)?;
    let _ = std::fs::remove_dir_all(&dir);
    let ratio = |d: &Phase, r: &Phase| {
        if r.mb_per_s > 0.0 {
            d.mb_per_s / r.mb_per_s
        } else {
            0.0
        }
    };
    Ok(SizeReport {
        value_bytes: size,
        clients,
        write_ratio: ratio(&dana_write, &raw_write),
        raw_write,
        dana_write,
        data_bytes,
        read_ratio: ratio(&dana_read, &raw_read),
        dana_read,
        raw_read,
    })
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn opt(v: Option<f64>, d: usize) -> String {
    v.map_or("-".into(), |x| num(x, d))
}

/// Runs `dana bench blob`.
pub fn run(args: &BlobArgs) -> CliResult<()> {
    let a = args.effective();
    std::fs::create_dir_all(&a.path).context(format!("creating {}", a.path.display()))?;
    let disk = Disk::of(&a.path);
    crate::report::note_memory_backed(&a.path);
    let mut sizes = Vec::new();
    for &s in &a.sizes {
        if !a.output.quiet && !a.output.json {
            eprintln!("value size {} ...", human(s));
        }
        sizes.push(run_size(&a, s, disk.as_ref())?);
    }
    let report = BlobReport {
        machine: Machine::probe(),
        pool_bytes: a.pool_bytes,
        workers: a.workers,
        device_budget: a.device_budget,
        durability: format!("{:?}", a.durability).to_lowercase(),
        sizes,
    };
    if a.output.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError(e.to_string()))?
        );
        return Ok(());
    }
    println!(
        "dana bench blob: pool {}, {} workers, device budget {}, durability {}; \
         raw writes sync the data file and a 4 KiB log write per value",
        human(a.pool_bytes),
        a.workers,
        a.device_budget,
        report.durability
    );
    let mut t = Table::new(
        &[
            "value",
            "clients",
            "op",
            "raw MB/s",
            "dana MB/s",
            "x raw",
            "values/s",
            "disk I/Os/value",
            "engine I/Os/value",
            "data syncs/value",
            "log flushes/value",
            "CPU µs/MB raw",
            "CPU µs/MB dana",
        ],
        3,
    );
    for s in &report.sizes {
        for (op, raw, dana, ratio) in [
            ("write", &s.raw_write, &s.dana_write, s.write_ratio),
            ("read", &s.raw_read, &s.dana_read, s.read_ratio),
        ] {
            t.row(vec![
                human(s.value_bytes),
                s.clients.to_string(),
                op.into(),
                num(raw.mb_per_s, 1),
                num(dana.mb_per_s, 1),
                num(ratio, 2),
                num(dana.values_per_s, 0),
                format!(
                    "{} / {}",
                    opt(raw.disk_ios_per_value, 1),
                    opt(dana.disk_ios_per_value, 1)
                ),
                opt(dana.engine_ios_per_value, 1),
                opt(dana.data_syncs_per_value, 2),
                opt(dana.log_flushes_per_value, 2),
                num(raw.cpu_us_per_mb, 0),
                num(dana.cpu_us_per_mb, 0),
            ]);
        }
    }
    print!("{}", t.render());
    for s in &report.sizes {
        println!(
            "{}: {} of values read ({:.1}x the pool)",
            human(s.value_bytes),
            human(s.data_bytes),
            s.data_bytes as f64 / a.pool_bytes as f64
        );
    }
    println!("disk I/Os/value: raw / dana, from /proc/diskstats (the whole disk, the log's writes included)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64mib"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    #[test]
    fn value_fill_is_checked_and_tells_values_apart() {
        let mut a = vec![0u8; 10_000];
        fill_value(&mut a, 7);
        assert!(check_value(&a, 7));
        assert!(!check_value(&a, 8));
        let mut b = a.clone();
        b[8] ^= 1;
        assert!(!check_value(&b, 7));
    }
}
