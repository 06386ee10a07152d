//! Two-phase commit made durable: what the 2PC protocols write to their node's log, and how a
//! restarted node rebuilds itself from it (presumed abort, as in R*/the textbook).
//!
//! Log points, and who waits for them:
//! - a participant that votes yes logs `Prepared` (its writes) and answers only once it is
//!   durable: after that it can no longer decide alone;
//! - the coordinator logs `Commit` (its own node's writes, and the remote participants that must
//!   hear the decision) and acknowledges the client only once it is durable: **a commit is
//!   acknowledged when its decision record is on disk**. A distributed commit installs and
//!   releases only then too; a transaction that wrote nowhere but on its coordinator's node
//!   installs and releases as soon as the record is appended (early lock release, as Silo's
//!   epochs and Aether do), and whoever may have read such a write before it is durable waits
//!   for the log's tail before it is acknowledged or votes (`read_fence`);
//! - in a replicated log, every answer that rests on reads alone (a read-only vote or commit,
//!   a coordinator's "never heard of it, so aborted") also waits for `read_fence`: a record
//!   proposed after the reads, which commits only if this incarnation of the node still leads
//!   its log. An incarnation deposed by a takeover (paused, cut off, or not yet told) would
//!   otherwise answer from a state the new leader has moved past;
//! - a participant that installs a commit logs `Outcome` and acknowledges the coordinator only
//!   once it is durable (otherwise a crash could lose a write the coordinator has forgotten);
//!   an abort's `Outcome` is not waited for (presumed abort: a lost one reads as abort anyway);
//! - the coordinator logs `Ended` when every participant acknowledged, without waiting: a lost
//!   one only makes the restarted coordinator resend a commit that is acknowledged again.
//!
//! Records are appended before the locks they describe are released, so on one node the log
//! order of two conflicting writes is their install order, and replay in log order rebuilds
//! the same state. Read-only transactions log nothing.

use super::TxnId;
use crate::net::NodeId;
use crate::rt::log::NodeLog;
use crate::storage::{RowKey, Value};
use crate::txn::Abort;
use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::any::TypeId;
use std::fmt::Debug;
use std::sync::Arc;

pub type Writes = Vec<(RowKey, Option<Value>)>;

/// What a concurrency control logs beside 2PC's own records, and what replaying them rebuilds:
/// declared in the protocol's folder (Sundial's bound and vote timestamp, MaaT's bound and
/// vote range), opaque to the skeleton, which logs, checkpoints and replays them through this.
pub trait CcLog: Default + Clone + Debug + Serialize + DeserializeOwned + Send + 'static {
    /// What a yes vote logs beside its writes, handed back with each in-doubt transaction at
    /// recovery (a commit timestamp, a range of them; `()` for OCC and 2PL).
    type Vote: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + 'static;
    /// The protocol's own records ([`NoRecord`] when it has none).
    type Record: Debug + Serialize + DeserializeOwned + 'static;
    /// Replay one of the protocol's own records.
    fn apply(&mut self, record: Self::Record);
    /// Replay a commit decided at timestamp `ts` (> 0; MaaT's bound follows its decisions).
    fn on_commit_at(&mut self, _ts: u64) {}
}

/// No records of its own: a protocol's `Record` when it logs only 2PC's.
#[derive(Debug, Serialize, Deserialize)]
pub enum NoRecord {}

/// The log of a concurrency control that logs only 2PC's records and plain yes votes (OCC, 2PL).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PlainLog;

impl CcLog for PlainLog {
    type Vote = ();
    type Record = NoRecord;
    fn apply(&mut self, record: NoRecord) {
        match record {}
    }
}

/// What a commit policy logs beside 2PC's records, and what replaying them rebuilds: declared
/// in the policy's file (`commit/epoch.rs`, `commit/watermark.rs`; `commit/two_pc.rs` logs
/// nothing of its own), opaque to the skeleton, which logs, checkpoints and replays them
/// through this, as it does a concurrency control's through [`CcLog`].
pub trait PolicyLog: Default + Clone + Debug + Serialize + DeserializeOwned + Send + 'static {
    /// Its name in a checkpoint, after the protocol's: a checkpoint of another policy is refused.
    const NAME: &'static str;
    /// The policy's own records ([`NoRecord`] when it has none).
    type Record: Debug + Serialize + DeserializeOwned + 'static;
    /// What recovery hands the node's gate.
    type Recovered: Debug + Default + Send + 'static;

    /// A record of 2PC's, read back (`bytes` as logged), before it applies: handed back to
    /// apply now, or kept (`None`) until the policy learns whether it counts, when it hands it
    /// to [`CoreReplay::apply_core`] itself (epochs hold an epoch's records until its decision;
    /// watermarks hold commits no agreement may roll back yet).
    fn hold<L: CcLog>(&mut self, record: LogRecord<L, Self>, _bytes: &[u8]) -> Option<LogRecord<L, Self>> {
        Some(record)
    }
    /// Replay one of the policy's own records.
    fn apply<L: CcLog>(&mut self, record: Self::Record, core: &mut CoreReplay<L>);
    /// What recovery learns of the policy, and, when what it still holds must count until the
    /// node learns otherwise (an epoch sealed without a decision), the 2PC state with it applied.
    fn recover<L: CcLog>(&self, core: &CoreReplay<L>) -> (Self::Recovered, Option<CoreReplay<L>>);
    /// After replay applied the rows: apply what may still be rolled back (`recovered`'s
    /// limbo) over them through `replayed`, which returns the value each write replaced, keeping
    /// those for the gate; `committed` reads a row's value now, for the in-doubt transactions.
    fn apply_limbo<V>(
        _recovered: &mut Self::Recovered,
        _in_doubt: &InDoubt<V>,
        _replayed: &mut dyn FnMut(RowKey, Option<Value>, u64, u64) -> Option<Value>,
        _committed: &dyn Fn(RowKey) -> Option<Value>,
    ) {
    }
}

