//! Sundial's coordinator (Alg. 1-3): reads take the committed version with its lease and raise
//! the commit timestamp to its `wts`; writes lock their tuple (WAIT_DIE) and raise it past its
//! `rts`; at commit, every read whose lease ends before the commit timestamp is extended at its
//! home in the prepare round (one message per participant), writes are installed with the lease
//! `[commit_ts, commit_ts]`, and participants that only read skip the commit phase.

use super::messages::{Fetched, Reply, Request, Vote};
use super::meta::{self, Rec};
use super::participant::Writes;
use super::policy::CachePolicy;
use super::{Sundial, SundialWorker, READ_THEN_WRITE_CHANGED};
use crate::net::NodeId;
use crate::protocols::twopc::buffer_write;
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::lease::{needs_renewal, CommitTs, Lease, RenewFailure};
use crate::protocols::twopc::record_lock::{self as locks, LockStep, Mode, Policy, Prio};
use crate::protocols::twopc::skeleton::commit_with_early_release;
use crate::protocols::twopc::Coordinator;
use crate::protocols::twopc::{own_view, CoordTxn, Stamp, TxnId, TxnStatus};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Access, KeySet, Scan, Step, TxnResult};
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
    /// Taken from this node's cache without asking the home.
    cached: bool,
}

/// A remote read to ask its home for, with the version and value of a cached copy when the
/// policy asks whether that copy is current (`request`).
struct Asked {
    key: RowKey,
    known: Option<(u64, Option<Value>)>,
}

pub struct SundialTxn<'a> {
    wk: &'a SundialWorker,
    pub id: TxnId,
    prio: Prio,
    /// Must see every write acknowledged before it started: reads go to their homes, never to
    /// the cache ([`crate::protocols::Attempt::fresh`]).
    fresh: bool,
    commit_ts: CommitTs,
    reads: Vec<ReadEntry<'a>>,
    writes: Writes,
    /// Local records this attempt locked (or queued for).
    held_local: Vec<&'a Rec>,
    /// Remote nodes where it locked (they must hear the outcome), and where it only read.
    locked_at: Vec<NodeId>,
    read_at: Vec<NodeId>,
    /// The agreement term it started in under `commit=wm` (0 otherwise).
    era: u64,
}

/// How a Sundial attempt starts, as the 2PC skeleton calls it.
impl Coordinator for Sundial {
    type Txn<'a> = SundialTxn<'a>;

    fn begin<'a>(wk: &'a SundialWorker, id: TxnId, attempt: Attempt) -> SundialTxn<'a> {
        SundialTxn {
            wk,
            id,
            prio: Prio(attempt.first_start_us, id),
            fresh: attempt.fresh,
            commit_ts: CommitTs::default(),
            reads: Vec::new(),
            writes: Vec::new(),
            held_local: Vec::new(),
            locked_at: Vec::new(),
            read_at: Vec::new(),
            era: wk.wm_term(),
        }
    }
}

