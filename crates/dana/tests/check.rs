//! The checker (`dana::check`) on real files: a clean database with
//! several trees checks clean (before and after reopening); a flipped byte
//! in a leaf, swapped child pointers (fences disagree with the parent), a
//! child shared by two parents' slots, and a damaged free page are each
//! reported naming the right page.

use std::os::unix::fs::FileExt;
use std::path::Path;

use dana::btree::node::{Node, NodeMut};
use dana::buffer::page;
use dana::check::CATALOG_TREE;
use dana::{Db, Error, Options};

const PAGE: usize = 4096;

fn opts() -> Options {
    Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(64 << 20)
        .workers(2)
}

fn key(i: u32) -> Vec<u8> {
    format!("key/{i:08}").into_bytes()
}

/// Four trees of a few thousand keys, some deleted, one tree dropped.
fn build(dir: &Path) -> Db {
    let db = Db::open(dir, opts()).unwrap();
    for (t, n) in [
        ("alpha", 4000u32),
        ("beta", 2500),
        ("gamma", 3000),
        ("doomed", 2000),
    ] {
        let tree = db.create_tree(t).unwrap();
        for i in 0..n {
            tree.put(&key(i), &vec![b'v'; 40 + (i % 50) as usize])
                .unwrap();
        }
        for i in (0..n).step_by(3) {
            assert!(tree.delete(&key(i)).unwrap());
        }
    }
    assert!(db.drop_tree("doomed").unwrap());
    db
}

/// (page id, is leaf, children) of every page of tree `name`, parents first.
fn pages(db: &Db, name: &str) -> Vec<(u64, bool, Vec<u64>)> {
    let bt = db.tree(name).unwrap().unlogged_btree().clone();
    db.block_on(async move {
        let mut out = Vec::new();
        bt.walk(|pid, bytes| {
            let n = Node::new(bytes).unwrap();
            let mut kids: Vec<u64> = (0..n.len()).map(|i| n.child_at(i)).collect();
            if !n.is_leaf() {
                kids.push(n.upper_child());
            } else {
                kids.clear();
            }
            out.push((pid, n.is_leaf(), kids));
            Ok(())
        })
        .await
        .map(|_| out)
    })
    .unwrap()
    .unwrap()
}

/// Reads, edits and writes back page `pid` of the (closed) database.
fn edit_page(dir: &Path, pid: u64, f: impl FnOnce(&mut [u8])) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("dana.0"))
        .unwrap();
    let off = pid * PAGE as u64; // one device: Array::locate(pid) = (0, pid * page size)
    let mut buf = vec![0u8; PAGE];
    file.read_exact_at(&mut buf, off).unwrap();
    f(&mut buf);
    file.write_all_at(&buf, off).unwrap();
    file.sync_all().unwrap();
}

