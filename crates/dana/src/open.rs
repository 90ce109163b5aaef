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
use crate::buffer::page::MirrorPageCheck;
use crate::io::device::{lock_file, unlock_file, DeviceOptions};
use crate::io::mirror::{self, CopySpec, Mirror, Role, LABEL_BYTES};
use crate::io::placement::WriteLife;
use crate::io::remap::Remap;
use crate::io::{
    open_queue, AlignedBuf, Array, Backend, Device, IoBuf, Placement, Request, Target,
};
use crate::options::{WriteMode, INITIAL_DATA_BYTES};
use crate::wal::INITIAL_LOG_BYTES;
use crate::wal::{Durability, CONTROL_BYTES};
use crate::{Error, Options, Result};

/// How an open looks at a file before it decides anything: read-only,
/// unlocked, through the page cache.
const PEEK: DeviceOptions = DeviceOptions {
    direct: false,
    create_size: None,
    read_only: true,
    lock: false,
};

/// Files and directories created by an open, removed on drop unless the
/// open succeeded ([`Undo::keep`]).
#[derive(Default)]
pub(crate) struct Undo {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    keep: bool,
    /// Log files created for a database that had none: kept if they hold
    /// a dana log ([`Undo::created_log`]).
    added_logs: Vec<PathBuf>,
    /// The open found an existing database (not one it creates).
    existing: bool,
}

impl Undo {
    /// The open succeeded: keep what it created.
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }

    fn created_file(&mut self, p: &Path) {
        self.files.push(p.to_path_buf());
    }

    /// A log file created for an existing database that had no log. A
    /// failed open keeps it once it holds a dana log: the open's
    /// checkpoint writes the meta page naming the log before the log's
    /// control blocks, so a failure after that left a database whose log
    /// was removed, and no open took it again (a review's finding). A
    /// formatted log the meta page does not name yet holds no commit and
    /// is formatted again by the next open (`refuse_foreign_log`).
    fn created_log(&mut self, p: &Path) {
        self.added_logs.push(p.to_path_buf());
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
        for f in self.added_logs.iter().rev() {
            if !matches!(log_control(f), Ok(Some(_))) {
                let _ = std::fs::remove_file(f);
            }
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
        match t {
            Target::File(d) => self.devices.push(d.clone()),
            Target::Mirror(m) => {
                for c in m.targets().iter().flatten() {
                    self.device(c);
                }
            }
            Target::Remap(r) => self.device(r.inner()),
            Target::Sim(_) => {}
        }
    }
}

impl Locks {
    /// Moves the locks out, leaving none here.
    pub(crate) fn take(&mut self) -> Locks {
        Locks {
            dir: self.dir.take(),
            devices: std::mem::take(&mut self.devices),
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
    /// The creation marker of a new database in a directory, removed
    /// once it is formatted and synced ([`CREATING`]).
    pub(crate) creating: Option<PathBuf>,
}

/// The file that marks a database directory whose creation has not
/// finished: written and synced before any file of the database is
/// created, removed once the new database is formatted and synced. An
/// open that finds it knows that no write was ever acknowledged there
/// (a create returns only after the removal): it removes the files the
/// creation left (every name a creation makes: `dana.N`, the logs, their
/// mirror copies; none existed when it began, or it would have refused)
/// and creates the database again. Before, a creation killed part-way
/// left a zero-filled `dana.0` that no open accepted (an outside probe).
pub(crate) const CREATING: &str = "dana.creating";

/// Removes what a creation cut short left in `dir` (its marker says one
/// was), then the marker; syncs the directories. The logs removed are
/// those at the path the marker names (the creation's `Options::log_path`),
/// never at the path this open was given: a cut creation reopened with
/// another log path deleted whatever files lay there (a review's finding).
/// A marker naming none (its creation was cut before the marker was
/// durable, so before any log existed) removes only the default log's.
fn remove_cut_creation(dir: &Path) -> Result<()> {
    let remove = |p: &Path| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Open {
            action: "remove a file of a creation cut short",
            path: p.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    };
    let marker = dir.join(CREATING);
    let named = std::fs::read(&marker).map_err(|source| Error::Open {
        action: "read the creation marker",
        path: marker.clone(),
        source,
    })?;
    let log_path = if named.is_empty() {
        dir.join("dana.wal")
    } else {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(named))
    };
    let mut firsts: Vec<PathBuf> = (0..256).map(|i| device_path(dir, i)).collect();
    firsts.extend((0..crate::wal::MAX_LOGS).map(|i| log_file_path(&log_path, i)));
    for p in &firsts {
        for c in 0..crate::io::mirror::MAX_COPIES {
            remove(&copy_path(p, c))?;
        }
    }
    remove(&marker)?;
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(parent) = log_path.parent().filter(|p| *p != dir && p.is_dir()) {
        dirs.push(parent.to_path_buf());
    }
    sync_dirs(&dirs)
}

/// Ends a creation: removes its marker ([`CREATING`]) once the new
/// database is formatted and synced, and syncs its directory.
pub(crate) fn finish_creation(marker: &Path) -> Result<()> {
    std::fs::remove_file(marker).map_err(|source| Error::Open {
        action: "remove the creation marker",
        path: marker.to_path_buf(),
        source,
    })?;
    match marker.parent() {
        Some(dir) => sync_dirs(&[dir.to_path_buf()]),
        None => Ok(()),
    }
}

/// Writes and syncs the creation marker ([`CREATING`]) in `dir`, naming
/// the log path the creation uses (absolute).
fn mark_creation(dir: &Path, log_path: &Path, undo: &mut Undo) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    let marker = dir.join(CREATING);
    let failed = |source| {
        crate::io::device::file_error("create the creation marker", &marker, source, || {
            format!("creating {}", marker.display())
        })
    };
    let log_path = std::path::absolute(log_path).map_err(failed)?;
    let mut f = File::create(&marker).map_err(failed)?;
    undo.created_file(&marker);
    f.write_all(log_path.as_os_str().as_bytes())
        .map_err(failed)?;
    f.sync_all().map_err(failed)?;
    sync_dirs(&[dir.to_path_buf()])?;
    Ok(marker)
}

