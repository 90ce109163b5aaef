//! The mirror on simulated devices, through its queue alone (no engine
//! above it): fan-out, reads spread, repair of a damaged block, failure of
//! a copy and its record in the labels, comparison of copies after a
//! crash, and the online rebuild against concurrent writes.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::*;
use crate::io::sim::{Fault, SimConfig, SimDisk};
use crate::io::{sync_io, IoQueue, Target};

const BLOCK: usize = 4096;

/// Test blocks: crc32c of bytes 4.. at 0..4, an LSN at 8..16.
struct TestCheck;

impl PageCheck for TestCheck {
    fn page_size(&self) -> usize {
        BLOCK
    }

    fn check(&self, _offset: u64, b: &[u8]) -> Option<u64> {
        let crc = u32::from_le_bytes(b[0..4].try_into().unwrap());
        (crc == crc32c::crc32c(&b[4..])).then(|| u64::from_le_bytes(b[8..16].try_into().unwrap()))
    }
}

fn block(lsn: u64, fill: u8) -> Vec<u8> {
    let mut b = vec![fill; BLOCK];
    b[8..16].copy_from_slice(&lsn.to_le_bytes());
    let crc = crc32c::crc32c(&b[4..]);
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    b
}

fn disks(n: usize, size: u64) -> Vec<Arc<SimDisk>> {
    (0..n)
        .map(|i| SimDisk::new(i, size, SimConfig::default()))
        .collect()
}

fn specs(d: &[Arc<SimDisk>]) -> Vec<CopySpec> {
    d.iter()
        .map(|d| CopySpec::of(Target::Sim(d.clone())))
        .collect()
}

fn mirror(d: &[Arc<SimDisk>]) -> Arc<Mirror> {
    let m = Mirror::create(Role::Data(0), 0, specs(d)).unwrap();
    m.set_page_check(Arc::new(TestCheck));
    m
}

fn write(q: &mut MirrorQueue, offset: u64, bytes: &[u8]) -> Result<()> {
    let mut b = AlignedBuf::new(bytes.len(), 4096).unwrap();
    b.copy_from_slice(bytes);
    sync_io(q, Request::write(1, offset, IoBuf::owned(b)))?.result?;
    Ok(())
}

fn read(q: &mut MirrorQueue, offset: u64, len: usize, pages: bool) -> Result<Vec<u8>> {
    let b = IoBuf::owned(AlignedBuf::new(len, 4096).unwrap());
    let mut req = Request::read(2, offset, b);
    req.pages = pages;
    let c = sync_io(q, req)?;
    c.result?;
    Ok(c.buf.unwrap().into_owned().unwrap().to_vec())
}

fn on_disk(d: &SimDisk, offset: u64, len: usize) -> Vec<u8> {
    d.read_current(LABEL_BYTES + offset, len)
}

#[test]
fn writes_reach_every_copy_and_reads_spread_over_them() {
    let d = disks(2, 1 << 20);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    for i in 0..8u64 {
        write(&mut q, i * 4096, &block(i + 1, i as u8)).unwrap();
    }
    sync_io(&mut q, Request::flush(3)).unwrap().result.unwrap();
    for i in 0..8u64 {
        assert!(on_disk(&d[0], i * 4096, BLOCK) == block(i + 1, i as u8));
        assert!(on_disk(&d[1], i * 4096, BLOCK) == block(i + 1, i as u8));
        assert!(read(&mut q, i * 4096, BLOCK, true).unwrap() == block(i + 1, i as u8));
    }
    let s = m.status();
    assert_eq!(s.copies[0].writes, 8);
    assert_eq!(s.copies[1].writes, 8);
    // Equal loads alternate by block: both copies served reads.
    assert!(s.copies[0].reads > 0 && s.copies[1].reads > 0, "{s:?}");
    assert_eq!(s.size, (1 << 20) - LABEL_BYTES);
}

