//! Data devices that write a page untorn (`RWF_ATOMIC`; here the
//! simulator's `atomic_write_max`): every write-back asks for it, and the
//! log carries no full page images to repair torn pages.
//!
//! - The log of rounds of updates, each after a checkpoint, holds no full
//!   image on such a device and hundreds on the same device without it
//!   (or with `Options::untorn_page_writes(false)`).
//! - Power cuts that tear every other write (writes kept, dropped or torn
//!   sector by sector; an untorn write is kept or dropped whole) lose no
//!   acknowledged commit, and `check` passes. A device that tore the
//!   writes it promised untorn fails this test (checked by hand: the
//!   simulator changed to tear them anyway, pages failed their checksums
//!   after the cut and values were lost), so the images are what a plain
//!   device needs and the flag is what makes them unneeded.
//! - On a plain device, the same power cuts with the images logged
//!   compressed (`Options::compress_log_images`) lose nothing either: the
//!   torn pages are rebuilt from LZ4 blocks.

use std::sync::Arc;

use dana::io::sim::{PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Options};

use crate::page_writes;

const LOG: u64 = 4 << 20;

struct Rig {
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
}

impl Rig {
    fn new(seed: u64, untorn: bool) -> Rig {
        let data = SimConfig {
            atomic_write_max: if untorn { 64 << 10 } else { 0 },
            ..SimConfig::deterministic(seed)
        };
        Rig {
            data: SimDisk::new(0, 16 << 20, data),
            log: SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::deterministic(seed ^ 1)),
        }
    }

    fn open(&self, create: bool, opts: Options) -> dana::Result<Db> {
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        Db::open_array_with_log(array, Some(Target::Sim(self.log.clone())), opts, create)
    }
}

fn opts() -> Options {
    Options::default().pool_bytes(1 << 20).log_bytes(LOG)
}

/// Log bytes and full images of five rounds of updates, each followed by
/// a checkpoint.
fn update_rounds_log(untorn_device: bool, opts: Options) -> (u64, u64) {
    let rig = Rig::new(7, untorn_device);
    page_writes::update_rounds_log(rig.open(true, opts).unwrap())
}

#[test]
fn untorn_devices_log_no_full_images() {
    let (untorn_bytes, untorn_images) = update_rounds_log(true, opts());
    let (plain_bytes, plain_images) = update_rounds_log(false, opts());
    let (off_bytes, off_images) = update_rounds_log(true, opts().untorn_page_writes(false));
    assert_eq!(untorn_images, 0, "untorn: {untorn_bytes} log bytes");
    assert!(plain_images > 5 * 50, "plain: {plain_images} images");
    assert!(
        off_images > 5 * 50,
        "untorn device, option off: {off_images} images"
    );
    assert!(
        untorn_bytes * 3 < plain_bytes * 2 && untorn_bytes * 3 < off_bytes * 2,
        "log bytes: {untorn_bytes} untorn, {plain_bytes} plain, {off_bytes} option off"
    );
}

#[test]
fn acknowledged_commits_survive_power_cuts_that_tear_other_writes() {
    power_cuts_tear_and_lose_nothing(true, opts(), 24);
}

#[test]
fn compressed_images_repair_what_power_cuts_tear() {
    let opts = opts().compress_log_images(true);
    let (bytes, images) = update_rounds_log(false, opts.clone());
    let (plain_bytes, plain_images) = update_rounds_log(false, self::opts());
    // About as many images (the checkpoints fall a little differently).
    assert!(
        images > 5 * 50 && plain_images > 5 * 50,
        "{images} images compressed, {plain_images} plain"
    );
    assert!(
        bytes * 4 < plain_bytes * 3,
        "log bytes: {bytes} compressed, {plain_bytes} plain"
    );
    power_cuts_tear_and_lose_nothing(false, opts, 12);
}

/// `rounds` power cuts (writes kept, dropped or torn) during updates on a
/// device that writes pages untorn or not, with `opts`; after each, every
/// acknowledged commit is found.
fn power_cuts_tear_and_lose_nothing(untorn: bool, opts: Options, rounds: u64) {
    let opts = || opts.clone();
    let mut repaired = 0;
    for round in 0..rounds {
        let rig = Rig::new(300 + round, untorn);
        let db = rig.open(true, opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        page_writes::update_round(&db, &t, 0);
        let policy = PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 2.0,
        };
        let switch = PowerSwitch::new(40 + round * 70, policy, round);
        switch.attach(&rig.data);
        switch.attach(&rig.log);
        let acked = page_writes::update_until_cut(&db, &t);
        assert!(
            switch.fired(),
            "round {round}: the run ended before the cut"
        );
        drop((db, t));
        rig.data.power_on();
        rig.log.power_on();
        if round % 2 == 1 {
            // And again during the recovery that follows (its redone
            // pages are written in place: untorn, or a torn one would
            // have no image at the next open).
            let again = PowerSwitch::new(10 + (round * 37) % 190, policy, round + 1000);
            again.attach(&rig.data);
            again.attach(&rig.log);
            drop(rig.open(false, opts()));
            // Nothing cuts the checks below.
            let never = PowerSwitch::new(0, policy, 0);
            never.attach(&rig.data);
            never.attach(&rig.log);
            rig.data.power_on();
            rig.log.power_on();
        }
        let db = rig.open(false, opts()).unwrap();
        repaired += db.recovery().map_or(0, |r| r.pages_repaired);
        page_writes::assert_acked(&db, &acked, round);
        db.close().unwrap();
    }
    // A plain device's torn pages were rebuilt from their images.
    assert!(untorn || repaired > 0, "no torn page repaired");
}
