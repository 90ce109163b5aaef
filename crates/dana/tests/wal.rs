//! The log on real files: a torn data page is rebuilt from its full image,
//! commits survive a process that never closed the database, async
//! durability, and a failed log sync makes the database refuse writes.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dana::io::sim::{Fault, PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Durability, Error, OpKind, Options};

fn opts() -> Options {
    Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(32 << 20)
        .log_bytes(4 << 20)
}

#[test]
fn committed_writes_survive_without_close_and_a_torn_page_is_repaired() {
    torn_page_repaired(false);
}

/// As above with the full images logged compressed
/// (`Options::compress_log_images`): the leaf's image is an LZ4 block, and
/// the repair decompresses it.
#[test]
fn a_torn_page_is_repaired_from_a_compressed_image() {
    torn_page_repaired(true);
}

fn torn_page_repaired(compress: bool) {
    let dir = tempfile::tempdir().unwrap();
    let opts = || opts().compress_log_images(compress);
    let leaf;
    {
        let db = Db::open(dir.path(), opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        for i in 0u32..50 {
            t.put(&i.to_be_bytes(), b"before").unwrap();
        }
        db.checkpoint().unwrap();
        // The first change after the checkpoint logs the leaf's full image.
        let before = db.wal_stats().unwrap();
        t.put(&7u32.to_be_bytes(), b"after").unwrap();
        let logged = db.wal_stats().unwrap().since(&before);
        assert_eq!(logged.images, 1, "{logged:?}");
        assert_eq!(logged.compressed_images, u64::from(compress), "{logged:?}");
        leaf = t.unlogged_btree().root();
        // The database is dropped without close: no checkpoint, the leaf
        // on disk is the old one.
    }
    // Tear the leaf: its second half is garbage (as a torn write leaves).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("dana.0"))
        .unwrap();
    f.write_all_at(&[0xA5; 2048], leaf * 4096 + 2048).unwrap();
    drop(f);
    let db = Db::open(dir.path(), opts()).unwrap();
    let r = db.recovery().unwrap().clone();
    assert!(r.pages_repaired >= 1, "{r:?}");
    let t = db.tree("t").unwrap();
    assert_eq!(t.get(&7u32.to_be_bytes()).unwrap(), Some(b"after".to_vec()));
    for i in (0u32..50).filter(|&i| i != 7) {
        assert_eq!(t.get(&i.to_be_bytes()).unwrap(), Some(b"before".to_vec()));
    }
    assert!(db.check().unwrap().is_ok());
}

#[test]
fn torn_page_without_an_image_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let leaf;
    {
        let db = Db::open(dir.path(), opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        t.put(b"k", b"v").unwrap();
        leaf = t.unlogged_btree().root();
        db.close().unwrap();
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("dana.0"))
        .unwrap();
    f.write_all_at(&[0xA5; 512], leaf * 4096 + 1024).unwrap();
    drop(f);
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    match t.get(b"k") {
        Err(Error::Corrupt { page, .. }) => assert_eq!(page, leaf),
        other => panic!("expected a checksum error naming page {leaf}, got {other:?}"),
    }
}

#[test]
fn async_commits_become_durable_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts().durability(Durability::Async);
    {
        let db = Db::open(dir.path(), o.clone()).unwrap();
        let t = db.create_tree("t").unwrap();
        for i in 0u32..100 {
            t.put(&i.to_be_bytes(), b"v").unwrap();
        }
        // Longer than the 10 ms window: a flush has happened.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let s = db.wal_stats().unwrap();
        // Every record of every log is durable: nothing waits.
        assert_eq!(s.durable, s.end, "{s:?}");
    }
    let db = Db::open(dir.path(), o).unwrap();
    assert_eq!(
        db.tree("t")
            .unwrap()
            .count(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)
            .unwrap(),
        100
    );
}