/// A record of a node's log, whatever carries its parts: 2PC's own records, the concurrency
/// control's (`Own`) and the commit policy's (`Policy`). [`LogRecord`] owns them; every append
/// encodes [`RecordRef`], which borrows what the caller holds, so that a commit is logged
/// without an owned copy of its writes (slices encode as the vectors they borrow from).
///
/// A decision's `ts` is the commit timestamp of a protocol that chooses one after the votes
/// (MaaT, MVCC): its writes apply only over older ones, whatever the log order. 0 means none:
/// the writes apply in log order.
#[derive(Debug, Serialize, Deserialize)]
pub enum Record<W, N, V, R, P> {
    /// The node started; transaction ids of this boot carry its number, so that an id is never
    /// reused across a restart (a participant may still hold state for the old one).
    Boot { boot: u32 },
    /// The coordinator's decision to commit, with the writes to this node and the remote
    /// participants that must hear it.
    Commit { txn: TxnId, writes: W, participants: N, ts: u64 },
    /// A participant's yes vote: it installs `writes` if `txn` commits.
    Prepared { txn: TxnId, writes: W, vote: V },
    /// What became of a prepared transaction here.
    Outcome { txn: TxnId, committed: bool, ts: u64 },
    /// Every participant acknowledged the commit of `txn`.
    Ended { txn: TxnId },
    /// The concurrency control's own record.
    Own(R),
    /// The commit policy's own record.
    Policy(P),
}

/// `Record::Policy`'s variant index. A policy's record is written with one tag, this plus its
/// own variant's index, not the two tags serde would write ([`flatten_policy_tag`]): a record
/// of the epoch or watermark policy is as long as it was when its variants were `LogRecord`'s
/// own, so moving them behind the seam changed no byte the log (and `sim`'s charge per byte
/// logged) sees.
const POLICY_TAG: u8 = 6;

/// Rewrite a record encoded by serde (`bytes`) as the log holds it: a `Policy` record's two
/// tags become one (`POLICY_TAG` + its own); any other record is left as it is.
fn flatten_policy_tag(bytes: &mut [u8]) -> &mut [u8] {
    if bytes.first() != Some(&POLICY_TAG) {
        return bytes;
    }
    assert!(bytes.len() >= 2 && bytes[1] < 0x80 - POLICY_TAG, "a policy's record is an enum of a few variants");
    bytes[1] += POLICY_TAG;
    &mut bytes[1..]
}

/// Decode a record as the log holds it ([`flatten_policy_tag`]).
pub fn decode_record<L: CcLog, P: PolicyLog>(bytes: &[u8]) -> Result<LogRecord<L, P>, postcard::Error> {
    match bytes.first() {
        Some(&tag) if tag >= POLICY_TAG => {
            let mut two_tags = Vec::with_capacity(bytes.len() + 1);
            two_tags.extend_from_slice(&[POLICY_TAG, tag - POLICY_TAG]);
            two_tags.extend_from_slice(&bytes[1..]);
            crate::net::decode(&two_tags)
        }
        _ => crate::net::decode(bytes),
    }
}

/// Encode a record as the log holds it (appends encode in place; this is for tests and tools).
pub fn encode_record<W, N, V, R, P>(record: &Record<W, N, V, R, P>) -> Vec<u8>
where
    Record<W, N, V, R, P>: Serialize,
{
    let mut bytes = crate::net::encode(record);
    let flat_len = flatten_policy_tag(&mut bytes).len();
    bytes.drain(..bytes.len() - flat_len);
    bytes
}

/// A record as replay reads it, of the concurrency control `L` under the commit policy `P`.
pub type LogRecord<L, P> =
    Record<Writes, Vec<NodeId>, <L as CcLog>::Vote, <L as CcLog>::Record, <P as PolicyLog>::Record>;

/// A record as an append writes it, borrowing what it carries.
type RecordRef<'a, V, R, P> = Record<&'a [(RowKey, Option<Value>)], &'a [NodeId], &'a V, &'a R, &'a P>;

/// A record of 2PC's own, whatever the protocol's types (they appear in no variant but these).
type CoreRef<'a> = RecordRef<'a, (), (), ()>;

/// Transactions prepared here whose outcome the log does not hold, with their writes and vote.
pub type InDoubt<V> = Vec<(TxnId, Writes, V)>;
/// Commits decided here that not every participant acknowledged, with those participants, the
/// decision's timestamp (0 for a protocol whose decisions carry none) and its era (the epoch
/// or agreement term it was decided in; 0 under plain 2PC).
pub type Unended = Vec<(TxnId, Vec<NodeId>, u64, u64)>;