fn device_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("dana.{i}"))
}

/// The path of copy `c` of a mirrored file whose copy 0 is at `path`:
/// `path` itself for copy 0, `path` with `.m{c}` appended for the others.
pub(crate) fn copy_path(path: &Path, c: usize) -> PathBuf {
    if c == 0 {
        return path.to_path_buf();
    }
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".m{c}"));
    PathBuf::from(p)
}

/// True if a file of the device whose copy 0 is at `path` exists (copy 0,
/// or another copy of a mirrored one whose copy 0 is gone).
fn device_exists(path: &Path) -> bool {
    (0..mirror::MAX_COPIES).any(|c| copy_path(path, c).exists())
}

/// The paths that may hold copies of an existing directory database's
/// first device, copy 0 first.
fn first_device_copies(dir: &Path) -> Vec<PathBuf> {
    let first = device_path(dir, 0);
    (0..mirror::MAX_COPIES)
        .map(|c| copy_path(&first, c))
        .collect()
}

/// The number of copies of an existing device from `candidates`, the
/// paths that may hold its copies, copy 0 first: from the first valid
/// label among them (1 if copy 0 is there without one and no other copy
/// has one: not mirrored). Given paths (`Db::open_devices`), copy 0 may
/// be the missing copy, and the next paths are its other copies or the
/// next devices (those hold no mirror label: a plain array).
fn copies_of(candidates: &[PathBuf]) -> Result<usize> {
    let mut plain_copy_0 = false;
    // A later copy whose label slots are both damaged.
    let mut damaged = None;
    for (c, p) in candidates.iter().enumerate() {
        if !p.exists() {
            continue;
        }
        let t = Target::File(Arc::new(Device::open(p, 0, PEEK)?));
        if let Some(l) = mirror::read_label(&t)? {
            return Ok(l.states.len());
        }
        if mirror::is_labelled(&t)? {
            // Both label slots damaged: the other copies' labels tell.
            if c > 0 {
                damaged.get_or_insert(p);
            }
            continue;
        }
        if c == 0 {
            // No label on copy 0: a device that is not mirrored, unless
            // copy 1's label says otherwise (copy 0 truncated, or the
            // magic of both its label slots damaged: the first version
            // read it as a plain file and failed to open a database
            // whose other copy was whole).
            plain_copy_0 = true;
        }
    }
    match damaged {
        Some(p) if !plain_copy_0 => Err(Error::Mirror(format!(
            "{}: copies of a mirrored device are there but no copy holds a valid label",
            p.display()
        ))),
        _ => Ok(1),
    }
}

/// Opens (or creates, with `create_size`) one file of the database with
/// its write-life hint. A file this call created is removed by `undo` if
/// the open fails (and by `Device::open` itself if it fails after
/// creating it: a preallocation that found the disk full left an empty
/// file, and the directory never opened again; an outside probe).
fn open_file(
    path: &Path,
    index: usize,
    role: Role,
    create_size: Option<u64>,
    opts: &Options,
    undo: &mut Undo,
) -> Result<Device> {
    let d = Device::open(path, index, device_options(opts, create_size))?;
    match (d.created(), role) {
        (true, Role::Log(_)) if undo.existing => undo.created_log(path),
        (true, _) => undo.created_file(path),
        (false, _) => {}
    }
    hint_write_life(&d, role, opts);
    Ok(d)
}

/// Opens device `role` at `path` (created with `create_size` bytes if
/// `create`): a plain file, or with `copies > 1` a mirrored group of the
/// copies' files (a copy missing from an existing group counts as
/// failed).
#[allow(clippy::too_many_arguments)]
fn open_device(
    path: &Path,
    role: Role,
    index: usize,
    copies: usize,
    create_size: Option<u64>,
    opts: &Options,
    undo: &mut Undo,
    locks: &mut Locks,
) -> Result<Target> {
    let create = create_size.is_some();
    if copies <= 1 {
        let d = open_file(path, index, role, create_size, opts, undo)?;
        let t = Target::File(Arc::new(d));
        locks.device(&t);
        return out_of_place(t, path, role, create, opts);
    }
    let mut specs = Vec::with_capacity(copies);
    for c in 0..copies {
        let p = copy_path(path, c);
        let existed = p.exists();
        if !existed && !create {
            // Missing from an existing group: failed until rebuilt.
            specs.push(CopySpec {
                target: None,
                path: Some(p),
            });
            continue;
        }
        let size = create_size.map(|b| b + LABEL_BYTES);
        let d = open_file(&p, index, role, size, opts, undo)?;
        let t = Target::File(Arc::new(d));
        locks.device(&t);
        specs.push(CopySpec {
            target: Some(t),
            path: Some(p),
        });
    }
    let m = if create {
        Mirror::create(role, index, specs)?
    } else {
        Mirror::open(role, index, specs, opts.is_read_only())?
    };
    Ok(Target::Mirror(m))
}

