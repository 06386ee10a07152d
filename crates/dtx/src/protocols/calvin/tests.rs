//! Calvin's core, run end to end in the simulator: each abort path it claims, its counters, and
//! its histories checked. (The shared sweeps in `tests/` run it with every other protocol.)

use crate::host::{self, BenchSpec};
use crate::testkit::{checked_run as checked, contended_append as append};
use crate::workloads::WorkloadParams;

fn spec(variant: &str, workload: WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = crate::testkit::protocol_spec(variant, workload, seed);
    s.workers = 2;
    s
}

#[test]
fn batches_run_in_one_order_and_multi_node_transactions_exchange_reads() {
    for seed in 1..=4 {
        let out = checked(&spec("calvin:batch_us=1000", append(), seed));
        let c = &out.totals.counters;
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        assert!(c.get("batches").copied().unwrap_or(0) > 50, "seed {seed}: {c:?}");
        assert!(c.get("multi-node-txns").copied().unwrap_or(0) > 0, "seed {seed}: {c:?}");
        assert!(out.totals.aborts.is_empty(), "deterministic execution never aborts here: {:?}", out.totals.aborts);
    }
}

/// Deterministic ordered locking: transactions whose keys do not conflict run side by side
/// (one starts while another waits for a remote read), conflicting ones queue in log order, and
/// the history stays serializable. Every data node sequences, and the schedulers take each
/// epoch's batches from all of them (three nodes: three batches an epoch, against one with
/// `sequencers=one`), in one order.
#[test]
fn transactions_overlap_under_ordered_locks_and_every_node_sequences() {
    for seed in 1..=3 {
        let run = |variant: &str| {
            let mut s = spec(variant, append(), 40 + seed);
            s.nodes = 3;
            checked(&s)
        };
        let (per_node, one) = (run("calvin:batch_us=1000"), run("calvin:batch_us=1000:sequencers=one"));
        for out in [&per_node, &one] {
            let c = &out.totals.counters;
            assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
            assert!(c.get("calvin-overlapped").copied().unwrap_or(0) > 0, "seed {seed}: nothing overlapped: {c:?}");
            assert!(c.get("calvin-lock-waits").copied().unwrap_or(0) > 0, "seed {seed}: no conflict queued: {c:?}");
        }
        let batches = |o: &host::Outcome| o.totals.counters.get("batches").copied().unwrap_or(0);
        assert!(batches(&per_node) > 2 * batches(&one), "seed {seed}: {} vs {}", batches(&per_node), batches(&one));
    }
}

#[test]
fn a_full_sequencer_refuses_and_its_clients_retry() {
    let out = checked(&spec("calvin:max_pending=2", append(), 7));
    assert!(out.totals.aborts.get("sequencer-full").copied().unwrap_or(0) > 0, "{:?}", out.totals.aborts);
    assert!(out.totals.counters.get("sequencer-refusals").copied().unwrap_or(0) > 0);
    assert!(out.totals.committed > 0);
}

/// OLLP and scans: TPC-C's whole mix, whose Order-Status, Delivery and Stock-Level keys depend
/// on reads and which scan (and Payment by last name, whose declaration names its scan), runs
/// through reconnaissance and range locks; every kind commits, the consistency conditions hold
/// after the run (their chunks scan without declaring it), and a procedure learned to scan is
/// reconnoitred from then on: each worker meets `scan-undeclared` at most once, for the checks.
#[test]
fn reconnaissance_finds_dependent_keys_and_scans_lock_their_ranges() {
    for seed in 1..=3 {
        let wl = WorkloadParams { name: "tpcc".into(), warehouses: 2, ..Default::default() };
        let mut s = spec("calvin:batch_us=1000", wl, seed);
        s.run_checks = true;
        s.latency.delay_us = 100;
        let out = host::run_sim(&s).expect("the simulation runs");
        let t = &out.totals;
        for kind in ["new-order", "payment", "order-status", "delivery", "stock-level"] {
            assert!(t.by_kind.get(kind).copied().unwrap_or(0) > 0, "seed {seed}: no {kind} committed: {:?}", t.by_kind);
        }
        assert!(t.counters.get("reconnaissance-runs").copied().unwrap_or(0) > 0, "seed {seed}: {:?}", t.counters);
        let failed: Vec<_> = t.findings.iter().filter(|c| !c.1).collect();
        assert!(
            !t.findings.is_empty() && failed.is_empty(),
            "seed {seed}: {failed:#?} {:?} {:?}",
            t.aborts,
            t.counters
        );
        let learned = t.aborts.get("scan-undeclared").copied().unwrap_or(0);
        let workers = u64::from(s.nodes) * u64::from(s.workers);
        assert!(learned <= workers, "seed {seed}: {learned} scan-undeclared aborts: {:?}", t.aborts);
    }
}

