//! YCSB's request generators, written from the algorithms (not ported
//! code): uniform, zipfian (Gray et al., "Quickly generating
//! billion-record synthetic databases", SIGMOD 1994, as YCSB's
//! `ZipfianGenerator` uses it), scrambled zipfian, latest, and the
//! insert-key counter.
//!
//! Owns: turning random bits into key numbers and scan lengths. Key
//! numbers are sequence numbers `0..count`; turning them into key bytes
//! is the workload's business. Never: touches an engine, allocates per
//! draw, or locks except in [`Counter`] acknowledgements.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::rng::XorShift;

/// YCSB's zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// A float uniform in `[0, 1)` (53 random bits).
#[inline]
pub fn unit(rng: &mut XorShift) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// 64-bit FNV-1a over the 8 little-endian bytes of `v`, as YCSB's
/// `Utils.fnvhash64` (we keep all 64 bits instead of Java's `abs`).
#[inline]
pub fn fnv64(mut v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= v & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        v >>= 8;
    }
    h
}

/// Uniform integers in `lo..=hi`.
#[derive(Debug, Clone)]
pub struct Uniform {
    lo: u64,
    span: u64,
}

impl Uniform {
    /// Uniform over `lo..=hi` (`lo <= hi`).
    pub fn new(lo: u64, hi: u64) -> Uniform {
        assert!(lo <= hi, "empty uniform range {lo}..={hi}");
        Uniform {
            lo,
            span: hi - lo + 1,
        }
    }

    /// The next number.
    #[inline]
    pub fn next(&self, rng: &mut XorShift) -> u64 {
        self.lo + rng.below(self.span)
    }
}

/// `sum_{i=from}^{to-1} 1 / (i+1)^theta`: the part of zeta(to, theta)
/// past the first `from` items.
pub fn zeta_part(from: u64, to: u64, theta: f64) -> f64 {
    (from..to).map(|i| 1.0 / ((i + 1) as f64).powf(theta)).sum()
}

/// zeta(n, theta) = `sum_{i=1}^{n} 1 / i^theta`.
pub fn zeta(n: u64, theta: f64) -> f64 {
    zeta_part(0, n, theta)
}

/// Zipfian ranks `0..n` (rank 0 the most popular), Gray et al.'s
/// constant-time method: P(rank 0) = 1/zeta(n), P(rank 1) =
/// 0.5^theta/zeta(n) exactly, the rest through a closed-form inverse of
/// the continuous approximation. The item count can grow
/// ([`Zipfian::next_of`]); zeta is then extended incrementally, as in
/// YCSB.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// Zipfian over `n >= 1` items with YCSB's constant 0.99. Computes
    /// zeta(n) (O(n), ~0.1 s per 10M items): build once, clone per task.
    pub fn new(n: u64) -> Zipfian {
        Zipfian::with_theta(n, ZIPFIAN_CONSTANT)
    }

    /// Zipfian over `n >= 1` items with exponent `theta` in (0, 1).
    pub fn with_theta(n: u64, theta: f64) -> Zipfian {
        assert!(n >= 1, "zipfian over no items");
        let mut z = Zipfian {
            items: n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2: zeta(2, theta),
            zetan: zeta(n, theta),
            eta: 0.0,
        };
        z.eta = z.eta_of(n);
        z
    }

    fn eta_of(&self, n: u64) -> f64 {
        (1.0 - (2.0 / n as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// Items the generator currently draws from.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// zeta(items, theta).
    #[cfg(test)]
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The next rank in `0..items`.
    #[inline]
    pub fn next(&self, rng: &mut XorShift) -> u64 {
        let u = unit(rng);
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let r = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.items - 1)
    }

    /// The next rank in `0..n`, first growing the item count to `n` if it
    /// grew (zeta extended over the new items only). A smaller `n` than
    /// before recomputes zeta from scratch (not expected in YCSB use).
    pub fn next_of(&mut self, n: u64, rng: &mut XorShift) -> u64 {
        if n != self.items && n >= 1 {
            self.zetan = if n > self.items {
                self.zetan + zeta_part(self.items, n, self.theta)
            } else {
                zeta(n, self.theta)
            };
            self.items = n;
            self.eta = self.eta_of(n);
        }
        self.next(rng)
    }
}

/// YCSB's "zipfian" request distribution: a zipfian rank over the key
/// numbers `0..n`, hashed (FNV-64) and reduced mod `n`, so the popular
/// keys are spread over the key space instead of clustered at its start.
///
/// Differs from YCSB's shortcut, which draws ranks from a fixed 10^10-item
/// zipfian (precomputed zeta 26.47) whatever the record count: we compute
/// zeta(n) for the real n, so the hottest key has frequency 1/zeta(n)
/// exactly as an unscrambled zipfian over n keys (e.g. 6.4% at n = 10M
/// instead of YCSB's 3.8%). Distinct ranks can hash to the same key, as
/// in YCSB.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    zipf: Zipfian,
}

