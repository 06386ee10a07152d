//! Calvin: sequencers order requests into batches, every data node's scheduler executes them
//! in that order under deterministic ordered locking, and participants exchange their local reads
//! instead of running two-phase commit. Nothing in it is 2PC: it stands on the engine's roles
//! (sequencer and scheduler workers), requests as data (a request is encoded once by its client
//! and decoded and re-run at every participant), protocol-defined abort reasons and options,
//! and nothing outside this folder but its registry line.
//!
//! Roles: [`sequencer`] batches its node's submissions (worker 0 of every data node, or of node 0
//! alone with `sequencers=one`); [`scheduler`] takes the batches in the global order on worker 0
//! of every data node and runs transactions under [`locks`], Calvin's deterministic ordered
//! locking; the client side (here) submits and waits for the outcome; [`messages`] the wire
//! types.
//!
//! Copies: with `--placement per-region` every region holds a full copy, its data nodes run
//! every batch on it, reads are exchanged within the region, and a client hears its outcome
//! from its own region's copy.
//!
//! Durability and recovery ([`input_log`]): with `--durability wal` or `replicated` a node's log
//! holds every input its scheduler ran: its sequencer logs each batch before sending it, and its
//! scheduler logs the others' batches and reads before acknowledging them. A node that lost its
//! memory (a crash with a WAL, or a failover to a replica of its Raft logs, sequencer included)
//! runs them all again from the first, in the same order, to the same state, and its sequencer
//! sends its logged batches again. With one sequencer (`sequencers=one`) the replicas of its log
//! also execute the batches on a full copy of the data. A restarted (or failed-over) sequencer,
//! and SLOG's orderer, also drop copies of submissions its log already holds that clients'
//! resends still bring ([`resubmits`]): the RPC layer's own de-duplication died with the old
//! incarnation.
//!
//! Dependent keys and scans (OLLP, Calvin §3.2.1): a procedure whose keys the workload cannot
//! declare, or that scans, is first run by its client against the committed state without
//! locks (a reconnaissance: `txn::recon`, reading through [`Msg::Peek`]); the keys and scans it
//! found travel in the sequenced entry, the schedulers lock them (scans as ranges), and a run
//! that strays from them aborts alike everywhere (`recon-mismatch`) and is tried again. A
//! client learns that a declared procedure scans when its first run aborts with
//! `scan-undeclared`, and reconnoiters that procedure from then on.
//!
//! Memory: a scheduler's lock manager holds the transactions admitted and not yet finished (the
//! gauge `calvin-locked-txns-max`, the most at once), which the clients in flight bound.
//!
//! Checkpoints ([`checkpoint`]): every `checkpoint_us` worker 0 of a node logs its scheduler's
//! and sequencer's state and the rows written since the last one, so that its log, its
//! replicas' snapshots and a restart's replay stay bounded by the data and the work in flight.
//!
//! Where `calvin` lives (paths under `crates/dtx/src/`; `dtx protocols --options calvin` prints this map):
//! - `protocols/calvin/mod.rs`: the client side: submit, wait for the outcome;
//! - `protocols/calvin/sequencer.rs`: sequencers and their batches;
//! - `protocols/calvin/scheduler.rs`: schedulers: batches in the global order;
//! - `protocols/calvin/locks.rs`: deterministic ordered locking;
//! - `txn/recon.rs`: reconnaissance (OLLP);
//! - `protocols/calvin/input_log.rs`: the input log and recovery by running it again;
//! - `protocols/calvin/checkpoint.rs`: checkpoints.

#[cfg(test)]
mod calibration;
pub mod checkpoint;
pub mod homes;
pub mod input_log;
pub mod locks;
pub mod messages;
pub mod orderer;
pub mod piece_seqs;
pub mod resubmits;
pub mod scheduler;
pub mod sequencer;

use crate::cluster::{Placement, Role, Roles, Topology};
use crate::net::{decode, encode, Addr, NodeId};
use crate::protocols::{
    load_storage, Attempt, MachineEnv, NodeEnv, NodeProtocol, OptionKind, OptionSpec, Options, Protocol, WorkerProtocol,
};
use crate::rt::log::LogMachine;
use crate::rt::{log_warn, CpuKind, Handler, LocalBoxFuture, Worker};
use crate::storage::Value;
use crate::storage::{RowKey, Storage};
use crate::txn::recon::{self, SnapshotReader};
use crate::txn::{Abort, KeySet, Reason, Scan, TxnOutput, TxnRequest, TxnResult};
use messages::{Entry, Msg, Peek, Peeked};
use resubmits::RecentSubmissions;
use rustc_hash::FxHashMap;
use scheduler::Ack;
use std::cell::{Cell, RefCell};
use std::future::Future as _;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Poll, Waker};

/// The sequencer's queue was at its bound (`max_pending`): the request was not sequenced.
pub const SEQUENCER_FULL: Reason = Reason::new("sequencer-full");
/// A procedure run under its workload's declaration scanned: a scan's range must be locked
/// before the run, so its client reconnoiters the procedure from then on.
pub const SCAN_UNDECLARED: Reason = Reason::new("scan-undeclared");
/// SLOG's orderer's queue was at its bound (`max_pending`): the multi-home request was not
/// ordered.
pub const ORDERER_FULL: Reason = Reason::new("orderer-full");
/// A participant could not decode the request (a bug, or another build of the workload).
pub const UNDECODABLE: Reason = Reason::new("undecodable-request");

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "batch_us",
        kind: OptionKind::U64 { min: 100, max: 1_000_000 },
        default: "5000",
        help: "the sequencer closes a batch this often (Calvin: 10 ms; Detock's default: 5 ms)",
    },
    OptionSpec {
        name: "sequencers",
        kind: OptionKind::Choice(&["per-node", "one"]),
        default: "per-node",
        help: "a sequencer on every data node, batches taken round-robin (Calvin), or node 0's alone",
    },
    OptionSpec {
        name: "max_pending",
        kind: OptionKind::U64 { min: 1, max: 1_000_000 },
        default: "100000",
        help: "submissions the sequencer holds before it refuses more (sequencer-full)",
    },
    checkpoint::CHECKPOINT_US,
    checkpoint::CHECKPOINT_LOG_MIB,
];

