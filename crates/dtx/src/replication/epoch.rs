//! COCO-style epoch-based group commit (docs/architecture.md, G3 (d)), as Primo §2.3 describes
//! the baseline it measures against:
//!
//! > After a designated time period (e.g., 10ms), one of the partitions takes the role of
//! > coordinator and issues a GROUP-PREPARE message to all the partitions. Upon receiving the
//! > message, each partition ensures that all log records from the current epoch are persisted and
//! > responds with a GROUP-READY message. Once the coordinator receives GROUP-READY messages from
//! > all partitions, it issues a GROUP-COMMIT message. If a partition crashes and fails to send
//! > GROUP-READY, the coordinator would send out a GROUP-ABORT message on timeout. On receiving
//! > GROUP-COMMIT, each partition returns the results (commit or abort) of all transactions in the
//! > epoch and advances to the next epoch. However, the whole epoch would be aborted if
//! > GROUP-ABORT is received.
//!
//! and §1: "An epoch can only start after a coordinator has confirmed all the partitions have
//! finished the previous epoch". So the epoch is a barrier: a participant admits transactions into
//! epoch e+1 only once it learned the fate of e. Messages: GROUP-PREPARE = [`EpochMsg::Close`],
//! GROUP-READY = [`EpochMsg::Closed`] with `durable: true` (`false` is a failure vote, which aborts
//! at once instead of waiting for the timeout), GROUP-COMMIT / GROUP-ABORT =
//! [`EpochMsg::Committed`] / [`EpochMsg::Aborted`].
//!
//! After an abort the paper has "the cluster wait for the crashed partition to recover or to be
//! replaced by a replica"; here the coordinator simply opens the next epoch, and while the failed
//! participant is silent every epoch times out and aborts: that is the wait.
//!
//! Sans-IO: no clock, no timer, no socket. The caller passes `now_us`, ships the returned
//! `(destination, message)` pairs, and tells a participant when its log of an epoch is durable.
//! Messages may be lost, duplicated and reordered: the coordinator resends `Close` to whoever has
//! not answered every `resend_us`, and every `Close` carries the last committed epoch, so a
//! participant that lost a decision learns it from the next epoch's `Close`.

use crate::net::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Aborted-epoch ranges a [`History`] keeps; older outcomes read as [`EpochOutcome::Unknown`].
/// Aborts are rare (a crash or a failed flush), so this covers far more epochs than any
/// transaction waits for.
const ABORTED_RANGES_KEPT: usize = 1024;

/// The messages of the protocol; the caller ships them (serde: any wire format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EpochMsg {
    /// Coordinator -> participant (GROUP-PREPARE): epoch `epoch` is closing, make its log
    /// durable. `committed`: the coordinator's last committed epoch, so a participant that lost
    /// the previous decision learns it here.
    Close { epoch: u64, committed: u64 },
    /// Participant -> coordinator (GROUP-READY when `durable`): everything this participant
    /// logged in `epoch` is durable; `false`: it cannot be (a failed flush, a crash), abort it.
    Closed { epoch: u64, durable: bool },
    /// Coordinator -> participant (GROUP-COMMIT): every participant's log of `epoch` is durable;
    /// its transactions may be released.
    Committed { epoch: u64 },
    /// Coordinator -> participant (GROUP-ABORT): the whole epoch is aborted.
    Aborted { epoch: u64 },
}

/// The fate of an epoch, as one node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochOutcome {
    /// Not decided yet (as far as this node knows).
    Pending,
    Committed,
    Aborted,
    /// Before this node's first epoch, lost in a crash, or aged out of the bounded history.
    Unknown,
}

/// Timing of the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochConfig {
    /// How long an epoch stays open before the coordinator starts closing it.
    pub epoch_us: u64,
    /// A closing epoch that some participant has not answered for this long is aborted.
    pub timeout_us: u64,
    /// Resend `Close` to participants that have not answered, this often.
    pub resend_us: u64,
}

impl Default for EpochConfig {
    /// Primo's evaluation unified "the epoch size of COCO and the watermark interval of WM to
    /// 20ms"; the timeout leaves room for several resends and a slow flush.
    fn default() -> Self {
        EpochConfig { epoch_us: 20_000, timeout_us: 200_000, resend_us: 5_000 }
    }
}

/// A coordinator that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error("an epoch coordinator needs at least one participant")]
    NoParticipants,
    #[error("participant {0} is listed twice")]
    DuplicateParticipant(NodeId),
    #[error("{0} must be above zero")]
    ZeroInterval(&'static str),
}

/// What a coordinator or participant ignored or repaired. Ignored input is never an error: the
/// network duplicates, delays and reorders, and a stale message is expected, not a bug.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochStats {
    /// Messages for an epoch already decided.
    pub stale: u64,
    /// Messages for an epoch beyond the current one (or an impossible epoch number).
    pub future: u64,
    /// Repeats of something already counted (a second vote, a second `Close`).
    pub duplicate: u64,
    /// Messages from a node that is not the coordinator / not a participant.
    pub foreign: u64,
    /// Messages that cannot happen in the current state (a commit without our vote, a message
    /// meant for the other role).
    pub unexpected: u64,
    /// Participant: epochs skipped because a `Close` showed they were decided without it.
    pub caught_up: u64,
    /// Coordinator: `Close` messages sent again.
    pub resent: u64,
    /// Coordinator: epochs aborted because a participant did not answer in time.
    pub timeouts: u64,
    pub committed: u64,
    pub aborted: u64,
}

/// Which epochs are decided and how, bounded. Epochs are decided in order (the barrier), so the
/// history is a counter plus the aborted ranges.
#[derive(Debug, Clone)]
struct History {
    /// Every epoch up to this one is decided.
    decided: u64,
    /// The highest committed epoch, 0 = none.
    committed: u64,
    /// Aborted epochs as inclusive ranges, oldest first, disjoint and sorted.
    aborted: VecDeque<(u64, u64)>,
    /// Outcomes below this epoch are unknown.
    known_from: u64,
}