#[test]
fn a_damaged_block_is_read_from_the_other_copy_and_repaired() {
    let d = disks(2, 1 << 20);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    for i in 0..4u64 {
        write(&mut q, i * 4096, &block(7, 0xA0 + i as u8)).unwrap();
    }
    sync_io(&mut q, Request::flush(3)).unwrap().result.unwrap();
    // One byte flipped on each copy, on different blocks, where reads go
    // (ties alternate by block: block 1 is read from copy 1, block 2 from
    // copy 0).
    for (copy, blk) in [(1usize, 1u64), (0, 2)] {
        let mut b = on_disk(&d[copy], blk * 4096, BLOCK);
        b[100] ^= 0xFF;
        d[copy].overwrite_durable(LABEL_BYTES + blk * 4096, &b);
    }
    for i in 0..4u64 {
        assert!(read(&mut q, i * 4096, BLOCK, true).unwrap() == block(7, 0xA0 + i as u8));
    }
    for i in 0..4u64 {
        for (c, disk) in d.iter().enumerate() {
            let good = on_disk(disk, i * 4096, BLOCK) == block(7, 0xA0 + i as u8);
            assert!(good, "block {i} of copy {c} not repaired");
        }
    }
    let s = m.status();
    assert!(s.mismatches >= 1, "{s:?}");
    assert!(
        s.copies.iter().map(|c| c.repairs).sum::<u64>() >= 1,
        "{s:?}"
    );
    // A read without the page flag is not checked (a large value's bytes).
    assert!(s.copies.iter().all(|c| c.state == CopyState::Healthy));
}

#[test]
fn a_block_damaged_on_every_copy_comes_back_as_read() {
    let d = disks(2, 1 << 20);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    write(&mut q, 0, &block(1, 3)).unwrap();
    sync_io(&mut q, Request::flush(3)).unwrap().result.unwrap();
    for disk in &d {
        let mut b = on_disk(disk, 0, BLOCK);
        b[200] ^= 1;
        disk.overwrite_durable(LABEL_BYTES, &b);
    }
    // The layer above sees the damage (its own check fails), as without a
    // mirror; nothing is "repaired" with a bad copy.
    let got = read(&mut q, 0, BLOCK, true).unwrap();
    assert!(TestCheck.check(0, &got).is_none());
    assert_eq!(m.status().copies.iter().map(|c| c.repairs).sum::<u64>(), 0);
}

/// Two copies of 1 MiB: block 1 written at 0 to both, then copy 1 fails
/// for good on block 2's write at 4096, which copy 0 takes (no error
/// reaches the caller).
fn with_copy_1_failed() -> (Vec<Arc<SimDisk>>, Arc<Mirror>, MirrorQueue) {
    let d = disks(2, 1 << 20);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    write(&mut q, 0, &block(1, 1)).unwrap();
    d[1].inject(Fault::nth(Some(crate::OpKind::Write), 0).sticky());
    write(&mut q, 4096, &block(2, 2)).unwrap();
    (d, m, q)
}

#[test]
fn a_failing_copy_is_dropped_recorded_in_the_labels_and_never_read() {
    let (d, m, mut q) = with_copy_1_failed();
    let s = m.status();
    assert_eq!(s.copies[1].state, CopyState::Failed);
    assert!(s.copies[1].failure.is_some());
    assert_eq!(s.generation, 2);
    assert_eq!(
        s.durable_generation, 2,
        "the write completed after the label"
    );
    // Copy 0's label says copy 1 failed.
    let l = read_label(&Target::Sim(d[0].clone())).unwrap().unwrap();
    assert_eq!((l.generation, l.states[1]), (2, CopyState::Failed));
    // Reads never go to copy 1 again.
    let before = m.status().copies[1].reads;
    for _ in 0..10 {
        assert!(read(&mut q, 4096, BLOCK, true).unwrap() == block(2, 2));
    }
    assert_eq!(m.status().copies[1].reads, before);
    // The last healthy copy failing is the caller's error.
    d[0].inject(Fault::nth(Some(crate::OpKind::Write), 0));
    assert!(write(&mut q, 8192, &block(3, 3)).is_err());
    assert_eq!(m.status().copies[0].state, CopyState::Healthy);
    m.finish();
    // Opening again: the labels' newest generation decides.
    let m2 = Mirror::open(Role::Data(0), 0, specs(&d), false).unwrap();
    assert_eq!(m2.states(), vec![CopyState::Healthy, CopyState::Failed]);
}