/// What a restarted node learns from its log, beyond the writes replay applied and what its
/// commit policy recovered ([`PolicyLog::Recovered`]).
#[derive(Debug)]
pub struct Recovery<L: CcLog> {
    /// The number of the boot starting now.
    pub boot: u32,
    /// Prepared here, outcome unknown: lock the writes again and ask the coordinator.
    pub in_doubt: InDoubt<L::Vote>,
    /// Committed by a coordinator here, not every participant acknowledged: tell them again.
    pub unended: Unended,
    /// Records replayed, and records that did not decode (a bug or a foreign log: reported).
    pub replayed: u64,
    pub undecodable: u64,
    /// What the protocol's own records rebuilt.
    pub own: L,
}

impl<L: CcLog> Recovery<L> {
    /// Take the in-doubt transactions whose participant state lives on worker `worker` of a
    /// node of `workers_per_node` workers, and the unended commits that worker coordinated.
    pub fn claim(&mut self, worker: u16, workers_per_node: u16) -> (InDoubt<L::Vote>, Unended) {
        let mine = |txn: &TxnId| super::coordinator_of(*txn).worker % workers_per_node == worker;
        let (in_doubt, rest) = std::mem::take(&mut self.in_doubt).into_iter().partition(|e| mine(&e.0));
        self.in_doubt = rest;
        let coord = |txn: &TxnId| super::coordinator_of(*txn).worker == worker;
        let (unended, rest) = std::mem::take(&mut self.unended).into_iter().partition(|e| coord(&e.0));
        self.unended = rest;
        (in_doubt, unended)
    }
}

/// What replaying 2PC's records so far amounts to: the latest committed value of every row
/// written (with how many committed writes it took), the prepared transactions without an
/// outcome, the commits not every participant acknowledged, the last boot number, and the
/// concurrency control's own state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct CoreReplay<L: CcLog> {
    /// Row -> (latest committed value, committed writes since the initial load).
    pub rows: FxHashMap<RowKey, (Option<Value>, u64)>,
    pub prepared: FxHashMap<TxnId, (Writes, L::Vote)>,
    /// Unended commits: their participants, the decision's timestamp and its era (0: none).
    pub unended: FxHashMap<TxnId, (Vec<NodeId>, u64, u64)>,
    pub last_boot: u32,
    pub replayed: u64,
    pub undecodable: u64,
    /// The timestamp of each row's latest write, for rows written by decisions that carry one.
    pub row_ts: FxHashMap<RowKey, u64>,
    /// The protocol's own replay state.
    pub own: L,
}

impl<L: CcLog> Default for CoreReplay<L> {
    fn default() -> Self {
        CoreReplay {
            rows: FxHashMap::default(),
            prepared: FxHashMap::default(),
            unended: FxHashMap::default(),
            last_boot: 0,
            replayed: 0,
            undecodable: 0,
            row_ts: FxHashMap::default(),
            own: L::default(),
        }
    }
}

impl<L: CcLog> CoreReplay<L> {
    /// Committed writes: in log order, or (a decision at `ts` > 0) each only over an older
    /// write, the Thomas write rule the protocol installs by, so that replay ends where the
    /// running node did whatever order the decisions reached the log in.
    pub fn install(&mut self, writes: Writes, ts: u64) {
        if ts > 0 {
            self.own.on_commit_at(ts);
        }
        for (k, v) in writes {
            if ts > 0 {
                if self.row_ts.get(&k).is_some_and(|&old| ts <= old) {
                    continue;
                }
                self.row_ts.insert(k, ts);
            }
            let e = self.rows.entry(k).or_insert((None, 0));
            e.0 = v;
            e.1 += 1;
        }
    }

    /// Apply one of 2PC's records, or the concurrency control's, decided in `era` (the epoch
    /// whose decision releases it; 0 when it applies as it is read): an unended commit keeps
    /// its era, which its resent decision names. The policy's records are its own to apply.
    pub fn apply_core<P: PolicyLog>(&mut self, r: LogRecord<L, P>, era: u64) {
        match r {
            Record::Boot { boot } => self.last_boot = self.last_boot.max(boot),
            Record::Commit { txn, writes, participants, ts } => {
                self.install(writes, ts);
                if !participants.is_empty() {
                    self.unended.insert(txn, (participants, ts, era));
                }
            }
            Record::Prepared { txn, writes, vote } => {
                self.prepared.insert(txn, (writes, vote));
            }
            Record::Outcome { txn, committed, ts } => {
                if let Some((writes, _)) = self.prepared.remove(&txn) {
                    if committed {
                        self.install(writes, ts);
                    }
                }
            }
            Record::Ended { txn } => {
                self.unended.remove(&txn);
            }
            Record::Own(record) => self.own.apply(record),
            Record::Policy(_) => debug_assert!(false, "a policy's record reached 2PC's replay"),
        }
    }

    /// Every row written, in key order, to `apply` (value, committed writes, and the
    /// timestamp of the latest, 0 if its decision carried none).
    fn apply_rows(&self, apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64)) {
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_unstable_by_key(|e| *e.0);
        for (k, (v, writes)) in rows {
            apply(*k, v.clone(), *writes, self.row_ts.get(k).copied().unwrap_or(0));
        }
    }
}

