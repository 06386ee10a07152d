//! Every run of `dtx bench` and `dtx experiment run` in a process of its own.
//!
//! Runs that share a process do not start alike: a later run inherits the heap earlier runs grew
//! (mimalloc keeps freed pages and segments for reuse, so it skips the page faults and zeroing a
//! first run pays), their warmed caches and their exited threads' leftovers. Measured here
//! (docs/performance-history.md): a protocol's place in `--protocol a,b,c` moved its figure by up
//! to a sixth, differently per binary, and `memory_mib` of a later run counted an earlier run's
//! memory. So each run starts in a fresh `dtx` (this same binary, `current_exe`), handed its spec
//! as a file, and hands back its report as a file; the parent only sequences, prints and
//! plots. tcp runs already start their own servers per run; the bench process itself then only
//! drives the control connections, so they stay in process.
//!
//! `--same-process` (bench) turns this off, for a profiler that follows one process.

use super::run_spec_here;
use crate::host::{BenchSpec, Runtime};
use anyhow::{bail, Context};
use dtx_report::RunReport;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Whether runs go to fresh processes: `main` turns it on for the `dtx` command; library
/// callers (the tests) run in their own process as before.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Numbers the request files of one parent.
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// Turn fresh processes per run on (the `dtx` command does, unless `--same-process`).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// What the parent hands the child.
#[derive(Serialize, Deserialize)]
struct Request {
    spec: BenchSpec,
    cluster: Option<PathBuf>,
    history: Option<PathBuf>,
    hide_progress: bool,
}

/// What the child hands back: [`run_spec_here`]'s result.
#[derive(Serialize, Deserialize)]
struct Answer {
    report: RunReport,
    passed: bool,
    whole: bool,
}

/// Whether a run of `spec` goes to a process of its own.
pub(super) fn applies_to(spec: &BenchSpec) -> bool {
    ENABLED.load(Ordering::Relaxed) && spec.runtime != Runtime::Tcp
}

/// Run `spec` in a fresh `dtx` process; its stderr (progress, notes, check output) is this
/// process's.
pub(super) fn run(
    spec: &BenchSpec,
    cluster: Option<&Path>,
    history: Option<&Path>,
    hide_progress: bool,
) -> anyhow::Result<(RunReport, bool, bool)> {
    let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
    let stem = std::env::temp_dir().join(format!("dtx-run-{}-{n}", std::process::id()));
    let (request_path, answer_path) = (stem.with_extension("request.json"), stem.with_extension("answer.json"));
    let _cleanup = Cleanup(vec![request_path.clone(), answer_path.clone()]);
    let request = Request {
        spec: spec.clone(),
        cluster: cluster.map(Path::to_path_buf),
        history: history.map(Path::to_path_buf),
        hide_progress,
    };
    std::fs::write(&request_path, serde_json::to_vec(&request)?)
        .with_context(|| format!("writing {}", request_path.display()))?;
    let exe = std::env::current_exe().context("finding the dtx binary to start a run in")?;
    let status = std::process::Command::new(&exe)
        .arg("run-one")
        .arg(&request_path)
        .arg(&answer_path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("starting {} for {}'s run", exe.display(), spec.protocol))?;
    if !status.success() {
        bail!("{}'s run in its own process failed ({status}); its error is above", spec.protocol);
    }
    let text = std::fs::read(&answer_path).with_context(|| format!("reading {}", answer_path.display()))?;
    let a: Answer = serde_json::from_slice(&text).with_context(|| format!("parsing {}", answer_path.display()))?;
    Ok((a.report, a.passed, a.whole))
}

/// `dtx run-one REQUEST ANSWER`: the child's side. Runs the request here and writes the answer.
pub fn serve(request_path: &Path, answer_path: &Path) -> anyhow::Result<bool> {
    let text = std::fs::read(request_path).with_context(|| format!("reading {}", request_path.display()))?;
    let r: Request = serde_json::from_slice(&text).with_context(|| format!("parsing {}", request_path.display()))?;
    r.spec.validate()?;
    crate::host::hide_run_progress(r.hide_progress);
    let (report, passed, whole) = run_spec_here(&r.spec, r.cluster.as_deref(), r.history.as_deref())?;
    let answer = serde_json::to_vec(&Answer { report, passed, whole })?;
    std::fs::write(answer_path, answer).with_context(|| format!("writing {}", answer_path.display()))?;
    Ok(true)
}

/// Removes the exchange files however the run ends.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}
