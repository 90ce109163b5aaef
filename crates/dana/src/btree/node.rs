//! B+tree node format: one node in the bytes of one page.
//!
//! # What it owns
//! The node region of a page, `page[PAGE_HEADER_SIZE..]`. The first
//! [`PAGE_HEADER_SIZE`] bytes (checksum, page type, LSN, page id) belong to
//! the buffer manager: this module never reads or writes them. Every
//! function takes the *whole page* (`&[u8]` / `&mut [u8]` of the page
//! length, a power of two from 4 KiB to 64 KiB) and works on its tail.
//!
//! # Byte layout
//! Offsets are relative to the start of the node region (page byte 32);
//! the region is at most 65504 bytes so every offset fits a `u16`.
//! Integers are little-endian, except the key head (see below).
//!
//! | node offset | size | field |
//! |---|---|---|
//! | 0 | 1 | flags: bit 0 leaf, bit 1 lower fence is -inf, bit 2 upper fence is +inf, bit 3 last insert appended at the end (split hint) |
//! | 1 | 1 | format version, [`FORMAT_VERSION`] |
//! | 2 | 2 | slot count `n` |
//! | 4 | 2 | heap start: lowest heap byte in use (region length when empty) |
//! | 6 | 2 | heap bytes in use by live fences, keys and payloads |
//! | 8 | 2 | lower fence offset |
//! | 10 | 2 | lower fence length |
//! | 12 | 2 | upper fence offset |
//! | 14 | 2 | upper fence length |
//! | 16 | 2 | prefix length `p` |
//! | 18 | 6 | reserved, zero |
//! | 24 | 8 | inner nodes: `upper`, the rightmost child's page id; leaves: 0 |
//! | 32 | 10·n | slot array, growing up |
//! | .. | .. | free space |
//! | heap start | .. | heap: fences, key suffixes and payloads, growing down from the region's end |
//!
//! A slot is 10 bytes:
//!
//! | slot offset | size | field |
//! |---|---|---|
//! | 0 | 2 | offset of the entry in the heap (key suffix, then payload) |
//! | 2 | 2 | key suffix length |
//! | 4 | 2 | payload length; bit 15 set: the payload is a reference to a large value stored outside the tree (leaves only) |
//! | 6 | 4 | key head: the first 4 bytes of the key suffix, zero-padded; read as a big-endian `u32` so integer order is byte order |
//!
//! # Semantics
//! - A node covers the keys in `(lower, upper]`; `lower = -inf` for the
//!   leftmost node, `upper = +inf` for the rightmost. The empty key is the
//!   smallest key, so only a node with `lower = -inf` can hold it.
//! - **Prefix truncation**: when both fences are finite, every key in the
//!   node starts with their common prefix (of length `p`). It is stored once
//!   (as the start of the lower fence) and slots store only key suffixes.
//!   With an infinite fence `p = 0`.
//! - Leaves map keys to payloads. Inner nodes map separators to children:
//!   the payload of slot `i` is an 8-byte child page id covering
//!   `(key[i-1], key[i]]`, and `upper` covers `(key[n-1], upper fence]`.
//!
//! # Invariants (checked by [`check`], `debug_assert!`ed on the write path)
//! - `32 + 10·n <= heap start <= region length`; heap bytes in use
//!   `<= region length - heap start`; entries and fences lie in
//!   `[heap start, region length)` and do not overlap; their sizes add up
//!   to the heap bytes in use. An entry of no bytes (the empty key with
//!   an empty value) takes no heap space: it is written at the region's
//!   end, and any offset inside the node is accepted for it (a proptest
//!   case found the first version leaving one at the old heap start,
//!   below the heap, after the entry under it was removed).
//! - Keys are strictly ascending and lie in `(lower, upper]`; each key
//!   head matches its key.
//! - `p` is the common prefix length of the fences (0 if one is infinite).
//! - Only leaf entries carry the reference mark (bit 15).
//! - Inner payloads are exactly 8 bytes; keys are at most
//!   [`max_key_len`], leaf payloads at most [`max_payload_len`].
//!
//! # What it must never do
//! - Touch the page header (`page[..PAGE_HEADER_SIZE]`).
//! - Panic on a corrupted page: [`Node::new`] validates the header in
//!   O(1), accessors bounds-check with `get`, and [`check`] validates
//!   everything and reports [`Corrupt`] instead of indexing blindly. The
//!   write path ([`NodeMut`]) trusts a page that passed [`check`] or was
//!   built by this module: the tree checks each page it latches to change
//!   once per arrival in its frame (`btree::tree::checked`); [`split`],
//!   [`split_at`], [`merge`] and [`cut_leaf`] check their inputs
//!   themselves (they run on copies and at recovery).
//! - Panic when full: inserts return [`Full`] and the tree splits.
//!
//! # Costs
//! Lookups, inserts, removes and in-place updates do not allocate.
//! [`NodeMut::compact`] copies the region into a temporary `Vec`; split and
//! merge allocate the separator and a few small vectors. Fences are stored
//! in full (the prefix is their common start), so a node spends at most
//! two keys on them.
//!
//! # Size limits
//! [`max_key_len`] and [`max_payload_len`] are chosen so that a node with
//! both fences at the maximum key length still holds two entries of
//! maximum size. Hence splitting a node until the target holds at most one
//! entry always makes room for an insert: the tree can always make progress.

use std::cmp::Ordering;
use std::fmt;
use std::ops::Bound;

/// Bytes at the start of every page owned by the buffer manager. The node
/// never reads or writes them.
pub const PAGE_HEADER_SIZE: usize = 32;
/// Size of the node header at the start of the node region.
pub const NODE_HEADER_SIZE: usize = 32;
/// Size of one slot in the slot array.
pub const SLOT_SIZE: usize = 10;
/// Size of an inner node's payload: a child page id.
pub const CHILD_ID_SIZE: usize = 8;
/// Smallest page size a node can live in.
pub const MIN_PAGE_SIZE: usize = 4096;
/// Largest page size a node can live in.
pub const MAX_PAGE_SIZE: usize = 65536;
/// Node format version stored in every node header.
pub const FORMAT_VERSION: u8 = 1;

const F_LEAF: u8 = 1;
const F_LOWER_INF: u8 = 2;
const F_UPPER_INF: u8 = 4;
const F_LAST_APPEND: u8 = 8;
const F_KNOWN: u8 = F_LEAF | F_LOWER_INF | F_UPPER_INF | F_LAST_APPEND;

const H_FLAGS: usize = 0;
const H_VERSION: usize = 1;
const H_COUNT: usize = 2;
const H_HEAP: usize = 4;
const H_USED: usize = 6;
const H_LOWER_OFF: usize = 8;
const H_LOWER_LEN: usize = 10;
const H_UPPER_OFF: usize = 12;
const H_UPPER_LEN: usize = 14;
const H_PREFIX: usize = 16;
const H_RESERVED: usize = 18;
const H_UPPER_CHILD: usize = 24;

const S_OFF: usize = 0;
const S_KEY_LEN: usize = 2;
const S_PAYLOAD_LEN: usize = 4;
const S_HEAD: usize = 6;
/// Bit 15 of a leaf slot's payload length: the payload is a reference to
/// a large value stored outside the tree (`buffer/blob.rs`), not the
/// value. Payloads are at most a quarter page (16 KiB at 64 KiB pages), so
/// the bit is never part of a length.
const REF_FLAG: usize = 0x8000;
const _: () = assert!(max_payload_len(MAX_PAGE_SIZE) < REF_FLAG);

const _: () = assert!(H_UPPER_CHILD + 8 == NODE_HEADER_SIZE);
const _: () = assert!(S_HEAD + 4 == SLOT_SIZE);
const _: () = assert!(MAX_PAGE_SIZE - PAGE_HEADER_SIZE <= u16::MAX as usize);
const _: () = assert!(
    4 * max_key_len(MIN_PAGE_SIZE) + 2 * max_payload_len(MIN_PAGE_SIZE) + 2 * SLOT_SIZE
        <= node_capacity(MIN_PAGE_SIZE)
);
const _: () = assert!(
    4 * max_key_len(MAX_PAGE_SIZE) + 2 * max_payload_len(MAX_PAGE_SIZE) + 2 * SLOT_SIZE
        <= node_capacity(MAX_PAGE_SIZE)
);
const _: () = assert!(max_payload_len(MIN_PAGE_SIZE) >= CHILD_ID_SIZE);

/// Whether `page_size` is a page size a node can live in: a power of two
/// from [`MIN_PAGE_SIZE`] to [`MAX_PAGE_SIZE`].
pub const fn is_valid_page_size(page_size: usize) -> bool {
    page_size.is_power_of_two() && page_size >= MIN_PAGE_SIZE && page_size <= MAX_PAGE_SIZE
}

/// Bytes available for slots and heap in a node of a page of `page_size`
/// bytes (the node region minus the node header).
pub const fn node_capacity(page_size: usize) -> usize {
    page_size - PAGE_HEADER_SIZE - NODE_HEADER_SIZE
}

/// Largest payload a leaf accepts in a page of `page_size` bytes: a
/// quarter page.
pub const fn max_payload_len(page_size: usize) -> usize {
    page_size / 4
}

/// Largest key a node accepts in a page of `page_size` bytes: about an
/// eighth of the page, so that two maximal fences and two maximal entries
/// fit one node (491 bytes for 4 KiB pages, 8171 for 64 KiB).
pub const fn max_key_len(page_size: usize) -> usize {
    (node_capacity(page_size) - 2 * max_payload_len(page_size) - 2 * SLOT_SIZE) / 4
}

/// An insert or update does not fit the node even after compaction: the
/// caller must split it (or merge less).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("node is full")
    }
}

impl std::error::Error for Full {}

/// A node failed validation. Convert with [`Corrupt::into_error`] once the
/// page id is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// What is wrong, for a human.
    pub what: String,
}

impl Corrupt {
    fn new(what: impl Into<String>) -> Corrupt {
        Corrupt { what: what.into() }
    }

    /// The crate error for this corruption found on page `page`.
    pub fn into_error(self, page: u64) -> crate::Error {
        crate::Error::Corrupt {
            page,
            what: format!("btree node: {}", self.what),
        }
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt btree node: {}", self.what)
    }
}

impl std::error::Error for Corrupt {}

impl From<Corrupt> for crate::Error {
    fn from(c: Corrupt) -> crate::Error {
        c.into_error(0)
    }
}

/// Why a split could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    /// The node has fewer than two entries.
    TooFewEntries,
    /// The split point is out of range for this node.
    BadSplitPoint,
    /// No split point gives two halves that fit (possible only with keys
    /// beyond [`max_key_len`]).
    NoFit,
    /// The node fails [`check`] (damaged, or forged with a valid
    /// checksum): splitting it could index past its bytes.
    Damaged,
}

impl fmt::Display for SplitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SplitError::TooFewEntries => "node has fewer than two entries",
            SplitError::BadSplitPoint => "split point out of range",
            SplitError::NoFit => "no split point gives two halves that fit",
            SplitError::Damaged => "the node fails its structure check",
        })
    }
}

impl std::error::Error for SplitError {}

fn rd16(b: &[u8], at: usize) -> usize {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, |a| u16::from_le_bytes(a) as usize)
}

