//! dana's error type: one enum callers can match on, each variant carrying
//! enough context (device, offset, page) to say what went wrong where.
//!
//! The library never panics on bad input or on an I/O error; it returns one
//! of these. Panics are reserved for broken internal invariants.

use std::path::PathBuf;

/// What kind of I/O operation a request or an error is about.
///
/// ```
/// use dana::io::sim::{Fault, SimConfig, SimDisk};
/// use dana::io::{Array, Target};
/// use dana::{Error, OpKind};
/// let disk = SimDisk::new(0, 16 << 20, SimConfig::default());
/// let array = || Array::new(vec![Target::Sim(disk.clone())], 4096).unwrap();
/// let opts = dana::Options::default().pool_bytes(8 << 20);
/// let db = dana::Db::open_array(array(), opts.clone(), true).unwrap();
/// db.create_tree("t").unwrap().put(b"k", b"v").unwrap();
/// db.close().unwrap();
/// let db = dana::Db::open_array(array(), opts, false).unwrap();
/// let t = db.tree("t").unwrap();
/// disk.inject(Fault::nth(Some(OpKind::Read), 0)); // the next read fails
/// let e = t.get(b"k").unwrap_err();
/// let Error::Io { op, device, len, .. } = &e else { panic!("{e:?}") };
/// assert_eq!((*op, *device, *len), (OpKind::Read, 0, 4096));
/// assert_eq!(op.to_string(), "read");
/// assert!(e.to_string().starts_with("read of 4096 bytes at offset"));
/// // A failed read is not sticky: the fault is spent, the next read works.
/// assert_eq!(t.get(b"k").unwrap(), Some(b"v".to_vec()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write `len` bytes at `offset`.
    Write,
    /// Make every completed write on the device durable (fdatasync).
    Flush,
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
        })
    }
}

