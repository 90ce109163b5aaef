//! Writes through the async API are commits: with `Durability::Sync`,
//! every write a task saw acknowledged survives a `kill -9` of the
//! process. The child is this test binary run again (the ignored test
//! below), which prints each acknowledged key; the parent kills it with
//! SIGKILL mid-stream, reopens and looks for every key.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dana::{Db, Durability, Options};

fn opts() -> Options {
    Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(64 << 20)
        .log_bytes(8 << 20)
        .durability(Durability::Sync)
}

const DIR_VAR: &str = "DANA_ASYNC_CHILD_DIR";

/// The child: 16 tasks writing through the async API until killed.
#[test]
#[ignore = "run by async_writes_survive_kill_9 as its child process"]
fn async_writer_child() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let db = Db::open(&dir, opts()).unwrap();
    let t = db.tree_or_create("t").unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    for task in 0..16u64 {
        let (t, tx) = (t.clone(), tx.clone());
        db.spawn(async move {
            for i in 0..1_000_000u64 {
                let k = (i * 16 + task).to_be_bytes();
                if t.put_async(&k, &k).await.is_err() {
                    return;
                }
                if tx.send(i * 16 + task).is_err() {
                    return;
                }
            }
        })
        .unwrap();
    }
    drop(tx);
    for k in rx {
        println!("acked {k}");
    }
}

#[test]
fn async_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "async_durability::async_writer_child",
                "--nocapture",
            ])
            .env(DIR_VAR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let started = Instant::now();
        let want = 300 + round * 200;
        let mut seen = 0;
        for line in out.lines() {
            let Ok(line) = line else { break };
            if let Some(k) = line.strip_prefix("acked ") {
                acked.push(k.parse::<u64>().unwrap());
                seen += 1;
            }
            if seen >= want || started.elapsed() > Duration::from_secs(20) {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen > 0, "the child acknowledged nothing");
    }
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    let lost: Vec<u64> = acked
        .iter()
        .copied()
        .filter(|k| t.get(&k.to_be_bytes()).unwrap().is_none())
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged async writes lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(db.check().unwrap().is_ok());
}

/// A `Sync` transaction that only read returns once what it read is
/// durable, as a commit record depending on it would: returning at once
/// acknowledged a read of a commit a crash could still lose (a review's
/// finding). The writer commits `Async` with a long window, so its
/// record stays unflushed until something asks.
#[test]
fn a_read_only_sync_transaction_waits_for_what_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        opts()
            .durability(Durability::Async)
            .async_window(Duration::from_secs(30)),
    )
    .unwrap();
    let t = db.create_tree("t").unwrap();
    // Past the creation's own flushes.
    db.checkpoint().unwrap();
    let mut w = db.begin();
    w.put(&t, b"k", b"unflushed").unwrap();
    let written = db.commit_lsn(w).unwrap();
    let durable_before = db.wal_stats().unwrap().durable;
    let mut r = db.begin();
    r.set_durability(Durability::Sync);
    assert_eq!(r.get(&t, b"k").unwrap().as_deref(), Some(&b"unflushed"[..]));
    db.commit(r).unwrap();
    let durable_after = db.wal_stats().unwrap().durable;
    assert!(
        durable_before < written,
        "the writer's record was flushed early"
    );
    assert!(
        durable_after >= written,
        "acknowledged at {durable_after}, the commit read ends at {written}"
    );
    db.close().unwrap();
}