/// A data file as an out-of-place device when it is one (its label says
/// so) or is created as one ([`Options::write_mode`]); else as it is.
fn out_of_place(
    t: Target,
    path: &Path,
    role: Role,
    create: bool,
    opts: &Options,
) -> Result<Target> {
    if !matches!(role, Role::Data(_)) {
        return Ok(t);
    }
    if create {
        if opts.write_mode_value() == WriteMode::OutOfPlace {
            return Ok(Target::Remap(Remap::create(t, opts.remap_config())?));
        }
        return Ok(t);
    }
    if Remap::is_formatted(&t)? {
        let r = Remap::open(t)?;
        // Its label names its page size: one the options do not ask for
        // failed later as "misaligned out-of-place request" (an outside
        // probe).
        let ps = r.config().page_size as usize;
        if ps != opts.page_size_value() {
            return Err(other_page_size(path, ps, opts.page_size_value()));
        }
        return Ok(Target::Remap(r));
    }
    Ok(t)
}

/// The error of a database of `found`-byte pages opened with options
/// asking for `asked`.
fn other_page_size(path: &Path, found: usize, asked: usize) -> Error {
    Error::NotADatabase {
        path: path.to_path_buf(),
        what: format!(
            "the database has {found}-byte pages; the options ask for {asked} \
             (Options::page_size)"
        ),
    }
}

/// Readies the mirrored data devices of `array` for an open: the page
/// check of every read (a damaged page is read from another copy and
/// repaired), and the comparison of every copy on every read until the
/// open's recovery is done (`Mirror::set_verify_all`; the open turns it
/// off after its checkpoint).
pub(crate) fn arm_mirrors(array: &Array) {
    let width = array.width() as u64;
    for (i, t) in array.targets().iter().enumerate() {
        if let Some(m) = t.mirror() {
            m.set_page_check(Arc::new(MirrorPageCheck {
                width,
                device: i as u64,
                page_size: array.page_size() as usize,
            }));
            m.set_verify_all(true);
        }
    }
}

/// Fails each healthy copy of mirrored data device `m` (the first: the
/// meta page's) whose meta page is older than the log beside it (its
/// checkpoint stamp below the redo GSN of the log's control block `ctl`:
/// a copy put back whole from
/// an older backup beside the others), unless it is the last healthy
/// copy. Runs before the open's first read of page 0, which compares the
/// copies and writes the newest over the others: recovery then ran over
/// a mix of the older copy's pages and the newer one's, and served wrong
/// values (an outside probe). Every checkpoint writes the meta page to
/// every copy before any control block names its redo GSN, so a copy a
/// crash left behind still holds a stamp at least that GSN. Reads only;
/// a read-only open keeps the failure in memory.
fn fail_copies_older_than_the_log(
    m: &Arc<crate::io::mirror::Mirror>,
    ctl: &crate::wal::control::Control,
    ps: usize,
) {
    use crate::io::mirror::CopyState;
    for (c, state) in m.states().into_iter().enumerate() {
        if state != CopyState::Healthy {
            continue;
        }
        let Ok(bytes) = m.read_copy(c, 0, ps) else {
            continue;
        };
        let Ok(facts) = meta_facts(&bytes) else {
            continue;
        };
        if crate::buffer::page::verify(&bytes, 0).is_err() {
            continue;
        }
        let stamp = facts.checkpoint_stamp;
        if stamp != 0 && stamp < ctl.redo_gsn {
            m.fail_stale_copy(
                c,
                format!(
                    "its meta page's checkpoint stamp {stamp} is older than the log's redo GSN \
                     {} (a copy put back from an older backup?): rebuild it",
                    ctl.redo_gsn
                ),
            );
        }
    }
}

/// Fails the copies of the mirrored data devices `targets` (of an
/// existing database) shorter than the pages below the meta page's
/// high-water mark that each device holds (see [`fail_copies_short_of`]).
/// Before the array is built: it takes its size from its devices once.
fn fail_short_data_copies(targets: &[Target], ps: usize) {
    use crate::io::mirror::CopyState;
    let Some(Target::Mirror(first)) = targets.first() else {
        return;
    };
    // The highest mark a valid meta page of a healthy copy records (the
    // mark only grows), each copy's read on its own. Read through the
    // mirror, whose reads go to either copy, a copy put back from an
    // older moment (shorter) could answer with its older mark: no copy
    // was short of it, and the open then failed on the current meta
    // page's mark as out of range, having written to both copies (an
    // outside probe).
    let next = first
        .states()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| *s == CopyState::Healthy)
        .filter_map(|(c, _)| first.only(c).ok())
        .filter(|copy| copy.size() >= ps as u64)
        .filter_map(|copy| read_first_bytes(&Target::Mirror(copy), ps).ok())
        .filter(|meta| crate::buffer::page::verify(meta, 0).is_ok())
        .map(|meta| crate::buffer::alloc::meta_next_unused(&meta))
        .max();
    let Some(next) = next else {
        return;
    };
    let width = targets.len() as u64;
    for (d, t) in targets.iter().enumerate() {
        if let Target::Mirror(m) = t {
            // Device d holds pages d, d + width, d + 2 x width, ...
            let pages = next.saturating_sub(d as u64).div_ceil(width);
            fail_copies_short_of(
                m,
                pages.saturating_mul(ps as u64),
                "the meta page's high-water mark needs",
            );
        }
    }
}

/// Fails the healthy copies of `m` that hold fewer than `needed` bytes
/// (after their labels) while another healthy copy holds them: cut short
/// (damage, a mistaken `truncate`), such a copy made the group's size its
/// own, and every open, read-only too, and every rebuild failed with an
/// error that named no file, though a whole copy was there (an outside
/// probe). Only what the database needs counts: copies of unequal sizes
/// (fixed-size devices, a growth one copy had no room for) that all hold
/// it stay healthy (a first rule, failing every copy shorter than the
/// longest, failed those at every open; a review's finding).
fn fail_copies_short_of(m: &Arc<crate::io::mirror::Mirror>, needed: u64, what: &str) {
    use crate::io::mirror::{CopyState, LABEL_BYTES};
    let sizes: Vec<(usize, u64)> = m
        .states()
        .into_iter()
        .zip(m.targets())
        .enumerate()
        .filter(|(_, (s, _))| *s == CopyState::Healthy)
        .filter_map(|(c, (_, t))| t.map(|t| (c, t.size().saturating_sub(LABEL_BYTES))))
        .collect();
    if !sizes.iter().any(|&(_, size)| size >= needed) {
        return;
    }
    for (c, size) in sizes.into_iter().filter(|&(_, size)| size < needed) {
        m.fail_stale_copy(
            c,
            format!(
                "{}: the copy holds {size} bytes, fewer than the {needed} {what} (cut short?): \
                 rebuild it",
                m.copy_path(c)
                    .map_or_else(|| format!("copy {c}"), |p| p.display().to_string())
            ),
        );
    }
}

