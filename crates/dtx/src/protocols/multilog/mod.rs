//! A test-only protocol that keeps several logs per node (`multilog:logs=N`, in test builds and
//! with the `test-protocols` feature, which the integration tests turn on), to check what the
//! runtimes do with a protocol's logs end to end: each log a WAL of its own with `--durability
//! wal`, each a Raft group of its own with `--durability replicated`, failing over with the
//! node's other logs to one host; and, with `epoch_us`, acknowledgement by COCO's epoch group
//! commit ([`epochs`]), whose failed epochs reach their clients as rolled back.

mod epochs;

use crate::cluster::{Role, Roles, Topology};
use crate::net::Addr;
use crate::protocols::{Attempt, Layout, MachineEnv, OptionKind, OptionSpec, ProtocolInfo, WorkerProtocol};
use crate::rt::log::{LogMachine, NodeLog};
use crate::rt::{CpuKind, Worker};
use crate::storage::{RowKey, Storage, Value};
use crate::testkit::{now, Direct};
use crate::txn::{Abort, Ctx, TxnRequest, TxnResult};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

pub const INFO: ProtocolInfo = ProtocolInfo {
    name: "multilog",
    status: "test",
    guarantee: super::Guarantee::StrictSerializable,
    description: "test only: the data on node 0, serial, several logs per node",
    options: &[
        OptionSpec { name: "logs", kind: OptionKind::U64 { min: 1, max: 16 }, default: "2", help: "logs per node" },
        OptionSpec {
            name: "epoch_us",
            kind: OptionKind::U64 { min: 0, max: 1_000_000 },
            default: "0",
            help: "acknowledge by epoch group commit (COCO's) with epochs this long; 0: once every log is durable",
        },
    ],
    aborts: &[],
    make: |o| Arc::new(MultiLog { logs: o.u64("logs") as u16, epoch_us: o.u64("epoch_us") }),
    lives: &[("all of it", "protocols/multilog/mod.rs"), ("its epochs", "protocols/multilog/epochs.rs")],
};

/// All the data lives on node 0, whose workers run each transaction serially against storage
/// and log its writes as a record `(boot, seq, epoch, writes)` in log `seq % logs`. The other
/// nodes only hold replicas of logs (its default layout). A transaction is acknowledged:
/// - (`epoch_us = 0`) once every log is durable up to where it was appended, so that its
///   predecessors are durable too. Every so often a worker whose transaction became durable in
///   every log appends a `Stable` marker to every log: each log's machine folds its records up
///   to it into the latest write per row, so that a log's snapshot stays as large as the data.
///   Recovery keeps, boot by boot, the records up to the last `Stable` and then the unbroken run
///   of sequence numbers after it: a record after a gap was never acknowledged, and nothing
///   acknowledged read it.
/// - (`epoch_us > 0`) once its epoch committed: every node made what it logged in the epoch
///   durable and node 0 logged the decision (`Decided`) in every log. A failed epoch (a node
///   that crashed, or did not answer in time) is undone at node 0 and its transactions reach
///   their clients as rolled back. Recovery keeps the epochs a log holds `Decided(e, true)`
///   for, and no other: an epoch whose decision a crash lost was never acknowledged, and may
///   have been reported rolled back (its abort is not waited for). Node 0 logs again, when it
///   starts, the fate recovery found for each epoch a log holds records of without its
///   decision, so that every log settles them.
///
/// The rows recovered are, per row, its write of the latest `(boot, seq)`.
pub struct MultiLog {
    pub logs: u16,
    pub epoch_us: u64,
}

/// A transaction's writes as logged: `(boot, seq, epoch, writes)`; epoch 0 without epochs.
type Logged = (u32, u64, u64, Vec<(RowKey, Option<Value>)>);

/// A row's write and when it was made: `(boot, seq)`.
type Versioned = ((u32, u64), Option<Value>);

