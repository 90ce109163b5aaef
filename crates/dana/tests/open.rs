//! Opening as an outsider would: two opens of one database, closed
//! handles, foreign files, failed opens, read-only opens that must change
//! nothing, and a log damaged where it had been durable.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use dana::wal::control::{Control, BLOCK};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Error, Options};

fn opts() -> Options {
    Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(16 << 20)
        .log_bytes(2 << 20)
}

/// (name -> (length, mtime ns, crc of the bytes)) of every file in `dir`.
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, i64, u32)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (
                    m.len(),
                    m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                    crc32c::crc32c(&bytes),
                ),
            )
        })
        .collect()
}

fn key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

#[test]
fn a_second_writable_open_is_locked_and_close_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    assert!(matches!(
        Db::open(dir.path(), opts()),
        Err(Error::Locked { .. })
    ));
    assert!(matches!(
        Db::open(dir.path(), opts().read_only()),
        Err(Error::Locked { .. })
    ));
    db.close().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    db.close().unwrap();
}

#[test]
fn read_only_opens_share_and_exclude_writers() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    db.create_tree("t").unwrap();
    db.close().unwrap();
    let a = Db::open(dir.path(), opts().read_only()).unwrap();
    let b = Db::open(dir.path(), opts().read_only()).unwrap();
    assert!(matches!(
        Db::open(dir.path(), opts()),
        Err(Error::Locked { .. })
    ));
    let t = a.tree("t").unwrap();
    assert!(matches!(t.put(b"k", b"v"), Err(Error::ReadOnly)));
    assert!(matches!(a.create_tree("u"), Err(Error::ReadOnly)));
    assert!(matches!(a.drop_tree("t"), Err(Error::ReadOnly)));
    a.close().unwrap();
    b.close().unwrap();
    Db::open(dir.path(), opts()).unwrap().close().unwrap();
}

#[test]
fn handles_of_a_closed_database_fail_with_closed() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"v").unwrap();
    let other = db.clone();
    db.close().unwrap();
    assert!(matches!(t.put(b"k", b"w"), Err(Error::Closed)));
    assert!(matches!(t.get(b"k"), Err(Error::Closed)));
    assert!(matches!(other.tree("t"), Err(Error::Closed)));
    assert!(matches!(other.block_on(async {}), Err(Error::Closed)));
    let mut tx = other.begin();
    // A transaction's writes too, at once (they were buffered and refused
    // only at the commit; a docs review).
    assert!(matches!(tx.put(&t, b"x", b"y"), Err(Error::Closed)));
    assert!(matches!(tx.insert(&t, b"x", b"y"), Err(Error::Closed)));
    assert!(matches!(tx.delete(&t, b"x"), Err(Error::Closed)));
    assert!(matches!(other.commit(tx), Err(Error::Closed)));
    // The old handles are alive, and the database opens again.
    let db = Db::open(dir.path(), opts()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    drop(other);
    db.close().unwrap();
}

/// A log of the largest size dana creates (64 GiB) in a file that starts
/// small: reopening reads what the file holds, not its capacity (the first
/// version read the capacity whole into memory at every open, 64 GiB).
#[test]
fn a_huge_log_in_a_small_file_reopens_without_reading_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    // Past the largest: refused, nothing created.
    for bytes in [
        dana::wal::recover::MAX_LOG_BYTES + 4096,
        u64::MAX - 1,
        u64::MAX,
    ] {
        let e = Db::open(dir.path(), opts().log_bytes(bytes)).err();
        assert!(e.is_some(), "a log of {bytes} bytes was created");
        assert!(!dir.path().join("dana.wal").exists());
    }
    let huge = opts().log_bytes(dana::wal::recover::MAX_LOG_BYTES);
    let db = Db::open(dir.path(), huge.clone()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..200u32 {
        t.put(&i.to_be_bytes(), b"v").unwrap();
    }
    db.close().unwrap();
    for read_only in [true, false] {
        let o = if read_only {
            huge.clone().read_only()
        } else {
            huge.clone()
        };
        let db = Db::open(dir.path(), o).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..200u32 {
            assert_eq!(t.get(&i.to_be_bytes()).unwrap(), Some(b"v".to_vec()));
        }
        assert!(db.check().unwrap().is_ok());
        db.close().unwrap();
    }
}

/// New logs whose files, once grown, would not fit in their file system
/// are refused at creation, naming `log_bytes`, and leave no file: before,
/// the database was created, and once the log could grow no further every
/// write, a delete too, failed `NoSpace` for good (an outside probe).
#[test]
fn logs_larger_than_their_file_system_are_refused_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    // A file's device may grow to its file system's size.
    let fs_bytes = {
        use dana::io::device::{Device, DeviceOptions};
        let scratch = tempfile::tempdir().unwrap();
        let opts = DeviceOptions {
            create_size: Some(4096),
            ..Default::default()
        };
        Device::open(scratch.path().join("f"), 0, opts)
            .unwrap()
            .max_size()
    };
    // The most logs of the largest size a log may have.
    let logs = dana::wal::MAX_LOGS as u64;
    let bytes = logs * dana::wal::recover::MAX_LOG_BYTES;
    assert!(
        bytes > fs_bytes,
        "the temporary directory's file system holds {fs_bytes} bytes, more than the most \
         logs a database may have: this test needs a smaller one"
    );
    let o = opts().workers(2).logs(logs as usize).log_bytes(bytes);
    match Db::open(dir.path(), o) {
        Err(Error::InvalidArgument(what)) => assert!(what.contains("log_bytes"), "{what}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(!dir.path().join("dana.wal").exists());
    assert!(!dir.path().join("dana.0").exists());
}

/// `Db::close` while other threads call into the database: every call
/// returns (a result or `Closed`/`Shutdown`), none waits for good. A sync
/// call that passed the closed check and queued its task after the
/// workers had stopped used to wait for a task nobody would run.
#[test]
fn close_racing_calls_on_other_threads_never_leaves_a_call_waiting() {
    for round in 0..60u64 {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        for n in 0..3u64 {
            let (t, done) = (t.clone(), done.clone());
            std::thread::spawn(move || {
                let mut i = n;
                let end = loop {
                    let k = (i % 500).to_be_bytes();
                    let r = if i % 3 == 0 {
                        t.get(&k).map(|_| ())
                    } else {
                        t.put(&k, &[n as u8; 64]).map(|_| ())
                    };
                    match r {
                        Ok(()) => i += 3,
                        Err(e) => break e,
                    }
                };
                let _ = done.send(end);
            });
        }
        drop(done);
        std::thread::sleep(std::time::Duration::from_millis(1 + round % 7));
        db.close().unwrap();
        for _ in 0..3 {
            let e = finished
                .recv_timeout(std::time::Duration::from_secs(20))
                .expect("a call still waiting 20 s after close");
            assert!(
                matches!(e, Error::Closed | Error::Shutdown),
                "round {round}: {e}"
            );
        }
    }
}

#[test]
fn a_foreign_file_is_not_a_database_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let junk: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(dir.path().join("dana.0"), &junk).unwrap();
    let before = snapshot(dir.path());
    let e = Db::open(dir.path(), opts()).err().unwrap();
    assert!(
        matches!(&e, Error::NotADatabase { what, .. } if what.contains("not a dana database")),
        "{e}"
    );
    assert_eq!(
        snapshot(dir.path()),
        before,
        "the open changed the directory"
    );
}

