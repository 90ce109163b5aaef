//! Repair of a page's damaged copies on mirrored devices.
//!
//! Owns: [`BufferPool::repair_page_copies`], which `Db::rebuild` runs for
//! every page whose healthy copies differ while some copy is a valid page.
//! A mirrored read repairs a damaged copy only when it happens to read
//! that copy; otherwise the damage stays until the other copy is lost too.
//!
//! A page in the pool: the repair writes the pool's own version, under
//! its exclusive latch, and only while the page is clean and no
//! write-back of it is in flight: then the frame holds what every healthy
//! copy held when the page was last written, and no write-back can start
//! (it takes the exclusive latch) and land a newer version that the
//! repair would then overwrite with an older one on one copy. A dirty
//! page, or one being written, needs nothing: its write-back writes every
//! copy. The frame is written only over copies that fail or hold an older
//! version (a lower page LSN), and only when a
//! valid copy holds exactly what it holds.
//!
//! A page not in the pool: the repair claims it as being read (EVICTED ->
//! LOADING, with an in-flight entry, so every fault, allocation and frame
//! drop of it waits), reads each healthy copy alone, and writes the
//! newest valid version over the copies that are not a valid page or an
//! older one, then lets it
//! go (EVICTED).
//!
//! Either way, while latched or claimed nothing can be written to the
//! page through the pool. Around the pool, a freed page can be taken by a
//! large value or trimmed; both note the pages as handed over
//! (`alloc.rs`, under a lock, for each watcher) before they drop the
//! pages' frames ([`BufferPool::discard`], which waits for the latch or
//! the claim). So the repair, before it writes, asks whether the page was
//! handed over since its check's walk began: not, the page holds a tree
//! page's versions only (the walk found it in use), and any later
//! handover of it waits for the repair; handed over, it leaves the page.
//! This leans on a freed page being unreachable from the trees when it is
//! freed (a merge frees it under its parent's exclusive latch, a drop
//! unlinks it in the same log group), and free in the map until a large
//! value taking it commits, after its write is synced on every copy: a
//! walk that sees such a page in use sees the value's, not a tree's.
//! (Two review findings: a page freed since the comparison and taken by a
//! large value whose write has not landed yet would get an old tree page
//! over the value's bytes; and a stale reader's fault of such a page puts
//! the old tree page in a frame, which the first version wrote over both
//! copies of the value. The first guard was one count for the whole
//! database, and a database writing large values left every page.)
//!
//! The version written over a page not in the pool is the newest its
//! valid copies hold: the highest page LSN, which grows with every logged
//! change, so a copy that missed a write (a write the device lost) holds
//! a lower one and is written over. Only LSNs below the log's next GSN
//! count: a valid page past it is none of this database's versions (an
//! earlier database's page on a reused device, or a large value's bytes
//! made to look like a page) and is written over as damage. Valid copies
//! that differ at the same LSN are damage no LSN tells apart, and without
//! a log no version is taken over another: both left to the check's
//! finding.
//!
//! Never: writes a version other than the pool's clean one or the newest
//! valid version the copies hold, writes over a copy that holds a valid
//! page of that LSN or a higher one, or marks a page dirty without a
//! logged change (a write with no record since the
//! checkpoint could tear the good copies with nothing to rebuild them).

use std::sync::atomic::Ordering;

use std::sync::Arc;

use super::page_table::{lock_of, EVICTED, LOADING};
use super::{page, BufferPool, PageMut};
use crate::io::{AlignedBuf, IoBuf, Placement, Request, ReusableBuf};
use crate::sched::{self, IoWait};
use crate::{Error, Result};

/// Times the repair looks again at a page latched by someone else before
/// it leaves it (yielding between looks).
const LATCH_TRIES: usize = 1000;

