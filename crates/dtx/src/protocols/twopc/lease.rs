//! Logical leases: TicToc's data-driven timestamps (Yu et al., SIGMOD 2016) as Sundial names them
//! (PVLDB 2018, Sec. 3), as rules on plain values so that both protocols' coordinators,
//! participants and Sundial's cache apply the same ones and the papers' worked examples are unit
//! tests.
//!
//! Every tuple carries a lease `[wts, rts]`: the version written at logical time `wts` may be
//! read at any logical time up to `rts`. A transaction computes one commit timestamp from the
//! leases it saw, with no coordination: at least the `wts` of everything it read (Alg. 1 line 14),
//! and past the `rts` of everything it locked to write (line 24). At prepare, a read whose lease
//! ends before the commit timestamp is extended at its home (Alg. 2): possible only while the
//! version is unchanged, and, if the tuple is locked by a writer, only when no extension is
//! needed. A commit installs its writes with the lease `[commit_ts, commit_ts]` (Alg. 3).

use crate::storage::{Record, RowKey, Storage, Value};
use crate::txn::Scan;
use serde::{Deserialize, Serialize};

/// A version's lease in logical time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// When the version was written.
    pub wts: u64,
    /// Until when it may be read (`rts >= wts`).
    pub rts: u64,
}

impl Lease {
    pub fn new(wts: u64, rts: u64) -> Self {
        assert!(wts <= rts, "a lease [{wts}, {rts}] ends before it starts");
        Lease { wts, rts }
    }

    /// The version may be read at logical time `ts`.
    pub fn covers(&self, ts: u64) -> bool {
        self.wts <= ts && ts <= self.rts
    }
}

/// The lease of a value put back by an undone write (epoch group commit's rollback): a new
/// version, written after every read of the one undone.
pub fn rolled_back(lease: Lease) -> Lease {
    let wts = lease.rts + 1;
    Lease { wts, rts: wts }
}

/// What a record carries of its lease under Sundial and TicToc: the lease, and whether a writer
/// recovered in doubt holds the record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordLease {
    pub lease: Lease,
    /// Locked by a transaction prepared before a crash whose outcome is not known yet: its lease
    /// stays below that transaction's timestamp (see [`RecordLease::current`]).
    pub in_doubt: bool,
}

impl RecordLease {
    /// The lease as of now, after a recovery whose logged bound is `floor`: every version
    /// written before it reads as `[floor, floor]` (Sundial Sec. 3.5: no lease granted before
    /// the crash reaches the bound, and no version since is older), except one an in-doubt
    /// transaction holds, which keeps the lease recovery gave it. Applied whenever a record is
    /// touched.
    pub fn current(&mut self, floor: u64) -> Lease {
        if !self.in_doubt && self.lease.wts < floor {
            self.lease = Lease { wts: floor, rts: floor };
        }
        self.lease
    }

    /// A write installed at `commit_ts` ([`install`]): an ordinary version.
    pub fn install(&mut self, commit_ts: u64) {
        install(&mut self.lease, commit_ts);
        self.in_doubt = false;
    }

    /// The value a failed epoch replaced is back ([`rolled_back`]).
    pub fn roll_back(&mut self) {
        self.lease = rolled_back(self.lease);
    }

    /// A transaction recovered in doubt holds the record and installs at `ts`: its version
    /// keeps a lease below `ts` (it was the latest version up to there: the record was locked
    /// since the writer saw its lease, and nothing extended it past that while locked) until the
    /// writer installs or aborts.
    pub fn hold_in_doubt(&mut self, ts: u64) {
        assert!(ts > 0, "a prepared writer commits past some lease");
        self.in_doubt = true;
        self.lease = Lease { wts: ts - 1, rts: ts - 1 };
    }
}

/// Record metadata that carries a [`RecordLease`].
pub trait HasLease {
    fn record_lease(&mut self) -> &mut RecordLease;
}

/// The committed value and its lease (a writer's lock does not block a read: the reader gets
/// the last committed version, Sundial's Alg. 1).
pub fn read<M: HasLease>(rec: &Record<M>, floor: u64) -> (Option<Value>, Lease) {
    let mut row = rec.lock();
    let lease = row.meta.record_lease().current(floor);
    (row.value.clone(), lease)
}

/// The existing rows of a range, each with its lease (the rows returned, not the gaps between
/// them: no workload here needs phantom protection yet, as for OCC and 2PL).
pub fn scan<M: HasLease + Default + Send>(store: &Storage<M>, s: Scan, floor: u64) -> Vec<(u64, Value, Lease)> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let mut row = rec.lock();
        let lease = row.meta.record_lease().current(floor);
        if let Some(v) = &row.value {
            out.push((k, v.clone(), lease));
        }
    }
    out
}

/// A transaction recovered in doubt aborted: the records it held are ordinary again (lifted to
/// the recovered bound when next touched).
pub fn release_all_in_doubt<M: HasLease + Default + Send>(store: &Storage<M>, keys: impl IntoIterator<Item = RowKey>) {
    for rec in keys.into_iter().filter_map(|k| store.get(k)) {
        rec.lock().meta.record_lease().in_doubt = false;
    }
}

