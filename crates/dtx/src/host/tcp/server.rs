//! `dtx server`: one node's process, its control requests, and the run it hosts.

use super::*;

/// Longest control line we accept (a spec is a few KB).
pub(super) const MAX_CONTROL_LINE: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub(super) enum ControlRequest {
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
    /// Hold every message this server's workers (or only its worker `worker`, or only control
    /// messages) send `us` µs longer (0: no more), for `--fault-at delay`.
    Delay {
        us: u64,
        #[serde(default)]
        worker: Option<u16>,
        #[serde(default)]
        control: bool,
    },
    /// The term this server's replica leads `node`'s log in (`null`: it does not lead it), for
    /// `--fault-at ...:leader=N`.
    Leads {
        node: u16,
    },
}

/// A run in progress on this server.
pub(super) struct ActiveRun {
    pub(super) spec: BenchSpec,
    /// What this process serves. None: a replicated run taken up again after a restart; a
    /// follower of its node's log took the node over, and only the history file is left here.
    pub(super) hosting: Option<Arc<Hosting>>,
    pub(super) epoch: Instant,
    pub(super) cpu: Arc<Mutex<(Option<u64>, Option<u64>)>>,
    pub(super) window: Option<Window>,
    /// The run's log folder when the server has no `--data-dir` (removed with the run).
    pub(super) _tmp_logs: Option<crate::util::TempDir>,
    /// The run's folder under `--data-dir` (its spec, history file and logs), if any.
    pub(super) run_dir: Option<std::path::PathBuf>,
    /// Resumed after a restart: this incarnation runs no clients.
    pub(super) resumed: bool,
    /// This server's replicas of the logs, started at `start`, not at `prepare`.
    pub(super) pending_replicas: Option<PendingReplicas>,
}

/// A host's log replicas of a fresh replicated run, waiting for the run's `start`: its own
/// node's log and where to journal. Started at `prepare`, the replicas of the servers prepared
/// first saw no leader for a log whose server was still loading its data (TPC-C takes
/// seconds), elected one of their own and took that node over, and the server then found
/// its own node's ports taken ("Address already in use"). The bench sends `start` to every
/// server right after the last `prepare`, well within an election timeout.
pub(super) type PendingReplicas = (Vec<Arc<crate::rt::log::NodeLog>>, std::path::PathBuf);

/// Files a server keeps in a run's folder under `--data-dir`.
pub(super) const RUN_SPEC_FILE: &str = "run.json";
pub(super) const RUN_DONE_FILE: &str = "done";
/// The run's measured window in Unix ms, so that a restarted server runs clients until its end.
pub(super) const RUN_WINDOW_FILE: &str = "window.json";

/// The number this server's incarnations in a run count up with (a file per node in the run's
/// folder): each restart's clients generate values of their own.
pub(super) fn incarnation_file_name(node: u16) -> String {
    format!("incarnation-{node}")
}

/// The highest process number a workload can give values of their own to (TPC-C keeps 24 bits
/// of its history keys per process).
pub(super) const MAX_PROCESS: u64 = 255;

/// The hosting, or (stopped) why it did not start.
pub(super) fn stop_unless_started(hosting: Arc<Hosting>, started: anyhow::Result<()>) -> anyhow::Result<Arc<Hosting>> {
    if let Err(e) = started {
        hosting.stop();
        return Err(e);
    }
    Ok(hosting)
}

/// Where a host's replicas journal their Raft state, in the run's folder.
pub(super) fn raft_journal_file_name(node: u16) -> String {
    format!("raft-host-{node}.journal")
}

/// The takeovers this server's incarnations made, one JSON line each, in the run's folder.
pub(super) fn takeovers_file_name(node: u16) -> String {
    format!("takeovers-node-{node}.jsonl")
}

