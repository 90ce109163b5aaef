//! `dana bench lookup --quick` and `dana bench pages --quick` end to end:
//! they load, measure the device limit, run, and print JSON with every
//! figure.

use crate::common;

use common::{has, run};

const MEASURED: &[&str] = &[
    "seconds",
    "ops",
    "ops_per_s",
    "errors",
    "latency",
    "engine_reads_per_s",
    "engine_read_mb_per_s",
    "reads_per_op",
    "hit_rate",
    "cpu_s",
    "cpu_us_per_op",
    "cpu_us_per_io",
    "miss",
    "miss_queued",
    "miss_device",
    "miss_resume",
    "ops_per_cpu_s",
    "budget",
    "timeline",
];

#[test]
fn lookup_quick_runs_and_reports_every_figure() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("db");
    let p = path.to_str().unwrap();
    let args = [
        "bench",
        "lookup",
        "--quick",
        "--json",
        "--records",
        "50000",
        "--path",
        p,
        "--pool-fraction",
        "0.2,0.05",
    ];
    let v = run(&args);
    has(
        &v,
        &[
            "machine",
            "load",
            "device_limit",
            "runs",
            "in_memory",
            "files",
            "sweep_before",
            "sweep_after",
        ],
    );
    // The device limit is the lower of the two sweeps' best.
    let best = |w: &str| v[w]["best"]["iops"].as_f64().unwrap();
    let limit = v["device_limit"]["iops"].as_f64().unwrap();
    assert_eq!(limit, best("sweep_before").min(best("sweep_after")));
    assert_eq!(v["sweep_before"]["points"].as_array().unwrap().len(), 6);
    assert_eq!(v["device_budget"], "auto");
    assert_eq!(v["runs"][0]["budget"]["adaptive"], true);
    assert_eq!(v["load"]["records"], 50000);
    assert_eq!(v["load"]["loaded_now"], true);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        has(r, MEASURED);
        has(
            r,
            &[
                "pool_fraction",
                "pool_bytes",
                "data_over_pool",
                "iops_vs_limit",
            ],
        );
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0);
        assert!(
            r["engine_reads_per_s"].as_f64().unwrap() > 0.0,
            "a small pool must read"
        );
    }
    let mem = &v["in_memory"];
    has(mem, MEASURED);
    assert!(mem["hit_rate"].as_f64().unwrap() > 0.99, "{mem}");
    // Timeline files were written next to the database directory.
    assert!(dir.path().join("bench-out/lookup-pool0.200.csv").exists());
    assert!(dir.path().join("bench-out/lookup-pool0.200.svg").exists());
    assert!(dir.path().join("bench-out/lookup-sweep.svg").exists());

    // A second run reuses the loaded data.
    let v = run(&args);
    assert_eq!(v["load"]["loaded_now"], false);
}

