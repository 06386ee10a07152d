//! `dtx experiment list | run | report`: a paper's figure as a checked-in file
//! (`experiments/NAME.toml`, see `dtx_report::experiment::def`), run as `dtx bench` runs built
//! from the same flags, judged claim by claim, plotted, and gathered into one HTML page.
//!
//! A sweep visits its points in order; at each point every protocol runs once per repeat, in an
//! order rotated by point and repeat so that none always runs first. Each repeat of a sim run
//! takes the next seed. A run that fails (an error, a failed check) is recorded and the
//! experiment goes on; the command then exits non-zero. Verdicts never change the exit status.

use super::{check_request, run_spec, utc_stamp, BenchArgs, BenchRequest};
use anyhow::{anyhow, bail, Context as _};
use clap::{Args, Parser, Subcommand};
use dtx_report::experiment::html::{self, ExtraTable};
use dtx_report::experiment::pins::{Pins, PINS_FILE};
use dtx_report::experiment::{
    count_verdicts, counts_text, def::point_text, render_claims, svg, Experiment, ExperimentReport, Peak, Provenance,
    POINT_KEY, REPEAT_KEY,
};
use dtx_report::RunReport;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Subcommand)]
pub enum ExperimentCmd {
    /// Every experiment: its name, the paper and figure it reproduces, what it measures, and how
    /// long it takes (full and --quick).
    List(DirArg),
    /// Run an experiment (or --all): a progress bar, then its claims measured beside the
    /// paper's with a verdict each; JSON and an SVG plot in results/.
    Run(RunArgs),
    /// One self-contained HTML page of experiment results: plots, claims, verdicts, machine,
    /// commit and the command that reproduces each.
    Report(ReportArgs),
    /// The pinned quick verdicts of the simulated experiments (experiments/pins.toml): --check
    /// runs each pinned experiment --quick and fails naming a claim whose verdict flipped;
    /// --update runs and records them.
    Pins(PinsArgs),
}

#[derive(Args)]
pub struct PinsArgs {
    /// Run every pinned experiment (or those named) --quick and compare each claim's verdict
    /// with its pin; exits non-zero naming each flipped claim and its measured value. The
    /// simulated experiments without pins yet are listed, and fail nothing.
    #[arg(long, conflicts_with = "update", required_unless_present = "update")]
    pub check: bool,
    /// Run the named simulated experiments (or every one) --quick and write their verdicts
    /// into the pins file.
    #[arg(long)]
    pub update: bool,
    /// Only these experiments.
    pub names: Vec<String>,
    /// Runs at once (default: one per core; every pinned run is simulated).
    #[arg(long)]
    pub jobs: Option<usize>,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args)]
pub struct DirArg {
    /// The folder of experiment files (default: `experiments/` of the checkout).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct RunArgs {
    /// The experiment's name (`dtx experiment list`).
    pub name: Option<String>,
    /// Run every experiment.
    #[arg(long, conflicts_with = "name")]
    pub all: bool,
    /// The experiment's quick variant: fewer points, shorter runs.
    #[arg(long)]
    pub quick: bool,
    /// Run every point this many times; the plot shows the median with min..max as error bars.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Run on this runtime instead of the file's (sim or local; not when the runtime is swept).
    #[arg(long)]
    pub runtime: Option<String>,
    /// Override a bench flag for every run, e.g. `--set duration=0.5` (repeatable).
    #[arg(long = "set", value_name = "FLAG=VALUE")]
    pub set: Vec<String>,
    /// Also write the experiment's JSON here (it is always in its results folder too, where
    /// `dtx experiment report` finds it).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The results folder (default `results/<time>-experiment-<name>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Runs at once (default: one per core when every run is simulated, else 1). A simulated
    /// run measures virtual time, so runs side by side change none of its figures; runs on
    /// real threads (`local`, `tcp`) would take each other's cores, and go one at a time.
    #[arg(long)]
    pub jobs: Option<usize>,
    #[command(flatten)]
    pub dir: DirArg,
}

#[derive(Args)]
pub struct ReportArgs {
    /// Experiment results: `experiment.json` files or folders holding them (default: the newest
    /// result of each experiment under results/).
    pub results: Vec<PathBuf>,
    /// Write the page here.
    #[arg(long, default_value = "results/report.html")]
    pub out: PathBuf,
    /// Also write the claims as a Markdown table here (the table in docs/experiments.md).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// The COCO comparison's JSON (`scripts/compare-coco.sh` writes it), shown as a table.
    #[arg(long)]
    pub coco: Option<PathBuf>,
    /// Judge the stored runs by the experiment files in this folder as they are now (their
    /// claims, bands and verdict rules), not by the definitions stored with the runs: a changed
    /// rule or band is then seen without running again. A result whose file would now run
    /// something else is still judged, and said so.
    #[arg(long, value_name = "DIR")]
    pub definitions: Option<PathBuf>,
}

