//! Every I/O backend (io_uring, blocking syscalls, the simulator) behind
//! the same `IoQueue` trait: read-after-write of random pages on one device
//! and on a 3-device array, alignment checks, and simulated faults naming
//! the device and offset.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dana::io::array::open_queue;
use dana::io::device::DeviceOptions;
use dana::io::{
    AlignedBuf, Array, Backend, Completion, Device, Fault, IoBuf, IoQueue, Request, SimConfig,
    SimDisk, Target,
};
use dana::{Error, OpKind};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

const PAGE: usize = 4096;
const DEVICE_BYTES: u64 = 256 * PAGE as u64;

fn file_targets(dir: &tempfile::TempDir, n: usize) -> Vec<Target> {
    (0..n)
        .map(|i| {
            let opts = DeviceOptions {
                create_size: Some(DEVICE_BYTES),
                ..Default::default()
            };
            let path = dir.path().join(format!("dev{i}"));
            Target::File(Arc::new(Device::open(path, i, opts).unwrap()))
        })
        .collect()
}

fn sim_targets(n: usize, config: SimConfig) -> Vec<Target> {
    (0..n)
        .map(|i| Target::Sim(SimDisk::new(i, DEVICE_BYTES, config)))
        .collect()
}

/// Every backend, each on `n` fresh devices.
fn setups(dir: &tempfile::TempDir, n: usize) -> Vec<(&'static str, Backend, Vec<Target>)> {
    vec![
        ("uring", Backend::default(), file_targets(dir, n)),
        ("blocking", Backend::Blocking, file_targets(dir, n)),
        (
            "sim",
            Backend::default(),
            sim_targets(n, SimConfig::default()),
        ),
        (
            "sim-deterministic",
            Backend::default(),
            sim_targets(n, SimConfig::deterministic(7)),
        ),
    ]
}

fn random_pages(seed: u64, count: usize, pages: u64) -> BTreeMap<u64, Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    while out.len() < count {
        let mut data = vec![0; PAGE];
        rng.fill_bytes(&mut data);
        out.insert(rng.gen_range(0..pages), data);
    }
    out
}

fn buf_with(data: &[u8]) -> IoBuf {
    let mut b = AlignedBuf::new(data.len(), PAGE).unwrap();
    b.copy_from_slice(data);
    IoBuf::owned(b)
}

fn empty_buf(len: usize) -> IoBuf {
    IoBuf::owned(AlignedBuf::new(len, PAGE).unwrap())
}

/// Pushes and submits `reqs` (each on the queue of its device), then reaps
/// every queue until all have completed. Checks each completion succeeded.
fn run(queues: &mut [Box<dyn IoQueue>], reqs: Vec<(usize, Request)>) -> Vec<Completion> {
    let n = reqs.len();
    for (dev, r) in reqs {
        queues[dev].push(r).unwrap();
    }
    for q in queues.iter_mut() {
        q.submit().unwrap();
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        for q in queues.iter_mut() {
            if q.in_flight() > 0 {
                q.wait(1, Some(Duration::from_millis(50))).unwrap();
                q.reap(&mut out);
            }
        }
        assert!(Instant::now() < deadline, "requests never completed");
    }
    for c in &out {
        if let Err(e) = &c.result {
            panic!("request {} failed: {e}", c.tag);
        }
    }
    out
}

/// Writes random pages through the array's striping, flushes every device,
/// reads the pages back and compares the bytes.
fn write_read_back(name: &str, array: &Array, backend: &Backend, seed: u64) {
    let depth = 32;
    let mut queues = array.open_queues(backend, depth).unwrap();
    for (i, q) in queues.iter().enumerate() {
        assert_eq!(q.device(), i);
    }
    let pages = random_pages(seed, 200, array.pages());
    let all: Vec<_> = pages.iter().collect();
    // Batches small enough for every device's queue.
    for batch in all.chunks(depth as usize) {
        let reqs = batch
            .iter()
            .map(|(&p, d)| {
                let (dev, off) = array.locate(p);
                (dev, Request::write(p, off, buf_with(d)))
            })
            .collect();
        run(&mut queues, reqs);
    }
    let flushes = (0..array.width())
        .map(|dev| (dev, Request::flush(u64::MAX)))
        .collect();
    run(&mut queues, flushes);
    for batch in all.chunks(depth as usize) {
        let reqs = batch
            .iter()
            .map(|(&p, _)| {
                let (dev, off) = array.locate(p);
                (dev, Request::read(p, off, empty_buf(PAGE)))
            })
            .collect();
        for c in run(&mut queues, reqs) {
            let got = c.buf.as_ref().unwrap().as_owned().unwrap();
            assert!(
                got[..] == pages[&c.tag][..],
                "{name}: page {} differs",
                c.tag
            );
            assert_eq!(c.result.as_ref().unwrap(), &PAGE);
        }
    }
}

#[test]
fn read_after_write_on_one_device() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (name, backend, targets)) in setups(&dir, 1).into_iter().enumerate() {
        let array = Array::new(targets, PAGE as u64).unwrap();
        write_read_back(name, &array, &backend, i as u64);
    }
}

