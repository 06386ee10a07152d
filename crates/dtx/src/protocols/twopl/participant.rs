//! What a node does for 2PL transactions: take locks (inline for a local coordinator, through
//! [`Participant::serve`] for a remote one), hold prepared writes, apply or roll back.

use super::messages::{Reply, Request, Vote};
use super::meta::LockRecord;
use super::{TwoPl, TwoPlWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::record_lock::{
    self as locks, try_lock_rec, LockMeta, LockStep, Mode, Policy, Prio, WaitSlot,
};
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{RowKey, Storage, Value};
use crate::txn::{Abort, Scan, TxnResult};
use std::sync::Arc;

pub type Writes = Vec<(RowKey, Option<Value>)>;

/// A remote transaction's state on this participant.
#[derive(Default)]
pub struct PartTxn {
    pub held: Vec<RowKey>,
    pub writes: Option<Writes>,
}

/// Ask for `key`'s lock in 2PL's store without waiting (the record is made if missing).
pub fn try_lock<'s>(
    store: &'s Storage<LockMeta>,
    key: RowKey,
    txn: TxnId,
    prio: Prio,
    mode: Mode,
    policy: Policy,
) -> TxnResult<LockStep<'s>> {
    try_lock_rec(store.get_or_create(key), txn, prio, mode, policy)
}

/// Release what `txn` holds on these keys.
pub fn release(store: &Storage<LockMeta>, txn: TxnId, keys: impl Iterator<Item = RowKey>) {
    for key in keys {
        if let Some(rec) = store.get(key) {
            rec.lock().meta.release(txn);
        }
    }
}

/// Whether `txn` holds `key`'s exclusive lock here.
fn holds_exclusive(store: &Storage<LockMeta>, txn: TxnId, key: RowKey) -> bool {
    store.get(key).is_some_and(|rec| rec.lock().meta.holds(txn, Mode::Exclusive))
}

/// Install one write of `txn`, which holds the record's exclusive lock.
pub fn apply_rec(rec: &LockRecord, txn: TxnId, value: Option<Value>) {
    let mut row = rec.lock();
    assert!(row.meta.holds(txn, Mode::Exclusive), "writing a record without its exclusive lock");
    let old = std::mem::replace(&mut row.value, value);
    // Outside the record's lock: freeing (or keeping) the old value is no part of installing.
    drop(row);
    Value::recycle(old);
}

/// Apply writes (the writer holds their exclusive locks), then release everything it holds.
pub fn apply_and_release(store: &Storage<LockMeta>, txn: TxnId, writes: &Writes, held: &[RowKey]) {
    for (key, value) in writes {
        let rec = store.get_or_create(*key);
        let mut row = rec.lock();
        assert!(row.meta.holds(txn, Mode::Exclusive), "writing {key:?} without its exclusive lock");
        row.value = value.clone();
    }
    release(store, txn, held.iter().copied());
}

impl TwoPlWorker {
    /// Wait for `txn`'s queued request on `key` (its record `rec`), at most `lock_wait_us`;
    /// under DETECT the wait is in the node's table while it lasts, for the detector to see
    /// and end, and unless `detect=off` its node searches for the cycle it may close.
    pub async fn wait_queued(
        &self,
        txn: TxnId,
        key: RowKey,
        rec: &LockRecord,
        slot: Arc<WaitSlot>,
    ) -> TxnResult<Option<Value>> {
        let _listed = (self.cc.policy == Policy::Detect).then(|| {
            let listed = self.state.enter(txn, key, slot.clone(), self.w.now_us());
            if self.cc.detects() {
                self.break_cycle_at(txn, key);
            }
            listed
        });
        locks::wait_lock_under(&self.w, rec, slot, self.cc.lock_wait_us, self.cc.policy).await
    }