/// Bytes each file of a new database starts with: a share of
/// [`INITIAL_DATA_BYTES`] (or of the maximum size, if smaller), at least
/// one page; the files grow from there.
fn per_device_bytes(opts: &Options, devices: usize) -> Result<u64> {
    let ps = opts.page_size_value() as u64;
    if opts.write_mode_value() == WriteMode::OutOfPlace {
        // Out-of-place files do not grow: created whole.
        let Some(max) = opts.capacity_bytes_value() else {
            return Err(Error::InvalidArgument(
                "out-of-place data files do not grow: set Options::capacity_bytes".into(),
            ));
        };
        return Ok(((max / devices as u64) / ps * ps).max(ps));
    }
    let total = opts
        .capacity_bytes_value()
        .map_or(INITIAL_DATA_BYTES, |max| max.min(INITIAL_DATA_BYTES));
    Ok(((total / devices as u64) / ps * ps).max(ps))
}

/// An out-of-place data file is created whole: a file system that
/// refuses the size (larger than its largest file) failed the open with
/// the allocation's `EINVAL` or `EFBIG` alone (an outside probe's
/// finding). Named as the option that sets it.
fn too_large_to_create(e: Error, size: u64, opts: &Options) -> Error {
    match e {
        Error::Open {
            action: "allocate",
            path,
            source,
        } if opts.write_mode_value() == WriteMode::OutOfPlace
            && matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EFBIG)) =>
        {
            Error::InvalidArgument(format!(
                "out-of-place data files are created whole: allocating {size} bytes for {} \
                 (Options::capacity_bytes over Options::devices) was refused, likely larger \
                 than its file system's largest file: {source}",
                path.display()
            ))
        }
        e => e,
    }
}

/// Reads the first `len` bytes of `t` (a multiple of 4096) synchronously.
fn read_first_bytes(t: &Target, len: usize) -> Result<Vec<u8>> {
    let mut q = open_queue(t, &Backend::Blocking, 4)?;
    let buf = AlignedBuf::new(len, 4096)?;
    let c = crate::wal::recover::sync_io(q.as_mut(), Request::read(0, 0, IoBuf::owned(buf)))?;
    c.result?;
    let b = c
        .buf
        .and_then(IoBuf::into_owned)
        .ok_or_else(|| Error::InvalidArgument("a read completed without its buffer".into()))?;
    Ok(b[..len].to_vec())
}

/// Why the meta page whose first bytes are `first` (they hold the magic)
/// fails its checksum, or None if it passes. Reads the rest of the page
/// if `first` is shorter than the page size it names.
fn meta_damage(t: &Target, first: &[u8]) -> Result<Option<String>> {
    let read;
    let page = match crate::buffer::alloc::meta_page_size(first) {
        Some(size) if size <= first.len() => &first[..size],
        Some(size) if t.size() >= size as u64 => {
            read = read_first_bytes(t, size)?;
            &read[..]
        }
        Some(size) => {
            return Ok(Some(format!(
                "it names {size}-byte pages, longer than the file ({} bytes)",
                t.size()
            )))
        }
        None => return Ok(Some("it names no valid page size".into())),
    };
    Ok(crate::buffer::page::verify(page, 0).err().map(|e| match e {
        Error::Corrupt { what, .. } => what,
        e => e.to_string(),
    }))
}

/// Opens `path` read-only, unlocked, to look at a log's control block
/// (its `copies` copies, if mirrored).
fn peek_log(path: &Path, index: usize, copies: usize) -> Option<Target> {
    let peek = |p: &Path| {
        Device::open(p, index, PEEK)
            .ok()
            .map(|d| Target::File(Arc::new(d)))
    };
    if copies <= 1 {
        return peek(path);
    }
    let specs = (0..copies)
        .map(|c| CopySpec {
            target: peek(&copy_path(path, c)),
            path: None,
        })
        .collect();
    Mirror::open(Role::Log(0), index, specs, true)
        .ok()
        .map(Target::Mirror)
}