impl<'a> SundialTxn<'a> {
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
        self.reads.push(ReadEntry { key, value, lease, rec, used, locked: false, cached: false });
    }

    /// A remote read the cache answers under the policy (Sec. 4.2): `None` when it did (the
    /// read is taken, no message), else what to ask the home.
    fn plan_read(&mut self, key: RowKey, used: bool) -> Option<Asked> {
        let node = &self.wk.state;
        if node.policy == CachePolicy::None || self.fresh {
            return Some(Asked { key, known: None });
        }
        let Some(copy) = node.cache.get(key) else { return Some(Asked { key, known: None }) };
        if node.votes.reuse(node.policy) {
            self.wk.w.count(super::CACHE_REUSED, 1);
            // A tuple of a read-only table is extended to the table lease its home reported.
            let mut lease = copy.meta;
            lease.rts = lease.rts.max(node.remote_tables.rts(self.wk.node.node_of(key), key.table));
            self.push_read(key, copy.value, lease, None, used);
            self.reads.last_mut().expect("just pushed").cached = true;
            return None;
        }
        self.wk.w.count(super::CACHE_CHECKS, 1);
        Some(Asked { key, known: Some((copy.meta.wts, copy.value)) })
    }

    /// A tuple now locked with `lease`: commit after its readers (Alg. 1 line 24); if this
    /// attempt read it before, the version must be the one it read (line 21).
    fn note_locked(&mut self, key: RowKey, value: Option<Value>, lease: Lease, rec: Option<&'a Rec>) -> TxnResult<()> {
        self.commit_ts.write(lease);
        match self.find_read(key) {
            Some(i) if self.reads[i].used && self.reads[i].lease.wts != lease.wts => {
                if self.reads[i].cached {
                    self.wk.state.cache.remove(key);
                    self.wk.state.votes.cache_was_stale();
                }
                return Err(Abort::Protocol(READ_THEN_WRITE_CHANGED));
            }
            Some(i) => {
                let e = &mut self.reads[i];
                (e.value, e.lease, e.locked) = (value, lease, true);
            }
            None => self.reads.push(ReadEntry { key, value, lease, rec, used: false, locked: true, cached: false }),
        }
        Ok(())
    }

    fn is_locked(&self, key: RowKey) -> bool {
        self.find_read(key).is_some_and(|i| self.reads[i].locked)
    }

    /// Lock a local tuple for writing, waiting as WAIT_DIE lets it.
    async fn lock_local(&mut self, key: RowKey) -> TxnResult<()> {
        self.lock_local_rec(key, self.wk.node.store.get_or_create(key)).await
    }

    /// [`SundialTxn::lock_local`] of a record already found.
    async fn lock_local_rec(&mut self, key: RowKey, rec: &'a Rec) -> TxnResult<()> {
        let wk = self.wk;
        wk.w.charge_ops(1);
        // A queued request is part of what an abort releases.
        self.held_local.push(rec);
        if let LockStep::Wait(rec, slot) =
            locks::try_lock_rec(rec, self.id, self.prio, Mode::Exclusive, Policy::WaitDie)?
        {
            locks::wait_lock(&wk.w, rec, slot, wk.cc.lock_wait_us).await?;
        }
        let (value, lease) = wk.state.locked_lease(rec, self.id, key);
        self.note_locked(key, value, lease, Some(rec))
    }

    /// One `Fetch` round trip to node `n`: reads, then locks.
    async fn fetch(&mut self, n: NodeId, reads: Vec<Asked>, lock: Vec<RowKey>) -> TxnResult<()> {
        if lock.is_empty() {
            Self::note_node(&mut self.read_at, n);
        } else {
            if self.locked_at.is_empty() {
                self.wk.coord.set(self.id, TxnStatus::Active);
            }
            Self::note_node(&mut self.locked_at, n);
        }
        let req = Request::Fetch {
            txn: self.id,
            prio: self.prio,
            reads: asked_keys(&reads),
            locks: lock.clone(),
            fresh: self.fresh,
        };
        let reply = self.wk.ask(n, &req).await?;
        self.take_fetched(reply, reads, lock, false)
    }

    fn take_fetched(&mut self, reply: Reply, reads: Vec<Asked>, lock: Vec<RowKey>, prefetch: bool) -> TxnResult<()> {
        let vals = match reply {
            Reply::Fetched(v) if v.len() == reads.len() + lock.len() => v,
            Reply::Aborted(a) => return Err(a),
            _ => return Err(Abort::BadReply),
        };
        let mut vals = vals.into_iter();
        for (asked, got) in reads.into_iter().zip(vals.by_ref()) {
            let (value, lease) = self.take_read(asked.key, asked.known, got)?;
            if self.find_read(asked.key).is_none() {
                self.push_read(asked.key, value, lease, None, !prefetch);
            }
        }
        for (k, got) in lock.into_iter().zip(vals) {
            let Fetched::Data(value, lease) = got else { return Err(Abort::BadReply) };
            self.note_locked(k, value, lease, None)?;
        }
        Ok(())
    }

    /// A home's answer to a read: the data (cached now), or word that the cached copy is
    /// current (its lease refreshed); the checks vote for the hybrid policy.
    fn take_read(
        &mut self,
        key: RowKey,
        known: Option<(u64, Option<Value>)>,
        got: Fetched,
    ) -> TxnResult<(Option<Value>, Lease)> {
        let node = &self.wk.state;
        match (got, known) {
            (Fetched::Current(lease), Some((wts, value))) => {
                self.wk.w.count(super::CACHE_CURRENT, 1);
                node.votes.cache_was_current();
                // Only the version checked gets the home's lease: the copy may have been
                // replaced meanwhile (by a commit of this node), and a value must never carry
                // another version's lease.
                node.cache.update(key, |c| {
                    if c.meta.wts == wts {
                        c.meta = lease;
                    }
                });
                Ok((value, lease))
            }
            (Fetched::Current(_), None) => Err(Abort::BadReply),
            (Fetched::Data(value, lease), known) => {
                if known.is_some() {
                    node.votes.cache_was_stale();
                }
                if node.policy != CachePolicy::None {
                    node.cache.insert(key, crate::storage::cache::Cached { value: value.clone(), meta: lease });
                }
                Ok((value, lease))
            }
        }
    }

    /// Phase one at every remote participant; the nodes that voted yes (they hold writes).
    async fn prepare(&mut self, remote: FxHashMap<NodeId, (Vec<(RowKey, u64)>, Writes)>) -> TxnResult<Vec<NodeId>> {
        let wk = self.wk;
        let (id, commit_ts) = (self.id, self.commit_ts.0);
        let nodes: Vec<NodeId> = remote.keys().copied().collect();
        let prepares =
            remote.into_iter().map(|(n, (renew, writes))| (n, Request::Prepare { txn: id, commit_ts, renew, writes }));
        let mut writers = Vec::new();
        let mut failure = None;
        for (n, v) in nodes.into_iter().zip(wk.ask_all(prepares).await) {
            if let Ok(Reply::Vote(_, tables)) = &v {
                for &(t, end) in tables {
                    wk.state.remote_tables.note(n, t, end);
                }
            }
            match v {
                Ok(Reply::Vote(Vote::Yes, _)) => writers.push(n),
                Ok(Reply::Vote(Vote::ReadOnly, _)) => {}
                Ok(Reply::Vote(Vote::Renewal(f, key), _)) => {
                    self.cached_read_failed(key);
                    failure = failure.or(Some(renewal_abort(f)));
                }
                Ok(Reply::Vote(Vote::Lost, _)) => failure = failure.or(Some(Abort::ParticipantLost)),
                Ok(Reply::Aborted(a)) => failure = failure.or(Some(a)),
                // A reply of the wrong kind is garbled; a failed call timed out.
                Ok(_) => failure = failure.or(Some(Abort::BadReply)),
                Err(_) => failure = failure.or(Some(Abort::Timeout)),
            }
        }
        match failure {
            Some(a) => Err(self.abort(a)),
            None => Ok(writers),
        }
    }

    /// A read's lease could not be extended: a copy of it is stale, and leaves the cache
    /// (Alg. 2 line 8); if the read came from the cache, that is a vote against reusing.
    fn cached_read_failed(&self, key: RowKey) {
        let node = &self.wk.state;
        if node.policy == CachePolicy::None {
            return;
        }
        node.cache.remove(key);
        if self.find_read(key).is_some_and(|i| self.reads[i].cached) {
            node.votes.cache_was_stale();
        }
    }

    /// The commit went through: every cached read was valid at the commit timestamp (a vote
    /// for reusing), every remote read's lease reaches it (and so does its cached copy), and the
    /// remote writes are cached as their homes now hold them (Alg. 3 lines 5-6).
    fn update_cache(&self, remote_writes: &[(RowKey, Option<Value>)]) {
        let node = &self.wk.state;
        if node.policy == CachePolicy::None {
            return;
        }
        let ts = self.commit_ts.0;
        for e in self.reads.iter().filter(|e| e.used && !e.locked && e.rec.is_none()) {
            if e.cached {
                node.votes.cache_was_current();
            }
            // Its home extended the lease to the commit timestamp: so does the copy, if it is
            // still that version, so that later reads of it need no extension up to there.
            if needs_renewal(e.lease, ts) {
                node.cache.update(e.key, |c| {
                    if c.meta.wts == e.lease.wts {
                        c.meta.rts = c.meta.rts.max(ts);
                    }
                });
            }
        }
        let lease = Lease { wts: ts, rts: ts };
        for (k, v) in remote_writes {
            node.cache.insert(*k, crate::storage::cache::Cached { value: v.clone(), meta: lease });
        }
    }

    /// Install this node's writes at the commit timestamp and release every local lock.
    fn install_and_release(&mut self, local_writes: Writes) {
        let wk = self.wk;
        let ts = self.commit_ts.0;
        // One step a record held: an install releases its lock as it writes.
        wk.w.charge_ops(self.held_local.len());
        for (k, v) in local_writes {
            meta::install(wk.node.store.get_or_create(k), self.id, v, ts, wk.state.floor);
        }
        self.reads.clear();
        locks::release_recs(self.id, self.held_local.drain(..));
    }

    /// A transaction that touched no other node: with early lock release, as 2PL's and OCC's.
    fn commit_here(&mut self, local_writes: Writes) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let stamp = self.stamp();
        commit_with_early_release(self, wk, (self.id, stamp), local_writes, Self::install_and_release, Self::abort)
    }

    /// Its commit timestamp, and the term it ran in.
    fn stamp(&self) -> Stamp {
        Stamp { era: self.era, ts: self.commit_ts.0 }
    }

    /// Release every lock this attempt holds or waits for, here and remotely.
    pub fn abort(&mut self, reason: Abort) -> Abort {
        let wk = self.wk;
        locks::release_recs(self.id, self.held_local.drain(..));
        wk.abort_remote(self.id, &mut self.locked_at);
        wk.wm_leave(self.id);
        reason
    }
}

