//! When a commit over the skeleton is safe to acknowledge: the commit policy, the seam between
//! 2PC and how its votes and decisions become durable.
//!
//! A policy is three things, each of its own file:
//! - **its log** ([`PolicyLog`]): the records it writes beside 2PC's, and how replay treats
//!   2PC's records under it (an epoch's count only once the epoch commits; a watermark commit
//!   only once no agreement can roll it back), and what recovery hands its gate;
//! - **its gate** ([`Gate`]): the node's side of it at run time, which the skeleton asks at
//!   each point where policies differ (how a transaction runs and is acknowledged, what a vote
//!   or a decision appends, which requests a participant serves, what the termination protocol
//!   answers);
//! - **its options** in the registry (`commit=`, and its own).
//!
//! The three: [`two_pc`], plain 2PC over the log, each vote and decision durable before it
//! counts (the default); [`epoch`], COCO's epoch group commit; [`watermark`], Primo's watermark
//! group commit. A fourth adds a file, a [`Gate`] variant with its arms below, and a
//! [`CommitPolicy`] choice: nothing in the skeleton, the log records or replay.

pub mod epoch;
pub mod two_pc;
pub mod watermark;

pub use super::durable::PolicyLog;

use super::durable::TxnLog;
use super::{TxnId, TxnStatus};
use crate::net::{Addr, NodeId};
use crate::protocols::Attempt;
use crate::rt::release::AckSource;
use crate::rt::Worker;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, TxnOutput, TxnResult};
use epoch::EpochGate;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use watermark::WatermarkGate;

/// A transaction's logical commit timestamp and the era it ran in (its recovery agreement term
/// under `commit=wm`), for a concurrency control that has one; the default (zero) for one
/// without (2PL, OCC), whose commits are acknowledged by log position or by epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    pub era: u64,
    pub ts: u64,
}

/// How a commit becomes safe to acknowledge: the policy a protocol's options chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPolicy {
    /// Every vote and decision is durable before it is answered or acted on (2PC over the log).
    TwoPc,
    /// COCO's epoch group commit with epochs this long.
    Epoch { epoch_us: u64 },
    /// Primo's watermark group commit ([`watermark`]), each partition publishing its watermark
    /// this often; for a concurrency control whose commits carry a logical timestamp.
    Watermark { wm_us: u64, floor: watermark::Floor },
}

/// What a policy's gate needs of the node it runs on (its worker 0 runs the gate's tasks).
pub trait GateHost: 'static {
    fn worker(&self) -> &Rc<Worker>;
    fn gate_log(&self) -> &TxnLog;
    /// The value `key` holds now (a write is about to replace it).
    fn read_row(&self, key: RowKey) -> Option<Value>;
    /// Put back the value `key` held before a failed epoch (or rolled-back term) wrote it.
    fn restore_row(&self, key: RowKey, value: Option<Value>);
    /// Every value a rollback undid is back (after the last `restore_row` of it).
    fn rolled_back(&self);
}

/// What a node knows when it builds its gate: who it is, its log, and whether it restarted.
pub struct GateNode<'a> {
    pub id: NodeId,
    pub nodes: u16,
    pub log: &'a TxnLog,
    pub restarted: bool,
}

/// A policy: its log ([`PolicyLog`]) and the gate it builds from what recovery found there.
pub trait Policy: PolicyLog {
    fn gate(recovered: Self::Recovered, node: GateNode<'_>, commit: CommitPolicy) -> Gate;
}

/// The node's side of its commit policy, shared by its workers.
#[derive(Clone)]
pub enum Gate {
    TwoPc,
    Epoch(Arc<EpochGate>),
    Watermark(Arc<WatermarkGate>),
}

impl Gate {
    /// The watermark gate, for the calls a concurrency control makes under `commit=wm`
    /// (`twopc::wm_worker`).
    pub fn watermark(&self) -> Option<&Arc<WatermarkGate>> {
        match self {
            Gate::Watermark(wm) => Some(wm),
            _ => None,
        }
    }

