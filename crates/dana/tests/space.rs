//! Out of space with many committers: a commit that can fail for space
//! fails before it is logged, the database stays openable and consistent,
//! and deleting makes room again.

use std::sync::{Arc, Mutex};

use dana::{Db, Error, Options};

fn opts() -> Options {
    // 96 pages of data: a few hundred 300-byte values fill it.
    Options::default()
        .pool_bytes(1 << 20)
        .capacity_bytes(96 * 4096)
        .log_bytes(4 << 20)
}

fn key(task: u64, i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.to_be_bytes());
    k[8..].copy_from_slice(&task.to_be_bytes());
    k
}

/// 32 tasks insert until each one sees NoSpace; returns the keys
/// acknowledged and the errors other than NoSpace.
fn fill(db: &Db, round: u64) -> (Vec<[u8; 16]>, Vec<String>) {
    let t = db.tree_or_create("t").unwrap();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    for task in 0..32u64 {
        let (t, acked, errors, tx) = (t.clone(), acked.clone(), errors.clone(), tx.clone());
        db.spawn(async move {
            for i in 0..10_000u64 {
                let k = key(task + round * 100, i);
                match t.insert_async(&k, &[task as u8; 300]).await {
                    Ok(()) => acked.lock().unwrap().push(k),
                    Err(Error::NoSpace(_)) => break,
                    Err(e) => {
                        errors.lock().unwrap().push(e.to_string());
                        break;
                    }
                }
            }
            let _ = tx.send(());
        })
        .unwrap();
    }
    drop(tx);
    for _ in rx {}
    let a = acked.lock().unwrap().clone();
    let e = errors.lock().unwrap().clone();
    (a, e)
}

#[test]
fn concurrent_committers_out_of_space_lose_nothing_and_can_delete() {
    let dir = tempfile::tempdir().unwrap();
    let acked;
    {
        let db = Db::open(dir.path(), opts()).unwrap();
        let (a, errors) = fill(&db, 0);
        assert!(errors.is_empty(), "errors besides NoSpace: {errors:?}");
        assert!(a.len() > 50, "only {} inserts", a.len());
        assert!(db.pool().poisoned().is_none(), "{:?}", db.pool().poisoned());
        acked = a;
        // Dropped without close: the next open recovers.
    }
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    for k in &acked {
        assert!(t.get(k).unwrap().is_some(), "acknowledged key lost");
    }
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.findings);
    // Still full: an insert fails for space, and nothing is poisoned.
    assert!(matches!(
        t.insert(&key(999, 0), &[1; 300]),
        Err(Error::NoSpace(_))
    ));
    // Deleting makes room, and inserts work again.
    for k in &acked[..acked.len() / 2] {
        assert!(t.delete(k).unwrap());
    }
    let (more, errors) = fill(&db, 1);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!more.is_empty(), "no insert succeeded after deletes");
    db.close().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    assert!(db.check().unwrap().is_ok());
}

/// A small file system (a tmpfs mounted for the test) filling up while
/// the log is still in its first lap: the data files stop growing first,
/// leaving the log room to grow, so deletes still commit and free pages
/// that later writes reuse. (The first version let the data files take
/// the space; the log could not grow and every commit failed, deletes
/// included: found by an outside probe.) Needs root to mount; elsewhere
/// it says so and passes.
#[test]
fn a_full_file_system_stops_the_data_files_first_and_deletes_still_commit() {
    // A 16 MiB log: the default 64 MiB could never grow whole on 48 MiB,
    // and such a log is refused at creation.
    full_file_system(
        Options::default().pool_bytes(8 << 20).log_bytes(16 << 20),
        48,
        200,
    );
}

/// The same with every file mirrored (two copies of the data file and of
/// the log on the same file system): the room kept for the log's growth
/// counts every copy. (None was kept for mirrored files: the data copies
/// took the log's room, and every commit failed, deletes included; a
/// review's finding.)
#[test]
fn a_full_file_system_stops_mirrored_data_files_first_and_deletes_still_commit() {
    // Two copies of a 12 MiB log fit the file system (two of the default
    // 64 MiB could never grow whole there); large values, written around
    // the log, fill it before the log's first lap ends.
    full_file_system(
        Options::default()
            .pool_bytes(8 << 20)
            .log_bytes(12 << 20)
            .mirrored(),
        48,
        16 << 10,
    );
}

/// Unmounts its directory when dropped.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).output();
    }
}

/// A tmpfs of `size` (mount's `size=` option) on a temporary directory;
/// None (the test is skipped) where mounting needs a root this process
/// is not.
fn tmpfs(size: &str) -> Option<(tempfile::TempDir, Mount)> {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a tmpfs needs root");
        return None;
    }
    let mount = Mount(dir.path().to_path_buf());
    Some((dir, mount))
}

