//! The free-space map: which pages are in use, one bit per page.
//!
//! Owns: the geometry of the map pages and the in-memory copy of the map
//! that allocation searches (`Mirror`). It never touches a page: the
//! allocator (`alloc.rs`) flips the bits in the map pages, under the meta
//! page's latch, and logs them with the change that allocates or frees.
//!
//! Layout: the page ids are cut into groups of `G = (page_size - 32) * 8`
//! pages (32,512 for 4 KiB pages, 127 MiB). Each group has one map page
//! whose body holds one bit per page of the group (bit `i` of byte `b`
//! covers page `group * G + 8 * b + i`; 1: in use). The map page of group
//! 0 is page 1 (page 0 is the meta page); that of group `g > 0` is its
//! first page, `g * G`. The meta page and every map page have their own bit
//! set. A map page exists only once the high-water mark (`next_unused`)
//! has reached its group: pages at or past the mark are free without a
//! bit, and the allocator formats a group's map page when the mark reaches
//! it.
//!
//! Why a bitmap: it is a structure in pages like any other, so its changes
//! are page changes logged in the same record as the split, merge or
//! commit that makes them, and redone idempotently by page LSN. It hands
//! can hand out contiguous runs (a run of zero bits; large values will
//! search for them) and coalesces freed neighbours by construction; the linked free list it replaced could do
//! neither, and cost a read of the freed page to take it. It costs one bit
//! per 4 KiB page in memory (32 MiB for a 1 TiB database).
//!
//! Cost: finding a free page scans words from a cursor that stays at or
//! below the lowest free page, so a run of allocations costs O(1) each;
//! a freed page moves the cursor back.

use super::page::PAGE_HEADER_SIZE;

/// Where the pages of the map are and which bit covers a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Pages per group (bits in one map page).
    per_group: u64,
}

impl Geometry {
    /// The map geometry for pages of `page_size` bytes.
    pub fn new(page_size: usize) -> Geometry {
        debug_assert!(page_size > PAGE_HEADER_SIZE);
        Geometry {
            per_group: ((page_size - PAGE_HEADER_SIZE) * 8) as u64,
        }
    }

    /// Pages per group.
    pub fn per_group(&self) -> u64 {
        self.per_group
    }

    /// The group of page `pid`.
    pub fn group(&self, pid: u64) -> u64 {
        pid / self.per_group
    }

    /// The map page of group `g`.
    pub fn map_page(&self, g: u64) -> u64 {
        if g == 0 {
            1
        } else {
            g * self.per_group
        }
    }

    /// The map page holding the bit of page `pid`.
    pub fn map_page_of(&self, pid: u64) -> u64 {
        self.map_page(self.group(pid))
    }

    /// True for the meta page and every map page: pages that are never
    /// handed out.
    pub fn is_reserved(&self, pid: u64) -> bool {
        pid <= 1 || pid % self.per_group == 0
    }

    /// The byte (within the map page) and mask of page `pid`'s bit.
    pub fn bit(&self, pid: u64) -> (usize, u8) {
        let i = pid % self.per_group;
        (PAGE_HEADER_SIZE + (i / 8) as usize, 1u8 << (i % 8))
    }

    /// Pages in `[from, to)` that can be handed out (not reserved).
    pub fn usable(&self, from: u64, to: u64) -> u64 {
        if to <= from {
            return 0;
        }
        to - from - (self.reserved_below(to) - self.reserved_below(from))
    }

    /// Reserved pages in `[0, n)`.
    fn reserved_below(&self, n: u64) -> u64 {
        match n {
            0 => 0,
            1 => 1,
            // Pages 0 and 1, then one per later group start below n.
            _ => 2 + (n - 1) / self.per_group,
        }
    }
}

/// The in-memory copy of the map for the pages below the high-water
/// mark: what allocation searches. Changed only with the meta page
/// latched exclusively, in step with the map pages.
#[derive(Debug, Clone, Default)]
pub struct Mirror {
    /// Bit per page below `next_unused` (1: in use or reserved).
    words: Vec<u64>,
    /// The high-water mark: pages at or past it are free and unmapped.
    next_unused: u64,
    /// A word index at or below the lowest word with a free bit.
    cursor: usize,
    /// Zero bits below `next_unused`.
    free: u64,
}

impl Mirror {
    /// An empty mirror (high-water mark 0).
    pub fn new() -> Mirror {
        Mirror::default()
    }

    /// The high-water mark.
    pub fn next_unused(&self) -> u64 {
        self.next_unused
    }

    /// Free pages below the high-water mark.
    pub fn free_below_mark(&self) -> u64 {
        self.free
    }

