//! An array of devices striped by page, and the choice of backend.
//!
//! Owns: the one function that decides where a page lives
//! ([`Array::locate`]: page `p` is on device `p % N` at offset
//! `(p / N) * page_size`), the array's size in pages and its growth (every
//! device grows in lockstep, [`Array::grow_to`]), and the opening of one
//! queue per device for a worker. Never: performs page I/O itself, or lets
//! a page past the durable size of every device be used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::blocking::BlockingQueue;
use super::device::Device;
use super::mirror::Mirror;
use super::remap::Remap;
use super::sim::SimDisk;
use super::uring::{UringOptions, UringQueue};
use super::{Alignment, IoQueue};
use crate::{Error, Result};

/// Something a queue can be opened on.
#[derive(Debug, Clone)]
pub enum Target {
    /// A file or block device.
    File(Arc<Device>),
    /// A simulated device (any [`Backend`] opens a simulator queue on it).
    Sim(Arc<SimDisk>),
    /// A mirrored group of copies, each one of the above (see
    /// [`super::mirror`]).
    Mirror(Arc<Mirror>),
    /// A file or simulated device written out of place (see
    /// [`super::remap`]): fixed in size.
    Remap(Arc<Remap>),
}

impl Target {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Target::File(d) => d.size(),
            Target::Sim(d) => d.size(),
            Target::Mirror(m) => m.size(),
            Target::Remap(r) => r.size(),
        }
    }

    /// The most bytes the target can grow to.
    pub fn max_size(&self) -> u64 {
        match self {
            Target::File(d) => d.max_size(),
            Target::Sim(d) => d.space_limit().max(d.size()),
            Target::Mirror(m) => m.max_size(),
            Target::Remap(r) => r.size(),
        }
    }

    /// Grows the target to `bytes`, durably (see [`Device::grow`]).
    pub fn grow(&self, bytes: u64) -> Result<()> {
        match self {
            Target::File(d) => d.grow(bytes),
            Target::Sim(d) => d.grow(bytes),
            Target::Mirror(m) => m.grow(bytes),
            Target::Remap(r) => remap_cannot_grow(r, bytes),
        }
    }

    /// Grows the target to `bytes` with zeros written over the new range
    /// (see [`Device::grow_zeroed`]).
    pub fn grow_zeroed(&self, bytes: u64) -> Result<()> {
        match self {
            Target::File(d) => d.grow_zeroed(bytes),
            Target::Sim(d) => d.grow(bytes),
            Target::Mirror(m) => m.grow_zeroed(bytes),
            Target::Remap(r) => remap_cannot_grow(r, bytes),
        }
    }

    /// Tells the device that `len` bytes at `offset` will not be read
    /// again (TRIM; see [`Device::discard`], [`SimDisk::discard`]).
    /// An out-of-place device unmaps the pages ([`Remap::discard`]).
    /// Advice: a mirrored group takes it as nothing. Blocking.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        match self {
            Target::File(d) => d.discard(offset, len),
            Target::Sim(d) => d.discard(offset, len),
            Target::Remap(r) => r.discard(offset, len),
            Target::Mirror(_) => Ok(()),
        }
    }

    /// True if a discard costs no more than the call and spares the
    /// flash: a block device's TRIM, the simulator's FTL. A file's zeroed
    /// range (or punched hole) is not: the next write there converts or
    /// allocates its blocks again (and a synced one then writes file
    /// system metadata too).
    pub fn discards_cheaply(&self) -> bool {
        match self {
            Target::File(d) => d.is_block_device(),
            Target::Sim(_) => true,
            // A discard unmaps the pages: their extents die, and the
            // collection copies them no more (where it can: `Remap::unmaps`).
            Target::Remap(r) => r.unmaps(),
            Target::Mirror(_) => false,
        }
    }

    /// True if a discarded range reads back as zeros: a regular file's
    /// punched hole, the simulator. Not a block device: after a
    /// `BLKDISCARD` reads may return zeros, ones, the old data or anything
    /// (unless the drive promises zeros, which dana does not ask).
    pub fn discard_reads_zeros(&self) -> bool {
        match self {
            Target::File(d) => !d.is_block_device(),
            Target::Sim(_) => true,
            Target::Mirror(_) | Target::Remap(_) => false,
        }
    }

    /// True if a write of `len` bytes (a power of two), aligned to its
    /// length, can be issued untorn ([`super::Request::atomic`]): a file or block
    /// device whose kernel offers `RWF_ATOMIC` for that length, or a
    /// simulated device configured so. A mirrored group says no (its
    /// copies would each be whole, but could differ after a cut), and an
    /// out-of-place device needs none (it never overwrites a page's last
    /// version).
    pub fn untorn_writes(&self, len: u64) -> bool {
        match self {
            Target::File(d) => d.untorn_writes(len),
            Target::Sim(d) => d.untorn_writes(len),
            Target::Mirror(_) | Target::Remap(_) => false,
        }
    }

    /// Direct-I/O alignment.
    pub fn alignment(&self) -> Alignment {
        match self {
            Target::File(d) => d.alignment(),
            Target::Sim(d) => d.alignment(),
            Target::Mirror(m) => m.alignment(),
            Target::Remap(r) => r.alignment(),
        }
    }

    /// True for a regular file (or a mirror of them): it may be shorter
    /// than what is written to it later, and grows.
    pub fn is_growable(&self) -> bool {
        match self {
            Target::File(d) => !d.is_block_device(),
            Target::Sim(_) => false,
            Target::Mirror(m) => m.is_growable(),
            Target::Remap(_) => false,
        }
    }

    /// What the target is, for messages: a file's path, a simulated
    /// device's index, a mirrored group's role, an out-of-place device's
    /// file.
    pub fn describe(&self) -> String {
        match self {
            Target::File(d) => d.path().display().to_string(),
            Target::Sim(d) => format!("simulated device {}", d.index()),
            Target::Mirror(m) => {
                let copies: Vec<String> = m
                    .targets()
                    .iter()
                    .map(|t| t.as_ref().map_or("(none)".into(), Target::describe))
                    .collect();
                format!("{}, mirrored on {}", m.role(), copies.join(", "))
            }
            Target::Remap(r) => format!("{} (out of place)", r.inner().describe()),
        }
    }

    /// The mirrored group, if this target is one.
    pub fn mirror(&self) -> Option<&Arc<Mirror>> {
        match self {
            Target::Mirror(m) => Some(m),
            _ => None,
        }
    }

    /// The files (or block devices) that hold this target's bytes, each
    /// with the bytes its file holds when the target holds `bytes`: a
    /// file's own, a mirror's copies that are files (each `bytes` and its
    /// label); none for a simulated or out-of-place device.
    pub fn files(&self, bytes: u64) -> Vec<(Arc<Device>, u64)> {
        match self {
            Target::File(d) => vec![(d.clone(), bytes)],
            Target::Mirror(m) => m
                .targets()
                .into_iter()
                .flatten()
                .flat_map(|t| t.files(bytes + super::mirror::LABEL_BYTES))
                .collect(),
            Target::Sim(_) | Target::Remap(_) => Vec::new(),
        }
    }
}

