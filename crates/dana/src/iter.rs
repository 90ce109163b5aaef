//! Iterating over a tree like a Rust collection: [`Iter`], returned by
//! [`Tree::range`], [`Tree::iter`] and [`Tree::prefix`].
//!
//! Owns: the synchronous, double-ended iterator over a key range. It
//! streams: it holds one leaf's worth of entries per end at a time, and
//! fetches the next leaf through a B+tree [`Cursor`] run on a worker (one
//! round trip per leaf, not per key), so a range of any size costs memory
//! for two leaves. Never: holds a latch between calls, or loads the range.
//!
//! What an iteration sees while others write (each cursor copies a leaf
//! under its shared latch and moves on with the leaf's fence key as a hard
//! bound):
//! - each key at most once, in key order (reverse order from the back);
//! - only committed values: a transaction's writes reach the leaves only
//!   after its commit record is appended;
//! - every key that nobody inserted, updated or deleted during the
//!   iteration, with its value;
//! - a key written during the iteration may be seen with its old or its
//!   new value, or (inserted or deleted) be present or absent; the writes
//!   of one transaction are not seen atomically (no snapshot).
//!
//! The two ends ([`Iterator::next`] and [`DoubleEndedIterator::next_back`])
//! may be mixed; they stop where they meet, as a `BTreeMap` range does.

use std::collections::VecDeque;
use std::iter::FusedIterator;
use std::ops::{Bound, RangeBounds};

use crate::btree::Cursor;
use crate::db::Tree;
use crate::Result;

/// One entry: (key, value).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
/// use dana::iter::Entry;
/// let t = db.create_tree("t").unwrap();
/// t.put(b"k", b"v").unwrap();
/// let entries: Vec<Entry> = t.iter().collect::<dana::Result<_>>().unwrap();
/// let (key, value) = &entries[0];
/// assert_eq!((key.as_slice(), value.as_slice()), (&b"k"[..], &b"v"[..]));
/// ```
pub type Entry = (Vec<u8>, Vec<u8>);

/// One end of an iteration.
#[derive(Default)]
struct End {
    /// Created at the first fetch.
    cursor: Option<Cursor>,
    /// Entries of the last leaf read, in this end's order.
    buf: VecDeque<Entry>,
    /// The last key this end returned.
    last: Option<Vec<u8>>,
    /// The cursor found no more leaves.
    exhausted: bool,
}

/// A streaming iterator over the entries of a key range of a [`Tree`], in
/// key order (double-ended: `.rev()` walks it backwards). Items are
/// `Result`s: an I/O error ends the iteration after it is returned. See
/// the module documentation for what it guarantees under concurrent
/// writes.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
/// let t = db.create_tree("t").unwrap();
/// for k in [b"a1", b"a2", b"b1", b"b2"] {
///     t.put(k, b"v").unwrap();
/// }
/// fn keys(it: impl Iterator<Item = dana::Result<dana::iter::Entry>>) -> Vec<Vec<u8>> {
///     it.map(|e| e.unwrap().0).collect()
/// }
/// assert_eq!(keys(t.range(b"a2".as_slice()..b"b2")), [b"a2".to_vec(), b"b1".to_vec()]);
/// assert_eq!(keys(t.prefix(b"b").rev()), [b"b2".to_vec(), b"b1".to_vec()]);
/// assert_eq!(t.iter().count(), 4);
/// ```
pub struct Iter {
    tree: Tree,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    front: End,
    back: End,
    /// The ends met, the range ran out, or an error was returned.
    done: bool,
    /// Entries the caller said it will take ([`Iter::with_len_hint`]).
    len_hint: Option<usize>,
}

