//! The simulated device: memory-backed, with a latency and IOPS model, a
//! deterministic mode, fault injection and power cuts.
//!
//! Owns: a [`SimDisk`] (one simulated device, shared through an `Arc` by
//! the queues of every worker) holding a sparse *durable* image and a
//! *volatile* layer of writes that completed but are not yet covered by a
//! completed flush; the state of every [`SimQueue`] opened on it (requests
//! queued and in flight); the injected faults; the device's counters.
//!
//! Model:
//! - A write's data is captured (copied from its buffer) when it
//!   **completes**, that is when its queue hands out the completion. Reads
//!   see the durable image overlaid by the volatile writes in completion
//!   order. Unwritten areas read as zeros.
//! - A flush, when it completes, makes durable every write that had
//!   completed before the flush was **submitted** (what `fdatasync`
//!   promises); a write completing while the flush is in flight stays
//!   volatile.
//! - A power cut ([`SimDisk::power_cut`]) decides, per a seeded RNG, the
//!   fate of every write that is not durable (completed but unflushed, or
//!   still queued or in flight in any queue): kept, dropped, or torn at
//!   512-byte granularity (each sector new, old, or garbage). The disk is
//!   then off: every queue opened before fails all its pending and further
//!   requests with `EIO`, forever. [`SimDisk::power_on`] makes the disk
//!   usable again for queues opened afterwards.
//! - Clock: in real-time mode a request is ready `latency` after it starts
//!   service, and starts no sooner than the IOPS limit allows (a token
//!   bucket shared by all queues of the device). In deterministic mode there
//!   is no wall clock: each `reap` completes a seeded-random subset (at least
//!   one) of the requests in flight, in a seeded-random order, so the same
//!   seed and the same calls give the same interleaving.
//!
//! Invariants:
//! - Requests are checked with [`Alignment::check`] at push, as on the real
//!   backends; a request never touches bytes outside the device.
//! - A request's [`IoBuf`](super::IoBuf) is held in the disk's state from `push` until its
//!   completion is handed out (or the queue is dropped), so every access to
//!   its memory happens while it is alive.
//! - A chunk is in the `dirty` map exactly while some volatile write touches
//!   it, and then holds the current (durable + volatile) content.
//!
//! Never: panics on an injected fault or a power cut (they surface as `Err`
//! in a [`Completion`]); sleeps in deterministic mode; lets a queue opened
//! before a power cut touch the data after it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::ftl::{Ftl, FtlConfig, FtlStats};
use super::{Alignment, Completion, IoQueue, Rejected, Request};
use crate::{Error, OpKind, Result};

/// Granularity of tearing and of read corruption.
const SECTOR: usize = 512;
/// Granularity of the sparse images.
const CHUNK: usize = 4096;

type Chunk = Box<[u8; CHUNK]>;

fn zero_chunk() -> Chunk {
    Box::new([0u8; CHUNK])
}

/// Calls `f(chunk index, offset in chunk, range in the data)` for each
/// chunk that `[offset, offset + len)` touches.
fn for_each_chunk(offset: u64, len: usize, mut f: impl FnMut(u64, usize, Range<usize>)) {
    let mut done = 0;
    while done < len {
        let pos = offset + done as u64;
        let within = (pos % CHUNK as u64) as usize;
        let n = (CHUNK - within).min(len - done);
        f(pos / CHUNK as u64, within, done..done + n);
        done += n;
    }
}

/// A probability usable with `gen_bool`: NaN counts as 0.
fn probability(p: f64) -> f64 {
    if p.is_nan() {
        0.0
    } else {
        p.clamp(0.0, 1.0)
    }
}

/// How long a request takes once it starts service (real-time mode).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Uniform in `[min, max]`, drawn from the device's seeded RNG.
    Uniform {
        /// Shortest latency.
        min: Duration,
        /// Longest latency.
        max: Duration,
    },
}

/// How the simulator decides when requests complete.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Clock {
    /// Wall clock: a request is ready at its start time plus its latency;
    /// `wait` sleeps.
    RealTime,
    /// No wall clock: on each `reap`, every request in flight completes
    /// with `complete_probability` (at least one completes), in a seeded
    /// random order. `wait` never sleeps.
    Deterministic {
        /// Chance that a given request in flight completes on a given reap.
        complete_probability: f64,
    },
}

/// Settings of one simulated device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Offsets and lengths must be multiples of this (rounded up to a power
    /// of two). Default 512.
    pub io_align: u64,
    /// Buffer addresses must be multiples of this (rounded up to a power of
    /// two). Default 512.
    pub mem_align: u64,
    /// Service time of one request (real-time mode). Default zero: a
    /// request completes at the first reap after its submission.
    pub latency: Latency,
    /// Most requests per second that start service (real-time mode);
    /// `None` for no limit. Default `None`.
    pub iops: Option<u32>,
    /// Real time or deterministic. Default real time.
    pub clock: Clock,
    /// Seed of the latency draws, the read corruption bytes and (mixed with
    /// the device index and the queue's number) each queue's completion
    /// order in deterministic mode.
    pub seed: u64,
    /// The largest untorn write the device offers (`RWF_ATOMIC`, as an
    /// NVMe drive's atomic write unit): a write flagged
    /// [`Request::atomic`] of a power-of-two length up to this, aligned to
    /// its length, lands whole or not at all at a power cut; a flagged
    /// write outside that fails with `EINVAL`. 0 (the default): none.
    pub atomic_write_max: u64,
    /// Durable writes ([`Request::durable`]) persist only themselves, as
    /// on a device with FUA (an NVMe drive; Linux then sends `RWF_DSYNC`
    /// as a write with FUA, no cache flush). False (the default): the write
    /// and every write completed before it, as on a device without FUA
    /// (Linux's `RWF_DSYNC` is then the write and a cache flush). With
    /// FUA an engine that leaves a write unflushed, counting on a later
    /// durable write to carry it, loses it at a cut (a review removed the
    /// flush of the log's control block after a checkpoint and no crash
    /// test failed without this). The writes not yet durable that share a
    /// 4 KiB chunk with a durable write (and those before them) become
    /// durable first: no cut lays an older write over a newer one.
    pub fua: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            io_align: 512,
            mem_align: 512,
            latency: Latency::Fixed(Duration::ZERO),
            iops: None,
            clock: Clock::RealTime,
            seed: 0,
            atomic_write_max: 0,
            fua: false,
        }
    }
}

impl SimConfig {
    /// Deterministic mode with the given seed (each request in flight
    /// completes on a reap with probability 1/2), other settings default.
    pub fn deterministic(seed: u64) -> SimConfig {
        SimConfig {
            clock: Clock::Deterministic {
                complete_probability: 0.5,
            },
            seed,
            ..SimConfig::default()
        }
    }

    /// Deterministic mode in which every request in flight completes at
    /// the next reap (in a seeded order): how many reaps a busy or idle
    /// worker makes cannot change the schedule, so one seed replays
    /// exactly (with one worker and tasks started in a fixed order).
    pub fn replayable(seed: u64) -> SimConfig {
        SimConfig {
            clock: Clock::Deterministic {
                complete_probability: 1.0,
            },
            seed,
            ..SimConfig::default()
        }
    }
}

/// Which requests a [`Fault`] hits.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// The n-th matching request submitted from now, counting from 0 (0 is
    /// the next one). Sticky: that one and every one after it.
    Nth(u64),
    /// Requests whose byte range overlaps this range (never a flush).
    Range(Range<u64>),
    /// Each matching request with probability `p`, drawn from an RNG seeded
    /// with `seed`.
    Probability {
        /// Chance per matching request.
        p: f64,
        /// Seed of the fault's own RNG.
        seed: u64,
    },
}

/// What a [`Fault`] does to the request it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    /// The request fails with this errno (the data is neither read nor
    /// written; a failed flush makes nothing durable).
    Error(i32),
    /// A read succeeds but one byte of every 512-byte sector of the buffer
    /// is flipped. Matches reads only, whatever the fault's `op`.
    CorruptRead,
}

/// A fault to inject into a [`SimDisk`].
///
/// Faults are decided when a request is submitted; the first injected
/// fault that fires on a request decides its effect.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The operation it matches; `None` for any.
    pub op: Option<OpKind>,
    /// Which matching requests it hits.
    pub trigger: Trigger,
    /// Fires on every hit (true) or only on the first, then disappears.
    pub sticky: bool,
    /// What happens to a request it hits.
    pub effect: FaultEffect,
}

impl Fault {
    /// `EIO` on the n-th request of kind `op` (`None`: any) from now,
    /// counting from 0, once.
    pub fn nth(op: Option<OpKind>, n: u64) -> Fault {
        Fault {
            op,
            trigger: Trigger::Nth(n),
            sticky: false,
            effect: FaultEffect::Error(libc::EIO),
        }
    }

    /// `EIO` on the first request of kind `op` overlapping `range`, once.
    pub fn range(op: Option<OpKind>, range: Range<u64>) -> Fault {
        Fault {
            op,
            trigger: Trigger::Range(range),
            sticky: false,
            effect: FaultEffect::Error(libc::EIO),
        }
    }

    /// `EIO` on a request of kind `op` with probability `p` (seeded), once.
    pub fn probability(op: Option<OpKind>, p: f64, seed: u64) -> Fault {
        Fault {
            op,
            trigger: Trigger::Probability { p, seed },
            sticky: false,
            effect: FaultEffect::Error(libc::EIO),
        }
    }

    /// The same fault, firing on every hit instead of once.
    pub fn sticky(self) -> Fault {
        Fault {
            sticky: true,
            ..self
        }
    }

    /// The same fault, failing with `errno` instead of `EIO`.
    pub fn errno(self, errno: i32) -> Fault {
        Fault {
            effect: FaultEffect::Error(errno),
            ..self
        }
    }

    /// The same fault, corrupting the data of reads instead of failing.
    pub fn corrupt_read(self) -> Fault {
        Fault {
            effect: FaultEffect::CorruptRead,
            ..self
        }
    }

    fn matches_op(&self, op: OpKind) -> bool {
        if self.effect == FaultEffect::CorruptRead && op != OpKind::Read {
            return false;
        }
        self.op.is_none_or(|o| o == op)
    }
}