#[test]
fn opening_with_a_copy_missing_marks_it_failed_and_labels_must_match() {
    let d = disks(2, 1 << 20);
    mirror(&d);
    let mut s = specs(&d);
    s[1].target = None;
    let m = Mirror::open(Role::Data(0), 0, s, false).unwrap();
    assert_eq!(m.states(), vec![CopyState::Healthy, CopyState::Failed]);
    assert_eq!(m.status().generation, 2);
    // Another role's copies, or copies swapped, are refused.
    assert!(matches!(
        Mirror::open(Role::Log(0), 0, specs(&d), false),
        Err(Error::Mirror(_))
    ));
    let mut swapped = specs(&d);
    swapped.swap(0, 1);
    assert!(Mirror::open(Role::Data(0), 0, swapped, false).is_err());
    // A device that is no copy at all.
    let blank = disks(2, 1 << 20);
    assert!(matches!(
        Mirror::open(Role::Data(0), 0, specs(&blank), false),
        Err(Error::Mirror(_))
    ));
}

#[test]
fn compared_reads_take_the_newest_valid_version_and_repair_the_rest() {
    let d = disks(3, 1 << 20);
    let m = mirror(&d);
    // After a crash: block 0 newer on copy 2, block 1 torn on copy 0,
    // block 2 the same everywhere.
    let put = |c: usize, blk: u64, b: &[u8]| d[c].overwrite_durable(LABEL_BYTES + blk * 4096, b);
    for c in 0..3 {
        put(c, 0, &block(5, 1));
        put(c, 1, &block(9, 2));
        put(c, 2, &block(3, 3));
    }
    put(2, 0, &block(6, 4));
    let mut torn = block(9, 2);
    torn[1000..1512].fill(0xEE);
    put(0, 1, &torn);
    m.set_verify_all(true);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    assert!(read(&mut q, 0, BLOCK, false).unwrap() == block(6, 4));
    assert!(read(&mut q, 4096, BLOCK, false).unwrap() == block(9, 2));
    assert!(read(&mut q, 8192, BLOCK, false).unwrap() == block(3, 3));
    for (c, disk) in d.iter().enumerate() {
        assert!(on_disk(disk, 0, BLOCK) == block(6, 4), "copy {c}");
        assert!(on_disk(disk, 4096, BLOCK) == block(9, 2), "copy {c}");
    }
    assert_eq!(m.status().mismatches, 2);
}

/// A mirror of two copies and `blocks` blocks, written, whose copy 1
/// failed at a write and was replaced by a blank disk, not yet rebuilt:
/// the disks, the mirror, a queue to it, and the blank disk.
fn with_a_blank_copy(blocks: u64) -> (Vec<Arc<SimDisk>>, Arc<Mirror>, MirrorQueue, Arc<SimDisk>) {
    let d = disks(2, LABEL_BYTES + blocks * 4096);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    for i in 0..blocks {
        write(&mut q, i * 4096, &block(1, i as u8)).unwrap();
    }
    d[1].inject(Fault::nth(Some(crate::OpKind::Write), 0).sticky());
    write(&mut q, 0, &block(2, 0xFF)).unwrap();
    assert_eq!(m.states()[1], CopyState::Failed);
    // The disk is replaced by a blank one.
    let fresh = SimDisk::new(1, LABEL_BYTES + blocks * 4096, SimConfig::default());
    m.replace_copy(1, Target::Sim(fresh.clone())).unwrap();
    (d, m, q, fresh)
}