pub const ABORTS: &[(&str, &str)] = &[
    ("sequencer-full", "the sequencer's queue was at max_pending; the client retries"),
    SCAN_UNDECLARED_ABORT,
    UNDECODABLE_ABORT,
];

/// Abort reasons SLOG and Detock share with Calvin, as their tables list them.
pub const SCAN_UNDECLARED_ABORT: (&str, &str) =
    ("scan-undeclared", "a declared procedure scanned; its client reconnoiters it from then on and retries");
pub const UNDECODABLE_ABORT: (&str, &str) = ("undecodable-request", "a participant could not decode the request");
pub const REGION_SEQUENCER_FULL_ABORT: (&str, &str) =
    ("sequencer-full", "a region's sequencer queue was at max_pending; the client retries");

/// How the sequenced input is ordered into logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOrder {
    /// Calvin: one log, every sequencer's batches of an epoch taken round-robin.
    Global,
    /// SLOG: a log per region for the transactions homed there (its sequencers' batches taken
    /// round-robin), every region's log run everywhere, and multi-home transactions ordered by
    /// the orderer and placed as lock-only pieces in each home's log (see `protocols::slog`).
    HomeRegions,
    /// Detock: SLOG's logs per region, no orderer: a multi-home transaction's coordinator (its
    /// client's region's sequencer) sends each home a piece to place in its log at a common
    /// timestamp, and every scheduler orders what it runs by the dependency graph
    /// (`protocols::depgraph`), resolving the cycles crossed pieces make (see
    /// `protocols::detock`).
    Graph,
}

#[derive(Debug, Clone, Copy)]
pub struct Calvin {
    pub batch_us: u64,
    pub max_pending: usize,
    /// Node 0 alone sequences (`sequencers=one`), not every data node.
    pub one_sequencer: bool,
    pub order: LogOrder,
    /// Detock: how often deadlocks are resolved, µs.
    pub ddr_us: u64,
    /// Detock's opportunistic ordering: the margin added to a multi-home transaction's
    /// timestamp, µs; `None`: pieces are placed as they arrive.
    pub overshoot_us: Option<u64>,
    /// SLOG and Detock: how often a multi-home transaction's client first moves one of its keys
    /// homed elsewhere to its own region ([`homes`]); 0: homes never move.
    pub rehome: f64,
    /// SLOG: the workers of its orderer's node that run the ordering service ([`orderer`]);
    /// 0 for Calvin and Detock, which have none.
    pub orderer_threads: u16,
    /// How often worker 0 of a node checkpoints ([`checkpoint`]), µs; 0: never.
    pub checkpoint_us: u64,
    /// And once its log took this many MiB since the last checkpoint; 0: by time alone.
    pub checkpoint_log_mib: u64,
}

impl Calvin {
    pub fn new(o: &Options) -> Self {
        Calvin { one_sequencer: o.choice("sequencers") == "one", ..Calvin::ordered(o, LogOrder::Global) }
    }

    /// The options Calvin, SLOG and Detock share (`batch_us`, `max_pending`, `checkpoint_us`),
    /// logs ordered by `order`, and none of the others' parts: what each system's own options
    /// then add to.
    pub fn ordered(o: &Options, order: LogOrder) -> Self {
        Calvin {
            batch_us: o.u64("batch_us"),
            max_pending: o.u64("max_pending") as usize,
            one_sequencer: false,
            order,
            ddr_us: 0,
            overshoot_us: None,
            rehome: 0.0,
            orderer_threads: 0,
            checkpoint_us: o.u64("checkpoint_us"),
            checkpoint_log_mib: o.u64("checkpoint_log_mib"),
        }
    }

    /// The protocol's name, for messages.
    fn name(&self) -> &'static str {
        match self.order {
            LogOrder::Global => "calvin",
            LogOrder::HomeRegions => "slog",
            LogOrder::Graph => "detock",
        }
    }

    /// The nodes that sequence.
    pub fn sequencers(&self, topo: &Topology) -> Vec<NodeId> {
        if self.one_sequencer {
            return vec![0];
        }
        (0..topo.nodes).filter(|n| topo.roles_of(*n).contains(Role::Data)).collect()
    }

    /// The logs every scheduler runs, each as the sequencers whose batches it takes round-robin
    /// (in node order): Calvin's one, or SLOG's one per region with data nodes (in region order).
    pub fn streams(&self, topo: &Topology) -> Vec<Vec<NodeId>> {
        let sequencers = self.sequencers(topo);
        match self.order {
            LogOrder::Global => vec![sequencers],
            LogOrder::HomeRegions | LogOrder::Graph => {
                let mut regions: Vec<u16> = sequencers.iter().map(|s| topo.region_of(*s)).collect();
                regions.sort_unstable();
                regions.dedup();
                let in_region = |r| sequencers.iter().copied().filter(|s| topo.region_of(*s) == r).collect();
                regions.into_iter().map(in_region).collect()
            }
        }
    }

    /// SLOG's orderer of multi-home transactions: the first node with the `orderer` role, else
    /// node 0; Calvin has none.
    pub fn orderer(&self, topo: &Topology) -> Option<NodeId> {
        match self.order {
            LogOrder::Global | LogOrder::Graph => None,
            LogOrder::HomeRegions => {
                Some((0..topo.nodes).find(|n| topo.roles_of(*n).contains(Role::Orderer)).unwrap_or(0))
            }
        }
    }

    /// The log machine of a node's input log (see [`input_log`]): the one sequencer's executes
    /// its batches.
    fn input_machine(&self, env: &MachineEnv, checkpoint: Option<&[u8]>) -> anyhow::Result<Box<dyn LogMachine>> {
        let executes = self.one_sequencer && env.node == 0;
        Ok(Box::new(input_log::InputMachine::open(env, executes, checkpoint)?))
    }
}

