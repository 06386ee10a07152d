//! What a record carries under Sundial: its lease, and the 2PL lock its writers take (write-write
//! conflicts are 2PL WAIT_DIE, `twopl::meta`). Each function here runs under the record's mutex,
//! so a read sees a value with its own lease and a renewal or an install is atomic per tuple.

use super::lease::{self, Lease, RenewFailure};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::protocols::twopl::meta::{LockMeta, Locked, Mode};
use crate::storage::{Record, Storage, Value};
use crate::txn::Scan;

#[derive(Default)]
pub struct SundialMeta {
    pub lock: LockMeta,
    pub lease: Lease,
}

impl Locked for SundialMeta {
    fn lock_word(&mut self) -> &mut LockMeta {
        &mut self.lock
    }
}

/// Replayed records keep the lease `[0, 0]`: leases that survive a crash are the logged upper
/// bound's work (`lease::UpperBound`), which is not wired yet, so `sundial` runs without a log.
impl TxnMeta for SundialMeta {}

pub type Rec = Record<SundialMeta>;

/// The committed value and its lease (a writer's lock does not block a read: the reader gets
/// the last committed version, Alg. 1).
pub fn read(rec: &Rec) -> (Option<Value>, Lease) {
    let row = rec.lock();
    (row.value.clone(), row.meta.lease)
}

/// The lease of a record `txn` has locked (stable until `txn` installs or releases).
pub fn locked_lease(rec: &Rec, txn: TxnId) -> (Option<Value>, Lease) {
    let row = rec.lock();
    debug_assert!(row.meta.lock.holds(txn, Mode::Exclusive), "reading the lease of a lock not held");
    (row.value.clone(), row.meta.lease)
}

/// Extend the lease of the version `txn` read (written at `read_wts`) to `commit_ts`: the
/// paper's rule, where only another transaction's lock counts (`txn` may hold the lock of a key
/// it declared for writing and did not write).
pub fn renew(rec: &Rec, txn: TxnId, read_wts: u64, commit_ts: u64) -> Result<(), RenewFailure> {
    let mut row = rec.lock();
    let locked = row.meta.lock.is_held() && !row.meta.lock.holds(txn, Mode::Shared);
    lease::renew(&mut row.meta.lease, locked, read_wts, commit_ts)
}

/// Install `txn`'s write at `commit_ts` (it holds the record's lock); the caller releases.
pub fn install(rec: &Rec, txn: TxnId, value: Option<Value>, commit_ts: u64) {
    let mut row = rec.lock();
    assert!(row.meta.lock.holds(txn, Mode::Exclusive), "installing a write without its lock");
    lease::install(&mut row.meta.lease, commit_ts);
    let old = std::mem::replace(&mut row.value, value);
    drop(row);
    Value::recycle(old);
}

/// The existing rows of a range, each with its lease (the rows returned, not the gaps between
/// them: no workload here needs phantom protection yet, as for OCC and 2PL).
pub fn scan(store: &Storage<SundialMeta>, s: Scan) -> Vec<(u64, Value, Lease)> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let row = rec.lock();
        if let Some(v) = &row.value {
            out.push((k, v.clone(), row.meta.lease));
        }
    }
    out
}
