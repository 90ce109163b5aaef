//! The `dana` command's integration tests: one test binary, each file
//! under `tests/` a module of it (`cargo test -p dana-cli --test cli
//! crashtest::` runs one file's tests). One binary links once, where one
//! per file linked six times (the engine's crate `tests/main.rs` says
//! why that mattered there); cargo's discovery of test files is off
//! (`autotests = false`), so [`every_test_file_is_a_module`] fails on a
//! file not named below.

mod common;

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
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module != "main" && !main.lines().any(|l| l == format!("mod {module};")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/main.rs does not name {missing:?}: add `mod <file>;` or they never run"
    );
}
