//! The flags of `dtx bench`, and how they become the spec of each protocol's run. They live in
//! the library, not the binary, so that an experiment (`dtx experiment`) builds its runs from the
//! same flags, parsed and checked by the same code, as a user typing `dtx bench`.

use crate::cluster::{Role, Roles};
use crate::host::{BenchSpec, Runtime};
use crate::net::{FaultPlan, FaultTarget, LatencyModel, NodeId, TargetedFault, TargetedKind};
use crate::protocols::{ProtoOptions, Variant};
use crate::replication::DurabilityConfig;
use crate::rt::{CpuCost, RpcConfig};
use crate::util::parse_duration_us;
use crate::workloads::WorkloadParams;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Protocols to compare: a comma-separated list of `NAME[:KEY=VALUE]...` (a protocol, or a
    /// variant with options set: `occ,2pl-waitdie:lock_wait_us=200`), or `all`. Each is a run.
    #[arg(long, default_value = "all")]
    protocol: ProtocolList,
    /// ycsb | append | tpcc | bank
    #[arg(long, default_value = "ycsb")]
    workload: String,
    /// TPC-C: warehouses in total, spread over the nodes' partitions.
    #[arg(long, default_value_t = 1)]
    warehouses: u32,
    /// TPC-C: `standard` (45/43/4/4/4), `neworder-payment` (50/50), or NO,P,OS,D,SL percentages.
    #[arg(long, default_value = "standard")]
    mix: String,
    /// TPC-C: fraction of New-Orders with a remote supply warehouse.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    neworder_remote: f64,
    /// TPC-C: fraction of Payments for a customer of a remote warehouse.
    #[arg(long, default_value_t = 0.15, allow_negative_numbers = true)]
    payment_remote: f64,
    /// TPC-C: keep ITEM in one partition instead of a copy in every partition.
    #[arg(long)]
    no_item_replication: bool,
    /// TPC-C: where a remote warehouse lies: `any` other warehouse (the spec), or in another
    /// `region` than the home warehouse (a remote transaction is then multi-home, as in the
    /// Detock thesis's TPC-C).
    #[arg(long, default_value = "any")]
    remote_scope: String,
    /// TPC-C: fraction of Payments and Order-Statuses that find their customer by last name
    /// (the spec's 0.6; 0: by id only, as the Detock thesis runs it).
    #[arg(long, default_value_t = 0.6, allow_negative_numbers = true)]
    by_last_name: f64,
    /// Bank: accounts in total (default 1000 per partition).
    #[arg(long, default_value_t = 0)]
    accounts: u64,
    /// Bank: fraction of transactions that are read-only audits of the total.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    audit_ratio: f64,
    /// sim | local | tcp
    #[arg(long, default_value = "local")]
    runtime: Runtime,
    #[arg(long, default_value_t = 2)]
    nodes: u16,
    /// Worker threads per node. Default: the machine's cores shared among the nodes (at least
    /// one each) with --runtime local or tcp; 1 in sim, so that a seed replays the same anywhere.
    #[arg(long)]
    workers: Option<u16>,
    /// Transactions in flight per worker (closed-loop clients). Default 64; for TPC-C, the
    /// specification's 10 terminals per warehouse (clause 4.2.2) of the worker's warehouses.
    /// With --rate, the most that run at once per worker.
    #[arg(long)]
    inflight: Option<u32>,
    /// Open-loop clients: this many transactions arrive per second at each client node
    /// (Poisson arrivals, split over its client workers), and each one's latency runs from its
    /// arrival, time spent waiting for a free client included. Default: closed loop. A run that
    /// cannot keep up says so and reports its backlog.
    #[arg(long)]
    rate: Option<f64>,
    /// Commits per worker that may wait for the disk (or the replicas) while their clients go
    /// on to the next transaction, as Silo's workers go on while their epoch is persisted; each
    /// is acknowledged (counted, its latency taken) once durable. 0: every client waits for its
    /// own commit's flush.
    #[arg(long, default_value_t = crate::host::DEFAULT_MAX_UNACKED)]
    max_unacked: u32,
    /// Measured seconds (or a duration: 500ms, 2s).
    #[arg(long, default_value = "3")]
    duration: String,
    /// Warm-up seconds before measuring.
    #[arg(long, default_value = "0.5")]
    warmup: String,
    /// Injected one-way delay between nodes (e.g. 100us, 50ms).
    #[arg(long, default_value = "0")]
    delay: String,
    /// Uniform jitter added to each message (with --latency-matrix, to each message between
    /// regions only).
    #[arg(long, default_value = "0")]
    jitter: String,
    /// Each host's outgoing link in the simulator, e.g. 16gbps or 800mbps (0: unlimited): a
    /// packet waits for those its host sent before to be on the wire and takes its bytes'
    /// time. The real runtimes have the machine's links.
    #[arg(long, default_value = "0")]
    bandwidth: String,
    /// Skew between the nodes' wall clocks (e.g. 1ms): node n of N runs n/(N-1) of it ahead
    /// of node 0. Only protocols that order transactions by wall-clock time feel it (mvcc).
    #[arg(long, default_value = "0")]
    clock_skew: String,
    /// Drift between the nodes' wall clocks, in millionths (ppm): node n of N runs n/(N-1) of
    /// it faster than node 0, from the run's start (e.g. 200: the last node gains 200 µs a
    /// second). Only protocols that read wall-clock time feel it (mvcc, detock).
    #[arg(long, default_value_t = 0)]
    clock_drift: u64,
    /// Region latency matrix file (one row per region, one-way delays).
    #[arg(long)]
    latency_matrix: Option<PathBuf>,
    /// With --latency-matrix: the share of each region pair's round trip taken by the way
    /// from the lower-numbered region to the higher (0.5: as the matrix says; 0.9: 90% out,
    /// 10% back).
    #[arg(long, default_value_t = 0.5)]
    asymmetry: f64,
    /// Region of each node, comma-separated: where --placement per-region puts copies and a
    /// replicated log's voters are chosen; with --latency-matrix, the delays between nodes
    /// (default there: round-robin over its regions).
    #[arg(long)]
    regions: Option<String>,
    /// Each node's roles, comma-separated by node, `+` within a node (roles: data, client,
    /// sequencer, scheduler, orderer, replicator, timestamp-server, storage). Default: every
    /// node `data+client`. Partitions go to data nodes; clients run on client nodes.
    #[arg(long)]
    roles: Option<String>,
    /// Where partitions' copies live: single (one copy), per-region (a full copy in every
    /// region, given by --regions; its home region leads) or groups=N (groups of N data nodes
    /// hold the same partitions). The protocol must keep the copies; those that keep one copy
    /// refuse the others. Default: per-region for a protocol that keeps a copy per region
    /// when the run has more than one region (--regions or --latency-matrix), else single.
    #[arg(long)]
    placement: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Faults to inject in sim: any of crash,partition,loss. With --runtime tcp, every
    /// --fault-every one of the faults asked for, on a random server, for --fault-duration:
    /// `crash` kills it (kill -9) and starts it again over its data folder (needs --durability
    /// wal or replicated), `pause` stops it (SIGSTOP, then SIGCONT), `partition` cuts its links
    /// to the other servers (firewall rules in a network namespace of the run's own; needs root).
    #[arg(long, default_value = "")]
    faults: String,
    /// Packet loss probability when `loss` is among --faults.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true)]
    loss: f64,
    /// Mean time between injected faults in sim, the time between them on tcp, e.g. 200ms.
    #[arg(long, default_value = "200ms")]
    fault_every: String,
    /// How long a crashed host stays down, a paused one stopped, or a partition lasts, e.g. 100ms.
    #[arg(long, default_value = "100ms")]
    fault_duration: String,
    /// A fault on a given node at a given time (sim and tcp), besides --faults' random ones:
    /// `KIND:TARGET[,KEY=VALUE]@TIME[+DURATION]`, TIME from the run's start (warm-up included),
    /// DURATION left out: until the measured window ends. TARGET: `node=N`; `leader=N`, the
    /// host that leads node N's replicated logs when the fault starts (a node's logs, one or
    /// several, are led from one host; needs --durability replicated; the fault ends on that
    /// same host); `role=R`, the first node with role R
    /// (as --roles gives them), `role=R#I` the I-th from 0. KIND: `crash` (with --durability
    /// wal or replicated it loses the node's memory; tcp: kill -9, then started again), `pause`
    /// (tcp: SIGSTOP, then SIGCONT), `partition` (the node is cut off from every other node; tcp:
    /// by firewall rules), `logfail` (sim: the node's logs refuse every record appended
    /// meanwhile), `delay:node=N,by=5ms` (every message the node sends is held
    /// that much longer; `worker=W`: only what its worker W sends, such as a protocol's stream of
    /// its own; `messages=control`: only its control messages, group commit's watermarks and
    /// epochs), `cpu:node=N,factor=3` (sim: the node's
    /// CPU costs are multiplied). Repeat the flag, or separate faults with `;`:
    /// `--fault-at 'crash:leader=0@2s+500ms;cpu:role=data#1,factor=3@0s'`.
    #[arg(long = "fault-at", value_name = "FAULT")]
    fault_at: Vec<String>,
    /// Write the JSON report here (default: in the results folder).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plot here (SVG; default: in the results folder).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Record the list-append history here (JSON lines).
    #[arg(long)]
    history: Option<PathBuf>,
    /// Check the run with the workload's checker: list-append histories for serializability,
    /// TPC-C consistency conditions 1-4, the bank total. Exits non-zero on a violation.
    #[arg(long, visible_alias = "check")]
    verify: bool,
    /// Results folder (default `results/<time>-<workload>-<runtime>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run against an already running cluster (tcp runtime).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Keys: per partition for ycsb (default 200000), in total for append (default 32).
    #[arg(long)]
    keys: Option<u64>,
    /// Zipf skew (0 = uniform, 0.99 = hot).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    theta: f64,
    /// Operations per transaction (ycsb default 10, append: at most, default 4).
    #[arg(long)]
    ops: Option<u32>,
    /// Fraction of reads (ycsb default 0.8, append 0.5).
    #[arg(long, allow_negative_numbers = true)]
    read_ratio: Option<f64>,
    /// Fraction of transactions touching another node (the Detock thesis's multi-partition
    /// fraction, hence its alias).
    #[arg(long, alias = "multi-partition", default_value_t = 0.1, allow_negative_numbers = true)]
    distributed: f64,
    /// YCSB: the first N keys of each partition are hot, the rest cold; each transaction's first
    /// --hot-ops operations draw a hot key, the others a cold one, uniformly (the Detock
    /// thesis's 2 hot + 8 cold; 0: off, keys follow --theta).
    #[arg(long, default_value_t = 0)]
    hot_keys: u64,
    /// YCSB: operations per transaction on hot keys, with --hot-keys.
    #[arg(long, default_value_t = 2)]
    hot_ops: u32,
    /// YCSB by home regions (the Detock thesis's microbenchmark): this fraction of transactions
    /// touches two home regions, its client's and one chosen by closeness (--latency-matrix);
    /// --multi-partition then counts transactions over several partitions of a region.
    #[arg(long, allow_negative_numbers = true)]
    multi_home: Option<f64>,
    /// YCSB writes are blind instead of read-modify-write (--blind-write-ratio 1).
    #[arg(long, conflicts_with = "blind_write_ratio")]
    blind_writes: bool,
    /// YCSB: the fraction of transactions that only read; the others follow --read-ratio
    /// (YCSB++: --read-only-txns 0.5 --read-ratio 0 --ops 4).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    read_only_txns: f64,
    /// YCSB: the fraction of writes that are blind, the others read-modify-writes (0 to 1).
    #[arg(long, allow_negative_numbers = true)]
    blind_write_ratio: Option<f64>,
    #[arg(long, default_value_t = 100)]
    value_bytes: u32,
    /// Execute interactively even when a procedure declares its keys (no batched prefetch).
    #[arg(long)]
    interactive: bool,
    #[arg(long, default_value_t = 1)]
    partitions_per_node: u32,
    /// Retries of one transaction before the client gives up on it.
    #[arg(long, default_value_t = 1000)]
    max_retries: u32,
    /// RPC timeout.
    #[arg(long, default_value = "2s")]
    rpc_timeout: String,
    /// Simulated CPU cost per record-level step, message, packet and transaction attempt, in
    /// ns, as OP,MSG,PACKET,TXN (default 100,800,8000,600; scripts/calibrate-sim.sh measures them),
    /// and optionally per KiB of log records appended, LOG (default 150), per KiB decoded,
    /// DECODE (default 850), per key added to a dependency graph, GRAPH (default 250), per
    /// idle worker woken by its own timer, WAKE (default 14000), and per step of a wait-for
    /// graph's search, GRAPH-STEP (default 20).
    #[arg(long, value_delimiter = ',', value_name = "OP,MSG,PACKET,TXN[,LOG[,DECODE[,GRAPH[,WAKE[,GRAPH-STEP]]]]]")]
    sim_cost_ns: Option<Vec<u64>>,
    /// Machine-readable output on stdout instead of the table.
    #[arg(long = "json-stdout")]
    json_stdout: bool,
    /// Run every protocol in this process instead of each in a fresh one (for a profiler that
    /// follows one process). A later run then inherits the heap and caches of the earlier
    /// ones, which moved a protocol's figure by up to a sixth with its place in --protocol.
    #[arg(long)]
    same_process: bool,
    /// none | wal | replicated: with `wal` every node logs to a write-ahead log and a commit is
    /// acknowledged once its decision record is fsynced (group commit); with `replicated` once a
    /// majority of the node's log replicas hold it.
    #[arg(long, default_value = "none")]
    durability: String,
    /// With --durability replicated: nodes that hold each node's log (it and the next ones).
    #[arg(long, default_value_t = 3)]
    replicas: u16,
    /// With --durability wal: checkpoint each node's log every this many records, so that
    /// recovery replays at most that many and old log segments are deleted (0 = never; a
    /// checkpointer thread replays every record a second time, which costs throughput).
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// With --durability replicated (sim, tcp): snapshot each replicated log's applied state
    /// every this many committed entries and compact the log up to it; a replica that lacks
    /// the compacted entries (restarted, or cut off) installs the snapshot.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    /// With --durability replicated (sim, tcp): also snapshot a log once the entries committed
    /// since its last snapshot hold this many bytes and at least as many as that snapshot
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_log_bytes: u64,
    /// With --durability replicated (sim, tcp): how long a log's followers hear nothing from
    /// its leader before one campaigns (30ms to 60s, in 10 ms ticks; each waits one to two of
    /// these). Default 100ms in sim (raft-rs's ten ticks), 1s on tcp (etcd's default and the
    /// Rolis paper's: real processes on busy cores send heartbeats late).
    #[arg(long)]
    election_timeout: Option<String>,
    /// Group commit: flush this long after the first unflushed record (e.g. 200us).
    #[arg(long, default_value = "200us")]
    group_commit: String,
    /// Group commit: or as soon as this many bytes are buffered.
    #[arg(long, default_value_t = 256 << 10)]
    group_commit_bytes: usize,
    /// Write the log without fsync (to measure what fsync costs; not durable).
    #[arg(long)]
    no_fsync: bool,
    /// Simulator: what one log flush (fsync) costs in virtual time.
    #[arg(long, default_value = "200us")]
    sim_fsync: String,
    /// Simulator: each worker's append lane is a disk of its own, flushed on its own (per-worker
    /// log files); by default a node's lanes are cut into one file together, as the real WAL does.
    #[arg(long)]
    sim_lane_disks: bool,
    /// Where nodes keep their logs (default: a temporary folder per run, removed after it).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The cluster's id, in hex (default: a fresh one per run); a run with the id of an
    /// earlier run and the same data folders recovers that run's logs.
    #[arg(long, value_name = "HEX")]
    cluster_id: Option<String>,
}

