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
//! **Recovery (§5.2).** A node that restarts (or whose logs fail over to another host) rebuilt
//! from its log everything it committed; what lies at or above its last logged view of W_g it
//! applied with the values it replaced kept ([`WmLog`]), since no agreement rolls back
//! below a view. It serves nothing and asks node 0 for an agreement
//! ([`crate::replication::wm_recovery`]; the paper's ZooKeeper is node 0, whose terms are
//! logged). Every partition reports its latest *persisted* W_p and stops broadcasting; node 0
//! takes their minimum (the digest's safe reading: the paper's "maximum" would keep half a
//! transaction, a test there shows it), and every partition logs `(term, W_g)`, then puts back
//! what every install at or above W_g replaced, newest first, and reports those commits to their
//! clients as rolled back. Every install keeps the value it replaced while its timestamp is at or
//! above the node's view of W_g. A transaction that ran across an agreement aborts: its
//! coordinator checks the term when it fixes the timestamp, and a partition refuses a request
//! or an install made in another term. Acknowledgement points are `(term, ts)`, so that the
//! commits of a new term never fall in a range rolled back in an older one. Node 0 also starts
//! an agreement when a partition has sent it nothing for a while (a cut, a stop): what starts
//! one, and why it waits for the silent partition, is in [`crate::replication::wm_recovery`].
//! A node whose log refuses a write it must install stops ([`WatermarkGate::fail_stop`]).
//!
//! The gate is one mutex per node, taken when a transaction enters and leaves, and at each
//! generation: generation must see every transaction that entered before it.

use super::{CommitPolicy, Gate, GateHost, GateNode, Policy};
use crate::net::{Addr, NodeId};
use crate::protocols::twopc::durable::{CcLog, CoreReplay, InDoubt, LogRecord, PolicyLog, Record, TxnLog, Writes};
use crate::protocols::twopc::wire::{framed, TAG_WM};
use crate::protocols::twopc::TxnId;
use crate::protocols::{OptionKind, OptionSpec};
use crate::replication::watermark::PartitionWatermarks;
use crate::replication::wm_recovery::{
    Decision, Heartbeats, PartitionAction, RecoveryCoordinator, RecoveryPartition, WmMsg,
};
use crate::rt::log_warn;
use crate::rt::release::ReleasePoints;
use crate::rt::release::{AckSource, Release};
use crate::rt::Worker;
use crate::storage::{RowKey, Value};
use crate::txn::Abort;
use crate::txn::{TxnOutput, TxnResult};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::{BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
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
    /// Also past every timestamp this partition had fixed or installed when its clock was last
    /// sampled (a Lamport clock, `CLOCK_SAMPLES` times an interval): R2 allows any floor past
    /// W_p, and this one lets W_p keep up with the timestamps. dtx's default.
    Clock,
    /// Also past this node's clock time in µs (the partition's clock as under `Clock`, and
    /// [`time_floor_us`] when sampled): every partition's timestamps then advance together at
    /// the rate of time, far faster than a chain of writes on one record, so a partition whose
    /// own load is light does not hold W_g back, and W_g passes a commit at the first watermarks
    /// generated after it.
    Time,
}

/// Microseconds from 2026-01-01 (UTC) to the Unix epoch's start, subtracted from a real clock's
/// reading so that a time floor fits [`TS_BITS`]; the simulator's clock starts at 0.
const TIME_BASE_US: u64 = 1_767_225_600_000_000;

/// The time floor of a node: its wall clock in µs (virtual in the simulator, the system's from
/// 2026 otherwise).
pub fn time_floor_us(wall_us: u64) -> u64 {
    wall_us.checked_sub(TIME_BASE_US).unwrap_or(wall_us)
}

/// The registry entries that commit by watermark, for the error a user sees when asking
/// another for `commit=wm`: Primo, where it is the default, and the concurrency controls over
/// the skeleton that fix a logical commit timestamp before they validate
/// ([`crate::protocols::twopc::wm_worker`]).
pub const ACCEPTED_BY: &str = "primo, tictoc, sundial";

/// The commit policy of a concurrency control over the skeleton that has a logical commit
/// timestamp: any of the three.
pub const COMMIT_OPTION: OptionSpec = OptionSpec {
    name: "commit",
    kind: OptionKind::Choice(&["2pc", "epoch", "wm"]),
    default: "2pc",
    help: "2pc: each vote and decision is durable before it counts; epoch: COCO's epoch group commit; wm: Primo's watermark group commit",
};

/// The floor option of a protocol under `commit=wm`.
pub const FLOOR_OPTION: OptionSpec = OptionSpec {
    name: "wm_floor",
    kind: OptionKind::Choice(&["clock", "watermark", "time"]),
    default: "clock",
    help: "with commit=wm: new timestamps start past W_p (watermark, the paper's R2), also past the partition's clock at the last W_p (clock), or also past the node's clock time in µs (time)",
};

/// The most transactions active on one node at once: every one is some coordinator's
/// transaction in flight (`--inflight` is at most 100,000 per worker); more means a leak.
const MAX_ACTIVE: usize = 1 << 22;

/// What gates send each other, one-way: a partition's watermark once it is persisted (periodic: a
/// lost one is made up for by the next), a restarted node's call for an agreement (resent until it
/// has rolled back), and the agreement's own messages (resent by node 0 until answered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WmGateMsg {
    /// A partition's persisted W_p, generated in agreement term `term`.
    Mark {
        w_p: u64,
        term: u64,
    },
    /// A restarted node whose last agreement was `after` asks for a new one.
    Recover {
        after: u64,
    },
    Agreement(WmMsg),
}

/// Timestamps stay below 2^48 (a million commits a second for eight years of one chain of
/// writes; under [`Floor::Time`], microseconds from 2026 until late 2034), and agreement terms
/// below 2^16: an acknowledgement point is `term << 48 | ts`.
const TS_BITS: u32 = 48;

/// The acknowledgement point of a commit at `ts` in agreement term `term`.
pub fn point(term: u64, ts: u64) -> u64 {
    assert!(ts < 1 << TS_BITS, "a logical timestamp {ts} past 2^48");
    assert!(term < 1 << (u64::BITS - TS_BITS), "agreement term {term} past 2^16");
    (term << TS_BITS) | ts
}

/// What one node keeps to roll back before it refuses new commits (`wm-undo-full`) until the
/// global watermark moves: values and their bytes. It is what installs while the node's view of
/// W_g trails, a few intervals' worth, unless a partition stops answering for long. Installs of
/// commits already decided cannot refuse, so the map overshoots by what is in flight, far below
/// `MAX_UNDO`, which is asserted.
const UNDO_FULL_VALUES: usize = 1 << 20;
const UNDO_FULL_BYTES: usize = 256 << 20;
const MAX_UNDO: usize = 1 << 22;

/// The bytes a kept value is charged beyond its own: its entry.
const UNDO_ENTRY_BYTES: usize = 64;

