//! The consistency checker behind `dana check` and `dana inspect`.
//!
//! Owns: verifying a database's persistent structures and collecting
//! statistics about them. It walks every tree from its root (the
//! catalogue, in root slot 0 of the meta page, and every tree the
//! catalogue names), reads the free-space map, and accounts for every
//! page.
//!
//! What it verifies, per page of a tree:
//! - the page can be read: checksum and page id are verified by the buffer
//!   pool; a failure becomes a [`Finding`] naming the page;
//! - the page type (`Leaf` / `Inner`) agrees with the node's leaf flag;
//! - [`node::check`] passes (layout, key order, keys within the fences);
//! - its fences equal the range its parent gives it: child `i` of an inner
//!   node covers `(key[i-1], key[i]]` (the first child starts at the
//!   parent's lower fence) and the upper child `(key[n-1], parent upper]`;
//!   a root covers `(-inf, +inf)`;
//! - all leaves of a tree are at the same depth;
//! - child pointers lie in `1..next_unused`.
//!
//! And for the whole database: every page id below `next_unused` is the
//! meta page, a free-space map page, a page of exactly one tree, or marked
//! free in the map: pages nobody owns that the map marks used are
//! reported as lost, pages reached twice as doubly owned, owned pages the
//! map marks free as such. The free pages must number what the meta page
//! says.
//!
//! The checker goes on after a finding wherever it can: a page that cannot
//! be read or fails [`node::check`] is reported and its subtree skipped
//! (its pages then show up as lost), and the other trees are still walked.
//! Only a meta page that cannot be read stops it (an `Err`).
//!
//! Never: modifies the database (it only takes shared latches and reads;
//! it never allocates, frees or writes a page), except in
//! `repair_value_copies`, which `Db::rebuild` runs: it writes a large
//! value's whole copy over its damaged copies on mirrored devices; or
//! panics on corrupted input. It reads through the buffer pool, so it sees pages changed in
//! memory but not yet written back; run it on a quiescent database (writes
//! running at the same time can produce spurious findings).
//!
//! Memory: 4 bytes per used page for the ownership map.

use std::fmt;
use std::sync::Arc;

use crate::btree::node::{self, Node};
use crate::buffer::alloc::{self, SpaceInfo, ROOT_SLOTS};
use crate::buffer::blob::{BlobRef, CopyPick, Extent};
use crate::buffer::{newest_version, page, BufferPool, PageType};
use crate::catalog::{CATALOG_SLOT, CREATING_SLOT, DROPPING_SLOT};
use crate::{Error, Result};

/// The name used for the catalogue in [`Finding::tree`] and
/// [`CheckReport::catalog`].
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// db.create_tree("a").unwrap();
/// db.create_tree("b").unwrap();
/// let report = db.check().unwrap();
/// assert_eq!(report.catalog.name, dana::check::CATALOG_TREE);
/// assert_eq!(report.catalog.entries, 2); // one entry per tree
/// ```
pub const CATALOG_TREE: &str = "(catalogue)";

/// Owner name of the pages of a tree whose creation is under way.
///
/// It appears only in [`Finding`]s; a finished [`crate::Db::create_tree`]
/// leaves nothing under it.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// use dana::check::CREATING_TREE;
/// db.create_tree("t").unwrap();
/// let report = db.check().unwrap();
/// assert!(report.is_ok());
/// assert!(!report.findings.iter().any(|f| f.tree.as_deref() == Some(CREATING_TREE)));
/// assert_eq!(report.trees.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["t"]);
/// ```
pub const CREATING_TREE: &str = "(tree being created)";
/// Owner name of the pages of a tree whose drop is under way.
///
/// It appears only in [`Finding`]s; a finished [`crate::Db::drop_tree`]
/// leaves nothing under it.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// use dana::check::DROPPING_TREE;
/// let t = db.create_tree("t").unwrap();
/// for i in 0u32..200 {
///     t.put(&i.to_be_bytes(), &[0; 40]).unwrap();
/// }
/// assert!(db.drop_tree("t").unwrap());
/// let report = db.check().unwrap();
/// assert!(report.is_ok(), "{:?}", report.findings);
/// assert!(!report.findings.iter().any(|f| f.tree.as_deref() == Some(DROPPING_TREE)));
/// assert!(report.trees.is_empty() && report.free_pages > 0); // its pages are free
/// ```
pub const DROPPING_TREE: &str = "(tree being dropped)";

/// What the copies of each page below the high-water mark must agree on,
/// as the check found the pages: nothing of a free page (its bytes mean
/// nothing), the value's bytes of a large value's last page (the rest of
/// that page is never read, and a damaged byte there fails no checksum,
/// so no repair would ever make the copies agree), the whole of any other.
#[derive(Debug, Default, Clone)]
pub struct PagesInUse {
    free: Vec<bool>,
    /// Last pages of large values that the value does not fill: the bytes
    /// of the value in each.
    tails: std::collections::HashMap<u64, usize>,
}

impl PagesInUse {
    /// Bytes at the start of page `pid` that mean something (of
    /// `page_size`): 0 for a free page.
    pub fn bytes(&self, pid: u64, page_size: usize) -> usize {
        if self.free.get(pid as usize) == Some(&true) {
            return 0;
        }
        self.tails
            .get(&pid)
            .map_or(page_size, |&n| n.min(page_size))
    }
}

/// Owner value for the pages the free-space map marks free.
const FREE_OWNER: u32 = u32::MAX;
/// Owner value for the meta page and the map pages.
const SPACE_OWNER: u32 = u32::MAX - 1;

/// Bytes of a key shown in a finding.
const SHOW_KEY: usize = 32;

