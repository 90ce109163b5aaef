//! TPC-C for `dana bench waf`: `dana bench tpcc`'s load and transaction
//! mix on a data device sized to the loaded data at each fill, behind
//! the FTL model.
//!
//! Owns: sizing the device, the load and the phases. TPC-C inserts
//! (orders, order lines, history) and deletes little, so its data grows
//! through the run and a constant fill is impossible. [`Sizing`]
//! measures, once, on a device without the model, the pages a load of
//! `--warehouses` takes, and in a calibration run of the mix the data
//! pages written and the pages the data grows by per transaction. Each
//! fill's phases are counted in transactions (the warm-up: as many as
//! write `--warmup-devices` device capacities at the calibrated rate; the
//! window likewise), so that every placement at a fill runs the same
//! transactions over the same growth; the device is sized so that the
//! load plus the growth of the warm-up and the window make the fill asked
//! for: the most the run reaches, at the window's end. (Sized for the
//! window's middle, the end came within the engine's reserve for commits'
//! worst case, and a 90% run failed for space.) Every placement at a fill
//! starts from a copy of one loaded image ([`Image`]). The report gives
//! the fill at the window's start and end. The mix runs in chunks of half
//! a second (each chunk a fresh set of tasks with its own seed, as the
//! History keys ask), and a phase ends at the first chunk boundary past
//! its transactions, so the counters at the boundaries see every
//! transaction of the window whole. Never: reports a run in which a
//! transaction failed (the device full, say): the run is an error naming
//! the fill.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::io::ftl::Ftl;
use dana::io::sim::{SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability};

use super::{
    ftl_config, ftl_config_for, options, remap_config, used_pages, Devices, FillRun, PlacementMode,
    WafArgs, WafWorkload, Window, WriteMode, PAGE,
};
use crate::bench::tpcc::kv::DanaTables;
use crate::bench::tpcc::{load, run_mix, Mix, WAREHOUSE_BYTES};
use crate::{CliError, CliResult};
use dana::io::remap::Remap;

/// The seed of the load (the same rows at every fill).
const LOAD_SEED: u64 = 0x7a_f1;
/// The first run seed; each one-second chunk takes the next.
const RUN_SEED: u64 = 0x5eed_0000;
/// Seconds of one chunk of the mix.
const CHUNK_SECONDS: f64 = 0.5;

/// Loads `--warehouses` into a fresh database on `data` and `log`
/// (created) and closes it; returns the rows loaded and the pages used.
fn load_into(
    a: &WafArgs,
    data: Target,
    log: &Arc<SimDisk>,
    opts: dana::Options,
) -> CliResult<(u64, u64)> {
    let array = Array::new(vec![data], PAGE)?;
    let db = Db::open_array_with_log(array, Some(Target::Sim(log.clone())), opts, true)?;
    let (rows, used) = load_open(a, &db)?;
    db.close()?;
    Ok((rows, used))
}

fn load_open(a: &WafArgs, db: &Db) -> CliResult<(u64, u64)> {
    let tables = DanaTables::open(db)?;
    let tasks = (a.workers * 8).max(1);
    let rows = load::load(&tables, a.warehouses, tasks, LOAD_SEED, |_| {})?;
    db.checkpoint()?;
    drop(tables);
    Ok((rows, used_pages(db)?))
}

/// What sizes TPC-C's device: measured once per invocation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    /// Pages a load of `--warehouses` takes.
    loaded: u64,
    /// Pages the data grows by per transaction.
    growth: f64,
    /// Data pages written per transaction.
    writes: f64,
}

