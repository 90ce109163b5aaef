//! The options of an open: sizes, workers, I/O backend, durability, the
//! log. Plain values with chained setters and `*_value` getters.
//!
//! Owns: every default. Never: opens, reads or writes anything.

use std::path::PathBuf;
use std::time::Duration;

use crate::buffer::EvictionPolicy;
use crate::io::Backend;
use crate::sched::RuntimeConfig;
use crate::wal::{control, Durability};

/// The fewest pages per device [`Options::capacity_bytes`] may allow.
pub const MIN_CAPACITY_PAGES: u64 = 16;

/// The fewest pages [`Options::pool_bytes`] may hold. One task latches up
/// to six pages at once (a split: the parent, the page, the new sibling,
/// the space map's pages and the meta page) and may wait for a frame while
/// it holds them: on a pool of 4 frames the first split waited for good
/// for a fifth. 16 leave room for two such tasks and for pages being
/// written back; more tasks latching at once need a larger pool (a task
/// waiting for a frame holds its latches).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let few = dana::MIN_POOL_FRAMES * 4096 - 4096;
/// let e = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(few)).err().unwrap();
/// assert!(matches!(e, dana::Error::InvalidArgument(m) if m.contains("Options::pool_bytes")));
/// ```
pub const MIN_POOL_FRAMES: usize = 16;

/// The most workers a database runs ([`Options::workers`]).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let many = dana::Options::default().workers(dana::MAX_WORKERS + 1);
/// let e = dana::Db::open(dir.path(), many).err().unwrap();
/// assert!(matches!(e, dana::Error::InvalidArgument(m) if m.contains("Options::workers")));
/// ```
pub const MAX_WORKERS: usize = 1024;

/// The most data devices a database stripes over ([`Options::devices`]).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let many = dana::Options::default().devices(dana::MAX_DEVICES + 1);
/// let e = dana::Db::open(dir.path(), many).err().unwrap();
/// assert!(matches!(e, dana::Error::InvalidArgument(m) if m.contains("Options::devices")));
/// ```
pub const MAX_DEVICES: usize = 256;

/// The deepest queue a worker may have to a device
/// ([`Options::queue_depth`]): the most entries dana asks of one io_uring.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let deep = dana::Options::default().queue_depth(dana::MAX_QUEUE_DEPTH + 1);
/// let e = dana::Db::open(dir.path(), deep).err().unwrap();
/// assert!(matches!(e, dana::Error::InvalidArgument(m) if m.contains("Options::queue_depth")));
/// ```
pub const MAX_QUEUE_DEPTH: u32 = crate::io::uring::MAX_DEPTH;

/// Bytes a new database's data files start with, all devices together
/// (less if [`Options::capacity_bytes`] is smaller). They grow on demand.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let opts = dana::Options::default().pool_bytes(8 << 20);
/// let _db = dana::Db::open(dir.path(), opts).unwrap();
/// let len = std::fs::metadata(dir.path().join("dana.0")).unwrap().len();
/// assert_eq!(len, dana::INITIAL_DATA_BYTES);
/// ```
pub const INITIAL_DATA_BYTES: u64 = 1 << 20;

/// Where page writes land ([`Options::write_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Each page at its own address (the default).
    #[default]
    InPlace,
    /// Each page write to a fresh slot of an append-only segment
    /// ([`crate::io::remap`]).
    OutOfPlace,
}

/// How to open a database. Start from [`Options::default`] and chain the
/// setters.
///
/// ```
/// let opts = dana::Options::default()
///     .pool_bytes(64 << 20)
///     .workers(2)
///     .capacity_bytes(1 << 30);
/// assert_eq!(opts.pool_bytes_value(), 64 << 20);
/// // The `*_value` getters read settings back; the defaults:
/// let d = dana::Options::default();
/// assert_eq!((d.page_size_value(), d.devices_value(), d.capacity_bytes_value()), (4096, 1, None));
/// assert_eq!(d.durability_value(), dana::Durability::Sync);
/// assert!(d.direct_value() && !d.log_preallocate_value() && !d.is_read_only());
/// assert_eq!(d.log_path_value(), None);
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) pool_bytes: usize,
    pub(crate) workers: usize,
    pub(crate) page_size: usize,
    pub(crate) backend: Backend,
    pub(crate) devices: usize,
    pub(crate) mirror_copies: usize,
    pub(crate) write_mode: WriteMode,
    pub(crate) compress_pages: bool,
    pub(crate) background_collection: bool,
    pub(crate) capacity_bytes: Option<u64>,
    pub(crate) direct: bool,
    pub(crate) queue_depth: u32,
    pub(crate) device_budget: usize,
    pub(crate) adaptive_budget: bool,
    pub(crate) max_tasks_per_worker: usize,
    pub(crate) submit_each: bool,
    pub(crate) durability: Durability,
    pub(crate) async_window: Duration,
    pub(crate) log_bytes: u64,
    pub(crate) logs: usize,
    pub(crate) checkpoint_shards: usize,
    pub(crate) log_preallocate: bool,
    pub(crate) untorn_page_writes: bool,
    pub(crate) compress_log_images: bool,
    pub(crate) log_write_through_max: u64,
    pub(crate) log_flushes_in_flight: usize,
    pub(crate) log_flush_block: u64,
    pub(crate) log_path: Option<PathBuf>,
    pub(crate) read_only: bool,
    pub(crate) log_identity: Option<u64>,
    pub(crate) eviction: EvictionPolicy,
    pub(crate) record_cache_bytes: usize,
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
            mirror_copies: 1,
            write_mode: WriteMode::InPlace,
            compress_pages: false,
            background_collection: true,
            capacity_bytes: None,
            direct: true,
            queue_depth: rt.queue_depth,
            device_budget: rt.device_budget,
            adaptive_budget: rt.adaptive_budget,
            max_tasks_per_worker: rt.max_tasks_per_worker,
            submit_each: rt.submit_each,
            durability: Durability::Sync,
            async_window: Duration::from_millis(10),
            log_bytes: 64 << 20,
            logs: 1,
            checkpoint_shards: 8,
            log_preallocate: false,
            untorn_page_writes: true,
            compress_log_images: false,
            log_write_through_max: 16 << 10,
            log_flushes_in_flight: 1,
            log_flush_block: 0,
            log_path: None,
            read_only: false,
            log_identity: None,
            eviction: EvictionPolicy::default(),
            record_cache_bytes: 0,
        }
    }
}