fn rd64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn wr16(b: &mut [u8], at: usize, v: usize) {
    debug_assert!(v <= u16::MAX as usize);
    b[at..at + 2].copy_from_slice(&(v as u16).to_le_bytes());
}

/// The key head of a key suffix: its first 4 bytes, zero-padded, as a
/// big-endian integer (so integer order agrees with byte order).
pub fn key_head(suffix: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = suffix.len().min(4);
    b[..n].copy_from_slice(&suffix[..n]);
    u32::from_be_bytes(b)
}

fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Compares `a ++ b` with `c` without concatenating.
fn cmp_concat(a: &[u8], b: &[u8], c: &[u8]) -> Ordering {
    let n = a.len().min(c.len());
    match a[..n].cmp(&c[..n]) {
        Ordering::Equal => {}
        o => return o,
    }
    if a.len() > c.len() {
        return Ordering::Greater;
    }
    b.cmp(&c[n..])
}

/// The shortest key `s` with `a <= s < b` (requires `a < b`): a prefix of
/// `b` one byte past the common prefix when that is shorter than `b`,
/// otherwise `a` itself.
pub fn shortest_separator(a: &[u8], b: &[u8]) -> Vec<u8> {
    debug_assert!(a < b);
    let c = common_prefix_len(a, b);
    if b.len() > c + 1 && c < a.len() {
        // b[..=c] > a because b[c] > a[c], and < b because it is shorter.
        let s = &b[..=c];
        if s.len() < a.len() {
            return s.to_vec();
        }
    }
    a.to_vec()
}

/// A read-only view of the node in a page.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    /// The node region, `page[PAGE_HEADER_SIZE..]`.
    data: &'a [u8],
    /// The entry count and the leaf flag as read once, when the view was
    /// made: an optimistic reader's bytes may change under it, and every
    /// bound it checks (a slot index against the count, a leaf-only or
    /// inner-only accessor) must hold against the same values
    /// `check_header` validated (two reads of the count or the flags could
    /// disagree, and a debug assertion fired on that, `bench lookup
    /// --quick` in the debug build).
    len: usize,
    leaf: bool,
}

impl fmt::Debug for Node<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("leaf", &self.is_leaf())
            .field("len", &self.len())
            .field("lower", &self.lower_fence())
            .field("upper", &self.upper_fence())
            .field("prefix_len", &self.prefix_len())
            .finish()
    }
}

/// O(1) validation of the header: everything the accessors rely on to
/// stay in bounds for fences; slots are bounds-checked on access.
fn check_header(data: &[u8]) -> Result<(), Corrupt> {
    let page_size = data.len() + PAGE_HEADER_SIZE;
    if !is_valid_page_size(page_size) {
        return Err(Corrupt::new(format!("page size {page_size} is invalid")));
    }
    let region = data.len();
    let flags = data[H_FLAGS];
    if flags & !F_KNOWN != 0 {
        return Err(Corrupt::new(format!("unknown flags {flags:#x}")));
    }
    if data[H_VERSION] != FORMAT_VERSION {
        return Err(Corrupt::new(format!(
            "format version {} is not {FORMAT_VERSION}",
            data[H_VERSION]
        )));
    }
    let n = rd16(data, H_COUNT);
    let heap = rd16(data, H_HEAP);
    let used = rd16(data, H_USED);
    let slots_end = NODE_HEADER_SIZE + n * SLOT_SIZE;
    if slots_end > heap || heap > region {
        return Err(Corrupt::new(format!(
            "slot count {n} (slots end at {slots_end}) and heap start {heap} do not fit a region of {region} bytes"
        )));
    }
    if used > region - heap {
        return Err(Corrupt::new(format!(
            "heap bytes in use {used} exceed the heap ({} bytes)",
            region - heap
        )));
    }
    let fence = |off_at: usize, len_at: usize, inf: bool, name: &str| {
        let off = rd16(data, off_at);
        let len = rd16(data, len_at);
        if inf && len != 0 {
            return Err(Corrupt::new(format!(
                "infinite {name} fence has length {len}"
            )));
        }
        if len > max_key_len(page_size) {
            return Err(Corrupt::new(format!(
                "{name} fence of {len} bytes is too long"
            )));
        }
        if off > region || (len > 0 && (off < heap || off + len > region)) {
            return Err(Corrupt::new(format!(
                "{name} fence at {off} of {len} bytes is outside the heap [{heap}, {region})"
            )));
        }
        Ok(len)
    };
    let lower_len = fence(H_LOWER_OFF, H_LOWER_LEN, flags & F_LOWER_INF != 0, "lower")?;
    let upper_len = fence(H_UPPER_OFF, H_UPPER_LEN, flags & F_UPPER_INF != 0, "upper")?;
    let p = rd16(data, H_PREFIX);
    if p > lower_len || p > upper_len {
        return Err(Corrupt::new(format!(
            "prefix length {p} exceeds a fence ({lower_len}, {upper_len})"
        )));
    }
    Ok(())
}

impl<'a> Node<'a> {
    /// A view of the node in `page`, after an O(1) check of its header.
    /// Accessors never panic on a page accepted here; [`check`] validates
    /// the rest.
    pub fn new(page: &'a [u8]) -> Result<Node<'a>, Corrupt> {
        let data = page
            .get(PAGE_HEADER_SIZE..)
            .ok_or_else(|| Corrupt::new("page shorter than its header"))?;
        check_header(data)?;
        Ok(Node::over(data))
    }

    /// A view of a node region whose header was checked.
    fn over(data: &'a [u8]) -> Node<'a> {
        Node {
            data,
            len: rd16(data, H_COUNT),
            leaf: data[H_FLAGS] & F_LEAF != 0,
        }
    }

    fn flags(&self) -> u8 {
        self.data[H_FLAGS]
    }

    /// Size of the page this node lives in.
    pub fn page_size(&self) -> usize {
        self.data.len() + PAGE_HEADER_SIZE
    }

    /// Whether this is a leaf (payloads are values) rather than an inner
    /// node (payloads are child page ids).
    pub fn is_leaf(&self) -> bool {
        self.leaf
    }

    /// Number of entries (keys).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the node has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn heap_start(&self) -> usize {
        rd16(self.data, H_HEAP)
    }

    fn heap_used(&self) -> usize {
        rd16(self.data, H_USED)
    }

    fn slots_end(&self) -> usize {
        NODE_HEADER_SIZE + self.len() * SLOT_SIZE
    }

    /// Length of the prefix shared by every key in the node.
    pub fn prefix_len(&self) -> usize {
        rd16(self.data, H_PREFIX)
    }

    /// The prefix shared by every key in the node (stored once, as the
    /// start of the lower fence).
    pub fn prefix(&self) -> &'a [u8] {
        let off = rd16(self.data, H_LOWER_OFF);
        self.data.get(off..off + self.prefix_len()).unwrap_or(&[])
    }

    fn fence(&self, inf: u8, off_at: usize, len_at: usize) -> Option<&'a [u8]> {
        if self.flags() & inf != 0 {
            return None;
        }
        let off = rd16(self.data, off_at);
        let len = rd16(self.data, len_at);
        Some(self.data.get(off..off + len).unwrap_or(&[]))
    }

    /// The lower fence (exclusive), `None` for -infinity.
    pub fn lower_fence(&self) -> Option<&'a [u8]> {
        self.fence(F_LOWER_INF, H_LOWER_OFF, H_LOWER_LEN)
    }

    /// The upper fence (inclusive), `None` for +infinity.
    pub fn upper_fence(&self) -> Option<&'a [u8]> {
        self.fence(F_UPPER_INF, H_UPPER_OFF, H_UPPER_LEN)
    }

    /// Inner nodes: the rightmost child, covering keys above every
    /// separator. Leaves: 0.
    pub fn upper_child(&self) -> u64 {
        rd64(self.data, H_UPPER_CHILD)
    }

    /// Whether `key` lies in this node's range `(lower, upper]`.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.lower_fence().is_none_or(|l| key > l) && self.upper_fence().is_none_or(|u| key <= u)
    }

    /// Whether the last insert went to the end of the node (a hint that
    /// keys arrive in ascending order; [`split`] then splits near the end).
    pub fn last_insert_appended(&self) -> bool {
        self.flags() & F_LAST_APPEND != 0
    }

    /// Contiguous free bytes between the slot array and the heap.
    pub fn free_space(&self) -> usize {
        self.heap_start().saturating_sub(self.slots_end())
    }

    /// Free bytes once the heap is compacted.
    pub fn free_space_after_compaction(&self) -> usize {
        self.data
            .len()
            .saturating_sub(self.slots_end() + self.heap_used())
    }

    /// Bytes an entry with a full key of `key_len` bytes and a payload of
    /// `payload_len` bytes takes in this node (slot, key suffix, payload).
    pub fn space_needed(&self, key_len: usize, payload_len: usize) -> usize {
        SLOT_SIZE + key_len.saturating_sub(self.prefix_len()) + payload_len
    }

    /// Bytes in use (header, slots, live heap bytes) over the size of the
    /// node region: 0.0 empty, 1.0 full. For underfull detection.
    pub fn fill_factor(&self) -> f64 {
        (self.slots_end() + self.heap_used()) as f64 / self.data.len() as f64
    }

    fn slot(&self, i: usize, field: usize) -> usize {
        debug_assert!(i < self.len());
        rd16(self.data, NODE_HEADER_SIZE + i * SLOT_SIZE + field)
    }

    /// The key head stored in slot `i`.
    pub fn head_at(&self, i: usize) -> u32 {
        let at = NODE_HEADER_SIZE + i * SLOT_SIZE + S_HEAD;
        self.data
            .get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u32::from_be_bytes)
    }

    /// The stored key suffix of entry `i` (the key without [`Node::prefix`]).
    pub fn suffix_at(&self, i: usize) -> &'a [u8] {
        let off = self.slot(i, S_OFF);
        let len = self.slot(i, S_KEY_LEN);
        self.data.get(off..off + len).unwrap_or(&[])
    }

    /// The payload of entry `i` (a value in a leaf, a child id in an inner
    /// node).
    pub fn payload_at(&self, i: usize) -> &'a [u8] {
        let off = self.slot(i, S_OFF) + self.slot(i, S_KEY_LEN);
        let len = self.payload_len_at(i);
        self.data.get(off..off + len).unwrap_or(&[])
    }

    /// Length of entry `i`'s payload (without the reference flag).
    fn payload_len_at(&self, i: usize) -> usize {
        self.slot(i, S_PAYLOAD_LEN) & !REF_FLAG
    }

    /// True if entry `i`'s payload is a reference to a large value stored
    /// outside the tree (leaves only; bit 15 of the payload length).
    pub fn is_ref_at(&self, i: usize) -> bool {
        self.slot(i, S_PAYLOAD_LEN) & REF_FLAG != 0
    }

    /// The payload of `key` and whether it is a reference, if present.
    pub fn get_entry(&self, key: &[u8]) -> Option<(&'a [u8], bool)> {
        match self.lower_bound(key) {
            (i, true) => Some((self.payload_at(i), self.is_ref_at(i))),
            _ => None,
        }
    }

    /// Length of the full key of entry `i`.
    pub fn key_len_at(&self, i: usize) -> usize {
        self.prefix_len() + self.slot(i, S_KEY_LEN)
    }

    /// Writes the full key of entry `i` (prefix and suffix) into `out`,
    /// replacing its contents.
    pub fn key_at(&self, i: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.prefix());
        out.extend_from_slice(self.suffix_at(i));
    }

    /// The full key of entry `i` as a new vector.
    pub fn key_vec_at(&self, i: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.key_len_at(i));
        self.key_at(i, &mut v);
        v
    }

    /// Inner nodes: the child page id of entry `i` (0 if the payload is
    /// not 8 bytes, which [`check`] reports).
    pub fn child_at(&self, i: usize) -> u64 {
        rd64(self.payload_at(i), 0)
    }

    /// Compares the key of entry `i` with a key suffix (of the same prefix)
    /// whose head is `head`.
    fn cmp_at(&self, i: usize, head: u32, suffix: &[u8]) -> Ordering {
        match self.head_at(i).cmp(&head) {
            Ordering::Equal => self.suffix_at(i).cmp(suffix),
            o => o,
        }
    }

    /// The first entry whose key is `>= key`, and whether it equals `key`.
    /// `(len(), false)` when every key is smaller.
    pub fn lower_bound(&self, key: &[u8]) -> (usize, bool) {
        let prefix = self.prefix();
        let p = prefix.len();
        if key.len() < p || key[..p] != *prefix {
            // Outside the node's range: below or above every key.
            return if key < prefix {
                (0, false)
            } else {
                (self.len(), false)
            };
        }
        let suffix = &key[p..];
        let head = key_head(suffix);
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.cmp_at(mid, head, suffix) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return (mid, true),
            }
        }
        (lo, false)
    }

    /// The entries whose keys lie within `lower` and `upper`, as a range
    /// of positions: two binary searches, O(log n) key comparisons, none
    /// of the keys outside materialized (a scan's leaf step used to build
    /// and compare every key of the leaf).
    pub fn range(&self, lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> std::ops::Range<usize> {
        let start = match lower {
            Bound::Included(k) => self.lower_bound(k).0,
            Bound::Excluded(k) => {
                let (i, found) = self.lower_bound(k);
                i + found as usize
            }
            Bound::Unbounded => 0,
        };
        let end = match upper {
            Bound::Included(k) => {
                let (i, found) = self.lower_bound(k);
                i + found as usize
            }
            Bound::Excluded(k) => self.lower_bound(k).0,
            Bound::Unbounded => self.len(),
        };
        start..end.max(start)
    }

    /// Leaves: the payload stored under `key`.
    pub fn get(&self, key: &[u8]) -> Option<&'a [u8]> {
        match self.lower_bound(key) {
            (i, true) => Some(self.payload_at(i)),
            _ => None,
        }
    }

    /// Inner nodes: the child whose range holds `key`: the first separator
    /// `>= key`, or `upper` when `key` is above every separator.
    pub fn child_for(&self, key: &[u8]) -> u64 {
        debug_assert!(!self.is_leaf());
        let (i, _) = self.lower_bound(key);
        if i < self.len() {
            self.child_at(i)
        } else {
            self.upper_child()
        }
    }

    /// Bytes the entries `range` take (slots, full keys stored with a
    /// prefix of `prefix_len`, payloads).
    fn entries_size(&self, range: std::ops::Range<usize>, prefix_len: usize) -> usize {
        range
            .map(|i| {
                SLOT_SIZE + self.key_len_at(i).saturating_sub(prefix_len) + self.payload_len_at(i)
            })
            .sum()
    }
}