/// `dtx bench`'s flags, parsed from an experiment's lines.
#[derive(Parser)]
#[command(name = "bench")]
struct BenchLine {
    #[command(flatten)]
    args: BenchArgs,
}

/// Ok(false) when a run failed.
pub fn experiment(cmd: ExperimentCmd, commit: &str) -> anyhow::Result<bool> {
    match cmd {
        ExperimentCmd::List(d) => list(&experiments_dir(d.dir.as_deref())?),
        ExperimentCmd::Run(r) => run(&r, commit),
        ExperimentCmd::Report(r) => report(&r),
        ExperimentCmd::Pins(p) => pins(&p, commit),
    }
}

/// The experiments folder: given, or `$DTX_EXPERIMENTS`, or `experiments/` in the working
/// directory or one above it, or the checkout this binary was built from.
pub fn experiments_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(d) = given {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("DTX_EXPERIMENTS") {
        return Ok(PathBuf::from(d));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        candidates.extend(cwd.ancestors().take(4).map(|a| a.join("experiments")));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments"));
    candidates.into_iter().find(|d| d.join("contention-sweep.toml").is_file()).ok_or_else(|| {
        anyhow!("no experiments folder found: run dtx from its checkout, or give --dir or DTX_EXPERIMENTS")
    })
}

/// Every experiment in `dir`, by name; a malformed file is an error naming the file and field.
/// The pins file beside them is no experiment.
pub fn load_all(dir: &Path) -> anyhow::Result<Vec<Experiment>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && !p.ends_with(PINS_FILE))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let e = Experiment::load(p)?;
            check_flags(&e).with_context(|| p.display().to_string())?;
            Ok(e)
        })
        .collect()
}

/// `dtx experiment pins --check | --update`: see [`ExperimentCmd::Pins`] and
/// `dtx_report::experiment::pins`.
fn pins(a: &PinsArgs, commit: &str) -> anyhow::Result<bool> {
    let dir = experiments_dir(a.dir.dir.as_deref())?;
    let all = load_all(&dir)?;
    let path = dir.join(PINS_FILE);
    let mut pinned = Pins::load(&path)?;
    for n in &a.names {
        match all.iter().find(|e| e.name == *n) {
            None => bail!("no experiment `{n}` in {}", dir.display()),
            Some(e) if !e.runs_only_in_sim() => {
                bail!("{n}: its runs are not all in sim, so its verdicts follow the machine and are not pinned")
            }
            Some(_) => {}
        }
    }
    let named = |e: &&Experiment| a.names.is_empty() || a.names.contains(&e.name);
    let chosen: Vec<&Experiment> = if a.update {
        all.iter().filter(|e| e.runs_only_in_sim()).filter(named).collect()
    } else {
        let problems = pinned.problems(&all);
        if !problems.is_empty() {
            bail!("{} does not match the experiment files:\n{}", path.display(), problems.join("\n"));
        }
        all.iter().filter(|e| pinned.experiments.contains_key(&e.name)).filter(named).collect()
    };
    let out = PathBuf::from("results").join(format!("{}-pins", utc_stamp(now_s())));
    let mut flips = Vec::new();
    let mut ok = true;
    for e in &chosen {
        let args = RunArgs {
            name: Some(e.name.clone()),
            all: false,
            quick: true,
            repeat: 1,
            runtime: None,
            set: Vec::new(),
            json: None,
            out: Some(out.join(&e.name)),
            jobs: a.jobs,
            dir: DirArg { dir: Some(dir.clone()) },
        };
        let report = run_one(e, &args, commit)?;
        if !report.failures.is_empty() {
            // A failed run measures nothing to pin or compare: it fails the command either way.
            eprintln!("{}: {} failed run(s): {}", e.name, report.failures.len(), report.failures.join("; "));
            ok = false;
            continue;
        }
        if a.update {
            pinned.record(&report);
        } else {
            flips.extend(pinned.flips(&report));
        }
    }
    if a.update {
        let order = all.iter().map(|e| (e.name.clone(), e.claims.iter().map(|c| c.text.clone()).collect())).collect();
        std::fs::write(&path, pinned.to_toml(&order)).with_context(|| format!("writing {}", path.display()))?;
        println!("pinned {} experiment(s) in {}", chosen.len(), path.display());
    } else {
        println!("\nchecked the pinned verdicts of {} experiment(s)", chosen.len());
        for f in &flips {
            println!("FLIPPED {f}");
        }
    }
    let unpinned = pinned.unpinned(&all);
    if !unpinned.is_empty() {
        println!(
            "not pinned yet ({}; record with `dtx experiment pins --update NAME`): {}",
            unpinned.len(),
            unpinned.join(", ")
        );
    }
    Ok(ok && flips.is_empty())
}

