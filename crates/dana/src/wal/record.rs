//! Log records: their byte layout, their checksums, and the page diffs
//! they carry.
//!
//! Owns: encoding and decoding of every record kind, the diff of a page
//! change (before image -> after image, as byte segments), and redo of a
//! page entry onto a page. Never: does I/O or touches the buffer pool.
//!
//! Every record starts with a 32-byte header and is padded to 8 bytes:
//!
//! | bytes  | field                                                     |
//! |--------|-----------------------------------------------------------|
//! | 0..4   | crc32c of bytes 4..len                                    |
//! | 4..8   | len: bytes of the record, header and padding included     |
//! | 8..16  | lsn: the record's position in the log stream               |
//! | 16     | kind ([`Kind`])                                           |
//! | 17     | flags: [`APPENDED_AGAIN`], [`FIRST_APPENDED_AGAIN`]; else zero |
//! | 18..20 | zero                                                      |
//! | 20..24 | crc32c of the previous record (the chain)                 |
//! | 24..32 | GSN: the record's global sequence number (0: none)        |
//!
//! A record is valid only where the log stream places it (its LSN) and
//! only after the record it names as previous (its chain), so a stale
//! record from an earlier lap of the log file, garbage, or records that
//! survived behind a torn write all end the log at recovery.
//!
//! The LSN places a record in its own log; the GSN orders it among the
//! records of every log of the database (one log per worker): it is the
//! value a page's header takes when the record changes the page, and the
//! order in which recovery redoes and re-applies records of all logs.

use crate::{Error, Result};
use std::borrow::Cow;

/// Bytes of a record header.
pub const HEADER: usize = 32;
/// Offset of the checksum-covered part.
const CRC_FROM: usize = 4;
/// Page header bytes that the log never carries: the checksum (set at
/// write-back) and the page LSN (set from the record's LSN at redo).
const SKIP_CRC: std::ops::Range<usize> = 0..4;
const SKIP_LSN: std::ops::Range<usize> = 8..16;
/// Two changed runs closer than this are logged as one segment (a
/// segment header costs 8 bytes).
const MERGE_GAP: usize = 16;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Changes to one or more pages, redone together or not at all.
    Pages = 1,
    /// A committed transaction's writes (logical: tree, key, value).
    Commit = 2,
    /// A checkpoint's record: the GSN bound of its full images (the
    /// control block names where redo starts).
    Checkpoint = 3,
    /// The last record of every flush: the LSN that was durable when the
    /// flush was issued. A valid marker after a break in the log proves
    /// that the bytes at the break had been durable (damage, not a torn
    /// tail).
    Flush = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Pages,
            2 => Kind::Commit,
            3 => Kind::Checkpoint,
            4 => Kind::Flush,
            _ => return None,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

/// Rounds `n` up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Builds one record: [`RecordBuilder::into_unsealed`], then [`seal`] it at its LSN.
pub struct RecordBuilder {
    buf: Vec<u8>,
}

impl RecordBuilder {
    /// A record of `kind` with an empty body.
    pub fn new(kind: Kind) -> RecordBuilder {
        let mut buf = vec![0u8; HEADER];
        buf[16] = kind as u8;
        RecordBuilder { buf }
    }

    /// Appends raw body bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// Appends a little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Appends a little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    /// Continues a record built elsewhere (handed through the buffer
    /// pool's [`crate::buffer::page_log::PageLog`] unchanged): its header
    /// must be of `kind`.
    pub fn from_raw(buf: Vec<u8>, kind: Kind) -> Result<RecordBuilder> {
        if buf.len() < HEADER || buf[16] != kind as u8 {
            return Err(Error::InvalidArgument(format!(
                "a {kind:?} record was expected, {} bytes came",
                buf.len()
            )));
        }
        Ok(RecordBuilder { buf })
    }

    /// The record as built so far (unpadded, unsealed), for
    /// [`RecordBuilder::from_raw`].
    pub fn into_raw(self) -> Vec<u8> {
        self.buf
    }