/// `--protocol`, parsed once, when the flags are: the variants to run, each a run of its own
/// (`protocols::resolve` reads `a,b:k=v` or `all`). An unknown protocol or option is a one-line
/// error of the flag's.
#[derive(Clone, Debug)]
pub struct ProtocolList(Vec<Variant>, bool);

impl std::str::FromStr for ProtocolList {
    type Err = String;
    fn from_str(list: &str) -> Result<Self, String> {
        let all = list.trim() == "all";
        crate::protocols::resolve(list).map(|v| ProtocolList(v, all)).map_err(|e| format!("{e:#}"))
    }
}

impl ProtocolList {
    pub fn variants(&self) -> &[Variant] {
        &self.0
    }

    /// `all` keeps the protocols that run with the run's durability (`rolis` needs replicated
    /// logs, `silo` refuses them); a list the user wrote is kept whole, so that a protocol that
    /// refuses says why.
    fn runnable_with(mut self, durability: &str, replicas: u16) -> Self {
        if let (true, Ok(mode)) = (self.1, durability.parse::<crate::replication::Durability>()) {
            self.0.retain(|v| v.make().check_durability(mode, replicas).is_ok());
        }
        self
    }

    /// More than one run: the files of each (its history) carry its protocol's name.
    pub fn several(&self) -> bool {
        self.0.len() > 1
    }
}

