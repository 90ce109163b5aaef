//! One storage device: a regular file or a block device, opened for direct
//! I/O.
//!
//! Owns: the file descriptor, the device's size and its direct-I/O
//! alignment, learnt from the kernel (`statx` `STATX_DIOALIGN` for files,
//! `BLKSSZGET`/`BLKGETSIZE64` for block devices), and the growth of a
//! regular file ([`Device::grow`]: blocks allocated, then the new size made
//! durable, before anyone may use it). Never: shrinks or truncates a
//! device, grows a block device, or reads through the page cache when
//! opened with `direct = true`.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::{placement, Alignment, Rejected, Request};
use crate::{Error, Result};

/// `_IOR(0x12, 114, size_t)`: size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// A file or block device opened for I/O.
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
    index: usize,
    /// Bytes usable now: grows with [`Device::grow`], never shrinks.
    size: AtomicU64,
    /// The most bytes the device can ever hold: its size for a block
    /// device, the file system's size for a file.
    max_size: u64,
    /// Serialises growth.
    growing: Mutex<()>,
    align: Alignment,
    block_device: bool,
    direct: bool,
    /// Opened without write access: every write is refused at push
    /// ([`Device::admit`]).
    read_only: bool,
    /// Write streams the block device offers (0: none; always 0 for a
    /// file). See [`super::placement`].
    write_streams: u8,
    /// The smallest and largest untorn direct write the kernel offers on
    /// this file or device (`statx` `STATX_WRITE_ATOMIC`, Linux 6.11+:
    /// `RWF_ATOMIC` writes of a power-of-two length in this range, aligned
    /// to their length), if any.
    atomic_write: Option<(u64, u64)>,
    /// A sync of this device failed: in a queue, or outside them (a
    /// growth's, [`Device::sync`]). The kernel reports a failed write-back once per open file,
    /// to whichever sync asks first, so a later fdatasync of the queues
    /// may return 0 over lost writes: every write and flush of this
    /// device fails from now on ([`Device::vetted`]).
    sync_failed: AtomicBool,
    /// [`Device::open`] created the file.
    created: bool,
}

/// How to open a device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceOptions {
    /// Bypass the OS page cache (`O_DIRECT`). Default: true.
    pub direct: bool,
    /// Create a regular file of this size if it does not exist, allocating
    /// its blocks (`fallocate`), or grow a smaller existing file to it.
    pub create_size: Option<u64>,
    /// Open read-only.
    pub read_only: bool,
    /// Take an advisory `flock` on the file before anything else: shared
    /// when read-only, else exclusive; a conflict fails at once with
    /// [`Error::Locked`]. The lock lives with the open file description
    /// (never a classic `fcntl` lock, which any `close` of the same file in
    /// the process would drop), so a second open in the same process
    /// conflicts too.
    pub lock: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            direct: true,
            create_size: None,
            read_only: false,
            lock: false,
        }
    }
}

