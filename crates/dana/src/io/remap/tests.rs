use std::collections::HashMap;

use super::*;
use crate::io::sim::{DiscardFailure, PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};

const PAGE: usize = 4096;

fn config() -> RemapConfig {
    RemapConfig {
        page_size: PAGE as u32,
        segment_pages: 16,
        spare: 0.1,
        compress: false,
    }
}

/// A simulated device of `segments` segments of the test's config.
fn disk(segments: u64) -> Arc<SimDisk> {
    SimDisk::new(0, segments * 16 * PAGE as u64, SimConfig::deterministic(7))
}

/// The test's config, compressed.
fn compressed() -> RemapConfig {
    RemapConfig {
        compress: true,
        ..config()
    }
}

/// Both kinds of device: plain, and compressed.
fn configs() -> [RemapConfig; 2] {
    [config(), compressed()]
}

/// The bytes of version `v` of logical page `p`: no two alike, none zero.
/// A third of the pages are random; the others repeat their first
/// `64 << (p % 5)` random bytes (they compress 2 to 64 times).
fn content(p: u64, v: u64) -> AlignedBuf {
    let mut b = AlignedBuf::new(PAGE, PAGE).unwrap();
    let mut x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ v.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
    let random = if p % 3 == 0 { PAGE } else { 64 << (p % 5) };
    for chunk in b[..random].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    for at in (random..PAGE).step_by(random) {
        b.copy_within(0..random, at);
    }
    b[..8].copy_from_slice(&p.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    b
}

fn write(q: &mut dyn IoQueue, p: u64, v: u64) -> Result<()> {
    write_as(q, p, v, Placement::Hot)
}

/// [`write`] of class `class` (another class: another open segment).
fn write_as(q: &mut dyn IoQueue, p: u64, v: u64, class: Placement) -> Result<()> {
    let req = Request::write(1, p * PAGE as u64, IoBuf::owned(content(p, v))).placed(class);
    sync_io(q, req)?.result.map(|_| ())
}

/// A new device of `segments` segments cut by `config`, and a queue to it.
fn fresh(segments: u64, config: RemapConfig) -> (Arc<SimDisk>, Arc<Remap>, RemapQueue) {
    let d = disk(segments);
    let r = Remap::create(Target::Sim(d.clone()), config).unwrap();
    let q = r.queue(&Backend::Blocking, 4).unwrap();
    (d, r, q)
}

/// Writes `pages` consecutive pages from `p` in one request, version `v`.
fn write_run(q: &mut dyn IoQueue, p: u64, pages: u64, v: u64) -> Result<()> {
    let mut b = AlignedBuf::new(PAGE * pages as usize, PAGE).unwrap();
    for i in 0..pages {
        let at = i as usize * PAGE;
        b[at..at + PAGE].copy_from_slice(&content(p + i, v));
    }
    let req = Request::write(2, p * PAGE as u64, IoBuf::owned(b));
    sync_io(q, req)?.result.map(|_| ())
}

/// Reads `pages` pages from `p` in one request.
fn read(q: &mut dyn IoQueue, p: u64, pages: u64) -> Vec<u8> {
    let b = AlignedBuf::new(PAGE * pages as usize, PAGE).unwrap();
    let c = sync_io(q, Request::read(3, p * PAGE as u64, IoBuf::owned(b))).unwrap();
    c.result.unwrap();
    c.buf.unwrap().into_owned().unwrap().to_vec()
}

/// The version a page holds (None: zeros), checking its bytes are exactly
/// that version's.
fn version_of(p: u64, bytes: &[u8]) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return None;
    }
    let v = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    assert!(
        bytes == &content(p, v)[..],
        "page {p}: bytes of no version it was written with (header says {v})"
    );
    Some(v)
}

/// Cuts the power of `d` (every write not flushed dropped), lets the
/// device's handles go and powers it on again.
fn cut_power<Q>(d: &SimDisk, q: Q, r: Arc<Remap>, seed: u64) -> crate::io::sim::PowerCutReport {
    let report = d.power_cut(PowerCutPolicy::DropAll, seed);
    drop(q);
    drop(r);
    d.power_on();
    report
}

/// A page of bytes a torn write may leave.
fn garbage() -> Vec<u8> {
    (0..PAGE).map(|i| (i * 7 + 3) as u8).collect()
}

fn flush_q(q: &mut dyn IoQueue) {
    sync_io(q, Request::flush(4)).unwrap().result.unwrap();
}

#[test]
fn overwrites_move_pages_and_the_collection_frees_segments() {
    for config in configs() {
        for gc in [GcPolicy::Greedy, GcPolicy::CostBenefit] {
            overwrites_move_pages(config, gc);
        }
    }
}