impl Iter {
    pub(crate) fn new(tree: Tree, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Iter {
        Iter {
            tree,
            lower,
            upper,
            front: End::default(),
            back: End::default(),
            done: false,
            len_hint: None,
        }
    }

    /// Tells the iterator its caller will take about `n` entries (a
    /// `take(n)` it cannot see): it then reads ahead only the leaves those
    /// need ([`crate::btree::Cursor::with_len_hint`]), where it would read
    /// ahead 1, 2, 4, 8 leaves as it goes. A hint only: the iterator still
    /// returns its whole range.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// for i in 0u32..1000 {
    ///     t.put(&i.to_be_bytes(), b"v").unwrap();
    /// }
    /// let first: Vec<_> = t.iter().with_len_hint(10).take(10).collect::<dana::Result<_>>().unwrap();
    /// assert_eq!(first.len(), 10);
    /// assert_eq!(t.iter().with_len_hint(10).count(), 1000);
    /// ```
    pub fn with_len_hint(mut self, n: usize) -> Iter {
        self.len_hint = Some(n);
        self
    }

    /// Reads the next leaf's entries for one end (on a worker).
    fn fetch(&mut self, forward: bool) -> Result<()> {
        let tree = &self.tree;
        let end = if forward {
            &mut self.front
        } else {
            &mut self.back
        };
        let cursor = match end.cursor.take() {
            Some(c) => c,
            None => {
                let c = tree.cursor(
                    self.lower.as_ref().map(Vec::as_slice),
                    self.upper.as_ref().map(Vec::as_slice),
                    forward,
                )?;
                match self.len_hint {
                    Some(n) => c.with_len_hint(n),
                    None => c,
                }
            }
        };
        let (cursor, batch) = tree.db().block_on(async move {
            let mut c = cursor;
            let r = c.next_batch().await;
            (c, r)
        })?;
        end.cursor = Some(cursor);
        match batch? {
            Some(entries) => end.buf.extend(entries),
            None => end.exhausted = true,
        }
        Ok(())
    }

    /// The next entry from one end, stopping where the ends meet.
    fn step(&mut self, forward: bool) -> Option<Result<Entry>> {
        // Each round returns, or fetches one more leaf: bounded by the
        // leaves of the range.
        loop {
            if self.done {
                return None;
            }
            // A closed database answers `Closed`, also for the entries of
            // a leaf fetched before the close.
            if let Err(e) = self.tree.live_for_read() {
                self.done = true;
                return Some(Err(e));
            }
            let (end, other) = if forward {
                (&mut self.front, &self.back)
            } else {
                (&mut self.back, &self.front)
            };
            if let Some((k, v)) = end.buf.pop_front() {
                let met = other
                    .last
                    .as_ref()
                    .is_some_and(|o| if forward { k >= *o } else { k <= *o });
                if met {
                    self.done = true;
                    return None;
                }
                end.last = Some(k.clone());
                return Some(Ok((k, v)));
            }
            if end.exhausted {
                self.done = true;
                return None;
            }
            if let Err(e) = self.fetch(forward) {
                self.done = true;
                return Some(Err(e));
            }
        }
    }
}

impl Iterator for Iter {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        self.step(true)
    }
}

impl DoubleEndedIterator for Iter {
    fn next_back(&mut self) -> Option<Result<Entry>> {
        self.step(false)
    }
}

impl FusedIterator for Iter {}

/// `range`'s bounds as owned byte strings.
pub(crate) fn owned_bounds<K: AsRef<[u8]> + ?Sized>(
    range: &impl RangeBounds<K>,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let own = |b: Bound<&K>| b.map(|k| k.as_ref().to_vec());
    (own(range.start_bound()), own(range.end_bound()))
}

/// The bounds of the keys that start with `prefix`: from the prefix
/// itself (included) to the first byte string above every such key
/// (excluded), or unbounded when the prefix is all `0xff` bytes. What
/// [`crate::Tree::prefix`] iterates; for scans that take bounds.
///
/// ```
/// use std::ops::Bound;
/// let (lo, hi) = dana::iter::prefix_bounds(b"user/");
/// assert_eq!((lo, hi), (Bound::Included(b"user/".to_vec()), Bound::Excluded(b"user0".to_vec())));
/// ```
pub fn prefix_bounds(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < 0xff {
            upper.push(last + 1);
            return (Bound::Included(prefix.to_vec()), Bound::Excluded(upper));
        }
    }
    (Bound::Included(prefix.to_vec()), Bound::Unbounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_bounds_cover_exactly_the_prefixed_keys() {
        let (lo, hi) = prefix_bounds(b"ab");
        assert_eq!(lo, Bound::Included(b"ab".to_vec()));
        assert_eq!(hi, Bound::Excluded(b"ac".to_vec()));
        let (_, hi) = prefix_bounds(&[0x61, 0xff, 0xff]);
        assert_eq!(hi, Bound::Excluded(vec![0x62]));
        let (_, hi) = prefix_bounds(&[0xff, 0xff]);
        assert_eq!(hi, Bound::Unbounded);
        let (lo, hi) = prefix_bounds(b"");
        assert_eq!((lo, hi), (Bound::Included(Vec::new()), Bound::Unbounded));
    }
}
