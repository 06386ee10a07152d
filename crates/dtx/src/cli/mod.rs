//! What the `dtx` subcommands do, behind the argument parsing in main.rs.

mod bench_args;
pub mod experiment;
pub mod fresh_process;

pub use bench_args::{BenchArgs, ProtocolList};

use crate::bench;
use crate::host::{self, BenchSpec, Outcome};
use crate::protocols;
use anyhow::bail;
use dtx_report::{BenchReport, RunReport};
use std::path::{Path, PathBuf};

/// Builds (and validates) the spec of one protocol's run from the command line.
pub type SpecMaker = Box<dyn Fn(&protocols::Variant) -> anyhow::Result<BenchSpec>>;

pub struct BenchRequest {
    pub protocols: ProtocolList,
    /// Builds (and validates) the spec of one protocol's run.
    pub make_spec: SpecMaker,
    pub runtime: crate::host::Runtime,
    pub workload: String,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub history: Option<PathBuf>,
    pub verify: bool,
    pub out: Option<PathBuf>,
    pub cluster: Option<PathBuf>,
    pub json_stdout: bool,
}

fn results_dir(req: &BenchRequest) -> PathBuf {
    if let Some(o) = &req.out {
        return o.clone();
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    PathBuf::from("results").join(format!("{}-{}-{}", utc_stamp(secs), req.workload, req.runtime))
}

/// `YYYYMMDD-HHMMSS` (UTC) for a Unix time, without a date library.
pub(crate) fn utc_stamp(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm), valid for the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Run the benchmark; Ok(false) when a check failed.
pub fn bench(req: &BenchRequest) -> anyhow::Result<bool> {
    check_request(req)?;
    // Validate every spec before running anything, so a bad flag fails at once.
    let specs: Vec<BenchSpec> = req.protocols.variants().iter().map(&req.make_spec).collect::<anyhow::Result<_>>()?;
    let partitions = specs.first().is_some_and(|s| s.faults.partitions);
    if req.runtime == crate::host::Runtime::Tcp && partitions && !crate::host::netns::inside() {
        // The servers' links are cut by firewall rules in a network namespace of the run's own.
        match crate::host::netns::rerun_inside()? {}
    }
    let dir = results_dir(req);
    let mut runs: Vec<RunReport> = Vec::new();
    let mut all_ok = true;
    for spec in &specs {
        let history = history_path(spec, req, &dir);
        let (run, passed, whole) = run_spec(spec, req.cluster.as_deref(), history.as_deref())?;
        // Only `--verify` makes a failed check fail the command; `--history` alone records and
        // reports (a history of a restarted cluster holds values appended before it). A run that
        // could not end whole (a full disk held its commits) always fails it.
        if (!passed && req.verify) || !whole {
            all_ok = false;
        }
        runs.push(run);
    }
    let report = BenchReport { runs };
    let json_path = req.json.clone().unwrap_or_else(|| dir.join("bench.json"));
    let plot_path = req.plot.clone().unwrap_or_else(|| dir.join("bench.svg"));
    dtx_report::write_json(&report, &json_path)?;
    dtx_report::write_plot(&report.runs, &plot_path)?;
    if req.json_stdout {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", dtx_report::render_table(&report.runs));
        println!("results: {} (json: {}, plot: {})", dir.display(), json_path.display(), plot_path.display());
    }
    Ok(all_ok)
}

/// The checks of a bench's flags that span several of them.
pub(crate) fn check_request(req: &BenchRequest) -> anyhow::Result<()> {
    if req.verify && !["append", "tpcc", "bank"].contains(&req.workload.as_str()) {
        bail!("--verify has no checker for {}: use --workload append, tpcc or bank", req.workload);
    }
    if req.history.is_some() && req.workload != "append" {
        bail!("--history records list-append histories: add --workload append");
    }
    if req.cluster.is_some() && req.runtime != crate::host::Runtime::Tcp {
        bail!("--cluster runs against running servers: add --runtime tcp");
    }
    Ok(())
}

/// Print each invariant the workload checked, pass or fail; true when all passed.
fn print_findings(spec: &BenchSpec, findings: &[(String, bool, String)]) -> bool {
    let failed = findings.iter().filter(|f| !f.1).count();
    eprintln!("{}: {} checks, {} failed", spec.protocol, findings.len(), failed);
    for (what, ok, detail) in findings {
        if !ok || findings.len() <= 64 {
            eprintln!("  {} {what}: {detail}", if *ok { "pass" } else { "FAIL" });
        }
    }
    failed == 0 && !findings.is_empty()
}

/// Where a run's list-append history goes: `--history` (with the protocol's name when several
/// run), or the results folder.
fn history_path(spec: &BenchSpec, req: &BenchRequest, dir: &Path) -> Option<PathBuf> {
    if !spec.record_history {
        return None;
    }
    Some(match &req.history {
        Some(p) if req.protocols.several() => {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("history");
            p.with_file_name(format!("{stem}-{}.jsonl", spec.protocol))
        }
        Some(p) => p.clone(),
        None => dir.join(format!("history-{}.jsonl", spec.protocol)),
    })
}

/// Runs one spec on its runtime and checks it as it asks (its history written to `history`);
/// the report, false when a check failed, and false when the run could not end whole
/// ([`Outcome::failed`]: said on stderr). In a process of its own when the command asks
/// ([`fresh_process`]), so that no run inherits another's state.
pub(crate) fn run_spec(
    spec: &BenchSpec,
    cluster: Option<&Path>,
    history: Option<&Path>,
) -> anyhow::Result<(RunReport, bool, bool)> {
    if fresh_process::applies_to(spec) {
        return fresh_process::run(spec, cluster, history, host::run_progress_hidden());
    }
    run_spec_here(spec, cluster, history)
}

/// [`run_spec`] in this process.
fn run_spec_here(
    spec: &BenchSpec,
    cluster: Option<&Path>,
    history: Option<&Path>,
) -> anyhow::Result<(RunReport, bool, bool)> {
    // Built once here; a tcp run's servers each build their own from the spec they are sent.
    let run = host::Run::build(spec)?;
    let outcome = match spec.runtime {
        host::Runtime::Sim => host::run_sim_built(&run)?,
        host::Runtime::Local => host::run_local_built(&run)?,
        host::Runtime::Tcp => host::tcp::run(spec, cluster)?,
    };
    for n in &outcome.notes {
        eprintln!("dtx: {}: {n}", spec.protocol);
    }
    if let Some(why) = &outcome.failed {
        eprintln!("dtx: {}: the run failed: {why}", spec.protocol);
    }
    let verified = match history {
        Some(path) if spec.record_history => Some(check_outcome(&run, &outcome, path)?),
        _ if spec.run_checks => Some(print_findings(spec, &outcome.totals.findings)),
        _ => None,
    };
    let report = bench::report(spec, &outcome, verified);
    if let Some(behind) = open_loop_fell_behind(&report) {
        eprintln!("dtx: {}: {behind}", spec.protocol);
    }
    Ok((report, verified != Some(false), outcome.failed.is_none()))
}

/// An open-loop run (`--rate`) whose clients fell behind its arrivals: more than 1% of the
/// window's arrivals still waited for a client as it closed. Its throughput is then what the
/// protocol sustained, not what was offered, and its latency grows with the run's length.
fn open_loop_fell_behind(r: &RunReport) -> Option<String> {
    let (offered, backlog) = (r.extra.get("offered_tps")?, r.extra.get("backlog")?);
    let arrived = offered * r.duration_s;
    (*backlog > 0.01 * arrived).then(|| {
        format!(
            "could not keep up with --rate: {backlog:.0} of {arrived:.0} arrivals still waited as the window closed \
             (offered {offered:.0}/s, committed {:.0}/s); lower --rate or raise --inflight",
            r.throughput_tps
        )
    })
}

/// Write the run's history and check it; true when it is serializable and complete.
fn check_outcome(spec: &host::Run, o: &Outcome, path: &Path) -> anyhow::Result<bool> {
    let (report, problem) = bench::verify(o, path, spec.guarantee())?;
    match problem {
        None => {
            eprintln!("{}: {} (history {})", spec.protocol, report.summary(), path.display());
            Ok(true)
        }
        Some(p) => {
            eprintln!("{}: CHECK FAILED: {p} (history {})", spec.protocol, path.display());
            for a in report.anomalies.iter().take(10) {
                eprintln!("  {}", serde_json::to_string(a).unwrap_or_default());
            }
            Ok(false)
        }
    }
}

/// `dtx protocols --options NAME`: the protocol's options, the abort reasons it defines, and
/// where each of its mechanisms lives in the source.
pub fn protocol_options(name: &str) -> anyhow::Result<bool> {
    let v = protocols::Variant::parse_including_planned(name)?;
    let p = v.info;
    println!("{}: {}", p.name, p.description);
    if p.options.is_empty() {
        println!("options: none");
    } else {
        println!("options (as --protocol '{}:KEY=VALUE'):", p.name);
        for line in protocols::options::describe(p.options) {
            println!("  {line}");
        }
    }
    if !p.aborts.is_empty() {
        println!("abort reasons of its own:");
        let width = p.aborts.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
        for (reason, meaning) in p.aborts {
            println!("  {reason:<width$}  {meaning}");
        }
    }
    println!("where it lives (under crates/dtx/src/):");
    let width = p.lives.iter().map(|(_, path)| path.len()).max().unwrap_or(0);
    for (what, path) in p.lives {
        println!("  {path:<width$}  {what}");
    }
    Ok(true)
}

/// `dtx check --history FILE [--realtime]`.
pub fn check(path: &Path, json: bool, realtime: bool) -> anyhow::Result<bool> {
    let report = if realtime { dtx_check::check_file_realtime(path)? } else { dtx_check::check_file(path)? };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.summary());
        for a in &report.anomalies {
            println!("  {}", serde_json::to_string(a).unwrap_or_default());
        }
    }
    Ok(report.valid)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_stamps() {
        assert_eq!(super::utc_stamp(0), "19700101-000000");
        assert_eq!(super::utc_stamp(1_795_333_737), "20261122-074857");
        assert_eq!(super::utc_stamp(951_782_400), "20000229-000000");
    }
}