impl History {
    fn starting_at(first_epoch: u64) -> Self {
        History {
            decided: first_epoch.saturating_sub(1),
            committed: 0,
            aborted: VecDeque::new(),
            known_from: first_epoch,
        }
    }

    /// A node that lost its memory: nothing decided as far as it knows, nothing known.
    fn unknown() -> Self {
        History { decided: 0, committed: 0, aborted: VecDeque::new(), known_from: u64::MAX }
    }

    /// Epoch `decided + 1` committed.
    fn commit_next(&mut self) {
        self.decided += 1;
        self.committed = self.decided;
    }

    /// Every undecided epoch up to `last` aborted. A range costs O(1) whatever its length, so a
    /// bogus epoch number cannot make this loop or allocate.
    fn abort_through(&mut self, last: u64) {
        if last <= self.decided {
            return;
        }
        let first = self.decided + 1;
        match self.aborted.back_mut() {
            Some(back) if back.1 + 1 == first => back.1 = last,
            _ => self.aborted.push_back((first, last)),
        }
        if self.aborted.len() > ABORTED_RANGES_KEPT {
            if let Some((_, end)) = self.aborted.pop_front() {
                self.known_from = end + 1;
            }
        }
        self.decided = last;
    }

    fn outcome(&self, epoch: u64) -> EpochOutcome {
        if epoch > self.decided {
            return EpochOutcome::Pending;
        }
        if epoch < self.known_from {
            return EpochOutcome::Unknown;
        }
        let i = self.aborted.partition_point(|&(_, end)| end < epoch);
        match self.aborted.get(i) {
            Some(&(start, _)) if start <= epoch => EpochOutcome::Aborted,
            _ => EpochOutcome::Committed,
        }
    }
}

/// An epoch number no honest node produces: `epoch + 1` must not overflow.
fn bogus(epoch: u64) -> bool {
    epoch == u64::MAX
}

#[derive(Debug, Clone)]
enum Phase {
    /// Transactions run in the current epoch.
    Open { opened_us: u64 },
    /// `Close` was sent; `ready[i]`: participant i answered durable.
    Closing { started_us: u64, last_sent_us: u64, ready: Vec<bool> },
}

/// The coordinator of epoch group commit (one per cluster; it may share a node with a
/// participant, the caller then delivers messages to itself).
#[derive(Debug, Clone)]
pub struct EpochCoordinator {
    participants: Vec<NodeId>,
    cfg: EpochConfig,
    /// The epoch open or closing now; the first is 1.
    epoch: u64,
    phase: Phase,
    history: History,
    stats: EpochStats,
}

impl EpochCoordinator {
    /// Epoch 1 opens at `now_us`. Participants start with [`EpochParticipant::new`]`(_, 1)`.
    pub fn new(participants: Vec<NodeId>, cfg: EpochConfig, now_us: u64) -> Result<Self, EpochError> {
        if participants.is_empty() {
            return Err(EpochError::NoParticipants);
        }
        for (i, p) in participants.iter().enumerate() {
            if participants[..i].contains(p) {
                return Err(EpochError::DuplicateParticipant(*p));
            }
        }
        for (name, value) in [("epoch_us", cfg.epoch_us), ("timeout_us", cfg.timeout_us), ("resend_us", cfg.resend_us)]
        {
            if value == 0 {
                return Err(EpochError::ZeroInterval(name));
            }
        }
        Ok(EpochCoordinator {
            participants,
            cfg,
            epoch: 1,
            phase: Phase::Open { opened_us: now_us },
            history: History::starting_at(1),
            stats: EpochStats::default(),
        })
    }

    /// A coordinator taking over from one that failed (its node failed over): it opens
    /// `first_epoch` at `now_us`, which must lie past every epoch the failed one may have opened
    /// (the caller finds that in its log). Participants that were in an earlier epoch catch up
    /// at its first `Close`: every epoch before it that they had not seen decided aborted.
    pub fn resuming(
        participants: Vec<NodeId>,
        cfg: EpochConfig,
        now_us: u64,
        first_epoch: u64,
    ) -> Result<Self, EpochError> {
        let mut c = EpochCoordinator::new(participants, cfg, now_us)?;
        c.epoch = first_epoch.max(1);
        c.history = History::starting_at(c.epoch);
        Ok(c)
    }

    /// [`resuming`](Self::resuming), knowing from its log that `last_committed` (below
    /// `first_epoch`) was the last epoch the failed coordinator committed: every `Close` says
    /// so, and a participant that voted for that epoch before crashing learns its fate there.
    pub fn resuming_after(
        participants: Vec<NodeId>,
        cfg: EpochConfig,
        now_us: u64,
        first_epoch: u64,
        last_committed: u64,
    ) -> Result<Self, EpochError> {
        let mut c = EpochCoordinator::resuming(participants, cfg, now_us, first_epoch)?;
        assert!(last_committed < c.epoch, "epoch {last_committed} committed before the first, {}", c.epoch);
        c.history.committed = last_committed;
        Ok(c)
    }