/// How many times an interval the clock floor is sampled ([`Floor::Clock`]). A commit is
/// acknowledged at the first generation of W_p after every transaction that may take a smaller
/// timestamp has left; those that start after the next sample start past it. Sampled once an
/// interval (at generation) a commit waited about two intervals; sampled more often, about one.
/// (Tried in session 22 and reverted when crash sweeps failed; those failures were the missed
/// agreement fixed in session 24, which the faster timing reached.)
const CLOCK_SAMPLES: u64 = 8;

/// How often a restarting node calls for an agreement, and node 0 resends its messages (and
/// looks for a silent partition).
const RECOVERY_RESEND_US: u64 = 20_000;

/// Node 0 suspects a partition none of whose gate messages reached it for this many watermark
/// intervals, and at least [`SUSPECT_MIN_US`]: a live partition sends its W_p every interval,
/// so only a cut, a stop or a crash silences it for that long (a slow one, or a pause, too;
/// the agreement that follows is then merely unneeded, never unsafe).
const SUSPECT_INTERVALS: u64 = 10;
const SUSPECT_MIN_US: u64 = 100_000;

/// While a rollback waits for the commits in progress to append their records, it looks this
/// often (they append without waiting for anything).
const DRAIN_POLL_US: u64 = 50;

/// The node that coordinates recovery agreements.
const COORDINATOR: NodeId = 0;

/// What installs at or above the view of W_g replaced, in the order they were kept, with the
/// bytes it holds. The watermark forgets from the front while the oldest lies below W_g, so one
/// that lies above holds back the few kept after it with smaller timestamps until the next W_g.
/// A rollback sorts what lies at or above its W_g by timestamp and puts values back newest
/// first: on one key the installs' timestamps grow, though two workers may keep theirs in the
/// other order (an install releases its lock before it keeps what it replaced). (A map ordered
/// by timestamp cost a tree insert per value and a cold walk per interval: 5-9% of a one-node
/// Primo run.)
#[derive(Default)]
struct Undo {
    kept: VecDeque<Kept>,
    bytes: usize,
}

/// A value an install at `ts` replaced in `key`.
struct Kept {
    ts: u64,
    key: RowKey,
    value: Option<Value>,
}

impl Undo {
    fn charge(value: &Option<Value>) -> usize {
        UNDO_ENTRY_BYTES + value.as_ref().map_or(0, |v| v.len())
    }

    fn full(&self) -> bool {
        self.kept.len() >= UNDO_FULL_VALUES || self.bytes >= UNDO_FULL_BYTES
    }

    fn push(&mut self, ts: u64, key: RowKey, value: Option<Value>) {
        self.bytes += Self::charge(&value);
        self.kept.push_back(Kept { ts, key, value });
    }

    /// Take out everything (a rollback to `w_g`'s): what to put back, newest first (what lies
    /// below `w_g` stays as it is).
    fn roll_back_to(&mut self, w_g: u64) -> Vec<(RowKey, Option<Value>)> {
        self.bytes = 0;
        let mut undone: Vec<Kept> = std::mem::take(&mut self.kept).into_iter().filter(|k| k.ts >= w_g).collect();
        undone.sort_by_key(|k| std::cmp::Reverse(k.ts));
        undone.into_iter().map(|k| (k.key, k.value)).collect()
    }

    /// Take out the values kept from the front while they lie below `ts` (no agreement can roll
    /// them back any more).
    fn forget_below(&mut self, ts: u64) -> Vec<Option<Value>> {
        let n = self.kept.iter().take_while(|k| k.ts < ts).count();
        let gone: Vec<Option<Value>> = self.kept.drain(..n).map(|k| k.value).collect();
        self.bytes -= gone.iter().map(Self::charge).sum::<usize>();
        gone
    }
}

/// One node's side of watermark group commit (see the module comment).
pub struct WatermarkGate {
    node: NodeId,
    nodes: u16,
    interval_us: u64,
    state: Mutex<WmState>,
    undo: Mutex<Undo>,
    /// The undo is over its budget: new commits are refused until the watermark moves.
    undo_full: std::sync::atomic::AtomicBool,
    /// An agreement may roll this node back while it runs ([`WatermarkGate::never_rolls_back`]).
    keeps_undo: bool,
    /// The node's view of W_g, as an install reads it to decide whether to keep what it
    /// replaced (without the state's lock); it lags the state's by at most one `heard`.
    global_view: std::sync::atomic::AtomicU64,
    acks: Arc<ReleasePoints>,
}

struct WmState {
    marks: PartitionWatermarks,
    /// The active transactions, by their timestamp (or its lower bound) and id.
    active: BTreeSet<(u64, TxnId)>,
    /// Each active transaction's key in `active`, and the term it became active in.
    bound_of: FxHashMap<TxnId, (u64, u64)>,
    /// The largest timestamp of a record this node has appended.
    max_logged_ts: u64,
    /// The largest point a commit coordinated here waits for (a transaction that wrote nothing
    /// takes the timestamp its reads give, which may lie past everything logged here).
    max_awaited_ts: u64,
    /// The largest timestamp this node has fixed or installed.
    clock: u64,
    /// `clock` when W_p was last generated, under [`Floor::Clock`] (0 otherwise).
    clock_floor: u64,
    floor: Floor,
    /// The agreement term this node is in: its commits' points carry it.
    term: u64,
    /// Restarted and not yet through an agreement: serves nothing.
    recovering: bool,
    /// Rolling back to an agreed W_g: serves nothing until done.
    rolling_back: bool,
    /// Could not log a write it had to install ([`WatermarkGate::fail_stop`]): serves nothing,
    /// publishes no watermark and answers no agreement until the node restarts from its log.
    stopped: bool,
    /// Transactions between fixing their timestamp (or starting an install) here and appending
    /// their record: the rollback's record must follow all of theirs.
    committing: rustc_hash::FxHashSet<TxnId>,
    partition: RecoveryPartition,
    /// Node 0's side of agreements.
    coordinator: Option<RecoveryCoordinator>,
    /// Node 0: when each partition was last heard from (any gate message), to suspect one that
    /// went silent without restarting (cut off, stopped, or down and not back yet). Set when
    /// the gate starts, from its worker's clock.
    heartbeats: Option<Heartbeats>,
}

impl WmState {
    /// Serving transactions of `term`: not recovering, not rolling back, in that term.
    fn open(&self, term: u64) -> bool {
        !self.recovering && !self.rolling_back && !self.stopped && self.term == term
    }

    /// Why a transaction of `term` is refused here, if it is.
    fn refusal(&self, term: u64) -> Option<Abort> {
        match (self.stopped, self.open(term)) {
            (true, _) => Some(Abort::Protocol(STOPPED)),
            (false, false) => Some(Abort::Protocol(RECOVERED)),
            (false, true) => None,
        }
    }

    fn insert(&mut self, txn: TxnId, bound: u64) {
        let term = self.term;
        if let Some((old, _)) = self.bound_of.insert(txn, (bound, term)) {
            self.active.remove(&(old, txn));
        }
        self.active.insert((bound, txn));
        assert!(self.active.len() <= MAX_ACTIVE, "more active transactions than can be in flight");
    }