fn overwrites_move_pages(config: RemapConfig, gc: GcPolicy) {
    let d = disk(40);
    let r = Remap::create(Target::Sim(d.clone()), config).unwrap();
    r.set_gc_policy(gc);
    let pages = r.size() / PAGE as u64;
    assert!(pages > 300, "{pages}");
    let mut q = r.queue(&Backend::Blocking, 32).unwrap();
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut x = 12345u64;
    // Five times the device: every page moves many times.
    for v in 1..=(5 * pages) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Skewed: half the writes go to a tenth of the pages.
        let p = if x % 2 == 0 {
            x / 2 % (pages / 10)
        } else {
            x / 2 % pages
        };
        if v % 97 == 0 && p + 3 < pages {
            write_run(&mut q, p, 3, v).unwrap();
            for i in 0..3 {
                model.insert(p + i, v);
            }
        } else {
            write(&mut q, p, v).unwrap();
            model.insert(p, v);
        }
        if v % 500 == 0 {
            flush_q(&mut q);
        }
    }
    for p in 0..pages {
        let got = version_of(p, &read(&mut q, p, 1));
        assert_eq!(got, model.get(&p).copied(), "page {p}");
    }
    let all = read(&mut q, 0, 8);
    for i in 0..8 {
        let got = version_of(i, &all[i as usize * PAGE..(i as usize + 1) * PAGE]);
        assert_eq!(got, model.get(&i).copied(), "page {i} of a run");
    }
    let s = r.stats();
    assert!(s.gc_copies > 0 && s.segments_freed > 40, "{s:?}");
    assert_eq!(
        s.segments_trimmed, s.segments_freed,
        "every freed segment trimmed"
    );
    assert_eq!(r.mapped_pages(), model.len() as u64);
    // Reopened from its summaries alone: the same pages.
    flush_q(&mut q);
    drop(q);
    let r2 = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r2.queue(&Backend::Blocking, 32).unwrap();
    for p in 0..pages {
        let got = version_of(p, &read(&mut q, p, 1));
        assert_eq!(got, model.get(&p).copied(), "page {p} after reopening");
    }
    // And it keeps working.
    for v in 0..(2 * pages) {
        write(&mut q, v % pages, 10 * pages + v).unwrap();
    }
}

#[test]
fn power_cuts_keep_every_page_at_its_last_barrier_or_later() {
    for config in configs() {
        power_cuts_keep_pages(config, None);
    }
}

/// As above where every trim fails and pages are unmapped too: a freed
/// segment's summaries, which still name its old extents, must then be
/// made to name nothing without a crash ever leaving both copies cut (the
/// first way, zeros over both copies at once, could: the open then failed
/// with `Corrupt`), and an unmapped page reads as zeros or as one of its
/// own versions, never another page's bytes.
#[test]
fn power_cuts_where_trims_fail_keep_pages_and_open() {
    for config in configs() {
        power_cuts_keep_pages(config, Some(DiscardFailure::Untouched));
    }
}

/// As above where every trim fails part way, leaving each summary copy of
/// the freed segment damaged: the intent that names a segment as being
/// trimmed, durable before the trim, lets the open take such a copy for
/// none (the build before failed with `Corrupt`).
#[test]
fn power_cuts_where_trims_fail_part_way_keep_pages_and_open() {
    for config in configs() {
        power_cuts_keep_pages(config, Some(DiscardFailure::HalfZeroed));
    }
}

/// What a page may read as after a power cut: (its version at the last
/// barrier, the versions written since, the versions an unmap may bring
/// back).
type PageModel = (Option<u64>, Vec<u64>, Vec<u64>);

fn power_cuts_keep_pages(config: RemapConfig, trims: Option<DiscardFailure>) {
    let trims_fail = trims.is_some();
    // Each run cuts the power at a different request: inside writes,
    // barriers (between their flushes and summaries) and collections; a
    // second run goes on from what the reopen found and is cut too.
    let mut cut_in_barrier = 0;
    let mut unmapped = 0;
    let mut freed_untrimmed = 0;
    // Copies the opens took for none in segments being trimmed.
    let mut trim_cut = 0;
    let policy = PowerCutPolicy::Random {
        keep: 1.0,
        drop: 1.0,
        tear: 1.0,
    };
    for seed in 0..60u64 {
        let d = disk(24);
        d.fail_discards(trims);
        let mut r = Remap::create(Target::Sim(d.clone()), config).unwrap();
        let pages = r.size() / PAGE as u64;
        // (version at the last barrier, versions written since, versions
        // an unmap since the last barrier that saw a newer one may bring
        // back: unmaps are not durable, and an older summary that names
        // the page can win again once the newer one's segment is freed).
        let mut model: HashMap<u64, PageModel> = HashMap::new();
        let mut history: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut x = seed * 7919 + 17;
        for run in 0..2u64 {
            let switch = PowerSwitch::new(200 + seed * 97 + run * 311, policy, seed + run * 1000);
            switch.attach(&d);
            let mut q = r.queue(&Backend::Blocking, 16).unwrap();
            for i in 1..=(20 * pages) {
                let v = run * 1_000_000 + i;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let p = x % (pages / 2 + seed);
                let e = model.entry(p).or_default();
                if trims_fail && x % 13 == 0 {
                    *e = (
                        None,
                        Vec::new(),
                        history.get(&p).cloned().unwrap_or_default(),
                    );
                    r.discard(p * PAGE as u64, PAGE as u64).unwrap();
                    unmapped += 1;
                    continue;
                }
                e.1.push(v);
                history.entry(p).or_default().push(v);
                if write(&mut q, p, v).is_err() {
                    break;
                }
                if x % 11 == 0 {
                    let before = switch.count();
                    if sync_io(&mut q, Request::flush(4)).unwrap().result.is_err() {
                        cut_in_barrier += usize::from(switch.count() > before);
                        break;
                    }
                    for e in model.values_mut() {
                        if let Some(&last) = e.1.last() {
                            *e = (Some(last), Vec::new(), Vec::new());
                        }
                    }
                }
            }
            assert!(
                switch.fired(),
                "seed {seed} run {run}: it ended before the cut"
            );
            let stats = r.stats();
            if trims_fail {
                assert_eq!(stats.segments_trimmed, 0);
                freed_untrimmed += stats.segments_freed;
            }
            drop(q);
            drop(r);
            d.power_on();
            r = Remap::open(Target::Sim(d.clone()))
                .unwrap_or_else(|e| panic!("seed {seed} run {run}: the open failed: {e}"));
            trim_cut += r.stats().trim_cut_copies;
            let mut q = r.queue(&Backend::Blocking, 16).unwrap();
            for (&p, e) in model.iter_mut() {
                let (durable, since, ghosts) = &*e;
                let got = version_of(p, &read(&mut q, p, 1));
                let fine = got == *durable
                    || got.is_some_and(|g| since.contains(&g) || ghosts.contains(&g));
                assert!(
                    fine,
                    "seed {seed} run {run} page {p}: {got:?}, durable {durable:?}, \
                     since {since:?}, unmapped {ghosts:?}"
                );
                // The next run starts from what was found (an unmapped
                // page's older versions may still come back).
                *e = (got, Vec::new(), ghosts.clone());
            }
            // Pages never written read as zeros.
            for p in 0..pages {
                if !model.contains_key(&p) {
                    assert_eq!(version_of(p, &read(&mut q, p, 1)), None);
                }
            }
        }
    }
    assert!(
        cut_in_barrier >= 3,
        "{cut_in_barrier} cuts inside a barrier"
    );
    assert_eq!(unmapped > 0, trims_fail);
    // (Elsewhere too a copy cut in a segment still named as being trimmed
    // is taken for none: one being emptied, or reused before the flush
    // after its trim.)
    if trims == Some(DiscardFailure::HalfZeroed) {
        assert!(trim_cut > 0, "no copy a trim cut");
    }
    assert_eq!(
        freed_untrimmed > 0,
        trims_fail,
        "{freed_untrimmed} segments freed"
    );
}

