//! TicToc's coordinator: execution reads each version with its lease (remote ones from their
//! node) and buffers writes; commit locks the write set everywhere (remote nodes first, in
//! parallel, then this node's), computes the commit timestamp from the read leases' `wts` and
//! the locked leases' `rts`, validates every read at it (extending leases where they end before
//! it), and commits with 2PC's decision table; a transaction that touched no other node commits
//! with early lock release.

use super::messages::{Reply, Request, Vote};
use super::meta::{self, Rec};
use super::participant::Writes;
use super::{validation_abort, TicToc, TicTocWorker, FRESH_READ_LOCKED, WRITE_LOCKED};
use crate::net::NodeId;
use crate::protocols::twopc::buffered::{BufferedTxn, ReadOf, ReadSet};
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::lease::{needs_renewal, validate_own_write, CommitTs, Lease};
use crate::protocols::twopc::skeleton::commit_with_early_release;
use crate::protocols::twopc::{CoordTxn, Coordinator, Stamp, TxnId, TxnStatus};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

/// A read: the version seen, with the lease it had. Prefetched reads count (in the commit
/// timestamp and at validation) only once the procedure reads them.
struct ReadEntry<'a> {
    key: RowKey,
    value: Option<Value>,
    lease: Lease,
    /// The local record (`None`: remote).
    rec: Option<&'a Rec>,
    used: bool,
}

impl ReadOf for ReadEntry<'_> {
    fn key(&self) -> RowKey {
        self.key
    }
}

/// What one remote node must lock (writes) and validate (reads: key, `wts` read) at commit.
#[derive(Default)]
struct Part {
    writes: Writes,
    reads: Vec<(RowKey, u64)>,
}

pub struct TicTocTxn<'a> {
    wk: &'a TicTocWorker,
    pub id: TxnId,
    /// Must see every write acknowledged before it started ([`Attempt::fresh`]).
    fresh: bool,
    reads: ReadSet<ReadEntry<'a>>,
    writes: Writes,
    /// The declared local records, resolved once by `prefetch`.
    local_recs: FxHashMap<RowKey, &'a Rec>,
    /// Local records locked at commit.
    locked_here: Vec<&'a Rec>,
    /// Remote nodes asked to lock (they must hear the outcome).
    locked_at: Vec<NodeId>,
    /// The commit timestamp, once computed (0 before).
    commit_ts: u64,
    /// The agreement term it started in under `commit=wm` (0 otherwise).
    era: u64,
}

/// How a TicToc attempt starts, as the 2PC skeleton calls it.
impl Coordinator for TicToc {
    type Txn<'a> = TicTocTxn<'a>;

    fn begin<'a>(wk: &'a TicTocWorker, id: TxnId, attempt: Attempt) -> TicTocTxn<'a> {
        TicTocTxn {
            wk,
            id,
            fresh: attempt.fresh,
            reads: ReadSet::default(),
            writes: Vec::new(),
            local_recs: FxHashMap::default(),
            locked_here: Vec::new(),
            locked_at: Vec::new(),
            commit_ts: 0,
            era: wk.wm_term(),
        }
    }
}

