//! Which resident page is worth least: the access history of a frame and
//! its value under the eviction policy.
//!
//! Owns: [`EvictionPolicy`], the per-frame [`History`] of recent accesses
//! (4 epochs in one atomic word) and the value a page's histories give it.
//! Never: latches a page, evicts or writes (the pool's eviction step does,
//! `buffer/mod.rs`), or writes a history's cache line when the newest
//! epoch is already recorded (most fixes of a hot page change nothing).
//!
//! **WATT** (Vöhringer & Leis, VLDB 2023, "Write-Aware Timestamp
//! Tracking"): a page's value is its estimated access frequency, the
//! largest `(accesses since the k-th newest recorded epoch) / (its age +
//! 1)` over its last four epochs with accesses, so a page touched often
//! lately outranks one touched once just now, and one touched often long
//! ago decays. WATT keeps exact timestamps; dana's epochs are coarse, so
//! each entry also counts the accesses in its epoch (up to 15): without
//! the count a node every descent passes and a leaf read once in the same
//! epoch looked alike, and a first version evicted inner nodes (3.7 reads
//! per YCSB-A operation instead of 0.7). Writes
//! keep their own history and weigh `write_weight` times a read: writing a
//! page back costs the SSD more than reading it, and a page written again
//! soon after its write-back costs a second write (flash wear), so
//! write-hot pages stay. Time is counted in epochs of the pool's turnover
//! (one epoch per frames/32 evictions), not wall-clock: the value of a
//! page depends on how fast the pool turns over, not on the machine.
//!
//! **Clock** (second chance) is kept as the baseline the benchmark
//! compares against (`Options::eviction`).
//!
//! **Placement**: [`HeatSplit`] sorts page write-backs into hot and cold
//! by how long the page's last version lived on the device, the class a
//! write carries to the device (`io::placement`).
//!
//! Cost: a fix loads one word (the frame's read history) and stores it
//! only in a new epoch; a value is a few integer operations and one
//! division per history entry.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::io::Placement;

/// How the pool picks pages to evict and dirty pages to write back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Second chance: a page not fixed since the clock hand last passed is
    /// evicted (written back first if dirty).
    Clock,
    /// Write-aware timestamp tracking: among a small sample of frames the
    /// least valuable clean page is evicted, and a dirty one is written
    /// back only when it is the least valuable of its sample, paced.
    #[default]
    Watt,
}

/// Epochs recorded per history.
pub const HISTORY_LEN: u32 = 4;
/// Bits of one entry: a 12-bit epoch and a 4-bit count of accesses in it.
const ENTRY_BITS: u32 = 16;
const ENTRY_MASK: u64 = (1 << ENTRY_BITS) - 1;
const COUNT_BITS: u32 = 4;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// Epochs count modulo this (so that an epoch is never 0xFFF, and
/// `NONE` never a real entry).
pub const EPOCH_MODULUS: u64 = (1 << (ENTRY_BITS - COUNT_BITS)) - 1;
/// An empty history entry.
const NONE: u64 = ENTRY_MASK;
/// Entries at least this many epochs old are scrubbed to [`NONE`] by the
/// eviction scan, which visits every frame many times in that span, so
/// that no entry lives long enough for the epochs to wrap around it.
const SCRUB_AGE: u16 = 1 << 10;
/// A history with no access.
const EMPTY: u64 = u64::MAX;

/// Epochs from `t` to `now`, modulo [`EPOCH_MODULUS`]; 0 for an epoch
/// past `now` (more than half the modulus "old"). A batch of eviction
/// reads the clock once, and another worker's batch may move it on
/// meanwhile, recording accesses in a later epoch than this batch's
/// `now`: read as ~4,000 epochs old, they had `scrub` empty the hottest
/// pages' histories and made them the first victims (a review's finding).
/// Entries older than half the modulus do not live that long: `scrub`
/// empties them at [`SCRUB_AGE`].
fn age(now: u16, t: u16) -> u16 {
    let a = ((now as u64 + EPOCH_MODULUS - t as u64) % EPOCH_MODULUS) as u16;
    if u64::from(a) > EPOCH_MODULUS / 2 {
        0
    } else {
        a
    }
}

