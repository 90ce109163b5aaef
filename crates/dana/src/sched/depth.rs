//! The adaptive in-flight budget of one device: which depth serves it best.
//!
//! Owns: the control law ([`DepthControl`]) that turns one epoch's
//! measurements (completions, the summed latency of the requests, whether
//! requests waited for the budget) into the device's next limit. Pure: no
//! clock, no atomics, no I/O; `sched::io` feeds it and applies its answer.
//!
//! The law estimates the device's *elasticity* at the current limit `L`:
//! how much of a change of depth shows up as a change of throughput
//! (`ln(throughput ratio) / ln(depth ratio)`). Below a device's knee it is
//! near 1 (more requests in flight, proportionally more completions at the
//! same latency); past the knee it is near 0 (more requests buy only
//! latency: Little's law, in flight = throughput x latency). So:
//!
//! - a *trial* epoch runs at `2L` or `L/2` between two *base* epochs at `L`,
//!   and its throughput is compared with the mean of the two around it, so
//!   that a device whose speed drifts steadily drifts out of the
//!   comparison;
//! - [`TRIALS`] trials each way (alternating) are averaged: one epoch of
//!   this machine's disk varies by 5-7% from the next (docs/PERF.md), about
//!   the effect of a small depth change, hence the large trial steps and
//!   the averaging;
//! - then the limit moves up by a factor of sqrt(2) when the elasticity
//!   upward reached [`GAIN`], down by the same factor when the elasticity
//!   downward stayed below it, and otherwise sits at the knee and rests
//!   [`REST_EPOCHS`] base epochs before measuring again (every trial
//!   perturbs the requests in flight and shows in the tail latency).
//!
//! Only epochs in which the budget bound are evidence: an epoch where the
//! engine had fewer requests than the limit says nothing about the device
//! (demand, not depth, decided its throughput), so the limit stays. A trial
//! above what demand fills counts as buying nothing, one below it as
//! losing nothing.
//!
//! Never: leaves `[min, max]`, or moves on an epoch with too few
//! completions to measure (the caller makes epochs long enough).

/// The elasticity (see the module comment) above which deeper is better
/// and below which shallower loses nothing worth its latency. 0.15: a
/// doubled depth must bring at least 11% more completions; a halved one
/// may lose at most 10%.
pub const GAIN: f64 = 0.15;

/// Trials each way averaged for one decision.
pub const TRIALS: u32 = 3;

/// Base epochs the law rests after a decision to stay.
pub const REST_EPOCHS: u32 = 16;

/// Share of the limit that the mean number of requests in flight must
/// reach for an epoch to count as bound by the budget when no request
/// waited for it.
const BOUND_FILL: f64 = 0.8;

/// What one epoch measured at one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Epoch {
    /// Requests completed.
    pub completions: u64,
    /// Sum of their device latencies (submission to reap), seconds.
    pub latency_sum: f64,
    /// Length of the epoch, seconds.
    pub seconds: f64,
    /// Times a request was left waiting in the engine for the budget.
    pub deferred: u64,
}

impl Epoch {
    /// Completions per second.
    pub fn throughput(&self) -> f64 {
        self.completions as f64 / self.seconds.max(1e-9)
    }

    /// Mean requests in flight (Little's law: the summed latencies over the
    /// epoch's length).
    pub fn mean_in_flight(&self) -> f64 {
        self.latency_sum / self.seconds.max(1e-9)
    }

    /// Whether the limit `limit` bound this epoch: requests waited for it,
    /// or the device held nearly that many on average.
    pub fn bound_by(&self, limit: usize) -> bool {
        self.deferred > 0 || self.mean_in_flight() >= BOUND_FILL * limit as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Measuring the current limit, and with it judging the trial just
    /// run, if any.
    Base { trial: Option<TrialResult> },
    /// Measuring a trial limit; `before` is the base epoch just before it.
    Trial { base: usize, before: f64 },
}

/// A trial measured, waiting for the base epoch after it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TrialResult {
    limit: usize,
    /// Throughput at the trial limit (None: demand did not fill it).
    throughput: Option<f64>,
    /// Throughput of the base epoch before the trial.
    before: f64,
}

