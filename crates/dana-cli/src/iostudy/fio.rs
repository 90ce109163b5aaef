//! Running fio on the study's data file and reading its JSON report, for
//! the side-by-side comparison with dana's own random-read loop.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::{CliError, CliResult, Context};

/// What fio reported for one read job.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FioRun {
    pub iops: f64,
    pub lat_mean_us: f64,
    pub total_ios: u64,
    pub runtime_s: f64,
    pub usr_cpu_pct: f64,
    pub sys_cpu_pct: f64,
    /// (usr + sys)% × runtime / I/Os.
    pub cpu_us_per_io: f64,
}

impl FioRun {
    /// The mean of two runs (for the ABBA comparison).
    pub fn mean_with(&self, o: &FioRun) -> FioRun {
        let m = |a: f64, b: f64| (a + b) / 2.0;
        FioRun {
            iops: m(self.iops, o.iops),
            lat_mean_us: m(self.lat_mean_us, o.lat_mean_us),
            total_ios: self.total_ios + o.total_ios,
            runtime_s: self.runtime_s + o.runtime_s,
            usr_cpu_pct: m(self.usr_cpu_pct, o.usr_cpu_pct),
            sys_cpu_pct: m(self.sys_cpu_pct, o.sys_cpu_pct),
            cpu_us_per_io: m(self.cpu_us_per_io, o.cpu_us_per_io),
        }
    }
}

/// The fio version string, or None when fio cannot be run.
pub fn version(fio: &Path) -> Option<String> {
    let out = Command::new(fio).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The fio command line for 4 KiB O_DIRECT random reads through io_uring.
pub fn args(file: &Path, span: u64, depth: u32, duration: Duration) -> Vec<String> {
    vec![
        "--name=dana-iostudy".into(),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--bs=4k".into(),
        "--rw=randread".into(),
        format!("--iodepth={depth}"),
        "--numjobs=1".into(),
        "--time_based".into(),
        format!("--runtime={}ms", duration.as_millis().max(1)),
        "--norandommap".into(),
        format!("--size={span}"),
        format!("--filename={}", file.display()),
        "--output-format=json".into(),
    ]
}

/// Runs fio and parses its report.
pub fn run(
    fio: &Path,
    file: &Path,
    span: u64,
    depth: u32,
    duration: Duration,
) -> CliResult<FioRun> {
    let a = args(file, span, depth, duration);
    let out = Command::new(fio)
        .args(&a)
        .output()
        .context(format!("running {}", fio.display()))?;
    if !out.status.success() {
        return Err(CliError(format!(
            "fio {} failed ({}): {}",
            a.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Reads jobs[0].read.{iops, lat_ns.mean, total_ios, runtime} and
/// jobs[0].{usr_cpu, sys_cpu} from fio's JSON output (text before the
/// first `{`, such as warnings, is skipped).
pub fn parse(text: &str) -> CliResult<FioRun> {
    let start = text
        .find('{')
        .ok_or_else(|| CliError("fio printed no JSON".into()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio's JSON")?;
    let job = &v["jobs"][0];
    let read = &job["read"];
    let f = |x: &serde_json::Value, what: &str| {
        x.as_f64()
            .ok_or_else(|| CliError(format!("fio JSON lacks {what}")))
    };
    let iops = f(&read["iops"], "jobs[0].read.iops")?;
    let lat_mean_ns = f(&read["lat_ns"]["mean"], "jobs[0].read.lat_ns.mean")?;
    let total_ios = f(&read["total_ios"], "jobs[0].read.total_ios")? as u64;
    let runtime_s = f(&read["runtime"], "jobs[0].read.runtime")? / 1e3;
    let usr = f(&job["usr_cpu"], "jobs[0].usr_cpu")?;
    let sys = f(&job["sys_cpu"], "jobs[0].sys_cpu")?;
    let cpu_s = (usr + sys) / 100.0 * runtime_s;
    Ok(FioRun {
        iops,
        lat_mean_us: lat_mean_ns / 1e3,
        total_ios,
        runtime_s,
        usr_cpu_pct: usr,
        sys_cpu_pct: sys,
        cpu_us_per_io: if total_ios > 0 {
            cpu_s * 1e6 / total_ios as f64
        } else {
            0.0
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json_with_a_warning_before_it() {
        let text = r#"fio: some warning
{
  "fio version" : "fio-3.33",
  "jobs" : [ {
      "jobname" : "dana-iostudy",
      "usr_cpu" : 10.0, "sys_cpu" : 30.0,
      "read" : { "iops" : 150000.5, "total_ios" : 300000, "runtime" : 2000,
                 "lat_ns" : { "mean" : 213000.0 } }
  } ]
}"#;
        let r = parse(text).unwrap();
        assert_eq!(r.iops, 150000.5);
        assert_eq!(r.lat_mean_us, 213.0);
        assert_eq!(r.total_ios, 300000);
        // 40% of 2 s = 0.8 s over 300k I/Os = 2.667 µs.
        assert!(
            (r.cpu_us_per_io - 2.6667).abs() < 1e-3,
            "{}",
            r.cpu_us_per_io
        );
    }

    #[test]
    fn missing_fields_are_errors() {
        assert!(parse("no json").is_err());
        let e = parse(r#"{"jobs":[{"read":{}}]}"#).unwrap_err();
        assert!(e.to_string().contains("iops"), "{e}");
    }

    #[test]
    fn command_line_has_the_compared_settings() {
        let a = args(Path::new("/d/data-0"), 1 << 30, 32, Duration::from_secs(2)).join(" ");
        for want in [
            "--ioengine=io_uring",
            "--direct=1",
            "--bs=4k",
            "--iodepth=32",
            "--runtime=2000ms",
            "--filename=/d/data-0",
        ] {
            assert!(a.contains(want), "{a}");
        }
    }
}