/// The background collection ([`Remap::start_collector`]) under two
/// writer threads, each with its own queue and half the pages, which read
/// their pages back as they go and flush now and then; then the power
/// goes (kill -9's way: every write the device took survives, the rest
/// is lost) at a different request each run. Every page reads, while the
/// run goes on, as the version last written, and after the reopen as the
/// version its writer's last flush covered or a later one written since.
#[test]
fn the_background_collection_under_concurrent_writers_keeps_every_page() {
    let mut runs = 0;
    for config in configs() {
        for seed in 0..12u64 {
            runs += background_collection_keeps_pages(config, seed);
        }
    }
    assert!(runs > 0, "the background collection never ran");
}

/// Runs of the background collection it saw.
fn background_collection_keeps_pages(config: RemapConfig, seed: u64) -> u64 {
    let d = disk(24);
    let r = Remap::create(Target::Sim(d.clone()), config).unwrap();
    let pages = r.size() / PAGE as u64;
    let switch = PowerSwitch::new(3_000 + (seed % 16) * 431, PowerCutPolicy::KeepAll, seed);
    switch.attach(&d);
    let collector = r.start_collector().unwrap();
    // Per writer: (versions of its pages written, in order; the version
    // its last completed flush covered).
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut q = r.queue(&Backend::Blocking, 16).unwrap();
                let mut written: HashMap<u64, Vec<u64>> = HashMap::new();
                let mut durable: HashMap<u64, u64> = HashMap::new();
                let mut freed = std::collections::HashSet::new();
                let mut x = seed * 7919 + 17 + w * 104_729;
                for i in 1..=(40 * pages) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Its own pages only (two writes of one page are never
                    // in flight at once), two thirds of the device.
                    let p = (x % (pages / 3)) * 2 + w;
                    if x % 17 == 0 && written.contains_key(&p) {
                        // The engine trims a page whose free is durable:
                        // it reads as zeros until written again, and no
                        // version of it is owed after a crash until then.
                        r.discard(p * PAGE as u64, PAGE as u64).unwrap();
                        freed.insert(p);
                        durable.remove(&p);
                        continue;
                    }
                    if x % 7 == 0 && freed.contains(&p) {
                        let got = version_of(p, &read(&mut q, p, 1));
                        assert_eq!(got, None, "seed {seed} writer {w} page {p} unmapped");
                    } else if x % 7 == 0 {
                        if let Some(&last) = written.get(&p).and_then(|v| v.last()) {
                            let c = sync_io(
                                &mut q,
                                Request::read(
                                    3,
                                    p * PAGE as u64,
                                    IoBuf::owned(AlignedBuf::new(PAGE, PAGE).unwrap()),
                                ),
                            )
                            .unwrap();
                            let Ok(_) = c.result else { break };
                            let got = version_of(p, &c.buf.unwrap().into_owned().unwrap()[..]);
                            assert_eq!(
                                got,
                                Some(last),
                                "seed {seed} writer {w} page {p} while running"
                            );
                        }
                    }
                    let v = w * 1_000_000_000 + i;
                    written.entry(p).or_default().push(v);
                    freed.remove(&p);
                    if write(&mut q, p, v).is_err() {
                        break;
                    }
                    if x % 29 == 0 {
                        let covered: Vec<(u64, u64)> = written
                            .iter()
                            .filter(|(p, _)| !freed.contains(*p))
                            .map(|(&p, v)| (p, *v.last().unwrap()))
                            .collect();
                        if sync_io(&mut q, Request::flush(4)).unwrap().result.is_err() {
                            break;
                        }
                        durable.extend(covered);
                    }
                }
                (written, durable)
            })
        })
        .collect();
    let models: Vec<_> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        switch.fired(),
        "seed {seed}: the writers ended before the cut"
    );
    collector.stop();
    let stats = r.stats();
    drop(r);
    d.power_on();
    let r = Remap::open(Target::Sim(d.clone()))
        .unwrap_or_else(|e| panic!("seed {seed}: the open failed: {e}"));
    let mut q = r.queue(&Backend::Blocking, 16).unwrap();
    for (written, durable) in &models {
        for (&p, versions) in written {
            let got = version_of(p, &read(&mut q, p, 1));
            let floor = durable.get(&p).copied();
            let fine = match (got, floor) {
                (None, None) => true,
                (Some(g), f) => {
                    let at = versions.iter().position(|&v| v == g);
                    let floor_at = f.and_then(|f| versions.iter().position(|&v| v == f));
                    at.is_some_and(|a| floor_at.is_none_or(|fa| a >= fa))
                }
                (None, Some(_)) => false,
            };
            assert!(
                fine,
                "seed {seed} page {p}: read {got:?}, its last flush covered {floor:?} \
                 ({stats:?})"
            );
        }
    }
    stats.background_runs
}

