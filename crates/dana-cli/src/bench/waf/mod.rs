//! `dana bench waf`: the flash writes a workload costs.
//!
//! Owns: YCSB-A (half reads, half updates, zipfian) and TPC-C
//! ([`tpcc`]) on a database whose data device and log device are
//! simulated disks each behind an FTL model (`dana::io::ftl`), at several
//! fill levels (live data as a share of the data device's logical
//! capacity); per fill, a warm-up until the data device has taken a given
//! number of device capacities of host writes (so the FTL's collection
//! reaches its steady state), then a measured window of the same kind;
//! host and flash bytes per operation (a YCSB operation, a TPC-C
//! transaction), write amplification (WAF) and collection work, for the
//! data device, the log device and both.
//!
//! With `--placement none,classes` (the default) every fill runs twice:
//! once with one FTL stream, once with a placement handle per write class
//! (`io::Placement`: the log, hot and cold page write-backs as sorted by
//! how long each page's last version lived, large values), as a device
//! with FDP reclaim-unit handles or write streams would keep them apart.
//! Both runs of a fill start from the same load (YCSB: one loading task,
//! in key order; TPC-C: a copy of one loaded image).
//!
//! With `--write-mode in-place,out-of-place,out-of-place-lz4` (the
//! default) each of those runs three times: pages written in place, out
//! of place (`dana::io::remap`: append-only segments whose data area
//! fills one erase block, collected and trimmed by dana, loaded from a
//! load of their own), and out of place with each page compressed (LZ4)
//! and packed at 512 bytes (#14 item 3; the report's `compression` is
//! page bytes written per byte stored). Out of place, the host bytes
//! count dana's collection and its segment summaries;
//! `--oop-over-provisioning` gives the out-of-place device a different
//! spare on the same erase blocks (a host-managed device). Live data,
//! fill and phases are the in-place device's in every mode. The values'
//! compressibility is fixed and printed: the key number, random bytes,
//! then a copy of them.
//!
//! What it is not (yet): compression in place. dana does not trim pages it frees in place (YCSB-A frees none; TPC-C's
//! deliveries free a few), so the FTL counts every page below the
//! high-water mark as live: the fill is the
//! high-water mark over the logical capacity. The simulated devices complete
//! every request at the next reap: operations per second here are the
//! engine's CPU-bound rate, not a disk figure. Never: reports a window the
//! run did not reach (a phase cut by `--max-seconds` says so).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dana::io::ftl::{FtlConfig, FtlStats, GcPolicy};
use dana::io::remap::{Grouping, Remap, RemapConfig, RemapStats};
use dana::io::sim::{SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Options};
use serde::Serialize;

use crate::bench::ycsb::gen::{ScrambledZipfian, Zipfian};
use crate::rng::XorShift;
use crate::{CliError, CliResult};

mod tpcc;

const PAGE: u64 = 4096;
const TREE: &str = "usertable";

/// How the modelled FTL collects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Gc {
    /// The block with the fewest valid pages.
    Greedy,
    /// LFS cost-benefit: `(1 - u) / 2u × age`.
    CostBenefit,
}

/// How dana's out-of-place devices group their writes into segments
/// (`Remap::set_grouping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OopGrouping {
    /// By expected death time: engine writes by their page's last life,
    /// the collection's copies by their age (SepBIT, ZLeanStore).
    DeathTime,
    /// By the buffer pool's write class; every copy in one group.
    Classes,
}

/// Whether writes tell the device their class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementMode {
    /// One stream: the FTL mixes every write in the same open block.
    None,
    /// A placement handle per class (`io::Placement`: unsorted, log, hot
    /// pages, cold pages, large values), as FDP reclaim-unit handles or
    /// write streams would give.
    Classes,
}

/// Where page writes land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteMode {
    /// Each page at its own address: the FTL below collects.
    InPlace,
    /// Each write to a fresh slot of an append-only segment the size of an
    /// erase block (`dana::io::remap`); dana collects its segments and
    /// trims the dead ones, so the FTL below finds whole blocks dead.
    OutOfPlace,
    /// Out of place, each page compressed (LZ4) and packed at 512 bytes
    /// (`Options::compress_pages`).
    OutOfPlaceLz4,
}

impl WriteMode {
    /// The mode's short name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            WriteMode::InPlace => "in-place",
            WriteMode::OutOfPlace => "out-of-place",
            WriteMode::OutOfPlaceLz4 => "oop-lz4",
        }
    }

    /// Writes go through dana's out-of-place device.
    fn out_of_place(self) -> bool {
        self != WriteMode::InPlace
    }

    /// `opts` set to write this way (a new database; an existing one keeps
    /// the mode its files say).
    pub(crate) fn apply(self, opts: dana::Options) -> dana::Options {
        match self {
            WriteMode::InPlace => opts,
            WriteMode::OutOfPlace => opts.write_mode(dana::WriteMode::OutOfPlace),
            WriteMode::OutOfPlaceLz4 => opts
                .write_mode(dana::WriteMode::OutOfPlace)
                .compress_pages(true),
        }
    }
}

/// The workloads `bench waf` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WafWorkload {
    /// YCSB-A: half reads, half updates of one record.
    YcsbA,
    /// TPC-C's standard mix (`dana bench tpcc`'s transactions).
    Tpcc,
}

/// Where the popular records sit in key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrder {
    /// YCSB's: popularity ranks hashed over the key space, so that every
    /// leaf holds a random mix and pages are written at similar rates.
    Scrambled,
    /// The most popular records are the smallest keys, next to each other
    /// (time-ordered or sequential ids): pages are written at very
    /// different rates.
    Clustered,
}