impl Options {
    /// Buffer pool size in bytes (default 256 MiB).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().pool_bytes_value(), 256 << 20);
    /// assert_eq!(dana::Options::default().pool_bytes(8 << 20).pool_bytes_value(), 8 << 20);
    /// ```
    pub fn pool_bytes(mut self, bytes: usize) -> Self {
        self.pool_bytes = bytes;
        self
    }

    /// The buffer pool size set.
    ///
    /// ```
    /// let opts = dana::Options::default().pool_bytes(8 << 20);
    /// assert_eq!(opts.pool_bytes_value(), 8 << 20);
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = dana::Db::open(dir.path(), opts.clone()).unwrap();
    /// // The pool holds that many bytes of page frames.
    /// assert_eq!(db.pool().frames() * db.pool().page_size(), opts.pool_bytes_value());
    /// ```
    pub fn pool_bytes_value(&self) -> usize {
        self.pool_bytes
    }

    /// Worker threads (default 2; 1 to [`MAX_WORKERS`]).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).workers(1);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert_eq!(db.runtime().workers(), 1);
    /// ```
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Number of write-ahead logs of a new database (default 1; 0: one per
    /// worker, capped at [`crate::wal::MAX_LOGS`]; an open refuses a larger
    /// number with [`crate::Error::InvalidArgument`]). With several, each
    /// worker appends to its own log and group-commits it on its own (log
    /// `i` belongs to worker `i % workers`), and recovery merges them by
    /// sequence number. That takes the log's lock and flush off the path
    /// other workers share (the point on many cores and several devices);
    /// on one disk it costs throughput (`docs/PERF.md`: 0.51x-0.64x of one
    /// log with 256 committers on this project's 2-core VM), hence the
    /// default. An existing database keeps the number it was created
    /// with. The log files are the log path (`dana.wal`) and, for log
    /// `i > 0`, that path with `.i` appended.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).workers(2).logs(3);
    /// assert_eq!(opts.logs_value(), 3);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert!(dir.path().join("dana.wal.2").exists());
    /// # drop(db);
    /// assert_eq!(dana::Options::default().workers(4).logs(0).logs_value(), 4); // one per worker
    /// ```
    pub fn logs(mut self, n: usize) -> Self {
        self.logs = n;
        self
    }

    /// The number of logs a new database gets (see [`Options::logs`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().logs_value(), 1);
    /// ```
    pub fn logs_value(&self) -> usize {
        match self.logs {
            0 => self.workers.max(1),
            n => n,
        }
        .min(crate::wal::MAX_LOGS)
    }

    /// Checkpoint shards (default 8; 1 to 64; not stored: any open may
    /// choose). Checkpoints run continuously: each time a share of the log
    /// (3/8 of it over the shards, a quarter where pages are written
    /// whole) has been appended since the last one began, the next shard's dirty pages (page id modulo the shard
    /// count) are written back, and the redo point moves to where the
    /// shard checkpointed longest ago began. So about 3/8 of the log lies
    /// between the redo point and the end, as with whole checkpoints
    /// (which 1 gives), but the write-back comes a shard at a time instead
    /// of every dirty page at once. `Db::checkpoint`, close, recovery and
    /// a dropped tree still checkpoint every page.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().checkpoint_shards_value(), 8);
    /// let opts = dana::Options::default().checkpoint_shards(1); // whole checkpoints
    /// assert_eq!(opts.checkpoint_shards_value(), 1);
    /// assert_eq!(dana::Options::default().checkpoint_shards(0).checkpoint_shards_value(), 1);
    /// assert_eq!(dana::Options::default().checkpoint_shards(1000).checkpoint_shards_value(), 64);
    /// ```
    pub fn checkpoint_shards(mut self, n: usize) -> Self {
        self.checkpoint_shards = n.clamp(1, crate::wal::MAX_CHECKPOINT_SHARDS);
        self
    }

    /// The checkpoint shards set (see [`Options::checkpoint_shards`]).
    pub fn checkpoint_shards_value(&self) -> usize {
        self.checkpoint_shards
    }

    /// Page size in bytes, a power of two from 4096 to 65536, fixed when the
    /// database is created (default 4096).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).page_size(8192);
    /// assert_eq!(opts.page_size_value(), 8192);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert_eq!(db.pool().page_size(), 8192);
    /// // Other sizes are refused before anything is created.
    /// let other = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).page_size(1024);
    /// assert!(matches!(dana::Db::open(other.path(), opts), Err(dana::Error::InvalidArgument(_))));
    /// assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    /// ```
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self
    }