/// Statistics of one tree, from [`crate::Db::check`].
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// let t = db.create_tree("t").unwrap();
/// for k in [b"a", b"b", b"c"] {
///     t.put(k, b"v").unwrap();
/// }
/// let report = db.check().unwrap();
/// let stats = &report.trees[0];
/// assert_eq!((stats.name.as_str(), stats.entries), ("t", 3));
/// assert_eq!((stats.height, stats.leaf_pages, stats.inner_pages), (1, 1, 0)); // one leaf
/// assert!(stats.leaf_fill > 0.0 && stats.leaf_fill < 1.0);
/// assert_eq!(stats.inner_fill, 0.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TreeStats {
    /// The tree's name ([`CATALOG_TREE`] for the catalogue).
    pub name: String,
    /// Its root page id.
    pub root: u64,
    /// Levels from the root to the leaves (1: the root is a leaf; 0: no
    /// leaf could be read).
    pub height: u32,
    /// Inner pages read.
    pub inner_pages: u64,
    /// Leaf pages read.
    pub leaf_pages: u64,
    /// Entries in the leaves read.
    pub entries: u64,
    /// Mean fill factor of the leaves (0.0 to 1.0; 0.0 without leaves).
    pub leaf_fill: f64,
    /// Mean fill factor of the inner nodes (0.0 without inner nodes).
    pub inner_fill: f64,
}

impl TreeStats {
    /// Pages of the tree (inner and leaf).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// for i in 0u32..300 {
    ///     t.put(&i.to_be_bytes(), &[0; 40]).unwrap();
    /// }
    /// let stats = &db.check().unwrap().trees[0];
    /// assert!(stats.height >= 2 && stats.inner_pages >= 1); // more than a leaf
    /// assert_eq!(stats.pages(), stats.inner_pages + stats.leaf_pages);
    /// ```
    pub fn pages(&self) -> u64 {
        self.inner_pages + self.leaf_pages
    }
}

/// One problem the checker found.
///
/// ```
/// use std::os::unix::fs::FileExt;
/// let dir = tempfile::tempdir().unwrap();
/// let opts = dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20);
/// let db = dana::Db::open(dir.path(), opts.clone()).unwrap();
/// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
/// let (_, leaf) = db.tree_roots().unwrap()[0]; // a one-leaf tree: its root
/// db.close().unwrap();
/// // Flip a bit of that page on disk (one device: page p is at p * 4096).
/// let file = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("dana.0")).unwrap();
/// let mut byte = [0u8];
/// file.read_exact_at(&mut byte, leaf * 4096 + 2000).unwrap();
/// file.write_all_at(&[byte[0] ^ 0x40], leaf * 4096 + 2000).unwrap();
/// file.sync_all().unwrap();
///
/// let db = dana::Db::open(dir.path(), opts).unwrap();
/// let report = db.check().unwrap();
/// assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
/// let finding = &report.findings[0];
/// assert_eq!((finding.page, finding.tree.as_deref()), (Some(leaf), Some("t")));
/// assert!(finding.what.contains("checksum"), "{finding}");
/// assert!(finding.to_string().starts_with(&format!("page {leaf} (tree \"t\"): ")));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The page the problem is on, if it is about one page.
    pub page: Option<u64>,
    /// The tree it was found in, if any ([`CATALOG_TREE`] for the
    /// catalogue).
    pub tree: Option<String>,
    /// What is wrong, for a human.
    pub what: String,
    /// The mirrored device it is about, if it is about the copies of one
    /// (a copy failed or rebuilding, copies that differ): the data is
    /// intact on the healthy copies.
    pub mirror: Option<crate::io::mirror::Role>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.page, &self.tree) {
            (Some(p), Some(t)) => write!(f, "page {p} (tree {t:?}): {}", self.what),
            (Some(p), None) => write!(f, "page {p}: {}", self.what),
            (None, Some(t)) => write!(f, "tree {t:?}: {}", self.what),
            (None, None) => f.write_str(&self.what),
        }
    }
}

/// What [`check_pool`] found: statistics and problems. [`crate::Db::check`]
/// returns one.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// let t = db.create_tree("t").unwrap();
/// t.put(b"k", b"v").unwrap();
/// let report = db.check().unwrap();
/// assert!(report.findings.is_empty() && report.lost_pages == 0);
/// assert_eq!(report.page_size, 4096);
/// assert_eq!(report.trees.len(), 1);
/// assert_eq!(report.free_pages, report.space.free_pages);
/// assert!(report.space.next_unused <= report.space.total_pages);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// The page size in bytes.
    pub page_size: usize,
    /// Pages of the array, high-water mark and free pages as the meta
    /// page records them.
    pub space: SpaceInfo,
    /// Pages the free-space map marks free below the high-water mark.
    pub free_pages: u64,
    /// The catalogue's statistics.
    pub catalog: TreeStats,
    /// Every tree the catalogue names, in name order.
    pub trees: Vec<TreeStats>,
    /// Pages in `1..next_unused` owned by nobody.
    pub lost_pages: u64,
    /// Every problem found; empty for a consistent database.
    pub findings: Vec<Finding>,
    /// What the comparison of every mirrored device's copies found (empty
    /// without mirrors).
    pub mirrors: Vec<MirrorCheck>,
    /// Every out-of-place data device's segments (empty for in-place
    /// files).
    pub out_of_place: Vec<OutOfPlaceSummary>,
}

/// The state of one out-of-place data device ([`crate::io::remap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfPlaceSummary {
    /// The data device's index.
    pub device: usize,
    /// Data segments.
    pub segments: u64,
    /// Pages per segment (its two summary pages included).
    pub segment_pages: u32,
    /// Segments free now.
    pub free_segments: usize,
    /// Logical pages that hold a version.
    pub mapped_pages: u64,
    /// Logical pages the device offers the engine.
    pub offered_pages: u64,
}

