//! multilog's acknowledgement by epoch group commit (`epoch_us > 0`): COCO's protocol as
//! `replication::epoch` implements it, its decisions reaching clients through the ack source
//! ([`ReleasePoints`]). Node 0 coordinates; every node is a participant, which makes what it
//! logged in an epoch durable (its `EpochEnd` marker in each of its logs) before it votes.
//! Node 0 runs the transactions: a committed epoch is released once its `Decided` record is
//! durable in every log (so that recovery keeps it); a failed one is undone at once and its
//! transactions reach their clients as rolled back.
//!
//! The epoch is a barrier: a transaction joins the open epoch, and none runs while one closes.
//! A coordinator that failed over resumes two epochs past the last its node's logs name (the
//! epoch it may have been closing can never be decided by it now); participants that were in an
//! earlier one catch up at its first `Close`. An epoch whose decision it finds in no log counts
//! as aborted, whatever it decides later: a failed epoch's clients hear "rolled back" before its
//! `Decided` record is durable, so a crash can lose the record of an abort already reported.

use super::{MultiRecord, MultiState, MultiWorker};
use crate::net::{Addr, NodeId};
use crate::protocols::Attempt;
use crate::replication::epoch::{EpochConfig, EpochCoordinator, EpochMsg, EpochOutcome, EpochParticipant};
use crate::rt::release::{AckSource, Release, ReleasePoints};
use crate::rt::{log_warn, Worker};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, TxnOutput, TxnRequest, TxnResult};
use parking_lot::Mutex;
use std::rc::Rc;
use std::sync::Arc;

/// The node that coordinates the epochs (the one that holds the data).
const COORDINATOR: NodeId = 0;

/// How long a transaction waits for an epoch to open before it gives up (a coordinator that
/// cannot reach a participant aborts the epoch on its timeout and opens the next, far sooner).
const OPEN_WAIT_LIMIT_US: u64 = 5_000_000;

/// A node's side of the epoch group commit.
pub(super) struct Epochs {
    node: NodeId,
    nodes: u16,
    points: Arc<ReleasePoints>,
    cfg: EpochConfig,
    /// The epoch the coordinator opens first (node 0).
    first_epoch: u64,
    state: Mutex<EpochState>,
}

struct EpochState {
    participant: EpochParticipant,
    /// Node 0's, made at start (it needs the clock).
    coordinator: Option<EpochCoordinator>,
    /// The old values of the rows the open epoch wrote, in the order written (node 0).
    undo: Vec<(RowKey, Option<Value>)>,
    /// The epoch whose end marker this node is making durable.
    flushing: Option<u64>,
    /// Every epoch up to here had its decision acted on.
    handled: u64,
}

impl Epochs {
    /// `last_epoch`: the highest epoch the node's logs name (0: none, a fresh node).
    pub(super) fn new(node: NodeId, nodes: u16, epoch_us: u64, last_epoch: u64) -> Epochs {
        let first_epoch = if last_epoch == 0 { 1 } else { last_epoch + 2 };
        let participant = match (node, last_epoch) {
            (COORDINATOR, _) => EpochParticipant::new(COORDINATOR, first_epoch),
            (_, 0) => EpochParticipant::new(COORDINATOR, 1),
            // It may have voted in the epoch it crashed in, with what it lost.
            _ => EpochParticipant::recovering(COORDINATOR),
        };
        let handled = participant.decided_epoch();
        let cfg = EpochConfig { epoch_us, timeout_us: 20 * epoch_us, resend_us: epoch_us };
        let state = EpochState { participant, coordinator: None, undo: Vec::new(), flushing: None, handled };
        Epochs { node, nodes, points: ReleasePoints::new(), cfg, first_epoch, state: Mutex::new(state) }
    }

    pub(super) fn points(&self) -> Arc<ReleasePoints> {
        self.points.clone()
    }

    pub(super) fn open_epoch(&self) -> Option<u64> {
        self.state.lock().participant.open_epoch()
    }

    /// Remember the rows' values before the open epoch's transaction writes them.
    pub(super) fn keep_undo(&self, old: impl Iterator<Item = (RowKey, Option<Value>)>) {
        self.state.lock().undo.extend(old);
    }

    /// Node 0's worker 0 starts the coordinator and its timer.
    pub(super) fn start(&self, w: &Rc<Worker>, s: &Arc<MultiState>) {
        if w.addr.worker != 0 || self.node != COORDINATOR {
            return;
        }
        let participants: Vec<NodeId> = (0..self.nodes).collect();
        let coordinator = EpochCoordinator::resuming(participants, self.cfg, w.now_us(), self.first_epoch)
            .expect("a valid epoch configuration (epoch_us > 0, one participant or more)");
        self.state.lock().coordinator = Some(coordinator);
        let (w2, s2) = (w.clone(), s.clone());
        w.spawn(async move {
            loop {
                let Some(e) = &s2.epochs else { return };
                let deadline_us = e.state.lock().coordinator.as_ref().map_or(u64::MAX, |c| c.next_deadline_us());
                w2.sleep_until_ns(deadline_us.saturating_mul(1000)).await;
                let out = e.state.lock().coordinator.as_mut().map(|c| c.tick(w2.now_us())).unwrap_or_default();
                e.dispatch(&w2, &s2, out);
            }
        });
    }

