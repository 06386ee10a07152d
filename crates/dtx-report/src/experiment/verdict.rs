//! Claims evaluated on an experiment's runs: the measured value beside the paper's, and a verdict.
//!
//! Every claim is computed per repeat (each repeat ran every protocol at every point close in
//! time, so a ratio within a repeat is a comparison within one run of the machine), and the
//! claim's measured value is the median over repeats, with the minimum and maximum beside it.
//!
//! Verdicts (docs/experiments.md, "Rules for a verdict", says why each rule is what it is):
//! - `reproduced`: the measured value lies in the claim's band (drawn around the paper's value);
//! - `same direction`: outside the band, on the paper's side of the baseline and short of the
//!   band: between the baseline and the band's near edge. The baseline is 1 for a ratio (of
//!   protocols, of two metrics of a run, or of `rising`/`falling`'s last point over its first)
//!   and the claim's `baseline` otherwise (none when it gives none). A value beyond the band's
//!   far edge overshoots: `not reproduced`, as is any value when the band holds the baseline
//!   inside it (a claim of "about equal" has no side to fall short on); a band that starts at
//!   the baseline (`[1, inf]`) lies on the side it extends to;
//! - two kinds have no baseline to be short of. A `crossing` found outside its band is `same
//!   direction` (the ratio does turn over, at another point); one never found is `not
//!   reproduced`. A `between` of two ratios between protocols whose band holds 1 (an agreement:
//!   sim's ratio against local's) is `same direction` when both ratios lie on the same side of 1
//!   (the two order the protocols alike) and their quotient is outside the band; a `between` of
//!   ratios whose band lies on one side of 1, or starts at 1 (one ratio above the other),
//!   follows the baseline rule with baseline 1;
//! - `not tested`: the claim names (`not_tested`) why the run cannot exercise its mechanism;
//! - `calibrated`: the claim names (`calibrated`) a cost fitted to the paper's number, so that
//!   matching it reproduces nothing.
//!
//! The last two keep the measured value, and their note says what the band alone would have said.

use super::def::{same_point, Claim, ClaimKind, Experiment, Metric, PointValue};
use crate::RunReport;
use serde::{Deserialize, Serialize};

/// One run of an experiment: which point, which repeat.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    pub point: Option<&'a PointValue>,
    pub repeat: u32,
    pub run: &'a RunReport,
}

impl Observation<'_> {
    /// Whether this is `protocol`'s run at `point` in `repeat`.
    pub fn is(&self, protocol: &str, point: Option<&PointValue>, repeat: u32) -> bool {
        self.repeat == repeat
            && self.run.protocol == protocol
            && match (self.point, point) {
                (Some(a), Some(b)) => same_point(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    #[serde(rename = "reproduced")]
    Reproduced,
    #[serde(rename = "same direction")]
    SameDirection,
    #[serde(rename = "not reproduced")]
    NotReproduced,
    #[serde(rename = "not tested")]
    NotTested,
    #[serde(rename = "calibrated")]
    Calibrated,
}

impl Verdict {
    /// Every verdict, in the order tables count them.
    pub const ALL: [Verdict; 5] =
        [Verdict::Reproduced, Verdict::SameDirection, Verdict::NotReproduced, Verdict::NotTested, Verdict::Calibrated];

    pub fn text(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::SameDirection => "same direction",
            Verdict::NotReproduced => "not reproduced",
            Verdict::NotTested => "not tested",
            Verdict::Calibrated => "calibrated",
        }
    }
}

/// How many of `claims` have each verdict, in [`Verdict::ALL`]'s order.
pub fn count_verdicts<'a>(claims: impl IntoIterator<Item = &'a ClaimResult>) -> [usize; 5] {
    let mut n = [0; 5];
    for c in claims {
        n[Verdict::ALL.iter().position(|v| *v == c.verdict).expect("every verdict is in ALL")] += 1;
    }
    n
}

/// `3 reproduced, 1 same direction, ...`: the counts of [`count_verdicts`], every verdict named.
pub fn counts_text(n: [usize; 5]) -> String {
    let parts: Vec<String> = Verdict::ALL.iter().zip(n).map(|(v, k)| format!("{k} {}", v.text())).collect();
    parts.join(", ")
}

