//! Recovery, part one: read the log, find its true end, and redo page
//! changes onto the devices, before the buffer pool opens.
//!
//! Owns: the scan of the log from the last checkpoint's redo LSN (records
//! valid only at their LSN and in their chain), the redo of every page
//! entry newer than the page (page LSN), and the repair of pages that fail
//! their checksum from the first full page image logged after the redo
//! LSN. It returns the commit records found, which `db` re-applies through
//! the trees once they are open (part two: a commit's record precedes its
//! page changes, so a commit whose changes were cut short by the crash is
//! completed; uncommitted work never reached the log).
//!
//! Synchronous and single-threaded: it runs before the workers start.
//! Never: writes a page it could not make whole, or guesses past a break
//! in the log.

use std::collections::BTreeMap;

use super::control::{self, Control};
use super::record::{self, Kind, Parsed, Write};
use super::{Resume, CONTROL_BYTES};
use crate::buffer::page;
use crate::io::{
    open_queue, AlignedBuf, Array, Backend, Completion, IoBuf, IoQueue, Request, Target,
};
use crate::{Error, Result};

/// What recovery found and did.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Where the log resumes.
    pub resume: Option<Resume>,
    /// Records scanned from the redo LSN.
    pub records: u64,
    /// Redo LSN used.
    pub redo: u64,
    /// End of the valid log.
    pub end: u64,
    /// Pages changed by redo.
    pub pages_redone: u64,
    /// Pages rebuilt from a full image because they failed their checksum.
    pub pages_repaired: u64,
    /// Page entries skipped because the page already had them.
    pub entries_skipped: u64,
    /// Committed writes to re-apply, in log order.
    pub commits: Vec<(u64, Vec<Write>)>,
}

/// One synchronous request on a queue.
pub fn sync_io(q: &mut dyn IoQueue, req: Request) -> Result<Completion> {
    q.push(req).map_err(|r| r.error)?;
    q.submit()?;
    let mut out = Vec::new();
    loop {
        q.reap(&mut out);
        if let Some(c) = out.pop() {
            return Ok(c);
        }
        q.wait(1, None)?;
    }
}

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

fn write_at(q: &mut dyn IoQueue, offset: u64, data: &[u8]) -> Result<()> {
    let mut buf = AlignedBuf::new(data.len(), control::BLOCK as usize)?;
    buf[..data.len()].copy_from_slice(data);
    sync_io(q, Request::write(0, offset, IoBuf::owned(buf)))?.result?;
    Ok(())
}

fn sync(q: &mut dyn IoQueue) -> Result<()> {
    sync_io(q, Request::flush(0))?.result.map(|_| ())
}

/// Formats a fresh log on `log`: both control blocks name an empty log
/// whose first record will be at LSN `block`.
pub fn format(log: &Target, capacity: u64, block: u64) -> Result<Resume> {
    if log.size() < CONTROL_BYTES + capacity {
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
    };
    let mut area = vec![0u8; CONTROL_BYTES as usize];
    area[..c.encode().len()].copy_from_slice(&c.encode());
    let c0 = Control { seq: 0, ..c };
    let at = control::BLOCK as usize;
    area[at..at + c0.encode().len()].copy_from_slice(&c0.encode());
    write_at(q.as_mut(), 0, &area)?;
    // Zero the block where the first record goes (a recycled file may hold
    // records of an earlier database there).
    let first = CONTROL_BYTES + start % capacity;
    write_at(q.as_mut(), first, &vec![0u8; control::BLOCK as usize])?;
    sync(q.as_mut())?;
    Ok(Resume {
        end: start,
        last_crc: 0,
        redo: start,
        control_seq: 1,
        capacity,
    })
}

/// Reads the log's control block; `None` if the log was never formatted.
pub fn read_control(log: &Target) -> Result<Option<Control>> {
    if log.size() < CONTROL_BYTES {
        return Ok(None);
    }
    let mut q = open_queue(log, &Backend::Blocking, 4)?;
    let area = read_at(q.as_mut(), 0, CONTROL_BYTES as usize)?;
    Ok(Control::newest(&area))
}