/// One background collection at a time per device; another may start
/// once it stopped (a device handed to a second open after a close).
#[test]
fn a_collection_starts_again_after_a_stop_and_not_twice() {
    let (_d, r, _q) = fresh(24, config());
    let first = r.start_collector().unwrap();
    assert!(matches!(
        r.start_collector(),
        Err(Error::InvalidArgument(_))
    ));
    first.stop();
    assert_eq!(
        r.low_water.load(Ordering::Relaxed),
        0,
        "writes wake nothing"
    );
    let second = r.start_collector().unwrap();
    assert!(r.low_water.load(Ordering::Relaxed) > 0);
    drop(second);
    assert_eq!(r.low_water.load(Ordering::Relaxed), 0);
}

/// A segment dead at a crash whose summaries still name extents (its
/// trim failed and the summary naming nothing that was to replace them
/// was not written) is not reused before it names nothing: else pages
/// unmapped after the reopen would fall back to its old extents while
/// another page's bytes lie there. (The first version put every dead
/// segment in the free list at the open: page 0 then read page 1's bytes.)
#[test]
fn a_segment_dead_at_a_crash_is_not_reused_before_it_names_nothing() {
    let (d, r, mut q) = fresh(24, config());
    d.fail_discards(Some(DiscardFailure::Untouched));
    // Segment s: page 0 first, then others; then all of them again,
    // elsewhere, and s dies.
    for p in 0..40 {
        write(&mut q, p, 1).unwrap();
    }
    flush_q(&mut q);
    let (s, k) = unloc(r.lock().map[0]);
    assert_eq!(k, 0, "page 0 is the first extent of its segment");
    for p in 0..40 {
        write(&mut q, p, 2).unwrap();
    }
    // The barrier makes the new summaries durable, then fails to write
    // s's summary naming nothing (its trim failed too), and the power goes.
    let g = r.geo;
    let summaries = g.summary_at(s, 0).min(g.summary_at(s, 1));
    let end = g.summary_at(s, 0).max(g.summary_at(s, 1)) + g.page;
    d.inject(crate::io::sim::Fault::range(
        Some(crate::OpKind::Write),
        summaries..end,
    ));
    assert!(sync_io(&mut q, Request::flush(4)).unwrap().result.is_err());
    cut_power(&d, q, r, 1);
    let r = Remap::open(Target::Sim(d.clone())).unwrap();
    let mut q = r.queue(&Backend::Blocking, 16).unwrap();
    for p in 0..40 {
        assert_eq!(version_of(p, &read(&mut q, p, 1)), Some(2), "page {p}");
    }
    {
        let st = r.lock();
        assert!(
            st.dying.contains(&s) && !st.free.contains(&s),
            "segment {s} is {:?}",
            st.segments[s as usize].life
        );
    }
    // Every page unmapped: their segments die, and a barrier frees them.
    r.discard(0, 40 * PAGE as u64).unwrap();
    flush_q(&mut q);
    // Other pages fill the open segment and the next ones (the old code
    // reopened s first); a barrier makes their data durable, then fails to
    // write s's summary, and the power goes.
    for p in 40..80 {
        write(&mut q, p, 3).unwrap();
    }
    d.inject(crate::io::sim::Fault::range(
        Some(crate::OpKind::Write),
        summaries..end,
    ));
    let _ = sync_io(&mut q, Request::flush(4)).unwrap();
    cut_power(&d, q, r, 2);
    let r = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r.queue(&Backend::Blocking, 16).unwrap();
    for p in 0..40 {
        // Zeros or one of its own versions; never another page's bytes.
        let got = version_of(p, &read(&mut q, p, 1));
        assert!(got.is_none_or(|v| v <= 3), "page {p}: {got:?}");
    }
    for p in 40..80 {
        let got = version_of(p, &read(&mut q, p, 1));
        assert!(got.is_none_or(|v| v == 3), "page {p}: {got:?}");
    }
}

#[test]
fn a_durable_write_survives_a_cut_without_a_flush() {
    for config in configs() {
        a_durable_write_survives(config);
    }
}

fn a_durable_write_survives(config: RemapConfig) {
    let (d, r, mut q) = fresh(16, config);
    write(&mut q, 5, 1).unwrap();
    let req = Request::write_durable(9, 6 * PAGE as u64, IoBuf::owned(content(6, 2)));
    sync_io(&mut q, req).unwrap().result.unwrap();
    cut_power(&d, q, r, 1);
    let r = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    assert_eq!(version_of(6, &read(&mut q, 6, 1)), Some(2));
    assert_eq!(
        version_of(5, &read(&mut q, 5, 1)),
        Some(1),
        "completed before it"
    );
}

#[test]
fn a_torn_summary_leaves_the_one_before() {
    for config in configs() {
        a_torn_summary(config);
    }
}

/// The byte offset of summary copy `k` of data segment `s` on `disk(..)`.
fn summary_copy(s: u64, k: u64) -> u64 {
    (s + 1) * 16 * PAGE as u64 + k * PAGE as u64
}

/// The copy of data segment `s` whose summary is newer.
fn newer_copy(d: &SimDisk, s: u64) -> u64 {
    let version = |k| {
        let b = d.read_durable(summary_copy(s, k), PAGE);
        u64::from_le_bytes(b[24..32].try_into().unwrap())
    };
    if version(0) > version(1) {
        0
    } else {
        1
    }
}