impl Sizing {
    /// Loads `--warehouses` on a device without the model, then runs the
    /// mix (pool as in the runs) until the device has taken one load's
    /// worth of page writes, and counts the pages the data grew by.
    pub(super) fn measure(a: &WafArgs) -> CliResult<Sizing> {
        if a.warehouses == 0 {
            return Err(CliError("--warehouses must be at least 1".into()));
        }
        let bytes = u64::from(a.warehouses) * WAREHOUSE_BYTES * 2;
        let data = SimDisk::new(0, bytes, a.data_sim_config());
        let log = SimDisk::new(1, CONTROL_BYTES + a.log_bytes, SimConfig::default());
        let (_, loaded) = load_into(
            a,
            Target::Sim(data.clone()),
            &log,
            options(a, bytes + (64 << 20)),
        )?;
        let array = Array::new(vec![Target::Sim(data.clone())], PAGE)?;
        let db = Db::open_array_with_log(
            array,
            Some(Target::Sim(log.clone())),
            options(a, pool_bytes(a, loaded)),
            false,
        )?;
        let tables = DanaTables::open(&db)?;
        let written = || data.stats().bytes_written / PAGE;
        let (w0, started) = (written(), Instant::now());
        let (mut seed, mut transactions) = (RUN_SEED, 0);
        while written() - w0 < loaded && started.elapsed().as_secs_f64() < a.max_seconds {
            seed += 1;
            transactions += run_mix(&tables, mix(a, seed), None, None)?.transactions();
        }
        let grown = used_pages(&db)?.saturating_sub(loaded);
        let per_tx = |n: u64| n as f64 / transactions.max(1) as f64;
        let sizing = Sizing {
            loaded,
            growth: per_tx(grown),
            writes: per_tx(written() - w0),
        };
        drop(tables);
        db.close()?;
        Ok(sizing)
    }

    /// Transactions that write `capacities` capacities of a device of
    /// `device_pages` at the calibrated rate.
    fn transactions(&self, capacities: f64, device_pages: u64) -> u64 {
        (capacities * device_pages as f64 / self.writes.max(1e-9)).ceil() as u64
    }

    /// The data device's logical pages for `fill` percent at the window's
    /// end.
    fn device_pages(&self, a: &WafArgs, fill: u32) -> CliResult<u64> {
        // Growth in device capacities per device capacity written.
        let per_capacity = self.growth / self.writes.max(1e-9);
        let ahead = per_capacity * (a.warmup_devices + a.measure_devices);
        let load_fill = f64::from(fill) / 100.0 - ahead;
        if load_fill < 0.05 {
            return Err(CliError(format!(
                "waf tpcc: the data grows by {:.3} pages per page written, {:.0}% of the device \
                 over the warm-up and the window: {fill}% fill cannot be reached at the \
                 window's end (fewer --warmup-devices or --measure-devices, or a higher fill)",
                per_capacity,
                ahead * 100.0
            )));
        }
        Ok((self.loaded as f64 / load_fill).ceil() as u64)
    }
}

fn pool_bytes(a: &WafArgs, used: u64) -> u64 {
    (((used * PAGE) as f64 * a.pool_fraction) as u64).max(256 * PAGE)
}

fn mix(a: &WafArgs, seed: u64) -> Mix {
    Mix {
        warehouses: a.warehouses,
        workers: a.workers,
        tasks_per_worker: (a.tasks / a.workers.max(1)).max(1),
        durability: Durability::Sync,
        seconds: CHUNK_SECONDS,
        seed,
        load_seed: LOAD_SEED,
    }
}

/// One fill's loaded database, on devices without the model: every
/// placement at the fill starts from a copy of it (a load from several
/// tasks lays pages out differently each time, by a few percent of the
/// device, which would be a different fill).
pub(super) struct Image {
    fill: u32,
    sizing: Sizing,
    blocks: u32,
    device_pages: u64,
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
    /// The same load written out of place (data, log), when asked for.
    /// Per out-of-place write mode: its data and log devices.
    out_of_place: Vec<(WriteMode, Arc<SimDisk>, Arc<SimDisk>)>,
    rows: u64,
    used: u64,
}

impl Image {
    /// Sizes the device for `fill` and loads it.
    pub(super) fn load(a: &WafArgs, fill: u32, sizing: Sizing) -> CliResult<Image> {
        let want_pages = sizing.device_pages(a, fill)?;
        let blocks = (want_pages as f64 * (1.0 + a.over_provisioning)
            / f64::from(a.pages_per_block))
        .ceil() as u32
            + 1;
        // The logical capacity does not depend on the handles.
        let cfg = ftl_config(a, blocks, PlacementMode::None);
        let device_pages = u64::from(Ftl::new(cfg)?.logical_pages());
        let data = SimDisk::new(0, device_pages * PAGE, a.data_sim_config());
        let log = SimDisk::new(1, CONTROL_BYTES + a.log_bytes, SimConfig::default());
        let opts = options(a, device_pages * PAGE + (64 << 20));
        let (rows, used) = load_into(a, Target::Sim(data.clone()), &log, opts.clone())?;
        // Out of place, the same rows land elsewhere: an image of their own.
        let mut out_of_place = Vec::new();
        for &mode in a.write_mode.iter().filter(|m| m.out_of_place()) {
            let cfg = ftl_config_for(a, blocks, PlacementMode::None, mode);
            let oop_pages = u64::from(Ftl::new(cfg)?.logical_pages());
            let oop = SimDisk::new(0, oop_pages * PAGE, SimConfig::default());
            let oop_log = SimDisk::new(1, CONTROL_BYTES + a.log_bytes, SimConfig::default());
            let config = remap_config(a.pages_per_block, mode);
            let remap = Remap::create(Target::Sim(oop.clone()), config)?;
            load_into(a, Target::Remap(remap), &oop_log, opts.clone())?;
            out_of_place.push((mode, oop, oop_log));
        }
        Ok(Image {
            fill,
            sizing,
            blocks,
            device_pages,
            data,
            log,
            out_of_place,
            rows,
            used,
        })
    }
}

