//! The buffer manager under a tiny pool: pages many times the frames,
//! many concurrent tasks on 2 workers, eviction, write-back, reopen,
//! corruption detection.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dana::buffer::{BufferPool, PageType, PoolConfig, PAGE_HEADER_SIZE};
use dana::io::device::DeviceOptions;
use dana::io::{Array, Backend, Device, Target};
use dana::sched::{Runtime, RuntimeConfig};
use dana::{Error, EvictionPolicy};

use crate::common;
use common::{counter, fill};

const PAGE: u64 = 4096;

fn open_array(dir: &Path, devices: usize, pages_per_device: u64) -> Array {
    let targets = (0..devices)
        .map(|i| {
            let opts = DeviceOptions {
                create_size: Some(pages_per_device * PAGE),
                ..Default::default()
            };
            let dev = Device::open(dir.join(format!("dev{i}")), i, opts).unwrap();
            Target::File(Arc::new(dev))
        })
        .collect();
    Array::new(targets, PAGE).unwrap()
}

fn start(array: Array, frames: usize, workers: usize) -> (Arc<BufferPool>, Runtime) {
    start_with(array, frames, workers, EvictionPolicy::default())
}

fn start_with(
    array: Array,
    frames: usize,
    workers: usize,
    eviction: EvictionPolicy,
) -> (Arc<BufferPool>, Runtime) {
    let mut config = PoolConfig::with_frames(frames);
    config.eviction = eviction;
    let pool = BufferPool::new(array.clone(), &config).unwrap();
    let config = RuntimeConfig {
        workers,
        queue_depth: 64,
        device_budget: 32,
        ..Default::default()
    };
    let rt = Runtime::start(
        &config,
        array.targets(),
        &Backend::default(),
        pool.services(),
        Some(pool.memory()),
    )
    .unwrap();
    (pool, rt)
}

/// Eviction's write-backs in flight follow the devices' in-flight
/// limits (half of them), not only the pool's configured floor: a floor
/// of 2 under a fixed budget of 64 per device lets more than 2 be in
/// flight while a tiny pool is filled with dirty pages.
#[test]
fn eviction_write_backs_follow_the_device_budget() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 2, 3000);
    let mut config = PoolConfig::with_frames(64);
    config.max_writes_in_flight = 2;
    let pool = BufferPool::new(array.clone(), &config).unwrap();
    let rt = Runtime::start(
        &RuntimeConfig {
            workers: 1,
            queue_depth: 128,
            device_budget: 64,
            adaptive_budget: false,
            ..Default::default()
        },
        array.targets(),
        &Backend::default(),
        pool.services(),
        Some(pool.memory()),
    )
    .unwrap();
    let pids = fill(&pool, &rt, 2999);
    assert_eq!(pids.len(), 2999);
    let stats = pool.stats();
    assert!(stats.writebacks > 1000, "{stats:?}");
    assert!(
        stats.eviction_writes_in_flight_max > 2,
        "eviction kept at most {} writes in flight: the floor, not the budget",
        stats.eviction_writes_in_flight_max
    );
    assert!(stats.eviction_writes_in_flight_max <= 64, "{stats:?}");
    rt.shutdown();
}

#[test]
fn many_tasks_update_pages_through_a_tiny_pool_watt() {
    update_through_a_tiny_pool(EvictionPolicy::Watt);
}

#[test]
fn many_tasks_update_pages_through_a_tiny_pool_clock() {
    update_through_a_tiny_pool(EvictionPolicy::Clock);
}