/// A writable view of the node in a page.
pub struct NodeMut<'a> {
    /// The node region, `page[PAGE_HEADER_SIZE..]`.
    data: &'a mut [u8],
}

impl fmt::Debug for NodeMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_node().fmt(f)
    }
}

/// Initialises an empty node in `page` (leaving the page header alone)
/// covering `(lower, upper]`; `None` is -inf / +inf. Inner nodes get
/// `upper_child` as their rightmost child; leaves should pass 0.
///
/// Panics if the page size is invalid, a fence is longer than
/// [`max_key_len`], or `lower >= upper`: those are caller bugs.
pub fn init<'a>(
    page: &'a mut [u8],
    is_leaf: bool,
    lower: Option<&[u8]>,
    upper: Option<&[u8]>,
    upper_child: u64,
) -> NodeMut<'a> {
    let page_size = page.len();
    assert!(
        is_valid_page_size(page_size),
        "invalid page size {page_size}"
    );
    let max_key = max_key_len(page_size);
    assert!(
        lower.is_none_or(|l| l.len() <= max_key),
        "lower fence too long"
    );
    assert!(
        upper.is_none_or(|u| u.len() <= max_key),
        "upper fence too long"
    );
    if let (Some(l), Some(u)) = (lower, upper) {
        assert!(l < u, "lower fence must be below the upper fence");
    }
    let data = &mut page[PAGE_HEADER_SIZE..];
    let region = data.len();
    data[..NODE_HEADER_SIZE].fill(0);
    let mut flags = 0;
    if is_leaf {
        flags |= F_LEAF;
    }
    if lower.is_none() {
        flags |= F_LOWER_INF;
    }
    if upper.is_none() {
        flags |= F_UPPER_INF;
    }
    data[H_FLAGS] = flags;
    data[H_VERSION] = FORMAT_VERSION;
    let mut heap = region;
    for (fence, off_at, len_at) in [
        (lower, H_LOWER_OFF, H_LOWER_LEN),
        (upper, H_UPPER_OFF, H_UPPER_LEN),
    ] {
        let f = fence.unwrap_or(&[]);
        heap -= f.len();
        data[heap..heap + f.len()].copy_from_slice(f);
        wr16(data, off_at, heap);
        wr16(data, len_at, f.len());
    }
    wr16(data, H_HEAP, heap);
    wr16(data, H_USED, region - heap);
    let prefix = match (lower, upper) {
        (Some(l), Some(u)) => common_prefix_len(l, u),
        _ => 0,
    };
    wr16(data, H_PREFIX, prefix);
    data[H_UPPER_CHILD..H_UPPER_CHILD + 8].copy_from_slice(&upper_child.to_le_bytes());
    let node = NodeMut { data };
    debug_assert!(node.as_node().is_empty());
    node
}

impl<'a> NodeMut<'a> {
    /// A writable view of the node in `page`, after an O(1) check of its
    /// header. Writes assume the page passed [`check`] or was built here.
    pub fn new(page: &'a mut [u8]) -> Result<NodeMut<'a>, Corrupt> {
        Node::new(page)?;
        Ok(NodeMut {
            data: &mut page[PAGE_HEADER_SIZE..],
        })
    }

    /// A read-only view (all the accessors of [`Node`]).
    pub fn as_node(&self) -> Node<'_> {
        Node::over(self.data)
    }

    fn set_slot(&mut self, i: usize, field: usize, v: usize) {
        wr16(self.data, NODE_HEADER_SIZE + i * SLOT_SIZE + field, v);
    }

    fn set_count(&mut self, n: usize) {
        wr16(self.data, H_COUNT, n);
    }

    fn set_heap(&mut self, heap: usize, used: usize) {
        wr16(self.data, H_HEAP, heap);
        wr16(self.data, H_USED, used);
    }

    /// Marks entry `i`'s payload as a large-value reference (`true`) or a
    /// value. Leaves only; an insert or update clears the mark, so the
    /// caller sets it after writing a reference.
    pub fn set_ref_at(&mut self, i: usize, is_ref: bool) {
        debug_assert!(self.as_node().is_leaf() && i < self.as_node().len());
        let len = self.as_node().payload_len_at(i);
        self.set_slot(i, S_PAYLOAD_LEN, if is_ref { len | REF_FLAG } else { len });
    }

    fn set_flag(&mut self, flag: u8, on: bool) {
        if on {
            self.data[H_FLAGS] |= flag;
        } else {
            self.data[H_FLAGS] &= !flag;
        }
    }

    /// Inner nodes: sets the rightmost child.
    pub fn set_upper_child(&mut self, child: u64) {
        debug_assert!(!self.as_node().is_leaf());
        self.data[H_UPPER_CHILD..H_UPPER_CHILD + 8].copy_from_slice(&child.to_le_bytes());
    }

    /// Inner nodes: sets the child of entry `i`.
    pub fn set_child_at(&mut self, i: usize, child: u64) {
        let node = self.as_node();
        debug_assert!(!node.is_leaf() && i < node.len());
        debug_assert_eq!(node.payload_len_at(i), CHILD_ID_SIZE);
        let off = node.slot(i, S_OFF) + node.slot(i, S_KEY_LEN);
        self.data[off..off + CHILD_ID_SIZE].copy_from_slice(&child.to_le_bytes());
    }

    /// Inserts `key` with `payload`, keeping keys in order; compacts the
    /// heap if that makes room. `key` must be in the node's range and not
    /// present yet. Returns [`Full`] (and changes nothing) when the entry
    /// does not fit: the caller splits.
    pub fn insert(&mut self, key: &[u8], payload: &[u8]) -> Result<(), Full> {
        let node = self.as_node();
        debug_assert!(node.covers(key), "key outside the node's fences");
        let (pos, found) = node.lower_bound(key);
        debug_assert!(!found, "key already present");
        let p = node.prefix_len();
        assert!(
            key.starts_with(node.prefix()),
            "key outside the node's fences"
        );
        self.insert_at(pos, &key[p..], payload)?;
        debug_assert!(self.as_node().get(key) == Some(payload));
        Ok(())
    }

    /// Inner nodes: inserts separator `key` whose left side (keys `<= key`
    /// down to the previous separator) is `child`.
    pub fn insert_separator(&mut self, key: &[u8], child: u64) -> Result<(), Full> {
        debug_assert!(!self.as_node().is_leaf());
        self.insert(key, &child.to_le_bytes())
    }

    /// Inserts a key suffix at slot `pos` (the caller keeps the order).
    fn insert_at(&mut self, pos: usize, suffix: &[u8], payload: &[u8]) -> Result<(), Full> {
        let node = self.as_node();
        let n = node.len();
        debug_assert!(pos <= n);
        let entry = suffix.len() + payload.len();
        let need = SLOT_SIZE + entry;
        if node.free_space() < need {
            if node.free_space_after_compaction() < need {
                return Err(Full);
            }
            self.compact();
        }
        let node = self.as_node();
        // An entry of no bytes sits at the region's end: where it stays
        // inside the heap however the heap start moves.
        let heap = node.heap_start() - entry;
        let off = if entry == 0 { self.data.len() } else { heap };
        let used = node.heap_used() + entry;
        self.data[off..off + suffix.len()].copy_from_slice(suffix);
        self.data[off + suffix.len()..off + entry].copy_from_slice(payload);
        let slot_at = NODE_HEADER_SIZE + pos * SLOT_SIZE;
        let slots_end = NODE_HEADER_SIZE + n * SLOT_SIZE;
        self.data
            .copy_within(slot_at..slots_end, slot_at + SLOT_SIZE);
        self.set_slot(pos, S_OFF, off);
        self.set_slot(pos, S_KEY_LEN, suffix.len());
        self.set_slot(pos, S_PAYLOAD_LEN, payload.len());
        self.data[slot_at + S_HEAD..slot_at + S_HEAD + 4]
            .copy_from_slice(&key_head(suffix).to_be_bytes());
        self.set_count(n + 1);
        self.set_heap(heap, used);
        self.set_flag(F_LAST_APPEND, pos == n);
        debug_assert!(self.as_node().free_space() <= self.as_node().free_space_after_compaction());
        Ok(())
    }

