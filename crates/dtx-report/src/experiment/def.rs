//! The experiment file: a paper's figure as data (`experiments/NAME.toml`), read at run time.
//!
//! ```toml
//! name = "contention-sweep"                # the file's stem
//! title = "Throughput as contention rises"
//! paper = "dtx"                            # a paper, or "dtx" for the project's own figures
//! figure = "README, contention"            # the figure or table it reproduces
//! measures = "committed/s and aborts of the three protocols, YCSB theta 0 to 0.99"
//! protocols = ["2pl-nowait", "2pl-waitdie", "occ"]   # protocols or variants (`occ:k=v`)
//! takes = { full_s = 60, quick_s = 5 }     # wall time, measured on the reference machine
//! notes = "why the measured value differs from the paper's"
//! [bench]                                  # `dtx bench` flags without the dashes
//! workload = "ycsb"                        # (a latency-matrix path is relative to this file)
//! [bench.protocol.occ]                     # optional: one protocol's flags, over [bench]
//! inflight = 64
//! [quick]                                  # what --quick changes ([quick.protocol.NAME] too)
//! duration = "0.3"
//! [sweep]                                  # optional: one parameter and its values
//! param = "theta"                          # or option = "lock_wait_us", protocols = [...]:
//! values = [0.0, 0.9, 0.99]                #   each point runs NAME:lock_wait_us=VALUE
//! quick = [0.0, 0.99]                      # optional: the values --quick runs
//! [peak]                                   # optional: each run at its peak throughput
//! param = "inflight"                       # the load raised: inflight (clients) or rate
//! values = [250, 500, 1000, 2000]          # loads tried in order until throughput stops growing
//! quick = [250, 1000]                      # optional: the loads --quick tries
//! latency_at = 0.5                         # optional: latency from an open loop at this share of the peak
//! [plot]
//! panels = ["throughput", "throughput/occ"] # metrics, or a metric as a ratio to a protocol
//! [[claim]]
//! text = "2PL WAIT_DIE beats OCC under high contention"
//! kind = "value"                           # value | rising | falling | crossing | between
//! metric = "throughput"                    # or latency.class.new-order.p50, counter.a / counter.b
//! of = "2pl-waitdie"
//! over = "occ"                             # optional: the denominator
//! over_metric = "throughput"               # optional: what is read of `over` (default: metric)
//! at = 0.99                                # the point (ratio), or two points (between)
//! paper = 1.27                             # the paper's value, if it gives one
//! band = [1.1, 1.5]                        # what counts as reproduced: from the paper's value
//! headline = true                          # optional: the paper's main claim; the summary says
//!                                          #   so when it falls short of its band
//! # not_tested = "why the run cannot exercise the mechanism"   (at most one of these two)
//! # calibrated = "which cost was fitted to which of the paper's numbers"
//! ```

use anyhow::{anyhow, bail, Context as _};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The value of the swept parameter at one point: a number (`0.9`) or a word (`sim`).
pub type PointValue = serde_json::Value;

/// An experiment, parsed and checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Experiment {
    /// The file it was read from (empty when parsed from text).
    #[serde(skip)]
    pub file: std::path::PathBuf,
    pub name: String,
    pub title: String,
    pub paper: String,
    pub figure: String,
    pub measures: String,
    pub notes: String,
    pub protocols: Vec<String>,
    pub takes_full_s: f64,
    pub takes_quick_s: f64,
    /// `dtx bench` flags (without `--`) and their values, as text.
    pub bench: BTreeMap<String, String>,
    /// What `--quick` changes.
    pub quick: BTreeMap<String, String>,
    /// Flags for one protocol's runs (`[bench.protocol.NAME]`), over `bench`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bench_by_protocol: BTreeMap<String, BTreeMap<String, String>>,
    /// What `--quick` changes for one protocol (`[quick.protocol.NAME]`), over `quick`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quick_by_protocol: BTreeMap<String, BTreeMap<String, String>>,
    pub sweep: Option<Sweep>,
    /// Each run measured at its peak: the load raised until throughput stops growing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<Peak>,
    pub plot: PlotSpec,
    pub claims: Vec<Claim>,
}

