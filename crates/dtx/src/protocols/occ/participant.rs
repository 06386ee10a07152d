//! What a node does for OCC transactions, whether the coordinator is local (called inline) or
//! remote (through [`OccWorker::on_request`]): read with version, lock a write set without
//! waiting, validate a read set, install and unlock.

use super::messages::{Reply, Request};
use super::meta::OccMeta;
use super::OccWorker;
use crate::net::{decode, encode, Addr};
use crate::protocols::common::{TxnId, TxnStatus};
use crate::rt::log_warn;
use crate::storage::{RowKey, Storage, Value};
use crate::txn::Scan;

pub type Writes = Vec<(RowKey, Option<Value>)>;

/// The committed value and version of a record (absent records have version 0).
#[inline]
pub fn read(store: &Storage<OccMeta>, key: RowKey) -> (Option<Value>, u64) {
    match store.get(key) {
        Some(rec) => {
            let row = rec.lock();
            (row.value.clone(), row.meta.tid)
        }
        None => (None, 0),
    }
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

/// Lock every written record for `txn`, or none: on a conflict the ones taken are released.
pub fn lock_writes(store: &Storage<OccMeta>, txn: TxnId, writes: &Writes) -> bool {
    for (i, (key, _)) in writes.iter().enumerate() {
        let rec = store.get_or_create(*key);
        let mut row = rec.lock();
        if row.meta.locked_by != 0 && row.meta.locked_by != txn {
            drop(row);
            unlock(store, txn, writes[..i].iter().map(|w| w.0));
            return false;
        }
        row.meta.locked_by = txn;
    }
    true
}

/// Every read version is current and not locked by another transaction.
pub fn validate(store: &Storage<OccMeta>, txn: TxnId, reads: impl Iterator<Item = (RowKey, u64)>) -> bool {
    for (key, tid) in reads {
        let ok = match store.get(key) {
            Some(rec) => rec.lock().meta.validates(tid, txn),
            None => tid == 0,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Install the writes of a committed transaction and release its locks.
pub fn install(store: &Storage<OccMeta>, txn: TxnId, writes: &Writes) {
    for (key, value) in writes {
        let rec = store.get_or_create(*key);
        let mut row = rec.lock();
        assert_eq!(row.meta.locked_by, txn, "installing {key:?} without holding its lock");
        row.value = value.clone();
        row.meta.tid += 1;
        row.meta.locked_by = 0;
    }
}

pub fn unlock(store: &Storage<OccMeta>, txn: TxnId, keys: impl Iterator<Item = RowKey>) {
    for key in keys {
        if let Some(rec) = store.get(key) {
            let mut row = rec.lock();
            if row.meta.locked_by == txn {
                row.meta.locked_by = 0;
            }
        }
    }
}

impl OccWorker {
    pub(super) fn serve(&self, from: Addr, rpc_id: u64, body: &[u8]) {
        let req: Request = match decode(body) {
            Ok(r) => r,
            Err(e) => return log_warn(&format!("occ: malformed request from {from}: {e}")),
        };
        let store = &self.node.store;
        let now = self.w.now_ns();
        let reply = match req {
            Request::Read { keys } => {
                self.w.charge_ops(keys.len());
                Reply::Values(keys.iter().map(|k| read(store, *k)).collect())
            }
            Request::Scan { scan: s } => {
                let rows = scan(store, s);
                self.w.charge_ops(rows.len() + 1);
                Reply::Rows(rows)
            }
            Request::Lock { txn, writes } => {
                self.w.charge_ops(writes.len());
                let ok = lock_writes(store, txn, &writes);
                if ok {
                    self.parts.txns.borrow_mut().insert(txn, (writes, now));
                }
                Reply::Vote(ok)
            }
            Request::Validate { txn, reads } => {
                self.w.charge_ops(reads.len());
                self.parts.touch(txn, now);
                Reply::Vote(validate(store, txn, reads.into_iter()))
            }
            Request::Commit { txn } => {
                if let Some(writes) = self.parts.remove(txn) {
                    self.w.charge_ops(writes.len());
                    install(store, txn, &writes);
                }
                Reply::Ack
            }
            Request::Abort { txn } => {
                self.abort_here(txn);
                Reply::Ack
            }
            Request::Status { txn } => Reply::Status(self.coord.get(txn)),
        };
        self.w.reply(from, rpc_id, &encode(&reply));
    }

    pub(super) fn serve_oneway(&self, from: Addr, _body: &[u8]) {
        log_warn(&format!("occ: unexpected one-way message from {from}"));
    }

    pub(super) fn abort_here(&self, txn: TxnId) {
        if let Some(writes) = self.parts.remove(txn) {
            unlock(&self.node.store, txn, writes.iter().map(|w| w.0));
        }
    }

    /// Apply what the coordinator says about a transaction we hold state for.
    pub(super) fn resolve_here(&self, txn: TxnId, status: TxnStatus) {
        match status {
            TxnStatus::Active => self.parts.touch(txn, self.w.now_ns()),
            TxnStatus::Aborted => self.abort_here(txn),
            TxnStatus::Committed => {
                if let Some(writes) = self.parts.remove(txn) {
                    install(&self.node.store, txn, &writes);
                }
            }
        }
    }
}
