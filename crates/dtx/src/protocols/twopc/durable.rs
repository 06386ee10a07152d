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

/// A record of a node's log: 2PC's own, or one of the concurrency control's (`Own`).
///
/// A decision's `ts` is the commit timestamp of a protocol that chooses one after the votes
/// (MaaT, MVCC): its writes apply only over older ones, whatever the log order. 0 means none:
/// the writes apply in log order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum LogRecord<L: CcLog> {
    /// The node started; transaction ids of this boot carry its number, so that an id is never
    /// reused across a restart (a participant may still hold state for the old one).
    Boot { boot: u32 },
    /// The coordinator's decision to commit, with the writes to this node and the remote
    /// participants that must hear it.
    Commit { txn: TxnId, writes: Writes, participants: Vec<NodeId>, ts: u64 },
    /// A participant's yes vote: it installs `writes` if `txn` commits.
    Prepared { txn: TxnId, writes: Writes, vote: L::Vote },
    /// What became of a prepared transaction here.
    Outcome { txn: TxnId, committed: bool, ts: u64 },
    /// Every participant acknowledged the commit of `txn`.
    Ended { txn: TxnId },
    /// The concurrency control's own record.
    Own(L::Record),
    /// Epoch group commit (`commit=epoch`): the `Commit` and `Prepared` records that follow,
    /// up to `EpochSealed`, were made in `epoch`; they count only if it commits.
    EpochOpened { epoch: u64 },
    /// Everything this node did in `epoch` lies before this record: its vote waits for it.
    EpochSealed { epoch: u64 },
    /// What became of `epoch`, as this node learned it (the coordinator logs its commit
    /// decision before anyone hears it).
    EpochDecided { epoch: u64, committed: bool },
    /// Watermark group commit (`commit=wm`): every transaction with a timestamp below `w_p`
    /// that this node takes part in has its records before this one; `w_g` is the node's view of
    /// the global watermark then, below which no recovery rolls back.
    Watermark { w_p: u64, w_g: u64 },
    /// `commit=wm`: the recovery agreement of `term` rolled back every transaction at or above
    /// `w_g`: the `Commit` records before this one at or above it do not count.
    WmRolledBack { term: u64, w_g: u64 },
    /// `commit=wm`: the node coordinating recovery agreements started `term`.
    WmTerm { term: u64 },
    /// `commit=wm`: the coordinator decided that `term` rolls back from `w_g` (logged before any
    /// partition hears it); every partition had carried out `settled_through` and the terms
    /// before it.
    WmDecided { term: u64, w_g: u64, settled_through: u64 },
}

/// [`LogRecord`] borrowing what it carries: encoded exactly as the owned form (same variants in
/// the same order; slices encode as sequences), so that a protocol logs what it holds without
/// building an owned record first. Every append goes through it.
#[derive(Serialize)]
enum LogRecordRef<'a, V, R> {
    Boot { boot: u32 },
    Commit { txn: TxnId, writes: &'a [(RowKey, Option<Value>)], participants: &'a [NodeId], ts: u64 },
    Prepared { txn: TxnId, writes: &'a [(RowKey, Option<Value>)], vote: &'a V },
    Outcome { txn: TxnId, committed: bool, ts: u64 },
    Ended { txn: TxnId },
    Own(&'a R),
    EpochOpened { epoch: u64 },
    EpochSealed { epoch: u64 },
    EpochDecided { epoch: u64, committed: bool },
    Watermark { w_p: u64, w_g: u64 },
    WmRolledBack { term: u64, w_g: u64 },
    WmTerm { term: u64 },
    WmDecided { term: u64, w_g: u64, settled_through: u64 },
}

/// A record of 2PC's own, whatever the protocol's types (they appear in no variant but these).
type CoreRef<'a> = LogRecordRef<'a, (), ()>;

/// Transactions prepared here whose outcome the log does not hold, with their writes and vote.
pub type InDoubt<V> = Vec<(TxnId, Writes, V)>;
/// Commits decided here that not every participant acknowledged, with those participants, the
/// decision's timestamp (0 for a protocol whose decisions carry none) and its epoch (0 without
/// epoch group commit).
pub type Unended = Vec<(TxnId, Vec<NodeId>, u64, u64)>;

/// What a restarted node learns from its log, beyond the writes replay applied.
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
    /// Epoch group commit: what the log says of the epochs.
    pub epochs: EpochsRecovered,
    /// Watermark group commit: what the log says of the watermarks.
    pub wm: WmRecovered,
}