    /// Run one attempt under the policy: `run_attempt` runs it up to its acknowledgement,
    /// which the group commits defer to the epoch's or the watermark's; `set_era` hears the
    /// epoch it runs in.
    pub async fn run<Fut: Future<Output = TxnResult<TxnOutput>>>(
        &self,
        w: &Rc<Worker>,
        attempt: Attempt,
        set_era: impl FnOnce(u64),
        run_attempt: impl FnOnce(Attempt) -> Fut,
    ) -> TxnResult<TxnOutput> {
        let deferred = Attempt { defer_ack: true, ..attempt };
        match self {
            Gate::TwoPc => run_attempt(attempt).await,
            Gate::Epoch(gate) => {
                let admitted = gate.admit(w).await?;
                set_era(admitted.epoch);
                let out = run_attempt(deferred).await?;
                gate.acknowledge(w, admitted, attempt.defer_ack, out).await
            }
            Gate::Watermark(wm) => {
                wm.recovered(w).await;
                let out = run_attempt(deferred).await?;
                wm.acknowledge(w, attempt.defer_ack, out).await
            }
        }
    }

    /// Where clients wait for a deferred acknowledgement (`None`: at the node's log).
    pub fn acks(&self) -> Option<Arc<dyn AckSource>> {
        match self {
            Gate::TwoPc => None,
            Gate::Epoch(gate) => Some(gate.acks() as Arc<dyn AckSource>),
            Gate::Watermark(wm) => Some(wm.acks() as Arc<dyn AckSource>),
        }
    }

    /// Does a vote or a read's answer go out at once, without waiting for its record? Under the
    /// group commits it does: the epoch's seal, or the watermark, makes it durable before
    /// anything it decided is acknowledged.
    pub fn answers_at_once(&self) -> bool {
        !matches!(self, Gate::TwoPc)
    }

    /// Does a yes vote log its writes (so its abort logs an outcome)? Not under `commit=wm`,
    /// where a crash rolls every partition back past the transaction.
    pub fn logs_votes(&self) -> bool {
        !matches!(self, Gate::Watermark(_))
    }

    /// Append a yes vote's record through `append`: as a decision's under epochs; under
    /// watermarks nothing (the transaction stays active here, and the watermark below it, until
    /// its install is logged).
    pub fn append_vote(
        &self,
        host: &dyn GateHost,
        writes: &[(RowKey, Option<Value>)],
        append: impl FnOnce() -> Result<Option<u64>, Abort>,
    ) -> Result<Option<u64>, Abort> {
        match self {
            Gate::Watermark(_) => Ok(None),
            _ => self.append_decision(host, writes, append),
        }
    }

    /// Append a record that carries this node's `writes` through `append`: under epochs only
    /// before the node's epoch is sealed, saving the values the writes will replace.
    pub fn append_decision(
        &self,
        host: &dyn GateHost,
        writes: &[(RowKey, Option<Value>)],
        append: impl FnOnce() -> Result<Option<u64>, Abort>,
    ) -> Result<Option<u64>, Abort> {
        match self {
            Gate::Epoch(gate) => gate.append_writes(host, writes, append),
            Gate::TwoPc | Gate::Watermark(_) => append(),
        }
    }

    /// What a transaction that touched only this node waits for before it is acknowledged
    /// ([`TxnLog::local_commit_lsn`] under 2PC); under epochs, its epoch (the record appended
    /// now), under watermarks the watermark (its writes appended at `stamp.ts`).
    pub fn local_commit_lsn(
        &self,
        host: &dyn GateHost,
        txn: TxnId,
        stamp: Stamp,
        writes: &[(RowKey, Option<Value>)],
    ) -> Result<Option<u64>, Abort> {
        let log = host.gate_log();
        match self {
            Gate::TwoPc => log.local_commit_lsn(txn, writes),
            Gate::Epoch(_) if writes.is_empty() => Ok(None),
            Gate::Epoch(gate) => {
                gate.append_writes(host, writes, || log.append_commit(txn, writes, &[], 0)).map(|_| None)
            }
            Gate::Watermark(wm) => wm.append_install(host, txn, writes, stamp.ts).map(|_| None),
        }
    }

    /// Log a distributed transaction's commit decision: under 2PC, wait until it is durable
    /// ([`TxnLog::log_decision`]); under epochs, append it and go on (the epoch's seal waits for
    /// it); under watermarks, append only this node's writes at `stamp.ts` (the decision need
    /// not survive a crash, which rolls the transaction back everywhere).
    pub async fn log_decision(
        &self,
        host: &dyn GateHost,
        (txn, stamp): (TxnId, Stamp),
        local_writes: &[(RowKey, Option<Value>)],
        writers: &[NodeId],
        read_here: bool,
    ) -> TxnResult<()> {
        let log = host.gate_log();
        match self {
            Gate::TwoPc => log.log_decision(host.worker(), txn, local_writes, writers, read_here).await,
            Gate::Epoch(_) if local_writes.is_empty() && writers.is_empty() => Ok(()),
            Gate::Epoch(gate) => {
                let append = || log.append_commit(txn, local_writes, writers, 0);
                gate.append_writes(host, local_writes, append).map(|_| ())
            }
            Gate::Watermark(wm) => wm.append_install(host, txn, local_writes, stamp.ts),
        }
    }

