//! Per-worker logs across power cuts: two workers, each appending to its
//! own log on its own simulated device, with transactions that read each
//! other's writes before those are durable.
//!
//! - A commit acknowledged after reading another worker's write that only
//!   that worker's log held (not yet durable) survives a power cut, and so
//!   does the write it read: its log waited for the other one.
//! - A commit that read nothing another log holds waits for its own log
//!   only (remote-flush avoidance): the other log's async write is lost.
//! - Transfers between accounts on both workers, cut at many points: the
//!   sum of the accounts is always the sum they started with, and every
//!   acknowledged transfer is there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use dana::io::sim::{Latency, PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Error, Options};

const LOG: u64 = 2 << 20;

struct Rig {
    data: Arc<SimDisk>,
    logs: Vec<Arc<SimDisk>>,
}

impl Rig {
    fn new(seed: u64) -> Rig {
        Rig {
            data: SimDisk::new(0, 32 << 20, SimConfig::deterministic(seed)),
            logs: (1..3)
                .map(|i| {
                    SimDisk::new(
                        i,
                        CONTROL_BYTES + LOG,
                        SimConfig::deterministic(seed ^ i as u64),
                    )
                })
                .collect(),
        }
    }

    fn opts() -> Options {
        Options::default()
            .pool_bytes(8 << 20)
            .workers(2)
            .log_bytes(2 * LOG)
            // No timer-driven flush: an async commit stays in its log
            // until something asks for it.
            .async_window(Duration::from_secs(3600))
    }

    fn open(&self, create: bool) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        let logs = self.logs.iter().map(|l| Target::Sim(l.clone())).collect();
        Db::open_array_with_logs(array, logs, Rig::opts(), create)
    }

    fn disks(&self) -> impl Iterator<Item = &Arc<SimDisk>> {
        std::iter::once(&self.data).chain(&self.logs)
    }

    /// Cuts the power: every write not yet durable is lost.
    fn cut(&self) {
        for d in self.disks() {
            d.power_cut(PowerCutPolicy::DropAll, 0);
        }
    }

    fn power_on(&self) {
        for d in self.disks() {
            d.power_on();
        }
    }
}

/// Runs `f` on worker `w` and returns its result.
fn on<T: Send + 'static>(
    db: &Db,
    w: usize,
    f: impl std::future::Future<Output = dana::Result<T>> + Send + 'static,
) -> dana::Result<T> {
    let (send, recv) = mpsc::channel();
    db.spawn_on(w, async move {
        let _ = send.send(f.await);
    })
    .unwrap();
    recv.recv().unwrap()
}

/// Worker 0 writes `a` with an async commit: the record stays in log 0.
/// Returns the GSN after it.
fn unflushed_write_on_worker_0(db: &Db, key: &'static [u8]) -> u64 {
    let (d, t) = (db.clone(), db.tree("t").unwrap());
    let end = on(db, 0, async move {
        let mut tx = d.begin();
        tx.set_durability(Durability::Async);
        tx.put(&t, key, b"a")?;
        tx.commit_lsn_async().await
    })
    .unwrap();
    assert!(
        db.wal_stats().unwrap().durable < end,
        "the async write is durable already: the test shows nothing"
    );
    end
}

/// Cuts the power under `db`, turns it back on and opens the database
/// again (recovery runs): the database and its tree "t".
fn power_cycle(rig: &Rig, db: Db) -> (Db, dana::Tree) {
    rig.cut();
    drop(db);
    rig.power_on();
    let db = rig.open(false).unwrap();
    let t = db.tree("t").unwrap();
    (db, t)
}

fn fresh(seed: u64) -> (Rig, Db) {
    let rig = Rig::new(seed);
    let db = rig.open(true).unwrap();
    db.create_tree("t").unwrap();
    db.checkpoint().unwrap();
    (rig, db)
}

#[test]
fn a_commit_that_read_another_workers_unflushed_write_survives_with_it() {
    let (rig, db) = fresh(1);
    unflushed_write_on_worker_0(&db, b"a");
    // Worker 1 reads it and writes what it read, acknowledged (Sync).
    let (d, t) = (db.clone(), db.tree("t").unwrap());
    on(&db, 1, async move {
        let mut tx = d.begin();
        let seen = tx.get_async(&t, b"a").await?;
        assert_eq!(seen, Some(b"a".to_vec()), "the write is visible at once");
        tx.put(&t, b"b", &seen.unwrap())?;
        tx.commit_async().await
    })
    .unwrap();
    let (db, t) = power_cycle(&rig, db);
    assert_eq!(
        t.get(b"b").unwrap(),
        Some(b"a".to_vec()),
        "the acknowledged commit"
    );
    a_survived(db, t, "the write the acknowledged commit read");
}

