//! MaaT's own properties in the simulator. The shared sweeps in `tests/` and the workloads'
//! tests run it with every other ready protocol: contention, loss, partitions, crashes with and
//! without logs, interactive execution, TPC-C's conditions and the bank total.

use crate::testkit::checked_run as checked;
use crate::testkit::{durable_run_with_crashes, messages_per_commit, read_only_distributed_ycsb};
use crate::workloads::WorkloadParams;

#[test]
fn both_abort_cases_are_reasons_of_their_own() {
    // A small hot key set: validated readers with open ranges freeze writers out, and closed
    // ranges on both sides leave some transactions nothing.
    let mut seen = std::collections::BTreeMap::new();
    for seed in 1..=4 {
        let wl = WorkloadParams { name: "append".into(), keys: 6, ops: 4, read_ratio: 0.7, ..Default::default() };
        let out = checked(&crate::testkit::protocol_spec("maat", wl, 60 + seed));
        for (k, v) in &out.totals.aborts {
            *seen.entry(k.clone()).or_insert(0) += v;
        }
    }
    for reason in ["maat-frozen", "maat-empty-range"] {
        assert!(seen.get(reason).copied().unwrap_or(0) > 0, "{reason} never seen: {seen:?}");
    }
    assert!(seen.keys().all(|k| k != "read-validation"), "MaaT does not validate as OCC does: {seen:?}");
}

#[test]
fn a_read_only_participant_hears_the_decision() {
    // MaaT cannot skip the commit phase where a transaction only read (it must clear soft
    // locks and record the read timestamp): more messages per transaction than Sundial, whose
    // read-only participants leave at prepare.
    let wl = read_only_distributed_ycsb();
    let msgs = |variant: &str| messages_per_commit(variant, &wl, 5);
    let (maat, sundial) = (msgs("maat"), msgs("sundial:cache=none"));
    assert!(maat > sundial + 1.5, "maat {maat:.2} messages per transaction, sundial {sundial:.2}");
}

#[test]
fn durable_runs_raise_lagging_bounds_and_lose_nothing() {
    // Crashes with a log: a node's timestamps restart from its logged bound, ahead of the
    // others', so commits past a lagging node's bound raise it first.
    let mut raises = 0;
    for seed in 1..=3 {
        let wl = WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() };
        let out = checked(&durable_run_with_crashes("maat", wl, 300 + seed));
        raises += out.totals.counters.get(super::BOUND_RAISES).copied().unwrap_or(0);
    }
    assert!(raises > 0, "no commit raised a lagging bound");
}

#[test]
fn a_decision_validated_by_an_earlier_incarnation_drops_what_a_late_read_left() {
    // Node 0 moved: its earlier incarnation validated T (a read-only part) and T committed;
    // a resent copy of T's read reached the new incarnation, which holds a soft lock for it and
    // a range that another validation narrowed, never validated here. The decision, resent to
    // the new incarnation, drops the lock and leaves the record's value alone.
    use super::range::{Order, TimeTable};
    use super::{Latched, MaatNode};
    use crate::storage::{Layout, RowKey, Storage, TableDef};
    let def = TableDef { name: "t", ordered: false, expected_rows: 1, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::<super::meta::MaatMeta>::new(&[def]);
    let node = MaatNode {
        latch: parking_lot::Mutex::new(Latched { table: TimeTable::default(), bound: 0, bound_lsn: None }),
        floor: 0,
    };
    let (late_copy, writer, key) = (1, 2, RowKey::new(0, 7));
    node.read(&store, late_copy, key, false).expect("a soft read lock");
    let (lower, _) = node.validate(&store, writer, &[], &[key]).expect("the writer validates");
    node.latch.lock().table.respect_validated(late_copy, writer, Order::After);
    node.commit(&store, late_copy, lower + 5, &[key], &[], Vec::new());
    assert!(node.latch.lock().table.get(late_copy).is_none(), "its range is gone");
    let row = store.get(key).expect("the record exists").lock();
    assert!(!row.meta.readers.contains(&late_copy), "its soft lock is gone");
    assert_eq!(row.value, None, "nothing installed");
}

#[test]
fn a_recovered_vote_answers_with_the_range_it_sent() {
    // Seed 301 of the durable run above, with group commit at 1 ms: T validated at node 0 with
    // [l, u] (u below a writer its read there was ordered before), the reply was lost in a
    // crash, and the recovered vote answered the resent request with [l, ∞): its coordinator
    // committed it after that writer. The vote logs its range, and the recovered one keeps it.
    use super::range::OPEN;
    use super::{Latched, MaatNode};
    use crate::protocols::twopc::commit::two_pc::TwoPcLog;
    use crate::protocols::twopc::durable::{replay, LogRecord, ReplayState};
    use crate::storage::{Layout, RowKey, Storage, TableDef};
    let (txn, key, range) = (9, RowKey::new(0, 3), (5, 40));
    let vote = LogRecord::<super::log::MaatLog, TwoPcLog>::Prepared { txn, writes: vec![(key, None)], vote: range };
    let from = ReplayState::<super::log::MaatLog, TwoPcLog>::new("maat");
    let (recovery, ()) = replay(from, &[crate::net::encode(&vote)], &mut |_, _, _, _| {});
    assert_eq!(recovery.in_doubt[0].2, range);
    let def = TableDef { name: "t", ordered: false, expected_rows: 1, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::<super::meta::MaatMeta>::new(&[def]);
    let node = MaatNode {
        latch: parking_lot::Mutex::new(Latched { table: Default::default(), bound: 0, bound_lsn: None }),
        floor: 0,
    };
    node.adopt(&store, txn, range, &recovery.in_doubt[0].1);
    let e = node.latch.lock().table.get(txn).expect("adopted");
    assert_eq!((e.lower, e.upper, e.validated), (5, 40, true));
    // A writer of the same record now goes after the range it sent, not after ∞.
    let (lower, upper) = node.validate(&store, 10, &[], &[key]).expect("the writer validates");
    assert_eq!((lower, upper), (41, OPEN));
}
