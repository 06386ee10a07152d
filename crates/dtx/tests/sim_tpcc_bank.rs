//! TPC-C and bank under every protocol, in simulation with delay, jitter and loss: TPC-C's
//! consistency conditions 1-4 hold for every warehouse after the run, and every bank audit (during
//! the run and at the end) sees the invariant total. `DTX_SEEDS=N` sets the number of seeds.

use dtx::host::{self, BenchSpec};
use dtx::protocols::{ready, REGISTRY};
use dtx::workloads::WorkloadParams;

#[allow(dead_code)] // The sweeps' shared helpers; this file uses `chosen` alone.
mod common;

fn seeds() -> u64 {
    std::env::var("DTX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3)
}

fn spec(protocol: &str, workload: WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = BenchSpec::new(protocol, workload, dtx::host::Runtime::Sim);
    s.nodes = 2;
    s.inflight = 8;
    s.duration_us = 200_000;
    s.warmup_us = 0;
    s.latency.delay_us = 100;
    s.latency.jitter_us = 50;
    s.seed = seed;
    s.run_checks = true;
    s.with_faults(false, false, 0.01).with_durability_its_protocol_takes()
}

fn assert_checks(spec: &BenchSpec) {
    let out = host::run_sim(spec).expect("simulation runs");
    assert!(out.totals.committed > 0, "{} seed {}: nothing committed", spec.protocol, spec.seed);
    let f = &out.totals.findings;
    assert!(!f.is_empty(), "{} seed {}: no checks ran", spec.protocol, spec.seed);
    let failed: Vec<_> = f.iter().filter(|c| !c.1).collect();
    assert!(failed.is_empty(), "{} {} seed {}: {failed:#?}", spec.workload.name, spec.protocol, spec.seed);
}

#[test]
fn tpcc_consistency_holds_under_every_protocol() {
    for p in ready().filter(|p| common::chosen(p.name)) {
        for seed in 1..=seeds() {
            let wl = WorkloadParams { name: "tpcc".into(), warehouses: 2, ..Default::default() };
            assert_checks(&spec(p.name, wl, seed));
        }
    }
}

/// Every protocol with code, planned ones included.
#[test]
fn bank_total_holds_in_every_audit_under_every_protocol() {
    for p in REGISTRY.iter().filter(|p| common::chosen(p.name)) {
        for seed in 1..=seeds() {
            let wl = WorkloadParams {
                name: "bank".into(),
                accounts: 200,
                distributed: 0.5,
                theta: 0.8,
                ..Default::default()
            };
            assert_checks(&spec(p.name, wl, seed));
        }
    }
}
