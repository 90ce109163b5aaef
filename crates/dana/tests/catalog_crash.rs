//! Power cuts during `create_tree` and `drop_tree`: after recovery the
//! checker finds every page owned (no lost pages), the trees the
//! catalogue names are whole, and a stale handle of a dropped tree fails
//! instead of writing into pages that now belong to someone else.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::sim_rig;

use dana::{Db, Durability, Error, Options};
use sim_rig::Rig;

const LOG: u64 = 1 << 20;

fn opts() -> Options {
    Options::default()
        .log_identity(0xca7a)
        .pool_bytes(48 * 4096)
        .workers(1)
        .log_bytes(LOG)
        .durability(Durability::Sync)
        .async_window(Duration::from_secs(3600))
}

/// The simulated disks of one run.
fn rig(seed: u64) -> Rig {
    Rig::new(seed, 8 << 20, LOG)
}

fn fill(db: &Db, name: &str, n: u32, done: &Cell<u32>) -> dana::Result<()> {
    let t = db.tree_or_create(name)?;
    for i in 0..n {
        t.put(&key(name, i), &value(i))?;
        done.set(done.get() + 1);
    }
    Ok(())
}

/// Every eighth value is large (stored in extents of its own, freed by a
/// drop one value per log group).
fn value(i: u32) -> Vec<u8> {
    vec![i as u8; if i % 8 == 0 { 6000 } else { 300 }]
}

fn key(name: &str, i: u32) -> Vec<u8> {
    format!("{name}-{i:05}").into_bytes()
}

/// Operations of the cut workload, in order: create "a" (0), 120 puts
/// into "b" (1..=120), drop "old" (121), drop "a" (122), create "c"
/// (123), drop "b" (124).
const OPS: u32 = 125;

/// The trees and their entry counts after the first `k` operations.
fn expected(k: u32) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    m.insert("keep".to_string(), 50);
    if k <= 121 {
        m.insert("old".to_string(), 120);
    }
    if k > 0 && k <= 122 {
        m.insert("a".to_string(), 0);
    }
    if k > 1 && k <= 124 {
        m.insert("b".to_string(), (k - 1).min(120));
    }
    if k > 123 {
        m.insert("c".to_string(), 0);
    }
    m
}

/// The workload cut at request `point` (0: never). Returns the number of
/// requests it made. Every operation acknowledged (Sync) must be there
/// after the reopen, and at most the one after it: the catalogue and the
/// trees are those of the first `done` or `done + 1` operations, every
/// entry byte for byte.
fn run(seed: u64, point: u64) -> u64 {
    let rig = rig(seed);
    let none = Cell::new(0);
    {
        let db = rig.open(opts(), true).unwrap();
        fill(&db, "keep", 50, &none).unwrap();
        fill(&db, "old", 120, &none).unwrap();
        db.close().unwrap();
    }
    let done = Cell::new(0u32);
    let ios = rig.cut_during(point, seed, || {
        let db = rig.open(opts(), false)?;
        let step = |r: dana::Result<()>| {
            r?;
            done.set(done.get() + 1);
            Ok::<_, Error>(())
        };
        step(db.create_tree("a").map(|_| ()))?;
        fill(&db, "b", 120, &done)?;
        step(db.drop_tree("old").map(|_| ()))?;
        step(db.drop_tree("a").map(|_| ()))?;
        step(db.create_tree("c").map(|_| ()))?;
        step(db.drop_tree("b").map(|_| ()))?;
        Ok(())
    });
    let d = done.get();
    assert!(d <= OPS);
    let db = rig.reopen_checked(opts(), point);
    let mut found = BTreeMap::new();
    for name in db.tree_names().unwrap() {
        let t = db.tree(&name).unwrap();
        let entries: Vec<(Vec<u8>, Vec<u8>)> = t.iter().collect::<Result<_, _>>().unwrap();
        for (i, (k, v)) in entries.iter().enumerate() {
            assert_eq!(
                (k, v),
                (&key(&name, i as u32), &value(i as u32)),
                "point {point}: tree {name}, entry {i}"
            );
        }
        found.insert(name, entries.len() as u32);
    }
    // The tree "b" is created before its first put: it may be there empty
    // when that put is the one in doubt.
    let mut b_empty = expected(d.min(1));
    b_empty.insert("b".to_string(), 0);
    assert!(
        found == expected(d) || found == expected(d + 1) || (d <= 1 && found == b_empty),
        "point {point}: {d} operations acknowledged, found {found:?}"
    );
    db.close().unwrap();
    ios
}

