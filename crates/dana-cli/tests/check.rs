//! Runs the built `dana check` and `dana inspect` on a clean temporary
//! database (exit 0) and on one with a flipped byte in a leaf (exit
//! non-zero, the page id in the output).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

use dana::btree::node::Node;
use dana::{Db, Options};
use serde_json::Value;

fn dana(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dana"))
        .args(args)
        .arg("--path")
        .arg(dir)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A database with two trees; returns a leaf page id of tree "t1".
fn build(dir: &Path) -> u64 {
    let opts = Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(32 << 20);
    let db = Db::open(dir, opts).unwrap();
    for name in ["t1", "t2"] {
        let t = db.create_tree(name).unwrap();
        for i in 0u32..3000 {
            t.put(format!("k{i:06}").as_bytes(), &[7u8; 60]).unwrap();
        }
    }
    let bt = db.tree("t1").unwrap().unlogged_btree().clone();
    let leaves = db
        .block_on(async move {
            let mut leaves = Vec::new();
            bt.walk(|pid, bytes| {
                if Node::new(bytes).unwrap().is_leaf() {
                    leaves.push(pid);
                }
                Ok(())
            })
            .await
            .map(|_| leaves)
        })
        .unwrap()
        .unwrap();
    db.close().unwrap();
    leaves[leaves.len() / 2]
}

#[test]
fn check_and_inspect_a_clean_then_a_damaged_database() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = build(dir.path());

    let out = dana(&["check"], dir.path());
    assert!(out.status.success(), "check failed: {}", text(&out));

    let out = dana(&["inspect"], dir.path());
    assert!(out.status.success(), "inspect failed: {}", text(&out));
    let s = text(&out);
    println!("{s}");
    assert!(
        s.contains("t1") && s.contains("t2") && s.contains("free pages"),
        "{s}"
    );

    let out = dana(&["inspect", "--json"], dir.path());
    assert!(out.status.success(), "{}", text(&out));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ok"], Value::Bool(true));
    assert_eq!(j["trees"][0]["name"], "t1");
    assert_eq!(j["trees"][0]["entries"].as_u64(), Some(3000));
    assert!(j["trees"][0]["height"].as_u64().unwrap() >= 2);

    // Flip a byte in the middle of the leaf (one device, 4 KiB pages).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("dana.0"))
        .unwrap();
    let mut b = [0u8; 1];
    let off = leaf * 4096 + 2000;
    file.read_exact_at(&mut b, off).unwrap();
    file.write_all_at(&[b[0] ^ 0x10], off).unwrap();
    file.sync_all().unwrap();
    drop(file);

    let out = dana(&["check"], dir.path());
    let s = text(&out);
    println!("{s}");
    assert_eq!(out.status.code(), Some(1), "{s}");
    assert!(s.contains(&format!("page {leaf} ")), "{s}");

    let out = dana(&["check", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ok"], Value::Bool(false));
    assert_eq!(j["findings"][0]["page"].as_u64(), Some(leaf));
    assert_eq!(j["findings"][0]["tree"], "t1");
}

#[test]
fn check_refuses_a_directory_without_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = dana(&["check"], dir.path());
    assert!(!out.status.success());
    assert!(text(&out).contains("not a dana database"), "{}", text(&out));
    assert!(
        !dir.path().join("dana.0").exists(),
        "check created a database"
    );
}

/// Another process: `dana check` (a shared lock) is refused while this
/// process holds the database open for writing, changes nothing, and runs
/// once it is closed; a database left needing recovery is reported as such.
#[test]
fn check_is_locked_out_by_a_writer_in_another_process_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(32 << 20)
        .logs(2);
    let db = Db::open(dir.path(), opts.clone()).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    let o = dana(&["check"], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("locked"), "{}", text(&o));
    // Copy the files while open: a crashed database that needs recovery.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for f in ["dana.0", "dana.wal", "dana.wal.1"] {
        std::fs::copy(dir.path().join(f), copy.join(f)).unwrap();
    }
    db.close().unwrap();
    let o = dana(&["check"], &copy);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("needs recovery"), "{}", text(&o));
    let before: Vec<Vec<u8>> = ["dana.0", "dana.wal", "dana.wal.1"]
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    let o = dana(&["check"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let after: Vec<Vec<u8>> = ["dana.0", "dana.wal", "dana.wal.1"]
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    assert!(before == after, "dana check wrote to the database");
    // And a writer in this process is refused while `dana check` could
    // run: a read-only open here excludes writers too.
    let ro = Db::open(dir.path(), opts.clone().read_only()).unwrap();
    assert!(matches!(
        Db::open(dir.path(), opts),
        Err(dana::Error::Locked { .. })
    ));
    drop(ro);
}

/// Databases of another page size, in place and out of place: `dana
/// check` without `--page-size` says the size the files hold (out of
/// place it failed with "misaligned out-of-place request"), and with it
/// checks them (an outside probe: such databases could not be checked).
#[test]
fn check_takes_the_page_size_of_a_database_of_another() {
    for out_of_place in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = Options::default()
            .pool_bytes(4 << 20)
            .page_size(16384)
            .capacity_bytes(64 << 20);
        if out_of_place {
            opts = opts.write_mode(dana::WriteMode::OutOfPlace);
        }
        let db = Db::open(dir.path(), opts).unwrap();
        let t = db.create_tree("t").unwrap();
        for i in 0u32..2000 {
            t.put(format!("k{i:06}").as_bytes(), &[7u8; 60]).unwrap();
        }
        db.close().unwrap();
        let refused = dana(&["check"], dir.path());
        assert!(!refused.status.success());
        let said = text(&refused);
        assert!(
            said.contains("16384-byte pages") && said.contains("page_size"),
            "out of place {out_of_place}: {said}"
        );
        let checked = dana(&["check", "--page-size", "16384"], dir.path());
        assert!(
            checked.status.success(),
            "out of place {out_of_place}: {}",
            text(&checked)
        );
    }
}

/// A database whose log is elsewhere (`Options::log_path`): `dana check`
/// and `dana inspect` take `--log-path` (without it they could not open
/// it: "dana.wal is missing", an outside probe).
#[test]
fn check_takes_the_log_path_of_a_database_with_its_log_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (db_dir, log) = (dir.path().join("db"), dir.path().join("elsewhere.wal"));
    let opts = Options::default()
        .pool_bytes(4 << 20)
        .capacity_bytes(64 << 20)
        .log_path(&log);
    let db = Db::open(&db_dir, opts).unwrap();
    db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    db.close().unwrap();
    assert!(!dana(&["check"], &db_dir).status.success());
    let log = log.to_str().unwrap();
    for cmd in ["check", "inspect"] {
        let out = dana(&[cmd, "--log-path", log], &db_dir);
        assert!(out.status.success(), "{cmd}: {}", text(&out));
    }
}
