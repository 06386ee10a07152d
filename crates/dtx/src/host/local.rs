//! The `local` runtime: every node of the cluster as threads of this process.

use super::*;
use crate::rt::local;

/// How long a run whose window is over waits for room on a full disk (its log holding commits
/// back) before it gives them up and ends, failing.
pub const DISK_FULL_PATIENCE: Duration = Duration::from_secs(5);

/// Some node's log waits for room on a full disk: the file it waits for.
fn disk_full_file(nodes: &[Arc<NodeSetup>]) -> Option<std::path::PathBuf> {
    nodes.iter().flat_map(|n| n.logs.iter()).find_map(|l| l.disk_full_file())
}

/// Run every node as threads of this process.
pub fn run_local(spec: &BenchSpec) -> anyhow::Result<Outcome> {
    run_local_built(&Run::build(spec)?)
}

/// [`run_local`] of a run already built.
pub fn run_local_built(run: &Arc<Run>) -> anyhow::Result<Outcome> {
    let spec = &**run;
    crate::util::return_free_memory();
    let net = local::LocalNet::new(spec.nodes, spec.workers, spec.latency.clone());
    let shared = Arc::new(RunShared::default());
    let mut nodes = Vec::new();
    let workload = build_workload(spec)?;
    let (dir, _tmp) = data_dir(spec)?;
    for n in 0..spec.nodes {
        let logs = open_node_logs(spec, &dir, n)?;
        nodes.push(Arc::new(build_node(spec, n, &workload, logs)?));
    }
    let warm = Duration::from_micros(spec.warmup_us);
    let total = Duration::from_micros(spec.warmup_us + spec.duration_us);
    let start_ns = net.epoch.elapsed().as_nanos() as u64 + 20_000_000;
    let window = Window { start_ns: start_ns + warm.as_nanos() as u64, end_ns: start_ns + total.as_nanos() as u64 };
    let threads = spawn_workers(spec, &net, &shared, &nodes, window)?;
    let watched = watch(spec, &net, &shared, &nodes, window, total);
    let mut notes = Vec::new();
    if watched.failed.is_none() && shared.running.load(Ordering::Acquire) > 0 {
        notes.push("some clients were still running 120 s after the window closed".into());
    }
    if watched.failed.is_some() {
        notes.push(abandon_held_commits(&net, &shared, &nodes));
    }
    let mut final_read = None;
    // The final read and checks run on worker 0 of the first node that runs clients.
    let after = Addr::new(spec.topo.first_client_node(), 0);
    if spec.record_history && notes.is_empty() {
        let cmd = driver::after_run_command(driver::final_read, workload.clone(), shared.clone());
        net.inbox(after).push_command(cmd);
        driver::wait_until(Duration::from_secs(60), || shared.final_read.lock().is_some());
        final_read = shared.final_read.lock().take();
    }
    let mut findings = Vec::new();
    if spec.run_checks && notes.is_empty() {
        let cmd = driver::after_run_command(driver::final_checks, workload.clone(), shared.clone());
        net.inbox(after).push_command(cmd);
        driver::wait_until(Duration::from_secs(600), || shared.checks.lock().is_some());
        findings = finish_checks(&shared, &*workload);
    }
    let replay = if notes.is_empty() { replay_only(&net, after.node, spec.workers, &workload, &shared) } else { None };
    net.stop();
    for t in threads {
        let _ = t.join();
    }
    for n in &nodes {
        n.shutdown();
    }
    let mut totals = Totals::default();
    let mut history = Vec::new();
    collect(&shared, &mut totals, &mut history);
    totals.cpu_us = match (watched.cpu_at_start, watched.cpu_at_end) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    totals.findings = findings;
    totals.findings.extend(replay_finding(replay.as_ref()));
    totals.replay = replay;
    for (name, n) in std::mem::take(&mut *shared.replica_counters.lock()) {
        totals.counters.insert(name.to_string(), n);
    }
    let points = std::mem::take(&mut *shared.replay_points_us.lock());
    totals.replay_lag_us = super::metrics::replay_lag_us(&points);
    totals.resident_mib = watched.resident_mib;
    let failed = watched.failed;
    Ok(Outcome { totals, history, final_read, notes, restarts: 0, moved: 0, fault_events: Vec::new(), failed })
}

/// One thread per worker of every node, each running its protocol (and, on worker 0, the
/// node's replicas) until the run stops; returns once every worker has started.
fn spawn_workers(
    spec: &BenchSpec,
    net: &Arc<local::LocalNet>,
    shared: &Arc<RunShared>,
    nodes: &[Arc<NodeSetup>],
    window: Window,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let (proto_tx, proto_rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for n in 0..spec.nodes {
        for wi in 0..spec.workers {
            let (net, shared, node, spec2, tx) =
                (net.clone(), shared.clone(), nodes[n as usize].clone(), spec.clone(), proto_tx.clone());
            shared.running.fetch_add(1, Ordering::AcqRel);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("n{n}w{wi}"))
                    .spawn(move || {
                        let addr = Addr::new(n, wi);
                        let w = local::make_worker(&net, addr, &spec2.worker_config());
                        let proto = start_worker(&spec2, &node, &w, window, &shared);
                        let replicas = (wi == 0).then(|| start_local_replication(&node, &w, window, &shared)).flatten();
                        THREAD_WORKER.with(|t| *t.borrow_mut() = Some((w.clone(), proto)));
                        let _ = tx.send(());
                        local::run_worker(&net, &w);
                        if let Some(r) = &replicas {
                            count_replicas(r, &shared);
                        }
                        THREAD_WORKER.with(|t| t.borrow_mut().take());
                        // Free the run's tasks (a process runs many: `dtx bench`, experiments).
                        w.shutdown();
                    })
                    .context("cannot start a worker thread")?,
            );
        }
    }
    for _ in 0..threads.len() {
        let _ = proto_rx.recv_timeout(Duration::from_secs(10));
    }
    Ok(threads)
}

