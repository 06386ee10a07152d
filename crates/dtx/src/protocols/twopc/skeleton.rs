//! The 2PC skeleton a concurrency control plugs into.
//!
//! Everything a protocol over two-phase commit does the same way lives here once: the node's
//! shared state and its recovery, a worker's decision table and participant table, running a
//! transaction (one-shot prefetch or interactive, reconnaissance for dependent keys, commit or
//! abandon), the orphan sweeper, resending commits a crash left unacknowledged, and answering
//! "what became of this transaction?". A concurrency control brings what differs, one trait per
//! role of its folder: its record metadata, node state and log ([`Cc`], its mod.rs), how its
//! coordinator starts, executes and commits an attempt ([`Coordinator`], [`CoordTxn`], its
//! coordinator.rs), and its participant state per transaction, how it serves remote requests
//! and how it installs or rolls back a prepared transaction ([`Participant`], its
//! participant.rs), and the requests and replies between them ([`Messages`], its messages.rs).
//! OCC, 2PL, TicToc, Sundial, MaaT and MVCC plug in this way.

use super::commit::epoch::EpochLog;
use super::commit::two_pc::TwoPcLog;
use super::commit::watermark::{WatermarkGate, WmLog};
use super::commit::{CommitPolicy, Gate, GateHost, GateNode, Policy};
use super::durable::{AckAfter, CcLog, InDoubt, Recovery, TxnLog};
use super::wire::{framed, framed_in_era, split_era, TAG_CC, TAG_CC_IN_ERA, TAG_PEEK, TAG_TERMINATION};
use super::{resend_unended, spawn_sweeper, CoordTable, NodeShared, PartTable, TxnId, TxnMeta, TxnStatus};
use crate::net::{decode, Addr, NodeId};
use crate::protocols::{Attempt, NodeEnv, NodeProtocol, Protocol, WorkerProtocol};
use crate::rt::{log_warn, CpuKind, Handler, LocalBoxFuture, Worker};
use crate::storage::{RowKey, Value};
use crate::txn::{recon, Abort, Access, Ctx, KeySet, Scan, TxnOutput, TxnRequest, TxnResult};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;

/// Options of the 2PC termination protocol, shared by every protocol over the skeleton.
#[derive(Debug, Clone, Copy)]
pub struct TwoPcConfig {
    /// A participant asks the coordinator about a transaction it has not heard of this long.
    pub orphan_after_us: u64,
    /// When a commit is safe to acknowledge ([`super::commit`]).
    pub commit: CommitPolicy,
}

/// The option every protocol over 2PC has (`orphan_after_us`), for its registry entry.
pub const ORPHAN_OPTION: crate::protocols::OptionSpec = crate::protocols::OptionSpec {
    name: "orphan_after_us",
    kind: crate::protocols::OptionKind::U64 { min: 1_000, max: 60_000_000 },
    default: "1000000",
    help: "a participant asks the coordinator about a transaction it has not heard of this long",
};

/// A transaction attempt as its coordinator runs it: the execution phase ([`Access`]), then
/// commit, or abandon when execution failed.
#[allow(async_fn_in_trait)] // Used only through generics on one thread: no `Send` bound wanted.
pub trait CoordTxn: Access {
    /// Fetch (and, for a locking protocol, lock) a declared key set, one message per participant.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()>;
    /// Two-phase commit of what execution did; returns where in the node's log the commit's
    /// acknowledgement waits (the skeleton waits there, or hands it to a deferring caller).
    async fn commit(&mut self) -> TxnResult<AckAfter>;
    /// Execution failed with `reason`: release whatever is held and tell the participants.
    fn abandon(&mut self, reason: Abort) -> Abort;
}

/// Commit a transaction that touched no other node with early lock release (Silo's epochs,
/// Aether): append its commit record while it still holds its locks (so that log order is
/// install order), then install and release at once; the acknowledgement waits for the
/// returned LSN. A read-only one waits for the log's tail instead, since it may have read a
/// write whose record is not durable yet. A record the log refuses aborts the attempt.
///
/// `stamp`: the commit timestamp and era of a concurrency control that has one (under
/// `commit=wm` the record carries it and the acknowledgement waits for the watermark to pass
/// it), else the default.
pub fn commit_with_early_release<T, C: Cc>(
    txn: &mut T,
    wk: &CcWorker<C>,
    (id, stamp): (TxnId, super::Stamp),
    local_writes: super::durable::Writes,
    install_and_release: fn(&mut T, super::durable::Writes),
    abort: fn(&mut T, Abort) -> Abort,
) -> TxnResult<AckAfter> {
    let lsn = match wk.local_commit_lsn(id, stamp, &local_writes) {
        Ok(lsn) => lsn,
        Err(a) => return Err(abort(txn, a)),
    };
    install_and_release(txn, local_writes);
    wk.wm_leave(id);
    Ok(wk.ack_after(stamp, lsn))
}

