//! `dana check` and `dana inspect`: run the library's checker
//! ([`dana::check`]) on a database directory and print what it found.
//!
//! `check` prints every finding (each names its page) and fails (exit 1)
//! if there is any; `inspect` prints tree heights, page counts, fill
//! factors and space use, and the number of findings. Both take `--json`.
//!
//! Never: creates a database (a directory without `dana.0` is an error),
//! or writes to one: the database is opened, only read, and closed.

use std::path::{Path, PathBuf};

use clap::Args;
use dana::check::{CheckReport, Finding, TreeStats};
use dana::io::Backend;
use dana::{Db, Options};
use serde::Serialize;

use crate::report::{num, Table};
use crate::{CliError, CliResult, Context};

/// Buffer pool used to check a database.
const POOL_BYTES: usize = 16 << 20;

/// Options of `dana check` and `dana inspect`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The database directory (holding dana.0, dana.1, ...).
    #[arg(long)]
    pub path: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Use blocking pread instead of io_uring.
    #[arg(long)]
    pub blocking: bool,
    /// The database's page size (`Options::page_size` when it was
    /// created); a database of another size is refused, naming its own.
    #[arg(long, default_value_t = 4096)]
    pub page_size: usize,
    /// The log's path, for a database created with `Options::log_path`
    /// (its log is elsewhere than DIR/dana.wal).
    #[arg(long)]
    pub log_path: Option<PathBuf>,
}

/// One tree, for JSON.
#[derive(Serialize, Debug)]
struct JsonTree<'a> {
    name: &'a str,
    root: u64,
    height: u32,
    inner_pages: u64,
    leaf_pages: u64,
    entries: u64,
    leaf_fill: f64,
    inner_fill: f64,
}

impl<'a> From<&'a TreeStats> for JsonTree<'a> {
    fn from(t: &'a TreeStats) -> Self {
        JsonTree {
            name: &t.name,
            root: t.root,
            height: t.height,
            inner_pages: t.inner_pages,
            leaf_pages: t.leaf_pages,
            entries: t.entries,
            leaf_fill: t.leaf_fill,
            inner_fill: t.inner_fill,
        }
    }
}

/// One finding, for JSON.
#[derive(Serialize, Debug)]
struct JsonFinding<'a> {
    page: Option<u64>,
    tree: Option<&'a str>,
    what: &'a str,
}

impl<'a> From<&'a Finding> for JsonFinding<'a> {
    fn from(f: &'a Finding) -> Self {
        JsonFinding {
            page: f.page,
            tree: f.tree.as_deref(),
            what: &f.what,
        }
    }
}

/// The whole report, for JSON (the same for `check` and `inspect`).
#[derive(Serialize, Debug)]
struct JsonReport<'a> {
    path: String,
    ok: bool,
    page_size: usize,
    total_pages: u64,
    next_unused: u64,
    used_pages: u64,
    free_pages: u64,
    free_pages_recorded: u64,
    lost_pages: u64,
    catalog: JsonTree<'a>,
    trees: Vec<JsonTree<'a>>,
    findings: Vec<JsonFinding<'a>>,
    mirrors: Vec<JsonMirror>,
    out_of_place: Vec<JsonOutOfPlace>,
}

/// One out-of-place data device's segments, for JSON.
#[derive(Serialize, Debug)]
struct JsonOutOfPlace {
    device: usize,
    segments: u64,
    segment_pages: u32,
    free_segments: usize,
    mapped_pages: u64,
    offered_pages: u64,
}

/// One mirrored device's comparison, for JSON.
#[derive(Serialize, Debug)]
struct JsonMirror {
    device: String,
    states: Vec<String>,
    pages_compared: u64,
    divergent_pages: Vec<u64>,
}

/// A mirrored device's copies, as one line.
fn mirror_line(m: &dana::check::MirrorCheck) -> String {
    let states: Vec<String> = m.states.iter().map(|s| format!("{s:?}")).collect();
    match m.role {
        dana::io::mirror::Role::Data(_) => format!(
            "{}: copies [{}], {} pages compared on every healthy copy, {} differ",
            m.role,
            states.join(", "),
            m.pages_compared,
            m.divergent.len()
        ),
        dana::io::mirror::Role::Log(_) => format!("{}: copies [{}]", m.role, states.join(", ")),
    }
}

fn json(path: &Path, r: &CheckReport) -> CliResult<String> {
    let j = JsonReport {
        path: path.display().to_string(),
        ok: r.is_ok(),
        page_size: r.page_size,
        total_pages: r.space.total_pages,
        next_unused: r.space.next_unused,
        used_pages: r.used_pages(),
        free_pages: r.free_pages,
        free_pages_recorded: r.space.free_pages,
        lost_pages: r.lost_pages,
        catalog: (&r.catalog).into(),
        trees: r.trees.iter().map(JsonTree::from).collect(),
        findings: r.findings.iter().map(JsonFinding::from).collect(),
        mirrors: r
            .mirrors
            .iter()
            .map(|m| JsonMirror {
                device: m.role.to_string(),
                states: m.states.iter().map(|s| format!("{s:?}")).collect(),
                pages_compared: m.pages_compared,
                divergent_pages: m.divergent.iter().map(|d| d.0).collect(),
            })
            .collect(),
        out_of_place: r
            .out_of_place
            .iter()
            .map(|o| JsonOutOfPlace {
                device: o.device,
                segments: o.segments,
                segment_pages: o.segment_pages,
                free_segments: o.free_segments,
                mapped_pages: o.mapped_pages,
                offered_pages: o.offered_pages,
            })
            .collect(),
    };
    serde_json::to_string_pretty(&j).context("encoding the report as JSON")
}

