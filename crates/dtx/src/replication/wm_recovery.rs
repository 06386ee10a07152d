//! Primo's recovery agreement (§5.2; digest 004, 3.12) under watermark group commit: after a
//! crash, every partition rolls back every transaction at or above one agreed global watermark.
//! Sans-IO, like [`super::epoch`]: the caller passes the time, ships the returned messages, tells
//! a partition when its records are durable, and rolls its data back when told to.
//!
//! **Which value is agreed.** The paper has each leader publish "its latest W_p" and everyone
//! adopt "the maximum value". Read literally (the maximum of the partitions' latest watermarks)
//! that breaks durability: with `W_p1 = 4` and `W_p2 = 10`, a transaction at 7 that reached P2's
//! log and not P1's would be kept at P2 and lost at P1 ([`Reading::MaxLatest`], and the test that
//! fails under it). dtx agrees on the **minimum of the partitions' latest persisted W_p**
//! ([`Reading::MinPersisted`], the digest's reading (ii)):
//! - durable: every partition persisted every transaction below its own persisted W_p, so below
//!   their minimum every partition holds all of them;
//! - nothing acknowledged is rolled back: a client is answered below some partition's view of
//!   W_g, a minimum of broadcast W_p's, and a W_p is broadcast only once persisted (invariant (c)),
//!   so every view lies at or below the agreed value, provided no partition broadcasts a newer
//!   W_p between reporting and rolling back: a partition that reported is frozen until then.
//!
//! **Terms.** Each agreement has a term; a second failure during one starts the next term, and
//! messages of older terms are ignored. A partition logs `(term, W_g)` before it rolls back, so a
//! replay skips the rolled-back records that precede that entry (by log position, not by `ts`:
//! newer transactions after it have `ts >= W_g` too).
//!
//! **A decided term no partition may miss.** The coordinator logs each decision `(term, W_g)`
//! before it announces it, and a partition reports the last term it carried out. If the
//! coordinator fails after deciding term k and before every partition has rolled back, a
//! partition still in an older term would otherwise meet term k+1 with k+1's (larger) W_g and keep
//! what k rolled back everywhere else; so each partition rolls back to the smallest W_g of the
//! terms it missed and the current one. That is safe: a partition serves no transaction of a term
//! it has not reached, and its view of W_g (hence what it acknowledged and what it forgot how to
//! undo) stays below every later agreement, since a partition counts only watermarks of its own
//! term or older ones (a watermark only grows, so an older one stays true).
//!
//! **What detects a failure.** The paper uses ZooKeeper; dtx has none, so the coordinator of
//! the agreement is node 0 (itself replicated by its log), and its term is logged before it
//! asks. An agreement is started by either of:
//! - the partition that lost something: a node that restarted from its log, or one taken over
//!   by another host under `--durability replicated` (its log's Raft group detects the silent
//!   leader by its election timeout and a follower takes the node over), serves nothing and
//!   calls node 0 until it is through an agreement;
//! - node 0's [`Heartbeats`], fed by every watermark message (a live partition sends its W_p
//!   every interval) and every other gate message: a partition silent for the suspect timeout
//!   (ten intervals, at least 100 ms) is suspected and an agreement begins (in a run with a
//!   log and more than one node: otherwise nothing is ever rolled back). That is what
//!   catches a partition cut off without crashing: it lost nothing, so it never calls, while what the cut left hanging (a lock it took for a transaction whose abort the
//!   cut lost) holds its W_p, and so W_g, until the orphan sweeper asks about it.
//!
//! The agreement still needs every partition's report, so it completes once the silent one
//! answers again (the cut heals, it restarts, or it is taken over): W_g cannot pass a silent
//! partition safely without it. The agreed value must lie at or above every view of W_g that
//! acknowledged a commit, the silent partition's own included, and at or below its persisted
//! W_p; only its report tells either. (If the others last heard W_p 4 from P1, while P1 heard
//! 8 from each of them and then persisted 10, P1's view is 8: it may have acknowledged a commit
//! at 6, which an agreement on 4 would roll back elsewhere. And an agreement on the others'
//! minimum could keep a commit whose install the cut kept from P1: its coordinator's W_p does
//! not wait for its installs.) Until then the other partitions broadcast nothing (W_g is stuck
//! anyway) and keep what a rollback needs; once it answers, everything at or above the
//! minimum persisted W_p is rolled back, the cut-off node included (it puts back what it
//! installed there, as any partition does), and every node releases what older terms'
//! transactions hold: W_g moves with the new term's first watermarks.

