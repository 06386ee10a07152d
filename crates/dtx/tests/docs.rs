//! The documents stay true to the code.
//!
//! docs/architecture.md: every source path it names in backticks exists, and every Rust name it
//! names in backticks (a path like `rt::release::AckSource`, or a CamelCase name like `NodeLog`)
//! is defined somewhere under crates/.
//!
//! A path is a backticked word with a `/` or ending in `.rs`; it may be relative to the
//! repository's root, to crates/, to crates/dtx, or to crates/dtx/src. A name is defined when some
//! line of a `.rs` file under crates/ declares it (`struct`, `enum`, `trait`, `type`, `fn`, `mod`,
//! `const`, `static`), or starts with it as an enum variant or a field does (`Name(`, `Name {`,
//! `Name,`, `name:`). Fenced code blocks are not read.
//!
//! The protocols the documents list agree with the registry (`protocols::REGISTRY`,
//! `protocols::PLANNED`): architecture.md's layer diagram names every ready protocol, and its
//! planned protocols' table lists every planned protocol and no other; the protocol tables of the
//! README and docs/protocols.md (headed `| name | status |`) give every ready protocol a `ready`
//! row and call none `planned` that the registry calls ready.
//!
//! The struct fields the documents name exist, by two rules simple enough to keep: a field is
//! named in backticks as `Struct.field` (or `path::Struct.field`: a CamelCase struct, a lower-case
//! field, a file name like `Cargo.toml` excepted), and a fenced `rust` block that writes out a
//! struct names only fields that struct has in the code. A field named any other way (in a list in
//! prose) is not checked, so the documents name fields only these two ways. Every document of
//! docs/ and the README is read but the two that record the code as it was (`RECORDS`).
//!
//! docs/README.md, the index, links every document in docs/, and every link it holds resolves.

use std::collections::{HashMap, HashSet};
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

/// The text of every `.rs` file under `crates`.
fn rust_sources(crates: &Path) -> Vec<String> {
    let mut texts = Vec::new();
    let mut stack = vec![crates.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                texts.push(text);
            }
        }
    }
    texts
}

