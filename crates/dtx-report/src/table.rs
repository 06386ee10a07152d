//! The fixed-width terminal table printed after `dtx bench`.

use crate::{human, RunReport};
use std::collections::BTreeSet;

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Left,
    Right,
}

struct Column {
    header: String,
    align: Align,
    cells: Vec<String>,
}

impl Column {
    fn new(header: impl Into<String>, align: Align, cells: Vec<String>) -> Self {
        Column { header: header.into(), align, cells }
    }

    fn width(&self) -> usize {
        self.cells
            .iter()
            .map(|c| c.chars().count())
            .chain(std::iter::once(self.header.chars().count()))
            .max()
            .unwrap_or(0)
    }
}

/// Renders one row per run as a fixed-width table, preceded by one context line
/// (workload, runtime, nodes, duration). The ratio column is relative to the first run's
/// throughput. A `verified` column appears when any run was checked, and one column per
/// `extra` counter key present in any run. `abort_rate` is read as a fraction in `0..=1`.
///
/// The result ends with a newline and contains no trailing spaces.
pub fn render_table(runs: &[RunReport]) -> String {
    if runs.is_empty() {
        return "(no runs)\n".to_string();
    }
    let base_tps = runs[0].throughput_tps;
    let col = |header: &str, align: Align, f: &dyn Fn(&RunReport) -> String| {
        Column::new(header, align, runs.iter().map(f).collect())
    };

    let mut columns = vec![
        col("protocol", Align::Left, &|r| r.protocol.clone()),
        col("committed/s", Align::Right, &|r| human::count(r.throughput_tps)),
        col("ratio", Align::Right, &|r| {
            if base_tps > 0.0 && base_tps.is_finite() && r.throughput_tps.is_finite() {
                format!("{:.2}x", r.throughput_tps / base_tps)
            } else {
                "-".into()
            }
        }),
        col("abort%", Align::Right, &|r| human::percent(r.abort_rate)),
        col("p50", Align::Right, &|r| human::latency_us(r.latency_us.p50)),
        col("p95", Align::Right, &|r| human::latency_us(r.latency_us.p95)),
        col("p99", Align::Right, &|r| human::latency_us(r.latency_us.p99)),
        col("msgs/txn", Align::Right, &|r| {
            if r.msgs_per_txn.is_finite() {
                format!("{:.1}", r.msgs_per_txn)
            } else {
                "-".into()
            }
        }),
        col("bytes/txn", Align::Right, &|r| human::bytes(r.bytes_per_txn)),
    ];
    // Which copies ran, when any run kept more than one (a protocol's default placement can
    // differ from another's in the same run: `dtx bench --protocol occ,detock --regions 0,1`).
    let placement = |r: &RunReport| r.params.get("placement").and_then(|p| p.as_str()).unwrap_or("single").to_string();
    if runs.iter().any(|r| placement(r) != "single") {
        columns.insert(1, col("placement", Align::Left, &placement));
    }
    if runs.iter().any(|r| r.cpu_us_per_txn.is_some()) {
        columns.push(col("cpu/txn", Align::Right, &|r| {
            r.cpu_us_per_txn.map(human::latency_us).unwrap_or_else(|| "-".into())
        }));
    }
    if runs.iter().any(|r| r.verified.is_some()) {
        columns.push(col("verified", Align::Left, &|r| {
            match r.verified {
                Some(true) => "ok",
                Some(false) => "FAIL",
                None => "-",
            }
            .into()
        }));
    }
    let extra_keys: BTreeSet<&str> = runs.iter().flat_map(|r| r.extra.keys().map(String::as_str)).collect();
    for key in extra_keys {
        let is_rate = human::extra_is_rate(key);
        columns.push(col(&human::extra_header(key), Align::Right, &|r| match r.extra.get(key) {
            Some(v) if is_rate => human::count(*v),
            Some(v) => human::generic(*v),
            None => "-".into(),
        }));
    }
    columns.push(col("top aborts", Align::Left, &top_aborts));

    let widths: Vec<usize> = columns.iter().map(Column::width).collect();
    let mut out = context_line(runs);
    out.push('\n');
    let row = |cells: &mut dyn Iterator<Item = (&str, Align)>| -> String {
        let line: Vec<String> = cells
            .zip(&widths)
            .map(|((text, align), &w)| match align {
                Align::Left => format!("{text:<w$}"),
                Align::Right => format!("{text:>w$}"),
            })
            .collect();
        let mut line = line.join("  ");
        line.truncate(line.trim_end().len());
        line.push('\n');
        line
    };
    out += &row(&mut columns.iter().map(|c| (c.header.as_str(), c.align)));
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    out += &row(&mut rule.iter().map(|s| (s.as_str(), Align::Left)));
    for i in 0..runs.len() {
        out += &row(&mut columns.iter().map(|c| (c.cells[i].as_str(), c.align)));
    }
    out += &counter_lines(runs, widths[0]);
    out += &gauge_lines(runs, widths[0]);
    out += &cpu_split_lines(runs, widths[0]);
    out
}

