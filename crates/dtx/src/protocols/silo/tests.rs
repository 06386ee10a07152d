//! Silo and Rolis runs end to end: they commit, verify, and keep what they acknowledged across
//! crashes (silo's WALs) and failovers (rolis's replicated streams).

use crate::host::{BenchSpec, Runtime};
use crate::replication::Durability;
use crate::workloads::WorkloadParams;

fn spec(protocol: &str, seed: u64) -> BenchSpec {
    let wl = WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() };
    let mut s = BenchSpec::new(protocol, wl, Runtime::Sim);
    s.nodes = 3;
    s.workers = 2;
    s.inflight = 6;
    s.max_unacked = 6;
    s.duration_us = 400_000;
    s.warmup_us = 0;
    s.latency.delay_us = 150;
    s.latency.jitter_us = 100;
    s.seed = seed;
    s
}

#[test]
fn silo_commits_and_verifies_without_a_log() {
    // Nothing waits without a log: a short run commits thousands.
    let mut s = spec("silo", 1);
    s.duration_us = 20_000;
    let out = crate::testkit::checked_run(&s);
    assert!(out.totals.committed > 100, "{} committed", out.totals.committed);
}

#[test]
fn rolis_releases_below_the_watermark_and_verifies() {
    let mut s = spec("rolis", 1);
    s.durability.mode = Durability::Replicated;
    s.durability.replicas = 3;
    let out = crate::testkit::checked_run(&s);
    assert!(out.totals.committed > 100, "{} committed", out.totals.committed);
}

#[test]
fn each_refuses_the_durability_of_the_other() {
    let mut s = spec("silo", 1);
    s.durability.mode = Durability::Replicated;
    s.durability.replicas = 3;
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("rolis"), "{e}");
    let e = spec("rolis", 1).validate().unwrap_err().to_string();
    assert!(e.contains("--durability replicated"), "{e}");
    let mut s = spec("rolis", 1);
    s.durability.mode = Durability::Replicated;
    s.durability.replicas = 1;
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("2 replicas"), "{e}");
}