#[test]
fn a_rebuild_under_concurrent_writes_ends_with_identical_copies() {
    const BLOCKS: u64 = 600; // over two ranges of the rebuild
    let (d, m, mut q, fresh) = with_a_blank_copy(BLOCKS);
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|s| {
        let r = s.spawn(|| m.rebuild(1, &stop));
        // Writes go on during the rebuild, all over the device.
        let mut lsn = 10;
        while !r.is_finished() {
            for i in (0..BLOCKS).step_by(37) {
                lsn += 1;
                write(&mut q, i * 4096, &block(lsn, (i + lsn) as u8)).unwrap();
            }
        }
        r.join().unwrap()
    })
    .unwrap();
    assert_eq!(report.bytes, BLOCKS * 4096);
    assert_eq!(m.states(), vec![CopyState::Healthy; 2]);
    // One more round after the rebuild: both copies take it.
    for i in (0..BLOCKS).step_by(11) {
        write(&mut q, i * 4096, &block(10_000 + i, 7)).unwrap();
    }
    let len = (BLOCKS * 4096) as usize;
    let (a, b) = (on_disk(&d[0], 0, len), on_disk(&fresh, 0, len));
    for i in 0..BLOCKS as usize {
        let (x, y) = (&a[i * 4096..(i + 1) * 4096], &b[i * 4096..(i + 1) * 4096]);
        if x != y {
            let lsn = |z: &[u8]| u64::from_le_bytes(z[8..16].try_into().unwrap());
            eprintln!(
                "DIFF block {i}: healthy lsn {} fill {}, rebuilt lsn {} fill {}",
                lsn(x),
                x[20],
                lsn(y),
                y[20]
            );
        }
    }
    assert!(a == b, "copies differ after the rebuild");
    let l = read_label(&Target::Sim(fresh)).unwrap().unwrap();
    assert_eq!(l.states, vec![CopyState::Healthy; 2]);
}

#[test]
fn a_rebuild_stopped_records_its_progress_and_resumes() {
    const BLOCKS: u64 = 300;
    let d = disks(2, LABEL_BYTES + BLOCKS * 4096);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    for i in 0..BLOCKS {
        write(&mut q, i * 4096, &block(1, i as u8)).unwrap();
    }
    // Copy 1 recorded as rebuilding halfway (a rebuild cut short).
    m.set_state(1, CopyState::Rebuilding { done: 1 << 20 })
        .unwrap();
    let stop = AtomicBool::new(true);
    assert!(matches!(m.rebuild(1, &stop), Err(Error::Shutdown)));
    drop(q);
    let m = Mirror::open(Role::Data(0), 0, specs(&d), false).unwrap();
    assert_eq!(m.states()[1], CopyState::Rebuilding { done: 1 << 20 });
    let r = m.rebuild(1, &AtomicBool::new(false)).unwrap();
    assert_eq!(
        (r.resumed_from, r.bytes),
        (1 << 20, BLOCKS * 4096 - (1 << 20))
    );
    assert_eq!(m.states()[1], CopyState::Healthy);
}

/// A label whose rebuild progress lies past the healthy copies' size
/// (damaged or forged, with a valid checksum) restarts the rebuild at 0:
/// trusted, the rebuild ended at once and marked the copy healthy with
/// nothing copied (a review's finding).
#[test]
fn a_rebuild_progress_past_the_device_restarts_from_zero() {
    const BLOCKS: u64 = 64;
    let d = disks(2, LABEL_BYTES + BLOCKS * 4096);
    let m = mirror(&d);
    let mut q = m.queue(&Backend::Blocking, 8).unwrap();
    for i in 0..BLOCKS {
        write(&mut q, i * 4096, &block(1, i as u8)).unwrap();
    }
    m.set_state(1, CopyState::Rebuilding { done: 1 << 40 })
        .unwrap();
    drop(q);
    let m = Mirror::open(Role::Data(0), 0, specs(&d), false).unwrap();
    assert_eq!(m.states()[1], CopyState::Rebuilding { done: 0 });
    let r = m.rebuild(1, &AtomicBool::new(false)).unwrap();
    assert_eq!((r.resumed_from, r.bytes), (0, BLOCKS * 4096));
    assert_eq!(m.states()[1], CopyState::Healthy);
}

