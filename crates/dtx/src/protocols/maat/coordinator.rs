//! MaaT's coordinator: the execution phase (every read holds a soft read lock where the record
//! lives and records the version's write timestamp; declared writes hold soft write locks from
//! the start, the others from validation; values are buffered), then validation at every node
//! the transaction touched, in parallel, each answering with the range of commit timestamps it
//! allows there; the commit timestamp is the lowest one every range allows, and every touched
//! node hears the decision with it.

use super::messages::{Reply, Request};
use super::participant::Writes;
use super::range::EMPTY;
use super::{Maat, MaatWorker};
use crate::net::NodeId;
use crate::protocols::twopc::buffered::{BufferedTxn, ReadOf, ReadSet};
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::Coordinator;
use crate::protocols::twopc::{CoordTxn, TxnId};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

struct ReadEntry {
    key: RowKey,
    value: Option<Value>,
    wts: u64,
    /// Prefetched entries are validated only once the procedure reads them.
    used: bool,
}

impl ReadOf for ReadEntry {
    fn key(&self) -> RowKey {
        self.key
    }
}

/// What one node validates: the versions read there and the writes to it.
#[derive(Default)]
struct Part {
    reads: Vec<(RowKey, u64)>,
    writes: Writes,
}

pub struct MaatTxn<'a> {
    wk: &'a MaatWorker,
    pub id: TxnId,
    reads: ReadSet<ReadEntry>,
    writes: Writes,
    /// Remote nodes that hold soft locks of this attempt: each hears the outcome.
    touched: Vec<NodeId>,
    /// Local keys this attempt holds soft locks on (reads, and declared writes).
    local_keys: Vec<RowKey>,
    /// It must see every acknowledged write (`Attempt::fresh`).
    fresh: bool,
}

/// How a MaaT attempt starts, as the 2PC skeleton calls it.
impl Coordinator for Maat {
    type Txn<'a> = MaatTxn<'a>;

    fn begin<'a>(wk: &'a MaatWorker, id: TxnId, attempt: Attempt) -> MaatTxn<'a> {
        MaatTxn {
            wk,
            id,
            reads: ReadSet::default(),
            writes: Vec::new(),
            touched: Vec::new(),
            local_keys: Vec::new(),
            fresh: attempt.fresh,
        }
    }
}

impl<'a> MaatTxn<'a> {
    /// Note that `n` will hold state of this attempt (before the message that makes it hold
    /// any): the decision table answers its questions from then on.
    fn touch(&mut self, n: NodeId) {
        self.wk.coord.touch(self.id, &mut self.touched, n)
    }

    /// Read a local record, holding a soft read lock on it.
    fn read_here(&mut self, key: RowKey, used: bool) -> TxnResult<Option<Value>> {
        let wk = self.wk;
        wk.w.charge_ops(1);
        let (value, wts) = wk.state.read(&wk.node.store, self.id, key, self.fresh)?;
        self.local_keys.push(key);
        self.reads.push(ReadEntry { key, value: value.clone(), wts, used });
        Ok(value)
    }

    /// Validate here (inline) and at every remote node (in parallel); the intersection of the
    /// ranges, or the first reason a node gave for having none. In a durable run, every node
    /// whose logged bound the lowest common timestamp passes raises it first.
    async fn validate_all(&mut self, local: &Part, remote: Vec<(NodeId, Part)>) -> TxnResult<(u64, u64)> {
        let wk = self.wk;
        let (mut lower, mut upper) = (1, u64::MAX);
        // Each node's logged bound (`u64::MAX` without a log), the local node as `None`.
        let mut bounds: Vec<(Option<NodeId>, u64)> = Vec::new();
        if !self.local_keys.is_empty() || !local.writes.is_empty() || !local.reads.is_empty() {
            let write_keys: Vec<RowKey> = local.writes.iter().map(|w| w.0).collect();
            self.local_keys.extend_from_slice(&write_keys);
            wk.w.charge_ops(local.reads.len() + write_keys.len());
            match wk.validate_here(self.id, &local.reads, &write_keys).await {
                Ok((l, u, b)) => ((lower, upper), bounds) = ((l, u), vec![(None, b)]),
                Err(a) => return Err(self.abort(a)),
            }
        }
        let nodes: Vec<NodeId> = remote.iter().map(|(n, _)| *n).collect();
        let txn = self.id;
        let validations =
            remote.into_iter().map(|(n, p)| (n, Request::Validate { txn, reads: p.reads, writes: p.writes }));
        for (n, reply) in nodes.into_iter().zip(wk.ask_all(validations).await) {
            match reply {
                Ok(Reply::Range { lower: l, upper: u, bound }) => {
                    (lower, upper) = (lower.max(l), upper.min(u));
                    bounds.push((Some(n), bound));
                }
                Ok(Reply::No(a)) => return Err(self.abort(a)),
                // A reply of the wrong kind is garbled; a failed call timed out.
                Ok(_) => return Err(self.abort(Abort::BadReply)),
                Err(_) => return Err(self.abort(Abort::Timeout)),
            }
        }
        if lower <= upper {
            self.raise_bounds(lower, &bounds).await?;
        }
        Ok((lower, upper))
    }

