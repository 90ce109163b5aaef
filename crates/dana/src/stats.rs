//! Lock-free counters and latency histograms for the engine's statistics.
//!
//! Owns: [`Histogram`], a log-linear histogram of nanosecond durations
//! (8 sub-buckets per power of two: percentiles within 12.5%), updated
//! with relaxed atomics from any thread. Never: allocates or locks on
//! `record`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = 64 * SUB;

/// A concurrent histogram of durations.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
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
    pub fn record(&self, d: Duration) {
        self.record_ns(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// Records one duration in nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        self.buckets[bucket_of(ns).min(BUCKETS - 1)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
    }

    /// A consistent-enough copy for reporting.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            count: self.count.load(Relaxed),
            sum_ns: self.sum_ns.load(Relaxed),
            max_ns: self.max_ns.load(Relaxed),
        }
    }
}

/// A point-in-time copy of a [`Histogram`].
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
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// The `q` quantile (0..=1) in ns: the lower edge of the bucket that
    /// holds it (within 12.5%).
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
