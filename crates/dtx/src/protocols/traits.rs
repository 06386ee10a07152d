//! What a protocol is to the engine: the traits every protocol implements (`Protocol`, one
//! per run; `NodeProtocol`, one per node; `WorkerProtocol`, one per worker thread) and what they
//! are built from.

use crate::cluster::Topology;
use crate::net::NodeId;
use crate::rt::{Handler, LocalBoxFuture, Worker};
use crate::txn::Procedures;
use crate::txn::{TxnOutput, TxnRequest, TxnResult};
use std::rc::Rc;
use std::sync::Arc;

/// How every protocol runs transactions, set by the bench's flags rather than per protocol
/// (a protocol's own knobs are its [`Options`](crate::protocols::options::Options)).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProtoOptions {
    /// Use declared read/write sets to fetch (and lock) per participant in one message
    /// (`--interactive` turns it off).
    pub one_shot: bool,
}

impl Default for ProtoOptions {
    fn default() -> Self {
        ProtoOptions { one_shot: true }
    }
}

/// Everything a node-level protocol instance is built from.
pub struct NodeEnv {
    pub node: NodeId,
    pub topo: Arc<Topology>,
    pub workload: Arc<dyn Procedures>,
    pub opts: ProtoOptions,
    /// The node's log when the run is durable (`--durability wal`).
    pub log: Option<Arc<crate::rt::log::NodeLog>>,
    /// The records the log held when the node started (after a crash), oldest first, after
    /// its checkpoint, if it has one.
    pub recovered: Vec<Vec<u8>>,
    pub checkpoint: Option<Vec<u8>>,
    /// Checkpoint the log every this many records (0 = never).
    pub checkpoint_every: u64,
    /// The node's other logs, when the protocol keeps more than one ([`Protocol::logs`]): logs
    /// 1, 2, ... in order, each with what it held when the node started.
    pub more_logs: Vec<RecoveredLog>,
}

/// What a log's state machine is built from ([`Protocol::log_machine`]): which log it is, and
/// what it needs to execute the records it applies (the cluster's shape and the workload's
/// procedures), wherever it runs: on the node's host, or on a replica of its log.
#[derive(Clone)]
pub struct MachineEnv {
    pub node: NodeId,
    /// Which of the node's logs ([`Protocol::logs`]): 0 for the node's only log.
    pub log: u16,
    pub topo: Arc<Topology>,
    pub workload: Arc<dyn Procedures>,
}

/// One of a node's logs as the protocol gets it at start: the log, and what it held (its
/// newest checkpoint and the records after it, oldest first).
pub struct RecoveredLog {
    pub log: Arc<crate::rt::log::NodeLog>,
    pub checkpoint: Option<Vec<u8>>,
    pub records: Vec<Vec<u8>>,
}

impl NodeEnv {
    /// A node without a log.
    pub fn volatile(node: NodeId, topo: Arc<Topology>, workload: Arc<dyn Procedures>, opts: ProtoOptions) -> Self {
        NodeEnv {
            node,
            topo,
            workload,
            opts,
            log: None,
            recovered: Vec::new(),
            checkpoint: None,
            checkpoint_every: 0,
            more_logs: Vec::new(),
        }
    }
}

/// The node's storage with every partition it holds a copy of loaded: the same for every
/// protocol, whatever its record metadata `M` (recovery from a log is the protocol's, after this).
pub fn load_storage<M: Default + Send>(env: &NodeEnv) -> crate::storage::Storage<M> {
    let partitions = env.topo.partitions_held_by(env.node);
    let store = crate::storage::Storage::new(&env.workload.tables(&partitions));
    for p in partitions {
        env.workload.load_partition(p, &mut |k, v| store.load(k, v));
    }
    store
}

