//! COCO's epoch group commit for any concurrency control over the skeleton (`commit=epoch`).
//!
//! Under `commit=2pc` a yes vote, a decision and an early-released commit each wait for their
//! log record to be durable, and a client is acknowledged once its decision is. Under
//! `commit=epoch` nothing waits for the log per transaction: votes are answered, decisions
//! installed and locks released at once, and a client hears of its commit when the whole epoch
//! commits (Lu et al., COCO, VLDB 2021; the baseline Primo measures against, §2.3). Node 0
//! runs the epoch coordinator (`replication::epoch`); every node is a participant, and this
//! module is its side of the protocol, one [`EpochGate`] per node:
//!
//! - **The barrier.** A transaction joins the node's open epoch (`admit`). When the coordinator
//!   closes the epoch, the node admits no more, lets the transactions it coordinates finish and
//!   tells node 0 it has drained. Once every node has, no transaction of the epoch is running
//!   anywhere: node 0 tells them to seal, and each appends `EpochRecord::Sealed` and votes once that
//!   record is durable, so everything it did in the epoch lies before it. A transaction longer
//!   than an epoch stretches its epoch instead of failing at its close. The next epoch opens
//!   when the node learns this one's fate.
//! - **Requests carry their epoch.** A participant serves a request only in the epoch it was
//!   made in, and appends a transaction's records only before its seal; otherwise the request
//!   is refused (`epoch-closed`). So what a node logged in an epoch is covered by its vote, and
//!   a transaction never reads what a failed epoch wrote.
//! - **Rollback.** Every write a node installs in an epoch first saves the value it replaces
//!   (in log order, under the gate's lock). A failed epoch (a participant that crashed, did not
//!   answer in time, or could not make its log durable) is undone on every node in reverse
//!   order; its commits reach their clients as `rolled-back`, and a decision that arrives later
//!   for one of its transactions releases instead of installing.
//! - **Recovery.** Replay keeps the records of committed epochs only
//!   ([`EpochLog`]). An epoch the node sealed without learning its fate is
//!   replayed as committed, with its undo kept, until the coordinator's next message settles
//!   it; the restarted node votes down the epoch it crashed in. The coordinator logs every
//!   decision before announcing it, and closes the next epoch (whose `Close` names the last
//!   committed one) only after that too, so a coordinator that fails over resumes past every
//!   epoch it may have opened and knows the last it committed. A fresh node serves nothing
//!   until its log holds its first epoch durably: a later incarnation that finds no epoch in
//!   its log is then truly fresh, not one that lost what it wrote in its first epoch.
//!
//! The gate is one mutex per node, taken when a transaction joins and leaves an epoch, around
//! each record that carries writes, and around each install a decision makes at a participant:
//! the order of saved values must be the order of installs across the node's workers.

use super::{CommitPolicy, Gate, GateHost, GateNode, Policy};
use crate::net::{Addr, NodeId};
use crate::protocols::twopc::durable::{CcLog, CoreReplay, InDoubt, LogRecord, PolicyLog, Record, TxnLog};
use crate::protocols::twopc::wire::{framed, TAG_EPOCH};
use crate::protocols::twopc::TxnId;
use crate::protocols::{OptionKind, OptionSpec};
use crate::replication::epoch::{
    EpochConfig, EpochCoordinator, EpochMsg, EpochOutcome, EpochParticipant, ParticipantState,
};
use crate::rt::release::{AckSource, Release, ReleasePoints};
use crate::rt::{log_warn, Worker};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, TxnOutput, TxnResult};
use parking_lot::Mutex;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The skeleton's commit policy option, for the registry entries of the concurrency controls
/// that roll back by restoring values ([`crate::protocols::twopc::TxnMeta::on_rolled_back`]).
pub const COMMIT_OPTION: OptionSpec = OptionSpec {
    name: "commit",
    kind: OptionKind::Choice(&["2pc", "epoch"]),
    default: "2pc",
    help: "2pc: each vote and decision is durable before it counts; epoch: COCO's epoch group commit",
};

/// The epoch length under `commit=epoch` (Primo's evaluation unified COCO's epoch and its
/// watermark interval at 20 ms).
pub const EPOCH_OPTION: OptionSpec = OptionSpec {
    name: "epoch_us",
    kind: OptionKind::U64 { min: 100, max: 10_000_000 },
    default: "20000",
    help: "with commit=epoch: how long an epoch stays open",
};

/// Registry entries of the concurrency controls that accept `commit=epoch`, for the error a
/// user sees when naming it on another.
pub const ACCEPTED_BY: &str = "2pl-nowait, 2pl-waitdie, occ, coco, sundial, tictoc, primo";

/// The node that coordinates the epochs.
const COORDINATOR: NodeId = 0;

/// How long a transaction waits for an epoch to open before it gives up (the coordinator
/// aborts a closing epoch it cannot finish after `TIMEOUT_EPOCHS` epochs, far sooner).
const OPEN_WAIT_LIMIT_US: u64 = 5_000_000;

/// A closing epoch some node has not voted on for this many epoch lengths is aborted: long
/// enough for a slow flush and for the transactions in flight at the close to finish.
const TIMEOUT_EPOCHS: u64 = 50;

/// The most values one node saves for one epoch's undo (4M, a few hundred MB at most): two
/// hundred times what a 20 ms epoch writes at a million writes a second; an epoch of seconds
/// under heavy load can reach it, and then records that carry writes are refused
/// (`epoch-closed`) until the next epoch.
const MAX_EPOCH_UNDO: usize = 1 << 22;

