//! Primo's rules on a node's storage (the paper's Fig. 2, R2's raise, what a WCF lock does to a
//! local transaction), then runs in the simulator under the serializability checker: every abort
//! path its own reason, and durable runs with crashes whose agreements roll back. (The shared
//! sweeps in `tests/` run it with every other ready protocol.)

use super::meta::{self, PrimoMeta};
use crate::protocols::twopc::lease::{Lease, RenewFailure};
use crate::protocols::twopc::record_lock::{Acquire, Mode, Policy, Prio};
use crate::storage::{Layout, RowKey, Storage, TableDef, Value};
use crate::testkit::durable_run_with_crashes;
use crate::testkit::{checked_run as checked, contended_append, protocol_spec};
use crate::workloads::WorkloadParams;

fn store() -> Storage<PrimoMeta> {
    let def = TableDef { name: "t", ordered: true, expected_rows: 4, dense: Vec::new(), layout: Layout::Tree };
    let store = Storage::new(&[def]);
    for n in 1..=3 {
        store.load(k(n), Value::copy_from(b"v"));
    }
    store
}

fn k(n: u64) -> RowKey {
    RowKey::new(0, n)
}

fn set_lease(s: &Storage<PrimoMeta>, n: u64, wts: u64, rts: u64) {
    s.get(k(n)).expect("loaded").lock().meta.lease = Lease::new(wts, rts);
}

fn lock(s: &Storage<PrimoMeta>, n: u64, txn: u64) {
    lock_in(s, n, txn, Mode::Exclusive);
}

fn lock_in(s: &Storage<PrimoMeta>, n: u64, txn: u64, mode: Mode) {
    let got = meta::acquire(s.get(k(n)).expect("loaded"), txn, Prio(txn, txn), mode, Policy::WaitDie, true);
    assert!(matches!(got, Acquire::Granted), "record {n} is free");
}

/// Fig. 2: T reads x [1, 3] (P1), y and z (P2, P3; here [2, 4]), writes y and z: its timestamp is
/// past y's and z's rts, 5; x's lease is extended to 5 and y, z install at [5, 5].
#[test]
fn figure_2_a_distributed_commit_extends_what_it_read_and_installs_at_the_lease_timestamp() {
    let s = store();
    let t = 7;
    set_lease(&s, 1, 1, 3);
    set_lease(&s, 2, 2, 4);
    set_lease(&s, 3, 2, 4);
    for n in 1..=3 {
        lock(&s, n, t);
    }
    let leases: Vec<Lease> = (1..=3).map(|n| meta::locked_read(s.get(k(n)).unwrap(), t, 0).1).collect();
    let mut ts = crate::protocols::twopc::lease::CommitTs::default();
    ts.read(leases[0]);
    ts.write(leases[1]);
    ts.write(leases[2]);
    assert_eq!(ts.0, 5);
    assert!(meta::commit(s.get(k(1)).unwrap(), t, 5, None).is_none(), "x is only read");
    for n in 2..=3 {
        let old = meta::commit(s.get(k(n)).unwrap(), t, 5, Some(Some(Value::copy_from(b"new"))));
        assert_eq!(old, Some(Some(Value::copy_from(b"v"))), "the replaced value comes back, for the undo");
    }
    assert_eq!(s.get(k(1)).unwrap().lock().meta.lease, Lease::new(1, 5), "x extended to 5");
    assert_eq!(s.get(k(2)).unwrap().lock().meta.lease, Lease::new(5, 5));
    assert!((1..=3).all(|n| !s.get(k(n)).unwrap().lock().meta.lock.is_held()), "all released");
}

/// R2 at a participant: a record locked for a distributed transaction starts past the floor, its
/// lease end kept if it already reached further.
#[test]
fn a_participant_raises_a_cold_record_past_the_floor_and_keeps_a_longer_lease() {
    let s = store();
    set_lease(&s, 1, 2, 3);
    set_lease(&s, 2, 2, 40);
    lock(&s, 1, 7);
    lock(&s, 2, 7);
    assert_eq!(meta::locked_read(s.get(k(1)).unwrap(), 7, 10).1, Lease::new(10, 10));
    assert_eq!(meta::locked_read(s.get(k(2)).unwrap(), 7, 10).1, Lease::new(10, 40));
}

