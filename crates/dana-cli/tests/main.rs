//! The `dana` command's integration tests: one test binary, each file
//! under `tests/` a module of it (`cargo test -p dana-cli --test cli
//! crashtest::` runs one file's tests). One binary links once, where one
//! per file linked six times (the engine's crate `tests/main.rs` says
//! why that mattered there); cargo's discovery of test files is off
//! (`autotests = false`), so [`every_test_file_is_a_module`] fails on a
//! file not named below.

mod common;
#[path = "../../dana/tests/common/test_files.rs"]
mod test_files;

mod args;
mod bench;
mod check;
mod crashtest;
mod iostudy;
mod ycsb;

/// Every `tests/*.rs` file is a module of this binary (cargo no longer
/// finds them on its own).
#[test]
fn every_test_file_is_a_module() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    test_files::assert_every_test_file_is_a_module(&tests);
}