/// Every name a `.rs` file under crates/ defines, by the rules in the module comment.
fn defined_names(crates: &Path) -> HashSet<String> {
    const KEYWORDS: &[&str] = &["struct", "enum", "trait", "type", "fn", "mod", "const", "static", "union"];
    const SKIP: &[&str] = &["pub", "pub(crate)", "pub(super)", "async", "unsafe", "const", "default"];
    let mut names = HashSet::new();
    for text in rust_sources(crates) {
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

/// The protocols the registry calls ready, and those it plans: `protocols::PLANNED` and any entry
/// of the registry whose status is `planned` (one with code that is not ready yet).
fn registry_names() -> (Vec<&'static str>, Vec<&'static str>) {
    let ready = dtx::protocols::ready().map(|p| p.name).collect();
    let planned = dtx::protocols::PLANNED
        .iter()
        .map(|(name, _)| *name)
        .chain(dtx::protocols::REGISTRY.iter().filter(|p| p.status == "planned").map(|p| p.name))
        .collect();
    (ready, planned)
}

fn read_doc(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The text of `doc` under the heading line `heading`, up to the next heading of that level or
/// above (a `#` line in a fenced block is not a heading), with the line number of its first line.
fn section<'a>(doc: &'a str, heading: &str) -> Option<(usize, Vec<&'a str>)> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let lines: Vec<&str> = doc.lines().collect();
    let start = lines.iter().position(|l| l.trim_end() == heading)? + 1;
    let mut fenced = false;
    let mut len = lines.len() - start;
    for (i, l) in lines[start..].iter().enumerate() {
        fenced ^= l.trim_start().starts_with("```");
        let hashes = l.chars().take_while(|c| *c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && l[hashes..].starts_with(' ') {
            len = i;
            break;
        }
    }
    Some((start + 1, lines[start..start + len].to_vec()))
}

/// The fenced blocks of `doc`: the line number of the opening fence, its info string (`rust`,
/// `sh`, or empty) and the text inside.
fn fenced_blocks(doc: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        let trimmed = line.trim_start();
        match (trimmed.strip_prefix("```"), open.take()) {
            (Some(info), None) => open = Some((i + 1, info.trim().to_string(), String::new())),
            (Some(_), Some(block)) => out.push(block),
            (None, Some((at, info, mut text))) => {
                text.push_str(line);
                text.push('\n');
                open = Some((at, info, text));
            }
            (None, None) => {}
        }
    }
    out
}

/// Whether `text` holds `name` as a whole word, a word being a run of letters, digits and `-`
/// (so that `2pl-detect` is one word and `occ` is not found in `occurs`).
fn mentions(text: &str, name: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|w| w == name)
}

/// The cells of a table row (`| a | b |`), split at every `|` that is not escaped (`\|`).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|');
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in inner.chars() {
        match c {
            '|' if !escaped => out.push(String::new()),
            _ => out.last_mut().expect("one cell at least").push(c),
        }
        escaped = c == '\\';
    }
    if inner.trim_end().ends_with('|') {
        out.pop();
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The backticked words of a table cell.
fn names_in(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(|s| s.trim().to_string()).collect()
}

/// What architecture.md says wrongly about the registry: a ready protocol its layer diagram (the
/// first fenced block under `## Layers`) does not name, and a row of its planned protocols' table
/// that names a protocol the registry does not plan, or a planned protocol with no row.
fn architecture_protocol_problems(doc: &str, ready: &[&str], planned: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let diagram = section(doc, "## Layers").and_then(|(_, lines)| fenced_blocks(&lines.join("\n")).into_iter().next());
    match diagram {
        None => problems.push("no layer diagram (a fenced block under `## Layers`)".to_string()),
        Some((_, _, text)) => {
            for name in ready.iter().filter(|name| !mentions(&text, name)) {
                problems.push(format!("the layer diagram does not name ready protocol `{name}`"));
            }
        }
    }
    let Some((first, lines)) = section(doc, "## The planned protocols") else {
        problems.push("no section `## The planned protocols`".to_string());
        return problems;
    };
    let mut listed = HashSet::new();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| l.starts_with('|')) {
        let at = first + i;
        for name in names_in(&cells(line)[0]) {
            if ready.contains(&name.as_str()) {
                problems.push(format!("line {at}: the planned protocols' table lists `{name}`, which is ready"));
            } else if !planned.contains(&name.as_str()) {
                problems.push(format!("line {at}: the planned protocols' table lists `{name}`, which is not planned"));
            }
            listed.insert(name);
        }
    }
    for name in planned.iter().filter(|name| !listed.contains(**name)) {
        problems.push(format!("the planned protocols' table has no row for planned `{name}`"));
    }
    problems
}

/// What the protocol table of `doc` (the one headed `| name | status |`) says wrongly about the
/// registry: a name it calls ready that the registry does not, a ready one it calls planned or
/// does not know, a name the registry does not know at all, a ready protocol with no ready row.
fn protocol_table_problems(doc: &str, ready: &[&str], planned: &[&str]) -> Vec<String> {
    let lines: Vec<&str> = doc.lines().collect();
    let is_header = |l: &&str| {
        let c = cells(l);
        l.starts_with('|') && c.len() >= 2 && c[0] == "name" && c[1] == "status"
    };
    let Some(header) = lines.iter().position(is_header) else {
        return vec!["no protocol table (headed `| name | status |`)".to_string()];
    };
    let mut problems = Vec::new();
    let mut ready_rows = HashSet::new();
    let rows = lines[header + 1..].iter().enumerate().take_while(|(_, l)| l.starts_with('|'));
    for (i, row) in rows {
        let cells = cells(row);
        let status = cells.get(1).map_or("", |s| s.as_str());
        for name in names_in(&cells[0]) {
            let line = header + 2 + i;
            let is_ready = ready.contains(&name.as_str());
            if status.starts_with("ready") && !is_ready {
                problems.push(format!("line {line}: `{name}` is listed as ready; the registry does not call it ready"));
            } else if status.starts_with("planned") && is_ready {
                problems.push(format!("line {line}: `{name}` is listed as planned; the registry calls it ready"));
            } else if !is_ready && !planned.contains(&name.as_str()) {
                problems.push(format!("line {line}: `{name}` is neither ready nor planned in the registry"));
            }
            if status.starts_with("ready") {
                ready_rows.insert(name);
            }
        }
    }
    for name in ready.iter().filter(|name| !ready_rows.contains(**name)) {
        problems.push(format!("ready protocol `{name}` has no row with status ready"));
    }
    problems
}

#[test]
fn architecture_md_names_every_ready_protocol_and_plans_only_the_planned() {
    let (ready, planned) = registry_names();
    assert!(ready.len() >= 10 && !planned.is_empty(), "the registry's lists look empty: {ready:?} {planned:?}");
    let problems = architecture_protocol_problems(&read_doc("docs/architecture.md"), &ready, &planned);
    assert!(problems.is_empty(), "docs/architecture.md disagrees with the registry:\n{}", problems.join("\n"));
}

#[test]
fn the_protocol_tables_of_the_readme_and_protocols_md_agree_with_the_registry() {
    let (ready, planned) = registry_names();
    let mut problems = Vec::new();
    for doc in ["README.md", "docs/protocols.md"] {
        let found = protocol_table_problems(&read_doc(doc), &ready, &planned);
        problems.extend(found.into_iter().map(|p| format!("{doc}: {p}")));
    }
    assert!(problems.is_empty(), "a protocol table disagrees with the registry:\n{}", problems.join("\n"));
}

/// A `struct` declaration's named fields, read from Rust source text: after `struct Name` and its
/// generics, a `(` or `;` is a tuple or unit struct (no named fields); otherwise the body is what
/// lies between the next `{` and its match, and a field is each comma-separated part at the
/// body's top level that reads `name:` once its attributes and visibility are cut off. Comments
/// (`//` to the end of the line) are dropped first.
fn structs_in(source: &str) -> Vec<(String, HashSet<String>)> {
    let code: Vec<&str> = source.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect();
    let code = code.join("\n");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("struct ").map(|i| from + i) {
        from = at + "struct ".len();
        if at > 0 && !code[..at].ends_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let rest = &code[from..];
        let name_len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let name = &rest[..name_len];
        if !is_ident(name) {
            continue;
        }
        let mut rest = rest[name_len..].trim_start();
        if rest.starts_with('<') {
            rest = rest[closing(rest, '<', '>').map_or(rest.len(), |i| i + 1)..].trim_start();
        }
        let mut fields = HashSet::new();
        if !rest.starts_with('(') && !rest.starts_with(';') {
            if let Some(open) = rest.find(['{', ';']).filter(|i| rest[*i..].starts_with('{')) {
                let body = &rest[open..];
                let body = &body[1..closing(body, '{', '}').unwrap_or(body.len())];
                fields = top_level_parts(body).iter().filter_map(|part| field_of(part)).collect();
            }
        }
        out.push((name.to_string(), fields));
    }
    out
}

/// The index of the bracket that closes the one `text` starts with (`->` is not a closing `>`).
fn closing(text: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 0usize;
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close && !(close == '>' && prev == '-') {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
        prev = c;
    }
    None
}

/// `body` split at the commas outside any brackets (`->` does not close a `<`).
fn top_level_parts(body: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start, mut prev) = (0i32, 0, ' ');
    for (i, c) in body.char_indices() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            '>' if prev != '-' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        prev = c;
    }
    parts.push(&body[start..]);
    parts
}