/// A log write that failed to become durable poisons the database: the
/// commit fails, every later one fails, nothing is retried. Both flush
/// primitives: a durable write (the default) and write + flush.
fn failed_log_flush_is_sticky(write_through: bool) {
    let data = SimDisk::new(0, 8 << 20, SimConfig::default());
    let log = SimDisk::new(1, CONTROL_BYTES + (1 << 20), SimConfig::default());
    let open = |create| {
        let array = Array::new(vec![Target::Sim(data.clone())], 4096).unwrap();
        Db::open_array_with_log(
            array,
            Some(Target::Sim(log.clone())),
            Options::default()
                .pool_bytes(1 << 20)
                .log_bytes(1 << 20)
                .log_write_through_max(if write_through { u64::MAX } else { 0 }),
            create,
        )
    };
    let db = open(true).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"a", b"1").unwrap();
    let before = log.stats();
    let failing = if write_through {
        OpKind::Write
    } else {
        OpKind::Flush
    };
    log.inject(Fault::nth(Some(failing), 0));
    assert!(
        t.put(b"b", b"2").is_err(),
        "the commit whose log flush failed must fail"
    );
    assert_eq!(log.stats().faults_fired, before.faults_fired + 1);
    // Never retried: every later write fails, even though the fault is gone.
    assert!(matches!(t.put(b"c", b"3"), Err(Error::Poisoned(_))));
    drop(db);
    let db = open(false).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.get(b"a").unwrap(), Some(b"1".to_vec()));
    assert_eq!(t.get(b"c").unwrap(), None);
    let _ = Arc::strong_count(&data);
}

#[test]
fn a_failed_durable_log_write_is_sticky() {
    failed_log_flush_is_sticky(true);
}

#[test]
fn a_failed_log_sync_is_sticky() {
    failed_log_flush_is_sticky(false);
}

/// A leaf split logs its left half as the cut key alone; recovery redoes
/// the cut on the leaf as it finds it. Here that leaf is the image logged
/// right after a checkpoint, full of values that later commits shrank, and
/// the cut's new upper fence is long: the cut does not fit until it leaves
/// out the keys those commits write, and re-applying them gives the
/// acknowledged state back. (The database is dropped without close: no
/// page written since the checkpoint reaches the disk.)
#[test]
fn a_split_leaf_is_rebuilt_from_its_cut_even_when_its_image_held_more() {
    use dana::btree::node::Node;
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    // Keys that differ early (short separators between leaves), 400 bytes.
    let key = |i: u64| [&i.to_be_bytes()[..], &[b'k'; 392]].concat();
    let mut model = BTreeMap::new();
    {
        let db = Db::open(dir.path(), opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        for i in 0..60 {
            t.put(&key(i), &[1; 50]).unwrap();
            model.insert(key(i), vec![1; 50]);
        }
        // A full leaf that is not the last: its keys and its free space.
        let bt = t.unlogged_btree().clone();
        let leaves = db
            .block_on(async move {
                let mut out = Vec::new();
                bt.walk(|_, bytes| {
                    let n = Node::new(bytes).unwrap();
                    if n.is_leaf() && n.upper_fence().is_some() {
                        let keys: Vec<Vec<u8>> = (0..n.len()).map(|i| n.key_vec_at(i)).collect();
                        out.push((keys, n.free_space_after_compaction()));
                    }
                    Ok(())
                })
                .await
                .map(|_| out)
            })
            .unwrap()
            .unwrap();
        let (keys, _) = leaves
            .into_iter()
            .find(|(k, _)| k.len() >= 3)
            .expect("a leaf with three keys");
        // Fill it up with a key between its first two (an ascending load
        // leaves one entry's room).
        let mut keys = keys;
        let extra = [&keys[0][..], &[0u8][..]].concat();
        t.put(&extra, &[4; 300]).unwrap();
        model.insert(extra.clone(), vec![4; 300]);
        keys.insert(1, extra);
        let last = keys.last().unwrap().clone();
        db.checkpoint().unwrap();
        // The first change since the checkpoint: a full image of the leaf.
        t.put(&keys[0], &[2; 50]).unwrap();
        model.insert(keys[0].clone(), vec![2; 50]);
        // Commits shrink every value but the last key's (deletes would
        // merge the leaf away)...
        for k in &keys[..keys.len() - 1] {
            t.put(k, b"").unwrap();
            model.insert(k.clone(), Vec::new());
        }
        // ...and append keys that share 400 bytes with it until it
        // splits: the cut key (between two of them) is about 408 bytes.
        for j in 1..=12u64 {
            let k = [&last[..], &j.to_be_bytes()[..]].concat();
            t.put(&k, &[3; 50]).unwrap();
            model.insert(k, vec![3; 50]);
        }
    }
    let db = Db::open(dir.path(), opts()).unwrap();
    let r = db.recovery().unwrap().clone();
    assert!(r.leaf_cuts >= 1, "{r:?}");
    assert!(r.keys_left_to_reapply >= 1, "{r:?}");
    let t = db.tree("t").unwrap();
    let got: BTreeMap<Vec<u8>, Vec<u8>> = t
        .scan(
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            true,
            usize::MAX,
        )
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(got, model);
    assert!(db.check().unwrap().is_ok());
}

/// Writes outside commits (`unlogged_btree()`, a tree's drop) log their
/// pages too; they wait for log room like commits do. Before, a bulk load
/// larger than the log filled it past what a checkpoint could free (a
/// checkpoint needs a flush, the flush needed the space) and both workers
/// spun forever; so did the drop of a tree larger than the log.
#[test]
fn writes_outside_commits_wait_for_log_room_instead_of_filling_it() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let r = (|| -> dana::Result<u64> {
            let opts = Options::default()
                .pool_bytes(8 << 20)
                .capacity_bytes(64 << 20)
                .log_bytes(1 << 20)
                .workers(2);
            let db = Db::open(&path, opts)?;
            let t = db.create_tree("bulk")?;
            let bt = t.unlogged_btree().clone();
            // About 12 MiB of leaves, split as they fill: many times the log.
            let n = 80_000u64;
            db.block_on(async move {
                for i in 0..n {
                    let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_be_bytes();
                    bt.insert(&k, &[7u8; 120]).await?;
                }
                Ok::<(), dana::Error>(())
            })??;
            let count = t.count(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)?;
            assert!(db.drop_tree("bulk")?);
            db.close()?;
            Ok(count)
        })();
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a bulk load and drop many times the log size hung");
    assert_eq!(got.unwrap(), 80_000);
}

