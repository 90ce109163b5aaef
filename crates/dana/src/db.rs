//! The public API: open a database, name trees, read and write them from
//! any thread (sync) or from tasks on the workers (async).
//!
//! Owns: the wiring of the layers (array -> buffer pool -> runtime), the
//! catalogue of named trees (a B+tree in root slot 0 of the meta page:
//! name -> root page id), and the sync fast path.
//!
//! The sync fast path: a sync call first polls the operation once on the
//! calling thread. If every page it needs is resident and no latch is
//! contended it finishes there, with no thread hop. If it needs I/O (which
//! only workers do) it stops before changing anything and runs again on a
//! worker; if it yields on a latch or a free frame, the same future moves
//! to a worker and finishes there (it may have changed the tree already).
//! Never: blocks a worker thread on another worker, or performs I/O outside
//! the workers.

use std::future::Future;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::btree::{BTree, Cursor};
use crate::buffer::{BufferPool, PoolConfig, PoolStatsSnapshot};
use crate::check::{check_pool, CheckReport};
use crate::io::device::DeviceOptions;
use crate::io::{Array, Backend, Device, Target};
use crate::sched::{Runtime, RuntimeConfig};
use crate::{Error, Result};

/// Root slot of the meta page that holds the catalogue's root.
const CATALOG_SLOT: usize = 0;

/// How to open a database. Start from [`Options::default`] and chain the
/// setters.
///
/// ```
/// let opts = dana::Options::default()
///     .pool_bytes(64 << 20)
///     .workers(2)
///     .capacity_bytes(1 << 30);
/// assert_eq!(opts.pool_bytes_value(), 64 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    pool_bytes: usize,
    workers: usize,
    page_size: usize,
    backend: Backend,
    devices: usize,
    capacity_bytes: u64,
    direct: bool,
    queue_depth: u32,
    device_budget: usize,
    max_tasks_per_worker: usize,
    submit_each: bool,
}

impl Default for Options {
    fn default() -> Self {
        let rt = RuntimeConfig::default();
        Options {
            pool_bytes: 256 << 20,
            workers: 2,
            page_size: 4096,
            backend: Backend::default(),
            devices: 1,
            capacity_bytes: 8 << 30,
            direct: true,
            queue_depth: rt.queue_depth,
            device_budget: rt.device_budget,
            max_tasks_per_worker: rt.max_tasks_per_worker,
            submit_each: rt.submit_each,
        }
    }
}

impl Options {
    /// Buffer pool size in bytes (default 256 MiB).
    pub fn pool_bytes(mut self, bytes: usize) -> Self {
        self.pool_bytes = bytes;
        self
    }

    /// The buffer pool size set.
    pub fn pool_bytes_value(&self) -> usize {
        self.pool_bytes
    }

    /// Worker threads (default 2).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Page size in bytes, a power of two from 4096 to 65536, fixed when the
    /// database is created (default 4096).
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self
    }

    /// The I/O backend (default io_uring).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Number of files to stripe over when opening a directory (default 1).
    pub fn devices(mut self, n: usize) -> Self {
        self.devices = n;
        self
    }

    /// Total size of the files created for a new database in a directory
    /// (default 8 GiB; allocated up front, split over the devices).
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.capacity_bytes = bytes;
        self
    }

    /// Open files with `O_DIRECT` (default true; false lets the OS page
    /// cache serve reads, for comparison only).
    pub fn direct_io(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    /// Most requests in flight per device across all workers (default 32).
    pub fn device_budget(mut self, n: usize) -> Self {
        self.device_budget = n;
        self
    }

    /// Capacity of each worker's queue to each device (default 128).
    pub fn queue_depth(mut self, n: u32) -> Self {
        self.queue_depth = n;
        self
    }

    /// Most live tasks per worker (default 4096).
    pub fn max_tasks_per_worker(mut self, n: usize) -> Self {
        self.max_tasks_per_worker = n;
        self
    }

    /// Submit each I/O request on its own instead of batching a worker
    /// round's requests (default false; see [`RuntimeConfig::submit_each`]).
    pub fn submit_each(mut self, on: bool) -> Self {
        self.submit_each = on;
        self
    }

    fn runtime_config(&self) -> RuntimeConfig {
        RuntimeConfig {
            workers: self.workers,
            queue_depth: self.queue_depth,
            device_budget: self.device_budget,
            max_tasks_per_worker: self.max_tasks_per_worker,
            submit_each: self.submit_each,
            ..RuntimeConfig::default()
        }
    }
}