/// Why a limit changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A trial of a deeper limit.
    ProbeUp,
    /// A trial of a shallower limit.
    ProbeDown,
    /// Back to the base limit after a trial.
    TrialEnd,
    /// The limit moved: the trials found the device on one side of its
    /// knee.
    Moved,
}

/// Elasticities measured one way at the current limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    sum: f64,
    n: u32,
}

impl Tally {
    fn mean(&self) -> f64 {
        self.sum / f64::from(self.n.max(1))
    }
}

/// The control law of one device (see the module comment).
#[derive(Debug, Clone)]
pub struct DepthControl {
    min: usize,
    max: usize,
    limit: usize,
    phase: Phase,
    /// The direction of the next trial.
    up_next: bool,
    up: Tally,
    down: Tally,
    /// Base epochs left to rest before the next trial.
    rest: u32,
}

impl DepthControl {
    /// Starts at `initial`, clamped to `[min, max]` (`min >= 1`).
    pub fn new(initial: usize, min: usize, max: usize) -> DepthControl {
        let min = min.max(1);
        let max = max.max(min);
        DepthControl {
            min,
            max,
            limit: initial.clamp(min, max),
            phase: Phase::Base { trial: None },
            up_next: true,
            up: Tally::default(),
            down: Tally::default(),
            rest: 0,
        }
    }

    /// The limit to apply now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes the epoch just measured at [`DepthControl::limit`]; returns the
    /// new limit and why, when it changes.
    pub fn observe(&mut self, e: &Epoch) -> Option<(usize, Reason)> {
        let bound = e.bound_by(self.limit) && e.completions > 0;
        let out = match self.phase {
            Phase::Trial { base, .. } if e.completions == 0 => {
                // Nothing completed at the trial limit: a stall of the
                // device (or of the engine) for the whole epoch, not an
                // answer about the depth. The trial is dropped unjudged.
                self.phase = Phase::Base { trial: None };
                self.limit = base;
                Some((base, Reason::TrialEnd))
            }
            Phase::Trial { base, before } => {
                self.phase = Phase::Base {
                    trial: Some(TrialResult {
                        limit: self.limit,
                        throughput: bound.then(|| e.throughput()),
                        before,
                    }),
                };
                self.limit = base;
                Some((base, Reason::TrialEnd))
            }
            Phase::Base { trial } => {
                self.phase = Phase::Base { trial: None };
                if !bound {
                    // Demand decided this epoch: nothing to learn, and the
                    // trial before it has no second base to compare with.
                    return None;
                }
                if let Some(t) = trial {
                    self.tally(t, e.throughput());
                }
                if let Some(moved) = self.decide() {
                    return Some(moved);
                }
                if self.rest > 0 {
                    self.rest -= 1;
                    return None;
                }
                self.start_trial(e.throughput())
            }
        };
        debug_assert!((self.min..=self.max).contains(&self.limit));
        out
    }

    /// Adds trial `t`'s elasticity, judged against the mean of the base
    /// epochs before it and `after` it.
    fn tally(&mut self, t: TrialResult, after: f64) {
        let depth = (t.limit as f64 / self.limit as f64).ln();
        let elasticity = match t.throughput {
            Some(x) => (x / ((t.before + after) / 2.0).max(1e-9)).ln() / depth,
            // Demand did not fill the trial: a deeper one bought nothing, a
            // shallower one lost nothing (demand fits below it).
            None => 0.0,
        };
        let tally = if depth > 0.0 {
            &mut self.up
        } else {
            &mut self.down
        };
        tally.sum += elasticity;
        tally.n += 1;
    }

