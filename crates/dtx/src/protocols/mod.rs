//! Concurrency-control protocols, one folder each, each with the same roles:
//! `meta` (what a record carries), `coordinator` (the execution and commit of a transaction),
//! `participant` (what a node does for remote transactions), `messages` (its wire types), and
//! the background tasks in `mod.rs`. A new protocol is one folder plus a line in [`REGISTRY`].

pub mod common;
pub mod occ;
pub mod twopl;

use crate::cluster::Topology;
use crate::net::NodeId;
use crate::rt::{Handler, LocalBoxFuture, Worker};
use crate::txn::{TxnOutput, TxnRequest, TxnResult};
use crate::workloads::Workload;
use std::rc::Rc;
use std::sync::Arc;

/// Options every protocol understands.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProtoOptions {
    /// Use declared read/write sets to fetch (and lock) per participant in one message.
    pub one_shot: bool,
    /// Longest a transaction waits for a lock (WAIT_DIE) before aborting.
    pub lock_wait_us: u64,
    /// A participant asks the coordinator about a transaction it has not heard of this long.
    pub orphan_after_us: u64,
}

impl Default for ProtoOptions {
    fn default() -> Self {
        ProtoOptions { one_shot: true, lock_wait_us: 500_000, orphan_after_us: 1_000_000 }
    }
}

/// Everything a node-level protocol instance is built from.
pub struct NodeEnv {
    pub node: NodeId,
    pub topo: Arc<Topology>,
    pub workload: Arc<dyn Workload>,
    pub opts: ProtoOptions,
    /// The node's log when the run is durable (`--durability wal`).
    pub log: Option<Arc<crate::rt::log::NodeLog>>,
    /// The records the log held when the node started (after a crash), oldest first, after
    /// its checkpoint, if it has one.
    pub recovered: Vec<Vec<u8>>,
    pub checkpoint: Option<Vec<u8>>,
    /// Checkpoint the log every this many records (0 = never).
    pub checkpoint_every: u64,
}

impl NodeEnv {
    /// A node without a log.
    pub fn volatile(node: NodeId, topo: Arc<Topology>, workload: Arc<dyn Workload>, opts: ProtoOptions) -> Self {
        NodeEnv { node, topo, workload, opts, log: None, recovered: Vec::new(), checkpoint: None, checkpoint_every: 0 }
    }
}

/// Facts about the attempt being run.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When the first attempt of this transaction started (its age, for WAIT_DIE), µs.
    pub first_start_us: u64,
    pub number: u32,
}

/// A protocol: builds the per-node state (storage with its record metadata, loaded).
pub trait Protocol: Send + Sync + 'static {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol>;
}

/// A node's protocol state, shared by its workers.
pub trait NodeProtocol: Send + Sync {
    /// The protocol instance for one worker thread of this node.
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol>;
}

/// A worker's protocol instance: it coordinates transactions and serves remote requests.
pub trait WorkerProtocol: Handler {
    fn execute<'a>(&'a self, req: &'a TxnRequest, attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>>;
    /// Start background tasks (orphan sweeping, epochs...).
    fn start(&self) {}
}

pub struct ProtocolInfo {
    pub name: &'static str,
    pub status: &'static str,
    pub description: &'static str,
    pub make: fn() -> Arc<dyn Protocol>,
}

/// Every protocol dtx knows. `status`: `ready` (implemented and checked), or `planned`.
pub const REGISTRY: &[ProtocolInfo] = &[
    ProtocolInfo {
        name: "2pl-nowait",
        status: "ready",
        description: "two-phase locking, NO_WAIT (abort on conflict), with 2PC",
        make: || Arc::new(twopl::TwoPl { policy: twopl::Policy::NoWait }),
    },
    ProtocolInfo {
        name: "2pl-waitdie",
        status: "ready",
        description: "two-phase locking, WAIT_DIE (older waits, younger dies), with 2PC",
        make: || Arc::new(twopl::TwoPl { policy: twopl::Policy::WaitDie }),
    },
    ProtocolInfo {
        name: "occ",
        status: "ready",
        description: "Silo-style OCC (lock writes, validate reads) with 2PC; the F1-like baseline",
        make: || Arc::new(occ::Occ),
    },
];

/// Protocols named in the interface contract that later issues implement.
pub const PLANNED: &[(&str, &str)] = &[
    ("sundial", "logical leases, OCC/2PL hybrid with caching (Sundial)"),
    ("maat", "timestamp-range OCC (MaaT)"),
    ("tictoc", "data-driven timestamp OCC (TicToc)"),
    ("primo", "write-conflict-free CC without 2PC, watermark group commit (Primo)"),
    ("coco", "epoch-based group commit over OCC (COCO)"),
    ("calvin", "deterministic, sequenced input log (Calvin)"),
    ("slog", "deterministic multi-region with home regions (SLOG)"),
    ("detock", "deterministic multi-region with deadlock resolution (Detock)"),
    ("aria", "deterministic batches, reservation-based (Aria)"),
    ("silo", "single-node Silo OCC with epochs"),
    ("rolis", "replicated multi-core Silo, per-thread Paxos streams (Rolis)"),
    ("hackwrench", "batched commit with fine-grained repair and caching (Hackwrench)"),
    ("sunstorm", "multi-writer shared storage across regions (SunStorm)"),
    ("janus", "dependency-tracking consensus + CC (Janus)"),
    ("tapir", "inconsistent replication + OCC (TAPIR)"),
];

pub fn find(name: &str) -> Option<&'static ProtocolInfo> {
    REGISTRY.iter().find(|p| p.name == name)
}

/// Resolve `a,b|all` into protocol entries, with a clear error for unknown or planned names.
pub fn resolve(list: &str) -> anyhow::Result<Vec<&'static ProtocolInfo>> {
    if list.trim() == "all" {
        return Ok(REGISTRY.iter().filter(|p| p.status == "ready").collect());
    }
    let mut out = vec![];
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match find(name) {
            Some(p) => out.push(p),
            None if PLANNED.iter().any(|(n, _)| *n == name) => {
                anyhow::bail!("protocol `{name}` is planned but not implemented yet (see `dtx protocols`)")
            }
            None => anyhow::bail!(
                "unknown protocol `{name}` (known: {}, or `all`)",
                REGISTRY.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    if out.is_empty() {
        anyhow::bail!("--protocol names no protocol");
    }
    Ok(out)
}