fn list(dir: &Path) -> anyhow::Result<bool> {
    let all = load_all(dir)?;
    let mins = |s: f64| if s >= 90.0 { format!("{:.0} min", s / 60.0) } else { format!("{s:.0} s") };
    for e in &all {
        let takes = format!("{}, quick {}", mins(e.takes_full_s), mins(e.takes_quick_s));
        println!("{:<22} {:<18} {}: {}", e.name, takes, e.paper, e.figure);
        println!("{:<22} {}", "", e.measures);
    }
    println!("({} experiments in {}; `dtx experiment run NAME [--quick]`)", all.len(), dir.display());
    Ok(true)
}

/// `--flag value` words for a flag given as `key = value` (`_` and `-` alike; a boolean flag
/// is given without a value, or left out when false).
fn flag_words(key: &str, value: &str) -> Vec<String> {
    let flag = format!("--{}", key.replace('_', "-"));
    match value {
        "true" => vec![flag],
        "false" => Vec::new(),
        v => vec![flag, v.to_string()],
    }
}

/// Each flag of the file parses on its own, so that an error names its section and key.
fn check_flags(e: &Experiment) -> anyhow::Result<()> {
    let mut sections = vec![("bench".to_string(), &e.bench), ("quick".to_string(), &e.quick)];
    for (p, flags) in &e.bench_by_protocol {
        sections.push((format!("bench.protocol.\"{p}\""), flags));
    }
    for (p, flags) in &e.quick_by_protocol {
        sections.push((format!("quick.protocol.\"{p}\""), flags));
    }
    for (section, flags) in sections {
        for (k, v) in flags.iter() {
            let mut argv = vec!["bench".to_string()];
            argv.extend(flag_words(k, v));
            BenchLine::try_parse_from(&argv)
                .map_err(|err| anyhow!("[{section}] {k}: {}", first_line(&err.to_string())))?;
        }
    }
    if let Some(s) = e.sweep.as_ref().filter(|s| s.option) {
        // Every swept protocol has the option, and takes every value, before anything runs.
        for p in &s.protocols {
            for v in &s.values {
                let variant = e.variant_at(p, Some(v));
                crate::protocols::Variant::parse(&variant)
                    .map_err(|err| anyhow!("[sweep] option {}: {err}", s.param))?;
            }
        }
    }
    if let Some(s) = e.sweep.as_ref().filter(|s| !s.option) {
        for v in &s.values {
            let argv: Vec<String> =
                std::iter::once("bench".to_string()).chain(flag_words(&s.param, &point_text(v))).collect();
            BenchLine::try_parse_from(&argv)
                .map_err(|err| anyhow!("[sweep] param {} = {v}: {}", s.param, first_line(&err.to_string())))?;
        }
    }
    for p in &e.protocols {
        crate::protocols::Variant::parse(p).with_context(|| format!("protocols: `{p}`"))?;
    }
    Ok(())
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string()
}

/// One run to make: a point, a repeat, a protocol.
struct Job {
    point: Option<serde_json::Value>,
    repeat: u32,
    protocol: String,
}

/// The runs of an experiment in order: at each point, each repeat runs every protocol, in an
/// order rotated by point and repeat.
fn jobs(e: &Experiment, quick: bool, repeat: u32) -> Vec<Job> {
    let mut out = Vec::new();
    for (i, point) in e.points(quick).into_iter().enumerate() {
        for r in 0..repeat {
            let n = e.protocols.len();
            for k in 0..n {
                let protocol = e.protocols[(k + i + r as usize) % n].clone();
                out.push(Job { point: point.clone(), repeat: r, protocol });
            }
        }
    }
    out
}

/// A flag's value as the file gives it: a latency matrix's path is relative to the file's folder.
fn from_file(e: &Experiment, key: &str, value: &str) -> String {
    let dir = e.file.parent().filter(|d| !d.as_os_str().is_empty());
    match dir {
        Some(d) if key.replace('_', "-") == "latency-matrix" && Path::new(value).is_relative() => {
            d.join(value).display().to_string()
        }
        _ => value.to_string(),
    }
}