impl BufferPool {
    /// Writes a valid version of page `pid` over its copies that are not a
    /// valid page or an older version of it, among the copies `healthy` (copy numbers of the page's
    /// mirrored device), unless the page changed hands since watcher
    /// `watch` ([`BufferPool::watch_handovers`]) began, before the check's
    /// walk that found the page in use. A page in the pool gets
    /// the pool's version if it is clean, not being written, and what a
    /// valid copy holds; a page not in the pool, the newest version its
    /// valid copies hold (see the module doc). Holds the page's latch, or its claim, until the
    /// writes are done (one page: whoever wants it waits that long).
    pub(crate) async fn repair_page_copies(
        &self,
        pid: u64,
        healthy: &[u8],
        watch: usize,
    ) -> Result<PageRepair> {
        if healthy.len() < 2 || self.read_only || self.check_pid(pid).is_err() {
            return Ok(PageRepair::Nothing);
        }
        for _ in 0..LATCH_TRIES {
            if self.table.try_lock_exclusive(pid) {
                let f = self.table.frame(pid);
                let guard = self.guard_of(pid, f);
                match self.repair_from_frame(guard, healthy, watch).await? {
                    Some(done) => return Ok(done),
                    // The frame holds an older version than a valid copy
                    // (read from a copy that lost writes): evicted while
                    // clean, so that the next read and the repair below
                    // take the newest; the records cached from it go too.
                    None => {
                        if self.try_evict(f, pid) {
                            self.return_frames(&[f]);
                            self.records().clear();
                        }
                        sched::yield_now().await;
                        continue;
                    }
                }
            }
            match lock_of(self.table.state(pid).load(Ordering::Acquire)) {
                EVICTED => {
                    if let Some(claim) = self.claim_evicted(pid) {
                        // The claim is let go once the repair returns (or is
                        // dropped).
                        let repair = self.repair_copies(pid, healthy, watch, None).await;
                        drop(claim);
                        return repair.map(|r| r.unwrap_or(PageRepair::Nothing));
                    }
                }
                LOADING => self.read_settled(pid).await,
                _ => sched::yield_now().await,
            }
        }
        Ok(PageRepair::Nothing)
    }