    /// New transactions get timestamps past this (R2).
    fn ts_floor(&self) -> u64 {
        self.marks.ts_floor().max(self.clock_floor)
    }

    /// Under [`Floor::Clock`], new timestamps start past every one fixed so far; under
    /// [`Floor::Time`], also past `wall_us`'s time floor.
    fn sample_clock(&mut self, wall_us: u64) {
        match self.floor {
            Floor::Watermark => {}
            Floor::Clock => self.clock_floor = self.clock,
            Floor::Time => self.clock_floor = self.clock_floor.max(self.clock).max(time_floor_us(wall_us)),
        }
    }

    /// RULE 1, kept monotone, and past everything logged when idle.
    fn generate(&mut self, wall_us: u64) -> u64 {
        self.sample_clock(wall_us);
        match self.active.first() {
            Some(&(bound, _)) => self.marks.generate(Some(bound)),
            None => {
                let w = self.marks.generate(None);
                let past = self.max_logged_ts.max(self.max_awaited_ts);
                match w <= past {
                    true => self.marks.generate(Some(past + 1)),
                    false => w,
                }
            }
        }
    }
}

impl WatermarkGate {
    /// A node's gate, from what its log says (`recovered`; a node that restarted recovers
    /// before it serves).
    pub fn new(
        node: NodeId,
        nodes: u16,
        interval_us: u64,
        floor: Floor,
        recovered: WmRecovered,
        restarted: bool,
    ) -> WatermarkGate {
        assert!(interval_us > 0, "a watermark interval of 0");
        let mut marks = PartitionWatermarks::new(nodes as usize, node as usize).expect("a node of the cluster");
        marks.generate(Some(recovered.persisted));
        let clock = recovered.max_ts.max(recovered.view);
        let state = WmState {
            marks,
            active: BTreeSet::new(),
            bound_of: FxHashMap::default(),
            max_logged_ts: recovered.max_ts,
            max_awaited_ts: 0,
            clock,
            clock_floor: clock,
            floor,
            term: recovered.term,
            recovering: restarted,
            rolling_back: false,
            stopped: false,
            committing: Default::default(),
            partition: RecoveryPartition::new(COORDINATOR, recovered.persisted, recovered.term),
            coordinator: (node == COORDINATOR).then(|| {
                let partitions = (0..nodes).collect();
                let last_term = recovered.coordinator_term.max(recovered.term);
                RecoveryCoordinator::new(partitions, last_term, &recovered.decided, RECOVERY_RESEND_US)
            }),
            heartbeats: None,
        };
        let gate = WatermarkGate {
            node,
            nodes,
            interval_us,
            state: Mutex::new(state),
            undo: Mutex::new(Undo::default()),
            undo_full: Default::default(),
            keeps_undo: true,
            global_view: Default::default(),
            acks: ReleasePoints::new(),
        };
        for (ts, key, value) in recovered.undo {
            gate.keep_undo(ts, [(key, value)]);
        }
        gate
    }

    /// What this node installs from now on is never rolled back while it runs: nothing
    /// restarts in a run without a log (nothing calls for an agreement), and a cluster of one
    /// node has no other partition whose restart would roll back this one (its own restart
    /// rebuilds it from its log, and the agreement that follows rolls back only what that
    /// replay kept). Its installs then keep nothing: a replaced value goes back to the
    /// thread's spare buffers at once, as under OCC.
    pub fn never_rolls_back(mut self) -> Self {
        self.keeps_undo = false;
        self
    }

    /// The first record of a log under `commit=wm` (replay waits for what follows it).
    pub fn log_start(&self, log: &TxnLog) {
        let (w_p, w_g) = {
            let st = self.state.lock();
            (st.marks.own(), st.marks.global())
        };
        let _ = log.append_policy(&WmRecord::Watermark { w_p, w_g });
    }

    /// Where clients wait: a commit at point `(term, ts)` is released once `ts < W_g`, or
    /// rolled back by the agreement of a later term.
    pub fn acks(&self) -> Arc<ReleasePoints> {
        self.acks.clone()
    }

    /// The agreement term now (a transaction notes it when it starts).
    pub fn term(&self) -> u64 {
        self.state.lock().term
    }

    /// How often the node publishes its watermark.
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// Restarted and not yet through an agreement, rolling back, or stopped: serving nothing.
    pub fn recovering(&self) -> bool {
        let st = self.state.lock();
        st.recovering || st.rolling_back || st.stopped
    }

    /// This node could not log a write it had to install (`why`), so a watermark it publishes
    /// from now on could pass a commit that is in no log: it stops (fail-stop), as a
    /// write-ahead log whose write failed does. It serves no transaction, publishes no W_p (so
    /// no commit is acknowledged past what it persisted) and answers no agreement, until the
    /// node restarts from its log and goes through an agreement like any restarted node.
    pub fn fail_stop(&self, w: &crate::rt::Worker, why: &str) {
        let first = !std::mem::replace(&mut self.state.lock().stopped, true);
        if first {
            w.count("wm-fail-stops", 1);
            log_warn(&format!(
                "node {}: {why}: it stops serving (fail-stop) until it restarts from its log",
                self.node
            ));
        }
    }

    /// Has this node stopped ([`WatermarkGate::fail_stop`])?
    pub fn stopped(&self) -> bool {
        self.state.lock().stopped
    }

    /// A transaction of term `term` becomes active here as a participant, with every timestamp
    /// it may take at least `lower`: returns the bound it is held at (at least the floor + 1,
    /// R2), to which the caller raises the records it locks for it; refused if the node is in
    /// another term or recovering. A transaction already active keeps its bound.
    pub fn enter(&self, txn: TxnId, term: u64, lower: u64) -> Result<u64, Abort> {
        let mut st = self.state.lock();
        if let Some(refused) = st.refusal(term) {
            return Err(refused);
        }
        let bound = lower.max(st.ts_floor() + 1);
        if let Some(&(held, _)) = st.bound_of.get(&txn) {
            return Ok(held.max(bound));
        }
        st.insert(txn, bound);
        Ok(bound)
    }

    /// The coordinator fixes the timestamp of `txn`, which started in `term`: at least
    /// `candidate`, past the floor (R2, with the force-update). The transaction is active here
    /// until [`WatermarkGate::leave`]. Refused if an agreement came between.
    pub fn commit_ts(&self, txn: TxnId, term: u64, candidate: u64) -> Result<u64, Abort> {
        if self.undo_full.load(Ordering::Relaxed) {
            return Err(Abort::Protocol(UNDO_FULL));
        }
        let mut st = self.state.lock();
        if let Some(refused) = st.refusal(term) {
            return Err(refused);
        }
        st.committing.insert(txn);
        let ts = candidate.max(st.ts_floor() + 1);
        if let Some(&(held, _)) = st.bound_of.get(&txn) {
            assert!(held <= ts, "a timestamp {ts} below the bound {held} its transaction was held at");
        }
        st.clock = st.clock.max(ts);
        st.insert(txn, ts);
        Ok(ts)
    }

