//! docs/architecture.md stays true to the code: every source path it names in backticks exists,
//! and every Rust name it names in backticks (a path like `rt::release::AckSource`, or a
//! CamelCase name like `NodeLog`) is defined somewhere under crates/.
//!
//! A path is a backticked word with a `/` or ending in `.rs`; it may be relative to the
//! repository's root, to crates/, to crates/dtx, or to crates/dtx/src. A name is defined when some
//! line of a `.rs` file under crates/ declares it (`struct`, `enum`, `trait`, `type`, `fn`, `mod`,
//! `const`, `static`), or starts with it as an enum variant or a field does (`Name(`, `Name {`,
//! `Name,`, `name:`). Fenced code blocks are not read.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The backticked spans of `doc` outside fenced blocks, with their 1-based line numbers.
fn backticked(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        // Odd-indexed parts are inside backticks (a line with an unmatched backtick drops its last).
        for (k, part) in parts.iter().enumerate() {
            if k % 2 == 1 && k + 1 < parts.len() {
                out.push((i + 1, part.to_string()));
            }
        }
    }
    out
}

fn is_path(s: &str) -> bool {
    let ok_chars = s.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
    ok_chars && !s.starts_with('-') && !s.contains("//") && (s.contains('/') || s.ends_with(".rs"))
}

fn path_exists(root: &Path, s: &str) -> bool {
    ["", "crates", "crates/dtx", "crates/dtx/src"].iter().any(|base| root.join(base).join(s).exists())
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The Rust names a backticked span asks to check: the segments of a path `a::b::{C, d}`
/// (generics, arguments and what follows dropped), or a lone CamelCase name. Empty for anything
/// else (flags, options, values, file names).
fn rust_names(span: &str) -> Vec<String> {
    let span = span.trim();
    if span.contains("::") {
        // Cut at the first character a path cannot hold, but keep a trailing `{a, b}` group.
        let (head, group) = match span.find("::{") {
            Some(i) => {
                let end = span[i..].find('}').map(|j| i + j).unwrap_or(span.len());
                (&span[..i], Some(&span[i + 3..end]))
            }
            None => {
                let end =
                    span.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(span.len());
                (&span[..end], None)
            }
        };
        let mut names: Vec<String> = head.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
        if let Some(g) = group {
            names.extend(g.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
        }
        if names.iter().all(|n| is_ident(n)) && names.len() >= 2 {
            return names;
        }
        return Vec::new();
    }
    // A lone CamelCase name: an uppercase first letter, a lowercase letter somewhere, no `_`.
    let camel = is_ident(span)
        && span.starts_with(|c: char| c.is_ascii_uppercase())
        && span.chars().any(|c| c.is_ascii_lowercase())
        && !span.contains('_');
    if camel {
        vec![span.to_string()]
    } else {
        Vec::new()
    }
}

/// Every name a `.rs` file under crates/ defines, by the rules in the module comment.
fn defined_names(crates: &Path) -> HashSet<String> {
    const KEYWORDS: &[&str] = &["struct", "enum", "trait", "type", "fn", "mod", "const", "static", "union"];
    const SKIP: &[&str] = &["pub", "pub(crate)", "pub(super)", "async", "unsafe", "const", "default"];
    let mut names = HashSet::new();
    let mut stack = vec![crates.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            for line in text.lines() {
                let words: Vec<&str> =
                    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
                for pair in words.windows(2) {
                    if KEYWORDS.contains(&pair[0]) {
                        names.insert(pair[1].to_string());
                    }
                }
                // An enum variant or a field: the line starts with the name.
                let mut rest = line.trim_start();
                loop {
                    let before = rest;
                    for s in SKIP {
                        if let Some(r) = rest.strip_prefix(s).and_then(|r| r.strip_prefix(' ')) {
                            rest = r.trim_start();
                        }
                    }
                    if rest == before {
                        break;
                    }
                }
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                let (name, after) = rest.split_at(end);
                let after = after.trim_start();
                let starts_item = after.is_empty()
                    || after.starts_with('(')
                    || after.starts_with('{')
                    || after.starts_with(',')
                    || (after.starts_with(':') && !after.starts_with("::"));
                if is_ident(name) && starts_item {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

#[test]
fn every_path_and_name_in_the_architecture_document_exists() {
    let root = root();
    let doc_path = root.join("docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_else(|e| panic!("reading {}: {e}", doc_path.display()));
    let defined = defined_names(&root.join("crates"));
    // Crate names that start a path but are not declared as a `mod`.
    let crates: HashSet<&str> = ["crate", "dtx", "dtx_check", "dtx_report"].into_iter().collect();

    let mut missing = Vec::new();
    let mut checked = (0, 0);
    for (line, span) in backticked(&doc) {
        if is_path(&span) {
            checked.0 += 1;
            if !path_exists(&root, &span) {
                missing.push(format!(
                    "docs/architecture.md:{line}: path `{span}` exists under none of the repository root, crates/, crates/dtx, crates/dtx/src"
                ));
            }
            continue;
        }
        for name in rust_names(&span) {
            checked.1 += 1;
            if !crates.contains(name.as_str()) && !defined.contains(&name) {
                missing.push(format!(
                    "docs/architecture.md:{line}: `{name}` (in `{span}`) is defined nowhere under crates/"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "docs/architecture.md names what does not exist:\n{}", missing.join("\n"));
    // The check must have something to check: a parser that found nothing would pass vacuously.
    assert!(checked.0 >= 10 && checked.1 >= 50, "too few paths ({}) or names ({}) found", checked.0, checked.1);
}

#[test]
fn the_checks_catch_what_does_not_exist() {
    let root = root();
    assert!(path_exists(&root, "host/acks.rs"));
    assert!(path_exists(&root, "protocols/twopc/durable.rs"));
    assert!(path_exists(&root, "crates/dtx/tests/docs.rs"));
    assert!(!path_exists(&root, "host/no_such_file.rs"));
    assert!(is_path("wal/") && is_path("util.rs") && !is_path("--protocol") && !is_path("commit=epoch|wm"));
    assert_eq!(rust_names("rt::release::AckSource"), ["rt", "release", "AckSource"]);
    assert_eq!(rust_names("WorkerProtocol::{execute, start}"), ["WorkerProtocol", "execute", "start"]);
    assert_eq!(rust_names("Storage<M>"), Vec::<String>::new(), "a lone generic name is not checked");
    assert_eq!(rust_names("twopc::Cc<C>"), ["twopc", "Cc"]);
    assert_eq!(rust_names("NodeLog"), ["NodeLog"]);
    assert!(rust_names("node-<n>").is_empty() && rust_names("ENOSPC").is_empty() && rust_names("sim").is_empty());
    let defined = defined_names(&root.join("crates"));
    for name in ["NodeLog", "AckSource", "ReleasePoints", "commit_with_early_release", "Own", "ack_after", "release"] {
        assert!(defined.contains(name), "{name} should be found");
    }
    assert!(!defined.contains("NoSuchTypeAnywhere"));
}