/// A claim's outcome, as the experiment JSON carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResult {
    pub text: String,
    pub paper: Option<f64>,
    /// The median over repeats; null only when no repeat gave a value (a crossing that never
    /// happens, a ratio over zero), which `note` then explains.
    pub measured: Option<f64>,
    pub verdict: Verdict,
    pub kind: String,
    pub metric: String,
    #[serde(with = "super::def::band_serde")]
    pub band: [f64; 2],
    pub min: Option<f64>,
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The paper's main claim (the file's `headline = true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub headline: bool,
    /// What a value short of the band had to reach (`at least 0.76`, `at most 0.25`, `within
    /// [0.8, 1.25]`); None when the value reaches the band or lies beyond it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_of: Option<String>,
}

impl ClaimResult {
    /// For a headline claim short of its band, the sentence the run's summary and the page
    /// print: `headline short of its band: EXPERIMENT's TEXT 0.500 against the paper's at least
    /// 0.760`. A headline without a value is said too; one `not tested` is its verdict's to say.
    pub fn headline_warning(&self, experiment: &str) -> Option<String> {
        if !self.headline || self.verdict == Verdict::NotTested {
            return None;
        }
        match (self.measured, &self.short_of) {
            (None, _) => Some(format!("headline without a value: {experiment}'s {}", self.text)),
            (Some(m), Some(wanted)) => Some(format!(
                "headline short of its band: {experiment}'s {} {} against the paper's {wanted}",
                self.text,
                super::sig3(m)
            )),
            (Some(_), None) => None,
        }
    }
}

/// The metric's value in one run; None when the run does not report it.
pub fn metric_value(m: &Metric, r: &RunReport) -> Option<f64> {
    let per_txn = |n: f64| if r.committed > 0 { Some(n / r.committed as f64) } else { None };
    let v = match m {
        Metric::Throughput => Some(r.throughput_tps),
        Metric::AbortRate => Some(r.abort_rate),
        Metric::P50 => Some(r.latency_us.p50),
        Metric::P95 => Some(r.latency_us.p95),
        Metric::P99 => Some(r.latency_us.p99),
        Metric::MsgsPerTxn => Some(r.msgs_per_txn),
        Metric::BytesPerTxn => Some(r.bytes_per_txn),
        Metric::CpuUsPerTxn => r.cpu_us_per_txn,
        Metric::Extra(k) => r.extra.get(k).copied(),
        Metric::Counter(k) => per_txn(r.counters.get(k).copied().unwrap_or(0) as f64),
        Metric::Aborts(k) => {
            let attempts = r.committed + r.aborted;
            (attempts > 0).then(|| r.aborts_by_reason.get(k).copied().unwrap_or(0) as f64 / attempts as f64)
        }
        Metric::ClassLatency(c, q) => r.latency_us_by_class.get(c).map(|l| percentile(l, q)),
        Metric::RegionLatency(g, q) => match g.split_once('.') {
            // `REGION.CLASS`: the latency of one class from one region.
            Some((region, class)) => r.latency_us_by_region_class.get(region)?.get(class).map(|l| percentile(l, q)),
            None => r.latency_us_by_region.get(g).map(|l| percentile(l, q)),
        },
        Metric::Ratio(a, b) => {
            let (x, y) = (metric_value(a, r)?, metric_value(b, r)?);
            (y != 0.0).then(|| x / y)
        }
    };
    v.filter(|x| x.is_finite())
}

fn percentile(l: &crate::LatencyUs, q: &str) -> f64 {
    match q {
        "p50" => l.p50,
        "p95" => l.p95,
        "p99" => l.p99,
        _ => l.max,
    }
}

/// The median, minimum and maximum of the finite values, or None.
pub fn median_min_max(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some((median, v[0], v[n - 1]))
}

/// The series a claim reads in one repeat: per point, metric(of) or metric(of)/metric(over).
struct Series<'a> {
    obs: &'a [Observation<'a>],
    claim: &'a Claim,
    repeat: u32,
}

