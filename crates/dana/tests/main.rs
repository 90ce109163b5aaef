//! dana's integration tests: one test binary, each file under `tests/` a
//! module of it (`cargo test -p dana --test integration btree::` runs
//! one file's tests).
//!
//! One binary, not one per file: each test binary compiled and linked
//! its own copy of the engine's generic and async code, and 29 of them
//! made most of CI's test build (4 min 48 s of a 13-14 min run). Tests
//! still run in parallel threads, as they did within each file; none
//! relies on running alone in its process (the engine keeps no
//! process-wide state).
//!
//! `Cargo.toml` turns off cargo's discovery of test files
//! (`autotests = false`): a file under `tests/` not named below would not
//! run at all, so [`every_test_file_is_a_module`] fails on one.

mod common;
mod page_writes;
#[path = "common/sim_rig.rs"]
mod sim_rig;
#[path = "common/test_files.rs"]
mod test_files;

mod async_durability;
mod btree;
mod buffer_pool;
mod buffer_sim;
mod catalog_crash;
mod check;
mod device_budget;
mod flushes_in_flight;
mod fuzz_decoders;
mod growth;
mod huge_value;
mod io_backends;
mod iter;
mod large_values;
mod layers;
mod log_admission;
mod mirror;
mod moments;
mod open;
mod out_of_place;
mod partial_commit_crash;
mod placement;
mod races;
mod record_cache;
mod recycled_devices;
mod serializable;
mod space;
mod trim_freed;
mod untorn_writes;
mod wal;
mod worker_logs;

/// Every `tests/*.rs` file is a module of this binary (cargo no longer
/// finds them on its own).
#[test]
fn every_test_file_is_a_module() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    test_files::assert_every_test_file_is_a_module(&tests);
}
