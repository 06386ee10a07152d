//! The layers of docs/architecture.md stay true: no module of `crates/dtx/src` uses a module of a
//! layer above its own. Read from the source text: every `crate::<module>` path outside comments
//! and outside test code. Test code is an inline `#[cfg(test)] mod ... {` (everything after it, to
//! the end of the file: the project keeps its unit tests last in a file, so this rule is good
//! enough) or a whole file declared as `#[cfg(test)] mod name;`. A test may reach up to build a
//! whole run.

use std::path::{Path, PathBuf};

/// Bottom to top. A module may use its own layer and those below it.
const LAYERS: &[&str] = &[
    "util",
    "storage",
    "wal",
    "net",
    "cluster",
    "rt",
    "replication",
    "txn",
    "protocols",
    "workloads",
    "host",
    "bench",
    "cli",
];

/// The crate's roots sit above every layer.
const ROOTS: &[&str] = &["lib", "main"];

fn rank(layer: &str) -> Option<usize> {
    if ROOTS.contains(&layer) {
        return Some(LAYERS.len());
    }
    LAYERS.iter().position(|l| *l == layer)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source folder reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layer of a file: its top-level module under `src/`.
fn layer_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a path").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// Every `crate::<module>` a line of code names.
fn crate_paths(line: &str) -> Vec<String> {
    let code = match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` in a macro names the crate root, as `crate::` does.
        let after = &rest[i + "crate::".len()..];
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            out.push(name);
        }
        rest = after;
    }
    out
}

/// Files that are test modules as a whole: declared `#[cfg(test)] mod name;` by their parent, or
/// under the `test-protocols` feature that only the tests turn on (the test kit, multilog).
fn test_only_files(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let lines: Vec<&str> = text.lines().collect();
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().expect("a folder").to_path_buf(),
            _ => file.with_extension(""),
        };
        for pair in lines.windows(2) {
            let decl = pair[1].trim();
            let test_only =
                matches!(pair[0].trim(), "#[cfg(test)]" | "#[cfg(any(test, feature = \"test-protocols\"))]");
            if test_only && decl.ends_with(';') && decl.contains("mod ") {
                let name = decl.trim_end_matches(';').rsplit(' ').next().unwrap_or("");
                out.push(dir.join(format!("{name}.rs")));
                out.push(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "found the sources ({} files)", files.len());
    let test_files = test_only_files(&files);
    let mut violations = Vec::new();
    for file in files.iter().filter(|f| !test_files.contains(f)) {
        let layer = layer_of(&src, file);
        let Some(own) = rank(&layer) else {
            violations.push(format!("{}: module `{layer}` is in no layer: add it to LAYERS", file.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.starts_with("#[cfg(test)]") && lines.get(n + 1).is_some_and(|next| next.trim_end().ends_with('{')) {
                break;
            }
            for target in crate_paths(line) {
                match rank(&target) {
                    Some(r) if r > own => violations.push(format!(
                        "{}:{}: `{layer}` uses `{target}`, a layer above it",
                        file.strip_prefix(&src).unwrap_or(file).display(),
                        n + 1
                    )),
                    Some(_) => {}
                    None if target.chars().next().is_some_and(|c| c.is_uppercase()) => {} // An item at the root.
                    None => violations.push(format!("{}:{}: `crate::{target}` is in no layer", file.display(), n + 1)),
                }
            }
        }
    }
    assert!(violations.is_empty(), "imports that run up the layers:\n{}", violations.join("\n"));
}

#[test]
fn the_rule_reads_paths_and_skips_comments() {
    assert_eq!(crate_paths("use crate::rt::{Worker, log};"), ["rt"]);
    assert_eq!(crate_paths("let x = crate::net::encode(&crate::txn::Abort::User); // crate::bench"), ["net", "txn"]);
    assert!(crate_paths("//! see crate::bench").is_empty());
    assert!(rank("protocols") < rank("workloads") && rank("wal") < rank("rt") && rank("main") > rank("cli"));
}
