//! Log replication for `--durability replicated`: every node's log is a Raft group whose voters
//! are the node's host and `replicas - 1` others, its own region's first, each in order after it
//! (mod the cluster size; `cluster::placement::log_voters`), so each host leads its own node's
//! log and, in one region, follows the `replicas - 1` before it. A record is durable once a
//! majority of the group holds it; the protocol's commit waits for exactly that, as it waits for
//! an fsync with `--durability wal`.
//!
//! A host's replicator runs on one or more of its workers (its lanes: lane `l` replicates the
//! logs whose index is `l` modulo their number), over `Kind::Service` messages and the
//! workers' timers, so the simulator drives it in virtual time and replays it from the seed.
//! The simulator gives each of a node's logs a lane, a virtual core of its own, as Rolis gives
//! each Paxos stream a thread; the real runtimes run one lane. It runs in one of two modes:
//! - [`Mode::OwnerLeads`] (the `local` runtime, where nothing can crash): only a log's owner
//!   ticks and leads its group; the followers hold the log and apply its committed records to
//!   the protocol's log state machine (the owner's node is that state). Nothing fails over.
//! - [`Mode::Failover`] (the simulator and `tcp`): every replica ticks every group it holds and applies
//!   its committed records to the protocol's log state machine ([`LogMachine`], made by the
//!   factory the replicator is given: replication never looks inside a record). When a node's host
//!   fails, the followers elect a new leader; once the new leader's log is settled (an entry of
//!   its own term committed, so every record a former leader committed is in it), it asks for
//!   the node to be rebuilt from that state and served by its host ([`AdoptRequests`]): the
//!   node's partitions, its in-doubt transactions and its coordinator decisions move with the
//!   log. A replica that loses the leadership stops proposing for the node at once; its
//!   incarnation of the node can no longer make anything durable and is replaced by the
//!   next leader's.
//!
//! Entries are framed by this layer: a tag byte, then either one of the node's records (given
//! to the machine) or a replication marker of its own (the `Takeover` that proves a new
//! leader's term, which no machine sees).

use super::applier::{Applier, Purpose, Taken};
use super::journal::{Journal, JournalOp};
use super::raft_log::{RaftConfig, RaftGroup, RaftGroups, RaftLogError, ReplicaId};
use super::store::ReplicaStore;
use crate::net::{Addr, NodeId};
use crate::rt::log::{LogMachine, NodeLog};
use crate::rt::{log_warn, CpuKind, Worker};
use crate::wal::Lsn;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

/// The group id that marks a frame as a route announcement rather than a Raft message: where
/// a node that moved to another host now listens (`host::tcp_host`). No log has this id.
pub const ROUTE_FRAME_GROUP: u32 = u32::MAX;

/// The most logs a node may keep replicated (a protocol's `logs()`); `ROUTE_FRAME_GROUP` lies
/// beyond every log's group id.
pub const MAX_LOGS_PER_NODE: u16 = 256;

/// One replicated log: log `log` of node `node`. Its Raft group id keeps the node in the low
/// 16 bits and the log index above them, so log 0 of node n is group n, as when every node
/// kept one log (journals written then read the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogId {
    pub node: NodeId,
    pub log: u16,
}

impl LogId {
    pub fn new(node: NodeId, log: u16) -> LogId {
        debug_assert!(log < MAX_LOGS_PER_NODE, "log {log} of node {node}: at most {MAX_LOGS_PER_NODE}");
        LogId { node, log }
    }

    pub fn group(self) -> u32 {
        (self.log as u32) << 16 | self.node as u32
    }

    pub fn of_group(group: u32) -> LogId {
        LogId { node: (group & 0xffff) as NodeId, log: (group >> 16) as u16 }
    }
}

impl std::fmt::Display for LogId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.log {
            0 => write!(f, "node {}'s log", self.node),
            l => write!(f, "node {}'s log {l}", self.node),
        }
    }
}

/// Handles a route announcement's payload.
pub type RouteHandler = Rc<dyn Fn(&[u8])>;

/// How often the replicator ticks (heartbeats every 2 ticks, elections after 10 to 20).
pub const TICK_US: u64 = 10_000;

/// What a Raft entry costs its replicas' CPU beyond the messages that carry it (which the
/// runtime charges as any message), charged to the lane that replicates its log; only the
/// simulator turns charges into time. Measured on this project's machine by
/// `raft_log::calibration` (three in-memory replicas; 500-byte entries ten to a round: the
/// leader 3.3 µs and each follower 1.6 µs per entry; 50 KB entries one to a round: 0.4 ns and
/// 2.1 ns more per byte, the follower decoding and storing what the leader only encodes).
mod raft_cost {
    pub const LEADER_ENTRY_NS: u64 = 3_300;
    pub const FOLLOWER_ENTRY_NS: u64 = 1_600;
    pub const LEADER_NS_PER_KIB: u64 = 400;
    pub const FOLLOWER_NS_PER_KIB: u64 = 2_100;

    pub fn leader_ns(bytes: usize) -> u64 {
        LEADER_ENTRY_NS + bytes as u64 * LEADER_NS_PER_KIB / 1024
    }

    pub fn follower_ns(bytes: usize) -> u64 {
        FOLLOWER_ENTRY_NS + bytes as u64 * FOLLOWER_NS_PER_KIB / 1024
    }
}

/// Committed entries a group keeps before it compacts its log in owner-led mode, where a
/// snapshot carries no state (the owner applies nothing, and keeps what a follower lacks).
const OWNER_LED_COMPACT_EVERY: u64 = 4096;

/// Committed bytes a group keeps before it compacts its log in owner-led mode: Rolis's batches
/// of a thousand TPC-C write sets are ~500 KB each, so 4,096 entries would hold 2 GB per log
/// (three hosts' copies of two logs grew a 3 s run past 3.6 GB, its time going to faulting in
/// fresh pages).
const OWNER_LED_COMPACT_BYTES: u64 = 32 << 20;

/// Polls' outputs held behind a full disk before the replicas give up and stop (at one poll per
/// tick and a few per batch of frames, some minutes of a full disk).
const MAX_HELD_OUTPUTS: usize = 100_000;

/// A journal is rewritten as the groups' live state once it is at least this large and twice
/// what the last rewrite left.
pub const JOURNAL_REWRITE_MIN_BYTES: u64 = 64 << 20;

/// How the replicas of a host behave; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    OwnerLeads,
    Failover,
}

/// The nodes that hold node `owner`'s log: its own host first, then its region's next ones,
/// then others' (`regions[n]`: node n's region; empty: one region).
pub fn replicas_of(owner: NodeId, nodes: u16, replicas: u16, regions: &[u16]) -> Vec<NodeId> {
    crate::cluster::placement::log_voters(owner, replicas, nodes, |n| regions.get(n as usize).copied().unwrap_or(0))
}

fn replica_id(n: NodeId) -> ReplicaId {
    n as ReplicaId + 1
}

fn node_of_replica(r: ReplicaId) -> NodeId {
    (r - 1) as NodeId
}

/// Requests from replicators to rebuild a node on their host: `(node, host)`, where `host`
/// leads the node's log with a settled log. The runtime drains them and answers with
/// [`Replicator::serve`].
pub type AdoptRequests = Rc<RefCell<Vec<(NodeId, NodeId)>>>;

/// Nodes this host served and stopped serving because another replica leads their log now: the
/// runtime stops this host's incarnation of each.
pub type Deposed = Rc<RefCell<Vec<NodeId>>>;

/// Makes a protocol's state machine of one log: fresh (`None`), or from a snapshot of one.
pub type MachineFactory =
    std::sync::Arc<dyn Fn(LogId, Option<&[u8]>) -> anyhow::Result<Box<dyn LogMachine>> + Send + Sync>;

/// What a host that leads every log of a node, each settled, rebuilds the node from: per log
/// (in log order) the snapshot of its applied state and the term this host took it over in.
#[derive(Debug, Clone)]
pub struct Adoption {
    pub snapshots: Vec<Vec<u8>>,
    pub terms: Vec<u64>,
}