    /// Raise the logged bound past `ts` wherever it lags (durable runs only).
    async fn raise_bounds(&mut self, ts: u64, bounds: &[(Option<NodeId>, u64)]) -> TxnResult<()> {
        let wk = self.wk;
        let lagging: Vec<Option<NodeId>> = bounds.iter().filter(|b| b.1 < ts).map(|b| b.0).collect();
        if lagging.is_empty() {
            return Ok(());
        }
        wk.w.count(super::BOUND_RAISES, 1);
        if lagging.contains(&None) {
            if let Err(a) = wk.raise_here(ts).await {
                return Err(self.abort(a));
            }
        }
        let raises = lagging.iter().flatten().map(|&n| (n, Request::Raise { ts }));
        for reply in wk.ask_all(raises).await {
            match reply {
                Ok(Reply::Raised) => {}
                Ok(Reply::No(a)) => return Err(self.abort(a)),
                // A reply of the wrong kind is garbled; a failed call timed out.
                Ok(_) => return Err(self.abort(Abort::BadReply)),
                Err(_) => return Err(self.abort(Abort::Timeout)),
            }
        }
        Ok(())
    }

    /// Drop what this attempt holds here, forget it, and tell every touched node.
    fn abort(&mut self, reason: Abort) -> Abort {
        let wk = self.wk;
        wk.state.abort(&wk.node.store, self.id, self.local_keys.drain(..));
        wk.abort_remote(self.id, &mut self.touched);
        reason
    }
}

