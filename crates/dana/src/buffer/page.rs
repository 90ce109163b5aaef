//! The header every page starts with, and its checksum.
//!
//! | bytes  | field                                             |
//! |--------|---------------------------------------------------|
//! | 0..4   | crc32c of bytes 4..page_size (little endian)      |
//! | 4..6   | page type ([`PageType`])                          |
//! | 6      | flags: bit 0 [`UNLOGGED`]                         |
//! | 7      | reserved (zero)                                   |
//! | 8..16  | page LSN: log position of the last change         |
//! | 16..24 | page id (detects misdirected or lost writes)      |
//! | 24..32 | written at: the write clock when this version was written back (0: never); a placement hint, see `policy::HeatSplit` |
//!
//! The checksum is set when the buffer manager writes the page back and
//! verified when it reads the page; a mismatch is an error naming the page.
//! Never: trusts a page whose checksum or page id does not match.

use crate::{Error, Result};

/// Bytes of the header at the start of every page.
pub const PAGE_HEADER_SIZE: usize = 32;

/// What a page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum PageType {
    /// Not a valid page type (a zeroed page).
    Invalid = 0,
    /// The database's meta page (page 0).
    Meta = 1,
    /// A freed page (its bit in the free-space map is clear).
    Free = 2,
    /// A B+tree leaf.
    Leaf = 3,
    /// A B+tree inner node.
    Inner = 4,
    /// Raw page used by benchmarks and tests.
    Raw = 5,
    /// A free-space map page (`space_map.rs`).
    SpaceMap = 6,
}

impl PageType {
    /// Decodes a page type.
    pub fn from_u16(v: u16) -> Option<PageType> {
        Some(match v {
            0 => PageType::Invalid,
            1 => PageType::Meta,
            2 => PageType::Free,
            3 => PageType::Leaf,
            4 => PageType::Inner,
            5 => PageType::Raw,
            6 => PageType::SpaceMap,
            _ => return None,
        })
    }
}

fn u64_at(page: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&page[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The page type field.
pub fn page_type(page: &[u8]) -> Option<PageType> {
    let t = page.get(4..6)?;
    PageType::from_u16(u16::from_le_bytes([t[0], t[1]]))
}

/// Sets the page type field.
pub fn set_page_type(page: &mut [u8], t: PageType) {
    page[4..6].copy_from_slice(&(t as u16).to_le_bytes());
}

/// The page LSN field.
pub fn page_lsn(page: &[u8]) -> u64 {
    u64_at(page, 8)
}

/// Sets the page LSN field.
pub fn set_page_lsn(page: &mut [u8], lsn: u64) {
    page[8..16].copy_from_slice(&lsn.to_le_bytes());
}

/// Flag bit: the page has changes since its last page record that no page
/// record holds (a leaf changed by commits' applies, whose commit records
/// redo them: see `buffer/page_log.rs`). A later physical change of such a
/// page must be logged as a full image, since a difference would not
/// compose with its last record at redo. Kept in the page so that it
/// survives eviction.
pub const UNLOGGED: u8 = 1;

/// True if the page has changes that no page record holds ([`UNLOGGED`]).
pub fn unlogged(page: &[u8]) -> bool {
    page[6] & UNLOGGED != 0
}

/// Sets or clears [`UNLOGGED`].
pub fn set_unlogged(page: &mut [u8], on: bool) {
    if on {
        page[6] |= UNLOGGED;
    } else {
        page[6] &= !UNLOGGED;
    }
}

/// The page id field.
pub fn page_id(page: &[u8]) -> u64 {
    u64_at(page, 16)
}

/// The write clock when this version of the page was written back (0:
/// never, or by a version of dana before the field). A hint for placement
/// only: nothing that must be right depends on it.
pub fn written_at(page: &[u8]) -> u64 {
    u64_at(page, 24)
}

/// Sets the written-at field (just before [`seal`], at write-back).
pub fn set_written_at(page: &mut [u8], clock: u64) {
    page[24..32].copy_from_slice(&clock.to_le_bytes());
}

/// Zeroes a page and writes a fresh header.
pub fn init_page(page: &mut [u8], pid: u64, t: PageType) {
    page.fill(0);
    set_page_type(page, t);
    page[16..24].copy_from_slice(&pid.to_le_bytes());
}

/// Computes and stores the checksum (just before a write).
pub fn seal(page: &mut [u8]) {
    let crc = crc32c::crc32c(&page[4..]);
    page[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Verifies checksum and page id of a page just read from storage.
pub fn verify(page: &[u8], pid: u64) -> Result<()> {
    if page.len() < PAGE_HEADER_SIZE {
        return Err(Error::Corrupt {
            page: pid,
            what: format!("{} bytes, shorter than a page header", page.len()),
        });
    }
    let stored = u32::from_le_bytes([page[0], page[1], page[2], page[3]]);
    let actual = crc32c::crc32c(&page[4..]);
    if stored != actual {
        let what = if page.iter().all(|&b| b == 0) {
            "page is all zeros (never written, or not a dana database)".to_string()
        } else {
            format!("checksum mismatch: stored {stored:#010x}, computed {actual:#010x}")
        };
        return Err(Error::Corrupt { page: pid, what });
    }
    let found = page_id(page);
    if found != pid {
        return Err(Error::Corrupt {
            page: pid,
            what: format!("page holds page id {found} (misdirected write)"),
        });
    }
    if page_type(page).is_none() {
        return Err(Error::Corrupt {
            page: pid,
            what: "unknown page type".into(),
        });
    }
    Ok(())
}

/// The check a mirrored data device applies to the pages it reads (the
/// I/O layer knows no page format): a valid page, with its id where the
/// block lies, ranks by its LSN.
pub struct MirrorPageCheck {
    /// Data devices of the array.
    pub width: u64,
    /// This device's index among them.
    pub device: u64,
    /// Page size.
    pub page_size: usize,
}

impl crate::io::mirror::PageCheck for MirrorPageCheck {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn check(&self, offset: u64, bytes: &[u8]) -> Option<u64> {
        let pid = (offset / self.page_size as u64) * self.width + self.device;
        verify(bytes, pid).ok().map(|()| page_lsn(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_then_verify() {
        let mut p = vec![0u8; 4096];
        init_page(&mut p, 42, PageType::Raw);
        p[100] = 7;
        seal(&mut p);
        verify(&p, 42).unwrap();
        assert!(matches!(
            verify(&p, 43),
            Err(Error::Corrupt { page: 43, .. })
        ));
        p[200] ^= 1;
        let e = verify(&p, 42).unwrap_err();
        assert!(e.to_string().contains("page 42"), "{e}");
        assert!(verify(&[0u8; 4096], 5)
            .unwrap_err()
            .to_string()
            .contains("all zeros"));
    }
}
