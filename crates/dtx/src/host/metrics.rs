//! Per-worker measurements and their merge into a run report.

use crate::txn::{Abort, HistOp};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most history lines one worker keeps in memory (a line is ~100-200 bytes, so ~0.5 GiB).
/// Past it, attempts are counted, not recorded, and `--verify` reports the run as unverifiable
/// rather than checking a history with holes in it.
pub const MAX_HISTORY_LINES: usize = 4_000_000;

impl Metrics {
    /// Keep one history line, unless the history is full.
    pub fn record_history(&mut self, line: HistLine) {
        if self.history.len() < MAX_HISTORY_LINES {
            self.history.push(line);
        } else {
            self.history_dropped += 1;
        }
    }
}

/// The measured window, in the worker's clock (ns).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

/// One line of a `--history` file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistLine {
    pub id: u64,
    pub status: String,
    pub ops: Vec<HistOp>,
    pub start_us: u64,
    pub end_us: u64,
}

/// The timeline's resolution: commits are counted per 100 ms, so that a failover's dip shows.
pub const TICK_NS: u64 = 100_000_000;
/// At most this many ticks are counted (ten hours); commits after them are not in the timeline.
pub const MAX_TICKS: usize = 360_000;

pub struct Metrics {
    pub node: u16,
    pub window: Window,
    pub committed: u64,
    pub aborts: BTreeMap<Abort, u64>,
    /// Latency of committed transactions from first attempt to commit, µs.
    pub latency: Histogram<u64>,
    /// Commits in each tick ([`TICK_NS`]) of the window, for at most [`MAX_TICKS`] ticks.
    pub per_tick: Vec<u64>,
    pub gave_up: u64,
    pub msgs: u64,
    pub bytes: u64,
    /// Commits that waited for the log in the window, and how long in all.
    pub log_waits: u64,
    pub log_wait_ns: u64,
    /// The attempts recorded for the checker (at most [`MAX_HISTORY_LINES`] per worker).
    pub history: Vec<HistLine>,
    /// Attempts not recorded because the history was full: the run cannot be verified.
    pub history_dropped: u64,
    /// Commits in the window per kind of transaction (procedure).
    pub by_kind: BTreeMap<&'static str, u64>,
    /// The protocol's own counters over the window (`rt::Worker::count`).
    pub counters: BTreeMap<&'static str, u64>,
    /// The protocol's gauges' largest values in the window (`rt::Worker::gauge_max`).
    pub gauges: BTreeMap<&'static str, u64>,
    /// The workload's classes of transaction ([`crate::workloads::Workload::txn_classes`]),
    /// and the latency of each class's commits, indexed by class id (made at a class's first
    /// commit, so a commit costs one more record and no allocation).
    pub classes: &'static [&'static str],
    pub class_latency: Vec<Histogram<u64>>,
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

impl Metrics {
    pub fn new(window: Window) -> Self {
        let ticks = window.end_ns.saturating_sub(window.start_ns).div_ceil(TICK_NS).max(1) as usize;
        Metrics {
            node: 0,
            window,
            committed: 0,
            aborts: BTreeMap::new(),
            latency: new_hist(),
            per_tick: vec![0; ticks.min(MAX_TICKS)],
            gave_up: 0,
            msgs: 0,
            bytes: 0,
            log_waits: 0,
            log_wait_ns: 0,
            history: Vec::new(),
            history_dropped: 0,
            by_kind: BTreeMap::new(),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            classes: &[],
            class_latency: Vec::new(),
        }
    }

    fn in_window(&self, t_ns: u64) -> bool {
        t_ns >= self.window.start_ns && t_ns < self.window.end_ns
    }

    /// A commit at `t_ns`; `class` indexes [`Metrics::classes`] (ignored when out of range).
    pub fn commit(&mut self, t_ns: u64, latency_ns: u64, kind: &'static str, class: u8) {
        if self.in_window(t_ns) {
            self.committed += 1;
            *self.by_kind.entry(kind).or_default() += 1;
            let us = (latency_ns / 1000).max(1);
            self.latency.saturating_record(us);
            let class = class as usize;
            if class < self.classes.len() {
                if self.class_latency.len() <= class {
                    self.class_latency.resize_with(class + 1, new_hist);
                }
                self.class_latency[class].saturating_record(us);
            }
            let tick = ((t_ns - self.window.start_ns) / TICK_NS) as usize;
            if let Some(c) = self.per_tick.get_mut(tick) {
                *c += 1;
            }
        }
    }

    pub fn abort(&mut self, t_ns: u64, reason: Abort) {
        if self.in_window(t_ns) {
            *self.aborts.entry(reason).or_default() += 1;
        }
    }

