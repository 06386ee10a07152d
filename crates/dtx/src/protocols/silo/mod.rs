//! Silo (Tu et al., SOSP 2013) on one multi-core node, and Rolis (execute, replicate, replay)
//! on top of it: one engine, two registry entries that differ in where the workers' logs live.
//!
//! - `silo`: OCC with Silo's TID words and commit protocol (lock the write set, validate the
//!   read set, pick a TID without a shared counter, install, unlock). Without a log a commit
//!   is acknowledged at once: the unreplicated upper bound Rolis is measured against. With
//!   `--durability wal` each worker logs to a WAL of its own and a commit is acknowledged once
//!   every worker's log is durable past it (SiloR's logging, at the granularity of a TID rather
//!   than a 40 ms epoch).
//! - `rolis` (`protocols/rolis`): the same with each worker's log a Raft group of its own
//!   (`--durability replicated`): the leader executes speculatively, each worker replicates its
//!   batches on its own stream, and results are released below the watermark (the minimum over
//!   the streams of their latest durable TID). A replica replays every stream into one state
//!   below its own watermark ([`log::NodeReplica`]); a failover or a restart closes the old epoch at its
//!   final watermark and drops what lies above it ([`log::recover`]).
//!
//! Roles: [`meta`] the TID word and TID choice; [`txn`] an attempt's execution and commit;
//! [`stream`] batching, heartbeats, the watermark and release; [`log`] the entries, replay and
//! recovery; [`replay`] the replay-only measurement (`replay_only`). All data and clients are on node 0; the other nodes only hold replicas of its
//! logs (its default layout).
//!
//! Where `silo` lives (paths under `crates/dtx/src/`; `dtx protocols --options silo` prints this map):
//! - `protocols/silo/mod.rs`: its options;
//! - `protocols/silo/txn.rs`: an attempt's execution and commit;
//! - `protocols/silo/meta.rs`: the TID word and TID choice;
//! - `protocols/silo/stream.rs`: logs, release once every log is durable past a TID;
//! - `protocols/silo/log.rs`: log entries, replay and recovery;
//! - `protocols/silo/snapshot.rs`: snapshot transactions.

pub mod log;
pub mod meta;
pub mod replay;
pub mod snapshot;
pub mod stream;
pub mod txn;

#[cfg(test)]
mod tests;

use crate::cluster::{Role, Roles, Topology};
use crate::net::NodeId;
use crate::protocols::{Attempt, Layout, MachineEnv, NodeEnv, OptionKind, OptionSpec, Options, WorkerProtocol};
use crate::replication::Durability;
use crate::rt::log::{LogMachine, NodeLog};
use crate::rt::release::Release as Outcome;
use crate::rt::{CpuKind, Worker};
use crate::storage::Storage;
use crate::txn::{Abort, Ctx, TxnOutput, TxnRequest, TxnResult};
use meta::{epoch_start, SiloMeta, Stamper};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Weak};
use stream::{Release, Streams, WorkerStream};

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "batch",
        kind: OptionKind::U64 { min: 1, max: 1_000_000 },
        default: "1000",
        help: "transactions per log entry of a worker's stream (Rolis: 1,000 for TPC-C, 10,000 for YCSB++)",
    },
    OptionSpec {
        name: "flush_us",
        kind: OptionKind::U64 { min: 10, max: 1_000_000 },
        default: "1000",
        help: "a worker appends its batch this often however full, or a heartbeat when it has nothing",
    },
    OptionSpec {
        name: "watermark_us",
        kind: OptionKind::U64 { min: 10, max: 1_000_000 },
        default: "500",
        help: "how often the watermark over the streams is taken and commits below it released (Rolis: 0.5 ms)",
    },
    OptionSpec {
        name: "streams",
        kind: OptionKind::Choice(&["per-worker", "shared"]),
        default: "per-worker",
        help: "per-worker: a log per worker, released by watermark; shared: one log for all, each commit released once durable (Rolis's strawman)",
    },
    OptionSpec {
        name: "replay_only",
        kind: OptionKind::Bool,
        default: "false",
        help: "silo keeps each worker's batches in memory and, after the run, replays them on every worker into a copy of the tables, without Raft or watermark (Rolis's Fig. 15): the report gives replay_per_s",
    },
    OptionSpec {
        name: "snapshots",
        kind: OptionKind::Bool,
        default: "false",
        help: "Silo's snapshot transactions: a transaction the workload declares read-only reads a recent consistent snapshot, never validates and never aborts (serializable, no longer strict: the snapshot is up to two snapshot_us old)",
    },
    OptionSpec {
        name: "snapshot_us",
        kind: OptionKind::U64 { min: 100, max: 60_000_000 },
        default: "1000000",
        help: "snapshot points this far apart in the TIDs' clock, one published every snapshot_us (Silo: every 25 epochs of 40 ms)",
    },
];