impl KeyOrder {
    /// The key of record number `k`.
    fn key(self, k: u64) -> [u8; 8] {
        match self {
            KeyOrder::Scrambled => crate::bench::ycsb::workload::key_of(k),
            KeyOrder::Clustered => k.to_be_bytes(),
        }
    }
}

/// `dana bench waf ...`
#[derive(Args, Debug, Clone)]
pub struct WafArgs {
    /// Workloads to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ycsb-a,tpcc")]
    pub workloads: Vec<WafWorkload>,
    /// TPC-C warehouses.
    #[arg(long, default_value_t = 1)]
    pub warehouses: u32,
    /// Fill levels to run: live data (the pages the database uses) as a
    /// percentage of the data device's logical capacity.
    #[arg(long, value_delimiter = ',', default_value = "50,75,90")]
    pub fills: Vec<u32>,
    /// Erase blocks of the modelled data device.
    #[arg(long, default_value_t = 1024)]
    pub blocks: u32,
    /// 4 KiB pages per erase block.
    #[arg(long, default_value_t = 64)]
    pub pages_per_block: u32,
    /// Spare flash over user capacity (0.07 = 7%), for both devices.
    #[arg(long, default_value_t = 0.07)]
    pub over_provisioning: f64,
    /// How the FTL picks its collection victims.
    #[arg(long, value_enum, default_value_t = Gc::Greedy)]
    pub gc: Gc,
    /// How dana's out-of-place collection picks its victims
    /// (`Remap::set_gc_policy`).
    #[arg(long, value_enum, default_value_t = Gc::Greedy)]
    pub oop_gc: Gc,
    /// How dana's out-of-place devices sort writes into segments
    /// (`Remap::set_grouping`).
    #[arg(long, value_enum, default_value_t = OopGrouping::DeathTime)]
    pub oop_grouping: OopGrouping,
    /// Placements to run at each fill, in this order: `none` (one stream)
    /// and `classes` (a placement handle per write class).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,classes"
    )]
    pub placement: Vec<PlacementMode>,
    /// Write modes to run at each fill and placement: `in-place` (pages
    /// at their own address), `out-of-place` (`dana::io::remap`:
    /// append-only segments of an erase block, collected and trimmed by
    /// dana) and `out-of-place-lz4` (the same, each page compressed and
    /// packed at 512 bytes).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "in-place,out-of-place,out-of-place-lz4"
    )]
    pub write_mode: Vec<WriteMode>,
    /// Spare flash over user capacity of the out-of-place runs' data
    /// device (default: `--over-provisioning`, the same device). The same
    /// erase blocks, so a lower spare gives dana the room the FTL would
    /// keep: a host-managed device (ZNS, or FDP with whole reclaim units
    /// trimmed) in place of a conventional one. The live data, the fill
    /// and the phases stay those of the in-place device.
    #[arg(long)]
    pub oop_over_provisioning: Option<f64>,
    /// The simulated data devices write 4 KiB untorn (`RWF_ATOMIC`, as an
    /// NVMe drive with a 4 KiB atomic write unit): in place, dana then
    /// writes its pages back untorn and logs no torn-page images
    /// (`Options::untorn_page_writes`).
    #[arg(long)]
    pub untorn_writes: bool,
    /// Log full page images compressed (`Options::compress_log_images`).
    #[arg(long, default_value_t = Options::default().compress_log_images_value(), action = clap::ArgAction::Set)]
    pub compress_log_images: bool,
    /// Out of place: collect segments in a thread of the device's own
    /// (`Options::background_collection`), or only in the workers whose
    /// writes find the free segments run out (`false`).
    #[arg(long, default_value_t = Options::default().background_collection_value(), action = clap::ArgAction::Set)]
    pub background_collection: bool,
    /// Buffer pool as a share of the loaded data.
    #[arg(long, default_value_t = 0.1)]
    pub pool_fraction: f64,
    /// Value size in bytes (8-byte keys). Each value is its key number,
    /// then random bytes, then a copy of them: half of what follows the
    /// key number repeats (about 2:1 for an LZ compressor).
    #[arg(long, default_value_t = 120)]
    pub value_size: usize,
    /// Zipfian skew of the keys read and updated.
    #[arg(long, default_value_t = 0.8)]
    pub theta: f64,
    /// Where the popular records sit in key order.
    #[arg(long, value_enum, default_value_t = KeyOrder::Scrambled)]
    pub keys: KeyOrder,
    /// Log size in bytes (its own simulated device and FTL).
    #[arg(long, default_value_t = 64 << 20)]
    pub log_bytes: u64,
    /// The unit the log pads each flush to (`Options::log_flush_block`;
    /// 0: the device's alignment, 512 bytes here).
    #[arg(long, default_value_t = 0)]
    pub log_flush_block: u64,
    /// Warm-up: host writes to the data device, in device capacities,
    /// before the measured window.
    #[arg(long, default_value_t = 3.0, value_parser = crate::bench::parse_warmup_devices)]
    pub warmup_devices: f64,
    /// Measured window: host writes to the data device, in device
    /// capacities.
    #[arg(long, default_value_t = 2.0, value_parser = crate::bench::parse_measure_devices)]
    pub measure_devices: f64,
    /// Most seconds for each phase (warm-up, window); a phase cut short
    /// is reported as such.
    #[arg(long, default_value_t = 120.0, value_parser = crate::bench::parse_window)]
    pub max_seconds: f64,
    /// Concurrent tasks (spread over the workers).
    #[arg(long, default_value_t = 64)]
    pub tasks: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
    /// A few seconds on a small device: 256 blocks, fills 50 and 90, a
    /// warm-up and a window of at most one device capacity each.
    #[arg(long)]
    pub quick: bool,
}

