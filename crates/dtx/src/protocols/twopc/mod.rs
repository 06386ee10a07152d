//! Pieces the 2PC-based protocols share: transaction ids, the node's shared state, routing a key
//! to its node, the coordinator's decision table (answering participants that lost track), the
//! participant-side table of transactions with its orphan sweeper, ([`durable`]) the log
//! records and recovery that make 2PC survive a crash, ([`record_lock`]) the record lock of the
//! locking protocols, and ([`buffered`]) the execution phase of those that buffer their writes.

pub mod buffered;
pub mod commit;
pub mod durable;
pub mod lease;
pub mod lease_log;
pub mod record_lock;
pub mod skeleton;
pub mod wire;
pub mod wm_worker;

pub use commit::Stamp;
pub use skeleton::{
    Cc, CcWorker, CoordTxn, Coordinator, FromNode, Messages, Participant, TwoPc, TwoPcConfig, ORPHAN_OPTION,
};

use crate::cluster::Topology;
use crate::net::{Addr, NodeId};
use crate::storage::{RowKey, Storage, Value};
use crate::txn::Procedures;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use super::ProtoOptions;

/// A transaction attempt's id: node (12 bits) | worker (6 bits) | boot (10 bits) | sequence
/// (36 bits). The boot number (from the node's log, [`durable::Record::Boot`]) keeps ids of a
/// restarted node from repeating ones that participants may still hold state for; it wraps after
/// 1,024 restarts of one node, and a worker's sequence after 2^36 transactions of one boot.
pub type TxnId = u64;

const SEQ_BITS: u32 = 36;
const BOOT_BITS: u32 = 10;
const WORKER_BITS: u32 = 6;

/// A scanned row as the transaction itself sees it: its own uncommitted write wins over the
/// `stored` value (`None`: it deleted the row).
pub fn own_view(writes: &[(RowKey, Option<Value>)], key: RowKey, stored: Value) -> Option<Value> {
    match writes.iter().find(|(k, _)| *k == key) {
        Some((_, mine)) => mine.clone(),
        None => Some(stored),
    }
}

/// The value a record holds, for a concurrency control whose records hold only committed values
/// (writes are buffered until they install): what reconnaissance reads ([`Participant::peek`]).
pub fn committed_value<M: Default + Send>(store: &Storage<M>, key: RowKey) -> Option<Value> {
    store.get(key).and_then(|r| r.lock().value.clone())
}

/// The existing rows of a range, as [`committed_value`] reads each.
pub fn committed_rows<M: Default + Send>(store: &Storage<M>, s: crate::txn::Scan) -> Vec<(u64, Value)> {
    let rows = store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending);
    rows.into_iter().filter_map(|(k, r)| r.lock().value.clone().map(|v| (k, v))).collect()
}

/// Buffer a transaction's write until commit: the last write of a key wins.
pub fn buffer_write(writes: &mut durable::Writes, key: RowKey, value: Option<Value>) {
    match writes.iter_mut().find(|(k, _)| *k == key) {
        Some(w) => w.1 = value,
        None => writes.push((key, value)),
    }
}

pub fn txn_id(addr: Addr, boot: u32, seq: u64) -> TxnId {
    debug_assert!(addr.node < 1 << 12 && addr.worker < 1 << WORKER_BITS, "{addr} does not fit a transaction id");
    ((addr.node as u64) << (SEQ_BITS + BOOT_BITS + WORKER_BITS))
        | ((addr.worker as u64 & ((1 << WORKER_BITS) - 1)) << (SEQ_BITS + BOOT_BITS))
        | ((boot as u64 & ((1 << BOOT_BITS) - 1)) << SEQ_BITS)
        | (seq & ((1 << SEQ_BITS) - 1))
}

/// The worker that coordinates a transaction.
pub fn coordinator_of(txn: TxnId) -> Addr {
    let node = txn >> (SEQ_BITS + BOOT_BITS + WORKER_BITS);
    let worker = (txn >> (SEQ_BITS + BOOT_BITS)) & ((1 << WORKER_BITS) - 1);
    Addr::new(node as NodeId, worker as u16)
}