/// The committed rows of a range, without their leases (a participant's `peek_scan`).
pub fn peek_scan<M: HasLease + Default + Send>(store: &Storage<M>, s: Scan, floor: u64) -> Vec<(u64, Value)> {
    scan(store, s, floor).into_iter().map(|(k, v, _)| (k, v)).collect()
}

/// A transaction's commit timestamp, raised as it reads and locks (Alg. 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitTs(pub u64);

impl CommitTs {
    /// A read of a version with `lease`: commit no earlier than it was written (line 14).
    pub fn read(&mut self, lease: Lease) {
        self.0 = self.0.max(lease.wts);
    }

    /// A write of a tuple locked with `lease`: commit after every reader of it (line 24).
    pub fn write(&mut self, lease: Lease) {
        self.0 = self.0.max(lease.rts + 1);
    }
}

/// Why a lease could not be extended to the commit timestamp: the paper's three read-write abort
/// cases (Sec. 5.1, Fig. 12), each an abort reason of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenewFailure {
    /// (a) A newer version was written after the commit timestamp: the read may or may not have
    /// been current at it (`DB.wts > commit_ts`).
    NewerAfter,
    /// (b) A newer version was written at or before the commit timestamp: the read was stale.
    NewerBefore,
    /// (c) The version is unchanged but locked by a writer, and it must be extended.
    Locked,
}

impl RenewFailure {
    /// The abort reason a protocol reports for it.
    pub fn reason(self) -> &'static str {
        match self {
            RenewFailure::NewerAfter => "lease-newer-version-after",
            RenewFailure::NewerBefore => "lease-newer-version-before",
            RenewFailure::Locked => "lease-locked",
        }
    }
}

/// The home's lease extension (Alg. 2, `renew_lease`, the paper's rule): a read of the version
/// written at `read_wts` is made valid at `commit_ts`. Runs under the tuple's latch. Fails only
/// when the version changed, or when an extension is needed and a writer holds the tuple's lock;
/// a locked tuple whose lease already covers `commit_ts` renews (the authors' code refuses it,
/// the paper does not).
pub fn renew(home: &mut Lease, locked: bool, read_wts: u64, commit_ts: u64) -> Result<(), RenewFailure> {
    if read_wts != home.wts {
        return Err(if home.wts > commit_ts { RenewFailure::NewerAfter } else { RenewFailure::NewerBefore });
    }
    if commit_ts > home.rts && locked {
        return Err(RenewFailure::Locked);
    }
    home.rts = home.rts.max(commit_ts);
    Ok(())
}

/// Whether a read with the lease it observed needs its home to extend it at `commit_ts`
/// (Alg. 2 line 3): if the observed lease covers the commit timestamp, the read is valid as is.
pub fn needs_renewal(observed: Lease, commit_ts: u64) -> bool {
    commit_ts > observed.rts
}

/// A read of a tuple the same transaction then locked to write (TicToc's validation of a key in
/// both its read and write sets): valid only if the version locked is the one read. No extension:
/// its own write replaces the version at `commit_ts`, past the `rts` it locked with, and
/// extending would put the old version's lease over the new one's.
pub fn validate_own_write(locked: Lease, read_wts: u64, commit_ts: u64) -> Result<(), RenewFailure> {
    assert!(commit_ts > locked.rts, "a commit at {commit_ts} inside the lease it locked to write");
    if locked.wts == read_wts {
        Ok(())
    } else {
        // A newer version is under the lock, so it was written before `commit_ts`.
        Err(RenewFailure::NewerBefore)
    }
}

/// The commit installs a new version at `commit_ts` (Alg. 3 line 14). The writer locked the
/// tuple and saw its lease, so `commit_ts > rts`, and nobody extended it while locked past the
/// commit timestamp: leases of successive versions never overlap.
pub fn install(home: &mut Lease, commit_ts: u64) {
    assert!(
        commit_ts > home.rts,
        "a write at {commit_ts} inside the lease [{}, {}] of the version it replaces",
        home.wts,
        home.rts
    );
    *home = Lease { wts: commit_ts, rts: commit_ts };
}

/// The logged upper bound on every lease of a server (Sec. 3.5, Listing 1). Leases are not
/// logged (reads extend them); instead a server logs a timestamp `UT` past every lease it has
/// granted, and after a crash resets every lease to `[UT, UT]`, so that no reader can commit at
/// a time a lost lease change would have forbidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperBound {
    /// The bound as last logged (durable once its record is).
    pub logged: u64,
    /// How far past the largest lease a new bound is logged, so that logging is rare.
    pub step: u64,
}

impl UpperBound {
    /// A lease end `ts` is about to be granted: the new bound to log first, if `ts` passes the
    /// logged one.
    pub fn before_granting(&mut self, ts: u64) -> Option<u64> {
        if ts < self.logged {
            return None;
        }
        self.logged = ts + self.step;
        Some(self.logged)
    }