#[test]
fn a_page_size_mismatch_and_an_old_format_say_so() {
    let dir = tempfile::tempdir().unwrap();
    Db::open(dir.path(), opts()).unwrap().close().unwrap();
    let before = snapshot(dir.path());
    let e = Db::open(dir.path(), opts().page_size(8192)).err().unwrap();
    assert!(
        matches!(&e, Error::NotADatabase { what, .. } if what.contains("4096-byte pages")),
        "{e}"
    );
    // Format version 1 in the meta page (bytes 40..44), the page sealed
    // again as that format would have written it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("dana.0"))
        .unwrap();
    let mut page = vec![0u8; 4096];
    f.read_exact_at(&mut page, 0).unwrap();
    page[40..44].copy_from_slice(&1u32.to_le_bytes());
    dana::buffer::page::seal(&mut page);
    f.write_all_at(&page, 0).unwrap();
    drop(f);
    let e = Db::open(dir.path(), opts()).err().unwrap();
    assert!(
        matches!(&e, Error::NotADatabase { what, .. } if what.contains("format version 1")),
        "{e}"
    );
    assert_eq!(snapshot(dir.path()).len(), before.len());
}

/// One flipped bit in the meta page's fields (version, page size, width,
/// log identity) is damage, not another format, wrong options or another
/// database's log: an outside probe saw "format version 8", "invalid
/// page size", "striped over 257 devices" and "log 0 belongs to another
/// database" for flips the checksum catches.
#[test]
fn a_flipped_meta_page_field_is_reported_as_damage() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..100u32 {
        t.put(&key(i), b"v").unwrap();
    }
    db.close().unwrap();
    let data = dir.path().join("dana.0");
    let pristine = std::fs::read(&data).unwrap();
    for (offset, bit) in [(40, 0), (44, 0), (45, 1), (48, 0), (49, 0), (80, 3)] {
        let mut bytes = pristine.clone();
        bytes[offset] ^= 1 << bit;
        std::fs::write(&data, &bytes).unwrap();
        for read_only in [true, false] {
            let o = if read_only {
                opts().read_only()
            } else {
                opts()
            };
            let e = Db::open(dir.path(), o)
                .err()
                .unwrap_or_else(|| panic!("byte {offset} flipped: the open succeeded"));
            assert!(
                matches!(&e, Error::Corrupt { page: 0, .. }),
                "byte {offset} flipped (read-only {read_only}): {e}"
            );
        }
    }
    // A byte no field uses: a damaged page the log repairs, since the
    // last checkpoint logged the page's image (its checkpoint stamp's
    // change): a read-only open needs recovery, a writable one repairs.
    let mut bytes = pristine.clone();
    bytes[52] ^= 1 << 2;
    std::fs::write(&data, &bytes).unwrap();
    let e = Db::open(dir.path(), opts().read_only()).err().unwrap();
    assert!(matches!(&e, Error::NeedsRecovery(_)), "{e}");
    let db = Db::open(dir.path(), opts()).unwrap();
    assert_eq!(db.recovery().unwrap().pages_repaired, 1);
    db.close().unwrap();
    assert!(std::fs::read(&data).unwrap()[..4096] != bytes[..4096]);
    let db = Db::open(dir.path(), opts()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(&key(7)).unwrap().as_deref(),
        Some(&b"v"[..])
    );
    db.close().unwrap();
}

/// In a crashed database whose log holds the meta page's image: a
/// damaged byte outside the fields the open believes is repaired by
/// recovery (a write torn after the first sector looks the same), while a
/// flipped log identity is refused as damage before anything is written.
#[test]
fn a_damaged_meta_page_is_repaired_from_the_log_or_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, pristine) = (dir.path().join("db"), dir.path().join("pristine"));
    crashed_copy(&db_dir, &pristine, 20);
    // A fresh copy of the crashed database with one byte of its meta page
    // flipped.
    let damaged = |name: &str, offset: usize, mask: u8| {
        let to = dir.path().join(name);
        copy_files(&pristine, &to);
        let mut bytes = std::fs::read(to.join("dana.0")).unwrap();
        bytes[offset] ^= mask;
        std::fs::write(to.join("dana.0"), &bytes).unwrap();
        to
    };
    // The log identity (bytes 80..88): refused, no file touched.
    let copy = damaged("log-id", 80, 1);
    let before = snapshot(&copy);
    let e = Db::open(&copy, opts()).err().unwrap();
    assert!(matches!(&e, Error::Corrupt { page: 0, .. }), "{e}");
    assert_eq!(snapshot(&copy), before, "the refused open changed a file");
    // A byte past the believed fields, and the page's last byte: repaired.
    for offset in [200, 4095] {
        let copy = damaged(&format!("at-{offset}"), offset, 0x10);
        let db = Db::open(&copy, opts()).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..20u32 {
            assert_eq!(
                t.get(&key(i)).unwrap(),
                Some(vec![i as u8; 64]),
                "byte {offset}"
            );
        }
        assert!(db.check().unwrap().is_ok());
        db.close().unwrap();
    }
}

/// A crashed database's log file cut short (not at a size the log grows
/// to) is damage, not the end of the log: an outside probe's truncations
/// opened without an error, the commits past the cut gone.
#[test]
fn a_log_file_cut_short_is_corrupt_log() {
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, copy) = (dir.path().join("db"), dir.path().join("copy"));
    crashed_copy(&db_dir, &copy, 20);
    let log = copy.join("dana.wal");
    let full = std::fs::metadata(&log).unwrap().len();
    assert_eq!((full - CONTROL_BYTES) % (1 << 20), 0, "{full}");
    for cut in [CONTROL_BYTES + 65536, CONTROL_BYTES + 4096, full - 512] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)
            .unwrap()
            .set_len(cut)
            .unwrap();
        for read_only in [true, false] {
            let o = if read_only {
                opts().read_only()
            } else {
                opts()
            };
            let e = Db::open(&copy, o).err().expect("a cut log opened");
            assert!(
                matches!(&e, Error::CorruptLog { .. }),
                "cut at {cut} (read-only {read_only}): {e}"
            );
        }
    }
}