/// `source`, the failure of `action` on the file at `path`: a full file
/// system (`ENOSPC`) is [`Error::NoSpace`] ("`doing()`: the file system is
/// full"), anything else [`Error::Open`].
pub(crate) fn file_error(
    action: &'static str,
    path: &Path,
    source: std::io::Error,
    doing: impl FnOnce() -> String,
) -> Error {
    if source.raw_os_error() == Some(libc::ENOSPC) {
        return Error::NoSpace(format!("{}: the file system is full", doing()));
    }
    Error::Open {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn open_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Open {
        action,
        path: path.to_path_buf(),
        source,
    }
}

impl Device {
    /// Opens (and with `create_size`, creates and allocates) the device at
    /// `path`, which becomes device `index` of its array.
    ///
    /// A file it creates ([`Device::created`]) it also removes again if a
    /// later step fails (a preallocation on a full file system left an
    /// empty file behind, which no open took; an outside probe).
    pub fn open(path: impl AsRef<Path>, index: usize, opts: DeviceOptions) -> Result<Device> {
        let path = path.as_ref();
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if opts.direct {
            oo.custom_flags(libc::O_DIRECT);
        }
        let (file, created) = if opts.create_size.is_some() && !opts.read_only {
            // Created only if not there (O_EXCL): a file another process
            // made meanwhile is opened, never taken for this one's.
            match oo.clone().create_new(true).open(path) {
                Ok(f) => (f, true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    (oo.open(path).map_err(open_err("open", path))?, false)
                }
                Err(e) => return Err(open_err("open", path)(e)),
            }
        } else {
            (oo.open(path).map_err(open_err("open", path))?, false)
        };
        let opened = Self::opened(file, path, index, &opts, created);
        if opened.is_err() && created {
            let _ = std::fs::remove_file(path);
        }
        opened
    }

    /// [`Device::open`] once the file is open.
    fn opened(
        file: File,
        path: &Path,
        index: usize,
        opts: &DeviceOptions,
        created: bool,
    ) -> Result<Device> {
        if opts.lock {
            lock_file_patiently(&file, path, opts.read_only, DEVICE_LOCK_PATIENCE)?;
        }
        let meta = file.metadata().map_err(open_err("stat", path))?;
        let block_device = meta.file_type().is_block_device();
        let fd = file.as_raw_fd();

        let size = if block_device {
            block_device_size(fd).map_err(open_err("get the size of", path))?
        } else {
            let mut size = meta.len();
            if let Some(want) = opts.create_size {
                if size < want {
                    preallocate(fd, size, want).map_err(|source| {
                        file_error("allocate", path, source, || {
                            format!("creating {} ({want} bytes)", path.display())
                        })
                    })?;
                    size = want;
                }
            }
            size
        };
        let (io, mem) = if block_device {
            let lbs = logical_block_size(fd).map_err(open_err("get the block size of", path))?;
            (lbs, lbs)
        } else {
            file_dio_alignment(fd).unwrap_or((4096, 4096))
        };
        let (io, mem) = if opts.direct { (io, mem) } else { (1, 1) };
        let max_size = if block_device {
            size
        } else {
            file_system_size(fd).unwrap_or(u64::MAX).max(size)
        };
        let write_streams = if block_device {
            let rdev = meta.rdev();
            placement::write_streams(libc::major(rdev), libc::minor(rdev))
        } else {
            0
        };
        let atomic_write = if opts.direct {
            atomic_write_units(fd)
        } else {
            None
        };
        Ok(Device {
            file,
            path: path.to_path_buf(),
            index,
            size: AtomicU64::new(size),
            max_size,
            growing: Mutex::new(()),
            align: Alignment {
                device: index,
                io: io.max(1),
                mem: mem.max(1),
                size,
            },
            block_device,
            direct: opts.direct,
            read_only: opts.read_only,
            write_streams,
            atomic_write,
            sync_failed: AtomicBool::new(false),
            created,
        })
    }

    /// True if [`Device::open`] created the file (it was not there).
    pub fn created(&self) -> bool {
        self.created
    }

    /// The kernel's result `res` of a request of kind `op` on this
    /// device, as the queues report it: `-EIO` for a write or a flush once
    /// a sync failed, in a queue or outside them (see the field), else
    /// `res`. A failed flush is recorded here: the kernel may answer the
    /// next fdatasync with success although the data the failed one
    /// should have made durable is lost, and another queue's (the log
    /// growth's control block, a recovery) must not take that success.
    pub(crate) fn vetted(&self, op: crate::OpKind, res: i64) -> i64 {
        if op == crate::OpKind::Flush && res < 0 {
            self.sync_failed.store(true, Ordering::Release);
        }
        if op != crate::OpKind::Read && self.sync_failed.load(Ordering::Acquire) {
            -(libc::EIO as i64)
        } else {
            res
        }
    }

    /// True if a direct write of `len` bytes (a power of two), aligned to
    /// its length, can be issued untorn (`RWF_ATOMIC`): the kernel said so
    /// for this file or device at open.
    pub fn untorn_writes(&self, len: u64) -> bool {
        self.atomic_write
            .is_some_and(|(min, max)| len.is_power_of_two() && min <= len && len <= max)
    }

    /// Drops the advisory lock taken at open (a closed database lets
    /// another open take its files while stale handles still hold the
    /// descriptor).
    pub fn unlock(&self) {
        unlock_file(&self.file);
    }

    /// The raw file descriptor (stays valid as long as the device lives).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Index of the device in its array.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Size in bytes (as grown so far).
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// The most bytes the device can hold: a block device's size, or the
    /// size of the file system a file lives on.
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// Grows a regular file to `new_size` bytes: allocates the blocks
    /// (`fallocate`), then `fdatasync`s so that the new size is durable,
    /// and only then lets requests reach the new range. A smaller or equal
    /// `new_size` does nothing. Blocking (a growth thread calls it, never a
    /// worker). Fails with [`Error::NoSpace`] when the file system is full
    /// (the size stays as it was), and for a block device or a size past
    /// [`Device::max_size`].
    pub fn grow(&self, new_size: u64) -> Result<()> {
        self.grow_with(new_size, false)
    }

    /// [`Device::grow`], writing zeros over the new range instead of
    /// `fallocate`: later writes to it are plain overwrites (no unwritten
    /// extent to convert, so an `fdatasync` after them commits no file
    /// system journal). For the log, whose flushes sync every few
    /// milliseconds.
    pub fn grow_zeroed(&self, new_size: u64) -> Result<()> {
        self.grow_with(new_size, true)
    }

    fn grow_with(&self, new_size: u64, zero: bool) -> Result<()> {
        let _one_at_a_time = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.size();
        if new_size <= old {
            return Ok(());
        }
        if self.block_device || new_size > self.max_size {
            return Err(Error::NoSpace(format!(
                "{} cannot grow to {new_size} bytes ({}; at most {} bytes)",
                self.path.display(),
                if self.block_device {
                    "a block device has a fixed size"
                } else {
                    "larger than its file system"
                },
                self.max_size
            )));
        }
        let allocated = if zero {
            self.write_zeros(old, new_size)
        } else {
            preallocate(self.fd(), old, new_size)
        };
        let grown = allocated.and_then(|()| {
            self.file.sync_data().inspect_err(|e| {
                // With O_DIRECT, ENOSPC here is the growth's own blocks; the
                // data written before went to the device at its write.
                // Through the page cache it can be an earlier write's
                // writeback, lost: every later flush must fail.
                if e.raw_os_error() != Some(libc::ENOSPC) || !self.direct {
                    self.sync_failed.store(true, Ordering::Release);
                }
            })
        });
        if let Err(source) = grown {
            // The file back to its old size (what a growth that never
            // started leaves): a log's file holds whole MiB of stream, and
            // recovery takes any other length for a file cut short.
            let _ = self.file.set_len(old);
            return Err(file_error("grow", &self.path, source, || {
                format!(
                    "growing {} from {old} to {new_size} bytes",
                    self.path.display()
                )
            }));
        }
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    /// Writes zeros over `[from, to)` (offsets aligned for direct I/O).
    fn write_zeros(&self, from: u64, to: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        const CHUNK: u64 = 1 << 20;
        let zeros = super::AlignedBuf::new(CHUNK as usize, self.align.mem.max(4096) as usize)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut at = from;
        while at < to {
            let n = (to - at).min(CHUNK);
            self.file.write_all_at(&zeros[..n as usize], at)?;
            at += n;
        }
        Ok(())
    }

    /// Direct-I/O alignment rules (with the size as grown so far).
    pub fn alignment(&self) -> Alignment {
        Alignment {
            size: self.size(),
            ..self.align
        }
    }

    /// Admits a request to a queue of this device ([`Rejected::admit`]
    /// with its alignment and whether it was opened read-only).
    pub(crate) fn admit(
        &self,
        req: Request,
        full: bool,
        capacity: usize,
    ) -> std::result::Result<Request, Rejected> {
        Rejected::admit(req, &self.alignment(), full, capacity, self.read_only)
    }

    /// True for a block device, false for a regular file.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// The write streams this device offers (0: none, as for every file);
    /// see [`super::placement`].
    pub fn write_streams(&self) -> u8 {
        self.write_streams
    }

    /// Tells the kernel the expected life of this file's writes
    /// (`F_SET_RW_HINT`). Advice: a kernel or file system that refuses it
    /// is answered with the error, and nothing else changes.
    pub fn set_write_life(&self, life: placement::WriteLife) -> std::io::Result<()> {
        placement::set_write_life(std::os::fd::AsFd::as_fd(&self.file), life)
    }

    /// True when opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Makes completed writes durable (fdatasync), synchronously.
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|source| {
            self.sync_failed.store(true, Ordering::Release);
            Error::Io {
                op: crate::OpKind::Flush,
                device: self.index,
                offset: 0,
                len: 0,
                source,
            }
        })
    }
}

