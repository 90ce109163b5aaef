//! Lock-free counters and latency histograms for the engine's statistics.
//!
//! Owns: [`Histogram`], a log-linear histogram of nanosecond durations
//! (8 sub-buckets per power of two: percentiles within 12.5%), updated
//! with relaxed atomics from any thread, each thread on a stripe of its
//! own; [`StripedCounter`], a counter
//! that threads bump on cache lines of their own. Never: allocates or
//! locks on `record` or `add`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = 64 * SUB;

/// Stripes of a [`StripedCounter`]: threads beyond this many share.
const STRIPES: usize = 16;

/// One stripe, alone on its cache lines (128 bytes: adjacent-line
/// prefetch pairs them on x86).
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// A counter bumped by many threads at once, on a hot path (the buffer
/// pool's hits: every page fix). One shared atomic would bounce its cache
/// line between the cores at every bump; here each thread adds to its own
/// stripe and a read sums them (reads are rare: reports).
///
/// ```
/// let c = std::sync::Arc::new(dana::stats::StripedCounter::default());
/// let t: Vec<_> = (0..4)
///     .map(|_| {
///         let c = c.clone();
///         std::thread::spawn(move || (0..1000).for_each(|_| c.add(1)))
///     })
///     .collect();
/// t.into_iter().for_each(|t| t.join().unwrap());
/// assert_eq!(c.get(), 4000);
/// ```
#[derive(Default)]
pub struct StripedCounter {
    stripes: [Stripe; STRIPES],
}

impl StripedCounter {
    /// Adds `n` on the calling thread's stripe.
    #[inline]
    pub fn add(&self, n: u64) {
        self.stripes[stripe_of_thread()].0.fetch_add(n, Relaxed);
    }

