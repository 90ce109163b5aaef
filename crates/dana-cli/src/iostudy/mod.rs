//! `dana iostudy`: the HTAP I/O-stack study of Haas, Haubenschild and Leis,
//! "Exploiting Directly-Attached NVMe Arrays in DBMS" (CIDR 2020), run on
//! dana's I/O layer.
//!
//! Sweeps: `table2` (the paper's Table 2 rows 1-5 as they map to this
//! machine), `pagesize` (Figure 3: 4/16/64 KiB), `width` (array width),
//! `depth` (4 KiB O_DIRECT random reads through io_uring at depth 1..256),
//! `fio` (fio and dana side by side on the same file), `all`.
//! Every figure in one invocation is measured on the same machine state, so
//! ratios between rows hold even when absolute numbers move.

mod data;
mod fio;
mod mix;
pub mod reads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dana::io::device::DeviceOptions;
use dana::io::Device;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::report::{num, Machine, Table};
use crate::{CliError, CliResult};
use mix::{Interface, MixConfig, MixParams, MixRow};
use reads::ReadRun;

/// Which configurations to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sweep {
    /// The paper's Table 2 rows 1-5.
    Table2,
    /// Page sizes 4, 16, 64 KiB with io_uring + O_DIRECT (Figure 3).
    Pagesize,
    /// Array width 1..N with io_uring + O_DIRECT.
    Width,
    /// 4 KiB O_DIRECT random reads via io_uring, depth 1..256, one thread.
    Depth,
    /// fio vs dana: 4 KiB random reads at depth 32 and 1.
    Fio,
    /// All of the above.
    All,
}

/// Arguments of `dana iostudy`.
#[derive(Args, Debug, Clone)]
pub struct IostudyArgs {
    /// Measured seconds per configuration [default: 10; 2 with --quick].
    #[arg(long, value_parser = crate::bench::parse_window)]
    pub seconds: Option<f64>,
    /// Short run: ~2 s per configuration and 256 MiB of data.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the data files, WAL file and fill markers.
    #[arg(long, default_value = "./dana-data/iostudy")]
    pub path: PathBuf,
    /// A data device (file or block device; repeatable). Default: files
    /// data-0.. in --path. Block devices are overwritten.
    #[arg(long = "device")]
    pub devices: Vec<PathBuf>,
    /// GiB of data per device (written once before reading)
    /// [default: 4; 0.25 with --quick].
    #[arg(long)]
    pub data_gib: Option<f64>,
    /// Page size in bytes for the mix rows.
    #[arg(long, default_value_t = 16384)]
    pub page_size: u64,
    /// Which configurations to run.
    #[arg(long, value_enum, default_value_t = Sweep::Table2)]
    pub sweep: Sweep,
    /// Background write target in MB/s (0 turns the class off).
    #[arg(long, default_value_t = 250.0)]
    pub bg_write_mbps: f64,
    /// WAL write target in MB/s (0 turns the class off).
    #[arg(long, default_value_t = 250.0)]
    pub wal_mbps: f64,
    /// No fdatasync after WAL writes in any row (row 1 then equals row 2).
    #[arg(long)]
    pub no_fsync: bool,
    /// Scan threads for the blocking interface (the paper uses 128).
    #[arg(long, default_value_t = 128)]
    pub scan_threads: usize,
    /// Scan requests in flight for async interfaces.
    #[arg(long, default_value_t = 128)]
    pub scan_depth: u32,
    /// Scan refill batch for async interfaces.
    #[arg(long, default_value_t = 32)]
    pub scan_batch: u32,
    /// Widest array of the width sweep when data files live in --path.
    #[arg(long, default_value_t = 2)]
    pub width_max: usize,
    /// Do not drop the OS page cache before page-cache rows.
    #[arg(long)]
    pub no_drop_caches: bool,
    /// fio binary for the fio sweep.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// One fio-vs-dana comparison at one depth.
#[derive(Debug, Clone, Serialize)]
pub struct FioRow {
    pub depth: u32,
    pub fio: fio::FioRun,
    pub dana: ReadRun,
    /// dana IOPS / fio IOPS.
    pub iops_ratio: f64,
    /// dana mean latency / fio mean latency.
    pub lat_ratio: f64,
    /// dana CPU per I/O / fio CPU per I/O.
    pub cpu_ratio: f64,
}

/// Everything one invocation measured (the `--json` document).
#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub sweep: Sweep,
    pub seconds_per_config: f64,
    pub data_bytes_per_device: u64,
    pub devices: Vec<PathBuf>,
    pub wal: PathBuf,
    pub page_size: u64,
    pub bg_write_target_mbps: f64,
    pub wal_target_mbps: f64,
    pub mix_rows: Vec<MixRow>,
    pub depth_rows: Vec<ReadRun>,
    pub fio_rows: Vec<FioRow>,
    pub fio_version: Option<String>,
    pub notes: Vec<String>,
}