    /// A participant is about to install `txn` of `term` (its record follows): refused if an
    /// agreement came between, which rolled it back everywhere.
    pub fn begin_install(&self, txn: TxnId, term: u64) -> Result<(), Abort> {
        let mut st = self.state.lock();
        if let Some(refused) = st.refusal(term) {
            return Err(refused);
        }
        st.committing.insert(txn);
        Ok(())
    }

    /// Does this node serve requests of transactions of `term` now (not recovering, not rolling
    /// back, in that term)?
    pub fn serves(&self, term: u64) -> bool {
        self.state.lock().open(term)
    }

    /// `txn` is active here since a term before `term` (an agreement rolled it back everywhere).
    pub fn active_before(&self, txn: TxnId, term: u64) -> bool {
        self.state.lock().bound_of.get(&txn).is_some_and(|&(_, entered)| entered < term)
    }

    /// A commit coordinated here waits for the watermark to pass `ts`: an idle W_p moves past it
    /// (R2 keeps every later transaction past W_p), so that it is acknowledged without waiting
    /// for a chain of writes to carry the timestamps there.
    pub fn awaited(&self, ts: u64) {
        let mut st = self.state.lock();
        st.max_awaited_ts = st.max_awaited_ts.max(ts);
    }

    /// A record of a commit at `ts` was appended here (its transaction leaves afterwards).
    pub fn logged(&self, ts: u64) {
        let mut st = self.state.lock();
        st.max_logged_ts = st.max_logged_ts.max(ts);
        st.clock = st.clock.max(ts);
    }

    /// `txn` is done here: its record, at `logged_ts` if it appended one, is in the log.
    pub fn leave(&self, txn: TxnId, logged_ts: Option<u64>) {
        let mut st = self.state.lock();
        st.committing.remove(&txn);
        if let Some((bound, _)) = st.bound_of.remove(&txn) {
            st.active.remove(&(bound, txn));
        }
        if let Some(ts) = logged_ts {
            st.max_logged_ts = st.max_logged_ts.max(ts);
            st.clock = st.clock.max(ts);
        }
    }

    /// Would what an install at `ts` replaces be kept ([`WatermarkGate::keep_undo`])? Once not,
    /// never again (the view of W_g only grows).
    pub fn keeps_undo_at(&self, ts: u64) -> bool {
        self.keeps_undo && ts >= self.global_view.load(Ordering::Relaxed)
    }

    /// An install at `ts` replaced these values (key and value): kept while an agreement may
    /// roll them back (at or above the node's view of W_g).
    pub fn keep_undo(&self, ts: u64, replaced: impl IntoIterator<Item = (RowKey, Option<Value>)>) {
        if !self.keeps_undo_at(ts) {
            return replaced.into_iter().for_each(|(_, value)| Value::recycle(value));
        }
        let mut undo = self.undo.lock();
        for (key, value) in replaced {
            undo.push(ts, key, value);
        }
        assert!(
            undo.kept.len() <= MAX_UNDO,
            "{MAX_UNDO} values kept to roll back, past the refusal at {UNDO_FULL_VALUES}"
        );
        if undo.full() {
            self.undo_full.store(true, Ordering::Relaxed);
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

    /// How many transactions are active here (tests).
    pub fn active(&self) -> usize {
        self.state.lock().active.len()
    }

    /// Worker 0 of every node generates, persists and broadcasts the node's W_p every interval;
    /// a restarted node calls for an agreement until it is through one.
    pub fn start<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let w = host.worker().clone();
        if w.addr.worker != 0 {
            return;
        }
        let (gate, h) = (self.clone(), host.clone());
        w.clone().spawn(async move {
            // Samples fall on multiples of the step, and watermarks on multiples of the interval,
            // of the node's wall clock: every partition then generates its W_p at about the same
            // moment, and W_g passes a commit at the first round of watermarks after it. (Ticks
            // that drift by each node's persistence time spread the partitions' phases apart, and
            // W_g then waits for the last partition's next tick: about a whole interval.)
            let step_us = (gate.interval_us / CLOCK_SAMPLES).max(1);
            loop {
                w.sleep_us(step_us - w.wall_us() % step_us).await;
                let wall_us = w.wall_us();
                let generated = {
                    let mut st = gate.state.lock();
                    let due = (wall_us / step_us) % CLOCK_SAMPLES == 0;
                    match due && st.partition.may_broadcast() && !st.recovering && !st.stopped {
                        // `generate` samples the clock itself.
                        true => Some((st.generate(wall_us), st.marks.global(), st.term)),
                        false => {
                            st.sample_clock(wall_us);
                            None
                        }
                    }
                };
                let Some((w_p, w_g, term)) = generated else { continue };
                match h.gate_log().append_policy(&WmRecord::Watermark { w_p, w_g }) {
                    Ok(lsn) => h.gate_log().durable(lsn).await,
                    // Not persisted: not broadcast either (the next interval tries again).
                    Err(_) => continue,
                }
                gate.persisted(&h, w_p, term);
            }
        });
        // Not in a run that never rolls back (no log, or one node): its installs keep nothing
        // an agreement could put back, and nothing was lost that one should recover.
        if self.node == COORDINATOR && self.keeps_undo {
            let suspect_after_us = (SUSPECT_INTERVALS * self.interval_us).max(SUSPECT_MIN_US);
            let heartbeats = Heartbeats::new(self.nodes as usize, host.worker().now_us(), suspect_after_us);
            self.state.lock().heartbeats = Some(heartbeats);
        }
        let (gate, h, w) = (self.clone(), host.clone(), host.worker().clone());
        w.clone().spawn(async move {
            // A restarted node calls at once (it serves nothing until the agreement is through),
            // then again every resend interval, as node 0 resends what is unanswered and looks
            // for a partition gone silent.
            loop {
                let (recovering, stopped, after) = {
                    let st = gate.state.lock();
                    (st.recovering, st.stopped, st.term)
                };
                if recovering && !stopped {
                    gate.send(&h, COORDINATOR, WmGateMsg::Recover { after });
                }
                if !stopped {
                    let resend = gate.state.lock().coordinator.as_mut().map(|c| c.tick(w.now_us())).unwrap_or_default();
                    gate.dispatch(&h, resend);
                    gate.suspect(&h);
                }
                w.sleep_us(RECOVERY_RESEND_US).await;
            }
        });
    }

    /// Node 0: a partition silent for the suspect timeout starts an agreement, as a restarted
    /// node's call does. A partition cut off without crashing calls for none (it lost nothing
    /// and does not know it is cut off), yet what the cut left hanging holds W_g everywhere: a
    /// lock it took for a transaction whose coordinator gave up, whose abort the cut lost,
    /// keeps it active there, and so its W_p below every later commit, until the orphan
    /// sweeper asks, `orphan_after_us` later. The agreement (which needs every partition's
    /// report, so it completes once the partition answers again) rolls back what no partition's
    /// view of W_g passed and starts a new term, whose first W_p's pass everything kept, and
    /// every worker releases what the older terms' transactions hold.
    ///
    /// While an agreement is under way no partition broadcasts (each is frozen from its report
    /// to its rollback, and a restarted one sends none before), so silence then says nothing:
    /// every partition counts as heard until the agreement is through.
    fn suspect<H: GateHost>(self: &Arc<Self>, host: &Rc<H>) {
        let now_us = host.worker().now_us();
        let (silent, term) = {
            let mut st = self.state.lock();
            let quiet = st.recovering || st.rolling_back || st.coordinator.as_ref().is_none_or(|c| c.busy());
            let Some(hb) = st.heartbeats.as_mut() else { return };
            hb.beat(self.node as usize, now_us);
            if quiet {
                hb.reset(now_us);
                return;
            }
            let silent = hb.tick(now_us);
            if silent.is_empty() {
                return;
            }
            (silent, st.coordinator.as_ref().map_or(0, |c| c.term()))
        };
        host.worker().count("wm-suspected", silent.len() as u64);
        log_warn(&format!(
            "node {}: partitions {silent:?} silent for the suspect timeout: starting agreement {}",
            self.node,
            term + 1
        ));
        self.begin_agreement(host, term);
    }

    /// Own W_p, generated in `term`, is durable: count it, and tell every other node (unless an
    /// agreement froze it).
    fn persisted<H: GateHost>(&self, host: &Rc<H>, w_p: u64, term: u64) {
        {
            let mut st = self.state.lock();
            if !st.partition.may_broadcast() || st.stopped {
                return;
            }
            st.partition.on_persisted(w_p);
        }
        let body = wm_message(&WmGateMsg::Mark { w_p, term });
        for n in (0..self.nodes).filter(|&n| n != self.node) {
            host.worker().send_control(Addr::new(n, 0), &body);
        }
        self.heard(self.node, w_p, term);
    }

    /// A gate message from another node (its worker 0).
    pub fn on_message<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, from: Addr, body: &[u8]) {
        match crate::net::decode::<WmGateMsg>(body) {
            Ok(msg) => self.receive(host, from.node, msg),
            Err(e) => log_warn(&format!("node {}: an undecodable watermark message from {from}: {e}", self.node)),
        }
    }

