//! Out-of-place page writes: a device whose pages keep their logical
//! address while every write lands in a fresh extent of an append-only
//! segment (ZLeanStore, NoFTL's regions; #14 items 2 and 3).
//!
//! Owns: the page-to-extent map of one device, its segments (written in
//! order, then collected by live fraction), the segment summaries that
//! make the map crash safe, the barrier that makes completed writes and
//! their map entries durable together, the collection of segments
//! (greedy: fewest live units first), the grouping of writes into open
//! segments (by expected death time, `remap/group.rs`), the unmapping of
//! pages the engine trims ([`Remap::discard`]), and, on a compressed device, the
//! packing of compressed pages at [`PACK_UNIT`] granularity. dana's engine
//! above sees a plain device of [`Remap::size`] bytes (fewer than the
//! device holds: the summaries, a label and the spare the collection
//! works in).
//!
//! Never: overwrites the extent that holds a page's last durable version
//! (so a torn write cannot destroy a good page), reuses a segment while
//! the durable summaries may still name one of its extents as a page's
//! newest version, or while a read of one of its extents is in flight, or
//! names an extent in a summary before its data is durable.
//!
//! # Layout (see docs/FORMAT.md, "Out-of-place devices")
//! The device is cut into segments of `segment_pages` pages. Segment 0
//! holds the label (page 0) and the two copies of the barriers' intent. Every other segment starts
//! with its two summary copies (one page each, or a few on a compressed
//! device) and the rest is its data area, cut in *units*: a page on a
//! plain device, 512 bytes on a compressed one. Each write takes an
//! *extent* of whole units, in order: one page, or a compressed page
//! padded to its unit (a page that does not shrink by a unit is stored
//! whole). A summary lists, for each extent handed out, its first unit,
//! its units, the logical page it holds once its write completed, and the
//! *stamp* of its map update (a counter of the device, increasing in the
//! order the writes completed); summaries alternate between the two copies
//! and carry a version (from the same counter), so a torn summary leaves
//! the one before it readable.
//!
//! # Packing (compressed devices)
//! A worker's queue reserves a *chunk* of its stream's open segment (8
//! flash pages, 4 KiB each, aligned to them), packs the pages it is asked
//! to write into it, and writes it whole when the engine submits (or when
//! it is full), so the flash below only ever sees whole 4 KiB pages; an
//! unused tail goes back to the segment when nothing was reserved after
//! it. The collection packs the extents it copies the same way, without
//! recompressing them. A compressed extent is a 4-byte length and an LZ4
//! block (`remap/pack.rs`).
//!
//! # Crash safety
//! A barrier (each flush the engine asks for, and each durable write)
//! writes an *intent* naming the segments that changed, flushes the
//! device (every completed data write, and the intent, are durable),
//! writes those segments' summaries, and flushes again. Opening reads
//! every segment's newer valid summary and maps each logical page to the
//! extent with its highest stamp. A summary copy that does not read back
//! is one a crash cut only if the newest intent names its segment;
//! otherwise it is damage and the open fails (`Corrupt`), since the pages
//! a damaged newest summary named would silently read as older versions.
//! [`Remap::close`] writes an intent naming nothing, so that after a clean
//! close every damaged summary is caught. A segment is freed only after a
//! barrier that followed the death of its last live extent: the durable
//! summaries then name a newer extent for every page it held, so its old
//! summary, still on the device until the segment's next summary
//! overwrites it, only names versions that lose. A write that completed
//! after the last barrier may be lost at a crash (the page reads as its
//! version before), as an unflushed in-place write may; it is never torn.
//!
//! # Costs
//! DRAM: 8 bytes per logical page (the map) and 32 bytes per extent of
//! the segments (their summaries' entries, and each extent's birth for
//! the grouping): 40 bytes per page on a plain device, 1% of a 4 KiB-page device (more extents per page of flash
//! when compressed). Device: 1 label segment, 2 summary copies per
//! segment (1.6% at 128 pages; 3.1% when compressed, which lists more
//! extents) and the spare. Each barrier: 2 flushes and one summary per
//! segment written since the last. Compression: one LZ4 pass per page
//! written and one per compressed page read, on the calling worker, and a
//! copy into the chunk. Collection, barriers and opening run on a queue
//! of the device's own (io_uring on a file), blocking the thread that
//! calls them: the collection runs ahead of the writes on a thread of the
//! device's own once [`Remap::start_collector`] started it
//! (`remap/collector.rs`), else on the worker whose write finds only the
//! collection's reserve free (as it still does when that thread falls
//! behind); a barrier runs where the engine flushes (its checkpoints).
//! The engine's reads and writes never block on them unless the free
//! segments run out.

mod collector;
mod group;
pub(crate) mod pack;
mod queue;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::array::{open_queue, Backend, Target};
pub use super::ftl::GcPolicy;
use super::{sync_io, AlignedBuf, Alignment, IoBuf, IoQueue, Placement, Request, ReusableBuf};
use crate::{Error, Result};

pub use collector::Collector;
use collector::{Signal, Watermarks};
pub use group::Grouping;
use group::Groups;
pub use queue::RemapQueue;

/// The label's magic: an out-of-place device, format 3 (extents, and
/// the intents of barriers).
const LABEL_MAGIC: &[u8; 8] = b"DANAOOP3";
/// Labels of earlier formats (1: one page per slot; 2: extents without
/// intents), which this build does not read.
const OLD_LABEL_MAGICS: [&[u8; 8]; 2] = [b"DANAOOP1", b"DANAOOP2"];
/// An intent's magic.
const INTENT_MAGIC: &[u8; 8] = b"DANAINT1";
/// Bytes of an intent's header: magic, crc, count, number.
const INTENT_HEADER: usize = 24;
/// A summary's magic.
const SUMMARY_MAGIC: &[u8; 8] = b"DANASUM2";
/// Bytes of a summary's header: magic, crc, segment, count, stream,
/// version.
const SUMMARY_HEADER: usize = 32;
/// Bytes of one summary entry: logical page (40 bits), stamp (56 bits),
/// first unit (16 bits), units - 1 (8 bits), a zero byte.
const ENTRY_BYTES: usize = 16;
/// An extent that holds no page (its write lost a race with a newer one,
/// failed, or has not completed).
const NO_PAGE: u64 = u64::MAX;
/// How an entry writes [`NO_PAGE`] in its 40 bits.
const NO_PAGE_40: u64 = (1 << 40) - 1;
/// Logical pages an out-of-place device offers at most (an entry's page
/// has 40 bits, the all-ones value meaning none): 4 PiB of 4 KiB pages.
const MAX_PAGES: u64 = NO_PAGE_40;
/// Summary copies at the head of each data segment.
const SUMMARY_COPIES: u64 = 2;
/// The flash page: chunks start and end on its boundaries.
const FLASH_PAGE: u64 = 4096;
/// The unit compressed pages are packed in (and padded to).
pub const PACK_UNIT: u32 = 512;
/// Flash pages a queue's chunk reserves at a time.
const CHUNK_FLASH_PAGES: u32 = 8;
/// The open segments: one per stream of the device's grouping
/// (`remap/group.rs`).
const OPEN_SEGMENTS: usize = group::STREAMS;
/// Free segments kept for the collection: writes of the engine wait when
/// only these are left.
const GC_RESERVE: usize = 2;
/// How long the collection waits for reads in flight on other workers'
/// queues that pin the segments it emptied.
const PIN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
/// Segments a run of the collection frees beyond what it was asked for.
const GC_BATCH: usize = 4;
/// Marks a segment an intent names as one being trimmed (freed): a trim
/// cut by a crash, or one that failed part way, may have zeroed part of
/// a summary copy, so the open takes any copy of it that does not read
/// back for none (the segment was dead), never for damage.
const TRIM_BIT: u32 = 1 << 31;

/// How an out-of-place device is cut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RemapConfig {
    /// Page size: the engine's (every request is whole pages).
    pub page_size: u32,
    /// Pages per segment, summaries included: the device's erase unit (or
    /// FDP reclaim unit) in pages, so that a segment dies whole on the
    /// flash. 8..=the pages one summary can list + 2 (plain), 16..=65536
    /// units (compressed).
    pub segment_pages: u32,
    /// Fraction of the data area kept free beyond the open segments and
    /// the collection's reserve: the room the collection works in.
    pub spare: f64,
    /// Compress each page written (LZ4) and pack it at [`PACK_UNIT`]
    /// granularity (#14 item 3). Needs a device whose direct I/O works in
    /// 512-byte sectors and pages of at most 128 KiB.
    pub compress: bool,
}

impl Default for RemapConfig {
    fn default() -> Self {
        RemapConfig {
            page_size: 4096,
            segment_pages: 128,
            spare: 0.05,
            compress: false,
        }
    }
}

impl RemapConfig {
    fn check(&self) -> Result<()> {
        let page = self.page_size as usize;
        if !self.page_size.is_power_of_two() || page < 4096 {
            return Err(Error::InvalidArgument(format!(
                "out-of-place page size {page}: a power of two >= 4096"
            )));
        }
        if self.compress && page / PACK_UNIT as usize > 256 {
            return Err(Error::InvalidArgument(format!(
                "compressed out-of-place pages of {page} bytes: at most 128 KiB"
            )));
        }
        if self.segment_pages < 8 {
            // Before the geometry, whose sums need room for the summaries
            // and an intent (a label naming 0 to 2 pages panicked there).
            return Err(Error::InvalidArgument(format!(
                "out-of-place segments of {} pages: at least 8",
                self.segment_pages
            )));
        }
        let g = Geometry::of(self);
        let most = (page - SUMMARY_HEADER) / ENTRY_BYTES + SUMMARY_COPIES as usize;
        let fits = if self.compress {
            self.segment_pages as u64 >= 16
                && g.data_units as u64 >= 8 * g.upp as u64
                && g.data_units <= 1 << 16
        } else {
            self.segment_pages >= 8
                && self.segment_pages as usize <= most
                && g.data_units <= 1 << 16
        };
        if !fits {
            let range = if self.compress {
                format!("16 to {}", (1u64 << 16) / g.upp as u64)
            } else {
                format!("8 to {most}")
            };
            return Err(Error::InvalidArgument(format!(
                "out-of-place segments of {} pages: {range} with {page}-byte pages",
                self.segment_pages
            )));
        }
        if !(0.0..0.9).contains(&self.spare) {
            return Err(Error::InvalidArgument(format!(
                "out-of-place spare {}: from 0 to 0.9",
                self.spare
            )));
        }
        Ok(())
    }
}

/// The shape of a segment, derived from a [`RemapConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    page: u64,
    seg_pages: u64,
    /// Bytes of a unit: a page (plain) or [`PACK_UNIT`] (compressed).
    unit: u64,
    /// Units per page.
    upp: u32,
    /// Pages of one summary copy.
    summary_pages: u64,
    /// Units of a segment's data area.
    data_units: u32,
    /// Extents a segment may hold: what one summary copy lists.
    entry_cap: u32,
    /// Units per flash page (a chunk's alignment).
    align_units: u32,
    /// Pages of one intent copy (two copies after the label, in segment 0).
    intent_pages: u64,
    /// Segments one intent names at most.
    intent_cap: u32,
}

impl Geometry {
    fn of(c: &RemapConfig) -> Geometry {
        let page = c.page_size as u64;
        let seg = c.segment_pages as u64;
        let unit = if c.compress { PACK_UNIT as u64 } else { page };
        let upp = (page / unit) as u32;
        let cap_of = |sp: u64| ((sp * page) as usize - SUMMARY_HEADER) as u64 / ENTRY_BYTES as u64;
        let data_of = |sp: u64| seg.saturating_sub(SUMMARY_COPIES * sp) * upp as u64;
        let mut sp = 1;
        // Compressed: a summary lists extents of a third of a page on
        // average (a page compressed 2.7 times) before it runs out of
        // room; a segment that runs out closes with units left over.
        // Bounded by the segment's pages.
        while c.compress && cap_of(sp) * 3 < data_of(sp) && SUMMARY_COPIES * (sp + 1) < seg {
            sp += 1;
        }
        let data_units = data_of(sp).min(u32::MAX as u64) as u32;
        Geometry {
            page,
            seg_pages: seg,
            unit,
            upp,
            summary_pages: sp,
            data_units,
            entry_cap: (cap_of(sp).min(data_units as u64)) as u32,
            align_units: (FLASH_PAGE / unit).max(1) as u32,
            intent_pages: (seg - 1) / 2,
            intent_cap: (((seg - 1) / 2 * page) as usize - INTENT_HEADER) as u32 / 4,
        }
    }

