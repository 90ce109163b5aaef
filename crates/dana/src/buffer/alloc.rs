//! The meta page (page 0) and persistent page allocation.
//!
//! Owns: the meta page's layout and the free-page list. Pages are handed
//! out from the free list first (freed pages, chained through their first
//! body word), then from the high-water mark `next_unused`. All changes go
//! through the buffer pool like any page change, so they reach storage by
//! write-back and flush (and, with the log, become recoverable).
//!
//! Meta page layout (after the 32-byte page header):
//!
//! | bytes    | field                                        |
//! |----------|----------------------------------------------|
//! | 32..40   | magic `DANAMETA`                             |
//! | 40..44   | format version ([`FORMAT_VERSION`])          |
//! | 44..48   | page size                                    |
//! | 48..52   | array width (devices)                        |
//! | 56..64   | next never-used page id                      |
//! | 64..72   | head of the free list (0: empty)             |
//! | 72..80   | pages in the free list                       |
//! | 80..88   | log identity (0: the database has no log)    |
//! | 128..384 | 32 root slots (u64 page ids) for upper layers|
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
//! `UNLOGGED` flag).
//!
//! When the pages run low the array grows (`grow.rs`); a reservation or an
//! allocation short of pages waits for that growth, or fails with
//! [`Error::NoSpace`] when the array cannot grow.
//!
//! Never: hands out page 0, or a page beyond the array's durable size.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::page::{self, PageType, PAGE_HEADER_SIZE};
use super::page_table::{EVICTED, EXCLUSIVE};
use super::{BufferPool, PageMut};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"DANAMETA";
/// The on-disk format this build reads and writes (see the module doc).
pub const FORMAT_VERSION: u32 = 4;
const OFF_MAGIC: usize = 32;
const OFF_VERSION: usize = 40;
const OFF_PAGE_SIZE: usize = 44;
const OFF_WIDTH: usize = 48;
const OFF_NEXT: usize = 56;
const OFF_FREE_HEAD: usize = 64;
const OFF_FREE_COUNT: usize = 72;
const OFF_LOG_ID: usize = 80;
const OFF_ROOTS: usize = 128;
/// Number of root slots in the meta page.
pub const ROOT_SLOTS: usize = 32;
/// Where a freed page stores the next free page id.
const OFF_FREE_NEXT: usize = PAGE_HEADER_SIZE;

/// The meta page id.
pub const META_PAGE: u64 = 0;

/// In-memory allocation state (shared with the growth thread).
#[derive(Default)]
pub(crate) struct AllocState {
    ready: AtomicBool,
    /// Pages that can still be handed out (never used + free list).
    pub(crate) available: AtomicU64,
    /// Pages promised to commits in flight ([`BufferPool::reserve`]).
    pub(crate) reserved: AtomicU64,
    /// Growth of the array on demand.
    pub(crate) growth: super::grow::Growth,
}

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
        self.pool
            .alloc
            .reserved
            .fetch_sub(self.pages, Ordering::AcqRel);
    }
}

/// How much of the array is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Pages the array holds.
    pub total_pages: u64,
    /// The first page id never handed out.
    pub next_unused: u64,
    /// Pages in the free list.
    pub free_pages: u64,
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

