//! The short crash test of `cargo test`: 1,000 simulated power cuts over
//! the I/Os of a transactional run (writes kept, dropped or torn with
//! garbage), injected I/O errors once and forever, and 20 kill -9 cycles
//! of a child process on real files with io_uring. Any lost acknowledged
//! commit, partial transaction or invalid tree fails it, naming the seed.

use std::process::Command;

#[test]
fn crash_points_faults_and_kill_cycles_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dana"))
        .args([
            "crashtest",
            "--points",
            "1000",
            "--kills",
            "20",
            "--txns",
            "60",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "crashtest failed:\n{text}");
    assert!(text.contains("1000 crash points"), "{text}");
    assert!(text.contains("kill -9: 20 cycles"), "{text}");
    assert_eq!(text.matches("lost 0").count(), 2, "{text}");
}