/// An entry that carries one of the node's records.
pub(super) const TAG_RECORD: u8 = 0;
/// An entry that carries a new leader's `Takeover` marker (its host id): committing it proves
/// the leadership current. No protocol sees it.
const TAG_TAKEOVER: u8 = 1;
/// An entry that carries a read fence (`NodeLog::read_fence`, an empty record): committing it
/// proves that the incarnation that proposed it still led the log after the reads it fences.
/// No protocol sees it.
const TAG_FENCE: u8 = 2;
/// An entry that carries several consecutive records of the node, each behind its length (a
/// `u32`, little-endian): the replicated log's group commit. A Raft entry costs its replicas
/// some microseconds however small (`raft_cost`), so one entry per record made the replicator
/// the bottleneck of every protocol that logs a record per transaction (Primo's installs).
const TAG_RECORDS: u8 = 3;
/// An entry that carries a piece of one record too large for an entry (over [`PIECE_BYTES`]),
/// continued by the next entry; [`TAG_LAST_PIECE`] carries its last piece. One incarnation of
/// the node proposes a record's pieces as consecutive entries of one term, so any other entry
/// after a piece means that its proposer lost the log before the rest committed: the pieces are
/// dropped, as the record's loss is reported to its node (`lost`).
pub(super) const TAG_PIECE: u8 = 4;
pub(super) const TAG_LAST_PIECE: u8 = 5;
/// Most records and bytes one entry groups: well inside Raft's 1 MiB per message.
const GROUP_RECORDS: usize = 1024;
const GROUP_BYTES: usize = 256 << 10;
/// A record over this many bytes goes in pieces of this size. Raft accepts at most 1 MiB per
/// proposal (`RaftConfig::max_size_per_msg`) where a node's log takes records up to the
/// write-ahead log's limit (16 MiB): a larger record, proposed whole, was refused at every try
/// and wedged its log for good (a Calvin-family checkpoint of 2.7 MB stopped a 4-region Detock
/// run's every commit within a virtual second).
const PIECE_BYTES: usize = 512 << 10;

pub(super) fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + payload.len());
    out.push(tag);
    out.extend_from_slice(payload);
    out
}

/// The records an entry carries (none for Raft's own, a takeover marker or a fence).
fn records_of(data: &[u8]) -> Records<'_> {
    match data.split_first() {
        Some((&TAG_RECORD, record)) => Records { rest: record, one: true },
        Some((&TAG_RECORDS, grouped)) => Records { rest: grouped, one: false },
        _ => Records { rest: &[], one: false },
    }
}

struct Records<'a> {
    rest: &'a [u8],
    /// A `TAG_RECORD` entry: `rest` is the one record.
    one: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if std::mem::take(&mut self.one) {
            return Some(std::mem::take(&mut self.rest));
        }
        let (len, rest) = self.rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        // Only this replicator writes grouped entries; a short one would be a bug or another build.
        assert!(len <= rest.len(), "a grouped entry's record runs past its end");
        let (record, rest) = rest.split_at(len);
        self.rest = rest;
        Some(record)
    }
}

/// The next entry to propose from a backlog (see [`group_front`]).
struct Front {
    entry: Vec<u8>,
    /// Records it completes (taken off the backlog once proposed).
    records: usize,
    /// Bytes of the backlog's first record proposed with it, while that record goes in pieces
    /// (0 once it is whole).
    offset: usize,
}

/// Group the records at the front of `backlog` (none of them a fence) into one entry's frame,
/// within [`GROUP_RECORDS`] and [`GROUP_BYTES`]. A record alone, or a fence, is framed by itself;
/// a record over [`PIECE_BYTES`] goes as pieces, `offset` bytes of it being proposed already.
fn group_front(backlog: &VecDeque<Vec<u8>>, offset: usize) -> Front {
    let first = backlog.front().expect("a record to propose");
    if offset > 0 || first.len() > PIECE_BYTES {
        let end = (offset + PIECE_BYTES).min(first.len());
        return match end == first.len() {
            true => Front { entry: frame(TAG_LAST_PIECE, &first[offset..]), records: 1, offset: 0 },
            false => Front { entry: frame(TAG_PIECE, &first[offset..end]), records: 0, offset: end },
        };
    }
    let tag = if first.is_empty() { TAG_FENCE } else { TAG_RECORD };
    let grouped = backlog.iter().take(GROUP_RECORDS).take_while(|r| !r.is_empty());
    let mut bytes = 0;
    let n = grouped.take_while(|r| {
        bytes += 4 + r.len();
        bytes <= GROUP_BYTES
    });
    let n = n.count();
    if n <= 1 {
        return Front { entry: frame(tag, first), records: 1, offset: 0 };
    }
    let mut out = Vec::with_capacity(1 + bytes);
    out.push(TAG_RECORDS);
    for r in backlog.iter().take(n) {
        out.extend_from_slice(&(r.len() as u32).to_le_bytes());
        out.extend_from_slice(r);
    }
    Front { entry: out, records: n, offset: 0 }
}

/// Hands `apply` the records of one committed entry, in order, and returns how many. A record
/// that came in pieces is joined in `pieces` (its log's, kept between entries) and handed on
/// with its last piece; pieces that another entry follows were cut off (see [`TAG_PIECE`]).
/// Whether `data` is an entry this layer framed, or one of Raft's own empty entries (a new
/// leader's first, which carries no tag).
pub(super) fn is_framed_entry(data: &[u8]) -> bool {
    data.first().is_none_or(|tag| {
        matches!(*tag, TAG_RECORD | TAG_RECORDS | TAG_TAKEOVER | TAG_FENCE | TAG_PIECE | TAG_LAST_PIECE)
    })
}

pub(super) fn apply_records(data: &[u8], pieces: &mut Vec<u8>, mut apply: impl FnMut(&[u8])) -> usize {
    match data.split_first() {
        Some((&TAG_PIECE, piece)) => {
            pieces.extend_from_slice(piece);
            0
        }
        Some((&TAG_LAST_PIECE, piece)) if !pieces.is_empty() => {
            pieces.extend_from_slice(piece);
            apply(pieces);
            pieces.clear();
            1
        }
        Some((&TAG_LAST_PIECE, _)) => {
            // A log is compacted only between records, so a last piece always follows its first.
            debug_assert!(false, "the last piece of a record without its first");
            log_warn("replication: the last piece of a record without its first: dropped");
            0
        }
        _ => {
            if !pieces.is_empty() {
                log_warn(&format!(
                    "replication: a record cut off after {} bytes of pieces (its proposer lost the log): dropped",
                    pieces.len()
                ));
                pieces.clear();
            }
            let mut records = 0;
            for record in records_of(data) {
                apply(record);
                records += 1;
            }
            records
        }
    }
}

/// What a host's replicas are: who they are and how they keep their logs.
#[derive(Clone)]
pub struct ReplicaSetup {
    pub host: NodeId,
    /// Every frame carries it (as its service tag); a frame of another cluster is refused (a
    /// replica started over another cluster's configuration, or a stray process on a reused
    /// port).
    pub cluster_id: u64,
    pub nodes: u16,
    /// Logs per node (the protocol's `logs()`): each its own Raft group, over the same voters.
    pub logs: u16,
    pub replicas: u16,
    /// Each node's region (empty: one region): a log's voters are its region's first.
    pub regions: Vec<u16>,
    pub mode: Mode,
    pub seed: u64,
    /// Makes the protocol's state machine (fresh, or from a snapshot's data).
    pub new_machine: MachineFactory,
    /// Failover mode: committed entries between snapshots of the applied state (then the log
    /// is compacted up to the snapshot).
    pub snapshot_every: u64,
    /// Failover mode: also snapshot once the entries committed since the last snapshot hold at
    /// least this many bytes and as many as that snapshot. A restarted host then replays at
    /// most about this much of the log, and serializing the state costs no more than writing
    /// the log did (the rule of Redis's log rewrite). Without it, a list-append run (whose
    /// records carry whole lists) grew a journal past 100 MB in a minute before
    /// `snapshot_every` entries came, and a killed server took up to 24 s to come back.
    pub snapshot_log_bytes: u64,
    /// The least size at which the journal is rewritten ([`JOURNAL_REWRITE_MIN_BYTES`]).
    pub journal_rewrite_bytes: u64,
    /// Raft frames over this go as fragments ([`RaftConfig::fragment_bytes`]; the same at
    /// every host of a cluster).
    pub fragment_bytes: u64,
    /// Failover mode: for this long after its replicator starts, a replica of a log another
    /// host owns does not campaign while the log has had no election (term 0), so that the
    /// owner, which campaigns at once, leads its own logs. 0 in `sim`, whose hosts start in
    /// one instant; `tcp` servers start their clients with their replicas, and an owner whose
    /// first pre-vote timed out on busy cores lost its logs to another server in runs without
    /// any fault (a takeover at the start of the run).
    pub first_election_grace_us: u64,
    /// Ticks a follower waits without hearing from its leader before it campaigns
    /// ([`RaftConfig::election_ticks`]; failover mode).
    pub election_ticks: usize,
    /// Whether the state machines run on a thread of their own rather than on the replicator's
    /// lanes ([`super::applier`]): on `tcp`, so that replay never silences a leader's
    /// heartbeats; not in `sim`, whose machines run in virtual time.
    pub apply_on_thread: bool,
}