/// Every error dana returns. Fields name the device, offset, page or
/// path involved.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// use dana::Error;
/// let t = db.create_tree("t").unwrap();
/// t.insert(b"k", b"v").unwrap();
/// let e = t.insert(b"k", b"w").unwrap_err();
/// assert!(matches!(e, Error::KeyExists));
/// assert_eq!(e.to_string(), "key already exists");
/// // Variants with fields say what was too large and by how much.
/// let long_key = vec![0u8; t.max_key_len() + 1];
/// match t.put(&long_key, b"v") {
///     Err(Error::KeyTooLarge { len, max }) => {
///         assert_eq!((len, max), (long_key.len(), t.max_key_len()));
///     }
///     other => panic!("{other:?}"),
/// }
/// assert!(matches!(db.tree("missing"), Err(Error::NoSuchTree(name)) if name == "missing"));
/// ```
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening, creating or sizing a file or block device failed.
    #[error("cannot {action} {path}: {source}")]
    Open {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An I/O request failed on a device.
    #[error("{op} of {len} bytes at offset {offset} on device {device} failed: {source}")]
    Io {
        op: OpKind,
        device: usize,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },

    /// A read or write returned fewer bytes than asked for.
    #[error("short {op} on device {device} at offset {offset}: {done} of {len} bytes")]
    ShortIo {
        op: OpKind,
        device: usize,
        offset: u64,
        len: usize,
        done: usize,
    },

    /// An offset, length or buffer address does not meet the device's
    /// direct-I/O alignment.
    #[error("misaligned {what}: {value} is not a multiple of {align} (device {device})")]
    Misaligned {
        what: &'static str,
        value: u64,
        align: u64,
        device: usize,
    },

    /// A request reaches past the end of its device.
    #[error("{op} at offset {offset} of {len} bytes is beyond the end of device {device} ({size} bytes)")]
    OutOfRange {
        op: OpKind,
        device: usize,
        offset: u64,
        len: usize,
        size: u64,
    },

    /// Setting up or driving an I/O backend failed (io_uring setup,
    /// registration, submission).
    #[error("I/O backend {backend}: {what}: {source}")]
    Backend {
        backend: &'static str,
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A feature was asked for that this device or kernel cannot give.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// Data read from storage failed validation (checksum, magic, layout).
    #[error("corrupt page {page}: {what}")]
    Corrupt { page: u64, what: String },

    /// A caller passed a value dana cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// `insert` of a key that is already present.
    #[error("key already exists")]
    KeyExists,

    /// A named tree does not exist.
    #[error("no tree named {0:?}")]
    NoSuchTree(String),

    /// A key longer than a tree accepts ([`crate::Tree::max_key_len`]:
    /// about an eighth of the page, so two maximal fences and two maximal
    /// entries fit one node: 491 bytes with 4 KiB pages).
    #[error("a key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLarge { len: usize, max: usize },

    /// A value longer than a tree accepts ([`crate::Tree::max_value_len`]).
    #[error("a value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },

    /// A tree name longer than the catalogue accepts (as long as a key).
    #[error("a tree name of {len} bytes exceeds the limit of {max} bytes")]
    TreeNameTooLong { len: usize, max: usize },

    /// Something else larger than its limit (a log record larger than an
    /// eighth of the log: a transaction too large for the log).
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },

    /// No space for this write: the database reached its maximum size
    /// ([`crate::Options::capacity_bytes`], or a block device's size), or
    /// the file system is full (`ENOSPC` while growing a file). Nothing of
    /// the failed write is logged; every commit acknowledged before stays,
    /// reads go on, and writes succeed again once space is freed.
    #[error("no space: {0}")]
    NoSpace(String),

    /// An earlier failed write or sync made the database refuse further
    /// writes (the failure is never silently retried).
    #[error("database is poisoned by an earlier failure: {0}")]
    Poisoned(String),

    /// The operation needs I/O, and the calling thread is not one of the
    /// engine's workers (run it inside a task).
    #[error("the operation needs I/O and must run on a worker (inside a task)")]
    WouldBlock,

    /// A task spawned a task onto a worker whose queue of new tasks is
    /// full. A thread that is not a worker waits for room; a task must
    /// not block its worker, so it gets this error: yield
    /// (`dana::sched::yield_now`) and try again.
    #[error("worker {worker}'s queue of new tasks is full ({capacity}); a task cannot wait for room, yield and retry")]
    QueueFull { worker: usize, capacity: usize },

    /// The log is damaged in a way recovery cannot get past (a record
    /// that checks out but does not decode, a log too small for its
    /// control block).
    #[error("write-ahead log: {0}")]
    Log(String),

    /// A transaction read a key that another commit changed before it
    /// could commit; nothing of it was applied (run it again).
    #[error("transaction conflict: {0}")]
    Conflict(String),

    /// The engine is shutting down or has shut down.
    #[error("the engine is shut down")]
    Shutdown,

    /// The database was closed ([`crate::Db::close`]); every handle of it
    /// (trees, transactions) fails with this from then on.
    #[error("the database is closed")]
    Closed,

    /// Another open handle (in this process or another) holds the
    /// database: a writable open needs it alone, a read-only open needs
    /// no writer. Nothing was touched.
    #[error("{path} is locked: the database is open elsewhere (this process or another)")]
    Locked { path: PathBuf },

    /// The files are not a dana database, or were written by a format
    /// version this build cannot read, or with another page size.
    #[error("{path}: {what}")]
    NotADatabase { path: PathBuf, what: String },

    /// A read-only open found a log with changes not yet applied to the
    /// data files; open it writable once to recover.
    #[error("the database needs recovery (open it writable once): {0}")]
    NeedsRecovery(String),

    /// A write was attempted on a database opened read-only.
    #[error("the database is open read-only")]
    ReadOnly,

    /// A mirrored device cannot go on: no healthy copy is left, no copy
    /// could record a change of state, or its copies' labels disagree
    /// about what they hold.
    #[error("mirror: {0}")]
    Mirror(String),

    /// The write-ahead log is damaged where it had been durable (not a
    /// torn tail): acknowledged commits after `offset` cannot be trusted.
    /// `offset` is the byte offset in the log file.
    #[error("corrupt log at file offset {offset}: {what}")]
    CorruptLog { offset: u64, what: String },
}

