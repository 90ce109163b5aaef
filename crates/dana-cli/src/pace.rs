//! Rate limiting for the rate-bound I/O classes (background writer, WAL):
//! a class that has moved `sent` bytes since `start` should not be ahead of
//! `rate × elapsed`; when it is, it sleeps the difference.

use std::time::{Duration, Instant};

/// Keeps a byte stream at or below a target rate.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    bytes_per_sec: f64,
    start: Instant,
}

impl Pacer {
    /// A pacer at `bytes_per_sec` (> 0), starting now.
    pub fn new(bytes_per_sec: f64, start: Instant) -> Pacer {
        Pacer {
            bytes_per_sec,
            start,
        }
    }

    /// How long to wait before sending more, having sent `sent` bytes by
    /// `now` (zero when behind or on schedule).
    pub fn delay(&self, sent: u64, now: Instant) -> Duration {
        let due = Duration::from_secs_f64(sent as f64 / self.bytes_per_sec);
        let elapsed = now.saturating_duration_since(self.start);
        due.saturating_sub(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ahead_of_schedule_waits_the_difference() {
        let t0 = Instant::now();
        let p = Pacer::new(1_000_000.0, t0);
        // 500 kB at 1 MB/s are due at 0.5 s; at 0.2 s wait 0.3 s.
        let d = p.delay(500_000, t0 + Duration::from_millis(200));
        assert_eq!(d, Duration::from_millis(300));
    }

    #[test]
    fn behind_schedule_does_not_wait() {
        let t0 = Instant::now();
        let p = Pacer::new(1_000_000.0, t0);
        assert_eq!(
            p.delay(100_000, t0 + Duration::from_secs(1)),
            Duration::ZERO
        );
        assert_eq!(p.delay(0, t0), Duration::ZERO);
    }
}