impl WafArgs {
    /// The simulated data devices' settings (see
    /// [`WafArgs::untorn_writes`]).
    pub(crate) fn data_sim_config(&self) -> SimConfig {
        SimConfig {
            atomic_write_max: if self.untorn_writes { 4096 } else { 0 },
            ..SimConfig::default()
        }
    }
}

/// One device's share of a window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DeviceFigures {
    /// Host bytes written per operation (the bytes of the requests: a
    /// log flush of 512 bytes counts 512).
    pub host_bytes_per_op: f64,
    /// Flash bytes programmed per operation (host writes plus the
    /// collector's copies).
    pub flash_bytes_per_op: f64,
    /// Flash bytes per host byte (a write shorter than a flash page
    /// programs a whole one; counted by pages, a log's 512-byte flushes
    /// showed a WAF near 1); None if the host wrote nothing.
    pub waf: Option<f64>,
    /// Valid pages the collector copied, per operation.
    pub gc_copies_per_op: f64,
    /// Blocks erased in the window.
    pub erases: u64,
    /// Pages the host trimmed, per operation (the log behind its
    /// checkpoints, freed pages, dead out-of-place segments).
    pub trims_per_op: f64,
}

impl DeviceFigures {
    fn of(s: &FtlStats, ops: u64) -> DeviceFigures {
        let per = |pages: u64| pages as f64 * PAGE as f64 / ops.max(1) as f64;
        DeviceFigures {
            host_bytes_per_op: s.host_bytes as f64 / ops.max(1) as f64,
            flash_bytes_per_op: per(s.flash_pages),
            waf: (s.host_bytes > 0).then(|| s.waf_bytes(PAGE)),
            gc_copies_per_op: s.gc_copies as f64 / ops.max(1) as f64,
            erases: s.erases,
            trims_per_op: s.trims as f64 / ops.max(1) as f64,
        }
    }
}

