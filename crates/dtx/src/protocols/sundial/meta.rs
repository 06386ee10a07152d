//! What a record carries under Sundial: its lease, and the 2PL lock its writers take (write-write
//! conflicts are 2PL WAIT_DIE, `twopc::record_lock`). Each function here runs under the record's mutex,
//! so a read sees a value with its own lease and a renewal or an install is atomic per tuple.

use crate::protocols::twopc::lease::{self, Lease, RenewFailure};
use crate::protocols::twopc::record_lock::{LockMeta, Locked, Mode};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::storage::{Record, Storage, Value};
use crate::txn::Scan;

#[derive(Default)]
pub struct SundialMeta {
    pub lock: LockMeta,
    pub lease: Lease,
    /// Locked by a transaction prepared before a crash, whose outcome is not known yet: its
    /// lease stays below that transaction's timestamp (see [`SundialMeta::current`]).
    pub in_doubt: bool,
}

impl SundialMeta {
    /// The lease as of now, after a recovery whose logged bound is `floor`: every version
    /// written before it reads as `[floor, floor]` (Sec. 3.5: no lease granted before the crash
    /// reaches the bound, and no version after it is older), except one held by an in-doubt
    /// transaction, which keeps the lease recovery gave it. Applied when a record is touched.
    pub fn current(&mut self, floor: u64) -> Lease {
        if !self.in_doubt && self.lease.wts < floor {
            self.lease = Lease { wts: floor, rts: floor };
        }
        self.lease
    }
}

impl Locked for SundialMeta {
    fn lock_word(&mut self) -> &mut LockMeta {
        &mut self.lock
    }
}

/// Replayed records keep the lease `[0, 0]`: the recovered bound lifts them when they are next
/// touched ([`SundialMeta::current`]).
impl TxnMeta for SundialMeta {
    /// The value a failed epoch replaced is back: as a version written past every lease granted
    /// on the undone one, so that no read of it (nor a cached copy) validates again.
    fn on_rolled_back(&mut self) {
        self.lease = crate::protocols::twopc::lease::rolled_back(self.lease);
    }
}

pub type Rec = Record<SundialMeta>;

/// The committed value and its lease (a writer's lock does not block a read: the reader gets
/// the last committed version, Alg. 1).
pub fn read(rec: &Rec, floor: u64) -> (Option<Value>, Lease) {
    let mut row = rec.lock();
    let lease = row.meta.current(floor);
    (row.value.clone(), lease)
}

/// Another transaction holds the tuple's write lock: what it installs may be acknowledged
/// already (a transaction that must see every acknowledged write cannot read around it).
pub fn written_by_other(rec: &Rec, txn: TxnId) -> bool {
    let row = rec.lock();
    row.meta.lock.is_held() && !row.meta.lock.holds(txn, Mode::Shared)
}

/// The lease of a record `txn` has locked (stable until `txn` installs or releases).
pub fn locked_lease(rec: &Rec, txn: TxnId, floor: u64) -> (Option<Value>, Lease) {
    let mut row = rec.lock();
    debug_assert!(row.meta.lock.holds(txn, Mode::Exclusive), "reading the lease of a lock not held");
    let lease = row.meta.current(floor);
    (row.value.clone(), lease)
}

/// Extend the lease of the version `txn` read (written at `read_wts`) to `commit_ts`: the
/// paper's rule, where only another transaction's lock counts (`txn` may hold the lock of a key
/// it declared for writing and did not write). A tuple of a read-only table is covered by its
/// table's lease (`table_rts`) or by extending that (`extend_table`: the new end, if the table
/// is still read-only), which returns the table's new end for the requester's cache.
pub fn renew(
    rec: &Rec,
    txn: TxnId,
    read_wts: u64,
    commit_ts: u64,
    floor: u64,
    table_rts: u64,
    extend_table: impl FnOnce() -> Option<u64>,
) -> Result<Option<u64>, RenewFailure> {
    let mut row = rec.lock();
    row.meta.current(floor);
    if row.meta.lease.wts == read_wts && !row.meta.in_doubt {
        if commit_ts <= table_rts {
            return Ok(None);
        }
        if row.meta.lease.rts < commit_ts {
            if let Some(end) = extend_table().filter(|end| commit_ts <= *end) {
                return Ok(Some(end));
            }
        }
    }
    let locked = row.meta.lock.is_held() && !row.meta.lock.holds(txn, Mode::Shared);
    lease::renew(&mut row.meta.lease, locked, read_wts, commit_ts).map(|()| None)
}

/// Install `txn`'s write at `commit_ts` (it holds the record's lock); the caller releases.
pub fn install(rec: &Rec, txn: TxnId, value: Option<Value>, commit_ts: u64, floor: u64) {
    let mut row = rec.lock();
    assert!(row.meta.lock.holds(txn, Mode::Exclusive), "installing a write without its lock");
    row.meta.current(floor);
    lease::install(&mut row.meta.lease, commit_ts);
    row.meta.in_doubt = false;
    let old = std::mem::replace(&mut row.value, value);
    drop(row);
    Value::recycle(old);
}

/// The existing rows of a range, each with its lease (the rows returned, not the gaps between
/// them: no workload here needs phantom protection yet, as for OCC and 2PL).
pub fn scan(store: &Storage<SundialMeta>, s: Scan, floor: u64) -> Vec<(u64, Value, Lease)> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let mut row = rec.lock();
        let lease = row.meta.current(floor);
        if let Some(v) = &row.value {
            out.push((k, v.clone(), lease));
        }
    }
    out
}

/// A tuple locked by a transaction recovered in doubt that installs at `ts`: its version keeps
/// a lease below `ts` (it was the latest version up to there: the tuple was locked since the
/// writer saw its lease, and nothing extended it past that) until the writer installs or aborts.
pub fn hold_in_doubt(rec: &Rec, ts: u64) {
    let mut row = rec.lock();
    row.meta.in_doubt = true;
    row.meta.lease = Lease { wts: ts - 1, rts: ts - 1 };
}

/// The in-doubt writer of this tuple aborted: its version is an ordinary one again.
pub fn release_in_doubt(rec: &Rec) {
    rec.lock().meta.in_doubt = false;
}