impl Device {
    /// Bytes free for an unprivileged writer on the file system holding
    /// the device (`fstatvfs`: `f_bavail`), None for a block device or if
    /// the kernel does not say.
    pub fn free_bytes(&self) -> Option<u64> {
        if self.block_device {
            return None;
        }
        // SAFETY: statvfs is plain data; all-zero is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open for the device's life and st
        // points to a live statvfs struct.
        if unsafe { libc::fstatvfs(self.fd(), &mut st) } != 0 {
            return None;
        }
        (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
    }

    /// The file system (`st_dev`) the device's file lives on; None for a
    /// block device.
    pub fn file_system(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        if self.block_device {
            return None;
        }
        self.file.metadata().ok().map(|m| m.dev())
    }
}

/// Total bytes of the file system holding `fd` (`fstatvfs`).
fn file_system_size(fd: RawFd) -> Option<u64> {
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid and st points to a live statvfs struct.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return None;
    }
    (st.f_blocks as u64).checked_mul(st.f_frsize as u64)
}

/// `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

impl Device {
    /// Cuts a regular file to `keep` bytes, then allocates it to exactly
    /// `size` bytes (zeros past `keep`), synced: a data file a new database
    /// is created over reads back nothing of what it held
    /// (`open::erase_for_create`), and a file a new log is formatted over
    /// takes the size a new log file has (one of another size, which no
    /// log grows to, made every later open fail as a log cut short).
    /// Nothing for a block device. Blocking.
    pub fn reset(&self, keep: u64, size: u64) -> Result<()> {
        if self.block_device || keep >= size {
            return Ok(());
        }
        let _one_at_a_time = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let path = &self.path;
        self.file.set_len(keep).map_err(open_err("erase", path))?;
        preallocate(self.fd(), keep, size).map_err(|source| {
            file_error("allocate", path, source, || {
                format!("erasing {} ({size} bytes)", path.display())
            })
        })?;
        self.size.store(size, Ordering::Release);
        self.sync()
    }

