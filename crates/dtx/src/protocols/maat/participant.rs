//! What a node does for MaaT transactions: the operations on its records and time table, under
//! the node's one latch, whether the coordinator is local (called inline) or remote (through
//! [`Participant::serve`], with the transaction's participant state in the worker's table).

use super::messages::{Reply, Request};
use super::meta::MaatMeta;
use super::range::{Entry, Order, TimeTable, Validation};
use super::{Maat, MaatNode, MaatWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{RowKey, Storage, Value};
use crate::txn::{Abort, Scan};

pub type Writes = Vec<(RowKey, Option<Value>)>;
type Store = Storage<MaatMeta>;

/// A remote transaction's state at a participant: what it holds soft locks on, and the writes
/// it installs if it commits.
#[derive(Debug, Default)]
pub struct PartTxn {
    pub reads: Vec<RowKey>,
    pub write_locks: Vec<RowKey>,
    pub writes: Writes,
}

/// A record's committed value and write timestamp, without a soft lock (reconnaissance).
pub fn peek(store: &Store, key: RowKey) -> (Option<Value>, u64) {
    store.get(key).map_or((None, 0), |r| {
        let row = r.lock();
        (row.value.clone(), row.meta.wts)
    })
}

/// The existing rows of a range, without soft locks (reconnaissance).
pub fn peek_scan(store: &Store, s: Scan) -> Vec<(u64, Value, u64)> {
    let rows = store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending);
    rows.into_iter()
        .filter_map(|(k, r)| {
            let row = r.lock();
            row.value.clone().map(|v| (k, v, row.meta.wts))
        })
        .collect()
}

/// `txn` reads a record (under the node's latch): a soft read lock, and its range moved before
/// every validated writer of it. A `fresh` read is refused instead while a validated writer
/// holds the record.
fn hold_read(table: &mut TimeTable, meta: &mut MaatMeta, txn: TxnId, fresh: bool) -> Result<(), Abort> {
    if fresh && meta.writers.iter().any(|w| *w != txn && table.get(*w).is_some_and(|e| e.validated)) {
        return Err(Abort::Protocol(super::range::FRESH));
    }
    MaatMeta::hold(&mut meta.readers, txn);
    table.entry(txn);
    for &w in &meta.writers {
        table.respect_validated(txn, w, Order::Before);
    }
    Ok(())
}

impl MaatNode {
    /// Read `key` for `txn`: the committed value and its write timestamp, holding a soft read
    /// lock. An absent record is made (empty) so that the lock has a place: a later insert
    /// conflicts with this read.
    ///
    /// A `fresh` read (one that must see every acknowledged write: `Attempt::fresh`) is refused
    /// while a validated writer holds the record: its commit may be acknowledged already and not
    /// installed here yet (a plain read would be placed before it, which serializability allows).
    pub fn read(&self, store: &Store, txn: TxnId, key: RowKey, fresh: bool) -> Result<(Option<Value>, u64), Abort> {
        let mut l = self.latch.lock();
        let rec = store.get_or_create(key);
        let mut row = rec.lock();
        hold_read(&mut l.table, &mut row.meta, txn, fresh)?;
        Ok((row.value.clone(), row.meta.wts))
    }

    /// Hold a soft write lock on `key` for `txn` (the value comes at validation).
    pub fn lock_write(&self, store: &Store, txn: TxnId, key: RowKey) {
        let mut l = self.latch.lock();
        let rec = store.get_or_create(key);
        let mut row = rec.lock();
        MaatMeta::hold(&mut row.meta.writers, txn);
        l.table.entry(txn);
        for &o in row.meta.readers.iter().chain(&row.meta.writers) {
            l.table.respect_validated(txn, o, Order::After);
        }
    }