impl<'a> TicTocTxn<'a> {
    /// The local record of `key`: from the prefetched ones, else from the index (created absent
    /// if need be, so that a read of an absent row has a lease to validate).
    fn local_rec(&self, key: RowKey) -> &'a Rec {
        match self.local_recs.get(&key) {
            Some(r) => r,
            None => self.wk.node.store.get_or_create(key),
        }
    }

    /// Read a local record now: its committed value and lease.
    fn read_local(&self, rec: &Rec) -> TxnResult<(Option<Value>, Lease)> {
        self.wk.w.charge_ops(1);
        if self.fresh && meta::written_by_other(rec, self.id) {
            return Err(Abort::Protocol(FRESH_READ_LOCKED));
        }
        Ok(meta::read(rec, self.wk.state.floor))
    }

    /// The values and leases of `keys` on node `n`, in order.
    async fn read_remote(&self, n: NodeId, keys: Vec<RowKey>) -> TxnResult<Vec<(Option<Value>, Lease)>> {
        let len = keys.len();
        match self.wk.ask(n, &Request::Read { keys, fresh: self.fresh }).await? {
            Reply::Values(vals) if vals.len() == len => Ok(vals),
            Reply::Aborted(a) => Err(a),
            _ => Err(Abort::BadReply),
        }
    }

    /// Group the write set by node: this node's writes with their records, and each remote
    /// node's part (writes now, reads added by the caller).
    fn split_writes(&mut self) -> (Writes, Vec<&'a Rec>, FxHashMap<NodeId, Part>) {
        let wk = self.wk;
        let me = wk.node.id;
        let mut local_writes = Writes::with_capacity(self.writes.len());
        let mut local_recs = Vec::with_capacity(self.writes.len());
        let mut remote: FxHashMap<NodeId, Part> = FxHashMap::default();
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => {
                    local_recs.push(self.local_rec(k));
                    local_writes.push((k, v));
                }
                n => remote.entry(n).or_default().writes.push((k, v)),
            }
        }
        (local_writes, local_recs, remote)
    }

    /// Lock every remote write set (in parallel): the leases locked, by key. Every node asked
    /// is noted first, since a lost reply may leave locks there.
    async fn lock_remote(&mut self, remote: &FxHashMap<NodeId, Part>) -> TxnResult<FxHashMap<RowKey, Lease>> {
        let wk = self.wk;
        let asked: Vec<(NodeId, Vec<RowKey>)> = remote
            .iter()
            .filter(|(_, p)| !p.writes.is_empty())
            .map(|(n, p)| (*n, p.writes.iter().map(|w| w.0).collect()))
            .collect();
        let mut locked = FxHashMap::default();
        if asked.is_empty() {
            return Ok(locked);
        }
        wk.coord.set(self.id, TxnStatus::Active);
        self.locked_at = asked.iter().map(|a| a.0).collect();
        let requests = asked.iter().map(|(n, keys)| (*n, Request::Lock { txn: self.id, keys: keys.clone() }));
        let mut failure = None;
        for ((_, keys), reply) in asked.iter().zip(wk.ask_all(requests).await) {
            match reply {
                Ok(Reply::Locked(Some(leases))) if leases.len() == keys.len() => {
                    locked.extend(keys.iter().copied().zip(leases));
                }
                Ok(Reply::Locked(None)) => failure = failure.or(Some(Abort::Protocol(WRITE_LOCKED))),
                Ok(Reply::Aborted(a)) => failure = failure.or(Some(a)),
                Ok(_) => failure = failure.or(Some(Abort::BadReply)),
                Err(a) => failure = failure.or(Some(a)),
            }
        }
        match failure {
            Some(a) => Err(a),
            None => Ok(locked),
        }
    }

    /// The reads this attempt used, each with the lease locked for it if it also writes the key.
    fn used_reads(&self) -> impl Iterator<Item = &ReadEntry<'a>> {
        self.reads.iter().filter(|e| e.used)
    }

    /// Validate the local reads at `commit_ts` (reads of keys it also writes were checked
    /// against their locked leases).
    fn validate_local(&self, commit_ts: u64, locked: &FxHashMap<RowKey, Lease>) -> TxnResult<()> {
        let wk = self.wk;
        let mut n = 0;
        for e in self.used_reads().filter(|e| e.rec.is_some() && !locked.contains_key(&e.key)) {
            if needs_renewal(e.lease, commit_ts) {
                n += 1;
                let rec = e.rec.expect("local");
                meta::validate(rec, self.id, e.lease.wts, commit_ts, wk.state.floor).map_err(validation_abort)?;
            }
        }
        wk.w.charge_ops(n);
        Ok(())
    }

    /// Phase one at every remote node that must hear it; the nodes that voted yes (they hold
    /// writes).
    async fn prepare(&self, commit_ts: u64, remote: FxHashMap<NodeId, Part>) -> TxnResult<Vec<NodeId>> {
        let asked: Vec<NodeId> = remote.keys().copied().collect();
        let prepares = remote
            .into_iter()
            .map(|(n, p)| (n, Request::Prepare { txn: self.id, commit_ts, reads: p.reads, writes: p.writes }));
        let mut writers = Vec::new();
        let mut failure = None;
        for (n, reply) in asked.into_iter().zip(self.wk.ask_all(prepares).await) {
            match reply {
                Ok(Reply::Vote(Vote::Yes)) => writers.push(n),
                Ok(Reply::Vote(Vote::ReadOnly)) => {}
                Ok(Reply::Vote(Vote::Invalid(f))) => failure = failure.or(Some(validation_abort(f))),
                Ok(Reply::Vote(Vote::Lost)) => failure = failure.or(Some(Abort::ParticipantLost)),
                Ok(Reply::Aborted(a)) => failure = failure.or(Some(a)),
                Ok(_) => failure = failure.or(Some(Abort::BadReply)),
                Err(a) => failure = failure.or(Some(a)),
            }
        }
        match failure {
            Some(a) => Err(a),
            None => Ok(writers),
        }
    }

    /// Install this node's writes at the commit timestamp (releasing their locks). The read set
    /// is done with: dropping its values first lets the install reuse buffers (`Value::recycle`).
    fn install_here(&mut self, local_writes: Writes) {
        let wk = self.wk;
        let commit_ts = self.commit_ts;
        assert!(commit_ts > 0 || local_writes.is_empty(), "installing before the commit timestamp is known");
        self.reads.clear();
        wk.w.charge_ops(local_writes.len());
        let recs = std::mem::take(&mut self.locked_here);
        assert_eq!(recs.len(), local_writes.len(), "every local write is locked once");
        for (rec, (_, v)) in recs.into_iter().zip(local_writes) {
            meta::install(rec, self.id, v, commit_ts, wk.state.floor);
        }
    }

    /// Release whatever this attempt holds, here and remotely.
    fn abort(&mut self, reason: Abort) -> Abort {
        meta::unlock_all(&std::mem::take(&mut self.locked_here), self.id);
        self.wk.wm_leave(self.id);
        self.wk.abort_remote(self.id, &mut self.locked_at);
        reason
    }

    /// Lock, compute the commit timestamp, validate: everything but the decision. Returns this
    /// node's writes, the remote nodes' parts still to prepare, and the commit timestamp.
    async fn lock_and_validate(&mut self) -> TxnResult<(Writes, FxHashMap<NodeId, Part>)> {
        let wk = self.wk;
        let (local_writes, local_recs, mut remote) = self.split_writes();
        // Every lock is held before any validation (TicToc's order): remote ones first, so that
        // hot local records are not held across that round trip.
        let mut locked = self.lock_remote(&remote).await?;
        wk.w.charge_ops(local_recs.len());
        let Some(local_leases) = meta::lock_all(&local_recs, self.id, wk.state.floor) else {
            return Err(Abort::Protocol(WRITE_LOCKED));
        };
        self.locked_here = local_recs;
        locked.extend(local_writes.iter().map(|w| w.0).zip(local_leases));
        // The commit timestamp: no earlier than any version read, after every reader of a
        // version it replaces.
        let mut ts = CommitTs::default();
        self.used_reads().for_each(|e| ts.read(e.lease));
        locked.values().for_each(|l| ts.write(*l));
        // Under `commit=wm` a writer's timestamp lies past the node's floor (R2); one that writes
        // nothing keeps the one its reads give, which the watermark passes as soon as what it
        // read is durable.
        let commit_ts = match locked.is_empty() {
            true => ts.0,
            false => wk.wm_commit_ts(self.id, self.era, ts.0)?,
        };
        self.commit_ts = commit_ts;
        // A key read and written: the version locked must be the one read.
        for e in self.used_reads() {
            if let Some(l) = locked.get(&e.key) {
                validate_own_write(*l, e.lease.wts, commit_ts).map_err(validation_abort)?;
            }
        }
        // Leases extended here, and writes installed here, at the commit timestamp: the bound
        // goes to the log first (the commit waits for later records).
        wk.state.grant(&wk.node.log, commit_ts)?;
        self.validate_local(commit_ts, &locked)?;
        // Remote reads whose lease ends before the commit timestamp are validated at their node.
        let me = wk.node.id;
        for e in self.reads.iter().filter(|e| e.used && e.rec.is_none() && !locked.contains_key(&e.key)) {
            if needs_renewal(e.lease, commit_ts) {
                let n = wk.node.node_of(e.key);
                debug_assert_ne!(n, me, "a remote read of a local key");
                remote.entry(n).or_default().reads.push((e.key, e.lease.wts));
            }
        }
        Ok((local_writes, remote))
    }

    /// Commit a transaction whose every other node is done with (nothing to prepare anywhere
    /// else): with early lock release, as OCC's and Sundial's.
    fn commit_here(&mut self, local_writes: Writes) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let stamp = self.stamp();
        commit_with_early_release(self, wk, (self.id, stamp), local_writes, Self::install_here, Self::abort)
    }

    /// Its commit timestamp, and the term it ran in.
    fn stamp(&self) -> Stamp {
        Stamp { era: self.era, ts: self.commit_ts }
    }
}

