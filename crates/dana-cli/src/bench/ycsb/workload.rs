//! The YCSB core workloads A-F as operation mixes, independent of any
//! engine: a per-task [`OpGen`] yields [`Op`]s over key numbers, and the
//! helpers here turn key numbers into key and value bytes. dana's runner
//! executes the ops as async tasks; a peer engine's runner (plain threads
//! calling `PeerEngine`) will execute the same ops.
//!
//! Owns: the mixes, the request distributions, the key and value layout.
//! Never: touches an engine.

use std::sync::Arc;

use clap::ValueEnum;
use serde::Serialize;

use super::gen::{Counter, Latest, ScrambledZipfian, Uniform};
use crate::rng::XorShift;

/// Longest scan (YCSB's `maxscanlength`); lengths are uniform in 1..=100.
pub const MAX_SCAN_LEN: u64 = 100;

/// One of YCSB's core workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// 50% read, 50% update; zipfian.
    A,
    /// 95% read, 5% update; zipfian.
    B,
    /// 100% read; zipfian.
    C,
    /// 95% read, 5% insert; latest.
    D,
    /// 95% scan (length uniform 1..100), 5% insert; zipfian start key.
    E,
    /// 50% read, 50% read-modify-write; zipfian.
    F,
}

/// How request keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Scrambled zipfian (constant 0.99) over the loaded keys.
    Zipfian,
    /// Zipfian over recency: the newest inserted keys are hottest.
    Latest,
}

/// A workload's operation proportions (they sum to 1).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Mix {
    /// Point reads.
    pub read: f64,
    /// Overwrites of an existing record.
    pub update: f64,
    /// New records (next key number).
    pub insert: f64,
    /// Short forward scans.
    pub scan: f64,
    /// Read-modify-write of one record.
    pub rmw: f64,
    /// Request distribution.
    pub distribution: Distribution,
}

impl Workload {
    /// A to F, in YCSB's recommended running order for `all`: A, B, C, F,
    /// D on one load, then E on a fresh load.
    pub const ALL_IN_ORDER: [Workload; 6] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::F,
        Workload::D,
        Workload::E,
    ];

    /// The letter.
    pub fn letter(self) -> char {
        match self {
            Workload::A => 'a',
            Workload::B => 'b',
            Workload::C => 'c',
            Workload::D => 'd',
            Workload::E => 'e',
            Workload::F => 'f',
        }
    }

    /// The operation mix of the core workload.
    pub fn mix(self) -> Mix {
        let m = |read, update, insert, scan, rmw, distribution| Mix {
            read,
            update,
            insert,
            scan,
            rmw,
            distribution,
        };
        use Distribution::*;
        match self {
            Workload::A => m(0.5, 0.5, 0.0, 0.0, 0.0, Zipfian),
            Workload::B => m(0.95, 0.05, 0.0, 0.0, 0.0, Zipfian),
            Workload::C => m(1.0, 0.0, 0.0, 0.0, 0.0, Zipfian),
            Workload::D => m(0.95, 0.0, 0.05, 0.0, 0.0, Latest),
            Workload::E => m(0.0, 0.0, 0.05, 0.95, 0.0, Zipfian),
            Workload::F => m(0.5, 0.0, 0.0, 0.0, 0.5, Zipfian),
        }
    }

    /// True if the workload adds records.
    pub fn inserts(self) -> bool {
        self.mix().insert > 0.0
    }
}

/// One operation, over key numbers (see [`key_of`], [`fill_value`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read the record.
    Read(u64),
    /// Overwrite the record with a new value.
    Update(u64),
    /// Insert a new record; acknowledge it on the [`Counter`] when done.
    Insert(u64),
    /// Read up to `len` records in key order from the record's key on.
    Scan(u64, usize),
    /// Read the record, change it, write it back.
    Rmw(u64),
}

/// Operation kinds, for per-kind counts and latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// [`Op::Read`].
    Read = 0,
    /// [`Op::Update`].
    Update = 1,
    /// [`Op::Insert`].
    Insert = 2,
    /// [`Op::Scan`].
    Scan = 3,
    /// [`Op::Rmw`].
    Rmw = 4,
}

impl OpKind {
    /// All kinds, in index order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::Rmw,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Scan => "scan",
            OpKind::Rmw => "rmw",
        }
    }
}

impl Op {
    /// The kind.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read(_) => OpKind::Read,
            Op::Update(_) => OpKind::Update,
            Op::Insert(_) => OpKind::Insert,
            Op::Scan(..) => OpKind::Scan,
            Op::Rmw(_) => OpKind::Rmw,
        }
    }
}