    /// Counts pages `Db::rebuild` left with a damaged copy
    /// ([`PageRepair::Moved`] in its last round).
    pub(crate) fn page_repairs_left(&self, n: u64) {
        self.stats
            .page_copy_repairs_left
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The repair of a page in the pool, latched by `guard`. Its frame may
    /// be a stale reader's fault of a page freed and taken by a large
    /// value since the walk (a review's finding: the value's bytes on
    /// every copy, then overwritten by the old tree page): hence the
    /// handover question here too, and a write only when a valid copy
    /// holds what the frame does.
    async fn repair_from_frame(
        &self,
        guard: PageMut<'_>,
        healthy: &[u8],
        watch: usize,
    ) -> Result<Option<PageRepair>> {
        let pid = guard.pid();
        let meta = &self.frames[guard.frame as usize];
        if meta.dirty.load(Ordering::Acquire) || meta.writing.load(Ordering::Acquire) {
            return Ok(Some(PageRepair::Nothing));
        }
        let bytes: &[u8] = &guard;
        if page::verify(bytes, pid).is_err() {
            return Ok(Some(PageRepair::Nothing));
        }
        let repair = self.repair_copies(pid, healthy, watch, Some(bytes)).await;
        drop(guard);
        repair
    }

    /// Both paths' repair, the page latched or claimed: reads the copies
    /// `healthy` and writes over those that are not a valid page, or hold
    /// an older version, `frame` (a resident page's version) if a valid
    /// copy holds it, or, for a
    /// page not in the pool, the newest version valid copies hold; asks
    /// whether the page was handed over just before it writes.
    async fn repair_copies(
        &self,
        pid: u64,
        healthy: &[u8],
        watch: usize,
        frame: Option<&[u8]>,
    ) -> Result<Option<PageRepair>> {
        let copies = self.read_copies(pid, healthy).await?;
        // Versions of this database: valid pages below the log's next GSN.
        // A valid page of a higher LSN is none of ours (a device reused
        // from an earlier database, or a large value's bytes made to look
        // like a page, as recovery's rule for new pages says) and counts
        // as damage: taken as the newest, it would have been written over
        // the good copy (a review's finding). Without a log, versions
        // cannot be ordered: only copies that agree are used.
        let end = self.wal.get().map(|w| w.next_lsn());
        let ours =
            |b: &[u8]| page::verify(b, pid).is_ok() && end.is_none_or(|e| page::page_lsn(b) < e);
        let valid: Vec<&[u8]> = copies
            .iter()
            .map(|(_, b)| &b[..])
            .filter(|b| ours(b))
            .collect();
        let source: &[u8] = match frame {
            Some(f)
                if end.is_some() && valid.iter().any(|b| page::page_lsn(b) > page::page_lsn(f)) =>
            {
                return Ok(None)
            }
            Some(f) if valid.contains(&f) => f,
            Some(_) => return Ok(Some(PageRepair::Nothing)),
            None => {
                let pick = match end {
                    Some(_) => newest_version(&valid),
                    None => valid
                        .first()
                        .copied()
                        .filter(|first| valid.iter().all(|b| b == first)),
                };
                match pick {
                    Some(b) => b,
                    None => return Ok(Some(PageRepair::Nothing)),
                }
            }
        };
        // Copies that are no valid page of ours, or an older version of it
        // (a write one copy lost: `dana check` found the copies different,
        // and `rebuild`, which left them, said all was healthy; a docs
        // review's finding).
        let lsn = page::page_lsn(source);
        let damaged: Vec<&(u8, Vec<u8>)> = copies
            .iter()
            .filter(|(_, b)| !ours(b) || page::page_lsn(b) < lsn)
            .collect();
        if damaged.is_empty() {
            return Ok(Some(PageRepair::Nothing));
        }
        // Asked after the copies are read (a page with nothing to repair
        // is never counted as left), before anything is written.
        if self.handed_over(watch, pid) {
            return Ok(Some(PageRepair::Moved));
        }
        let older = damaged.iter().any(|(_, b)| ours(b));
        let damaged: Vec<u8> = damaged.iter().map(|&(c, _)| *c).collect();
        self.write_copies(pid, source, &damaged).await?;
        if older {
            // A record read from the older version meanwhile (a read of
            // that copy) is not the tree's any more.
            self.records().clear();
        }
        Ok(Some(PageRepair::Repaired))
    }

    /// Page `pid`'s bytes on each of `copies`, read from that copy alone.
    async fn read_copies(&self, pid: u64, copies: &[u8]) -> Result<Vec<(u8, Vec<u8>)>> {
        let (device, offset) = self.array.locate(pid);
        let mut out = Vec::with_capacity(copies.len());
        for &c in copies {
            let mut buf = ReusableBuf::new(self.page_size, self.page_size)?;
            let mut req = Request::read(0, offset, buf.lend(0, self.page_size)?);
            req.copy = Some(c);
            sched::perform(device, req).await?;
            let bytes = buf.get_mut().ok_or_else(|| {
                Error::Poisoned(format!(
                    "the read of page {pid}'s copy {c} still holds its buffer once done"
                ))
            })?;
            out.push((c, bytes.to_vec()));
        }
        Ok(out)
    }

    /// Writes `bytes` as page `pid` to each of `copies`, alone (one page
    /// repaired, if any).
    async fn write_copies(&self, pid: u64, bytes: &[u8], copies: &[u8]) -> Result<()> {
        let (device, offset) = self.array.locate(pid);
        for &c in copies {
            let mut buf = AlignedBuf::new(self.page_size, self.page_size)?;
            buf.copy_from_slice(bytes);
            let mut req = Request::write(0, offset, IoBuf::owned(buf)).placed(Placement::Unsorted);
            req.copy = Some(c);
            sched::perform(device, req).await?;
        }
        if !copies.is_empty() {
            self.stats.page_copy_repairs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Claims evicted page `pid` as being read, without a frame: every
    /// fault, allocation and frame drop of it waits until the claim is
    /// dropped. None if it is not evicted now.
    fn claim_evicted(&self, pid: u64) -> Option<Claim<'_>> {
        if !self.table.try_transition(pid, EVICTED, LOADING) {
            return None;
        }
        Some(Claim {
            pool: self,
            pid,
            wait: self.inflight.insert(pid),
        })
    }
}

/// The version of a page its valid copies `valid` name as newest: the
/// one with the highest page LSN, if no other version has that LSN (a
/// page's LSN grows with every logged change, so a copy that missed a
/// write holds a lower one). None if no copy is valid, or if two
/// different versions share the highest LSN: damage no LSN tells apart.
pub(crate) fn newest_version<'a>(valid: &[&'a [u8]]) -> Option<&'a [u8]> {
    let newest = valid.iter().map(|b| page::page_lsn(b)).max()?;
    let mut at_newest = valid.iter().filter(|b| page::page_lsn(b) == newest);
    let first = *at_newest.next()?;
    at_newest.all(|b| *b == first).then_some(first)
}

/// What [`BufferPool::repair_page_copies`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageRepair {
    /// Wrote a valid version over the damaged copies.
    Repaired,
    /// Nothing to do, or nothing it may do: no damaged copy now, no valid
    /// one, valid copies that differ at the same page LSN, a dirty page,
    /// or one that stays latched.
    Nothing,
    /// Left alone: freed pages changed hands since the walk, so the page
    /// may hold something else now (a later walk may repair it).
    Moved,
}

