//! An array of devices striped by page, and the choice of backend.
//!
//! Owns: the one function that decides where a page lives
//! ([`Array::locate`]: page `p` is on device `p % N` at offset
//! `(p / N) * page_size`), and the opening of one queue per device for a
//! worker. Never: performs I/O itself.

use std::sync::Arc;

use super::blocking::BlockingQueue;
use super::device::Device;
use super::uring::{UringOptions, UringQueue};
use super::{Alignment, IoQueue};
use crate::{Error, Result};

/// Something a queue can be opened on.
#[derive(Debug, Clone)]
pub enum Target {
    /// A file or block device.
    File(Arc<Device>),
}

impl Target {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Target::File(d) => d.size(),
        }
    }

    /// Direct-I/O alignment.
    pub fn alignment(&self) -> Alignment {
        match self {
            Target::File(d) => d.alignment(),
        }
    }
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
    pages_per_device: u64,
}

impl Array {
    /// An array over `targets` with the given page size (a power of two and
    /// a multiple of every device's direct-I/O alignment).
    pub fn new(targets: Vec<Target>, page_size: u64) -> Result<Array> {
        if targets.is_empty() {
            return Err(Error::InvalidArgument("an array needs at least one device".into()));
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
        let pages_per_device = targets
            .iter()
            .map(|t| t.size() / page_size)
            .min()
            .unwrap_or(0);
        Ok(Array {
            targets,
            page_size,
            pages_per_device,
        })
    }

    /// Number of devices.
    pub fn width(&self) -> usize {
        self.targets.len()
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Number of pages the array holds.
    pub fn pages(&self) -> u64 {
        self.pages_per_device * self.targets.len() as u64
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

    /// Opens one queue per device for one worker, with room for `depth`
    /// requests each.
    pub fn open_queues(&self, backend: &Backend, depth: u32) -> Result<Vec<Box<dyn IoQueue>>> {
        self.targets
            .iter()
            .map(|t| open_queue(t, backend, depth))
            .collect()
    }
}

/// Opens a queue on one target.
pub fn open_queue(target: &Target, backend: &Backend, depth: u32) -> Result<Box<dyn IoQueue>> {
    match (target, backend) {
        (Target::File(d), Backend::Uring(o)) => Ok(Box::new(UringQueue::new(d.clone(), depth, *o)?)),
        (Target::File(d), Backend::Blocking) => Ok(Box::new(BlockingQueue::new(d.clone(), depth))),
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
}