/// `drop_tree("alpha")` on another thread: its result, or a panic if it
/// takes a minute (a hang).
fn drop_alpha_or_hang(db: &Db) -> dana::Result<bool> {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = db.clone();
    std::thread::spawn(move || {
        let _ = tx.send(d.drop_tree("alpha"));
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the drop hung")
}

fn findings_text(r: &dana::check::CheckReport) -> String {
    r.findings
        .iter()
        .map(|f| format!("{f}\n"))
        .collect::<String>()
}

#[test]
fn clean_database_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let r = db.check().unwrap();
    assert!(r.is_ok(), "{}", findings_text(&r));
    let names: Vec<&str> = r.trees.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    let alpha = &r.trees[0];
    assert_eq!(alpha.entries, 4000 - 4000u64.div_ceil(3));
    assert!(alpha.height >= 2, "{alpha:?}");
    assert!(alpha.leaf_fill > 0.2 && alpha.leaf_fill <= 1.0, "{alpha:?}");
    assert!(alpha.inner_fill > 0.0, "{alpha:?}");
    assert_eq!(r.catalog.name, CATALOG_TREE);
    assert_eq!(r.catalog.entries, 3);
    assert!(r.free_pages > 0, "the dropped tree's pages are free");
    assert_eq!(r.free_pages, r.space.free_pages);
    assert_eq!(r.lost_pages, 0);
    let owned: u64 = r.trees.iter().map(|t| t.pages()).sum::<u64>() + r.catalog.pages();
    assert_eq!(owned, r.used_pages());
    db.close().unwrap();

    // Again from disk.
    let db = Db::open(dir.path(), opts()).unwrap();
    let r2 = db.check().unwrap();
    assert!(r2.is_ok(), "{}", findings_text(&r2));
    assert_eq!(r2.trees, r.trees);
    db.close().unwrap();
}

#[test]
fn flipped_byte_in_a_leaf_is_reported_on_that_page() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let leaf = pages(&db, "beta")
        .into_iter()
        .filter(|p| p.1)
        .nth(3)
        .unwrap()
        .0;
    assert_eq!(db.pool().array().locate(leaf), (0, leaf * PAGE as u64));
    db.close().unwrap();
    edit_page(dir.path(), leaf, |p| p[2000] ^= 0x40);

    let db = Db::open(dir.path(), opts()).unwrap();
    let r = db.check().unwrap();
    assert!(!r.is_ok());
    assert_eq!(r.findings.len(), 1, "{}", findings_text(&r));
    let f = &r.findings[0];
    assert_eq!(f.page, Some(leaf));
    assert_eq!(f.tree.as_deref(), Some("beta"));
    assert!(f.what.contains("checksum"), "{f}");
    assert!(f.to_string().contains(&format!("page {leaf}")), "{f}");
    // The other trees were still walked.
    assert_eq!(r.trees.len(), 3);
    assert!(r.trees[2].entries > 0);
    db.close().unwrap();
}

#[test]
fn swapped_children_are_reported_as_fence_mismatches() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let (root, leaf, kids) = pages(&db, "alpha").remove(0);
    assert!(!leaf && kids.len() >= 3, "alpha's root should be inner");
    let (c0, c1) = (kids[0], kids[1]);
    db.close().unwrap();
    edit_page(dir.path(), root, |p| {
        let mut n = NodeMut::new(p).unwrap();
        n.set_child_at(0, c1);
        n.set_child_at(1, c0);
        page::seal(p);
    });

    let db = Db::open(dir.path(), opts()).unwrap();
    let r = db.check().unwrap();
    let text = findings_text(&r);
    assert!(!r.is_ok());
    for c in [c0, c1] {
        assert!(
            r.findings.iter().any(|f| f.page == Some(c)
                && f.tree.as_deref() == Some("alpha")
                && f.what.contains("fence")),
            "no fence finding on page {c}:\n{text}"
        );
    }
    assert!(
        r.findings
            .iter()
            .all(|f| f.page == Some(c0) || f.page == Some(c1)),
        "{text}"
    );
    assert_eq!(r.lost_pages, 0);
    db.close().unwrap();
}

#[test]
fn shared_child_is_doubly_owned_and_the_replaced_one_lost() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let (root, _, kids) = pages(&db, "gamma").remove(0);
    let (c0, c1) = (kids[0], kids[1]);
    db.close().unwrap();
    edit_page(dir.path(), root, |p| {
        NodeMut::new(p).unwrap().set_child_at(1, c0);
        page::seal(p);
    });

    let db = Db::open(dir.path(), opts()).unwrap();
    let r = db.check().unwrap();
    let text = findings_text(&r);
    assert!(
        r.findings
            .iter()
            .any(|f| f.page == Some(c0) && f.what.contains("second time")),
        "{text}"
    );
    assert!(r.lost_pages >= 1, "{text}");
    assert!(
        r.findings
            .iter()
            .any(|f| f.page.is_some_and(|p| p <= c1) && f.what.contains("lost")),
        "{text}"
    );
    db.close().unwrap();
}