/// The comparison of one mirrored data device's copies, page by page, or
/// of one mirrored log's copies (each read and scanned alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorCheck {
    /// The group.
    pub role: crate::io::mirror::Role,
    /// Each copy's state.
    pub states: Vec<crate::io::mirror::CopyState>,
    /// Pages (data) compared on every healthy copy (the free ones are not).
    pub pages_compared: u64,
    /// Pages (data) whose healthy copies differ: (page id, for each
    /// healthy copy whether its version is a valid page).
    pub divergent: Vec<(u64, Vec<bool>)>,
}

impl CheckReport {
    /// True if nothing is wrong but the copies of mirrored devices (every
    /// finding, if any, is about a failed, rebuilding or differing copy:
    /// the data itself is whole).
    pub fn data_ok(&self) -> bool {
        self.findings.iter().all(|f| f.mirror.is_some())
    }

    /// True if the checker found nothing wrong.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// let report = db.check().unwrap();
    /// assert!(report.is_ok());
    /// assert_eq!(report.is_ok(), report.findings.is_empty());
    /// ```
    pub fn is_ok(&self) -> bool {
        self.findings.is_empty()
    }

    /// Pages handed out and not free: below the high-water mark, neither
    /// free nor the meta page or a free-space map page.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// for name in ["a", "b"] {
    ///     let t = db.create_tree(name).unwrap();
    ///     for i in 0u32..300 {
    ///         t.put(&i.to_be_bytes(), &[0; 40]).unwrap();
    ///     }
    /// }
    /// let report = db.check().unwrap();
    /// // Without large values, every used page belongs to a tree or the catalogue.
    /// let owned: u64 = report.trees.iter().map(|t| t.pages()).sum::<u64>() + report.catalog.pages();
    /// assert_eq!(report.used_pages(), owned);
    /// ```
    pub fn used_pages(&self) -> u64 {
        let g = crate::buffer::space_map::Geometry::new(self.page_size);
        g.usable(0, self.space.next_unused)
            .saturating_sub(self.free_pages)
    }
}

/// A leaf entry of the catalogue: (leaf page, key, value).
type LeafEntry = (u64, Vec<u8>, Vec<u8>);

/// A page still to visit in a tree walk.
struct Visit {
    pid: u64,
    /// The inner node that points to it (None for the root).
    parent: Option<u64>,
    depth: u32,
    /// The range the parent gives it: `(lower, upper]`, None = infinite.
    lower: Option<Vec<u8>>,
    upper: Option<Vec<u8>>,
}

/// The walk's state across trees.
/// Bytes of a large value read at a time when its checksum is checked.
const VALUE_CHUNK: usize = 1 << 20;

struct Checker {
    pool: Arc<BufferPool>,
    next_unused: u64,
    /// Per page id: 0 nobody, `i + 1` tree `i` of `names`, or
    /// [`FREE_OWNER`].
    owners: Vec<u32>,
    names: Vec<String>,
    findings: Vec<Finding>,
    /// Large-value references found in the leaves.
    large_values: u64,
    /// Each reference whose extents all lie in the array, with its leaf and
    /// tree: their bytes are checked against their checksums after the
    /// walk.
    values: Vec<(u64, String, BlobRef)>,
    /// Write a whole copy of a large value over its damaged copies
    /// (`repair_value_copies`) instead of reporting them.
    repair: bool,
    /// Large values repaired so.
    repaired: u64,
}

/// Accumulates one tree's statistics.
#[derive(Default)]
struct Acc {
    inner_pages: u64,
    leaf_pages: u64,
    entries: u64,
    leaf_fill: f64,
    inner_fill: f64,
    leaf_depth: Option<u32>,
    /// Extents of the large values found, with the leaf naming each.
    extents: Vec<(u64, Extent)>,
}

/// A key for a finding: escaped, shortened, or an infinity.
fn show(k: Option<&[u8]>, inf: &str) -> String {
    match k {
        None => inf.to_string(),
        Some(k) if k.len() > SHOW_KEY => {
            format!(
                "\"{}\"... ({} bytes)",
                k[..SHOW_KEY].escape_ascii(),
                k.len()
            )
        }
        Some(k) => format!("\"{}\"", k.escape_ascii()),
    }
}

/// The message of a failed page read.
fn read_error(e: &Error) -> String {
    match e {
        Error::Corrupt { what, .. } => format!("cannot be read: {what}"),
        e => format!("cannot be read: {e}"),
    }
}