/// The reply to a request made in an epoch (or term) the participant is not in: empty, which no encoded
/// reply is (every reply type is an enum, one byte at least).
const REFUSED_FOR_EPOCH: &[u8] = &[];

/// A reconnaissance read (OLLP) of another node's committed state, served by the skeleton
/// through [`Participant::peek`] and [`Participant::peek_scan`]: it takes nothing and leaves
/// nothing behind.
#[derive(Debug, Serialize, Deserialize)]
enum Peek {
    Read(RowKey),
    Scan(Scan),
}

#[derive(Debug, Serialize, Deserialize)]
enum PeekReply {
    Value(Option<Value>),
    Rows(Vec<(u64, Value)>),
}

/// The termination protocol every concurrency control over the skeleton shares: a decision sent
/// to a participant, and a participant's question to a coordinator.
#[derive(Debug, Serialize, Deserialize)]
pub enum Termination {
    /// Install the transaction's writes here and release what it holds; `ts` is the decision's
    /// timestamp for a protocol that chooses one after the votes (MaaT), else 0; `epoch` the
    /// epoch it ran in under `commit=epoch` (a participant that rolled it back releases
    /// instead), else 0.
    Commit { txn: TxnId, ts: u64, epoch: u64 },
    /// Release what the transaction holds here and drop its writes.
    Abort { txn: TxnId },
    /// What became of the transaction? (asked by a participant of its coordinator)
    Status { txn: TxnId },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum TerminationReply {
    Ack,
    /// The coordinator's status of a transaction, with its commit timestamp where it has one,
    /// and its epoch.
    Status(TxnStatus, u64, u64),
}

/// A termination message, as the skeleton sends it.
pub(super) fn termination(t: &Termination) -> Vec<u8> {
    framed(TAG_TERMINATION, t)
}

/// The status in a coordinator's answer to [`Termination::Status`], if it is one.
pub(super) fn parse_status(reply: &[u8]) -> Option<(TxnStatus, u64, u64)> {
    match decode(reply) {
        Ok(TerminationReply::Status(s, ts, epoch)) => Some((s, ts, epoch)),
        _ => None,
    }
}

/// A concurrency control over two-phase commit: what its records and nodes carry, here; how
/// its coordinator starts an attempt, in [`Coordinator`] (its coordinator.rs), what its
/// participant does, in [`Participant`] (its participant.rs), and what they say to each other,
/// in [`Messages`] (its messages.rs). `Self` is its configuration (2PL's policy and lock wait),
/// kept by every worker.
pub trait Cc: Coordinator + Participant + Clone + Send + Sync + 'static {
    /// The name in log lines (`occ`, `2pl`).
    const NAME: &'static str;
    /// What a record carries.
    type Meta: TxnMeta + Sync;
    /// What one node keeps beside its storage, shared by its workers (Sundial's cache of remote
    /// records and table leases, MaaT's timetable of ranges); `()` for OCC and 2PL.
    type NodeState: FromNode<Self>;
    /// What it logs beside 2PC's records, and what replaying them rebuilds (Sundial's bound
    /// and vote timestamps, MaaT's bound and vote ranges); [`super::durable::PlainLog`] for OCC
    /// and 2PL.
    type Log: CcLog;

    /// Start the concurrency control's own background tasks on a worker, after the skeleton's
    /// (2PL's deadlock detector); none by default.
    fn start_worker(_wk: &Rc<CcWorker<Self>>) {}
}

/// A concurrency control's node state ([`Cc::NodeState`]), built once per node.
pub trait FromNode<C: Cc>: Send + Sync + 'static {
    /// The state of a node being built under configuration `cc`, after its storage is loaded
    /// and recovered from a log whose own records rebuilt `recovered` (a fresh node's is the
    /// default).
    fn from_node(cc: &C, node: &NodeShared<C::Meta>, recovered: &C::Log) -> Self;
}

/// A concurrency control that keeps nothing per node beside its storage (OCC, 2PL).
impl<C: Cc> FromNode<C> for () {
    fn from_node(_cc: &C, _node: &NodeShared<C::Meta>, _recovered: &C::Log) {}
}

