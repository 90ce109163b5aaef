//! Serializable transactions (`Isolation::Serializable`): write skew and
//! phantoms are refused, a read-only transaction learns whether what it
//! read was consistent, and invariants that only serializability keeps
//! hold under many interleaved tasks. The concurrent tests yield between
//! reading and committing so that tasks interleave on every commit.

use std::ops::Bound::{Excluded, Included};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dana::{Db, Durability, Error, Isolation, Options, Transaction};

fn open(dir: &std::path::Path, d: Durability) -> Db {
    Db::open(
        dir,
        Options::default()
            .pool_bytes(8 << 20)
            .capacity_bytes(64 << 20)
            .workers(2)
            .durability(d),
    )
    .unwrap()
}

fn serializable(db: &Db) -> Transaction {
    let mut tx = db.begin();
    tx.set_isolation(Isolation::Serializable);
    tx
}

#[test]
fn write_skew_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("doctors").unwrap();
    t.put(b"alice", b"on").unwrap();
    t.put(b"bob", b"on").unwrap();
    // Each goes off call after seeing the other on call.
    let (mut a, mut b) = (serializable(&db), serializable(&db));
    assert_eq!(a.get(&t, b"bob").unwrap(), Some(b"on".to_vec()));
    assert_eq!(b.get(&t, b"alice").unwrap(), Some(b"on".to_vec()));
    a.put(&t, b"alice", b"off").unwrap();
    b.put(&t, b"bob", b"off").unwrap();
    db.commit(a).unwrap();
    assert!(matches!(db.commit(b), Err(Error::Conflict(_))));
    assert_eq!(t.get(b"bob").unwrap(), Some(b"on".to_vec()));
    // Read committed lets both through: the skew this level is for.
    t.put(b"alice", b"on").unwrap();
    let (mut a, mut b) = (db.begin(), db.begin());
    a.get(&t, b"bob").unwrap();
    b.get(&t, b"alice").unwrap();
    a.put(&t, b"alice", b"off").unwrap();
    b.put(&t, b"bob", b"off").unwrap();
    db.commit(a).unwrap();
    db.commit(b).unwrap();
}

/// Validation skips re-reading a leaf whose stamp is unchanged; a leaf
/// that changed elsewhere, or was evicted and reloaded, is read again and
/// compared: no false conflict, no missed one.
#[test]
fn validation_sees_changes_through_shared_leaves_and_evictions() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        dir.path(),
        Options::default()
            .pool_bytes(1 << 20)
            .capacity_bytes(64 << 20)
            .workers(1),
    )
    .unwrap();
    let t = db.create_tree("t").unwrap();
    let big = db.create_tree("big").unwrap();
    for k in 0..20u32 {
        t.put(&k.to_be_bytes(), b"v0").unwrap();
    }
    let key = |k: u32| k.to_be_bytes();
    // Unchanged leaf: commits.
    let mut tx = serializable(&db);
    tx.get(&t, &key(3)).unwrap();
    tx.scan(&t, Included(&key(5)[..]), Included(&key(8)[..]), true, 10)
        .unwrap();
    tx.put(&t, &key(30), b"x").unwrap();
    db.commit(tx).unwrap();
    // Another key of the same leaf changed (outside the range): the leaf
    // is read again, the values are equal, no conflict.
    let mut tx = serializable(&db);
    tx.get(&t, &key(3)).unwrap();
    tx.scan(&t, Included(&key(5)[..]), Included(&key(8)[..]), true, 10)
        .unwrap();
    t.put(&key(12), b"v1").unwrap();
    tx.put(&t, &key(31), b"x").unwrap();
    db.commit(tx).unwrap();
    // The key read changed: conflict.
    let mut tx = serializable(&db);
    tx.get(&t, &key(3)).unwrap();
    t.put(&key(3), b"v1").unwrap();
    tx.put(&t, &key(32), b"x").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
    // A key inside the scanned range changed: conflict.
    let mut tx = serializable(&db);
    tx.scan(&t, Included(&key(5)[..]), Included(&key(8)[..]), true, 10)
        .unwrap();
    t.put(&key(6), b"v1").unwrap();
    tx.put(&t, &key(33), b"x").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
    // The leaf evicted (a 1 MiB pool, 8 MiB written elsewhere) and
    // reloaded unchanged: commits; changed and evicted: conflict.
    let fill = |from: u32| {
        for k in from..from + 2048 {
            big.put(&k.to_be_bytes(), &[7u8; 4000]).unwrap();
        }
    };
    let mut tx = serializable(&db);
    tx.get(&t, &key(3)).unwrap();
    fill(0);
    tx.put(&t, &key(34), b"x").unwrap();
    db.commit(tx).unwrap();
    let mut tx = serializable(&db);
    tx.get(&t, &key(3)).unwrap();
    t.put(&key(3), b"v2").unwrap();
    fill(4096);
    tx.put(&t, &key(35), b"x").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
    assert_eq!(t.get(&key(3)).unwrap(), Some(b"v2".to_vec()));
    assert_eq!(t.get(&key(34)).unwrap(), Some(b"x".to_vec()));
    assert_eq!(t.get(&key(35)).unwrap(), None);
}