    /// Where intent copy `copy` starts.
    fn intent_at(&self, copy: u8) -> u64 {
        (1 + copy as u64 * self.intent_pages) * self.page
    }

    /// Bytes of one summary copy.
    fn summary_bytes(&self) -> usize {
        (self.summary_pages * self.page) as usize
    }

    /// Where summary copy `copy` of data segment `s` starts.
    fn summary_at(&self, s: u32, copy: u8) -> u64 {
        ((s as u64 + 1) * self.seg_pages + copy as u64 * self.summary_pages) * self.page
    }

    /// Where unit `start` of data segment `s`'s data area starts.
    fn extent_at(&self, s: u32, start: u32) -> u64 {
        ((s as u64 + 1) * self.seg_pages + SUMMARY_COPIES * self.summary_pages) * self.page
            + start as u64 * self.unit
    }

    /// `units` rounded up to whole flash pages.
    fn align_up(&self, units: u32) -> u32 {
        units.div_ceil(self.align_units) * self.align_units
    }
}

/// Where a segment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Free: may be opened.
    Free,
    /// Taking writes (of one class, or of the collection).
    Open,
    /// Full (of units or extents), with live extents or writes pending;
    /// open again if the chunk at its end gives back a tail while its
    /// stream has no open segment ([`Remap::release_chunk`]).
    Closed,
    /// No live extent left: free after the next barrier that starts later.
    Dying { barrier: u64 },
}

/// One extent of a segment, as its summary lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// The logical page, once its write completed (else [`NO_PAGE`]).
    page: u64,
    /// The stamp of its map update.
    stamp: u64,
    /// The stamp its page's bytes were written with by the engine (kept
    /// through the collection's copies; in memory only: the stamp, after
    /// a reopen), for death-time grouping.
    born: u64,
    /// First unit in the segment's data area.
    start: u32,
    /// Units.
    units: u32,
}

/// One segment's state in memory.
#[derive(Debug, Clone)]
struct Segment {
    life: Life,
    /// Units of the extents whose page the map points at (none: no live
    /// extent).
    live_units: u32,
    /// The next unit of the data area to hand out.
    next: u32,
    /// Writes (and chunks) handed out here and not ended yet.
    pending: u32,
    /// Reads of its extents in flight.
    readers: u32,
    /// The extents handed out, in order.
    entries: Vec<Entry>,
    /// Changed since its last summary.
    dirty: bool,
    /// The summary copy its next summary goes to (0 or 1).
    summary_slot: u8,
    /// The open-segment stream it was opened for.
    stream: u8,
    /// The stamp of its newest extent's write (its data's youngest age,
    /// for the cost-benefit collection).
    written: u64,
    /// A copy of its summary may be cut (by a crash before this open, or
    /// a failed barrier round): every intent names it until a round writes
    /// its summary whole.
    suspect: bool,
    /// Summaries encoded for it so far: a barrier owes one to every
    /// segment dirty when it started, paid once this count moves.
    summaries: u64,
    /// A read of its live extents failed in a collection: it is not a
    /// victim again until it is free (it still dies as its pages are
    /// written again). Picked again, one unreadable extent failed every
    /// collection, and then every write once the free segments ran out
    /// (a review's finding).
    copy_failed: bool,
}

impl Segment {
    fn new() -> Segment {
        Segment {
            life: Life::Free,
            live_units: 0,
            next: 0,
            pending: 0,
            readers: 0,
            entries: Vec::new(),
            dirty: false,
            summary_slot: 0,
            stream: 0,
            written: 0,
            summaries: 0,
            suspect: false,
            copy_failed: false,
        }
    }
}

/// Counters of an out-of-place device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemapStats {
    /// Pages written by the engine (each to a new extent).
    pub page_writes: u64,
    /// Bytes those pages took on the device (compressed and padded to the
    /// unit; a page each on a plain device).
    pub stored_bytes: u64,
    /// Extents copied by the collection.
    pub gc_copies: u64,
    /// Segments freed.
    pub segments_freed: u64,
    /// Freed segments the device was told to trim.
    pub segments_trimmed: u64,
    /// Summary copies written.
    pub summary_writes: u64,
    /// Barriers run.
    pub barriers: u64,
    /// Times a write found no free segment and ran the collection itself.
    pub write_stalls: u64,
    /// Runs of the background collection ([`Remap::start_collector`])
    /// that found too few free segments and collected.
    pub background_runs: u64,
    /// Steps of the background collection that failed (the writes that
    /// need the room then collect for themselves, and return the error).
    pub background_failures: u64,
    /// Pages unmapped by discards ([`Remap::discard`]: the engine's trims
    /// of freed pages).
    pub pages_unmapped: u64,
    /// Summary copies the last open found unreadable in segments its
    /// newest intent named as being trimmed, and took for none (a trim cut
    /// by the crash, or one that failed part way).
    pub trim_cut_copies: u64,
}

impl RemapStats {
    /// The counts since `earlier` (a snapshot of the same device).
    pub fn since(&self, earlier: &RemapStats) -> RemapStats {
        self.zip(earlier, |a, b| a - b)
    }

    /// The counts of this device and `other` together.
    pub fn plus(&self, other: &RemapStats) -> RemapStats {
        self.zip(other, |a, b| a + b)
    }

    fn zip(&self, o: &RemapStats, f: impl Fn(u64, u64) -> u64) -> RemapStats {
        RemapStats {
            page_writes: f(self.page_writes, o.page_writes),
            stored_bytes: f(self.stored_bytes, o.stored_bytes),
            gc_copies: f(self.gc_copies, o.gc_copies),
            segments_freed: f(self.segments_freed, o.segments_freed),
            segments_trimmed: f(self.segments_trimmed, o.segments_trimmed),
            summary_writes: f(self.summary_writes, o.summary_writes),
            barriers: f(self.barriers, o.barriers),
            write_stalls: f(self.write_stalls, o.write_stalls),
            background_runs: f(self.background_runs, o.background_runs),
            background_failures: f(self.background_failures, o.background_failures),
            pages_unmapped: f(self.pages_unmapped, o.pages_unmapped),
            trim_cut_copies: f(self.trim_cut_copies, o.trim_cut_copies),
        }
    }
}

/// Where a logical page's newest version lies (a read pins its segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Its name in the map (segment and entry).
    pub loc: u64,
    /// Byte offset on the device underneath.
    pub at: u64,
    /// Bytes (whole units).
    pub len: usize,
    /// A compressed page (else the page's own bytes).
    pub packed: bool,
}

/// A page placed in a [`Chunk`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    /// The logical page.
    pub page: u64,
    /// Its new extent.
    pub loc: u64,
    /// The placer's own note (a queue: which request and page; the
    /// collection: the extent it copies from).
    pub owner: u64,
}

/// A run of a segment's units that one writer packs extents into and
/// writes whole.
pub(crate) struct Chunk {
    seg: u32,
    start: u32,
    units: u32,
    used: u32,
    stream: usize,
    /// The collection's copies (each placed page's `owner` is the extent
    /// it was copied from), not the engine's writes.
    copies: bool,
    /// Its bytes: filled while it is open, then lent to its write (a
    /// prefix: the flash pages it used).
    buf: ReusableBuf,
    pub placed: Vec<Placed>,
}

impl Chunk {
    /// The placement class its write goes out with.
    pub fn placement(&self) -> Placement {
        super::placement::PLACEMENTS[self.stream]
    }
}

/// A segment and entry as the map names them.
fn loc(s: u32, k: u32) -> u64 {
    (s as u64) << 32 | k as u64
}

/// The segment and entry of a map value.
fn unloc(l: u64) -> (u32, u32) {
    ((l >> 32) as u32, l as u32)
}

/// The shared state of an out-of-place device, behind one lock.
#[derive(Debug)]
struct State {
    /// Logical page -> extent ([`loc`]; NO_PAGE: never written).
    map: Vec<u64>,
    segments: Vec<Segment>,
    free: VecDeque<u32>,
    /// Segments with no live extent, waiting for a barrier (`Life::Dying`).
    dying: Vec<u32>,
    /// Segments whose trim may have left a summary copy part zeroed, named
    /// ([`TRIM_BIT`]) by every intent until that cannot be any more: true
    /// once the trim returned (until a flush makes it durable), false while
    /// it failed or has not run (until both copies hold a summary naming
    /// nothing, or a trim returns). At most half an intent's worth.
    trimming: Vec<(u32, bool)>,
    /// The segments the newest durable intent names as being trimmed.
    trims_named: Vec<u32>,
    /// The open segment of each stream.
    open: [Option<u32>; OPEN_SEGMENTS],
    /// The next stamp or summary version.
    clock: u64,
    /// Barriers started so far.
    barriers_started: u64,
    /// The intent copy the next intent goes to (0 or 1).
    intent_slot: u8,
    /// How the collection picks its victims.
    gc: GcPolicy,
    /// How writes are sorted into open segments.
    groups: Groups,
    stats: RemapStats,
}

/// An out-of-place device over a file, block device or simulated device.
pub struct Remap {
    inner: Target,
    config: RemapConfig,
    geo: Geometry,
    /// Data segments (segment 0, the label's, is not one).
    segments: u64,
    /// Logical pages offered to the engine.
    pages: u64,
    state: Mutex<State>,
    /// The device's own queue: barriers, collection, summaries. Held for a
    /// whole barrier or a worker's collection run (the background
    /// collection's step), so they run one at a time.
    own: Mutex<Box<dyn IoQueue>>,
    /// The background collection's signal, while one runs (or until
    /// another starts).
    collector: Mutex<Option<Arc<Signal>>>,
    /// Fewer free segments than this wake the background collection (0:
    /// none runs).
    low_water: AtomicUsize,
    /// The open found the mark of a clean close ([`Remap::close`]): the
    /// newest intent named no segment.
    clean_at_open: AtomicBool,
}

impl std::fmt::Debug for Remap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remap")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("segments", &self.segments)
            .field("pages", &self.pages)
            .finish_non_exhaustive()
    }
}

impl Remap {
    /// Formats `inner` as a new, empty out-of-place device and opens it.
    /// Its size must hold the label's segment and at least
    /// `OPEN_SEGMENTS + GC_RESERVE + 2` data segments.
    pub fn create(inner: Target, config: RemapConfig) -> Result<Arc<Remap>> {
        config.check()?;
        let remap = Remap::new(inner, config, None)?;
        let mut q = remap.own_queue();
        // Old summaries of whatever the device held before must not be
        // taken for this device's: every summary copy gets zeros, a batch
        // of fresh (zeroed) buffers at a time.
        let copies: Vec<u64> = (0..remap.segments as u32)
            .flat_map(|s| (0..SUMMARY_COPIES as u8).map(move |k| (s, k)))
            .map(|(s, k)| remap.geo.summary_at(s, k))
            .collect();
        // And so must old intents.
        let intents = (0..2u8)
            .map(|k| Ok((remap.geo.intent_at(k), remap.intent_copy_buf()?)))
            .collect::<Result<Vec<_>>>()?;
        write_all(&mut **q, intents.into_iter())?;
        for batch in copies.chunks(128) {
            let zeros = batch
                .iter()
                .map(|&at| Ok((at, remap.summary_buf()?)))
                .collect::<Result<Vec<_>>>()?;
            write_all(&mut **q, zeros.into_iter())?;
        }
        // The label last, once the zeros are durable: a crash before it
        // leaves no device (a labelled device over old summaries would
        // adopt them).
        flush(&mut **q)?;
        let mut label = remap.page_buf()?;
        encode_label(&mut label, &config, remap.pages);
        write_all(&mut **q, std::iter::once((0, label)))?;
        flush(&mut **q)?;
        drop(q);
        Ok(Arc::new(remap))
    }

