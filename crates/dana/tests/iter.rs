//! The streaming iterators (`Tree::range`, `iter`, `prefix`) against a
//! `BTreeMap` model, on a pool small enough that the ranges span many
//! evicted leaves, and under concurrent writers: each key at most once, in
//! order, and every key nobody touched returned with its value.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dana::{Db, Options};
use proptest::prelude::*;

fn small_db(dir: &std::path::Path) -> Db {
    Db::open(
        dir,
        Options::default().pool_bytes(1 << 20).log_bytes(8 << 20),
    )
    .unwrap()
}

fn value(k: &[u8]) -> Vec<u8> {
    let mut v = k.to_vec();
    v.extend_from_slice(&[7; 40]);
    v
}

/// Keys over a small alphabet so that prefixes and bounds collide.
fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![Just(0u8), Just(1), Just(0x7f), Just(0xff)],
        0..6,
    )
}

#[derive(Debug, Clone)]
enum Step {
    Front,
    Back,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Any bounds, any mix of next and next_back: the same entries as a
    /// BTreeMap's range.
    #[test]
    fn ranges_match_a_btreemap(
        keys in proptest::collection::btree_set(key_strategy(), 0..300),
        lo in key_strategy(),
        hi in key_strategy(),
        lo_kind in 0..3u8,
        hi_kind in 0..3u8,
        steps in proptest::collection::vec(prop_oneof![Just(Step::Front), Just(Step::Back)], 0..400),
        prefix in key_strategy(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = small_db(dir.path());
        let t = db.create_tree("t").unwrap();
        let mut model = BTreeMap::new();
        db.transaction(|tx| {
            for k in &keys {
                tx.put(&t, k, &value(k))?;
            }
            Ok(())
        }).unwrap();
        for k in &keys {
            model.insert(k.clone(), value(k));
        }
        let bound = |kind: u8, k: &Vec<u8>| match kind {
            0 => Bound::Included(k.clone()),
            1 => Bound::Excluded(k.clone()),
            _ => Bound::Unbounded,
        };
        let (lb, ub) = (bound(lo_kind, &lo), bound(hi_kind, &hi));
        // BTreeMap panics on an empty or inverted range; dana yields nothing.
        let valid = match (&lb, &ub) {
            (Bound::Included(a), Bound::Included(b)) => a <= b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
                a < b
            }
            _ => true,
        };
        let mut it = t.range::<Vec<u8>>((lb.clone(), ub.clone()));
        let mut expect: Box<dyn DoubleEndedIterator<Item = (&Vec<u8>, &Vec<u8>)>> = if valid {
            Box::new(model.range((lb, ub)))
        } else {
            Box::new(std::iter::empty())
        };
        for s in &steps {
            let (got, want) = match s {
                Step::Front => (it.next(), expect.next()),
                Step::Back => (it.next_back(), expect.next_back()),
            };
            let got = got.map(|r| r.unwrap());
            prop_assert_eq!(got, want.map(|(k, v)| (k.clone(), v.clone())));
        }
        // Whatever is left, forward.
        let rest: Vec<_> = it.map(|r| r.unwrap()).collect();
        let want: Vec<_> = expect.map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(rest, want);

        let got: Vec<_> = t.prefix(&prefix).rev().map(|r| r.unwrap().0).collect();
        let want: Vec<_> = model.keys().rev().filter(|k| k.starts_with(&prefix)).cloned().collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(t.iter().count(), model.len());
    }
}

/// A scan over many evicted leaves while two writers insert, update and
/// delete keys between the stable ones: every stable key exactly once, in
/// order, with its value; any other key at most once, with a value some
/// writer committed.
#[test]
fn concurrent_writers_never_hide_an_untouched_key_or_repeat_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = small_db(dir.path());
    let t = db.create_tree("t").unwrap();
    let stable = |i: u32| (i * 2).to_be_bytes().to_vec();
    let n = 20_000u32;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        db.transaction(|tx| {
            for &i in chunk {
                tx.put(&t, &stable(i), &value(&stable(i)))?;
            }
            Ok(())
        })
        .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let (t, stop, written) = (t.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut x = 12345u64 + u64::from(w);
                let mut ops = 0;
                while !stop.load(Ordering::Acquire) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = ((x % u64::from(n)) as u32 * 2 + 1).to_be_bytes();
                    if x % 3 == 0 {
                        t.delete(&k).unwrap();
                    } else {
                        t.put(&k, &value(&k)).unwrap();
                    }
                    ops += 1;
                    written.fetch_add(1, Ordering::Relaxed);
                }
                ops
            })
        })
        .collect();
    // At least three rounds, and as many more as it takes for the writers
    // to commit 100 writes during the scans (each write is a synced commit:
    // beside other tests' syncs that took more than three rounds once).
    let before = written.load(Ordering::Relaxed);
    let mut round = 0;
    while round < 3 || (written.load(Ordering::Relaxed) - before < 100 && round < 200) {
        let forward = round % 2 == 0;
        let it = t.iter();
        let entries: Vec<_> = if forward {
            it.map(|r| r.unwrap()).collect()
        } else {
            let mut v: Vec<_> = it.rev().map(|r| r.unwrap()).collect();
            v.reverse();
            v
        };
        for pair in entries.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "round {round}: out of order or repeated"
            );
        }
        let mut next_stable = 0u32;
        for (k, v) in &entries {
            assert_eq!(v, &value(k), "round {round}: a value nobody committed");
            let i = u32::from_be_bytes(k[..4].try_into().unwrap());
            if i % 2 == 0 {
                assert_eq!(
                    i / 2,
                    next_stable,
                    "round {round}: stable key {next_stable} missing"
                );
                next_stable += 1;
            }
        }
        assert_eq!(
            next_stable, n,
            "round {round}: stable keys missing at the end"
        );
        round += 1;
    }
    let during = written.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Release);
    let ops: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(
        during >= 100,
        "the writers ran ({during} writes during {round} rounds of scans, {ops} in all)"
    );
    db.close().unwrap();
}
