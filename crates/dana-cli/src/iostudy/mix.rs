//! The HTAP I/O mix of one configuration: scan, point reads, background
//! writes and WAL, each class on its own thread(s), all at once.
//!
//! - scan: random page reads, `scan_depth` in flight, refilled in batches
//!   of `scan_batch`; async backends: one thread with one queue per device;
//!   blocking: `scan_threads` threads, each one pread at a time.
//! - point read: one random page read at a time; latency histogram.
//! - background write: random page writes, one at a time, paced.
//! - WAL: sequential page writes to the WAL file, each followed by
//!   fdatasync when the row asks for it, paced.
//!
//! Bytes are counted only for I/Os that complete before the stop flag is
//! raised, so that every class is measured over the same window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::io::array::open_queue;
use dana::io::device::DeviceOptions;
use dana::io::uring::UringOptions;
use dana::io::{AlignedBuf, Array, Backend, Completion, Device, IoBuf, IoQueue, Request, Target};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::data::DataSet;
use crate::pace::Pacer;
use crate::report::process_cpu_seconds;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

/// Which I/O interface a row uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Interface {
    /// pread/pwrite/fdatasync; the scan uses many threads.
    Blocking,
    /// io_uring from one thread per class.
    Uring,
    /// io_uring with a kernel SQ polling thread for the scan's rings.
    UringSqpoll,
}

impl Interface {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Interface::Blocking => "pread/pwrite",
            Interface::Uring => "io_uring",
            Interface::UringSqpoll => "io_uring+SQPOLL",
        }
    }
}

/// One configuration of the I/O stack.
#[derive(Debug, Clone)]
pub struct MixConfig {
    /// Which sweep the row belongs to.
    pub sweep: &'static str,
    /// Row id ("1".."5", "4KiB", "w2", ...).
    pub id: String,
    /// What the row changes.
    pub label: String,
    /// I/O interface.
    pub interface: Interface,
    /// O_DIRECT (true) or the OS page cache.
    pub direct: bool,
    /// fdatasync after every WAL write.
    pub wal_fsync: bool,
    /// Page size in bytes.
    pub page_size: u64,
    /// Number of data devices striped over.
    pub width: usize,
}

/// Knobs shared by every row.
#[derive(Debug, Clone)]
pub struct MixParams {
    /// Measured window.
    pub duration: Duration,
    /// Scan requests in flight (async interfaces).
    pub scan_depth: u32,
    /// Scan refill batch.
    pub scan_batch: u32,
    /// Scan threads for the blocking interface.
    pub scan_threads: usize,
    /// Background write target, bytes/s (0 = off).
    pub bg_write_bytes_per_sec: f64,
    /// WAL target, bytes/s (0 = off).
    pub wal_bytes_per_sec: f64,
    /// CPU clock for cycles/byte.
    pub cpu_hz: f64,
}

/// The measured result of one row.
#[derive(Debug, Clone, Serialize)]
pub struct MixRow {
    pub sweep: String,
    pub id: String,
    pub label: String,
    pub interface: Interface,
    pub page_cache: bool,
    pub wal_fsync: bool,
    pub page_size: u64,
    pub width: usize,
    pub scan_threads: usize,
    pub seconds: f64,
    pub scan_bytes: u64,
    pub point_bytes: u64,
    pub bg_write_bytes: u64,
    pub wal_bytes: u64,
    pub scan_mbps: f64,
    pub point_mbps: f64,
    pub bg_write_mbps: f64,
    pub wal_mbps: f64,
    pub total_mbps: f64,
    /// Reads + writes per second (fdatasyncs not counted).
    pub iops: f64,
    pub point_reads: u64,
    pub point_p50_us: f64,
    pub point_p99_us: f64,
    pub point_mean_us: f64,
    pub wal_writes: u64,
    /// Mean time of one WAL write plus its fdatasync.
    pub wal_mean_us: f64,
    pub cpu_seconds: f64,
    pub cycles_per_byte: f64,
}

/// What one class thread measured.
#[derive(Default)]
struct ClassStats {
    bytes: u64,
    ops: u64,
    lat: Option<Histogram<u64>>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

fn rejected(r: dana::io::Rejected) -> CliError {
    CliError(r.error.to_string())
}

/// Pushes one request, waits for its completion and returns it.
fn one(q: &mut dyn IoQueue, req: Request, out: &mut Vec<Completion>) -> CliResult<Completion> {
    q.push(req).map_err(rejected)?;
    loop {
        q.wait(1, None)?;
        if q.reap(out) > 0 {
            return out.pop().ok_or_else(|| CliError("lost completion".into()));
        }
    }
}

fn take_buf(c: Completion, what: &str) -> CliResult<AlignedBuf> {
    c.result.context(what)?;
    c.buf
        .and_then(IoBuf::into_owned)
        .ok_or_else(|| CliError(format!("{what}: buffer not handed back")))
}

fn page_buf(page_size: u64, seed: u64) -> CliResult<AlignedBuf> {
    let mut b = AlignedBuf::new(page_size as usize, 4096)?;
    let mut rng = XorShift::new(seed);
    for w in b.chunks_exact_mut(8) {
        w.copy_from_slice(&(rng.next_u64() | 1).to_le_bytes());
    }
    Ok(b)
}

struct Shared<'a> {
    array: &'a Array,
    pages: u64,
    stop: &'a AtomicBool,
    progress: &'a AtomicU64,
}