/// A host's replicas of the logs it is a voter of: Raft's hard state and log per group, kept
/// durable by the host's [`Journal`] (when it has one: the `local` runtime's owner-led replicas,
/// which never crash, keep theirs in memory), and, in failover mode, what each group's
/// committed records amount to (derived from that log, rebuilt from it at a reopen).
pub struct ReplicaState {
    setup: ReplicaSetup,
    host: NodeId,
    cluster_id: u64,
    mode: Mode,
    groups: RaftGroups<ReplicaStore>,
    /// The protocol's state machines over each group's committed records (failover mode;
    /// owner-led, the logs this host follows).
    applier: Applier,
    /// Per group, where its log was last compacted, and what it applied since.
    compacted: FxHashMap<u32, Compacted>,
    /// The groups whose last applied entry is a piece of a record whose last piece has not
    /// committed yet (see [`TAG_PIECE`]): their log is not compacted meanwhile, so that a
    /// snapshot falls between records.
    mid_record: FxHashSet<u32>,
    /// Groups whose machine was asked for a snapshot to compact the log at.
    compacting: FxHashSet<u32>,
    /// Per group, the snapshot taken for a node's adoption (its index, its data), and the
    /// groups one was asked for.
    adoption_snapshots: FxHashMap<u32, (u64, Vec<u8>)>,
    adopting: FxHashSet<u32>,
    /// Whether a replicator ran over this state before (the first one campaigns at once).
    started: bool,
    journal: Option<Journal>,
    /// Groups whose applied state is too large to snapshot (warned once each).
    too_large_to_snapshot: FxHashSet<u32>,
    pub stats: ReplicaStats,
}

/// A group's last compaction (its snapshot, taken here or installed from the leader), and the
/// entries applied since (failover mode), which decide the next one.
#[derive(Debug, Clone, Copy, Default)]
struct Compacted {
    /// The index the log was compacted to.
    index: u64,
    /// The size of the snapshot's data.
    snapshot_bytes: u64,
    /// Bytes of the entries applied since.
    log_bytes: u64,
}

impl Compacted {
    fn at(index: u64, snapshot_bytes: u64) -> Compacted {
        Compacted { index, snapshot_bytes, log_bytes: 0 }
    }
}

/// What a host's replicas did, for the report's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicaStats {
    /// Snapshots of the applied state taken, and logs compacted after them.
    pub snapshots_taken: u64,
    /// Snapshots received from a leader and installed (the replica lacked compacted entries).
    pub snapshots_installed: u64,
    /// Times the journal was rewritten as the live state.
    pub journal_rewrites: u64,
    /// Journal records replayed when the replicas were reopened.
    pub journal_records_replayed: u64,
    /// Records proposed in pieces, each too large for one entry ([`PIECE_BYTES`]).
    pub records_in_pieces: u64,
}

impl ReplicaStats {
    pub fn add(&mut self, o: &ReplicaStats) {
        self.snapshots_taken += o.snapshots_taken;
        self.snapshots_installed += o.snapshots_installed;
        self.journal_rewrites += o.journal_rewrites;
        self.journal_records_replayed += o.journal_records_replayed;
        self.records_in_pieces += o.records_in_pieces;
    }

    /// As named counters (the report shows them per committed transaction).
    pub fn counters(&self) -> [(&'static str, u64); 5] {
        [
            ("raft-snapshots-taken", self.snapshots_taken),
            ("raft-snapshots-installed", self.snapshots_installed),
            ("raft-journal-rewrites", self.journal_rewrites),
            ("raft-journal-records-replayed", self.journal_records_replayed),
            ("raft-records-in-pieces", self.records_in_pieces),
        ]
    }
}

impl ReplicaState {
    /// Fresh replicas of every log `setup.host` is a voter of, journaled to `journal` (empty).
    pub fn new(setup: ReplicaSetup, journal: Option<Journal>) -> Result<Self, RaftLogError> {
        let mut state = ReplicaState::empty(setup, journal);
        for (owner, voters) in state.voted_groups() {
            let store = match state.journal {
                Some(_) => ReplicaStore::new(owner, &voters),
                None => ReplicaStore::new(owner, &voters).unjournaled(),
            };
            let group = state.open_group(owner, &voters, store, 0)?;
            state.groups.add(group)?;
        }
        // The membership is fixed by the configuration, not journaled; the first sync makes
        // the empty hard states durable.
        state.persist().map_err(|e| RaftLogError::Storage(e.to_string()))?;
        Ok(state)
    }

    /// The replicas as `journal` (reopened, with its `ops`) left them: every group's log, hard
    /// state and snapshot, and in failover mode its state machine rebuilt from the snapshot
    /// and the committed entries after it. The replicas rejoin their groups as followers.
    pub fn reopen(setup: ReplicaSetup, journal: Journal, ops: Vec<JournalOp>) -> anyhow::Result<Self> {
        let mut state = ReplicaState::empty(setup, Some(journal));
        state.started = true;
        state.stats.journal_records_replayed = ops.len() as u64;
        let mut stores: FxHashMap<u32, ReplicaStore> = Default::default();
        for (owner, voters) in state.voted_groups() {
            stores.insert(owner, ReplicaStore::new(owner, &voters));
        }
        for op in ops {
            let group = journal_op_group(&op);
            let store = stores.get_mut(&group).ok_or_else(|| {
                anyhow::anyhow!("the Raft journal has an op of log {group}, which this host holds no replica of")
            })?;
            store.replay(op)?;
        }
        for (owner, voters) in state.voted_groups() {
            let store = stores.remove(&owner).expect("a store per voted group");
            let commit = raft::Storage::initial_state(&store).map_err(|e| anyhow::anyhow!("{e}"))?.hard_state.commit;
            if state.mode == Mode::Failover {
                let (machine, pieces) =
                    rebuild_machine(&state.setup.new_machine, LogId::of_group(owner), &store, commit)
                        .map_err(|e| anyhow::anyhow!("{}: {e:#}", LogId::of_group(owner)))?;
                if !pieces.is_empty() {
                    state.mid_record.insert(owner);
                }
                state.applier.restore(owner, commit, machine, pieces);
            }
            // What the log holds since its snapshot counts towards the next compaction, as if
            // applied since: counted from 0 at every reopen, a log whose host crashed before it
            // had applied `snapshot_log_bytes` was never compacted, and its entries, and the
            // journal that holds them, grew with the run's commits (a Primo run whose hosts
            // crashed every second or so took no snapshot in 5 s at a 1 MiB threshold; 42 now).
            let (log_bytes, snapshot_bytes) = store.held_bytes_up_to(commit)?;
            state.compacted.insert(owner, Compacted { index: store.snapshot_index(), snapshot_bytes, log_bytes });
            let group = state.open_group(owner, &voters, store, commit)?;
            state.groups.add(group)?;
        }
        Ok(state)
    }

    fn empty(setup: ReplicaSetup, journal: Option<Journal>) -> Self {
        ReplicaState {
            host: setup.host,
            cluster_id: setup.cluster_id,
            mode: setup.mode,
            groups: RaftGroups::default(),
            applier: new_applier(&setup),
            compacted: Default::default(),
            mid_record: Default::default(),
            compacting: Default::default(),
            adoption_snapshots: Default::default(),
            adopting: Default::default(),
            started: false,
            journal,
            too_large_to_snapshot: Default::default(),
            stats: ReplicaStats::default(),
            setup,
        }
    }

    /// The logs this host holds a replica of, with their voters: every log of a node has the
    /// node's voters, so that one host can lead them all.
    fn voted_groups(&self) -> Vec<(u32, Vec<ReplicaId>)> {
        let (nodes, replicas, host, regions) = (self.setup.nodes, self.setup.replicas, self.host, &self.setup.regions);
        let logs = self.setup.logs.max(1);
        (0..nodes)
            .map(|n| (n, replicas_of(n, nodes, replicas, regions)))
            .filter(|(_, voters)| voters.contains(&host))
            .flat_map(|(n, voters)| {
                let voters: Vec<ReplicaId> = voters.into_iter().map(replica_id).collect();
                (0..logs).map(move |l| (LogId::new(n, l).group(), voters.clone()))
            })
            .collect()
    }

    fn open_group(
        &self,
        owner: u32,
        voters: &[ReplicaId],
        store: ReplicaStore,
        applied_index: u64,
    ) -> Result<RaftGroup<ReplicaStore>, RaftLogError> {
        // Owner-led: only the owner ticks, so it must not step down when it loses touch with a
        // majority (check-quorum): nobody else would take over, and followers that do not tick
        // would refuse its votes forever. In failover mode everyone ticks, and a leader cut off
        // from its followers must step down so that they can elect one they reach.
        let cfg = RaftConfig {
            check_quorum: self.mode == Mode::Failover,
            fragment_bytes: self.setup.fragment_bytes,
            election_ticks: self.setup.election_ticks,
            ..RaftConfig::default()
        };
        let seed = self.setup.seed ^ ((owner as u64) << 17);
        RaftGroup::with_store(owner, replica_id(self.host), voters, &cfg, seed, store, applied_index)
    }

