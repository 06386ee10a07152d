//! Consensus-replicated logs: one [`RaftGroup`] is one replica's view of one log, kept by tikv's
//! `raft` crate (raft-rs, the sans-IO Raft that TiKV runs on).
//!
//! Sans-IO like the rest of the engine (docs/architecture.md, "the one rule"): a group never
//! spawns a thread, never reads a clock and never draws from `thread_rng`. The caller
//! [`tick`](RaftGroup::tick)s it (and chooses what a tick is worth), hands it the frames peers sent
//! ([`step`](RaftGroup::step)), and ships what [`poll`](RaftGroup::poll) returns. So the same group
//! runs in the simulator (virtual time, one thread, one seed) and on real threads and sockets.
//!
//! Wire format: a frame is the group id (u32, little endian), the body's length (u32, little
//! endian), then the body, one protobuf-encoded raft message. A node that hosts many groups
//! ([`RaftGroups`]) routes a frame by its first 4 bytes; the length catches truncation.
//!
//! Determinism: raft-rs draws each election timeout from `rand::thread_rng()`. We configure it with
//! a one-value range (`[election_ticks, election_ticks + 1)`, so the draw always yields
//! `election_ticks`), and randomize elections ourselves from a seeded xoshiro generator: see
//! [`RaftGroup::tick`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::panic::{self, AssertUnwindSafe};

use protobuf::Message as _;
use raft::eraftpb::{
    ConfState, Entry as RaftEntry, EntryType, HardState, Message as RaftMessage, MessageType, Snapshot,
};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole, Storage};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A replica of a group. 1-based: raft reserves 0 for "nobody".
pub type ReplicaId = u64;

/// Bytes of a frame's header: the group id, then the body's length (both u32, little endian).
pub const FRAME_HEADER_BYTES: usize = 8;

/// Room for a message's own fields (terms, indexes, the membership of a snapshot) on top of its
/// entries; see [`RaftConfig::frame_limit_bytes`].
const FRAME_SLACK_BYTES: u64 = 64 * 1024;

/// How many Ready rounds one `poll` drains at most: advancing a Ready can make the next one ready
/// at once (entries persisted, then committed); a bound keeps one poll's work bounded.
const MAX_READY_ROUNDS_PER_POLL: usize = 4;

/// Tuning of a group. All replicas of a group must use the same values.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// Ticks without hearing from a leader before a follower may campaign (the actual wait is
    /// randomized in `[election_ticks, 2 * election_ticks)`, from the group's seed).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats; must be below `election_ticks`.
    pub heartbeat_ticks: usize,
    /// Append messages in flight per follower during optimistic replication.
    pub max_inflight_msgs: usize,
    /// Bytes of entries per append message; also the largest proposal accepted.
    pub max_size_per_msg: u64,
    /// Bytes proposed at this leader and not yet committed: `propose` refuses past this.
    pub max_uncommitted_bytes: u64,
    /// Pre-vote (Raft thesis 9.6): a replica that was cut off does not disrupt a healthy leader.
    pub pre_vote: bool,
    /// A leader that has not heard from a quorum for an election timeout steps down.
    pub check_quorum: bool,
    /// Print raft's own log lines to stderr (otherwise they are discarded).
    pub debug_log: bool,
    /// Bytes of the largest snapshot (the applied state a compacted log starts from) a replica
    /// sends or accepts; a larger state is not compacted (see `service`).
    pub max_snapshot_bytes: u64,
    /// A frame over this many bytes (a snapshot, a large append) goes as fragments of this size
    /// ([`super::fragment`]); it must stay under the wire's envelope limit.
    pub fragment_bytes: u64,
}

/// The default [`RaftConfig::max_snapshot_bytes`]. The leader holds a snapshot about four times
/// while it ships it (its store, raft's message, the encoded frame, the fragments), and a
/// connection queues at most 256 MiB (`rt::tcp`), so 128 MiB keeps both bounded.
pub const MAX_SNAPSHOT_BYTES: u64 = 128 << 20;

/// The default [`RaftConfig::fragment_bytes`]: a quarter of `net::MAX_ENVELOPE_BYTES`.
pub const FRAGMENT_BYTES: u64 = 1 << 20;

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            election_ticks: 10,
            heartbeat_ticks: 2,
            max_inflight_msgs: 256,
            max_size_per_msg: 1024 * 1024,
            max_uncommitted_bytes: 64 * 1024 * 1024,
            pre_vote: true,
            check_quorum: true,
            debug_log: false,
            max_snapshot_bytes: MAX_SNAPSHOT_BYTES,
            fragment_bytes: FRAGMENT_BYTES,
        }
    }
}

impl RaftConfig {
    fn validate(&self) -> Result<(), RaftLogError> {
        let problem = if self.heartbeat_ticks == 0 {
            "heartbeat_ticks must be positive"
        } else if self.election_ticks <= self.heartbeat_ticks {
            "election_ticks must exceed heartbeat_ticks"
        } else if self.max_inflight_msgs == 0 {
            "max_inflight_msgs must be positive"
        } else if self.max_size_per_msg == 0 {
            "max_size_per_msg must be positive"
        } else if self.max_uncommitted_bytes < self.max_size_per_msg {
            "max_uncommitted_bytes must be at least max_size_per_msg"
        } else if self.fragment_bytes == 0 || self.fragment_bytes > (crate::net::MAX_ENVELOPE_BYTES / 2) as u64 {
            "fragment_bytes must be positive and at most half the wire's envelope limit"
        } else {
            return Ok(());
        };
        Err(RaftLogError::InvalidConfig(problem.to_string()))
    }

    /// The largest frame a peer may send us. Raft fills an append with up to `max_size_per_msg`
    /// bytes of entries (their encoded size) and always sends at least one entry, which
    /// `propose` keeps within `max_size_per_msg` of data. Each entry encodes to at least 4 bytes
    /// (index and term) and its framing inside the message (a tag and a length) costs at most as
    /// much as the entry itself, so twice the entry budget plus slack for the message's other
    /// fields bounds every honest frame.
    /// A frame over `fragment_bytes` travels as fragments, each within this limit too.
    pub fn frame_limit_bytes(&self) -> u64 {
        self.max_size_per_msg.saturating_mul(2).max(self.fragment_bytes).saturating_add(FRAME_SLACK_BYTES)
    }

    /// The largest frame put back together from fragments: a snapshot message carries the
    /// snapshot's data, up to `max_snapshot_bytes`.
    pub fn assembled_limit_bytes(&self) -> u64 {
        self.frame_limit_bytes().max(self.max_snapshot_bytes.saturating_add(FRAME_SLACK_BYTES))
    }

    fn to_raft(&self, me: ReplicaId, applied_index: u64) -> raft::Config {
        raft::Config {
            id: me,
            election_tick: self.election_ticks,
            heartbeat_tick: self.heartbeat_ticks,
            // A one-value range: raft's `thread_rng().gen_range(min..max)` then always yields
            // `election_ticks`, so raft itself draws nothing that matters. `RaftGroup::tick`
            // adds the randomization back from the seeded generator.
            min_election_tick: self.election_ticks,
            max_election_tick: self.election_ticks + 1,
            applied: applied_index,
            max_size_per_msg: self.max_size_per_msg,
            max_inflight_msgs: self.max_inflight_msgs,
            check_quorum: self.check_quorum,
            pre_vote: self.pre_vote,
            // `propose` enforces `max_uncommitted_bytes` itself, with exact numbers in the error.
            max_uncommitted_size: raft::NO_LIMIT,
            ..raft::Config::default()
        }
    }
}

/// One committed application entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub term: u64,
    pub data: Vec<u8>,
}

/// What one `poll` produced.
#[derive(Debug, Default)]
pub struct Output {
    /// Frames to send, each to one peer, once what the poll wrote to the store is durable
    /// (votes, append acknowledgments, and whatever follows from entries counted as persisted).
    pub messages: Vec<(ReplicaId, Vec<u8>)>,
    /// Frames that may go before the store's writes are durable, and should (a leader's appends
    /// and heartbeats: its followers then write while it writes, Raft thesis 10.2.1).
    pub early_messages: Vec<(ReplicaId, Vec<u8>)>,
    /// Newly committed application entries, in log order, each handed out exactly once. Raft's
    /// own no-op entries (empty data) are not handed out.
    pub committed: Vec<Entry>,
    /// Set when the known leader or the term changed: `(leader, term)`, leader 0 = none known.
    pub leader: Option<(ReplicaId, u64)>,
    /// Set when this replica's log was replaced by the leader's snapshot up to this index, because
    /// the entries it lacked were compacted away. Entries up to it will never be handed out here:
    /// the application restores its state up to this index from `snapshot_data`.
    pub snapshot_index: Option<u64>,
    /// The applied state the installed snapshot carries (what the leader's store put in it).
    pub snapshot_data: Vec<u8>,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.early_messages.is_empty()
            && self.committed.is_empty()
            && self.leader.is_none()
            && self.snapshot_index.is_none()
    }

    /// Takes every frame, early ones first (for a caller whose store is durable at once).
    pub fn take_all_messages(&mut self) -> Vec<(ReplicaId, Vec<u8>)> {
        let mut all = std::mem::take(&mut self.early_messages);
        all.append(&mut self.messages);
        all
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RaftLogError {
    #[error("not the leader (leader hint: {leader_hint:?})")]
    NotLeader { leader_hint: Option<ReplicaId> },
    #[error("proposal of {size_bytes} bytes exceeds the limit of {limit_bytes}")]
    TooLarge { size_bytes: u64, limit_bytes: u64 },
    #[error("{uncommitted_bytes} bytes already await commit, limit {limit_bytes}: retry later")]
    Backpressure { uncommitted_bytes: u64, limit_bytes: u64 },
    #[error("empty proposal: empty entries are raft's own no-ops")]
    EmptyProposal,
    #[error("frame of {size_bytes} bytes exceeds the limit of {limit_bytes}")]
    FrameTooLarge { size_bytes: u64, limit_bytes: u64 },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame for group {got} delivered to group {expected}")]
    WrongGroup { expected: u32, got: u32 },
    #[error("no group {0} on this node")]
    UnknownGroup(u32),
    #[error("group {0} is already on this node")]
    DuplicateGroup(u32),
    #[error("misaddressed message: {0}")]
    Misaddressed(String),
    #[error("message inconsistent with this replica's log: {0}")]
    Inconsistent(String),
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("log store: {0}")]
    Storage(String),
    #[error("raft: {0}")]
    Raft(String),
    /// The group hit an internal invariant violation (raft panicked, or the store failed while
    /// persisting) and refuses all further work: its replica must be rebuilt.
    #[error("group failed: {0}")]
    Failed(String),
}