/// While an epoch closes, the node looks this often whether its transactions have finished.
const DRAIN_POLL_US: u64 = 50;

/// Where a node stands in its current epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// A fresh node, until its log holds durably that its first epoch is open: a node that
    /// served in an epoch must find that epoch in its log after a crash or a failover, or its
    /// next incarnation would take itself for fresh and vote for the writes it lost.
    Opening,
    /// Transactions join it; requests made in it are served.
    Open,
    /// Closing: no transaction joins; those in flight finish, requests made in it are served.
    Draining,
    /// This node's transactions in it finished (node 0 was told); requests made in it are still
    /// served until every node has drained and node 0 says seal.
    Drained,
    /// Its seal is appended (and its vote sent once durable): nothing more is done in it.
    Sealed,
    /// It failed: waiting for the node's transactions in it to finish, then undone.
    RollingBack,
    /// Restarted: no epoch until the coordinator's first message.
    Recovering,
}

impl Stage {
    /// Requests made in the epoch are served, and their records appended.
    fn serves(self) -> bool {
        matches!(self, Stage::Open | Stage::Draining | Stage::Drained)
    }
}

/// What gates send each other: the epoch protocol's messages, and the drain round before the
/// seal (node -> node 0: drained; node 0 -> every node: seal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GateMsg {
    Epoch(EpochMsg),
    Drained(u64),
    Seal(u64),
}

/// One node's side of epoch group commit (see the module comment).
pub struct EpochGate {
    node: NodeId,
    nodes: u16,
    cfg: EpochConfig,
    /// Acknowledgements: an epoch's commits are released when it commits, rolled back if not.
    acks: Arc<ReleasePoints>,
    /// Wakes the transactions waiting for an epoch to open: released through each epoch opened.
    opened: Arc<ReleasePoints>,
    /// The epoch this node's transactions run in (read without the lock to frame requests).
    epoch_now: AtomicU64,
    /// What the coordinator resumes from: `(first epoch, last committed)`.
    resume: (u64, u64),
    state: Mutex<GateState>,
}

struct GateState {
    participant: EpochParticipant,
    /// Node 0's, made at start (it needs the clock).
    coordinator: Option<EpochCoordinator>,
    epoch: u64,
    stage: Stage,
    /// Transactions this node coordinates in `epoch`.
    inflight: usize,
    /// The values the epoch's writes replaced, in the order written.
    undo: Undo,
    /// Restarted, and no epoch opened since.
    restarting: bool,
    /// Node 0: the epoch being drained, which nodes have drained it, and whether seal was sent.
    drained: (u64, Vec<bool>, bool),
    /// Node 0: where its latest decision lies in its log. The next epoch's `Close` names the
    /// last committed epoch, so it is not sent before that decision is durable.
    decision_lsn: Option<u64>,
    /// A fresh node: where the record that opens its first epoch lies in its log.
    first_epoch_lsn: Option<u64>,
    /// An epoch in which this node could not log the writes of a decision it had to install:
    /// it votes it down, so that the epoch is undone everywhere ([`EpochGate::install_in`]).
    unlogged: Option<u64>,
}

/// The values an epoch's writes replaced, oldest first.
pub type Undo = Vec<(RowKey, Option<Value>)>;

/// A transaction's place in an epoch: it leaves the epoch when dropped.
pub struct Admitted<'a> {
    gate: &'a EpochGate,
    pub epoch: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock();
        debug_assert!(st.inflight > 0 && st.epoch == self.epoch, "a transaction left an epoch it was not in");
        st.inflight -= 1;
    }
}

/// What the node's log says of its epochs, for the gate of a restarted node.
pub struct GateRecovery {
    pub last_epoch: u64,
    pub last_committed: u64,
    /// An epoch sealed before the crash whose fate is unknown, with the values to put back if it
    /// failed.
    pub limbo: Option<(u64, Undo)>,
}

impl EpochGate {
    pub fn new(node: NodeId, nodes: u16, epoch_us: u64, recovered: GateRecovery) -> EpochGate {
        let timeout_us = epoch_us.saturating_mul(TIMEOUT_EPOCHS);
        let cfg = EpochConfig { epoch_us, timeout_us, resend_us: epoch_us };
        let fresh = recovered.last_epoch == 0 && recovered.limbo.is_none();
        let (participant, epoch, stage, undo) = if fresh {
            (EpochParticipant::new(COORDINATOR, 1), 1, Stage::Opening, Vec::new())
        } else {
            let (limbo, undo) = recovered.limbo.map_or((None, Vec::new()), |(e, u)| (Some(e), u));
            let stage = if limbo.is_some() { Stage::Sealed } else { Stage::Recovering };
            (EpochParticipant::recovering_after(COORDINATOR, limbo), limbo.unwrap_or(0), stage, undo)
        };
        let first_epoch = if fresh { 1 } else { recovered.last_epoch.max(epoch) + 2 };
        EpochGate {
            node,
            nodes,
            cfg,
            acks: ReleasePoints::new(),
            opened: ReleasePoints::new(),
            epoch_now: AtomicU64::new(epoch),
            resume: (first_epoch, recovered.last_committed),
            state: Mutex::new(GateState {
                participant,
                coordinator: None,
                epoch,
                stage,
                inflight: 0,
                undo,
                restarting: !fresh,
                drained: (0, vec![false; nodes as usize], false),
                decision_lsn: None,
                first_epoch_lsn: None,
                unlogged: None,
            }),
        }
    }