    pub fn aborted(&self) -> u64 {
        self.aborts.values().sum()
    }
}

/// The merge of every worker's metrics, in a form that crosses process boundaries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Totals {
    pub committed: u64,
    pub aborts: BTreeMap<String, u64>,
    pub latency_counts: Vec<(u64, u64)>,
    /// Commits per tick ([`TICK_NS`]) of the window.
    pub per_tick: Vec<u64>,
    pub gave_up: u64,
    pub msgs: u64,
    pub bytes: u64,
    pub cpu_us: u64,
    /// `sim`: the CPU charged over the window by what it paid for (`rt::CpuKind`), ns.
    #[serde(default)]
    pub cpu_by_kind_ns: BTreeMap<String, u64>,
    #[serde(default)]
    pub log_waits: u64,
    #[serde(default)]
    pub log_wait_ns: u64,
    #[serde(default)]
    pub by_kind: BTreeMap<String, u64>,
    /// Checks of the workload's invariants: (condition, passed, detail).
    #[serde(default)]
    pub findings: Vec<(String, bool, String)>,
    /// Nodes rebuilt by another replica of their log (sim, `--durability replicated`), and
    /// how long each crashed node went unserved until then (ms).
    #[serde(default)]
    pub failovers: u64,
    #[serde(default)]
    pub failover_ms: Vec<f64>,
    /// The protocol's own counters, summed over workers.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// The protocol's gauges, the largest value over workers.
    #[serde(default)]
    pub gauges: BTreeMap<String, u64>,
    /// How far the slowest replica's applied watermark trailed the furthest one's as the window
    /// closed (µs; replicas that replay below a leader's watermark: Rolis's).
    #[serde(default)]
    pub replay_lag_us: Option<u64>,
    /// The process's resident memory as the window closed (MiB), where every node runs in it
    /// (`sim`, `local`): a 4-region run's four copies of the data, its logs and its graphs.
    #[serde(default)]
    pub resident_mib: Option<u64>,
    /// The workers' replay-only run after the window, merged (a protocol that measures one:
    /// `silo:replay_only=true`).
    #[serde(default)]
    pub replay: Option<crate::protocols::ReplayRun>,
    /// History lines not recorded because a worker's history was full.
    #[serde(default)]
    pub history_dropped: u64,
    /// Latency counts per node of the clients (for the latency per client region).
    #[serde(default)]
    pub node_latency: BTreeMap<u16, Vec<(u64, u64)>>,
    /// Latency counts (as `latency_counts`) per node of the clients and class of transaction,
    /// by the class's name: merged over nodes, the latency per class (`class_latency`); per
    /// client region, a multi-home transaction's from each region.
    #[serde(default)]
    pub node_class_latency: BTreeMap<u16, BTreeMap<String, Vec<(u64, u64)>>>,
}

