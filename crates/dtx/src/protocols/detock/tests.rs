//! Detock end to end in the simulator: multi-home transactions split into pieces with no
//! orderer, crossed pieces resolved without aborts, and histories checked. (The shared sweeps
//! in `tests/` run it with every other protocol.)

use crate::host::{self, BenchSpec};
use crate::testkit::{checked_run as checked, contended_append as append};
use crate::workloads::WorkloadParams;

fn spec(variant: &str, workload: WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = crate::testkit::protocol_spec(variant, workload, seed);
    s.workers = 2;
    s
}

fn counter(out: &host::Outcome, name: &str) -> u64 {
    out.totals.counters.get(name).copied().unwrap_or(0)
}

/// Three nodes in two regions ({0, 2} and {1}): a transaction over keys of both regions is
/// coordinated by its client's region and placed as a piece in each home's log, the others are
/// sequenced by their home alone, and the history is strictly serializable.
#[test]
fn multi_home_transactions_are_placed_in_every_home_and_run_in_one_order() {
    for seed in 1..=4 {
        let out = checked(&spec("detock:batch_us=1000:ddr_us=5000", append(), seed));
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        let (multi, all) = (counter(&out, "multi-home-txns"), out.totals.committed);
        assert!(multi > 0 && multi < all, "seed {seed}: {multi} of {all} multi-home");
        assert!(out.totals.aborts.is_empty(), "deterministic execution never aborts here: {:?}", out.totals.aborts);
    }
}

/// Without opportunistic ordering, pieces placed as they arrive cross under contention: the
/// graph has cycles, every scheduler resolves them alike, nothing aborts, and the history
/// checks; the gauges give the largest graph and lock table, bounded by the clients in flight.
#[test]
fn crossed_pieces_are_resolved_deterministically_without_aborts() {
    let mut deadlocks = 0;
    for seed in 1..=4 {
        let mut s = spec("detock:batch_us=1000:ddr_us=2000:opportunistic=off", append(), seed);
        s.latency.node_region = vec![0, 1, 0];
        s.latency.region_delay_us = vec![vec![100, 5_000], vec![5_000, 100]];
        let out = checked(&s);
        assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
        assert!(out.totals.aborts.is_empty(), "seed {seed}: {:?}", out.totals.aborts);
        deadlocks += counter(&out, "detock-deadlocks");
        // The largest graph a resolution met: some vertices, at most all of them summed.
        let largest = out.totals.gauges.get("detock-graph-vertices-max").copied().unwrap_or(0);
        let summed = counter(&out, "detock-graph-vertices");
        assert!(largest > 0 && largest <= summed, "seed {seed}: largest {largest}, summed {summed}");
        let locked = out.totals.gauges.get("calvin-locked-txns-max").copied().unwrap_or(0);
        assert!(locked > 0 && locked <= 3 * u64::from(s.inflight) * u64::from(s.workers), "seed {seed}: {locked}");
    }
    assert!(deadlocks > 0, "contended multi-home transactions placed as they come cross somewhere");
}

/// Multi-home transactions with a copy per region, reads exchanged within each region: every
/// region's copy ends alike (the consistency conditions hold), with reconnaissance and scans
/// (TPC-C's whole mix) on top.
#[test]
fn every_region_runs_tpcc_with_multi_home_transactions_to_the_same_state() {
    crate::protocols::calvin::tests::every_region_runs_tpcc_to_the_same_state("detock:batch_us=1000");
}

/// Every transaction multi-home over two regions 20 ms apart (two nodes each, a copy per
/// region), for 1 s.
fn two_regions_20ms_apart(variant: &str, seed: u64) -> BenchSpec {
    let ycsb = WorkloadParams {
        name: "ycsb".into(),
        keys: 10_000,
        ops: 4,
        distributed: 1.0,
        multi_home: Some(1.0),
        ..Default::default()
    };
    let mut s = spec(variant, ycsb, seed);
    crate::testkit::in_two_regions_20ms_apart(&mut s);
    s
}

/// With 20 ms between two regions, a multi-home transaction costs about one trip to the far
/// home and back (its pieces go out at once and every region runs it when both logs are in),
/// not SLOG's trip to the orderer and then the pieces' trips.
#[test]
fn a_multi_home_transaction_costs_about_one_round_trip() {
    let detock = host::run_sim(&two_regions_20ms_apart("detock:batch_us=1000", 3)).expect("the simulation runs");
    let p50 = |o: &host::Outcome| o.totals.histogram().value_at_quantile(0.5);
    assert!(counter(&detock, "multi-home-txns") > 0);
    assert!((40_000..70_000).contains(&p50(&detock)), "detock's multi-home p50 {} µs", p50(&detock));
}

/// Clocks that disagree and drift apart: the probes measure each home's one-way delay with its
/// clock's offset in it, so the coordinator's stamp is still one its homes reach together, and
/// pieces are rarely late, 50 ms of skew and 2 ms a second of drift notwithstanding.
#[test]
fn skewed_and_drifting_clocks_still_place_pieces_together() {
    let run = |skew_us: u64, drift_ppm: u64| {
        let mut s = two_regions_20ms_apart("detock:batch_us=1000", 5);
        (s.clock_skew_us, s.clock_drift_ppm) = (skew_us, drift_ppm);
        host::run_sim(&s).expect("the simulation runs")
    };
    let (agreeing, drifting) = (run(0, 0), run(50_000, 2_000));
    let late = |o: &host::Outcome| counter(o, "detock-pieces-late") as f64 / counter(o, "multi-home-txns") as f64;
    let p50 = |o: &host::Outcome| o.totals.histogram().value_at_quantile(0.5);
    assert!(late(&drifting) < 0.05, "{:.3} of multi-home transactions had a late piece", late(&drifting));
    assert!(
        p50(&drifting) < p50(&agreeing) * 5 / 4,
        "p50 {} µs with drifting clocks against {} µs",
        p50(&drifting),
        p50(&agreeing)
    );
}

/// Homes that move: see the shared test.
#[test]
fn homes_move_and_every_region_stays_alike() {
    crate::protocols::calvin::tests::homes_move_and_every_region_stays_alike("detock:batch_us=1000");
}
