//! OCC's coordinator: the execution phase (reads record their version, writes are buffered) and
//! the commit: lock the write set everywhere, then validate the read set everywhere, then
//! install (Silo's order, made distributed: every lock is held before any validation, which is
//! what makes the combination serializable), with 2PC's decision table for the participants.
//! With a single remote participant, the last lock and the validation there share a message.

use super::messages::{Reply, Request};
use super::participant::{self as part, Rec, Writes};
use super::{Occ, OccWorker};
use crate::net::NodeId;
use crate::protocols::twopc::buffered::{BufferedTxn, ReadOf, ReadSet};
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::Coordinator;
use crate::protocols::twopc::{CoordTxn, Stamp, TxnId, TxnStatus};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

struct ReadEntry<'a> {
    key: RowKey,
    value: Option<Value>,
    tid: u64,
    /// The local record read (`None`: remote, or absent when read).
    rec: Option<&'a Rec>,
    /// Prefetched entries count for validation only once the procedure reads them.
    used: bool,
}

impl ReadOf for ReadEntry<'_> {
    fn key(&self) -> RowKey {
        self.key
    }
}

/// What one node must lock (writes) and validate (reads) at commit.
struct Part {
    node: NodeId,
    writes: Writes,
    reads: Vec<(RowKey, u64)>,
}

pub struct OccTxn<'a> {
    wk: &'a OccWorker,
    pub id: TxnId,
    reads: ReadSet<ReadEntry<'a>>,
    writes: Writes,
    /// The declared local records, resolved once by `prefetch`, so that the reads, locks,
    /// validation and install that follow do not search the storage index again.
    local_recs: FxHashMap<RowKey, &'a Rec>,
}

/// How an OCC attempt starts, as the 2PC skeleton calls it.
impl Coordinator for Occ {
    type Txn<'a> = OccTxn<'a>;

    fn begin<'a>(wk: &'a OccWorker, id: TxnId, _attempt: Attempt) -> OccTxn<'a> {
        OccTxn { wk, id, reads: ReadSet::default(), writes: Vec::new(), local_recs: FxHashMap::default() }
    }
}