#[test]
fn a_failed_create_leaves_no_trace() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("a").join("db");
    // Workers are started after the files were created and formatted.
    let e = Db::open(&dir, opts().workers(0)).err().unwrap();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(
        !parent.path().join("a").exists(),
        "the failed open left files"
    );
    // A failed open of an existing database creates no log.
    let dir = parent.path().join("b");
    Db::open(&dir, opts().durability(Durability::Off))
        .unwrap()
        .close()
        .unwrap();
    let before = snapshot(&dir);
    assert!(Db::open(&dir, opts().workers(0)).is_err());
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn a_read_only_open_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..500 {
        t.put(&key(i), &[7; 100]).unwrap();
    }
    db.close().unwrap();
    let before = snapshot(dir.path());
    let db = Db::open(dir.path(), opts().read_only().pool_bytes(64 * 4096)).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..500 {
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![7; 100]));
    }
    assert!(db.check().unwrap().is_ok());
    db.flush().unwrap();
    db.close().unwrap();
    assert_eq!(snapshot(dir.path()), before, "a read-only open wrote");
}

/// A database left as a crash leaves it: the files copied while it is
/// open, after commits that no checkpoint covers.
fn crashed_copy(dir: &Path, to: &Path, commits: u32) {
    let db = Db::open(dir, opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..commits {
        t.put(&key(i), &[i as u8; 64]).unwrap();
    }
    copy_files(dir, to);
    drop(db);
}

/// Copies every file of `from` into `to` (created), as they are now.
fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_read_only_open_of_a_crashed_database_needs_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    crashed_copy(&dir.path().join("db"), &copy, 20);
    let e = Db::open(&copy, opts().read_only()).err().unwrap();
    assert!(matches!(e, Error::NeedsRecovery(_)), "{e}");
    // A writable open recovers, whatever durability it asks for.
    let db = Db::open(&copy, opts().durability(Durability::Off)).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..20 {
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![i as u8; 64]));
    }
    db.close().unwrap();
    let db = Db::open(&copy, opts().read_only()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(&key(19)).unwrap(),
        Some(vec![19; 64])
    );
}

/// The log file's control block (the newer one).
fn control(log: &Path) -> Control {
    let bytes = std::fs::read(log).unwrap();
    Control::newest(&bytes[..2 * BLOCK as usize]).unwrap()
}

/// The LSN where the next flush of the log at `path` will write: its
/// valid records' end, rounded up to the flush block.
fn next_flush_at(log: &Path) -> u64 {
    let c = control(log);
    let bytes = std::fs::read(log).unwrap();
    let mut stream = bytes[CONTROL_BYTES as usize..].to_vec();
    stream.resize(c.capacity as usize, 0);
    stream.rotate_left((c.redo % c.capacity) as usize);
    let s = dana::wal::recover::scan(&stream, &c).unwrap();
    s.end.div_ceil(c.block) * c.block
}

fn flip(path: &Path, offset: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
}

/// A mirrored log damaged in different places on its two copies, every
/// byte whole on one of them: the open takes each damaged run from the
/// other copy and loses nothing. Each copy alone scanned to a break, and
/// the open failed with `CorruptLog` (an outside probe's finding).
#[test]
fn damage_in_different_places_of_both_copies_of_a_mirrored_log_is_repaired() {
    use dana::io::mirror::LABEL_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, copy) = (dir.path().join("db"), dir.path().join("copy"));
    let o = opts().mirrored();
    let db = Db::open(&db_dir, o.clone()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..600 {
        t.put(&key(i), &[i as u8; 64]).unwrap();
    }
    copy_files(&db_dir, &copy);
    drop((t, db));
    let logs = [copy.join("dana.wal"), copy.join("dana.wal.m1")];
    let bytes = std::fs::read(&logs[0]).unwrap();
    let device = &bytes[LABEL_BYTES as usize..];
    let c = Control::newest(&device[..2 * BLOCK as usize]).unwrap();
    // A record byte past the redo point, and another three blocks on.
    let record_byte = |from: u64| {
        (from..from + 4096)
            .find(|&at| device[at as usize] != 0)
            .unwrap()
    };
    let first = record_byte(CONTROL_BYTES + c.redo % c.capacity + 4096);
    let second = record_byte(first + 3 * 4096);
    flip(&logs[0], LABEL_BYTES + first);
    flip(&logs[1], LABEL_BYTES + second);
    let db = Db::open(&copy, o.clone()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..600 {
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![i as u8; 64]), "{i}");
    }
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
    let a = std::fs::read(&logs[0]).unwrap();
    let b = std::fs::read(&logs[1]).unwrap();
    let from = (LABEL_BYTES + CONTROL_BYTES) as usize;
    assert_eq!(a[from..], b[from..], "the copies agree");
}

#[test]
fn damage_to_durable_log_records_is_an_error_not_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    crashed_copy(&dir.path().join("db"), &copy, 30);
    let log = copy.join("dana.wal");
    let c = control(&log);
    // A byte of the open's checkpoint record, after the redo point, which
    // 30 later synced commits followed.
    let at = CONTROL_BYTES + (c.checkpoint + 9) % c.capacity;
    flip(&log, at);
    let before = snapshot(&copy);
    let e = Db::open(&copy, opts()).err().unwrap();
    assert!(
        matches!(&e, Error::CorruptLog { offset, .. } if *offset <= at && offset + 4096 > at),
        "{e}"
    );
    // Named: with several logs, or a mirrored one, an offset alone named
    // no file (an outside probe).
    assert!(e.to_string().contains(&log.display().to_string()), "{e}");
    let e = Db::open(&copy, opts().read_only()).err().unwrap();
    assert!(matches!(e, Error::CorruptLog { .. }), "{e}");
    assert_eq!(snapshot(&copy), before);
}

#[test]
fn damage_within_the_last_flush_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().join("db");
    let copy = dir.path().join("copy");
    // One log: every commit is in dana.wal.
    let db = Db::open(&db_dir, opts().logs(1)).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..10 {
        t.put(&key(i), b"v").unwrap();
    }
    let last_flush = next_flush_at(&db_dir.join("dana.wal"));
    t.put(&key(10), b"v").unwrap();
    copy_files(&db_dir, &copy);
    drop(db);
    let log = copy.join("dana.wal");
    let c = control(&log);
    flip(&log, CONTROL_BYTES + (last_flush + 9) % c.capacity);
    let db = Db::open(&copy, opts().logs(1)).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..10 {
        assert_eq!(t.get(&key(i)).unwrap(), Some(b"v".to_vec()), "key {i}");
    }
    assert_eq!(t.get(&key(10)).unwrap(), None);
}

/// Rewrites the flush marker of the flush at stream LSN `from` (its last
/// record) to name `durable` as the LSN durable when it was issued,
/// resealed in place (the marker is the flush's last record: nothing
/// chains to it).
fn restamp_flush_marker(log: &Path, from: u64, durable: u64) {
    use dana::wal::record::{self, Kind, Parsed};
    let c = control(log);
    let bytes = std::fs::read(log).unwrap();
    let mut lsn = from;
    loop {
        let off = (CONTROL_BYTES + lsn % c.capacity) as usize;
        let Parsed::Record(r) = record::parse(&bytes[off..], lsn) else {
            panic!("no valid record at LSN {lsn}");
        };
        if r.kind != Kind::Flush {
            lsn += r.len as u64;
            continue;
        }
        let mut marker = record::flush_marker(durable).into_unsealed();
        assert_eq!(marker.len(), r.len);
        record::seal(&mut marker, lsn, r.prev);
        let f = std::fs::OpenOptions::new().write(true).open(log).unwrap();
        f.write_all_at(&marker, off as u64).unwrap();
        return;
    }
}

