//! The log's control blocks: where the last completed checkpoint is.
//!
//! Owns: the layout of the two control blocks at the start of the log file
//! and the choice between them. A checkpoint writes the block its sequence
//! number selects (`seq % 2`) and syncs it; the other block still holds the
//! previous checkpoint, so a torn control write loses nothing. Recovery
//! takes the valid block with the higher sequence number.
//!
//! | bytes  | field                                          |
//! |--------|------------------------------------------------|
//! | 0..8   | magic `DANAWAL1`                               |
//! | 8..12  | format version (4)                             |
//! | 12..16 | flush block (bytes)                            |
//! | 16..24 | sequence number                                |
//! | 24..32 | LSN of the checkpoint record                   |
//! | 32..40 | redo LSN: recovery starts here                 |
//! | 40..48 | capacity: bytes of the circular record stream  |
//! | 48..56 | log identity (also in the database's meta page)|
//! | 56..64 | next GSN when the checkpoint began (at least)  |
//! | 64..68 | this log's index among the database's logs     |
//! | 68..72 | number of logs of the database                 |
//! | 72..80 | redo GSN: commits from it on are re-applied    |
//! | 80..88 | stream bytes the file held, durable (0: not recorded) |
//! | 88..92 | crc32c of bytes 0..88                          |
//!
//! A growing log's file also writes a block, after each growth and before
//! any flush writes into the new range, so that the size the file held
//! durably is on record before records lie past the old one (a file cut
//! back to it would otherwise lose them without a word). Such a block
//! repeats the last block's checkpoint. Both writers go through one
//! [`Writer`], one at a time: each writes the slot its sequence number
//! selects, so the other slot always holds the block before it.
//!
//! Never: trusts a block whose checksum or magic does not match; writes a
//! block while another write of one is in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::sched::WakerList;
use crate::{Error, Result};

/// Bytes reserved for each control block (and the largest flush block).
pub const BLOCK: u64 = 4096;
const MAGIC: &[u8; 8] = b"DANAWAL1";
const VERSION: u32 = 4;
const LEN: usize = 92;
const CRC_AT: usize = 88;

/// One control block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// Sequence number (the higher valid one wins).
    pub seq: u64,
    /// LSN of the checkpoint record.
    pub checkpoint: u64,
    /// Where redo starts.
    pub redo: u64,
    /// Bytes of the circular record stream.
    pub capacity: u64,
    /// Flush block size.
    pub block: u64,
    /// The log's identity, the same in the database's meta page.
    pub log_id: u64,
    /// A GSN no record or page of the database had when the checkpoint
    /// began (recovery's GSNs start at least here).
    pub next_gsn: u64,
    /// This log's index among the database's logs.
    pub index: u32,
    /// Number of logs of the database.
    pub count: u32,
    /// The checkpoint's redo GSN: recovery re-applies the commits from it
    /// on (of every log: the newest such GSN among the logs' control
    /// blocks, since the checkpoint's pages were synced before any
    /// control block was written).
    pub redo_gsn: u64,
    /// Stream bytes the log file held, zero-filled and durable, when the
    /// block was written (0: not recorded). A growing log's file never
    /// shrinks, so a file holding less was cut short, and the records
    /// past its end are lost (version 4; a cut on a whole MiB was
    /// undetected before).
    pub stream_bytes: u64,
}