impl Checker {
    /// Reads every large value found and checks its bytes against its
    /// checksum, a megabyte at a time (a value damaged on the device reads
    /// as `Corrupt` at `get`; the check names its leaf and key's tree). On
    /// mirrored devices every copy is read alone: a value whole on no copy
    /// is damaged data; one whole on some copies only is a mirror finding
    /// (the data is intact), which [`Checker::repair`] mends by writing a
    /// whole copy over the others. A large value's pages carry no header,
    /// so a mirror cannot judge their copies page by page, and a read
    /// served by the whole copy never repairs the other (an outside probe:
    /// the redundancy went silently, and the value with it when the good
    /// copy was lost later). (The first version reported a byte flipped in
    /// copy 1 as a damaged value whenever the mirror read that copy.)
    async fn check_values(&mut self) {
        let values = std::mem::take(&mut self.values);
        let mut buf = vec![0u8; VALUE_CHUNK];
        let copies = self.pool.array().copies().clamp(1, u8::MAX as usize);
        // Each data device's healthy copies: a failed or rebuilding copy
        // is a finding of its own, and a value is compared only on the
        // copies healthy on every device its extents lie on (every value
        // was reported damaged on a removed copy; an outside probe).
        let pool = self.pool.clone();
        let array = pool.array();
        let device_healthy: Vec<Vec<bool>> = array
            .targets()
            .iter()
            .map(|t| {
                (0..copies)
                    .map(|c| match t {
                        crate::io::Target::Mirror(m) => {
                            m.states().get(c) == Some(&crate::io::mirror::CopyState::Healthy)
                        }
                        _ => true,
                    })
                    .collect()
            })
            .collect();
        let width = array.width() as u64;
        for (pid, tree, r) in values {
            let mut on = vec![false; device_healthy.len()];
            for e in &r.extents {
                for p in e.start..e.start + u64::from(e.pages).min(width) {
                    on[array.locate(p).0] = true;
                }
            }
            let healthy: Vec<bool> = (0..copies)
                .map(|c| {
                    device_healthy
                        .iter()
                        .zip(&on)
                        .all(|(h, &used)| !used || h[c])
                })
                .collect();
            // Each copy's checksum of the value (any copy's, unmirrored).
            let mut crcs = Vec::with_capacity(copies);
            for (c, &ok) in healthy.iter().enumerate() {
                if !ok {
                    crcs.push(Err(Error::Mirror(format!("copy {c} is not healthy"))));
                    continue;
                }
                let pick = if copies > 1 {
                    CopyPick::One(c as u8)
                } else {
                    CopyPick::Any
                };
                crcs.push(self.pool.blob_crc(&r, &mut buf, pick).await);
            }
            let whole: Vec<bool> = crcs
                .iter()
                .map(|c| matches!(c, Ok(crc) if *crc == r.crc))
                .collect();
            let first = r.extents.first().map_or(0, |e| e.start);
            // Where the value is whole: one copy, or (striped over devices,
            // damaged on a different copy of each) a mix of one per device.
            let (from, source) = match whole.iter().position(|&w| w) {
                Some(good) => (vec![good as u8], format!("whole on copy {good}")),
                None => match self.pool.whole_mix(&r, &mut buf).await {
                    Some(mix) => {
                        let what = format!("whole in a mix of copies, by device {mix:?}");
                        (mix, what)
                    }
                    None => {
                        let what = match &crcs[..] {
                            [Err(e)] => format!("a large value could not be read: {e}"),
                            _ => format!(
                                "the {} bytes of a large value (first page {first}) do not \
                                 match their checksum{}",
                                r.len,
                                if copies > 1 { " on any copy" } else { "" }
                            ),
                        };
                        self.find(Some(pid), Some(&tree), what);
                        continue;
                    }
                },
            };
            let damaged: Vec<u8> = (0..copies)
                .filter(|&c| !whole[c] && healthy[c])
                .map(|c| c as u8)
                .collect();
            if damaged.is_empty() {
                continue;
            }
            let pick = match &from[..] {
                [c] => CopyPick::One(*c),
                mix => CopyPick::PerDevice(mix),
            };
            let what = if !self.repair {
                format!(
                    "a large value of {} bytes (first page {first}) is damaged on copies \
                     {damaged:?} and {source} (dana rebuild repairs it)",
                    r.len
                )
            } else {
                match self
                    .pool
                    .repair_blob_copies(&r, pick, &damaged, &mut buf)
                    .await
                {
                    Ok(()) => {
                        self.repaired += 1;
                        continue;
                    }
                    Err(e) => format!(
                        "a large value (first page {first}) could not be repaired on copies \
                         {damaged:?}: {e}"
                    ),
                }
            };
            self.findings.push(Finding {
                page: Some(pid),
                tree: Some(tree),
                what,
                mirror: Some(crate::io::mirror::Role::Data(
                    self.pool.array().locate(first).0,
                )),
            });
        }
    }

    fn find(&mut self, page: Option<u64>, tree: Option<&str>, what: String) {
        self.findings.push(Finding {
            page,
            tree: tree.map(str::to_string),
            what,
            mirror: None,
        });
    }

    fn owner_name(&self, owner: u32) -> String {
        match owner {
            0 => "nobody".into(),
            FREE_OWNER => "the free space".into(),
            SPACE_OWNER => "the meta page or the free-space map".into(),
            i => match self.names.get(i as usize - 1) {
                Some(n) => format!("tree {n:?}"),
                None => format!("owner {i}"),
            },
        }
    }

    /// Claims page `pid` for `owner`; false (and a finding) if it is out
    /// of range or already owned.
    fn claim(&mut self, pid: u64, owner: u32, tree: &str, via: Option<u64>) -> bool {
        let from = match via {
            Some(p) => format!("page {p}"),
            None => "the root".to_string(),
        };
        if self.pool.space_geometry().is_reserved(pid) || pid >= self.next_unused {
            let what = format!(
                "points to page {pid}, outside the used pages 1..{}",
                self.next_unused
            );
            match via {
                Some(p) => self.find(Some(p), Some(tree), what),
                None => self.find(None, Some(tree), format!("root {what}")),
            }
            return false;
        }
        let prev = self.owners[pid as usize];
        if prev != 0 {
            let what = if prev == owner {
                format!("reached a second time in the same tree (from {from}): a cycle or a shared child")
            } else {
                format!(
                    "owned twice: by {} and, from {from}, by tree {tree:?}",
                    self.owner_name(prev)
                )
            };
            self.find(Some(pid), Some(tree), what);
            return false;
        }
        self.owners[pid as usize] = owner;
        true
    }

