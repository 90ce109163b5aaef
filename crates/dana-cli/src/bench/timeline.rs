//! Per-second timelines of a benchmark, written as CSV and drawn as SVG.
//!
//! Owns: the file formats only. Never: touches the engine.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::{CliResult, Context};

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// Seconds since the measured window started (negative: warm-up).
    pub t: f64,
    /// Operations per second in this interval.
    pub ops_per_s: f64,
    /// Device reads per second in this interval: the engine's count, or
    /// the block device's (/proc/diskstats) where the benchmark says so
    /// (`bench tpcc`, which runs peers too).
    pub reads_per_s: f64,
    /// p99 operation latency in this interval, µs.
    pub p99_us: f64,
}

/// Writes the timeline as CSV.
pub fn write_csv(path: &Path, rows: &[Second]) -> CliResult<()> {
    let mut s = String::from("t_s,ops_per_s,reads_per_s,p99_us\n");
    for r in rows {
        let _ = writeln!(
            s,
            "{:.1},{:.0},{:.0},{:.1}",
            r.t, r.ops_per_s, r.reads_per_s, r.p99_us
        );
    }
    std::fs::write(path, s).context(format!("writing {}", path.display()))
}

/// Writes `dir/stem.csv` and `dir/stem.svg` (ops/s, device reads/s and
/// p99 latency per second) for one run.
pub fn write_timeline(
    dir: &Path,
    stem: &str,
    title: &str,
    ops_label: &str,
    tl: &[Second],
) -> CliResult<()> {
    write_csv(&dir.join(format!("{stem}.csv")), tl)?;
    let chart = Chart {
        title,
        x_label: "seconds (negative: warm-up)",
        xs: tl.iter().map(|s| s.t).collect(),
        series: vec![
            (ops_label, tl.iter().map(|s| s.ops_per_s).collect()),
            ("device reads/s", tl.iter().map(|s| s.reads_per_s).collect()),
            ("p99 latency (us)", tl.iter().map(|s| s.p99_us).collect()),
        ],
        log_x: false,
    };
    std::fs::write(dir.join(format!("{stem}.svg")), chart.svg()).context("writing the timeline SVG")
}

/// A line chart: one panel per series, x shared.
pub struct Chart<'a> {
    /// Title on top.
    pub title: &'a str,
    /// Label of the x axis.
    pub x_label: &'a str,
    /// x values.
    pub xs: Vec<f64>,
    /// (label, y values) per panel.
    pub series: Vec<(&'a str, Vec<f64>)>,
    /// Draw the x axis in log scale.
    pub log_x: bool,
}

impl Chart<'_> {
    /// Renders the chart as an SVG document.
    pub fn svg(&self) -> String {
        let (w, panel_h, left, top) = (760.0, 180.0, 80.0, 40.0);
        let h = top + panel_h * self.series.len() as f64 + 40.0;
        let fx = |x: f64| if self.log_x { x.max(1e-9).ln() } else { x };
        let (x0, x1) = self.xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| {
            (a.min(fx(x)), b.max(fx(x)))
        });
        let span = if x1 > x0 { x1 - x0 } else { 1.0 };
        let mut s = String::new();
        let _ = write!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"##,
            w / 2.0,
            esc(self.title)
        );
        for (pi, (label, ys)) in self.series.iter().enumerate() {
            let py = top + pi as f64 * panel_h;
            let ymax = ys.iter().cloned().fold(0.0, f64::max).max(1e-9) * 1.1;
            let (pw, ph) = (w - left - 20.0, panel_h - 40.0);
            let _ = write!(
                s,
                r##"<rect x="{left}" y="{py}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text><text x="{}" y="{}" text-anchor="end">{}</text><text x="{}" y="{}" text-anchor="end">0</text>"##,
                left - 55.0,
                py + ph / 2.0,
                left - 55.0,
                py + ph / 2.0,
                esc(label),
                left - 4.0,
                py + 10.0,
                fmt_num(ymax),
                left - 4.0,
                py + ph
            );
            let pts: Vec<String> = self
                .xs
                .iter()
                .zip(ys)
                .map(|(&x, &y)| {
                    let px = left + (fx(x) - x0) / span * pw;
                    let yy = py + ph - (y / ymax) * ph;
                    format!("{px:.1},{yy:.1}")
                })
                .collect();
            let _ = write!(
                s,
                r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
                pts.join(" ")
            );
            for p in &pts {
                let (px, yy) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(
                    s,
                    r##"<circle cx="{px}" cy="{yy}" r="2.5" fill="#1f77b4"/>"##
                );
            }
        }
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle">{}</text>"##,
            left + (w - left - 20.0) / 2.0,
            h - 12.0,
            esc(self.x_label)
        );
        for &x in &self.xs {
            let px = left + (fx(x) - x0) / span * (w - left - 20.0);
            let _ = write!(
                s,
                r##"<text x="{px:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
                h - 28.0,
                fmt_num(x)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_every_series() {
        let c = Chart {
            title: "t",
            x_label: "s",
            xs: vec![1.0, 2.0, 3.0],
            series: vec![("a", vec![1.0, 2.0, 3.0]), ("b <x>", vec![0.0, 0.0, 5.0])],
            log_x: false,
        };
        let svg = c.svg();
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("b &lt;x&gt;"));
    }
}