/// Page 1, a barrier, page 2 of class `class` (grouped by class), a
/// barrier, a power cut, and a byte flipped in segment 0's newer summary.
fn flipped_after_two_barriers(config: RemapConfig, class: Placement) -> Arc<SimDisk> {
    let (d, r, mut q) = fresh(16, config);
    r.set_grouping(Grouping::Classes);
    write(&mut q, 1, 1).unwrap();
    flush_q(&mut q);
    write_as(&mut q, 2, 2, class).unwrap();
    flush_q(&mut q);
    cut_power(&d, q, r, 1);
    d.overwrite_durable(summary_copy(0, newer_copy(&d, 0)) + 100, &[0xA5]);
    d
}

fn a_torn_summary(config: RemapConfig) {
    // A crash after the barrier: the newer summary of the segment both
    // pages went to is taken as cut by it (that barrier's intent names
    // the segment), as a flipped byte in it shows.
    let d = flipped_after_two_barriers(config, Placement::Hot);
    let r = Remap::open(Target::Sim(d.clone())).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    assert_eq!(version_of(1, &read(&mut q, 1, 1)), Some(1));
    assert_eq!(
        version_of(2, &read(&mut q, 2, 1)),
        None,
        "its write is lost, not garbage"
    );
    // The next barrier writes the cut copy again: after a clean close the
    // device opens with every copy readable.
    write(&mut q, 3, 3).unwrap();
    flush_q(&mut q);
    drop(q);
    assert!(r.close().unwrap(), "every summary written");
    drop(r);
    let r = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    assert_eq!(version_of(1, &read(&mut q, 1, 1)), Some(1));
    assert_eq!(version_of(3, &read(&mut q, 3, 1)), Some(3));
}

/// A summary that does not read back where no crash explains it (after
/// a clean close; after a crash, in a segment the last barrier did not
/// write) fails the open: opening would silently give older versions of
/// the pages it named. The first version took it for a torn write.
#[test]
fn a_damaged_summary_no_crash_explains_fails_the_open() {
    for config in configs() {
        // A clean close, then the newest summary flipped.
        let (d, r, mut q) = fresh(16, config);
        write(&mut q, 1, 1).unwrap();
        flush_q(&mut q);
        write(&mut q, 2, 2).unwrap();
        flush_q(&mut q);
        drop(q);
        assert!(r.close().unwrap());
        drop(r);
        d.overwrite_durable(summary_copy(0, newer_copy(&d, 0)) + 100, &[0xA5]);
        let err = Remap::open(Target::Sim(d)).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { .. }) && err.to_string().contains("damaged"),
            "{err}"
        );
        // Summaries left to write: no clean close is marked.
        let (_d, r, mut q) = fresh(16, config);
        write(&mut q, 1, 1).unwrap();
        assert!(!r.close().unwrap());
        // A crash after a barrier that wrote another segment's summary
        // (a cold page's: grouped by class, another stream's segment).
        let d = flipped_after_two_barriers(config, Placement::Cold);
        let err = Remap::open(Target::Sim(d)).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
    }
}

#[test]
fn opening_a_device_without_a_label_fails_clearly() {
    let d = disk(16);
    let err = Remap::open(Target::Sim(d.clone())).unwrap_err();
    assert!(err.to_string().contains("out-of-place label"), "{err}");
    assert!(!Remap::is_formatted(&Target::Sim(d.clone())).unwrap());
    Remap::create(Target::Sim(d.clone()), config()).unwrap();
    assert!(Remap::is_formatted(&Target::Sim(d.clone())).unwrap());
    // A flipped byte of the magic, which the label's checksum does not
    // cover: damage, not a file without a label.
    for at in [0, 7] {
        let mut label = d.read_durable(0, PAGE);
        label[at] ^= 0x10;
        d.overwrite_durable(0, &label);
        let err = Remap::is_formatted(&Target::Sim(d.clone())).unwrap_err();
        assert!(matches!(err, Error::Corrupt { page: 0, .. }), "{err}");
        label[at] ^= 0x10;
        d.overwrite_durable(0, &label);
        assert!(Remap::is_formatted(&Target::Sim(d.clone())).unwrap());
    }
    let small = disk(4);
    let err = Remap::create(Target::Sim(small), config()).unwrap_err();
    assert!(err.to_string().contains("at least"), "{err}");
    let bad = RemapConfig {
        segment_pages: 1000,
        ..config()
    };
    assert!(Remap::create(Target::Sim(d), bad).is_err());
}

#[test]
fn requests_past_the_offered_size_are_refused() {
    let d = disk(16);
    let r = Remap::create(Target::Sim(d), config()).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    let pages = r.size() / PAGE as u64;
    assert!(write(&mut q, pages, 1).is_err());
    write(&mut q, pages - 1, 1).unwrap();
    assert!(Target::Remap(r.clone()).grow(r.size() + 4096).is_err());
}