use crate::net::NodeId;
use serde::{Deserialize, Serialize};

/// The messages of the agreement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WmMsg {
    /// Coordinator -> partition: report your latest persisted W_p for agreement `term`, and
    /// broadcast no newer one until told the outcome.
    Report { term: u64 },
    /// Partition -> coordinator: the latest W_p this partition persisted, and the last term it
    /// rolled back in (`applied`).
    Persisted { term: u64, w_p: u64, applied: u64 },
    /// Coordinator -> partition: log `(term, w_g)`, then roll back every transaction with
    /// `ts >= w_g`.
    RollBack { term: u64, w_g: u64 },
    /// Partition -> coordinator: logged and rolled back.
    RolledBack { term: u64 },
}

/// How the agreed value is read from the partitions' reports (the paper is ambiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// The minimum of the latest persisted W_p: dtx's.
    MinPersisted,
    /// The maximum of the latest W_p, the paper read literally: breaks durability (kept only to
    /// show that it does).
    MaxLatest,
}

impl Reading {
    /// The agreed W_g from every partition's report.
    pub fn agree(self, reports: &[u64]) -> Option<u64> {
        match self {
            Reading::MinPersisted => reports.iter().copied().min(),
            Reading::MaxLatest => reports.iter().copied().max(),
        }
    }
}

#[derive(Debug, Clone)]
enum Phase {
    Idle,
    /// Waiting for every partition's report: `(w_p, applied term)`.
    Collecting {
        reports: Vec<Option<(u64, u64)>>,
        last_sent_us: u64,
    },
    /// Agreed on `w_g`, each partition on its own target (below `w_g` where it missed a decided
    /// term); waiting for the decision to be logged.
    Deciding {
        w_g: u64,
        targets: Vec<u64>,
    },
    /// The decision is logged; waiting for every partition to have rolled back.
    RollingBack {
        w_g: u64,
        targets: Vec<u64>,
        done: Vec<bool>,
        last_sent_us: u64,
    },
}

/// What the coordinator logs before announcing an agreement: `term` rolls back from `w_g`, and
/// every partition had carried out every term through `settled_through` (older decisions are
/// not needed any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub term: u64,
    pub w_g: u64,
    pub settled_through: u64,
}

/// Decisions kept for partitions that missed them: one per agreement since the last one every
/// partition carried out. More means agreements keep failing before any finishes.
pub const MAX_DECIDED: usize = 1 << 16;

/// The coordinator of the agreement (node 0).
#[derive(Debug, Clone)]
pub struct RecoveryCoordinator {
    partitions: Vec<NodeId>,
    term: u64,
    phase: Phase,
    resend_us: u64,
    /// The last agreement finished: `(term, w_g)`.
    agreed: Option<(u64, u64)>,
    /// Decisions logged, `term -> w_g`, that a partition may not have carried out yet.
    decided: std::collections::BTreeMap<u64, u64>,
    /// No agreement begun since this coordinator (re)started: the next call begins one, since
    /// one it began before a crash may have been cut short.
    fresh: bool,
}

