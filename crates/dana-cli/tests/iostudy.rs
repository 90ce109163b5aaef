//! Runs the built `dana iostudy --quick --json` on a tiny data set in a
//! temporary directory and checks the report has every row and field with
//! plausible values.

use std::process::Command;

use serde_json::Value;

fn num(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("field {field} missing or not a number in {row}"))
}

#[test]
fn iostudy_quick_json_has_every_row_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dana"))
        .args([
            "iostudy",
            "--quick",
            "--json",
            "--quiet",
            "--no-drop-caches",
        ])
        .args([
            "--sweep",
            "all",
            // Half a second a window: at 0.25 s a row once ended with
            // no point read done, under the suite's load.
            "--seconds",
            "0.5",
            "--data-gib",
            "0.03125",
        ])
        .args(["--scan-threads", "16", "--width-max", "2"])
        .arg("--path")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dana iostudy failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));

    assert_eq!(report["data_bytes_per_device"].as_u64(), Some(32 << 20));
    assert!(num(&report["machine"], "cpu_hz") > 0.0);

    let rows = report["mix_rows"].as_array().expect("mix_rows");
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["1", "2", "3", "4", "5", "4KiB", "16KiB", "64KiB", "w1", "w2"],
        "rows"
    );
    for r in rows {
        assert!(r["scan_bytes"].as_u64().unwrap() > 0, "no scan bytes: {r}");
        assert!(
            r["point_bytes"].as_u64().unwrap() > 0,
            "no point reads: {r}"
        );
        for f in [
            "scan_mbps",
            "point_mbps",
            "bg_write_mbps",
            "wal_mbps",
            "total_mbps",
            "iops",
            "point_p50_us",
            "point_p99_us",
            "wal_mean_us",
            "cpu_seconds",
            "cycles_per_byte",
            "seconds",
        ] {
            let v = num(r, f);
            assert!(v.is_finite() && v >= 0.0, "{f} = {v} in {r}");
        }
        assert!(num(r, "point_p99_us") >= num(r, "point_p50_us"));
        assert!(num(r, "total_mbps") >= num(r, "scan_mbps"));
        assert!(num(r, "seconds") >= 0.25);
    }
    assert_eq!(rows[0]["wal_fsync"], Value::Bool(true));
    assert_eq!(rows[0]["page_cache"], Value::Bool(true));
    assert_eq!(rows[0]["scan_threads"].as_u64(), Some(16));
    assert_eq!(rows[3]["page_cache"], Value::Bool(false));
    assert_eq!(rows[9]["width"].as_u64(), Some(2));

    let depths: Vec<u64> = report["depth_rows"]
        .as_array()
        .expect("depth_rows")
        .iter()
        .map(|r| {
            assert!(num(r, "iops") > 0.0 && num(r, "lat_mean_us") > 0.0, "{r}");
            r["depth"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(depths, [1, 2, 4, 8, 16, 32, 64, 128, 256]);

    // fio rows when fio is installed; a note otherwise.
    let fio = report["fio_rows"].as_array().expect("fio_rows");
    if report["fio_version"].is_null() {
        assert!(fio.is_empty());
    } else {
        assert_eq!(fio.len(), 2);
        for r in fio {
            assert!(
                num(&r["fio"], "iops") > 0.0 && num(&r["dana"], "iops") > 0.0,
                "{r}"
            );
            assert!(num(r, "iops_ratio") > 0.0 && num(r, "lat_ratio") > 0.0);
        }
    }

    // A second run reuses the filled data (no "filling" message).
    let again = Command::new(env!("CARGO_BIN_EXE_dana"))
        .args([
            "iostudy",
            "--json",
            "--sweep",
            "depth",
            "--seconds",
            "0.1",
            "--data-gib",
            "0.03125",
        ])
        .arg("--path")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stderr).contains("filling"));
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dana"))
        .args(["iostudy", "--seconds", "0", "--path"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seconds"));
}