    /// DETECT, as `txn`'s wait for `key` starts: if it closes a cycle of waits on this node,
    /// end the wait of a transaction of the cycle chosen at random (the detector's rule, with
    /// no delay and no message; [`super::deadlock::WaitTable::cycle_through`]).
    fn break_cycle_at(&self, txn: TxnId, key: RowKey) {
        use super::deadlock::{CYCLE_LEN, DEADLOCKS_FOUND, FOUND_AT_WAIT};
        let (cycle, visited) = self.state.cycle_through(&self.node.store, txn, key);
        self.w.charge_ops(visited);
        let Some(cycle) = cycle else { return super::deadlock::tell_detector(self) };
        let (victim, victim_key) = cycle[rand::Rng::gen_range(&mut *self.w.rng.borrow_mut(), 0..cycle.len())];
        // On threads, another worker may have ended a wait of it meanwhile.
        if !self.state.kill(&self.node.store, victim, victim_key) {
            return;
        }
        self.w.count(DEADLOCKS_FOUND, 1);
        self.w.count(FOUND_AT_WAIT, 1);
        self.w.count(CYCLE_LEN, cycle.len() as u64);
    }

    fn part_entry(&self, txn: TxnId) {
        let now = self.w.now_ns();
        let mut parts = self.parts.txns.borrow_mut();
        parts.entry(txn).or_insert_with(|| (PartTxn::default(), now)).1 = now;
    }

    /// Record a lock taken for `txn`; if the transaction was aborted meanwhile, give it back.
    fn note_held(&self, txn: TxnId, key: RowKey) -> bool {
        match self.parts.txns.borrow_mut().get_mut(&txn) {
            Some((p, _)) => {
                p.held.push(key);
                true
            }
            None => {
                release(&self.node.store, txn, std::iter::once(key));
                false
            }
        }
    }

    fn serve_lock(&self, from: Addr, rpc_id: u64, txn: TxnId, prio: Prio, keys: Vec<(RowKey, Mode)>) {
        self.part_entry(txn);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let reply = me.lock_all(txn, prio, &keys).await;
            me.w.reply(from, rpc_id, &encode(&reply));
        });
    }

    async fn lock_all(&self, txn: TxnId, prio: Prio, keys: &[(RowKey, Mode)]) -> Reply {
        let mut values = Vec::with_capacity(keys.len());
        for &(key, mode) in keys {
            self.w.charge_ops(1);
            match self.lock(key, txn, prio, mode).await {
                Ok(v) => {
                    if !self.note_held(txn, key) {
                        return Reply::Aborted(Abort::ParticipantLost);
                    }
                    values.push(v);
                }
                Err(a) => return Reply::Aborted(a),
            }
        }
        Reply::Values(values)
    }

    /// Take a lock for a remote transaction, waiting if the policy says so.
    async fn lock(&self, key: RowKey, txn: TxnId, prio: Prio, mode: Mode) -> TxnResult<Option<Value>> {
        match try_lock(&self.node.store, key, txn, prio, mode, self.cc.policy)? {
            LockStep::Done(v) => Ok(v),
            LockStep::Wait(rec, slot) => self.wait_queued(txn, key, rec, slot).await,
        }
    }

    fn serve_scan(&self, from: Addr, rpc_id: u64, txn: TxnId, prio: Prio, scan: Scan) {
        self.part_entry(txn);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let keys: Vec<(RowKey, Mode)> = me
                .node
                .store
                .table(scan.table)
                .range(scan.lo, scan.hi, scan.limit as usize, scan.descending)
                .into_iter()
                .map(|(k, _)| (RowKey::new(scan.table, k), Mode::Shared))
                .collect();
            let reply = match me.lock_all(txn, prio, &keys).await {
                Reply::Values(vals) => {
                    Reply::Rows(keys.iter().zip(vals).filter_map(|((k, _), v)| v.map(|v| (k.key, v))).collect())
                }
                other => other,
            };
            me.w.reply(from, rpc_id, &encode(&reply));
        });
    }
}

/// What a node does for 2PL transactions, as the 2PC skeleton calls it.
impl Participant for TwoPl {
    type Part = PartTxn;

