//! Where a write should land on the flash: the engine's placement classes
//! and the three ways a device can be told about them.
//!
//! Owns: [`Placement`] (the class a write request carries), its mapping
//! to an FTL placement handle (the simulator's model of FDP reclaim-unit
//! handles and write streams), to a Linux write-life hint, and to an
//! io_uring write stream; setting and reading a file's write-life hint
//! (`fcntl(F_SET_RW_HINT)`); finding how many write streams a block device
//! offers (sysfs `queue/max_write_streams`, Linux 6.16+).
//!
//! Never: changes what a write does (where its bytes go, when they are
//! durable): placement is advice; a device that ignores it is correct.
//! Never fails an open because a hint was refused (a file system or an
//! older kernel may not take it): the caller logs nothing and goes on.
//!
//! # The three channels
//! - **Per-file write-life hints** (`F_SET_RW_HINT`, Linux 4.13+): the
//!   kernel keeps one hint per inode and passes it with the file's writes
//!   to a device that understands lifetimes (SCSI streams since 6.9, NVMe
//!   through its driver where supported). dana sets `SHORT` on log files
//!   (overwritten each lap) and `MEDIUM` on data files. One hint per file
//!   cannot tell a hot page from a cold one in the same file.
//! - **Per-I/O write streams** (io_uring `write_stream`, Linux 6.16+, for
//!   block devices that advertise `max_write_streams`, such as NVMe FDP
//!   drives): every write carries its class's stream, so hot pages, cold
//!   pages, large values and the log land in different reclaim units. Only
//!   on a block device that reports streams; files and devices without them
//!   get none.
//! - **FDP placement through NVMe passthrough** (`IORING_OP_URING_CMD` on
//!   `/dev/ngXnY`): not built. Write streams reach the same FDP placement
//!   identifiers through the kernel's block layer without dana building
//!   NVMe commands itself, so passthrough would add a second, raw I/O path
//!   for no placement it cannot already express.
//!
//! None of the three can be seen working on the virtio disk of the
//! development machine (it offers no streams and ignores hints); the
//! simulator's FTL takes the class as its placement handle, and that is
//! where placement is measured (`dana bench waf --placement`).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

/// `F_LINUX_SPECIFIC_BASE + 11`: read a file's write-life hint.
const F_GET_RW_HINT: libc::c_int = 1024 + 11;
/// `F_LINUX_SPECIFIC_BASE + 12`: set a file's write-life hint.
const F_SET_RW_HINT: libc::c_int = 1024 + 12;

/// The expected life of what a write puts on the device, by the engine's
/// classes. Carried by every write [`super::Request`]; reads ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// No class: labels, control blocks, anything the engine does not sort.
    #[default]
    Unsorted,
    /// The log: overwritten every lap, the shortest-lived.
    Log,
    /// A page written back often (its write frequency is above the
    /// running mean of written-back pages): likely rewritten soon.
    Hot,
    /// A page written back rarely: likely to stay.
    Cold,
    /// The pages of a large value: written once, freed whole.
    Large,
    /// Pages an out-of-place device's collection moved
    /// ([`super::remap`]): they outlived the segment they were written
    /// to, the coldest of all.
    Collected,
}

/// The classes, in the order of their stream numbers (`Unsorted` is 0).
pub const PLACEMENTS: [Placement; 6] = [
    Placement::Unsorted,
    Placement::Log,
    Placement::Hot,
    Placement::Cold,
    Placement::Large,
    Placement::Collected,
];

/// A Linux write-life hint (`RWH_WRITE_LIFE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum WriteLife {
    /// `RWH_WRITE_LIFE_NOT_SET`.
    NotSet = 0,
    /// `RWH_WRITE_LIFE_NONE`.
    None = 1,
    /// `RWH_WRITE_LIFE_SHORT`.
    Short = 2,
    /// `RWH_WRITE_LIFE_MEDIUM`.
    Medium = 3,
    /// `RWH_WRITE_LIFE_LONG`.
    Long = 4,
    /// `RWH_WRITE_LIFE_EXTREME`.
    Extreme = 5,
}

impl WriteLife {
    fn from_raw(v: u64) -> Option<WriteLife> {
        Some(match v {
            0 => WriteLife::NotSet,
            1 => WriteLife::None,
            2 => WriteLife::Short,
            3 => WriteLife::Medium,
            4 => WriteLife::Long,
            5 => WriteLife::Extreme,
            _ => return None,
        })
    }
}

impl Placement {
    /// The class's number: 0 for `Unsorted`, then 1-5 in [`PLACEMENTS`]
    /// order.
    pub const fn index(self) -> u32 {
        match self {
            Placement::Unsorted => 0,
            Placement::Log => 1,
            Placement::Hot => 2,
            Placement::Cold => 3,
            Placement::Large => 4,
            Placement::Collected => 5,
        }
    }