/// With several flushes in flight (`Options::log_flushes_in_flight`) a
/// crash can keep a later flush whole beside an earlier one torn. The
/// later flush's marker names what was durable when it was issued, before
/// the torn one completed: recovery ends the log at the break (the later
/// flush's commits were never acknowledged) and counts the flush left
/// past the end. The same break followed by a marker issued after the
/// torn flush completed is damage to durable records.
#[test]
fn a_later_flush_kept_beside_a_torn_one_ends_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().join("db");
    let db = Db::open(&db_dir, opts().logs(1)).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..10 {
        t.put(&key(i), b"v").unwrap();
    }
    let log = db_dir.join("dana.wal");
    let a = next_flush_at(&log);
    t.put(&key(10), b"v").unwrap();
    let b = next_flush_at(&log);
    t.put(&key(11), b"v").unwrap();
    assert!(a < b && b < next_flush_at(&log));
    for issued_beside in [true, false] {
        let copy = dir.path().join(format!("copy-{issued_beside}"));
        std::fs::create_dir_all(&copy).unwrap();
        for e in std::fs::read_dir(&db_dir).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
        let log = copy.join("dana.wal");
        let c = control(&log);
        if issued_beside {
            // Flush B as if issued while flush A was in flight.
            restamp_flush_marker(&log, b, a);
        }
        // Flush A torn: its first record damaged.
        flip(&log, CONTROL_BYTES + (a + 9) % c.capacity);
        match Db::open(&copy, opts().logs(1)) {
            Ok(db) if issued_beside => {
                assert_eq!(db.recovery().unwrap().flushes_past_end, 1);
                let t = db.tree("t").unwrap();
                for i in 0..10 {
                    assert_eq!(t.get(&key(i)).unwrap(), Some(b"v".to_vec()), "key {i}");
                }
                assert_eq!(t.get(&key(10)).unwrap(), None, "flush A is torn");
                assert_eq!(t.get(&key(11)).unwrap(), None, "flush B follows the break");
                // The log resumes before flush B and goes on.
                t.put(&key(12), b"v").unwrap();
                db.close().unwrap();
                let db = Db::open(&copy, opts().logs(1)).unwrap();
                let t = db.tree("t").unwrap();
                assert_eq!(t.get(&key(12)).unwrap(), Some(b"v".to_vec()));
                assert_eq!(t.get(&key(11)).unwrap(), None);
            }
            Err(Error::CorruptLog { .. }) if !issued_beside => {}
            other => panic!(
                "issued beside: {issued_beside}: {:?}",
                other.map(|_| "opened")
            ),
        }
    }
    drop(db);
}

#[test]
fn a_missing_damaged_or_foreign_log_is_an_error_never_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    for d in [&a, &b] {
        let db = Db::open(d, opts()).unwrap();
        db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
        db.close().unwrap();
    }
    // Missing.
    let saved = std::fs::read(a.join("dana.wal")).unwrap();
    std::fs::remove_file(a.join("dana.wal")).unwrap();
    let e = Db::open(&a, opts()).err().unwrap();
    assert!(matches!(e, Error::Log(_)), "{e}");
    assert!(!a.join("dana.wal").exists(), "the open created a new log");
    // Both control blocks damaged.
    std::fs::write(a.join("dana.wal"), &saved).unwrap();
    flip(&a.join("dana.wal"), 20);
    flip(&a.join("dana.wal"), BLOCK + 20);
    let e = Db::open(&a, opts()).err().unwrap();
    assert!(matches!(e, Error::CorruptLog { offset: 0, .. }), "{e}");
    assert!(e.to_string().contains("dana.wal"), "{e}");
    // Another database's log.
    std::fs::copy(b.join("dana.wal"), a.join("dana.wal")).unwrap();
    let e = Db::open(&a, opts()).err().unwrap();
    assert!(
        matches!(&e, Error::Log(m) if m.contains("another database") && m.contains("dana.wal")),
        "{e}"
    );
    // Its own log back: all is well.
    std::fs::write(a.join("dana.wal"), &saved).unwrap();
    let db = Db::open(&a, opts()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
}

/// A log pads its flushes to the block it was formatted with
/// (`Options::log_flush_block`), recorded in its control blocks; a later
/// open that asks for another keeps the log's own, and recovery scans with
/// it. A block that is no power of two up to 4096 is refused.
#[test]
fn a_log_keeps_the_flush_block_it_was_formatted_with() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dana.wal");
    {
        let db = Db::open(dir.path(), opts().log_flush_block(4096)).unwrap();
        let t = db.create_tree("t").unwrap();
        for i in 0..10u32 {
            t.put(&key(i), &[i as u8; 64]).unwrap();
        }
        db.close().unwrap();
    }
    assert_eq!(control(&log).block, 4096);
    {
        // Another block asked: the log keeps its own. Dropped unclosed.
        let db = Db::open(dir.path(), opts()).unwrap();
        let t = db.tree("t").unwrap();
        for i in 10..40u32 {
            t.put(&key(i), &[i as u8; 64]).unwrap();
        }
    }
    let db = Db::open(dir.path(), opts().log_flush_block(512)).unwrap();
    assert!(db.recovery().unwrap().commits >= 30);
    let t = db.tree("t").unwrap();
    for i in 0..40u32 {
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![i as u8; 64]));
    }
    db.close().unwrap();
    assert_eq!(control(&log).block, 4096);
    let other = tempfile::tempdir().unwrap();
    for bad in [1000, 8192] {
        match Db::open(other.path(), opts().log_flush_block(bad)) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("flush block"), "{m}"),
            Err(e) => panic!("block {bad}: {e}"),
            Ok(_) => panic!("block {bad} was taken"),
        }
        // The refused create left nothing behind.
        let left: Vec<_> = std::fs::read_dir(other.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// A database whose first data file is missing never opens as a new one
/// over what is left: the log that holds its commits (here in another
/// directory, as `Options::log_path` allows), or its other data files.
/// The first version formatted a new database there and overwrote the
/// log (found by an outside probe: 1,000 acknowledged commits gone).
#[test]
fn a_missing_data_file_never_becomes_a_new_database_over_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let o = opts().log_path(logs.join("db.wal"));
    let db = Db::open(&data, o.clone()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..300 {
        t.put(&key(i), b"acknowledged").unwrap();
    }
    drop((t, db)); // no close: the commits live in the log
    std::fs::rename(data.join("dana.0"), dir.path().join("dana.0.away")).unwrap();
    let before = snapshot(&logs);
    let err = Db::open(&data, o.clone())
        .err()
        .expect("opened over a missing data file");
    assert!(matches!(err, Error::Log(_)), "{err}");
    assert!(
        err.to_string().contains("holds the log of a dana database"),
        "{err}"
    );
    assert_eq!(snapshot(&logs), before, "the log was touched");
    assert!(!data.join("dana.0").exists(), "a data file was created");
    // Put back, everything is there.
    std::fs::rename(dir.path().join("dana.0.away"), data.join("dana.0")).unwrap();
    let db = Db::open(&data, o).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.iter().count(), 300);
    db.close().unwrap();

    // Two data files, the first missing: refused before anything changes.
    let two = dir.path().join("two");
    let db = Db::open(&two, opts().devices(2)).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    std::fs::remove_file(two.join("dana.0")).unwrap();
    let before = snapshot(&two);
    let err = Db::open(&two, opts()).err().expect("opened without dana.0");
    assert!(matches!(err, Error::NotADatabase { .. }), "{err}");
    assert_eq!(snapshot(&two), before);
}