/// Copies of `BLOCKS` blocks, copy 1 rebuilding, copy 0 grown alone to
/// twice that (as a growth while copy 1 was failed leaves them).
const BLOCKS: u64 = 64;

fn copy_1_rebuilding_copy_0_grown() -> (Vec<Arc<SimDisk>>, Arc<Mirror>) {
    let d = disks(2, LABEL_BYTES + BLOCKS * 4096);
    for d in &d {
        d.set_space_limit(LABEL_BYTES + 4 * BLOCKS * 4096);
    }
    let m = mirror(&d);
    m.set_state(1, CopyState::Rebuilding { done: 0 }).unwrap();
    d[0].grow(LABEL_BYTES + 2 * BLOCKS * 4096).unwrap();
    (d, m)
}

/// A copy failed at open for holding an older moment (or being cut
/// short) says so in its own label: if every other copy then goes
/// missing, it does not open as the only copy (it did: its label still
/// named it healthy).
#[test]
fn a_stale_copy_failed_at_open_never_opens_alone() {
    let d = disks(2, 1 << 20);
    let m = mirror(&d);
    assert!(m.fail_stale_copy(1, "older than the database".into()));
    m.finish();
    drop(m);
    let alone = vec![
        CopySpec {
            target: None,
            path: None,
        },
        CopySpec::of(Target::Sim(d[1].clone())),
    ];
    let opened = Mirror::open(Role::Data(0), 0, alone, false);
    assert!(opened.is_err(), "the stale copy opened alone");
    // Both there: copy 0 serves, copy 1 stays failed.
    let m = Mirror::open(Role::Data(0), 0, specs(&d), false).unwrap();
    assert_eq!(m.states(), vec![CopyState::Healthy, CopyState::Failed]);
}

/// A copy rebuilt while the healthy ones grew (a growth between the
/// rebuild's preparation and its first range leaves the failed copy out)
/// is grown to their size and copied whole: rebuilt to the old size, the
/// device would have shrunk to it (a growing log then reads as cut short).
#[test]
fn a_rebuild_copies_what_the_healthy_copies_grew_to() {
    let (d, m) = copy_1_rebuilding_copy_0_grown();
    // Copy 0 holds a block in its new range.
    let t0 = Target::Sim(d[0].clone());
    let mut q0 = crate::io::open_queue(&t0, &Backend::Blocking, 1).unwrap();
    let mut b = AlignedBuf::new(BLOCK, 4096).unwrap();
    b.copy_from_slice(&block(3, 7));
    let at = LABEL_BYTES + (BLOCKS + 5) * 4096;
    sync_io(q0.as_mut(), Request::write(1, at, IoBuf::owned(b)))
        .unwrap()
        .result
        .unwrap();
    sync_io(q0.as_mut(), Request::flush(0))
        .unwrap()
        .result
        .unwrap();
    m.rebuild(1, &AtomicBool::new(false)).unwrap();
    assert_eq!(m.states()[1], CopyState::Healthy);
    assert_eq!(d[1].size(), d[0].size());
    assert_eq!(m.size(), 2 * BLOCKS * 4096);
    assert!(
        on_disk(&d[1], at - LABEL_BYTES, BLOCK) == block(3, 7),
        "the grown range"
    );
}

/// A copy left rebuilding shorter than the healthy ones (they grew while
/// it was failed, just before its rebuild began, and the process then
/// stopped) is grown to them at open, or failed by a read-only open:
/// counted as it was, it made the device that short.
#[test]
fn a_rebuilding_copy_shorter_than_the_healthy_ones_is_grown_at_open() {
    let (d, m) = copy_1_rebuilding_copy_0_grown();
    drop(m);
    let ro = Mirror::open(Role::Data(0), 0, specs(&d), true).unwrap();
    assert_eq!(ro.size(), 2 * BLOCKS * 4096);
    assert_eq!(ro.states()[1], CopyState::Failed);
    drop(ro);
    let m = Mirror::open(Role::Data(0), 0, specs(&d), false).unwrap();
    assert_eq!(m.size(), 2 * BLOCKS * 4096);
    assert!(matches!(m.states()[1], CopyState::Rebuilding { .. }));
    assert_eq!(d[1].size(), d[0].size());
}