/// Lost messages, partitions and nodes that stop and come back with their memory (crashes
/// without a log): batches, reads and outcomes are sent until they arrive, and a stopped
/// node's schedulers go on where they were.
#[test]
fn lost_messages_are_sent_again_and_histories_stay_serializable() {
    for seed in 1..=6 {
        let (crashes, partitions) = (seed % 2 == 0, seed > 3);
        let out = checked(&spec("calvin:batch_us=1000", append(), 100 + seed).with_faults(crashes, partitions, 0.02));
        assert!(out.totals.committed > 0, "seed {seed}");
    }
}

#[test]
fn worker_0_is_the_schedulers_and_runs_no_clients() {
    use crate::cluster::Topology;
    use crate::protocols::Variant;
    let calvin = Variant::parse_including_planned("calvin").unwrap().make();
    assert_eq!(calvin.service_workers(), 1);
    let e = calvin.check_topology(&Topology::new(2, 1, 1)).unwrap_err().to_string();
    assert!(e.contains("2 workers or more"), "{e}");
    assert!(calvin.check_topology(&Topology::new(2, 2, 1)).is_ok());
    // A spec made for calvin gives it the scheduler beside one client worker.
    assert_eq!(spec("calvin", append(), 1).workers, 2);
    assert_eq!(BenchSpec::new("calvin", append(), crate::host::Runtime::Sim).workers, 2);
}

/// Three nodes, each node's log a Raft group of three, compacted every 50 records.
fn replicated(variant: &str, seed: u64) -> BenchSpec {
    let mut s = spec(variant, append(), seed);
    s.nodes = 3;
    s.durability.mode = crate::replication::Durability::Replicated;
    s.durability.replicas = 3;
    s.durability.snapshot_every = 50;
    s
}

/// With one sequencer and a replicated log, the sequencer's batches are made durable in node 0's
/// Raft group before any scheduler runs them, and each of that log's three replicas executes
/// them on a full copy of the data, snapshots the copy and compacts its log behind it. Every
/// committed transaction was applied by at least the leader's replica first, so the replicas
/// together ran at least as many as committed; the history, checked, covers the data nodes.
#[test]
fn the_input_log_is_durable_before_it_runs_and_its_replicas_execute_it() {
    for seed in 1..=2 {
        let out = checked(&replicated("calvin:batch_us=1000:sequencers=one", seed));
        let c = &out.totals.counters;
        let replayed = c.get("input-replayed-committed").copied().unwrap_or(0);
        assert!(c.get("calvin-overlapped").copied().unwrap_or(0) > 0, "seed {seed}: {c:?}");
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        assert!(replayed >= out.totals.committed, "seed {seed}: replicas ran {replayed} of {}", out.totals.committed);
        assert!(c.get("raft-snapshots-taken").copied().unwrap_or(0) > 0, "seed {seed}: no log compacted: {c:?}");
        assert_eq!(c.get("input-replayed-undecodable").copied().unwrap_or(0), 0, "seed {seed}: {c:?}");
    }
}

