//! Recovery, part one: read the logs, find their true ends, and redo page
//! changes onto the devices, before the buffer pool opens.
//!
//! Owns: the scan of each log from its last checkpoint's redo LSN
//! (records valid only at their LSN and in their chain), the merge of the
//! records of every log by GSN (a log never made a record durable before
//! the records of other logs it depends on, so whatever prefix of each
//! log survived, the merge has no hole a record depends on), the redo of
//! every page entry newer than the page (page GSN), and the repair of pages that fail
//! their checksum from the first full page image logged after the redo
//! LSN. Pages a committed large value took are left alone by every entry
//! logged before that commit (the value's bytes, synced before its
//! record, replaced the page); a page damaged beyond repair that the
//! redone map marks free (bytes of a large value whose commit never came)
//! becomes a clean free page. It returns the commit records found, which
//! `db` re-applies through the trees once they are open (part two: a
//! commit's record precedes its page changes, so a commit whose changes
//! were cut short by the crash is completed; uncommitted work never
//! reached the log).
//!
//! Synchronous and single-threaded: it runs before the workers start.
//! Never: writes a page it could not make whole, or guesses past a break
//! in the log.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::control::{self, Control};
use super::record::{self, Kind, Parsed, Write};
use super::{Resume, CONTROL_BYTES};
use crate::buffer::blob::BlobRef;
use crate::buffer::page;
use crate::buffer::space_map::Geometry;
use crate::io::mirror::{CopyState, Mirror};
use crate::io::{
    open_queue, AlignedBuf, Array, Backend, IoBuf, IoQueue, Placement, Request, Target,
};
use crate::{Error, Result};

/// What recovery found and did.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Where each log resumes (log `i` at index `i`).
    pub resume: Vec<Resume>,
    /// The GSN to assign next: past every record found and every GSN the
    /// control blocks name.
    pub next_gsn: u64,
    /// Records scanned from the redo LSNs.
    pub records: u64,
    /// Pages changed by redo.
    pub pages_redone: u64,
    /// Pages rebuilt from a full image because they failed their checksum.
    pub pages_repaired: u64,
    /// Page entries skipped because the page already had them.
    pub entries_skipped: u64,
    /// Leaf cuts (a split's left half) redone.
    pub leaf_cuts: u64,
    /// Keys that leaf cuts left out to fit, each written again by a commit
    /// that recovery re-applies.
    pub keys_left_to_reapply: u64,
    /// Flushes found past where a log ended, beside a torn one, summed
    /// over the logs (a lower bound: [`Scan::flushes_past_end`]).
    pub flushes_past_end: u64,
    /// Committed writes to re-apply, by GSN, in GSN order.
    pub commits: Vec<(u64, Vec<Write<'static>>)>,
    /// Commit records an earlier recovery appended again whose batch it
    /// had not finished (its checkpoint had not moved the redo point to
    /// them): ignored, their first copies are re-applied
    /// (`drop_unfinished_batches`).
    pub appended_again_ignored: u64,
}

pub use crate::io::sync_io;

fn read_at(q: &mut dyn IoQueue, offset: u64, len: usize) -> Result<Vec<u8>> {
    let buf = AlignedBuf::new(len, control::BLOCK as usize)?;
    let c = sync_io(q, Request::read(0, offset, IoBuf::owned(buf)))?;
    c.result?;
    let b = c
        .buf
        .and_then(IoBuf::into_owned)
        .ok_or_else(|| Error::InvalidArgument("a read completed without its buffer".into()))?;
    Ok(b[..len].to_vec())
}

fn write_at(q: &mut dyn IoQueue, offset: u64, data: &[u8], placement: Placement) -> Result<()> {
    write_untorn_at(q, offset, data, placement, false)
}

/// [`write_at`], untorn ([`crate::io::Request::atomic`]) if `untorn`.
fn write_untorn_at(
    q: &mut dyn IoQueue,
    offset: u64,
    data: &[u8],
    placement: Placement,
    untorn: bool,
) -> Result<()> {
    let mut buf = AlignedBuf::new(data.len(), control::BLOCK as usize)?;
    buf[..data.len()].copy_from_slice(data);
    let req = Request::write(0, offset, IoBuf::owned(buf))
        .placed(placement)
        .untorn(untorn);
    sync_io(q, req)?.result?;
    Ok(())
}

fn sync(q: &mut dyn IoQueue) -> Result<()> {
    sync_io(q, Request::flush(0))?.result.map(|_| ())
}

/// Writes a control block recording that a growing log's file now holds
/// `grown` bytes of stream, durable (the growth thread, after the zeros
/// are synced and before any flush writes past the old size). It repeats
/// the last block's checkpoint, in the slot its sequence number selects.
/// Blocking.
pub(super) fn record_growth(log: &Target, writer: &control::Writer, grown: u64) -> Result<()> {
    let turn = writer.turn_blocking(std::time::Duration::from_secs(60))?;
    if turn.stopped() {
        // A stopped log writes nothing more, not even this.
        return Err(Error::Poisoned(
            "the log stopped after a failed write or sync: its growth is not recorded".into(),
        ));
    }
    let last = turn.last();
    if grown <= last.stream_bytes {
        return Ok(());
    }
    let block = Control {
        seq: last.seq + 1,
        stream_bytes: grown,
        ..last
    };
    let mut bytes = block.encode();
    bytes.resize(control::BLOCK as usize, 0);
    let mut q = open_queue(log, &Backend::Blocking, 1)?;
    write_at(q.as_mut(), block.offset(), &bytes, Placement::Unsorted)?;
    sync(q.as_mut())?;
    turn.written(block);
    Ok(())
}

/// Which log of how many a control block belongs to, and the GSN the
/// database's records start at.
#[derive(Debug, Clone, Copy)]
pub struct LogPlace {
    /// This log's index.
    pub index: u32,
    /// Number of logs of the database.
    pub count: u32,
    /// A GSN past every page's.
    pub next_gsn: u64,
}