/// What a node's log says of watermark group commit (`commit=wm`; all zero without).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WmRecovered {
    /// The latest W_p the node persisted.
    pub persisted: u64,
    /// The node's latest logged view of W_g: no agreement rolls back below it.
    pub view: u64,
    /// The latest agreement term this node rolled back in.
    pub term: u64,
    /// The latest term this node began as the agreements' coordinator, and the decisions it
    /// logged that some partition may not have carried out, `(term, w_g)` oldest first.
    pub coordinator_term: u64,
    pub decided: Vec<(u64, u64)>,
    /// The largest timestamp the log holds a commit of.
    pub max_ts: u64,
    /// Commits at or above `view` (a recovery may roll them back), in log order: applied over
    /// the rest by the node, which keeps what they replace (`undo`).
    pub limbo: Vec<(u64, Writes)>,
    /// What rolling `limbo` back puts back, `(ts, key, value)` in install order.
    pub undo: Vec<(u64, RowKey, Option<Value>)>,
}

/// What a node's log says of its epochs (`commit=epoch`; all zero without).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochsRecovered {
    /// The highest epoch the log names.
    pub last_epoch: u64,
    /// The highest epoch the log holds a commit decision of.
    pub last_committed: u64,
    /// An epoch this node voted for (sealed) whose fate its log does not hold (the node
    /// crashed before it heard): replayed as committed, and undone if it turns out aborted.
    pub limbo: Option<u64>,
    /// The rows the limbo epoch wrote, `(key, value, writes, ts)` as replay hands rows over,
    /// for the node to apply over the rest, keeping the values they replace.
    pub limbo_rows: Vec<(RowKey, Option<Value>, u64, u64)>,
    /// The limbo epoch's transactions still in doubt here (prepared in it, no outcome).
    pub limbo_txns: Vec<TxnId>,
    /// What undoing the limbo epoch puts back, oldest first: filled in by the node as it
    /// applies `limbo_rows` (and for the keys its in-doubt transactions may install).
    pub limbo_undo: Vec<(RowKey, Option<Value>)>,
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

/// What replaying a log so far amounts to: the latest committed value of every row written
/// (with how many committed writes it took), the prepared transactions without an outcome, the
/// commits not every participant acknowledged, the last boot number, and the protocol's own
/// state. Recovery replays into it; the checkpointer keeps one up to date beside the running
/// node and writes it out as a checkpoint, after which the log before it can go.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ReplayState<L: CcLog> {
    /// The protocol whose log this is ([`super::Cc::NAME`]): a checkpoint names it first.
    #[serde(skip)]
    protocol: &'static str,
    /// Row -> (latest committed value, committed writes since the initial load).
    pub rows: FxHashMap<RowKey, (Option<Value>, u64)>,
    pub prepared: FxHashMap<TxnId, (Writes, L::Vote)>,
    /// Unended commits: their participants, the decision's timestamp and its epoch (0: none).
    pub unended: FxHashMap<TxnId, (Vec<NodeId>, u64, u64)>,
    pub last_boot: u32,
    pub replayed: u64,
    pub undecodable: u64,
    /// The timestamp of each row's latest write, for rows written by decisions that carry one.
    pub row_ts: FxHashMap<RowKey, u64>,
    /// The protocol's own replay state.
    pub own: L,
    /// Epoch group commit: the epochs not decided yet, and where the log stands.
    pub epochs: EpochReplay,
    /// Watermark group commit: the commits a recovery may still roll back.
    pub wm: WmReplay,
}

/// Replaying a log of watermark group commit (`commit=wm`): from its first `Watermark` record
/// on, a `Commit` at or above the node's logged view of W_g waits, since a recovery agreement
/// may roll it back; it counts once a later view passes it, and is dropped by a `WmRolledBack`
/// at or below its timestamp (by log position: commits after that record count as usual).
/// Bounded by what a node commits in the few intervals its view trails its commits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WmReplay {
    on: bool,
    view: u64,
    persisted: u64,
    term: u64,
    coordinator_term: u64,
    /// Decisions not known to be carried out everywhere: one per agreement since the last that
    /// finished.
    decided: std::collections::BTreeMap<u64, u64>,
    max_ts: u64,
    /// Commits at or above `view`, in log order.
    pending: Vec<(u64, Writes)>,
}

