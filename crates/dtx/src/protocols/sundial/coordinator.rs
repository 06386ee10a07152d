//! Sundial's coordinator (Alg. 1-3): reads take the committed version with its lease and raise
//! the commit timestamp to its `wts`; writes lock their tuple (WAIT_DIE) and raise it past its
//! `rts`; at commit, every read whose lease ends before the commit timestamp is extended at its
//! home in the prepare round (one message per participant), writes are installed with the lease
//! `[commit_ts, commit_ts]`, and participants that only read skip the commit phase.

use super::lease::{needs_renewal, CommitTs, Lease, RenewFailure};
use super::messages::{Reply, Request, Vote};
use super::meta::{self, Rec};
use super::participant::Writes;
use super::{SundialWorker, READ_THEN_WRITE_CHANGED, SCAN_UNSUPPORTED};
use crate::net::NodeId;
use crate::protocols::twopc::{CoordTxn, TxnId, TxnStatus};
use crate::protocols::twopl::meta::{Mode, Policy, Prio};
use crate::protocols::twopl::participant::{self as locks, LockStep};
use crate::rt::{join_all, LocalBoxFuture};
use crate::storage::{RowKey, Value};
use crate::txn::{recon, Abort, Access, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

/// A read: the version seen, with the lease it had. Prefetched reads count (in the commit
/// timestamp and at prepare) only once the procedure reads them.
struct ReadEntry<'a> {
    key: RowKey,
    value: Option<Value>,
    lease: Lease,
    /// The local record (`None`: remote).
    rec: Option<&'a Rec>,
    used: bool,
    /// Locked by this transaction for writing: no renewal needed.
    locked: bool,
}

pub struct SundialTxn<'a> {
    wk: &'a SundialWorker,
    pub id: TxnId,
    prio: Prio,
    commit_ts: CommitTs,
    reads: Vec<ReadEntry<'a>>,
    writes: Writes,
    /// Local records this attempt locked (or queued for).
    held_local: Vec<&'a Rec>,
    /// Remote nodes where it locked (they must hear the outcome), and where it only read.
    locked_at: Vec<NodeId>,
    read_at: Vec<NodeId>,
}

impl<'a> SundialTxn<'a> {
    pub fn new(wk: &'a SundialWorker, id: TxnId, first_start_us: u64) -> Self {
        SundialTxn {
            wk,
            id,
            prio: Prio(first_start_us, id),
            commit_ts: CommitTs::default(),
            reads: Vec::new(),
            writes: Vec::new(),
            held_local: Vec::new(),
            locked_at: Vec::new(),
            read_at: Vec::new(),
        }
    }

    fn remote_node(&self, key: RowKey) -> Option<NodeId> {
        let n = self.wk.node.node_of(key);
        (n != self.wk.node.id).then_some(n)
    }

    fn find_read(&self, key: RowKey) -> Option<usize> {
        self.reads.iter().position(|e| e.key == key)
    }

    /// A value this attempt has: its own write, or a version it read (now used).
    fn cached(&mut self, key: RowKey) -> Option<Option<Value>> {
        if let Some((_, v)) = self.writes.iter().find(|(k, _)| *k == key) {
            return Some(v.clone());
        }
        let i = self.find_read(key)?;
        let e = &mut self.reads[i];
        if !e.used {
            e.used = true;
            self.commit_ts.read(e.lease);
        }
        Some(e.value.clone())
    }

    fn note_node(list: &mut Vec<NodeId>, n: NodeId) {
        if !list.contains(&n) {
            list.push(n);
        }
    }

    /// A version read now (used) or prefetched (used later).
    fn push_read(&mut self, key: RowKey, value: Option<Value>, lease: Lease, rec: Option<&'a Rec>, used: bool) {
        if used {
            self.commit_ts.read(lease);
        }
        self.reads.push(ReadEntry { key, value, lease, rec, used, locked: false });
    }