impl<'a> OccTxn<'a> {
    /// The local record of `key`, if it exists: from the prefetched ones, else from the index.
    fn local_rec(&self, key: RowKey) -> Option<&'a Rec> {
        match self.local_recs.get(&key) {
            Some(r) => Some(*r),
            None => self.wk.node.store.get(key),
        }
    }

    /// Install this node's writes (unlocking their records). The read set is done with:
    /// dropping its values first lets the install reuse the buffers of the values it replaces
    /// when nobody else holds them (`Value::recycle`).
    fn install(&mut self, recs: Vec<&'a Rec>, writes: Writes) {
        self.reads.clear();
        self.wk.w.charge_ops(writes.len());
        for (rec, (_, v)) in recs.into_iter().zip(writes) {
            part::install_rec(rec, self.id, v);
        }
    }

    /// Lock and validate a transaction with no remote participant.
    fn lock_and_validate_here(&self, local_recs: &[&'a Rec]) -> TxnResult<()> {
        self.wk.w.charge_ops(local_recs.len());
        if !part::lock_recs(self.id, local_recs.iter().copied()) {
            return Err(self.abort(&[], &[], Abort::WriteLocked));
        }
        if !self.validate_local() {
            return Err(self.abort(local_recs, &[], Abort::ReadValidation));
        }
        Ok(())
    }

    /// One remote participant: lock here, then let it lock and validate in one round trip (its
    /// locks are the last ones, so every lock is held before its validation), then validate
    /// here. One round trip where `lock_all_then_validate` takes two, at the price of holding
    /// the local locks across it (which that one does across its validation round trip anyway).
    async fn lock_here_then_there(
        &self,
        there: &Part,
        local_recs: &[&'a Rec],
        remote_writers: &[NodeId],
    ) -> TxnResult<()> {
        let wk = self.wk;
        wk.w.charge_ops(local_recs.len());
        if !part::lock_recs(self.id, local_recs.iter().copied()) {
            return Err(self.abort(&[], &[], Abort::WriteLocked));
        }
        let req = Request::LockValidate { txn: self.id, writes: there.writes.clone(), reads: there.reads.clone() };
        match wk.ask(there.node, &req).await {
            Ok(Reply::Vote(true)) => {}
            // A refusal leaves nothing held there: no need to tell it the outcome.
            Ok(Reply::Vote(false)) => return Err(self.abort(local_recs, &[], Abort::WriteLocked)),
            Ok(Reply::Stale) => return Err(self.abort(local_recs, &[], Abort::ReadValidation)),
            // Garbled (a reply of the wrong kind) or lost (the call timed out): it may hold locks.
            Ok(_) => return Err(self.abort(local_recs, remote_writers, Abort::BadReply)),
            Err(_) => return Err(self.abort(local_recs, remote_writers, Abort::Timeout)),
        }
        if !self.validate_local() {
            return Err(self.abort(local_recs, remote_writers, Abort::ReadValidation));
        }
        Ok(())
    }

    /// Several remote participants: lock every write set, the remote ones first, in parallel,
    /// then the local one inline, so that hot local records are not held across the lock round
    /// trip (any order is correct as long as every lock is held before any validation); then
    /// validate every read set.
    async fn lock_all_then_validate(
        &self,
        nodes: &[Part],
        local_recs: &[&'a Rec],
        remote_writers: &[NodeId],
    ) -> TxnResult<()> {
        let wk = self.wk;
        let locks = nodes.iter().filter(|x| !x.writes.is_empty());
        let lock_requests = locks.map(|x| (x.node, Request::Lock { txn: self.id, writes: x.writes.clone() }));
        if let Err(a) = votes(wk.ask_all(lock_requests).await, Abort::WriteLocked) {
            return Err(self.abort(&[], remote_writers, a));
        }
        wk.w.charge_ops(local_recs.len());
        if !part::lock_recs(self.id, local_recs.iter().copied()) {
            return Err(self.abort(&[], remote_writers, Abort::WriteLocked));
        }
        if !self.validate_local() {
            return Err(self.abort(local_recs, remote_writers, Abort::ReadValidation));
        }
        let validations = nodes.iter().filter(|x| !x.reads.is_empty());
        let validate_requests =
            validations.map(|x| (x.node, Request::Validate { txn: self.id, reads: x.reads.clone() }));
        if let Err(a) = votes(wk.ask_all(validate_requests).await, Abort::ReadValidation) {
            return Err(self.abort(local_recs, remote_writers, a));
        }
        Ok(())
    }

    /// Commit a transaction that writes nowhere but here, with early lock release (Silo's
    /// epochs, Aether's ELR): append the commit record, install and unlock at once, and
    /// acknowledge once the record is durable (returned: the caller waits), so that the locks
    /// are not held across a flush.
    /// Still safe: the record is appended under the locks, so log order is install order, and a
    /// transaction that read one of these writes and writes itself logs after it (durable only
    /// with it); one that logs nothing here (read-only) waits for the log's tail, and a remote
    /// reader's validation vote does too (`participant`). A crash before the flush loses the
    /// commit with everything that saw it, none of it acknowledged.
    fn commit_here(&mut self, recs: Vec<&'a Rec>, writes: Writes) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let lsn = if writes.is_empty() {
            let me = wk.node.id;
            let read_here = self.reads.iter().any(|e| e.used && (e.rec.is_some() || wk.node.node_of(e.key) == me));
            if read_here {
                wk.local_commit_lsn(self.id, Stamp::default(), &[]).unwrap_or(None)
            } else {
                None
            }
        } else {
            match wk.local_commit_lsn(self.id, Stamp::default(), &writes) {
                Ok(lsn) => lsn,
                Err(a) => return Err(self.abort(&recs, &[], a)),
            }
        };
        self.install(recs, writes);
        Ok(lsn)
    }

    /// Log the commit decision (this node's writes, the remote writers) and wait until it is
    /// durable; nothing to do for a read-only transaction or a run without a log.
    async fn log_commit(&self, local_writes: &Writes, remote_writers: &[NodeId]) -> TxnResult<()> {
        self.wk.log_decision((self.id, Stamp::default()), local_writes, remote_writers, false).await
    }

    /// Validate the local part of the read set. A read that found no record checks whether one
    /// has appeared since.
    fn validate_local(&self) -> bool {
        let wk = self.wk;
        let me = wk.node.id;
        let mut n = 0;
        let ok = self.reads.iter().filter(|e| e.used).all(|e| match e.rec {
            Some(rec) => {
                n += 1;
                part::validate_rec(Some(rec), e.tid, self.id)
            }
            None if wk.node.node_of(e.key) == me => {
                n += 1;
                part::validate_rec(wk.node.store.get(e.key), e.tid, self.id)
            }
            None => true,
        });
        wk.w.charge_ops(n);
        ok
    }

    /// Release what this attempt holds anywhere (`locked`: the local records it locked) and
    /// forget it.
    fn abort(&self, locked: &[&'a Rec], remote_writers: &[NodeId], reason: Abort) -> Abort {
        let wk = self.wk;
        part::unlock_recs(self.id, locked.iter().copied());
        wk.coord.set(self.id, TxnStatus::Aborted);
        wk.tell_abort(self.id, remote_writers.to_vec());
        reason
    }
}

/// All participants voted yes; a no becomes `no`, a lost or garbled reply a timeout.
fn votes(replies: Vec<TxnResult<Reply>>, no: Abort) -> TxnResult<()> {
    for r in replies {
        match r? {
            Reply::Vote(true) => {}
            Reply::Vote(false) => return Err(no),
            _ => return Err(Abort::BadReply),
        }
    }
    Ok(())
}

impl<'a> BufferedTxn for OccTxn<'a> {
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        let i = self.reads.find(key)?;
        let e = &mut self.reads[i];
        e.used = true;
        Some(e.value.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.wk.node.remote_node(key) {
            None => {
                self.wk.w.charge_ops(1);
                let rec = self.local_rec(key);
                let (value, tid) = rec.map_or((None, 0), part::read_rec);
                self.reads.push(ReadEntry { key, value: value.clone(), tid, rec, used: true });
                Step::Ready(Ok(value))
            }
            Some(n) => Step::Wait(Box::pin(async move {
                let Reply::Values(mut vals) = self.wk.ask(n, &Request::Read { keys: vec![key] }).await? else {
                    return Err(Abort::BadReply);
                };
                let (value, tid) = vals.pop().ok_or(Abort::BadReply)?;
                self.reads.push(ReadEntry { key, value: value.clone(), tid, rec: None, used: true });
                Ok(value)
            })),
        }
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// Each row is read with its version, as a read is.
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        let n = self.wk.node.node_of(RowKey::new(s.table, s.lo));
        let rows = if n == self.wk.node.id {
            self.wk.w.charge_ops(1);
            part::scan(&self.wk.node.store, s)
        } else {
            let Reply::Rows(rows) = self.wk.ask(n, &Request::Scan { scan: s }).await? else {
                return Err(Abort::BadReply);
            };
            rows
        };
        for (k, v, tid) in &rows {
            let key = RowKey::new(s.table, *k);
            if self.reads.find(key).is_none() {
                let rec = (n == self.wk.node.id).then(|| self.local_rec(key)).flatten();
                self.reads.push(ReadEntry { key, value: Some(v.clone()), tid: *tid, rec, used: true });
            }
        }
        Ok(rows.into_iter().map(|(k, v, _)| (k, v)).collect())
    }
}

impl<'a> CoordTxn for OccTxn<'a> {
    /// One-shot: fetch every declared key of each remote participant in one round trip, and
    /// start loading the local records so that their cache misses overlap.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let mut by_node: FxHashMap<NodeId, Vec<RowKey>> = FxHashMap::default();
        self.reads.reserve(keys.reads.len() + keys.writes.len());
        self.writes.reserve(keys.writes.len());
        self.local_recs.reserve(keys.reads.len() + keys.writes.len());
        let store = &self.wk.node.store;
        for &k in &keys.reads {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().push(k),
                None => {
                    if let Some(r) = store.get(k) {
                        r.prefetch();
                        self.local_recs.insert(k, r);
                    }
                }
            }
        }
        // Declared writes get their record now (an insert creates it absent, as locking it at
        // commit would), so that the index is searched once per key.
        for &k in &keys.writes {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().push(k),
                None => {
                    let r = store.get_or_create(k);
                    r.prefetch();
                    self.local_recs.insert(k, r);
                }
            }
        }
        for r in self.local_recs.values() {
            r.prefetch_value();
        }
        if by_node.is_empty() {
            return Ok(());
        }
        for ks in by_node.values_mut() {
            // A key may be declared as both read and written: fetch it once.
            ks.sort_unstable();
            ks.dedup();
        }
        let wk = self.wk;
        let calls: Vec<_> = by_node
            .iter()
            .map(|(n, ks)| {
                let req = Request::Read { keys: ks.clone() };
                let n = *n;
                async move { wk.ask(n, &req).await }
            })
            .collect();
        for ((_, ks), reply) in by_node.iter().zip(join_all(calls).await) {
            let Reply::Values(vals) = reply? else {
                return Err(Abort::BadReply);
            };
            for (k, (value, tid)) in ks.iter().zip(vals) {
                self.reads.push(ReadEntry { key: *k, value, tid, rec: None, used: false });
            }
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let me = wk.node.id;
        // Group the remote keys by node: what each remote participant must lock and validate.
        // The local participant's records are resolved once and used for lock, validate and
        // install alike.
        let mut nodes: Vec<Part> = Vec::new();
        let slot = |n: NodeId, nodes: &mut Vec<Part>| match nodes.iter().position(|x| x.node == n) {
            Some(i) => i,
            None => {
                nodes.push(Part { node: n, writes: Vec::new(), reads: Vec::new() });
                nodes.len() - 1
            }
        };
        // This node's writes (in the shape the log takes them) and, in the same order, their records.
        let mut local_writes: Writes = Vec::with_capacity(self.writes.len());
        let mut local_recs: Vec<&'a Rec> = Vec::with_capacity(self.writes.len());
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => {
                    local_recs.push(self.local_rec(k).unwrap_or_else(|| wk.node.store.get_or_create(k)));
                    local_writes.push((k, v));
                }
                n => {
                    let i = slot(n, &mut nodes);
                    nodes[i].writes.push((k, v));
                }
            }
        }
        for e in self.reads.iter().filter(|e| e.used && e.rec.is_none()) {
            let n = wk.node.node_of(e.key);
            if n != me {
                let i = slot(n, &mut nodes);
                nodes[i].reads.push((e.key, e.tid));
            }
        }
        let remote_writers: Vec<NodeId> = nodes.iter().filter(|x| !x.writes.is_empty()).map(|x| x.node).collect();
        if !remote_writers.is_empty() {
            wk.coord.set(self.id, TxnStatus::Active);
        }
        // Lock everywhere, then validate everywhere; on failure the attempt is already aborted.
        match nodes.as_slice() {
            [] => self.lock_and_validate_here(&local_recs)?,
            [only] => self.lock_here_then_there(only, &local_recs, &remote_writers).await?,
            _ => self.lock_all_then_validate(&nodes, &local_recs, &remote_writers).await?,
        }
        if remote_writers.is_empty() {
            return self.commit_here(local_recs, local_writes);
        }
        // Decision: commit. With a log, the decision is durable before anyone learns it.
        if let Err(a) = self.log_commit(&local_writes, &remote_writers).await {
            return Err(self.abort(&local_recs, &remote_writers, a));
        }
        // Install here, tell the remote writers in the background.
        self.install(local_recs, local_writes);
        wk.coord.set(self.id, TxnStatus::Committed);
        wk.tell_commit(self.id, remote_writers);
        Ok(None)
    }

    /// Execution holds nothing anywhere (reads are optimistic, writes buffered): nothing to undo.
    fn abandon(&mut self, reason: Abort) -> Abort {
        reason
    }
}
