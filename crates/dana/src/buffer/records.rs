//! The record cache: hot records (a tree's key and its small value) kept
//! in DRAM beside the pool, so that a skewed read finds its record
//! without the leaf it lives on.
//!
//! *Why.* Keys spread by hashing (YCSB's, or any hashed or random key)
//! put every hot record in a leaf of ~28 mostly cold ones, and the pool
//! spends a whole page frame to keep one hot record. Under zipfian reads
//! of 10M records with a pool of 10% of the data, the pool holds the
//! leaves of roughly the hottest 34k records and every read misses 0.4
//! times; the same memory as records (~180 bytes each) holds the hottest
//! few hundred thousand. The idea is the 2-Tree's (Zhou, Leis et al.,
//! CIDR 2023: a second, small tree for hot records); dana keeps a cache
//! instead of migrating records: nothing here is ever the only copy, so
//! nothing here is logged, recovered or written back.
//!
//! Owns: per shard, an index from a key's hash to its slot, the slots
//! (tree, key, value, the leaf's GSN at the read, a referenced bit), a
//! clock hand over the slots, the bytes they take, and generation
//! counters per bucket of hashes.
//!
//! Coherence, the invariant the trees rely on (a cached value is the
//! tree's value):
//! - A writer of a key (`BTree::write_entry`, `update`, `delete`, each
//!   latching its leaf through `BTree::leaf_exclusive`, which does it) calls
//!   `RecordCache::invalidate` while it holds the leaf's exclusive
//!   latch: the entry goes, and the generation of the key's bucket moves.
//! - A reader that misses gets a `Ticket` holding that generation, then
//!   reads the leaf (latched shared, so after any writer that latched it
//!   before), then fills with the ticket. `RecordCache::fill` drops the
//!   value if the generation moved in between: a writer may have changed
//!   the key after the reader's read.
//! - So an entry is inserted only with a value read after the last
//!   invalidation of its key, and every later change of the key removes
//!   it. Both sides take the shard's mutex, which orders them.
//! - A tree's pages freed (`BTree::destroy`) clear everything: the root
//!   that names a tree here may name another one later.
//!
//! Costs: one hash (SipHash of the key) and one uncontended mutex per
//! lookup; a hit copies the value out. Memory: within the budget given at
//! open (`Options::record_cache_bytes`, taken from nothing else: the
//! caller sizes the pool and the cache together), counted as each shard's
//! allocations are: its slot vector and index at their capacity, each
//! key's and value's box rounded up as an allocator would
//! (`box_cost`), and the doorkeeper. A structure grows only if the
//! grown size fits; else an entry goes to make room. About
//! [`ENTRY_OVERHEAD`] bytes per entry beyond its key and value.
//!
//! Never: holds a large value's reference (only values stored in the
//! leaf, up to [`RecordCache::max_value`]), does I/O, or runs a caller's
//! code under a shard's lock.

use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use crate::stats::StripedCounter;

/// Bytes an entry of a small key and value takes beyond them, about: its
/// slot (`SLOT_BYTES`, and up to a quarter more of the slot vector's
/// growth slack), its index bucket (8 bytes at a load of 3/8 to 3/4)
/// and its two boxes' rounding (`box_cost`: up to ~64). Not what the
/// budget is enforced with: each shard counts its real capacities.
/// (A first version counted 96 bytes per entry and nothing else: a review
/// found the cache ~40% above its budget; a later one, with 160, found it
/// 13% above with small records: the hash map's and the slot vector's
/// doubling, and the map's tombstones doubling it again.)
pub const ENTRY_OVERHEAD: usize = 160;
/// An entry's slot in the slot vector.
const SLOT_BYTES: usize = std::mem::size_of::<Option<Entry>>();
/// An index bucket: the low 32 bits of an entry's hash over its slot
/// number, or [`EMPTY`].
const BUCKET_BYTES: usize = std::mem::size_of::<u64>();
/// A free-list entry: a slot number.
const FREE_BYTES: usize = std::mem::size_of::<u32>();
/// An empty index bucket.
const EMPTY: u64 = u64::MAX;
/// The fewest slots and buckets a shard allocates at once.
const MIN_SLOTS: usize = 4;
const MIN_BUCKETS: usize = 8;
/// Generation counters per shard (the key's hash picks one): a write
/// drops only the fills of the keys that share its bucket.
const BUCKETS: usize = 16;
/// A shard per this many bytes of budget (at least one, at most
/// [`MAX_SHARDS`]): shards keep the mutexes uncontended on many cores,
/// and each must hold enough entries for its clock to choose among.
const SHARD_BYTES: usize = 256 << 10;
/// The smallest budget that makes a cache: below it a shard's own
/// structures would take most of it.
pub const MIN_BUDGET: usize = 4 << 10;
const MAX_SHARDS: usize = 1024;
// The shard's bits (48..) stay below the bucket's (60..).
const _: () = assert!(MAX_SHARDS.is_power_of_two() && MAX_SHARDS <= 1 << 12);

