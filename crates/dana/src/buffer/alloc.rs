//! The meta page (page 0) and persistent page allocation.
//!
//! Owns: the meta page's layout and page allocation through the
//! free-space map (`space_map.rs`: one bit per page, in map pages). A
//! page is handed out from the lowest free bit below the high-water mark
//! `next_unused`, else from the mark (which formats a group's map page
//! when it enters a new group). Every space change happens under the meta
//! page's exclusive latch ([`SpaceGuard`]) and is logged in one group with
//! the change that needed it, so it reaches storage by write-back and is
//! redone by recovery like any page change. The in-memory copy of the map
//! (`Mirror`) follows every change under the same latch; it is loaded
//! from the map pages at open.
//!
//! Meta page layout (after the 32-byte page header):
//!
//! | bytes    | field                                        |
//! |----------|----------------------------------------------|
//! | 32..40   | magic `DANAMETA`                             |
//! | 40..44   | format version ([`FORMAT_VERSION`])          |
//! | 44..48   | page size                                    |
//! | 48..52   | array width (devices)                        |
//! | 56..64   | next never-used page id (the high-water mark)|
//! | 64..72   | large values in the database (references)    |
//! | 72..80   | free pages below the high-water mark         |
//! | 80..88   | log identity (0: the database has no log)    |
//! | 88..92   | number of logs (one per worker at creation)  |
//! | 96..104  | checkpoint stamp: the redo GSN of the last checkpoint whose write-back began (0: none yet) |
//! | 128..384 | 32 root slots (u64 page ids) for upper layers|
//! | 384..896 | each log's end (an LSN) the last checkpoint whose write-back began made durable before it wrote this page (0: unknown) |
//!
//! (Upper layers give the slots their meaning: the catalogue in slot 0,
//! a create's and a drop's intent in slots 1 and 2; see `catalog.rs`.)
//!
//! Format versions: every change to an on-disk format (meta page, node
//! pages, log records, control blocks) bumps [`FORMAT_VERSION`]; a build
//! reads only its own version and names both in the error otherwise (no
//! silent upgrade). Version 2 added the log identity; version 3 the intent
//! slots of `catalog.rs`; version 4 the log format in which a commit's
//! leaf changes are logged only by its commit record (the page header's
//! `UNLOGGED` flag); version 5 the free-space map in place of the free
//! list; version 6 large values (leaf references, commit records that
//! carry the map changes of their extents, the count at bytes 64..72);
//! version 7 per-worker logs (the number of logs at bytes 88..92, the
//! GSN in every record and in the page LSN field, control blocks naming
//! their log's place and a GSN); version 8 the leaf-cut page entry (a
//! split's left half logged as its cut key, `wal::record::CUT`); version
//! 9 the compressed full page image (`wal::record::LZ4`); version 10 the
//! checkpoint stamp at bytes 96..104. The log ends at bytes 384..896 came
//! without a version: those bytes were zero in every version-10 meta page,
//! and zero means "unknown" (nothing checked), so older files open and a
//! build before them ignores the bytes. Version 11: commit records' flags
//! at header byte 17 (`wal::record::APPENDED_AGAIN`): a build before it
//! would re-apply a recovery's unfinished batch.
//!
//! Each checkpoint also records every log's end, durable before the meta
//! page is written: at open each log, its valid end rounded up to its
//! flush block, must reach its own (with several logs, the stamp's check
//! against the newest log's end let one log put back from an older copy
//! pass; an outside probe).
//!
//! The checkpoint stamp ties the data files to a moment of the log. Every
//! checkpoint sets it to its redo GSN (a logged change of the meta page)
//! before its write-back, and writes the meta page with its shard's pages,
//! so the devices hold the stamp before any control block names that redo
//! GSN: in files that belong together, the stamp read from an intact meta
//! page is at least the newest control block's redo GSN and below the GSN
//! after the log's last record. The open checks both (`recovery.rs`):
//! data files older than the log (their stamp below its redo GSN) would
//! lose the commits in between, data files newer than it (their stamp past
//! its end) hold pages whose changes it never logged.
//!
//! When the pages run low the array grows (`grow.rs`); a reservation or an
//! allocation short of pages waits for that growth, or fails with
//! [`Error::NoSpace`] when the array cannot grow.
//!
//! Never: hands out the meta page or a map page, or a page beyond the
//! array's durable size; changes the map without the meta page latched.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::page::{self, PageType, PAGE_HEADER_SIZE};
use super::page_table::{EVICTED, EXCLUSIVE};
use super::space_map::{Geometry, Mirror};
use super::{BufferPool, PageMut, StructureGuard};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"DANAMETA";
/// The on-disk format this build reads and writes (see the module doc).
pub const FORMAT_VERSION: u32 = 11;
const OFF_MAGIC: usize = 32;
const OFF_VERSION: usize = 40;
const OFF_PAGE_SIZE: usize = 44;
const OFF_WIDTH: usize = 48;
const OFF_NEXT: usize = 56;
/// Large values in the database (was the free list's head before v6).
const OFF_LARGE_VALUES: usize = 64;
const OFF_FREE_COUNT: usize = 72;
const OFF_LOG_ID: usize = 80;
const OFF_LOG_COUNT: usize = 88;
const OFF_CHECKPOINT_STAMP: usize = 96;
const OFF_ROOTS: usize = 128;
/// Each log's stream position (LSN) that the last checkpoint whose
/// write-back began made durable before it wrote this page: one u64 per
/// log, [`META_LOG_ENDS`] at most (0: unknown).
const OFF_LOG_ENDS: usize = 384;
/// The most logs whose ends the meta page records.
pub const META_LOG_ENDS: usize = 64;
/// Number of root slots in the meta page.
pub const ROOT_SLOTS: usize = 32;

/// The meta page id.
pub const META_PAGE: u64 = 0;