/// An out-of-place device keeps its size: growing past it fails.
fn remap_cannot_grow(r: &Remap, bytes: u64) -> Result<()> {
    if bytes <= r.size() {
        return Ok(());
    }
    Err(Error::NoSpace(format!(
        "an out-of-place device does not grow: {bytes} bytes asked, {} offered",
        r.size()
    )))
}

/// Which kernel interface moves requests to file and block devices.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    /// io_uring: batched submission, registered files and buffers.
    Uring(UringOptions),
    /// pread/pwrite/fdatasync, one syscall per request (the baseline).
    Blocking,
}

impl Default for Backend {
    fn default() -> Self {
        Backend::Uring(UringOptions::default())
    }
}

impl Backend {
    /// Short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Uring(o) if o.sqpoll => "uring+sqpoll",
            Backend::Uring(o) if o.iopoll => "uring+iopoll",
            Backend::Uring(_) => "uring",
            Backend::Blocking => "blocking",
        }
    }
}

/// N devices, striped by page.
#[derive(Debug, Clone)]
pub struct Array {
    targets: Vec<Target>,
    page_size: u64,
    /// Pages each device holds now (shared by every clone; grows).
    pages_per_device: Arc<AtomicU64>,
    /// The most pages per device growth may reach.
    max_pages_per_device: u64,
    /// Whether that is the database's maximum size
    /// ([`Array::with_max_bytes`]) rather than the devices' own.
    capped: bool,
    /// Serialises growth.
    growing: Arc<Mutex<()>>,
}

