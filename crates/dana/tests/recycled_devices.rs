//! A new database formatted over devices or files that held an earlier
//! one: nothing of the earlier one may come back or stand in the way.
//!
//! Every log starts at the same LSN and every database's GSNs at 1, so an
//! earlier log's records and flush markers check out at their own
//! positions, and an earlier database's pages pass their checksums and
//! page ids with LSNs that may lie in the new log's window. A review found
//! both: a new log over an old one failed every open after a clean close
//! (an old flush marker past the end read as damage to durable records),
//! and after a crash the old database's keys were readable in the new one
//! (recovery kept old pages over the new pages' images). Creation now
//! clears the log stream whole and starts data files (and simulated
//! devices) empty.

use std::sync::Arc;

use dana::io::sim::{SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Options};

const LOG: u64 = 1 << 20;

fn open(data: &Arc<SimDisk>, log: &Arc<SimDisk>, opts: &Options, create: bool) -> dana::Result<Db> {
    let array = Array::new(vec![Target::Sim(data.clone())], 4096).unwrap();
    Db::open_array_with_log(array, Some(Target::Sim(log.clone())), opts.clone(), create)
}

/// An earlier database's commits in the first lap of `log`.
fn earlier_log(log: &Arc<SimDisk>) {
    let data = SimDisk::new(0, 32 << 20, SimConfig::default());
    let opts = Options::default().pool_bytes(2 << 20).log_bytes(LOG);
    let db = open(&data, log, &opts, true).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0u32..1_000 {
        t.put(&i.to_be_bytes(), &[7; 100]).unwrap();
    }
    drop(t);
    db.close().unwrap();
}

/// A new database on `log`, one commit, closed, opened again.
fn new_database_reopens(log: &Arc<SimDisk>) {
    let opts = Options::default().pool_bytes(2 << 20).log_bytes(LOG);
    let data = SimDisk::new(0, 32 << 20, SimConfig::default());
    let db = open(&data, log, &opts, true).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"v").unwrap();
    drop(t);
    db.close().unwrap();
    let db = open(&data, log, &opts, false).unwrap_or_else(|e| panic!("reopen failed: {e}"));
    assert_eq!(
        db.tree("t").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
}

#[test]
fn a_new_log_over_an_earlier_one_whose_control_blocks_were_wiped_reopens() {
    let log = SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::default());
    earlier_log(&log);
    log.overwrite_durable(0, &vec![0u8; CONTROL_BYTES as usize]);
    new_database_reopens(&log);
}

#[test]
fn a_new_log_over_an_intact_earlier_one_reopens() {
    let log = SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::default());
    earlier_log(&log);
    new_database_reopens(&log);
}

/// Writes an earlier database's keys `old…` through `put`, then a new
/// database's `new…` and enough commits to take the new GSNs past the
/// old pages' LSNs; crashes (no close); `check` reads the reopened tree.
fn earlier_keys_stay_gone(
    put_old: impl FnOnce() -> Db,
    new: impl FnOnce() -> Db,
    reopen: impl FnOnce() -> Db,
) {
    let db = put_old();
    let t = db.create_tree("t").unwrap();
    for i in 0u32..30_000 {
        t.put(b"burn", &i.to_be_bytes()).unwrap();
    }
    for i in 0u32..3_000 {
        t.put(format!("old{i:06}").as_bytes(), &[1; 100]).unwrap();
    }
    drop(t);
    db.close().unwrap();
    let db = new();
    let t = db.create_tree("t").unwrap();
    for i in 0u32..3_000 {
        t.put(format!("new{i:06}").as_bytes(), &[2; 100]).unwrap();
    }
    for i in 0u32..40_000 {
        t.put(b"burn", &i.to_be_bytes()).unwrap();
    }
    drop(t);
    drop(db); // no close: a crash
    let db = reopen();
    let t = db.tree("t").unwrap();
    assert_eq!(
        t.prefix(b"old").count(),
        0,
        "keys of the earlier database are back"
    );
    let wrong = (0u32..3_000)
        .filter(|i| t.get(format!("new{i:06}").as_bytes()).unwrap() != Some(vec![2; 100]))
        .count();
    assert_eq!(wrong, 0);
    assert!(db.check().unwrap().is_ok());
}

fn async_opts() -> Options {
    Options::default()
        .pool_bytes(32 << 20)
        .log_bytes(32 << 20)
        .checkpoint_shards(1)
        .durability(Durability::Async)
}

