//! Placement of writes by expected life (`io::placement`): what the
//! engine tells the device about each write, checked where it can be seen
//! here. The virtio disk of the development machine offers no write
//! streams and ignores hints, so the per-I/O classes are checked on the
//! simulated device (which counts bytes by class and gives each class its
//! own FTL placement handle) and the per-file hints through
//! `F_GET_RW_HINT` on the files.

use std::os::fd::AsFd;

use dana::io::ftl::FtlConfig;
use dana::io::placement::{self, WriteLife};
use dana::io::sim::{SimConfig, SimDisk};
use dana::io::{Array, Placement, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Options};

fn by_class(disk: &SimDisk, p: Placement) -> u64 {
    disk.stats().bytes_written_by_placement[p.index() as usize]
}

/// Updates under a pool much smaller than the data write pages back as
/// hot and cold, the log writes as log and large values as large; the
/// data device never sees a log write, the log device never a page; and
/// an FTL with a handle per class takes them all.
#[test]
fn every_write_carries_its_class_to_the_device() {
    let data = SimDisk::new(0, 64 << 20, SimConfig::default());
    let mut cfg = FtlConfig::new(64, 320, 0.25);
    cfg.handles = 5;
    data.attach_ftl(cfg).unwrap();
    let log = SimDisk::new(1, CONTROL_BYTES + (8 << 20), SimConfig::default());
    let array = Array::new(vec![Target::Sim(data.clone())], 4096).unwrap();
    let db = Db::open_array_with_log(
        array,
        Some(Target::Sim(log.clone())),
        Options::default().pool_bytes(1 << 20).log_bytes(8 << 20),
        true,
    )
    .unwrap();
    let t = db.create_tree("t").unwrap();
    let key = |i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 20_000).to_be_bytes();
    for i in 0..20_000u64 {
        t.put(&key(i), &[i as u8; 100]).unwrap();
    }
    // A hot tenth rewritten often, the rest now and then.
    for round in 0..30_000u64 {
        let i = if round % 10 == 0 {
            round
        } else {
            round % 2_000
        };
        t.put(&key(i), &[round as u8; 100]).unwrap();
    }
    t.put(b"large", &vec![7u8; 256 << 10]).unwrap();
    let s = db.pool().stats();
    db.close().unwrap();

    let (hot, cold) = (
        by_class(&data, Placement::Hot),
        by_class(&data, Placement::Cold),
    );
    assert!(
        hot > 0 && cold > 0,
        "page write-backs sorted: hot {hot}, cold {cold} bytes"
    );
    assert!(
        s.hot_writebacks > 0 && s.hot_writebacks < s.writebacks,
        "{s:?}"
    );
    assert!(by_class(&data, Placement::Large) >= 256 << 10);
    assert_eq!(by_class(&data, Placement::Log), 0);
    let log_bytes = by_class(&log, Placement::Log);
    assert!(log_bytes > 0);
    for p in [Placement::Hot, Placement::Cold, Placement::Large] {
        assert_eq!(by_class(&log, p), 0, "{p:?} on the log device");
    }
    // Only the log's control blocks go unsorted.
    assert!(by_class(&log, Placement::Unsorted) < log_bytes / 10);
    let ftl = data.ftl_stats().unwrap();
    assert!(ftl.host_pages > 0 && ftl.flash_pages >= ftl.host_pages);
}

/// A database's files carry write-life hints: the log SHORT, the data
/// MEDIUM (where the file system takes hints at all).
#[test]
fn files_carry_write_life_hints() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let life = |name: &str| {
        let f = std::fs::File::open(dir.path().join(name)).unwrap();
        placement::write_life(f.as_fd())
    };
    match life("dana.0") {
        Ok(data) => {
            assert_eq!(data, WriteLife::Medium);
            assert_eq!(life("dana.wal").unwrap(), WriteLife::Short);
            assert_eq!(Placement::Log.write_life(), WriteLife::Short);
        }
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
    }
    db.close().unwrap();
}