    /// Overwrites the little-endian u32 at byte `at` (a count written
    /// before its entries).
    pub fn set_u32_at(&mut self, at: usize, v: u32) {
        self.buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Drops what was built past byte `len` (a section to encode again).
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len.max(HEADER));
    }

    /// Bytes so far (header included, padding not).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True if only the header is there.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == HEADER
    }

    /// The finished record (padded length; the LSN and checksum are set
    /// by [`seal`] once the log assigns its position).
    pub fn into_unsealed(mut self) -> Vec<u8> {
        let len = pad8(self.buf.len());
        self.buf.resize(len, 0);
        let l = len as u32;
        self.buf[4..8].copy_from_slice(&l.to_le_bytes());
        self.buf
    }
}

/// Flag of a commit record (header byte 17): recovery appended it again
/// at the log end to make room (`recovery::reapply`), a copy of a commit
/// (or of the writes one has left) that an earlier record holds.
pub const APPENDED_AGAIN: u8 = 1;

/// Flag of a commit record, with [`APPENDED_AGAIN`]: the first of one
/// batch appended again. A batch stands for its first copies only once
/// the checkpoint after it moved the redo point to it; before that a
/// crash can leave a prefix of it (a torn flush), and recovery ignores the
/// batch (`recover::drop_unfinished_batches`).
pub const FIRST_APPENDED_AGAIN: u8 = 2;

/// Sets the flags (header byte 17) of an unsealed record.
pub fn set_flags(record: &mut [u8], flags: u8) {
    record[17] = flags;
}

/// Sets the GSN of an unsealed record (when it is appended).
pub fn set_gsn(record: &mut [u8], gsn: u64) {
    record[24..32].copy_from_slice(&gsn.to_le_bytes());
}

/// The GSN of a record, sealed or not.
pub fn gsn_of(record: &[u8]) -> u64 {
    u64_at(record, 24).unwrap_or(0)
}

/// Sets the LSN, the chain and the checksum of an unsealed record;
/// returns the checksum (the next record's `prev`).
pub fn seal(record: &mut [u8], lsn: u64, prev: u32) -> u32 {
    record[8..16].copy_from_slice(&lsn.to_le_bytes());
    record[20..24].copy_from_slice(&prev.to_le_bytes());
    let crc = crc32c::crc32c(&record[CRC_FROM..]);
    record[0..4].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// A record read back from the log.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Its position in the log stream.
    pub lsn: u64,
    /// Its global sequence number (0 for flush markers and checkpoints).
    pub gsn: u64,
    /// What it holds.
    pub kind: Kind,
    /// Header byte 17 ([`APPENDED_AGAIN`], [`FIRST_APPENDED_AGAIN`]).
    pub flags: u8,
    /// The body (after the header, padding included).
    pub body: &'a [u8],
    /// Total length.
    pub len: usize,
    /// Its checksum.
    pub crc: u32,
    /// The checksum of the record before it.
    pub prev: u32,
}

/// What lies at a position of the log.
#[derive(Debug)]
pub enum Parsed<'a> {
    /// A valid record.
    Record(Record<'a>),
    /// A zero length: padding up to the next block, or the end.
    Zero,
    /// Anything else (a torn or stale record, garbage): the log ends.
    Invalid,
}

/// Parses the record at the start of `bytes`, expected at stream
/// position `lsn`.
pub fn parse(bytes: &[u8], lsn: u64) -> Parsed<'_> {
    if u32_at(bytes, 4) == Some(0) {
        return Parsed::Zero;
    }
    let Some(head) = bytes.get(..HEADER) else {
        return Parsed::Invalid;
    };
    let (Some(crc), Some(len), Some(at), Some(prev), Some(gsn)) = (
        u32_at(head, 0),
        u32_at(head, 4),
        u64_at(head, 8),
        u32_at(head, 20),
        u64_at(head, 24),
    ) else {
        return Parsed::Invalid;
    };
    let len = len as usize;
    if at != lsn || len < HEADER || len % 8 != 0 || len > bytes.len() {
        return Parsed::Invalid;
    }
    if crc32c::crc32c(&bytes[CRC_FROM..len]) != crc {
        return Parsed::Invalid;
    }
    let Some(kind) = Kind::from_u8(head[16]) else {
        return Parsed::Invalid;
    };
    Parsed::Record(Record {
        lsn,
        gsn,
        kind,
        flags: head[17],
        body: &bytes[HEADER..len],
        len,
        crc,
        prev,
    })
}