/// The seam between a group and its durable log. `raft::Storage` is how raft reads the log; these
/// are the writes `poll` makes. `MemStorage` implements it in memory; a WAL-backed store
/// replaces it without touching the group.
pub trait LogStore: Storage {
    /// Appends entries, first truncating any conflicting suffix at `entries[0].index`.
    fn append(&mut self, entries: &[RaftEntry]) -> Result<(), RaftLogError>;
    fn set_hard_state(&mut self, hard_state: &HardState) -> Result<(), RaftLogError>;
    fn set_commit(&mut self, commit_index: u64) -> Result<(), RaftLogError>;
    /// Replaces the log with a snapshot received from the leader.
    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), RaftLogError>;
    /// Drops the entries before `first_index_to_keep` (at most the last index).
    fn compact(&mut self, first_index_to_keep: u64) -> Result<(), RaftLogError>;
}

fn storage_err(e: raft::Error) -> RaftLogError {
    RaftLogError::Storage(e.to_string())
}

impl LogStore for MemStorage {
    fn append(&mut self, entries: &[RaftEntry]) -> Result<(), RaftLogError> {
        self.wl().append(entries).map_err(storage_err)
    }

    fn set_hard_state(&mut self, hard_state: &HardState) -> Result<(), RaftLogError> {
        self.wl().set_hardstate(hard_state.clone());
        Ok(())
    }

    fn set_commit(&mut self, commit_index: u64) -> Result<(), RaftLogError> {
        self.wl().mut_hard_state().set_commit(commit_index);
        Ok(())
    }

    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), RaftLogError> {
        self.wl().apply_snapshot(snapshot.clone()).map_err(storage_err)
    }

    fn compact(&mut self, first_index_to_keep: u64) -> Result<(), RaftLogError> {
        self.wl().compact(first_index_to_keep).map_err(storage_err)
    }
}

/// A fresh in-memory log whose membership is `voters`. All replicas of a group must start from
/// the same membership.
pub fn new_mem_store(voters: &[ReplicaId]) -> MemStorage {
    MemStorage::new_with_conf_state(ConfState::from((voters.to_vec(), Vec::new())))
}

/// The group id a frame is addressed to, for routing before decoding.
pub fn frame_group_id(frame: &[u8]) -> Result<u32, RaftLogError> {
    Ok(frame_header(frame)?.0)
}

/// `(group id, body length)`. The body length makes a truncated frame an error: a protobuf
/// message cut at a field boundary still parses, and a vote or append response that lost its
/// trailing `reject` flag would read as a grant.
fn frame_header(frame: &[u8]) -> Result<(u32, usize), RaftLogError> {
    let short = || RaftLogError::Malformed(format!("{} bytes, shorter than the header", frame.len()));
    let group_id: [u8; 4] = frame.get(0..4).and_then(|b| b.try_into().ok()).ok_or_else(short)?;
    let body_len: [u8; 4] = frame.get(4..8).and_then(|b| b.try_into().ok()).ok_or_else(short)?;
    Ok((u32::from_le_bytes(group_id), u32::from_le_bytes(body_len) as usize))
}

fn encode_frame(group_id: u32, msg: &RaftMessage) -> Result<Vec<u8>, RaftLogError> {
    let body_len = msg.compute_size();
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body_len as usize);
    frame.extend_from_slice(&group_id.to_le_bytes());
    frame.extend_from_slice(&body_len.to_le_bytes());
    msg.write_to_vec(&mut frame).map_err(|e| RaftLogError::Malformed(format!("encoding: {e}")))?;
    Ok(frame)
}

fn decode_frame(frame: &[u8], limit_bytes: u64) -> Result<(u32, RaftMessage), RaftLogError> {
    let size_bytes = frame.len() as u64;
    if size_bytes > limit_bytes {
        return Err(RaftLogError::FrameTooLarge { size_bytes, limit_bytes });
    }
    let (group_id, body_len) = frame_header(frame)?;
    let body = &frame[FRAME_HEADER_BYTES..];
    if body.len() != body_len {
        return Err(RaftLogError::Malformed(format!(
            "header announces {body_len} body bytes, frame carries {}",
            body.len()
        )));
    }
    let msg = RaftMessage::parse_from_bytes(body).map_err(|e| RaftLogError::Malformed(e.to_string()))?;
    Ok((group_id, msg))
}

/// The voter set: `peers` plus `me`, sorted, without duplicates; 0 is refused.
fn voter_set(me: ReplicaId, peers: &[ReplicaId]) -> Result<Vec<ReplicaId>, RaftLogError> {
    let mut voters: Vec<ReplicaId> = peers.iter().copied().chain([me]).collect();
    voters.sort_unstable();
    voters.dedup();
    if voters.first() == Some(&0) {
        return Err(RaftLogError::InvalidConfig("replica ids are 1-based: 0 means nobody".to_string()));
    }
    Ok(voters)
}

/// splitmix64: spreads nearby inputs (seed, replica, group) over unrelated generator states.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn group_rng(seed: u64, group_id: u32, me: ReplicaId) -> Xoshiro256PlusPlus {
    // Replicas given the same seed must still draw different election delays, or they would
    // time out together and split every vote.
    let mixed = splitmix64(splitmix64(seed ^ me.rotate_left(32)) ^ u64::from(group_id));
    Xoshiro256PlusPlus::seed_from_u64(mixed)
}

/// Where raft's log lines go: nowhere, unless debugging.
fn raft_logger(debug: bool, group_id: u32, me: ReplicaId) -> slog::Logger {
    if debug {
        let drain = StderrDrain { prefix: format!("raft g{group_id} r{me}") };
        slog::Logger::root(drain, slog::o!())
    } else {
        slog::Logger::root(slog::Discard, slog::o!())
    }
}

/// A minimal slog drain to stderr, so the debug flag needs no terminal-logger dependency.
struct StderrDrain {
    prefix: String,
}

impl slog::Drain for StderrDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let mut line = KvLine(String::new());
        // Formatting into a String cannot fail; a failed key is simply left out.
        let _ = slog::KV::serialize(&record.kv(), record, &mut line);
        let _ = slog::KV::serialize(values, record, &mut line);
        eprintln!("{} {} {}{}", self.prefix, record.level().as_short_str(), record.msg(), line.0);
        Ok(())
    }
}

struct KvLine(String);