    fn serve(wk: &TwoPlWorker, from: Addr, rpc_id: u64, req: Request) {
        let now = wk.w.now_ns();
        let store = &wk.node.store;
        let reply = match req {
            Request::Lock { again: true, txn, .. } | Request::Scan { again: true, txn, .. }
                if !wk.parts.txns.borrow().contains_key(&txn) =>
            {
                // Its earlier locks here died with an earlier incarnation of this node (or it
                // was aborted here meanwhile): it cannot go on with only the locks asked now.
                Reply::Aborted(Abort::ParticipantLost)
            }
            Request::Lock { txn, prio, keys, .. } => return wk.serve_lock(from, rpc_id, txn, prio, keys),
            Request::Waits => {
                wk.state.asked();
                let (waits, dropped) = wk.state.snapshot(store, wk.w.now_us());
                super::deadlock::charge_snapshot(&wk.w, &waits);
                wk.w.count(super::deadlock::EDGES_DROPPED, dropped);
                Reply::Waits(waits)
            }
            Request::Kill { txn, key } => Reply::Killed(wk.state.kill(store, txn, key)),
            Request::Poke => {
                wk.state.poke();
                Reply::Poked
            }
            Request::Scan { txn, prio, scan, .. } => return wk.serve_scan(from, rpc_id, txn, prio, scan),
            Request::Prepare { txn, writes } => {
                let mut parts = wk.parts.txns.borrow_mut();
                match parts.get_mut(&txn) {
                    None => Reply::Vote(Vote::Lost),
                    Some((p, _)) if writes.is_empty() => {
                        let held = std::mem::take(&mut p.held);
                        parts.remove(&txn);
                        drop(parts);
                        wk.w.charge_ops(held.len());
                        release(store, txn, held.into_iter());
                        // It may have read a local commit whose record is not durable yet
                        // (early lock release): the vote that lets it commit waits for it.
                        let tail = wk.node.log.read_fence();
                        return wk.reply_when_durable(from, rpc_id, tail, encode(&Reply::Vote(Vote::ReadOnly)));
                    }
                    Some(_) if !writes.iter().all(|(k, _)| holds_exclusive(store, txn, *k)) => {
                        // Writes whose locks this incarnation does not hold (taken by an
                        // earlier one, lost with it): no yes vote without them.
                        drop(parts);
                        Self::abort_here(wk, txn);
                        Reply::Vote(Vote::Lost)
                    }
                    Some((p, t)) => {
                        *t = now;
                        // A yes vote is a promise that survives a crash: log the writes first.
                        let lsn = wk.append_prepared(txn, &writes, &());
                        p.writes = Some(writes);
                        drop(parts);
                        match lsn {
                            Ok(lsn) => {
                                return wk.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Vote(Vote::Yes)))
                            }
                            Err(a) => {
                                Self::abort_here(wk, txn);
                                Reply::Aborted(a)
                            }
                        }
                    }
                }
            }
        };
        wk.w.reply(from, rpc_id, &encode(&reply));
    }

    /// Apply a prepared transaction's writes, log the outcome (before the locks go, so that
    /// log order is install order), release.
    ///
    /// Its decisions carry no timestamp.
    fn commit_here(wk: &TwoPlWorker, txn: TxnId, _ts: u64) {
        if let Some(p) = wk.parts.remove(txn) {
            let writes = p.writes.unwrap_or_default();
            wk.w.charge_ops(p.held.len());
            wk.log_commit_here(txn, 0);
            apply_and_release(&wk.node.store, txn, &writes, &p.held);
        }
    }

    fn abort_here(wk: &TwoPlWorker, txn: TxnId) {
        if wk.cc.policy == Policy::Detect {
            // A request of it still queued here would block others until its bound.
            wk.state.end_waits_of(&wk.node.store, txn);
        }
        if let Some(p) = wk.parts.remove(txn) {
            if p.writes.is_some() {
                wk.log_abort_here(txn);
            }
            release(&wk.node.store, txn, p.held.into_iter());
        }
    }

    /// Take over transactions prepared here before a crash: their records are locked again
    /// and the orphan sweeper asks their coordinators what became of them.
    fn adopt_in_doubt(wk: &TwoPlWorker, in_doubt: InDoubt<()>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes, ()) in in_doubt {
            let held: Vec<RowKey> = writes.iter().map(|w| w.0).collect();
            for &k in &held {
                let got = try_lock(&wk.node.store, k, txn, Prio(0, txn), Mode::Exclusive, Policy::NoWait);
                assert!(matches!(got, Ok(LockStep::Done(_))), "a recovered node has no other lock holders");
            }
            wk.parts.txns.borrow_mut().insert(txn, (PartTxn { held, writes: Some(writes) }, now));
        }
    }
}
