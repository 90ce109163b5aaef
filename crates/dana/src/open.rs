//! Opening a database's files: the locks, the data files and the log, the
//! checks that they hold a dana database of this build's format, and the
//! removal of whatever a failed open created.
//!
//! Owns: the order of an open. First the locks (an advisory `flock` on the
//! directory itself and on every data file and the log: exclusive for a
//! writable open, shared for a read-only one; a conflict is
//! [`Error::Locked`] before anything is created or written). Then the
//! existing data files are identified by their meta page (magic, format
//! version, page size, width: [`Error::NotADatabase`] otherwise) before any
//! other file is created. Creating a database syncs its files and its
//! directory. [`Undo`] removes every file and directory this open created
//! if it fails later, so a failed open leaves the directory as it found it.
//!
//! Never: writes to an existing file before the locks are held and the
//! meta page checked; creates anything in read-only mode; creates a log
//! for a database whose meta page names one (a missing log is an error,
//! never a silent reset).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::buffer::alloc::{meta_facts, MetaFacts};
use crate::io::device::{lock_file, unlock_file, DeviceOptions};
use crate::io::{open_queue, AlignedBuf, Array, Backend, Device, IoBuf, Request, Target};
use crate::options::INITIAL_DATA_BYTES;
use crate::wal::INITIAL_LOG_BYTES;
use crate::wal::{Durability, CONTROL_BYTES};
use crate::{Error, Options, Result};

/// Files and directories created by an open, removed on drop unless the
/// open succeeded ([`Undo::keep`]).
#[derive(Default)]
pub(crate) struct Undo {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    keep: bool,
}

