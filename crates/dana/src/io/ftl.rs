//! A flash translation layer model: what a page-mapped SSD does with the
//! writes it is given, so that dana can count the flash writes its own
//! writes cost (write amplification, WAF) and try placements against it.
//!
//! Owns: the logical-to-physical page map over erase blocks, two open
//! blocks per placement handle (FDP reclaim-unit handles; handle 0 is the
//! default stream): one for the host's writes, one for the collector's
//! copies of that handle's pages, the collector (greedy or cost-benefit),
//! TRIM, and the counters ([`FtlStats`]).
//!
//! Never: stores data (the device it models stores it; this only maps);
//! allocates after [`Ftl::new`]; lets a block be erased while it holds a
//! valid page, or a physical page hold two logical pages.
//!
//! # Model
//! - A logical page is the device's mapping unit (4 KiB for dana). The
//!   flash has `blocks × pages_per_block` physical pages; the host sees
//!   `logical_pages = physical / (1 + over_provisioning)` of them (the
//!   spare is what over-provisioning means: spare / user).
//! - A write of a logical page programs the next free page of its
//!   handle's open block and invalidates the page's old location. A full
//!   open block is closed; a new one is taken from the free list.
//! - When at most [`Ftl::free_reserve`] blocks are free, the collector
//!   picks a closed victim (greedy: the fewest valid pages; cost-benefit:
//!   the highest `(1 - u) / 2u × age`, Rosenblum and Ousterhout's LFS
//!   policy, age = writes since the block was closed), copies its valid
//!   pages to the collector's open block of the handle the victim was
//!   written through (so collection does not mix what placement
//!   separated; counted as flash writes, not host writes) and erases it.
//! - TRIM unmaps a logical page: its old location is invalid and costs no
//!   copy at collection.
//!
//! # Costs
//! Memory: 4 bytes per logical page, 4 per physical page, 25 per block.
//! Time: a write is O(1) plus, amortised, its share of collection: greedy
//! keeps closed blocks in per-valid-count lists (O(1) to update, O(pages
//! per block) to find the victim); cost-benefit scans every block per
//! victim (O(blocks)).
//!
//! # Validation
//! Under uniform random single-page writes, greedy collection with many
//! pages per block approaches the analytic write amplification
//! `WA = a / (a + W0(-a e^-a))`, `a = 1 + spare / user` (Desnoyers,
//! SYSTOR 2012; Hu et al., SYSTOR 2009): ~7.8 at 7% over-provisioning,
//! ~2.5 at 28%. The test `greedy_matches_the_analytic_write_amplification`
//! holds the model to it within 5%.

use crate::{Error, Result};

/// Marks an unmapped logical page, or a physical page holding no live
/// logical page.
const NONE: u32 = u32::MAX;

/// How the collector picks its victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcPolicy {
    /// The closed block with the fewest valid pages.
    Greedy,
    /// The closed block with the highest `(1 - u) / 2u × age` (LFS).
    CostBenefit,
}

/// The shape of the modelled device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FtlConfig {
    /// Pages per erase block (or per FDP reclaim unit).
    pub pages_per_block: u32,
    /// Erase blocks.
    pub blocks: u32,
    /// Spare capacity over user capacity (0.07 = 7%).
    pub over_provisioning: f64,
    /// How the collector picks its victims.
    pub gc: GcPolicy,
    /// Placement handles (write streams); at least 1.
    pub handles: u32,
}

impl FtlConfig {
    /// A device of `blocks` blocks of `pages_per_block`, with
    /// `over_provisioning`, greedy collection and one handle.
    pub fn new(pages_per_block: u32, blocks: u32, over_provisioning: f64) -> FtlConfig {
        FtlConfig {
            pages_per_block,
            blocks,
            over_provisioning,
            gc: GcPolicy::Greedy,
            handles: 1,
        }
    }
}

