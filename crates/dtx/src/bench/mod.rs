//! `dtx bench`: one specification of a run, executed on any runtime, reported the same way.

pub mod driver;
pub mod metrics;
pub mod tcp;
pub mod tcp_host;

use crate::cluster::Topology;
use crate::net::{Addr, FaultPlan, LatencyModel, NodeId};
use crate::protocols::{self, NodeEnv, NodeProtocol, ProtoOptions, WorkerProtocol};
use crate::replication::{Durability, DurabilityConfig};
use crate::rt::log::NodeLog;
use crate::rt::{local, sim::SimWorld, CpuCost, RpcConfig, Worker, WorkerConfig};
use crate::workloads::{self, Workload, WorkloadParams};
use anyhow::{bail, Context};
use driver::{DriverConfig, RunShared, Window};
use dtx_report::{LatencyUs, RunReport};
use metrics::{HistLine, Totals};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything that defines one protocol's run. It crosses process boundaries (tcp runtime).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchSpec {
    pub protocol: String,
    pub workload: WorkloadParams,
    pub runtime: String,
    pub nodes: u16,
    pub workers: u16,
    pub partitions_per_node: u32,
    pub inflight: u32,
    pub duration_us: u64,
    pub warmup_us: u64,
    pub latency: LatencyModel,
    pub faults: FaultPlan,
    pub seed: u64,
    pub cost: CpuCost,
    pub rpc: RpcConfig,
    pub proto: ProtoOptions,
    pub record_history: bool,
    /// Run the workload's final checks (TPC-C consistency, bank total) after the run.
    #[serde(default)]
    pub run_checks: bool,
    pub max_retries: u32,
    #[serde(default)]
    pub durability: DurabilityConfig,
    /// Each node's roles (`--roles`, or the cluster file); empty: every node holds data and
    /// runs clients.
    #[serde(default)]
    pub node_roles: Vec<crate::cluster::Roles>,
}

impl BenchSpec {
    /// A spec with the defaults `dtx bench` uses, for one protocol and workload.
    pub fn new(protocol: &str, workload: WorkloadParams, runtime: &str) -> Self {
        let record_history = workload.name == "append";
        BenchSpec {
            protocol: protocol.to_string(),
            workload,
            runtime: runtime.to_string(),
            nodes: 2,
            workers: 1,
            partitions_per_node: 1,
            inflight: 64,
            duration_us: 1_000_000,
            warmup_us: 100_000,
            latency: LatencyModel::default(),
            faults: FaultPlan { fault_interval_us: 200_000, fault_duration_us: 100_000, ..Default::default() },
            seed: 1,
            cost: CpuCost::default(),
            rpc: RpcConfig::default(),
            proto: ProtoOptions::default(),
            record_history,
            run_checks: false,
            max_retries: 1000,
            durability: DurabilityConfig::default(),
            node_roles: Vec::new(),
        }
    }

    /// Inject faults (simulator only); lossy links turn on RPC retransmission.
    pub fn with_faults(mut self, crashes: bool, partitions: bool, loss: f64) -> Self {
        self.faults.crashes = crashes;
        self.faults.partitions = partitions;
        self.faults.loss = loss;
        if self.faults.any() {
            self.rpc.retransmit_us = (self.latency.delay_us * 4).max(2_000);
            self.rpc.timeout_us = self.rpc.timeout_us.min(500_000);
        }
        self
    }

    /// The run's topology; `validate` has checked the roles it gives.
    pub fn topology(&self) -> Topology {
        self.try_topology().unwrap_or_else(|e| panic!("an unvalidated spec: {e:#}"))
    }