/// `[peak]`: every run (each protocol at each point and repeat) climbs `values` of the load
/// `param` in order and stops once a step adds less than [`Peak::MIN_GROWTH`] to the best
/// throughput so far; the best run is the one reported, with the load that reached it
/// (`extra.peak_load`). So protocols are compared at their own peaks, as the Detock thesis
/// ("clients increased until peak") and Hackwrench compare them, not at one load that
/// saturates one protocol and idles another.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Peak {
    /// `inflight` (closed-loop clients per worker) or `rate` (open-loop arrivals per second
    /// per client node).
    pub param: String,
    pub values: Vec<f64>,
    pub quick: Vec<f64>,
    /// When given, the run's latency comes from one more run, open loop (`--rate`) at this
    /// share of the protocol's own peak throughput: so latencies compare protocols at the same
    /// relative load, and queueing behind a saturated closed loop does not weigh in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_at: Option<f64>,
}

impl Peak {
    /// A step that adds less than this share to the best throughput so far ends the climb.
    pub const MIN_GROWTH: f64 = 0.05;

    /// The loads a run climbs.
    pub fn loads(&self, quick: bool) -> &[f64] {
        if quick {
            &self.quick
        } else {
            &self.values
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sweep {
    /// A `dtx bench` flag, without `--`; or, when `option`, a protocol option's name.
    pub param: String,
    pub values: Vec<PointValue>,
    pub quick: Vec<PointValue>,
    /// `param` is a protocol option (`option = "lock_wait_us"`): each point runs the variant
    /// `NAME:param=VALUE` of every protocol in `protocols`.
    #[serde(default)]
    pub option: bool,
    /// The protocols whose option is swept (an option sweep; default: every protocol); the
    /// others run the same at every point.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    /// Protocols whose option of the same meaning has another name (`[sweep.option_of]`, e.g.
    /// `primo = "wm_us"` beside `"primo:commit=epoch" = "epoch_us"` in a sweep of the group
    /// commit interval); `param` is then the axis's name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub option_of: BTreeMap<String, String>,
}

impl Sweep {
    /// Whether this sweep sets `protocol`'s option (an option sweep over it).
    pub fn sweeps_option_of(&self, protocol: &str) -> bool {
        self.option && self.protocols.iter().any(|p| p == protocol)
    }

    /// The name of the option this sweep sets on `protocol`.
    pub fn option_name_of<'a>(&'a self, protocol: &str) -> &'a str {
        self.option_of.get(protocol).map_or(self.param.as_str(), |o| o.as_str())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlotSpec {
    pub kind: PlotKind,
    pub panels: Vec<Panel>,
    pub log_x: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlotKind {
    /// Each panel's metric against the swept parameter (or per protocol without a sweep).
    Sweep,
    /// Committed transactions per 100 ms over the run, per protocol (the first point's runs).
    Timeline,
}

/// One plot panel: a metric, or a metric as a ratio to one protocol's at the same point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Panel {
    pub metric: Metric,
    pub over: Option<String>,
}

/// What a claim or a panel reads from a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Metric {
    Throughput,
    AbortRate,
    P50,
    P95,
    P99,
    MsgsPerTxn,
    BytesPerTxn,
    CpuUsPerTxn,
    /// An entry of the run's `extra` (for example `failover_ms_p50`).
    Extra(String),
    /// A protocol counter per committed transaction.
    Counter(String),
    /// The share of attempts aborted for this reason.
    Aborts(String),
    /// A latency percentile (`p50`, `p95`, `p99`, `max`; µs) of one class of transaction
    /// (`latency.class.new-order.p50`).
    ClassLatency(String, String),
    /// A latency percentile of the clients in one region (`latency.region.1.p99`), or of one
    /// class of their transactions (`latency.region.1.multi-home.p50`: the name `1.multi-home`).
    RegionLatency(String, String),
    /// One metric of a run over another of the same run (`counter.a / counter.b`).
    Ratio(Box<Metric>, Box<Metric>),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimKind {
    /// The value (or ratio) at one point.
    Value,
    /// The value (or ratio) at the last point over that at the first, expected above 1.
    Rising,
    /// The same, expected below 1.
    Falling,
    /// The swept value at which the ratio crosses 1.
    Crossing,
    /// The value (or ratio) at one point over that at another: `wal` against `none`, or a
    /// ratio between protocols in `sim` against the same in `local`.
    Between,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claim {
    pub text: String,
    pub kind: ClaimKind,
    pub metric: Metric,
    pub of: String,
    pub over: Option<String>,
    /// What is read of `over`, when not `metric` (a replay rate over an execution rate).
    pub over_metric: Option<Metric>,
    pub at: Vec<PointValue>,
    pub paper: Option<f64>,
    #[serde(with = "band_serde")]
    pub band: [f64; 2],
    /// Which side of this value counts as the same direction (ratios: 1).
    pub baseline: Option<f64>,
    /// The paper's main claim: a value short of its band is said so in the run's summary and
    /// on the page, whatever the verdict's word.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub headline: bool,
    /// Why the run cannot exercise the claim's mechanism: the verdict is `not tested`, whatever
    /// the measured value (which is still printed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_tested: Option<String>,
    /// Which cost was fitted to which of the paper's numbers: a value measured under it matches
    /// the paper by construction, so the verdict is `calibrated`, not `reproduced`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<String>,
}

impl Metric {
    pub fn parse(s: &str) -> anyhow::Result<Metric> {
        match s.split_once('/') {
            Some((a, b)) => {
                let side = |x: &str| {
                    Metric::parse_one(x).with_context(|| format!("`{}`: a ratio is METRIC / METRIC", s.trim()))
                };
                Ok(Metric::Ratio(Box::new(side(a)?), Box::new(side(b)?)))
            }
            None => Metric::parse_one(s),
        }
    }

    fn parse_one(s: &str) -> anyhow::Result<Metric> {
        let t = s.trim();
        if let Some(rest) = t.strip_prefix("latency.") {
            let split = rest.split_once('.').and_then(|(by, r)| Some((by, r.rsplit_once('.')?)));
            return match split {
                Some((by, (name, q)))
                    if !name.is_empty() && ["p50", "p95", "p99", "max"].contains(&q) && by == "class" =>
                {
                    Ok(Metric::ClassLatency(name.into(), q.into()))
                }
                Some((by, (name, q)))
                    if !name.is_empty() && ["p50", "p95", "p99", "max"].contains(&q) && by == "region" =>
                {
                    Ok(Metric::RegionLatency(name.into(), q.into()))
                }
                _ => bail!(
                    "unknown metric `{t}` (use latency.class.CLASS.Q, latency.region.REGION.Q or \
                     latency.region.REGION.CLASS.Q, Q one of p50, p95, p99, max)"
                ),
            };
        }
        Ok(match t {
            "throughput" => Metric::Throughput,
            "abort_rate" => Metric::AbortRate,
            "p50" => Metric::P50,
            "p95" => Metric::P95,
            "p99" => Metric::P99,
            "msgs_per_txn" => Metric::MsgsPerTxn,
            "bytes_per_txn" => Metric::BytesPerTxn,
            "cpu_us_per_txn" => Metric::CpuUsPerTxn,
            _ => match t.split_once('.') {
                Some(("extra", k)) if !k.is_empty() => Metric::Extra(k.into()),
                Some(("counter", k)) if !k.is_empty() => Metric::Counter(k.into()),
                Some(("aborts", k)) if !k.is_empty() => Metric::Aborts(k.into()),
                _ => bail!(
                    "unknown metric `{t}` (use throughput, abort_rate, p50, p95, p99, msgs_per_txn, \
                     bytes_per_txn, cpu_us_per_txn, extra.KEY, counter.NAME, aborts.REASON, \
                     latency.class.CLASS.p50, latency.region.REGION.p99, or METRIC / METRIC)"
                ),
            },
        })
    }

    /// How the metric is named in tables and axes.
    pub fn label(&self) -> String {
        match self {
            Metric::Throughput => "committed/s".into(),
            Metric::AbortRate => "abort rate".into(),
            Metric::P50 => "p50 latency (µs)".into(),
            Metric::P95 => "p95 latency (µs)".into(),
            Metric::P99 => "p99 latency (µs)".into(),
            Metric::MsgsPerTxn => "messages per txn".into(),
            Metric::BytesPerTxn => "bytes per txn".into(),
            Metric::CpuUsPerTxn => "CPU µs per txn".into(),
            Metric::Extra(k) => k.clone(),
            Metric::Counter(k) => format!("{k} per txn"),
            Metric::Aborts(k) => format!("{k} aborts (share of attempts)"),
            Metric::ClassLatency(c, q) => format!("{q} latency of {c} (µs)"),
            Metric::RegionLatency(r, q) => match r.split_once('.') {
                Some((region, class)) => format!("{q} latency of {class} in region {region} (µs)"),
                None => format!("{q} latency in region {r} (µs)"),
            },
            Metric::Ratio(a, b) => format!("{} / {}", a.key(), b.key()),
        }
    }

    /// The metric as an experiment file writes it.
    pub fn key(&self) -> String {
        String::from(self.clone())
    }
}

impl TryFrom<String> for Metric {
    type Error = anyhow::Error;
    fn try_from(s: String) -> anyhow::Result<Metric> {
        Metric::parse(&s)
    }
}

impl From<Metric> for String {
    fn from(m: Metric) -> String {
        match m {
            Metric::Throughput => "throughput".into(),
            Metric::AbortRate => "abort_rate".into(),
            Metric::P50 => "p50".into(),
            Metric::P95 => "p95".into(),
            Metric::P99 => "p99".into(),
            Metric::MsgsPerTxn => "msgs_per_txn".into(),
            Metric::BytesPerTxn => "bytes_per_txn".into(),
            Metric::CpuUsPerTxn => "cpu_us_per_txn".into(),
            Metric::Extra(k) => format!("extra.{k}"),
            Metric::Counter(k) => format!("counter.{k}"),
            Metric::Aborts(k) => format!("aborts.{k}"),
            Metric::ClassLatency(c, q) => format!("latency.class.{c}.{q}"),
            Metric::RegionLatency(r, q) => format!("latency.region.{r}.{q}"),
            Metric::Ratio(a, b) => format!("{} / {}", a.key(), b.key()),
        }
    }
}

/// Two point values are the same point: numbers by value (`1` and `1.0`), words by text.
pub fn same_point(a: &PointValue, b: &PointValue) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0),
        _ => a == b,
    }
}

/// A point value as a `dtx bench` flag value: `0.9`, `sim`.
pub fn point_text(v: &PointValue) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: String,
    title: String,
    paper: String,
    figure: String,
    measures: String,
    #[serde(default)]
    notes: String,
    protocols: Vec<String>,
    takes: RawTakes,
    bench: toml::Table,
    #[serde(default)]
    quick: toml::Table,
    sweep: Option<RawSweep>,
    peak: Option<RawPeak>,
    #[serde(default)]
    plot: RawPlot,
    #[serde(default, rename = "claim")]
    claims: Vec<RawClaim>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTakes {
    full_s: f64,
    quick_s: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    param: Option<String>,
    option: Option<String>,
    protocols: Option<Vec<String>>,
    option_of: Option<BTreeMap<String, String>>,
    values: Vec<toml::Value>,
    quick: Option<Vec<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeak {
    param: String,
    values: Vec<f64>,
    quick: Option<Vec<f64>>,
    latency_at: Option<f64>,
}

impl RawPeak {
    fn check(self) -> anyhow::Result<Peak> {
        if !["inflight", "rate"].contains(&self.param.as_str()) {
            bail!("[peak] param `{}`: give inflight (clients) or rate (open-loop arrivals)", self.param);
        }
        let quick = self.quick.unwrap_or_else(|| self.values.clone());
        for (name, loads) in [("values", &self.values), ("quick", &quick)] {
            if loads.len() < 2 {
                bail!("[peak] {name}: give at least two loads to climb");
            }
            if !loads.iter().all(|v| v.is_finite() && *v > 0.0) || !loads.windows(2).all(|w| w[0] < w[1]) {
                bail!("[peak] {name}: loads are positive and rising, {loads:?} is not");
            }
        }
        if let Some(f) = self.latency_at.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
            bail!("[peak] latency_at {f}: give a share of the peak, above 0 and at most 1");
        }
        Ok(Peak { param: self.param, values: self.values, quick, latency_at: self.latency_at })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPlot {
    kind: Option<String>,
    #[serde(default)]
    panels: Vec<String>,
    #[serde(default)]
    log_x: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClaim {
    text: String,
    kind: String,
    metric: String,
    of: String,
    over: Option<String>,
    over_metric: Option<String>,
    at: Option<toml::Value>,
    paper: Option<f64>,
    band: [f64; 2],
    baseline: Option<f64>,
    #[serde(default)]
    headline: bool,
    not_tested: Option<String>,
    calibrated: Option<String>,
}

/// A TOML scalar as the text of a flag value; tables and arrays are refused.
fn flag_text(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        _ => bail!("`{key}`: give a string, a number or a boolean"),
    })
}

fn point_value(v: &toml::Value) -> anyhow::Result<PointValue> {
    Ok(match v {
        toml::Value::String(s) => PointValue::String(s.clone()),
        toml::Value::Integer(i) => PointValue::from(*i),
        toml::Value::Float(f) if f.is_finite() => PointValue::from(*f),
        other => bail!("a point is a number or a word, not `{other}`"),
    })
}

fn flags(table: &toml::Table, section: &str) -> anyhow::Result<BTreeMap<String, String>> {
    table.iter().map(|(k, v)| Ok((k.clone(), flag_text(k, v).with_context(|| format!("[{section}]"))?))).collect()
}

/// Takes `[SECTION.protocol.NAME]` tables out of a section: each protocol's own flags.
fn per_protocol(table: &mut toml::Table, section: &str) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    if !matches!(table.get("protocol"), Some(toml::Value::Table(_))) {
        return Ok(BTreeMap::new());
    }
    let Some(toml::Value::Table(by)) = table.remove("protocol") else { unreachable!("matched above") };
    by.iter()
        .map(|(name, v)| match v {
            toml::Value::Table(t) => Ok((name.clone(), flags(t, &format!("{section}.protocol.\"{name}\""))?)),
            _ => bail!(
                "[{section}.protocol] {name}: give the protocol's flags as a table, [{section}.protocol.\"{name}\"]"
            ),
        })
        .collect()
}

impl Experiment {
    /// Reads and checks one experiment file; an error names the file and the field.
    pub fn load(path: &Path) -> anyhow::Result<Experiment> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut e = Experiment::parse(&text).with_context(|| format!("{}", path.display()))?;
        e.file = path.to_path_buf();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if e.name != stem {
            bail!(
                "{}: name = \"{}\" but the file is {stem}.toml: name an experiment as its file",
                path.display(),
                e.name
            );
        }
        Ok(e)
    }

