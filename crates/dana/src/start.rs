//! Bringing up a database whose files are open: the open's log
//! decisions (`recovery.rs`), the buffer pool, the log, the workers with
//! their completion handlers and system tasks, recovery's re-application
//! or the format of a new database, the open's checkpoint, and the
//! completion of an interrupted create or drop.
//!
//! Owns: the order of those steps. `db.rs` wraps what this returns in a
//! `Db`; `open.rs` found and locked the files before.
//!
//! Never: lets a background checkpoint run before the open's own
//! checkpoint is done, or hands out a database whose catalogue root is
//! missing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::btree::BTree;
use crate::buffer::alloc::META_LOG_ENDS;
use crate::buffer::{BufferPool, PoolConfig};
use crate::catalog::{self, CATALOG_SLOT};
use crate::checkpoint::{checkpoint, Checkpointer};
use crate::io::grower::SpaceReserve;
use crate::io::mirror::{CopyState, Mirror, RebuildReport};
use crate::io::remap::Collector;
use crate::io::{Array, Target};
use crate::open::{self, Locks};
use crate::recovery::{self, reapply, RecoveryReport};
use crate::sched::{RequestKind, Runtime};
use crate::txn::{Committer, KeyLocks};
use crate::validate::InFlight;
use crate::wal::record::Write;
use crate::wal::{CheckpointScope, Durability, FlushPolicy, LogSet, Resume, Wal, MAX_LOGS};
use crate::{Error, Options, Result};

/// A database brought up: what `Db` holds.
pub(crate) struct Started {
    pub(crate) pool: Arc<BufferPool>,
    pub(crate) rt: Runtime,
    pub(crate) catalog_root: u64,
    pub(crate) committer: Arc<Committer>,
    /// Set at close: no checkpoint starts after it.
    pub(crate) stop: Arc<AtomicBool>,
    /// Held while a checkpoint runs.
    pub(crate) checkpointing: Arc<AtomicBool>,
    pub(crate) recovery: Option<RecoveryReport>,
    pub(crate) locks: Locks,
    pub(crate) rebuilds: Rebuilds,
    pub(crate) collectors: Collectors,
}