    /// The sum of every stripe (not a snapshot: bumps during the sum may
    /// or may not count).
    pub fn get(&self) -> u64 {
        self.stripes.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

/// The calling thread's stripe, handed out round-robin at its first use.
#[inline]
fn stripe_of_thread() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// A concurrent histogram of durations.
///
/// ```
/// use std::time::Duration;
/// let h = std::sync::Arc::new(dana::stats::Histogram::default());
/// let threads: Vec<_> = (0..2)
///     .map(|_| {
///         let h = h.clone();
///         std::thread::spawn(move || (0..100).for_each(|_| h.record(Duration::from_micros(5))))
///     })
///     .collect();
/// threads.into_iter().for_each(|t| t.join().unwrap());
/// let s = h.snapshot();
/// assert_eq!(s.count, 200);
/// assert_eq!((s.mean_ns(), s.max_ns), (5_000, 5_000));
/// ```
pub struct Histogram {
    shards: Box<[HistogramShard]>,
}

/// One thread stripe of a [`Histogram`]: its totals on cache lines of
/// their own, its buckets in an allocation of their own. Threads record
/// into their own stripe (see [`stripe_of_thread`]), so workers recording
/// every page miss do not bounce one line between them (on 2 vCPUs the
/// difference was within the noise, docs/PERF.md, "The engine's CPU
/// ceiling"; with 64 workers one shared set would be a hot line).
#[repr(align(128))]
struct HistogramShard {
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            shards: (0..STRIPES)
                .map(|_| HistogramShard {
                    count: AtomicU64::new(0),
                    sum_ns: AtomicU64::new(0),
                    max_ns: AtomicU64::new(0),
                    buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
                })
                .collect(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros();
    let sub = (ns >> (log - SUB_BITS)) as usize & (SUB - 1);
    ((log - SUB_BITS + 1) as usize) * SUB + sub
}

fn bucket_low(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let log = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    (1u64 << log) | (sub << (log - SUB_BITS))
}

impl Histogram {
    /// Records one duration.
    ///
    /// ```
    /// use std::time::Duration;
    /// let h = dana::stats::Histogram::default();
    /// h.record(Duration::from_micros(3));
    /// h.record(Duration::from_millis(1));
    /// let s = h.snapshot();
    /// assert_eq!((s.count, s.sum_ns, s.max_ns), (2, 1_003_000, 1_000_000));
    /// ```
    pub fn record(&self, d: Duration) {
        self.record_ns(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// Records one duration in nanoseconds.
    ///
    /// ```
    /// let h = dana::stats::Histogram::default();
    /// h.record_ns(250);
    /// h.record_ns(750);
    /// let s = h.snapshot();
    /// assert_eq!((s.count, s.mean_ns(), s.max_ns), (2, 500, 750));
    /// ```
    pub fn record_ns(&self, ns: u64) {
        let shard = &self.shards[stripe_of_thread()];
        shard.buckets[bucket_of(ns).min(BUCKETS - 1)].fetch_add(1, Relaxed);
        shard.count.fetch_add(1, Relaxed);
        shard.sum_ns.fetch_add(ns, Relaxed);
        shard.max_ns.fetch_max(ns, Relaxed);
    }

    /// A consistent-enough copy for reporting.
    ///
    /// ```
    /// let h = dana::stats::Histogram::default();
    /// h.record_ns(100);
    /// let s = h.snapshot();
    /// h.record_ns(200); // later records do not change a snapshot taken
    /// assert_eq!(s.count, 1);
    /// assert_eq!(h.snapshot().count, 2);
    /// ```
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot {
            buckets: vec![0; BUCKETS],
            ..HistogramSnapshot::default()
        };
        for shard in self.shards.iter() {
            for (sum, b) in s.buckets.iter_mut().zip(shard.buckets.iter()) {
                *sum += b.load(Relaxed);
            }
            s.count += shard.count.load(Relaxed);
            s.sum_ns += shard.sum_ns.load(Relaxed);
            s.max_ns = s.max_ns.max(shard.max_ns.load(Relaxed));
        }
        s
    }
}

/// A point-in-time copy of a [`Histogram`]. The buffer pool reports its
/// latencies as these (see [`crate::Db::pool_stats`]).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// let opts = dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20);
/// let db = dana::Db::open(dir.path(), opts.clone()).unwrap();
/// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
/// db.close().unwrap();
/// let db = dana::Db::open(dir.path(), opts).unwrap(); // an empty pool
/// assert_eq!(db.tree("t").unwrap().get(b"k").unwrap(), Some(b"v".to_vec()));
/// let stats = db.pool_stats();
/// let miss = &stats.miss; // how long each page read from disk took
/// assert!(miss.count >= 1 && miss.count <= stats.misses);
/// assert!(miss.mean_ns() <= miss.max_ns && miss.quantile_ns(0.5) <= miss.max_ns);
/// ```
#[derive(Debug, Clone, Default)]
pub struct HistogramSnapshot {
    buckets: Vec<u64>,
    /// Number of recorded durations.
    pub count: u64,
    /// Sum of all durations in ns.
    pub sum_ns: u64,
    /// Largest duration in ns.
    pub max_ns: u64,
}

impl HistogramSnapshot {
    /// Mean in ns (0 when empty).
    ///
    /// ```
    /// let h = dana::stats::Histogram::default();
    /// assert_eq!(h.snapshot().mean_ns(), 0);
    /// for ns in [100, 200, 600] {
    ///     h.record_ns(ns);
    /// }
    /// assert_eq!(h.snapshot().mean_ns(), 300);
    /// ```
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// The `q` quantile (0..=1) in ns: the lower edge of the bucket that
    /// holds it (within 12.5%).
    ///
    /// ```
    /// let h = dana::stats::Histogram::default();
    /// assert_eq!(h.snapshot().quantile_ns(0.5), 0); // empty
    /// for us in 1..=100u64 {
    ///     h.record_ns(us * 1_000);
    /// }
    /// let p50 = h.snapshot().quantile_ns(0.5);
    /// assert!(p50 <= 50_000 && p50 >= 50_000 - 50_000 / 8, "{p50}");
    /// assert!(h.snapshot().quantile_ns(1.0) <= 100_000);
    /// ```
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_low(i).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// The difference `self - earlier` (for per-interval figures).
    ///
    /// ```
    /// let h = dana::stats::Histogram::default();
    /// h.record_ns(1_024);
    /// let earlier = h.snapshot();
    /// h.record_ns(3_072);
    /// h.record_ns(5_120);
    /// let interval = h.snapshot().since(&earlier);
    /// assert_eq!((interval.count, interval.sum_ns, interval.mean_ns()), (2, 8_192, 4_096));
    /// assert_eq!(interval.quantile_ns(0.0), 3_072); // the earlier sample is not in it
    /// ```
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets = if earlier.buckets.len() == self.buckets.len() {
            self.buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect()
        } else {
            self.buckets.clone()
        };
        HistogramSnapshot {
            buckets,
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            max_ns: self.max_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 30_000, 1 << 40] {
            let b = bucket_of(ns);
            assert!(b >= last);
            last = b;
            let low = bucket_low(b);
            assert!(low <= ns && ns - low <= ns / 8 + 1, "{ns} -> {low}");
        }
    }

    #[test]
    fn quantiles() {
        let h = Histogram::default();
        for i in 1..=1000u64 {
            h.record_ns(i * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 1000);
        let p50 = s.quantile_ns(0.5);
        assert!((440_000..=500_000).contains(&p50), "{p50}");
        let p99 = s.quantile_ns(0.99);
        assert!((860_000..=990_000).contains(&p99), "{p99}");
        assert_eq!(s.mean_ns(), 500_500);
    }
}