/// Facts about the attempt being run.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When the first attempt of this transaction started (its age, for WAIT_DIE), µs.
    pub first_start_us: u64,
    pub number: u32,
    /// The transaction must see every write acknowledged before it started: the run's final
    /// read and checks, which stand for "the state now". A protocol that may serve a read from
    /// an older version that is still valid in logical time (Sundial's cache) reads the current
    /// one instead; serializability alone would let such a read-only transaction take its place
    /// before writes that committed earlier in real time.
    pub fresh: bool,
    /// The caller acknowledges a commit itself once the node's log is durable up to
    /// [`TxnOutput::ack_after`](crate::txn::TxnOutput): a protocol that committed in memory
    /// (early lock release) returns without waiting for the flush. The benchmark driver's
    /// clients do, so that a commit waiting for the disk holds no client slot (as Silo's
    /// workers go on while their epoch is persisted); callers that use the result at once
    /// (the final read and checks, tests) do not, and get it only once it is durable.
    pub defer_ack: bool,
}

/// A protocol: builds the per-node state (storage with its record metadata, loaded).
pub trait Protocol: Send + Sync + 'static {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol>;
    /// Refuse a topology the protocol cannot run on (a missing timestamp server, a sequencer
    /// node without data), with a one-line reason. Every topology with a data node and a
    /// client node will do for a protocol that does not say otherwise.
    fn check_topology(&self, _topo: &Topology) -> anyhow::Result<()> {
        Ok(())
    }
    /// Refuse a workload the protocol cannot run with its options, with a one-line reason.
    fn check_workload(&self, _workload: &dyn crate::txn::Procedures) -> anyhow::Result<()> {
        Ok(())
    }
    /// What this variant promises where its options weaken its registry entry's guarantee
    /// (`silo:snapshots=true` reads stale snapshots: serializable, not strict).
    fn weakened_guarantee(&self) -> Option<crate::protocols::Guarantee> {
        None
    }
    /// Refuse a durability the protocol cannot run with, with a one-line reason: every one will
    /// do for a protocol that does not say otherwise (Silo is unreplicated; Rolis replicates).
    fn check_durability(&self, _mode: crate::replication::Durability, _replicas: u16) -> anyhow::Result<()> {
        Ok(())
    }
    /// The state machine of log `env.log` of node `env.node` ([`crate::rt::log::LogMachine`]),
    /// fresh or from a checkpoint's bytes: the checkpointer, replicated logs and failover drive
    /// it, knowing nothing of the protocol's records. It may execute what it applies (an input
    /// log's replica runs the workload's procedures over its own copy of the node's data), so
    /// that it can snapshot state and its log be compacted. A protocol that recovers nothing
    /// from a log keeps the default.
    fn log_machine(
        &self,
        _env: &MachineEnv,
        _checkpoint: Option<&[u8]>,
    ) -> anyhow::Result<Box<dyn crate::rt::log::LogMachine>> {
        Ok(Box::new(crate::rt::log::NoLog))
    }
    /// Whether the protocol keeps partitions' copies as `placement` places them (every copy
    /// written, the leader found by `Topology::node_of`): only the single placement unless it
    /// says otherwise. Calvin, SLOG and Detock keep a copy per region; Janus and TAPIR one per
    /// replica of a shard.
    fn keeps_copies(&self, placement: crate::cluster::Placement) -> bool {
        placement == crate::cluster::Placement::Single
    }
    /// How many logs each node keeps when the run is durable: one (the node's log, as the 2PC
    /// protocols keep) unless the protocol keeps one per worker (Silo, Rolis), per partition
    /// (Primo) or per region (Calvin, SLOG, Detock). Every log is a WAL of its own with
    /// `--durability wal`, in every runtime, and a crash keeps what each one flushed; with
    /// `--durability replicated` each is a Raft group of its own over the node's voters, and all
    /// of a node's logs fail over together to one host.
    fn logs(&self, _topo: &Topology) -> u16 {
        1
    }
    /// Workers each node runs for the protocol's own roles, beside the workers that run clients
    /// (workers `0..n` of every node; `--workers` counts the others, and a cluster file's
    /// `workers` counts all): Calvin's scheduler. Their roles are the protocol's
    /// ([`NodeProtocol::worker_roles`]), and `check_topology` refuses too few workers.
    fn service_workers(&self) -> u16 {
        0
    }
    /// The roles and regions of a run of `nodes` nodes that gives none of its own (`--roles` or a
    /// cluster file's, `--regions`): a protocol with orderers, storage nodes or replica-only
    /// hosts runs on its own shape in every runtime and every shared sweep. Every node holds
    /// data and runs clients, in one region, unless the protocol says otherwise.
    fn default_layout(&self, _nodes: u16) -> Layout {
        Layout::default()
    }
}

