//! TicToc's rules, tested on a node's storage directly (what a lease means, locking all or
//! nothing, validation with extension, install, recovery's in-doubt hold), then runs in the
//! simulator under the serializability checker: every abort path its own reason, and a durable
//! run with crashes. (The shared sweeps in `tests/` run it with every other ready protocol.)

use super::meta::{self, TicTocMeta};
use crate::protocols::twopc::lease::{Lease, RenewFailure};
use crate::storage::{Layout, RowKey, Storage, TableDef, Value};
use crate::testkit::{checked_run as checked, contended_append, protocol_spec};
use crate::testkit::{durable_run_with_crashes, messages_per_commit, read_only_distributed_ycsb};
use crate::workloads::WorkloadParams;

fn store() -> Storage<TicTocMeta> {
    let def = TableDef { name: "t", ordered: true, expected_rows: 4, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::new(&[def]);
    store.load(k(1), Value::copy_from(b"one"));
    store
}

fn k(n: u64) -> RowKey {
    RowKey::new(0, n)
}

/// T1 reads A at [0, 0]; T2 locks A, commits at 1 and installs A at [1, 1]. T1, committing at 0,
/// needs no extension; committing at 1 its read is stale.
#[test]
fn a_read_stays_valid_up_to_its_lease_and_extends_only_an_unchanged_version() {
    let s = store();
    let a = s.get(k(1)).expect("loaded");
    let (_, read) = meta::read(a, 0);
    assert_eq!(read, Lease::new(0, 0));
    assert_eq!(meta::validate(a, 7, read.wts, 3, 0), Ok(()), "unchanged, unlocked: extended");
    assert_eq!(a.lock().meta.leased.lease, Lease::new(0, 3));
    let locked = meta::try_lock(a, 8, 0).expect("free");
    assert_eq!(locked, Lease::new(0, 3), "a writer locks with the lease it must pass");
    assert_eq!(meta::validate(a, 7, read.wts, 3, 0), Ok(()), "covered already: a writer's lock does not matter");
    assert_eq!(meta::validate(a, 7, read.wts, 4, 0), Err(RenewFailure::Locked), "no extension under another's lock");
    meta::install(a, 8, Some(Value::copy_from(b"two")), 4, 0);
    assert_eq!(a.lock().meta.leased.lease, Lease::new(4, 4));
    assert_eq!(a.lock().meta.locked_by, 0, "install releases");
    assert_eq!(meta::validate(a, 7, read.wts, 4, 0), Err(RenewFailure::NewerBefore), "a newer version at 4");
    assert_eq!(meta::validate(a, 7, read.wts, 2, 0), Err(RenewFailure::NewerAfter), "a newer version after 2");
}

#[test]
fn a_write_set_locks_all_or_nothing() {
    let s = store();
    let (a, b) = (s.get_or_create(k(1)), s.get_or_create(k(2)));
    assert!(meta::try_lock(b, 5, 0).is_some());
    assert!(meta::lock_all(&[a, b], 6, 0).is_none(), "b is held by 5");
    assert_eq!(a.lock().meta.locked_by, 0, "what 6 took before the conflict is released");
    meta::unlock_all(&[b], 5);
    assert_eq!(meta::lock_all(&[a, b], 6, 0).map(|l| l.len()), Some(2), "free again");
    meta::unlock_all(&[a, b], 5);
    assert_eq!((a.lock().meta.locked_by, b.lock().meta.locked_by), (6, 6), "only the holder unlocks");
}

#[test]
#[should_panic(expected = "without its lock")]
fn installing_without_the_lock_is_a_bug() {
    let s = store();
    meta::install(s.get(k(1)).expect("loaded"), 9, None, 1, 0);
}

/// After a crash with bound 100, old versions read as [100, 100]; a record a recovered prepared
/// writer (at 50) holds keeps [49, 49] until it installs at 50, then rises like the rest.
#[test]
fn after_recovery_versions_start_at_the_bound_except_under_an_in_doubt_writer() {
    let s = store();
    let floor = 100;
    let (a, b) = (s.get(k(1)).expect("loaded"), s.get_or_create(k(2)));
    assert_eq!(meta::read(a, floor).1, Lease::new(floor, floor));
    meta::hold_in_doubt(b, 3, 50);
    assert_eq!(meta::read(b, floor).1, Lease::new(49, 49), "kept below its writer");
    assert_eq!(meta::validate(b, 7, 49, floor, floor), Err(RenewFailure::Locked), "not extended past its writer");
    meta::install(b, 3, Some(Value::copy_from(b"in doubt")), 50, floor);
    assert_eq!(meta::read(b, floor).1, Lease::new(floor, floor), "an ordinary version again");
}

/// The runs' abort reasons: those TicToc defines, and no OCC-style one.
fn aborts_seen(one_shots: &[bool], seeds: std::ops::RangeInclusive<u64>) -> std::collections::BTreeMap<String, u64> {
    let mut seen = std::collections::BTreeMap::new();
    for seed in seeds {
        for &one_shot in one_shots {
            let wl = WorkloadParams { name: "append".into(), keys: 6, ops: 4, read_ratio: 0.7, ..Default::default() };
            let mut s = protocol_spec("tictoc", wl, 60 + seed);
            s.proto.one_shot = one_shot;
            for (k, v) in &checked(&s).totals.aborts {
                *seen.entry(k.clone()).or_insert(0) += v;
            }
        }
    }
    seen
}

#[test]
fn contended_histories_are_serializable() {
    for seed in 1..=4 {
        let out = checked(&protocol_spec("tictoc", contended_append(), seed));
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
    }
}

/// Each abort path shows up as its own reason: a read whose version changed, a read whose lease
/// must be extended under another writer's lock, and a write lock held by another committer.
#[test]
fn every_abort_path_is_its_own_reason() {
    let seen = aborts_seen(&[true, false], 1..=3);
    for (reason, _) in super::ABORTS.iter().filter(|r| r.0 != super::FRESH_READ_LOCKED.name()) {
        assert!(seen.get(*reason).copied().unwrap_or(0) > 0, "{reason} never seen: {seen:?}");
    }
    for shared in ["read-validation", "write-locked"] {
        assert!(!seen.contains_key(shared), "TicToc reports its own reasons: {seen:?}");
    }
}

/// A read-only transaction whose leases cover its commit timestamp sends nothing at commit:
/// fewer messages than OCC, which validates every remote read.
#[test]
fn read_only_transactions_within_their_leases_skip_validation() {
    let wl = read_only_distributed_ycsb();
    let (tictoc, occ) = (messages_per_commit("tictoc", &wl, 9), messages_per_commit("occ", &wl, 9));
    assert!(tictoc < occ, "tictoc {tictoc:.1} messages per commit, occ {occ:.1}");
}

/// Crashes and partitions with a write-ahead log: the history stays serializable and every
/// acknowledged write survives (the final read and checks).
#[test]
fn durable_runs_with_crashes_are_serializable() {
    for seed in 1..=3 {
        let out = checked(&durable_run_with_crashes("tictoc", contended_append(), 800 + seed));
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
    }
}
