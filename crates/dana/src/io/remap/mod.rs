//! Out-of-place page writes: a device whose pages keep their logical
//! address while every write lands in a fresh slot of an append-only
//! segment (ZLeanStore, NoFTL's regions; #14 item 2).
//!
//! Owns: the page-to-slot map of one device, its segments (written whole,
//! in order, then collected by valid fraction), the segment summaries
//! that make the map crash safe, the barrier that makes completed writes
//! and their map entries durable together, and the collection of
//! segments (greedy: fewest live slots first). dana's engine above sees a
//! plain device of [`Remap::size`] bytes (fewer than the device holds: the
//! summaries, a label and the spare the collection works in).
//!
//! Never: overwrites the slot that holds a page's last durable version
//! (so a torn write cannot destroy a good page), reuses a segment while
//! the durable summaries may still name one of its slots as a page's
//! newest version, or while a read of one of its slots is in flight, or
//! names a slot in a summary before the slot's data is durable.
//!
//! # Layout (see docs/FORMAT.md, "Out-of-place devices")
//! The device is cut into segments of `segment_pages` pages. Segment 0
//! holds the label (page 0) and nothing else. In every other segment,
//! pages 0 and 1 are its two summary slots and the rest are data slots,
//! written in order. A summary lists, for each data slot written and
//! completed, the logical page it holds and the *stamp* of its map update
//! (a counter of the device, increasing in the order the writes
//! completed); summaries alternate between the two summary slots and carry
//! a version (from the same counter), so a torn summary leaves the one
//! before it readable.
//!
//! # Crash safety
//! A barrier (each flush the engine asks for, and each durable write)
//! flushes the device (every completed data write is durable), writes
//! the summaries of the segments that changed, and flushes again. Opening
//! reads every segment's newer valid summary and maps each logical page to
//! the slot with its highest stamp. A segment is freed only after a
//! barrier that followed the death of its last live slot: the durable
//! summaries then name a newer slot for every page it held, so its old
//! summary, still on the device until the segment's next summary
//! overwrites it, only names versions that lose. A write that completed
//! after the last barrier may be lost at a crash (the page reads as its
//! version before), as an unflushed in-place write may; it is never torn.
//!
//! # Costs
//! DRAM: 8 bytes per logical page (the map) and ~16 bytes per data slot
//! of the segments (their summaries' entries), 24 bytes per page in all:
//! 0.6% of a 4 KiB-page device. Device: 1 label segment, 2 summary pages
//! per segment (1.6% at 128 pages) and the spare. Each barrier: 2 flushes
//! and one page per segment written since the last. Collection, barriers
//! and opening run on a queue of the device's own, blocking the worker or
//! thread that calls them (a barrier runs where the engine flushes: its
//! checkpoints); the engine's reads and writes never block on it unless
//! the free segments run out.

mod queue;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::array::{open_queue, Backend, Target};
use super::{sync_io, AlignedBuf, Alignment, IoBuf, IoQueue, Placement, Request};
use crate::{Error, Result};

pub use queue::RemapQueue;

/// The label's magic: an out-of-place device, format 1.
const LABEL_MAGIC: &[u8; 8] = b"DANAOOP1";
/// A summary's magic.
const SUMMARY_MAGIC: &[u8; 8] = b"DANASUM1";
/// Bytes of a summary's header: magic, crc, segment, count, version.
const SUMMARY_HEADER: usize = 32;
/// Bytes of one summary entry: logical page, stamp.
const ENTRY_BYTES: usize = 16;
/// A slot that holds no page (written by a collection that lost its race,
/// or never completed).
const NO_PAGE: u64 = u64::MAX;
/// Summary slots at the head of each data segment.
const SUMMARY_SLOTS: u64 = 2;
/// The open segments: one per placement class (the collection's copies
/// are [`Placement::Collected`]).
const OPEN_SEGMENTS: usize = super::placement::PLACEMENTS.len();
/// The collection's open segment.
const GC_STREAM: usize = Placement::Collected.index() as usize;
/// Free segments kept for the collection: writes of the engine wait when
/// only these are left.
const GC_RESERVE: usize = 2;
/// How long the collection waits for reads in flight on other workers'
/// queues that pin the segments it emptied.
const PIN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
/// Segments a run of the collection frees beyond what it was asked for.
const GC_BATCH: usize = 4;