fn table2_rows(args: &IostudyArgs, width: usize) -> Vec<MixConfig> {
    let fsync1 = !args.no_fsync;
    let row = |id: &str, label: &str, interface, direct, wal_fsync| MixConfig {
        sweep: "table2",
        id: id.into(),
        label: label.into(),
        interface,
        direct,
        wal_fsync,
        page_size: args.page_size,
        width,
    };
    vec![
        row(
            "1",
            "baseline: page cache, fdatasync",
            Interface::Blocking,
            false,
            fsync1,
        ),
        row("2", "- fdatasync", Interface::Blocking, false, false),
        row("3", "+ async I/O", Interface::Uring, false, false),
        row("4", "+ O_DIRECT", Interface::Uring, true, false),
        row("5", "+ SQPOLL (scan)", Interface::UringSqpoll, true, false),
    ]
}

/// Runs the study.
pub fn run(args: &IostudyArgs) -> CliResult<()> {
    let seconds = args.seconds.unwrap_or(if args.quick { 2.0 } else { 10.0 });
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(CliError(format!("--seconds {seconds} must be > 0")));
    }
    let data_gib = args.data_gib.unwrap_or(if args.quick { 0.25 } else { 4.0 });
    if !(data_gib > 0.0 && data_gib.is_finite()) {
        return Err(CliError(format!("--data-gib {data_gib} must be > 0")));
    }
    if !args.page_size.is_power_of_two() || args.page_size < 4096 {
        return Err(CliError(format!(
            "--page-size {} must be a power of two >= 4096",
            args.page_size
        )));
    }
    let duration = Duration::from_secs_f64(seconds);
    let data_bytes = (data_gib * (1u64 << 30) as f64) as u64;
    let sweeps = |s: Sweep| args.sweep == s || args.sweep == Sweep::All;
    let machine = Machine::probe();
    let quiet = args.quiet || args.json;
    let say = |m: &str| {
        if !args.quiet {
            eprintln!("{m}");
        }
    };

    let devices: Vec<PathBuf> = if args.devices.is_empty() {
        let n = if sweeps(Sweep::Width) {
            args.width_max.max(1)
        } else {
            1
        };
        (0..n)
            .map(|i| args.path.join(format!("data-{i}")))
            .collect()
    } else {
        args.devices.clone()
    };
    let wal_bytes = (data_bytes / 4).clamp(4 << 20, 1 << 30);
    let data = data::prepare(
        &args.path,
        &devices,
        data_bytes,
        args.path.join("wal"),
        wal_bytes,
        &say,
    )?;
    let table_width = if args.devices.is_empty() {
        1
    } else {
        devices.len()
    };

    let params = MixParams {
        duration,
        scan_depth: args.scan_depth.max(1),
        scan_batch: args.scan_batch.max(1),
        scan_threads: args.scan_threads,
        bg_write_bytes_per_sec: args.bg_write_mbps.max(0.0) * 1e6,
        wal_bytes_per_sec: args.wal_mbps.max(0.0) * 1e6,
        cpu_hz: machine.cpu_hz,
    };
    let mut configs = Vec::new();
    if sweeps(Sweep::Table2) {
        configs.extend(table2_rows(args, table_width));
    }
    if sweeps(Sweep::Pagesize) {
        for kib in [4u64, 16, 64] {
            configs.push(MixConfig {
                sweep: "pagesize",
                id: format!("{kib}KiB"),
                label: format!("io_uring, O_DIRECT, {kib} KiB pages"),
                interface: Interface::Uring,
                direct: true,
                wal_fsync: false,
                page_size: kib * 1024,
                width: table_width,
            });
        }
    }
    if sweeps(Sweep::Width) {
        for w in 1..=devices.len() {
            configs.push(MixConfig {
                sweep: "width",
                id: format!("w{w}"),
                label: format!("io_uring, O_DIRECT, {w} device(s)"),
                interface: Interface::Uring,
                direct: true,
                wal_fsync: false,
                page_size: args.page_size,
                width: w,
            });
        }
    }

    let mut notes = vec![
        "MB = 10^6 bytes. cycles/byte = process CPU time (getrusage RUSAGE_SELF user+sys, all threads incl. io_uring workers/SQPOLL) x clock rate / bytes moved; the paper used system-wide perf.".to_string(),
        format!("clock rate {:.0} MHz from {}", machine.cpu_hz / 1e6, machine.cpu_hz_source),
        "SQPOLL row: only the scan's rings poll (one kernel thread per ring would starve a small machine); point/bg/WAL use plain io_uring.".to_string(),
    ];
    let ram = machine.ram_bytes;
    if ram > 0 && data_bytes * data.devices.len() as u64 <= ram {
        notes.push(format!(
            "page-cache rows (1-3): {} GiB of RAM holds the {:.2} GiB data set, so once warm they read from memory, not the device",
            ram >> 30,
            data_bytes as f64 / (1u64 << 30) as f64
        ));
    }

    let mut mix_rows = Vec::new();
    for cfg in &configs {
        if !cfg.direct && !args.no_drop_caches {
            if let Err(e) = data::drop_page_cache() {
                notes.push(format!(
                    "row {}: could not drop the page cache ({e})",
                    cfg.id
                ));
            }
        }
        let bar = progress(quiet, duration, &format!("{} {}", cfg.sweep, cfg.id));
        let row = mix::run_mix(cfg, &data, &params, &|el, bytes| {
            bar.set_position(el.as_millis() as u64);
            let s = el.as_secs_f64().max(1e-3);
            bar.set_message(format!("{:.0} MB/s", bytes as f64 / 1e6 / s));
        });
        bar.finish_and_clear();
        mix_rows.push(row?);
    }
    if mix_rows.iter().any(|r| r.page_cache) && !args.no_drop_caches {
        notes.push(
            "page-cache rows start after `echo 1 > /proc/sys/vm/drop_caches` (clean pages only)"
                .into(),
        );
    }

    let open_direct = || -> CliResult<Arc<Device>> {
        let opts = DeviceOptions {
            direct: true,
            create_size: None,
            read_only: true,
            lock: false,
        };
        Ok(Arc::new(Device::open(&data.devices[0], 0, opts)?))
    };
    let mut depth_rows = Vec::new();
    if sweeps(Sweep::Depth) {
        let dev = open_direct()?;
        for depth in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            let bar = progress(quiet, duration, &format!("depth {depth}"));
            let r = reads::random_reads(
                &dev,
                depth,
                4096,
                data.filled_bytes,
                duration,
                depth as u64,
                reads::Submit::Batch,
            );
            bar.finish_and_clear();
            depth_rows.push(r?);
        }
    }

    let mut fio_rows = Vec::new();
    let mut fio_version = None;
    if sweeps(Sweep::Fio) {
        fio_version = fio::version(&args.fio);
        match &fio_version {
            None => {
                let m = format!(
                    "fio comparison skipped: cannot run `{} --version` (is fio installed?)",
                    args.fio.display()
                );
                say(&m);
                notes.push(m);
            }
            Some(_) => {
                let dev = open_direct()?;
                for depth in [32u32, 1] {
                    let bar = progress(quiet, duration * 4, &format!("fio vs dana, depth {depth}"));
                    // ABBA order (fio, dana, dana, fio): a device that
                    // slows down or speeds up over time favours neither.
                    let run_fio = || {
                        fio::run(
                            &args.fio,
                            &data.devices[0],
                            data.filled_bytes,
                            depth,
                            duration,
                        )
                    };
                    let run_dana = |seed: u64| {
                        reads::random_reads(
                            &dev,
                            depth,
                            4096,
                            data.filled_bytes,
                            duration,
                            seed,
                            reads::Submit::Each,
                        )
                    };
                    let d = (|| {
                        let f1 = run_fio()?;
                        let d1 = run_dana(99 + depth as u64)?;
                        let d2 = run_dana(199 + depth as u64)?;
                        let f2 = run_fio()?;
                        Ok::<_, CliError>((f1.mean_with(&f2), d1.mean_with(&d2)))
                    })();
                    bar.finish_and_clear();
                    let (f, d) = d?;
                    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
                    fio_rows.push(FioRow {
                        depth,
                        iops_ratio: ratio(d.iops, f.iops),
                        lat_ratio: ratio(d.lat_mean_us, f.lat_mean_us),
                        cpu_ratio: ratio(d.cpu_us_per_io, f.cpu_us_per_io),
                        fio: f,
                        dana: d,
                    });
                }
            }
        }
    }

    let report = Report {
        machine,
        sweep: args.sweep,
        seconds_per_config: seconds,
        data_bytes_per_device: data.filled_bytes,
        devices: data.devices.clone(),
        wal: data.wal.clone(),
        page_size: args.page_size,
        bg_write_target_mbps: args.bg_write_mbps,
        wal_target_mbps: args.wal_mbps,
        mix_rows,
        depth_rows,
        fio_rows,
        fio_version,
        notes,
    };
    if args.json {
        let s = serde_json::to_string_pretty(&report).map_err(|e| CliError(e.to_string()))?;
        println!("{s}");
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn progress(quiet: bool, total: Duration, prefix: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar =
        ProgressBar::with_draw_target(Some(total.as_millis() as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix:>20} [{bar:30}] {elapsed:>3} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(prefix.to_string());
    bar
}

/// The human-readable report.
fn render(r: &Report) -> String {
    let m = &r.machine;
    let mut s = format!(
        "dana iostudy: {} x {} MiB data, {} s per configuration\nmachine: {} ({} CPUs, {:.0} MHz), Linux {}, {} GiB RAM\n\n",
        r.devices.len(),
        r.data_bytes_per_device >> 20,
        r.seconds_per_config,
        m.cpu_model,
        m.cpus,
        m.cpu_hz / 1e6,
        m.kernel,
        m.ram_bytes >> 30
    );
    if !r.mix_rows.is_empty() {
        s += &format!(
            "HTAP mix (scan depth 128 in batches of 32 / point reads depth 1 / bg writes {} MB/s / WAL {} MB/s)\n",
            r.bg_write_target_mbps, r.wal_target_mbps
        );
        let mut t = Table::new(
            &[
                "#",
                "configuration",
                "interface",
                "page",
                "scan MB/s",
                "point MB/s",
                "bg wr MB/s",
                "WAL MB/s",
                "total MB/s",
                "IOPS",
                "point p50 us",
                "point p99 us",
                "WAL lat us",
                "cycles/byte",
            ],
            3,
        );
        for x in &r.mix_rows {
            t.row(vec![
                x.id.clone(),
                x.label.clone(),
                x.interface.name().into(),
                format!("{}K", x.page_size / 1024),
                num(x.scan_mbps, 0),
                num(x.point_mbps, 1),
                num(x.bg_write_mbps, 0),
                num(x.wal_mbps, 1),
                num(x.total_mbps, 0),
                num(x.iops, 0),
                num(x.point_p50_us, 0),
                num(x.point_p99_us, 0),
                num(x.wal_mean_us, 0),
                num(x.cycles_per_byte, 2),
            ]);
        }
        s += &t.render();
        s.push('\n');
    }
    if !r.depth_rows.is_empty() {
        s += "4 KiB O_DIRECT random reads, io_uring, one thread\n";
        let mut t = Table::new(
            &[
                "depth",
                "IOPS",
                "MB/s",
                "mean us",
                "p50 us",
                "p99 us",
                "CPU us/IO",
            ],
            0,
        );
        for x in &r.depth_rows {
            t.row(vec![
                x.depth.to_string(),
                num(x.iops, 0),
                num(x.mbps, 0),
                num(x.lat_mean_us, 1),
                num(x.lat_p50_us, 1),
                num(x.lat_p99_us, 1),
                num(x.cpu_us_per_io, 2),
            ]);
        }
        s += &t.render();
        s.push('\n');
    }
    if !r.fio_rows.is_empty() {
        s += &format!(
            "fio ({}) vs dana: 4 KiB O_DIRECT random reads, io_uring, one thread, same file\n",
            r.fio_version.as_deref().unwrap_or("?")
        );
        let mut t = Table::new(
            &[
                "depth",
                "fio IOPS",
                "dana IOPS",
                "ratio",
                "fio mean us",
                "dana mean us",
                "ratio",
                "fio CPU us/IO",
                "dana CPU us/IO",
                "ratio",
            ],
            0,
        );
        for x in &r.fio_rows {
            t.row(vec![
                x.depth.to_string(),
                num(x.fio.iops, 0),
                num(x.dana.iops, 0),
                num(x.iops_ratio, 3),
                num(x.fio.lat_mean_us, 1),
                num(x.dana.lat_mean_us, 1),
                num(x.lat_ratio, 3),
                num(x.fio.cpu_us_per_io, 2),
                num(x.dana.cpu_us_per_io, 2),
                num(x.cpu_ratio, 3),
            ]);
        }
        s += &t.render();
        s += "fio CPU/IO = (usr_cpu + sys_cpu)% x runtime / I/Os; dana CPU/IO = getrusage user+sys / I/Os.\n\n";
    }
    for n in &r.notes {
        s += &format!("note: {n}\n");
    }
    s
}