/// How the engine runs: its options, and which system it is.
#[derive(Debug, Clone, Copy)]
pub struct SiloConfig {
    /// `rolis`: the workers' logs must be replicated.
    pub replicated: bool,
    pub shared_stream: bool,
    pub batch: usize,
    pub flush_us: u64,
    pub watermark_us: u64,
    pub replay_only: bool,
    /// With `snapshots`: the spacing of snapshot points.
    pub snapshot_us: Option<u64>,
}

impl SiloConfig {
    pub fn from_options(o: &Options, replicated: bool) -> Self {
        SiloConfig {
            replicated,
            shared_stream: o.choice("streams") == "shared",
            batch: o.u64("batch") as usize,
            flush_us: o.u64("flush_us"),
            watermark_us: o.u64("watermark_us"),
            replay_only: o.bool("replay_only"),
            snapshot_us: o.bool("snapshots").then(|| o.u64("snapshot_us")),
        }
    }

    fn name(&self) -> &'static str {
        if self.replicated {
            "rolis"
        } else {
            "silo"
        }
    }
}

pub struct Silo {
    cfg: SiloConfig,
    /// Per node, the replica its streams' machines on this host share (the engine makes a
    /// host's machines through one protocol instance, and a new one for each incarnation of
    /// the host, so a crashed host's replica is not reused).
    replicas: Mutex<FxHashMap<NodeId, Weak<Mutex<log::NodeReplica>>>>,
}

impl Silo {
    pub fn new(cfg: SiloConfig) -> Self {
        Silo { cfg, replicas: Default::default() }
    }

    /// The replica of `node` this host's machines share (made on first use).
    fn replica_of(&self, node: NodeId, streams: usize) -> Arc<Mutex<log::NodeReplica>> {
        let mut replicas = self.replicas.lock();
        if let Some(r) = replicas.get(&node).and_then(Weak::upgrade) {
            return r;
        }
        let r = Arc::new(Mutex::new(log::NodeReplica::new(self.cfg.shared_stream, streams)));
        replicas.insert(node, Arc::downgrade(&r));
        r
    }
}

impl crate::protocols::Protocol for Silo {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn crate::protocols::NodeProtocol> {
        let cfg = self.cfg;
        let store: Storage<SiloMeta> = crate::protocols::load_storage(&env);
        let logs: Vec<Arc<NodeLog>> =
            env.log.iter().cloned().chain(env.more_logs.iter().map(|l| l.log.clone())).collect();
        let machines = machines_of(&env, cfg.shared_stream, logs.len());
        if env.checkpoint_every > 0 {
            // Each log's checkpointer goes on from what the log held (one replay serves both).
            for (l, m) in logs.iter().zip(log::StreamMachine::deep_copy(&machines)) {
                l.set_checkpointer(Box::new(m), env.checkpoint_every);
            }
        }
        let recovered = log::recover(&machines);
        for (k, (tid, value)) in recovered.rows {
            let rec = store.get_or_create(k);
            let mut row = rec.lock();
            row.value = value;
            row.meta.tid = tid;
        }
        let epoch = recovered.epoch;
        // A replica-only host's node runs no transaction: it keeps its logs empty.
        let runs_transactions = env.topo.roles_of(env.node).contains(Role::Data);
        let streams = (runs_transactions && !logs.is_empty()).then(|| Arc::new(Streams::new(logs, cfg, epoch)));
        let closes = recovered.closes;
        let replay_store = (cfg.replay_only && runs_transactions).then(|| {
            Arc::new(replay::ReplayTarget {
                store: crate::protocols::load_storage(&env),
                workers: env.topo.workers_per_node as usize,
                finished: Default::default(),
                incomplete: Default::default(),
            })
        });
        let batch = cfg.batch;
        let snapshots = (cfg.snapshot_us.filter(|_| runs_transactions))
            .map(|us| snapshot::Snapshots::new(us, env.topo.workers_per_node as usize));
        let workload = env.workload.clone();
        let state = NodeState { store, workload, epoch, streams, closes, replay_store, batch, snapshots };
        Arc::new(SiloNode(Arc::new(state)))
    }