fn entry(h: u64, k: u32) -> u64 {
    (h >> (k * ENTRY_BITS)) & ENTRY_MASK
}

/// The last [`HISTORY_LEN`] epochs in which a frame's page was accessed,
/// each with how often (saturating at 15), newest in the low bits,
/// `NONE` where there was none. Counting accesses within an epoch is
/// what tells a node every descent passes (15 per epoch) from a leaf read
/// once just now (1): epochs are coarse, where WATT's timestamps are not.
pub struct History(AtomicU64);

impl Default for History {
    fn default() -> History {
        History(AtomicU64::new(EMPTY))
    }
}

impl History {
    /// A history with one access at `epoch` (a page just read or created)
    /// or none.
    pub fn reset(&self, epoch: Option<u16>) {
        let h = match epoch {
            Some(e) => EMPTY << ENTRY_BITS | (e as u64) << COUNT_BITS | 1,
            None => EMPTY,
        };
        self.0.store(h, Ordering::Relaxed);
    }

    /// Records an access in `epoch`; writes the word only in a new epoch
    /// or while this epoch's count is below its maximum (a hot page's
    /// fixes mostly write nothing). Concurrent records may lose one: a
    /// history is an estimate.
    #[inline]
    pub fn record(&self, epoch: u16) {
        let h = self.0.load(Ordering::Relaxed);
        let newest = h & ENTRY_MASK;
        let new = if newest >> COUNT_BITS == epoch as u64 && newest != NONE {
            if newest & COUNT_MAX == COUNT_MAX {
                return;
            }
            h + 1
        } else {
            h << ENTRY_BITS | (epoch as u64) << COUNT_BITS | 1
        };
        self.0.store(new, Ordering::Relaxed);
    }

    /// The estimated access frequency at epoch `now`, in 1/1024ths of an
    /// access per epoch: the largest `(accesses in the k newest entries)
    /// / (age of the k-th + 1)`.
    pub fn frequency(&self, now: u16) -> u32 {
        let h = self.0.load(Ordering::Relaxed);
        let mut best = 0;
        let mut accesses = 0;
        for k in 0..HISTORY_LEN {
            let e = entry(h, k);
            if e == NONE {
                break;
            }
            accesses += (e & COUNT_MAX) as u32;
            let f = (accesses << 10) / (age(now, (e >> COUNT_BITS) as u16) as u32 + 1);
            best = best.max(f);
        }
        best
    }