    /// A tuple now locked with `lease`: commit after its readers (Alg. 1 line 24); if this
    /// attempt read it before, the version must be the one it read (line 21).
    fn note_locked(&mut self, key: RowKey, value: Option<Value>, lease: Lease, rec: Option<&'a Rec>) -> TxnResult<()> {
        self.commit_ts.write(lease);
        match self.find_read(key) {
            Some(i) if self.reads[i].used && self.reads[i].lease.wts != lease.wts => {
                return Err(Abort::Protocol(READ_THEN_WRITE_CHANGED));
            }
            Some(i) => {
                let e = &mut self.reads[i];
                (e.value, e.lease, e.locked) = (value, lease, true);
            }
            None => self.reads.push(ReadEntry { key, value, lease, rec, used: false, locked: true }),
        }
        Ok(())
    }

    fn is_locked(&self, key: RowKey) -> bool {
        self.find_read(key).is_some_and(|i| self.reads[i].locked)
    }

    /// Lock a local tuple for writing, waiting as WAIT_DIE lets it.
    async fn lock_local(&mut self, key: RowKey) -> TxnResult<()> {
        let wk = self.wk;
        wk.w.charge_ops(1);
        let rec = wk.node.store.get_or_create(key);
        // A queued request is part of what an abort releases.
        self.held_local.push(rec);
        if let LockStep::Wait(rec, slot) =
            locks::try_lock_rec(rec, self.id, self.prio, Mode::Exclusive, Policy::WaitDie)?
        {
            locks::wait_lock(&wk.w, rec, slot, wk.cc.lock_wait_us).await?;
        }
        let (value, lease) = meta::locked_lease(rec, self.id);
        self.note_locked(key, value, lease, Some(rec))
    }

    /// One `Fetch` round trip to node `n`: reads, then locks.
    async fn fetch(&mut self, n: NodeId, reads: Vec<RowKey>, lock: Vec<RowKey>) -> TxnResult<()> {
        if lock.is_empty() {
            Self::note_node(&mut self.read_at, n);
        } else {
            if self.locked_at.is_empty() {
                self.wk.coord.set(self.id, TxnStatus::Active);
            }
            Self::note_node(&mut self.locked_at, n);
        }
        let req = Request::Fetch { txn: self.id, prio: self.prio, reads: reads.clone(), locks: lock.clone() };
        let reply = self.wk.ask(n, &req).await?;
        self.take_fetched(reply, reads, lock, false)
    }

    fn take_fetched(&mut self, reply: Reply, reads: Vec<RowKey>, lock: Vec<RowKey>, prefetch: bool) -> TxnResult<()> {
        let vals = match reply {
            Reply::Fetched(v) if v.len() == reads.len() + lock.len() => v,
            Reply::Aborted(a) => return Err(a),
            _ => return Err(Abort::Timeout),
        };
        let mut vals = vals.into_iter();
        for (k, (value, lease)) in reads.into_iter().zip(vals.by_ref()) {
            if self.find_read(k).is_none() {
                self.push_read(k, value, lease, None, !prefetch);
            }
        }
        for (k, (value, lease)) in lock.into_iter().zip(vals) {
            self.note_locked(k, value, lease, None)?;
        }
        Ok(())
    }

    /// Phase one at every remote participant; the nodes that voted yes (they hold writes).
    async fn prepare(&mut self, remote: FxHashMap<NodeId, (Vec<(RowKey, u64)>, Writes)>) -> TxnResult<Vec<NodeId>> {
        let wk = self.wk;
        let (id, commit_ts) = (self.id, self.commit_ts.0);
        let nodes: Vec<NodeId> = remote.keys().copied().collect();
        let calls: Vec<_> = remote
            .into_iter()
            .map(|(n, (renew, writes))| {
                let req = Request::Prepare { txn: id, commit_ts, renew, writes };
                async move { wk.ask(n, &req).await }
            })
            .collect();
        let mut writers = Vec::new();
        let mut failure = None;
        for (n, v) in nodes.into_iter().zip(join_all(calls).await) {
            match v {
                Ok(Reply::Vote(Vote::Yes)) => writers.push(n),
                Ok(Reply::Vote(Vote::ReadOnly)) => {}
                Ok(Reply::Vote(Vote::Renewal(f))) => failure = failure.or(Some(renewal_abort(f))),
                Ok(Reply::Vote(Vote::Lost)) => failure = failure.or(Some(Abort::ParticipantLost)),
                Ok(Reply::Aborted(a)) => failure = failure.or(Some(a)),
                _ => failure = failure.or(Some(Abort::Timeout)),
            }
        }
        match failure {
            Some(a) => Err(self.abort(a)),
            None => Ok(writers),
        }
    }