    fn try_topology(&self) -> anyhow::Result<Topology> {
        let mut t = Topology::new(self.nodes, self.workers, self.partitions_per_node);
        if !self.latency.node_region.is_empty() {
            t.node_region = self.latency.node_region.clone();
        }
        if !self.node_roles.is_empty() {
            t = t.with_roles(self.node_roles.clone())?;
        }
        Ok(t)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.nodes > 256 {
            bail!("--nodes {} must be between 1 and 256", self.nodes);
        }
        if self.workers == 0 || self.workers > 64 {
            bail!("--workers {} must be between 1 and 64", self.workers);
        }
        if self.inflight == 0 || self.inflight > 100_000 {
            bail!("--inflight {} must be between 1 and 100000", self.inflight);
        }
        if self.duration_us == 0 {
            bail!("--duration must be positive");
        }
        if !(0.0..=1.0).contains(&self.faults.loss) {
            bail!("loss probability {} must be within 0..1", self.faults.loss);
        }
        let topo = self.try_topology()?;
        let variant = protocols::Variant::parse(&self.protocol)?;
        variant.make().check_topology(&topo)?;
        workloads::build(&self.workload, &topo)?;
        self.durability.validate(self.nodes, self.faults.crashes)?;
        if self.runtime == "tcp" && self.faults.crashes && self.durability.mode == Durability::None {
            bail!("--faults crash on --runtime tcp kills a server: add --durability wal or replicated, or it loses its data");
        }
        Ok(())
    }

    fn worker_config(&self) -> WorkerConfig {
        WorkerConfig { seed: self.seed, cost: self.cost, rpc: self.rpc }
    }

    fn driver_config(&self, window: Window) -> DriverConfig {
        DriverConfig {
            inflight: self.inflight,
            max_retries: self.max_retries,
            record_history: self.record_history,
            window,
        }
    }
}

/// The run's protocol's log state machines, for the replicas of replicated logs.
pub fn machine_factory(spec: &BenchSpec) -> anyhow::Result<crate::replication::service::MachineFactory> {
    let protocol = protocols::Variant::parse_including_planned(&spec.protocol)?.make();
    protocol.log_machine(None)?;
    Ok(Arc::new(move || protocol.log_machine(None).expect("a fresh log machine was made before")))
}

/// A node's protocol state (storage loaded) and the workload it runs.
pub struct NodeSetup {
    pub proto: Arc<dyn NodeProtocol>,
    pub workload: Arc<dyn Workload>,
    pub topo: Arc<Topology>,
    /// With `--durability replicated`: the node's log and its replica count, for the replicator
    /// that worker 0 runs.
    pub replicated: Option<(Arc<NodeLog>, u16)>,
    /// The node's log, if the run is durable (shut down when the run ends).
    pub log: Option<Arc<NodeLog>>,
    /// The run's cluster id: logs and replication frames of another cluster are refused.
    pub cluster_id: u64,
    /// The protocol's log state machines, for the replicas its node's host keeps.
    pub machine: crate::replication::service::MachineFactory,
}

impl NodeSetup {
    /// The run is over: close the node's log (tasks left waiting at the end must not keep it,
    /// and its directory lock, open).
    pub fn shutdown(&self) {
        if let Some(l) = &self.log {
            l.shutdown();
        }
    }
}

/// The workload of a run: one instance per process, shared by the nodes it hosts, so that what a
/// workload records during the run (the bank's audits) meets in one place.
pub fn build_workload(spec: &BenchSpec) -> anyhow::Result<Arc<dyn Workload>> {
    workloads::build(&spec.workload, &spec.topology())
}

/// A node's log as opened: its newest checkpoint and the records after it (oldest first).
pub type OpenedLog = crate::replication::OpenedWal;

fn fresh_log(log: Arc<NodeLog>) -> OpenedLog {
    OpenedLog { log, checkpoint: None, records: Vec::new() }
}

/// The protocol instance and workload of every simulated worker, by worker index; a node that
/// restarts replaces its own.
type Protos = Rc<std::cell::RefCell<Vec<(Rc<dyn WorkerProtocol>, Arc<dyn Workload>)>>>;

