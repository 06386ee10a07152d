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

use super::driver::{self, RunShared, Window};
use super::metrics::{HistLine, Totals};
use super::netns;
use super::tcp_host::{Hosting, Takeover};
use super::{build_node, build_workload, BenchSpec, Outcome};
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

/// Longest control line we accept (a spec is a few KB).
const MAX_CONTROL_LINE: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum ControlRequest {
    Ping,
    Prepare {
        spec: Box<BenchSpec>,
    },
    Start,
    Wait,
    FinalRead,
    FinalChecks,
    Findings,
    Stop,
    Shutdown,
    /// Hold every message this server's workers send `us` µs longer (0: no more), for
    /// `--fault-at delay`.
    Delay {
        us: u64,
    },
}

/// A run in progress on this server.
struct ActiveRun {
    spec: BenchSpec,
    /// What this process serves. None: a replicated run taken up again after a restart; a
    /// follower of its node's log took the node over, and only the history file is left here.
    hosting: Option<Arc<Hosting>>,
    epoch: Instant,
    cpu: Arc<Mutex<(Option<u64>, Option<u64>)>>,
    window: Option<Window>,
    /// The run's log folder when the server has no `--data-dir` (removed with the run).
    _tmp_logs: Option<crate::util::TempDir>,
    /// The run's folder under `--data-dir` (its spec, history file and logs), if any.
    run_dir: Option<std::path::PathBuf>,
    /// Resumed after a restart: this incarnation runs no clients.
    resumed: bool,
    /// This server's replicas of the logs, started at `start`, not at `prepare`.
    pending_replicas: Option<PendingReplicas>,
}

/// A host's log replicas of a fresh replicated run, waiting for the run's `start`: its own
/// node's log and where to journal. Started at `prepare`, the replicas of the servers prepared
/// first saw no leader for a log whose server was still loading its data (TPC-C takes
/// seconds), elected one of their own and took that node over, and the server then found
/// its own node's ports taken ("Address already in use"). The bench sends `start` to every
/// server right after the last `prepare`, well within an election timeout.
type PendingReplicas = (Arc<crate::rt::log::NodeLog>, std::path::PathBuf);

/// Files a server keeps in a run's folder under `--data-dir`.
const RUN_SPEC_FILE: &str = "run.json";
const RUN_DONE_FILE: &str = "done";
/// The run's measured window in Unix ms, so that a restarted server runs clients until its end.
const RUN_WINDOW_FILE: &str = "window.json";

/// The number this server's incarnations in a run count up with (a file per node in the run's
/// folder): each restart's clients generate values of their own.
fn incarnation_file_name(node: u16) -> String {
    format!("incarnation-{node}")
}

/// The highest process number a workload can give values of their own to (TPC-C keeps 24 bits
/// of its history keys per process).
const MAX_PROCESS: u64 = 255;

/// The hosting, or (stopped) why it did not start.
fn stop_unless_started(hosting: Arc<Hosting>, started: anyhow::Result<()>) -> anyhow::Result<Arc<Hosting>> {
    if let Err(e) = started {
        hosting.stop();
        return Err(e);
    }
    Ok(hosting)
}

/// Where a host's replicas journal their Raft state, in the run's folder.
fn raft_journal_file_name(node: u16) -> String {
    format!("raft-host-{node}.journal")
}

/// The takeovers this server's incarnations made, one JSON line each, in the run's folder.
fn takeovers_file_name(node: u16) -> String {
    format!("takeovers-node-{node}.jsonl")
}

/// The takeovers recorded in `dir` by node `node`'s incarnations (none if no file).
fn read_takeovers(dir: &Path, node: u16) -> Vec<Takeover> {
    let text = std::fs::read_to_string(dir.join(takeovers_file_name(node))).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn history_file_name(node: u16) -> String {
    format!("history-node-{node}.jsonl")
}

struct Server {
    cfg: ClusterConfig,
    node: u16,
    /// Where this server keeps its logs (`--data-dir`): one folder per cluster id.
    data_dir: Option<std::path::PathBuf>,
    run: Mutex<Option<ActiveRun>>,
}

/// `dtx server --config FILE --node N [--data-dir DIR]`: serve until told to shut down.
pub fn serve(config: &Path, node: u16, data_dir: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let cfg = ClusterConfig::load(config)?;
    if node as usize >= cfg.nodes.len() {
        bail!("--node {node}: the cluster config names only {} nodes (0..{})", cfg.nodes.len(), cfg.nodes.len() - 1);
    }
    let addr = cfg.nodes[node as usize].addr;
    let listener = TcpListener::bind(addr).with_context(|| format!("node {node}: cannot listen on {addr}"))?;
    eprintln!(
        "dtx server: node {node} of {}: control on {addr}, workers on ports {}..{}",
        cfg.nodes.len(),
        addr.port() + 1,
        addr.port() + cfg.workers
    );
    let server = Arc::new(Server { cfg, node, data_dir, run: Mutex::new(None) });
    server.resume_unfinished_run()?;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let s = server.clone();
        std::thread::spawn(move || {
            if let Err(e) = s.session(conn) {
                eprintln!("dtx server: control connection ended: {e:#}");
            }
        });
    }
    Ok(())
}