    /// The I/O backend (default io_uring).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).backend(dana::io::Backend::Blocking);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// let t = db.create_tree("t").unwrap();
    /// t.put(b"k", b"v").unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Number of files to stripe over when opening a directory (default 1;
    /// at most [`MAX_DEVICES`]).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).devices(2);
    /// assert_eq!(opts.devices_value(), 2);
    /// let _db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert!(dir.path().join("dana.0").exists() && dir.path().join("dana.1").exists());
    /// ```
    pub fn devices(mut self, n: usize) -> Self {
        self.devices = n;
        self
    }

    /// Mirrors every data device and every log in two copies (see
    /// [`Options::mirror_copies`]).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).devices(2).mirrored();
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// for f in ["dana.0", "dana.0.m1", "dana.1", "dana.1.m1", "dana.wal", "dana.wal.m1"] {
    ///     assert!(dir.path().join(f).exists(), "{f}");
    /// }
    /// let status = db.mirror_status();
    /// assert_eq!(status.len(), 3); // two data devices and the log
    /// assert!(status.iter().all(|g| g.copies.iter().all(|c| c.state == dana::io::mirror::CopyState::Healthy)));
    /// ```
    pub fn mirrored(self) -> Self {
        self.mirror_copies(2)
    }

    /// Keeps `n` copies (1 to 8; default 1: no mirror) of every data device
    /// and every log, when the database is created. Each page and each
    /// log flush is written to every copy (a write completes when every
    /// copy has it); a read goes to the least loaded copy, and a page
    /// whose checksum fails there is read from another copy and rewritten
    /// on the bad one. A copy that fails (I/O errors) is dropped, recorded
    /// as failed in the others' labels, and the database goes on with the
    /// rest; [`crate::Db::rebuild`] repopulates it online. Files of copy
    /// `c >= 1`: the copy-0 file's name with `.m{c}` appended (`dana.0.m1`,
    /// `dana.wal.m1`); with [`crate::Db::open_devices`] the paths are given
    /// copy by copy for each device. An existing database keeps the copies
    /// it was created with (its labels say how many).
    pub fn mirror_copies(mut self, n: usize) -> Self {
        self.mirror_copies = n;
        self
    }

    /// Where a new database's page writes land (default
    /// [`WriteMode::InPlace`]). Out of place, each data file is an
    /// out-of-place device ([`crate::io::remap`]): every page write goes to
    /// a fresh slot of an append-only segment, dana collects its segments
    /// and trims the dead ones, and a torn write never touches a page's
    /// last good version. Such files do not grow: they are created at
    /// [`Options::capacity_bytes`] (required), of which the engine gets a
    /// little less (segment summaries, 8 reserved segments, 5% spare).
    /// Not with mirrors. An existing database keeps the mode it was
    /// created with (a data file's label says which).
    ///
    /// ```
    /// use dana::options::WriteMode;
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default()
    ///     .pool_bytes(8 << 20)
    ///     .capacity_bytes(64 << 20)
    ///     .write_mode(WriteMode::OutOfPlace);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// db.close().unwrap();
    /// // Reopened without the option: the files say they are out of place.
    /// let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
    /// assert_eq!(db.tree("t").unwrap().get(b"k").unwrap(), Some(b"v".to_vec()));
    /// ```
    pub fn write_mode(mut self, mode: WriteMode) -> Self {
        self.write_mode = mode;
        self
    }

    /// The write mode set ([`Options::write_mode`]).
    pub fn write_mode_value(&self) -> WriteMode {
        self.write_mode
    }

    /// Compress every page a new out-of-place database writes (LZ4, per
    /// page) and pack it at 512-byte granularity (default false; #14 item
    /// 3). A page that does not shrink by 512 bytes is stored whole. The
    /// logical size stays [`Options::write_mode`]'s; what compression saves
    /// is room on the device, which makes the collection of segments
    /// cheaper (fewer copies, fewer flash writes). Costs one LZ4 pass per
    /// page written and per compressed page read. Needs
    /// [`WriteMode::OutOfPlace`] and a device whose direct I/O works in
    /// 512-byte sectors. An existing database keeps what it was created
    /// with (a data file's label says).
    ///
    /// ```
    /// use dana::options::WriteMode;
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default()
    ///     .pool_bytes(8 << 20)
    ///     .capacity_bytes(64 << 20)
    ///     .write_mode(WriteMode::OutOfPlace)
    ///     .compress_pages(true);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", &[b'v'; 1000]).unwrap();
    /// db.close().unwrap();
    /// let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20)).unwrap();
    /// assert_eq!(db.tree("t").unwrap().get(b"k").unwrap(), Some(vec![b'v'; 1000]));
    /// ```
    pub fn compress_pages(mut self, on: bool) -> Self {
        self.compress_pages = on;
        self
    }

    /// Whether pages are compressed ([`Options::compress_pages`]).
    pub fn compress_pages_value(&self) -> bool {
        self.compress_pages
    }

    /// Out of place, collect segments in the background (default true):
    /// each out-of-place data file gets a thread that keeps free segments
    /// ahead of the page writes ([`crate::io::remap::Remap::start_collector`]),
    /// so that a worker seldom stops its tasks to collect and run the
    /// barrier that frees what it emptied. Off, the worker whose write
    /// finds the free segments run out collects itself (as it still does
    /// when the thread falls behind). Not with a read-only open, and
    /// nothing in place.
    ///
    /// ```
    /// assert!(dana::Options::default().background_collection_value());
    /// let o = dana::Options::default().background_collection(false);
    /// assert!(!o.background_collection_value());
    /// ```
    pub fn background_collection(mut self, on: bool) -> Self {
        self.background_collection = on;
        self
    }

