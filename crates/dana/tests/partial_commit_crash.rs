//! Power cuts while large transactions are applied and written back.
//!
//! A commit's in-place leaf changes are not logged as page records: the
//! commit record redoes them (docs/FORMAT.md, "What is logged"). With a
//! pool far smaller than the tree, a transaction of hundreds of writes is
//! partly applied, partly written back and partly logged (splits, merges,
//! first-change images) when the power goes. After recovery each
//! transaction is there whole or not at all, every acknowledged one is
//! there, an untouched tree is intact, and the checker finds every page
//! owned.

use std::collections::BTreeMap;
use std::ops::Bound::Unbounded;
use std::time::Duration;

use crate::sim_rig;

use dana::{Db, Durability, Options};
use sim_rig::Rig;

const LOG: u64 = 2 << 20;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts() -> Options {
    Options::default()
        .log_identity(0xba7c)
        .pool_bytes(40 * 4096)
        .workers(1)
        .log_bytes(LOG)
        .durability(Durability::Sync)
        .async_window(Duration::from_secs(3600))
}

/// The simulated disks of one run.
fn rig(seed: u64) -> Rig {
    Rig::new(seed, 8 << 20, LOG)
}

fn key(i: u32) -> Vec<u8> {
    // A scattered order: consecutive i land far apart, so inserts split
    // leaves in the middle and a transaction touches many leaves.
    format!("k{:06}", i.wrapping_mul(7919) % 1_000_000).into_bytes()
}