impl Undo {
    /// The open succeeded: keep what it created.
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }

    fn created_file(&mut self, p: &Path) {
        self.files.push(p.to_path_buf());
    }

    /// Creates `dir` and its missing parents, remembering each.
    fn create_dir(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(d) = at {
            if d.as_os_str().is_empty() || d.exists() {
                break;
            }
            missing.push(d.to_path_buf());
            at = d.parent();
        }
        for d in missing.iter().rev() {
            std::fs::create_dir(d).map_err(|source| Error::Open {
                action: "create directory",
                path: d.clone(),
                source,
            })?;
            self.dirs.push(d.clone());
        }
        Ok(())
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for f in self.files.iter().rev() {
            let _ = std::fs::remove_file(f);
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The locks an open database holds, released at close (and with the
/// descriptors when the last handle goes).
#[derive(Default)]
pub(crate) struct Locks {
    dir: Option<File>,
    devices: Vec<Arc<Device>>,
}

impl Locks {
    /// Releases every lock now (the files stay open until the last handle
    /// drops, but no I/O goes through them any more).
    pub(crate) fn release(&self) {
        if let Some(d) = &self.dir {
            unlock_file(d);
        }
        for d in &self.devices {
            d.unlock();
        }
    }

    fn device(&mut self, t: &Target) {
        // Explicit release on drop (below): an io_uring instance torn down
        // by the kernel in the background may hold a file a while longer,
        // and with it the lock.
        if let Target::File(d) = t {
            self.devices.push(d.clone());
        }
    }
}

impl Drop for Locks {
    fn drop(&mut self) {
        self.release();
    }
}

/// What an open found and opened.
pub(crate) struct Opened {
    pub(crate) array: Array,
    /// The log files, if the database has logs (or they were created):
    /// log `i` at index `i`.
    pub(crate) logs: Vec<Target>,
    /// True if the database is new (to be formatted).
    pub(crate) create: bool,
    /// The meta page's facts of an existing database.
    pub(crate) meta: Option<MetaFacts>,
    pub(crate) locks: Locks,
    /// Directories to sync once the new database is formatted.
    pub(crate) sync_dirs: Vec<PathBuf>,
}

fn device_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("dana.{i}"))
}

/// Bytes each file of a new database starts with: a share of
/// [`INITIAL_DATA_BYTES`] (or of the maximum size, if smaller), at least
/// one page; the files grow from there.
fn per_device_bytes(opts: &Options, devices: usize) -> u64 {
    let ps = opts.page_size_value() as u64;
    let total = opts
        .capacity_bytes_value()
        .map_or(INITIAL_DATA_BYTES, |max| max.min(INITIAL_DATA_BYTES));
    ((total / devices as u64) / ps * ps).max(ps)
}

/// Reads the first 4096 bytes of `t` synchronously.
fn read_first_page(t: &Target) -> Result<Vec<u8>> {
    let mut q = open_queue(t, &Backend::Blocking, 4)?;
    let buf = AlignedBuf::new(4096, 4096)?;
    let c = crate::wal::recover::sync_io(q.as_mut(), Request::read(0, 0, IoBuf::owned(buf)))?;
    c.result?;
    let b = c
        .buf
        .and_then(IoBuf::into_owned)
        .ok_or_else(|| Error::InvalidArgument("a read completed without its buffer".into()))?;
    Ok(b[..4096].to_vec())
}

/// When the meta page does not identify the database, a meta page torn
/// by a crash (its first sector garbage) is still ours if the log beside
/// it is valid: recovery repairs the page from the log's full image, and
/// the pool checks it after. Returns the facts to go on with, or None.
pub(crate) fn torn_meta_fallback(
    e: &Error,
    log: Option<&Target>,
    width: usize,
    opts: &Options,
) -> Option<MetaFacts> {
    match e {
        Error::NotADatabase { what, .. } if what.contains("no DANAMETA magic") => {}
        _ => return None,
    }
    let ctl = crate::wal::recover::read_control(log?).ok()??;
    Some(MetaFacts {
        page_size: opts.page_size_value(),
        width,
        log_id: ctl.log_id,
        logs: ctl.count,
    })
}

/// Opens `path` read-only, unlocked, to look at a log's control block.
fn peek_log(path: &Path, index: usize) -> Option<Target> {
    let dopts = DeviceOptions {
        direct: false,
        create_size: None,
        read_only: true,
        lock: false,
    };
    Device::open(path, index, dopts)
        .ok()
        .map(|d| Target::File(Arc::new(d)))
}

/// The meta page facts of an array's first device (no path known: a
/// simulated or caller-owned device), checked against `opts`.
pub(crate) fn identify_target(t: &Target, opts: &Options) -> Result<MetaFacts> {
    let paths = [PathBuf::from("device 0")];
    identify(std::slice::from_ref(t), &paths, opts).or_else(|e| match e {
        // The width is checked by the caller against the whole array.
        Error::NotADatabase { what, .. } if what.contains("striped over") => {
            meta_facts(&read_first_page(t)?).map_err(|what| Error::NotADatabase {
                path: paths[0].clone(),
                what,
            })
        }
        e => Err(e),
    })
}

/// Checks that device 0 of `devices` holds the meta page of a dana
/// database opened with `opts`, striped over `devices.len()` files.
fn identify(devices: &[Target], paths: &[PathBuf], opts: &Options) -> Result<MetaFacts> {
    let not_ours = |what: String| Error::NotADatabase {
        path: paths[0].clone(),
        what,
    };
    if devices[0].size() < 4096 {
        return Err(not_ours(format!(
            "not a dana database: {} bytes, shorter than a page",
            devices[0].size()
        )));
    }
    let facts = meta_facts(&read_first_page(&devices[0])?).map_err(not_ours)?;
    if facts.page_size != opts.page_size_value() {
        return Err(not_ours(format!(
            "the database has {}-byte pages; the options ask for {} (Options::page_size)",
            facts.page_size,
            opts.page_size_value()
        )));
    }
    if facts.width != devices.len() {
        return Err(not_ours(format!(
            "the database is striped over {} devices; {} were given",
            facts.width,
            devices.len()
        )));
    }
    Ok(facts)
}

fn device_options(opts: &Options, create_size: Option<u64>) -> DeviceOptions {
    DeviceOptions {
        direct: opts.direct_value(),
        create_size: if opts.is_read_only() {
            None
        } else {
            create_size
        },
        read_only: opts.is_read_only(),
        lock: true,
    }
}

/// The path of log `i` whose first log is at `path`: `path` itself for
/// log 0, `path` with `.i` appended for the others.
pub(crate) fn log_file_path(path: &Path, i: usize) -> PathBuf {
    if i == 0 {
        return path.to_path_buf();
    }
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{i}"));
    PathBuf::from(p)
}

/// Opens the log files of a database whose first log is at `path` and
/// whose meta page is `meta` (None: a new database), as devices `index`,
/// `index + 1`, ... Creates them only when the database has no log yet
/// and the options want one (as many as [`Options::logs_value`]).
fn open_logs(
    path: &Path,
    index: usize,
    opts: &Options,
    meta: Option<&MetaFacts>,
    undo: &mut Undo,
) -> Result<Vec<Target>> {
    let has_log = meta.is_some_and(|m| m.log_id != 0);
    if !has_log && opts.durability_value() == Durability::Off {
        // A database without a log opened without one: leave any file
        // there alone.
        return Ok(Vec::new());
    }
    let count = match meta.filter(|_| has_log) {
        Some(m) if m.logs as usize > crate::wal::MAX_LOGS => {
            return Err(Error::Log(format!(
                "the meta page names {} logs, more than {}",
                m.logs,
                crate::wal::MAX_LOGS
            )))
        }
        Some(m) => (m.logs as usize).max(1),
        None => opts.logs_value(),
    };
    // A new log file holds its control blocks and the first MiB of its
    // stream (the log grows it ahead of its flushes), or all of it.
    let per_log = crate::wal::per_log_bytes(opts.log_bytes_value(), count);
    let stream = if opts.log_preallocate_value() {
        per_log
    } else {
        per_log.min(INITIAL_LOG_BYTES)
    };
    let mut logs = Vec::with_capacity(count);
    for i in 0..count {
        let path = log_file_path(path, i);
        let exists = path.exists();
        if !exists {
            if has_log {
                return Err(Error::Log(format!(
                    "the database has a log (id {:016x}) but {} (log {i} of {count}) is \
                     missing; restore it, or the commits it held are lost",
                    meta.map_or(0, |m| m.log_id),
                    path.display()
                )));
            }
            if opts.is_read_only() {
                return Ok(Vec::new());
            }
        }
        let dopts = device_options(opts, (!exists).then_some(CONTROL_BYTES + stream));
        let d = Device::open(&path, index + i, dopts)?;
        if !exists {
            undo.created_file(&path);
        }
        logs.push(Target::File(Arc::new(d)));
    }
    Ok(logs)
}

/// Opens (creating if needed and allowed) the database in directory `dir`.
pub(crate) fn open_dir(dir: &Path, opts: &Options, undo: &mut Undo) -> Result<Opened> {
    let read_only = opts.is_read_only();
    let mut sync_dirs = Vec::new();
    if !dir.is_dir() {
        if read_only || dir.exists() {
            return Err(Error::Open {
                action: "open database directory",
                path: dir.to_path_buf(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        undo.create_dir(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dirs.push(parent.to_path_buf());
        }
    }
    let dir_file = File::open(dir).map_err(|source| Error::Open {
        action: "open database directory",
        path: dir.to_path_buf(),
        source,
    })?;
    lock_file(&dir_file, dir, read_only)?;
    let mut locks = Locks {
        dir: Some(dir_file),
        devices: Vec::new(),
    };
    let exists = device_path(dir, 0).exists();
    if !exists && read_only {
        return Err(Error::NotADatabase {
            path: dir.to_path_buf(),
            what: "no dana database here (no dana.0)".into(),
        });
    }
    let count = if exists {
        (0..).take_while(|&i| device_path(dir, i).exists()).count()
    } else {
        opts.devices_value().max(1)
    };
    let paths: Vec<PathBuf> = (0..count).map(|i| device_path(dir, i)).collect();
    let size = per_device_bytes(opts, count);
    let mut targets = Vec::with_capacity(count);
    for (i, p) in paths.iter().enumerate() {
        let d = Device::open(p, i, device_options(opts, (!exists).then_some(size)))?;
        if !exists {
            undo.created_file(p);
        }
        let t = Target::File(Arc::new(d));
        locks.device(&t);
        targets.push(t);
    }
    let log_path = opts
        .log_path_value()
        .cloned()
        .unwrap_or_else(|| dir.join("dana.wal"));
    let meta = if exists {
        match identify(&targets, &paths, opts) {
            Ok(m) => Some(m),
            Err(e) => Some(
                torn_meta_fallback(&e, peek_log(&log_path, count).as_ref(), count, opts)
                    .ok_or(e)?,
            ),
        }
    } else {
        None
    };
    let array = Array::new(targets, opts.page_size_value() as u64)?;
    let logs = open_logs(&log_path, count, opts, meta.as_ref(), undo)?;
    for t in &logs {
        locks.device(t);
    }
    if !exists {
        sync_dirs.push(dir.to_path_buf());
        if let Some(parent) = log_path.parent().filter(|p| *p != dir) {
            sync_dirs.push(parent.to_path_buf());
        }
    }
    Ok(Opened {
        array,
        logs,
        create: !exists,
        meta,
        locks,
        sync_dirs,
    })
}

/// Opens the database striped over `paths` (files or block devices).
pub(crate) fn open_paths(
    paths: &[PathBuf],
    opts: &Options,
    create: bool,
    undo: &mut Undo,
) -> Result<Opened> {
    if paths.is_empty() {
        return Err(Error::InvalidArgument("no device given".into()));
    }
    if create && opts.is_read_only() {
        return Err(Error::ReadOnly);
    }
    let size = per_device_bytes(opts, paths.len());
    let mut locks = Locks::default();
    let mut targets = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let existed = p.exists();
        let d = Device::open(p, i, device_options(opts, create.then_some(size)))?;
        if !existed {
            undo.created_file(p);
        }
        let t = Target::File(Arc::new(d));
        locks.device(&t);
        targets.push(t);
    }
    let log_path = opts.log_path_value().cloned().unwrap_or_else(|| {
        let mut p = paths[0].as_os_str().to_owned();
        p.push(".wal");
        PathBuf::from(p)
    });
    let meta = if create {
        None
    } else {
        match identify(&targets, paths, opts) {
            Ok(m) => Some(m),
            Err(e) => Some(
                torn_meta_fallback(
                    &e,
                    peek_log(&log_path, paths.len()).as_ref(),
                    paths.len(),
                    opts,
                )
                .ok_or(e)?,
            ),
        }
    };
    let array = Array::new(targets, opts.page_size_value() as u64)?;
    let logs = open_logs(&log_path, paths.len(), opts, meta.as_ref(), undo)?;
    for t in &logs {
        locks.device(t);
    }
    let mut sync_dirs = Vec::new();
    if create {
        for p in paths.iter().chain(std::iter::once(&log_path)) {
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !sync_dirs.iter().any(|d| d == parent) {
                    sync_dirs.push(parent.to_path_buf());
                }
            }
        }
    }
    Ok(Opened {
        array,
        logs,
        create,
        meta,
        locks,
        sync_dirs,
    })
}

/// Makes the names of newly created files durable: fsync of each
/// directory.
pub(crate) fn sync_dirs(dirs: &[PathBuf]) -> Result<()> {
    for d in dirs {
        File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(|source| Error::Open {
                action: "sync directory",
                path: d.clone(),
                source,
            })?;
    }
    Ok(())
}
