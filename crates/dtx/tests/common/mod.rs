//! What the simulation test files share: run a spec, check its history, fail with the seed.

use dtx::bench::{self, BenchSpec, Outcome};

/// Seeds per sweep: `DTX_SEEDS` or `default`.
pub fn seeds(default: u64) -> u64 {
    std::env::var("DTX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Run `spec` in simulation and prove its list-append history serializable, with every
/// acknowledged append in the final state; panics naming the protocol, seed and kept history.
pub fn run_and_check(spec: &BenchSpec, tag: &str) -> Outcome {
    let out = bench::run_sim(spec).expect("simulation runs");
    let dir = std::env::temp_dir().join(format!("dtx-sim-{}-{}", std::process::id(), tag));
    let path = dir.join(format!("{}-{}.jsonl", spec.protocol, spec.seed));
    let (report, problem) = bench::verify(&out, &path).expect("history checks");
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