    fn receive<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, from: NodeId, msg: WmGateMsg) {
        if self.stopped() {
            // Fail-stop: silent until the node restarts.
            return;
        }
        if let Some(hb) = self.state.lock().heartbeats.as_mut() {
            hb.beat(from as usize, host.worker().now_us());
        }
        match msg {
            WmGateMsg::Mark { w_p, term } => self.heard(from, w_p, term),
            WmGateMsg::Recover { after } => self.begin_agreement(host, after),
            WmGateMsg::Agreement(m @ (WmMsg::Persisted { .. } | WmMsg::RolledBack { .. })) => {
                let decision = self.state.lock().coordinator.as_mut().and_then(|c| c.on_message(from, m));
                if let Some(d) = decision {
                    self.decide(host, d);
                }
            }
            WmGateMsg::Agreement(m) => {
                let (out, action) = self.state.lock().partition.on_message(from, m);
                self.dispatch(host, out);
                if let PartitionAction::RollBack { term, w_g } = action {
                    self.roll_back(host, term, w_g);
                }
            }
        }
    }

    /// Node 0: a restarted node whose last agreement was `after` asks for one (or a partition
    /// went silent: `after` is the current term); start the next term (logged before anyone
    /// hears of it) unless one is under way or already past `after`.
    fn begin_agreement<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, after: u64) {
        let out = {
            let mut st = self.state.lock();
            let Some(c) = st.coordinator.as_mut() else { return };
            if !c.should_begin(after) {
                return;
            }
            c.begin(host.worker().now_us())
        };
        let term = self.state.lock().coordinator.as_ref().map_or(0, |c| c.term());
        let lsn = host.gate_log().append_policy(&WmRecord::Term { term }).unwrap_or(None);
        let (gate, h) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            h.gate_log().durable(lsn).await;
            gate.dispatch(&h, out);
        });
    }

    /// Node 0: every partition reported. Log the decision, then announce it: a partition that
    /// missed it (node 0 failing in between) is rolled back to it in the next term.
    fn decide<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, d: Decision) {
        let lsn = match host.gate_log().append_policy(&WmRecord::Decided {
            term: d.term,
            w_g: d.w_g,
            settled_through: d.settled_through,
        }) {
            Ok(lsn) => lsn,
            Err(_) => {
                // Not logged: not announced. The node's log failed; its restart begins anew.
                log_warn(&format!("node {}: the decision of agreement {} could not be logged", self.node, d.term));
                return;
            }
        };
        let (gate, h) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            h.gate_log().durable(lsn).await;
            let now_us = h.worker().now_us();
            let out = gate.state.lock().coordinator.as_mut().map(|c| c.announce(d.term, now_us));
            gate.dispatch(&h, out.unwrap_or_default());
        });
    }

    /// The agreement of `term` is `w_g`: log it, put back what every install at or above it
    /// replaced (newest first), report those commits as rolled back, and move to the new term.
    fn roll_back<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, term: u64, w_g: u64) {
        {
            let mut st = self.state.lock();
            if st.term >= term {
                // Done already (a resent message): answer again.
                let out = st.partition.rolled_back(term);
                drop(st);
                return self.dispatch(host, out);
            }
            if st.rolling_back {
                return;
            }
            // From now on nothing fixes a timestamp or installs here until the rollback is done.
            st.rolling_back = true;
        }
        let (gate, h) = (self.clone(), host.clone());
        host.worker().clone().spawn(async move {
            // Those that started before append their records first, so that every rolled-back
            // record precedes the rollback's (replay drops by log position).
            while !gate.state.lock().committing.is_empty() {
                h.worker().sleep_us(DRAIN_POLL_US).await;
            }
            let lsn = h.gate_log().append_policy(&WmRecord::RolledBack { term, w_g }).unwrap_or(None);
            h.gate_log().durable(lsn).await;
            let old_term = {
                let st = gate.state.lock();
                if st.term >= term {
                    return;
                }
                st.term
            };
            let undone = {
                let mut undo = gate.undo.lock();
                let undone = undo.roll_back_to(w_g);
                gate.undo_full.store(undo.full(), Ordering::Relaxed);
                undone
            };
            h.worker().count("wm-values-rolled-back", undone.len() as u64);
            for (key, value) in undone {
                h.restore_row(key, value);
            }
            h.rolled_back();
            gate.acks.roll_back(point(old_term, w_g), point(old_term, (1 << TS_BITS) - 1));
            let out = {
                let mut st = gate.state.lock();
                st.term = term;
                st.recovering = false;
                st.rolling_back = false;
                st.clock = st.clock.max(w_g);
                st.clock_floor = st.clock_floor.max(st.clock);
                st.partition.rolled_back(term)
            };
            h.worker().count("wm-rollbacks", 1);
            gate.release(&gate.state.lock());
            gate.dispatch(&h, out);
        });
    }

    /// Send agreement messages, to this node's own gate at once.
    fn dispatch<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, out: Vec<(NodeId, WmMsg)>) {
        for (to, msg) in out {
            if to == self.node {
                self.receive(host, to, WmGateMsg::Agreement(msg));
            } else {
                self.send(host, to, WmGateMsg::Agreement(msg));
            }
        }
    }

    fn send<H: GateHost>(self: &Arc<Self>, host: &Rc<H>, to: NodeId, msg: WmGateMsg) {
        if to == self.node {
            return self.receive(host, to, msg);
        }
        host.worker().send_control(Addr::new(to, 0), &wm_message(&msg));
    }

    /// Partition `from`'s latest W_p, generated in `term`: release every commit below the new
    /// W_g, and forget what installs below it replaced. A W_p of a term this node has not reached
    /// is not counted (it is sent again every interval): it may pass what that term's agreement
    /// rolls back here. One of an older term stays true (a W_p only grows).
    fn heard(&self, from: NodeId, w_p: u64, term: u64) {
        let global = {
            let mut st = self.state.lock();
            if term > st.term || !st.marks.update(from as usize, w_p) {
                return;
            }
            self.release(&st);
            let global = st.marks.global();
            self.global_view.store(global, Ordering::Relaxed);
            global
        };
        let mut undo = self.undo.lock();
        let forgotten = undo.forget_below(global);
        self.undo_full.store(undo.full(), Ordering::Relaxed);
        drop(undo);
        forgotten.into_iter().for_each(Value::recycle);
    }

    fn release(&self, st: &WmState) {
        let global = st.marks.global();
        if global > 0 && !st.recovering && !st.stopped {
            self.acks.release_through(point(st.term, global - 1));
        }
    }
}