/// What a power cut does to each write that is not durable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PowerCutPolicy {
    /// Every write that is not durable is lost.
    DropAll,
    /// Every write that is not durable (even one still queued) survives.
    KeepAll,
    /// Each write is kept, dropped or torn with probabilities proportional
    /// to these weights. A torn write's 512-byte sectors are each new, old
    /// or garbage with equal probability.
    Random {
        /// Weight of keeping a write.
        keep: f64,
        /// Weight of dropping a write.
        drop: f64,
        /// Weight of tearing a write.
        tear: f64,
    },
    /// Each write is torn after a random number of its 512-byte sectors
    /// (none to all): those land, the rest keep their durable content, as
    /// on a device that writes a request front to back. A flush of many
    /// log records survives as a prefix of them.
    Prefix,
}

/// What happened to one 512-byte sector of a torn write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectorFate {
    /// The write's data reached the medium.
    New,
    /// The sector kept its durable content from before the write.
    Old,
    /// The sector holds random bytes.
    Garbage,
}

/// What happened to one write at a power cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteFate {
    /// Fully durable.
    Kept,
    /// Lost.
    Dropped,
    /// Partly written: one fate per 512-byte sector, in order (the last
    /// sector may be shorter if the write's length is not a multiple of
    /// 512).
    Torn(Vec<SectorFate>),
}

/// One write that was not durable when the power was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutWrite {
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
    /// True if it had completed (unflushed); false if it was still queued
    /// or in flight.
    pub completed: bool,
    /// What became of it.
    pub fate: WriteFate,
}

/// The outcome of [`SimDisk::power_cut`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerCutReport {
    /// Writes that survived whole.
    pub kept: usize,
    /// Writes that were lost.
    pub dropped: usize,
    /// Writes that were torn.
    pub torn: usize,
    /// Requests (of any kind) queued or in flight that will fail with `EIO`.
    pub failed_requests: usize,
    /// Every write that was not durable, in the order it was applied:
    /// completed writes in completion order, then pending writes in push
    /// order.
    pub writes: Vec<CutWrite>,
}

/// Counters of one simulated device (since creation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Read completions (successful or not).
    pub reads: u64,
    /// Write completions (successful or not).
    pub writes: u64,
    /// Flush completions (successful or not).
    pub flushes: u64,
    /// Completions with an error (injected, or after a power cut).
    pub errors: u64,
    /// Bytes read by successful reads.
    pub bytes_read: u64,
    /// Bytes written by successful writes.
    pub bytes_written: u64,
    /// Injected faults that took effect.
    pub faults_fired: u64,
    /// Power cuts.
    pub power_cuts: u64,
    /// Bytes written by successful writes, by placement class
    /// ([`super::Placement::index`]): what the engine told the device
    /// about each write's expected life.
    pub bytes_written_by_placement: [u64; super::placement::PLACEMENTS.len()],
}

struct VolatileWrite {
    seq: u64,
    offset: u64,
    data: Box<[u8]>,
    /// Untorn ([`Request::atomic`]): a power cut keeps or drops it whole.
    atomic: bool,
}

struct DirtyChunk {
    /// Volatile writes touching this chunk.
    writers: u32,
    /// Current content (durable + volatile writes).
    data: Chunk,
}

struct Pending {
    /// Push order across the device.
    seq: u64,
    req: Request,
    /// When the request is ready (real-time mode, once submitted).
    ready_at: Option<Instant>,
    fault: Option<FaultEffect>,
    /// For a flush: volatile writes with a smaller sequence number become
    /// durable when it completes.
    flush_upto: u64,
}

struct QueueState {
    generation: u64,
    queued: Vec<Pending>,
    /// Submitted, in submission order.
    in_flight: Vec<Pending>,
    rng: SmallRng,
}

struct ActiveFault {
    fault: Fault,
    seen: u64,
    rng: SmallRng,
}

struct Inner {
    durable: HashMap<u64, Chunk>,
    dirty: HashMap<u64, DirtyChunk>,
    volatile: VecDeque<VolatileWrite>,
    next_write_seq: u64,
    next_push_seq: u64,
    powered: bool,
    /// Bumped by `power_on`; a queue works only in the generation it was
    /// opened in, while the power is on.
    generation: u64,
    queues: BTreeMap<u64, QueueState>,
    next_queue_id: u64,
    faults: Vec<ActiveFault>,
    rng: SmallRng,
    /// Earliest start of the next request (IOPS token bucket).
    next_start: Option<Instant>,
    stats: SimStats,
    /// Hash of every request pushed (kind, offset, length) and every write
    /// and flush completed (offset, checksum of the data; the flush point),
    /// in order: equal traces replay equally.
    trace: u64,
    /// The flash translation layer model fed with every completed write,
    /// if one is attached.
    ftl: Option<Ftl>,
    /// [`SimConfig::atomic_write_max`].
    atomic_write_max: u64,
    /// [`SimConfig::fua`].
    fua: bool,
}

/// True if a write of `len` bytes at `offset` can be untorn on a device
/// whose largest untorn write is `max` bytes: a power of two up to it,
/// aligned to its length (what the kernel asks of `RWF_ATOMIC`).
fn untorn_fits(max: u64, offset: u64, len: u64) -> bool {
    len.is_power_of_two() && len <= max && offset % len == 0
}

/// Mixes `v` into the trace hash `h` (FNV-1a over its bytes).
fn trace_mix(h: u64, v: u64) -> u64 {
    v.to_le_bytes()
        .iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

impl Inner {
    /// True if a write of `len` bytes at `offset` can be untorn here.
    fn untorn_ok(&self, offset: u64, len: usize) -> bool {
        untorn_fits(self.atomic_write_max, offset, len as u64)
    }

    fn alive(&self, generation: u64) -> bool {
        self.powered && self.generation == generation
    }

    fn read_current_into(&self, offset: u64, out: &mut [u8]) {
        for_each_chunk(offset, out.len(), |idx, within, r| {
            let n = r.len();
            let src = match self.dirty.get(&idx) {
                Some(d) => Some(&d.data),
                None => self.durable.get(&idx),
            };
            match src {
                Some(c) => out[r].copy_from_slice(&c[within..within + n]),
                None => out[r].fill(0),
            }
        });
    }

    fn read_durable_into(&self, offset: u64, out: &mut [u8]) {
        for_each_chunk(offset, out.len(), |idx, within, r| {
            let n = r.len();
            match self.durable.get(&idx) {
                Some(c) => out[r].copy_from_slice(&c[within..within + n]),
                None => out[r].fill(0),
            }
        });
    }

    fn write_durable(&mut self, offset: u64, data: &[u8]) {
        for_each_chunk(offset, data.len(), |idx, within, r| {
            let n = r.len();
            let c = self.durable.entry(idx).or_insert_with(zero_chunk);
            c[within..within + n].copy_from_slice(&data[r]);
        });
    }

    /// The sequence number of the last write not yet durable that touches
    /// a chunk of the `len` bytes at `offset`, if any.
    fn last_overlapping(&self, offset: u64, len: usize) -> Option<u64> {
        let chunks = |at: u64, n: usize| {
            let first = at / CHUNK as u64;
            (first, (at + n.max(1) as u64 - 1) / CHUNK as u64)
        };
        let (first, last) = chunks(offset, len);
        self.volatile
            .iter()
            .rev()
            .find(|w| {
                let (a, b) = chunks(w.offset, w.data.len());
                a <= last && first <= b
            })
            .map(|w| w.seq)
    }

    /// Mixes a completed write into the trace.
    fn trace_write(&mut self, offset: u64, data: &[u8]) {
        self.trace = trace_mix(
            trace_mix(self.trace, offset),
            u64::from(crc32c::crc32c(data)),
        );
    }

    /// A write completed: it joins the volatile layer.
    fn write_volatile(&mut self, offset: u64, data: Box<[u8]>, atomic: bool) {
        self.trace_write(offset, &data);
        let Inner { durable, dirty, .. } = self;
        for_each_chunk(offset, data.len(), |idx, within, r| {
            let n = r.len();
            let d = dirty.entry(idx).or_insert_with(|| DirtyChunk {
                writers: 0,
                data: durable.get(&idx).cloned().unwrap_or_else(zero_chunk),
            });
            d.writers += 1;
            d.data[within..within + n].copy_from_slice(&data[r]);
        });
        let seq = self.next_write_seq;
        self.next_write_seq += 1;
        self.volatile.push_back(VolatileWrite {
            seq,
            offset,
            data,
            atomic,
        });
    }

    /// A flush completed: volatile writes before `upto` become durable.
    fn make_durable(&mut self, upto: u64) {
        self.trace = trace_mix(trace_mix(self.trace, u64::MAX), upto);
        while self.volatile.front().is_some_and(|w| w.seq < upto) {
            let Some(w) = self.volatile.pop_front() else {
                break;
            };
            self.write_durable(w.offset, &w.data);
            let dirty = &mut self.dirty;
            for_each_chunk(w.offset, w.data.len(), |idx, _, _| {
                if let Some(d) = dirty.get_mut(&idx) {
                    d.writers -= 1;
                    if d.writers == 0 {
                        dirty.remove(&idx);
                    }
                }
            });
        }
    }

    /// The effect of the first injected fault that fires on this request.
    fn decide_fault(&mut self, op: OpKind, offset: u64, len: usize) -> Option<FaultEffect> {
        let mut hit = None;
        let mut i = 0;
        while i < self.faults.len() {
            let f = &mut self.faults[i];
            if !f.fault.matches_op(op) {
                i += 1;
                continue;
            }
            let fires = match &f.fault.trigger {
                Trigger::Nth(n) => {
                    let k = f.seen;
                    f.seen += 1;
                    k >= *n
                }
                Trigger::Range(r) => {
                    op != OpKind::Flush
                        && len > 0
                        && offset < r.end
                        && offset.saturating_add(len as u64) > r.start
                }
                Trigger::Probability { p, .. } => f.rng.gen_bool(probability(*p)),
            };
            if fires && hit.is_none() {
                hit = Some(f.fault.effect);
                if !f.fault.sticky {
                    self.faults.remove(i);
                    continue;
                }
            }
            i += 1;
        }
        hit
    }

    /// Finishes one request: applies it to the images (if its queue is
    /// alive and no fault says otherwise) and builds its completion.
    fn complete(&mut self, device: usize, alive: bool, p: Pending) -> Completion {
        let Pending {
            req,
            fault,
            flush_upto,
            ..
        } = p;
        let (op, offset, len) = (req.op, req.offset, req.len());
        let result = match (alive, fault) {
            (false, _) => Err(Error::io(op, device, offset, len, libc::EIO)),
            // As the kernel answers an RWF_ATOMIC write the device cannot
            // make untorn.
            (true, _) if req.atomic && (op != OpKind::Write || !self.untorn_ok(offset, len)) => {
                Err(Error::io(op, device, offset, len, libc::EINVAL))
            }
            (true, Some(FaultEffect::Error(errno))) => {
                self.stats.faults_fired += 1;
                Err(Error::io(op, device, offset, len, errno))
            }
            (true, effect) => match (op, &req.buf) {
                (OpKind::Read, Some(buf)) => {
                    // SAFETY: the request holds the buffer until this completion
                    // is handed back; by IoBuf's contract nobody else touches a
                    // read request's bytes while it is in flight.
                    let bytes = unsafe { buf.bytes_mut() };
                    self.read_current_into(offset, bytes);
                    if effect == Some(FaultEffect::CorruptRead) {
                        self.stats.faults_fired += 1;
                        for sector in bytes.chunks_mut(SECTOR) {
                            let at = self.rng.gen_range(0..sector.len());
                            sector[at] ^= self.rng.gen_range(1..=255u8);
                        }
                    }
                    self.stats.bytes_read += len as u64;
                    Ok(len)
                }
                (OpKind::Write, Some(buf)) => {
                    // SAFETY: the request holds the buffer until this completion
                    // is handed back; by IoBuf's contract nobody writes a write
                    // request's bytes while it is in flight.
                    let data: Box<[u8]> = unsafe { buf.bytes() }.into();
                    if req.durable && self.fua {
                        // FUA: this write alone, after the writes not yet
                        // durable that share a chunk with it (so that no
                        // cut lays one of them over it).
                        if let Some(last) = self.last_overlapping(offset, len) {
                            self.make_durable(last + 1);
                        }
                        self.trace_write(offset, &data);
                        self.write_durable(offset, &data);
                    } else {
                        self.write_volatile(offset, data, req.atomic);
                        if req.durable {
                            // Write-through as Linux does it on a disk
                            // without FUA (RWF_DSYNC: the write, then a
                            // cache flush): this write and every one
                            // completed before it.
                            self.make_durable(self.next_write_seq);
                        }
                    }
                    self.stats.bytes_written += len as u64;
                    self.stats.bytes_written_by_placement[req.placement.index() as usize] +=
                        len as u64;
                    if let Some(ftl) = self.ftl.as_mut() {
                        // Each 4 KiB page the write touches is programmed
                        // (a partial page costs a whole one). Attaching
                        // and the space limit keep pages within the map.
                        // The request's class picks its placement handle.
                        let first = offset / CHUNK as u64;
                        let last = (offset + len.max(1) as u64 - 1) / CHUNK as u64;
                        let handle = req.placement.handle(ftl.config().handles);
                        for page in first..=last {
                            let mapped =
                                u32::try_from(page).is_ok_and(|p| ftl.write(handle, p).is_ok());
                            debug_assert!(mapped, "page {page} beyond the FTL");
                        }
                        ftl.host_wrote(len as u64);
                    }
                    Ok(len)
                }
                (OpKind::Flush, _) => {
                    self.make_durable(flush_upto);
                    Ok(0)
                }
                (op, None) => Err(Error::InvalidArgument(format!(
                    "{op} request without a buffer"
                ))),
            },
        };
        match op {
            OpKind::Read => self.stats.reads += 1,
            OpKind::Write => self.stats.writes += 1,
            OpKind::Flush => self.stats.flushes += 1,
        }
        if result.is_err() {
            self.stats.errors += 1;
        }
        Completion {
            tag: req.tag,
            op,
            offset,
            buf: req.buf,
            result,
        }
    }
}

/// How a [`SimDisk`]'s discards fail ([`SimDisk::fail_discards`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardFailure {
    /// Nothing of the range changes.
    Untouched,
    /// Part way, at its worst: bytes 8 to 2,048 of every 4 KiB chunk of the
    /// range read as zeros, the rest as before (no block left whole, none
    /// all zeros: what a summary copy held reads as damage).
    HalfZeroed,
}