    /// Where commits wait for their epoch.
    pub fn acks(&self) -> Arc<ReleasePoints> {
        self.acks.clone()
    }

    /// The epoch the requests of this node's transactions carry.
    pub fn epoch_now(&self) -> u64 {
        self.epoch_now.load(Ordering::Acquire)
    }

    /// A fresh node logs that its first epoch is open; it opens once that is durable
    /// ([`EpochGate::start`]).
    pub fn log_first_epoch(&self, log: &TxnLog) {
        let mut st = self.state.lock();
        if st.stage == Stage::Opening {
            // Refused: the node never opens, and its next incarnation starts afresh.
            st.first_epoch_lsn = log.append_policy(&EpochRecord::Opened { epoch: st.epoch }).unwrap_or(Some(u64::MAX));
        }
    }

    /// Join the open epoch, waiting while none is; `epoch-closed` after waiting too long.
    pub async fn admit(&self, w: &Rc<Worker>) -> Result<Admitted<'_>, Abort> {
        let from_us = w.now_us();
        loop {
            let next = {
                let mut st = self.state.lock();
                if st.stage == Stage::Open {
                    st.inflight += 1;
                    return Ok(Admitted { gate: self, epoch: st.epoch });
                }
                st.epoch + 1
            };
            let waited_us = w.now_us() - from_us;
            if waited_us >= OPEN_WAIT_LIMIT_US {
                return Err(Abort::EpochClosed);
            }
            let limit = w.sleep_us((OPEN_WAIT_LIMIT_US - waited_us).min(self.cfg.epoch_us.saturating_mul(4)));
            first_of(self.opened.decided(next), limit).await;
        }
    }

    /// Wait for the fate of the epoch a commit was made in.
    pub async fn outcome(&self, epoch: u64) -> Result<(), Abort> {
        self.acks.decided(epoch).await;
        match self.acks.outcome(epoch) {
            Release::Released => Ok(()),
            _ => Err(Abort::RolledBack),
        }
    }

    /// May a request made in `epoch` be served now?
    pub fn serves(&self, epoch: u64) -> bool {
        let st = self.state.lock();
        st.epoch == epoch && st.stage.serves()
    }

    /// Append a record that carries `writes` (a vote's, or a decision's for this node), saving
    /// the values they will replace: refused once the node's epoch is sealed or failing, so
    /// that everything it logged in an epoch lies before its seal.
    ///
    /// The values are saved under the gate's lock (the caller holds the records' locks, so two
    /// writers of a key save in the order they install); the append itself is not, so that the
    /// log's lanes stay free of a shared lock. It still precedes the seal: a node seals only once
    /// every node drained, when no transaction of the epoch runs anywhere, and a record appended
    /// later can only be a vote of a transaction its coordinator already abandoned.
    pub fn append_writes<T>(
        &self,
        host: &dyn GateHost,
        writes: &[(RowKey, Option<Value>)],
        append: impl FnOnce() -> Result<T, Abort>,
    ) -> Result<T, Abort> {
        {
            let mut st = self.state.lock();
            if !st.stage.serves() || st.undo.len() + writes.len() > MAX_EPOCH_UNDO {
                return Err(Abort::EpochClosed);
            }
            st.undo.extend(writes.iter().map(|(k, _)| (*k, host.read_row(*k))));
        }
        append()
    }

    /// A commit whose decision carries its writes (Primo's `Install`, logged by no vote) made in
    /// `epoch`: save the values `writes` replace and run `install` (which appends the record and
    /// installs it), all under the gate's lock, so that a rollback undoes all of it or finds none
    /// of it done. Refused (`epoch-closed`) unless this node still serves `epoch`: a node seals an
    /// epoch only once every coordinator in it finished, and such a coordinator waits for its
    /// installs, so a refusal means the epoch failed here. If `install` fails (its record was
    /// not logged), the epoch fails too: this node votes it down at its seal, since the
    /// decision's other participants installed their part.
    pub fn install_in<T>(
        &self,
        host: &dyn GateHost,
        epoch: u64,
        writes: Vec<(RowKey, Option<Value>)>,
        install: impl FnOnce(Vec<(RowKey, Option<Value>)>) -> Result<T, Abort>,
    ) -> Result<T, Abort> {
        let mut st = self.state.lock();
        if st.epoch != epoch || !st.stage.serves() || st.undo.len() + writes.len() > MAX_EPOCH_UNDO {
            return Err(Abort::EpochClosed);
        }
        st.undo.extend(writes.iter().map(|(k, _)| (*k, host.read_row(*k))));
        let installed = install(writes);
        if installed.is_err() {
            st.unlogged = Some(epoch);
        }
        installed
    }

    /// A decision to commit a transaction made in `epoch` reached this participant: `commit`
    /// installs it, unless the epoch was rolled back here, when `abort` releases it instead.
    /// Under the gate's lock, so that no install slips past a rollback.
    pub fn decided(&self, epoch: u64, commit: impl FnOnce(), abort: impl FnOnce()) {
        let _st = self.state.lock();
        match self.acks.outcome(epoch) {
            Release::RolledBack => abort(),
            _ => commit(),
        }
    }

    /// Is a commit of `epoch` known to be undone here?
    pub fn rolled_back(&self, epoch: u64) -> bool {
        epoch > 0 && self.acks.outcome(epoch) == Release::RolledBack
    }

    /// Has this node restarted and not yet opened an epoch? Until it does, it cannot tell what
    /// became of the transactions of the epoch it crashed in.
    pub fn restarting(&self) -> bool {
        self.state.lock().restarting
    }

    /// Worker 0 of a fresh node opens its first epoch once that is logged; node 0's starts the
    /// coordinator and its timer.
    pub fn start<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let w = host.worker().clone();
        if w.addr.worker != 0 {
            return;
        }
        let opening = self.state.lock().stage == Stage::Opening;
        if opening {
            let (gate, host) = (self.clone(), host.clone());
            w.spawn(async move {
                let lsn = gate.state.lock().first_epoch_lsn;
                host.gate_log().durable(lsn).await;
                {
                    let mut st = gate.state.lock();
                    if st.stage != Stage::Opening {
                        return; // Its first epoch was decided meanwhile: it has moved on.
                    }
                    st.stage = Stage::Open;
                }
                gate.opened.release_through(1);
                gate.reconcile(&host);
            });
        }
        if self.node != COORDINATOR {
            return;
        }
        let participants: Vec<NodeId> = (0..self.nodes).collect();
        let (first, committed) = self.resume;
        let coordinator = EpochCoordinator::resuming_after(participants, self.cfg, w.now_us(), first, committed)
            .expect("a valid epoch configuration (epoch_us > 0, one participant or more)");
        self.state.lock().coordinator = Some(coordinator);
        let (gate, host) = (self.clone(), host.clone());
        w.clone().spawn(async move {
            loop {
                let deadline_us = gate.state.lock().coordinator.as_ref().map_or(u64::MAX, |c| c.next_deadline_us());
                w.sleep_until_ns(deadline_us.saturating_mul(1000)).await;
                // The coordinator counts an epoch committed as it decides it, and every `Close`
                // after says so: were one sent before the decision is durable, a participant
                // could release the epoch's commits that a failed-over coordinator, not finding
                // the decision in its log, then aborts.
                let decision_lsn = gate.state.lock().decision_lsn;
                host.gate_log().durable(decision_lsn).await;
                let out = gate.state.lock().coordinator.as_mut().map(|c| c.tick(w.now_us())).unwrap_or_default();
                gate.coordinator_says(&host, out);
            }
        });
    }

    /// A gate message from another node (its worker 0).
    pub fn on_message<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, from: Addr, body: &[u8]) {
        match crate::net::decode::<GateMsg>(body) {
            Ok(msg) => self.receive(host, from.node, msg),
            Err(e) => log_warn(&format!("node {}: an undecodable epoch message from {from}: {e}", self.node)),
        }
    }

    fn receive<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, from: NodeId, msg: GateMsg) {
        let msg = match msg {
            GateMsg::Epoch(m) => m,
            GateMsg::Drained(epoch) => return self.on_drained(host, from, epoch),
            GateMsg::Seal(epoch) => return self.seal(host, epoch),
        };
        if let EpochMsg::Closed { .. } = msg {
            let now_us = host.worker().now_us();
            let out = self.state.lock().coordinator.as_mut().map(|c| c.on_message(from, msg, now_us));
            return self.coordinator_says(host, out.unwrap_or_default());
        }
        let (out, report_again) = {
            let mut st = self.state.lock();
            let out = st.participant.on_message(from, msg);
            // Node 0 asks again to close an epoch we drained: our report may have been lost.
            let again = matches!(msg, EpochMsg::Close { epoch, .. } if epoch == st.epoch && st.stage == Stage::Drained);
            (out, again.then_some(st.epoch))
        };
        if let Some(epoch) = report_again {
            self.report_drained(host, epoch);
        }
        self.reconcile(host);
        self.dispatch(host, out);
    }

    /// Tell node 0 that this node's transactions of `epoch` finished.
    fn report_drained<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, epoch: u64) {
        if self.node == COORDINATOR {
            self.on_drained(host, self.node, epoch);
        } else {
            host.worker().send_control(Addr::new(COORDINATOR, 0), &gate_message(&GateMsg::Drained(epoch)));
        }
    }

    /// Node 0: `from` drained `epoch`; once every node has, tell them all to seal (and whoever
    /// reports again, once more: its seal may have been lost).
    fn on_drained<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, from: NodeId, epoch: u64) {
        let to = {
            let mut st = self.state.lock();
            let closing = st.coordinator.as_ref().is_some_and(|c| c.closing() && c.current_epoch() == epoch);
            if !closing || from >= self.nodes {
                return;
            }
            if st.drained.0 != epoch {
                st.drained = (epoch, vec![false; self.nodes as usize], false);
            }
            st.drained.1[from as usize] = true;
            match (st.drained.2, st.drained.1.iter().all(|&d| d)) {
                (true, _) => vec![from],
                (false, true) => {
                    st.drained.2 = true;
                    (0..self.nodes).collect()
                }
                (false, false) => return,
            }
        };
        for n in to {
            if n == self.node {
                self.seal(host, epoch);
            } else {
                host.worker().send_control(Addr::new(n, 0), &gate_message(&GateMsg::Seal(epoch)));
            }
        }
    }

    /// The coordinator's messages: a decision is logged durably here before anyone hears it, so
    /// that a coordinator that fails over knows every epoch it may have opened and the last it
    /// committed.
    fn coordinator_says<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, out: Vec<(NodeId, EpochMsg)>) {
        let decision = out.iter().find_map(|(_, m)| match *m {
            EpochMsg::Committed { epoch } => Some((epoch, true)),
            EpochMsg::Aborted { epoch } => Some((epoch, false)),
            _ => None,
        });
        let Some((epoch, committed)) = decision else { return self.dispatch(host, out) };
        let Ok(lsn) = host.gate_log().append_policy(&EpochRecord::Decided { epoch, committed }) else {
            // The log refuses records (this incarnation no longer leads it): announce nothing
            // and close no epoch more; the node's next incarnation resumes from its log.
            self.state.lock().decision_lsn = Some(u64::MAX);
            return;
        };
        self.state.lock().decision_lsn = lsn;
        let (gate, host) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            host.gate_log().durable(lsn).await;
            gate.dispatch(&host, out);
        });
    }

    /// Send each message to its node's worker 0 (this node's own, at once).
    fn dispatch<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, out: Vec<(NodeId, EpochMsg)>) {
        for (to, msg) in out {
            if to == self.node {
                self.receive(host, to, GateMsg::Epoch(msg));
            } else {
                host.worker().send_control(Addr::new(to, 0), &gate_message(&GateMsg::Epoch(msg)));
            }
        }
    }

    /// Bring the node's epoch in line with what the participant learned: settle the epochs
    /// decided, open the next, start closing.
    fn reconcile<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        loop {
            let mut st = self.state.lock();
            let decided = st.participant.decided_epoch();
            match st.stage {
                Stage::RollingBack => return,
                Stage::Recovering => {
                    if st.participant.state() == ParticipantState::Recovering {
                        return;
                    }
                    self.enter_next(&mut st, &**host);
                }
                _ if st.epoch <= decided => {
                    let epoch = st.epoch;
                    match st.participant.outcome(epoch) {
                        EpochOutcome::Committed => self.commit_epoch(&mut st, &**host),
                        outcome => {
                            debug_assert_eq!(outcome, EpochOutcome::Aborted, "epoch {epoch} settled unknown");
                            self.acks.roll_back(epoch, epoch);
                            if st.inflight > 0 {
                                st.stage = Stage::RollingBack;
                                drop(st);
                                return self.roll_back_when_drained(host);
                            }
                            self.undo_epoch(&mut st, &**host);
                        }
                    }
                    self.enter_next(&mut st, &**host);
                }
                Stage::Open if st.participant.closing_epoch() == Some(st.epoch) => {
                    st.stage = Stage::Draining;
                    drop(st);
                    return self.report_when_drained(host);
                }
                _ => return,
            }
        }
    }

    fn commit_epoch(&self, st: &mut GateState, host: &dyn GateHost) {
        self.acks.release_through(st.epoch);
        st.undo.clear();
        let _ = host.gate_log().append_policy(&EpochRecord::Decided { epoch: st.epoch, committed: true });
    }

    /// Put back, newest first, every value the failed epoch replaced here.
    fn undo_epoch(&self, st: &mut GateState, host: &dyn GateHost) {
        host.worker().count("epoch-rollbacks", 1);
        host.worker().count("epoch-rolled-back-writes", st.undo.len() as u64);
        for (key, old) in st.undo.drain(..).rev() {
            host.restore_row(key, old);
        }
        host.rolled_back();
        let _ = host.gate_log().append_policy(&EpochRecord::Decided { epoch: st.epoch, committed: false });
    }

    /// The next epoch after one settled, as the participant stands.
    fn enter_next(&self, st: &mut GateState, host: &dyn GateHost) {
        debug_assert!(st.undo.is_empty() && st.inflight == 0, "an epoch left behind writes or transactions");
        match st.participant.state() {
            ParticipantState::Open(e) | ParticipantState::Closing(e) => {
                st.epoch = e;
                st.stage = Stage::Open;
                st.restarting = false;
                let _ = host.gate_log().append_policy(&EpochRecord::Opened { epoch: e });
                self.opened.release_through(e);
            }
            ParticipantState::Voted { epoch, .. } => {
                st.epoch = epoch;
                st.stage = Stage::Sealed;
            }
            ParticipantState::Recovering => {
                st.epoch = 0;
                st.stage = Stage::Recovering;
            }
        }
        self.epoch_now.store(st.epoch, Ordering::Release);
    }

    /// Closing: once this node's transactions in the epoch finished, tell node 0.
    fn report_when_drained<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let (gate, host) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            let epoch = loop {
                {
                    let mut st = gate.state.lock();
                    if st.stage != Stage::Draining {
                        return;
                    }
                    if st.inflight == 0 {
                        st.stage = Stage::Drained;
                        break st.epoch;
                    }
                }
                host.worker().sleep_us(DRAIN_POLL_US).await;
            };
            gate.report_drained(&host, epoch);
        });
    }

    /// Every node drained `epoch`: seal it here and vote once the seal is durable.
    fn seal<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, epoch: u64) {
        let sealed = {
            let mut st = self.state.lock();
            if st.stage != Stage::Drained || st.epoch != epoch {
                return;
            }
            st.stage = Stage::Sealed;
            match st.unlogged == Some(epoch) {
                // A decision's writes were not logged here: the epoch cannot commit.
                true => Err(Abort::LogRefused),
                false => host.gate_log().append_policy(&EpochRecord::Sealed { epoch }),
            }
        };
        let (gate, host) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            if let Ok(lsn) = sealed {
                host.gate_log().durable(lsn).await;
            }
            let out = {
                let mut st = gate.state.lock();
                match sealed {
                    Ok(_) => st.participant.on_durable(epoch),
                    Err(_) => st.participant.on_failure(epoch),
                }
            };
            gate.dispatch(&host, out);
        });
    }

    /// A failed epoch with transactions still in flight here: they can no longer append or be
    /// served; undo once they finished.
    fn roll_back_when_drained<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let (gate, host) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            loop {
                {
                    let mut st = gate.state.lock();
                    if st.inflight == 0 {
                        gate.undo_epoch(&mut st, &*host);
                        gate.enter_next(&mut st, &*host);
                        break;
                    }
                }
                host.worker().sleep_us(DRAIN_POLL_US).await;
            }
            gate.reconcile(&host);
        });
    }
}