struct DbInner {
    pool: Arc<BufferPool>,
    rt: Runtime,
    catalog: BTree,
}

/// An open database.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let opts = dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20);
/// let db = dana::Db::open(dir.path(), opts).unwrap();
/// let t = db.create_tree("users").unwrap();
/// t.put(b"ada", b"lovelace").unwrap();
/// assert_eq!(t.get(b"ada").unwrap().as_deref(), Some(&b"lovelace"[..]));
/// db.close().unwrap();
/// ```
#[derive(Clone)]
pub struct Db {
    inner: Arc<DbInner>,
}

fn device_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("dana.{i}"))
}

impl Db {
    /// Opens the database in directory `dir`, creating the directory and
    /// its files (`dana.0`, `dana.1`, ...) if they do not exist.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Db> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| Error::Open {
            action: "create directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let exists = device_path(dir, 0).exists();
        let devices = if exists {
            (0..).take_while(|&i| device_path(dir, i).exists()).count()
        } else {
            opts.devices.max(1)
        };
        let per_device =
            (opts.capacity_bytes / devices as u64) / opts.page_size as u64 * opts.page_size as u64;
        let targets = (0..devices)
            .map(|i| {
                let dopts = DeviceOptions {
                    direct: opts.direct,
                    create_size: (!exists).then_some(per_device),
                    read_only: false,
                };
                Device::open(device_path(dir, i), i, dopts).map(|d| Target::File(Arc::new(d)))
            })
            .collect::<Result<Vec<_>>>()?;
        let array = Array::new(targets, opts.page_size as u64)?;
        Db::open_array(array, opts, !exists)
    }

    /// Opens a database striped over `paths` (files or block devices, in
    /// this order every time). With `create`, files that do not exist are
    /// created with `capacity_bytes / paths.len()` bytes each and the
    /// database is formatted (erasing what the devices held as far as dana
    /// is concerned); without it, the devices must hold a dana database.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let paths = [dir.path().join("a"), dir.path().join("b")];
    /// let opts = dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20);
    /// let db = dana::Db::open_devices(&paths, opts.clone(), true).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// db.close().unwrap();
    /// let db = dana::Db::open_devices(&paths, opts, false).unwrap();
    /// assert_eq!(db.tree("t").unwrap().get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub fn open_devices(paths: &[impl AsRef<Path>], opts: Options, create: bool) -> Result<Db> {
        if paths.is_empty() {
            return Err(Error::InvalidArgument("no device given".into()));
        }
        let per_device = (opts.capacity_bytes / paths.len() as u64) / opts.page_size as u64
            * opts.page_size as u64;
        let targets = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let dopts = DeviceOptions {
                    direct: opts.direct,
                    create_size: create.then_some(per_device),
                    read_only: false,
                };
                Device::open(p, i, dopts).map(|d| Target::File(Arc::new(d)))
            })
            .collect::<Result<Vec<_>>>()?;
        let array = Array::new(targets, opts.page_size as u64)?;
        Db::open_array(array, opts, create)
    }

    /// Opens a database on an array of devices (files, block devices or
    /// simulated devices). With `create`, formats it first (erasing what
    /// the devices held as far as dana is concerned).
    pub fn open_array(array: Array, opts: Options, create: bool) -> Result<Db> {
        let frames = opts.pool_bytes / opts.page_size;
        let pool = BufferPool::new(array.clone(), &PoolConfig::with_frames(frames))?;
        let rt = Runtime::start(
            &opts.runtime_config(),
            &array,
            &opts.backend,
            pool.clone(),
            Some(pool.memory()),
        )?;
        let p = pool.clone();
        let catalog_root = rt.block_on(async move {
            if create {
                p.format().await?;
                let catalog = BTree::create(&p).await?;
                p.set_root(CATALOG_SLOT, catalog.root()).await?;
                p.flush_all().await?;
                Ok(catalog.root())
            } else {
                p.open_meta().await?;
                p.root(CATALOG_SLOT).await
            }
        })??;
        if catalog_root == 0 {
            return Err(Error::Corrupt {
                page: 0,
                what: "meta page has no catalogue".into(),
            });
        }
        let catalog = BTree::open(&pool, catalog_root);
        Ok(Db {
            inner: Arc::new(DbInner { pool, rt, catalog }),
        })
    }

    /// Creates the tree `name`. Fails with [`Error::KeyExists`] if it
    /// exists.
    pub fn create_tree(&self, name: &str) -> Result<Tree> {
        let (pool, catalog, key) = (
            self.inner.pool.clone(),
            self.inner.catalog.clone(),
            name.as_bytes().to_vec(),
        );
        let root = self.block_on(async move {
            if catalog.get(&key).await?.is_some() {
                return Err(Error::KeyExists);
            }
            let t = BTree::create(&pool).await?;
            catalog.insert(&key, &t.root().to_le_bytes()).await?;
            Ok(t.root())
        })??;
        Ok(self.tree_at(name, root))
    }

    /// Opens the tree `name`, or fails with [`Error::NoSuchTree`].
    pub fn tree(&self, name: &str) -> Result<Tree> {
        let (catalog, key) = (self.inner.catalog.clone(), name.as_bytes().to_vec());
        let root = self.block_on(async move { catalog.get(&key).await })??;
        match root.as_deref().map(<[u8; 8]>::try_from) {
            Some(Ok(b)) => Ok(self.tree_at(name, u64::from_le_bytes(b))),
            Some(Err(_)) => Err(Error::Corrupt {
                page: self.inner.catalog.root(),
                what: format!("catalogue entry for {name:?} is not a page id"),
            }),
            None => Err(Error::NoSuchTree(name.to_string())),
        }
    }

    /// Opens the tree `name`, creating it if needed.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let a = db.tree_or_create("t").unwrap();
    /// a.put(b"k", b"v").unwrap();
    /// let b = db.tree_or_create("t").unwrap();
    /// assert_eq!(b.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub fn tree_or_create(&self, name: &str) -> Result<Tree> {
        match self.tree(name) {
            Err(Error::NoSuchTree(_)) => self.create_tree(name),
            other => other,
        }
    }

    /// Names of all trees, in order.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// db.create_tree("b").unwrap();
    /// db.create_tree("a").unwrap();
    /// assert_eq!(db.tree_names().unwrap(), vec!["a".to_string(), "b".to_string()]);
    /// ```
    pub fn tree_names(&self) -> Result<Vec<String>> {
        let catalog = self.inner.catalog.clone();
        let entries = self.block_on(async move {
            let mut c = catalog.cursor(Bound::Unbounded, Bound::Unbounded, true);
            let mut out = Vec::new();
            while let Some((k, v)) = c.next().await? {
                out.push((k, v));
            }
            Ok::<_, Error>(out)
        })??;
        Ok(entries
            .into_iter()
            .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
            .collect())
    }

    /// (name, root page id) of every tree, for `dana check`.
    pub fn tree_roots(&self) -> Result<Vec<(String, u64)>> {
        let names = self.tree_names()?;
        names
            .into_iter()
            .map(|n| self.tree(&n).map(|t| (n, t.btree.root())))
            .collect()
    }

    /// Checks the whole database (every tree, the free list, page
    /// accounting) on a worker, without modifying it; see [`crate::check`].
    /// Run it while no other thread writes.
    pub fn check(&self) -> Result<CheckReport> {
        let pool = self.inner.pool.clone();
        self.block_on(async move { check_pool(&pool).await })?
    }

    /// Drops the tree `name` and frees its pages. Returns false if it did
    /// not exist.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// db.create_tree("tmp").unwrap().put(b"k", b"v").unwrap();
    /// assert!(db.drop_tree("tmp").unwrap());
    /// assert!(matches!(db.tree("tmp"), Err(dana::Error::NoSuchTree(_))));
    /// ```
    pub fn drop_tree(&self, name: &str) -> Result<bool> {
        let tree = match self.tree(name) {
            Ok(t) => t,
            Err(Error::NoSuchTree(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let (catalog, key, bt) = (
            self.inner.catalog.clone(),
            name.as_bytes().to_vec(),
            tree.btree,
        );
        self.block_on(async move {
            catalog.delete(&key).await?;
            bt.destroy().await
        })??;
        Ok(true)
    }

    /// Writes back every dirty page and syncs the devices.
    pub fn flush(&self) -> Result<()> {
        let pool = self.inner.pool.clone();
        self.block_on(async move { pool.flush_all().await })?
    }

    /// Flushes and stops the workers.
    pub fn close(self) -> Result<()> {
        self.flush()
    }

    /// Runs `future` on a worker and waits for its output (call from any
    /// thread but a worker).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap().btree().clone();
    /// let v = db.block_on(async move {
    ///     t.put(b"k", b"v").await?;
    ///     t.get(b"k").await
    /// }).unwrap().unwrap();
    /// assert_eq!(v, Some(b"v".to_vec()));
    /// ```
    pub fn block_on<T, F>(&self, future: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.inner.rt.block_on(future)
    }

    /// Runs `future` as a task on the next worker without waiting.
    pub fn spawn<F>(&self, future: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.spawn(future)
    }

    /// Runs `future` as a task on worker `worker`.
    pub fn spawn_on<F>(&self, worker: usize, future: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.rt.spawn_on(worker, future)
    }

    /// The buffer pool's counters.
    pub fn pool_stats(&self) -> PoolStatsSnapshot {
        self.inner.pool.stats()
    }

    /// The buffer pool (for benchmarks and tools).
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.inner.pool
    }

    /// The scheduler (for benchmarks and tools).
    pub fn runtime(&self) -> &Runtime {
        &self.inner.rt
    }

    fn tree_at(&self, name: &str, root: u64) -> Tree {
        Tree {
            db: self.clone(),
            btree: BTree::open(&self.inner.pool, root),
            name: name.to_string(),
        }
    }
}

/// A named, ordered key-value tree. Cheap to clone; methods block the
/// calling thread (use [`Tree::btree`] for the async API inside tasks).
#[derive(Clone)]
pub struct Tree {
    db: Db,
    btree: BTree,
    name: String,
}

impl Tree {
    /// The tree's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The async API of this tree, for use inside tasks
    /// ([`Db::spawn`], [`Db::block_on`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let tree = db.create_tree("t").unwrap().btree().clone();
    /// let n = db.block_on(async move {
    ///     for i in 0u32..100 {
    ///         tree.put(&i.to_be_bytes(), b"v").await?;
    ///     }
    ///     tree.count(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded).await
    /// }).unwrap().unwrap();
    /// assert_eq!(n, 100);
    /// ```
    pub fn btree(&self) -> &BTree {
        &self.btree
    }

    /// Runs an operation: inline if it completes without I/O, else on a
    /// worker. An attempt that needed I/O (`WouldBlock`, always raised
    /// before the operation changed anything) runs again from the start on
    /// a worker; an attempt that yielded (a latch held, no free frame) may
    /// already have changed the tree, so the same future moves to a worker
    /// and finishes there, never runs twice.
    fn run<T, F, Fut>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(BTree) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let mut fut = Box::pin(op(self.btree.clone()));
        let mut cx = Context::from_waker(Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(Err(Error::WouldBlock)) => self.db.block_on(op(self.btree.clone()))?,
            Poll::Ready(r) => r,
            Poll::Pending => self.db.block_on(fut)?,
        }
    }

    /// The value of `key`.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"v").unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// assert_eq!(t.get(b"nope").unwrap(), None);
    /// ```
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let key = key.to_vec();
        self.run(move |t| {
            let key = key.clone();
            async move { t.get(&key).await }
        })
    }

    /// Inserts `key` -> `value`; [`Error::KeyExists`] if present.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.insert(b"k", b"v").unwrap();
    /// assert!(matches!(t.insert(b"k", b"w"), Err(dana::Error::KeyExists)));
    /// ```
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let (key, value) = (key.to_vec(), value.to_vec());
        self.run(move |t| {
            let (key, value) = (key.clone(), value.clone());
            async move { t.insert(&key, &value).await }
        })
    }

    /// Inserts or replaces `key` -> `value`; true if it replaced.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// assert!(!t.put(b"k", b"v1").unwrap());
    /// assert!(t.put(b"k", b"v2").unwrap());
    /// ```
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        let (key, value) = (key.to_vec(), value.to_vec());
        self.run(move |t| {
            let (key, value) = (key.clone(), value.clone());
            async move { t.put(&key, &value).await }
        })
    }

    /// Replaces the value of `key` with `f(old)` atomically; false if
    /// absent. `f` may run more than once (keep it free of side effects).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("counters").unwrap();
    /// t.put(b"hits", &1u64.to_le_bytes()).unwrap();
    /// t.update(b"hits", |old| {
    ///     let n = u64::from_le_bytes(old.try_into().unwrap());
    ///     (n + 1).to_le_bytes().to_vec()
    /// }).unwrap();
    /// assert_eq!(t.get(b"hits").unwrap(), Some(2u64.to_le_bytes().to_vec()));
    /// ```
    pub fn update(
        &self,
        key: &[u8],
        f: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + Clone + 'static,
    ) -> Result<bool> {
        let key = key.to_vec();
        self.run(move |t| {
            let (key, f) = (key.clone(), f.clone());
            async move { t.update(&key, f).await }
        })
    }

    /// Removes `key`; true if it was present.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"v").unwrap();
    /// assert!(t.delete(b"k").unwrap());
    /// assert!(!t.delete(b"k").unwrap());
    /// ```
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let key = key.to_vec();
        self.run(move |t| {
            let key = key.clone();
            async move { t.delete(&key).await }
        })
    }

    /// Entries in `[lower, upper]`, forward or backward, at most `limit`.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// use std::ops::Bound::{Included, Excluded, Unbounded};
    /// let t = db.create_tree("t").unwrap();
    /// for k in [b"a", b"b", b"c", b"d"] {
    ///     t.put(k, b"").unwrap();
    /// }
    /// let keys = |v: Vec<(Vec<u8>, Vec<u8>)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    /// assert_eq!(keys(t.range(Included(&b"b"[..]), Excluded(&b"d"[..]), true, 10).unwrap()), vec![b"b".to_vec(), b"c".to_vec()]);
    /// assert_eq!(keys(t.range(Unbounded, Unbounded, false, 2).unwrap()), vec![b"d".to_vec(), b"c".to_vec()]);
    /// ```
    pub fn range(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        forward: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut c: Cursor = self.btree.cursor(lower, upper, forward);
        self.db.block_on(async move {
            let mut out = Vec::new();
            while out.len() < limit {
                match c.next().await? {
                    Some(e) => out.push(e),
                    None => break,
                }
            }
            Ok(out)
        })?
    }

    /// Number of keys in `[lower, upper]`.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// use std::ops::Bound::{Included, Unbounded};
    /// let t = db.create_tree("t").unwrap();
    /// for i in 0u32..10 {
    ///     t.put(&i.to_be_bytes(), b"").unwrap();
    /// }
    /// assert_eq!(t.count(Included(&5u32.to_be_bytes()[..]), Unbounded).unwrap(), 5);
    /// ```
    pub fn count(&self, lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> Result<u64> {
        let (l, u) = (own(lower), own(upper));
        self.run(move |t| {
            let (l, u) = (l.clone(), u.clone());
            async move { t.count(borrow(&l), borrow(&u)).await }
        })
    }

    /// Looks up many keys at once: one task per key on the workers, so
    /// their misses are in flight together. Results in the order of `keys`.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"a", b"1").unwrap();
    /// let got = t.get_many(&[b"a".to_vec(), b"z".to_vec()]).unwrap();
    /// assert_eq!(got, vec![Some(b"1".to_vec()), None]);
    /// ```
    pub fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, k) in keys.iter().enumerate() {
            let (t, k, tx) = (self.btree.clone(), k.clone(), tx.clone());
            self.db.spawn(async move {
                let _ = tx.send((i, t.get(&k).await));
            })?;
        }
        drop(tx);
        let mut out = vec![None; keys.len()];
        let mut seen = 0;
        for (i, r) in rx {
            out[i] = r?;
            seen += 1;
        }
        if seen != keys.len() {
            return Err(Error::Shutdown);
        }
        Ok(out)
    }
}

fn own(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(k) => Bound::Included(k.to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn borrow(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}