#[test]
fn a_commit_that_read_nothing_remote_waits_for_its_own_log_only() {
    let (rig, db) = fresh(2);
    unflushed_write_on_worker_0(&db, b"a");
    // A blind write on worker 1 (the same leaf, no read: a transaction's
    // put, where `put_async` would answer whether the key was there,
    // read from a leaf log 0 changed): acknowledged once log 1 is
    // durable; log 0 is not asked to flush.
    blind_write_on_worker_1_survives_alone(&rig, db, "t");
}

/// Commits key "c" into tree `tree` from worker 1 (a blind write), cuts
/// the power, and checks that "c" survived and worker 0's unflushed "a"
/// did not (log 0 was not asked to flush); closes the database.
fn blind_write_on_worker_1_survives_alone(rig: &Rig, db: Db, tree: &str) {
    let (d, u) = (db.clone(), db.tree(tree).unwrap());
    on(&db, 1, async move {
        let mut tx = d.begin();
        tx.put(&u, b"c", b"c")?;
        tx.commit_async().await
    })
    .unwrap();
    let (db, t) = power_cycle(rig, db);
    assert_eq!(
        db.tree(tree).unwrap().get(b"c").unwrap(),
        Some(b"c".to_vec()),
        "the acknowledged write"
    );
    assert_eq!(
        t.get(b"a").unwrap(),
        None,
        "an async write nobody depended on waited for its own window"
    );
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
}

/// The same for a blind write into a leaf whose first change since the
/// checkpoint it is (the log writes a full image of the leaf): the image
/// depends on the commit's record in the same log, and on nothing in log
/// 0. It depended on every log up to the commit's GSN, and log 0 was made
/// to flush a write nobody read (a review's finding).
#[test]
fn a_first_change_after_a_checkpoint_waits_for_its_own_log_only() {
    let (rig, db) = fresh(3);
    db.create_tree("u").unwrap().put(b"u", b"u").unwrap();
    db.checkpoint().unwrap();
    unflushed_write_on_worker_0(&db, b"a");
    blind_write_on_worker_1_survives_alone(&rig, db, "u");
}

/// An async commit that read another worker's write not yet durable
/// returns only once that worker's log is durable past it (not its own:
/// it is async): a power cut then keeps the write it read and may lose
/// the commit itself. Returning at once let committers on two workers
/// chain records each depending on the other log's last, which drained
/// one flush per link: an outside probe saw commits stall for seconds
/// and 20,000 acknowledged commits lost by a kill -9.
#[test]
fn an_async_commit_that_read_another_workers_unflushed_write_waits_for_that_log() {
    let (rig, db) = fresh_with_slow_log_0(|_| Ok(()));
    unflushed_write_on_worker_0(&db, b"a");
    let (d, t) = (db.clone(), db.tree("t").unwrap());
    on(&db, 1, async move {
        let mut tx = d.begin();
        tx.set_durability(Durability::Async);
        let seen = tx.get_async(&t, b"a").await?;
        tx.put(&t, b"b", &seen.unwrap())?;
        tx.commit_async().await
    })
    .unwrap();
    let (db, t) = power_cycle(&rig, db);
    assert_eq!(
        t.get(b"b").unwrap(),
        None,
        "the async commit itself waited for no flush of its own log"
    );
    a_survived(db, t, "the write the async commit read");
}

/// A database on [`rig_with_slow_log_0`] (log 0 asked to flush is durable
/// 300 ms later) with tree "t", `fill` committed into it, checkpointed.
fn fresh_with_slow_log_0(fill: impl FnOnce(&Db) -> dana::Result<()>) -> (Rig, Db) {
    let rig = rig_with_slow_log_0();
    let db = rig.open(true).unwrap();
    db.create_tree("t").unwrap();
    fill(&db).unwrap();
    db.checkpoint().unwrap();
    (rig, db)
}