    /// Makes what the groups changed durable: their ops go to the journal (rewritten as the
    /// live state once it grew large), then one fsync. Nothing a change implies may leave the
    /// process before this returns.
    fn persist(&mut self) -> Result<(), super::journal::JournalError> {
        let Some(journal) = self.journal.as_mut() else { return Ok(()) };
        let ids: Vec<u32> = self.groups.group_ids().collect();
        for id in &ids {
            let group = self.groups.get_mut(*id).expect("a listed group");
            for op in group.store_mut().take_unjournaled() {
                journal.write(&op);
            }
        }
        // The next rewrite once the journal is twice what the last one left, and not while one
        // is under way (a file journal's runs on a thread of its own: `Journal::rewrite`).
        let rewrite_at_bytes = self.setup.journal_rewrite_bytes.max(2 * journal.rewritten_len_bytes());
        if !journal.rewriting() && journal.len_bytes() >= rewrite_at_bytes {
            let mut live = Vec::new();
            for id in &ids {
                let store = self.groups.get(*id).expect("a listed group").store();
                live.extend(store.live_ops().map_err(|e| super::journal::JournalError {
                    path: journal.path(),
                    reason: format!("cannot list log {id}'s live state: {e}"),
                    disk_full: false,
                })?);
            }
            journal.rewrite(live);
            self.stats.journal_rewrites += 1;
        }
        journal.sync()
    }

    /// Snapshot and compact every group `of` selects that applied `snapshot_every` entries
    /// since its last compaction (failover: with the applied state, asked of its machine, which
    /// answers at once inline and at a later pump on a thread; owner-led: the log alone).
    fn compact(&mut self, of: impl Fn(u32) -> bool) {
        let every = match self.mode {
            Mode::Failover => self.setup.snapshot_every.max(1),
            Mode::OwnerLeads => OWNER_LED_COMPACT_EVERY,
        };
        let ids: Vec<u32> = self.groups.group_ids().filter(|&g| of(g)).collect();
        for id in ids {
            let g = self.groups.get(id).expect("a listed group");
            let applied = g.applied_index();
            let last = self.compacted.get(&id).copied().unwrap_or_default();
            let log_large = match self.mode {
                Mode::Failover => last.log_bytes >= self.setup.snapshot_log_bytes.max(last.snapshot_bytes),
                Mode::OwnerLeads => last.log_bytes >= OWNER_LED_COMPACT_BYTES,
            };
            if (applied < last.index + every && !log_large) || self.mid_record.contains(&id) {
                continue;
            }
            match self.mode {
                Mode::OwnerLeads => self.compact_at(id, applied, Vec::new()),
                Mode::Failover if self.compacting.insert(id) => self.applier.snapshot(id, Purpose::Compact),
                Mode::Failover => {}
            }
        }
        self.pick_up_snapshots();
    }

    /// Take what the machines' snapshots were asked for: compact a log at its own, keep one for
    /// an adoption.
    fn pick_up_snapshots(&mut self) {
        for Taken { group, index, purpose, data } in self.applier.take_snapshots() {
            match purpose {
                Purpose::Compact => {
                    self.compacting.remove(&group);
                    self.compact_at(group, index, data);
                }
                Purpose::Adopt => {
                    self.adopting.remove(&group);
                    self.adoption_snapshots.insert(group, (index, data));
                }
            }
        }
    }

    /// Compact `group`'s log at `index`, the applied state there being `data` (failover mode).
    fn compact_at(&mut self, id: u32, index: u64, data: Vec<u8>) {
        let Some(g) = self.groups.get(id) else { return };
        // A leader's snapshot installed while the machine took this one covers more.
        if index <= g.store().snapshot_index() && index > 0 {
            return;
        }
        let Some(term) = g.term_of(index) else { return };
        let last = self.compacted.get(&id).copied().unwrap_or_default();
        self.compacted.insert(id, Compacted::at(index, data.len() as u64));
        if data.len() as u64 > RaftConfig::default().max_snapshot_bytes {
            if self.too_large_to_snapshot.insert(id) {
                log_warn(&format!(
                    "replication: host {}: log {id}'s applied state is {} bytes, over the snapshot limit of {}: \
                     the log is not compacted (it grows with the run)",
                    self.host,
                    data.len(),
                    RaftConfig::default().max_snapshot_bytes
                ));
            }
            return;
        }
        let mode = self.mode;
        let g = self.groups.get_mut(id).expect("a listed group");
        // A leader keeps, back to its previous compaction, what a follower still lacks: one
        // a WAN away, or behind on its own work, goes on from entries rather than a snapshot
        // of the whole state (TiKV compacts alike, to the slowest follower's match within a
        // limit). A crashed follower holds back at most one compaction's entries. Raft sends
        // from index i + 1 with i's term, so i stays.
        //
        // Owner-led, the leader applies nothing and its snapshots carry no state, so it keeps
        // everything a follower still lacks: a follower applies every entry, and one it
        // lacked behind a compaction would leave its state short.
        let keep_from = match (mode, g.slowest_follower_match()) {
            (_, None) => index,
            (Mode::OwnerLeads, Some(m)) => m.min(index),
            (Mode::Failover, Some(m)) => m.clamp(last.index, index),
        };
        g.store_mut().set_snapshot(index, term, data);
        g.compact(keep_from);
        self.stats.snapshots_taken += 1;
    }
}

impl ReplicaState {
    /// Each of this host's machines' applied watermark, where its machine keeps one
    /// ([`LogMachine::applied_watermark_us`]).
    pub fn applied_watermarks_us(&self) -> Vec<u64> {
        self.applier.watermarks_us()
    }

    /// What the state machines of this host's replicas count, summed over its logs by name.
    pub fn machine_counters(&self) -> Vec<(&'static str, u64)> {
        let mut sums: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for (name, n) in self.applier.counters() {
            *sums.entry(name).or_default() += n;
        }
        sums.into_iter().collect()
    }

    /// Per group this host is a voter of, the committed entries its replica still holds, for
    /// the check that every replica of a log holds the same committed entries.
    pub fn committed_logs(&self) -> Vec<(u32, Vec<super::journal::JournalEntry>)> {
        self.groups
            .group_ids()
            .filter_map(|g| {
                let group = self.groups.get(g)?;
                Some((g, group.store().entries_up_to(group.commit_index()).ok()?))
            })
            .collect()
    }

    /// Whether this host applies `group`'s committed records to the protocol's machine: every
    /// replica does in failover mode; owner-led, every follower does (a replica keeps the state
    /// its log describes, as Rolis's followers replay), and the owner, whose node is that state,
    /// does not.
    fn applies(&self, group: u32) -> bool {
        self.mode == Mode::Failover || LogId::of_group(group).node != self.host
    }

