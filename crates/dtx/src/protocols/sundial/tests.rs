//! Sundial run end to end in the simulator: histories checked, its abort paths and counters.
//! (The shared sweeps in `tests/` run it with every other protocol that has code.)

use crate::host::{self, BenchSpec};
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

/// Each abort path of Sundial shows up as its own reason: the paper's three read-write cases
/// (Sec. 5.1), a tuple read and then locked to be written that changed in between (interactive
/// execution reads before it writes), and WAIT_DIE's write-write conflicts.
#[test]
fn every_abort_path_is_its_own_reason() {
    let mut seen = std::collections::BTreeMap::new();
    for seed in 1..=4 {
        for one_shot in [true, false] {
            let wl = WorkloadParams { name: "append".into(), keys: 6, ops: 4, read_ratio: 0.7, ..Default::default() };
            let mut s = spec(wl, 60 + seed);
            s.proto.one_shot = one_shot;
            let out = checked(&s);
            for (k, v) in &out.totals.aborts {
                *seen.entry(k.clone()).or_insert(0) += v;
            }
        }
    }
    for reason in [
        "lease-locked",
        "lease-newer-version-before",
        "lease-newer-version-after",
        "read-then-write-changed",
        "wait-die",
    ] {
        assert!(seen.get(reason).copied().unwrap_or(0) > 0, "{reason} never seen: {seen:?}");
    }
    assert!(seen.keys().all(|k| k != "read-validation"), "Sundial does not validate as OCC does: {seen:?}");
}

/// TPC-C's ITEM is never written: with it partitioned, remote ITEM reads are cached, and their
/// leases are extended by extending ITEM's table lease (Sec. 4.3), which the option turns off.
#[test]
fn a_read_only_table_is_extended_at_once() {
    let run = |variant: &str| {
        let wl = WorkloadParams { name: "tpcc".into(), warehouses: 3, item_replicated: false, ..Default::default() };
        let mut s = crate::testkit::protocol_spec(variant, wl, 170);
        s.run_checks = true;
        let out = host::run_sim(&s).expect("the simulation runs");
        let failed: Vec<_> = out.totals.findings.iter().filter(|f| !f.1).collect();
        assert!(out.totals.committed > 100 && failed.is_empty(), "{variant}: {failed:?}");
        (counter(&out, super::TABLE_EXTENSIONS), counter(&out, super::RENEWALS) as f64 / out.totals.committed as f64)
    };
    let (on, renewals_on) = run("sundial");
    let (off, renewals_off) = run("sundial:table_leases=off");
    assert!(on > 0 && off == 0, "table lease extensions: {on} with, {off} without");
    assert!(
        renewals_on < renewals_off,
        "lease extensions per transaction: {renewals_on:.2} with, {renewals_off:.2} without"
    );
}

fn counter(out: &host::Outcome, name: &str) -> u64 {
    out.totals.counters.get(name).copied().unwrap_or(0)
}

#[test]
fn every_cache_policy_keeps_histories_serializable() {
    for policy in ["none", "reuse", "request", "hybrid"] {
        let variant = format!("sundial:cache={policy}");
        for seed in 1..=3 {
            let out = checked(&crate::testkit::protocol_spec(&variant, append(), 100 + seed));
            assert!(out.totals.committed > 100, "{variant} seed {seed}: {} committed", out.totals.committed);
            let (reused, checks) = (counter(&out, super::CACHE_REUSED), counter(&out, super::CACHE_CHECKS));
            match policy {
                "none" => assert_eq!((reused, checks), (0, 0), "{variant}"),
                "reuse" => assert!(reused > 0 && checks == 0, "{variant}: {:?}", out.totals.counters),
                "request" => assert!(
                    reused == 0 && checks > 0 && counter(&out, super::CACHE_CURRENT) > 0,
                    "{variant}: {:?}",
                    out.totals.counters
                ),
                _ => assert!(reused + checks > 0, "{variant}: {:?}", out.totals.counters),
            }
        }
    }
}

/// A cached copy may be stale; the checker proves no transaction committed a read outside its
/// version's lease, and the stale copies show up as failed extensions at prepare.
#[test]
fn a_stale_cached_copy_is_never_used_outside_its_lease() {
    let mut failed = 0;
    for seed in 1..=4 {
        let wl = WorkloadParams { name: "append".into(), keys: 12, ops: 4, read_ratio: 0.8, ..Default::default() };
        let out = checked(&crate::testkit::protocol_spec("sundial:cache=reuse", wl, 120 + seed));
        assert!(counter(&out, super::CACHE_REUSED) > 0);
        failed += counter(&out, super::RENEWALS_FAILED);
    }
    assert!(failed > 0, "contended writes make some cached copies stale");
}

#[test]
fn caching_remote_reads_saves_round_trips_and_bytes_on_read_mostly_data() {
    let run = |variant: &str| {
        let wl = WorkloadParams {
            name: "ycsb".into(),
            keys: 2_000,
            ops: 8,
            read_ratio: 0.99,
            theta: 0.9,
            distributed: 1.0,
            value_bytes: 512,
            ..Default::default()
        };
        host::run_sim(&crate::testkit::protocol_spec(variant, wl, 9)).expect("runs")
    };
    let (none, reuse) = (run("sundial:cache=none"), run("sundial:cache=reuse"));
    let per = |o: &host::Outcome| o.totals.bytes as f64 / o.totals.committed.max(1) as f64;
    assert!(per(&reuse) < per(&none) * 0.8, "bytes per txn: reuse {} none {}", per(&reuse), per(&none));
    assert!(reuse.totals.committed > none.totals.committed, "{} vs {}", reuse.totals.committed, none.totals.committed);
}

#[test]
fn bad_cache_options_name_the_option() {
    use crate::protocols::Variant;
    let err = |v: &str| match Variant::parse_including_planned(v) {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("{v} was accepted"),
    };
    assert!(err("sundial:cache_mb=0").contains("option `cache_mb`: 0 is out of range"));
    assert!(err("sundial:cache=sometimes").contains("option `cache`: `sometimes` is not a known value"));
    assert!(Variant::parse_including_planned("sundial:cache=request:cache_mb=64").is_ok());
}

fn durable(mut s: BenchSpec, seed: u64) -> BenchSpec {
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.cluster_id = seed;
    s.duration_us = 400_000;
    s
}

/// Crashes lose a node's memory and its log's unflushed tail: leases restart at the logged
/// bound, prepared transactions come back in doubt with their commit timestamps, and nothing
/// acknowledged is lost (the final read finds every acknowledged append).
#[test]
fn crashes_that_lose_memory_lose_no_acknowledged_commit() {
    let mut restarts = 0;
    for (i, policy) in ["hybrid", "none", "reuse"].iter().cycle().take(9).enumerate() {
        let seed = 300 + i as u64;
        let wl = append();
        let mut s = durable(crate::testkit::protocol_spec(&format!("sundial:cache={policy}"), wl, seed), seed)
            .with_faults(true, true, 0.02);
        s.faults.fault_interval_us = 100_000;
        let out = checked(&s);
        restarts += out.restarts;
    }
    assert!(restarts >= 9, "only {restarts} crashes lost memory");
}

#[test]
fn a_crash_at_one_node_loses_nothing_an_acknowledged_reader_saw() {
    let mut restarts = 0;
    for seed in 1..=4 {
        let mut s = durable(spec(append(), 320 + seed), 320 + seed).with_faults(true, false, 0.0);
        s.nodes = 1;
        s.faults.fault_interval_us = 50_000;
        restarts += checked(&s).restarts;
    }
    assert!(restarts > 0);
}
