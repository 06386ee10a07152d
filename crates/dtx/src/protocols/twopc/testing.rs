//! Test scaffolding the protocols over the 2PC skeleton share: the runs their own tests compare
//! each other on.

use crate::host::BenchSpec;
use crate::workloads::WorkloadParams;

/// Read-only YCSB transactions that each read on several nodes: what tells apart how many
/// messages a protocol's commit phase costs.
pub fn read_only_distributed_ycsb() -> WorkloadParams {
    WorkloadParams {
        name: "ycsb".into(),
        keys: 10_000,
        ops: 8,
        read_ratio: 1.0,
        distributed: 1.0,
        ..Default::default()
    }
}

/// Messages per committed transaction of `variant` running `wl` in the simulator (more than 100
/// must commit for the figure to mean anything).
pub fn messages_per_commit(variant: &str, wl: &WorkloadParams, seed: u64) -> f64 {
    let out =
        crate::host::run_sim(&crate::testkit::protocol_spec(variant, wl.clone(), seed)).expect("the simulation runs");
    assert!(out.totals.committed > 100, "{variant}");
    out.totals.msgs as f64 / out.totals.committed as f64
}

/// A run of `variant` with a write-ahead log, crashes and partitions (a fault every 100 ms),
/// its cluster named by its seed so that runs do not share logs.
pub fn durable_run_with_crashes(variant: &str, wl: WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = crate::testkit::protocol_spec(variant, wl, seed).with_faults(true, true, 0.0);
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.cluster_id = seed;
    s.faults.fault_interval_us = 100_000;
    s
}