impl slog::Serializer for KvLine {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

fn panic_reason(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// One replica's view of one replicated log, driven by one thread (the caller's): it never blocks
/// and never shares itself.
pub struct RaftGroup<S: LogStore = MemStorage> {
    group_id: u32,
    me: ReplicaId,
    voters: Vec<ReplicaId>,
    node: RawNode<S>,
    rng: Xoshiro256PlusPlus,
    /// Ticks this replica waits beyond raft's fixed election timeout before its next campaign.
    extra_election_ticks: usize,
    /// Ticks held back from raft so far in the current wait.
    held_ticks: usize,
    frame_limit_bytes: u64,
    assembled_limit_bytes: u64,
    fragment_bytes: usize,
    /// Numbers this replica's fragmented messages: the low half of their ids (the term is the
    /// high half).
    fragmented_sent: u32,
    /// Fragments received, per sender, until their message is whole.
    reassembly: super::fragment::Reassembly,
    max_entry_bytes: u64,
    max_uncommitted_bytes: u64,
    /// Proposals made at this leader in `pending_term` and not yet known committed:
    /// (index, data bytes).
    pending: VecDeque<(u64, u64)>,
    pending_bytes: u64,
    pending_term: u64,
    /// The last log index handed to the application (no-ops included).
    applied_index: u64,
    /// The (leader, term) last reported in an `Output`.
    reported_leader: (ReplicaId, u64),
    /// Followers a snapshot was shipped to and not reported done yet, each with the ticks left
    /// until it is (see [`RaftGroup::count_down_snapshots`]).
    snapshots_sent: Vec<(ReplicaId, usize)>,
    failure: Option<String>,
}

impl RaftGroup<MemStorage> {
    /// A fresh replica of a new group with an empty in-memory log. `peers` is the group's voter
    /// set (`me` is added if absent); `seed` drives this replica's election delays.
    pub fn new(
        group_id: u32,
        me: ReplicaId,
        peers: &[ReplicaId],
        cfg: &RaftConfig,
        seed: u64,
    ) -> Result<Self, RaftLogError> {
        let store = new_mem_store(&voter_set(me, peers)?);
        RaftGroup::with_store(group_id, me, peers, cfg, seed, store, 0)
    }
}

impl<S: LogStore> RaftGroup<S> {
    /// A replica over a store that may already hold a log: a restart. `applied_index` is the last
    /// index the application had applied (0 for a fresh store): entries after it are handed out
    /// again. The store's membership must equal the voter set.
    pub fn with_store(
        group_id: u32,
        me: ReplicaId,
        peers: &[ReplicaId],
        cfg: &RaftConfig,
        seed: u64,
        store: S,
        applied_index: u64,
    ) -> Result<Self, RaftLogError> {
        cfg.validate()?;
        let voters = voter_set(me, peers)?;
        check_store(&store, &voters, applied_index)?;
        let logger = raft_logger(cfg.debug_log, group_id, me);
        let node = RawNode::new(&cfg.to_raft(me, applied_index), store, &logger)
            .map_err(|e| RaftLogError::InvalidConfig(e.to_string()))?;
        let mut rng = group_rng(seed, group_id, me);
        let extra_election_ticks = rng.gen_range(0..cfg.election_ticks);
        Ok(RaftGroup {
            group_id,
            me,
            voters,
            node,
            rng,
            extra_election_ticks,
            held_ticks: 0,
            frame_limit_bytes: cfg.frame_limit_bytes(),
            assembled_limit_bytes: cfg.assembled_limit_bytes(),
            fragment_bytes: cfg.fragment_bytes as usize,
            fragmented_sent: 0,
            reassembly: super::fragment::Reassembly::new(
                cfg.fragment_bytes as usize,
                cfg.assembled_limit_bytes() as usize,
            ),
            max_entry_bytes: cfg.max_size_per_msg,
            max_uncommitted_bytes: cfg.max_uncommitted_bytes,
            pending: VecDeque::new(),
            pending_bytes: 0,
            pending_term: 0,
            applied_index,
            reported_leader: (0, 0),
            snapshots_sent: Vec::new(),
            failure: None,
        })
    }

    /// Advances this replica's clock by one tick.
    ///
    /// Election randomization lives here rather than in raft (which would use `thread_rng`):
    /// raft times out after exactly `election_ticks`, and before the tick that would time it out
    /// we hold back a seeded number of ticks, `[0, election_ticks)`, drawn afresh for every
    /// campaign. The wait is thus uniform in `[election_ticks, 2 * election_ticks)`, raft's own
    /// distribution, and one seed replays it. A leader always gets its ticks (heartbeats, quorum
    /// checks). Side effect: a follower still holding back counts as having heard from its leader
    /// (raft's lease, `election_elapsed < election_ticks`), so it ignores pre-votes until its own
    /// wait ends: an election completes once a majority has waited, within two election timeouts
    /// and a few round trips (a split vote costs another wait, as in plain Raft), where raft's own
    /// randomization completes it when the first replica has waited.
    pub fn tick(&mut self) {
        if self.failure.is_some() || self.hold_back_tick() {
            return;
        }
        self.count_down_snapshots();
        let _ = self.guarded(|g| {
            g.node.tick();
            Ok(())
        });
    }

    /// A snapshot travels in one message here (in fragments or not). Raft leaves a follower it
    /// sent one to alone until the follower acknowledges it (the follower's answer to the
    /// snapshot resumes replication) or it is told the snapshot is done; if the message (or a
    /// fragment) was lost, only the telling resumes it. So a snapshot is reported done an
    /// election timeout after it was sent: then the next append tells whether it arrived, and a
    /// follower without it gets a fresh one. Reported at once (before 2026-12-05), every
    /// heartbeat's answer from a follower that the snapshot had not reached yet (one a WAN away,
    /// or behind its own work) sent it another: a 4-region Detock run with replicated logs had
    /// 6 GB of snapshots in flight within 30 virtual ms.
    fn count_down_snapshots(&mut self) {
        if self.snapshots_sent.is_empty() {
            return; // Every tick of every group comes here; almost never with a snapshot out.
        }
        for (_, ticks) in &mut self.snapshots_sent {
            *ticks = ticks.saturating_sub(1);
        }
        let done: Vec<ReplicaId> = self.snapshots_sent.iter().filter(|(_, t)| *t == 0).map(|(to, _)| *to).collect();
        self.snapshots_sent.retain(|(_, t)| *t > 0);
        for to in done {
            self.node.report_snapshot(to, raft::SnapshotStatus::Finish);
        }
    }

    fn hold_back_tick(&mut self) -> bool {
        let raft = &self.node.raft;
        let times_out_now =
            raft.state != StateRole::Leader && raft.election_elapsed + 1 >= raft.randomized_election_timeout();
        if !times_out_now {
            self.held_ticks = 0;
            return false;
        }
        if self.held_ticks < self.extra_election_ticks {
            self.held_ticks += 1;
            return true;
        }
        self.held_ticks = 0;
        self.extra_election_ticks = self.rng.gen_range(0..raft.election_timeout());
        false
    }

    /// Takes in one frame a peer sent. Malformed, oversized, misaddressed or inconsistent frames
    /// are errors and leave the group untouched.
    pub fn step(&mut self, frame: &[u8]) -> Result<(), RaftLogError> {
        self.step_checked(frame, None)
    }

    fn step_checked(&mut self, frame: &[u8], sender: Option<ReplicaId>) -> Result<(), RaftLogError> {
        self.check_alive()?;
        if !super::fragment::is_fragment(frame) {
            return self.step_whole(frame, sender, self.frame_limit_bytes);
        }
        let size_bytes = frame.len() as u64;
        if size_bytes > self.frame_limit_bytes {
            return Err(RaftLogError::FrameTooLarge { size_bytes, limit_bytes: self.frame_limit_bytes });
        }
        // Without a known sender (a caller that routes frames itself), senders share one assembly.
        match self.reassembly.add(sender.unwrap_or(0), frame)? {
            Some(whole) => self.step_whole(&whole, sender, self.assembled_limit_bytes),
            None => Ok(()),
        }
    }

    fn step_whole(&mut self, frame: &[u8], sender: Option<ReplicaId>, limit_bytes: u64) -> Result<(), RaftLogError> {
        let (group_id, msg) = decode_frame(frame, limit_bytes)?;
        if group_id != self.group_id {
            return Err(RaftLogError::WrongGroup { expected: self.group_id, got: group_id });
        }
        if let Some(sender) = sender.filter(|&s| s != msg.from) {
            return Err(RaftLogError::Misaddressed(format!(
                "message claims to be from {} but came from {sender}",
                msg.from
            )));
        }
        self.check_incoming(&msg)?;
        self.guarded(|g| g.node.step(msg).map_err(raft_err))
    }

    /// Refuses what raft would mis-handle or panic on: it trusts its peers, we do not trust bytes.
    fn check_incoming(&self, msg: &RaftMessage) -> Result<(), RaftLogError> {
        if msg.to != self.me {
            return Err(RaftLogError::Misaddressed(format!("message to {} delivered to {}", msg.to, self.me)));
        }
        if msg.from == self.me || self.voters.binary_search(&msg.from).is_err() {
            return Err(RaftLogError::Misaddressed(format!(
                "sender {} is not a peer of replica {} in group {}",
                msg.from, self.me, self.group_id
            )));
        }
        check_message_type(msg.get_msg_type())?;
        match msg.get_msg_type() {
            MessageType::MsgAppend => check_append_shape(msg),
            MessageType::MsgHeartbeat => self.check_heartbeat_commit(msg),
            MessageType::MsgSnapshot => self.check_snapshot_membership(msg),
            _ => Ok(()),
        }
    }

    /// A leader announces a commit index no higher than what this replica acknowledged having;
    /// raft panics if it exceeds our log, which only happens if this replica lost its log.
    fn check_heartbeat_commit(&self, msg: &RaftMessage) -> Result<(), RaftLogError> {
        let last_index = self.node.raft.raft_log.last_index();
        if msg.term >= self.node.raft.term && msg.commit > last_index {
            return Err(RaftLogError::Inconsistent(format!(
                "heartbeat commits index {} beyond our last index {last_index}: this replica lost \
                 entries it had acknowledged",
                msg.commit
            )));
        }
        Ok(())
    }

    /// Membership never changes in this module: a snapshot with another voter set is refused.
    fn check_snapshot_membership(&self, msg: &RaftMessage) -> Result<(), RaftLogError> {
        let conf = msg.get_snapshot().get_metadata().get_conf_state();
        let mut voters = conf.voters.clone();
        voters.sort_unstable();
        if voters != self.voters || !conf.learners.is_empty() || !conf.voters_outgoing.is_empty() {
            return Err(RaftLogError::Inconsistent(format!(
                "snapshot membership {:?} differs from the group's {:?}",
                conf.voters, self.voters
            )));
        }
        Ok(())
    }

    /// Proposes one application entry. Only the leader accepts; `data` must be non-empty and at
    /// most `max_size_per_msg` bytes. Success means appended at the leader, not committed: watch
    /// `Output::committed` (a leader change can still drop it).
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), RaftLogError> {
        self.check_alive()?;
        let size_bytes = data.len() as u64;
        if size_bytes == 0 {
            return Err(RaftLogError::EmptyProposal);
        }
        if size_bytes > self.max_entry_bytes {
            return Err(RaftLogError::TooLarge { size_bytes, limit_bytes: self.max_entry_bytes });
        }
        if !self.is_leader() {
            return Err(RaftLogError::NotLeader { leader_hint: self.leader() });
        }
        self.check_backpressure(size_bytes)?;
        let before = self.node.raft.raft_log.last_index();
        self.guarded(|g| g.node.propose(Vec::new(), data).map_err(raft_err))?;
        let index = self.node.raft.raft_log.last_index();
        if index > before {
            self.pending_term = self.term();
            self.pending.push_back((index, size_bytes));
            self.pending_bytes += size_bytes;
        }
        Ok(())
    }

    fn check_backpressure(&mut self, size_bytes: u64) -> Result<(), RaftLogError> {
        self.forget_committed_proposals();
        // One proposal always fits, however large, or a big entry could never be proposed.
        if !self.pending.is_empty() && self.pending_bytes + size_bytes > self.max_uncommitted_bytes {
            return Err(RaftLogError::Backpressure {
                uncommitted_bytes: self.pending_bytes,
                limit_bytes: self.max_uncommitted_bytes,
            });
        }
        Ok(())
    }

    fn forget_committed_proposals(&mut self) {
        // After a change of term the old proposals either committed or were overwritten: they
        // no longer weigh on this leadership.
        if !self.is_leader() || self.term() != self.pending_term {
            self.pending.clear();
            self.pending_bytes = 0;
            return;
        }
        let commit_index = self.commit_index();
        while let Some(&(index, size_bytes)) = self.pending.front() {
            if index > commit_index {
                break;
            }
            self.pending.pop_front();
            self.pending_bytes -= size_bytes;
        }
    }

    /// Starts an election now (tests, failover drills). With pre-vote on, it cannot unseat a
    /// leader a majority still hears from; use [`transfer_leadership`](Self::transfer_leadership)
    /// for that.
    pub fn campaign(&mut self) -> Result<(), RaftLogError> {
        self.check_alive()?;
        self.guarded(|g| g.node.campaign().map_err(raft_err))
    }

    /// Asks the leader to hand leadership to `to` once `to` has caught up (a follower forwards
    /// the request to the leader it knows).
    pub fn transfer_leadership(&mut self, to: ReplicaId) -> Result<(), RaftLogError> {
        self.check_alive()?;
        if self.voters.binary_search(&to).is_err() {
            return Err(RaftLogError::Misaddressed(format!("{to} is not a voter of group {}", self.group_id)));
        }
        self.guarded(|g| {
            g.node.transfer_leader(to);
            Ok(())
        })
    }

    /// Processes what raft has ready: persists it to the store, collects the frames to send and
    /// the newly committed entries, and advances raft.
    pub fn poll(&mut self) -> Output {
        let mut out = Output::default();
        for _ in 0..MAX_READY_ROUNDS_PER_POLL {
            if self.failure.is_some() || !self.node.has_ready() {
                break;
            }
            let _ = self.guarded(|g| g.handle_ready(&mut out));
        }
        self.report_leader(&mut out);
        out
    }

    /// The order is raft-rs's: messages that need nothing persisted go at once (a leader sends
    /// appends while it writes them itself), then snapshot, commits, new entries and hard state
    /// are persisted, then the messages that must follow persistence (votes, append acks).
    fn handle_ready(&mut self, out: &mut Output) -> Result<(), RaftLogError> {
        let mut ready = self.node.ready();
        let early = ready.take_messages();
        self.ship(early, out, true);
        if !ready.snapshot().is_empty() {
            self.install_snapshot(ready.snapshot(), out)?;
        }
        self.hand_out(ready.take_committed_entries(), out);
        self.node.mut_store().append(ready.entries())?;
        if let Some(hard_state) = ready.hs() {
            self.node.mut_store().set_hard_state(hard_state)?;
        }
        self.ship(ready.take_persisted_messages(), out, false);
        let mut light = self.node.advance(ready);
        if let Some(commit_index) = light.commit_index() {
            self.node.mut_store().set_commit(commit_index)?;
        }
        self.ship(light.take_messages(), out, false);
        self.hand_out(light.take_committed_entries(), out);
        self.node.advance_apply();
        Ok(())
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot, out: &mut Output) -> Result<(), RaftLogError> {
        self.node.mut_store().apply_snapshot(snapshot)?;
        let index = snapshot.get_metadata().index;
        self.applied_index = self.applied_index.max(index);
        out.snapshot_index = Some(index);
        out.snapshot_data = snapshot.get_data().to_vec();
        Ok(())
    }

    fn ship(&mut self, msgs: Vec<RaftMessage>, out: &mut Output, early: bool) {
        for msg in msgs {
            if msg.get_msg_type() == MessageType::MsgSnapshot {
                let ticks = self.node.raft.election_timeout();
                self.snapshots_sent.retain(|(to, _)| *to != msg.to);
                self.snapshots_sent.push((msg.to, ticks));
            }
            // Encoding a proto3 message cannot fail; were it to, dropping the message is safe
            // (raft tolerates lost messages) and beats taking the replica down.
            let Ok(frame) = encode_frame(self.group_id, &msg) else { continue };
            let to = if early { &mut out.early_messages } else { &mut out.messages };
            if frame.len() <= self.fragment_bytes {
                to.push((msg.to, frame));
                continue;
            }
            self.fragmented_sent = self.fragmented_sent.wrapping_add(1);
            let id = (self.node.raft.term << 32) | self.fragmented_sent as u64;
            let fragments = super::fragment::split(frame, id, self.fragment_bytes);
            to.extend(fragments.into_iter().map(|f| (msg.to, f)));
        }
    }

    fn hand_out(&mut self, entries: Vec<RaftEntry>, out: &mut Output) {
        for mut entry in entries {
            // Exactly once, even if raft were to repeat itself.
            if entry.index <= self.applied_index {
                continue;
            }
            self.applied_index = entry.index;
            let is_application_entry = entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty();
            if is_application_entry {
                out.committed.push(Entry { index: entry.index, term: entry.term, data: entry.take_data().into() });
            }
        }
    }

    fn report_leader(&mut self, out: &mut Output) {
        let now = (self.node.raft.leader_id, self.node.raft.term);
        if now != self.reported_leader {
            self.reported_leader = now;
            out.leader = Some(now);
        }
    }

    /// Lets the store drop entries the application has applied (and snapshotted) up to
    /// `applied_up_to`, keeping that entry itself (its term anchors the next append) and never
    /// the last one. A follower that later needs dropped entries receives a snapshot instead
    /// (see `Output::snapshot_index`).
    pub fn compact(&mut self, applied_up_to: u64) {
        if self.failure.is_some() {
            return;
        }
        let first_index_to_keep = applied_up_to.min(self.applied_index).min(self.node.raft.raft_log.last_index());
        let first_index = self.node.store().first_index().unwrap_or(u64::MAX);
        if first_index_to_keep <= first_index {
            return;
        }
        let _ = self.guarded(|g| g.node.mut_store().compact(first_index_to_keep));
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// On a leader, the lowest index a follower has acknowledged; `None` on a follower. A
    /// crashed follower counts too (raft-rs's `recent_active` also drops a live one that is
    /// slow to answer, the follower entries would help most): the caller bounds what it keeps.
    pub fn slowest_follower_match(&self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        self.node.raft.prs().iter().filter(|(&id, _)| id != self.me).map(|(_, pr)| pr.matched).min()
    }

    /// The replica this leader is handing its leadership to, while a transfer is under way.
    pub fn transferring_to(&self) -> Option<ReplicaId> {
        self.node.raft.lead_transferee
    }

    /// The leader this replica knows of, if any.
    pub fn leader(&self) -> Option<ReplicaId> {
        Some(self.node.raft.leader_id).filter(|&id| id != raft::INVALID_ID)
    }

    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The index of the last entry in this replica's log (committed or not).
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }

    /// A leader whose whole log is committed, up to an entry of its own term: every entry a
    /// former leader committed is then in it (Raft's no-op on election), and no entry proposed
    /// earlier (by a previous incarnation of the application, say) can still commit after it.
    /// A state built from this log's committed entries is final.
    pub fn leads_with_settled_log(&self) -> bool {
        let commit = self.commit_index();
        self.is_leader()
            && commit == self.last_index()
            && self.node.raft.raft_log.term(commit).unwrap_or(0) == self.term()
    }

    /// The last log index handed to the application (raft's no-ops included): what to pass as
    /// `applied_index` when reopening this replica over the same store.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn group_id(&self) -> u32 {
        self.group_id
    }

