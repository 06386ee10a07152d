//! Claims evaluated on an experiment's runs: the measured value beside the paper's, and a verdict.
//!
//! Every claim is computed per repeat (each repeat ran every protocol at every point close in
//! time, so a ratio within a repeat is a comparison within one run of the machine), and the
//! claim's measured value is the median over repeats, with the minimum and maximum beside it.
//!
//! Verdicts: `reproduced` when the measured value lies in the claim's band; `same direction`
//! when it does not but lies on the same side as the paper's value (of 1 for a ratio, of the
//! claim's `baseline` otherwise): for `rising`/`falling`, the change has the right sign; for a
//! crossing, the ratio crosses 1 but elsewhere; for `between` two points of a ratio between
//! protocols, both ratios lie on the same side of 1 (of a protocol's own metric, as for a
//! ratio); `not reproduced` otherwise.

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
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::SameDirection => "same direction",
            Verdict::NotReproduced => "not reproduced",
        }
    }
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
    let in_band = |m: f64| c.band[0] <= m && m <= c.band[1];
    let reference = c.paper.unwrap_or((c.band[0] + c.band[1]) / 2.0);
    let mut note = None;
    let verdict = match measured {
        None => {
            note = Some(match c.kind {
                ClaimKind::Crossing => "the ratio does not cross 1 in the swept range".to_string(),
                _ => "no value: a run is missing or a denominator is 0".to_string(),
            });
            Verdict::NotReproduced
        }
        Some(m) if in_band(m) => Verdict::Reproduced,
        Some(m) => {
            let same = match c.kind {
                ClaimKind::Value => c.baseline.is_some_and(|b| (m - b) * (reference - b) > 0.0),
                ClaimKind::Rising => m > 1.0,
                ClaimKind::Falling => m < 1.0,
                ClaimKind::Crossing => true,
                ClaimKind::Between if c.over.is_none() => {
                    c.baseline.or(Some(1.0)).is_some_and(|b| (m - b) * (reference - b) > 0.0)
                }
                ClaimKind::Between => {
                    let a: Vec<f64> = sides.iter().map(|s| s.0).collect();
                    let b: Vec<f64> = sides.iter().map(|s| s.1).collect();
                    match (median_min_max(&a), median_min_max(&b)) {
                        (Some(a), Some(b)) => (a.0 - 1.0) * (b.0 - 1.0) > 0.0,
                        _ => false,
                    }
                }
            };
            if same {
                Verdict::SameDirection
            } else {
                Verdict::NotReproduced
            }
        }
    };
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
    }
}
