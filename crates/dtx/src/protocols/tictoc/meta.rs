//! What a record carries under TicToc: its lease `[wts, rts]` and the id of the committing
//! transaction holding its write lock (0: unlocked). Each function here runs under the record's
//! latch, so a read sees a value with its own lease, and a lock, a validation or an install is
//! atomic per record.

use crate::protocols::twopc::lease::{self, HasLease, Lease, RecordLease, RenewFailure};
pub use crate::protocols::twopc::lease::{read, scan};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::storage::{Record, Storage, Value};
use crate::txn::Scan;

#[derive(Debug, Default)]
pub struct TicTocMeta {
    /// The lease, and whether a writer recovered in doubt holds the record.
    pub leased: RecordLease,
    pub locked_by: TxnId,
}

impl TicTocMeta {
    /// Another transaction than `txn` holds the write lock.
    pub fn locked_by_other(&self, txn: TxnId) -> bool {
        self.locked_by != 0 && self.locked_by != txn
    }
}

impl HasLease for TicTocMeta {
    fn record_lease(&mut self) -> &mut RecordLease {
        &mut self.leased
    }
}

/// Replayed records keep the lease `[0, 0]`: the recovered bound lifts them when they are next
/// touched ([`RecordLease::current`]).
impl TxnMeta for TicTocMeta {
    /// The value a failed epoch replaced is back: as a version written past every lease granted
    /// on the undone one, so that no read of it (nor a cached copy) validates again.
    fn on_rolled_back(&mut self) {
        self.leased.roll_back();
    }
}

pub type Rec = Record<TicTocMeta>;

/// Another transaction than `txn` holds the record's write lock: what it installs may be
/// acknowledged already (a transaction that must see every acknowledged write cannot read
/// around it).
pub fn written_by_other(rec: &Rec, txn: TxnId) -> bool {
    rec.lock().meta.locked_by_other(txn)
}

/// Lock the record for `txn` without waiting: its lease (stable while locked: nobody extends it
/// past its end), or `None` when another writer holds it.
pub fn try_lock(rec: &Rec, txn: TxnId, floor: u64) -> Option<Lease> {
    let mut row = rec.lock();
    if row.meta.locked_by_other(txn) {
        return None;
    }
    row.meta.locked_by = txn;
    Some(row.meta.leased.current(floor))
}

/// Lock every record for `txn`, or none: their leases, in order.
pub fn lock_all(recs: &[&Rec], txn: TxnId, floor: u64) -> Option<Vec<Lease>> {
    let mut leases = Vec::with_capacity(recs.len());
    for (i, rec) in recs.iter().enumerate() {
        match try_lock(rec, txn, floor) {
            Some(l) => leases.push(l),
            None => {
                unlock_all(&recs[..i], txn);
                return None;
            }
        }
    }
    Some(leases)
}

/// Release `txn`'s locks on these records (those it does not hold are left alone).
pub fn unlock_all(recs: &[&Rec], txn: TxnId) {
    for rec in recs {
        let mut row = rec.lock();
        if row.meta.locked_by == txn {
            row.meta.locked_by = 0;
        }
    }
}

/// Validate `txn`'s read of the version written at `read_wts` at `commit_ts` (the record's
/// home, TicToc's validation): valid if its lease reaches there or can be extended to, which
/// needs the version unchanged and, for an extension, no other writer holding the record.
pub fn validate(rec: &Rec, txn: TxnId, read_wts: u64, commit_ts: u64, floor: u64) -> Result<(), RenewFailure> {
    let mut row = rec.lock();
    row.meta.leased.current(floor);
    // A recovered in-doubt writer holds its records' locks too: no extension past its timestamp.
    let locked = row.meta.locked_by_other(txn);
    lease::renew(&mut row.meta.leased.lease, locked, read_wts, commit_ts)
}

/// Install `txn`'s write at `commit_ts` and release the record's lock.
pub fn install(rec: &Rec, txn: TxnId, value: Option<Value>, commit_ts: u64, floor: u64) {
    let mut row = rec.lock();
    assert_eq!(row.meta.locked_by, txn, "installing a write without its lock");
    row.meta.leased.current(floor);
    row.meta.leased.install(commit_ts);
    row.meta.locked_by = 0;
    let old = std::mem::replace(&mut row.value, value);
    // Outside the latch: freeing (or keeping) the old value is no part of installing.
    drop(row);
    Value::recycle(old);
}

/// A writer holds a record of the range (a fresh scan must not read around it).
pub fn scan_written(store: &Storage<TicTocMeta>, s: Scan) -> bool {
    let rows = store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending);
    rows.into_iter().any(|(_, r)| r.lock().meta.locked_by != 0)
}

/// Lock again, after a restart, a record a transaction prepared before the crash writes at
/// `ts`, its version kept below `ts` until the writer installs or aborts
/// ([`RecordLease::hold_in_doubt`]).
pub fn hold_in_doubt(rec: &Rec, txn: TxnId, ts: u64) {
    let mut row = rec.lock();
    assert_eq!(row.meta.locked_by, 0, "a recovered node has no other lock holders");
    row.meta.locked_by = txn;
    row.meta.leased.hold_in_doubt(ts);
}