impl Protocol for Calvin {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol> {
        let mut recovered = input_log::recover(env.node, &env.recovered, env.checkpoint.as_deref());
        if recovered.lost_inputs && env.topo.roles_of(env.node).contains(Role::Data) {
            // Its scheduler runs its inputs again from the first: with the first gone, the
            // node's data cannot be rebuilt, and running on would serve other data than the
            // copies elsewhere.
            panic!("calvin: node {}'s input log checkpoint does not decode: its inputs cannot be run again", env.node);
        }
        if let (Some(log), true) = (&env.log, env.checkpoint_every > 0) {
            let machine_env =
                MachineEnv { node: env.node, log: 0, topo: env.topo.clone(), workload: env.workload.clone() };
            match self.input_machine(&machine_env, env.checkpoint.as_deref()) {
                Ok(mut machine) => {
                    env.recovered.iter().for_each(|r| machine.apply(r));
                    log.set_checkpointer(machine, env.checkpoint_every);
                }
                Err(e) => log_warn(&format!("calvin: node {}: the input log is not checkpointed: {e:#}", env.node)),
            }
        }
        let store = load_storage(&env);
        for (key, value) in std::mem::take(&mut recovered.rows) {
            store.get_or_create(key).lock().value = value;
        }
        // Checkpoints go where the log compacts behind them.
        let checkpoints = self.checkpoint_us > 0
            && env.log.as_ref().is_some_and(|log| log.is_replicated() || env.checkpoint_every > 0);
        let (sequencers, streams, orderer) =
            (self.sequencers(&env.topo), self.streams(&env.topo), self.orderer(&env.topo));
        let recovered = parking_lot::Mutex::new(recovered);
        let directory = homes::HomeDirectory::default();
        let state =
            NodeState { store, env, cfg: *self, recovered, sequencers, streams, orderer, directory, checkpoints };
        Arc::new(CalvinNode(Arc::new(state)))
    }

    /// A replica of a node's input log: with one sequencer it executes the log on a full copy
    /// of the data (see [`input_log`]).
    fn log_machine(&self, env: &MachineEnv, checkpoint: Option<&[u8]>) -> anyhow::Result<Box<dyn LogMachine>> {
        self.input_machine(env, checkpoint)
    }

    /// Worker 0 of every data node is its scheduler and sequencer, and runs no clients: a
    /// deterministic scheduler must not wait behind a client's work. SLOG's ordering threads
    /// are workers 1 to `orderer_threads` of its orderer's node (every node has them, as every
    /// node of a run has as many workers: elsewhere they run nothing).
    fn service_workers(&self) -> u16 {
        1 + self.orderer_threads
    }

    /// One copy, or a full copy in every region: every region's schedulers run the same batches
    /// in the same order, so the copies stay alike with no protocol between them (Calvin's
    /// replication), and a client hears its outcome from its own region's copy.
    fn keeps_copies(&self, placement: Placement) -> bool {
        matches!(placement, Placement::Single | Placement::PerRegion)
    }

    /// SLOG without regions given: even and odd nodes form two regions, so that a run has
    /// multi-home transactions.
    fn default_layout(&self, nodes: u16) -> crate::protocols::Layout {
        match (self.order, nodes) {
            (LogOrder::HomeRegions | LogOrder::Graph, 2..) => {
                crate::protocols::Layout { roles: Vec::new(), regions: (0..nodes).map(|n| n % 2).collect() }
            }
            _ => crate::protocols::Layout::default(),
        }
    }

    /// Homes move one key at a time, and a scan's range is ordered in its partition's home
    /// alone: a workload that scans could miss a moved key's write ([`homes`]).
    fn check_workload(&self, workload: &dyn crate::txn::Procedures) -> anyhow::Result<()> {
        if self.rehome > 0.0 && workload.scans() {
            anyhow::bail!(
                "{}:rehome moves keys' homes, and this workload scans (a scan is ordered in its partition's home \
                 alone, so it could miss a moved key): use rehome=0, or a workload without scans (ycsb, bank, \
                 append)",
                self.name()
            );
        }
        Ok(())
    }

    fn check_topology(&self, topo: &Topology) -> anyhow::Result<()> {
        let has_data =
            |region| (0..topo.nodes).any(|n| topo.roles_of(n).contains(Role::Data) && topo.region_of(n) == region);
        let clients = (0..topo.nodes).filter(|&n| topo.roles_of(n).contains(Role::Client));
        if let Some(c) =
            clients.into_iter().find(|&c| topo.placement() == Placement::PerRegion && !has_data(topo.region_of(c)))
        {
            anyhow::bail!(
                "{} with a copy per region answers a client from its own region's copy, but client node {c}'s \
                 region {} has no data node",
                self.name(),
                topo.region_of(c)
            );
        }
        // Without --roles SLOG's orderer is node 0; once roles are laid out, it must be one of them.
        let roles_given = (0..topo.nodes).any(|n| topo.roles_of(n) != Roles::DEFAULT);
        if self.order == LogOrder::HomeRegions
            && roles_given
            && !(0..topo.nodes).any(|n| topo.roles_of(n).contains(Role::Orderer))
        {
            anyhow::bail!(
                "{} orders multi-home transactions on the node with the `orderer` role, and --roles gives it to \
                 none: add +orderer to one node's roles (the thesis puts it in the first region)",
                self.name()
            );
        }
        let service = self.service_workers();
        if topo.workers_per_node <= service {
            anyhow::bail!(
                "{} runs its own roles on workers 0 to {} of every node (the scheduler; SLOG's ordering threads) \
                 beside the client workers: a node needs {} workers or more (it has {})",
                self.name(),
                service - 1,
                service + 1,
                topo.workers_per_node
            );
        }
        Ok(())
    }
}

