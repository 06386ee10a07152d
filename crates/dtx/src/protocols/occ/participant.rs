//! What a node does for OCC transactions, whether the coordinator is local (called inline) or
//! remote (through [`Participant::serve`]): read with version, lock a write set without
//! waiting, validate a read set, install and unlock.

use super::messages::{Reply, Request};
use super::meta::OccMeta;
use super::{Occ, OccWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{Record, RowKey, Storage, Value};
use crate::txn::Scan;

pub type Writes = Vec<(RowKey, Option<Value>)>;

pub type Rec = Record<OccMeta>;

/// The committed value and version of a record.
#[inline]
pub fn read_rec(rec: &Rec) -> (Option<Value>, u64) {
    let row = rec.lock();
    (row.value.clone(), row.meta.tid)
}

/// The committed value and version of a record (absent records have version 0).
#[inline]
pub fn read(store: &Storage<OccMeta>, key: RowKey) -> (Option<Value>, u64) {
    store.get(key).map_or((None, 0), read_rec)
}

/// Existing rows in a scan range, with versions.
pub fn scan(store: &Storage<OccMeta>, s: Scan) -> Vec<(u64, Value, u64)> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let row = rec.lock();
        if let Some(v) = &row.value {
            out.push((k, v.clone(), row.meta.tid));
        }
    }
    out
}

/// Lock every record for `txn`, or none: on a conflict the ones taken are released.
pub fn lock_recs<'s>(txn: TxnId, recs: impl Iterator<Item = &'s Rec> + Clone) -> bool {
    for (i, rec) in recs.clone().enumerate() {
        let mut row = rec.lock();
        if row.meta.locked_by != 0 && row.meta.locked_by != txn {
            drop(row);
            unlock_recs(txn, recs.take(i));
            return false;
        }
        row.meta.locked_by = txn;
    }
    true
}

/// Lock every written record for `txn`, or none (a remote participant's entry point).
pub fn lock_writes(store: &Storage<OccMeta>, txn: TxnId, writes: &Writes) -> bool {
    let recs: Vec<&Rec> = writes.iter().map(|(k, _)| store.get_or_create(*k)).collect();
    lock_recs(txn, recs.iter().copied())
}

/// A read of version `tid` (of `rec`, or of an absent record if `None`) is still current and
/// not locked by another transaction.
#[inline]
pub fn validate_rec(rec: Option<&Rec>, tid: u64, txn: TxnId) -> bool {
    match rec {
        Some(rec) => rec.lock().meta.validates(tid, txn),
        None => tid == 0,
    }
}

/// Every read version is current and not locked by another transaction.
pub fn validate(store: &Storage<OccMeta>, txn: TxnId, mut reads: impl Iterator<Item = (RowKey, u64)>) -> bool {
    reads.all(|(key, tid)| validate_rec(store.get(key), tid, txn))
}

/// Install one write of a committed transaction and release its lock.
#[inline]
pub fn install_rec(rec: &Rec, txn: TxnId, value: Option<Value>) {
    let mut row = rec.lock();
    assert_eq!(row.meta.locked_by, txn, "installing a record without holding its lock");
    let old = std::mem::replace(&mut row.value, value);
    // Versions only grow: a validation that saw `tid` must fail after this install.
    row.meta.tid = row.meta.tid.checked_add(1).expect("a record's version wrapped");
    row.meta.locked_by = 0;
    // Outside the record's lock: freeing (or keeping) the old value is no part of installing.
    drop(row);
    Value::recycle(old);
}

pub fn unlock_recs<'s>(txn: TxnId, recs: impl Iterator<Item = &'s Rec>) {
    for rec in recs {
        let mut row = rec.lock();
        if row.meta.locked_by == txn {
            row.meta.locked_by = 0;
        }
    }
}

pub fn unlock(store: &Storage<OccMeta>, txn: TxnId, keys: impl Iterator<Item = RowKey>) {
    unlock_recs(txn, keys.filter_map(|k| store.get(k)));
}

impl OccWorker {
    /// Keep the writes of a transaction whose locks are held here and vote yes; with a log, a
    /// yes vote is a promise that survives a crash: the writes are logged first.
    fn prepare(&self, from: Addr, rpc_id: u64, txn: TxnId, writes: Writes, now: u64) {
        // Without a log there is nothing to append (`None`).
        let Ok(lsn) = self.append_prepared(txn, &writes, &()) else {
            unlock(&self.node.store, txn, writes.iter().map(|w| w.0));
            return self.w.reply(from, rpc_id, &encode(&Reply::Vote(false)));
        };
        self.parts.txns.borrow_mut().insert(txn, (writes, now));
        self.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Vote(true)));
    }

    /// Vote yes for a valid read set. What it read may be the write of a local commit whose
    /// record is not durable yet (early lock release, see the coordinator's `commit_here`): the
    /// vote that lets it commit waits for the log's tail.
    fn vote_valid(&self, from: Addr, rpc_id: u64) {
        let tail = self.node.log.read_fence();
        self.reply_when_durable(from, rpc_id, tail, encode(&Reply::Vote(true)));
    }
}

