//! Races between the sync API's inline attempts (on the caller's thread,
//! off the workers) and tasks on the workers.
//!
//! A sync call first runs on the calling thread; if it needs a page that is
//! not resident it must give up *before* publishing anything another task
//! could wait on. Otherwise a worker task faulting the same page (say,
//! inside a commit's apply) is handed the caller's `WouldBlock`, the commit
//! fails after its record was logged, and the pool is poisoned.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::{Db, Options};

fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

#[test]
fn cold_sync_gets_racing_commits_never_fail_or_poison() {
    const KEYS: u64 = 12_000;
    let dir = tempfile::tempdir().unwrap();
    // 48 frames against ~700 pages of data: nearly every get is cold.
    let opts = Options::default()
        .pool_bytes(48 * 4096)
        .capacity_bytes(64 << 20)
        .log_bytes(16 << 20);
    let db = Db::open(dir.path(), opts).unwrap();
    let t = db.create_tree("t").unwrap();
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(200) {
        db.transaction(|tx| {
            for &i in chunk {
                tx.put(&t, &key(i), &[i as u8; 200])?;
            }
            Ok(())
        })
        .unwrap();
    }
    db.checkpoint().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let gets = Arc::new(AtomicU64::new(0));
    let puts = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for n in 0..4u64 {
        let (t, stop, gets) = (t.clone(), stop.clone(), gets.clone());
        threads.push(std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ n;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = x % KEYS;
                let v = t.get(&key(i)).map_err(|e| format!("get {i}: {e}"))?;
                if v.as_deref().map(|v| v.len()) != Some(200) {
                    return Err(format!("get {i}: {v:?}"));
                }
                gets.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    for n in 0..2u64 {
        let (t, stop, puts) = (t.clone(), stop.clone(), puts.clone());
        threads.push(std::thread::spawn(move || {
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ n;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = x % KEYS;
                t.put(&key(i), &[(i + 1) as u8; 200])
                    .map_err(|e| format!("put {i}: {e}"))?;
                puts.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(())
        }));
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(20));
        if db.pool().poisoned().is_some() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let errors: Vec<String> = threads
        .into_iter()
        .filter_map(|h| h.join().unwrap().err())
        .collect();
    assert!(
        errors.is_empty() && db.pool().poisoned().is_none(),
        "errors {errors:?}, pool {:?} ({} gets, {} puts)",
        db.pool().poisoned(),
        gets.load(Ordering::Relaxed),
        puts.load(Ordering::Relaxed)
    );
    assert!(gets.load(Ordering::Relaxed) > 100 && puts.load(Ordering::Relaxed) > 10);
    assert!(db.check().unwrap().is_ok());
}

/// Without a log, a plain `Tree::insert` and a transaction inserting the
/// same key race: the transaction checks the key absent under its key
/// lock and applies later, so a plain insert landing in between was
/// overwritten, and both returned Ok. Exactly one of them must win each
/// key, and the key must hold the winner's value.
#[test]
fn plain_writes_and_transactions_on_one_key_never_both_insert() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        Options::default()
            .pool_bytes(8 << 20)
            .capacity_bytes(64 << 20)
            .durability(dana::Durability::Off),
    )
    .unwrap();
    let t = db.create_tree("t").unwrap();
    const KEYS: u64 = 5_000;
    let (db2, t2) = (db.clone(), t.clone());
    // Both sides start each key together; the plain insert waits a few
    // microseconds more or less, so that it lands at every point of the
    // transaction's commit.
    let start = Arc::new(std::sync::Barrier::new(2));
    let start2 = start.clone();
    let by_tx = std::thread::spawn(move || {
        let mut won = Vec::new();
        for i in 0..KEYS {
            start2.wait();
            let r = db2.transaction(|tx| tx.insert(&t2, &key(i), b"tx"));
            match r {
                Ok(()) => won.push(i),
                Err(dana::Error::KeyExists) => {}
                Err(e) => panic!("{e}"),
            }
        }
        won
    });
    let mut plain = Vec::new();
    for i in 0..KEYS {
        start.wait();
        let until = Instant::now() + Duration::from_micros(i % 97);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        match t.insert(&key(i), b"plain") {
            Ok(()) => plain.push(i),
            Err(dana::Error::KeyExists) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let by_tx = by_tx.join().unwrap();
    let by_tx: std::collections::HashSet<u64> = by_tx.into_iter().collect();
    let mut both = 0;
    for &i in &plain {
        if by_tx.contains(&i) {
            both += 1;
        }
    }
    assert_eq!(
        both, 0,
        "{both} keys inserted by both a transaction and a plain insert"
    );
    assert_eq!(plain.len() + by_tx.len(), KEYS as usize);
    for i in 0..KEYS {
        let v = t.get(&key(i)).unwrap().unwrap();
        let want: &[u8] = if by_tx.contains(&i) { b"tx" } else { b"plain" };
        assert_eq!(v, want, "key {i}");
    }
}

/// Threads that all open-or-create one tree at once each get the tree
/// (the losers of the create answered `KeyExists`).
#[test]
fn concurrent_tree_or_create_calls_all_get_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        Options::default()
            .pool_bytes(8 << 20)
            .capacity_bytes(64 << 20),
    )
    .unwrap();
    for round in 0..20 {
        let name = format!("t{round}");
        let start = Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (db, name, start) = (db.clone(), name.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    db.tree_or_create(&name).map(|t| t.name().to_string())
                })
            })
            .collect();
        for h in handles {
            let got = h.join().unwrap();
            assert_eq!(got.as_deref().ok(), Some(name.as_str()), "{got:?}");
        }
    }
}