/// The keys of the reads to ask, with the version of a cached copy where one is checked.
fn asked_keys(reads: &[Asked]) -> Vec<(RowKey, Option<u64>)> {
    reads.iter().map(|a| (a.key, a.known.as_ref().map(|k| k.0))).collect()
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
        match self.wk.node.remote_node(key) {
            None => {
                self.wk.w.charge_ops(1);
                let rec = self.wk.node.store.get_or_create(key);
                if self.fresh && meta::written_by_other(rec, self.id) {
                    return Step::Ready(Err(Abort::Protocol(super::FRESH_READ_LOCKED)));
                }
                let (value, lease) = self.wk.state.read(rec, key);
                self.push_read(key, value.clone(), lease, Some(rec), true);
                Step::Ready(Ok(value))
            }
            Some(n) => match self.plan_read(key, true) {
                None => Step::Ready(Ok(self.cached(key).flatten())),
                Some(asked) => Step::Wait(Box::pin(async move {
                    self.fetch(n, vec![asked], Vec::new()).await?;
                    Ok(self.cached(key).flatten())
                })),
            },
        }
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        if self.is_locked(key) {
            buffer_write(&mut self.writes, key, value);
            return Step::Ready(Ok(()));
        }
        Step::Wait(Box::pin(async move {
            match self.wk.node.remote_node(key) {
                None => self.lock_local(key).await?,
                Some(n) => self.fetch(n, Vec::new(), vec![key]).await?,
            }
            self.writes.push((key, value));
            Ok(())
        }))
    }

    /// The rows of a range, each read as a read is (its lease joins the commit timestamp and
    /// is extended at prepare if need be); this attempt's own writes win.
    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        let n = self.wk.node.node_of(RowKey::new(s.table, s.lo));
        Step::Wait(Box::pin(async move {
            let local = n == self.wk.node.id;
            let rows = if local {
                self.wk.w.charge_ops(1);
                if self.fresh && self.wk.state.scan_written(&self.wk.node.store, s) {
                    return Err(Abort::Protocol(super::FRESH_READ_LOCKED));
                }
                self.wk.state.scan(&self.wk.node.store, s)
            } else {
                Self::note_node(&mut self.read_at, n);
                match self.wk.ask(n, &Request::Scan { scan: s, fresh: self.fresh }).await? {
                    Reply::Rows(rows) => rows,
                    Reply::Aborted(a) => return Err(a),
                    _ => return Err(Abort::BadReply),
                }
            };
            let mut out = Vec::with_capacity(rows.len());
            for (k, v, lease) in rows {
                let key = RowKey::new(s.table, k);
                match self.find_read(key) {
                    Some(i) if !self.reads[i].used => {
                        self.reads[i].used = true;
                        self.commit_ts.read(self.reads[i].lease);
                    }
                    Some(_) => {}
                    None => {
                        let rec = local.then(|| self.wk.node.store.get(key)).flatten();
                        self.push_read(key, Some(v.clone()), lease, rec, true);
                    }
                }
                if let Some(v) = own_view(&self.writes, key, v) {
                    out.push((k, v));
                }
            }
            Ok(out)
        }))
    }
}

