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
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub type Writes = Vec<(RowKey, Option<Value>)>;

#[derive(Debug, Serialize, Deserialize)]
pub enum LogRecord {
    /// The node started; transaction ids of this boot carry its number, so that an id is never
    /// reused across a restart (a participant may still hold state for the old one).
    Boot { boot: u32 },
    /// The coordinator's decision to commit, with the writes to this node and the remote
    /// participants that must hear it.
    Commit { txn: TxnId, writes: Writes, participants: Vec<NodeId> },
    /// A participant's yes vote: it installs `writes` if `txn` commits.
    Prepared { txn: TxnId, writes: Writes },
    /// What became of a prepared transaction here.
    Outcome { txn: TxnId, committed: bool },
    /// Every participant acknowledged the commit of `txn`.
    Ended { txn: TxnId },
    /// A participant's yes vote with the timestamp it installs at (Sundial's commit timestamp).
    PreparedAt { txn: TxnId, writes: Writes, ts: u64 },
    /// A bound past every timestamp the node has granted (Sundial's `UT`): after a crash, the
    /// protocol starts from the largest one logged.
    Bound { ts: u64 },
    /// `Commit` for a protocol whose decision carries a commit timestamp chosen after the votes
    /// (MaaT): a write applies only over an older one, whatever the log order.
    CommitAt { txn: TxnId, writes: Writes, participants: Vec<NodeId>, ts: u64 },
    /// `Outcome` (committed) with the decision's timestamp, as `CommitAt`.
    OutcomeAt { txn: TxnId, ts: u64 },
    /// A participant's yes vote with the range of timestamps it allows (MaaT): a recovered vote
    /// answers a resent request with the range it sent, never a wider one.
    PreparedRange { txn: TxnId, writes: Writes, lower: u64, upper: u64 },
}

/// The records of [`LogRecord`] that carry writes, borrowing them: encoded exactly as the owned
/// form (same variants in the same order up to these; slices encode as sequences), so a protocol
/// logs what it holds without building an owned record first.
#[derive(Serialize)]
enum LogRecordRef<'a> {
    #[allow(dead_code)] // Only here to keep the variant numbering of `LogRecord`.
    Boot {
        boot: u32,
    },
    Commit {
        txn: TxnId,
        writes: &'a [(RowKey, Option<Value>)],
        participants: &'a [NodeId],
    },
    Prepared {
        txn: TxnId,
        writes: &'a [(RowKey, Option<Value>)],
    },
    #[allow(dead_code)]
    Outcome {
        txn: TxnId,
        committed: bool,
    },
    #[allow(dead_code)]
    Ended {
        txn: TxnId,
    },
    PreparedAt {
        txn: TxnId,
        writes: &'a [(RowKey, Option<Value>)],
        ts: u64,
    },
    #[allow(dead_code)]
    Bound {
        ts: u64,
    },
    CommitAt {
        txn: TxnId,
        writes: &'a [(RowKey, Option<Value>)],
        participants: &'a [NodeId],
        ts: u64,
    },
    #[allow(dead_code)]
    OutcomeAt {
        txn: TxnId,
        ts: u64,
    },
    PreparedRange {
        txn: TxnId,
        writes: &'a [(RowKey, Option<Value>)],
        lower: u64,
        upper: u64,
    },
}

/// Transactions prepared here whose outcome the log does not hold, with their writes.
pub type InDoubt = Vec<(TxnId, Writes)>;
/// Commits decided here that not every participant acknowledged, with those participants and
/// the decision's timestamp (0 for a protocol whose decisions carry none).
pub type Unended = Vec<(TxnId, Vec<NodeId>, u64)>;

