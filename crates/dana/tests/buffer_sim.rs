//! The buffer manager on the simulated device: random latencies, a
//! deterministic schedule, injected read and write errors, and a power cut
//! after a flush.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dana::buffer::{BufferPool, PoolConfig, PAGE_HEADER_SIZE};
use dana::io::{Array, Backend, Fault, Latency, PowerCutPolicy, SimConfig, SimDisk, Target};
use dana::sched::{Runtime, RuntimeConfig};
use dana::{Error, OpKind};

use crate::common;
use common::{counter, fill};

fn start(disk: &Arc<SimDisk>, frames: usize) -> (Arc<BufferPool>, Runtime) {
    start_with(disk, frames, 2)
}

fn start_with(disk: &Arc<SimDisk>, frames: usize, workers: usize) -> (Arc<BufferPool>, Runtime) {
    let array = Array::new(vec![Target::Sim(disk.clone())], 4096).unwrap();
    let pool = BufferPool::new(array.clone(), &PoolConfig::with_frames(frames)).unwrap();
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
        None,
    )
    .unwrap();
    (pool, rt)
}

/// Many tasks increment random pages' counters; returns the increments.
fn hammer(
    pool: &Arc<BufferPool>,
    rt: &Runtime,
    pids: &Arc<Vec<u64>>,
    tasks: u64,
) -> Arc<Vec<AtomicU64>> {
    let expected: Arc<Vec<AtomicU64>> =
        Arc::new((0..pids.len() + 2).map(|_| AtomicU64::new(0)).collect());
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..tasks {
        let (pool, pids, expected, tx) = (pool.clone(), pids.clone(), expected.clone(), tx.clone());
        rt.spawn(async move {
            let mut x = 0x2545_F491_4F6C_DD1Du64.wrapping_mul(t + 1);
            let r: Result<(), Error> = async {
                for _ in 0..30 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x % pids.len() as u64) as usize;
                    let pid = pids[i];
                    let mut g = pool.fix_exclusive(pid).await?;
                    let (id, n) = counter(&g);
                    assert_eq!(id, pid);
                    let at = PAGE_HEADER_SIZE + 8;
                    g[at..at + 8].copy_from_slice(&(n + 1).to_le_bytes());
                    expected[i].fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
            .await;
            tx.send(r).unwrap();
        })
        .unwrap();
    }
    drop(tx);
    let mut n = 0;
    for r in rx {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, tasks, "every task finished");
    expected
}

fn verify(
    pool: &Arc<BufferPool>,
    rt: &Runtime,
    pids: &Arc<Vec<u64>>,
    expected: &Arc<Vec<AtomicU64>>,
) {
    let (p, pids, expected) = (pool.clone(), pids.clone(), expected.clone());
    rt.block_on(async move {
        for (i, &pid) in pids.iter().enumerate() {
            let g = p.fix_shared(pid).await?;
            assert_eq!(
                counter(&g),
                (pid, expected[i].load(Ordering::SeqCst)),
                "page {pid}"
            );
        }
        Ok::<_, Error>(())
    })
    .unwrap()
    .unwrap();
}

#[test]
fn random_latencies_tiny_pool_many_tasks() {
    let cfg = SimConfig {
        latency: Latency::Uniform {
            min: Duration::from_micros(10),
            max: Duration::from_micros(400),
        },
        seed: 11,
        ..Default::default()
    };
    let disk = SimDisk::new(0, 4096 * 4096, cfg);
    let (pool, rt) = start(&disk, 40);
    let pids = Arc::new(fill(&pool, &rt, 3000));
    let expected = hammer(&pool, &rt, &pids, 200);
    let s = pool.stats();
    assert!(s.evictions > 1000 && s.writebacks > 100, "{s:?}");
    let p = pool.clone();
    rt.block_on(async move { p.flush_all().await })
        .unwrap()
        .unwrap();
    rt.shutdown();
    drop(pool);
    // Reopen on the same disk with a new pool.
    let (pool, rt) = start(&disk, 24);
    let p = pool.clone();
    rt.block_on(async move { p.open_meta().await })
        .unwrap()
        .unwrap();
    verify(&pool, &rt, &pids, &expected);
}