/// After a power cut, key "a" of [`unflushed_write_on_worker_0`] is
/// there (`what` wrote it: its log was asked to flush), and the database
/// checks clean; closes it.
fn a_survived(db: Db, t: dana::Tree, what: &str) {
    assert_eq!(
        t.get(b"a").unwrap(),
        Some(b"a".to_vec()),
        "{what}: its log was asked to flush"
    );
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
}

/// The same for a blind async write whose apply splits a leaf another
/// worker changed last, not durably: the split's page records depend on
/// that change, and the commit returns once that worker's log is durable
/// past it. Returning at once, async inserts from 16 tasks on two workers
/// chained such records across the logs and stalled for seconds (`dana
/// bench commit --logs 0`: max latency 7.3-7.9 s, no checkpoint).
///
/// A transaction set to `Durability::Off` on a database with a log
/// commits as `Async` does (the database's `Off` means that already): it
/// skipped the wait, and such commits could build the same chains.
#[test]
fn an_async_write_that_split_another_workers_unflushed_leaf_waits_for_that_log() {
    for durability in [Durability::Async, Durability::Off] {
        // One leaf, nearly full, durable (one commit: log 0 is slow).
        let (rig, db) = fresh_with_slow_log_0(|db| {
            let t = db.tree("t")?;
            let mut tx = db.begin();
            for i in 0..30u32 {
                tx.put(&t, format!("k{i:04}").as_bytes(), &[1u8; 100])?;
            }
            db.commit(tx)
        });
        unflushed_write_on_worker_0(&db, b"a");
        let (d, t) = (db.clone(), db.tree("t").unwrap());
        on(&db, 1, async move {
            let mut tx = d.begin();
            tx.set_durability(durability);
            tx.put(&t, b"z", &[2u8; 900])?;
            tx.commit_async().await
        })
        .unwrap();
        let (db, t) = power_cycle(&rig, db);
        let what = format!("the write in the leaf the {durability:?} commit split");
        a_survived(db, t, &what);
    }
}

const ACCOUNTS: u64 = 64;
const START: u64 = 1000;

fn account(i: u64) -> Vec<u8> {
    format!("acct{i:04}").into_bytes()
}

fn balance(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
}

/// One transfer of task `task` (its `n`-th): reads two accounts, moves 1,
/// and counts itself in the task's counter. Tasks on worker 0 commit
/// asynchronously (their records wait in log 0 until something asks for
/// them), those on worker 1 synchronously: worker 1's transfers read
/// worker 0's before they are durable.
async fn transfer(db: Db, t: dana::Tree, task: u64, n: u64) -> dana::Result<()> {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ task.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 29;
    let (from, to) = (x % ACCOUNTS, (x / ACCOUNTS) % ACCOUNTS);
    let mut tx = db.begin();
    if task % 2 == 0 {
        tx.set_durability(Durability::Async);
    }
    let a = balance(tx.get_async(&t, &account(from)).await?);
    let b = balance(tx.get_async(&t, &account(to)).await?);
    let counter = format!("task{task}").into_bytes();
    let done = balance(tx.get_async(&t, &counter).await?);
    if from != to && a > 0 {
        tx.put(&t, &account(from), &(a - 1).to_le_bytes())?;
        tx.put(&t, &account(to), &(b + 1).to_le_bytes())?;
    }
    tx.put(&t, &counter, &(done + 1).to_le_bytes())?;
    tx.commit_async().await
}