/// In-memory allocation state (shared with the growth thread).
#[derive(Default)]
pub(crate) struct AllocState {
    ready: AtomicBool,
    /// Pages that can still be handed out (past the high-water mark and
    /// free below it; map pages excluded).
    pub(crate) available: AtomicU64,
    /// Pages promised to commits in flight ([`BufferPool::reserve`]).
    pub(crate) reserved: AtomicU64,
    /// Tasks waiting for promises to end
    /// ([`BufferPool::reserve_after_promises`]), woken by each
    /// [`Reservation`] dropped.
    promise_waiters: crate::sched::WakerList,
    /// Growth of the array on demand.
    pub(crate) growth: super::grow::Growth,
    /// The free-space map in memory (changed under the meta page latch,
    /// and by large values' holds, which mark pages used in memory only).
    mirror: Mutex<Mirror>,
    /// Large values: reader epochs, retired extents, the live count.
    pub(crate) blobs: super::blob::BlobState,
    /// Runs of pages freed and not yet trimmed, with the GSN of the
    /// record of their free (`trim.rs`).
    pub(super) freed: Mutex<Vec<(u64, u64, u64)>>,
    /// Bumped (under `freed`'s lock) each time notes had to be dropped
    /// because the list was full: a trim that took its list before then
    /// may hold an older note of a page whose newer free went unnoted.
    pub(super) freed_dropped: AtomicU64,
    /// Pages trimmed.
    pub(super) trimmed: AtomicU64,
    /// Pages freed in memory that changed hands around the pool since
    /// each watcher began (or began again): taken for a large value, or
    /// held for a trim (both drop the pages' frames next,
    /// [`BufferPool::discard`]). A slot per watcher; nothing is recorded
    /// while none watches. The repair of a page's copies (`scrub.rs`)
    /// latches or claims the page and then asks whether it is here: not
    /// here since its check's walk began, the page the walk saw in use has
    /// not been written around the pool since.
    pub(super) handovers: Mutex<Vec<Option<Handovers>>>,
    /// Runs of freed pages a large value took, while its write is under
    /// way (`blob.rs`): a fault of one of them (a stale reader's, a
    /// read-ahead's) is read without the mirror's page check, whose
    /// repair would write the old tree page found on a copy the value's
    /// write has not reached over a copy it has. With the count of runs,
    /// so a fault looks at the list only while there are some.
    pub(super) taken_runs: Mutex<Vec<super::blob::Extent>>,
    pub(super) taken_run_count: std::sync::atomic::AtomicUsize,
}

/// The pages one watcher saw change hands (see [`AllocState::handovers`]).
#[derive(Debug, Default)]
pub(super) struct Handovers {
    pages: std::collections::HashSet<u64>,
    /// More than [`MAX_HANDOVERS`] were noted: every page counts as moved.
    overflowed: bool,
}

/// Pages one watcher records at most (8 bytes and some each); past it,
/// every page counts as handed over.
pub(super) const MAX_HANDOVERS: usize = 1 << 20;

/// Pages reserved for one commit's apply; released on drop.
///
/// The invariant behind it: a commit reserves the most pages its apply can
/// allocate before its commit record is written, so a commit that can
/// fail for space fails before it is logged, and recovery (which re-applies
/// logged commits) never needs more space than the database had. Only
/// allocations made for a reservation may use reserved pages.
pub struct Reservation<'a> {
    pool: &'a BufferPool,
    pages: u64,
}

impl Reservation<'_> {
    /// Pages reserved.
    pub fn pages(&self) -> u64 {
        self.pages
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let a = &self.pool.alloc;
        // SeqCst with the waiter's register-then-load: either it sees this
        // release or this sees it parked.
        a.reserved.fetch_sub(self.pages, Ordering::SeqCst);
        if a.promise_waiters.has_waiters() {
            a.promise_waiters.wake_all();
        }
    }
}

/// A page chosen and marked used in memory whose claim has not finished:
/// dropped (the claim failed, or its future was dropped), it takes the
/// page off the count of available pages (see `allocate_in_except`).
struct Unclaimed<'a>(&'a BufferPool);

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        self.0.take_available(1);
    }
}

/// A free frame taken for a new page, given back to the free list when
/// dropped unless [`HeldFrame::keep`] took it.
struct HeldFrame<'a> {
    pool: &'a BufferPool,
    frame: Option<u32>,
}

impl HeldFrame<'_> {
    /// The frame is the new page's: not given back.
    fn keep(mut self) {
        self.frame = None;
    }
}

impl Drop for HeldFrame<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.frame.take() {
            self.pool.return_frames(&[f]);
        }
    }
}

/// How much of the array is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Pages the array holds.
    pub total_pages: u64,
    /// The first page id never handed out.
    pub next_unused: u64,
    /// Free pages below the high-water mark (as the meta page counts
    /// them).
    pub free_pages: u64,
    /// Large values in the database (as the meta page counts them).
    pub large_values: u64,
}

/// What the meta page says about the database, read from its first bytes
/// before the buffer pool exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaFacts {
    /// Page size in bytes.
    pub page_size: usize,
    /// Devices the database is striped over.
    pub width: usize,
    /// Identity of the database's log (0: no log).
    pub log_id: u64,
    /// Number of logs (0: no log).
    pub logs: u32,
    /// The checkpoint stamp (the module doc): the redo GSN of the last
    /// checkpoint whose write-back began; 0 if none did, or if the page
    /// failed its checksum (nothing to check against then).
    pub checkpoint_stamp: u64,
    /// Each log's stream position (LSN) that checkpoint made durable
    /// before it wrote the meta page (0: unknown): a log that ends before
    /// its own is older than the data files.
    pub log_ends: [u64; META_LOG_ENDS],
}

/// The high-water mark (the first page never handed out) the meta page
/// `meta` records; read without a check (verify the page first).
pub fn meta_next_unused(meta: &[u8]) -> u64 {
    get_u64(meta, OFF_NEXT)
}

/// The page size a meta page names, if `first` starts like a meta page
/// (the magic) and the size is one dana uses; None otherwise. Read before
/// the checksum is checked: the checksum covers the whole page.
pub fn meta_page_size(first: &[u8]) -> Option<usize> {
    if first.len() < 4096 || !has_meta_magic(first) {
        return None;
    }
    let page_size = get_u32(first, OFF_PAGE_SIZE) as usize;
    (page_size.is_power_of_two() && (4096..=65536).contains(&page_size)).then_some(page_size)
}

/// True if `first` holds the meta page's magic (it is a dana database,
/// or a damaged one).
pub fn has_meta_magic(first: &[u8]) -> bool {
    first.len() >= OFF_MAGIC + 8 && &first[OFF_MAGIC..OFF_MAGIC + 8] == MAGIC
}

