//! Every protocol, in deterministic simulation over many seeds, with contention, delay, jitter,
//! and with loss, partitions and crashes: every list-append history must be serializable and
//! every acknowledged append must be in the final state.
//! `DTX_SEEDS=200 cargo test --release --test sim_checker` runs the deep sweep.

use dtx::host::{self, BenchSpec};
use dtx::protocols::{ready, REGISTRY};

mod common;

fn seeds() -> u64 {
    common::seeds(24)
}

fn append_spec(protocol: &str, seed: u64) -> BenchSpec {
    common::append_spec(protocol, seed, dtx::host::Runtime::Sim, 300_000)
}

fn check(spec: &BenchSpec, tag: &str) {
    common::run_and_check(spec, tag);
}

/// Every protocol with code, planned ones included.
#[test]
fn every_protocol_is_serializable_under_contention_and_delay() {
    for p in REGISTRY.iter().filter(|p| common::chosen(p.name)) {
        for seed in 1..=seeds() {
            check(&append_spec(p.name, seed), "clean");
        }
    }
}

#[test]
fn every_protocol_is_serializable_with_loss_partitions_and_crashes() {
    for p in ready().filter(|p| common::chosen(p.name)) {
        for seed in 1..=seeds() {
            check(&append_spec(p.name, 1000 + seed).with_faults(true, true, 0.02), "faults");
        }
    }
}

/// `commit=epoch` and `commit=wm` under each concurrency control that takes them (`coco` and
/// `primo` run the sweeps above), one-shot and, for the watermark, interactive.
#[test]
fn group_commit_is_serializable_under_every_concurrency_control() {
    for variant in dtx::protocols::EPOCH_VARIANTS.iter().chain(dtx::protocols::WM_VARIANTS) {
        for seed in 1..=seeds().div_ceil(2) {
            check(&append_spec(variant, 600 + seed), "group commit");
            check(&append_spec(variant, 1600 + seed).with_faults(true, true, 0.02), "group commit faults");
        }
    }
    for variant in dtx::protocols::WM_VARIANTS {
        for seed in 1..=seeds().div_ceil(2) {
            let mut s = append_spec(variant, 2600 + seed);
            s.proto.one_shot = false;
            check(&s, "watermark interactive");
        }
    }
}

/// The option variants (`primo:wcf=off`, `detock:rehome=0.2`): plain, with faults, and interactive.
#[test]
fn option_variants_are_serializable_too() {
    for variant in dtx::protocols::OPTION_VARIANTS.iter().filter(|n| common::chosen(n)) {
        for seed in 1..=seeds().div_ceil(2) {
            check(&append_spec(variant, 700 + seed), "variant");
            check(&append_spec(variant, 1700 + seed).with_faults(true, true, 0.02), "variant faults");
            let mut s = append_spec(variant, 2700 + seed);
            s.proto.one_shot = false;
            check(&s, "variant interactive");
        }
    }
}

#[test]
fn interactive_execution_is_serializable_too() {
    for p in ready().filter(|p| common::chosen(p.name)) {
        for seed in 1..=seeds().div_ceil(2) {
            let mut s = append_spec(p.name, 500 + seed);
            s.proto.one_shot = false;
            check(&s, "interactive");
        }
    }
}

/// Every variant the registry runs (each ready protocol, the group-commit and option
/// variants), twice on one seed with loss, partitions and crashes: the two runs must match
/// event for event (madsim's habit), seen as the history (every operation with its virtual
/// invocation and completion times), the faults injected and when, and every total the run
/// counts (commits, aborts by reason, messages, bytes, CPU by kind, counters). A protocol that
/// read the wall clock, iterated a randomly seeded map or kept a stream of its own would differ
/// here before it made a failing seed impossible to replay. A second seed must differ.
#[test]
fn the_same_seed_replays_the_same_run_for_every_variant() {
    let variants = ready().map(|p| p.name).chain(dtx::protocols::EPOCH_VARIANTS.iter().copied());
    let variants = variants.chain(dtx::protocols::WM_VARIANTS.iter().copied());
    let variants: Vec<&str> = variants.chain(dtx::protocols::OPTION_VARIANTS.iter().copied()).collect();
    let mut runs = 0;
    for variant in variants.into_iter().filter(|v| common::chosen(v)) {
        let spec = append_spec(variant, 42).with_faults(true, true, 0.01);
        let first = fingerprint(&host::run_sim(&spec).unwrap());
        assert!(first.0.len() > 10, "{variant}: a run of {} operations shows nothing", first.0.len());
        let again = fingerprint(&host::run_sim(&spec).unwrap());
        assert_eq!(first.1, again.1, "{variant}: seed 42 gave other totals or faults the second time");
        assert!(first.0 == again.0, "{variant}: seed 42 gave another history the second time");
        let other = fingerprint(&host::run_sim(&append_spec(variant, 43).with_faults(true, true, 0.01)).unwrap());
        assert_ne!(first.0, other.0, "{variant}: seeds 42 and 43 gave the same history");
        runs += 1;
    }
    assert!(runs > 0 || common::narrowed(), "no variant ran");
}