/// A node's state: its storage (touched only by its scheduler worker) and what routing needs.
pub struct NodeState {
    pub store: Storage<()>,
    pub env: NodeEnv,
    pub cfg: Calvin,
    /// What the node's input log held when it started, taken by its sequencer (its last epoch,
    /// and its batches to send again) and its scheduler (every input, to run again).
    recovered: parking_lot::Mutex<input_log::Recovered>,
    /// The nodes that sequence.
    pub sequencers: Vec<NodeId>,
    /// The logs every scheduler runs, each as its sequencers ([`Calvin::streams`]).
    pub streams: Vec<Vec<NodeId>>,
    /// SLOG's orderer of multi-home transactions.
    pub orderer: Option<NodeId>,
    /// The homes this node's clients know moved ([`homes`]).
    pub directory: homes::HomeDirectory,
    /// Worker 0 checkpoints ([`checkpoint`]).
    pub checkpoints: bool,
}

impl NodeState {
    /// The sequencer a client on node `n` submits to: its own node's, else the first one in its
    /// region, else the first one.
    pub fn sequencer_for(&self, n: NodeId) -> Addr {
        let topo = &self.env.topo;
        let node = (self.sequencers.iter().find(|s| **s == n))
            .or_else(|| self.sequencers.iter().find(|s| topo.region_of(**s) == topo.region_of(n)))
            .unwrap_or(&self.sequencers[0]);
        Addr::new(*node, 0)
    }

    /// The sequencer of `region`'s log a client on node `n` submits to (SLOG): its own node's if
    /// that is one, else the region's first.
    pub fn sequencer_in(&self, region: u16, n: NodeId) -> Addr {
        let topo = &self.env.topo;
        let stream = self.streams.iter().find(|s| topo.region_of(s[0]) == region).expect("a home region sequences");
        Addr::new(if stream.contains(&n) { n } else { stream[0] }, 0)
    }

    /// The home region of `key` (SLOG) until a movement moves it ([`homes`]): the region of its
    /// partition's leading copy (with a copy per region, partition `p`'s home is region `p` mod
    /// regions).
    pub fn home_of(&self, key: RowKey) -> u16 {
        let topo = &self.env.topo;
        topo.region_of(topo.node_of(self.env.workload.partition_of(key)))
    }

    /// The home regions of a transaction over `keys` that expects `expected` of the keys that
    /// moved, in order (a scan's is its first key's).
    pub fn homes(&self, keys: &KeySet, expected: &[(RowKey, u16)]) -> Vec<u16> {
        let keyed = keys.reads.iter().chain(&keys.writes).map(|k| homes::expected_home(self, expected, *k));
        let mut homes: Vec<u16> = keyed.chain(keys.scans.iter().map(|s| self.scan_home(s))).collect();
        homes.sort_unstable();
        homes.dedup();
        homes
    }

    pub fn scan_home(&self, scan: &Scan) -> u16 {
        self.home_of(RowKey::new(scan.table, scan.lo))
    }

    /// Which copy of the data node `n` holds part of, or its clients read: its region's with
    /// a copy per region (`--placement per-region`), else the one copy (0).
    pub fn copy_of(&self, n: NodeId) -> u16 {
        match self.env.topo.placement() {
            Placement::PerRegion => self.env.topo.region_of(n),
            _ => 0,
        }
    }

    /// The node of copy `copy` that holds `key`.
    pub fn holder(&self, key: RowKey, copy: u16) -> NodeId {
        let p = self.env.workload.partition_of(key);
        match self.env.topo.placement() {
            Placement::PerRegion => self.env.topo.copy_in_region(p, copy),
            _ => self.env.topo.node_of(p),
        }
    }

    /// The node of copy `copy` that holds `scan`'s range: its first key's (a scan's range lies
    /// in one partition, as every protocol here assumes).
    pub fn scan_holder(&self, scan: &Scan, copy: u16) -> NodeId {
        self.holder(RowKey::new(scan.table, scan.lo), copy)
    }

    /// The data nodes of copy `copy` a transaction over `keys` touches, in order.
    pub fn participants(&self, keys: &KeySet, copy: u16) -> Vec<NodeId> {
        let keyed = keys.reads.iter().chain(&keys.writes).map(|k| self.holder(*k, copy));
        let mut nodes: Vec<NodeId> = keyed.chain(keys.scans.iter().map(|s| self.scan_holder(s, copy))).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }
}

struct CalvinNode(Arc<NodeState>);

/// How long a copy of a client's submission can still arrive: the RPC layer's own horizon
/// for dropping copies (twice its timeout; the client stops resending at the timeout).
fn resubmit_horizon_us(w: &Worker) -> u64 {
    2 * w.rpc.timeout_us
}

