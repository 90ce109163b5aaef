//! `dana bench ycsb --quick --json` end to end: load, run a workload,
//! print JSON with every figure and the per-operation breakdown.

use crate::common;

use common::{has, run};
use serde_json::Value;

const RUN: &[&str] = &[
    "workload",
    "mix",
    "load",
    "pool_fraction",
    "pool_bytes",
    "data_over_pool",
    "records_at_end",
    "scanned_records_per_s",
    "per_op",
    "seconds",
    "ops",
    "ops_per_s",
    "errors",
    "latency",
    "engine_reads_per_s",
    "engine_writes_per_s",
    "reads_per_op",
    "hit_rate",
    "cpu_us_per_op",
    "cpu_us_per_io",
    "miss",
    "timeline",
];

fn ycsb(workload: &str, path: &str) -> Value {
    ycsb_with(workload, path, "off")
}

fn ycsb_with(workload: &str, path: &str, durability: &str) -> Value {
    ycsb_in_mode(workload, path, durability, "in-place")
}

fn ycsb_in_mode(workload: &str, path: &str, durability: &str, mode: &str) -> Value {
    run(&[
        "bench",
        "ycsb",
        "--durability",
        durability,
        "--workload",
        workload,
        "--quick",
        "--json",
        "--records",
        "20000",
        "--seconds",
        "1",
        "--warmup",
        "0.3",
        "--tasks-per-worker",
        "16",
        "--path",
        path,
        "--write-mode",
        mode,
    ])
}

fn check_run(r: &Value, kinds: &[&str]) {
    has(r, RUN);
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["ops"].as_u64().unwrap() > 0);
    for k in kinds {
        let f = &r["per_op"][k];
        has(f, &["count", "ops_per_s", "latency"]);
        has(
            &f["latency"],
            &["count", "mean_us", "p50_us", "p99_us", "p999_us"],
        );
        assert!(f["count"].as_u64().unwrap() > 0, "no {k} ops: {r}");
    }
}

#[test]
fn ycsb_a_then_e_quick() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("db");
    let p = path.to_str().unwrap();

    let v = ycsb("a", p);
    has(
        &v,
        &[
            "machine",
            "workers",
            "key_bytes",
            "value_size",
            "files",
            "runs",
        ],
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    check_run(&runs[0], &["read", "update"]);
    assert!(runs[0]["per_op"].get("insert").is_none());
    assert_eq!(runs[0]["load"]["loaded_now"], true);
    assert_eq!(runs[0]["records_at_end"], 20000);
    assert!(dir.path().join("bench-out/ycsb-a.csv").exists());

    // E reuses the load and inserts; the marker follows the new count.
    let v = ycsb("e", p);
    let r = &v["runs"][0];
    check_run(r, &["scan", "insert"]);
    assert_eq!(r["load"]["loaded_now"], false);
    assert!(r["scanned_records_per_s"].as_f64().unwrap() > 0.0);
    let end = r["records_at_end"].as_u64().unwrap();
    assert!(end > 20000, "E inserted nothing: {r}");
    let marker = std::fs::read_to_string(path.join("LOADED")).unwrap();
    assert!(marker.ends_with(&format!("records={end}\n")), "{marker}");
}

/// The load goes into a database without a log; a synced run formats the
/// log and logs its updates; a log-off run after it reloads (a database
/// with a log keeps using it) and logs nothing.
#[test]
fn ycsb_loads_without_a_log_and_log_off_runs_stay_off() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("db");
    let p = path.to_str().unwrap();
    let v = ycsb_with("a", p, "sync");
    let r = &v["runs"][0];
    assert_eq!(r["load"]["loaded_now"], true, "{r}");
    assert!(r["log_bytes_per_op"].as_f64().unwrap() > 0.0, "{r}");
    assert!(path.join("dana.wal").exists());
    let v = ycsb_with("a", p, "off");
    let r = &v["runs"][0];
    assert_eq!(
        r["load"]["loaded_now"], true,
        "a log-off run on logged data: {r}"
    );
    assert_eq!(r["log_bytes_per_op"].as_f64().unwrap(), 0.0, "{r}");
    assert!(!path.join("dana.wal").exists());
    let v = ycsb_with("a", p, "off");
    assert_eq!(v["runs"][0]["load"]["loaded_now"], false, "reused");
}

/// `--write-mode`: the data loaded out of place (compressed), a synced
/// run on it, the mode in the report; a run asking in place reloads.
#[test]
fn ycsb_runs_out_of_place_and_a_change_of_mode_reloads() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("db");
    let p = path.to_str().unwrap();
    let v = ycsb_in_mode("a", p, "sync", "out-of-place-lz4");
    assert_eq!(v["write_mode"], "oop-lz4", "{v}");
    let r = &v["runs"][0];
    check_run(r, &["read", "update"]);
    assert_eq!(r["load"]["loaded_now"], true, "{r}");
    let again = ycsb_in_mode("a", p, "sync", "out-of-place-lz4");
    assert_eq!(again["runs"][0]["load"]["loaded_now"], false, "reused");
    let v = ycsb_in_mode("a", p, "sync", "in-place");
    assert_eq!(v["write_mode"], "in-place", "{v}");
    assert_eq!(
        v["runs"][0]["load"]["loaded_now"], true,
        "reloaded in place"
    );
}