fn update_through_a_tiny_pool(eviction: EvictionPolicy) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pages = 2000;
    let array = open_array(dir.path(), 2, pages);
    let (pool, rt) = start_with(array.clone(), 48, 2, eviction);
    let pids = Arc::new(fill(&pool, &rt, pages - 1));
    let expected: Arc<Vec<AtomicU64>> = Arc::new((0..=pages).map(|_| AtomicU64::new(0)).collect());

    let tasks = 300;
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..tasks {
        let (pool, pids, expected, tx) = (pool.clone(), pids.clone(), expected.clone(), tx.clone());
        rt.spawn(async move {
            let mut x = 0x9E37_79B9u64.wrapping_mul(t + 1);
            let res: Result<(), Error> = async {
                for _ in 0..40 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let pid = pids[(x % pids.len() as u64) as usize];
                    if x % 3 == 0 {
                        let g = pool.fix_shared(pid).await?;
                        let (id, n) = counter(&g);
                        assert_eq!(id, pid, "page {pid} holds another page's data");
                        // Increments are counted after they are written, so
                        // the page may be ahead of the count, never behind.
                        assert!(n >= expected[pid as usize].load(Ordering::SeqCst));
                    } else {
                        let mut g = pool.fix_exclusive(pid).await?;
                        let (id, n) = counter(&g);
                        assert_eq!(id, pid);
                        let at = PAGE_HEADER_SIZE + 8;
                        g[at..at + 8].copy_from_slice(&(n + 1).to_le_bytes());
                        expected[pid as usize].fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(())
            }
            .await;
            tx.send(res).unwrap();
        })
        .unwrap();
    }
    drop(tx);
    for r in rx.iter() {
        r.unwrap();
    }
    assert_eq!(rt.worker_stats(0).panics.load(Ordering::Relaxed), 0);
    assert_eq!(rt.worker_stats(1).panics.load(Ordering::Relaxed), 0);
    let stats = pool.stats();
    assert!(stats.evictions > 1000, "a tiny pool must evict: {stats:?}");
    assert!(
        stats.writebacks > 100,
        "dirty pages are written back: {stats:?}"
    );
    assert_eq!(stats.read_errors + stats.write_errors, 0);

    let p = pool.clone();
    rt.block_on(async move { p.flush_all().await })
        .unwrap()
        .unwrap();
    rt.shutdown();
    drop(pool);

    // Reopen with a fresh pool: every increment survived.
    let (pool, rt) = start(array, 32, 2);
    let p = pool.clone();
    let (pids2, exp2) = (pids.clone(), expected.clone());
    rt.block_on(async move {
        p.open_meta().await?;
        for &pid in pids2.iter() {
            let g = p.fix_shared(pid).await?;
            let (id, n) = counter(&g);
            assert_eq!(id, pid);
            assert_eq!(n, exp2[pid as usize].load(Ordering::SeqCst), "page {pid}");
        }
        Ok::<_, Error>(())
    })
    .unwrap()
    .unwrap();
}

/// WATT keeps a page fixed on every step (an inner node) resident while
/// every other page it meets is dirty and cold: a first version evicted
/// the coldest *clean* page of each sample, which in a mostly dirty pool
/// was the hot one.
#[test]
fn watt_keeps_a_hot_clean_page_among_dirty_cold_ones() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pages = 1200;
    let array = open_array(dir.path(), 1, pages);
    let (pool, rt) = start_with(array, 64, 1, EvictionPolicy::Watt);
    let pids = fill(&pool, &rt, pages - 1);
    let p = pool.clone();
    let rounds = 3000;
    let before = pool.stats();
    rt.block_on(async move {
        let hot = pids[0];
        for i in 0..rounds {
            let g = p.fix_shared(hot).await?;
            assert_eq!(counter(&g).0, hot);
            drop(g);
            let cold = pids[1 + i % (pids.len() - 1)];
            let mut g = p.fix_exclusive(cold).await?;
            let (id, n) = counter(&g);
            assert_eq!(id, cold);
            let at = PAGE_HEADER_SIZE + 8;
            g[at..at + 8].copy_from_slice(&(n + 1).to_le_bytes());
        }
        Ok::<_, Error>(())
    })
    .unwrap()
    .unwrap();
    let s = pool.stats();
    let misses = s.misses - before.misses;
    // Every cold fix misses (1,199 pages cycle through 64 frames); the hot
    // page may miss a few times (eviction samples frames: CI once saw 3
    // in 3,000 rounds), not on a large share of the evictions as the
    // first version made it.
    assert!(
        misses <= rounds as u64 + rounds as u64 / 100,
        "{misses} misses for {rounds} cold fixes: the hot page was evicted"
    );
    assert!(
        s.writebacks > 1000,
        "cold dirty pages are written back: {s:?}"
    );
    rt.shutdown();
}

#[test]
fn a_page_faulted_by_100_tasks_is_read_once() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 1, 256);
    let (pool, rt) = start(array.clone(), 64, 2);
    fill(&pool, &rt, 200);
    rt.shutdown();
    drop(pool);

    let (pool, rt) = start(array, 64, 2);
    let p = pool.clone();
    rt.block_on(async move { p.open_meta().await })
        .unwrap()
        .unwrap();
    let before = pool.stats().reads;
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..100 {
        let (p, tx) = (pool.clone(), tx.clone());
        rt.spawn(async move {
            let r = p.fix_shared(150).await.map(|g| counter(&g).0);
            tx.send(r).unwrap();
        })
        .unwrap();
    }
    drop(tx);
    for r in rx.iter() {
        assert_eq!(r.unwrap(), 150);
    }
    assert_eq!(pool.stats().reads - before, 1, "one read for 100 faults");
}