/// Record metadata the 2PC protocols keep, and what replaying a logged write does to it.
pub trait TxnMeta: Default + Send {
    /// A committed write was replayed into this record at recovery (OCC bumps its version).
    fn on_replayed_write(&mut self) {}
    /// The latest replayed write's decision carried timestamp `ts` (MaaT's write timestamp).
    fn on_replayed_at(&mut self, _ts: u64) {}
    /// A failed epoch's write was undone here (`commit=epoch`): the record holds the value it
    /// had before, which must read as a new version to whoever read or cached the undone one
    /// (OCC bumps its version; TicToc and Sundial start a version past every lease).
    fn on_rolled_back(&mut self) {}
}

/// State of one node shared by its workers: storage plus what routing needs.
pub struct NodeShared<M> {
    pub id: NodeId,
    pub topo: Arc<Topology>,
    pub workload: Arc<dyn Procedures>,
    pub store: Storage<M>,
    pub opts: ProtoOptions,
    /// The node's log (a no-op when the run is not durable).
    pub log: durable::TxnLog,
    /// This boot's number, part of every transaction id it issues.
    pub boot: u32,
}

impl<M: TxnMeta> NodeShared<M> {
    /// Build the node's storage, load the partitions it owns, and replay its log, if any, as
    /// `protocol`'s (whose own records are `L`'s) under the commit policy `P`; returns what
    /// recovery left undecided, and what the policy's gate recovers from.
    pub fn load<L: durable::CcLog, P: durable::PolicyLog>(
        env: super::NodeEnv,
        protocol: &'static str,
    ) -> (Self, durable::Recovery<L>, P::Recovered) {
        let store: Storage<M> = super::load_storage(&env);
        // The host refused a checkpoint that does not decode (`Protocol::log_machine`), with a message.
        let from = match env.checkpoint.as_deref() {
            Some(bytes) => durable::ReplayState::<L, P>::decode(protocol, bytes)
                .unwrap_or_else(|e| panic!("node {}: {e}", env.node)),
            None => durable::ReplayState::new(protocol),
        };
        let replayed = |k: RowKey, v: Option<Value>, writes: u64, ts: u64| {
            let rec = store.get_or_create(k);
            let mut row = rec.lock();
            let old = std::mem::replace(&mut row.value, v);
            for _ in 0..writes {
                row.meta.on_replayed_write();
            }
            if ts > 0 {
                row.meta.on_replayed_at(ts);
            }
            old
        };
        let (recovery, mut policy, state) = durable::replay_keeping(from, &env.recovered, &mut |k, v, writes, ts| {
            replayed(k, v, writes, ts);
        });
        // What the policy may still roll back is applied last, keeping what it replaces.
        P::apply_limbo(&mut policy, &recovery.in_doubt, &mut |k, v, writes, ts| replayed(k, v, writes, ts), &|k| {
            committed_value(&store, k)
        });
        if recovery.undecodable > 0 {
            crate::rt::log_warn(&format!(
                "node {}: {} log records did not decode and were skipped",
                env.node, recovery.undecodable
            ));
        }
        let boot = recovery.boot;
        let node = NodeShared {
            id: env.node,
            topo: env.topo,
            workload: env.workload,
            store,
            opts: env.opts,
            log: {
                if let (Some(log), true) = (&env.log, env.checkpoint_every > 0) {
                    // Before the boot record, so that the checkpointer sees every record.
                    log.set_checkpointer(Box::new(state), env.checkpoint_every);
                }
                durable::TxnLog::start::<L, P>(env.log, boot)
            },
            boot,
        };
        (node, recovery, policy)
    }

    /// The node holding `key`, if it is not this one.
    #[inline]
    pub fn remote_node(&self, key: RowKey) -> Option<NodeId> {
        let n = self.node_of(key);
        (n != self.id).then_some(n)
    }

    #[inline]
    pub fn node_of(&self, key: RowKey) -> NodeId {
        if self.topo.nodes == 1 {
            // One node holds every partition: no need to ask the workload.
            return 0;
        }
        self.topo.node_of(self.workload.partition_of(key))
    }

