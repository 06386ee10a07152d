//! Experiments: a paper's figure as a checked-in file (`def`), run as a sweep of `dtx bench`
//! runs by `dtx experiment run`, judged claim by claim (`verdict`), plotted (`svg`), and
//! gathered into one self-contained HTML page (`html`).
//!
//! The JSON an experiment run writes ([`ExperimentReport`]) is an interface contract:
//! `experiment`, `paper`, `figure`, `claims` (each `text`, `paper`, `measured`, `verdict`) and
//! `runs` (each exactly as `dtx bench --json` writes a run, its `protocol` the variant's full name
//! and its `params` holding the point's value under the swept flag's name and under
//! `experiment.point`, and the repeat under `experiment.repeat`) keep their names.

pub mod def;
pub mod html;
pub mod pins;
pub mod svg;
pub mod verdict;

pub use def::{Claim, ClaimKind, Experiment, Metric, Panel, Peak, PlotKind, PointValue};
pub use verdict::{count_verdicts, counts_text, evaluate, metric_value, ClaimResult, Observation, Verdict};

use crate::RunReport;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The `params` key of a run's point and of its repeat.
pub const POINT_KEY: &str = "experiment.point";
pub const REPEAT_KEY: &str = "experiment.repeat";

/// Where and how an experiment ran: what the report prints beside its figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Provenance {
    /// The command that reproduces it.
    pub command: String,
    /// The commit of the binary that ran it (`git describe` at build time).
    pub commit: String,
    /// When it ran (UTC, `YYYY-MM-DD HH:MM:SS`).
    pub date: String,
    /// The machine: cores and processor model.
    pub cores: u32,
    pub cpu_model: String,
    /// Wall seconds the whole experiment took.
    pub wall_s: f64,
}

/// The file `dtx experiment run` writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentReport {
    pub experiment: String,
    pub paper: String,
    pub figure: String,
    pub claims: Vec<ClaimResult>,
    pub runs: Vec<RunReport>,
    pub title: String,
    pub measures: String,
    pub notes: String,
    pub quick: bool,
    pub repeat: u32,
    /// The points visited, in order.
    pub points: Vec<Option<PointValue>>,
    /// Wall seconds of each run, in the order of `runs` (sim: virtual time runs faster or slower).
    pub run_wall_s: Vec<f64>,
    /// Runs that failed (crashed, or failed a check), each with why; non-empty means the
    /// experiment failed whatever its verdicts.
    #[serde(default)]
    pub failures: Vec<String>,
    pub provenance: Provenance,
    /// The experiment's definition as it was run, or, once [`ExperimentReport::rejudge`] has
    /// run, the current file's (whose claims are then judged on these runs).
    pub definition: Experiment,
    /// Set by [`ExperimentReport::rejudge`]: whose claims judge these runs, and what of the runs'
    /// setup changed since they were made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejudged: Option<String>,
}

impl ExperimentReport {
    /// Each run with its point and repeat, read back from its params.
    pub fn observations(&self) -> Vec<Observation<'_>> {
        self.runs
            .iter()
            .map(|r| Observation {
                point: r.params.get(POINT_KEY).filter(|v| !v.is_null()),
                repeat: r.params.get(REPEAT_KEY).and_then(|v| v.as_u64()).unwrap_or(0) as u32,
                run: r,
            })
            .collect()
    }

    /// Judges every claim again on the runs (the report does so rather than trust a file).
    pub fn evaluate(&self) -> Vec<ClaimResult> {
        evaluate(&self.definition, &self.points, &self.observations())
    }

    /// Takes `current`'s claims (the experiment file as it is now) to judge these stored runs,
    /// so that a change of the rules or of a band is seen without running again. The runs stay
    /// as they were made: when `current` would run something else (its flags, sweep, peak or
    /// protocols changed), `rejudged` says what, and the claims it judges are on the old runs.
    pub fn rejudge(&mut self, current: &Experiment) {
        let changed = runs_changed(&self.definition, current);
        let file = current.file.display().to_string();
        self.rejudged = Some(if changed.is_empty() {
            format!("claims judged by {file} as it is now, on runs made with the same setup")
        } else {
            format!(
                "claims judged by {file} as it is now, on runs made before its {} changed: not re-run",
                changed.join(", ")
            )
        });
        self.definition = current.clone();
        self.notes = current.notes.clone();
        self.claims = self.evaluate();
    }

    /// Virtual committed transactions per wall second over the sim runs, if any ran in sim.
    pub fn sim_txn_per_wall_s(&self) -> Option<f64> {
        let (mut txns, mut wall) = (0.0, 0.0);
        for (r, w) in self.runs.iter().zip(&self.run_wall_s) {
            if r.runtime == "sim" {
                txns += r.committed as f64;
                wall += w;
            }
        }
        (wall > 0.0).then(|| txns / wall)
    }

    pub fn read(path: &Path) -> anyhow::Result<ExperimentReport> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not an experiment's JSON", path.display()))
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut text = serde_json::to_string_pretty(self).context("serializing the experiment")?;
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}

/// The parts of `old` that decide its runs and differ in `new`, by the file's names for them.
fn runs_changed(old: &Experiment, new: &Experiment) -> Vec<&'static str> {
    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }
    let parts = [
        ("[bench]", json(&old.bench) == json(&new.bench)),
        ("[bench.protocol]", json(&old.bench_by_protocol) == json(&new.bench_by_protocol)),
        ("[quick]", json(&old.quick) == json(&new.quick)),
        ("[quick.protocol]", json(&old.quick_by_protocol) == json(&new.quick_by_protocol)),
        ("[sweep]", json(&old.sweep) == json(&new.sweep)),
        ("[peak]", json(&old.peak) == json(&new.peak)),
        ("protocols", old.protocols == new.protocols),
    ];
    parts.into_iter().filter(|(_, same)| !same).map(|(name, _)| name).collect()
}

/// The terminal table of an experiment's claims: measured beside the paper's value, a verdict each.
/// Notes and headline claims short of their band follow the table.
pub fn render_claims(experiment: &str, claims: &[ClaimResult]) -> String {
    let num = |v: Option<f64>| v.map(sig3).unwrap_or_else(|| "-".into());
    let rows: Vec<[String; 5]> = claims
        .iter()
        .map(|c| {
            let spread = match (c.min, c.max) {
                (Some(a), Some(b)) if a != b => format!("{} ({}..{})", num(c.measured), num(Some(a)), num(Some(b))),
                _ => num(c.measured),
            };
            [
                if c.headline { format!("{} (headline)", c.text) } else { c.text.clone() },
                num(c.paper),
                spread,
                format!("{}..{}", num(Some(c.band[0])), num(Some(c.band[1]))),
                c.verdict.text().to_string(),
            ]
        })
        .collect();
    let headers = ["claim", "paper", "measured", "reproduced if", "verdict"];
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            if i == 0 {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("  {c:>w$}"));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&headers.map(String::from));
    for r in &rows {
        out.push_str(&line(r));
    }
    for c in claims.iter().filter(|c| c.note.is_some()) {
        out.push_str(&format!("  {}: {}\n", c.text, c.note.as_deref().unwrap_or_default()));
    }
    for w in claims.iter().filter_map(|c| c.headline_warning(experiment)) {
        out.push_str(&format!("{w}\n"));
    }
    out
}

/// A value with three significant digits (`1.57`, `0.0312`, `14.0`, `231k`), for claims and axes.
pub fn sig3(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "∞".into() } else { "-∞".into() };
    }
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 1e4 {
        return crate::human::count(v);
    }
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests;