    /// Tells the device that `len` bytes at `offset` hold nothing anyone
    /// will read again: a block device gets a discard (TRIM); a file's
    /// range is zeroed by `fallocate(ZERO_RANGE)`, which keeps its blocks
    /// allocated (a punched hole gives them back, and every later write
    /// there allocates again: ext4 takes the file's lock for it and
    /// io_uring hands it to a blocking worker; an out-of-place file, whose
    /// freed segments come here, ran `bench ycsb` at 0.74x of in place so,
    /// 0.78-0.82x with zeroed ranges; and on a full file system the write
    /// fails), or punched and allocated again where the file system has no
    /// zero range (tmpfs). Either way the range reads as zeros after, and
    /// `Target::discard_reads_zeros` promises that for files: a file
    /// system that can do neither is an error, not advice (the
    /// out-of-place device then writes zeros itself). For a block device
    /// it is advice: one that cannot discard is not an error. Blocking.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size()) {
            return Err(Error::InvalidArgument(format!(
                "discard of {len} bytes at {offset} on {} ({} bytes)",
                self.path.display(),
                self.size()
            )));
        }
        let fd = self.file.as_raw_fd();
        let r = if self.block_device {
            let range = [offset, len];
            // SAFETY: fd is a valid open descriptor; BLKDISCARD reads two
            // u64 from the pointer, which points at `range`.
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
        } else {
            let range = |mode| {
                // SAFETY: fd is a valid open descriptor; fallocate reads
                // no memory.
                unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) }
            };
            let zeroed = range(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE);
            let errno = std::io::Error::last_os_error().raw_os_error();
            if zeroed != 0 && matches!(errno, Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)) {
                // No zero range (tmpfs): punched, then allocated again
                // (zeros), so that the range keeps its blocks. A hole gave
                // them back, another file took them on a full file
                // system, and the next write there failed with ENOSPC,
                // which poisoned an out-of-place database (an outside
                // probe). Between the two calls the blocks are free: a
                // failure to get them back is this call's error (the
                // range reads as zeros either way).
                let punched = range(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE);
                if punched != 0 {
                    punched
                } else {
                    let allocated = range(libc::FALLOC_FL_KEEP_SIZE);
                    // A file system that punches but cannot allocate: the
                    // hole stays (zeros, as promised).
                    let unsupported = allocated != 0
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP);
                    if unsupported {
                        0
                    } else {
                        allocated
                    }
                }
            } else {
                zeroed
            }
        };
        if r == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL)
                if self.block_device =>
            {
                Ok(())
            }
            _ => Err(Error::Io {
                op: crate::OpKind::Write,
                device: self.index,
                offset,
                len: len as usize,
                source: err,
            }),
        }
    }
}