    /// Appends an entry whose full key is `key_a ++ key_b` at the end
    /// (building nodes in split and merge; keys arrive in order).
    /// [`NodeMut::push`] of entry `i` of `src`, keeping its reference mark.
    fn push_from(&mut self, src: &Node, i: usize) -> Result<(), Full> {
        self.push(src.prefix(), src.suffix_at(i), src.payload_at(i))?;
        if src.is_ref_at(i) {
            let last = self.as_node().len() - 1;
            self.set_ref_at(last, true);
        }
        Ok(())
    }

    fn push(&mut self, key_a: &[u8], key_b: &[u8], payload: &[u8]) -> Result<(), Full> {
        let p = self.as_node().prefix_len();
        let joined;
        let suffix: &[u8] = if p >= key_a.len() {
            &key_b[p - key_a.len()..]
        } else if key_b.is_empty() {
            &key_a[p..]
        } else {
            joined = [&key_a[p..], key_b].concat();
            &joined
        };
        let n = self.as_node().len();
        self.insert_at(n, suffix, payload)
    }

    /// Replaces the payload of `key`. Returns `Ok(false)` if `key` is not
    /// present, [`Full`] (changing nothing) if a longer payload does not
    /// fit even after compaction.
    pub fn update(&mut self, key: &[u8], payload: &[u8]) -> Result<bool, Full> {
        match self.as_node().lower_bound(key) {
            (i, true) => self.update_at(i, payload).map(|()| true),
            _ => Ok(false),
        }
    }

    /// Replaces the payload of entry `i`: in place when it is not longer,
    /// else in fresh heap space (compacting if needed).
    pub fn update_at(&mut self, i: usize, payload: &[u8]) -> Result<(), Full> {
        let node = self.as_node();
        debug_assert!(i < node.len());
        let off = node.slot(i, S_OFF);
        let key_len = node.slot(i, S_KEY_LEN);
        let old_len = node.payload_len_at(i);
        let heap = node.heap_start();
        let used = node.heap_used();
        if payload.len() <= old_len {
            self.data[off + key_len..off + key_len + payload.len()].copy_from_slice(payload);
            self.set_slot(i, S_PAYLOAD_LEN, payload.len());
            if key_len + payload.len() == 0 {
                // Now of no bytes: to the region's end (see `insert_at`).
                self.set_slot(i, S_OFF, self.data.len());
            }
            self.set_heap(heap, used - (old_len - payload.len()));
            return Ok(());
        }
        let need = key_len + payload.len();
        if node.free_space() >= need {
            let new_off = heap - need;
            self.data.copy_within(off..off + key_len, new_off);
            self.data[new_off + key_len..new_off + need].copy_from_slice(payload);
            self.set_slot(i, S_OFF, new_off);
            self.set_slot(i, S_PAYLOAD_LEN, payload.len());
            self.set_heap(new_off, used - key_len - old_len + need);
            return Ok(());
        }
        if node.free_space_after_compaction() + key_len + old_len < need {
            return Err(Full);
        }
        // Drop the old entry's bytes, compact, then place the new entry.
        let suffix = node.suffix_at(i).to_vec();
        self.set_slot(i, S_KEY_LEN, 0);
        self.set_slot(i, S_PAYLOAD_LEN, 0);
        self.set_heap(heap, used - key_len - old_len);
        self.compact();
        let node = self.as_node();
        let new_off = node.heap_start() - need;
        let used = node.heap_used() + need;
        debug_assert!(new_off >= node.slots_end());
        self.data[new_off..new_off + key_len].copy_from_slice(&suffix);
        self.data[new_off + key_len..new_off + need].copy_from_slice(payload);
        self.set_slot(i, S_OFF, new_off);
        self.set_slot(i, S_KEY_LEN, key_len);
        self.set_slot(i, S_PAYLOAD_LEN, payload.len());
        self.set_heap(new_off, used);
        Ok(())
    }

    /// Removes `key`; returns whether it was present.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.as_node().lower_bound(key) {
            (i, true) => {
                self.remove_at(i);
                true
            }
            _ => false,
        }
    }

    /// Removes entry `i`. Its heap bytes become a hole (reclaimed at once
    /// if it sits at the heap start, else by the next compaction).
    pub fn remove_at(&mut self, i: usize) {
        let node = self.as_node();
        let n = node.len();
        debug_assert!(i < n);
        let off = node.slot(i, S_OFF);
        let len = node.slot(i, S_KEY_LEN) + node.payload_len_at(i);
        let mut heap = node.heap_start();
        let used = node.heap_used() - len;
        if off == heap {
            heap += len;
        }
        let slot_at = NODE_HEADER_SIZE + i * SLOT_SIZE;
        let slots_end = NODE_HEADER_SIZE + n * SLOT_SIZE;
        self.data
            .copy_within(slot_at + SLOT_SIZE..slots_end, slot_at);
        self.set_count(n - 1);
        self.set_heap(heap, used);
        self.set_flag(F_LAST_APPEND, false);
    }

    /// Defragments the heap: moves fences and entries to the end of the
    /// region so all free space is contiguous.
    pub fn compact(&mut self) {
        let copy = self.data.to_vec();
        let old = Node::over(&copy);
        let region = copy.len();
        let mut heap = region;
        for (off_at, len_at) in [(H_LOWER_OFF, H_LOWER_LEN), (H_UPPER_OFF, H_UPPER_LEN)] {
            let off = rd16(&copy, off_at);
            let len = rd16(&copy, len_at);
            heap -= len;
            self.data[heap..heap + len].copy_from_slice(&copy[off..off + len]);
            wr16(self.data, off_at, heap);
        }
        for i in 0..old.len() {
            let off = old.slot(i, S_OFF);
            let len = old.slot(i, S_KEY_LEN) + old.payload_len_at(i);
            if len == 0 {
                self.set_slot(i, S_OFF, region);
                continue;
            }
            heap -= len;
            self.data[heap..heap + len].copy_from_slice(&copy[off..off + len]);
            self.set_slot(i, S_OFF, heap);
        }
        debug_assert_eq!(region - heap, old.heap_used());
        self.set_heap(heap, region - heap);
        debug_assert_eq!(
            self.as_node().free_space(),
            self.as_node().free_space_after_compaction()
        );
    }
}

/// The bytes a node with these fences and entries `range` of `src` (keys
/// re-truncated to the new fences' prefix) would take; also that prefix.
fn built_size(
    src: &Node,
    lower: Option<&[u8]>,
    upper: Option<&[u8]>,
    range: std::ops::Range<usize>,
) -> usize {
    let prefix = match (lower, upper) {
        (Some(l), Some(u)) => common_prefix_len(l, u),
        _ => 0,
    };
    NODE_HEADER_SIZE
        + lower.map_or(0, <[u8]>::len)
        + upper.map_or(0, <[u8]>::len)
        + src.entries_size(range, prefix)
}

/// Where [`split`] splits `src`: the index of the separator entry (leaves:
/// the last entry of the left half; inner nodes: the entry whose key moves
/// up). Near the end when the last insert was an append (ascending loads
/// fill pages), else in the middle by bytes. `None` with fewer than two
/// entries.
pub fn split_point(src: &Node) -> Option<usize> {
    let n = src.len();
    if n < 2 {
        return None;
    }
    // Valid points: leaves 0..=n-2, inner nodes 1..=n-1.
    let (first, last) = if src.is_leaf() {
        (0, n - 2)
    } else {
        (1, n - 1)
    };
    if src.last_insert_appended() {
        return Some(last);
    }
    let p = src.prefix_len();
    let total = src.entries_size(0..n, p);
    let mut acc = 0;
    for i in 0..n {
        acc += src.entries_size(i..i + 1, p);
        if 2 * acc >= total {
            return Some(i.clamp(first, last));
        }
    }
    Some(last)
}

/// Splits the node in page `src` into pages `left` and `right` (same page
/// size; their page headers are left alone) at [`split_point`], moving the
/// split point towards the middle if a half would not fit. Returns the
/// separator to insert into the parent: every key of `left` is `<=` it,
/// every key of `right` is `>` it. Leaves use the shortest such key; inner
/// nodes push the separator entry up (its child becomes `left`'s upper
/// child).
pub fn split(src: &[u8], left: &mut [u8], right: &mut [u8]) -> Result<Vec<u8>, SplitError> {
    let node = Node::new(src).map_err(|_| SplitError::Damaged)?;
    check_node(&node).map_err(|_| SplitError::Damaged)?;
    let target = split_point(&node).ok_or(SplitError::TooFewEntries)?;
    let n = node.len();
    let (first, last) = if node.is_leaf() {
        (0, n - 2)
    } else {
        (1, n - 1)
    };
    // Candidates ordered by distance from the target, the target first.
    let mut candidates: Vec<usize> = (first..=last).collect();
    candidates.sort_by_key(|&i| i.abs_diff(target));
    for at in candidates {
        if let Some(sep) = fits(&node, at) {
            return split_at_with(&node, at, sep, left, right);
        }
    }
    Err(SplitError::NoFit)
}

fn separator_at(node: &Node, at: usize) -> Vec<u8> {
    if node.is_leaf() {
        shortest_separator(&node.key_vec_at(at), &node.key_vec_at(at + 1))
    } else {
        node.key_vec_at(at)
    }
}

/// The separator if splitting at `at` gives two halves that fit.
fn fits(node: &Node, at: usize) -> Option<Vec<u8>> {
    let sep = separator_at(node, at);
    let cap = node.data.len();
    let (lo, hi) = if node.is_leaf() {
        (at + 1, at + 1)
    } else {
        (at, at + 1)
    };
    let l = built_size(node, node.lower_fence(), Some(&sep), 0..lo);
    let r = built_size(node, Some(&sep), node.upper_fence(), hi..node.len());
    (l <= cap && r <= cap && sep.len() <= max_key_len(node.page_size())).then_some(sep)
}

/// Splits at an explicit point (see [`split_point`] for its meaning).
pub fn split_at(
    src: &[u8],
    at: usize,
    left: &mut [u8],
    right: &mut [u8],
) -> Result<Vec<u8>, SplitError> {
    let node = Node::new(src).map_err(|_| SplitError::Damaged)?;
    check_node(&node).map_err(|_| SplitError::Damaged)?;
    let n = node.len();
    if n < 2 {
        return Err(SplitError::TooFewEntries);
    }
    let ok = if node.is_leaf() {
        at + 2 <= n
    } else {
        at >= 1 && at < n
    };
    if !ok {
        return Err(SplitError::BadSplitPoint);
    }
    let sep = fits(&node, at).ok_or(SplitError::NoFit)?;
    split_at_with(&node, at, sep, left, right)
}

fn split_at_with(
    node: &Node,
    at: usize,
    sep: Vec<u8>,
    left: &mut [u8],
    right: &mut [u8],
) -> Result<Vec<u8>, SplitError> {
    assert_eq!(left.len(), node.page_size());
    assert_eq!(right.len(), node.page_size());
    let leaf = node.is_leaf();
    let n = node.len();
    let (left_end, right_start, left_upper) = if leaf {
        (at + 1, at + 1, 0)
    } else {
        (at, at + 1, node.child_at(at))
    };
    let mut l = init(left, leaf, node.lower_fence(), Some(&sep), left_upper);
    for i in 0..left_end {
        l.push_from(node, i).map_err(|Full| SplitError::NoFit)?;
    }
    let mut r = init(
        right,
        leaf,
        Some(&sep),
        node.upper_fence(),
        node.upper_child(),
    );
    for i in right_start..n {
        r.push_from(node, i).map_err(|Full| SplitError::NoFit)?;
    }
    l.set_flag(F_LAST_APPEND, false);
    r.set_flag(F_LAST_APPEND, false);
    debug_assert!(check_node(&l.as_node()).is_ok());
    debug_assert!(check_node(&r.as_node()).is_ok());
    Ok(sep)
}