impl RecoveryCoordinator {
    /// `last_term`: the highest term in the coordinator's log (0: none); `decided`: the
    /// decisions it logged that not every partition is known to have carried out.
    pub fn new(partitions: Vec<NodeId>, last_term: u64, decided: &[(u64, u64)], resend_us: u64) -> Self {
        assert!(!partitions.is_empty() && resend_us > 0, "an agreement needs partitions and a resend interval");
        let decided: std::collections::BTreeMap<u64, u64> = decided.iter().copied().collect();
        assert!(decided.keys().all(|&t| t <= last_term), "a decision past the coordinator's last term {last_term}");
        RecoveryCoordinator {
            partitions,
            term: last_term,
            phase: Phase::Idle,
            resend_us,
            agreed: None,
            decided,
            fresh: true,
        }
    }

    /// A node whose last agreement was `after` asks for one: does it need a new term? Not while
    /// one is under way, nor once one past `after` finished (the call is stale), except the first
    /// call after the coordinator (re)started.
    pub fn should_begin(&self, after: u64) -> bool {
        !self.busy() && (self.fresh || self.term <= after)
    }

    /// A crash was detected (or another one during an agreement): start term `term() + 1`, which
    /// the caller logs before shipping the returned messages.
    pub fn begin(&mut self, now_us: u64) -> Vec<(NodeId, WmMsg)> {
        self.fresh = false;
        self.term += 1;
        self.phase = Phase::Collecting { reports: vec![None; self.partitions.len()], last_sent_us: now_us };
        self.to_all(WmMsg::Report { term: self.term })
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Is an agreement under way?
    pub fn busy(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    /// The last agreement that every partition carried out: `(term, w_g)`.
    pub fn agreed(&self) -> Option<(u64, u64)> {
        self.agreed
    }

    /// The decisions some partition may still have to carry out, oldest first.
    #[cfg(test)]
    pub fn decided(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.decided.iter().map(|(&t, &w)| (t, w))
    }

    /// A partition's answer. Answers of other terms, from strangers, or repeated, are ignored.
    /// Once every partition reported, returns the decision for the caller to log, then to
    /// [`RecoveryCoordinator::announce`].
    pub fn on_message(&mut self, from: NodeId, msg: WmMsg) -> Option<Decision> {
        let i = self.partitions.iter().position(|&p| p == from)?;
        match (&mut self.phase, msg) {
            (Phase::Collecting { reports, .. }, WmMsg::Persisted { term, w_p, applied }) if term == self.term => {
                reports[i] = Some((reports[i].map_or(w_p, |r| r.0.max(w_p)), applied));
                let all: Vec<(u64, u64)> = reports.iter().copied().collect::<Option<_>>()?;
                let w_p: Vec<u64> = all.iter().map(|r| r.0).collect();
                let w_g = Reading::MinPersisted.agree(&w_p).expect("at least one partition");
                let targets = all.iter().map(|&(_, applied)| self.target(w_g, applied)).collect();
                self.decided.insert(self.term, w_g);
                assert!(self.decided.len() <= MAX_DECIDED, "{MAX_DECIDED} agreements and none finished");
                self.phase = Phase::Deciding { w_g, targets };
                let oldest = *self.decided.keys().next().expect("this term's decision");
                Some(Decision { term: self.term, w_g, settled_through: oldest - 1 })
            }
            (Phase::RollingBack { w_g, done, .. }, WmMsg::RolledBack { term }) if term == self.term => {
                done[i] = true;
                if done.iter().all(|&d| d) {
                    self.agreed = Some((self.term, *w_g));
                    // Every partition is at this term now: no one can miss an older decision.
                    self.decided = self.decided.split_off(&(self.term + 1));
                    self.phase = Phase::Idle;
                }
                None
            }
            _ => None,
        }
    }

    /// Where a partition that last carried out term `applied` rolls back to when this term
    /// agrees on `w_g`: to the smallest W_g of every decided term it missed, and of this one.
    fn target(&self, w_g: u64, applied: u64) -> u64 {
        self.decided.range(applied + 1..self.term).map(|(_, &w)| w).fold(w_g, u64::min)
    }

    /// The decision of `term` is logged: tell every partition where to roll back to.
    pub fn announce(&mut self, term: u64, now_us: u64) -> Vec<(NodeId, WmMsg)> {
        let Phase::Deciding { w_g, targets } = &mut self.phase else { return Vec::new() };
        if term != self.term {
            return Vec::new();
        }
        let targets = std::mem::take(targets);
        let out = self.partitions.iter().zip(&targets).map(|(&p, &w_g)| (p, WmMsg::RollBack { term, w_g })).collect();
        let done = vec![false; self.partitions.len()];
        self.phase = Phase::RollingBack { w_g: *w_g, targets, done, last_sent_us: now_us };
        out
    }

    /// Resend to the partitions that have not answered (a new leader may be taking over).
    pub fn tick(&mut self, now_us: u64) -> Vec<(NodeId, WmMsg)> {
        let term = self.term;
        let msgs: Vec<Option<WmMsg>> = match &mut self.phase {
            Phase::Collecting { reports, last_sent_us } if now_us >= *last_sent_us + self.resend_us => {
                *last_sent_us = now_us;
                reports.iter().map(|r| r.is_none().then_some(WmMsg::Report { term })).collect()
            }
            Phase::RollingBack { targets, done, last_sent_us, .. } if now_us >= *last_sent_us + self.resend_us => {
                *last_sent_us = now_us;
                targets.iter().zip(done.iter()).map(|(&w_g, d)| (!d).then_some(WmMsg::RollBack { term, w_g })).collect()
            }
            _ => return Vec::new(),
        };
        self.partitions.iter().zip(msgs).filter_map(|(&p, m)| Some((p, m?))).collect()
    }

    fn to_all(&self, msg: WmMsg) -> Vec<(NodeId, WmMsg)> {
        self.partitions.iter().map(|&p| (p, msg)).collect()
    }
}

/// What a partition must do after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionAction {
    /// Nothing (besides sending what was returned).
    None,
    /// Log `(term, w_g)`, roll back every transaction with `ts >= w_g` (values and leases), then
    /// call [`RecoveryPartition::rolled_back`].
    RollBack { term: u64, w_g: u64 },
}

/// A partition's side of the agreement.
#[derive(Debug, Clone)]
pub struct RecoveryPartition {
    coordinator: NodeId,
    /// The highest term seen (from the log after a restart).
    term: u64,
    /// The last term this partition rolled back in.
    applied: u64,
    /// The latest W_p whose record is durable.
    persisted: u64,
    /// Reported in this term and not yet rolled back: no newer W_p may be broadcast.
    frozen: Option<u64>,
}

impl RecoveryPartition {
    /// `persisted`: the latest W_p in the partition's log; `last_term`: the latest agreement term
    /// in it.
    pub fn new(coordinator: NodeId, persisted: u64, last_term: u64) -> Self {
        RecoveryPartition { coordinator, term: last_term, applied: last_term, persisted, frozen: None }
    }