    /// The existing rows of a range, each read (and soft-locked) as [`MaatNode::read`] reads.
    /// Gaps are not locked (no phantom protection, as for the other protocols' scans).
    pub fn scan(&self, store: &Store, txn: TxnId, s: Scan, fresh: bool) -> Result<Vec<(u64, Value, u64)>, Abort> {
        let mut l = self.latch.lock();
        l.table.entry(txn);
        let mut out = Vec::new();
        for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
            let mut row = rec.lock();
            let Some(v) = row.value.clone() else { continue };
            hold_read(&mut l.table, &mut row.meta, txn, fresh)?;
            out.push((k, v, row.meta.wts));
        }
        Ok(out)
    }

    /// Validate `txn` here: after every version it read and every committed access to what it
    /// writes, around every transaction that holds a soft lock on what it accessed. The range
    /// it may commit in here, frozen; or why there is none (its locks are then released).
    pub fn validate(
        &self,
        store: &Store,
        txn: TxnId,
        reads: &[(RowKey, u64)],
        writes: &[RowKey],
    ) -> Result<(u64, u64), Abort> {
        let mut l = self.latch.lock();
        let mut v = Validation::start(&mut l.table, txn);
        for &(key, wts) in reads {
            v.after_ts(wts);
            if let Some(rec) = store.get(key) {
                for &w in &rec.lock().meta.writers {
                    v.conflict(&l.table, w, Order::Before);
                }
            }
        }
        for &key in writes {
            let rec = store.get_or_create(key);
            let mut row = rec.lock();
            MaatMeta::hold(&mut row.meta.writers, txn);
            v.after_ts(row.meta.wts.max(row.meta.rts).max(self.floor));
            for &o in row.meta.readers.iter().chain(&row.meta.writers) {
                v.conflict(&l.table, o, Order::After);
            }
        }
        v.finish(&mut l.table).map_err(Abort::Protocol)
    }

    /// `txn` committed at `ts`: install its writes (over older versions only: the Thomas write
    /// rule, since decisions may arrive out of timestamp order), record its reads' timestamp,
    /// and drop its soft locks and its range.
    pub fn commit(&self, store: &Store, txn: TxnId, ts: u64, reads: &[RowKey], write_locks: &[RowKey], writes: Writes) {
        let mut l = self.latch.lock();
        match l.table.remove(txn) {
            Some(e) if e.validated => {
                assert!(e.lower <= ts && ts <= e.upper, "txn {txn:x} commits at {ts} outside its range {e:?}")
            }
            // Validated by an earlier incarnation of this node (its range and vote came from
            // there, and its writes, if any, were in the log this one was rebuilt from): what
            // it holds here are soft locks a late copy of a read request left, which go now.
            _ => assert!(writes.is_empty(), "txn {txn:x} installs writes at {ts} without validating here"),
        }
        for (key, value) in writes {
            let rec = store.get_or_create(key);
            let mut row = rec.lock();
            row.meta.release(txn);
            // Every reader that committed meanwhile was placed before this writer.
            debug_assert!(ts > row.meta.rts, "txn {txn:x} installs at {ts} under a read at {}", row.meta.rts);
            if ts > row.meta.wts {
                let old = std::mem::replace(&mut row.value, value);
                row.meta.wts = ts;
                drop(row);
                Value::recycle(old);
            }
        }
        for key in reads {
            if let Some(rec) = store.get(*key) {
                let mut row = rec.lock();
                row.meta.release(txn);
                row.meta.rts = row.meta.rts.max(ts);
            }
        }
        for key in write_locks {
            if let Some(rec) = store.get(*key) {
                rec.lock().meta.release(txn);
            }
        }
    }

    /// `txn` aborted: drop its soft locks and its range.
    pub fn abort(&self, store: &Store, txn: TxnId, keys: impl Iterator<Item = RowKey>) {
        let mut l = self.latch.lock();
        l.table.remove(txn);
        for key in keys {
            if let Some(rec) = store.get(key) {
                rec.lock().meta.release(txn);
            }
        }
    }

    /// A prepared transaction recovered from the log: validated here with the range its vote
    /// logged, so that readers of what it writes go before it, writers after it, and a resent
    /// request gets the answer the lost one carried (a wider range would let its coordinator
    /// commit it past a writer its reads here were ordered before).
    pub fn adopt(&self, store: &Store, txn: TxnId, (lower, upper): (u64, u64), writes: &Writes) {
        let mut l = self.latch.lock();
        *l.table.entry(txn) = Entry { lower, upper, validated: true, frozen_hit: false };
        for (key, _) in writes {
            MaatMeta::hold(&mut store.get_or_create(*key).lock().meta.writers, txn);
        }
    }
}

impl MaatWorker {
    fn validate(&self, from: Addr, rpc_id: u64, txn: TxnId, reads: Vec<(RowKey, u64)>, writes: Writes, now: u64) {
        self.w.charge_ops(reads.len() + writes.len());
        let validated = self.state.latch.lock().table.get(txn).filter(|e| e.validated);
        if let Some(e) = validated {
            // Validated already (a request resent to a restarted node that recovered the vote):
            // the range is frozen; the same answer again.
            let (bound, lsn) = self.state.grant(&self.node.log, e.lower).unwrap_or((0, None));
            let reply = Reply::Range { lower: e.lower, upper: e.upper, bound };
            return self.reply_when_durable(from, rpc_id, lsn, encode(&reply));
        }
        if !reads.is_empty() && !self.parts.contains(txn) {
            // Its soft read locks were dropped (the sweeper aborted it): nobody ordered it.
            return self.w.reply(from, rpc_id, &encode(&Reply::No(Abort::ParticipantLost)));
        }
        let write_keys: Vec<RowKey> = writes.iter().map(|w| w.0).collect();
        self.parts.remember(txn, now, |p| p.write_locks.extend_from_slice(&write_keys));
        let (lower, upper) = match self.state.validate(&self.node.store, txn, &reads, &write_keys) {
            Ok(r) => r,
            Err(a) => {
                Maat::abort_here(self, txn);
                return self.w.reply(from, rpc_id, &encode(&Reply::No(a)));
            }
        };
        let granted = self.state.grant(&self.node.log, lower);
        // A read-only part rests on reads alone: fenced, so that a deposed incarnation of this
        // node cannot vote for it.
        let prepared = if writes.is_empty() {
            Ok(self.node.log.read_fence())
        } else {
            self.append_prepared(txn, &writes, &(lower, upper))
        };
        let (Ok((bound, bound_lsn)), Ok(lsn)) = (granted, prepared) else {
            Maat::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::No(Abort::LogRefused)));
        };
        self.parts.remember(txn, now, |p| p.writes = writes);
        self.reply_when_durable(from, rpc_id, lsn.max(bound_lsn), encode(&Reply::Range { lower, upper, bound }));
    }
}