/// The bench command line of one job.
fn argv(e: &Experiment, a: &RunArgs, job: &Job) -> anyhow::Result<Vec<String>> {
    let mut flags: Vec<(String, String)> = Vec::new();
    fn set(flags: &mut Vec<(String, String)>, k: &str, v: String) {
        let k = k.replace('_', "-");
        flags.retain(|(f, _)| *f != k);
        flags.push((k, v));
    }
    for (k, v) in e.flags_of(&job.protocol, a.quick) {
        set(&mut flags, &k, from_file(e, &k, &v));
    }
    let swept = e.sweep.as_ref().filter(|s| !s.option).map(|s| s.param.replace('_', "-"));
    if let Some(rt) = &a.runtime {
        if swept.as_deref() == Some("runtime") {
            bail!("--runtime: {} sweeps the runtime itself", e.name);
        }
        set(&mut flags, "runtime", rt.clone());
    }
    for kv in &a.set {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("--set `{kv}`: give FLAG=VALUE, e.g. duration=0.5"))?;
        if swept.as_deref() == Some(&k.replace('_', "-")) {
            bail!("--set {k}: {} sweeps {k} itself", e.name);
        }
        set(&mut flags, k.trim(), v.trim().to_string());
    }
    if let (Some(s), Some(p)) = (e.sweep.as_ref().filter(|s| !s.option), &job.point) {
        set(&mut flags, &s.param, from_file(e, &s.param, &point_text(p)));
    }
    if job.repeat > 0 {
        let seed: u64 = flags.iter().find(|(k, _)| k == "seed").and_then(|(_, v)| v.parse().ok()).unwrap_or(1);
        set(&mut flags, "seed", (seed + job.repeat as u64).to_string());
    }
    set(&mut flags, "protocol", e.variant_at(&job.protocol, job.point.as_ref()));
    let mut out = vec!["bench".to_string()];
    for (k, v) in &flags {
        out.extend(flag_words(k, v));
    }
    Ok(out)
}

fn run(a: &RunArgs, commit: &str) -> anyhow::Result<bool> {
    if a.repeat == 0 || a.repeat > 100 {
        bail!("--repeat {}: give 1 to 100", a.repeat);
    }
    if let Some(rt) = &a.runtime {
        if !["sim", "local", "tcp"].contains(&rt.as_str()) {
            bail!("--runtime `{rt}`: use sim, local or tcp");
        }
    }
    let dir = experiments_dir(a.dir.dir.as_deref())?;
    let all = load_all(&dir)?;
    let chosen: Vec<&Experiment> = match (&a.name, a.all) {
        (_, true) => all.iter().collect(),
        (Some(n), false) => match all.iter().find(|e| e.name == *n) {
            Some(e) => vec![e],
            None => {
                let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
                bail!("no experiment `{n}`; the experiments are: {}", names.join(", "))
            }
        },
        (None, false) => bail!("name an experiment (`dtx experiment list`), or give --all"),
    };
    if chosen.len() > 1 && (a.json.is_some() || a.out.is_some()) {
        bail!("--json and --out name one experiment's files: leave them out with --all");
    }
    let mut ok = true;
    let mut summary = Vec::new();
    for e in chosen {
        let report = run_one(e, a, commit)?;
        summary.push(format!(
            "{:<26} {}{}",
            e.name,
            counts_text(count_verdicts(&report.claims)),
            if report.failures.is_empty() { String::new() } else { format!(", {} FAILED runs", report.failures.len()) }
        ));
        summary.extend(report.claims.iter().filter_map(|c| c.headline_warning(&e.name)).map(|w| format!("  {w}")));
        ok &= report.failures.is_empty();
    }
    if summary.len() > 1 {
        println!("\n{}", summary.join("\n"));
    }
    Ok(ok)
}

fn run_one(e: &Experiment, a: &RunArgs, commit: &str) -> anyhow::Result<ExperimentReport> {
    let jobs = jobs(e, a.quick, a.repeat);
    let parsed = parse_runs(e, a, &jobs)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("{}-experiment-{}", utc_stamp(now_s()), e.name)));
    println!(
        "{}: {} ({} {}), {} runs{}",
        e.name,
        e.title,
        e.paper,
        e.figure,
        jobs.len(),
        if a.quick { ", quick" } else { "" }
    );
    let bar = progress_bar(e, jobs.len());
    crate::host::hide_run_progress(true);
    let started = Instant::now();
    let parallel = runs_at_once(a, &parsed)?;
    let specs: Vec<(Option<&Path>, &crate::host::BenchSpec)> =
        parsed.iter().map(|(req, spec)| (req.cluster.as_deref(), spec)).collect();
    let peak = e.peak.as_ref().map(|p| (p, p.loads(a.quick)));
    let finished = run_jobs(e, (&jobs, peak), &specs, &out, parallel, &bar);
    let (runs, run_wall_s, failures) = gather(e, &jobs, finished);
    crate::host::hide_run_progress(false);
    bar.finish_and_clear();
    let mut report = ExperimentReport {
        experiment: e.name.clone(),
        paper: e.paper.clone(),
        figure: e.figure.clone(),
        claims: Vec::new(),
        runs,
        title: e.title.clone(),
        measures: e.measures.clone(),
        notes: e.notes.clone(),
        quick: a.quick,
        repeat: a.repeat,
        points: e.points(a.quick),
        run_wall_s,
        failures,
        provenance: provenance(e, a, commit, started.elapsed().as_secs_f64()),
        definition: e.clone(),
        rejudged: None,
    };
    report.claims = report.evaluate();
    let plot = out.join("experiment.svg");
    // The results folder always holds the JSON and the plot, also when --json asks for a copy
    // elsewhere: `dtx experiment report` finds a run by its folder's experiment.json.
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    report.write(&out.join("experiment.json"))?;
    let json = match &a.json {
        Some(copy) => {
            report.write(copy)?;
            copy.clone()
        }
        None => out.join("experiment.json"),
    };
    std::fs::write(&plot, svg::render(&report)?).with_context(|| format!("writing {}", plot.display()))?;
    print_result(&report);
    println!("results: {} (json: {}, plot: {})", out.display(), json.display(), plot.display());
    Ok(report)
}

