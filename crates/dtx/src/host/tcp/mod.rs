//! The tcp runtime end to end: `dtx server` (one process per node) and the bench that drives a
//! cluster of them, either one it starts on 127.0.0.1 or one named by `--cluster`.
//!
//! Control protocol (one JSON object per line, on the node's control address):
//! `{"cmd":"ping"}`, `{"cmd":"prepare","spec":{...}}` (load data, start worker threads, open
//! the worker ports), `{"cmd":"start"}` (begin warm-up and measurement now), `{"cmd":"wait"}`
//! (block until this node's clients finished; returns its totals and history),
//! `{"cmd":"final_read"}` (node 0: run the read-all transaction), `{"cmd":"stop"}`,
//! `{"cmd":"shutdown"}`. Every reply is `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a bad
//! request gets an error reply and the connection stays usable.
//!
//! Its jobs, one file each: [`server`] (a node's process and its control requests), [`control`]
//! (the bench's side of a control connection, and how long each request may take),
//! [`processes`] (the servers the bench starts, and the nemesis that crashes, pauses, cuts and
//! delays them), and here the bench's run: start, wait, gather, the after-run jobs, the report.

mod control;
mod processes;
mod server;

pub use processes::free_base_port;
pub use server::serve;

use control::*;
use processes::*;

// What this file and its three parts use (they take it with `use super::*`).
use super::driver::{self, RunShared, Window};
use super::metrics::{HistLine, Totals};
use super::netns;
use super::tcp_host::{Hosting, Takeover};
use super::{build_node, BenchSpec, Outcome, Run};
use crate::cluster::ClusterConfig;
use crate::replication::Durability;
use anyhow::{bail, Context};
use dtx_report::FaultEvent;
use parking_lot::Mutex;
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Count the takeovers of the run and time each: from the last fault the nemesis injected
/// before it (a kill, or a SIGSTOP that stalled the log's leader), or without a nemesis from when
/// the bench lost the node's server (its control connection broke), to when the new host served
/// the node.
fn time_takeovers(
    takeovers: &[Takeover],
    lost_unix_ms: &[Option<u64>],
    events: &[FaultEvent],
    t0_unix_ms: u64,
    totals: &mut Totals,
) {
    let faults: Vec<u64> = events.iter().map(|e| t0_unix_ms + e.at_ms as u64).collect();
    for t in takeovers {
        totals.failovers += 1;
        let last_fault = faults.iter().copied().filter(|&k| k <= t.serving_unix_ms).max();
        let lost = last_fault.or_else(|| lost_unix_ms.get(t.node as usize).copied().flatten());
        if let Some(lost) = lost {
            totals.failover_ms.push(t.serving_unix_ms.saturating_sub(lost) as f64);
        }
    }
}

/// A killed server's totals die with it, but every attempt its clients made is in its history
/// file: count the window's commits (and aborts, under a reason of their own) from the merged
/// history, and the commits per 100 ms for the timeline. Latency percentiles stay those of the
/// incarnations that lived to the end.
fn count_killed_incarnations(history: &[HistLine], (start_us, end_us): (u64, u64), totals: &mut Totals) -> Vec<String> {
    use super::metrics::{MAX_TICKS, TICK_NS};
    let in_window = |l: &&HistLine| l.end_us >= start_us && l.end_us < end_us;
    let committed: Vec<&HistLine> = history.iter().filter(in_window).filter(|l| l.status == "committed").collect();
    let aborted = history.iter().filter(in_window).filter(|l| l.status == "aborted").count() as u64;
    let counted_commits = totals.committed;
    let counted_aborts: u64 = totals.aborts.values().sum();
    if committed.len() as u64 <= counted_commits {
        return Vec::new();
    }
    totals.committed = committed.len() as u64;
    if aborted > counted_aborts {
        *totals.aborts.entry("in-killed-incarnations".to_string()).or_default() += aborted - counted_aborts;
    }
    let ticks = (((end_us - start_us) * 1000).div_ceil(TICK_NS) as usize).min(MAX_TICKS);
    totals.per_tick = vec![0; ticks];
    for l in &committed {
        if let Some(t) = totals.per_tick.get_mut(((l.end_us - start_us) * 1000 / TICK_NS) as usize) {
            *t += 1;
        }
    }
    vec![format!(
        "faults: commits counted from the history files, which killed incarnations wrote too: {} in the window \
         ({counted_commits} counted by the incarnations alive at the end); latency percentiles are theirs alone",
        committed.len()
    )]
}