    /// Moves the high-water mark up to `to`; the new pages are free.
    pub fn extend_to(&mut self, to: u64) {
        if to <= self.next_unused {
            return;
        }
        let words = to.div_ceil(64) as usize;
        self.words.resize(words, 0);
        self.free += to - self.next_unused;
        self.next_unused = to;
    }

    /// True if page `pid` is below the mark and marked used.
    pub fn is_used(&self, pid: u64) -> bool {
        pid < self.next_unused && self.words[(pid / 64) as usize] & (1 << (pid % 64)) != 0
    }

    /// Marks `pid` (below the mark) used. Returns false if it already was.
    pub fn set(&mut self, pid: u64) -> bool {
        assert!(pid < self.next_unused, "page {pid} is past the mark");
        let w = &mut self.words[(pid / 64) as usize];
        let m = 1u64 << (pid % 64);
        if *w & m != 0 {
            return false;
        }
        *w |= m;
        self.free -= 1;
        true
    }

    /// Marks `pid` (below the mark) free. Returns false if it already was.
    pub fn clear(&mut self, pid: u64) -> bool {
        assert!(pid < self.next_unused, "page {pid} is past the mark");
        let i = (pid / 64) as usize;
        let m = 1u64 << (pid % 64);
        if self.words[i] & m == 0 {
            return false;
        }
        self.words[i] &= !m;
        self.free += 1;
        self.cursor = self.cursor.min(i);
        true
    }