/// What the device did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FtlStats {
    /// Logical pages the host wrote.
    pub host_pages: u64,
    /// Bytes the host wrote ([`Ftl::host_wrote`]): a write shorter than a
    /// page counts its own bytes, though it programs a whole page.
    pub host_bytes: u64,
    /// Pages programmed: host pages plus collection copies.
    pub flash_pages: u64,
    /// Valid pages the collector copied.
    pub gc_copies: u64,
    /// Blocks erased by the collector.
    pub erases: u64,
    /// Logical pages unmapped by TRIM (that were mapped).
    pub trims: u64,
}

impl FtlStats {
    /// Flash pages programmed per host page written (1.0 before any
    /// write).
    pub fn waf(&self) -> f64 {
        if self.host_pages == 0 {
            1.0
        } else {
            self.flash_pages as f64 / self.host_pages as f64
        }
    }

    /// Flash bytes programmed per byte the host wrote, for flash pages of
    /// `page_bytes` (1.0 before any write): the write amplification as
    /// NAND bytes over host bytes, where writes shorter than a page (a
    /// log's 512-byte flushes) cost a whole page each. [`FtlStats::waf`]
    /// counts pages instead, the same for whole-page writes.
    pub fn waf_bytes(&self, page_bytes: u64) -> f64 {
        if self.host_bytes == 0 {
            1.0
        } else {
            (self.flash_pages * page_bytes) as f64 / self.host_bytes as f64
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &FtlStats) -> FtlStats {
        FtlStats {
            host_pages: self.host_pages - earlier.host_pages,
            host_bytes: self.host_bytes - earlier.host_bytes,
            flash_pages: self.flash_pages - earlier.flash_pages,
            gc_copies: self.gc_copies - earlier.gc_copies,
            erases: self.erases - earlier.erases,
            trims: self.trims - earlier.trims,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    Free,
    Open,
    Closed,
}

/// An open block being filled.
#[derive(Debug, Clone, Copy)]
struct Frontier {
    block: u32,
    next: u32,
}

/// The model. See the module documentation.
pub struct Ftl {
    cfg: FtlConfig,
    logical_pages: u32,
    /// Logical page -> physical page, or NONE.
    map: Vec<u32>,
    /// Physical page -> logical page it holds live, or NONE.
    owner: Vec<u32>,
    /// Per block: valid pages.
    valid: Vec<u32>,
    state: Vec<BlockState>,
    /// Per block: the write clock when it was closed (cost-benefit age).
    closed_at: Vec<u64>,
    /// Per block: the handle whose data it holds.
    stream: Vec<u8>,
    /// Closed blocks in doubly linked lists by valid count.
    next: Vec<u32>,
    prev: Vec<u32>,
    head: Vec<u32>,
    free: Vec<u32>,
    /// One per handle for the host's writes, then one per handle for the
    /// collector's copies.
    open: Vec<Option<Frontier>>,
    clock: u64,
    stats: FtlStats,
}

impl Ftl {
    /// An empty device: every block free, every logical page unmapped.
    pub fn new(cfg: FtlConfig) -> Result<Ftl> {
        if cfg.pages_per_block == 0 || cfg.handles == 0 || cfg.handles > 64 {
            return Err(Error::InvalidArgument(format!(
                "ftl: {} pages per block and {} handles (need >= 1 page and 1-64 handles)",
                cfg.pages_per_block, cfg.handles
            )));
        }
        let physical = u64::from(cfg.blocks) * u64::from(cfg.pages_per_block);
        if physical >= u64::from(NONE) {
            return Err(Error::InvalidArgument(format!(
                "ftl: {physical} physical pages (at most {})",
                NONE - 1
            )));
        }
        if !(cfg.over_provisioning.is_finite() && cfg.over_provisioning > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "ftl: over-provisioning {} (must be > 0)",
                cfg.over_provisioning
            )));
        }
        let logical = (physical as f64 / (1.0 + cfg.over_provisioning)) as u64;
        // The open blocks and the reserve must fit in the spare.
        let spare_blocks = (physical - logical) / u64::from(cfg.pages_per_block);
        let needed = 2 * u64::from(cfg.handles) + u64::from(Self::free_reserve());
        if spare_blocks < needed {
            return Err(Error::InvalidArgument(format!(
                "ftl: {spare_blocks} spare blocks; {} handles need at least {needed}",
                cfg.handles
            )));
        }
        let blocks = cfg.blocks as usize;
        Ok(Ftl {
            cfg,
            logical_pages: logical as u32,
            map: vec![NONE; logical as usize],
            owner: vec![NONE; physical as usize],
            valid: vec![0; blocks],
            state: vec![BlockState::Free; blocks],
            closed_at: vec![0; blocks],
            stream: vec![0; blocks],
            next: vec![NONE; blocks],
            prev: vec![NONE; blocks],
            head: vec![NONE; cfg.pages_per_block as usize + 1],
            // Popped from the end: block 0 first.
            free: (0..cfg.blocks).rev().collect(),
            open: vec![None; 2 * cfg.handles as usize],
            clock: 0,
            stats: FtlStats::default(),
        })
    }

