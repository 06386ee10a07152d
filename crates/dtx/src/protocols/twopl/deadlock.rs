//! DETECT's distributed deadlock detection: every conflicting lock request waits, so cycles of
//! waits can form across nodes; a detector gathers the wait-for graph and ends one wait per
//! cycle, its transaction chosen at random (the Detock thesis's CockroachDB-like baseline,
//! Sec. 4.5.4: "it breaks a deadlock by randomly aborting one of the transactions").
//!
//! Each node keeps a table of the lock requests waiting on it ([`WaitTable`], the node state of
//! 2PL): coordinators' local waits and participants' waits for remote transactions alike. From
//! a waiting request and its record's lock the edges follow: the waiter waits for the holders
//! and the requests queued ahead of it that it conflicts with ([`LockMeta::blockers`]).
//!
//! **Found as it forms.** A wait's edges only go away while it lasts, so a cycle closes at the
//! start of one of its waits. The node where that wait starts searches its own waits from it
//! ([`WaitTable::cycle_through`]) and breaks a cycle that lies on it alone at once, with the
//! same random choice. A wait that closes none may still close a cycle across nodes: the node
//! tells the detector ([`tell_detector`], a [`Request::Poke`], at most one until the detector
//! next asks it), which starts a round as soon as the one under way ends. So a cycle across
//! nodes stands about a round trip and a half, not `detect_us`: with a 10 ms interval and the
//! detector waking only on it, a deadlock stalled every transaction queued behind it for
//! milliseconds, more of them joined the graph meanwhile, cycles grew longer and victims more
//! numerous (the sweeps' contended list-append committed 4% of WAIT_DIE's, YCSB at θ 0.9 3%).
//!
//! **Where the detector runs, and why.** One detector, on node 0's first worker: a cycle that
//! spans nodes is seen by none of them alone, and one place that holds the union needs no
//! protocol among detectors to agree on a victim (two detectors seeing the same cycle would each
//! abort one). When told, or every `detect_us` otherwise, it asks every other node's first
//! worker for its waits (a request, so that the detector paces what it gathers: at most
//! [`MAX_ASKING`] requests in flight per node, and a far or slow node is not flooded by pushes it
//! cannot drain). Once every node answered, or after another interval at most, it reads node 0's
//! own table and builds the graph from each node's latest answer, its cycles found
//! ([`crate::protocols::graph`]), a victim picked from each at random from the worker's seeded
//! generator, and its waits ended on the nodes that reported them ([`Request::Kill`]); the
//! victim aborts as any 2PL abort does, releasing everything. A lost request or answer loses
//! that node's part of one round (its older answer is dropped when the request fails), so a
//! cycle is found a round or two later. When node 0 is down nothing across nodes is detected,
//! and `lock_wait_us` ends waits (`detect-timeout`), the safety net that also ends a wait a full
//! graph left out. A round that broke a cycle is followed at once by the next (deadlocks come in
//! storms under contention: the thesis suggests adapting the detection rate to the deadlock
//! rate).
//!
//! Answers gathered at different times can hold edges that are gone: under strict 2PL an edge
//! between live transactions lasts until one of them ends, so a stale cycle names a transaction
//! that already aborted, and ending a wait checks that the very wait (transaction and key) is
//! still there. A victim is left out of the answers gathered before its waits were ended (they
//! still name it), and taken back at once if none of its waits was left to end.
//!
//! Simplified relative to CockroachDB, whose detection is distributed: a waiter pushes the
//! transaction that blocks it, the push waits in a queue at that transaction's record, and the
//! queue finds a cycle by following the pushers' dependencies; no node gathers a whole graph.
//! Here one node gathers every wait, so its detector is one point of failure (the bound above
//! covers it) and its messages grow with the waits, not with the cycles.

use super::messages::{Reply, Request};
use super::{TwoPl, TwoPlWorker};
use crate::net::NodeId;
use crate::protocols::graph::Graph;
use crate::protocols::twopc::record_lock::{LockMeta, WaitSlot, DEADLOCK_VICTIM, DETECT_TIMEOUT};
use crate::protocols::twopc::skeleton::FromNode;
use crate::protocols::twopc::{NodeShared, TxnId, MAX_TABLE_ENTRIES};
use crate::protocols::{OptionKind, OptionSpec};
use crate::rt::CpuKind;
use crate::storage::{RowKey, Storage};
use parking_lot::Mutex;
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