/// Bits flipped in the free-space map: a page of a tree marked free and
/// a free page marked used are both reported, by page.
#[test]
fn damaged_space_map_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let before = db.check().unwrap();
    let free = db.block_on({
        let pool = db.pool().clone();
        async move {
            let s = pool.space().await?;
            let mut free = Vec::new();
            for (_, bits) in pool.space_map(s.next_unused).await {
                let bits = bits?;
                free.extend((0..bits.len() as u64).filter(|&p| !bits[p as usize]));
            }
            Ok::<_, dana::Error>(free)
        }
    });
    let free = free.unwrap().unwrap();
    assert!(free.len() > 2, "the dropped tree's pages are free");
    let (victim_free, victim_owned) = (free[1], before.trees[0].root);
    db.close().unwrap();
    edit_page(dir.path(), 1, |p| {
        for pid in [victim_free, victim_owned] {
            let at = page::PAGE_HEADER_SIZE + (pid / 8) as usize;
            p[at] ^= 1 << (pid % 8);
        }
        page::seal(p);
    });

    let db = Db::open(dir.path(), opts().read_only()).unwrap();
    let r = db.check().unwrap();
    let text = findings_text(&r);
    assert!(
        r.findings
            .iter()
            .any(|f| f.page == Some(victim_owned) && f.what.contains("marked free")),
        "{text}"
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.page == Some(victim_free) && f.what.contains("lost")),
        "{text}"
    );
    assert_eq!(r.lost_pages, 1, "{text}");
    db.close().unwrap();
}

/// A map page that fails its checksum: a writable open refuses with an
/// error naming it (it would hand out pages blindly), a read-only open
/// still reads every tree, and `check` names the page.
#[test]
fn unreadable_space_map_page_keeps_data_readable() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let before = db.check().unwrap();
    db.close().unwrap();
    edit_page(dir.path(), 1, |p| p[100] ^= 0xFF);

    match Db::open(dir.path(), opts()) {
        Err(dana::Error::Corrupt { page: 1, .. }) => {}
        Err(e) => panic!("expected Corrupt {{ page: 1 }}, got {e}"),
        Ok(_) => panic!("a writable open with a damaged map must fail"),
    }
    let db = Db::open(dir.path(), opts().read_only()).unwrap();
    let r = db.check().unwrap();
    let text = findings_text(&r);
    assert!(r.findings.iter().any(|f| f.page == Some(1)), "{text}");
    assert_eq!(r.lost_pages, 0, "{text}");
    for (a, b) in r.trees.iter().zip(&before.trees) {
        assert_eq!(a.entries, b.entries, "{}", a.name);
    }
    db.close().unwrap();
}

/// Random bytes of random node pages rewritten (and the checksum fixed, so
/// the damage reaches the node checks): the checker never panics or hangs,
/// and what it reports names a page.
#[test]
fn random_node_damage_never_panics() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let mut all: Vec<u64> = ["alpha", "beta", "gamma"]
        .iter()
        .flat_map(|t| pages(&db, t).into_iter().map(|p| p.0))
        .collect();
    all.push(1); // the catalogue root
    db.close().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut found = 0;
    for _ in 0..40 {
        let pid = all[rng.gen_range(0..all.len())];
        let mut saved = Vec::new();
        edit_page(dir.path(), pid, |p| {
            saved = p.to_vec();
            for _ in 0..rng.gen_range(1..4) {
                // Mostly the node header and slots, where damage matters.
                let at = if rng.gen_bool(0.7) {
                    rng.gen_range(32..160)
                } else {
                    rng.gen_range(32..PAGE)
                };
                p[at] = rng.gen();
            }
            page::seal(p);
        });
        let db = Db::open(dir.path(), opts()).unwrap();
        let r = db.check().unwrap();
        db.close().unwrap();
        if !r.is_ok() {
            found += 1;
            assert!(
                r.findings.iter().all(|f| f.page.is_some()),
                "{}",
                findings_text(&r)
            );
        }
        edit_page(dir.path(), pid, |p| p.copy_from_slice(&saved));
    }
    assert!(found > 10, "only {found} of 40 damaged pages were noticed");
}

/// The empty key with an empty value (an entry of no bytes) in a leaf
/// whose neighbouring entries come and go: the database checks clean
/// and the entry reads back (the first node code left such an entry below
/// the heap after a removal, and `check` called the leaf corrupt).
#[test]
fn the_empty_key_with_an_empty_value_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"a", &[1; 70]).unwrap();
    t.put(b"", b"").unwrap();
    // The entry just above the empty one in the heap goes.
    t.delete(b"a").unwrap();
    let report = db.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.findings);
    for round in 0..3u8 {
        for k in [b"a".as_slice(), b"b", b"\x00", b"c"] {
            t.put(k, &vec![round; 10 + 30 * round as usize]).unwrap();
        }
        t.delete(b"a").unwrap();
        t.delete(b"\x00").unwrap();
        let report = db.check().unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.findings);
    }
    assert_eq!(t.get(b"").unwrap().as_deref(), Some(&b""[..]));
    db.close().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    assert!(db.check().unwrap().is_ok());
    assert_eq!(
        db.tree("t").unwrap().get(b"").unwrap().as_deref(),
        Some(&b""[..])
    );
    db.close().unwrap();
}