#[test]
fn summaries_round_trip_and_reject_damage() {
    let g = Geometry::of(&compressed());
    let mut b = vec![0u8; g.summary_bytes()];
    let e = |page, stamp, start, units| Entry {
        page,
        stamp,
        born: stamp,
        start,
        units,
    };
    let entries = vec![
        e(3, 10, 0, 8),
        e(NO_PAGE, 0, 8, 2),
        e((1 << 40) - 2, (1 << 56) - 1, 10, 1),
    ];
    let head = SummaryHead {
        segment: 5,
        stream: 2,
        version: 99,
    };
    encode_summary(&mut b, head, &entries);
    let want = Summary {
        segment: 5,
        stream: 2,
        version: 99,
        entries: entries.clone(),
    };
    assert_eq!(decode_summary(&b, &g), Some(want));
    let plain = Geometry::of(&config());
    assert_eq!(decode_summary(&b, &plain), None, "extents of 8 units");
    let mut past = entries.clone();
    past[1].start = g.data_units - 1;
    encode_summary(&mut b, head, &past);
    assert_eq!(decode_summary(&b, &g), None, "an extent past the data area");
    encode_summary(&mut b, head, &entries);
    b[40] ^= 1;
    assert_eq!(decode_summary(&b, &g), None);
    // A version (or an intent's number) past what 7-byte stamps hold:
    // the clock would restart there and cut every later stamp short.
    let far = SummaryHead {
        version: 1 << 56,
        ..head
    };
    encode_summary(&mut b, far, &entries);
    assert_eq!(decode_summary(&b, &g), None, "a version of 2^56");
    for c in configs() {
        let mut l = vec![0u8; PAGE];
        encode_label(&mut l, &c, 321);
        assert_eq!(decode_label(&l).unwrap(), (c, 321));
        l[30] ^= 1;
        assert!(decode_label(&l).is_err());
    }
    for (v, magic) in OLD_LABEL_MAGICS.iter().enumerate() {
        let mut old = vec![0u8; PAGE];
        old[..8].copy_from_slice(*magic);
        let err = decode_label(&old).unwrap_err();
        assert!(
            err.to_string().contains(&format!("format {}", v + 1)),
            "{err}"
        );
    }
    let mut i = vec![0u8; 3 * PAGE];
    encode_intent(&mut i, 77, [4u32, 9, 1].into_iter());
    assert_eq!(decode_intent(&i), Some((77, vec![4, 9, 1])));
    i[30] ^= 1;
    assert_eq!(decode_intent(&i), None);
    encode_intent(&mut i, (1 << 56) - 1, [4u32].into_iter());
    assert!(decode_intent(&i).is_some());
    encode_intent(&mut i, 1 << 56, [4u32].into_iter());
    assert_eq!(decode_intent(&i), None, "an intent numbered 2^56");
}

#[test]
fn compressed_pages_take_less_room_and_the_collection_copies_them_packed() {
    let d = disk(40);
    let c = compressed();
    let r = Remap::create(Target::Sim(d.clone()), c).unwrap();
    let pages = r.size() / PAGE as u64;
    let mut q = r.queue(&Backend::Blocking, 32).unwrap();
    // Many writes in one submit share chunks; then the device is
    // overwritten many times over so the collection copies extents.
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut x = 99u64;
    // Waits for every write in flight (as the engine does, a page is not
    // written again while a write of it is in flight: two would land in
    // either order, on this device as on any).
    let drain = |q: &mut RemapQueue, in_flight: &mut Vec<u64>| {
        q.wait(usize::MAX, None).unwrap();
        let mut out = Vec::new();
        q.reap(&mut out);
        assert_eq!(out.len(), in_flight.len());
        assert!(out.iter().all(|c| c.result.is_ok()));
        in_flight.clear();
    };
    let mut in_flight = Vec::new();
    for round in 1..=8u64 {
        for n in 0..pages {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Every page once, then at random: the segments' live
            // extents scatter, so the collection must copy.
            let p = if round == 1 { n } else { x % pages };
            if in_flight.len() == 16 || in_flight.contains(&p) {
                drain(&mut q, &mut in_flight);
            }
            let v = round * pages + n;
            let req = Request::write(p, p * PAGE as u64, IoBuf::owned(content(p, v)))
                .placed(Placement::Hot);
            q.push(req).map_err(|r| r.error).unwrap();
            in_flight.push(p);
            model.insert(p, v);
        }
        drain(&mut q, &mut in_flight);
        flush_q(&mut q);
    }
    let stats = r.stats();
    assert!(stats.gc_copies > 0, "{stats:?}");
    assert!(
        stats.stored_bytes * 2 < stats.page_writes * PAGE as u64,
        "{stats:?}"
    );
    assert!(r.live_bytes() * 2 < r.mapped_pages() * PAGE as u64);
    let check = |q: &mut dyn IoQueue| {
        for p in 0..pages {
            assert_eq!(
                version_of(p, &read(q, p, 1)),
                model.get(&p).copied(),
                "page {p}"
            );
        }
        let run = read(q, 3, 5);
        for i in 0..5 {
            let got = version_of(3 + i, &run[i as usize * PAGE..(i as usize + 1) * PAGE]);
            assert_eq!(got, model.get(&(3 + i)).copied());
        }
    };
    check(&mut q);
    drop(q);
    drop(r);
    let r = Remap::open(Target::Sim(d.clone())).unwrap();
    assert!(r.config().compress);
    let mut q = r.queue(&Backend::Blocking, 32).unwrap();
    check(&mut q);
}

#[test]
fn a_flipped_byte_in_a_compressed_extent_is_an_error_not_a_page() {
    let d = disk(16);
    let c = compressed();
    let r = Remap::create(Target::Sim(d.clone()), c).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    write(&mut q, 1, 1).unwrap();
    flush_q(&mut q);
    let e = r.read_extent(1).unwrap();
    r.read_done(e.loc);
    assert!(e.packed && e.len < PAGE, "{e:?}");
    // The length field says more than the extent holds.
    d.overwrite_durable(e.at + 2, &[0x7F]);
    drop(q);
    drop(r);
    let r = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    let b = AlignedBuf::new(PAGE, PAGE).unwrap();
    let c = sync_io(&mut q, Request::read(3, PAGE as u64, IoBuf::owned(b))).unwrap();
    let err = c.result.unwrap_err();
    assert!(
        err.to_string().contains("does not decompress")
            || err.to_string().contains("says it holds"),
        "{err}"
    );
}