/// How often the detector gathers the waits (`2pl-detect`).
pub const DETECT_OPTION: OptionSpec = OptionSpec {
    name: "detect_us",
    kind: OptionKind::U64 { min: 100, max: 10_000_000 },
    default: "10000",
    help: "how often node 0's detector gathers every node's waits and breaks the cycles it finds when no node told it of a new wait (a node that starts a wait closing no cycle of its own tells it at once)",
};

/// Whether `2pl-detect` detects deadlocks at all: off, no node searches its waits as one starts,
/// none tells the detector, and there is no detector; the wait table is still kept (an aborted
/// transaction's queued requests are ended through it). Off, only `lock_wait_us` ends a deadlock.
pub const DETECTION_OPTION: OptionSpec = OptionSpec {
    name: "detect",
    kind: OptionKind::Bool,
    default: "on",
    help: "off: no deadlock detection at all (no search at a wait, no detector): only lock_wait_us ends a deadlock (detect-timeout), to measure or test the bound alone",
};

/// `lock_wait_us` as DETECT reads it: a bound the detector should make unneeded.
pub const DETECT_LOCK_WAIT_OPTION: OptionSpec = OptionSpec {
    name: "lock_wait_us",
    kind: OptionKind::U64 { min: 1, max: 60_000_000 },
    default: "500000",
    help: "longest a transaction waits for a lock before it aborts (detect-timeout): the safety net for a deadlock the detector missed",
};

/// The abort reasons of `2pl-detect`.
pub const DETECT_ABORTS: &[(&str, &str)] = &[
    (DEADLOCK_VICTIM.name(), "the detector found the transaction's wait in a cycle and chose it, at random, as the victim"),
    (
        DETECT_TIMEOUT.name(),
        "a wait reached lock_wait_us before it was granted or chosen as a victim (a missed or late detection, or a long wait)",
    ),
];

/// Counters: cycles found (each broken by one victim), the sum of their lengths (their mean is
/// the sum over the count), those of them found on the node where they closed, at the wait that
/// closed them (`TwoPlWorker::break_cycle_at`), the sum of how long the detector's others had
/// stood when it broke them (from the newest of their waits' starts: the wait that closed the
/// cycle; its mean is the sum over `deadlocks-found` less `deadlocks-found-at-wait`), the
/// detector's rounds, victims whose waits had ended before the detector's message came (a stale
/// cycle, or a wait granted meanwhile), and waits or edges left out of an answer or of the
/// graph by the bounds below.
pub const DEADLOCKS_FOUND: &str = "deadlocks-found";
pub const CYCLE_LEN: &str = "deadlock-cycle-len";
pub const FOUND_AT_WAIT: &str = "deadlocks-found-at-wait";
pub const DEADLOCK_AGE_US: &str = "deadlock-age-us";
pub const ROUNDS: &str = "detector-rounds";
pub const VICTIMS_GONE: &str = "deadlock-victims-gone";
pub const EDGES_DROPPED: &str = "wait-edges-dropped";

/// The node whose first worker runs the detector.
pub const DETECTOR_NODE: NodeId = 0;
/// Most waits one node reports in one answer, and blockers in all its waits (a queue of n
/// conflicting requests is n(n-1)/2 edges; an answer stays far below a frame: 4,096 x 28 +
/// 65,536 x 8 bytes, about 640 KB).
pub const MAX_WAITS_PER_ANSWER: usize = 4096;
pub const MAX_BLOCKERS_PER_ANSWER: usize = 1 << 16;
/// Most transactions the search at a wait's start visits on its node; a cycle beyond that is
/// left to the detector.
pub const MAX_LOCAL_SEARCH: usize = 1024;
/// Most edges in the detector's graph.
pub const MAX_GRAPH_EDGES: usize = 1 << 16;
/// Most requests for waits in flight to one node.
pub const MAX_ASKING: usize = 4;
/// Victims remembered after they were chosen (the most recent ones).
const RECENT_VICTIMS: usize = 4096;

/// One waiting lock request, as a node reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    pub waiter: TxnId,
    pub key: RowKey,
    /// The transactions it waits for, in order.
    pub blockers: Vec<TxnId>,
    /// How long it had waited when the node reported it.
    pub waited_us: u64,
}

/// A node's waits: each transaction's wait for a key, with its slot and when it started.
type Waits = BTreeMap<(TxnId, RowKey), (Arc<WaitSlot>, u64)>;