impl Series<'_> {
    fn metric_of(&self, metric: &Metric, protocol: &str, point: Option<&PointValue>) -> Option<f64> {
        self.obs.iter().find(|o| o.is(protocol, point, self.repeat)).and_then(|o| metric_value(metric, o.run))
    }

    fn at(&self, point: Option<&PointValue>) -> Option<f64> {
        let of = self.metric_of(&self.claim.metric, &self.claim.of, point)?;
        match &self.claim.over {
            None => Some(of),
            Some(over) => {
                let d = self.metric_of(self.claim.over_metric.as_ref().unwrap_or(&self.claim.metric), over, point)?;
                (d != 0.0).then_some(of / d)
            }
        }
    }
}

/// Where a piecewise-linear series first crosses 1, by interpolation between the points around it.
pub fn crossing_x(points: &[(f64, f64)]) -> Option<f64> {
    for w in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if (y0 - 1.0) == 0.0 {
            return Some(x0);
        }
        if (y0 - 1.0) * (y1 - 1.0) < 0.0 {
            return Some(x0 + (1.0 - y0) * (x1 - x0) / (y1 - y0));
        }
    }
    points.last().filter(|(_, y)| *y == 1.0).map(|(x, _)| *x)
}

/// Evaluates every claim of `exp` on the observations of a run at `points`.
pub fn evaluate(exp: &Experiment, points: &[Option<PointValue>], obs: &[Observation]) -> Vec<ClaimResult> {
    let repeats: Vec<u32> = {
        let mut r: Vec<u32> = obs.iter().map(|o| o.repeat).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    exp.claims.iter().map(|c| evaluate_claim(c, points, obs, &repeats)).collect()
}

fn evaluate_claim(c: &Claim, points: &[Option<PointValue>], obs: &[Observation], repeats: &[u32]) -> ClaimResult {
    let mut values = Vec::new();
    let mut sides = Vec::new(); // between: (value at a, value at b) per repeat
    for &repeat in repeats {
        let s = Series { obs, claim: c, repeat };
        let first = points.first().and_then(|p| p.as_ref());
        let last = points.last().and_then(|p| p.as_ref());
        let v = match c.kind {
            ClaimKind::Value => s.at(c.at.first()),
            ClaimKind::Rising | ClaimKind::Falling => match (s.at(first), s.at(last)) {
                (Some(a), Some(b)) if a != 0.0 => Some(b / a),
                _ => None,
            },
            ClaimKind::Crossing => {
                let series: Vec<(f64, f64)> = points
                    .iter()
                    .filter_map(|p| p.as_ref())
                    .filter_map(|p| Some((p.as_f64()?, s.at(Some(p))?)))
                    .collect();
                crossing_x(&series)
            }
            ClaimKind::Between => match (s.at(c.at.first()), s.at(c.at.get(1))) {
                (Some(a), Some(b)) if b != 0.0 => {
                    sides.push((a, b));
                    Some(a / b)
                }
                _ => None,
            },
        };
        values.extend(v);
    }
    let stats = median_min_max(&values);
    let measured = stats.map(|s| s.0);
    let (verdict, note) = match measured {
        None => (
            Verdict::NotReproduced,
            Some(match c.kind {
                ClaimKind::Crossing => "the ratio does not cross 1 in the swept range".to_string(),
                _ => "no value: a run is missing or a denominator is 0".to_string(),
            }),
        ),
        Some(m) => judge(c, m, &sides),
    };
    let (verdict, note) = exempt(c, verdict, note);
    ClaimResult {
        text: c.text.clone(),
        paper: c.paper,
        measured,
        verdict,
        kind: format!("{:?}", c.kind).to_lowercase(),
        metric: match (&c.over, &c.over_metric) {
            (Some(o), Some(m)) => format!("{} {} / {} {o}", c.metric.key(), c.of, m.key()),
            (Some(o), None) => format!("{} {} / {o}", c.metric.key(), c.of),
            (None, _) => format!("{} {}", c.metric.key(), c.of),
        },
        band: c.band,
        min: stats.map(|s| s.1),
        max: stats.map(|s| s.2),
        note,
        headline: c.headline,
        short_of: measured.and_then(|m| short_of(c, m)),
    }
}

/// Where a claim's band lies from its baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    /// The band lies above the baseline, or starts at it (`[1, inf]`: "a beats b"): values
    /// between the two fall short, values below the baseline are the other side.
    Above,
    Below,
    /// The band holds the baseline inside it, or there is none: nothing is short of it.
    Around,
}

