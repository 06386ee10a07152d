//! Running a cluster: the specification of one protocol's run, building its nodes from the
//! protocol (storage loaded, log recovered), starting their workers and the driver's clients,
//! and adopting a node whose host failed, on each runtime: [`sim`] (deterministic simulation),
//! [`local`] (threads of one process), [`tcp`] (one `dtx server` process per node, the servers'
//! side in [`tcp_host`]; [`netns`] is the private network of `--faults partition` there). The bench above it chooses what to run and reports it.

pub mod acks;
pub mod driver;
pub mod local;
pub mod metrics;
pub mod netns;
pub mod sim;
pub mod tcp;
pub mod tcp_host;

pub use local::{run_local, run_local_built, WorkerPair, THREAD_WORKER};
pub use sim::{run_sim, run_sim_built};

use crate::cluster::Topology;
use crate::net::{Addr, FaultPlan, LatencyModel, NodeId};
use crate::protocols::{self, NodeEnv, NodeProtocol, ProtoOptions, WorkerProtocol};
use crate::replication::{Durability, DurabilityConfig};
use crate::rt::log::NodeLog;
use crate::rt::{sim::SimWorld, ClockSkew, CpuCost, RpcConfig, Worker, WorkerConfig};
use crate::workloads::{self, Workload, WorkloadParams};
use anyhow::{bail, Context};
use driver::{DriverConfig, RunShared, Window};
use metrics::{HistLine, Totals};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Commits per worker that may wait for the log while their clients go on, by default: enough
/// for the flush latency of a disk that syncs in a few milliseconds at hundreds of thousands of
/// commits per second (one worker at 200k commits/s and a 10 ms flush holds 2,000).
pub const DEFAULT_MAX_UNACKED: u32 = 4096;
/// The most `--max-unacked` may say: the commits wait in memory with their requests.
pub const MAX_UNACKED_LIMIT: u32 = 1 << 20;

/// Where a run's nodes run: the deterministic simulator, threads of one process, or one
/// `dtx server` process per node over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Sim,
    Local,
    Tcp,
}

impl std::str::FromStr for Runtime {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "sim" => Ok(Runtime::Sim),
            "local" => Ok(Runtime::Local),
            "tcp" => Ok(Runtime::Tcp),
            _ => bail!("unknown runtime `{s}`: use sim, local or tcp"),
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Runtime::Sim => "sim",
            Runtime::Local => "local",
            Runtime::Tcp => "tcp",
        })
    }
}

/// The most open-loop arrivals per second a client node takes (`--rate`): far above what one
/// node commits, low enough that counting a backlog stays cheap.
pub const MAX_RATE_PER_NODE: f64 = 100_000_000.0;

/// Everything that defines one protocol's run. It crosses process boundaries (tcp runtime).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchSpec {
    pub protocol: String,
    pub workload: WorkloadParams,
    pub runtime: Runtime,
    pub nodes: u16,
    pub workers: u16,
    pub partitions_per_node: u32,
    pub inflight: u32,
    /// Open-loop arrivals per second at each client node (`--rate`, Poisson); 0: closed loop,
    /// `inflight` transactions always in flight per worker.
    #[serde(default)]
    pub rate_per_node: f64,
    /// Commits per worker that may wait for the log while their clients go on (`--max-unacked`,
    /// see `host::acks`); 0: every client waits for its own commit's flush.
    pub max_unacked: u32,
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
    /// The skew injected into the nodes' wall clocks (`--clock-skew-us`, see [`ClockSkew`]).
    #[serde(default)]
    pub clock_skew_us: u64,
    /// How much faster the last node's wall clock runs than node 0's, in millionths
    /// (`--clock-drift`, see [`ClockSkew`]).
    #[serde(default)]
    pub clock_drift_ppm: u64,
    /// Where partitions' copies live (`--placement`; the protocol must keep them).
    #[serde(default)]
    pub placement: crate::cluster::Placement,
}