/// A new database's log is never formatted over a file that is already
/// at its path.
#[test]
fn a_new_log_is_never_formatted_over_a_file_that_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("elsewhere.wal");
    std::fs::write(&log, b"somebody's bytes").unwrap();
    let err = Db::open(dir.path().join("db"), opts().log_path(&log))
        .err()
        .expect("formatted over a file");
    assert!(matches!(err, Error::Log(_)), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), b"somebody's bytes");
    assert!(
        !dir.path().join("db").exists(),
        "a failed open left a directory"
    );
    std::fs::remove_file(&log).unwrap();
    let db = Db::open(dir.path().join("db"), opts().log_path(&log)).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
}

/// Handles of one database used with another are refused: a tree in
/// another database's transaction (its root page id would name another
/// tree there: the first version wrote into it), a transaction committed
/// on another database, and a tree used inside another database's task
/// (its pages would go through the other database's device queues).
#[test]
fn handles_of_another_database_are_refused() {
    let (da, db_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Db::open(da.path(), opts()).unwrap();
    let b = Db::open(db_dir.path(), opts()).unwrap();
    let ta = a.create_tree("t").unwrap();
    let tb = b.create_tree("t").unwrap();
    let err = a
        .transaction(|tx| tx.put(&tb, b"k", b"v"))
        .expect_err("a foreign tree was written");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let mut tx = a.begin();
    assert!(matches!(tx.get(&tb, b"k"), Err(Error::InvalidArgument(_))));
    tx.put(&ta, b"k", b"v").unwrap();
    assert!(matches!(b.commit(tx), Err(Error::InvalidArgument(_))));
    let tb2 = tb.clone();
    let inside = a
        .block_on(async move { tb2.put_async(b"x", b"y").await })
        .unwrap();
    assert!(
        matches!(inside, Err(Error::InvalidArgument(_))),
        "{inside:?}"
    );
    assert_eq!(ta.get(b"k").unwrap(), None);
    assert_eq!(tb.get(b"k").unwrap(), None);
    assert_eq!(tb.get(b"x").unwrap(), None);
    a.close().unwrap();
    b.close().unwrap();
}

/// Odd calls an outside probe made, each with a clear answer: `close`
/// and `get_many` inside a task are refused (and close nothing); a path that is a file is
/// not a database; reading past the end of a large value gives nothing,
/// as past an inline one; and a hot key updated by eight threads at once
/// never fails with a conflict (the retries pause).
#[test]
fn odd_calls_get_clear_answers() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path().join("db"), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    let d2 = db.clone();
    let inside = db.block_on(async move { d2.close() }).unwrap();
    assert!(
        matches!(inside, Err(Error::InvalidArgument(_))),
        "{inside:?}"
    );
    t.put(b"still", b"open").unwrap();
    // So is an open: it blocked the worker for the whole recovery, and
    // recovery wrote the files before the refusal.
    let elsewhere = dir.path().join("opened-in-a-task");
    {
        let other = Db::open(&elsewhere, opts()).unwrap();
        other.create_tree("t").unwrap().put(b"k", b"v").unwrap();
        // No close: the commits are only in the log.
    }
    let before = snapshot(&elsewhere);
    let e2 = elsewhere.clone();
    let opened = db
        .block_on(async move { Db::open(&e2, opts()).map(|_| ()) })
        .unwrap();
    assert!(
        matches!(opened, Err(Error::InvalidArgument(_))),
        "{opened:?}"
    );
    assert_eq!(snapshot(&elsewhere), before, "an open inside a task wrote");
    // So is `get_many` (it blocked the worker its reads were queued on,
    // for good).
    let t2 = t.clone();
    let many = db
        .block_on(async move { t2.get_many(&[b"still".to_vec()]) })
        .unwrap();
    assert!(matches!(many, Err(Error::InvalidArgument(_))), "{many:?}");
    assert_eq!(
        t.get_many(&[b"still".to_vec()]).unwrap()[0].as_deref(),
        Some(&b"open"[..])
    );

    // A capacity too small to hold a database says which option.
    for cap in [0, 4096, 15 * 4096] {
        let e = Db::open(dir.path().join("tiny"), opts().capacity_bytes(cap))
            .err()
            .unwrap();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("Options::capacity_bytes")),
            "{e}"
        );
    }
    assert!(!dir.path().join("tiny").exists());

    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        Db::open(&file, opts()),
        Err(Error::NotADatabase { .. })
    ));

    t.put(b"big", &vec![5u8; 3 * 4096]).unwrap();
    t.put(b"small", b"abc").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(t.read_value(b"big", 3 * 4096, &mut buf).unwrap(), Some(0));
    assert_eq!(t.read_value(b"big", 1 << 40, &mut buf).unwrap(), Some(0));
    assert_eq!(t.read_value(b"small", 10, &mut buf).unwrap(), Some(0));

    t.put(b"n", &0u64.to_le_bytes()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..300 {
                    t.update(b"n", |v| {
                        let n = u64::from_le_bytes(v.try_into().unwrap());
                        (n + 1).to_le_bytes().to_vec()
                    })
                    .unwrap();
                }
            });
        }
    });
    let n = t.get(b"n").unwrap().unwrap();
    assert_eq!(u64::from_le_bytes(n.try_into().unwrap()), 2400);
    // So does `update_async`, from many tasks (it tried 16 times at once:
    // about 1 of these 32,000 failed with `Conflict`; a docs review's
    // finding).
    t.put(b"m", &0u64.to_le_bytes()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..64 {
        let (t, tx) = (t.clone(), tx.clone());
        db.spawn(async move {
            for _ in 0..500 {
                let r = t
                    .update_async(b"m", |v| {
                        let n = u64::from_le_bytes(v.try_into().unwrap());
                        (n + 1).to_le_bytes().to_vec()
                    })
                    .await;
                let _ = tx.send(r);
            }
        })
        .unwrap();
    }
    drop(tx);
    let failed: Vec<_> = rx.iter().filter_map(|r| r.err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        failed.first()
    );
    let n = t.get(b"m").unwrap().unwrap();
    assert_eq!(u64::from_le_bytes(n.try_into().unwrap()), 32_000);
    // An iterator outliving the close answers Closed, also for entries
    // of a leaf it had fetched.
    let mut it = t.iter();
    assert!(it.next().unwrap().is_ok());
    db.close().unwrap();
    assert!(matches!(it.next(), Some(Err(Error::Closed))));
    assert!(it.next().is_none());
}

