//! Measurement helpers for reports: process CPU time, the CPU clock rate,
//! machine facts, and a plain-text table printer.
//!
//! CPU cost is process-wide: `getrusage(RUSAGE_SELF)` user + system time,
//! which includes every thread of the process (io_uring's io-wq workers and
//! SQPOLL thread are threads of the process on Linux >= 5.12). It does not
//! include interrupt handling charged to other tasks or kernel writeback
//! threads flushing dirty pages. Cycles = CPU seconds × the nominal clock
//! rate (from `/sys/.../cpufreq` or `/proc/cpuinfo` "cpu MHz").

use serde::Serialize;

/// User + system CPU time of the whole process, in seconds.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live, writable rusage; RUSAGE_SELF is valid.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if r != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The memory file system `path` (or the nearest existing directory
/// above it) lives on, `tmpfs` or `ramfs`; None on any other. tmpfs takes
/// O_DIRECT since Linux 6.6, so a bench pointed there runs the real
/// io_uring path with the CPU as the limit: its figures are not a disk's.
pub fn memory_file_system(path: &std::path::Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = path;
    while !p.as_os_str().is_empty() && !p.exists() {
        p = p.parent()?;
    }
    let p = if p.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        p
    };
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a live, writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The magic numbers of linux/magic.h (RAMFS_MAGIC is not in the
    // libc crate); f_type's width differs by target.
    const TMPFS_MAGIC: u32 = 0x0102_1994;
    const RAMFS_MAGIC: u32 = 0x8584_58f6;
    match st.f_type as u32 {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// Says on stderr, before a bench runs, that `path` is memory-backed (see
/// [`memory_file_system`]), so that no figure of the run is taken for a
/// disk's.
pub fn note_memory_backed(path: &std::path::Path) {
    if let Some(fs) = memory_file_system(path) {
        eprintln!(
            "note: {} is on {fs}: a memory-backed run; its figures are the CPU's and \
             memory's, not a disk's",
            path.display()
        );
    }
}

/// The resident set size of this process in bytes (0 if unknown).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// Bytes of the regular files under `dir`, recursively (0 for a missing
/// directory; unreadable entries are skipped).
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The first "cpu MHz" value of a `/proc/cpuinfo` text.
pub fn parse_cpu_mhz(cpuinfo: &str) -> Option<f64> {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .find_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .filter(|mhz| *mhz > 0.0)
}

/// The first "model name" value of a `/proc/cpuinfo` text.
pub fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("model name"))
        .find_map(|l| Some(l.split_once(':')?.1.trim().to_string()))
}

/// The CPU clock rate in Hz and where it came from.
pub fn clock_hz() -> (f64, &'static str) {
    let khz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/base_frequency")
        .or_else(|_| {
            std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        })
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|k| *k > 0.0);
    if let Some(khz) = khz {
        return (khz * 1e3, "cpufreq");
    }
    let mhz = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| parse_cpu_mhz(&s));
    match mhz {
        Some(mhz) => (mhz * 1e6, "/proc/cpuinfo cpu MHz"),
        None => (2.0e9, "assumed 2 GHz (no clock rate found)"),
    }
}

/// Facts about the machine a report was made on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu_model: String,
    /// Clock rate used for cycle figures.
    pub cpu_hz: f64,
    /// Where the clock rate came from.
    pub cpu_hz_source: String,
    /// Logical CPUs available to the process.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// Total RAM in bytes.
    pub ram_bytes: u64,
}

impl Machine {
    /// Reads the facts from /proc and /sys.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (cpu_hz, src) = clock_hz();
        let ram_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
        Machine {
            cpu_model: parse_cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            cpu_hz,
            cpu_hz_source: src.into(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            ram_bytes: ram_kib * 1024,
        }
    }
}

/// A text table: a header row and data rows, columns right-aligned except
/// the first `left` ones.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    left: usize,
}

impl Table {
    /// A table with these column names; the first `left` columns are
    /// left-aligned.
    pub fn new(header: &[&str], left: usize) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            left,
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row.
    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width = vec![0; n];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for (k, r) in std::iter::once(&self.header).chain(&self.rows).enumerate() {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(n) {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = width[i] - c.chars().count();
                if i < self.left {
                    line.push_str(c);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(c);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if k == 0 {
                let total: usize = width.iter().sum::<usize>() + 2 * n.saturating_sub(1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        out
    }
}

/// A number with thousands separators and `decimals` decimals.
pub fn num(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let s = format!("{:.*}", decimals, v.abs());
    let (int, frac) = s.split_once('.').map_or((s.as_str(), ""), |(a, b)| (a, b));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    let sign = if v < 0.0 { "-" } else { "" };
    if frac.is_empty() {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path under a tmpfs mount (one not made yet included) is
    /// memory-backed; the build's own directory, on the disk, is not.
    /// (Runs on tmpfs were told from disk runs only by a missing disk
    /// name; a review's finding.)
    #[test]
    fn paths_on_tmpfs_are_told_memory_backed() {
        let shm = std::path::Path::new("/dev/shm");
        if memory_file_system(shm) == Some("tmpfs") {
            assert_eq!(
                memory_file_system(&shm.join("not-made/deeper")),
                Some("tmpfs")
            );
        }
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        if memory_file_system(std::path::Path::new("/")).is_none() {
            assert_eq!(memory_file_system(here), None);
            assert_eq!(memory_file_system(std::path::Path::new("rel/x")), None);
        }
    }

    #[test]
    fn cpuinfo_parsing() {
        let text =
            "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\ncpu MHz\t\t: 2399.998\n";
        assert_eq!(parse_cpu_mhz(text), Some(2399.998));
        assert_eq!(
            parse_cpu_model(text).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        assert_eq!(parse_cpu_mhz("flags: x\n"), None);
    }

    #[test]
    fn cpu_time_grows() {
        let a = process_cpu_seconds();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_seconds() >= a);
    }

    #[test]
    fn numbers_and_tables() {
        assert_eq!(num(1234567.891, 1), "1,234,567.9");
        assert_eq!(num(12.0, 0), "12");
        assert_eq!(num(-1500.0, 0), "-1,500");
        let mut t = Table::new(&["name", "v"], 1);
        t.row(vec!["a".into(), "10".into()]);
        let s = t.render();
        assert!(s.contains("a     10") || s.contains("a   10"), "{s}");
    }
}
