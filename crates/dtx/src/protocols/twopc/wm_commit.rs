//! Primo's watermark group commit (`commit=wm`, Primo §5.1; digest 004, 3.11): a commit is
//! acknowledged once every partition has persisted every transaction below its timestamp, with
//! no barrier between partitions.
//!
//! Every node is a partition, and one [`WatermarkGate`] per node keeps its side:
//! - **Active transactions.** A transaction is active on a node from its first lock there (a
//!   participant: [`WatermarkGate::enter`], with a lower bound `l_ts` on its timestamp), or from
//!   the moment its coordinator fixes its timestamp ([`WatermarkGate::commit_ts`]), until its
//!   record is appended to the node's log ([`WatermarkGate::leave`]).
//! - **The partition watermark W_p.** Every `wm_us` the node's worker 0 sets W_p to the smallest
//!   timestamp (or `l_ts`) of its active transactions (RULE 1), appends it to the log, and once
//!   that record is durable, broadcasts it. Everything below W_p was appended before the W_p
//!   record, so it is durable once W_p's record is (invariant (c): persisted before broadcast).
//!   An idle node moves W_p past every timestamp it has logged, and by Δ towards the average of
//!   the others when it lags (the force-update), so that an idle partition never stalls the rest
//!   (the paper's Claim 5 assumes a W_p that grows; RULE 1 alone does not say how an idle one
//!   does: digest 3.11).
//! - **R2.** Every transaction that becomes active after a W_p was generated gets a timestamp
//!   past it: a coordinator's is raised past the node's floor (`W_p + Δ`), and a participant
//!   raises the records a transaction locks there to the floor + 1 before it reads their lease
//!   (the caller's part: [`WatermarkGate::enter`] returns the bound).
//! - **The global watermark W_g** is the minimum of the latest W_p heard from every node; a
//!   commit at `ts < W_g` is acknowledged ([`WatermarkGate::acks`], points are timestamps).
//!
//! What this does not do yet: recover. A crash would need every partition to roll back what
//! lies at or above one agreed W_g ([`crate::replication::wm_recovery`] holds the agreement);
//! until that is wired in, a protocol under `commit=wm` refuses to run with crashes
//! ([`crate::protocols::Protocol::check_faults`]).
//!
//! The gate is one mutex per node, taken when a transaction enters and leaves, and at each
//! generation: generation must see every transaction that entered before it.

use super::epoch_commit::GateHost;
use super::TxnId;
use crate::net::{Addr, NodeId};
use crate::protocols::{OptionKind, OptionSpec};
use crate::replication::watermark::PartitionWatermarks;
use crate::rt::log_warn;
use crate::rt::release::ReleasePoints;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

/// The watermark interval `t_m` under `commit=wm` (Primo's evaluation: 20 ms, the same as
/// COCO's epoch).
pub const WM_OPTION: OptionSpec = OptionSpec {
    name: "wm_us",
    kind: OptionKind::U64 { min: 100, max: 10_000_000 },
    default: "20000",
    help: "with commit=wm: how often each partition publishes its watermark",
};

/// Where new transactions' timestamps start (`wm_floor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// Past W_p (+ Δ): the paper's R2 as written. Under load W_p then grows by about one per
    /// interval (the smallest `l_ts` of the active transactions is a cold record raised to
    /// W_p + 1), while timestamps on hot records grow by their chains of writes: acknowledgements
    /// fall further behind as the run goes on.
    Watermark,
    /// Also past every timestamp this partition had fixed or installed when W_p was last
    /// generated (a Lamport clock sampled once per interval): R2 allows any floor past W_p, and
    /// this one lets W_p keep up with the timestamps, so that a commit is acknowledged within
    /// about two intervals. dtx's default.
    Clock,
}

/// The floor option of a protocol under `commit=wm`.
pub const FLOOR_OPTION: OptionSpec = OptionSpec {
    name: "wm_floor",
    kind: OptionKind::Choice(&["clock", "watermark"]),
    default: "clock",
    help: "with commit=wm: new timestamps start past W_p (watermark, the paper's R2) or also past the partition's clock at the last W_p (clock)",
};

/// The most transactions active on one node at once: every one is some coordinator's
/// transaction in flight (`--inflight` is at most 100,000 per worker); more means a leak.
const MAX_ACTIVE: usize = 1 << 22;

/// What gates send each other: a partition's watermark, once it is persisted. One-way, and
/// periodic: a lost one is made up for by the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WmGateMsg {
    Mark { w_p: u64 },
}

/// One node's side of watermark group commit (see the module comment).
pub struct WatermarkGate {
    node: NodeId,
    nodes: u16,
    interval_us: u64,
    state: Mutex<WmState>,
    acks: Arc<ReleasePoints>,
}

struct WmState {
    marks: PartitionWatermarks,
    /// The active transactions, by their timestamp (or its lower bound) and id.
    active: BTreeSet<(u64, TxnId)>,
    /// Each active transaction's key in `active`.
    bound_of: FxHashMap<TxnId, u64>,
    /// The largest timestamp of a record this node has appended.
    max_logged_ts: u64,
    /// The largest timestamp this node has fixed or installed.
    clock: u64,
    /// `clock` when W_p was last generated, under [`Floor::Clock`] (0 otherwise).
    clock_floor: u64,
    floor: Floor,
}

impl WmState {
    fn insert(&mut self, txn: TxnId, bound: u64) {
        if let Some(old) = self.bound_of.insert(txn, bound) {
            self.active.remove(&(old, txn));
        }
        self.active.insert((bound, txn));
        assert!(self.active.len() <= MAX_ACTIVE, "more active transactions than can be in flight");
    }