/// A database on simulated `data` and `log` devices (a 2 MiB pool).
fn open_sim(data: &Arc<SimDisk>, log: &Arc<SimDisk>, log_bytes: u64, create: bool) -> Db {
    let array = Array::new(vec![Target::Sim(data.clone())], 4096).unwrap();
    let o = Options::default().pool_bytes(2 << 20).log_bytes(log_bytes);
    Db::open_array_with_log(array, Some(Target::Sim(log.clone())), o, create).unwrap()
}

/// A checkpoint trims the log stream it frees on a device that takes
/// discards cheaply (the simulator: a trimmed block reads as zeros after),
/// not on a file; after power cuts with the log wrapped many times over
/// trimmed blocks, every acknowledged commit is found.
#[test]
fn checkpoints_trim_the_log_behind_them_and_power_cuts_lose_nothing() {
    use dana::io::sim::{PowerCutPolicy, PowerSwitch};
    const LOG: u64 = 1 << 20;
    const KEYS: u64 = 2_000;
    let value = |i: u64, r: u64| {
        let mut v = format!("{i}:{r}:").into_bytes();
        v.resize(120, b'x');
        v
    };
    for round in 0..6u64 {
        let data = SimDisk::new(0, 32 << 20, SimConfig::deterministic(round));
        let log = SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::deterministic(round ^ 9));
        let open = |create: bool| open_sim(&data, &log, LOG, create);
        let db = open(true);
        let t = db.create_tree("t").unwrap();
        // The log wraps several times before the cut: its first blocks
        // were trimmed and written again.
        let switch = PowerSwitch::new(3_000 + round * 700, PowerCutPolicy::DropAll, round);
        let mut acked = vec![None; KEYS as usize];
        let mut last = 0;
        'run: for r in 0..400u64 {
            last = r;
            for c in 0..20u64 {
                let keys: Vec<u64> = (0..10)
                    .map(|j| (r * 977 + c * 131 + j * 37) % KEYS)
                    .collect();
                let ok = db.transaction(|tx| {
                    for &i in &keys {
                        tx.put(&t, &i.to_be_bytes(), &value(i, r))?;
                    }
                    Ok(())
                });
                if ok.is_err() {
                    break 'run;
                }
                for &i in &keys {
                    acked[i as usize] = Some(r);
                }
            }
            if r == 60 {
                let s = db.wal_stats().unwrap();
                assert!(
                    s.trimmed_bytes > 2 * LOG && s.trim_failures == 0,
                    "round {round}: {s:?}"
                );
                switch.attach(&data);
                switch.attach(&log);
            }
            if r % 5 == 0 && db.checkpoint().is_err() {
                break;
            }
        }
        assert!(switch.fired(), "round {round}: no cut");
        drop((t, db));
        data.power_on();
        log.power_on();
        let db = open(false);
        let t = db.tree("t").unwrap();
        for (i, a) in acked.iter().enumerate() {
            let Some(r) = *a else { continue };
            let got = t
                .get(&(i as u64).to_be_bytes())
                .unwrap()
                .expect("acknowledged");
            // The commit in flight at the cut may be there too.
            let newer = (r..=last).any(|r| got == value(i as u64, r));
            assert!(
                newer,
                "round {round}, key {i}: lost its commit of round {r}"
            );
        }
        assert!(db.check().unwrap().is_ok());
        db.close().unwrap();
    }
    // The newest control block damaged after commits between the last
    // two checkpoints: the log the other block names was not trimmed
    // (trims lag a checkpoint), so recovery from it finds every commit.
    let data = SimDisk::new(0, 32 << 20, SimConfig::default());
    let log = SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::default());
    let open = |create: bool| open_sim(&data, &log, LOG, create);
    let db = open(true);
    let t = db.create_tree("t").unwrap();
    let round = |r: u64| {
        db.transaction(|tx| {
            for i in 0..200u64 {
                tx.put(&t, &i.to_be_bytes(), &value(i, r))?;
            }
            Ok(())
        })
        .unwrap();
    };
    for r in 0..40u64 {
        round(r);
        db.checkpoint().unwrap();
    }
    round(40);
    let trimmed = db.wal_stats().unwrap().trimmed_bytes;
    assert!(trimmed > 0);
    drop(t);
    // Out of the pool's sight: the close's checkpoint is block `newest`.
    db.close().unwrap();
    let seq = |at: u64| u64::from_le_bytes(log.read_durable(at + 16, 8).try_into().unwrap());
    let newest = if seq(0) > seq(4096) { 0 } else { 4096 };
    let mut block = log.read_durable(newest, 4096);
    block[30] ^= 0x10;
    log.overwrite_durable(newest, &block);
    let db = open(false);
    let t = db.tree("t").unwrap();
    for i in 0..200u64 {
        assert_eq!(
            t.get(&i.to_be_bytes()).unwrap(),
            Some(value(i, 40)),
            "key {i}"
        );
    }
    drop(t);
    db.close().unwrap();
    // A log file is never trimmed (a punched hole would make its next
    // synced write allocate blocks).
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0u32..5_000 {
        t.put(&i.to_be_bytes(), &[7; 200]).unwrap();
        if i % 1_000 == 0 {
            db.checkpoint().unwrap();
        }
    }
    assert_eq!(db.wal_stats().unwrap().trimmed_bytes, 0);
    db.close().unwrap();
}

