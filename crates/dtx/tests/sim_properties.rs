//! Properties of the engine measured in virtual time, so they hold on any machine: WAN delay
//! costs no wall time, throughput comes from transactions in flight, and a distributed
//! transaction sends exactly the protocol's textbook number of messages.

use dtx::bench;
use dtx::host::{self, BenchSpec};
use dtx::workloads::WorkloadParams;
use std::time::Instant;

fn ycsb(protocol: &str, nodes: u16, distributed: f64, read_ratio: f64) -> BenchSpec {
    let wl = WorkloadParams { keys: 100_000, distributed, read_ratio, ..Default::default() };
    let mut s = BenchSpec::new(protocol, wl, dtx::host::Runtime::Sim);
    s.nodes = nodes;
    s.duration_us = 200_000;
    s.warmup_us = 20_000;
    s
}

#[test]
fn a_50ms_wan_costs_no_wall_time() {
    let mut s = ycsb("occ", 2, 0.5, 0.8);
    s.latency.delay_us = 50_000;
    s.inflight = 16;
    s.duration_us = 5_000_000;
    s.warmup_us = 500_000;
    let t0 = Instant::now();
    let out = host::run_sim(&s).unwrap();
    assert!(out.totals.committed > 1000, "committed {}", out.totals.committed);
    // 5.5 s of virtual time with 100 ms round trips, simulated in well under its own length.
    assert!(t0.elapsed().as_secs_f64() < 5.0, "took {:?}", t0.elapsed());
    let p50 = out.totals.histogram().value_at_quantile(0.5);
    let p99 = out.totals.histogram().value_at_quantile(0.99);
    assert!(p99 >= 200_000, "distributed transactions need two or more 100 ms round trips: p99 {p99} µs");
    assert!(p50 < 100, "local transactions stay fast: p50 {p50} µs");
}

#[test]
fn throughput_comes_from_transactions_in_flight() {
    for protocol in ["occ", "2pl-nowait", "2pl-waitdie"] {
        let run = |inflight| {
            let mut s = ycsb(protocol, 4, 0.2, 0.8);
            s.latency.delay_us = 100;
            s.inflight = inflight;
            host::run_sim(&s).unwrap().totals.committed as f64
        };
        let (one, many) = (run(1), run(32));
        assert!(many > 5.0 * one, "{protocol}: inflight 32 gives {many}, inflight 1 gives {one}");
    }
}

/// Messages per committed transaction when every transaction touches one remote node and
/// nothing conflicts: reads and writes on both nodes.
fn msgs_per_txn(protocol: &str, read_ratio: f64, one_shot: bool) -> f64 {
    let mut s = ycsb(protocol, 2, 1.0, read_ratio);
    s.workload.keys = 1_000_000;
    s.workload.ops = 4;
    s.inflight = 1;
    s.proto.one_shot = one_shot;
    let out = host::run_sim(&s).unwrap();
    assert_eq!(out.totals.aborted(), 0, "{protocol}: the test assumes no conflicts");
    let m = out.totals.msgs as f64 / out.totals.committed as f64;
    eprintln!("{protocol} read_ratio {read_ratio} one_shot {one_shot}: {m} messages per transaction");
    m
}

/// Messages are counted over the measured window and transactions by when they commit, so the
/// ratio is exact only up to the transactions in flight at the window's two edges.
fn about(measured: f64, textbook: f64) -> bool {
    (measured - textbook).abs() < 0.01 * textbook
}

#[test]
fn distributed_transactions_send_the_textbook_message_count() {
    // One-shot, read-modify-writes on the remote node:
    // OCC: read, lock + validate (one message: the remote node is the only participant
    // besides the coordinator), commit round trips = 6 messages.
    // 2PL: lock, prepare, commit round trips = 6 messages.
    assert!(about(msgs_per_txn("occ", 0.0, true), 6.0));
    assert!(about(msgs_per_txn("2pl-nowait", 0.0, true), 6.0));
    // Read-only on the remote node: OCC read + validate = 4; 2PL lock + prepare (read-only
    // participants leave after prepare) = 4.
    assert!(about(msgs_per_txn("occ", 1.0, true), 4.0));
    assert!(about(msgs_per_txn("2pl-waitdie", 1.0, true), 4.0));
}

#[test]
fn one_shot_batches_remote_reads_into_one_round_trip() {
    // Interactive execution pays a round trip per remote access; one-shot pays one per node.
    let interactive = msgs_per_txn("occ", 1.0, false);
    let one_shot = msgs_per_txn("occ", 1.0, true);
    assert!(interactive > one_shot, "interactive {interactive} vs one-shot {one_shot}");
}

/// `--fault-at cpu:node=1,factor=3@0s`: node 1's charged CPU is tripled, node 0's is not. The
/// CPU the simulator charged per committed transaction grows (half the cluster's work costs
/// three times as much), and fewer transactions commit (node 1's workers are busy longer).
#[test]
fn a_cpu_factor_slows_the_named_node_down() {
    use dtx::net::{FaultTarget, TargetedFault, TargetedKind};
    let run = |factor: Option<f64>| {
        let mut s = ycsb("occ", 2, 0.1, 0.8);
        s.inflight = 32;
        if let Some(factor) = factor {
            s.faults.targeted = vec![TargetedFault {
                kind: TargetedKind::Cpu { factor },
                target: FaultTarget::Node(1),
                at_us: 0,
                for_us: None,
            }];
        }
        let out = host::run_sim(&s).unwrap();
        (out.totals.cpu_us as f64 / out.totals.committed as f64, out.totals.committed, out.fault_events)
    };
    let (plain_cpu, plain_commits, none) = run(None);
    let (slow_cpu, slow_commits, events) = run(Some(3.0));
    assert!(none.is_empty());
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].kind.as_str(), events[0].node, events[0].at_ms), ("cpu", 1, 0.0));
    assert!(slow_cpu > 1.5 * plain_cpu, "CPU per transaction {slow_cpu} µs with node 1 at 3x, {plain_cpu} µs without");
    assert!(slow_commits < plain_commits, "{slow_commits} commits with node 1 at 3x, {plain_commits} without");
}