/// Every run's flags, parsed before anything runs, so that a bad one fails at once.
fn parse_runs(
    e: &Experiment,
    a: &RunArgs,
    jobs: &[Job],
) -> anyhow::Result<Vec<(BenchRequest, crate::host::BenchSpec)>> {
    let lines: Vec<Vec<String>> = jobs.iter().map(|j| argv(e, a, j)).collect::<anyhow::Result<_>>()?;
    let mut parsed = Vec::new();
    for (j, line) in jobs.iter().zip(&lines) {
        let args = BenchLine::try_parse_from(line)
            .map_err(|err| anyhow!("{}: {}", e.name, first_line(&err.to_string())))?
            .args;
        let req: BenchRequest = args.into();
        check_request(&req).with_context(|| e.name.clone())?;
        let variant = e.variant_at(&j.protocol, j.point.as_ref());
        let spec = crate::protocols::Variant::parse(&variant)
            .and_then(|v| (req.make_spec)(&v))
            .with_context(|| format!("{}: {variant}", e.name))?;
        parsed.push((req, spec));
    }
    Ok(parsed)
}

/// The experiment's bar: one step a run.
fn progress_bar(e: &Experiment, runs: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(Some(runs as u64), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} runs {elapsed_precise} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(e.name.clone());
    bar
}

/// The runs that finished, their wall times, and what failed, by point and repeat.
fn gather(e: &Experiment, jobs: &[Job], finished: Vec<JobResult>) -> (Vec<RunReport>, Vec<f64>, Vec<String>) {
    let mut runs = Vec::new();
    let mut run_wall_s = Vec::new();
    let mut failures = Vec::new();
    for (j, (result, wall_s)) in jobs.iter().zip(finished) {
        let at = point_label(e, j);
        match result {
            Ok((mut run, passed, whole)) => {
                if !passed {
                    failures.push(format!("{at}{} repeat {}: its check failed", j.protocol, j.repeat + 1));
                }
                if !whole {
                    failures.push(format!("{at}{} repeat {}: the run failed (see above)", j.protocol, j.repeat + 1));
                }
                mark(&mut run, e, j);
                runs.push(run);
                run_wall_s.push(wall_s);
            }
            Err(err) => failures.push(format!("{at}{} repeat {}: {err:#}", j.protocol, j.repeat + 1)),
        }
    }
    (runs, run_wall_s, failures)
}

/// How many of an experiment's runs go at once: `--jobs`, else one per core when every run is
/// simulated, else one.
fn runs_at_once(a: &RunArgs, parsed: &[(BenchRequest, crate::host::BenchSpec)]) -> anyhow::Result<usize> {
    let simulated = parsed.iter().all(|(_, spec)| spec.runtime == crate::host::Runtime::Sim);
    match a.jobs {
        Some(0) => bail!("--jobs 0: give 1 or more runs at once"),
        Some(n) if n > 1 && !simulated => {
            bail!("--jobs {n}: runs on real threads (local, tcp) would take each other's cores; give --jobs 1")
        }
        Some(n) => Ok(n),
        None if simulated => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        None => Ok(1),
    }
}

/// `point=value ` of a job in a sweep (empty otherwise), as messages and file names give it.
fn point_label(e: &Experiment, j: &Job) -> String {
    match (&e.sweep, &j.point) {
        (Some(s), Some(p)) => format!("{}={} ", s.param, point_text(p)),
        _ => String::new(),
    }
}

type JobResult = (anyhow::Result<(RunReport, bool, bool)>, f64);