#[test]
fn a_new_database_over_simulated_devices_never_reads_the_earlier_ones_pages() {
    let data = SimDisk::new(0, 64 << 20, SimConfig::default());
    let log1 = SimDisk::new(1, CONTROL_BYTES + (32 << 20), SimConfig::default());
    let log2 = SimDisk::new(2, CONTROL_BYTES + (32 << 20), SimConfig::default());
    let opts = async_opts();
    earlier_keys_stay_gone(
        || open(&data, &log1, &opts, true).unwrap(),
        || open(&data, &log2, &opts, true).unwrap(),
        || open(&data, &log2, &opts, false).unwrap(),
    );
}

#[test]
fn open_devices_creating_over_an_earlier_databases_files_starts_them_empty() {
    let dir = tempfile::tempdir().unwrap();
    let paths = [dir.path().join("a")];
    let opts = async_opts().capacity_bytes(256 << 20);
    earlier_keys_stay_gone(
        || Db::open_devices(&paths, opts.clone(), true).unwrap(),
        || Db::open_devices(&paths, opts.clone(), true).unwrap(),
        || Db::open_devices(&paths, opts.clone(), false).unwrap(),
    );
}

/// A creation refused after the data files are open (here: its log would
/// lie on a data file) leaves what the devices held as it was: the files
/// are cleared only once every check of the creation passed (a review
/// found a first version cutting them at open, before the refusal).
#[test]
fn a_refused_creation_leaves_the_earlier_database_whole() {
    let (dir, paths, opts) = earlier_database(1_000, 3);
    let refused = Db::open_devices(&paths, opts.clone().log_path(&paths[0]), true);
    assert!(refused.is_err(), "a log on the data file was taken");
    assert_whole(&paths, &opts, 1_000);
    drop(dir);
}

/// A creation whose log path holds a file of a size no log grows to
/// (another program's, or a mirrored database's copy) formats the log at
/// the size a new log file has: formatted as it was, the new database
/// took commits and then failed every open as a log cut short (an
/// outside probe: every acknowledged key lost).
#[test]
fn a_file_of_another_size_at_the_log_path_becomes_a_log_of_the_right_size() {
    let dir = tempfile::tempdir().unwrap();
    let paths = [dir.path().join("a")];
    let junk: Vec<u8> = (0..(2u32 << 20) + (16 << 10))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(dir.path().join("a.wal"), &junk).unwrap();
    let opts = Options::default()
        .pool_bytes(16 << 20)
        .capacity_bytes(256 << 20);
    let db = Db::open_devices(&paths, opts.clone(), true).unwrap();
    put_closed(db, 500, 5);
    let db = Db::open_devices(&paths, opts, false).unwrap_or_else(|e| panic!("reopen: {e}"));
    assert_eq!(db.tree("t").unwrap().iter().count(), 500);
}

/// A mirrored creation whose log files are there is refused before any
/// data file is touched, naming the log: it failed on the old files'
/// labels after relabelling the data files, and the earlier database
/// would not open again (an outside probe).
#[test]
fn a_mirrored_creation_over_log_files_that_are_there_is_refused_first() {
    let (dir, paths, opts) = earlier_database(500, 6);
    let mirrored = [dir.path().join("a"), dir.path().join("a.m1")];
    match Db::open_devices(&mirrored, opts.clone().mirror_copies(2), true) {
        Err(dana::Error::Log(m)) => assert!(m.contains("a.wal"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert_whole(&paths, &opts, 500);
}

/// Creates tree `t` in `db`, puts keys `0..n` (big-endian) with values of
/// 100 bytes `byte`, and closes it.
fn put_closed(db: Db, n: u32, byte: u8) {
    let t = db.create_tree("t").unwrap();
    for i in 0..n {
        t.put(&i.to_be_bytes(), &[byte; 100]).unwrap();
    }
    drop(t);
    db.close().unwrap();
}

/// A database in a new temporary directory, through `Db::open_devices`
/// on one file: keys `0..n` (see [`put_closed`]), closed.
fn earlier_database(n: u32, byte: u8) -> (tempfile::TempDir, [std::path::PathBuf; 1], Options) {
    let dir = tempfile::tempdir().unwrap();
    let paths = [dir.path().join("a")];
    let opts = Options::default()
        .pool_bytes(16 << 20)
        .capacity_bytes(256 << 20);
    let db = Db::open_devices(&paths, opts.clone(), true).unwrap();
    put_closed(db, n, byte);
    (dir, paths, opts)
}

/// The database on `paths` opens with its `n` keys and checks clean.
fn assert_whole(paths: &[std::path::PathBuf], opts: &Options, n: usize) {
    let db = Db::open_devices(paths, opts.clone(), false).unwrap();
    assert_eq!(db.tree("t").unwrap().iter().count(), n);
    assert!(db.check().unwrap().is_ok());
}