/// A reader's proof of which invalidations it saw before its read
/// ([`RecordCache::lookup`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    hash: u64,
    generation: u64,
}

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// The record's value, and the GSN of its leaf when it was read (at
    /// least the GSN of the change that wrote the value).
    Hit(Vec<u8>, u64),
    /// Not cached: read the tree, then `RecordCache::fill` with this.
    Miss(Ticket),
    /// The cache has no budget.
    Off,
}

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordCacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that went to the tree.
    pub misses: u64,
    /// Records entered.
    pub fills: u64,
    /// Records dropped by writers' invalidations.
    pub invalidations: u64,
    /// Records held now.
    pub entries: u64,
    /// What the cache takes from the allocator: the entries' boxes, the
    /// shards' vectors at their capacity (see the module comment).
    pub bytes: u64,
    /// The budget.
    pub budget: u64,
}

struct Entry {
    hash: u64,
    root: u64,
    key: Box<[u8]>,
    value: Box<[u8]>,
    gsn: u64,
    referenced: bool,
}

impl Entry {
    fn bytes(&self) -> usize {
        entry_bytes(self.key.len(), self.value.len())
    }

    fn is(&self, root: u64, key: &[u8]) -> bool {
        self.root == root && *self.key == *key
    }
}

fn entry_bytes(key: usize, value: usize) -> usize {
    box_cost(key) + box_cost(value)
}

/// What a vector's buffer of `bytes` takes from glibc's malloc (its header
/// and rounding). mimalloc, the command's allocator, rounds a large block
/// up to a size class at most a quarter larger: there the vectors can take
/// up to that much more.
fn vec_cost(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        bytes + 24
    }
}

/// What a boxed slice of `len` bytes takes from the allocator, an upper
/// estimate for glibc's malloc (an 8-byte header, 16-byte rounding, 32
/// bytes at least) and for mimalloc's (size classes up to a quarter
/// apart), the allocators dana runs under. An empty box allocates nothing.
fn box_cost(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + len / 4 + 16).max(32)
    }
}

#[derive(Default)]
struct Shard {
    /// Hash -> slot: open addressing with linear probing from the hash's
    /// low bits, a power of two of buckets, at most 3/4 full, each
    /// [`EMPTY`] or the low 32 bits of the hash over the slot number (so a
    /// probe reads the slots only where those bits match: an index of
    /// slot numbers alone read a slot per probe, and lookups took ~20%
    /// more CPU than with the hash map before it). A removal
    /// shifts the entries after it back (no tombstones: the index never
    /// grows for entries it no longer holds, as a hash map's did). Two
    /// keys with one hash share the slot (the later fill replaces the
    /// earlier: a miss, never a wrong answer, since a hit compares the
    /// key).
    index: Vec<u64>,
    /// Each slot holds an entry (indexed) or is in `free`.
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    hand: usize,
    /// What the entries' boxes take ([`entry_bytes`]).
    bytes: usize,
    generations: [u64; BUCKETS],
    /// The doorkeeper: one bit per hash (modulo its length) of the keys
    /// that missed since it was last cleared. A key enters on its second
    /// miss, so the many records read once (the tail of a skewed
    /// workload) do not push out the ones read again.
    seen: Vec<u64>,
    seen_count: usize,
}

impl Shard {
    fn new(door_words: usize) -> Shard {
        Shard {
            seen: vec![0; door_words],
            ..Shard::default()
        }
    }

    fn bucket(hash: u64) -> usize {
        // The shard took bits 48..58: the bucket takes the top ones.
        (hash >> 60) as usize % BUCKETS
    }

    /// True if `hash` missed before (since the doorkeeper was cleared):
    /// its record may enter. Else remembers it, clearing the doorkeeper
    /// once half its bits are set (so it forgets the old misses).
    fn admit(&mut self, hash: u64) -> bool {
        if self.seen.is_empty() {
            return true;
        }
        let bits = self.seen.len() * 64;
        let bit = (hash >> 24) as usize % bits;
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        if self.seen[word] & mask != 0 {
            return true;
        }
        self.seen[word] |= mask;
        self.seen_count += 1;
        if self.seen_count * 2 >= bits {
            self.seen.iter_mut().for_each(|w| *w = 0);
            self.seen_count = 0;
        }
        false
    }

