//! The servers the bench starts on this machine, and the nemesis that crashes, pauses, cuts
//! and delays them (random faults and `--fault-at`).

use super::*;
use crate::net::{FaultTarget, NodeId};

/// Server processes this bench started; shut down (then killed) when dropped.
pub(super) struct Spawned {
    pub(super) children: Arc<Mutex<Vec<std::process::Child>>>,
    /// How to start server `n` again (after the bench killed it).
    pub(super) commands: Vec<std::process::Command>,
    pub(super) dir: crate::util::TempDir,
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
pub(super) struct Reaper(pub(super) Arc<Mutex<Vec<std::process::Child>>>);

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
    pub(super) fn start(&mut self, n: usize) -> anyhow::Result<std::process::Child> {
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
    pub(super) fn nemesis(
        mut self,
        spec: &BenchSpec,
        addrs: Vec<SocketAddr>,
        t0: Instant,
    ) -> std::thread::JoinHandle<Nemesis> {
        let schedule = nemesis_schedule(spec, addrs.len());
        std::thread::spawn(move || {
            let mut events = Vec::new();
            for (at, target, action, down) in schedule {
                std::thread::sleep(at.saturating_sub(t0.elapsed()));
                let Some(node) = server_of(target, &addrs) else {
                    eprintln!("dtx: --fault-at {}: no server leads the log of {target} now; skipped", action.name());
                    continue;
                };
                let started = t0.elapsed();
                let undone = match action {
                    NemesisAction::Crash => self.crash(node, down),
                    NemesisAction::Pause => self.pause(node, down),
                    NemesisAction::Partition => partition(node, addrs.len(), down),
                    NemesisAction::Delay(by, worker, control) => delay(node, addrs[node], by, (worker, control), down),
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
    pub(super) fn crash(&mut self, n: usize, down: Duration) -> anyhow::Result<()> {
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
    pub(super) fn last_error(&self, n: usize) -> Option<String> {
        let log = std::fs::read_to_string(self.dir.0.join(format!("node{n}.log"))).ok()?;
        log.lines().rev().find(|l| l.contains("error")).map(str::to_string)
    }

    /// How server `n` exited, if it did.
    pub(super) fn exited(&self, n: usize) -> Option<std::process::ExitStatus> {
        self.children.lock().get_mut(n).and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stop server `n`'s process (SIGSTOP) for `down`, then let it go on (SIGCONT).
    pub(super) fn pause(&mut self, n: usize, down: Duration) -> anyhow::Result<()> {
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
pub(super) fn partition(n: usize, servers: usize, down: Duration) -> anyhow::Result<()> {
    netns::cut_off(n, servers)?;
    eprintln!("dtx: --faults partition: cut node {n}'s server off from the others; reconnecting it in {down:?}");
    std::thread::sleep(down);
    let dropped = netns::heal()?;
    eprintln!("dtx: --faults partition: reconnected node {n}'s server; the cut dropped {dropped} packets");
    Ok(())
}

/// What the nemesis does to a server.
#[derive(Clone, Copy, Debug)]
pub(super) enum NemesisAction {
    Crash,
    Pause,
    Partition,
    /// Hold what the server sends (only its worker's, if one is named; only its control
    /// messages, if asked) this much longer.
    Delay(Duration, Option<u16>, bool),
}

impl NemesisAction {
    pub(super) fn name(&self) -> &'static str {
        match self {
            NemesisAction::Crash => "crash",
            NemesisAction::Pause => "pause",
            NemesisAction::Partition => "partition",
            NemesisAction::Delay(..) => "delay",
        }
    }
}

/// The server a fault hits: server N, or the one whose replica leads node N's log in the
/// highest term, asked over each server's control connection when the fault starts (a server
/// that does not answer within a few seconds, stopped or down, is passed over).
fn server_of(target: FaultTarget, addrs: &[SocketAddr]) -> Option<usize> {
    let g = match target {
        FaultTarget::Node(n) => return Some(n as usize),
        FaultTarget::LeaderOf(g) => g,
    };
    let terms = addrs.iter().enumerate().filter_map(|(n, addr)| {
        let mut c = Control::connect(n, *addr, Duration::from_secs(1)).ok()?;
        let v = c.call_within(&json!({"cmd": "leads", "node": g}), Duration::from_secs(3)).ok()?;
        Some((v["term"].as_u64()?, n))
    });
    terms.max().map(|(_, n)| n)
}

/// The nemesis's plan, in time order: (when from the run's start, target, what, for how long).
/// `--faults`' random ones: every `fault_interval_us` from half of it after the warm-up, the
/// kinds asked for taking turns (from a random first one) on servers drawn from the seed, each
/// ending 100 ms before the run does; and `--fault-at`'s, one without a duration lasting until
/// the measured window ends.
pub(super) fn nemesis_schedule(
    spec: &BenchSpec,
    servers: usize,
) -> Vec<(Duration, FaultTarget, NemesisAction, Duration)> {
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
            let node = FaultTarget::Node(rng.gen_range(0..servers) as NodeId);
            // The kinds take turns (from a random first one), so a short run sees each.
            schedule.push((at, node, kinds[(first_kind + schedule.len()) % kinds.len()], down));
            at += every;
        }
    }
    let end_us = spec.warmup_us + spec.duration_us;
    for f in plan.targeted.iter().filter(|f| (f.target.node() as usize) < servers) {
        let action = match f.kind {
            crate::net::TargetedKind::Crash => NemesisAction::Crash,
            crate::net::TargetedKind::Pause => NemesisAction::Pause,
            crate::net::TargetedKind::Delay { by_us, worker, control } => {
                NemesisAction::Delay(Duration::from_micros(by_us), worker, control)
            }
            crate::net::TargetedKind::Partition => NemesisAction::Partition,
            // Refused by the CLI on tcp: simulated CPU and a simulated log's refusals have no
            // meaning for a real process.
            crate::net::TargetedKind::Cpu { .. } | crate::net::TargetedKind::LogFail => continue,
        };
        let lasts = Duration::from_micros(f.end_us(end_us) - f.at_us);
        schedule.push((Duration::from_micros(f.at_us), f.target, action, lasts));
    }
    schedule.sort_by_key(|s| s.0);
    schedule
}

/// Hold every message server `n` sends `by` longer, for `down`, through its control connection.
pub(super) fn delay(
    n: usize,
    addr: SocketAddr,
    by: Duration,
    (worker, control): (Option<u16>, bool),
    down: Duration,
) -> anyhow::Result<()> {
    let mut c = Control::connect(n, addr, Duration::from_secs(5))?;
    c.call(&json!({"cmd": "delay", "us": by.as_micros() as u64, "worker": worker, "control": control}))?;
    let what = worker.map_or("what it sends".to_string(), |w| format!("what its worker {w} sends"));
    eprintln!("dtx: --fault-at delay: node {n}'s server holds {what} {by:?} longer, for {down:?}");
    std::thread::sleep(down);
    c.call(&json!({"cmd": "delay", "us": 0}))?;
    eprintln!("dtx: --fault-at delay: node {n}'s server sends without delay again");
    Ok(())
}

/// What the fault thread hands back: the servers, and what it did to them.
pub(super) struct Nemesis {
    pub(super) spawned: Spawned,
    pub(super) events: Vec<FaultEvent>,
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
pub(super) fn spawn_cluster(spec: &BenchSpec) -> anyhow::Result<(ClusterConfig, Spawned)> {
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