// ---- page changes -------------------------------------------------------

/// Flag of a page entry: the page is zeroed before the segments are
/// applied (a full page image).
pub const FULL_IMAGE: u32 = 1;

/// Flag of a page entry: the page is a leaf cut at a key (the left half of
/// a split, whose upper half went to a new page imaged in the same
/// record). One segment at offset 0: the tree's root page id (u64), then
/// the key. Redone by the trees' code (`btree::node::cut_leaf`) on the
/// leaf as recovery finds it, never byte by byte.
pub const CUT: u32 = 2;

/// Flag of a full page image ([`FULL_IMAGE`] set too): one segment at
/// offset 0 holding the whole page as an LZ4 block (`lz4_flex`), used where
/// it is smaller than the image's segments. Redone by decompressing it to
/// exactly a page (anything else is an error), the checksum field zeroed
/// as in an image's.
pub const LZ4: u32 = 4;

/// Flag of a full page image ([`FULL_IMAGE`] set too): the page was
/// handed out new (allocated), so the bytes on the device before it are
/// no version of this page (a freed page's, trimmed zeros, a large
/// value's, which the user chose and may make look like a page with any
/// LSN). Recovery redoes it when the device's bytes carry an LSN at or
/// past the logs' end, which no version of the page can (below that, the
/// page LSN rule holds: FORMAT.md says why).
pub const FRESH: u32 = 8;

/// Plain images of at most this many bytes are logged as they are.
const MIN_COMPRESSED_IMAGE: usize = 512;

/// Changed byte ranges between `before` and `after` (same length, a
/// multiple of 8), skipping the page checksum and LSN fields, with runs
/// closer than 16 bytes merged.
pub fn diff(before: &[u8], after: &[u8]) -> Vec<(usize, usize)> {
    debug_assert_eq!(before.len(), after.len());
    runs(after.len(), |i| word(before, i) ^ word(after, i))
}

/// Non-zero byte ranges of `page` (a full image without its holes),
/// skipping the checksum and LSN fields.
pub fn image(page: &[u8]) -> Vec<(usize, usize)> {
    runs(page.len(), |i| word(page, i))
}

/// The 8 bytes of `b` from `i`, little endian (byte `i + k` is bits
/// `8k..8k + 8`).
fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// The byte ranges of `0..n` (a multiple of 8) where `delta` is nonzero
/// (`delta(i)`: one bit set per differing byte's bits in the word at `i`,
/// i a multiple of 8), outside the checksum and LSN fields, runs closer
/// than [`MERGE_GAP`] merged. Scans a word at a time: this runs on every
/// page record, over whole pages.
fn runs(n: usize, delta: impl Fn(usize) -> u64) -> Vec<(usize, usize)> {
    debug_assert_eq!(n % 8, 0, "page sizes are multiples of 8");
    debug_assert!(SKIP_CRC == (0..4) && SKIP_LSN == (8..16));
    // Word 0 holds the checksum in its low 4 bytes; word 1 is the LSN.
    let masked = |i: usize| match i {
        0 => delta(0) & !0xffff_ffff,
        8 => 0,
        _ => delta(i),
    };
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < n {
        let first = masked(i);
        if first == 0 {
            i += 8;
            continue;
        }
        let mut last_word = i;
        let mut last = first;
        let mut j = i + 8;
        while j < n {
            let d = masked(j);
            if d == 0 {
                break;
            }
            last_word = j;
            last = d;
            j += 8;
        }
        let start = i + first.trailing_zeros() as usize / 8;
        let end = last_word + 8 - last.leading_zeros() as usize / 8;
        match out.last_mut() {
            Some((s, l)) if start - (*s + *l) < MERGE_GAP => *l = end - *s,
            _ => out.push((start, end - start)),
        }
        i = j;
    }
    out
}

/// Appends one page entry (page id, flags, segments of `after`) to `b`.
pub fn put_page_entry(
    b: &mut RecordBuilder,
    pid: u64,
    flags: u32,
    after: &[u8],
    segs: &[(usize, usize)],
) {
    b.u64(pid).u32(flags).u32(segs.len() as u32);
    for &(off, len) in segs {
        b.u32(off as u32)
            .u32(len as u32)
            .bytes(&after[off..off + len]);
    }
}