/// Brings up an opened set of files: recovery (or format), the pool,
/// the workers, the open checkpoint and the checkpoint task.
pub(crate) fn start(opened: open::Opened, opts: Options) -> Result<Started> {
    let open::Opened {
        array,
        logs,
        create,
        meta,
        locks,
        sync_dirs,
        creating,
    } = opened;
    let read_only = opts.read_only;
    if create && read_only {
        return Err(Error::ReadOnly);
    }
    if logs.len() > MAX_LOGS {
        return Err(Error::InvalidArgument(format!(
            "{} logs: at most {MAX_LOGS}",
            logs.len()
        )));
    }
    let array = array.with_max_bytes(opts.capacity_bytes);
    let recovery::Prepared {
        start,
        mut recovered,
        new_id,
        read_only_end,
    } = recovery::prepare_logs(
        &array,
        &logs,
        meta.map_or(0, |m| m.log_id),
        meta.map_or(0, |m| m.checkpoint_stamp),
        &meta.map_or([0; META_LOG_ENDS], |m| m.log_ends),
        create,
        &opts,
    )?;
    if create {
        // Every check of the creation passed (a refused one leaves the
        // devices as they were): what they held goes now.
        open::erase_for_create(&array)?;
    }
    let frames = opts.pool_bytes / opts.page_size;
    let mut pool_config = PoolConfig::with_frames(frames);
    pool_config.read_only = read_only;
    pool_config.lsn_end = read_only_end;
    // Every data device writes a page untorn (RWF_ATOMIC): write-backs ask
    // for it, and the log logs no torn-page images (as out of place).
    let untorn = opts.untorn_page_writes
        && array
            .targets()
            .iter()
            .all(|t| t.untorn_writes(opts.page_size as u64));
    pool_config.untorn_writes = untorn;
    pool_config.eviction = opts.eviction;
    pool_config.record_cache_bytes = opts.record_cache_bytes;
    pool_config.max_writes_in_flight = (opts.device_budget / 2).max(1);
    let pool = BufferPool::new(array.clone(), &pool_config)?;
    let mut targets = array.targets().to_vec();
    let log_count = logs.len();
    let wal = match start {
        Some(start) => {
            // Out of place, or with untorn writes, a write-back never
            // tears a page: no full images (FORMAT.md, "What is logged").
            let pages_whole = untorn
                || array
                    .targets()
                    .iter()
                    .all(|t| matches!(t, crate::io::Target::Remap(_)));
            let shared = LogSet::shared(
                log_count,
                start.next_gsn,
                opts.checkpoint_shards,
                pages_whole,
            );
            shared.compress_images.store(
                opts.compress_log_images,
                std::sync::atomic::Ordering::Relaxed,
            );
            reserve_for_logs(&pool, &array, &logs, &start.resume);
            let mut set = Vec::with_capacity(log_count);
            for (i, (t, resume)) in logs.iter().zip(start.resume).enumerate() {
                targets.push(t.clone());
                // The log's own block, as its control block says: the
                // records on it are padded to that.
                let block = resume.control.block;
                if block < t.alignment().io {
                    return Err(Error::Log(format!(
                        "log {i} pads its flushes to {block} bytes; its device needs {}-byte \
                         alignment",
                        t.alignment().io
                    )));
                }
                let flush = FlushPolicy {
                    block,
                    window: opts.async_window,
                    write_through_max: opts.log_write_through_max,
                    max_in_flight: opts.log_flushes_in_flight,
                };
                set.push(Wal::new(
                    i,
                    shared.clone(),
                    array.width() + i,
                    flush,
                    resume,
                    Some(t.clone()),
                )?);
            }
            let w = LogSet::new(set, shared, opts.workers)?;
            pool.attach_wal(w.clone())?;
            Some(w)
        }
        None => None,
    };
    // Completions go to their owners; every worker steps eviction, the
    // log's flush and the checkpoint starter between tasks.
    // Held by the open (recovery runs its own checkpoints) until it is
    // done: no background checkpoint runs beside them.
    let checkpointing = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let mut services = pool.services();
    if let Some(w) = &wal {
        services = services
            .handle(RequestKind::Log, w.clone())
            .system_task(w.clone())
            .system_task(Arc::new(Checkpointer {
                pool: pool.clone(),
                wal: w.clone(),
                busy: checkpointing.clone(),
                stop: stop.clone(),
                next_shard: Default::default(),
            }));
    }
    let rt = Runtime::start(
        &opts.runtime_config(),
        &targets,
        &opts.backend,
        services,
        Some(pool.memory()),
    )?;
    let p = pool.clone();
    let commits: Vec<(u64, Vec<Write<'static>>)> = recovered
        .as_mut()
        .map(|r| std::mem::take(&mut r.commits))
        .unwrap_or_default();
    let reapplied = commits.len() as u64;
    let w2 = wal.clone();
    let (catalog_root, appended_again) = rt.block_on(async move {
        let (root, appended_again) = if create {
            p.format().await?;
            let catalog = BTree::create(&p).await?;
            p.set_root(CATALOG_SLOT, catalog.root()).await?;
            (catalog.root(), 0)
        } else {
            p.open_meta().await?;
            // Recovery, part two: complete every commit found.
            let again = reapply(&p, w2.as_ref(), commits).await?;
            if !read_only {
                // Trimmed by the checkpoint below.
                p.note_free_mapped_pages();
            }
            (p.root(CATALOG_SLOT).await?, again)
        };
        if let Some(id) = new_id {
            p.set_log_id(id, log_count as u32).await?;
        }
        if !read_only {
            match &w2 {
                Some(w) => checkpoint(&p, w, CheckpointScope::All).await?,
                None => p.flush_all().await?,
            }
        }
        Ok::<_, Error>((root, appended_again))
    })??;
    if catalog_root == 0 {
        return Err(Error::Corrupt {
            page: 0,
            what: "meta page has no catalogue".into(),
        });
    }
    // Recovery redid pages physically as well as through the trees: no
    // record it read may be served (the cache only ever serves reads of
    // the open database).
    pool.records().clear();
    open::sync_dirs(&sync_dirs)?;
    // The new database is formatted and durable: its creation is done.
    if let Some(marker) = creating {
        open::finish_creation(&marker)?;
    }
    // Recovery read every page a crash could have left different on two
    // copies (and repaired them): reads go to one copy from now on.
    let mirrors = mirrors_of(&array, &logs);
    for m in &mirrors {
        m.set_verify_all(false);
    }
    checkpointing.store(false, Ordering::Release);
    if !read_only {
        // After the open's checkpoint (no commit that wrote to a tree
        // being dropped is re-applied once its pages are freed), and with
        // background checkpoints allowed again: freeing a large tree's
        // pages logs more than the log holds, and with the open holding
        // the checkpoint flag its admission waited for good (a review's
        // finding).
        let p = pool.clone();
        rt.block_on(async move {
            catalog::finish_interrupted(&p, &BTree::open(&p, catalog_root)).await
        })??;
        pool.records().clear();
    }
    let recovery = recovered.map(|r| RecoveryReport {
        records: r.records,
        pages_redone: r.pages_redone,
        pages_repaired: r.pages_repaired,
        leaf_cuts: r.leaf_cuts,
        keys_left_to_reapply: r.keys_left_to_reapply,
        flushes_past_end: r.flushes_past_end,
        commits: reapplied,
        commits_appended_again: appended_again,
        appended_again_ignored: r.appended_again_ignored,
        log_end: r.next_gsn,
    });
    // A database that has a log keeps using it: `Off` then means that
    // commits do not wait for it (as `Async`).
    let durability = match (opts.durability, &wal) {
        (Durability::Off, Some(_)) => Durability::Async,
        (d, _) => d,
    };
    let committer = Arc::new(Committer {
        pool: pool.clone(),
        wal,
        locks: KeyLocks::new(),
        durability,
        read_only,
        closed: AtomicBool::new(false),
        writers: crate::read_fence::ReadFence::new(opts.workers),
        dropped: Mutex::new(Default::default()),
        any_dropped: AtomicBool::new(false),
        readers: Arc::new(crate::read_fence::ReadFence::new(opts.workers)),
        in_flight: InFlight::new(),
        runtime: rt.id(),
        torn: AtomicBool::new(false),
    });
    let collectors = Collectors::default();
    if !read_only && opts.background_collection {
        collectors.start(&array)?;
    }
    let rebuilds = Rebuilds::new(mirrors, stop.clone());
    if !read_only {
        // A rebuild cut short by a crash or a close goes on.
        rebuilds.resume();
    }
    Ok(Started {
        pool,
        rt,
        catalog_root,
        committer,
        stop,
        checkpointing,
        recovery,
        locks,
        rebuilds,
        collectors,
    })
}

/// Keeps room on the data files' file system for the logs that still grow
/// there (their first lap): the data files stop growing first when it
/// fills (see `io::grower::SpaceReserve`).
///
/// Mirrored files count each copy (none was kept for them: the data
/// copies took the log's room; a review's finding).
fn reserve_for_logs(pool: &BufferPool, array: &Array, logs: &[Target], resume: &[Resume]) {
    let Some((d, _)) = array
        .targets()
        .first()
        .and_then(|t| t.files(0).into_iter().next())
    else {
        return;
    };
    let Some(fs) = d.file_system() else {
        return;
    };
    let files: Vec<(Target, u64)> = logs
        .iter()
        .zip(resume)
        .flat_map(|(t, r)| t.files(crate::wal::CONTROL_BYTES + r.control.capacity))
        .filter(|(l, full)| l.file_system() == Some(fs) && l.size() < *full)
        .map(|(l, full)| (Target::File(l), full))
        .collect();
    if !files.is_empty() {
        pool.reserve_space(SpaceReserve {
            file_system: fs,
            files,
        });
    }
}

/// The mirrored groups among an open's devices: data devices, then logs.
fn mirrors_of(array: &Array, logs: &[Target]) -> Vec<Arc<Mirror>> {
    array
        .targets()
        .iter()
        .chain(logs)
        .filter_map(|t| t.mirror().cloned())
        .collect()
}

/// The background collections of an open database's out-of-place data
/// devices (each a thread, joined at close or drop).
#[derive(Default)]
pub(crate) struct Collectors {
    running: Mutex<Vec<Collector>>,
}

impl Collectors {
    /// Starts the collection of every out-of-place device of `array`.
    fn start(&self, array: &Array) -> Result<()> {
        for t in array.targets() {
            if let Target::Remap(r) = t {
                let c = r.start_collector()?;
                self.running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(c);
            }
        }
        Ok(())
    }

    /// Stops the collections and joins them (each ends after its step):
    /// before the devices' clean close, which must be the last thing
    /// written.
    pub(crate) fn finish(&self) {
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|e| e.into_inner()));
        for c in running {
            c.stop();
        }
    }
}

