//! The one-way delay model shared by all runtimes, and the fault plan the simulator follows.

use super::NodeId;
use anyhow::{bail, Context};
use rand::Rng;

/// One-way delay between nodes: a base delay, uniform jitter, and optionally a region matrix.
/// In `sim` this is the link latency; in `local` and `tcp` it is injected on top of the real one.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LatencyModel {
    /// One-way delay between any two distinct nodes, microseconds.
    pub delay_us: u64,
    /// Uniform jitter added to each message, 0..=jitter_us microseconds; with a region matrix,
    /// to each message between regions only (the WAN's jitter, as the Detock thesis adds it).
    pub jitter_us: u64,
    /// Region of each node (index = node id); empty = everyone in region 0.
    pub node_region: Vec<u16>,
    /// One-way delay between regions, microseconds; when present it replaces `delay_us` across regions.
    pub region_delay_us: Vec<Vec<u64>>,
    /// Each host's link out, megabits per second (`--bandwidth`; 0: unlimited). Simulator
    /// only: a packet leaving a host waits for the packets it sent before to be on the wire,
    /// then takes its own bytes' time, before its one-way delay starts (the real runtimes have
    /// the machine's links).
    #[serde(default)]
    pub egress_mbps: u64,
}

impl LatencyModel {
    pub fn is_zero(&self) -> bool {
        self.delay_us == 0 && self.jitter_us == 0 && self.region_delay_us.is_empty()
    }

    fn region(&self, n: NodeId) -> u16 {
        self.node_region.get(n as usize).copied().unwrap_or(0)
    }

    /// How long `bytes` of payload take to leave a host over its link, ns (0 when unlimited).
    /// Headers are not counted: a packet here is a batch of messages to one destination,
    /// which the real runtimes send as one write on one connection.
    pub fn transmit_ns(&self, bytes: usize) -> u64 {
        match self.egress_mbps {
            0 => 0,
            // bits / (Mbit/s) = µs; ×1000 for ns.
            mbps => (bytes as u64 * 8 * 1000).div_ceil(mbps),
        }
    }

    /// Read a link rate (`--bandwidth`): `16gbps`, `800mbps` (megabits), or `0` for unlimited.
    pub fn parse_bandwidth_mbps(text: &str) -> anyhow::Result<u64> {
        let t = text.trim().to_ascii_lowercase();
        if t == "0" {
            return Ok(0);
        }
        let (number, per_unit) = match (t.strip_suffix("gbps"), t.strip_suffix("mbps")) {
            (Some(n), _) => (n, 1000.0),
            (_, Some(n)) => (n, 1.0),
            _ => bail!("`{text}` is not a link rate: give it with its unit, e.g. 16gbps or 800mbps (0: unlimited)"),
        };
        let value: f64 = number.trim().parse().with_context(|| format!("`{text}`: `{number}` is not a number"))?;
        let mbps = (value * per_unit).round();
        if !(1.0..=10_000_000.0).contains(&mbps) {
            bail!("`{text}` is outside 1mbps to 10000gbps (0: unlimited)");
        }
        Ok(mbps as u64)
    }

    /// Sample the one-way delay for one message from `src` to `dst`, in nanoseconds.
    pub fn sample_ns(&self, src: NodeId, dst: NodeId, rng: &mut impl Rng) -> u64 {
        if src == dst {
            return 0;
        }
        let (rs, rd) = (self.region(src) as usize, self.region(dst) as usize);
        let base_us = match self.region_delay_us.get(rs).and_then(|row| row.get(rd)) {
            Some(&d) if rs != rd => d,
            // Same region: the matrix diagonal, or the flat delay if that is larger.
            Some(&d) => d.max(self.delay_us),
            None => self.delay_us,
        };
        let across_wan = rs != rd || self.region_delay_us.is_empty();
        let jitter = if self.jitter_us > 0 && across_wan { rng.gen_range(0..=self.jitter_us * 1000) } else { 0 };
        base_us * 1000 + jitter
    }