/// The lock requests waiting on one node, shared by its workers (kept under DETECT only).
/// Bounded by the transactions in flight: a transaction waits for at most one lock at a time
/// on a node.
#[derive(Default)]
pub struct WaitTable {
    /// Each wait's slot and when it started (the node's clock, µs).
    waits: Mutex<Waits>,
    /// On a node other than the detector's: a wait started since the detector last asked for
    /// this node's waits, and the detector was told ([`Request::Poke`]).
    poke_sent: AtomicBool,
    /// On the detector's node: a wait that may close a cycle across nodes started since the
    /// detector's last round began, and the detector's waker.
    poked: AtomicBool,
    detector: Mutex<Option<Waker>>,
}

impl FromNode<TwoPl> for WaitTable {
    fn from_node(
        _cc: &TwoPl,
        _node: &NodeShared<LockMeta>,
        _recovered: &<TwoPl as crate::protocols::twopc::Cc>::Log,
    ) -> Self {
        WaitTable::default()
    }
}

/// A wait in the table while it lasts: dropping it takes the wait out.
pub struct Waiting<'t> {
    table: &'t WaitTable,
    id: (TxnId, RowKey),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.table.waits.lock().remove(&self.id);
    }
}

impl WaitTable {
    /// `txn` waits for `key`'s lock through `slot` from `now_us` until the returned guard is
    /// dropped.
    pub fn enter(&self, txn: TxnId, key: RowKey, slot: Arc<WaitSlot>, now_us: u64) -> Waiting<'_> {
        let mut waits = self.waits.lock();
        let before = waits.insert((txn, key), (slot, now_us));
        debug_assert!(before.is_none(), "txn {txn:x} waits twice for {key:?} on one node");
        debug_assert!(waits.len() <= MAX_TABLE_ENTRIES, "the wait table outgrew the transactions in flight");
        Waiting { table: self, id: (txn, key) }
    }

    pub fn len(&self) -> usize {
        self.waits.lock().len()
    }

    /// On a node other than the detector's: whether to tell the detector of a wait that just
    /// started (once until the detector next asks for this node's waits, which then hold it).
    pub fn should_poke(&self) -> bool {
        !self.poke_sent.swap(true, Ordering::AcqRel)
    }

    /// This node is being asked for its waits: a wait that starts from now on is news again.
    pub fn asked(&self) {
        self.poke_sent.store(false, Ordering::Release);
    }

    /// On the detector's node: a wait that may close a cycle across nodes started; the
    /// detector runs a round as soon as the one under way (if any) ends.
    pub fn poke(&self) {
        self.poked.store(true, Ordering::Release);
        if let Some(w) = self.detector.lock().take() {
            w.wake();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The waits on this node at `now_us` with what each waits for (at most
    /// [`MAX_WAITS_PER_ANSWER`] waits and [`MAX_BLOCKERS_PER_ANSWER`] blockers in all), and how
    /// many waits or edges were left out.
    pub fn snapshot(&self, store: &Storage<LockMeta>, now_us: u64) -> (Vec<Wait>, u64) {
        let (entries, mut dropped) = {
            let waits = self.waits.lock();
            let taken: Vec<_> = waits.iter().take(MAX_WAITS_PER_ANSWER).map(|(id, s)| (*id, s.clone())).collect();
            (taken, waits.len().saturating_sub(MAX_WAITS_PER_ANSWER) as u64)
        };
        // One record's mutex at a time, never under the table's.
        let mut out = Vec::with_capacity(entries.len());
        let mut room = MAX_BLOCKERS_PER_ANSWER;
        for ((waiter, key), (slot, since_us)) in entries {
            let Some(mut blockers) = self.blockers_of(store, key, &slot) else { continue };
            if blockers.len() > room {
                dropped += (blockers.len() - room) as u64;
                blockers.truncate(room);
            }
            room -= blockers.len();
            if !blockers.is_empty() {
                out.push(Wait { waiter, key, blockers, waited_us: now_us.saturating_sub(since_us) });
            }
        }
        (out, dropped)
    }

    /// What the wait of `slot` for `key` waits for, under the record's mutex alone.
    fn blockers_of(&self, store: &Storage<LockMeta>, key: RowKey, slot: &Arc<WaitSlot>) -> Option<Vec<TxnId>> {
        store.get(key)?.lock().meta.blockers(slot)
    }

    /// `txn`'s waits on this node.
    fn waits_of(&self, txn: TxnId) -> Vec<(RowKey, Arc<WaitSlot>)> {
        self.waits
            .lock()
            .range((txn, RowKey::new(0, 0))..)
            .take_while(|(id, _)| id.0 == txn)
            .map(|(id, s)| (id.1, s.0.clone()))
            .collect()
    }

    /// The cycle of waits on this node that runs through `txn`'s wait for `key`, if there is
    /// one: each transaction of it with the key it waits for there, the wait for `key` first;
    /// and how many transactions the search visited (at most [`MAX_LOCAL_SEARCH`]).
    ///
    /// A wait's edges only ever go away while it lasts (a request is never granted past one it
    /// conflicts with, and what it waits for can only leave), so a cycle closes at the start of
    /// one of its waits: searching from every wait as it starts finds every cycle whose waits
    /// are all on one node, the moment it forms, with no message. Cycles across nodes are the
    /// detector's.
    pub fn cycle_through(
        &self,
        store: &Storage<LockMeta>,
        txn: TxnId,
        key: RowKey,
    ) -> (Option<Vec<(TxnId, RowKey)>>, usize) {
        let Some(slot) = self.waits.lock().get(&(txn, key)).map(|s| s.0.clone()) else { return (None, 0) };
        let Some(first) = self.blockers_of(store, key, &slot) else { return (None, 0) };
        // A depth-first search over transactions; a frame is a transaction on the path with
        // what its waits here wait for (each blocker with the key of the wait), and the next
        // one to follow.
        let mut seen: rustc_hash::FxHashSet<TxnId> = Default::default();
        seen.insert(txn);
        type Frame = (TxnId, Vec<(TxnId, RowKey)>, usize);
        let mut path: Vec<Frame> = vec![(txn, first.into_iter().map(|b| (b, key)).collect(), 0)];
        while let Some((_, succ, next)) = path.last_mut() {
            let Some(&(b, _)) = succ.get(*next) else {
                path.pop();
                continue;
            };
            *next += 1;
            if b == txn {
                // Each transaction on the path with the wait through which it was left.
                let cycle = path.into_iter().map(|(t, succ, next)| (t, succ[next - 1].1)).collect();
                return (Some(cycle), seen.len());
            }
            if seen.len() >= MAX_LOCAL_SEARCH || !seen.insert(b) {
                continue;
            }
            // A transaction waits for one lock at a time on a node, but follow every wait.
            let mut succ = Vec::new();
            for (k, s) in self.waits_of(b) {
                succ.extend(self.blockers_of(store, k, &s).into_iter().flatten().map(|t| (t, k)));
            }
            path.push((b, succ, 0));
        }
        (None, seen.len())
    }

    /// End `txn`'s wait for `key` as a deadlock's victim; false if it no longer waits for it.
    pub fn kill(&self, store: &Storage<LockMeta>, txn: TxnId, key: RowKey) -> bool {
        let Some(slot) = self.waits.lock().get(&(txn, key)).map(|s| s.0.clone()) else { return false };
        store.get(key).is_some_and(|rec| rec.lock().meta.kill(&slot))
    }

    /// End every wait of `txn` here (it aborted: a request of it still queued would block
    /// others until its bound).
    pub fn end_waits_of(&self, store: &Storage<LockMeta>, txn: TxnId) {
        let keys: Vec<RowKey> = self
            .waits
            .lock()
            .range((txn, RowKey::new(0, 0))..)
            .take_while(|(id, _)| id.0 == txn)
            .map(|(id, _)| id.1)
            .collect();
        for key in keys {
            self.kill(store, txn, key);
        }
    }
}

/// The latest answers' waits by waiter: the node, how long the wait had stood, the wait.
type WaitsByWaiter<'a> = rustc_hash::FxHashMap<TxnId, Vec<(NodeId, u64, &'a Wait)>>;

/// Where `txn` waits, as the latest answers say: node and key.
fn waits_of(index: &WaitsByWaiter<'_>, txn: TxnId) -> Vec<(NodeId, RowKey)> {
    index.get(&txn).into_iter().flatten().map(|(n, _, w)| (*n, w.key)).collect()
}

/// How long `cycle` had stood, as the latest answers tell: since the newest of the waits that
/// make its edges started.
fn age_us(index: &WaitsByWaiter<'_>, cycle: &[TxnId]) -> u64 {
    let edge_age = |from: TxnId, to: TxnId| {
        let waits = index.get(&from).into_iter().flatten();
        waits.filter(|(_, _, w)| w.blockers.contains(&to)).map(|(_, waited_us, _)| *waited_us).max().unwrap_or(0)
    };
    (0..cycle.len()).map(|i| edge_age(cycle[i], cycle[(i + 1) % cycle.len()])).min().unwrap_or(0)
}

/// The detector's state, on node 0's first worker.
struct Detector {
    /// Each node's latest answer: the round it was asked in, when it came (the detector's clock,
    /// µs), and its waits.
    latest: Vec<Option<(u64, u64, Vec<Wait>)>>,
    /// Requests for waits in flight to each node.
    asking: Vec<usize>,
    /// Victims chosen lately, oldest first (answers gathered before their abort still name them).
    /// With each, the last round whose answers may have been gathered before its waits were
    /// ended (`u64::MAX` until the detector hears they were): its edges in those answers are
    /// left out, and a wait it starts later (a request that was on its way) counts again. Kept
    /// as a map beside the order of choice: every round looks up each edge's ends in it.
    victims: VecDeque<TxnId>,
    victim_until: rustc_hash::FxHashMap<TxnId, u64>,
    /// The round being gathered, the answers to it still awaited, and the detector's waker
    /// (woken when the last one lands, so that a round takes a round trip, not an interval).
    round: u64,
    missing: usize,
    waker: Option<Waker>,
}

impl Detector {
    fn new(nodes: u16) -> Self {
        Detector {
            latest: vec![None; nodes as usize],
            asking: vec![0; nodes as usize],
            victims: VecDeque::new(),
            victim_until: Default::default(),
            round: 0,
            missing: 0,
            waker: None,
        }
    }

    /// Take in node `n`'s answer to the request of `round` (an answer to an older request than
    /// the one kept is dropped; a failed request drops what the node said before).
    fn answered(&mut self, n: NodeId, round: u64, now_us: u64, waits: Option<Vec<Wait>>) {
        if round == self.round && n != DETECTOR_NODE {
            self.missing = self.missing.saturating_sub(1);
            if self.missing == 0 {
                if let Some(w) = self.waker.take() {
                    w.wake();
                }
            }
        }
        let newer = self.latest[n as usize].as_ref().is_none_or(|(r, _, _)| *r < round);
        if newer {
            self.latest[n as usize] = waits.map(|w| (round, now_us, w));
        }
    }

    /// The wait-for graph of the latest answers, recent victims left out of the answers that
    /// may predate their end, with the edges it refused.
    fn graph(&self) -> Graph<TxnId> {
        let mut g = Graph::bounded(MAX_GRAPH_EDGES);
        for (round, _, waits) in self.latest.iter().flatten() {
            let stale = |t: &TxnId| self.victim_until.get(t).is_some_and(|until| round <= until);
            for wait in waits.iter().filter(|w| !stale(&w.waiter)) {
                for b in wait.blockers.iter().filter(|b| !stale(b)) {
                    g.add_edge(wait.waiter, *b);
                }
            }
        }
        g
    }

    /// The latest answers' waits by waiter: each with the node that reported it and how long
    /// it had waited at `now_us`. Built once a round, so that finding a victim's waits and its
    /// cycle's age costs its own waits, not a scan of every answer.
    fn by_waiter(&self, now_us: u64) -> WaitsByWaiter<'_> {
        let mut index: WaitsByWaiter<'_> = Default::default();
        for (n, answer) in self.latest.iter().enumerate() {
            if let Some((_, at, waits)) = answer {
                for w in waits {
                    let waited_us = w.waited_us + now_us.saturating_sub(*at);
                    index.entry(w.waiter).or_default().push((n as NodeId, waited_us, w));
                }
            }
        }
        index
    }

    fn chose(&mut self, victim: TxnId) {
        if self.victim_until.insert(victim, u64::MAX).is_some() {
            return;
        }
        if self.victims.len() >= RECENT_VICTIMS {
            if let Some(oldest) = self.victims.pop_front() {
                self.victim_until.remove(&oldest);
            }
        }
        self.victims.push_back(victim);
        debug_assert_eq!(self.victims.len(), self.victim_until.len());
    }

    /// The victim's waits were ended: answers to the rounds asked from now on see it as it is.
    fn ended(&mut self, victim: TxnId) {
        let round = self.round;
        if let Some(until) = self.victim_until.get_mut(&victim) {
            *until = round;
        }
    }

    /// A victim none of whose waits was left to end (rare: a stale cycle, or a wait granted
    /// meanwhile), taken back into the graph.
    fn forget_victim(&mut self, victim: TxnId) {
        if self.victim_until.remove(&victim).is_some() {
            self.victims.retain(|v| *v != victim);
        }
    }
}