    /// The groups of `node`'s logs, log 0 first.
    fn groups_of(&self, node: NodeId) -> impl Iterator<Item = u32> {
        (0..self.setup.logs.max(1)).map(move |l| LogId::new(node, l).group())
    }
}

/// A host's state machines, on their own thread if its setup says so (a thread that cannot be
/// started leaves them on the replicator's lanes, which is said).
fn new_applier(setup: &ReplicaSetup) -> Applier {
    if setup.apply_on_thread {
        match Applier::on_thread(setup.new_machine.clone(), setup.host) {
            Ok(a) => return a,
            Err(e) => log_warn(&format!(
                "replication: host {}: no applier thread ({e}): its replicas apply on the replication thread",
                setup.host
            )),
        }
    }
    Applier::inline(setup.new_machine.clone())
}

fn journal_op_group(op: &JournalOp) -> u32 {
    match op {
        JournalOp::Append { group, .. }
        | JournalOp::HardState { group, .. }
        | JournalOp::Snapshot { group, .. }
        | JournalOp::Compact { group, .. }
        | JournalOp::SnapshotPart { group, .. } => *group,
    }
}

/// A group's state machine at its commit index: from its snapshot, then its committed entries;
/// with the pieces of a record whose last piece is not committed yet.
fn rebuild_machine(
    new_machine: &MachineFactory,
    log: LogId,
    store: &ReplicaStore,
    commit: u64,
) -> anyhow::Result<(Box<dyn LogMachine>, Vec<u8>)> {
    let snapshot_index = store.snapshot_index();
    let mut machine = match snapshot_index {
        0 => new_machine(log, None)?,
        _ => new_machine(
            log,
            Some(raft::Storage::snapshot(store, 0, 0).map_err(|e| anyhow::anyhow!("{e}"))?.get_data()),
        )?,
    };
    let mut pieces = Vec::new();
    if commit > snapshot_index {
        let ctx = raft::GetEntriesContext::empty(false);
        let entries = raft::Storage::entries(store, snapshot_index + 1, commit + 1, None, ctx)
            .map_err(|e| anyhow::anyhow!("the committed entries after the snapshot at {snapshot_index}: {e}"))?;
        for e in entries {
            apply_records(&e.data, &mut pieces, |record| machine.apply(record));
        }
    }
    Ok((machine, pieces))
}

/// A log this host leads and proposes for: the records one incarnation of a node appends.
struct Served {
    log: Arc<NodeLog>,
    /// The term this host first led the log in while serving it (None: not leading yet).
    led_term: Option<u64>,
    /// Taken from the log and not yet accepted by Raft (not leader yet, or back-pressure).
    backlog: VecDeque<Vec<u8>>,
    /// Bytes of the backlog's first record already proposed, while it goes in pieces.
    front_offset: usize,
    /// The LSN of the last record taken from the log.
    taken: Lsn,
    /// Proposed, not yet committed: `(raft index, raft term, LSN)`.
    inflight: VecDeque<(u64, u64, Lsn)>,
}

impl Served {
    fn new(log: Arc<NodeLog>) -> Self {
        Served { log, led_term: None, backlog: VecDeque::new(), front_offset: 0, taken: 0, inflight: VecDeque::new() }
    }
}

/// A host's replicator: the volatile side (what it proposes for whom); its Raft state lives in
/// a [`ReplicaState`] that outlives it.
pub struct Replicator {
    /// The workers its lanes run on (lane `l` replicates the logs whose index is `l` modulo
    /// their number; [`Replicator::lane_of`]).
    lanes: Vec<Rc<Worker>>,
    state: Rc<RefCell<ReplicaState>>,
    /// Per group: the logs of the nodes this host serves (every log of a node, or none).
    served: FxHashMap<u32, Served>,
    /// Nodes whose adoption was asked for and not yet answered.
    requested: FxHashSet<NodeId>,
    /// Per group led but not served: the term of the `Takeover` record proposed in it.
    takeover_term: FxHashMap<u32, u64>,
    adopt: Option<AdoptRequests>,
    deposed: Option<Deposed>,
    /// False once the host crashed: the replicator does nothing more.
    alive: bool,
    /// Per lane, its loop's waker, to pick up a log served from now on.
    loop_wakers: Vec<Option<Waker>>,
    /// Per lane, what its polls produced and its next sync has not released yet (a full disk
    /// holds it, in order, until a sync succeeds; nothing of it leaves the process before).
    held: Vec<Vec<(u32, super::raft_log::Output)>>,
    /// When the journal first refused a sync for a full disk (None: it is not refusing).
    held_since_ns: Option<u64>,
    /// Per lane, frames were stepped since its last pump: the lane pumps once for all of them
    /// (one journal sync per batch of frames, not per frame).
    stepped: Vec<bool>,
    /// Senders whose frames were refused (reported once each).
    refused_from: FxHashSet<Addr>,
    on_route: Option<RouteHandler>,
    /// Until then (the lanes' clock, ns), replicas of other hosts' logs that have had no
    /// election do not tick ([`ReplicaSetup::first_election_grace_us`]).
    grace_until_ns: u64,
    /// Per lane, when the owner's logs that know no leader yet campaign again, while the grace
    /// lasts ([`FIRST_CAMPAIGN_RETRY_NS`]).
    campaign_again_ns: Vec<u64>,
}

/// While the first election's grace lasts, an owner's log that knows no leader campaigns again
/// this often. Its first campaign goes out as the servers start, and one whose pre-vote found
/// the other servers not listening yet would otherwise wait an election timeout (1-2 s on `tcp`)
/// with its node unserved.
const FIRST_CAMPAIGN_RETRY_NS: u64 = 100_000_000;

pub type ReplicatorHandle = Rc<RefCell<Replicator>>;

/// Start a replicator over `state` with a lane on each of `lanes` (every host of a cluster
/// gives it the same number: a lane's frames go to the same lane's worker elsewhere);
/// `own_logs` are the logs of the node this host starts out serving (its own; every one of
/// them, or none); `adopt` receives failover requests (failover mode).
pub fn start(
    lanes: &[Rc<Worker>],
    state: Rc<RefCell<ReplicaState>>,
    own_logs: Vec<Arc<NodeLog>>,
    adopt: Option<AdoptRequests>,
) -> Result<ReplicatorHandle, RaftLogError> {
    assert!(!lanes.is_empty(), "a replicator runs on one lane at least");
    let host = state.borrow().host;
    let mut served = FxHashMap::default();
    for (l, log) in own_logs.into_iter().enumerate() {
        served.insert(LogId::new(host, l as u16).group(), Served::new(log));
    }
    let first = !std::mem::replace(&mut state.borrow_mut().started, true);
    let grace_us = if first { state.borrow().setup.first_election_grace_us } else { 0 };
    if first {
        let mut st = state.borrow_mut();
        let own: Vec<u32> = st.groups_of(host).collect();
        for group in own {
            if let Some(g) = st.groups.get_mut(group) {
                g.campaign()?;
            }
        }
    }
    let r = Rc::new(RefCell::new(Replicator {
        lanes: lanes.to_vec(),
        state,
        served,
        requested: Default::default(),
        takeover_term: Default::default(),
        adopt,
        deposed: None,
        alive: true,
        loop_wakers: vec![None; lanes.len()],
        held: (0..lanes.len()).map(|_| Vec::new()).collect(),
        held_since_ns: None,
        stepped: vec![false; lanes.len()],
        refused_from: Default::default(),
        on_route: None,
        grace_until_ns: lanes[0].now_ns() + grace_us * 1000,
        campaign_again_ns: vec![lanes[0].now_ns() + FIRST_CAMPAIGN_RETRY_NS; lanes.len()],
    }));
    r.borrow_mut().pump();
    for (lane, w) in lanes.iter().enumerate() {
        set_frame_handler(w, &r);
        w.spawn(run(r.clone(), lane));
    }
    Ok(r)
}

/// Frames that reach `w` are stepped into the replicas, and wake the lane of their log.
fn set_frame_handler(w: &Rc<Worker>, r: &ReplicatorHandle) {
    let handler_r = Rc::downgrade(r);
    w.set_service_handler(Rc::new(move |from: Addr, tag: u64, frame: &[u8]| {
        let Some(r) = handler_r.upgrade() else { return };
        let mut me = r.borrow_mut();
        if !me.alive {
            return;
        }
        let cluster_id = me.state.borrow().cluster_id;
        if check_cluster(tag, cluster_id).is_ok()
            && super::raft_log::frame_group_id(frame).is_ok_and(|g| g == ROUTE_FRAME_GROUP)
        {
            if let Some(f) = me.on_route.clone() {
                drop(me);
                f(&frame[super::raft_log::FRAME_HEADER_BYTES.min(frame.len())..]);
            }
            return;
        }
        let stepped = check_cluster(tag, cluster_id)
            .and_then(|()| me.state.borrow_mut().groups.step(replica_id(from.node), frame).map_err(|e| e.to_string()));
        if let Err(e) = stepped {
            if me.refused_from.insert(from) {
                log_warn(&format!("replication: a frame from {from} was refused (further ones are not reported): {e}"));
            }
            return;
        }
        let lane = super::raft_log::frame_group_id(frame).map_or(0, |g| me.lane_of(g));
        me.wake_lane(lane);
    }));
}

/// The replicator's loop: propose what the served logs appended, tick on time, send what Raft
/// says.
async fn run(r: ReplicatorHandle, lane: usize) {
    let w = r.borrow().lanes[lane].clone();
    let mut next_tick_ns = w.now_ns() + TICK_US * 1000;
    loop {
        // A deadline, not a duration: rounding a duration down could wake the loop just before
        // the tick is due, again and again, without virtual time moving on.
        let mut sleep = w.sleep_until_ns(next_tick_ns);
        let alive = std::future::poll_fn(|cx| {
            let mut me = r.borrow_mut();
            if !me.alive {
                return Poll::Ready(false);
            }
            me.loop_wakers[lane] = Some(cx.waker().clone());
            if me.take_appended(lane, cx.waker()) || std::mem::take(&mut me.stepped[lane]) {
                return Poll::Ready(true);
            }
            drop(me);
            Pin::new(&mut sleep).poll(cx).map(|()| true)
        })
        .await;
        if !alive {
            return;
        }
        let sent_early = {
            let mut me = r.borrow_mut();
            if w.now_ns() >= next_tick_ns {
                me.tick(lane);
                next_tick_ns = w.now_ns() + TICK_US * 1000;
            }
            me.propose_backlogs(lane);
            me.pump_begin(lane)
        };
        if sent_early {
            // The frames go out at the end of this step of the worker; the sync waits for the
            // next (a timer due at once fires after the step's sends).
            w.sleep_until_ns(w.now_ns() + 1).await;
        }
        r.borrow_mut().pump_finish(lane);
    }
}

impl Replicator {
    /// The lane that replicates `group`'s log.
    fn lane_of(&self, group: u32) -> usize {
        LogId::of_group(group).log as usize % self.lanes.len()
    }

    /// Have lane `lane` pump at its next turn.
    fn wake_lane(&mut self, lane: usize) {
        self.stepped[lane] = true;
        if let Some(w) = self.loop_wakers[lane].take() {
            w.wake();
        }
    }

    /// The host crashed: this replicator does nothing more (its state stays for the next).
    pub fn stop(&mut self) {
        self.alive = false;
        self.served.clear();
    }