impl<'a> BufferedTxn for TicTocTxn<'a> {
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        let i = self.reads.find(key)?;
        let e = &mut self.reads[i];
        e.used = true;
        Some(e.value.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.wk.node.remote_node(key) {
            None => {
                let rec = self.local_rec(key);
                Step::Ready(self.read_local(rec).map(|(value, lease)| {
                    self.reads.push(ReadEntry { key, value: value.clone(), lease, rec: Some(rec), used: true });
                    value
                }))
            }
            Some(n) => Step::Wait(Box::pin(async move {
                let (value, lease) = self.read_remote(n, vec![key]).await?.pop().expect("one asked, one answered");
                self.reads.push(ReadEntry { key, value: value.clone(), lease, rec: None, used: true });
                Ok(value)
            })),
        }
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// Each row is read with its lease, as a read is; a row read before keeps that read (if the
    /// version differs, validating it fails).
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        let wk = self.wk;
        let n = wk.node.node_of(RowKey::new(s.table, s.lo));
        let local = n == wk.node.id;
        let rows = if local {
            wk.w.charge_ops(1);
            if self.fresh && meta::scan_written(&wk.node.store, s) {
                return Err(Abort::Protocol(FRESH_READ_LOCKED));
            }
            meta::scan(&wk.node.store, s, wk.state.floor)
        } else {
            match wk.ask(n, &Request::Scan { scan: s, fresh: self.fresh }).await? {
                Reply::Rows(rows) => rows,
                Reply::Aborted(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        for (k, v, lease) in rows {
            let key = RowKey::new(s.table, k);
            match self.reads.find(key) {
                // Prefetched and unused: the scanned version is the one the procedure sees.
                Some(i) if !self.reads[i].used => {
                    let e = &mut self.reads[i];
                    (e.value, e.lease, e.used) = (Some(v.clone()), lease, true);
                }
                Some(_) => {}
                None => {
                    let rec = local.then(|| self.local_rec(key));
                    self.reads.push(ReadEntry { key, value: Some(v.clone()), lease, rec, used: true });
                }
            }
            out.push((k, v));
        }
        Ok(out)
    }
}

impl<'a> CoordTxn for TicTocTxn<'a> {
    /// One-shot: fetch every declared remote key, one `Read` per node, in parallel, and start
    /// loading the local records so that their cache misses overlap that round trip.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let wk = self.wk;
        let store = &wk.node.store;
        self.reads.reserve(keys.reads.len() + keys.writes.len());
        self.writes.reserve(keys.writes.len());
        self.local_recs.reserve(keys.reads.len() + keys.writes.len());
        let mut by_node: FxHashMap<NodeId, Vec<RowKey>> = FxHashMap::default();
        for &k in keys.reads.iter().chain(&keys.writes) {
            match wk.node.remote_node(k) {
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
        for ks in by_node.values_mut() {
            // A key may be declared as both read and written: fetch it once.
            ks.sort_unstable();
            ks.dedup();
        }
        let calls: Vec<_> = by_node.iter().map(|(n, ks)| self.read_remote(*n, ks.clone())).collect();
        let replies = join_all(calls).await;
        for ((_, ks), reply) in by_node.iter().zip(replies) {
            for (k, (value, lease)) in ks.iter().zip(reply?) {
                self.reads.push(ReadEntry { key: *k, value, lease, rec: None, used: false });
            }
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let (local_writes, remote) = match self.lock_and_validate().await {
            Ok(x) => x,
            Err(a) => return Err(self.abort(a)),
        };
        if remote.is_empty() {
            return self.commit_here(local_writes);
        }
        let writers = match self.prepare(self.commit_ts, remote).await {
            Ok(w) => w,
            Err(a) => return Err(self.abort(a)),
        };
        debug_assert!(self.locked_at.iter().all(|n| writers.contains(n)), "every node locked voted yes");
        // With a log, the decision is durable before anyone learns it.
        let read_here = self.used_reads().any(|e| e.rec.is_some());
        let stamp = self.stamp();
        if let Err(a) = wk.log_and_tell_commit((self.id, stamp), &local_writes, writers, read_here).await {
            return Err(self.abort(a));
        }
        // The remote nodes heard (or will hear) the decision: nothing to abort there any more.
        self.locked_at.clear();
        self.install_here(local_writes);
        wk.wm_leave(self.id);
        Ok(wk.ack_after(stamp, None))
    }

    /// Execution holds nothing anywhere (reads are optimistic, writes buffered): nothing to undo.
    fn abandon(&mut self, reason: Abort) -> Abort {
        reason
    }
}