/// The abort of a transaction that ran across a recovery agreement, or reached a node that is
/// recovering.
pub const RECOVERED: crate::txn::Reason = crate::txn::Reason::new("wm-recovered");

/// The abort of a transaction that reached a node that stopped: it could not log a write it had
/// to install ([`WatermarkGate::fail_stop`]) and serves nothing until it restarts.
pub const STOPPED: crate::txn::Reason = crate::txn::Reason::new("wm-stopped");

/// A commit refused while the node keeps as much to roll back as it may: the global watermark
/// has not moved for long (a partition is slow or unreachable); retried, it commits once it does.
pub const UNDO_FULL: crate::txn::Reason = crate::txn::Reason::new("wm-undo-full");

/// A message between nodes' watermark gates, framed for the skeleton's handler.
fn wm_message(msg: &WmGateMsg) -> Vec<u8> {
    framed(TAG_WM, msg)
}

impl WatermarkGate {
    /// A restarted node serves nothing until its recovery agreement is through.
    pub async fn recovered(&self, w: &Rc<Worker>) {
        while self.recovering() {
            w.sleep_us(1_000).await;
        }
    }

    /// An attempt finished (its acknowledgement deferred): its commit names its timestamp, safe
    /// once the global watermark passes it; the driver waits for that when it defers, else here.
    pub async fn acknowledge(&self, w: &Worker, defer_ack: bool, mut out: TxnOutput) -> TxnResult<TxnOutput> {
        if defer_ack {
            return Ok(out);
        }
        let Some(point) = out.ack_after.take() else { return Ok(out) };
        let t0 = w.now_ns();
        let acks = self.acks();
        AckSource::decided(&*acks, point).await;
        w.note_log_wait(w.now_ns() - t0);
        match AckSource::outcome(&*acks, point) {
            Release::RolledBack => Err(Abort::RolledBack),
            _ => Ok(out),
        }
    }

    /// Append `txn`'s writes here as a `Commit` at `ts`, and keep the values they replace while
    /// an agreement may roll them back. The caller holds every record written (its locks) and
    /// installs next, so their committed values are the ones replaced.
    pub fn append_install(
        &self,
        host: &dyn GateHost,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        ts: u64,
    ) -> Result<(), Abort> {
        if writes.is_empty() {
            return Ok(());
        }
        host.gate_log().append_commit(txn, writes, &[], ts)?;
        if self.keeps_undo_at(ts) {
            self.keep_undo(ts, writes.iter().map(|(k, _)| (*k, host.read_row(*k))));
        }
        self.logged(ts);
        Ok(())
    }
}

/// What watermark group commit logs beside 2PC's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WmRecord {
    /// Every transaction with a timestamp below `w_p` that this node takes part in has its
    /// records before this one; `w_g` is the node's view of the global watermark then, below
    /// which no recovery rolls back.
    Watermark { w_p: u64, w_g: u64 },
    /// The recovery agreement of `term` rolled back every transaction at or above `w_g`: the
    /// `Commit` records before this one at or above it do not count.
    RolledBack { term: u64, w_g: u64 },
    /// The node coordinating recovery agreements started `term`.
    Term { term: u64 },
    /// The coordinator decided that `term` rolls back from `w_g` (logged before any partition
    /// hears it); every partition had carried out `settled_through` and the terms before it.
    Decided { term: u64, w_g: u64, settled_through: u64 },
}

/// Replaying a log of watermark group commit: from its first `Watermark` record on, a `Commit`
/// at or above the node's logged view of W_g waits, since a recovery agreement may roll it back;
/// it counts once a later view passes it, and is dropped by a `RolledBack` at or below its
/// timestamp (by log position: commits after that record count as usual). Bounded by what a
/// node commits in the few intervals its view trails its commits.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WmLog {
    on: bool,
    view: u64,
    persisted: u64,
    term: u64,
    coordinator_term: u64,
    /// Decisions not known to be carried out everywhere: one per agreement since the last that
    /// finished.
    decided: std::collections::BTreeMap<u64, u64>,
    max_ts: u64,
    /// Commits at or above `view`, in log order.
    pending: Vec<(u64, Writes)>,
}

/// What a node's log says of watermark group commit, for its gate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WmRecovered {
    /// The latest W_p the node persisted.
    pub persisted: u64,
    /// The node's latest logged view of W_g: no agreement rolls back below it.
    pub view: u64,
    /// The latest agreement term this node rolled back in.
    pub term: u64,
    /// The latest term this node began as the agreements' coordinator, and the decisions it
    /// logged that some partition may not have carried out, `(term, w_g)` oldest first.
    pub coordinator_term: u64,
    pub decided: Vec<(u64, u64)>,
    /// The largest timestamp the log holds a commit of.
    pub max_ts: u64,
    /// Commits at or above `view` (a recovery may roll them back), in log order: applied over
    /// the rest by the node, which keeps what they replace (`undo`).
    pub limbo: Vec<(u64, Writes)>,
    /// What rolling `limbo` back puts back, `(ts, key, value)` in install order.
    pub undo: Vec<(u64, RowKey, Option<Value>)>,
}

impl WmLog {
    /// No recovery rolls back below `w_g` any more: the commits waiting below it count, in log
    /// order.
    fn settle_below<L: CcLog>(&mut self, w_g: u64, core: &mut CoreReplay<L>) {
        self.view = self.view.max(w_g);
        let view = self.view;
        let (settled, pending) = std::mem::take(&mut self.pending).into_iter().partition(|(ts, _)| *ts < view);
        self.pending = pending;
        for (ts, writes) in settled {
            core.install(writes, ts);
        }
    }
}