/// One fill of TPC-C with `placement`: a copy of `image` on devices
/// behind the model, a warm-up and a window (counted in transactions:
/// see the module doc).
pub(super) fn run_fill(
    a: &WafArgs,
    placement: PlacementMode,
    mode: WriteMode,
    image: &Image,
) -> CliResult<FillRun> {
    let Image {
        fill,
        sizing,
        device_pages,
        rows,
        used,
        ..
    } = *image;
    let cfg = ftl_config_for(a, image.blocks, placement, mode);
    let data_pages = u64::from(Ftl::new(cfg)?.logical_pages());
    let devices = Devices::new(a, placement, cfg, data_pages * PAGE)?.with_mode(mode);
    let (data, log) = match mode {
        WriteMode::InPlace => (&image.data, &image.log),
        _ => image
            .out_of_place
            .iter()
            .find(|(m, _, _)| *m == mode)
            .map(|(_, d, l)| (d, l))
            .ok_or_else(|| CliError(format!("no {} image was loaded", mode.name())))?,
    };
    devices.data.copy_durable_from(data)?;
    devices.log.copy_durable_from(log)?;
    let pool_bytes = pool_bytes(a, used);

    let db = devices.open(options(a, pool_bytes), false)?;
    let tables = DanaTables::open(&db)?;
    let max = Duration::from_secs_f64(a.max_seconds);
    let pb = crate::bench::bar(a.quiet || a.json, 2, &format!("waf tpcc {fill}%"));
    let mut seed = RUN_SEED;
    let mut cut_by_time = false;
    // Runs chunks until `capacities` device capacities' worth of
    // transactions at the calibrated rate have run (or the time bound);
    // returns the transactions and seconds.
    let mut phase = |capacities: f64, cut: &mut bool| -> CliResult<(u64, f64)> {
        let want = sizing.transactions(capacities, device_pages);
        let started = Instant::now();
        let mut transactions = 0;
        while transactions < want {
            if started.elapsed() >= max {
                *cut = true;
                break;
            }
            seed += 1;
            let r = run_mix(&tables, mix(a, seed), None, None).map_err(|e| {
                CliError(format!(
                    "waf tpcc at {fill}% fill: {e} (the data grows with the run: a lower fill \
                     or a shorter warm-up keeps it within the device)"
                ))
            })?;
            transactions += r.transactions();
        }
        Ok((transactions, started.elapsed().as_secs_f64()))
    };
    let (start_data, _) = devices.stats();
    phase(a.warmup_devices, &mut cut_by_time)?;
    pb.inc(1);
    let (base_data, base_log) = devices.stats();
    let remap0 = devices.remap_stats();
    let used_start = used_pages(&db)?;
    let pool0 = db.pool().stats();
    let (transactions, seconds) = phase(a.measure_devices, &mut cut_by_time)?;
    let (end_data, end_log) = devices.stats();
    let remap1 = devices.remap_stats();
    let pool1 = db.pool().stats();
    pb.finish_and_clear();
    let used_end = used_pages(&db)?;
    drop(tables);
    db.close()?;
    Ok(Window {
        workload: WafWorkload::Tpcc,
        fill,
        placement,
        mode,
        remap: remap1.since(&remap0),
        device_pages,
        data_device_bytes: data_pages * PAGE,
        used_start,
        used_end,
        records: rows,
        pool_bytes,
        ops: transactions,
        writes: transactions,
        seconds,
        warmup_pages: base_data.since(&start_data).host_pages,
        cut_by_time,
        data: end_data.since(&base_data),
        log: end_log.since(&base_log),
        hot_writebacks: pool1.hot_writebacks - pool0.hot_writebacks,
        writebacks: pool1.writebacks - pool0.writebacks,
    }
    .figures())
}