    fn check_topology(&self, topo: &Topology) -> anyhow::Result<()> {
        let data: Vec<u16> = (0..topo.nodes).filter(|&n| topo.roles_of(n).contains(Role::Data)).collect();
        let clients: Vec<u16> = (0..topo.nodes).filter(|&n| topo.roles_of(n).contains(Role::Client)).collect();
        if data != [0] || clients != [0] {
            anyhow::bail!(
                "{} is one multi-core node: its data and clients must be on node 0 alone (data nodes here: {data:?}, \
                 client nodes: {clients:?}); the others only hold replicas of its logs",
                self.cfg.name()
            );
        }
        Ok(())
    }

    fn weakened_guarantee(&self) -> Option<crate::protocols::Guarantee> {
        self.cfg.snapshot_us.map(|_| crate::protocols::Guarantee::Serializable)
    }

    fn check_durability(&self, mode: Durability, replicas: u16) -> anyhow::Result<()> {
        if self.cfg.replay_only && (self.cfg.replicated || mode != Durability::None) {
            anyhow::bail!(
                "replay_only measures replay alone, of logs silo keeps in memory (Rolis's Fig. 15): run silo with \
                 --durability none"
            );
        }
        match (self.cfg.replicated, mode) {
            (false, Durability::Replicated) => {
                anyhow::bail!(
                    "silo is unreplicated: rolis is silo with each worker's log replicated (--protocol rolis)"
                )
            }
            (true, Durability::None | Durability::Wal) => anyhow::bail!(
                "rolis replicates each worker's log: add --durability replicated --replicas 3 (silo keeps them in \
                 local WALs)"
            ),
            (true, Durability::Replicated) if replicas < 2 => {
                anyhow::bail!("rolis needs at least 2 replicas of each log (--replicas {replicas}): give --replicas 3")
            }
            _ => Ok(()),
        }
    }

    fn logs(&self, topo: &Topology) -> u16 {
        match self.cfg.shared_stream {
            true => 1,
            false => topo.workers_per_node,
        }
    }

    fn log_machine(&self, env: &MachineEnv, checkpoint: Option<&[u8]>) -> anyhow::Result<Box<dyn LogMachine>> {
        let replica = self.replica_of(env.node, self.logs(&env.topo) as usize);
        Ok(Box::new(log::StreamMachine::joining(&replica, env.log, checkpoint)?))
    }

    fn default_layout(&self, nodes: u16) -> Layout {
        let replica_host = Roles::of(&[Role::Replicator]);
        let roles = (0..nodes).map(|n| if n == 0 { Roles::DEFAULT } else { replica_host }).collect();
        Layout { roles, regions: Vec::new() }
    }
}

/// The node's logs as one replica's stream machines, each fed what its log held.
fn machines_of(env: &NodeEnv, ordered: bool, streams: usize) -> Vec<log::StreamMachine> {
    let first = env.log.as_ref().map(|_| (env.checkpoint.as_deref(), &env.recovered));
    let rest = env.more_logs.iter().map(|l| (l.checkpoint.as_deref(), &l.records));
    let replica = Arc::new(Mutex::new(log::NodeReplica::new(ordered, streams.max(1))));
    first
        .into_iter()
        .chain(rest)
        .enumerate()
        .map(|(stream, (checkpoint, records))| {
            // The log opened with this checkpoint: the engine checked it with our log machine.
            let mut m =
                log::StreamMachine::joining(&replica, stream as u16, checkpoint).expect("a silo stream checkpoint");
            records.iter().for_each(|r| m.apply(r));
            m
        })
        .collect()
}

struct NodeState {
    store: Storage<SiloMeta>,
    workload: Arc<dyn crate::txn::Procedures>,
    /// This incarnation's epoch.
    epoch: u64,
    /// The workers' logs (none without durability).
    streams: Option<Arc<Streams>>,
    /// Epochs this incarnation closed, with their final watermarks: each worker logs them in
    /// its stream before anything of its own.
    closes: Vec<(u64, u64)>,
    /// With `replay_only`: the copy of the loaded tables the workers replay into after the run.
    replay_store: Option<Arc<replay::ReplayTarget>>,
    /// Transactions per entry (the `batch` option).
    batch: usize,
    /// With `snapshots`: the snapshot points, and the workers' announcements.
    snapshots: Option<snapshot::Snapshots>,
}