#[derive(serde::Serialize, serde::Deserialize)]
enum MultiRecord {
    Writes(Logged),
    /// Every record of boot `.0` up to sequence number `.1` is durable in every log.
    Stable(u32, u64),
    /// Everything this node logged in the epoch is in the logs before this marker.
    EpochEnd(u64),
    /// The epoch's fate (node 0 logs it in every log before it releases or after it undoes).
    Decided(u64, bool),
}

/// A `Stable` marker is appended once this many transactions became durable since the last.
const STABLE_EVERY: u64 = 32;

impl crate::protocols::Protocol for MultiLog {
    fn build_node(&self, env: crate::protocols::NodeEnv) -> Arc<dyn crate::protocols::NodeProtocol> {
        let store: Storage<()> = crate::protocols::load_storage(&env);
        let recovered = recover(&env);
        for (k, (_, v)) in recovered.rows {
            store.get_or_create(k).lock().value = v;
        }
        let logs: Vec<Arc<NodeLog>> =
            env.log.iter().cloned().chain(env.more_logs.iter().map(|l| l.log.clone())).collect();
        let exec = parking_lot::Mutex::new(Sequence { next: 1, stable_logged: 0 });
        let epochs = (self.epoch_us > 0)
            .then(|| epochs::Epochs::new(env.node, env.topo.nodes, self.epoch_us, recovered.last_epoch));
        let state = MultiState { store, env, logs, boot: recovered.boot, exec, epochs };
        // Each log folds or drops those records at this decision, so that its snapshot stays
        // as large as the data. It is the fate recovery found, and nothing logged later can
        // change that (a decision names only its own epoch), so it need not be durable before
        // the node serves.
        for (&epoch, &committed) in &recovered.unsettled {
            state.append_everywhere(&MultiRecord::Decided(epoch, committed));
        }
        Arc::new(MultiNode(Arc::new(state)))
    }

    fn check_topology(&self, topo: &Topology) -> anyhow::Result<()> {
        let data: Vec<u16> = (0..topo.nodes).filter(|&n| topo.roles_of(n).contains(Role::Data)).collect();
        if data != [0] || !topo.roles_of(0).contains(Role::Client) {
            anyhow::bail!("multilog runs its data and clients on node 0 only (data nodes here: {data:?})");
        }
        Ok(())
    }

    fn logs(&self, _topo: &Topology) -> u16 {
        self.logs
    }

    fn log_machine(&self, _env: &MachineEnv, checkpoint: Option<&[u8]>) -> anyhow::Result<Box<dyn LogMachine>> {
        Ok(Box::new(FoldingMachine::from_checkpoint(checkpoint)?))
    }

    fn default_layout(&self, nodes: u16) -> Layout {
        let replica_host = Roles::of(&[Role::Replicator]);
        let roles = (0..nodes).map(|n| if n == 0 { Roles::DEFAULT } else { replica_host }).collect();
        Layout { roles, regions: Vec::new() }
    }
}

/// What a node recovers from its logs.
struct Recovered {
    /// The boot the node starts now (0: its logs are empty).
    boot: u32,
    /// Per row, its latest valid write.
    rows: BTreeMap<RowKey, Versioned>,
    /// The highest epoch the logs name (0: none).
    last_epoch: u64,
    /// The epochs some log holds writes of without their decision, and whether recovery found
    /// them committed (another log holds the decision) or not (left out of `rows`: their
    /// decision, if one was made, was lost in a crash).
    unsettled: BTreeMap<u64, bool>,
}