/// Allocates real blocks for `[from, to)` so that later writes never fail
/// for lack of space and reads of written data never hit holes.
fn preallocate(fd: RawFd, from: u64, to: u64) -> std::io::Result<()> {
    // SAFETY: fd is a valid open descriptor; fallocate reads no memory.
    let r = unsafe { libc::fallocate(fd, 0, from as libc::off_t, (to - from) as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // File systems without fallocate (tmpfs on old kernels): extend.
        // SAFETY: fd is valid; ftruncate reads no memory.
        if unsafe { libc::ftruncate(fd, to as libc::off_t) } == 0 {
            return Ok(());
        }
        return Err(std::io::Error::last_os_error());
    }
    Err(err)
}

fn block_device_size(fd: RawFd) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // to a live local.
    let r = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

fn logical_block_size(fd: RawFd) -> std::io::Result<u64> {
    let mut lbs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer to a live local.
    let r = unsafe { libc::ioctl(fd, libc::BLKSSZGET as _, &mut lbs as *mut libc::c_int) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lbs.max(512) as u64)
}

/// `statx` of an open file for `mask`, if the call succeeds and the kernel
/// filled what the mask asks.
fn statx_of(fd: RawFd, mask: libc::c_uint) -> Option<libc::statx> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: fd is valid, the path is a valid empty C string used with
    // AT_EMPTY_PATH, and stx points to a live statx struct.
    let r = unsafe { libc::statx(fd, empty.as_ptr(), libc::AT_EMPTY_PATH, mask, &mut stx) };
    (r == 0 && stx.stx_mask & mask == mask).then_some(stx)
}

/// (offset/length alignment, memory alignment) for direct I/O on a file, if
/// the kernel reports it (Linux 6.1+).
fn file_dio_alignment(fd: RawFd) -> Option<(u64, u64)> {
    let stx = statx_of(fd, libc::STATX_DIOALIGN)?;
    if stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((
        stx.stx_dio_offset_align as u64,
        stx.stx_dio_mem_align.max(1) as u64,
    ))
}

/// The (smallest, largest) untorn direct write on a file or block device,
/// if the kernel offers any (Linux 6.11+; 0 or an old kernel: none).
fn atomic_write_units(fd: RawFd) -> Option<(u64, u64)> {
    let stx = statx_of(fd, libc::STATX_WRITE_ATOMIC)?;
    if stx.stx_atomic_write_unit_min == 0
        || stx.stx_atomic_write_unit_max < stx.stx_atomic_write_unit_min
    {
        return None;
    }
    Some((
        u64::from(stx.stx_atomic_write_unit_min),
        u64::from(stx.stx_atomic_write_unit_max),
    ))
}

