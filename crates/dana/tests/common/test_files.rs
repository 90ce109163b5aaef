//! The check both crates' test binaries make (`crates/dana/tests/main.rs`
//! and `crates/dana-cli/tests/main.rs`, which includes this file by
//! path): cargo's discovery of test files is off, so every `tests/*.rs`
//! file must be named as a module of `tests/main.rs` or it never runs.

use std::path::Path;

/// Panics naming every `*.rs` file directly in `tests` (but `main.rs`)
/// that `tests/main.rs` does not declare with a `mod <file>;` line.
pub fn assert_every_test_file_is_a_module(tests: &Path) {
    let main = std::fs::read_to_string(tests.join("main.rs")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(tests).unwrap() {
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