fn recover(env: &crate::protocols::NodeEnv) -> Recovered {
    let logs = std::iter::once((&env.checkpoint, &env.recovered))
        .chain(env.more_logs.iter().map(|l| (&l.checkpoint, &l.records)));
    let mut machines = Vec::new();
    for (checkpoint, records) in logs {
        let mut m = FoldingMachine::from_checkpoint(checkpoint.as_deref()).expect("a multilog checkpoint");
        records.iter().for_each(|r| m.apply(r));
        machines.push(m);
    }
    // Only an explicit decision counts: an epoch below a later decision may have had its own
    // lost in a crash (the coordinator that took over skipped it), and its clients may have
    // been told it rolled back.
    let committed = |e: u64| machines.iter().any(|m| m.committed_epoch(e));
    let mut stable: BTreeMap<u32, u64> = BTreeMap::new();
    let mut rows: BTreeMap<RowKey, Versioned> = BTreeMap::new();
    let mut pending: Vec<&Logged> = Vec::new();
    let (mut boot, mut last_epoch, mut unsettled) = (0, 0, BTreeMap::new());
    for m in &machines {
        for (&b, &s) in &m.stable {
            let e = stable.entry(b).or_default();
            *e = (*e).max(s);
        }
        boot = boot.max(m.next_boot);
        last_epoch = last_epoch.max(m.last_epoch);
        for (k, w) in &m.rows {
            latest(&mut rows, *k, w.clone());
        }
        pending.extend(&m.pending);
    }
    pending.sort_by_key(|r| (r.0, r.1));
    let mut run = (u32::MAX, 0);
    for (b, seq, epoch, writes) in pending {
        if *b != run.0 {
            run = (*b, stable.get(b).copied().unwrap_or(0));
        }
        let valid = match epoch {
            0 if *seq <= run.1 || *seq == run.1 + 1 => {
                run.1 = run.1.max(*seq);
                true
            }
            0 => false,
            e => *unsettled.entry(*e).or_insert_with(|| committed(*e)),
        };
        if valid {
            writes.iter().for_each(|(k, v)| latest(&mut rows, *k, ((*b, *seq), v.clone())));
        }
    }
    Recovered { boot, rows, last_epoch, unsettled }
}

/// Keep `write` as `key`'s value unless the one kept is later (a transaction that wrote a row
/// twice logged both writes in order: the second wins).
fn latest(rows: &mut BTreeMap<RowKey, Versioned>, key: RowKey, write: Versioned) {
    match rows.get(&key) {
        Some((at, _)) if *at > write.0 => {}
        _ => {
            rows.insert(key, write);
        }
    }
}

/// A log's state machine: the latest write per row of its records known valid (folded at a
/// `Stable` marker, or at its epoch's `Decided` if it committed; dropped if it aborted), and its
/// records after them (an epoch's records whose decision is in another log, or was lost).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct FoldingMachine {
    rows: BTreeMap<RowKey, Versioned>,
    pending: Vec<Logged>,
    /// Per boot, the highest `Stable` marker this log holds.
    stable: BTreeMap<u32, u64>,
    /// One past the highest boot a record of this log names.
    next_boot: u32,
    /// The highest epoch a record of this log names.
    last_epoch: u64,
    /// The epochs this log holds a decision to commit for, as inclusive ranges (a run of
    /// commits is one range: only a failed epoch or a takeover starts another). An epoch
    /// outside them is not known committed, whatever later epochs this log saw decided.
    committed: Vec<(u64, u64)>,
}

impl FoldingMachine {
    fn from_checkpoint(checkpoint: Option<&[u8]>) -> anyhow::Result<FoldingMachine> {
        match checkpoint {
            Some(bytes) => crate::net::decode(bytes).map_err(|e| anyhow::anyhow!("not a multilog checkpoint: {e}")),
            None => Ok(FoldingMachine::default()),
        }
    }

    fn committed_epoch(&self, epoch: u64) -> bool {
        self.committed.iter().any(|&(from, to)| (from..=to).contains(&epoch))
    }

    /// Fold the pending records `valid` picks into the rows; drop those `gone` picks.
    fn settle(&mut self, valid: impl Fn(&Logged) -> bool, gone: impl Fn(&Logged) -> bool) {
        let (fold, keep): (Vec<Logged>, Vec<Logged>) =
            std::mem::take(&mut self.pending).into_iter().filter(|r| !gone(r)).partition(|r| valid(r));
        self.pending = keep;
        for (b, seq, _, writes) in fold {
            writes.into_iter().for_each(|(k, v)| latest(&mut self.rows, k, ((b, seq), v)));
        }
    }
}