    /// Read a region matrix file: one line per region, whitespace-separated one-way delays in µs
    /// (or with a unit: `50ms`, `100us`); `#` starts a comment. The matrix must be square.
    pub fn load_matrix(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u64>>> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read latency matrix {}", path.display()))?;
        let mut rows = vec![];
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let row = line
                .split_whitespace()
                .map(crate::util::parse_duration_us)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{}:{}: bad delay", path.display(), i + 1))?;
            rows.push(row);
        }
        if rows.is_empty() {
            bail!("{}: latency matrix is empty", path.display());
        }
        let n = rows.len();
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != n) {
            bail!(
                "{}: latency matrix must be square: {} regions but row {} has {} entries",
                path.display(),
                n,
                i + 1,
                r.len()
            );
        }
        Ok(rows)
    }

    /// Make every pair of regions' paths asymmetric while keeping its round trip: the lower
    /// region of a pair reaches the higher one in `share` of the round trip, the way back takes
    /// the rest (0.5 leaves the matrix as it is). The Detock thesis sweeps this share from 50%
    /// to 90% (Fig. 4.9) to show that an estimate of one-way delays, not of round trips,
    /// places pieces in time.
    pub fn make_asymmetric(matrix: &mut [Vec<u64>], share: f64) -> anyhow::Result<()> {
        if !(0.5..1.0).contains(&share) {
            bail!("--asymmetry {share}: give the share of a round trip taken by the way out, from 0.5 (symmetric) to below 1");
        }
        let regions = matrix.len();
        for (i, j) in (0..regions).flat_map(|i| (i + 1..regions).map(move |j| (i, j))) {
            let round_trip_us = (matrix[i][j] + matrix[j][i]) as f64;
            matrix[i][j] = (round_trip_us * share).round() as u64;
            matrix[j][i] = (round_trip_us * (1.0 - share)).round() as u64;
        }
        Ok(())
    }
}

/// Faults the simulator injects, all decided by the seed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct FaultPlan {
    /// Probability that any one packet is lost.
    pub loss: f64,
    /// Cut links between a random pair of node groups now and then (duration and period in µs).
    pub partitions: bool,
    /// Stop a random node now and then and bring it back later.
    pub crashes: bool,
    /// `--runtime tcp` only: stop a random server's process now and then (SIGSTOP) and let it
    /// go on later (SIGCONT); it loses nothing.
    #[serde(default)]
    pub pauses: bool,
    /// Mean time between fault events, and how long a fault lasts, microseconds.
    pub fault_interval_us: u64,
    pub fault_duration_us: u64,
    /// Faults at given times on given nodes (`--fault-at`), besides the random ones.
    #[serde(default)]
    pub targeted: Vec<TargetedFault>,
}

impl FaultPlan {
    pub fn any(&self) -> bool {
        self.loss > 0.0 || self.partitions || self.crashes || self.pauses || !self.targeted.is_empty()
    }

    /// Whether some node may crash in the run: random crashes, or a targeted one.
    pub fn may_crash(&self) -> bool {
        self.crashes || self.targeted.iter().any(|f| f.kind == TargetedKind::Crash)
    }
}