/// What a node does for MaaT transactions, as the 2PC skeleton calls it.
impl Participant for Maat {
    type Part = PartTxn;

    fn serve(wk: &MaatWorker, from: Addr, rpc_id: u64, req: Request) {
        let (store, node) = (&wk.node.store, &*wk.state);
        let now = wk.w.now_ns();
        let reply = match req {
            Request::Read { txn, keys, writes, fresh } => {
                wk.w.charge_ops(keys.len() + writes.len());
                // Its soft locks are remembered before any is taken, so that an abort here drops them.
                wk.parts.remember(txn, now, |p| {
                    p.reads.extend_from_slice(&keys);
                    p.write_locks.extend_from_slice(&writes);
                });
                let values: Result<Vec<_>, Abort> = keys.iter().map(|k| node.read(store, txn, *k, fresh)).collect();
                match values {
                    Ok(values) => {
                        writes.iter().for_each(|k| node.lock_write(store, txn, *k));
                        Reply::Values(values)
                    }
                    Err(a) => Reply::No(a),
                }
            }
            Request::Scan { txn, scan, fresh } => match node.scan(store, txn, scan, fresh) {
                Ok(rows) => {
                    wk.w.charge_ops(rows.len() + 1);
                    wk.parts.remember(txn, now, |p| p.reads.extend(rows.iter().map(|r| RowKey::new(scan.table, r.0))));
                    Reply::Rows(rows)
                }
                Err(a) => {
                    // Rows it read before the refusal hold soft locks: drop them with its range.
                    let keys = store.table(scan.table).range(scan.lo, scan.hi, scan.limit as usize, scan.descending);
                    node.abort(store, txn, keys.into_iter().map(|(k, _)| RowKey::new(scan.table, k)));
                    wk.parts.remember(txn, now, |_| {});
                    Reply::No(a)
                }
            },
            Request::Validate { txn, reads, writes } => return wk.validate(from, rpc_id, txn, reads, writes, now),
            Request::Raise { ts } => {
                let reply = match wk.state.grant(&wk.node.log, ts) {
                    Ok((_, lsn)) => return wk.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Raised)),
                    Err(a) => Reply::No(a),
                };
                return wk.w.reply(from, rpc_id, &encode(&reply));
            }
        };
        wk.w.reply(from, rpc_id, &encode(&reply));
    }

    fn commit_here(wk: &MaatWorker, txn: TxnId, ts: u64) {
        let Some(p) = wk.parts.remove(txn) else { return };
        wk.w.charge_ops(p.reads.len() + p.writes.len());
        if !p.writes.is_empty() {
            wk.log_commit_here(txn, ts);
        }
        wk.state.commit(&wk.node.store, txn, ts, &p.reads, &p.write_locks, p.writes);
    }

    fn abort_here(wk: &MaatWorker, txn: TxnId) {
        let Some(p) = wk.parts.remove(txn) else { return };
        if !p.writes.is_empty() {
            wk.log_abort_here(txn);
        }
        let keys = p.reads.into_iter().chain(p.write_locks);
        wk.state.abort(&wk.node.store, txn, keys);
    }

    /// Transactions prepared here before a crash hold their soft write locks again, frozen at
    /// the lower bound their vote logged; the orphan sweeper asks their coordinators.
    fn adopt_in_doubt(wk: &MaatWorker, in_doubt: InDoubt<(u64, u64)>) {
        for (txn, writes, range) in in_doubt {
            wk.state.adopt(&wk.node.store, txn, range, &writes);
            let write_locks = writes.iter().map(|w| w.0).collect();
            // Last heard of "never": the sweeper asks about them on its first round.
            wk.parts.txns.borrow_mut().insert(txn, (PartTxn { reads: Vec::new(), write_locks, writes }, 0));
        }
    }

    fn peek(wk: &MaatWorker, key: RowKey) -> Option<Value> {
        peek(&wk.node.store, key).0
    }

    fn peek_scan(wk: &MaatWorker, scan: Scan) -> Vec<(u64, Value)> {
        peek_scan(&wk.node.store, scan).into_iter().map(|(k, v, _)| (k, v)).collect()
    }
}