    /// Entries held (each indexed): the slots not free.
    fn held(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// What the shard takes from the allocator: its entries' boxes, its
    /// vectors at their capacity, its doorkeeper.
    fn heap(&self) -> usize {
        self.bytes
            + vec_cost(self.slots.capacity() * SLOT_BYTES)
            + vec_cost(self.index.capacity() * BUCKET_BYTES)
            + vec_cost(self.free.capacity() * FREE_BYTES)
            + vec_cost(self.seen.capacity() * 8)
    }

    /// The bucket a hash probes from: its low bits (the shard and the
    /// generation bucket took the high ones), which its tag keeps.
    fn home(&self, hash: u64) -> usize {
        (hash as u32) as usize & (self.index.len() - 1)
    }

    fn index_entry(hash: u64, slot: u32) -> u64 {
        (u64::from(hash as u32) << 32) | u64::from(slot)
    }

    fn slot_of(bucket: u64) -> u32 {
        bucket as u32
    }

    /// The low 32 bits of the hash of the entry in `bucket`.
    fn tag_of(bucket: u64) -> u64 {
        bucket >> 32
    }

    /// The slot indexed under `hash`.
    fn find(&self, hash: u64) -> Option<u32> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.index.len() - 1;
        let mut b = self.home(hash);
        // Bounded: the index always has an empty bucket (at most 3/4 full).
        for _ in 0..self.index.len() {
            let bucket = self.index[b];
            if bucket == EMPTY {
                return None;
            }
            if Self::tag_of(bucket) == u64::from(hash as u32) {
                let slot = Self::slot_of(bucket);
                if self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|e| e.hash == hash)
                {
                    return Some(slot);
                }
            }
            b = (b + 1) & mask;
        }
        None
    }

    /// Indexes `slot` (holding `hash`, already counted as held, not
    /// indexed yet); the index has room (`Shard::insert` grew it first).
    fn index_insert(&mut self, hash: u64, slot: u32) {
        assert!(self.held() * 4 <= self.index.len() * 3);
        let mask = self.index.len() - 1;
        let mut b = self.home(hash);
        while self.index[b] != EMPTY {
            b = (b + 1) & mask;
        }
        self.index[b] = Self::index_entry(hash, slot);
    }

    /// Removes `slot` (holding `hash`) from the index, shifting back the
    /// entries after it that probed past it.
    fn index_remove(&mut self, hash: u64, slot: u32) {
        let mask = self.index.len() - 1;
        let want = Self::index_entry(hash, slot);
        let mut hole = self.home(hash);
        for _ in 0..self.index.len() {
            if self.index[hole] == want {
                break;
            }
            debug_assert_ne!(self.index[hole], EMPTY, "slot {slot} not indexed");
            hole = (hole + 1) & mask;
        }
        assert_eq!(self.index[hole], want, "an entry missing from its index");
        let mut b = hole;
        for _ in 0..self.index.len() {
            b = (b + 1) & mask;
            if self.index[b] == EMPTY {
                break;
            }
            // The entry at `b` may fill the hole if the hole lies on its
            // probe path (between its home and `b`, cyclically).
            let home = self.home(Self::tag_of(self.index[b]));
            if (b.wrapping_sub(home) & mask) >= (b.wrapping_sub(hole) & mask) {
                self.index[hole] = self.index[b];
                hole = b;
            }
        }
        self.index[hole] = EMPTY;
    }

    /// The bytes the vectors would grow by to take one more entry.
    fn growth_for_one_more(&self) -> usize {
        let slots = if self.free.is_empty() && self.slots.len() == self.slots.capacity() {
            Self::slot_growth(self.slots.len()) * (SLOT_BYTES + FREE_BYTES) + 48
        } else {
            0
        };
        let index = if (self.held() + 1) * 4 > self.index.len() * 3 {
            // The old buckets are freed once the new ones are filled.
            self.index.len().max(MIN_BUCKETS / 2) * 2 * BUCKET_BYTES + 24
        } else {
            0
        };
        slots + index
    }

    /// Slots added at once to a full slot vector of `len`: a quarter more
    /// (not a doubling, whose slack a small record's budget would feel).
    fn slot_growth(len: usize) -> usize {
        (len / 4).max(MIN_SLOTS)
    }

    /// Doubles the index, every entry indexed again.
    fn grow_index(&mut self) {
        let buckets = (self.index.len() * 2).max(MIN_BUCKETS);
        self.index = vec![EMPTY; buckets];
        for slot in 0..self.slots.len() {
            if let Some(hash) = self.slots[slot].as_ref().map(|e| e.hash) {
                self.index_insert(hash, slot as u32);
            }
        }
    }

    /// Puts `entry` in a slot and indexes it (its hash not indexed).
    fn insert(&mut self, entry: Entry) {
        if (self.held() + 1) * 4 > self.index.len() * 3 {
            self.grow_index();
        }
        let (hash, size) = (entry.hash, entry.bytes());
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    let more = Self::slot_growth(self.slots.len());
                    self.slots.reserve_exact(more);
                    // Room for every slot in the free list (`reserve_exact`
                    // counts from its length: a review found the list's
                    // capacity lagging, then past the slots', and this
                    // subtraction overflowing after many invalidations).
                    let room = self.slots.capacity().saturating_sub(self.free.len());
                    self.free.reserve_exact(room);
                }
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        self.index_insert(hash, slot);
        self.bytes += size;
    }

    fn remove(&mut self, slot: u32) -> Option<Entry> {
        let e = self.slots[slot as usize].take()?;
        self.index_remove(e.hash, slot);
        self.bytes -= e.bytes();
        // Never reallocates: `free` is as large as `slots`.
        self.free.push(slot);
        Some(e)
    }

    /// Second chance until the shard is within `budget` (or empty).
    fn evict_to(&mut self, budget: usize) {
        // Bounded: each round removes an entry or ends.
        for _ in 0..=self.slots.len() {
            if self.heap() <= budget || !self.evict_one() {
                break;
            }
        }
        debug_assert!(self.heap() <= budget || self.held() == 0);
    }

    /// Removes one entry by second chance: a referenced entry loses its
    /// bit, an unreferenced one goes. False if there is none. Bounded: two
    /// turns of the hand clear every bit and then reach an entry.
    fn evict_one(&mut self) -> bool {
        let n = self.slots.len();
        for _ in 0..2 * n + 1 {
            self.hand = (self.hand + 1) % n.max(1);
            let Some(e) = self.slots.get_mut(self.hand).and_then(Option::as_mut) else {
                continue;
            };
            if std::mem::take(&mut e.referenced) {
                continue;
            }
            self.remove(self.hand as u32);
            return true;
        }
        false
    }
}