/// Formats a fresh log on `log`: both control blocks name an empty log
/// whose first record will be at LSN `block`.
pub fn format(
    log: &Target,
    capacity: u64,
    block: u64,
    log_id: u64,
    place: LogPlace,
) -> Result<Resume> {
    let growable = is_growable(log);
    if capacity > MAX_LOG_BYTES {
        return Err(Error::InvalidArgument(format!(
            "a log of {capacity} bytes: at most {MAX_LOG_BYTES} (recovery reads the log into \
             memory)"
        )));
    }
    if log.size() < CONTROL_BYTES + if growable { 0 } else { capacity } {
        return Err(Error::InvalidArgument(format!(
            "log device of {} bytes cannot hold a log of {capacity} bytes",
            log.size()
        )));
    }
    let mut q = open_queue(log, &Backend::Blocking, 4)?;
    let start = control::BLOCK;
    let c = Control {
        seq: 1,
        checkpoint: 0,
        redo: start,
        capacity,
        block,
        log_id,
        next_gsn: place.next_gsn,
        index: place.index,
        count: place.count,
        redo_gsn: 0,
        // What the file holds (a file cut below it is found cut short).
        stream_bytes: if growable {
            (log.size() - CONTROL_BYTES).min(capacity)
        } else {
            capacity
        },
    };
    // Each block in the slot its sequence number selects, as every later
    // one is written.
    let mut area = vec![0u8; CONTROL_BYTES as usize];
    for b in [Control { seq: 0, ..c }, c] {
        let (at, bytes) = (b.offset() as usize, b.encode());
        area[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    write_at(q.as_mut(), 0, &area, Placement::Unsorted)?;
    if growable {
        // Write the log area the file has once (the log grows the rest
        // with zeros ahead of its flushes). A file's preallocated blocks
        // are unwritten extents: the first write to each converts it,
        // which makes ext4 hand an O_DIRECT write to an io_uring worker
        // thread and makes the flush's fdatasync commit its journal. Log
        // writes stay data-only writes from the first on (PostgreSQL
        // zero-fills its WAL segments for the same reason).
        let have = (log.size() - CONTROL_BYTES).min(capacity);
        write_zeros(q.as_mut(), have)?;
    } else {
        // A recycled device may hold an earlier log: every log starts at
        // the same LSN, so its records and flush markers would check out
        // at their own positions, and the scan took an old flush marker
        // past this log's end for proof that durable records were damaged
        // (a new database, closed cleanly, failed every open; a review's
        // finding). So the whole stream is cleared once, at format: by a
        // discard where that reads back as zeros (the simulator), else by
        // writing zeros (a block device's log, a mirrored one).
        let zeroed = log.discard_reads_zeros() && log.discard(CONTROL_BYTES, capacity).is_ok();
        if !zeroed {
            write_zeros(q.as_mut(), capacity)?;
        }
    }
    sync(q.as_mut())?;
    Ok(Resume {
        end: start,
        last_crc: 0,
        control: c,
        valid_end: start,
    })
}

/// Writes zeros over the first `len` bytes of the log stream (past the
/// control blocks), a MiB at a time.
fn write_zeros(q: &mut dyn IoQueue, len: u64) -> Result<()> {
    let chunk = vec![0u8; (1 << 20).min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(chunk.len() as u64) as usize;
        write_at(q, CONTROL_BYTES + at, &chunk[..n], Placement::Log)?;
        at += n as u64;
    }
    Ok(())
}

/// Reads the log's control block; `None` if the log was never formatted.
pub fn read_control(log: &Target) -> Result<Option<Control>> {
    if log.size() < CONTROL_BYTES {
        return Ok(None);
    }
    read_control_at(log, 0)
}

/// The newest control block of `log` (by sequence): of a mirrored log,
/// each healthy copy's, read on its own. Read through the mirror, whose
/// reads go to either copy, a copy put back from an older moment answered
/// with its older block: a log copy from before the log grew named no
/// copy short of it (an outside probe), and an old copy 0 of the log and
/// of `dana.0` put back together passed the data copy as current, so the
/// open served checkpointed values older than acknowledged ones (a
/// review). An error only if no healthy copy could be read.
pub fn read_newest_control(log: &Target) -> Result<Option<Control>> {
    let Target::Mirror(m) = log else {
        return read_control(log);
    };
    let (mut newest, mut failed): (Option<Control>, Option<Error>) = (None, None);
    for c in healthy_copies(m) {
        match m.only(c).and_then(|v| read_control(&Target::Mirror(v))) {
            Ok(Some(ctl)) if newest.as_ref().is_none_or(|n| ctl.seq > n.seq) => newest = Some(ctl),
            Ok(_) => {}
            Err(e) => failed = Some(e),
        }
    }
    match (newest, failed) {
        (None, Some(e)) => Err(e),
        (newest, _) => Ok(newest),
    }
}

/// [`read_control`] of a log whose control blocks start at byte `at` of
/// `log` (a mirrored copy's file, read raw: its label comes first).
pub fn read_control_at(log: &Target, at: u64) -> Result<Option<Control>> {
    let mut q = open_queue(log, &Backend::Blocking, 4)?;
    let area = read_at(q.as_mut(), at, CONTROL_BYTES as usize)?;
    Ok(Control::newest(&area))
}

/// Reads the circular stream of the log, rotated so that index 0 is the
/// control block's redo LSN.
/// The largest log capacity recovery accepts (64 GiB).
pub const MAX_LOG_BYTES: u64 = 1 << 36;

/// True for a log in a regular file: it may be shorter than its capacity
/// and grows (zero-filled, synced) ahead of the flushes
/// ([`crate::wal::Wal`]); a block device or a simulated device holds the
/// whole log from the start.
pub fn is_growable(log: &Target) -> bool {
    log.is_growable()
}

fn read_stream(log: &Target, ctl: &Control) -> Result<Vec<u8>> {
    let cap = ctl.capacity;
    let need = if is_growable(log) { 0 } else { cap };
    // Recovery reads the stream into memory: a capacity past any log dana
    // creates is damage, never an allocation to attempt.
    let too_large = cap > MAX_LOG_BYTES;
    // The block and capacity the log itself takes (`Wal::new`), checked
    // here too: recovery writes redone pages before the log opens.
    let bad_shape =
        !ctl.block.is_power_of_two() || ctl.block > control::BLOCK || cap % control::BLOCK != 0;
    if cap == 0 || too_large || log.size() < CONTROL_BYTES + need || bad_shape {
        return Err(Error::Log(format!(
            "control block names a log of {cap} bytes (block {}) on a device of {} bytes",
            ctl.block,
            log.size()
        )));
    }
    let mut lq = open_queue(log, &Backend::Blocking, 4)?;
    let chunk = 1u64 << 20;
    // A growing log's file ends before its capacity until the first lap is
    // written: no record was ever written past its end (growth is durable
    // before a flush writes there), so the stream is what lies between
    // the redo LSN and the file's end, and the scan takes the rest as the
    // end of the log. (The first version read the capacity whole, zeros
    // past the file's end included: a database created with a 64 GiB log
    // needed 64 GiB of memory at every open.)
    let have = log.size().saturating_sub(CONTROL_BYTES).min(cap);
    // A growing log's file holds whole MiB of stream (its first MiB, then
    // growths rounded to MiB; a growth that fails puts the old size back)
    // or its capacity: any other length is a file cut short, and the
    // records past the cut would be lost without a word.
    if is_growable(log) && have < ctl.stream_bytes.min(cap) {
        return Err(Error::CorruptLog {
            offset: CONTROL_BYTES + have,
            what: format!(
                "the log file holds {have} bytes of stream, and its control block (sequence \
                 {}) says it had {}: it was cut short, and the records past its end are \
                 missing",
                ctl.seq, ctl.stream_bytes
            ),
        });
    }
    // Past what the control block records, a part of a MiB is a growth
    // cut short (a kill in its zero writes, or its truncation after a
    // full file system not yet durable): no record lies there (a growth
    // records the new size before any flush writes past the old one), and
    // the open's log takes the stream to end at the MiB below.
    let have = if is_growable(log) && have < cap && have >= ctl.stream_bytes.min(cap) {
        (have - have % super::INITIAL_LOG_BYTES).max(ctl.stream_bytes.min(cap))
    } else {
        have
    };
    if is_growable(log) && have < cap && have % super::INITIAL_LOG_BYTES != 0 {
        return Err(Error::CorruptLog {
            offset: CONTROL_BYTES + have,
            what: format!(
                "the log file ends {have} bytes into its stream, not at a size it grows to \
                 (whole MiB, or its capacity of {cap} bytes): it was cut short, and the \
                 records past its end are missing"
            ),
        });
    }
    let (from, wraps) = if have < cap && ctl.redo <= have {
        (ctl.redo, false)
    } else {
        (0, true)
    };
    // The whole capacity when the log wraps (a file shorter than the redo
    // LSN reads as zeros past its end), reserved fallibly either way.
    let len = if wraps { cap } else { have - from } as usize;
    let mut area = Vec::new();
    area.try_reserve_exact(len).map_err(|_| {
        Error::Log(format!(
            "recovery reads the log's stream into memory and could not allocate its {len} \
             bytes (Options::log_bytes sets its size)"
        ))
    })?;
    // The redo LSN is where a record starts, inside a flush block when
    // the checkpoint's redo point is the first record sealed after it
    // began (`Wal::begin_checkpoint_in`): reads start at the 4 KiB below.
    let mut at = from - from % control::BLOCK;
    let skip = (from - at) as usize;
    while at < have {
        let n = chunk.min(have - at);
        let bytes = read_at(lq.as_mut(), CONTROL_BYTES + at, n as usize)?;
        let bytes = if at < from {
            &bytes[skip..]
        } else {
            &bytes[..]
        };
        area.extend_from_slice(bytes);
        at += n;
    }
    if wraps {
        area.resize(len, 0);
        area.rotate_left((ctl.redo % cap) as usize);
    }
    Ok(area)
}

/// What a scan of the log from the redo LSN found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Records in the valid log.
    pub records: u64,
    /// (LSN, offset in the stream) of every Pages and Commit record, in
    /// log order: the records recovery redoes or re-applies.
    pub changes: Vec<(u64, usize)>,
    /// The LSN after the last valid record.
    pub end: u64,
    /// Checksum of the last valid record.
    pub last_crc: Option<u32>,
    /// Flushes found past the break, besides the torn one itself, that do
    /// not prove it durable: flushes that were in flight beside the torn
    /// one (none of their commits was acknowledged); the log ends before
    /// them. A lower bound: the intact flush markers past the break less
    /// one, the torn flush's own (whose marker may have survived the
    /// tear).
    pub flushes_past_end: u64,
}

/// Scans `stream` (rotated to the redo LSN) for the valid log: records
/// placed by LSN and chained by checksum. At the first break it looks
/// further for a flush marker naming a durable LSN past the break: if one
/// exists the break is damage to durable records ([`Error::CorruptLog`]);
/// otherwise the break is the torn tail of the last flush, and the end.
pub fn scan(stream: &[u8], ctl: &Control) -> Result<Scan> {
    if ctl.redo >= u64::MAX / 4 {
        // Positions past it would overflow (a damaged or forged control
        // block with a valid checksum; a review's finding).
        return Err(Error::Log(format!(
            "log {} names redo LSN {}, beyond any a log reaches",
            ctl.index, ctl.redo
        )));
    }
    let cap = ctl.capacity;
    let mut out = Scan::default();
    let mut pos = ctl.redo;
    let mut valid_end = pos;
    let mut last: Option<u32> = None;
    let mut last_kind: Option<Kind> = None;
    // Whether what follows the last valid record is zero padding (the
    // flush's own) rather than other bytes (damage, or the gap a torn
    // flush left before the log resumed).
    let mut padded = true;
    // The stream may end before the capacity (a log file in its first
    // lap): nothing was written past its end.
    let limit = cap.min(stream.len() as u64);
    while pos - ctl.redo < limit {
        let off = (pos - ctl.redo) as usize;
        let parsed = record::parse(&stream[off..], pos);
        match parsed {
            // Only the record at the redo LSN is taken without its chain
            // (the one before it is not read). Past a jump to the next
            // block, a record must chain to the last valid one: taking one
            // unchained there skipped a damaged record at a redo LSN
            // inside a block, and every record up to the block's end, as
            // if they had never been written (a review's finding).
            Parsed::Record(r) if last.map_or(pos == ctl.redo, |c| c == r.prev) => {
                out.records += 1;
                if matches!(r.kind, Kind::Pages | Kind::Commit) {
                    out.changes.push((pos, off));
                }
                last = Some(r.crc);
                last_kind = Some(r.kind);
                pos += r.len as u64;
                valid_end = pos;
                continue;
            }
            // Zero padding follows only a flush's marker, its last record.
            // A zero length after any other record is damage (one flipped
            // bit zeroes a length of 64, 128 or 256): counted as padding,
            // the break moved to the next block, where the next flush
            // starts and whose marker names exactly that block as durable,
            // so damage to the flush before the last one was taken for a
            // torn tail and both flushes' commits were dropped (a review's
            // finding).
            _ if pos == valid_end => {
                padded = matches!(parsed, Parsed::Zero) && last_kind == Some(Kind::Flush)
            }
            _ => {}
        }
        if pos % ctl.block == 0 {
            break;
        }
        // Padding to the end of a block, or a break inside one: the log
        // may go on at the next block, chained to the last record.
        pos = pos.div_ceil(ctl.block) * ctl.block;
    }
    // Where the log breaks: at the last valid record's end if other bytes
    // follow it, else (padding) at the block where the next flush failed.
    let broken_at = if padded { pos } else { valid_end };
    // Is anything after the break proven durable? A flush marker names
    // the LSN durable when its flush was issued; markers sit at 8-byte
    // positions and are valid only at their own LSN (never one from an
    // earlier lap of the file).
    let mut at = valid_end.div_ceil(8) * 8;
    let mut markers_past_end = 0u64;
    while at - ctl.redo + record::FLUSH_MARKER_LEN as u64 <= limit {
        let off = (at - ctl.redo) as usize;
        if stream.get(off + 16) == Some(&(Kind::Flush as u8)) {
            if let Parsed::Record(r) = record::parse(&stream[off..], at) {
                let durable = record::flush_durable(&r)?;
                if r.kind == Kind::Flush {
                    if durable > broken_at {
                        return Err(Error::CorruptLog {
                            offset: CONTROL_BYTES + broken_at % cap,
                            what: format!(
                                "the log breaks at LSN {broken_at}, but a flush at LSN {at} was \
                                 issued after LSN {durable} was durable: records that had been \
                                 durable are damaged"
                            ),
                        });
                    }
                    markers_past_end += 1;
                }
            }
        }
        at += 8;
    }
    // The control block was written after its checkpoint record was
    // durable: a valid log that ends before that record lost durable
    // records (a control block read in place of a newer damaged one whose
    // log was trimmed or reused since), and recovering from it would
    // silently drop every commit after them.
    if ctl.checkpoint != 0 && ctl.checkpoint >= ctl.redo && valid_end <= ctl.checkpoint {
        return Err(Error::CorruptLog {
            offset: CONTROL_BYTES + valid_end % cap,
            what: format!(
                "the log from the redo LSN {} ends at LSN {valid_end}, before the checkpoint \
                 record its control block (sequence {}) names at LSN {}: durable records are \
                 damaged or gone (a newer control block damaged?)",
                ctl.redo, ctl.seq, ctl.checkpoint
            ),
        });
    }
    out.end = valid_end;
    out.last_crc = last;
    out.flushes_past_end = markers_past_end.saturating_sub(1);
    Ok(out)
}

/// Reads and scans the log read-only: what [`scan`] finds (damage to
/// durable records is [`Error::CorruptLog`]). For `dana check`.
pub fn verify(log: &Target) -> Result<Option<Scan>> {
    let Some(ctl) = read_control(log)? else {
        return Ok(None);
    };
    let stream = read_stream(log, &ctl)?;
    scan(&stream, &ctl).map(Some)
}

/// What one copy of a mirrored log holds: its control block and where its
/// valid log ends (its last record's checksum), or why it cannot be read.
type CopyView = Result<(Control, u64, Option<u32>)>;

/// Reads and scans copy `c` of the mirrored log `m` alone.
fn view_copy(m: &Arc<Mirror>, c: usize) -> CopyView {
    let view = Target::Mirror(m.only(c)?);
    let ctl = read_control(&view)?.ok_or_else(|| Error::CorruptLog {
        offset: 0,
        what: format!("both control blocks of {} copy {c} are damaged", m.role()),
    })?;
    let stream = read_stream(&view, &ctl)?;
    let s = scan(&stream, &ctl)?;
    Ok((ctl, s.end, s.last_crc))
}

/// The healthy copies of `m`.
fn healthy_copies(m: &Mirror) -> Vec<usize> {
    let states = m.states();
    (0..states.len())
        .filter(|&c| states[c] == CopyState::Healthy)
        .collect()
}

/// Each of `copies` of `m`, read and scanned alone.
fn view_copies(m: &Arc<Mirror>, copies: &[usize]) -> Vec<(usize, CopyView)> {
    copies.iter().map(|&c| (c, view_copy(m, c))).collect()
}

/// True if every copy viewed reads and holds the same log (control
/// block, end, last record).
fn copies_agree(views: &[(usize, CopyView)]) -> bool {
    let same = |a: &CopyView, b: &CopyView| match (a, b) {
        (Ok((ca, ea, ka)), Ok((cb, eb, kb))) => {
            (ca.seq, ca.redo, ca.checkpoint, ea, ka) == (cb.seq, cb.redo, cb.checkpoint, eb, kb)
        }
        _ => false,
    };
    views.windows(2).all(|w| same(&w[0].1, &w[1].1)) && views.first().is_some_and(|v| v.1.is_ok())
}

/// The copy whose valid log ends furthest (the lowest on a tie), of those
/// that read.
fn best_copy(views: &[(usize, CopyView)]) -> Option<usize> {
    views
        .iter()
        .filter(|(_, v)| v.is_ok())
        .max_by_key(|(c, v)| (v.as_ref().map(|x| x.1).unwrap_or(0), std::cmp::Reverse(*c)))
        .map(|(c, _)| *c)
}

/// The log a read-only open reads: of a mirrored log whose healthy copies
/// differ, the copy [`resync_mirror`] would keep, alone (a read-only open
/// writes nothing, so it cannot make them one); else `log` itself. Read
/// through the mirror, the copies' blocks mixed: an older copy of the
/// same length put back beside the current one made `dana check` refuse
/// a database the writable open found whole, as damaged or older than
/// its data files (an outside probe, a review).
pub fn read_only_view(log: &Target) -> Result<Target> {
    let Some(m) = log.mirror() else {
        return Ok(log.clone());
    };
    let healthy = healthy_copies(m);
    if healthy.len() < 2 {
        return Ok(log.clone());
    }
    let views = view_copies(m, &healthy);
    if copies_agree(&views) {
        return Ok(log.clone());
    }
    match best_copy(&views) {
        Some(best) => Ok(Target::Mirror(m.only(best)?)),
        None => Ok(log.clone()),
    }
}

/// Makes the copies of a mirrored log identical before recovery reads it.
///
/// A crash can leave them different, each valid on its own: a flush (or a
/// control block) that reached one copy and not the other. Recovery must
/// read one log, and later flushes must continue the log it read on every
/// copy, or a copy would hold a hole before them. So each healthy copy is
/// read and scanned alone; if they disagree (control block, end of the
/// valid log, or one cannot be read: damage), the copy whose valid log
/// ends furthest wins (the lowest copy on a tie) and its bytes are written
/// over every other copy that holds the log (rebuilding ones included)
/// where they differ. A copy damaged where it had been durable (the scan's
/// [`Error::CorruptLog`]) is repaired from a good one this way. Returns
/// the copies repaired (0 when they agreed, or the log is not mirrored);
/// fails only if no copy can be read.
pub fn resync_mirror(log: &Target) -> Result<usize> {
    let Some(m) = log.mirror() else {
        return Ok(0);
    };
    let states = m.states();
    let healthy: Vec<usize> = (0..m.copies())
        .filter(|&c| states[c] == CopyState::Healthy)
        .collect();
    let holders: Vec<usize> = (0..m.copies())
        .filter(|&c| !matches!(states[c], CopyState::Failed))
        .collect();
    if holders.len() < 2 {
        return Ok(0);
    }
    let mut views = view_copies(m, &healthy);
    if views.iter().all(|(_, v)| v.is_err()) && merge_disjoint_damage(m, &healthy)? {
        views = view_copies(m, &healthy);
    }
    // Rebuilding copies are not scanned (they are behind on purpose): the
    // healthy copies agreeing is enough for them, since every flush goes
    // to them too and the rebuild copies the rest.
    if copies_agree(&views) {
        return Ok(0);
    }
    let Some(best) = best_copy(&views) else {
        // No copy can be read: the first one's error.
        let (_, v) = views
            .into_iter()
            .next()
            .expect("two holders, one healthy at least");
        return v.map(|_| 0);
    };
    m.note_mismatch();
    let size = m.size();
    let chunk = 1u64 << 20;
    let mut repaired = 0;
    for &c in holders.iter().filter(|&&c| c != best) {
        let mut wrote = false;
        let mut at = 0;
        while at < size {
            let n = chunk.min(size - at) as usize;
            let want = m.read_copy(best, at, n)?;
            let differs = match m.read_copy(c, at, n) {
                Ok(have) => have[..] != want[..],
                Err(_) => true,
            };
            if differs {
                m.write_copy(c, at, &want)?;
                wrote = true;
            }
            at += n as u64;
        }
        repaired += usize::from(wrote);
    }
    Ok(repaired)
}

/// Most bytes past a break that [`merge_disjoint_damage`] looks at for the
/// damage, most patches it keeps, most runs it tries per break and copy,
/// longest run it tries, and most scans of the whole stream it makes
/// (each reads it from the redo point: the bound on its work at open).
const MERGE_WINDOW: usize = 1 << 20;
const MERGE_PATCHES: usize = 32;
const MERGE_CANDIDATES: usize = 64;
const MERGE_RUN: usize = 64 << 10;
const MERGE_SCANS: usize = 256;

/// Repairs the first of `copies` (healthy copies of the mirrored log `m`,
/// none of which scans whole: each is damaged somewhere) from the others
/// where their damage lies in different places: at each break of its
/// scan, the bytes where another copy differs shortly after the break are
/// tried one run at a time, in memory, and a run is kept if the scan then
/// gets past the break. True if the copy then scans whole and was
/// patched on its device; false (nothing written) if the copies' control
/// blocks differ or no run helps. Each copy alone failed the open with
/// `CorruptLog` though every byte was whole on one of them (an outside
/// probe's finding).
fn merge_disjoint_damage(m: &Arc<Mirror>, copies: &[usize]) -> Result<bool> {
    let Some((&base, others)) = copies.split_first() else {
        return Ok(false);
    };
    let view = |c: usize| m.only(c).map(Target::Mirror);
    let Ok(Some(ctl)) = read_control(&view(base)?) else {
        return Ok(false);
    };
    let mut streams = Vec::with_capacity(others.len());
    for &c in others {
        if !matches!(read_control(&view(c)?), Ok(Some(o)) if o == ctl) {
            return Ok(false);
        }
        match read_stream(&view(c)?, &ctl) {
            Ok(s) => streams.push(s),
            Err(_) => return Ok(false),
        }
    }
    let Ok(mut merged) = read_stream(&view(base)?, &ctl) else {
        return Ok(false);
    };
    let cap = ctl.capacity;
    // A break's file offset, as an index into the stream (which starts
    // at the redo LSN).
    let index = |offset: u64| {
        let q = offset.saturating_sub(CONTROL_BYTES) % cap;
        ((q + cap - ctl.redo % cap) % cap) as usize
    };
    let mut patched: Vec<std::ops::Range<usize>> = Vec::new();
    let mut scans = 0;
    let whole = loop {
        scans += 1;
        let at = match scan(&merged, &ctl) {
            Ok(_) => break true,
            Err(Error::CorruptLog { offset, .. }) if patched.len() < MERGE_PATCHES => index(offset),
            Err(_) => break false,
        };
        let mut kept = None;
        'candidates: for other in &streams {
            let end = (at + MERGE_WINDOW).min(merged.len()).min(other.len());
            let mut i = at;
            for _ in 0..MERGE_CANDIDATES {
                let Some(from) = (i..end).find(|&j| merged[j] != other[j]) else {
                    break;
                };
                let to = (from..end).find(|&j| merged[j] == other[j]).unwrap_or(end);
                i = to;
                if to - from > MERGE_RUN {
                    continue;
                }
                if scans >= MERGE_SCANS {
                    break 'candidates;
                }
                scans += 1;
                let saved = merged[from..to].to_vec();
                merged[from..to].copy_from_slice(&other[from..to]);
                let past = match scan(&merged, &ctl) {
                    Ok(_) => true,
                    Err(Error::CorruptLog { offset, .. }) => index(offset) > at,
                    Err(_) => false,
                };
                if past {
                    kept = Some(from..to);
                    break 'candidates;
                }
                merged[from..to].copy_from_slice(&saved);
            }
        }
        match kept {
            Some(run) => patched.push(run),
            None => break false,
        }
    };
    if !whole {
        return Ok(false);
    }
    // The runs kept, written over the copy's device blocks, each block
    // once.
    let block = control::BLOCK;
    let mut blocks: BTreeMap<u64, Vec<(usize, u8)>> = BTreeMap::new();
    for i in patched.into_iter().flatten() {
        let dev = CONTROL_BYTES + (ctl.redo + i as u64) % cap;
        let at = dev - dev % block;
        blocks
            .entry(at)
            .or_default()
            .push(((dev - at) as usize, merged[i]));
    }
    for (at, bytes) in blocks {
        let mut b = m.read_copy(base, at, block as usize)?;
        for (i, v) in bytes {
            b[i] = v;
        }
        m.write_copy(base, at, &b)?;
    }
    m.note_mismatch();
    Ok(true)
}