    /// Install this node's writes at the commit timestamp and release every local lock.
    fn install_and_release(&mut self, local_writes: Writes) {
        let wk = self.wk;
        let ts = self.commit_ts.0;
        wk.w.charge_ops(local_writes.len() + self.held_local.len());
        for (k, v) in local_writes {
            meta::install(wk.node.store.get_or_create(k), self.id, v, ts);
        }
        self.reads.clear();
        locks::release_recs(self.id, self.held_local.drain(..));
    }

    /// A transaction that touched no other node: with early lock release, as 2PL's and OCC's.
    async fn commit_here(&mut self, local_writes: Writes) -> TxnResult<()> {
        let wk = self.wk;
        let lsn = match wk.node.log.local_commit_lsn(self.id, &local_writes) {
            Ok(lsn) => lsn,
            Err(a) => return Err(self.abort(a)),
        };
        self.install_and_release(local_writes);
        wk.node.log.durable_counted(&wk.w, lsn).await;
        Ok(())
    }

    /// Release every lock this attempt holds or waits for, here and remotely.
    pub fn abort(&mut self, reason: Abort) -> Abort {
        let wk = self.wk;
        locks::release_recs(self.id, self.held_local.drain(..));
        if !self.locked_at.is_empty() {
            wk.coord.set(self.id, TxnStatus::Aborted);
            wk.tell_abort(self.id, std::mem::take(&mut self.locked_at));
        }
        reason
    }
}

/// The abort reason of a failed lease extension.
fn renewal_abort(f: RenewFailure) -> Abort {
    Abort::Protocol(crate::txn::Reason::new(f.reason()))
}

impl<'a> Access for SundialTxn<'a> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        if let Some(v) = self.cached(key) {
            return Step::Ready(Ok(v));
        }
        match self.remote_node(key) {
            None => {
                self.wk.w.charge_ops(1);
                let rec = self.wk.node.store.get_or_create(key);
                let (value, lease) = meta::read(rec);
                self.push_read(key, value.clone(), lease, Some(rec), true);
                Step::Ready(Ok(value))
            }
            Some(n) => Step::Wait(Box::pin(async move {
                self.fetch(n, vec![key], Vec::new()).await?;
                Ok(self.cached(key).flatten())
            })),
        }
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        if self.is_locked(key) {
            match self.writes.iter_mut().find(|(k, _)| *k == key) {
                Some(w) => w.1 = value,
                None => self.writes.push((key, value)),
            }
            return Step::Ready(Ok(()));
        }
        Step::Wait(Box::pin(async move {
            match self.remote_node(key) {
                None => self.lock_local(key).await?,
                Some(n) => self.fetch(n, Vec::new(), vec![key]).await?,
            }
            self.writes.push((key, value));
            Ok(())
        }))
    }

    /// Range scans need leases on index nodes (Sec. 3.4), which are not built yet.
    fn scan(&mut self, _s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        Step::Ready(Err(Abort::Protocol(SCAN_UNSUPPORTED)))
    }
}

/// Reconnaissance reads: the committed value, no lease kept.
impl recon::SnapshotReader for SundialWorker {
    fn read<'a>(&'a self, key: RowKey) -> LocalBoxFuture<'a, TxnResult<Option<Value>>> {
        Box::pin(async move {
            let n = self.node.node_of(key);
            if n == self.node.id {
                return Ok(self.node.store.get(key).and_then(|r| r.lock().value.clone()));
            }
            let req = Request::Fetch { txn: 0, prio: Prio::default(), reads: vec![key], locks: Vec::new() };
            match self.ask(n, &req).await? {
                Reply::Fetched(mut v) => Ok(v.pop().ok_or(Abort::Timeout)?.0),
                Reply::Aborted(a) => Err(a),
                _ => Err(Abort::Timeout),
            }
        })
    }

    fn scan<'a>(&'a self, _s: Scan) -> LocalBoxFuture<'a, TxnResult<Vec<(u64, Value)>>> {
        Box::pin(async move { Err(Abort::Protocol(SCAN_UNSUPPORTED)) })
    }
}