impl ScrambledZipfian {
    /// Over key numbers `0..n`.
    pub fn new(n: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            zipf: Zipfian::new(n),
        }
    }

    /// Over key numbers `0..n`, with skew `theta` (YCSB's is 0.99).
    pub fn with_theta(n: u64, theta: f64) -> ScrambledZipfian {
        ScrambledZipfian {
            zipf: Zipfian::with_theta(n, theta),
        }
    }

    /// The next key number in `0..n`.
    #[inline]
    pub fn next(&self, rng: &mut XorShift) -> u64 {
        fnv64(self.zipf.next(rng)) % self.zipf.items()
    }
}

/// YCSB's "latest": zipfian over recency. With `count` keys acknowledged
/// so far, returns `count - 1 - rank`: the newest key is the most popular
/// and popularity follows the inserts as they come.
#[derive(Debug, Clone)]
pub struct Latest {
    zipf: Zipfian,
}

impl Latest {
    /// Starting from `count` keys.
    pub fn new(count: u64) -> Latest {
        Latest {
            zipf: Zipfian::new(count.max(1)),
        }
    }

    /// The next key number in `0..count` (`count >= 1`).
    #[inline]
    pub fn next(&mut self, count: u64, rng: &mut XorShift) -> u64 {
        let count = count.max(1);
        count - 1 - self.zipf.next_of(count, rng)
    }
}

/// Insert key numbers: hands out `start, start+1, ...` and tracks how many
/// are acknowledged as a contiguous prefix (YCSB's
/// `AcknowledgedCounterGenerator`), so readers never pick a key whose
/// insert has not finished. Shared by all tasks.
#[derive(Debug)]
pub struct Counter {
    next: AtomicU64,
    acked: AtomicU64,
    pending: Mutex<BTreeSet<u64>>,
}

impl Counter {
    /// Keys `0..start` exist; the next insert gets `start`.
    pub fn new(start: u64) -> Counter {
        Counter {
            next: AtomicU64::new(start),
            acked: AtomicU64::new(start),
            pending: Mutex::new(BTreeSet::new()),
        }
    }

