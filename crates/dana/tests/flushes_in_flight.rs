//! Several flushes of one log in flight at once
//! (`Options::log_flushes_in_flight`), cut by power failures on the
//! simulated device.
//!
//! Two workers share one log, so one worker's flush is often still in
//! flight (queued on its own device queue, not yet reaped) when the other
//! worker's system step starts the next one; the simulated disk completes
//! them in a seeded order. Each round cuts the power at another request,
//! keeping, dropping or tearing every write not yet durable, so a later
//! flush can survive whole beside an earlier one torn or dropped. After
//! recovery every acknowledged commit must be there, the log must not be
//! judged damaged, and the database must pass its check. The rounds
//! together must have started flushes beside others, or the test showed
//! nothing. (How often a cut falls while two are in flight is up to the
//! schedule; `tests/open.rs::a_later_flush_kept_beside_a_torn_one_ends_the_log`
//! constructs that case exactly.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use dana::io::sim::{PowerCutPolicy, PowerSwitch, SimConfig, SimDisk};
use dana::io::{Array, Target};
use dana::wal::CONTROL_BYTES;
use dana::{Db, Options};

const LOG: u64 = 4 << 20;
const TASKS: u64 = 12;
const EACH: u64 = 60;

struct Rig {
    data: Arc<SimDisk>,
    log: Arc<SimDisk>,
}

impl Rig {
    fn new(seed: u64) -> Rig {
        Rig {
            data: SimDisk::new(0, 32 << 20, SimConfig::deterministic(seed)),
            log: SimDisk::new(1, CONTROL_BYTES + LOG, SimConfig::deterministic(!seed)),
        }
    }

    fn open(&self, create: bool) -> dana::Result<Db> {
        let opts = Options::default()
            .pool_bytes(8 << 20)
            .workers(2)
            .logs(1)
            .log_bytes(LOG)
            .log_flushes_in_flight(3);
        let array = Array::new(vec![Target::Sim(self.data.clone())], 4096)?;
        Db::open_array_with_logs(array, vec![Target::Sim(self.log.clone())], opts, create)
    }
}

fn key(task: u64, n: u64) -> Vec<u8> {
    format!("t{task:02}-{n:04}").into_bytes()
}

#[test]
fn flushes_kept_beside_a_torn_one_lose_no_acknowledged_commit() {
    let mut past_torn = 0;
    let mut overlapped = 0;
    for round in 0..120u64 {
        let rig = Rig::new(7 + round);
        let db = rig.open(true).unwrap();
        let t = db.create_tree("t").unwrap();
        db.checkpoint().unwrap();
        let policy = PowerCutPolicy::Random {
            keep: 1.0,
            drop: 1.0,
            tear: 1.0,
        };
        // The run is about 1,000 requests long: cut somewhere in it.
        let switch = PowerSwitch::new(40 + round * 97 % 900, policy, round);
        switch.attach(&rig.data);
        switch.attach(&rig.log);
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
        let (send, recv) = mpsc::channel();
        for task in 0..TASKS {
            let (t, acked, send) = (t.clone(), acked.clone(), send.clone());
            db.spawn_on(task as usize % 2, async move {
                for n in 0..EACH {
                    if t.put_async(&key(task, n), &[task as u8; 40]).await.is_err() {
                        break;
                    }
                    acked[task as usize].store(n + 1, Ordering::Release);
                }
                let _ = send.send(());
            })
            .unwrap();
        }
        drop(send);
        while recv.recv().is_ok() {}
        overlapped += db.wal_stats().unwrap().overlapped_flushes;
        switch.cut();
        drop((db, t));
        rig.data.power_on();
        rig.log.power_on();
        let db = rig
            .open(false)
            .unwrap_or_else(|e| panic!("round {round}: recovery: {e}"));
        past_torn += db.recovery().map_or(0, |r| r.flushes_past_end);
        let t = db.tree("t").unwrap();
        for task in 0..TASKS {
            let acked = acked[task as usize].load(Ordering::Acquire);
            for n in 0..acked {
                assert_eq!(
                    t.get(&key(task, n)).unwrap().as_deref(),
                    Some(&[task as u8; 40][..]),
                    "round {round}: task {task}'s acknowledged commit {n} of {acked} is lost"
                );
            }
        }
        assert!(db.check().unwrap().is_ok(), "round {round}");
        db.close().unwrap();
    }
    eprintln!(
        "flushes started beside another: {overlapped}; recoveries past a torn flush with a later one kept: {past_torn}"
    );
    assert!(
        overlapped > 0,
        "no flush started beside another: the test showed nothing"
    );
}