impl Server {
    fn session(&self, conn: TcpStream) -> anyhow::Result<()> {
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut writer = conn;
        let mut line = String::new();
        loop {
            line.clear();
            let n = std::io::Read::take(&mut reader, MAX_CONTROL_LINE as u64).read_line(&mut line)?;
            if n == 0 {
                return Ok(());
            }
            if !line.ends_with('\n') && n >= MAX_CONTROL_LINE {
                writeln!(writer, "{}", json!({"ok": false, "error": "request line exceeds 1 MiB"}))?;
                return Ok(());
            }
            let reply = match serde_json::from_str::<ControlRequest>(line.trim()) {
                Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
                Ok(ControlRequest::Shutdown) => {
                    self.stop();
                    writeln!(writer, "{}", json!({"ok": true}))?;
                    std::process::exit(0);
                }
                Ok(req) => match self.handle(req) {
                    Ok(mut v) => {
                        v["ok"] = json!(true);
                        v
                    }
                    Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
                },
            };
            // One write per reply: serde_json writes token by token, and a history of 50,000
            // transactions written so to a socket with TCP_NODELAY took 20 s of system calls.
            let mut bytes = serde_json::to_vec(&reply)?;
            bytes.push(b'\n');
            writer.write_all(&bytes)?;
        }
    }

    fn handle(&self, req: ControlRequest) -> anyhow::Result<Value> {
        match req {
            ControlRequest::Ping => Ok(json!({"node": self.node})),
            ControlRequest::Prepare { spec } => self.prepare(*spec).map(|_| json!({})),
            ControlRequest::Start => self.start().map(|_| json!({})),
            ControlRequest::Wait => self.wait(),
            ControlRequest::FinalRead => self.final_read(),
            ControlRequest::FinalChecks => self.final_checks(),
            ControlRequest::Findings => Ok(json!({"findings": self.hosting()?.workload().process_findings()})),
            ControlRequest::Stop => {
                self.stop();
                Ok(json!({}))
            }
            ControlRequest::Shutdown => Ok(json!({})),
            ControlRequest::Delay { us } => {
                crate::rt::tcp::set_send_delay_us(us);
                Ok(json!({}))
            }
        }
    }

    /// After a restart (kill -9, power loss): a run this node was part of and that did not
    /// finish is taken up again: the node recovers from its log and serves its peers, without
    /// clients (theirs died with the process; the history file says what they had started).
    fn resume_unfinished_run(&self) -> anyhow::Result<()> {
        let Some(data) = &self.data_dir else { return Ok(()) };
        let Ok(entries) = std::fs::read_dir(data) else { return Ok(()) };
        for e in entries.flatten() {
            let dir = e.path();
            let spec_path = dir.join(RUN_SPEC_FILE);
            if !spec_path.exists() || dir.join(RUN_DONE_FILE).exists() {
                continue;
            }
            let text =
                std::fs::read_to_string(&spec_path).with_context(|| format!("cannot read {}", spec_path.display()))?;
            let spec: BenchSpec = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a run description", spec_path.display()))?;
            eprintln!("dtx server: node {}: resuming the unfinished run in {}", self.node, dir.display());
            return self.prepare_run(spec, true);
        }
        Ok(())
    }

    fn prepare(&self, spec: BenchSpec) -> anyhow::Result<()> {
        self.prepare_run(spec, false)
    }

    fn prepare_run(&self, spec: BenchSpec, resumed: bool) -> anyhow::Result<()> {
        let t0 = Instant::now();
        self.stop();
        if spec.nodes as usize != self.cfg.nodes.len() || spec.workers != self.cfg.workers {
            bail!(
                "the bench expects {} nodes x {} workers but this cluster has {} x {}",
                spec.nodes,
                spec.workers,
                self.cfg.nodes.len(),
                self.cfg.workers
            );
        }
        spec.validate()?;
        let (dir, tmp) = match &self.data_dir {
            Some(d) => (d.join(format!("{:016x}", spec.durability.cluster_id)), None),
            None => super::data_dir(&spec)?,
        };
        let run_dir = self.data_dir.as_ref().map(|_| dir.clone());
        let shared = self.run_shared(&spec, run_dir.as_deref(), resumed)?;
        let mut pending_replicas = None;
        let hosting = if resumed && spec.durability.mode == Durability::Replicated {
            // A follower took the node over from its replica of the node's log; this process
            // rejoins every log it is a voter of from its journal, and serves whichever node's
            // log it comes to lead (its own again, or another).
            let process = self.next_process(run_dir.as_deref(), spec.nodes)?;
            let h = self.rejoin_replicas(&spec, &dir, shared, process.unwrap_or(self.node))?;
            Some((h, process.is_some()))
        } else {
            let process = if resumed { self.next_process(run_dir.as_deref(), spec.nodes)? } else { Some(self.node) };
            let (h, replicas) = self.host_own_node(&spec, &dir, shared, process.unwrap_or(self.node))?;
            pending_replicas = replicas;
            Some((h, process.is_some()))
        };
        let (hosting, runs_clients) = match hosting {
            Some((h, clients)) => (Some(h), clients),
            None => (None, false),
        };
        let spec_mode = spec.durability.mode;
        *self.run.lock() = Some(ActiveRun {
            epoch: hosting.as_ref().map_or_else(Instant::now, |h| h.epoch),
            spec,
            hosting,
            cpu: Arc::new(Mutex::new((None, None))),
            window: None,
            _tmp_logs: tmp,
            run_dir,
            resumed,
            pending_replicas,
        });
        if resumed && self.run.lock().as_ref().is_some_and(|r| r.hosting.is_some()) {
            let what = match spec_mode {
                Durability::Replicated => "its log replicas rejoined their groups",
                _ => "recovered from its log and serving again",
            };
            eprintln!("dtx server: node {}: {what} after {} ms", self.node, t0.elapsed().as_millis());
            if runs_clients {
                self.resume_clients();
            }
        }
        Ok(())
    }

