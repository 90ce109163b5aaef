//! Every decoder of bytes read from storage, fed random and mutated
//! bytes: node pages, the page header, the meta page, the free-list link,
//! log records (commit and page entries, redo onto a page), the control
//! block and the log scan. Each must return a value or a typed error,
//! never panic, hang or allocate in proportion to a length read from the
//! bytes. Long runs: `DANA_FUZZ_CASES=200000 cargo test --release -p dana
//! --test fuzz_decoders` (docs/TESTING.md).

use dana::btree::node::{self, Node};
use dana::buffer::alloc::meta_facts;
use dana::buffer::page;
use dana::wal::control::{Control, BLOCK};
use dana::wal::record::{self, Kind, Parsed, Write};
use dana::wal::recover;
use proptest::prelude::*;

const PS: usize = 4096;

/// Cases per property: 1,000 in `cargo test`, `DANA_FUZZ_CASES` for long
/// runs.
fn cases() -> u32 {
    std::env::var("DANA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Decodes `bytes` as a log record at LSN 4096 and everything in it.
fn decode_record(bytes: &[u8]) {
    if let Parsed::Record(r) = record::parse(bytes, 4096) {
        match r.kind {
            Kind::Commit => {
                let _ = record::commit_writes(&r);
            }
            Kind::Pages => {
                if let Ok(entries) = record::page_entries(&r) {
                    let mut page = vec![0u8; PS];
                    for e in entries {
                        let _ = e.apply(&mut page, 4096, 4096);
                    }
                }
            }
            Kind::Flush => {
                let _ = record::flush_durable(&r);
            }
            Kind::Checkpoint => {
                let _ = record::checkpoint_redo(&r);
            }
        }
    }
}

/// Decodes `bytes` as a node page and walks every entry.
fn decode_node(bytes: &[u8]) {
    let _ = node::check(bytes);
    if let Ok(n) = Node::new(bytes) {
        let mut k = Vec::new();
        for i in 0..n.len().min(PS) {
            n.key_at(i, &mut k);
            let _ = n.get(&k);
            if !n.is_leaf() {
                let _ = n.child_at(i);
            }
        }
        let _ = (n.lower_fence(), n.upper_fence(), n.lower_bound(b"m"));
    }
}

/// A valid leaf holding a few entries.
fn valid_leaf(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut p = vec![0u8; PS];
    {
        let mut n = node::init(&mut p, true, None, None, 0);
        for (k, v) in entries {
            let _ = n.insert(k, v);
        }
    }
    p
}

/// A sealed commit record of `writes`, then `flips` applied, then sealed
/// again (so the checksum holds and the decoder itself is exercised).
fn mutated_commit(writes: &[Write], flips: &[(usize, u8)]) -> Vec<u8> {
    let mut r = record::commit(writes).into_unsealed();
    for &(at, x) in flips {
        let i = record::HEADER + at % (r.len() - record::HEADER).max(1);
        if i < r.len() {
            r[i] ^= x;
        }
    }
    record::seal(&mut r, 4096, 0);
    r
}

/// A sealed Pages record holding a compressed full image of a leaf of
/// `n` entries (`record::LZ4`), then `flips` applied, then sealed again.
fn mutated_compressed_image(n: usize, flips: &[(usize, u8)]) -> Vec<u8> {
    let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| (format!("key{i:04}").into_bytes(), vec![i as u8; i % 40]))
        .collect();
    let page = valid_leaf(&entries);
    let mut b = record::RecordBuilder::new(Kind::Pages);
    b.u32(1);
    record::put_image_entry(&mut b, 3, &page, &record::image(&page), true, false);
    let mut r = b.into_unsealed();
    for &(at, x) in flips {
        let i = record::HEADER + at % (r.len() - record::HEADER).max(1);
        r[i] ^= x;
    }
    record::seal(&mut r, 4096, 0);
    r
}

#[test]
fn a_commit_record_claiming_four_billion_writes_is_an_error() {
    // Count u32::MAX with no bytes behind it: today's decoder reserved
    // capacity for 4 billion writes before reading any.
    let mut b = record::RecordBuilder::new(Kind::Commit);
    b.u32(u32::MAX);
    let mut r = b.into_unsealed();
    record::seal(&mut r, 4096, 0);
    let Parsed::Record(rec) = record::parse(&r, 4096) else {
        panic!("the record does not parse");
    };
    assert!(record::commit_writes(&rec).is_err());
    let mut b = record::RecordBuilder::new(Kind::Pages);
    b.u32(u32::MAX);
    let mut r = b.into_unsealed();
    record::seal(&mut r, 4096, 0);
    let Parsed::Record(rec) = record::parse(&r, 4096) else {
        panic!("the record does not parse");
    };
    assert!(record::page_entries(&rec).is_err());
}

proptest! {
    // DANA_FUZZ_CASES=N for a long run (docs/TESTING.md).
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
        decode_record(&bytes);
        let _ = Control::decode(&bytes);
        let _ = Control::newest(&bytes);
        let _ = meta_facts(&bytes);
        let _ = page::verify(&bytes, 1);
        if bytes.len() >= PS {
            decode_node(&bytes[..PS]);
        }
    }

    #[test]
    fn mutated_commit_records_decode_or_fail_cleanly(
        keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8),
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..6),
    ) {
        let writes: Vec<Write> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Write {
                tree: i as u64,
                key: k.clone(),
                value: (i % 3 != 0).then(|| k.repeat(2).into()),
                reference: false,
            })
            .collect();
        decode_record(&mutated_commit(&writes, &flips));
    }

    #[test]
    fn mutated_compressed_images_decode_or_fail_cleanly(
        n in 1usize..60,
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..6),
    ) {
        decode_record(&mutated_compressed_image(n, &flips));
    }

    #[test]
    fn mutated_node_pages_decode_or_fail_cleanly(
        n in 0usize..60,
        flips in proptest::collection::vec((0usize..PS, 1u8..=255), 1..8),
    ) {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
            .map(|i| (format!("key{i:04}").into_bytes(), vec![i as u8; i % 40]))
            .collect();
        let mut p = valid_leaf(&entries);
        for (at, x) in flips {
            p[at] ^= x;
        }
        decode_node(&p);
    }

    #[test]
    fn mutated_control_blocks_never_validate_wrongly(
        seq in any::<u64>(),
        flip in (0usize..92, 1u8..=255),
    ) {
        let c = Control { seq, checkpoint: 1, redo: 4096, capacity: 1 << 20, block: 512, log_id: 9, next_gsn: 5, index: 0, count: 2, redo_gsn: 3, stream_bytes: 1 << 20 };
        let mut b = c.encode();
        b[flip.0] ^= flip.1;
        // A flipped block is rejected (its checksum), never misread.
        prop_assert!(Control::decode(&b).is_none_or(|d| d == c));
    }

    #[test]
    fn random_log_streams_scan_cleanly(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        redo in 0u64..64,
    ) {
        let mut stream = vec![0u8; 64 * 1024];
        let at = (redo as usize * 512) % stream.len();
        let n = bytes.len().min(stream.len() - at);
        stream[at..at + n].copy_from_slice(&bytes[..n]);
        let ctl = Control {
            seq: 1,
            checkpoint: 0,
            redo: BLOCK + redo * 512,
            capacity: stream.len() as u64,
            block: 512,
            log_id: 1,
            next_gsn: 1,
            index: 0,
            count: 1,
            redo_gsn: 0,
            stream_bytes: 0,
        };
        stream.rotate_left((ctl.redo % ctl.capacity) as usize);
        let _ = recover::scan(&stream, &ctl);
    }
}