/// A write of class `Collected` from the engine (the class the device's
/// own collection writes as) is mapped like any: on a compressed device
/// its chunk shares the collection's stream but not its rule (a copy maps
/// only if the page did not move since). The first version lost it.
#[test]
fn an_engine_write_of_the_collections_class_is_mapped() {
    for config in configs() {
        let (_d, _r, mut q) = fresh(16, config);
        for p in 0..4u64 {
            write_as(&mut q, p, 7, Placement::Collected).unwrap();
        }
        for p in 0..4u64 {
            assert_eq!(version_of(p, &read(&mut q, p, 1)), Some(7), "{config:?}");
        }
    }
}

/// Every extent's first unit fits the summary's 16 bits: a plain device
/// of pages so large that its segments hold more units is refused.
#[test]
fn configs_whose_extents_a_summary_cannot_name_are_refused() {
    for segment_pages in 0..8 {
        for compress in [false, true] {
            let tiny = RemapConfig {
                segment_pages,
                compress,
                ..config()
            };
            assert!(tiny.check().is_err(), "{segment_pages} pages");
        }
    }
    let huge = RemapConfig {
        page_size: 4 << 20,
        segment_pages: 70_000,
        spare: 0.1,
        compress: false,
    };
    assert!(huge.check().is_err());
    let too_big_to_pack = RemapConfig {
        page_size: 256 << 10,
        compress: true,
        ..config()
    };
    assert!(too_big_to_pack.check().is_err());
    for c in configs() {
        c.check().unwrap();
    }
}

/// A barrier round that fails after its intent was flushed leaves that
/// intent as the one naming the summaries it may have cut: the rounds
/// after it must not write over it until one writes those summaries
/// whole. Here a round's second flush fails (its summary of segment B may
/// be cut), the next round's first flush fails too, and the power goes:
/// the open must take B's cut copy for one (the first version put the
/// second intent over the first and failed the open with `Corrupt`).
#[test]
fn a_failed_round_keeps_the_intent_naming_what_it_cut() {
    use crate::io::sim::Fault;
    use crate::OpKind;
    for config in configs() {
        let (d, r, mut q) = fresh(16, config);
        r.set_grouping(Grouping::Classes);
        // Segment A (hot), its summary written whole.
        write(&mut q, 1, 1).unwrap();
        flush_q(&mut q);
        // Segment B (cold): the round's second flush fails.
        write_as(&mut q, 2, 2, Placement::Cold).unwrap();
        d.inject(Fault::nth(Some(OpKind::Flush), 1));
        assert!(sync_io(&mut q, Request::flush(4)).unwrap().result.is_err());
        // The next round's first flush fails.
        write_as(&mut q, 3, 3, Placement::Cold).unwrap();
        d.inject(Fault::nth(Some(OpKind::Flush), 0));
        assert!(sync_io(&mut q, Request::flush(4)).unwrap().result.is_err());
        // Every write not flushed is cut, and comes out as garbage (as a
        // torn write may): B's summary and the second round's intent.
        let report = cut_power(&d, q, r, 1);
        let garbage = garbage();
        let intents = PAGE as u64..16 * PAGE as u64;
        let mut cut = 0;
        for w in &report.writes {
            if intents.contains(&w.offset) || w.offset == summary_copy(1, 0) {
                d.overwrite_durable(w.offset, &garbage);
                cut += 1;
            }
        }
        assert!(cut >= 2, "{:?}", report.writes);
        let r = Remap::open(Target::Sim(d)).unwrap();
        let mut q = r.queue(&Backend::Blocking, 4).unwrap();
        assert_eq!(version_of(1, &read(&mut q, 1, 1)), Some(1));
    }
}

/// A chunk that took a segment's last units and gives back a tail opens
/// the segment again for its stream (it has no open segment then): the
/// next chunk of the stream lands in the tail, not in a fresh segment.
#[test]
fn a_tail_given_back_reopens_the_segment_its_chunk_closed() {
    let d = disk(16);
    let r = Remap::create(Target::Sim(d), compressed()).unwrap();
    let du = r.geo.data_units;
    let stream = group::class_stream(Placement::Hot);
    let mut st = r.lock();
    let (s, a, n) = r.take_chunk(&mut st, stream, du - 16, 1, 0).unwrap();
    assert_eq!((a, n), (0, du - 16));
    let (s2, b, m) = r.take_chunk(&mut st, stream, 16, 1, 0).unwrap();
    assert_eq!((s2, b, m), (s, du - 16, 16));
    assert_eq!(st.segments[s as usize].life, Life::Closed);
    assert_eq!(st.open[stream], None);
    // One unit used: a flash page (8 units) taken, 8 given back.
    r.release_chunk(&mut st, s, b, 1, m);
    assert_eq!(st.segments[s as usize].life, Life::Open);
    assert_eq!(st.open[stream], Some(s));
    r.release_chunk(&mut st, s, a, n, n);
    let next = r.take_chunk(&mut st, stream, 8, 1, 0).unwrap();
    assert_eq!(next, (s, du - 8, 8));
}