/// How a concurrency control's coordinator starts a transaction attempt, implemented in its
/// coordinator.rs beside the attempt's type.
pub trait Coordinator: Sized {
    /// A transaction attempt on its coordinator.
    type Txn<'a>: CoordTxn
    where
        Self: 'a;

    /// Start an attempt of transaction `id`.
    fn begin<'a>(wk: &'a CcWorker<Self>, id: TxnId, attempt: Attempt) -> Self::Txn<'a>
    where
        Self: Cc;
}

/// What a concurrency control's coordinators ask its participants, and what they answer: the
/// wire types of its messages.rs.
pub trait Messages {
    type Request: Serialize + DeserializeOwned;
    type Reply: DeserializeOwned;
}

/// What a concurrency control's participant does for the transactions that reach its records,
/// implemented in each protocol's participant.rs. The skeleton calls it for the concurrency
/// control's own requests, for the decisions and answers of the termination protocol, after a
/// restart, and for reconnaissance reads. (Each method needs `Self: Cc` for [`CcWorker`]; `Cc`
/// is the trait that has this one as its part.)
pub trait Participant: Messages + Sized {
    /// A remote transaction's state on a participant.
    type Part;

    /// Does the commit decision install the writes here ([`Participant::commit_here`])? Under
    /// `commit=wm` the skeleton then checks the decision's term and takes the transaction out
    /// of the node's watermark once installed. Primo's decision only keeps a transaction alive:
    /// its `Install` brings the writes and leaves the watermark itself.
    const DECISION_INSTALLS: bool = true;

    /// A request from a coordinator, to be answered with `wk.w.reply` (now or later).
    fn serve(wk: &CcWorker<Self>, from: Addr, rpc_id: u64, req: Self::Request)
    where
        Self: Cc;
    /// Install a prepared transaction's writes (the coordinator decided commit, at `ts` for a
    /// concurrency control whose decisions carry a timestamp; 0 otherwise).
    fn commit_here(wk: &CcWorker<Self>, txn: TxnId, ts: u64)
    where
        Self: Cc;
    /// Roll back whatever this participant holds for `txn`.
    fn abort_here(wk: &CcWorker<Self>, txn: TxnId)
    where
        Self: Cc;
    /// Lock again, after a restart, the writes of transactions prepared here before it, with
    /// what each vote logged.
    fn adopt_in_doubt(wk: &CcWorker<Self>, in_doubt: InDoubt<<<Self as Cc>::Log as CcLog>::Vote>)
    where
        Self: Cc;
    /// A failed epoch (`commit=epoch`) or a recovery agreement (`commit=wm`) put back here every
    /// value it undid: drop what was derived from them (Sundial's cache of remote reads, whose
    /// copies may hold values that never committed, and whose leases a read-only transaction
    /// may reuse without asking their home).
    fn on_rolled_back(_wk: &CcWorker<Self>)
    where
        Self: Cc,
    {
    }

    /// Under `commit=wm`, a recovery agreement moved the node to term `term`: drop what
    /// transactions of older terms hold here (they were rolled back everywhere, and their
    /// coordinators may be gone), rather than wait for the orphan sweeper.
    fn on_new_term(wk: &CcWorker<Self>, term: u64)
    where
        Self: Cc,
    {
        let Some(wm) = wk.gate.watermark() else { return };
        let stale: Vec<TxnId> = wk.parts.txns.borrow().keys().copied().filter(|t| wm.active_before(*t, term)).collect();
        wk.w.count("wm-stale-released", stale.len() as u64);
        for txn in stale {
            Self::abort_here(wk, txn);
        }
    }
    /// The committed value of `key` here, taking nothing: what reconnaissance reads, for a
    /// coordinator here or on another node (the skeleton carries the request). By default the
    /// record's value, for a concurrency control whose records hold only committed values.
    fn peek(wk: &CcWorker<Self>, key: RowKey) -> Option<Value>
    where
        Self: Cc,
    {
        super::committed_value(&wk.node.store, key)
    }
    /// The committed rows of a range here, taking nothing, as [`Participant::peek`].
    fn peek_scan(wk: &CcWorker<Self>, scan: Scan) -> Vec<(u64, Value)>
    where
        Self: Cc,
    {
        super::committed_rows(&wk.node.store, scan)
    }
}

/// A protocol made of a concurrency control over the 2PC skeleton.
pub struct TwoPc<C: Cc> {
    pub cc: C,
    pub config: TwoPcConfig,
}