/// The facts of the meta page on `device` (device 0, at `path`, of an
/// array `width` devices wide) for an open with `opts`; `log` gives the
/// (first) log beside it, if there is one, when the page is in doubt.
///
/// - A page that passes its checksum is believed, and must match the
///   open: this build's format, the options' page size, the width.
/// - A page with the magic that fails its checksum is believed only if
///   its fields agree with the open and name the log beside it: a write
///   of the page torn after its first sector (which holds all of them)
///   leaves exactly that, and recovery repairs the page from the log's
///   full image of it (else the pool's read of page 0 reports it). Any
///   other such page is damage, [`Error::Corrupt`] of page 0 before
///   anything is written: a flipped bit in those fields read as another
///   format, wrong options or another database's log.
/// - A page without the magic is not a database, unless a valid log is
///   beside it: a write torn in its first sector, repaired the same way.
pub(crate) fn meta_of(
    device: &Target,
    path: &Path,
    width: usize,
    log: impl FnOnce() -> Option<Target>,
    opts: &Options,
) -> Result<MetaFacts> {
    let not_ours = |what: String| Error::NotADatabase {
        path: path.to_path_buf(),
        what,
    };
    if device.size() < 4096 {
        return Err(not_ours(format!(
            "not a dana database: {} bytes, shorter than a page",
            device.size()
        )));
    }
    // The whole page where the options' page size fits: a mirrored device
    // compares its copies page by page, and would judge every copy of a
    // larger page bad from a read of its first 4 KiB.
    let ps = opts.page_size_value();
    let control = log().and_then(|l| crate::wal::recover::read_newest_control(&l).ok().flatten());
    if let (Target::Mirror(m), Some(ctl)) = (device, &control) {
        fail_copies_older_than_the_log(m, ctl, ps);
    }
    let first = read_first_bytes(device, if device.size() >= ps as u64 { ps } else { 4096 })?;
    let log_control = || control;
    if !crate::buffer::alloc::has_meta_magic(&first) {
        let what = meta_facts(&first).err().unwrap_or_default();
        return match log_control() {
            Some(ctl) => Ok(MetaFacts {
                page_size: ps,
                width,
                log_id: ctl.log_id,
                logs: ctl.count,
                checkpoint_stamp: 0,
                log_ends: [0; crate::buffer::alloc::META_LOG_ENDS],
            }),
            None => Err(not_ours(what)),
        };
    }
    let facts = meta_facts(&first);
    if let Some(why) = meta_damage(device, &first)? {
        let damaged = |more: String| Error::Corrupt {
            page: 0,
            what: format!(
                "the meta page (the first page of {}) is damaged: {why}{more}",
                path.display()
            ),
        };
        let facts = facts.map_err(|e| damaged(format!("; it reads: {e}")))?;
        if facts.page_size != ps || facts.width != width {
            return Err(damaged(format!(
                "; it names {}-byte pages over {} devices",
                facts.page_size, facts.width
            )));
        }
        return match log_control() {
            // Its checkpoint stamp and log ends are not believed
            // (nothing is checked against them): recovery rebuilds the
            // page.
            Some(ctl) if facts.log_id != 0 && ctl.log_id == facts.log_id => Ok(MetaFacts {
                checkpoint_stamp: 0,
                log_ends: [0; crate::buffer::alloc::META_LOG_ENDS],
                ..facts
            }),
            _ => Err(damaged(
                "; no log beside it names its log identity, so none can repair it".into(),
            )),
        };
    }
    let facts = facts.map_err(not_ours)?;
    if facts.page_size != ps {
        return Err(other_page_size(path, facts.page_size, ps));
    }
    if facts.width != width {
        let given = match width {
            1 => "1 was".to_string(),
            w if w < facts.width => format!("only {w} were"),
            w => format!("{w} were"),
        };
        return Err(not_ours(format!(
            "the database is striped over {} devices; {given} given (in a directory: dana.0 \
             to dana.{}{})",
            facts.width,
            facts.width - 1,
            if width < facts.width {
                format!(", and dana.{width} is missing")
            } else {
                String::new()
            }
        )));
    }
    Ok(facts)
}

/// `InvalidArgument` if the log's path names one of the data files
/// `paths` (the same inode, or the same path when either is missing):
/// once answered `Locked`, the log's lock meeting the data file's.
fn refuse_log_on_data(paths: &[PathBuf], log_path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let same = |a: &Path| match (std::fs::metadata(a), std::fs::metadata(log_path)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == log_path,
    };
    match paths.iter().find(|p| same(p)) {
        Some(p) => Err(Error::InvalidArgument(format!(
            "Options::log_path {} is the database's data file {}",
            log_path.display(),
            p.display()
        ))),
        None => Ok(()),
    }
}