/// With a sequencer per node, each node's batches are durable in its own Raft group before any
/// scheduler runs them; a log holds one sequencer's share of the order, so its replicas execute
/// nothing, but they keep every input in their snapshots and compact the log behind them.
#[test]
fn every_sequencers_input_log_is_durable_and_compacts() {
    for seed in 1..=2 {
        let out = checked(&replicated("calvin:batch_us=1000", 30 + seed));
        let c = &out.totals.counters;
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        assert!(c.get("raft-snapshots-taken").copied().unwrap_or(0) > 0, "seed {seed}: no log compacted: {c:?}");
        assert_eq!(c.get("input-replayed-committed").copied().unwrap_or(0), 0, "seed {seed}: {c:?}");
    }
}

/// Checkpoints ([`super::checkpoint`]): a node that checkpoints every 20 ms leaves its log's
/// replicas the last checkpoint and the inputs after it (at the end of the run, summed over every
/// replica of every log), a small part of what they keep without (every input since the start);
/// histories check either way. Calvin, SLOG and Detock, each with its own state to checkpoint.
#[test]
fn checkpoints_bound_what_an_input_log_keeps() {
    for variant in ["calvin:batch_us=1000", "slog:batch_us=1000", "detock:batch_us=1000"] {
        let run = |variant: &str| {
            let mut s = replicated(variant, 77);
            s.workers = 1 + host::service_workers(variant);
            s.duration_us = 600_000;
            let out = checked(&s);
            let c = |name: &str| out.totals.counters.get(name).copied().unwrap_or(0);
            assert!(out.totals.committed > 100, "{variant}: {} committed", out.totals.committed);
            (c("input-records-kept"), c("calvin-checkpoints"), c("orderer-checkpoints"))
        };
        let (without, none, _) = run(variant);
        let (with, checkpoints, orderer) = run(&format!("{variant}:checkpoint_us=20000"));
        assert_eq!(none, 0, "{variant}: checkpoints are on by default only past a second");
        assert!(checkpoints >= 3 * 20, "{variant}: {checkpoints} checkpoints over three nodes and 600 ms");
        let orderers = variant.starts_with("slog") as u64;
        assert!(orderer >= 20 * orderers && orderer <= 30 * orderers, "{variant}: {orderer} orderer checkpoints");
        assert!(with * 5 < without, "{variant}: replicas keep {with} records with checkpoints, {without} without");
    }
}

/// A node whose log grows fast checkpoints by its size, however long `checkpoint_us` is: with an
/// hour between checkpoints by time and one every MiB of log, the replicas keep a small part of
/// what they keep with neither (a 4-region Detock run outgrew 24 GB before its first second).
#[test]
fn a_log_that_grows_fast_is_checkpointed_by_its_size() {
    let run = |variant: &str| {
        let mut s = replicated(variant, 78);
        s.duration_us = 600_000;
        let out = checked(&s);
        let c = |name: &str| out.totals.counters.get(name).copied().unwrap_or(0);
        (c("input-records-kept"), c("calvin-checkpoints-by-log-size"))
    };
    let (without, none) = run("calvin:batch_us=1000:checkpoint_log_mib=0");
    let (with, by_size) = run("calvin:batch_us=1000:checkpoint_us=3600000000:checkpoint_log_mib=1");
    assert_eq!(none, 0);
    assert!(by_size > 0, "no checkpoint by the log's size");
    assert!(with * 2 < without, "replicas keep {with} records with checkpoints by size, {without} without");
}