impl<'a> CoordTxn for SundialTxn<'a> {
    /// One-shot: every declared key, one `Fetch` per remote participant, in parallel; then the
    /// local ones.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let wk = self.wk;
        let (id, prio, fresh) = (self.id, self.prio, self.fresh);
        let store = &wk.node.store;
        // Sized once per attempt: no allocation grows on the one-shot path.
        self.reads.reserve(keys.reads.len() + keys.writes.len());
        self.writes.reserve(keys.writes.len());
        self.held_local.reserve(keys.writes.len());
        let mut by_node: FxHashMap<NodeId, (Vec<RowKey>, Vec<RowKey>)> = FxHashMap::default();
        // The local records are found now and start loading, so that their cache misses
        // overlap each other and the remote round trip (as OCC's prefetch does).
        let mut local_lock_recs: Vec<(RowKey, &'a Rec)> = Vec::with_capacity(keys.writes.len());
        let mut local_read_recs: Vec<(RowKey, &'a Rec)> = Vec::with_capacity(keys.reads.len());
        for &k in &keys.writes {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().1.push(k),
                None => local_lock_recs.push((k, store.get_or_create(k))),
            }
        }
        for &k in keys.reads.iter().filter(|k| !keys.covers(**k, true)) {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().0.push(k),
                None => local_read_recs.push((k, store.get_or_create(k))),
            }
        }
        local_lock_recs.sort_unstable_by_key(|e| e.0);
        local_lock_recs.dedup_by_key(|e| e.0);
        for (_, r) in local_lock_recs.iter().chain(&local_read_recs) {
            r.prefetch();
        }
        for (_, r) in local_lock_recs.iter().chain(&local_read_recs) {
            r.prefetch_value();
        }
        let mut remote: Vec<(NodeId, Vec<Asked>, Vec<RowKey>)> = Vec::with_capacity(by_node.len());
        for (n, (mut r, mut l)) in by_node {
            r.sort_unstable();
            r.dedup();
            l.sort_unstable();
            l.dedup();
            // Reads the cache answers need no message.
            let asked: Vec<Asked> = r.into_iter().filter_map(|k| self.plan_read(k, false)).collect();
            if asked.is_empty() && l.is_empty() {
                continue;
            }
            remote.push((n, asked, l));
        }
        for (n, _, l) in &remote {
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
                let req = Request::Fetch { txn: id, prio, reads: asked_keys(r), locks: l.clone(), fresh };
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
        for (k, rec) in local_lock_recs {
            self.lock_local_rec(k, rec).await?;
        }
        wk.w.charge_ops(local_read_recs.len());
        for (k, rec) in local_read_recs {
            if self.find_read(k).is_none() {
                if fresh && meta::written_by_other(rec, id) {
                    return Err(Abort::Protocol(super::FRESH_READ_LOCKED));
                }
                let (value, lease) = self.wk.state.read(rec, k);
                self.push_read(k, value, lease, Some(rec), false);
            }
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        // Under `commit=wm` a writer's timestamp lies past the node's floor (R2); one that
        // writes nothing keeps the one its reads give.
        if !self.writes.is_empty() {
            match wk.wm_commit_ts(self.id, self.era, self.commit_ts.0) {
                Ok(ts) => self.commit_ts.0 = ts,
                Err(a) => return Err(self.abort(a)),
            }
        }
        let ts = self.commit_ts.0;
        // Leases extended to the commit timestamp here, and writes installed at it, are granted
        // by this node: its bound goes to the log first (the commit waits for later records).
        if let Err(a) = wk.state.grant(&wk.node.log, ts + super::tables::MAX_DELTA) {
            return Err(self.abort(a));
        }
        // Reads here whose lease must be extended (Alg. 2); written keys are locked. Only an
        // extension touches its record (one step each, as TicToc's validation counts).
        let mut renewed = 0;
        let failed = self
            .reads
            .iter()
            .filter(|e| e.used && !e.locked && e.rec.is_some() && needs_renewal(e.lease, ts))
            .find_map(|e| {
                renewed += 1;
                wk.state.renew(&wk.w, e.rec.expect("local"), e.key, self.id, e.lease.wts, ts).err()
            });
        wk.w.charge_ops(renewed);
        if let Some(f) = failed {
            return Err(self.abort(renewal_abort(f)));
        }
        let me = wk.node.id;
        let mut local_writes = Writes::with_capacity(self.writes.len());
        let mut remote_writes = Writes::new();
        let mut remote: FxHashMap<NodeId, (Vec<(RowKey, u64)>, Writes)> = FxHashMap::default();
        for n in self.locked_at.iter().chain(&self.read_at) {
            remote.entry(*n).or_default();
        }
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => local_writes.push((k, v)),
                n => {
                    if wk.state.policy != CachePolicy::None {
                        remote_writes.push((k, v.clone()));
                    }
                    remote.entry(n).or_default().1.push((k, v));
                }
            }
        }
        for e in self.reads.iter().filter(|e| e.used && !e.locked && e.rec.is_none()) {
            if needs_renewal(e.lease, ts) {
                remote.entry(wk.node.node_of(e.key)).or_default().0.push((e.key, e.lease.wts));
            }
        }
        if remote.is_empty() {
            return self.commit_here(local_writes);
        }
        let writers = self.prepare(remote).await?;
        // With a log, the decision is durable before anyone learns it.
        let read_here = self.reads.iter().any(|e| e.used && e.rec.is_some());
        let stamp = self.stamp();
        if let Err(a) = wk.log_and_tell_commit((self.id, stamp), &local_writes, writers, read_here).await {
            return Err(self.abort(a));
        }
        self.update_cache(&remote_writes);
        self.install_and_release(local_writes);
        wk.wm_leave(self.id);
        Ok(wk.ack_after(stamp, None))
    }

    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