/// The value the claim's side is read from: 1 for a trend and for a ratio (`between` included),
/// the file's `baseline` for a protocol's own value.
fn baseline_of(c: &Claim) -> Option<f64> {
    match c.kind {
        ClaimKind::Rising | ClaimKind::Falling => Some(1.0),
        ClaimKind::Between => c.baseline.or(Some(1.0)),
        ClaimKind::Value => c.baseline,
        ClaimKind::Crossing => None,
    }
}

fn side_of(c: &Claim) -> Side {
    match baseline_of(c) {
        Some(b) if c.band[0] >= b && c.band[1] > b => Side::Above,
        Some(b) if c.band[1] <= b && c.band[0] < b => Side::Below,
        _ => Side::Around,
    }
}

/// The verdict of a measured value `m` by the band alone, and a note when it needs one.
fn judge(c: &Claim, m: f64, sides: &[(f64, f64)]) -> (Verdict, Option<String>) {
    let [low, high] = c.band;
    if low <= m && m <= high {
        return (Verdict::Reproduced, None);
    }
    if c.kind == ClaimKind::Crossing {
        return (Verdict::SameDirection, Some("the ratio crosses 1 outside the band".into()));
    }
    let agreement = c.kind == ClaimKind::Between && c.over.is_some() && side_of(c) == Side::Around;
    if agreement {
        return (agreement_verdict(sides), None);
    }
    let b = baseline_of(c).unwrap_or(f64::NAN);
    let overshoot = Some("beyond the band's far edge: an overshoot is not the paper's value".to_string());
    match side_of(c) {
        Side::Above if m > high => (Verdict::NotReproduced, overshoot),
        Side::Above if m > b => (Verdict::SameDirection, None),
        Side::Below if m < low => (Verdict::NotReproduced, overshoot),
        Side::Below if m < b => (Verdict::SameDirection, None),
        _ => (Verdict::NotReproduced, None),
    }
}

/// An agreement between two ratios (a `between` of ratios whose band holds 1): the same
/// direction when both ratios, as medians over repeats, lie on the same side of 1.
fn agreement_verdict(sides: &[(f64, f64)]) -> Verdict {
    let a: Vec<f64> = sides.iter().map(|s| s.0).collect();
    let b: Vec<f64> = sides.iter().map(|s| s.1).collect();
    match (median_min_max(&a), median_min_max(&b)) {
        (Some(a), Some(b)) if (a.0 - 1.0) * (b.0 - 1.0) > 0.0 => Verdict::SameDirection,
        _ => Verdict::NotReproduced,
    }
}

/// A `not tested` or `calibrated` claim keeps its measured value, and its note says why and
/// what the band alone would have said, so that neither word hides a miss.
fn exempt(c: &Claim, by_band: Verdict, note: Option<String>) -> (Verdict, Option<String>) {
    let (verdict, why) = match (&c.not_tested, &c.calibrated) {
        (Some(why), _) => (Verdict::NotTested, why),
        (None, Some(why)) => (Verdict::Calibrated, why),
        (None, None) => return (by_band, note),
    };
    let mut text = format!("{}: {why}; the band alone says {}", verdict.text(), by_band.text());
    if let Some(n) = note {
        text.push_str(&format!(" ({n})"));
    }
    (verdict, Some(text))
}

/// What a value short of the claim's band had to reach, in words; None when it reaches the
/// band or lies beyond its far edge.
fn short_of(c: &Claim, m: f64) -> Option<String> {
    let [low, high] = c.band;
    let sig = super::sig3;
    match side_of(c) {
        _ if low <= m && m <= high => None,
        Side::Above => (m < low).then(|| format!("at least {}", sig(low))),
        Side::Below => (m > high).then(|| format!("at most {}", sig(high))),
        // A one-sided band ("at least 1") is short on its bounded side only.
        Side::Around if high == f64::INFINITY => (m < low).then(|| format!("at least {}", sig(low))),
        Side::Around if low == f64::NEG_INFINITY => (m > high).then(|| format!("at most {}", sig(high))),
        Side::Around => Some(format!("within [{}, {}]", sig(low), sig(high))),
    }
}