/// DETECT, as a wait survives the search of its own node ([`WaitTable::cycle_through`]): it
/// may close a cycle across nodes, so the detector should run a round soon. On the detector's
/// node that is a flag; elsewhere a [`Request::Poke`], at most one until the detector next asks
/// this node for its waits.
pub fn tell_detector(me: &TwoPlWorker) {
    if me.node.id == DETECTOR_NODE {
        me.state.poke();
    } else if me.state.should_poke() {
        let Some(me) = me.me.upgrade() else { return };
        let w = me.w.clone();
        w.spawn(async move {
            // Lost with a fault: the detector's next round (at most `detect_us` away) covers it.
            let _ = me.ask(DETECTOR_NODE, &Request::Poke).await;
        });
    }
}

/// Start the detector on node 0's first worker under DETECT (see the module's header).
pub fn spawn_detector(me: &Rc<TwoPlWorker>) {
    if !me.cc.detects() || me.node.id != DETECTOR_NODE || me.w.addr.worker != 0 {
        return;
    }
    let det = Rc::new(RefCell::new(Detector::new(me.node.topo.nodes)));
    let weak = Rc::downgrade(me);
    let period_us = me.cc.detect_us.max(1);
    let w = me.w.clone();
    w.spawn(async move {
        let mut round = 0;
        let mut found = false;
        let mut started_us = 0;
        loop {
            let Some(w) = weak.upgrade().map(|m| m.w.clone()) else { return };
            // Rounds start an interval apart (at once when a round took longer). After a round
            // that broke a cycle the next starts at once: where deadlocks come one after
            // another, rounds follow each other a round trip apart.
            let since_us = w.now_us().saturating_sub(started_us);
            let pause_us = if found { 1 } else { period_us.saturating_sub(since_us).max(1) };
            let mut pause = w.sleep_us(pause_us);
            let Some(table) = weak.upgrade().map(|m| m.state.clone()) else { return };
            // ... or as soon as a wait that may close a cycle across nodes started.
            std::future::poll_fn(|cx| {
                *table.detector.lock() = Some(cx.waker().clone());
                if table.poked.swap(false, Ordering::AcqRel) || Pin::new(&mut pause).poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                Poll::Pending
            })
            .await;
            table.detector.lock().take();
            drop(table);
            let Some(me) = weak.upgrade() else { return };
            started_us = me.w.now_us();
            round += 1;
            me.w.count(ROUNDS, 1);
            gather(&me, &det, round);
            // Until every node answered this round, or an interval passed (a lost request or a
            // far node: the latest older answer stands in).
            let mut deadline = me.w.sleep_us(period_us);
            std::future::poll_fn(|cx| {
                let mut d = det.borrow_mut();
                if d.missing == 0 || Pin::new(&mut deadline).poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                d.waker = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
            det.borrow_mut().waker = None;
            // This node's waits as they are now.
            let (here, dropped) = me.state.snapshot(&me.node.store, me.w.now_us());
            charge_snapshot(&me.w, &here);
            me.w.count(EDGES_DROPPED, dropped);
            let now_us = me.w.now_us();
            det.borrow_mut().latest[me.node.id as usize] = Some((round, now_us, here));
            let broken = {
                let mut g = det.borrow().graph();
                let mut rng = me.w.rng.borrow_mut();
                let broken = g.break_cycles(|cycle| cycle[rng.gen_range(0..cycle.len())]);
                me.w.count(EDGES_DROPPED, g.refused() as u64);
                me.w.charge(CpuKind::Graph, me.w.cost.graph_step_ns * g.steps() as u64);
                broken
            };
            found = !broken.is_empty();
            let victims: Vec<(TxnId, Vec<(NodeId, RowKey)>)> = {
                let d = det.borrow();
                let index = d.by_waiter(now_us);
                // The index's making, and each victim's waits and cycle looked up in it.
                let answered: usize = index.values().map(Vec::len).sum();
                me.w.charge(CpuKind::Graph, me.w.cost.graph_step_ns * answered as u64);
                let mut victims = Vec::with_capacity(broken.len());
                for (victim, cycle) in broken {
                    me.w.charge(CpuKind::Graph, me.w.cost.graph_step_ns * (cycle.len() + 1) as u64);
                    me.w.count(DEADLOCKS_FOUND, 1);
                    me.w.count(CYCLE_LEN, cycle.len() as u64);
                    me.w.count(DEADLOCK_AGE_US, age_us(&index, &cycle));
                    victims.push((victim, waits_of(&index, victim)));
                }
                victims
            };
            for (victim, waits) in victims {
                end_victim(&me, &det, victim, waits);
            }
        }
    });
}

/// What taking a node's waits costs: a record's lock for each wait, and a step for each of its
/// blockers.
pub fn charge_snapshot(w: &crate::rt::Worker, waits: &[Wait]) {
    w.charge_ops(waits.len());
    let blockers: usize = waits.iter().map(|wt| wt.blockers.len()).sum();
    w.charge(CpuKind::Graph, w.cost.graph_step_ns * blockers as u64);
}

/// Ask every other node for its waits (the answers land later), at most [`MAX_ASKING`]
/// requests in flight to each.
fn gather(me: &Rc<TwoPlWorker>, det: &Rc<RefCell<Detector>>, round: u64) {
    {
        let mut d = det.borrow_mut();
        d.round = round;
        d.missing = 0;
    }
    for n in (0..me.node.topo.nodes).filter(|n| *n != me.node.id) {
        {
            let mut d = det.borrow_mut();
            if d.asking[n as usize] >= MAX_ASKING {
                continue;
            }
            d.asking[n as usize] += 1;
            d.missing += 1;
        }
        let (me2, det) = (me.clone(), det.clone());
        me.w.spawn(async move {
            let answer = match me2.ask(n, &Request::Waits).await {
                Ok(Reply::Waits(waits)) => Some(waits),
                _ => None,
            };
            let mut d = det.borrow_mut();
            d.asking[n as usize] -= 1;
            d.answered(n, round, me2.w.now_us(), answer);
        });
    }
}

/// End every wait of `victim` the latest answers name (`waits`); if none was left to end, take
/// it back into the graph.
fn end_victim(me: &Rc<TwoPlWorker>, det: &Rc<RefCell<Detector>>, victim: TxnId, waits: Vec<(NodeId, RowKey)>) {
    det.borrow_mut().chose(victim);
    let (me2, det) = (me.clone(), det.clone());
    me.w.spawn(async move {
        let mut ended = false;
        let mut remote = Vec::new();
        for (n, key) in waits {
            if n == me2.node.id {
                ended |= me2.state.kill(&me2.node.store, victim, key);
            } else {
                remote.push((n, Request::Kill { txn: victim, key }));
            }
        }
        for reply in me2.ask_all(remote).await {
            ended |= matches!(reply, Ok(Reply::Killed(true)));
        }
        if ended {
            det.borrow_mut().ended(victim);
        } else {
            me2.w.count(VICTIMS_GONE, 1);
            det.borrow_mut().forget_victim(victim);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(waiter: TxnId, blockers: &[TxnId]) -> Wait {
        Wait { waiter, key: RowKey::new(0, waiter), blockers: blockers.to_vec(), waited_us: 0 }
    }

    #[test]
    fn the_graph_joins_every_nodes_latest_answer_and_leaves_out_recent_victims() {
        let mut d = Detector::new(3);
        d.answered(0, 1, 0, Some(vec![wait(1, &[2])]));
        d.answered(1, 1, 0, Some(vec![wait(2, &[3])]));
        d.answered(2, 1, 0, Some(vec![wait(3, &[1])]));
        assert_eq!(d.graph().cycles(), vec![vec![1, 2, 3]], "a cycle across three nodes");
        // An older answer does not replace a newer one; a failed request drops the node's.
        d.answered(2, 2, 0, Some(vec![]));
        d.answered(2, 1, 0, Some(vec![wait(3, &[1])]));
        assert!(d.graph().cycles().is_empty());
        d.answered(2, 3, 0, Some(vec![wait(3, &[1])]));
        d.chose(2);
        assert!(d.graph().cycles().is_empty(), "a victim's edges are left out");
        assert_eq!(waits_of(&d.by_waiter(0), 2), vec![(1, RowKey::new(0, 2))]);
        // Its waits ended during round 3: answers to round 3 still leave it out, later ones not.
        d.round = 3;
        d.ended(2);
        assert!(d.graph().cycles().is_empty());
        d.answered(0, 4, 0, Some(vec![wait(1, &[2])]));
        d.answered(1, 4, 0, Some(vec![wait(2, &[3])]));
        assert_eq!(d.graph().cycles().len(), 1, "a wait it starts after its end counts");
        d.answered(1, 5, 0, Some(vec![]));
        d.forget_victim(2);
        d.answered(1, 6, 0, Some(vec![wait(2, &[3])]));
        assert_eq!(d.graph().cycles().len(), 1);
        d.answered(1, 7, 0, None);
        assert!(d.graph().cycles().is_empty());
    }

    /// A node's storage holding keys 1 to 4 of table 0, unlocked.
    fn store() -> Storage<LockMeta> {
        use crate::storage::{Layout, TableDef, Value};
        let def = TableDef { name: "t", ordered: true, expected_rows: 4, dense: Vec::new(), layout: Layout::Tree };
        let store = Storage::new(&[def]);
        for n in 1..=4 {
            store.load(k(n), Value::copy_from(b"v"));
        }
        store
    }

    fn k(n: u64) -> RowKey {
        RowKey::new(0, n)
    }

    /// `txn` asks for `key` exclusively under DETECT: `None` if granted, else its queued slot.
    fn lock(store: &Storage<LockMeta>, txn: TxnId, key: RowKey) -> Option<Arc<WaitSlot>> {
        use crate::protocols::twopc::record_lock::{Acquire, Mode, Policy, Prio};
        match store.get(key).expect("loaded").lock().meta.acquire(txn, Prio(txn, txn), Mode::Exclusive, Policy::Detect)
        {
            Acquire::Granted => None,
            Acquire::Wait(slot) => Some(slot),
            Acquire::Abort(a) => panic!("DETECT never aborts a request: {a:?}"),
        }
    }

    #[test]
    fn the_search_at_a_wait_finds_the_local_cycle_it_closes_and_none_in_acyclic_waits() {
        let (s, table) = (store(), WaitTable::default());
        for t in 1..=3 {
            assert!(lock(&s, t, k(t)).is_none(), "txn {t} holds key {t}");
        }
        // 1 waits for 2, 2 for 3, and 4 for 1 and 2 (behind 1 on key 2): a chain and a fork,
        // no cycle.
        let slot = lock(&s, 1, k(2)).expect("2 holds it");
        let _w12 = table.enter(1, k(2), slot, 0);
        assert_eq!(table.cycle_through(&s, 1, k(2)), (None, 2), "1 -> 2, and 2 waits for nothing");
        let slot = lock(&s, 2, k(3)).expect("3 holds it");
        let _w23 = table.enter(2, k(3), slot, 0);
        assert_eq!(table.cycle_through(&s, 2, k(3)), (None, 2), "2 -> 3, and 3 waits for nothing");
        let slot = lock(&s, 4, k(2)).expect("2 holds it and 1 is queued");
        let _w42 = table.enter(4, k(2), slot, 0);
        assert_eq!(table.cycle_through(&s, 4, k(2)), (None, 4), "4 -> {{1, 2}} -> 3: acyclic");
        assert_eq!(table.cycle_through(&s, 1, k(2)).0, None, "an earlier wait still closes nothing");
        // 3 waits for 1: the wait that closes 3 -> 1 -> 2 -> 3, found from it, each transaction
        // with the key it waits for, the closing wait first.
        let slot = lock(&s, 3, k(1)).expect("1 holds it");
        let _w31 = table.enter(3, k(1), slot, 0);
        let (cycle, visited) = table.cycle_through(&s, 3, k(1));
        assert_eq!(cycle, Some(vec![(3, k(1)), (1, k(2)), (2, k(3))]));
        assert_eq!(visited, 3, "4 is not on any path from 3");
        // Ending a wait of the cycle ends it; the fork that remains is acyclic again.
        assert!(table.kill(&s, 1, k(2)));
        assert_eq!(table.cycle_through(&s, 3, k(1)).0, None);
        assert_eq!(table.cycle_through(&s, 1, k(2)), (None, 0), "1's wait was ended");
        // A wait the table does not list has no cycle to find.
        assert_eq!(table.cycle_through(&s, 4, k(3)), (None, 0));
    }
}