    /// Walks one tree from `root`; with `collect`, returns its leaf entries
    /// (for the catalogue).
    /// With `holes` (a tree being dropped), a zero child pointer is a page
    /// already freed, not damage.
    async fn walk(
        &mut self,
        owner: u32,
        root: u64,
        collect: bool,
        holes: bool,
    ) -> (TreeStats, Vec<LeafEntry>) {
        let name = self.names[owner as usize - 1].clone();
        let mut acc = Acc::default();
        let mut entries = Vec::new();
        let mut stack = vec![Visit {
            pid: root,
            parent: None,
            depth: 0,
            lower: None,
            upper: None,
        }];
        while let Some(v) = stack.pop() {
            if !self.claim(v.pid, owner, &name, v.parent) {
                continue;
            }
            let pool = self.pool.clone();
            let g = match pool.fix_shared(v.pid).await {
                Ok(g) => g,
                Err(e) => {
                    self.find(Some(v.pid), Some(&name), read_error(&e));
                    continue;
                }
            };
            let mut children =
                self.visit_page(&g, &v, &name, &mut acc, collect.then_some(&mut entries));
            drop(g);
            if holes {
                children.retain(|c| c.pid != 0);
            }
            for c in &children {
                if c.pid < self.next_unused {
                    pool.prefetch(c.pid);
                }
            }
            stack.extend(children.into_iter().rev());
        }
        // A large value's pages belong to the tree whose leaf names it.
        for (leaf, e) in std::mem::take(&mut acc.extents) {
            if e.start + u64::from(e.pages) > self.next_unused {
                self.find(
                    Some(leaf),
                    Some(&name),
                    format!(
                        "a large value's extent {}..{} reaches past the used pages ({})",
                        e.start,
                        e.start + u64::from(e.pages),
                        self.next_unused
                    ),
                );
                continue;
            }
            for pid in e.page_ids() {
                if !self.claim(pid, owner, &name, Some(leaf)) {
                    break;
                }
            }
        }
        let stats = TreeStats {
            name,
            root,
            height: acc.leaf_depth.map_or(0, |d| d + 1),
            inner_pages: acc.inner_pages,
            leaf_pages: acc.leaf_pages,
            entries: acc.entries,
            leaf_fill: mean(acc.leaf_fill, acc.leaf_pages),
            inner_fill: mean(acc.inner_fill, acc.inner_pages),
        };
        (stats, entries)
    }

    /// Checks one page of a tree; returns the children to visit, in key
    /// order.
    fn visit_page(
        &mut self,
        bytes: &[u8],
        v: &Visit,
        tree: &str,
        acc: &mut Acc,
        entries: Option<&mut Vec<LeafEntry>>,
    ) -> Vec<Visit> {
        let pid = v.pid;
        let node = match Node::new(bytes) {
            Ok(n) => n,
            Err(c) => {
                self.find(Some(pid), Some(tree), format!("btree node: {}", c.what));
                return Vec::new();
            }
        };
        let mut sound = true;
        if let Err(c) = node::check(bytes) {
            self.find(Some(pid), Some(tree), format!("btree node: {}", c.what));
            sound = false;
        }
        let leaf = node.is_leaf();
        let ptype = page::page_type(bytes);
        let type_ok = matches!(
            (ptype, leaf),
            (Some(PageType::Leaf), true) | (Some(PageType::Inner), false)
        );
        if !type_ok {
            self.find(
                Some(pid),
                Some(tree),
                format!(
                    "page type {ptype:?} but the node says it is {}",
                    if leaf { "a leaf" } else { "an inner node" }
                ),
            );
        }
        let from = match v.parent {
            Some(p) => format!("parent page {p}"),
            None => "a root".to_string(),
        };
        if node.lower_fence() != v.lower.as_deref() {
            self.find(
                Some(pid),
                Some(tree),
                format!(
                    "lower fence {} differs from {} given by {from}",
                    show(node.lower_fence(), "-inf"),
                    show(v.lower.as_deref(), "-inf"),
                ),
            );
        }
        if node.upper_fence() != v.upper.as_deref() {
            self.find(
                Some(pid),
                Some(tree),
                format!(
                    "upper fence {} differs from {} given by {from}",
                    show(node.upper_fence(), "+inf"),
                    show(v.upper.as_deref(), "+inf"),
                ),
            );
        }
        if leaf {
            acc.leaf_pages += 1;
            acc.entries += node.len() as u64;
            acc.leaf_fill += node.fill_factor();
            match acc.leaf_depth {
                None => acc.leaf_depth = Some(v.depth),
                Some(d) if d != v.depth => self.find(
                    Some(pid),
                    Some(tree),
                    format!(
                        "leaf at depth {} but the first leaf is at depth {d}",
                        v.depth
                    ),
                ),
                Some(_) => {}
            }
            if sound {
                for i in (0..node.len()).filter(|&i| node.is_ref_at(i)) {
                    match BlobRef::decode(node.payload_at(i), self.pool.page_size()) {
                        Ok(r) => {
                            self.large_values += 1;
                            acc.extents.extend(r.extents.iter().map(|&e| (pid, e)));
                            // A tree being dropped may hold a value
                            // freed in part (its reference cut, its
                            // checksum the whole value's: `catalog.rs`).
                            if tree != DROPPING_TREE
                                && r.extents
                                    .iter()
                                    .all(|e| e.start + u64::from(e.pages) <= self.next_unused)
                            {
                                self.values.push((pid, tree.to_string(), r));
                            }
                        }
                        Err(what) => self.find(Some(pid), Some(tree), what),
                    }
                }
            }
            if let (Some(out), true) = (entries, sound) {
                for i in 0..node.len() {
                    out.push((pid, node.key_vec_at(i), node.payload_at(i).to_vec()));
                }
            }
            return Vec::new();
        }
        acc.inner_pages += 1;
        acc.inner_fill += node.fill_factor();
        if let Some(d) = acc.leaf_depth {
            if v.depth >= d {
                self.find(
                    Some(pid),
                    Some(tree),
                    format!(
                        "inner node at depth {} but the first leaf is at depth {d}",
                        v.depth
                    ),
                );
            }
        }
        if !sound {
            // Child pointers and separators of a node that failed its
            // check are not trusted; its subtree shows up as lost pages.
            return Vec::new();
        }
        let n = node.len();
        let mut out = Vec::with_capacity(n + 1);
        let mut lower = v.lower.clone();
        for i in 0..n {
            let key = node.key_vec_at(i);
            out.push(Visit {
                pid: node.child_at(i),
                parent: Some(pid),
                depth: v.depth + 1,
                lower: lower.take(),
                upper: Some(key.clone()),
            });
            lower = Some(key);
        }
        out.push(Visit {
            pid: node.upper_child(),
            parent: Some(pid),
            depth: v.depth + 1,
            lower,
            upper: v.upper.clone(),
        });
        out
    }