/// A section of one line per run: `title`, then each run's protocol and the cells `cells_of`
/// gives it, for the runs that have any; nothing when none has.
fn run_lines(
    runs: &[RunReport],
    name_width: usize,
    title: &str,
    cells_of: impl Fn(&RunReport) -> Vec<String>,
) -> String {
    let mut out = String::new();
    for r in runs {
        let cells = cells_of(r);
        if !cells.is_empty() {
            out += &format!("{:<name_width$}  {}\n", r.protocol, cells.join(", "));
        }
    }
    match out.is_empty() {
        true => out,
        false => format!("{title}\n{out}"),
    }
}

/// `sim`'s CPU per committed transaction by what it paid for, largest first, one line per run
/// that has it: where each protocol spends.
fn cpu_split_lines(runs: &[RunReport], name_width: usize) -> String {
    run_lines(runs, name_width, "simulated CPU per committed transaction, by kind:", |r| {
        let mut kinds: Vec<(&String, &f64)> = r.cpu_us_per_txn_by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.total_cmp(a.1));
        kinds.iter().map(|(k, us)| format!("{k} {us:.2}µs")).collect()
    })
}

/// A per-transaction rate with three significant digits, however small (a rare event is
/// 0.000312, not 0.000).
fn per_txn(v: f64) -> String {
    if v == 0.0 || v >= 1.0 {
        return format!("{v:.2}");
    }
    let decimals = (2 - v.log10().floor() as i32).clamp(2, 9) as usize;
    format!("{v:.decimals$}")
}

/// The protocols' own counters, per committed transaction, one line per run that has any.
fn counter_lines(runs: &[RunReport], name_width: usize) -> String {
    run_lines(runs, name_width, "protocol counters, per committed transaction:", |r| {
        let per = |n: u64| if r.committed > 0 { n as f64 / r.committed as f64 } else { 0.0 };
        r.counters.iter().map(|(k, n)| format!("{k} {}", per_txn(per(*n)))).collect()
    })
}

/// The protocols' gauges, their largest values, one line per run that has any.
fn gauge_lines(runs: &[RunReport], name_width: usize) -> String {
    run_lines(runs, name_width, "protocol gauges, the largest value over the window:", |r| {
        r.gauges.iter().map(|(k, n)| format!("{k} {n}")).collect()
    })
}

