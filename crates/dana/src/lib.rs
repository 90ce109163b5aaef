//! dana: an embedded storage engine for directly-attached NVMe SSD arrays.
//!
//! Layers, bottom up (see `docs/ARCHITECTURE.md`):
//! - [`io`]: devices opened with `O_DIRECT`, arrays striped by page, and
//!   per-worker, per-device queues over io_uring, blocking syscalls or a
//!   simulated device with fault injection; growth of the files on a
//!   background thread.
//! - [`sched`]: worker threads running user tasks (futures) that yield on
//!   a page miss, with I/O submission, eviction and completion handling as
//!   system tasks in the same loop.
//! - [`buffer`]: the buffer pool: page table with latches, frames, reads in
//!   flight, write-aware (WATT) or clock eviction, write-back, page
//!   allocation and growth of the array on demand.
//! - [`btree`]: B+tree nodes and trees on buffer-pool pages.
//! - [`wal`]: the write-ahead log, group commit, checkpoints and recovery.
//! - [`txn`]: the commit protocol: key locks, validation, reservations,
//!   the commit record, apply.
//! - [`validate`]: serializable transactions: read sets validated at
//!   commit against the trees and the commits in flight.
//! - [`transaction`]: the public transaction over one or more trees.
//! - [`iter`]: the streaming, double-ended iterator over a key range.
//! - [`catalog`]: creating and dropping trees without leaking a page.
//! - [`check`]: the read-only consistency checker (`dana check`).
//!
//! `unsafe` is denied here and allowed only in the modules that own raw
//! memory handed to the kernel (`io`) and frame memory (`buffer`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod btree;
#[allow(unsafe_code)]
pub mod buffer;
pub mod catalog;
pub mod check;
mod checkpoint;
pub mod db;
pub mod error;
#[allow(unsafe_code)]
pub mod io;
pub mod iter;
mod open;
pub mod options;
mod read_fence;
mod recovery;
pub mod sched;
mod start;
pub mod stats;
pub mod transaction;
pub mod txn;
pub mod validate;
pub mod wal;

pub use buffer::EvictionPolicy;
pub use db::{Db, Tree};
pub use error::{Error, OpKind, Result};
pub use iter::Iter;
pub use options::{
    Options, WriteMode, INITIAL_DATA_BYTES, MAX_DEVICES, MAX_QUEUE_DEPTH, MAX_WORKERS,
    MIN_CAPACITY_PAGES, MIN_POOL_FRAMES,
};
pub use transaction::Transaction;
pub use validate::Isolation;
pub use wal::Durability;