/// Build a node: its protocol state over its storage, loaded, and (with a log) recovered from
/// the records the log holds.
pub fn build_node(
    spec: &BenchSpec,
    node: NodeId,
    workload: &Arc<dyn Workload>,
    log: Option<OpenedLog>,
) -> anyhow::Result<NodeSetup> {
    let topo = Arc::new(spec.topology());
    let workload = workload.clone();
    let variant = protocols::Variant::parse_including_planned(&spec.protocol)?;
    let mut env = NodeEnv::volatile(node, topo.clone(), workload.clone(), spec.proto.clone());
    let mut replicated = None;
    let node_log = log.as_ref().map(|o| o.log.clone());
    if let Some(opened) = log {
        if spec.durability.mode == Durability::Replicated {
            replicated = Some((opened.log.clone(), spec.durability.replicas));
        }
        env.log = Some(opened.log);
        env.recovered = opened.records;
        env.checkpoint = opened.checkpoint;
        env.checkpoint_every = spec.durability.checkpoint_every;
    }
    Ok(NodeSetup {
        proto: variant.make().build_node(env),
        workload,
        topo,
        replicated,
        log: node_log,
        cluster_id: spec.durability.cluster_id,
        machine: machine_factory(spec)?,
    })
}

/// Where the nodes of a real-time run keep their logs: the configured folder, or a temporary
/// one removed when the returned guard drops.
pub fn data_dir(spec: &BenchSpec) -> anyhow::Result<(std::path::PathBuf, Option<crate::util::TempDir>)> {
    match &spec.durability.data_dir {
        Some(d) => Ok((d.join(format!("{:016x}", spec.durability.cluster_id)), None)),
        None => {
            let t = crate::util::TempDir::new("wal").context("cannot create a temporary folder for the logs")?;
            Ok((t.0.clone(), Some(t)))
        }
    }
}

/// Open node `n`'s log for a real-time run (none when the run is not durable).
pub fn open_node_log(spec: &BenchSpec, dir: &std::path::Path, n: NodeId) -> anyhow::Result<Option<OpenedLog>> {
    match spec.durability.mode {
        Durability::None => Ok(None),
        Durability::Replicated => Ok(Some(fresh_log(NodeLog::replicated()))),
        Durability::Wal => {
            let opened = spec.durability.open_wal(dir.join(format!("node-{n}")), n)?;
            if let Some(c) = &opened.checkpoint {
                let protocol = protocols::Variant::parse_including_planned(&spec.protocol)?.make();
                if let Err(e) = protocol.log_machine(Some(c)) {
                    bail!(
                        "node {n}: the checkpoint in {} passed its checksum but {e:#}: it was written by \
                         another version of dtx or another protocol; use that one, or another --data-dir",
                        dir.join(format!("node-{n}")).display()
                    );
                }
            }
            Ok(Some(opened))
        }
    }
}

/// The partitions a worker's clients are homed at: the node's, rotated by worker index; on a
/// node that holds no data, every partition, rotated by the worker's place in the cluster.
pub fn homes(topo: &Topology, a: Addr) -> Vec<u32> {
    let mut h = topo.partitions_of(a.node);
    let mut r = a.worker as usize;
    if h.is_empty() {
        h = (0..topo.partitions()).collect();
        r += a.node as usize * topo.workers_per_node as usize;
    }
    let r = r % h.len().max(1);
    h.rotate_left(r);
    h
}

/// Attach a worker to its node's protocol: from now on it serves requests.
pub fn attach_worker(node: &NodeSetup, w: &Rc<Worker>) -> Rc<dyn WorkerProtocol> {
    let proto = node.proto.worker(w.clone());
    proto.start();
    proto
}

/// The `local` runtime's log replication: the node's worker 0 leads its log's group and
/// follows its peers' (nothing crashes there, so nothing fails over).
fn start_owner_led_replicator(node: &NodeSetup, w: &Rc<Worker>) {
    let Some((log, replicas)) = &node.replicated else { return };
    let seed = w.rng.borrow_mut().gen::<u64>();
    use crate::replication::service;
    let (host, nodes, mode) = (w.addr.node, node.topo.nodes, service::Mode::OwnerLeads);
    let started = service::ReplicaState::new(host, node.cluster_id, nodes, *replicas, mode, seed, node.machine.clone())
        .and_then(|state| service::start(w, Rc::new(std::cell::RefCell::new(state)), Some(log.clone()), None));
    if let Err(e) = started {
        crate::rt::log_warn(&format!("node {}: the log replicator did not start: {e}", w.addr.node));
    }
}