impl NodeProtocol for CalvinNode {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let roles = self.worker_roles(&self.0.env.topo, w.addr);
        let closer = roles.contains(Role::Orderer) && self.0.ordering_closer() == w.addr;
        let wk = Rc::new_cyclic(|me| CalvinWorker {
            me: me.clone(),
            w: w.clone(),
            node: self.0.clone(),
            sequencer: roles.contains(Role::Sequencer).then(|| {
                let recovered = self.0.recovered.lock();
                let own = recovered.batches.iter().filter(|b| b.1 == w.addr.node);
                let own = own.map(|(epoch, _, entries)| (*epoch, entries.clone())).collect();
                let coordinated = (recovered.coordinated.clone(), recovered.coordinator_seqs.clone());
                let recent =
                    RecentSubmissions::new(resubmit_horizon_us(&w), w.now_us(), recovered.submitted.iter().copied());
                let logged = (recovered.placed.clone(), recovered.region_batch);
                sequencer::Sequencer::new(
                    self.0.cfg.max_pending,
                    recovered.last_epoch,
                    own,
                    coordinated,
                    recent,
                    logged,
                )
            }),
            intake: roles.contains(Role::Orderer).then(|| {
                let recovered = self.0.recovered.lock();
                let logged = orderer::logged_submissions(recovered.orderer.as_ref(), &recovered.ordered);
                orderer::Intake::new(logged, resubmit_horizon_us(&w), w.now_us())
            }),
            orderer: closer.then(|| {
                let recovered = self.0.recovered.lock();
                let (checkpoint, ordered) = (recovered.orderer.clone(), recovered.ordered.clone());
                let horizon = (resubmit_horizon_us(&w), w.now_us());
                orderer::Orderer::new(self.0.cfg.max_pending, checkpoint, ordered, horizon)
            }),
            outbox: checkpoint::Outbox::default(),
            // What worker 0 (or SLOG's orderer) was sending at its checkpoint: sent again at start.
            resend: RefCell::new(match (w.addr.worker, closer) {
                (0, _) => std::mem::take(&mut self.0.recovered.lock().outbox),
                (_, true) => {
                    self.0.recovered.lock().orderer.as_mut().map(|c| std::mem::take(&mut c.outbox)).unwrap_or_default()
                }
                _ => Vec::new(),
            }),
            scheduler: roles.contains(Role::Scheduler).then(|| {
                // SLOG's ordering threads, on other workers, read the orderer's batches after.
                let mut recovered = self.0.recovered.lock();
                let (ordered, orderer) = (std::mem::take(&mut recovered.ordered), recovered.orderer.take());
                let kept = input_log::Recovered { ordered, orderer, ..Default::default() };
                let inputs = std::mem::replace(&mut *recovered, kept);
                let (streams, checkpoints) = (self.0.streams.clone(), self.0.checkpoints);
                scheduler::Scheduler::new(streams, inputs, &self.0, w.addr.node, checkpoints)
            }),
            waiting: RefCell::new(FxHashMap::default()),
            scanning: RefCell::default(),
            // Outcomes of an earlier incarnation's submissions may still arrive (a restarted
            // node's scheduler runs its inputs again and tells their clients): numbering from
            // the clock keeps them from matching this one's (fewer than one a µs are made).
            next_id: Cell::new(w.wall_us().max(1)),
        });
        let handler: Weak<dyn Handler> = Rc::downgrade(&(wk.clone() as Rc<dyn Handler>));
        w.set_handler(handler);
        wk
    }

    fn worker_roles(&self, topo: &Topology, w: Addr) -> Roles {
        let mut roles = topo.roles_of(w.node);
        if w.worker >= self.0.cfg.service_workers() {
            return roles.without(Role::Sequencer).without(Role::Scheduler).without(Role::Orderer);
        }
        if w.worker > 0 {
            // SLOG's ordering threads on its orderer's node; elsewhere idle.
            return match self.0.orderer == Some(w.node) {
                true => Roles::of(&[Role::Orderer]),
                false => Roles::NONE,
            };
        }
        // Worker 0 is the protocol's own (`service_workers`): no clients there.
        roles = roles.without(Role::Client).without(Role::Orderer);
        if self.0.sequencers.contains(&w.node) {
            roles = roles.with(Role::Sequencer);
        }
        if roles.contains(Role::Data) {
            roles = roles.with(Role::Scheduler);
        }
        roles
    }
}

/// A client's wait for the outcome of a submitted transaction.
#[derive(Default)]
struct Waiting {
    outcome: Option<TxnResult<TxnOutput>>,
    waker: Option<Waker>,
}

/// One worker: a client of the sequencer, and the sequencer or a scheduler where its roles say.
pub struct CalvinWorker {
    me: Weak<CalvinWorker>,
    pub w: Rc<Worker>,
    pub node: Arc<NodeState>,
    sequencer: Option<sequencer::Sequencer>,
    scheduler: Option<scheduler::Scheduler>,
    /// SLOG's ordering thread's intake (workers 1 to `orderer_threads` of its node).
    intake: Option<orderer::Intake>,
    /// SLOG's orderer proper, on the first ordering thread: it closes the batches.
    orderer: Option<orderer::Orderer>,
    /// Submitted transactions by id, until their outcome arrives or they time out. Bounded by
    /// the driver's transactions in flight on this worker.
    waiting: RefCell<FxHashMap<u64, Waiting>>,
    next_id: Cell<u64>,
    /// Declared procedures seen to scan (`scan-undeclared`): reconnoitred from then on.
    scanning: RefCell<Vec<&'static str>>,
    /// Worker 0's (or SLOG's orderer's) messages on their way that must arrive, for its checkpoints.
    outbox: checkpoint::Outbox,
    /// Worker 0's (or SLOG's orderer's) messages its last checkpoint held on their way: sent
    /// again at start.
    resend: RefCell<Vec<(Addr, Vec<u8>)>>,
}