    /// The record of `w_p` is durable. Watermarks only grow.
    pub fn on_persisted(&mut self, w_p: u64) {
        self.persisted = self.persisted.max(w_p);
    }

    /// May the partition broadcast its persisted W_p now? Not between a report and the rollback.
    pub fn may_broadcast(&self) -> bool {
        self.frozen.is_none()
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// A message from the coordinator: what to send, and what to do.
    pub fn on_message(&mut self, from: NodeId, msg: WmMsg) -> (Vec<(NodeId, WmMsg)>, PartitionAction) {
        if from != self.coordinator {
            return (Vec::new(), PartitionAction::None);
        }
        match msg {
            WmMsg::Report { term } if term >= self.term => {
                self.term = term;
                self.frozen = Some(term);
                let report = WmMsg::Persisted { term, w_p: self.persisted, applied: self.applied };
                (vec![(self.coordinator, report)], PartitionAction::None)
            }
            WmMsg::RollBack { term, w_g } if term >= self.term => {
                self.term = term;
                (Vec::new(), PartitionAction::RollBack { term, w_g })
            }
            _ => (Vec::new(), PartitionAction::None),
        }
    }

    /// The rollback of `term` is logged and done.
    pub fn rolled_back(&mut self, term: u64) -> Vec<(NodeId, WmMsg)> {
        self.applied = self.applied.max(term);
        if self.frozen.is_some_and(|t| t <= term) {
            self.frozen = None;
        }
        vec![(self.coordinator, WmMsg::RolledBack { term })]
    }
}

/// Failure detection at node 0: every message from a partition is a beat (its watermarks come
/// every interval), and one silent for too long is suspected.
#[derive(Debug, Clone)]
pub struct Heartbeats {
    last_us: Vec<u64>,
    suspect_after_us: u64,
    suspected: Vec<bool>,
}

impl Heartbeats {
    pub fn new(partitions: usize, now_us: u64, suspect_after_us: u64) -> Self {
        Heartbeats { last_us: vec![now_us; partitions], suspect_after_us, suspected: vec![false; partitions] }
    }