/// A protocol's default shape of a cluster ([`Protocol::default_layout`]): per node, its roles
/// and its region; empty means the engine's default (data and clients everywhere, one region).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    pub roles: Vec<crate::cluster::Roles>,
    pub regions: Vec<u16>,
}

/// A node's protocol state, shared by its workers.
pub trait NodeProtocol: Send + Sync {
    /// The protocol instance for one worker thread of this node.
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol>;
    /// What worker `w` does: the runtimes start the driver's clients only on workers with the
    /// `client` role. By default a worker does what its node does.
    fn worker_roles(&self, topo: &Topology, w: crate::net::Addr) -> crate::cluster::Roles {
        topo.roles_of(w.node)
    }
    /// Where this node releases results now, as a clock reading (µs), for a protocol whose
    /// log machines keep an applied watermark on the same clock
    /// ([`crate::rt::log::LogMachine::applied_watermark_us`]): the replay lag is measured from
    /// it where the leader's own host applies nothing (`local`). `None` by default.
    fn released_watermark_us(&self) -> Option<u64> {
        None
    }
}

/// A worker's protocol instance: it coordinates transactions and serves remote requests.
pub trait WorkerProtocol: Handler {
    fn execute<'a>(&'a self, req: &'a TxnRequest, attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>>;
    /// The source whose points [`TxnOutput::ack_after`](crate::txn::TxnOutput) names, for a
    /// protocol that defers acknowledgements ([`Attempt::defer_ack`]): its node's log (LSNs),
    /// or epochs or watermarks that may also be rolled back ([`crate::rt::release`]); `None`
    /// for one that never defers.
    fn ack_source(&self) -> Option<Arc<dyn crate::rt::release::AckSource>> {
        None
    }
    /// Start background tasks (orphan sweeping, epochs...).
    fn start(&self) {}
    /// A digest of the rows of each partition its node holds a copy of, from one worker per
    /// node, for the simulator's check at the end of a run that every copy of a partition holds
    /// the same rows; `None` from a worker that does not answer for its node's store.
    fn copy_digests(
        &self,
    ) -> Option<std::collections::BTreeMap<crate::cluster::PartitionId, crate::storage::RowsDigest>> {
        None
    }
    /// After the run, replay what this worker logged with nothing else running (Rolis's
    /// replay-only measurement, Fig. 15); `None` from a protocol that measures no replay.
    fn replay_only(&self) -> Option<crate::rt::LocalBoxFuture<'static, ReplayRun>> {
        None
    }
}

/// What one worker's replay-only run did: transactions replayed, from when to when (the
/// worker's clock, ns), and, from the last worker to finish, whether the replayed rows are the
/// executed ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplayRun {
    pub txns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub rows_match: Option<bool>,
}

impl ReplayRun {
    /// The workers' runs as one: every transaction, from the first start to the last end.
    pub fn merge(runs: impl IntoIterator<Item = ReplayRun>) -> Option<ReplayRun> {
        runs.into_iter().reduce(|a, b| ReplayRun {
            txns: a.txns + b.txns,
            start_ns: a.start_ns.min(b.start_ns),
            end_ns: a.end_ns.max(b.end_ns),
            rows_match: match (a.rows_match, b.rows_match) {
                (Some(x), Some(y)) => Some(x && y),
                (x, y) => x.or(y),
            },
        })
    }

    /// Transactions replayed per second (None for a run that took no time).
    pub fn per_s(&self) -> Option<f64> {
        let ns = self.end_ns.saturating_sub(self.start_ns);
        (ns > 0).then(|| self.txns as f64 * 1e9 / ns as f64)
    }
}