/// Hot records beside the pool (see the module comment).
pub struct RecordCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget: usize,
    max_value: usize,
    budget: usize,
    hits: StripedCounter,
    misses: StripedCounter,
    fills: StripedCounter,
    invalidations: StripedCounter,
}

impl RecordCache {
    /// A cache of `budget` bytes holding values of at most `max_value`
    /// bytes (under [`MIN_BUDGET`]: off, every lookup answers
    /// `Lookup::Off`).
    pub fn new(budget: usize, max_value: usize) -> RecordCache {
        let shards = if budget < MIN_BUDGET {
            0
        } else {
            (budget / SHARD_BYTES)
                .clamp(1, MAX_SHARDS)
                .next_power_of_two()
        };
        let per_shard = budget.checked_div(shards).unwrap_or(0);
        // Two doorkeeper bits per record a shard can hold (of a small
        // key and value), taken from its budget.
        let door_words = (per_shard / (ENTRY_OVERHEAD + 32) * 2).div_ceil(64).max(1);
        RecordCache {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::new(door_words)))
                .collect(),
            // The shard itself (its doorkeeper counts in `Shard::heap`).
            shard_budget: per_shard.saturating_sub(vec_cost(std::mem::size_of::<Mutex<Shard>>())),
            max_value,
            budget,
            hits: StripedCounter::default(),
            misses: StripedCounter::default(),
            fills: StripedCounter::default(),
            invalidations: StripedCounter::default(),
        }
    }

    /// True if the cache has a budget.
    pub fn is_on(&self) -> bool {
        !self.shards.is_empty()
    }

    /// The largest value cached.
    pub fn max_value(&self) -> usize {
        self.max_value
    }

    fn hash(root: u64, key: &[u8]) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        root.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        // A power of two: bits 48.. pick the shard (at most 1,024 shards:
        // below the bucket's bits 60..64). Not the low bits: the shard's
        // index (hashbrown) starts its probe at the hash's low bits, and
        // every key of a shard sharing them left a shard of 2,600 entries
        // in 4,096 buckets 4 places to start from (a review's finding).
        let i = (hash >> 48) as usize & (self.shards.len() - 1);
        // A panic under the lock leaves a shard whose entries are whole
        // (no method panics midway through a change): keep using it.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached value of `key` in the tree at `root`, or a ticket to
    /// fill it with after reading the tree.
    pub(crate) fn lookup(&self, root: u64, key: &[u8]) -> Lookup {
        if !self.is_on() {
            return Lookup::Off;
        }
        let hash = Self::hash(root, key);
        let mut s = self.shard(hash);
        if let Some(slot) = s.find(hash) {
            if let Some(e) = s.slots[slot as usize].as_mut().filter(|e| e.is(root, key)) {
                e.referenced = true;
                let hit = Lookup::Hit(e.value.to_vec(), e.gsn);
                drop(s);
                self.hits.add(1);
                return hit;
            }
        }
        let generation = s.generations[Shard::bucket(hash)];
        drop(s);
        self.misses.add(1);
        Lookup::Miss(Ticket { hash, generation })
    }

    /// Enters `key` -> `value` (read from the tree at `root` after
    /// `ticket` was taken, in a leaf whose GSN was `gsn`), unless a writer
    /// invalidated the key's bucket since, or the value is too large.
    pub(crate) fn fill(&self, ticket: Ticket, root: u64, key: &[u8], value: &[u8], gsn: u64) {
        let size = entry_bytes(key.len(), value.len());
        if !self.is_on() || value.len() > self.max_value || size > self.shard_budget {
            return;
        }
        debug_assert_eq!(ticket.hash, Self::hash(root, key));
        let mut s = self.shard(ticket.hash);
        if s.generations[Shard::bucket(ticket.hash)] != ticket.generation {
            return;
        }
        // A record that would not fit even with every entry evicted (the
        // vectors never shrink) is refused before any entry goes for it (a
        // review saw one empty a shard of 425 entries, then be refused).
        let structures = s.heap() - s.bytes;
        let must_grow = if s.held() == 0 {
            s.growth_for_one_more()
        } else {
            0
        };
        if structures + size + must_grow > self.shard_budget {
            return;
        }
        // While there is room, every record enters; then the doorkeeper.
        let budget = self.shard_budget;
        if s.heap() + size + s.growth_for_one_more() > budget && !s.admit(ticket.hash) {
            return;
        }
        if let Some(slot) = s.find(ticket.hash) {
            s.remove(slot);
        }
        // Room first, so that the vectors grow only where the grown size
        // fits: entries go while the entry and any growth do not fit, and
        // once one went, nothing needs to grow.
        s.evict_to(budget.saturating_sub(size));
        if s.heap() + size + s.growth_for_one_more() > budget {
            // One entry gone leaves a free slot and index room: no growth.
            // None to remove: not even the empty shard takes it.
            if !s.evict_one() || s.heap() + size > budget {
                return;
            }
        }
        s.insert(Entry {
            hash: ticket.hash,
            root,
            key: key.into(),
            value: value.into(),
            gsn,
            referenced: false,
        });
        debug_assert!(s.heap() <= budget, "{} of {budget}", s.heap());
        drop(s);
        self.fills.add(1);
    }

    /// Drops `key` of the tree at `root`, and every fill of its bucket
    /// whose ticket was taken before. Call it holding the key's leaf
    /// latched exclusively, whether or not the write then changes it.
    pub(crate) fn invalidate(&self, root: u64, key: &[u8]) {
        if !self.is_on() {
            return;
        }
        let hash = Self::hash(root, key);
        let mut s = self.shard(hash);
        s.generations[Shard::bucket(hash)] += 1;
        let Some(slot) = s.find(hash) else {
            return;
        };
        // Same hash, another key: it goes too (a miss later, no harm).
        s.remove(slot);
        drop(s);
        self.invalidations.add(1);
    }

    /// Drops every entry and every fill in flight.
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            for g in s.generations.iter_mut() {
                *g += 1;
            }
            let generations = s.generations;
            *s = Shard {
                generations,
                ..Shard::new(s.seen.len())
            };
        }
    }

    /// The counters, and what the cache holds now.
    pub fn stats(&self) -> RecordCacheStats {
        let (mut entries, mut bytes) = (0u64, 0u64);
        for shard in self.shards.iter() {
            let s = shard.lock().unwrap_or_else(|e| e.into_inner());
            entries += s.held() as u64;
            bytes += (s.heap() + vec_cost(std::mem::size_of::<Mutex<Shard>>())) as u64;
        }
        RecordCacheStats {
            hits: self.hits.get(),
            misses: self.misses.get(),
            fills: self.fills.get(),
            invalidations: self.invalidations.get(),
            entries,
            bytes,
            budget: self.budget as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn get(c: &RecordCache, root: u64, key: &[u8]) -> Option<Vec<u8>> {
        match c.lookup(root, key) {
            Lookup::Hit(v, _) => Some(v),
            _ => None,
        }
    }

    /// Reads that miss and fill until the record is in, at most twice
    /// (once the shard is full, a record enters at its second miss).
    fn read_and_fill(c: &RecordCache, root: u64, key: &[u8], value: &[u8]) {
        for _ in 0..2 {
            let Lookup::Miss(t) = c.lookup(root, key) else {
                return;
            };
            c.fill(t, root, key, value, 7);
        }
    }

    #[test]
    fn a_filled_record_is_found_with_its_gsn_and_a_write_drops_it() {
        let c = RecordCache::new(1 << 20, 512);
        let Lookup::Miss(t) = c.lookup(1, b"k") else {
            panic!("a fresh cache missed nothing")
        };
        // Room left: the first miss enters.
        c.fill(t, 1, b"k", b"v", 7);
        match c.lookup(1, b"k") {
            Lookup::Hit(v, gsn) => assert_eq!((v.as_slice(), gsn), (&b"v"[..], 7)),
            other => panic!("{other:?}"),
        }
        // Another tree's key of the same bytes is another record.
        assert_eq!(get(&c, 2, b"k"), None);
        c.invalidate(1, b"k");
        assert_eq!(get(&c, 1, b"k"), None);
        let s = c.stats();
        assert_eq!((s.hits, s.fills, s.invalidations), (1, 1, 1));
    }

    #[test]
    fn a_fill_whose_read_raced_a_write_is_dropped() {
        let c = RecordCache::new(1 << 20, 512);
        // The reader takes its ticket, a writer changes the key, and the
        // reader's (old) value comes back: it must not enter.
        let Lookup::Miss(t) = c.lookup(1, b"k") else {
            panic!("a fresh cache missed nothing")
        };
        c.invalidate(1, b"k");
        c.fill(t, 1, b"k", b"old", 1);
        assert_eq!(get(&c, 1, b"k"), None);
        // A ticket taken after the write fills.
        read_and_fill(&c, 1, b"k", b"new");
        assert_eq!(get(&c, 1, b"k"), Some(b"new".to_vec()));
        // Clearing drops entries and the fills in flight.
        let Lookup::Miss(t) = c.lookup(1, b"other") else {
            panic!("never filled")
        };
        c.clear();
        c.fill(t, 1, b"other", b"x", 1);
        assert_eq!(get(&c, 1, b"k"), None);
        assert_eq!(get(&c, 1, b"other"), None);
    }

    #[test]
    fn once_full_a_record_enters_at_its_second_miss() {
        let c = RecordCache::new(8 << 10, 512);
        let value = [1u8; 64];
        for i in 0u64..200 {
            read_and_fill(&c, 1, &i.to_be_bytes(), &value);
        }
        let s = c.stats();
        // Within an entry and the slot vector's next growth of the budget.
        assert!(s.bytes + 128 + 5 * 72 > s.budget, "not full: {s:?}");
        let fill_once = |k: &[u8]| {
            if let Lookup::Miss(t) = c.lookup(1, k) {
                c.fill(t, 1, k, &value, 1);
            }
        };
        fill_once(b"new");
        assert_eq!(
            get(&c, 1, b"new"),
            None,
            "entered at its first miss into a full shard"
        );
        fill_once(b"new");
        assert_eq!(
            get(&c, 1, b"new"),
            Some(value.to_vec()),
            "refused at its second miss"
        );
    }

    #[test]
    fn an_off_cache_answers_off_and_large_values_stay_out() {
        let off = RecordCache::new(0, 512);
        assert!(matches!(off.lookup(1, b"k"), Lookup::Off));
        let too_small = RecordCache::new(MIN_BUDGET - 1, 512);
        assert!(matches!(too_small.lookup(1, b"k"), Lookup::Off));
        off.invalidate(1, b"k");
        off.clear();
        let c = RecordCache::new(1 << 20, 4);
        read_and_fill(&c, 1, b"k", b"12345");
        assert_eq!(get(&c, 1, b"k"), None);
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_read_again() {
        let budget = 64 << 10;
        let c = RecordCache::new(budget, 512);
        let value = [7u8; 100];
        let hot: Vec<[u8; 8]> = (0u64..20).map(|i| i.to_be_bytes()).collect();
        for round in 0u64..200 {
            for k in &hot {
                read_and_fill(&c, 1, k, &value);
            }
            for i in 0..50u64 {
                read_and_fill(&c, 1, &(1_000_000 + round * 50 + i).to_be_bytes(), &value);
            }
            let s = c.stats();
            assert!(
                s.bytes <= budget as u64,
                "{} bytes held of {budget}",
                s.bytes
            );
        }
        let held = hot.iter().filter(|k| get(&c, 1, &k[..]).is_some()).count();
        assert!(
            held >= 18,
            "{held} of 20 hot records kept among 10,000 cold ones"
        );
    }

    /// The lib tests' allocator: the system's, counting on a thread that
    /// asks ([`measure_heap`]) what its live allocations take as glibc's
    /// malloc lays them out (an 8-byte header, 16-byte rounding, 32 bytes
    /// at least).
    struct Counting;

    thread_local! {
        static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        static LIVE: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
        static PEAK: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    }

    fn chunk(size: usize) -> isize {
        ((size + 8 + 15) & !15).max(32) as isize
    }

    fn count(delta: isize) {
        let _ = COUNTING.try_with(|on| {
            if on.get() {
                let live = LIVE.with(|l| {
                    l.set(l.get() + delta);
                    l.get()
                });
                PEAK.with(|p| p.set(p.get().max(live)));
            }
        });
    }

    // SAFETY: every call is passed on to `System` unchanged; the counting
    // touches only this thread's const-initialised cells (no allocation).
    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            count(chunk(layout.size()));
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            count(-chunk(layout.size()));
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
            count(chunk(layout.size()));
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(
            &self,
            ptr: *mut u8,
            layout: std::alloc::Layout,
            new_size: usize,
        ) -> *mut u8 {
            count(chunk(new_size) - chunk(layout.size()));
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// Runs `f` on this thread counting its allocations: what is live at
    /// the end and at the peak (bytes).
    fn measure_heap<T>(f: impl FnOnce() -> T) -> (T, isize, isize) {
        LIVE.with(|l| l.set(0));
        PEAK.with(|p| p.set(0));
        COUNTING.with(|c| c.set(true));
        let out = f();
        COUNTING.with(|c| c.set(false));
        (out, LIVE.with(|l| l.get()), PEAK.with(|p| p.get()))
    }

    /// What the allocator holds for the cache stays within its budget
    /// under churn, for records of every size (a review found small ones
    /// 13% past it: a hash map's and a vector's doublings and the map's
    /// tombstones), and the cache still holds a fair share of records.
    #[test]
    fn the_allocations_stay_within_the_budget_for_records_of_every_size() {
        let budget = 256 << 10;
        for (key_len, value_len) in [(0, 0), (2, 1), (8, 8), (16, 64), (24, 200), (8, 1024)] {
            let ((held, stats), live, peak) = measure_heap(|| {
                let c = RecordCache::new(budget, 1024);
                let value = vec![5u8; value_len];
                for i in 0u64..40_000 {
                    // Keys of `key_len` bytes, distinct (the counter's
                    // bytes, padded or cut; the cut ones repeat: refills).
                    let mut key = vec![0u8; key_len];
                    let bytes = i.to_le_bytes();
                    let n = key_len.min(8);
                    key[..n].copy_from_slice(&bytes[..n]);
                    read_and_fill(&c, 1, &key, &value);
                    // A few reads again: hits and referenced bits.
                    if i % 3 == 0 {
                        let _ = get(&c, 1, &(i / 2).to_le_bytes()[..n]);
                    }
                }
                let stats = c.stats();
                (stats.entries, stats)
            });
            // The test's own vectors: its key and value, a hit's copy.
            let own = chunk(key_len) + 2 * chunk(value_len);
            let limit = budget as isize + own;
            assert!(
                peak <= limit && live <= limit,
                "records of {key_len}+{value_len} bytes: {live} bytes live, {peak} at the                  peak, budget {budget}, counted {stats:?}"
            );
            // A fair share: at least 60% of the records of this size the
            // budget holds at ENTRY_OVERHEAD each (key and value cut to
            // the distinct ones for short keys).
            let distinct: u64 = match key_len {
                0 => 1,
                2 => 1 << 16,
                _ => u64::MAX,
            };
            let fair = (budget / (key_len + value_len + ENTRY_OVERHEAD)) as u64;
            assert!(
                held >= (fair * 6 / 10).min(distinct),
                "records of {key_len}+{value_len} bytes: {held} held, {fair} fit at                  {ENTRY_OVERHEAD} bytes each"
            );
        }
    }

    /// Most keys invalidated, then more distinct keys than before read: the
    /// slot vector grows while the free list holds many slots (a review:
    /// the free list's capacity passed the slots' and the next growth's
    /// subtraction overflowed, a panic in `Tree::get`'s fill).
    #[test]
    fn growth_after_many_invalidations_keeps_the_free_list_in_step() {
        let c = RecordCache::new(256 << 10, 64);
        let (mut next, mut held, mut fill) = (0u32, Vec::new(), 10usize);
        for _ in 0..8 {
            for _ in 0..fill {
                read_and_fill(&c, 1, &next.to_be_bytes(), b"v");
                held.push(next);
                next += 1;
            }
            let keep = held.len() / 20;
            for k in held.drain(keep..) {
                c.invalidate(1, &k.to_be_bytes());
            }
            assert_indexed(&c);
            fill *= 2;
        }
    }

    /// A record under the shard's budget that cannot fit beside its grown
    /// vectors is refused without evicting the shard's entries.
    #[test]
    fn a_record_that_cannot_fit_empties_nothing() {
        let c = RecordCache::new(64 << 10, 32 << 10);
        for i in 0u32..5_000 {
            read_and_fill(&c, 1, &i.to_be_bytes(), b"v");
        }
        let before = c.stats().entries;
        read_and_fill(&c, 1, b"big", &vec![1u8; 26_000]);
        assert_eq!(get(&c, 1, b"big"), None);
        let after = c.stats().entries;
        assert_eq!(after, before, "{before} entries before one refused fill");
    }

    /// The index names every entry held, once, and nothing else.
    fn assert_indexed(c: &RecordCache) {
        for shard in c.shards.iter() {
            let s = shard.lock().unwrap();
            let held: Vec<u32> = (0..s.slots.len() as u32)
                .filter(|&i| s.slots[i as usize].is_some())
                .collect();
            assert_eq!(s.held(), held.len());
            let named = s.index.iter().filter(|&&b| b != EMPTY).count();
            assert_eq!(named, held.len());
            assert!(s.free.capacity() >= s.slots.capacity());
            for &slot in &held {
                let hash = s.slots[slot as usize].as_ref().unwrap().hash;
                assert_eq!(
                    s.find(hash),
                    Some(slot),
                    "slot {slot} not found by its hash"
                );
            }
            assert!(
                s.heap() <= c.shard_budget,
                "{} of {}",
                s.heap(),
                c.shard_budget
            );
        }
    }

    proptest! {
        /// The open-addressed index under fills, invalidations (removals
        /// that shift entries back), evictions and clears: every entry is
        /// found by its hash. (A lost entry is only a miss to
        /// `a_hit_is_always_the_trees_value`.)
        #[test]
        fn every_entry_is_found_through_the_index(
            ops in proptest::collection::vec((0u16..600, 0u8..10), 1..2_000),
            budget in MIN_BUDGET..40_000,
        ) {
            let c = RecordCache::new(budget, 64);
            for (k, what) in ops {
                let key = k.to_be_bytes();
                match what {
                    0..=5 => read_and_fill(&c, 1, &key, &key),
                    6..=8 => c.invalidate(1, &key),
                    _ => {
                        if k % 50 == 0 {
                            c.clear();
                        }
                    }
                }
                assert_indexed(&c);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Read(u8),
        Write(u8, u8),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<u8>().prop_map(|k| Op::Read(k % 40)),
            3 => (any::<u8>(), any::<u8>()).prop_map(|(k, v)| Op::Write(k % 40, v)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Model: a map standing for the tree. Reads fill, writes
        /// invalidate then change the map (as a writer under its latch);
        /// a hit must always equal the map. Small budgets force eviction.
        #[test]
        fn a_hit_is_always_the_trees_value(
            ops in proptest::collection::vec(op(), 1..400),
            budget in MIN_BUDGET..12_000,
        ) {
            let c = RecordCache::new(budget, 64);
            let mut tree: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Read(k) => match c.lookup(3, &[k]) {
                        Lookup::Hit(v, _) => prop_assert_eq!(Some(&v), tree.get(&k)),
                        Lookup::Miss(t) => {
                            if let Some(v) = tree.get(&k) {
                                c.fill(t, 3, &[k], v, 1);
                            }
                        }
                        Lookup::Off => prop_assert!(false, "a cache with a budget is on"),
                    },
                    Op::Write(k, v) => {
                        c.invalidate(3, &[k]);
                        tree.insert(k, vec![v; usize::from(v % 50)]);
                    }
                    Op::Clear => c.clear(),
                }
                prop_assert!(c.stats().bytes <= budget as u64);
            }
        }
    }
}