/// The field a struct body's part declares: `#[attr] pub(crate) name: Type` gives `name`.
fn field_of(part: &str) -> Option<String> {
    let mut s = part.trim();
    while s.starts_with("#[") {
        s = s[closing(&s[1..], '[', ']')? + 2..].trim_start();
    }
    if let Some(r) = s.strip_prefix("pub").filter(|r| r.starts_with(|c: char| c == '(' || c.is_whitespace())) {
        s = r.trim_start();
        if s.starts_with('(') {
            s = s[closing(s, '(', ')')? + 1..].trim_start();
        }
    }
    let (name, ty) = s.split_once(':')?;
    (is_ident(name.trim()) && !ty.starts_with(':')).then(|| name.trim().to_string())
}

/// Every struct under crates/ by name, with the named fields of each of its declarations (a name
/// declared twice, in two modules, has two).
fn struct_fields(crates: &Path) -> HashMap<String, Vec<HashSet<String>>> {
    let mut structs: HashMap<String, Vec<HashSet<String>>> = HashMap::new();
    for text in rust_sources(crates) {
        for (name, fields) in structs_in(&text) {
            structs.entry(name).or_default().push(fields);
        }
    }
    structs
}

/// The struct and field a backticked span names as `Struct.field` or `path::Struct.field`: a
/// CamelCase struct, a lower-case field. A file name (`Cargo.toml`) is not one.
fn field_ref(span: &str) -> Option<(String, String)> {
    const FILE_ENDINGS: &[&str] = &["toml", "json", "jsonl", "md", "rs", "svg", "html", "sh", "txt", "lock"];
    let (path, field) = span.trim().rsplit_once('.')?;
    let name = path.rsplit("::").next()?;
    let camel = name.starts_with(|c: char| c.is_ascii_uppercase()) && name.chars().any(|c| c.is_ascii_lowercase());
    let lower = field.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let path_ok = path.split("::").all(is_ident);
    (camel && lower && path_ok && is_ident(field) && !FILE_ENDINGS.contains(&field))
        .then(|| (name.to_string(), field.to_string()))
}