    /// The workload's process number for this incarnation (node + nodes x restarts so far),
    /// counted in the run's folder; `None` once past what a workload can number.
    fn next_process(&self, run_dir: Option<&Path>, nodes: u16) -> anyhow::Result<Option<u16>> {
        let Some(dir) = run_dir else { return Ok(None) };
        let path = dir.join(incarnation_file_name(self.node));
        let before: u64 = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
        let now = before + 1;
        crate::util::write_atomically(&path, now.to_string().as_bytes())?;
        let process = u64::from(self.node) + u64::from(nodes) * now;
        Ok((process <= MAX_PROCESS).then_some(process as u16))
    }

    /// A restarted server of an unfinished run starts clients again until the run's window
    /// ends (its earlier incarnation's clients died with it; the history file keeps what they
    /// did). Its totals then count this incarnation's part of the window only.
    fn resume_clients(&self) {
        let mut guard = self.run.lock();
        let Some(run) = guard.as_mut() else { return };
        let Some(dir) = &run.run_dir else { return };
        let Ok(text) = std::fs::read_to_string(dir.join(RUN_WINDOW_FILE)) else { return };
        let Ok(v) = serde_json::from_str::<Value>(&text) else { return };
        let (Some(start), Some(end)) = (v["start_unix_ms"].as_u64(), v["end_unix_ms"].as_u64()) else { return };
        let now_unix = super::tcp_host::unix_ms();
        let Some(h) = &run.hosting else { return };
        if end <= now_unix {
            return;
        }
        let now = run.epoch.elapsed().as_nanos() as u64;
        let window = Window {
            start_ns: now + start.saturating_sub(now_unix) * 1_000_000,
            end_ns: now + (end - now_unix) * 1_000_000,
        };
        h.start_clients(window);
        run.window = Some(window);
        run.resumed = false;
        sample_cpu(run, window);
        eprintln!("dtx server: node {}: clients running again for {} ms", self.node, end - now_unix);
    }

