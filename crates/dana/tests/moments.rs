//! Files restored from different moments: data files and a log that do
//! not belong together (one of them put back from an older copy) are
//! refused, at the open or at the first read of a page the log never
//! logged, with nothing written; never opened with commits lost, a hang,
//! or a panic (an outside probe found all three).

use std::collections::BTreeMap;
use std::path::Path;

use dana::{Db, Error, Options};

fn opts() -> Options {
    Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(32 << 20)
        .log_bytes(4 << 20)
}

fn key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

fn put(db: &Db, keys: std::ops::Range<u32>, fill: u8) {
    let t = db.tree_or_create("t").unwrap();
    for i in keys {
        t.put(&key(i), &[fill; 100]).unwrap();
    }
}

/// Every file's bytes in `dir`, by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Opens `dir` read-only and writable; both must fail with an error
/// whose text holds `says`, and leave every file as it was.
fn refused_with(dir: &Path, o: &Options, says: &str) {
    let before = files(dir);
    for o in [o.clone().read_only(), o.clone()] {
        let e = Db::open(dir, o).err().expect("mismatched files opened");
        assert!(
            matches!(&e, Error::Log(m) if m.contains(says) && m.contains("different moments")),
            "{e}"
        );
        assert!(files(dir) == before, "a refused open changed a file");
    }
}

/// A database closed once with keys 0..500 (`old`: a copy of its files
/// then), then opened again, changed and checkpointed (the live files).
fn two_moments(dir: &Path, old: &Path, o: &Options) {
    let db = Db::open(dir, o.clone()).unwrap();
    put(&db, 0..500, 1);
    db.close().unwrap();
    std::fs::create_dir_all(old).unwrap();
    for (name, bytes) in files(dir) {
        std::fs::write(old.join(name), bytes).unwrap();
    }
    let db = Db::open(dir, o.clone()).unwrap();
    put(&db, 0..1000, 2);
    db.checkpoint().unwrap();
    put(&db, 1000..1100, 3);
    db.close().unwrap();
}

fn all_keys_there(dir: &Path, o: &Options) {
    let db = Db::open(dir, o.clone()).unwrap();
    let t = db.tree("t").unwrap();
    for i in 0..1100 {
        let fill = if i < 1000 { 2 } else { 3 };
        assert_eq!(t.get(&key(i)).unwrap(), Some(vec![fill; 100]), "key {i}");
    }
    db.close().unwrap();
}

/// [`two_moments`], with the older copy of the file `name` put back:
/// refused with an error that `says`; with the newer one back, the files
/// that belong together still open whole.
fn old_file_put_back(name: &str, says: &str) {
    old_file_put_back_with(&opts(), name, says)
}

/// [`old_file_put_back`] with the options `o`.
fn old_file_put_back_with(o: &Options, name: &str, says: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (live, old) = (dir.path().join("db"), dir.path().join("old"));
    two_moments(&live, &old, o);
    let newer = std::fs::read(live.join(name)).unwrap();
    std::fs::copy(old.join(name), live.join(name)).unwrap();
    refused_with(&live, o, says);
    std::fs::write(live.join(name), newer).unwrap();
    all_keys_there(&live, o);
}

#[test]
fn older_data_files_beside_a_newer_log_are_refused() {
    old_file_put_back("dana.0", "older than the log");
}

#[test]
fn newer_data_files_beside_an_older_log_are_refused() {
    old_file_put_back("dana.wal", "log 0 is older than the data files");
}

/// Data files whose meta page records no log ends (0: written before the
/// ends were recorded, as every file of an older build) beside an older
/// log: the stamp's own check still refuses them, "newer than the log".
#[test]
fn without_recorded_log_ends_the_stamp_still_refuses_an_older_log() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let (live, old) = (dir.path().join("db"), dir.path().join("old"));
    two_moments(&live, &old, &opts());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(live.join("dana.0"))
        .unwrap();
    let mut meta = vec![0u8; 4096];
    f.read_exact_at(&mut meta, 0).unwrap();
    // The log ends (`buffer::alloc`: bytes 384..896 of the meta page).
    meta[384..896].fill(0);
    dana::buffer::page::seal(&mut meta);
    f.write_all_at(&meta, 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::fs::copy(old.join("dana.wal"), live.join("dana.wal")).unwrap();
    refused_with(&live, &opts(), "newer than the log");
}

/// With a log per worker, either log put back from an older copy is
/// refused: the other log, newer, hid it from the check of the stamp
/// against the logs' newest end, and its acknowledged commits were lost
/// with no error (an outside probe's finding). Each log is checked
/// against its own end, which the last checkpoint made durable before it
/// wrote the meta page.
#[test]
fn one_of_several_logs_put_back_from_an_older_copy_is_refused() {
    let o = opts().workers(2).logs(2);
    for name in ["dana.wal", "dana.wal.1"] {
        old_file_put_back_with(&o, name, "is older than the data files");
    }
}