/// Run one protocol's benchmark on a tcp cluster (started here unless `cluster` names one).
pub fn run(spec: &BenchSpec, cluster: Option<&Path>) -> anyhow::Result<Outcome> {
    let (cfg, spawned) = match cluster {
        Some(_) if spec.faults.any() => {
            bail!("--faults on tcp act on servers the bench started itself: leave out --cluster")
        }
        Some(p) => (ClusterConfig::load(p)?, None),
        None => {
            let (c, s) = spawn_cluster(spec)?;
            (c, Some(s))
        }
    };
    // Whatever way this run ends (an error while the fault thread still holds the servers
    // included), no server it started outlives it.
    let _reaper = spawned.as_ref().map(|s| Reaper(s.children.clone()));
    let mut spec = spec.clone();
    spec.nodes = cfg.nodes.len() as u16;
    spec.workers = cfg.workers;
    spec.partitions_per_node = cfg.partitions_per_node;
    if cluster.is_some() {
        // The cluster file says what each node does (every node `data` and `client` unless it
        // gives `roles`) and how many workers it runs in all.
        spec.node_roles = cfg.node_roles();
        // And where each node is: a placement per region and the logs' voters follow it.
        if spec.latency.node_region.is_empty() && cfg.nodes.iter().any(|n| n.region > 0) {
            spec.latency.node_region = cfg.nodes.iter().map(|n| n.region).collect();
        }
        // The servers build the run; this checks here, naming the file, that the protocol takes it.
        let path = cluster.map(|p| p.display().to_string()).unwrap_or_default();
        crate::host::Run::build(&spec).with_context(|| format!("the cluster in {path}"))?;
    }
    let mut ctl: Vec<Control> = cfg
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Control::connect(i, n.addr, Duration::from_secs(15)))
        .collect::<anyhow::Result<_>>()?;
    for c in &mut ctl {
        c.call(&json!({"cmd": "prepare", "spec": spec}))?;
    }
    // The measured window on the history's clock (the system clock: the servers time their
    // attempts with it), to count the commits of incarnations that were killed.
    let window_start_us = crate::rt::system_us() + spec.warmup_us;
    let window_sys_us = (window_start_us, window_start_us + spec.duration_us);
    for c in &mut ctl {
        c.call(&json!({"cmd": "start"}))?;
    }
    let t0 = Instant::now();
    let addrs: Vec<SocketAddr> = cfg.nodes.iter().map(|n| n.addr).collect();
    let nemesis = spawned.map(|s| if spec.faults.any() { Err(s.nemesis(&spec, addrs.clone(), t0)) } else { Ok(s) });
    let total_ms = (spec.warmup_us + spec.duration_us) / 1000;
    let pb = super::progress(&format!("{} tcp", spec.protocol), total_ms);
    let wait_deadline = t0 + Duration::from_millis(total_ms) + CLIENTS_PATIENCE + ANSWER_MARGIN;
    let waits: Vec<_> = ctl
        .into_iter()
        .map(|c| {
            let addr = addrs[c.node];
            std::thread::spawn(move || wait_surviving_restarts(c, addr, wait_deadline))
        })
        .collect();
    while waits.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        pb.set_position((t0.elapsed().as_millis() as u64).min(total_ms));
    }
    pb.finish_and_clear();
    let Gathered { mut totals, history, mut notes, mut ctl, serving, lost, takeovers, replay_points_us: points } =
        gather(waits, addrs.len())?;
    totals.replay_lag_us = super::metrics::replay_lag_us(&points);
    let t0_unix_ms = super::tcp_host::unix_ms().saturating_sub(t0.elapsed().as_millis() as u64);
    if lost.iter().any(|l| l.is_some()) && spec.record_history {
        notes.extend(count_killed_incarnations(&history, window_sys_us, &mut totals));
    }
    // The last fault may end after a server's own window did (each times it from its start):
    // let it end, and reach again any server it restarted, before the after-run jobs.
    let (spawned, fault_events) = match nemesis {
        Some(Err(k)) => {
            let n = k.join().map_err(|_| anyhow::anyhow!("the fault thread panicked"))?;
            (Some(n.spawned), n.events)
        }
        Some(Ok(s)) => (Some(s), Vec::new()),
        None => (None, Vec::new()),
    };
    if !fault_events.is_empty() {
        reach_restarted(&mut ctl, &addrs)?;
    }
    let final_read = after_run_jobs(&spec, &mut ctl, &serving, &mut totals)?;
    time_takeovers(&takeovers, &lost, &fault_events, t0_unix_ms, &mut totals);
    for c in &mut ctl {
        c.call(&json!({"cmd": "stop"}))?;
        if spawned.is_some() {
            let _ = c.call(&json!({"cmd": "shutdown"}));
        }
    }
    drop(spawned);
    let restarts = lost.iter().filter(|l| l.is_some()).count() as u64;
    notes.extend(fault_notes(&totals, &takeovers, &fault_events));
    Ok(Outcome { totals, history, final_read, notes, restarts, moved: 0, fault_events, failed: None })
}

