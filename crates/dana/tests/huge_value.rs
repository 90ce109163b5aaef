//! A 1 GiB value with a 64 MiB log and a 256 MiB pool, across a crash.
//!
//! The value is four times the pool and sixteen times the log, so its bytes
//! can only reach the disk around both. The child (this test binary run
//! again, the ignored test below) writes one 1 GiB value with `Sync`
//! durability and says so when the write returns, then starts a second
//! one; the parent kills it with SIGKILL while that second value is being
//! written, reopens (recovery), and finds the first value whole (its
//! checksum verified and every page compared), the second either absent
//! or whole, and every page accounted for by `check` (the extents a
//! killed writer held are free again, not leaked).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dana::{Db, Durability, Options};

const GIB: usize = 1 << 30;
const DIR_VAR: &str = "DANA_HUGE_CHILD_DIR";

fn opts() -> Options {
    Options::default()
        .pool_bytes(256 << 20)
        .log_bytes(64 << 20)
        .durability(Durability::Sync)
}

/// The bytes of value `seed`: each 4 KiB page starts with the seed and
/// its page number, so a page written to the wrong place shows.
fn fill(buf: &mut [u8], seed: u64) {
    let mut page = page_of(seed, 0);
    for (n, chunk) in buf.chunks_mut(4096).enumerate() {
        page[8..16].copy_from_slice(&(n as u64).to_le_bytes());
        chunk.copy_from_slice(&page[..chunk.len()]);
    }
}

/// The page of `fill(_, seed)` at page number `n`.
fn page_of(seed: u64, n: usize) -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    for (i, b) in page.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ seed as u8;
    }
    page[..8].copy_from_slice(&seed.to_le_bytes());
    page[8..16].copy_from_slice(&(n as u64).to_le_bytes());
    page
}

fn assert_value(v: &[u8], seed: u64) {
    assert_eq!(v.len(), GIB, "value {seed} has the wrong length");
    for (n, chunk) in v.chunks(4096).enumerate() {
        assert!(
            chunk == page_of(seed, n).as_slice(),
            "page {n} of value {seed} differs"
        );
    }
}

/// The child: one 1 GiB value, durable, then a second until killed.
#[test]
#[ignore = "run by a_1_gib_value_survives_a_crash_with_a_small_log_and_pool as its child"]
fn huge_value_child() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let db = Db::open(&dir, opts()).unwrap();
    let t = db.tree_or_create("t").unwrap();
    let mut v = vec![0u8; GIB];
    fill(&mut v, 1);
    t.put(b"first", &v).unwrap();
    println!("first durable");
    fill(&mut v, 2);
    println!("second started");
    t.put(b"second", &v).unwrap();
    println!("second durable");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_1_gib_value_survives_a_crash_with_a_small_log_and_pool() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "huge_value::huge_value_child",
            "--nocapture",
        ])
        .env(DIR_VAR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let started = Instant::now();
    let mut first = false;
    for line in out.lines() {
        let Ok(line) = line else { break };
        if line == "first durable" {
            first = true;
        }
        if line == "second started" {
            // Into the second value's bytes (it takes about a second or
            // more on this disk), not after it.
            std::thread::sleep(Duration::from_millis(300));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the child took too long"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first, "the child never made the first value durable");

    let db = Db::open(dir.path(), opts()).unwrap();
    let t = db.tree("t").unwrap();
    assert_eq!(t.value_len(b"first").unwrap(), Some(GIB as u64));
    // `get` checks the whole value's checksum.
    assert_value(&t.get(b"first").unwrap().unwrap(), 1);
    // A byte range across an extent boundary, checked too.
    let mut buf = vec![0u8; 3 << 20];
    let at = (GIB / 2 - (1 << 20)) as u64;
    assert_eq!(t.read_value(b"first", at, &mut buf).unwrap(), Some(3 << 20));
    for (k, chunk) in buf.chunks(4096).enumerate() {
        assert!(chunk == page_of(1, at as usize / 4096 + k).as_slice());
    }
    let second = t.value_len(b"second").unwrap();
    eprintln!("the second value after the crash: {second:?} (None: killed mid-write)");
    match second {
        None => assert_eq!(db.pool().large_values(), 1),
        Some(n) => {
            assert_eq!(n, GIB as u64);
            assert_value(&t.get(b"second").unwrap().unwrap(), 2);
            assert_eq!(db.pool().large_values(), 2);
        }
    }
    // Every page has one owner: the extents the killed writer held are
    // free again, none is lost.
    let r = db.check().unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(r.lost_pages, 0);
    db.close().unwrap();
}