struct SiloNode(Arc<NodeState>);

impl crate::protocols::NodeProtocol for SiloNode {
    fn released_watermark_us(&self) -> Option<u64> {
        self.0.streams.as_ref()?.released_watermark_us()
    }

    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let stamper = Stamper::new(self.0.epoch, w.addr.worker);
        let stream = RefCell::new(WorkerStream::new(self.0.closes.clone()));
        let log = Rc::new(WorkerLog { stamper: Cell::new(stamper), stream });
        let kept = self.0.replay_store.as_ref().map(|_| RefCell::new(replay::KeptLog::new(self.0.batch)));
        Rc::new(SiloWorker { w, s: self.0.clone(), attempts: Cell::new(0), log, kept })
    }
}

struct SiloWorker {
    w: Rc<Worker>,
    s: Arc<NodeState>,
    /// Attempts this worker started: with its index, an attempt's lock owner id.
    attempts: Cell<u64>,
    log: Rc<WorkerLog>,
    /// With `replay_only`: what this worker's stream would have logged.
    kept: Option<RefCell<replay::KeptLog>>,
}

/// A worker's TIDs and its stream, shared with its flush loop.
struct WorkerLog {
    stamper: Cell<Stamper>,
    stream: RefCell<WorkerStream>,
}

impl WorkerLog {
    fn stamp(&self, w: &Worker, floor: u64) -> u64 {
        let mut s = self.stamper.get();
        let tid = s.next(w.now_us(), floor);
        self.stamper.set(s);
        tid
    }
}

impl SiloWorker {
    fn next_txn_id(&self) -> u64 {
        let n = self.attempts.get() + 1;
        self.attempts.set(n);
        ((self.w.addr.worker as u64 + 1) << 48) | n
    }

    /// Commit an executed attempt: returns where its release waits.
    fn commit(&self, t: txn::SiloTxn<'_>) -> TxnResult<Release> {
        let Some(snapshots) = &self.s.snapshots else { return self.stamp_and_install(t.lock_and_validate(|| 0)?) };
        // No snapshot point at or after this serialization is published until its writes are in.
        let worker = self.w.addr.worker as usize;
        let locked = t.lock_and_validate(|| snapshots.serialize(worker, || self.w.history_now_us()));
        let release = locked.and_then(|locked| self.stamp_and_install(locked));
        snapshots.end_install(worker);
        release
    }

    fn stamp(&self, floor: u64) -> u64 {
        self.log.stamp(&self.w, floor)
    }

    /// Stamp a locked transaction, log it and install it (Silo's phase 3).
    fn stamp_and_install(&self, locked: txn::Locked<'_>) -> TxnResult<Release> {
        let snapshots = self.s.snapshots.as_ref();
        let Some(streams) = &self.s.streams else {
            let tid = self.stamp(locked.floor);
            let writes = locked.install(tid, snapshots);
            if let Some(kept) = self.kept.as_ref().filter(|_| !writes.is_empty()) {
                kept.borrow_mut().keep(&self.w, (tid, writes));
            }
            return Ok(Release::Now);
        };
        if locked.is_read_only() {
            let floor = locked.floor;
            locked.release();
            return Ok(streams.read_only(floor, epoch_start(self.s.epoch)));
        }
        if !stream::fits(stream::logged_bytes(&locked.writes)) {
            locked.release();
            return Err(Abort::LogRefused);
        }
        let tid = self.stamp(locked.floor);
        self.w.charge_ops(locked.writes.len());
        if streams.cfg.shared_stream {
            // One log for every worker: the record goes in before the locks are let go, so
            // that the log's order is the order of dependent transactions.
            let release = WorkerStream::log(&self.log.stream, &self.w, streams, tid, locked.writes.clone());
            let _ = locked.install(tid, snapshots);
            return Ok(release);
        }
        // A worker's own stream is in its TID order whatever the other workers do: the
        // watermark, not the log's order, keeps dependents behind what they depend on.
        let writes = locked.install(tid, snapshots);
        Ok(WorkerStream::log(&self.log.stream, &self.w, streams, tid, writes))
    }
}