impl CalvinWorker {
    /// Hand `msg` to the worker at `dst`: a direct call when it is this worker (a worker never
    /// messages itself), else a request the receiver acknowledges, which the RPC layer resends
    /// on lossy links and de-duplicates. Batches, reads and outcomes must arrive, so they are
    /// sent again until acknowledged (a receiver ignores copies it has already used); a
    /// submission is not (its client stops waiting after the RPC timeout: `outcome-unknown`).
    pub fn deliver(&self, dst: Addr, msg: Msg) {
        if dst == self.w.addr {
            // Only a node's own batch reaches its scheduler so, and its sequencer logged it.
            let ack = self.handle(dst, msg);
            debug_assert_eq!(ack, Ack::Now, "a worker's message to itself is taken at once");
            return;
        }
        let must_arrive = !matches!(msg, Msg::Submit(_) | Msg::Order(_));
        self.send(dst, Rc::new(encode(&msg)), must_arrive);
    }

    /// Send `body` to `dst`, until it arrives if `must_arrive` (noted in worker 0's outbox when
    /// it checkpoints: the inputs that made it are not run again after a restart).
    pub fn send(&self, dst: Addr, body: Rc<Vec<u8>>, must_arrive: bool) {
        let tracked = must_arrive && self.node.checkpoints && (self.w.addr.worker == 0 || self.orderer.is_some());
        let id = tracked.then(|| self.outbox.sent(dst, body.clone()));
        let (w, me) = (self.w.clone(), self.me.clone());
        self.w.spawn(async move {
            while w.call(dst, body.to_vec()).await.is_err() && must_arrive {
                w.count("resends", 1);
            }
            if let (Some(id), Some(me)) = (id, me.upgrade()) {
                me.outbox.acked(id);
            }
        });
    }

    /// Queue a client's submission on a sequencer's `pending`, or refuse it
    /// with `reason` when `max` are queued (the client retries later), counting `refusals`.
    fn queue_or_refuse(
        &self,
        pending: &RefCell<Vec<Entry>>,
        max: usize,
        entry: Entry,
        reason: Reason,
        refusals: &'static str,
    ) {
        let mut queued = pending.borrow_mut();
        if queued.len() < max {
            return queued.push(entry);
        }
        drop(queued);
        self.w.count(refusals, 1);
        self.tell_aborted(&entry, Abort::Protocol(reason));
    }

    /// Tell `entry`'s client that it did not run, and why (refused, not logged, undecodable).
    pub fn tell_aborted(&self, entry: &Entry, abort: Abort) {
        self.deliver(entry.client, Msg::Done { id: entry.id, outcome: Err(abort), moved: Vec::new() });
    }

    /// Take a message; says when to acknowledge it.
    fn handle(&self, from: Addr, msg: Msg) -> Ack {
        let (here, log) = (self.w.addr.node, self.node.env.log.as_deref());
        match msg {
            Msg::Submit(entry) => match &self.sequencer {
                Some(s) => s.submit(self, entry),
                None => log_warn(&format!("calvin: {} got a submission from {from} but is no sequencer", self.w.addr)),
            },
            Msg::Order(entry) => match &self.intake {
                Some(intake) => intake.submit(self, entry),
                None => log_warn(&format!(
                    "slog: {} got a multi-home submission from {from} but is no ordering thread",
                    self.w.addr
                )),
            },
            Msg::Intake { entries, homes } => match &self.orderer {
                Some(o) if entries.len() == homes.len() => o.take(self, orderer::HomedEntries { entries, homes }),
                Some(_) => log_warn(&format!("slog: {from}'s intake has entries and homes apart: dropped")),
                None => log_warn(&format!("slog: {} got an ordering thread's intake but closes no batch", self.w.addr)),
            },
            Msg::Ordered { .. } => unreachable!("the orderer's batches are answered once durable"),
            Msg::Probe { .. } => unreachable!("a probe is answered where it arrives"),
            Msg::Place(_) => unreachable!("a piece is answered once durable"),
            Msg::Batch { epoch, sequencer, entries } => {
                // A sequencer keeps pace with the others of its log.
                let same_log = self.node.streams.iter().any(|s| s.contains(&sequencer) && s.contains(&here));
                if let Some(seq) = self.sequencer.as_ref().filter(|_| sequencer != here && same_log) {
                    seq.heard(epoch);
                }
                match &self.scheduler {
                    Some(s) => return s.batch(log, here, epoch, sequencer, entries),
                    None => log_warn(&format!("calvin: {} got a batch but is no scheduler", self.w.addr)),
                }
            }
            Msg::Reads { slot, from: node, values } => match &self.scheduler {
                Some(s) => return s.reads(log, slot, node, values),
                None => log_warn(&format!("calvin: {} got reads but is no scheduler", self.w.addr)),
            },
            Msg::Done { id, outcome, moved } => {
                moved.iter().for_each(|(key, home)| self.node.directory.learn(&self.node, *key, *home));
                self.done(id, outcome)
            }
            Msg::Peek(_) => unreachable!("a peek is answered where it arrives"),
        }
        Ack::Now
    }

    /// Answer a reconnaissance's read from this node's committed state.
    fn serve_peek(&self, peek: Peek) -> Peeked {
        let store = &self.node.store;
        match peek {
            Peek::Read(key) => {
                self.w.charge_ops(1);
                Peeked::Value(store.get(key).and_then(|r| r.lock().value.clone()))
            }
            Peek::Scan(s) => {
                let rows = scheduler::present_rows(store, s, s.limit as usize);
                self.w.charge_ops(rows.len().max(1));
                Peeked::Rows(rows)
            }
        }
    }