/// A record can outgrow a replicated log's entry (Raft takes at most 1 MiB a proposal): a
/// checkpoint's rows go 4,096 to a record, a slice of them every 10 ms some 1.8 MB of rows of
/// 4,000 bytes here. It goes in pieces, and
/// the log goes on: proposed whole, it was refused at every try, and the node's log, then the
/// whole run, stopped for good (as a 4-region Detock run's 2.7 MB checkpoints did).
#[test]
fn a_record_over_a_replicated_entry_goes_in_pieces_and_the_log_goes_on() {
    let wl = WorkloadParams {
        name: "ycsb".into(),
        keys: 6_000,
        ops: 10,
        read_ratio: 0.0,
        value_bytes: 4_000,
        distributed: 0.1,
        ..Default::default()
    };
    let mut s = spec("calvin:batch_us=1000:checkpoint_us=150000", wl, 5);
    s.nodes = 3;
    s.durability.mode = crate::replication::Durability::Replicated;
    s.durability.replicas = 3;
    s.duration_us = 600_000;
    let out = host::run_sim(&s).expect("the simulation runs");
    let c = |name: &str| out.totals.counters.get(name).copied().unwrap_or(0);
    assert!(c("raft-records-in-pieces") > 0, "no record went in pieces: {:?}", out.totals.counters);
    assert!(c("calvin-checkpoints") > 3, "{:?}", out.totals.counters);
    let last = &out.totals.per_tick[out.totals.per_tick.len() - 2..];
    assert!(last.iter().all(|&n| n > 0), "commits stopped: {:?}", out.totals.per_tick);
}

/// A full copy in each of two regions (`--placement per-region`): both regions' schedulers run
/// every batch, exchange reads within their region only, and answer their own region's clients.
/// Clients of both regions read their own copy, so a copy that diverged would show in the
/// checked history as reads no serial order explains.
#[test]
fn a_copy_per_region_runs_every_batch_and_answers_its_own_clients() {
    for seed in 1..=3 {
        let mut s = spec("calvin:batch_us=1000", append(), 20 + seed);
        s.nodes = 4;
        s.latency.node_region = vec![0, 0, 1, 1];
        s.placement = crate::cluster::Placement::PerRegion;
        let single = checked(&spec("calvin:batch_us=1000", append(), 20 + seed));
        let out = checked(&s);
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        assert!(out.totals.aborts.is_empty(), "seed {seed}: {:?}", out.totals.aborts);
        let multi = |o: &host::Outcome| o.totals.counters.get("multi-node-txns").copied().unwrap_or(0);
        assert!(multi(&out) > 0 && multi(&single) > 0, "seed {seed}: reads are exchanged within a region");
    }
    // A client whose region holds no copy is refused, naming it.
    let mut s = spec("calvin", append(), 1);
    s.nodes = 3;
    s.latency.node_region = vec![0, 0, 1];
    s.node_roles = vec![
        crate::cluster::Roles::DEFAULT,
        crate::cluster::Roles::DEFAULT,
        crate::cluster::Roles::of(&[crate::cluster::Role::Client]),
    ];
    s.placement = crate::cluster::Placement::PerRegion;
    let calvin = crate::protocols::Variant::parse_including_planned("calvin").unwrap().make();
    let e = calvin.check_topology(&s.topology()).unwrap_err().to_string();
    assert!(e.contains("client node 2's region 1 has no data node"), "{e}");
}

/// The same code on real threads, the machine's clock and a real WAL (`--runtime local
/// --durability wal`): every node's sequencer and scheduler, ordered locking, the read exchange
/// and the logging of what a scheduler takes, history checked.
#[test]
fn it_runs_in_the_local_runtime_too() {
    let mut s = spec("calvin:batch_us=2000", append(), 5);
    s.runtime = crate::host::Runtime::Local;
    let dir = std::env::temp_dir().join(format!("dtx-calvin-local-{}", std::process::id()));
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.data_dir = Some(dir.clone());
    let out = checked(&s);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.totals.committed > 20, "{} committed", out.totals.committed);
    assert!(out.totals.counters.get("multi-node-txns").copied().unwrap_or(0) > 0, "{:?}", out.totals.counters);
}