/// Run every job, `parallel` at a time, each on a thread of its own taking the next job not yet
/// taken; the results (and each run's wall seconds) in the jobs' order, whatever order they
/// finished in.
fn run_jobs(
    e: &Experiment,
    (jobs, peak): (&[Job], Option<(&Peak, &[f64])>),
    specs: &[(Option<&Path>, &crate::host::BenchSpec)],
    out: &Path,
    parallel: usize,
    bar: &indicatif::ProgressBar,
) -> Vec<JobResult> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<JobResult>>> = jobs.iter().map(|_| Default::default()).collect();
    let run = |i: usize| {
        let (j, (cluster, spec)) = (&jobs[i], specs[i]);
        let at = point_label(e, j);
        let history = spec.record_history.then(|| {
            out.join("histories").join(format!("{}-{}{}.jsonl", j.protocol, at.trim().replace('=', "-"), j.repeat))
        });
        bar.set_message(format!("{at}{} #{}", j.protocol, j.repeat + 1));
        let t = Instant::now();
        let result = match peak {
            Some((p, loads)) => run_at_peak(spec, p, loads, cluster),
            None => run_spec(spec, cluster, history.as_deref()),
        };
        *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some((result, t.elapsed().as_secs_f64()));
        bar.inc(1);
    };
    std::thread::scope(|scope| {
        for _ in 0..parallel.min(jobs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= jobs.len() {
                    return;
                }
                run(i);
            });
        }
    });
    let taken = results.into_iter().map(|r| r.into_inner().unwrap_or_else(|p| p.into_inner()));
    taken.map(|r| r.expect("every job ran")).collect()
}

/// A run of `spec` at its peak ([`Peak`]): `spec` again at each load of `loads` in turn until
/// one adds less than [`Peak::MIN_GROWTH`] to the best throughput so far; the best run, with
/// the load that reached it (`extra.peak_load`) and the loads tried (`extra.peak_runs`). A
/// failed check or run at any load is the result's.
fn run_at_peak(
    spec: &crate::host::BenchSpec,
    peak: &Peak,
    loads: &[f64],
    cluster: Option<&Path>,
) -> anyhow::Result<(RunReport, bool, bool)> {
    anyhow::ensure!(!spec.record_history, "a run at its peak keeps no history: leave out --verify and --history");
    let mut best: Option<(RunReport, f64)> = None;
    let (mut passed, mut whole, mut tried, mut reached) = (true, true, 0, false);
    for &load in loads {
        let mut at = spec.clone();
        match peak.param.as_str() {
            "inflight" => at.inflight = load.round() as u32,
            _ => at.rate_per_node = load,
        }
        at.validate()?;
        let (run, ok, complete) = run_spec(&at, cluster, None)?;
        (passed, whole, tried) = (passed && ok, whole && complete, tried + 1);
        let best_tps = best.as_ref().map_or(0.0, |b| b.0.throughput_tps);
        let grew = run.throughput_tps > best_tps * (1.0 + Peak::MIN_GROWTH);
        // The first run stands until one beats it, so that a climb that commits nothing at any
        // load (a run too short for its load) still reports what it measured.
        if best.is_none() || run.throughput_tps > best_tps {
            best = Some((run, load));
        }
        if !grew {
            reached = true;
            break;
        }
    }
    let (mut run, load) = best.context("a peak climbs at least one load")?;
    if !reached {
        // Still growing at the largest load tried: the figure is a floor of the peak, not it.
        eprintln!(
            "dtx: {}: throughput still grew at the largest {} tried ({load}): its peak lies beyond; add larger values to [peak]",
            spec.protocol, peak.param
        );
    }
    run.extra.insert("peak_load".into(), load);
    run.extra.insert("peak_runs".into(), tried as f64);
    run.extra.insert("peak_reached".into(), if reached { 1.0 } else { 0.0 });
    if let Some(share) = peak.latency_at {
        // Enough clients that arrivals seldom wait for one: the peak's own, at least.
        let clients = if peak.param == "inflight" { load.round() as u32 } else { spec.inflight };
        let (open, ok, complete) = latency_at_share_of_peak(spec, (&run, clients), share, cluster)?;
        (passed, whole) = (passed && ok, whole && complete);
        run.latency_us = open.latency_us;
        run.latency_us_by_class = open.latency_us_by_class;
        run.latency_us_by_region = open.latency_us_by_region;
        run.latency_us_by_region_class = open.latency_us_by_region_class;
        for key in ["offered_tps", "backlog"] {
            run.extra.insert(format!("latency_run_{key}"), open.extra.get(key).copied().unwrap_or(0.0));
        }
        run.extra.insert("latency_at_share".into(), share);
    }
    Ok((run, passed, whole))
}

/// The open-loop run whose latencies a peak run reports: `spec` at `share` of the throughput
/// `peak` reached, split evenly over the client nodes, with at least `clients` per worker.
fn latency_at_share_of_peak(
    spec: &crate::host::BenchSpec,
    (peak, clients): (&RunReport, u32),
    share: f64,
    cluster: Option<&Path>,
) -> anyhow::Result<(RunReport, bool, bool)> {
    let topo = spec.topology();
    let client_nodes = (0..spec.nodes).filter(|n| topo.runs_clients(*n)).count();
    anyhow::ensure!(client_nodes > 0, "{}: no node runs clients", spec.protocol);
    let mut open = spec.clone();
    open.rate_per_node = share * peak.throughput_tps / client_nodes as f64;
    open.inflight = open.inflight.max(clients);
    open.validate()?;
    run_spec(&open, cluster, None)
}