/// Data writes failing for good while many tasks split leaves in a small
/// pool: the pool is poisoned, and the tasks waiting for a frame inside
/// an allocation fail. Whatever those allocations had changed is logged
/// (the log keeps running), so it must be whole: the next open, with the
/// disk mended, must recover and `check` clean. (An allocation set the
/// page's map bit before it took the frame, and failed there: its map
/// change was logged without the meta page's count, and the next open
/// failed with `Corrupt`; a review's finding.)
#[test]
fn allocations_failed_by_a_poisoned_pool_leave_a_database_that_opens() {
    for round in 0..12u64 {
        let data = SimDisk::new(0, 64 << 20, SimConfig::deterministic(round));
        let log = SimDisk::new(
            1,
            CONTROL_BYTES + (8 << 20),
            SimConfig::deterministic(round ^ 5),
        );
        let open = |create: bool| {
            let array = Array::new(vec![Target::Sim(data.clone())], 4096).unwrap();
            let o = Options::default().pool_bytes(64 * 4096).log_bytes(8 << 20);
            Db::open_array_with_log(array, Some(Target::Sim(log.clone())), o, create)
        };
        let db = open(true).unwrap();
        let t = db.create_tree("t").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for task in 0..16u64 {
            let (t, tx) = (t.clone(), tx.clone());
            db.spawn(async move {
                let mut x = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for _ in 0..5_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if t.put_async(&x.to_be_bytes(), &[task as u8; 200])
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                let _ = tx.send(());
            })
            .unwrap();
        }
        drop(tx);
        std::thread::sleep(std::time::Duration::from_millis(100 + 25 * round));
        data.inject(Fault::nth(Some(OpKind::Write), 0).sticky());
        for _ in rx {}
        assert!(
            db.pool().poisoned().is_some(),
            "round {round}: no write failed"
        );
        drop(t);
        let _ = db.close();
        data.clear_faults();
        let db = open(false).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let report = db.check().unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.findings);
        db.close().unwrap();
    }
}

