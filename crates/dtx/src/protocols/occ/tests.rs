//! OCC's rules (Silo-style validation), tested on a node's storage directly: what a version
//! means, locking a write set all or nothing, validation, install. The shared sweeps in
//! `tests/` run OCC with every other ready protocol under the serializability checker; the
//! last test here checks that its two abort paths are the ones it reports.

use super::meta::OccMeta;
use super::participant::{install_rec, lock_recs, lock_writes, read, unlock, validate};
use crate::storage::{Layout, RowKey, Storage, TableDef, Value};

fn store() -> Storage<OccMeta> {
    let def = TableDef { name: "t", ordered: true, expected_rows: 4, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::new(&[def]);
    store.load(k(1), Value::copy_from(b"one"));
    store
}

fn k(n: u64) -> RowKey {
    RowKey::new(0, n)
}

#[test]
fn a_read_validates_until_someone_commits_over_it_or_locks_it() {
    let s = store();
    let (_, tid) = read(&s, k(1));
    assert!(validate(&s, 7, [(k(1), tid)].into_iter()), "nothing changed");
    assert!(lock_writes(&s, 8, &vec![(k(1), None)]), "an unlocked record locks");
    assert!(!validate(&s, 7, [(k(1), tid)].into_iter()), "locked by another committer: write-locked");
    assert!(validate(&s, 8, [(k(1), tid)].into_iter()), "its own lock does not fail its own read");
    install_rec(s.get(k(1)).expect("loaded"), 8, Some(Value::copy_from(b"two")));
    assert!(!validate(&s, 7, [(k(1), tid)].into_iter()), "a committed write bumps the version");
    let (value, new_tid) = read(&s, k(1));
    assert_eq!((value.as_deref(), new_tid), (Some(&b"two"[..]), tid + 1));
}

#[test]
fn an_absent_record_validates_only_while_it_stays_absent() {
    let s = store();
    assert!(validate(&s, 7, [(k(2), 0)].into_iter()), "read as absent, still absent");
    assert!(lock_writes(&s, 8, &vec![(k(2), Some(Value::copy_from(b"new")))]));
    install_rec(s.get(k(2)).expect("created by the lock"), 8, Some(Value::copy_from(b"new")));
    assert!(!validate(&s, 7, [(k(2), 0)].into_iter()), "a phantom insert fails the read of its absence");
}

#[test]
fn a_write_set_locks_all_or_nothing() {
    let s = store();
    let (a, b) = (s.get_or_create(k(1)), s.get_or_create(k(2)));
    assert!(lock_recs(5, [b].into_iter()));
    assert!(!lock_recs(6, [a, b].into_iter()), "b is held by 5");
    assert_eq!(a.lock().meta.locked_by, 0, "what 6 took before the conflict is released");
    unlock(&s, 5, [k(2)].into_iter());
    assert!(lock_recs(6, [a, b].into_iter()), "free again");
    unlock(&s, 5, [k(1), k(2)].into_iter());
    assert_eq!((a.lock().meta.locked_by, b.lock().meta.locked_by), (6, 6), "only the holder unlocks");
}

#[test]
#[should_panic(expected = "without holding its lock")]
fn installing_without_the_lock_is_a_bug() {
    let s = store();
    install_rec(s.get(k(1)).expect("loaded"), 9, None);
}

#[test]
fn contention_aborts_by_read_validation_and_write_locks_and_stays_serializable() {
    let wl = crate::workloads::WorkloadParams {
        name: "append".into(),
        keys: 12,
        ops: 4,
        read_ratio: 0.5,
        ..Default::default()
    };
    let (mut validation, mut locked) = (0, 0);
    for seed in 1..=3 {
        let out = crate::testkit::checked_run(&crate::testkit::protocol_spec("occ", wl.clone(), 700 + seed));
        validation += out.totals.aborts.get("read-validation").copied().unwrap_or(0);
        locked += out.totals.aborts.get("write-locked").copied().unwrap_or(0);
    }
    assert!(validation > 0 && locked > 0, "read-validation {validation}, write-locked {locked}");
}

/// Seed 2046 of the replicated failover sweep: node 0 prepared a transaction, was taken over,
/// and the next incarnation, holding it in doubt, got a resend of its `LockValidate` (the RPC
/// layer's de-duplication died with the first incarnation). Run again, the validation failed
/// and released the in-doubt locks, another transaction prepared over them, and the next
/// recovery found both in doubt over one record (an assertion failed). A copy of a request
/// for a transaction prepared here is now answered with its vote.
#[test]
fn a_resent_lock_request_for_a_transaction_in_doubt_keeps_its_locks() {
    let out = crate::testkit::checked_run(&crate::testkit::replicated_failover_spec("occ", 2046));
    assert!(out.totals.failovers > 0, "no node was taken over");
}