impl<C: Cc> Protocol for TwoPc<C> {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol> {
        match self.config.commit {
            CommitPolicy::TwoPc => self.build_under::<TwoPcLog>(env),
            CommitPolicy::Epoch { .. } => self.build_under::<EpochLog>(env),
            CommitPolicy::Watermark { .. } => self.build_under::<WmLog>(env),
        }
    }

    fn log_machine(
        &self,
        _env: &crate::protocols::MachineEnv,
        checkpoint: Option<&[u8]>,
    ) -> anyhow::Result<Box<dyn crate::rt::log::LogMachine>> {
        match self.config.commit {
            CommitPolicy::TwoPc => super::durable::machine::<C::Log, TwoPcLog>(C::NAME, checkpoint),
            CommitPolicy::Epoch { .. } => super::durable::machine::<C::Log, EpochLog>(C::NAME, checkpoint),
            CommitPolicy::Watermark { .. } => super::durable::machine::<C::Log, WmLog>(C::NAME, checkpoint),
        }
    }
}

impl<C: Cc> TwoPc<C> {
    /// The node, its log replayed under the commit policy `P`, whose gate it then builds.
    fn build_under<P: Policy>(&self, env: NodeEnv) -> Arc<dyn NodeProtocol> {
        let (shared, recovery, policy) = NodeShared::load::<C::Log, P>(env, C::NAME);
        let state = Arc::new(C::NodeState::from_node(&self.cc, &shared, &recovery.own));
        let node = GateNode { id: shared.id, nodes: shared.topo.nodes, log: &shared.log, restarted: recovery.boot > 1 };
        let gate = P::gate(policy, node, self.config.commit);
        let recovered = parking_lot::Mutex::new(recovery);
        let shared = Arc::new(shared);
        Arc::new(CcNode { shared, state, cc: self.cc.clone(), config: self.config, recovered, gate })
    }
}

struct CcNode<C: Cc> {
    shared: Arc<NodeShared<C::Meta>>,
    state: Arc<C::NodeState>,
    cc: C,
    config: TwoPcConfig,
    /// What recovery left undecided, claimed by the workers that own it as they start.
    recovered: parking_lot::Mutex<Recovery<C::Log>>,
    /// The node's side of its commit policy.
    gate: Gate,
}

impl<C: Cc> NodeProtocol for CcNode<C> {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let (in_doubt, unended) = self.recovered.lock().claim(w.addr.worker, self.shared.topo.workers_per_node);
        let wk = Rc::new_cyclic(|me| CcWorker {
            me: me.clone(),
            w: w.clone(),
            coord: CoordTable::new(self.shared.boot),
            node: self.shared.clone(),
            state: self.state.clone(),
            cc: self.cc.clone(),
            config: self.config,
            parts: PartTable::default(),
            last_outcome_lsn: Cell::new(0),
            unended: RefCell::new(unended),
            gate: self.gate.clone(),
        });
        C::adopt_in_doubt(&wk, in_doubt);
        let handler: Weak<dyn Handler> = Rc::downgrade(&(wk.clone() as Rc<dyn Handler>));
        w.set_handler(handler);
        wk
    }
}

/// One worker of a protocol over 2PC: a coordinator of its clients' transactions and the
/// participant of remote coordinators' transactions that map to it.
pub struct CcWorker<C: Cc> {
    pub me: Weak<CcWorker<C>>,
    pub w: Rc<Worker>,
    pub node: Arc<NodeShared<C::Meta>>,
    /// The concurrency control's own node-level state.
    pub state: Arc<C::NodeState>,
    /// The concurrency control's configuration.
    pub cc: C,
    pub config: TwoPcConfig,
    pub coord: CoordTable,
    pub parts: PartTable<C::Part>,
    /// The last `Outcome` record this worker logged: a commit is acknowledged after it.
    pub last_outcome_lsn: Cell<u64>,
    /// Commits this worker coordinated before a crash that not every participant acknowledged.
    unended: RefCell<super::durable::Unended>,
    /// The node's side of its commit policy ([`super::commit`]).
    pub gate: Gate,
}

impl<C: Cc> CcWorker<C> {
    /// Run one attempt: declare (or discover) the keys, prefetch, execute, commit, under the
    /// node's commit policy.
    async fn run(&self, req: &TxnRequest, attempt: Attempt) -> TxnResult<TxnOutput> {
        self.node.log.booted().await;
        let set_era = |epoch| self.coord.epoch.set(epoch);
        self.gate.run(&self.w, attempt, set_era, |attempt| self.run_attempt(req, attempt)).await
    }