#[test]
fn a_crash_during_create_or_drop_leaks_no_page() {
    let seed = 7;
    let total = run(seed, 0);
    assert!(total > 50, "the workload made only {total} requests");
    let points = std::env::var("DANA_CATALOG_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60u64);
    for i in 1..=points {
        run(seed + i, 1 + (total - 1) * i / points);
    }
}

#[test]
fn a_dropped_trees_stale_handle_fails_and_never_writes_elsewhere() {
    let rig = rig(3);
    let db = rig.open(opts(), true).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"k", b"v").unwrap();
    assert!(db.drop_tree("t").unwrap());
    // The freed root must not become the root of the next tree.
    let u = db.create_tree("u").unwrap();
    assert!(matches!(t.put(b"k2", b"v"), Err(Error::NoSuchTree(_))));
    assert!(matches!(t.get(b"k"), Err(Error::NoSuchTree(_))));
    // The error names the handle's tree (it named its root page; an
    // outside probe).
    let said = t.get(b"k").unwrap_err().to_string();
    assert_eq!(said, r#"no tree named "t (dropped; this handle is stale)""#);
    let mut tx = db.begin();
    tx.put(&t, b"k3", b"v").unwrap();
    assert!(matches!(db.commit(tx), Err(Error::NoSuchTree(_))));
    assert_eq!(
        u.count(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded)
            .unwrap(),
        0
    );
    let r = db.check().unwrap();
    assert!(r.is_ok() && r.lost_pages == 0, "{r:?}");
    db.close().unwrap();
}

/// Reads through a dropped tree's stale handle: every read path answers
/// `NoSuchTree`, also once the dropped tree's pages hold another tree's
/// leaves (an outside probe found `scan` returning the other tree's rows
/// and `get_many`, iterators and cursors reading its pages).
#[test]
fn reads_through_a_dropped_trees_stale_handle_never_see_another_tree() {
    use std::ops::Bound::Unbounded;
    let rig = rig(4);
    let db = rig.open(opts(), true).unwrap();
    let t = db.create_tree("victim").unwrap();
    let key = |i: u32| format!("k{i:08}").into_bytes();
    for i in 0..1500 {
        t.put(&key(i), b"VICTIM").unwrap();
    }
    // Opened before the drop: an iterator with one leaf buffered, a cursor.
    let mut it = t.iter();
    assert!(it.next().unwrap().is_ok());
    let mut cursor = t.cursor(Unbounded, Unbounded, true).unwrap();
    assert!(db.drop_tree("victim").unwrap());
    // Another tree takes the freed pages (same keys, other values).
    let o = db.create_tree("other").unwrap();
    for i in 0..6000 {
        o.put(&key(i), b"OTHER").unwrap();
    }
    let no_tree = |r: &dana::Result<_>| matches!(r, Err(Error::NoSuchTree(_)));
    assert!(no_tree(&t.scan(Unbounded, Unbounded, true, 3).map(|_| ())));
    assert!(no_tree(&t.scan(Unbounded, Unbounded, false, 3).map(|_| ())));
    // With no entry asked for too (it read no leaf and answered `Ok`).
    assert!(no_tree(&t.scan(Unbounded, Unbounded, true, 0).map(|_| ())));
    assert!(no_tree(&t.get_many(&[key(1)]).map(|_| ())));
    assert!(no_tree(&t.count(Unbounded, Unbounded).map(|_| ())));
    assert!(no_tree(&t.cursor(Unbounded, Unbounded, true).map(|_| ())));
    let first = t.iter().next().unwrap();
    assert!(no_tree(&first.map(|_| ())), "a new iterator");
    // The old iterator ends with the error, whatever it had buffered.
    let rest: Vec<_> = it.by_ref().collect();
    assert!(
        rest.iter().all(|r| matches!(r, Err(Error::NoSuchTree(_)))),
        "the old iterator returned entries after the drop"
    );
    assert_eq!(rest.len(), 1);
    let next = db.block_on(async move { cursor.next().await }).unwrap();
    assert!(no_tree(&next.map(|_| ())), "the old cursor");
    // The other tree is whole.
    assert_eq!(o.count(Unbounded, Unbounded).unwrap(), 6000);
    assert_eq!(o.get(&key(1)).unwrap().as_deref(), Some(&b"OTHER"[..]));
    let r = db.check().unwrap();
    assert!(r.is_ok() && r.lost_pages == 0, "{r:?}");
    db.close().unwrap();
}

/// A loop of creates and drops of a small tree, nothing else allocating:
/// each create passed over every root dropped before by allocating it,
/// latching it and freeing it again in its log group, one page more per
/// create, until the group outgrew the log's record limit (~32 page
/// images with a 1 MiB log) and the database stopped.
#[test]
fn creating_and_dropping_trees_in_a_loop_stays_cheap() {
    let rig = rig(5);
    let db = rig.open(opts(), true).unwrap();
    fill(&db, "keep", 50, &Cell::new(0)).unwrap();
    for i in 0..100 {
        let t = db
            .create_tree("tmp")
            .unwrap_or_else(|e| panic!("create {i}: {e}"));
        t.put(b"k", b"v").unwrap();
        assert!(db.drop_tree("tmp").unwrap());
    }
    let r = db.check().unwrap();
    assert!(r.is_ok() && r.lost_pages == 0, "{r:?}");
    db.close().unwrap();
}

/// The roots of trees dropped since open are passed over by the next
/// roots. When they were all the free pages, a create found no page and
/// failed with `NoSpace` without growing the file (an outside probe:
/// after ~250 creates and drops in one session, 1 MiB file). The array
/// grows for it now.
#[test]
fn creates_passing_over_every_free_page_grow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options::default().pool_bytes(4 << 20).log_bytes(8 << 20);
    let db = Db::open(dir.path(), o.durability(Durability::Off)).unwrap();
    let before = db.pool().array().pages();
    for i in 0..(before as u32 + 20) {
        let t = db
            .create_tree("d")
            .unwrap_or_else(|e| panic!("create {i}: {e}"));
        t.put(b"k", b"v").unwrap();
        assert!(db.drop_tree("d").unwrap());
    }
    assert!(db.pool().array().pages() > before);
    let r = db.check().unwrap();
    assert!(r.is_ok() && r.lost_pages == 0, "{r:?}");
    db.close().unwrap();
}