/// `--durability wal` with crashes that lose a node's memory: the restarted node runs every
/// input its log holds again from the first (its own batches, and the batches and reads it
/// took from the others, which it acknowledged only once they were durable), and takes the
/// rest as the others send them again; histories stay serializable with every acknowledged
/// append in the final state.
#[test]
fn a_node_that_lost_its_memory_runs_its_logged_inputs_again() {
    let mut restarts = 0;
    for seed in 1..=6 {
        let mut s = spec("calvin:batch_us=1000", append(), 200 + seed).with_faults(true, seed > 3, 0.01);
        s.durability.mode = crate::replication::Durability::Wal;
        s.durability.cluster_id = 200 + seed;
        s.duration_us = 400_000;
        s.faults.fault_interval_us = 100_000;
        let out = checked(&s);
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        restarts += out.restarts;
    }
    assert!(restarts >= 3, "only {restarts} nodes lost their memory over the sweep");
}

/// `--durability replicated` with crashes: a crashed node's logs fail over to a replica on
/// another host, whose node runs every input the log holds again from the first, those behind
/// a snapshot (every 50 records here) included.
#[test]
fn a_failed_over_node_runs_its_replicated_inputs_again() {
    let mut failovers = 0;
    for seed in 1..=4 {
        let mut s = replicated("calvin:batch_us=1000", 300 + seed).with_faults(true, false, 0.0);
        s.duration_us = 400_000;
        s.faults.fault_interval_us = 100_000;
        let out = checked(&s);
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        failovers += out.totals.failovers;
    }
    assert!(failovers >= 2, "only {failovers} failovers over the sweep");
}

/// A client submits to its transaction's home region's sequencer, often on another node. When
/// that node crashes after logging a batch with the submission, and a copy of the submission
/// (resent on a lossy, partitioned network) reaches the replica that took the node over, the
/// new sequencer drops it (`resubmits`): such a transaction ran twice before (duplicate
/// appends; the tcp nemesis met it as well). These seeds meet the case (a copy is dropped; the
/// seeds change when the messages' sizes do, so the test says so rather than pass idle), and
/// each stays serializable. Detock shares the code (`resubmits`); its seed 24 met the case until
/// 2026-12-03's changes to the messages, and none of its seeds 1-199 meets it since (searched
/// 2026-12-05), so Detock's run here is checked for serializability across its failover only.
/// SLOG's seeds 68 and 118 met it until checkpoints' rows went in slices (2026-12-05), 151 until
/// the simulator charged a worker for the bytes it logs (2026-12-06), 12 until it charged decoding
/// and wakes (2026-12-07), when of seeds 1-400, 30, 105, 155 and 343 met it (with list-append's
/// retiring keys, since taken back out: none of them does without). So SLOG runs the seeds that
/// met it, then seeds 1-400, in turn, until one does: each run is checked, and one must meet the
/// case, or the test fails. The
/// recovery that drops the copy is tested record by record, with no seed to depend on, in
/// `input_log::tests::a_restarted_node_drops_a_copy_of_every_submission_its_log_holds`.
#[test]
fn a_submission_resent_to_a_failed_over_sequencer_runs_once() {
    let detock = checked(&crate::testkit::replicated_failover_spec("detock", 24));
    assert!(detock.totals.failovers > 0, "detock seed 24: no node was taken over");
    // The seeds that met it before, then the first 400: a few in a hundred meet it. Every
    // seed's history checks; a seed whose faults took no node over cannot meet it (seed 15
    // since the list-append keys retire) and the search goes on.
    let met = [155, 30, 105, 343, 12, 183].into_iter().chain(1..=400).find(|&seed| {
        let out = checked(&crate::testkit::replicated_failover_spec("slog", seed));
        out.totals.failovers > 0 && out.totals.counters.get("resubmissions-dropped").is_some_and(|&n| n > 0)
    });
    assert!(met.is_some(), "slog: no seed's resent copy reached a failed-over sequencer: search the seeds again");
}