/// Start a worker's clients, if its protocol gives it the client role.
pub fn start_clients(
    spec: &BenchSpec,
    node: &NodeSetup,
    w: &Rc<Worker>,
    proto: &Rc<dyn WorkerProtocol>,
    window: Window,
    shared: &Arc<RunShared>,
) {
    if !node.proto.worker_roles(&node.topo, w.addr).contains(crate::cluster::Role::Client) {
        // Counted as a finished client set, so the run does not wait for it.
        shared.running.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let homes = homes(&node.topo, w.addr);
    driver::start(w, proto.clone(), node.workload.clone(), homes, spec.driver_config(window), shared.clone());
}

/// Attach a worker to its node's protocol and start its clients.
pub fn start_worker(
    spec: &BenchSpec,
    node: &NodeSetup,
    w: &Rc<Worker>,
    window: Window,
    shared: &Arc<RunShared>,
) -> Rc<dyn WorkerProtocol> {
    let proto = attach_worker(node, w);
    start_clients(spec, node, w, &proto, window, shared);
    proto
}

/// What a run produced, before it becomes a report.
pub struct Outcome {
    pub totals: Totals,
    pub history: Vec<HistLine>,
    pub final_read: Option<Result<HistLine, String>>,
    /// Committed transactions that gave up after the retry limit, stuck clients, etc.
    pub notes: Vec<String>,
    /// Crashes that lost a node's memory, each followed by recovery from its log (sim).
    pub restarts: u64,
    /// Nodes taken over by another host while their own was down (sim, replicated).
    pub moved: u64,
}

fn collect(shared: &RunShared, totals: &mut Totals, history: &mut Vec<HistLine>) {
    for m in shared.reports.lock().drain(..) {
        totals.add_metrics(&m);
        history.extend(m.history);
    }
}

/// A progress bar over `total` (seconds of run), hidden when stderr is not a terminal.
pub fn progress(label: &str, total_ms: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(Some(total_ms), indicatif::ProgressDrawTarget::stderr());
    pb.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} ms {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

/// Run in deterministic simulation.
pub fn run_sim(spec: &BenchSpec) -> anyhow::Result<Outcome> {
    let mut world = SimWorld::new(spec.nodes, spec.workers, spec.latency.clone(), spec.faults.clone(), spec.seed);
    let shared = Arc::new(RunShared::default());
    let window = Window { start_ns: spec.warmup_us * 1000, end_ns: (spec.warmup_us + spec.duration_us) * 1000 };
    let protos: Protos = Default::default();
    let workload = build_workload(spec)?;
    let rebuild = SimRebuild::new(spec, &workload, &shared, window, &protos);
    if spec.durability.mode == Durability::Wal && spec.faults.crashes {
        world.set_restart(sim_restart(rebuild.clone()), spec.worker_config());
    }
    let failover = (spec.durability.mode == Durability::Replicated).then(|| SimFailover::new(rebuild.clone()));
    if let Some(f) = &failover {
        world.set_failover(Box::new(f.clone()), spec.worker_config());
    }
    for n in 0..spec.nodes {
        let log = match spec.durability.mode {
            Durability::None => None,
            Durability::Replicated => Some(fresh_log(NodeLog::replicated())),
            Durability::Wal => {
                let log = NodeLog::simulated(Vec::new());
                world.set_log(n, log.clone(), spec.durability.group_commit_us, spec.durability.sim_fsync_us);
                Some(fresh_log(log))
            }
        };
        let mut node = build_node(spec, n, &workload, log)?;
        // With failover the replicator runs on the host's replication worker, not worker 0.
        let own_log = node.replicated.take().map(|(log, _)| log);
        let add_worker = |world: &mut SimWorld, addr: Addr| {
            let w = Rc::new(Worker::new(
                addr,
                spec.workers,
                world.clock(),
                world.executor_for(addr),
                &spec.worker_config(),
            ));
            world.add_worker(w.clone());
            w
        };
        for wi in 0..spec.workers {
            let w = add_worker(&mut world, Addr::new(n, wi));
            shared.running.fetch_add(1, Ordering::AcqRel);
            protos.borrow_mut().push((start_worker(spec, &node, &w, window, &shared), node.workload.clone()));
        }
        if let Some(f) = &failover {
            let addr = world.replication_addr(n);
            let w = add_worker(&mut world, addr);
            f.start_host(n, &w, own_log)?;
        }
    }
    let pb = progress(&format!("{} sim", spec.protocol), window.end_ns / 1_000_000);
    let mut busy_at_start = None;
    while world.now_ns() < window.end_ns {
        // Stop exactly at the window's start once, to read the CPU charged before it.
        let target = if busy_at_start.is_none() { window.start_ns } else { window.end_ns };
        let step = (world.now_ns() + 10_000_000).min(target);
        world.run_until(step, || false);
        if busy_at_start.is_none() && world.now_ns() >= window.start_ns {
            busy_at_start = Some(world.busy_ns);
        }
        pb.set_position(world.now_ns() / 1_000_000);
    }
    let busy_in_window_ns = world.busy_ns - busy_at_start.unwrap_or(0);
    pb.finish_and_clear();
    // Let in-flight transactions finish (bounded by the RPC timeout and retries).
    world.heal_all();
    let drain_limit = window.end_ns + 120_000_000_000;
    let mut notes = Vec::new();
    if !world.run_until(drain_limit, || shared.running.load(Ordering::Acquire) == 0) {
        notes.push("some clients were still running 120 s (virtual) after the window closed".into());
    }
    if failover.is_some() {
        // The final read and checks need every node served again: wait for the takeovers.
        let limit = world.now_ns() + 60_000_000_000;
        while !world.all_nodes_up() && world.now_ns() < limit {
            let step = world.now_ns() + 10_000_000;
            world.run_until(step, || false);
        }
        if !world.all_nodes_up() {
            notes.push("a node was still not served by any host 60 s (virtual) after the faults healed".into());
        }
    }
    if spec.faults.any() {
        notes.push(format!(
            "faults: {} of {} packets dropped (loss, partitions, stopped nodes); {} crashes lost a node's memory; {} \
             nodes were taken over by a replica of their log",
            world.packets_dropped,
            world.packets_dropped + world.packets_delivered,
            world.restarts,
            world.failovers
        ));
    }
    let mut totals = Totals::default();
    let mut history = Vec::new();
    collect(&shared, &mut totals, &mut history);
    let mut final_read = None;
    if spec.record_history {
        let done = || shared.final_read.lock().is_some();
        run_after(&mut world, &protos, 120_000_000_000, &done, &|w, p, wl| {
            driver::final_read(w, p, wl, shared.clone())
        });
        final_read = shared.final_read.lock().take();
    }
    if spec.run_checks {
        let done = || shared.checks.lock().is_some();
        run_after(&mut world, &protos, 600_000_000_000, &done, &|w, p, wl| {
            driver::final_checks(w, p, wl, shared.clone())
        });
        totals.findings = finish_checks(&shared, &*workload);
    }
    // Simulated CPU: the work charged to all workers during the window.
    totals.cpu_us = busy_in_window_ns / 1000;
    totals.failovers = world.failovers;
    totals.failover_ms = world.failover_ns.iter().map(|ns| *ns as f64 / 1e6).collect();
    Ok(Outcome { totals, history, final_read, notes, restarts: world.restarts, moved: world.moved })
}

/// A job started on a worker after the run, as `driver::final_read` is.
type AfterRunJob<'a> = dyn Fn(&Rc<Worker>, Rc<dyn WorkerProtocol>, Arc<dyn Workload>) + 'a;

/// Run an after-run job (the final read, the final checks) on worker 0 of node 0 until `done`
/// or `limit_ns` more of virtual time. With failover, node 0 may be taken over meanwhile (a
/// leadership change after the faults healed), which ends the job with its incarnation: it is
/// started again on the new one.
fn run_after(world: &mut SimWorld, protos: &Protos, limit_ns: u64, done: &dyn Fn() -> bool, job: &AfterRunJob<'_>) {
    let limit = world.now_ns() + limit_ns;
    let mut running_on: Option<Rc<Worker>> = None;
    while !done() && world.now_ns() < limit {
        let w0 = world.worker(Addr::new(0, 0)).clone();
        if !running_on.as_ref().is_some_and(|w| Rc::ptr_eq(w, &w0)) {
            let (p, wl) = protos.borrow()[0].clone();
            job(&w0, p, wl);
            running_on = Some(w0);
        }
        let step = (world.now_ns() + 10_000_000).min(limit);
        world.run_until(step, done);
    }
}

/// Failover of replicated nodes in the simulator (see `rt::sim::Failover`): the hosts' replica
/// states (kept across crashes), their running replicators, and how a node is rebuilt from the
/// replica of its log that a new leader holds.
#[derive(Clone)]
struct SimFailover(Rc<std::cell::RefCell<FailoverState>>);

struct FailoverState {
    rebuild: SimRebuild,
    states: Vec<Rc<std::cell::RefCell<crate::replication::service::ReplicaState>>>,
    replicators: Vec<Option<crate::replication::service::ReplicatorHandle>>,
    requests: crate::replication::service::AdoptRequests,
}

impl SimFailover {
    fn new(rebuild: SimRebuild) -> Self {
        SimFailover(Rc::new(std::cell::RefCell::new(FailoverState {
            rebuild,
            states: Vec::new(),
            replicators: Vec::new(),
            requests: Default::default(),
        })))
    }

    /// Create host `n`'s replicas and start its replicator on `w`, serving its own node.
    fn start_host(&self, n: NodeId, w: &Rc<Worker>, own_log: Option<Arc<NodeLog>>) -> anyhow::Result<()> {
        use crate::replication::service;
        let mut me = self.0.borrow_mut();
        let spec = &me.rebuild.spec;
        let seed = spec.seed ^ 0x7265_706c ^ ((n as u64) << 24);
        let d = &spec.durability;
        let machine = machine_factory(spec)?;
        let state = service::ReplicaState::new(
            n,
            d.cluster_id,
            spec.nodes,
            d.replicas,
            service::Mode::Failover,
            seed,
            machine,
        )?;
        let state = Rc::new(std::cell::RefCell::new(state));
        me.states.push(state.clone());
        let r = service::start(w, state, own_log, Some(me.requests.clone()))?;
        me.replicators.push(Some(r));
        Ok(())
    }
}

impl crate::rt::sim::Failover for SimFailover {
    fn host_crashed(&mut self, host: u16) {
        if let Some(r) = self.0.borrow_mut().replicators[host as usize].take() {
            r.borrow_mut().stop();
        }
    }

    fn host_restarted(&mut self, host: u16, w: &Rc<Worker>) {
        let mut me = self.0.borrow_mut();
        let state = me.states[host as usize].clone();
        match crate::replication::service::start(w, state, None, Some(me.requests.clone())) {
            Ok(r) => me.replicators[host as usize] = Some(r),
            Err(e) => crate::rt::log_warn(&format!("host {host}: the log replicator did not restart: {e}")),
        }
    }

    fn take_requests(&mut self) -> Vec<(u16, u16)> {
        let q = self.0.borrow().requests.clone();
        let taken = std::mem::take(&mut *q.borrow_mut());
        taken
    }

    fn adopt(&mut self, node: u16, host: u16, workers: &[Rc<Worker>]) -> bool {
        let me = self.0.borrow();
        let Some(r) = me.replicators[host as usize].clone() else { return false };
        let Some(state) = r.borrow().adoptable_state(node) else {
            r.borrow_mut().adoption_refused(node);
            return false;
        };
        let log = NodeLog::replicated();
        let opened = OpenedLog { log: log.clone(), checkpoint: Some(state), records: Vec::new() };
        me.rebuild.rebuild(node, opened, workers);
        for (other, r2) in me.replicators.iter().enumerate() {
            if let (Some(r2), false) = (r2, other == host as usize) {
                r2.borrow_mut().forget(node);
            }
        }
        r.borrow_mut().serve(node, log);
        true
    }
}

/// What the simulator needs to rebuild a node on fresh workers: after a crash that lost its
/// memory (from its disk, `--durability wal`) or at a failover (from a replica of its log).
#[derive(Clone)]
struct SimRebuild {
    spec: BenchSpec,
    workload: Arc<dyn Workload>,
    shared: Arc<RunShared>,
    window: Window,
    protos: Protos,
}

impl SimRebuild {
    fn new(
        spec: &BenchSpec,
        workload: &Arc<dyn Workload>,
        shared: &Arc<RunShared>,
        window: Window,
        protos: &Protos,
    ) -> Self {
        SimRebuild {
            spec: spec.clone(),
            workload: workload.clone(),
            shared: shared.clone(),
            window,
            protos: protos.clone(),
        }
    }

    /// Recover node `n` from `opened` on `workers`, start their clients, and put their protocol
    /// instances where the after-run jobs find them. In the simulator a log's replicator runs on
    /// its host's replication worker, never on the node's worker 0.
    fn rebuild(&self, n: NodeId, opened: OpenedLog, workers: &[Rc<Worker>]) {
        let mut node =
            build_node(&self.spec, n, &self.workload, Some(opened)).expect("a node that built once builds again");
        node.replicated = None;
        for w in workers {
            self.shared.running.fetch_add(1, Ordering::AcqRel);
            let proto = start_worker(&self.spec, &node, w, self.window, &self.shared);
            let i = n as usize * self.spec.workers as usize + w.addr.worker as usize;
            self.protos.borrow_mut()[i] = (proto, node.workload.clone());
        }
    }
}

/// How the simulator rebuilds a node whose crash lost its memory: recover it from what its
/// disk kept, on fresh workers, and start their clients again.
fn sim_restart(rebuild: SimRebuild) -> crate::rt::sim::Restart {
    Box::new(move |n, kept, workers| {
        let log = NodeLog::simulated(kept.clone());
        rebuild.rebuild(n, OpenedLog { log: log.clone(), checkpoint: None, records: kept }, workers);
        log
    })
}

/// Run every node as threads of this process.
pub fn run_local(spec: &BenchSpec) -> anyhow::Result<Outcome> {
    crate::util::return_free_memory();
    let net = local::LocalNet::new(spec.nodes, spec.workers, spec.latency.clone());
    let shared = Arc::new(RunShared::default());
    let mut nodes = Vec::new();
    let workload = build_workload(spec)?;
    let (dir, _tmp) = data_dir(spec)?;
    for n in 0..spec.nodes {
        let log = open_node_log(spec, &dir, n)?;
        nodes.push(Arc::new(build_node(spec, n, &workload, log)?));
    }
    let warm = Duration::from_micros(spec.warmup_us);
    let total = Duration::from_micros(spec.warmup_us + spec.duration_us);
    let start_ns = net.epoch.elapsed().as_nanos() as u64 + 20_000_000;
    let window = Window { start_ns: start_ns + warm.as_nanos() as u64, end_ns: start_ns + total.as_nanos() as u64 };
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
                        if wi == 0 {
                            start_owner_led_replicator(&node, &w);
                        }
                        THREAD_WORKER.with(|t| *t.borrow_mut() = Some((w.clone(), proto)));
                        let _ = tx.send(());
                        local::run_worker(&net, &w);
                        THREAD_WORKER.with(|t| t.borrow_mut().take());
                    })
                    .context("cannot start a worker thread")?,
            );
        }
    }
    for _ in 0..threads.len() {
        let _ = proto_rx.recv_timeout(Duration::from_secs(10));
    }
    let pb = progress(&format!("{} local", spec.protocol), total.as_millis() as u64 + 20);
    let t0 = Instant::now();
    let mut cpu_at_start = None;
    let mut cpu_at_end = None;
    while shared.running.load(Ordering::Acquire) > 0 {
        std::thread::sleep(Duration::from_millis(10));
        let now = net.epoch.elapsed().as_nanos() as u64;
        if cpu_at_start.is_none() && now >= window.start_ns {
            cpu_at_start = Some(crate::util::process_cpu_us());
        }
        if cpu_at_end.is_none() && now >= window.end_ns {
            cpu_at_end = Some(crate::util::process_cpu_us());
        }
        pb.set_position(t0.elapsed().as_millis() as u64);
        if t0.elapsed() > total + Duration::from_secs(120) {
            break;
        }
    }
    pb.finish_and_clear();
    let mut notes = Vec::new();
    if shared.running.load(Ordering::Acquire) > 0 {
        notes.push("some clients were still running 120 s after the window closed".into());
    }
    let mut final_read = None;
    if spec.record_history && notes.is_empty() {
        let cmd = driver::after_run_command(driver::final_read, workload.clone(), shared.clone());
        net.inbox(Addr::new(0, 0)).push_command(cmd);
        driver::wait_until(Duration::from_secs(60), || shared.final_read.lock().is_some());
        final_read = shared.final_read.lock().take();
    }
    let mut findings = Vec::new();
    if spec.run_checks && notes.is_empty() {
        let cmd = driver::after_run_command(driver::final_checks, workload.clone(), shared.clone());
        net.inbox(Addr::new(0, 0)).push_command(cmd);
        driver::wait_until(Duration::from_secs(600), || shared.checks.lock().is_some());
        findings = finish_checks(&shared, &*workload);
    }
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
    totals.cpu_us = match (cpu_at_start, cpu_at_end) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    totals.findings = findings;
    Ok(Outcome { totals, history, final_read, notes, restarts: 0, moved: 0 })
}