    /// Opens the out-of-place device `inner` formatted by
    /// [`Remap::create`]: reads its label and every segment's summaries
    /// and rebuilds the map (the newest durable version of each page).
    pub fn open(inner: Target) -> Result<Arc<Remap>> {
        let align = inner.alignment();
        let probe_len = (align.io.max(align.mem) as usize).max(4096);
        let mut q = open_queue(&inner, &Backend::Blocking, 64)?;
        let buf = IoBuf::owned(AlignedBuf::new(probe_len, align.mem as usize)?);
        let buf = read_at(&mut *q, 0, buf)?;
        let head = buf.as_owned().expect("an owned buffer");
        let config = decode_label(head)?;
        drop(q);
        let remap = Remap::new(inner, config.0, Some(config.1))?;
        remap.recover()?;
        Ok(Arc::new(remap))
    }

    /// True if `inner` holds an out-of-place device's label (of any
    /// format: opening one this build does not read fails clearly).
    /// [`Error::Corrupt`] if it holds a label whose magic is damaged (the
    /// rest of the label still matches its checksum, which does not cover
    /// the magic): taken for no label, the file was opened as an in-place
    /// one, its raw pages read, and written, as the tree's (a review's
    /// finding).
    pub fn is_formatted(inner: &Target) -> Result<bool> {
        let align = inner.alignment();
        if inner.size() < 4096 {
            return Ok(false);
        }
        let mut q = open_queue(inner, &Backend::Blocking, 1)?;
        let len = (align.io.max(align.mem) as usize).max(4096);
        let buf = IoBuf::owned(AlignedBuf::new(len, align.mem as usize)?);
        let buf = read_at(&mut *q, 0, buf)?;
        let Some(b) = buf.as_owned() else {
            return Ok(false);
        };
        if &b[..8] == LABEL_MAGIC || OLD_LABEL_MAGICS.iter().any(|m| &b[..8] == *m) {
            return Ok(true);
        }
        if label_checksum_matches(b) {
            return Err(Error::Corrupt {
                page: 0,
                what: format!(
                    "out-of-place label: its magic is damaged ({:02x?}) while the rest \
                     matches its checksum; the file is not opened as an in-place one",
                    &b[..8]
                ),
            });
        }
        Ok(false)
    }