/// An evicted page held as being read, without a frame (EVICTED ->
/// LOADING, with an in-flight entry its waiters wait on); let go, evicted
/// as it was, when dropped (a repair cut short included: a page left
/// LOADING would hang its readers).
struct Claim<'a> {
    pool: &'a BufferPool,
    pid: u64,
    wait: Arc<IoWait>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        // As a read's completion: the entry goes before the state.
        self.pool.inflight.remove(self.pid);
        self.pool.table.set_lock(self.pid, EVICTED);
        self.wait.complete(Ok(()), std::time::Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::PageType;
    use crate::io::mirror::{CopySpec, Mirror, Role};
    use crate::io::sim::{SimConfig, SimDisk};
    use crate::io::{Array, Target};
    use crate::sched::Runtime;

    const PAGE: usize = 4096;

    /// The newest version is the one of the highest page LSN, if no other
    /// version has that LSN.
    #[test]
    fn the_newest_version_is_the_highest_lsn_if_alone_there() {
        let version = |lsn: u64, fill: u8| {
            let mut p = vec![0; PAGE];
            page::init_page(&mut p, 7, PageType::Leaf);
            p[PAGE - 1] = fill;
            page::set_page_lsn(&mut p, lsn);
            page::seal(&mut p);
            p
        };
        let (old, new, other) = (version(5, 1), version(9, 2), version(9, 3));
        assert!(newest_version(&[&old, &new]) == Some(&new[..]));
        assert!(newest_version(&[&new, &old, &new]) == Some(&new[..]));
        assert!(newest_version(&[&old, &new, &other]).is_none());
        assert!(newest_version(&[]).is_none());
    }

    /// A pool of 16 frames over a mirrored pair of simulated devices, on
    /// one worker.
    fn mirrored_pool() -> (Arc<BufferPool>, Runtime, Arc<Mirror>) {
        let disks: Vec<_> = (0..2)
            .map(|i| SimDisk::new(i, 1 << 20, SimConfig::default()))
            .collect();
        let copies = disks
            .iter()
            .map(|d| CopySpec::of(Target::Sim(d.clone())))
            .collect();
        let mirror = Mirror::create(Role::Data(0), 0, copies).unwrap();
        mirror.set_page_check(Arc::new(page::MirrorPageCheck {
            width: 1,
            device: 0,
            page_size: PAGE,
        }));
        let array = Array::new(vec![Target::Mirror(mirror.clone())], PAGE as u64).unwrap();
        let (pool, rt) = crate::buffer::test_pool(array, 16);
        (pool, rt, mirror)
    }

    /// A valid tree page `pid` whose last byte is `last`.
    fn tree_page(pid: u64, last: u8) -> Vec<u8> {
        let mut good = vec![0u8; PAGE];
        page::init_page(&mut good, pid, PageType::Leaf);
        good[PAGE - 1] = last;
        page::seal(&mut good);
        good
    }

    /// A fault of a page in a run a large value took and is writing (a
    /// stale reader's) is read without the mirror's check: the copy the
    /// value reached keeps the value's bytes, where a checked read would
    /// have written the old tree page of the other copy over them (a
    /// review's finding). Once the write is done, faults are checked and
    /// repaired again.
    #[test]
    fn a_fault_of_a_page_a_large_value_is_taking_repairs_no_copy() {
        let (pool, rt, mirror) = mirrored_pool();
        let pid = 8u64; // even: a lone read goes to copy 0 first
        let at = pid * PAGE as u64;
        let old = tree_page(pid, 0x55);
        mirror.write_copy(0, at, &[0xAB; PAGE]).unwrap(); // the value's
        mirror.write_copy(1, at, &old).unwrap(); // not reached yet
        let run = [super::super::blob::Extent {
            start: pid,
            pages: 1,
        }];
        pool.being_taken(&run, true);
        let fault = |pool: &Arc<BufferPool>| {
            let p = pool.clone();
            rt.block_on(async move { p.fix_shared(pid).await.map(|g| g[PAGE - 1]) })
                .unwrap()
        };
        let _ = fault(&pool); // the old page, or Corrupt: either way ...
        let value_bytes_kept = mirror
            .read_copy(0, at, PAGE)
            .unwrap()
            .iter()
            .filter(|&&b| b == 0xAB)
            .count();
        assert_eq!(value_bytes_kept, PAGE);
        pool.being_taken(&run, false);
        let p = pool.clone();
        rt.block_on(async move { p.discard(pid).await })
            .unwrap()
            .unwrap();
        assert_eq!(fault(&pool).unwrap(), 0x55);
        assert!(mirror.read_copy(0, at, PAGE).unwrap()[..] == old[..]);
        rt.shutdown();
    }

    /// The repair writes a page's valid version over its damaged copy, in
    /// the pool or not, unless the page changed hands since its watcher
    /// began (it may be a large value's by then; other pages' handovers
    /// do not matter); never when no copy is valid, nor a frame that no
    /// valid copy holds.
    #[test]
    fn a_page_is_repaired_only_if_it_did_not_change_hands() {
        let (pool, rt, mirror) = mirrored_pool();
        let pid = 5u64;
        let good = tree_page(pid, 0x77);
        let at = pid * PAGE as u64;
        let damage = |m: &Arc<Mirror>| {
            let mut bad = good.clone();
            bad[100] ^= 0xFF;
            m.write_copy(0, at, &bad).unwrap();
        };
        let copy_valid =
            |m: &Mirror, c| page::verify(&m.read_copy(c, at, PAGE).unwrap(), pid).is_ok();
        mirror.write_copy(1, at, &good).unwrap();
        damage(&mirror);
        let watch = pool.watch_handovers();
        let repair = |pid: u64| {
            let pool = pool.clone();
            rt.block_on(async move { pool.repair_page_copies(pid, &[0, 1], watch).await })
                .unwrap()
                .unwrap()
        };
        use PageRepair::{Moved, Nothing, Repaired};
        pool.note_handover([pid]);
        assert_eq!(repair(pid), Moved, "the page changed hands since");
        assert!(!copy_valid(&mirror, 0));
        pool.rewatch_handovers(watch);
        pool.note_handover([pid + 1, pid + 2]);
        assert_eq!(repair(pid), Repaired, "other pages changed hands");
        assert!(copy_valid(&mirror, 0) && copy_valid(&mirror, 1));
        assert_eq!(mirror.read_copy(0, at, PAGE).unwrap()[..], good[..]);
        // Released: the page reads through the pool as any other.
        let p = pool.clone();
        let last = rt
            .block_on(async move { p.fix_shared(pid).await.map(|g| g[PAGE - 1]) })
            .unwrap()
            .unwrap();
        assert_eq!(last, 0x77);
        // In the pool now, clean: the same rules, from the frame.
        let resident =
            |pool: &BufferPool| lock_of(pool.table.state(pid).load(Ordering::Acquire)) != EVICTED;
        assert!(resident(&pool));
        damage(&mirror);
        pool.note_handover([pid]);
        assert_eq!(repair(pid), Moved);
        assert!(!copy_valid(&mirror, 0));
        pool.rewatch_handovers(watch);
        assert_eq!(repair(pid), Repaired);
        assert_eq!(mirror.read_copy(0, at, PAGE).unwrap()[..], good[..]);
        // A frame that no valid copy holds (as a stale fault of a page a
        // large value took since, both copies the value's): nothing is
        // written over the copies.
        mirror.write_copy(0, at, &[3; PAGE]).unwrap();
        mirror.write_copy(1, at, &[4; PAGE]).unwrap();
        assert_eq!(repair(pid), Nothing);
        assert!(resident(&pool));
        assert_eq!(mirror.read_copy(0, at, PAGE).unwrap()[..], [3; PAGE]);
        assert_eq!(mirror.read_copy(1, at, PAGE).unwrap()[..], [4; PAGE]);
        // No valid copy: nothing written.
        let other = 7u64;
        let at = other * PAGE as u64;
        mirror.write_copy(0, at, &[1; PAGE]).unwrap();
        mirror.write_copy(1, at, &[2; PAGE]).unwrap();
        assert_eq!(repair(other), Nothing);
        assert_eq!(mirror.read_copy(0, at, PAGE).unwrap()[..], [1; PAGE]);
        assert_eq!(mirror.read_copy(1, at, PAGE).unwrap()[..], [2; PAGE]);
        // A slot that does not watch knows nothing: every page counts as
        // handed over.
        pool.unwatch_handovers(watch);
        assert!(pool.handed_over(watch, pid));
        // A watcher that noted more pages than it keeps counts every page
        // as handed over.
        let watch = pool.watch_handovers();
        pool.note_handover(100..100 + super::super::alloc::MAX_HANDOVERS as u64);
        assert!(!pool.handed_over(watch, pid));
        pool.note_handover([1]);
        assert!(pool.handed_over(watch, pid));
        rt.shutdown();
    }
}