/// What the servers reported at the end of a run, gathered.
struct Gathered {
    totals: Totals,
    history: Vec<HistLine>,
    notes: Vec<String>,
    ctl: Vec<Control>,
    /// Per server: whether it serves a node now.
    serving: Vec<bool>,
    /// Per node: when its server was lost (Unix ms), if it was.
    lost: Vec<Option<u64>>,
    takeovers: Vec<Takeover>,
    /// Every server's replay points as the window closed ([`WaitReply::replay_points_us`]).
    replay_points_us: Vec<u64>,
}

/// Join every server's wait and add up what each reported.
fn gather(waits: Vec<std::thread::JoinHandle<anyhow::Result<Waited>>>, nodes: usize) -> anyhow::Result<Gathered> {
    let mut g = Gathered {
        totals: Totals::default(),
        history: Vec::new(),
        notes: Vec::new(),
        ctl: Vec::new(),
        serving: Vec::new(),
        lost: vec![None; nodes],
        takeovers: Vec::new(),
        replay_points_us: Vec::new(),
    };
    for w in waits {
        let (c, reply, lost_unix_ms) = w.join().map_err(|_| anyhow::anyhow!("control thread panicked"))??;
        g.totals.add(&reply.totals);
        g.history.extend(reply.history);
        if reply.stuck_workers > 0 {
            g.notes.push(format!("node {}: some clients were still running 120 s after the window closed", c.node));
        }
        g.takeovers.extend(reply.takeovers);
        g.replay_points_us.extend(reply.replay_points_us);
        g.lost[c.node] = lost_unix_ms;
        g.serving.push(reply.serves);
        g.ctl.push(c);
    }
    Ok(g)
}

/// What this process's log replicas did, into the totals it reports.
fn add_replica_counters(totals: &mut Totals, hosting: &Hosting) {
    for (name, n) in hosting.replica_counters() {
        totals.counters.insert(name.to_string(), n);
    }
}

/// The final read and the final checks, on a server that serves a node (one killed and
/// restarted in a replicated run serves none: its node was taken over).
fn after_run_jobs(
    spec: &BenchSpec,
    ctl: &mut [Control],
    serving: &[bool],
    totals: &mut Totals,
) -> anyhow::Result<Option<Result<HistLine, String>>> {
    let mut final_read = None;
    if spec.record_history {
        final_read = Some(match call_a_serving_server(ctl, serving, &json!({"cmd": "final_read"})) {
            Ok(v) => serde_json::from_value(v["line"].clone()).map_err(|e| e.to_string()),
            Err(e) => Err(format!("{e:#}")),
        });
    }
    if spec.run_checks {
        let v = call_a_serving_server(ctl, serving, &json!({"cmd": "final_checks"}))?;
        let f: Vec<(String, bool, String)> = serde_json::from_value(v["findings"].clone())?;
        totals.findings.extend(f);
        // Every server's process: what its clients saw is in its workload, whether it serves a
        // node now or not (one taken over since its clients ran).
        for c in ctl.iter_mut() {
            let v = match c.call(&json!({"cmd": "findings"})) {
                // Nothing hosted here (a run that never started on this server).
                Err(e) if is_serving_no_node(&e) => continue,
                v => v?,
            };
            let f: Vec<(String, bool, String)> = serde_json::from_value(v["findings"].clone())?;
            totals.findings.extend(f);
        }
    }
    Ok(final_read)
}