    /// The lowest free page below the mark, if any (not taken).
    pub fn find_free(&mut self) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        // Bounded by the number of words; the cursor never passes a free
        // bit, so the scan usually stops at once.
        while self.cursor < self.words.len() {
            let w = self.words[self.cursor];
            if w != u64::MAX {
                let pid = self.cursor as u64 * 64 + u64::from((!w).trailing_zeros());
                if pid < self.next_unused {
                    return Some(pid);
                }
                return None;
            }
            self.cursor += 1;
        }
        None
    }

    /// The lowest free page below the mark for which `skip` is false, if
    /// any (not taken). Bounded by the map's words; `skip` should hold few
    /// pages (a catalogue's roots dropped since open).
    pub fn find_free_except(&mut self, skip: impl Fn(u64) -> bool) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let first = self.find_free()?;
        if !skip(first) {
            return Some(first);
        }
        (first + 1..self.next_unused)
            .filter(|&pid| self.words[(pid / 64) as usize] & (1u64 << (pid % 64)) == 0)
            .find(|&pid| !skip(pid))
    }

    /// Takes the lowest run of at least `min` free pages below the mark
    /// (`min >= 1`): marks up to `max` of its first pages used and returns
    /// the run's start and the pages taken. A run never holds a map page
    /// (map pages are marked used).
    ///
    /// Cost: O(words below the mark x log2(min)) at worst (a fragmented
    /// map with no run long enough), plus the words it marks. It went
    /// page by page through every word with a bit set: 0.39 s under the
    /// allocator's mutex for a 1 TiB map of alternate free pages (a
    /// review's finding; 8.5 ms now: a timing in a unit test, not
    /// kept).
    pub fn take_run(&mut self, min: u64, max: u64) -> Option<(u64, u64)> {
        let min = min.max(1);
        if self.free < min || max < min {
            return None;
        }
        let start = self.first_run(min)?;
        let limit = self.next_unused.min(start.saturating_add(max));
        let to = self.next_used_at(start, limit);
        debug_assert!(to - start >= min);
        self.mark_used(start, to);
        Some((start, to - start))
    }

    /// The start of the lowest run of at least `min` free pages below the
    /// mark, a word at a time: a run ending at a word's top is carried
    /// into the next word, and runs inside one word are found by ANDing
    /// the free bits with themselves shifted (bit i stays set while bits
    /// i..i+len are free, len doubling).
    fn first_run(&self, min: u64) -> Option<u64> {
        let end = self.next_unused;
        // Free pages ending at the previous word's top bit.
        let mut carry = 0u64;
        for wi in self.cursor..self.words.len() {
            let base = wi as u64 * 64;
            let mut free = !self.words[wi];
            if end < base + 64 {
                // The word holding the mark (base < end: words are
                // ceil(mark / 64)): bits past it are no pages.
                free &= (1u64 << (end - base)) - 1;
            }
            let low = u64::from(free.trailing_ones());
            if carry > 0 && carry + low >= min {
                return Some(base - carry);
            }
            if low == 64 {
                carry += 64;
                continue;
            }
            if min <= 64 {
                let (mut runs, mut len) = (free, 1);
                while len < min {
                    let s = len.min(min - len);
                    runs &= runs >> s;
                    len += s;
                }
                if runs != 0 {
                    return Some(base + u64::from(runs.trailing_zeros()));
                }
            }
            carry = u64::from(free.leading_ones());
        }
        // A run ending at the mark, on a word's end: no word after it
        // judged it (a review's finding: mark 128, pages 64..128 free,
        // and no run found).
        (carry >= min).then(|| end - carry)
    }

    /// The first used bit at or after `pid`, or `limit` if none is below
    /// it (`limit` at most the mark).
    fn next_used_at(&self, mut pid: u64, limit: u64) -> u64 {
        while pid < limit {
            let w = self.words[(pid / 64) as usize] >> (pid % 64);
            if w != 0 {
                return (pid + u64::from(w.trailing_zeros())).min(limit);
            }
            pid = (pid / 64 + 1) * 64;
        }
        limit
    }

    /// Marks the free pages `from..to` (below the mark) used, a word at a
    /// time.
    fn mark_used(&mut self, from: u64, to: u64) {
        let mut p = from;
        while p < to {
            let (wi, bit) = ((p / 64) as usize, p % 64);
            let n = (64 - bit).min(to - p);
            let mask = (u64::MAX >> (64 - n)) << bit;
            assert_eq!(
                self.words[wi] & mask,
                0,
                "pages {from}..{to} were not all free"
            );
            self.words[wi] |= mask;
            p += n;
        }
        self.free -= to - from;
    }

    /// A mirror of `next_unused` pages, every one used (for an open that
    /// allocates nothing and could not read the map).
    pub fn all_used(next_unused: u64) -> Mirror {
        let mut m = Mirror::new();
        m.extend_to(next_unused);
        m.words.fill(u64::MAX);
        m.free = 0;
        m.cursor = m.words.len();
        m
    }

    /// Copies the bits of the group starting at page `first` from its map
    /// page's body (`bits`, one bit per page as stored), for the pages
    /// below the mark. A group starts on a word boundary (`G` is a
    /// multiple of 64), so whole bytes land in place.
    pub fn load_group(&mut self, first: u64, bits: &[u8]) {
        debug_assert_eq!(first % 64, 0);
        let pages = self
            .next_unused
            .saturating_sub(first)
            .min(bits.len() as u64 * 8);
        let base = (first / 64) as usize;
        for (b, &byte) in bits.iter().enumerate().take(pages.div_ceil(8) as usize) {
            let mut byte = u64::from(byte);
            let past = (b as u64 + 1) * 8;
            if past > pages {
                // Bits past the mark are not part of the map.
                byte &= (1u64 << (8 - (past - pages))) - 1;
            }
            let w = &mut self.words[base + b / 8];
            let before = w.count_ones();
            *w |= byte << ((b % 8) * 8);
            self.free -= u64::from(w.count_ones() - before);
        }
        self.cursor = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A free run that ends at the mark on a word's end is found (the
    /// word-at-a-time scan carried it past its last word; a review's
    /// finding).
    #[test]
    fn a_run_ending_at_the_mark_on_a_word_s_end_is_found() {
        for (used, mark, min) in [
            (64, 128, 1),
            (64, 128, 64),
            (0, 64, 1),
            (0, 64, 64),
            (0, 128, 100),
        ] {
            let mut m = Mirror::new();
            m.extend_to(mark);
            for p in 0..used {
                m.set(p);
            }
            assert_eq!(
                m.take_run(min, 1000),
                Some((used, mark - used)),
                "{used} {mark} {min}"
            );
        }
    }

    #[test]
    fn geometry_of_4k_pages() {
        let g = Geometry::new(4096);
        assert_eq!(g.per_group(), 32_512);
        assert_eq!(g.map_page(0), 1);
        assert_eq!(g.map_page(2), 65_024);
        assert_eq!(g.map_page_of(32_511), 1);
        assert_eq!(g.map_page_of(32_512), 32_512);
        assert!(g.is_reserved(0) && g.is_reserved(1) && g.is_reserved(32_512));
        assert!(!g.is_reserved(2) && !g.is_reserved(32_513));
        assert_eq!(g.bit(2), (PAGE_HEADER_SIZE, 4));
        assert_eq!(g.bit(32_512 + 9), (PAGE_HEADER_SIZE + 1, 2));
        assert_eq!(g.usable(0, 10), 8);
        assert_eq!(g.usable(2, 32_513), 32_510);
        assert_eq!(g.usable(5, 5), 0);
    }

    proptest! {
        /// `usable` agrees with counting page by page.
        #[test]
        fn usable_counts_unreserved_pages(a in 0u64..200, b in 0u64..200) {
            let g = Geometry { per_group: 16 };
            let want = (a..b).filter(|&p| !g.is_reserved(p)).count() as u64;
            prop_assert_eq!(g.usable(a, b), want);
        }

        /// The mirror against a Vec<bool> model: find_free returns the
        /// lowest free page, counts agree.
        #[test]
        fn mirror_matches_a_model(ops in proptest::collection::vec((0u8..3, 0u64..300), 1..200)) {
            let mut m = Mirror::new();
            let mut model: Vec<bool> = Vec::new();
            for (op, x) in ops {
                match op {
                    0 => {
                        let to = model.len() as u64 + x % 70;
                        m.extend_to(to);
                        model.resize(to as usize, false);
                    }
                    1 if !model.is_empty() => {
                        let p = x % model.len() as u64;
                        prop_assert_eq!(m.set(p), !model[p as usize]);
                        model[p as usize] = true;
                    }
                    2 if !model.is_empty() => {
                        let p = x % model.len() as u64;
                        prop_assert_eq!(m.clear(p), model[p as usize]);
                        model[p as usize] = false;
                    }
                    _ => {}
                }
                let first = model.iter().position(|u| !u).map(|p| p as u64);
                prop_assert_eq!(m.find_free(), first);
                prop_assert_eq!(m.free_below_mark(), model.iter().filter(|u| !**u).count() as u64);
            }
        }

        /// `take_run` against a Vec<bool> model: the lowest run of at
        /// least `min` free pages, at most `max` of them taken, or None
        /// when there is no such run; counts and `find_free` agree after.
        #[test]
        fn take_run_matches_a_model(
            stretches in proptest::collection::vec((1usize..150, any::<bool>()), 0..12),
            runs in proptest::collection::vec((1u64..150, 0u64..200), 1..8),
            whole_words in any::<bool>(),
        ) {
            // Stretches of used and free pages, short and long (past a
            // word); the mark on a word's end or not.
            let mut used: Vec<bool> =
                stretches.iter().flat_map(|&(n, u)| std::iter::repeat_n(u, n)).collect();
            if whole_words {
                used.resize(used.len().next_multiple_of(64), false);
            }
            let mut m = Mirror::new();
            m.extend_to(used.len() as u64);
            let mut model = used.clone();
            for (p, &u) in used.iter().enumerate() {
                if u {
                    m.set(p as u64);
                }
            }
            for (min, extra) in runs {
                let max = min + extra;
                let mut want = None;
                let mut p = 0;
                while p < model.len() {
                    if model[p] {
                        p += 1;
                        continue;
                    }
                    let q = (p..model.len()).find(|&q| model[q]).unwrap_or(model.len());
                    if (q - p) as u64 >= min {
                        want = Some((p as u64, ((q - p) as u64).min(max)));
                        break;
                    }
                    p = q;
                }
                prop_assert_eq!(m.take_run(min, max), want);
                if let Some((s, n)) = want {
                    for q in s..s + n {
                        model[q as usize] = true;
                    }
                }
                prop_assert_eq!(m.free_below_mark(), model.iter().filter(|u| !**u).count() as u64);
                prop_assert_eq!(m.find_free(), model.iter().position(|u| !u).map(|p| p as u64));
                for (q, &u) in model.iter().enumerate() {
                    prop_assert_eq!(m.is_used(q as u64), u, "page {}", q);
                }
            }
        }

        /// Loading groups from stored bytes gives the same mirror as
        /// setting the bits one by one, whatever the mark.
        #[test]
        fn load_group_equals_bit_by_bit(bytes in proptest::collection::vec(any::<u8>(), 1..40), mark in 0u64..700) {
            let group = bytes.len() as u64 * 8;
            let mut loaded = Mirror::new();
            loaded.extend_to(mark);
            let mut by_bit = loaded.clone();
            let mut first = 0;
            while first < mark {
                loaded.load_group(first, &bytes);
                for i in 0..group.min(mark - first) {
                    if bytes[(i / 8) as usize] & (1 << (i % 8)) != 0 {
                        by_bit.set(first + i);
                    }
                }
                first += group.next_multiple_of(64);
            }
            for p in 0..mark {
                prop_assert_eq!(loaded.is_used(p), by_bit.is_used(p), "page {}", p);
            }
            prop_assert_eq!(loaded.free_below_mark(), by_bit.free_below_mark());
            prop_assert_eq!(loaded.find_free(), by_bit.find_free());
        }
    }
}