    /// New transactions get timestamps past this (R2).
    fn ts_floor(&self) -> u64 {
        self.marks.ts_floor().max(self.clock_floor)
    }

    /// RULE 1, kept monotone, and past everything logged when idle.
    fn generate(&mut self) -> u64 {
        if self.floor == Floor::Clock {
            self.clock_floor = self.clock;
        }
        match self.active.first() {
            Some(&(bound, _)) => self.marks.generate(Some(bound)),
            None => {
                let w = self.marks.generate(None);
                match w <= self.max_logged_ts {
                    true => self.marks.generate(Some(self.max_logged_ts + 1)),
                    false => w,
                }
            }
        }
    }
}

impl WatermarkGate {
    pub fn new(node: NodeId, nodes: u16, interval_us: u64, floor: Floor) -> WatermarkGate {
        assert!(interval_us > 0, "a watermark interval of 0");
        let marks = PartitionWatermarks::new(nodes as usize, node as usize).expect("a node of the cluster");
        let state = WmState {
            marks,
            active: BTreeSet::new(),
            bound_of: FxHashMap::default(),
            max_logged_ts: 0,
            clock: 0,
            clock_floor: 0,
            floor,
        };
        WatermarkGate { node, nodes, interval_us, state: Mutex::new(state), acks: ReleasePoints::new() }
    }

    /// Where clients wait: a commit at `ts` is released once `ts < W_g`.
    pub fn acks(&self) -> Arc<ReleasePoints> {
        self.acks.clone()
    }

    /// A transaction becomes active here as a participant, with every timestamp it may take at
    /// least `lower`: returns the bound it is held at (at least the floor + 1, R2), to which the
    /// caller raises the records it locks for it. A transaction already active keeps its bound.
    pub fn enter(&self, txn: TxnId, lower: u64) -> u64 {
        let mut st = self.state.lock();
        let bound = lower.max(st.ts_floor() + 1);
        if let Some(&held) = st.bound_of.get(&txn) {
            return held.max(bound);
        }
        st.insert(txn, bound);
        bound
    }

    /// The coordinator fixes `txn`'s timestamp: at least `candidate`, past the floor (R2, with
    /// the force-update). The transaction is active here until [`WatermarkGate::leave`].
    pub fn commit_ts(&self, txn: TxnId, candidate: u64) -> u64 {
        let mut st = self.state.lock();
        let ts = candidate.max(st.ts_floor() + 1);
        st.clock = st.clock.max(ts);
        if let Some(&held) = st.bound_of.get(&txn) {
            assert!(held <= ts, "a timestamp {ts} below the bound {held} its transaction was held at");
        }
        st.insert(txn, ts);
        ts
    }

    /// `txn` is done here: its record, at `logged_ts` if it appended one, is in the log.
    pub fn leave(&self, txn: TxnId, logged_ts: Option<u64>) {
        let mut st = self.state.lock();
        if let Some(bound) = st.bound_of.remove(&txn) {
            st.active.remove(&(bound, txn));
        }
        if let Some(ts) = logged_ts {
            st.max_logged_ts = st.max_logged_ts.max(ts);
            st.clock = st.clock.max(ts);
        }
    }

    /// New transactions here get timestamps past this.
    pub fn floor(&self) -> u64 {
        self.state.lock().ts_floor()
    }

    /// This node's view of W_g.
    pub fn global(&self) -> u64 {
        self.state.lock().marks.global()
    }

    /// Worker 0 of every node generates, persists and broadcasts the node's W_p every interval.
    pub fn start<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let w = host.worker().clone();
        if w.addr.worker != 0 {
            return;
        }
        let (gate, host) = (self.clone(), host.clone());
        w.clone().spawn(async move {
            loop {
                w.sleep_us(gate.interval_us).await;
                let w_p = gate.state.lock().generate();
                match host.gate_log().append_watermark(w_p) {
                    Ok(lsn) => host.gate_log().durable(lsn).await,
                    // Not persisted: not broadcast either (the next interval tries again).
                    Err(_) => continue,
                }
                gate.persisted(&host, w_p);
            }
        });
    }

    /// Own W_p is durable: count it, and tell every other node.
    fn persisted<H: GateHost>(&self, host: &Rc<H>, w_p: u64) {
        let body = super::skeleton::wm_message(&WmGateMsg::Mark { w_p });
        for n in (0..self.nodes).filter(|&n| n != self.node) {
            host.worker().send(Addr::new(n, 0), &body);
        }
        self.heard(self.node, w_p);
    }

    /// A gate message from another node (its worker 0).
    pub fn on_message<H: GateHost>(&self, _host: &Rc<H>, from: Addr, body: &[u8]) {
        match crate::net::decode::<WmGateMsg>(body) {
            Ok(WmGateMsg::Mark { w_p }) => self.heard(from.node, w_p),
            Err(e) => log_warn(&format!("node {}: an undecodable watermark message from {from}: {e}", self.node)),
        }
    }

    /// Partition `from`'s latest W_p: release every commit below the new W_g.
    fn heard(&self, from: NodeId, w_p: u64) {
        let global = {
            let mut st = self.state.lock();
            st.marks.update(from as usize, w_p);
            st.marks.global()
        };
        if global > 0 {
            self.acks.release_through(global - 1);
        }
    }

    /// How many transactions are active here (tests).
    pub fn active(&self) -> usize {
        self.state.lock().active.len()
    }
}