#[test]
fn a_phantom_in_a_scanned_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("t").unwrap();
    let log = db.create_tree("log").unwrap();
    for k in [b"a1", b"a3", b"b1"] {
        t.put(k, b"x").unwrap();
    }
    let range = |tx: &mut Transaction| {
        tx.scan(&t, Included(&b"a"[..]), Excluded(&b"b"[..]), true, 100)
            .unwrap()
            .len()
    };
    // An insert into the range after the scan.
    let mut tx = serializable(&db);
    assert_eq!(range(&mut tx), 2);
    tx.put(&log, b"count", b"2").unwrap();
    t.put(b"a2", b"x").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
    // A change outside the range does not matter.
    let mut tx = serializable(&db);
    assert_eq!(range(&mut tx), 3);
    tx.put(&log, b"count", b"3").unwrap();
    t.put(b"b2", b"x").unwrap();
    t.put(b"0", b"x").unwrap();
    db.commit(tx).unwrap();
    // A delete, and a changed value, inside it do.
    for change in [0, 1] {
        let mut tx = serializable(&db);
        range(&mut tx);
        tx.put(&log, b"count", b"?").unwrap();
        match change {
            0 => t.delete(b"a1").map(|_| ()).unwrap(),
            _ => t.put(b"a3", b"y").map(|_| ()).unwrap(),
        }
        assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
    }
    // A scan with a limit depends on the range only as far as it went.
    let mut tx = serializable(&db);
    let first = tx
        .scan(&t, Included(&b"a"[..]), Excluded(&b"b"[..]), true, 1)
        .unwrap();
    assert_eq!(first[0].0, b"a2");
    t.put(b"a9", b"x").unwrap();
    tx.put(&log, b"first", &first[0].0).unwrap();
    db.commit(tx).unwrap();
    // Its own writes in the range are its own, not conflicts.
    let mut tx = serializable(&db);
    tx.put(&t, b"a5", b"mine").unwrap();
    tx.delete(&t, b"a2").unwrap();
    let keys: Vec<Vec<u8>> = tx
        .scan(&t, Included(&b"a"[..]), Excluded(&b"b"[..]), false, 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, vec![b"a9".to_vec(), b"a5".to_vec(), b"a3".to_vec()]);
    db.commit(tx).unwrap();
    assert_eq!(t.get(b"a5").unwrap(), Some(b"mine".to_vec()));
    assert_eq!(t.get(b"a2").unwrap(), None);
}

#[test]
fn a_read_only_transaction_learns_whether_its_reads_were_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("t").unwrap();
    t.put(b"x", b"1").unwrap();
    let mut tx = serializable(&db);
    tx.get(&t, b"x").unwrap();
    db.commit(tx).unwrap();
    let mut tx = serializable(&db);
    tx.get(&t, b"x").unwrap();
    t.put(b"x", b"2").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::Conflict(_))));
}