/// Reconnect to every server whose control connection no longer answers (one the nemesis
/// killed and started again after its run's end).
fn reach_restarted(ctl: &mut [Control], addrs: &[SocketAddr]) -> anyhow::Result<()> {
    for c in ctl.iter_mut() {
        if c.call(&json!({"cmd": "ping"})).is_err() {
            *c = Control::connect(c.node, addrs[c.node], RESTART_PATIENCE)?;
        }
    }
    Ok(())
}

/// How long the bench looks for a server that serves a node for an after-run job: a node
/// given up after the run's end (its server stopped or cut off late in the run, or starved of
/// CPU past an election) is served again once another host rebuilt it.
const SERVED_PATIENCE: Duration = Duration::from_secs(60);

/// Ask the servers `cmd`, those that served a node when the run ended first, until one that
/// serves a node answers: a server stopped or cut off late in the run can be taken over after
/// the run's end, between the bench's look and its question, and then answers
/// [`super::tcp_host::SERVES_NO_NODE`] (or gives its node up while running the job). Such
/// answers send the bench to the next server, round after round, for up to
/// [`SERVED_PATIENCE`]; any other failure ends the job at once.
fn call_a_serving_server(ctl: &mut [Control], serving: &[bool], cmd: &Value) -> anyhow::Result<Value> {
    let order: Vec<usize> =
        (0..ctl.len()).filter(|&i| serving[i]).chain((0..ctl.len()).filter(|&i| !serving[i])).collect();
    let t0 = Instant::now();
    loop {
        let mut why = Vec::new();
        for &i in &order {
            match ctl[i].call(cmd) {
                Ok(v) => return Ok(v),
                Err(e) if is_serving_no_node(&e) || ctl[i].lost => why.push(format!("{e:#}")),
                Err(e) => return Err(e),
            }
        }
        if t0.elapsed() >= SERVED_PATIENCE {
            bail!(
                "gave up waiting {} s for a server that serves a node, to run the {}: {}",
                SERVED_PATIENCE.as_secs(),
                cmd["cmd"].as_str().unwrap_or("job").replace('_', " "),
                why.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn is_serving_no_node(e: &anyhow::Error) -> bool {
    let e = format!("{e:#}");
    e.contains(super::tcp_host::SERVES_NO_NODE) || e.contains(super::tcp_host::SERVES_NO_CLIENT_NODE)
}

/// A note per server that died: taken over (how soon, how long the rebuild took) or restarted.
/// The times from each fault to its server answering again, ms, shortest first.
pub fn served_again_sorted(events: &[FaultEvent]) -> Vec<f64> {
    let mut back: Vec<f64> = events.iter().filter_map(|e| e.served_again_ms).collect();
    back.sort_by(f64::total_cmp);
    back
}

fn fault_notes(totals: &Totals, takeovers: &[Takeover], events: &[FaultEvent]) -> Vec<String> {
    let mut notes = Vec::new();
    if !takeovers.is_empty() {
        let mut ms = totals.failover_ms.clone();
        ms.sort_by(f64::total_cmp);
        let rebuild_max = takeovers.iter().map(|t| t.rebuild_ms).max().unwrap_or(0);
        notes.push(format!(
            "faults: {} takeovers: a node whose server died was served by another server a median {} ms (max {} ms) \
             after the fault (kill or stop), rebuilt from its log's replica in at most {rebuild_max} ms",
            takeovers.len(),
            ms.get(ms.len() / 2).map_or("-".to_string(), |m| format!("{m:.0}")),
            ms.last().map_or("-".to_string(), |m| format!("{m:.0}")),
        ));
    }
    if !events.is_empty() {
        let back = served_again_sorted(events);
        let median = back.get(back.len() / 2).map_or("-".to_string(), |m| format!("{m:.0} ms"));
        notes.push(format!(
            "faults: {} injected ({} crashes, {} pauses, {} partitions, {} delays); median time from a fault to the \
             server answering again {median}",
            events.len(),
            events.iter().filter(|e| e.kind == "crash").count(),
            events.iter().filter(|e| e.kind == "pause").count(),
            events.iter().filter(|e| e.kind == "partition").count(),
            events.iter().filter(|e| e.kind == "delay").count(),
        ));
    }
    notes
}