/// What replaying a log so far amounts to: 2PC's state ([`CoreReplay`]) and the commit
/// policy's. Recovery replays into it; the checkpointer keeps one up to date beside the running
/// node and writes it out as a checkpoint, after which the log before it can go.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ReplayState<L: CcLog, P: PolicyLog> {
    /// The protocol whose log this is ([`super::Cc::NAME`]): a checkpoint names it first, then
    /// its commit policy ([`PolicyLog::NAME`]).
    #[serde(skip)]
    protocol: &'static str,
    pub core: CoreReplay<L>,
    /// The commit policy's replay state.
    pub policy: P,
}

impl<L: CcLog, P: PolicyLog> ReplayState<L, P> {
    /// An empty state of `protocol`'s log.
    pub fn new(protocol: &'static str) -> Self {
        ReplayState { protocol, core: CoreReplay::default(), policy: P::default() }
    }

    /// A state from a checkpoint's bytes, which must name `protocol` and the policy: a
    /// checkpoint another protocol (or the same under another commit policy) wrote is refused
    /// with both names, never misread.
    pub fn decode(protocol: &'static str, bytes: &[u8]) -> anyhow::Result<Self> {
        let (written_by, rest) = postcard::take_from_bytes::<String>(bytes)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not name its protocol ({e})"))?;
        if written_by != protocol {
            anyhow::bail!(
                "the checkpoint was written by protocol `{written_by}`, not `{protocol}`: run `{written_by}` \
                 on this --data-dir, or give `{protocol}` an empty one"
            );
        }
        let (policy, rest) = postcard::take_from_bytes::<String>(rest)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not name its commit policy ({e})"))?;
        if policy != P::NAME {
            anyhow::bail!(
                "the checkpoint was written under commit={policy}, not commit={}: run `{protocol}` with \
                 commit={policy} on this --data-dir, or give it an empty one",
                P::NAME
            );
        }
        let mut state: Self = crate::net::decode(rest)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not decode as {protocol}'s replay state ({e})"))?;
        state.protocol = protocol;
        Ok(state)
    }

    /// The checkpoint's bytes: the protocol's name, the policy's, then the state.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(!self.protocol.is_empty(), "a replay state names its protocol");
        let out = postcard::to_stdvec(self.protocol).expect("a name encodes");
        let out = postcard::to_extend(P::NAME, out).expect("a name encodes");
        postcard::to_extend(self, out).expect("a replay state encodes into memory")
    }

    /// Apply one log record.
    pub fn apply(&mut self, bytes: &[u8]) {
        let Ok(r) = decode_record::<L, P>(bytes) else {
            self.core.undecodable += 1;
            return;
        };
        self.core.replayed += 1;
        match r {
            Record::Policy(record) => self.policy.apply(record, &mut self.core),
            r => {
                if let Some(r) = self.policy.hold::<L>(r, bytes) {
                    self.core.apply_core::<P>(r, 0);
                }
            }
        }
    }

    /// What recovery learns: every row written goes to `apply` (value, committed writes, and
    /// the timestamp of the latest, 0 if its decision carried none), and what is still
    /// undecided comes back with the protocol's own state and the policy's.
    pub fn recover(&self, apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64)) -> (Recovery<L>, P::Recovered) {
        self.core.apply_rows(apply);
        let (policy, with_held) = self.policy.recover(&self.core);
        let state = with_held.as_ref().unwrap_or(&self.core);
        let mut in_doubt: InDoubt<L::Vote> =
            state.prepared.iter().map(|(t, (w, vote))| (*t, w.clone(), vote.clone())).collect();
        in_doubt.sort_unstable_by_key(|e| e.0);
        let mut unended: Unended = state.unended.iter().map(|(t, (p, ts, e))| (*t, p.clone(), *ts, *e)).collect();
        unended.sort_unstable_by_key(|e| e.0);
        let recovery = Recovery {
            boot: self.core.last_boot + 1,
            in_doubt,
            unended,
            replayed: self.core.replayed,
            undecodable: self.core.undecodable,
            own: state.own.clone(),
        };
        (recovery, policy)
    }
}