/// Tasks that each read every key of a group (scanning it) and, if at
/// most `cap - 1` of them are set, set one more: under serializable
/// isolation no group ever holds more than `cap` set keys, whatever the
/// interleaving. Returns the most set keys seen in any group and the
/// conflicts.
fn run_cap_workload(isolation: Isolation, durability: Durability) -> (usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), durability);
    let t = db.create_tree("groups").unwrap();
    const GROUPS: u8 = 4;
    const CAP: usize = 3;
    const TASKS: u64 = 32;
    const ROUNDS: u64 = 40;
    let conflicts = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    // Every task starts once all are spawned, so that they interleave.
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for task in 0..TASKS {
        let (db2, t, conflicts, done, go) = (
            db.clone(),
            t.clone(),
            conflicts.clone(),
            done.clone(),
            go.clone(),
        );
        db.spawn(async move {
            while !go.load(Ordering::Acquire) {
                dana::sched::yield_now().await;
            }
            let mut rng = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for round in 0..ROUNDS {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let g = b'a' + (rng % u64::from(GROUPS)) as u8;
                loop {
                    let mut tx = db2.begin();
                    tx.set_isolation(isolation);
                    let lo = [g];
                    let hi = [g + 1];
                    let set = tx
                        .scan_async(&t, Included(&lo[..]), Excluded(&hi[..]), true, 1000)
                        .await
                        .unwrap();
                    dana::sched::yield_now().await;
                    if set.len() >= CAP {
                        break;
                    }
                    let key = [g, (task as u8), round as u8];
                    tx.put(&t, &key, b"set").unwrap();
                    match tx.commit_async().await {
                        Ok(()) => break,
                        Err(Error::Conflict(_)) => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                            dana::sched::yield_now().await;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            done.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    }
    go.store(true, Ordering::Release);
    let started = std::time::Instant::now();
    while done.load(Ordering::Relaxed) < TASKS {
        assert!(
            started.elapsed().as_secs() < 120,
            "the tasks did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let mut most = 0;
    for g in 0..GROUPS {
        let lo = [b'a' + g];
        let hi = [b'a' + g + 1];
        let n = t
            .scan(Included(&lo[..]), Excluded(&hi[..]), true, 10_000)
            .unwrap()
            .len();
        most = most.max(n);
    }
    (most, conflicts.load(Ordering::Relaxed))
}

#[test]
fn no_interleaving_breaks_an_invariant_over_a_scanned_range() {
    for d in [Durability::Sync, Durability::Off] {
        let (most, conflicts) = run_cap_workload(Isolation::Serializable, d);
        assert!(most <= 3, "{d:?}: a group holds {most} set keys, cap 3");
        assert!(conflicts > 0, "{d:?}: the tasks never interleaved");
    }
}

#[test]
fn read_committed_lets_two_scans_break_that_invariant_serializable_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("groups").unwrap();
    t.put(b"a1", b"set").unwrap();
    t.put(b"a2", b"set").unwrap();
    for (isolation, both) in [
        (Isolation::ReadCommitted, true),
        (Isolation::Serializable, false),
    ] {
        // Two transactions each see two set keys (cap 3) and add one.
        let (mut x, mut y) = (db.begin(), db.begin());
        x.set_isolation(isolation);
        y.set_isolation(isolation);
        let group = |tx: &mut Transaction| {
            tx.scan(&t, Included(&b"a"[..]), Excluded(&b"b"[..]), true, 100)
                .unwrap()
                .len()
        };
        let n = group(&mut x);
        assert_eq!(group(&mut y), n);
        x.put(&t, format!("a{}x", n + 1).as_bytes(), b"set")
            .unwrap();
        y.put(&t, format!("a{}y", n + 1).as_bytes(), b"set")
            .unwrap();
        db.commit(x).unwrap();
        assert_eq!(db.commit(y).is_ok(), both, "{isolation}");
        let now = t
            .scan(Included(&b"a"[..]), Excluded(&b"b"[..]), true, 100)
            .unwrap();
        for (k, _) in now.iter().skip(2) {
            t.delete(k).unwrap();
        }
    }
}

/// `tx.insert` of a key the transaction read present fails at commit with
/// `KeyExists`, at either isolation level, and changes nothing (the first
/// version skipped the absence check for a key read, and the insert
/// overwrote the value).
#[test]
fn an_insert_of_a_key_read_present_fails_with_key_exists() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"old").unwrap();
    for isolation in [Isolation::ReadCommitted, Isolation::Serializable] {
        let mut tx = db.begin();
        tx.set_isolation(isolation);
        assert_eq!(tx.get(&t, b"k").unwrap(), Some(b"old".to_vec()));
        tx.insert(&t, b"k", b"new").unwrap();
        let r = db.commit(tx);
        assert!(matches!(r, Err(Error::KeyExists)), "{isolation:?}: {r:?}");
        assert_eq!(t.get(b"k").unwrap(), Some(b"old".to_vec()));
    }
    // Read absent, then inserted: commits.
    let mut tx = db.begin();
    assert_eq!(tx.get(&t, b"n").unwrap(), None);
    tx.insert(&t, b"n", b"v").unwrap();
    db.commit(tx).unwrap();
    assert_eq!(t.get(b"n").unwrap(), Some(b"v".to_vec()));
}

/// Read committed validates the keys it writes that a scan read: two
/// transactions that scan a counter and write it plus one cannot both
/// commit (the first version validated only keys read with `get`, and
/// one increment was lost); a key written past where a limited scan
/// stopped is not checked.
#[test]
fn read_committed_validates_keys_written_after_a_scan_read_them() {
    use std::ops::Bound::Unbounded;
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("t").unwrap();
    t.put(b"c", &5u64.to_be_bytes()).unwrap();
    let bump = |tx: &mut Transaction| {
        let rows = tx
            .scan(&t, Included(&b"c"[..]), Included(&b"c"[..]), true, 10)
            .unwrap();
        let n = u64::from_be_bytes(rows[0].1.clone().try_into().unwrap());
        tx.put(&t, b"c", &(n + 1).to_be_bytes()).unwrap();
    };
    let (mut a, mut b) = (db.begin(), db.begin());
    bump(&mut a);
    bump(&mut b);
    db.commit(a).unwrap();
    assert!(matches!(db.commit(b), Err(Error::Conflict(_))));
    assert_eq!(t.get(b"c").unwrap(), Some(6u64.to_be_bytes().to_vec()));
    // A key absent from a scanned range, inserted by another meanwhile.
    let mut a = db.begin();
    let rows = a
        .scan(&t, Included(&b"d"[..]), Excluded(&b"e"[..]), true, 10)
        .unwrap();
    assert!(rows.is_empty());
    a.put(&t, b"d1", b"mine").unwrap();
    t.put(b"d1", b"theirs").unwrap();
    assert!(matches!(db.commit(a), Err(Error::Conflict(_))));
    // A limited scan stopped at "c": a key past it is not checked.
    t.put(b"f", b"1").unwrap();
    let mut a = db.begin();
    let rows = a
        .scan(&t, Included(&b"a"[..]), Excluded(&b"z"[..]), true, 1)
        .unwrap();
    assert_eq!(rows.len(), 1);
    a.put(&t, b"f", b"mine").unwrap();
    t.put(b"f", b"2").unwrap();
    db.commit(a).unwrap();
    assert_eq!(t.get(b"f").unwrap(), Some(b"mine".to_vec()));
    // Two scans saw the key, another commit changed it between them, and
    // the write was computed from the first: the first scan's value is
    // checked too (only the last scan's was, and the update was lost; a
    // review's finding). `get` keeps the first value it read the same way.
    let mut a = db.begin();
    let rows = a
        .scan(&t, Included(&b"c"[..]), Included(&b"c"[..]), true, 10)
        .unwrap();
    let n = u64::from_be_bytes(rows[0].1.clone().try_into().unwrap());
    t.put(b"c", &(n + 10).to_be_bytes()).unwrap();
    a.scan(&t, Unbounded, Unbounded, true, 100).unwrap();
    a.put(&t, b"c", &(n + 1).to_be_bytes()).unwrap();
    assert!(matches!(db.commit(a), Err(Error::Conflict(_))));
    assert_eq!(t.get(b"c").unwrap(), Some((n + 10).to_be_bytes().to_vec()));
    // The same with the key absent at the first scan, inserted before the
    // second.
    let mut a = db.begin();
    let rows = a
        .scan(&t, Included(&b"g"[..]), Excluded(&b"h"[..]), true, 10)
        .unwrap();
    assert!(rows.is_empty());
    t.put(b"g1", b"theirs").unwrap();
    a.scan(&t, Unbounded, Unbounded, true, 100).unwrap();
    a.put(&t, b"g1", b"mine").unwrap();
    assert!(matches!(db.commit(a), Err(Error::Conflict(_))));
    assert_eq!(t.get(b"g1").unwrap(), Some(b"theirs".to_vec()));
}

/// A serializable transaction that read a tree dropped before its commit
/// is refused with `NoSuchTree`: validation would read the dropped tree's
/// pages, which another tree may hold by then (a review found only the
/// trees written were checked).
#[test]
fn a_commit_that_read_a_dropped_tree_is_refused() {
    use std::ops::Bound::Unbounded;
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let kept = db.create_tree("kept").unwrap();
    for (name, range) in [("read-by-key", false), ("read-by-range", true)] {
        let gone = db.create_tree(name).unwrap();
        for i in 0..500u32 {
            gone.put(&i.to_be_bytes(), b"g").unwrap();
        }
        let mut tx = serializable(&db);
        if range {
            tx.scan(&gone, Unbounded, Unbounded, true, 10).unwrap();
        } else {
            tx.get(&gone, &7u32.to_be_bytes()).unwrap();
        }
        tx.put(&kept, name.as_bytes(), b"v").unwrap();
        assert!(db.drop_tree(name).unwrap());
        // Another tree takes the freed pages.
        let other = db.create_tree(&format!("{name}-other")).unwrap();
        for i in 0..2000u32 {
            other.put(&i.to_be_bytes(), b"o").unwrap();
        }
        let e = db
            .commit(tx)
            .expect_err("a commit that read a dropped tree");
        assert!(matches!(e, Error::NoSuchTree(_)), "{name}: {e}");
        assert_eq!(kept.get(name.as_bytes()).unwrap(), None);
    }
}

/// An insert sees the transaction's own writes, as its reads do: after a
/// delete of the key it replaces the row (it failed `KeyExists` at every
/// commit, checking the tree where the deleted key still was); after a
/// put of the key it fails at once (it succeeded, overwriting); a delete
/// after an insert keeps the insert's check of the tree (it deleted
/// another commit's key instead of failing). A review's findings.
#[test]
fn an_insert_sees_the_transactions_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Durability::Sync);
    let t = db.create_tree("t").unwrap();
    for isolation in [Isolation::ReadCommitted, Isolation::Serializable] {
        t.put(b"row", b"old").unwrap();
        let mut tx = db.begin();
        tx.set_isolation(isolation);
        tx.delete(&t, b"row").unwrap();
        tx.insert(&t, b"row", b"new").unwrap();
        assert_eq!(tx.get(&t, b"row").unwrap(), Some(b"new".to_vec()));
        db.commit(tx).unwrap();
        assert_eq!(t.get(b"row").unwrap(), Some(b"new".to_vec()));

        t.delete(b"fresh").unwrap();
        let mut tx = db.begin();
        tx.set_isolation(isolation);
        tx.put(&t, b"fresh", b"a").unwrap();
        assert!(matches!(
            tx.insert(&t, b"fresh", b"b"),
            Err(Error::KeyExists)
        ));
        db.commit(tx).unwrap();
        assert_eq!(t.get(b"fresh").unwrap(), Some(b"a".to_vec()));

        t.put(b"other", b"theirs").unwrap();
        let mut tx = db.begin();
        tx.set_isolation(isolation);
        tx.insert(&t, b"other", b"mine").unwrap();
        tx.delete(&t, b"other").unwrap();
        assert!(matches!(db.commit(tx), Err(Error::KeyExists)));
        assert_eq!(t.get(b"other").unwrap(), Some(b"theirs".to_vec()));
        t.delete(b"other").unwrap();
    }
}

/// Transfers of one unit between 8 accounts (serializable, threads of
/// their own) beside audits reading every account in a serializable
/// transaction: an audit that commits saw the total. Validation compares
/// values key by key, and a commit may apply between two of its keys
/// while others write a key back to the value it had: the audit's early
/// and late keys then came from either side of a commit, all "as seen".
/// An outside probe saw audits commit totals off by one (1-2 in 55k-80k,
/// 6 of 16 runs); a pass now counts only if no commit registered one of
/// its keys meanwhile. A stress test: without that rule it failed in
/// about half its runs of this length on 2 cores, not every one.
#[test]
fn audits_beside_transfers_always_see_the_total() {
    const ACCOUNTS: u64 = 8;
    const START: i64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(
        Db::open(
            dir.path(),
            Options::default()
                .pool_bytes(8 << 20)
                .capacity_bytes(64 << 20)
                .durability(Durability::Off),
        )
        .unwrap(),
    );
    let t = db.create_tree("accounts").unwrap();
    let key = |a: u64| format!("account{a:03}");
    for a in 0..ACCOUNTS {
        t.put(key(a).as_bytes(), &START.to_le_bytes()).unwrap();
    }
    let value = |v: Option<Vec<u8>>| i64::from_le_bytes(v.unwrap()[..8].try_into().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (audits, torn) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut threads = Vec::new();
    for w in 0..3u64 {
        let (db, t, stop) = (db.clone(), t.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut s = 31 + w;
            while !stop.load(Ordering::Relaxed) {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let x = (s >> 33) % ACCOUNTS;
                let y = (x + 1 + (s >> 40) % (ACCOUNTS - 1)) % ACCOUNTS;
                let mut tx = serializable(&db);
                let r = (|| -> dana::Result<()> {
                    let a = value(tx.get(&t, key(x).as_bytes())?);
                    let b = value(tx.get(&t, key(y).as_bytes())?);
                    tx.put(&t, key(x).as_bytes(), &(a - 1).to_le_bytes())?;
                    tx.put(&t, key(y).as_bytes(), &(b + 1).to_le_bytes())
                })();
                match r.and_then(|()| db.commit(tx)) {
                    Ok(()) | Err(Error::Conflict(_)) => {}
                    Err(e) => panic!("transfer: {e}"),
                }
            }
        }));
    }
    for _ in 0..2 {
        let (db, t, stop) = (db.clone(), t.clone(), stop.clone());
        let (audits, torn) = (audits.clone(), torn.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut tx = serializable(&db);
                let mut sum = 0;
                for a in 0..ACCOUNTS {
                    sum += value(tx.get(&t, key(a).as_bytes()).unwrap());
                }
                match db.commit(tx) {
                    Ok(()) => {
                        audits.fetch_add(1, Ordering::Relaxed);
                        if sum != START * ACCOUNTS as i64 {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(Error::Conflict(_)) => {}
                    Err(e) => panic!("audit: {e}"),
                }
            }
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    let audits = audits.load(Ordering::Relaxed);
    assert!(audits > 1_000, "only {audits} audits committed");
    assert_eq!(
        torn.load(Ordering::Relaxed),
        0,
        "audits committed with a total other than {} (of {audits})",
        START * ACCOUNTS as i64
    );
    let total: i64 = (0..ACCOUNTS)
        .map(|a| value(t.get(key(a).as_bytes()).unwrap()))
        .sum();
    assert_eq!(total, START * ACCOUNTS as i64);
}