/// A data disk and a 1 MiB log disk, simulated (power cuts at chosen
/// requests).
struct Pair {
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
}

impl Pair {
    const LOG: u64 = 1 << 20;

    /// Slow page writes (`slow`, in real time): checkpoints lag behind
    /// the commits, and the log fills up to where admission holds them.
    /// Otherwise both disks are deterministic and fast.
    fn new(seed: u64, slow: bool) -> Pair {
        let data = if slow {
            SimConfig {
                iops: Some(1000),
                seed,
                ..SimConfig::default()
            }
        } else {
            SimConfig::deterministic(seed)
        };
        Pair {
            data: SimDisk::new(0, 64 << 20, data),
            log: SimDisk::new(
                1,
                CONTROL_BYTES + Self::LOG,
                SimConfig::deterministic(!seed),
            ),
        }
    }

    fn open(&self, create: bool) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        let opts = Options::default()
            .pool_bytes(16 << 20)
            .workers(2)
            .log_bytes(Self::LOG);
        Db::open_array_with_log(array, Some(Target::Sim(self.log.clone())), opts, create)
    }

    /// Fresh (fast) disks holding what survives on these.
    fn copy(&self, seed: u64) -> Pair {
        let p = Pair::new(seed, false);
        p.data.copy_durable_from(&self.data).unwrap();
        p.log.copy_durable_from(&self.log).unwrap();
        p
    }

    fn cut(&self, policy: PowerCutPolicy) {
        self.data.power_cut(policy, 1);
        self.log.power_cut(policy, 2);
    }

    fn power_on(&self) {
        self.data.power_on();
        self.log.power_on();
    }
}

const WRITERS: u64 = 64;

/// Each writer's key, which only it writes: its rounds in order.
fn own_key(task: u64) -> Vec<u8> {
    format!("own/{task:02}").into_bytes()
}

