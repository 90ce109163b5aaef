//! The `dana` command: workloads and studies run against dana's I/O layer
//! and engine, with reports a reader of the papers can compare.
//!
//! One subcommand per workload; each lives in its own module and returns a
//! [`CliResult`]. Errors are printed as one line on stderr and the process
//! exits non-zero; nothing here panics on an I/O error.
#![deny(unsafe_code)]

mod bench;
mod check;
mod crashtest;
mod error;
mod iostudy;
mod pace;
mod peers;
mod rebuild;
#[allow(unsafe_code)]
mod report;
mod rng;

use clap::{Parser, Subcommand};

pub use error::{CliError, CliResult, Context};

/// The command's allocator: mimalloc (thread-local free lists, no arena
/// lock on the workers' hot paths). The `dana` library leaves the choice
/// to the application that embeds it; glibc's malloc and free took ~10%
/// of the CPU of an in-memory TPC-C run (docs/PERF.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// dana: an embedded storage engine for NVMe arrays.
#[derive(Parser, Debug)]
#[command(name = "dana", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Command {
    /// The HTAP I/O-stack study (Haas et al., CIDR 2020): scan, point
    /// reads, background writes and WAL at once, over each I/O stack
    /// configuration; plus a queue-depth sweep and a comparison with fio.
    Iostudy(iostudy::IostudyArgs),
    /// Benchmarks of the engine: `lookup` (the main job), `pages`, `ycsb`.
    Bench(bench::BenchArgs),
    /// Verify a database: every tree's invariants and the page accounting.
    /// Prints each finding (naming its page); exit code 1 if any.
    Check(check::CheckArgs),
    /// Print tree heights, page counts, fill factors and space use.
    Inspect(check::CheckArgs),
    /// Crash testing: simulated power cuts at enumerated I/Os, injected
    /// I/O errors, and kill -9 of a child process on real files; every
    /// acknowledged commit must survive, no transaction in part.
    Crashtest(crashtest::CrashArgs),
    /// Repopulate the failed copies of a mirrored database from its
    /// healthy ones (a replaced or removed file is recreated), printing
    /// progress; a rebuild cut short resumes at the next open.
    Rebuild(rebuild::RebuildArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Iostudy(args) => iostudy::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Check(args) => check::run_check(&args),
        Command::Inspect(args) => check::run_inspect(&args),
        Command::Crashtest(args) => crashtest::run(&args),
        Command::Rebuild(args) => rebuild::run(&args),
    };
    if let Err(e) = result {
        eprintln!("dana: error: {e}");
        std::process::exit(1);
    }
}