    pub fn replica_id(&self) -> ReplicaId {
        self.me
    }

    pub fn voters(&self) -> &[ReplicaId] {
        &self.voters
    }

    pub fn store(&self) -> &S {
        self.node.store()
    }

    /// The store, to take what it has to persist or to record a snapshot in it; raft's own
    /// writes go through `poll` only.
    pub fn store_mut(&mut self) -> &mut S {
        self.node.mut_store()
    }

    /// The term of the entry at `index`, if this replica still has it (or its snapshot does).
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.node.raft.raft_log.term(index).ok()
    }

    /// Why the group stopped, if it did (see [`RaftLogError::Failed`]).
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn check_alive(&self) -> Result<(), RaftLogError> {
        match &self.failure {
            Some(reason) => Err(RaftLogError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// Runs `f`, which touches raft or the store. Raft panics on broken invariants (its
    /// `fatal!`), and so does `MemStorage`; a panic or a store error must not take down the other
    /// groups of the node, nor leave this one half-updated and running: the group is fenced.
    fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R, RaftLogError>) -> Result<R, RaftLogError> {
        self.check_alive()?;
        match panic::catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(Err(RaftLogError::Storage(reason))) => Err(self.fail(format!("store: {reason}"))),
            Ok(result) => result,
            Err(payload) => Err(self.fail(panic_reason(payload.as_ref()))),
        }
    }

    fn fail(&mut self, reason: String) -> RaftLogError {
        self.failure = Some(reason.clone());
        RaftLogError::Failed(reason)
    }
}