/// A local transaction reads a record a distributed one holds, and commits if its timestamp lies
/// in the lease; only an extension fails, and it is WCF's.
#[test]
fn a_wcf_lock_refuses_only_an_extension() {
    let s = store();
    set_lease(&s, 1, 1, 3);
    let (_, read) = meta::read(s.get(k(1)).unwrap());
    lock(&s, 1, 9);
    assert_eq!(meta::validate(s.get(k(1)).unwrap(), 5, read.wts, 3), Ok(()), "inside the lease");
    assert_eq!(meta::validate(s.get(k(1)).unwrap(), 5, read.wts, 4), Err((RenewFailure::Locked, true)));
    assert!(meta::held_by_distributed(s.get(k(1)).unwrap()));
}

/// `wcf=off`: a distributed transaction's shared read lock lets a local validation extend the
/// lease (the reader extends it itself at commit) but refuses a local write, which counts as a
/// distributed lock's abort; a second reader shares it, and the upgrade of one waits (WAIT_DIE)
/// while the other holds it.
#[test]
fn without_wcf_a_shared_read_lock_lets_local_extensions_through() {
    let s = store();
    set_lease(&s, 1, 1, 3);
    let (_, read) = meta::read(s.get(k(1)).unwrap());
    lock_in(&s, 1, 9, Mode::Shared);
    assert_eq!(meta::validate(s.get(k(1)).unwrap(), 5, read.wts, 8), Ok(()), "extended under a shared lock");
    assert_eq!(s.get(k(1)).unwrap().lock().meta.lease, Lease::new(1, 8));
    let local_write = meta::acquire(s.get(k(1)).unwrap(), 5, Prio(5, 5), Mode::Exclusive, Policy::NoWait, false);
    assert!(matches!(local_write, Acquire::Abort(_)), "a local write is refused");
    assert!(meta::held_by_distributed(s.get(k(1)).unwrap()));
    lock_in(&s, 1, 11, Mode::Shared);
    let upgrade = meta::acquire(s.get(k(1)).unwrap(), 9, Prio(9, 9), Mode::Exclusive, Policy::WaitDie, true);
    assert!(matches!(upgrade, Acquire::Wait(_)), "the older reader waits for the other to upgrade");
    meta::release(s.get(k(1)).unwrap(), 11);
    assert!(s.get(k(1)).unwrap().lock().meta.lock.holds(9, Mode::Exclusive), "granted on release");
    assert!(meta::held_by_distributed(s.get(k(1)).unwrap()));
    assert!(meta::commit(s.get(k(1)).unwrap(), 9, 9, Some(Some(Value::copy_from(b"w")))).is_some());
    assert!(!meta::held_by_distributed(s.get(k(1)).unwrap()), "free again");
}

/// The runs' abort reasons: Primo's own local ones and the switch, in one-shot and interactive
/// runs (interactive transactions turn distributed midway). A local transaction whose read
/// changed before it validates needs another thread to commit in between: in the simulator a
/// local transaction never yields, so that one comes from the `local` runtime (YCSB on one node,
/// two worker threads, hot keys).
#[test]
fn every_abort_path_is_its_own_reason() {
    let mut seen = std::collections::BTreeMap::new();
    let local =
        WorkloadParams { name: "ycsb".into(), keys: 10, ops: 4, read_ratio: 0.5, theta: 0.99, ..Default::default() };
    let append = WorkloadParams { name: "append".into(), keys: 6, ops: 4, read_ratio: 0.7, ..Default::default() };
    for seed in 1..=3 {
        for (wl, one_shot) in [(&local, true), (&append, true), (&append, false)] {
            let mut s = protocol_spec("primo:wm_us=2000", wl.clone(), 60 + seed);
            s.proto.one_shot = one_shot;
            // YCSB has no history to check (the shared sweeps check Primo's); append's is checked.
            let out = match wl.name.as_str() {
                "append" => checked(&s),
                _ => {
                    (s.runtime, s.nodes, s.workers, s.duration_us) = (crate::host::Runtime::Local, 1, 2, 200_000);
                    crate::host::run_local(&s).expect("the local run")
                }
            };
            for (k, v) in &out.totals.aborts {
                *seen.entry(k.clone()).or_insert(0) += v;
            }
        }
    }
    for (reason, _) in super::ABORTS {
        assert!(seen.get(*reason).copied().unwrap_or(0) > 0, "{reason} never seen: {seen:?}");
    }
    assert!(!seen.contains_key("tictoc-version-changed"), "Primo reports its own reasons: {seen:?}");
}

