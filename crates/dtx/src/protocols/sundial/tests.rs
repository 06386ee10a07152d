//! Sundial run end to end in the simulator: histories checked, its abort paths and counters.
//! (The shared sweeps in `tests/` run it with every other protocol that has code.)

use crate::bench::{self, BenchSpec};
use crate::testkit::{checked_run as checked, contended_append as append};
use crate::workloads::WorkloadParams;

fn spec(workload: WorkloadParams, seed: u64) -> BenchSpec {
    crate::testkit::protocol_spec("sundial", workload, seed)
}

#[test]
fn contended_histories_are_serializable_and_leases_are_renewed() {
    let mut renewals = 0;
    for seed in 1..=6 {
        let out = checked(&spec(append(), seed));
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        renewals += out.totals.counters.get(super::RENEWALS).copied().unwrap_or(0);
    }
    assert!(renewals > 0, "contended reads need their leases extended");
}

#[test]
fn interactive_execution_is_serializable_too() {
    for seed in 1..=3 {
        let mut s = spec(append(), 20 + seed);
        s.proto.one_shot = false;
        let out = checked(&s);
        assert!(out.totals.committed > 50, "seed {seed}");
    }
}

#[test]
fn lost_messages_cost_time_not_consistency() {
    for seed in 1..=3 {
        let out = checked(&spec(append(), 40 + seed).with_faults(false, false, 0.02));
        assert!(out.totals.committed > 0, "seed {seed}");
    }
}

#[test]
fn every_read_write_abort_case_is_its_own_reason() {
    // A small hot key set: renewals fail for each of the paper's reasons over a few seeds.
    let mut seen = std::collections::BTreeMap::new();
    for seed in 1..=4 {
        let wl = WorkloadParams { name: "append".into(), keys: 6, ops: 4, read_ratio: 0.7, ..Default::default() };
        let out = checked(&spec(wl, 60 + seed));
        for (k, v) in &out.totals.aborts {
            *seen.entry(k.clone()).or_insert(0) += v;
        }
    }
    for reason in ["lease-locked", "lease-newer-version-before"] {
        assert!(seen.get(reason).copied().unwrap_or(0) > 0, "{reason} never seen: {seen:?}");
    }
    assert!(seen.keys().all(|k| k != "read-validation"), "Sundial does not validate as OCC does: {seen:?}");
}

#[test]
fn scans_are_refused_until_index_leases_exist() {
    let wl = WorkloadParams { name: "tpcc".into(), warehouses: 3, mix: "0,0,0,0,100".into(), ..Default::default() };
    let mut s = spec(wl, 1);
    s.max_retries = 2;
    let out = bench::run_sim(&s).expect("the simulation runs");
    assert!(out.totals.aborts.get("scan-unsupported").copied().unwrap_or(0) > 0, "{:?}", out.totals.aborts);
}

#[test]
fn partitions_and_crashes_without_a_log_keep_histories_serializable() {
    // Without a log a crash is stop-and-resume (memory survives), so leases survive it too.
    for seed in 1..=4 {
        let out = checked(&spec(append(), 80 + seed).with_faults(true, true, 0.01));
        assert!(out.totals.committed > 0, "seed {seed}");
    }
}