    /// Free blocks at or below which the collector runs.
    pub const fn free_reserve() -> u32 {
        2
    }

    /// The shape it was made with.
    pub fn config(&self) -> FtlConfig {
        self.cfg
    }

    /// Logical pages the host may write.
    pub fn logical_pages(&self) -> u32 {
        self.logical_pages
    }

    /// Counters since it was made.
    pub fn stats(&self) -> FtlStats {
        self.stats
    }

    /// Counts `bytes` written by the host (once per write request, which
    /// [`Ftl::write`] sees page by page).
    pub fn host_wrote(&mut self, bytes: u64) {
        self.stats.host_bytes += bytes;
    }

    /// Writes logical page `lpn` through placement handle `handle`.
    pub fn write(&mut self, handle: u32, lpn: u32) -> Result<()> {
        if lpn >= self.logical_pages || handle >= self.cfg.handles {
            return Err(Error::InvalidArgument(format!(
                "ftl: write of page {lpn} on handle {handle} ({} pages, {} handles)",
                self.logical_pages, self.cfg.handles
            )));
        }
        self.stats.host_pages += 1;
        self.clock += 1;
        self.unmap(lpn);
        self.program(handle as usize, lpn);
        self.collect();
        Ok(())
    }

    /// Unmaps logical page `lpn` (TRIM / deallocate).
    pub fn trim(&mut self, lpn: u32) -> Result<()> {
        if lpn >= self.logical_pages {
            return Err(Error::InvalidArgument(format!(
                "ftl: trim of page {lpn} ({} pages)",
                self.logical_pages
            )));
        }
        if self.map[lpn as usize] != NONE {
            self.stats.trims += 1;
            self.unmap(lpn);
        }
        Ok(())
    }

    /// Logical pages mapped now.
    pub fn mapped_pages(&self) -> u64 {
        self.valid.iter().map(|&v| u64::from(v)).sum()
    }

    /// Invalidates `lpn`'s current location, if any.
    fn unmap(&mut self, lpn: u32) {
        let old = self.map[lpn as usize];
        if old == NONE {
            return;
        }
        self.map[lpn as usize] = NONE;
        self.owner[old as usize] = NONE;
        let b = old / self.cfg.pages_per_block;
        let closed = self.state[b as usize] == BlockState::Closed;
        if closed {
            self.unlink(b);
        }
        self.valid[b as usize] -= 1;
        if closed {
            self.link(b);
        }
    }