    /// Parses and checks an experiment's text.
    pub fn parse(text: &str) -> anyhow::Result<Experiment> {
        let mut raw: RawExperiment = toml::from_str(text).map_err(|e| anyhow!("{}", e.to_string().trim_end()))?;
        let bench_by_protocol = per_protocol(&mut raw.bench, "bench")?;
        let quick_by_protocol = per_protocol(&mut raw.quick, "quick")?;
        let sweep = raw.sweep.map(|s| -> anyhow::Result<Sweep> {
            let values =
                s.values.iter().map(point_value).collect::<anyhow::Result<Vec<_>>>().context("[sweep] values")?;
            let quick = match &s.quick {
                Some(q) => q.iter().map(point_value).collect::<anyhow::Result<Vec<_>>>().context("[sweep] quick")?,
                None => values.clone(),
            };
            if values.is_empty() || quick.is_empty() {
                bail!("[sweep]: values (and quick, if given) need at least one value");
            }
            if let Some(q) = quick.iter().find(|q| !values.iter().any(|v| same_point(v, q))) {
                bail!("[sweep] quick: {q} is not among the values");
            }
            let (param, option) = match (s.param, s.option) {
                (Some(p), None) => (p, false),
                (None, Some(o)) => (o, true),
                _ => bail!("[sweep]: give param (a bench flag) or option (a protocol option), one of them"),
            };
            let option_of = s.option_of.unwrap_or_default();
            if !option && !option_of.is_empty() {
                bail!("[sweep.option_of]: only an option sweep names its protocols' options");
            }
            let protocols = match s.protocols {
                Some(_) if !option => bail!("[sweep] protocols: only an option sweep names its protocols"),
                Some(p) if p.is_empty() => bail!("[sweep] protocols: name at least one protocol"),
                Some(p) => p,
                None if !option_of.is_empty() => option_of.keys().cloned().collect(),
                None if option => raw.protocols.clone(),
                None => Vec::new(),
            };
            if let Some(p) = option_of.keys().find(|p| !protocols.contains(p)) {
                bail!("[sweep.option_of] {p}: not among the protocols the sweep sets");
            }
            Ok(Sweep { param, values, quick, option, protocols, option_of })
        });
        let sweep = sweep.transpose()?;
        let peak = raw.peak.map(RawPeak::check).transpose()?;
        let plot = parse_plot(raw.plot, &raw.protocols)?;
        let e = Experiment {
            file: Default::default(),
            name: raw.name,
            title: raw.title,
            paper: raw.paper,
            figure: raw.figure,
            measures: raw.measures,
            notes: raw.notes,
            takes_full_s: raw.takes.full_s,
            takes_quick_s: raw.takes.quick_s,
            bench: flags(&raw.bench, "bench")?,
            quick: flags(&raw.quick, "quick")?,
            bench_by_protocol,
            quick_by_protocol,
            claims: raw
                .claims
                .into_iter()
                .enumerate()
                .map(|(i, c)| parse_claim(c).with_context(|| format!("[[claim]] {}", i + 1)))
                .collect::<anyhow::Result<_>>()?,
            protocols: raw.protocols,
            sweep,
            peak,
            plot,
        };
        e.check()?;
        Ok(e)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            bail!("name: `{}` must be letters, digits and dashes", self.name);
        }
        if self.protocols.is_empty() {
            bail!("protocols: name at least one protocol or variant");
        }
        for key in ["protocol", "json", "plot", "out", "history", "json-stdout", "json_stdout"] {
            if self.bench.contains_key(key) || self.quick.contains_key(key) {
                bail!("[bench] {key}: an experiment sets this itself (protocols = [...] names the runs)");
            }
        }
        if let Some(p) = &self.peak {
            let sets_it = |flags: &BTreeMap<String, String>| flags.contains_key(&p.param);
            if sets_it(&self.bench) || sets_it(&self.quick) || self.bench_by_protocol.values().any(sets_it) {
                bail!("[peak] {}: the climb sets it on every run; leave it out of [bench] and [quick]", p.param);
            }
            if self.sweep.as_ref().is_some_and(|s| !s.option && s.param == p.param) {
                bail!("[peak] {}: the sweep sets it at each point; climb another load", p.param);
            }
        }
        let by_protocol = [("bench", &self.bench_by_protocol), ("quick", &self.quick_by_protocol)];
        for (section, by) in by_protocol {
            for (p, flags) in by {
                let here = format!("[{section}.protocol.\"{p}\"]");
                if !self.protocols.contains(p) {
                    bail!("{here}: `{p}` is not among protocols = {:?}", self.protocols);
                }
                for key in ["protocol", "json", "plot", "out", "history", "json-stdout", "json_stdout"] {
                    if flags.contains_key(key) {
                        bail!("{here} {key}: an experiment sets this itself");
                    }
                }
                if let Some(s) = self.sweep.as_ref().filter(|s| !s.option) {
                    if flags.keys().any(|k| k.replace('_', "-") == s.param.replace('_', "-")) {
                        bail!("{here} {}: the sweep sets it at each point", s.param);
                    }
                }
            }
        }
        if let Some(s) = &self.sweep {
            if s.param == "protocol" {
                bail!("[sweep] param: sweep a bench flag; list protocols and variants in protocols = [...]");
            }
            if s.option {
                if s.param.is_empty() || s.param.contains([':', '=', ' ']) {
                    bail!("[sweep] option: `{}` is not an option's name", s.param);
                }
                for p in &s.protocols {
                    if !self.protocols.contains(p) {
                        bail!("[sweep] protocols: `{p}` is not among protocols = {:?}", self.protocols);
                    }
                    let name = s.option_name_of(p);
                    let sets = p.split(':').skip(1).any(|kv| kv.split('=').next().map(str::trim) == Some(name));
                    if sets {
                        bail!("[sweep] option: `{p}` sets {name} itself, which the sweep sets at each point");
                    }
                }
            }
        }
        for (i, c) in self.claims.iter().enumerate() {
            self.check_claim(c).with_context(|| format!("[[claim]] {} ({})", i + 1, c.text))?;
        }
        Ok(())
    }

    fn check_claim(&self, c: &Claim) -> anyhow::Result<()> {
        for p in std::iter::once(&c.of).chain(c.over.iter()) {
            if !self.protocols.contains(p) {
                bail!("`{p}` is not among protocols = {:?}", self.protocols);
            }
        }
        if c.band[0].is_nan() || c.band[1].is_nan() || c.band[0] > c.band[1] {
            bail!("band: [{}, {}] is empty: give [low, high]", c.band[0], c.band[1]);
        }
        // A band is drawn around the paper's value (docs/experiments.md, "Rules for a verdict"): one that
        // leaves it out was drawn around something else, such as the project's own parameter.
        if let Some(p) = c.paper.filter(|p| !(c.band[0] <= *p && *p <= c.band[1])) {
            bail!(
                "band: [{}, {}] leaves out the paper's {p}: draw the band around the paper's value",
                c.band[0],
                c.band[1]
            );
        }
        let values = self.sweep.as_ref().map(|s| (&s.values, &s.quick));
        let needs_at = match c.kind {
            ClaimKind::Value => usize::from(values.is_some()),
            ClaimKind::Between => 2,
            ClaimKind::Rising | ClaimKind::Falling | ClaimKind::Crossing => 0,
        };
        if c.at.len() != needs_at {
            bail!(
                "at: a {:?} claim needs {needs_at} point(s){}",
                c.kind,
                if values.is_some() { "" } else { " (no sweep)" }
            );
        }
        if matches!(c.kind, ClaimKind::Rising | ClaimKind::Falling | ClaimKind::Crossing | ClaimKind::Between) {
            match values {
                Some((v, q)) if v.len() >= 2 && q.len() >= 2 => {}
                _ => bail!("kind: a {:?} claim needs a sweep of at least two values (also in quick)", c.kind),
            }
        }
        if c.kind == ClaimKind::Crossing {
            let numeric = values.is_some_and(|(v, _)| v.iter().all(|x| x.as_f64().is_some()));
            if !numeric || c.over.is_none() {
                bail!("kind: a crossing claim needs a numeric sweep and `over` (where of/over crosses 1)");
            }
        }
        if let Some((v, q)) = values {
            for a in &c.at {
                if !v.iter().any(|x| same_point(x, a)) || !q.iter().any(|x| same_point(x, a)) {
                    bail!("at: {a} is not among the sweep's values (and its quick values)");
                }
            }
        }
        Ok(())
    }

    /// The variant `protocol` runs at `point`: itself, or with the swept option set
    /// (`2pl-waitdie:lock_wait_us=50`).
    pub fn variant_at(&self, protocol: &str, point: Option<&PointValue>) -> String {
        match (&self.sweep, point) {
            (Some(s), Some(v)) if s.sweeps_option_of(protocol) => {
                format!("{protocol}:{}={}", s.option_name_of(protocol), point_text(v))
            }
            _ => protocol.to_string(),
        }
    }

    /// The bench flags of `protocol`'s runs from the file: `[bench]` with
    /// `[bench.protocol.NAME]` over it, and with `quick`, `[quick]` and `[quick.protocol.NAME]`
    /// over those; keys as the file writes them.
    pub fn flags_of(&self, protocol: &str, quick: bool) -> Vec<(String, String)> {
        let none = BTreeMap::new();
        let mut layers = vec![&self.bench, self.bench_by_protocol.get(protocol).unwrap_or(&none)];
        if quick {
            layers.extend([&self.quick, self.quick_by_protocol.get(protocol).unwrap_or(&none)]);
        }
        let mut out: Vec<(String, String)> = Vec::new();
        for (k, v) in layers.into_iter().flatten() {
            let norm = k.replace('_', "-");
            out.retain(|(f, _)| f.replace('_', "-") != norm);
            out.push((k.clone(), v.clone()));
        }
        out
    }

    /// Every run of the experiment is simulated (`runtime = "sim"` for each protocol, full and
    /// quick, and the runtime is not swept): its figures count virtual time from a seed, the
    /// same on any machine, so its quick verdicts can be pinned (`pins`).
    pub fn runs_only_in_sim(&self) -> bool {
        let sweeps_runtime = self.sweep.as_ref().is_some_and(|s| !s.option && s.param == "runtime");
        let in_sim = |protocol: &str, quick: bool| {
            self.flags_of(protocol, quick).iter().any(|(k, v)| k == "runtime" && v == "sim")
        };
        !sweeps_runtime && self.protocols.iter().all(|p| in_sim(p, false) && in_sim(p, true))
    }

    /// The points a run visits: the sweep's values (or its quick ones), or one point.
    pub fn points(&self, quick: bool) -> Vec<Option<PointValue>> {
        match &self.sweep {
            Some(s) => (if quick { &s.quick } else { &s.values }).iter().cloned().map(Some).collect(),
            None => vec![None],
        }
    }
}