/// Replay `records` in log order after `from` (a checkpoint's state, or empty): every row's
/// latest committed value goes to `apply` with the number of committed writes behind it. Returns
/// what is still undecided.
pub fn replay<L: CcLog, P: PolicyLog>(
    from: ReplayState<L, P>,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> (Recovery<L>, P::Recovered) {
    let (recovery, policy, _) = replay_keeping(from, records, apply);
    (recovery, policy)
}

/// [`replay`], keeping the state reached (to go on from: the checkpointer's starting point).
pub fn replay_keeping<L: CcLog, P: PolicyLog>(
    from: ReplayState<L, P>,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> (Recovery<L>, P::Recovered, ReplayState<L, P>) {
    let mut state = from;
    for bytes in records {
        state.apply(bytes);
    }
    let (recovery, policy) = state.recover(apply);
    (recovery, policy, state)
}

/// 2PC's log state machine is its replay state: the checkpointer keeps one beside the running
/// node, replicas of a replicated log keep one per log, and a node is rebuilt from its snapshot.
impl<L: CcLog, P: PolicyLog> crate::rt::log::LogMachine for ReplayState<L, P> {
    fn apply(&mut self, record: &[u8]) {
        ReplayState::apply(self, record);
    }

    fn snapshot(&self) -> Vec<u8> {
        self.encode()
    }
}

/// The log machine of `protocol` over the 2PC skeleton under the commit policy `P`: fresh, or
/// from a checkpoint (one that does not decode, or that another protocol or policy wrote, is an
/// error naming the cause).
pub fn machine<L: CcLog, P: PolicyLog>(
    protocol: &'static str,
    checkpoint: Option<&[u8]>,
) -> anyhow::Result<Box<dyn crate::rt::log::LogMachine>> {
    let state = match checkpoint {
        Some(bytes) => ReplayState::<L, P>::decode(protocol, bytes)?,
        None => ReplayState::<L, P>::new(protocol),
    };
    Ok(Box::new(state))
}

/// Where a commit's acknowledgement waits in the node's log: the LSN of its commit record, or of
/// the fence after its reads; `None` when nothing must be durable first.
pub type AckAfter = Option<u64>;

/// A node's durable log as the 2PC protocols use it: `None` when the run is not durable.
#[derive(Clone)]
pub struct TxnLog {
    log: Option<Arc<NodeLog>>,
    /// The LSN of this boot's `Boot` record: no transaction id of this boot may leave the node
    /// before it is durable.
    boot_lsn: u64,
    /// The protocol's vote and record types ([`CcLog`]) and its commit policy's record type
    /// ([`PolicyLog`]): what its appends must carry, checked in debug builds, since the log
    /// itself is untyped bytes.
    types: Option<(TypeId, TypeId, TypeId)>,
    /// Whether bytes decode as a record of the protocol and policy this log was opened for:
    /// every append is read back in debug builds, so that a record replay could not read is
    /// caught where it is written, not at a restart.
    reads_back: fn(&[u8]) -> bool,
}

/// Encodes `r` into this thread's scratch buffer and hands the bytes to `f`: a record is
/// encoded on every commit, and the log copies it anyway, so it needs no allocation of its own.
/// A record larger than the buffer is encoded into one.
/// The bytes are the log's form of the record ([`flatten_policy_tag`]).
fn with_encoded<R: Serialize, T>(r: &R, f: impl FnOnce(&[u8]) -> T) -> T {
    const SCRATCH_BYTES: usize = 64 << 10;
    thread_local!(static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
    SCRATCH.with(|scratch| {
        let Ok(mut buf) = scratch.try_borrow_mut() else { return f(flatten_policy_tag(&mut crate::net::encode(r))) };
        if buf.is_empty() {
            buf.resize(SCRATCH_BYTES, 0);
        }
        match postcard::to_slice(r, &mut buf[..]) {
            Ok(bytes) => f(flatten_policy_tag(bytes)),
            Err(_) => f(flatten_policy_tag(&mut crate::net::encode(r))),
        }
    })
}

/// No log, and no types to check appends against.
impl Default for TxnLog {
    fn default() -> Self {
        TxnLog { log: None, boot_lsn: 0, types: None, reads_back: |_| true }
    }
}

impl TxnLog {
    /// Open the log of a booting node whose protocol logs `L`'s votes and records under the
    /// commit policy `P`: append its `Boot` record.
    pub fn start<L: CcLog, P: PolicyLog>(log: Option<Arc<NodeLog>>, boot: u32) -> Self {
        let boot_lsn = match &log {
            Some(l) => with_encoded(&CoreRef::Boot { boot }, |bytes| l.append(bytes)).expect("a boot record is tiny"),
            None => 0,
        };
        let types = (TypeId::of::<L::Vote>(), TypeId::of::<L::Record>(), TypeId::of::<P::Record>());
        TxnLog { log, boot_lsn, types: Some(types), reads_back: |bytes| decode_record::<L, P>(bytes).is_ok() }
    }

    pub fn enabled(&self) -> bool {
        self.log.is_some()
    }

    /// Append a `Commit` record of writes the caller keeps (no owned copy is built), decided at
    /// `ts` (0: none).
    pub fn append_commit(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
        ts: u64,
    ) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::Commit { txn, writes, participants, ts })
    }

    /// Append a yes vote: `writes` install if `txn` commits; `vote` is the protocol's own part
    /// of it ([`CcLog::Vote`]), handed back if the node restarts before the outcome.
    pub fn append_prepared<V: Serialize + 'static>(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        vote: &V,
    ) -> Result<Option<u64>, Abort> {
        debug_assert!(self.types.is_none_or(|t| t.0 == TypeId::of::<V>()), "a vote of another protocol's type");
        let record: RecordRef<'_, V, (), ()> = Record::Prepared { txn, writes, vote };
        self.append_encoded(&record)
    }

    /// Append what became of a prepared transaction here (a commit at `ts`, 0: none).
    pub fn append_outcome(&self, txn: TxnId, committed: bool, ts: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::Outcome { txn, committed, ts })
    }

    /// Append that every participant acknowledged the commit of `txn`.
    pub fn append_ended(&self, txn: TxnId) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::Ended { txn })
    }

    /// Append one of the protocol's own records ([`CcLog::Record`]).
    pub fn append_own<R: Serialize + 'static>(&self, record: &R) -> Result<Option<u64>, Abort> {
        debug_assert!(self.types.is_none_or(|t| t.1 == TypeId::of::<R>()), "a record of another protocol's type");
        let record: RecordRef<'_, (), R, ()> = Record::Own(record);
        self.append_encoded(&record)
    }

    /// Append one of the commit policy's own records ([`PolicyLog::Record`]).
    pub fn append_policy<R: Serialize + 'static>(&self, record: &R) -> Result<Option<u64>, Abort> {
        debug_assert!(self.types.is_none_or(|t| t.2 == TypeId::of::<R>()), "a record of another policy's type");
        let record: RecordRef<'_, (), (), R> = Record::Policy(record);
        self.append_encoded(&record)
    }

    /// What a transaction that touched only this node is acknowledged after (early lock
    /// release): its commit record, appended now while it still holds its locks, so that log
    /// order is install order; or, when it wrote nothing, the log's undurable tail, since it may
    /// have read a write whose record is not durable yet. The caller installs and releases,
    /// then waits for the returned LSN ([`TxnLog::durable_counted`]).
    pub fn local_commit_lsn(&self, txn: TxnId, writes: &[(RowKey, Option<Value>)]) -> Result<Option<u64>, Abort> {
        if writes.is_empty() {
            Ok(self.read_fence())
        } else {
            self.append_commit(txn, writes, &[], 0)
        }
    }

    /// Log a distributed transaction's commit decision (this node's writes, the participants
    /// that wrote) and wait until it is durable, counting the wait; a transaction that wrote
    /// nowhere only waits for what it may have read here (`read_here`) to be durable. Nothing to
    /// do without a log. A record the log refuses is the caller's abort.
    pub async fn log_decision(
        &self,
        w: &crate::rt::Worker,
        txn: TxnId,
        local_writes: &[(RowKey, Option<Value>)],
        writers: &[NodeId],
        read_here: bool,
    ) -> Result<(), Abort> {
        if self.log.is_none() {
            return Ok(());
        }
        if local_writes.is_empty() && writers.is_empty() {
            let fence = if read_here { self.read_fence() } else { None };
            self.durable_counted(w, fence).await;
            return Ok(());
        }
        let t0 = w.now_ns();
        let lsn = self.append_commit(txn, local_writes, writers, 0)?;
        self.durable(lsn).await;
        w.note_log_wait(w.now_ns() - t0);
        Ok(())
    }

    /// Log a decision whose writes install at `ts` and wait until it is durable, counting the
    /// wait: [`TxnLog::log_decision`] for a protocol whose decisions carry a timestamp. Every
    /// decision is logged, a read-only one too, since its participants must hear it.
    pub async fn log_decision_at(
        &self,
        w: &crate::rt::Worker,
        txn: TxnId,
        local_writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
        ts: u64,
    ) -> Result<(), Abort> {
        debug_assert!(ts > 0, "a decision at a timestamp has one");
        if self.log.is_none() {
            return Ok(());
        }
        let lsn = self.append_commit(txn, local_writes, participants, ts)?;
        self.durable_counted(w, lsn).await;
        Ok(())
    }

    fn append_encoded<R: Serialize>(&self, r: &R) -> Result<Option<u64>, Abort> {
        let Some(l) = &self.log else { return Ok(None) };
        let appended = with_encoded(r, |bytes| {
            debug_assert!((self.reads_back)(bytes), "a record that replay could not decode: {bytes:?}");
            l.append(bytes)
        });
        match appended {
            Ok(lsn) => Ok(Some(lsn)),
            Err(e) => {
                crate::rt::log_warn(&format!("log refused a record: {e}"));
                Err(Abort::LogRefused)
            }
        }
    }

    /// What an answer resting on reads alone waits for ([`NodeLog::read_fence`]): a transaction
    /// that may have seen a write whose commit record is not durable (early lock release), and,
    /// in a replicated log, a record proposed after the reads, which only an incarnation that
    /// still leads the node's log gets committed. `None`: nothing to wait for.
    pub fn read_fence(&self) -> Option<u64> {
        self.log.as_ref()?.read_fence()
    }

    /// Wait until `lsn` is durable (nothing to do for `None`), counting the wait in `w`'s
    /// log-wait statistics: what a commit that is acknowledged only then waits.
    pub async fn durable_counted(&self, w: &crate::rt::Worker, lsn: Option<u64>) {
        if lsn.is_none() || self.log.is_none() {
            return;
        }
        let t0 = w.now_ns();
        self.durable(lsn).await;
        w.note_log_wait(w.now_ns() - t0);
    }

    /// Wait until `lsn` (from an append) is durable.
    pub async fn durable(&self, lsn: Option<u64>) {
        if let (Some(l), Some(lsn)) = (&self.log, lsn) {
            l.wait(lsn).await;
        }
    }

    /// Is this boot's record durable? A node under group commit serves no request before it
    /// is: a later incarnation that finds no boot record in the log then knows that no earlier
    /// one installed anything that a group commit might have acknowledged, and may start
    /// afresh (a node taken over before its first record was replicated).
    pub fn is_booted(&self) -> bool {
        self.log.as_ref().is_none_or(|l| l.durable_lsn() >= self.boot_lsn)
    }

    /// Wait until this boot's record is durable (a no-op after the first time).
    pub async fn booted(&self) {
        if let Some(l) = &self.log {
            if l.durable_lsn() < self.boot_lsn {
                l.wait(self.boot_lsn).await;
            }
        }
    }

    pub fn node_log(&self) -> Option<&Arc<NodeLog>> {
        self.log.as_ref()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::net::encode;
    use crate::protocols::twopc::commit::two_pc::TwoPcLog;

    type Plain = LogRecord<PlainLog, TwoPcLog>;

    #[test]
    fn borrowed_records_encode_as_the_owned_ones() {
        let writes = vec![(k(1), v(1)), (k(2), None)];
        let owned = encode(&Plain::Commit { txn: 9, writes: writes.clone(), participants: vec![3, 4], ts: 7 });
        assert_eq!(encode(&CoreRef::Commit { txn: 9, writes: &writes, participants: &[3, 4], ts: 7 }), owned);
        type Toy = LogRecord<toy::ToyLog, TwoPcLog>;
        let owned = encode(&Toy::Prepared { txn: 9, writes: writes.clone(), vote: "v".into() });
        let vote = String::from("v");
        let borrowed: RecordRef<'_, String, (), ()> = Record::Prepared { txn: 9, writes: &writes, vote: &vote };
        assert_eq!(encode(&borrowed), owned);
        let own = toy::ToyRecord::Note(5);
        let borrowed: RecordRef<'_, (), toy::ToyRecord, ()> = Record::Own(&own);
        assert_eq!(encode(&borrowed), encode(&Toy::Own(toy::ToyRecord::Note(5))));
    }

    #[test]
    fn replaying_after_a_checkpoint_equals_replaying_everything() {
        let recs: Vec<Vec<u8>> = [
            Plain::Boot { boot: 1 },
            Plain::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![5], ts: 0 },
            Plain::Prepared { txn: 2, writes: vec![(k(2), v(2))], vote: () },
            Plain::Commit { txn: 3, writes: vec![(k(1), v(3)), (k(4), None)], participants: vec![], ts: 0 },
            Plain::Ended { txn: 1 },
            Plain::Outcome { txn: 2, committed: true, ts: 0 },
            Plain::Prepared { txn: 6, writes: vec![(k(6), v(6))], vote: () },
        ]
        .iter()
        .map(encode)
        .collect();
        let collect = |from: ReplayState<PlainLog, TwoPcLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let (r, ()) = replay(from, rest, &mut |k, v, n, _| rows.push((k, v, n)));
            (rows, r.boot, r.in_doubt, r.unended)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        same_from_every_checkpoint(&recs, &whole, collect);
    }

    /// A checkpoint taken after any prefix of `recs` (encoded and decoded, as a restart reads
    /// it), then the records after it, recover `whole`, what replaying them all recovers.
    pub(crate) fn same_from_every_checkpoint<P: PolicyLog, T: PartialEq + std::fmt::Debug>(
        recs: &[Vec<u8>],
        whole: &T,
        collect: impl Fn(ReplayState<PlainLog, P>, &[Vec<u8>]) -> T,
    ) {
        for cut in 0..=recs.len() {
            let mut ckpt = ReplayState::<PlainLog, P>::new("occ");
            for r in &recs[..cut] {
                ckpt.apply(r);
            }
            let ckpt = ReplayState::decode("occ", &ckpt.encode()).expect("a checkpoint decodes");
            assert_eq!(&collect(ckpt, &recs[cut..]), whole, "checkpoint after {cut} records");
        }
    }

    pub(crate) fn k(n: u64) -> RowKey {
        RowKey::new(0, n)
    }

    pub(crate) fn v(b: u8) -> Option<Value> {
        Some(Value::copy_from(&[b]))
    }

    #[test]
    fn replay_applies_commits_in_log_order_and_reports_what_is_undecided() {
        let recs: Vec<Vec<u8>> = [
            Plain::Boot { boot: 1 },
            Plain::Commit { txn: 10, writes: vec![(k(1), v(1))], participants: vec![], ts: 0 },
            Plain::Prepared { txn: 11, writes: vec![(k(2), v(2))], vote: () },
            Plain::Prepared { txn: 12, writes: vec![(k(3), v(3))], vote: () },
            Plain::Outcome { txn: 11, committed: true, ts: 0 },
            Plain::Prepared { txn: 13, writes: vec![(k(4), v(4))], vote: () },
            Plain::Outcome { txn: 13, committed: false, ts: 0 },
            Plain::Commit { txn: 14, writes: vec![(k(1), v(9))], participants: vec![2, 3], ts: 0 },
            Plain::Commit { txn: 15, writes: vec![], participants: vec![4], ts: 0 },
            Plain::Ended { txn: 15 },
            Plain::Boot { boot: 2 },
        ]
        .iter()
        .map(encode)
        .collect();
        let mut applied = Vec::new();
        let (r, ()) = replay(ReplayState::<PlainLog, TwoPcLog>::new("occ"), &recs, &mut |key, val, n, _| {
            applied.push((key, val, n))
        });
        assert_eq!(applied, vec![(k(1), v(9), 2), (k(2), v(2), 1)], "latest value, and how many writes");
        assert_eq!(r.boot, 3);
        assert_eq!(r.in_doubt, vec![(12, vec![(k(3), v(3))], ())]);
        assert_eq!(r.unended, vec![(14, vec![2, 3], 0, 0)]);
        assert_eq!((r.replayed, r.undecodable), (11, 0));
    }

    #[test]
    fn decisions_at_a_timestamp_apply_only_over_older_writes() {
        let recs: Vec<Vec<u8>> = [
            Plain::Commit { txn: 1, writes: vec![(k(1), v(9))], participants: vec![], ts: 9 },
            Plain::Commit { txn: 2, writes: vec![(k(1), v(5))], participants: vec![], ts: 5 },
            Plain::Prepared { txn: 3, writes: vec![(k(2), v(3))], vote: () },
            Plain::Outcome { txn: 3, committed: true, ts: 3 },
        ]
        .iter()
        .map(encode)
        .collect();
        let mut applied = Vec::new();
        replay(ReplayState::<PlainLog, TwoPcLog>::new("maat"), &recs, &mut |key, val, n, ts| {
            applied.push((key, val, n, ts))
        });
        assert_eq!(applied, vec![(k(1), v(9), 1, 9), (k(2), v(3), 1, 3)], "the older decision, logged later, loses");
    }

    #[test]
    fn a_record_that_does_not_decode_is_counted_not_applied() {
        let recs = vec![vec![0xff, 0xff, 0xff], encode(&Plain::Boot { boot: 4 })];
        let (r, ()) =
            replay(ReplayState::<PlainLog, TwoPcLog>::new("occ"), &recs, &mut |_, _, _, _| panic!("nothing to apply"));
        assert_eq!((r.boot, r.undecodable), (5, 1));
    }

    #[test]
    fn a_checkpoint_another_protocol_wrote_is_refused_with_both_names() {
        let mut state = ReplayState::<toy::ToyLog, TwoPcLog>::new("toy");
        state.apply(&encode(&LogRecord::<toy::ToyLog, TwoPcLog>::Own(toy::ToyRecord::Note(3))));
        let e = machine::<PlainLog, TwoPcLog>("occ", Some(&state.encode())).err().expect("refused").to_string();
        assert!(e.contains("`toy`") && e.contains("`occ`"), "{e}");
        let back =
            ReplayState::<toy::ToyLog, TwoPcLog>::decode("toy", &state.encode()).expect("its own protocol reads it");
        assert_eq!(back.core.own.notes, vec![3]);
    }

    /// A toy concurrency control's log, declared here as a protocol's folder would: a record
    /// of its own and a vote of its own type, which the skeleton logs, checkpoints and
    /// recovers without knowing them.
    mod toy {
        use super::super::CcLog;
        use serde::{Deserialize, Serialize};

        #[derive(Debug, Serialize, Deserialize)]
        pub enum ToyRecord {
            Note(u64),
        }

        #[derive(Debug, Clone, Default, Serialize, Deserialize)]
        pub struct ToyLog {
            pub notes: Vec<u64>,
            pub decided_at: Vec<u64>,
        }

        impl CcLog for ToyLog {
            type Vote = String;
            type Record = ToyRecord;
            fn apply(&mut self, record: ToyRecord) {
                let ToyRecord::Note(n) = record;
                self.notes.push(n);
            }
            fn on_commit_at(&mut self, ts: u64) {
                self.decided_at.push(ts);
            }
        }
    }

    /// The toy's records go through a real node log (the simulator's disk, group-committed in
    /// lanes), survive a crash that loses what was not flushed, and come back through a
    /// checkpoint and the records after it: its own state, its in-doubt vote, its decisions.
    #[test]
    fn a_protocols_own_records_survive_a_crash() {
        use crate::rt::log::{NodeLog, SimImage};
        let reopened = NodeLog::simulated(SimImage::default(), 2).expect("an empty image");
        let node_log = reopened.log;
        node_log.set_checkpointer(Box::new(ReplayState::<toy::ToyLog, TwoPcLog>::new("toy")), 3);
        let log = TxnLog::start::<toy::ToyLog, TwoPcLog>(Some(node_log.clone()), 1);
        log.append_own(&toy::ToyRecord::Note(1)).expect("appended");
        log.append_commit(5, &[(k(1), v(1))], &[], 8).expect("appended");
        log.append_own(&toy::ToyRecord::Note(2)).expect("appended");
        log.append_prepared(6, &[(k(2), v(2))], &String::from("vote of 6")).expect("appended");
        assert!(node_log.sim_begin_cut(), "records wait for the disk");
        node_log.sim_finish_cut();
        log.append_own(&toy::ToyRecord::Note(99)).expect("appended, never flushed");
        let image = node_log.sim_crash(0);
        assert!(image.checkpoint.is_some(), "five durable records made a checkpoint (every 3)");

        let reopened = NodeLog::simulated(image, 2).expect("the disk reopens");
        let from = match &reopened.checkpoint {
            Some(bytes) => ReplayState::<toy::ToyLog, TwoPcLog>::decode("toy", bytes).expect("the toy's checkpoint"),
            None => ReplayState::new("toy"),
        };
        let mut rows = Vec::new();
        let (r, ()) = replay(from, &reopened.records, &mut |key, val, _, ts| rows.push((key, val, ts)));
        assert_eq!(r.own.notes, vec![1, 2], "its own records, and not the one the crash lost");
        assert_eq!(r.own.decided_at, vec![8]);
        assert_eq!(r.in_doubt, vec![(6, vec![(k(2), v(2))], String::from("vote of 6"))]);
        assert_eq!((rows, r.boot), (vec![(k(1), v(1), 8)], 2));
    }
}