    /// Programs `lpn` at the next page of frontier `f` (a handle's, or a
    /// handle's collector frontier: `handles + handle`).
    fn program(&mut self, f: usize, lpn: u32) {
        let ppb = self.cfg.pages_per_block;
        let mut fr = match self.open[f] {
            Some(fr) => fr,
            None => {
                // The reserve guarantees a free block (checked in new and
                // kept by collect).
                let block = self.free.pop().expect("ftl: no free block for a frontier");
                self.state[block as usize] = BlockState::Open;
                self.stream[block as usize] = (f % self.cfg.handles as usize) as u8;
                Frontier { block, next: 0 }
            }
        };
        let ppn = fr.block * ppb + fr.next;
        debug_assert_eq!(self.owner[ppn as usize], NONE);
        self.owner[ppn as usize] = lpn;
        self.map[lpn as usize] = ppn;
        self.valid[fr.block as usize] += 1;
        self.stats.flash_pages += 1;
        fr.next += 1;
        if fr.next == ppb {
            self.state[fr.block as usize] = BlockState::Closed;
            self.closed_at[fr.block as usize] = self.clock;
            self.link(fr.block);
            self.open[f] = None;
        } else {
            self.open[f] = Some(fr);
        }
    }

    /// Collects victims until the free list is above the reserve.
    fn collect(&mut self) {
        // Bounded: each round frees one block; a round that cannot (every
        // closed block full of valid pages) means the device is full of
        // live data, which the logical size rules out.
        for _ in 0..self.cfg.blocks {
            if self.free.len() > Self::free_reserve() as usize {
                return;
            }
            let Some(victim) = self.victim() else { return };
            self.unlink(victim);
            let ppb = self.cfg.pages_per_block;
            let gc = (self.cfg.handles + u32::from(self.stream[victim as usize])) as usize;
            // The victim's valid pages move to the collector's block; its
            // state is Free-to-be, so moves do not relink it.
            self.state[victim as usize] = BlockState::Free;
            for p in victim * ppb..(victim + 1) * ppb {
                let lpn = self.owner[p as usize];
                if lpn == NONE {
                    continue;
                }
                self.owner[p as usize] = NONE;
                self.valid[victim as usize] -= 1;
                self.map[lpn as usize] = NONE;
                self.program(gc, lpn);
                self.stats.gc_copies += 1;
            }
            assert_eq!(self.valid[victim as usize], 0, "ftl: erasing a live block");
            self.stats.erases += 1;
            self.free.push(victim);
        }
    }

    /// The closed block to collect next, if any.
    fn victim(&self) -> Option<u32> {
        match self.cfg.gc {
            GcPolicy::Greedy => self.head.iter().copied().find(|&b| b != NONE),
            GcPolicy::CostBenefit => {
                let ppb = f64::from(self.cfg.pages_per_block);
                (0..self.cfg.blocks)
                    .filter(|&b| self.state[b as usize] == BlockState::Closed)
                    .map(|b| {
                        let u = f64::from(self.valid[b as usize]) / ppb;
                        let age = (self.clock - self.closed_at[b as usize]) as f64 + 1.0;
                        let score = if u == 0.0 {
                            f64::INFINITY
                        } else {
                            (1.0 - u) / (2.0 * u) * age
                        };
                        (b, score)
                    })
                    .max_by(|x, y| x.1.total_cmp(&y.1))
                    .map(|(b, _)| b)
            }
        }
    }

    /// Puts closed block `b` at the head of its valid count's list.
    fn link(&mut self, b: u32) {
        let v = self.valid[b as usize] as usize;
        let h = self.head[v];
        self.next[b as usize] = h;
        self.prev[b as usize] = NONE;
        if h != NONE {
            self.prev[h as usize] = b;
        }
        self.head[v] = b;
    }

