//! `dtx bench`: runs each protocol variant's specification on a runtime (through
//! [`crate::host`], which builds and runs the cluster), then checks and reports it the same way
//! whatever the runtime: the history written and checked, the report the JSON contract names.

use crate::host::{metrics, tcp, BenchSpec, Outcome};

use anyhow::Context;
use dtx_report::{LatencyUs, RunReport};
use metrics::{HistLine, TICK_NS};
use std::collections::BTreeMap;

/// Write a run's list-append history as JSON lines, in start order, the final read last.
pub fn write_history(o: &Outcome, path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let f = std::fs::File::create(path).with_context(|| format!("cannot write history {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    let mut lines: Vec<&HistLine> = o.history.iter().collect();
    lines.sort_by_key(|l| (l.start_us, l.id));
    for l in lines {
        serde_json::to_writer(&mut w, l)?;
        w.write_all(b"\n")?;
    }
    if let Some(Ok(l)) = &o.final_read {
        serde_json::to_writer(&mut w, l)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

/// Write the history and check it against what the protocol promises (serializable, or
/// strictly: in real-time order too), and that the final read-all committed (so every
/// acknowledged append can be looked for). Returns the checker's report and a problem, if any.
pub fn verify(
    o: &Outcome,
    path: &std::path::Path,
    guarantee: crate::protocols::Guarantee,
) -> anyhow::Result<(dtx_check::CheckReport, Option<String>)> {
    write_history(o, path)?;
    let report = match guarantee {
        crate::protocols::Guarantee::Serializable => dtx_check::check_file(path)?,
        crate::protocols::Guarantee::StrictSerializable => dtx_check::check_file_realtime(path)?,
    };
    let failed_finding = o.totals.findings.iter().find(|f| !f.1);
    let problem = match &o.final_read {
        _ if failed_finding.is_some() => failed_finding.map(|(what, _, detail)| format!("{what}: {detail}")),
        _ if o.totals.history_dropped > 0 => Some(format!(
            "the history is incomplete: {} attempts were not recorded (a worker keeps at most {} lines); \
             verify a shorter run or one with fewer transactions in flight",
            o.totals.history_dropped,
            metrics::MAX_HISTORY_LINES
        )),
        Some(Ok(_)) if report.valid => None,
        Some(Ok(_)) => Some(report.summary()),
        Some(Err(e)) => Some(e.clone()),
        None => Some("the final read-all transaction did not finish".to_string()),
    };
    Ok((report, problem))
}

/// Turn an outcome into the report the interface contract describes.
pub fn report(spec: &BenchSpec, o: &Outcome, verified: Option<bool>) -> RunReport {
    let t = &o.totals;
    let h = t.histogram();
    let secs = spec.duration_us as f64 / 1e6;
    let attempts = t.committed + t.aborted();
    let per = |x: u64| {
        if t.committed > 0 {
            x as f64 / t.committed as f64
        } else {
            0.0
        }
    };
    let params = spec_params(spec);
    let extra = extra_figures(spec, o);
    RunReport {
        protocol: spec.protocol.clone(),
        workload: spec.workload.name.clone(),
        runtime: spec.runtime.to_string(),
        nodes: spec.nodes as u32,
        duration_s: secs,
        committed: t.committed,
        aborted: t.aborted(),
        throughput_tps: t.committed as f64 / secs,
        abort_rate: if attempts > 0 { t.aborted() as f64 / attempts as f64 } else { 0.0 },
        latency_us: percentiles(&h),
        latency_us_by_class: t
            .class_latency()
            .iter()
            .map(|(class, counts)| (class.to_string(), percentiles(&metrics::histogram_of(counts))))
            .collect(),
        latency_us_by_region: by_region(spec, t),
        latency_us_by_region_class: by_region_class(spec, t),
        msgs_per_txn: per(t.msgs),
        bytes_per_txn: per(t.bytes),
        aborts_by_reason: t.aborts.clone(),
        params,
        verified,
        cpu_us_per_txn: (t.cpu_us > 0 && t.committed > 0).then(|| t.cpu_us as f64 / t.committed as f64),
        cpu_us_per_txn_by_kind: match t.committed {
            0 => BTreeMap::new(),
            n => t.cpu_by_kind_ns.iter().map(|(k, ns)| (k.clone(), *ns as f64 / 1000.0 / n as f64)).collect(),
        },
        throughput_per_s: per_second(&t.per_tick),
        throughput_per_100ms: t.per_tick.iter().map(|c| *c as f64 * (1e9 / TICK_NS as f64)).collect(),
        extra,
        // The open loop's arrivals are the run's load, not the protocol's work: they are in
        // `extra` (offered_tps, backlog), not among the counters per transaction.
        counters: t
            .counters
            .iter()
            .filter(|(k, _)| !k.starts_with("arrivals-"))
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        gauges: t.gauges.clone(),
        fault_events: o.fault_events.clone(),
    }
}

/// The run's parameters, flattened to `section.field` (the placement as the flag names it).
fn spec_params(spec: &BenchSpec) -> BTreeMap<String, serde_json::Value> {
    let mut params = BTreeMap::new();
    if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(spec) {
        for (k, v) in m {
            match v {
                serde_json::Value::Object(inner) => {
                    for (k2, v2) in inner {
                        params.insert(format!("{k}.{k2}"), v2);
                    }
                }
                v => {
                    params.insert(k, v);
                }
            }
        }
    }
    // Named as the flag names it (`per-region`, `groups=3`), which the table shows.
    params.retain(|k, _| !k.starts_with("placement."));
    params.insert("placement".into(), spec.placement.to_string().into());
    params
}

/// The figures only some runs have: TPC-C's new orders, the open loop's load, the log's waits,
/// replay, memory, failovers and the time a faulted server took to answer again.
fn extra_figures(spec: &BenchSpec, o: &Outcome) -> BTreeMap<String, f64> {
    let t = &o.totals;
    let secs = spec.duration_us as f64 / 1e6;
    let per = |x: u64| if t.committed > 0 { x as f64 / t.committed as f64 } else { 0.0 };
    let mut extra = BTreeMap::new();
    if let Some(n) = t.by_kind.get("new-order") {
        extra.insert("new_order_tps".to_string(), *n as f64 / secs);
    }
    if t.gave_up > 0 {
        extra.insert("gave_up".to_string(), t.gave_up as f64);
    }
    if spec.rate_per_node > 0.0 {
        // The open loop's load: what arrived in the window, and what still waited for a client
        // as it closed (a backlog: the run could not keep up with the rate).
        let offered = t.counters.get("arrivals-offered").copied().unwrap_or(0);
        extra.insert("offered_tps".to_string(), offered as f64 / secs);
        extra.insert("backlog".to_string(), t.counters.get("arrivals-backlog").copied().unwrap_or(0) as f64);
    }
    if t.log_waits > 0 {
        // The latency breakdown durability asks for: how long a commit waited for its log
        // record (group commit delay + fsync), beside the end-to-end percentiles.
        extra.insert("log_wait_us_mean".to_string(), t.log_wait_ns as f64 / t.log_waits as f64 / 1000.0);
        extra.insert("log_waits_per_txn".to_string(), per(t.log_waits));
    }
    if let Some(us) = t.replay_lag_us {
        extra.insert("replay_lag_ms".to_string(), us as f64 / 1000.0);
    }
    if let Some(mib) = t.resident_mib {
        extra.insert("memory_mib".to_string(), mib as f64);
    }
    if let Some(r) = t.replay {
        // Rolis's Fig. 15: replay alone against the execution that logged what it replays.
        extra.insert("replay_txns".to_string(), r.txns as f64);
        if let Some(rate) = r.per_s() {
            extra.insert("replay_per_s".to_string(), rate);
        }
    }
    if t.failovers > 0 {
        extra.insert("failovers".to_string(), t.failovers as f64);
    }
    if !t.failover_ms.is_empty() {
        // From a host's crash to its node served again by a replica of its log: the election
        // timeout (10-20 ticks of 10 ms), the new leader's first commit, and the rebuild.
        let mut ms = t.failover_ms.clone();
        ms.sort_by(f64::total_cmp);
        extra.insert("failover_ms_p50".to_string(), ms[ms.len() / 2]);
        extra.insert("failover_ms_max".to_string(), ms[ms.len() - 1]);
    }
    let back = tcp::served_again_sorted(&o.fault_events);
    if !back.is_empty() {
        // Issue 20's figure: from a fault (kill -9, SIGSTOP) to the server answering again.
        extra.insert("served_again_ms_p50".to_string(), back[back.len() / 2]);
        extra.insert("served_again_ms_max".to_string(), back[back.len() - 1]);
    }
    extra
}

fn percentiles(h: &hdrhistogram::Histogram<u64>) -> LatencyUs {
    LatencyUs {
        p50: h.value_at_quantile(0.50) as f64,
        p95: h.value_at_quantile(0.95) as f64,
        p99: h.value_at_quantile(0.99) as f64,
        max: h.max() as f64,
    }
}

/// Latency per region of the clients' nodes, when the run places nodes in regions.
fn by_region(spec: &BenchSpec, t: &metrics::Totals) -> BTreeMap<String, LatencyUs> {
    let regions = &spec.latency.node_region;
    if regions.is_empty() {
        return Default::default();
    }
    let mut counts: BTreeMap<u16, Vec<(u64, u64)>> = Default::default();
    for (node, c) in &t.node_latency {
        counts.entry(region_of(regions, *node)).or_default().extend_from_slice(c);
    }
    counts.iter().map(|(r, c)| (r.to_string(), percentiles(&metrics::histogram_of(c)))).collect()
}

/// The region of a client's node (`--regions`; region 0 for a node past the list).
fn region_of(regions: &[u16], node: u16) -> u16 {
    regions.get(node as usize).copied().unwrap_or(0)
}

/// Latency per region of the clients' nodes and class of transaction, when the run places
/// nodes in regions.
fn by_region_class(spec: &BenchSpec, t: &metrics::Totals) -> BTreeMap<String, BTreeMap<String, LatencyUs>> {
    let regions = &spec.latency.node_region;
    if regions.is_empty() {
        return Default::default();
    }
    let mut counts: BTreeMap<(u16, &str), Vec<(u64, u64)>> = Default::default();
    for (node, classes) in &t.node_class_latency {
        for (class, c) in classes {
            counts.entry((region_of(regions, *node), class)).or_default().extend_from_slice(c);
        }
    }
    let mut by: BTreeMap<String, BTreeMap<String, LatencyUs>> = BTreeMap::new();
    for ((region, class), c) in counts {
        by.entry(region.to_string()).or_default().insert(class.to_string(), percentiles(&metrics::histogram_of(&c)));
    }
    by
}

/// Commits in each second of the window, from the counts per tick.
fn per_second(per_tick: &[u64]) -> Vec<f64> {
    let ticks_per_s = (1_000_000_000 / TICK_NS) as usize;
    per_tick.chunks(ticks_per_s).map(|c| c.iter().sum::<u64>() as f64).collect()
}
