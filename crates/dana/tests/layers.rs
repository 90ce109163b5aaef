//! The layers import downward only: io < sched < buffer < btree, wal <
//! validate, read_fence < txn < options, catalog, checkpoint < check, open, recovery < start <
//! db, transaction (error and
//! stats serve every layer).
//! This test reads every source file of the library and fails on an
//! import of a higher (or equal, other) layer that is not in the list of
//! known exceptions below, so no new one can land unnoticed. Each known
//! exception names the issue that removes it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Rank of each top-level module (a module may import lower ranks only).
fn rank(module: &str) -> Option<u32> {
    Some(match module {
        "error" | "stats" => 0,
        "io" => 1,
        "sched" => 2,
        "buffer" => 3,
        "btree" | "wal" => 4,
        "validate" | "read_fence" => 5,
        "txn" => 6,
        "options" => 7,
        "catalog" | "checkpoint" => 7,
        "check" | "open" | "recovery" => 8,
        "start" => 9,
        "db" => 10,
        _ => return None,
    })
}

/// The layer a module belongs to: the public transaction is part of the
/// public API (it takes `Tree` handles, `Db` hands it out).
fn layer(module: &str) -> &str {
    match module {
        "transaction" | "iter" => "db",
        m => m,
    }
}

/// The module behind a name re-exported at the crate root.
fn reexport(name: &str) -> Option<&'static str> {
    Some(match name {
        "Error" | "Result" | "OpKind" => "error",
        "Db" | "Tree" => "db",
        "Options" => "options",
        "Transaction" => "transaction",
        "Iter" => "iter",
        "Durability" => "wal",
        "Isolation" => "validate",
        "EvictionPolicy" => "buffer",
        _ => return None,
    })
}

/// Upward imports that exist today, each with the issue that removes it
/// (none left: the buffer pool's import of the log was the last, removed
/// by the `buffer::page_log::PageLog` trait).
const KNOWN: &[(&str, &str, &str)] = &[];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The first path segment of every `crate::` path in `code` (comments
/// skipped), with `crate::{a, b::c}` lists split.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(list) = rest.strip_prefix('{') {
                let end = list.find('}').unwrap_or(list.len());
                for item in list[..end].split(',') {
                    let seg: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !seg.is_empty() {
                        out.insert(seg);
                    }
                }
            } else {
                let seg: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !seg.is_empty() {
                    out.insert(seg);
                }
            }
        }
    }
    out
}

#[test]
fn layers_import_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = BTreeSet::new();
    let mut unknown = Vec::new();
    for f in &files {
        let module = layer(&module_of(&src, f)).to_string();
        if module == "lib" {
            continue;
        }
        let Some(own) = rank(&module) else {
            unknown.push(format!("{}: module {module} has no layer", f.display()));
            continue;
        };
        let code = std::fs::read_to_string(f).unwrap();
        for seg in imports(&code) {
            let target = match rank(layer(&seg)) {
                Some(_) => layer(&seg).to_string(),
                None => match reexport(&seg) {
                    Some(m) => m.to_string(),
                    None => {
                        unknown.push(format!("{}: crate::{seg} is no known module", f.display()));
                        continue;
                    }
                },
            };
            if target == module {
                continue;
            }
            let theirs = rank(&target).unwrap();
            if theirs >= own {
                found.insert((module.clone(), target, f.display().to_string()));
            }
        }
    }
    assert!(unknown.is_empty(), "{unknown:#?}");
    let new: Vec<_> = found
        .iter()
        .filter(|(m, t, _)| !KNOWN.iter().any(|(a, b, _)| a == m && b == t))
        .collect();
    assert!(
        new.is_empty(),
        "imports of a layer that is not below (module, imported, file): {new:#?}"
    );
    // A known exception that is gone must leave the list.
    for (a, b, why) in KNOWN {
        assert!(
            found.iter().any(|(m, t, _)| m == a && t == b),
            "{a} no longer imports {b} ({why}): remove it from KNOWN"
        );
    }
}