/// `lock-conflict 80%, validation 20%`: the two most frequent abort reasons with their share of
/// all counted aborts; `-` when there were none.
fn top_aborts(r: &RunReport) -> String {
    let total: u64 = r.aborts_by_reason.values().sum();
    if total == 0 {
        return "-".into();
    }
    let mut reasons: Vec<(&String, &u64)> = r.aborts_by_reason.iter().filter(|(_, &n)| n > 0).collect();
    // Most frequent first; ties by name (BTreeMap order, kept by the stable sort).
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    reasons
        .iter()
        .take(2)
        .map(|(name, &n)| format!("{name} {}", human::share(n as f64 / total as f64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `workload: tpcc  runtime: sim  nodes: 3  duration: 10.0s`. Values that differ between runs are
/// listed, separated by `/`.
pub(crate) fn context_line(runs: &[RunReport]) -> String {
    let c = Context::of(runs);
    let workers = if c.workers == "-" { String::new() } else { format!("  workers/node: {}", c.workers) };
    format!("workload: {}  runtime: {}  nodes: {}{workers}  duration: {}", c.workload, c.runtime, c.nodes, c.duration)
}

/// The run-wide context shared by the table header and the plot title.
pub(crate) struct Context {
    pub workload: String,
    pub runtime: String,
    pub nodes: String,
    /// Worker threads per node (from the runs' `workers` parameter; `-` when not given).
    pub workers: String,
    pub duration: String,
}

impl Context {
    pub fn of(runs: &[RunReport]) -> Self {
        let durations: Vec<f64> = runs.iter().map(|r| r.duration_s).filter(|d| d.is_finite()).collect();
        let duration = match (durations.iter().cloned().reduce(f64::min), durations.iter().cloned().reduce(f64::max)) {
            (Some(lo), Some(hi)) if format!("{lo:.1}") == format!("{hi:.1}") => {
                format!("{lo:.1}s")
            }
            (Some(lo), Some(hi)) => format!("{lo:.1}-{hi:.1}s"),
            _ => "-".into(),
        };
        Context {
            workload: distinct(runs.iter().map(|r| r.workload.clone())),
            runtime: distinct(runs.iter().map(|r| r.runtime.clone())),
            nodes: distinct(runs.iter().map(|r| r.nodes.to_string())),
            workers: distinct(runs.iter().filter_map(|r| r.params.get("workers").map(|w| w.to_string()))),
            duration,
        }
    }
}

/// Distinct values in first-seen order, joined by `/`; `-` when empty.
fn distinct(values: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for v in values {
        let v = if v.is_empty() { "-".to_string() } else { v };
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    if seen.is_empty() {
        "-".into()
    } else {
        seen.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fake_runs;

    #[test]
    fn small_counter_rates_keep_their_digits() {
        assert_eq!(super::per_txn(0.0), "0.00");
        assert_eq!(super::per_txn(0.165), "0.165");
        assert_eq!(super::per_txn(0.000312), "0.000312");
        assert_eq!(super::per_txn(2.5), "2.50");
    }

    #[test]
    fn table_has_every_protocol_and_ratio() {
        let runs = fake_runs();
        let t = render_table(&runs);
        println!("{t}");
        for r in &runs {
            assert!(t.contains(&r.protocol), "missing {}", r.protocol);
        }
        for ratio in ["1.00x", "0.50x", "1.50x"] {
            assert!(t.contains(ratio), "missing ratio {ratio}");
        }
        assert!(t.starts_with("workload: tpcc  runtime: sim  nodes: 3  duration: 10.0s\n"));
        assert!(t.contains("lock-conflict 80%, validation 20%"));
        assert!(t.contains("verified"));
        assert!(t.contains("FAIL"));
        assert!(t.contains("NewOrder/s"));
        assert!(t.contains("123.4k"));
        assert!(t.contains("µs") && t.contains("ms"));
        // Fixed width: every table line (header, rule, rows) lines up in its first columns.
        let lines: Vec<&str> = t.lines().skip(1).collect();
        assert_eq!(lines.len(), 2 + runs.len());
        let ratio_end = |l: &str| l.chars().take_while(|c| *c != 'x').count();
        let rows: Vec<usize> = lines[2..].iter().map(|l| ratio_end(l)).collect();
        assert!(rows.windows(2).all(|w| w[0] == w[1]), "{rows:?}");
        assert!(t.lines().all(|l| l == l.trim_end()));
    }

    /// Gauges print as they are (a largest value, not a rate), only for runs that have any.
    #[test]
    fn gauges_print_their_largest_values() {
        let mut runs = fake_runs();
        assert!(!render_table(&runs).contains("protocol gauges"));
        runs[1].gauges.insert("detock-graph-vertices-max".into(), 159);
        let t = render_table(&runs);
        let line = t.lines().find(|l| l.contains("detock-graph-vertices-max")).expect("a gauge line");
        assert!(t.contains("protocol gauges, the largest value over the window:"), "{t}");
        assert!(line.starts_with(&runs[1].protocol) && line.ends_with("detock-graph-vertices-max 159"), "{line}");
    }

    /// The simulator's CPU split prints largest first, only for runs that have one.
    #[test]
    fn the_cpu_split_prints_largest_first() {
        let mut runs = fake_runs();
        assert!(!render_table(&runs).contains("by kind"));
        runs[0].cpu_us_per_txn_by_kind = [("op".to_string(), 1.5), ("message".to_string(), 4.25)].into();
        let t = render_table(&runs);
        let line = t.lines().find(|l| l.contains("message 4.25µs")).expect("a split line");
        assert!(t.contains("simulated CPU per committed transaction, by kind:"), "{t}");
        assert!(line.starts_with(&runs[0].protocol) && line.ends_with("message 4.25µs, op 1.50µs"), "{line}");
    }

    #[test]
    fn optional_columns_hidden_and_empty_input() {
        let mut runs = fake_runs();
        for r in &mut runs {
            r.verified = None;
            r.extra.clear();
            r.cpu_us_per_txn = None;
        }
        let t = render_table(&runs);
        assert!(!t.contains("verified"));
        assert!(!t.contains("NewOrder/s"));
        assert!(!t.contains("cpu/txn"));
        assert_eq!(render_table(&[]), "(no runs)\n");
    }

    #[test]
    fn zero_base_throughput_and_no_aborts() {
        let mut runs = fake_runs();
        runs[0].throughput_tps = 0.0;
        runs[1].aborts_by_reason.clear();
        let t = render_table(&runs);
        assert!(!t.contains("inf"));
        assert!(!t.contains("NaN"));
    }

    #[test]
    fn mixed_context() {
        let mut runs = fake_runs();
        runs[1].nodes = 5;
        runs[2].duration_s = 12.0;
        let line = context_line(&runs);
        assert_eq!(line, "workload: tpcc  runtime: sim  nodes: 3/5  duration: 10.0-12.0s");
    }
}