impl Array {
    /// An array over `targets` with the given page size (a power of two and
    /// a multiple of every device's direct-I/O alignment).
    pub fn new(targets: Vec<Target>, page_size: u64) -> Result<Array> {
        if targets.is_empty() {
            return Err(Error::InvalidArgument(
                "an array needs at least one device".into(),
            ));
        }
        if !page_size.is_power_of_two() || page_size < 512 {
            return Err(Error::InvalidArgument(format!(
                "page size {page_size} must be a power of two >= 512"
            )));
        }
        for (i, t) in targets.iter().enumerate() {
            let a = t.alignment();
            if page_size % a.io != 0 || page_size % a.mem != 0 {
                return Err(Error::Misaligned {
                    what: "page size",
                    value: page_size,
                    align: a.io.max(a.mem),
                    device: i,
                });
            }
        }
        // A crash in the middle of a growth can leave the devices at
        // different sizes: the smallest counts (the next growth evens them).
        let pages_per_device = targets
            .iter()
            .map(|t| t.size() / page_size)
            .min()
            .unwrap_or(0);
        let max_pages_per_device = targets
            .iter()
            .map(|t| t.max_size() / page_size)
            .min()
            .unwrap_or(0)
            .max(pages_per_device);
        Ok(Array {
            targets,
            page_size,
            pages_per_device: Arc::new(AtomicU64::new(pages_per_device)),
            max_pages_per_device,
            capped: false,
            growing: Arc::new(Mutex::new(())),
        })
    }

    /// Caps growth at `bytes` in all (the database's maximum size), never
    /// below the size the devices have now.
    pub fn with_max_bytes(mut self, bytes: Option<u64>) -> Array {
        if let Some(b) = bytes {
            let per_device = b / self.targets.len() as u64 / self.page_size;
            self.capped = per_device < self.max_pages_per_device;
            self.max_pages_per_device = self
                .max_pages_per_device
                .min(per_device)
                .max(self.pages_per_device.load(Ordering::Acquire));
        }
        self
    }

    /// Number of devices.
    pub fn width(&self) -> usize {
        self.targets.len()
    }

    /// Copies of each device: 1, or the copies of its mirrored devices.
    pub fn copies(&self) -> usize {
        self.targets
            .iter()
            .filter_map(|t| t.mirror().map(|m| m.copies()))
            .max()
            .unwrap_or(1)
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Number of pages the array holds now.
    pub fn pages(&self) -> u64 {
        self.pages_per_device.load(Ordering::Acquire) * self.targets.len() as u64
    }

    /// The most pages the array can grow to.
    pub fn max_pages(&self) -> u64 {
        self.max_pages_per_device * self.targets.len() as u64
    }

    /// What sets [`Array::max_pages`], for an error that names it.
    pub fn max_pages_set_by(&self) -> &'static str {
        if self.targets.iter().any(|t| matches!(t, Target::Remap(_))) {
            // Created whole at the capacity, less the segments kept for
            // collection (it blamed the file systems: an outside probe).
            "Options::capacity_bytes, less what out-of-place writes keep in reserve"
        } else if self.capped {
            "Options::capacity_bytes"
        } else {
            "what its devices' file systems or block devices hold"
        }
    }

    /// Grows every device so that the array holds at least `pages` pages
    /// (rounded up to a whole stripe, capped at [`Array::max_pages`]), and
    /// returns the pages it holds after. Each device's new size is durable
    /// before the array's size moves, so no page in the new range is used
    /// before it exists after a crash. Blocking: call it from a growth
    /// thread or at recovery, never on a worker. On a failure (a full file
    /// system: [`Error::NoSpace`]) the array keeps its old size; devices
    /// that did grow keep the extra bytes, unused until the next growth.
    pub fn grow_to(&self, pages: u64) -> Result<u64> {
        let _one_at_a_time = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let width = self.targets.len() as u64;
        let want = pages.div_ceil(width).min(self.max_pages_per_device);
        if want <= self.pages_per_device.load(Ordering::Acquire) {
            return Ok(self.pages());
        }
        for t in &self.targets {
            t.grow(want * self.page_size)?;
        }
        self.pages_per_device.fetch_max(want, Ordering::AcqRel);
        Ok(self.pages())
    }

    /// The devices.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Where page `page` lives: (device index, byte offset).
    #[inline]
    pub fn locate(&self, page: u64) -> (usize, u64) {
        let n = self.targets.len() as u64;
        ((page % n) as usize, (page / n) * self.page_size)
    }