/// The fields `doc` names that the code does not have, by the two rules of the module comment;
/// and how many it checked.
fn field_problems(doc: &str, structs: &HashMap<String, Vec<HashSet<String>>>) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut checked = 0;
    let describe = |name: &str| match structs.get(name) {
        None => format!("no struct `{name}` is declared under crates/"),
        Some(decls) => {
            let mut fields: Vec<&String> = decls.iter().flatten().collect();
            fields.sort();
            format!("`{name}` has {fields:?}")
        }
    };
    for (line, span) in backticked(doc) {
        if let Some((name, field)) = field_ref(&span) {
            checked += 1;
            if !structs.get(&name).is_some_and(|decls| decls.iter().any(|f| f.contains(&field))) {
                problems.push(format!("line {line}: `{span}`: no field `{field}`; {}", describe(&name)));
            }
        }
    }
    for (line, _, text) in fenced_blocks(doc).into_iter().filter(|(_, info, _)| info.starts_with("rust")) {
        for (name, fields) in structs_in(&text) {
            checked += 1;
            let has_all = structs.get(&name).is_some_and(|decls| decls.iter().any(|f| fields.is_subset(f)));
            if !has_all {
                let mut named: Vec<&String> = fields.iter().collect();
                named.sort();
                problems.push(format!("the rust block at line {line}: `{name}` with {named:?}; {}", describe(&name)));
            }
        }
    }
    (problems, checked)
}

/// The documents that record the code as it was when they were written, and say so at their top:
/// the fields they name may since have changed.
const RECORDS: &[&str] = &["docs/protocol-mapping.md", "docs/performance-history.md"];

/// Every markdown file of docs/ (its top level: docs/results/ holds data), by name.
fn docs_md_files() -> Vec<String> {
    let dir = root().join("docs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_field_the_documents_name_exists_in_the_code() {
    let structs = struct_fields(&root().join("crates"));
    let docs = docs_md_files().into_iter().map(|n| format!("docs/{n}")).chain(["README.md".to_string()]);
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in docs.filter(|d| !RECORDS.contains(&d.as_str())) {
        let (found, n) = field_problems(&read_doc(&doc), &structs);
        checked += n;
        problems.extend(found.into_iter().map(|p| format!("{doc}: {p}")));
    }
    assert!(problems.is_empty(), "the documents name fields the code does not have:\n{}", problems.join("\n"));
    // architecture.md names a few: a rule that matched none would pass vacuously.
    assert!(checked >= 5, "only {checked} field names found");
}

/// The relative links of a markdown text (`[text](target)`), with their line numbers, anchors
/// cut off; web links and links within the page are left out.
fn links(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        for piece in line.split("](").skip(1) {
            let target = piece.split(')').next().unwrap_or("");
            let target = target.split('#').next().unwrap_or("");
            if !target.is_empty() && !target.contains("://") && !target.contains(' ') {
                out.push((i + 1, target.trim_start_matches("./").to_string()));
            }
        }
    }
    out
}