    fn new(inner: Target, config: RemapConfig, pages: Option<u64>) -> Result<Remap> {
        config.check()?;
        let geo = Geometry::of(&config);
        let page = geo.page;
        let seg = geo.seg_pages;
        let align = inner.alignment();
        if page % align.io != 0 || page % align.mem != 0 || geo.unit % align.io != 0 {
            return Err(Error::InvalidArgument(format!(
                "out-of-place {} of {} bytes is not a multiple of the device's alignment {}{}",
                if config.compress { "unit" } else { "page" },
                geo.unit,
                align.io.max(align.mem),
                if config.compress {
                    " (compressed pages, Options::compress_pages, need a device that takes \
                     direct I/O in 512-byte units)"
                } else {
                    ""
                }
            )));
        }
        let segments = (inner.size() / page / seg).saturating_sub(1);
        let least = (OPEN_SEGMENTS + GC_RESERVE + 2) as u64;
        if segments < least {
            let what = format!(
                "an out-of-place device needs at least {} segments of {} bytes; {} bytes hold {}",
                least + 1,
                seg * page,
                inner.size(),
                segments + 1
            );
            // An existing device (its label names its pages) this small
            // was cut short since: damage, not the caller's argument (an
            // outside probe's finding: `InvalidArgument` for a truncated
            // file).
            return Err(match pages {
                Some(_) => Error::Corrupt {
                    page: 0,
                    what: format!("{what}: the file was cut short since its creation"),
                },
                None => Error::InvalidArgument(what),
            });
        }
        // Logical pages: as many as the data areas hold uncompressed, so
        // that any data fits; compression leaves the collection more room.
        let slots = geo.data_units as u64 / geo.upp as u64;
        let offered_by = |segments: u64| {
            let usable = (segments - (OPEN_SEGMENTS + GC_RESERVE) as u64) * slots;
            (((usable as f64) * (1.0 - config.spare)) as u64).min(MAX_PAGES)
        };
        let offered = offered_by(segments);
        // An existing device: only the segments it was created with hold
        // anything (the fewest that offer its label's pages, or a few
        // more where a segment adds less than a page to the offer: the
        // slack covers them). A file extended since (`truncate -s 16T`)
        // must not make the open allocate a segment table for the whole
        // extension (64 GiB at 16 TiB: the first version aborted there).
        let segments = match pages {
            Some(p) if p <= offered => {
                let (mut lo, mut hi) = (least, segments);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if offered_by(mid) >= p {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                let slack = (1.0 / (slots as f64 * (1.0 - config.spare))).ceil() as u64 + 1;
                lo.saturating_add(slack).min(segments)
            }
            _ => segments,
        };
        let pages = match pages {
            Some(p) if p > offered => {
                return Err(Error::Corrupt {
                    page: 0,
                    what: format!(
                        "out-of-place label: {p} pages on a device that offers {offered}"
                    ),
                })
            }
            Some(p) => p,
            None => offered,
        };
        // io_uring where the host allows it (a victim's extents read at
        // once), else one syscall per request. The queue is shared under
        // a mutex by whichever thread collects or opens: a ring with
        // deferred task work answers only its first thread (`uring.rs`).
        let shared = Backend::Uring(super::uring::UringOptions {
            defer_taskrun: false,
            ..Default::default()
        });
        let own = open_queue(&inner, &shared, 256)
            .or_else(|_| open_queue(&inner, &Backend::Blocking, 256))?;
        let state = State {
            map: vec![NO_PAGE; pages as usize],
            segments: (0..segments).map(|_| Segment::new()).collect(),
            free: (0..segments as u32).collect(),
            dying: Vec::new(),
            trimming: Vec::new(),
            trims_named: Vec::new(),
            open: [None; OPEN_SEGMENTS],
            clock: 1,
            barriers_started: 0,
            intent_slot: 0,
            gc: GcPolicy::Greedy,
            groups: Groups::default(),
            stats: RemapStats::default(),
        };
        Ok(Remap {
            inner,
            config,
            geo,
            segments,
            pages,
            state: Mutex::new(state),
            own: Mutex::new(own),
            collector: Mutex::new(None),
            low_water: AtomicUsize::new(0),
            clean_at_open: AtomicBool::new(false),
        })
    }

    /// Bytes the engine may use.
    pub fn size(&self) -> u64 {
        self.pages * self.config.page_size as u64
    }

    /// How the device is cut.
    pub fn config(&self) -> RemapConfig {
        self.config
    }

    /// The device underneath.
    pub fn inner(&self) -> &Target {
        &self.inner
    }

    /// Direct-I/O alignment, with the engine's size.
    pub fn alignment(&self) -> Alignment {
        Alignment {
            size: self.size(),
            ..self.inner.alignment()
        }
    }

    /// The counters.
    pub fn stats(&self) -> RemapStats {
        self.lock().stats
    }

    /// Logical pages that hold a version.
    pub fn mapped_pages(&self) -> u64 {
        self.lock().map.iter().filter(|&&s| s != NO_PAGE).count() as u64
    }

    /// Bytes the live versions take on the device (compressed, padded to
    /// the unit): with [`Remap::mapped_pages`], the compression ratio of
    /// the data it holds.
    pub fn live_bytes(&self) -> u64 {
        let st = self.lock();
        st.segments
            .iter()
            .map(|g| g.live_units as u64 * self.geo.unit)
            .sum()
    }

    /// Free segments now.
    pub fn free_segments(&self) -> usize {
        self.lock().free.len()
    }

    /// Data segments.
    pub fn segments(&self) -> u64 {
        self.segments
    }

    /// A queue for one worker.
    pub fn queue(self: &Arc<Self>, backend: &Backend, depth: u32) -> Result<RemapQueue> {
        RemapQueue::new(self.clone(), open_queue(&self.inner, backend, depth)?)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn own_queue(&self) -> MutexGuard<'_, Box<dyn IoQueue>> {
        self.own.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn page_buf(&self) -> Result<AlignedBuf> {
        self.buf(self.config.page_size as usize)
    }

    fn summary_buf(&self) -> Result<AlignedBuf> {
        self.buf(self.geo.summary_bytes())
    }

    /// A buffer for an intent naming `segments` segments: the pages it
    /// takes (one at least), not the whole copy.
    fn intent_buf(&self, segments: usize) -> Result<AlignedBuf> {
        let bytes = (INTENT_HEADER + 4 * segments) as u64;
        self.buf((bytes.div_ceil(self.geo.page).max(1) * self.geo.page) as usize)
    }

    /// A buffer for a whole intent copy.
    fn intent_copy_buf(&self) -> Result<AlignedBuf> {
        self.buf((self.geo.intent_pages * self.geo.page) as usize)
    }

    /// A zeroed buffer of `len` bytes aligned for the device.
    pub(crate) fn buf(&self, len: usize) -> Result<AlignedBuf> {
        AlignedBuf::new(len, self.inner.alignment().mem as usize)
    }

    /// Pages are compressed and packed.
    pub(crate) fn compressed(&self) -> bool {
        self.config.compress
    }

    /// Bytes of a unit.
    pub(crate) fn unit(&self) -> usize {
        self.geo.unit as usize
    }

    /// Where the extent the map names `l` lies.
    fn extent(&self, st: &State, l: u64) -> Extent {
        let (s, k) = unloc(l);
        let e = st.segments[s as usize].entries[k as usize];
        Extent {
            loc: l,
            at: self.geo.extent_at(s, e.start),
            len: (e.units as u64 * self.geo.unit) as usize,
            packed: e.units < self.geo.upp,
        }
    }

    /// Where logical page `page` lives now, pinning its segment against
    /// reuse until [`Remap::read_done`] (None: never written, reads as
    /// zeros).
    pub(crate) fn read_extent(&self, page: u64) -> Option<Extent> {
        let mut st = self.lock();
        let l = *st.map.get(page as usize)?;
        if l == NO_PAGE {
            return None;
        }
        let extent = self.extent(&st, l);
        st.segments[unloc(l).0 as usize].readers += 1;
        Some(extent)
    }

    /// Unmaps every logical page that lies whole in the `len` bytes at
    /// `offset` (a trim of pages the engine freed): each reads as zeros
    /// until written again, and its extent is dead, so the collection
    /// never copies it. Not made durable: after a crash a page unmapped
    /// since the last barrier may read as a version from before (the engine
    /// trims only pages whose free is durable, so such a page is free and
    /// its bytes never read). A write in flight still maps the page when it
    /// completes; a read in flight keeps its segment pinned. Pages partly
    /// covered, or past the offered size, are left as they are (advice).
    ///
    /// Only where a freed segment's summaries read as zeros afterwards
    /// (the device underneath reads trimmed ranges as zeros: a file, the
    /// simulator): elsewhere (a block device) a freed segment keeps its
    /// old summaries, which after a crash could name an unmapped page's
    /// last extent while another page's bytes lie there, so a discard
    /// there does nothing (durable unmaps, tombstones in the summaries,
    /// are not built).
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if !self.unmaps() {
            return Ok(());
        }
        let page = self.config.page_size as u64;
        let first = offset.div_ceil(page);
        let end = (offset.saturating_add(len) / page).min(self.pages);
        let mut st = self.lock();
        let barrier = st.barriers_started;
        for p in first..end {
            let l = std::mem::replace(&mut st.map[p as usize], NO_PAGE);
            if l == NO_PAGE {
                continue;
            }
            let (s, k) = unloc(l);
            let seg = &mut st.segments[s as usize];
            seg.live_units -= seg.entries[k as usize].units;
            st.stats.pages_unmapped += 1;
            die_if_dead(&mut st, s, barrier);
        }
        Ok(())
    }

    /// The logical pages in `first..end` that hold a version (ascending).
    pub(crate) fn mapped_in(&self, first: u64, end: u64) -> Vec<u64> {
        let st = self.lock();
        let end = end.min(st.map.len() as u64);
        (first.min(end)..end)
            .filter(|&p| st.map[p as usize] != NO_PAGE)
            .collect()
    }

    /// True if [`Remap::discard`] unmaps pages here.
    pub fn unmaps(&self) -> bool {
        self.inner.discard_reads_zeros()
    }

    /// A read of the extent `l` ended.
    pub(crate) fn read_done(&self, l: u64) {
        let mut st = self.lock();
        st.segments[unloc(l).0 as usize].readers -= 1;
    }

    /// Hands out a fresh page-sized extent for a write of logical page
    /// `page`, of class `placement`, on a plain device, with the placement
    /// handle of its stream (the write goes out with it), or None when only the collection's
    /// reserve of free segments is left: the caller then lets its own
    /// reads in flight end (they pin their segments) and runs
    /// [`Remap::collect`].
    pub(crate) fn write_slot(
        &self,
        page: u64,
        placement: Placement,
    ) -> Option<(Extent, Placement)> {
        debug_assert!(!self.config.compress);
        let upp = self.geo.upp;
        let mut st = self.lock();
        let stream = self.stream_of_write(&st, page, placement);
        // Bounded: a segment whose summary is full closes, and the next
        // one has room (a plain segment's summary lists all its pages).
        for _ in 0..2 {
            let Some((s, start, units)) = self.take_chunk(&mut st, stream, upp, upp, GC_RESERVE)
            else {
                st.stats.write_stalls += 1;
                return None;
            };
            let k = self.add_entry(&mut st, s, start, upp);
            self.release_chunk(&mut st, s, start, upp, units);
            if let Some(k) = k {
                st.stats.page_writes += 1;
                st.stats.stored_bytes += self.geo.page;
                let handle = super::placement::PLACEMENTS[stream];
                return Some((self.extent(&st, loc(s, k)), handle));
            }
        }
        None
    }

    /// The stream an engine write of logical page `page`, of class
    /// `placement`, goes to.
    pub(crate) fn write_stream(&self, page: u64, placement: Placement) -> usize {
        self.stream_of_write(&self.lock(), page, placement)
    }

    fn stream_of_write(&self, st: &State, page: u64, placement: Placement) -> usize {
        let born = match st.map.get(page as usize) {
            Some(&l) if l != NO_PAGE => {
                let (s, k) = unloc(l);
                Some(st.segments[s as usize].entries[k as usize].born)
            }
            _ => None,
        };
        st.groups.of_write(placement, born, st.clock)
    }

    /// Reserves `want` units (whole flash pages, at least `need`) of
    /// stream `stream`'s open segment, opening a free one (if more than
    /// `reserve` are free) when it lacks room: (segment, first unit,
    /// units). The segment counts the chunk as pending until
    /// [`Remap::release_chunk`].
    fn take_chunk(
        &self,
        st: &mut State,
        stream: usize,
        want: u32,
        need: u32,
        reserve: usize,
    ) -> Option<(u32, u32, u32)> {
        let g = &self.geo;
        let barrier = st.barriers_started;
        // Bounded: the open segment gives a chunk or is closed, and a
        // fresh one has room for any extent.
        for _ in 0..2 {
            if let Some(s) = st.open[stream] {
                let seg = &mut st.segments[s as usize];
                let left = g.data_units - seg.next;
                if left >= need && (seg.entries.len() as u32) < g.entry_cap {
                    let units = g.align_up(want.max(need)).min(left);
                    let start = seg.next;
                    seg.next += units;
                    seg.pending += 1;
                    if seg.next == g.data_units {
                        // Its last units are pending: it dies, if ever,
                        // when they end (or opens again if this chunk
                        // gives back a tail).
                        seg.life = Life::Closed;
                        st.open[stream] = None;
                    }
                    return Some((s, start, units));
                }
                seg.life = Life::Closed;
                st.open[stream] = None;
                die_if_dead(st, s, barrier);
            }
            if st.free.len() <= reserve {
                return None;
            }
            let s = st.free.pop_front()?;
            if st.free.len() < self.low_water.load(Ordering::Relaxed) {
                let signal = self.collector.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(signal) = signal.as_ref() {
                    signal.ask();
                }
            }
            let seg = &mut st.segments[s as usize];
            debug_assert_eq!(seg.life, Life::Free);
            debug_assert_eq!(seg.live_units, 0);
            seg.life = Life::Open;
            seg.next = 0;
            seg.pending = 0;
            seg.entries.clear();
            seg.dirty = true;
            seg.stream = stream as u8;
            st.open[stream] = Some(s);
        }
        None
    }

    /// A new extent of `units` units at unit `start` of segment `s`
    /// (inside a chunk reserved there), pending until its write ends
    /// ([`Remap::write_done`]); None when the segment's summary lists no
    /// more (the segment is then closed to new chunks).
    fn add_entry(&self, st: &mut State, s: u32, start: u32, units: u32) -> Option<u32> {
        let cap = self.geo.entry_cap as usize;
        let seg = &mut st.segments[s as usize];
        debug_assert!(start + units <= self.geo.data_units);
        let k = seg.entries.len();
        if k < cap {
            seg.entries.push(Entry {
                page: NO_PAGE,
                stamp: 0,
                born: 0,
                start,
                units,
            });
            seg.pending += 1;
        }
        if seg.entries.len() >= cap && st.open[seg.stream as usize] == Some(s) {
            seg.life = Life::Closed;
            st.open[seg.stream as usize] = None;
        }
        (k < cap).then_some(k as u32)
    }

    /// The chunk of `units` units at `start` of segment `s` is done with,
    /// its first `used` units taken: its unused flash pages go back to the
    /// segment if nothing was reserved after it.
    fn release_chunk(&self, st: &mut State, s: u32, start: u32, used: u32, units: u32) {
        let barrier = st.barriers_started;
        let used_end = start + self.geo.align_up(used);
        let cap = self.geo.entry_cap as usize;
        let stream = st.segments[s as usize].stream as usize;
        let stream_open = st.open[stream].is_some();
        let seg = &mut st.segments[s as usize];
        seg.pending -= 1;
        if seg.next == start + units && used_end < seg.next {
            match seg.life {
                Life::Open => seg.next = used_end,
                // Closed when this chunk took its last units (or found too
                // few left): it takes its stream's writes again (the
                // stream has no open segment now), or the tail would stay
                // unused until the segment is collected (up to 7 of 64 units each time a collection
                // round ends at a segment's end, where a victim at 95%
                // live gives back 3).
                Life::Closed if !stream_open && seg.entries.len() < cap => {
                    seg.next = used_end;
                    seg.life = Life::Open;
                    st.open[stream] = Some(s);
                }
                _ => {}
            }
        }
        die_if_dead(st, s, barrier);
    }

    /// Places `bytes` (an extent of `units` units of logical page `page`)
    /// in the chunk `open` of stream `stream`, taking a fresh chunk when it
    /// lacks room; the chunks it closes on the way go to `closed` for the
    /// caller to write (then [`Remap::chunk_written`]). With `copies`, the
    /// collection's: `owner` is the extent copied from. Ok(false): no free
    /// segment beyond `reserve` (the caller collects and tries again).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pack(
        &self,
        open: &mut Option<Chunk>,
        closed: &mut Vec<Chunk>,
        stream: usize,
        copies: bool,
        page: u64,
        bytes: &[u8],
        owner: u64,
        reserve: usize,
    ) -> Result<bool> {
        let unit = self.geo.unit as usize;
        let units = bytes.len().div_ceil(unit) as u32;
        debug_assert!(units >= 1 && units <= self.geo.upp);
        // Bounded: a chunk with no room or whose segment is full is closed
        // and a fresh one (from a fresh segment at worst) takes the extent;
        // other writers filling that segment's summary can close it again
        // a few times.
        for _ in 0..8 {
            if let Some(c) = open.as_mut() {
                if c.used + units <= c.units {
                    let mut st = self.lock();
                    if let Some(k) = self.add_entry(&mut st, c.seg, c.start + c.used, units) {
                        if copies {
                            st.stats.gc_copies += 1;
                        } else {
                            st.stats.page_writes += 1;
                            st.stats.stored_bytes += units as u64 * self.geo.unit;
                        }
                        drop(st);
                        let at = c.used as usize * unit;
                        let buf = c.buf.get_mut().expect("no write holds an open chunk");
                        buf[at..at + bytes.len()].copy_from_slice(bytes);
                        c.used += units;
                        c.placed.push(Placed {
                            page,
                            loc: loc(c.seg, k),
                            owner,
                        });
                        return Ok(true);
                    }
                }
                closed.extend(open.take());
                continue;
            }
            let want = CHUNK_FLASH_PAGES * self.geo.align_units;
            let taken = self.take_chunk(&mut self.lock(), stream, want, units, reserve);
            let Some((seg, start, n)) = taken else {
                if !copies {
                    self.lock().stats.write_stalls += 1;
                }
                return Ok(false);
            };
            let align = self.inner.alignment().mem as usize;
            let buf = match ReusableBuf::new(n as usize * unit, align) {
                Ok(b) => b,
                Err(e) => {
                    self.release_chunk(&mut self.lock(), seg, start, 0, n);
                    return Err(e);
                }
            };
            *open = Some(Chunk {
                seg,
                start,
                units: n,
                used: 0,
                stream,
                copies,
                buf,
                placed: Vec::new(),
            });
        }
        Err(Error::InvalidArgument(format!(
            "an extent of {units} units found no room in a fresh chunk"
        )))
    }

    /// The write a closed chunk needs: its offset and buffer (its used
    /// units, rounded up to whole flash pages), or None when it holds no
    /// extent (then only [`Remap::chunk_written`]).
    pub(crate) fn chunk_write(&self, c: &Chunk) -> Option<(u64, IoBuf)> {
        if c.used == 0 {
            return None;
        }
        // Within the chunk: `used` never passes `units`, nor its flash
        // pages the chunk's (whole flash pages, or the segment's end).
        let len = (self.geo.align_up(c.used) as u64 * self.geo.unit) as usize;
        let buf = c
            .buf
            .lend(0, len)
            .expect("a chunk's used flash pages lie within it");
        Some((self.geo.extent_at(c.seg, c.start), buf))
    }

    /// A closed chunk's write ended (`ok`: completed; a chunk that held no
    /// extent counts as written): each page placed in it is mapped there
    /// (the collection's copies only if the map still names the extent
    /// they copied, their `owner`), and the chunk's reservation ends.
    pub(crate) fn chunk_written(&self, c: &Chunk, ok: bool) {
        for p in &c.placed {
            let from = c.copies.then_some(p.owner);
            self.write_done(p.page, p.loc, ok, from);
        }
        self.release_chunk(&mut self.lock(), c.seg, c.start, c.used, c.units);
    }

