//! Run reports: the JSON schema written by `dtx bench --json`, the terminal table, and the SVG plot.
//!
//! The schema ([`BenchReport`], [`RunReport`], [`LatencyUs`]) is an interface contract: field
//! names are stable. Rendering lives in `table.rs` ([`render_table`]) and `plot.rs`
//! ([`write_plot`], [`render_svg`]); JSON I/O is [`read_json`] / [`write_json`].
//!
//! Conventions the renderers rely on: `abort_rate` is a fraction in `0..=1`, latencies are in
//! microseconds, `throughput_per_s[k]` counts commits in second `k` of the measured period.

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub mod experiment;
mod human;
pub(crate) mod plot;
mod table;

pub use plot::{render_svg, write_plot};
pub use table::render_table;

/// Latency percentiles of committed transactions, in microseconds (client-observed, per attempt chain).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyUs {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// One protocol's run: the object the interface contract of `--json` names. Field names are stable.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub protocol: String,
    pub workload: String,
    pub runtime: String,
    pub nodes: u32,
    pub duration_s: f64,
    pub committed: u64,
    pub aborted: u64,
    pub throughput_tps: f64,
    pub abort_rate: f64,
    pub latency_us: LatencyUs,
    /// latency percentiles per class of transaction, by the class's name (TPC-C: `new-order`,
    /// `payment`, ...; YCSB: `single-node`, `distributed`; bank: `transfer`, `audit`)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_us_by_class: BTreeMap<String, LatencyUs>,
    /// latency percentiles per region of the clients' nodes (with `--latency-matrix`), by the
    /// region's number (`"0"`, `"1"`)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_us_by_region: BTreeMap<String, LatencyUs>,
    /// latency percentiles per region of the clients' nodes and class of transaction (a
    /// multi-home transaction's latency from each region), by region, then class
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_us_by_region_class: BTreeMap<String, BTreeMap<String, LatencyUs>>,
    pub msgs_per_txn: f64,
    pub bytes_per_txn: f64,
    /// abort reason name -> count of aborted attempts
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// every knob of the run, flattened to JSON values
    pub params: BTreeMap<String, serde_json::Value>,
    /// true/false when a checker ran, null when not checked
    pub verified: Option<bool>,
    /// CPU microseconds (user+system) spent per committed transaction, when measured
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_txn: Option<f64>,
    /// `sim`: `cpu_us_per_txn` split by what it paid for (op, message, packet, txn, log,
    /// decode, graph, raft: the simulator's charges, `rt::CpuKind`)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_us_per_txn_by_kind: BTreeMap<String, f64>,
    /// committed transactions in each second of the measured period
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throughput_per_s: Vec<f64>,
    /// committed transactions per second, measured over each 100 ms of the measured period
    /// (the timeline around a failover)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throughput_per_100ms: Vec<f64>,
    /// free-form extra counters (workload-specific, e.g. new_order_tps)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
    /// the protocol's own counters over the measured period (lease renewals, repairs, orphan
    /// queries...), totals over every worker; the table shows them per committed transaction
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// the protocol's gauges: the largest value each reached over the measured period, over
    /// every worker (the largest dependency graph...)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gauges: BTreeMap<String, u64>,
    /// every fault the run injected into real processes (`--runtime tcp`) or into simulated
    /// nodes (`--runtime sim`: its crashes and every `--fault-at` fault), in order
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fault_events: Vec<FaultEvent>,
}

/// One fault injected into a server process (or a simulated node): what, where, when, and how
/// long until the node answered again.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FaultEvent {
    /// `crash` (kill -9, then started again over its data folder), `pause` (SIGSTOP, then
    /// SIGCONT), `partition`, `delay` (what the node sends held longer) or `cpu` (sim: its CPU
    /// costs multiplied)
    pub kind: String,
    pub node: u32,
    /// When it was injected, ms after the run started (warm-up included; virtual time in sim)
    pub at_ms: f64,
    /// How long the process was down or stopped (0 in sim for a fault that lasted until the
    /// window's end)
    pub down_ms: f64,
    /// From the fault to the node's server answering its control connection again (after
    /// recovering from its log, for a crash); null if it did not within the bench's patience,
    /// and in sim
    pub served_again_ms: Option<f64>,
}