/// `--fault-at delay:node=0,by=20ms@50ms+100ms`: every message node 0 sends in that window
/// arrives 20 ms later, so distributed transactions take 20 ms or more there; no other fault.
/// With `worker=1`, only what node 0's worker 1 sends is held: the transactions that wait
/// for it take 20 ms, but they are too few to reach the p99 that the whole node's delay does.
#[test]
fn a_delay_holds_the_named_nodes_messages() {
    use dtx::net::{FaultTarget, TargetedFault, TargetedKind};
    let run = |delay: Option<Option<u16>>| {
        let mut s = ycsb("occ", 2, 0.5, 0.8);
        s.latency.delay_us = 100;
        s.workers = 2;
        if let Some(worker) = delay {
            let kind = TargetedKind::Delay { by_us: 20_000, worker, control: false };
            s.faults.targeted =
                vec![TargetedFault { kind, target: FaultTarget::Node(0), at_us: 50_000, for_us: Some(100_000) }];
        }
        let out = host::run_sim(&s).unwrap();
        let h = out.totals.histogram();
        ((h.value_at_quantile(0.99), h.max()), out.fault_events)
    };
    let (((plain_p99, _), _), ((delayed_p99, _), events)) = (run(None), run(Some(None)));
    let ((one_worker_p99, one_worker_max), _) = run(Some(Some(1)));
    assert!(one_worker_max >= 20_000, "the slowest took {one_worker_max} µs with node 0's worker 1 held 20 ms");
    assert!(one_worker_p99 < 20_000, "p99 {one_worker_p99} µs with only node 0's worker 1 held");
    let events: Vec<(String, u32, f64, f64)> =
        events.iter().map(|e| (e.kind.clone(), e.node, e.at_ms, e.down_ms)).collect();
    assert_eq!(events, [("delay".to_string(), 0, 50.0, 100.0)]);
    assert!(plain_p99 < 5_000, "p99 {plain_p99} µs without the delay");
    assert!(delayed_p99 >= 20_000, "p99 {delayed_p99} µs with node 0's messages held 20 ms");
}

/// `--fault-at delay:node=1,by=100ms,messages=control@50ms+100ms`: only group commit's
/// control messages are held. A 2PC protocol sends none and does not notice; under COCO's
/// epochs every commit waits for node 1's vote, so some wait the 100 ms.
#[test]
fn a_control_delay_holds_only_group_commits_messages() {
    use dtx::net::{FaultTarget, TargetedFault, TargetedKind};
    let slowest_us = |protocol: &str, held: bool| {
        let mut s = ycsb(protocol, 2, 0.5, 0.8);
        s.latency.delay_us = 100;
        s.workers = 2;
        s.duration_us = 300_000;
        if held {
            let kind = TargetedKind::Delay { by_us: 100_000, worker: None, control: true };
            s.faults.targeted =
                vec![TargetedFault { kind, target: FaultTarget::Node(1), at_us: 50_000, for_us: Some(100_000) }];
        }
        let out = host::run_sim(&s).unwrap();
        assert!(out.totals.committed > 100, "{protocol}: committed {}", out.totals.committed);
        out.totals.histogram().max()
    };
    let occ = slowest_us("occ", true);
    assert!(occ < 20_000, "occ's slowest took {occ} µs with only control messages held");
    let (plain, held) = (slowest_us("coco:epoch_us=5000", false), slowest_us("coco:epoch_us=5000", true));
    assert!(plain < 50_000, "coco's slowest took {plain} µs without the delay");
    assert!(held >= 100_000, "coco's slowest took {held} µs with node 1's control messages held 100 ms");
}

/// `--fault-at pause:node=1@50ms+100ms`: node 1 runs nothing for 100 ms (what reaches it
/// waits), then goes on, losing nothing: the run commits after the pause and its history is
/// serializable; only that pause is listed.
#[test]
fn a_paused_node_goes_on_where_it_stopped() {
    use dtx::net::{FaultTarget, TargetedFault, TargetedKind};
    let wl = WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() };
    let mut s = BenchSpec::new("2pl-waitdie", wl, dtx::host::Runtime::Sim);
    s.duration_us = 400_000;
    s.warmup_us = 0;
    s.latency.delay_us = 150;
    s.faults.targeted = vec![TargetedFault {
        kind: TargetedKind::Pause,
        target: FaultTarget::Node(1),
        at_us: 50_000,
        for_us: Some(100_000),
    }];
    let out = host::run_sim(&s).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (report, problem) = bench::verify(&out, &dir.path().join("h.jsonl"), dtx::protocols::guarantee_of(&s.protocol))
        .expect("the history checks");
    assert!(problem.is_none(), "{problem:?} {:?}", report.anomalies.first());
    let events: Vec<(String, u32, f64)> = out.fault_events.iter().map(|e| (e.kind.clone(), e.node, e.at_ms)).collect();
    assert_eq!(events, [("pause".to_string(), 1, 50.0)]);
    // Commits per 100 ms tick: node 1's clients commit nothing while paused; the cluster goes on after.
    let ticks = &out.totals.per_tick;
    assert!(ticks.len() >= 4 && ticks[2] > 0 && ticks[3] > 0, "commits per 100 ms: {ticks:?}");
}