/// A commit measures the tree's height along its leftmost path without
/// latches; a merge freeing the leftmost leaf between the parent's read
/// and the child's made it fail with a false `Corrupt` (the freed page is
/// zeroed), since the parent was not checked again (a review's finding).
/// Here the leftmost leaves split and merge without end while commits
/// insert at the other end.
#[test]
fn commits_measuring_the_tree_never_fail_on_merges_of_its_leftmost_leaf() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(16 << 20)
        .capacity_bytes(256 << 20)
        .log_bytes(64 << 20)
        .durability(dana::Durability::Async);
    let db = Db::open(dir.path(), opts).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 1_000..3_000u64 {
        t.put(&key(i), &[1; 200]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64, String> {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..200 {
                    t.put(&key(i), &[2; 200]).map_err(|e| e.to_string())?;
                }
                for i in 0..200 {
                    t.delete(&key(i)).map_err(|e| e.to_string())?;
                }
                rounds += 1;
            }
            Ok(rounds)
        })
    };
    let until = Instant::now() + Duration::from_secs(4);
    let mut next = 10_000u64;
    let mut commits = 0u64;
    while Instant::now() < until && commits < 60_000 {
        db.transaction(|tx| {
            for _ in 0..4 {
                tx.put(&t, &key(next), &[3; 200])?;
                next += 1;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("commit {commits}: {e}"));
        commits += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.join().unwrap().unwrap();
    eprintln!("{commits} commits, {rounds} rounds of churn");
    assert!(rounds > 0 && commits > 0);
}

/// Writes acknowledged while another thread closes the database are
/// durable: `Db::close` flushed (a checkpoint) before it marked the
/// database closed, so an `Async` commit (or, without a log, a plain
/// write) acknowledged between its flush and the mark, or by a task that
/// had passed the mark's check, was in neither the checkpoint nor a
/// durable log record, and the reopen had lost it (a review's finding).
#[test]
fn writes_acknowledged_while_the_database_closes_survive_the_reopen() {
    for durability in [dana::Durability::Async, dana::Durability::Off] {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default()
            .pool_bytes(8 << 20)
            .capacity_bytes(64 << 20)
            .log_bytes(8 << 20)
            .durability(durability);
        let mut next = 0u64;
        for round in 0..12u64 {
            let db = Db::open(dir.path(), opts.clone()).unwrap();
            let t = db.tree_or_create("t").unwrap();
            let writers: Vec<_> = (0..3u64)
                .map(|w| {
                    let t = t.clone();
                    let first = next + w * 1_000_000;
                    std::thread::spawn(move || {
                        let mut acked = Vec::new();
                        for i in first..first + 1_000_000 {
                            match t.put(&key(i), &[7; 64]) {
                                Ok(_) => acked.push(i),
                                Err(dana::Error::Closed) => break,
                                Err(e) => panic!("{e}"),
                            }
                        }
                        acked
                    })
                })
                .collect();
            next += 3_000_000;
            std::thread::sleep(Duration::from_millis(5 + round * 3));
            db.close().unwrap();
            let acked: Vec<u64> = writers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            let db = Db::open(dir.path(), opts.clone()).unwrap();
            let t = db.tree("t").unwrap();
            let lost: Vec<u64> = acked
                .iter()
                .copied()
                .filter(|&i| t.get(&key(i)).unwrap().is_none())
                .collect();
            assert!(
                lost.is_empty(),
                "{durability:?}, round {round}: {} of {} acknowledged writes lost, first {:?}",
                lost.len(),
                acked.len(),
                &lost[..lost.len().min(5)]
            );
            db.close().unwrap();
        }
    }
}

/// Two clones closed at once: each close returns only once the database
/// is flushed and its locks released, so it can be opened again at once.
/// The close that lost the race to mark the database closed returned `Ok`
/// at once, with the other still flushing (a review's finding).
#[test]
fn a_close_racing_another_close_returns_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(8 << 20)
        .capacity_bytes(64 << 20)
        .durability(dana::Durability::Async);
    for round in 0..20u64 {
        let db = Db::open(dir.path(), opts.clone()).unwrap();
        let t = db.tree_or_create("t").unwrap();
        for i in 0..2_000u64 {
            t.put(&key(round * 10_000 + i), &[1; 100]).unwrap();
        }
        let other = db.clone();
        let start = Arc::new(std::sync::Barrier::new(2));
        let start2 = start.clone();
        let closer = std::thread::spawn(move || {
            start2.wait();
            other.close()
        });
        start.wait();
        db.close().unwrap();
        // Whichever close this was, the database is closed now.
        match Db::open(dir.path(), opts.clone()) {
            Ok(db) => {
                let t = db.tree("t").unwrap();
                assert!(t.get(&key(round * 10_000 + 1_999)).unwrap().is_some());
                closer.join().unwrap().unwrap();
                db.close().unwrap();
            }
            Err(e) => panic!("round {round}: reopen after close: {e}"),
        }
    }
}

/// A raw tree writer (`Tree::unlogged_btree`, no commits) still writing
/// while another thread closes: close stops the checkpoints before the
/// workers, and the writer's next wait for log room waited for one for
/// good, so the workers never stopped and close never returned (a review
/// of this session's close change). The logs are told now: the writer's
/// admission fails and close returns.
#[test]
fn close_returns_while_a_raw_tree_writer_waits_for_log_room() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(8 << 20)
        .capacity_bytes(64 << 20)
        .log_bytes(1 << 20)
        .workers(1);
    let db = Db::open(dir.path(), opts).unwrap();
    let t = db.create_tree("t").unwrap();
    let bt = t.unlogged_btree().clone();
    let (wrote, writes) = std::sync::mpsc::channel();
    db.spawn(async move {
        let mut i = 0u64;
        // Bounded: the log fills long before, once checkpoints stop.
        while i < 50_000_000 {
            if bt.put(&key(i % 200_000), &[7; 200]).await.is_err() {
                break;
            }
            i += 1;
            if i % 32 == 0 {
                dana::sched::yield_now().await;
            }
        }
        let _ = wrote.send(i);
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (closed, close_done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = closed.send(db.close());
    });
    let r = close_done
        .recv_timeout(Duration::from_secs(60))
        .expect("close hung behind a raw writer waiting for log room");
    assert!(r.is_ok(), "{r:?}");
    let n = writes.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(n > 0);
}

/// Without a log, a plain write of a small value checks that the database
/// holds no large value, then takes its key's lock: a commit of a large
/// value to the same key in between used to make the plain write fail with
/// `InvalidArgument` ("would replace or delete a large value"), a legal
/// write refused (a review's finding). It now goes through a commit.
#[test]
fn a_plain_write_racing_a_large_value_to_its_key_is_not_refused() {
    let mut refused = Vec::new();
    for round in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default()
            .pool_bytes(8 << 20)
            .capacity_bytes(64 << 20)
            .durability(dana::Durability::Off);
        let db = Db::open(dir.path(), opts).unwrap();
        let t = db.create_tree("t").unwrap();
        let go = Arc::new(std::sync::Barrier::new(3));
        let large = {
            let (t, go) = (t.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                t.put(b"k", &vec![7u8; 64 << 10])
            })
        };
        let small: Vec<_> = (0..2)
            .map(|_| {
                let (t, go) = (t.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    (0..200)
                        .map(|i| t.put(b"k", &[i as u8; 8]))
                        .find(Result::is_err)
                })
            })
            .collect();
        large.join().unwrap().unwrap();
        for s in small {
            if let Some(Err(e)) = s.join().unwrap() {
                refused.push(format!("round {round}: {e}"));
            }
        }
        // Whatever the order, the key holds one of the values written.
        let v = t.get(b"k").unwrap().unwrap();
        assert!(v.len() == 8 || v == vec![7u8; 64 << 10]);
        db.close().unwrap();
    }
    assert!(refused.is_empty(), "{refused:?}");
}