#[test]
fn a_corrupted_page_is_reported_with_its_id() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 1, 128);
    let (pool, rt) = start(array.clone(), 16, 1);
    fill(&pool, &rt, 100);
    rt.shutdown();
    drop(pool);

    // Flip one byte of page 77 on disk.
    let (_, offset) = array.locate(77);
    let path = dir.path().join("dev0");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset as usize + 1000] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let (pool, rt) = start(array, 16, 1);
    let p = pool.clone();
    let res = rt
        .block_on(async move {
            p.open_meta().await?;
            p.fix_shared(76).await.map(|_| ())?;
            p.fix_shared(77).await.map(|_| ())
        })
        .unwrap();
    match res {
        // The message says where the page was read from.
        Err(Error::Corrupt { page: 77, what })
            if what.contains(&format!("{} at byte {offset}", path.display())) => {}
        other => panic!("expected corruption of page 77, got {other:?}"),
    }
    // The engine stays usable after the error.
    let p = pool.clone();
    rt.block_on(async move { p.fix_shared(78).await.map(|g| counter(&g).0) })
        .unwrap()
        .map(|id| assert_eq!(id, 78))
        .unwrap();
}

#[test]
fn freed_pages_are_reused_and_survive_reopen() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 1, 64);
    let (pool, rt) = start(array.clone(), 8, 1);
    fill(&pool, &rt, 10);
    let p = pool.clone();
    let freed = rt
        .block_on(async move {
            for pid in [3u64, 5, 7] {
                let g = p.fix_exclusive(pid).await?;
                p.free_page(g).await?;
            }
            let again = p.allocate(PageType::Raw).await?.pid();
            p.set_root(0, 42).await?;
            p.flush_all().await?;
            Ok::<_, Error>(again)
        })
        .unwrap()
        .unwrap();
    assert_eq!(freed, 3, "the lowest free page is reused first");
    rt.shutdown();
    drop(pool);

    let (pool, rt) = start(array, 8, 1);
    let p = pool.clone();
    let (space, list, root) = rt
        .block_on(async move {
            let s = p.open_meta().await?;
            let mut free = Vec::new();
            for (_, bits) in p.space_map(s.next_unused).await {
                let bits = bits?;
                free.extend((0..bits.len() as u64).filter(|&q| !bits[q as usize]));
            }
            Ok::<_, Error>((s, free, p.root(0).await?))
        })
        .unwrap()
        .unwrap();
    assert_eq!(list, vec![5, 7]);
    assert_eq!(space.free_pages, 2);
    assert_eq!(space.next_unused, 12, "page 0 the meta page, 1 the map");
    assert_eq!(root, 42);
}

#[test]
fn faults_outside_a_worker_say_so() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 1, 16);
    let pool = BufferPool::new(array, &PoolConfig::with_frames(8)).unwrap();
    // A future polled on a plain thread cannot do I/O.
    let fut = pool.fix_shared(3);
    let r = futures_lite_block_on(fut);
    assert!(matches!(r, Err(Error::WouldBlock)));
}

/// Polls a future to completion on this thread (no runtime).
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// A page's stamp holds while only readers come; a writer, or an eviction
/// and reload, changes it (what a serializable commit relies on to skip
/// re-reading a leaf).
#[test]
fn a_stamp_holds_until_a_writer_or_an_eviction() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pages = 400;
    let array = open_array(dir.path(), 1, pages);
    let (pool, rt) = start(array, 32, 1);
    let pids = fill(&pool, &rt, pages - 1);
    let p = pool.clone();
    rt.block_on(async move {
        let pid = pids[0];
        let stamp = p.fix_shared(pid).await?.stamp();
        assert!(p.unchanged(stamp));
        // Readers, shared and optimistic, leave it.
        let a = p.fix_shared(pid).await?;
        let b = p.fix_shared(pid).await?;
        assert_eq!(a.stamp(), stamp);
        assert!(p.unchanged(stamp), "readers hold the page");
        drop((a, b));
        let o = p.fix_optimistic(pid).await?;
        assert!(o.validate());
        assert!(p.unchanged(stamp));
        // A writer changes it, even while it still holds the latch.
        let mut g = p.fix_exclusive(pid).await?;
        assert!(!p.unchanged(stamp), "a writer holds the page");
        let at = PAGE_HEADER_SIZE + 8;
        g[at] ^= 1;
        drop(g);
        assert!(!p.unchanged(stamp));
        let stamp = p.fix_shared(pid).await?.stamp();
        assert!(p.unchanged(stamp));
        // Eviction (the pool has 32 frames; read every other page) and
        // reload change it too, though the bytes are the same.
        for &other in &pids[1..] {
            drop(p.fix_shared(other).await?);
        }
        let again = p.fix_shared(pid).await?;
        assert_eq!(counter(&again).0, pid);
        assert_ne!(again.stamp(), stamp, "evicted and reloaded");
        assert!(!p.unchanged(stamp));
        Ok::<_, Error>(())
    })
    .unwrap()
    .unwrap();
}