    /// Serve `node` from now on: propose the records each of `logs` appends to its group.
    /// `terms` are the terms its logs' states were taken in ([`Replicator::adoptable_state`]).
    /// If this replica no longer leads one of the logs in that term (it lost the lead while the
    /// node was rebuilt, perhaps winning a later election meanwhile), the rebuilt incarnation is
    /// stale (the log may hold records it never applied): it is refused, reported deposed so
    /// that the host stops it, and the node is asked for again. Returns whether it is served.
    pub fn serve(&mut self, node: NodeId, logs: Vec<Arc<NodeLog>>, terms: &[u64]) -> bool {
        self.requested.remove(&node);
        let groups: Vec<u32> = self.state.borrow().groups_of(node).collect();
        assert_eq!(logs.len(), groups.len(), "node {node} is served with every one of its logs");
        for (&group, &term) in groups.iter().zip(terms) {
            let leads_in = self.state.borrow().groups.get(group).filter(|g| g.is_leader()).map(|g| g.term());
            if leads_in != Some(term) {
                log_warn(&format!(
                    "replication: host {}: node {node} was rebuilt from {} as of term {term}, but this replica {}: \
                     that incarnation is stopped",
                    self.state.borrow().host,
                    LogId::of_group(group),
                    match leads_in {
                        Some(t) => format!("leads it in term {t} now"),
                        None => "no longer leads it".to_string(),
                    }
                ));
                if let Some(q) = &self.deposed {
                    q.borrow_mut().push(node);
                }
                return false;
            }
        }
        for ((group, log), &term) in groups.into_iter().zip(logs).zip(terms) {
            let mut served = Served::new(log);
            served.led_term = Some(term);
            self.served.insert(group, served);
        }
        for w in self.loop_wakers.iter_mut().filter_map(Option::take) {
            w.wake();
        }
        true
    }

    /// Route announcements from other hosts go to `f` (their payload, past the frame header).
    pub fn set_route_handler(&mut self, f: RouteHandler) {
        self.on_route = Some(f);
    }