/// A plain write without a log first runs on the caller's thread; one that
/// yields there (a latch held) may hold its key's stripe, and moves to a
/// worker to finish. Queued behind tasks that filled every task slot
/// waiting for it, it was never admitted: the worker spun and the caller
/// waited for good (review 20; plain spawned puts beside blocking ones
/// stalled so with 16-64 slots too). A started write is admitted first,
/// and past the slot limit.
#[test]
fn a_plain_write_that_yielded_holding_its_stripe_is_not_queued_behind_its_waiters() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(8 << 20)
        .capacity_bytes(64 << 20)
        .workers(1)
        .max_tasks_per_worker(2)
        .durability(dana::Durability::Off);
    let db = Db::open(dir.path(), opts).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"0").unwrap();
    let root = t.unlogged_btree().root();
    let flag = || Arc::new(AtomicBool::new(false));
    let (release, go, w_done) = (flag(), flag(), flag());
    // L, one slot: latches the leaf (the root) until released, then stays
    // until W is done.
    let (latched_tx, latched_rx) = mpsc::channel();
    {
        let (pool, release, w_done) = (db.pool().clone(), release.clone(), w_done.clone());
        db.spawn(async move {
            let g = pool.fix_exclusive(root).await.unwrap();
            latched_tx.send(()).unwrap();
            while !release.load(Ordering::SeqCst) {
                dana::sched::yield_now().await;
            }
            drop(g);
            while !w_done.load(Ordering::SeqCst) {
                dana::sched::yield_now().await;
            }
        })
        .unwrap();
    }
    latched_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // W, the other slot: once told, a write of k, which needs k's stripe.
    let (w_tx, w_rx) = mpsc::channel();
    let (admitted_tx, admitted_rx) = mpsc::channel();
    {
        let (t, go, w_done) = (t.clone(), go.clone(), w_done.clone());
        db.spawn(async move {
            admitted_tx.send(()).unwrap();
            while !go.load(Ordering::SeqCst) {
                dana::sched::yield_now().await;
            }
            let r = t.put_async(b"k", b"w").await;
            w_done.store(true, Ordering::SeqCst);
            let _ = w_tx.send(r.is_ok());
        })
        .unwrap();
    }
    admitted_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // S, a blocking put of k: takes k's stripe on this thread, yields on
    // L's latch, and moves to the worker, whose slots are full.
    let (s_tx, s_rx) = mpsc::channel();
    {
        let t = t.clone();
        std::thread::spawn(move || {
            let _ = s_tx.send(t.put(b"k", b"s").is_ok());
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    go.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    release.store(true, Ordering::SeqCst);
    let s = s_rx.recv_timeout(Duration::from_secs(20));
    let w = w_rx.recv_timeout(Duration::from_secs(20));
    if s.is_err() || w.is_err() {
        // Closing would wait for the stuck tasks for good.
        std::mem::forget(t);
        std::mem::forget(db);
        panic!("stuck: the blocking put {s:?}, the task's put {w:?}");
    }
    assert_eq!((s, w), (Ok(true), Ok(true)));
    // "w" when S took the stripe first, as the sleep above arranges; on a
    // host so loaded that S's thread ran after W's try, W held it and S
    // waited (no hang to find then): "s".
    let last = t.get(b"k").unwrap();
    assert!(
        last == Some(b"w".to_vec()) || last == Some(b"s".to_vec()),
        "{last:?}"
    );
    db.close().unwrap();
}
