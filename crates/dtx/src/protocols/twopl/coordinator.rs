//! 2PL's coordinator: locks are taken as the procedure reads and writes (strict 2PL: held to the
//! end), then two-phase commit across the nodes it touched. A read-only participant releases
//! at prepare; the local node commits inline once the decision is made.

use super::messages::{Reply, Request, Vote};
use super::meta::LockRecord;
use super::participant::{self as part, Writes};
use super::{TwoPl, TwoPlWorker};
use crate::net::NodeId;
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::record_lock::{self as locks, LockStep, Mode, Prio};
use crate::protocols::twopc::skeleton::commit_with_early_release;
use crate::protocols::twopc::Coordinator;
use crate::protocols::twopc::{own_view, CoordTxn, Stamp, TxnId};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Access, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

/// Read and write sets up to this size are searched linearly; larger ones through an index.
const LINEAR_MAX: usize = 32;

/// Keep `index` (key -> position) in step after a push that made the set `len` long: built in
/// one go when the set outgrows a linear search, one entry at a time after that.
fn index_last<T>(index: &mut FxHashMap<RowKey, usize>, items: &[T], key_of: impl Fn(&T) -> RowKey) {
    if items.len() <= LINEAR_MAX {
        return;
    }
    if index.is_empty() {
        index.extend(items.iter().enumerate().map(|(i, e)| (key_of(e), i)));
    } else if let Some(last) = items.last() {
        index.insert(key_of(last), items.len() - 1);
    }
}

pub struct TplTxn<'a> {
    wk: &'a TwoPlWorker,
    pub id: TxnId,
    prio: Prio,
    /// Locks held (or waited for) on this node.
    held_local: Vec<(RowKey, &'a LockRecord)>,
    /// The declared local records, resolved once by `prefetch`.
    local_recs: FxHashMap<RowKey, &'a LockRecord>,
    /// Remote nodes holding locks for us (so they must hear the outcome).
    touched: Vec<NodeId>,
    /// Values of locked records, with the mode held.
    values: Vec<(RowKey, Option<Value>, Mode)>,
    writes: Writes,
    /// key -> position in `values` / `writes`, kept once they outgrow a linear search.
    value_index: FxHashMap<RowKey, usize>,
    write_index: FxHashMap<RowKey, usize>,
}

/// How a 2PL attempt starts, as the 2PC skeleton calls it.
impl Coordinator for TwoPl {
    type Txn<'a> = TplTxn<'a>;

    fn begin<'a>(wk: &'a TwoPlWorker, id: TxnId, attempt: Attempt) -> TplTxn<'a> {
        TplTxn {
            wk,
            id,
            prio: Prio(attempt.first_start_us, id),
            held_local: Vec::new(),
            local_recs: FxHashMap::default(),
            touched: Vec::new(),
            values: Vec::new(),
            writes: Vec::new(),
            value_index: FxHashMap::default(),
            write_index: FxHashMap::default(),
        }
    }
}

impl<'a> TplTxn<'a> {
    /// Where `key` is in `writes`: a linear search while the set is small, an index after.
    fn write_pos(&self, key: RowKey) -> Option<usize> {
        if self.writes.len() <= LINEAR_MAX {
            self.writes.iter().position(|(k, _)| *k == key)
        } else {
            self.write_index.get(&key).copied()
        }
    }

    fn value_pos(&self, key: RowKey) -> Option<usize> {
        if self.values.len() <= LINEAR_MAX {
            self.values.iter().position(|(k, _, _)| *k == key)
        } else {
            self.value_index.get(&key).copied()
        }
    }

    fn cached(&self, key: RowKey, mode: Mode) -> Option<Option<Value>> {
        if let Some(i) = self.write_pos(key) {
            return Some(self.writes[i].1.clone());
        }
        let (_, v, m) = &self.values[self.value_pos(key)?];
        (mode == Mode::Shared || *m == Mode::Exclusive).then(|| v.clone())
    }

    fn note(&mut self, key: RowKey, value: Option<Value>, mode: Mode) {
        match self.value_pos(key) {
            Some(i) => self.values[i].2 = mode,
            None => {
                self.values.push((key, value, mode));
                index_last(&mut self.value_index, &self.values, |e| e.0);
            }
        }
    }