impl<'a> BufferedTxn for MaatTxn<'a> {
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        let i = self.reads.find(key)?;
        self.reads[i].used = true;
        Some(self.reads[i].value.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.wk.node.remote_node(key) {
            None => Step::Ready(self.read_here(key, true)),
            Some(n) => Step::Wait(Box::pin(async move {
                self.touch(n);
                let req = Request::Read { txn: self.id, keys: vec![key], writes: Vec::new(), fresh: self.fresh };
                let mut vals = match self.wk.ask(n, &req).await? {
                    Reply::Values(vals) => vals,
                    Reply::No(a) => return Err(a),
                    _ => return Err(Abort::BadReply),
                };
                let (value, wts) = vals.pop().ok_or(Abort::BadReply)?;
                self.reads.push(ReadEntry { key, value: value.clone(), wts, used: true });
                Ok(value)
            })),
        }
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// Each row is read with its write timestamp and soft read lock, as a read is.
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        let wk = self.wk;
        let n = wk.node.node_of(RowKey::new(s.table, s.lo));
        let rows = if n == wk.node.id {
            wk.w.charge_ops(1);
            let rows = wk.state.scan(&wk.node.store, self.id, s, self.fresh)?;
            self.local_keys.extend(rows.iter().map(|r| RowKey::new(s.table, r.0)));
            rows
        } else {
            self.touch(n);
            match wk.ask(n, &Request::Scan { txn: self.id, scan: s, fresh: self.fresh }).await? {
                Reply::Rows(rows) => rows,
                Reply::No(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            }
        };
        for (k, v, wts) in &rows {
            let key = RowKey::new(s.table, *k);
            if self.reads.find(key).is_none() {
                self.reads.push(ReadEntry { key, value: Some(v.clone()), wts: *wts, used: true });
            }
        }
        Ok(rows.into_iter().map(|(k, v, _)| (k, v)).collect())
    }
}

impl<'a> CoordTxn for MaatTxn<'a> {
    /// One-shot: read every declared key (a declared write too: its procedure reads it first)
    /// and hold soft write locks on the declared writes, one message per remote participant.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let wk = self.wk;
        let mut by_node: FxHashMap<NodeId, (Vec<RowKey>, Vec<RowKey>)> = FxHashMap::default();
        for &k in keys.reads.iter().chain(&keys.writes) {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().0.push(k),
                None if self.reads.find(k).is_none() => {
                    self.read_here(k, false)?;
                }
                None => {}
            }
        }
        for &k in &keys.writes {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().1.push(k),
                None => {
                    wk.state.lock_write(&wk.node.store, self.id, k);
                    self.local_keys.push(k);
                }
            }
        }
        if by_node.is_empty() {
            return Ok(());
        }
        let mut nodes: Vec<(NodeId, Vec<RowKey>, Vec<RowKey>)> = by_node
            .into_iter()
            .map(|(n, (mut reads, writes))| {
                reads.sort_unstable();
                reads.dedup();
                (n, reads, writes)
            })
            .collect();
        nodes.sort_unstable_by_key(|e| e.0);
        for (n, _, _) in &nodes {
            self.touch(*n);
        }
        let calls: Vec<_> = nodes
            .iter()
            .map(|(n, reads, writes)| {
                let req =
                    Request::Read { txn: self.id, keys: reads.clone(), writes: writes.clone(), fresh: self.fresh };
                let n = *n;
                async move { wk.ask(n, &req).await }
            })
            .collect();
        for ((_, ks, _), reply) in nodes.iter().zip(join_all(calls).await) {
            let vals = match reply? {
                Reply::Values(vals) => vals,
                Reply::No(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            };
            if vals.len() != ks.len() {
                return Err(Abort::BadReply);
            }
            for (k, (value, wts)) in ks.iter().zip(vals) {
                self.reads.push(ReadEntry { key: *k, value, wts, used: false });
            }
        }
        Ok(())
    }

    /// Validate everywhere, take the lowest timestamp every range allows, log the decision,
    /// install here and tell every touched node.
    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let me = wk.node.id;
        let mut local = Part::default();
        let mut remote: Vec<(NodeId, Part)> = self.touched.iter().map(|n| (*n, Part::default())).collect();
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => local.writes.push((k, v)),
                n => {
                    if !self.touched.contains(&n) {
                        self.touch(n);
                        remote.push((n, Part::default()));
                    }
                    let i = remote.iter().position(|r| r.0 == n).expect("touched");
                    remote[i].1.writes.push((k, v));
                }
            }
        }
        for e in self.reads.iter().filter(|e| e.used) {
            match wk.node.node_of(e.key) {
                n if n == me => local.reads.push((e.key, e.wts)),
                n => {
                    let i = remote.iter().position(|r| r.0 == n).expect("a remote read touched its node");
                    remote[i].1.reads.push((e.key, e.wts));
                }
            }
        }
        let (lower, upper) = self.validate_all(&local, remote).await?;
        if lower > upper {
            return Err(self.abort(Abort::Protocol(EMPTY)));
        }
        let ts = lower;
        let logs_decision = !self.touched.is_empty() || !local.writes.is_empty();
        if logs_decision {
            if let Err(a) = wk.node.log.log_decision_at(&wk.w, self.id, &local.writes, &self.touched, ts).await {
                return Err(self.abort(a));
            }
        }
        self.reads.clear();
        // One step a key soft-locked here (the written ones among them install as they unlock).
        wk.w.charge_ops(self.local_keys.len());
        let write_locks: Vec<RowKey> = local.writes.iter().map(|w| w.0).collect();
        wk.state.commit(&wk.node.store, self.id, ts, &self.local_keys, &write_locks, local.writes);
        if !self.touched.is_empty() {
            wk.coord.set_committed_at(self.id, ts);
            wk.tell_commit_at(self.id, ts, std::mem::take(&mut self.touched));
        }
        // Read-only, here only: acknowledged once the fence after its reads is durable.
        Ok(if logs_decision { None } else { wk.node.log.read_fence() })
    }

    /// Execution failed: the soft locks it holds anywhere go.
    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