    /// Drive the timers: close the open epoch once `epoch_us` passed, resend `Close` to the
    /// silent, abort on timeout. Call it at [`next_deadline_us`](Self::next_deadline_us) (or
    /// more often; extra calls do nothing).
    pub fn tick(&mut self, now_us: u64) -> Vec<(NodeId, EpochMsg)> {
        let cfg = self.cfg;
        match &mut self.phase {
            Phase::Open { opened_us } if now_us >= opened_us.saturating_add(cfg.epoch_us) => {
                let n = self.participants.len();
                self.phase = Phase::Closing { started_us: now_us, last_sent_us: now_us, ready: vec![false; n] };
                self.close_msgs(|_| true)
            }
            Phase::Closing { started_us, .. } if now_us >= started_us.saturating_add(cfg.timeout_us) => {
                self.stats.timeouts += 1;
                self.decide(false, now_us)
            }
            Phase::Closing { last_sent_us, ready, .. } if now_us >= last_sent_us.saturating_add(cfg.resend_us) => {
                *last_sent_us = now_us;
                let silent = ready.clone();
                let out = self.close_msgs(|i| !silent[i]);
                self.stats.resent += out.len() as u64;
                out
            }
            _ => Vec::new(),
        }
    }

    /// When [`tick`](Self::tick) next has something to do.
    pub fn next_deadline_us(&self) -> u64 {
        match &self.phase {
            Phase::Open { opened_us } => opened_us.saturating_add(self.cfg.epoch_us),
            Phase::Closing { started_us, last_sent_us, .. } => {
                let timeout = started_us.saturating_add(self.cfg.timeout_us);
                timeout.min(last_sent_us.saturating_add(self.cfg.resend_us))
            }
        }
    }

    /// A message from `from`. Only votes for the current epoch count; a failure vote aborts it at
    /// once (no need to wait for the timeout), the last durable vote commits it.
    pub fn on_message(&mut self, from: NodeId, msg: EpochMsg, now_us: u64) -> Vec<(NodeId, EpochMsg)> {
        let Some(index) = self.participants.iter().position(|&p| p == from) else {
            self.stats.foreign += 1;
            return Vec::new();
        };
        let EpochMsg::Closed { epoch, durable } = msg else {
            self.stats.unexpected += 1;
            return Vec::new();
        };
        if epoch < self.epoch {
            self.stats.stale += 1;
            return Vec::new();
        }
        if epoch > self.epoch {
            self.stats.future += 1;
            return Vec::new();
        }
        if !durable {
            return self.decide(false, now_us);
        }
        let Phase::Closing { ready, .. } = &mut self.phase else {
            // A durable vote before we asked: no honest participant sends one.
            self.stats.unexpected += 1;
            return Vec::new();
        };
        if ready[index] {
            self.stats.duplicate += 1;
            return Vec::new();
        }
        ready[index] = true;
        if ready.iter().all(|&r| r) {
            return self.decide(true, now_us);
        }
        Vec::new()
    }

    /// The epoch open or closing now.
    pub fn current_epoch(&self) -> u64 {
        self.epoch
    }

    /// Is the current epoch closing (no longer open)?
    pub fn closing(&self) -> bool {
        matches!(self.phase, Phase::Closing { .. })
    }

    /// The highest committed epoch (0 = none). Never decreases.
    pub fn committed_epoch(&self) -> u64 {
        self.history.committed
    }

    pub fn outcome(&self, epoch: u64) -> EpochOutcome {
        self.history.outcome(epoch)
    }

    pub fn participants(&self) -> &[NodeId] {
        &self.participants
    }

    pub fn stats(&self) -> EpochStats {
        self.stats
    }

    fn close_msgs(&self, to: impl Fn(usize) -> bool) -> Vec<(NodeId, EpochMsg)> {
        let msg = EpochMsg::Close { epoch: self.epoch, committed: self.history.committed };
        self.participants.iter().enumerate().filter(|(i, _)| to(*i)).map(|(_, &p)| (p, msg)).collect()
    }

    /// Decide the current epoch, tell everyone, open the next one.
    fn decide(&mut self, commit: bool, now_us: u64) -> Vec<(NodeId, EpochMsg)> {
        let epoch = self.epoch;
        let msg = if commit {
            self.history.commit_next();
            self.stats.committed += 1;
            EpochMsg::Committed { epoch }
        } else {
            self.history.abort_through(epoch);
            self.stats.aborted += 1;
            EpochMsg::Aborted { epoch }
        };
        self.epoch += 1;
        self.phase = Phase::Open { opened_us: now_us };
        self.participants.iter().map(|&p| (p, msg)).collect()
    }
}

/// Where a participant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParticipantState {
    /// Transactions may join this epoch.
    Open(u64),
    /// The coordinator closes this epoch: admit no more transactions into it, make everything
    /// logged in it durable, then call [`EpochParticipant::on_durable`].
    Closing(u64),
    /// Voted (`durable` or not); waiting for the decision. No epoch is open (the barrier).
    Voted { epoch: u64, durable: bool },
    /// Restarted after a crash: what it logged in the epoch it crashed in is lost, so it votes
    /// "not durable" on the first `Close` it sees (COCO: a crash aborts the whole epoch).
    Recovering,
}

/// One participant (a partition) of epoch group commit.
#[derive(Debug, Clone)]
pub struct EpochParticipant {
    coordinator: NodeId,
    state: ParticipantState,
    history: History,
    stats: EpochStats,
    /// Recovering: the epoch it voted for before the crash, whose fate it has not heard yet.
    limbo: Option<u64>,
}

impl EpochParticipant {
    /// A participant with `first_epoch` open (the coordinator's first epoch is 1).
    pub fn new(coordinator: NodeId, first_epoch: u64) -> Self {
        EpochParticipant {
            coordinator,
            state: ParticipantState::Open(first_epoch),
            history: History::starting_at(first_epoch),
            stats: EpochStats::default(),
            limbo: None,
        }
    }

    /// A participant restarted after losing its memory. It joins at the next `Close` and votes
    /// that epoch down: it may have run part of that epoch's transactions before the crash. (If
    /// it crashed in an earlier epoch, which has timed out since, this aborts one epoch more
    /// than necessary: without a log it cannot tell.)
    ///
    /// Assumes no message sent before the crash reaches the new incarnation (dtx's runtimes drop
    /// what was in flight to a crashed node): a stale `Close` of an older epoch would take the
    /// "no" vote, and the epoch it crashed in could then commit with a "yes". Ruling that out
    /// without the assumption needs the crash epoch from the node's log.
    pub fn recovering(coordinator: NodeId) -> Self {
        EpochParticipant {
            coordinator,
            state: ParticipantState::Recovering,
            history: History::unknown(),
            stats: EpochStats::default(),
            limbo: None,
        }
    }