/// Names a run by its point and repeat in its params, as the experiment JSON's contract says,
/// and by the protocol as the file lists it (an option sweep ran a variant of it, which the
/// params keep under `protocol`).
fn mark(run: &mut RunReport, e: &Experiment, j: &Job) {
    run.protocol = j.protocol.clone();
    let point = j.point.clone().unwrap_or(serde_json::Value::Null);
    if let Some(s) = &e.sweep {
        run.params.insert(s.param.clone(), point.clone());
    }
    run.params.insert(POINT_KEY.into(), point);
    run.params.insert(REPEAT_KEY.into(), serde_json::json!(j.repeat));
}

fn print_result(r: &ExperimentReport) {
    // One row per run of the first repeat, named by its point.
    let mut rows: Vec<RunReport> = r
        .observations()
        .iter()
        .filter(|o| o.repeat == 0)
        .map(|o| {
            let mut run = o.run.clone();
            if let (Some(s), Some(p)) = (&r.definition.sweep, o.point) {
                run.protocol = format!("{} @{}={}", run.protocol, s.param, point_text(p));
            }
            run
        })
        .collect();
    rows.sort_by(|a, b| a.protocol.cmp(&b.protocol));
    if !rows.is_empty() {
        print!("{}", dtx_report::render_table(&rows));
    }
    print!("\n{}", render_claims(&r.experiment, &r.claims));
    if let Some(speed) = r.sim_txn_per_wall_s() {
        println!("simulated {:.0} committed transactions per wall second", speed);
    }
    for f in &r.failures {
        println!("FAILED: {f}");
    }
}

/// `2026-11-25 04:29:16 UTC`.
fn utc_date(secs: u64) -> String {
    let s = utc_stamp(secs);
    format!("{}-{}-{} {}:{}:{} UTC", &s[0..4], &s[4..6], &s[6..8], &s[9..11], &s[11..13], &s[13..15])
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn provenance(e: &Experiment, a: &RunArgs, commit: &str, wall_s: f64) -> Provenance {
    let mut command = format!("dtx experiment run {}", e.name);
    if a.quick {
        command.push_str(" --quick");
    }
    if a.repeat > 1 {
        command.push_str(&format!(" --repeat {}", a.repeat));
    }
    if let Some(rt) = &a.runtime {
        command.push_str(&format!(" --runtime {rt}"));
    }
    for s in &a.set {
        command.push_str(&format!(" --set {s}"));
    }
    let date = utc_date(now_s());
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    Provenance {
        command,
        commit: commit.to_string(),
        date,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()) as u32,
        cpu_model,
        wall_s,
    }
}

/// Every `experiment.json` under `path` (or `path` itself).
fn find_results(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if path.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let entries = std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))?;
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_dir() {
            find_results(&p, out)?;
        } else if p.file_name().is_some_and(|n| n == "experiment.json") {
            out.push(p);
        }
    }
    Ok(())
}

fn report(a: &ReportArgs) -> anyhow::Result<bool> {
    let mut files = Vec::new();
    let given = !a.results.is_empty();
    let roots = if given { a.results.clone() } else { vec![PathBuf::from("results")] };
    for r in &roots {
        find_results(r, &mut files)?;
    }
    let mut reports: Vec<ExperimentReport> =
        files.iter().map(|f| ExperimentReport::read(f)).collect::<anyhow::Result<_>>()?;
    if !given {
        // The newest result of each experiment (a full run over a quick one of the same day).
        reports.sort_by(|x, y| {
            (&x.experiment, !x.quick, &x.provenance.date).cmp(&(&y.experiment, !y.quick, &y.provenance.date))
        });
        reports.reverse();
        reports.dedup_by(|x, y| x.experiment == y.experiment);
    }
    reports.sort_by(|x, y| x.experiment.cmp(&y.experiment));
    if reports.is_empty() {
        bail!("no experiment results found in {}: run `dtx experiment run NAME` first", roots[0].display());
    }
    if let Some(dir) = &a.definitions {
        rejudge_all(&mut reports, dir)?;
    }
    let mut extras = Vec::new();
    if let Some(c) = &a.coco {
        extras.push(coco_table(c)?);
    }
    let page = html::render(&reports, &extras, &utc_date(now_s()));
    if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&a.out, page).with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(md) = &a.markdown {
        std::fs::write(md, markdown(&reports)).with_context(|| format!("writing {}", md.display()))?;
    }
    println!("report: {} ({} experiments)", a.out.display(), reports.len());
    Ok(true)
}