enum Chooser {
    Zipfian(ScrambledZipfian),
    Latest(Latest),
}

/// What all tasks of one run share: the prepared chooser (zeta computed
/// once) and the insert counter.
pub struct Shared {
    mix: Mix,
    zipfian: Option<ScrambledZipfian>,
    latest: Option<Latest>,
    /// Insert key numbers; `acked()` is the key count readers draw from.
    pub counter: Arc<Counter>,
}

impl Shared {
    /// For `workload` on a database holding key numbers `0..records`.
    /// Zipfian requests cover the records present at the start (inserted
    /// records are reached by scans passing over them, not as targets);
    /// latest requests follow the inserts.
    pub fn new(workload: Workload, records: u64) -> Shared {
        let mix = workload.mix();
        let (zipfian, latest) = match mix.distribution {
            Distribution::Zipfian => (Some(ScrambledZipfian::new(records.max(1))), None),
            Distribution::Latest => (None, Some(Latest::new(records.max(1)))),
        };
        Shared {
            mix,
            zipfian,
            latest,
            counter: Arc::new(Counter::new(records)),
        }
    }

    /// A generator for one task (seeded per task).
    pub fn op_gen(&self, seed: u64) -> OpGen {
        let chooser = match (&self.zipfian, &self.latest) {
            (Some(z), _) => Chooser::Zipfian(z.clone()),
            (None, Some(l)) => Chooser::Latest(l.clone()),
            (None, None) => unreachable!("Shared::new sets one chooser"),
        };
        let m = self.mix;
        OpGen {
            rng: XorShift::new(0x9C5B_0000 ^ seed),
            thresholds: [
                m.read,
                m.read + m.update,
                m.read + m.update + m.insert,
                m.read + m.update + m.insert + m.scan,
            ],
            chooser,
            scan_len: Uniform::new(1, MAX_SCAN_LEN),
            counter: self.counter.clone(),
        }
    }
}

/// One task's stream of operations.
pub struct OpGen {
    rng: XorShift,
    /// Cumulative proportions of read, update, insert, scan (rmw: rest).
    thresholds: [f64; 4],
    chooser: Chooser,
    scan_len: Uniform,
    counter: Arc<Counter>,
}

impl OpGen {
    fn key(&mut self) -> u64 {
        match &mut self.chooser {
            Chooser::Zipfian(z) => z.next(&mut self.rng),
            Chooser::Latest(l) => l.next(self.counter.acked(), &mut self.rng),
        }
    }

    /// The next operation. An [`Op::Insert`] takes the next key number
    /// from the shared counter; the caller acknowledges it when done.
    pub fn next_op(&mut self) -> Op {
        let u = super::gen::unit(&mut self.rng);
        let t = self.thresholds;
        if u < t[0] {
            Op::Read(self.key())
        } else if u < t[1] {
            Op::Update(self.key())
        } else if u < t[2] {
            Op::Insert(self.counter.next())
        } else if u < t[3] {
            let k = self.key();
            Op::Scan(k, self.scan_len.next(&mut self.rng) as usize)
        } else {
            Op::Rmw(self.key())
        }
    }

    /// A random byte for new values.
    pub fn salt(&mut self) -> u8 {
        self.rng.next_u64() as u8
    }
}

/// The key of key number `k`: 8 bytes, big-endian, of an invertible
/// 64-bit mix of `k` (splitmix64's finaliser). This is YCSB's default
/// `insertorder=hashed` (inserts land all over the tree, not at its right
/// edge) with a bijection instead of FNV, so two key numbers can never
/// share a key.
#[inline]
pub fn key_of(k: u64) -> [u8; 8] {
    let mut z = k;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z.to_be_bytes()
}

/// Key numbers `0..records` in ascending order of their keys
/// ([`key_of`]): the order every engine is loaded in (a B+tree loaded in
/// key order fills its leaves; the peers' bulk loaders need it).
pub fn numbers_in_key_order(records: u64) -> Vec<u64> {
    let mut numbers: Vec<u64> = (0..records).collect();
    numbers.sort_by_cached_key(|&k| key_of(k));
    numbers
}

/// The peers' load of [`key_of`] keys, in the order `sorted` gives
/// ([`numbers_in_key_order`]).
pub fn hashed_load_keys(sorted: &[u64]) -> crate::peers::LoadKeys<'_> {
    crate::peers::LoadKeys {
        scheme: "hashed",
        key: key_of,
        sorted: Some(sorted),
    }
}

