//! Which open segment a write of an out-of-place device goes to: its
//! groups (#14 item 2, "grouped by expected death time").
//!
//! Owns: the grouping policies ([`Grouping`]), the stream (open segment)
//! each policy gives an engine write or a collection copy, and the
//! running estimate of how long a page version lives on the device, from
//! which death-time grouping sorts its writes.
//!
//! Never: changes what is written, where a page reads from, or what a
//! summary says: a wrong guess costs collection copies, never data. Never
//! looks at the device: everything it needs (a version's birth, the
//! device's clock) is in the map's entries.
//!
//! # Death-time grouping (the default)
//! A segment is cheapest to collect when its extents die together, and a
//! page's past is a fair guess at its future (SepBIT, FAST 2022;
//! ZLeanStore's grouping by death time, PVLDB 19). Time is the device's
//! clock: one tick per completed write. Each extent keeps its *birth*,
//! the tick its page's bytes were first written by the engine, through
//! the collection's copies (in memory only: after a reopen an extent's
//! birth is its stamp).
//! - An engine write replaces a version that lived `life` ticks. When
//!   `life` is below `mean`, the running mean life of the versions engine
//!   writes replaced, the new version is expected to die young too
//!   (stream SHORT), else LONG. A page with no version yet (a new tree
//!   page) and the pages of large values (written once, freed whole) go
//!   to LONG too (nothing says they die soon).
//! - Stream 0 takes no data: its handle is the device's own (summaries,
//!   intents, rewritten in place at every barrier), so that no erase
//!   block of an FTL below mixes them with a segment's data (the first
//!   version grouped new pages there, and the FTL below copied 5-10x more
//!   pages on TPC-C).
//! - A collection copy is a survivor: the older it is, the longer it is
//!   expected to live on (the age a version reached predicts its
//!   remaining life under skew). Copies younger than `4 * mean` go to
//!   COPY_YOUNG, younger than `16 * mean` to COPY_OLD, the rest to
//!   COPY_OLDEST (SepBIT's thresholds).
//!
//! # Grouping by class
//! [`Grouping::Classes`] keeps the buffer pool's write classes (hot and
//! cold pages by write-back frequency, large values, unsorted) and puts
//! every copy in one stream: the grouping before death time, kept to
//! compare (`dana bench waf --oop-grouping`).
//!
//! # Costs
//! 8 bytes per extent in memory (the birth), one lookup of the page's
//! current extent per write (under the map's lock, which the write takes
//! anyway), and a floating-point update per replaced version.

use super::super::placement::PLACEMENTS;
use super::super::Placement;

/// Streams: the device's open segments, one per stream. Their writes go
/// out with the placement handle of the same number
/// ([`super::super::placement::PLACEMENTS`]), so that an FTL or FDP
/// device below keeps each stream in its own erase blocks; on a device
/// grouped by death time the handles are only told apart, their class
/// names do not apply.
pub(crate) const STREAMS: usize = PLACEMENTS.len();

/// Death time: a page whose replaced version died younger than the mean.
const SHORT: usize = 1;
/// Death time: a page whose replaced version lived the mean or longer, a
/// page with no earlier version, and large values.
const LONG: usize = 2;
/// Death time: copies younger than `4 * mean`.
const COPY_YOUNG: usize = 3;
/// Death time: copies younger than `16 * mean`.
const COPY_OLD: usize = 4;
/// Death time: older copies.
const COPY_OLDEST: usize = 5;
/// Classes: the collection's copies.
const COPIES_BY_CLASS: usize = Placement::Collected.index() as usize;

const _: () = assert!(COPY_OLDEST < STREAMS && COPIES_BY_CLASS < STREAMS);

/// Weight of one replaced version's life in the running mean: the mean
/// follows the last few thousand replacements.
const MEAN_WEIGHT: f64 = 1.0 / 2048.0;