fn raft_err(e: raft::Error) -> RaftLogError {
    match e {
        raft::Error::ProposalDropped => RaftLogError::NotLeader { leader_hint: None },
        raft::Error::Store(e) => RaftLogError::Storage(e.to_string()),
        other => RaftLogError::Raft(other.to_string()),
    }
}

/// Checks a store a group is about to open: membership, and an applied index the log can serve.
fn check_store<S: Storage>(store: &S, voters: &[ReplicaId], applied_index: u64) -> Result<(), RaftLogError> {
    let state = store.initial_state().map_err(storage_err)?;
    let mut stored_voters = state.conf_state.voters.clone();
    stored_voters.sort_unstable();
    if stored_voters != voters {
        return Err(RaftLogError::InvalidConfig(format!(
            "store membership {stored_voters:?} differs from the voter set {voters:?}"
        )));
    }
    let commit_index = state.hard_state.commit;
    let first_index = store.first_index().map_err(storage_err)?;
    if applied_index > commit_index || applied_index + 1 < first_index {
        return Err(RaftLogError::InvalidConfig(format!(
            "applied index {applied_index} outside what the log can serve: commit {commit_index}, \
             first entry {first_index}"
        )));
    }
    Ok(())
}

/// Local-only message types (raft refuses them from a peer anyway) and proposals: `propose` only
/// hands raft a proposal at the leader, so no replica of ours forwards one, and a proposal from
/// the wire would bypass `propose`'s checks.
fn check_message_type(t: MessageType) -> Result<(), RaftLogError> {
    use MessageType::*;
    match t {
        MsgHup | MsgBeat | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum | MsgPropose => {
            Err(RaftLogError::Malformed(format!("{t:?} is not accepted from a peer")))
        }
        _ => Ok(()),
    }
}

/// An append carries consecutive entries after `index`, with terms between the previous entry's
/// and the sender's, all ordinary (membership never changes here). Raft assumes all of it.
fn check_append_shape(msg: &RaftMessage) -> Result<(), RaftLogError> {
    let mut expected_index = msg.index;
    let mut min_term = msg.log_term;
    for entry in msg.get_entries() {
        expected_index = expected_index
            .checked_add(1)
            .ok_or_else(|| RaftLogError::Malformed("entry index overflows".to_string()))?;
        let shape_ok = entry.index == expected_index
            && entry.term >= min_term
            && entry.term <= msg.term
            && entry.get_entry_type() == EntryType::EntryNormal;
        if !shape_ok {
            return Err(RaftLogError::Malformed(format!(
                "append entry {}@{} after {}@{} from a term-{} leader",
                entry.index, entry.term, msg.index, msg.log_term, msg.term
            )));
        }
        min_term = entry.term;
    }
    Ok(())
}

/// Many independent groups hosted by one node: one tick for all, frames routed by group id.
pub struct RaftGroups<S: LogStore = MemStorage> {
    // Ordered, so `tick_all` and `poll_all` visit groups in one order on every run.
    groups: BTreeMap<u32, RaftGroup<S>>,
}

impl RaftGroups<MemStorage> {
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S: LogStore> Default for RaftGroups<S> {
    fn default() -> Self {
        RaftGroups { groups: BTreeMap::new() }
    }
}

impl<S: LogStore> RaftGroups<S> {
    /// Hosts `group`; refuses a second group with the same id.
    pub fn add(&mut self, group: RaftGroup<S>) -> Result<(), RaftLogError> {
        let group_id = group.group_id();
        if self.groups.contains_key(&group_id) {
            return Err(RaftLogError::DuplicateGroup(group_id));
        }
        self.groups.insert(group_id, group);
        Ok(())
    }

    pub fn remove(&mut self, group_id: u32) -> Option<RaftGroup<S>> {
        self.groups.remove(&group_id)
    }

    pub fn get(&self, group_id: u32) -> Option<&RaftGroup<S>> {
        self.groups.get(&group_id)
    }

    pub fn get_mut(&mut self, group_id: u32) -> Option<&mut RaftGroup<S>> {
        self.groups.get_mut(&group_id)
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn group_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups.keys().copied()
    }

    pub fn tick_all(&mut self) {
        for group in self.groups.values_mut() {
            group.tick();
        }
    }

    /// Routes a frame that arrived from replica `from` to its group; the message must name
    /// `from` as its sender.
    pub fn step(&mut self, from: ReplicaId, frame: &[u8]) -> Result<(), RaftLogError> {
        let group_id = frame_group_id(frame)?;
        let group = self.groups.get_mut(&group_id).ok_or(RaftLogError::UnknownGroup(group_id))?;
        group.step_checked(frame, Some(from))
    }

    /// Polls every group and appends the non-empty outputs, in group-id order.
    pub fn poll_all(&mut self, outputs: &mut Vec<(u32, Output)>) {
        self.poll_where(outputs, |_| true);
    }

