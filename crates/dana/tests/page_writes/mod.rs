//! Rounds of updates for the tests of devices whose page writes never tear
//! (out of place, untorn writes), shared by `tests/out_of_place.rs` and
//! `tests/untorn_writes.rs`: the keys and values, a load, the log a round
//! of updates costs, and runs of commits cut by a power switch with the
//! check that every acknowledged one is there after recovery.

use dana::{Db, Tree};

/// Keys each database holds.
pub const KEYS: u64 = 3_000;

pub fn key(i: u64) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

/// Key `i`'s value in update round `round` (150-199 bytes).
pub fn value(i: u64, round: u64) -> Vec<u8> {
    let mut v = format!("value of {i} in round {round}:").into_bytes();
    v.resize(150 + (i % 50) as usize, b'a' + (round % 26) as u8);
    v
}

/// Writes every key's value of `round`, 100 keys per transaction, then
/// checkpoints.
pub fn update_round(db: &Db, t: &Tree, round: u64) {
    put_round(db, t, &(0..KEYS).collect::<Vec<_>>(), round, 100);
}

/// Writes the value of `round` of each of `keys`, `per_commit` keys per
/// transaction, then checkpoints.
pub fn put_round(db: &Db, t: &Tree, keys: &[u64], round: u64, per_commit: usize) {
    for chunk in keys.chunks(per_commit) {
        db.transaction(|tx| {
            for &i in chunk {
                tx.put(t, &key(i), &value(i, round))?;
            }
            Ok(())
        })
        .unwrap();
    }
    db.checkpoint().unwrap();
}

/// Log bytes and full images of five rounds of same-size updates (no
/// split, no allocation), each followed by a checkpoint, after a load;
/// every value read back, the database closed.
pub fn update_rounds_log(db: Db) -> (u64, u64) {
    let t = db.create_tree("t").unwrap();
    update_round(&db, &t, 0);
    let before = db.wal_stats().unwrap();
    for round in 1..6 {
        update_round(&db, &t, round);
    }
    let after = db.wal_stats().unwrap();
    for i in 0..KEYS {
        assert_eq!(t.get(&key(i)).unwrap(), Some(value(i, 5)), "key {i}");
    }
    db.close().unwrap();
    (after.bytes - before.bytes, after.images - before.images)
}

/// Commits of 20 updates each, a checkpoint every 10, until one fails
/// (the power was cut): the round each key's acknowledged value is of.
pub fn update_until_cut(db: &Db, t: &Tree) -> Vec<u64> {
    let mut acked: Vec<u64> = vec![0; KEYS as usize];
    let mut n = 0u64;
    for r in 1..200u64 {
        for c in 0..10u64 {
            n += 1;
            let keys: Vec<u64> = (0..20).map(|j| (n * 131 + j * 977) % KEYS).collect();
            let ok = db.transaction(|tx| {
                for &i in &keys {
                    tx.put(t, &key(i), &value(i, r * 10 + c))?;
                }
                Ok(())
            });
            if ok.is_err() {
                return acked;
            }
            for &i in &keys {
                acked[i as usize] = r * 10 + c;
            }
        }
        if db.checkpoint().is_err() {
            break;
        }
    }
    acked
}

/// Asserts that every key holds its acknowledged value, or one of the
/// commit in flight at the cut, and that `check` passes.
pub fn assert_acked(db: &Db, acked: &[u64], round: u64) {
    let t = db.tree("t").unwrap();
    for i in 0..KEYS {
        let got = t
            .get(&key(i))
            .unwrap_or_else(|e| panic!("round {round}, key {i}: {e}"))
            .expect("every key was loaded");
        let want = value(i, acked[i as usize]);
        // The commit in flight at the cut may or may not be there.
        let newer = (acked[i as usize] + 1..acked[i as usize] + 12).any(|r| got == value(i, r));
        assert!(
            got == want || newer,
            "round {round}, key {i}: an acknowledged commit lost"
        );
    }
    assert!(db.check().unwrap().is_ok(), "round {round}");
}