/// The mirrored groups of an open database and the rebuilds running on
/// them (each on a thread of its own, joined at close).
pub(crate) struct Rebuilds {
    pub(crate) mirrors: Vec<Arc<Mirror>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The last failure of a rebuild started in the background.
    pub(crate) failure: Arc<Mutex<Option<String>>>,
}

impl Rebuilds {
    fn new(mirrors: Vec<Arc<Mirror>>, stop: Arc<AtomicBool>) -> Rebuilds {
        Rebuilds {
            mirrors,
            stop,
            threads: Mutex::new(Vec::new()),
            failure: Arc::new(Mutex::new(None)),
        }
    }

    /// Starts, in the background, the rebuild of every copy recorded as
    /// rebuilding.
    fn resume(&self) {
        for m in &self.mirrors {
            for (c, s) in m.states().into_iter().enumerate() {
                if matches!(s, CopyState::Rebuilding { .. }) {
                    self.spawn(m.clone(), c);
                }
            }
        }
    }

    fn spawn(&self, m: Arc<Mirror>, c: usize) {
        let (stop, failure) = (self.stop.clone(), self.failure.clone());
        let t = std::thread::Builder::new()
            .name("dana-rebuild".into())
            .spawn(move || {
                if let Err(e) = m.rebuild(c, &stop) {
                    if !matches!(e, Error::Shutdown) {
                        *failure.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(format!("{} copy {c}: {e}", m.role()));
                    }
                }
            });
        if let Ok(t) = t {
            self.threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(t);
        }
    }

    /// Rebuilds every copy that is not healthy, from the calling thread,
    /// one after another (the engine serves meanwhile).
    pub(crate) fn rebuild_all(&self) -> Result<Vec<RebuildReport>> {
        let mut done = Vec::new();
        for m in &self.mirrors {
            for (c, s) in m.states().into_iter().enumerate() {
                if s != CopyState::Healthy {
                    done.push(m.rebuild(c, &self.stop)?);
                }
            }
        }
        Ok(done)
    }

    /// Stops the rebuilds (they record their progress) and joins them;
    /// then the threads that record the copies' states.
    pub(crate) fn finish(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        for m in &self.mirrors {
            m.finish();
        }
    }
}