    /// Reads the free-space map and holds it against the ownership the
    /// walks found: the meta and map pages and every owned page must be
    /// marked used, and the free pages must number what the meta page
    /// says. Marks the free pages and the map pages owned; returns the
    /// free pages found.
    async fn check_map(&mut self, recorded: u64) -> u64 {
        let pool = self.pool.clone();
        let geo = pool.space_geometry();
        let mut free = 0u64;
        let mut complete = true;
        let mut first = 0u64;
        for (map_pid, bits) in pool.space_map(self.next_unused).await {
            let bits = match bits {
                Ok(b) => b,
                Err(e) => {
                    self.find(
                        Some(map_pid),
                        None,
                        format!("free-space map page {}", read_error(&e)),
                    );
                    complete = false;
                    // Its group's pages cannot be judged: none is lost.
                    let n = (self.next_unused - first).min(geo.per_group());
                    for pid in first..first + n {
                        if self.owners[pid as usize] == 0 {
                            self.owners[pid as usize] = FREE_OWNER;
                        }
                    }
                    first += n;
                    continue;
                }
            };
            let mut wrong = Vec::new();
            for (i, used) in bits.iter().enumerate() {
                let pid = first + i as u64;
                let owner = self.owners[pid as usize];
                if geo.is_reserved(pid) {
                    self.owners[pid as usize] = SPACE_OWNER;
                    if !used {
                        wrong.push((
                            pid,
                            "the meta page or a map page is marked free".to_string(),
                        ));
                    }
                } else if owner != 0 && !used {
                    wrong.push((
                        pid,
                        format!(
                            "owned by {} but marked free in the map",
                            self.owner_name(owner)
                        ),
                    ));
                } else if !used {
                    self.owners[pid as usize] = FREE_OWNER;
                    free += 1;
                }
            }
            for (pid, what) in wrong {
                self.find(Some(pid), None, what);
            }
            first += bits.len() as u64;
        }
        if complete && free != recorded {
            self.find(
                Some(alloc::META_PAGE),
                None,
                format!("meta page counts {recorded} free pages, the free-space map {free}"),
            );
        }
        free
    }

    /// Reports pages nobody owns, one finding per run of consecutive ids.
    fn lost_pages(&mut self) -> u64 {
        let mut lost = 0;
        let mut run: Option<(u64, u64)> = None;
        let mut runs = Vec::new();
        for pid in 1..self.next_unused {
            if self.owners[pid as usize] == 0 {
                lost += 1;
                run = match run {
                    Some((a, b)) if b + 1 == pid => Some((a, pid)),
                    Some(r) => {
                        runs.push(r);
                        Some((pid, pid))
                    }
                    None => Some((pid, pid)),
                };
            }
        }
        runs.extend(run);
        for (a, b) in runs {
            let what = if a == b {
                "lost: owned by no tree and marked used in the free-space map".to_string()
            } else {
                format!(
                    "pages {a}..={b} ({} pages) are lost: owned by no tree and marked used in the free-space map",
                    b - a + 1
                )
            };
            self.find(Some(a), None, what);
        }
        lost
    }
}