/// dana's result type.
///
/// ```
/// fn counter(t: &dana::Tree, key: &[u8]) -> dana::Result<u64> {
///     let v = t.get(key)?.ok_or_else(|| dana::Error::InvalidArgument("no counter".into()))?;
///     Ok(u64::from_le_bytes(v.try_into().unwrap()))
/// }
/// # let dir = tempfile::tempdir().unwrap();
/// # let db = dana::Db::open(dir.path(), dana::Options::default().pool_bytes(8 << 20).capacity_bytes(64 << 20)).unwrap();
/// let t = db.create_tree("t").unwrap();
/// t.put(b"n", &7u64.to_le_bytes()).unwrap();
/// assert_eq!(counter(&t, b"n").unwrap(), 7);
/// assert!(matches!(counter(&t, b"m"), Err(dana::Error::InvalidArgument(_))));
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error for an I/O request that failed with `errno`.
    ///
    /// ```
    /// use dana::{Error, OpKind};
    /// let e = Error::io(OpKind::Read, 1, 8192, 4096, libc::EIO);
    /// let Error::Io { op, device, offset, len, source } = &e else { panic!("{e:?}") };
    /// assert_eq!((*op, *device, *offset, *len), (OpKind::Read, 1, 8192, 4096));
    /// assert_eq!(source.raw_os_error(), Some(libc::EIO));
    /// assert!(e.to_string().starts_with("read of 4096 bytes at offset 8192 on device 1 failed"));
    /// ```
    pub fn io(op: OpKind, device: usize, offset: u64, len: usize, errno: i32) -> Error {
        Error::Io {
            op,
            device,
            offset,
            len,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    /// A copy of this error for a second waiter on the same failure
    /// (std::io::Error is not Clone; the kind and message are kept).
    ///
    /// ```
    /// use dana::{Error, OpKind};
    /// let e = Error::io(OpKind::Write, 0, 0, 4096, libc::ENOSPC);
    /// let copy = e.duplicate();
    /// assert_eq!(copy.to_string(), e.to_string());
    /// let Error::Io { source, .. } = copy else { panic!() };
    /// assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
    /// // An error without an OS code keeps its kind and message.
    /// let e = Error::Open {
    ///     action: "open",
    ///     path: "/nowhere".into(),
    ///     source: std::io::Error::new(std::io::ErrorKind::NotFound, "gone"),
    /// };
    /// let Error::Open { source, .. } = e.duplicate() else { panic!() };
    /// assert_eq!((source.kind(), source.to_string()), (std::io::ErrorKind::NotFound, "gone".to_string()));
    /// ```
    pub fn duplicate(&self) -> Error {
        fn dup(e: &std::io::Error) -> std::io::Error {
            match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }
        }
        match self {
            Error::Open {
                action,
                path,
                source,
            } => Error::Open {
                action,
                path: path.clone(),
                source: dup(source),
            },
            Error::Io {
                op,
                device,
                offset,
                len,
                source,
            } => Error::Io {
                op: *op,
                device: *device,
                offset: *offset,
                len: *len,
                source: dup(source),
            },
            Error::ShortIo {
                op,
                device,
                offset,
                len,
                done,
            } => Error::ShortIo {
                op: *op,
                device: *device,
                offset: *offset,
                len: *len,
                done: *done,
            },
            Error::Misaligned {
                what,
                value,
                align,
                device,
            } => Error::Misaligned {
                what,
                value: *value,
                align: *align,
                device: *device,
            },
            Error::OutOfRange {
                op,
                device,
                offset,
                len,
                size,
            } => Error::OutOfRange {
                op: *op,
                device: *device,
                offset: *offset,
                len: *len,
                size: *size,
            },
            Error::Backend {
                backend,
                what,
                source,
            } => Error::Backend {
                backend,
                what: what.clone(),
                source: dup(source),
            },
            Error::Unsupported(s) => Error::Unsupported(s.clone()),
            Error::Corrupt { page, what } => Error::Corrupt {
                page: *page,
                what: what.clone(),
            },
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::KeyTooLarge { len, max } => Error::KeyTooLarge {
                len: *len,
                max: *max,
            },
            Error::ValueTooLarge { len, max } => Error::ValueTooLarge {
                len: *len,
                max: *max,
            },
            Error::TreeNameTooLong { len, max } => Error::TreeNameTooLong {
                len: *len,
                max: *max,
            },
            Error::TooLarge { what, len, max } => Error::TooLarge {
                what,
                len: *len,
                max: *max,
            },
            Error::NoSpace(s) => Error::NoSpace(s.clone()),
            Error::Poisoned(s) => Error::Poisoned(s.clone()),
            Error::WouldBlock => Error::WouldBlock,
            Error::QueueFull { worker, capacity } => Error::QueueFull {
                worker: *worker,
                capacity: *capacity,
            },
            Error::KeyExists => Error::KeyExists,
            Error::NoSuchTree(s) => Error::NoSuchTree(s.clone()),
            Error::Shutdown => Error::Shutdown,
            Error::Log(s) => Error::Log(s.clone()),
            Error::Conflict(s) => Error::Conflict(s.clone()),
            Error::Closed => Error::Closed,
            Error::Locked { path } => Error::Locked { path: path.clone() },
            Error::NotADatabase { path, what } => Error::NotADatabase {
                path: path.clone(),
                what: what.clone(),
            },
            Error::NeedsRecovery(s) => Error::NeedsRecovery(s.clone()),
            Error::ReadOnly => Error::ReadOnly,
            Error::Mirror(s) => Error::Mirror(s.clone()),
            Error::CorruptLog { offset, what } => Error::CorruptLog {
                offset: *offset,
                what: what.clone(),
            },
        }
    }
}