    /// The write of logical page `page` to extent `l` ended (`ok`: it
    /// completed): the map points at it, and the page's former extent
    /// dies. With `only_from`, the map moves only if it still points
    /// there (a collection's copy loses to a newer write of the engine).
    pub(crate) fn write_done(&self, page: u64, l: u64, ok: bool, only_from: Option<u64>) {
        let (s, k) = unloc(l);
        let mut st = self.lock();
        let barrier = st.barriers_started;
        st.segments[s as usize].pending -= 1;
        let moves = ok && only_from.is_none_or(|from| st.map[page as usize] == from);
        if moves {
            let stamp = st.clock;
            st.clock += 1;
            let old = std::mem::replace(&mut st.map[page as usize], l);
            // A copy keeps its version's birth; an engine write starts a
            // version, and the one it replaces ends its life.
            let old_born = (old != NO_PAGE).then(|| {
                let (os, ok_) = unloc(old);
                st.segments[os as usize].entries[ok_ as usize].born
            });
            let born = match (only_from, old_born) {
                (Some(_), Some(b)) => b,
                (Some(_), None) => stamp,
                (None, b) => {
                    if let Some(b) = b {
                        st.groups.replaced(stamp.saturating_sub(b));
                    }
                    stamp
                }
            };
            let seg = &mut st.segments[s as usize];
            let e = &mut seg.entries[k as usize];
            e.page = page;
            e.stamp = stamp;
            e.born = born;
            seg.written = stamp;
            seg.live_units += e.units;
            seg.dirty = true;
            if old != NO_PAGE {
                let (os, ok_) = unloc(old);
                let oseg = &mut st.segments[os as usize];
                oseg.live_units -= oseg.entries[ok_ as usize].units;
                die_if_dead(&mut st, os, barrier);
            }
        }
        die_if_dead(&mut st, s, barrier);
    }

    /// Makes every write completed so far durable with its map entries:
    /// flush, summaries of the changed segments, flush; then frees the
    /// segments whose death the summaries made durable.
    pub fn barrier(&self) -> Result<()> {
        let mut q = self.own_queue();
        self.barrier_on(&mut **q, true)
    }