/// 64 writers commit (synced) until the power is cut under them; each
/// commit writes the writer's own key (a 700-byte value starting with the
/// round) and a key spread over the tree. Returns each writer's last
/// acknowledged round plus one (0: none), and fast disks holding what
/// survived (recovery not run yet).
fn crash_under_writers(seed: u64) -> (Vec<u64>, Pair) {
    let pair = Pair::new(seed, true);
    let db = pair.open(true).unwrap();
    let t = db.create_tree("t").unwrap();
    let spread = |i: u64| format!("key/{:08}", i.wrapping_mul(2654435761) % 100_000).into_bytes();
    for i in 0..2_000u64 {
        t.put(&spread(i), &[1u8; 100]).unwrap();
    }
    db.checkpoint().unwrap();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let total = Arc::new(AtomicU64::new(0));
    for task in 0..WRITERS {
        let (t, d, acked, total) = (t.clone(), db.clone(), acked.clone(), total.clone());
        db.spawn(async move {
            for round in 0..u64::MAX {
                let mut v = vec![(round % 251) as u8; 700];
                v[..8].copy_from_slice(&round.to_le_bytes());
                let mut txn = d.begin();
                let spread = spread(task * 7919 + round * 104_729);
                if txn.put(&t, &own_key(task), &v).is_err()
                    || txn.put(&t, &spread, &v[..100]).is_err()
                    || txn.commit_async().await.is_err()
                {
                    break;
                }
                acked[task as usize].store(round + 1, Ordering::Release);
                total.fetch_add(1, Ordering::Relaxed);
            }
        })
        .unwrap();
    }
    while total.load(Ordering::Relaxed) < 3_000 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    pair.cut(PowerCutPolicy::DropAll);
    let acked: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
    drop(t);
    drop(db);
    pair.power_on();
    (acked, pair.copy(seed))
}

/// Each writer's key holds its last acknowledged round or a later one.
fn check_own_keys(db: &Db, acked: &[u64], when: &str) {
    let t = db.tree("t").unwrap();
    for (task, &n) in acked.iter().enumerate() {
        let v = t.get(&own_key(task as u64)).unwrap();
        let held = v.map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()));
        assert!(
            held.map_or(0, |r| r + 1) >= n,
            "{when}: writer {task} acknowledged its rounds 0..{n} but its key holds round {held:?}"
        );
    }
}

/// A recovery short of log room appends the commits it has left again at
/// the log end and checkpoints to move the redo point to them. A power
/// cut during that batch's flush can leave a prefix of it, while the
/// redo point is still before the first copies: re-applying the prefix
/// after them wrote older values over acknowledged later ones (a review's
/// finding). Here the recovery is cut at each of its requests (each
/// write not durable keeps a random prefix of its sectors), and every
/// reopen must hold every acknowledged write.
#[test]
fn a_crash_while_recovery_appends_commits_again_loses_nothing() {
    let mut seed = 0;
    let (acked, crashed, requests) = loop {
        seed += 1;
        let (acked, crashed) = crash_under_writers(seed);
        // The whole recovery, counting its requests.
        let whole = crashed.copy(seed);
        let switch = PowerSwitch::new(0, PowerCutPolicy::DropAll, seed);
        switch.attach(&whole.data);
        switch.attach(&whole.log);
        let db = whole.open(false).unwrap();
        let requests = switch.count();
        let report = db.recovery().unwrap().clone();
        check_own_keys(&db, &acked, "after a whole recovery");
        db.close().unwrap();
        if report.commits_appended_again > 0 {
            break (acked, crashed, requests);
        }
        assert!(seed < 4, "no recovery appended commits again: {report:?}");
    };
    let mut ignored = 0;
    let mut at = 1;
    while at < requests {
        let pair = crashed.copy(seed);
        let switch = PowerSwitch::new(at, PowerCutPolicy::Prefix, seed ^ at);
        switch.attach(&pair.data);
        switch.attach(&pair.log);
        if let Ok(db) = pair.open(false) {
            drop(db);
        }
        assert!(switch.fired(), "cut at request {at} of {requests}");
        pair.power_on();
        let db = pair
            .open(false)
            .unwrap_or_else(|e| panic!("cut at request {at} of {requests}: {e}"));
        ignored += db.recovery().map_or(0, |r| r.appended_again_ignored);
        check_own_keys(&db, &acked, &format!("cut at request {at} of {requests}"));
        db.close().unwrap();
        at += 1;
    }
    assert!(ignored > 0, "no cut came while commits were appended again");
}