/// The whole file written by `--json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchReport {
    pub runs: Vec<RunReport>,
}

/// Reads a report written by [`write_json`] (or `dtx bench --json`).
pub fn read_json(path: impl AsRef<Path>) -> anyhow::Result<BenchReport> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading report {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing report {}", path.display()))
}

/// Writes `report` as pretty-printed JSON (with a trailing newline), creating parent directories.
pub fn write_json(report: &BenchReport, path: impl AsRef<Path>) -> anyhow::Result<()> {
    let path = path.as_ref();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating directory {}", parent.display()))?;
    }
    let mut text = serde_json::to_string_pretty(report).context("serializing report")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing report {}", path.display()))
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A fresh, unique path under the system temp directory (not created).
    pub fn temp_path(tag: &str) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        std::env::temp_dir().join(format!(
            "dtx-report-{tag}-{}-{nanos}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn run(protocol: &str, tps: f64, abort_rate: f64, p50: f64, p99: f64) -> RunReport {
        let duration_s = 10.0;
        let committed = (tps * duration_s) as u64;
        let aborted = (committed as f64 * abort_rate / (1.0 - abort_rate)) as u64;
        let mut params = BTreeMap::new();
        params.insert("warehouses".to_string(), serde_json::json!(8));
        params.insert("seed".to_string(), serde_json::json!(42));
        RunReport {
            protocol: protocol.into(),
            workload: "tpcc".into(),
            runtime: "sim".into(),
            nodes: 3,
            duration_s,
            committed,
            aborted,
            throughput_tps: tps,
            abort_rate,
            latency_us: LatencyUs { p50, p95: (p50 + p99) / 2.0, p99, max: p99 * 3.0 },
            latency_us_by_class: BTreeMap::new(),
            latency_us_by_region: BTreeMap::new(),
            latency_us_by_region_class: BTreeMap::new(),
            msgs_per_txn: 6.0,
            bytes_per_txn: 1229.0,
            aborts_by_reason: BTreeMap::new(),
            params,
            verified: Some(true),
            cpu_us_per_txn: None,
            cpu_us_per_txn_by_kind: BTreeMap::new(),
            throughput_per_s: (0..10)
                .map(|s| tps * (0.9 + 0.02 * s as f64).min(1.02 - 0.01 * (s % 3) as f64))
                .collect(),
            throughput_per_100ms: Vec::new(),
            extra: BTreeMap::new(),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            fault_events: Vec::new(),
        }
    }

    /// Three runs with throughput ratios 1.00x, 0.50x and 1.50x relative to the first.
    pub fn fake_runs() -> Vec<RunReport> {
        let mut a = run("2pc", 123_400.0, 0.021, 812.0, 3_100.0);
        a.aborts_by_reason =
            [("lock-conflict", 80), ("validation", 20)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        a.extra.insert("new_order_tps".into(), 55_100.0);
        let mut b = run("occ", 61_700.0, 0.18, 1_450.0, 9_800.0);
        b.aborts_by_reason = [("validation", 900), ("lock-conflict", 60), ("timeout", 40)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        b.verified = Some(false);
        b.cpu_us_per_txn = Some(42.5);
        let mut c = run("calvin", 185_100.0, 0.0, 2_300.0, 4_100.0);
        c.extra.insert("new_order_tps".into(), 83_000.0);
        c.verified = None;
        vec![a, b, c]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::{fake_runs, temp_path};

    #[test]
    fn json_round_trip() {
        let report = BenchReport { runs: fake_runs() };
        let dir = temp_path("json");
        let path = dir.join("a").join("b").join("report.json");
        write_json(&report, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\n  \"runs\": ["), "not pretty: {}", &text[..40]);
        let back = read_json(&path).unwrap();
        assert_eq!(back, report);
        // Optional fields that are empty/None are skipped on write and defaulted on read.
        let mut bare = report.clone();
        for r in &mut bare.runs {
            r.throughput_per_s.clear();
            r.extra.clear();
            r.cpu_us_per_txn = None;
        }
        write_json(&bare, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("throughput_per_s") && !text.contains("cpu_us_per_txn"));
        assert_eq!(read_json(&path).unwrap(), bare);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(read_json(dir.join("missing.json")).is_err());
    }
}