    /// A barrier on queue `q`. With `durable`, it returns Ok only once
    /// every segment dirty when it started has had its summary written
    /// (a flush's, a durable write's: the caller is told its writes are
    /// durable); without (a collection's own), it may end with summaries
    /// left to write, freeing nothing, when writes on other queues keep
    /// its rounds busy.
    fn barrier_on(&self, q: &mut dyn IoQueue, durable: bool) -> Result<()> {
        let whole = self.inner.discard_reads_zeros();
        let (started, owed) = {
            let mut st = self.lock();
            st.barriers_started += 1;
            let started = st.barriers_started;
            let owed: Vec<(usize, u64)> = if durable {
                (st.segments.iter().enumerate())
                    .filter(|(_, g)| g.dirty)
                    .map(|(s, g)| (s, g.summaries))
                    .collect()
            } else {
                Vec::new()
            };
            if whole {
                // The segments this barrier will free, named by its intents
                // as being trimmed (durable before any trim runs: a crash
                // in the middle of one may leave a summary copy part
                // zeroed, which the open then takes for none), as many as
                // the intents have room for; the others wait.
                let suspects = st.segments.iter().filter(|g| g.suspect).count();
                let room =
                    (self.geo.intent_cap as usize / 2).saturating_sub(st.trimming.len() + suspects);
                let State {
                    dying,
                    segments,
                    trimming,
                    ..
                } = &mut *st;
                // Not one whose summary is still owed: the open drops
                // every copy of a segment named as being trimmed when one
                // is unreadable, and that one could be the owed summary
                // torn by the cut, with the other copy the only durable
                // record of flushed versions (a review's finding). A
                // later barrier frees it, once its summary is written.
                let candidates = dying.iter().filter(|&&s| {
                    let seg = &segments[s as usize];
                    matches!(seg.life, Life::Dying { barrier } if barrier < started)
                        && seg.readers == 0
                        && !seg.dirty
                        && !seg.suspect
                        && !trimming.iter().any(|&(t, _)| t == s)
                });
                let named: Vec<u32> = candidates.take(room).copied().collect();
                trimming.extend(named.into_iter().map(|s| (s, false)));
            }
            (started, owed)
        };
        // Bounded: each round writes the summaries of up to an intent's
        // worth of segments (all of them, nearly always, in one round).
        let rounds = self.segments / self.geo.intent_cap as u64 + 2;
        let mut settled = false;
        for _ in 0..rounds {
            if !self.barrier_round(q)? {
                settled = true;
                break;
            }
        }
        if !settled {
            // Summaries are left to write (writes on other queues kept the
            // rounds busy, re-dirtying low-numbered segments ahead of
            // those this barrier owes): a dying segment's entries may lose
            // only to one of them, so nothing is freed; a later barrier
            // frees them. But a durable barrier's own summaries must be
            // written: the caller is told its writes are durable, and a
            // checkpoint moves its redo point past them. Bounded: each
            // round writes up to an intent's worth, lowest numbers first.
            let paid = || {
                let st = self.lock();
                owed.iter().all(|&(s, n)| st.segments[s].summaries > n)
            };
            for _ in 0..8 * rounds {
                if paid() {
                    break;
                }
                if !self.barrier_round(q)? {
                    settled = true;
                    break;
                }
            }
            if !settled {
                if paid() {
                    return Ok(());
                }
                return Err(Error::Poisoned(format!(
                    "an out-of-place barrier left summaries it owed unwritten after {} \
                     rounds (writes on other queues kept it busy): its writes are not known \
                     durable",
                    9 * rounds
                )));
            }
        }
        let mut st = self.lock();
        // Free (not yet in the free list, so nobody opens them before
        // their trim).
        let mut freed = Vec::new();
        let State {
            dying,
            segments,
            trimming,
            ..
        } = &mut *st;
        dying.retain(|&s| {
            let seg = &mut segments[s as usize];
            // Where a trim zeroes summaries, only those this barrier's
            // intents named as being trimmed.
            let free = matches!(seg.life, Life::Dying { barrier } if barrier < started)
                && seg.readers == 0
                && (!whole || trimming.iter().any(|&(t, _)| t == s));
            if free {
                debug_assert!(seg.live_units == 0 && seg.pending == 0);
                seg.life = Life::Free;
                seg.copy_failed = false;
                freed.push(s);
            }
            !free
        });
        drop(st);
        // Trimmed whole, summaries too (an old summary that reads as zeros
        // is no summary): the device's collection never copies a dead
        // segment. Where pages are not unmapped a failed trim frees the
        // segment all the same (advice). Where a trimmed range may read
        // back as anything (a block device), the summaries stay: an open
        // would take garbage there for damage. They are valid summaries
        // whose every entry loses (no page is unmapped there:
        // `Remap::unmaps`).
        // Where pages are unmapped, a freed segment must name nothing
        // (an unmapped page has no newer extent for its old entries to
        // lose to): a whole trim that failed is made up for with a summary
        // naming nothing, newer than both copies, durable in both before
        // the segment is reused. Each copy is written as every summary is,
        // by a barrier round whose intent names the segment: a crash cuts
        // one copy at most. (Zeros over both copies at once, the first
        // way, could leave both cut, which the open takes for damage.)
        let seg_bytes = self.geo.seg_pages * self.geo.page;
        let mut trimmed = 0;
        let mut untrimmed = Vec::new();
        for &s in &freed {
            let start = (s as u64 + 1) * seg_bytes;
            let (at, len) = if whole {
                (start, seg_bytes)
            } else {
                let data = self.geo.extent_at(s, 0);
                (data, start + seg_bytes - data)
            };
            if self.inner.discard(at, len).is_ok() {
                trimmed += 1;
                if whole {
                    let mut st = self.lock();
                    if let Some(t) = st.trimming.iter_mut().find(|(t, _)| *t == s) {
                        t.1 = true;
                    }
                }
            } else if whole {
                untrimmed.push(s);
            }
        }
        let mut emptied = Ok(());
        // Segments a pass left with their summary unwritten.
        let mut unfinished: Vec<u32> = Vec::new();
        // Into both copies, one round after the other: a trim that failed
        // may have zeroed part of the range, and a copy left half zeroed
        // that no intent names is damage at the next open.
        for _copy in 0..SUMMARY_COPIES {
            if untrimmed.is_empty() || emptied.is_err() {
                break;
            }
            {
                let mut st = self.lock();
                for &s in &untrimmed {
                    let seg = &mut st.segments[s as usize];
                    seg.entries.clear();
                    seg.dirty = true;
                }
            }
            for _ in 0..rounds {
                match self.barrier_round(q) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        emptied = Err(e);
                        break;
                    }
                }
            }
            let st = self.lock();
            for &s in &untrimmed {
                if st.segments[s as usize].dirty && !unfinished.contains(&s) {
                    unfinished.push(s);
                }
            }
        }
        if !untrimmed.is_empty() {
            // One whose empty summary is not durable in both copies (a
            // round failed, or writes from other queues kept the rounds
            // busy) is not freed: it stays dying, and a later barrier
            // trims it or writes both again before it frees it.
            let mut st = self.lock();
            let barrier = st.barriers_started;
            for &s in &untrimmed {
                if emptied.is_err() || unfinished.contains(&s) {
                    st.segments[s as usize].life = Life::Dying { barrier };
                    st.dying.push(s);
                    freed.retain(|&f| f != s);
                } else {
                    // Both copies name nothing, durably: nothing is left
                    // part zeroed.
                    st.trimming.retain(|&(t, _)| t != s);
                }
            }
        }
        let mut st = self.lock();
        st.stats.segments_freed += freed.len() as u64;
        st.stats.segments_trimmed += trimmed;
        st.free.extend(freed);
        emptied
    }

    /// One round of a barrier: the intent naming the segments whose
    /// summaries it writes (up to an intent's worth of the dirty ones),
    /// a flush (the data of every completed write and the intent durable),
    /// their summaries, a flush. Every intent also names the segments being
    /// trimmed ([`TRIM_BIT`]); with no dirty segment, that intent and a
    /// flush, or with none being trimmed either, one flush. True if dirty
    /// segments are left for another round.
    fn barrier_round(&self, q: &mut dyn IoQueue) -> Result<bool> {
        // The summaries name only writes that completed before this point,
        // and the first flush makes their data durable before any summary
        // is written.
        let cap = self.geo.intent_cap as usize;
        // Segments whose trim had returned when the intent was encoded:
        // its flush makes those trims durable.
        let trims_returned: Vec<u32>;
        // The segments the intent names as being trimmed.
        let trims_in_intent: Vec<u32>;
        let (intent, summaries, more) = {
            let mut st = self.lock();
            // Suspect segments first: every intent names them until their
            // summary is written whole (an intent that left one out could
            // become the newest while its cut copy is still there).
            let n = st.segments.len();
            let mut dirty: Vec<usize> = (0..n)
                .filter(|&s| st.segments[s].dirty && st.segments[s].suspect)
                .collect();
            dirty.extend(
                (0..n)
                    .filter(|&s| st.segments[s].dirty && !st.segments[s].suspect)
                    .take(cap + 1),
            );
            // Room for the segments being trimmed, which every intent names.
            let cap = cap.saturating_sub(st.trimming.len()).max(1);
            let more = dirty.len() > cap;
            dirty.truncate(cap);
            // No summary to write, and the newest durable intent names
            // every segment being trimmed: one flush, which makes the trims
            // that returned durable.
            let named = st.trimming.iter().all(|(t, _)| st.trims_named.contains(t));
            if dirty.is_empty() && named {
                drop(st);
                flush(q)?;
                let mut st = self.lock();
                st.stats.barriers += 1;
                st.trimming.retain(|&(_, returned)| !returned);
                return Ok(false);
            }
            // Every buffer first: a failed allocation must leave every
            // segment dirty, its summary still to write.
            let mut bufs = (0..dirty.len())
                .map(|_| self.summary_buf())
                .collect::<Result<Vec<_>>>()?;
            let mut intent_buf = self.intent_buf(dirty.len() + st.trimming.len())?;
            let number = st.clock;
            st.clock += 1;
            let intent_slot = st.intent_slot;
            st.intent_slot ^= 1;
            encode_intent(
                &mut intent_buf,
                number,
                dirty
                    .iter()
                    .map(|&s| s as u32)
                    .chain(st.trimming.iter().map(|&(t, _)| t | TRIM_BIT)),
            );
            trims_returned = st
                .trimming
                .iter()
                .filter(|&&(_, returned)| returned)
                .map(|&(t, _)| t)
                .collect();
            trims_in_intent = st.trimming.iter().map(|&(t, _)| t).collect();
            let mut out = Vec::with_capacity(dirty.len());
            for &s in &dirty {
                let version = st.clock;
                st.clock += 1;
                let seg = &mut st.segments[s];
                seg.dirty = false;
                seg.summaries += 1;
                let slot = seg.summary_slot;
                seg.summary_slot ^= 1;
                let mut buf = bufs.pop().expect("a buffer per dirty segment");
                let head = SummaryHead {
                    segment: s as u32,
                    stream: seg.stream,
                    version,
                };
                encode_summary(&mut buf, head, &seg.entries);
                out.push((s, self.geo.summary_at(s as u32, slot), buf));
            }
            ((intent_slot, intent_buf), out, more)
        };
        let written = summaries.len() as u64;
        let dirty: Vec<usize> = summaries.iter().map(|(s, _, _)| *s).collect();
        let (intent_slot, intent_buf) = intent;
        let intent_at = self.geo.intent_at(intent_slot);
        let mut intent_durable = false;
        let result =
            match write_all(q, std::iter::once((intent_at, intent_buf))).and_then(|_| flush(q)) {
                Err(e) => Err(e),
                Ok(()) => {
                    intent_durable = true;
                    if summaries.is_empty() {
                        // An intent naming only segments being trimmed.
                        Ok(())
                    } else {
                        write_all(q, summaries.into_iter().map(|(_, at, b)| (at, b)))
                            .and_then(|_| flush(q))
                    }
                }
            };
        let mut st = self.lock();
        st.stats.barriers += 1;
        st.stats.summary_writes += written;
        if intent_durable {
            st.trimming.retain(|(t, _)| !trims_returned.contains(t));
            st.trims_named = trims_in_intent;
        }
        if let Err(e) = result {
            // The summary copies written to may be cut: the next summary
            // of each goes there again, so the other copy keeps the last
            // good one. Once this intent is durable it is the one that
            // names them: the next intent must not go over it (and names
            // them too, as suspects); before that, nothing was cut and the
            // next intent takes its copy again.
            for s in dirty {
                let seg = &mut st.segments[s];
                seg.dirty = true;
                seg.summaries -= 1;
                seg.summary_slot ^= 1;
                seg.suspect |= intent_durable;
            }
            if !intent_durable {
                st.intent_slot ^= 1;
            }
            return Err(e);
        }
        for s in dirty {
            st.segments[s].suspect = false;
        }
        Ok(more)
    }

    /// Marks a clean close: when no summary is left to write (the last
    /// barrier wrote them all), writes an intent that names no segment and
    /// flushes, so that at the next open a summary that does not read back
    /// is damage, not a write cut by a crash ([`Remap::open`]). Call it
    /// once nothing more is written (`Db::close` does, before it releases
    /// the database's lock); without it the last barrier's segments are
    /// taken as possibly cut. Ok(false): summaries were left to write,
    /// nothing was done.
    pub fn close(&self) -> Result<bool> {
        // Under the device's own queue: no barrier round runs meanwhile.
        let mut q = self.own_queue();
        if self.lock().trimming.iter().any(|&(_, returned)| returned) {
            // The trims that returned, durable before an intent stops
            // naming them.
            flush(&mut **q)?;
            self.lock().trimming.retain(|&(_, returned)| !returned);
        }
        let (slot, buf) = {
            let mut st = self.lock();
            if st.segments.iter().any(|g| g.dirty || g.suspect) || !st.trimming.is_empty() {
                return Ok(false);
            }
            let mut buf = self.intent_buf(0)?;
            let number = st.clock;
            st.clock += 1;
            encode_intent(&mut buf, number, std::iter::empty());
            let slot = st.intent_slot;
            st.intent_slot ^= 1;
            (slot, buf)
        };
        let written = write_all(&mut **q, std::iter::once((self.geo.intent_at(slot), buf)))
            .and_then(|_| flush(&mut **q));
        let mut st = self.lock();
        match written {
            // It names nothing as being trimmed (nothing is).
            Ok(()) => st.trims_named.clear(),
            // The copy written to may be cut: the next intent goes there
            // again, the newest durable one left as it is.
            Err(_) => st.intent_slot ^= 1,
        }
        written.map(|_| true)
    }

    /// Frees at least `want` segments (a few more when it can) by copying
    /// the live extents of the closed segments with the fewest out, then a
    /// barrier. Blocking.
    pub fn collect(&self, want: usize) -> Result<()> {
        let mut q = self.own_queue();
        let q = &mut **q;
        let goal = GC_RESERVE + want.max(1);
        let enough = goal + GC_BATCH;
        // Segments already dead need only a barrier.
        if self.dying() > 0 {
            self.barrier_on(q, false)?;
        }
        // Bounded: each pass empties a segment or frees the emptied ones;
        // a segment another worker's read still pins is waited for, up
        // to PIN_PATIENCE.
        let started = std::time::Instant::now();
        let mut copy_error = None;
        for _ in 0..2 * self.segments {
            let free = self.lock().free.len();
            let dying = self.dying();
            if free >= goal && dying == 0 {
                break;
            }
            // The emptied segments are freed by a barrier once there are
            // enough, or before the copies run out of room.
            if dying > 0 && (free + dying >= enough || free <= 1) {
                self.barrier_on(q, false)?;
                let now = self.lock().free.len();
                if now >= goal {
                    break;
                }
                if now == free {
                    // Every emptied segment is pinned by a read in flight
                    // on another worker's queue: give it time to end
                    // (with two free segments or more too: the next pass
                    // would run the same barrier at once, and the passes
                    // ran out in microseconds to a false NoSpace; a
                    // review's finding, no test).
                    if started.elapsed() > PIN_PATIENCE {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                continue;
            }
            let Some(victim) = self.pick_victim() else {
                break;
            };
            // A victim that cannot be read is passed over from now on:
            // the others may still free enough.
            if let Err(e) = self.copy_out(q, victim) {
                copy_error = Some(e);
            }
        }
        if self.dying() > 0 {
            self.barrier_on(q, false)?;
        }
        if self.lock().free.len() > GC_RESERVE {
            Ok(())
        } else if let Some(e) = copy_error {
            Err(e)
        } else {
            Err(Error::NoSpace(format!(
                "out-of-place device: no segment can be freed ({} live pages in {} segments)",
                self.mapped_pages(),
                self.segments
            )))
        }
    }

    /// Starts the background collection of this device: a thread that
    /// keeps free segments ahead of the writes (`remap/collector.rs`), so
    /// that writers seldom collect themselves. One at a time: it runs
    /// until the handle is dropped or stopped (stop it before
    /// [`Remap::close`]); another may start after.
    pub fn start_collector(self: &Arc<Self>) -> Result<Collector> {
        let signal = Arc::new(Signal::default());
        {
            let mut slot = self.collector.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_some_and(|s| !s.stopped()) {
                return Err(Error::InvalidArgument(
                    "out-of-place device: its background collection runs already".into(),
                ));
            }
            *slot = Some(signal.clone());
        }
        self.low_water
            .store(self.watermarks().low, Ordering::Relaxed);
        Collector::start(self, signal)
    }

    /// True if [`Remap::open`] found the mark of a clean close (so every
    /// damaged summary would have failed it).
    pub fn opened_after_clean_close(&self) -> bool {
        self.clean_at_open.load(Ordering::Relaxed)
    }

    /// The background collection stopped: writes wake nothing any more.
    pub(super) fn collector_stopped(&self) {
        self.low_water.store(0, Ordering::Relaxed);
    }

    /// The background collection's watermarks now (they follow the live
    /// data).
    fn watermarks(&self) -> Watermarks {
        let live_units: u64 = {
            let st = self.lock();
            st.segments.iter().map(|g| g.live_units as u64).sum()
        };
        let needed = live_units.div_ceil(self.geo.data_units as u64) as usize;
        let room = (self.segments as usize).saturating_sub(OPEN_SEGMENTS + GC_RESERVE + needed);
        Watermarks::of(room, GC_RESERVE)
    }

    /// One run of the background collection: when fewer than the low
    /// watermark's segments are free, copies out victims (greedy, as
    /// [`Remap::collect`]) and frees the emptied ones by a barrier every
    /// batch, until the high watermark's are free, the stop, or nothing
    /// more can be freed now (no victim, or emptied segments pinned by
    /// reads in flight: the next run tries again). The device's own queue
    /// is taken for one step at a time. With `refresh` the watermarks are
    /// worked out again (a pass over the segments) even when enough
    /// segments are free.
    fn collect_ahead(&self, signal: &Signal, refresh: bool) -> Result<()> {
        if !refresh && self.lock().free.len() >= self.low_water.load(Ordering::Relaxed) {
            return Ok(());
        }
        let w = self.watermarks();
        self.low_water.store(w.low, Ordering::Relaxed);
        {
            let mut st = self.lock();
            if st.free.len() >= w.low {
                return Ok(());
            }
            st.stats.background_runs += 1;
        }
        let ran = self.collect_steps(w, signal);
        if ran.is_err() {
            self.lock().stats.background_failures += 1;
        }
        ran
    }

    fn collect_steps(&self, w: Watermarks, signal: &Signal) -> Result<()> {
        // Bounded: each step empties a segment or frees the emptied ones
        // (a barrier that frees none ends the run).
        for _ in 0..2 * self.segments {
            if signal.stopped() {
                break;
            }
            let (free, dying) = {
                let st = self.lock();
                (st.free.len(), st.dying.len())
            };
            if free >= w.high {
                break;
            }
            let mut q = self.own_queue();
            let q = &mut **q;
            // Free the emptied segments by a batch, at the end, or before
            // the copies (which may take the collection's reserve) run
            // out of room.
            let barrier =
                dying >= w.batch || free + dying >= w.high || dying > 0 && free <= GC_RESERVE;
            let victim = if barrier { None } else { self.pick_victim() };
            match victim {
                Some(victim) => {
                    self.copy_out(q, victim)?;
                    if self.lock().segments[victim as usize].life == Life::Closed {
                        // Extents left in it (no room to copy them): the
                        // next run tries again, after the barriers of the
                        // writes free segments.
                        break;
                    }
                }
                None if dying > 0 => {
                    self.barrier_on(q, false)?;
                    if self.lock().free.len() <= free {
                        break;
                    }
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Segments waiting for a barrier to be freed.
    fn dying(&self) -> usize {
        self.lock().dying.len()
    }

    /// How the collection picks its victims from now on (default
    /// [`GcPolicy::Greedy`]; not kept on the device).
    pub fn set_gc_policy(&self, gc: GcPolicy) {
        self.lock().gc = gc;
    }

    /// How writes are sorted into open segments from now on (default
    /// [`Grouping::DeathTime`]; not kept on the device).
    pub fn set_grouping(&self, grouping: Grouping) {
        self.lock().groups.grouping = grouping;
    }

    /// The mean life, in device writes, of the page versions the engine's
    /// writes replaced lately (0 before any): death-time grouping's yardstick.
    pub fn mean_life(&self) -> f64 {
        self.lock().groups.mean_life()
    }

    /// The closed segment the collection copies out next, if any has
    /// room to win back: greedy, the fewest live units; cost-benefit
    /// (LFS), the highest `(1 - u) * age / (1 + u)` with `u` its live
    /// fraction and `age` the writes since its newest extent's.
    fn pick_victim(&self) -> Option<u32> {
        let st = self.lock();
        let full = self.geo.data_units;
        let candidates = st.segments.iter().enumerate().filter(|(_, g)| {
            g.life == Life::Closed && g.pending == 0 && g.live_units < full && !g.copy_failed
        });
        match st.gc {
            GcPolicy::Greedy => candidates
                .min_by_key(|(_, g)| g.live_units)
                .map(|(s, _)| s as u32),
            GcPolicy::CostBenefit => candidates
                .map(|(s, g)| {
                    let u = g.live_units as f64 / full as f64;
                    let age = st.clock.saturating_sub(g.written) as f64 + 1.0;
                    (s, (1.0 - u) * age / (1.0 + u))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(s, _)| s as u32),
        }
    }

    /// Copies the live extents of segment `victim` to the collection's
    /// open segment (compressed ones as they are).
    fn copy_out(&self, q: &mut dyn IoQueue, victim: u32) -> Result<()> {
        // (logical page, extent copied from, where it lies, stream).
        let live: Vec<(u64, Extent, usize)> = {
            let mut st = self.lock();
            let seg = &st.segments[victim as usize];
            let live = seg
                .entries
                .iter()
                .enumerate()
                .filter(|(k, e)| {
                    e.page != NO_PAGE && st.map[e.page as usize] == loc(victim, *k as u32)
                })
                .map(|(k, e)| {
                    let stream = st.groups.of_copy(e.born, st.clock);
                    (e.page, self.extent(&st, loc(victim, k as u32)), stream)
                })
                .collect();
            st.segments[victim as usize].readers += 1;
            live
        };
        let mut bufs = Vec::with_capacity(live.len());
        let mut result = Ok(());
        for chunk in live.chunks(64) {
            let reads = chunk
                .iter()
                .map(|(_, e, _)| Ok((e.at, IoBuf::owned(self.buf(e.len)?))))
                .collect::<Result<Vec<_>>>();
            match reads.and_then(|reads| read_all(q, reads)) {
                Ok(r) => bufs.extend(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        {
            let mut st = self.lock();
            let seg = &mut st.segments[victim as usize];
            seg.readers -= 1;
            seg.copy_failed |= result.is_err();
        }
        result?;
        let mut open: [Option<Chunk>; OPEN_SEGMENTS] = std::array::from_fn(|_| None);
        let mut closed = Vec::new();
        let mut packed = Ok(());
        for ((page, from, stream), buf) in live.iter().zip(&bufs) {
            let bytes = buf.as_owned().expect("an owned buffer");
            match self.pack(
                &mut open[*stream],
                &mut closed,
                *stream,
                true,
                *page,
                &bytes[..],
                from.loc,
                0,
            ) {
                Ok(true) => {}
                // Out of room in this extent's stream: what was copied so
                // far still counts, and the other streams may have room.
                Ok(false) => continue,
                Err(e) => {
                    packed = Err(e);
                    break;
                }
            }
        }
        closed.extend(open.iter_mut().filter_map(Option::take));
        let writes: Vec<Request> = closed
            .iter()
            .filter_map(|c| {
                let (at, buf) = self.chunk_write(c)?;
                Some(Request::write(0, at, buf).placed(c.placement()))
            })
            .collect();
        let written = packed.and_then(|_| run_all(q, writes).map(|_| ()));
        for c in &closed {
            self.chunk_written(c, written.is_ok());
        }
        written
    }

    /// Rebuilds the map from every segment's newer valid summary. A
    /// summary copy that is neither valid nor zeros is one the last barrier
    /// round before a crash was writing (its intent names the segment: the
    /// copy is written again by the next barrier) or damage, which fails
    /// the open: the pages a damaged newest summary named would silently
    /// read as older versions.
    fn recover(&self) -> Result<()> {
        let mut q = self.own_queue();
        let g = self.geo;
        // The newest valid intent: the segments whose summaries may be torn.
        let reads = (0..2u8)
            .map(|k| Ok((g.intent_at(k), IoBuf::owned(self.intent_copy_buf()?))))
            .collect::<Result<Vec<_>>>()?;
        let intents = read_all(&mut **q, reads)?;
        let newest = intents
            .iter()
            .enumerate()
            .filter_map(|(k, b)| Some((k as u8, decode_intent(b.as_owned()?)?)))
            .max_by_key(|(_, (number, _))| *number);
        let mut clock = newest.as_ref().map_or(1, |(_, (n, _))| n + 1);
        let named = newest
            .as_ref()
            .map(|(_, (_, segs))| segs.clone())
            .unwrap_or_default();
        self.clean_at_open
            .store(newest.is_some() && named.is_empty(), Ordering::Relaxed);
        // Segments being trimmed (marked), and segments whose summary a
        // round was writing.
        let mut trim_named: Vec<u32> = named
            .iter()
            .filter(|&&s| s & TRIM_BIT != 0)
            .map(|&s| s & !TRIM_BIT)
            .collect();
        trim_named.sort_unstable();
        let mut in_flight: Vec<u32> = named.into_iter().filter(|&s| s & TRIM_BIT == 0).collect();
        in_flight.sort_unstable();
        // Per segment: its newest valid summary and the copy it is in.
        let mut best: Vec<Option<(Summary, u8)>> = vec![None; self.segments as usize];
        // Copies neither valid nor zeros: (segment, copy).
        let mut unreadable: Vec<(u32, u8)> = Vec::new();
        let segs: Vec<u32> = (0..self.segments as u32).collect();
        for chunk in segs.chunks(32) {
            let mut reads = Vec::with_capacity(chunk.len() * 2);
            for &s in chunk {
                for k in 0..SUMMARY_COPIES as u8 {
                    reads.push((g.summary_at(s, k), IoBuf::owned(self.summary_buf()?)));
                }
            }
            let bufs = read_all(&mut **q, reads)?;
            for (i, b) in bufs.iter().enumerate() {
                let s = chunk[i / 2];
                let b = b.as_owned().expect("an owned buffer");
                let valid = decode_summary(b, &g).filter(|v| v.segment == s);
                // Bytes all alike: never written, or trimmed (zeros; some
                // devices give ones).
                if valid.is_none() && b.iter().any(|&x| x != b[0]) {
                    unreadable.push((s, (i % 2) as u8));
                }
                if let Some(summary) = valid {
                    clock = clock.max(summary.version + 1);
                    let newer = best[s as usize]
                        .as_ref()
                        .is_none_or(|(v, _)| summary.version > v.version);
                    if newer {
                        best[s as usize] = Some((summary, (i % 2) as u8));
                    }
                }
            }
        }
        // Each segment the last intent names may have one copy cut by the
        // crash; any other unreadable copy is damage.
        let mut rewrite = Vec::new();
        // Copies a trim may have left part zeroed: none.
        let mut trim_cut: Vec<(u32, u8)> = Vec::new();
        for (i, &(s, k)) in unreadable.iter().enumerate() {
            if trim_named.binary_search(&s).is_ok() {
                trim_cut.push((s, k));
                continue;
            }
            let torn = in_flight.binary_search(&s).is_ok()
                && !unreadable[..i].iter().any(|&(t, _)| t == s);
            if !torn {
                return Err(Error::Corrupt {
                    page: g.summary_at(s, k) / g.page,
                    what: format!(
                        "out-of-place device: summary copy {k} of segment {s} is damaged, and no \
                         barrier cut by a crash was writing it (the pages its newest summary \
                         names could read as older versions)"
                    ),
                });
            }
            rewrite.push((s, k));
        }
        // A segment being trimmed with a copy a trim cut names nothing,
        // whatever its other copy says: it was dead when the trim began,
        // and the trim may have zeroed part of the data that copy names
        // (its entries could win only for pages unmapped since).
        for &(s, _) in &trim_cut {
            best[s as usize] = None;
        }
        let mut st = self.lock();
        st.intent_slot = newest.as_ref().map_or(0, |(k, _)| k ^ 1);
        st.trims_named = trim_named;
        st.stats.trim_cut_copies = trim_cut.len() as u64;
        let mut stamps = vec![0u64; self.pages as usize];
        for (s, b) in best.iter().enumerate() {
            let Some((summary, _)) = b else { continue };
            for (k, e) in summary.entries.iter().enumerate() {
                if e.page == NO_PAGE || e.page >= self.pages {
                    continue;
                }
                clock = clock.max(e.stamp + 1);
                if e.stamp > stamps[e.page as usize] {
                    stamps[e.page as usize] = e.stamp;
                    st.map[e.page as usize] = loc(s as u32, k as u32);
                }
            }
        }
        st.clock = clock;
        st.free.clear();
        st.dying.clear();
        // Where each segment's next chunk would start: after the last
        // extent its summary lists, on a flash page boundary.
        let next_of = |summary: &Summary| {
            let end = summary
                .entries
                .iter()
                .map(|e| e.start + e.units)
                .max()
                .unwrap_or(0);
            g.align_up(end)
        };
        // Per stream, the newest segment it had not filled: it goes on
        // taking that stream's writes after the extents its summary lists
        // (the device's erase blocks stay aligned with the segments).
        // Candidates (stream, version, segment), chosen among once it is
        // known which segments still hold a live extent (a dead one is not
        // reopened, and must not keep its stream from a live one).
        let candidates: Vec<(usize, u64, usize)> = best
            .iter()
            .enumerate()
            .filter_map(|(s, b)| {
                let (summary, _) = b.as_ref()?;
                let stream = summary.stream as usize;
                let open = next_of(summary) < g.data_units
                    && (summary.entries.len() as u32) < g.entry_cap
                    && stream < OPEN_SEGMENTS;
                open.then_some((stream, summary.version, s))
            })
            .collect();
        let mut next = vec![g.data_units; st.segments.len()];
        for (s, b) in best.into_iter().enumerate() {
            let seg = &mut st.segments[s];
            match b {
                Some((summary, slot)) => {
                    next[s] = next_of(&summary);
                    seg.written = summary.entries.iter().map(|e| e.stamp).max().unwrap_or(0);
                    seg.stream = summary.stream;
                    seg.entries = summary.entries;
                    seg.summary_slot = slot ^ 1;
                }
                None => seg.entries.clear(),
            }
        }
        let map = std::mem::take(&mut st.map);
        for &l in map.iter().filter(|&&l| l != NO_PAGE) {
            let (s, k) = unloc(l);
            let seg = &mut st.segments[s as usize];
            seg.live_units += seg.entries[k as usize].units;
        }
        st.map = map;
        let unmaps = self.unmaps();
        for s in 0..st.segments.len() {
            let seg = &mut st.segments[s];
            seg.next = g.data_units;
            let cut = trim_cut.iter().any(|&(t, _)| t as usize == s);
            debug_assert!(!cut || seg.live_units == 0, "a cut segment names nothing");
            if seg.live_units > 0 {
                seg.life = Life::Closed;
            } else if cut {
                // A trim cut by the crash (or one that failed part way):
                // named as being trimmed until the first barrier trims it
                // again, or writes both its copies.
                seg.life = Life::Dying { barrier: 0 };
                st.dying.push(s as u32);
                st.trimming.push((s as u32, false));
            } else if unmaps && !seg.entries.is_empty() {
                // Dead, but its newest summary still names extents (it died
                // before the crash and was not trimmed yet, or the summary
                // naming nothing that replaced them was cut): an unmapped
                // page's last extent may be among them, with no newer one
                // to lose to, and a reuse before its next summary could
                // make that page name another's bytes. The first barrier
                // trims it, or gives it a summary naming nothing, before
                // it is free.
                seg.life = Life::Dying { barrier: 0 };
                st.dying.push(s as u32);
            } else {
                seg.life = Life::Free;
                st.free.push_back(s as u32);
            }
        }
        let mut resume: [Option<(u64, usize)>; OPEN_SEGMENTS] = [None; OPEN_SEGMENTS];
        for &(stream, version, s) in &candidates {
            if st.segments[s].life == Life::Closed
                && resume[stream].is_none_or(|(v, _)| version > v)
            {
                resume[stream] = Some((version, s));
            }
        }
        for (stream, r) in resume.iter().enumerate() {
            let Some((_, s)) = *r else { continue };
            let seg = &mut st.segments[s];
            if seg.life == Life::Closed {
                seg.life = Life::Open;
                seg.next = next[s];
                st.open[stream] = Some(s as u32);
            }
        }
        // A copy cut by the crash is written again (with what the other
        // copy says) by the next barrier, whose intent names it until then.
        for (s, k) in rewrite {
            let seg = &mut st.segments[s as usize];
            seg.dirty = true;
            seg.suspect = true;
            seg.summary_slot = k;
        }
        Ok(())
    }
}

/// Segment `s` dies (waits for a barrier to be freed) once it is closed
/// with no live extent and no write pending.
fn die_if_dead(st: &mut State, s: u32, barrier: u64) {
    let seg = &mut st.segments[s as usize];
    if seg.live_units == 0 && seg.pending == 0 && seg.life == Life::Closed {
        seg.life = Life::Dying { barrier };
        st.dying.push(s);
    }
}

/// Label layout: magic (8), crc32c of bytes 12..4096 (4), page size (4),
/// segment pages (4), compressed (4: 0 or 1), logical pages (8), spare
/// (8, an f64).
fn encode_label(b: &mut [u8], c: &RemapConfig, pages: u64) {
    b.fill(0);
    b[..8].copy_from_slice(LABEL_MAGIC);
    b[12..16].copy_from_slice(&c.page_size.to_le_bytes());
    b[16..20].copy_from_slice(&c.segment_pages.to_le_bytes());
    b[20..24].copy_from_slice(&u32::from(c.compress).to_le_bytes());
    b[24..32].copy_from_slice(&pages.to_le_bytes());
    b[32..40].copy_from_slice(&c.spare.to_le_bytes());
    let crc = crc32c::crc32c(&b[12..4096]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Whether bytes 12..4096 of `b` match the label checksum at 8..12 (an
/// in-place file's meta page keeps its checksum at 0..4, over 4..: a
/// match there is a 2^-32 chance).
fn label_checksum_matches(b: &[u8]) -> bool {
    b.len() >= 4096
        && u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) == crc32c::crc32c(&b[12..4096])
}

fn decode_label(b: &[u8]) -> Result<(RemapConfig, u64)> {
    let bad = |what: &str| Error::Corrupt {
        page: 0,
        what: format!("out-of-place label: {what}"),
    };
    if let Some(v) = OLD_LABEL_MAGICS.iter().position(|m| &b[..8] == *m) {
        return Err(Error::Unsupported(format!(
            "an out-of-place device of format {}; this build reads format 3 (extents and \
             barrier intents): copy its data out with the build that wrote it",
            v + 1
        )));
    }
    if &b[..8] != LABEL_MAGIC {
        return Err(bad("no label (not an out-of-place device)"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    if !label_checksum_matches(b) {
        return Err(bad("checksum mismatch"));
    }
    let compress = match u32_at(20) {
        0 => false,
        1 => true,
        other => return Err(bad(&format!("compression flag {other}"))),
    };
    let config = RemapConfig {
        page_size: u32_at(12),
        segment_pages: u32_at(16),
        spare: f64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
        compress,
    };
    config.check().map_err(|e| bad(&e.to_string()))?;
    let pages = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
    Ok((config, pages))
}

/// Intent layout (up to `intent_pages` pages, two copies after the
/// label; only the pages it fills are written): magic (8), crc32c of
/// bytes 12..24 + 4 * count (4), count (4), number (8: from the device's
/// counter, higher is newer), then `count` data segment numbers (4 bytes
/// each): the segments whose summaries the barrier round that wrote it
/// writes next.
fn encode_intent(b: &mut [u8], number: u64, segments: impl Iterator<Item = u32>) {
    b.fill(0);
    b[..8].copy_from_slice(INTENT_MAGIC);
    b[16..24].copy_from_slice(&number.to_le_bytes());
    let mut count = 0usize;
    for (i, s) in segments.enumerate() {
        let o = INTENT_HEADER + 4 * i;
        b[o..o + 4].copy_from_slice(&s.to_le_bytes());
        count += 1;
    }
    b[12..16].copy_from_slice(&(count as u32).to_le_bytes());
    let crc = crc32c::crc32c(&b[12..INTENT_HEADER + 4 * count]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Stamps, versions and intent numbers (one clock) stay below this: a
/// summary keeps a stamp in 7 bytes.
const STAMP_END: u64 = 1 << 56;

/// The intent in `b` (its number and segments), if it is a valid one.
fn decode_intent(b: &[u8]) -> Option<(u64, Vec<u32>)> {
    if b.len() < INTENT_HEADER || &b[..8] != INTENT_MAGIC {
        return None;
    }
    let count = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")) as usize;
    if count > (b.len() - INTENT_HEADER) / 4 {
        return None;
    }
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[12..INTENT_HEADER + 4 * count]) {
        return None;
    }
    let number = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if number >= STAMP_END {
        // The clock restarts past it, and stamps keep 7 bytes: a larger
        // one (forged, with a valid checksum) would be cut short in every
        // later summary, and older versions would win at the next open (a
        // review's finding).
        return None;
    }
    let segments = (0..count)
        .map(|i| {
            let o = INTENT_HEADER + 4 * i;
            u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
        })
        .collect();
    Some((number, segments))
}

/// What a summary says besides its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SummaryHead {
    segment: u32,
    stream: u8,
    version: u64,
}

/// Summary layout: magic (8), crc32c of bytes 12.. (4), segment (4),
/// count (4), stream (4), version (8), then `count` entries of 16 bytes:
/// logical page (5 bytes, all ones: none), stamp (7), first unit (2),
/// units - 1 (1), zero (1). Little-endian throughout.
fn encode_summary(b: &mut [u8], head: SummaryHead, entries: &[Entry]) {
    b.fill(0);
    b[..8].copy_from_slice(SUMMARY_MAGIC);
    b[12..16].copy_from_slice(&head.segment.to_le_bytes());
    b[16..20].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&u32::from(head.stream).to_le_bytes());
    b[24..32].copy_from_slice(&head.version.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let o = SUMMARY_HEADER + i * ENTRY_BYTES;
        let page = if e.page == NO_PAGE {
            NO_PAGE_40
        } else {
            e.page
        };
        debug_assert!(page <= NO_PAGE_40 && e.stamp < STAMP_END);
        debug_assert!(e.start < 1 << 16 && (1..=256).contains(&e.units));
        b[o..o + 5].copy_from_slice(&page.to_le_bytes()[..5]);
        b[o + 5..o + 12].copy_from_slice(&e.stamp.to_le_bytes()[..7]);
        b[o + 12..o + 14].copy_from_slice(&(e.start as u16).to_le_bytes());
        b[o + 14] = (e.units - 1) as u8;
    }
    let crc = crc32c::crc32c(&b[12..]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// A segment's summary as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Summary {
    segment: u32,
    stream: u8,
    version: u64,
    /// The extents handed out, in order.
    entries: Vec<Entry>,
}

/// The summary in `b`, if it is a valid one for a segment of shape `g`:
/// its checksum holds and every extent lies inside the data area (the
/// extents of several chunks interleave, so their order is not checked).
fn decode_summary(b: &[u8], g: &Geometry) -> Option<Summary> {
    if &b[..8] != SUMMARY_MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[12..]) {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let segment = u32_at(12);
    let count = u32_at(16) as usize;
    let stream = u8::try_from(u32_at(20)).ok()?;
    if count > g.entry_cap as usize || SUMMARY_HEADER + count * ENTRY_BYTES > b.len() {
        return None;
    }
    let version = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
    if version >= STAMP_END {
        // As an intent's number (`decode_intent`).
        return None;
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let o = SUMMARY_HEADER + i * ENTRY_BYTES;
        let mut w = [0u8; 8];
        w[..5].copy_from_slice(&b[o..o + 5]);
        let page = u64::from_le_bytes(w);
        let mut w = [0u8; 8];
        w[..7].copy_from_slice(&b[o + 5..o + 12]);
        let stamp = u64::from_le_bytes(w);
        let start = u16::from_le_bytes([b[o + 12], b[o + 13]]) as u32;
        let units = b[o + 14] as u32 + 1;
        // A checksummed summary this build did not write (or a bug):
        // taken as no summary rather than trusted.
        if units > g.upp || start + units > g.data_units || b[o + 15] != 0 {
            return None;
        }
        entries.push(Entry {
            page: if page == NO_PAGE_40 { NO_PAGE } else { page },
            stamp,
            born: stamp,
            start,
            units,
        });
    }
    Some(Summary {
        segment,
        stream,
        version,
        entries,
    })
}

fn flush(q: &mut dyn IoQueue) -> Result<()> {
    sync_io(q, Request::flush(0))?.result.map(|_| ())
}

fn read_at(q: &mut dyn IoQueue, at: u64, buf: IoBuf) -> Result<IoBuf> {
    let c = sync_io(q, Request::read(0, at, buf))?;
    c.result?;
    c.buf
        .ok_or_else(|| Error::InvalidArgument("a read handed back no buffer".into()))
}

/// Runs `reqs` on `q` at once (as many in flight as it takes) and returns
/// their completions in order; the first failure fails all. It returns
/// only once every request it sent has completed (or the queue stopped
/// answering for about a second after a failed wait), so no write of a
/// failed run lands after its caller gave its room back; tags carry a
/// number of the run, so a completion of an earlier run the queue stopped
/// answering is never taken for this one's.
fn run_all(q: &mut dyn IoQueue, reqs: Vec<Request>) -> Result<Vec<IoBuf>> {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32;
    let n = reqs.len();
    let mut bufs: Vec<Option<IoBuf>> = (0..n).map(|_| None).collect();
    let mut pending = reqs.into_iter().enumerate().collect::<VecDeque<_>>();
    let mut out = Vec::new();
    let (mut sent, mut done) = (0, 0);
    let mut first_err = None;
    // Failed waits in a row that brought nothing back (about 1 ms each).
    let mut stuck = 0;
    const STUCK_PATIENCE: u32 = 1_000;
    // Bounded: each pass submits what fits and reaps at least one, or
    // ends the run (a refused request with nothing in flight, a queue
    // that fails).
    while done < sent || (first_err.is_none() && !pending.is_empty()) {
        while first_err.is_none() {
            let Some((i, mut r)) = pending.pop_front() else {
                break;
            };
            r.tag = run | i as u64;
            match q.push(r) {
                Ok(()) => sent += 1,
                Err(rej) if done == sent && q.in_flight() + q.queued() == 0 => {
                    // Refused with the queue empty: it never fits.
                    first_err = Some(rej.error);
                }
                Err(rej) => {
                    pending.push_front((i, rej.request));
                    break;
                }
            }
        }
        if done == sent {
            break;
        }
        out.clear();
        if let Err(e) = q.submit().and_then(|_| q.wait(1, None)) {
            // The queue failed: nothing more goes out, and what it still
            // holds is waited for a while (its writes may yet land where
            // the caller gives the room back), then given up on.
            first_err.get_or_insert(e);
            q.reap(&mut out);
            if out.is_empty() {
                stuck += 1;
                if stuck > STUCK_PATIENCE {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else {
            q.reap(&mut out);
        }
        for c in out.drain(..) {
            if c.tag < run || c.tag - run >= n as u64 {
                continue;
            }
            done += 1;
            if let Err(e) = c.result {
                first_err.get_or_insert(e);
            }
            bufs[(c.tag - run) as usize] = c.buf;
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(bufs
        .into_iter()
        .map(|b| b.expect("a buffer back"))
        .collect())
}

fn read_all(q: &mut dyn IoQueue, reads: Vec<(u64, IoBuf)>) -> Result<Vec<IoBuf>> {
    run_all(
        q,
        reads
            .into_iter()
            .map(|(at, b)| Request::read(0, at, b))
            .collect(),
    )
}

/// Writes summaries and the label (unsorted: rewritten at every barrier,
/// apart from the segments' data).
fn write_all(q: &mut dyn IoQueue, writes: impl Iterator<Item = (u64, AlignedBuf)>) -> Result<()> {
    let writes = writes.map(|(at, b)| (at, IoBuf::owned(b))).collect();
    write_all_bufs(q, writes, Placement::Unsorted)
}

fn write_all_bufs(q: &mut dyn IoQueue, writes: Vec<(u64, IoBuf)>, class: Placement) -> Result<()> {
    run_all(
        q,
        writes
            .into_iter()
            .map(|(at, b)| Request::write(0, at, b).placed(class))
            .collect(),
    )
    .map(|_| ())
}