/// What a node does for OCC transactions, as the 2PC skeleton calls it.
impl Participant for Occ {
    type Part = Writes;

    fn serve(wk: &OccWorker, from: Addr, rpc_id: u64, req: Request) {
        let store = &wk.node.store;
        let now = wk.w.now_ns();
        let reply = match req {
            Request::Read { keys } => {
                wk.w.charge_ops(keys.len());
                Reply::Values(keys.iter().map(|k| read(store, *k)).collect())
            }
            Request::Scan { scan: s } => {
                let rows = scan(store, s);
                wk.w.charge_ops(rows.len() + 1);
                Reply::Rows(rows)
            }
            Request::Lock { txn, .. } | Request::LockValidate { txn, .. } if wk.parts.contains(txn) => {
                // A copy of a request this node prepared (a resend that reached the node's next
                // incarnation, whose RPC layer never saw the first): its vote stands, and its
                // prepared record, replayed, is durable. Run again, a failed validation would
                // release the locks of a transaction still in doubt.
                Reply::Vote(true)
            }
            Request::Lock { txn, writes } => {
                wk.w.charge_ops(writes.len());
                if !lock_writes(store, txn, &writes) {
                    Reply::Vote(false)
                } else {
                    return wk.prepare(from, rpc_id, txn, writes, now);
                }
            }
            Request::Validate { txn, reads } => {
                wk.w.charge_ops(reads.len());
                wk.parts.touch(txn, now);
                if validate(store, txn, reads.into_iter()) {
                    return wk.vote_valid(from, rpc_id);
                }
                Reply::Vote(false)
            }
            Request::LockValidate { txn, writes, reads } => {
                wk.w.charge_ops(writes.len() + reads.len());
                if !lock_writes(store, txn, &writes) {
                    Reply::Vote(false)
                } else if !validate(store, txn, reads.into_iter()) {
                    // Nothing is kept for an invalid transaction: the coordinator aborts
                    // without telling this node.
                    unlock(store, txn, writes.iter().map(|w| w.0));
                    Reply::Stale
                } else if writes.is_empty() {
                    return wk.vote_valid(from, rpc_id);
                } else {
                    // The prepared record follows the log's tail, so that waiting for it also
                    // covers what `vote_valid` waits for.
                    return wk.prepare(from, rpc_id, txn, writes, now);
                }
            }
        };
        wk.w.reply(from, rpc_id, &encode(&reply));
    }

    /// Install a prepared transaction's writes and log the outcome (before the locks go, so
    /// that log order is install order).
    ///
    /// Its decisions carry no timestamp.
    fn commit_here(wk: &OccWorker, txn: TxnId, _ts: u64) {
        if let Some(writes) = wk.parts.remove(txn) {
            wk.w.charge_ops(writes.len());
            let recs: Vec<&Rec> = writes.iter().map(|(k, _)| wk.node.store.get_or_create(*k)).collect();
            wk.log_commit_here(txn, 0);
            for (rec, (_, v)) in recs.into_iter().zip(writes) {
                install_rec(rec, txn, v);
            }
        }
    }

    fn abort_here(wk: &OccWorker, txn: TxnId) {
        if let Some(writes) = wk.parts.remove(txn) {
            wk.log_abort_here(txn);
            unlock(&wk.node.store, txn, writes.iter().map(|w| w.0));
        }
    }

    /// Transactions prepared here before a crash: their records are locked again and the
    /// orphan sweeper asks their coordinators what became of them.
    fn adopt_in_doubt(wk: &OccWorker, in_doubt: InDoubt<()>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes, ()) in in_doubt {
            let locked = lock_writes(&wk.node.store, txn, &writes);
            assert!(locked, "a recovered node has no other lock holders");
            wk.parts.txns.borrow_mut().insert(txn, (writes, now));
        }
    }

    fn peek(wk: &OccWorker, key: RowKey) -> Option<Value> {
        read(&wk.node.store, key).0
    }

    fn peek_scan(wk: &OccWorker, s: Scan) -> Vec<(u64, Value)> {
        scan(&wk.node.store, s).into_iter().map(|(k, v, _)| (k, v)).collect()
    }
}