    /// The era a commit decision names in the decision table, where the policy fixes it with
    /// the decision (the agreement term under watermarks); `None`: the table's epoch.
    pub fn decision_era(&self, stamp: Stamp) -> Option<u64> {
        matches!(self, Gate::Watermark(_)).then_some(stamp.era)
    }

    /// A decision to commit `txn`, made in `era`, reached this participant: `commit` installs
    /// it, unless the policy rolled its era back here, when `abort` releases it instead.
    /// `installs_here`: the decision brings the writes this participant installs (Primo's
    /// `Install`), which under watermarks it takes out of the gate once installed.
    pub fn decided(&self, txn: TxnId, era: u64, installs_here: bool, commit: impl FnOnce(), abort: impl FnOnce()) {
        match self {
            Gate::Epoch(gate) => gate.decided(era, commit, abort),
            Gate::Watermark(wm) if installs_here => match wm.begin_install(txn, era) {
                Ok(()) => {
                    commit();
                    wm.leave(txn, None);
                }
                Err(_) => abort(),
            },
            Gate::TwoPc | Gate::Watermark(_) => commit(),
        }
    }

    /// Restarted, and not yet told what became of the era it crashed in: a commit decision
    /// waits (its coordinator resends until answered).
    pub fn holds_decisions(&self) -> bool {
        match self {
            Gate::Epoch(gate) => gate.restarting(),
            Gate::TwoPc | Gate::Watermark(_) => false,
        }
    }

    /// What the coordinator answers a participant asking about a transaction of `era` whose
    /// decision table says `status`: aborted if its epoch was rolled back; still active while a
    /// restarted node does not know yet.
    pub fn status(&self, status: TxnStatus, era: u64) -> TxnStatus {
        match self {
            Gate::Epoch(gate) if gate.rolled_back(era) => TxnStatus::Aborted,
            Gate::Epoch(gate) if status == TxnStatus::Aborted && gate.restarting() => TxnStatus::Active,
            Gate::Watermark(wm) if wm.recovering() => TxnStatus::Active,
            _ => status,
        }
    }

    /// The era a concurrency control's request carries (`None`: it carries none).
    pub fn request_era(&self) -> Option<u64> {
        match self {
            Gate::TwoPc => None,
            Gate::Epoch(gate) => Some(gate.epoch_now()),
            Gate::Watermark(wm) => Some(wm.term()),
        }
    }

    /// Does this participant serve a request made in `era` now?
    pub fn serves(&self, era: u64) -> bool {
        match self {
            Gate::TwoPc => false,
            Gate::Epoch(gate) => gate.serves(era),
            Gate::Watermark(wm) => wm.serves(era),
        }
    }

    /// Why a participant refused a request for its era.
    pub fn refusal(&self) -> Abort {
        match self {
            Gate::Watermark(_) => Abort::Protocol(watermark::RECOVERED),
            Gate::TwoPc | Gate::Epoch(_) => Abort::EpochClosed,
        }
    }

    /// Start the gate's tasks on a worker (its worker 0 runs them).
    pub fn start<H: GateHost>(&self, host: &Rc<H>) {
        match self {
            Gate::TwoPc => {}
            Gate::Epoch(gate) => gate.start(host),
            Gate::Watermark(wm) => wm.start(host),
        }
    }

    /// A one-way message from another node's gate, framed with `tag`; `false` if it is not
    /// this policy's.
    pub fn on_message<H: GateHost>(&self, host: &Rc<H>, from: Addr, tag: u8, body: &[u8]) -> bool {
        match self {
            Gate::Epoch(gate) if tag == super::wire::TAG_EPOCH => gate.on_message(host, from, body),
            Gate::Watermark(wm) if tag == super::wire::TAG_WM => wm.on_message(host, from, body),
            _ => return false,
        }
        true
    }
}