/// Death-time grouping (the default): a page rewritten soon after its last
/// write goes to another segment than one rewritten after a long life,
/// and the collection's copies go by their age to streams of their own,
/// never to an engine write's. By class, both rewrites share a segment.
#[test]
fn death_time_grouping_parts_short_and_long_lives() {
    let stream_of = |r: &Remap, page: u64| {
        let st = r.lock();
        let (s, _) = unloc(st.map[page as usize]);
        st.segments[s as usize].stream
    };
    for grouping in [Grouping::DeathTime, Grouping::Classes] {
        let (_d, r, mut q) = fresh(40, config());
        r.set_grouping(grouping);
        // Two rounds over 40 pages: each replaced version lived ~40 writes.
        for v in 1..=2 {
            for p in 0..40 {
                write(&mut q, p, v).unwrap();
            }
        }
        assert!(r.mean_life() > 30.0 || grouping == Grouping::Classes);
        // Page 0 again at once (a life of 1), page 20 after ~60 writes.
        write(&mut q, 0, 3).unwrap();
        write(&mut q, 0, 4).unwrap();
        for p in 1..20 {
            write(&mut q, p, 3).unwrap();
        }
        write(&mut q, 20, 3).unwrap();
        let (short, long) = (stream_of(&r, 0), stream_of(&r, 20));
        match grouping {
            Grouping::DeathTime => assert_ne!(short, long),
            Grouping::Classes => assert_eq!(short, long),
        }
        // The collection copies the live pages out: none lands in an
        // engine write's stream under death time.
        flush_q(&mut q);
        let before = r.stats().gc_copies;
        let victims: Vec<u32> = {
            let st = r.lock();
            (0..st.segments.len() as u32)
                .filter(|&s| {
                    let g = &st.segments[s as usize];
                    g.life == Life::Closed && g.pending == 0 && g.live_units > 0
                })
                .collect()
        };
        for v in victims {
            r.copy_out(&mut **r.own_queue(), v).unwrap();
        }
        assert!(r.stats().gc_copies > before);
        if grouping == Grouping::DeathTime {
            let st = r.lock();
            for (s, seg) in st.segments.iter().enumerate() {
                let copies = seg.entries.iter().enumerate().any(|(k, e)| {
                    e.page != NO_PAGE
                        && st.map[e.page as usize] == loc(s as u32, k as u32)
                        && e.stamp > e.born
                });
                if copies && seg.life != Life::Free {
                    assert!(seg.stream as usize >= 3, "copies in stream {}", seg.stream);
                }
            }
        }
        for p in 0..40 {
            let v = match p {
                0 => 4,
                1..=20 => 3,
                _ => 2,
            };
            assert_eq!(version_of(p, &read(&mut q, p, 1)), Some(v), "page {p}");
        }
    }
}

/// A segment that dies with its summary still owed (its last write came
/// after the last barrier) is freed only by a barrier after the one that
/// writes that summary: the open drops every copy of a segment its intent
/// names as being trimmed when one copy is unreadable, and the torn copy
/// was the new summary, not a trim's (the older copy, durable and naming
/// flushed versions, was thrown away with it: a review's finding).
#[test]
fn a_segment_dying_with_its_summary_owed_keeps_its_durable_copy() {
    use crate::io::sim::Fault;
    use crate::OpKind;
    let (d, r, mut q) = fresh(24, config());
    r.set_grouping(Grouping::Classes);
    let units = u64::from(r.geo.data_units);
    // Segment 0: all but one unit, its summary written (copy 0).
    for p in 0..units - 1 {
        write(&mut q, p, 1).unwrap();
    }
    flush_q(&mut q);
    // Its last unit: closed and owing a summary; then every page of it
    // written again elsewhere: dying, its summary still owed.
    write(&mut q, units - 1, 1).unwrap();
    for p in 0..units {
        write(&mut q, p, 2).unwrap();
    }
    // The barrier's second flush fails; then the power goes, and every
    // summary written since comes out as garbage.
    d.inject(Fault::nth(Some(OpKind::Flush), 1));
    assert!(sync_io(&mut q, Request::flush(4)).unwrap().result.is_err());
    let report = cut_power(&d, q, r, 1);
    let garbage = garbage();
    for w in &report.writes {
        if w.offset >= 16 * PAGE as u64 && (w.offset / PAGE as u64) % 16 < 2 {
            d.overwrite_durable(w.offset, &garbage);
        }
    }
    let r = Remap::open(Target::Sim(d)).unwrap();
    let mut q = r.queue(&Backend::Blocking, 4).unwrap();
    for p in 0..units - 1 {
        let v = version_of(p, &read(&mut q, p, 1));
        assert!(matches!(v, Some(1 | 2)), "page {p}: flushed, now {v:?}");
    }
}

/// One unreadable live extent in the segment the collection would pick
/// passes that segment over: the writes go on, collected from the others
/// (it was picked again at every collection, failed each, and every write
/// failed once the free segments ran out; a review's finding).
#[test]
fn an_unreadable_extent_in_the_victim_does_not_stop_the_collection() {
    use crate::io::sim::Fault;
    use crate::OpKind;
    let d = disk(40);
    let r = Remap::create(Target::Sim(d.clone()), config()).unwrap();
    let pages = r.size() / PAGE as u64;
    let mut q = r.queue(&Backend::Blocking, 32).unwrap();
    let mut x = 99u64;
    let next = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x / 2 % pages
    };
    for v in 1..=2 * pages {
        write(&mut q, next(&mut x), v).unwrap();
    }
    flush_q(&mut q);
    // One live extent of the victim becomes unreadable.
    let victim = r.pick_victim().expect("a victim");
    let (bad_page, at) = {
        let st = r.lock();
        let seg = &st.segments[victim as usize];
        let k = (0..seg.entries.len())
            .find(|&k| {
                let e = seg.entries[k];
                e.page != NO_PAGE && st.map[e.page as usize] == loc(victim, k as u32)
            })
            .expect("a live extent");
        let e = r.extent(&st, loc(victim, k as u32));
        (seg.entries[k].page, e.at..e.at + e.len as u64)
    };
    d.inject(Fault::range(Some(OpKind::Read), at).sticky());
    // Writes of every page but the unreadable one, twice the device over.
    for v in 2 * pages + 1..=4 * pages {
        let p = next(&mut x);
        if p != bad_page {
            write(&mut q, p, v).unwrap_or_else(|e| panic!("write {v}: {e}"));
        }
    }
    flush_q(&mut q);
}