fn parse_claim(c: RawClaim) -> anyhow::Result<Claim> {
    let kind = match c.kind.as_str() {
        "value" => ClaimKind::Value,
        "rising" => ClaimKind::Rising,
        "falling" => ClaimKind::Falling,
        "crossing" => ClaimKind::Crossing,
        "between" => ClaimKind::Between,
        other => bail!("kind: unknown `{other}` (use value, rising, falling, crossing or between)"),
    };
    let at = match &c.at {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a.iter().map(point_value).collect::<anyhow::Result<_>>().context("at")?,
        Some(v) => vec![point_value(v).context("at")?],
    };
    let metric = Metric::parse(&c.metric).context("metric")?;
    // A ratio, of two protocols or of two metrics of one run, is read against 1.
    let ratio = c.over.is_some() || matches!(metric, Metric::Ratio(..));
    let baseline = c.baseline.or(ratio.then_some(1.0));
    if c.over_metric.is_some() && c.over.is_none() {
        bail!("over_metric: it is what is read of `over`; give `over` too");
    }
    let over_metric = c.over_metric.as_deref().map(Metric::parse).transpose().context("over_metric")?;
    check_exemption(&c)?;
    Ok(Claim {
        text: c.text,
        kind,
        metric,
        of: c.of,
        over: c.over,
        over_metric,
        at,
        paper: c.paper,
        band: c.band,
        baseline,
        headline: c.headline,
        not_tested: c.not_tested,
        calibrated: c.calibrated,
    })
}