    /// A participant restarted from its log, which shows it voted for `limbo` (its records
    /// durable up to the seal) and not what became of it. It learns that from the decision, or
    /// from the next `Close` (nothing after `limbo` committed without its vote, so `committed >=
    /// limbo` means exactly "limbo committed"), and, like [`recovering`](Self::recovering),
    /// votes down the first epoch it is asked to close: it may have run part of it.
    pub fn recovering_after(coordinator: NodeId, limbo: Option<u64>) -> Self {
        EpochParticipant { limbo, ..EpochParticipant::recovering(coordinator) }
    }

    /// The fate of the limbo epoch, learned while recovering.
    fn settle_limbo(&mut self, limbo: u64, committed: bool) {
        self.history = History::starting_at(limbo);
        if committed {
            self.history.commit_next();
        } else {
            self.history.abort_through(limbo);
        }
    }

    /// A message from `from`; returns what to send.
    pub fn on_message(&mut self, from: NodeId, msg: EpochMsg) -> Vec<(NodeId, EpochMsg)> {
        if from != self.coordinator {
            self.stats.foreign += 1;
            return Vec::new();
        }
        match msg {
            EpochMsg::Close { epoch, .. } | EpochMsg::Committed { epoch } | EpochMsg::Aborted { epoch }
                if bogus(epoch) =>
            {
                self.stats.future += 1;
                Vec::new()
            }
            EpochMsg::Close { epoch, committed } => self.on_close(epoch, committed),
            EpochMsg::Committed { epoch } => self.on_decision(epoch, true),
            EpochMsg::Aborted { epoch } => self.on_decision(epoch, false),
            EpochMsg::Closed { .. } => {
                self.stats.unexpected += 1;
                Vec::new()
            }
        }
    }

    /// Everything this participant logged in `epoch` is durable (call it in `Closing(epoch)`).
    pub fn on_durable(&mut self, epoch: u64) -> Vec<(NodeId, EpochMsg)> {
        self.vote(epoch, true)
    }

    /// This participant cannot make `epoch` durable (a failed flush): the epoch must abort.
    /// Allowed while the epoch is open or closing.
    pub fn on_failure(&mut self, epoch: u64) -> Vec<(NodeId, EpochMsg)> {
        self.vote(epoch, false)
    }

    pub fn state(&self) -> ParticipantState {
        self.state
    }

    /// The epoch new transactions join, if one is open.
    pub fn open_epoch(&self) -> Option<u64> {
        match self.state {
            ParticipantState::Open(e) => Some(e),
            _ => None,
        }
    }

    /// The epoch the caller must make durable, if one is closing.
    pub fn closing_epoch(&self) -> Option<u64> {
        match self.state {
            ParticipantState::Closing(e) => Some(e),
            _ => None,
        }
    }

    /// The highest epoch known committed (0 = none): its transactions may be released. Never
    /// decreases. Every epoch below it is decided too, but some may have aborted: a transaction
    /// asks [`outcome`](Self::outcome) of its own epoch.
    pub fn committed_epoch(&self) -> u64 {
        self.history.committed
    }

    /// Every epoch up to this one is decided (as far as this participant knows).
    pub fn decided_epoch(&self) -> u64 {
        self.history.decided
    }

    pub fn outcome(&self, epoch: u64) -> EpochOutcome {
        self.history.outcome(epoch)
    }

    pub fn stats(&self) -> EpochStats {
        self.stats
    }

    fn reply(&self, epoch: u64, durable: bool) -> Vec<(NodeId, EpochMsg)> {
        vec![(self.coordinator, EpochMsg::Closed { epoch, durable })]
    }

    fn vote(&mut self, epoch: u64, durable: bool) -> Vec<(NodeId, EpochMsg)> {
        match self.state {
            ParticipantState::Closing(e) | ParticipantState::Open(e) if e == epoch => {
                if durable && self.state == ParticipantState::Open(e) {
                    // The epoch is still open: more may be logged in it, so "durable" means
                    // nothing yet. The caller reports it again once the epoch is closing.
                    self.stats.unexpected += 1;
                    return Vec::new();
                }
                self.state = ParticipantState::Voted { epoch, durable };
                self.reply(epoch, durable)
            }
            ParticipantState::Voted { epoch: e, durable: d } if e == epoch => {
                // A vote cannot be taken back: what was durable stays durable.
                if d == durable {
                    self.stats.duplicate += 1;
                } else {
                    self.stats.unexpected += 1;
                }
                Vec::new()
            }
            ParticipantState::Open(e) | ParticipantState::Closing(e) | ParticipantState::Voted { epoch: e, .. } => {
                self.count_other_epoch(epoch, e);
                Vec::new()
            }
            ParticipantState::Recovering => {
                self.stats.unexpected += 1;
                Vec::new()
            }
        }
    }

    fn count_other_epoch(&mut self, epoch: u64, current: u64) {
        if epoch < current {
            self.stats.stale += 1;
        } else {
            self.stats.future += 1;
        }
    }

