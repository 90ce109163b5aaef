//! Helpers shared by the CLI tests: run the built `dana` binary and check
//! its JSON.

use std::process::Command;

use serde_json::Value;

/// Runs `dana args...`, asserts success, parses stdout as JSON.
pub fn run(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_dana"))
        .args(args)
        .output()
        .expect("run dana");
    assert!(
        out.status.success(),
        "dana {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// Asserts that `v` has every field in `fields`.
pub fn has(v: &Value, fields: &[&str]) {
    for f in fields {
        assert!(v.get(f).is_some(), "missing field {f} in {v}");
    }
}