    /// Which worker of `node` serves requests from coordinator worker `from`: always the same
    /// one, so a transaction's participant state on a node lives on one thread.
    #[inline]
    pub fn participant(&self, node: NodeId, from: Addr) -> Addr {
        Addr::new(node, from.worker % self.topo.workers_per_node)
    }
}

/// What a coordinator knows about a transaction it coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnStatus {
    Active,
    Committed,
    /// Aborted, or unknown: with presumed abort, a coordinator forgets aborted transactions.
    Aborted,
}

/// More entries than a decision or participant table can hold for the transactions in flight
/// (`--inflight` is at most 100,000 per worker): more means a leak.
pub const MAX_TABLE_ENTRIES: usize = 1 << 22;

/// Per-worker coordinator bookkeeping: id allocation and the decision table.
pub struct CoordTable {
    boot: u32,
    next_seq: Cell<u64>,
    /// Each transaction's status, the timestamp of a commit decision that carries one, and the
    /// epoch it ran in (`commit=epoch`; 0 otherwise).
    status: RefCell<FxHashMap<TxnId, (TxnStatus, u64, u64)>>,
    /// The epoch this worker's transactions run in now (all of them: the epoch is a barrier).
    pub epoch: Cell<u64>,
}

impl Default for CoordTable {
    fn default() -> Self {
        CoordTable::new(0)
    }
}

impl CoordTable {
    /// The table of a worker of a node in boot number `boot`.
    pub fn new(boot: u32) -> Self {
        CoordTable { boot, next_seq: Cell::new(1), status: RefCell::new(FxHashMap::default()), epoch: Cell::new(0) }
    }

    pub fn new_txn(&self, addr: Addr) -> TxnId {
        let s = self.next_seq.get();
        self.next_seq.set(s + 1);
        txn_id(addr, self.boot, s)
    }

    /// Mark a transaction that is about to leave state at other nodes (`Active`), and its
    /// decision. The decision table's transitions: absent -> Active -> Committed -> forgotten,
    /// or Active -> Aborted (forgotten at once: presumed abort). A decision never changes.
    ///
    /// Bounded by the transactions in flight: an entry is a transaction one of this worker's
    /// clients has in flight, or a commit being resent until acknowledged, which a client
    /// waited for; [`MAX_TABLE_ENTRIES`] is an assertion of that, not a policy.
    pub fn set(&self, txn: TxnId, s: TxnStatus) {
        self.set_at(txn, s, 0)
    }

    /// Commit `txn` at timestamp `ts` (a protocol whose decision carries one, as MaaT's).
    pub fn set_committed_at(&self, txn: TxnId, ts: u64) {
        self.set_at(txn, TxnStatus::Committed, ts)
    }

    /// A commit decided before a restart, in epoch `epoch`, resent from the log.
    pub fn set_committed_in(&self, txn: TxnId, ts: u64, epoch: u64) {
        self.set_at(txn, TxnStatus::Committed, ts);
        if let Some(e) = self.status.borrow_mut().get_mut(&txn) {
            e.2 = epoch;
        }
    }

    fn set_at(&self, txn: TxnId, s: TxnStatus, ts: u64) {
        let mut status = self.status.borrow_mut();
        let before = status.get(&txn).map(|e| e.0);
        match s {
            TxnStatus::Active => assert!(before.is_none(), "txn {txn:x} became active twice ({before:?})"),
            TxnStatus::Committed => {
                assert!(before == Some(TxnStatus::Active) || before.is_none(), "txn {txn:x}: {before:?} -> committed")
            }
            TxnStatus::Aborted => assert!(before != Some(TxnStatus::Committed), "txn {txn:x}: committed -> aborted"),
        }
        if s == TxnStatus::Aborted {
            status.remove(&txn);
        } else {
            status.insert(txn, (s, ts, self.epoch.get()));
            debug_assert!(status.len() <= MAX_TABLE_ENTRIES, "the decision table outgrew the transactions in flight");
        }
    }

    /// Note that node `n` is about to hold state of `txn` (before the message that makes it
    /// hold any), adding it to the nodes `touched` so far: the first one makes the transaction
    /// `Active`, so that the decision table answers participants' questions from then on.
    pub fn touch(&self, txn: TxnId, touched: &mut Vec<NodeId>, n: NodeId) {
        if touched.contains(&n) {
            return;
        }
        if touched.is_empty() {
            self.set(txn, TxnStatus::Active);
        }
        touched.push(n);
    }