impl BufferPool {
    /// Makes a brand-new page resident without reading it: zeroed, with a
    /// header, exclusively latched and dirty.
    async fn create_page(&self, pid: u64, t: PageType) -> Result<PageMut<'_>> {
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
        if !self.table.try_transition(pid, EVICTED, EXCLUSIVE) {
            self.return_frames(&[f]);
            return Err(Error::Corrupt {
                page: pid,
                what: "a page handed out as never used is resident".into(),
            });
        }
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
        };
        page::init_page(&mut g, pid, t);
        Ok(g)
    }

    /// Formats a new database: writes a fresh meta page (page 0).
    pub async fn format(&self) -> Result<()> {
        let mut m = self.create_page(META_PAGE, PageType::Meta).await?;
        m[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(MAGIC);
        m[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        m[OFF_PAGE_SIZE..OFF_PAGE_SIZE + 4].copy_from_slice(&(self.page_size as u32).to_le_bytes());
        m[OFF_WIDTH..OFF_WIDTH + 4].copy_from_slice(&(self.array.width() as u32).to_le_bytes());
        put_u64(&mut m, OFF_NEXT, 1);
        drop(m);
        self.alloc
            .available
            .store(self.array.pages().saturating_sub(1), Ordering::Release);
        self.alloc.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The identity of the database's log (0: none).
    pub async fn log_id(&self) -> Result<u64> {
        let m = self.fix_shared(META_PAGE).await?;
        Ok(get_u64(&m, OFF_LOG_ID))
    }

    /// Records the identity of the database's log in the meta page (made
    /// durable by the next checkpoint or flush).
    pub async fn set_log_id(&self, id: u64) -> Result<()> {
        let mut m = self.fix_exclusive(META_PAGE).await?;
        put_u64(&mut m, OFF_LOG_ID, id);
        Ok(())
    }

    /// Opens an existing database: reads and checks the meta page.
    pub async fn open_meta(&self) -> Result<SpaceInfo> {
        let m = self.fix_shared(META_PAGE).await?;
        let bad = |what: String| Error::Corrupt {
            page: META_PAGE,
            what,
        };
        if page::page_type(&m) != Some(PageType::Meta) || &m[OFF_MAGIC..OFF_MAGIC + 8] != MAGIC {
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
        if info.next_unused > info.total_pages || info.next_unused == 0 {
            return Err(bad(format!(
                "next unused page {} out of range",
                info.next_unused
            )));
        }
        drop(m);
        self.set_available(&info);
        self.alloc.ready.store(true, Ordering::Release);
        Ok(info)
    }

    fn check_ready(&self) -> Result<()> {
        if !self.alloc.ready.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "format() or open_meta() must run before pages are allocated".into(),
            ));
        }
        Ok(())
    }

    /// Allocates a page of type `t`: zeroed, with a header, exclusively
    /// latched and dirty. The meta page change and the new page are logged
    /// together.
    pub async fn allocate(&self, t: PageType) -> Result<PageMut<'_>> {
        let mut m = self.fix_exclusive(META_PAGE).await?;
        let mut p = self.allocate_in(&mut m, t).await?;
        self.log_group(&mut [&mut m, &mut p])?;
        Ok(p)
    }

    /// Allocates a page of type `t` with the meta page latched by the
    /// caller (who logs both in one group with the rest of its change).
    pub async fn allocate_in(&self, m: &mut PageMut<'_>, t: PageType) -> Result<PageMut<'_>> {
        self.allocate_in_for(m, t, false).await
    }

    /// [`BufferPool::allocate_in`] for an apply that holds a
    /// [`Reservation`] (`reserved`: it may take reserved pages) or not (it
    /// must leave them free).
    pub async fn allocate_in_for(
        &self,
        m: &mut PageMut<'_>,
        t: PageType,
        reserved: bool,
    ) -> Result<PageMut<'_>> {
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
        debug_assert_eq!(m.pid(), META_PAGE);
        let head = get_u64(m, OFF_FREE_HEAD);
        if head != 0 {
            let mut p = self.fix_exclusive(head).await?;
            if page::page_type(&p) != Some(PageType::Free) {
                return Err(Error::Corrupt {
                    page: head,
                    what: "page in the free list is not marked free".into(),
                });
            }
            let next = get_u64(&p, OFF_FREE_NEXT);
            put_u64(m, OFF_FREE_HEAD, next);
            let count = get_u64(m, OFF_FREE_COUNT);
            put_u64(m, OFF_FREE_COUNT, count.saturating_sub(1));
            page::init_page(&mut p, head, t);
            self.took_page();
            return Ok(p);
        }
        let pid = get_u64(m, OFF_NEXT);
        if pid >= self.array.pages() {
            return Err(Error::NoSpace(format!(
                "all {} pages of the array are in use",
                self.array.pages()
            )));
        }
        put_u64(m, OFF_NEXT, pid + 1);
        let p = self.create_page(pid, t).await?;
        self.took_page();
        Ok(p)
    }

    /// Reserves `pages` for a commit's apply, growing the array if they
    /// are not free, or fails with [`Error::NoSpace`] when it cannot grow
    /// (nothing logged yet, nothing poisoned).
    pub async fn reserve(&self, pages: u64) -> Result<Reservation<'_>> {
        // Loops when a growth finished or another commit took the room.
        loop {
            if let Some(r) = self.try_reserve(pages) {
                return Ok(r);
            }
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

    /// One attempt of [`BufferPool::reserve`]: None if the pages are not
    /// free now.
    fn try_reserve(&self, pages: u64) -> Option<Reservation<'_>> {
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
        let _ = self
            .alloc
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        self.grow_if_low();
    }

    fn set_available(&self, info: &SpaceInfo) {
        let n = info.total_pages.saturating_sub(info.next_unused) + info.free_pages;
        self.alloc.available.store(n, Ordering::Release);
    }

    /// Returns a page to the free list.
    pub async fn free_page(&self, mut page: PageMut<'_>) -> Result<()> {
        let mut m = self.fix_exclusive(META_PAGE).await?;
        self.free_in(&mut m, &mut page)?;
        self.log_group(&mut [&mut m, &mut page])
    }

    /// Returns a page to the free list with the meta page latched by the
    /// caller (who logs both).
    pub fn free_in(&self, m: &mut PageMut<'_>, page: &mut PageMut<'_>) -> Result<()> {
        self.check_ready()?;
        debug_assert_eq!(m.pid(), META_PAGE);
        let pid = page.pid();
        if pid == META_PAGE {
            return Err(Error::InvalidArgument(
                "the meta page cannot be freed".into(),
            ));
        }
        let head = get_u64(m, OFF_FREE_HEAD);
        page::init_page(page, pid, PageType::Free);
        put_u64(page, OFF_FREE_NEXT, head);
        put_u64(m, OFF_FREE_HEAD, pid);
        let count = get_u64(m, OFF_FREE_COUNT);
        put_u64(m, OFF_FREE_COUNT, count + 1);
        self.alloc.available.fetch_add(1, Ordering::AcqRel);
        Ok(())
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

    /// The page id in root slot `slot`, with the meta page latched by the
    /// caller.
    pub fn root_in(&self, m: &PageMut<'_>, slot: usize) -> Result<u64> {
        check_slot(slot)?;
        debug_assert_eq!(m.pid(), META_PAGE);
        Ok(get_u64(m, OFF_ROOTS + 8 * slot))
    }

    /// Stores a page id in root slot `slot`, with the meta page latched by
    /// the caller (who logs it, in one group with the rest of its change).
    pub fn set_root_in(&self, m: &mut PageMut<'_>, slot: usize, pid: u64) -> Result<()> {
        check_slot(slot)?;
        debug_assert_eq!(m.pid(), META_PAGE);
        put_u64(m, OFF_ROOTS + 8 * slot, pid);
        Ok(())
    }

    /// How much of the array is used.
    pub async fn space(&self) -> Result<SpaceInfo> {
        let m = self.fix_shared(META_PAGE).await?;
        Ok(space_of(&m, self.array.pages()))
    }

    /// The head of the free list (0: empty), for a checker that follows
    /// the list itself with [`free_list_next`] and keeps going past a bad
    /// page.
    pub async fn free_list_head(&self) -> Result<u64> {
        let m = self.fix_shared(META_PAGE).await?;
        Ok(get_u64(&m, OFF_FREE_HEAD))
    }

    /// The free list, head first (for `dana check`). Stops with an error
    /// at a cycle or a page that is not free.
    pub async fn free_list(&self) -> Result<Vec<u64>> {
        let info = self.space().await?;
        let mut out = Vec::new();
        let mut next = self
            .fix_shared(META_PAGE)
            .await
            .map(|m| get_u64(&m, OFF_FREE_HEAD))?;
        while next != 0 {
            if out.len() as u64 > info.free_pages || next >= info.next_unused {
                return Err(Error::Corrupt {
                    page: next,
                    what: "free list is longer than its count or points past the used pages".into(),
                });
            }
            out.push(next);
            let p = self.fix_shared(next).await?;
            if page::page_type(&p) != Some(PageType::Free) {
                return Err(Error::Corrupt {
                    page: next,
                    what: "page in the free list is not marked free".into(),
                });
            }
            next = get_u64(&p, OFF_FREE_NEXT);
        }
        Ok(out)
    }
}

/// The page after `page` in the free list (0: the last one): the first
/// body word of a page of type [`PageType::Free`].
pub fn free_list_next(page: &[u8]) -> u64 {
    page.get(OFF_FREE_NEXT..OFF_FREE_NEXT + 8)
        .map_or(0, |b| get_u64(b, 0))
}

fn space_of(m: &[u8], total_pages: u64) -> SpaceInfo {
    SpaceInfo {
        total_pages,
        next_unused: get_u64(m, OFF_NEXT),
        free_pages: get_u64(m, OFF_FREE_COUNT),
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