    /// Once enough trials each way are in: move, or stay and rest.
    fn decide(&mut self) -> Option<(usize, Reason)> {
        if self.up.n < TRIALS || self.down.n < TRIALS {
            return None;
        }
        let (up, down) = (self.up.mean(), self.down.mean());
        (self.up, self.down) = (Tally::default(), Tally::default());
        let to = if up >= GAIN {
            self.moved_up()
        } else if down < GAIN {
            self.moved_down()
        } else {
            self.limit
        };
        if to == self.limit {
            self.rest = REST_EPOCHS;
            return None;
        }
        self.limit = to;
        Some((to, Reason::Moved))
    }

    /// Starts the next trial, or counts a direction that has no room as
    /// measured (no gain above the maximum, all loss below the minimum).
    fn start_trial(&mut self, before: f64) -> Option<(usize, Reason)> {
        for _ in 0..2 {
            let up = self.up_next;
            self.up_next = !up;
            let to = if up {
                self.limit.saturating_mul(2).min(self.max)
            } else {
                (self.limit / 2).max(self.min)
            };
            if to == self.limit {
                let tally = if up { &mut self.up } else { &mut self.down };
                tally.sum += if up { 0.0 } else { 1.0 };
                tally.n += 1;
                continue;
            }
            self.phase = Phase::Trial {
                base: self.limit,
                before,
            };
            self.limit = to;
            let reason = if up {
                Reason::ProbeUp
            } else {
                Reason::ProbeDown
            };
            return Some((to, reason));
        }
        // Neither way has room (min == max).
        self.decide();
        None
    }

    fn moved_up(&self) -> usize {
        let to = (self.limit as f64 * std::f64::consts::SQRT_2).ceil() as usize;
        to.clamp(self.limit + 1, self.max.max(self.limit + 1))
            .min(self.max)
    }