    /// Partition `p` was heard from.
    pub fn beat(&mut self, p: usize, now_us: u64) {
        if let Some(last) = self.last_us.get_mut(p) {
            *last = (*last).max(now_us);
            self.suspected[p] = false;
        }
    }

    /// Every partition counts as heard at `now_us` (silence before says nothing: an agreement
    /// was under way, during which partitions do not broadcast).
    pub fn reset(&mut self, now_us: u64) {
        for p in 0..self.last_us.len() {
            self.beat(p, now_us);
        }
    }

    /// The partitions newly suspected at `now_us`.
    pub fn tick(&mut self, now_us: u64) -> Vec<usize> {
        let mut newly = Vec::new();
        for (p, last) in self.last_us.iter().enumerate() {
            if !self.suspected[p] && now_us.saturating_sub(*last) >= self.suspect_after_us {
                self.suspected[p] = true;
                newly.push(p);
            }
        }
        newly
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliver the coordinator's messages to the partitions and their answers back (the
    /// decision logged at once) until nothing is in flight; the partitions in `cut_after_decision`
    /// hear nothing once the decision is announced. Returns what each was told to do.
    fn run(
        c: &mut RecoveryCoordinator,
        parts: &mut [RecoveryPartition],
        mut inbox: Vec<(NodeId, WmMsg)>,
        cut_after_decision: &[NodeId],
    ) -> Vec<PartitionAction> {
        let mut actions = vec![PartitionAction::None; parts.len()];
        let mut announced = false;
        while !inbox.is_empty() {
            let mut replies = Vec::new();
            for (to, msg) in inbox {
                if announced && cut_after_decision.contains(&to) {
                    continue;
                }
                let (out, action) = parts[to as usize].on_message(0, msg);
                if let PartitionAction::RollBack { term, .. } = action {
                    actions[to as usize] = action;
                    replies.extend(parts[to as usize].rolled_back(term).into_iter().map(|m| (to, m.1)));
                }
                replies.extend(out.into_iter().map(|m| (to, m.1)));
            }
            inbox = Vec::new();
            for (from, msg) in replies {
                if let Some(d) = c.on_message(from, msg) {
                    announced = true;
                    inbox.extend(c.announce(d.term, 0));
                }
            }
        }
        actions
    }

    /// Drive one agreement over `persisted` (one partition each, node i), delivering every
    /// message: the agreed value and what each partition was told to roll back.
    fn agree(persisted: &[u64]) -> (u64, Vec<PartitionAction>) {
        let nodes: Vec<NodeId> = (0..persisted.len() as u16).collect();
        let mut c = RecoveryCoordinator::new(nodes.clone(), 0, &[], 1_000);
        let mut parts: Vec<_> = persisted.iter().map(|&w| RecoveryPartition::new(0, w, 0)).collect();
        let inbox = c.begin(0);
        let actions = run(&mut c, &mut parts, inbox, &[]);
        let (term, w_g) = c.agreed().expect("the agreement finished");
        assert_eq!(term, 1);
        assert!(parts.iter().all(RecoveryPartition::may_broadcast), "every partition thawed");
        assert_eq!(c.decided().count(), 0, "every partition carried it out: nothing kept");
        (w_g, actions)
    }

    /// The coordinator decides term 1 (W_g 4) and crashes before partition 1 hears it; the
    /// others carry it out and move on (their W_p grows). Restarted from its log (which holds
    /// the decision), it runs term 2 on W_g 10: partition 1, still at term 0, rolls back to 4,
    /// what term 1 rolled back everywhere else, and not to 10 (which would keep it at 1 alone).
    #[test]
    fn a_partition_that_missed_a_decided_term_rolls_back_to_its_watermark() {
        let mut c = RecoveryCoordinator::new(vec![0, 1, 2], 0, &[], 1_000);
        let mut parts: Vec<_> = [4, 12, 9].iter().map(|&w| RecoveryPartition::new(0, w, 0)).collect();
        let inbox = c.begin(0);
        let actions = run(&mut c, &mut parts, inbox, &[1]);
        assert_eq!(actions[1], PartitionAction::None, "partition 1 missed the decision");
        assert_eq!(c.decided().collect::<Vec<_>>(), vec![(1, 4)], "logged before announced");
        for (p, w_p) in [(0, 15), (2, 11)] {
            parts[p].on_persisted(w_p);
        }
        let mut restarted = RecoveryCoordinator::new(vec![0, 1, 2], 1, &[(1, 4)], 1_000);
        assert!(restarted.should_begin(1), "a restarted coordinator begins again");
        let inbox = restarted.begin(0);
        assert_eq!(restarted.term(), 2);
        assert!(!restarted.should_begin(0), "not twice");
        let actions = run(&mut restarted, &mut parts, inbox, &[]);
        assert_eq!(actions[0], PartitionAction::RollBack { term: 2, w_g: 11 });
        assert_eq!(actions[1], PartitionAction::RollBack { term: 2, w_g: 4 }, "to the term it missed");
        assert_eq!(actions[2], PartitionAction::RollBack { term: 2, w_g: 11 });
        assert_eq!(restarted.agreed(), Some((2, 11)));
        assert_eq!(restarted.decided().count(), 0, "every partition is at term 2");
    }

    #[test]
    fn every_partition_rolls_back_from_the_minimum_persisted_watermark() {
        let (w_g, actions) = agree(&[4, 10, 6]);
        assert_eq!(w_g, 4);
        assert!(actions.iter().all(|a| *a == PartitionAction::RollBack { term: 1, w_g: 4 }), "{actions:?}");
    }

    /// The digest's example: P1 persisted W_p 4, P2 10, and a transaction at 7 reached P2's log
    /// but not P1's (P1's leader crashed). Durable means: below the agreed value, every partition
    /// holds every transaction it took part in. The paper read literally (the maximum) keeps the
    /// transaction at P2 and loses it at P1; the minimum rolls it back at both.
    #[test]
    fn the_maximum_of_the_latest_watermarks_breaks_durability_and_the_minimum_does_not() {
        let persisted = [4, 10];
        let logged_at = [false, true]; // the transaction at ts 7, per partition
        let durable = |w_g: u64| 7 >= w_g || logged_at.iter().all(|&l| l);
        assert!(!durable(Reading::MaxLatest.agree(&persisted).unwrap()), "the literal reading keeps half of it");
        assert!(durable(Reading::MinPersisted.agree(&persisted).unwrap()));
        assert_eq!(agree(&persisted).0, 4, "dtx agrees on the minimum");
    }

    /// Over many random histories: a partition's persisted W_p grows, broadcasts only persisted
    /// values (invariant (c)), and a client is answered below a view (a minimum of broadcast
    /// values). The agreed minimum is never below a view (nothing answered is rolled back) and
    /// never above a partition's persisted value (nothing rolled forward that a partition lacks).
    #[test]
    fn the_agreed_value_rolls_back_nothing_answered_and_keeps_only_what_is_durable() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..500 {
            let parts = 2 + next(4) as usize;
            let mut persisted = vec![0u64; parts];
            let mut views = vec![vec![0u64; parts]; parts];
            for _ in 0..next(50) {
                let p = next(parts as u64) as usize;
                persisted[p] += next(5);
                // Broadcast what is persisted; some partitions hear it, some not yet.
                for (q, view) in views.iter_mut().enumerate() {
                    if q == p || next(2) == 0 {
                        view[p] = view[p].max(persisted[p]);
                    }
                }
            }
            let (w_g, _) = agree(&persisted);
            for view in &views {
                let answered_below = view.iter().copied().min().unwrap();
                assert!(answered_below <= w_g, "a view {answered_below} above the agreed {w_g}: {persisted:?}");
            }
            assert!(persisted.iter().all(|&p| p >= w_g), "agreed {w_g} above a persisted W_p: {persisted:?}");
        }
    }