/// How an out-of-place device sorts its writes into open segments
/// ([`super::Remap::set_grouping`]; not kept on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Grouping {
    /// By expected death time, from each page's past lives (see the
    /// module documentation).
    #[default]
    DeathTime,
    /// By the buffer pool's write class, every collection copy in one
    /// stream.
    Classes,
}

/// A device's grouping and its running estimate of a version's life.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Groups {
    pub grouping: Grouping,
    /// Mean life, in ticks, of the versions engine writes replaced (0:
    /// none seen yet).
    mean: f64,
}

impl Groups {
    /// The stream of an engine write of class `placement` whose page's
    /// current version was born at tick `born` (None: the page has none).
    pub fn of_write(&self, placement: Placement, born: Option<u64>, now: u64) -> usize {
        match self.grouping {
            Grouping::Classes => class_stream(placement),
            Grouping::DeathTime => match born {
                _ if placement == Placement::Large => LONG,
                None => LONG,
                Some(b) if (now.saturating_sub(b) as f64) < self.mean => SHORT,
                Some(_) => LONG,
            },
        }
    }

    /// The stream of a collection copy of a version born at tick `born`.
    pub fn of_copy(&self, born: u64, now: u64) -> usize {
        match self.grouping {
            Grouping::Classes => COPIES_BY_CLASS,
            Grouping::DeathTime => {
                let age = now.saturating_sub(born) as f64;
                if age < 4.0 * self.mean {
                    COPY_YOUNG
                } else if age < 16.0 * self.mean {
                    COPY_OLD
                } else {
                    COPY_OLDEST
                }
            }
        }
    }

    /// An engine write replaced a version that lived `life` ticks.
    pub fn replaced(&mut self, life: u64) {
        let life = life as f64;
        self.mean = if self.mean == 0.0 {
            life.max(1.0)
        } else {
            self.mean + (life - self.mean) * MEAN_WEIGHT
        };
    }

    /// The running mean life of replaced versions (0: none seen yet).
    pub fn mean_life(&self) -> f64 {
        self.mean
    }
}

/// The stream of a placement class.
pub(crate) fn class_stream(p: Placement) -> usize {
    PLACEMENTS.iter().position(|&c| c == p).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn death_time_sorts_writes_by_their_pages_past_lives() {
        let mut g = Groups::default();
        // Nothing seen yet: every replaced version counts as long-lived.
        assert_eq!(g.of_write(Placement::Hot, Some(90), 100), LONG);
        g.replaced(100);
        assert_eq!(g.mean_life(), 100.0);
        assert_eq!(g.of_write(Placement::Cold, Some(950), 1_000), SHORT);
        assert_eq!(g.of_write(Placement::Hot, Some(800), 1_000), LONG);
        assert_eq!(g.of_write(Placement::Hot, None, 1_000), LONG);
        assert_eq!(g.of_write(Placement::Large, Some(999), 1_000), LONG);
        assert_eq!(g.of_copy(900, 1_000), COPY_YOUNG);
        assert_eq!(g.of_copy(0, 1_000), COPY_OLD);
        assert_eq!(g.of_copy(0, 10_000), COPY_OLDEST);
        // The mean follows new lives slowly.
        g.replaced(100 + 2048);
        assert!((g.mean_life() - 101.0).abs() < 1e-9);
    }

    #[test]
    fn classes_keep_the_pools_classes_and_one_copy_stream() {
        let g = Groups {
            grouping: Grouping::Classes,
            mean: 10.0,
        };
        assert_eq!(
            g.of_write(Placement::Hot, Some(0), 1),
            class_stream(Placement::Hot)
        );
        assert_eq!(
            g.of_write(Placement::Cold, None, 1),
            class_stream(Placement::Cold)
        );
        assert_eq!(g.of_copy(0, 1_000_000), COPIES_BY_CLASS);
        let streams: std::collections::HashSet<usize> =
            PLACEMENTS.iter().map(|&p| class_stream(p)).collect();
        assert_eq!(streams.len(), STREAMS);
    }
}
