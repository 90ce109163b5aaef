//! Pure random reads from one thread through one io_uring queue: the
//! queue-depth sweep and dana's side of the fio comparison.
//!
//! The loop keeps exactly `depth` requests in flight: every completion is
//! refilled at once with the same buffer, and one `wait(1)` per loop both
//! submits the refills and sleeps for the next completion (one
//! `io_uring_enter` per loop, no spinning). Offsets come from a xorshift
//! generator. Latency is push-to-reap, per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::io::array::open_queue;
use dana::io::uring::UringOptions;
use dana::io::{AlignedBuf, Backend, Device, IoBuf, Request, Target};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::report::process_cpu_seconds;
use crate::rng::XorShift;
use crate::{CliError, CliResult, Context};

/// When a read loop hands its refills to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Submit {
    /// All refills of one reap in one call.
    Batch,
    /// Each refill at once.
    Each,
}

/// What a random-read run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReadRun {
    pub depth: u32,
    pub block_bytes: u64,
    pub seconds: f64,
    pub ios: u64,
    pub iops: f64,
    pub mbps: f64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub cpu_seconds: f64,
    pub cpu_us_per_io: f64,
}

impl ReadRun {
    /// The mean of two runs (for the ABBA comparison).
    pub fn mean_with(&self, o: &ReadRun) -> ReadRun {
        let m = |a: f64, b: f64| (a + b) / 2.0;
        ReadRun {
            depth: self.depth,
            block_bytes: self.block_bytes,
            seconds: self.seconds + o.seconds,
            ios: self.ios + o.ios,
            iops: m(self.iops, o.iops),
            mbps: m(self.mbps, o.mbps),
            lat_mean_us: m(self.lat_mean_us, o.lat_mean_us),
            lat_p50_us: m(self.lat_p50_us, o.lat_p50_us),
            lat_p99_us: m(self.lat_p99_us, o.lat_p99_us),
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            cpu_us_per_io: m(self.cpu_us_per_io, o.cpu_us_per_io),
        }
    }
}

/// Reads random `block`-sized blocks from the first `span` bytes of `dev`
/// (opened with O_DIRECT) at `depth` for `duration`.
///
/// `submit` chooses when refills reach the kernel: all refills of one reap
/// in one `io_uring_enter` (the engine's pattern), or each one at once
/// (fio's default, `iodepth_batch_submit=1`). On this machine's virtio disk
/// the second gets ~8% lower device latency at depth 32, for ~30% more CPU
/// per read (docs/PERF.md).
pub fn random_reads(
    dev: &Arc<Device>,
    depth: u32,
    block: u64,
    span: u64,
    duration: Duration,
    seed: u64,
    submit: Submit,
) -> CliResult<ReadRun> {
    let blocks = span / block;
    if blocks == 0 {
        return Err(CliError(format!(
            "no whole block of {block} bytes in {span} bytes"
        )));
    }
    let depth = depth.max(1);
    let mut q = open_queue(
        &Target::File(dev.clone()),
        &Backend::Uring(UringOptions::default()),
        depth,
    )?;
    let mut rng = XorShift::new(seed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3)
        .expect("static histogram bounds are valid");
    let mut started = vec![Instant::now(); depth as usize];
    let mut out = Vec::with_capacity(depth as usize);
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    for tag in 0..depth {
        let buf = IoBuf::owned(AlignedBuf::new(block as usize, 4096)?);
        let off = rng.below(blocks) * block;
        started[tag as usize] = Instant::now();
        q.push(Request::read(tag as u64, off, buf))
            .map_err(|r| CliError(r.error.to_string()))?;
    }
    let end = t0 + duration;
    let mut ios = 0u64;
    let mut measuring = true;
    let mut stopped = (0.0, 0.0);
    loop {
        q.wait(1, None)?;
        q.reap(&mut out);
        let now = Instant::now();
        if measuring && now >= end {
            measuring = false;
            stopped = ((now - t0).as_secs_f64(), process_cpu_seconds() - cpu0);
        }
        for c in out.drain(..) {
            let tag = c.tag as usize;
            c.result
                .as_ref()
                .map_err(|e| CliError(e.to_string()))
                .context("random read")?;
            if measuring {
                ios += 1;
                hist.saturating_record(((now - started[tag]).as_nanos() as u64).max(1));
                let buf = c
                    .buf
                    .ok_or_else(|| CliError("read buffer not handed back".into()))?;
                started[tag] = now;
                let off = rng.below(blocks) * block;
                q.push(Request::read(c.tag, off, buf))
                    .map_err(|r| CliError(r.error.to_string()))?;
                if submit == Submit::Each {
                    q.submit()?;
                }
            }
        }
        if !measuring && q.in_flight() == 0 && q.queued() == 0 {
            break;
        }
    }
    let (seconds, cpu) = stopped;
    Ok(ReadRun {
        depth,
        block_bytes: block,
        seconds,
        ios,
        iops: ios as f64 / seconds,
        mbps: (ios * block) as f64 / 1e6 / seconds,
        lat_mean_us: hist.mean() / 1e3,
        lat_p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
        lat_p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        cpu_seconds: cpu,
        cpu_us_per_io: if ios > 0 { cpu * 1e6 / ios as f64 } else { 0.0 },
    })
}
