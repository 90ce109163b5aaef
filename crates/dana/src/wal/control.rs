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
//! | 8..12  | format version (3)                             |
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
//! Never: trusts a block whose checksum or magic does not match.

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

#[cfg(test)]
mod tests {
    use super::*;

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