/// Replaying a log of epoch group commit (`commit=epoch`): a `Commit` or `Prepared` record made
/// in an epoch, and any `Outcome` or `Ended` of its transaction, wait until the epoch's decision
/// and count only if it committed. Without epochs every field stays empty.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EpochReplay {
    /// The epoch whose records follow (between its `EpochOpened` and `EpochSealed`).
    open: Option<u64>,
    /// Records of undecided epochs, in log order, and whether the epoch was sealed (voted).
    /// Bounded: a node opens an epoch only after it learned the previous one's fate, so at
    /// most two are undecided, each holding one epoch's records.
    pending: std::collections::BTreeMap<u64, (Vec<Vec<u8>>, bool)>,
    /// Transactions whose `Commit` or `Prepared` record waits in a pending epoch.
    txns: FxHashMap<TxnId, u64>,
    last_epoch: u64,
    last_committed: u64,
    /// The epoch whose records are being applied (0 outside a decision): an unended commit
    /// keeps its epoch, which its resent decision names.
    deciding: u64,
}

impl<L: CcLog> ReplayState<L> {
    /// An empty state of `protocol`'s log.
    pub fn new(protocol: &'static str) -> Self {
        ReplayState {
            protocol,
            rows: FxHashMap::default(),
            prepared: FxHashMap::default(),
            unended: FxHashMap::default(),
            last_boot: 0,
            replayed: 0,
            undecodable: 0,
            row_ts: FxHashMap::default(),
            own: L::default(),
            epochs: EpochReplay::default(),
            wm: WmReplay::default(),
        }
    }

    /// A state from a checkpoint's bytes, which must name `protocol`: a checkpoint another
    /// protocol wrote is refused with both names, never misread.
    pub fn decode(protocol: &'static str, bytes: &[u8]) -> anyhow::Result<Self> {
        let (written_by, rest) = postcard::take_from_bytes::<String>(bytes)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not name its protocol ({e})"))?;
        if written_by != protocol {
            anyhow::bail!(
                "the checkpoint was written by protocol `{written_by}`, not `{protocol}`: run `{written_by}` \
                 on this --data-dir, or give `{protocol}` an empty one"
            );
        }
        let mut state: Self = crate::net::decode(rest)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not decode as {protocol}'s replay state ({e})"))?;
        state.protocol = protocol;
        Ok(state)
    }