/// One fill level's run.
#[derive(Debug, Clone, Serialize)]
pub struct FillRun {
    /// The workload.
    pub workload: WafWorkload,
    /// Requested fill, percent.
    pub fill_percent: u32,
    /// The data device's logical bytes.
    pub device_bytes: u64,
    /// Whether the writes' classes reached the FTL as placement handles.
    pub placement: PlacementMode,
    /// Where page writes landed.
    pub write_mode: WriteMode,
    /// Out of place: pages dana's own collection copied, per operation.
    pub dana_gc_copies_per_op: f64,
    /// Out of place: segment summary pages written, per operation.
    pub summary_writes_per_op: f64,
    /// Out of place: bytes of the pages dana wrote per byte they took on
    /// the device (compressed and padded to 512 bytes; 1 uncompressed);
    /// None in place or if nothing was stored (not measured).
    pub compression: Option<f64>,
    /// Pages the database uses at the window's start (after the load and
    /// the warm-up), as a share of the data device's logical capacity.
    pub fill_reached: f64,
    /// Pages the database uses at the window's end, as a share of the
    /// data device's logical capacity (TPC-C inserts: its data grows).
    pub fill_end: f64,
    /// Records (YCSB) or rows (TPC-C) loaded.
    pub records: u64,
    /// Buffer pool bytes of the run.
    pub pool_bytes: u64,
    /// Operations in the measured window (YCSB: half reads, half
    /// updates; TPC-C: transactions).
    pub ops: u64,
    /// Seconds of the measured window.
    pub seconds: f64,
    /// Operations per second (simulated devices: engine-bound).
    pub ops_per_s: f64,
    /// Data-device host writes in the warm-up, in device capacities.
    pub warmup_devices: f64,
    /// Data-device host writes in the window, in device capacities.
    pub window_devices: f64,
    /// A phase ended at `--max-seconds` before its host writes.
    pub cut_by_time: bool,
    /// The data device.
    pub data: DeviceFigures,
    /// The log device.
    pub log: DeviceFigures,
    /// Both: flash bytes over host bytes (None if the host wrote
    /// nothing).
    pub waf_total: Option<f64>,
    /// Both: flash bytes per operation.
    pub flash_bytes_per_op: f64,
    /// Data pages written back per update (YCSB) or per transaction
    /// (TPC-C).
    pub page_writes_per_update: f64,
    /// Page write-backs of the window placed as hot (the rest cold).
    pub hot_share: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct WafReport {
    /// The arguments' device shape, for the record (YCSB-A's data
    /// device; TPC-C's is sized to its data at each fill).
    pub blocks: u32,
    /// Pages per erase block.
    pub pages_per_block: u32,
    /// Spare over user capacity.
    pub over_provisioning: f64,
    /// Collection policy.
    pub gc: String,
    /// How dana's out-of-place collection picks its victims.
    pub oop_gc: String,
    /// How dana's out-of-place devices group their writes.
    pub oop_grouping: String,
    /// The data device's logical bytes.
    pub device_bytes: u64,
    /// Value bytes.
    pub value_size: usize,
    /// Zipfian skew.
    pub theta: f64,
    /// Where the popular records sit in key order.
    pub keys: KeyOrder,
    /// TPC-C warehouses.
    pub warehouses: u32,
    /// The log's flush block (bytes).
    pub log_flush_block: u64,
    /// The data devices wrote 4 KiB untorn ([`WafArgs::untorn_writes`]).
    pub untorn_writes: bool,
    /// Full page images were logged compressed
    /// ([`WafArgs::compress_log_images`]).
    pub compress_log_images: bool,
    /// Out of place, segments were collected in the background
    /// ([`WafArgs::background_collection`]).
    pub background_collection: bool,
    /// One run per fill.
    pub runs: Vec<FillRun>,
}

/// Runs the benchmark.
pub fn run(a: &WafArgs) -> CliResult<()> {
    super::check_tasks(a.tasks, a.workers)?;
    let mut a = a.clone();
    if a.quick {
        a.blocks = 256;
        a.fills = vec![50, 90];
        a.log_bytes = a.log_bytes.min(16 << 20);
        a.warmup_devices = a.warmup_devices.min(1.0);
        a.measure_devices = a.measure_devices.min(1.0);
    }
    let a = &a;
    if a.fills.is_empty() || a.fills.iter().any(|&f| f == 0 || f >= 100) {
        return Err(CliError(
            "--fills takes percentages between 1 and 99".into(),
        ));
    }
    if !(0.0..1.0).contains(&a.theta) || a.theta == 0.0 {
        return Err(CliError("--theta must lie in (0, 1)".into()));
    }
    if a.value_size < 16 || a.value_size > 1024 {
        return Err(CliError("--value-size must lie in 16..=1024".into()));
    }
    if a.oop_over_provisioning
        .is_some_and(|s| !(0.005..=1.0).contains(&s))
    {
        return Err(CliError(
            "--oop-over-provisioning must lie in 0.005..=1".into(),
        ));
    }
    if a.write_mode.is_empty() {
        return Err(CliError(
            "--write-mode takes in-place, out-of-place, out-of-place-lz4 or several".into(),
        ));
    }
    if a.placement.is_empty() {
        return Err(CliError("--placement takes none, classes or both".into()));
    }
    // The same logical capacity whatever the handles.
    let device_bytes = u64::from(
        dana::io::ftl::Ftl::new(ftl_config(a, a.blocks, PlacementMode::None))?.logical_pages(),
    ) * PAGE;
    if a.workloads.is_empty() {
        return Err(CliError("--workloads takes ycsb-a, tpcc or both".into()));
    }
    // TPC-C runs `--tasks` as whole tasks per worker, and its history ids
    // keep 12 bits of a task's number (past them, history rows were
    // overwritten; a review's finding).
    if a.workloads.contains(&WafWorkload::Tpcc)
        && (a.tasks % a.workers.max(1) != 0 || a.tasks >= crate::bench::tpcc::HISTORY_TASKS)
    {
        return Err(CliError(format!(
            "--tasks {} with TPC-C: a multiple of --workers ({}) below 4,096 (history ids)",
            a.tasks, a.workers
        )));
    }
    // Every device shape of the runs, before any runs: a shape the FTL
    // refuses (too few spare blocks for the handles of `classes`), or an
    // out-of-place device too small for the highest fill of the in-place
    // one's capacity, failed its run mid-invocation, and the report of
    // the runs before it was lost (a review's finding).
    // YCSB-A's devices only: TPC-C sizes its blocks to its data per fill
    // (`tpcc::Image`), so `--blocks` says nothing about its shapes.
    let highest_fill = a.fills.iter().copied().max().unwrap_or(0);
    let wanted = (device_bytes / PAGE) as f64 * f64::from(highest_fill) / 100.0;
    let ycsb = a.workloads.contains(&WafWorkload::YcsbA);
    for &placement in a.placement.iter().filter(|_| ycsb) {
        for &mode in &a.write_mode {
            let cfg = ftl_config_for(a, a.blocks, placement, mode);
            let pages = dana::io::ftl::Ftl::new(cfg)
                .map_err(|e| {
                    CliError(format!(
                        "the device for --placement {} and --write-mode {}: {e}",
                        cli_name(placement),
                        cli_name(mode)
                    ))
                })?
                .logical_pages();
            if f64::from(pages) < wanted {
                return Err(CliError(format!(
                    "the device for --write-mode {} holds {pages} pages, fewer than the \
                     {wanted:.0} that a fill of {highest_fill}% of the in-place device asks \
                     (lower --oop-over-provisioning or the fills)",
                    cli_name(mode)
                )));
            }
        }
    }
    let mut runs = Vec::new();
    for &workload in &a.workloads {
        // TPC-C sizes its device to its data: measured once.
        let tpcc_sizing = match workload {
            WafWorkload::Tpcc => Some(tpcc::Sizing::measure(a)?),
            WafWorkload::YcsbA => None,
        };
        for &fill in &a.fills {
            let image = match tpcc_sizing {
                Some(sizing) => Some(tpcc::Image::load(a, fill, sizing)?),
                None => None,
            };
            for &placement in &a.placement {
                match &image {
                    None => {
                        for &mode in &a.write_mode {
                            let data_cfg = ftl_config_for(a, a.blocks, placement, mode);
                            let setup = Setup {
                                fill,
                                placement,
                                mode,
                                data_cfg,
                                device_bytes: u64::from(
                                    dana::io::ftl::Ftl::new(data_cfg)?.logical_pages(),
                                ) * PAGE,
                                reference_bytes: device_bytes,
                            };
                            runs.push(run_fill(a, setup)?);
                        }
                    }
                    Some(image) => {
                        for &mode in &a.write_mode {
                            runs.push(tpcc::run_fill(a, placement, mode, image)?);
                        }
                    }
                }
            }
        }
    }
    let report = WafReport {
        untorn_writes: a.untorn_writes,
        compress_log_images: a.compress_log_images,
        background_collection: a.background_collection,
        blocks: a.blocks,
        pages_per_block: a.pages_per_block,
        over_provisioning: a.over_provisioning,
        gc: format!("{:?}", a.gc),
        oop_gc: format!("{:?}", a.oop_gc),
        oop_grouping: format!("{:?}", a.oop_grouping),
        device_bytes,
        value_size: a.value_size,
        theta: a.theta,
        keys: a.keys,
        warehouses: a.warehouses,
        log_flush_block: a.log_flush_block.max(512),
        runs,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError(e.to_string()))?
        );
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn ftl_config(a: &WafArgs, blocks: u32, placement: PlacementMode) -> FtlConfig {
    ftl_config_for(a, blocks, placement, WriteMode::InPlace)
}

/// The data device's FTL of a run in `mode` (see
/// `--oop-over-provisioning`).
fn ftl_config_for(
    a: &WafArgs,
    blocks: u32,
    placement: PlacementMode,
    mode: WriteMode,
) -> FtlConfig {
    let spare = match mode {
        WriteMode::InPlace => a.over_provisioning,
        WriteMode::OutOfPlace | WriteMode::OutOfPlaceLz4 => {
            a.oop_over_provisioning.unwrap_or(a.over_provisioning)
        }
    };
    let mut c = FtlConfig::new(a.pages_per_block, blocks, spare);
    c.handles = match placement {
        PlacementMode::None => 1,
        PlacementMode::Classes => dana::io::placement::PLACEMENTS.len() as u32,
    };
    c.gc = gc_policy(a.gc);
    c
}

/// How the out-of-place runs cut their device: a segment's data slots
/// fill one erase block (its two summary pages go to the unsorted
/// stream); the free room the collection works in is whatever the fill
/// leaves.
fn remap_config(pages_per_block: u32, mode: WriteMode) -> RemapConfig {
    RemapConfig {
        page_size: PAGE as u32,
        segment_pages: pages_per_block + 2,
        spare: 0.0,
        compress: mode == WriteMode::OutOfPlaceLz4,
    }
}

/// The policy `gc` names.
fn gc_policy(gc: Gc) -> GcPolicy {
    match gc {
        Gc::Greedy => GcPolicy::Greedy,
        Gc::CostBenefit => GcPolicy::CostBenefit,
    }
}

/// The two simulated devices of one run, each behind its FTL.
struct Devices {
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
    mode: WriteMode,
    /// Out of place: how dana's collection picks its victims.
    oop_gc: GcPolicy,
    /// Out of place: how writes are grouped into segments.
    oop_grouping: Grouping,
    /// Out of place: the device dana writes through, once opened.
    remap: std::sync::Mutex<Option<Arc<Remap>>>,
    pages_per_block: u32,
}

impl Devices {
    fn new(
        a: &WafArgs,
        placement: PlacementMode,
        data_cfg: FtlConfig,
        device_bytes: u64,
    ) -> CliResult<Devices> {
        let data = SimDisk::new(0, device_bytes, a.data_sim_config());
        data.attach_ftl(data_cfg)?;
        let log_device = CONTROL_BYTES + a.log_bytes;
        // Enough blocks that the log device's logical capacity holds it.
        let physical = (log_device.div_ceil(PAGE) as f64 * (1.0 + a.over_provisioning)).ceil();
        // And enough that its spare holds the FTL's free reserve and open
        // blocks with a handle per class (the same log device whatever
        // the placement).
        let handles = dana::io::placement::PLACEMENTS.len() as f64;
        let spare_blocks = 2.0 * handles + f64::from(dana::io::ftl::Ftl::free_reserve()) + 2.0;
        let spare_min =
            (spare_blocks * (1.0 + a.over_provisioning) / a.over_provisioning.max(0.01)).ceil();
        let blocks = ((physical as u64).div_ceil(u64::from(a.pages_per_block)) as u32
            + dana::io::ftl::Ftl::free_reserve()
            + 2)
        .max(spare_min as u32);
        let log = SimDisk::new(1, log_device, SimConfig::default());
        log.attach_ftl(ftl_config(a, blocks, placement))?;
        Ok(Devices {
            data,
            log,
            mode: WriteMode::InPlace,
            oop_gc: gc_policy(a.oop_gc),
            oop_grouping: match a.oop_grouping {
                OopGrouping::DeathTime => Grouping::DeathTime,
                OopGrouping::Classes => Grouping::Classes,
            },
            remap: std::sync::Mutex::new(None),
            pages_per_block: a.pages_per_block,
        })
    }