#[test]
fn pages_quick_runs_and_reports_every_figure() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("pages");
    let v = run(&[
        "bench",
        "pages",
        "--quick",
        "--json",
        "--pool-mib",
        "2",
        "--path",
        path.to_str().unwrap(),
    ]);
    has(
        &v,
        &[
            "pages",
            "pool_bytes",
            "data_bytes",
            "device_limit",
            "iops_vs_limit",
            "sweep_before",
            "sweep_after",
            "run",
        ],
    );
    has(&v["run"], MEASURED);
    assert_eq!(v["run"]["errors"], 0);
    assert!(v["run"]["engine_reads_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn lookup_on_two_devices() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (a, b) = (dir.path().join("dev-a"), dir.path().join("dev-b"));
    let out = dir.path().join("run");
    let v = run(&[
        "bench",
        "lookup",
        "--quick",
        "--json",
        "--records",
        "30000",
        "--memory-seconds",
        "0",
        "--path",
        out.to_str().unwrap(),
        "--device",
        a.to_str().unwrap(),
        "--device",
        b.to_str().unwrap(),
    ]);
    assert_eq!(v["files"].as_array().unwrap().len(), 2);
    assert!(a.exists() && b.exists(), "the devices hold the database");
    assert!(!out.join("dana.0").exists(), "no database files in --path");
    assert_eq!(v["runs"][0]["errors"], 0);
    assert!(v["runs"][0]["engine_reads_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn blob_quick_writes_and_reads_values_next_to_the_raw_device() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("blob");
    let v = run(&[
        "bench",
        "blob",
        "--quick",
        "--json",
        "--sizes",
        "4KiB,256KiB",
        "--seconds",
        "0.5",
        "--max-bytes",
        "16MiB",
        "--pool-bytes",
        "2MiB",
        "--path",
        path.to_str().unwrap(),
    ]);
    has(&v, &["machine", "pool_bytes", "durability", "sizes"]);
    assert_eq!(v["durability"], "sync");
    let sizes = v["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2);
    for s in sizes {
        has(
            s,
            &[
                "value_bytes",
                "clients",
                "raw_write",
                "dana_write",
                "write_ratio",
                "data_bytes",
                "dana_read",
                "raw_read",
                "read_ratio",
            ],
        );
        // Every value the reads picked was checked (a wrong one fails the
        // command); the data read is several times the pool.
        for phase in ["raw_write", "dana_write", "dana_read", "raw_read"] {
            assert!(s[phase]["values"].as_u64().unwrap() > 0, "{phase}: {s}");
            assert!(s[phase]["mb_per_s"].as_f64().unwrap() > 0.0, "{phase}: {s}");
        }
        // One data sync per value (a checkpoint in the window adds its own).
        let syncs = s["dana_write"]["data_syncs_per_value"].as_f64().unwrap();
        assert!((1.0..1.5).contains(&syncs), "{syncs} data syncs per value");
        assert!(s["data_bytes"].as_u64().unwrap() >= 4 * (2 << 20));
    }
    // The directory is left empty of data: values are not kept.
    assert!(std::fs::read_dir(&path).unwrap().next().is_none());
}

/// `dana bench waf --json` of YCSB-A on a small device (224 blocks, a
/// 4 MiB log, one device of warm-up and one measured, 16 tasks), with
/// `extra` arguments.
fn small_waf(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "waf",
        "--json",
        "--quiet",
        "--workloads",
        "ycsb-a",
        "--blocks",
        "224",
        "--log-bytes",
        "4194304",
        "--warmup-devices",
        "1",
        "--measure-devices",
        "1",
        "--tasks",
        "16",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// `dana bench waf` on a small modelled device: every figure is there, the
/// fill reached is near the one asked, flash writes are at least the host
/// writes, a fuller device amplifies more (the collector finds fewer
/// invalid pages per victim), and each fill runs with one stream and with
/// a handle per write class, at the same fill, with page write-backs
/// sorted into hot and cold.
#[test]
fn waf_runs_and_a_fuller_device_amplifies_more() {
    let v = small_waf(&["--write-mode", "in-place", "--fills", "50,90"]);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 4);
    for (r, (fill, placement)) in
        runs.iter()
            .zip([(50, "none"), (50, "classes"), (90, "none"), (90, "classes")])
    {
        assert_eq!(r["fill_percent"], fill);
        assert_eq!(r["placement"], placement);
        let hot = r["hot_share"].as_f64().unwrap();
        assert!(hot > 0.0 && hot < 1.0, "hot share {hot}");
    }
    for pair in runs.chunks(2) {
        assert_eq!(pair[0]["records"], pair[1]["records"], "same load");
    }
    for r in runs {
        has(
            r,
            &[
                "fill_reached",
                "records",
                "pool_bytes",
                "ops",
                "ops_per_s",
                "data",
                "log",
                "waf_total",
                "flash_bytes_per_op",
                "page_writes_per_update",
            ],
        );
        let want = r["fill_percent"].as_f64().unwrap() / 100.0;
        let got = r["fill_reached"].as_f64().unwrap();
        assert!((got - want).abs() < 0.03, "fill {got} for {want}");
        assert!(r["ops"].as_u64().unwrap() > 0);
        assert!(!r["cut_by_time"].as_bool().unwrap(), "{r}");
        for d in ["data", "log"] {
            let f = &r[d];
            assert!(f["waf"].as_f64().unwrap() >= 1.0, "{d}: {f}");
            assert!(
                f["flash_bytes_per_op"].as_f64().unwrap()
                    >= f["host_bytes_per_op"].as_f64().unwrap()
            );
        }
    }
    let waf = |i: usize| runs[i]["data"]["waf"].as_f64().unwrap();
    assert!(
        waf(2) > waf(0) + 0.5,
        "90% fill {} vs 50% {}",
        waf(2),
        waf(0)
    );
}

/// `dana bench waf --untorn-writes`: in place on data devices that write
/// 4 KiB untorn, the log holds no torn-page images, so it is a fraction of
/// the same run's log on plain devices.
#[test]
fn waf_untorn_writes_log_no_torn_page_images() {
    let log_per_op = |untorn: bool| {
        let mut args = vec![
            "--placement",
            "classes",
            "--write-mode",
            "in-place",
            "--fills",
            "60",
        ];
        if untorn {
            args.push("--untorn-writes");
        }
        let v = small_waf(&args);
        assert_eq!(v["untorn_writes"].as_bool(), Some(untorn));
        v["runs"][0]["log"]["host_bytes_per_op"].as_f64().unwrap()
    };
    let (untorn, plain) = (log_per_op(true), log_per_op(false));
    // ~4.2x alone (392-401 against 1,680 bytes); 2.49x once in a CI run
    // with the other bench tests beside it (833 against 2,074: commits
    // that wait for the CPU flush fewer per block, and each op pays more
    // padding either way).
    assert!(
        untorn > 0.0 && untorn * 2.0 < plain,
        "log bytes per op: {untorn} untorn, {plain} plain"
    );
}

/// `dana bench waf --write-mode in-place,out-of-place,out-of-place-lz4`:
/// YCSB-A on the same device and load, pages in place, in dana's segments
/// and compressed in them: out of place, with a handle per class, the FTL
/// below copies (almost) nothing, dana's summaries are written, pages
/// compress, and every figure is there.
#[test]
fn waf_out_of_place_runs_beside_in_place() {
    let v = small_waf(&[
        "--placement",
        "classes",
        "--write-mode",
        "in-place,out-of-place,out-of-place-lz4",
        "--fills",
        "60",
    ]);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[0]["write_mode"], "in-place");
    assert_eq!(runs[1]["write_mode"], "out-of-place");
    assert_eq!(runs[2]["write_mode"], "out-of-place-lz4");
    assert_eq!(runs[0]["records"], runs[1]["records"], "same load");
    assert_eq!(runs[0]["records"], runs[2]["records"], "same load");
    // Values half random, half repeated: pages compress, and the
    // compressed run writes fewer flash bytes per operation.
    let ratio = runs[2]["compression"].as_f64().unwrap();
    assert!(ratio > 1.3, "compression {ratio}");
    assert_eq!(runs[1]["compression"].as_f64().unwrap(), 1.0);
    let flash = |i: usize| runs[i]["data"]["flash_bytes_per_op"].as_f64().unwrap();
    assert!(flash(2) < flash(1), "{} vs {}", flash(2), flash(1));
    let oop = &runs[1];
    assert!(oop["ops"].as_u64().unwrap() > 0, "{oop}");
    assert!(
        oop["summary_writes_per_op"].as_f64().unwrap() > 0.0,
        "{oop}"
    );
    assert!(
        oop["dana_gc_copies_per_op"].as_f64().unwrap() >= 0.0,
        "{oop}"
    );
    let ftl = oop["data"]["waf"].as_f64().unwrap();
    assert!(
        ftl < 1.1,
        "whole segments die whole on the flash: FTL WAF {ftl}"
    );
    assert_eq!(runs[0]["summary_writes_per_op"].as_f64().unwrap(), 0.0);
}

/// `dana bench waf --workloads tpcc`: TPC-C on a device sized to its data,
/// both placements starting from a copy of one load (the same fill), the
/// data growing through the window, every figure there.
#[test]
fn waf_tpcc_runs_both_placements_on_one_load() {
    let args = [
        "bench",
        "waf",
        "--json",
        "--quiet",
        "--workloads",
        "tpcc",
        "--write-mode",
        "in-place,out-of-place",
        "--fills",
        "60",
        "--warmup-devices",
        "0.3",
        "--measure-devices",
        "0.3",
        "--tasks",
        "16",
    ];
    let v = run(&args);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(
        runs.len(),
        4,
        "two placements, each in place and out of place"
    );
    for r in &runs[1..] {
        assert_eq!(runs[0]["records"], r["records"], "one load");
        assert_eq!(runs[0]["device_bytes"], r["device_bytes"]);
    }
    for (r, mode) in runs.iter().zip(["in-place", "out-of-place"].iter().cycle()) {
        assert_eq!(r["write_mode"], *mode);
        let summaries = r["summary_writes_per_op"].as_f64().unwrap();
        assert_eq!(summaries > 0.0, *mode == "out-of-place", "{r}");
    }
    for r in runs {
        assert_eq!(r["workload"], "tpcc");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        let (start, end) = (
            r["fill_reached"].as_f64().unwrap(),
            r["fill_end"].as_f64().unwrap(),
        );
        assert!(
            start > 0.4 && start < 0.7 && end >= start,
            "{start} -> {end}"
        );
        for d in ["data", "log"] {
            let f = &r[d];
            assert!(f["waf"].as_f64().unwrap() >= 1.0, "{d}: {f}");
        }
    }
    // The window starts after a warm-up whose growth depends on when
    // checkpoints hand freed pages back (wall-clock and log-fill driven):
    // under a loaded CI machine runs of one load have started 0.056 apart.
    let start = |i: usize| runs[i]["fill_reached"].as_f64().unwrap();
    assert!(
        (start(0) - start(1)).abs() < 0.12,
        "{} vs {}",
        start(0),
        start(1)
    );
}

/// The simulated array: no files, the simulator's rate as the limit, the
/// CPU per lookup reported; peers (which need files) are refused.
#[test]
fn lookup_on_simulated_devices() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = dir.path().join("run");
    let p = out.to_str().unwrap();
    let v = run(&[
        "bench",
        "lookup",
        "--quick",
        "--json",
        "--records",
        "30000",
        "--memory-seconds",
        "0",
        "--sim-devices",
        "4",
        "--sim-iops",
        "200000",
        "--sim-latency-us",
        "50",
        "--device-budget",
        "16",
        "--path",
        p,
    ]);
    assert!(v["files"].as_array().unwrap().is_empty());
    assert_eq!(v["sim"]["devices"], 4);
    assert!(v["sweep_before"].is_null(), "no raw sweep on a simulator");
    assert!(!out.join("dana.0").exists(), "no database files");
    let r = &v["runs"][0];
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["ops_per_cpu_s"].as_f64().unwrap() > 0.0);
    let ratio = r["iops_vs_limit"].as_f64().unwrap();
    let reads = r["engine_reads_per_s"].as_f64().unwrap();
    assert!(
        (ratio - reads / 800_000.0).abs() < 1e-9,
        "{ratio} vs {reads}"
    );
    assert_eq!(r["budget"]["adaptive"], false);
    assert_eq!(r["budget"]["limits"], serde_json::json!([16, 16, 16, 16]));

    let failed = run_failing(&[
        "bench",
        "lookup",
        "--quick",
        "--sim-devices",
        "2",
        "--engines",
        "dana,rocksdb",
        "--path",
        p,
    ]);
    assert!(failed.contains("--sim-devices runs dana alone"), "{failed}");
}

/// Runs `dana args...`, asserts it fails, returns its stderr.
fn run_failing(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dana"))
        .args(args)
        .output()
        .expect("run dana");
    assert!(!out.status.success(), "dana {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `bench pages` on the simulated array: no sweep, the simulator's rate
/// as the limit, nothing read wrong.
#[test]
fn pages_on_simulated_devices() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("pages");
    let v = run(&[
        "bench",
        "pages",
        "--quick",
        "--json",
        "--pool-mib",
        "2",
        "--sim-devices",
        "2",
        "--path",
        path.to_str().unwrap(),
    ]);
    assert_eq!(v["sim"]["devices"], 2);
    assert!(v["device_limit"].is_null() && v["sweep_before"].is_null());
    assert!(!path.join("dana.0").exists(), "no database files");
    assert_eq!(v["run"]["errors"], 0);
    let reads = v["run"]["engine_reads_per_s"].as_f64().unwrap();
    assert!(reads > 0.0);
    let ratio = v["iops_vs_limit"].as_f64().unwrap();
    assert!((ratio - reads / 3_000_000.0).abs() < 1e-9);
}

/// `dana bench mirror --quick`: every layout measured, reads of the
/// mirrored pair spread over both copies (more device reads than one
/// device's limit allows), and the copy failing mid-run costs no client an
/// error and ends failed in the labels.
#[test]
fn mirror_quick_compares_the_layouts_and_survives_a_failing_copy() {
    let v = run(&[
        "bench",
        "mirror",
        "--quick",
        "--json",
        "--records",
        "60000",
        "--seconds",
        "0.5",
    ]);
    let runs = v["runs"].as_array().unwrap();
    let layouts: Vec<_> = runs.iter().map(|r| r["layout"].as_str().unwrap()).collect();
    assert_eq!(
        layouts,
        ["single", "striped", "mirrored", "mirrored_failing"]
    );
    let mirrored = &runs[2];
    assert!(mirrored["reads"]["ops_per_s"].as_f64().unwrap() > 0.0);
    // Reads spread over both copies (throughput depends on this machine's
    // load; the share each copy served does not).
    let copy_reads: Vec<f64> = mirrored["copy_reads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_f64().unwrap())
        .collect();
    let total: f64 = copy_reads.iter().sum();
    assert!(
        copy_reads.len() == 2 && copy_reads.iter().all(|&r| r > 0.25 * total),
        "reads did not spread over both copies: {mirrored}"
    );
    assert!(mirrored["commits"]["ops_per_s"].as_f64().unwrap() > 0.0);
    let failing = &runs[3];
    assert_eq!(failing["after_failure"]["errors"], 0, "{failing}");
    assert!(failing["after_failure"]["ops_per_s"].as_f64().unwrap() > 0.0);
    let states = failing["states_after"].to_string();
    assert!(states.contains("Failed"), "{states}");
}

/// A bench or crashtest pointed at a directory it did not make refuses it
/// and deletes nothing: a directory of the user's files (`bench commit`,
/// `bench tpcc`, `crashtest --dir`), a real database (`bench lookup`,
/// which reloads into its `--path`). The first version removed whatever
/// `--path` named.
#[test]
fn benches_never_clear_a_directory_they_did_not_make() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let user = dir.path().join("user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("notes.txt"), b"mine").unwrap();
    std::fs::write(user.join("dana.toml"), b"[mine]").unwrap();
    let db = dir.path().join("db");
    {
        let d = dana::Db::open(&db, dana::Options::default().pool_bytes(8 << 20)).unwrap();
        d.tree_or_create("t").unwrap().put(b"k", b"v").unwrap();
        d.close().unwrap();
    }
    let refused = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dana"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} ran");
        assert!(err.contains("refusing"), "{args:?}: {err}");
    };
    let u = user.to_str().unwrap();
    // The reloading benches too: the first version refused only a
    // directory holding `dana.0`, marked any other as a bench's, deleted
    // its `dana.*` files, and the next `bench commit` there removed it.
    refused(&["bench", "lookup", "--quick", "--path", u]);
    refused(&["bench", "pages", "--quick", "--path", u]);
    refused(&["bench", "ycsb", "--workload", "c", "--quick", "--path", u]);
    assert_eq!(std::fs::read(user.join("dana.toml")).unwrap(), b"[mine]");
    refused(&["bench", "commit", "--path", u, "--seconds", "0.2"]);
    refused(&["bench", "tpcc", "--path", u, "--seconds", "1"]);
    refused(&["crashtest", "--dir", u, "--points", "0", "--kills", "1"]);
    assert_eq!(std::fs::read(user.join("notes.txt")).unwrap(), b"mine");
    refused(&["bench", "lookup", "--quick", "--path", db.to_str().unwrap()]);
    let d = dana::Db::open(&db, dana::Options::default().pool_bytes(8 << 20)).unwrap();
    assert_eq!(d.tree("t").unwrap().get(b"k").unwrap(), Some(b"v".to_vec()));
    d.close().unwrap();
}