/// Appends a full image of `page` (its non-zero ranges `segs`, from
/// [`image`]) to `b`: with `compress`, as one LZ4 block ([`LZ4`]) when that
/// takes fewer bytes than the segments, else as the segments; with
/// `fresh`, flagged as a page handed out new ([`FRESH`]). True if
/// compressed. Compresses straight into the record's buffer (no
/// allocation beyond the buffer's growth).
pub fn put_image_entry(
    b: &mut RecordBuilder,
    pid: u64,
    page: &[u8],
    segs: &[(usize, usize)],
    compress: bool,
    fresh: bool,
) -> bool {
    let fresh = if fresh { FRESH } else { 0 };
    let plain: usize = segs.iter().map(|&(_, len)| 8 + len).sum();
    // A small image is not worth a compressor's pass over the page.
    if compress && plain > MIN_COMPRESSED_IMAGE {
        let at = b.len();
        b.u64(pid)
            .u32(FULL_IMAGE | LZ4 | fresh)
            .u32(1)
            .u32(0)
            .u32(0);
        let data = b.len();
        b.buf.resize(
            data + lz4_flex::block::get_maximum_output_size(page.len()),
            0,
        );
        match lz4_flex::block::compress_into(page, &mut b.buf[data..]) {
            Ok(n) if 8 + n < plain => {
                b.buf.truncate(data + n);
                b.set_u32_at(data - 4, n as u32);
                return true;
            }
            _ => b.truncate(at),
        }
    }
    put_page_entry(b, pid, FULL_IMAGE | fresh, page, segs);
    false
}

/// Appends a leaf-cut entry ([`CUT`]): page `pid`, a leaf of the tree
/// rooted at `tree`, keeps its keys `<= key`, which becomes its upper fence.
pub fn put_cut_entry(b: &mut RecordBuilder, pid: u64, tree: u64, key: &[u8]) {
    b.u64(pid).u32(CUT).u32(1);
    b.u32(0).u32((8 + key.len()) as u32).u64(tree).bytes(key);
}

/// One page entry of a [`Kind::Pages`] record.
#[derive(Debug, Clone, Copy)]
pub struct PageEntry<'a> {
    /// The page.
    pub pid: u64,
    /// [`FULL_IMAGE`], [`CUT`], [`FULL_IMAGE`] with [`LZ4`], or 0.
    pub flags: u32,
    segs: &'a [u8],
    nsegs: u32,
}

