//! Every experiment file in the checkout keeps the verdict rules (docs/experiments.md, "Rules
//! for a verdict") that can be checked without running it: it parses (so its bands hold the
//! paper's values, no claim is both `not tested` and `calibrated`, and a headline gives the
//! paper's value), each of its claims has a row in docs/experiments.md's table of current
//! figures with a verdict its file allows, the table's per-paper counts are its rows' counts,
//! and experiments/pins.toml names only simulated experiments and claims that exist.

use dtx_report::experiment::pins::{Pins, PINS_FILE};
use dtx_report::experiment::{Experiment, Verdict};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn experiments() -> Vec<Experiment> {
    let dir = checkout().join("experiments");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && !p.ends_with(PINS_FILE))
        .collect();
    paths.sort();
    let (loaded, failed): (Vec<_>, Vec<_>) = paths.iter().map(|p| Experiment::load(p)).partition(Result::is_ok);
    let failed: Vec<String> = failed.into_iter().map(|e| format!("{:#}", e.unwrap_err())).collect();
    assert!(failed.is_empty(), "files that break the rules:\n{}", failed.join("\n"));
    loaded.into_iter().map(Result::unwrap).collect()
}

/// A row of the table of current figures, by its columns' names.
struct Row {
    paper: String,
    experiment: String,
    claim: String,
    verdict: String,
}

/// The Markdown tables of docs/experiments.md's "Current figures" section: each as its header's
/// cells and its rows' cells.
fn current_figures_tables() -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let doc = std::fs::read_to_string(checkout().join("docs/experiments.md")).unwrap();
    let start = doc.find("\n## Current figures\n").expect("docs/experiments.md has a \"Current figures\" section");
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    let cells = |line: &str| -> Vec<String> {
        line.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect()
    };
    let mut tables = Vec::new();
    let lines: Vec<&str> = section.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with('|') && lines.get(i + 1).is_some_and(|l| l.starts_with("|---")) {
            let header = cells(lines[i]);
            let mut rows = Vec::new();
            i += 2;
            while i < lines.len() && lines[i].starts_with('|') {
                rows.push(cells(lines[i]));
                i += 1;
            }
            tables.push((header, rows));
        } else {
            i += 1;
        }
    }
    tables
}

/// The table with a row per claim, and the table of verdicts counted per paper.
fn claims_and_counts() -> (Vec<Row>, Vec<(String, [usize; 5])>) {
    let tables = current_figures_tables();
    let (header, rows) = tables
        .iter()
        .find(|(h, _)| h.iter().any(|c| c == "claim"))
        .expect("a table with a `claim` column under \"Current figures\"");
    let col = |name: &str| header.iter().position(|c| c == name).unwrap_or_else(|| panic!("a `{name}` column"));
    let (p, e, c, v) = (col("paper"), col("experiment"), col("claim"), col("verdict"));
    let rows = rows
        .iter()
        .map(|r| Row { paper: r[p].clone(), experiment: r[e].clone(), claim: r[c].clone(), verdict: r[v].clone() })
        .collect();
    let (_, count_rows) = tables
        .iter()
        .find(|(h, _)| h.first().is_some_and(|c| c == "paper") && h.iter().any(|c| c == "calibrated"))
        .expect("a table of the verdicts counted per paper");
    let counts = count_rows
        .iter()
        .map(|r| {
            let n: Vec<usize> =
                r[1..6].iter().map(|k| k.parse().unwrap_or_else(|_| panic!("a count: {r:?}"))).collect();
            (r[0].clone(), [n[0], n[1], n[2], n[3], n[4]])
        })
        .collect();
    (rows, counts)
}

/// The verdict a row gives: its cell's first words (a cell may say more after them).
fn verdict_of(cell: &str) -> Option<Verdict> {
    Verdict::ALL.into_iter().filter(|v| cell.starts_with(v.text())).max_by_key(|v| v.text().len())
}

#[test]
fn every_experiment_file_keeps_the_rules() {
    let all = experiments();
    assert!(all.len() >= 40, "{} experiment files", all.len());
    let with_claims = all.iter().filter(|e| !e.claims.is_empty()).count();
    assert_eq!(with_claims, all.len(), "an experiment without a claim judges nothing");
}

#[test]
fn every_claim_has_a_row_in_the_table_of_current_figures() {
    let all = experiments();
    let (rows, counts) = claims_and_counts();
    let mut missing = Vec::new();
    for e in &all {
        for c in &e.claims {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.experiment == e.name && r.claim == c.text).collect();
            if mine.is_empty() {
                missing.push(format!("{}: {}", e.name, c.text));
            }
            for r in mine {
                let v = verdict_of(&r.verdict).unwrap_or_else(|| panic!("{}: `{}` is no verdict", e.name, r.verdict));
                // A claim the run cannot exercise is `not tested` whatever was measured.
                if c.not_tested.is_some() {
                    assert_eq!(v, Verdict::NotTested, "{}: {}", e.name, c.text);
                }
            }
        }
    }
    assert!(missing.is_empty(), "claims without a row in docs/experiments.md:\n{}", missing.join("\n"));
    let stale: Vec<String> = rows
        .iter()
        .filter(|r| !all.iter().any(|e| e.name == r.experiment && e.claims.iter().any(|c| c.text == r.claim)))
        .map(|r| format!("{}: {}", r.experiment, r.claim))
        .collect();
    assert!(stale.is_empty(), "rows whose claim no file has (renamed?):\n{}", stale.join("\n"));
    let mut counted: BTreeMap<&str, [usize; 5]> = BTreeMap::new();
    for r in &rows {
        let v = verdict_of(&r.verdict).unwrap();
        counted.entry(&r.paper).or_default()[Verdict::ALL.iter().position(|x| *x == v).unwrap()] += 1;
    }
    let table: BTreeMap<&str, [usize; 5]> = counts.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    assert_eq!(table, counted, "the counts per paper are the rows' counts");
}

#[test]
fn the_pins_name_only_simulated_experiments_and_all_their_claims() {
    let all = experiments();
    let pins = Pins::load(&checkout().join("experiments").join(PINS_FILE)).unwrap();
    let problems = pins.problems(&all);
    assert!(problems.is_empty(), "experiments/pins.toml:\n{}", problems.join("\n"));
    assert!(!pins.experiments.is_empty(), "at least one experiment is pinned");
}