impl Totals {
    pub fn add_metrics(&mut self, m: &Metrics) {
        self.committed += m.committed;
        for (r, c) in &m.aborts {
            *self.aborts.entry(r.name().to_string()).or_default() += c;
        }
        for v in m.latency.iter_recorded() {
            self.latency_counts.push((v.value_iterated_to(), v.count_at_value()));
        }
        if !m.latency.is_empty() {
            let node = self.node_latency.entry(m.node).or_default();
            node.extend(m.latency.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())));
        }
        for (name, h) in m.classes.iter().zip(&m.class_latency).filter(|(_, h)| !h.is_empty()) {
            let of_node = self.node_class_latency.entry(m.node).or_default();
            let class = of_node.entry(name.to_string()).or_default();
            class.extend(h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())));
        }
        if self.per_tick.len() < m.per_tick.len() {
            self.per_tick.resize(m.per_tick.len(), 0);
        }
        for (a, b) in self.per_tick.iter_mut().zip(&m.per_tick) {
            *a += b;
        }
        self.gave_up += m.gave_up;
        self.msgs += m.msgs;
        self.bytes += m.bytes;
        self.log_waits += m.log_waits;
        self.log_wait_ns += m.log_wait_ns;
        for (k, c) in &m.by_kind {
            *self.by_kind.entry(k.to_string()).or_default() += c;
        }
        for (k, c) in &m.counters {
            *self.counters.entry(k.to_string()).or_default() += c;
        }
        for (k, g) in &m.gauges {
            let largest = self.gauges.entry(k.to_string()).or_default();
            *largest = (*largest).max(*g);
        }
        self.history_dropped += m.history_dropped;
    }

    pub fn add(&mut self, o: &Totals) {
        self.committed += o.committed;
        for (r, c) in &o.aborts {
            *self.aborts.entry(r.clone()).or_default() += c;
        }
        self.latency_counts.extend_from_slice(&o.latency_counts);
        if self.per_tick.len() < o.per_tick.len() {
            self.per_tick.resize(o.per_tick.len(), 0);
        }
        for (a, b) in self.per_tick.iter_mut().zip(&o.per_tick) {
            *a += b;
        }
        self.gave_up += o.gave_up;
        self.msgs += o.msgs;
        self.bytes += o.bytes;
        self.cpu_us += o.cpu_us;
        for (k, ns) in &o.cpu_by_kind_ns {
            *self.cpu_by_kind_ns.entry(k.clone()).or_default() += ns;
        }
        self.log_waits += o.log_waits;
        self.log_wait_ns += o.log_wait_ns;
        for (k, c) in &o.by_kind {
            *self.by_kind.entry(k.clone()).or_default() += c;
        }
        for (k, c) in &o.counters {
            *self.counters.entry(k.clone()).or_default() += c;
        }
        for (k, g) in &o.gauges {
            let largest = self.gauges.entry(k.clone()).or_default();
            *largest = (*largest).max(*g);
        }
        self.history_dropped += o.history_dropped;
        self.replay = crate::protocols::ReplayRun::merge(self.replay.into_iter().chain(o.replay));
        self.findings.extend_from_slice(&o.findings);
        for (k, v) in &o.node_latency {
            self.node_latency.entry(*k).or_default().extend_from_slice(v);
        }
        for (node, classes) in &o.node_class_latency {
            let of_node = self.node_class_latency.entry(*node).or_default();
            for (class, v) in classes {
                of_node.entry(class.clone()).or_default().extend_from_slice(v);
            }
        }
    }

    /// Latency counts per class of transaction, over every node's clients.
    pub fn class_latency(&self) -> BTreeMap<&str, Vec<(u64, u64)>> {
        let mut merged: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        for (class, counts) in self.node_class_latency.values().flatten() {
            merged.entry(class).or_default().extend_from_slice(counts);
        }
        merged
    }

    pub fn aborted(&self) -> u64 {
        self.aborts.values().sum()
    }

    pub fn histogram(&self) -> Histogram<u64> {
        histogram_of(&self.latency_counts)
    }
}

/// A histogram of latency counts (`(µs, count)`, as [`Totals`] carries them).
pub fn histogram_of<'a>(counts: impl IntoIterator<Item = &'a (u64, u64)>) -> Histogram<u64> {
    let mut h = new_hist();
    for &(v, c) in counts {
        let _ = h.record_n(v.max(1), c);
    }
    h
}

/// The replay lag over replay points (µs on the protocol's clock: replicas' applied
/// watermarks, and where a runtime has them the leaders' releases): how far the lowest trails
/// the highest; `None` without points.
pub fn replay_lag_us(points: &[u64]) -> Option<u64> {
    Some(points.iter().max()? - points.iter().min()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_history_counts_what_it_drops_and_the_totals_say_so() {
        let mut m = Metrics::new(Window { start_ns: 0, end_ns: 1 });
        let line = || HistLine { id: 0, status: String::new(), ops: Vec::new(), start_us: 0, end_us: 0 };
        m.history.resize_with(MAX_HISTORY_LINES - 1, line);
        m.record_history(line());
        m.record_history(line());
        m.record_history(line());
        assert_eq!((m.history.len(), m.history_dropped), (MAX_HISTORY_LINES, 2));
        let mut t = Totals::default();
        t.add_metrics(&m);
        assert_eq!(t.history_dropped, 2);
    }

    #[test]
    fn a_commit_counts_in_its_class_and_its_node() {
        let mut m = Metrics::new(Window { start_ns: 0, end_ns: 1_000_000 });
        m.node = 3;
        m.classes = &["single-node", "distributed"];
        m.commit(10, 5_000, "ycsb", 1);
        m.commit(20, 7_000, "ycsb", 1);
        m.commit(30, 1_000, "ycsb", 0);
        m.commit(40, 1_000, "ycsb", 9); // no such class: counted, not classed
        let mut t = Totals::default();
        t.add_metrics(&m);
        assert_eq!(t.committed, 4);
        assert_eq!(histogram_of(&t.class_latency()["distributed"]).len(), 2);
        assert_eq!(histogram_of(&t.class_latency()["single-node"]).len(), 1);
        assert_eq!(histogram_of(&t.node_latency[&3]).len(), 4);
        assert_eq!(histogram_of(&t.node_class_latency[&3]["distributed"]).len(), 2);
        let mut sum = Totals::default();
        sum.add(&t);
        sum.add(&t);
        assert_eq!(histogram_of(&sum.node_class_latency[&3]["single-node"]).len(), 2);
    }
}