impl std::fmt::Display for ProtocolList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|v| v.name.as_str()).collect();
        f.write_str(&names.join(","))
    }
}

/// A fresh id for the cluster of one run, so that its logs are never mistaken for another
/// run's (a log of another cluster is refused).
fn cluster_id(protocol: &str, seed: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (protocol, seed, std::time::SystemTime::now(), std::process::id()).hash(&mut h);
    h.finish()
}

/// `--cluster-id`: a hexadecimal u64, with or without `0x`.
/// `--election-timeout`: a duration in the allowed range, a whole number of replicator ticks.
fn parse_election_timeout_us(s: &str) -> anyhow::Result<u64> {
    use crate::replication::{service::TICK_US, ELECTION_TIMEOUT_RANGE_US as RANGE};
    let us = parse_duration_us(s).context("--election-timeout")?;
    anyhow::ensure!(
        RANGE.contains(&us),
        "--election-timeout {s}: give {}ms to {}s (a leader heartbeats every 20ms)",
        RANGE.start() / 1000,
        RANGE.end() / 1_000_000
    );
    anyhow::ensure!(
        us % TICK_US == 0,
        "--election-timeout {s}: give a multiple of the replicator's {}ms tick",
        TICK_US / 1000
    );
    Ok(us)
}

fn parse_cluster_id(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    u64::from_str_radix(digits, 16).map_err(|_| anyhow::anyhow!("--cluster-id: `{s}` is not a hexadecimal number"))
}