    /// Polls the groups `of` selects and appends the non-empty outputs, in group-id order.
    pub fn poll_where(&mut self, outputs: &mut Vec<(u32, Output)>, of: impl Fn(u32) -> bool) {
        for (&group_id, group) in self.groups.iter_mut().filter(|(&id, _)| of(id)) {
            let out = group.poll();
            if !out.is_empty() {
                outputs.push((group_id, out));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use std::collections::BTreeSet;

    const GROUP: u32 = 7;
    const PEERS: [ReplicaId; 3] = [1, 2, 3];

    fn idx(id: ReplicaId) -> usize {
        (id - 1) as usize
    }

    /// One replica of the test network.
    struct Replica {
        group: Option<RaftGroup>,
        /// The durable log: a crash keeps it (a node whose log is on disk).
        store: MemStorage,
        /// The state machine, durable as well: what the application applied, in order.
        applied: Vec<Entry>,
        applied_index: u64,
        incarnation: u64,
    }

    /// A tiny deterministic network: one round is one tick everywhere, then every frame on the
    /// wire is delivered (or lost, duplicated, reordered, by the seed), then every replica polls.
    /// A frame sent in one round arrives in the next.
    struct Net {
        cfg: RaftConfig,
        seed: u64,
        rng: Xoshiro256PlusPlus,
        replicas: Vec<Replica>,
        /// (from, to, frame)
        wire: Vec<(ReplicaId, ReplicaId, Vec<u8>)>,
        loss_per_mille: u32,
        dup_per_mille: u32,
        reorder: bool,
        /// Frames refused by `step`; a healthy network has none.
        step_errors: Vec<String>,
        leaders_by_term: BTreeMap<u64, ReplicaId>,
        trace: Vec<String>,
        round: u64,
        snapshots_installed: usize,
    }

    impl Net {
        fn new(replica_count: u64, seed: u64, cfg: RaftConfig) -> Net {
            let peers: Vec<ReplicaId> = (1..=replica_count).collect();
            let replicas = peers
                .iter()
                .map(|&id| {
                    let group = RaftGroup::new(GROUP, id, &peers, &cfg, seed).expect("group");
                    Replica {
                        store: group.store().clone(),
                        group: Some(group),
                        applied: Vec::new(),
                        applied_index: 0,
                        incarnation: 0,
                    }
                })
                .collect();
            Net {
                cfg,
                seed,
                rng: Xoshiro256PlusPlus::seed_from_u64(splitmix64(seed)),
                replicas,
                wire: Vec::new(),
                loss_per_mille: 0,
                dup_per_mille: 0,
                reorder: false,
                step_errors: Vec::new(),
                leaders_by_term: BTreeMap::new(),
                trace: Vec::new(),
                round: 0,
                snapshots_installed: 0,
            }
        }

        fn lossy(mut self, loss_per_mille: u32, dup_per_mille: u32) -> Net {
            self.loss_per_mille = loss_per_mille;
            self.dup_per_mille = dup_per_mille;
            self.reorder = true;
            self
        }

        fn chance(&mut self, per_mille: u32) -> bool {
            per_mille > 0 && self.rng.gen_range(0..1000) < per_mille
        }

        fn group(&mut self, id: ReplicaId) -> &mut RaftGroup {
            self.replicas[idx(id)].group.as_mut().expect("replica is up")
        }

        fn round(&mut self) {
            self.round += 1;
            for replica in &mut self.replicas {
                if let Some(group) = replica.group.as_mut() {
                    group.tick();
                }
            }
            self.deliver();
            for i in 0..self.replicas.len() {
                self.poll(i);
            }
            self.check_election_safety();
        }

        fn deliver(&mut self) {
            let mut batch = std::mem::take(&mut self.wire);
            if self.reorder {
                batch.shuffle(&mut self.rng);
            }
            for (from, to, frame) in batch {
                if self.chance(self.loss_per_mille) {
                    continue;
                }
                if self.chance(self.dup_per_mille) {
                    self.wire.push((from, to, frame.clone())); // a late duplicate
                }
                let Some(group) = self.replicas[idx(to)].group.as_mut() else {
                    continue; // a crashed replica loses what was in flight to it
                };
                if let Err(e) = group.step(&frame) {
                    let round = self.round;
                    self.step_errors.push(format!("round {round} {from}->{to}: {e}"));
                }
            }
        }

        fn poll(&mut self, i: usize) {
            let Some(group) = self.replicas[i].group.as_mut() else {
                return;
            };
            let mut out = group.poll();
            let all_messages = out.take_all_messages();
            let applied_index = group.applied_index();
            assert!(group.failure().is_none(), "{:?}", group.failure());
            let id = i as u64 + 1;
            let round = self.round;
            if let Some((leader, term)) = out.leader {
                self.trace.push(format!("{round} r{id} leader {leader} term {term}"));
            }
            if let Some(index) = out.snapshot_index {
                self.restore_from_peer(i, index);
            }
            for entry in out.committed {
                let last = self.replicas[i].applied.last().map_or(0, |e| e.index);
                assert!(entry.index > last, "r{id} got {} after {last}", entry.index);
                let data = String::from_utf8_lossy(&entry.data);
                self.trace.push(format!("{round} r{id} commit {}@{} {data}", entry.index, entry.term));
                self.replicas[i].applied.push(entry);
            }
            self.replicas[i].applied_index = applied_index;
            self.wire.extend(all_messages.into_iter().map(|(to, frame)| (id, to, frame)));
        }

        /// The application's side of a snapshot: fetch the state up to `index` from a replica
        /// that has applied that far. What this replica had must be a prefix of it.
        fn restore_from_peer(&mut self, i: usize, index: u64) {
            let donor = self
                .replicas
                .iter()
                .enumerate()
                .find(|(j, r)| *j != i && r.applied_index >= index)
                .map(|(_, r)| r.applied.iter().filter(|e| e.index <= index).cloned().collect::<Vec<_>>())
                .expect("some replica applied up to the snapshot");
            let mine = &self.replicas[i].applied;
            assert!(donor.starts_with(mine), "snapshot state diverges from r{}'s", i + 1);
            self.replicas[i].applied = donor;
            self.snapshots_installed += 1;
            self.trace.push(format!("{} r{} snapshot {index}", self.round, i + 1));
        }

        fn check_election_safety(&mut self) {
            for (i, replica) in self.replicas.iter().enumerate() {
                let Some(group) = replica.group.as_ref().filter(|g| g.is_leader()) else {
                    continue;
                };
                let id = i as u64 + 1;
                let first = *self.leaders_by_term.entry(group.term()).or_insert(id);
                assert_eq!(first, id, "two leaders in term {}", group.term());
            }
        }

        /// The live leader of the highest term, if any.
        fn leader(&self) -> Option<ReplicaId> {
            self.replicas
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.group.as_ref().map(|g| (i, g)))
                .filter(|(_, g)| g.is_leader())
                .max_by_key(|(_, g)| g.term())
                .map(|(i, _)| i as u64 + 1)
        }

        /// Runs rounds until `done` holds; the number of rounds it took, or None past `max_rounds`.
        fn run_until(&mut self, max_rounds: u64, done: impl Fn(&Net) -> bool) -> Option<u64> {
            for rounds in 0..=max_rounds {
                if done(self) {
                    return Some(rounds);
                }
                self.round();
            }
            None
        }

        fn propose_at_leader(&mut self, data: String) -> Result<(), RaftLogError> {
            let leader = self.leader().ok_or(RaftLogError::NotLeader { leader_hint: None })?;
            self.group(leader).propose(data.into_bytes())
        }

        fn crash(&mut self, id: ReplicaId) {
            self.replicas[idx(id)].group = None;
            self.wire.retain(|(_, to, _)| *to != id);
            self.trace.push(format!("{} r{id} crash", self.round));
        }

        /// Reopens a crashed replica over its durable log and state machine.
        fn restart(&mut self, id: ReplicaId) {
            let replica = &mut self.replicas[idx(id)];
            replica.incarnation += 1;
            let seed = self.seed ^ (replica.incarnation << 40);
            let group =
                RaftGroup::with_store(GROUP, id, &PEERS, &self.cfg, seed, replica.store.clone(), replica.applied_index)
                    .expect("restart over the durable log");
            replica.group = Some(group);
            self.trace.push(format!("{} r{id} restart", self.round));
        }

        fn applied_lens(&self) -> Vec<usize> {
            self.replicas.iter().map(|r| r.applied.len()).collect()
        }

        /// State machine safety: every replica's applied sequence is a prefix of the longest.
        fn check_prefix_safety(&self) {
            let longest = self.replicas.iter().map(|r| &r.applied).max_by_key(|a| a.len()).expect("replicas");
            for (i, replica) in self.replicas.iter().enumerate() {
                assert!(longest.starts_with(&replica.applied), "seed {}: r{} diverges", self.seed, i + 1);
                let distinct: BTreeSet<&[u8]> = replica.applied.iter().map(|e| e.data.as_slice()).collect();
                assert_eq!(distinct.len(), replica.applied.len(), "r{}: an entry applied twice", i + 1);
            }
        }
    }

    fn data_of(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(|e| String::from_utf8_lossy(&e.data).into_owned()).collect()
    }

    #[test]
    fn three_replicas_elect_one_leader_and_commit_in_order() {
        let mut net = Net::new(3, 1, RaftConfig::default());
        net.run_until(100, |n| n.leader().is_some()).expect("a leader within 100 ticks");
        let leader = net.leader().expect("leader");
        for k in 0..50 {
            net.group(leader).propose(format!("e{k}").into_bytes()).expect("leader accepts");
            if k % 7 == 0 {
                net.round();
            }
        }
        net.run_until(100, |n| n.applied_lens() == [50, 50, 50]).expect("all replicas commit");
        let expected: Vec<String> = (0..50).map(|k| format!("e{k}")).collect();
        for replica in &net.replicas {
            assert_eq!(data_of(&replica.applied), expected);
            assert_eq!(replica.applied, net.replicas[0].applied, "same indexes and terms");
            assert_eq!(replica.group.as_ref().and_then(|g| g.leader()), Some(leader));
        }
        let leaders = net.replicas.iter().filter(|r| r.group.as_ref().is_some_and(|g| g.is_leader()));
        assert_eq!(leaders.count(), 1);
        assert!(net.step_errors.is_empty(), "{:?}", net.step_errors);
    }

    #[test]
    fn failover_elects_a_new_leader_within_bound_and_the_old_one_catches_up() {
        let cfg = RaftConfig::default();
        let bound_ticks = 5 * cfg.election_ticks as u64;
        let mut slowest_ticks = 0;
        for seed in 0..20 {
            let mut net = Net::new(3, seed, cfg.clone());
            net.run_until(100, |n| n.leader().is_some()).expect("first leader");
            for k in 0..10 {
                net.propose_at_leader(format!("a{k}")).expect("leader accepts");
            }
            net.run_until(50, |n| n.applied_lens() == [10, 10, 10]).expect("first batch commits");

            let old = net.leader().expect("leader");
            net.crash(old);
            let ticks = net
                .run_until(bound_ticks, |n| n.leader().is_some_and(|l| l != old))
                .unwrap_or_else(|| panic!("seed {seed}: no new leader within {bound_ticks} ticks"));
            slowest_ticks = slowest_ticks.max(ticks);
            for k in 0..10 {
                net.propose_at_leader(format!("b{k}")).expect("new leader accepts");
            }
            let survivors_done =
                |n: &Net| n.replicas.iter().filter(|r| r.group.is_some()).all(|r| r.applied.len() == 20);
            net.run_until(50, survivors_done).expect("second batch commits on survivors");

            net.restart(old);
            net.run_until(100, |n| n.applied_lens() == [20, 20, 20]).expect("old leader catches up");
            for replica in &net.replicas {
                assert_eq!(replica.applied, net.replicas[0].applied, "seed {seed}");
            }
            assert!(net.step_errors.is_empty(), "{:?}", net.step_errors);
        }
        assert!(slowest_ticks < bound_ticks, "{slowest_ticks}");
    }

    /// Runs one seeded chaotic scenario: 5% loss, 5% duplication, reordering, a replica crashing
    /// now and then, periodic log compaction, proposals every other round.
    fn chaos_run(seed: u64, rounds: u64) -> Net {
        chaos_run_with(seed, rounds, RaftConfig::default())
    }

    fn chaos_run_with(seed: u64, rounds: u64, cfg: RaftConfig) -> Net {
        let mut net = Net::new(3, seed, cfg).lossy(50, 50);
        let mut crashed: Option<(ReplicaId, u64)> = None;
        let mut proposed = 0;
        for round in 0..rounds {
            net.round();
            match crashed {
                Some((id, back_at)) if round >= back_at => {
                    net.restart(id);
                    crashed = None;
                }
                None if net.chance(10) => {
                    let id = net.rng.gen_range(1..=3);
                    net.crash(id);
                    crashed = Some((id, round + net.rng.gen_range(20..80)));
                }
                _ => {}
            }
            if round % 2 == 0 && net.propose_at_leader(format!("s{seed}-{proposed}")).is_ok() {
                proposed += 1;
            }
            if round % 50 == 49 {
                compact_all(&mut net);
            }
        }
        if let Some((id, _)) = crashed {
            net.restart(id);
        }
        net
    }

    fn compact_all(net: &mut Net) {
        for replica in &mut net.replicas {
            if let Some(group) = replica.group.as_mut() {
                group.compact(replica.applied_index);
            }
        }
    }

    #[test]
    fn lossy_network_keeps_state_machine_safety_over_many_seeds() {
        lossy_runs_converge(RaftConfig::default());
    }

    #[test]
    fn frames_cut_into_fragments_survive_loss_duplicates_and_reordering() {
        // Every append and snapshot of a few dozen bytes goes in fragments of 24.
        let cfg = RaftConfig { fragment_bytes: 24, ..RaftConfig::default() };
        lossy_runs_converge(cfg);
    }

    fn lossy_runs_converge(cfg: RaftConfig) {
        let mut snapshots = 0;
        for seed in 0..50 {
            let mut net = chaos_run_with(seed, 300, cfg.clone());
            net.check_prefix_safety();
            // Heal the network: everyone converges to the same log.
            net.loss_per_mille = 0;
            net.dup_per_mille = 0;
            let converged = |n: &Net| {
                let lens = n.applied_lens();
                lens.iter().all(|&l| l == lens[0])
            };
            net.run_until(200, converged).unwrap_or_else(|| panic!("seed {seed}: {:?}", net.applied_lens()));
            net.check_prefix_safety();
            let committed = net.replicas[0].applied.len();
            assert!(committed >= 30, "seed {seed}: only {committed} entries committed");
            assert!(net.step_errors.is_empty(), "seed {seed}: {:?}", net.step_errors);
            snapshots += net.snapshots_installed;
        }
        assert!(snapshots > 0, "no crashed replica ever needed a snapshot");
    }

    #[test]
    fn the_same_seed_gives_the_same_leaders_and_commits() {
        let first = chaos_run(7, 300).trace;
        let second = chaos_run(7, 300).trace;
        assert!(first.iter().any(|e| e.contains(" leader ")));
        assert!(first.iter().any(|e| e.contains(" commit ")));
        assert_eq!(first, second);
        assert_ne!(first, chaos_run(8, 300).trace, "the seed matters");
    }

    #[test]
    fn compaction_bounds_the_log_and_a_lagging_replica_gets_a_snapshot() {
        let mut net = Net::new(3, 3, RaftConfig::default());
        net.run_until(100, |n| n.leader().is_some()).expect("leader");
        let leader = net.leader().expect("leader");
        let lagging = PEERS.into_iter().find(|&id| id != leader).expect("a follower");
        for k in 0..5 {
            net.propose_at_leader(format!("a{k}")).expect("leader accepts");
        }
        net.run_until(50, |n| n.applied_lens() == [5, 5, 5]).expect("commits");
        net.crash(lagging);
        for k in 0..30 {
            net.propose_at_leader(format!("b{k}")).expect("leader accepts");
        }
        net.run_until(50, |n| n.replicas.iter().filter(|r| r.group.is_some()).all(|r| r.applied.len() == 35))
            .expect("survivors commit");
        compact_all(&mut net);
        let first_index = net.group(leader).store().first_index().expect("first index");
        assert!(first_index > 30, "log compacted, first index {first_index}");

        net.restart(lagging);
        net.run_until(100, |n| n.applied_lens() == [35, 35, 35]).expect("lagging replica catches up");
        assert_eq!(net.snapshots_installed, 1);
        net.propose_at_leader("c".to_string()).expect("leader accepts");
        net.run_until(50, |n| n.applied_lens() == [36, 36, 36]).expect("replication resumes");
        for replica in &net.replicas {
            assert_eq!(replica.applied, net.replicas[0].applied);
        }
    }

    /// What a leader keeps entries back for: the lowest match of its followers, a crashed one's
    /// included (the service bounds it by its previous compaction); a follower answers nothing.
    #[test]
    fn the_slowest_follower_is_what_a_leader_keeps_entries_for() {
        let mut net = Net::new(3, 3, RaftConfig::default());
        net.run_until(100, |n| n.leader().is_some()).expect("leader");
        let leader = net.leader().expect("leader");
        let followers: Vec<ReplicaId> = PEERS.into_iter().filter(|&id| id != leader).collect();
        let (crashed, live) = (followers[0], followers[1]);
        for k in 0..5 {
            net.propose_at_leader(format!("a{k}")).expect("leader accepts");
        }
        net.run_until(50, |n| n.applied_lens() == [5, 5, 5]).expect("commits");
        net.run_until(30, |_| false);
        let last = net.group(leader).last_index();
        assert_eq!(net.group(leader).slowest_follower_match(), Some(last), "both followers caught up");
        assert_eq!(net.group(live).slowest_follower_match(), None, "a follower keeps nothing back");
        net.crash(crashed);
        for k in 0..30 {
            net.propose_at_leader(format!("b{k}")).expect("leader accepts");
        }
        net.run_until(2 * RaftConfig::default().election_ticks as u64 + 10, |_| false);
        assert!(net.group(leader).last_index() >= last + 30);
        assert_eq!(net.group(leader).slowest_follower_match(), Some(last), "the crashed follower's match");
    }

    #[test]
    fn a_hundred_groups_on_three_replicas_tick_and_commit() {
        const GROUPS: u32 = 100;
        let cfg = RaftConfig::default();
        let mut nodes: Vec<RaftGroups> = PEERS
            .iter()
            .map(|&id| {
                let mut groups = RaftGroups::new();
                for g in 0..GROUPS {
                    groups.add(RaftGroup::new(g, id, &PEERS, &cfg, 42).expect("group")).expect("add");
                }
                groups
            })
            .collect();
        let mut wire: Vec<(ReplicaId, ReplicaId, Vec<u8>)> = Vec::new();
        let mut committed: BTreeMap<(usize, u32), Vec<String>> = BTreeMap::new();
        let mut proposed: BTreeSet<u32> = BTreeSet::new();
        let mut outputs = Vec::new();
        for _round in 0..300 {
            nodes.iter_mut().for_each(RaftGroups::tick_all);
            for (from, to, frame) in std::mem::take(&mut wire) {
                nodes[idx(to)].step(from, &frame).expect("a healthy frame");
            }
            for (i, node) in nodes.iter_mut().enumerate() {
                node.poll_all(&mut outputs);
                for (g, mut out) in outputs.drain(..) {
                    wire.extend(out.take_all_messages().into_iter().map(|(to, f)| (i as u64 + 1, to, f)));
                    committed.entry((i, g)).or_default().extend(data_of(&out.committed));
                }
            }
            for g in 0..GROUPS {
                if proposed.contains(&g) {
                    continue;
                }
                let leader = nodes.iter_mut().filter_map(|n| n.get_mut(g)).find(|grp| grp.is_leader());
                if let Some(group) = leader {
                    group.propose(format!("g{g}").into_bytes()).expect("leader accepts");
                    proposed.insert(g);
                }
            }
            if committed.values().filter(|c| !c.is_empty()).count() == 3 * GROUPS as usize {
                break;
            }
        }
        for i in 0..3 {
            for g in 0..GROUPS {
                assert_eq!(committed.get(&(i, g)), Some(&vec![format!("g{g}")]), "node {i} group {g}");
            }
        }
    }

    /// A frame that a real peer (replica 2) sends to replica 1: its vote request.
    fn vote_request_frame() -> Vec<u8> {
        let mut peer = RaftGroup::new(GROUP, 2, &PEERS, &RaftConfig::default(), 1).expect("group");
        peer.campaign().expect("campaign");
        let mut out = peer.poll();
        out.take_all_messages().into_iter().find(|(to, _)| *to == 1).expect("a vote request to 1").1
    }

    fn frame_of(msg_type: MessageType, from: ReplicaId, to: ReplicaId, group_id: u32) -> Vec<u8> {
        let mut msg = RaftMessage::default();
        msg.set_msg_type(msg_type);
        msg.from = from;
        msg.to = to;
        msg.term = 1;
        encode_frame(group_id, &msg).expect("encode")
    }

    #[test]
    fn malformed_truncated_and_misrouted_frames_are_errors_not_panics() {
        use RaftLogError::*;
        let cfg = RaftConfig::default();
        let mut group = RaftGroup::new(GROUP, 1, &PEERS, &cfg, 1).expect("group");
        let valid = vote_request_frame();

        assert!(matches!(group.step(&[]), Err(Malformed(_))));
        assert!(matches!(group.step(&valid[..6]), Err(Malformed(_))));
        for cut in FRAME_HEADER_BYTES..valid.len() {
            assert!(matches!(group.step(&valid[..cut]), Err(Malformed(_))), "truncated at {cut}");
        }
        let mut trailing = valid.clone();
        trailing.push(0);
        assert!(matches!(group.step(&trailing), Err(Malformed(_))));
        let mut garbage_body = valid[..FRAME_HEADER_BYTES].to_vec();
        garbage_body[4..8].copy_from_slice(&3u32.to_le_bytes());
        garbage_body.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(group.step(&garbage_body), Err(Malformed(_))));
        let oversized = vec![0u8; cfg.frame_limit_bytes() as usize + 1];
        assert!(matches!(group.step(&oversized), Err(FrameTooLarge { .. })));

        assert!(matches!(group.step(&frame_of(MessageType::MsgHeartbeat, 2, 1, 99)), Err(WrongGroup { .. })));
        assert!(matches!(group.step(&frame_of(MessageType::MsgHeartbeat, 2, 3, GROUP)), Err(Misaddressed(_))));
        assert!(matches!(group.step(&frame_of(MessageType::MsgHeartbeat, 9, 1, GROUP)), Err(Misaddressed(_))));
        assert!(matches!(group.step(&frame_of(MessageType::MsgPropose, 2, 1, GROUP)), Err(Malformed(_))));
        assert!(matches!(group.step(&frame_of(MessageType::MsgHup, 2, 1, GROUP)), Err(Malformed(_))));
        let mut beyond = RaftMessage::default();
        beyond.set_msg_type(MessageType::MsgHeartbeat);
        (beyond.from, beyond.to, beyond.term, beyond.commit) = (2, 1, 1, 5);
        assert!(matches!(group.step(&encode_frame(GROUP, &beyond).expect("encode")), Err(Inconsistent(_))));
        let mut bad_append = RaftMessage::default();
        bad_append.set_msg_type(MessageType::MsgAppend);
        (bad_append.from, bad_append.to, bad_append.term) = (2, 1, 1);
        bad_append.mut_entries().push(RaftEntry { index: 5, term: 1, ..Default::default() });
        assert!(matches!(group.step(&encode_frame(GROUP, &bad_append).expect("encode")), Err(Malformed(_))));

        let mut groups = RaftGroups::new();
        groups.add(group).expect("add");
        assert!(matches!(groups.step(2, &frame_of(MessageType::MsgHeartbeat, 2, 1, 99)), Err(UnknownGroup(99))));
        assert!(matches!(groups.step(3, &valid), Err(Misaddressed(_))), "sender mismatch");
        assert!(matches!(groups.step(2, &[1, 2]), Err(Malformed(_))));
        groups.step(2, &valid).expect("the intact frame is accepted");
        let group = groups.get_mut(GROUP).expect("group");
        assert!(group.failure().is_none());
        assert!(group.poll().take_all_messages().iter().any(|(to, _)| *to == 2), "it answers the vote");
    }

    #[test]
    fn random_bytes_never_panic() {
        let cfg = RaftConfig::default();
        let valid = vote_request_frame();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        let mut group = RaftGroup::new(GROUP, 1, &PEERS, &cfg, 1).expect("group");
        for _ in 0..2000 {
            let frame = if rng.gen_bool(0.5) {
                // Random body behind a well-formed header: exercises the protobuf decoder.
                let body: Vec<u8> = (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect();
                let mut frame = GROUP.to_le_bytes().to_vec();
                frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
                frame.extend_from_slice(&body);
                frame
            } else {
                // A valid frame with a few bytes flipped.
                let mut frame = valid.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..frame.len());
                    frame[at] ^= rng.gen::<u8>() | 1;
                }
                frame
            };
            let _ = group.step(&frame);
            let _ = group.poll();
            group.tick();
        }
        assert!(group.failure().is_none(), "{:?}", group.failure());
    }