/// A message between nodes' epoch gates, framed for the skeleton's handler.
fn gate_message(msg: &GateMsg) -> Vec<u8> {
    framed(TAG_EPOCH, msg)
}

impl EpochGate {
    /// An attempt that ran in the epoch `admitted` (its acknowledgement deferred) finished: it
    /// leaves the epoch, and is acknowledged when the epoch commits, by the driver when it
    /// defers (`ack_after` is the epoch), else here.
    pub async fn acknowledge(
        &self,
        w: &Worker,
        admitted: Admitted<'_>,
        defer_ack: bool,
        mut out: TxnOutput,
    ) -> TxnResult<TxnOutput> {
        let epoch = admitted.epoch;
        // Its records precede the epoch's seal: it leaves the epoch before waiting for it.
        drop(admitted);
        if defer_ack {
            out.ack_after = Some(epoch);
            return Ok(out);
        }
        out.ack_after = None;
        let t0 = w.now_ns();
        self.outcome(epoch).await?;
        w.note_log_wait(w.now_ns() - t0);
        Ok(out)
    }
}

/// What epoch group commit logs beside 2PC's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EpochRecord {
    /// The `Commit` and `Prepared` records that follow, up to `Sealed`, were made in `epoch`;
    /// they count only if it commits.
    Opened { epoch: u64 },
    /// Everything this node did in `epoch` lies before this record: its vote waits for it.
    Sealed { epoch: u64 },
    /// What became of `epoch`, as this node learned it (the coordinator logs its commit
    /// decision before anyone hears it).
    Decided { epoch: u64, committed: bool },
}