/// A memory-backed device shared by the queues of several workers.
///
/// Memory is proportional to the data written, not to the device's size:
/// 4 KiB chunks of the durable image, plus, until a flush covers them, a
/// copy of each unflushed write and of each chunk it touches.
pub struct SimDisk {
    index: usize,
    /// Bytes usable now (grows with [`SimDisk::grow`]).
    size: std::sync::atomic::AtomicU64,
    /// The most bytes growth may reach (the "file system" size; starts at
    /// the size given to [`SimDisk::new`]: no growth unless raised).
    space_limit: std::sync::atomic::AtomicU64,
    config: SimConfig,
    align: Alignment,
    inner: Mutex<Inner>,
    switch: Mutex<Option<Arc<PowerSwitch>>>,
    /// How every discard fails, if it does ([`SimDisk::fail_discards`]).
    discards_fail: Mutex<Option<DiscardFailure>>,
}

/// Cuts the power of several disks at once when their requests, counted
/// together at submission, reach a chosen number: a crash at a chosen I/O.
#[derive(Debug)]
pub struct PowerSwitch {
    count: std::sync::atomic::AtomicU64,
    at: u64,
    policy: PowerCutPolicy,
    seed: u64,
    disks: Mutex<Vec<std::sync::Weak<SimDisk>>>,
    fired: std::sync::atomic::AtomicBool,
    /// Counts writes and flushes only: reads change nothing a cut keeps,
    /// so cuts between the same two writes are the same crash.
    writes_only: bool,
}

impl PowerSwitch {
    /// A switch that cuts the power when the `at`-th request (counting
    /// from 1) is submitted to any attached disk, with `policy` and `seed`
    /// (each disk's cut uses `seed` plus its index). `at = 0`: never.
    pub fn new(at: u64, policy: PowerCutPolicy, seed: u64) -> Arc<PowerSwitch> {
        PowerSwitch::counting(at, policy, seed, false)
    }

    /// As [`PowerSwitch::new`], counting only writes and flushes: the
    /// cut comes as the `at`-th of them is submitted. A phase that reads
    /// much and writes little (a recovery's redo) then gets no more of
    /// the cut points than its writes are worth.
    pub fn at_write(at: u64, policy: PowerCutPolicy, seed: u64) -> Arc<PowerSwitch> {
        PowerSwitch::counting(at, policy, seed, true)
    }

    fn counting(at: u64, policy: PowerCutPolicy, seed: u64, writes_only: bool) -> Arc<Self> {
        Arc::new(PowerSwitch {
            count: std::sync::atomic::AtomicU64::new(0),
            at,
            policy,
            seed,
            disks: Mutex::new(Vec::new()),
            fired: std::sync::atomic::AtomicBool::new(false),
            writes_only,
        })
    }