/// Messages an outside probe found unclear: a missing stripe file read
/// "striped over 2 devices; 1 were given", and `log_path` naming the
/// database's own data file answered `Locked`.
#[test]
fn a_missing_stripe_and_a_log_path_on_a_data_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    Db::open(dir.path(), opts().devices(2))
        .unwrap()
        .close()
        .unwrap();
    let (one, away) = (dir.path().join("dana.1"), dir.path().join("away"));
    std::fs::rename(&one, &away).unwrap();
    let e = Db::open(dir.path(), opts()).err().unwrap();
    assert!(
        matches!(&e, Error::NotADatabase { what, .. }
            if what.contains("1 was given") && what.contains("dana.1 is missing")),
        "{e}"
    );
    std::fs::rename(&away, &one).unwrap();
    let e = Db::open(dir.path(), opts().log_path(dir.path().join("dana.0")))
        .err()
        .unwrap();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("log_path") && m.contains("dana.0")),
        "{e}"
    );
    // The same through the devices' paths.
    let paths = [dir.path().join("dana.0"), one.clone()];
    let e = Db::open_devices(&paths, opts().log_path(&one), false)
        .err()
        .unwrap();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("log_path") && m.contains("dana.1")),
        "{e}"
    );
    Db::open(dir.path(), opts()).unwrap().close().unwrap();
}

/// A growing log's file cut on a whole MiB, below the size its control
/// block records (format version 10): `CorruptLog`, where it once opened
/// with the commits past the cut gone.
#[test]
fn a_log_file_cut_on_a_whole_mib_is_corrupt_log() {
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, copy) = (dir.path().join("db"), dir.path().join("copy"));
    let o = || opts().log_bytes(8 << 20);
    let db = Db::open(&db_dir, o()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..4000u32 {
        t.put(&key(i), &[i as u8; 500]).unwrap();
    }
    db.checkpoint().unwrap();
    for i in 0..20u32 {
        t.put(&key(i), &[7; 64]).unwrap();
    }
    copy_files(&db_dir, &copy);
    drop(db);
    let log = copy.join("dana.wal");
    let full = std::fs::metadata(&log).unwrap().len();
    assert!(
        full >= CONTROL_BYTES + (2 << 20),
        "the log grew to {full} bytes only"
    );
    assert!(control(&log).stream_bytes >= 2 << 20, "{:?}", control(&log));
    assert_cut_back_to_one_mib_is_refused(&copy, o());
}

/// A growing log's file with part of a MiB past what its control block
/// records (a growth cut short: a kill in its zero writes, or a full file
/// system's truncation not yet durable) holds no record there: it opens
/// with every commit, takes more, and opens again. (It failed with
/// `CorruptLog`, "not at a size it grows to"; a review's finding.)
#[test]
fn a_log_file_with_a_growth_cut_short_opens() {
    let dir = tempfile::tempdir().unwrap();
    let o = || opts().log_bytes(64 << 20);
    let db = Db::open(dir.path(), o()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..3000u32 {
        t.put(&key(i), &[i as u8; 500]).unwrap();
    }
    drop(t);
    db.close().unwrap();
    let log = dir.path().join("dana.wal");
    let len = std::fs::metadata(&log).unwrap().len();
    assert!(len < CONTROL_BYTES + (64 << 20), "the log grew whole");
    assert_eq!((len - CONTROL_BYTES) % (1 << 20), 0);
    assert!(control(&log).stream_bytes <= len - CONTROL_BYTES);
    // 300 KiB of zeros past the end, as a cut growth leaves them.
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(len + (300 << 10)).unwrap();
    drop(f);
    for round in 0..2u32 {
        let db = Db::open(dir.path(), o()).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let t = db.tree("t").unwrap();
        for i in 0..3000u32 {
            let want = if round > 0 && i % 7 == 0 { 9 } else { i as u8 };
            assert_eq!(t.get(&key(i)).unwrap(), Some(vec![want; 500]), "key {i}");
        }
        for i in (0..3000u32).step_by(7) {
            t.put(&key(i), &[9; 500]).unwrap();
        }
        drop(t);
        // Dropped without close: the next open redoes the puts.
        drop(db);
    }
}

/// The same cut within the log's growth since the last checkpoint: each
/// growth records the file's new size in a control block before a flush
/// writes past the old one (before, only checkpoints did, and a log cut
/// back to the size of the last one opened without the commits past the
/// cut).
#[test]
fn a_log_file_cut_back_to_before_a_growth_is_corrupt_log() {
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, copy, whole) = (
        dir.path().join("db"),
        dir.path().join("copy"),
        dir.path().join("whole"),
    );
    let o = || opts().log_bytes(64 << 20).checkpoint_shards(1);
    let log = db_dir.join("dana.wal");
    let db = Db::open(&db_dir, o()).unwrap();
    let t = db.create_tree("t").unwrap();
    let created = control(&log);
    // Commits past the first MiB of stream, none of them checkpointed.
    let mut n = 0u32;
    while next_flush_at(&log) < (1 << 20) + (64 << 10) {
        assert!(n < 20_000, "the log did not grow: {:?}", control(&log));
        for _ in 0..100 {
            t.put(&key(n), &[n as u8; 500]).unwrap();
            n += 1;
        }
    }
    let c = control(&log);
    assert!(c.stream_bytes >= 2 << 20, "{c:?}");
    assert_eq!(
        (c.checkpoint, c.redo),
        (created.checkpoint, created.redo),
        "a checkpoint ran: {c:?}"
    );
    copy_files(&db_dir, &copy);
    copy_files(&db_dir, &whole);
    drop(db);
    // Uncut, every commit is there.
    let db = Db::open(&whole, o()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..n {
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![i as u8; 500]), "{i}");
    }
    db.close().unwrap();
    assert_cut_back_to_one_mib_is_refused(&copy, o());
}

/// Cuts the log file of the database in `dir` to its first MiB of stream
/// and asserts that read-only and writable opens (with `o`) refuse it as
/// cut short.
fn assert_cut_back_to_one_mib_is_refused(dir: &Path, o: Options) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("dana.wal"))
        .unwrap()
        .set_len(CONTROL_BYTES + (1 << 20))
        .unwrap();
    for o in [o.clone().read_only(), o] {
        let e = Db::open(dir, o).err().expect("a cut log opened");
        assert!(
            matches!(&e, Error::CorruptLog { what, .. } if what.contains("cut short")),
            "{e}"
        );
    }
}