/// A creation that finds the file system full fails with `NoSpace` and
/// removes every file it made: the directory opens once room is made.
/// (A file whose preallocation failed stayed behind, empty, and every
/// later open failed, "shorter than a page", or "not a dana log"; an
/// outside probe.)
#[test]
fn a_creation_on_a_full_file_system_leaves_nothing_behind() {
    let Some((dir, _mount)) = tmpfs("4m") else {
        return;
    };
    let path = dir.path().join("db");
    let filler = dir.path().join("filler");
    let opts = Options::default().pool_bytes(1 << 20).log_bytes(1 << 20);
    // Room for the data file's first MiB but not the log's, then for
    // neither, then none at all (the creation marker's write fails).
    for room in [1536u64 << 10, 512 << 10, 0] {
        let f = std::fs::File::create(&filler).unwrap();
        let total = 4u64 << 20;
        let len = total - room;
        f.set_len(len).unwrap();
        // Blocks taken for real (a tmpfs file's length alone takes none).
        std::io::Write::write_all(&mut &f, &vec![1u8; len as usize]).unwrap();
        drop(f);
        match Db::open(&path, opts.clone()) {
            Err(Error::NoSpace(m)) => assert!(m.contains("full"), "{m}"),
            Err(e) => panic!("room {room}: {e}"),
            Ok(_) => panic!("room {room}: opened"),
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "filler")
            .collect();
        assert!(left.is_empty(), "room {room}: left behind {left:?}");
        std::fs::remove_file(&filler).unwrap();
    }
    let db = Db::open(&path, opts).unwrap();
    db.tree_or_create("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
}

/// Fills a tmpfs of `mib` MiB through a database opened with `opts`,
/// with values of `len` bytes.
fn full_file_system(opts: Options, mib: u32, len: usize) {
    let Some((dir, _mount)) = tmpfs(&format!("{mib}m")) else {
        return;
    };
    let path = dir.path().join("db");
    {
        let db = Db::open(&path, opts.clone()).unwrap();
        let t = db.create_tree("t").unwrap();
        let value = vec![7u8; len];
        let mut written = 0u32;
        let err = loop {
            match t.put(&written.to_be_bytes(), &value) {
                Ok(_) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 10_000_000, "the file system never filled");
        };
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        assert!(
            written as usize * len > 200_000,
            "full after {written} writes: {err}"
        );
        // Deletes commit (the log could grow), and free pages.
        for k in 0..written / 2 {
            t.delete(&k.to_be_bytes()).unwrap();
        }
        // Writes reuse them: without growing the data files.
        for k in 0..written / 8 {
            t.put(&k.to_be_bytes(), &value).unwrap();
        }
        assert!(db.check().unwrap().is_ok());
        db.close().unwrap();
    }
    let db = Db::open(&path, opts).unwrap();
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
    // Every file is let go when `close` returns: the file system unmounts
    // at once (a file registered with an io_uring ring stayed open ~50 ms,
    // until the kernel's teardown of the ring; an outside probe).
    let out = std::process::Command::new("umount")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "umount right after close: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Commits promise the most pages their apply could take (a whole path
/// per key), far more than an update of existing keys takes. When the
/// database cannot grow and the free pages are promised to other commits
/// in flight, a commit waits for those promises to end instead of failing
/// with `NoSpace` (the build before failed here with most pages free, as
/// `bench waf`'s TPC-C load did).
#[test]
fn commits_wait_for_other_commits_promises_instead_of_failing() {
    commits_under_full_promises(false);
}

/// The same with a large value in every commit (one of 3,000 bytes
/// replacing the task's last): a commit storing large values promises
/// its pages under its key stripes, and there it failed with `NoSpace`
/// at once when the free pages were promised to others (`dana crashtest
/// --out-of-place --compress-pages --kills 60 --tasks 8 --seed 7100`,
/// cycle 55: "13 pages needed, 96 free and 95 promised"). It now waits
/// for them holding no stripe, as other commits do.
#[test]
fn commits_of_large_values_wait_for_other_commits_promises_instead_of_failing() {
    commits_under_full_promises(true);
}

/// 16 tasks x 20 commits of 12 updates each (and with `large`, a large
/// value) on a database of 160 pages whose free pages a few commits'
/// promises cover: every commit must land, and `check` must pass.
fn commits_under_full_promises(large: bool) {
    const TASKS: u64 = 16;
    const COMMITS: u64 = 20;
    const KEYS: u64 = 400;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(1 << 20)
        .capacity_bytes(160 * 4096)
        .log_bytes(8 << 20);
    let db = Db::open(dir.path(), opts).unwrap();
    let t = db.tree_or_create("t").unwrap();
    for i in 0..KEYS {
        t.insert(&key(0, i), &[0; 300]).unwrap();
    }
    let big = |task: u64, c: u64| vec![(task * 31 + c) as u8; 3000];
    if large {
        assert!(big(0, 0).len() > t.max_inline_value_len());
        for task in 0..TASKS {
            t.insert(&key(1, task), &big(task, 0)).unwrap();
        }
    }
    let pool = db.pool().clone();
    let space = db
        .block_on(async move { pool.space().await })
        .unwrap()
        .unwrap();
    let free = space.total_pages - space.next_unused + space.free_pages;
    // Each commit updates 12 keys of a tree of height 2 (~31 leaves): it
    // promises 12 paths of 2 + 2 pages, more than a third of the free
    // pages, so a few commits at once promise them all.
    let promise = 12 * (2 + 2);
    assert!(
        promise <= free && 3 * promise > free,
        "{promise} pages promised per commit, {free} free"
    );
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    for task in 0..TASKS {
        let (d, t, errors, tx) = (db.clone(), t.clone(), errors.clone(), tx.clone());
        db.spawn(async move {
            for c in 0..COMMITS {
                let mut txn = d.begin();
                for j in 0..12 {
                    let k = key(0, (task * 31 + c * 12 + j) % KEYS);
                    txn.put(&t, &k, &[task as u8; 300]).unwrap();
                }
                if large {
                    txn.put(&t, &key(1, task), &big(task, c + 1)).unwrap();
                }
                if let Err(e) = txn.commit_async().await {
                    errors.lock().unwrap().push(e.to_string());
                }
            }
            let _ = tx.send(());
        })
        .unwrap();
    }
    drop(tx);
    for _ in rx {}
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} commits failed: {:?}",
        errors.len(),
        &errors[..1]
    );
    if large {
        for task in 0..TASKS {
            let v = t.get(&key(1, task)).unwrap();
            assert!(v == Some(big(task, COMMITS)), "task {task}'s large value");
        }
    }
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.findings);
}