/// The log copied right after an open, the data files later in the same
/// checkpoint period, after eviction wrote pages changed since: the
/// stamps agree (no checkpoint in between), but those pages carry LSNs
/// the old log never reached. Their reads fail (`Corrupt`), where the
/// first change of such a page once tripped a release assertion and
/// aborted the process, and a crashed database's open hung; a read-only
/// open's reads fail the same way.
#[test]
fn a_page_newer_than_the_log_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (live, mixed) = (dir.path().join("db"), dir.path().join("mixed"));
    // A pool of 64 pages, ~250 pages of keys, a log no checkpoint empties
    // during the test.
    const KEYS: u32 = 8000;
    let o = || opts().pool_bytes(64 * 4096).log_bytes(32 << 20);
    let db = Db::open(&live, o()).unwrap();
    put(&db, 0..KEYS, 1);
    db.close().unwrap();
    let db = Db::open(&live, o()).unwrap();
    std::fs::create_dir_all(&mixed).unwrap();
    std::fs::copy(live.join("dana.wal"), mixed.join("dana.wal")).unwrap();
    let writes_before = db.pool_stats().writes;
    put(&db, 0..KEYS, 2);
    assert!(
        db.pool_stats().writes > writes_before + 20,
        "eviction wrote no changed page"
    );
    std::fs::copy(live.join("dana.0"), mixed.join("dana.0")).unwrap();
    drop(db);

    // (Or refused at the open, when a checkpoint wrote the data files'
    // meta page past the log's end.)
    let newer = |e: &Error| {
        matches!(e, Error::Corrupt { what, .. } if what.contains("newer than the log"))
            || matches!(e, Error::Log(m) if m.contains("different moments"))
    };
    // Read-only first (it changes nothing): a read of a newer page fails
    // too (a read-only open had no check: it served them; a review's
    // finding).
    match Db::open(&mixed, o().read_only()) {
        Err(e) => assert!(newer(&e), "{e}"),
        Ok(db) => {
            let t = db.tree("t").unwrap();
            let e = (0..KEYS)
                .find_map(|i| t.get(&key(i)).err())
                .expect("a read-only open read every page of the newer data files");
            assert!(newer(&e), "{e}");
            drop(db);
        }
    }
    let db = match Db::open(&mixed, o()) {
        Err(e) => {
            assert!(newer(&e), "{e}");
            return;
        }
        Ok(db) => db,
    };
    let t = db.tree("t").unwrap();
    let mut found = None;
    for i in 0..KEYS {
        // Reads and changes of every leaf: a change of a newer page would
        // once have aborted.
        match t.put(&key(i), &[3; 100]) {
            Ok(_) => {}
            Err(e) => {
                found = Some(e);
                break;
            }
        }
    }
    let e = found.expect("every page of the newer data files was read without an error");
    assert!(newer(&e) || matches!(e, Error::Poisoned(_)), "{e}");
    drop(db);
}

/// A checkpoint cut after its write-back (the stamp on the data files)
/// and before its control block: files that belong together. A read-only
/// open once took the stamp's record past the older control block's next
/// GSN for a log older than the data files (a review found it).
#[test]
fn a_checkpoint_cut_before_its_control_block_is_not_from_another_moment() {
    let dir = tempfile::tempdir().unwrap();
    let (live, cut) = (dir.path().join("db"), dir.path().join("cut"));
    let db = Db::open(&live, opts()).unwrap();
    put(&db, 0..300, 1);
    db.checkpoint().unwrap();
    let controls = std::fs::read(live.join("dana.wal")).unwrap()[..8192].to_vec();
    db.checkpoint().unwrap();
    std::fs::create_dir_all(&cut).unwrap();
    for (name, bytes) in files(&live) {
        std::fs::write(cut.join(name), bytes).unwrap();
    }
    drop(db);
    // The newer checkpoint's control block never written.
    let mut log = std::fs::read(cut.join("dana.wal")).unwrap();
    log[..8192].copy_from_slice(&controls);
    std::fs::write(cut.join("dana.wal"), &log).unwrap();
    for o in [opts().read_only(), opts()] {
        let db = Db::open(&cut, o).unwrap();
        let t = db.tree("t").unwrap();
        for i in 0..300 {
            assert_eq!(t.get(&key(i)).unwrap(), Some(vec![1; 100]));
        }
        db.close().unwrap();
    }
}
