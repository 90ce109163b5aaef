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

use std::sync::Arc;

use dana::io::sim::{PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Options};

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

fn key(i: u64) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    let mut v = format!("value of {i} in round {round}:").into_bytes();
    v.resize(150 + (i % 50) as usize, b'a' + (round % 26) as u8);
    v
}

/// Log bytes and full images of five rounds of updates, each followed by
/// a checkpoint.
fn update_rounds_log(untorn_device: bool, opts: Options) -> (u64, u64) {
    const KEYS: u64 = 3_000;
    let rig = Rig::new(7, untorn_device);
    let db = rig.open(true, opts).unwrap();
    let t = db.create_tree("t").unwrap();
    let update = |round: u64| {
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
            db.transaction(|tx| {
                for &i in chunk {
                    tx.put(&t, &key(i), &value(i, round))?;
                }
                Ok(())
            })
            .unwrap();
        }
        db.checkpoint().unwrap();
    };
    update(0);
    let before = db.wal_stats().unwrap();
    for round in 1..6 {
        update(round);
    }
    let after = db.wal_stats().unwrap();
    for i in 0..KEYS {
        assert_eq!(t.get(&key(i)).unwrap(), Some(value(i, 5)), "key {i}");
    }
    db.close().unwrap();
    (after.bytes - before.bytes, after.images - before.images)
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
    const KEYS: u64 = 3_000;
    for round in 0..24u64 {
        let rig = Rig::new(300 + round, true);
        let db = rig.open(true, opts()).unwrap();
        let t = db.create_tree("t").unwrap();
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(100) {
            db.transaction(|tx| {
                for &i in chunk {
                    tx.put(&t, &key(i), &value(i, 0))?;
                }
                Ok(())
            })
            .unwrap();
        }
        db.checkpoint().unwrap();
        let policy = PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 2.0,
        };
        let switch = PowerSwitch::new(40 + round * 70, policy, round);
        switch.attach(&rig.data);
        switch.attach(&rig.log);
        let mut acked: Vec<u64> = vec![0; KEYS as usize];
        let mut n = 0u64;
        'run: for r in 1..200u64 {
            for c in 0..10u64 {
                n += 1;
                let keys: Vec<u64> = (0..20).map(|j| (n * 131 + j * 977) % KEYS).collect();
                let ok = db.transaction(|tx| {
                    for &i in &keys {
                        tx.put(&t, &key(i), &value(i, r * 10 + c))?;
                    }
                    Ok(())
                });
                if ok.is_err() {
                    break 'run;
                }
                for &i in &keys {
                    acked[i as usize] = r * 10 + c;
                }
            }
            if db.checkpoint().is_err() {
                break;
            }
        }
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
        let t = db.tree("t").unwrap();
        for i in 0..KEYS {
            let got = t
                .get(&key(i))
                .unwrap_or_else(|e| panic!("round {round}, key {i}: {e}"))
                .expect("every key was loaded");
            let want = value(i, acked[i as usize]);
            // The commit in flight at the cut may or may not be there.
            let newer = (acked[i as usize] + 1..acked[i as usize] + 12).any(|r| got == value(i, r));
            assert!(
                got == want || newer,
                "round {round}, key {i}: an acknowledged commit lost"
            );
        }
        assert!(db.check().unwrap().is_ok(), "round {round}");
        db.close().unwrap();
    }
}
