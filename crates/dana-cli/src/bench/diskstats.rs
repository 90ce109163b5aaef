//! Device counters from the kernel (`/proc/diskstats`), to report what the
//! block device saw next to what the engine says it did.
//!
//! Owns: finding the block device that holds a path and reading its
//! completed reads/writes and sectors. Never: fails a benchmark when the
//! counters cannot be read (the figures are then reported as absent).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Completed I/O counters of one block device.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskCounters {
    /// Reads completed.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
}

impl DiskCounters {
    /// Counters accumulated since `earlier`.
    pub fn since(&self, earlier: &DiskCounters) -> DiskCounters {
        DiskCounters {
            reads: self.reads.saturating_sub(earlier.reads),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            writes: self.writes.saturating_sub(earlier.writes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
        }
    }
}

/// The block device (major, minor) holding `path`, and its name.
#[derive(Debug, Clone)]
pub struct Disk {
    major: u64,
    minor: u64,
    /// Kernel name, e.g. `vda`.
    pub name: String,
}

impl Disk {
    /// The device of the file system holding `path` (or the block device
    /// itself when `path` is one).
    pub fn of(path: &Path) -> Option<Disk> {
        let meta = std::fs::metadata(path).ok()?;
        let dev = if meta.file_type().is_block_device_hack() {
            meta.rdev()
        } else {
            meta.dev()
        };
        let (major, minor) = (libc_major(dev), libc_minor(dev));
        let text = std::fs::read_to_string("/proc/diskstats").ok()?;
        let name = text.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[0] == major.to_string() && f[1] == minor.to_string())
                .then(|| f[2].to_string())
        })?;
        Some(Disk { major, minor, name })
    }

    /// The device's counters now.
    pub fn read(&self) -> Option<DiskCounters> {
        let text = std::fs::read_to_string("/proc/diskstats").ok()?;
        parse_line(&text, self.major, self.minor)
    }
}

trait BlockDeviceHack {
    fn is_block_device_hack(&self) -> bool;
}

impl BlockDeviceHack for std::fs::FileType {
    fn is_block_device_hack(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_block_device()
    }
}

fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}

/// Parses the line of (major, minor) out of `/proc/diskstats` text.
pub fn parse_line(text: &str, major: u64, minor: u64) -> Option<DiskCounters> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 10 || f[0] != major.to_string() || f[1] != minor.to_string() {
            return None;
        }
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        Some(DiskCounters {
            reads: n(3)?,
            read_bytes: n(5)? * 512,
            writes: n(7)?,
            write_bytes: n(9)? * 512,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_diskstats_line() {
        let text = " 254       0 vda 1000 5 16000 300 2000 7 32000 400 0 500 700 0 0 0 0\n";
        let c = parse_line(text, 254, 0).unwrap();
        assert_eq!(c.reads, 1000);
        assert_eq!(c.read_bytes, 16000 * 512);
        assert_eq!(c.writes, 2000);
        assert!(parse_line(text, 254, 1).is_none());
    }

    #[test]
    fn finds_the_disk_of_the_current_directory() {
        // Containers may hide /proc/diskstats entries; then None is fine,
        // but a found disk must read.
        if let Some(d) = Disk::of(Path::new(".")) {
            assert!(d.read().is_some(), "{d:?}");
        }
    }
}