/// Recovery needs no page the running database did not: on a device
/// that cannot grow, filled up after keys were put and deleted again, a
/// power cut's recovery reopens. It re-applied every write from the redo
/// point on, re-inserting the deleted keys beside the keys that took
/// their leaves' pages since: leaves the database never had, which split
/// and failed the open with `NoSpace`, and the database could be neither
/// read nor shrunk (an outside probe, on a full tmpfs). A key's last
/// write alone is re-applied now.
#[test]
fn recovery_on_a_full_device_needs_no_page_the_database_did_not() {
    use dana::io::sim::PowerCutPolicy;
    let rig = crate::sim_rig::Rig::new(11, 2 << 20, 32 << 20);
    rig.data.set_space_limit(2 << 20);
    let opts = Options::default()
        .pool_bytes(1 << 20)
        .workers(1)
        .log_bytes(32 << 20);
    let db = rig.open(opts.clone(), true).unwrap();
    let t = db.create_tree("t").unwrap();
    let key = |p: &str, i: u32| format!("{p}/{i:06}").into_bytes();
    db.checkpoint().unwrap();
    for i in 0..1500 {
        t.put(&key("gone", i), &[7u8; 200]).unwrap();
    }
    for i in 0..1500 {
        assert!(t.delete(&key("gone", i)).unwrap());
    }
    let mut filled = 0;
    let err = loop {
        match t.put(&key("fill", filled), &[9u8; 200]) {
            Ok(_) => filled += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    assert!(filled > 1500, "full after {filled} puts");
    rig.data.power_cut(PowerCutPolicy::DropAll, 1);
    rig.log.power_cut(PowerCutPolicy::DropAll, 2);
    drop((t, db));
    rig.data.power_on();
    rig.log.power_on();
    let db = rig.open(opts, false).unwrap();
    let r = db.recovery().unwrap().clone();
    assert!(
        r.commits > 3000,
        "the commits since the checkpoint were not re-applied: {r:?}"
    );
    let t = db.tree("t").unwrap();
    assert_eq!(t.prefix(b"gone/").count(), 0);
    for i in 0..filled {
        assert_eq!(
            t.get(&key("fill", i)).unwrap(),
            Some(vec![9u8; 200]),
            "fill {i}"
        );
    }
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
}

/// An out-of-place database takes its data file's whole capacity at
/// creation, and its log's too: on a file system that holds both, every
/// delete commits once the data is full; on one that does not, the
/// creation fails with `NoSpace` and leaves nothing. (Its log grew later,
/// found the room taken by the data file, and every commit, deletes too,
/// failed "the log file cannot grow"; an outside probe.)
#[test]
fn an_out_of_place_database_keeps_its_log_room() {
    use dana::WriteMode;
    for (fs, fits) in [("60m", true), ("50m", false)] {
        let Some((dir, _mount)) = tmpfs(fs) else {
            return;
        };
        let path = dir.path().join("db");
        let opts = Options::default()
            .pool_bytes(2 << 20)
            .write_mode(WriteMode::OutOfPlace)
            .capacity_bytes(40 << 20)
            .log_bytes(16 << 20);
        let db = match Db::open(&path, opts.clone()) {
            Ok(db) => db,
            Err(Error::NoSpace(m)) if !fits => {
                let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
                assert!(left.is_empty(), "{fs}: {m}; left {left:?}");
                continue;
            }
            Err(e) => panic!("{fs}: {e}"),
        };
        assert!(fits, "{fs}: created on a file system too small for it");
        let t = db.create_tree("t").unwrap();
        let mut n = 0u32;
        let err = loop {
            match t.put(&n.to_be_bytes(), &[n as u8; 1000]) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 1_000_000, "never full");
        };
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        for k in 0..n / 2 {
            t.delete(&k.to_be_bytes())
                .unwrap_or_else(|e| panic!("{fs}: delete {k} of {n}: {e}"));
        }
        db.close().unwrap();
    }
}