/// What a simulated run did, to compare two runs of one seed: its history, one JSON line per
/// operation, and its totals and injected faults, as debug text.
fn fingerprint(o: &host::Outcome) -> (Vec<String>, String) {
    let history = o.history.iter().map(|l| serde_json::to_string(l).unwrap()).collect();
    let t = &o.totals;
    let totals = format!(
        "committed {} aborts {:?} gave_up {} msgs {} bytes {} cpu_us {} cpu {:?} log_waits {} {} by_kind {:?} \
         counters {:?} failovers {} faults {:?}",
        t.committed,
        t.aborts,
        t.gave_up,
        t.msgs,
        t.bytes,
        t.cpu_us,
        t.cpu_by_kind_ns,
        t.log_waits,
        t.log_wait_ns,
        t.by_kind,
        t.counters,
        t.failovers,
        o.fault_events,
    );
    (history, totals)
}

/// The protocols that keep a full copy of the data per region (`--placement per-region`:
/// Calvin, SLOG, Detock), over seeds with loss, partitions, skewed and drifting clocks, and a
/// whole region's nodes crashing together (with a WAL: their memory is lost and replayed):
/// histories serializable, and every region's copy of every partition the same at the end
/// (the finding `run_and_check` fails on).
#[test]
fn every_region_ends_with_the_same_copy_under_faults() {
    use dtx::cluster::Placement;
    use dtx::net::{FaultTarget, TargetedFault, TargetedKind};
    let per_region = |p: &&dtx::protocols::ProtocolInfo| {
        dtx::protocols::Variant::parse(p.name).is_ok_and(|v| v.make().keeps_copies(Placement::PerRegion))
    };
    let mut runs = 0;
    let names = ready().filter(per_region).map(|p| p.name).chain(dtx::protocols::OPTION_VARIANTS.iter().copied());
    let per_region_names =
        names.filter(|n| dtx::protocols::Variant::parse(n).is_ok_and(|v| v.make().keeps_copies(Placement::PerRegion)));
    for name in per_region_names.filter(|n| common::chosen(n)) {
        for seed in 1..=seeds().div_ceil(4) {
            runs += 1;
            let mut s = append_spec(name, 3000 + seed).with_faults(false, true, 0.02);
            s.nodes = 4;
            s.latency.node_region = vec![0, 1, 0, 1];
            s.placement = Placement::PerRegion;
            (s.clock_skew_us, s.clock_drift_ppm) = (5_000, 1_000);
            s.durability.mode = dtx::replication::Durability::Wal;
            s.durability.cluster_id = 3000 + seed;
            // Region 1 (nodes 1 and 3) crashes at once, a third of the way in.
            let crash = |node| TargetedFault {
                kind: TargetedKind::Crash,
                target: FaultTarget::Node(node),
                at_us: 100_000,
                for_us: Some(30_000),
            };
            s.faults.targeted = vec![crash(1), crash(3)];
            let out = common::run_and_check(&s, "regions");
            let copies = out.totals.findings.iter().find(|f| f.0.starts_with("every copy"));
            assert!(copies.is_some_and(|f| f.1), "{name} seed {}: {copies:?}", 3000 + seed);
            assert!(out.restarts >= 2, "{name} seed {}: the region's crash lost no memory", 3000 + seed);
        }
    }
    assert!(runs > 0 || common::narrowed(), "no protocol keeps a copy per region");
}