impl SiloWorker {
    /// Run a declared read-only transaction at the latest snapshot point: nothing to validate,
    /// and its result released once what it read is durable.
    async fn snapshot_txn(&self, snapshots: &snapshot::Snapshots, req: &TxnRequest) -> TxnResult<(TxnOutput, Release)> {
        let worker = self.w.addr.worker as usize;
        let point = snapshots.begin_read(worker);
        let mut read = snapshot::SnapshotRead { store: &self.s.store, w: &self.w, point, newest: 0 };
        let out = self.s.workload.run(req, &mut Ctx::new(&mut read)).await;
        snapshots.end_read(worker);
        self.w.count("silo-snapshot-txns", 1);
        let release = match &self.s.streams {
            Some(streams) => streams.read_only(read.newest, epoch_start(self.s.epoch)),
            None => Release::Now,
        };
        Ok((out?, release))
    }
}

/// Silo's workers exchange no messages: clients are in-process and replication is the logs'.
impl crate::rt::Handler for SiloWorker {
    fn on_request(&self, _from: crate::net::Addr, _rpc_id: u64, _body: &[u8]) {}
    fn on_oneway(&self, _from: crate::net::Addr, _body: &[u8]) {}
}

impl WorkerProtocol for SiloWorker {
    fn execute<'a>(
        &'a self,
        req: &'a TxnRequest,
        attempt: Attempt,
    ) -> crate::rt::LocalBoxFuture<'a, TxnResult<TxnOutput>> {
        Box::pin(async move {
            self.w.charge(CpuKind::Txn, self.w.cost.txn_ns);
            let (mut out, release) = match &self.s.snapshots {
                Some(snapshots) if self.s.workload.read_only(req) => self.snapshot_txn(snapshots, req).await?,
                _ => {
                    let mut t = txn::SiloTxn::new(&self.s.store, &self.w, self.next_txn_id());
                    let out = self.s.workload.run(req, &mut Ctx::new(&mut t)).await?;
                    (out, self.commit(t)?)
                }
            };
            let point = match release {
                Release::Now => return Ok(out),
                Release::At(point) => point,
            };
            if attempt.defer_ack {
                out.ack_after = Some(point);
                return Ok(out);
            }
            let source = self.ack_source().expect("a node with streams has an acknowledgement source");
            source.decided(point).await;
            match source.outcome(point) {
                Outcome::Released => Ok(out),
                _ => Err(Abort::RolledBack),
            }
        })
    }

    fn ack_source(&self) -> Option<Arc<dyn crate::rt::release::AckSource>> {
        self.s.streams.as_ref().map(|s| s.ack_source())
    }

    fn replay_only(&self) -> Option<crate::rt::LocalBoxFuture<'static, crate::protocols::ReplayRun>> {
        let (kept, target) = (self.kept.as_ref()?, self.s.replay_store.clone()?);
        if kept.borrow().is_full() {
            target.incomplete.store(true, std::sync::atomic::Ordering::Release);
        }
        let entries = kept.borrow_mut().take();
        Some(Box::pin(replay::replay(self.w.clone(), target, self.s.clone(), entries)))
    }

    fn start(&self) {
        if let (Some(snapshots), 0) = (&self.s.snapshots, self.w.addr.worker) {
            let tick_us = (snapshots.step_us() / SNAPSHOT_TICKS).max(10);
            self.w.spawn(publish_loop(self.w.clone(), self.s.clone(), tick_us));
        }
        let Some(streams) = &self.s.streams else { return };
        if streams.cfg.shared_stream {
            return;
        }
        self.w.spawn(flush_loop(self.w.clone(), self.log.clone(), streams.clone()));
        if self.w.addr.worker == 0 {
            self.w.spawn(streams.clone().release_loop(self.w.clone()));
        }
    }
}

/// How often per snapshot point the publisher looks (Silo's 25 epochs of 40 ms to a snapshot).
const SNAPSHOT_TICKS: u64 = 25;

/// Every `tick_us`: publish the latest complete snapshot point (Silo's epoch advance).
async fn publish_loop(w: Rc<Worker>, s: Arc<NodeState>, tick_us: u64) {
    let snapshots = s.snapshots.as_ref().expect("the publisher runs with snapshots");
    loop {
        w.sleep_us(tick_us).await;
        snapshots.advance(w.history_now_us());
    }
}

/// Every `flush_us`: append the worker's batch, or a heartbeat when it has none.
async fn flush_loop(w: Rc<Worker>, log: Rc<WorkerLog>, streams: Arc<Streams>) {
    loop {
        w.sleep_us(streams.cfg.flush_us).await;
        if !WorkerStream::flush(&log.stream, &w, &streams) {
            let tid = log.stamp(&w, 0);
            WorkerStream::heartbeat(&log.stream, &w, &streams, tid);
        }
    }
}