    /// Ask the node of this client's copy that holds what `peek` names (the same worker number
    /// there, so that reconnaissance stays off the schedulers).
    async fn peek(&self, holder: NodeId, peek: Peek) -> TxnResult<Peeked> {
        if holder == self.w.addr.node {
            return Ok(self.serve_peek(peek));
        }
        let reply = self.w.call(Addr::new(holder, self.w.addr.worker), encode(&Msg::Peek(peek))).await;
        decode::<Peeked>(&reply.map_err(|_| Abort::Timeout)?).map_err(|_| Abort::BadReply)
    }

    /// The keys (and scans) of `req`: its workload's declaration, or when that cannot name them
    /// (dependent keys) or the procedure scans, a reconnaissance run's (then `true`: they
    /// travel in its entry).
    async fn keys_of(&self, req: &TxnRequest) -> TxnResult<(KeySet, bool)> {
        let procs = &self.node.env.workload;
        let mut keys = KeySet::default();
        if procs.declare(req, &mut keys) && !self.scanning.borrow().contains(&req.proc) {
            return Ok((keys, false));
        }
        self.w.count("reconnaissance-runs", 1);
        Ok((recon::discover(&**procs, req, self).await?, true))
    }

    fn done(&self, id: u64, outcome: Result<Vec<u8>, Abort>) {
        let outcome = outcome.and_then(|json| {
            // The output is what the driver records (list-append's history); it was encoded by
            // this build's serde, so a failure is a bug: abort rather than invent an output.
            serde_json::from_slice::<TxnOutput>(&json).map_err(|_| Abort::Protocol(UNDECODABLE))
        });
        let mut waiting = self.waiting.borrow_mut();
        let Some(slot) = waiting.get_mut(&id) else { return }; // Timed out before.
        slot.outcome = Some(outcome);
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }

    /// Where a client submits a transaction over `keys` that expects `expected` of the keys
    /// that moved: Calvin's to its sequencer; SLOG's and Detock's single-home one to a
    /// sequencer of its home region's log; a multi-home one where [`Self::multi_home_destination`]
    /// says.
    fn destination(&self, keys: &KeySet, expected: &[(RowKey, u16)]) -> (Addr, bool) {
        let here = self.w.addr.node;
        if self.node.cfg.order == LogOrder::Global {
            return (self.node.sequencer_for(here), false);
        }
        match &self.node.homes(keys, expected)[..] {
            [home] => (self.node.sequencer_in(*home, here), false),
            _ => {
                self.w.count("multi-home-txns", 1);
                self.multi_home_destination()
            }
        }
    }

    /// SLOG's multi-home transaction goes to the orderer (then `true`), Detock's to its own
    /// region's sequencer, which coordinates it (sends each home its piece).
    fn multi_home_destination(&self) -> (Addr, bool) {
        match self.node.orderer {
            Some(_) => (self.node.ordering_thread(self.w.addr), true),
            None => (self.node.sequencer_for(self.w.addr.node), false),
        }
    }

    async fn run(&self, req: &TxnRequest) -> TxnResult<TxnOutput> {
        self.w.charge(CpuKind::Txn, self.w.cost.txn_ns);
        let procs = &self.node.env.workload;
        let (keys, reconnoitred) = self.keys_of(req).await?;
        if keys.is_empty() && keys.scans.is_empty() {
            // It touches no data: no node would run it, and it needs no place in the order.
            return scheduler::run_untouched(&**procs, req, &keys, reconnoitred).await;
        }
        if self.node.cfg.rehome > 0.0 {
            self.maybe_move_home(&keys).await;
        }
        let expected = self.node.directory.expected(&keys);
        let (to, ordered) = self.destination(&keys, &expected);
        let keys = reconnoitred.then_some(keys);
        let encoded = procs.encode_request(req);
        let entry = Entry {
            client: self.w.addr,
            id: 0,
            req: encoded,
            keys,
            piece: None,
            placed: None,
            homes: expected,
            movement: None,
        };
        let outcome = self.submit(to, ordered, entry).await;
        if matches!(outcome, Err(Abort::Protocol(SCAN_UNDECLARED))) && !self.scanning.borrow().contains(&req.proc) {
            self.scanning.borrow_mut().push(req.proc);
        }
        outcome
    }

    /// Number `entry`, send it to `to` (the orderer when `ordered`), and wait for its outcome,
    /// at most the RPC timeout.
    async fn submit(&self, to: Addr, ordered: bool, mut entry: Entry) -> TxnResult<TxnOutput> {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        entry.id = id;
        self.waiting.borrow_mut().insert(id, Waiting::default());
        self.deliver(to, if ordered { Msg::Order(entry) } else { Msg::Submit(entry) });
        let mut timeout = self.w.sleep_us(self.w.rpc.timeout_us);
        let outcome = std::future::poll_fn(|cx| {
            let mut waiting = self.waiting.borrow_mut();
            let slot = waiting.get_mut(&id).expect("a transaction waits until it ends");
            if let Some(o) = slot.outcome.take() {
                return Poll::Ready(o);
            }
            if std::pin::Pin::new(&mut timeout).poll(cx).is_ready() {
                // Sequenced or not, it may run: only its outcome was lost.
                return Poll::Ready(Err(Abort::OutcomeUnknown));
            }
            slot.waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        self.waiting.borrow_mut().remove(&id);
        outcome
    }

    /// With probability `rehome`, before a multi-home transaction over `keys`, move the home of
    /// its first key homed in another region to this client's region, if that region has a log
    /// ([`homes`]). Its outcome is counted, not the driver's: a movement reads and writes no data.
    async fn maybe_move_home(&self, keys: &KeySet) {
        let (node, here) = (&self.node, self.w.addr.node);
        let region = node.env.topo.region_of(here);
        if node.homes(keys, &node.directory.expected(keys)).len() < 2
            || !node.streams.iter().any(|s| node.env.topo.region_of(s[0]) == region)
            || !rand::Rng::gen_bool(&mut *self.w.rng.borrow_mut(), node.cfg.rehome)
        {
            return;
        }
        let elsewhere = keys.writes.iter().chain(&keys.reads).find(|k| node.directory.home(node, **k) != region);
        let Some(&key) = elsewhere else { return };
        let movement = homes::Movement { key, from: node.directory.home(node, key), to: region };
        let entry = Entry {
            client: self.w.addr,
            id: 0,
            req: Vec::new(),
            keys: None,
            piece: None,
            placed: None,
            homes: Vec::new(),
            movement: Some(movement),
        };
        let (to, ordered) = self.multi_home_destination();
        let counter = match self.submit(to, ordered, entry).await {
            Ok(_) => {
                node.directory.learn(node, key, region);
                "home-moves"
            }
            Err(Abort::Protocol(homes::HOME_MOVED)) => "home-moves-stale",
            Err(_) => "home-moves-failed",
        };
        self.w.count(counter, 1);
    }
}

/// Reconnaissance reads the committed state of this client's copy, without locks: the run that
/// follows locks what it found, and a stale answer costs a `recon-mismatch` retry, never a
/// wrong result.
impl SnapshotReader for CalvinWorker {
    fn read<'a>(&'a self, key: RowKey) -> LocalBoxFuture<'a, TxnResult<Option<Value>>> {
        Box::pin(async move {
            let holder = self.node.holder(key, self.node.copy_of(self.w.addr.node));
            match self.peek(holder, Peek::Read(key)).await? {
                Peeked::Value(v) => Ok(v),
                Peeked::Rows(_) => Err(Abort::BadReply),
            }
        })
    }

