//! The record cache (`Options::record_cache_bytes`) never serves a value
//! the tree no longer holds: writers racing readers that fill it, read-
//! modify-write transactions validated through it, a tree dropped and
//! created again at the same root, and a model of random operations in a
//! pool small enough to evict.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::{Db, Durability, Error, Isolation, Options};
use proptest::prelude::*;

fn open(dir: &std::path::Path, record_cache: usize) -> Db {
    Db::open(
        dir,
        Options::default()
            .pool_bytes(1 << 20)
            .record_cache_bytes(record_cache)
            .capacity_bytes(64 << 20)
            .workers(2)
            .durability(Durability::Off),
    )
    .unwrap()
}

fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

fn wait_for(count: &AtomicU64, n: u64, what: &str) {
    let started = Instant::now();
    while count.load(Ordering::Acquire) < n {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{what}: the tasks did not finish"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writers put increasing versions of a few hot keys while readers fill
/// the cache with them: a writer reads its own write back, and a reader
/// never sees a key's version go back (a fill of a value read before a
/// write, entered after it, would show the old version again).
#[test]
fn reads_never_go_back_while_writers_and_fillers_race() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 256 << 10);
    let t = db.create_tree("t").unwrap();
    const KEYS: u64 = 8;
    const VERSIONS: u64 = 300;
    const READERS: u64 = 24;
    for k in 0..KEYS {
        t.put(&key(k), &0u64.to_be_bytes()).unwrap();
    }
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    for k in 0..KEYS {
        let (t, done) = (t.clone(), done.clone());
        db.spawn_on(k as usize % 2, async move {
            for v in 1..=VERSIONS {
                t.put_async(&key(k), &v.to_be_bytes()).await.unwrap();
                let back = t.get_async(&key(k)).await.unwrap().unwrap();
                assert_eq!(back, v.to_be_bytes(), "key {k} read back after its write");
                dana::sched::yield_now().await;
            }
            done.fetch_add(1, Ordering::Release);
        })
        .unwrap();
    }
    let readers_done = Arc::new(AtomicU64::new(0));
    for r in 0..READERS {
        let (t, stop, readers_done) = (t.clone(), stop.clone(), readers_done.clone());
        db.spawn_on(r as usize % 2, async move {
            let mut last = [0u64; KEYS as usize];
            let mut i = r;
            while !stop.load(Ordering::Acquire) {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = (i >> 33) % KEYS;
                let v = t.get_async(&key(k)).await.unwrap().unwrap();
                let v = u64::from_be_bytes(v.try_into().unwrap());
                assert!(
                    v >= last[k as usize],
                    "key {k}: version {v} after {}",
                    last[k as usize]
                );
                last[k as usize] = v;
                dana::sched::yield_now().await;
            }
            readers_done.fetch_add(1, Ordering::Release);
        })
        .unwrap();
    }
    wait_for(&done, KEYS, "writers");
    stop.store(true, Ordering::Release);
    wait_for(&readers_done, READERS, "readers");
    let s = db.pool().records().stats();
    assert!(s.hits > 0 && s.fills > 0 && s.invalidations > 0, "{s:?}");
}