/// Replaying a log of epoch group commit: a `Commit` or `Prepared` record made in an epoch, and
/// any `Outcome` or `Ended` of its transaction, wait until the epoch's decision and count only
/// if it committed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EpochLog {
    /// The epoch whose records follow (between its `Opened` and `Sealed`).
    open: Option<u64>,
    /// Records of undecided epochs, in log order, and whether the epoch was sealed (voted).
    /// Bounded: a node opens an epoch only after it learned the previous one's fate, so at
    /// most two are undecided, each holding one epoch's records.
    pending: std::collections::BTreeMap<u64, (Vec<Vec<u8>>, bool)>,
    /// Transactions whose `Commit` or `Prepared` record waits in a pending epoch.
    txns: rustc_hash::FxHashMap<TxnId, u64>,
    last_epoch: u64,
    last_committed: u64,
}

/// What a node's log says of its epochs, for its gate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochsRecovered {
    /// The highest epoch the log names.
    pub last_epoch: u64,
    /// The highest epoch the log holds a commit decision of.
    pub last_committed: u64,
    /// An epoch this node voted for (sealed) whose fate its log does not hold (the node
    /// crashed before it heard): replayed as committed, and undone if it turns out aborted.
    pub limbo: Option<u64>,
    /// The rows the limbo epoch wrote, `(key, value, writes, ts)` as replay hands rows over,
    /// for the node to apply over the rest, keeping the values they replace.
    pub limbo_rows: Vec<(RowKey, Option<Value>, u64, u64)>,
    /// The limbo epoch's transactions still in doubt here (prepared in it, no outcome).
    pub limbo_txns: Vec<TxnId>,
    /// What undoing the limbo epoch puts back, oldest first: filled in as the node applies
    /// `limbo_rows` (and for the keys its in-doubt transactions may install).
    pub limbo_undo: Vec<(RowKey, Option<Value>)>,
}