    /// Buffer a write (replacing an earlier one of the same key).
    fn buffer_write(&mut self, key: RowKey, value: Option<Value>) {
        match self.write_pos(key) {
            Some(i) => self.writes[i].1 = value,
            None => {
                self.writes.push((key, value));
                index_last(&mut self.write_index, &self.writes, |e| e.0);
            }
        }
    }

    /// Count node `n` among the participants; returns whether it was one already (the
    /// transaction may hold locks there, which a request says as `again`).
    fn touch(&mut self, n: NodeId) -> bool {
        let again = self.touched.contains(&n);
        self.wk.coord.touch(self.id, &mut self.touched, n);
        again
    }

    /// Lock `keys` on remote node `n` in one round trip; returns their values in order.
    async fn lock_remote(&mut self, n: NodeId, keys: Vec<(RowKey, Mode)>) -> TxnResult<Vec<Option<Value>>> {
        let again = self.touch(n);
        let req = Request::Lock { txn: self.id, prio: self.prio, keys: keys.clone(), again };
        match self.wk.ask(n, &req).await? {
            Reply::Values(vals) if vals.len() == keys.len() => {
                for ((k, m), v) in keys.into_iter().zip(vals.iter()) {
                    self.note(k, v.clone(), m);
                }
                Ok(vals)
            }
            Reply::Aborted(a) => Err(a),
            _ => Err(Abort::BadReply),
        }
    }

    /// The local record of `key`: from the prefetched ones, else from the index (created absent
    /// if need be: a lock is taken on it either way).
    fn local_rec(&self, key: RowKey) -> &'a LockRecord {
        match self.local_recs.get(&key) {
            Some(r) => r,
            None => self.wk.node.store.get_or_create(key),
        }
    }

    /// Remember a local lock held (or queued for), once.
    fn hold(&mut self, key: RowKey, rec: &'a LockRecord) {
        if !self.held_local.iter().any(|(k, _)| *k == key) {
            self.held_local.push((key, rec));
        }
    }

    async fn lock_local(&mut self, key: RowKey, mode: Mode) -> TxnResult<Option<Value>> {
        let wk = self.wk;
        wk.w.charge_ops(1);
        let rec = self.local_rec(key);
        let v = match locks::try_lock_rec(rec, self.id, self.prio, mode, wk.cc.policy)? {
            LockStep::Done(v) => v,
            LockStep::Wait(rec, slot) => {
                // A queued request is part of what we must release on abort.
                self.hold(key, rec);
                wk.wait_queued(self.id, key, rec, slot).await?
            }
        };
        self.hold(key, rec);
        self.note(key, v.clone(), mode);
        Ok(v)
    }

    fn access(&mut self, key: RowKey, mode: Mode) -> Step<'_, Option<Value>> {
        if let Some(v) = self.cached(key, mode) {
            return Step::Ready(Ok(v));
        }
        let n = self.wk.node.node_of(key);
        if n == self.wk.node.id {
            // Fast path: an uncontended local lock completes without a future.
            self.wk.w.charge_ops(1);
            let rec = self.local_rec(key);
            match locks::try_lock_rec(rec, self.id, self.prio, mode, self.wk.cc.policy) {
                Err(a) => Step::Ready(Err(a)),
                Ok(LockStep::Done(v)) => {
                    self.hold(key, rec);
                    self.note(key, v.clone(), mode);
                    Step::Ready(Ok(v))
                }
                Ok(LockStep::Wait(rec, slot)) => Step::Wait(Box::pin(async move {
                    self.hold(key, rec);
                    let v = self.wk.wait_queued(self.id, key, rec, slot).await?;
                    self.note(key, v.clone(), mode);
                    Ok(v)
                })),
            }
        } else {
            Step::Wait(Box::pin(async move {
                let mut vals = self.lock_remote(n, vec![(key, mode)]).await?;
                vals.pop().ok_or(Abort::BadReply)
            }))
        }
    }

    /// Apply this node's writes and release every local lock. The values read are done with:
    /// dropping them first lets the install reuse the buffers of the values it replaces when
    /// nobody else holds them (`Value::recycle`).
    fn install_and_release(&mut self, local_writes: Writes) {
        // One step a record held: an install releases its lock as it writes.
        self.wk.w.charge_ops(self.held_local.len());
        self.values.clear();
        self.value_index.clear();
        for (k, v) in local_writes {
            part::apply_rec(self.local_rec(k), self.id, v);
        }
        locks::release_recs(self.id, self.held_local.drain(..).map(|h| h.1));
    }

    /// Commit a transaction that touched no other node, with early lock release (so does a
    /// remote reader's read-only vote wait for the log's tail, in `participant`).
    fn commit_here(&mut self, local_writes: Writes) -> TxnResult<AckAfter> {
        let wk = self.wk;
        commit_with_early_release(
            self,
            wk,
            (self.id, Stamp::default()),
            local_writes,
            Self::install_and_release,
            Self::abort,
        )
    }

    /// Release every lock this attempt holds or waits for, here and remotely.
    pub fn abort(&mut self, reason: Abort) -> Abort {
        let wk = self.wk;
        locks::release_recs(self.id, self.held_local.drain(..).map(|h| h.1));
        wk.abort_remote(self.id, &mut self.touched);
        reason
    }
}