    /// A second failure during an agreement starts the next term: the first term's late answers
    /// change nothing, and a partition follows the newer term.
    #[test]
    fn a_new_term_replaces_an_agreement_a_second_failure_interrupted() {
        let mut c = RecoveryCoordinator::new(vec![0, 1], 3, &[], 1_000);
        c.begin(0);
        assert_eq!(c.term(), 4);
        c.on_message(0, WmMsg::Persisted { term: 4, w_p: 9, applied: 3 });
        c.begin(20);
        assert_eq!(c.on_message(1, WmMsg::Persisted { term: 4, w_p: 2, applied: 3 }), None, "an old term's answer");
        c.on_message(0, WmMsg::Persisted { term: 5, w_p: 9, applied: 3 });
        let decision = Decision { term: 5, w_g: 9, settled_through: 4 };
        assert_eq!(c.on_message(1, WmMsg::Persisted { term: 5, w_p: 12, applied: 3 }), Some(decision));
        assert_eq!(c.tick(5_000), vec![], "nothing is announced before the decision is logged");
        let out = c.announce(5, 60);
        assert!(out.iter().all(|(_, m)| *m == WmMsg::RollBack { term: 5, w_g: 9 }), "{out:?}");
        let mut p = RecoveryPartition::new(0, 12, 4);
        assert_eq!(p.on_message(0, WmMsg::Report { term: 3 }).0, vec![], "older than its log's term");
        let report = WmMsg::Persisted { term: 5, w_p: 12, applied: 4 };
        assert_eq!(p.on_message(0, WmMsg::Report { term: 5 }).0, vec![(0, report)]);
        assert!(!p.may_broadcast(), "frozen between its report and the rollback");
        assert_eq!(
            p.on_message(0, WmMsg::RollBack { term: 5, w_g: 9 }).1,
            PartitionAction::RollBack { term: 5, w_g: 9 }
        );
        p.rolled_back(5);
        assert!(p.may_broadcast());
        // Resends reach only the silent.
        let mut c = RecoveryCoordinator::new(vec![0, 1, 2], 0, &[], 1_000);
        c.begin(0);
        c.on_message(1, WmMsg::Persisted { term: 1, w_p: 3, applied: 0 });
        assert!(c.tick(500).is_empty(), "not yet");
        let again: Vec<NodeId> = c.tick(1_000).into_iter().map(|(n, _)| n).collect();
        assert_eq!(again, vec![0, 2]);
    }

    #[test]
    fn a_silent_partition_is_suspected_once_until_it_beats_again() {
        let mut h = Heartbeats::new(3, 0, 100);
        h.beat(0, 80);
        h.beat(1, 90);
        assert_eq!(h.tick(150), vec![2]);
        assert_eq!(h.tick(160), Vec::<usize>::new(), "already suspected");
        assert_eq!(h.tick(185), vec![0]);
        h.beat(0, 190);
        assert_eq!(h.tick(200), vec![1], "0 beat again; 1 has been silent 110 us");
        assert_eq!(h.tick(290), vec![0], "silent again");
        h.reset(300);
        assert_eq!(h.tick(399), Vec::<usize>::new(), "every partition counts as heard at 300");
        assert_eq!(h.tick(400), vec![0, 1, 2]);
    }
}