impl EpochLog {
    /// `epoch` was decided: its records count now if it committed, and are dropped if not.
    fn decide<L: CcLog>(&mut self, epoch: u64, committed: bool, core: &mut CoreReplay<L>) {
        self.last_epoch = self.last_epoch.max(epoch);
        if committed {
            self.last_committed = self.last_committed.max(epoch);
        }
        if self.open == Some(epoch) {
            self.open = None;
        }
        let Some((records, _)) = self.pending.remove(&epoch) else { return };
        self.txns.retain(|_, ep| *ep != epoch);
        if !committed {
            return;
        }
        for bytes in records {
            if let Ok(r) = crate::protocols::twopc::durable::decode_record::<L, Self>(&bytes) {
                core.apply_core::<Self>(r, epoch);
            }
        }
    }
}

impl PolicyLog for EpochLog {
    const NAME: &'static str = "epoch";
    type Record = EpochRecord;
    type Recovered = EpochsRecovered;

    /// A `Commit` or `Prepared` made while an epoch was open, or what follows of its
    /// transaction, waits for that epoch's decision.
    fn hold<L: CcLog>(&mut self, record: LogRecord<L, Self>, bytes: &[u8]) -> Option<LogRecord<L, Self>> {
        let epoch = match &record {
            Record::Commit { txn, .. } | Record::Prepared { txn, .. } => {
                let Some(epoch) = self.open else { return Some(record) };
                self.txns.insert(*txn, epoch);
                epoch
            }
            Record::Outcome { txn, .. } | Record::Ended { txn } => match self.txns.get(txn) {
                Some(&epoch) => epoch,
                None => return Some(record),
            },
            _ => return Some(record),
        };
        self.pending.entry(epoch).or_default().0.push(bytes.to_vec());
        None
    }