    #[test]
    fn proposals_are_checked_before_raft_sees_them() {
        let cfg = RaftConfig { max_size_per_msg: 1024, max_uncommitted_bytes: 4096, ..RaftConfig::default() };
        let mut net = Net::new(3, 4, cfg);
        net.run_until(100, |n| n.leader().is_some()).expect("leader");
        let leader = net.leader().expect("leader");
        let all_know = |n: &Net| n.replicas.iter().all(|r| r.group.as_ref().and_then(|g| g.leader()) == Some(leader));
        net.run_until(10, all_know).expect("followers learn the leader");
        let follower = PEERS.into_iter().find(|&id| id != leader).expect("follower");
        assert!(matches!(
            net.group(follower).propose(b"x".to_vec()),
            Err(RaftLogError::NotLeader { leader_hint: Some(l) }) if l == leader
        ));
        let group = net.group(leader);
        assert!(matches!(group.propose(Vec::new()), Err(RaftLogError::EmptyProposal)));
        assert!(matches!(group.propose(vec![1; 1025]), Err(RaftLogError::TooLarge { size_bytes: 1025, .. })));
        for _ in 0..4 {
            group.propose(vec![1; 1024]).expect("within the uncommitted budget");
        }
        assert!(matches!(
            group.propose(vec![1; 1]),
            Err(RaftLogError::Backpressure { uncommitted_bytes: 4096, limit_bytes: 4096 })
        ));
        net.run_until(20, |n| n.applied_lens() == [4, 4, 4]).expect("commits");
        net.group(leader).propose(vec![1; 1024]).expect("budget freed by commits");
    }