/// What the process measured over the window, and why the run failed, if it did.
struct Watched {
    cpu_at_start: Option<u64>,
    cpu_at_end: Option<u64>,
    resident_mib: Option<u64>,
    /// The run gave up the commits a full disk held past the window.
    failed: Option<String>,
}

/// Watch the run with a progress bar until its workers stop: the process's CPU time at the
/// window's start and end, its memory at the end, and a full disk that holds commits back too
/// long after the window.
fn watch(
    spec: &BenchSpec,
    net: &local::LocalNet,
    shared: &RunShared,
    nodes: &[Arc<NodeSetup>],
    window: Window,
    total: Duration,
) -> Watched {
    let pb = progress(&format!("{} local", spec.protocol), total.as_millis() as u64 + 20);
    let t0 = Instant::now();
    let mut cpu_at_start = None;
    let mut cpu_at_end = None;
    let mut resident_mib = None;
    // Past the window, on a full disk: since when, and the file. `failed`: the run gave the
    // commits the disk held up.
    let mut full_since: Option<Instant> = None;
    let mut failed = None;
    while shared.running.load(Ordering::Acquire) > 0 {
        std::thread::sleep(Duration::from_millis(10));
        let now = net.epoch.elapsed().as_nanos() as u64;
        if cpu_at_start.is_none() && now >= window.start_ns {
            cpu_at_start = Some(crate::util::process_cpu_us());
        }
        if cpu_at_end.is_none() && now >= window.end_ns {
            cpu_at_end = Some(crate::util::process_cpu_us());
            resident_mib = crate::util::resident_bytes().map(|b| b >> 20);
        }
        pb.set_position(t0.elapsed().as_millis() as u64);
        if now >= window.end_ns {
            match (disk_full_file(nodes), full_since) {
                (Some(file), None) => {
                    pb.suspend(|| {
                        eprintln!(
                            "dtx: {}: the window is over and the disk under {} is full: waiting up to {} s for room",
                            spec.protocol,
                            file.display(),
                            DISK_FULL_PATIENCE.as_secs()
                        )
                    });
                    full_since = Some(Instant::now());
                }
                (Some(file), Some(since)) if since.elapsed() > DISK_FULL_PATIENCE => {
                    let held = shared.held_for_log.load(Ordering::Relaxed);
                    let waiting = shared.clients_live.load(Ordering::Relaxed);
                    failed = Some(format!(
                        "the disk is full ({} could not be written): {held} commits were held, never acknowledged \
                         (clients still waiting for the log: {waiting}) {} s after the window ended",
                        file.display(),
                        DISK_FULL_PATIENCE.as_secs()
                    ));
                    break;
                }
                (None, Some(_)) => full_since = None,
                _ => {}
            }
        }
        if t0.elapsed() > total + Duration::from_secs(120) {
            break;
        }
    }
    pb.finish_and_clear();
    Watched { cpu_at_start, cpu_at_end, resident_mib, failed }
}

/// The run failed on a full disk: the clients stuck on the log stop waiting and report what
/// they hold as of unknown outcome; then the log is closed (a worker blocked on its memory
/// bound gets an error) and the workers stop. A worker that did not report by then loses its
/// counts. Returns the note that says so.
fn abandon_held_commits(net: &local::LocalNet, shared: &RunShared, nodes: &[Arc<NodeSetup>]) -> String {
    shared.abandon.store(true, Ordering::Release);
    driver::wait_until(Duration::from_secs(2), || shared.running.load(Ordering::Acquire) == 0);
    let unreported = shared.running.load(Ordering::Acquire);
    let note = format!(
        "no final read or checks: the run ended with commits held by a full disk{}",
        match unreported {
            0 => String::new(),
            n => format!("; the counts of {n} workers that did not stop waiting for it are lost"),
        }
    );
    net.stop();
    for n in nodes {
        n.shutdown();
    }
    note
}

/// Run every worker of `node` through its protocol's replay-only measurement at once, and
/// merge what they report (None when the protocol measures none).
fn replay_only(
    net: &local::LocalNet,
    node: NodeId,
    workers: u16,
    workload: &Arc<dyn Workload>,
    shared: &Arc<RunShared>,
) -> Option<crate::protocols::ReplayRun> {
    for wi in 0..workers {
        let cmd = driver::after_run_command(driver::replay_only, workload.clone(), shared.clone());
        net.inbox(Addr::new(node, wi)).push_command(cmd);
    }
    driver::wait_until(Duration::from_secs(600), || shared.replays.lock().len() >= workers as usize);
    let runs = std::mem::take(&mut *shared.replays.lock());
    crate::protocols::ReplayRun::merge(runs.into_iter().flatten())
}

/// A worker and the protocol instance running on it.
pub type WorkerPair = (Rc<Worker>, Rc<dyn WorkerProtocol>);

thread_local! {
    /// The worker running on this thread and its protocol instance, so that commands sent to
    /// the thread from outside (the final read) can reach them.
    pub static THREAD_WORKER: std::cell::RefCell<Option<WorkerPair>> = const { std::cell::RefCell::new(None) };
}