impl<'a> Access for TplTxn<'a> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.access(key, Mode::Shared)
    }

    fn read_for_update(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.access(key, Mode::Exclusive)
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        let locked = self.value_pos(key).is_some_and(|i| self.values[i].2 == Mode::Exclusive);
        if locked {
            self.buffer_write(key, value);
            return Step::Ready(Ok(()));
        }
        Step::Wait(Box::pin(async move {
            self.access(key, Mode::Exclusive).await?;
            self.buffer_write(key, value);
            Ok(())
        }))
    }

    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        let n = self.wk.node.node_of(RowKey::new(s.table, s.lo));
        Step::Wait(Box::pin(async move {
            let rows: Vec<(u64, Value)> = if n == self.wk.node.id {
                let keys: Vec<u64> = self
                    .wk
                    .node
                    .store
                    .table(s.table)
                    .range(s.lo, s.hi, s.limit as usize, s.descending)
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect();
                let mut rows = Vec::with_capacity(keys.len());
                for k in keys {
                    let key = RowKey::new(s.table, k);
                    let v = match self.cached(key, Mode::Shared) {
                        Some(v) => v,
                        None => self.lock_local(key, Mode::Shared).await?,
                    };
                    if let Some(v) = v {
                        rows.push((k, v));
                    }
                }
                rows
            } else {
                let again = self.touch(n);
                match self.wk.ask(n, &Request::Scan { txn: self.id, prio: self.prio, scan: s, again }).await? {
                    Reply::Rows(rows) => {
                        for (k, v) in &rows {
                            self.note(RowKey::new(s.table, *k), Some(v.clone()), Mode::Shared);
                        }
                        rows
                    }
                    Reply::Aborted(a) => return Err(a),
                    _ => return Err(Abort::BadReply),
                }
            };
            Ok(rows
                .into_iter()
                .filter_map(|(k, v)| Some((k, own_view(&self.writes, RowKey::new(s.table, k), v)?)))
                .collect())
        }))
    }
}

