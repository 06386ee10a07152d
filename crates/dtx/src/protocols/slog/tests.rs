//! SLOG end to end in the simulator: where each kind of transaction is ordered, what a region
//! waits for, and its histories checked. (The shared sweeps in `tests/` run it with every other
//! protocol.)

use crate::host::{self, BenchSpec};
use crate::testkit::{checked_run as checked, contended_append as append};
use crate::workloads::WorkloadParams;

fn spec(variant: &str, workload: WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = crate::testkit::protocol_spec(variant, workload, seed);
    s.workers = 1 + host::service_workers(variant); // one client worker beside the service's
    s
}

fn counter(out: &host::Outcome, name: &str) -> u64 {
    out.totals.counters.get(name).copied().unwrap_or(0)
}

/// Three nodes in two regions ({0, 2} and {1}): a transaction over keys of both regions goes to
/// the orderer and runs in pieces, the others are sequenced by their home region alone, and
/// the history is strictly serializable.
#[test]
fn multi_home_transactions_are_ordered_globally_and_locked_in_pieces() {
    for seed in 1..=4 {
        let out = checked(&spec("slog:batch_us=1000", append(), seed));
        assert!(out.totals.committed > 100, "seed {seed}: {} committed", out.totals.committed);
        let (multi, all) = (counter(&out, "multi-home-txns"), out.totals.committed);
        assert!(multi > 0 && multi < all, "seed {seed}: {multi} of {all} multi-home");
        assert!(counter(&out, "orderer-batches") > 0, "seed {seed}: {:?}", out.totals.counters);
        assert!(out.totals.aborts.is_empty(), "deterministic execution never aborts here: {:?}", out.totals.aborts);
    }
}

/// With a copy per region and 20 ms between regions, a transaction homed in its client's region
/// waits for no other region under SLOG, while Calvin's one log makes every transaction wait
/// for the batches of the far region's sequencers.
#[test]
fn a_single_home_transaction_waits_for_no_other_region() {
    let ycsb = WorkloadParams { name: "ycsb".into(), keys: 10_000, ops: 4, distributed: 0.0, ..Default::default() };
    let run = |variant: &str| {
        let mut s = spec(variant, ycsb.clone(), 3);
        crate::testkit::in_two_regions_20ms_apart(&mut s);
        // YCSB has no history to check: the latencies are the point here.
        host::run_sim(&s).expect("the simulation runs")
    };
    let (slog, calvin) = (run("slog:batch_us=1000"), run("calvin:batch_us=1000"));
    assert_eq!(counter(&slog, "multi-home-txns"), 0, "every transaction is local to one partition");
    let p50 = |o: &host::Outcome| o.totals.histogram().value_at_quantile(0.5);
    assert!(p50(&slog) < 10_000, "slog's p50 {} µs crosses a region", p50(&slog));
    assert!(p50(&calvin) > 20_000, "calvin's p50 {} µs waits for the far sequencers", p50(&calvin));
}

/// Multi-home transactions with a copy per region, reads exchanged within each region: every
/// region's copy ends alike (the final read of each region's clients agrees, and the history
/// checks), with reconnaissance and scans (TPC-C's whole mix) on top.
#[test]
fn every_region_runs_tpcc_with_multi_home_transactions_to_the_same_state() {
    crate::protocols::calvin::tests::every_region_runs_tpcc_to_the_same_state("slog:batch_us=1000");
}

/// The ordering service on several threads: each client sends to one of them, the others hand
/// what they take to the first, which closes the batches; on one thread nothing is handed over.
#[test]
fn ordering_threads_hand_their_submissions_to_the_one_that_closes_batches() {
    for (threads, seed) in [(3, 11), (1, 12)] {
        let variant = format!("slog:orderer_threads={threads}");
        let mut s = spec(&variant, append(), seed);
        s.workers = 2 + host::service_workers(&variant);
        let out = checked(&s);
        assert!(counter(&out, "multi-home-txns") > 0 && out.totals.committed > 50, "{:?}", out.totals);
        let handovers = counter(&out, "orderer-handovers");
        assert_eq!(handovers > 0, threads > 1, "{threads} threads, {handovers} hand-overs");
    }
}

#[test]
fn a_full_orderer_refuses_and_its_clients_retry() {
    let out = checked(&spec("slog:max_pending=1", append(), 7));
    assert!(out.totals.aborts.get("orderer-full").copied().unwrap_or(0) > 0, "{:?}", out.totals.aborts);
    assert!(out.totals.committed > 0);
}

/// Roles laid out without an orderer: SLOG says so before the run instead of picking one.
#[test]
fn roles_without_an_orderer_are_refused_naming_the_role() {
    use crate::cluster::{Role, Roles, Topology};
    let slog = crate::protocols::registry::Variant::parse("slog").unwrap().make();
    let sequencing = Roles::DEFAULT.with(Role::Sequencer);
    let workers = 1 + slog.service_workers();
    let topo = Topology::new(2, workers, 1).with_roles(vec![sequencing, sequencing]).unwrap();
    let err = slog.check_topology(&topo).unwrap_err().to_string();
    assert!(err.contains("`orderer` role") && err.contains("+orderer"), "{err}");
    let ordered = Topology::new(2, workers, 1).with_roles(vec![sequencing.with(Role::Orderer), sequencing]).unwrap();
    assert!(slog.check_topology(&ordered).is_ok());
    // Without --roles the orderer is node 0.
    assert!(slog.check_topology(&Topology::new(2, workers, 1)).is_ok());
}

/// Homes that move: see the shared test.
#[test]
fn homes_move_and_every_region_stays_alike() {
    crate::protocols::calvin::tests::homes_move_and_every_region_stays_alike("slog:batch_us=1000");
}