/// A rebuild step whose label reaches no copy (the last healthy copy's
/// label write fails) fails every later write with the label error, as
/// the labeller does: before, the state in memory stayed a generation
/// ahead of the labels with no labeller running, and every write
/// completion was held for good (a review's finding).
#[test]
fn a_rebuild_step_whose_label_fails_everywhere_fails_writes_instead_of_holding_them() {
    let (d, m, mut q) = with_copy_1_failed();
    assert_eq!(m.states()[1], CopyState::Failed);
    d[1].clear_faults();
    // The rebuild's first label (copy 1 rebuilding) fails on copy 0.
    d[0].inject(Fault::range(Some(crate::OpKind::Write), 0..LABEL_BYTES));
    assert!(m.rebuild(1, &AtomicBool::new(false)).is_err());
    // A write now completes (with the error), never waits for good.
    let mut b = AlignedBuf::new(BLOCK, 4096).unwrap();
    b.copy_from_slice(&block(3, 3));
    q.push(Request::write(7, 8192, IoBuf::owned(b)))
        .map_err(|r| r.error)
        .unwrap();
    q.submit().unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while out.is_empty() && std::time::Instant::now() < deadline {
        q.wait(1, Some(std::time::Duration::from_millis(50)))
            .unwrap();
        q.reap(&mut out);
    }
    let c = out.pop().expect("the write was held for good");
    assert!(c.result.is_err(), "a write with no label to record it");
}

/// A write preempted after it read which copies to write, while a
/// rebuild of the other copy begins and copies the write's range from the
/// healthy copy: the write must land on both, or the rebuild must wait
/// for it. The write registered with the rebuild's fence only after
/// reading the copies' states (until 2026-11-29): the rebuild, not
/// waiting for it, copied the old bytes and marked the copy healthy, and
/// the write, which saw that copy failed, went to the healthy copy alone:
/// acknowledged, missing from a copy called healthy. It failed once in a
/// full run of the tests under load
/// (`a_rebuild_under_concurrent_writes_ends_with_identical_copies`; a
/// helper found the interleaving). The preemption is made to order here
/// (`Mirror::dispatch_pause`).
#[test]
fn a_write_preempted_as_a_rebuild_begins_reaches_the_rebuilt_copy() {
    const BLOCKS: u64 = 64;
    let (d, m, mut q, fresh) = with_a_blank_copy(BLOCKS);
    let rebuild = Arc::new(std::sync::Mutex::new(None));
    let (m2, slot) = (m.clone(), rebuild.clone());
    *m.dispatch_pause.lock().unwrap() = Some(Box::new(move || {
        let r = std::thread::spawn(move || m2.rebuild(1, &AtomicBool::new(false)));
        // Until the rebuild ends, or for a second if it waits for this
        // write.
        for _ in 0..100 {
            if r.is_finished() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        *slot.lock().unwrap() = Some(r);
    }));
    write(&mut q, 5 * 4096, &block(50, 0xAB)).unwrap();
    let rebuilding = rebuild.lock().unwrap().take();
    let report = rebuilding
        .expect("the write ran the pause")
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(report.bytes, BLOCKS * 4096);
    assert_eq!(m.states(), vec![CopyState::Healthy; 2]);
    let at = 5 * BLOCK;
    assert!(on_disk(&d[0], at as u64, BLOCK) == block(50, 0xAB));
    assert!(
        on_disk(&fresh, at as u64, BLOCK) == block(50, 0xAB),
        "the rebuilt copy lacks the acknowledged write"
    );
}