    /// Run one attempt under the node's commit policy's first half: everything up to the
    /// acknowledgement, which a deferring caller (the driver, or `run` under epochs) takes.
    async fn run_attempt(&self, req: &TxnRequest, attempt: Attempt) -> TxnResult<TxnOutput> {
        self.w.charge(CpuKind::Txn, self.w.cost.txn_ns);
        let wl = self.node.workload.clone();
        let mut txn = C::begin(self, self.coord.new_txn(self.w.addr), attempt);
        let result = if self.node.opts.one_shot {
            let mut keys = KeySet::default();
            let declared = wl.declare(req, &mut keys);
            let discovered = if declared { Ok(()) } else { recon::discover(&*wl, req, self).await.map(|k| keys = k) };
            match discovered {
                Ok(()) => match txn.prefetch(&keys).await {
                    Ok(()) => wl.run(req, &mut Ctx::with_declared(&mut txn, &keys)).await,
                    Err(a) => Err(a),
                },
                Err(a) => Err(a),
            }
        } else {
            wl.run(req, &mut Ctx::new(&mut txn)).await
        };
        match result {
            Ok(mut out) => {
                let ack = txn.commit().await?;
                // Without a log there is nothing to wait for (`ack` is `None`).
                if attempt.defer_ack {
                    out.ack_after = ack;
                } else {
                    self.node.log.durable_counted(&self.w, ack).await;
                }
                Ok(out)
            }
            Err(a) => Err(txn.abandon(a)),
        }
    }
}

impl<C: Cc> CcWorker<C> {
    /// The worker of `node` that serves this worker's transactions.
    pub fn participant_addr(&self, node: NodeId) -> Addr {
        self.node.participant(node, self.w.addr)
    }

    /// The node's log (a no-op when the run is not durable).
    pub fn txn_log(&self) -> &TxnLog {
        &self.node.log
    }

    /// Send a vote or a read's answer once `lsn` is durable (at once without a log, and under
    /// `commit=epoch`, where the epoch's seal makes it durable before anything it decided is
    /// acknowledged).
    pub fn reply_when_durable(&self, to: Addr, rpc_id: u64, lsn: Option<u64>, body: Vec<u8>) {
        if self.gate.answers_at_once() {
            return self.w.reply(to, rpc_id, &body);
        }
        self.reply_after_log(to, rpc_id, lsn, body)
    }