/// One worker, a deterministic clock, the tasks spawned in a fixed order
/// from one task: the disk's trace hash after the run.
fn seeded_run(seed: u64) -> u64 {
    let cfg = SimConfig::replayable(seed);
    let disk = SimDisk::new(0, 1024 * 4096, cfg);
    let (pool, rt) = start_with(&disk, 16, 1);
    let pids = Arc::new(fill(&pool, &rt, 500));
    // One task drives all 50 walkers, polled in a fixed order: the
    // interleaving depends on the I/O schedule only.
    let (pool2, pids2) = (pool.clone(), pids.clone());
    let done = rt
        .block_on(async move {
            type Walker =
                std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>;
            let mut walkers: Vec<Option<Walker>> = (0..50u64)
                .map(|t| {
                    let (pool, pids) = (pool2.clone(), pids2.clone());
                    let w: Walker = Box::pin(async move {
                        let mut x = seed.wrapping_add(t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D);
                        for _ in 0..30 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let pid = pids[(x % pids.len() as u64) as usize];
                            let mut g = pool.fix_exclusive(pid).await?;
                            let (_, n) = counter(&g);
                            let at = PAGE_HEADER_SIZE + 8;
                            g[at..at + 8].copy_from_slice(&(n + 1).to_le_bytes());
                        }
                        Ok(())
                    });
                    Some(w)
                })
                .collect();
            let mut ok = 0;
            std::future::poll_fn(|cx| {
                for w in walkers.iter_mut() {
                    if let Some(f) = w {
                        if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                            r?;
                            ok += 1;
                            *w = None;
                        }
                    }
                }
                if walkers.iter().all(Option::is_none) {
                    std::task::Poll::Ready(Ok::<_, Error>(ok))
                } else {
                    std::task::Poll::Pending
                }
            })
            .await
        })
        .unwrap()
        .unwrap();
    assert_eq!(done, 50);
    let p = pool.clone();
    rt.block_on(async move { p.flush_all().await })
        .unwrap()
        .unwrap();
    rt.shutdown();
    disk.trace_hash()
}

#[test]
fn a_seeded_schedule_replays_exactly() {
    let a = seeded_run(5);
    assert_eq!(a, seeded_run(5), "the same seed gave another trace");
    assert_ne!(a, seeded_run(6), "the trace does not depend on the seed");
}

#[test]
fn read_errors_reach_the_task_and_the_engine_stays_usable() {
    let disk = SimDisk::new(0, 512 * 4096, SimConfig::default());
    let (pool, rt) = start(&disk, 16);
    fill(&pool, &rt, 300);
    rt.shutdown();
    drop(pool);

    let (pool, rt) = start(&disk, 16);
    let p = pool.clone();
    rt.block_on(async move { p.open_meta().await })
        .unwrap()
        .unwrap();
    let bad = 123u64;
    disk.inject(Fault::range(Some(OpKind::Read), bad * 4096..bad * 4096 + 4096).sticky());
    let p = pool.clone();
    let r = rt
        .block_on(async move { p.fix_shared(bad).await.map(|_| ()) })
        .unwrap();
    match r {
        Err(Error::Io {
            op: OpKind::Read,
            device: 0,
            offset,
            ..
        }) => assert_eq!(offset, bad * 4096),
        other => panic!("expected the read error of page {bad}, got {other:?}"),
    }
    // Other pages read fine, and the page reads once the fault is gone.
    let p = pool.clone();
    let ok = rt
        .block_on(async move { p.fix_shared(124).await.map(|g| counter(&g).0) })
        .unwrap()
        .unwrap();
    assert_eq!(ok, 124);
    disk.clear_faults();
    let p = pool.clone();
    let ok = rt
        .block_on(async move { p.fix_shared(bad).await.map(|g| counter(&g).0) })
        .unwrap()
        .unwrap();
    assert_eq!(ok, bad);

    // Corrupted data is caught by the checksum.
    disk.inject(Fault::range(Some(OpKind::Read), 200 * 4096..201 * 4096).corrupt_read());
    let p = pool.clone();
    let r = rt
        .block_on(async move { p.fix_shared(200).await.map(|_| ()) })
        .unwrap();
    assert!(matches!(r, Err(Error::Corrupt { page: 200, .. })), "{r:?}");
}

#[test]
fn a_failed_write_poisons_the_pool() {
    let disk = SimDisk::new(0, 256 * 4096, SimConfig::default());
    let (pool, rt) = start(&disk, 16);
    fill(&pool, &rt, 100);
    disk.inject(Fault::nth(Some(OpKind::Write), 0).sticky());
    let p = pool.clone();
    let r = rt
        .block_on(async move {
            let mut g = p.fix_exclusive(50).await?;
            g[100] = 1;
            drop(g);
            p.flush_all().await
        })
        .unwrap();
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
    assert!(pool.poisoned().is_some());
    disk.clear_faults();
    // Never silently retried: the pool stays poisoned.
    let p = pool.clone();
    let r = rt.block_on(async move { p.flush_all().await }).unwrap();
    assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
}

#[test]
fn a_power_cut_keeps_what_was_flushed() {
    let disk = SimDisk::new(0, 256 * 4096, SimConfig::default());
    let (pool, rt) = start(&disk, 200);
    let pids = Arc::new(fill(&pool, &rt, 100));
    let expected = hammer(&pool, &rt, &pids, 20);
    let p = pool.clone();
    rt.block_on(async move { p.flush_all().await })
        .unwrap()
        .unwrap();
    // More changes, written back by eviction pressure or not, never
    // flushed: a power cut may drop them all.
    let _lost = hammer(&pool, &rt, &pids, 20);
    disk.power_cut(PowerCutPolicy::DropAll, 1);
    rt.shutdown();
    drop(pool);
    disk.power_on();
    let (pool, rt) = start(&disk, 200);
    let p = pool.clone();
    rt.block_on(async move { p.open_meta().await })
        .unwrap()
        .unwrap();
    verify(&pool, &rt, &pids, &expected);
}