#[test]
fn transfers_on_two_workers_survive_power_cuts_whole() {
    const TASKS: u64 = 8;
    const EACH: u64 = 40;
    for round in 0..24u64 {
        let rig = Rig::new(100 + round);
        let db = rig.open(true).unwrap();
        let t = db.create_tree("t").unwrap();
        db.transaction(|tx| {
            for i in 0..ACCOUNTS {
                tx.put(&t, &account(i), &START.to_le_bytes())?;
            }
            Ok(())
        })
        .unwrap();
        db.checkpoint().unwrap();
        // Cut somewhere in the run (about 400 requests long); every other
        // round keeps, drops or tears each write not yet durable.
        let policy = match round % 2 {
            0 => PowerCutPolicy::DropAll,
            _ => PowerCutPolicy::Random {
                keep: 1.0,
                drop: 1.0,
                tear: 1.0,
            },
        };
        let switch = PowerSwitch::new(10 + round * 16, policy, round);
        for d in rig.disks() {
            switch.attach(d);
        }
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
        let (send, recv) = mpsc::channel();
        for task in 0..TASKS {
            let (d, t, acked, send) = (db.clone(), t.clone(), acked.clone(), send.clone());
            db.spawn_on(task as usize % 2, async move {
                let mut n = 0;
                while n < EACH {
                    match transfer(d.clone(), t.clone(), task, n).await {
                        Ok(()) => {
                            acked[task as usize].fetch_add(1, Ordering::AcqRel);
                            n += 1;
                        }
                        Err(Error::Conflict(_)) => {}
                        Err(_) => break,
                    }
                }
                let _ = send.send(());
            })
            .unwrap();
        }
        drop(send);
        while recv.recv().is_ok() {}
        switch.cut();
        drop((db, t));
        rig.power_on();
        let db = rig.open(false).unwrap();
        let t = db.tree("t").unwrap();
        let sum: u64 = (0..ACCOUNTS)
            .map(|i| balance(t.get(&account(i)).unwrap()))
            .sum();
        assert_eq!(sum, ACCOUNTS * START, "round {round}: money made or lost");
        for task in 0..TASKS {
            let done = balance(t.get(format!("task{task}").as_bytes()).unwrap());
            let acked = acked[task as usize].load(Ordering::Acquire);
            // An async transfer is acknowledged before it is durable.
            let lowest = if task % 2 == 0 { 0 } else { acked };
            assert!(
                (lowest..=acked + 1).contains(&done),
                "round {round}, task {task}: {acked} transfers acknowledged, {done} found"
            );
        }
        assert!(db.check().unwrap().is_ok(), "round {round}");
        db.close().unwrap();
    }
}