    /// Send `body` once `lsn` is durable, whatever the commit policy: the termination
    /// protocol's answers, which let a coordinator forget a transaction or a participant drop
    /// one.
    fn reply_after_log(&self, to: Addr, rpc_id: u64, lsn: Option<u64>, body: Vec<u8>) {
        if !self.node.log.enabled() {
            return self.w.reply(to, rpc_id, &body);
        }
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            me.node.log.durable(lsn).await;
            me.w.reply(to, rpc_id, &body);
        });
    }

    /// Log that a transaction prepared here commits (at `ts` where its decision carries one,
    /// else 0), before its writes install and its locks go, so that log order is install order.
    /// The acknowledgement of the decision waits for this record (`last_outcome_lsn`); a record
    /// the log refuses only makes a restarted node ask the coordinator again.
    pub fn log_commit_here(&self, txn: TxnId, ts: u64) {
        if let Ok(Some(lsn)) = self.node.log.append_outcome(txn, true, ts) {
            self.last_outcome_lsn.set(lsn);
        }
    }

    /// Log that a transaction prepared here aborts, before its locks go: a later writer's vote
    /// must follow it in the log, or a crash could leave both in doubt over the same record.
    /// Presumed abort: nobody waits for this record, and a lost one reads as abort anyway.
    /// Under `commit=wm` a vote logs nothing, so neither does its abort.
    pub fn log_abort_here(&self, txn: TxnId) {
        if self.gate.logs_votes() {
            let _ = self.node.log.append_outcome(txn, false, 0);
        }
    }

    /// Apply the coordinator's answer about a transaction this worker holds state for.
    pub fn resolve(&self, txn: TxnId, status: TxnStatus, ts: u64, epoch: u64) {
        match status {
            TxnStatus::Active => self.parts.touch(txn, self.w.now_ns()),
            TxnStatus::Aborted => C::abort_here(self, txn),
            TxnStatus::Committed => self.commit_decided(txn, ts, epoch),
        }
    }

    /// The coordinator decided to commit `txn` (in `era`, the epoch or agreement term it ran
    /// in): install it here, unless the commit policy rolled its era back here (the policy's
    /// [`Gate::decided`]).
    fn commit_decided(&self, txn: TxnId, ts: u64, era: u64) {
        let installs_here = C::DECISION_INSTALLS && self.parts.contains(txn);
        self.gate.decided(txn, era, installs_here, || C::commit_here(self, txn, ts), || C::abort_here(self, txn));
    }

    /// Append a yes vote's record (`writes` install if `txn` commits, `vote` is the protocol's
    /// own part), as the commit policy has it ([`Gate::append_vote`]).
    pub fn append_prepared<V: Serialize + 'static>(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        vote: &V,
    ) -> Result<Option<u64>, Abort> {
        self.gate.append_vote(self, writes, || self.node.log.append_prepared(txn, writes, vote))
    }

    /// Append the commit decision of a transaction coordinated here: its writes to this node
    /// and the participants that must hear it ([`Gate::append_decision`]).
    pub fn append_commit(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
    ) -> Result<Option<u64>, Abort> {
        self.gate.append_decision(self, writes, || self.node.log.append_commit(txn, writes, participants, 0))
    }

    /// What a transaction that touched only this node waits for before it is acknowledged
    /// ([`Gate::local_commit_lsn`]).
    pub fn local_commit_lsn(
        &self,
        txn: TxnId,
        stamp: super::Stamp,
        writes: &[(RowKey, Option<Value>)],
    ) -> Result<Option<u64>, Abort> {
        self.gate.local_commit_lsn(self, txn, stamp, writes)
    }

    /// Log a distributed transaction's commit decision as the commit policy has it
    /// ([`Gate::log_decision`]).
    pub async fn log_decision(
        &self,
        txn: (TxnId, super::Stamp),
        local_writes: &[(RowKey, Option<Value>)],
        writers: &[NodeId],
        read_here: bool,
    ) -> TxnResult<()> {
        self.gate.log_decision(self, txn, local_writes, writers, read_here).await
    }

    /// One request to the participant on `node`, decoded; a timeout or a garbled reply aborts
    /// the attempt.
    pub async fn ask(&self, node: NodeId, req: &C::Request) -> TxnResult<C::Reply> {
        self.ask_tagged(node, TAG_CC, req).await
    }

    /// [`CcWorker::ask`] for a request that carries its own era and is served in any epoch (a
    /// decision that brings its writes, as Primo's `Install`): not framed with the epoch.
    pub async fn ask_any_epoch(&self, node: NodeId, req: &C::Request) -> TxnResult<C::Reply> {
        let body = self.w.call(self.participant_addr(node), framed(TAG_CC, req)).await.map_err(|_| Abort::Timeout)?;
        decode(&body).map_err(|_| Abort::BadReply)
    }

    /// One request to each of several participants, all in flight at once; the replies in the
    /// order asked.
    pub async fn ask_all(&self, requests: impl IntoIterator<Item = (NodeId, C::Request)>) -> Vec<TxnResult<C::Reply>> {
        let calls: Vec<_> = requests.into_iter().map(|(n, req)| async move { self.ask(n, &req).await }).collect();
        crate::rt::join_all(calls).await
    }

    async fn ask_tagged<Q: Serialize, R: DeserializeOwned>(&self, node: NodeId, tag: u8, req: &Q) -> TxnResult<R> {
        let framed = match self.gate.request_era() {
            Some(era) if tag == TAG_CC => framed_in_era(era, req),
            _ => framed(tag, req),
        };
        let body = self.w.call(self.participant_addr(node), framed).await.map_err(|_| Abort::Timeout)?;
        if body.is_empty() {
            return Err(self.gate.refusal());
        }
        decode(&body).map_err(|_| Abort::BadReply)
    }

    /// Serve a reconnaissance read.
    fn serve_peek(&self, from: Addr, rpc_id: u64, peek: Peek) {
        let reply = match peek {
            Peek::Read(key) => {
                self.w.charge_ops(1);
                PeekReply::Value(C::peek(self, key))
            }
            Peek::Scan(scan) => {
                let rows = C::peek_scan(self, scan);
                self.w.charge_ops(rows.len() + 1);
                PeekReply::Rows(rows)
            }
        };
        self.w.reply(from, rpc_id, &crate::net::encode(&reply));
    }

    /// Tell the participants on `nodes` that `txn` committed, in the background, until each
    /// acknowledges; then forget it (see [`super::tell_outcome`]).
    pub fn tell_commit(&self, txn: TxnId, nodes: Vec<NodeId>) {
        self.tell_commit_at(txn, 0, nodes)
    }

    /// [`CcWorker::tell_commit`] for a decision at timestamp `ts`.
    pub fn tell_commit_at(&self, txn: TxnId, ts: u64, nodes: Vec<NodeId>) {
        if let Some(me) = self.me.upgrade() {
            let epoch = self.coord.epoch_of(txn);
            super::tell_outcome(me, termination(&Termination::Commit { txn, ts, epoch }), nodes, Some(txn));
        }
    }

    /// A distributed commit decided: log it (durable before anyone learns it; a read-only one
    /// waits for what it may have read here, `read_here`), then tell the participants that
    /// wrote (`writers`), or forget the transaction when none did. A record the log refuses is
    /// the caller's abort.
    ///
    /// `stamp` as for [`commit_with_early_release`]; under `commit=wm` the decision names the
    /// term the transaction ran in, so that a participant an agreement moved on refuses it.
    pub async fn log_and_tell_commit(
        &self,
        (txn, stamp): (TxnId, super::Stamp),
        local_writes: &[(RowKey, Option<Value>)],
        writers: Vec<NodeId>,
        read_here: bool,
    ) -> TxnResult<()> {
        self.log_decision((txn, stamp), local_writes, &writers, read_here).await?;
        if writers.is_empty() {
            self.coord.forget(txn);
        } else {
            match self.gate.decision_era(stamp) {
                Some(era) => self.coord.set_committed_in(txn, stamp.ts, era),
                None => self.coord.set(txn, TxnStatus::Committed),
            }
            self.tell_commit(txn, writers);
        }
        Ok(())
    }

    /// `txn` aborted: if it left state on other nodes (`touched`, emptied), decide so and tell
    /// them in the background.
    pub fn abort_remote(&self, txn: TxnId, touched: &mut Vec<NodeId>) {
        if !touched.is_empty() {
            self.coord.set(txn, TxnStatus::Aborted);
            self.tell_abort(txn, std::mem::take(touched));
        }
    }

    /// Tell the participants on `nodes` that `txn` aborted, in the background.
    pub fn tell_abort(&self, txn: TxnId, nodes: Vec<NodeId>) {
        if let Some(me) = self.me.upgrade() {
            super::tell_outcome(me, termination(&Termination::Abort { txn }), nodes, None);
        }
    }

    /// The skeleton's side of the termination protocol, at a participant and a coordinator.
    fn serve_termination(&self, from: Addr, rpc_id: u64, t: Termination) {
        let reply = match t {
            Termination::Commit { txn, ts, epoch } => {
                if self.gate.holds_decisions() {
                    // Restarted, and not yet told what became of the epoch it ran in: the
                    // coordinator resends until we answer.
                    return;
                }
                // The coordinator forgets the transaction once we acknowledge: our outcome
                // record (this one, or one the orphan sweeper wrote) must be durable first.
                self.commit_decided(txn, ts, epoch);
                let lsn = Some(self.last_outcome_lsn.get());
                return self.reply_after_log(from, rpc_id, lsn, crate::net::encode(&TerminationReply::Ack));
            }
            Termination::Abort { txn } => {
                C::abort_here(self, txn);
                TerminationReply::Ack
            }
            Termination::Status { txn } => {
                // "Aborted" is also what a coordinator answers for a transaction it never heard
                // of: only an incarnation that still leads the node's log may say so.
                let (status, ts, epoch) = self.coord.get_at(txn);
                let status = self.gate.status(status, epoch);
                let fence = self.node.log.read_fence();
                let reply = crate::net::encode(&TerminationReply::Status(status, ts, epoch));
                return self.reply_after_log(from, rpc_id, fence, reply);
            }
        };
        self.w.reply(from, rpc_id, &crate::net::encode(&reply));
    }
}