/// What a restarted node learns from its log, beyond the writes replay applied.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The number of the boot starting now.
    pub boot: u32,
    /// Prepared here, outcome unknown: lock the writes again and ask the coordinator.
    pub in_doubt: InDoubt,
    /// Committed by a coordinator here, not every participant acknowledged: tell them again.
    pub unended: Unended,
    /// Records replayed, and records that did not decode (a bug or a foreign log: reported).
    pub replayed: u64,
    pub undecodable: u64,
    /// The timestamp each in-doubt transaction installs at, where its vote logged one (the
    /// lower end of its range, where it logged a range).
    pub in_doubt_ts: FxHashMap<TxnId, u64>,
    /// The upper end of each in-doubt transaction's range, where its vote logged one.
    pub in_doubt_upper: FxHashMap<TxnId, u64>,
    /// The largest bound logged (0: none).
    pub bound: u64,
}

/// What replaying a log so far amounts to: the latest committed value of every row written
/// (with how many committed writes it took), the prepared transactions without an outcome, the
/// commits not every participant acknowledged, and the last boot number. Recovery replays into
/// it; the checkpointer keeps one up to date beside the running node and writes it out as a
/// checkpoint, after which the log before it can go.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayState {
    /// Row -> (latest committed value, committed writes since the initial load).
    pub rows: FxHashMap<RowKey, (Option<Value>, u64)>,
    pub prepared: FxHashMap<TxnId, Writes>,
    pub unended: FxHashMap<TxnId, Vec<NodeId>>,
    pub last_boot: u32,
    pub replayed: u64,
    pub undecodable: u64,
    /// The timestamps of prepared transactions that logged one.
    #[serde(default)]
    pub prepared_ts: FxHashMap<TxnId, u64>,
    /// The largest bound logged, or timestamp a decision logged.
    #[serde(default)]
    pub bound: u64,
    /// The timestamp of each row's latest write, for rows written by decisions that carry one.
    #[serde(default)]
    pub row_ts: FxHashMap<RowKey, u64>,
    /// The timestamps of unended commits that logged one.
    #[serde(default)]
    pub unended_ts: FxHashMap<TxnId, u64>,
    /// The upper ends of the ranges of prepared transactions that logged one.
    #[serde(default)]
    pub prepared_upper: FxHashMap<TxnId, u64>,
}