    /// The checkpoint's bytes: the protocol's name, then the state.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(!self.protocol.is_empty(), "a replay state names its protocol");
        let out = postcard::to_stdvec(self.protocol).expect("a name encodes");
        postcard::to_extend(self, out).expect("a replay state encodes into memory")
    }

    /// Committed writes: in log order, or (a decision at `ts` > 0) each only over an older
    /// write, the Thomas write rule the protocol installs by, so that replay ends where the
    /// running node did whatever order the decisions reached the log in.
    fn install(&mut self, writes: Writes, ts: u64) {
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

    /// Apply one log record.
    pub fn apply(&mut self, bytes: &[u8]) {
        let Ok(r) = crate::net::decode::<LogRecord<L>>(bytes) else {
            self.undecodable += 1;
            return;
        };
        self.replayed += 1;
        if let Some(epoch) = self.epoch_of(&r) {
            self.epochs.pending.entry(epoch).or_default().0.push(bytes.to_vec());
            return;
        }
        self.apply_record(r);
    }

    /// The undecided epoch a record belongs to, if it must wait for that epoch's decision: a
    /// `Commit` or `Prepared` made while an epoch was open, or what follows of its transaction.
    fn epoch_of(&mut self, r: &LogRecord<L>) -> Option<u64> {
        let e = &mut self.epochs;
        match r {
            LogRecord::Commit { txn, .. } | LogRecord::Prepared { txn, .. } => {
                let epoch = e.open?;
                e.txns.insert(*txn, epoch);
                Some(epoch)
            }
            LogRecord::Outcome { txn, .. } | LogRecord::Ended { txn } => e.txns.get(txn).copied(),
            _ => None,
        }
    }

    fn apply_record(&mut self, r: LogRecord<L>) {
        match r {
            LogRecord::Boot { boot } => self.last_boot = self.last_boot.max(boot),
            LogRecord::Commit { ts, writes, .. } if self.wm.on && ts >= self.wm.view => {
                self.wm.max_ts = self.wm.max_ts.max(ts);
                self.wm.pending.push((ts, writes));
            }
            LogRecord::Commit { txn, writes, participants, ts } => {
                self.wm.max_ts = self.wm.max_ts.max(ts);
                self.install(writes, ts);
                if !participants.is_empty() {
                    self.unended.insert(txn, (participants, ts, self.epochs.deciding));
                }
            }
            LogRecord::Prepared { txn, writes, vote } => {
                self.prepared.insert(txn, (writes, vote));
            }
            LogRecord::Outcome { txn, committed, ts } => {
                if let Some((writes, _)) = self.prepared.remove(&txn) {
                    if committed {
                        self.install(writes, ts);
                    }
                }
            }
            LogRecord::Ended { txn } => {
                self.unended.remove(&txn);
            }
            LogRecord::Own(record) => self.own.apply(record),
            LogRecord::EpochOpened { epoch } => {
                self.epochs.open = Some(epoch);
                self.epochs.pending.entry(epoch).or_default();
                self.epochs.last_epoch = self.epochs.last_epoch.max(epoch);
            }
            LogRecord::EpochSealed { epoch } => {
                self.epochs.open = None;
                self.epochs.pending.entry(epoch).or_default().1 = true;
            }
            LogRecord::EpochDecided { epoch, committed } => self.decide_epoch(epoch, committed),
            LogRecord::Watermark { w_p, w_g } => {
                self.wm.on = true;
                self.wm.persisted = self.wm.persisted.max(w_p);
                self.settle_below(w_g);
            }
            LogRecord::WmRolledBack { term, w_g } => {
                self.wm.term = self.wm.term.max(term);
                self.wm.pending.retain(|(ts, _)| *ts < w_g);
                self.settle_below(w_g);
            }
            LogRecord::WmTerm { term } => self.wm.coordinator_term = self.wm.coordinator_term.max(term),
            LogRecord::WmDecided { term, w_g, settled_through } => {
                self.wm.coordinator_term = self.wm.coordinator_term.max(term);
                self.wm.decided.insert(term, w_g);
                self.wm.decided = self.wm.decided.split_off(&(settled_through + 1));
            }
        }
    }

    /// No recovery rolls back below `w_g` any more: the commits waiting below it count, in log
    /// order.
    fn settle_below(&mut self, w_g: u64) {
        self.wm.view = self.wm.view.max(w_g);
        let view = self.wm.view;
        let (settled, pending) = std::mem::take(&mut self.wm.pending).into_iter().partition(|(ts, _)| *ts < view);
        self.wm.pending = pending;
        for (ts, writes) in settled {
            self.install(writes, ts);
        }
    }

    /// `epoch` was decided: its records count now if it committed, and are dropped if not.
    fn decide_epoch(&mut self, epoch: u64, committed: bool) {
        let e = &mut self.epochs;
        e.last_epoch = e.last_epoch.max(epoch);
        if committed {
            e.last_committed = e.last_committed.max(epoch);
        }
        if e.open == Some(epoch) {
            e.open = None;
        }
        let Some((records, _)) = e.pending.remove(&epoch) else { return };
        e.txns.retain(|_, ep| *ep != epoch);
        if !committed {
            return;
        }
        e.deciding = epoch;
        for bytes in records {
            if let Ok(r) = crate::net::decode::<LogRecord<L>>(&bytes) {
                self.apply_record(r);
            }
        }
        self.epochs.deciding = 0;
    }

    /// What recovery learns: every row written goes to `apply` (value, committed writes, and
    /// the timestamp of the latest, 0 if its decision carried none), and what is still
    /// undecided comes back with the protocol's own state.
    pub fn recover(&self, apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64)) -> Recovery<L> {
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_unstable_by_key(|e| *e.0);
        for (k, (v, writes)) in rows {
            apply(*k, v.clone(), *writes, self.row_ts.get(k).copied().unwrap_or(0));
        }
        // An epoch this node sealed without learning its fate counts as committed until the
        // node learns otherwise; one it never sealed cannot have committed (it never voted).
        let limbo = self.epochs.pending.iter().rev().find(|(_, (_, sealed))| *sealed).map(|(e, _)| *e);
        let mut epochs = EpochsRecovered {
            last_epoch: self.epochs.last_epoch,
            last_committed: self.epochs.last_committed,
            limbo,
            limbo_rows: Vec::new(),
            limbo_txns: Vec::new(),
            limbo_undo: Vec::new(),
        };
        let with_limbo = limbo.map(|epoch| {
            let mut with = self.clone();
            with.decide_epoch(epoch, true);
            with
        });
        let state = with_limbo.as_ref().unwrap_or(self);
        if let Some(with) = &with_limbo {
            for (k, (v, writes)) in &with.rows {
                let before = self.rows.get(k).map_or(0, |e| e.1);
                if *writes > before {
                    epochs.limbo_rows.push((*k, v.clone(), writes - before, with.row_ts.get(k).copied().unwrap_or(0)));
                }
            }
            epochs.limbo_rows.sort_unstable_by_key(|e| e.0);
            epochs.limbo_txns = with.prepared.keys().filter(|t| !self.prepared.contains_key(t)).copied().collect();
        }
        let mut in_doubt: InDoubt<L::Vote> =
            state.prepared.iter().map(|(t, (w, vote))| (*t, w.clone(), vote.clone())).collect();
        in_doubt.sort_unstable_by_key(|e| e.0);
        let mut unended: Unended = state.unended.iter().map(|(t, (p, ts, e))| (*t, p.clone(), *ts, *e)).collect();
        unended.sort_unstable_by_key(|e| e.0);
        Recovery {
            boot: self.last_boot + 1,
            in_doubt,
            unended,
            replayed: self.replayed,
            undecodable: self.undecodable,
            own: state.own.clone(),
            epochs,
            wm: WmRecovered {
                persisted: self.wm.persisted,
                view: self.wm.view,
                term: self.wm.term,
                coordinator_term: self.wm.coordinator_term,
                decided: self.wm.decided.iter().map(|(&t, &w)| (t, w)).collect(),
                max_ts: self.wm.max_ts,
                limbo: self.wm.pending.clone(),
                undo: Vec::new(),
            },
        }
    }
}

