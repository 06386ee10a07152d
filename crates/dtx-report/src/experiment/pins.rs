//! `experiments/pins.toml`: the verdict each claim of a simulated experiment reached in its
//! `--quick` run, so that a change which flips one is seen (`dtx experiment pins --check`, a
//! step of `.ci/run`) and explained in its commit, and then recorded (`--update`).
//!
//! A simulated run counts virtual time from a seed, so its quick run measures the same figures
//! on any machine and in any order: a pinned verdict moves only when the code or the file
//! does. Runs on real threads (`local`, `tcp`) are not pinned: their figures follow the machine.
//!
//! ```toml
//! [message-counts]
//! "OCC, writes on the remote node: 6 messages" = { verdict = "reproduced", measured = 6.0 }
//! ```
//!
//! `measured` is what the recording run measured, said beside a flipped verdict; only the
//! verdict is compared, so a figure that moves inside its band fails nothing.

use super::{ClaimResult, Experiment, ExperimentReport, Verdict};
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The pins file's name in the experiments folder.
pub const PINS_FILE: &str = "pins.toml";

/// One claim's pinned verdict and the value measured when it was recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<f64>,
}

/// Experiment name → claim text → its pin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pins {
    pub experiments: BTreeMap<String, BTreeMap<String, Pin>>,
}

/// A claim whose quick verdict is no longer its pinned one.
#[derive(Debug, Clone, PartialEq)]
pub struct Flip {
    pub experiment: String,
    pub claim: String,
    pub pinned: Pin,
    pub verdict: Verdict,
    pub measured: Option<f64>,
}

impl fmt::Display for Flip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = |m: Option<f64>| m.map(super::sig3).unwrap_or_else(|| "no value".into());
        write!(
            f,
            "{}: \"{}\" is {} at {}, pinned {} at {}",
            self.experiment,
            self.claim,
            self.verdict.text(),
            value(self.measured),
            self.pinned.verdict.text(),
            value(self.pinned.measured)
        )
    }
}

impl Pins {
    pub fn parse(text: &str) -> anyhow::Result<Pins> {
        let experiments: BTreeMap<String, BTreeMap<String, Pin>> = toml::from_str(text)?;
        Ok(Pins { experiments })
    }

    /// The pins in `path`; none when the file does not exist yet.
    pub fn load(path: &Path) -> anyhow::Result<Pins> {
        match std::fs::read_to_string(path) {
            Ok(text) => Pins::parse(&text).with_context(|| path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Pins::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The file's text: a header saying what it is, then a table per experiment, a line per
    /// claim in the experiment's order (`order`: the claims' texts as the file gives them).
    pub fn to_toml(&self, order: &BTreeMap<String, Vec<String>>) -> String {
        let mut s = String::from(
            "# The verdict of each claim of each simulated experiment in its --quick run (docs/experiments.md,\n\
             # \"Pinned verdicts\"). `dtx experiment pins --check` runs them again and fails naming a claim\n\
             # whose verdict flipped; a commit that flips one says why, and records it with\n\
             # `dtx experiment pins --update NAME`. Written by that command: edit the experiment files, not this.\n",
        );
        for (name, claims) in &self.experiments {
            s.push_str(&format!("\n[{}]\n", toml_key(name)));
            let empty = Vec::new();
            let texts = order.get(name).unwrap_or(&empty);
            let mut keys: Vec<&String> = texts.iter().filter(|t| claims.contains_key(*t)).collect();
            keys.extend(claims.keys().filter(|k| !texts.contains(k)));
            for text in keys {
                let pin = &claims[text];
                let measured = match pin.measured.filter(|m| m.is_finite()) {
                    Some(m) => format!(", measured = {m:?}"),
                    None => String::new(),
                };
                s.push_str(&format!("{} = {{ verdict = \"{}\"{measured} }}\n", toml_key(text), pin.verdict.text()));
            }
        }
        s
    }

    /// Replaces `report`'s experiment's pins by its claims' verdicts.
    pub fn record(&mut self, report: &ExperimentReport) {
        let claims = report
            .claims
            .iter()
            .map(|c| (c.text.clone(), Pin { verdict: c.verdict, measured: c.measured.filter(|m| m.is_finite()) }))
            .collect();
        self.experiments.insert(report.experiment.clone(), claims);
    }

    /// Every claim of `report` whose verdict differs from its pin (a claim without a pin is a
    /// file problem, [`Pins::problems`]'s to say).
    pub fn flips(&self, report: &ExperimentReport) -> Vec<Flip> {
        let Some(pinned) = self.experiments.get(&report.experiment) else {
            return Vec::new();
        };
        report
            .claims
            .iter()
            .filter_map(|c: &ClaimResult| {
                let pin = pinned.get(&c.text)?;
                (pin.verdict != c.verdict).then(|| Flip {
                    experiment: report.experiment.clone(),
                    claim: c.text.clone(),
                    pinned: pin.clone(),
                    verdict: c.verdict,
                    measured: c.measured,
                })
            })
            .collect()
    }

    /// What in the pins does not match the experiment files: an experiment that does not exist
    /// or does not run in sim, a claim it does not have, a claim of a pinned experiment without
    /// a pin. Empty when the pins can be checked as they are.
    pub fn problems(&self, experiments: &[Experiment]) -> Vec<String> {
        let mut out = Vec::new();
        for (name, pinned) in &self.experiments {
            let Some(e) = experiments.iter().find(|e| e.name == *name) else {
                out.push(format!("{name}: no such experiment"));
                continue;
            };
            if !e.runs_only_in_sim() {
                out.push(format!("{name}: its runs are not all in sim, so its verdicts follow the machine"));
            }
            for text in pinned.keys().filter(|t| !e.claims.iter().any(|c| c.text == **t)) {
                out.push(format!("{name}: no claim \"{text}\" (renamed? record it again with --update)"));
            }
            for c in e.claims.iter().filter(|c| !pinned.contains_key(&c.text)) {
                out.push(format!("{name}: claim \"{}\" has no pin (record it with --update)", c.text));
            }
        }
        out
    }

    /// The simulated experiments that have no pins yet.
    pub fn unpinned<'a>(&self, experiments: &'a [Experiment]) -> Vec<&'a str> {
        experiments
            .iter()
            .filter(|e| e.runs_only_in_sim() && !self.experiments.contains_key(&e.name))
            .map(|e| e.name.as_str())
            .collect()
    }
}

/// A TOML key: bare when it can be, else a quoted string.
fn toml_key(s: &str) -> String {
    let bare = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        s.to_string()
    } else {
        toml::Value::String(s.to_string()).to_string()
    }
}