    /// Build this server's own node (recovered from its log, with `--durability wal`) and serve
    /// it; with `--durability replicated`, also returns its replicas of the logs to start at
    /// the run's `start` ([`PendingReplicas`]).
    fn host_own_node(
        &self,
        spec: &BenchSpec,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<(Arc<Hosting>, Option<PendingReplicas>)> {
        let hosting = self.hosting_for(spec, dir, shared, process)?;
        let logs = super::open_node_logs(spec, dir, self.node)?;
        let mut node = build_node(spec, self.node, hosting.workload(), logs)?;
        let replicas = node.replicated.take().map(|(log, _)| (log, dir.join(raft_journal_file_name(self.node))));
        let started = hosting.serve_node(self.node, node, Duration::ZERO).map(|_| ());
        Ok((stop_unless_started(hosting, started)?, replicas))
    }

    /// After a restart in a replicated run: no node of its own (a follower took it over), its
    /// replicas reopened from their journal and rejoining their logs.
    fn rejoin_replicas(
        &self,
        spec: &BenchSpec,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<Arc<Hosting>> {
        let hosting = self.hosting_for(spec, dir, shared, process)?;
        let started = hosting.start_replication(None, dir.join(raft_journal_file_name(self.node)));
        stop_unless_started(hosting, started)
    }

    /// What this process hosts in the run, with the workload of its incarnation (`process`).
    fn hosting_for(
        &self,
        spec: &BenchSpec,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<Arc<Hosting>> {
        let mut process_spec = spec.clone();
        process_spec.workload.process = process;
        let workload = build_workload(&process_spec)?;
        let hosting = Hosting::new(spec.clone(), self.node, self.cfg.clone(), workload, shared);
        hosting.record_takeovers_in(dir.join(takeovers_file_name(self.node)));
        Ok(hosting)
    }

    /// The run's shared state; under `--data-dir`, with its spec saved (so that a restarted
    /// server can take the run up again) and its history file open for appending.
    fn run_shared(&self, spec: &BenchSpec, run_dir: Option<&Path>, resumed: bool) -> anyhow::Result<RunShared> {
        let shared = RunShared::default();
        // Each process numbers its attempts in its own range: a node taken over by another
        // process goes on under the same node id, and the histories of both are merged.
        shared.history_ids.store((self.node as u64) << 30, Ordering::Relaxed);
        let mut shared = shared;
        let Some(dir) = run_dir else { return Ok(shared) };
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if !resumed {
            let _ = std::fs::remove_file(dir.join(RUN_DONE_FILE));
            crate::util::write_atomically(&dir.join(RUN_SPEC_FILE), &serde_json::to_vec(spec)?)?;
        }
        if spec.record_history {
            let path = dir.join(history_file_name(self.node));
            if resumed {
                // Ids of this incarnation continue after those the file holds.
                let next = driver::read_history_file(&path)
                    .unwrap_or_default()
                    .iter()
                    .map(|l| (l.id & ((1 << 40) - 1)) + 1)
                    .max();
                shared.history_ids.store(next.unwrap_or(0), Ordering::Relaxed);
            } else {
                let _ = std::fs::remove_file(&path);
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("cannot open the history file {}", path.display()))?;
            shared.history_file = Some(Mutex::new(f));
        }
        Ok(shared)
    }

    fn start(&self) -> anyhow::Result<()> {
        let mut guard = self.run.lock();
        let run = guard.as_mut().context("start before prepare")?;
        let now = run.epoch.elapsed().as_nanos() as u64;
        let window = Window {
            start_ns: now + run.spec.warmup_us * 1000,
            end_ns: now + (run.spec.warmup_us + run.spec.duration_us) * 1000,
        };
        run.window = Some(window);
        if let Some(h) = &run.hosting {
            if let Some((log, journal)) = run.pending_replicas.take() {
                if let Err(e) = h.start_replication(Some(log), journal) {
                    h.stop();
                    return Err(e);
                }
            }
            h.start_clients(window);
        }
        if let Some(dir) = &run.run_dir {
            // Where a restarted server finds how long the run still goes on.
            let now_unix = super::tcp_host::unix_ms();
            let (start, end) =
                (now_unix + run.spec.warmup_us / 1000, now_unix + window.end_ns.saturating_sub(now) / 1_000_000);
            let text = json!({"start_unix_ms": start, "end_unix_ms": end}).to_string();
            crate::util::write_atomically(&dir.join(RUN_WINDOW_FILE), text.as_bytes())?;
        }
        sample_cpu(run, window);
        Ok(())
    }

    fn wait(&self) -> anyhow::Result<Value> {
        let (hosting, window, epoch, cpu, history_path, run_dir) = {
            let guard = self.run.lock();
            let run = guard.as_ref().context("wait before prepare")?;
            let path = run.run_dir.as_ref().map(|d| d.join(history_file_name(self.node)));
            let history_path = path.filter(|_| run.spec.record_history);
            match (&run.hosting, run.resumed) {
                (Some(h), false) => {
                    let window = run.window.context("wait before start")?;
                    (h.clone(), window, run.epoch, run.cpu.clone(), history_path, run.run_dir.clone())
                }
                (hosting, _) => {
                    // The clients died with the previous incarnation: what they did is in the file.
                    let history = match &history_path {
                        Some(p) => {
                            driver::read_history_file(p).with_context(|| format!("cannot read {}", p.display()))?
                        }
                        None => Vec::new(),
                    };
                    let serves = hosting.as_ref().is_some_and(|h| h.serves_a_node());
                    let takeovers = run.run_dir.as_deref().map(|d| read_takeovers(d, self.node)).unwrap_or_default();
                    let mut totals = Totals::default();
                    if let Some(h) = hosting {
                        add_replica_counters(&mut totals, h);
                    }
                    return Ok(json!({"totals": totals, "history": history, "stuck_workers": 0,
                        "resumed": true, "serves": serves, "takeovers": takeovers}));
                }
            }
        };
        let shared = hosting.shared.clone();
        let deadline = Duration::from_nanos(window.end_ns) + CLIENTS_PATIENCE;
        // The window's end first: clients may start later than the run (on a node this
        // process takes over), and they count themselves only when they start.
        while cpu.lock().1.is_none() && epoch.elapsed() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        while shared.running.load(Ordering::Acquire) > 0 && epoch.elapsed() < deadline {
            // A worker that panicked leaves its clients running forever.
            hosting.check_workers()?;
            std::thread::sleep(Duration::from_millis(5));
        }
        hosting.check_workers()?;
        let mut totals = Totals::default();
        let mut history: Vec<HistLine> = Vec::new();
        super::collect(&shared, &mut totals, &mut history);
        if let (Some(a), Some(b)) = *cpu.lock() {
            totals.cpu_us = b.saturating_sub(a);
        }
        add_replica_counters(&mut totals, &hosting);
        if let Some(p) = &history_path {
            // The file also holds what a killed earlier incarnation of this node recorded.
            history = driver::read_history_file(p).with_context(|| format!("cannot read {}", p.display()))?;
        }
        let stuck = shared.running.load(Ordering::Acquire);
        // Under --data-dir the file also holds the takeovers of killed earlier incarnations.
        let takeovers = run_dir.as_deref().map_or_else(|| hosting.takeovers(), |d| read_takeovers(d, self.node));
        Ok(json!({"totals": totals, "history": history, "stuck_workers": stuck,
            "serves": hosting.serves_a_node(), "takeovers": takeovers}))
    }

    /// What this server hosts in the current run (an error if it serves no node in it).
    fn hosting(&self) -> anyhow::Result<Arc<Hosting>> {
        let guard = self.run.lock();
        let run = guard.as_ref().context("no run prepared on this node")?;
        run.hosting.clone().context(super::tcp_host::SERVES_NO_NODE)
    }

    /// Run an after-run job on worker 0 of a node this server serves, and wait up to `limit`
    /// for `done` to take its result from where it reports. Fails with
    /// [`super::tcp_host::SERVES_NO_NODE`] if the node is given up meanwhile (taken over by
    /// another host: its worker stopped with the job), so that the bench asks the server that
    /// serves a node now.
    fn after_run_job<T>(
        &self,
        job: driver::AfterRun,
        what: &str,
        limit: Duration,
        done: impl Fn(&RunShared) -> Option<T>,
    ) -> anyhow::Result<T> {
        let h = self.hosting()?;
        let (node, worker) = h.on_a_worker0(driver::after_run_command(job, h.workload().clone(), h.shared.clone()))?;
        let t0 = Instant::now();
        loop {
            if let Some(result) = done(&h.shared) {
                return Ok(result);
            }
            h.check_workers()?;
            if !h.still_runs(&worker) {
                bail!("{}: node {node} was given up during the {what}", super::tcp_host::SERVES_NO_NODE);
            }
            if t0.elapsed() >= limit {
                bail!("the {what} did not finish within {} s (on node {node})", limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn final_read(&self) -> anyhow::Result<Value> {
        let take = |s: &RunShared| s.final_read.lock().take();
        match self.after_run_job(driver::final_read, "final read", FINAL_READ_WAIT, take)? {
            Ok(line) => Ok(json!({"line": line})),
            Err(e) => bail!("{e}"),
        }
    }

    fn final_checks(&self) -> anyhow::Result<Value> {
        let take = |s: &RunShared| s.checks.lock().take();
        let findings = self.after_run_job(driver::final_checks, "final checks", FINAL_CHECKS_WAIT, take)?;
        Ok(json!({"findings": findings}))
    }

    fn stop(&self) {
        let run = self.run.lock().take();
        if let Some(run) = run {
            if let Some(d) = &run.run_dir {
                // Finished: a restart does not take this run up again.
                let _ = std::fs::write(d.join(RUN_DONE_FILE), b"");
            }
            if let Some(h) = &run.hosting {
                h.stop();
            }
        }
    }
}

/// Sample this process's CPU time at the edges of `window` (`wait` reports the difference).
fn sample_cpu(run: &ActiveRun, window: Window) {
    let (cpu, epoch) = (run.cpu.clone(), run.epoch);
    std::thread::spawn(move || {
        let at = |t_ns: u64| Duration::from_nanos(t_ns.saturating_sub(epoch.elapsed().as_nanos() as u64));
        std::thread::sleep(at(window.start_ns));
        cpu.lock().0 = Some(crate::util::process_cpu_us());
        std::thread::sleep(at(window.end_ns));
        cpu.lock().1 = Some(crate::util::process_cpu_us());
    });
}

/// How long the bench waits for a node whose server died mid-run to come back.
const RESTART_PATIENCE: Duration = Duration::from_secs(60);

/// How long a server waits, past the run's window, for its clients to finish.
const CLIENTS_PATIENCE: Duration = Duration::from_secs(120);

/// Wait for a node's run to end. If its server dies meanwhile (killed, crashed) and comes back
/// on the same address with its `--data-dir`, it takes the run up again from its log and its
/// history file: reconnect and ask again. Also returns when the bench lost the server (ms since
/// the Unix epoch), to time a takeover of its node.
/// A server's control connection, its final report, and when it was lost (Unix ms), if it was.
type Waited = (Control, Value, Option<u64>);

/// Gives up, naming the wait, once `deadline` passes: the run's window, the servers' own
/// patience with their clients ([`CLIENTS_PATIENCE`]) and [`ANSWER_MARGIN`].
fn wait_surviving_restarts(mut c: Control, addr: SocketAddr, deadline: Instant) -> anyhow::Result<Waited> {
    let mut lost_unix_ms = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.call_within(&json!({"cmd": "wait"}), left) {
            Ok(v) => return Ok((c, v, lost_unix_ms)),
            Err(e) if c.lost && !left.is_zero() => {
                lost_unix_ms.get_or_insert_with(super::tcp_host::unix_ms);
                eprintln!("dtx: node {}: {e:#}; waiting up to {:?} for it to restart", c.node, RESTART_PATIENCE);
                c = Control::connect(c.node, addr, RESTART_PATIENCE.min(left))?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long a server waits for its final read to commit, and for its final checks.
const FINAL_READ_WAIT: Duration = Duration::from_secs(60);
const FINAL_CHECKS_WAIT: Duration = Duration::from_secs(600);

/// How long the bench waits for a server's answer beyond what the server itself waits for:
/// a server that does not answer by then (stopped, hung) is given up on, by name.
const ANSWER_MARGIN: Duration = Duration::from_secs(30);

/// How long the bench waits for a server's answer to `cmd` (`wait` is bounded by the run's
/// window instead, see [`wait_surviving_restarts`]).
fn patience(cmd: &str) -> Duration {
    match cmd {
        // Loading a large TPC-C or YCSB population.
        "prepare" => Duration::from_secs(600),
        "final_read" => FINAL_READ_WAIT + ANSWER_MARGIN,
        "final_checks" => FINAL_CHECKS_WAIT + ANSWER_MARGIN,
        _ => ANSWER_MARGIN,
    }
}

/// A control connection to one node.
struct Control {
    node: usize,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The connection broke (the server died), as opposed to the server refusing a request.
    lost: bool,
    /// The server did not answer within the bench's patience: the connection is given up (a
    /// late answer would be read as the next request's).
    timed_out: bool,
}

impl Control {
    fn connect(node: usize, addr: SocketAddr, patience: Duration) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Control {
                        node,
                        reader: BufReader::new(s.try_clone()?),
                        writer: s,
                        lost: false,
                        timed_out: false,
                    });
                }
                Err(e) if t0.elapsed() < patience => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => bail!("cannot reach node {node} at {addr}: {e} (is `dtx server` running there?)"),
            }
        }
    }

    /// Send `req` and read the answer, waiting at most the request's [`patience`].
    fn call(&mut self, req: &Value) -> anyhow::Result<Value> {
        let limit = patience(req["cmd"].as_str().unwrap_or(""));
        self.call_within(req, limit)
    }

    /// Send `req` and read the answer, waiting at most `limit` for it.
    fn call_within(&mut self, req: &Value, limit: Duration) -> anyhow::Result<Value> {
        let node = self.node;
        let what = match req["cmd"].as_str().unwrap_or("") {
            "wait" => format!("node {node}'s clients to finish (the end of its run)"),
            "ping" => format!("node {node} to answer a ping"),
            other => format!("node {node}'s {}", other.replace('_', " ")),
        };
        if self.timed_out {
            bail!("node {}: its control connection was given up on (an earlier request timed out)", self.node);
        }
        let mut line = String::new();
        let mut bytes = serde_json::to_vec(req)?;
        bytes.push(b'\n');
        self.writer.set_read_timeout(Some(limit.max(Duration::from_millis(1))))?;
        let sent = self.writer.write_all(&bytes).and_then(|_| self.reader.read_line(&mut line));
        match sent {
            Ok(0) => {
                self.lost = true;
                bail!("node {} closed the control connection", self.node);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                self.timed_out = true;
                bail!("gave up waiting {} s for {what}: its server did not answer", limit.as_secs());
            }
            Err(e) => {
                self.lost = true;
                bail!("node {}: the control connection broke: {e}", self.node);
            }
            Ok(_) => {}
        }
        let v: Value = serde_json::from_str(&line).with_context(|| format!("node {}: unreadable reply", self.node))?;
        if v["ok"] != json!(true) {
            bail!("node {}: {}", self.node, v["error"].as_str().unwrap_or("error"));
        }
        Ok(v)
    }
}

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

/// Server processes this bench started; shut down (then killed) when dropped.
struct Spawned {
    children: Arc<Mutex<Vec<std::process::Child>>>,
    /// How to start server `n` again (after the bench killed it).
    commands: Vec<std::process::Command>,
    dir: crate::util::TempDir,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        for c in self.children.lock().iter_mut() {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(2) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Kills, when dropped, every server process a run started that is still running.
struct Reaper(Arc<Mutex<Vec<std::process::Child>>>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in self.0.lock().iter_mut() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Spawned {
    fn start(&mut self, n: usize) -> anyhow::Result<std::process::Child> {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.0.join(format!("node{n}.log")))?;
        let cmd = &mut self.commands[n];
        cmd.stdout(log.try_clone()?).stderr(log);
        cmd.spawn().context("cannot start a dtx server process")
    }

    /// Inject the run's faults (`--faults crash,pause,partition` on tcp), from `t0` on: every
    /// `fault_interval_us`, the next of the kinds asked for (they take turns) hits a random
    /// server (from the run's seed) for `fault_duration_us`: it is killed with `kill -9` and started again over
    /// its data folder, stopped with SIGSTOP and continued with SIGCONT, or cut off from the
    /// other servers by firewall rules and reconnected ([`netns`]). The faults of `--fault-at`
    /// join them at their own times, on their own servers (one without a duration lasts until
    /// the measured window ends). One fault at a time: one due while another lasts starts when
    /// that one ends (its `at_ms` says when). Each event is timed until the server answers its
    /// control connection again. A restarted server of a replicated run rejoins its logs from
    /// its Raft journal.
    fn nemesis(mut self, spec: &BenchSpec, addrs: Vec<SocketAddr>, t0: Instant) -> std::thread::JoinHandle<Nemesis> {
        let schedule = nemesis_schedule(spec, addrs.len());
        std::thread::spawn(move || {
            let mut events = Vec::new();
            for (at, node, action, down) in schedule {
                std::thread::sleep(at.saturating_sub(t0.elapsed()));
                let started = t0.elapsed();
                let undone = match action {
                    NemesisAction::Crash => self.crash(node, down),
                    NemesisAction::Pause => self.pause(node, down),
                    NemesisAction::Partition => partition(node, addrs.len(), down),
                    NemesisAction::Delay(by) => delay(node, addrs[node], by, down),
                };
                if let Err(e) = undone {
                    eprintln!("dtx: --faults: node {node}: {e:#}");
                    break;
                }
                let back = Control::connect(node, addrs[node], RESTART_PATIENCE)
                    .and_then(|mut c| c.call(&json!({"cmd": "ping"})))
                    .map(|_| t0.elapsed().saturating_sub(started));
                events.push(FaultEvent {
                    kind: action.name().to_string(),
                    node: node as u32,
                    at_ms: started.as_secs_f64() * 1e3,
                    down_ms: down.as_secs_f64() * 1e3,
                    served_again_ms: back.ok().map(|d| d.as_secs_f64() * 1e3),
                });
            }
            Nemesis { spawned: self, events }
        })
    }

    /// `kill -9` server `n`, and start it again `down` later (it takes the run up again).
    fn crash(&mut self, n: usize, down: Duration) -> anyhow::Result<()> {
        if let Some(c) = self.children.lock().get_mut(n) {
            let _ = c.kill();
            let _ = c.wait();
        }
        eprintln!("dtx: --faults crash: killed node {n}'s server (kill -9); starting it again in {down:?}");
        std::thread::sleep(down);
        // A server started right after a kill may exit at once (a port of the killed process
        // not yet free): start it again until it stays up.
        let deadline = Instant::now() + RESTART_PATIENCE / 4;
        loop {
            let child = self.start(n).with_context(|| format!("node {n}'s server did not start again"))?;
            self.children.lock()[n] = child;
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(500) && self.exited(n).is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            match self.exited(n) {
                None => return Ok(()),
                Some(status) if Instant::now() < deadline => {
                    eprintln!(
                        "dtx: --faults crash: node {n}'s server exited at once ({status}{}); starting it again",
                        self.last_error(n).map_or(String::new(), |e| format!(": {e}"))
                    );
                }
                Some(status) => bail!(
                    "node {n}'s server keeps exiting after a restart ({status}{})",
                    self.last_error(n).map_or(String::new(), |e| format!(": {e}"))
                ),
            }
        }
    }

    /// The last error server `n` wrote to its log, if any.
    fn last_error(&self, n: usize) -> Option<String> {
        let log = std::fs::read_to_string(self.dir.0.join(format!("node{n}.log"))).ok()?;
        log.lines().rev().find(|l| l.contains("error")).map(str::to_string)
    }

    /// How server `n` exited, if it did.
    fn exited(&self, n: usize) -> Option<std::process::ExitStatus> {
        self.children.lock().get_mut(n).and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stop server `n`'s process (SIGSTOP) for `down`, then let it go on (SIGCONT).
    fn pause(&mut self, n: usize, down: Duration) -> anyhow::Result<()> {
        let pid = self.children.lock().get(n).map(|c| c.id()).context("no such server")?;
        let signal = |sig: libc::c_int| {
            // SAFETY: `kill` only sends a signal; the pid is our own child's, reaped by us alone.
            let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
            anyhow::ensure!(rc == 0, "cannot signal pid {pid}: {}", std::io::Error::last_os_error());
            Ok(())
        };
        signal(libc::SIGSTOP)?;
        eprintln!("dtx: --faults pause: stopped node {n}'s server (SIGSTOP); continuing it in {down:?}");
        std::thread::sleep(down);
        signal(libc::SIGCONT)
    }
}

/// Cut server `n` off from the other `servers` for `down`, then heal the cut. The firewall
/// rules live in the run's own network namespace ([`netns`]).
fn partition(n: usize, servers: usize, down: Duration) -> anyhow::Result<()> {
    netns::cut_off(n, servers)?;
    eprintln!("dtx: --faults partition: cut node {n}'s server off from the others; reconnecting it in {down:?}");
    std::thread::sleep(down);
    let dropped = netns::heal()?;
    eprintln!("dtx: --faults partition: reconnected node {n}'s server; the cut dropped {dropped} packets");
    Ok(())
}

/// What the nemesis does to a server.
#[derive(Clone, Copy, Debug)]
enum NemesisAction {
    Crash,
    Pause,
    Partition,
    /// Hold every message the server sends this much longer.
    Delay(Duration),
}

impl NemesisAction {
    fn name(&self) -> &'static str {
        match self {
            NemesisAction::Crash => "crash",
            NemesisAction::Pause => "pause",
            NemesisAction::Partition => "partition",
            NemesisAction::Delay(_) => "delay",
        }
    }
}

/// The nemesis's plan, in time order: (when from the run's start, server, what, for how long).
/// `--faults`' random ones: every `fault_interval_us` from half of it after the warm-up, the
/// kinds asked for taking turns (from a random first one) on servers drawn from the seed, each
/// ending 100 ms before the run does; and `--fault-at`'s, one without a duration lasting until
/// the measured window ends.
fn nemesis_schedule(spec: &BenchSpec, servers: usize) -> Vec<(Duration, usize, NemesisAction, Duration)> {
    let plan = &spec.faults;
    let (warmup, duration) = (Duration::from_micros(spec.warmup_us), Duration::from_micros(spec.duration_us));
    let (every, down) = (Duration::from_micros(plan.fault_interval_us), Duration::from_micros(plan.fault_duration_us));
    let end = warmup + duration;
    let mut rng = crate::util::rng_from_seed(spec.seed ^ 0x006e_656d_6573_6973);
    let kinds: Vec<NemesisAction> = [
        (plan.crashes, NemesisAction::Crash),
        (plan.pauses, NemesisAction::Pause),
        (plan.partitions, NemesisAction::Partition),
    ]
    .into_iter()
    .filter_map(|(asked, kind)| asked.then_some(kind))
    .collect();
    let mut schedule = Vec::new();
    if !kinds.is_empty() && servers > 0 && !every.is_zero() {
        let first_kind = rng.gen_range(0..kinds.len());
        let mut at = warmup + every / 2;
        while at + down + Duration::from_millis(100) < end {
            let node = rng.gen_range(0..servers);
            // The kinds take turns (from a random first one), so a short run sees each.
            schedule.push((at, node, kinds[(first_kind + schedule.len()) % kinds.len()], down));
            at += every;
        }
    }
    let end_us = spec.warmup_us + spec.duration_us;
    for f in plan.targeted.iter().filter(|f| (f.node as usize) < servers) {
        let action = match f.kind {
            crate::net::TargetedKind::Crash => NemesisAction::Crash,
            crate::net::TargetedKind::Pause => NemesisAction::Pause,
            crate::net::TargetedKind::Delay { by_us } => NemesisAction::Delay(Duration::from_micros(by_us)),
            // Refused by the CLI on tcp: simulated CPU has no meaning for a real process.
            crate::net::TargetedKind::Cpu { .. } => continue,
        };
        let lasts = Duration::from_micros(f.end_us(end_us) - f.at_us);
        schedule.push((Duration::from_micros(f.at_us), f.node as usize, action, lasts));
    }
    schedule.sort_by_key(|s| s.0);
    schedule
}

/// Hold every message server `n` sends `by` longer, for `down`, through its control connection.
fn delay(n: usize, addr: SocketAddr, by: Duration, down: Duration) -> anyhow::Result<()> {
    let mut c = Control::connect(n, addr, Duration::from_secs(5))?;
    c.call(&json!({"cmd": "delay", "us": by.as_micros() as u64}))?;
    eprintln!("dtx: --fault-at delay: node {n}'s server holds what it sends {by:?} longer, for {down:?}");
    std::thread::sleep(down);
    c.call(&json!({"cmd": "delay", "us": 0}))?;
    eprintln!("dtx: --fault-at delay: node {n}'s server sends without delay again");
    Ok(())
}

/// What the fault thread hands back: the servers, and what it did to them.
struct Nemesis {
    spawned: Spawned,
    events: Vec<FaultEvent>,
}

/// Find a base port with room for every node's control, worker and replication ports, below
/// the kernel's ephemeral range (32768 and up by default): a port checked free there could be
/// taken by another process's outgoing connection before its server binds it (a CI run failed
/// with "Address already in use" so).
pub fn free_base_port(nodes: u16, workers: u16) -> anyhow::Result<u16> {
    const LOWEST: u32 = 20_000;
    const EPHEMERAL_START: u32 = 32_768;
    let span = nodes as u32 * (workers as u32 + 2);
    anyhow::ensure!(
        LOWEST + span < EPHEMERAL_START,
        "a cluster of {span} ports does not fit below port {EPHEMERAL_START}"
    );
    let room = EPHEMERAL_START - span - LOWEST;
    // Runs of one process (the tests) take turns through the counter.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = (std::process::id()).wrapping_mul(2654435761);
    for _ in 0..200u32 {
        let base = LOWEST + seed.wrapping_add(NEXT.fetch_add(97, std::sync::atomic::Ordering::Relaxed)) % room;
        let ok = (0..span).all(|i| TcpListener::bind(("127.0.0.1", (base + i) as u16)).is_ok());
        if ok {
            return Ok(base as u16);
        }
    }
    bail!("no free range of {span} ports found on 127.0.0.1")
}

/// Start one `dtx server` per node on 127.0.0.1. With `--faults crash`, each keeps its own data
/// folder, so that a killed server takes the run up again when started anew.
fn spawn_cluster(spec: &BenchSpec) -> anyhow::Result<(ClusterConfig, Spawned)> {
    let base = free_base_port(spec.nodes, spec.workers)?;
    let mut cfg = ClusterConfig::loopback(spec.nodes, spec.workers, base);
    if spec.faults.partitions {
        // A cut is a firewall rule between two servers' addresses: each server gets its own.
        anyhow::ensure!(netns::inside(), "--faults partition: the bench must run inside its own network namespace");
        for (n, node) in cfg.nodes.iter_mut().enumerate() {
            node.addr.set_ip(netns::server_ip(n).into());
        }
    }
    let dir = crate::util::TempDir::new("cluster")?;
    let path = dir.0.join("cluster.toml");
    std::fs::write(&path, cfg.to_toml())?;
    let exe = std::env::current_exe().context("cannot find the dtx executable")?;
    let commands = (0..spec.nodes)
        .map(|n| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["server", "--config"]).arg(&path).args(["--node", &n.to_string()]);
            if spec.faults.may_crash() {
                cmd.arg("--data-dir").arg(dir.0.join(format!("data-{n}")));
            }
            cmd
        })
        .collect();
    let mut spawned = Spawned { children: Default::default(), commands, dir };
    for n in 0..spec.nodes as usize {
        let child = spawned.start(n)?;
        spawned.children.lock().push(child);
    }
    Ok((cfg, spawned))
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
        let protocol = crate::protocols::Variant::parse_including_planned(&spec.protocol)?.make();
        let path = cluster.map(|p| p.display().to_string()).unwrap_or_default();
        protocol.check_topology(&spec.topology()).with_context(|| format!("the cluster in {path}"))?;
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
    let Gathered { mut totals, history, mut notes, mut ctl, serving, lost, takeovers } = gather(waits, addrs.len())?;
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
    };
    for w in waits {
        let (c, v, lost_unix_ms) = w.join().map_err(|_| anyhow::anyhow!("control thread panicked"))??;
        let t: Totals = serde_json::from_value(v["totals"].clone())?;
        g.totals.add(&t);
        let h: Vec<HistLine> = serde_json::from_value(v["history"].clone())?;
        g.history.extend(h);
        if v["stuck_workers"].as_u64().unwrap_or(0) > 0 {
            g.notes.push(format!("node {}: some clients were still running 120 s after the window closed", c.node));
        }
        let t: Vec<Takeover> = serde_json::from_value(v["takeovers"].clone()).unwrap_or_default();
        g.takeovers.extend(t);
        g.lost[c.node] = lost_unix_ms;
        g.serving.push(v["serves"].as_bool().unwrap_or(true));
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
    format!("{e:#}").contains(super::tcp_host::SERVES_NO_NODE)
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