/// The takeovers recorded in `dir` by node `node`'s incarnations (none if no file).
pub(super) fn read_takeovers(dir: &Path, node: u16) -> Vec<Takeover> {
    let text = std::fs::read_to_string(dir.join(takeovers_file_name(node))).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

pub(super) fn history_file_name(node: u16) -> String {
    format!("history-node-{node}.jsonl")
}

pub(super) struct Server {
    pub(super) cfg: ClusterConfig,
    pub(super) node: u16,
    /// Where this server keeps its logs (`--data-dir`): one folder per cluster id.
    pub(super) data_dir: Option<std::path::PathBuf>,
    pub(super) run: Mutex<Option<ActiveRun>>,
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
    pub(super) fn session(&self, conn: TcpStream) -> anyhow::Result<()> {
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
            let mut bytes = match serde_json::from_str::<ControlRequest>(line.trim()) {
                Err(e) => serde_json::to_vec(&json!({"ok": false, "error": format!("bad request: {e}")}))?,
                Ok(ControlRequest::Shutdown) => {
                    self.stop();
                    writeln!(writer, "{}", json!({"ok": true}))?;
                    std::process::exit(0);
                }
                Ok(req) => self.answer(req)?,
            };
            // One write per reply: serde_json writes token by token, and a history of 50,000
            // transactions written so to a socket with TCP_NODELAY took 20 s of system calls.
            bytes.push(b'\n');
            writer.write_all(&bytes)?;
        }
    }

    /// A request's answer, as its line of JSON. A wait's goes straight from its own type (a
    /// history as a `Value` takes several times its JSON's size).
    fn answer(&self, req: ControlRequest) -> serde_json::Result<Vec<u8>> {
        let answer = match req {
            ControlRequest::Wait => self.wait().map(|report| serde_json::to_vec(&report)),
            req => self.handle(req).map(|mut v| {
                v["ok"] = json!(true);
                serde_json::to_vec(&v)
            }),
        };
        answer.unwrap_or_else(|e| serde_json::to_vec(&json!({"ok": false, "error": format!("{e:#}")})))
    }

    pub(super) fn handle(&self, req: ControlRequest) -> anyhow::Result<Value> {
        match req {
            ControlRequest::Ping => Ok(json!({"node": self.node})),
            ControlRequest::Prepare { spec } => self.prepare(*spec).map(|_| json!({})),
            ControlRequest::Start => self.start().map(|_| json!({})),
            ControlRequest::Wait => Ok(serde_json::to_value(self.wait()?)?),
            ControlRequest::FinalRead => self.final_read(),
            ControlRequest::FinalChecks => self.final_checks(),
            ControlRequest::Findings => Ok(json!({"findings": self.hosting()?.workload().process_findings()})),
            ControlRequest::Stop => {
                self.stop();
                Ok(json!({}))
            }
            ControlRequest::Shutdown => Ok(json!({})),
            ControlRequest::Delay { us, worker, control } => {
                crate::rt::tcp::set_send_delay_us(us, worker, control);
                Ok(json!({}))
            }
            ControlRequest::Leads { node } => {
                Ok(json!({"term": self.hosting()?.leading_term_of(node, Duration::from_secs(2))}))
            }
        }
    }

    /// After a restart (kill -9, power loss): a run this node was part of and that did not
    /// finish is taken up again: the node recovers from its log and serves its peers, without
    /// clients (theirs died with the process; the history file says what they had started).
    pub(super) fn resume_unfinished_run(&self) -> anyhow::Result<()> {
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

    pub(super) fn prepare(&self, spec: BenchSpec) -> anyhow::Result<()> {
        self.prepare_run(spec, false)
    }

    pub(super) fn prepare_run(&self, spec: BenchSpec, resumed: bool) -> anyhow::Result<()> {
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
        let run = Run::build(&spec)?;
        let (dir, tmp) = match &self.data_dir {
            Some(d) => (d.join(format!("{:016x}", spec.durability.cluster_id)), None),
            None => crate::host::data_dir(&spec)?,
        };
        let run_dir = self.data_dir.as_ref().map(|_| dir.clone());
        let shared = self.run_shared(&spec, run_dir.as_deref(), resumed)?;
        let mut pending_replicas = None;
        let hosting = if resumed && spec.durability.mode == Durability::Replicated {
            // A follower took the node over from its replica of the node's log; this process
            // rejoins every log it is a voter of from its journal, and serves whichever node's
            // log it comes to lead (its own again, or another).
            let process = self.next_process(run_dir.as_deref(), spec.nodes)?;
            let h = self.rejoin_replicas(&run, &dir, shared, process.unwrap_or(self.node))?;
            Some((h, process.is_some()))
        } else {
            let process = if resumed { self.next_process(run_dir.as_deref(), spec.nodes)? } else { Some(self.node) };
            let (h, replicas) = self.host_own_node(&run, &dir, shared, process.unwrap_or(self.node))?;
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
    pub(super) fn next_process(&self, run_dir: Option<&Path>, nodes: u16) -> anyhow::Result<Option<u16>> {
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
    pub(super) fn resume_clients(&self) {
        let mut guard = self.run.lock();
        let Some(run) = guard.as_mut() else { return };
        let Some(dir) = &run.run_dir else { return };
        let Ok(text) = std::fs::read_to_string(dir.join(RUN_WINDOW_FILE)) else { return };
        let Ok(v) = serde_json::from_str::<Value>(&text) else { return };
        let (Some(start), Some(end)) = (v["start_unix_ms"].as_u64(), v["end_unix_ms"].as_u64()) else { return };
        let now_unix = crate::host::tcp_host::unix_ms();
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
    pub(super) fn host_own_node(
        &self,
        run: &Arc<Run>,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<(Arc<Hosting>, Option<PendingReplicas>)> {
        let hosting = self.hosting_for(run, dir, shared, process)?;
        let logs = crate::host::open_node_logs(run, dir, self.node)?;
        let mut node = build_node(run, self.node, hosting.workload(), logs)?;
        let replicas = node.replicated.take().map(|(logs, _)| (logs, dir.join(raft_journal_file_name(self.node))));
        let started = hosting.serve_node(self.node, node, Duration::ZERO).map(|_| ());
        Ok((stop_unless_started(hosting, started)?, replicas))
    }

    /// After a restart in a replicated run: no node of its own (a follower took it over), its
    /// replicas reopened from their journal and rejoining their logs.
    pub(super) fn rejoin_replicas(
        &self,
        run: &Arc<Run>,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<Arc<Hosting>> {
        let hosting = self.hosting_for(run, dir, shared, process)?;
        let started = hosting.start_replication(Vec::new(), dir.join(raft_journal_file_name(self.node)));
        stop_unless_started(hosting, started)
    }

    /// What this process hosts in the run, with the workload of its incarnation (`process`).
    pub(super) fn hosting_for(
        &self,
        run: &Arc<Run>,
        dir: &Path,
        shared: RunShared,
        process: u16,
    ) -> anyhow::Result<Arc<Hosting>> {
        let workload = run.workload_of_process(process)?;
        let hosting = Hosting::new(run.clone(), self.node, self.cfg.clone(), workload, shared);
        hosting.record_takeovers_in(dir.join(takeovers_file_name(self.node)));
        Ok(hosting)
    }

    /// The run's shared state; under `--data-dir`, with its spec saved (so that a restarted
    /// server can take the run up again) and its history file open for appending.
    pub(super) fn run_shared(
        &self,
        spec: &BenchSpec,
        run_dir: Option<&Path>,
        resumed: bool,
    ) -> anyhow::Result<RunShared> {
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

    pub(super) fn start(&self) -> anyhow::Result<()> {
        let mut guard = self.run.lock();
        let run = guard.as_mut().context("start before prepare")?;
        let now = run.epoch.elapsed().as_nanos() as u64;
        let window = Window {
            start_ns: now + run.spec.warmup_us * 1000,
            end_ns: now + (run.spec.warmup_us + run.spec.duration_us) * 1000,
        };
        run.window = Some(window);
        if let Some(h) = &run.hosting {
            if let Some((logs, journal)) = run.pending_replicas.take() {
                if let Err(e) = h.start_replication(logs, journal) {
                    h.stop();
                    return Err(e);
                }
            }
            h.start_clients(window);
        }
        if let Some(dir) = &run.run_dir {
            // Where a restarted server finds how long the run still goes on.
            let now_unix = crate::host::tcp_host::unix_ms();
            let (start, end) =
                (now_unix + run.spec.warmup_us / 1000, now_unix + window.end_ns.saturating_sub(now) / 1_000_000);
            let text = json!({"start_unix_ms": start, "end_unix_ms": end}).to_string();
            crate::util::write_atomically(&dir.join(RUN_WINDOW_FILE), text.as_bytes())?;
        }
        sample_cpu(run, window);
        Ok(())
    }

    pub(super) fn wait(&self) -> anyhow::Result<WaitReply> {
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
                    return Ok(WaitReply {
                        ok: true,
                        totals,
                        history,
                        resumed: true,
                        serves,
                        takeovers,
                        ..Default::default()
                    });
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
        // As the window closes (within the 5 ms this loop sleeps), as the other runtimes take it.
        let replay_points_us = hosting.replay_points_us();
        while shared.running.load(Ordering::Acquire) > 0 && epoch.elapsed() < deadline {
            // A worker that panicked leaves its clients running forever.
            hosting.check_workers()?;
            std::thread::sleep(Duration::from_millis(5));
        }
        hosting.check_workers()?;
        let mut totals = Totals::default();
        let mut history: Vec<HistLine> = Vec::new();
        crate::host::collect(&shared, &mut totals, &mut history);
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
        Ok(WaitReply {
            ok: true,
            totals,
            history,
            stuck_workers: stuck as u64,
            serves: hosting.serves_a_node(),
            takeovers,
            replay_points_us,
            ..Default::default()
        })
    }

    /// What this server hosts in the current run (an error if it serves no node in it).
    pub(super) fn hosting(&self) -> anyhow::Result<Arc<Hosting>> {
        let guard = self.run.lock();
        let run = guard.as_ref().context("no run prepared on this node")?;
        run.hosting.clone().context(crate::host::tcp_host::SERVES_NO_NODE)
    }

    /// Run an after-run job on worker 0 of a node this server serves, and wait up to `limit`
    /// for `done` to take its result from where it reports. Fails with
    /// [`crate::host::tcp_host::SERVES_NO_NODE`] if the node is given up meanwhile (taken over by
    /// another host: its worker stopped with the job), so that the bench asks the server that
    /// serves a node now.
    pub(super) fn after_run_job<T>(
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
                bail!("{}: node {node} was given up during the {what}", crate::host::tcp_host::SERVES_NO_NODE);
            }
            if t0.elapsed() >= limit {
                bail!("the {what} did not finish within {} s (on node {node})", limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(super) fn final_read(&self) -> anyhow::Result<Value> {
        let take = |s: &RunShared| s.final_read.lock().take();
        match self.after_run_job(driver::final_read, "final read", FINAL_READ_WAIT, take)? {
            Ok(line) => Ok(json!({"line": line})),
            Err(e) => bail!("{e}"),
        }
    }

    pub(super) fn final_checks(&self) -> anyhow::Result<Value> {
        let take = |s: &RunShared| s.checks.lock().take();
        let findings = self.after_run_job(driver::final_checks, "final checks", FINAL_CHECKS_WAIT, take)?;
        Ok(json!({"findings": findings}))
    }

    pub(super) fn stop(&self) {
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
pub(super) fn sample_cpu(run: &ActiveRun, window: Window) {
    let (cpu, epoch) = (run.cpu.clone(), run.epoch);
    std::thread::spawn(move || {
        let at = |t_ns: u64| Duration::from_nanos(t_ns.saturating_sub(epoch.elapsed().as_nanos() as u64));
        std::thread::sleep(at(window.start_ns));
        cpu.lock().0 = Some(crate::util::process_cpu_us());
        std::thread::sleep(at(window.end_ns));
        cpu.lock().1 = Some(crate::util::process_cpu_us());
    });
}