/// How long [`Device::open`] retries a device lock held by someone else.
/// A file given to io_uring stays referenced (and its lock held) until the
/// kernel has torn the ring down, which happens in the background after a
/// process exits, even after `kill -9`; the database directory's lock (no
/// ring ever holds it) has already told a live holder from that.
pub const DEVICE_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// Takes `flock(LOCK_SH or LOCK_EX | LOCK_NB)` on `file`, retrying every
/// few milliseconds for up to `patience`; a conflict is [`Error::Locked`].
pub fn lock_file_patiently(
    file: &File,
    path: &Path,
    shared: bool,
    patience: std::time::Duration,
) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        match lock_file(file, path, shared) {
            Err(Error::Locked { .. }) if start.elapsed() < patience => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

/// Takes `flock(LOCK_SH or LOCK_EX | LOCK_NB)` on `file`; a conflict is
/// [`Error::Locked`].
pub fn lock_file(file: &File, path: &Path, shared: bool) -> Result<()> {
    let op = if shared { libc::LOCK_SH } else { libc::LOCK_EX } | libc::LOCK_NB;
    loop {
        // SAFETY: flock on a descriptor this File owns; no memory involved.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                })
            }
            _ => return Err(open_err("lock", path)(e)),
        }
    }
}

/// Releases a lock taken by [`lock_file`].
pub fn unlock_file(file: &File) {
    // SAFETY: flock on a descriptor this File owns; no memory involved.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new 1 MiB device file in `dir`.
    fn new_device(dir: &tempfile::TempDir) -> (PathBuf, Device) {
        let path = dir.path().join("dev0");
        let opts = DeviceOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        };
        let dev = Device::open(&path, 0, opts).unwrap();
        (path, dev)
    }

    /// After a sync outside the queues failed, the queues fail every write
    /// and flush of the device (reads go on): a write-back error taken by
    /// that sync is never followed by a flush that says all is well.
    #[test]
    fn after_a_failed_outside_sync_writes_and_flushes_fail_reads_go_on() {
        use crate::io::{AlignedBuf, Backend, IoBuf, Request, Target};
        let dir = tempfile::tempdir().unwrap();
        let (_, dev) = new_device(&dir);
        let dev = std::sync::Arc::new(dev);
        dev.sync_failed.store(true, Ordering::Release);
        for backend in [Backend::Blocking, Backend::default()] {
            let t = Target::File(dev.clone());
            let mut q = crate::io::array::open_queue(&t, &backend, 4).unwrap();
            let buf = || IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
            let read = crate::io::sync_io(q.as_mut(), Request::read(0, 0, buf())).unwrap();
            assert!(read.result.is_ok(), "{:?}", read.result);
            let write = crate::io::sync_io(q.as_mut(), Request::write(0, 0, buf())).unwrap();
            assert!(write.result.is_err());
            let flush = crate::io::sync_io(q.as_mut(), Request::flush(0)).unwrap();
            assert!(flush.result.is_err());
        }
    }

    /// A write on a device opened read-only is refused at push with
    /// `ReadOnly` by either backend, and reads go on (the write went to
    /// the kernel and came back EBADF: the mirror's copies once waited
    /// for good on such a write).
    #[test]
    fn a_write_on_a_read_only_device_is_refused_with_read_only() {
        use crate::io::{AlignedBuf, Backend, IoBuf, Request, Target};
        let dir = tempfile::tempdir().unwrap();
        let (path, dev) = new_device(&dir);
        drop(dev);
        let opts = DeviceOptions {
            read_only: true,
            ..Default::default()
        };
        let dev = std::sync::Arc::new(Device::open(&path, 0, opts).unwrap());
        for backend in [Backend::Blocking, Backend::default()] {
            let t = Target::File(dev.clone());
            let mut q = crate::io::array::open_queue(&t, &backend, 4).unwrap();
            let buf = || IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
            let write = crate::io::sync_io(q.as_mut(), Request::write(0, 0, buf()));
            assert!(matches!(write, Err(Error::ReadOnly)), "{write:?}");
            let read = crate::io::sync_io(q.as_mut(), Request::read(0, 0, buf())).unwrap();
            assert!(read.result.is_ok(), "{:?}", read.result);
        }
    }

    /// A flush that failed in one queue fails the writes and flushes of
    /// every other queue of the device after it (the log growth's control
    /// block is synced through a queue of its own; a review found that its
    /// failed sync left the log's next fdatasync free to succeed).
    #[test]
    fn a_flush_failed_in_one_queue_fails_the_others_writes() {
        use crate::io::{AlignedBuf, Backend, IoBuf, Request, Target};
        let dir = tempfile::tempdir().unwrap();
        let (_, dev) = new_device(&dir);
        let dev = std::sync::Arc::new(dev);
        let t = Target::File(dev.clone());
        let mut q = crate::io::array::open_queue(&t, &Backend::default(), 4).unwrap();
        let buf = || IoBuf::owned(AlignedBuf::new(4096, 4096).unwrap());
        let write = crate::io::sync_io(q.as_mut(), Request::write(0, 0, buf())).unwrap();
        assert!(write.result.is_ok(), "{:?}", write.result);
        // What another queue's failed fdatasync reports.
        assert_eq!(
            dev.vetted(crate::OpKind::Flush, -(libc::EIO as i64)),
            -(libc::EIO as i64)
        );
        let write = crate::io::sync_io(q.as_mut(), Request::write(0, 0, buf())).unwrap();
        assert!(write.result.is_err());
        let flush = crate::io::sync_io(q.as_mut(), Request::flush(0)).unwrap();
        assert!(flush.result.is_err());
    }

    #[test]
    fn create_preallocates_and_reports_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let (path, dev) = new_device(&dir);
        assert_eq!(dev.size(), 1 << 20);
        assert!(dev.alignment().io.is_power_of_two());
        assert!(dev.alignment().io <= 4096);
        assert!(!dev.is_block_device());
        // The blocks are allocated, not a sparse hole.
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 >= 1 << 20);
    }

    /// A file's discarded range reads as zeros after (what
    /// `Target::discard_reads_zeros` promises the out-of-place device),
    /// and its blocks stay allocated (zeroed in place, no hole: later
    /// writes there need no allocation), here and on a tmpfs (`/dev/shm`,
    /// where there is one), which has no zero range: a punched hole there
    /// gave the blocks back.
    #[test]
    fn a_discarded_file_range_reads_zeros_and_keeps_its_blocks() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            dirs.push(shm);
        }
        for dir in &dirs {
            let (path, dev) = new_device(dir);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .read(true)
                .open(&path)
                .unwrap();
            f.write_all_at(&[0xAB; 3 * 4096], 4096).unwrap();
            f.sync_all().unwrap();
            let blocks = std::fs::metadata(&path).unwrap().blocks();
            dev.discard(4096, 2 * 4096).unwrap();
            let mut back = vec![0u8; 3 * 4096];
            f.read_exact_at(&mut back, 4096).unwrap();
            let at = dir.path().display();
            assert!(
                back[..2 * 4096].iter().all(|&b| b == 0),
                "{at}: the range reads zeros"
            );
            assert!(
                back[2 * 4096..].iter().all(|&b| b == 0xAB),
                "{at}: the rest kept"
            );
            let now = std::fs::metadata(&path).unwrap().blocks();
            assert_eq!(now, blocks, "{at}: no hole");
        }
    }

    #[test]
    fn grow_allocates_and_never_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let (path, dev) = new_device(&dir);
        dev.grow(3 << 20).unwrap();
        assert_eq!(dev.size(), 3 << 20);
        assert_eq!(dev.alignment().size, 3 << 20);
        dev.grow(2 << 20).unwrap();
        assert_eq!(dev.size(), 3 << 20, "growth never shrinks");
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 3 << 20);
        assert!(meta.blocks() * 512 >= 3 << 20, "the new range is allocated");
        let err = dev.grow(dev.max_size() + 4096).unwrap_err();
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Device::open("/nonexistent/dana/dev", 0, DeviceOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/dana/dev"), "{msg}");
    }
}