    /// The same devices, written out of place with `mode`.
    fn with_mode(mut self, mode: WriteMode) -> Devices {
        self.mode = mode;
        self
    }

    fn open(&self, opts: Options, create: bool) -> CliResult<Db> {
        let data = Target::Sim(self.data.clone());
        let data = match self.mode {
            WriteMode::InPlace => data,
            WriteMode::OutOfPlace | WriteMode::OutOfPlaceLz4 => {
                let remap = if create {
                    Remap::create(data, remap_config(self.pages_per_block, self.mode))?
                } else {
                    Remap::open(data)?
                };
                remap.set_gc_policy(self.oop_gc);
                remap.set_grouping(self.oop_grouping);
                *self.remap.lock().unwrap_or_else(|e| e.into_inner()) = Some(remap.clone());
                Target::Remap(remap)
            }
        };
        let array = Array::new(vec![data], PAGE)?;
        Ok(Db::open_array_with_log(
            array,
            Some(Target::Sim(self.log.clone())),
            opts,
            create,
        )?)
    }

    /// Out of place: dana's own counters.
    fn remap_stats(&self) -> RemapStats {
        self.remap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|r| r.stats())
            .unwrap_or_default()
    }

    fn stats(&self) -> (FtlStats, FtlStats) {
        (
            self.data.ftl_stats().unwrap_or_default(),
            self.log.ftl_stats().unwrap_or_default(),
        )
    }
}

