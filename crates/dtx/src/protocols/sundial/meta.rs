//! What a record carries under Sundial: its lease, and the 2PL lock its writers take (write-write
//! conflicts are 2PL WAIT_DIE, `twopc::record_lock`). Each function here runs under the record's mutex,
//! so a read sees a value with its own lease and a renewal or an install is atomic per tuple.

use crate::protocols::twopc::lease::{self, HasLease, Lease, RecordLease, RenewFailure};
pub use crate::protocols::twopc::lease::{read, scan};
use crate::protocols::twopc::record_lock::{LockMeta, Locked, Mode};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::storage::{Record, Value};

#[derive(Default)]
pub struct SundialMeta {
    pub lock: LockMeta,
    /// The lease, and whether a writer recovered in doubt holds the tuple.
    pub leased: RecordLease,
}

impl HasLease for SundialMeta {
    fn record_lease(&mut self) -> &mut RecordLease {
        &mut self.leased
    }
}

impl Locked for SundialMeta {
    fn lock_word(&mut self) -> &mut LockMeta {
        &mut self.lock
    }
}

/// Replayed records keep the lease `[0, 0]`: the recovered bound lifts them when they are next
/// touched ([`RecordLease::current`]).
impl TxnMeta for SundialMeta {
    /// The value a failed epoch replaced is back: as a version written past every lease granted
    /// on the undone one, so that no read of it (nor a cached copy) validates again.
    fn on_rolled_back(&mut self) {
        self.leased.roll_back();
    }
}

pub type Rec = Record<SundialMeta>;

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
    let lease = row.meta.leased.current(floor);
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
    let leased = row.meta.leased.current(floor);
    if leased.wts == read_wts && !row.meta.leased.in_doubt {
        if commit_ts <= table_rts {
            return Ok(None);
        }
        if leased.rts < commit_ts {
            if let Some(end) = extend_table().filter(|end| commit_ts <= *end) {
                return Ok(Some(end));
            }
        }
    }
    let locked = row.meta.lock.is_held() && !row.meta.lock.holds(txn, Mode::Shared);
    lease::renew(&mut row.meta.leased.lease, locked, read_wts, commit_ts).map(|()| None)
}

/// Install `txn`'s write at `commit_ts` (it holds the record's lock); the caller releases.
pub fn install(rec: &Rec, txn: TxnId, value: Option<Value>, commit_ts: u64, floor: u64) {
    let mut row = rec.lock();
    assert!(row.meta.lock.holds(txn, Mode::Exclusive), "installing a write without its lock");
    row.meta.leased.current(floor);
    row.meta.leased.install(commit_ts);
    let old = std::mem::replace(&mut row.value, value);
    drop(row);
    Value::recycle(old);
}

/// A tuple locked by a transaction recovered in doubt that installs at `ts`
/// ([`RecordLease::hold_in_doubt`]).
pub fn hold_in_doubt(rec: &Rec, ts: u64) {
    rec.lock().meta.leased.hold_in_doubt(ts);
}