impl ReplayState {
    /// A state from a checkpoint's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        crate::net::decode(bytes)
    }

    pub fn encode(&self) -> Vec<u8> {
        crate::net::encode(self)
    }

    fn write(&mut self, writes: Writes) {
        for (k, v) in writes {
            let e = self.rows.entry(k).or_insert((None, 0));
            e.0 = v;
            e.1 += 1;
        }
    }

    /// Writes of a decision at `ts`: each applies only over an older write (the Thomas write
    /// rule the protocol installs by), so replay ends where the running node did whatever order
    /// the decisions reached the log in.
    fn write_at(&mut self, writes: Writes, ts: u64) {
        self.bound = self.bound.max(ts);
        for (k, v) in writes {
            let newer = self.row_ts.get(&k).is_none_or(|&old| ts > old);
            if newer {
                self.row_ts.insert(k, ts);
                let e = self.rows.entry(k).or_insert((None, 0));
                e.0 = v;
                e.1 += 1;
            }
        }
    }

    /// Apply one log record.
    pub fn apply(&mut self, bytes: &[u8]) {
        let Ok(r) = crate::net::decode::<LogRecord>(bytes) else {
            self.undecodable += 1;
            return;
        };
        self.replayed += 1;
        match r {
            LogRecord::Boot { boot } => self.last_boot = self.last_boot.max(boot),
            LogRecord::Commit { txn, writes, participants } => {
                self.write(writes);
                if !participants.is_empty() {
                    self.unended.insert(txn, participants);
                }
            }
            LogRecord::Prepared { txn, writes } => {
                self.prepared.insert(txn, writes);
            }
            LogRecord::PreparedAt { txn, writes, ts } => {
                self.prepared.insert(txn, writes);
                self.prepared_ts.insert(txn, ts);
            }
            LogRecord::PreparedRange { txn, writes, lower, upper } => {
                self.prepared.insert(txn, writes);
                self.prepared_ts.insert(txn, lower);
                self.prepared_upper.insert(txn, upper);
            }
            LogRecord::Bound { ts } => self.bound = self.bound.max(ts),
            LogRecord::Outcome { txn, committed } => {
                self.prepared_ts.remove(&txn);
                self.prepared_upper.remove(&txn);
                if let Some(writes) = self.prepared.remove(&txn) {
                    if committed {
                        self.write(writes);
                    }
                }
            }
            LogRecord::Ended { txn } => {
                self.unended.remove(&txn);
                self.unended_ts.remove(&txn);
            }
            LogRecord::CommitAt { txn, writes, participants, ts } => {
                self.write_at(writes, ts);
                if !participants.is_empty() {
                    self.unended.insert(txn, participants);
                    self.unended_ts.insert(txn, ts);
                }
            }
            LogRecord::OutcomeAt { txn, ts } => {
                self.prepared_ts.remove(&txn);
                self.prepared_upper.remove(&txn);
                if let Some(writes) = self.prepared.remove(&txn) {
                    self.write_at(writes, ts);
                }
            }
        }
    }

    /// What recovery learns: every row written goes to `apply` (value, committed writes, and
    /// the timestamp of the latest, 0 if its decision carried none), and what is still
    /// undecided comes back.
    pub fn recover(&self, apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64)) -> Recovery {
        let mut rows: Vec<_> = self.rows.iter().collect();
        rows.sort_unstable_by_key(|e| *e.0);
        for (k, (v, writes)) in rows {
            apply(*k, v.clone(), *writes, self.row_ts.get(k).copied().unwrap_or(0));
        }
        let mut in_doubt: InDoubt = self.prepared.iter().map(|(t, w)| (*t, w.clone())).collect();
        in_doubt.sort_unstable_by_key(|e| e.0);
        let mut unended: Unended =
            self.unended.iter().map(|(t, p)| (*t, p.clone(), self.unended_ts.get(t).copied().unwrap_or(0))).collect();
        unended.sort_unstable_by_key(|e| e.0);
        Recovery {
            boot: self.last_boot + 1,
            in_doubt,
            unended,
            replayed: self.replayed,
            undecodable: self.undecodable,
            in_doubt_ts: self.prepared_ts.clone(),
            in_doubt_upper: self.prepared_upper.clone(),
            bound: self.bound,
        }
    }
}