fn mean(sum: f64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Checks the database in `pool` (its meta page must be open): the
/// catalogue, every tree it names, the free-space map and the page
/// accounting.
/// Must run on a worker (inside a task); [`crate::Db::check`] does that.
///
/// Returns `Err` only if the meta page cannot be read; every other problem
/// is a [`Finding`] in the report.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
/// let pool = db.pool().clone();
/// let report = db.block_on(async move { dana::check::check_pool(&pool).await }).unwrap().unwrap();
/// assert!(report.is_ok());
/// assert_eq!(report, db.check().unwrap()); // what `Db::check` runs
/// ```
pub async fn check_pool(pool: &Arc<BufferPool>) -> Result<CheckReport> {
    check_pool_and_free(pool).await.map(|(report, _)| report)
}

/// [`check_pool`], and what of each page below the high-water mark
/// [`check_mirrors`] compares.
pub(crate) async fn check_pool_and_free(
    pool: &Arc<BufferPool>,
) -> Result<(CheckReport, PagesInUse)> {
    run(pool, false)
        .await
        .map(|(report, in_use, _)| (report, in_use))
}

/// Writes a whole copy of every large value over its damaged copies on
/// mirrored devices (the check's value pass, repairing instead of
/// reporting; `blob_repairs` counts them). The one write the checker
/// makes: `Db::rebuild` runs it. Returns what of each page the copies
/// must agree on and the high-water mark, for the comparison of the
/// copies page by page that follows ([`check_mirrors`]).
pub(crate) async fn repair_value_copies(pool: &Arc<BufferPool>) -> Result<(PagesInUse, u64)> {
    if pool.array().copies() < 2 {
        return Ok((PagesInUse::default(), 0));
    }
    run(pool, true)
        .await
        .map(|(report, in_use, _)| (in_use, report.space.next_unused))
}

/// The check, repairing large values' damaged copies if `repair`.
async fn run(pool: &Arc<BufferPool>, repair: bool) -> Result<(CheckReport, PagesInUse, u64)> {
    // A repair holds it from before any reference is read until every
    // value is repaired: no extent freed meanwhile is handed out again,
    // so a repair never writes over another value (while it lasts, large
    // values freed do not make room). A check needs none: it reads a
    // quiescent database (module doc).
    let _values_held = repair.then(|| pool.blob_reader());
    let space = pool.space().await?;
    let mut c = Checker {
        pool: pool.clone(),
        next_unused: space.next_unused.min(space.total_pages),
        owners: Vec::new(),
        names: vec![CATALOG_TREE.to_string()],
        findings: Vec::new(),
        large_values: 0,
        values: Vec::new(),
        repair,
        repaired: 0,
    };
    if space.next_unused > space.total_pages || space.next_unused == 0 {
        c.find(
            Some(alloc::META_PAGE),
            None,
            format!(
                "next unused page {} is outside the array ({} pages)",
                space.next_unused, space.total_pages
            ),
        );
    }
    let len = usize::try_from(c.next_unused).map_err(|_| {
        Error::InvalidArgument(format!(
            "{} pages are too many to check on this machine",
            c.next_unused
        ))
    })?;
    c.owners = vec![0; len];

    let mut roots = Vec::with_capacity(ROOT_SLOTS);
    for slot in 0..ROOT_SLOTS {
        roots.push(pool.root(slot).await?);
    }
    for (slot, &r) in roots.iter().enumerate().skip(DROPPING_SLOT + 1) {
        if r != 0 {
            c.find(
                Some(alloc::META_PAGE),
                None,
                format!("root slot {slot} holds page {r}, a structure this checker does not know (its pages are not accounted for)"),
            );
        }
    }

    let catalog_root = roots[CATALOG_SLOT];
    let (catalog, entries) = if catalog_root == 0 {
        c.find(
            Some(alloc::META_PAGE),
            Some(CATALOG_TREE),
            "meta page has no catalogue root".into(),
        );
        (
            TreeStats {
                name: CATALOG_TREE.into(),
                root: 0,
                height: 0,
                inner_pages: 0,
                leaf_pages: 0,
                entries: 0,
                leaf_fill: 0.0,
                inner_fill: 0.0,
            },
            Vec::new(),
        )
    } else {
        c.walk(1, catalog_root, true, false).await
    };

    let mut tree_roots = Vec::with_capacity(entries.len());
    for (leaf, key, value) in entries {
        let name = String::from_utf8_lossy(&key).into_owned();
        match <[u8; 8]>::try_from(value.as_slice()) {
            Ok(b) => tree_roots.push((name, u64::from_le_bytes(b))),
            Err(_) => c.find(
                Some(leaf),
                Some(CATALOG_TREE),
                format!(
                    "catalogue entry {name:?} holds {} bytes, not a page id",
                    value.len()
                ),
            ),
        }
    }
    let mut trees = Vec::with_capacity(tree_roots.len());
    for (name, root) in tree_roots {
        c.names.push(name);
        let owner = c.names.len() as u32;
        let (stats, _) = c.walk(owner, root, false, false).await;
        trees.push(stats);
    }

    // A create or drop under way (or interrupted: the next writable open
    // completes it) owns the pages reachable from its intent slot.
    for (slot, name, holes) in [
        (CREATING_SLOT, CREATING_TREE, false),
        (DROPPING_SLOT, DROPPING_TREE, true),
    ] {
        let r = roots[slot];
        if r == 0 || trees.iter().any(|t| t.root == r) {
            continue;
        }
        c.names.push(name.to_string());
        let owner = c.names.len() as u32;
        let _ = c.walk(owner, r, false, holes).await;
    }

    let ps = pool.page_size() as u64;
    let tails = c
        .values
        .iter()
        .filter_map(|(_, _, r)| {
            let last = r.len.checked_sub(1)? / ps;
            let used = r.len - last * ps;
            (used < ps).then_some((value_page(r, last)?, used as usize))
        })
        .collect();
    c.check_values().await;
    if c.large_values != space.large_values {
        c.find(
            Some(alloc::META_PAGE),
            None,
            format!(
                "the meta page counts {} large values, the leaves hold {}",
                space.large_values, c.large_values
            ),
        );
    }
    let free_pages = c.check_map(space.free_pages).await;
    let lost_pages = c.lost_pages();
    let in_use = PagesInUse {
        free: c.owners.iter().map(|&o| o == FREE_OWNER).collect(),
        tails,
    };
    let report = CheckReport {
        page_size: pool.page_size(),
        space,
        free_pages,
        catalog,
        trees,
        lost_pages,
        findings: c.findings,
        mirrors: Vec::new(),
        out_of_place: pool
            .array()
            .targets()
            .iter()
            .enumerate()
            .filter_map(|(device, t)| match t {
                crate::io::Target::Remap(r) => Some(OutOfPlaceSummary {
                    device,
                    segments: r.segments(),
                    segment_pages: r.config().segment_pages,
                    free_segments: r.free_segments(),
                    mapped_pages: r.mapped_pages(),
                    offered_pages: r.size() / pool.page_size() as u64,
                }),
                _ => None,
            })
            .collect(),
    };
    Ok((report, in_use, c.repaired))
}

/// The page id of page `k` of large value `r` (None past its extents).
fn value_page(r: &BlobRef, mut k: u64) -> Option<u64> {
    for e in &r.extents {
        if k < u64::from(e.pages) {
            return Some(e.start + k);
        }
        k -= u64::from(e.pages);
    }
    None
}

/// Compares the copies of every mirrored device: a data device page by
/// page below the high-water mark (`next_unused`), a log by reading and
/// scanning each copy alone. Adds a finding for every failed or
/// rebuilding copy (the array is degraded), every page whose copies
/// differ, and every log whose copies disagree. Blocking reads from the
/// calling thread (never a worker); run it on a quiescent database, as
/// the rest of the check (a write between two copies' reads is a false
/// difference). Only the bytes `in_use` names are compared: none of a
/// free page (a large value a crash kept from its commit leaves its
/// extent free and written on one copy only: `dana crashtest --mirrored`
/// met six pages of a value that differed between the copies, both
/// versions values' bytes), and of a large value's last page only the
/// value's bytes (a damaged byte past them failed no checksum, so no
/// repair made the copies agree, and the finding stayed for ever: an
/// outside probe's).
pub fn check_mirrors(
    mirrors: &[Arc<crate::io::mirror::Mirror>],
    width: u64,
    page_size: u64,
    next_unused: u64,
    in_use: &PagesInUse,
    report: &mut CheckReport,
) -> Result<()> {
    let (findings, compared) = compare_mirrors(mirrors, width, page_size, next_unused, in_use)?;
    report.findings.extend(findings);
    report.mirrors.extend(compared);
    Ok(())
}

/// [`check_mirrors`]' comparison: its findings, and what it compared.
pub(crate) fn compare_mirrors(
    mirrors: &[Arc<crate::io::mirror::Mirror>],
    width: u64,
    page_size: u64,
    next_unused: u64,
    in_use: &PagesInUse,
) -> Result<(Vec<Finding>, Vec<MirrorCheck>)> {
    use crate::io::mirror::{CopyState, Role};
    let ps = page_size;
    let (mut findings, mut compared) = (Vec::new(), Vec::new());
    for m in mirrors {
        let finding = |what: String, page: Option<u64>| Finding {
            page,
            tree: None,
            what,
            mirror: Some(m.role()),
        };
        let device = match m.role() {
            Role::Data(i) => Some(i as u64),
            Role::Log(_) => None,
        };
        let states = m.states();
        for (c, s) in states.iter().enumerate() {
            if *s != CopyState::Healthy {
                findings.push(finding(
                    format!(
                        "{} copy {c} is {s:?}: the device is degraded (dana rebuild)",
                        m.role()
                    ),
                    None,
                ));
            }
        }
        let mut healthy: Vec<usize> = (0..states.len())
            .filter(|&c| states[c] == CopyState::Healthy)
            .collect();
        let mut mc = MirrorCheck {
            role: m.role(),
            states: states.clone(),
            pages_compared: 0,
            divergent: Vec::new(),
        };
        let Some(device) = device else {
            for what in crate::wal::recover::compare_mirror(m) {
                findings.push(finding(what, None));
            }
            compared.push(mc);
            continue;
        };
        if healthy.len() < 2 {
            compared.push(mc);
            continue;
        }
        // Pages of this device below the high-water mark: p = k * width + device.
        let pages = next_unused.saturating_sub(device).div_ceil(width);
        let batch = (1u64 << 20) / ps;
        let mut k = 0;
        // Waited once: a write in flight during the reads.
        let mut settled = false;
        // A copy whose read fails is failed (`Mirror::read_copies`; its
        // rebuild copies it whole): the device's comparison starts again
        // over the copies left, if two are (what it found so far was
        // aligned to the copies it compared), else stops. At most once
        // per copy.
        let mut findings_at = findings.len();
        let mut restart = |c: usize,
                           mc: &mut MirrorCheck,
                           findings: &mut Vec<Finding>,
                           healthy: &mut Vec<usize>| {
            findings.truncate(findings_at);
            findings.push(finding(
                format!(
                    "{} copy {c} ({}) failed while the copies were compared (dana rebuild \
                     rebuilds it)",
                    m.role(),
                    m.copy_name(c)
                ),
                None,
            ));
            findings_at = findings.len();
            mc.states = m.states();
            mc.divergent.clear();
            mc.pages_compared = 0;
            healthy.retain(|&h| h != c);
            healthy.len() >= 2
        };
        'device: while k < pages {
            let n = batch.min(pages - k);
            let copies = match m.read_copies(&healthy, k * ps, (n * ps) as usize)? {
                Ok(copies) => copies,
                Err(c) => {
                    if restart(c, &mut mc, &mut findings, &mut healthy) {
                        (k, settled) = (0, false);
                        continue 'device;
                    }
                    break 'device;
                }
            };
            for j in 0..n as usize {
                let pid = (k + j as u64) * width + device;
                let bytes = in_use.bytes(pid, ps as usize);
                if bytes == 0 {
                    continue;
                }
                let at = j * ps as usize..(j + 1) * ps as usize;
                let meant = at.start..at.start + bytes;
                let first = &copies[0][meant.clone()];
                mc.pages_compared += 1;
                if copies[1..].iter().all(|b| b[meant.clone()] == *first) {
                    continue;
                }
                // Read again, a moment later: the engine writes pages back
                // in the background, and a write in flight during the
                // reads (it completes once on every copy) made the copies
                // look different (as a log flush did, an outside probe).
                if !settled {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    settled = true;
                }
                let again = match m.read_copies(&healthy, (k + j as u64) * ps, ps as usize)? {
                    Ok(again) => again,
                    Err(c) => {
                        if restart(c, &mut mc, &mut findings, &mut healthy) {
                            (k, settled) = (0, false);
                            continue 'device;
                        }
                        break 'device;
                    }
                };
                if again[1..].iter().all(|b| b[..bytes] == again[0][..bytes]) {
                    continue;
                }
                let valid: Vec<bool> = again.iter().map(|b| page::verify(b, pid).is_ok()).collect();
                let versions: Vec<&[u8]> = again
                    .iter()
                    .zip(&valid)
                    .filter(|&(_, &v)| v)
                    .map(|(b, _)| &b[..])
                    .collect();
                let repair = if versions.windows(2).all(|w| w[0] == w[1]) && !versions.is_empty() {
                    "dana rebuild repairs it (and so does a read that meets the damaged copy)"
                } else if newest_version(&versions).is_some() {
                    "valid versions differ: dana rebuild writes the newest (the highest page \
                     LSN below the log's end) over the others"
                } else if !versions.is_empty() {
                    "valid versions of the same page LSN differ: no copy can be told the \
                     newest, and dana rebuild leaves it"
                } else {
                    "no copy is a page with a header, as a large value's pages: the value's \
                     own finding, if any, names its damaged copies, which dana rebuild repairs"
                };
                findings.push(finding(
                    format!(
                        "the copies of {} differ here (copies {healthy:?} valid: {valid:?}); \
                         {repair}",
                        m.role()
                    ),
                    Some(pid),
                ));
                mc.divergent.push((pid, valid));
            }
            k += n;
        }
        compared.push(mc);
    }
    Ok((findings, compared))
}