    /// Send a route announcement (`payload`) to every other host's replicas.
    pub fn announce_route(&self, payload: &[u8], hosts: u16) {
        let mut frame = Vec::with_capacity(super::raft_log::FRAME_HEADER_BYTES + payload.len());
        frame.extend_from_slice(&ROUTE_FRAME_GROUP.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(payload);
        let (me, cluster_id) = {
            let st = self.state.borrow();
            (st.host, st.cluster_id)
        };
        for h in (0..hosts).filter(|&h| h != me) {
            self.lanes[0].send_service(Addr::new(h, self.lanes[0].addr.worker), cluster_id, &frame);
        }
    }

    /// What this host's replicas did since they were opened in this process.
    pub fn stats(&self) -> ReplicaStats {
        self.state.borrow().stats
    }

    /// What the state machines of this host's replicas count ([`LogMachine::counters`]).
    pub fn machine_counters(&self) -> Vec<(&'static str, u64)> {
        self.state.borrow().machine_counters()
    }

    /// Each of this host's machines' applied watermark, where its machine keeps one.
    pub fn applied_watermarks_us(&self) -> Vec<u64> {
        self.state.borrow().applied_watermarks_us()
    }

    /// Tell `queue` of every node this host stops serving because it lost the node's log.
    pub fn report_deposed(&mut self, queue: Deposed) {
        self.deposed = Some(queue);
    }

    /// Stop proposing for the incarnation on this host of the node whose log `group` is: it
    /// can make nothing durable any more in that log (another replica leads, or our proposals
    /// were overwritten), and a node's logs fail over together.
    fn depose(&mut self, group: u32) {
        let node = LogId::of_group(group).node;
        if self.stop_serving(node) {
            if let Some(q) = &self.deposed {
                q.borrow_mut().push(node);
            }
        }
    }

    /// Stop proposing for every log of `node`; returns whether this host served it.
    fn stop_serving(&mut self, node: NodeId) -> bool {
        let groups: Vec<u32> = self.state.borrow().groups_of(node).collect();
        let removed = groups.into_iter().filter(|g| self.served.remove(g).is_some()).count();
        removed > 0
    }

    /// Another host took `node` over: stop proposing for the incarnation this host served.
    pub fn forget(&mut self, node: NodeId) {
        self.stop_serving(node);
    }

    /// The runtime could not take `node` over now: ask again when its logs are settled.
    pub fn adoption_refused(&mut self, node: NodeId) {
        self.requested.remove(&node);
    }

    /// What `node` recovers from, if this host may take it over now: it is alive and, for every
    /// one of the node's logs, leads it with a settled log in the term of its `Takeover` record,
    /// its machine has applied every committed record, and that state has been taken (inline
    /// at once; on a thread, the first call asks for it and a later one finds it).
    pub fn adoptable_state(&mut self, node: NodeId) -> Option<Adoption> {
        let mut st = self.state.borrow_mut();
        if !self.alive || st.mode != Mode::Failover {
            return None;
        }
        let groups: Vec<u32> = st.groups_of(node).collect();
        let mut at = Vec::new();
        for &group in &groups {
            let g = st.groups.get(group)?;
            // The state machine, not the group: the group hands out entries before the machine
            // applies them (at the sync after a poll, or later on the applier's thread).
            let ready = !self.served.contains_key(&group)
                && self.takeover_term.get(&group) == Some(&g.term())
                && g.leads_with_settled_log()
                && st.applier.applied_index(group) >= g.commit_index();
            if !ready {
                return None;
            }
            at.push((g.term(), g.commit_index()));
        }
        for (&group, &(_, commit)) in groups.iter().zip(&at) {
            let taken = st.adoption_snapshots.get(&group).is_some_and(|&(index, _)| index == commit);
            if !taken && st.adopting.insert(group) {
                st.applier.snapshot(group, Purpose::Adopt);
            }
        }
        st.pick_up_snapshots();
        let mut adoption = Adoption { snapshots: Vec::new(), terms: Vec::new() };
        for (&group, &(term, commit)) in groups.iter().zip(&at) {
            match st.adoption_snapshots.get(&group) {
                Some((index, _)) if *index == commit => adoption.terms.push(term),
                _ => return None,
            }
        }
        for group in &groups {
            let (_, data) = st.adoption_snapshots.remove(group).expect("checked above");
            adoption.snapshots.push(data);
        }
        Some(adoption)
    }

    /// Take what lane `lane`'s served logs appended since the last look; `waker` hears of the
    /// next.
    fn take_appended(&mut self, lane: usize, waker: &Waker) -> bool {
        let mut any = false;
        let lanes = self.lanes.len();
        let in_lane = |g: u32| LogId::of_group(g).log as usize % lanes == lane;
        for (_, s) in self.served.iter_mut().filter(|(g, _)| in_lane(**g)) {
            let taken = s.log.take_for_replication(waker);
            if !taken.is_empty() {
                s.taken += taken.len() as Lsn;
                s.backlog.extend(taken);
                any = true;
            }
        }
        any
    }

    /// Tick lane `lane`'s groups (owner-led: only those of this host's own node).
    fn tick(&mut self, lane: usize) {
        let mut st = self.state.borrow_mut();
        let in_grace = self.lanes[lane].now_ns() < self.grace_until_ns;
        let host = st.host;
        let ticked: Vec<u32> = match st.mode {
            Mode::Failover => st
                .groups
                .group_ids()
                .filter(|&g| {
                    let waits = in_grace && LogId::of_group(g).node != host;
                    !waits || st.groups.get(g).is_some_and(|r| r.term() > 0)
                })
                .collect(),
            Mode::OwnerLeads => st.groups_of(host).collect(),
        };
        for group in ticked.into_iter().filter(|&g| self.lane_of(g) == lane) {
            if let Some(g) = st.groups.get_mut(group) {
                g.tick();
            }
        }
        let now_ns = self.lanes[lane].now_ns();
        if in_grace && st.mode == Mode::Failover && now_ns >= self.campaign_again_ns[lane] {
            self.campaign_again_ns[lane] = now_ns + FIRST_CAMPAIGN_RETRY_NS;
            let own: Vec<u32> = st.groups_of(host).filter(|&g| self.lane_of(g) == lane).collect();
            for group in own {
                if let Some(g) = st.groups.get_mut(group).filter(|g| g.leader().is_none()) {
                    // A failed campaign is a group's failure, which its next poll reports.
                    let _ = g.campaign();
                }
            }
        }
    }

    /// Hand each of lane `lane`'s backlogs to its group, in order, until the group refuses one.
    fn propose_backlogs(&mut self, lane: usize) {
        let mut st = self.state.borrow_mut();
        if st.applier.backlog_bytes() > super::applier::MAX_APPLY_BACKLOG_BYTES {
            // The machines trail too far: the writers wait (at most a tick) rather than the
            // replay growing without bound.
            return;
        }
        let w = &self.lanes[lane];
        let lanes = self.lanes.len();
        let mut in_pieces = 0;
        for (&group, s) in self.served.iter_mut().filter(|(g, _)| LogId::of_group(**g).log as usize % lanes == lane) {
            let Some(g) = st.groups.get_mut(group) else { continue };
            let mut lsn = s.taken - s.backlog.len() as Lsn;
            while !s.backlog.is_empty() {
                let front = group_front(&s.backlog, s.front_offset);
                let (bytes, last_piece) = (front.entry.len(), front.entry[0] == TAG_LAST_PIECE);
                match g.propose(front.entry) {
                    Ok(()) => {
                        w.charge(CpuKind::Raft, raft_cost::leader_ns(bytes));
                        // A piece before a record's last makes nothing more durable.
                        lsn += front.records as Lsn;
                        s.inflight.push_back((g.last_index(), g.term(), lsn));
                        s.backlog.drain(..front.records);
                        s.front_offset = front.offset;
                        in_pieces += last_piece as u64;
                    }
                    Err(RaftLogError::NotLeader { .. } | RaftLogError::Backpressure { .. }) => break,
                    Err(e) => {
                        log_warn(&format!("replication: host {} cannot propose to log {group}: {e}", st.host));
                        break;
                    }
                }
            }
        }
        st.stats.records_in_pieces += in_pieces;
    }

    /// Make what Raft did durable, then send what every group has to send, apply and report
    /// what committed, follow leadership, and compact.
    fn pump(&mut self) {
        for lane in 0..self.lanes.len() {
            self.pump_begin(lane);
            self.pump_finish(lane);
        }
    }

    /// The first half of a pump: poll every group and send the frames that may go before the
    /// journal is synced (returns whether there were any: then let the runtime send them
    /// before [`pump_finish`](Self::pump_finish) syncs, so that followers write while the
    /// leader does).
    /// What the poll produced waits in `held` until the sync: until then the state machines lag
    /// the groups' applied index, and no node may be rebuilt from them (`adoptable_state`).
    fn pump_begin(&mut self, lane: usize) -> bool {
        let mut outputs = Vec::new();
        let lanes = self.lanes.len();
        self.state.borrow_mut().groups.poll_where(&mut outputs, |g| LogId::of_group(g).log as usize % lanes == lane);
        // Behind a full disk even a leader's appends wait: they carry a commit index that counts
        // entries this replica has not made durable.
        let behind = !self.held[lane].is_empty();
        let mut sent_early = false;
        for (_, out) in outputs.iter_mut().filter(|_| !behind) {
            sent_early |= !out.early_messages.is_empty();
            self.send_frames(lane, std::mem::take(&mut out.early_messages));
        }
        self.held[lane].extend(outputs);
        sent_early
    }

    /// The second half: sync the journal, then act on what lane `lane`'s polls produced.
    fn pump_finish(&mut self, lane: usize) {
        if !self.alive {
            return;
        }
        let persisted = self.state.borrow_mut().persist();
        match persisted {
            Err(e) if e.disk_full && self.held[lane].len() <= MAX_HELD_OUTPUTS => {
                if self.held_since_ns.is_none() {
                    self.held_since_ns = Some(self.lanes[lane].now_ns());
                    log_warn(&format!("replication: host {}: {e}", self.state.borrow().host));
                }
                return;
            }
            Err(e) => {
                self.journal_failed(&e.to_string());
                return;
            }
            Ok(()) => {}
        }
        if self.held_since_ns.take().is_some() {
            log_warn(&format!(
                "replication: host {}: the Raft journal has room again; replicas go on",
                self.state.borrow().host
            ));
        }
        for (group, mut out) in std::mem::take(&mut self.held[lane]) {
            self.send_frames(lane, out.take_all_messages());
            if let Some(index) = out.snapshot_index {
                self.install_snapshot(group, index, std::mem::take(&mut out.snapshot_data));
                if self.applier_failed() {
                    return;
                }
            }
            self.committed(group, std::mem::take(&mut out.committed), out.snapshot_index.unwrap_or(0));
        }
        if self.applier_failed() {
            return;
        }
        if self.state.borrow().mode == Mode::Failover {
            for touched in self.follow_leadership() {
                let other = self.lane_of(touched);
                if other != lane {
                    self.wake_lane(other);
                }
            }
        }
        let lanes = self.lanes.len();
        self.state.borrow_mut().compact(|g| LogId::of_group(g).log as usize % lanes == lane);
    }

    /// Sends Raft frames to the replicas they are addressed to, from lane `lane` to the same
    /// lane of their hosts.
    fn send_frames(&self, lane: usize, frames: Vec<(ReplicaId, Vec<u8>)>) {
        let cluster_id = self.state.borrow().cluster_id;
        let w = &self.lanes[lane];
        for (to, frame) in frames {
            w.send_service(Addr::new(node_of_replica(to), w.addr.worker), cluster_id, &frame);
        }
    }

    /// The journal cannot be written (a full or failing disk): nothing this host's replicas
    /// did since the last sync may be relied on, so the host stops replicating, gives up the
    /// nodes it serves (a replica elsewhere takes them over) and says why.
    fn journal_failed(&mut self, reason: &str) {
        log_warn(&format!(
            "replication: host {} stops: {reason}. Free space or replace the disk, then restart the server: it \
             rejoins its logs from the journal",
            self.state.borrow().host
        ));
        let served: Vec<u32> = self.served.keys().copied().collect();
        for group in served {
            self.depose(group);
        }
        self.stop();
    }

    /// The leader sent a snapshot of `group`'s log up to `index` (this replica lacked entries
    /// it had compacted away): the state machine starts over from its data.
    fn install_snapshot(&mut self, group: u32, index: u64, data: Vec<u8>) {
        let mut st = self.state.borrow_mut();
        if st.mode != Mode::Failover {
            // An owner-led leader keeps every entry a follower lacks (`compact`), so this is a
            // bug: the follower's state would miss the entries the snapshot covers.
            debug_assert!(false, "owner-led log {group}: a follower was sent a snapshot at {index}");
            log_warn(&format!(
                "replication: host {}: log {group}: a stateless snapshot at index {index} reached a follower; \
                 its replayed state misses what the snapshot covers",
                st.host
            ));
            return;
        }
        // A machine that cannot restore it fails the host at once (inline) or at a later pump
        // (on a thread): `applier_failed`.
        st.mid_record.remove(&group);
        st.compacted.insert(group, Compacted::at(index, data.len() as u64));
        st.stats.snapshots_installed += 1;
        st.applier.install(group, index, data);
    }

    /// Whether the state machines failed (a leader's snapshot they could not restore): the
    /// host's replicas then stop, as for a failed journal.
    fn applier_failed(&mut self) -> bool {
        let failure = self.state.borrow_mut().applier.take_failure();
        let Some(reason) = failure else { return false };
        let host = self.state.borrow().host;
        self.journal_failed(&format!("host {host} {reason}"));
        true
    }

    /// Committed entries of `group`: apply them (failover mode; owner-led, at a follower) and
    /// tell the served log which of its records are durable.
    /// Entries at or below `snapshot_index` (a snapshot installed in the same poll) are in the
    /// snapshot's state already.
    fn committed(&mut self, group: u32, entries: Vec<super::raft_log::Entry>, snapshot_index: u64) {
        if entries.is_empty() || !self.alive {
            return;
        }
        let proposed: Vec<(u64, u64)> = match self.served.contains_key(&group) {
            true => entries.iter().map(|e| (e.index, e.term)).collect(),
            false => Vec::new(),
        };
        let mut st = self.state.borrow_mut();
        let fresh: Vec<super::raft_log::Entry> = entries.into_iter().filter(|e| e.index > snapshot_index).collect();
        st.compacted.entry(group).or_default().log_bytes += fresh.iter().map(|e| e.data.len() as u64).sum::<u64>();
        if st.applies(group) {
            let w = &self.lanes[self.lane_of(group)];
            if !self.served.contains_key(&group) {
                // A follower's share of the entries (a leader was charged as it proposed them).
                w.charge(CpuKind::Raft, fresh.iter().map(|e| raft_cost::follower_ns(e.data.len())).sum());
            }
            if let Some(last) = fresh.last() {
                match last.data.first() == Some(&TAG_PIECE) {
                    true => st.mid_record.insert(group),
                    false => st.mid_record.remove(&group),
                };
            }
            let records = st.applier.apply(group, fresh);
            w.charge_ops(records.max(1));
        }
        let Some(s) = self.served.get_mut(&group) else { return };
        let mut durable = None;
        let mut lost = false;
        for (index_committed, term_committed) in proposed {
            match s.inflight.front() {
                Some(&(index, term, lsn)) if index == index_committed => {
                    if term == term_committed {
                        durable = Some(lsn);
                        s.inflight.pop_front();
                    } else {
                        lost = true;
                    }
                }
                // An entry past our oldest proposal committed without it: it was overwritten.
                Some(&(index, _, _)) if index < index_committed => lost = true,
                _ => {}
            }
        }
        if let Some(lsn) = durable {
            s.log.replicated_upto(lsn);
        }
        if lost {
            // Another leader's entries replaced ours: this incarnation of the node can make
            // nothing durable any more; the new leader's incarnation replaces it.
            log_warn(&format!("replication: host {} lost proposals to log {group}", st.host));
            drop(st);
            self.depose(group);
        }
    }

    /// Stop serving the logs this host no longer leads; take over the ones it now leads. A
    /// leader first commits a `Takeover` record in its own term: a host that was cut off (or
    /// restarted) may still believe it leads an old term, and only a commit proves that a
    /// majority follows it; once that record is committed and the whole log with it, the log
    /// is settled. A node is rebuilt once one host has settled every one of its logs: a leader
    /// of a node's log k > 0 hands it to the leader of the node's log 0, so that the logs of a
    /// node come to be led from one host after a failover.
    /// Returns the groups it proposed to or asked to transfer: their lanes must poll them.
    fn follow_leadership(&mut self) -> Vec<u32> {
        let mut touched = Vec::new();
        let mut st = self.state.borrow_mut();
        let host = st.host;
        let me = replica_id(host);
        let mut settled: FxHashMap<NodeId, bool> = FxHashMap::default();
        let mut lost = Vec::new();
        let groups: Vec<u32> = st.groups.group_ids().collect();
        for group in groups {
            let id = LogId::of_group(group);
            let leader_of_log_0 = st.groups.get(LogId::new(id.node, 0).group()).and_then(|g| g.leader());
            let Some(g) = st.groups.get_mut(group) else { continue };
            if let Some(s) = self.served.get_mut(&group) {
                if g.is_leader() {
                    let term = *s.led_term.get_or_insert(g.term());
                    if term != g.term() {
                        lost.push(group);
                    }
                } else if s.led_term.is_some() || g.leader().is_some_and(|l| l != me) {
                    // Deposed, or another replica won the first election: this incarnation
                    // can make nothing durable any more.
                    lost.push(group);
                }
                continue;
            }
            let all_settled = settled.entry(id.node).or_insert(true);
            if !g.is_leader() {
                *all_settled = false;
                self.requested.remove(&id.node);
                self.takeover_term.remove(&group);
                continue;
            }
            if let Some(l0) = leader_of_log_0.filter(|&l| id.log > 0 && l != me) {
                // Ignored by Raft while a transfer is under way; asked again at the next pump.
                // Only a transfer newly under way needs its lane to poll at once: waking it for
                // every ask made two lanes wake each other without end in one virtual instant
                // while log 0's leader was a host that had crashed.
                let asked_before = g.transferring_to() == Some(l0);
                let _ = g.transfer_leadership(l0);
                if !asked_before && g.transferring_to() == Some(l0) {
                    touched.push(group);
                }
                *all_settled = false;
                continue;
            }
            if self.takeover_term.get(&group) != Some(&g.term()) {
                let marker = frame(TAG_TAKEOVER, &host.to_le_bytes());
                if g.propose(marker).is_ok() {
                    self.takeover_term.insert(group, g.term());
                    touched.push(group);
                }
                *all_settled = false;
            } else if !g.leads_with_settled_log() {
                *all_settled = false;
            }
        }
        drop(st);
        for group in lost {
            self.depose(group);
        }
        // A node is served with all of its logs or none (`serve`): one served log means served.
        let serves = |n: NodeId| self.served.contains_key(&LogId::new(n, 0).group());
        let mut ask: Vec<NodeId> = settled
            .into_iter()
            .filter(|&(n, ok)| ok && !self.requested.contains(&n) && !serves(n))
            .map(|(n, _)| n)
            .collect();
        ask.sort_unstable();
        if let Some(q) = &self.adopt {
            for node in ask {
                self.requested.insert(node);
                q.borrow_mut().push((node, host));
            }
        }
        touched
    }

    /// The term this host's replica leads `node`'s log in, if it is alive and believes it
    /// leads (a cut-off former leader may too, in an older term): for faults aimed at a leader.
    pub fn leading_term_of(&self, node: NodeId) -> Option<u64> {
        let st = self.state.borrow();
        st.groups.get(LogId::new(node, 0).group()).filter(|g| self.alive && g.is_leader()).map(|g| g.term())
    }
}

/// Whether a frame tagged with cluster `id` may be stepped by a replica of cluster `cluster_id`.
fn check_cluster(id: u64, cluster_id: u64) -> Result<(), String> {
    if id != cluster_id {
        return Err(format!("it belongs to cluster {id:016x}, not to this cluster ({cluster_id:016x})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Propose the backlog as the replicator does; returns the records each entry completes.
    fn entries_of(mut backlog: VecDeque<Vec<u8>>) -> Vec<Vec<Vec<u8>>> {
        let (mut entries, mut offset, mut pieces) = (Vec::new(), 0, Vec::new());
        while !backlog.is_empty() {
            let front = group_front(&backlog, offset);
            let n = front.records;
            assert!(front.entry.len() <= 1 + PIECE_BYTES, "an entry of {} bytes", front.entry.len());
            assert!(
                front.entry.len() <= 1 + GROUP_BYTES || n <= 1,
                "an entry of {} bytes groups {n}",
                front.entry.len()
            );
            let mut records = Vec::new();
            assert_eq!(apply_records(&front.entry, &mut pieces, |r| records.push(r.to_vec())), records.len());
            let expect: Vec<Vec<u8>> = backlog.drain(..n).filter(|r| !r.is_empty()).collect();
            assert_eq!(records, expect, "an entry completes exactly the records it took, in order");
            offset = front.offset;
            entries.push(records);
        }
        assert!(pieces.is_empty(), "every record's pieces were joined");
        entries
    }

    #[test]
    fn a_record_over_an_entry_goes_in_pieces_and_is_joined_again() {
        let huge: Vec<u8> = (0..2 * PIECE_BYTES + 7).map(|i| i as u8).collect();
        let backlog: VecDeque<Vec<u8>> = [vec![1], huge.clone(), vec![2], vec![]].into();
        let entries = entries_of(backlog);
        let sizes: Vec<usize> = entries.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 0, 0, 1, 1, 0], "record 1, three pieces of the large one, record 2, a fence");
        assert_eq!(entries[3][0], huge);
    }

    #[test]
    fn pieces_that_another_entry_follows_are_dropped() {
        let huge = vec![9u8; PIECE_BYTES + 1];
        let first = group_front(&[huge].into(), 0);
        assert_eq!((first.records, first.offset), (0, PIECE_BYTES));
        let (mut pieces, mut applied) = (Vec::new(), Vec::new());
        assert_eq!(apply_records(&first.entry, &mut pieces, |r| applied.push(r.to_vec())), 0);
        // The proposer lost the log: the next entry is another incarnation's record.
        assert_eq!(apply_records(&frame(TAG_RECORD, &[5]), &mut pieces, |r| applied.push(r.to_vec())), 1);
        assert_eq!(applied, vec![vec![5]], "the cut-off record is not applied");
        assert!(pieces.is_empty());
    }

    #[test]
    fn consecutive_records_share_an_entry_and_a_fence_stands_alone() {
        let backlog: VecDeque<Vec<u8>> = [vec![1], vec![2, 2], vec![], vec![3], vec![], vec![]].into();
        let entries = entries_of(backlog);
        let sizes: Vec<usize> = entries.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 0, 1, 0, 0], "records 1-2, a fence, record 3, two fences");
    }