/// Replay `records` in log order after `from` (a checkpoint's state, or empty): every row's
/// latest committed value goes to `apply` with the number of committed writes behind it. Returns
/// what is still undecided.
pub fn replay(
    from: ReplayState,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> Recovery {
    replay_keeping(from, records, apply).0
}

/// [`replay`], keeping the state reached (to go on from: the checkpointer's starting point).
pub fn replay_keeping(
    from: ReplayState,
    records: &[Vec<u8>],
    apply: &mut dyn FnMut(RowKey, Option<Value>, u64, u64),
) -> (Recovery, ReplayState) {
    let mut state = from;
    for bytes in records {
        state.apply(bytes);
    }
    (state.recover(apply), state)
}

/// 2PC's log state machine is its replay state: the checkpointer keeps one beside the running
/// node, replicas of a replicated log keep one per log, and a node is rebuilt from its snapshot.
impl crate::rt::log::LogMachine for ReplayState {
    fn apply(&mut self, record: &[u8]) {
        ReplayState::apply(self, record);
    }

    fn snapshot(&self) -> Vec<u8> {
        self.encode()
    }
}

/// The log machine of every protocol over the 2PC skeleton: fresh, or from a checkpoint (an
/// undecodable one is an error naming the cause).
pub fn machine(checkpoint: Option<&[u8]>) -> anyhow::Result<Box<dyn crate::rt::log::LogMachine>> {
    let state = match checkpoint {
        Some(bytes) => ReplayState::decode(bytes)
            .map_err(|e| anyhow::anyhow!("the checkpoint does not decode as 2PC's replay state ({e})"))?,
        None => ReplayState::default(),
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
    /// Open the log for a booting node: append its `Boot` record.
    pub fn start(log: Option<Arc<NodeLog>>, boot: u32) -> Self {
        let boot_lsn = match &log {
            Some(l) => l.append(&crate::net::encode(&LogRecord::Boot { boot })).expect("a boot record is tiny"),
            None => 0,
        };
        TxnLog { log, boot_lsn }
    }

    pub fn enabled(&self) -> bool {
        self.log.is_some()
    }

    /// Append a record: `Ok(None)` when the run is not durable; an error for a record the log
    /// refuses (over its size limit), which the transaction must abort on.
    pub fn append(&self, r: &LogRecord) -> Result<Option<u64>, Abort> {
        self.append_encoded(r)
    }

    /// Append a `Commit` record of writes the caller keeps (no owned copy is built).
    pub fn append_commit(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
    ) -> Result<Option<u64>, Abort> {
        self.append_encoded(&LogRecordRef::Commit { txn, writes, participants })
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
            self.append_commit(txn, writes, &[])
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
        self.force_commit(txn, local_writes, writers).await?;
        w.note_log_wait(w.now_ns() - t0);
        Ok(())
    }

    /// Append a `PreparedAt` record: a yes vote with the timestamp its writes install at.
    pub fn append_prepared_at(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        ts: u64,
    ) -> Result<Option<u64>, Abort> {
        self.append_encoded(&LogRecordRef::PreparedAt { txn, writes, ts })
    }

    /// Append a `PreparedRange` record: a yes vote with the range of timestamps it allows.
    pub fn append_prepared_range(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        (lower, upper): (u64, u64),
    ) -> Result<Option<u64>, Abort> {
        self.append_encoded(&LogRecordRef::PreparedRange { txn, writes, lower, upper })
    }

    /// Log a decision whose writes install at `ts` (`CommitAt`) and wait until it is durable,
    /// counting the wait: [`TxnLog::log_decision`] for a protocol whose decisions carry a
    /// timestamp. Every decision is logged, a read-only one too, since its participants must
    /// hear it.
    pub async fn log_decision_at(
        &self,
        w: &crate::rt::Worker,
        txn: TxnId,
        local_writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
        ts: u64,
    ) -> Result<(), Abort> {
        if self.log.is_none() {
            return Ok(());
        }
        let lsn = self.append_encoded(&LogRecordRef::CommitAt { txn, writes: local_writes, participants, ts })?;
        self.durable_counted(w, lsn).await;
        Ok(())
    }

    /// Append a `Bound` record.
    pub fn append_bound(&self, ts: u64) -> Result<Option<u64>, Abort> {
        self.append_encoded(&LogRecord::Bound { ts })
    }

    /// Append a `Prepared` record of writes the caller keeps.
    pub fn append_prepared(&self, txn: TxnId, writes: &[(RowKey, Option<Value>)]) -> Result<Option<u64>, Abort> {
        self.append_encoded(&LogRecordRef::Prepared { txn, writes })
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

    /// Wait until `lsn` (from [`TxnLog::append`]) is durable.
    pub async fn durable(&self, lsn: Option<u64>) {
        if let (Some(l), Some(lsn)) = (&self.log, lsn) {
            l.wait(lsn).await;
        }
    }

    /// Append a `Commit` record and wait until it is durable.
    pub async fn force_commit(
        &self,
        txn: TxnId,
        writes: &[(RowKey, Option<Value>)],
        participants: &[NodeId],
    ) -> Result<(), Abort> {
        let lsn = self.append_commit(txn, writes, participants)?;
        self.durable(lsn).await;
        Ok(())
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

    #[test]
    fn borrowed_records_encode_as_the_owned_ones() {
        let writes = vec![(k(1), v(1)), (k(2), None)];
        let owned = encode(&LogRecord::Commit { txn: 9, writes: writes.clone(), participants: vec![3, 4] });
        assert_eq!(encode(&LogRecordRef::Commit { txn: 9, writes: &writes, participants: &[3, 4] }), owned);
        let owned = encode(&LogRecord::Prepared { txn: 9, writes: writes.clone() });
        assert_eq!(encode(&LogRecordRef::Prepared { txn: 9, writes: &writes }), owned);
    }

    #[test]
    fn replaying_after_a_checkpoint_equals_replaying_everything() {
        let recs: Vec<Vec<u8>> = [
            LogRecord::Boot { boot: 1 },
            LogRecord::Commit { txn: 1, writes: vec![(k(1), v(1))], participants: vec![5] },
            LogRecord::Prepared { txn: 2, writes: vec![(k(2), v(2))] },
            LogRecord::Commit { txn: 3, writes: vec![(k(1), v(3)), (k(4), None)], participants: vec![] },
            LogRecord::Ended { txn: 1 },
            LogRecord::Outcome { txn: 2, committed: true },
            LogRecord::Prepared { txn: 6, writes: vec![(k(6), v(6))] },
        ]
        .iter()
        .map(encode)
        .collect();
        let collect = |from: ReplayState, rest: &[Vec<u8>]| {
            let mut rows = Vec::new();
            let r = replay(from, rest, &mut |k, v, n, _| rows.push((k, v, n)));
            (rows, r.boot, r.in_doubt, r.unended)
        };
        let whole = collect(ReplayState::default(), &recs);
        for cut in 0..=recs.len() {
            let mut ckpt = ReplayState::default();
            for r in &recs[..cut] {
                ckpt.apply(r);
            }
            let ckpt = ReplayState::decode(&ckpt.encode()).expect("a checkpoint decodes");
            assert_eq!(collect(ckpt, &recs[cut..]), whole, "checkpoint after {cut} records");
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
            LogRecord::Boot { boot: 1 },
            LogRecord::Commit { txn: 10, writes: vec![(k(1), v(1))], participants: vec![] },
            LogRecord::Prepared { txn: 11, writes: vec![(k(2), v(2))] },
            LogRecord::Prepared { txn: 12, writes: vec![(k(3), v(3))] },
            LogRecord::Outcome { txn: 11, committed: true },
            LogRecord::Prepared { txn: 13, writes: vec![(k(4), v(4))] },
            LogRecord::Outcome { txn: 13, committed: false },
            LogRecord::Commit { txn: 14, writes: vec![(k(1), v(9))], participants: vec![2, 3] },
            LogRecord::Commit { txn: 15, writes: vec![], participants: vec![4] },
            LogRecord::Ended { txn: 15 },
            LogRecord::Boot { boot: 2 },
        ]
        .iter()
        .map(encode)
        .collect();
        let mut applied = Vec::new();
        let r = replay(ReplayState::default(), &recs, &mut |key, val, n, _| applied.push((key, val, n)));
        assert_eq!(applied, vec![(k(1), v(9), 2), (k(2), v(2), 1)], "latest value, and how many writes");
        assert_eq!(r.boot, 3);
        assert_eq!(r.in_doubt, vec![(12, vec![(k(3), v(3))])]);
        assert_eq!(r.unended, vec![(14, vec![2, 3], 0)]);
        assert_eq!((r.replayed, r.undecodable), (11, 0));
    }

    #[test]
    fn a_record_that_does_not_decode_is_counted_not_applied() {
        let recs = vec![vec![0xff, 0xff, 0xff], encode(&LogRecord::Boot { boot: 4 })];
        let r = replay(ReplayState::default(), &recs, &mut |_, _, _, _| panic!("nothing to apply"));
        assert_eq!((r.boot, r.undecodable), (5, 1));
    }
}