/// A flush (a checkpoint's) waits for a clean page's exclusive latch
/// rather than take the page for done: its writer may have logged a
/// change it has not marked dirty yet (a page turns dirty only once its
/// change is logged, under the latch), and a checkpoint that skipped it
/// moved its redo point past the change (a review's finding). Here the
/// flush starts while a writer holds the clean page; it must not end
/// before the writer lets go, and must then write the change.
#[test]
fn a_flush_waits_for_a_clean_page_latched_by_a_writer() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let pages = 64;
    let array = open_array(dir.path(), 1, pages);
    let (pool, rt) = start(array, 32, 1);
    let pids = fill(&pool, &rt, 8);
    let pid = pids[3];
    let p = pool.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    let (flushed_early, yields) = rt
        .block_on(async move {
            let mut g = p.fix_exclusive(pid).await?;
            let (flusher, flag) = (p.clone(), d.clone());
            dana::sched::spawn_here(async move {
                flusher.flush_all().await.unwrap();
                flag.store(true, Ordering::SeqCst);
            })?;
            // Give the flush every chance to run to its end.
            for _ in 0..2_000 {
                dana::sched::yield_now().await;
            }
            let early = d.load(Ordering::SeqCst);
            let at = PAGE_HEADER_SIZE + 8;
            g[at..at + 8].copy_from_slice(&77u64.to_le_bytes());
            drop(g);
            let mut yields = 0u32;
            while !d.load(Ordering::SeqCst) && yields < 1_000_000 {
                dana::sched::yield_now().await;
                yields += 1;
            }
            Ok::<_, Error>((early, yields))
        })
        .unwrap()
        .unwrap();
    assert!(
        !flushed_early,
        "the flush ended while a writer held the page"
    );
    assert!(
        done.load(Ordering::SeqCst),
        "the flush never ended ({yields} yields)"
    );
    let file = std::fs::read(dir.path().join("dev0")).unwrap();
    let on_disk = &file[(pid * PAGE) as usize..((pid + 1) * PAGE) as usize];
    assert_eq!(counter(on_disk), (pid, 77));
    rt.shutdown();
}

/// Page ids past the page table (a damaged pointer, a caller's bad id)
/// are errors on every path that takes one, never an index out of range:
/// an optimistic fix, a stamp's check, a tree opened at such a root.
#[test]
fn page_ids_past_the_table_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, rt) = start(open_array(dir.path(), 1, 64), 16, 1);
    for pid in [64, 1 << 40, u64::MAX] {
        let p = pool.clone();
        let r = rt
            .block_on(async move { p.fix_optimistic(pid).await.map(|_| ()) })
            .unwrap();
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{pid}: {r:?}");
        assert!(!pool.unchanged(dana::buffer::PageStamp { pid, version: 0 }));
        let tree = dana::btree::BTree::open(&pool, pid);
        let r = rt.block_on(async move { tree.get(b"k").await }).unwrap();
        assert!(r.is_err(), "{pid}: {r:?}");
    }
}

/// WATT frees a frame even when the least valuable pages of its sample
/// are latched: it tried only those, freed nothing, and in a pool whose
/// every sample is the same frames it chose them again at every step, so
/// the task waiting for a frame hung for good (one committer on a 9-frame
/// pool, whose split held the cold pages). Four cold pages stay latched,
/// four hot ones do not; a ninth page must still come in.
#[test]
fn watt_frees_a_frame_when_its_coldest_pages_are_latched() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let array = open_array(dir.path(), 1, 64);
    let (pool, rt) = start_with(array, 8, 1, EvictionPolicy::Watt);
    let pids = fill(&pool, &rt, 16);
    let p = pool.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = rt.block_on(async move {
            // Empty the pool of the fill's pages: sixteen pages through
            // eight frames, the hot ones last and read often.
            for &pid in &pids[8..12] {
                drop(p.fix_shared(pid).await?);
            }
            for &pid in &pids[..4] {
                for _ in 0..12 {
                    drop(p.fix_shared(pid).await?);
                }
            }
            let mut cold = Vec::new();
            for &pid in &pids[4..8] {
                cold.push(p.fix_shared(pid).await?);
            }
            // Every frame is taken: the hot four unlatched, the cold four
            // latched here.
            let ninth = p.fix_shared(pids[12]).await?;
            Ok::<_, Error>(counter(&ninth).0 == pids[12] && cold.len() == 4)
        });
        let _ = tx.send(r);
    });
    let loaded = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the ninth page never got a frame");
    assert!(loaded.unwrap().unwrap());
}