/// A byte flipped in a large value's pages (which carry no page header)
/// is a finding that names the leaf holding its reference: the check
/// reads every large value against its checksum (the first version only
/// accounted for their pages; `get` found the damage, `check` did not).
#[test]
fn a_damaged_large_value_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    let value: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    t.put(b"big", &value).unwrap();
    t.put(b"other", &vec![1u8; 9000]).unwrap();
    assert!(db.check().unwrap().is_ok());
    db.close().unwrap();
    let path = dir.path().join("dana.0");
    let bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &value[4096..4160])
        .expect("the value's second page on disk");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[bytes[at + 10] ^ 0xff], (at + 10) as u64)
        .unwrap();
    f.sync_all().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let report = db.check().unwrap();
    let bad: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.what.contains("large value"))
        .collect();
    assert_eq!(bad.len(), 1, "{:?}", report.findings);
    assert_eq!(bad[0].tree.as_deref(), Some("t"));
    assert!(matches!(
        db.tree("t").unwrap().get(b"big"),
        Err(Error::Corrupt { .. })
    ));
    assert_eq!(
        db.tree("t").unwrap().get(b"other").unwrap(),
        Some(vec![1u8; 9000])
    );
    db.close().unwrap();
}

/// A merge whose free of the left page fails (its free-space map page
/// cannot be read) changes no page: before, the right page and the parent
/// had taken the left page's range when the free failed, and the left page
/// stayed used in no tree (lost), with the merge logged as two records (a
/// review's finding).
#[test]
fn a_merge_that_cannot_read_the_free_space_map_changes_nothing() {
    use dana::io::sim::Fault;
    use dana::OpKind;
    let rig = crate::sim_rig::Rig::new(5, 8 << 20, 4 << 20);
    let opts = Options::default().pool_bytes(64 * 4096).log_bytes(4 << 20);
    let db = rig.open(opts.clone(), true).unwrap();
    let t = db.create_tree("t").unwrap();
    for i in 0..2000 {
        t.put(&key(i), &[7u8; 200]).unwrap();
    }
    db.close().unwrap();
    let db = rig.open(opts, false).unwrap();
    let t = db.tree("t").unwrap();
    // Every leaf read once: the map page is evicted from 64 frames.
    assert_eq!(t.iter().count(), 2000);
    // The free-space map page of the first group (page 1) reads fail.
    rig.data
        .inject(Fault::range(Some(OpKind::Read), 4096..8192).sticky());
    for i in 0..30 {
        assert!(t.delete(&key(i)).unwrap());
    }
    rig.data.clear_faults();
    let report = db.check().unwrap();
    assert!(
        report.is_ok() && report.lost_pages == 0,
        "{} lost pages, findings {:?}",
        report.lost_pages,
        report.findings
    );
    assert_eq!(t.iter().count(), 1970);
    db.close().unwrap();
}