/// `Durability::Async` commits acknowledged just before the last handle
/// is dropped without `close` are in the database at the next open: the
/// drop flushes the log (it stopped the workers with the records still
/// in memory, waiting for their window: a review's finding). Also when
/// the last handle is dropped inside a task.
#[test]
fn async_commits_survive_a_drop_without_close() {
    for inside_a_task in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let opts = opts()
            .durability(Durability::Async)
            .async_window(Duration::from_secs(30));
        let db = Db::open(dir.path(), opts.clone()).unwrap();
        let t = db.create_tree("t").unwrap();
        db.checkpoint().unwrap();
        for i in 0..100u32 {
            t.put(&i.to_be_bytes(), b"acknowledged").unwrap();
        }
        let stats = db.wal_stats().unwrap();
        assert!(stats.durable < stats.end, "flushed before the drop");
        if inside_a_task {
            // The task drops the last handles: it waits until this thread
            // dropped its own.
            let (tx, rx) = std::sync::mpsc::channel();
            let outside = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
            let handles = (db.clone(), t, outside.clone());
            drop(db);
            let spawner = handles.0.clone();
            spawner
                .spawn(async move {
                    while handles.2.load(std::sync::atomic::Ordering::SeqCst) {
                        dana::sched::yield_now().await;
                    }
                    drop(handles);
                    let _ = tx.send(());
                })
                .unwrap();
            drop(spawner);
            outside.store(false, std::sync::atomic::Ordering::SeqCst);
            rx.recv().unwrap();
        } else {
            drop(t);
            drop(db);
        }
        // The locks are released once the workers end (a thread of its
        // own waits for them when the drop ran inside a task).
        let deadline = Instant::now() + Duration::from_secs(10);
        let db = loop {
            match Db::open(dir.path(), opts.clone()) {
                Err(dana::Error::Locked { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => break other.unwrap(),
            }
        };
        let t = db.tree("t").unwrap();
        for i in 0..100u32 {
            assert_eq!(
                t.get(&i.to_be_bytes()).unwrap().as_deref(),
                Some(&b"acknowledged"[..]),
                "key {i} lost (inside a task: {inside_a_task})"
            );
        }
        db.close().unwrap();
    }
}

/// A read-committed transaction that only reads commits on a read-only
/// open: it writes nothing (it was refused with `ReadOnly`).
#[test]
fn a_read_only_transaction_commits_on_a_read_only_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"v").unwrap();
    db.close().unwrap();
    let db = Db::open(dir.path(), opts().read_only()).unwrap();
    let t = db.tree("t").unwrap();
    let got = db.transaction(|tx| tx.get(&t, b"k")).unwrap();
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    db.close().unwrap();
}

/// A task that drops a write's future after its first `Pending` (a select
/// or a timeout in the caller) must not leave the database disagreeing
/// with its log. With a pool a tenth of the data, the apply usually waits
/// for its leaf to be read, after the commit record was logged: the
/// database stops (`Poisoned`) and the next open finishes the write. A
/// drop before the record was logged leaves the key absent in both.
#[test]
fn a_write_dropped_mid_apply_stops_the_database_and_reopens_whole() {
    use std::future::Future;
    use std::task::Poll;

    let dir = tempfile::tempdir().unwrap();
    let opts = || opts().pool_bytes(1 << 20).durability(Durability::Async);
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    let value = [7u8; 200];
    for chunk in 0..40u64 {
        db.transaction(|tx| {
            for i in 0..500u64 {
                tx.put(&t, &(chunk * 500 + i).to_be_bytes(), &value)?;
            }
            Ok(())
        })
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut poisoned = false;
    for trial in 0..50u64 {
        // A new key between two old ones, in a leaf likely not resident.
        let mut key = (trial.wrapping_mul(7919) % 20_000).to_be_bytes().to_vec();
        key.push(1);
        let (t2, k) = (t.clone(), key.clone());
        let dropped_pending = db
            .block_on(async move {
                let mut put = Box::pin(async move { t2.put_async(&k, b"new").await });
                let first = std::future::poll_fn(|cx| Poll::Ready(put.as_mut().poll(cx))).await;
                first.is_pending()
            })
            .unwrap();
        if !dropped_pending {
            continue;
        }
        match t.get(&key) {
            Ok(v) => seen.push((key, v)),
            Err(e) => panic!("a read after a dropped write failed: {e}"),
        }
        match t.put(b"probe", b"x") {
            Err(dana::Error::Poisoned(_)) => {
                poisoned = true;
                break;
            }
            Err(e) => panic!("{e}"),
            Ok(_) => {}
        }
    }
    let _ = db.close();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    // Every write dropped before the last: what the trees showed then is
    // what the log holds (not applied in memory but logged came back
    // after the reopen).
    let before_last = seen.len() - usize::from(poisoned);
    for (key, before) in &seen[..before_last] {
        assert_eq!(
            &t.get(key).unwrap(),
            before,
            "key {key:?} changed across the reopen"
        );
    }
    assert!(
        poisoned,
        "no dropped write landed in its apply: the test does not test"
    );
    // The write dropped mid-apply is whole after the reopen.
    let (last, _) = seen.last().unwrap();
    assert_eq!(t.get(last).unwrap().as_deref(), Some(&b"new"[..]));
}
