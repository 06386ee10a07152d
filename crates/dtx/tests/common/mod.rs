//! What the simulation test files share: run a spec, check its history, fail with the seed.

use dtx::bench;
use dtx::host::{self, BenchSpec, Outcome, Runtime};
use dtx::workloads::WorkloadParams;

/// Seeds per sweep: `DTX_SEEDS` or `default`.
pub fn seeds(default: u64) -> u64 {
    std::env::var("DTX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Whether a sweep runs protocol (or variant) `name`: every one, unless `DTX_PROTOCOLS` lists
/// some (comma-separated protocol names; a variant is chosen by its protocol's name), to run
/// the sweeps for one protocol while it is built.
pub fn chosen(name: &str) -> bool {
    let Ok(list) = std::env::var("DTX_PROTOCOLS") else { return true };
    let protocol = name.split(':').next().unwrap_or(name);
    list.split(',').any(|p| p.trim() == protocol)
}

/// Whether `DTX_PROTOCOLS` narrows the sweeps.
#[allow(dead_code)] // Not every test file that shares this module asks.
pub fn narrowed() -> bool {
    std::env::var("DTX_PROTOCOLS").is_ok()
}

/// `n` workers per node, or one client worker beside a protocol's own workers where it has
/// that many (SLOG's ordering threads).
pub fn workers(protocol: &str, n: u16) -> u16 {
    n.max(1 + host::service_workers(protocol))
}

/// A contended list-append run on 3 nodes x 2 workers, 6 clients each, 150 µs delay with 100 µs
/// jitter, no warm-up, for `duration_us`.
pub fn append_spec(protocol: &str, seed: u64, runtime: Runtime, duration_us: u64) -> BenchSpec {
    let wl = WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() };
    let mut s = BenchSpec::new(protocol, wl, runtime);
    s.nodes = 3;
    s.workers = workers(protocol, 2);
    s.inflight = 6;
    // As many commits may wait for the log as clients run: the deferred path is exercised (a
    // crash finds commits waiting) while the load stays what the sweeps were sized for.
    s.max_unacked = 6;
    s.duration_us = duration_us;
    s.warmup_us = 0;
    s.latency.delay_us = 150;
    s.latency.jitter_us = 100;
    s.seed = seed;
    runnable(s)
}

/// `s` as a sweep that runs every protocol runs it: a protocol that refuses to run without
/// replicated logs (`rolis`) gets them (3 replicas, or one per node).
pub fn runnable(s: BenchSpec) -> BenchSpec {
    s.with_durability_its_protocol_takes()
}

/// `s` cut to a length its history can be checked at: a protocol whose data is on one node and
/// which has no log (`silo`) waits for nothing, so it commits about a hundred times as fast as
/// the others do in these sweeps and its lists grow with its commits; its run is a twentieth
/// as long.
pub fn paced(mut s: BenchSpec) -> BenchSpec {
    let topo = s.topology();
    let data_nodes = (0..topo.nodes).filter(|&n| topo.roles_of(n).contains(dtx::cluster::Role::Data)).count();
    if data_nodes == 1 && s.durability.mode == dtx::replication::Durability::None {
        s.duration_us /= 20;
    }
    s
}

/// Run `spec` in simulation and prove its list-append history serializable, with every
/// acknowledged append in the final state; panics naming the protocol, seed and kept history.
pub fn run_and_check(spec: &BenchSpec, tag: &str) -> Outcome {
    let spec = &paced(spec.clone());
    let out = host::run_sim(spec).expect("simulation runs");
    let dir = std::env::temp_dir().join(format!("dtx-sim-{}-{}", std::process::id(), tag));
    let path = dir.join(format!("{}-{}.jsonl", spec.protocol, spec.seed));
    let (report, problem) =
        bench::verify(&out, &path, dtx::protocols::guarantee_of(&spec.protocol)).expect("history checks");
    assert!(out.totals.committed > 0, "{tag} {} seed {}: nothing committed", spec.protocol, spec.seed);
    if let Some(p) = problem {
        panic!(
            "{tag} {} seed {}: {p}\nhistory kept at {}\n{:#?}",
            spec.protocol,
            spec.seed,
            path.display(),
            report.anomalies.first()
        );
    }
    let _ = std::fs::remove_file(&path);
    out
}