impl PageEntry<'_> {
    /// True for a full page image.
    pub fn is_full(&self) -> bool {
        self.flags & FULL_IMAGE != 0
    }

    /// True for the image of a page handed out new ([`FRESH`]).
    pub fn is_fresh(&self) -> bool {
        self.flags & (FULL_IMAGE | FRESH) == FULL_IMAGE | FRESH
    }

    /// True for a compressed full image ([`LZ4`]).
    pub fn is_compressed(&self) -> bool {
        self.flags & LZ4 != 0
    }

    /// True for a leaf cut ([`CUT`]): redone through [`PageEntry::cut`],
    /// not [`PageEntry::apply`].
    pub fn is_cut(&self) -> bool {
        self.flags & CUT != 0
    }

    /// A leaf cut's tree (root page id) and key (of the record at `lsn`,
    /// for errors).
    pub fn cut(&self, lsn: u64) -> Result<(u64, &[u8])> {
        let seg = self
            .only_segment()
            .filter(|_| self.is_cut() && !self.is_full());
        match seg.map(|b| (u64_at(b, 0), b.get(8..))) {
            Some((Some(tree), Some(key))) => Ok((tree, key)),
            _ => Err(bad_log(lsn, "a leaf cut entry is malformed")),
        }
    }

    /// The bytes of this entry's one segment, at offset 0 (a leaf cut's,
    /// a compressed image's); None if it has another shape or is cut
    /// short.
    fn only_segment(&self) -> Option<&[u8]> {
        if self.nsegs != 1 || u32_at(self.segs, 0) != Some(0) {
            return None;
        }
        let len = u32_at(self.segs, 4)? as usize;
        self.segs.get(8..8 + len)
    }

    /// Redoes this entry (of the record at `lsn`, for errors) on `page`
    /// and sets its page GSN to `gsn`.
    pub fn apply(&self, page: &mut [u8], lsn: u64, gsn: u64) -> Result<()> {
        if self.is_cut() {
            return Err(bad_log(lsn, "a leaf cut is not redone byte by byte"));
        }
        if self.is_compressed() {
            let block = self
                .only_segment()
                .filter(|_| self.is_full())
                .ok_or_else(|| bad_log(lsn, "a compressed page image is malformed"))?;
            match lz4_flex::block::decompress_into(block, page) {
                Ok(n) if n == page.len() => {}
                _ => {
                    return Err(bad_log(
                        lsn,
                        "a compressed page image does not decompress to a page",
                    ))
                }
            }
            page[SKIP_CRC].fill(0);
            crate::buffer::page::set_page_lsn(page, gsn);
            return Ok(());
        }
        if self.is_full() {
            page.fill(0);
        }
        let mut at = 0;
        for _ in 0..self.nsegs {
            let (Some(off), Some(len)) = (u32_at(self.segs, at), u32_at(self.segs, at + 4)) else {
                return Err(bad_log(lsn, "page segment header cut short"));
            };
            let (off, len) = (off as usize, len as usize);
            let data = self
                .segs
                .get(at + 8..at + 8 + len)
                .ok_or_else(|| bad_log(lsn, "page segment cut short"))?;
            let dst = page
                .get_mut(off..off + len)
                .ok_or_else(|| bad_log(lsn, "page segment outside the page"))?;
            dst.copy_from_slice(data);
            at += 8 + len;
        }
        crate::buffer::page::set_page_lsn(page, gsn);
        Ok(())
    }
}

/// The error for a record that checks out but does not decode.
pub fn bad_log(lsn: u64, what: &str) -> Error {
    Error::Log(format!("record at LSN {lsn}: {what}"))
}

/// The page entries of a [`Kind::Pages`] record body.
pub fn page_entries<'a>(rec: &Record<'a>) -> Result<Vec<PageEntry<'a>>> {
    page_entries_at(rec.body, 0, rec.lsn)
}

/// The page section (a count, then entries) at byte `at` of record body
/// `b` (of the record at `lsn`, for errors).
fn page_entries_at(b: &[u8], at: usize, lsn: u64) -> Result<Vec<PageEntry<'_>>> {
    let n = u32_at(b, at).ok_or_else(|| bad_log(lsn, "no entry count"))?;
    let mut at = at + 4;
    // Never trust a count for an allocation: an entry takes 16 bytes.
    let mut out = Vec::with_capacity((n as usize).min(b.len() / 16));
    for _ in 0..n {
        let (Some(pid), Some(flags), Some(nsegs)) =
            (u64_at(b, at), u32_at(b, at + 8), u32_at(b, at + 12))
        else {
            return Err(bad_log(lsn, "page entry header cut short"));
        };
        let start = at + 16;
        let mut end = start;
        for _ in 0..nsegs {
            let len = u32_at(b, end + 4).ok_or_else(|| bad_log(lsn, "segment cut short"))?;
            end += 8 + len as usize;
        }
        if end > b.len() {
            return Err(bad_log(lsn, "page entry longer than its record"));
        }
        out.push(PageEntry {
            pid,
            flags,
            segs: &b[start..end],
            nsegs,
        });
        at = end;
    }
    Ok(out)
}

// ---- commits --------------------------------------------------------------

/// One write of a committed transaction. The value is borrowed from the
/// caller where it can be (a large value is written from the caller's
/// bytes, never copied whole), owned where it must be (a transaction's
/// write set, a recovered record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write<'a> {
    /// Root page of the tree written.
    pub tree: u64,
    /// The key.
    pub key: Vec<u8>,
    /// The new value, or `None` for a delete.
    pub value: Option<Cow<'a, [u8]>>,
    /// The value is a reference to a large value stored outside the tree
    /// (`buffer::blob::BlobRef`), not the value itself.
    pub reference: bool,
}