/// What differs between the healthy copies of a mirrored log, each read
/// and scanned alone (for `dana check`): one line per disagreement, none
/// if they agree. A disagreement is looked at again once, a moment
/// later: a write in flight during the reads (a checkpoint's control
/// block, a flush) has reached every copy by then, and only what still
/// differs is reported.
pub fn compare_mirror(m: &Arc<Mirror>) -> Vec<String> {
    let first = compare_mirror_once(m);
    if first.is_empty() {
        return first;
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    compare_mirror_once(m)
}

fn compare_mirror_once(m: &Arc<Mirror>) -> Vec<String> {
    let states = m.states();
    let views: Vec<(usize, CopyView)> = (0..m.copies())
        .filter(|&c| states[c] == CopyState::Healthy)
        .map(|c| (c, view_copy(m, c)))
        .collect();
    let mut out = Vec::new();
    for (c, v) in &views {
        if let Err(e) = v {
            out.push(format!(
                "{} copy {c} cannot be read as a log: {e}",
                m.role()
            ));
        }
    }
    let ok: Vec<_> = views
        .iter()
        .filter_map(|(c, v)| v.as_ref().ok().map(|v| (c, v)))
        .collect();
    for w in ok.windows(2) {
        let ((ca, (xa, ea, _)), (cb, (xb, eb, _))) = (w[0], w[1]);
        if (xa.seq, xa.redo, ea) != (xb.seq, xb.redo, eb) {
            out.push(format!(
                "{} copies {ca} and {cb} differ: control blocks {} and {}, valid logs ending \
                 at LSN {ea} and {eb}",
                m.role(),
                xa.seq,
                xb.seq
            ));
        }
    }
    out
}

/// True if the log holds commits after the last checkpoint's redo LSN,
/// or page changes there that `array`'s pages do not hold yet (a page
/// damaged, or with a lower LSN): a read-only open cannot use the
/// database then. A cleanly closed database's log holds one such change
/// past its redo LSN, the checkpoint stamp of its last checkpoint
/// (`buffer::alloc`), which that checkpoint wrote to its meta page. On a
/// mirrored device every healthy copy whose version is a valid page must
/// hold it, and one must (a read-only open repairs nothing, and reads one
/// copy, never a damaged one). Returns None if recovery is
/// needed, else the GSN after the last change record past the redo LSN
/// (0 if none): the log's end, which the data files' stamp must lie
/// below. Reads only.
pub fn needs_recovery(
    array: &Array,
    log: &Target,
    ctl: Control,
    durable: u64,
) -> Result<Option<u64>> {
    let stream = read_stream(log, &ctl)?;
    let s = scan(&stream, &ctl)?;
    check_log_not_older(ctl.index as usize, s.end, ctl.block, durable)?;
    let mut queues: Vec<Option<Box<dyn IoQueue>>> = array.targets().iter().map(|_| None).collect();
    let ps = array.page_size() as usize;
    let mut end = 0;
    for &(lsn, off) in &s.changes {
        let Parsed::Record(r) = record::parse(&stream[off..], lsn) else {
            return Ok(None);
        };
        if r.kind == Kind::Commit {
            return Ok(None);
        }
        end = end.max(r.gsn.saturating_add(1));
        for e in record::page_entries(&r)? {
            if e.pid >= array.pages() {
                return Ok(None);
            }
            let (dev, offset) = array.locate(e.pid);
            let holds =
                |page: &[u8]| page::verify(page, e.pid).is_ok() && page::page_lsn(page) >= r.gsn;
            if let Target::Mirror(m) = &array.targets()[dev] {
                // Every healthy copy holding a valid page must hold the
                // change, and one must: a copy that fails its checksum is
                // damage, which no read takes (the mirror reads another
                // copy), not a version lacking the change (`dana check`
                // refused a cleanly closed database with a damaged copy).
                let mut held = false;
                for (c, state) in m.states().into_iter().enumerate() {
                    if state != crate::io::mirror::CopyState::Healthy {
                        continue;
                    }
                    let page = m.read_copy(c, offset, ps)?;
                    if page::verify(&page, e.pid).is_err() {
                        continue;
                    }
                    if !holds(&page) {
                        return Ok(None);
                    }
                    held = true;
                }
                if !held {
                    return Ok(None);
                }
                continue;
            }
            let q = match &mut queues[dev] {
                Some(q) => q,
                none => none.insert(open_queue(&array.targets()[dev], &Backend::Blocking, 1)?),
            };
            if !holds(&read_at(q.as_mut(), offset, ps)?) {
                return Ok(None);
            }
        }
    }
    Ok(Some(end))
}

/// Drops from `commits` (sorted by GSN) the commit records appended
/// again by a recovery (`flags`, by GSN: [`record::APPENDED_AGAIN`]) whose
/// batch had not finished; returns how many.
///
/// A recovery short of log room appends the commits it has left again at
/// the log end, in one batch, then checkpoints with the redo point at the
/// batch's first record (`recovery::reapply`). Until that checkpoint's
/// control block is written, the first copies stay past the redo point
/// and are re-applied; a crash in the batch's flush can also leave only a
/// prefix of it. Re-applying such a prefix after every first copy undid
/// later commits: a key a commit in the prefix wrote took that value
/// again over the value of an acknowledged commit left out of the prefix
/// (a review's finding). So a batch stands only where nothing from
/// `redo_gsn` on precedes its first record: then the checkpoint finished
/// (which it does only once the batch is durable whole) and the first
/// copies lie below the redo point. A batch whose first record lies below
/// `redo_gsn` finished too. Every other batch is dropped whole; its first
/// copies, all past the redo point, are re-applied instead.
fn drop_unfinished_batches(
    commits: &mut Vec<(u64, Vec<Write<'static>>)>,
    flags: &BTreeMap<u64, u8>,
    redo_gsn: u64,
) -> u64 {
    if flags.is_empty() {
        return 0;
    }
    let first_past = commits.partition_point(|c| c.0 < redo_gsn);
    let mut keep_batch = true;
    let mut index = 0usize;
    let before = commits.len();
    commits.retain(|(gsn, _)| {
        let at = index;
        index += 1;
        if at < first_past {
            return true;
        }
        match flags.get(gsn) {
            None => {
                // A first copy from the redo GSN on: a batch record after
                // it stands only under a first record that comes later.
                // (Spread over several logs, a batch kept a record whose
                // log survived after its first record's log lost its
                // flush: an older value re-applied over an acknowledged
                // one; a review's finding.)
                keep_batch = false;
                true
            }
            Some(f) => {
                if f & record::FIRST_APPENDED_AGAIN != 0 {
                    keep_batch = at == first_past;
                }
                keep_batch
            }
        }
    });
    (before - commits.len()) as u64
}

/// For each page with log entries that a committed large value took: the
/// GSN of the last commit that took it. Commits are in GSN order.
fn taken_by_large_values<T>(
    commits: &[(u64, Vec<Write<'static>>)],
    by_page: &BTreeMap<u64, T>,
    page_size: usize,
) -> Result<BTreeMap<u64, u64>> {
    let mut taken = BTreeMap::new();
    for (lsn, writes) in commits {
        for v in writes
            .iter()
            .filter(|w| w.reference)
            .filter_map(|w| w.value.as_ref())
        {
            let r = BlobRef::decode(v, page_size)
                .map_err(|e| Error::Log(format!("commit record with GSN {lsn}: {e}")))?;
            for e in &r.extents {
                for (&pid, _) in by_page.range(e.page_ids()) {
                    taken.insert(pid, *lsn);
                }
            }
        }
    }
    Ok(taken)
}

/// A page that fails its checksum and has no full image in the log: if
/// the map (redone) has it free, its bytes are those of a large value
/// whose commit never came (written into a freed page, synced, then the
/// crash) or of a torn write of a free page; it becomes a clean free page.
/// If the map has it used, it is damage recovery cannot repair.
/// The free page carries `newest`, the GSN of the page's newest entry, so
/// that a recovery after a crash during this one skips them all (with LSN
/// 0 it applied them to the zeroed page again: garbage in a free page,
/// never read, but redo was not idempotent there; a review's finding, no
/// test).
fn reinit_if_free(
    array: &Array,
    queues: &mut [Box<dyn IoQueue>],
    pid: u64,
    newest: u64,
) -> Result<()> {
    let ps = array.page_size() as usize;
    let geo = Geometry::new(ps);
    let map_pid = geo.map_page_of(pid);
    let (dev, offset) = array.locate(map_pid);
    let map = read_at(queues[dev].as_mut(), offset, ps)?;
    let (at, mask) = geo.bit(pid);
    if page::verify(&map, map_pid).is_err() || map[at] & mask != 0 {
        return Err(Error::Corrupt {
            page: pid,
            what: "the page is damaged (torn write?) and the log holds no full image of it \
                   after the last checkpoint"
                .into(),
        });
    }
    let mut free = vec![0u8; ps];
    page::init_page(&mut free, pid, page::PageType::Free);
    page::set_page_lsn(&mut free, newest);
    page::seal(&mut free);
    let (dev, offset) = array.locate(pid);
    write_at(queues[dev].as_mut(), offset, &free, Placement::Cold)
}

/// One log as recovery reads it: its stream (rotated to the redo LSN),
/// its control block and what the scan found.
struct Found {
    stream: Vec<u8>,
    ctl: Control,
    scan: Scan,
}

/// Redoes a leaf cut ([`record::CUT`]) on a page: keeps the keys `<=` the
/// cut key (the new upper fence), leaving out, only if they would not fit,
/// keys the third argument accepts (written by commits recovery
/// re-applies). The node format is the trees' (`btree::node::cut_leaf`),
/// a layer this one may not import: the caller hands it in.
/// Returns the number of keys left out.
pub type CutLeaf = fn(&mut [u8], &[u8], &dyn Fn(&[u8]) -> bool) -> std::result::Result<u64, String>;

/// The error of data files and a log that do not belong together: files
/// restored from different moments (`what` says how they differ).
pub fn different_moments(what: String) -> Error {
    Error::Log(format!(
        "the data files and the log are from different moments (restored from different \
         copies?): {what}; nothing was changed"
    ))
}

/// Data files older than the log: their checkpoint `stamp` (the meta
/// page's, 0: unknown) below the newest control block's redo GSN. The
/// pages lack commits the log no longer holds (recovery starts past
/// them).
pub fn check_not_older(stamp: u64, logs: &[(Target, Control)]) -> Result<()> {
    let redo_gsn = logs.iter().map(|(_, c)| c.redo_gsn).max().unwrap_or(0);
    if stamp != 0 && stamp < redo_gsn {
        return Err(different_moments(format!(
            "the data files are older than the log: their last checkpoint began at GSN \
             {stamp}, the log's at GSN {redo_gsn}, and the log no longer holds the commits \
             in between"
        )));
    }
    Ok(())
}

/// Log `index` older than the data files: its valid log ends at LSN
/// `end`, before `durable` (the meta page's end of it: 0, unknown), the
/// stream position the data files' last checkpoint made durable before it
/// wrote them. With several logs [`check_not_newer`] takes the newest
/// log's end, so one log put back from an older copy passed it beside
/// the others (an outside probe's finding).
pub fn check_log_not_older(index: usize, end: u64, block: u64, durable: u64) -> Result<()> {
    // The recorded end may be a flush's padded end (zeros to the log's
    // block after its last record, where the next record starts): the
    // valid log, rounded up to the block, reaches it (a first version
    // compared the valid end itself and refused an idle log after a crash
    // in a kill -9 campaign).
    let padded = end.div_ceil(block.max(1)).saturating_mul(block.max(1));
    if padded < durable {
        return Err(different_moments(format!(
            "log {index} is older than the data files: it ends at LSN {end}, and their last \
             checkpoint had made it durable to LSN {durable}"
        )));
    }
    Ok(())
}

/// Data files newer than the log: their checkpoint `stamp` (the meta
/// page's, 0: unknown) at or past `end`, the GSN after the log's last
/// record. The stamp's own change is logged before the meta page that
/// holds it is written, so in files that belong together it lies below.
pub fn check_not_newer(stamp: u64, end: u64) -> Result<()> {
    if stamp != 0 && stamp >= end {
        return Err(different_moments(format!(
            "the data files are newer than the log: their last checkpoint began at GSN \
             {stamp}, and the log ends before GSN {end}"
        )));
    }
    Ok(())
}

/// Log `i` as an error names it: its file (a mirrored log's first copy),
/// or its index alone (a simulated device).
pub fn log_name(t: &Target, i: usize) -> String {
    match t.files(0).first() {
        Some((d, _)) => format!("log {i} ({})", d.path().display()),
        None => format!("log {i}"),
    }
}

/// Adds which log an error of reading log `i` is about: with a log per
/// worker, or mirrored, a damaged log's offset alone named no file (an
/// outside probe's finding).
pub fn in_log(t: &Target, i: usize) -> impl FnOnce(Error) -> Error + '_ {
    move |e| match e {
        Error::CorruptLog { offset, what } => Error::CorruptLog {
            offset,
            what: format!("{what} (in {})", log_name(t, i)),
        },
        Error::Log(what) => Error::Log(format!("{what} (in {})", log_name(t, i))),
        e => e,
    }
}

/// Scans every log (`logs[i]`: log `i` and its newest control block),
/// checks the data files' checkpoint `stamp` (0: unknown) against where
/// the logs end ([`check_not_newer`]) and each log against its end the
/// meta page recorded (`log_ends[i]`, [`check_log_not_older`]) before
/// anything is written, and
/// redoes page changes onto `array`'s devices in GSN order (leaf cuts
/// through `cut`), then syncs them. Returns the commits to re-apply (in
/// GSN order) and where each log resumes.
pub fn recover(
    array: &Array,
    logs: &[(Target, Control)],
    cut: CutLeaf,
    stamp: u64,
    log_ends: &[u64],
) -> Result<Recovered> {
    let mut found = Vec::with_capacity(logs.len());
    for (i, (t, ctl)) in logs.iter().enumerate() {
        if ctl.next_gsn >= u64::MAX / 2 || ctl.redo_gsn >= u64::MAX / 2 {
            return Err(Error::Log(format!(
                "log {} names GSN {}, beyond any the database assigns",
                ctl.index,
                ctl.next_gsn.max(ctl.redo_gsn)
            )));
        }
        let stream = read_stream(t, ctl).map_err(in_log(t, i))?;
        let scan = scan(&stream, ctl).map_err(in_log(t, i))?;
        let durable = log_ends.get(i).copied().unwrap_or(0);
        check_log_not_older(i, scan.end, ctl.block, durable).map_err(in_log(t, i))?;
        found.push(Found {
            stream,
            ctl: *ctl,
            scan,
        });
    }
    let mut out = Recovered {
        records: found.iter().map(|f| f.scan.records).sum(),
        flushes_past_end: found.iter().map(|f| f.scan.flushes_past_end).sum(),
        next_gsn: logs
            .iter()
            .map(|(_, c)| c.next_gsn)
            .max()
            .unwrap_or(1)
            .max(1),
        ..Default::default()
    };

    // Page entries by page, and commits, of every log, by GSN: those of
    // Pages records and the map changes that commit records of large
    // values carry.
    let mut by_page: BTreeMap<u64, Vec<(u64, u64, record::PageEntry<'_>)>> = BTreeMap::new();
    // The flags of commit records appended again by a recovery, by GSN.
    let mut appended_again: BTreeMap<u64, u8> = BTreeMap::new();
    for f in &found {
        for &(lsn, off) in &f.scan.changes {
            let Parsed::Record(r) = record::parse(&f.stream[off..], lsn) else {
                return Err(Error::Log(format!(
                    "record at LSN {lsn} changed under recovery"
                )));
            };
            if r.gsn >= u64::MAX / 2 {
                return Err(Error::Log(format!(
                    "record at LSN {lsn} has GSN {}, beyond any the database assigns",
                    r.gsn
                )));
            }
            out.next_gsn = out.next_gsn.max(r.gsn + 1);
            let entries = if r.kind == Kind::Commit {
                out.commits.push((r.gsn, record::commit_writes(&r)?));
                if r.flags & record::APPENDED_AGAIN != 0 {
                    appended_again.insert(r.gsn, r.flags);
                }
                record::commit_pages(&r)?
            } else {
                record::page_entries(&r)?
            };
            for e in entries {
                if e.pid >= array.max_pages() {
                    return Err(Error::Log(format!(
                        "record at LSN {lsn} changes page {}, beyond the most the array can \
                         hold ({} pages)",
                        e.pid,
                        array.max_pages()
                    )));
                }
                by_page.entry(e.pid).or_default().push((r.gsn, lsn, e));
            }
        }
    }
    out.commits.sort_by_key(|c| c.0);
    for entries in by_page.values_mut() {
        entries.sort_by_key(|e| e.0);
    }
    // The pages hold every commit below the newest checkpoint's redo GSN
    // (its pages were synced before any log's control block named it); a
    // log whose control block is older scans from further back, and
    // re-applying its older commits could undo later ones of other logs.
    let redo_gsn = logs.iter().map(|(_, c)| c.redo_gsn).max().unwrap_or(0);
    out.appended_again_ignored =
        drop_unfinished_batches(&mut out.commits, &appended_again, redo_gsn);
    // Nothing is written before this (the stamp's record is a page
    // record, so `next_gsn` has passed it).
    check_not_newer(stamp, out.next_gsn)?;

    // Growth is durable before a page past the old end is used, so this
    // finds nothing to do unless the files were shrunk behind dana's back
    // (a copy cut short): the files are extended before any page past
    // their end is redone.
    if let Some((&last, _)) = by_page.last_key_value() {
        if last >= array.pages() {
            array.grow_to(last + 1)?;
        }
    }
    let mut queues = array
        .targets()
        .iter()
        .map(|t| open_queue(t, &Backend::Blocking, 4))
        .collect::<Result<Vec<_>>>()?;
    let ps = array.page_size() as usize;
    // A redone page is written untorn wherever its device can: a log
    // written with untorn page writes holds no image to rebuild a page
    // that a crash during this recovery tears (whatever the options of
    // this open say).
    let untorn: Vec<bool> = array
        .targets()
        .iter()
        .map(|t| t.untorn_writes(ps as u64))
        .collect();
    // Every commit found says which pages its large values took.
    let taken = taken_by_large_values(&out.commits, &by_page, ps)?;
    let applied_before = out.commits.partition_point(|c| c.0 < redo_gsn);
    out.commits.drain(..applied_before);
    let next_gsn = out.next_gsn;
    // Pages that fail their checksum with no full image to repair them
    // from: judged once every page is redone (by the map's final word).
    let mut damaged = Vec::new();
    for (pid, mut entries) in by_page {
        // The same holds for page records below that GSN: a log whose
        // control block is older (a crash between the logs' control-block
        // writes of a checkpoint) would otherwise bring back its older
        // full images, over pages taken since by large values whose
        // commits lie in another log below its redo point, where nothing
        // here says they were taken (the pages fail their checksum, so an
        // image would be taken for a repair). A full image that repairs a
        // page torn since is logged at or past its shard's full-image
        // bound, never below the redo GSN.
        let before = entries.len();
        entries.retain(|(gsn, _, _)| *gsn >= redo_gsn);
        out.entries_skipped += (before - entries.len()) as u64;
        if entries.is_empty() {
            continue;
        }
        // A committed large value's bytes replaced whatever this page held
        // before its commit: those entries must not come back over them.
        if let Some(&cut) = taken.get(&pid) {
            let before = entries.len();
            entries.retain(|(gsn, _, _)| *gsn > cut);
            out.entries_skipped += (before - entries.len()) as u64;
            if entries.is_empty() {
                continue;
            }
        }
        let (dev, offset) = array.locate(pid);
        let q = queues[dev].as_mut();
        let mut bytes = read_at(q, offset, ps)?;
        let intact = page::verify(&bytes, pid).is_ok();
        let mut gsn_now = if intact {
            Some(page::page_lsn(&bytes))
        } else {
            None
        };
        let mut changed = false;
        let mut newest = 0;
        for (gsn, lsn, e) in entries {
            newest = newest.max(gsn);
            match gsn_now {
                // A page handed out new whose bytes on the device carry
                // an LSN the logs never reached: no version of it (a
                // large value's bytes, the user's, made to look like a
                // page), so its image is redone. Below the logs' end the
                // LSN rule holds for a new page too: a commit logged
                // before the image may be applied to the page after it
                // (its record covers the change, and it is not redone
                // over a page stamped later), so an old image redone over
                // a newer page lost keys (a crash-test campaign found it).
                Some(g) if gsn <= g && !(e.is_fresh() && g >= next_gsn) => out.entries_skipped += 1,
                None if !e.is_full() => out.entries_skipped += 1,
                _ if e.is_cut() => {
                    let (tree, key) = e.cut(lsn)?;
                    let commits = &out.commits;
                    let rewritten = |k: &[u8]| {
                        commits
                            .iter()
                            .any(|(_, ws)| ws.iter().any(|w| w.tree == tree && w.key == k))
                    };
                    let left_out =
                        cut(&mut bytes, key, &rewritten).map_err(|what| Error::Corrupt {
                            page: pid,
                            what: format!("redo of the leaf cut at LSN {lsn}: {what}"),
                        })?;
                    out.leaf_cuts += 1;
                    out.keys_left_to_reapply += left_out;
                    page::set_page_lsn(&mut bytes, gsn);
                    gsn_now = Some(gsn);
                    changed = true;
                }
                _ => {
                    if gsn_now.is_none() {
                        out.pages_repaired += 1;
                    }
                    e.apply(&mut bytes, lsn, gsn)?;
                    gsn_now = Some(gsn);
                    changed = true;
                }
            }
        }
        if gsn_now.is_none() {
            damaged.push((pid, newest));
            continue;
        }
        if changed {
            page::seal(&mut bytes);
            write_untorn_at(q, offset, &bytes, Placement::Unsorted, untorn[dev])?;
            out.pages_redone += 1;
        }
    }
    for (pid, newest) in damaged {
        reinit_if_free(array, &mut queues, pid, newest)?;
        out.pages_repaired += 1;
    }
    for q in &mut queues {
        sync(q.as_mut())?;
    }
    for f in &found {
        let block = f.ctl.block;
        let valid_end = f.scan.end;
        out.resume.push(Resume {
            end: valid_end.div_ceil(block) * block,
            last_crc: f.scan.last_crc.unwrap_or(0),
            control: f.ctl,
            valid_end,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A growth's control block takes the next slot and repeats the last
    /// block but for its size; once the log stopped none is written.
    #[test]
    fn growths_are_recorded_until_the_log_stops() {
        use crate::io::sim::{SimConfig, SimDisk};
        let d = SimDisk::new(0, 4 << 20, SimConfig::default());
        let t = Target::Sim(d.clone());
        let last = Control {
            seq: 1,
            checkpoint: 0,
            redo: 4096,
            capacity: 64 << 20,
            block: 512,
            log_id: 9,
            next_gsn: 3,
            index: 0,
            count: 1,
            redo_gsn: 0,
            stream_bytes: 1 << 20,
        };
        let w = control::Writer::new(last);
        let newest = || Control::newest(&d.read_current(0, CONTROL_BYTES as usize)).unwrap();
        record_growth(&t, &w, 2 << 20).unwrap();
        let grown = Control {
            seq: 2,
            stream_bytes: 2 << 20,
            ..last
        };
        assert_eq!(newest(), grown);
        w.stop();
        assert!(matches!(
            record_growth(&t, &w, 4 << 20),
            Err(Error::Poisoned(_))
        ));
        assert_eq!(newest(), grown);
    }

    /// A stream (rotated to LSN 4096) holding one commit record there,
    /// and a control block naming `checkpoint` as its checkpoint record.
    fn one_record(checkpoint: u64) -> (Vec<u8>, Control) {
        let w = vec![Write {
            tree: 5,
            key: b"k".to_vec(),
            value: Some(b"v".to_vec().into()),
            reference: false,
        }];
        let mut rec = record::commit(&w).into_unsealed();
        record::seal(&mut rec, 4096, 0);
        let mut stream = vec![0u8; 64 << 10];
        stream[..rec.len()].copy_from_slice(&rec);
        let ctl = Control {
            checkpoint,
            ..log_control(4096)
        };
        (stream, ctl)
    }

    /// A log of three flushes from LSN 4096 (512-byte blocks), each of
    /// `per_flush` commit records of ~100 bytes and its marker, padded to
    /// its block; each marker names the end of the flush before it as
    /// durable (one flush in flight). Returns the stream (from LSN 4096)
    /// and each record's (LSN, kind).
    fn three_flushes(per_flush: usize) -> (Vec<u8>, Vec<(u64, Kind)>) {
        let mut stream = vec![0u8; 64 << 10];
        let mut records = Vec::new();
        let (mut lsn, mut prev, mut durable) = (4096u64, 0u32, 4096u64);
        for f in 0..3u8 {
            let mut bodies: Vec<Vec<u8>> = (0..per_flush)
                .map(|i| {
                    let w = vec![Write {
                        tree: 5,
                        key: vec![f, i as u8],
                        value: Some(vec![i as u8; 60].into()),
                        reference: false,
                    }];
                    record::commit(&w).into_unsealed()
                })
                .collect();
            bodies.push(record::flush_marker(durable).into_unsealed());
            let n = bodies.len();
            for (i, mut rec) in bodies.into_iter().enumerate() {
                prev = record::seal(&mut rec, lsn, prev);
                let at = (lsn - 4096) as usize;
                stream[at..at + rec.len()].copy_from_slice(&rec);
                let kind = if i + 1 == n {
                    Kind::Flush
                } else {
                    Kind::Commit
                };
                records.push((lsn, kind));
                lsn += rec.len() as u64;
            }
            lsn = lsn.div_ceil(512) * 512;
            durable = lsn;
        }
        (stream, records)
    }

    fn log_control(redo: u64) -> Control {
        Control {
            seq: 3,
            checkpoint: 0,
            redo,
            capacity: 64 << 10,
            block: 512,
            log_id: 1,
            next_gsn: 10,
            index: 0,
            count: 1,
            redo_gsn: 1,
            stream_bytes: 64 << 10,
        }
    }

    /// A zero length in a durable record (one flipped bit zeroes a
    /// length of 64, 128 or 256) is damage, not the padding that follows
    /// a flush's marker: in the flush before the last one, it was taken
    /// for a torn tail (the break moved to the next block, which the last
    /// flush's marker names as durable), and both flushes' commits were
    /// silently dropped.
    #[test]
    fn a_zeroed_length_in_a_durable_flush_is_damage_not_padding() {
        let (stream, records) = three_flushes(3);
        let whole = scan(&stream, &log_control(4096)).unwrap();
        assert_eq!(whole.records, records.len() as u64);
        // The second flush's second commit record, inside its block.
        let (lsn, kind) = records[5];
        assert!(kind == Kind::Commit && lsn % 512 != 0, "{lsn} {kind:?}");
        let mut damaged = stream.clone();
        let at = (lsn - 4096) as usize;
        damaged[at + 4..at + 8].fill(0);
        match scan(&damaged, &log_control(4096)) {
            Err(Error::CorruptLog { offset, .. }) => {
                assert_eq!(offset, CONTROL_BYTES + lsn % (64 << 10))
            }
            other => panic!("{other:?}"),
        }
        // The same damage in the last flush is a torn tail: the log ends
        // at the record before it.
        let (lsn, _) = records[9];
        let mut torn = stream.clone();
        let at = (lsn - 4096) as usize;
        torn[at + 4..at + 8].fill(0);
        let s = scan(&torn, &log_control(4096)).unwrap();
        assert_eq!(s.end, lsn);
        assert_eq!(s.records, 9);
    }

    /// A damaged record at a redo LSN inside a block is damage to durable
    /// records, not a reason to start the log at the next block: the
    /// record there does not chain to anything read, and taking it
    /// skipped every record from the redo LSN to the block's end.
    #[test]
    fn a_damaged_record_at_a_redo_lsn_inside_a_block_is_damage() {
        let (stream, records) = three_flushes(3);
        let (redo, _) = records[1];
        assert!(redo % 512 != 0);
        let from = (redo - 4096) as usize;
        let whole = scan(&stream[from..], &log_control(redo)).unwrap();
        assert_eq!(whole.records, records.len() as u64 - 1);
        let mut damaged = stream[from..].to_vec();
        damaged[9] ^= 0x5a;
        match scan(&damaged, &log_control(redo)) {
            Err(Error::CorruptLog { offset, .. }) => {
                assert_eq!(offset, CONTROL_BYTES + redo % (64 << 10))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A log whose valid records end before the checkpoint record its
    /// control block names lost durable records (the block was read in
    /// place of a damaged newer one, and its log was reused or trimmed
    /// since): an error, never a shorter log.
    #[test]
    fn a_log_ending_before_its_checkpoint_record_is_corrupt() {
        let (stream, ctl) = one_record(4096);
        let s = scan(&stream, &ctl).unwrap();
        assert!(s.end > 4096 && s.records == 1);
        let (stream, ctl) = one_record(4096 + 8192);
        match scan(&stream, &ctl) {
            Err(Error::CorruptLog { what, .. }) => {
                assert!(what.contains("checkpoint record"), "{what}")
            }
            other => panic!("{other:?}"),
        }
        // The fresh log's block names no checkpoint record.
        let (stream, ctl) = one_record(0);
        assert!(scan(&stream, &ctl).is_ok());
    }

    /// A batch of commit records appended again by a recovery and spread
    /// over several logs, whose first record (flagged
    /// `FIRST_APPENDED_AGAIN`) was in a log that lost its flush while a
    /// later record of the batch survived in another log: the batch's
    /// checkpoint never finished (it waits for every log), so the whole
    /// batch is dropped and the first copies re-applied; the orphan kept
    /// re-applied an older value over a later acknowledged one (a
    /// review's finding).
    #[test]
    fn an_orphan_of_a_batch_whose_first_record_was_lost_is_dropped() {
        let w = |v: &[u8]| vec![Write::new(5, b"k".to_vec(), Some(v.to_vec()))];
        // First copies past the redo GSN (10): k=1, k=2, k=3, all
        // acknowledged. The batch: 20 (first, a copy of 10) in log 0, 21
        // (a copy of 11) in log 1, 22 (a copy of 12) in log 0, whose
        // flush was lost.
        let mut commits = vec![(10, w(b"1")), (11, w(b"2")), (12, w(b"3")), (21, w(b"2"))];
        let mut flags = BTreeMap::new();
        flags.insert(21u64, record::APPENDED_AGAIN);
        let dropped = drop_unfinished_batches(&mut commits, &flags, 10);
        let last = commits
            .last()
            .map(|c| c.1[0].value.clone().unwrap().into_owned());
        assert_eq!(dropped, 1, "the orphan was kept: {commits:?}");
        assert_eq!(last, Some(b"3".to_vec()));
    }

    /// A control block (valid checksum, forged or damaged fields) naming a
    /// redo LSN past any a log reaches is an error, not an overflow of
    /// the positions read from it (a panic in debug builds, a wrapped
    /// position in release).
    #[test]
    fn a_redo_lsn_past_any_log_is_an_error() {
        let (stream, _) = one_record(0);
        for redo in [u64::MAX / 4, u64::MAX - 4095, u64::MAX] {
            match scan(&stream, &log_control(redo)) {
                Err(Error::Log(what)) => assert!(what.contains("beyond any"), "{what}"),
                other => panic!("redo {redo}: {other:?}"),
            }
        }
        // The bound leaves every LSN a log reaches in a lifetime.
        assert!(scan(&stream, &log_control(1 << 60)).is_ok());
    }

    /// A control block (valid checksum) naming a flush block or capacity
    /// the log cannot take is refused before the stream is read, so
    /// before recovery writes any page (the log's own open refused it
    /// only after redo had written the pages; a review's finding).
    #[test]
    fn a_control_block_naming_a_log_shape_the_log_cannot_take_is_refused() {
        use crate::io::sim::{SimConfig, SimDisk};
        let log = Target::Sim(SimDisk::new(
            0,
            CONTROL_BYTES + (64 << 10),
            SimConfig::default(),
        ));
        assert!(read_stream(&log, &log_control(4096)).is_ok());
        for c in [
            Control {
                block: 8192,
                ..log_control(4096)
            },
            Control {
                capacity: (64 << 10) - 512,
                ..log_control(4096)
            },
        ] {
            match read_stream(&log, &c) {
                Err(Error::Log(what)) => assert!(what.contains("control block names"), "{what}"),
                other => panic!("{c:?}: {:?}", other.map(|s| s.len())),
            }
        }
    }
}