/// What a targeted fault does to its node.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetedKind {
    /// The node crashes (with a log, losing its memory: it restarts from its log); on `tcp` its
    /// server is killed with `kill -9` and started again over its data folder.
    Crash,
    /// The node stops and goes on later, losing nothing (`tcp`: SIGSTOP, then SIGCONT; `sim`:
    /// it runs nothing, and what reaches it waits in its inbox).
    Pause,
    /// Every message the node sends is held this much longer; with `worker`, only what that
    /// worker sends. A protocol sends each of its streams (sequenced batches) from a worker of
    /// its own, so a worker names a kind of message exactly (a packet batches every message from
    /// one worker to another, so kinds within a worker are not told apart); with `control`, only
    /// its control messages (group commit's watermarks and epochs, sent apart from the rest
    /// in packets of their own).
    Delay {
        by_us: u64,
        worker: Option<u16>,
        #[serde(default)]
        control: bool,
    },
    /// `sim` only: the CPU the node's workers are charged is multiplied by this factor.
    Cpu { factor: f64 },
    /// The node is cut off from every other node (both ways; its own workers still talk to each
    /// other): `sim` drops what crosses the cut, `tcp` firewalls its server off. Nothing crashes.
    Partition,
    /// `sim` only: the node's logs refuse every record appended while it lasts, as a log refuses
    /// a record it cannot take (one over its size limit), and take records again after it.
    LogFail,
}

impl TargetedKind {
    /// The name `--fault-at` gives the kind, and the fault events report.
    pub fn name(&self) -> &'static str {
        match self {
            TargetedKind::Crash => "crash",
            TargetedKind::Pause => "pause",
            TargetedKind::Delay { .. } => "delay",
            TargetedKind::Cpu { .. } => "cpu",
            TargetedKind::Partition => "partition",
            TargetedKind::LogFail => "logfail",
        }
    }
}

/// Which host a targeted fault hits. A role (`role=sequencer`) is a node's, known when the
/// run is specified: the CLI turns it into [`FaultTarget::Node`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTarget {
    /// Node N (on `tcp`, server N; with failover, host N whatever nodes it serves).
    Node(NodeId),
    /// The host that leads node N's replicated log (log 0, `--durability replicated`) when the
    /// fault starts; the fault ends on that same host.
    LeaderOf(NodeId),
}

impl FaultTarget {
    /// The node it names: the host itself, or the node whose log's leader it is.
    pub fn node(&self) -> NodeId {
        match *self {
            FaultTarget::Node(n) | FaultTarget::LeaderOf(n) => n,
        }
    }
}

impl std::fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultTarget::Node(n) => write!(f, "node {n}"),
            FaultTarget::LeaderOf(n) => write!(f, "the leader of node {n}'s log"),
        }
    }
}

/// A fault at a given time on a given target (`--fault-at 'crash:node=1@2s+500ms'`,
/// `crash:leader=0@1s`), parsed once by the CLI (`cli::bench_args`) and carried in the run's
/// spec to the simulator and the `tcp` nemesis.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TargetedFault {
    pub kind: TargetedKind,
    pub target: FaultTarget,
    /// When it starts, µs from the run's start (warm-up included).
    pub at_us: u64,
    /// How long it lasts; `None`: until the measured window ends (then it is healed, so that
    /// the run's final read and checks find every node up).
    pub for_us: Option<u64>,
}

impl TargetedFault {
    /// When it ends, µs from the run's start, given when the measured window ends.
    pub fn end_us(&self, window_end_us: u64) -> u64 {
        match self.for_us {
            Some(d) => self.at_us + d,
            None => window_end_us.max(self.at_us),
        }
    }