impl<'a> Write<'a> {
    /// A put (`Some`) or delete (`None`) of a value it owns.
    pub fn new(tree: u64, key: Vec<u8>, value: Option<Vec<u8>>) -> Write<'static> {
        Write {
            tree,
            key,
            value: value.map(Cow::Owned),
            reference: false,
        }
    }

    /// A put (`Some`) or delete (`None`) of the caller's value.
    pub fn borrowed(tree: u64, key: &[u8], value: Option<&'a [u8]>) -> Write<'a> {
        Write {
            tree,
            key: key.to_vec(),
            value: value.map(Cow::Borrowed),
            reference: false,
        }
    }
}

/// Bit 31 of a write's value length: the value is a reference.
const REFERENCE: u32 = 1 << 31;
/// The value length of a delete.
const DELETE: u32 = u32::MAX;

/// A commit record for `writes`, complete (no page changes).
pub fn commit(writes: &[Write]) -> RecordBuilder {
    let mut b = commit_head(writes);
    b.u32(0);
    b
}

/// The writes of a commit record; its page section (a count, then page
/// entries as in a Pages record) follows. Values are below 2 GiB (larger
/// ones are references); a reference's length has bit 31 set.
pub fn commit_head(writes: &[Write]) -> RecordBuilder {
    let mut b = RecordBuilder::new(Kind::Commit);
    b.u32(writes.len() as u32);
    for w in writes {
        b.u64(w.tree).u32(w.key.len() as u32);
        match &w.value {
            Some(v) => {
                debug_assert!(v.len() < REFERENCE as usize);
                b.u32(v.len() as u32 | if w.reference { REFERENCE } else { 0 })
            }
            None => b.u32(DELETE),
        };
        b.bytes(&w.key);
        if let Some(v) = &w.value {
            b.bytes(v);
        }
    }
    b
}

/// The writes of a [`Kind::Commit`] record.
pub fn commit_writes(rec: &Record<'_>) -> Result<Vec<Write<'static>>> {
    commit_parts(rec).map(|(w, _)| w)
}

/// The page entries of a [`Kind::Commit`] record (the map changes of its
/// large values).
pub fn commit_pages<'a>(rec: &Record<'a>) -> Result<Vec<PageEntry<'a>>> {
    commit_parts(rec).map(|(_, p)| p)
}

fn commit_parts<'a>(rec: &Record<'a>) -> Result<(Vec<Write<'static>>, Vec<PageEntry<'a>>)> {
    let b = rec.body;
    let n = u32_at(b, 0).ok_or_else(|| bad_log(rec.lsn, "no write count"))?;
    let mut at = 4;
    // Never trust a count for an allocation: a write takes 16 bytes.
    let mut out = Vec::with_capacity((n as usize).min(b.len() / 16));
    for _ in 0..n {
        let (Some(tree), Some(klen), Some(vlen)) =
            (u64_at(b, at), u32_at(b, at + 8), u32_at(b, at + 12))
        else {
            return Err(bad_log(rec.lsn, "write header cut short"));
        };
        at += 16;
        let key = b
            .get(at..at + klen as usize)
            .ok_or_else(|| bad_log(rec.lsn, "key cut short"))?
            .to_vec();
        at += klen as usize;
        let (value, reference) = if vlen == DELETE {
            (None, false)
        } else {
            let len = (vlen & !REFERENCE) as usize;
            let v = b
                .get(at..at + len)
                .ok_or_else(|| bad_log(rec.lsn, "value cut short"))?
                .to_vec();
            at += len;
            (Some(Cow::Owned(v)), vlen & REFERENCE != 0)
        };
        out.push(Write {
            tree,
            key,
            value,
            reference,
        });
    }
    let pages = page_entries_at(b, at, rec.lsn)?;
    Ok((out, pages))
}

/// A checkpoint record naming its full-image bound (a GSN).
pub fn checkpoint(bound: u64) -> RecordBuilder {
    let mut b = RecordBuilder::new(Kind::Checkpoint);
    b.u64(bound);
    b
}

/// Bytes of a [`Kind::Flush`] marker.
pub const FLUSH_MARKER_LEN: usize = HEADER + 8;

/// A flush marker: `durable` is the LSN durable when the flush was issued.
pub fn flush_marker(durable: u64) -> RecordBuilder {
    let mut b = RecordBuilder::new(Kind::Flush);
    b.u64(durable);
    b
}