/// Judges each stored result by its experiment's file in `dir` as it is now; a result whose
/// file is gone keeps its stored definition, and each is said on stderr.
fn rejudge_all(reports: &mut [ExperimentReport], dir: &Path) -> anyhow::Result<()> {
    let current = load_all(dir)?;
    for r in reports {
        match current.iter().find(|e| e.name == r.experiment) {
            Some(e) => {
                r.rejudge(e);
                if let Some(j) = r.rejudged.as_ref().filter(|j| j.contains("not re-run")) {
                    eprintln!("{}: {j}", r.experiment);
                }
            }
            None => eprintln!("{}: no such file in {}: judged by the stored definition", r.experiment, dir.display()),
        }
    }
    Ok(())
}

/// The claims of every experiment as one Markdown table (docs/experiments.md's "Current
/// figures", whose columns it has), each with the day it was measured and, for a result judged
/// again by its current file, that it was not re-run; then the verdicts counted per paper. The
/// page's "moved" column says what moved and why, which only its writer knows.
fn markdown(reports: &[ExperimentReport]) -> String {
    use dtx_report::experiment::sig3;
    let mut s = String::from(
        "| paper | experiment | claim | the paper's | band | measured | verdict | measured on | moved, and why |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut by_paper: Vec<(String, [usize; 5])> = Vec::new();
    for r in reports {
        let claims = r.evaluate();
        let key = paper_key(&r.paper);
        let moved = if r.rejudged.is_some() { "re-judged under the rules, not re-run" } else { "" };
        for c in &claims {
            let verdict = match c.headline_warning(&r.experiment) {
                Some(_) => format!(
                    "{}; headline short of its band ({})",
                    c.verdict.text(),
                    c.short_of.as_deref().unwrap_or("no value")
                ),
                None if c.headline => format!("{}; headline", c.verdict.text()),
                None => c.verdict.text().to_string(),
            };
            s.push_str(&format!(
                "| {key} | {} | {} | {} | {}..{} | {} | {verdict} | {} | {moved} |\n",
                r.experiment,
                c.text,
                c.paper.map(sig3).unwrap_or_else(|| "-".into()),
                sig3(c.band[0]),
                sig3(c.band[1]),
                c.measured.map(sig3).unwrap_or_else(|| "no value".into()),
                measured_on(r),
            ));
        }
        let n = count_verdicts(&claims);
        match by_paper.iter_mut().find(|(p, _)| *p == key) {
            Some((_, total)) => total.iter_mut().zip(n).for_each(|(t, k)| *t += k),
            None => by_paper.push((key, n)),
        }
    }
    s.push_str("\n| paper | reproduced | same direction | not reproduced | not tested | calibrated |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for (paper, n) in by_paper {
        let cells: Vec<String> = n.iter().map(|k| k.to_string()).collect();
        s.push_str(&format!("| {paper} | {} |\n", cells.join(" | ")));
    }
    s
}

/// The day a result's runs were made, `(quick)` when they were, and `not re-run` when its
/// file now runs something else.
fn measured_on(r: &ExperimentReport) -> String {
    let day = r.provenance.date.get(..10).unwrap_or(&r.provenance.date);
    let mut out = format!("{day}, {}", if r.quick { "quick" } else { "full" });
    if r.rejudged.as_ref().is_some_and(|j| j.contains("not re-run")) {
        out.push_str("; not re-run since its file's runs changed");
    }
    out
}

/// The paper an experiment counts under: its `paper` up to the first parenthesis or comma
/// (`Primo (Lai et al., ...), COCO's curves` is Primo's).
fn paper_key(paper: &str) -> String {
    paper.split(['(', ',']).next().unwrap_or(paper).trim().to_string()
}

/// The table of `scripts/compare-coco.sh`'s JSON: `{"date": ..., "rounds": [{"coco": tps,
/// "dtx": {"occ": tps, ...}}]}`.
fn coco_table(path: &Path) -> anyhow::Result<ExtraTable> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let rounds = v["rounds"].as_array().ok_or_else(|| anyhow!("{}: no `rounds` array", path.display()))?;
    let mut protos: Vec<String> = Vec::new();
    for r in rounds {
        if let Some(m) = r["dtx"].as_object() {
            for k in m.keys() {
                if !protos.contains(k) {
                    protos.push(k.clone());
                }
            }
        }
    }
    let mut header = vec!["round".to_string(), "COCO silo".to_string()];
    header.extend(protos.iter().map(|p| format!("dtx {p}")));
    let cell = |x: &serde_json::Value| x.as_f64().map(dtx_report::experiment::sig3).unwrap_or_else(|| "-".into());
    let rows = rounds
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut row = vec![(i + 1).to_string(), cell(&r["coco"])];
            row.extend(protos.iter().map(|p| cell(&r["dtx"][p])));
            row
        })
        .collect();
    Ok(ExtraTable {
        title: "Against COCO's testbed (scripts/compare-coco.sh)".into(),
        intro: format!(
            "TPC-C New-Order/Payment, one warehouse, one process, committed/s, alternating runs ({}, {}).",
            v["date"].as_str().unwrap_or("undated"),
            path.display()
        ),
        header,
        rows,
    })
}