#[test]
fn read_after_write_on_a_three_device_array() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (name, backend, targets)) in setups(&dir, 3).into_iter().enumerate() {
        let array = Array::new(targets.clone(), PAGE as u64).unwrap();
        assert_eq!(array.width(), 3);
        write_read_back(name, &array, &backend, 100 + i as u64);
        // The pages really are spread: every device holds data.
        if let Target::Sim(_) = &targets[0] {
            for t in &targets {
                let Target::Sim(disk) = t else { unreachable!() };
                assert!(
                    disk.stats().writes > 0,
                    "{name}: device {} unused",
                    disk.index()
                );
            }
        }
    }
}

#[test]
fn misaligned_requests_are_rejected_by_every_backend() {
    let dir = tempfile::tempdir().unwrap();
    for (name, backend, targets) in setups(&dir, 1) {
        let target = &targets[0];
        let align = target.alignment();
        assert!(align.io >= 2 && align.mem >= 2, "{name}: {align:?}");
        let mut q = open_queue(target, &backend, 8).unwrap();
        let cases = [
            ("offset", Request::read(0, 1, empty_buf(PAGE))),
            ("length", Request::read(1, 0, empty_buf(PAGE - 1))),
            ("buffer address", {
                let region = Arc::new(AlignedBuf::new(2 * PAGE, PAGE).unwrap());
                // SAFETY: the region is never used for I/O (the request is
                // rejected before it is queued).
                Request::write(2, 0, unsafe { IoBuf::shared(region, 1, PAGE) }.unwrap())
            }),
        ];
        for (what, req) in cases {
            let rejected = q.push(req).unwrap_err();
            match rejected.error {
                Error::Misaligned {
                    what: w, device: 0, ..
                } => assert_eq!(w, what, "{name}"),
                e => panic!("{name}: {what}: unexpected {e}"),
            }
        }
        assert_eq!((q.queued(), q.in_flight()), (0, 0), "{name}");
    }
}

#[test]
fn simulated_faults_name_device_and_offset() {
    let array = Array::new(sim_targets(3, SimConfig::default()), PAGE as u64).unwrap();
    let Target::Sim(disk) = &array.targets()[2] else {
        unreachable!()
    };
    disk.inject(Fault::range(Some(OpKind::Read), 0..u64::MAX).sticky());
    let mut queues = array.open_queues(&Backend::Blocking, 8).unwrap();
    let page = 5; // device 2, offset 4096
    let (dev, off) = array.locate(page);
    assert_eq!((dev, off), (2, PAGE as u64));
    queues[dev]
        .push(Request::read(page, off, empty_buf(PAGE)))
        .unwrap();
    queues[dev].submit().unwrap();
    queues[dev].wait(1, Some(Duration::from_secs(1))).unwrap();
    let mut out = Vec::new();
    assert_eq!(queues[dev].reap(&mut out), 1);
    let err = out[0].result.as_ref().unwrap_err();
    match err {
        Error::Io {
            op, device, offset, ..
        } => assert_eq!((*op, *device, *offset), (OpKind::Read, 2, PAGE as u64)),
        e => panic!("unexpected {e}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("device 2") && msg.contains("offset 4096"),
        "{msg}"
    );
    assert_eq!(disk.stats().faults_fired, 1);
}

/// The runtime makes each worker's rings on the thread that opens the
/// database and hands them to the worker. With deferred task work
/// (`UringOptions::defer_taskrun`, the default) a ring has one submitter:
/// the thread that first uses it, which must then get its completions
/// both by reaping and by sleeping on the ring's eventfd (they are posted
/// only when it asks; the eventfd is signalled when the first waits).
#[test]
fn a_ring_made_on_one_thread_serves_the_thread_that_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = file_targets(&dir, 1).remove(0);
    let backend = Backend::default();
    let mut q = open_queue(&target, &backend, 8).unwrap();
    let efd = dana::io::EventFd::new().unwrap();
    q.attach_eventfd(efd.raw()).unwrap();
    std::thread::spawn(move || {
        let mut one = |req: Request| -> Completion {
            q.set_notify(true);
            q.push(req).unwrap();
            assert_eq!(q.submit().unwrap(), 1);
            let mut out = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while q.reap(&mut out) == 0 {
                // Asleep as a worker sleeps: only the eventfd wakes it.
                let woken = efd.wait(Some(Duration::from_secs(5)));
                assert!(
                    woken || q.reap(&mut out) > 0,
                    "a completion neither signalled the eventfd nor was reaped"
                );
                assert!(Instant::now() < deadline, "the request never completed");
                if !out.is_empty() {
                    break;
                }
            }
            q.set_notify(false);
            let c = out.pop().unwrap();
            assert!(c.result.is_ok(), "{:?}", c.result);
            c
        };
        let data: Vec<u8> = (0..PAGE).map(|i| (i % 251) as u8).collect();
        one(Request::write(1, 3 * PAGE as u64, buf_with(&data)));
        let c = one(Request::read(2, 3 * PAGE as u64, empty_buf(PAGE)));
        assert_eq!(&c.buf.unwrap().as_owned().unwrap()[..], &data[..]);
    })
    .join()
    .unwrap();
}