/// The durable LSN a [`Kind::Flush`] marker names.
pub fn flush_durable(rec: &Record<'_>) -> Result<u64> {
    u64_at(rec.body, 0).ok_or_else(|| bad_log(rec.lsn, "flush marker without its LSN"))
}

/// The full-image bound of a [`Kind::Checkpoint`] record.
pub fn checkpoint_redo(rec: &Record<'_>) -> Result<u64> {
    u64_at(rec.body, 0).ok_or_else(|| bad_log(rec.lsn, "checkpoint without its bound"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(b: RecordBuilder, lsn: u64) -> Vec<u8> {
        let mut r = b.into_unsealed();
        seal(&mut r, lsn, 0);
        r
    }

    #[test]
    fn diff_then_apply_reproduces_the_page() {
        let mut before = vec![0u8; 4096];
        for (i, b) in before.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let mut after = before.clone();
        after[100..110].fill(1);
        after[118] = 9; // merged with the run above (gap < 16)
        after[4000..4096].fill(3);
        after[0] ^= 0xff; // checksum: never logged
        let segs = diff(&before, &after);
        assert_eq!(segs, vec![(100, 19), (4000, 96)]);
        let mut b = RecordBuilder::new(Kind::Pages);
        b.u32(1);
        put_page_entry(&mut b, 7, 0, &after, &segs);
        let rec = sealed(b, 4096);
        let Parsed::Record(r) = parse(&rec, 4096) else {
            panic!("record does not parse");
        };
        let e = page_entries(&r).unwrap();
        assert_eq!(e.len(), 1);
        let mut page = before.clone();
        e[0].apply(&mut page, 4096, 4096).unwrap();
        assert_eq!(page[100..], after[100..]);
        assert_eq!(crate::buffer::page::page_lsn(&page), 4096);
    }

    #[test]
    fn full_image_skips_zero_runs() {
        let mut page = vec![0u8; 4096];
        page[32..64].fill(5);
        page[3000..3100].fill(6);
        let segs = image(&page);
        assert_eq!(segs, vec![(32, 32), (3000, 100)]);
        let mut b = RecordBuilder::new(Kind::Pages);
        b.u32(1);
        put_page_entry(&mut b, 3, FULL_IMAGE, &page, &segs);
        let rec = sealed(b, 0);
        let Parsed::Record(r) = parse(&rec, 0) else {
            panic!("record does not parse");
        };
        let mut torn = vec![0xAAu8; 4096];
        page_entries(&r).unwrap()[0].apply(&mut torn, 0, 0).unwrap();
        assert_eq!(torn, page);
    }

    #[test]
    fn a_compressed_image_redoes_the_page_and_damage_is_an_error() {
        let mut page = vec![0u8; 4096];
        for (i, chunk) in page[64..2048].chunks_mut(16).enumerate() {
            chunk.fill(i as u8 | 1);
        }
        page[0..4].fill(0xEE); // a stale checksum: redone as zeros
        let segs = image(&page);
        let mut b = RecordBuilder::new(Kind::Pages);
        b.u32(1);
        assert!(put_image_entry(&mut b, 3, &page, &segs, true, false));
        let plain: usize = segs.iter().map(|&(_, l)| 8 + l).sum();
        let rec = sealed(b, 0);
        assert!(rec.len() < plain / 4, "{} bytes for {plain}", rec.len());
        let Parsed::Record(r) = parse(&rec, 0) else {
            panic!("record does not parse");
        };
        let e = page_entries(&r).unwrap();
        assert!(e[0].is_full() && e[0].is_compressed());
        let mut torn = vec![0xAAu8; 4096];
        e[0].apply(&mut torn, 0, 4096).unwrap();
        assert_eq!(torn[16..], page[16..]);
        assert_eq!(torn[..4], [0; 4]);
        assert_eq!(crate::buffer::page::page_lsn(&torn), 4096);
        // The block cut short, or decompressing to less than a page: errors.
        let short = PageEntry {
            segs: &e[0].segs[..e[0].segs.len() - 1],
            ..e[0]
        };
        assert!(short.apply(&mut torn, 0, 0).is_err());
        let mut small = RecordBuilder::new(Kind::Pages);
        small.u32(1);
        assert!(put_image_entry(
            &mut small,
            3,
            &page[..2048],
            &segs[..1],
            true,
            false
        ));
        let rec = sealed(small, 0);
        let Parsed::Record(r) = parse(&rec, 0) else {
            panic!("record does not parse");
        };
        assert!(page_entries(&r).unwrap()[0].apply(&mut torn, 0, 0).is_err());
        // Random bytes do not shrink: the plain segments are kept.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for chunk in page.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let mut b = RecordBuilder::new(Kind::Pages);
        b.u32(1);
        assert!(!put_image_entry(
            &mut b,
            3,
            &page,
            &image(&page),
            true,
            false
        ));
    }

    #[test]
    fn wrong_position_or_damage_is_invalid() {
        let w = vec![Write {
            tree: 5,
            key: b"k".to_vec(),
            value: Some(b"v".to_vec().into()),
            reference: false,
        }];
        let rec = sealed(commit(&w), 512);
        assert!(matches!(parse(&rec, 512), Parsed::Record(_)));
        assert!(matches!(parse(&rec, 0), Parsed::Invalid));
        let mut bad = rec.clone();
        bad[30] ^= 1;
        assert!(matches!(parse(&bad, 512), Parsed::Invalid));
        assert!(matches!(parse(&[0u8; 64], 0), Parsed::Zero));
        let Parsed::Record(r) = parse(&rec, 512) else {
            unreachable!()
        };
        assert_eq!(commit_writes(&r).unwrap(), w);
    }

    #[test]
    fn commit_round_trip_with_deletes() {
        let w = vec![
            Write {
                tree: 1,
                key: vec![1, 2],
                value: None,
                reference: false,
            },
            Write {
                tree: 2,
                key: vec![],
                value: Some(Vec::new().into()),
                reference: false,
            },
        ];
        let rec = sealed(commit(&w), 8);
        let Parsed::Record(r) = parse(&rec, 8) else {
            panic!()
        };
        assert_eq!(r.kind, Kind::Commit);
        assert_eq!(commit_writes(&r).unwrap(), w);
    }

    /// A reference for [`diff`]: the differing bytes, byte by byte.
    fn differing(before: &[u8], after: &[u8]) -> Vec<usize> {
        (0..after.len())
            .filter(|i| !SKIP_CRC.contains(i) && !SKIP_LSN.contains(i))
            .filter(|&i| before[i] != after[i])
            .collect()
    }

    proptest::proptest! {
        /// The word-at-a-time scan against a byte-by-byte model: segments
        /// in order, apart by at least MERGE_GAP, each starting and ending
        /// on a differing byte, covering every differing byte and never the
        /// checksum (a merged run may span the LSN field: redo sets the
        /// LSN after copying).
        #[test]
        fn diff_matches_a_byte_by_byte_model(
            seed in proptest::collection::vec(proptest::num::u8::ANY, 512),
            changes in proptest::collection::vec((0usize..512, 1usize..40, proptest::num::u8::ANY), 0..12),
        ) {
            let before = seed;
            let mut after = before.clone();
            for (at, len, v) in changes {
                let end = (at + len).min(after.len());
                after[at..end].fill(v);
            }
            let segs = diff(&before, &after);
            let want = differing(&before, &after);
            let mut covered = Vec::new();
            let mut prev_end: Option<usize> = None;
            for &(off, len) in &segs {
                proptest::prop_assert!(len > 0);
                if let Some(p) = prev_end {
                    proptest::prop_assert!(off >= p + MERGE_GAP, "{segs:?}");
                }
                proptest::prop_assert!(before[off] != after[off]);
                proptest::prop_assert!(before[off + len - 1] != after[off + len - 1]);
                for i in off..off + len {
                    proptest::prop_assert!(!SKIP_CRC.contains(&i));
                    if before[i] != after[i] && !SKIP_LSN.contains(&i) {
                        covered.push(i);
                    }
                }
                prev_end = Some(off + len);
            }
            proptest::prop_assert_eq!(covered, want);
            // An image is a diff against zeros.
            proptest::prop_assert_eq!(image(&after), diff(&vec![0u8; 512], &after));
        }
    }
}