impl LogMachine for FoldingMachine {
    fn apply(&mut self, record: &[u8]) {
        match crate::net::decode(record).expect("a multilog record") {
            MultiRecord::Writes(logged) => {
                self.next_boot = self.next_boot.max(logged.0 + 1);
                self.last_epoch = self.last_epoch.max(logged.2);
                self.pending.push(logged);
            }
            MultiRecord::Stable(b, upto) => {
                let e = self.stable.entry(b).or_default();
                *e = (*e).max(upto);
                self.settle(|r| r.0 == b && r.1 <= upto && r.2 == 0, |_| false);
            }
            MultiRecord::EpochEnd(e) => self.last_epoch = self.last_epoch.max(e),
            MultiRecord::Decided(e, committed) => {
                self.last_epoch = self.last_epoch.max(e);
                if committed && !self.committed_epoch(e) {
                    match self.committed.last_mut() {
                        Some((_, to)) if *to + 1 == e => *to = e,
                        _ => self.committed.push((e, e)),
                    }
                }
                self.settle(|r| committed && r.2 == e, |r| !committed && r.2 == e);
            }
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        crate::net::encode(self)
    }
}

/// Node 0's sequence numbers.
struct Sequence {
    next: u64,
    /// The highest sequence number a `Stable` marker was appended for.
    stable_logged: u64,
}

struct MultiState {
    store: Storage<()>,
    env: crate::protocols::NodeEnv,
    logs: Vec<Arc<NodeLog>>,
    boot: u32,
    /// Held while a transaction runs, logs and installs (serial execution), and while an epoch
    /// closes (so that no transaction of the epoch is logged after its end marker).
    exec: parking_lot::Mutex<Sequence>,
    /// With `epoch_us`: the epoch group commit.
    epochs: Option<epochs::Epochs>,
}

impl MultiState {
    /// Append `record` to every log; returns, per log, the LSN it must be durable up to.
    fn append_everywhere(&self, record: &MultiRecord) -> Vec<u64> {
        let bytes = crate::net::encode(record);
        self.logs
            .iter()
            .map(|l| {
                // A log that refuses it is failing; waiting on it then never ends, and the
                // epoch or the transaction waiting for it fails on its timeout.
                let _ = l.append(&bytes);
                l.appended_lsn()
            })
            .collect()
    }

    /// Wait until every log is durable up to `tails`.
    async fn durable(&self, tails: Vec<u64>) {
        for (l, tail) in self.logs.iter().zip(tails) {
            l.wait(tail).await;
        }
    }
}

struct MultiNode(Arc<MultiState>);

impl crate::protocols::NodeProtocol for MultiNode {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let worker = Rc::new(MultiWorker { w: w.clone(), s: self.0.clone() });
        let handler: std::rc::Weak<dyn crate::rt::Handler> = Rc::downgrade(&worker) as _;
        w.set_handler(handler);
        worker
    }
}

struct MultiWorker {
    w: Rc<Worker>,
    s: Arc<MultiState>,
}

impl crate::rt::Handler for MultiWorker {
    fn on_request(&self, _from: Addr, _rpc_id: u64, _body: &[u8]) {}

    fn on_oneway(&self, from: Addr, body: &[u8]) {
        if let Some(e) = &self.s.epochs {
            e.on_message(&self.w, &self.s, from, body);
        }
    }
}

