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

/// Bytes a new database's data files start with, all devices together
/// (less if [`Options::capacity_bytes`] is smaller). They grow on demand.
pub const INITIAL_DATA_BYTES: u64 = 1 << 20;

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
    pub(crate) pool_bytes: usize,
    pub(crate) workers: usize,
    pub(crate) page_size: usize,
    pub(crate) backend: Backend,
    pub(crate) devices: usize,
    pub(crate) capacity_bytes: Option<u64>,
    pub(crate) direct: bool,
    pub(crate) queue_depth: u32,
    pub(crate) device_budget: usize,
    pub(crate) max_tasks_per_worker: usize,
    pub(crate) submit_each: bool,
    pub(crate) durability: Durability,
    pub(crate) async_window: Duration,
    pub(crate) log_bytes: u64,
    pub(crate) log_preallocate: bool,
    pub(crate) log_path: Option<PathBuf>,
    pub(crate) read_only: bool,
    pub(crate) log_identity: Option<u64>,
    pub(crate) eviction: EvictionPolicy,
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
            capacity_bytes: None,
            direct: true,
            queue_depth: rt.queue_depth,
            device_budget: rt.device_budget,
            max_tasks_per_worker: rt.max_tasks_per_worker,
            submit_each: rt.submit_each,
            durability: Durability::Sync,
            async_window: Duration::from_millis(10),
            log_bytes: 64 << 20,
            log_preallocate: false,
            log_path: None,
            read_only: false,
            log_identity: None,
            eviction: EvictionPolicy::default(),
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

    /// The most bytes the database's data files may grow to, split over
    /// the devices (default: no limit but the file system's, or a block
    /// device's size). A new database starts at
    /// [`crate::INITIAL_DATA_BYTES`] (or this maximum, if smaller) and its
    /// files grow in steps of `clamp(size / 32, 16 MiB, 1 GiB)` ahead of
    /// need; a write that would pass the maximum fails with
    /// [`crate::Error::NoSpace`] before it is logged.
    pub fn capacity_bytes(mut self, bytes: u64) -> Self {
        self.capacity_bytes = Some(bytes);
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

    /// How the buffer pool picks pages to evict and dirty pages to write
    /// back (default [`EvictionPolicy::Watt`], write-aware; `Clock` is
    /// second chance, kept as the benchmarks' baseline). Eviction write-backs
    /// use at most half of the device budget, so reads keep the rest.
    pub fn eviction(mut self, policy: EvictionPolicy) -> Self {
        self.eviction = policy;
        self
    }

    /// The eviction policy set.
    pub fn eviction_value(&self) -> EvictionPolicy {
        self.eviction
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

    /// How commits wait for the log (default [`Durability::Sync`]);
    /// [`Durability::Off`] opens the database without a log.
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// The configured durability.
    pub fn durability_value(&self) -> Durability {
        self.durability
    }

    /// With [`Durability::Async`], the longest a commit waits in memory
    /// before a flush starts (default 10 ms): the most a crash can lose.
    pub fn async_window(mut self, window: Duration) -> Self {
        self.async_window = window;
        self
    }

    /// Bytes of the circular log (default 64 MiB; a multiple of 4 KiB; at
    /// most [`crate::wal::recover::MAX_LOG_BYTES`]).
    /// A checkpoint starts when a quarter of it is in use.
    pub fn log_bytes(mut self, bytes: u64) -> Self {
        self.log_bytes = bytes.div_ceil(control::BLOCK) * control::BLOCK;
        self
    }

    /// Create a new log file whole, zero-filled at creation (default
    /// false: it starts with [`crate::wal::INITIAL_LOG_BYTES`] of its
    /// stream and grows, zero-filled ahead of the flushes, during its
    /// first lap). Growing costs the first lap of a busy new database
    /// write bandwidth (measured in `docs/PERF.md`: `dana bench commit`
    /// on a fresh log); preallocating costs `log_bytes` of disk at once.
    pub fn log_preallocate(mut self, on: bool) -> Self {
        self.log_preallocate = on;
        self
    }

    /// Where the log file lives (default: `dana.wal` in the database
    /// directory, or the first device's path with `.wal` appended).
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
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The page size set.
    pub fn page_size_value(&self) -> usize {
        self.page_size
    }

    /// The maximum size set (None: no limit but the devices').
    pub fn capacity_bytes_value(&self) -> Option<u64> {
        self.capacity_bytes
    }

    /// The number of devices set.
    pub fn devices_value(&self) -> usize {
        self.devices
    }

    /// Whether `O_DIRECT` is used.
    pub fn direct_value(&self) -> bool {
        self.direct
    }

    /// The log size set.
    pub fn log_bytes_value(&self) -> u64 {
        self.log_bytes
    }

    /// Whether a new log file is created whole.
    pub fn log_preallocate_value(&self) -> bool {
        self.log_preallocate
    }

    /// The log path set, if any.
    pub fn log_path_value(&self) -> Option<&PathBuf> {
        self.log_path.as_ref()
    }

    /// The identity given to a log this open formats (default: random).
    /// For deterministic simulation, where two runs with one seed must
    /// write the same bytes; never share one identity between databases.
    pub fn log_identity(mut self, id: u64) -> Self {
        self.log_identity = Some(id.max(1));
        self
    }

    /// True if [`Options::read_only`] was set.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn runtime_config(&self) -> RuntimeConfig {
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