    /// Where page `page` lies, for messages: `<device> at byte <offset>`
    /// (an out-of-place device's offset is the page's logical one).
    pub fn describe_page(&self, page: u64) -> String {
        let (device, offset) = self.locate(page);
        match self.targets.get(device) {
            Some(t @ Target::Mirror(_)) => format!(
                "{} at byte {offset} of the device (byte {} of each copy's file)",
                t.describe(),
                offset + crate::io::mirror::LABEL_BYTES
            ),
            Some(t) => format!("{} at byte {offset}", t.describe()),
            None => format!("device {device} at byte {offset}"),
        }
    }

    /// Opens one queue per device for one worker, with room for `depth`
    /// requests each.
    pub fn open_queues(&self, backend: &Backend, depth: u32) -> Result<Vec<Box<dyn IoQueue>>> {
        self.targets
            .iter()
            .map(|t| open_queue(t, backend, depth))
            .collect()
    }
}

/// Opens a queue on one target. A simulated target ignores `backend`.
pub fn open_queue(target: &Target, backend: &Backend, depth: u32) -> Result<Box<dyn IoQueue>> {
    match (target, backend) {
        (Target::File(d), Backend::Uring(o)) => {
            Ok(Box::new(UringQueue::new(d.clone(), depth, *o)?))
        }
        (Target::File(d), Backend::Blocking) => Ok(Box::new(BlockingQueue::new(d.clone(), depth))),
        (Target::Sim(d), _) => Ok(Box::new(d.queue(depth))),
        (Target::Mirror(m), b) => Ok(Box::new(m.queue(b, depth)?)),
        (Target::Remap(r), b) => Ok(Box::new(r.queue(b, depth)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::device::DeviceOptions;

    #[test]
    fn striping_by_page() {
        let dir = tempfile::tempdir().unwrap();
        let targets = (0..3)
            .map(|i| {
                let opts = DeviceOptions {
                    create_size: Some(64 * 4096),
                    ..Default::default()
                };
                Target::File(Arc::new(
                    Device::open(dir.path().join(format!("d{i}")), i, opts).unwrap(),
                ))
            })
            .collect();
        let a = Array::new(targets, 4096).unwrap();
        assert_eq!(a.pages(), 192);
        assert_eq!(a.locate(0), (0, 0));
        assert_eq!(a.locate(4), (1, 4096));
        assert_eq!(a.locate(8), (2, 2 * 4096));
    }

    #[test]
    fn growth_moves_every_device_in_lockstep_and_stops_at_the_maximum() {
        let disks: Vec<_> = (0..3)
            .map(|i| SimDisk::new(i, 16 * 4096, Default::default()))
            .collect();
        for d in &disks {
            d.set_space_limit(64 * 4096);
        }
        let targets = disks.iter().cloned().map(Target::Sim).collect();
        let a = Array::new(targets, 4096)
            .unwrap()
            .with_max_bytes(Some(3 * 40 * 4096));
        assert_eq!((a.pages(), a.max_pages()), (48, 120));
        assert_eq!(a.max_pages_set_by(), "Options::capacity_bytes");
        let clone = a.clone();
        assert_eq!(a.grow_to(50).unwrap(), 51, "a whole stripe");
        assert_eq!(clone.pages(), 51, "clones see the growth");
        assert!(disks.iter().all(|d| d.size() == 17 * 4096));
        assert_eq!(a.grow_to(1000).unwrap(), 120, "capped at the maximum");
        disks[1].set_space_limit(0);
        let b = Array::new(disks.iter().cloned().map(Target::Sim).collect(), 4096).unwrap();
        assert_eq!(b.pages(), 120);
        // A maximum past what the devices hold is not what limits growth
        // (the error once named the option when none was set).
        let b = b.with_max_bytes(Some(1 << 40));
        assert!(b.max_pages_set_by().contains("devices"));
    }

    #[test]
    fn a_full_device_fails_the_growth_and_keeps_the_size() {
        let disks: Vec<_> = (0..2)
            .map(|i| SimDisk::new(i, 8 * 4096, Default::default()))
            .collect();
        for d in &disks {
            d.set_space_limit(64 * 4096);
        }
        let a = Array::new(disks.iter().cloned().map(Target::Sim).collect(), 4096).unwrap();
        // Device 1's file system fills up: the array keeps 16 pages.
        disks[1].set_space_limit(8 * 4096);
        let err = a.grow_to(40).unwrap_err();
        assert!(matches!(err, Error::NoSpace(_)), "{err}");
        assert_eq!(a.pages(), 16);
        disks[1].set_space_limit(64 * 4096);
        assert_eq!(a.grow_to(40).unwrap(), 40);
    }
}