/// Replay `records` in log order after `from` (a checkpoint's state, or empty): every row's
/// latest committed value goes to `apply` with the number of committed writes behind it. Returns
/// what is still undecided.
pub fn replay<L: CcLog>(
    from: ReplayState<L>,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> Recovery<L> {
    replay_keeping(from, records, apply).0
}

/// [`replay`], keeping the state reached (to go on from: the checkpointer's starting point).
pub fn replay_keeping<L: CcLog>(
    from: ReplayState<L>,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> (Recovery<L>, ReplayState<L>) {
    let mut state = from;
    for bytes in records {
        state.apply(bytes);
    }
    (state.recover(apply), state)
}

/// 2PC's log state machine is its replay state: the checkpointer keeps one beside the running
/// node, replicas of a replicated log keep one per log, and a node is rebuilt from its snapshot.
impl<L: CcLog> crate::rt::log::LogMachine for ReplayState<L> {
    fn apply(&mut self, record: &[u8]) {
        ReplayState::apply(self, record);
    }

    fn snapshot(&self) -> Vec<u8> {
        self.encode()
    }
}

/// The log machine of `protocol` over the 2PC skeleton: fresh, or from a checkpoint (one that
/// does not decode, or that another protocol wrote, is an error naming the cause).
pub fn machine<L: CcLog>(
    protocol: &'static str,
    checkpoint: Option<&[u8]>,
) -> anyhow::Result<Box<dyn crate::rt::log::LogMachine>> {
    let state = match checkpoint {
        Some(bytes) => ReplayState::<L>::decode(protocol, bytes)?,
        None => ReplayState::<L>::new(protocol),
    };
    Ok(Box::new(state))
}

/// Where a commit's acknowledgement waits in the node's log: the LSN of its commit record, or of
/// the fence after its reads; `None` when nothing must be durable first.
pub type AckAfter = Option<u64>;

/// A node's durable log as the 2PC protocols use it: `None` when the run is not durable.
#[derive(Clone, Default)]
pub struct TxnLog {
    log: Option<Arc<NodeLog>>,
    /// The LSN of this boot's `Boot` record: no transaction id of this boot may leave the node
    /// before it is durable.
    boot_lsn: u64,
    /// The protocol's vote and record types ([`CcLog`]): what its appends must carry, checked
    /// in debug builds, since the log itself is untyped bytes.
    types: Option<(TypeId, TypeId)>,
}

/// Encodes `r` into this thread's scratch buffer and hands the bytes to `f`: a record is
/// encoded on every commit, and the log copies it anyway, so it needs no allocation of its own.
/// A record larger than the buffer is encoded into one.
fn with_encoded<R: Serialize, T>(r: &R, f: impl FnOnce(&[u8]) -> T) -> T {
    const SCRATCH_BYTES: usize = 64 << 10;
    thread_local!(static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
    SCRATCH.with(|scratch| {
        let Ok(mut buf) = scratch.try_borrow_mut() else { return f(&crate::net::encode(r)) };
        if buf.is_empty() {
            buf.resize(SCRATCH_BYTES, 0);
        }
        match postcard::to_slice(r, &mut buf[..]) {
            Ok(bytes) => f(bytes),
            Err(_) => f(&crate::net::encode(r)),
        }
    })
}

impl TxnLog {
    /// Open the log of a booting node whose protocol logs `L`'s votes and records: append its
    /// `Boot` record.
    pub fn start<L: CcLog>(log: Option<Arc<NodeLog>>, boot: u32) -> Self {
        let boot_lsn = match &log {
            Some(l) => with_encoded(&CoreRef::Boot { boot }, |bytes| l.append(bytes)).expect("a boot record is tiny"),
            None => 0,
        };
        TxnLog { log, boot_lsn, types: Some((TypeId::of::<L::Vote>(), TypeId::of::<L::Record>())) }
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
        let record: LogRecordRef<'_, V, ()> = LogRecordRef::Prepared { txn, writes, vote };
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

    /// Append that the records which follow belong to `epoch` (epoch group commit).
    pub fn append_epoch_opened(&self, epoch: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::EpochOpened { epoch })
    }

    /// Append that this node's records of `epoch` end here.
    pub fn append_epoch_sealed(&self, epoch: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::EpochSealed { epoch })
    }

    /// Append what became of `epoch`.
    pub fn append_epoch_decided(&self, epoch: u64, committed: bool) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::EpochDecided { epoch, committed })
    }

    /// Append this node's partition watermark and its view of the global one (`commit=wm`).
    pub fn append_watermark(&self, w_p: u64, w_g: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::Watermark { w_p, w_g })
    }

    /// Append that the agreement of `term` rolled back everything at or above `w_g`.
    pub fn append_wm_rolled_back(&self, term: u64, w_g: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::WmRolledBack { term, w_g })
    }

    /// Append that this node started the agreement of `term`.
    pub fn append_wm_term(&self, term: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::WmTerm { term })
    }

    /// Append that this node decided the agreement of `term` on `w_g`, every partition having
    /// carried out the agreements through `settled_through`.
    pub fn append_wm_decided(&self, term: u64, w_g: u64, settled_through: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&CoreRef::WmDecided { term, w_g, settled_through })
    }

    /// Append one of the protocol's own records ([`CcLog::Record`]).
    pub fn append_own<R: Serialize + 'static>(&self, record: &R) -> Result<Option<u64>, Abort> {
        debug_assert!(self.types.is_none_or(|t| t.1 == TypeId::of::<R>()), "a record of another protocol's type");
        let record: LogRecordRef<'_, (), R> = LogRecordRef::Own(record);
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
        match with_encoded(r, |bytes| l.append(bytes)) {
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
mod tests {
    use super::*;
    use crate::net::encode;

    type Plain = LogRecord<PlainLog>;

    #[test]
    fn borrowed_records_encode_as_the_owned_ones() {
        let writes = vec![(k(1), v(1)), (k(2), None)];
        let owned = encode(&Plain::Commit { txn: 9, writes: writes.clone(), participants: vec![3, 4], ts: 7 });
        assert_eq!(encode(&CoreRef::Commit { txn: 9, writes: &writes, participants: &[3, 4], ts: 7 }), owned);
        let owned = encode(&LogRecord::<toy::ToyLog>::Prepared { txn: 9, writes: writes.clone(), vote: "v".into() });
        let vote = String::from("v");
        let borrowed: LogRecordRef<'_, String, ()> = LogRecordRef::Prepared { txn: 9, writes: &writes, vote: &vote };
        assert_eq!(encode(&borrowed), owned);
        let own = toy::ToyRecord::Note(5);
        let borrowed: LogRecordRef<'_, (), toy::ToyRecord> = LogRecordRef::Own(&own);
        assert_eq!(encode(&borrowed), encode(&LogRecord::<toy::ToyLog>::Own(toy::ToyRecord::Note(5))));
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
        let collect = |from: ReplayState<PlainLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let r = replay(from, rest, &mut |k, v, n, _| rows.push((k, v, n)));
            (rows, r.boot, r.in_doubt, r.unended)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        same_from_every_checkpoint(&recs, &whole, collect);
    }

    /// A checkpoint taken after any prefix of `recs` (encoded and decoded, as a restart reads
    /// it), then the records after it, recover `whole`, what replaying them all recovers.
    fn same_from_every_checkpoint<T: PartialEq + std::fmt::Debug>(
        recs: &[Vec<u8>],
        whole: &T,
        collect: impl Fn(ReplayState<PlainLog>, &[Vec<u8>]) -> T,
    ) {
        for cut in 0..=recs.len() {
            let mut ckpt = ReplayState::<PlainLog>::new("occ");
            for r in &recs[..cut] {
                ckpt.apply(r);
            }
            let ckpt = ReplayState::decode("occ", &ckpt.encode()).expect("a checkpoint decodes");
            assert_eq!(&collect(ckpt, &recs[cut..]), whole, "checkpoint after {cut} records");
        }
    }

    fn k(n: u64) -> RowKey {
        RowKey::new(0, n)
    }

    fn v(b: u8) -> Option<Value> {
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
        let r = replay(ReplayState::<PlainLog>::new("occ"), &recs, &mut |key, val, n, _| applied.push((key, val, n)));
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
        replay(ReplayState::<PlainLog>::new("maat"), &recs, &mut |key, val, n, ts| applied.push((key, val, n, ts)));
        assert_eq!(applied, vec![(k(1), v(9), 1, 9), (k(2), v(3), 1, 3)], "the older decision, logged later, loses");
    }

    /// Epoch group commit: an epoch's `Commit` and `Prepared` records, and what follows of their
    /// transactions, count only once the epoch is decided committed; a failed epoch's are
    /// dropped, but not the outcome, logged in it, of a transaction of an earlier epoch.
    #[test]
    fn an_epochs_records_count_only_if_it_commits() {
        let recs: Vec<Vec<u8>> = [
            Plain::EpochOpened { epoch: 1 },
            Plain::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![], ts: 0 },
            Plain::Prepared { txn: 2, writes: vec![(k(2), v(2))], vote: () },
            Plain::Commit { txn: 3, writes: vec![(k(3), v(3))], participants: vec![7], ts: 0 },
            Plain::EpochSealed { epoch: 1 },
            Plain::EpochDecided { epoch: 1, committed: true },
            Plain::EpochOpened { epoch: 2 },
            Plain::Commit { txn: 4, writes: vec![(k(1), v(4))], participants: vec![8], ts: 0 },
            Plain::Outcome { txn: 2, committed: true, ts: 0 },
            Plain::Prepared { txn: 5, writes: vec![(k(5), v(5))], vote: () },
            Plain::Outcome { txn: 5, committed: true, ts: 0 },
            Plain::EpochSealed { epoch: 2 },
            Plain::EpochDecided { epoch: 2, committed: false },
            Plain::EpochOpened { epoch: 3 },
            Plain::Commit { txn: 6, writes: vec![(k(6), v(6))], participants: vec![], ts: 0 },
        ]
        .iter()
        .map(encode)
        .collect();
        let mut applied = Vec::new();
        let r = replay(ReplayState::<PlainLog>::new("occ"), &recs, &mut |key, val, n, _| applied.push((key, val, n)));
        applied.sort_by_key(|e| e.0);
        assert_eq!(
            applied,
            vec![(k(1), v(1), 1), (k(2), v(2), 1), (k(3), v(3), 1)],
            "epoch 1's commits and the outcome of its prepared 2; not epoch 2's, nor open epoch 3's"
        );
        assert!(r.in_doubt.is_empty(), "{:?}", r.in_doubt);
        assert_eq!(r.unended, vec![(3, vec![7], 0, 1)], "an unended commit keeps its epoch");
        assert_eq!(r.epochs, EpochsRecovered { last_epoch: 3, last_committed: 1, ..Default::default() });
    }

    /// Watermark group commit: a commit counts once a logged view of W_g passes it, a rollback
    /// drops the commits before it at or above its W_g (by log position: a later commit at a high
    /// timestamp stays), and what no view passed yet comes back as limbo. A checkpoint taken
    /// anywhere gives the same recovery.
    #[test]
    fn watermark_commits_wait_for_a_view_and_a_rollback_drops_by_log_position() {
        let commit = |txn, n: u64, b, ts| Plain::Commit { txn, writes: vec![(k(n), v(b))], participants: vec![], ts };
        let recs: Vec<Vec<u8>> = [
            Plain::Watermark { w_p: 0, w_g: 0 },
            commit(1, 1, 1, 5),
            commit(2, 2, 2, 12),
            Plain::Watermark { w_p: 10, w_g: 8 },
            commit(3, 3, 3, 15),
            commit(4, 1, 4, 20),
            Plain::WmTerm { term: 1 },
            Plain::WmDecided { term: 1, w_g: 14, settled_through: 0 },
            Plain::WmRolledBack { term: 1, w_g: 14 },
            commit(5, 4, 5, 30),
            Plain::Watermark { w_p: 25, w_g: 11 },
            Plain::WmTerm { term: 2 },
            Plain::WmDecided { term: 2, w_g: 26, settled_through: 1 },
        ]
        .iter()
        .map(encode)
        .collect();
        let collect = |from: ReplayState<PlainLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let r = replay(from, rest, &mut |k, v, _, ts| rows.push((k, v, ts)));
            rows.sort_by_key(|e| e.0);
            (rows, r.wm)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        assert_eq!(
            whole.0,
            vec![(k(1), v(1), 5), (k(2), v(2), 12)],
            "5 under the view of 8, 12 under the rollback's 14; 15 and 20 rolled back; 30 waits"
        );
        let wm = &whole.1;
        assert_eq!((wm.persisted, wm.view, wm.term, wm.max_ts), (25, 14, 1, 30));
        assert_eq!((wm.coordinator_term, &wm.decided[..]), (2, &[(2, 26)][..]), "term 1 carried out everywhere");
        assert_eq!(wm.limbo, vec![(30, vec![(k(4), v(5))])]);
        same_from_every_checkpoint(&recs, &whole, collect);
    }

    /// An epoch the node sealed without learning its fate is replayed on top, as committed, with
    /// what it wrote and its transactions still in doubt set apart: the node undoes them if the
    /// epoch turns out aborted. A checkpoint taken anywhere gives the same recovery.
    #[test]
    fn a_sealed_epoch_without_a_decision_is_in_limbo() {
        let recs: Vec<Vec<u8>> = [
            Plain::EpochOpened { epoch: 4 },
            Plain::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![], ts: 0 },
            Plain::EpochSealed { epoch: 4 },
            Plain::EpochDecided { epoch: 4, committed: true },
            Plain::EpochOpened { epoch: 5 },
            Plain::Commit { txn: 2, writes: vec![(k(1), v(2)), (k(2), v(2))], participants: vec![3], ts: 0 },
            Plain::Prepared { txn: 3, writes: vec![(k(3), v(3))], vote: () },
            Plain::EpochSealed { epoch: 5 },
        ]
        .iter()
        .map(encode)
        .collect();
        let collect = |from: ReplayState<PlainLog>, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let r = replay(from, rest, &mut |k, v, n, _| rows.push((k, v, n)));
            (rows, r.in_doubt, r.unended, r.epochs)
        };
        let whole = collect(ReplayState::new("occ"), &recs);
        assert_eq!(whole.0, vec![(k(1), v(1), 1)], "the limbo epoch is not in the rows applied first");
        assert_eq!(whole.1, vec![(3, vec![(k(3), v(3))], ())]);
        assert_eq!(whole.2, vec![(2, vec![3], 0, 5)]);
        let e = &whole.3;
        assert_eq!((e.last_epoch, e.last_committed, e.limbo), (5, 4, Some(5)));
        assert_eq!(e.limbo_rows, vec![(k(1), v(2), 1, 0), (k(2), v(2), 1, 0)]);
        assert_eq!(e.limbo_txns, vec![3]);
        same_from_every_checkpoint(&recs, &whole, collect);
    }

    #[test]
    fn a_record_that_does_not_decode_is_counted_not_applied() {
        let recs = vec![vec![0xff, 0xff, 0xff], encode(&Plain::Boot { boot: 4 })];
        let r = replay(ReplayState::<PlainLog>::new("occ"), &recs, &mut |_, _, _, _| panic!("nothing to apply"));
        assert_eq!((r.boot, r.undecodable), (5, 1));
    }

    #[test]
    fn a_checkpoint_another_protocol_wrote_is_refused_with_both_names() {
        let mut state = ReplayState::<toy::ToyLog>::new("toy");
        state.apply(&encode(&LogRecord::<toy::ToyLog>::Own(toy::ToyRecord::Note(3))));
        let e = machine::<PlainLog>("occ", Some(&state.encode())).err().expect("refused").to_string();
        assert!(e.contains("`toy`") && e.contains("`occ`"), "{e}");
        let back = ReplayState::<toy::ToyLog>::decode("toy", &state.encode()).expect("its own protocol reads it");
        assert_eq!(back.own.notes, vec![3]);
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
        node_log.set_checkpointer(Box::new(ReplayState::<toy::ToyLog>::new("toy")), 3);
        let log = TxnLog::start::<toy::ToyLog>(Some(node_log.clone()), 1);
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
            Some(bytes) => ReplayState::<toy::ToyLog>::decode("toy", bytes).expect("the toy's checkpoint"),
            None => ReplayState::new("toy"),
        };
        let mut rows = Vec::new();
        let r = replay(from, &reopened.records, &mut |key, val, _, ts| rows.push((key, val, ts)));
        assert_eq!(r.own.notes, vec![1, 2], "its own records, and not the one the crash lost");
        assert_eq!(r.own.decided_at, vec![8]);
        assert_eq!(r.in_doubt, vec![(6, vec![(k(2), v(2))], String::from("vote of 6"))]);
        assert_eq!((rows, r.boot), (vec![(k(1), v(1), 8)], 2));
    }
}