impl BenchSpec {
    /// A spec with the defaults `dtx bench` uses, for one protocol and workload.
    pub fn new(protocol: &str, workload: WorkloadParams, runtime: Runtime) -> Self {
        let record_history = workload.name == "append";
        BenchSpec {
            protocol: protocol.to_string(),
            workload,
            runtime,
            nodes: 2,
            workers: 1 + service_workers(protocol),
            partitions_per_node: 1,
            inflight: 64,
            rate_per_node: 0.0,
            max_unacked: DEFAULT_MAX_UNACKED,
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
            placement: crate::cluster::Placement::Single,
            clock_skew_us: 0,
            clock_drift_ppm: 0,
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

    /// The run's topology: its nodes, their roles and regions as given, or else as the
    /// protocol's default layout has them ([`protocols::Protocol::default_layout`]).
    fn try_topology(&self) -> anyhow::Result<Topology> {
        let protocol = protocols::Variant::parse_including_planned(&self.protocol).ok().map(|v| v.make());
        self.topology_under(protocol.as_deref())
    }

    /// The topology of this spec run by `protocol` (none: an unknown name, which validation
    /// names): roles and regions as given, or else as its default layout has them.
    fn topology_under(&self, protocol: Option<&dyn protocols::Protocol>) -> anyhow::Result<Topology> {
        let mut t = Topology::new(self.nodes, self.workers, self.partitions_per_node);
        let given_all = !self.node_roles.is_empty() && !self.latency.node_region.is_empty();
        let layout = match protocol {
            Some(p) if !given_all => p.default_layout(self.nodes),
            _ => protocols::Layout::default(),
        };
        let regions = if self.latency.node_region.is_empty() { &layout.regions } else { &self.latency.node_region };
        if !regions.is_empty() {
            t.node_region = regions.clone();
        }
        t.region_delay_us = self.latency.region_delay_us.clone();
        let roles = if self.node_roles.is_empty() { &layout.roles } else { &self.node_roles };
        if !roles.is_empty() {
            t = t.with_roles(roles.clone())?;
        }
        if self.placement != crate::cluster::Placement::Single {
            t = t.with_placement(self.placement)?;
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
        if !(0.0..=MAX_RATE_PER_NODE).contains(&self.rate_per_node) {
            bail!(
                "--rate {} must be between 0 (closed loop) and {MAX_RATE_PER_NODE} transactions a second",
                self.rate_per_node
            );
        }
        if self.max_unacked > MAX_UNACKED_LIMIT {
            bail!("--max-unacked {} must be at most {MAX_UNACKED_LIMIT}", self.max_unacked);
        }
        if self.duration_us == 0 {
            bail!("--duration must be positive");
        }
        if self.clock_drift_ppm > 100_000 {
            bail!("--clock-drift {} ppm is more than 10%: give at most 100000", self.clock_drift_ppm);
        }
        if self.clock_skew_us > 60_000_000 {
            bail!("--clock-skew {} µs is more than a minute: give at most 60s", self.clock_skew_us);
        }
        if !(0.0..=1.0).contains(&self.faults.loss) {
            bail!("loss probability {} must be within 0..1", self.faults.loss);
        }
        let election_us = self.durability.election_timeout_us;
        let range = crate::replication::ELECTION_TIMEOUT_RANGE_US;
        if !range.contains(&election_us) || election_us % crate::replication::service::TICK_US != 0 {
            bail!(
                "the election timeout ({election_us} us) must be {} to {} us, a multiple of the {} us tick",
                range.start(),
                range.end(),
                crate::replication::service::TICK_US
            );
        }
        let protocol = protocols::Variant::parse(&self.protocol)?.make();
        let topo = self.topology_under(Some(&*protocol))?;
        protocol.check_topology(&topo)?;
        protocol.check_durability(self.durability.mode, self.durability.replicas)?;
        if !protocol.keeps_copies(self.placement) {
            bail!(
                "protocol `{}` keeps one copy of each partition: it cannot run --placement {} (the other copies \
                 would never be written); use --placement single",
                self.protocol,
                self.placement
            );
        }
        let logs = protocol.logs(&topo);
        let max_logs = crate::replication::service::MAX_LOGS_PER_NODE;
        if self.durability.mode == Durability::Replicated && logs > max_logs {
            bail!(
                "protocol `{}` keeps {logs} logs per node; --durability replicated replicates at most {max_logs}",
                self.protocol
            );
        }
        let workload = workloads::build(&self.workload, &topo)?;
        protocol.check_workload(&*workload)?;
        if self.runtime == Runtime::Local && !self.faults.targeted.is_empty() {
            bail!("--fault-at acts in the simulator and on tcp servers: add --runtime sim or tcp");
        }
        if let Some(f) = self.faults.targeted.iter().find(|f| f.target.node() >= self.nodes) {
            bail!("a {} fault names node {} of a run of {} nodes", f.kind.name(), f.target.node(), self.nodes);
        }
        let leader = self.faults.targeted.iter().find(|f| matches!(f.target, crate::net::FaultTarget::LeaderOf(_)));
        if let (Some(f), false) = (leader, self.durability.mode == Durability::Replicated) {
            bail!("a {} fault on {} needs --durability replicated", f.kind.name(), f.target);
        }
        self.durability.validate(self.nodes, self.faults.may_crash())?;
        if self.runtime == Runtime::Tcp && self.faults.may_crash() && self.durability.mode == Durability::None {
            bail!("--faults crash on --runtime tcp kills a server: add --durability wal or replicated, or it loses its data");
        }
        Ok(())
    }

    pub(crate) fn worker_config(&self) -> WorkerConfig {
        let clocks = ClockSkew { skew_us: self.clock_skew_us, drift_ppm: self.clock_drift_ppm, nodes: self.nodes };
        WorkerConfig { seed: self.seed, cost: self.cost, rpc: self.rpc, clocks }
    }

    /// The driver of one worker, `client_workers` of whose node run clients.
    fn driver_config(&self, window: Window, client_workers: u16) -> DriverConfig {
        DriverConfig {
            inflight: self.inflight,
            arrivals_per_s: self.rate_per_node / f64::from(client_workers.max(1)),
            max_unacked: self.max_unacked,
            max_retries: self.max_retries,
            record_history: self.record_history,
            window,
            abandonable: self.runtime == Runtime::Local,
        }
    }
}

impl BenchSpec {
    /// This spec with a durability its protocol runs with, for a sweep that runs every
    /// protocol: a protocol that refuses the spec's (`rolis` without replicated logs) gets
    /// replicated logs, 3 replicas or one per node.
    pub fn with_durability_its_protocol_takes(mut self) -> Self {
        let Ok(v) = protocols::Variant::parse_including_planned(&self.protocol) else { return self };
        if v.make().check_durability(self.durability.mode, self.durability.replicas).is_err() {
            self.durability.mode = Durability::Replicated;
            self.durability.replicas = self.nodes.min(3);
        }
        self
    }
}

/// A run as built once from its spec: the protocol parsed and made, the topology laid out, the
/// logs a node keeps counted. Every runtime builds it on entry (a `tcp` server when the bench
/// prepares it) and hands it to what builds and recovers nodes, so that nothing works the run
/// out again from the spec's strings. The spec stays the wire form; a `Run` reads as its spec.
pub struct Run {
    pub spec: BenchSpec,
    /// The protocol as its name and options say (planned protocols too: tests run them). A
    /// node, or a host's log machines, is built from an instance of its own (`variant.make()`):
    /// some keep state per host.
    pub variant: protocols::Variant,
    /// An instance of the protocol to ask about the run (its topology, its logs, its
    /// guarantee); it builds no node. (`protocol`, through the spec, is the variant's name.)
    pub instance: Arc<dyn protocols::Protocol>,
    pub topo: Arc<Topology>,
    /// How many logs each node keeps: 0 when the run is not durable.
    pub logs_per_node: u16,
}

impl std::ops::Deref for Run {
    type Target = BenchSpec;
    fn deref(&self) -> &BenchSpec {
        &self.spec
    }
}

impl Run {
    /// Build the run of `spec`: its protocol, its topology (which the protocol must accept:
    /// calvin wants a worker beside its scheduler) and its logs per node.
    pub fn build(spec: &BenchSpec) -> anyhow::Result<Arc<Run>> {
        let variant = protocols::Variant::parse_including_planned(&spec.protocol)?;
        let protocol = variant.make();
        let topo = spec.topology_under(Some(&*protocol))?;
        protocol.check_topology(&topo)?;
        let logs_per_node = match spec.durability.mode {
            Durability::None => 0,
            _ => protocol.logs(&topo),
        };
        Ok(Arc::new(Run { spec: spec.clone(), variant, instance: protocol, topo: Arc::new(topo), logs_per_node }))
    }

    /// What the run's protocol promises, as it is configured: what `--verify` checks.
    pub fn guarantee(&self) -> protocols::Guarantee {
        self.instance.weakened_guarantee().unwrap_or(self.variant.info.guarantee)
    }

    /// The workload of the run as process `process` of it runs it (a restarted server is a new
    /// process, whose appends must not repeat the old one's).
    pub fn workload_of_process(&self, process: u16) -> anyhow::Result<Arc<dyn Workload>> {
        let mut params = self.spec.workload.clone();
        params.process = process;
        workloads::build(&params, &self.topo)
    }
}

/// The workers a node runs for `protocol`'s own roles beside its client workers (0 for an
/// unknown name: validation names that problem).
pub fn service_workers(protocol: &str) -> u16 {
    protocols::Variant::parse_including_planned(protocol).map_or(0, |v| v.make().service_workers())
}

/// The run's protocol's log state machines, for the replicas of replicated logs: each built
/// for its log, with the cluster's topology and the workload's procedures.
pub fn machine_factory(
    run: &Run,
    workload: &Arc<dyn Workload>,
) -> anyhow::Result<crate::replication::service::MachineFactory> {
    // A protocol instance of its own: a host's log machines share theirs (Silo's replica of a
    // node), and a new incarnation of the host must not find the old one's.
    let protocol = run.variant.make();
    let (topo, workload) = (run.topo.clone(), workload.clone() as Arc<dyn crate::txn::Procedures>);
    let env_of = move |log: crate::replication::service::LogId| protocols::MachineEnv {
        node: log.node,
        log: log.log,
        topo: topo.clone(),
        workload: workload.clone(),
    };
    protocol.log_machine(&env_of(crate::replication::service::LogId::new(0, 0)), None)?;
    Ok(Arc::new(move |log, snapshot: Option<&[u8]>| protocol.log_machine(&env_of(log), snapshot)))
}

/// What host `host`'s replicas of the run's replicated logs are (failover mode: `sim`, `tcp`).
pub fn failover_replica_setup(
    run: &Run,
    host: NodeId,
    seed: u64,
    workload: &Arc<dyn Workload>,
) -> anyhow::Result<crate::replication::service::ReplicaSetup> {
    use crate::replication::service;
    let d = &run.durability;
    Ok(service::ReplicaSetup {
        host,
        cluster_id: d.cluster_id,
        nodes: run.nodes,
        logs: run.logs_per_node,
        replicas: d.replicas,
        regions: run.topo.node_region.clone(),
        mode: service::Mode::Failover,
        seed,
        new_machine: machine_factory(run, workload)?,
        snapshot_every: d.snapshot_every,
        snapshot_log_bytes: d.snapshot_log_bytes,
        journal_rewrite_bytes: service::JOURNAL_REWRITE_MIN_BYTES,
        fragment_bytes: d.raft_fragment_bytes,
        first_election_grace_us: 0,
        election_ticks: (d.election_timeout_us / service::TICK_US) as usize,
        apply_on_thread: false,
    })
}

/// A node's protocol state (storage loaded) and the workload it runs.
pub struct NodeSetup {
    pub proto: Arc<dyn NodeProtocol>,
    pub workload: Arc<dyn Workload>,
    pub topo: Arc<Topology>,
    /// With `--durability replicated`: the node's logs and their replica count, for the
    /// replicator that worker 0 runs.
    pub replicated: Option<(Vec<Arc<NodeLog>>, u16)>,
    /// The node's logs, if the run is durable (shut down when the run ends).
    pub logs: Vec<Arc<NodeLog>>,
    /// The run's cluster id: logs and replication frames of another cluster are refused.
    pub cluster_id: u64,
    /// The protocol's log state machines, for the replicas its node's host keeps.
    pub machine: crate::replication::service::MachineFactory,
}

impl NodeSetup {
    /// The run is over: close the node's log (tasks left waiting at the end must not keep it,
    /// and its directory lock, open).
    pub fn shutdown(&self) {
        for l in &self.logs {
            l.shutdown();
        }
    }
}

/// The workload of a run: one instance per process, shared by the nodes it hosts, so that what a
/// workload records during the run (the bank's audits) meets in one place.
pub fn build_workload(run: &Run) -> anyhow::Result<Arc<dyn Workload>> {
    workloads::build(&run.workload, &run.topo)
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
    run: &Run,
    node: NodeId,
    workload: &Arc<dyn Workload>,
    logs: Vec<OpenedLog>,
) -> anyhow::Result<NodeSetup> {
    let topo = run.topo.clone();
    let workload = workload.clone();
    debug_assert_eq!(logs.len(), usize::from(run.logs_per_node), "node {node} opened every log it keeps");
    let mut env = NodeEnv::volatile(node, topo.clone(), workload.clone(), run.proto.clone());
    let node_logs: Vec<Arc<NodeLog>> = logs.iter().map(|o| o.log.clone()).collect();
    let replicated = (run.durability.mode == Durability::Replicated && !node_logs.is_empty())
        .then(|| (node_logs.clone(), run.durability.replicas));
    let mut logs = logs.into_iter();
    if let Some(opened) = logs.next() {
        env.log = Some(opened.log);
        env.recovered = opened.records;
        env.checkpoint = opened.checkpoint;
        env.checkpoint_every = run.durability.checkpoint_every;
    }
    env.more_logs =
        logs.map(|o| protocols::RecoveredLog { log: o.log, checkpoint: o.checkpoint, records: o.records }).collect();
    let machine = machine_factory(run, &workload)?;
    Ok(NodeSetup {
        // Each node (and each incarnation of it) of a protocol instance of its own, as its
        // log machines are ([`machine_factory`]).
        proto: run.variant.make().build_node(env),
        workload,
        topo,
        replicated,
        logs: node_logs,
        cluster_id: run.durability.cluster_id,
        machine,
    })
}

/// Adopt node `id` after its host failed, on the host whose replicas of its logs now lead:
/// rebuild it from `snapshots` (per log, that replica's snapshot of the protocol's log machine)
/// through the same recovery a restart from a WAL takes, with fresh replicated logs for the
/// adopting host's replicator to serve. Every runtime that fails over does this and only this:
/// the simulator's failover, and a `dtx server` taking a node over.
pub fn adopt_node(
    run: &Run,
    id: NodeId,
    workload: &Arc<dyn Workload>,
    snapshots: Vec<Vec<u8>>,
) -> anyhow::Result<(NodeSetup, Vec<Arc<NodeLog>>)> {
    let opened: Vec<OpenedLog> = snapshots
        .into_iter()
        .map(|state| OpenedLog { log: NodeLog::replicated(), checkpoint: Some(state), records: Vec::new() })
        .collect();
    let logs = opened.iter().map(|o| o.log.clone()).collect();
    let mut setup = build_node(run, id, workload, opened)?;
    // Its logs' replicas are the adopting host's running replicator's, not a new one.
    setup.replicated = None;
    Ok((setup, logs))
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

/// Where log `i` of node `n` lives: `node-<n>` for the first (the layout of one log per node),
/// `node-<n>-log-<i>` for the others.
fn log_dir(dir: &std::path::Path, n: NodeId, i: u16) -> std::path::PathBuf {
    match i {
        0 => dir.join(format!("node-{n}")),
        i => dir.join(format!("node-{n}-log-{i}")),
    }
}

/// Open node `n`'s logs for a real-time run (none when the run is not durable).
pub fn open_node_logs(run: &Run, dir: &std::path::Path, n: NodeId) -> anyhow::Result<Vec<OpenedLog>> {
    (0..run.logs_per_node).map(|i| open_node_log(run, dir, n, i)).collect()
}

/// Open log `i` of node `n`; its checkpoint is checked by the protocol's log machine.
fn open_node_log(run: &Run, dir: &std::path::Path, n: NodeId, i: u16) -> anyhow::Result<OpenedLog> {
    match run.durability.mode {
        Durability::None => bail!("a run without durability opens no log"),
        Durability::Replicated => Ok(fresh_log(NodeLog::replicated())),
        Durability::Wal => {
            let opened = run.durability.open_wal(log_dir(dir, n, i), n, run.workers as usize)?;
            if let Some(c) = &opened.checkpoint {
                let machines = machine_factory(run, &build_workload(run)?)?;
                if let Err(e) = machines(crate::replication::service::LogId::new(n, i), Some(c)) {
                    bail!(
                        "node {n}: the checkpoint in {} passed its checksum but {e:#}: it was written by \
                         another version of dtx or another protocol; use that one, or another --data-dir",
                        log_dir(dir, n, i).display()
                    );
                }
            }
            Ok(opened)
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
/// follows its peers' (nothing crashes there, so nothing fails over). Returns its replicas'
/// state, once it started.
fn start_owner_led_replicator(node: &NodeSetup, w: &Rc<Worker>) -> Option<ReplicasOfHost> {
    let Some((logs, replicas)) = &node.replicated else { return None };
    let seed = w.rng.borrow_mut().gen::<u64>();
    use crate::replication::service;
    let setup = service::ReplicaSetup {
        host: w.addr.node,
        cluster_id: node.cluster_id,
        nodes: node.topo.nodes,
        logs: logs.len() as u16,
        replicas: *replicas,
        regions: node.topo.node_region.clone(),
        mode: service::Mode::OwnerLeads,
        seed,
        new_machine: node.machine.clone(),
        snapshot_every: 0,
        snapshot_log_bytes: u64::MAX,
        journal_rewrite_bytes: service::JOURNAL_REWRITE_MIN_BYTES,
        fragment_bytes: crate::replication::raft_log::FRAGMENT_BYTES,
        first_election_grace_us: 0,
        election_ticks: crate::replication::raft_log::RaftConfig::default().election_ticks,
        apply_on_thread: false,
    };
    // Nothing crashes in one process: these replicas keep their logs in memory.
    let started = service::ReplicaState::new(setup, None).and_then(|state| {
        let state = Rc::new(std::cell::RefCell::new(state));
        service::start(std::slice::from_ref(w), state.clone(), logs.clone(), None).map(|_| state)
    });
    started
        .map_err(|e| crate::rt::log_warn(&format!("node {}: the log replicator did not start: {e}", w.addr.node)))
        .ok()
}

/// A host's replicas of the run's replicated logs.
type ReplicasOfHost = Rc<std::cell::RefCell<crate::replication::service::ReplicaState>>;

/// The `local` runtime's replication on worker 0 of each node: start it, and as the window
/// closes note how far its replicas have replayed and where the node releases results (the
/// run's replay lag). Returns the replicas, to count what they did once the worker stops.
fn start_local_replication(
    node: &Arc<NodeSetup>,
    w: &Rc<Worker>,
    window: Window,
    shared: &Arc<RunShared>,
) -> Option<ReplicasOfHost> {
    let replicas = start_owner_led_replicator(node, w)?;
    let (node, w2, shared, r) = (node.clone(), w.clone(), shared.clone(), replicas.clone());
    w.spawn(async move {
        w2.sleep_us(window.end_ns.saturating_sub(w2.now_ns()) / 1000).await;
        let mut points = r.borrow().applied_watermarks_us();
        points.extend(node.proto.released_watermark_us());
        shared.replay_points_us.lock().extend(points);
    });
    Some(replicas)
}

/// Add what a host's replicas' log machines counted to the run's sums.
fn count_replicas(replicas: &ReplicasOfHost, shared: &RunShared) {
    let mut sums = shared.replica_counters.lock();
    for (name, n) in replicas.borrow().machine_counters() {
        *sums.entry(name).or_default() += n;
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
        // No clients here; what the worker sends and counts is reported all the same.
        return driver::observe(w, window, shared.clone());
    }
    let homes = homes(&node.topo, w.addr);
    let is_client = |worker| {
        let addr = crate::net::Addr { node: w.addr.node, worker };
        node.proto.worker_roles(&node.topo, addr).contains(crate::cluster::Role::Client)
    };
    let client_workers = (0..node.topo.workers_per_node).filter(|k| is_client(*k)).count() as u16;
    let cfg = spec.driver_config(window, client_workers);
    driver::start(w, proto.clone(), node.workload.clone(), homes, cfg, shared.clone());
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
    /// Faults injected into server processes (tcp), or into nodes (sim), in order.
    pub fault_events: Vec<dtx_report::FaultEvent>,
    /// Why the run could not end whole (a full disk held commits past the window): the
    /// command fails, whatever its checks say.
    pub failed: Option<String>,
}

/// What a replay-only run found: whether the copy it replayed into ends holding the rows the
/// run executed (none when no worker compared them).
fn replay_finding(replay: Option<&crate::protocols::ReplayRun>) -> Option<(String, bool, String)> {
    let r = replay?;
    let matches = r.rows_match?;
    let detail = match matches {
        true => format!("{} transactions replayed into a copy of the loaded tables", r.txns),
        false => format!("after {} transactions replayed, the copy's rows differ from the executed ones", r.txns),
    };
    Some(("a replay of every worker's log ends in the executed rows".to_string(), matches, detail))
}

fn collect(shared: &RunShared, totals: &mut Totals, history: &mut Vec<HistLine>) {
    for m in shared.reports.lock().drain(..) {
        totals.add_metrics(&m);
        history.extend(m.history);
    }
}

/// Set while a caller shows a progress bar of its own over many runs (an experiment): each
/// run's bar is then hidden.
static PROGRESS_HIDDEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Hide (or show again) the progress bar of each run.
pub fn hide_run_progress(hidden: bool) {
    PROGRESS_HIDDEN.store(hidden, Ordering::Relaxed);
}

/// Whether each run's progress bar is hidden ([`hide_run_progress`]).
pub fn run_progress_hidden() -> bool {
    PROGRESS_HIDDEN.load(Ordering::Relaxed)
}

/// A progress bar over `total` (seconds of run), hidden when stderr is not a terminal.
pub fn progress(label: &str, total_ms: u64) -> indicatif::ProgressBar {
    let target = if PROGRESS_HIDDEN.load(Ordering::Relaxed) {
        indicatif::ProgressDrawTarget::hidden()
    } else {
        indicatif::ProgressDrawTarget::stderr()
    };
    let pb = indicatif::ProgressBar::with_draw_target(Some(total_ms), target);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} ms {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
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