/// Opens the database at `args.path` read-only (never creating or
/// changing anything), checks it and closes it.
fn run_checker(args: &CheckArgs) -> CliResult<CheckReport> {
    let first = args.path.join("dana.0");
    // A mirrored database whose copy 0 is gone still has copy 1.
    if !first.exists() && !args.path.join("dana.0.m1").exists() {
        return Err(CliError(format!(
            "{} is not a dana database (no {})",
            args.path.display(),
            first.display()
        )));
    }
    // Read-only: nothing is written (no recovery, no checkpoint, no log
    // format); a database that needs recovery, or whose log is damaged
    // where it had been durable, is reported as such.
    let mut opts = Options::default()
        .pool_bytes(POOL_BYTES)
        .page_size(args.page_size)
        .read_only();
    if args.blocking {
        opts = opts.backend(Backend::Blocking);
    }
    if let Some(log) = &args.log_path {
        opts = opts.log_path(log);
    }
    let what = || format!("checking {}", args.path.display());
    let db = Db::open(&args.path, opts).context(format!("opening {}", args.path.display()))?;
    let report = db.check().context(what())?;
    db.close()
        .context(format!("closing {}", args.path.display()))?;
    Ok(report)
}

/// `dana check`: prints every finding; an error (exit 1) if there is any.
pub fn run_check(args: &CheckArgs) -> CliResult<()> {
    let r = run_checker(args)?;
    if args.json {
        println!("{}", json(&args.path, &r)?);
    } else {
        for f in &r.findings {
            println!("{f}");
        }
        for m in &r.mirrors {
            println!("{}", mirror_line(m));
        }
        let pages = r.catalog.pages() + r.trees.iter().map(TreeStats::pages).sum::<u64>();
        println!(
            "{}: {} trees, {} tree pages, {} free pages, {} lost pages, {} findings",
            args.path.display(),
            r.trees.len(),
            pages,
            r.free_pages,
            r.lost_pages,
            r.findings.len()
        );
    }
    if r.is_ok() {
        Ok(())
    } else if r.data_ok() {
        // Still an error (exit 1): the redundancy is not whole.
        Err(CliError(format!(
            "{}: the data is whole, but {} findings are about mirror copies \
             (failed, rebuilding, damaged or older: dana rebuild repairs what each \
             finding says it repairs)",
            args.path.display(),
            r.findings.len()
        )))
    } else {
        Err(CliError(format!(
            "{} is damaged: {} findings",
            args.path.display(),
            r.findings.len()
        )))
    }
}

/// `dana inspect`: prints per-tree statistics and space use.
pub fn run_inspect(args: &CheckArgs) -> CliResult<()> {
    let r = run_checker(args)?;
    if args.json {
        println!("{}", json(&args.path, &r)?);
        return Ok(());
    }
    let mut t = Table::new(
        &[
            "tree",
            "root",
            "height",
            "inner",
            "leaves",
            "entries",
            "leaf fill",
            "inner fill",
        ],
        1,
    );
    for s in std::iter::once(&r.catalog).chain(&r.trees) {
        t.row(vec![
            s.name.clone(),
            s.root.to_string(),
            s.height.to_string(),
            num(s.inner_pages as f64, 0),
            num(s.leaf_pages as f64, 0),
            num(s.entries as f64, 0),
            format!("{:.1}%", s.leaf_fill * 100.0),
            if s.inner_pages == 0 {
                "-".into()
            } else {
                format!("{:.1}%", s.inner_fill * 100.0)
            },
        ]);
    }
    print!("{}", t.render());
    let ps = r.page_size as f64;
    let mib = |pages: u64| num(pages as f64 * ps / (1 << 20) as f64, 1);
    println!();
    println!("page size    {} bytes", r.page_size);
    println!(
        "total pages  {} ({} MiB)",
        num(r.space.total_pages as f64, 0),
        mib(r.space.total_pages)
    );
    println!(
        "used pages   {} ({} MiB; meta page and free pages not counted)",
        num(r.used_pages() as f64, 0),
        mib(r.used_pages())
    );
    println!(
        "free pages   {} in the free-space map (meta page says {})",
        num(r.free_pages as f64, 0),
        num(r.space.free_pages as f64, 0)
    );
    println!(
        "never used   {} (from page {})",
        num(
            r.space.total_pages.saturating_sub(r.space.next_unused) as f64,
            0
        ),
        r.space.next_unused
    );
    for m in &r.mirrors {
        println!("mirror       {}", mirror_line(m));
    }
    for o in &r.out_of_place {
        println!(
            "out of place device {}: {} segments of {} pages, {} free; {} of {} pages mapped",
            o.device,
            num(o.segments as f64, 0),
            o.segment_pages,
            num(o.free_segments as f64, 0),
            num(o.mapped_pages as f64, 0),
            num(o.offered_pages as f64, 0)
        );
    }
    if r.is_ok() {
        println!("check        clean");
    } else {
        println!(
            "check        {} findings ({} lost pages); run `dana check --path {}`",
            r.findings.len(),
            r.lost_pages,
            args.path.display()
        );
    }
    Ok(())
}
