//! Static-timestamp MVCC's own properties in the simulator. The shared sweeps in `tests/` and
//! the workloads' tests run it with every other ready protocol (with synchronized clocks).

use crate::testkit::checked_run as checked;
use crate::testkit::{durable_run_with_crashes, messages_per_commit, read_only_distributed_ycsb};
use crate::workloads::WorkloadParams;

fn hot_append() -> WorkloadParams {
    WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() }
}

fn aborts(out: &crate::host::Outcome, reason: &str) -> u64 {
    out.totals.aborts.get(reason).copied().unwrap_or(0)
}

#[test]
fn lagging_clocks_make_writes_late_and_histories_stay_serializable() {
    // With skew, a node whose clock lags writes below what other nodes' readers have read:
    // the paper's Sec. 6.6 abort, more of them the larger the skew.
    let (mut synced, mut skewed) = (0, 0);
    for seed in 1..=3 {
        let spec = crate::testkit::protocol_spec("mvcc", hot_append(), 400 + seed);
        synced += aborts(&checked(&spec), "mvcc-late-write");
        let mut spec = spec;
        spec.clock_skew_us = 5_000;
        skewed += aborts(&checked(&spec), "mvcc-late-write");
    }
    assert!(skewed > synced, "late writes: {skewed} with 5 ms of skew, {synced} without");
}

#[test]
fn durable_runs_with_skewed_clocks_and_crashes_stay_serializable() {
    // Crashes, partitions and skew together. (The floor a restarted node sets is needed only
    // when a read served before the crash and a lagging write after it close a cycle, which
    // these runs do not produce reliably: `a_write_below_the_floor_is_late` checks the rule.)
    for seed in 1..=3 {
        let mut s = durable_run_with_crashes("mvcc", hot_append(), 500 + seed);
        s.clock_skew_us = 2_000;
        checked(&s);
    }
}

#[test]
fn a_read_only_transaction_sends_nothing_after_its_reads() {
    // Its reads are final when served: no validation and no commit phase, where OCC validates
    // at every node it read from.
    let wl = read_only_distributed_ycsb();
    let msgs = |variant: &str| messages_per_commit(variant, &wl, 7);
    let (mvcc, occ) = (msgs("mvcc"), msgs("occ"));
    assert!(mvcc + 1.5 < occ, "mvcc {mvcc:.2} messages per transaction, occ {occ:.2}");
}

#[test]
fn a_write_below_the_floor_is_late() {
    // Reads are not logged: a restarted node refuses writes below its clock plus the skew, past
    // every read it may have served before the crash. Reads below the floor are still served.
    use crate::storage::{Layout, Storage, TableDef};
    let def = TableDef { name: "t", ordered: false, expected_rows: 1, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::<super::meta::MvccMeta>::new(&[def]);
    let key = crate::storage::RowKey::new(0, 1);
    let floor = 1_000;
    let late = super::participant::access(&store, 7, floor - 1, floor, &[], &[key]);
    assert_eq!(late.unwrap_err(), crate::txn::Abort::Protocol(super::LATE_WRITE));
    let read = super::participant::access(&store, 8, floor - 1, floor, &[key], &[]).expect("a read is served");
    assert!(matches!(read, super::meta::Found::Now(_)));
    let write = super::participant::access(&store, 9, floor + 1, floor, &[], &[key]).expect("above the floor");
    assert!(matches!(write, super::meta::Found::Now(_)));
}