/// [`Error::InvalidArgument`] for a log path in the database directory
/// whose files would take the names of the database's own: `dana.N` (a
/// data device: `log_path(<dir>/dana.1)` made a one-device database open
/// as two, and it could not be opened again; a review's finding), `dana`
/// (its second log is `dana.1`), or the creation marker.
fn refuse_log_among_database_names(dir: &Path, log_path: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (log_path.parent(), log_path.file_name()) else {
        return Ok(());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let same_dir = match (parent.canonicalize(), dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let name = name.to_string_lossy();
    let data_name = name.strip_prefix("dana.").is_some_and(|rest| {
        rest.split('.')
            .next()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if same_dir && (name == "dana" || data_name || name.starts_with(CREATING)) {
        return Err(Error::InvalidArgument(format!(
            "Options::log_path {}: its files would take the names of the database's own \
             files in {} (dana.N, the creation marker); name it otherwise",
            log_path.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// Tells the kernel how long the writes to device `d` of `role` live: a
/// log is overwritten every lap (`SHORT`), data pages stay longer
/// (`MEDIUM`); see `io::placement`. Advice only: a kernel or file system
/// that refuses it changes nothing, so the refusal is not an error.
fn hint_write_life(d: &Device, role: Role, opts: &Options) {
    if opts.is_read_only() {
        return;
    }
    let life = match role {
        Role::Log(_) => Placement::Log.write_life(),
        Role::Data(_) => WriteLife::Medium,
    };
    let _ = d.set_write_life(life);
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
#[allow(clippy::too_many_arguments)]
fn open_logs(
    path: &Path,
    index: usize,
    copies: usize,
    opts: &Options,
    meta: Option<&MetaFacts>,
    erase: bool,
    undo: &mut Undo,
    locks: &mut Locks,
) -> Result<Vec<Target>> {
    let has_log = meta.is_some_and(|m| m.log_id != 0);
    undo.existing = meta.is_some();
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
    let per_log = crate::wal::per_log_bytes(opts.log_bytes_value(), count, opts.page_size_value());
    if per_log > crate::wal::recover::MAX_LOG_BYTES {
        // Before any file is created (the size of a preallocated one
        // overflowed: `log_bytes(u64::MAX)`).
        return Err(Error::InvalidArgument(format!(
            "a log of {per_log} bytes: at most {} each (Options::log_bytes)",
            crate::wal::recover::MAX_LOG_BYTES
        )));
    }
    // An out-of-place database's data files take their whole capacity at
    // creation, so its log does too: grown later, it found the room
    // gone, and every commit, a delete too, failed "the log file cannot
    // grow" until space was added (an outside probe).
    let stream = if opts.log_preallocate_value() || opts.write_mode_value() == WriteMode::OutOfPlace
    {
        per_log
    } else {
        per_log.min(INITIAL_LOG_BYTES)
    };
    let mut logs = Vec::with_capacity(count);
    if !has_log && !opts.is_read_only() && !erase {
        // A log is about to be formatted: never over one that is there
        // (unless the caller asked to erase: `Db::open_devices` with
        // `create`).
        for i in 0..count {
            for c in 0..copies {
                refuse_foreign_log(&copy_path(&log_file_path(path, i), c))?;
            }
        }
    }
    for i in 0..count {
        let path = log_file_path(path, i);
        let exists = if copies > 1 {
            device_exists(&path)
        } else {
            path.exists()
        };
        if exists && erase && copies > 1 && !has_log {
            // A new mirrored log over files that are there: their labels
            // would decide what they are. Refused before any data file is
            // touched (the creation opens its logs first), naming them.
            // (It failed on the labels after the data files had been
            // relabelled: the earlier database was gone; an outside probe.)
            return Err(Error::Log(format!(
                "a new database's mirrored log {i} would be created over {} (and its copies), \
                 which exist: remove them or set Options::log_path",
                path.display()
            )));
        }
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
        let create_size = (!exists && !opts.is_read_only()).then_some(CONTROL_BYTES + stream);
        let t = open_device(
            &path,
            Role::Log(i),
            index + i,
            copies,
            create_size,
            opts,
            undo,
            locks,
        )?;
        match &t {
            // A new log formatted over a file that is there takes the size
            // a new log file has: one of another size, which no log grows
            // to, was formatted as it was, took commits, and failed every
            // later open as a log cut short (an outside probe).
            Target::File(d) if exists && erase && !has_log => d.reset(0, CONTROL_BYTES + stream)?,
            _ => {}
        }
        if let (true, Target::Mirror(m)) = (has_log, &t) {
            // The stream bytes the newest control block of any healthy
            // copy records the file held (a copy put back from before the
            // log grew holds an older block).
            let newest = crate::wal::recover::read_newest_control(&t).ok().flatten();
            if let Some(ctl) = newest.filter(|ctl| ctl.stream_bytes > 0) {
                fail_copies_short_of(
                    m,
                    CONTROL_BYTES + ctl.stream_bytes,
                    "the log's newest control block records",
                );
            }
        }
        logs.push(t);
    }
    if !has_log && !opts.is_read_only() {
        refuse_logs_past_their_file_systems(&logs, CONTROL_BYTES + per_log)?;
    }
    Ok(logs)
}

/// Refuses new logs of `each` bytes whose files, on some file system, add
/// up to more than it holds in all: each file grows to its size on its
/// first lap, and once it could not, every write, a delete too, failed
/// `NoSpace` for good (nothing the user could free helped; an outside
/// probe: the default 64 MiB log on an 8 MiB file system, three logs on
/// one of 64 MiB). Log files on a file system whose size the kernel does
/// not give are not counted.
fn refuse_logs_past_their_file_systems(logs: &[Target], each: u64) -> Result<()> {
    let mut by_fs: Vec<(u64, u64, u64, PathBuf)> = Vec::new();
    for (d, _) in logs.iter().flat_map(|t| t.files(0)) {
        let (Some(fs), size) = (d.file_system(), d.max_size()) else {
            continue;
        };
        if size == u64::MAX {
            continue;
        }
        match by_fs.iter_mut().find(|(f, ..)| *f == fs) {
            Some((_, _, needed, _)) => *needed = needed.saturating_add(each),
            None => by_fs.push((fs, size, each, d.path().to_path_buf())),
        }
    }
    match by_fs.into_iter().find(|(_, size, needed, _)| needed > size) {
        Some((_, size, needed, path)) => Err(Error::InvalidArgument(format!(
            "the log files on the file system of {} need {needed} bytes once grown (each log \
             {each}: Options::log_bytes over Options::logs), more than the {size} it holds: \
             choose a smaller log_bytes, or a log_path on a larger file system",
            path.display()
        ))),
        None => Ok(()),
    }
}

/// Refuses to format a log over the file or device at `path` when it is
/// not free to take: one that holds a dana log (its control blocks say
/// so: the log of a database whose data files are missing, or of another
/// database), or a regular file that this open did not create. A missing
/// file, a block device without a dana log, and a dana log whose control
/// block names no checkpoint are free: a log is checkpointed before the
/// open that formatted it returns, so that one holds no acknowledged
/// commit (an open adding a log to a database that had none, cut by a
/// crash before its checkpoint made the meta page name the log: every
/// later open was refused; a review's finding). (The first version formatted any file at the log's path: a
/// database whose `dana.0` was missing opened as a new one and overwrote
/// the log that held its commits.)
fn refuse_foreign_log(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    use std::os::unix::fs::FileTypeExt;
    let block = meta.file_type().is_block_device();
    if let Some(c) = log_control(path)? {
        if c.checkpoint == 0 {
            return Ok(());
        }
        return Err(Error::Log(format!(
            "{} holds the log of a dana database (identity {:016x}) and this open would \
             create a new one: restore the database's data files, or remove the log if it \
             is no longer wanted",
            path.display(),
            c.log_id
        )));
    }
    if block {
        return Ok(());
    }
    Err(Error::Log(format!(
        "{} exists ({} bytes) and is not a dana log this open created: remove it or choose \
         another Options::log_path",
        path.display(),
        meta.len()
    )))
}

/// The newest valid control block of the dana log (or the mirrored
/// copy of one) at `path`, if it holds one.
fn log_control(path: &Path) -> Result<Option<crate::wal::control::Control>> {
    let t = Target::File(Arc::new(Device::open(path, 0, PEEK)?));
    // A mirrored copy holds its label first, then the log.
    let labelled = mirror::is_labelled(&t).unwrap_or(false);
    let ctl_at = if labelled { LABEL_BYTES } else { 0 };
    Ok((t.size() >= ctl_at + CONTROL_BYTES)
        .then(|| {
            crate::wal::recover::read_control_at(&t, ctl_at)
                .ok()
                .flatten()
        })
        .flatten())
}

/// When no `dana.0` is there: fails if another file of a database is (a
/// data file or a copy of one past the first), since creating a new
/// database would overwrite it.
fn refuse_partial_database(dir: &Path) -> Result<()> {
    for i in 0..256 {
        let p = device_path(dir, i);
        let found = (0..mirror::MAX_COPIES)
            .map(|c| copy_path(&p, c))
            .find(|f| f.exists());
        if let Some(f) = found {
            return Err(Error::NotADatabase {
                path: dir.to_path_buf(),
                what: format!(
                    "dana.0 is missing but {} is there: a database with a data file missing \
                     (restore it); nothing was created",
                    f.display()
                ),
            });
        }
    }
    Ok(())
}

/// Opens (creating if needed and allowed) the database in directory `dir`.
pub(crate) fn open_dir(dir: &Path, opts: &Options, undo: &mut Undo) -> Result<Opened> {
    let read_only = opts.is_read_only();
    let mut sync_dirs = Vec::new();
    if dir.exists() && !dir.is_dir() {
        return Err(Error::NotADatabase {
            path: dir.to_path_buf(),
            what: "a file, not a database directory".into(),
        });
    }
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
    let log_path = opts
        .log_path_value()
        .cloned()
        .unwrap_or_else(|| dir.join("dana.wal"));
    if dir.join(CREATING).exists() {
        if read_only {
            return Err(Error::NotADatabase {
                path: dir.to_path_buf(),
                what: format!(
                    "its creation was cut short ({CREATING} is there; no write was ever \
                     acknowledged in it): a writable open creates it again"
                ),
            });
        }
        remove_cut_creation(dir)?;
    }
    let exists = device_exists(&device_path(dir, 0));
    if !exists {
        refuse_partial_database(dir)?;
    }
    if !exists && read_only {
        return Err(Error::NotADatabase {
            path: dir.to_path_buf(),
            what: "no dana database here (no dana.0)".into(),
        });
    }
    let count = if exists {
        (0..)
            .take_while(|&i| device_exists(&device_path(dir, i)))
            .count()
    } else {
        opts.devices_value().max(1)
    };
    let copies = if exists {
        copies_of(&first_device_copies(dir))?
    } else {
        check_copies(opts)?
    };
    let paths: Vec<PathBuf> = (0..count).map(|i| device_path(dir, i)).collect();
    let creating = if exists {
        None
    } else {
        Some(mark_creation(dir, &log_path, undo)?)
    };
    let size = if exists {
        0
    } else {
        per_device_bytes(opts, count)?
    };
    let mut targets = Vec::with_capacity(count);
    for (i, p) in paths.iter().enumerate() {
        let create_size = (!exists).then_some(size);
        targets.push(
            open_device(
                p,
                Role::Data(i),
                i,
                copies,
                create_size,
                opts,
                undo,
                &mut locks,
            )
            .map_err(|e| too_large_to_create(e, size, opts))?,
        );
    }
    refuse_log_on_data(&paths, &log_path)?;
    refuse_log_among_database_names(dir, &log_path)?;
    if exists {
        fail_short_data_copies(&targets, opts.page_size_value());
    }
    let array = Array::new(targets, opts.page_size_value() as u64)?;
    arm_mirrors(&array);
    let meta = if exists {
        Some(meta_of(
            &array.targets()[0],
            &paths[0],
            count,
            || peek_log(&log_path, count, copies),
            opts,
        )?)
    } else {
        None
    };
    let logs = open_logs(
        &log_path,
        count,
        copies,
        opts,
        meta.as_ref(),
        false,
        undo,
        &mut locks,
    )?;
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
        creating,
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
    let copies = if create {
        check_copies(opts)?
    } else {
        copies_of(&paths[..paths.len().min(mirror::MAX_COPIES)])?
    };
    if paths.len() % copies != 0 {
        return Err(Error::InvalidArgument(format!(
            "{} paths for devices of {copies} copies each: give every copy of every device",
            paths.len()
        )));
    }
    let width = paths.len() / copies;
    let size = if create {
        per_device_bytes(opts, width)?
    } else {
        0
    };
    let log_path = opts.log_path_value().cloned().unwrap_or_else(|| {
        let mut p = paths[0].as_os_str().to_owned();
        p.push(".wal");
        PathBuf::from(p)
    });
    refuse_log_on_data(paths, &log_path)?;
    let mut locks = Locks::default();
    // A creation opens (and may refuse) its logs before it touches a data
    // file: a refusal after the data files were opened left an earlier
    // database's first blocks relabelled (an outside probe).
    let created_logs = if create {
        Some(open_logs(
            &log_path, width, copies, opts, None, true, undo, &mut locks,
        )?)
    } else {
        None
    };
    let mut targets = Vec::with_capacity(width);
    let mut firsts = Vec::with_capacity(width);
    for i in 0..width {
        let group = &paths[i * copies..(i + 1) * copies];
        firsts.push(group[0].clone());
        targets.push(
            open_group(
                group,
                Role::Data(i),
                i,
                create.then_some(size),
                opts,
                undo,
                &mut locks,
            )
            .map_err(|e| too_large_to_create(e, size, opts))?,
        );
    }
    if !create {
        fail_short_data_copies(&targets, opts.page_size_value());
    }
    let array = Array::new(targets, opts.page_size_value() as u64)?;
    arm_mirrors(&array);
    let meta = if create {
        None
    } else {
        Some(meta_of(
            &array.targets()[0],
            &firsts[0],
            width,
            || peek_log(&log_path, width, copies),
            opts,
        )?)
    };
    let logs = match created_logs {
        Some(logs) => logs,
        None => open_logs(
            &log_path,
            width,
            copies,
            opts,
            meta.as_ref(),
            false,
            undo,
            &mut locks,
        )?,
    };
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
        creating: None,
    })
}

/// Clears the data devices of a new database, once every check of its
/// creation has passed (the logs are formatted; nothing refuses it after
/// this but an I/O error): every database's GSNs start at 1, so an
/// earlier database's pages on the same devices pass their checksums
/// with LSNs inside the new log's window, and after a crash recovery kept
/// them over the new pages' images: the old keys were readable in the new
/// database (a review's finding). A regular file is cut to nothing and
/// allocated again, a mirrored copy past its label; a simulated device is
/// discarded (it reads back as zeros). Not a block device (its blocks are
/// not zeroed: `Db::open_devices` says so), nor an out-of-place device
/// (`Remap::create` formatted it: its old extents are mapped by nothing).
pub(crate) fn erase_for_create(array: &Array) -> Result<()> {
    array.targets().iter().try_for_each(|t| erase_target(t, 0))
}

/// [`erase_for_create`] of one target, from byte `from` on. A file this
/// open created holds nothing yet: left as it is.
fn erase_target(t: &Target, from: u64) -> Result<()> {
    match t {
        Target::File(d) if !d.is_block_device() && !d.created() => d.reset(from, d.size()),
        Target::File(_) | Target::Remap(_) => Ok(()),
        Target::Sim(d) => {
            // An injected discard fault leaves the device as it is.
            let _ = d.discard(from, d.size().saturating_sub(from));
            Ok(())
        }
        Target::Mirror(m) => m
            .targets()
            .iter()
            .flatten()
            .try_for_each(|c| erase_target(c, crate::io::mirror::LABEL_BYTES)),
    }
}

/// The copies a new database gets ([`Options::mirror_copies`]), checked.
fn check_copies(opts: &Options) -> Result<usize> {
    let n = opts.mirror_copies_value().max(1);
    if n > mirror::MAX_COPIES {
        return Err(Error::InvalidArgument(format!(
            "at most {} copies of a device, not {n} (Options::mirror_copies)",
            mirror::MAX_COPIES
        )));
    }
    Ok(n)
}

/// Opens the copies of one device given path by path (`paths[c]` is copy
/// `c`): a plain file for one path, a mirrored group for several.
fn open_group(
    paths: &[PathBuf],
    role: Role,
    index: usize,
    create_size: Option<u64>,
    opts: &Options,
    undo: &mut Undo,
    locks: &mut Locks,
) -> Result<Target> {
    if paths.len() == 1 {
        return open_device(&paths[0], role, index, 1, create_size, opts, undo, locks);
    }
    let create = create_size.is_some();
    let mut specs = Vec::with_capacity(paths.len());
    for p in paths {
        let existed = p.exists();
        if !existed && !create {
            specs.push(CopySpec {
                target: None,
                path: Some(p.clone()),
            });
            continue;
        }
        let size = create_size.map(|b| b + LABEL_BYTES);
        let d = open_file(p, index, role, size, opts, undo)?;
        let t = Target::File(Arc::new(d));
        locks.device(&t);
        specs.push(CopySpec {
            target: Some(t),
            path: Some(p.clone()),
        });
    }
    let m = if create {
        Mirror::create(role, index, specs)?
    } else {
        Mirror::open(role, index, specs, opts.is_read_only())?
    };
    Ok(Target::Mirror(m))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed open that was adding a log to an existing database keeps
    /// a log file it created once the file holds a dana log (the meta
    /// page may already name it), and removes one that does not; other
    /// files it created go.
    #[test]
    fn a_failed_open_keeps_an_added_log_once_formatted() {
        let dir = tempfile::tempdir().unwrap();
        let (formatted, blank, data) = (
            dir.path().join("formatted.wal"),
            dir.path().join("blank.wal"),
            dir.path().join("dana.1"),
        );
        let dopts = DeviceOptions {
            direct: false,
            create_size: Some(CONTROL_BYTES + (1 << 20)),
            read_only: false,
            lock: false,
        };
        let place = crate::wal::recover::LogPlace {
            index: 0,
            count: 1,
            next_gsn: 1,
        };
        let t = Target::File(Arc::new(Device::open(&formatted, 0, dopts).unwrap()));
        crate::wal::recover::format(&t, 1 << 20, 4096, 7, place).unwrap();
        drop(t);
        for p in [&blank, &data] {
            drop(Device::open(p, 0, dopts).unwrap());
        }
        let mut undo = Undo::default();
        undo.existing = true;
        undo.created_log(&formatted);
        undo.created_log(&blank);
        undo.created_file(&data);
        drop(undo);
        assert!(formatted.exists(), "the formatted log was removed");
        assert!(!blank.exists(), "a log file holding no log was kept");
        assert!(!data.exists());
    }
}