impl MultiWorker {
    /// Run `req` serially in `epoch` (0: none), log it and install its writes; returns its
    /// output, its sequence number and, per log, the LSN it must be durable up to.
    /// `None`: the epoch closed before the transaction could join it.
    fn run_and_log(&self, req: &TxnRequest, epoch: u64) -> TxnResult<Option<(crate::txn::TxnOutput, u64, Vec<u64>)>> {
        let s = &self.s;
        assert!(s.env.node == 0, "multilog runs transactions on node 0 only (its layout's clients)");
        let mut sequence = s.exec.lock();
        if s.epochs.as_ref().is_some_and(|e| e.open_epoch() != Some(epoch)) {
            return Ok(None);
        }
        let mut run = Direct::new(&s.store);
        let out = now(s.env.workload.run(req, &mut Ctx::new(&mut run)))?;
        let seq = sequence.next;
        let record = MultiRecord::Writes((s.boot, seq, epoch, run.writes.clone()));
        let log = &s.logs[(seq % s.logs.len() as u64) as usize];
        log.append(&crate::net::encode(&record)).map_err(|_| Abort::LogRefused)?;
        sequence.next += 1;
        if let Some(e) = &s.epochs {
            e.keep_undo(run.writes.iter().map(|(k, _)| (*k, s.store.get(*k).and_then(|r| r.lock().value.clone()))));
        }
        // Installed before it is durable: execution is serial, and acknowledged only after.
        run.commit();
        Ok(Some((out, seq, s.logs.iter().map(|l| l.appended_lsn()).collect())))
    }

    /// Transaction `seq` is durable in every log, and so is every one before it: say so in
    /// every log once `STABLE_EVERY` more are (a marker lost in a crash costs nothing: recovery
    /// then takes the unbroken run after the last one it finds).
    fn mark_stable(&self, seq: u64) {
        let s = &self.s;
        let mut sequence = s.exec.lock();
        if seq < sequence.stable_logged + STABLE_EVERY {
            return;
        }
        sequence.stable_logged = seq;
        s.append_everywhere(&MultiRecord::Stable(s.boot, seq));
    }

    /// Acknowledged once every log is durable up to where it was appended.
    async fn run_acked_by_logs(&self, req: &TxnRequest) -> TxnResult<crate::txn::TxnOutput> {
        let (out, seq, tails) = self.run_and_log(req, 0)?.expect("no epoch to miss");
        let waited_from_ns = self.w.now_ns();
        self.s.durable(tails).await;
        self.w.note_log_wait(self.w.now_ns() - waited_from_ns);
        self.mark_stable(seq);
        Ok(out)
    }
}