/// A creation cut short (a kill during `Db::open` of a new database)
/// leaves its marker: the next writable open removes what it left and
/// creates the database again, a read-only one says so. An outside probe
/// killed creations part-way and found a zero-filled `dana.0` that no
/// open accepted.
#[test]
fn a_creation_cut_short_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().join("db");
    Db::open(&db_dir, opts()).unwrap().close().unwrap();
    assert!(
        !db_dir.join("dana.creating").exists(),
        "a finished creation left its marker"
    );
    // What a creation killed after its files were made leaves.
    let cut = dir.path().join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::write(cut.join("dana.creating"), b"").unwrap();
    std::fs::write(cut.join("dana.0"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(cut.join("dana.1"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(cut.join("dana.wal"), vec![0u8; 8192]).unwrap();
    let e = Db::open(&cut, opts().read_only()).err().unwrap();
    assert!(
        matches!(&e, Error::NotADatabase { what, .. } if what.contains("cut short")),
        "{e}"
    );
    let db = Db::open(&cut, opts()).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    assert!(!cut.join("dana.creating").exists() && !cut.join("dana.1").exists());
    let db = Db::open(&cut, opts().read_only()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    db.close().unwrap();
    // Without the marker, the same files are refused, never replaced.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("dana.0"), vec![0u8; 1 << 20]).unwrap();
    assert!(Db::open(&other, opts()).is_err());
    assert_eq!(
        std::fs::read(other.join("dana.0")).unwrap(),
        vec![0u8; 1 << 20]
    );
}

/// Devices given in another order, or a device of another database in
/// the place of one of this one's, are refused before anything changes:
/// a page striped over the wrong device would read another page's bytes.
/// No device carries an identity of its own (only mirrored copies and
/// out-of-place devices have labels): what refuses them is the page ids
/// (swapped), the free-space counts (a foreign second device) and the
/// page LSNs against the log (a foreign first device). A foreign device
/// agreeing on all three would open.
#[test]
fn devices_in_another_order_or_from_another_database_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let db = Db::open_devices(&[&a, &b], opts(), true).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..2000 {
        t.put(&key(i), &[7u8; 100]).unwrap();
    }
    drop(t);
    db.close().unwrap();
    let other = tempfile::tempdir().unwrap();
    let (c, d) = (other.path().join("c"), other.path().join("d"));
    let db = Db::open_devices(&[&c, &d], opts(), true).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    let before = (snapshot(dir.path()), snapshot(other.path()));
    for (name, paths) in [
        ("swapped", [&b, &a]),
        ("foreign second", [&a, &d]),
        ("foreign first", [&c, &b]),
    ] {
        match Db::open_devices(&paths, opts(), false) {
            Ok(db) => {
                let n = db
                    .tree("t")
                    .and_then(|t| t.iter().collect::<Result<Vec<_>, _>>());
                panic!("{name}: opened ({:?} entries)", n.map(|v| v.len()));
            }
            Err(e) => eprintln!("{name}: {e}"),
        }
        let after = (snapshot(dir.path()), snapshot(other.path()));
        assert_eq!(after, before, "{name}: a file changed");
    }
    let db = Db::open_devices(&[&a, &b], opts(), false).unwrap();
    assert_eq!(db.tree("t").unwrap().iter().count(), 2000);
    db.close().unwrap();
}

/// `create_tree` and `drop_tree` inside a task are refused, as every
/// blocking call is: they waited for the catalogue's lock on the worker,
/// and a thread holding that lock waited for a task on the same worker,
/// so both hung for good (a review of odd API calls).
#[test]
fn catalogue_changes_inside_a_task_are_refused_without_blocking_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts().workers(1)).unwrap();
    let (done_tx, done) = std::sync::mpsc::channel();
    let from_thread = {
        let (db, done_tx) = (db.clone(), done_tx.clone());
        std::thread::spawn(move || {
            for i in 0..200 {
                db.create_tree(&format!("t{i}")).unwrap();
                assert!(db.drop_tree(&format!("t{i}")).unwrap());
            }
            done_tx.send(()).unwrap();
        })
    };
    let from_task = {
        let db = db.clone();
        std::thread::spawn(move || {
            for _ in 0..2_000 {
                let d = db.clone();
                let (created, dropped) = db
                    .block_on(async move { (d.create_tree("in-task"), d.drop_tree("t0")) })
                    .unwrap();
                assert!(
                    matches!(created, Err(Error::InvalidArgument(_))),
                    "{:?}",
                    created.map(|t| t.name().to_string())
                );
                assert!(
                    matches!(dropped, Err(Error::InvalidArgument(_))),
                    "{dropped:?}"
                );
            }
            done_tx.send(()).unwrap();
        })
    };
    for _ in 0..2 {
        done.recv_timeout(std::time::Duration::from_secs(120))
            .expect("catalogue changes hung");
    }
    from_thread.join().unwrap();
    from_task.join().unwrap();
    assert!(matches!(db.tree("in-task"), Err(Error::NoSuchTree(_))));
    db.close().unwrap();
}

/// Sizes past what the machine or the log format can take are refused
/// with the option's name, before a file is created: a preallocated log
/// of `log_bytes(u64::MAX)` overflowed its file size (a panic in a debug
/// build), and `record_cache_bytes(usize::MAX)` aborted the process on
/// the allocation of the cache's filters (a review of odd API calls).
#[test]
fn sizes_past_the_machine_or_the_format_are_refused_before_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            opts().log_bytes(u64::MAX).log_preallocate(true),
            "Options::log_bytes",
        ),
        (opts().log_bytes(u64::MAX), "Options::log_bytes"),
        (
            opts().record_cache_bytes(usize::MAX),
            "Options::record_cache_bytes",
        ),
        (opts().pool_bytes(15 * 4096), "Options::pool_bytes"),
    ];
    for (i, (o, option)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("db{i}"));
        let e = Db::open(&path, o).err().unwrap();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains(option)),
            "case {i}: {e}"
        );
        assert!(!path.exists(), "case {i}: the open left {}", path.display());
    }
}