/// Scans the log and redoes page changes onto `array`'s devices, then
/// syncs them. Returns the commits to re-apply and where the log resumes.
pub fn recover(array: &Array, log: &Target, ctl: Control) -> Result<Recovered> {
    let cap = ctl.capacity;
    if cap == 0 || log.size() < CONTROL_BYTES + cap || !ctl.block.is_power_of_two() {
        return Err(Error::Log(format!(
            "control block names a log of {cap} bytes (block {}) on a device of {} bytes",
            ctl.block,
            log.size()
        )));
    }
    let mut lq = open_queue(log, &Backend::Blocking, 4)?;
    // The stream, rotated so that index 0 is the redo LSN.
    let mut area = Vec::with_capacity(cap as usize);
    let chunk = 1u64 << 20;
    let mut at = 0;
    while at < cap {
        let n = chunk.min(cap - at);
        area.extend_from_slice(&read_at(lq.as_mut(), CONTROL_BYTES + at, n as usize)?);
        at += n;
    }
    area.rotate_left((ctl.redo % cap) as usize);
    let stream = area;

    let mut out = Recovered {
        redo: ctl.redo,
        ..Default::default()
    };
    // (lsn, record offset in stream) of every Pages record.
    let mut page_records = Vec::new();
    let mut pos = ctl.redo;
    let mut valid_end = pos;
    let mut last: Option<u32> = None;
    while pos - ctl.redo < cap {
        let off = (pos - ctl.redo) as usize;
        match record::parse(&stream[off..], pos) {
            Parsed::Record(r) if last.is_none_or(|c| c == r.prev) => {
                out.records += 1;
                match r.kind {
                    Kind::Pages => page_records.push((pos, off)),
                    Kind::Commit => out.commits.push((pos, record::commit_writes(&r)?)),
                    Kind::Checkpoint => {}
                }
                last = Some(r.crc);
                pos += r.len as u64;
                valid_end = pos;
            }
            // Padding to the end of a block, or a break inside one: the
            // log may go on at the next block, chained to the last record.
            _ if pos % ctl.block != 0 => pos = pos.div_ceil(ctl.block) * ctl.block,
            _ => break,
        }
    }
    out.end = valid_end;

    // Page entries by page, in log order.
    let mut by_page: BTreeMap<u64, Vec<(u64, record::PageEntry<'_>)>> = BTreeMap::new();
    for &(lsn, off) in &page_records {
        let Parsed::Record(r) = record::parse(&stream[off..], lsn) else {
            return Err(Error::Log(format!(
                "record at LSN {lsn} changed under recovery"
            )));
        };
        for e in record::page_entries(&r)? {
            if e.pid >= array.pages() {
                return Err(Error::Log(format!(
                    "record at LSN {lsn} changes page {}, beyond the array's {} pages",
                    e.pid,
                    array.pages()
                )));
            }
            by_page.entry(e.pid).or_default().push((lsn, e));
        }
    }

    let mut queues = array
        .targets()
        .iter()
        .map(|t| open_queue(t, &Backend::Blocking, 4))
        .collect::<Result<Vec<_>>>()?;
    let ps = array.page_size() as usize;
    for (pid, entries) in by_page {
        let (dev, offset) = array.locate(pid);
        let q = queues[dev].as_mut();
        let mut bytes = read_at(q, offset, ps)?;
        let intact = page::verify(&bytes, pid).is_ok();
        let mut lsn_now = if intact {
            Some(page::page_lsn(&bytes))
        } else {
            None
        };
        let mut changed = false;
        for (lsn, e) in entries {
            match lsn_now {
                Some(l) if lsn <= l => out.entries_skipped += 1,
                None if !e.is_full() => out.entries_skipped += 1,
                _ => {
                    if lsn_now.is_none() {
                        out.pages_repaired += 1;
                    }
                    e.apply(&mut bytes, lsn)?;
                    lsn_now = Some(lsn);
                    changed = true;
                }
            }
        }
        if lsn_now.is_none() {
            return Err(Error::Corrupt {
                page: pid,
                what: "the page is damaged (torn write?) and the log holds no full image of it \
                       after the last checkpoint"
                    .into(),
            });
        }
        if changed {
            page::seal(&mut bytes);
            write_at(q, offset, &bytes)?;
            out.pages_redone += 1;
        }
    }
    for q in &mut queues {
        sync(q.as_mut())?;
    }
    let block = ctl.block;
    let end = valid_end.div_ceil(block) * block;
    out.resume = Some(Resume {
        end,
        last_crc: last.unwrap_or(0),
        redo: ctl.redo,
        control_seq: ctl.seq,
        capacity: cap,
    });
    Ok(out)
}