impl PolicyLog for WmLog {
    const NAME: &'static str = "wm";
    type Record = WmRecord;
    type Recovered = WmRecovered;

    /// A commit at or above the node's view of W_g waits until a view passes it.
    fn hold<L: CcLog>(&mut self, record: LogRecord<L, Self>, _bytes: &[u8]) -> Option<LogRecord<L, Self>> {
        match record {
            Record::Commit { ts, writes, .. } if self.on && ts >= self.view => {
                self.max_ts = self.max_ts.max(ts);
                self.pending.push((ts, writes));
                None
            }
            Record::Commit { ts, .. } => {
                self.max_ts = self.max_ts.max(ts);
                Some(record)
            }
            record => Some(record),
        }
    }

    fn apply<L: CcLog>(&mut self, record: WmRecord, core: &mut CoreReplay<L>) {
        match record {
            WmRecord::Watermark { w_p, w_g } => {
                self.on = true;
                self.persisted = self.persisted.max(w_p);
                self.settle_below(w_g, core);
            }
            WmRecord::RolledBack { term, w_g } => {
                self.term = self.term.max(term);
                self.pending.retain(|(ts, _)| *ts < w_g);
                self.settle_below(w_g, core);
            }
            WmRecord::Term { term } => self.coordinator_term = self.coordinator_term.max(term),
            WmRecord::Decided { term, w_g, settled_through } => {
                self.coordinator_term = self.coordinator_term.max(term);
                self.decided.insert(term, w_g);
                self.decided = self.decided.split_off(&(settled_through + 1));
            }
        }
    }

    fn recover<L: CcLog>(&self, _core: &CoreReplay<L>) -> (WmRecovered, Option<CoreReplay<L>>) {
        let recovered = WmRecovered {
            persisted: self.persisted,
            view: self.view,
            term: self.term,
            coordinator_term: self.coordinator_term,
            decided: self.decided.iter().map(|(&t, &w)| (t, w)).collect(),
            max_ts: self.max_ts,
            limbo: self.pending.clone(),
            undo: Vec::new(),
        };
        (recovered, None)
    }

    /// Commits a recovery agreement may still roll back are applied last, keeping what they
    /// replace.
    fn apply_limbo<V>(
        wm: &mut WmRecovered,
        _in_doubt: &InDoubt<V>,
        replayed: &mut dyn FnMut(RowKey, Option<Value>, u64, u64) -> Option<Value>,
        _committed: &dyn Fn(RowKey) -> Option<Value>,
    ) {
        for (ts, writes) in std::mem::take(&mut wm.limbo) {
            for (k, v) in writes {
                let old = replayed(k, v, 1, ts);
                wm.undo.push((ts, k, old));
            }
        }
    }
}