    /// Counts `disk`'s requests and cuts its power with the others'.
    pub fn attach(self: &Arc<Self>, disk: &Arc<SimDisk>) {
        self.disks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(disk));
        *disk.switch.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.clone());
    }

    /// Requests counted so far.
    pub fn count(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Acquire)
    }

    /// True once the power was cut.
    pub fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Cuts the power of every attached disk now (once).
    pub fn cut(&self) {
        if self.fired.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let disks = self.disks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for d in disks.iter().filter_map(std::sync::Weak::upgrade) {
            d.power_cut(self.policy, self.seed.wrapping_add(d.index as u64));
        }
    }

    fn tick(&self, op: OpKind) {
        if self.writes_only && op == OpKind::Read {
            return;
        }
        let n = self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        if n == self.at {
            self.cut();
        }
    }
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDisk")
            .field("index", &self.index)
            .field("size", &self.size)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SimDisk {
    /// A zero-filled device of `size` bytes that is device `index` of its
    /// array. Alignments in `config` are rounded up to powers of two.
    pub fn new(index: usize, size: u64, config: SimConfig) -> Arc<SimDisk> {
        let io = config.io_align.max(1).next_power_of_two();
        let mem = config.mem_align.max(1).next_power_of_two();
        let config = SimConfig {
            io_align: io,
            mem_align: mem,
            ..config
        };
        Arc::new(SimDisk {
            index,
            size: std::sync::atomic::AtomicU64::new(size),
            space_limit: std::sync::atomic::AtomicU64::new(size),
            config,
            align: Alignment {
                device: index,
                io,
                mem,
                size,
            },
            inner: Mutex::new(Inner {
                durable: HashMap::new(),
                dirty: HashMap::new(),
                volatile: VecDeque::new(),
                next_write_seq: 0,
                next_push_seq: 0,
                powered: true,
                generation: 0,
                queues: BTreeMap::new(),
                next_queue_id: 0,
                faults: Vec::new(),
                rng: SmallRng::seed_from_u64(config.seed),
                next_start: None,
                trace: 0xcbf2_9ce4_8422_2325,
                atomic_write_max: config.atomic_write_max,
                fua: config.fua,
                stats: SimStats::default(),
                ftl: None,
            }),
            switch: Mutex::new(None),
            discards_fail: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock (a failed test assertion in another
        // thread) leaves the state consistent enough for a simulator.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a queue with room for `depth` requests (queued plus in flight).
    /// A queue opened while the power is off never works.
    pub fn queue(self: &Arc<Self>, depth: u32) -> SimQueue {
        let mut inner = self.lock();
        let id = inner.next_queue_id;
        inner.next_queue_id += 1;
        let seed = self.config.seed
            ^ (self.index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (id + 1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        let generation = inner.generation;
        inner.queues.insert(
            id,
            QueueState {
                generation,
                queued: Vec::new(),
                in_flight: Vec::new(),
                rng: SmallRng::seed_from_u64(seed),
            },
        );
        SimQueue {
            disk: self.clone(),
            id,
            generation,
            capacity: depth.max(1) as usize,
            queued: 0,
            in_flight: 0,
        }
    }

    /// Index of the device in its array.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Size in bytes (as grown so far).
    pub fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The most bytes [`SimDisk::grow`] may reach.
    pub fn space_limit(&self) -> u64 {
        self.space_limit.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets the most bytes the device may grow to: a full file system
    /// (growth past it fails with [`Error::NoSpace`], as `ENOSPC`), or
    /// space freed later. Never shrinks the device. With an FTL attached,
    /// at most the FTL's logical capacity.
    pub fn set_space_limit(&self, bytes: u64) {
        let inner = self.lock();
        let cap = inner
            .ftl
            .as_ref()
            .map_or(u64::MAX, |f| u64::from(f.logical_pages()) * CHUNK as u64);
        self.space_limit
            .store(bytes.min(cap), std::sync::atomic::Ordering::Release);
    }

    /// Attaches a flash translation layer model ([`Ftl`], 4 KiB pages)
    /// that every write completing from now on programs, so that
    /// [`SimDisk::ftl_stats`] tells the flash writes and the write
    /// amplification the device's writes cost. Fails if the device may
    /// grow past the model's logical capacity.
    pub fn attach_ftl(&self, config: FtlConfig) -> Result<()> {
        let ftl = Ftl::new(config)?;
        let cap = u64::from(ftl.logical_pages()) * CHUNK as u64;
        let mut inner = self.lock();
        // The size too: a space limit set below it never shrinks the
        // device, and writes past the FTL's pages went uncounted (a
        // review's finding).
        let reach = self.space_limit().max(self.size());
        if reach > cap {
            return Err(Error::InvalidArgument(format!(
                "simulated device {} is or may grow to {reach} bytes; the FTL maps {cap}",
                self.index
            )));
        }
        inner.ftl = Some(ftl);
        Ok(())
    }

    /// Tells the device that `len` bytes at `offset` hold nothing anyone
    /// will read again (TRIM): an attached FTL stops counting their 4 KiB
    /// pages as valid, so its collection never copies them. A whole 4 KiB
    /// chunk of the range that no unflushed write touches reads as zeros
    /// from then on, also after a power cut (as many SSDs return after a
    /// TRIM); one that such a write touches keeps its bytes (a device may
    /// return old data too). Nobody may rely on either.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.size());
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "discard of {len} bytes at {offset} on a {}-byte simulated device",
                self.size()
            )));
        }
        let failure = *self.discards_fail.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(how) = failure {
            if how == DiscardFailure::HalfZeroed {
                let mut inner = self.lock();
                let first = offset.div_ceil(CHUNK as u64);
                let last = (offset + len) / CHUNK as u64;
                let Inner { durable, dirty, .. } = &mut *inner;
                for i in first..last {
                    if !dirty.contains_key(&i) {
                        if let Some(c) = durable.get_mut(&i) {
                            c[8..CHUNK / 2].fill(0);
                        }
                    }
                }
            }
            return Err(Error::Io {
                op: OpKind::Write,
                device: self.index,
                offset,
                len: len as usize,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let mut inner = self.lock();
        let first = offset.div_ceil(CHUNK as u64);
        let last = (offset + len) / CHUNK as u64;
        let Inner { durable, dirty, .. } = &mut *inner;
        if last.saturating_sub(first) > durable.len() as u64 {
            durable.retain(|i, _| !(first..last).contains(i) || dirty.contains_key(i));
        } else {
            for i in first..last {
                if !dirty.contains_key(&i) {
                    durable.remove(&i);
                }
            }
        }
        if let Some(ftl) = inner.ftl.as_mut() {
            for page in first..last {
                if let Ok(p) = u32::try_from(page) {
                    ftl.trim(p)?;
                }
            }
        }
        Ok(())
    }

    /// Makes every later discard fail with `EIO`, as `how` says (None:
    /// discards work again): a device whose TRIM fails, so that the
    /// callers' way around it (an out-of-place device's freed segments)
    /// runs under power cuts.
    pub fn fail_discards(&self, how: Option<DiscardFailure>) {
        *self.discards_fail.lock().unwrap_or_else(|e| e.into_inner()) = how;
    }

    /// Makes this disk's durable image a copy of `other`'s (what survives
    /// a power cut there), as if written here in ascending order: an
    /// attached FTL programs each copied 4 KiB page through handle 0. For
    /// benchmarks that start several runs from one loaded image. This
    /// disk must hold no unflushed write, and be at least as large as the
    /// image's last byte.
    pub fn copy_durable_from(&self, other: &SimDisk) -> Result<()> {
        let image: Vec<(u64, Chunk)> = {
            let o = other.lock();
            let mut v: Vec<(u64, Chunk)> = o.durable.iter().map(|(&i, c)| (i, c.clone())).collect();
            v.sort_unstable_by_key(|(i, _)| *i);
            v
        };
        let mut inner = self.lock();
        if !inner.dirty.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "simulated device {}: a copy over unflushed writes",
                self.index
            )));
        }
        if let Some((last, _)) = image.last() {
            if (last + 1) * CHUNK as u64 > self.size() {
                return Err(Error::InvalidArgument(format!(
                    "simulated device {} ({} bytes) cannot hold device {}'s image",
                    self.index,
                    self.size(),
                    other.index
                )));
            }
        }
        for (idx, chunk) in image {
            if let Some(ftl) = inner.ftl.as_mut() {
                u32::try_from(idx)
                    .ok()
                    .and_then(|p| ftl.write(0, p).ok())
                    .ok_or_else(|| Error::InvalidArgument(format!("page {idx} beyond the FTL")))?;
                ftl.host_wrote(CHUNK as u64);
            }
            inner.durable.insert(idx, chunk);
        }
        Ok(())
    }

    /// The attached FTL's counters, if one is attached.
    pub fn ftl_stats(&self) -> Option<FtlStats> {
        self.lock().ftl.as_ref().map(Ftl::stats)
    }

    /// Grows the device to `new_size` bytes, durably at once (a file's
    /// `fallocate` then `fdatasync`). Fails with [`Error::NoSpace`] past
    /// the space limit and with [`Error::Io`] while the power is off.
    pub fn grow(&self, new_size: u64) -> Result<()> {
        if !self.is_powered() {
            return Err(Error::Io {
                op: OpKind::Flush,
                device: self.index,
                offset: self.size(),
                len: 0,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        if new_size > self.space_limit() {
            return Err(Error::NoSpace(format!(
                "simulated device {} is full: {new_size} bytes asked, {} allowed",
                self.index,
                self.space_limit()
            )));
        }
        self.size
            .fetch_max(new_size, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// Alignment rules (with the size as grown so far), checked at push.
    pub fn alignment(&self) -> Alignment {
        Alignment {
            size: self.size(),
            ..self.align
        }
    }

    /// The settings (alignments rounded as applied).
    pub fn config(&self) -> SimConfig {
        self.config
    }

    /// True if a write of `len` bytes (a power of two), aligned to its
    /// length, can be issued untorn ([`SimConfig::atomic_write_max`]).
    pub fn untorn_writes(&self, len: u64) -> bool {
        untorn_fits(self.config.atomic_write_max, 0, len)
    }

    /// False between a power cut and the next power on.
    pub fn is_powered(&self) -> bool {
        self.lock().powered
    }

    /// Writes that completed but are not durable yet.
    pub fn unflushed_writes(&self) -> usize {
        self.lock().volatile.len()
    }

    /// The trace hash: every request pushed and every write and flush
    /// completed so far, in order. Two runs with the same seed and the same
    /// schedule have the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.lock().trace
    }

    /// Overwrites durable bytes behind the engine's back: damage outside
    /// the crash model (a flipped bit, a lost synced block), for tests
    /// that check it is detected.
    pub fn overwrite_durable(&self, offset: u64, data: &[u8]) {
        self.lock().write_durable(offset, data);
    }

    /// The durable image: what would survive a power cut that drops every
    /// unflushed write. Bytes past the end of the device read as zeros.
    pub fn read_durable(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.lock().read_durable_into(offset, &mut out);
        out
    }

    /// What a read would return now: the durable image overlaid by the
    /// completed unflushed writes. Bytes past the end read as zeros.
    pub fn read_current(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.lock().read_current_into(offset, &mut out);
        out
    }

    /// Adds a fault; it applies to requests submitted from now on.
    pub fn inject(&self, fault: Fault) {
        let seed = match fault.trigger {
            Trigger::Probability { seed, .. } => seed,
            _ => 0,
        };
        self.lock().faults.push(ActiveFault {
            fault,
            seen: 0,
            rng: SmallRng::seed_from_u64(seed),
        });
    }

    /// Removes every injected fault (requests already submitted keep the
    /// fault decided for them).
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The device's counters.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Cuts the power. Every write that is not durable (completed but
    /// unflushed, or queued or in flight in any working queue) is kept,
    /// dropped or torn per `policy`, drawing from an RNG seeded with
    /// `seed`, and the survivors go to the durable image. Every queue opened
    /// so far then fails its pending and further requests with `EIO`.
    /// Cutting the power of a disk that is off changes nothing.
    pub fn power_cut(&self, policy: PowerCutPolicy, seed: u64) -> PowerCutReport {
        let mut inner = self.lock();
        let mut report = PowerCutReport::default();
        if !inner.powered {
            return report;
        }
        inner.powered = false;
        inner.stats.power_cuts += 1;
        inner.dirty.clear();
        let mut writes: Vec<(u64, Box<[u8]>, bool, bool)> = std::mem::take(&mut inner.volatile)
            .into_iter()
            .map(|w| (w.offset, w.data, true, w.atomic))
            .collect();
        let generation = inner.generation;
        let mut pending: Vec<(u64, u64, Box<[u8]>, bool)> = Vec::new();
        for q in inner.queues.values().filter(|q| q.generation == generation) {
            report.failed_requests += q.queued.len() + q.in_flight.len();
            for p in q.queued.iter().chain(&q.in_flight) {
                if let (OpKind::Write, Some(buf)) = (p.req.op, &p.req.buf) {
                    // SAFETY: the request (and its buffer) is held in the locked
                    // disk state; by IoBuf's contract nobody writes a write
                    // request's bytes while it is pending.
                    let data: Box<[u8]> = unsafe { buf.bytes() }.into();
                    pending.push((p.seq, p.req.offset, data, p.req.atomic));
                }
            }
        }
        pending.sort_by_key(|(seq, _, _, _)| *seq);
        writes.extend(
            pending
                .into_iter()
                .map(|(_, off, data, atomic)| (off, data, false, atomic)),
        );

        let mut rng = SmallRng::seed_from_u64(seed);
        for (offset, data, completed, atomic) in writes {
            let fate = match policy {
                PowerCutPolicy::DropAll => WriteFate::Dropped,
                PowerCutPolicy::KeepAll => WriteFate::Kept,
                PowerCutPolicy::Random { keep, drop, tear } => {
                    let w = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
                    let (keep, drop, tear) = (w(keep), w(drop), w(tear));
                    let total = keep + drop + tear;
                    let x = rng.gen::<f64>() * total;
                    if total <= 0.0 || (x >= keep && x < keep + drop) {
                        WriteFate::Dropped
                    } else if x < keep {
                        WriteFate::Kept
                    } else {
                        WriteFate::Torn(Vec::new())
                    }
                }
                PowerCutPolicy::Prefix => {
                    let sectors = data.len().div_ceil(SECTOR);
                    let landed = rng.gen_range(0..=sectors);
                    WriteFate::Torn(
                        (0..sectors)
                            .map(|i| {
                                if i < landed {
                                    SectorFate::New
                                } else {
                                    SectorFate::Old
                                }
                            })
                            .collect(),
                    )
                }
            };
            // An untorn write lands whole or not at all. (One in flight
            // that the device would refuse is refused before it lands:
            // dropped.)
            let fate = match fate {
                WriteFate::Torn(_) if atomic => {
                    if rng.gen_bool(0.5) {
                        WriteFate::Kept
                    } else {
                        WriteFate::Dropped
                    }
                }
                WriteFate::Kept if atomic && !completed && !inner.untorn_ok(offset, data.len()) => {
                    WriteFate::Dropped
                }
                fate => fate,
            };
            let fate = match fate {
                WriteFate::Kept => {
                    inner.write_durable(offset, &data);
                    report.kept += 1;
                    WriteFate::Kept
                }
                WriteFate::Dropped => {
                    report.dropped += 1;
                    WriteFate::Dropped
                }
                WriteFate::Torn(chosen) => {
                    let mut sectors = Vec::with_capacity(data.len().div_ceil(SECTOR));
                    for (i, new) in data.chunks(SECTOR).enumerate() {
                        let at = offset + (i * SECTOR) as u64;
                        // Chosen by the policy, else at random.
                        let fate = match chosen.get(i) {
                            Some(&f) => f,
                            None => match rng.gen_range(0..3) {
                                0 => SectorFate::New,
                                1 => SectorFate::Old,
                                _ => SectorFate::Garbage,
                            },
                        };
                        match fate {
                            SectorFate::New => inner.write_durable(at, new),
                            SectorFate::Old => {}
                            SectorFate::Garbage => {
                                let mut junk = vec![0u8; new.len()];
                                rng.fill(&mut junk[..]);
                                inner.write_durable(at, &junk);
                            }
                        }
                        sectors.push(fate);
                    }
                    report.torn += 1;
                    WriteFate::Torn(sectors)
                }
            };
            report.writes.push(CutWrite {
                offset,
                len: data.len(),
                completed,
                fate,
            });
        }
        report
    }

    /// Restores the power after a cut: queues opened from now on work on
    /// the durable image that survived; queues opened before stay failed.
    /// Does nothing while the power is on.
    pub fn power_on(&self) {
        let mut inner = self.lock();
        if !inner.powered {
            inner.powered = true;
            inner.generation += 1;
            inner.next_start = None;
        }
    }

    /// When a request submitted now starts service and is ready.
    fn schedule(&self, inner: &mut Inner, now: Instant) -> Instant {
        let start = inner.next_start.map_or(now, |t| t.max(now));
        if let Some(iops) = self.config.iops.filter(|&n| n > 0) {
            inner.next_start = Some(start + Duration::from_secs(1) / iops);
        }
        let latency = match self.config.latency {
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } if max > min => {
                let (lo, hi) = (min.as_nanos() as u64, max.as_nanos() as u64);
                Duration::from_nanos(inner.rng.gen_range(lo..=hi))
            }
            Latency::Uniform { min, .. } => min,
        };
        start + latency
    }
}

/// One worker's queue to one [`SimDisk`].
pub struct SimQueue {
    disk: Arc<SimDisk>,
    id: u64,
    generation: u64,
    capacity: usize,
    queued: usize,
    in_flight: usize,
}

impl std::fmt::Debug for SimQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimQueue")
            .field("device", &self.disk.index)
            .field("id", &self.id)
            .field("queued", &self.queued)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl SimQueue {
    /// The disk this queue is on.
    pub fn disk(&self) -> &Arc<SimDisk> {
        &self.disk
    }

    fn deterministic(&self) -> Option<f64> {
        match self.disk.config.clock {
            Clock::Deterministic {
                complete_probability,
            } => Some(probability(complete_probability)),
            Clock::RealTime => None,
        }
    }

    /// (requests ready now, earliest ready time of the others).
    fn readiness(&self) -> (usize, Option<Instant>) {
        let inner = self.disk.lock();
        let Some(q) = inner.queues.get(&self.id) else {
            return (0, None);
        };
        if !inner.alive(self.generation) || self.deterministic().is_some() {
            return (q.in_flight.len(), None);
        }
        let now = Instant::now();
        let mut ready = 0;
        let mut earliest: Option<Instant> = None;
        for p in &q.in_flight {
            match p.ready_at {
                Some(t) if t > now => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                _ => ready += 1,
            }
        }
        (ready, earliest)
    }
}

impl IoQueue for SimQueue {
    fn device(&self) -> usize {
        self.disk.index
    }

    fn backend(&self) -> &'static str {
        "sim"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn push(&mut self, req: Request) -> std::result::Result<(), Rejected> {
        let full = self.queued + self.in_flight >= self.capacity;
        let req = Rejected::admit(req, &self.disk.alignment(), full, self.capacity, false)?;
        let switch = self
            .disk
            .switch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(sw) = switch {
            sw.tick(req.op);
        }
        let mut inner = self.disk.lock();
        let seq = inner.next_push_seq;
        inner.next_push_seq += 1;
        // Requests pushed while the power is off, or to a queue opened
        // before the last power cut (a crashed engine's workers still
        // winding down), do nothing, and how many there are depends on
        // timing: they stay out of the trace.
        if inner.alive(self.generation) {
            inner.trace = trace_mix(
                trace_mix(
                    trace_mix(inner.trace, req.op as u64),
                    if req.op == OpKind::Flush {
                        0
                    } else {
                        req.offset
                    },
                ),
                req.len() as u64,
            );
        }
        let q = inner
            .queues
            .get_mut(&self.id)
            .expect("a queue's state lives until the queue is dropped");
        q.queued.push(Pending {
            seq,
            req,
            ready_at: None,
            fault: None,
            flush_upto: 0,
        });
        self.queued += 1;
        Ok(())
    }

    fn submit(&mut self) -> Result<usize> {
        if self.queued == 0 {
            return Ok(0);
        }
        let deterministic = self.deterministic().is_some();
        let mut inner = self.disk.lock();
        let alive = inner.alive(self.generation);
        let q = inner
            .queues
            .get_mut(&self.id)
            .expect("a queue's state lives until the queue is dropped");
        let batch = std::mem::take(&mut q.queued);
        let n = batch.len();
        let now = Instant::now();
        let mut submitted = Vec::with_capacity(n);
        for mut p in batch {
            if alive {
                p.fault = inner.decide_fault(p.req.op, p.req.offset, p.req.len());
                p.flush_upto = inner.next_write_seq;
                if !deterministic {
                    p.ready_at = Some(self.disk.schedule(&mut inner, now));
                }
            }
            submitted.push(p);
        }
        inner
            .queues
            .get_mut(&self.id)
            .expect("a queue's state lives until the queue is dropped")
            .in_flight
            .extend(submitted);
        self.queued = 0;
        self.in_flight += n;
        Ok(n)
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.in_flight == 0 {
            return 0;
        }
        let det = self.deterministic();
        let device = self.disk.index;
        let mut inner = self.disk.lock();
        let alive = inner.alive(self.generation);
        let q = inner
            .queues
            .get_mut(&self.id)
            .expect("a queue's state lives until the queue is dropped");
        let all = std::mem::take(&mut q.in_flight);
        let mut chosen = Vec::new();
        let mut rest = Vec::new();
        match det {
            _ if !alive => chosen = all,
            None => {
                let now = Instant::now();
                for p in all {
                    if p.ready_at.is_none_or(|t| t <= now) {
                        chosen.push(p);
                    } else {
                        rest.push(p);
                    }
                }
                chosen.sort_by_key(|p| (p.ready_at, p.seq));
            }
            Some(prob) => {
                for p in all {
                    if q.rng.gen_bool(prob) {
                        chosen.push(p);
                    } else {
                        rest.push(p);
                    }
                }
                if chosen.is_empty() && !rest.is_empty() {
                    let i = q.rng.gen_range(0..rest.len());
                    chosen.push(rest.remove(i));
                }
                chosen.shuffle(&mut q.rng);
            }
        }
        q.in_flight = rest;
        let n = chosen.len();
        for p in chosen {
            let c = inner.complete(device, alive, p);
            out.push(c);
        }
        self.in_flight -= n;
        n
    }

    fn wait(&mut self, min: usize, timeout: Option<Duration>) -> Result<()> {
        self.submit()?;
        if self.deterministic().is_some() {
            return Ok(());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let (ready, earliest) = self.readiness();
            if ready >= min.min(self.in_flight) {
                return Ok(());
            }
            let Some(next) = earliest else {
                return Ok(());
            };
            let until = deadline.map_or(next, |d| d.min(next));
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(());
            }
            std::thread::sleep(until.saturating_duration_since(now));
        }
    }

    fn queued(&self) -> usize {
        self.queued
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn ready_in(&self) -> Option<Duration> {
        if self.in_flight == 0 {
            return None;
        }
        let (ready, earliest) = self.readiness();
        if ready > 0 {
            return Some(Duration::ZERO);
        }
        earliest.map(|t| t.saturating_duration_since(Instant::now()))
    }
}

impl Drop for SimQueue {
    fn drop(&mut self) {
        // Requests in flight complete (as the real backends wait for them);
        // requests never submitted are discarded.
        let device = self.disk.index;
        let mut inner = self.disk.lock();
        let alive = inner.alive(self.generation);
        let Some(q) = inner.queues.remove(&self.id) else {
            return;
        };
        if alive {
            for p in q.in_flight {
                drop(inner.complete(device, alive, p));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{AlignedBuf, IoBuf};
    use rand::RngCore;

    const PAGE: usize = 4096;

    fn random_page(rng: &mut SmallRng) -> AlignedBuf {
        let mut b = AlignedBuf::new(PAGE, PAGE).unwrap();
        rng.fill_bytes(&mut b);
        b
    }

    fn write(tag: u64, offset: u64, data: &[u8]) -> Request {
        let mut b = AlignedBuf::new(data.len(), PAGE).unwrap();
        b.copy_from_slice(data);
        Request::write(tag, offset, IoBuf::owned(b))
    }

    fn read(tag: u64, offset: u64, len: usize) -> Request {
        Request::read(
            tag,
            offset,
            IoBuf::owned(AlignedBuf::new(len, PAGE).unwrap()),
        )
    }

    fn data(c: &Completion) -> &[u8] {
        c.buf.as_ref().unwrap().as_owned().unwrap()
    }

    /// Pushes, submits and reaps until every request has completed.
    fn run(q: &mut dyn IoQueue, reqs: Vec<Request>) -> Vec<Completion> {
        let n = reqs.len();
        for r in reqs {
            q.push(r).unwrap();
        }
        q.submit().unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < n {
            q.wait(1, Some(Duration::from_millis(100))).unwrap();
            q.reap(&mut out);
            assert!(Instant::now() < deadline, "requests never completed");
        }
        out
    }

    fn run_ok(q: &mut dyn IoQueue, reqs: Vec<Request>) -> Vec<Completion> {
        let out = run(q, reqs);
        for c in &out {
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        out
    }

    fn paged(seed: u64) -> SimConfig {
        SimConfig {
            io_align: 4096,
            mem_align: 4096,
            seed,
            ..SimConfig::default()
        }
    }

    /// A page written as eight 512-byte writes (a log's flushes) is 4 KiB
    /// from the host and eight page programs on the flash: a WAF of 8 by
    /// bytes (by pages it read 1, which `bench waf` printed for the log).
    #[test]
    fn writes_shorter_than_a_page_count_their_bytes_and_a_whole_program_each() {
        use crate::io::ftl::FtlConfig;
        let config = SimConfig {
            io_align: 512,
            ..paged(7)
        };
        let disk = SimDisk::new(0, 256 * PAGE as u64, config);
        disk.attach_ftl(FtlConfig::new(16, 24, 0.5)).unwrap();
        let mut q = disk.queue(8);
        for i in 0..8u64 {
            run_ok(&mut q, vec![write(0, i * 512, &[i as u8 + 1; 512])]);
        }
        let s = disk.ftl_stats().unwrap();
        assert_eq!((s.host_bytes, s.host_pages, s.flash_pages), (4096, 8, 8));
        assert_eq!(s.waf_bytes(PAGE as u64), 8.0);
    }

    /// An FTL smaller than the device is refused even when a space limit
    /// below the device's size was set (the limit never shrinks it).
    #[test]
    fn an_ftl_smaller_than_the_device_is_refused_whatever_its_space_limit() {
        use crate::io::ftl::FtlConfig;
        let disk = SimDisk::new(0, 4096 * PAGE as u64, paged(8));
        disk.set_space_limit(PAGE as u64);
        // 16 blocks of 24 pages with half spare: far fewer than 4,096.
        assert!(disk.attach_ftl(FtlConfig::new(16, 24, 0.5)).is_err());
    }

    /// A copy of another disk's durable image reads the same, and an
    /// attached FTL counts each copied page once; a disk too small for the
    /// image, or holding unflushed writes, refuses it.
    #[test]
    fn a_durable_image_copies_through_the_ftl() {
        use crate::io::ftl::FtlConfig;
        let pages = 256u64;
        let from = SimDisk::new(0, pages * PAGE as u64, paged(1));
        for p in [0, 3, 200] {
            from.overwrite_durable(p * PAGE as u64, &[p as u8 + 1; PAGE]);
        }
        // Unflushed: not part of the image.
        let mut q = from.queue(4);
        run_ok(&mut q, vec![write(0, 5 * PAGE as u64, &[9; PAGE])]);
        let to = SimDisk::new(1, pages * PAGE as u64, paged(2));
        to.attach_ftl(FtlConfig::new(16, 24, 0.5)).unwrap();
        to.copy_durable_from(&from).unwrap();
        let all = pages as usize * PAGE;
        assert_eq!(to.read_durable(0, all), from.read_durable(0, all));
        assert_eq!(to.read_durable(5 * PAGE as u64, PAGE), vec![0; PAGE]);
        assert_eq!(to.ftl_stats().unwrap().host_pages, 3);
        assert_eq!(to.ftl_stats().unwrap().host_bytes, 3 * PAGE as u64);
        let small = SimDisk::new(2, 100 * PAGE as u64, paged(3));
        assert!(small.copy_durable_from(&from).is_err());
        let busy = SimDisk::new(3, pages * PAGE as u64, paged(4));
        let mut bq = busy.queue(4);
        run_ok(&mut bq, vec![write(0, 0, &[1; PAGE])]);
        assert!(busy.copy_durable_from(&from).is_err());
    }

    /// An attached FTL counts every page the completed writes touch:
    /// sequential passes cost no copies, random overwrites do; the device
    /// cannot be allowed to grow past the model's capacity.
    #[test]
    fn an_attached_ftl_counts_the_flash_writes() {
        use crate::io::ftl::FtlConfig;
        let pages = 1024u64;
        let disk = SimDisk::new(0, pages * PAGE as u64, paged(4));
        // 20 blocks of 64 pages with 25% spare: 1,024 logical pages.
        assert!(disk.attach_ftl(FtlConfig::new(64, 16, 0.25)).is_err());
        disk.attach_ftl(FtlConfig::new(64, 20, 0.25)).unwrap();
        disk.set_space_limit(u64::MAX);
        assert_eq!(disk.space_limit(), pages * PAGE as u64);
        let mut q = disk.queue(64);
        let mut rng = SmallRng::seed_from_u64(5);
        let page = random_page(&mut rng);
        for _ in 0..2 {
            for batch in (0..pages).collect::<Vec<_>>().chunks(64) {
                let reqs = batch
                    .iter()
                    .map(|&p| write(p, p * PAGE as u64, &page))
                    .collect();
                run_ok(&mut q, reqs);
            }
        }
        let seq = disk.ftl_stats().unwrap();
        assert_eq!((seq.host_pages, seq.gc_copies), (2 * pages, 0), "{seq:?}");
        // One write of two pages programs both.
        let two = [page.to_vec(), page.to_vec()].concat();
        run_ok(&mut q, vec![write(0, 0, &two)]);
        for _ in 0..16 {
            let reqs = (0..64)
                .map(|t| write(t, rng.gen_range(0..pages) * PAGE as u64, &page))
                .collect();
            run_ok(&mut q, reqs);
        }
        let s = disk.ftl_stats().unwrap().since(&seq);
        assert_eq!(s.host_pages, 2 + 16 * 64);
        assert!(s.gc_copies > 0 && s.waf() > 1.0, "{s:?}");
        assert_eq!(
            disk.stats().bytes_written,
            (2 * pages + 2 + 16 * 64) * PAGE as u64
        );
    }

    #[test]
    fn read_after_write_on_a_huge_sparse_disk() {
        for config in [paged(1), SimConfig::deterministic(2)] {
            let disk = SimDisk::new(0, 64 << 30, config);
            let mut q = disk.queue(64);
            let mut rng = SmallRng::seed_from_u64(3);
            let mut pages = std::collections::BTreeMap::new();
            while pages.len() < 300 {
                let p = rng.gen_range(0..(64u64 << 30) / PAGE as u64);
                pages.insert(p, random_page(&mut rng).to_vec());
            }
            let items: Vec<_> = pages.iter().collect();
            for batch in items.chunks(64) {
                let reqs = batch
                    .iter()
                    .map(|(&p, d)| write(p, p * PAGE as u64, d))
                    .collect();
                run_ok(&mut q, reqs);
            }
            run_ok(&mut q, vec![Request::flush(0)]);
            for batch in items.chunks(64) {
                let reqs = batch
                    .iter()
                    .map(|(&p, _)| read(p, p * PAGE as u64, PAGE))
                    .collect();
                for c in run_ok(&mut q, reqs) {
                    assert_eq!(data(&c), &pages[&c.tag][..], "page {}", c.tag);
                }
            }
            let (&p, d) = items[0];
            assert_eq!(disk.read_durable(p * PAGE as u64, PAGE), *d);
            // Unwritten space reads as zeros; memory follows the data.
            let hole = (0..).find(|p| !pages.contains_key(p)).unwrap();
            let c = run_ok(&mut q, vec![read(9, hole * PAGE as u64, PAGE)]);
            assert!(data(&c[0]).iter().all(|&b| b == 0));
            let inner = disk.lock();
            assert!(inner.durable.len() <= pages.len() && inner.dirty.is_empty());
            drop(inner);
            let s = disk.stats();
            assert_eq!((s.writes, s.flushes, s.reads), (300, 1, 301));
            assert_eq!(s.bytes_written, 300 * PAGE as u64);
        }
    }

    #[test]
    fn misaligned_and_oversized_requests_are_rejected() {
        let disk = SimDisk::new(2, 1 << 20, paged(0));
        let mut q = disk.queue(8);
        let e = q.push(read(0, 512, PAGE)).unwrap_err();
        assert!(matches!(
            e.error,
            Error::Misaligned {
                what: "offset",
                device: 2,
                ..
            }
        ));
        let e = q.push(read(0, 0, 512)).unwrap_err();
        assert!(matches!(e.error, Error::Misaligned { what: "length", .. }));
        let region = Arc::new(AlignedBuf::new(2 * PAGE, PAGE).unwrap());
        // SAFETY: the region is used by nothing else in this test.
        let buf = unsafe { IoBuf::shared(region, 512, PAGE) }.unwrap();
        let e = q.push(Request::write(0, 0, buf)).unwrap_err();
        assert!(matches!(
            e.error,
            Error::Misaligned {
                what: "buffer address",
                ..
            }
        ));
        let e = q
            .push(read(0, (1 << 20) - PAGE as u64, 2 * PAGE))
            .unwrap_err();
        assert!(matches!(e.error, Error::OutOfRange { device: 2, .. }));
        assert_eq!((q.queued(), q.in_flight()), (0, 0));

        let mut q = disk.queue(2);
        q.push(read(0, 0, PAGE)).unwrap();
        q.push(read(1, 0, PAGE)).unwrap();
        let e = q.push(read(2, 0, PAGE)).unwrap_err();
        assert!(matches!(e.error, Error::InvalidArgument(_)));
        assert_eq!(e.request.tag, 2);
    }

    #[test]
    fn injected_errors_name_device_and_offset() {
        let disk = SimDisk::new(7, 1 << 20, paged(0));
        let mut q = disk.queue(8);
        disk.inject(Fault::nth(Some(OpKind::Write), 1));
        let out = run(
            &mut q,
            vec![write(0, 0, &[1; PAGE]), write(1, 8192, &[2; PAGE])],
        );
        let failed: Vec<_> = out.iter().filter(|c| c.result.is_err()).collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].tag, 1);
        let err = failed[0].result.as_ref().unwrap_err();
        assert!(matches!(
            err,
            Error::Io {
                op: OpKind::Write,
                device: 7,
                offset: 8192,
                len: PAGE,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("device 7") && msg.contains("offset 8192"),
            "{msg}"
        );
        // The failed write left no trace; the fault fired once only.
        assert_eq!(disk.read_current(8192, PAGE), vec![0; PAGE]);
        run_ok(&mut q, vec![write(2, 8192, &[2; PAGE])]);

        // A sticky range fault hits every overlapping read until cleared.
        disk.inject(Fault::range(Some(OpKind::Read), 4096..8193).sticky());
        for _ in 0..3 {
            let out = run(&mut q, vec![read(0, 0, PAGE), read(1, 8192, PAGE)]);
            for c in out {
                assert_eq!(c.result.is_err(), c.tag == 1, "{:?}", c.result);
            }
        }
        disk.clear_faults();
        let c = run_ok(&mut q, vec![read(1, 8192, PAGE)]);
        assert_eq!(data(&c[0]), &[2; PAGE][..]);

        // A failed flush makes nothing durable.
        disk.inject(Fault::probability(Some(OpKind::Flush), 1.0, 5).errno(libc::ENOSPC));
        let c = run(&mut q, vec![Request::flush(0)]);
        assert!(matches!(c[0].result, Err(Error::Io { device: 7, .. })));
        assert_eq!(disk.unflushed_writes(), 2);
        run_ok(&mut q, vec![Request::flush(0)]);
        assert_eq!(disk.unflushed_writes(), 0);
        let s = disk.stats();
        assert_eq!((s.faults_fired, s.errors), (5, 5));
    }

    #[test]
    fn probability_faults_follow_their_seed() {
        let pattern = |seed| {
            let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
            let mut q = disk.queue(64);
            disk.inject(Fault::probability(Some(OpKind::Read), 0.3, seed).sticky());
            let reqs = (0..64).map(|i| read(i, 0, 512)).collect();
            let mut failed: Vec<u64> = run(&mut q, reqs)
                .iter()
                .filter(|c| c.result.is_err())
                .map(|c| c.tag)
                .collect();
            failed.sort();
            failed
        };
        let a = pattern(11);
        assert!(!a.is_empty() && a.len() < 64);
        assert_eq!(a, pattern(11));
        assert_ne!(a, pattern(12));
    }

    #[test]
    fn corrupt_reads_flip_bytes_in_every_sector() {
        let disk = SimDisk::new(0, 1 << 20, paged(0));
        let mut q = disk.queue(8);
        let mut rng = SmallRng::seed_from_u64(1);
        let page = random_page(&mut rng);
        run_ok(&mut q, vec![write(0, 4096, &page)]);
        run_ok(&mut q, vec![Request::flush(1)]);
        disk.inject(Fault::nth(None, 0).corrupt_read());
        let c = run_ok(&mut q, vec![read(0, 4096, PAGE)]);
        let got = data(&c[0]);
        assert_ne!(got, &page[..]);
        for (g, p) in got.chunks(SECTOR).zip(page.chunks(SECTOR)) {
            assert_ne!(g, p);
        }
        let c = run_ok(&mut q, vec![read(0, 4096, PAGE)]);
        assert_eq!(data(&c[0]), &page[..]);
        assert_eq!(disk.read_durable(4096, PAGE), &page[..]);
    }

    /// A flushed, B completed, C queued, D in flight on one queue.
    fn crash_setup(seed: u64) -> (Arc<SimDisk>, SimQueue, [Vec<u8>; 4]) {
        let disk = SimDisk::new(1, 1 << 20, paged(seed));
        let mut q = disk.queue(8);
        let mut rng = SmallRng::seed_from_u64(seed);
        let pages = [(); 4].map(|_| random_page(&mut rng).to_vec());
        // A flush covers only writes completed before it was submitted.
        run_ok(&mut q, vec![write(0, 0, &pages[0]), Request::flush(1)]);
        assert_eq!(disk.unflushed_writes(), 1);
        run_ok(&mut q, vec![Request::flush(1)]);
        run_ok(&mut q, vec![write(2, 4096, &pages[1])]);
        q.push(write(3, 8192, &pages[2])).unwrap();
        q.submit().unwrap();
        q.push(write(4, 12288, &pages[3])).unwrap();
        // C is in flight (submitted, not reaped), D is queued.
        (disk, q, pages)
    }

    #[test]
    fn power_cut_drop_all_loses_only_unflushed_writes() {
        let (disk, mut q, pages) = crash_setup(1);
        assert_eq!(disk.read_current(4096, PAGE), pages[1]);
        let report = disk.power_cut(PowerCutPolicy::DropAll, 9);
        assert_eq!((report.kept, report.dropped, report.torn), (0, 3, 0));
        assert_eq!(report.failed_requests, 2);
        assert_eq!(
            report
                .writes
                .iter()
                .map(|w| w.completed)
                .collect::<Vec<_>>(),
            [true, false, false]
        );
        assert!(!disk.is_powered());
        assert_eq!(disk.read_durable(0, PAGE), pages[0]);
        assert_eq!(disk.read_current(0, PAGE), pages[0]);
        assert_eq!(disk.read_durable(4096, 3 * PAGE), vec![0; 3 * PAGE]);

        // Pending and further requests fail, before and after power on.
        let out = run(&mut q, vec![read(5, 0, PAGE)]);
        assert_eq!(out.len(), 3);
        assert!(out
            .iter()
            .all(|c| matches!(c.result, Err(Error::Io { device: 1, .. }))));
        disk.power_on();
        let out = run(&mut q, vec![write(6, 0, &[7; PAGE])]);
        assert!(out[0].result.is_err());
        let mut fresh = disk.queue(8);
        let c = run_ok(&mut fresh, vec![read(7, 0, PAGE), read(8, 8192, PAGE)]);
        for c in c {
            let want = if c.tag == 7 {
                &pages[0][..]
            } else {
                &[0; PAGE][..]
            };
            assert_eq!(data(&c), want);
        }
        assert_eq!(disk.stats().power_cuts, 1);
    }

    #[test]
    fn a_durable_write_survives_a_power_cut_without_a_flush() {
        let disk = SimDisk::new(1, 1 << 20, paged(3));
        let mut q = disk.queue(8);
        let mut rng = SmallRng::seed_from_u64(3);
        let pages = [(); 3].map(|_| random_page(&mut rng).to_vec());
        // A plain write, then a durable one: as RWF_DSYNC on a disk without
        // FUA, the durable write carries every write completed before it.
        run_ok(&mut q, vec![write(0, 0, &pages[0])]);
        let mut b = AlignedBuf::new(PAGE, PAGE).unwrap();
        b.copy_from_slice(&pages[1]);
        run_ok(
            &mut q,
            vec![Request::write_durable(1, 4096, IoBuf::owned(b))],
        );
        assert_eq!(disk.unflushed_writes(), 0);
        // A plain write after it stays volatile.
        run_ok(&mut q, vec![write(2, 8192, &pages[2])]);
        assert_eq!(disk.unflushed_writes(), 1);
        let report = disk.power_cut(PowerCutPolicy::DropAll, 9);
        assert_eq!((report.kept, report.dropped), (0, 1));
        assert_eq!(disk.read_durable(0, PAGE), pages[0]);
        assert_eq!(disk.read_durable(4096, PAGE), pages[1]);
        assert_eq!(disk.read_durable(8192, PAGE), vec![0; PAGE]);
    }

    #[test]
    fn with_fua_a_durable_write_carries_only_itself() {
        let disk = SimDisk::new(
            1,
            1 << 20,
            SimConfig {
                fua: true,
                ..paged(3)
            },
        );
        let mut q = disk.queue(8);
        let mut rng = SmallRng::seed_from_u64(4);
        let pages = [(); 3].map(|_| random_page(&mut rng).to_vec());
        let durable = |q: &mut SimQueue, id: u64, at: u64, page: &[u8]| {
            let mut b = AlignedBuf::new(PAGE, PAGE).unwrap();
            b.copy_from_slice(page);
            run_ok(q, vec![Request::write_durable(id, at, IoBuf::owned(b))]);
        };
        // A plain write, then a durable one elsewhere: the plain one stays
        // volatile (a device with FUA flushes nothing else).
        run_ok(&mut q, vec![write(0, 0, &pages[0])]);
        durable(&mut q, 1, 4096, &pages[1]);
        assert_eq!(disk.unflushed_writes(), 1);
        // A durable write over a volatile one's chunk: that one becomes
        // durable first (and is overwritten); a later one elsewhere stays
        // volatile.
        run_ok(&mut q, vec![write(3, 8192, &pages[0])]);
        durable(&mut q, 2, 0, &pages[2]);
        assert_eq!(disk.unflushed_writes(), 1);
        let report = disk.power_cut(PowerCutPolicy::DropAll, 9);
        assert_eq!((report.kept, report.dropped), (0, 1));
        assert_eq!(disk.read_durable(0, PAGE), pages[2]);
        assert_eq!(disk.read_durable(4096, PAGE), pages[1]);
        assert_eq!(disk.read_durable(8192, PAGE), vec![0; PAGE]);
        // Without the overlap: the plain write is lost at a cut.
        disk.power_on();
        let mut q = disk.queue(8);
        run_ok(&mut q, vec![write(4, 12288, &pages[0])]);
        durable(&mut q, 5, 16384, &pages[1]);
        let report = disk.power_cut(PowerCutPolicy::DropAll, 9);
        assert_eq!((report.kept, report.dropped), (0, 1));
        assert_eq!(disk.read_durable(12288, PAGE), vec![0; PAGE]);
        assert_eq!(disk.read_durable(16384, PAGE), pages[1]);
    }

    #[test]
    fn power_cut_keep_all_keeps_every_write() {
        let (disk, mut q, pages) = crash_setup(2);
        let report = disk.power_cut(PowerCutPolicy::KeepAll, 9);
        assert_eq!((report.kept, report.dropped, report.torn), (3, 0, 0));
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(&disk.read_durable((i * PAGE) as u64, PAGE), p, "page {i}");
        }
        // The requests themselves still report failure.
        let out = run(&mut q, vec![]);
        assert!(out.is_empty());
        q.submit().unwrap();
        let mut out = Vec::new();
        q.reap(&mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|c| c.result.is_err()));
        disk.power_on();
        drop(q);
        assert_eq!(disk.read_current(12288, PAGE), pages[3]);
    }

    #[test]
    fn untorn_writes_land_whole_or_not_at_all_and_others_are_refused() {
        let config = SimConfig {
            atomic_write_max: 8192,
            ..paged(9)
        };
        let disk = SimDisk::new(0, 1 << 20, config);
        assert!(disk.untorn_writes(4096) && disk.untorn_writes(8192));
        assert!(!disk.untorn_writes(16384) && !disk.untorn_writes(12288));
        let mut q = disk.queue(64);
        let mut rng = SmallRng::seed_from_u64(9);
        let old: Vec<Vec<u8>> = (0..64).map(|_| random_page(&mut rng).to_vec()).collect();
        let new: Vec<Vec<u8>> = (0..64).map(|_| random_page(&mut rng).to_vec()).collect();
        let reqs = old
            .iter()
            .enumerate()
            .map(|(i, d)| write(i as u64, (i * PAGE) as u64, d))
            .collect();
        run_ok(&mut q, reqs);
        run_ok(&mut q, vec![Request::flush(0)]);
        // Refused as the kernel refuses RWF_ATOMIC: too long, misaligned
        // to its length, not a power of two.
        for (off, pages) in [(0, 4), (PAGE, 2), (0, 3)] {
            let r = write(0, off as u64, &vec![7u8; pages * PAGE]).untorn(true);
            let c = run(&mut q, vec![r]);
            assert!(
                matches!(&c[0].result, Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL)),
                "{:?}",
                c[0].result
            );
        }
        // Untorn overwrites, left unflushed, then a cut that tears most
        // writes: each page is old or new, whole.
        let reqs = new
            .iter()
            .enumerate()
            .map(|(i, d)| write(i as u64, (i * PAGE) as u64, d).untorn(true))
            .collect();
        run_ok(&mut q, reqs);
        let report = disk.power_cut(
            PowerCutPolicy::Random {
                keep: 1.0,
                drop: 1.0,
                tear: 6.0,
            },
            9,
        );
        assert_eq!(report.torn, 0);
        assert!(report.kept > 0 && report.dropped > 0);
        for i in 0..64 {
            let got = disk.read_durable((i * PAGE) as u64, PAGE);
            assert!(got == old[i] || got == new[i], "page {i} torn");
        }
    }

    #[test]
    fn power_cut_tears_sectors_and_never_touches_flushed_data() {
        let cut = |seed: u64| {
            let disk = SimDisk::new(0, 1 << 20, paged(seed));
            let mut q = disk.queue(64);
            let mut rng = SmallRng::seed_from_u64(seed);
            let old: Vec<Vec<u8>> = (0..64).map(|_| random_page(&mut rng).to_vec()).collect();
            let new: Vec<Vec<u8>> = (0..40).map(|_| random_page(&mut rng).to_vec()).collect();
            let reqs = old
                .iter()
                .enumerate()
                .map(|(i, d)| write(i as u64, (i * PAGE) as u64, d))
                .collect();
            run_ok(&mut q, reqs);
            run_ok(&mut q, vec![Request::flush(0)]);
            // Pages 0..40 are overwritten and left unflushed; 40..64 are not.
            let reqs = new
                .iter()
                .enumerate()
                .map(|(i, d)| write(i as u64, (i * PAGE) as u64, d))
                .collect();
            run_ok(&mut q, reqs);
            let policy = PowerCutPolicy::Random {
                keep: 1.0,
                drop: 1.0,
                tear: 2.0,
            };
            let report = disk.power_cut(policy, seed);
            assert_eq!(report.writes.len(), 40);
            assert!(report.kept > 0 && report.dropped > 0 && report.torn > 0);
            let mut garbage = 0;
            for w in &report.writes {
                let i = w.offset as usize / PAGE;
                let got = disk.read_durable(w.offset, w.len);
                match &w.fate {
                    WriteFate::Kept => assert_eq!(got, new[i]),
                    WriteFate::Dropped => assert_eq!(got, old[i]),
                    WriteFate::Torn(sectors) => {
                        assert_eq!(sectors.len(), PAGE / SECTOR);
                        for (s, fate) in sectors.iter().enumerate() {
                            let r = s * SECTOR..(s + 1) * SECTOR;
                            match fate {
                                SectorFate::New => assert_eq!(got[r.clone()], new[i][r]),
                                SectorFate::Old => assert_eq!(got[r.clone()], old[i][r]),
                                SectorFate::Garbage => {
                                    garbage += 1;
                                    assert_ne!(got[r.clone()], new[i][r.clone()]);
                                    assert_ne!(got[r.clone()], old[i][r]);
                                }
                            }
                        }
                    }
                }
            }
            assert!(garbage > 0);
            for (i, d) in old.iter().enumerate().skip(40) {
                assert_eq!(&disk.read_durable((i * PAGE) as u64, PAGE), d);
            }
            report
        };
        assert_eq!(cut(4), cut(4));
        assert_ne!(cut(4), cut(5));
    }

    #[test]
    fn flush_covers_writes_completed_before_its_submission() {
        let disk = SimDisk::new(0, 1 << 20, paged(0));
        let (mut q1, mut q2) = (disk.queue(4), disk.queue(4));
        run_ok(&mut q1, vec![write(0, 0, &[1; PAGE])]);
        q1.push(Request::flush(1)).unwrap();
        q1.submit().unwrap();
        run_ok(&mut q2, vec![write(2, 4096, &[2; PAGE])]);
        let mut out = Vec::new();
        q1.reap(&mut out);
        assert!(out[0].result.is_ok());
        assert_eq!(disk.read_durable(0, PAGE), vec![1; PAGE]);
        assert_eq!(disk.read_durable(4096, PAGE), vec![0; PAGE]);
        assert_eq!(disk.read_current(4096, PAGE), vec![2; PAGE]);
        assert_eq!(disk.unflushed_writes(), 1);
    }

    #[test]
    fn overlapping_writes_apply_in_completion_order() {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let mut q = disk.queue(4);
        run_ok(&mut q, vec![write(0, 0, &[1; 2 * PAGE])]);
        run_ok(&mut q, vec![write(1, 2048, &[2; 512])]);
        let mut want = vec![1; 2 * PAGE];
        want[2048..2560].fill(2);
        assert_eq!(disk.read_current(0, 2 * PAGE), want);
        assert_eq!(disk.read_durable(0, 2 * PAGE), vec![0; 2 * PAGE]);
        run_ok(&mut q, vec![Request::flush(2)]);
        assert_eq!(disk.read_durable(0, 2 * PAGE), want);
        assert!(disk.lock().dirty.is_empty());
    }

    #[test]
    fn deterministic_order_follows_the_seed() {
        let order = |seed| {
            let disk = SimDisk::new(0, 1 << 20, SimConfig::deterministic(seed));
            let mut q = disk.queue(64);
            for i in 0..64 {
                let req = if i % 3 == 0 {
                    write(i, (i % 16) * 512, &[i as u8; 512])
                } else {
                    read(i, (i % 16) * 512, 512)
                };
                q.push(req).unwrap();
            }
            let mut tags = Vec::new();
            let mut batches = Vec::new();
            let started = Instant::now();
            while q.in_flight() + q.queued() > 0 {
                assert_eq!(q.ready_in().is_some(), q.in_flight() > 0);
                q.wait(64, Some(Duration::from_secs(5))).unwrap();
                assert_eq!(q.ready_in(), Some(Duration::ZERO));
                let mut out = Vec::new();
                let n = q.reap(&mut out);
                assert!(n >= 1);
                batches.push(n);
                tags.extend(out.iter().map(|c| c.tag));
            }
            assert!(started.elapsed() < Duration::from_secs(1), "wait slept");
            assert_eq!(q.ready_in(), None);
            (tags, batches, disk.read_current(0, 16 * 512))
        };
        let a = order(42);
        assert_eq!(a, order(42));
        assert_ne!(a.0, order(43).0);
        assert!(a.1.len() > 1, "everything completed at once");
        assert_ne!(a.0, (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn iops_limit_paces_requests() {
        let config = SimConfig {
            iops: Some(2000),
            ..SimConfig::default()
        };
        let disk = SimDisk::new(0, 1 << 20, config);
        let mut q = disk.queue(256);
        let started = Instant::now();
        run_ok(&mut q, (0..200).map(|i| read(i, 0, 512)).collect());
        assert!(
            started.elapsed() >= Duration::from_millis(90),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn latency_delays_completions() {
        let config = SimConfig {
            latency: Latency::Uniform {
                min: Duration::from_millis(20),
                max: Duration::from_millis(30),
            },
            ..SimConfig::default()
        };
        let disk = SimDisk::new(0, 1 << 20, config);
        let mut q = disk.queue(4);
        assert_eq!(q.ready_in(), None);
        let started = Instant::now();
        q.push(read(0, 0, 512)).unwrap();
        q.submit().unwrap();
        let wait = q.ready_in().unwrap();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(30));
        let mut out = Vec::new();
        q.wait(1, Some(Duration::ZERO)).unwrap();
        if started.elapsed() < Duration::from_millis(20) {
            assert_eq!(q.reap(&mut out), 0);
        }
        q.wait(1, None).unwrap();
        assert_eq!(q.ready_in(), Some(Duration::ZERO));
        assert_eq!(q.reap(&mut out), 1);
        assert!(started.elapsed() >= Duration::from_millis(20));

        // Zero latency: ready at the next reap.
        let disk = SimDisk::new(0, 1 << 20, SimConfig::default());
        let mut q = disk.queue(4);
        q.push(read(0, 0, 512)).unwrap();
        q.submit().unwrap();
        assert_eq!(q.reap(&mut out), 1);
    }

    #[test]
    fn dropping_a_queue_completes_its_requests_in_flight() {
        let disk = SimDisk::new(0, 1 << 20, SimConfig::deterministic(1));
        let mut q = disk.queue(4);
        q.push(write(0, 0, &[3; 512])).unwrap();
        q.submit().unwrap();
        q.push(write(1, 512, &[4; 512])).unwrap();
        drop(q);
        assert_eq!(disk.read_current(0, 1024), [[3; 512], [0; 512]].concat());
        assert!(disk.lock().queues.is_empty());
    }

    #[test]
    fn queues_of_several_threads_share_a_disk() {
        let disk = SimDisk::new(0, 1 << 24, paged(0));
        std::thread::scope(|s| {
            for t in 0..3u8 {
                let mut q = disk.queue(16);
                s.spawn(move || {
                    let reqs = (0..16)
                        .map(|i| write(i, (i * 3 + t as u64) * PAGE as u64, &[t + 1; PAGE]))
                        .collect();
                    run_ok(&mut q, reqs);
                    run_ok(&mut q, vec![Request::flush(99)]);
                });
            }
        });
        for p in 0..48u64 {
            assert_eq!(
                disk.read_durable(p * PAGE as u64, PAGE),
                vec![(p % 3) as u8 + 1; PAGE]
            );
        }
    }
}
