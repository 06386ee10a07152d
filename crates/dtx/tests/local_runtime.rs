//! The `local` runtime: real threads and in-memory channels, with and without injected delay.

use dtx::bench;
use dtx::host::{self, BenchSpec, Outcome};
use dtx::protocols::REGISTRY;
use dtx::workloads::WorkloadParams;

#[allow(dead_code)] // The sweeps' shared helpers; this file uses `runnable`, `paced` and `workers`.
mod common;

#[test]
fn every_protocol_commits_and_verifies_on_threads() {
    for p in REGISTRY {
        let wl = WorkloadParams { name: "append".into(), keys: 32, ops: 4, read_ratio: 0.5, ..Default::default() };
        let mut s = BenchSpec::new(p.name, wl, dtx::host::Runtime::Local);
        s.nodes = 2;
        s.workers = common::workers(p.name, 2);
        s.inflight = 8;
        // Progress, not speed: the suite runs tests in parallel on two cores, so a contended
        // append run can be slowed many times over; a few dozen commits give the checker cycles
        // to look for, however long they take.
        s.duration_us = 500_000;
        s.warmup_us = 0;
        s.latency.delay_us = 50;
        s.latency.jitter_us = 20;
        let mut s = common::paced(common::runnable(s));
        let out = run_until_commits(&mut s, 20);
        let dir = tempfile::tempdir().unwrap();
        let (report, problem) = bench::verify(&out, &dir.path().join("h.jsonl"), p.guarantee).unwrap();
        assert!(problem.is_none(), "{}: {problem:?} {:?}", p.name, report.anomalies.first());
    }
}

/// Every protocol that replicates its logs does so on threads too (`local`'s owner-led logs):
/// the followers apply what each log commits to the protocol's log machine (Rolis's replay,
/// Calvin's execution, 2PC's records) as the run goes, and the history verifies.
#[test]
fn every_protocol_replicates_and_verifies_on_threads() {
    let replicated = dtx::replication::Durability::Replicated;
    for p in dtx::protocols::registry::ready_with(replicated, 3).filter(|p| common::chosen(p.name)) {
        let wl = WorkloadParams { name: "append".into(), keys: 32, ops: 4, read_ratio: 0.5, ..Default::default() };
        let mut s = BenchSpec::new(p.name, wl, dtx::host::Runtime::Local);
        (s.nodes, s.workers, s.inflight) = (3, common::workers(p.name, 2), 8);
        (s.durability.mode, s.durability.replicas) = (replicated, 3);
        (s.duration_us, s.warmup_us) = (300_000, 0);
        let out = run_until_commits(&mut s, 20);
        let dir = tempfile::tempdir().unwrap();
        let (report, problem) = bench::verify(&out, &dir.path().join("h.jsonl"), p.guarantee).unwrap();
        assert!(problem.is_none(), "{}: {problem:?} {:?}", p.name, report.anomalies.first());
    }
}

#[test]
fn ycsb_on_threads_reports_messages_and_latency() {
    let mut s = BenchSpec::new(
        "occ",
        WorkloadParams { keys: 10_000, distributed: 0.2, ..Default::default() },
        dtx::host::Runtime::Local,
    );
    s.nodes = 2;
    s.duration_us = 300_000;
    s.warmup_us = 50_000;
    let out = run_until_commits(&mut s, 200);
    let r = bench::report(&s, &out, None);
    assert!(r.msgs_per_txn > 0.5, "20% distributed transactions send messages: {}", r.msgs_per_txn);
    assert!(r.latency_us.p99 >= r.latency_us.p50);
}

/// Run `s` on threads until a run commits more than `min` transactions: on a busy machine the
/// run is made twice as long, up to 16 s, so that what is checked does not depend on how fast
/// the machine is; a run that still commits too few fails, saying so.
fn run_until_commits(s: &mut BenchSpec, min: u64) -> Outcome {
    loop {
        let out = host::run_local(s).unwrap();
        if out.totals.committed > min {
            return out;
        }
        assert!(
            s.duration_us < 16_000_000,
            "{}: a {:.1} s run committed {} transactions, not the {min} this test needs: the machine is too busy",
            s.protocol,
            s.duration_us as f64 / 1e6,
            out.totals.committed
        );
        s.duration_us *= 2;
    }
}