/// Cuts the leaf in `page` at key `upper`: rebuilds it (compacted, page
/// header left alone) with the entries whose keys are `<= upper` and
/// `upper` as its upper fence. This is the left half of a leaf split,
/// redone at recovery from whatever state the leaf has there (the log
/// holds only the cut, not the half: `wal::record::CUT`).
///
/// The leaf at recovery may hold more below `upper` than it held at the
/// split (values that commits after its last page record shrank or
/// deleted). If the kept entries do not fit with the new fence, the
/// entries whose key `droppable` accepts are left out (recovery passes the
/// keys that the commits it re-applies write: they come back). Errors,
/// leaving `page` alone: not a valid leaf, `upper` not strictly inside its
/// fences or too long, or still no fit. Returns the number of entries left
/// out. Costs one page copy and one pass
/// over the kept entries (`droppable` is asked only when the first fit
/// fails).
pub fn cut_leaf(
    page: &mut [u8],
    upper: &[u8],
    droppable: impl Fn(&[u8]) -> bool,
) -> Result<usize, Corrupt> {
    let src = page.to_vec();
    let node = Node::new(&src)?;
    check_node(&node)?;
    if !node.is_leaf() {
        return Err(Corrupt::new("a leaf cut names an inner node"));
    }
    let inside = node.covers(upper) && node.upper_fence() != Some(upper);
    if !inside || upper.len() > max_key_len(node.page_size()) {
        return Err(Corrupt::new(
            "a leaf cut's key is not strictly inside the leaf's fences",
        ));
    }
    let lower = node.lower_fence();
    let end = node.range(Bound::Unbounded, Bound::Included(upper)).end;
    let keep: Vec<usize> = if built_size(&node, lower, Some(upper), 0..end) <= node.data.len() {
        (0..end).collect()
    } else {
        (0..end)
            .filter(|&i| !droppable(&node.key_vec_at(i)))
            .collect()
    };
    let mut out = vec![0u8; src.len()];
    out[..PAGE_HEADER_SIZE].copy_from_slice(&src[..PAGE_HEADER_SIZE]);
    let mut o = init(&mut out, true, lower, Some(upper), 0);
    let left_out = end - keep.len();
    for i in keep {
        o.push_from(&node, i)
            .map_err(|Full| Corrupt::new("the leaf cut at its split key does not fit one page"))?;
    }
    debug_assert!(check_node(&o.as_node()).is_ok());
    page.copy_from_slice(&out);
    Ok(left_out)
}

/// Merges sibling nodes `left` and `right` (pages; `right` immediately
/// follows `left`) into page `out`, covering `(left.lower, right.upper]`.
/// Inner nodes pull the separator between them (`left`'s upper fence) down
/// as an entry pointing to `left`'s upper child. Returns [`Full`] (and
/// leaves `out` alone) if the union does not fit one node, or if the
/// pages are not sound adjacent siblings of one kind.
pub fn merge(left: &[u8], right: &[u8], out: &mut [u8]) -> Result<(), Full> {
    let (Ok(l), Ok(r)) = (Node::new(left), Node::new(right)) else {
        return Err(Full);
    };
    // Pages that are not two sound adjacent siblings of one kind (damaged,
    // or forged with a valid checksum) are never merged: the build below
    // trusts their slots and fences (it asserted, and a forged parent
    // pointer to an inner node made a delete panic; a review's finding).
    if check_node(&l).is_err()
        || check_node(&r).is_err()
        || l.is_leaf() != r.is_leaf()
        || l.upper_fence() != r.lower_fence()
        || out.len() != l.page_size()
    {
        return Err(Full);
    }
    let leaf = l.is_leaf();
    let lower = l.lower_fence();
    let upper = r.upper_fence();
    let mid = l.upper_fence();
    let mut size = built_size(&l, lower, upper, 0..l.len())
        - NODE_HEADER_SIZE
        - lower.map_or(0, <[u8]>::len)
        - upper.map_or(0, <[u8]>::len);
    size += built_size(&r, lower, upper, 0..r.len());
    let prefix = match (lower, upper) {
        (Some(a), Some(b)) => common_prefix_len(a, b),
        _ => 0,
    };
    if !leaf {
        let Some(mid) = mid else { return Err(Full) };
        size += SLOT_SIZE + mid.len() - prefix + CHILD_ID_SIZE;
    }
    if size > l.data.len() {
        return Err(Full);
    }
    let mut o = init(
        out,
        leaf,
        lower,
        upper,
        if leaf { 0 } else { r.upper_child() },
    );
    for i in 0..l.len() {
        o.push_from(&l, i)?;
    }
    if let (false, Some(mid)) = (leaf, mid) {
        o.push(mid, &[], &l.upper_child().to_le_bytes())?;
    }
    for i in 0..r.len() {
        o.push_from(&r, i)?;
    }
    o.set_flag(F_LAST_APPEND, false);
    debug_assert!(check_node(&o.as_node()).is_ok());
    Ok(())
}

/// Validates the whole node in `page` (used by `dana check` and after
/// reading a page): header, slot bounds, non-overlapping heap entries that
/// add up to the recorded usage, key heads, strictly ascending keys within
/// the fences, payload sizes. Never panics, whatever the bytes.
pub fn check(page: &[u8]) -> Result<(), Corrupt> {
    let node = Node::new(page)?;
    check_node(&node)
}

/// The part of [`check`] that [`NodeMut`]'s arithmetic relies on not to
/// index past the node or wrap a count: the prefix is the fences' common
/// prefix, every entry lies inside the heap with a payload of its kind's
/// size, and the heap entries (fences included) add up to the recorded
/// usage. O(n), no allocation: the tree runs it on each page it latches
/// to change, once per arrival in the pool (`btree::tree::checked`),
/// where the whole [`check`] (with key order, key heads and overlapping
/// entries, which give wrong answers but never a panic) sorts and
/// allocates. (On memory-backed YCSB-A neither showed a cost above this
/// host's noise: docs/PERF.md.) Never panics, whatever the bytes.
pub fn check_writable(page: &[u8]) -> Result<(), Corrupt> {
    let node = Node::new(page)?;
    let data = node.data;
    let region = data.len();
    let heap = node.heap_start();
    let p = node.prefix_len();
    let leaf = node.is_leaf();
    let expect_prefix = match (node.lower_fence(), node.upper_fence()) {
        (Some(l), Some(u)) if l < u => common_prefix_len(l, u),
        (Some(_), Some(_)) => {
            return Err(Corrupt::new("lower fence is not below the upper fence"));
        }
        _ => 0,
    };
    if p != expect_prefix {
        return Err(Corrupt::new(format!(
            "prefix length {p} is not the fences' common prefix {expect_prefix}"
        )));
    }
    let max_key = max_key_len(node.page_size());
    let max_payload = if leaf {
        max_payload_len(node.page_size())
    } else {
        CHILD_ID_SIZE
    };
    let mut sum = rd16(data, H_LOWER_LEN) + rd16(data, H_UPPER_LEN);
    for i in 0..node.len() {
        let off = node.slot(i, S_OFF);
        let key_len = node.slot(i, S_KEY_LEN);
        let payload_len = node.payload_len_at(i);
        let end = off + key_len + payload_len;
        let empty = end == off;
        if (!empty && (off < heap || end > region)) || (empty && off > region) {
            return Err(Corrupt::new(format!(
                "slot {i}: entry [{off}, {end}) outside the heap [{heap}, {region})"
            )));
        }
        if p + key_len > max_key
            || payload_len > max_payload
            || (!leaf && (payload_len != CHILD_ID_SIZE || node.is_ref_at(i)))
        {
            return Err(Corrupt::new(format!(
                "slot {i}: a key of {} bytes or a payload of {payload_len}",
                p + key_len
            )));
        }
        sum += end - off;
    }
    if sum != node.heap_used() {
        return Err(Corrupt::new(format!(
            "heap entries take {sum} bytes but the header says {}",
            node.heap_used()
        )));
    }
    Ok(())
}