impl Shared<'_> {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }
    fn count(&self, stats: &mut ClassStats, bytes: u64) {
        if self.running() {
            stats.bytes += bytes;
            stats.ops += 1;
            self.progress.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

fn queues(array: &Array, backend: &Backend, depth: u32) -> CliResult<Vec<Box<dyn IoQueue>>> {
    Ok(array.open_queues(backend, depth)?)
}

/// The scan from one thread over async queues.
fn scan_async(
    s: &Shared,
    backend: Backend,
    depth: u32,
    batch: u32,
    seed: u64,
) -> CliResult<ClassStats> {
    let page = s.array.page_size();
    let mut qs = queues(s.array, &backend, depth)?;
    let mut free: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::new(page as usize, 4096))
        .collect::<Result<_, _>>()?;
    let mut rng = XorShift::new(seed);
    let mut stats = ClassStats::default();
    let mut out = Vec::with_capacity(depth as usize);
    let mut in_flight = 0u32;
    let batch = batch.clamp(1, depth);
    loop {
        let running = s.running();
        if running && depth - in_flight >= batch {
            for _ in 0..batch {
                let (d, off) = s.array.locate(rng.below(s.pages));
                let buf = free
                    .pop()
                    .ok_or_else(|| CliError("scan: no free buffer".into()))?;
                qs[d]
                    .push(Request::read(0, off, IoBuf::owned(buf)))
                    .map_err(rejected)?;
            }
            in_flight += batch;
            for q in qs.iter_mut() {
                q.submit()?;
            }
            continue;
        }
        if in_flight == 0 {
            break;
        }
        let mut got = 0;
        for q in qs.iter_mut() {
            got += q.reap(&mut out);
        }
        if got == 0 {
            if qs.len() == 1 {
                qs[0].wait(1, None)?;
            } else if let Some(q) = qs.iter_mut().max_by_key(|q| q.in_flight()) {
                q.wait(1, Some(Duration::from_micros(200)))?;
            }
        }
        for c in out.drain(..) {
            in_flight -= 1;
            s.count(&mut stats, page);
            free.push(take_buf(c, "scan read")?);
        }
    }
    Ok(stats)
}

/// One blocking scan thread: one pread at a time.
fn scan_blocking(s: &Shared, seed: u64) -> CliResult<ClassStats> {
    let page = s.array.page_size();
    let mut qs = queues(s.array, &Backend::Blocking, 1)?;
    let mut buf = AlignedBuf::new(page as usize, 4096)?;
    let mut rng = XorShift::new(seed);
    let mut stats = ClassStats::default();
    let mut out = Vec::with_capacity(1);
    while s.running() {
        let (d, off) = s.array.locate(rng.below(s.pages));
        let c = one(
            qs[d].as_mut(),
            Request::read(0, off, IoBuf::owned(buf)),
            &mut out,
        )?;
        buf = take_buf(c, "scan read")?;
        s.count(&mut stats, page);
    }
    Ok(stats)
}

/// Point reads: one at a time, latency recorded in ns.
fn point_reads(s: &Shared, backend: Backend, seed: u64) -> CliResult<ClassStats> {
    let page = s.array.page_size();
    let mut qs = queues(s.array, &backend, 1)?;
    let mut buf = AlignedBuf::new(page as usize, 4096)?;
    let mut rng = XorShift::new(seed);
    let mut stats = ClassStats {
        lat: Some(histogram()),
        ..Default::default()
    };
    let mut out = Vec::with_capacity(1);
    while s.running() {
        let (d, off) = s.array.locate(rng.below(s.pages));
        let t = Instant::now();
        let c = one(
            qs[d].as_mut(),
            Request::read(0, off, IoBuf::owned(buf)),
            &mut out,
        )?;
        let ns = t.elapsed().as_nanos() as u64;
        buf = take_buf(c, "point read")?;
        if s.running() {
            if let Some(h) = stats.lat.as_mut() {
                h.saturating_record(ns.max(1));
            }
        }
        s.count(&mut stats, page);
    }
    Ok(stats)
}

/// Sleeps until the pacer allows more (at most 20 ms at a time, to see the
/// stop flag). Returns false when the run is over.
fn pace(s: &Shared, pacer: &Pacer, sent: u64) -> bool {
    loop {
        if !s.running() {
            return false;
        }
        let d = pacer.delay(sent, Instant::now());
        if d.is_zero() {
            return true;
        }
        std::thread::sleep(d.min(Duration::from_millis(20)));
    }
}

/// Background writer: random page writes at a target rate.
fn bg_writes(s: &Shared, backend: Backend, rate: f64, seed: u64) -> CliResult<ClassStats> {
    let page = s.array.page_size();
    let mut qs = queues(s.array, &backend, 1)?;
    let mut buf = page_buf(page, seed)?;
    let mut rng = XorShift::new(seed);
    let mut stats = ClassStats::default();
    let mut out = Vec::with_capacity(1);
    let pacer = Pacer::new(rate, Instant::now());
    let mut sent = 0;
    while pace(s, &pacer, sent) {
        let (d, off) = s.array.locate(rng.below(s.pages));
        let c = one(
            qs[d].as_mut(),
            Request::write(0, off, IoBuf::owned(buf)),
            &mut out,
        )?;
        buf = take_buf(c, "background write")?;
        sent += page;
        s.count(&mut stats, page);
    }
    Ok(stats)
}

/// WAL writer: sequential page writes, each followed by fdatasync if asked.
#[allow(clippy::too_many_arguments)]
fn wal_writes(
    s: &Shared,
    wal: &Arc<Device>,
    backend: Backend,
    page: u64,
    fsync: bool,
    rate: f64,
    seed: u64,
) -> CliResult<ClassStats> {
    let mut q = open_queue(&Target::File(wal.clone()), &backend, 2)?;
    let mut buf = page_buf(page, seed)?;
    let mut stats = ClassStats {
        lat: Some(histogram()),
        ..Default::default()
    };
    let mut out = Vec::with_capacity(1);
    let pacer = Pacer::new(rate, Instant::now());
    let slots = (wal.size() / page).max(1);
    let mut sent = 0;
    let mut n = 0u64;
    while pace(s, &pacer, sent) {
        let off = (n % slots) * page;
        n += 1;
        let t = Instant::now();
        let c = one(
            q.as_mut(),
            Request::write(0, off, IoBuf::owned(buf)),
            &mut out,
        )?;
        buf = take_buf(c, "WAL write")?;
        if fsync {
            let c = one(q.as_mut(), Request::flush(0), &mut out)?;
            c.result.context("WAL fdatasync")?;
        }
        let ns = t.elapsed().as_nanos() as u64;
        if s.running() {
            if let Some(h) = stats.lat.as_mut() {
                h.saturating_record(ns.max(1));
            }
        }
        sent += page;
        s.count(&mut stats, page);
    }
    Ok(stats)
}

/// Runs one configuration for `params.duration` and measures it.
/// `tick` is called about every 100 ms with (elapsed, bytes so far).
pub fn run_mix(
    cfg: &MixConfig,
    data: &DataSet,
    params: &MixParams,
    tick: &dyn Fn(Duration, u64),
) -> CliResult<MixRow> {
    let width = cfg.width.min(data.devices.len()).max(1);
    let opts = DeviceOptions {
        direct: cfg.direct,
        create_size: None,
        read_only: false,
        lock: false,
    };
    let targets = data.devices[..width]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Device::open(p, i, opts)
                .map(|d| Target::File(Arc::new(d)))
                .context(format!("row {}", cfg.id))
        })
        .collect::<CliResult<Vec<_>>>()?;
    let array = Array::new(targets, cfg.page_size)?;
    let pages = array
        .pages()
        .min(data.filled_bytes / cfg.page_size * width as u64);
    if pages == 0 {
        return Err(CliError(format!(
            "row {}: the data holds no whole page of {} bytes",
            cfg.id, cfg.page_size
        )));
    }
    let wal = Arc::new(Device::open(
        &data.wal,
        width,
        DeviceOptions {
            direct: cfg.direct,
            create_size: Some(data.wal_bytes),
            read_only: false,
            lock: false,
        },
    )?);

    let uring = Backend::Uring(UringOptions::default());
    let (class_backend, scan_backend) = match cfg.interface {
        Interface::Blocking => (Backend::Blocking, Backend::Blocking),
        Interface::Uring => (uring, uring),
        Interface::UringSqpoll => (
            uring,
            Backend::Uring(UringOptions {
                sqpoll: true,
                ..UringOptions::default()
            }),
        ),
    };
    let scan_threads = if cfg.interface == Interface::Blocking {
        params.scan_threads.max(1)
    } else {
        1
    };

    let stop = AtomicBool::new(false);
    let progress = AtomicU64::new(0);
    let shared = Shared {
        array: &array,
        pages,
        stop: &stop,
        progress: &progress,
    };
    let s = &shared;
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    let (scan, point, bg, walst, elapsed, cpu) = std::thread::scope(|scope| {
        let scans: Vec<_> = (0..scan_threads)
            .map(|i| {
                let seed = 1000 + i as u64;
                std::thread::Builder::new()
                    .name(format!("scan-{i}"))
                    .stack_size(256 << 10)
                    .spawn_scoped(scope, move || {
                        if cfg.interface == Interface::Blocking {
                            scan_blocking(s, seed)
                        } else {
                            scan_async(s, scan_backend, params.scan_depth, params.scan_batch, seed)
                        }
                    })
            })
            .collect();
        let point = scope.spawn(move || point_reads(s, class_backend, 7));
        let bg = (params.bg_write_bytes_per_sec > 0.0).then(|| {
            scope.spawn(move || bg_writes(s, class_backend, params.bg_write_bytes_per_sec, 11))
        });
        let walh = (params.wal_bytes_per_sec > 0.0).then(|| {
            let wal = &wal;
            scope.spawn(move || {
                wal_writes(
                    s,
                    wal,
                    class_backend,
                    cfg.page_size,
                    cfg.wal_fsync,
                    params.wal_bytes_per_sec,
                    13,
                )
            })
        });
        // Measure until the duration has passed or a class failed.
        let failed = |h: &std::thread::ScopedJoinHandle<'_, CliResult<ClassStats>>| h.is_finished();
        loop {
            let el = t0.elapsed();
            tick(el, progress.load(Ordering::Relaxed));
            if el >= params.duration || failed(&point) {
                break;
            }
            std::thread::sleep((params.duration - el).min(Duration::from_millis(100)));
        }
        stop.store(true, Ordering::SeqCst);
        let elapsed = t0.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds() - cpu0;
        let join = |h: std::thread::ScopedJoinHandle<'_, CliResult<ClassStats>>, what: &str| {
            h.join()
                .map_err(|_| CliError(format!("{what} thread panicked")))?
        };
        let mut scan = ClassStats::default();
        let mut first_err = None;
        for h in scans {
            match h
                .context("spawning a scan thread")
                .and_then(|h| join(h, "scan"))
            {
                Ok(st) => {
                    scan.bytes += st.bytes;
                    scan.ops += st.ops;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let point = join(point, "point read");
        let bg = bg.map(|h| join(h, "background write")).transpose();
        let walst = walh.map(|h| join(h, "WAL")).transpose();
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok((
            scan,
            point?,
            bg?.unwrap_or_default(),
            walst?.unwrap_or_default(),
            elapsed,
            cpu,
        ))
    })?;
    // Leave written pages durable and out of the next row's way.
    for t in array.targets() {
        let Target::File(d) = t else { continue };
        d.sync()?;
    }
    wal.sync()?;

    let mb = |b: u64| b as f64 / 1e6 / elapsed;
    let total = scan.bytes + point.bytes + bg.bytes + walst.bytes;
    let q = |h: &Option<Histogram<u64>>, p: f64| {
        h.as_ref()
            .map_or(0.0, |h| h.value_at_quantile(p) as f64 / 1e3)
    };
    let mean = |h: &Option<Histogram<u64>>| h.as_ref().map_or(0.0, |h| h.mean() / 1e3);
    Ok(MixRow {
        sweep: cfg.sweep.into(),
        id: cfg.id.clone(),
        label: cfg.label.clone(),
        interface: cfg.interface,
        page_cache: !cfg.direct,
        wal_fsync: cfg.wal_fsync,
        page_size: cfg.page_size,
        width,
        scan_threads,
        seconds: elapsed,
        scan_bytes: scan.bytes,
        point_bytes: point.bytes,
        bg_write_bytes: bg.bytes,
        wal_bytes: walst.bytes,
        scan_mbps: mb(scan.bytes),
        point_mbps: mb(point.bytes),
        bg_write_mbps: mb(bg.bytes),
        wal_mbps: mb(walst.bytes),
        total_mbps: mb(total),
        iops: (scan.ops + point.ops + bg.ops + walst.ops) as f64 / elapsed,
        point_reads: point.ops,
        point_p50_us: q(&point.lat, 0.5),
        point_p99_us: q(&point.lat, 0.99),
        point_mean_us: mean(&point.lat),
        wal_writes: walst.ops,
        wal_mean_us: mean(&walst.lat),
        cpu_seconds: cpu,
        cycles_per_byte: if total > 0 {
            cpu * params.cpu_hz / total as f64
        } else {
            0.0
        },
    })
}
