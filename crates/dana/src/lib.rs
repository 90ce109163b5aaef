//! dana: an embedded storage engine for directly-attached NVMe SSD arrays.
//!
//! Layers, bottom up (see `docs/ARCHITECTURE.md`):
//! - [`io`]: devices opened with `O_DIRECT`, arrays striped by page, and
//!   per-worker, per-device queues over io_uring, blocking syscalls or a
//!   simulated device with fault injection.
//! - [`btree`]: the B+tree; today its node format ([`btree::node`]).
//!
//! `unsafe` is denied here and allowed only in the modules that own raw
//! memory handed to the kernel (`io`) and frame memory (`buffer`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod btree;
pub mod error;
#[allow(unsafe_code)]
pub mod io;

pub use error::{Error, OpKind, Result};