fn check_node(node: &Node) -> Result<(), Corrupt> {
    let data = node.data;
    let region = data.len();
    let page_size = node.page_size();
    let heap = node.heap_start();
    let n = node.len();
    let p = node.prefix_len();
    let lower = node.lower_fence();
    let upper = node.upper_fence();
    let leaf = node.is_leaf();
    if data
        .get(H_RESERVED..H_UPPER_CHILD)
        .is_none_or(|r| r.iter().any(|&b| b != 0))
    {
        return Err(Corrupt::new("reserved header bytes are not zero"));
    }
    let expect_prefix = match (lower, upper) {
        (Some(l), Some(u)) => {
            if l >= u {
                return Err(Corrupt::new("lower fence is not below the upper fence"));
            }
            common_prefix_len(l, u)
        }
        _ => 0,
    };
    if p != expect_prefix {
        return Err(Corrupt::new(format!(
            "prefix length {p} is not the fences' common prefix {expect_prefix}"
        )));
    }
    if leaf && node.upper_child() != 0 {
        return Err(Corrupt::new("leaf has an upper child"));
    }
    let mut extents: Vec<(usize, usize)> = Vec::with_capacity(n + 2);
    for (off_at, len_at) in [(H_LOWER_OFF, H_LOWER_LEN), (H_UPPER_OFF, H_UPPER_LEN)] {
        let len = rd16(data, len_at);
        if len > 0 {
            extents.push((rd16(data, off_at), len));
        }
    }
    let prefix = node.prefix();
    let max_key = max_key_len(page_size);
    let max_payload = if leaf {
        max_payload_len(page_size)
    } else {
        CHILD_ID_SIZE
    };
    let mut prev: Option<&[u8]> = None;
    for i in 0..n {
        let off = node.slot(i, S_OFF);
        let key_len = node.slot(i, S_KEY_LEN);
        let payload_len = node.payload_len_at(i);
        if node.is_ref_at(i) && !leaf {
            return Err(Corrupt::new(format!(
                "slot {i}: an inner node's entry is marked as a large-value reference"
            )));
        }
        let end = off + key_len + payload_len;
        // An entry of no bytes (the empty key with an empty value) takes
        // no heap space: its offset only has to stay inside the node (this
        // module writes the region's end; pages written before that held
        // the heap start of the moment, which a later removal could leave
        // below the heap).
        let empty = end == off;
        if (!empty && (off < heap || end > region)) || (empty && off > region) {
            return Err(Corrupt::new(format!(
                "slot {i}: entry [{off}, {end}) outside the heap [{heap}, {region})"
            )));
        }
        if p + key_len > max_key {
            return Err(Corrupt::new(format!(
                "slot {i}: key of {} bytes is too long",
                p + key_len
            )));
        }
        if payload_len > max_payload || (!leaf && payload_len != CHILD_ID_SIZE) {
            return Err(Corrupt::new(format!(
                "slot {i}: payload of {payload_len} bytes"
            )));
        }
        if !empty {
            extents.push((off, key_len + payload_len));
        }
        let suffix = node.suffix_at(i);
        if node.head_at(i) != key_head(suffix) {
            return Err(Corrupt::new(format!(
                "slot {i}: key head does not match the key"
            )));
        }
        if let Some(prev) = prev {
            if prev >= suffix {
                return Err(Corrupt::new(format!(
                    "slot {i}: keys not strictly ascending"
                )));
            }
        } else if let Some(l) = lower {
            if cmp_concat(prefix, suffix, l) != Ordering::Greater {
                return Err(Corrupt::new(format!(
                    "slot {i}: key not above the lower fence"
                )));
            }
        }
        prev = Some(suffix);
    }
    if let (Some(last), Some(u)) = (prev, upper) {
        if cmp_concat(prefix, last, u) == Ordering::Greater {
            return Err(Corrupt::new("last key above the upper fence"));
        }
    }
    extents.sort_unstable();
    let mut end = heap;
    let mut sum = 0;
    for &(off, len) in &extents {
        if off < end {
            return Err(Corrupt::new(format!(
                "heap entry at {off} overlaps the previous one"
            )));
        }
        end = off + len;
        sum += len;
    }
    if sum != node.heap_used() {
        return Err(Corrupt::new(format!(
            "heap entries take {sum} bytes but the header says {}",
            node.heap_used()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const HEADER_BYTE: u8 = 0xA5;

    /// A fresh page whose page header holds a sentinel, to prove the node
    /// never touches it.
    fn page(size: usize) -> Vec<u8> {
        let mut p = vec![0u8; size];
        p[..PAGE_HEADER_SIZE].fill(HEADER_BYTE);
        p
    }

    fn header_intact(p: &[u8]) -> bool {
        p[..PAGE_HEADER_SIZE].iter().all(|&b| b == HEADER_BYTE)
    }

    fn entries(p: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let n = Node::new(p).unwrap();
        (0..n.len())
            .map(|i| (n.key_vec_at(i), n.payload_at(i).to_vec()))
            .collect()
    }

    fn leaf(size: usize, lower: Option<&[u8]>, upper: Option<&[u8]>) -> Vec<u8> {
        let mut p = page(size);
        init(&mut p, true, lower, upper, 0);
        p
    }

    #[test]
    fn insert_get_update_remove() {
        let mut p = leaf(4096, None, None);
        let mut n = NodeMut::new(&mut p).unwrap();
        n.insert(b"b", b"2").unwrap();
        n.insert(b"a", b"1").unwrap();
        n.insert(b"", b"empty").unwrap();
        n.insert(b"abcdefgh", b"long").unwrap();
        n.insert(b"abcd", b"4").unwrap();
        let r = n.as_node();
        assert_eq!(r.get(b""), Some(&b"empty"[..]));
        assert_eq!(r.get(b"abcd"), Some(&b"4"[..]));
        assert_eq!(r.get(b"abcde"), None);
        assert_eq!(r.lower_bound(b"abcde"), (3, false));
        assert_eq!(r.lower_bound(b"zzz"), (5, false));
        assert!(n.update(b"a", b"one, longer").unwrap());
        assert!(n.update(b"b", b"").unwrap());
        assert!(!n.update(b"c", b"x").unwrap());
        assert!(n.remove(b"abcd"));
        assert!(!n.remove(b"abcd"));
        check(&p).unwrap();
        assert!(header_intact(&p));
        let got = entries(&p);
        let want: Vec<(Vec<u8>, Vec<u8>)> = [
            (&b""[..], &b"empty"[..]),
            (b"a", b"one, longer"),
            (b"abcdefgh", b"long"),
            (b"b", b""),
        ]
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn prefix_truncation_stores_suffixes() {
        let mut p = leaf(4096, Some(b"user:1000"), Some(b"user:2000"));
        let mut n = NodeMut::new(&mut p).unwrap();
        assert_eq!(n.as_node().prefix(), b"user:");
        n.insert(b"user:1500", b"x").unwrap();
        n.insert(b"user:1000\0", b"y").unwrap();
        n.insert(b"user:2000", b"z").unwrap();
        let r = n.as_node();
        assert_eq!(r.suffix_at(0), b"1000\0");
        assert_eq!(r.suffix_at(1), b"1500");
        assert_eq!(r.key_vec_at(2), b"user:2000");
        assert_eq!(r.space_needed(9, 1), SLOT_SIZE + 4 + 1);
        // Keys outside the prefix sort before or after everything.
        assert_eq!(r.lower_bound(b"user"), (0, false));
        assert_eq!(r.lower_bound(b"a"), (0, false));
        assert_eq!(r.lower_bound(b"z"), (3, false));
        assert!(!r.covers(b"user:1000"));
        assert!(r.covers(b"user:2000"));
        check(&p).unwrap();
    }

    #[test]
    fn full_insert_changes_nothing_and_compaction_reclaims() {
        let mut p = leaf(4096, None, None);
        let mut n = NodeMut::new(&mut p).unwrap();
        let v = [7u8; 100];
        let mut i = 0u32;
        while n.insert(&i.to_be_bytes(), &v).is_ok() {
            i += 1;
        }
        let before = n.as_node().len();
        assert_eq!(n.insert(&i.to_be_bytes(), &v), Err(Full));
        assert_eq!(n.as_node().len(), before);
        // Free holes in the middle, then an insert needs compaction.
        for k in (0..i).step_by(2) {
            assert!(n.remove(&k.to_be_bytes()));
        }
        assert!(n.as_node().free_space() < n.as_node().free_space_after_compaction());
        n.insert(&i.to_be_bytes(), &[1u8; 1000]).unwrap();
        // Growing a payload beyond the contiguous space compacts too.
        n.update(&1u32.to_be_bytes(), &[2u8; 900]).unwrap();
        check(&p).unwrap();
        assert!(header_intact(&p));
        let n = Node::new(&p).unwrap();
        assert_eq!(n.get(&1u32.to_be_bytes()), Some(&[2u8; 900][..]));
        assert_eq!(n.get(&i.to_be_bytes()), Some(&[1u8; 1000][..]));
    }

    #[test]
    fn boundaries_max_sizes() {
        for size in [4096, 8192, 65536] {
            let mk = max_key_len(size);
            let mp = max_payload_len(size);
            assert!(mk >= size / 8 - 32, "{size}: {mk}");
            // Two maximal fences and two maximal entries fit one node.
            let lower = vec![1u8; mk];
            let mut upper = vec![9u8; mk];
            upper[0] = 2;
            let mut p = leaf(size, Some(&lower), Some(&upper));
            let mut n = NodeMut::new(&mut p).unwrap();
            let mut k1 = vec![1u8; mk];
            k1[mk - 1] = 2;
            let mut k2 = vec![2u8; mk];
            k2[1] = 0;
            n.insert(&k1, &vec![3u8; mp]).unwrap();
            n.insert(&k2, &vec![4u8; mp]).unwrap();
            check(&p).unwrap();
            assert_eq!(entries(&p).len(), 2);
            // Empty key and empty payload in a leftmost node.
            let mut p = leaf(size, None, Some(b"m"));
            let mut n = NodeMut::new(&mut p).unwrap();
            n.insert(b"", b"").unwrap();
            n.insert(b"m", &vec![5u8; mp]).unwrap();
            assert_eq!(n.as_node().get(b""), Some(&b""[..]));
            check(&p).unwrap();
            assert!(header_intact(&p));
        }
    }

    #[test]
    fn page_sizes_and_corrupt_header() {
        assert!(Node::new(&vec![0u8; 1000]).is_err());
        assert!(Node::new(&vec![0u8; 4096]).is_err()); // version 0
        let p = leaf(65536, Some(b"a"), None);
        check(&p).unwrap();
        assert_eq!(
            Node::new(&p).unwrap().free_space(),
            node_capacity(65536) - 1
        );
        let mut bad = p.clone();
        bad[PAGE_HEADER_SIZE + H_COUNT] = 0xff;
        bad[PAGE_HEADER_SIZE + H_COUNT + 1] = 0xff;
        assert!(check(&bad).is_err());
        let e: crate::Error = check(&bad).unwrap_err().into_error(42);
        assert!(e.to_string().contains("corrupt page 42"), "{e}");
    }

    #[test]
    fn inner_child_for_and_separators_after_prefix_truncation() {
        let mut p = page(4096);
        let mut n = init(&mut p, false, Some(b"abc"), Some(b"abd"), 99);
        assert_eq!(n.as_node().prefix(), b"ab");
        n.insert_separator(b"abc5", 5).unwrap();
        n.insert_separator(b"abc1", 1).unwrap();
        n.insert_separator(b"abc1\xff", 2).unwrap();
        let r = n.as_node();
        assert_eq!(r.child_for(b"abc0"), 1);
        assert_eq!(r.child_for(b"abc1"), 1);
        assert_eq!(r.child_for(b"abc1\x00"), 2);
        assert_eq!(r.child_for(b"abc3"), 5);
        assert_eq!(r.child_for(b"abc5"), 5);
        assert_eq!(r.child_for(b"abc50"), 99);
        assert_eq!(r.child_for(b"abd"), 99);
        n.set_child_at(0, 11);
        n.set_upper_child(100);
        assert_eq!(n.as_node().child_for(b"abc"), 11);
        assert_eq!(n.as_node().child_for(b"abczz"), 100);
        check(&p).unwrap();
        // Inner split: the middle separator moves up.
        let (mut l, mut r) = (page(4096), page(4096));
        let sep = split(&p, &mut l, &mut r).unwrap();
        check(&l).unwrap();
        check(&r).unwrap();
        let (ln, rn) = (Node::new(&l).unwrap(), Node::new(&r).unwrap());
        assert_eq!(ln.len() + rn.len() + 1, 3);
        assert_eq!(ln.upper_fence(), Some(&sep[..]));
        assert_eq!(rn.lower_fence(), Some(&sep[..]));
        assert_eq!(rn.upper_child(), 100);
        for (k, c) in [
            (&b"abc0"[..], 11u64),
            (b"abc1\x01", 2),
            (b"abc4", 5),
            (b"abcz", 100),
        ] {
            let got = if k <= &sep[..] {
                ln.child_for(k)
            } else {
                rn.child_for(k)
            };
            assert_eq!(got, c, "{k:?}");
        }
        // And merging them back gives the original node.
        let mut m = page(4096);
        merge(&l, &r, &mut m).unwrap();
        check(&m).unwrap();
        assert_eq!(entries(&m), entries(&p));
        assert_eq!(Node::new(&m).unwrap().upper_child(), 100);
    }

    #[test]
    fn shortest_separators() {
        assert_eq!(shortest_separator(b"abc", b"abd"), b"abc");
        assert_eq!(shortest_separator(b"abcxyz", b"abdxyz"), b"abd");
        assert_eq!(shortest_separator(b"ab", b"abc"), b"ab");
        assert_eq!(shortest_separator(b"", b"a"), b"");
        assert_eq!(shortest_separator(b"apple", b"banana"), b"b");
        assert_eq!(shortest_separator(b"apple", b"b"), b"apple");
    }

    #[test]
    fn ascending_load_splits_near_the_end() {
        for size in [4096, 65536] {
            let mut p = leaf(size, None, None);
            let mut n = NodeMut::new(&mut p).unwrap();
            let mut i = 0u64;
            while n.insert(&i.to_be_bytes(), &[0u8; 120]).is_ok() {
                i += 1;
            }
            let (mut l, mut r) = (page(size), page(size));
            let sep = split(&p, &mut l, &mut r).unwrap();
            check(&l).unwrap();
            check(&r).unwrap();
            let fill = Node::new(&l).unwrap().fill_factor();
            assert!(fill >= 0.85, "{size}: left fill {fill}");
            assert!(header_intact(&l) && header_intact(&r));
            let mut rn = NodeMut::new(&mut r).unwrap();
            assert!(sep.as_slice() < &i.to_be_bytes()[..]);
            rn.insert(&i.to_be_bytes(), &[0u8; 120]).unwrap();
        }
    }

    #[test]
    fn random_inserts_split_in_the_middle() {
        let mut p = leaf(4096, None, None);
        let mut n = NodeMut::new(&mut p).unwrap();
        let mut x = 12345u64;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if n.as_node().get(&x.to_be_bytes()).is_some() {
                continue;
            }
            if n.insert(&x.to_be_bytes(), &[1u8; 50]).is_err() {
                break;
            }
        }
        let before = entries(&p);
        let (mut l, mut r) = (page(4096), page(4096));
        split(&p, &mut l, &mut r).unwrap();
        let (fl, fr) = (
            Node::new(&l).unwrap().fill_factor(),
            Node::new(&r).unwrap().fill_factor(),
        );
        assert!((fl - fr).abs() < 0.1, "{fl} {fr}");
        let mut after = entries(&l);
        after.extend(entries(&r));
        assert_eq!(before, after);
    }

    /// Structure changes of nodes that fail `check` (forged with a valid
    /// checksum: the header check passes them) return errors: merging a
    /// leaf with an inner node asserted, and a split or cut of a leaf
    /// whose prefix length its fences do not share indexed past its keys
    /// (a review's finding).
    #[test]
    fn structure_changes_of_unsound_nodes_are_errors_not_panics() {
        let mut l = leaf(4096, Some(b"k1"), Some(b"k5"));
        let mut r = page(4096);
        init(&mut r, false, Some(b"k5"), Some(b"k9"), 77);
        for k in [&b"k2"[..], b"k3", b"k4"] {
            NodeMut::new(&mut l).unwrap().insert(k, k).unwrap();
        }
        let mut m = page(4096);
        assert!(merge(&l, &r, &mut m).is_err());
        // Not adjacent: refused too.
        let far = leaf(4096, Some(b"k7"), Some(b"k9"));
        assert!(merge(&l, &far, &mut m).is_err());
        // The fences share 1 byte ("k"); say 2.
        let mut forged = l.clone();
        wr16(&mut forged[PAGE_HEADER_SIZE..], H_PREFIX, 2);
        assert!(Node::new(&forged).is_ok() && check(&forged).is_err());
        assert!(check_writable(&forged).is_err() && check_writable(&l).is_ok());
        let (mut a, mut b) = (page(4096), page(4096));
        assert_eq!(split(&forged, &mut a, &mut b), Err(SplitError::Damaged));
        assert_eq!(
            split_at(&forged, 1, &mut a, &mut b),
            Err(SplitError::Damaged)
        );
        assert!(cut_leaf(&mut forged, b"k3", |_| false).is_err());
        assert!(merge(&forged, &leaf(4096, Some(b"k5"), None), &mut m).is_err());
    }

    #[test]
    fn merge_small_siblings() {
        let mut l = leaf(4096, None, Some(b"k5"));
        let mut r = leaf(4096, Some(b"k5"), Some(b"k9"));
        for k in [&b"k1"[..], b"k3", b"k5"] {
            NodeMut::new(&mut l).unwrap().insert(k, k).unwrap();
        }
        for k in [&b"k6"[..], b"k8", b"k9"] {
            NodeMut::new(&mut r).unwrap().insert(k, k).unwrap();
        }
        let mut m = page(4096);
        merge(&l, &r, &mut m).unwrap();
        check(&m).unwrap();
        assert!(header_intact(&m));
        let mut want = entries(&l);
        want.extend(entries(&r));
        assert_eq!(entries(&m), want);
        let mn = Node::new(&m).unwrap();
        assert_eq!(
            (mn.lower_fence(), mn.upper_fence()),
            (None, Some(&b"k9"[..]))
        );
        // Too big to merge: Full, output untouched.
        let mut big_l = leaf(4096, None, Some(b"k5"));
        let mut big_r = leaf(4096, Some(b"k5"), None);
        NodeMut::new(&mut big_l)
            .unwrap()
            .insert(b"k1", &[0u8; 1000])
            .unwrap();
        NodeMut::new(&mut big_l)
            .unwrap()
            .insert(b"k2", &[0u8; 1000])
            .unwrap();
        NodeMut::new(&mut big_r)
            .unwrap()
            .insert(b"k6", &[0u8; 1000])
            .unwrap();
        NodeMut::new(&mut big_r)
            .unwrap()
            .insert(b"k7", &[0u8; 1000])
            .unwrap();
        let mut out = page(4096);
        assert_eq!(merge(&big_l, &big_r, &mut out), Err(Full));
        assert!(out[PAGE_HEADER_SIZE..].iter().all(|&b| b == 0));
    }

    /// The empty key with an empty value is an entry of no bytes. The
    /// first version put it at the heap start of the moment, where the
    /// removal of the entry sharing that offset left it below the heap
    /// (`check` then called the page corrupt; found by `model`).
    #[test]
    fn an_entry_of_no_bytes_stays_valid_whatever_moves_around_it() {
        let mut p = leaf(4096, None, None);
        let mut n = NodeMut::new(&mut p).unwrap();
        n.insert(b"b", &[7; 70]).unwrap();
        n.insert(b"", b"").unwrap();
        n.insert(b"c", &[8; 30]).unwrap();
        assert!(n.remove(b"b"));
        assert_eq!(check(&p), Ok(()));
        let mut n = NodeMut::new(&mut p).unwrap();
        // Grown and shrunk back to nothing in place, then compacted.
        n.update(b"", &[1; 20]).unwrap();
        n.update(b"", b"").unwrap();
        assert_eq!(check(&p), Ok(()));
        NodeMut::new(&mut p).unwrap().compact();
        assert_eq!(check(&p), Ok(()));
        let node = Node::new(&p).unwrap();
        assert_eq!(node.get_entry(b""), Some((&b""[..], false)));
        assert_eq!(node.get_entry(b"c"), Some((&[8u8; 30][..], false)));
        // A page of the first version (the entry below the heap) checks.
        let mut n = NodeMut::new(&mut p).unwrap();
        let heap = n.as_node().heap_start();
        n.set_slot(0, S_OFF, heap - 40);
        assert_eq!(check(&p), Ok(()));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Key, value, marked as a large-value reference.
        Insert(Vec<u8>, Vec<u8>, bool),
        Update(Vec<u8>, Vec<u8>, bool),
        Remove(Vec<u8>),
    }

    fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(
                prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xff)],
                0..7
            ),
            proptest::collection::vec(any::<u8>(), 0..40),
        ]
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        let val = proptest::collection::vec(any::<u8>(), 0..300);
        prop_oneof![
            3 => (key_strategy(), val.clone(), any::<bool>()).prop_map(|(k, v, r)| Op::Insert(k, v, r)),
            1 => (key_strategy(), val, any::<bool>()).prop_map(|(k, v, r)| Op::Update(k, v, r)),
            1 => key_strategy().prop_map(Op::Remove),
        ]
    }

    /// Sets the reference mark of `key` (present) in the node.
    fn mark(n: &mut NodeMut<'_>, key: &[u8], is_ref: bool) {
        let (i, found) = n.as_node().lower_bound(key);
        assert!(found);
        n.set_ref_at(i, is_ref);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Inserts, updates (with and without the reference mark) and
        /// removes against a `BTreeMap` model: same entries, same marks,
        /// and `check` passes after every step (compaction included).
        #[test]
        fn model(ops in proptest::collection::vec(op_strategy(), 1..300), fenced in any::<bool>()) {
            // Fenced: every key gets a long shared prefix inside the fences.
            let pre: &[u8] = if fenced { b"tenant/0042/orders/" } else { b"" };
            let upper = [pre, &[0xff, 0xff]].concat();
            let mut p = if fenced { leaf(4096, Some(pre), Some(&upper)) } else { leaf(4096, None, None) };
            let mut model: BTreeMap<Vec<u8>, (Vec<u8>, bool)> = BTreeMap::new();
            for op in ops {
                let mut n = NodeMut::new(&mut p).unwrap();
                match op {
                    Op::Insert(k, v, r) => {
                        let k = [pre, &k].concat();
                        if !n.as_node().covers(&k) { continue; }
                        if model.contains_key(&k) {
                            continue;
                        }
                        if n.insert(&k, &v).is_ok() {
                            mark(&mut n, &k, r);
                            model.insert(k, (v, r));
                        }
                    }
                    Op::Update(k, v, r) => {
                        let k = [pre, &k].concat();
                        match n.update(&k, &v) {
                            Ok(found) => {
                                prop_assert_eq!(found, model.contains_key(&k));
                                if found {
                                    mark(&mut n, &k, r);
                                    model.insert(k, (v, r));
                                }
                            }
                            Err(Full) => prop_assert!(model.contains_key(&k)),
                        }
                    }
                    Op::Remove(k) => {
                        let k = [pre, &k].concat();
                        prop_assert_eq!(n.remove(&k), model.remove(&k).is_some());
                    }
                }
                prop_assert_eq!(check(&p), Ok(()));
                let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
                prop_assert_eq!(entries(&p), want);
                let node = Node::new(&p).unwrap();
                for (k, (v, r)) in &model {
                    prop_assert_eq!(node.get_entry(k), Some((&v[..], *r)));
                }
                prop_assert!(header_intact(&p));
            }
        }

        /// `range` selects exactly the entries a filter over every key
        /// selects, for bounds on, between and outside the stored keys.
        #[test]
        fn range_matches_a_filter(
            keys in proptest::collection::btree_set(key_strategy(), 0..80),
            bounds in proptest::collection::vec((key_strategy(), 0u8..3, key_strategy(), 0u8..3), 1..20),
            fenced in any::<bool>(),
        ) {
            let pre: &[u8] = if fenced { b"tenant/0042/orders/" } else { b"" };
            let upper = [pre, &[0xff, 0xff]].concat();
            let mut p = if fenced { leaf(4096, Some(pre), Some(&upper)) } else { leaf(4096, None, None) };
            let mut n = NodeMut::new(&mut p).unwrap();
            for k in &keys {
                let k = [pre, k].concat();
                if n.as_node().covers(&k) && n.insert(&k, b"v").is_err() {
                    break;
                }
            }
            let node = Node::new(&p).unwrap();
            let stored: Vec<Vec<u8>> = (0..node.len()).map(|i| node.key_vec_at(i)).collect();
            let bound = |k: &[u8], kind: u8, prefixed: bool| -> Bound<Vec<u8>> {
                // Unprefixed bounds fall outside a fenced node's keys.
                let k = if prefixed { [pre, k].concat() } else { k.to_vec() };
                match kind {
                    0 => Bound::Included(k),
                    1 => Bound::Excluded(k),
                    _ => Bound::Unbounded,
                }
            };
            for (i, (lo, lk, hi, hk)) in bounds.iter().enumerate() {
                let lower = bound(lo, *lk, i % 4 != 1);
                let upper = bound(hi, *hk, i % 4 != 2);
                let want: Vec<usize> = (0..stored.len())
                    .filter(|&j| std::ops::RangeBounds::contains(&(lower.as_ref(), upper.as_ref()), &stored[j]))
                    .collect();
                let got: Vec<usize> = node
                    .range(lower.as_ref().map(|k| k.as_slice()), upper.as_ref().map(|k| k.as_slice()))
                    .collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Fills a node of `size` bytes with `keys` (under `pre`, inside fences
    /// around `pre`) until full; returns the page.
    fn filled(
        size: usize,
        leaf_node: bool,
        pre: &[u8],
        keys: &[Vec<u8>],
        val_len: usize,
    ) -> Vec<u8> {
        let lower = pre.to_vec();
        let upper = [pre, &[0xff; 3]].concat();
        let mut p = page(size);
        let (lo, up) = if pre.is_empty() {
            (None, None)
        } else {
            (Some(&lower[..]), Some(&upper[..]))
        };
        init(&mut p, leaf_node, lo, up, if leaf_node { 0 } else { 7 });
        let mut n = NodeMut::new(&mut p).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let k = [pre, k].concat();
            if !n.as_node().covers(&k) || n.as_node().lower_bound(&k).1 {
                continue;
            }
            let payload = if leaf_node {
                vec![i as u8; val_len]
            } else {
                (i as u64).to_le_bytes().to_vec()
            };
            if n.insert(&k, &payload).is_err() {
                break;
            }
            if leaf_node && i % 3 == 0 {
                mark(&mut n, &k, true);
            }
        }
        p
    }

    /// The reference mark of every entry, in key order.
    fn marks(p: &[u8]) -> Vec<bool> {
        let n = Node::new(p).unwrap();
        (0..n.len()).map(|i| n.is_ref_at(i)).collect()
    }

    /// Walks every reading function over a node that passed `check`.
    fn read_everything(p: &[u8]) {
        let n = Node::new(p).unwrap();
        let mut k = Vec::new();
        for i in 0..n.len() {
            n.key_at(i, &mut k);
            let _ = n.payload_at(i);
            let _ = n.head_at(i);
            assert_eq!(n.lower_bound(&k), (i, true));
            if n.is_leaf() {
                assert!(n.get(&k).is_some());
            } else {
                let _ = n.child_for(&k);
                let _ = n.child_at(i);
            }
        }
        let _ = (
            n.free_space(),
            n.free_space_after_compaction(),
            n.fill_factor(),
        );
        let _ = (
            n.lower_fence(),
            n.upper_fence(),
            n.prefix(),
            n.upper_child(),
        );
        let _ = n.lower_bound(b"");
        let _ = n.lower_bound(&[0xff; 9]);
    }

    /// A cut whose new fence makes a full leaf overflow leaves out only the
    /// keys it may drop (those recovery re-applies), and fails, changing
    /// nothing, when that is not enough.
    #[test]
    fn a_cut_that_does_not_fit_drops_only_droppable_keys() {
        let mut p = leaf(4096, None, None);
        let mut n = NodeMut::new(&mut p).unwrap();
        let mut i = 0u64;
        while n.insert(&i.to_be_bytes(), &[7u8; 100]).is_ok() {
            i += 1;
        }
        let all = entries(&p);
        let fence = vec![0xffu8; 200];
        let mut q = p.clone();
        assert!(cut_leaf(&mut q, &fence, |_| false).is_err());
        assert_eq!(q, p, "a failed cut changes nothing");
        let odd = |k: &[u8]| k[7] % 2 == 1;
        let left_out = cut_leaf(&mut q, &fence, |k| !odd(k)).unwrap();
        assert_eq!(
            left_out,
            all.len() - all.iter().filter(|(k, _)| odd(k)).count()
        );
        assert_eq!(check(&q), Ok(()));
        let kept: Vec<_> = all.iter().filter(|(k, _)| odd(k)).cloned().collect();
        assert_eq!(entries(&q), kept);
        assert_eq!(Node::new(&q).unwrap().upper_fence(), Some(&fence[..]));
        // Room enough: nothing is dropped, droppable or not.
        let mut r = p.clone();
        let mid = (i / 2).to_be_bytes();
        assert_eq!(cut_leaf(&mut r, &mid, |_| true).unwrap(), 0);
        let below: Vec<_> = all
            .iter()
            .filter(|(k, _)| k[..] <= mid[..])
            .cloned()
            .collect();
        assert_eq!(entries(&r), below);
    }

    fn split_keys() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b')], 0..12),
                proptest::collection::vec(any::<u8>(), 0..30),
            ],
            2..400,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn split_and_merge_keep_every_entry(
            keys in split_keys(),
            leaf_node in any::<bool>(),
            long_prefix in any::<bool>(),
            val_len in 0usize..200,
            big in any::<bool>(),
        ) {
            let size = if big { 65536 } else { 4096 };
            let pre: &[u8] = if long_prefix { b"a much longer shared key prefix/" } else { b"" };
            let p = filled(size, leaf_node, pre, &keys, val_len);
            let src = Node::new(&p).unwrap();
            prop_assume!(src.len() >= 2);
            let before = entries(&p);
            let (mut l, mut r) = (page(size), page(size));
            let sep = split(&p, &mut l, &mut r).unwrap();
            prop_assert_eq!(check(&l), Ok(()));
            prop_assert_eq!(check(&r), Ok(()));
            prop_assert!(header_intact(&l) && header_intact(&r));
            let (ln, rn) = (Node::new(&l).unwrap(), Node::new(&r).unwrap());
            prop_assert_eq!(ln.lower_fence(), src.lower_fence());
            prop_assert_eq!(ln.upper_fence(), Some(&sep[..]));
            prop_assert_eq!(rn.lower_fence(), Some(&sep[..]));
            prop_assert_eq!(rn.upper_fence(), src.upper_fence());
            prop_assert!(src.covers(&sep));
            let (le, re) = (entries(&l), entries(&r));
            prop_assert!(le.iter().all(|(k, _)| k <= &sep));
            prop_assert!(re.iter().all(|(k, _)| k > &sep));
            if leaf_node {
                // The separator is the shortest key between the halves.
                let a = &le.last().unwrap().0;
                let b = &re.first().unwrap().0;
                prop_assert_eq!(&sep, &shortest_separator(a, b));
                prop_assert_eq!([le.clone(), re.clone()].concat(), before.clone());
                // Reference marks travel with their entries.
                prop_assert_eq!([marks(&l), marks(&r)].concat(), marks(&p));
            } else {
                // The separator entry moved up; its child is left's upper.
                let mid = (sep.clone(), ln.upper_child().to_le_bytes().to_vec());
                prop_assert_eq!([le.clone(), vec![mid], re.clone()].concat(), before.clone());
                prop_assert_eq!(rn.upper_child(), 7);
            }
            // Every original key routes to the half that holds it.
            for (k, _) in &before {
                let covered = if k <= &sep { ln.covers(k) } else { rn.covers(k) };
                prop_assert!(covered);
            }
            // Merge back: the union, when it fits (it did before the split).
            let mut m = page(size);
            merge(&l, &r, &mut m).unwrap();
            prop_assert_eq!(check(&m), Ok(()));
            prop_assert_eq!(entries(&m), before);
            if leaf_node {
                prop_assert_eq!(marks(&m), marks(&p));
            }
        }

        #[test]
        fn a_cut_is_the_left_half_of_a_split(
            keys in split_keys(),
            long_prefix in any::<bool>(),
            val_len in 0usize..200,
        ) {
            let pre: &[u8] = if long_prefix { b"a much longer shared key prefix/" } else { b"" };
            let p = filled(4096, true, pre, &keys, val_len);
            prop_assume!(Node::new(&p).unwrap().len() >= 2);
            let (mut l, mut r) = (page(4096), page(4096));
            let sep = split(&p, &mut l, &mut r).unwrap();
            let mut c = p.clone();
            cut_leaf(&mut c, &sep, |_| false).unwrap();
            prop_assert_eq!(check(&c), Ok(()));
            prop_assert!(header_intact(&c));
            prop_assert_eq!(entries(&c), entries(&l));
            prop_assert_eq!(marks(&c), marks(&l));
            let (cn, ln) = (Node::new(&c).unwrap(), Node::new(&l).unwrap());
            prop_assert_eq!(cn.lower_fence(), ln.lower_fence());
            prop_assert_eq!(cn.upper_fence(), Some(&sep[..]));
            // A fence that is not strictly inside is refused, page untouched.
            let mut d = p.clone();
            let src = Node::new(&p).unwrap();
            if let Some(u) = src.upper_fence() {
                let u = u.to_vec();
                prop_assert!(cut_leaf(&mut d, &u, |_| false).is_err());
            }
            if let Some(lo) = src.lower_fence() {
                let lo = lo.to_vec();
                prop_assert!(cut_leaf(&mut d, &lo, |_| false).is_err());
            }
            prop_assert_eq!(d, p);
        }

        #[test]
        fn corrupt_bytes_never_panic(
            keys in split_keys(),
            leaf_node in any::<bool>(),
            long_prefix in any::<bool>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let pre: &[u8] = if long_prefix { b"prefix/" } else { b"" };
            let mut p = filled(4096, leaf_node, pre, &keys, 20);
            prop_assert_eq!(check(&p), Ok(()));
            for (at, byte) in flips {
                let at = PAGE_HEADER_SIZE + at.index(p.len() - PAGE_HEADER_SIZE);
                p[at] ^= byte | 1;
            }
            if check_writable(&p).is_ok() {
                // What the write path does to a page that passed the
                // write check (its answers may be wrong, with keys out of
                // order or entries overlapping, but nothing panics; an
                // insert's debug assertions of key order are left out).
                let mut c = p.clone();
                let n = Node::new(&c).unwrap();
                let (len, leaf) = (n.len(), n.is_leaf());
                let mut m = NodeMut::new(&mut c).unwrap();
                if leaf && len > 0 {
                    let _ = m.update_at(0, b"updated");
                }
                if len > 1 {
                    m.remove_at(1);
                }
                m.compact();
            }
            if check(&p).is_ok() {
                prop_assert_eq!(check_writable(&p), Ok(()));
                read_everything(&p);
                // A page that passed check also takes writes and splits.
                let mut c = p.clone();
                NodeMut::new(&mut c).unwrap().compact();
                prop_assert_eq!(check(&c), Ok(()));
                if Node::new(&p).unwrap().len() >= 2 {
                    let (mut l, mut r) = (page(4096), page(4096));
                    let _ = split(&p, &mut l, &mut r);
                }
            }
        }

        #[test]
        fn header_fields_fuzzed_never_panic(field in 0usize..NODE_HEADER_SIZE, byte in any::<u8>(), leaf_node in any::<bool>()) {
            let keys: Vec<Vec<u8>> = (0u16..50).map(|i| i.to_be_bytes().to_vec()).collect();
            let mut p = filled(4096, leaf_node, b"k", &keys, 10);
            p[PAGE_HEADER_SIZE + field] = byte;
            if check(&p).is_ok() {
                read_everything(&p);
            }
        }
    }
}