    /// The next key number to insert.
    #[inline]
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Key numbers handed out so far (acknowledged or not), i.e. the key
    /// count once every insert is done.
    pub fn issued(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Marks the insert of `k` as done (successfully or not).
    pub fn acknowledge(&self, k: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.insert(k);
        let mut a = self.acked.load(Ordering::Relaxed);
        while p.first() == Some(&a) {
            p.pop_first();
            a += 1;
        }
        self.acked.store(a, Ordering::Release);
    }

    /// Keys `0..acked()` are all done: the count readers may draw from.
    #[inline]
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 200_000;

    fn histogram(items: u64, mut draw: impl FnMut() -> u64) -> Vec<u64> {
        let mut h = vec![0u64; items as usize];
        for _ in 0..N {
            let k = draw();
            assert!(k < items, "{k} out of 0..{items}");
            h[k as usize] += 1;
        }
        h
    }

    #[test]
    fn uniform_mean_and_variance() {
        let mut rng = XorShift::new(1);
        let u = Uniform::new(10, 1009); // 1000 values
        let xs: Vec<f64> = (0..N).map(|_| u.next(&mut rng) as f64).collect();
        assert!(xs.iter().all(|&x| (10.0..=1009.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / N as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / N as f64;
        // Discrete uniform over 1000 values: mean 509.5, variance (1000^2-1)/12.
        assert!((mean - 509.5).abs() < 3.0, "mean {mean}");
        let want = (1000.0f64 * 1000.0 - 1.0) / 12.0;
        assert!((var / want - 1.0).abs() < 0.02, "variance {var} vs {want}");
    }

    #[test]
    fn scan_length_uniform_1_to_100() {
        let mut rng = XorShift::new(2);
        let u = Uniform::new(1, 100);
        let xs: Vec<u64> = (0..N).map(|_| u.next(&mut rng)).collect();
        assert_eq!(*xs.iter().min().unwrap(), 1);
        assert_eq!(*xs.iter().max().unwrap(), 100);
        let mean = xs.iter().sum::<u64>() as f64 / N as f64;
        assert!((mean - 50.5).abs() < 0.5, "mean {mean}");
    }

    #[test]
    fn zeta_matches_direct_sum_and_extends() {
        let direct: f64 = (1..=1000).map(|i| 1.0 / (i as f64).powf(0.99)).sum();
        assert!((zeta(1000, 0.99) - direct).abs() < 1e-9);
        assert!((zeta(400, 0.99) + zeta_part(400, 1000, 0.99) - direct).abs() < 1e-9);
    }

    #[test]
    fn zipfian_top_frequency_and_rank_order() {
        let n = 1000;
        let z = Zipfian::new(n);
        let mut rng = XorShift::new(3);
        let h = histogram(n, || z.next(&mut rng));
        let top = h[0] as f64 / N as f64;
        let want = 1.0 / zeta(n, 0.99);
        assert!((top / want - 1.0).abs() < 0.05, "top {top} vs {want}");
        let second = h[1] as f64 / N as f64;
        let want2 = 0.5f64.powf(0.99) / zeta(n, 0.99);
        assert!(
            (second / want2 - 1.0).abs() < 0.05,
            "2nd {second} vs {want2}"
        );
        // The ten most popular ranks come in order.
        for r in 0..9 {
            assert!(h[r] > h[r + 1], "rank {r}: {} <= {}", h[r], h[r + 1]);
        }
        // And the head dominates the tail.
        let head: u64 = h[..10].iter().sum();
        let tail: u64 = h[990..].iter().sum();
        assert!(head > 20 * tail, "head {head} tail {tail}");
    }

    #[test]
    fn zipfian_growing_item_count_matches_fresh() {
        let mut grown = Zipfian::new(500);
        let mut rng = XorShift::new(4);
        grown.next_of(2000, &mut rng);
        let fresh = Zipfian::new(2000);
        assert!((grown.zetan() - fresh.zetan()).abs() < 1e-9);
        assert_eq!(grown.items(), 2000);
    }

    #[test]
    fn scrambled_zipfian_spreads_but_keeps_the_skew() {
        let n = 1000;
        let s = ScrambledZipfian::new(n);
        let mut rng = XorShift::new(5);
        let h = histogram(n, || s.next(&mut rng));
        let distinct = h.iter().filter(|&&c| c > 0).count();
        // FNV collisions merge some ranks; most keys still get drawn.
        assert!(distinct > 550, "only {distinct} distinct keys");
        let mut sorted = h.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top = sorted[0] as f64 / N as f64;
        let want = 1.0 / zeta(n, 0.99);
        // The hottest key is rank 0's (maybe plus a colliding rank).
        assert!(
            top >= want * 0.95 && top < want * 1.6,
            "top {top} vs {want}"
        );
        // The hottest key is not simply key 0: the ranks are scrambled.
        let hottest = h.iter().position(|&c| c == sorted[0]).unwrap();
        assert_eq!(hottest as u64, fnv64(0) % n);
        assert_ne!(hottest, 0);
    }

    #[test]
    fn latest_favours_the_newest_keys() {
        let mut l = Latest::new(1000);
        let mut rng = XorShift::new(6);
        let h = histogram(1000, || l.next(1000, &mut rng));
        assert!(h[999] > h[998] && h[998] > h[997], "{:?}", &h[990..]);
        let newest_tenth: u64 = h[900..].iter().sum();
        assert!(newest_tenth as f64 > 0.6 * N as f64, "{newest_tenth}");
        let top = h[999] as f64 / N as f64;
        assert!((top * zeta(1000, 0.99) - 1.0).abs() < 0.05, "top {top}");
        // When keys are added, popularity moves to them.
        let h2 = histogram(1100, || l.next(1100, &mut rng));
        assert!(h2[1099] > h2[999] * 5, "{} vs {}", h2[1099], h2[999]);
    }

    #[test]
    fn counter_acknowledges_a_contiguous_prefix() {
        let c = Counter::new(10);
        let (a, b, d) = (c.next(), c.next(), c.next());
        assert_eq!((a, b, d), (10, 11, 12));
        assert_eq!(c.issued(), 13);
        c.acknowledge(11);
        assert_eq!(c.acked(), 10, "11 done but 10 is not");
        c.acknowledge(10);
        assert_eq!(c.acked(), 12);
        c.acknowledge(12);
        assert_eq!(c.acked(), 13);
    }

    #[test]
    fn fnv_matches_known_values() {
        // FNV-1a 64 of eight zero bytes, computed independently.
        let mut h: u64 = 0xcbf29ce484222325;
        for _ in 0..8 {
            h = h.wrapping_mul(0x100000001b3);
        }
        assert_eq!(fnv64(0), h);
        assert_ne!(fnv64(1), fnv64(2));
    }
}