/// A leaf forged with a valid checksum (its prefix length one more than
/// its fences share; the header check alone passes it) fails a write into
/// it with `Corrupt` naming the leaf: the write path checks a node whole
/// once it arrives (a review's finding: the insert asserted and the
/// worker's task panicked). Opens then refuse naming the leaf.
#[test]
fn a_forged_leaf_fails_a_write_with_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let (_, leaf, kids) = pages(&db, "alpha").remove(0);
    assert!(!leaf && kids.len() >= 3, "alpha's root should be inner");
    let target = kids[1];
    db.close().unwrap();
    let mut inside = Vec::new();
    edit_page(dir.path(), target, |p| {
        let n = Node::new(p).unwrap();
        inside = n.lower_fence().unwrap().to_vec();
        inside.push(0);
        let prefix = n.prefix_len() as u16 + 1;
        // The node header's prefix length (`btree/node.rs`: H_PREFIX, 16
        // bytes into the node region after the page header).
        let at = page::PAGE_HEADER_SIZE + 16;
        p[at..at + 2].copy_from_slice(&prefix.to_le_bytes());
        page::seal(p);
    });
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("alpha").unwrap();
    match t.put(&inside, b"x") {
        Err(Error::Corrupt { page, .. }) => assert_eq!(page, target),
        other => panic!("{other:?}"),
    }
    // The commit was logged before its apply met the leaf: the database
    // stops (the log and the pages must not disagree), with a clear error.
    match db.tree("beta").unwrap().put(b"after", b"ok") {
        Err(Error::Poisoned(m)) => assert!(m.contains(&format!("page {target}")), "{m}"),
        other => panic!("{other:?}"),
    }
    drop((t, db));
    // Each open redoes the commit into the leaf: refused, naming it.
    match Db::open(dir.path(), opts()) {
        Err(Error::Corrupt { page, .. }) => assert_eq!(page, target),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A read-only open cannot redo it.
    assert!(matches!(
        Db::open(dir.path(), opts().read_only()),
        Err(Error::NeedsRecovery(_))
    ));
}

/// An inner node naming itself as a leaf's right sibling: a delete that
/// empties the leaf tries to merge it and must not wait for the latch it
/// holds (a review's finding: it hung with the structure guard held).
#[test]
fn a_parent_naming_itself_as_a_sibling_does_not_hang_a_merge() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let (root, leaf, kids) = pages(&db, "gamma").remove(0);
    assert!(!leaf && kids.len() >= 3, "gamma's root should be inner");
    let first = kids[0];
    let bt = db.tree("gamma").unwrap().unlogged_btree().clone();
    let keys = db
        .block_on(async move {
            let mut keys = Vec::new();
            bt.walk(|pid, bytes| {
                if pid == first {
                    let n = Node::new(bytes).unwrap();
                    keys = (0..n.len()).map(|i| n.key_vec_at(i)).collect();
                }
                Ok(())
            })
            .await
            .map(|_| keys)
        })
        .unwrap()
        .unwrap();
    assert!(!keys.is_empty());
    db.close().unwrap();
    edit_page(dir.path(), root, |p| {
        NodeMut::new(p).unwrap().set_child_at(1, root);
        page::seal(p);
    });
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("gamma").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for k in &keys {
            let _ = t.delete(k);
        }
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the deletes hung");
    db.close().unwrap();
}