/// An async commit appended to a log while another worker's flush of that
/// log is in flight is flushed within its window once that flush ends.
/// The log's own worker slept without a deadline while the flush was in
/// flight (its completion wakes the worker that issued it), and the
/// worker that issued it, which does not tend the log, saw no reason to
/// flush: the commit stayed in memory until something else happened.
#[test]
fn an_async_commit_behind_another_workers_flush_is_flushed_within_its_window() {
    let slow = SimConfig {
        latency: Latency::Fixed(Duration::from_millis(200)),
        ..SimConfig::default()
    };
    let data = SimDisk::new(0, 32 << 20, SimConfig::default());
    let logs: Vec<_> = [slow, SimConfig::default()]
        .into_iter()
        .enumerate()
        .map(|(i, c)| SimDisk::new(i + 1, CONTROL_BYTES + LOG, c))
        .collect();
    let window = Duration::from_millis(600);
    let opts = Options::default()
        .pool_bytes(8 << 20)
        .workers(2)
        .log_bytes(2 * LOG)
        .async_window(window);
    let array = Array::new(vec![Target::Sim(data)], 4096).unwrap();
    let targets = logs.iter().map(|l| Target::Sim(l.clone())).collect();
    let db = Db::open_array_with_logs(array, targets, opts, true).unwrap();
    db.create_tree("t").unwrap();
    db.checkpoint().unwrap();
    let async_put = |key: &'static [u8]| {
        let (d, t) = (db.clone(), db.tree("t").unwrap());
        on(&db, 0, async move {
            let mut tx = d.begin();
            tx.set_durability(Durability::Async);
            tx.put(&t, key, b"v")?;
            tx.commit_lsn_async().await
        })
        .unwrap()
    };
    async_put(b"a");
    // Worker 1 reads it and commits: it asks for log 0 and, log 0's
    // worker asleep, flushes log 0 itself (200 ms on the slow device).
    let (d, t) = (db.clone(), db.tree("t").unwrap());
    let (send, reader) = mpsc::channel();
    db.spawn_on(1, async move {
        let r = async {
            let mut tx = d.begin();
            let seen = tx.get_async(&t, b"a").await?;
            tx.put(&t, b"b", &seen.unwrap_or_default())?;
            tx.commit_async().await
        };
        let _ = send.send(r.await);
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    let end = async_put(b"z");
    reader.recv().unwrap().unwrap();
    // Within the window (from the append), plus the flush's 200 ms and
    // slack for a busy machine.
    while db.wal_stats().unwrap().durable < end {
        assert!(
            started.elapsed() < window + Duration::from_secs(3),
            "an async commit not flushed {:?} after it was appended (window {window:?})",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    db.close().unwrap();
}

/// A copy of `base`'s disks as they are durably (to cut again and again
/// from one state).
fn copy_of(base: &Rig, seed: u64) -> Rig {
    let rig = Rig::new(seed);
    for (to, from) in rig.disks().zip(base.disks()) {
        to.copy_durable_from(from).unwrap();
    }
    rig
}

/// A checkpoint cut at each of its requests while one log is idle (its
/// last flush padded to the block, nothing after it): every reopen
/// succeeds with every acknowledged write. A checkpoint records each
/// log's end, to refuse a log put back from an older copy; a first
/// version compared the idle log's valid end, short of its padding, with
/// that end, and refused a crash between the meta page's write and the
/// idle log's checkpoint record (found by a kill -9 campaign).
#[test]
fn a_checkpoint_cut_anywhere_beside_an_idle_log_reopens() {
    let (base, db) = fresh(7);
    let t = db.tree("t").unwrap();
    for i in 0..200u32 {
        let t = t.clone();
        // Worker 0 only: log 1 stays idle. Synced: all durable.
        on(&db, 0, async move {
            t.put_async(&i.to_be_bytes(), b"v").await.map(|_| ())
        })
        .unwrap();
    }
    drop(t);
    base.cut();
    drop(db);
    base.power_on();
    let requests = {
        let rig = copy_of(&base, 8);
        let db = rig.open(false).unwrap();
        let switch = PowerSwitch::new(0, PowerCutPolicy::DropAll, 0);
        for d in rig.disks() {
            switch.attach(d);
        }
        db.checkpoint().unwrap();
        let n = switch.count();
        db.close().unwrap();
        n
    };
    assert!(requests > 3, "{requests} requests");
    for point in 1..=requests {
        let rig = copy_of(&base, 8);
        let db = rig.open(false).unwrap();
        let policy = PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 1.0,
        };
        let switch = PowerSwitch::new(point, policy, point);
        for d in rig.disks() {
            switch.attach(d);
        }
        let _ = db.checkpoint();
        assert!(switch.fired(), "point {point}");
        drop(db);
        rig.power_on();
        let db = rig
            .open(false)
            .unwrap_or_else(|e| panic!("point {point} of {requests}: {e}"));
        let t = db.tree("t").unwrap();
        for i in 0..200u32 {
            assert_eq!(t.get(&i.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]));
        }
        drop(t);
        db.close().unwrap();
    }
}

/// A rig whose log of worker 0 takes 300 ms for each request (the data
/// disk and the other log none): a commit on worker 0 stays not durable
/// for that long while worker 1's commits are durable at once.
fn rig_with_slow_log_0() -> Rig {
    let slow = SimConfig {
        latency: Latency::Fixed(Duration::from_millis(300)),
        ..SimConfig::default()
    };
    Rig {
        data: SimDisk::new(0, 32 << 20, SimConfig::default()),
        logs: vec![
            SimDisk::new(1, CONTROL_BYTES + LOG, slow),
            SimDisk::new(2, CONTROL_BYTES + LOG, SimConfig::default()),
        ],
    }
}

/// Runs `f` on a new thread whose home worker (where its sync calls run,
/// and whose log their commits go to) is worker 0.
fn on_a_thread_of_worker_0<T: Send + 'static, F: FnOnce(Db) -> T + Send + 'static>(
    db: &Db,
    f: F,
) -> std::thread::JoinHandle<Option<T>> {
    let mut f = Some(f);
    // Homes are dealt round robin over every thread of the process.
    for _ in 0..64 {
        let d = db.clone();
        let (home_tx, home_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<Option<F>>();
        let h = std::thread::spawn(move || {
            home_tx.send(d.runtime().home_worker()).unwrap();
            go_rx.recv().unwrap().map(|f| f(d))
        });
        if home_rx.recv().unwrap() == 0 {
            go_tx.send(f.take()).unwrap();
            return h;
        }
        go_tx.send(None).unwrap();
        h.join().unwrap();
    }
    panic!("no thread got worker 0 for its home");
}

/// A tree created on worker 0, its catalogue commit not yet durable in
/// log 0, and a blind put into it on worker 1 acknowledged (log 1
/// durable): a power cut then must leave the tree with the put, not a
/// put into a tree the log never created. A blind write reads nothing,
/// so only the tree's handle (its catalogue entry, read by `Db::tree`)
/// ties it to the creation (found in review: the put's commit carried no
/// dependency, recovery re-applied it into the root page the lost
/// creation had allocated, and the database failed every open with
/// `Corrupt`).
#[test]
fn a_blind_write_into_a_tree_another_worker_just_created_survives_with_it() {
    let rig = rig_with_slow_log_0();
    let db = rig.open(true).unwrap();
    db.create_tree("t").unwrap();
    db.checkpoint().unwrap();
    let creating = on_a_thread_of_worker_0(&db, |d| d.create_tree("u").map(|_| ()));
    let u = loop {
        match db.tree("u") {
            Ok(u) => break u,
            Err(Error::NoSuchTree(_)) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
    };
    // A blind write: a transaction's put (no answer read).
    let d = db.clone();
    let put = on(&db, 1, async move {
        let mut tx = d.begin();
        tx.put(&u, b"k", b"v")?;
        tx.commit_async().await
    });
    assert!(put.is_ok(), "{put:?}");
    rig.cut();
    drop(db);
    let _ = creating.join();
    rig.power_on();
    let db = rig
        .open(false)
        .expect("the put acknowledged, with the tree it went into");
    let u = db
        .tree("u")
        .expect("the tree an acknowledged put went into");
    assert_eq!(u.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop(u);
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
}

/// Puts (`Some`) and deletes (`None`) of keys of tree "t".
type Writes = &'static [(&'static [u8], Option<&'static [u8]>)];

/// Worker 0 commits `writes` and a put of "witness" in one async commit
/// that stays in log 0 (not durable): the witness shows after a power
/// cut whether that commit survived.
fn unflushed_commit_on_worker_0(db: &Db, writes: Writes) {
    let (d, t) = (db.clone(), db.tree("t").unwrap());
    let end = on(db, 0, async move {
        let mut tx = d.begin();
        tx.set_durability(Durability::Async);
        for (k, v) in writes {
            match v {
                Some(v) => tx.put(&t, k, v)?,
                None => tx.delete(&t, k)?,
            }
        }
        tx.put(&t, b"witness", b"w")?;
        tx.commit_lsn_async().await
    })
    .unwrap();
    assert!(
        db.wal_stats().unwrap().durable < end,
        "the async commit is durable already: the test shows nothing"
    );
}

/// Answers that single writes on worker 1 read from a leaf that worker
/// 0's commit, not yet durable, had just changed: each acknowledged
/// (Sync) answer survives a power cut with the commit it was read from
/// (found in review: `delete` answered "it was there" about a put a crash
/// then lost, since its own flush covered log 1 only; `insert` answered
/// `KeyExists` and `update_async` "absent" without waiting at all).
#[test]
fn answers_read_from_another_workers_unflushed_commit_survive_with_it() {
    type Ask = fn(
        dana::Tree,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = dana::Result<bool>> + Send>,
    >;
    let cases: [(&str, Writes, Ask, dana::Result<bool>); 4] = [
        (
            "delete finds the key",
            &[(b"a", Some(b"a"))],
            |t| Box::pin(async move { t.delete_async(b"a").await }),
            Ok(true),
        ),
        (
            "put replaces it",
            &[(b"a", Some(b"a"))],
            |t| Box::pin(async move { t.put_async(b"a", b"b").await }),
            Ok(true),
        ),
        (
            "insert finds it there",
            &[(b"a", Some(b"a"))],
            |t| Box::pin(async move { t.insert_async(b"a", b"b").await.map(|()| false) }),
            Err(Error::KeyExists),
        ),
        (
            "update finds it gone",
            &[(b"x", None)],
            |t| Box::pin(async move { t.update_async(b"x", |v| v.to_vec()).await }),
            Ok(false),
        ),
    ];
    for (i, (what, writes, ask, expected)) in cases.into_iter().enumerate() {
        let (rig, db) = fresh(20 + i as u64);
        let t = db.tree("t").unwrap();
        t.put(b"x", b"x").unwrap();
        db.checkpoint().unwrap();
        unflushed_commit_on_worker_0(&db, writes);
        let answer = on(&db, 1, ask(t));
        assert_eq!(format!("{answer:?}"), format!("{expected:?}"), "{what}");
        let (db, t) = power_cycle(&rig, db);
        assert_eq!(
            t.get(b"witness").unwrap().as_deref(),
            Some(&b"w"[..]),
            "{what}: the answer was read from a commit the crash lost"
        );
        drop(t);
        db.close().unwrap();
    }
}