/// Reads the facts of a meta page from its first bytes (at least 4096).
/// `Err` says why the bytes are not the meta page of a dana database in
/// this build's format (the checksum is verified later, by the pool).
pub fn meta_facts(first: &[u8]) -> std::result::Result<MetaFacts, String> {
    if first.len() < 4096 {
        return Err(format!(
            "not a dana database: {} bytes, shorter than a page",
            first.len()
        ));
    }
    if &first[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
        return Err("not a dana database (no DANAMETA magic in its first page)".into());
    }
    let version = get_u32(first, OFF_VERSION);
    if version != FORMAT_VERSION {
        return Err(format!(
            "dana format version {version}; this build reads version {FORMAT_VERSION} only"
        ));
    }
    let page_size = get_u32(first, OFF_PAGE_SIZE) as usize;
    if !page_size.is_power_of_two() || !(4096..=65536).contains(&page_size) {
        return Err(format!("meta page names an invalid page size {page_size}"));
    }
    let width = get_u32(first, OFF_WIDTH) as usize;
    if width == 0 {
        return Err("meta page names zero devices".into());
    }
    Ok(MetaFacts {
        page_size,
        width,
        log_id: get_u64(first, OFF_LOG_ID),
        logs: get_u32(first, OFF_LOG_COUNT),
        checkpoint_stamp: get_u64(first, OFF_CHECKPOINT_STAMP),
        log_ends: std::array::from_fn(|i| get_u64(first, OFF_LOG_ENDS + 8 * i)),
    })
}

fn get_u64(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_le_bytes(b)
}

fn put_u64(p: &mut [u8], at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(p: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&p[at..at + 4]);
    u32::from_le_bytes(b)
}

/// The meta page, exclusively latched, and the map pages an allocation or
/// free under it has latched: every space change happens through one,
/// and is logged in one group with the change that needed it
/// ([`BufferPool::log_with_space`]). The meta page's latch serializes all
/// space changes (and the in-memory [`Mirror`] follows them under it).
pub struct SpaceGuard<'a> {
    pub(super) meta: PageMut<'a>,
    pub(super) maps: Vec<PageMut<'a>>,
    /// Runs of pages freed under this guard: noted for a trim when the
    /// guard is logged (`trim.rs`).
    pub(super) freed: Vec<(u64, u64)>,
    /// The structure guard [`BufferPool::lock_space`] took (None when the
    /// caller holds one: a split or merge). Declared last: released after
    /// the latches above.
    _structure: Option<StructureGuard<'a>>,
}

impl Drop for SpaceGuard<'_> {
    /// A guard dropped with changes not logged (an error or a dropped
    /// future after an allocation or a free changed its pages) logs them in
    /// one record, as [`BufferPool::log_with_space`] would. Each page
    /// logged on its own when unlatched, a crash between the records could
    /// keep the meta page's high-water mark past a map page the allocation
    /// had formatted and whose record was lost: every open then failed
    /// `Corrupt` (a review's finding). A failed append poisons the pool.
    fn drop(&mut self) {
        let pending = |p: &PageMut<'_>| p.touched || p.fresh;
        if std::thread::panicking() || !(pending(&self.meta) || self.maps.iter().any(pending)) {
            return;
        }
        let pool = self.meta.pool;
        let mut all: Vec<&mut PageMut<'_>> = vec![&mut self.meta];
        all.extend(self.maps.iter_mut());
        let _poisons_on_failure = pool.log_group(&mut all);
    }
}

impl<'a> SpaceGuard<'a> {
    /// The meta page.
    pub fn meta(&self) -> &PageMut<'a> {
        &self.meta
    }

    /// The meta page, for a change logged with the guard.
    pub fn meta_mut(&mut self) -> &mut PageMut<'a> {
        &mut self.meta
    }

    /// Large values in the database (meta page bytes 64..72).
    pub fn large_values(&self) -> u64 {
        get_u64(&self.meta, OFF_LARGE_VALUES)
    }

    /// Sets the count of large values (logged with the guard).
    pub fn set_large_values(&mut self, n: u64) {
        put_u64(&mut self.meta, OFF_LARGE_VALUES, n);
    }

    /// The latched map page `pid`, latching it if needed.
    async fn map(&mut self, pool: &'a BufferPool, pid: u64) -> Result<&mut PageMut<'a>> {
        let i = match self.maps.iter().position(|m| m.pid() == pid) {
            Some(i) => i,
            None => {
                let m = pool.fix_exclusive(pid).await?;
                if page::page_type(&m) != Some(PageType::SpaceMap) {
                    return Err(Error::Corrupt {
                        page: pid,
                        what: "the free-space map page is not a map page".into(),
                    });
                }
                self.maps.push(m);
                self.maps.len() - 1
            }
        };
        Ok(&mut self.maps[i])
    }
}

impl BufferPool {
    pub(super) fn geometry(&self) -> Geometry {
        Geometry::new(self.page_size)
    }