    /// Every lease after recovery from a log whose last bound is `logged`.
    pub fn recovered_lease(logged: u64) -> Lease {
        Lease { wts: logged, rts: logged }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fig. 1: T1 reads A [0,1] and B [1,2] and writes D (lease [0,0]); T2 writes A and reads C
    /// [3,3]. T1 commits at 1 and installs D at [1,1]; T2 locked A with [0,1] so commits at
    /// max(2, 3) = 3; A becomes [3,3]. T1 committed physically after T2 modified A, yet
    /// logically before it.
    #[test]
    fn figure_1() {
        let (mut a, b, c, mut d) = (Lease::new(0, 1), Lease::new(1, 2), Lease::new(3, 3), Lease::new(0, 0));
        let mut t1 = CommitTs::default();
        t1.read(a);
        t1.read(b);
        t1.write(d);
        assert_eq!(t1, CommitTs(1));
        let mut t2 = CommitTs::default();
        t2.write(a);
        t2.read(c);
        assert_eq!(t2, CommitTs(3));
        // T2 commits first, physically: A becomes [3,3].
        install(&mut a, t2.0);
        assert_eq!(a, Lease::new(3, 3));
        // T1's reads are valid at 1 without renewal: its observed leases cover it.
        assert!(!needs_renewal(Lease::new(0, 1), t1.0) && !needs_renewal(b, t1.0));
        install(&mut d, t1.0);
        assert_eq!(d, Lease::new(1, 1));
        assert!(t1.0 < t2.0, "T1 precedes T2 in logical time");
    }

    /// Fig. 2: T1 reads A [0,10]; T2 writes A at 11 and commits; T1 commits at 0. OCC would
    /// abort T1 and 2PL would block T2.
    #[test]
    fn figure_2() {
        let mut a = Lease::new(0, 10);
        let mut t1 = CommitTs::default();
        t1.read(a);
        let mut t2 = CommitTs::default();
        t2.write(a);
        install(&mut a, t2.0);
        assert_eq!((t1.0, t2.0, a), (0, 11, Lease::new(11, 11)));
        assert!(!needs_renewal(Lease::new(0, 10), t1.0));
    }

    #[test]
    fn renewal_extends_only_an_unchanged_version() {
        let mut home = Lease::new(5, 8);
        assert_eq!(renew(&mut home, false, 5, 12), Ok(()));
        assert_eq!(home, Lease::new(5, 12));
        // Never shortened.
        assert_eq!(renew(&mut home, false, 5, 9), Ok(()));
        assert_eq!(home.rts, 12);
        // Case (b): a newer version at or before the commit timestamp.
        let mut home = Lease::new(10, 10);
        assert_eq!(renew(&mut home, false, 5, 10), Err(RenewFailure::NewerBefore));
        // Case (a): written after it.
        assert_eq!(renew(&mut home, false, 5, 9), Err(RenewFailure::NewerAfter));
        assert_eq!(home, Lease::new(10, 10), "a failed renewal changes nothing");
    }

    #[test]
    fn a_locked_tuple_renews_only_when_no_extension_is_needed() {
        let mut home = Lease::new(5, 8);
        // Covered already: the paper renews (the authors' code would abort).
        assert_eq!(renew(&mut home, true, 5, 8), Ok(()));
        // Case (c): an extension of a locked tuple.
        assert_eq!(renew(&mut home, true, 5, 9), Err(RenewFailure::Locked));
        assert_eq!(home, Lease::new(5, 8));
    }

    /// TicToc: T read A at [4, 6], then locked A to write it and saw [4, 6] still: it commits at 7
    /// with no extension of A. Had another writer installed A at 7 in between, T locks [7, 7],
    /// commits at 8, and its read of the version at 4 is stale.
    #[test]
    fn a_read_then_written_tuple_validates_by_its_version_alone() {
        let read = Lease::new(4, 6);
        let mut t = CommitTs::default();
        t.read(read);
        t.write(read);
        assert_eq!(validate_own_write(read, read.wts, t.0), Ok(()));
        let mut t = CommitTs::default();
        t.read(read);
        t.write(Lease::new(7, 7));
        assert_eq!(validate_own_write(Lease::new(7, 7), read.wts, t.0), Err(RenewFailure::NewerBefore));
    }

    #[test]
    #[should_panic(expected = "inside the lease")]
    fn installing_inside_the_replaced_lease_is_a_bug() {
        install(&mut Lease::new(3, 9), 7);
    }

    /// Listing 1: T1 read A [0,9]; T2 wrote A and B at 10; B's server crashed and lost B's lease.
    /// Reset to [UT, UT] with UT past every lease it granted, B cannot be read at T1's 0.
    #[test]
    fn leases_after_a_crash_start_at_the_logged_bound() {
        let mut ut = UpperBound { logged: 0, step: 1000 };
        assert_eq!(ut.before_granting(10), Some(1010), "the first lease past the bound logs a new one");
        assert_eq!(ut.before_granting(500), None, "later ones under it log nothing");
        let b = UpperBound::recovered_lease(ut.logged);
        let mut t1 = CommitTs::default();
        t1.read(Lease::new(0, 9)); // A
        t1.read(b); // B after recovery
        assert!(t1.0 >= 10 && needs_renewal(Lease::new(0, 9), t1.0), "T1 must renew A, which T2 changed: it aborts");
    }
}