/// A large value's reference forged to name pages past the array (a
/// valid checksum on its leaf) is `Corrupt` on `get`, before a buffer of
/// the value's length is taken (a review's finding: up to 4 GiB for a
/// forged length).
#[test]
fn a_reference_past_the_array_is_corrupt_before_its_buffer() {
    let (_dir, db) = forged_reference(|r| r.extents[0].start = 1 << 30);
    match db.tree("t").unwrap().get(b"big") {
        Err(Error::Corrupt { page, what }) => {
            assert_eq!(page, 1 << 30);
            assert!(what.contains("past the array"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    db.close().unwrap();
}

/// A database whose one large value (3 pages, key `big` of tree `t`)
/// has a reference changed by `forge`, its leaf sealed again, reopened.
fn forged_reference(forge: impl Fn(&mut dana::buffer::blob::BlobRef)) -> (tempfile::TempDir, Db) {
    use dana::buffer::blob::BlobRef;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.create_tree("t").unwrap();
    t.put(b"big", &vec![9u8; 3 * PAGE]).unwrap();
    let leaf = pages(&db, "t")[0].0;
    db.close().unwrap();
    edit_page(dir.path(), leaf, |p| {
        let n = Node::new(p).unwrap();
        let i = (0..n.len()).find(|&i| n.is_ref_at(i)).unwrap();
        let mut r = BlobRef::decode(n.payload_at(i), PAGE).unwrap();
        forge(&mut r);
        let mut m = NodeMut::new(p).unwrap();
        m.update_at(i, &r.encode()).unwrap();
        m.set_ref_at(i, true);
        page::seal(p);
    });
    let db = Db::open(dir.path(), opts()).unwrap();
    (dir, db)
}

/// The same reference read in parts (`Tree::read_value`): `Corrupt`
/// too. It read on unchecked: a start near 2^60 pages overflowed where
/// pages are located (a panic in debug builds), one that wrapped read
/// another page's bytes as the value's, `Ok` (a review's finding).
#[test]
fn a_reference_past_the_array_is_corrupt_when_read_in_parts() {
    for start in [1u64 << 30, 1 << 60, u64::MAX - 1] {
        let (_dir, db) = forged_reference(|r| {
            r.extents = vec![dana::buffer::blob::Extent { start, pages: 1 }];
            r.len = PAGE as u64;
        });
        let t = db.tree("t").unwrap();
        let mut buf = vec![0u8; 100];
        match t.read_value(b"big", 10, &mut buf) {
            Err(Error::Corrupt { page, what }) => {
                assert_eq!(page, start);
                assert!(what.contains("past the array"), "{what}");
            }
            other => panic!("start {start}: {other:?}"),
        }
        db.close().unwrap();
    }
}

/// An inner node naming itself as its first child: dropping its tree
/// fails with `Corrupt` instead of waiting for the latch the drop holds
/// (a review's finding: it hung, holding the space guard, and every open
/// resumed the drop). The database answers after it.
#[test]
fn a_drop_of_a_tree_whose_inner_node_names_itself_is_corrupt_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let (root, leaf, _) = pages(&db, "alpha").remove(0);
    assert!(!leaf, "alpha's root should be inner");
    db.close().unwrap();
    edit_page(dir.path(), root, |p| {
        NodeMut::new(p).unwrap().set_child_at(0, root);
        page::seal(p);
    });
    let db = Db::open(dir.path(), opts()).unwrap();
    match drop_alpha_or_hang(&db) {
        Err(Error::Corrupt { page, .. }) => assert_eq!(page, root),
        other => panic!("{other:?}"),
    }
    assert!(db.tree("beta").unwrap().get(&key(1)).unwrap().is_some());
}

/// A tree naming a sound leaf past the high-water mark (its map bit set
/// too: damage or forgery with valid checksums) fails its drop with
/// `Corrupt` naming that page; the in-memory free-space map never holds
/// pages past the mark, and freeing one asserted there.
#[test]
fn a_drop_freeing_a_page_past_the_high_water_mark_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let db = build(dir.path());
    let tree = pages(&db, "alpha");
    let (root, _, kids) = tree[0].clone();
    let leaf = kids[0];
    assert!(tree.iter().any(|(p, l, _)| *p == leaf && *l), "{leaf}");
    db.close().unwrap();
    let file = std::fs::File::open(dir.path().join("dana.0")).unwrap();
    let mut meta = vec![0u8; PAGE];
    file.read_exact_at(&mut meta, 0).unwrap();
    // Meta page bytes 56..64: the high-water mark (docs/FORMAT.md).
    let mark = u64::from_le_bytes(meta[56..64].try_into().unwrap());
    let past = mark + 3;
    assert!(past < file.metadata().unwrap().len() / PAGE as u64 && past < 32_512);
    let mut copy = vec![0u8; PAGE];
    file.read_exact_at(&mut copy, leaf * PAGE as u64).unwrap();
    copy[16..24].copy_from_slice(&past.to_le_bytes());
    page::seal(&mut copy);
    edit_page(dir.path(), past, |p| p.copy_from_slice(&copy));
    // Its bit in group 0's map page (page 1; bit i of body byte i / 8).
    edit_page(dir.path(), 1, |p| {
        p[32 + (past / 8) as usize] |= 1 << (past % 8);
        page::seal(p);
    });
    edit_page(dir.path(), root, |p| {
        NodeMut::new(p).unwrap().set_child_at(0, past);
        page::seal(p);
    });
    let db = Db::open(dir.path(), opts()).unwrap();
    match drop_alpha_or_hang(&db) {
        Err(Error::Corrupt { page, what }) => {
            assert_eq!(page, past, "{what}");
            assert!(what.contains("high-water"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(db.tree("beta").unwrap().get(&key(1)).unwrap().is_some());
}