/// What a `--fault-at` target is checked against: the run's nodes, each node's roles (empty:
/// every node `data+client`), and whether its logs are replicated (`leader=` needs them).
pub struct FaultTargets<'a> {
    pub nodes: u16,
    pub workers: u16,
    pub roles: &'a [Roles],
    pub replicated: bool,
}

impl FaultTargets<'_> {
    /// `node=N`, `leader=N` or `role=R[#I]`: the target, or a one-line error naming what is wrong.
    fn parse(&self, key: &str, value: &str) -> anyhow::Result<FaultTarget> {
        if key == "role" {
            return self.node_of_role(value).map(FaultTarget::Node);
        }
        let n: u16 = value.parse().map_err(|_| anyhow::anyhow!("{key} `{value}` is not a node number"))?;
        if n >= self.nodes {
            anyhow::bail!("there is no node {n}: the run has nodes 0 to {}", self.nodes.saturating_sub(1));
        }
        if key == "node" {
            return Ok(FaultTarget::Node(n));
        }
        if !self.replicated {
            anyhow::bail!("leader={n} is the host that leads node {n}'s replicated log: add --durability replicated");
        }
        Ok(FaultTarget::LeaderOf(n))
    }

    /// `worker=W`: a worker every node has, under every protocol of the run.
    fn worker(&self, value: &str) -> anyhow::Result<u16> {
        let w: u16 = value.parse().map_err(|_| anyhow::anyhow!("worker `{value}` is not a worker number"))?;
        if w >= self.workers {
            anyhow::bail!("there is no worker {w}: a node has workers 0 to {}", self.workers.saturating_sub(1));
        }
        Ok(w)
    }

    /// `role=R`: the first node with role R; `role=R#I`: the I-th (from 0), in node order.
    fn node_of_role(&self, value: &str) -> anyhow::Result<NodeId> {
        let (name, nth) = match value.split_once('#') {
            Some((name, i)) => {
                let i: usize = i.trim().parse().map_err(|_| anyhow::anyhow!("role={value}: `{i}` is not a number"))?;
                (name, i)
            }
            None => (value, 0),
        };
        let role = Role::parse(name)?;
        let roles_of = |n: u16| self.roles.get(n as usize).copied().unwrap_or(Roles::DEFAULT);
        let with: Vec<NodeId> = (0..self.nodes).filter(|&n| roles_of(n).contains(role)).collect();
        if with.is_empty() {
            let all: Vec<String> = (0..self.nodes).map(|n| format!("{n} {}", roles_of(n).names().join("+"))).collect();
            anyhow::bail!("no node has role `{}` (nodes' roles, set by --roles: {})", name.trim(), all.join(", "));
        }
        with.get(nth).copied().ok_or_else(|| {
            anyhow::anyhow!("role={value}: only {} nodes have role `{}` (counted from #0)", with.len(), name.trim())
        })
    }
}