/// A worker and the protocol instance running on it.
pub type WorkerPair = (Rc<Worker>, Rc<dyn WorkerProtocol>);

thread_local! {
    /// The worker running on this thread and its protocol instance, so that commands sent to
    /// the thread from outside (the final read) can reach them.
    pub static THREAD_WORKER: std::cell::RefCell<Option<WorkerPair>> = const { std::cell::RefCell::new(None) };
}

/// The final checks' findings (or a failure saying they did not finish), and what this process
/// recorded during the run.
pub fn finish_checks(shared: &RunShared, workload: &dyn Workload) -> Vec<(String, bool, String)> {
    let mut f = shared
        .checks
        .lock()
        .take()
        .unwrap_or_else(|| vec![("final checks".to_string(), false, "did not finish".to_string())]);
    f.extend(workload.process_findings());
    f
}

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

/// Write the history and check it: serializable, and the final read-all committed (so every
/// acknowledged append can be looked for). Returns the checker's report and a problem, if any.
pub fn verify(o: &Outcome, path: &std::path::Path) -> anyhow::Result<(dtx_check::CheckReport, Option<String>)> {
    write_history(o, path)?;
    let report = dtx_check::check_file(path)?;
    let problem = match &o.final_read {
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
    let mut params = std::collections::BTreeMap::new();
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
    let mut extra = std::collections::BTreeMap::new();
    if let Some(n) = t.by_kind.get("new-order") {
        extra.insert("new_order_tps".to_string(), *n as f64 / secs);
    }
    if t.gave_up > 0 {
        extra.insert("gave_up".to_string(), t.gave_up as f64);
    }
    if t.log_waits > 0 {
        // The latency breakdown durability asks for: how long a commit waited for its log
        // record (group commit delay + fsync), beside the end-to-end percentiles.
        extra.insert("log_wait_us_mean".to_string(), t.log_wait_ns as f64 / t.log_waits as f64 / 1000.0);
        extra.insert("log_waits_per_txn".to_string(), per(t.log_waits));
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
    RunReport {
        protocol: spec.protocol.clone(),
        workload: spec.workload.name.clone(),
        runtime: spec.runtime.clone(),
        nodes: spec.nodes as u32,
        duration_s: secs,
        committed: t.committed,
        aborted: t.aborted(),
        throughput_tps: t.committed as f64 / secs,
        abort_rate: if attempts > 0 { t.aborted() as f64 / attempts as f64 } else { 0.0 },
        latency_us: LatencyUs {
            p50: h.value_at_quantile(0.50) as f64,
            p95: h.value_at_quantile(0.95) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            max: h.max() as f64,
        },
        msgs_per_txn: per(t.msgs),
        bytes_per_txn: per(t.bytes),
        aborts_by_reason: t.aborts.clone(),
        params,
        verified,
        cpu_us_per_txn: (t.cpu_us > 0 && t.committed > 0).then(|| t.cpu_us as f64 / t.committed as f64),
        throughput_per_s: t.per_sec.iter().map(|c| *c as f64).collect(),
        extra,
        counters: t.counters.clone(),
    }
}