    /// The placement handle of this class on a device with `handles`
    /// handles (at least 1): handle 0 for `Unsorted`; the sorted classes
    /// share handles `1..handles` round-robin when there are fewer than
    /// six; everything on handle 0 when there is one.
    pub const fn handle(self, handles: u32) -> u32 {
        let i = self.index();
        if handles <= 1 || i == 0 {
            0
        } else {
            1 + (i - 1) % (handles - 1)
        }
    }

    /// The io_uring write stream of this class on a block device offering
    /// `streams` streams. Stream numbers start at 1; 0 asks for none (the
    /// device's default placement), which is what `Unsorted` gets and what
    /// every class gets on a device without streams. The sorted classes
    /// share the streams round-robin when there are fewer than five.
    pub const fn stream(self, streams: u8) -> u8 {
        let i = self.index();
        if streams == 0 || i == 0 {
            0
        } else {
            1 + ((i - 1) % streams as u32) as u8
        }
    }

    /// The write-life hint that says this class's expected life.
    pub const fn write_life(self) -> WriteLife {
        match self {
            Placement::Unsorted => WriteLife::NotSet,
            Placement::Log => WriteLife::Short,
            Placement::Hot => WriteLife::Medium,
            Placement::Cold => WriteLife::Long,
            Placement::Large => WriteLife::Extreme,
            Placement::Collected => WriteLife::Long,
        }
    }
}

/// Sets the write-life hint of the file open at `fd` (all its writes,
/// through every descriptor: the kernel keeps it on the inode).
pub fn set_write_life(fd: BorrowedFd<'_>, life: WriteLife) -> std::io::Result<()> {
    let v: u64 = life as u64;
    // SAFETY: F_SET_RW_HINT reads one u64 through the pointer, which
    // points at a live local.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), F_SET_RW_HINT, &v as *const u64) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The write-life hint of the file open at `fd`.
pub fn write_life(fd: BorrowedFd<'_>) -> std::io::Result<WriteLife> {
    let mut v: u64 = 0;
    // SAFETY: F_GET_RW_HINT writes one u64 through the pointer, which
    // points at a live local.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), F_GET_RW_HINT, &mut v as *mut u64) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    WriteLife::from_raw(v).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown write-life hint {v}"),
        )
    })
}

/// The write streams the block device `(major, minor)` offers (sysfs
/// `queue/max_write_streams`; 0 when the kernel or the device has none,
/// or for a partition, whose queue is its disk's and which the kernel
/// gives no streams of its own). At most 255 (the SQE field is a byte).
pub fn write_streams(major: u32, minor: u32) -> u8 {
    let p = format!("/sys/dev/block/{major}:{minor}/queue/max_write_streams");
    read_small_number(Path::new(&p)).map_or(0, |n| n.min(255) as u8)
}

fn read_small_number(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_keep_unsorted_alone_and_share_the_rest() {
        for p in PLACEMENTS {
            assert_eq!(p.handle(1), 0);
            assert_eq!(p.handle(6), p.index());
        }
        // Three handles: unsorted on 0, the five classes over 1 and 2.
        let on3: Vec<u32> = PLACEMENTS.iter().map(|p| p.handle(3)).collect();
        assert_eq!(on3, [0, 1, 2, 1, 2, 1]);
        for handles in 1..=64 {
            assert!(PLACEMENTS.iter().all(|p| p.handle(handles) < handles));
        }
    }

    #[test]
    fn sorted_classes_get_streams_within_the_device() {
        for p in PLACEMENTS {
            assert_eq!(p.stream(0), 0, "no streams: none asked for");
            assert_eq!(Placement::Unsorted.stream(p.index() as u8), 0);
        }
        for streams in 1..=255u8 {
            for p in &PLACEMENTS[1..] {
                let s = p.stream(streams);
                assert!((1..=streams).contains(&s), "{p:?} on {streams}: {s}");
            }
        }
        let on8: Vec<u8> = PLACEMENTS.iter().map(|p| p.stream(8)).collect();
        assert_eq!(on8, [0, 1, 2, 3, 4, 5]);
        let on2: Vec<u8> = PLACEMENTS.iter().map(|p| p.stream(2)).collect();
        assert_eq!(on2, [0, 1, 2, 1, 2, 1]);
    }

    #[test]
    fn a_file_keeps_the_write_life_it_was_given() {
        let f = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsFd::as_fd(&f);
        match set_write_life(fd, WriteLife::Short) {
            Ok(()) => {
                assert_eq!(write_life(fd).unwrap(), WriteLife::Short);
                set_write_life(fd, Placement::Cold.write_life()).unwrap();
                assert_eq!(write_life(fd).unwrap(), WriteLife::Long);
            }
            // A kernel or file system without hints: nothing to check, and
            // dana goes on without them.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
    }

    #[test]
    fn a_device_without_streams_reports_none() {
        // No such device: 0, not an error.
        assert_eq!(write_streams(4095, 1_048_575), 0);
    }
}
