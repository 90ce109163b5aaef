//! Commits that find the log short of room wait for it holding no key
//! stripe, then validate again (`txn::Committer::commit_at`). Here 96
//! tasks commit through a 1 MiB log, far too small for all of their
//! promises at once, and every commit also writes one of 8 hot keys that
//! the other tasks write too, so a commit parked under its stripes would
//! stall the others. Every fourth task writes large values, whose
//! commits still wait for room under their stripes: a commit holding the
//! room it waited for must not spin on one of their stripes (that
//! deadlocked). Every commit must finish, every write must be there, and
//! the same after a reopen.
//!
//! And the checkpoints that free the log must not wait for it page by
//! page while commits keep changing the pages they write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dana::{Db, Durability, Options};

const TASKS: u64 = 96;
const COMMITS: u64 = 60;
const HOT: u64 = 8;

fn opts() -> Options {
    Options::default()
        .pool_bytes(8 << 20)
        .log_bytes(1 << 20)
        .durability(Durability::Async)
}

fn key(task: u64, i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&task.to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// The value of commit `i` of `task`: large (stored outside the leaves)
/// for every fourth task.
fn value(task: u64, i: u64, max_inline: usize) -> Vec<u8> {
    let len = if task % 4 == 0 { max_inline + 300 } else { 600 };
    vec![(task ^ i) as u8; len]
}

fn hot(i: u64) -> Vec<u8> {
    format!("hot-{}", i % HOT).into_bytes()
}

#[test]
fn commits_short_of_log_room_wait_without_their_stripes_and_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree_or_create("t").unwrap();
    let max_inline = t.max_inline_value_len();
    let before = db.wal_stats().unwrap();
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    for task in 0..TASKS {
        let (d, t, done, failed, tx) = (
            db.clone(),
            t.clone(),
            done.clone(),
            failed.clone(),
            tx.clone(),
        );
        db.spawn(async move {
            for i in 0..COMMITS {
                let mut txn = d.begin();
                // A value of 600 bytes: a few commits fill a leaf, so
                // splits log pages and the promises are large.
                let value = value(task, i, max_inline);
                let ok = txn.put(&t, &key(task, i), &value).is_ok()
                    && txn.put(&t, &hot(i), &key(task, i)).is_ok()
                    && txn.commit_async().await.is_ok();
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = tx.send(());
        })
        .unwrap();
    }
    drop(tx);
    for _ in rx {}
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert_eq!(done.load(Ordering::Relaxed), TASKS * COMMITS);
    let stats = db.wal_stats().unwrap().since(&before);
    assert!(
        stats.admit_waits > 0,
        "the log never ran short: the test does not exercise the wait"
    );
    // Two writes log a few pages each: no apply goes on from a record of
    // its own and waits for checkpoints. (One did when the log's end
    // moved by the other tasks' records counted as its own: with 64
    // committers and per-worker logs those waits, and checkpoints that
    // spent log space meanwhile, hung every commit.)
    assert_eq!(
        stats.applies_continued, 0,
        "small commits went on from records of their own"
    );
    let check = |db: &Db| {
        let t = db.tree("t").unwrap();
        for task in 0..TASKS {
            for i in 0..COMMITS {
                let v = t.get(&key(task, i)).unwrap();
                assert_eq!(
                    v,
                    Some(value(task, i, max_inline)),
                    "task {task} commit {i}"
                );
            }
        }
        for h in 0..HOT {
            // Written last by some task's commit of a matching index.
            let v = t.get(&hot(h)).unwrap().expect("every hot key was written");
            let i = u64::from_be_bytes(v[8..].try_into().unwrap());
            assert_eq!(i % HOT, h);
        }
    };
    check(&db);
    db.close().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    check(&db);
    db.close().unwrap();
}

/// A checkpoint under commits that keep changing its pages waits for the
/// log a few times, not once per changed page. Async commits change ~250
/// leaves (and one hot key every commit writes) faster than the log
/// flushes; the checkpoint sets the pages it finds changed since the last
/// flush aside, waits once for all of them, and writes the ones changed
/// again (the hot leaf) under their latches after one more wait. The
/// first version waited for each such page in turn, and for the hot
/// leaf until a flush happened to fall between two of its commits:
/// `dana bench commit`'s first shard checkpoint took 2.2 s so, while
/// every committer ended up waiting for log space behind it.
#[test]
fn a_checkpoint_waits_for_the_log_a_few_times_not_once_per_changed_page() {
    let dir = tempfile::tempdir().unwrap();
    // One shard and a log no writer here fills a quarter of: no checkpoint
    // but the one asked for below.
    let db = Db::open(
        dir.path(),
        Options::default()
            .pool_bytes(16 << 20)
            .log_bytes(256 << 20)
            .checkpoint_shards(1)
            .durability(Durability::Async),
    )
    .unwrap();
    let t = db.tree_or_create("t").unwrap();
    const KEYS: u64 = 4_000;
    for i in 0..KEYS {
        t.put(&key(0, i), &[1u8; 200]).unwrap();
    }
    db.checkpoint().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    for task in 0..8u64 {
        let (t, stop, writes) = (t.clone(), stop.clone(), writes.clone());
        db.spawn(async move {
            let mut i = task;
            while !stop.load(Ordering::Relaxed) {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = key(0, (i >> 33) % KEYS);
                if t.put_async(&k, &[2u8; 200]).await.is_err()
                    || t.put_async(&key(1, 0), &i.to_be_bytes()).await.is_err()
                {
                    return;
                }
                writes.fetch_add(2, Ordering::Relaxed);
            }
        })
        .unwrap();
    }
    // The writers changing pages, then a checkpoint among them.
    while writes.load(Ordering::Relaxed) < 20_000 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // A checkpoint that no writer's commit overlapped shows nothing: up
    // to five tries (under a loaded suite one ran while no writer got
    // the CPU, once).
    let mut shown = false;
    for _ in 0..5 {
        let before = db.pool_stats();
        let at = writes.load(Ordering::Relaxed);
        db.checkpoint().unwrap();
        let during = writes.load(Ordering::Relaxed) - at;
        let waits = db.pool_stats().flush_log_waits - before.flush_log_waits;
        assert!(
            waits <= 12,
            "{waits} waits for the log in one checkpoint ({during} writes during it)"
        );
        if during > 0 {
            shown = true;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(shown, "the writers never ran during a checkpoint");
    db.close().unwrap();
}

/// One transaction whose apply logs more page images than the whole log
/// holds commits, and so do the commits after it. Right after a
/// checkpoint, every leaf's first change logs a full image; a transaction
/// deleting and updating keys on all of ~600 leaves of a 1 MiB log logs
/// some 2.5 MiB of them. Its commit record pinned the redo point until
/// its apply ended, so the log could neither flush nor checkpoint: the
/// commit never returned, and nothing after it ran (a review's finding).
/// The apply now appends the writes it has left as a record of their own
/// when the log behind its record passes a quarter, and waits for the
/// checkpoints that move the redo point past the first.
#[test]
fn one_transaction_whose_page_images_outgrow_the_log_commits() {
    const KEYS: u64 = 12_000;
    let dir = tempfile::tempdir().unwrap();
    let opts = || {
        Options::default()
            .pool_bytes(32 << 20)
            .log_bytes(1 << 20)
            .durability(Durability::Sync)
    };
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree_or_create("t").unwrap();
    let old = |i: u64| vec![(i % 251) as u8; 150];
    let new = |i: u64| vec![(i % 13) as u8; 160];
    for from in (0..KEYS).step_by(200) {
        let mut tx = db.begin();
        for i in from..from + 200 {
            tx.put(&t, &key(0, i), &old(i)).unwrap();
        }
        db.commit(tx).unwrap();
    }
    db.checkpoint().unwrap();
    let mut tx = db.begin();
    for i in (0..KEYS).step_by(25) {
        tx.delete(&t, &key(0, i)).unwrap();
        tx.put(&t, &key(0, i + 1), &new(i + 1)).unwrap();
    }
    let (sent, got) = std::sync::mpsc::channel();
    let d = db.clone();
    std::thread::spawn(move || {
        let _ = sent.send(d.commit(tx));
    });
    let continued = db.wal_stats().unwrap().applies_continued;
    let r = got
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the large commit returned within a minute");
    r.unwrap();
    assert!(
        db.wal_stats().unwrap().applies_continued > continued,
        "the large commit's apply never went on from a record of its own"
    );
    // And the log takes the next commit.
    t.put(&key(1, 0), b"after").unwrap();
    let expect = |i: u64| match i % 25 {
        0 => None,
        1 => Some(new(i)),
        _ => Some(old(i)),
    };
    let check = |db: &Db| {
        let t = db.tree("t").unwrap();
        for i in 0..KEYS {
            assert_eq!(t.get(&key(0, i)).unwrap(), expect(i), "key {i}");
        }
        assert_eq!(t.get(&key(1, 0)).unwrap().as_deref(), Some(&b"after"[..]));
        assert!(db.check().unwrap().is_ok());
    };
    check(&db);
    db.close().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    check(&db);
    db.close().unwrap();
}