/// YCSB with half its transactions distributed and that fraction of its writes blind.
fn distributed_ycsb(blind_write_ratio: f64) -> WorkloadParams {
    WorkloadParams {
        name: "ycsb".into(),
        keys: 200,
        ops: 6,
        read_ratio: 0.3,
        blind_write_ratio,
        distributed: 0.5,
        ..Default::default()
    }
}

/// Blind writes to other partitions, interactively: each takes its lock at commit (a dummy read
/// under WCF, the prepare under `wcf=off`), and the partition must then hear the outcome.
#[test]
fn interactive_blind_writes_to_other_partitions_commit() {
    for variant in ["primo:wm_us=2000", "primo:wm_us=2000:wcf=off"] {
        let mut s = protocol_spec(variant, distributed_ycsb(1.0), 5);
        s.proto.one_shot = false;
        let out = crate::host::run_sim(&s).expect("the run");
        assert!(out.totals.committed > 100, "{variant}: {} committed", out.totals.committed);
    }
}

/// One-shot blind writes (§4.2): a dummy read rides with a read to its partition, and a
/// partition written only blindly costs a round trip of its own at commit
/// (`primo-dummy-read-rounds`); read-modify-writes never do, nor does `dummy_reads=first-round`,
/// which locks every declared key in the first round.
#[test]
fn one_shot_dummy_reads_ride_with_reads_or_take_their_own_round() {
    let rounds = |variant: &str, blind_write_ratio: f64| {
        let mut s = protocol_spec(variant, distributed_ycsb(blind_write_ratio), 5);
        s.proto.one_shot = true;
        let out = crate::host::run_sim(&s).expect("the run");
        assert!(out.totals.committed > 100, "{variant}: {} committed", out.totals.committed);
        out.totals.counters.get(super::DUMMY_READ_ROUNDS).copied().unwrap_or(0)
    };
    assert!(rounds("primo:wm_us=2000", 1.0) > 0, "no partition was written only blindly");
    assert_eq!(rounds("primo:wm_us=2000", 0.0), 0, "read-modify-writes lock in the first round");
    assert_eq!(rounds("primo:wm_us=2000:dummy_reads=first-round", 1.0), 0);
}

#[test]
fn contended_histories_are_serializable() {
    for variant in ["primo:wm_us=2000", "primo:wm_us=2000:wcf=off"] {
        for seed in 1..=3 {
            let out = checked(&protocol_spec(variant, contended_append(), seed));
            assert!(out.totals.committed > 100, "{variant} seed {seed}: {} committed", out.totals.committed);
        }
    }
}

/// Crashes and partitions with a write-ahead log: every restart goes through an agreement that
/// rolls back what lies above the agreed watermark, the history stays serializable and every
/// acknowledged write survives.
#[test]
fn durable_runs_with_crashes_roll_back_and_stay_serializable() {
    let mut rollbacks = 0;
    for seed in 1..=3 {
        let out = checked(&durable_run_with_crashes("primo:wm_us=2000", contended_append(), 800 + seed));
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        rollbacks += out.totals.counters.get("wm-rollbacks").copied().unwrap_or(0);
    }
    assert!(rollbacks > 0, "no agreement rolled anything back");
}