    pub(super) fn mirror(&self) -> std::sync::MutexGuard<'_, Mirror> {
        self.alloc.mirror.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes page `pid` resident for a new use without reading it: zeroed,
    /// with a header of type `t`, exclusively latched and dirty. A page
    /// still resident from an earlier use (freed, not yet evicted) is
    /// latched and re-initialised instead.
    async fn new_page(&self, pid: u64, t: PageType, may_be_resident: bool) -> Result<PageMut<'_>> {
        self.check_pid(pid)?;
        let f = loop {
            if let Some(f) = self.take_frame() {
                break f;
            }
            if let Some(e) = self.poisoned() {
                return Err(e);
            }
            self.wait_for_frame().await;
        };
        // Given back however this ends short of using it: by an error, or
        // by this future being dropped while it waits below (a frame lost
        // until the next open; a review of cancellation safety).
        let held = HeldFrame {
            pool: self,
            frame: Some(f),
        };
        // Never read from the device: a freed page's bytes there may be
        // trimmed zeros or a large value's, which fail the checksum (the
        // first version fell back to a fix, which read them when a stale
        // reader had the page loading or eviction took it meanwhile, and
        // failed the allocation after its map bit was set).
        let mut rounds = 0u64;
        while !self.table.try_transition(pid, EVICTED, EXCLUSIVE) {
            if !may_be_resident {
                return Err(Error::Corrupt {
                    page: pid,
                    what: "a page handed out as never used is resident".into(),
                });
            }
            if let Some(mut p) = self.try_latch_resident(pid) {
                drop(held);
                page::init_page(&mut p, pid, t);
                // New all the same: logged whole, never as a difference
                // from the frame. The frame may hold a version the device
                // no longer has (a stale reader faulted the freed page in
                // while a large value took it and wrote over it): a
                // difference would not compose at redo, and with pages
                // written whole (no images) the page could not be rebuilt
                // at all (a review's finding).
                p.make_fresh();
                return Ok(p);
            }
            // Being read (a stale reader, a read-ahead) or latched by a
            // reader that will see it freed: wait, then look again.
            self.read_settled(pid).await;
            rounds += 1;
            if rounds % 1024 == 0 {
                if let Some(e) = self.poisoned() {
                    return Err(e);
                }
            }
        }
        held.keep();
        self.frames[f as usize]
            .checked
            .store(false, Ordering::Release);
        self.frames[f as usize].pid.store(pid, Ordering::Release);
        self.arrived(f, true);
        self.table.set_frame(pid, f);
        let mut g = PageMut {
            pool: self,
            pid,
            frame: f,
            before: None,
            fresh: true,
            touched: false,
            cover: 0,
            cut: None,
        };
        page::init_page(&mut g, pid, t);
        Ok(g)
    }

    /// Formats a new database: writes a fresh meta page (page 0) and the
    /// first free-space map page (page 1).
    pub async fn format(&self) -> Result<()> {
        let mut m = self.new_page(META_PAGE, PageType::Meta, false).await?;
        m[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(MAGIC);
        m[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        m[OFF_PAGE_SIZE..OFF_PAGE_SIZE + 4].copy_from_slice(&(self.page_size as u32).to_le_bytes());
        m[OFF_WIDTH..OFF_WIDTH + 4].copy_from_slice(&(self.array.width() as u32).to_le_bytes());
        put_u64(&mut m, OFF_NEXT, 2);
        let geo = self.geometry();
        let mut map = self
            .new_page(geo.map_page(0), PageType::SpaceMap, false)
            .await?;
        for pid in [META_PAGE, geo.map_page(0)] {
            let (at, mask) = geo.bit(pid);
            map[at] |= mask;
        }
        drop(map);
        drop(m);
        {
            let mut mirror = self.mirror();
            *mirror = Mirror::new();
            mirror.extend_to(2);
            mirror.set(0);
            mirror.set(1);
        }
        self.alloc
            .available
            .store(geo.usable(2, self.array.pages()), Ordering::Release);
        self.alloc.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The identity of the database's log (0: none).
    pub async fn log_id(&self) -> Result<u64> {
        let m = self.fix_shared(META_PAGE).await?;
        Ok(get_u64(&m, OFF_LOG_ID))
    }

    /// Records the identity and number of the database's logs in the meta
    /// page (made durable by the next checkpoint or flush).
    pub async fn set_log_id(&self, id: u64, logs: u32) -> Result<()> {
        let mut m = self.fix_exclusive(META_PAGE).await?;
        put_u64(&mut m, OFF_LOG_ID, id);
        m[OFF_LOG_COUNT..OFF_LOG_COUNT + 4].copy_from_slice(&logs.to_le_bytes());
        Ok(())
    }

    /// Sets the checkpoint stamp (the module doc) to `redo_gsn` if it is
    /// older, and each log's recorded end to `log_ends[i]` (stream
    /// positions durable before the meta page is written) if it is
    /// lower: a change of the meta page, logged like any, so recovery
    /// redoes it wherever the page is rebuilt from the log.
    pub async fn stamp_checkpoint(&self, redo_gsn: u64, log_ends: &[u64]) -> Result<()> {
        let ends = &log_ends[..log_ends.len().min(META_LOG_ENDS)];
        let behind = |m: &[u8]| {
            get_u64(m, OFF_CHECKPOINT_STAMP) < redo_gsn
                || ends
                    .iter()
                    .enumerate()
                    .any(|(i, &e)| get_u64(m, OFF_LOG_ENDS + 8 * i) < e)
        };
        if !behind(&self.fix_shared(META_PAGE).await?) {
            return Ok(());
        }
        let mut m = self.fix_exclusive(META_PAGE).await?;
        if !behind(&m) {
            m.unchanged();
            return Ok(());
        }
        if get_u64(&m, OFF_CHECKPOINT_STAMP) < redo_gsn {
            put_u64(&mut m, OFF_CHECKPOINT_STAMP, redo_gsn);
        }
        for (i, &e) in ends.iter().enumerate() {
            if get_u64(&m, OFF_LOG_ENDS + 8 * i) < e {
                put_u64(&mut m, OFF_LOG_ENDS + 8 * i, e);
            }
        }
        Ok(())
    }

    /// Opens an existing database: reads and checks the meta page, and
    /// loads the free-space map.
    pub async fn open_meta(&self) -> Result<SpaceInfo> {
        let info = {
            let m = self.fix_shared(META_PAGE).await?;
            let bad = |what: String| Error::Corrupt {
                page: META_PAGE,
                what,
            };
            if page::page_type(&m) != Some(PageType::Meta) || &m[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC
            {
                return Err(bad("not a dana meta page (bad magic)".into()));
            }
            let version = get_u32(&m, OFF_VERSION);
            if version != FORMAT_VERSION {
                return Err(bad(format!(
                    "format version {version}, this build reads {FORMAT_VERSION}"
                )));
            }
            let ps = get_u32(&m, OFF_PAGE_SIZE) as usize;
            if ps != self.page_size {
                return Err(Error::InvalidArgument(format!(
                    "database has page size {ps}, opened with {}",
                    self.page_size
                )));
            }
            let width = get_u32(&m, OFF_WIDTH) as usize;
            if width != self.array.width() {
                return Err(Error::InvalidArgument(format!(
                    "database spans {width} devices, opened with {}",
                    self.array.width()
                )));
            }
            let info = space_of(&m, self.array.pages());
            if info.next_unused > info.total_pages || info.next_unused < 2 {
                return Err(bad(format!(
                    "next unused page {} out of range",
                    info.next_unused
                )));
            }
            info
        };
        let loaded = self.load_map(info.next_unused).await.and_then(|mirror| {
            if mirror.free_below_mark() != info.free_pages {
                return Err(Error::Corrupt {
                    page: META_PAGE,
                    what: format!(
                        "the meta page counts {} free pages below page {}, the free-space map {}",
                        info.free_pages,
                        info.next_unused,
                        mirror.free_below_mark()
                    ),
                });
            }
            Ok(mirror)
        });
        let mirror = match loaded {
            Ok(m) => m,
            // A read-only open allocates nothing: a damaged map must not
            // keep the data from being read or checked (`dana check`
            // reports the map page).
            Err(Error::Corrupt { .. }) if self.read_only => Mirror::all_used(info.next_unused),
            Err(e) => return Err(e),
        };
        *self.mirror() = mirror;
        self.set_available(&info);
        self.alloc
            .blobs
            .live
            .store(info.large_values, Ordering::Release);
        self.alloc.ready.store(true, Ordering::Release);
        Ok(info)
    }

    /// Reads the map pages of every group below `next_unused` into a
    /// mirror, checking that each marks itself (and the first the meta
    /// page) used.
    async fn load_map(&self, next_unused: u64) -> Result<Mirror> {
        let geo = self.geometry();
        let mut mirror = Mirror::new();
        mirror.extend_to(next_unused);
        for g in 0..next_unused.div_ceil(geo.per_group()) {
            let pid = geo.map_page(g);
            let p = self.fix_shared(pid).await?;
            if page::page_type(&p) != Some(PageType::SpaceMap) {
                return Err(Error::Corrupt {
                    page: pid,
                    what: "the free-space map page is not a map page".into(),
                });
            }
            mirror.load_group(g * geo.per_group(), &p[PAGE_HEADER_SIZE..]);
            let own = if g == 0 {
                vec![META_PAGE, pid]
            } else {
                vec![pid]
            };
            if let Some(free) = own.into_iter().find(|&q| !mirror.is_used(q)) {
                return Err(Error::Corrupt {
                    page: pid,
                    what: format!("the free-space map marks reserved page {free} free"),
                });
            }
        }
        Ok(mirror)
    }

    pub(super) fn check_ready(&self) -> Result<()> {
        if !self.alloc.ready.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "format() or open_meta() must run before pages are allocated".into(),
            ));
        }
        Ok(())
    }

    /// Latches the meta page for space changes (and root slot changes),
    /// under the structure guard ([`BufferPool::structure_change`]): its
    /// holder may latch many map pages (one per 127 MiB group a large
    /// value's extents lie in) while it waits for frames. The caller
    /// holds no page latch.
    pub async fn lock_space(&self) -> Result<SpaceGuard<'_>> {
        let structure = self.structure_change().await;
        Ok(SpaceGuard {
            meta: self.fix_exclusive(META_PAGE).await?,
            maps: Vec::new(),
            freed: Vec::new(),
            _structure: Some(structure),
        })
    }

    /// [`BufferPool::lock_space`] for a caller that holds the structure
    /// guard already (a split or merge, with tree pages latched).
    pub async fn lock_space_under<'a>(
        &'a self,
        _held: &StructureGuard<'a>,
    ) -> Result<SpaceGuard<'a>> {
        Ok(SpaceGuard {
            meta: self.fix_exclusive(META_PAGE).await?,
            maps: Vec::new(),
            freed: Vec::new(),
            _structure: None,
        })
    }

    /// Logs the changes of `pages` and of the space guard's pages as one
    /// record ([`BufferPool::log_group`]).
    pub fn log_with_space<'a>(
        &'a self,
        pages: &mut [&mut PageMut<'a>],
        space: &mut SpaceGuard<'a>,
    ) -> Result<()> {
        let mut all: Vec<&mut PageMut<'a>> = pages.iter_mut().map(|p| &mut **p).collect();
        all.push(&mut space.meta);
        all.extend(space.maps.iter_mut());
        self.log_group(&mut all)?;
        self.note_freed(space);
        Ok(())
    }

    /// Allocates a page of type `t`: zeroed, with a header, exclusively
    /// latched and dirty. The space change and the new page are logged
    /// together.
    pub async fn allocate(&self, t: PageType) -> Result<PageMut<'_>> {
        let mut s = self.lock_space().await?;
        let mut p = self.allocate_in(&mut s, t).await?;
        self.log_with_space(&mut [&mut p], &mut s)?;
        Ok(p)
    }

    /// Allocates a page of type `t` under the caller's space guard (who
    /// logs it, in one group with the rest of its change).
    pub async fn allocate_in<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        t: PageType,
    ) -> Result<PageMut<'a>> {
        self.allocate_in_for(s, t, false).await
    }

    /// [`BufferPool::allocate_in`] for an apply that holds a
    /// [`Reservation`] (`reserved`: it may take reserved pages) or not (it
    /// must leave them free).
    pub async fn allocate_in_for<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        t: PageType,
        reserved: bool,
    ) -> Result<PageMut<'a>> {
        self.allocate_in_except(s, t, reserved, |_| false).await
    }

    /// [`BufferPool::allocate_in_for`], never handing out a page for which
    /// `skip` is true (a new tree's root: never a root dropped since open).
    pub(crate) async fn allocate_in_except<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        t: PageType,
        reserved: bool,
        skip: impl Fn(u64) -> bool,
    ) -> Result<PageMut<'a>> {
        self.check_ready()?;
        // An allocation outside a commit's reservation reserves its page
        // too (waiting for a growth if none is free): checking for room and
        // then taking the page would let a commit reserve the same page in
        // between, and that commit's apply would fail after its record.
        let _own = if reserved {
            None
        } else {
            Some(self.reserve(1).await?)
        };
        // The page is marked used in memory the moment it is chosen: a
        // large value's hold takes runs from the in-memory copy without
        // the space guard, and must never see this page free while the
        // awaits below run.
        let (pid, reused) = match self.take_free_except(&skip) {
            Some(pid) => (pid, true),
            None => match self.extend_mark(s).await {
                // The free pages are all to be passed over: the array
                // grows for this one (see `grow_now`), unless a page was
                // freed since the search (a hold given back).
                Err(Error::NoSpace(_)) if self.mirror().free_below_mark() > 0 => {
                    match self.take_free_except(&skip) {
                        Some(pid) => (pid, true),
                        None => {
                            self.grow_now().await?;
                            (self.extend_mark(s).await?, false)
                        }
                    }
                }
                r => (r?, false),
            },
        };
        // On an error below the page stays used in memory: a page lost
        // until the next open is safe, a page handed out twice is not. It
        // leaves the count of available pages all the same (it was counted
        // there, as free or past the mark): counted, a commit would be
        // admitted for a page that is not there, and its apply would fail
        // after its record (a review's finding).
        // Also when the caller drops this future during the claim's
        // awaits (a plain write's split, cancelled): the page stays used
        // in memory, and counted it was one more than there are (a
        // review's finding).
        let unclaimed = Unclaimed(self);
        let p = self.claim_chosen(s, pid, t, reused).await?;
        std::mem::forget(unclaimed);
        self.took_page();
        Ok(p)
    }

    /// The lowest free page below the mark for which `skip` is false,
    /// marked used in memory at once, if any.
    fn take_free_except(&self, skip: &impl Fn(u64) -> bool) -> Option<u64> {
        let mut m = self.mirror();
        let pid = m.find_free_except(skip)?;
        m.set(pid);
        Some(pid)
    }

    /// The rest of an allocation of page `pid`, chosen and used in memory:
    /// its frame, its map bit and the meta page's free count.
    async fn claim_chosen<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        pid: u64,
        t: PageType,
        reused: bool,
    ) -> Result<PageMut<'a>> {
        let geo = self.geometry();
        let map = s.map(self, geo.map_page_of(pid)).await?;
        let (at, mask) = geo.bit(pid);
        if map[at] & mask != 0 {
            return Err(Error::Corrupt {
                page: map.pid(),
                what: format!("the free-space map marks page {pid} used, its copy in memory free"),
            });
        }
        // The frame first, the map bit after: a failure taking the frame
        // (a poisoned pool wakes the tasks waiting for one) changes no
        // page. Each changed page of the guard is logged when it drops,
        // and a map bit logged without the meta page's count made the
        // next open fail with `Corrupt` (a review's finding).
        let p = self.new_page(pid, t, reused).await?;
        map[at] |= mask;
        // A page past the old mark was counted free by extend_mark.
        let meta = s.meta_mut();
        let count = get_u64(meta, OFF_FREE_COUNT);
        put_u64(meta, OFF_FREE_COUNT, count.saturating_sub(1));
        Ok(p)
    }

    /// Moves the high-water mark past one more page that can be handed
    /// out, formatting the map page of a group it enters on the way, and
    /// returns that page: marked used in memory (in the same critical
    /// section that moves the in-memory mark, so no hold running on
    /// another worker can take it in between), still free in the map.
    pub(super) async fn extend_mark<'a>(&'a self, s: &mut SpaceGuard<'a>) -> Result<u64> {
        let geo = self.geometry();
        let first = get_u64(s.meta(), OFF_NEXT);
        // At most two turns: a map page, then a page to hand out.
        for pid in first..first + 2 {
            if pid >= self.array.pages() {
                return Err(Error::NoSpace(format!(
                    "all {} pages of the array are in use",
                    self.array.pages()
                )));
            }
            // A group's map page takes its frame before the mark moves
            // past it: failed (a poisoned pool), nothing changed (the mark
            // logged past a map page never written made the next open
            // fail; a review's finding).
            let map = if geo.is_reserved(pid) {
                Some(self.new_page(pid, PageType::SpaceMap, false).await?)
            } else {
                None
            };
            put_u64(s.meta_mut(), OFF_NEXT, pid + 1);
            {
                let mut m = self.mirror();
                m.extend_to(pid + 1);
                let set = m.set(pid);
                debug_assert!(set);
            }
            let Some(mut map) = map else {
                // Counted free below the mark until the caller takes it.
                let count = get_u64(s.meta(), OFF_FREE_COUNT);
                put_u64(s.meta_mut(), OFF_FREE_COUNT, count + 1);
                return Ok(pid);
            };
            let (at, mask) = geo.bit(pid);
            map[at] |= mask;
            s.maps.push(map);
        }
        Err(Error::Corrupt {
            page: META_PAGE,
            what: "two map pages in a row".into(),
        })
    }

    /// Reserves `pages` for a commit's apply, growing the array if they
    /// are not free, or fails with [`Error::NoSpace`] when it cannot grow
    /// (nothing logged yet, nothing poisoned).
    pub async fn reserve(&self, pages: u64) -> Result<Reservation<'_>> {
        // Loops when a growth finished or another commit took the room.
        let mut retried = false;
        loop {
            self.release_retired();
            if let Some(r) = self.try_reserve(pages) {
                return Ok(r);
            }
            if retried {
                // The room looked there and another commit took it first:
                // let this worker's other tasks run before trying again
                // (a loop that never yields stops the worker's I/O too).
                crate::sched::yield_now().await;
            }
            retried = true;
            self.wait_for_space(pages).await.map_err(|e| match e {
                Error::NoSpace(why) => Error::NoSpace(format!(
                    "{why}; this write may need {pages} pages, {} are free and {} promised \
                     to commits in flight (delete data to make room)",
                    self.alloc.available.load(Ordering::Acquire),
                    self.alloc.reserved.load(Ordering::Acquire)
                )),
                other => other,
            })?;
        }
    }

    /// [`BufferPool::reserve`], but where the array cannot grow and the
    /// pages are free yet promised to other commits in flight, waits for
    /// those commits to end (each gives back what its apply did not take)
    /// and tries again; fails with [`Error::NoSpace`] only when the free
    /// pages themselves fall short, or no promise is left to wait for.
    /// Concurrent commits each promise the most their apply can take (a
    /// whole path per key), far more than they take, so without the wait a
    /// nearly full database refused commits with half its pages free.
    ///
    /// Only for a caller that holds no key stripe and no reservation: the
    /// commits it waits for may need its stripes to end, and two waiters
    /// holding promises would wait for each other.
    pub(crate) async fn reserve_after_promises(&self, pages: u64) -> Result<Reservation<'_>> {
        // Each round ends when a promise does (or the space runs out for
        // good). Not bounded in time: the waiter has no place in line, so
        // under a steady stream of new promises a large commit can wait
        // long.
        let a = &self.alloc;
        loop {
            let before = a.reserved.load(Ordering::SeqCst);
            let err = match self.reserve(pages).await {
                Err(Error::NoSpace(why)) => why,
                other => return other,
            };
            let promised = a.reserved.load(Ordering::SeqCst);
            if promised != before {
                // A promise ended (or began) while it failed: try again,
                // after the other tasks of this worker had their turn.
                crate::sched::yield_now().await;
                continue;
            }
            if promised == 0 || a.available.load(Ordering::Acquire) < pages {
                return Err(Error::NoSpace(err));
            }
            a.promise_waiters.until_changed(&a.reserved, promised).await;
        }
    }

    /// [`BufferPool::reserve`] if the pages are free now, else None (never
    /// waits, never grows the array: for a caller holding locks, which
    /// lets them go and calls `reserve`).
    pub fn reserve_now(&self, pages: u64) -> Option<Reservation<'_>> {
        self.release_retired();
        self.try_reserve(pages)
    }

    /// One attempt of [`BufferPool::reserve`]: None if the pages are not
    /// free now.
    fn try_reserve(&self, pages: u64) -> Option<Reservation<'_>> {
        if pages == 0 {
            // Nothing to promise. Compared as any other, a commit that
            // needs no page (a delete) failed whenever pages were taken
            // while still promised (a large value's, through its write and
            // sync: the count falls below the promises for seconds), and
            // its `reserve` spun without yielding, as the wait for space
            // finds zero pages always there: the worker's I/O and log
            // flushes stopped with it (a review's finding).
            return Some(Reservation {
                pool: self,
                pages: 0,
            });
        }
        let a = &self.alloc;
        let mut cur = a.reserved.load(Ordering::Acquire);
        loop {
            if a.available.load(Ordering::Acquire) < cur + pages {
                return None;
            }
            match a.reserved.compare_exchange_weak(
                cur,
                cur + pages,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Reservation { pool: self, pages }),
                Err(v) => cur = v,
            }
        }
    }

    fn took_page(&self) {
        self.took_pages(1);
    }

    /// Freed pages `pids` change hands around the pool (see
    /// [`AllocState::handovers`]): called after they left the in-memory
    /// map and before their frames are dropped. The lock orders it with a
    /// repair's question: asked before this, the repair's latch or claim
    /// was taken before, and the frame drop that follows waits for it.
    pub(super) fn note_handover(&self, pids: impl IntoIterator<Item = u64> + Clone) {
        let mut w = self.watches();
        for h in w.iter_mut().flatten() {
            if h.overflowed {
                continue;
            }
            for pid in pids.clone() {
                if h.pages.len() >= MAX_HANDOVERS {
                    h.pages = Default::default();
                    h.overflowed = true;
                    break;
                }
                h.pages.insert(pid);
            }
        }
    }

    /// Starts recording the pages handed over; returns the watcher's slot
    /// (give it back with [`BufferPool::unwatch_handovers`]).
    pub(crate) fn watch_handovers(&self) -> usize {
        let mut w = self.watches();
        let fresh = Some(Handovers::default());
        match w.iter().position(Option::is_none) {
            Some(slot) => {
                w[slot] = fresh;
                slot
            }
            None => {
                w.push(fresh);
                w.len() - 1
            }
        }
    }

    /// Forgets what watcher `slot` recorded so far (a new walk begins).
    pub(crate) fn rewatch_handovers(&self, slot: usize) {
        self.set_watch(slot, Some(Handovers::default()));
    }

    /// Stops watcher `slot`.
    pub(crate) fn unwatch_handovers(&self, slot: usize) {
        self.set_watch(slot, None);
    }

    fn set_watch(&self, slot: usize, to: Option<Handovers>) {
        if let Some(h) = self.watches().get_mut(slot) {
            *h = to;
        }
    }

    /// The watchers' sets ([`AllocState::handovers`]).
    fn watches(&self) -> std::sync::MutexGuard<'_, Vec<Option<Handovers>>> {
        self.alloc
            .handovers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether page `pid` changed hands since watcher `slot` began (true
    /// for a slot that does not watch: nothing is known).
    pub(crate) fn handed_over(&self, slot: usize, pid: u64) -> bool {
        let w = self.watches();
        match w.get(slot) {
            Some(Some(h)) => h.overflowed || h.pages.contains(&pid),
            _ => true,
        }
    }

    /// `n` pages were handed out.
    pub(super) fn took_pages(&self, n: u64) {
        self.take_available(n);
        self.grow_if_low();
    }

    /// Takes up to `n` pages off the count of available pages (never
    /// below zero); returns how many it took.
    pub(super) fn take_available(&self, n: u64) -> u64 {
        self.alloc
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            })
            .map_or(0, |v| v.min(n))
    }

    /// Sets (`set`) or clears the map bit of page `pid` under the guard,
    /// moving the meta page's free count with it; the bit must be the
    /// other way. The in-memory copy is not touched (large values hold
    /// and release their pages there themselves).
    /// With `check_only`, only checks that it can.
    pub(super) async fn flip_bit<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        pid: u64,
        set: bool,
        check_only: bool,
    ) -> Result<()> {
        let geo = self.geometry();
        if geo.is_reserved(pid) || pid >= get_u64(s.meta(), OFF_NEXT) {
            return Err(Error::Corrupt {
                page: pid,
                what: "a large value names the meta page, a map page or a page past the mark"
                    .into(),
            });
        }
        let map = s.map(self, geo.map_page_of(pid)).await?;
        let (at, mask) = geo.bit(pid);
        if (map[at] & mask != 0) == set {
            return Err(Error::Corrupt {
                page: map.pid(),
                what: format!(
                    "the free-space map already marks page {pid} {} (a large value's extent)",
                    if set { "used" } else { "free" }
                ),
            });
        }
        if check_only {
            return Ok(());
        }
        if set {
            map[at] |= mask;
        } else {
            map[at] &= !mask;
        }
        let meta = s.meta_mut();
        let count = get_u64(meta, OFF_FREE_COUNT);
        put_u64(
            meta,
            OFF_FREE_COUNT,
            if set {
                count.saturating_sub(1)
            } else {
                count + 1
            },
        );
        Ok(())
    }

    fn set_available(&self, info: &SpaceInfo) {
        let n = self.geometry().usable(info.next_unused, info.total_pages) + info.free_pages;
        self.alloc.available.store(n, Ordering::Release);
    }

    /// Frees a page no tree names (nobody else waits for its latch: it is
    /// held here while [`BufferPool::lock_space`] waits for the structure
    /// guard).
    pub async fn free_page(&self, mut page: PageMut<'_>) -> Result<()> {
        let mut s = self.lock_space().await?;
        self.free_in(&mut s, &mut page).await?;
        self.log_with_space(&mut [&mut page], &mut s)
    }

    /// Frees a page under the caller's space guard (who logs both). The
    /// page becomes a page of type `Free` and its bit in the map is
    /// cleared.
    pub async fn free_in<'a>(
        &'a self,
        s: &mut SpaceGuard<'a>,
        page: &mut PageMut<'_>,
    ) -> Result<()> {
        self.check_ready()?;
        let pid = page.pid();
        let geo = self.geometry();
        if geo.is_reserved(pid) {
            return Err(Error::InvalidArgument(format!(
                "page {pid} (the meta page or a free-space map page) cannot be freed"
            )));
        }
        if pid >= get_u64(s.meta(), OFF_NEXT) {
            // A tree naming a page past the high-water mark (damaged or
            // forged): its bit may be set in a map page, but the map in
            // memory never holds it (the clear below asserted; a review's
            // finding).
            return Err(Error::Corrupt {
                page: pid,
                what: "a page past the high-water mark is being freed".into(),
            });
        }
        let map = s.map(self, geo.map_page_of(pid)).await?;
        let (at, mask) = geo.bit(pid);
        if map[at] & mask == 0 {
            return Err(Error::Corrupt {
                page: map.pid(),
                what: format!("page {pid} is freed twice (its map bit is clear)"),
            });
        }
        let released = self.unallocate_in(s, page);
        debug_assert!(released, "its map page was just latched");
        s.freed.push((pid, 1));
        Ok(())
    }

    /// Clears `page`'s bit in its map page, which `s` holds latched, makes
    /// it a page of type `Free` and counts it free (the meta page's count
    /// and the pool's); false (nothing done) if `s` does not hold that map
    /// page. [`BufferPool::free_in`] frees a page with it; a root split
    /// undoes its first allocation with it, never waiting (the allocation
    /// latched the map page in `s`) when its second allocation fails or its
    /// future is dropped (the first new page, logged used and named by no
    /// tree, was lost for good; a review's finding).
    pub(crate) fn unallocate_in(&self, s: &mut SpaceGuard<'_>, page: &mut PageMut<'_>) -> bool {
        let pid = page.pid();
        let geo = self.geometry();
        let map_pid = geo.map_page_of(pid);
        let Some(map) = s.maps.iter_mut().find(|m| m.pid() == map_pid) else {
            return false;
        };
        let (at, mask) = geo.bit(pid);
        map[at] &= !mask;
        page::init_page(page, pid, PageType::Free);
        let meta = s.meta_mut();
        let count = get_u64(meta, OFF_FREE_COUNT);
        put_u64(meta, OFF_FREE_COUNT, count + 1);
        self.mirror().clear(pid);
        self.alloc.available.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// The page id stored in root slot `slot` (0 if unset).
    pub async fn root(&self, slot: usize) -> Result<u64> {
        check_slot(slot)?;
        let m = self.fix_shared(META_PAGE).await?;
        Ok(get_u64(&m, OFF_ROOTS + 8 * slot))
    }

    /// Stores a page id in root slot `slot`.
    pub async fn set_root(&self, slot: usize, pid: u64) -> Result<()> {
        check_slot(slot)?;
        let mut m = self.fix_exclusive(META_PAGE).await?;
        put_u64(&mut m, OFF_ROOTS + 8 * slot, pid);
        Ok(())
    }

    /// The page id in root slot `slot`, under the caller's space guard.
    pub fn root_in(&self, s: &SpaceGuard<'_>, slot: usize) -> Result<u64> {
        check_slot(slot)?;
        Ok(get_u64(s.meta(), OFF_ROOTS + 8 * slot))
    }

    /// Stores a page id in root slot `slot` under the caller's space guard
    /// (who logs it, in one group with the rest of its change).
    pub fn set_root_in(&self, s: &mut SpaceGuard<'_>, slot: usize, pid: u64) -> Result<()> {
        check_slot(slot)?;
        put_u64(s.meta_mut(), OFF_ROOTS + 8 * slot, pid);
        Ok(())
    }

    /// How much of the array is used.
    pub async fn space(&self) -> Result<SpaceInfo> {
        let m = self.fix_shared(META_PAGE).await?;
        Ok(space_of(&m, self.array.pages()))
    }

    /// The free-space map as stored, for a checker: per page below the
    /// high-water mark, whether its bit says used (`None` for the pages of
    /// a group whose map page could not be read, with the error).
    pub async fn space_map(&self, next_unused: u64) -> Vec<(u64, Result<Vec<bool>>)> {
        let geo = self.geometry();
        let mut out = Vec::new();
        for g in 0..next_unused.div_ceil(geo.per_group()) {
            let pid = geo.map_page(g);
            let first = g * geo.per_group();
            let last = (first + geo.per_group()).min(next_unused);
            let bits = match self.fix_shared(pid).await {
                Ok(p) if page::page_type(&p) == Some(PageType::SpaceMap) => Ok((first..last)
                    .map(|q| {
                        let (at, mask) = geo.bit(q);
                        p[at] & mask != 0
                    })
                    .collect()),
                Ok(_) => Err(Error::Corrupt {
                    page: pid,
                    what: "the free-space map page is not a map page".into(),
                }),
                Err(e) => Err(e),
            };
            out.push((pid, bits));
        }
        out
    }

    /// Where the free-space map's pages are (for a checker).
    pub fn space_geometry(&self) -> Geometry {
        self.geometry()
    }
}

fn space_of(m: &[u8], total_pages: u64) -> SpaceInfo {
    SpaceInfo {
        total_pages,
        next_unused: get_u64(m, OFF_NEXT),
        free_pages: get_u64(m, OFF_FREE_COUNT),
        large_values: get_u64(m, OFF_LARGE_VALUES),
    }
}

fn check_slot(slot: usize) -> Result<()> {
    if slot >= ROOT_SLOTS {
        return Err(Error::InvalidArgument(format!(
            "root slot {slot} out of range (0..{ROOT_SLOTS})"
        )));
    }
    Ok(())
}