/// A claim is `not tested` or `calibrated`, never both (a run that cannot exercise a mechanism
/// has nothing to fit), and says why in words; a headline claim gives the paper's value.
fn check_exemption(c: &RawClaim) -> anyhow::Result<()> {
    if c.not_tested.is_some() && c.calibrated.is_some() {
        bail!(
            "not_tested and calibrated: give one (not_tested when the run cannot exercise the mechanism, \
             calibrated when a cost was fitted to the paper's number)"
        );
    }
    // A headline is said short of its band "against the paper's" value: it needs one.
    if c.headline && c.paper.is_none() {
        bail!("headline: a headline claim gives the paper's value (`paper`), which its band is drawn around");
    }
    for (field, why) in [("not_tested", &c.not_tested), ("calibrated", &c.calibrated)] {
        if why.as_deref().is_some_and(|w| w.trim().is_empty()) {
            bail!("{field}: say why in words");
        }
    }
    Ok(())
}

fn parse_plot(p: RawPlot, protocols: &[String]) -> anyhow::Result<PlotSpec> {
    let kind = match p.kind.as_deref() {
        None | Some("sweep") => PlotKind::Sweep,
        Some("timeline") => PlotKind::Timeline,
        Some(other) => bail!("[plot] kind: unknown `{other}` (use sweep or timeline)"),
    };
    let names = if p.panels.is_empty() { vec!["throughput".to_string(), "abort_rate".to_string()] } else { p.panels };
    let panels = names
        .iter()
        .map(|n| -> anyhow::Result<Panel> {
            // `metric/protocol` is a ratio to that protocol; `a / b` of two metrics is a metric.
            let (m, over) = match n.rsplit_once('/') {
                Some((m, o)) if protocols.iter().any(|p| p == o.trim()) || Metric::parse_one(o).is_err() => {
                    (m, Some(o.trim().to_string()))
                }
                _ => (n.as_str(), None),
            };
            if let Some(o) = &over {
                if !protocols.contains(o) {
                    bail!("[plot] panels: `{n}`: `{o}` is not among protocols = {protocols:?}");
                }
            }
            Ok(Panel { metric: Metric::parse(m).with_context(|| format!("[plot] panels: `{n}`"))?, over })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(PlotSpec { kind, panels, log_x: p.log_x })
}

/// A band in JSON: its bounds as numbers, or `"inf"` and `"-inf"` (JSON has no infinity).
pub mod band_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(serde::Serialize, Deserialize)]
    #[serde(untagged)]
    enum Bound {
        Number(f64),
        Word(String),
    }

    fn to_bound(v: f64) -> Bound {
        if v.is_finite() {
            Bound::Number(v)
        } else if v > 0.0 {
            Bound::Word("inf".into())
        } else {
            Bound::Word("-inf".into())
        }
    }

    pub fn serialize<S: Serializer>(band: &[f64; 2], s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&[to_bound(band[0]), to_bound(band[1])], s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[f64; 2], D::Error> {
        let [a, b] = <[Bound; 2]>::deserialize(d)?;
        let value = |x: Bound| match x {
            Bound::Number(v) => Ok(v),
            Bound::Word(w) if w == "inf" => Ok(f64::INFINITY),
            Bound::Word(w) if w == "-inf" => Ok(f64::NEG_INFINITY),
            Bound::Word(w) => {
                Err(serde::de::Error::custom(format!("a band's bound is a number, inf or -inf, not `{w}`")))
            }
        };
        Ok([value(a)?, value(b)?])
    }
}