/// A run with a write-ahead log in which node 1's log refuses every record for 20 ms from
/// 100 ms (`logfail`), and node 1 restarts from its log at 150 ms (a crash, as an operator
/// restarts a stopped server), checked under the serializability checker.
fn unlogged_install_run(seed: u64) -> crate::host::BenchSpec {
    use crate::net::{FaultTarget, TargetedFault, TargetedKind};
    let mut s = protocol_spec("primo:wm_us=2000", contended_append(), seed);
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.cluster_id = seed;
    let at = |kind, at_us, for_us| TargetedFault { kind, target: FaultTarget::Node(1), at_us, for_us: Some(for_us) };
    s.faults.targeted = vec![at(TargetedKind::LogFail, 100_000, 20_000), at(TargetedKind::Crash, 150_000, 50_000)];
    s
}

/// A participant whose log refuses an `Install` stops (fail-stop) instead of installing writes
/// that are in no log: it publishes no watermark past them, so nothing is acknowledged from
/// shortly after its log failed until it restarts, and its restart's agreement rolls the
/// commit back everywhere; nothing acknowledged is lost. (It used to warn, install, and leave
/// the active set: once its log took records again, its next W_p passed the commit, which was
/// acknowledged, and its restart from the log lost its writes there.)
#[test]
fn a_participant_that_cannot_log_its_install_stops_and_loses_nothing_acknowledged() {
    for seed in 1..=3 {
        let out = checked(&unlogged_install_run(900 + seed));
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        let stopped = 125_000..150_000;
        let acknowledged = out.history.iter().filter(|l| l.status == "committed" && stopped.contains(&l.end_us));
        let acknowledged = acknowledged.count();
        assert_eq!(acknowledged, 0, "seed {seed}: commits acknowledged while node 1 should have stopped");
        // What a stopped node answers a lock with (its own counters went with its restart).
        let refused = out.totals.aborts.get("wm-stopped").copied().unwrap_or(0);
        assert!(refused > 0, "seed {seed}: node 1 did not stop when its log refused an install");
    }
}

/// A run with a write-ahead log in which node 1 is cut off from the other nodes (not crashed:
/// it keeps running, its memory and its log) from 100 ms to 250 ms of 400 ms, as `--fault-at
/// 'partition:node=1@100ms+150ms'` asks, checked under the serializability checker.
fn cut_off_run(seed: u64) -> crate::host::BenchSpec {
    use crate::net::{FaultTarget, TargetedFault, TargetedKind};
    let mut s = protocol_spec("primo:wm_us=2000", contended_append(), seed);
    s.duration_us = 400_000;
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.cluster_id = seed;
    let cut = TargetedFault {
        kind: TargetedKind::Partition,
        target: FaultTarget::Node(1),
        at_us: 100_000,
        for_us: Some(150_000),
    };
    s.faults.targeted = vec![cut];
    s
}

/// A partition cut off without crashing calls for no agreement (it lost nothing), yet the cut
/// leaves locks it took for transactions whose coordinators gave up, whose aborts the cut lost:
/// they hold its W_p, and so W_g everywhere, until the orphan sweeper asks about them a second
/// later. Node 0 suspects the silent partition and starts an agreement, which completes once
/// the cut heals: W_g moves again, commits are acknowledged after the cut, and nothing
/// acknowledged is lost (the checker's final read sees every acknowledged append). (Before
/// node 0 suspected silence, W_g moved for a moment as the cut healed and stuck again: no
/// commit was acknowledged from 280 ms to 380 ms.)
#[test]
fn a_partition_cut_off_without_crashing_is_suspected_and_the_watermark_moves_again() {
    for seed in 1..=3 {
        let out = checked(&cut_off_run(800 + seed));
        let after_cut = 280_000..380_000;
        let acknowledged = out.history.iter().filter(|l| l.status == "committed" && after_cut.contains(&l.end_us));
        let acknowledged = acknowledged.count();
        assert!(acknowledged > 100, "seed {seed}: {acknowledged} commits acknowledged 30-130 ms after the cut healed");
        let counter = |name: &str| out.totals.counters.get(name).copied().unwrap_or(0);
        assert!(counter("wm-suspected") > 0, "seed {seed}: node 0 suspected no partition");
        assert!(counter("wm-rollbacks") > 0, "seed {seed}: no agreement went through");
    }
}
