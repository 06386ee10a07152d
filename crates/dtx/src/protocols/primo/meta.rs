//! What a record carries under Primo: its lease `[wts, rts]` (TicToc's, which local transactions
//! read and validate) and the lock that distributed transactions take on everything they read
//! (exclusive under WCF, shared under `wcf=off`) and local ones on what they write at commit
//! (`twopc::record_lock`). Each function
//! here runs under the record's latch, so a read sees a value with its own lease, and an
//! extension, a raise or an install is atomic per record.

use crate::protocols::twopc::lease::{self, Lease, RenewFailure};
use crate::protocols::twopc::record_lock::{Acquire, LockMeta, Locked, Mode, Policy, Prio};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::storage::{Record, Storage, Value};
use crate::txn::Scan;

#[derive(Default)]
pub struct PrimoMeta {
    pub lock: LockMeta,
    pub lease: Lease,
    /// The lock is held by distributed transactions (WCF's read lock, or 2PL's under `wcf=off`),
    /// not by a local one's write lock: a local abort it causes counts as one WCF caused.
    pub held_by_distributed: bool,
}

impl Locked for PrimoMeta {
    fn lock_word(&mut self) -> &mut LockMeta {
        &mut self.lock
    }
}

/// A replayed record's version reads as written at its commit's timestamp (leases are not
/// logged: after a recovery every new timestamp lies past the agreed W_g, above every lease an
/// acknowledged reader relied on).
impl TxnMeta for PrimoMeta {
    fn on_replayed_at(&mut self, ts: u64) {
        self.lease = Lease { wts: ts, rts: ts };
    }

    /// The value a rolled-back install replaced is back: as a version written past every lease
    /// granted on the undone one.
    fn on_rolled_back(&mut self) {
        self.lease = lease::rolled_back(self.lease);
    }
}

pub type Rec = Record<PrimoMeta>;

/// The committed value and its lease, without a lock (a local transaction's read: a lock held by
/// another does not block it, TicToc's rule, which is what keeps WCF's read locks cheap).
pub fn read(rec: &Rec) -> (Option<Value>, Lease) {
    let row = rec.lock();
    (row.value.clone(), row.meta.lease)
}

/// Distributed transactions hold the record under their read locks.
pub fn held_by_distributed(rec: &Rec) -> bool {
    let row = rec.lock();
    row.meta.lock.is_held() && row.meta.held_by_distributed
}

/// Ask for the lock in `mode` (`distributed`: a distributed transaction's lock; a local
/// transaction locks only its writes, exclusively, and only a free record).
pub fn acquire(rec: &Rec, txn: TxnId, prio: Prio, mode: Mode, policy: Policy, distributed: bool) -> Acquire {
    let mut row = rec.lock();
    let got = row.meta.lock.acquire(txn, prio, mode, policy);
    if matches!(got, Acquire::Granted) {
        row.meta.held_by_distributed = distributed;
    }
    got
}

/// The value and lease of a record `txn` holds, its version first raised to start at `floor_ts`
/// if it started before (R2 at a participant: "if x.wts <= W_p, x.wts = x.rts = W_p + 1"). The
/// paper sets `rts` to the same value; a lease that already reached past it keeps its end here,
/// since a local reader may have committed inside it.
pub fn locked_read(rec: &Rec, txn: TxnId, floor_ts: u64) -> (Option<Value>, Lease) {
    let mut row = rec.lock();
    debug_assert!(row.meta.lock.holds(txn, Mode::Shared), "reading under a lock not held");
    row.meta.held_by_distributed = true;
    if row.meta.lease.wts < floor_ts {
        let rts = row.meta.lease.rts.max(floor_ts);
        row.meta.lease = Lease { wts: floor_ts, rts };
    }
    (row.value.clone(), row.meta.lease)
}

/// The lease of a record `txn` holds.
pub fn held_lease(rec: &Rec, txn: TxnId) -> Lease {
    let row = rec.lock();
    debug_assert!(row.meta.lock.holds(txn, Mode::Exclusive), "reading a lease under a lock not held");
    row.meta.lease
}

/// TicToc's validation of a local read of the version written at `read_wts` at `ts`: valid if
/// its lease reaches there or can be extended to, which needs the version unchanged and, for an
/// extension, no other transaction holding the record exclusively (a shared holder only reads
/// it, and extends the lease itself). `Err((why, wcf))`: `wcf` when the lock in the way was a
/// distributed transaction's read lock.
pub fn validate(rec: &Rec, txn: TxnId, read_wts: u64, ts: u64) -> Result<(), (RenewFailure, bool)> {
    let mut row = rec.lock();
    let meta = &mut row.meta;
    let locked = meta.lock.held_exclusive_by_other(txn);
    let wcf = locked && meta.held_by_distributed;
    lease::renew(&mut meta.lease, locked, read_wts, ts).map_err(|f| (f, wcf))
}

/// Commit on a record `txn` holds: install its write at `ts` (`Some`, held exclusively), or
/// extend the lease of the version it read to `ts` (`None`: no one can have written it since, so
/// this always succeeds: Algorithm 1, lines 18-20); then release the lock. Returns the value a
/// write replaced, which the watermark keeps while a recovery may roll the write back.
pub fn commit(rec: &Rec, txn: TxnId, ts: u64, write: Option<Option<Value>>) -> Option<Option<Value>> {
    let mut row = rec.lock();
    let mode = if write.is_some() { Mode::Exclusive } else { Mode::Shared };
    assert!(row.meta.lock.holds(txn, mode), "committing on a record without its lock ({mode:?})");
    let old = match write {
        Some(value) => {
            lease::install(&mut row.meta.lease, ts);
            Some(std::mem::replace(&mut row.value, value))
        }
        None => {
            row.meta.lease.rts = row.meta.lease.rts.max(ts);
            None
        }
    };
    row.meta.lock.release(txn);
    row.meta.held_by_distributed &= row.meta.lock.is_held();
    old
}

/// Release `txn`'s lock (an abort).
pub fn release(rec: &Rec, txn: TxnId) {
    let mut row = rec.lock();
    row.meta.lock.release(txn);
    row.meta.held_by_distributed &= row.meta.lock.is_held();
}

/// The keys of the existing rows of a range (a distributed scan then locks each).
pub fn range_keys(store: &Storage<PrimoMeta>, s: Scan) -> Vec<u64> {
    let rows = store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending);
    rows.into_iter().filter(|(_, r)| r.lock().value.is_some()).map(|(k, _)| k).collect()
}

/// The existing rows of a range with their leases, without locks (a local scan).
pub fn scan(store: &Storage<PrimoMeta>, s: Scan) -> Vec<(u64, Value, Lease)> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let row = rec.lock();
        if let Some(v) = &row.value {
            out.push((k, v.clone(), row.meta.lease));
        }
    }
    out
}