    /// An epoch message from another node's worker 0.
    pub(super) fn on_message(&self, w: &Rc<Worker>, s: &Arc<MultiState>, from: Addr, body: &[u8]) {
        match crate::net::decode::<EpochMsg>(body) {
            Ok(msg) => self.receive(w, s, from.node, msg),
            Err(e) => log_warn(&format!("multilog: node {}: an undecodable epoch message from {from}: {e}", self.node)),
        }
    }

    fn receive(&self, w: &Rc<Worker>, s: &Arc<MultiState>, from: NodeId, msg: EpochMsg) {
        let out = match msg {
            EpochMsg::Closed { .. } => {
                let mut st = self.state.lock();
                st.coordinator.as_mut().map(|c| c.on_message(from, msg, w.now_us())).unwrap_or_default()
            }
            _ => {
                // Under the execution lock: no transaction runs between a decision and its
                // undo, nor joins an epoch that is closing.
                let _exec = s.exec.lock();
                let out = self.state.lock().participant.on_message(from, msg);
                self.act_on_decisions(w, s);
                out
            }
        };
        self.dispatch(w, s, out);
        self.flush_closing(w, s);
    }

    /// Send each message to its node's worker 0 (this node's own, at once).
    fn dispatch(&self, w: &Rc<Worker>, s: &Arc<MultiState>, out: Vec<(NodeId, EpochMsg)>) {
        for (to, msg) in out {
            match to == self.node {
                true => self.receive(w, s, self.node, msg),
                false => w.send(Addr::new(to, 0), &crate::net::encode(&msg)),
            }
        }
    }

    /// The coordinator closes an epoch: log its end in every log, and vote once it is durable.
    fn flush_closing(&self, w: &Rc<Worker>, s: &Arc<MultiState>) {
        let closing = {
            let mut st = self.state.lock();
            match st.participant.closing_epoch() {
                Some(e) if st.flushing != Some(e) => {
                    st.flushing = Some(e);
                    e
                }
                _ => return,
            }
        };
        let tails = {
            let _exec = s.exec.lock();
            s.append_everywhere(&MultiRecord::EpochEnd(closing))
        };
        let (w2, s2) = (w.clone(), s.clone());
        w.spawn(async move {
            s2.durable(tails).await;
            let Some(e) = &s2.epochs else { return };
            let out = e.state.lock().participant.on_durable(closing);
            e.dispatch(&w2, &s2, out);
        });
    }

    /// Act on the epochs decided since the last look (the caller holds the execution lock):
    /// node 0 logs each decision, releases a committed epoch once its decision is durable, and
    /// undoes a failed one at once.
    fn act_on_decisions(&self, w: &Rc<Worker>, s: &Arc<MultiState>) {
        let mut st = self.state.lock();
        let decided = st.participant.decided_epoch();
        while st.handled < decided {
            st.handled += 1;
            let epoch = st.handled;
            if self.node != COORDINATOR {
                continue;
            }
            let committed = st.participant.outcome(epoch) == EpochOutcome::Committed;
            let undo = std::mem::take(&mut st.undo);
            let tails = s.append_everywhere(&MultiRecord::Decided(epoch, committed));
            if committed {
                let (s2, w2, from_ns) = (s.clone(), w.clone(), w.now_ns());
                w.spawn(async move {
                    s2.durable(tails).await;
                    // The epoch's commits waited for its decision's record.
                    w2.note_log_wait(w2.now_ns() - from_ns);
                    if let Some(e) = &s2.epochs {
                        e.points.release_through(epoch);
                    }
                });
            } else {
                for (key, old) in undo.into_iter().rev() {
                    s.store.get_or_create(key).lock().value = old;
                }
                self.points.roll_back(epoch, epoch);
            }
        }
    }

    /// Run `req` in the open epoch (waiting while one closes); acknowledged when its epoch is
    /// released, or aborted as rolled back if the epoch failed.
    pub(super) async fn run(&self, worker: &MultiWorker, req: &TxnRequest, attempt: Attempt) -> TxnResult<TxnOutput> {
        let waited_from_us = worker.w.now_us();
        loop {
            let Some(epoch) = self.open_epoch() else {
                if worker.w.now_us() - waited_from_us > OPEN_WAIT_LIMIT_US {
                    return Err(Abort::Timeout);
                }
                worker.w.sleep_us(self.cfg.epoch_us.min(100)).await;
                continue;
            };
            let Some((mut out, _seq, _tails)) = worker.run_and_log(req, epoch)? else { continue };
            if attempt.defer_ack {
                out.ack_after = Some(epoch);
                return Ok(out);
            }
            self.points.decided(epoch).await;
            return match self.points.outcome(epoch) {
                Release::Released => Ok(out),
                _ => Err(Abort::RolledBack),
            };
        }
    }
}