    /// Empties the entries older than `SCRUB_AGE` (run by the eviction
    /// scan; writes only when something changes).
    pub fn scrub(&self, now: u16) {
        let h = self.0.load(Ordering::Relaxed);
        for k in 0..HISTORY_LEN {
            let e = entry(h, k);
            if e == NONE {
                return;
            }
            if age(now, (e >> COUNT_BITS) as u16) >= SCRUB_AGE {
                // This entry and every older one go.
                let keep = if k == 0 {
                    0
                } else {
                    EMPTY >> (64 - k * ENTRY_BITS)
                };
                let _ = self.0.compare_exchange(
                    h,
                    (h & keep) | (EMPTY & !keep),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return;
            }
        }
    }
}

/// A page's value under WATT at epoch `now`: its read frequency plus its
/// write frequency weighted `write_weight` times (higher: keep longer).
pub fn watt_value(reads: &History, writes: &History, now: u16, write_weight: u32) -> u32 {
    reads
        .frequency(now)
        .saturating_add(writes.frequency(now).saturating_mul(write_weight))
}

/// Sorts page write-backs into hot and cold for placement, by how long
/// the version on the device lived: the write clock now minus the clock
/// stamped in the page when it was last written back (`page::written_at`).
/// A page rewritten soon after its last write-back is likely to be
/// rewritten soon again ([`Placement::Hot`]); one whose last version lived
/// long, or that was never written, is [`Placement::Cold`]. Grouping
/// writes by expected death time lets a flash device erase blocks whose
/// pages died together instead of copying the survivors (NoFTL's hot/cold
/// groups; ZLeanStore's grouping by death time).
///
/// The split point tracks the median life of the write-backs classified
/// (stochastic quantile tracking: up 1/64 after a longer life, down 1/64
/// after a shorter one), so that the two classes take about equal shares
/// of the writes whatever the workload's rates. The in-memory write
/// history of a frame cannot tell this: it starts again at every read, so
/// that nearly every page evicted after one update looks alike (measured:
/// no change in flash writes, `docs/PERF.md`).
#[derive(Default)]
pub struct HeatSplit {
    /// The median life estimate, in write-clock units. Updated with
    /// relaxed loads and stores: two write-backs racing lose one update
    /// of an estimate.
    split: AtomicU64,
}

impl HeatSplit {
    /// The class of a write-back whose previous version lived `life`
    /// write-clock units (`u64::MAX`: never written); moves the split
    /// toward the median.
    pub fn classify(&self, life: u64) -> Placement {
        let split = self.split.load(Ordering::Relaxed);
        let step = (split / 64).max(1);
        if life < split {
            self.split.store(split - step, Ordering::Relaxed);
            Placement::Hot
        } else {
            self.split
                .store(split.saturating_add(step), Ordering::Relaxed);
            Placement::Cold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(accesses: &[u16]) -> History {
        let h = History::default();
        h.reset(None);
        for &a in accesses {
            h.record(a);
        }
        h
    }

    /// Pages written at skewed rates (the i-th most popular at rate
    /// `(i + 1)^-1.2`, scattered over the device), each write placed by
    /// its page's last life: an FTL with a hot and a cold handle programs
    /// markedly fewer pages than one mixed stream (with this seed: 2.38 vs
    /// 3.35). With milder skew, or with the hottest pages kept out of the
    /// stream (resident in a buffer pool, as dana's are), the gain
    /// vanishes: `docs/PERF.md`, placement by write class.
    #[test]
    fn placement_by_last_life_spares_the_flash_under_skew() {
        use crate::io::ftl::{Ftl, FtlConfig};
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let run = |placed: bool| {
            let mut cfg = FtlConfig::new(64, 512, 0.07);
            cfg.handles = 3;
            let mut ftl = Ftl::new(cfg).unwrap();
            let n = ftl.logical_pages() * 9 / 10;
            let mut cum = Vec::with_capacity(n as usize);
            let mut total = 0.0;
            for i in 0..n {
                total += 1.0 / f64::from(i + 1).powf(1.2);
                cum.push(total);
            }
            for lpn in 0..n {
                ftl.write(0, lpn).unwrap();
            }
            let (split, mut last, mut rng) = (
                HeatSplit::default(),
                vec![0u64; n as usize],
                SmallRng::seed_from_u64(5),
            );
            let mut before = ftl.stats();
            for clock in 1..=8 * u64::from(n) {
                if clock == 4 * u64::from(n) {
                    before = ftl.stats();
                }
                let x = rng.gen::<f64>() * total;
                let rank = (cum.partition_point(|&c| c < x) as u64).min(u64::from(n) - 1);
                let lpn = (rank * 2_654_435_761 % u64::from(n)) as usize;
                let life = match last[lpn] {
                    0 => u64::MAX,
                    at => clock - at,
                };
                last[lpn] = clock;
                let handle = match split.classify(life) {
                    _ if !placed => 0,
                    Placement::Hot => 1,
                    _ => 2,
                };
                ftl.write(handle, lpn as u32).unwrap();
            }
            ftl.check().unwrap();
            ftl.stats().since(&before).waf()
        };
        let (mixed, placed) = (run(false), run(true));
        assert!(
            placed < mixed * 0.85,
            "placed {placed:.2} vs mixed {mixed:.2}"
        );
    }

    #[test]
    fn the_heat_split_tells_short_lives_from_long_ones() {
        let split = HeatSplit::default();
        // Pages rewritten after 1,000 clock units and pages rewritten
        // after 1,000,000, alternating: the split settles between them
        // and sorts each by it.
        for _ in 0..2_000 {
            split.classify(1_000);
            split.classify(1_000_000);
        }
        for _ in 0..64 {
            assert_eq!(split.classify(1_000), Placement::Hot);
            assert_eq!(split.classify(1_000_000), Placement::Cold);
        }
        assert_eq!(split.classify(u64::MAX), Placement::Cold, "never written");
        // A spread of lives: about half of the write-backs are hot.
        let spread = HeatSplit::default();
        let mut hot = 0;
        for i in 0..20_000u64 {
            let life = (i * 7_919) % 10_000 + 1;
            if spread.classify(life) == Placement::Hot && i >= 10_000 {
                hot += 1;
            }
        }
        assert!((4_000..6_000).contains(&hot), "{hot} of 10,000 hot");
    }

    #[test]
    fn no_access_is_worth_nothing() {
        assert_eq!(History::default().frequency(0), 0);
        assert_eq!(history(&[]).frequency(0), 0);
        assert_eq!(history(&[]).frequency(1000), 0);
        let h = History::default();
        h.reset(Some(500));
        assert_eq!(h.frequency(500), 1024);
        assert_eq!(h.frequency(501), 512);
    }

    #[test]
    fn frequent_beats_recent_once_and_old_decays() {
        let now = 100;
        // Accessed in each of the last four epochs.
        let frequent = history(&[97, 98, 99, 100]);
        // One access, this epoch.
        let once_now = history(&[100]);
        // Four accesses long ago.
        let old = history(&[10, 11, 12, 13]);
        assert!(frequent.frequency(now) >= once_now.frequency(now));
        assert!(once_now.frequency(now) > old.frequency(now));
        assert!(frequent.frequency(now) > frequent.frequency(now + 50));
    }

    #[test]
    fn accesses_within_an_epoch_count_up_to_fifteen() {
        let hot = history(&[7; 40]);
        assert_eq!(hot.frequency(7), 15 * 1024);
        let twice = history(&[7, 7]);
        assert_eq!(twice.frequency(7), 2 * 1024);
        // A node every descent passes outranks a leaf read once now.
        assert!(hot.frequency(9) > history(&[9]).frequency(9));
        let h = history(&[4, 5, 6, 7]);
        assert_eq!(h.frequency(7), 1024);
    }

    #[test]
    fn epochs_wrap() {
        let m = EPOCH_MODULUS as u16;
        let h = history(&[m - 2, m - 1, 0, 1]);
        assert_eq!(h.frequency(1), 1024);
        assert_eq!(h.frequency(3), 4 * 1024 / 6);
    }

    #[test]
    fn scrub_empties_old_entries_only() {
        let h = history(&[10, 20, 2000, 2001]);
        h.scrub(2001);
        // 10 and 20 are older than SCRUB_AGE: gone; 2000 and 2001 stay.
        assert_eq!(h.frequency(2001), 1024);
        assert_eq!(h.frequency(2003), 2 * 1024 / 4);
        let before = h.0.load(Ordering::Relaxed);
        h.scrub(2002);
        assert_eq!(h.0.load(Ordering::Relaxed), before);
        h.scrub(2001 + SCRUB_AGE);
        assert_eq!(h.frequency(2001 + SCRUB_AGE), 0);
    }

    /// Accesses recorded in an epoch after the caller's `now` (another
    /// worker's batch moved the clock on) count as new, not as thousands
    /// of epochs old: they are neither scrubbed nor scored 0.
    #[test]
    fn entries_from_a_later_epoch_count_as_now() {
        let h = history(&[98, 99, 100, 101]);
        h.scrub(100);
        assert!(h.frequency(101) > 0);
        assert!(h.frequency(100) >= history(&[97, 98, 99, 100]).frequency(100));
        assert!(history(&[101]).frequency(100) >= history(&[60]).frequency(100));
    }

    #[test]
    fn writes_weigh_more() {
        let r = history(&[99, 100]);
        let none = history(&[]);
        let w = history(&[99, 100]);
        assert!(watt_value(&none, &w, 100, 4) > watt_value(&r, &none, 100, 4));
        assert_eq!(watt_value(&r, &none, 100, 4), r.frequency(100));
    }
}