    fn scan<'a>(&'a self, s: Scan) -> LocalBoxFuture<'a, TxnResult<Vec<(u64, Value)>>> {
        Box::pin(async move {
            let holder = self.node.scan_holder(&s, self.node.copy_of(self.w.addr.node));
            match self.peek(holder, Peek::Scan(s)).await? {
                Peeked::Rows(rows) => Ok(rows),
                Peeked::Value(_) => Err(Abort::BadReply),
            }
        })
    }
}

impl WorkerProtocol for CalvinWorker {
    fn execute<'a>(&'a self, req: &'a TxnRequest, _attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>> {
        Box::pin(self.run(req))
    }

    /// The scheduler's worker answers for its node's store (it is the only one that writes it).
    fn copy_digests(&self) -> Option<std::collections::BTreeMap<u32, crate::storage::RowsDigest>> {
        let procs = &self.node.env.workload;
        self.scheduler.as_ref().map(|_| self.node.store.digests_by(|row| procs.partition_of(row)))
    }

    fn start(&self) {
        let Some(me) = self.me.upgrade() else { return };
        for (dst, body) in std::mem::take(&mut *self.resend.borrow_mut()) {
            self.w.count("calvin-checkpoint-resends", 1);
            self.send(dst, Rc::new(body), true);
        }
        if self.node.checkpoints && (self.sequencer.is_some() || self.scheduler.is_some() || self.orderer.is_some()) {
            checkpoint::spawn_checkpointer(&me);
        }
        if let Some(s) = &self.scheduler {
            // The homes its checkpoint says moved, as running the inputs before it told them.
            s.moved_homes().into_iter().for_each(|(key, home)| self.node.directory.learn(&self.node, key, home));
        }
        if self.sequencer.is_some() {
            sequencer::spawn_batcher(&me);
            if self.node.cfg.overshoot_us.is_some() {
                sequencer::spawn_prober(&me);
            }
        }
        if self.orderer.is_some() {
            orderer::spawn_orderer(&me);
        }
        if self.scheduler.is_some() {
            scheduler::spawn_admitter(&me);
            if self.node.cfg.order == LogOrder::Graph {
                scheduler::spawn_resolver(&me);
            }
        }
    }
}

impl Handler for CalvinWorker {
    fn on_request(&self, from: Addr, rpc_id: u64, body: &[u8]) {
        match decode::<Msg>(body) {
            Ok(Msg::Peek(peek)) => self.w.reply(from, rpc_id, &encode(&self.serve_peek(peek))),
            Ok(Msg::Probe { sent_us }) => {
                let offset_us = self.w.wall_us() as i64 - sent_us as i64;
                self.w.reply(from, rpc_id, &encode(&offset_us));
            }
            Ok(Msg::Place(entry)) => match &self.sequencer {
                Some(seq) => {
                    seq.place(self, entry, Some((from, rpc_id)));
                }
                None => log_warn(&format!("detock: {} got a piece from {from} but is no sequencer", self.w.addr)),
            },
            Ok(Msg::Ordered { region_batch, entries }) => match &self.sequencer {
                Some(seq) => seq.ordered(self, region_batch, entries, Some((from, rpc_id))),
                None => log_warn(&format!("slog: {} got the orderer's batch but is no sequencer", self.w.addr)),
            },
            Ok(msg) => match self.handle(from, msg) {
                Ack::Now => self.w.reply(from, rpc_id, &[]),
                Ack::AfterDurable(lsn) => {
                    let (w, log) = (self.w.clone(), self.node.env.log.clone().expect("only a log defers an ack"));
                    self.w.spawn(async move {
                        log.wait(lsn).await;
                        w.reply(from, rpc_id, &[]);
                    });
                }
                Ack::Withheld => self.w.count("calvin-inputs-withheld", 1),
            },
            Err(e) => log_warn(&format!("calvin: malformed message from {from}: {e}")),
        }
    }

    fn on_oneway(&self, from: Addr, _body: &[u8]) {
        log_warn(&format!("calvin: unexpected one-way message from {from}"));
    }
}

#[cfg(test)]
pub(crate) mod tests;
