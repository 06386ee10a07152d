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
//! **What detects a crash.** [`Heartbeats`]: every partition's leader beats every `beat_us`; a
//! partition silent for `suspect_after_us` is suspected, and its recovery (a new leader elected
//! by its Raft group, or the restarted node) starts the agreement. The paper uses ZooKeeper for
//! both; dtx has no ZooKeeper, so the coordinator of the agreement is node 0 (itself replicated
//! by its log), and its term is logged before it asks.

use crate::net::NodeId;
use serde::{Deserialize, Serialize};

/// The messages of the agreement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WmMsg {
    /// Coordinator -> partition: report your latest persisted W_p for agreement `term`, and
    /// broadcast no newer one until told the outcome.
    Report { term: u64 },
    /// Partition -> coordinator: the latest W_p this partition persisted.
    Persisted { term: u64, w_p: u64 },
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
    /// Waiting for every partition's report.
    Collecting {
        reports: Vec<Option<u64>>,
        last_sent_us: u64,
    },
    /// Agreed on `w_g`; waiting for every partition to have rolled back.
    RollingBack {
        w_g: u64,
        done: Vec<bool>,
        last_sent_us: u64,
    },
}

/// The coordinator of the agreement (node 0).
#[derive(Debug, Clone)]
pub struct RecoveryCoordinator {
    partitions: Vec<NodeId>,
    term: u64,
    phase: Phase,
    resend_us: u64,
    /// The last agreement finished: `(term, w_g)`.
    agreed: Option<(u64, u64)>,
}

impl RecoveryCoordinator {
    /// `last_term`: the highest term in the coordinator's log (0: none).
    pub fn new(partitions: Vec<NodeId>, last_term: u64, resend_us: u64) -> Self {
        assert!(!partitions.is_empty() && resend_us > 0, "an agreement needs partitions and a resend interval");
        RecoveryCoordinator { partitions, term: last_term, phase: Phase::Idle, resend_us, agreed: None }
    }