    #[test]
    fn configuration_and_restart_inputs_are_checked() {
        let bad = RaftConfig { heartbeat_ticks: 10, ..RaftConfig::default() };
        assert!(matches!(RaftGroup::new(1, 1, &PEERS, &bad, 0), Err(RaftLogError::InvalidConfig(_))));
        assert!(matches!(RaftGroup::new(1, 0, &PEERS, &RaftConfig::default(), 0), Err(RaftLogError::InvalidConfig(_))));
        let cfg = RaftConfig::default();
        let group = RaftGroup::new(1, 1, &[2, 3], &cfg, 0).expect("me is added to the voters");
        assert_eq!(group.voters(), &PEERS);
        let store = group.store().clone();
        assert!(matches!(
            RaftGroup::with_store(1, 1, &[1, 2], &cfg, 0, store.clone(), 0),
            Err(RaftLogError::InvalidConfig(_))
        ));
        assert!(matches!(RaftGroup::with_store(1, 1, &PEERS, &cfg, 0, store, 3), Err(RaftLogError::InvalidConfig(_))));
        let mut groups = RaftGroups::new();
        groups.add(group).expect("add");
        let twin = RaftGroup::new(1, 1, &PEERS, &cfg, 0).expect("group");
        assert!(matches!(groups.add(twin), Err(RaftLogError::DuplicateGroup(1))));
    }

    /// A replica restarted from scratch (log and vote lost) cannot safely rejoin under its old id:
    /// it may vote twice in a term, and raft-rs panics on the leader's first heartbeat, whose
    /// commit index (from the lost acknowledgements) lies beyond the empty log. Such a replica
    /// must rejoin under a new id through a membership change. Here we check only that the
    /// panic is turned into a refused frame and that the others carry on.
    #[test]
    fn a_replica_restarted_empty_is_refused_without_panicking() {
        let mut net = Net::new(3, 5, RaftConfig::default());
        net.run_until(100, |n| n.leader().is_some()).expect("leader");
        let leader = net.leader().expect("leader");
        let wiped = PEERS.into_iter().find(|&id| id != leader).expect("a follower");
        for k in 0..5 {
            net.propose_at_leader(format!("a{k}")).expect("leader accepts");
        }
        net.run_until(50, |n| n.applied_lens() == [5, 5, 5]).expect("commits");
        net.crash(wiped);
        let replica = &mut net.replicas[idx(wiped)];
        replica.store = new_mem_store(&PEERS);
        replica.applied.clear();
        replica.applied_index = 0;
        net.restart(wiped);
        net.run_until(30, |n| !n.step_errors.is_empty()).expect("the leader's heartbeat arrives");
        assert!(net.step_errors[0].contains("lost entries it had acknowledged"), "{:?}", net.step_errors);
        assert!(net.group(wiped).failure().is_none());
        net.propose_at_leader("b".to_string()).expect("the leader carries on");
        let others_commit = |n: &Net| n.replicas.iter().filter(|r| r.applied.len() == 6).count() == 2;
        net.run_until(20, others_commit).expect("the other two commit");
    }
}

/// What a Raft entry costs the replicas of its group on this machine, to calibrate the
/// simulator's charge for it (`replication::service::RaftCost`): three in-memory
/// replicas, `per_round` entries of `bytes` each proposed, then every frame delivered until
/// the leader has them committed. Run with `cargo test --release -p dtx --lib raft_entry_cost
/// -- --ignored --nocapture`.
#[cfg(test)]
mod calibration {
    use super::*;
    use std::time::{Duration, Instant};

    fn cost(per_round: usize, bytes: usize, rounds: usize) -> (f64, f64) {
        let peers = [1, 2, 3];
        let cfg = RaftConfig::default();
        let mut g: Vec<RaftGroup> =
            peers.iter().map(|&id| RaftGroup::new(9, id, &peers, &cfg, 7).expect("a group")).collect();
        g[0].campaign().expect("a campaign");
        let (mut leader_t, mut follower_t) = (Duration::ZERO, Duration::ZERO);
        let mut committed = 0;
        let mut wire: Vec<(ReplicaId, ReplicaId, Vec<u8>)> = Vec::new();
        for round in 0..rounds + 50 {
            let measured = round >= 50;
            for (i, group) in g.iter_mut().enumerate() {
                let t0 = Instant::now();
                if i == 0 && group.is_leader() && measured {
                    for _ in 0..per_round {
                        let _ = group.propose(vec![7u8; bytes]);
                    }
                }
                let mine: Vec<_> = wire.iter().filter(|(_, to, _)| *to == i as ReplicaId + 1).cloned().collect();
                for (from, _, frame) in &mine {
                    group.step_checked(frame, Some(*from)).expect("a frame");
                }
                let mut out = group.poll();
                if i == 0 && measured {
                    committed += out.committed.len();
                }
                let sent = out.take_all_messages();
                let elapsed = t0.elapsed();
                if measured {
                    match i {
                        0 => leader_t += elapsed,
                        _ => follower_t += elapsed / 2,
                    }
                }
                wire.retain(|(_, to, _)| *to != i as ReplicaId + 1);
                wire.extend(sent.into_iter().map(|(to, f)| (i as ReplicaId + 1, to, f)));
            }
        }
        let per = |t: Duration| t.as_nanos() as f64 / committed.max(1) as f64;
        (per(leader_t), per(follower_t))
    }

    #[test]
    #[ignore = "a measurement, not a test: run it to calibrate the simulator"]
    fn raft_entry_cost() {
        for (per_round, bytes) in [(1, 500), (10, 500), (100, 500), (1, 50_000)] {
            let (leader_ns, follower_ns) = cost(per_round, bytes, 20_000 / per_round.max(1));
            println!("{per_round} entries of {bytes} B per round: leader {leader_ns:.0} ns, each follower {follower_ns:.0} ns per entry");
        }
    }
}