/// `--fault-at`: every fault of every occurrence of the flag (each may hold several, separated
/// by `;`), checked against the run's nodes, roles and durability. Each error is one line
/// naming the fault and what is wrong with it.
pub fn parse_fault_at(values: &[String], targets: &FaultTargets) -> anyhow::Result<Vec<TargetedFault>> {
    values
        .iter()
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| parse_one_fault(f, targets).with_context(|| format!("--fault-at `{f}`")))
        .collect()
}

fn parse_one_fault(f: &str, targets: &FaultTargets) -> anyhow::Result<TargetedFault> {
    let Some((what, when)) = f.split_once('@') else {
        anyhow::bail!("no time: give KIND:node=N@TIME[+DURATION], e.g. crash:node=1@2s+500ms");
    };
    let (kind_name, params) = what.split_once(':').unwrap_or((what, ""));
    let mut target = None;
    let (mut by_us, mut factor, mut worker, mut control) = (None, None, None, false);
    let kind_name = kind_name.trim();
    let keys: &[&str] = match kind_name {
        "crash" | "pause" | "partition" | "logfail" => &["node", "leader", "role"],
        "delay" => &["node", "leader", "role", "by", "worker", "messages"],
        "cpu" => &["node", "leader", "role", "factor"],
        other => anyhow::bail!("unknown kind `{other}` (use crash, pause, partition, delay, cpu or logfail)"),
    };
    for kv in params.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else {
            anyhow::bail!("`{kv}` is not KEY=VALUE (a {kind_name} takes {})", keys.join(", "));
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            _ if !keys.contains(&k) => anyhow::bail!("a {kind_name} takes no `{k}` (it takes {})", keys.join(", ")),
            "node" | "leader" | "role" => {
                if target.is_some() {
                    anyhow::bail!("name one target: node=N, leader=N or role=R, not two");
                }
                target = Some(targets.parse(k, v)?);
            }
            "by" => by_us = Some(fault_time_us(v).context("by")?),
            "worker" => worker = Some(targets.worker(v)?),
            "messages" => {
                control = match v {
                    "control" => true,
                    "all" => false,
                    _ => anyhow::bail!("messages `{v}`: use control (group commit's watermarks and epochs) or all"),
                }
            }
            _ => {
                let x: f64 = v.parse().map_err(|_| anyhow::anyhow!("factor `{v}` is not a number"))?;
                if !(x.is_finite() && x > 0.0 && x <= 1000.0) {
                    anyhow::bail!("factor {v} must be above 0 and at most 1000");
                }
                factor = Some(x);
            }
        }
    }
    let target = target
        .ok_or_else(|| anyhow::anyhow!("which node? add node=N, leader=N or role=R (e.g. {kind_name}:node=1)"))?;
    let kind = match kind_name {
        "crash" => TargetedKind::Crash,
        "pause" => TargetedKind::Pause,
        "partition" => TargetedKind::Partition,
        "logfail" => TargetedKind::LogFail,
        "delay" => {
            let by_us = by_us.ok_or_else(|| anyhow::anyhow!("how long? add by=DURATION"))?;
            TargetedKind::Delay { by_us, worker, control }
        }
        _ => TargetedKind::Cpu { factor: factor.ok_or_else(|| anyhow::anyhow!("how much? add factor=X"))? },
    };
    let (at, dur) = match when.split_once('+') {
        Some((at, dur)) => (at, Some(dur)),
        None => (when, None),
    };
    let at_us = fault_time_us(at).context("time")?;
    let for_us = dur.map(|d| fault_time_us(d).context("duration")).transpose()?;
    if for_us == Some(0) {
        anyhow::bail!("a duration of 0 does nothing: leave `+...` out to last until the window ends");
    }
    Ok(TargetedFault { kind, target, at_us, for_us })
}

/// A time or duration of `--fault-at`: a number with its unit (a bare number is refused: 2
/// could mean seconds or µs).
fn fault_time_us(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    if t.is_empty() {
        anyhow::bail!("is missing (try 2s, 500ms)");
    }
    if t.parse::<f64>().is_ok() {
        anyhow::bail!("`{t}` has no unit (try {t}s or {t}ms)");
    }
    parse_duration_us(t).map_err(|_| anyhow::anyhow!("`{t}` is not a time (try 2s, 500ms, 100us)"))
}

fn secs_us(s: &str, what: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        if !(v.is_finite() && v >= 0.0) {
            anyhow::bail!("--{what} {s} must be a non-negative number of seconds");
        }
        return Ok((v * 1e6) as u64);
    }
    parse_duration_us(t).with_context(|| format!("--{what}"))
}

impl BenchArgs {
    /// Clients per worker when `--inflight` is not given: 64, or for TPC-C ten terminals per
    /// warehouse, as the specification models its users (clause 4.2.2): more clients than
    /// terminals only queue on the same district and warehouse rows.
    fn default_inflight(&self) -> u32 {
        if self.workload != "tpcc" {
            return 64;
        }
        let workers = (self.nodes as u32 * self.workers() as u32).max(1);
        10 * self.warehouses.div_ceil(workers).max(1)
    }