impl WorkerProtocol for MultiWorker {
    fn execute<'a>(
        &'a self,
        req: &'a TxnRequest,
        attempt: Attempt,
    ) -> crate::rt::LocalBoxFuture<'a, TxnResult<crate::txn::TxnOutput>> {
        Box::pin(async move {
            self.w.charge(CpuKind::Txn, self.w.cost.txn_ns);
            match &self.s.epochs {
                None => self.run_acked_by_logs(req).await,
                Some(e) => e.run(self, req, attempt).await,
            }
        })
    }

    fn ack_source(&self) -> Option<Arc<dyn crate::rt::release::AckSource>> {
        self.s.epochs.as_ref().map(|e| e.points() as Arc<dyn crate::rt::release::AckSource>)
    }

    fn start(&self) {
        if let Some(e) = &self.s.epochs {
            e.start(&self.w, &self.s);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::host::{self, BenchSpec};
    use crate::replication::Durability;
    use crate::workloads::WorkloadParams;

    fn spec(runtime: crate::host::Runtime, seed: u64) -> BenchSpec {
        let wl = WorkloadParams { name: "append".into(), keys: 16, ops: 4, read_ratio: 0.5, ..Default::default() };
        let mut s = BenchSpec::new("multilog:logs=3", wl, runtime);
        s.nodes = 1;
        s.workers = 1;
        s.inflight = 8;
        s.duration_us = 400_000;
        s.warmup_us = 0;
        s.seed = seed;
        s.durability.mode = Durability::Wal;
        s
    }

    #[test]
    fn crashes_keep_what_each_log_flushed_and_lose_nothing_acknowledged() {
        for seed in 1..=6 {
            let s = spec(crate::host::Runtime::Sim, seed).with_faults(true, false, 0.0);
            let out = crate::testkit::checked_run(&s);
            assert!(out.restarts > 0, "seed {seed}: no crash lost memory");
            assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        }
    }

    /// Node 0's host crashes and stays down past an election: another host must come to lead
    /// both of node 0's logs (one handing its lead to the other's leader) and serve the node
    /// from them, losing nothing acknowledged.
    #[test]
    fn both_replicated_logs_of_a_node_fail_over_to_one_host() {
        for seed in 1..=3 {
            let mut s = spec(crate::host::Runtime::Sim, seed);
            s.protocol = "multilog:logs=2".into();
            s.nodes = 3;
            s.duration_us = 1_200_000;
            // Replication round trips pace the commits: lists stay short (a record carries
            // whole lists, so a fast run's records grow with its length).
            s.latency.delay_us = 150;
            s.inflight = 2;
            s.durability.mode = Durability::Replicated;
            s.durability.replicas = 3;
            s.faults.targeted = vec![crate::net::TargetedFault {
                kind: crate::net::TargetedKind::Crash,
                target: crate::net::FaultTarget::Node(0),
                at_us: 300_000,
                for_us: Some(600_000),
            }];
            let out = crate::testkit::checked_run(&s);
            assert!(out.moved > 0, "seed {seed}: node 0 did not move to another host");
        }
    }

    /// Epoch group commit over two replicated logs per node: hosts crash, links are cut and
    /// lose messages, so some epochs fail; their transactions are undone and reach their
    /// clients as rolled back, and the history of what was acknowledged stays serializable.
    /// Placement is region-aware: nodes 0-2 are one region and node 3 another, so node 0's logs
    /// are replicated within its region and node 3's reach past its own.
    #[test]
    fn failed_epochs_are_rolled_back_and_reach_their_clients_as_aborted() {
        let (mut rolled_back, mut committed) = (0, 0);
        for seed in 1..=4 {
            let mut s = spec(crate::host::Runtime::Sim, 7000 + seed).with_faults(true, true, 0.02);
            s.protocol = "multilog:logs=2:epoch_us=2000".into();
            s.nodes = 4;
            s.latency.node_region = vec![0, 0, 0, 1];
            assert_eq!(s.topology().log_voters(0, 3), [0, 1, 2], "node 0's logs vote in its region");
            assert_eq!(s.topology().log_voters(3, 3), [3, 0, 1]);
            s.workers = 2;
            s.inflight = 4;
            // Deferred acknowledgements free a client at once: bound what waits for an epoch,
            // or a run's lists (whole in every record) grow without limit.
            s.max_unacked = 2;
            s.duration_us = 800_000;
            s.latency.delay_us = 150;
            s.faults.fault_interval_us = 150_000;
            s.durability.mode = Durability::Replicated;
            s.durability.replicas = 3;
            let out = crate::testkit::checked_run(&s);
            rolled_back += out.totals.aborts.get("rolled-back").copied().unwrap_or(0);
            committed += out.totals.committed;
        }
        assert!(committed > 100, "{committed} committed over the sweep");
        assert!(rolled_back > 0, "no epoch failed over the sweep ({committed} committed)");
    }

    /// The `local` runtime's owner-led replication: each of node 0's three logs is a Raft group
    /// of its own over the three nodes' hosts, and the run checks.
    #[test]
    fn each_log_is_replicated_in_the_local_runtime() {
        let mut s = spec(crate::host::Runtime::Local, 1);
        s.nodes = 3;
        s.durability.mode = Durability::Replicated;
        s.durability.replicas = 3;
        s.max_unacked = 2;
        let out = crate::testkit::checked_run(&s);
        assert!(out.totals.committed > 0);
    }

    #[test]
    fn each_log_is_a_write_ahead_log_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(crate::host::Runtime::Local, 1);
        s.durability.data_dir = Some(dir.path().to_path_buf());
        let out = host::run_local(&s).expect("the run");
        assert!(out.totals.committed > 0);
        for name in ["node-0", "node-0-log-1", "node-0-log-2"] {
            let cluster = dir.path().join(format!("{:016x}", s.durability.cluster_id));
            let bytes: u64 = std::fs::read_dir(cluster.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("wal-"))
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum();
            assert!(bytes > 36, "{name} holds records ({bytes} bytes)");
        }
    }
}