/// How an out-of-place device is cut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RemapConfig {
    /// Page size: the engine's (every request is whole pages).
    pub page_size: u32,
    /// Pages per segment, summaries included: the device's erase unit (or
    /// FDP reclaim unit) in pages, so that a segment dies whole on the
    /// flash. 8..=the pages one summary can list + 2.
    pub segment_pages: u32,
    /// Fraction of the data slots kept free beyond the open segments and
    /// the collection's reserve: the room the collection works in.
    pub spare: f64,
}

impl Default for RemapConfig {
    fn default() -> Self {
        RemapConfig {
            page_size: 4096,
            segment_pages: 128,
            spare: 0.05,
        }
    }
}

impl RemapConfig {
    fn check(&self) -> Result<()> {
        let page = self.page_size as usize;
        let most = (page - SUMMARY_HEADER) / ENTRY_BYTES + SUMMARY_SLOTS as usize;
        if !self.page_size.is_power_of_two() || page < 4096 {
            return Err(Error::InvalidArgument(format!(
                "out-of-place page size {page}: a power of two >= 4096"
            )));
        }
        if self.segment_pages < 8 || self.segment_pages as usize > most {
            return Err(Error::InvalidArgument(format!(
                "out-of-place segments of {} pages: 8 to {most} with {page}-byte pages",
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

/// Where a segment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Free: may be opened.
    Free,
    /// Taking writes (of one class, or of the collection).
    Open,
    /// Full, with live slots.
    Closed,
    /// No live slot left: free after the next barrier that starts later.
    Dying { barrier: u64 },
}

/// One segment's state in memory.
#[derive(Debug, Clone)]
struct Segment {
    life: Life,
    /// Data slots whose page the map points at.
    live: u32,
    /// The next data slot to hand out (0-based among the data slots).
    next: u32,
    /// Writes handed a slot here and not completed yet.
    pending: u32,
    /// Reads of its slots in flight.
    readers: u32,
    /// Per data slot: (logical page, stamp) once the write completed.
    entries: Vec<(u64, u64)>,
    /// Changed since its last summary.
    dirty: bool,
    /// The summary slot its next summary goes to (0 or 1).
    summary_slot: u8,
    /// The open-segment stream it was opened for.
    stream: u8,
}

impl Segment {
    fn new(slots: usize) -> Segment {
        Segment {
            life: Life::Free,
            live: 0,
            next: 0,
            pending: 0,
            readers: 0,
            entries: vec![(NO_PAGE, 0); slots],
            dirty: false,
            summary_slot: 0,
            stream: 0,
        }
    }
}

/// Counters of an out-of-place device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemapStats {
    /// Pages written by the engine (each to a new slot).
    pub page_writes: u64,
    /// Pages copied by the collection.
    pub gc_copies: u64,
    /// Segments freed.
    pub segments_freed: u64,
    /// Freed segments the device was told to trim.
    pub segments_trimmed: u64,
    /// Summary pages written.
    pub summary_writes: u64,
    /// Barriers run.
    pub barriers: u64,
    /// Times a write found no free segment and ran the collection itself.
    pub write_stalls: u64,
}

impl RemapStats {
    /// The counts since `earlier` (a snapshot of the same device).
    pub fn since(&self, earlier: &RemapStats) -> RemapStats {
        RemapStats {
            page_writes: self.page_writes - earlier.page_writes,
            gc_copies: self.gc_copies - earlier.gc_copies,
            segments_freed: self.segments_freed - earlier.segments_freed,
            segments_trimmed: self.segments_trimmed - earlier.segments_trimmed,
            summary_writes: self.summary_writes - earlier.summary_writes,
            barriers: self.barriers - earlier.barriers,
            write_stalls: self.write_stalls - earlier.write_stalls,
        }
    }
}

/// The shared state of an out-of-place device, behind one lock.
#[derive(Debug)]
struct State {
    /// Logical page -> physical page (NO_PAGE: never written).
    map: Vec<u64>,
    segments: Vec<Segment>,
    free: VecDeque<u32>,
    /// Segments with no live slot, waiting for a barrier (`Life::Dying`).
    dying: Vec<u32>,
    /// The open segment of each stream.
    open: [Option<u32>; OPEN_SEGMENTS],
    /// The next stamp or summary version.
    clock: u64,
    /// Barriers started so far.
    barriers_started: u64,
    stats: RemapStats,
}

/// An out-of-place device over a file, block device or simulated device.
pub struct Remap {
    inner: Target,
    config: RemapConfig,
    /// Data segments (segment 0, the label's, is not one).
    segments: u64,
    /// Logical pages offered to the engine.
    pages: u64,
    state: Mutex<State>,
    /// The device's own queue: barriers, collection, summaries. Held for a
    /// whole barrier or collection run, so they run one at a time.
    own: Mutex<Box<dyn IoQueue>>,
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
        let mut label = remap.page_buf()?;
        encode_label(&mut label, &config, remap.pages);
        write_all(&mut **q, std::iter::once((0, label)))?;
        // Old summaries of whatever the device held before must not be
        // taken for this device's: every summary slot gets zeros, a batch
        // of fresh (zeroed) pages at a time.
        let slots: Vec<u64> = (1..=remap.segments)
            .flat_map(|s| (0..SUMMARY_SLOTS).map(move |k| s * config.segment_pages as u64 + k))
            .collect();
        for batch in slots.chunks(128) {
            let zeros = batch
                .iter()
                .map(|&page| Ok((page * config.page_size as u64, remap.page_buf()?)))
                .collect::<Result<Vec<_>>>()?;
            write_all(&mut **q, zeros.into_iter())?;
        }
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

    /// True if `inner` holds an out-of-place device's label.
    pub fn is_formatted(inner: &Target) -> Result<bool> {
        let align = inner.alignment();
        if inner.size() < 4096 {
            return Ok(false);
        }
        let mut q = open_queue(inner, &Backend::Blocking, 1)?;
        let len = (align.io.max(align.mem) as usize).max(4096);
        let buf = IoBuf::owned(AlignedBuf::new(len, align.mem as usize)?);
        let buf = read_at(&mut *q, 0, buf)?;
        Ok(buf.as_owned().is_some_and(|b| &b[..8] == LABEL_MAGIC))
    }

    fn new(inner: Target, config: RemapConfig, pages: Option<u64>) -> Result<Remap> {
        config.check()?;
        let page = config.page_size as u64;
        let seg = config.segment_pages as u64;
        let align = inner.alignment();
        if page % align.io != 0 || page % align.mem != 0 {
            return Err(Error::InvalidArgument(format!(
                "out-of-place page size {page} is not a multiple of the device's alignment {}",
                align.io.max(align.mem)
            )));
        }
        let segments = (inner.size() / page / seg).saturating_sub(1);
        let least = (OPEN_SEGMENTS + GC_RESERVE + 2) as u64;
        if segments < least {
            return Err(Error::InvalidArgument(format!(
                "an out-of-place device needs at least {} segments of {} bytes; {} bytes hold {}",
                least + 1,
                seg * page,
                inner.size(),
                segments + 1
            )));
        }
        let slots = seg - SUMMARY_SLOTS;
        let offered_by = |segments: u64| {
            let usable = (segments - (OPEN_SEGMENTS + GC_RESERVE) as u64) * slots;
            ((usable as f64) * (1.0 - config.spare)) as u64
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
        let own = open_queue(&inner, &Backend::Blocking, 256)?;
        let segs = (0..segments)
            .map(|_| Segment::new(slots as usize))
            .collect();
        let state = State {
            map: vec![NO_PAGE; pages as usize],
            segments: segs,
            free: (0..segments as u32).collect(),
            dying: Vec::new(),
            open: [None; OPEN_SEGMENTS],
            clock: 1,
            barriers_started: 0,
            stats: RemapStats::default(),
        };
        Ok(Remap {
            inner,
            config,
            segments,
            pages,
            state: Mutex::new(state),
            own: Mutex::new(own),
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
        let a = self.inner.alignment();
        AlignedBuf::new(self.config.page_size as usize, a.mem as usize)
    }

    fn seg_pages(&self) -> u64 {
        self.config.segment_pages as u64
    }

    fn data_slots(&self) -> usize {
        (self.seg_pages() - SUMMARY_SLOTS) as usize
    }

    /// Physical page of data slot `k` of data segment `s`.
    fn slot_page(&self, s: u32, k: u32) -> u64 {
        (s as u64 + 1) * self.seg_pages() + SUMMARY_SLOTS + k as u64
    }

    /// (data segment, data slot) of a physical page.
    fn slot_of(&self, page: u64) -> (u32, u32) {
        let seg = self.seg_pages();
        ((page / seg - 1) as u32, (page % seg - SUMMARY_SLOTS) as u32)
    }

    /// Where logical page `page` lives now, pinning its segment against
    /// reuse until [`Remap::read_done`] (None: never written, reads as
    /// zeros).
    pub(crate) fn read_slot(&self, page: u64) -> Option<u64> {
        let mut st = self.lock();
        let slot = *st.map.get(page as usize)?;
        if slot == NO_PAGE {
            return None;
        }
        let (s, _) = self.slot_of(slot);
        st.segments[s as usize].readers += 1;
        Some(slot)
    }

    /// A read of physical page `slot` ended.
    pub(crate) fn read_done(&self, slot: u64) {
        let (s, _) = self.slot_of(slot);
        let mut st = self.lock();
        let seg = &mut st.segments[s as usize];
        seg.readers -= 1;
    }

    /// Hands out a fresh slot for a write of class `placement`, or None
    /// when only the collection's reserve of free segments is left: the
    /// caller then lets its own reads in flight end (they pin their
    /// segments) and runs [`Remap::collect`].
    pub(crate) fn write_slot(&self, placement: Placement) -> Option<u64> {
        let stream = placement_stream(placement);
        let mut st = self.lock();
        match self.take_slot(&mut st, stream, GC_RESERVE) {
            Some(slot) => {
                st.stats.page_writes += 1;
                Some(slot)
            }
            None => {
                st.stats.write_stalls += 1;
                None
            }
        }
    }

    /// A slot of stream `stream`'s open segment, opening a free one (if
    /// more than `reserve` are free) when it is full.
    fn take_slot(&self, st: &mut State, stream: usize, reserve: usize) -> Option<u64> {
        let slots = self.data_slots() as u32;
        if let Some(s) = st.open[stream] {
            let seg = &mut st.segments[s as usize];
            if seg.next < slots {
                let k = seg.next;
                seg.next += 1;
                seg.pending += 1;
                if seg.next == slots {
                    // Its last slot is pending: it dies, if ever, when a
                    // write ends (`write_done`).
                    seg.life = Life::Closed;
                    st.open[stream] = None;
                }
                return Some(self.slot_page(s, k));
            }
        }
        if st.free.len() <= reserve {
            return None;
        }
        let s = st.free.pop_front()?;
        let seg = &mut st.segments[s as usize];
        debug_assert_eq!(seg.life, Life::Free);
        debug_assert_eq!(seg.live, 0);
        seg.life = Life::Open;
        seg.next = 0;
        seg.pending = 0;
        seg.entries.fill((NO_PAGE, 0));
        seg.dirty = true;
        seg.stream = stream as u8;
        st.open[stream] = Some(s);
        self.take_slot(st, stream, reserve)
    }

    /// The write of logical page `page` to physical page `slot` ended
    /// (`ok`: it completed): the map points at it, and the page's former
    /// slot dies. With `only_from`, the map moves only if it still points
    /// there (a collection's copy loses to a newer write of the engine).
    fn write_done(&self, page: u64, slot: u64, ok: bool, only_from: Option<u64>) {
        let (s, k) = self.slot_of(slot);
        let mut st = self.lock();
        let barrier = st.barriers_started;
        st.segments[s as usize].pending -= 1;
        let moves = ok && only_from.is_none_or(|from| st.map[page as usize] == from);
        if moves {
            let stamp = st.clock;
            st.clock += 1;
            let old = std::mem::replace(&mut st.map[page as usize], slot);
            let seg = &mut st.segments[s as usize];
            seg.entries[k as usize] = (page, stamp);
            seg.live += 1;
            seg.dirty = true;
            if old != NO_PAGE {
                let (os, _) = self.slot_of(old);
                st.segments[os as usize].live -= 1;
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
        self.barrier_on(&mut **q)
    }

    fn barrier_on(&self, q: &mut dyn IoQueue) -> Result<()> {
        // The summaries name only writes that completed before this point,
        // and the first flush makes their data durable before any summary
        // is written.
        let (started, summaries) = {
            let mut st = self.lock();
            st.barriers_started += 1;
            let started = st.barriers_started;
            let mut out = Vec::new();
            for s in 0..st.segments.len() {
                if !st.segments[s].dirty {
                    continue;
                }
                let version = st.clock;
                st.clock += 1;
                let seg = &mut st.segments[s];
                seg.dirty = false;
                let slot = seg.summary_slot;
                seg.summary_slot ^= 1;
                let mut buf = self.page_buf()?;
                let head = SummaryHead {
                    segment: s as u32,
                    stream: seg.stream,
                    version,
                };
                encode_summary(&mut buf, head, &seg.entries[..seg.next as usize]);
                let at = ((s as u64 + 1) * self.seg_pages() + slot as u64)
                    * self.config.page_size as u64;
                out.push((s, at, buf));
            }
            (started, out)
        };
        let written = summaries.len() as u64;
        let dirty: Vec<usize> = summaries.iter().map(|(s, _, _)| *s).collect();
        let result = flush(q)
            .and_then(|_| write_all(q, summaries.into_iter().map(|(_, at, b)| (at, b))))
            .and_then(|_| flush(q));
        let mut st = self.lock();
        st.stats.barriers += 1;
        st.stats.summary_writes += written;
        if let Err(e) = result {
            // The slot written to may be torn: the next summary goes there
            // again, so the other slot keeps the last good one.
            for s in dirty {
                let seg = &mut st.segments[s];
                seg.dirty = true;
                seg.summary_slot ^= 1;
            }
            return Err(e);
        }
        // Free (not yet in the free list, so nobody opens them before
        // their trim).
        let mut freed = Vec::new();
        let State {
            dying, segments, ..
        } = &mut *st;
        dying.retain(|&s| {
            let seg = &mut segments[s as usize];
            let free = matches!(seg.life, Life::Dying { barrier } if barrier < started)
                && seg.readers == 0;
            if free {
                debug_assert!(seg.live == 0 && seg.pending == 0);
                seg.life = Life::Free;
                freed.push(s);
            }
            !free
        });
        drop(st);
        // Trimmed whole, summaries too (an old summary that reads as zeros
        // is no summary): the device's collection never copies a dead
        // segment. Advice: a failed trim frees the segment all the same.
        let seg_bytes = self.seg_pages() * self.config.page_size as u64;
        let mut trimmed = 0;
        for &s in &freed {
            if self
                .inner
                .discard((s as u64 + 1) * seg_bytes, seg_bytes)
                .is_ok()
            {
                trimmed += 1;
            }
        }
        let mut st = self.lock();
        st.stats.segments_freed += freed.len() as u64;
        st.stats.segments_trimmed += trimmed;
        st.free.extend(freed);
        Ok(())
    }

    /// Frees at least `want` segments (a few more when it can) by copying
    /// the live slots of the closed segments with the fewest out, then a
    /// barrier. Blocking.
    pub fn collect(&self, want: usize) -> Result<()> {
        let mut q = self.own_queue();
        let q = &mut **q;
        let goal = GC_RESERVE + want.max(1);
        let enough = goal + GC_BATCH;
        // Segments already dead need only a barrier.
        if self.dying() > 0 {
            self.barrier_on(q)?;
        }
        // Bounded: each pass empties a segment or frees the emptied ones;
        // a segment another worker's read still pins is waited for, up
        // to PIN_PATIENCE.
        let started = std::time::Instant::now();
        for _ in 0..2 * self.segments {
            let free = self.lock().free.len();
            let dying = self.dying();
            if free >= goal && dying == 0 {
                break;
            }
            // The emptied segments are freed by a barrier once there are
            // enough, or before the copies run out of room.
            if dying > 0 && (free + dying >= enough || free <= 1) {
                self.barrier_on(q)?;
                let now = self.lock().free.len();
                if now >= goal {
                    break;
                }
                if now <= 1 && now == free {
                    // Every emptied segment is pinned by a read in flight
                    // on another worker's queue: give it time to end.
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
            self.copy_out(q, victim)?;
        }
        if self.dying() > 0 {
            self.barrier_on(q)?;
        }
        if self.lock().free.len() > GC_RESERVE {
            Ok(())
        } else {
            Err(Error::NoSpace(format!(
                "out-of-place device: no segment can be freed ({} live pages in {} segments)",
                self.mapped_pages(),
                self.segments
            )))
        }
    }

    /// Segments waiting for a barrier to be freed.
    fn dying(&self) -> usize {
        self.lock().dying.len()
    }

    /// The closed segment with the fewest live slots, if any has a dead
    /// one.
    fn pick_victim(&self) -> Option<u32> {
        let st = self.lock();
        let full = self.data_slots() as u32;
        st.segments
            .iter()
            .enumerate()
            .filter(|(_, g)| g.life == Life::Closed && g.pending == 0 && g.live < full)
            .min_by_key(|(_, g)| g.live)
            .map(|(s, _)| s as u32)
    }

    /// Copies the live slots of segment `victim` to the collection's open
    /// segment.
    fn copy_out(&self, q: &mut dyn IoQueue, victim: u32) -> Result<()> {
        let moves: Vec<(u64, u64, u64)> = {
            let mut st = self.lock();
            let live: Vec<(u64, u64)> = st.segments[victim as usize]
                .entries
                .iter()
                .enumerate()
                .filter(|(k, (page, _))| {
                    *page != NO_PAGE && st.map[*page as usize] == self.slot_page(victim, *k as u32)
                })
                .map(|(k, (page, _))| (*page, self.slot_page(victim, k as u32)))
                .collect();
            let mut out = Vec::with_capacity(live.len());
            for (page, from) in live {
                let Some(to) = self.take_slot(&mut st, GC_STREAM, 0) else {
                    break;
                };
                st.stats.gc_copies += 1;
                out.push((page, from, to));
            }
            st.segments[victim as usize].readers += 1;
            out
        };
        let page = self.config.page_size as usize;
        let mut bufs = Vec::with_capacity(moves.len());
        let mut result = Ok(());
        for chunk in moves.chunks(64) {
            let mut reads = Vec::with_capacity(chunk.len());
            for &(_, from, _) in chunk {
                reads.push((from * page as u64, IoBuf::owned(self.page_buf()?)));
            }
            match read_all(q, reads) {
                Ok(r) => bufs.extend(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.lock().segments[victim as usize].readers -= 1;
        let writes = moves
            .iter()
            .zip(bufs)
            .map(|(&(_, _, to), b)| (to * page as u64, b));
        if result.is_ok() {
            result = write_all_bufs(q, writes.collect(), Placement::Collected);
        }
        for &(p, from, to) in &moves {
            self.write_done(p, to, result.is_ok(), Some(from));
        }
        result
    }

    /// Rebuilds the map from every segment's newer valid summary.
    fn recover(&self) -> Result<()> {
        let mut q = self.own_queue();
        let page = self.config.page_size as u64;
        // Per segment: its newest valid summary and the slot it is in.
        let mut best: Vec<Option<(Summary, u8)>> = vec![None; self.segments as usize];
        let mut clock = 1;
        let segs: Vec<u64> = (0..self.segments).collect();
        for chunk in segs.chunks(32) {
            let mut reads = Vec::with_capacity(chunk.len() * 2);
            for &s in chunk {
                for k in 0..SUMMARY_SLOTS {
                    let at = ((s + 1) * self.seg_pages() + k) * page;
                    reads.push((at, IoBuf::owned(self.page_buf()?)));
                }
            }
            let bufs = read_all(&mut **q, reads)?;
            for (i, b) in bufs.iter().enumerate() {
                let s = chunk[i / 2];
                let b = b.as_owned().expect("an owned buffer");
                if let Some(summary) = decode_summary(b, self.data_slots()) {
                    if summary.segment as u64 != s {
                        continue;
                    }
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
        let mut st = self.lock();
        let mut stamps = vec![0u64; self.pages as usize];
        for (s, b) in best.iter().enumerate() {
            let Some((summary, _)) = b else { continue };
            for (k, &(p, stamp)) in summary.entries.iter().enumerate() {
                if p == NO_PAGE || p >= self.pages {
                    continue;
                }
                clock = clock.max(stamp + 1);
                if stamp > stamps[p as usize] {
                    stamps[p as usize] = stamp;
                    st.map[p as usize] = self.slot_page(s as u32, k as u32);
                }
            }
        }
        st.clock = clock;
        st.free.clear();
        st.dying.clear();
        let slots = self.data_slots();
        // Per stream, the newest segment it had not filled: it goes on
        // taking that stream's writes after the slots its summary lists
        // (the device's erase blocks stay aligned with the segments).
        let mut resume: [Option<(u64, usize)>; OPEN_SEGMENTS] = [None; OPEN_SEGMENTS];
        for (s, b) in best.iter().enumerate() {
            if let Some((summary, _)) = b {
                let stream = summary.stream as usize;
                if summary.entries.len() < slots
                    && stream < OPEN_SEGMENTS
                    && resume[stream].is_none_or(|(v, _)| summary.version > v)
                {
                    resume[stream] = Some((summary.version, s));
                }
            }
        }
        let mut next = vec![slots as u32; st.segments.len()];
        for (s, b) in best.into_iter().enumerate() {
            let seg = &mut st.segments[s];
            match b {
                Some((summary, slot)) => {
                    next[s] = summary.entries.len() as u32;
                    seg.stream = summary.stream;
                    seg.entries = summary.entries;
                    seg.entries.resize(slots, (NO_PAGE, 0));
                    seg.summary_slot = slot ^ 1;
                }
                None => seg.entries.fill((NO_PAGE, 0)),
            }
        }
        let map = std::mem::take(&mut st.map);
        for &slot in map.iter().filter(|&&s| s != NO_PAGE) {
            let (s, _) = self.slot_of(slot);
            st.segments[s as usize].live += 1;
        }
        st.map = map;
        for s in 0..st.segments.len() {
            let seg = &mut st.segments[s];
            seg.next = slots as u32;
            if seg.live == 0 {
                seg.life = Life::Free;
                st.free.push_back(s as u32);
            } else {
                seg.life = Life::Closed;
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
        Ok(())
    }
}

/// Segment `s` dies (waits for a barrier to be freed) once it is closed
/// with no live slot and no write pending.
fn die_if_dead(st: &mut State, s: u32, barrier: u64) {
    let seg = &mut st.segments[s as usize];
    if seg.live == 0 && seg.pending == 0 && seg.life == Life::Closed {
        seg.life = Life::Dying { barrier };
        st.dying.push(s);
    }
}

/// The open-segment stream of a placement class.
fn placement_stream(p: Placement) -> usize {
    super::placement::PLACEMENTS
        .iter()
        .position(|&c| c == p)
        .unwrap_or(0)
}

fn encode_label(b: &mut [u8], c: &RemapConfig, pages: u64) {
    b.fill(0);
    b[..8].copy_from_slice(LABEL_MAGIC);
    b[12..16].copy_from_slice(&c.page_size.to_le_bytes());
    b[16..20].copy_from_slice(&c.segment_pages.to_le_bytes());
    b[24..32].copy_from_slice(&pages.to_le_bytes());
    b[32..40].copy_from_slice(&c.spare.to_le_bytes());
    let crc = crc32c::crc32c(&b[12..4096]);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
}

fn decode_label(b: &[u8]) -> Result<(RemapConfig, u64)> {
    let bad = |what: &str| Error::Corrupt {
        page: 0,
        what: format!("out-of-place label: {what}"),
    };
    if &b[..8] != LABEL_MAGIC {
        return Err(bad("no label (not an out-of-place device)"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    if u32_at(8) != crc32c::crc32c(&b[12..4096]) {
        return Err(bad("checksum mismatch"));
    }
    let config = RemapConfig {
        page_size: u32_at(12),
        segment_pages: u32_at(16),
        spare: f64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
    };
    config.check().map_err(|e| bad(&e.to_string()))?;
    let pages = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
    Ok((config, pages))
}

/// What a summary says besides its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SummaryHead {
    segment: u32,
    stream: u8,
    version: u64,
}

/// Summary layout: magic (8), crc32c of bytes 12.. (4), segment (4),
/// count (4), stream (4), version (8), then `count` entries (logical
/// page, stamp): the slots handed out so far.
fn encode_summary(b: &mut [u8], head: SummaryHead, entries: &[(u64, u64)]) {
    b.fill(0);
    b[..8].copy_from_slice(SUMMARY_MAGIC);
    b[12..16].copy_from_slice(&head.segment.to_le_bytes());
    b[16..20].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&u32::from(head.stream).to_le_bytes());
    b[24..32].copy_from_slice(&head.version.to_le_bytes());
    for (i, &(p, s)) in entries.iter().enumerate() {
        let o = SUMMARY_HEADER + i * ENTRY_BYTES;
        b[o..o + 8].copy_from_slice(&p.to_le_bytes());
        b[o + 8..o + 16].copy_from_slice(&s.to_le_bytes());
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
    /// Per data slot: (logical page or NO_PAGE, stamp).
    entries: Vec<(u64, u64)>,
}

/// The summary in `b`, if it is a valid one.
fn decode_summary(b: &[u8], slots: usize) -> Option<Summary> {
    if &b[..8] != SUMMARY_MAGIC {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[12..]) {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let segment = u32_at(12);
    let count = u32_at(16) as usize;
    let stream = u8::try_from(u32_at(20)).ok()?;
    if count > slots || SUMMARY_HEADER + count * ENTRY_BYTES > b.len() {
        return None;
    }
    let version = u64_at(24);
    let entries = (0..count)
        .map(|i| {
            let o = SUMMARY_HEADER + i * ENTRY_BYTES;
            (u64_at(o), u64_at(o + 8))
        })
        .collect();
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
/// their completions in order; the first failure fails all.
fn run_all(q: &mut dyn IoQueue, reqs: Vec<Request>) -> Result<Vec<IoBuf>> {
    let n = reqs.len();
    let mut bufs: Vec<Option<IoBuf>> = (0..n).map(|_| None).collect();
    let mut pending = reqs.into_iter().enumerate().collect::<VecDeque<_>>();
    let mut out = Vec::new();
    let mut done = 0;
    let mut first_err = None;
    // Bounded: each pass submits what fits and reaps at least one.
    while done < n {
        while let Some((i, mut r)) = pending.pop_front() {
            r.tag = i as u64;
            match q.push(r) {
                Ok(()) => {}
                Err(rej) => {
                    pending.push_front((i, rej.request));
                    break;
                }
            }
        }
        q.submit()?;
        q.wait(1, None)?;
        out.clear();
        q.reap(&mut out);
        for c in out.drain(..) {
            done += 1;
            if let Err(e) = c.result {
                first_err.get_or_insert(e);
            }
            bufs[c.tag as usize] = c.buf;
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