/// Fills a value for key number `k`: its first 8 bytes are `k`
/// (little-endian), so a read can check it got its own record; the rest is
/// a pattern of `k` and `salt` (updates use a new salt).
pub fn fill_value(k: u64, salt: u8, out: &mut [u8]) {
    let kb = k.to_le_bytes();
    let n = out.len().min(8);
    out[..n].copy_from_slice(&kb[..n]);
    for (j, b) in out.iter_mut().enumerate().skip(8) {
        *b = kb[j % 8] ^ (j as u8) ^ salt;
    }
}

/// True if `v` is a value of key number `k` with `value_size` bytes.
pub fn value_ok(k: u64, value_size: usize, v: &[u8]) -> bool {
    let n = value_size.min(8);
    v.len() == value_size && v[..n] == k.to_le_bytes()[..n]
}

/// The read-modify-write change: bumps byte 8 (or the last byte of a short
/// value), keeping the key-number prefix.
pub fn modify(v: &[u8]) -> Vec<u8> {
    let mut out = v.to_vec();
    let i = 8.min(out.len().saturating_sub(1));
    if let Some(b) = out.get_mut(i) {
        *b = b.wrapping_add(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_match_the_spec_within_two_percent() {
        const DRAWS: usize = 100_000;
        for w in Workload::ALL_IN_ORDER {
            let shared = Shared::new(w, 10_000);
            let mut g = shared.op_gen(w as u64);
            let mut counts = [0usize; 5];
            let mut scan_total = 0usize;
            for _ in 0..DRAWS {
                let op = g.next_op();
                match op {
                    Op::Read(k) | Op::Update(k) | Op::Rmw(k) => assert!(k < 10_000 + DRAWS as u64),
                    Op::Scan(k, n) => {
                        assert!(k < 10_000);
                        assert!((1..=100).contains(&n));
                        scan_total += n;
                    }
                    Op::Insert(k) => {
                        assert!(k >= 10_000);
                        shared.counter.acknowledge(k);
                    }
                }
                counts[op.kind() as usize] += 1;
            }
            let m = w.mix();
            let want = [m.read, m.update, m.insert, m.scan, m.rmw];
            for (i, kind) in OpKind::ALL.iter().enumerate() {
                let got = counts[i] as f64 / DRAWS as f64;
                assert!(
                    (got - want[i]).abs() < 0.02,
                    "workload {:?} {}: {got} vs {}",
                    w,
                    kind.name(),
                    want[i]
                );
            }
            if counts[OpKind::Scan as usize] > 0 {
                let mean = scan_total as f64 / counts[OpKind::Scan as usize] as f64;
                assert!((mean - 50.5).abs() < 1.0, "scan length mean {mean}");
            }
        }
    }

    #[test]
    fn latest_reads_follow_the_inserts() {
        let shared = Shared::new(Workload::D, 1000);
        let mut g = shared.op_gen(1);
        let mut reads_of_new = 0;
        let mut reads = 0;
        for _ in 0..50_000 {
            match g.next_op() {
                Op::Insert(k) => shared.counter.acknowledge(k),
                Op::Read(k) => {
                    assert!(k < shared.counter.acked());
                    reads += 1;
                    if k >= 1000 {
                        reads_of_new += 1;
                    }
                }
                op => panic!("D does not do {op:?}"),
            }
        }
        // ~2,500 inserts happened; the newest keys get most reads.
        assert!(reads_of_new * 2 > reads, "{reads_of_new} of {reads}");
    }

    #[test]
    fn the_load_order_is_ascending_key_order_of_every_number() {
        let sorted = numbers_in_key_order(10_000);
        assert!(sorted.windows(2).all(|w| key_of(w[0]) < key_of(w[1])));
        let mut all = sorted.clone();
        all.sort_unstable();
        assert!(all.iter().copied().eq(0..10_000));
        let keys = hashed_load_keys(&sorted);
        assert_eq!(keys.number(0), sorted[0]);
        assert_eq!((keys.key)(7), key_of(7));
    }

    #[test]
    fn keys_are_distinct_and_values_check() {
        let keys: std::collections::HashSet<_> = (0..100_000u64).map(key_of).collect();
        assert_eq!(keys.len(), 100_000);
        let mut v = vec![0u8; 120];
        fill_value(42, 7, &mut v);
        assert!(value_ok(42, 120, &v));
        assert!(!value_ok(43, 120, &v));
        let m = modify(&v);
        assert!(value_ok(42, 120, &m));
        assert_ne!(m, v);
    }
}