    fn on_close(&mut self, epoch: u64, committed: u64) -> Vec<(NodeId, EpochMsg)> {
        match self.state {
            ParticipantState::Recovering => {
                match self.limbo.take() {
                    Some(limbo) if limbo > epoch => {
                        // Older than what it voted for: sent before the crash.
                        self.limbo = Some(limbo);
                        self.stats.stale += 1;
                        return Vec::new();
                    }
                    Some(limbo) if limbo < epoch => self.settle_limbo(limbo, committed >= limbo),
                    // Asked again to close it: its vote was lost; it votes it down now.
                    Some(limbo) => self.history = History::starting_at(limbo),
                    None if self.history.known_from == u64::MAX => self.history = History::starting_at(epoch),
                    None => {}
                }
                self.history.abort_through(epoch - 1);
                self.state = ParticipantState::Voted { epoch, durable: false };
                self.stats.caught_up += 1;
                self.reply(epoch, false)
            }
            ParticipantState::Open(e) | ParticipantState::Closing(e) if epoch <= e => {
                if epoch < e {
                    self.stats.stale += 1;
                } else if self.state == ParticipantState::Open(e) {
                    self.state = ParticipantState::Closing(e);
                } else {
                    self.stats.duplicate += 1;
                }
                Vec::new()
            }
            ParticipantState::Voted { epoch: e, durable } if epoch <= e => {
                if epoch < e {
                    self.stats.stale += 1;
                    return Vec::new();
                }
                // Our vote was lost (or the Close duplicated): say it again.
                self.stats.duplicate += 1;
                self.reply(e, durable)
            }
            ParticipantState::Open(e) | ParticipantState::Closing(e) => {
                // The coordinator is closing a later epoch, so e and everything up to that one
                // were decided without hearing from us: none of them can have committed.
                self.history.abort_through(epoch - 1);
                self.catch_up(epoch, e)
            }
            ParticipantState::Voted { epoch: e, durable } => {
                // e was decided and we missed the decision. Nothing after e can have committed
                // without our vote, so `committed >= e` means exactly "e committed".
                if durable && committed >= e {
                    self.history.commit_next();
                } else {
                    self.history.abort_through(e);
                }
                self.history.abort_through(epoch - 1);
                self.catch_up(epoch, e)
            }
        }
    }

    fn catch_up(&mut self, closing: u64, from: u64) -> Vec<(NodeId, EpochMsg)> {
        self.stats.caught_up += closing - from;
        self.state = ParticipantState::Closing(closing);
        Vec::new()
    }

