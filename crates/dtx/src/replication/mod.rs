//! Durability and replication, shared by every protocol: a write-ahead log with group commit
//! ([`crate::wal`]) and consensus-replicated logs ([`raft_log`]). Nothing here touches a protocol; the
//! runtimes hand a node's log to protocol code as an [`crate::rt::log::NodeLog`].

pub mod applier;
pub mod epoch;
pub mod fragment;
pub mod journal;
pub mod raft_log;
pub mod service;
pub mod store;

pub mod watermark;
pub mod wm_recovery;

use crate::rt::log::NodeLog;
use crate::wal;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// How durable a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Nothing is logged: a crash loses the node's state.
    #[default]
    None,
    /// Every node logs to its own write-ahead log; a commit is acknowledged once its decision
    /// record is durable (fsynced, by group commit).
    Wal,
    /// Every node's log is a Raft group over `replicas` nodes ([`service`]); a commit is
    /// acknowledged once a majority of them holds its decision record.
    Replicated,
}

impl std::str::FromStr for Durability {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "none" => Ok(Durability::None),
            "wal" => Ok(Durability::Wal),
            "replicated" => Ok(Durability::Replicated),
            other => anyhow::bail!("unknown --durability `{other}` (known: none, wal, replicated)"),
        }
    }
}

/// The durability settings of a run; they cross process boundaries with the bench spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DurabilityConfig {
    pub mode: Durability,
    /// Group commit: flush this long after the first unflushed record...
    pub group_commit_us: u64,
    /// ...or as soon as this much is buffered.
    pub group_commit_bytes: usize,
    /// fdatasync each group (false only to measure what fsync costs).
    pub fsync: bool,
    /// What one flush costs in the simulator (docs/machine.md: fdatasync after a 4 KiB append,
    /// p50 198 µs on this machine).
    pub sim_fsync_us: u64,
    /// In the simulator, each append lane of a log is a disk of its own, flushed on its own (as
    /// logs in files of their own per worker would be); otherwise a log's lanes are cut together
    /// into one file, as the real WAL writes them.
    #[serde(default)]
    pub sim_lane_disks: bool,
    /// Where the nodes of this process keep their logs (local and tcp runtimes); `None` = a
    /// fresh temporary directory per run, removed afterwards.
    pub data_dir: Option<PathBuf>,
    /// Identifies the cluster a log belongs to: a log of another cluster is refused.
    pub cluster_id: u64,
    /// With `Replicated`: how many nodes hold each node's log (the node and the next ones).
    #[serde(default = "default_replicas")]
    pub replicas: u16,
    /// Checkpoint a node's WAL every this many records, so that recovery replays at most that
    /// many (0 = never).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// Roll to a new WAL segment file past this size (a checkpoint deletes whole segments).
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    /// With `Replicated` (failover, `sim` and `tcp`): committed entries of a replicated log
    /// between snapshots of its applied state, after which the log is compacted.
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every: u64,
    /// With `Replicated` (failover): also snapshot a log once the entries committed since its
    /// last snapshot hold this many bytes and at least as many as that snapshot (so a log of
    /// large records stays short, and serializing the state costs no more than the log did).
    #[serde(default = "default_snapshot_log_bytes")]
    pub snapshot_log_bytes: u64,
    /// With `Replicated`: Raft frames over this many bytes (a snapshot of the applied state)
    /// travel as fragments of this size. Tests make it small to send every snapshot so.
    #[serde(default = "default_raft_fragment_bytes")]
    pub raft_fragment_bytes: u64,
    /// With `Replicated` (failover): how long a follower hears nothing from its leader before
    /// it campaigns (a whole number of the replicator's 10 ms ticks; a replica waits between
    /// one and two of these, drawn from its seed). A leader heartbeats every 20 ms.
    #[serde(default = "default_election_timeout_us")]
    pub election_timeout_us: u64,
}

/// Raft's own default (10 ticks of 10 ms): a failover in 100-200 ms.
pub fn default_election_timeout_us() -> u64 {
    100_000
}

/// The default on `tcp`: etcd's, and the Rolis paper's, "to avoid false positives". Real
/// server processes share cores with their workers, and after the machine idled the first
/// second of a run held every server's replication thread 25-470 ms late (docs/experiments.md,
/// Rolis): at 100 ms the owners lost their logs to takeovers that the run then paid for.
pub const TCP_ELECTION_TIMEOUT_US: u64 = 1_000_000;

/// The least and the most `--election-timeout` takes: above the 20 ms heartbeat with a tick to
/// spare, and a minute (a longer one is a cluster that never fails over).
pub const ELECTION_TIMEOUT_RANGE_US: std::ops::RangeInclusive<u64> = 30_000..=60_000_000;

fn default_snapshot_log_bytes() -> u64 {
    16 << 20
}

fn default_raft_fragment_bytes() -> u64 {
    raft_log::FRAGMENT_BYTES
}

