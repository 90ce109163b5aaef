//! A data disk and a log disk on the deterministic simulator, for the
//! power-cut tests: the same seed replays the same run.

use std::sync::Arc;

use dana::io::sim::{PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
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

    /// Runs `work` with the power cut at request `point` of both disks
    /// (0: never; each unsynced write then kept, dropped or torn, by
    /// `seed`); a run that ends before the cut must succeed and is cut at
    /// its end. Powers the disks on again; returns the requests made.
    pub fn cut_during(
        &self,
        point: u64,
        seed: u64,
        work: impl FnOnce() -> dana::Result<()>,
    ) -> u64 {
        let policy = PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 1.0,
        };
        let switch = PowerSwitch::new(point, policy, seed);
        switch.attach(&self.data);
        switch.attach(&self.log);
        let outcome = work();
        if !switch.fired() {
            outcome.unwrap();
            switch.cut();
        }
        let ios = switch.count();
        self.data.power_on();
        self.log.power_on();
        ios
    }

    /// Reopens after a cut at `point` and asserts that the checker finds
    /// nothing wrong and every page owned.
    pub fn reopen_checked(&self, opts: Options, point: u64) -> Db {
        let db = self
            .open(opts, false)
            .unwrap_or_else(|e| panic!("point {point}: reopen: {e}"));
        let report = db.check().unwrap();
        assert!(
            report.is_ok() && report.lost_pages == 0,
            "point {point}: {} lost pages, findings {:?}",
            report.lost_pages,
            report.findings
        );
        db
    }
}