/// What the index of docs/ gets wrong: a document of `files` it does not link, and a link whose
/// target does not exist (`exists` is asked with the target as written, relative to docs/).
fn index_problems(index: &str, files: &[String], exists: impl Fn(&str) -> bool) -> Vec<String> {
    let links = links(index);
    let mut problems = Vec::new();
    for file in files.iter().filter(|f| *f != "README.md") {
        if !links.iter().any(|(_, target)| target == file) {
            problems.push(format!("docs/{file} is not listed"));
        }
    }
    for (line, target) in links.iter().filter(|(_, target)| !exists(target)) {
        problems.push(format!("line {line}: the link to `{target}` leads nowhere"));
    }
    problems
}

#[test]
fn the_index_of_docs_lists_every_document_and_its_links_resolve() {
    let docs = root().join("docs");
    let problems = index_problems(&read_doc("docs/README.md"), &docs_md_files(), |t| docs.join(t).exists());
    assert!(problems.is_empty(), "docs/README.md, the index:\n{}", problems.join("\n"));
    let readme = read_doc("README.md");
    assert!(links(&readme).iter().any(|(_, t)| t == "docs/README.md"), "the README does not link docs/README.md");
}

#[test]
fn the_new_checks_catch_drift() {
    // The protocol lists: a diagram that drops one, a ready protocol left in the planned table.
    let (ready, planned) = (["occ", "calvin"], ["aria"]);
    let arch = "## Layers\n\n```\nprotocols: occ, calvin (calvin/)\n```\n\n## The planned protocols\n\n\
                | protocol | uses |\n|---|---|\n| `aria` | x |\n";
    assert_eq!(architecture_protocol_problems(arch, &ready, &planned), Vec::<String>::new());
    let dropped = architecture_protocol_problems(&arch.replace("occ, ", "occurs, "), &ready, &planned);
    assert!(dropped.len() == 1 && dropped[0].contains("`occ`"), "{dropped:?}");
    let kept = architecture_protocol_problems(&format!("{arch}| `calvin` (ready) | y |\n"), &ready, &planned);
    assert!(kept.len() == 1 && kept[0].contains("`calvin`, which is ready"), "{kept:?}");
    let unlisted = architecture_protocol_problems(&arch.replace("| `aria` | x |\n", ""), &ready, &planned);
    assert!(unlisted.len() == 1 && unlisted[0].contains("`aria`"), "{unlisted:?}");
    assert!(!architecture_protocol_problems("# no sections", &ready, &planned).is_empty());

    let table = "| name | status | what |\n|---|---|---|\n| `occ` | ready | a \\| b |\n\
                 | `calvin` | ready (`protocols/calvin/`) | c |\n| `aria` | planned | d |\n";
    assert_eq!(protocol_table_problems(table, &ready, &planned), Vec::<String>::new());
    let demoted = protocol_table_problems(&table.replace("`calvin` | ready", "`calvin` | planned"), &ready, &planned);
    assert_eq!(demoted.len(), 2, "listed as planned, and no ready row: {demoted:?}");
    let promoted = protocol_table_problems(&table.replace("`aria` | planned", "`aria` | ready"), &ready, &planned);
    assert!(promoted.len() == 1 && promoted[0].contains("`aria`"), "{promoted:?}");
    assert!(!protocol_table_problems("| protocol | what |\n|---|---|\n", &ready, &planned).is_empty());

    // The field rules: the struct reader, a field that is not there, a struct block that drifted.
    let source = "pub struct Alpha<T: Clone> where T: Fn(u32) {\n    /// a comment, with {braces}\n    \
                  pub x: Vec<(u8, u16)>,\n    #[serde(default)] pub(crate) y: fn(u8) -> u16, z: HashMap<u8, u8>\n}\n\
                  struct Beta(u8);\nstruct Gamma;\n";
    let read = structs_in(source);
    let fields = |s: &[&str]| s.iter().map(|f| f.to_string()).collect::<HashSet<String>>();
    let expected = [("Alpha", fields(&["x", "y", "z"])), ("Beta", fields(&[])), ("Gamma", fields(&[]))];
    assert_eq!(read, expected.map(|(name, f)| (name.to_string(), f)));
    let structs: HashMap<String, Vec<HashSet<String>>> =
        read.into_iter().map(|(name, fields)| (name, vec![fields])).collect();
    assert_eq!(field_problems("`Alpha.x`, `m::Alpha.y` and `Cargo.toml`", &structs), (vec![], 2));
    let (wrong, _) = field_problems("`Alpha.w` and `Delta.x`", &structs);
    assert!(
        wrong.len() == 2 && wrong[0].contains("no field `w`") && wrong[1].contains("no struct `Delta`"),
        "{wrong:?}"
    );
    let (block, _) = field_problems("```rust\nstruct Alpha {\n    x: u8,\n    w: u8,\n}\n```\n", &structs);
    assert!(block.len() == 1 && block[0].contains("`Alpha`"), "{block:?}");
    assert_eq!(field_ref("README.md"), None);
    assert_eq!(field_ref("twopc::record_lock::LockMeta.first"), Some(("LockMeta".into(), "first".into())));
    let code = struct_fields(&root().join("crates"));
    let lock = &code["LockMeta"];
    assert!(lock.iter().any(|f| f.contains("first")) && !lock.iter().any(|f| f.contains("exclusive")), "{lock:?}");

    // The index: a document left out, a link to nothing.
    let files = ["README.md".to_string(), "a.md".to_string(), "b.md".to_string()];
    let exists = |t: &str| t == "a.md" || t == "b.md";
    assert_eq!(index_problems("- [a](a.md)\n- [b](./b.md#top)", &files, exists), Vec::<String>::new());
    let index = index_problems("- [a](a.md): x\n- [c](c.md), [web](https://example.com)", &files, exists);
    assert!(index.len() == 2 && index[0].contains("b.md") && index[1].contains("`c.md`"), "{index:?}");
}