    /// Forget a transaction once every participant acknowledged the outcome.
    pub fn forget(&self, txn: TxnId) {
        self.status.borrow_mut().remove(&txn);
    }

    pub fn get(&self, txn: TxnId) -> TxnStatus {
        self.status.borrow().get(&txn).map_or(TxnStatus::Aborted, |e| e.0)
    }

    /// The status, the timestamp of a commit that carries one (0 otherwise), and its epoch.
    pub fn get_at(&self, txn: TxnId) -> (TxnStatus, u64, u64) {
        self.status.borrow().get(&txn).copied().unwrap_or((TxnStatus::Aborted, 0, 0))
    }

    /// The epoch `txn` ran in, as the decision table knows it (this worker's current one
    /// otherwise).
    pub fn epoch_of(&self, txn: TxnId) -> u64 {
        self.status.borrow().get(&txn).map_or(self.epoch.get(), |e| e.2)
    }

    pub fn len(&self) -> usize {
        self.status.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Participant-side state of remote transactions on one worker, with last-heard times.
pub struct PartTable<S> {
    pub txns: RefCell<FxHashMap<TxnId, (S, u64)>>,
}

impl<S> Default for PartTable<S> {
    fn default() -> Self {
        PartTable { txns: RefCell::new(FxHashMap::default()) }
    }
}

impl<S> PartTable<S> {
    /// Transactions not heard of for `idle_ns` (their coordinator may have failed to reach us).
    /// The table holds one entry per remote transaction in flight here (bounded by the
    /// coordinators' transactions in flight; checked here, on the sweeper's every round).
    pub fn idle(&self, now_ns: u64, idle_ns: u64) -> Vec<TxnId> {
        debug_assert!(self.txns.borrow().len() <= MAX_TABLE_ENTRIES, "the participant table leaks");
        self.txns
            .borrow()
            .iter()
            .filter(|(_, (_, t))| now_ns.saturating_sub(*t) >= idle_ns)
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn touch(&self, txn: TxnId, now_ns: u64) {
        if let Some(e) = self.txns.borrow_mut().get_mut(&txn) {
            e.1 = now_ns;
        }
    }

    pub fn remove(&self, txn: TxnId) -> Option<S> {
        self.txns.borrow_mut().remove(&txn).map(|e| e.0)
    }

    pub fn contains(&self, txn: TxnId) -> bool {
        self.txns.borrow().contains_key(&txn)
    }
}

impl<S: Default> PartTable<S> {
    /// Note what a remote transaction holds here (its state starts empty with its first
    /// access), and that its coordinator was heard from at `now_ns`.
    pub fn remember(&self, txn: TxnId, now_ns: u64, f: impl FnOnce(&mut S)) {
        let mut txns = self.txns.borrow_mut();
        let e = txns.entry(txn).or_insert_with(|| (S::default(), now_ns));
        e.1 = now_ns;
        f(&mut e.0);
    }
}

/// Send a decision (an encoded request) to the participants on `nodes` in the background; the
/// RPC layer resends it on lossy links. Once all acknowledged, forget `forget` (a commit); until
/// then a participant that lost the message can ask ([`spawn_sweeper`]).
pub fn tell_outcome<C: Cc>(me: Rc<CcWorker<C>>, body: Vec<u8>, nodes: Vec<NodeId>, forget: Option<TxnId>) {
    if nodes.is_empty() {
        return;
    }
    let w = me.w.clone();
    w.spawn(async move {
        let calls: Vec<_> = nodes.iter().map(|&n| me.w.call(me.participant_addr(n), body.clone())).collect();
        let acked = crate::rt::join_all(calls).await.iter().all(|r| r.is_ok());
        if let (true, Some(txn)) = (acked, forget) {
            me.coord.forget(txn);
            // Not waited for: a lost `Ended` only makes a restarted coordinator ask again.
            let _ = me.txn_log().append_ended(txn);
        }
    });
}

/// After a restart: the commits this worker decided before the crash that some participant
/// may not have heard are committed in the decision table again and resent until acknowledged.
pub fn resend_unended<C: Cc>(me: &Rc<CcWorker<C>>, unended: durable::Unended) {
    for (txn, nodes, ts, epoch) in unended {
        me.coord.set_committed_in(txn, ts, epoch);
        let commit = skeleton::Termination::Commit { txn, ts, epoch };
        resend_until_acked(me.clone(), skeleton::termination(&commit), nodes, txn);
    }
}

/// Like [`tell_outcome`] for a commit, but a timeout does not give up: a restarted coordinator
/// must get its decision through (a participant may be down for a while).
fn resend_until_acked<C: Cc>(me: Rc<CcWorker<C>>, body: Vec<u8>, nodes: Vec<NodeId>, txn: TxnId) {
    let w = me.w.clone();
    w.spawn(async move {
        let mut left = nodes;
        while !left.is_empty() {
            let calls: Vec<_> = left.iter().map(|&n| me.w.call(me.participant_addr(n), body.clone())).collect();
            let replies = crate::rt::join_all(calls).await;
            left = left.into_iter().zip(replies).filter(|(_, r)| r.is_err()).map(|(n, _)| n).collect();
        }
        me.coord.forget(txn);
        let _ = me.txn_log().append_ended(txn);
    });
}

/// Run the orphan sweeper on a worker: every `orphan_after / 2`, ask the coordinator of each
/// transaction idle for `orphan_after` what became of it, and apply the answer. This is 2PC's
/// termination protocol; it makes lost prepare, commit and abort messages harmless.
pub fn spawn_sweeper<C: Cc>(me: &Rc<CcWorker<C>>, orphan_after_us: u64) {
    let weak = Rc::downgrade(me);
    let w = me.w.clone();
    w.spawn(async move {
        let period = (orphan_after_us / 2).max(1000);
        loop {
            let Some(w) = weak.upgrade().map(|m| m.w.clone()) else { return };
            w.sleep_us(period).await;
            let Some(me) = weak.upgrade() else { return };
            for txn in me.parts.idle(w.now_ns(), orphan_after_us * 1000) {
                w.count("orphan-queries", 1);
                let me = me.clone();
                w.spawn(async move {
                    let question = skeleton::termination(&skeleton::Termination::Status { txn });
                    if let Ok(body) = me.w.call(coordinator_of(txn), question).await {
                        if let Some((s, ts, epoch)) = skeleton::parse_status(&body) {
                            me.resolve(txn, s, ts, epoch);
                        }
                    }
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_table_follows_presumed_abort() {
        let t = CoordTable::new(1);
        let a = t.new_txn(Addr::new(0, 0));
        assert_eq!(t.get(a), TxnStatus::Aborted, "unknown reads as aborted");
        t.set(a, TxnStatus::Active);
        assert_eq!(t.get(a), TxnStatus::Active);
        t.set(a, TxnStatus::Committed);
        assert_eq!(t.get(a), TxnStatus::Committed, "kept until every participant acknowledged");
        t.forget(a);
        assert_eq!((t.get(a), t.len()), (TxnStatus::Aborted, 0));
        let b = t.new_txn(Addr::new(0, 0));
        t.set(b, TxnStatus::Active);
        t.set(b, TxnStatus::Aborted);
        assert!(t.is_empty(), "an abort is forgotten at once");
    }

    #[test]
    #[should_panic(expected = "committed -> aborted")]
    fn a_commit_decision_never_changes() {
        let t = CoordTable::new(1);
        let a = t.new_txn(Addr::new(0, 0));
        t.set(a, TxnStatus::Active);
        t.set(a, TxnStatus::Committed);
        t.set(a, TxnStatus::Aborted);
    }

    #[test]
    fn txn_ids_name_their_coordinator() {
        let a = Addr::new(513, 7);
        let id = txn_id(a, 3, 123_456);
        assert_eq!(coordinator_of(id), a);
        assert_eq!(id & ((1 << 36) - 1), 123_456);
        assert_ne!(id, txn_id(a, 4, 123_456), "another boot, another id");
    }
}