/// A snapshot serializes a node's whole logged state (every row written so far): every 65,536
/// records keeps that below a few percent of the replicas' work on YCSB, and the log between
/// snapshots at some tens of MB.
fn default_snapshot_every() -> u64 {
    65_536
}

/// Off by default: the checkpointer replays every record a second time on its own thread, which
/// on a 2-core machine halves the throughput of a durable YCSB run (150k -> 84k txn/s at one node
/// with a checkpoint every 200,000 records). Long-lived clusters turn it on.
fn default_checkpoint_every() -> u64 {
    0
}

fn default_segment_bytes() -> u64 {
    64 << 20
}

fn default_replicas() -> u16 {
    3
}

impl Default for DurabilityConfig {
    fn default() -> Self {
        DurabilityConfig {
            mode: Durability::None,
            group_commit_us: 200,
            group_commit_bytes: 256 << 10,
            fsync: true,
            sim_fsync_us: 200,
            sim_lane_disks: false,
            data_dir: None,
            cluster_id: 0,
            replicas: default_replicas(),
            checkpoint_every: default_checkpoint_every(),
            segment_bytes: default_segment_bytes(),
            snapshot_every: default_snapshot_every(),
            snapshot_log_bytes: default_snapshot_log_bytes(),
            raft_fragment_bytes: default_raft_fragment_bytes(),
            election_timeout_us: default_election_timeout_us(),
        }
    }
}

impl DurabilityConfig {
    pub fn enabled(&self) -> bool {
        self.mode != Durability::None
    }

    /// Check the settings against the cluster; `crashes`: the simulator will crash nodes.
    pub fn validate(&self, nodes: u16, crashes: bool) -> anyhow::Result<()> {
        if self.mode != Durability::Replicated {
            return Ok(());
        }
        if self.replicas == 0 || self.replicas > nodes {
            anyhow::bail!(
                "--replicas {} must be between 1 and the number of nodes ({nodes}): every node's log is held by \
                 that node and the next ones",
                self.replicas
            );
        }
        if crashes && self.replicas < 3 {
            anyhow::bail!(
                "--durability replicated with crashes needs --replicas 3 or more: a log of {} replicas has no \
                 majority left when one of them crashes",
                self.replicas
            );
        }
        Ok(())
    }

    /// Open (or create) node `node`'s log in `dir`, one WAL whose `lanes` append lanes are its
    /// lanes (a log written with another number of lanes recovers the same way).
    pub fn open_wal(&self, dir: PathBuf, node: u16, lanes: usize) -> anyhow::Result<OpenedWal> {
        let old_lane = lane_dir(&dir, 1);
        if old_lane.exists() {
            anyhow::bail!(
                "node {node}: {} holds a log lane in a folder of its own, as dtx wrote them before lanes shared one \
                 file; this version cannot read it: use another --data-dir",
                old_lane.display()
            );
        }
        let mut cfg = self.wal_config(dir.clone(), node);
        cfg.lanes = lanes.max(1);
        let (wal, recovered) = wal::Wal::open(cfg)?;
        if let Some((path, offset)) = &recovered.torn_tail {
            crate::rt::log_warn(&format!(
                "node {node}: a torn last record in {} was cut at byte {offset} (a crash during a write)",
                path.display()
            ));
        }
        let checkpoint = recovered.checkpoint.map(|c| c.1);
        let records = recovered.records.into_iter().map(|(_, r)| r).collect();
        let reopened = NodeLog::over_wal(wal, records, checkpoint).map_err(|e| {
            anyhow::anyhow!(
                "node {node}: the log in {} does not recover: {e}; it was written by another version of dtx, or \
                 is corrupt: use another --data-dir",
                dir.display()
            )
        })?;
        if reopened.orphans > 0 {
            crate::rt::log_warn(&format!(
                "node {node}: {} log records written after one that a crash lost in another lane were voided \
                 (none of them was acknowledged)",
                reopened.orphans
            ));
        }
        Ok(OpenedWal { log: reopened.log, checkpoint: reopened.checkpoint, records: reopened.records })
    }

    fn wal_config(&self, dir: PathBuf, node: u16) -> wal::WalConfig {
        let mut cfg = wal::WalConfig::new(dir, self.cluster_id, node);
        cfg.group_commit_delay_us = self.group_commit_us;
        cfg.group_commit_bytes = self.group_commit_bytes;
        cfg.fsync = self.fsync;
        cfg.segment_bytes = self.segment_bytes;
        cfg
    }
}

/// Where an earlier version kept lane `lane` (k > 0) of the log in `dir`: a folder of its own.
fn lane_dir(dir: &std::path::Path, lane: usize) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(format!("-lane-{lane}"));
    PathBuf::from(name)
}

/// A node's log as it was found: its newest checkpoint and the records after it.
pub struct OpenedWal {
    pub log: Arc<NodeLog>,
    pub checkpoint: Option<Vec<u8>>,
    pub records: Vec<Vec<u8>>,
}