impl Policy for WmLog {
    fn gate(recovered: WmRecovered, node: GateNode<'_>, commit: CommitPolicy) -> Gate {
        let CommitPolicy::Watermark { wm_us, floor } = commit else { panic!("the watermark gate for {commit:?}") };
        let mut gate = WatermarkGate::new(node.id, node.nodes, wm_us, floor, recovered, node.restarted);
        if !node.log.enabled() || node.nodes == 1 {
            gate = gate.never_rolls_back();
        }
        gate.log_start(node.log);
        Gate::Watermark(Arc::new(gate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(floor: Floor) -> WatermarkGate {
        WatermarkGate::new(0, 2, 1_000, floor, WmRecovered::default(), false)
    }

    /// Seed 1012 of the replicated failover sweep lost acknowledged commits under `primo`:
    /// node 1 was taken over before its first record was replicated, so its next incarnation
    /// found an empty log, took itself for fresh and joined no recovery agreement, while the
    /// installs its first incarnation had served were gone. A node now serves no request of a
    /// group commit before its boot record is durable.
    #[test]
    fn a_node_serves_nothing_before_its_boot_record_is_durable() {
        let out = crate::testkit::checked_run(&crate::testkit::replicated_failover_spec("primo", 1012));
        assert!(out.totals.failovers > 0, "no node was taken over");
    }

    /// RULE 1 and R2: W_p is the smallest bound or timestamp of the active transactions, new
    /// ones start past it, and an idle node moves past everything it logged.
    #[test]
    fn the_watermark_stays_below_every_active_transaction_and_new_ones_start_past_it() {
        let g = gate(Floor::Watermark);
        assert_eq!(g.enter(1, 0, 0), Ok(1), "a participant's bound: past the floor");
        assert_eq!(g.commit_ts(2, 0, 7), Ok(7), "a coordinator's candidate past the floor stays");
        assert_eq!(g.state.lock().generate(0), 1, "held by the participant's bound");
        assert_eq!(g.enter(3, 0, 0), Ok(2), "past the new W_p");
        g.leave(1, Some(9));
        g.leave(3, None);
        assert_eq!(g.state.lock().generate(0), 7, "the coordinator's transaction, logged at 7 next");
        g.leave(2, Some(7));
        assert_eq!(g.state.lock().generate(0), 10, "idle: past the 9 it logged");
        assert_eq!(g.active(), 0);
    }

    /// The clock floor: with W_p held low by an active transaction, new timestamps still start
    /// past the largest one the node had fixed or installed at the last generation; the paper's
    /// floor starts them just past W_p.
    #[test]
    fn the_clock_floor_starts_new_timestamps_past_the_partitions_clock() {
        for (floor, expected) in [(Floor::Clock, 51), (Floor::Watermark, 2), (Floor::Time, 51)] {
            let g = gate(floor);
            assert_eq!(g.enter(1, 0, 0), Ok(1), "a participant's transaction holds W_p at 1");
            assert_eq!(g.commit_ts(2, 0, 50), Ok(50));
            g.leave(2, Some(50));
            assert_eq!(g.state.lock().generate(0), 1);
            assert_eq!(g.commit_ts(3, 0, 1), Ok(expected), "{floor:?}");
        }
    }

    /// The time floor: new timestamps also start past the node's clock time when it was last
    /// sampled (µs from 2026 on a real clock, the virtual time in the simulator), and never
    /// fall back when that clock steps back.
    #[test]
    fn the_time_floor_starts_new_timestamps_past_the_clock_time() {
        assert_eq!(time_floor_us(TIME_BASE_US + 7), 7, "a real clock counts from 2026");
        assert_eq!(time_floor_us(5_000), 5_000, "the simulator's from 0");
        let g = gate(Floor::Time);
        g.state.lock().sample_clock(5_000);
        assert_eq!(g.commit_ts(1, 0, 1), Ok(5_001));
        g.state.lock().sample_clock(4_000);
        assert_eq!(g.commit_ts(2, 0, 1), Ok(5_002), "past its own clock and the earlier sample");
    }

    /// A node in another term, or recovering, refuses: the transaction ran across an agreement.
    #[test]
    fn a_transaction_of_another_term_or_at_a_recovering_node_is_refused() {
        let g = gate(Floor::Clock);
        assert_eq!(g.enter(1, 1, 0), Err(Abort::Protocol(RECOVERED)));
        assert_eq!(g.commit_ts(1, 1, 0), Err(Abort::Protocol(RECOVERED)));
        let r = WatermarkGate::new(1, 2, 1_000, Floor::Clock, WmRecovered { term: 3, ..Default::default() }, true);
        assert!(r.recovering());
        assert_eq!(r.enter(1, 3, 0), Err(Abort::Protocol(RECOVERED)), "recovering: nothing served");
    }

    /// Only installs at or above the view of W_g keep what they replaced; hearing a higher W_g
    /// forgets what lies below it. Points order by term first.
    #[test]
    fn undo_is_kept_above_the_view_only_and_points_order_by_term() {
        let g = gate(Floor::Clock);
        g.heard(0, 10, 0);
        g.heard(1, 10, 1);
        assert_eq!(g.global(), 0, "a W_p of a term this node has not reached is not counted");
        g.heard(1, 10, 0);
        assert_eq!(g.global(), 10);
        g.keep_undo(9, [(RowKey::new(0, 1), None)]);
        g.keep_undo(12, [(RowKey::new(0, 2), None)]);
        g.keep_undo(15, [(RowKey::new(0, 3), None)]);
        assert_eq!(g.undo.lock().kept.len(), 2, "9 lies below the view");
        g.heard(0, 14, 0);
        g.heard(1, 14, 0);
        assert_eq!(g.undo.lock().kept.iter().map(|k| k.ts).collect::<Vec<_>>(), vec![15]);
        assert!(point(1, 0) > point(0, (1 << TS_BITS) - 1));
        assert_eq!(
            crate::rt::release::AckSource::outcome(&*g.acks(), point(0, 13)),
            crate::rt::release::Release::Released
        );
    }

    /// A node that is never rolled back while it runs keeps nothing of what its installs
    /// replaced.
    #[test]
    fn a_node_never_rolled_back_keeps_no_undo() {
        let g = gate(Floor::Clock).never_rolls_back();
        g.keep_undo(12, [(RowKey::new(0, 2), Some(Value::copy_from(&[1])))]);
        let undo = g.undo.lock();
        assert_eq!((undo.kept.len(), undo.bytes), (0, 0));
    }

    /// A rollback puts back, newest first, what lies at or above its W_g, even when two
    /// installs on one key kept their values in the other order; what lies below stays.
    #[test]
    fn a_rollback_puts_values_back_newest_first_whatever_order_they_were_kept_in() {
        let (k, other) = (RowKey::new(0, 1), RowKey::new(0, 2));
        let v = |b: u8| Some(Value::copy_from(&[b]));
        let mut undo = Undo::default();
        undo.push(30, k, v(20));
        undo.push(5, other, v(1));
        undo.push(20, k, v(10));
        undo.push(25, other, v(5));
        let back: Vec<(u64, u8)> = undo.roll_back_to(10).into_iter().map(|(k, v)| (k.key, v.unwrap()[0])).collect();
        assert_eq!(back, vec![(1, 20), (2, 5), (1, 10)], "k ends at 10, what its install at 20 replaced");
        assert_eq!((undo.kept.len(), undo.bytes), (0, 0));
    }

    /// Past its budget the undo refuses new commits (`wm-undo-full`) until the watermark moves
    /// past what it holds; the bytes it counts go with what it forgets.
    #[test]
    fn a_full_undo_refuses_commits_until_the_watermark_moves() {
        let g = gate(Floor::Clock);
        let big = Value::copy_from(&vec![7u8; 1 << 20]);
        for i in 0..(UNDO_FULL_BYTES >> 20) as u64 {
            g.keep_undo(100 + i, [(RowKey::new(0, i), Some(big.clone()))]);
        }
        assert_eq!(g.commit_ts(1, 0, 0), Err(Abort::Protocol(UNDO_FULL)));
        g.heard(0, 10_000, 0);
        g.heard(1, 10_000, 0);
        assert_eq!(g.undo.lock().bytes, 0, "all of it forgotten");
        assert!(g.commit_ts(1, 0, 0).is_ok(), "commits again");
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;
    use crate::protocols::twopc::durable::encode_record;
    use crate::protocols::twopc::durable::tests::{k, same_from_every_checkpoint, v};
    use crate::protocols::twopc::durable::{replay, PlainLog, ReplayState};

    type Wm = LogRecord<PlainLog, WmLog>;

    /// Watermark group commit: a commit counts once a logged view of W_g passes it, a rollback
    /// drops the commits before it at or above its W_g (by log position: a later commit at a high
    /// timestamp stays), and what no view passed yet comes back as limbo. A checkpoint taken
    /// anywhere gives the same recovery.
    #[test]
    fn watermark_commits_wait_for_a_view_and_a_rollback_drops_by_log_position() {
        let commit = |txn, n: u64, b, ts| Wm::Commit { txn, writes: vec![(k(n), v(b))], participants: vec![], ts };
        let recs: Vec<Vec<u8>> = [
            Wm::Policy(WmRecord::Watermark { w_p: 0, w_g: 0 }),
            commit(1, 1, 1, 5),
            commit(2, 2, 2, 12),
            Wm::Policy(WmRecord::Watermark { w_p: 10, w_g: 8 }),
            commit(3, 3, 3, 15),
            commit(4, 1, 4, 20),
            Wm::Policy(WmRecord::Term { term: 1 }),
            Wm::Policy(WmRecord::Decided { term: 1, w_g: 14, settled_through: 0 }),
            Wm::Policy(WmRecord::RolledBack { term: 1, w_g: 14 }),
            commit(5, 4, 5, 30),
            Wm::Policy(WmRecord::Watermark { w_p: 25, w_g: 11 }),
            Wm::Policy(WmRecord::Term { term: 2 }),
            Wm::Policy(WmRecord::Decided { term: 2, w_g: 26, settled_through: 1 }),
        ]
        .iter()
        .map(encode_record)
        .collect();
        let collect = |from: ReplayState<PlainLog, WmLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let (_, wm) = replay(from, rest, &mut |k, v, _, ts| rows.push((k, v, ts)));
            rows.sort_by_key(|e| e.0);
            (rows, wm)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        assert_eq!(
            whole.0,
            vec![(k(1), v(1), 5), (k(2), v(2), 12)],
            "5 under the view of 8, 12 under the rollback's 14; 15 and 20 rolled back; 30 waits"
        );
        let wm = &whole.1;
        assert_eq!((wm.persisted, wm.view, wm.term, wm.max_ts), (25, 14, 1, 30));
        assert_eq!((wm.coordinator_term, &wm.decided[..]), (2, &[(2, 26)][..]), "term 1 carried out everywhere");
        assert_eq!(wm.limbo, vec![(30, vec![(k(4), v(5))])]);
        same_from_every_checkpoint(&recs, &whole, collect);
    }
}