impl<'a> CoordTxn for SundialTxn<'a> {
    /// One-shot: every declared key, one `Fetch` per remote participant, in parallel; then the
    /// local ones.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let mut by_node: FxHashMap<NodeId, (Vec<RowKey>, Vec<RowKey>)> = FxHashMap::default();
        let mut local_reads = Vec::new();
        let mut local_locks = Vec::new();
        for &k in &keys.writes {
            match self.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().1.push(k),
                None => local_locks.push(k),
            }
        }
        for &k in keys.reads.iter().filter(|k| !keys.covers(**k, true)) {
            match self.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().0.push(k),
                None => local_reads.push(k),
            }
        }
        let wk = self.wk;
        let (id, prio) = (self.id, self.prio);
        let mut remote: Vec<(NodeId, Vec<RowKey>, Vec<RowKey>)> =
            by_node.into_iter().map(|(n, (r, l))| (n, r, l)).collect();
        for (n, r, l) in &mut remote {
            r.sort_unstable();
            r.dedup();
            l.sort_unstable();
            l.dedup();
            if l.is_empty() {
                Self::note_node(&mut self.read_at, *n);
            } else {
                if self.locked_at.is_empty() {
                    wk.coord.set(id, TxnStatus::Active);
                }
                Self::note_node(&mut self.locked_at, *n);
            }
        }
        let calls: Vec<_> = remote
            .iter()
            .map(|(n, r, l)| {
                let req = Request::Fetch { txn: id, prio, reads: r.clone(), locks: l.clone() };
                let n = *n;
                async move { wk.ask(n, &req).await }
            })
            .collect();
        let mut failure = None;
        for ((_, r, l), reply) in remote.into_iter().zip(join_all(calls).await) {
            let got = reply.and_then(|reply| self.take_fetched(reply, r, l, true));
            failure = failure.or(got.err());
        }
        if let Some(a) = failure {
            return Err(a);
        }
        local_locks.sort_unstable();
        local_locks.dedup();
        for k in local_locks {
            self.lock_local(k).await?;
        }
        wk.w.charge_ops(local_reads.len());
        for k in local_reads {
            if self.find_read(k).is_none() {
                let rec = wk.node.store.get_or_create(k);
                let (value, lease) = meta::read(rec);
                self.push_read(k, value, lease, Some(rec), false);
            }
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<()> {
        let wk = self.wk;
        let ts = self.commit_ts.0;
        // Reads here whose lease must be extended (Alg. 2); written keys are locked.
        wk.w.charge_ops(self.reads.len());
        for e in self.reads.iter().filter(|e| e.used && !e.locked && e.rec.is_some()) {
            if needs_renewal(e.lease, ts) {
                wk.w.count(super::RENEWALS, 1);
                if let Err(f) = meta::renew(e.rec.expect("local"), self.id, e.lease.wts, ts) {
                    wk.w.count(super::RENEWALS_FAILED, 1);
                    return Err(self.abort(renewal_abort(f)));
                }
            }
        }
        let me = wk.node.id;
        let mut local_writes = Writes::new();
        let mut remote: FxHashMap<NodeId, (Vec<(RowKey, u64)>, Writes)> = FxHashMap::default();
        for n in self.locked_at.iter().chain(&self.read_at) {
            remote.entry(*n).or_default();
        }
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => local_writes.push((k, v)),
                n => remote.entry(n).or_default().1.push((k, v)),
            }
        }
        for e in self.reads.iter().filter(|e| e.used && !e.locked && e.rec.is_none()) {
            if needs_renewal(e.lease, ts) {
                remote.entry(wk.node.node_of(e.key)).or_default().0.push((e.key, e.lease.wts));
            }
        }
        if remote.is_empty() {
            return self.commit_here(local_writes).await;
        }
        let writers = self.prepare(remote).await?;
        // With a log, the decision is durable before anyone learns it.
        let read_here = self.reads.iter().any(|e| e.used && e.rec.is_some());
        if let Err(a) = wk.node.log.log_decision(&wk.w, self.id, &local_writes, &writers, read_here).await {
            return Err(self.abort(a));
        }
        if writers.is_empty() {
            wk.coord.forget(self.id);
        } else {
            wk.coord.set(self.id, TxnStatus::Committed);
            wk.tell_commit(self.id, writers);
        }
        self.install_and_release(local_writes);
        Ok(())
    }

    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