fn options(a: &WafArgs, pool_bytes: u64) -> Options {
    Options::default()
        .pool_bytes(pool_bytes as usize)
        .workers(a.workers)
        .log_bytes(a.log_bytes)
        .log_flush_block(a.log_flush_block)
        .compress_log_images(a.compress_log_images)
        .background_collection(a.background_collection)
        .durability(Durability::Sync)
}

/// Value of key number `k` (version `salt`): `k`, then random bytes, then
/// a copy of them (see `--value-size`).
fn fill_value(k: u64, salt: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&k.to_le_bytes());
    let rest = out.len() - 8;
    let half = rest / 2;
    let mut rng = XorShift::new(k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt ^ 1);
    for b in &mut out[8..8 + half] {
        *b = rng.next_u64() as u8;
    }
    out.copy_within(8..8 + half, 8 + half);
    if rest % 2 == 1 {
        out[8 + 2 * half] = rng.next_u64() as u8;
    }
}

/// Pages the database uses (its high-water mark).
fn used_pages(db: &Db) -> CliResult<u64> {
    let pool = db.pool().clone();
    Ok(db.block_on(async move { pool.space().await.map(|s| s.next_unused) })??)
}

/// Loads records `from..to` through the bulk path (unlogged inserts) from
/// `tasks` tasks (one, in key order for clustered keys: the same pages
/// whatever the run, so that runs compare at the same fill).
fn load(
    db: &Db,
    keys: KeyOrder,
    from: u64,
    to: u64,
    value_size: usize,
    tasks: u64,
) -> CliResult<()> {
    let tree = db.tree(TREE)?.unlogged_btree().clone();
    let record: crate::bench::RecordFn = Arc::new(move |j, v| {
        fill_value(from + j, 0, v);
        keys.key(from + j)
    });
    crate::bench::load_records(db, &tree, to - from, tasks, value_size, record, true)?;
    Ok(())
}

/// One YCSB-A run's devices.
struct Setup {
    fill: u32,
    placement: PlacementMode,
    mode: WriteMode,
    data_cfg: FtlConfig,
    /// The data device's logical bytes.
    device_bytes: u64,
    /// The in-place device's: the fill and the phases are measured
    /// against it.
    reference_bytes: u64,
}