impl<C: Cc> WorkerProtocol for CcWorker<C> {
    fn execute<'a>(&'a self, req: &'a TxnRequest, attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>> {
        Box::pin(self.run(req, attempt))
    }

    fn ack_source(&self) -> Option<Arc<dyn crate::rt::release::AckSource>> {
        if let Some(acks) = self.gate.acks() {
            return Some(acks);
        }
        self.node.log.node_log().map(|log| log.clone() as Arc<dyn crate::rt::release::AckSource>)
    }

    fn start(&self) {
        if let Some(me) = self.me.upgrade() {
            self.gate.start(&me);
            if let Some(wm) = self.gate.watermark() {
                spawn_term_watch(&me, wm.clone());
            }
            spawn_sweeper(&me, self.config.orphan_after_us);
            resend_unended(&me, self.unended.take());
            C::start_worker(&me);
        }
    }
}

/// Under `commit=wm`, every worker looks each watermark interval whether an agreement moved the
/// node to a new term, and then drops what older terms' transactions hold here.
fn spawn_term_watch<C: Cc>(me: &Rc<CcWorker<C>>, wm: Arc<WatermarkGate>) {
    let weak = Rc::downgrade(me);
    let w = me.w.clone();
    w.spawn(async move {
        let mut seen = wm.term();
        loop {
            let Some(w) = weak.upgrade().map(|m| m.w.clone()) else { return };
            w.sleep_us(wm.interval_us()).await;
            let Some(me) = weak.upgrade() else { return };
            let term = wm.term();
            if term != seen {
                seen = term;
                C::on_new_term(&me, term);
            }
        }
    });
}