/// The last handle dropped inside a task keeps the database's locks until
/// its workers have stopped: it released them at once while the workers
/// (the very one running the drop among them) went on, so another open
/// could start on files they still wrote (a review of odd API calls).
#[test]
fn the_last_handle_dropped_inside_a_task_keeps_the_locks_until_the_workers_stop() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    let (handle_dropped, told) = std::sync::mpsc::channel::<()>();
    let (dropped_inside, inside) = std::sync::mpsc::channel::<()>();
    let last = db.clone();
    db.spawn(async move {
        // Wait (yielding) until the thread dropped its own handle.
        while told.try_recv().is_err() {
            dana::sched::yield_now().await;
        }
        drop(last);
        dropped_inside.send(()).unwrap();
        // The worker runs on a while: the locks must still be held.
        std::thread::sleep(std::time::Duration::from_millis(300));
    })
    .unwrap();
    drop(db);
    handle_dropped.send(()).unwrap();
    inside
        .recv_timeout(std::time::Duration::from_secs(30))
        .unwrap();
    match Db::open(dir.path(), opts()) {
        Err(Error::Locked { .. }) => {}
        Ok(_) => panic!("opened while the dropped database's worker still ran"),
        Err(e) => panic!("{e}"),
    }
    // Once the worker stopped, the locks are free.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let db = loop {
        match Db::open(dir.path(), opts()) {
            Ok(db) => break db,
            Err(Error::Locked { .. }) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    db.close().unwrap();
}

/// The files an open removes after a creation cut short are those the
/// creation made, at the log path it used: the open removed the log
/// files at the path it was given, so a cut creation reopened with a
/// `log_path` naming someone else's file deleted it (and its `.1`, `.m1`
/// neighbours). And a log path whose files would take the names of the
/// database's own is refused (`dana.1` made a one-device database open
/// as two devices, never to open again). Both from a review of odd API
/// calls.
#[test]
fn log_paths_never_touch_files_the_database_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    // A creation cut short, with its logs elsewhere.
    let cut = dir.path().join("cut");
    let first_log = dir.path().join("first.wal");
    Db::open(&cut, opts().log_path(&first_log))
        .unwrap()
        .close()
        .unwrap();
    // As a kill before the end of the creation would leave it: the
    // marker (naming the log path) put back beside the files.
    std::fs::write(
        cut.join("dana.creating"),
        std::path::absolute(&first_log)
            .unwrap()
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    let precious = dir.path().join("precious");
    for p in [
        precious.clone(),
        dir.path().join("precious.1"),
        dir.path().join("precious.m1"),
    ] {
        std::fs::write(&p, b"not a log").unwrap();
    }
    let _ = Db::open(&cut, opts().log_path(&precious));
    for p in ["precious", "precious.1", "precious.m1"] {
        let now = std::fs::read(dir.path().join(p)).unwrap();
        assert!(
            now == b"not a log",
            "{p} was touched ({} bytes now)",
            now.len()
        );
    }
    assert!(!first_log.exists(), "the cut creation's own log was left");

    // Log paths among the database's names.
    for name in ["dana.1", "dana", "dana.7.m1", "dana.creating"] {
        let db_dir = dir.path().join(format!("db-{name}"));
        std::fs::create_dir_all(&db_dir).unwrap();
        let e = Db::open(&db_dir, opts().log_path(db_dir.join(name)))
            .err()
            .unwrap_or_else(|| panic!("log path {name} accepted"));
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("Options::log_path")),
            "{name}: {e}"
        );
        assert_eq!(std::fs::read_dir(&db_dir).unwrap().count(), 0, "{name}");
    }
    // Names that only look alike are fine.
    let db_dir = dir.path().join("db-ok");
    let db = Db::open(&db_dir, opts().log_path(db_dir.join("dana.log"))).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    let db = Db::open(&db_dir, opts().log_path(db_dir.join("dana.log"))).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    db.close().unwrap();
}

/// Options an open cannot work with are refused before recovery writes a
/// byte: the log's flush settings were checked when the logs started and
/// the worker count when the workers did, after recovery had redone pages
/// onto the files (a review of odd API calls).
#[test]
fn bad_options_are_refused_before_recovery_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..2_000u32 {
        t.put(&i.to_be_bytes(), &[3; 100]).unwrap();
    }
    drop((t, db)); // no close: the commits are only in the log
    let before = snapshot(dir.path());
    for (o, what) in [
        (
            opts().log_flushes_in_flight(0),
            "Options::log_flushes_in_flight",
        ),
        (opts().log_flush_block(3), "Options::log_flush_block"),
        (opts().workers(0), "Options::workers"),
        (opts().queue_depth(0), "Options::queue_depth"),
        (
            opts().queue_depth(dana::MAX_QUEUE_DEPTH + 1),
            "Options::queue_depth",
        ),
        (
            opts().max_tasks_per_worker(0),
            "Options::max_tasks_per_worker",
        ),
        (opts().logs(dana::wal::MAX_LOGS + 1), "Options::logs"),
        // Past these, sizes computed from them overflowed (a panic) or
        // the allocator was asked for terabytes (the process aborted).
        (opts().workers(dana::MAX_WORKERS + 1), "Options::workers"),
        (opts().workers(usize::MAX), "Options::workers"),
        (opts().devices(dana::MAX_DEVICES + 1), "Options::devices"),
        (opts().devices(usize::MAX), "Options::devices"),
        (opts().pool_bytes(usize::MAX), "Options::pool_bytes"),
    ] {
        let e = Db::open(dir.path(), o).err().unwrap();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains(what)),
            "{e}"
        );
        assert_eq!(snapshot(dir.path()), before, "{what}: the open wrote");
    }
    let db = Db::open(dir.path(), opts()).unwrap();
    assert!(db.recovery().unwrap().commits > 0);
    assert_eq!(
        db.tree("t").unwrap().get(&1999u32.to_be_bytes()).unwrap(),
        Some(vec![3; 100])
    );
    db.close().unwrap();
}

/// An open that adds a log to a database that had none formats the log
/// first and names it in the meta page only at its checkpoint: a crash in
/// between leaves a formatted log the meta page does not name. It holds
/// no acknowledged commit (a log is checkpointed before the open that
/// formatted it returns), so the next open formats it again; it was
/// refused as another database's log, every time (a review's finding).
/// The formatted log is made here by hand, as that open left it.
#[test]
fn a_log_formatted_by_an_open_that_never_finished_is_taken_again() {
    use dana::io::device::{Device, DeviceOptions};
    use dana::io::Target;
    use dana::wal::recover::{format, LogPlace};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts().durability(Durability::Off)).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    let log = dir.path().join("dana.wal");
    assert!(!log.exists(), "a database without a log has a log file");
    let dopts = DeviceOptions {
        direct: false,
        create_size: Some(CONTROL_BYTES + (1 << 20)),
        read_only: false,
        lock: false,
    };
    let device = Device::open(&log, 0, dopts).unwrap();
    let place = LogPlace {
        index: 0,
        count: 1,
        next_gsn: 1,
    };
    let t = Target::File(device.into());
    format(&t, 1 << 20, 4096, 0x5eed, place).unwrap();
    drop(t);
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    t.put(b"after", b"log").unwrap();
    drop((t, db)); // no close: the commit lives in the new log
    let db = Db::open(dir.path(), opts()).unwrap();
    assert_eq!(
        db.tree("t").unwrap().get(b"after").unwrap(),
        Some(b"log".to_vec())
    );
    db.close().unwrap();
}