    /// Takes closed block `b` out of its valid count's list.
    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.head[self.valid[b as usize] as usize] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        }
        self.next[b as usize] = NONE;
        self.prev[b as usize] = NONE;
    }

    /// Checks the model's invariants (tests; O(pages)).
    pub fn check(&self) -> Result<()> {
        let ppb = self.cfg.pages_per_block;
        let mut valid = vec![0u32; self.cfg.blocks as usize];
        for (lpn, &ppn) in self.map.iter().enumerate() {
            if ppn == NONE {
                continue;
            }
            if self.owner[ppn as usize] != lpn as u32 {
                return Err(Error::InvalidArgument(format!(
                    "ftl: page {lpn} maps to {ppn}, which holds {}",
                    self.owner[ppn as usize]
                )));
            }
            valid[(ppn / ppb) as usize] += 1;
        }
        let owned = self.owner.iter().filter(|&&o| o != NONE).count();
        let mapped = self.map.iter().filter(|&&p| p != NONE).count();
        if valid != self.valid || owned != mapped {
            return Err(Error::InvalidArgument(
                "ftl: valid counts disagree with the map".into(),
            ));
        }
        let free = self
            .state
            .iter()
            .filter(|&&s| s == BlockState::Free)
            .count();
        if free != self.free.len() || self.free.iter().any(|&b| self.valid[b as usize] != 0) {
            return Err(Error::InvalidArgument(
                "ftl: the free list disagrees with the blocks".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// The principal branch of Lambert's W on [-1/e, 0), by Halley's
    /// iteration from the branch-point series.
    fn lambert_w0(x: f64) -> f64 {
        let e = std::f64::consts::E;
        let mut w = -1.0 + (2.0 * (1.0 + e * x)).max(0.0).sqrt();
        for _ in 0..100 {
            let ew = w.exp();
            let f = w * ew - x;
            let step = f / (ew * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0));
            if !step.is_finite() {
                break;
            }
            w -= step;
            if step.abs() < 1e-14 {
                break;
            }
        }
        w
    }

    fn analytic_wa(op: f64) -> f64 {
        let a = 1.0 + op;
        a / (a + lambert_w0(-a * (-a).exp()))
    }

    /// Fills the device sequentially, writes `warm` times its logical
    /// size at uniform random, then measures over one more logical size.
    fn measured_wa(cfg: FtlConfig, warm: u64, seed: u64) -> f64 {
        let mut ftl = Ftl::new(cfg).unwrap();
        let n = ftl.logical_pages();
        for lpn in 0..n {
            ftl.write(0, lpn).unwrap();
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..warm * u64::from(n) {
            ftl.write(0, rng.gen_range(0..n)).unwrap();
        }
        let before = ftl.stats();
        for _ in 0..n {
            ftl.write(0, rng.gen_range(0..n)).unwrap();
        }
        ftl.check().unwrap();
        ftl.stats().since(&before).waf()
    }

    #[test]
    fn the_analytic_formula_gives_the_published_figures() {
        assert!(
            (analytic_wa(0.07) - 7.8).abs() < 0.1,
            "{}",
            analytic_wa(0.07)
        );
        assert!(
            (analytic_wa(0.28) - 2.5).abs() < 0.1,
            "{}",
            analytic_wa(0.28)
        );
    }

    /// 256 pages per block, 1,024 blocks, after writing 5x the device:
    /// greedy within 5% of the analytic result at 7% and 28%.
    #[test]
    fn greedy_matches_the_analytic_write_amplification() {
        for op in [0.07, 0.28] {
            let wa = measured_wa(FtlConfig::new(256, 1024, op), 5, 7);
            let want = analytic_wa(op);
            let err = (wa - want).abs() / want;
            eprintln!("op {op}: measured {wa:.3}, analytic {want:.3}");
            assert!(err < 0.05, "op {op}: measured {wa:.3}, analytic {want:.3}");
        }
    }

    #[test]
    fn sequential_overwrites_cost_nothing_extra() {
        let mut ftl = Ftl::new(FtlConfig::new(64, 128, 0.10)).unwrap();
        let n = ftl.logical_pages();
        for _ in 0..5 {
            for lpn in 0..n {
                ftl.write(0, lpn).unwrap();
            }
        }
        let s = ftl.stats();
        assert_eq!(s.gc_copies, 0, "{s:?}");
        assert_eq!(s.waf(), 1.0);
        ftl.check().unwrap();
    }

    /// Trimmed pages are not copied: trimming half the data at random
    /// and writing the other half lowers the write amplification.
    #[test]
    fn trim_spares_copies() {
        let cfg = FtlConfig::new(64, 256, 0.07);
        let run = |trim: bool| {
            let mut ftl = Ftl::new(cfg).unwrap();
            let n = ftl.logical_pages();
            for lpn in 0..n {
                ftl.write(0, lpn).unwrap();
            }
            if trim {
                for lpn in (0..n).filter(|l| l % 2 == 1) {
                    ftl.trim(lpn).unwrap();
                }
            }
            let mut rng = SmallRng::seed_from_u64(3);
            let before = ftl.stats();
            for _ in 0..4 * u64::from(n) {
                ftl.write(0, rng.gen_range(0..n / 2) * 2).unwrap();
            }
            ftl.check().unwrap();
            ftl.stats().since(&before).waf()
        };
        let (with, without) = (run(true), run(false));
        assert!(with < without * 0.7, "trim {with:.2} vs none {without:.2}");
    }

    /// Hot and cold pages through separate handles: the cold blocks stay
    /// full of valid pages and are seldom collected, so the write
    /// amplification drops below that of one mixed stream (with this
    /// seed: 3.76 vs 4.55; greedy does not give the hot stream its best
    /// share of the spare, so the gain is modest).
    #[test]
    fn placement_by_temperature_lowers_write_amplification() {
        let run = |handles: u32, gc: GcPolicy| {
            let cfg = FtlConfig {
                handles,
                gc,
                ..FtlConfig::new(64, 512, 0.15)
            };
            let mut ftl = Ftl::new(cfg).unwrap();
            let n = ftl.logical_pages();
            let hot = n / 10; // 10% of pages take 90% of writes
            let handle = |lpn: u32| if handles > 1 && lpn < hot { 1 } else { 0 };
            for lpn in 0..n {
                ftl.write(handle(lpn), lpn).unwrap();
            }
            let mut rng = SmallRng::seed_from_u64(11);
            let draw = |rng: &mut SmallRng| {
                if rng.gen_bool(0.9) {
                    rng.gen_range(0..hot)
                } else {
                    rng.gen_range(hot..n)
                }
            };
            for _ in 0..3 * u64::from(n) {
                let lpn = draw(&mut rng);
                ftl.write(handle(lpn), lpn).unwrap();
            }
            let before = ftl.stats();
            for _ in 0..2 * u64::from(n) {
                let lpn = draw(&mut rng);
                ftl.write(handle(lpn), lpn).unwrap();
            }
            ftl.check().unwrap();
            ftl.stats().since(&before).waf()
        };
        let mixed = run(1, GcPolicy::Greedy);
        let split = run(2, GcPolicy::Greedy);
        let cb = run(1, GcPolicy::CostBenefit);
        assert!(split < mixed * 0.9, "split {split:.2} vs mixed {mixed:.2}");
        assert!(cb.is_finite() && cb >= 1.0, "cost-benefit {cb:.2}");
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(Ftl::new(FtlConfig::new(0, 8, 0.5)).is_err());
        assert!(Ftl::new(FtlConfig::new(64, 100, 0.0)).is_err());
        assert!(
            Ftl::new(FtlConfig::new(64, 100, 0.01)).is_err(),
            "too few spare blocks"
        );
        let mut ftl = Ftl::new(FtlConfig::new(8, 64, 0.5)).unwrap();
        let n = ftl.logical_pages();
        assert!(ftl.write(0, n).is_err());
        assert!(ftl.write(1, 0).is_err());
        assert!(ftl.trim(n).is_err());
        assert_eq!(ftl.stats(), FtlStats::default());
    }
}