    fn on_decision(&mut self, epoch: u64, commit: bool) -> Vec<(NodeId, EpochMsg)> {
        let (e, voted_durable) = match self.state {
            ParticipantState::Recovering if self.limbo == Some(epoch) => {
                self.limbo = None;
                self.settle_limbo(epoch, commit);
                return Vec::new();
            }
            ParticipantState::Recovering => {
                self.stats.unexpected += 1;
                return Vec::new();
            }
            ParticipantState::Open(e) | ParticipantState::Closing(e) => (e, false),
            ParticipantState::Voted { epoch, durable } => (epoch, durable),
        };
        if epoch != e {
            self.count_other_epoch(epoch, e);
            return Vec::new();
        }
        if commit && !voted_durable {
            // An epoch cannot commit without our durable vote: not from an honest coordinator.
            self.stats.unexpected += 1;
            return Vec::new();
        }
        if commit {
            self.history.commit_next();
        } else {
            self.history.abort_through(e);
        }
        self.state = ParticipantState::Open(e + 1);
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;
    use std::cmp::Reverse;
    use std::collections::{BTreeSet, BinaryHeap};

    const COORD: NodeId = 0;
    const PARTS: [NodeId; 3] = [1, 2, 3];
    const STEP_US: u64 = 100;

    fn cfg() -> EpochConfig {
        EpochConfig { epoch_us: 5_000, timeout_us: 60_000, resend_us: 2_000 }
    }

    /// (arrival µs, sequence, from, to, encoded message).
    type Packet = (u64, u64, NodeId, NodeId, Vec<u8>);

    /// Packets in flight, delivered in (time, sequence) order: a seeded delay reorders them, and
    /// each may be lost or duplicated. Every message goes through postcard, as on a wire.
    struct Net {
        rng: Xoshiro256PlusPlus,
        queue: BinaryHeap<Reverse<Packet>>,
        seq: u64,
        loss: f64,
        dup: f64,
        max_delay_us: u64,
        down: Option<NodeId>,
    }

    impl Net {
        fn send(&mut self, now_us: u64, from: NodeId, out: Vec<(NodeId, EpochMsg)>) {
            for (to, msg) in out {
                if self.down == Some(from) || self.down == Some(to) || self.rng.gen_bool(self.loss) {
                    continue;
                }
                let copies = if self.rng.gen_bool(self.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let at = now_us + self.rng.gen_range(0..=self.max_delay_us);
                    let bytes = postcard::to_stdvec(&msg).expect("encode");
                    self.seq += 1;
                    self.queue.push(Reverse((at, self.seq, from, to, bytes)));
                }
            }
        }

        fn due(&mut self, now_us: u64) -> Vec<(NodeId, NodeId, EpochMsg)> {
            let mut out = Vec::new();
            while self.queue.peek().is_some_and(|Reverse(p)| p.0 <= now_us) {
                let Some(Reverse((_, _, from, to, bytes))) = self.queue.pop() else { break };
                if self.down == Some(to) {
                    continue;
                }
                out.push((from, to, postcard::from_bytes(&bytes).expect("decode")));
            }
            out
        }
    }

    /// One participant node: its protocol state, a log whose flush of a closing epoch takes a
    /// seeded time, and what it ran and flushed.
    struct Node {
        id: NodeId,
        p: EpochParticipant,
        flush_done_us: Option<(u64, u64)>,
        /// Epochs this node reported durable (or failed), with the vote.
        voted: Vec<(u64, bool)>,
        /// Epochs in which it ran transactions.
        ran_in: BTreeSet<u64>,
        fail_epoch: Option<u64>,
        last_committed: u64,
    }

    struct World {
        now_us: u64,
        net: Net,
        coord: EpochCoordinator,
        nodes: Vec<Node>,
        /// Decisions in the order the coordinator made them.
        decisions: Vec<(u64, bool)>,
        last_committed: u64,
    }

    impl World {
        fn new(seed: u64, loss: f64, fail: Option<(NodeId, u64)>) -> Self {
            let net = Net {
                rng: Xoshiro256PlusPlus::seed_from_u64(seed),
                queue: BinaryHeap::new(),
                seq: 0,
                loss,
                dup: 0.05,
                max_delay_us: 3_000,
                down: None,
            };
            let nodes = PARTS
                .iter()
                .map(|&id| Node {
                    id,
                    p: EpochParticipant::new(COORD, 1),
                    flush_done_us: None,
                    voted: Vec::new(),
                    ran_in: BTreeSet::new(),
                    fail_epoch: fail.filter(|f| f.0 == id).map(|f| f.1),
                    last_committed: 0,
                })
                .collect();
            let coord = EpochCoordinator::new(PARTS.to_vec(), cfg(), 0).unwrap();
            World { now_us: 0, net, coord, nodes, decisions: Vec::new(), last_committed: 0 }
        }

        /// The coordinator's output: record decisions, checking the commit rule as it is made.
        fn coord_out(&mut self, out: Vec<(NodeId, EpochMsg)>) {
            if let Some(&(_, msg)) = out.first() {
                let decided = match msg {
                    EpochMsg::Committed { epoch } => Some((epoch, true)),
                    EpochMsg::Aborted { epoch } => Some((epoch, false)),
                    _ => None,
                };
                if let Some((epoch, commit)) = decided {
                    if commit {
                        for n in &self.nodes {
                            assert!(
                                n.voted.contains(&(epoch, true)),
                                "epoch {epoch} committed before node {} was durable",
                                n.id
                            );
                        }
                    }
                    self.decisions.push((epoch, commit));
                }
            }
            self.net.send(self.now_us, COORD, out);
        }

        fn step(&mut self) {
            self.now_us += STEP_US;
            let now = self.now_us;
            for (from, to, msg) in self.net.due(now) {
                if to == COORD {
                    let out = self.coord.on_message(from, msg, now);
                    self.coord_out(out);
                } else if let Some(n) = self.nodes.iter_mut().find(|n| n.id == to) {
                    let out = n.p.on_message(from, msg);
                    self.net.send(now, to, out);
                }
            }
            let out = self.coord.tick(now);
            self.coord_out(out);
            for i in 0..self.nodes.len() {
                self.run_node(i);
            }
            assert!(self.coord.committed_epoch() >= self.last_committed, "coordinator went back");
            self.last_committed = self.coord.committed_epoch();
        }

        /// Run transactions in the open epoch; flush a closing epoch after a seeded delay.
        fn run_node(&mut self, i: usize) {
            let now = self.now_us;
            if self.net.down == Some(self.nodes[i].id) {
                return;
            }
            let flush_us = self.net.rng.gen_range(0..=2_000);
            let n = &mut self.nodes[i];
            if let Some(e) = n.p.open_epoch() {
                n.ran_in.insert(e);
            }
            match (n.p.closing_epoch(), n.flush_done_us) {
                (Some(e), None) => n.flush_done_us = Some((e, now + flush_us)),
                (Some(e), Some((f, at))) if f == e && now >= at => {
                    n.flush_done_us = None;
                    let durable = n.fail_epoch != Some(e);
                    n.voted.push((e, durable));
                    let out = if durable { n.p.on_durable(e) } else { n.p.on_failure(e) };
                    self.net.send(now, n.id, out);
                }
                (Some(e), Some((f, _))) if f != e => n.flush_done_us = Some((e, now + flush_us)),
                (None, _) => n.flush_done_us = None,
                _ => {}
            }
            let n = &mut self.nodes[i];
            assert!(n.p.committed_epoch() >= n.last_committed, "node {} went back", n.id);
            n.last_committed = n.p.committed_epoch();
        }

        fn run_until_decided(&mut self, epochs: u64) {
            let limit_us = epochs * 100_000;
            while (self.decisions.len() as u64) < epochs {
                self.step();
                assert!(self.now_us < limit_us, "no progress: {:?}", self.decisions);
            }
        }

        /// Decisions are made in epoch order, one per epoch, and every participant that learned
        /// an outcome learned the coordinator's, and only ran transactions in epochs it reached.
        fn check_agreement(&self) {
            for (i, &(epoch, _)) in self.decisions.iter().enumerate() {
                assert_eq!(epoch, i as u64 + 1, "decisions out of order: {:?}", self.decisions);
            }
            for n in &self.nodes {
                for e in 1..=n.p.decided_epoch() {
                    let theirs = n.p.outcome(e);
                    if theirs != EpochOutcome::Unknown {
                        assert_eq!(theirs, self.coord.outcome(e), "node {} epoch {e}", n.id);
                    }
                }
                assert!(n.p.committed_epoch() <= self.coord.committed_epoch());
            }
        }
    }

    #[test]
    fn epochs_commit_in_order_over_a_lossy_reordering_network() {
        let (mut resent, mut caught_up, mut duplicate) = (0, 0, 0);
        for seed in 0..60 {
            let mut w = World::new(seed, 0.1, None);
            w.run_until_decided(20);
            w.check_agreement();
            resent += w.coord.stats().resent;
            caught_up += w.nodes.iter().map(|n| n.p.stats().caught_up).sum::<u64>();
            duplicate += w.nodes.iter().map(|n| n.p.stats().duplicate).sum::<u64>();
            assert!(w.decisions.iter().all(|d| d.1), "seed {seed}: an epoch aborted: {:?}", w.decisions);
            // Epoch 20 needed every participant's vote, so each learned 19's fate first; one
            // that lost Committed(20) learns it from the next Close.
            for n in &w.nodes {
                assert!(n.p.committed_epoch() >= 19, "seed {seed}");
                assert!(n.ran_in.iter().all(|&e| e <= 21));
            }
        }
        // The seeds did exercise the repair paths: resent Close, a decision learned from the next
        // Close, duplicated messages.
        assert!(resent > 0 && caught_up > 0 && duplicate > 0, "{resent} {caught_up} {duplicate}");
    }

    #[test]
    fn a_failed_participant_aborts_exactly_that_epoch() {
        for seed in 0..60 {
            let mut w = World::new(seed, 0.1, Some((2, 7)));
            w.run_until_decided(15);
            w.check_agreement();
            for &(epoch, commit) in &w.decisions {
                assert_eq!(commit, epoch != 7, "seed {seed}: {:?}", w.decisions);
            }
            for n in &w.nodes {
                if n.p.decided_epoch() >= 7 {
                    assert_eq!(n.p.outcome(7), EpochOutcome::Aborted);
                }
            }
        }
    }

    #[test]
    fn a_crashed_participant_times_out_and_rejoins() {
        for seed in 0..20 {
            let mut w = World::new(seed, 0.05, None);
            w.run_until_decided(3);
            w.net.down = Some(3);
            let down_from = w.decisions.len();
            while w.now_us < 200_000 {
                w.step();
            }
            // Restart with memory lost.
            w.net.down = None;
            w.nodes[2].p = EpochParticipant::recovering(COORD);
            w.nodes[2].last_committed = 0;
            let restarted_at = w.decisions.len();
            w.run_until_decided(restarted_at as u64 + 6);
            w.check_agreement();
            // While it was down every epoch timed out (at most the one it had voted for before
            // going down committed), and the epoch it rejoined in was voted down.
            let while_down = &w.decisions[down_from + 1..restarted_at];
            assert!(!while_down.is_empty() && while_down.iter().all(|d| !d.1), "seed {seed}: {:?}", w.decisions);
            assert!(w.coord.stats().timeouts >= while_down.len() as u64);
            let rejoined = w.decisions[restarted_at..].iter().position(|d| !d.1).map(|i| i + restarted_at);
            assert!(rejoined.is_some(), "seed {seed}: the recovering node votes its first epoch down");
            assert!(w.decisions.last().is_some_and(|d| d.1), "seed {seed}: commits resume: {:?}", w.decisions);
            assert!(w.nodes[2].p.committed_epoch() > restarted_at as u64 || w.nodes[2].p.closing_epoch().is_some());
        }
    }

    #[test]
    fn stale_duplicate_foreign_and_bogus_messages_are_harmless() {
        let mut w = World::new(7, 0.0, None);
        w.run_until_decided(5);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(99);
        for _ in 0..2_000 {
            let node = rng.gen_range(0..PARTS.len());
            let (coord_before, part_before) = (w.coord.committed_epoch(), w.nodes[node].p.state());
            let old = rng.gen_range(0..=3);
            let msg = match rng.gen_range(0..6) {
                0 => EpochMsg::Close { epoch: old, committed: rng.gen() },
                1 => EpochMsg::Committed { epoch: old },
                2 => EpochMsg::Aborted { epoch: old },
                3 => EpochMsg::Closed { epoch: old, durable: rng.gen() },
                4 => EpochMsg::Committed { epoch: u64::MAX },
                _ => EpochMsg::Close { epoch: u64::MAX, committed: u64::MAX },
            };
            let from = if rng.gen_bool(0.2) { 42 } else { COORD };
            assert!(w.nodes[node].p.on_message(from, msg).is_empty());
            assert_eq!(w.nodes[node].p.state(), part_before);
            let from = if rng.gen_bool(0.2) { 42 } else { PARTS[node] };
            assert!(w.coord.on_message(from, msg, w.now_us).is_empty());
            assert_eq!(w.coord.committed_epoch(), coord_before);
        }
        let s = w.nodes[0].p.stats();
        assert!(s.stale > 0 && s.future > 0 && s.foreign > 0 && s.unexpected > 0, "{s:?}");
        let c = w.coord.stats();
        assert!(c.stale > 0 && c.foreign > 0 && c.unexpected > 0, "{c:?}");
        // And the run goes on as if nothing happened.
        w.run_until_decided(10);
        w.check_agreement();
        assert!(w.decisions.iter().all(|d| d.1));
    }

    #[test]
    fn duplicates_of_the_current_epoch_are_idempotent() {
        let mut c = EpochCoordinator::new(vec![1, 2], cfg(), 0).unwrap();
        let mut p = EpochParticipant::new(0, 1);
        assert!(c.tick(4_999).is_empty());
        let close = c.tick(5_000);
        assert_eq!(close[0], (1, EpochMsg::Close { epoch: 1, committed: 0 }));
        assert!(p.on_message(0, close[0].1).is_empty());
        assert!(p.on_message(0, close[0].1).is_empty(), "a duplicate Close");
        assert_eq!(p.closing_epoch(), Some(1));
        assert!(p.on_durable(2).is_empty(), "not the closing epoch");
        let vote = p.on_durable(1);
        assert!(p.on_durable(1).is_empty(), "a duplicate flush report");
        assert_eq!(p.on_message(0, close[0].1), vote, "a re-sent Close gets the vote again");
        assert!(c.on_message(1, vote[0].1, 5_100).is_empty());
        assert!(c.on_message(1, vote[0].1, 5_100).is_empty(), "a duplicate vote");
        assert_eq!(c.stats().duplicate, 1);
        // The silent participant is asked again, and the epoch commits with its vote.
        assert_eq!(c.tick(7_000), vec![(2, EpochMsg::Close { epoch: 1, committed: 0 })]);
        let done = c.on_message(2, EpochMsg::Closed { epoch: 1, durable: true }, 7_100);
        assert_eq!(done, vec![(1, EpochMsg::Committed { epoch: 1 }), (2, EpochMsg::Committed { epoch: 1 })]);
        assert!(p.on_message(0, done[0].1).is_empty());
        assert!(p.on_message(0, done[0].1).is_empty());
        assert_eq!((p.committed_epoch(), p.open_epoch(), p.outcome(1)), (1, Some(2), EpochOutcome::Committed));
        assert_eq!(p.stats().stale, 1);
        assert_eq!(c.next_deadline_us(), 12_100);
    }

    #[test]
    fn a_lost_decision_is_learned_from_the_next_close() {
        let mut p = EpochParticipant::new(0, 1);
        p.on_message(0, EpochMsg::Close { epoch: 1, committed: 0 });
        p.on_durable(1);
        // Committed(1) lost: Close(2) says 1 committed.
        p.on_message(0, EpochMsg::Close { epoch: 2, committed: 1 });
        assert_eq!((p.outcome(1), p.closing_epoch()), (EpochOutcome::Committed, Some(2)));
        p.on_durable(2);
        // Aborted(2) lost (another participant failed), then Close(4): 2 and 3 aborted.
        p.on_message(0, EpochMsg::Close { epoch: 4, committed: 1 });
        assert_eq!(
            (p.outcome(2), p.outcome(3), p.outcome(4)),
            (EpochOutcome::Aborted, EpochOutcome::Aborted, EpochOutcome::Pending)
        );
        assert_eq!(p.committed_epoch(), 1);
        // A participant that missed Close(5) entirely while open in 5 learns 5 aborted.
        p.on_durable(4);
        p.on_message(0, EpochMsg::Committed { epoch: 4 });
        assert_eq!(p.open_epoch(), Some(5));
        p.on_message(0, EpochMsg::Close { epoch: 1_000_000_000, committed: 4 });
        assert_eq!(p.outcome(5), EpochOutcome::Aborted);
        assert_eq!(p.outcome(999_999_999), EpochOutcome::Aborted);
        assert_eq!(p.closing_epoch(), Some(1_000_000_000));
        assert_eq!(p.outcome(0), EpochOutcome::Unknown);
    }

    #[test]
    fn a_recovering_participant_votes_its_first_epoch_down() {
        let mut p = EpochParticipant::recovering(0);
        assert_eq!(p.open_epoch(), None);
        assert!(p.on_message(0, EpochMsg::Committed { epoch: 3 }).is_empty());
        let vote = p.on_message(0, EpochMsg::Close { epoch: 9, committed: 8 });
        assert_eq!(vote, vec![(0, EpochMsg::Closed { epoch: 9, durable: false })]);
        assert_eq!(p.outcome(8), EpochOutcome::Unknown, "lost with its memory");
        p.on_message(0, EpochMsg::Aborted { epoch: 9 });
        assert_eq!((p.outcome(9), p.open_epoch()), (EpochOutcome::Aborted, Some(10)));
    }

    /// A participant restarted with an epoch it voted for and never heard of learns its fate
    /// from the next `Close` (`committed >= limbo` exactly when it committed) or from the
    /// decision itself, and still votes down the first epoch it is asked to close.
    #[test]
    fn a_participant_restarted_in_limbo_learns_its_fate_and_votes_the_next_epoch_down() {
        for (committed, fate) in [(5, EpochOutcome::Committed), (4, EpochOutcome::Aborted)] {
            let mut p = EpochParticipant::recovering_after(0, Some(5));
            assert!(p.on_message(0, EpochMsg::Close { epoch: 3, committed: 2 }).is_empty(), "older than its vote");
            let vote = p.on_message(0, EpochMsg::Close { epoch: 7, committed });
            assert_eq!(vote, vec![(0, EpochMsg::Closed { epoch: 7, durable: false })]);
            assert_eq!((p.outcome(5), p.outcome(6), p.decided_epoch()), (fate, EpochOutcome::Aborted, 6));
        }
        let mut p = EpochParticipant::recovering_after(0, Some(5));
        assert!(p.on_message(0, EpochMsg::Committed { epoch: 5 }).is_empty());
        assert_eq!((p.outcome(5), p.state()), (EpochOutcome::Committed, ParticipantState::Recovering));
        let vote = p.on_message(0, EpochMsg::Close { epoch: 6, committed: 5 });
        assert_eq!(vote, vec![(0, EpochMsg::Closed { epoch: 6, durable: false })], "it may have run part of 6");
        assert_eq!(p.outcome(5), EpochOutcome::Committed, "still known");
        let mut c = EpochCoordinator::resuming_after(vec![0], cfg(), 0, 9, 5).expect("valid");
        c.tick(cfg().epoch_us);
        assert_eq!(c.committed_epoch(), 5, "its Close messages say what the failed one committed last");
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(EpochCoordinator::new(vec![], cfg(), 0).unwrap_err(), EpochError::NoParticipants);
        assert_eq!(EpochCoordinator::new(vec![1, 1], cfg(), 0).unwrap_err(), EpochError::DuplicateParticipant(1));
        let zero = EpochConfig { resend_us: 0, ..cfg() };
        assert_eq!(EpochCoordinator::new(vec![1], zero, 0).unwrap_err(), EpochError::ZeroInterval("resend_us"));
    }

    #[test]
    fn history_stays_bounded() {
        let mut h = History::starting_at(1);
        for _ in 0..(ABORTED_RANGES_KEPT + 10) {
            h.abort_through(h.decided + 1);
            h.commit_next();
        }
        assert_eq!(h.aborted.len(), ABORTED_RANGES_KEPT);
        assert_eq!(h.outcome(1), EpochOutcome::Unknown);
        assert_eq!(h.outcome(h.decided), EpochOutcome::Committed);
        assert_eq!(h.outcome(h.decided - 1), EpochOutcome::Aborted);
    }
}