/// Tasks increment shared counters in transactions (read, yield, write):
/// a commit validates its read through the cache, so a stale cached value
/// would let two increments from one value both commit, and the sum
/// would come out short.
#[test]
fn increments_validated_through_the_cache_lose_none() {
    for isolation in [Isolation::ReadCommitted, Isolation::Serializable] {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path(), 256 << 10);
        let t = db.create_tree("counters").unwrap();
        const COUNTERS: u64 = 4;
        const TASKS: u64 = 16;
        const ROUNDS: u64 = 40;
        for c in 0..COUNTERS {
            t.put(&key(c), &0u64.to_be_bytes()).unwrap();
        }
        let done = Arc::new(AtomicU64::new(0));
        let conflicts = Arc::new(AtomicU64::new(0));
        for task in 0..TASKS {
            let (db2, t, done, conflicts) =
                (db.clone(), t.clone(), done.clone(), conflicts.clone());
            db.spawn_on(task as usize % 2, async move {
                for round in 0..ROUNDS {
                    let c = (task + round) % COUNTERS;
                    loop {
                        let mut tx = db2.begin();
                        tx.set_isolation(isolation);
                        let v = tx.get_async(&t, &key(c)).await.unwrap().unwrap();
                        let v = u64::from_be_bytes(v.try_into().unwrap());
                        dana::sched::yield_now().await;
                        tx.put(&t, &key(c), &(v + 1).to_be_bytes()).unwrap();
                        match tx.commit_async().await {
                            Ok(()) => break,
                            Err(Error::Conflict(_)) => {
                                conflicts.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                done.fetch_add(1, Ordering::Release);
            })
            .unwrap();
        }
        wait_for(&done, TASKS, "incrementers");
        let sum: u64 = (0..COUNTERS)
            .map(|c| u64::from_be_bytes(t.get(&key(c)).unwrap().unwrap().try_into().unwrap()))
            .sum();
        assert_eq!(sum, TASKS * ROUNDS, "{isolation:?}: increments lost");
        assert!(
            conflicts.load(Ordering::Relaxed) > 0,
            "{isolation:?}: no increments interleaved"
        );
        assert!(
            db.pool().records().stats().hits > 0,
            "{isolation:?}: the cache served nothing"
        );
    }
}

/// A tree dropped and created again (its root page may be reused) holds
/// none of the old tree's records, cached or not.
#[test]
fn a_tree_dropped_and_created_again_serves_none_of_the_old_records() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), 256 << 10);
    for round in 0..4u8 {
        let t = db.create_tree("t").unwrap();
        for k in 0..50u64 {
            assert_eq!(
                t.get(&key(k)).unwrap(),
                None,
                "round {round}: key {k} survived the drop"
            );
        }
        for k in 0..50u64 {
            t.put(&key(k), &[round; 16]).unwrap();
        }
        for _ in 0..3 {
            for k in 0..50u64 {
                assert_eq!(t.get(&key(k)).unwrap(), Some(vec![round; 16]));
            }
        }
        assert!(
            db.pool().records().stats().entries > 0,
            "round {round}: nothing cached"
        );
        assert!(db.drop_tree("t").unwrap());
        // Freed pages may not be reused at once (so the loop above may
        // never meet an old root): the drop itself must empty the cache.
        assert_eq!(
            db.pool().records().stats().entries,
            0,
            "round {round}: records outlived their tree"
        );
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, usize),
    Delete(u8),
    Get(u8),
    Update(u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 0usize..1_500).prop_map(|(k, n)| Op::Put(k % 64, n)),
        1 => any::<u8>().prop_map(|k| Op::Delete(k % 64)),
        8 => any::<u8>().prop_map(|k| Op::Get(k % 64)),
        1 => any::<u8>().prop_map(|k| Op::Update(k % 64)),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Random puts (values up to 1.5 KB: some beyond what the cache
    /// keeps), deletes, reads, read-modify-writes and reopens against a
    /// map, in a 1 MiB pool with a 16 KiB cache.
    #[test]
    fn the_tree_through_its_cache_is_the_model(ops in proptest::collection::vec(op(), 1..300)) {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path(), 16 << 10);
        let mut t = db.create_tree("m").unwrap();
        let mut model: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Put(k, n) => {
                    let v = vec![(i % 251) as u8; n];
                    t.put(&[k], &v).unwrap();
                    model.insert(k, v);
                }
                Op::Delete(k) => {
                    prop_assert_eq!(t.delete(&[k]).unwrap(), model.remove(&k).is_some());
                }
                Op::Get(k) => prop_assert_eq!(t.get(&[k]).unwrap(), model.get(&k).cloned()),
                Op::Update(k) => {
                    let found = t.update(&[k], |old| {
                        let mut v = old.to_vec();
                        v.push(7);
                        v
                    }).unwrap();
                    prop_assert_eq!(found, model.contains_key(&k));
                    if let Some(v) = model.get_mut(&k) {
                        v.push(7);
                    }
                }
                Op::Reopen => {
                    drop(t);
                    db.close().unwrap();
                    db = open(dir.path(), 16 << 10);
                    t = db.tree("m").unwrap();
                }
            }
        }
        for (k, v) in &model {
            prop_assert_eq!(t.get(&[*k]).unwrap(), Some(v.clone()));
        }
    }
}
