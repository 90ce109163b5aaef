//! One background growth of a file at a time.
//!
//! Owns: the thread that grows a data array or a log file (`fallocate`,
//! zero-filling and `fdatasync` block, so no worker may run them), whether
//! one is running, the last failure and when it happened (so that a full
//! file system answers at once for a while instead of being asked again
//! on every write), and the join of the thread before the files' locks go
//! away. Used by the buffer pool's allocator and by the log.
//!
//! Never: runs two growths at once, or lets a growth thread outlive
//! [`Grower::finish`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A failure and when it happened.
type Failure = Option<(Instant, String)>;

/// Runs growths on a background thread, one at a time.
#[derive(Default)]
pub struct Grower {
    running: Arc<AtomicBool>,
    failure: Arc<Mutex<Failure>>,
    /// Threads not joined yet (a finished one is joined at the next start;
    /// at most two live: one ending, one just started).
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What [`Grower::start`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Started {
    /// A growth thread started.
    Now,
    /// One was already running.
    AlreadyRunning,
}

impl Grower {
    /// The last failure, if it happened less than `within` ago.
    pub fn recent_failure(&self, within: Duration) -> Option<String> {
        let f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        f.as_ref()
            .filter(|(at, _)| at.elapsed() < within)
            .map(|(_, what)| what.clone())
    }

    /// Runs `work` on a thread named `name`, unless a growth is running.
    /// When it ends, its failure (or none) is recorded and the grower is
    /// free again, then `done` runs with its outcome. Err if no thread
    /// could start (recorded as a failure too).
    pub fn start(
        &self,
        name: &str,
        work: impl FnOnce() -> Result<(), String> + Send + 'static,
        done: impl FnOnce(&Result<(), String>) + Send + 'static,
    ) -> Result<Started, String> {
        if self.running.swap(true, Ordering::AcqRel) {
            return Ok(Started::AlreadyRunning);
        }
        let (running, failure) = (self.running.clone(), self.failure.clone());
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // A panic is a failure like any other: `running` must clear.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                    .unwrap_or_else(|_| Err("the growth thread panicked".into()));
                *failure.lock().unwrap_or_else(|e| e.into_inner()) =
                    r.as_ref().err().map(|what| (Instant::now(), what.clone()));
                running.store(false, Ordering::Release);
                done(&r);
            });
        match spawned {
            Ok(handle) => {
                let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
                // Join the threads that have ended (never wait here for
                // one still running: a worker calls this).
                let (ended, live): (Vec<_>, Vec<_>) =
                    threads.drain(..).partition(JoinHandle::is_finished);
                for t in ended {
                    let _ = t.join();
                }
                *threads = live;
                threads.push(handle);
                Ok(Started::Now)
            }
            Err(e) => {
                let what = format!("cannot start a growth thread: {e}");
                *self.failure.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), what.clone()));
                self.running.store(false, Ordering::Release);
                Err(what)
            }
        }
    }

    /// Waits for every growth thread to end.
    pub fn finish(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn one_growth_at_a_time_and_failures_are_remembered() {
        let g = Grower::default();
        let (go, wait) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let first = g.start(
            "test-grow",
            move || {
                wait.recv().unwrap();
                Err("full".into())
            },
            move |r| tx.send(r.clone()).unwrap(),
        );
        assert_eq!(first, Ok(Started::Now));
        let second = g.start("test-grow", || Ok(()), |_| {});
        assert_eq!(second, Ok(Started::AlreadyRunning));
        go.send(()).unwrap();
        assert_eq!(rx.recv().unwrap(), Err("full".to_string()));
        g.finish();
        assert_eq!(
            g.recent_failure(Duration::from_secs(60)).as_deref(),
            Some("full")
        );
        assert_eq!(g.recent_failure(Duration::ZERO), None, "too old");
        assert_eq!(g.start("test-grow", || Ok(()), |_| {}), Ok(Started::Now));
        g.finish();
        assert_eq!(g.recent_failure(Duration::from_secs(60)), None, "cleared");
        // A panic ends the growth with a failure; the grower stays usable.
        let started = g.start("test-grow", || panic!("boom"), |_| {});
        assert_eq!(started, Ok(Started::Now));
        g.finish();
        assert!(g.recent_failure(Duration::from_secs(60)).is_some());
        assert_eq!(g.start("test-grow", || Ok(()), |_| {}), Ok(Started::Now));
        g.finish();
    }
}

/// Space another growing file still needs on a file system: the log files
/// grow into their full size during their first lap, and the data files'
/// growth must leave them that room. Otherwise, once the file system
/// fills, the log cannot grow and every commit fails, a delete too (which
/// needs log space to free data pages): the reserve makes the data files
/// stop first, and deletes make room again (an outside probe found the
/// first version refusing every write, deletes included).
#[derive(Debug, Clone)]
pub struct SpaceReserve {
    /// The file system (`st_dev`) it is on.
    pub file_system: u64,
    /// Each growing file and the size it grows to.
    pub files: Vec<(super::Target, u64)>,
}

impl SpaceReserve {
    /// Bytes the files still need to reach their full sizes.
    pub fn needed(&self) -> u64 {
        self.files
            .iter()
            .map(|(t, full)| full.saturating_sub(t.size()))
            .sum()
    }
}