    /// Whether it is in force at `t_us` (µs from the run's start).
    pub fn active_at(&self, t_us: u64, window_end_us: u64) -> bool {
        t_us >= self.at_us && t_us < self.end_us(window_end_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The shipped region matrices (Detock's Table 4.1, one way = RTT / 2) load, are symmetric
    /// with a zero diagonal, and hold the thesis's figures (use1-euw1 67 ms RTT, apne1-apse1 71).
    #[test]
    fn the_shipped_region_matrices_hold_the_thesis_delays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/matrices");
        let eight = LatencyModel::load_matrix(&dir.join("detock-8-regions.txt")).unwrap();
        let four = LatencyModel::load_matrix(&dir.join("detock-4-regions.txt")).unwrap();
        for m in [&eight, &four] {
            for (i, row) in m.iter().enumerate() {
                assert_eq!(row[i], 0);
                assert!(row.iter().enumerate().all(|(j, d)| *d == m[j][i]), "row {i} is not symmetric");
            }
        }
        // use1 use2 euw1 euw2 apne1 apne2 apse1 apse2
        assert_eq!((eight[0][2], eight[4][6], eight[0][1]), (33_500, 35_500, 6_000));
        // use1 euw1 apne1 apse1
        assert_eq!((four[0][1], four[2][3], four[1][3]), (33_500, 35_500, 91_500));
    }

    #[test]
    fn a_link_rate_reads_with_its_unit_and_times_a_packet() {
        assert_eq!(LatencyModel::parse_bandwidth_mbps("16gbps").unwrap(), 16_000);
        assert_eq!(LatencyModel::parse_bandwidth_mbps("2.5Gbps").unwrap(), 2_500);
        assert_eq!(LatencyModel::parse_bandwidth_mbps("800mbps").unwrap(), 800);
        assert_eq!(LatencyModel::parse_bandwidth_mbps("0").unwrap(), 0);
        for bad in ["16", "fast", "gbps", "0mbps", "-1gbps"] {
            let e = LatencyModel::parse_bandwidth_mbps(bad).unwrap_err();
            assert!(format!("{e:#}").contains(bad), "{bad}: {e:#}");
        }
        let link = LatencyModel { egress_mbps: 16_000, ..Default::default() };
        // 2,000 bytes are 16,000 bits: 1 µs at 16 Gbit/s.
        assert_eq!(link.transmit_ns(2_000), 1_000);
        assert_eq!(LatencyModel::default().transmit_ns(1 << 20), 0, "unlimited");
    }

    #[test]
    fn flat_delay_and_jitter() {
        let m = LatencyModel { delay_us: 100, jitter_us: 10, ..Default::default() };
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
        for _ in 0..100 {
            let d = m.sample_ns(0, 1, &mut rng);
            assert!((100_000..=110_000).contains(&d));
        }
        assert_eq!(m.sample_ns(1, 1, &mut rng), 0);
    }

    #[test]
    fn asymmetry_keeps_each_round_trip() {
        let mut m = vec![vec![0, 50_000, 10_000], vec![50_000, 0, 30_000], vec![10_000, 30_000, 0]];
        LatencyModel::make_asymmetric(&mut m, 0.8).unwrap();
        assert_eq!(m, vec![vec![0, 80_000, 16_000], vec![20_000, 0, 48_000], vec![4_000, 12_000, 0]]);
        let mut same = m.clone();
        LatencyModel::make_asymmetric(&mut same, 0.5).unwrap();
        assert_eq!(same[0][1], 50_000);
        assert!(LatencyModel::make_asymmetric(&mut same, 1.0).is_err());
        assert!(LatencyModel::make_asymmetric(&mut same, 0.3).is_err());
    }

    #[test]
    fn region_matrix() {
        let m = LatencyModel {
            node_region: vec![0, 1],
            region_delay_us: vec![vec![0, 50_000], vec![50_000, 0]],
            ..Default::default()
        };
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
        assert_eq!(m.sample_ns(0, 1, &mut rng), 50_000_000);
    }

    #[test]
    fn with_a_region_matrix_jitter_is_the_wan_s() {
        let m = LatencyModel {
            delay_us: 100,
            jitter_us: 1_000,
            node_region: vec![0, 0, 1],
            region_delay_us: vec![vec![0, 50_000], vec![50_000, 0]],
            ..Default::default()
        };
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
        let across: Vec<u64> = (0..100).map(|_| m.sample_ns(0, 2, &mut rng)).collect();
        assert!(across.iter().all(|d| (50_000_000..=51_000_000).contains(d)));
        assert!(across.iter().any(|d| *d > 50_000_000), "jitter between regions");
        assert!((0..100).all(|_| m.sample_ns(0, 1, &mut rng) == 100_000), "none within a region");
    }
}