    fn workers(&self) -> u16 {
        self.workers.unwrap_or_else(|| {
            if self.runtime == Runtime::Sim {
                return 1;
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / self.nodes.max(1) as usize).clamp(1, 64) as u16
        })
    }

    /// `--placement`, or the default: a protocol that keeps a copy per region (Calvin, SLOG,
    /// Detock) runs as its paper ran it, a copy in every region, whenever the run has several
    /// regions; with one copy every region's reads would cross the WAN.
    fn placement(&self, variant: &Variant, node_region: &[u16]) -> anyhow::Result<crate::cluster::Placement> {
        use crate::cluster::Placement;
        if let Some(p) = &self.placement {
            return Placement::parse(p).context("--placement");
        }
        let several_regions = node_region.iter().any(|r| Some(r) != node_region.first());
        Ok(if several_regions && variant.make().keeps_copies(Placement::PerRegion) {
            Placement::PerRegion
        } else {
            Placement::Single
        })
    }

    /// `--same-process`.
    pub fn same_process(&self) -> bool {
        self.same_process
    }

    fn spec(&self, variant: &Variant) -> anyhow::Result<BenchSpec> {
        let protocol = variant.name.as_str();
        if let Some(path) = &self.cluster {
            // A running cluster's file says how many nodes and workers there are.
            let cfg = crate::cluster::ClusterConfig::load(path)?;
            let mut args = self.clone();
            args.cluster = None;
            args.nodes = cfg.nodes.len() as u16;
            args.workers = Some(cfg.workers);
            args.partitions_per_node = cfg.partitions_per_node;
            return args.spec(variant);
        }
        let append = self.workload == "append";
        let latency = self.latency_model()?;
        let node_roles = match &self.roles {
            Some(r) => crate::cluster::roles::parse_node_roles(r, self.nodes)?,
            None => Vec::new(),
        };
        let durability: crate::replication::Durability = self.durability.parse()?;
        let faults = self.fault_plan(&node_roles, durability)?;
        let spec = BenchSpec {
            protocol: protocol.to_string(),
            workload: self.workload_params()?,
            runtime: self.runtime,
            nodes: self.nodes,
            workers: self.workers() + variant.make().service_workers(),
            partitions_per_node: self.partitions_per_node,
            inflight: self.inflight.unwrap_or_else(|| self.default_inflight()),
            rate_per_node: self.rate.unwrap_or(0.0),
            max_unacked: self.max_unacked,
            duration_us: secs_us(&self.duration, "duration")?,
            warmup_us: secs_us(&self.warmup, "warmup")?,
            rpc: self.rpc_config(&faults, &latency)?,
            placement: self.placement(variant, &latency.node_region)?,
            latency,
            faults,
            seed: self.seed,
            cost: self.sim_cost()?,
            proto: ProtoOptions { one_shot: !self.interactive },
            record_history: append && (self.verify || self.history.is_some()),
            run_checks: self.verify && !append,
            max_retries: self.max_retries,
            durability: self.durability_config(durability, protocol)?,
            node_roles,
            clock_skew_us: parse_duration_us(&self.clock_skew).context("--clock-skew")?,
            clock_drift_ppm: self.clock_drift,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// `--delay`, `--jitter`, `--bandwidth`, `--regions`, `--latency-matrix` and `--asymmetry`.
    fn latency_model(&self) -> anyhow::Result<LatencyModel> {
        let mut latency = LatencyModel {
            delay_us: parse_duration_us(&self.delay).context("--delay")?,
            jitter_us: parse_duration_us(&self.jitter).context("--jitter")?,
            egress_mbps: LatencyModel::parse_bandwidth_mbps(&self.bandwidth).context("--bandwidth")?,
            ..Default::default()
        };
        if latency.egress_mbps > 0 && self.runtime != Runtime::Sim {
            anyhow::bail!(
                "--bandwidth limits the simulator's links: add --runtime sim (real runtimes use the machine's)"
            );
        }
        // Regions place copies and logs' voters (--placement per-region), and, with a latency
        // matrix, set the delays between nodes.
        if let Some(r) = &self.regions {
            latency.node_region = r
                .split(',')
                .map(|x| x.trim().parse::<u16>().with_context(|| format!("--regions: `{x}` is not a region number")))
                .collect::<anyhow::Result<_>>()?;
            if latency.node_region.len() != self.nodes as usize {
                anyhow::bail!("--regions names {} nodes but --nodes is {}", latency.node_region.len(), self.nodes);
            }
        }
        if let Some(m) = &self.latency_matrix {
            latency.region_delay_us = LatencyModel::load_matrix(m)?;
            if self.asymmetry != 0.5 {
                LatencyModel::make_asymmetric(&mut latency.region_delay_us, self.asymmetry)?;
            }
            let regions = latency.region_delay_us.len() as u16;
            if latency.node_region.is_empty() {
                latency.node_region = (0..self.nodes).map(|n| n % regions).collect();
            }
            if let Some(r) = latency.node_region.iter().find(|r| **r >= regions) {
                anyhow::bail!("--regions uses region {r} but the latency matrix has {regions} regions");
            }
        }
        if self.asymmetry != 0.5 && self.latency_matrix.is_none() {
            anyhow::bail!("--asymmetry {} needs --latency-matrix: it reshapes the matrix's paths", self.asymmetry);
        }
        Ok(latency)
    }

    /// `--faults`, `--fault-every`, `--fault-duration`, `--loss` and `--fault-at`, checked
    /// against the runtime that injects them.
    fn fault_plan(
        &self,
        node_roles: &[crate::cluster::roles::Roles],
        durability: crate::replication::Durability,
    ) -> anyhow::Result<FaultPlan> {
        let mut faults = FaultPlan {
            fault_interval_us: parse_duration_us(&self.fault_every).context("--fault-every")?,
            fault_duration_us: parse_duration_us(&self.fault_duration).context("--fault-duration")?,
            ..Default::default()
        };
        if faults.fault_interval_us < 1_000 || faults.fault_duration_us < 1_000 {
            anyhow::bail!("--fault-every and --fault-duration must be at least 1ms");
        }
        for f in self.faults.split(',').map(str::trim).filter(|f| !f.is_empty()) {
            match f {
                "crash" => faults.crashes = true,
                "pause" => faults.pauses = true,
                "partition" => faults.partitions = true,
                "loss" => faults.loss = self.loss,
                other => {
                    anyhow::bail!("--faults: unknown fault `{other}` (use crash, pause, partition, loss)")
                }
            }
        }
        let targets = FaultTargets {
            nodes: self.nodes,
            // The fewest workers any protocol of the run has (its service workers count).
            workers: self.workers()
                + self.protocol.variants().iter().map(|v| v.make().service_workers()).min().unwrap_or(0),
            roles: node_roles,
            replicated: durability == crate::replication::Durability::Replicated,
        };
        faults.targeted = parse_fault_at(&self.fault_at, &targets)?;
        if !faults.targeted.is_empty() {
            if self.runtime != Runtime::Sim && self.runtime != Runtime::Tcp {
                anyhow::bail!("--fault-at acts in the simulator and on tcp servers: add --runtime sim or tcp");
            }
            if self.runtime == Runtime::Tcp
                && faults.targeted.iter().any(|f| matches!(f.kind, TargetedKind::Cpu { .. }))
            {
                anyhow::bail!("--fault-at cpu multiplies simulated CPU costs: it needs --runtime sim");
            }
            if self.runtime == Runtime::Tcp && faults.targeted.iter().any(|f| f.kind == TargetedKind::LogFail) {
                anyhow::bail!("--fault-at logfail makes a simulated log refuse records: it needs --runtime sim");
            }
            let end_us = secs_us(&self.warmup, "warmup")? + secs_us(&self.duration, "duration")?;
            if let Some(f) = faults.targeted.iter().find(|f| f.at_us >= end_us) {
                anyhow::bail!(
                    "--fault-at: a {} at {} ms is after the run's end ({} ms: warm-up and duration)",
                    f.kind.name(),
                    f.at_us / 1000,
                    end_us / 1000
                );
            }
        }
        let tcp_processes = self.runtime == Runtime::Tcp && faults.loss == 0.0;
        if faults.pauses && self.runtime != Runtime::Tcp {
            anyhow::bail!("--faults pause stops a server process (SIGSTOP): add --runtime tcp");
        }
        if faults.any() && self.runtime != Runtime::Sim && !tcp_processes {
            anyhow::bail!(
                "--faults are injected by the simulator (add --runtime sim); with --runtime tcp, only \
                 --faults crash, pause and partition (kill -9, SIGSTOP or cut off a server, then restart, \
                 continue or reconnect it) are possible"
            );
        }
        if self.runtime == Runtime::Tcp && faults.any() && self.cluster.is_some() {
            anyhow::bail!("--faults on tcp act on servers the bench starts itself: leave out --cluster");
        }
        Ok(faults)
    }

    /// `--rpc-timeout`, and resends on lossy links.
    fn rpc_config(&self, faults: &FaultPlan, latency: &LatencyModel) -> anyhow::Result<RpcConfig> {
        let mut rpc = RpcConfig {
            timeout_us: parse_duration_us(&self.rpc_timeout).context("--rpc-timeout")?,
            ..Default::default()
        };
        if faults.any() {
            // Lossy links: resend unanswered requests; receivers de-duplicate.
            rpc.retransmit_us = (latency.delay_us * 4).max(2_000);
            rpc.timeout_us = rpc.timeout_us.min(500_000);
        }
        Ok(rpc)
    }

    /// `--sim-cost-ns`, or the costs measured on this machine.
    fn sim_cost(&self) -> anyhow::Result<CpuCost> {
        let mut cost = CpuCost::default();
        if let Some(c) = &self.sim_cost_ns {
            anyhow::ensure!(
                (4..=9).contains(&c.len()),
                "--sim-cost-ns: give four costs in ns, OP,MSG,PACKET,TXN, then if you like LOG per KiB of log records, DECODE per KiB decoded, GRAPH per key added to a dependency graph, WAKE per idle worker woken by its timer and GRAPH-STEP per step of a wait-for graph's search (e.g. 100,800,8000,600,150,850,250,14000,20)"
            );
            cost = CpuCost {
                op_ns: c[0],
                msg_ns: c[1],
                packet_ns: c[2],
                txn_ns: c[3],
                log_ns_per_kib: c.get(4).copied().unwrap_or(cost.log_ns_per_kib),
                decode_ns_per_kib: c.get(5).copied().unwrap_or(cost.decode_ns_per_kib),
                graph_key_ns: c.get(6).copied().unwrap_or(cost.graph_key_ns),
                wake_ns: c.get(7).copied().unwrap_or(cost.wake_ns),
                graph_step_ns: c.get(8).copied().unwrap_or(cost.graph_step_ns),
            };
        }
        Ok(cost)
    }

    /// The workload's flags, with the defaults of list-append or the others.
    fn workload_params(&self) -> anyhow::Result<WorkloadParams> {
        let append = self.workload == "append";
        Ok(WorkloadParams {
                name: self.workload.clone(),
            keys: self.keys.unwrap_or(if append { 32 } else { 200_000 }),
            theta: self.theta,
            ops: self.ops.unwrap_or(if append { 4 } else { 10 }),
            read_ratio: self.read_ratio.unwrap_or(if append { 0.5 } else { 0.8 }),
            read_only_txns: self.read_only_txns,
            blind_write_ratio: self.blind_write_ratio.unwrap_or(if self.blind_writes { 1.0 } else { 0.0 }),
            distributed: self.distributed,
            hot_keys: self.hot_keys,
            hot_ops: self.hot_ops,
            multi_home: self.multi_home,
            value_bytes: self.value_bytes,
            warehouses: self.warehouses,
            mix: self.mix.clone(),
            neworder_remote: self.neworder_remote,
            payment_remote: self.payment_remote,
            item_replicated: !self.no_item_replication,
            remote_in_other_region: match self.remote_scope.as_str() {
                "any" => false,
                "region" => true,
                other => anyhow::bail!("--remote-scope `{other}`: give any (another warehouse) or region (a warehouse homed in another region)"),
            },
            by_last_name: self.by_last_name,
            accounts: self.accounts,
            audit_ratio: self.audit_ratio,
            process: 0,
        })
    }

    /// `--durability` and the log's and replication's flags.
    fn durability_config(
        &self,
        durability: crate::replication::Durability,
        protocol: &str,
    ) -> anyhow::Result<DurabilityConfig> {
        Ok(DurabilityConfig {
            mode: durability,
            group_commit_us: parse_duration_us(&self.group_commit).context("--group-commit")?,
            group_commit_bytes: self.group_commit_bytes,
            fsync: !self.no_fsync,
            sim_fsync_us: parse_duration_us(&self.sim_fsync).context("--sim-fsync")?,
            sim_lane_disks: self.sim_lane_disks,
            data_dir: self.data_dir.clone(),
            cluster_id: match &self.cluster_id {
                Some(_) if self.protocol.several() => anyhow::bail!(
                    "--cluster-id names the logs of one cluster: give one --protocol with it, not `{}`",
                    self.protocol
                ),
                Some(x) => parse_cluster_id(x)?,
                None => cluster_id(protocol, self.seed),
            },
            replicas: self.replicas,
            checkpoint_every: self.checkpoint_every,
            snapshot_every: self.snapshot_every,
            snapshot_log_bytes: self.snapshot_log_bytes,
            election_timeout_us: match (&self.election_timeout, self.runtime) {
                (Some(s), _) => parse_election_timeout_us(s)?,
                (None, Runtime::Tcp) => crate::replication::TCP_ELECTION_TIMEOUT_US,
                (None, _) => crate::replication::default_election_timeout_us(),
            },
            ..DurabilityConfig::default()
        })
    }
}

impl From<BenchArgs> for super::BenchRequest {
    fn from(a: BenchArgs) -> Self {
        let a2 = a.clone();
        super::BenchRequest {
            protocols: a.protocol.clone().runnable_with(&a.durability, a.replicas),
            make_spec: Box::new(move |p| a2.spec(p)),
            runtime: a.runtime,
            json: a.json,
            plot: a.plot,
            history: a.history,
            verify: a.verify,
            out: a.out,
            cluster: a.cluster,
            workload: a.workload,
            json_stdout: a.json_stdout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Placement;
    use clap::Parser;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn placement_of(flags: &[&str]) -> Placement {
        let args = Line::try_parse_from(std::iter::once("bench").chain(flags.iter().copied())).expect("flags").args;
        args.spec(&args.protocol.variants()[0]).expect("a spec").placement
    }

    /// A protocol that keeps a copy per region runs as its paper ran it when the run has
    /// several regions (a new user's `--protocol detock --regions 0,1,2` once ran one copy,
    /// every region's reads crossing the WAN); one region, a protocol with one copy, or a
    /// placement given by name keep what they say.
    #[test]
    fn a_protocol_with_a_copy_per_region_takes_per_region_when_regions_are_several() {
        let three = ["--nodes", "3", "--regions", "0,1,2"];
        for p in ["detock", "slog", "calvin"] {
            let flags: Vec<&str> = ["--protocol", p].iter().chain(&three).copied().collect();
            assert_eq!(placement_of(&flags), Placement::PerRegion, "{p}");
        }
        assert_eq!(placement_of(&["--protocol", "occ", "--nodes", "3", "--regions", "0,1,2"]), Placement::Single);
        assert_eq!(placement_of(&["--protocol", "detock", "--nodes", "3", "--regions", "1,1,1"]), Placement::Single);
        assert_eq!(placement_of(&["--protocol", "calvin", "--nodes", "2"]), Placement::Single);
        let named = ["--protocol", "detock", "--nodes", "3", "--regions", "0,1,2", "--placement", "single"];
        assert_eq!(placement_of(&named), Placement::Single);
    }
}