    /// Whether out-of-place devices collect in the background
    /// ([`Options::background_collection`]).
    pub fn background_collection_value(&self) -> bool {
        self.background_collection
    }

    /// The number of copies set ([`Options::mirror_copies`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().mirror_copies_value(), 1);
    /// assert_eq!(dana::Options::default().mirrored().mirror_copies_value(), 2);
    /// ```
    pub fn mirror_copies_value(&self) -> usize {
        self.mirror_copies
    }

    /// The most bytes the database's data files may grow to, split over
    /// the devices (default: no limit but the file system's, or a block
    /// device's size; at least [`MIN_CAPACITY_PAGES`] pages per device,
    /// else the open fails with [`crate::Error::InvalidArgument`]). A new database starts at
    /// [`crate::INITIAL_DATA_BYTES`] (or this maximum, if smaller) and its
    /// files grow in steps of `clamp(size / 32, 16 MiB, 1 GiB)` ahead of
    /// need; a write that would pass the maximum fails with
    /// [`crate::Error::NoSpace`] before it is logged.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().capacity_bytes_value(), None);
    /// let opts = dana::Options::default().capacity_bytes(1 << 30);
    /// assert_eq!(opts.capacity_bytes_value(), Some(1 << 30));
    /// ```
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.capacity_bytes = Some(bytes);
        self
    }

    /// Open files with `O_DIRECT` (default true; false lets the OS page
    /// cache serve reads, for comparison only).
    ///
    /// ```
    /// assert!(dana::Options::default().direct_value());
    /// assert!(!dana::Options::default().direct_io(false).direct_value());
    /// ```
    pub fn direct_io(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    /// A fixed limit of requests in flight per device across all workers,
    /// in place of the default adaptive one (see
    /// [`Options::adaptive_device_budget`]).
    ///
    /// ```
    /// let opts = dana::Options::default().device_budget(8);
    /// assert!(format!("{opts:?}").contains("device_budget: 8, adaptive_budget: false"));
    /// ```
    pub fn device_budget(mut self, n: usize) -> Self {
        self.device_budget = n;
        self.adaptive_budget = false;
        self
    }

    /// The limit of requests in flight per device adapts to the device
    /// while the engine runs, starting at `start` (the default, from 32):
    /// it climbs while deeper queues bring proportionally more completions
    /// and comes back down past the device's latency knee, between one
    /// request per worker and the workers' queue capacity (`queue_depth` x
    /// workers). Each change
    /// is kept for reports ([`crate::sched::DeviceBudgets::changes`]).
    ///
    /// ```
    /// let opts = dana::Options::default().device_budget(8).adaptive_device_budget(64);
    /// assert!(format!("{opts:?}").contains("device_budget: 64, adaptive_budget: true"));
    /// ```
    pub fn adaptive_device_budget(mut self, start: usize) -> Self {
        self.device_budget = start;
        self.adaptive_budget = true;
        self
    }

    /// How the buffer pool picks pages to evict and dirty pages to write
    /// back (default [`EvictionPolicy::Watt`], write-aware; `Clock` is
    /// second chance, kept as the benchmarks' baseline). Eviction write-backs
    /// use at most half of the device budget, so reads keep the rest.
    ///
    /// ```
    /// use dana::EvictionPolicy;
    /// assert_eq!(dana::Options::default().eviction_value(), EvictionPolicy::Watt);
    /// let opts = dana::Options::default().eviction(EvictionPolicy::Clock);
    /// assert_eq!(opts.eviction_value(), EvictionPolicy::Clock);
    /// ```
    pub fn eviction(mut self, policy: EvictionPolicy) -> Self {
        self.eviction = policy;
        self
    }

    /// Bytes of memory for a cache of hot records beside the buffer pool
    /// (default 0: none), on top of [`Options::pool_bytes`].
    ///
    /// Point reads (`Tree::get`, a transaction's `get`) look there first;
    /// a miss reads the leaf and enters the record (values up to a quarter
    /// of a page), and every write of a key drops it. Under skewed reads of
    /// scattered keys (hashed or random keys, a zipfian popularity) a
    /// frame spends a whole page on each hot record, while the cache holds
    /// one record in about its size plus 160 bytes: with data several times
    /// the memory, giving the cache part of the budget a pool would get
    /// serves more reads from memory. Ordered or uniform access gains
    /// nothing from it. Everything the cache allocates stays within
    /// `bytes`, counted as glibc's malloc lays it out; under 4 KiB, no
    /// cache. `docs/ARCHITECTURE.md`, "The record cache".
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).record_cache_bytes(4 << 20);
    /// assert_eq!(opts.record_cache_bytes_value(), 4 << 20);
    /// # let db = dana::Db::open(dir.path(), opts.capacity_bytes(64 << 20)).unwrap();
    /// # let t = db.create_tree("t").unwrap();
    /// # t.put(b"k", b"v1").unwrap();
    /// # for _ in 0..3 { // it enters at its second miss, then hits
    /// #     assert_eq!(t.get(b"k").unwrap(), Some(b"v1".to_vec()));
    /// # }
    /// # t.put(b"k", b"v2").unwrap();
    /// # assert_eq!(t.get(b"k").unwrap(), Some(b"v2".to_vec()));
    /// # assert!(db.pool().records().stats().hits >= 1);
    /// ```
    pub fn record_cache_bytes(mut self, bytes: usize) -> Self {
        self.record_cache_bytes = bytes;
        self
    }

    /// The record cache's budget set ([`Options::record_cache_bytes`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().record_cache_bytes_value(), 0);
    /// ```
    pub fn record_cache_bytes_value(&self) -> usize {
        self.record_cache_bytes
    }

    /// The eviction policy set.
    ///
    /// ```
    /// use dana::EvictionPolicy;
    /// let opts = dana::Options::default();
    /// assert_eq!(opts.eviction_value(), EvictionPolicy::Watt);
    /// assert_eq!(opts.eviction(EvictionPolicy::Clock).eviction_value(), EvictionPolicy::Clock);
    /// ```
    pub fn eviction_value(&self) -> EvictionPolicy {
        self.eviction
    }

    /// Capacity of each worker's queue to each device (default 128; 1 to
    /// [`MAX_QUEUE_DEPTH`]: an open refuses others with
    /// [`crate::Error::InvalidArgument`]).
    ///
    /// ```
    /// let opts = dana::Options::default().queue_depth(64);
    /// assert!(format!("{opts:?}").contains("queue_depth: 64"));
    /// ```
    pub fn queue_depth(mut self, n: u32) -> Self {
        self.queue_depth = n;
        self
    }

    /// Most live tasks per worker (default 4096; an open refuses 0 with
    /// [`crate::Error::InvalidArgument`]).
    ///
    /// ```
    /// let opts = dana::Options::default().max_tasks_per_worker(1024);
    /// assert!(format!("{opts:?}").contains("max_tasks_per_worker: 1024"));
    /// ```
    pub fn max_tasks_per_worker(mut self, n: usize) -> Self {
        self.max_tasks_per_worker = n;
        self
    }

    /// Submit each I/O request on its own instead of batching a worker
    /// round's requests (default false; see [`RuntimeConfig::submit_each`]).
    ///
    /// ```
    /// let opts = dana::Options::default().submit_each(true);
    /// assert!(format!("{opts:?}").contains("submit_each: true"));
    /// ```
    pub fn submit_each(mut self, on: bool) -> Self {
        self.submit_each = on;
        self
    }

    /// How commits wait for the log (default [`Durability::Sync`]);
    /// [`Durability::Off`] creates a database without a log, and opens
    /// one that has none. A database that has a log keeps it: opened
    /// with `Off`, its commits are logged and wait as with
    /// [`Durability::Async`] ([`Db::durability`](crate::Db::durability)
    /// says `Async`).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).durability(dana::Durability::Off);
    /// assert_eq!(opts.durability_value(), dana::Durability::Off);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert!(db.wal_stats().is_none()); // no log
    /// ```
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// The configured durability.
    ///
    /// ```
    /// use dana::Durability;
    /// assert_eq!(dana::Options::default().durability_value(), Durability::Sync);
    /// let opts = dana::Options::default().durability(Durability::Async);
    /// assert_eq!(opts.durability_value(), Durability::Async);
    /// ```
    pub fn durability_value(&self) -> Durability {
        self.durability
    }

    /// With [`Durability::Async`], the longest a commit waits in memory
    /// before a flush starts (default 10 ms). A crash loses the commits of
    /// this window and of the flush in progress, which on a busy disk can
    /// take far longer than the window (while the workers get to run: a
    /// machine short of CPU stretches both).
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = dana::Options::default()
    ///     .durability(dana::Durability::Async)
    ///     .async_window(Duration::from_millis(2));
    /// assert!(format!("{opts:?}").contains("async_window: 2ms"));
    /// ```
    pub fn async_window(mut self, window: Duration) -> Self {
        self.async_window = window;
        self
    }

    /// Bytes of the circular logs, split evenly among them (default 64
    /// MiB; a multiple of 4 KiB; at least 1 MiB and
    /// [`crate::wal::MIN_LOG_PAGES`] pages per log; at most
    /// [`crate::wal::recover::MAX_LOG_BYTES`] each). A checkpoint of one
    /// shard of the pages starts each time 3/8 of a log over the shards
    /// has been appended (a quarter where pages are written whole, see
    /// [`crate::wal::checkpoint_trigger`]), so the redo point stays about
    /// 3/8 of the log behind its end (see [`Options::checkpoint_shards`]):
    /// about what recovery reads and re-applies of each log, up to three
    /// quarters when commits outrun the checkpoints. Recovery reads each
    /// log's stream into memory at open (from the redo point, or the whole
    /// capacity once the log has wrapped), so an open needs up to this
    /// many bytes of memory beside the pool. A new database whose log
    /// files would not fit in their file system's size once grown is
    /// refused ([`crate::Error::InvalidArgument`]; its free space is not
    /// checked).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_bytes_value(), 64 << 20);
    /// // Rounded up to a multiple of 4 KiB.
    /// assert_eq!(dana::Options::default().log_bytes(10_000).log_bytes_value(), 12288);
    /// assert!(dana::Options::default().log_bytes(u64::MAX).log_bytes_value() > 1 << 60);
    /// ```
    pub fn log_bytes(mut self, bytes: u64) -> Self {
        // Saturating: a size within a block of u64::MAX is the largest
        // multiple (refused at open as too large), never a wrap to 0.
        self.log_bytes = bytes
            .div_ceil(control::BLOCK)
            .saturating_mul(control::BLOCK);
        self
    }

    /// Create a new log file whole, zero-filled at creation (default
    /// false: it starts with [`crate::wal::INITIAL_LOG_BYTES`] of its
    /// stream and grows, zero-filled ahead of the flushes, during its
    /// first lap). Growing costs the first lap of a busy new database
    /// write bandwidth (measured in `docs/PERF.md`: `dana bench commit`
    /// on a fresh log); preallocating costs `log_bytes` of disk at once.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).log_bytes(8 << 20).log_preallocate(true);
    /// assert!(opts.log_preallocate_value());
    /// let _db = dana::Db::open(dir.path(), opts).unwrap();
    /// assert!(std::fs::metadata(dir.path().join("dana.wal")).unwrap().len() >= 8 << 20);
    /// ```
    pub fn log_preallocate(mut self, on: bool) -> Self {
        self.log_preallocate = on;
        self
    }

    /// Use the data devices' untorn page writes when every one offers them
    /// (default true). A device whose kernel offers `RWF_ATOMIC` writes of
    /// a page (`statx` `STATX_WRITE_ATOMIC`, Linux 6.11+: NVMe drives
    /// with an atomic write unit of 4 KiB or more, among others) cannot
    /// tear a page it writes that way; on such devices every page
    /// write-back is untorn and the log carries no full page images to
    /// repair torn pages (FORMAT.md, "What is logged"), as out of place.
    /// With false, or on any device that does not offer it (this
    /// project's virtio disk, a mirrored group), pages are written plainly
    /// and the images are logged.
    ///
    /// ```
    /// assert!(dana::Options::default().untorn_page_writes_value());
    /// assert!(!dana::Options::default().untorn_page_writes(false).untorn_page_writes_value());
    /// ```
    pub fn untorn_page_writes(mut self, on: bool) -> Self {
        self.untorn_page_writes = on;
        self
    }

    /// Whether untorn page writes are used where offered
    /// ([`Options::untorn_page_writes`]).
    pub fn untorn_page_writes_value(&self) -> bool {
        self.untorn_page_writes
    }

    /// Log full page images compressed (LZ4) where that makes them smaller
    /// (default false). The log holds a full image of a page at its first
    /// change after a checkpoint began, so that a write-back torn by a
    /// crash can be rebuilt (FORMAT.md, "What is logged"); those images
    /// are most of the log's bytes under inserts and updates. Compressing
    /// them saves log bytes (and the flash they wear) and costs CPU at the
    /// change and at recovery, as PostgreSQL's `wal_compression` does
    /// (off there by default too). Measured (docs/PERF.md): a quarter to a
    /// third fewer log bytes with half-compressible values, for 0.92-0.99x
    /// the inserts per second and 0.98x YCSB-A; TPC-C, whose pages compress
    /// little, saved 8% of its log bytes for 0.82x the transactions on
    /// CPU-bound simulated devices. Recovery reads images either way,
    /// whatever this says.
    ///
    /// ```
    /// assert!(!dana::Options::default().compress_log_images_value());
    /// assert!(dana::Options::default().compress_log_images(true).compress_log_images_value());
    /// ```
    pub fn compress_log_images(mut self, on: bool) -> Self {
        self.compress_log_images = on;
        self
    }

    /// Whether full page images are logged compressed
    /// ([`Options::compress_log_images`]).
    pub fn compress_log_images_value(&self) -> bool {
        self.compress_log_images
    }

    /// How a log flush is made durable (default 16 KiB): a flush of at
    /// most `bytes` is one durable write (`RWF_DSYNC`: the kernel sets FUA,
    /// or flushes the disk's cache after the write on a disk without FUA),
    /// which completes the flush by itself; a larger one is its write(s),
    /// then one `fdatasync`: two round trips through the worker's queue.
    /// 0: every flush is write + fdatasync; `u64::MAX`: every flush is a
    /// durable write. Both are equally durable; the default comes from
    /// `dana bench commit` on this project's disk (`docs/PERF.md`): a lone
    /// commit or a small group commits 20-35% faster with a durable write,
    /// while groups of a hundred commits (~70 KB) ran up to 2x slower as
    /// one durable write than as write + fdatasync.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).log_write_through_max(0);
    /// assert_eq!(opts.log_write_through_max_value(), 0);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap(); // synced by write + fdatasync
    /// ```
    pub fn log_write_through_max(mut self, bytes: u64) -> Self {
        self.log_write_through_max = bytes;
        self
    }

    /// How many flushes of one log may be in flight at once (default 1,
    /// at most [`crate::wal::MAX_FLUSHES_IN_FLIGHT`]). With more than one,
    /// commits that arrive while a flush is in flight start the next one
    /// at once instead of waiting for it; a commit is still acknowledged
    /// only when every flush before its own is durable too. Recovery
    /// judges a break followed by a flush that was in flight beside it a
    /// torn tail, as it does the last flush (`docs/FORMAT.md`).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).log_flushes_in_flight(2);
    /// assert_eq!(opts.log_flushes_in_flight_value(), 2);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// ```
    pub fn log_flushes_in_flight(mut self, n: usize) -> Self {
        self.log_flushes_in_flight = n;
        self
    }

    /// The most flushes of one log in flight at once (see
    /// [`Options::log_flushes_in_flight`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_flushes_in_flight_value(), 1);
    /// ```
    pub fn log_flushes_in_flight_value(&self) -> usize {
        self.log_flushes_in_flight
    }

    /// The largest log flush made durable by a durable write (see
    /// [`Options::log_write_through_max`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_write_through_max_value(), 16 << 10);
    /// ```
    pub fn log_write_through_max_value(&self) -> u64 {
        self.log_write_through_max
    }

    /// The unit a new log pads each flush to (default 0: the log device's
    /// alignment, at least 512 bytes; else a power of two from that
    /// alignment up to 4096). A flush never rewrites a block that holds
    /// durable records, so with 4096 no flush rewrites a 4 KiB flash page:
    /// small group commits each take a page of their own, and an SSD does
    /// not keep copying the last version of pages rewritten by several
    /// small flushes (`dana bench waf`: see `docs/PERF.md`), at the cost of
    /// more log bytes per flush. Chosen when the log is formatted and kept
    /// in its control blocks: an existing log keeps its own, whatever this
    /// says.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20).log_flush_block(4096);
    /// assert_eq!(opts.log_flush_block_value(), 4096);
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// ```
    pub fn log_flush_block(mut self, bytes: u64) -> Self {
        self.log_flush_block = bytes;
        self
    }

    /// The log flush block asked for (see [`Options::log_flush_block`]).
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_flush_block_value(), 0);
    /// ```
    pub fn log_flush_block_value(&self) -> u64 {
        self.log_flush_block
    }

    /// Where the log file lives (default: `dana.wal` in the database
    /// directory, or the first device's path with `.wal` appended).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = dir.path().join("elsewhere.wal");
    /// let opts = dana::Options::default().pool_bytes(8 << 20).log_path(&log);
    /// assert_eq!(opts.log_path_value(), Some(&log));
    /// let _db = dana::Db::open(dir.path().join("db"), opts).unwrap();
    /// assert!(log.exists());
    /// assert!(!dir.path().join("db").join("dana.wal").exists());
    /// ```
    pub fn log_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_path = Some(path.into());
        self
    }

    /// Opens the database read-only (default false): nothing is ever
    /// written to its files (no recovery, no checkpoint, no log format);
    /// writes fail with [`crate::Error::ReadOnly`]; a database that needs
    /// recovery fails to open with [`crate::Error::NeedsRecovery`]. Takes a
    /// shared lock: many read-only opens may coexist, never with a
    /// writable one.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = dana::Options::default().pool_bytes(8 << 20);
    /// let db = dana::Db::open(dir.path(), opts.clone()).unwrap();
    /// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
    /// db.close().unwrap();
    /// let opts = opts.read_only();
    /// assert!(opts.is_read_only());
    /// let db = dana::Db::open(dir.path(), opts).unwrap();
    /// let t = db.tree("t").unwrap();
    /// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
    /// assert!(matches!(t.put(b"k", b"w"), Err(dana::Error::ReadOnly)));
    /// ```
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The page size set.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().page_size_value(), 4096);
    /// assert_eq!(dana::Options::default().page_size(16384).page_size_value(), 16384);
    /// ```
    pub fn page_size_value(&self) -> usize {
        self.page_size
    }

    /// The maximum size set (None: no limit but the devices').
    ///
    /// ```
    /// assert_eq!(dana::Options::default().capacity_bytes_value(), None);
    /// let opts = dana::Options::default().capacity_bytes(64 << 20);
    /// assert_eq!(opts.capacity_bytes_value(), Some(64 << 20));
    /// ```
    pub fn capacity_bytes_value(&self) -> Option<u64> {
        self.capacity_bytes
    }

    /// The number of devices set.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().devices_value(), 1);
    /// assert_eq!(dana::Options::default().devices(4).devices_value(), 4);
    /// ```
    pub fn devices_value(&self) -> usize {
        self.devices
    }

    /// Whether `O_DIRECT` is used.
    ///
    /// ```
    /// assert!(dana::Options::default().direct_value());
    /// assert!(!dana::Options::default().direct_io(false).direct_value());
    /// ```
    pub fn direct_value(&self) -> bool {
        self.direct
    }

    /// The log size set.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_bytes_value(), 64 << 20);
    /// assert_eq!(dana::Options::default().log_bytes(1 << 20).log_bytes_value(), 1 << 20);
    /// ```
    pub fn log_bytes_value(&self) -> u64 {
        self.log_bytes
    }

    /// Whether a new log file is created whole.
    ///
    /// ```
    /// assert!(!dana::Options::default().log_preallocate_value());
    /// assert!(dana::Options::default().log_preallocate(true).log_preallocate_value());
    /// ```
    pub fn log_preallocate_value(&self) -> bool {
        self.log_preallocate
    }

    /// The log path set, if any.
    ///
    /// ```
    /// assert_eq!(dana::Options::default().log_path_value(), None);
    /// let opts = dana::Options::default().log_path("/tmp/db.wal");
    /// assert_eq!(opts.log_path_value(), Some(&std::path::PathBuf::from("/tmp/db.wal")));
    /// ```
    pub fn log_path_value(&self) -> Option<&PathBuf> {
        self.log_path.as_ref()
    }

    /// The identity given to a log this open formats (default: random).
    /// For deterministic simulation, where two runs with one seed must
    /// write the same bytes; never share one identity between databases.
    ///
    /// ```
    /// let opts = dana::Options::default().log_identity(42);
    /// assert!(format!("{opts:?}").contains("log_identity: Some(42)"));
    /// // 0 is not an identity: it becomes 1.
    /// let opts = dana::Options::default().log_identity(0);
    /// assert!(format!("{opts:?}").contains("log_identity: Some(1)"));
    /// ```
    pub fn log_identity(mut self, id: u64) -> Self {
        self.log_identity = Some(id.max(1));
        self
    }

    /// True if [`Options::read_only`] was set.
    ///
    /// ```
    /// assert!(!dana::Options::default().is_read_only());
    /// assert!(dana::Options::default().read_only().is_read_only());
    /// ```
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Checks the settings an open cannot work with, before anything is
    /// opened or created.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        let ps = self.page_size;
        if !ps.is_power_of_two() || !(4096..=65536).contains(&ps) {
            return Err(crate::Error::InvalidArgument(format!(
                "page size {ps}: a power of two from 4096 to 65536 (Options::page_size)"
            )));
        }
        if self.devices > MAX_DEVICES {
            return Err(crate::Error::InvalidArgument(format!(
                "{} devices: at most {MAX_DEVICES} (Options::devices)",
                self.devices
            )));
        }
        // The meta page, the catalog and the space map's first pages on
        // every device, and room to write: fewer pages than this cannot
        // hold a database (0 read as "page 1 is beyond the end").
        let least = MIN_CAPACITY_PAGES * ps as u64 * self.devices.max(1) as u64;
        if let Some(cap) = self.capacity_bytes.filter(|&c| c < least) {
            return Err(crate::Error::InvalidArgument(format!(
                "capacity of {cap} bytes: at least {MIN_CAPACITY_PAGES} pages per device \
                 ({least} bytes here; Options::capacity_bytes)"
            )));
        }
        let frames = self.pool_bytes / ps;
        if frames < MIN_POOL_FRAMES {
            return Err(crate::Error::InvalidArgument(format!(
                "a buffer pool of {} bytes holds {frames} pages of {ps} bytes: at least \
                 {MIN_POOL_FRAMES} (Options::pool_bytes)",
                self.pool_bytes
            )));
        }
        // Checked here and not when the workers or the logs start: by
        // then recovery had redone pages onto the files.
        if self.workers == 0 {
            return Err(crate::Error::InvalidArgument(
                "0 workers: at least one is needed (Options::workers)".into(),
            ));
        }
        // Counts past these overflowed the sizes computed from them (a
        // panic), or asked the allocator for terabytes (the process
        // aborted), or ran out of threads or files after seconds (an
        // outside probe's finding).
        if self.workers > MAX_WORKERS {
            return Err(crate::Error::InvalidArgument(format!(
                "{} workers: at most {MAX_WORKERS} (Options::workers)",
                self.workers
            )));
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&self.queue_depth) {
            return Err(crate::Error::InvalidArgument(format!(
                "queue depth {}: 1 to {MAX_QUEUE_DEPTH} (Options::queue_depth)",
                self.queue_depth
            )));
        }
        if self.max_tasks_per_worker == 0 {
            return Err(crate::Error::InvalidArgument(
                "0 tasks per worker: at least one is needed (Options::max_tasks_per_worker)".into(),
            ));
        }
        // `logs(0)` means one per worker and is capped at the most a meta
        // page names; a count asked for by number is not cut silently.
        if self.logs > crate::wal::MAX_LOGS {
            return Err(crate::Error::InvalidArgument(format!(
                "{} logs: at most {} (Options::logs)",
                self.logs,
                crate::wal::MAX_LOGS
            )));
        }
        let most = crate::wal::MAX_FLUSHES_IN_FLIGHT;
        if !(1..=most).contains(&self.log_flushes_in_flight) {
            return Err(crate::Error::InvalidArgument(format!(
                "{} log flushes in flight: 1 to {most} (Options::log_flushes_in_flight)",
                self.log_flushes_in_flight
            )));
        }
        let block = self.log_flush_block;
        if block != 0 && (!block.is_power_of_two() || block > control::BLOCK) {
            return Err(crate::Error::InvalidArgument(format!(
                "log flush block {block}: 0 or a power of two up to {} bytes \
                 (Options::log_flush_block)",
                control::BLOCK
            )));
        }
        // The cache sizes its filters from its budget when the database
        // opens: a budget past the machine's memory aborted the process
        // on that allocation (`record_cache_bytes(usize::MAX)`).
        let memory = crate::io::physical_memory_bytes();
        if self.pool_bytes as u64 > memory {
            return Err(crate::Error::InvalidArgument(format!(
                "a buffer pool of {} bytes: more than this machine's {memory} bytes of memory \
                 (Options::pool_bytes)",
                self.pool_bytes
            )));
        }
        if self.record_cache_bytes as u64 > memory {
            return Err(crate::Error::InvalidArgument(format!(
                "a record cache of {} bytes: more than this machine's {memory} bytes of \
                 memory (Options::record_cache_bytes)",
                self.record_cache_bytes
            )));
        }
        if self.compress_pages && self.write_mode != WriteMode::OutOfPlace {
            return Err(crate::Error::InvalidArgument(
                "compressed pages (Options::compress_pages) need out-of-place writes \
                 (Options::write_mode(WriteMode::OutOfPlace))"
                    .into(),
            ));
        }
        if self.write_mode == WriteMode::OutOfPlace && self.mirror_copies > 1 {
            return Err(crate::Error::InvalidArgument(
                "out-of-place writes (Options::write_mode) do not take mirrors yet".into(),
            ));
        }
        Ok(())
    }

    /// How a new out-of-place data file is cut ([`Options::write_mode`]).
    pub(crate) fn remap_config(&self) -> crate::io::remap::RemapConfig {
        crate::io::remap::RemapConfig {
            page_size: self.page_size as u32,
            compress: self.compress_pages,
            ..Default::default()
        }
    }

    pub(crate) fn runtime_config(&self) -> RuntimeConfig {
        RuntimeConfig {
            workers: self.workers,
            queue_depth: self.queue_depth,
            device_budget: self.device_budget,
            adaptive_budget: self.adaptive_budget,
            max_tasks_per_worker: self.max_tasks_per_worker,
            submit_each: self.submit_each,
            ..RuntimeConfig::default()
        }
    }
}