fn run_fill(a: &WafArgs, setup: Setup) -> CliResult<FillRun> {
    let Setup {
        fill,
        placement,
        mode,
        data_cfg,
        device_bytes,
        reference_bytes,
    } = setup;
    let devices = Devices::new(a, placement, data_cfg, device_bytes)?.with_mode(mode);
    let target_pages = reference_bytes / PAGE * u64::from(fill) / 100;
    // Load: a pool that holds everything, then close (the checkpoint
    // writes every page once).
    let db = devices.open(options(a, device_bytes + (64 << 20)), true)?;
    db.create_tree(TREE)?;
    // Random-order inserts leave leaves about 70% full; load a first
    // estimate, then top up in proportion to what it took.
    let per_record = (a.value_size + 8 + 12) as f64;
    let mut records = ((target_pages * 4000) as f64 * 0.6 / per_record) as u64;
    load(&db, a.keys, 0, records, a.value_size, 1)?;
    for _ in 0..8 {
        let used = used_pages(&db)?;
        if used * 100 >= target_pages * 99 {
            break;
        }
        let more = ((records as f64) * (target_pages as f64 / used as f64 - 1.0)) as u64 * 9 / 10;
        let more = more.max(1024);
        load(&db, a.keys, records, records + more, a.value_size, 1)?;
        records += more;
    }
    let used = used_pages(&db)?;
    db.close()?;
    let pool_bytes = ((used * PAGE) as f64 * a.pool_fraction) as u64;
    let pool_bytes = pool_bytes.max(256 * PAGE);

    let db = devices.open(options(a, pool_bytes), false)?;
    let tree = db.tree(TREE)?;
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let updates = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let zipf = ScrambledZipfian::with_theta(records, a.theta);
    let plain = Zipfian::with_theta(records, a.theta);
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..a.tasks {
        let (tree, stop, ops, updates, errors, zipf, plain, tx) = (
            tree.clone(),
            stop.clone(),
            ops.clone(),
            updates.clone(),
            errors.clone(),
            zipf.clone(),
            plain.clone(),
            tx.clone(),
        );
        let (vs, keys) = (a.value_size, a.keys);
        db.spawn_on(t % a.workers, async move {
            let mut rng = XorShift::new(0x5eed ^ (t as u64) << 17);
            let mut v = vec![0u8; vs];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = match keys {
                    KeyOrder::Scrambled => zipf.next(&mut rng),
                    KeyOrder::Clustered => plain.next(&mut rng),
                };
                let key = keys.key(k);
                let r = if rng.next_u64() % 2 == 0 {
                    match tree.get_async(&key).await {
                        Ok(Some(got)) if got[..8] == k.to_le_bytes() => Ok(()),
                        Ok(_) => Err(format!("read {k}: missing or wrong")),
                        Err(e) => Err(format!("read {k}: {e}")),
                    }
                } else {
                    n += 1;
                    fill_value(k, (t as u64) << 40 | n, &mut v);
                    updates.fetch_add(1, Ordering::Relaxed);
                    match tree.put_async(&key, &v).await {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(format!("update {k}: the record was missing")),
                        Err(e) => Err(format!("update {k}: {e}")),
                    }
                };
                if let Err(e) = r {
                    let mut errs = errors.lock().unwrap_or_else(|e| e.into_inner());
                    if errs.len() < 8 {
                        errs.push(e);
                    }
                    stop.store(true, Ordering::Relaxed);
                }
                ops.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        })?;
    }
    drop(tx);
    let device_pages = reference_bytes / PAGE;
    let max = Duration::from_secs_f64(a.max_seconds);
    let pb = crate::bench::bar(a.quiet || a.json, 2, &format!("waf {fill}%"));
    // Runs until the data device has taken `capacities` device
    // capacities of host writes since `from` (or the time bound, or a
    // failure); returns the data device's counters then.
    let mut cut_by_time = false;
    let phase = |from: FtlStats, capacities: f64, cut: &mut bool| -> FtlStats {
        let started = Instant::now();
        let want = (capacities * device_pages as f64) as u64;
        loop {
            let (d, _) = devices.stats();
            if d.since(&from).host_pages >= want || stop.load(Ordering::Relaxed) {
                return d;
            }
            if started.elapsed() >= max {
                *cut = true;
                return d;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let (start_data, _) = devices.stats();
    let warm = phase(start_data, a.warmup_devices, &mut cut_by_time);
    pb.inc(1);
    // The fill reached at the window's start (after the load and the
    // warm-up, as TPC-C measures it; it was taken after the load), before
    // the window's counters are read.
    let used = used_pages(&db)?;
    let (base_data, base_log) = devices.stats();
    let remap0 = devices.remap_stats();
    let pool0 = db.pool().stats();
    let (ops0, upd0, t0) = (
        ops.load(Ordering::Relaxed),
        updates.load(Ordering::Relaxed),
        Instant::now(),
    );
    let _ = phase(base_data, a.measure_devices, &mut cut_by_time);
    let (end_data, end_log) = devices.stats();
    let remap1 = devices.remap_stats();
    let pool1 = db.pool().stats();
    let (ops1, upd1, seconds) = (
        ops.load(Ordering::Relaxed),
        updates.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
    );
    pb.finish_and_clear();
    stop.store(true, Ordering::Relaxed);
    for _ in 0..a.tasks {
        rx.recv_timeout(Duration::from_secs(60))
            .map_err(|_| CliError("a waf task did not stop".into()))?;
    }
    if let Some(e) = errors.lock().unwrap_or_else(|e| e.into_inner()).first() {
        return Err(CliError(format!("waf {fill}%: {e}")));
    }
    let used_end = used_pages(&db)?;
    db.close()?;
    Ok(Window {
        workload: WafWorkload::YcsbA,
        fill,
        placement,
        mode,
        remap: remap1.since(&remap0),
        device_pages,
        data_device_bytes: device_bytes,
        used_start: used,
        used_end,
        records,
        pool_bytes,
        ops: ops1 - ops0,
        writes: upd1 - upd0,
        seconds,
        warmup_pages: warm.since(&start_data).host_pages,
        cut_by_time,
        data: end_data.since(&base_data),
        log: end_log.since(&base_log),
        hot_writebacks: pool1.hot_writebacks - pool0.hot_writebacks,
        writebacks: pool1.writebacks - pool0.writebacks,
    }
    .figures())
}

/// What one fill's measured window saw, before it is turned into
/// figures.
struct Window {
    workload: WafWorkload,
    fill: u32,
    placement: PlacementMode,
    mode: WriteMode,
    /// Out of place: dana's collection in the window.
    remap: RemapStats,
    /// The in-place device's logical pages: the fill and the phases are
    /// measured against them.
    device_pages: u64,
    /// The data device's own logical bytes (an out-of-place device may
    /// have another spare: `--oop-over-provisioning`).
    data_device_bytes: u64,
    /// Pages in use at the window's start and end.
    used_start: u64,
    used_end: u64,
    records: u64,
    pool_bytes: u64,
    /// Operations (YCSB) or transactions (TPC-C) in the window.
    ops: u64,
    /// The operations that write: YCSB updates, TPC-C transactions.
    writes: u64,
    seconds: f64,
    warmup_pages: u64,
    cut_by_time: bool,
    data: FtlStats,
    log: FtlStats,
    hot_writebacks: u64,
    writebacks: u64,
}

impl Window {
    fn figures(&self) -> FillRun {
        let (d, l, n) = (&self.data, &self.log, self.ops);
        let host = d.host_bytes + l.host_bytes;
        let flash = d.flash_pages + l.flash_pages;
        let device = self.device_pages as f64;
        FillRun {
            workload: self.workload,
            fill_percent: self.fill,
            device_bytes: self.data_device_bytes,
            placement: self.placement,
            write_mode: self.mode,
            dana_gc_copies_per_op: self.remap.gc_copies as f64 / n.max(1) as f64,
            summary_writes_per_op: self.remap.summary_writes as f64 / n.max(1) as f64,
            compression: (self.remap.stored_bytes > 0)
                .then(|| (self.remap.page_writes * PAGE) as f64 / self.remap.stored_bytes as f64),
            fill_reached: self.used_start as f64 / device,
            fill_end: self.used_end as f64 / device,
            records: self.records,
            pool_bytes: self.pool_bytes,
            ops: n,
            seconds: self.seconds,
            ops_per_s: n as f64 / self.seconds.max(1e-9),
            warmup_devices: self.warmup_pages as f64 / device,
            window_devices: d.host_pages as f64 / device,
            cut_by_time: self.cut_by_time,
            data: DeviceFigures::of(d, n),
            log: DeviceFigures::of(l, n),
            waf_total: (host > 0).then(|| (flash * PAGE) as f64 / host as f64),
            flash_bytes_per_op: flash as f64 * PAGE as f64 / n.max(1) as f64,
            page_writes_per_update: d.host_pages as f64 / self.writes.max(1) as f64,
            hot_share: self.hot_writebacks as f64 / self.writebacks.max(1) as f64,
        }
    }
}

/// A measured figure to two places, or "-" where nothing was measured.
fn two_places(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// An option value as the command line spells it.
fn cli_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

/// The report as text.
pub fn render(r: &WafReport) -> String {
    let mut s = format!(
        "dana bench waf: page writes on simulated devices behind an FTL model: {} \
         pages per block, {:.0}% over-provisioning, {} collection (dana's out of place: {}, \
         grouped by {}); log flushes padded to {} bytes (ops/s are engine-bound, not a disk \
         figure)\n",
        r.pages_per_block,
        r.over_provisioning * 100.0,
        r.gc.to_lowercase(),
        r.oop_gc.to_lowercase(),
        match r.oop_grouping.as_str() {
            "DeathTime" => "death time",
            _ => "class",
        },
        r.log_flush_block,
    );
    if r.untorn_writes {
        s.push_str(
            "  data devices write 4 KiB untorn (RWF_ATOMIC): in place, pages are written back \
             untorn and the log holds no torn-page images\n",
        );
    }
    s.push_str(if r.compress_log_images {
        "  full page images in the log compressed (LZ4) where smaller\n"
    } else {
        "  full page images in the log plain\n"
    });
    s.push_str(if r.background_collection {
        "  out of place, segments collected in the background (a thread per device)\n"
    } else {
        "  out of place, segments collected by the writes that run out of them\n"
    });
    let has = |w: WafWorkload| r.runs.iter().any(|f| f.workload == w);
    if has(WafWorkload::YcsbA) {
        s.push_str(&format!(
            "  ycsb-a: 50% reads, 50% updates, zipfian {}, {} keys, 8-byte keys, {}-byte values \
             (half of each after the key number repeats); an op is one read or update\n",
            r.theta,
            match r.keys {
                KeyOrder::Scrambled => "scrambled",
                KeyOrder::Clustered => "clustered",
            },
            r.value_size,
        ));
    }
    if has(WafWorkload::Tpcc) {
        s.push_str(&format!(
            "  tpcc: {} warehouse(s), the standard mix, log synced; an op is a transaction; \
             the data grows (fill at the window's start -> end; the fill asked for is the end's)\n",
            r.warehouses,
        ));
    }
    s.push_str(
        " workload  fill  placement  write mode    dev MiB  reached -> end   records  pool MiB     ops/s  host B/op data  log   flash B/op data  log   WAF data  log  total  page writes/write  gc copies/op  dana gc/op  summaries/op  compression  hot share\n",
    );
    for f in &r.runs {
        s.push_str(&format!(
            " {:>8}  {:>3}%  {:>9}  {:>12}  {:>7}  {:>6.1}% {:>5.1}%  {:>8}  {:>8}  {:>8.0}  {:>14.0} {:>5.0}  {:>15.0} {:>5.0}  {:>8} {:>4} {:>6}  {:>17.3}  {:>12.3}  {:>10.3}  {:>12.3}  {:>11}  {:>8.1}%{}\n",
            match f.workload {
                WafWorkload::YcsbA => "ycsb-a",
                WafWorkload::Tpcc => "tpcc",
            },
            f.fill_percent,
            match f.placement {
                PlacementMode::None => "none",
                PlacementMode::Classes => "classes",
            },
            f.write_mode.name(),
            f.device_bytes >> 20,
            f.fill_reached * 100.0,
            f.fill_end * 100.0,
            f.records,
            f.pool_bytes >> 20,
            f.ops_per_s,
            f.data.host_bytes_per_op,
            f.log.host_bytes_per_op,
            f.data.flash_bytes_per_op,
            f.log.flash_bytes_per_op,
            two_places(f.data.waf),
            two_places(f.log.waf),
            two_places(f.waf_total),
            f.page_writes_per_update,
            f.data.gc_copies_per_op,
            f.dana_gc_copies_per_op,
            f.summary_writes_per_op,
            f.compression.map_or("-".into(), |c| format!("{c:.2}x")),
            f.hot_share * 100.0,
            if f.cut_by_time {
                format!(
                    "  (cut by --max-seconds: warm-up {:.2}, window {:.2} device capacities)",
                    f.warmup_devices, f.window_devices
                )
            } else {
                String::new()
            },
        ));
    }
    s
}