    #[test]
    fn an_entry_groups_at_most_its_records_and_bytes() {
        let many: VecDeque<Vec<u8>> = (0..3 * GROUP_RECORDS as u32).map(|i| i.to_le_bytes().to_vec()).collect();
        assert!(entries_of(many).iter().all(|e| e.len() == GROUP_RECORDS));
        let big: VecDeque<Vec<u8>> = (0..10).map(|i| vec![i; GROUP_BYTES / 3]).collect();
        let sizes: Vec<usize> = entries_of(big).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 2, 2, 2, 2], "two thirds of the bytes and their lengths fit");
        let huge: VecDeque<Vec<u8>> = [vec![7; GROUP_BYTES + 1], vec![8]].into();
        assert_eq!(entries_of(huge).len(), 2, "a record past the group's bytes goes alone");
    }

    #[test]
    fn a_frame_of_another_cluster_is_refused_naming_both() {
        assert_eq!(check_cluster(0xabc, 0xabc), Ok(()));
        let err = check_cluster(0xabc, 0xdef).unwrap_err();
        assert!(err.contains("0000000000000abc") && err.contains("0000000000000def"), "{err}");
    }

    #[test]
    fn every_node_leads_its_log_and_follows_the_next_ones() {
        assert_eq!(replicas_of(0, 4, 3, &[]), vec![0, 1, 2]);
        assert_eq!(replicas_of(3, 4, 3, &[]), vec![3, 0, 1]);
        let hosted = |n: NodeId| (0..4).filter(|&g| replicas_of(g, 4, 3, &[]).contains(&n)).count();
        assert!((0..4).all(|n| hosted(n) == 3), "each node holds three logs");
        // Two regions of three: a log stays in its region.
        let regions = [0, 0, 0, 1, 1, 1];
        assert_eq!(replicas_of(2, 6, 3, &regions), vec![2, 0, 1]);
        assert_eq!(replicas_of(3, 6, 3, &regions), vec![3, 4, 5]);
    }
}