/// A region-homed protocol on this engine (`slog`, `detock`) runs TPC-C's whole mix with a copy
/// per region in two regions, multi-home transactions among them, over two seeds: every kind
/// commits and the consistency conditions hold on every copy.
pub(crate) fn every_region_runs_tpcc_to_the_same_state(variant: &str) {
    for seed in 1..=2 {
        let wl = WorkloadParams { name: "tpcc".into(), warehouses: 4, ..Default::default() };
        let mut s = crate::testkit::protocol_spec(variant, wl, seed);
        s.workers = 1 + host::service_workers(variant);
        s.nodes = 4;
        s.latency.node_region = vec![0, 1, 0, 1];
        s.placement = crate::cluster::Placement::PerRegion;
        s.run_checks = true;
        s.latency.delay_us = 100;
        let out = host::run_sim(&s).expect("the simulation runs");
        let t = &out.totals;
        for kind in ["new-order", "payment", "order-status", "delivery", "stock-level"] {
            assert!(t.by_kind.get(kind).copied().unwrap_or(0) > 0, "seed {seed}: no {kind} committed: {:?}", t.by_kind);
        }
        assert!(t.counters.get("multi-home-txns").copied().unwrap_or(0) > 0, "seed {seed}: {:?}", t.counters);
        let failed: Vec<_> = t.findings.iter().filter(|c| !c.1).collect();
        assert!(!t.findings.is_empty() && failed.is_empty(), "seed {seed}: {failed:#?}");
    }
}

/// Homes that move (`rehome`, [`super::homes`]), on a region-homed protocol (`slog`, `detock`)
/// with a copy per region in two regions: clients move keys' homes to their own region before
/// multi-home transactions, a transaction routed by a stale home aborts alike everywhere and
/// runs again where the key now is, histories check, and every region's copy ends alike. A
/// workload that scans is refused before the run.
pub(crate) fn homes_move_and_every_region_stays_alike(variant: &str) {
    for seed in 1..=3 {
        let variant = format!("{variant}:rehome=0.3");
        let mut s = crate::testkit::protocol_spec(&variant, append(), 40 + seed);
        s.workers = 2 + host::service_workers(&variant);
        s.nodes = 4;
        s.latency.node_region = vec![0, 1, 0, 1];
        s.placement = crate::cluster::Placement::PerRegion;
        let out = checked(&s);
        let t = &out.totals;
        let counter = |name: &str| t.counters.get(name).copied().unwrap_or(0);
        assert!(t.committed > 50, "seed {seed}: {} committed", t.committed);
        assert!(counter("home-moves") > 0, "seed {seed}: no home moved: {:?}", t.counters);
        assert!(t.aborts.get("home-moved").is_some_and(|n| *n > 0), "seed {seed}: none routed stale: {:?}", t.aborts);
        let copies = t.findings.iter().find(|f| f.0.starts_with("every copy"));
        assert!(copies.is_some_and(|f| f.1), "seed {seed}: {copies:?}");
    }
    let tpcc = WorkloadParams { name: "tpcc".into(), warehouses: 2, ..Default::default() };
    let e = crate::testkit::protocol_spec(&format!("{variant}:rehome=0.1"), tpcc, 1).validate().unwrap_err();
    assert!(e.to_string().contains("this workload scans"), "{e}");
}

/// A scheduler answers a copy of an input it already took (a batch, or a participant's reads)
/// only once its own log holds the first durably. These SLOG runs stalled for good before:
/// a node answered a sequencer's resent batches as taken while its log had not made them
/// durable, then crashed, and came back without them and with no one to send them again (its
/// final read never ran). Seed 20 at the failover spec's 2% loss; 10, 25 and 28 at 20%.
#[test]
fn a_copy_of_an_input_is_answered_once_the_first_is_durable() {
    for (seed, loss) in [(20, 0.02), (10, 0.2), (25, 0.2), (28, 0.2)] {
        let mut s = crate::testkit::replicated_failover_spec("slog", seed);
        s.faults.loss = loss;
        let out = checked(&s);
        assert!(out.totals.failovers > 0, "seed {seed}: no node was taken over");
    }
}