impl<'a> CoordTxn for TplTxn<'a> {
    /// One-shot: lock every declared key, one round trip per remote participant.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let mut by_node: FxHashMap<NodeId, Vec<(RowKey, Mode)>> = FxHashMap::default();
        let modes = keys
            .writes
            .iter()
            .map(|k| (*k, Mode::Exclusive))
            .chain(keys.reads.iter().filter(|k| !keys.covers(**k, true)).map(|k| (*k, Mode::Shared)));
        let store = &self.wk.node.store;
        let me = self.wk.node.id;
        let declared = keys.reads.len() + keys.writes.len();
        self.local_recs.reserve(declared);
        // This node's keys, each once, in declaration order.
        let mut local: Vec<(RowKey, Mode)> = Vec::with_capacity(declared);
        for (k, m) in modes {
            let n = self.wk.node.node_of(k);
            if n == me {
                // Resolve the record once (every declared key gets locked, absent ones too), and
                // start loading it now so that the cache misses overlap.
                if let std::collections::hash_map::Entry::Vacant(e) = self.local_recs.entry(k) {
                    let r = store.get_or_create(k);
                    r.prefetch();
                    e.insert(r);
                    local.push((k, m));
                }
            } else {
                by_node.entry(n).or_default().push((k, m));
            }
        }
        for r in self.local_recs.values() {
            r.prefetch_value();
        }
        // Remote participants first, in parallel; then the local keys.
        let remote: Vec<(NodeId, Vec<(RowKey, Mode)>)> =
            by_node.iter().filter(|(n, _)| **n != me).map(|(n, v)| (*n, v.clone())).collect();
        let again: Vec<bool> = remote.iter().map(|(n, _)| self.touch(*n)).collect();
        let wk = self.wk;
        let (id, prio) = (self.id, self.prio);
        let calls: Vec<_> = remote
            .iter()
            .zip(again)
            .map(|((n, ks), again)| {
                let req = Request::Lock { txn: id, prio, keys: ks.clone(), again };
                let n = *n;
                async move { wk.ask(n, &req).await }
            })
            .collect();
        let mut failure = None;
        for ((_, ks), reply) in remote.into_iter().zip(join_all(calls).await) {
            match reply {
                Ok(Reply::Values(vals)) if vals.len() == ks.len() => {
                    for ((k, m), v) in ks.into_iter().zip(vals) {
                        self.note(k, v, m);
                    }
                }
                Ok(Reply::Aborted(a)) => failure = failure.or(Some(a)),
                // A reply of the wrong kind is garbled; a failed call timed out.
                Ok(_) => failure = failure.or(Some(Abort::BadReply)),
                Err(_) => failure = failure.or(Some(Abort::Timeout)),
            }
        }
        if let Some(a) = failure {
            return Err(a);
        }
        // The local keys are distinct and none is held yet: lock each without searching what is
        // held, and wait (a future) only for a lock that is not granted at once.
        let wk = self.wk;
        self.held_local.reserve(local.len());
        self.values.reserve(local.len());
        self.writes.reserve(keys.writes.len());
        wk.w.charge_ops(local.len());
        for (k, m) in local {
            let rec = self.local_recs[&k];
            let v = match locks::try_lock_rec(rec, self.id, self.prio, m, wk.cc.policy)? {
                LockStep::Done(v) => {
                    self.held_local.push((k, rec));
                    v
                }
                LockStep::Wait(rec, slot) => {
                    // A queued request is part of what we must release on abort.
                    self.held_local.push((k, rec));
                    wk.wait_queued(self.id, k, rec, slot).await?
                }
            };
            self.values.push((k, v, m));
            index_last(&mut self.value_index, &self.values, |e| e.0);
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let me = wk.node.id;
        let mut remote_writes: FxHashMap<NodeId, Writes> = FxHashMap::default();
        let mut local_writes = Writes::new();
        self.write_index.clear();
        for (k, v) in self.writes.drain(..) {
            let n = wk.node.node_of(k);
            if n == me {
                local_writes.push((k, v));
            } else {
                remote_writes.entry(n).or_default().push((k, v));
            }
        }
        if self.touched.is_empty() {
            return self.commit_here(local_writes);
        }
        // Phase one: prepare everywhere we hold locks.
        let id = self.id;
        let prepares = self
            .touched
            .iter()
            .map(|&n| (n, Request::Prepare { txn: id, writes: remote_writes.remove(&n).unwrap_or_default() }));
        let votes = wk.ask_all(prepares).await;
        let mut writers = Vec::new();
        for (n, v) in self.touched.clone().into_iter().zip(votes) {
            match v {
                Ok(Reply::Vote(Vote::Yes)) => writers.push(n),
                Ok(Reply::Vote(Vote::ReadOnly)) => {}
                Ok(Reply::Vote(Vote::Lost)) => return Err(self.abort(Abort::ParticipantLost)),
                // A reply of the wrong kind is garbled; a failed call timed out.
                Ok(_) => return Err(self.abort(Abort::BadReply)),
                Err(_) => return Err(self.abort(Abort::Timeout)),
            }
        }
        // With a log, the decision is durable before anyone learns it. A read-only transaction
        // waits for what it may have read here (early lock release, `commit_here`).
        let read_here = !self.held_local.is_empty();
        if let Err(a) = wk.log_and_tell_commit((self.id, Stamp::default()), &local_writes, writers, read_here).await {
            return Err(self.abort(a));
        }
        self.install_and_release(local_writes);
        Ok(None)
    }

    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
