//! A data disk and a log disk on the deterministic simulator, for the
//! power-cut tests: the same seed replays the same run.

use std::sync::Arc;

use dana::io::sim::{SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Options};

/// One simulated data device and one simulated log device.
pub struct Rig {
    pub data: Arc<SimDisk>,
    pub log: Arc<SimDisk>,
}

impl Rig {
    /// Replayable disks (every request completes at the next reap):
    /// `data_bytes` of data, a log area of `log_bytes` after the control
    /// blocks.
    pub fn new(seed: u64, data_bytes: u64, log_bytes: u64) -> Rig {
        let config = SimConfig::replayable;
        Rig {
            data: SimDisk::new(0, data_bytes, config(seed)),
            log: SimDisk::new(1, CONTROL_BYTES + log_bytes, config(seed ^ 1)),
        }
    }

    /// Opens (or with `create`, creates) the database on the two disks.
    pub fn open(&self, opts: Options, create: bool) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        Db::open_array_with_log(array, Some(Target::Sim(self.log.clone())), opts, create)
    }
}
