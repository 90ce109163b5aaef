//! Reads in flight, by page id, so that concurrent faults on one page cause
//! one read (each awaited through a [`crate::sched::IoWait`]).
//!
//! Owns: a table partitioned by page id (one mutex per partition, no global
//! lock). An entry exists from the moment a task wins EVICTED -> LOADING
//! until the worker that reaps the read removes it and completes the wait.
//! Never: completes a wait twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::sched::IoWait;

const PARTITIONS: usize = 64;

/// Page id -> the read in flight for it.
pub(crate) struct InFlight {
    parts: Vec<Mutex<HashMap<u64, Arc<IoWait>>>>,
}

impl InFlight {
    pub(crate) fn new() -> InFlight {
        InFlight {
            parts: (0..PARTITIONS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    fn part(&self, pid: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<IoWait>>> {
        let i = (pid.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % PARTITIONS;
        self.parts[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the read of `pid` (by the task that won LOADING).
    pub(crate) fn insert(&self, pid: u64) -> Arc<IoWait> {
        let w = Arc::new(IoWait::default());
        let prev = self.part(pid).insert(pid, w.clone());
        debug_assert!(prev.is_none(), "two reads in flight for page {pid}");
        w
    }

    /// The read in flight for `pid`, if any.
    pub(crate) fn get(&self, pid: u64) -> Option<Arc<IoWait>> {
        self.part(pid).get(&pid).cloned()
    }

    /// Removes and returns the entry (by the worker that reaped the read).
    pub(crate) fn remove(&self, pid: u64) -> Option<Arc<IoWait>> {
        self.part(pid).remove(&pid)
    }
}