    /// A crash was detected (or another one during an agreement): start term `term() + 1`, which
    /// the caller logs before shipping the returned messages.
    pub fn begin(&mut self, now_us: u64) -> Vec<(NodeId, WmMsg)> {
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

    /// A partition's answer. Answers of other terms, from strangers, or repeated, are ignored.
    pub fn on_message(&mut self, from: NodeId, msg: WmMsg, now_us: u64) -> Vec<(NodeId, WmMsg)> {
        let Some(i) = self.partitions.iter().position(|&p| p == from) else { return Vec::new() };
        match (&mut self.phase, msg) {
            (Phase::Collecting { reports, .. }, WmMsg::Persisted { term, w_p }) if term == self.term => {
                reports[i] = Some(reports[i].map_or(w_p, |r| r.max(w_p)));
                let all: Option<Vec<u64>> = reports.iter().copied().collect();
                let Some(all) = all else { return Vec::new() };
                let w_g = Reading::MinPersisted.agree(&all).expect("at least one partition");
                self.phase = Phase::RollingBack { w_g, done: vec![false; self.partitions.len()], last_sent_us: now_us };
                self.to_all(WmMsg::RollBack { term: self.term, w_g })
            }
            (Phase::RollingBack { w_g, done, .. }, WmMsg::RolledBack { term }) if term == self.term => {
                done[i] = true;
                if done.iter().all(|&d| d) {
                    self.agreed = Some((self.term, *w_g));
                    self.phase = Phase::Idle;
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Resend to the partitions that have not answered (a new leader may be taking over).
    pub fn tick(&mut self, now_us: u64) -> Vec<(NodeId, WmMsg)> {
        let term = self.term;
        let (msg, silent) = match &mut self.phase {
            Phase::Idle => return Vec::new(),
            Phase::Collecting { reports, last_sent_us } if now_us >= *last_sent_us + self.resend_us => {
                *last_sent_us = now_us;
                (WmMsg::Report { term }, reports.iter().map(Option::is_none).collect::<Vec<_>>())
            }
            Phase::RollingBack { w_g, done, last_sent_us } if now_us >= *last_sent_us + self.resend_us => {
                *last_sent_us = now_us;
                (WmMsg::RollBack { term, w_g: *w_g }, done.iter().map(|d| !d).collect())
            }
            _ => return Vec::new(),
        };
        self.partitions.iter().zip(silent).filter(|(_, s)| *s).map(|(&p, _)| (p, msg)).collect()
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
    /// The latest W_p whose record is durable.
    persisted: u64,
    /// Reported in this term and not yet rolled back: no newer W_p may be broadcast.
    frozen: Option<u64>,
}

impl RecoveryPartition {
    /// `persisted`: the latest W_p in the partition's log; `last_term`: the latest agreement term
    /// in it.
    pub fn new(coordinator: NodeId, persisted: u64, last_term: u64) -> Self {
        RecoveryPartition { coordinator, term: last_term, persisted, frozen: None }
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
                (vec![(self.coordinator, WmMsg::Persisted { term, w_p: self.persisted })], PartitionAction::None)
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
        if self.frozen.is_some_and(|t| t <= term) {
            self.frozen = None;
        }
        vec![(self.coordinator, WmMsg::RolledBack { term })]
    }
}

/// Crash detection: the partitions' leaders beat, and one silent for too long is suspected.
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

    /// Drive one agreement over `persisted` (one partition each, node i), delivering every
    /// message: the agreed value and what each partition was told to roll back.
    fn agree(persisted: &[u64]) -> (u64, Vec<PartitionAction>) {
        let nodes: Vec<NodeId> = (0..persisted.len() as u16).collect();
        let mut c = RecoveryCoordinator::new(nodes.clone(), 0, 1_000);
        let mut parts: Vec<_> = persisted.iter().map(|&w| RecoveryPartition::new(0, w, 0)).collect();
        let mut actions = vec![PartitionAction::None; parts.len()];
        let mut inbox = c.begin(0);
        while !inbox.is_empty() {
            let mut replies = Vec::new();
            for (to, msg) in inbox {
                let (out, action) = parts[to as usize].on_message(0, msg);
                if let PartitionAction::RollBack { term, .. } = action {
                    actions[to as usize] = action;
                    replies.extend(parts[to as usize].rolled_back(term).into_iter().map(|m| (to, m.1)));
                }
                replies.extend(out.into_iter().map(|m| (to, m.1)));
            }
            inbox = replies.into_iter().flat_map(|(from, msg)| c.on_message(from, msg, 0)).collect();
        }
        let (term, w_g) = c.agreed().expect("the agreement finished");
        assert_eq!(term, 1);
        assert!(parts.iter().all(RecoveryPartition::may_broadcast), "every partition thawed");
        (w_g, actions)
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
        let mut c = RecoveryCoordinator::new(vec![0, 1], 3, 1_000);
        c.begin(0);
        assert_eq!(c.term(), 4);
        c.on_message(0, WmMsg::Persisted { term: 4, w_p: 9 }, 10);
        c.begin(20);
        assert!(c.on_message(1, WmMsg::Persisted { term: 4, w_p: 2 }, 30).is_empty(), "an old term's answer");
        c.on_message(0, WmMsg::Persisted { term: 5, w_p: 9 }, 40);
        let out = c.on_message(1, WmMsg::Persisted { term: 5, w_p: 12 }, 50);
        assert!(out.iter().all(|(_, m)| *m == WmMsg::RollBack { term: 5, w_g: 9 }), "{out:?}");
        let mut p = RecoveryPartition::new(0, 12, 4);
        assert_eq!(p.on_message(0, WmMsg::Report { term: 3 }).0, vec![], "older than its log's term");
        assert_eq!(p.on_message(0, WmMsg::Report { term: 5 }).0, vec![(0, WmMsg::Persisted { term: 5, w_p: 12 })]);
        assert!(!p.may_broadcast(), "frozen between its report and the rollback");
        assert_eq!(
            p.on_message(0, WmMsg::RollBack { term: 5, w_g: 9 }).1,
            PartitionAction::RollBack { term: 5, w_g: 9 }
        );
        p.rolled_back(5);
        assert!(p.may_broadcast());
        // Resends reach only the silent.
        let mut c = RecoveryCoordinator::new(vec![0, 1, 2], 0, 1_000);
        c.begin(0);
        c.on_message(1, WmMsg::Persisted { term: 1, w_p: 3 }, 10);
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
    }
}