/// The folder whose `mod.rs` header holds protocol `name`'s map of where it lives: its own, or
/// the one it is a variant of (COCO is OCC under epochs; the three 2PLs share `twopl/`).
fn home_folder(name: &str) -> &str {
    match name {
        "coco" => "occ",
        n if n.starts_with("2pl-") => "twopl",
        n => n,
    }
}

/// Where a protocol lives (`ProtocolInfo::lives`, what `dtx protocols --options NAME` prints):
/// every path exists, its folder's module header names every one (so that a newcomer who opens
/// the folder finds the mechanisms that live outside it), and the README's row names the folder.
#[test]
fn every_protocol_names_where_each_of_its_mechanisms_lives() {
    let src = root().join("crates/dtx/src");
    let (readme, mut problems) = (read_doc("README.md"), Vec::new());
    for p in dtx::protocols::REGISTRY.iter().filter(|p| p.status == "ready") {
        if p.lives.len() < 3 {
            problems.push(format!("{}: a map of {} places", p.name, p.lives.len()));
        }
        let header_path = src.join("protocols").join(home_folder(p.name)).join("mod.rs");
        let header: String = std::fs::read_to_string(&header_path)
            .unwrap_or_default()
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let row = readme.lines().find(|l| l.starts_with(&format!("| `{}` |", p.name))).unwrap_or_default();
        if !cells(row).get(2).is_some_and(|code| code.contains(&format!("{}/", home_folder(p.name)))) {
            problems.push(format!("{}: the README's row names no folder `{}/`: {row}", p.name, home_folder(p.name)));
        }
        for (what, path) in p.lives {
            if !src.join(path).exists() {
                problems.push(format!("{}: `{path}` ({what}) does not exist", p.name));
            }
            if !header.contains(&format!("`{path}`")) {
                problems.push(format!("{}: {} does not name `{path}` ({what})", p.name, header_path.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