    fn moved_down(&self) -> usize {
        let to = (self.limit as f64 / std::f64::consts::SQRT_2).floor() as usize;
        to.clamp(self.min, self.limit.saturating_sub(1).max(self.min))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that serves `depth` requests in parallel at `latency`
    /// seconds each up to `iops` (its knee is at `iops * latency`), with
    /// `demand` requests waiting in the engine.
    struct Model {
        iops: f64,
        latency: f64,
        demand: usize,
    }

    impl Model {
        fn epoch(&self, limit: usize, noise: f64) -> Epoch {
            let depth = limit.min(self.demand) as f64;
            let x = (depth / self.latency).min(self.iops) * (1.0 + noise);
            let seconds = 0.05;
            Epoch {
                completions: (x * seconds) as u64,
                // Little: in flight = x * latency(depth) = depth.
                latency_sum: depth * seconds,
                seconds,
                deferred: u64::from(self.demand > limit),
            }
        }
    }

    fn run(c: &mut DepthControl, m: &Model, epochs: usize, noise: &mut impl FnMut() -> f64) {
        for _ in 0..epochs {
            let e = m.epoch(c.limit(), noise());
            c.observe(&e);
        }
    }

    fn settled(c: &mut DepthControl, m: &Model, noise: &mut impl FnMut() -> f64) -> usize {
        run(c, m, 400, noise);
        // The limit between trials, over the next epochs.
        let mut seen = Vec::new();
        for _ in 0..200 {
            let e = m.epoch(c.limit(), noise());
            c.observe(&e);
            if matches!(c.phase, Phase::Base { .. }) {
                seen.push(c.limit());
            }
        }
        seen.sort_unstable();
        seen[seen.len() / 2]
    }

    #[test]
    fn climbs_to_the_knee_from_below_and_comes_down_to_it_from_above() {
        // Knee at 100k IOPS x 500 µs = 50 in flight. The law probes at
        // twice and half the limit, so on a knee this sharp it rests
        // anywhere from the knee to twice it (at 89, half the depth loses
        // 12%: more than GAIN allows).
        let m = Model {
            iops: 100_000.0,
            latency: 500e-6,
            demand: 10_000,
        };
        for start in [4, 256] {
            let mut c = DepthControl::new(start, 1, 256);
            let l = settled(&mut c, &m, &mut || 0.0);
            assert!((40..=100).contains(&l), "from {start}: settled at {l}");
        }
    }

    #[test]
    fn noise_below_the_gain_does_not_push_it_off_the_knee() {
        let m = Model {
            iops: 100_000.0,
            latency: 500e-6,
            demand: 10_000,
        };
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 2001) as f64 / 1000.0 - 1.0) * 0.01 // +-1%
        };
        let mut c = DepthControl::new(8, 1, 512);
        let l = settled(&mut c, &m, &mut noise);
        assert!((40..=100).contains(&l), "settled at {l}");
    }

    #[test]
    fn a_steady_drift_is_not_taken_for_a_gain() {
        // Past the knee (50) a deeper queue buys nothing, while the device
        // speeds up by 5% every epoch: a trial judged against the epoch
        // before it alone would see +5% and climb.
        let m = Model {
            iops: 100_000.0,
            latency: 500e-6,
            demand: 10_000,
        };
        let mut speed = 1.0f64;
        let mut drift = || {
            speed *= 1.05;
            speed - 1.0
        };
        let mut c = DepthControl::new(60, 1, 512);
        let l = settled(&mut c, &m, &mut drift);
        assert!((40..=100).contains(&l), "settled at {l}");
    }

    #[test]
    fn epochs_not_bound_by_the_limit_leave_it_alone() {
        // 16 requests waiting at most: a limit of 32 is never the bound.
        let m = Model {
            iops: 1e6,
            latency: 100e-6,
            demand: 16,
        };
        let mut c = DepthControl::new(32, 1, 256);
        for _ in 0..100 {
            // No trial, no move: the limit never changes.
            assert_eq!(c.observe(&m.epoch(c.limit(), 0.0)), None);
        }
        assert_eq!(c.limit(), 32);
    }

    #[test]
    fn a_trial_that_outruns_demand_is_undone() {
        // Demand of 40 on a device whose knee is at 100: going past 40 buys
        // nothing, so the limit stays near the demand, not at the maximum.
        let m = Model {
            iops: 1e6,
            latency: 100e-6,
            demand: 40,
        };
        let mut c = DepthControl::new(8, 1, 256);
        let l = settled(&mut c, &m, &mut || 0.0);
        assert!((32..=50).contains(&l), "settled at {l}");
    }

    #[test]
    fn a_trial_during_which_nothing_completed_is_not_judged() {
        // A down-trial whose epoch saw the device stall (requests waiting,
        // none completed) must not count as "a shallower limit lost
        // nothing".
        let bound = Epoch {
            completions: 5_000,
            latency_sum: 0.05 * 32.0,
            seconds: 0.05,
            deferred: 10,
        };
        let stalled = Epoch {
            completions: 0,
            latency_sum: 0.0,
            seconds: 1.0,
            deferred: 5,
        };
        let mut c = DepthControl::new(32, 1, 256);
        c.up_next = false;
        assert_eq!(c.observe(&bound), Some((16, Reason::ProbeDown)));
        assert_eq!(c.observe(&stalled), Some((32, Reason::TrialEnd)));
        c.observe(&bound);
        assert_eq!(c.down, Tally::default(), "the stalled trial was tallied");
    }

    #[test]
    fn stays_within_its_bounds() {
        let m = Model {
            iops: 1e9,
            latency: 1e-3,
            demand: 100_000,
        };
        let mut c = DepthControl::new(1, 2, 64);
        assert_eq!(c.limit(), 2);
        let l = settled(&mut c, &m, &mut || 0.0);
        assert_eq!(l, 64, "a device that never saturates: the maximum");
        let slow = Model {
            iops: 1000.0,
            latency: 1e-3,
            demand: 100_000,
        };
        let l = settled(&mut c, &slow, &mut || 0.0);
        assert!((2..=4).contains(&l), "a device saturated at depth 1: {l}");
    }
}