    fn apply<L: CcLog>(&mut self, record: EpochRecord, core: &mut CoreReplay<L>) {
        match record {
            EpochRecord::Opened { epoch } => {
                self.open = Some(epoch);
                self.pending.entry(epoch).or_default();
                self.last_epoch = self.last_epoch.max(epoch);
            }
            EpochRecord::Sealed { epoch } => {
                self.open = None;
                self.pending.entry(epoch).or_default().1 = true;
            }
            EpochRecord::Decided { epoch, committed } => self.decide(epoch, committed, core),
        }
    }

    /// An epoch this node sealed without learning its fate counts as committed until the node
    /// learns otherwise; one it never sealed cannot have committed (it never voted).
    fn recover<L: CcLog>(&self, core: &CoreReplay<L>) -> (EpochsRecovered, Option<CoreReplay<L>>) {
        let limbo = self.pending.iter().rev().find(|(_, (_, sealed))| *sealed).map(|(e, _)| *e);
        let mut epochs = EpochsRecovered {
            last_epoch: self.last_epoch,
            last_committed: self.last_committed,
            limbo,
            ..Default::default()
        };
        let Some(epoch) = limbo else { return (epochs, None) };
        let (mut policy, mut with) = (self.clone(), core.clone());
        policy.decide(epoch, true, &mut with);
        for (k, (v, writes)) in &with.rows {
            let before = core.rows.get(k).map_or(0, |e| e.1);
            if *writes > before {
                epochs.limbo_rows.push((*k, v.clone(), writes - before, with.row_ts.get(k).copied().unwrap_or(0)));
            }
        }
        epochs.limbo_rows.sort_unstable_by_key(|e| e.0);
        epochs.limbo_txns = with.prepared.keys().filter(|t| !core.prepared.contains_key(t)).copied().collect();
        (epochs, Some(with))
    }

    /// The limbo epoch is applied last, keeping what it replaces, and what its transactions
    /// still in doubt here may install.
    fn apply_limbo<V>(
        epochs: &mut EpochsRecovered,
        in_doubt: &InDoubt<V>,
        replayed: &mut dyn FnMut(RowKey, Option<Value>, u64, u64) -> Option<Value>,
        committed: &dyn Fn(RowKey) -> Option<Value>,
    ) {
        for (k, v, writes, ts) in std::mem::take(&mut epochs.limbo_rows) {
            let old = replayed(k, v, writes, ts);
            epochs.limbo_undo.push((k, old));
        }
        for (_, writes, _) in in_doubt.iter().filter(|e| epochs.limbo_txns.contains(&e.0)) {
            epochs.limbo_undo.extend(writes.iter().map(|(k, _)| (*k, committed(*k))));
        }
    }
}

impl Policy for EpochLog {
    fn gate(recovered: EpochsRecovered, node: GateNode<'_>, commit: CommitPolicy) -> Gate {
        let CommitPolicy::Epoch { epoch_us } = commit else { panic!("the epoch gate for {commit:?}") };
        let limbo_undo = recovered.limbo_undo;
        let recovered = GateRecovery {
            last_epoch: recovered.last_epoch,
            last_committed: recovered.last_committed,
            limbo: recovered.limbo.map(|epoch| (epoch, limbo_undo)),
        };
        let gate = EpochGate::new(node.id, node.nodes, epoch_us, recovered);
        gate.log_first_epoch(node.log);
        Gate::Epoch(Arc::new(gate))
    }
}