impl Control {
    /// The block's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.block as u32).to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.checkpoint.to_le_bytes());
        b.extend_from_slice(&self.redo.to_le_bytes());
        b.extend_from_slice(&self.capacity.to_le_bytes());
        b.extend_from_slice(&self.log_id.to_le_bytes());
        b.extend_from_slice(&self.next_gsn.to_le_bytes());
        b.extend_from_slice(&self.index.to_le_bytes());
        b.extend_from_slice(&self.count.to_le_bytes());
        b.extend_from_slice(&self.redo_gsn.to_le_bytes());
        b.extend_from_slice(&self.stream_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a block; `None` if it is not a valid control block.
    pub fn decode(b: &[u8]) -> Option<Control> {
        let b = b.get(..LEN)?;
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
        if &b[..8] != MAGIC
            || u32_at(8) != VERSION
            || crc32c::crc32c(&b[..CRC_AT]) != u32_at(CRC_AT)
        {
            return None;
        }
        Some(Control {
            block: u32_at(12) as u64,
            seq: u64_at(16),
            checkpoint: u64_at(24),
            redo: u64_at(32),
            capacity: u64_at(40),
            log_id: u64_at(48),
            next_gsn: u64_at(56),
            index: u32_at(64),
            count: u32_at(68),
            redo_gsn: u64_at(72),
            stream_bytes: u64_at(80),
        })
    }

    /// Where this block goes in the log file: the slot its sequence
    /// number selects.
    pub fn offset(&self) -> u64 {
        (self.seq % 2) * BLOCK
    }

    /// The newer of the two blocks at the start of the log file.
    pub fn newest(area: &[u8]) -> Option<Control> {
        let a = area.get(..BLOCK as usize).and_then(Control::decode);
        let b = area
            .get(BLOCK as usize..2 * BLOCK as usize)
            .and_then(Control::decode);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.seq >= b.seq { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

/// Who writes the next control block, and the last one written.
///
/// A checkpoint's finish (a task on a worker) and a growth of the log file
/// (its own thread) both write control blocks; they take turns here. A
/// block is written with the sequence number after the last one's, into
/// the slot that number selects, and recorded as the last once it is
/// durable.
pub struct Writer {
    last: Mutex<Control>,
    busy: AtomicBool,
    /// The log stopped (a failed write or sync): no block is written
    /// after it.
    stopped: AtomicBool,
    /// Bumped at each release (what a waiting task watches).
    released: AtomicU64,
    waiters: WakerList,
}

/// The right to write the next control block (released on drop).
pub struct Turn<'a>(&'a Writer);

impl Writer {
    /// A writer whose last durable block is `last`.
    pub fn new(last: Control) -> Writer {
        Writer {
            last: Mutex::new(last),
            busy: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            released: AtomicU64::new(0),
            waiters: WakerList::default(),
        }
    }

    fn try_take(&self) -> Option<Turn<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            // Lazily: a `Turn` made and dropped for a failed attempt
            // would release the holder's turn (`then_some` did, and a
            // growth's block and a checkpoint's were written at once).
            .then(|| Turn(self))
    }

    /// The log stopped: every later turn says so ([`Turn::stopped`]).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Waits (a task: it parks, never blocks its worker) for the turn.
    pub async fn turn(&self) -> Turn<'_> {
        loop {
            let seen = self.released.load(Ordering::SeqCst);
            if let Some(t) = self.try_take() {
                return t;
            }
            self.waiters.until_changed(&self.released, seen).await;
        }
    }

    /// Waits (a thread: it sleeps) for the turn, at most `limit`.
    pub fn turn_blocking(&self, limit: Duration) -> Result<Turn<'_>> {
        let start = Instant::now();
        loop {
            if let Some(t) = self.try_take() {
                return Ok(t);
            }
            if start.elapsed() > limit {
                return Err(Error::Log(format!(
                    "a control block write waited {limit:?} for the one before it"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Turn<'_> {
    fn last_lock(&self) -> MutexGuard<'_, Control> {
        self.0.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True once the log stopped: the turn's holder writes nothing.
    pub fn stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// The last block written, durable.
    pub fn last(&self) -> Control {
        *self.last_lock()
    }

    /// Records `block`, written and synced, as the last one.
    pub fn written(&self, block: Control) {
        debug_assert_eq!(block.seq, self.last().seq + 1);
        *self.last_lock() = block;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
        self.0.released.fetch_add(1, Ordering::SeqCst);
        self.0.waiters.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One turn at a time: an attempt while it is held fails and leaves
    /// it held; its release lets the next one in.
    #[test]
    fn a_failed_attempt_leaves_the_turn_held() {
        let w = Writer::new(Control {
            seq: 1,
            checkpoint: 0,
            redo: 4096,
            capacity: 1 << 20,
            block: 512,
            log_id: 1,
            next_gsn: 1,
            index: 0,
            count: 1,
            redo_gsn: 0,
            stream_bytes: 1 << 20,
        });
        let held = w.try_take().expect("a free turn");
        assert!(w.try_take().is_none());
        assert!(w.try_take().is_none(), "a failed attempt released the turn");
        assert!(w.turn_blocking(Duration::from_millis(5)).is_err());
        drop(held);
        assert!(w.try_take().is_some());
    }

    #[test]
    fn newest_valid_block_wins() {
        let c = |seq| Control {
            seq,
            checkpoint: seq * 10,
            redo: seq * 5,
            capacity: 1 << 20,
            block: 512,
            log_id: 7,
            next_gsn: seq * 3,
            index: 1,
            count: 2,
            redo_gsn: seq * 2,
            stream_bytes: seq << 20,
        };
        let mut area = vec![0u8; 2 * BLOCK as usize];
        area[..LEN].copy_from_slice(&c(4).encode());
        area[BLOCK as usize..BLOCK as usize + LEN].copy_from_slice(&c(5).encode());
        assert_eq!(Control::newest(&area), Some(c(5)));
        // A torn write of the newer block: the older one is used.
        area[BLOCK as usize + 20] ^= 0xff;
        assert_eq!(Control::newest(&area), Some(c(4)));
        assert_eq!(Control::newest(&[0u8; 8192]), None);
    }
}