fn value(i: u32, version: u8) -> Vec<u8> {
    let mut v = vec![version; 200];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

/// One transaction of the workload: (key, Some(value)) puts, None deletes.
type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// The preload (400 keys) and the three transactions cut by power.
fn plan() -> (Writes, Vec<Writes>) {
    let preload = (0..400).map(|i| (key(i), Some(value(i, 1)))).collect();
    // Inserts of new keys (splits), updates and deletes of old ones.
    let mut tx1: Writes = (400..650).map(|i| (key(i), Some(value(i, 2)))).collect();
    tx1.extend((0..400).step_by(4).map(|i| (key(i), Some(value(i, 3)))));
    tx1.extend((1..400).step_by(5).map(|i| (key(i), None)));
    // Deletes of most keys (merges), a few updates.
    let mut tx2: Writes = (0..650)
        .filter(|i| i % 3 != 0)
        .map(|i| (key(i), None))
        .collect();
    tx2.extend((0..650).step_by(9).map(|i| (key(i), Some(value(i, 4)))));
    // Refill (splits again, now of leaves that took covered changes).
    let tx3: Writes = (650..900).map(|i| (key(i), Some(value(i, 5)))).collect();
    (preload, vec![tx1, tx2, tx3])
}

fn apply(model: &mut Model, writes: &Writes) {
    for (k, v) in writes {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
}

fn commit(db: &Db, tree: &dana::Tree, writes: &Writes) -> dana::Result<()> {
    let mut tx = db.begin();
    for (k, v) in writes {
        match v {
            Some(v) => tx.put(tree, k, v)?,
            None => tx.delete(tree, k)?,
        }
    }
    db.commit(tx)
}

fn contents(tree: &dana::Tree) -> Model {
    tree.scan(Unbounded, Unbounded, true, usize::MAX)
        .unwrap()
        .into_iter()
        .collect()
}

/// The workload cut at request `point` (0: never), with a checkpoint
/// between the first two transactions if `checkpoint`. Returns the number
/// of requests it made.
fn run(seed: u64, point: u64, checkpoint: bool) -> u64 {
    let (preload, txs) = plan();
    let rig = rig(seed);
    let keep: Writes = (0..60).map(|i| (key(i), Some(value(i, 9)))).collect();
    {
        let db = rig.open(opts(), true).unwrap();
        let k = db.create_tree("keep").unwrap();
        commit(&db, &k, &keep).unwrap();
        let t = db.create_tree("t").unwrap();
        for chunk in preload.chunks(100) {
            commit(&db, &t, &chunk.to_vec()).unwrap();
        }
        db.close().unwrap();
    }
    let mut states = vec![Model::new()];
    apply(&mut states[0], &preload);
    for tx in &txs {
        let mut next = states.last().unwrap().clone();
        apply(&mut next, tx);
        states.push(next);
    }

    let mut acked = 0;
    let ios = rig.cut_during(point, seed, || {
        let db = rig.open(opts(), false)?;
        let t = db.tree("t")?;
        for (i, tx) in txs.iter().enumerate() {
            commit(&db, &t, tx)?;
            acked = i + 1;
            if checkpoint && i == 0 {
                db.checkpoint()?;
            }
        }
        db.close()
    });
    let db = rig.reopen_checked(opts(), point);
    let mut keep_model = Model::new();
    apply(&mut keep_model, &keep);
    assert_eq!(
        contents(&db.tree("keep").unwrap()),
        keep_model,
        "point {point}: the untouched tree changed"
    );
    let got = contents(&db.tree("t").unwrap());
    // Every acknowledged transaction is there; the one in doubt (cut
    // during its commit) is there whole or not at all.
    let found = states.iter().position(|s| *s == got);
    assert!(
        matches!(found, Some(f) if f == acked || f == acked + 1),
        "point {point}: {acked} transactions acknowledged; the tree holds {} keys, \
         matching state {found:?} (a partial transaction, or a lost one)",
        got.len()
    );
    // The recovered database takes writes and survives a clean reopen.
    commit(&db, &db.tree("t").unwrap(), &txs[2]).unwrap();
    db.close().unwrap();
    let db = rig.open(opts(), false).unwrap();
    assert!(db.check().unwrap().is_ok(), "point {point}: after a write");
    db.close().unwrap();
    ios
}

fn sweep(seed: u64, checkpoint: bool) {
    cut_at_points(seed, 60, |seed, point| run(seed, point, checkpoint));
}

/// `run(seed, 0)` whole, then cut at `default_points` points spread over
/// its requests (`DANA_PARTIAL_COMMIT_POINTS` overrides), each with a seed
/// of its own.
fn cut_at_points(seed: u64, default_points: u64, mut run: impl FnMut(u64, u64) -> u64) {
    let total = run(seed, 0);
    assert!(total > 100, "the workload made only {total} requests");
    let points = std::env::var("DANA_PARTIAL_COMMIT_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_points);
    for i in 1..=points {
        run(seed + i, 1 + (total - 1) * i / points);
    }
}

#[test]
fn a_power_cut_during_a_large_transaction_keeps_it_whole_or_absent() {
    sweep(11, false);
}

#[test]
fn a_power_cut_after_a_checkpoint_between_large_transactions() {
    sweep(1_000, true);
}

/// Power cuts around one transaction whose page images outgrow the log:
/// right after a checkpoint, it changes a key on each of ~600 leaves of a
/// 1 MiB log (some 2.5 MiB of full images), so its apply appends the
/// writes it has left as records of their own to let checkpoints past
/// its first record (`txn::apply_logged`). Cut anywhere, the reopen must
/// finish (recovery re-applies such a transaction from a log that cannot
/// hold its images either: it hung) and find the transaction whole or
/// absent, whole once acknowledged.
#[test]
fn a_power_cut_around_a_transaction_that_outgrows_the_log() {
    const LOG: u64 = 1 << 20;
    const KEYS: u32 = 12_000;
    let opts = || {
        Options::default()
            .log_identity(0xba7d)
            .pool_bytes(4 << 20)
            .workers(1)
            .log_bytes(LOG)
            .durability(Durability::Sync)
    };
    let old = |i: u32| vec![(i % 251) as u8; 150];
    let new = |i: u32| vec![(i % 13) as u8; 100];
    let key = |i: u32| format!("k{i:06}").into_bytes();
    let preload: Writes = (0..KEYS).map(|i| (key(i), Some(old(i)))).collect();
    let mut big: Writes = Vec::new();
    for i in (0..KEYS).step_by(25) {
        big.push((key(i), None));
        big.push((key(i + 1), Some(new(i + 1))));
    }
    let mut before = Model::new();
    apply(&mut before, &preload);
    let mut after = before.clone();
    apply(&mut after, &big);
    let run = |seed: u64, point: u64| -> u64 {
        let rig = Rig::new(seed, 16 << 20, LOG);
        {
            let db = rig.open(opts(), true).unwrap();
            let t = db.create_tree("t").unwrap();
            for chunk in preload.chunks(200) {
                commit(&db, &t, &chunk.to_vec()).unwrap();
            }
            db.close().unwrap();
        }
        let mut acked = false;
        let ios = rig.cut_during(point, seed, || {
            let db = rig.open(opts(), false)?;
            db.checkpoint()?;
            commit(&db, &db.tree("t")?, &big)?;
            acked = true;
            db.close()
        });
        let db = rig.reopen_checked(opts(), point);
        let got = contents(&db.tree("t").unwrap());
        assert!(
            got == after || (!acked && got == before),
            "point {point}: acknowledged {acked}; the tree holds {} keys, neither state \
             (a partial transaction, or a lost one)",
            got.len()
        );
        db.close().unwrap();
        ios
    };
    cut_at_points(7, 24, run);
}