/// Resolves when either future does (the other is dropped).
async fn first_of<A: Future<Output = ()>, B: Future<Output = ()>>(a: A, b: B) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use crate::testkit::{checked_run, replicated_failover_spec};

    /// Seeds of the replicated failover sweep that lost acknowledged commits under `coco`:
    /// 1106 and 1018, where node 0's next `Close` told the others an epoch committed before
    /// that decision was durable, and a failed-over coordinator, not finding it in its log,
    /// aborted the epoch; 1012, where a node taken over during its first epoch, its log empty,
    /// took itself for fresh and voted for the epoch whose writes it had lost.
    #[test]
    fn decisions_are_durable_before_any_close_names_them_and_a_first_epoch_is_logged_before_it_serves() {
        for seed in [1012, 1018, 1106] {
            let out = checked_run(&replicated_failover_spec("coco", seed));
            assert!(out.totals.failovers > 0, "seed {seed}: no node was taken over");
        }
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;
    use crate::protocols::twopc::durable::encode_record;
    use crate::protocols::twopc::durable::tests::{k, same_from_every_checkpoint, v};
    use crate::protocols::twopc::durable::{replay, PlainLog, ReplayState};

    type Ep = LogRecord<PlainLog, EpochLog>;

    /// A policy's record is logged with one tag, not serde's two (the length it had when its
    /// variants were `LogRecord`'s own), and reads back as it was; 2PC's records are as serde
    /// writes them.
    #[test]
    fn a_policy_record_is_logged_with_one_tag() {
        use crate::protocols::twopc::durable::decode_record;
        for record in [
            EpochRecord::Opened { epoch: 3 },
            EpochRecord::Sealed { epoch: 300 },
            EpochRecord::Decided { epoch: 9, committed: false },
        ] {
            let serde_bytes = crate::net::encode(&Ep::Policy(record));
            let logged = encode_record(&Ep::Policy(record));
            assert_eq!(logged.len() + 1, serde_bytes.len());
            assert!(matches!(decode_record::<PlainLog, EpochLog>(&logged), Ok(Ep::Policy(r)) if r == record));
        }
        let commit = Ep::Commit { txn: 4, writes: vec![(k(1), v(2))], participants: vec![1], ts: 0 };
        assert_eq!(encode_record(&commit), crate::net::encode(&commit));
        assert!(matches!(decode_record::<PlainLog, EpochLog>(&encode_record(&commit)), Ok(Ep::Commit { txn: 4, .. })));
    }

    /// Epoch group commit: an epoch's `Commit` and `Prepared` records, and what follows of their
    /// transactions, count only once the epoch is decided committed; a failed epoch's are
    /// dropped, but not the outcome, logged in it, of a transaction of an earlier epoch.
    #[test]
    fn an_epochs_records_count_only_if_it_commits() {
        let recs: Vec<Vec<u8>> = [
            Ep::Policy(EpochRecord::Opened { epoch: 1 }),
            Ep::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![], ts: 0 },
            Ep::Prepared { txn: 2, writes: vec![(k(2), v(2))], vote: () },
            Ep::Commit { txn: 3, writes: vec![(k(3), v(3))], participants: vec![7], ts: 0 },
            Ep::Policy(EpochRecord::Sealed { epoch: 1 }),
            Ep::Policy(EpochRecord::Decided { epoch: 1, committed: true }),
            Ep::Policy(EpochRecord::Opened { epoch: 2 }),
            Ep::Commit { txn: 4, writes: vec![(k(1), v(4))], participants: vec![8], ts: 0 },
            Ep::Outcome { txn: 2, committed: true, ts: 0 },
            Ep::Prepared { txn: 5, writes: vec![(k(5), v(5))], vote: () },
            Ep::Outcome { txn: 5, committed: true, ts: 0 },
            Ep::Policy(EpochRecord::Sealed { epoch: 2 }),
            Ep::Policy(EpochRecord::Decided { epoch: 2, committed: false }),
            Ep::Policy(EpochRecord::Opened { epoch: 3 }),
            Ep::Commit { txn: 6, writes: vec![(k(6), v(6))], participants: vec![], ts: 0 },
        ]
        .iter()
        .map(encode_record)
        .collect();
        let mut applied = Vec::new();
        let (r, epochs) = replay(ReplayState::<PlainLog, EpochLog>::new("occ"), &recs, &mut |key, val, n, _| {
            applied.push((key, val, n))
        });
        applied.sort_by_key(|e| e.0);
        assert_eq!(
            applied,
            vec![(k(1), v(1), 1), (k(2), v(2), 1), (k(3), v(3), 1)],
            "epoch 1's commits and the outcome of its prepared 2; not epoch 2's, nor open epoch 3's"
        );
        assert!(r.in_doubt.is_empty(), "{:?}", r.in_doubt);
        assert_eq!(r.unended, vec![(3, vec![7], 0, 1)], "an unended commit keeps its epoch");
        assert_eq!(epochs, EpochsRecovered { last_epoch: 3, last_committed: 1, ..Default::default() });
    }

    /// An epoch the node sealed without learning its fate is replayed on top, as committed, with
    /// what it wrote and its transactions still in doubt set apart: the node undoes them if the
    /// epoch turns out aborted. A checkpoint taken anywhere gives the same recovery.
    #[test]
    fn a_sealed_epoch_without_a_decision_is_in_limbo() {
        let recs: Vec<Vec<u8>> = [
            Ep::Policy(EpochRecord::Opened { epoch: 4 }),
            Ep::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![], ts: 0 },
            Ep::Policy(EpochRecord::Sealed { epoch: 4 }),
            Ep::Policy(EpochRecord::Decided { epoch: 4, committed: true }),
            Ep::Policy(EpochRecord::Opened { epoch: 5 }),
            Ep::Commit { txn: 2, writes: vec![(k(1), v(2)), (k(2), v(2))], participants: vec![3], ts: 0 },
            Ep::Prepared { txn: 3, writes: vec![(k(3), v(3))], vote: () },
            Ep::Policy(EpochRecord::Sealed { epoch: 5 }),
        ]
        .iter()
        .map(encode_record)
        .collect();
        let collect = |from: ReplayState<PlainLog, EpochLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let (r, epochs) = replay(from, rest, &mut |k, v, n, _| rows.push((k, v, n)));
            (rows, r.in_doubt, r.unended, epochs)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        assert_eq!(whole.0, vec![(k(1), v(1), 1)], "the limbo epoch is not in the rows applied first");
        assert_eq!(whole.1, vec![(3, vec![(k(3), v(3))], ())]);
        assert_eq!(whole.2, vec![(2, vec![3], 0, 5)]);
        let e = &whole.3;
        assert_eq!((e.last_epoch, e.last_committed, e.limbo), (5, 4, Some(5)));
        assert_eq!(e.limbo_rows, vec![(k(1), v(2), 1, 0), (k(2), v(2), 1, 0)]);
        assert_eq!(e.limbo_txns, vec![3]);
        same_from_every_checkpoint(&recs, &whole, collect);
    }
}