/// A drop asked for by a thread that holds a read of the database itself
/// (inside `Tree::update`'s closure) fails at once and changes nothing: it waited a minute for that read,
/// its own, then failed with the tree already gone from the catalogue (an
/// outside probe's finding). Another thread's drop still works.
#[test]
fn a_drop_from_inside_a_read_of_the_same_thread_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    let u = db.create_tree("u").unwrap();
    for i in 0u32..2_000 {
        t.put(&i.to_be_bytes(), &[1; 100]).unwrap();
    }
    u.put(b"k", b"v").unwrap();
    let started = std::time::Instant::now();
    let inner = db.clone();
    let updated = t
        .update(&0u32.to_be_bytes(), move |old| {
            let refused = inner.drop_tree("u");
            assert!(
                matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("holds a read")),
                "{refused:?}"
            );
            old.to_vec()
        })
        .unwrap();
    assert!(updated);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the drop waited"
    );
    assert_eq!(
        db.tree("u").unwrap().get(b"k").unwrap(),
        Some(b"v".to_vec())
    );
    // An iterator holds no read between its items: a drop between them
    // goes ahead.
    let mut it = t.iter();
    assert!(it.next().is_some());
    assert!(db.drop_tree("u").unwrap());
    assert!(it.next().is_some());
    drop(it);
    db.close().unwrap();
}