/// Reconnaissance (OLLP) reads the committed state wherever it lives, the same way for every
/// concurrency control: the transaction that follows reads (and locks, or validates) what it
/// declared, so a stale answer costs a `recon-mismatch` retry, never a wrong result.
impl<C: Cc> recon::SnapshotReader for CcWorker<C> {
    fn read<'a>(&'a self, key: RowKey) -> LocalBoxFuture<'a, TxnResult<Option<Value>>> {
        Box::pin(async move {
            let n = self.node.node_of(key);
            if n == self.node.id {
                return Ok(C::peek(self, key));
            }
            match self.ask_tagged(n, TAG_PEEK, &Peek::Read(key)).await? {
                PeekReply::Value(v) => Ok(v),
                PeekReply::Rows(_) => Err(Abort::BadReply),
            }
        })
    }

    fn scan<'a>(&'a self, s: Scan) -> LocalBoxFuture<'a, TxnResult<Vec<(u64, Value)>>> {
        Box::pin(async move {
            let n = self.node.node_of(RowKey::new(s.table, s.lo));
            if n == self.node.id {
                return Ok(C::peek_scan(self, s));
            }
            match self.ask_tagged(n, TAG_PEEK, &Peek::Scan(s)).await? {
                PeekReply::Rows(rows) => Ok(rows),
                PeekReply::Value(_) => Err(Abort::BadReply),
            }
        })
    }
}

impl<C: Cc> Handler for CcWorker<C> {
    fn on_request(&self, from: Addr, rpc_id: u64, body: &[u8]) {
        let decoded = match body.split_first() {
            Some((&TAG_CC, rest)) => decode::<C::Request>(rest).map(|r| C::serve(self, from, rpc_id, r)),
            Some((&TAG_CC_IN_ERA, rest)) if rest.len() >= 8 => {
                let (era, rest) = split_era(rest).expect("eight bytes");
                if !self.gate.serves(era) || !self.node.log.is_booted() {
                    return self.w.reply(from, rpc_id, REFUSED_FOR_EPOCH);
                }
                decode::<C::Request>(rest).map(|r| C::serve(self, from, rpc_id, r))
            }
            Some((&TAG_TERMINATION, rest)) => decode(rest).map(|t| self.serve_termination(from, rpc_id, t)),
            Some((&TAG_PEEK, rest)) => decode(rest).map(|p| self.serve_peek(from, rpc_id, p)),
            _ => return log_warn(&format!("{}: a request from {from} without a known tag", C::NAME)),
        };
        if let Err(e) = decoded {
            log_warn(&format!("{}: malformed request from {from}: {e}", C::NAME));
        }
    }

    fn on_oneway(&self, from: Addr, body: &[u8]) {
        let handled = match (body.split_first(), self.me.upgrade()) {
            (Some((&tag, rest)), Some(me)) => self.gate.on_message(&me, from, tag, rest),
            _ => false,
        };
        if !handled {
            log_warn(&format!("{}: unexpected one-way message from {from}", C::NAME));
        }
    }
}

/// The node a worker runs on, as its commit policy's gate sees it.
impl<C: Cc> GateHost for CcWorker<C> {
    fn worker(&self) -> &Rc<Worker> {
        &self.w
    }

    fn gate_log(&self) -> &TxnLog {
        &self.node.log
    }

    fn read_row(&self, key: RowKey) -> Option<Value> {
        super::committed_value(&self.node.store, key)
    }

    fn restore_row(&self, key: RowKey, value: Option<Value>) {
        let rec = self.node.store.get_or_create(key);
        let mut row = rec.lock();
        row.value = value;
        row.meta.on_rolled_back();
    }

    fn rolled_back(&self) {
        C::on_rolled_back(self);
    }
}
