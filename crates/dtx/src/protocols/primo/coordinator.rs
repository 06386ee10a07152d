//! Primo's coordinator (Algorithm 1 and §4): a transaction runs TicToc while it touches only this
//! partition, turns distributed at its first remote access (locking and re-checking what it read
//! here), and then locks whatever it reads; a distributed commit computes the timestamp from the
//! leases, extends and installs here, and sends one `Install` per partition it touched.

use super::group_commit::Replaced;
use super::messages::{Reply, Request};
use super::meta::{self, Rec};
use super::{Primo, DUMMY_READ_ROUNDS, WCF_LOCAL_ABORTS};
use super::{PrimoWorker, LOCAL_READ_LOCKED, LOCAL_VERSION_CHANGED, LOCAL_WRITE_LOCKED, SWITCH_CHANGED};
use crate::net::NodeId;
use crate::protocols::twopc::buffered::{BufferedTxn, ReadOf, ReadSet};
use crate::protocols::twopc::durable::{AckAfter, Writes};
use crate::protocols::twopc::lease::{needs_renewal, validate_own_write, CommitTs, Lease, RenewFailure};
use crate::protocols::twopc::record_lock::{Acquire, Mode, Policy, Prio};
use crate::protocols::twopc::{CoordTxn, Coordinator, Stamp, TxnId, TxnStatus};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

/// A read: the version seen, with its lease. Prefetched reads count in the timestamp only once
/// the procedure reads them (`used`); a dummy read (a write's lock) never does.
struct ReadEntry<'a> {
    key: RowKey,
    value: Option<Value>,
    lease: Lease,
    /// The local record (`None`: remote).
    rec: Option<&'a Rec>,
    used: bool,
    /// The lock this transaction holds on it (every read of a distributed transaction).
    lock: Option<Mode>,
}

impl ReadOf for ReadEntry<'_> {
    fn key(&self) -> RowKey {
        self.key
    }
}

pub struct PrimoTxn<'a> {
    wk: &'a PrimoWorker,
    pub id: TxnId,
    prio: Prio,
    first_start_us: u64,
    /// Turned distributed (WCF); local (TicToc) until then.
    distributed: bool,
    reads: ReadSet<ReadEntry<'a>>,
    writes: Writes,
    /// The declared local records, resolved once by `prefetch`.
    local_recs: FxHashMap<RowKey, &'a Rec>,
    /// Local records whose lock this attempt holds.
    held_here: Vec<(RowKey, &'a Rec)>,
    /// Remote partitions where it holds locks (they must hear the outcome).
    locked_at: Vec<NodeId>,
    /// Active in the node's watermark (its timestamp fixed).
    registered: bool,
    /// The era it runs in ([`super::group_commit`]): its agreement term or its epoch.
    era: u64,
}

/// How a Primo attempt starts, as the skeleton calls it.
impl Coordinator for Primo {
    type Txn<'a> = PrimoTxn<'a>;

    fn begin<'a>(wk: &'a PrimoWorker, id: TxnId, attempt: Attempt) -> PrimoTxn<'a> {
        let distributed = wk.state.take_distributed(wk.w.addr.worker, attempt.first_start_us);
        PrimoTxn {
            wk,
            id,
            prio: Prio(attempt.first_start_us, id),
            first_start_us: attempt.first_start_us,
            distributed,
            reads: ReadSet::default(),
            writes: Vec::new(),
            local_recs: FxHashMap::default(),
            held_here: Vec::new(),
            locked_at: Vec::new(),
            registered: false,
            era: wk.era(),
        }
    }
}

impl<'a> PrimoTxn<'a> {
    fn local_rec(&self, key: RowKey) -> &'a Rec {
        match self.local_recs.get(&key) {
            Some(r) => r,
            None => self.wk.node.store.get_or_create(key),
        }
    }

    /// Lock a local record in `mode` (WAIT_DIE, waiting) and read it.
    async fn lock_here(&mut self, key: RowKey, rec: &'a Rec, mode: Mode) -> TxnResult<(Option<Value>, Lease)> {
        self.wk.w.charge_ops(1);
        self.wk.lock_distributed(rec, self.id, self.prio, mode).await?;
        if !self.held_here.iter().any(|(k, _)| *k == key) {
            self.held_here.push((key, rec));
        }
        // No raise at the coordinator: its timestamp is fixed past the floor instead (R2).
        Ok(meta::locked_read(rec, self.id, 0))
    }

    /// Lock `keys` in `mode` at partition `n` and read them.
    async fn lock_there(&mut self, n: NodeId, keys: Vec<RowKey>, mode: Mode) -> TxnResult<Vec<(Option<Value>, Lease)>> {
        let wk = self.wk;
        wk.coord.touch(self.id, &mut self.locked_at, n);
        let len = keys.len();
        match wk.ask(n, &Request::Lock { txn: self.id, era: self.era, prio: self.prio, mode, keys }).await? {
            Reply::Locked(vals) if vals.len() == len => Ok(vals),
            Reply::Aborted(a) => Err(a),
            _ => Err(Abort::BadReply),
        }
    }

    /// The first remote access: lock every record read here so far and check that none changed
    /// since it was read; a changed one aborts the attempt, and its retry starts distributed.
    async fn turn_distributed(&mut self) -> TxnResult<()> {
        self.distributed = true;
        for i in 0..self.reads.len() {
            let (key, rec, seen) = match &self.reads[i] {
                ReadEntry { rec: Some(rec), lock: None, key, lease, .. } => (*key, *rec, lease.wts),
                _ => continue,
            };
            let mode = self.wk.cc.read_mode();
            let (_, lease) = self.lock_here(key, rec, mode).await?;
            if lease.wts != seen {
                self.wk.state.start_distributed(self.wk.w.addr.worker, self.first_start_us);
                return Err(Abort::Protocol(SWITCH_CHANGED));
            }
            let e = &mut self.reads[i];
            (e.lease, e.lock) = (lease, Some(mode));
        }
        Ok(())
    }

    /// Note a read (or a row scanned) unless the attempt read the key before; a prefetched read
    /// not used yet takes the version now seen.
    fn note_read(&mut self, e: ReadEntry<'a>) {
        match self.reads.find(e.key) {
            Some(i) if !self.reads[i].used => self.reads[i] = ReadEntry { used: true, ..e },
            Some(_) => {}
            None => self.reads.push(e),
        }
    }

    /// Note a read of a key the attempt had not read, as the procedure uses it; its value.
    fn read_done(
        &mut self,
        key: RowKey,
        value: Option<Value>,
        lease: Lease,
        rec: Option<&'a Rec>,
        lock: Option<Mode>,
    ) -> Option<Value> {
        self.reads.push(ReadEntry { key, value: value.clone(), lease, rec, used: true, lock });
        value
    }

    /// Release whatever this attempt holds, here and remotely.
    fn abort(&mut self, reason: Abort) -> Abort {
        for (_, rec) in std::mem::take(&mut self.held_here) {
            meta::release(rec, self.id);
        }
        if std::mem::take(&mut self.registered) {
            self.wk.leave(self.id, None);
        }
        self.wk.abort_remote(self.id, &mut self.locked_at);
        reason
    }

    /// Every write of this distributed attempt not yet held exclusively takes the exclusive
    /// lock now, remote ones one `Lock` per partition: under WCF only blind writes (a dummy read:
    /// the lock only); under `wcf=off` every write, upgrading its shared lock (2PC's prepare,
    /// whose vote is the answer).
    async fn lock_writes(&mut self) -> TxnResult<()> {
        let me = self.wk.node.id;
        let mut remote: FxHashMap<NodeId, Vec<RowKey>> = FxHashMap::default();
        let unlocked: Vec<RowKey> = self
            .writes
            .iter()
            .map(|w| w.0)
            .filter(|k| self.reads.find(*k).is_none_or(|i| self.reads[i].lock != Some(Mode::Exclusive)))
            .collect();
        for key in unlocked {
            match self.wk.node.node_of(key) {
                n if n == me => {
                    let (value, lease) = self.lock_here(key, self.local_rec(key), Mode::Exclusive).await?;
                    let rec = Some(self.local_rec(key));
                    self.add_dummy(ReadEntry { key, value, lease, rec, used: false, lock: Some(Mode::Exclusive) });
                }
                n => remote.entry(n).or_default().push(key),
            }
        }
        let asked: Vec<_> = remote.into_iter().collect();
        if self.wk.cc.wcf && !asked.is_empty() {
            self.wk.w.count(DUMMY_READ_ROUNDS, 1);
        }
        for (n, _) in &asked {
            self.wk.coord.touch(self.id, &mut self.locked_at, *n);
        }
        let (txn, era, prio, mode) = (self.id, self.era, self.prio, Mode::Exclusive);
        let calls = asked.iter().map(|(n, keys)| (*n, Request::Lock { txn, era, prio, mode, keys: keys.clone() }));
        let replies = self.wk.ask_all(calls).await;
        for ((_, keys), reply) in asked.into_iter().zip(replies) {
            let vals = match reply? {
                Reply::Locked(vals) if vals.len() == keys.len() => vals,
                Reply::Aborted(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            };
            for (key, (value, lease)) in keys.into_iter().zip(vals) {
                self.add_dummy(ReadEntry { key, value, lease, rec: None, used: false, lock: Some(Mode::Exclusive) });
            }
        }
        Ok(())
    }

    fn add_dummy(&mut self, e: ReadEntry<'a>) {
        match self.reads.find(e.key) {
            Some(i) => self.reads[i] = ReadEntry { used: self.reads[i].used, ..e },
            None => self.reads.push(e),
        }
    }

    /// The lease a written key was locked with.
    fn locked_lease(&self, key: RowKey) -> Lease {
        let i = self.reads.find(key).expect("every write of a distributed transaction is locked");
        debug_assert_eq!(self.reads[i].lock, Some(Mode::Exclusive), "a write whose lock is not held");
        self.reads[i].lease
    }

    /// Algorithm 1's commit phase: no validation (every lock is held), the timestamp from the
    /// leases, extend and install here, one `Install` per partition.
    async fn commit_distributed(&mut self) -> TxnResult<AckAfter> {
        if let Err(a) = self.lock_writes().await {
            return Err(self.abort(a));
        }
        let wk = self.wk;
        let mut candidate = CommitTs::default();
        self.reads.iter().filter(|e| e.used).for_each(|e| candidate.read(e.lease));
        self.writes.iter().for_each(|w| candidate.write(self.locked_lease(w.0)));
        let ts = match wk.fix_ts(self.id, self.era, candidate.0) {
            Ok(ts) => ts,
            Err(a) => return Err(self.abort(a)),
        };
        self.registered = true;
        let me = wk.node.id;
        let mut local_writes = Writes::new();
        let mut remote: FxHashMap<NodeId, Writes> = self.locked_at.iter().map(|n| (*n, Writes::new())).collect();
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => local_writes.push((k, v)),
                n => remote.get_mut(&n).expect("a partition written is locked").push((k, v)),
            }
        }
        wk.w.charge_ops(self.held_here.len());
        self.install_here(ts, local_writes)?;
        self.reads.clear();
        self.locked_at.clear();
        let id = self.id;
        let installs = remote.into_iter().collect();
        match wk.installs_wait() {
            true => send_installs(wk, id, self.era, ts, installs).await,
            false => tell_installs(wk, id, self.era, ts, installs),
        }
        Ok(wk.ack_after(Stamp { era: self.era, ts }, None))
    }

    /// A local transaction's commit (TicToc): lock the writes (NO_WAIT), fix the timestamp,
    /// validate the reads at it, install.
    fn commit_local(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let writes = std::mem::take(&mut self.writes);
        let mut candidate = CommitTs::default();
        for (key, _) in &writes {
            let rec = self.local_rec(*key);
            let got = meta::acquire(rec, self.id, self.prio, Mode::Exclusive, Policy::NoWait, false);
            if !matches!(got, Acquire::Granted) {
                if meta::held_by_distributed(rec) {
                    wk.w.count(WCF_LOCAL_ABORTS, 1);
                }
                return Err(self.abort(Abort::Protocol(LOCAL_WRITE_LOCKED)));
            }
            self.held_here.push((*key, rec));
            candidate.write(meta::held_lease(rec, self.id));
        }
        wk.w.charge_ops(writes.len());
        self.reads.iter().filter(|e| e.used).for_each(|e| candidate.read(e.lease));
        let ts = match writes.is_empty() {
            true => candidate.0,
            false => match wk.fix_ts(self.id, self.era, candidate.0) {
                Ok(ts) => {
                    self.registered = true;
                    ts
                }
                Err(a) => return Err(self.abort(a)),
            },
        };
        if let Err(a) = self.validate_local(ts) {
            return Err(self.abort(a));
        }
        self.reads.clear();
        if !writes.is_empty() {
            self.install_here(ts, writes)?;
        }
        Ok(wk.ack_after(Stamp { era: self.era, ts }, None))
    }

    /// Log and install at `ts` the writes here, on the local records this attempt holds (and
    /// extend and release the rest); the attempt aborts if that is refused.
    fn install_here(&mut self, ts: u64, writes: Writes) -> TxnResult<()> {
        let (wk, id, held) = (self.wk, self.id, &self.held_here);
        let append = |w: &Writes| wk.log_install(id, w, ts);
        let install = |w: Writes| install_held(id, ts, held, w);
        if let Err(a) = wk.install_logged(id, self.era, ts, writes, append, install) {
            return Err(self.abort(a));
        }
        self.held_here.clear();
        self.registered = false;
        Ok(())
    }

    /// TicToc's validation of every read at `ts`; an extension a distributed transaction's lock
    /// refuses is counted as an abort WCF caused.
    fn validate_local(&self, ts: u64) -> TxnResult<()> {
        let wk = self.wk;
        let mut n = 0;
        for e in self.reads.iter().filter(|e| e.used) {
            let rec = e.rec.expect("a local transaction reads only here");
            let own = self.held_here.iter().find(|(k, _)| *k == e.key);
            let checked = match own {
                Some((_, rec)) => {
                    validate_own_write(meta::held_lease(rec, self.id), e.lease.wts, ts).map_err(|f| (f, false))
                }
                None if needs_renewal(e.lease, ts) => {
                    n += 1;
                    meta::validate(rec, self.id, e.lease.wts, ts)
                }
                None => Ok(()),
            };
            if let Err((why, wcf)) = checked {
                if wcf {
                    wk.w.count(WCF_LOCAL_ABORTS, 1);
                }
                wk.w.charge_ops(n);
                return Err(Abort::Protocol(match why {
                    RenewFailure::Locked => LOCAL_READ_LOCKED,
                    RenewFailure::NewerAfter | RenewFailure::NewerBefore => LOCAL_VERSION_CHANGED,
                }));
            }
        }
        wk.w.charge_ops(n);
        Ok(())
    }
}

/// Install `writes` at `ts` on the local records `txn` holds (extending and releasing those it
/// only read); the values replaced.
fn install_held(txn: TxnId, ts: u64, held: &[(RowKey, &Rec)], mut writes: Writes) -> Replaced {
    let mut replaced = Replaced::with_capacity(writes.len());
    for (key, rec) in held {
        let write = writes.iter().position(|w| w.0 == *key).map(|i| writes.swap_remove(i).1);
        if let Some(old) = meta::commit(rec, txn, ts, write) {
            replaced.push((*key, old));
        }
    }
    assert!(writes.is_empty(), "txn {txn:x} writes here without the lock: {writes:?}");
    replaced
}

/// Send each partition its `Install` in the background, again until it answers (the paper's
/// message is one-way over reliable channels; dtx's links may lose it). The coordinator's table
/// says committed until then, so that a partition asking about the transaction waits for it.
fn tell_installs(wk: &PrimoWorker, txn: TxnId, era: u64, ts: u64, parts: Vec<(NodeId, Writes)>) {
    if parts.is_empty() {
        return;
    }
    let Some(me) = wk.me.upgrade() else { return };
    wk.w.clone().spawn(async move {
        send_installs(&me, txn, era, ts, parts).await;
    });
}

/// Send each partition its `Install` and wait until every one answered (or, under `epoch`, the
/// epoch failed: each participant then releases the transaction itself, when the `Install`
/// reaches it or it asks the coordinator).
async fn send_installs(wk: &PrimoWorker, txn: TxnId, era: u64, ts: u64, parts: Vec<(NodeId, Writes)>) {
    if parts.is_empty() {
        return;
    }
    wk.coord.set(txn, TxnStatus::Committed);
    let mut left: Vec<(NodeId, Request)> =
        parts.into_iter().map(|(n, writes)| (n, Request::Install { txn, era, ts, writes })).collect();
    while !left.is_empty() && !wk.era_rolled_back(era) {
        let calls: Vec<_> = left.iter().map(|(n, req)| wk.ask_any_epoch(*n, req)).collect();
        let replies = join_all(calls).await;
        left =
            left.into_iter().zip(replies).filter(|(_, r)| !matches!(r, Ok(Reply::Installed))).map(|(p, _)| p).collect();
    }
    wk.coord.forget(txn);
}

impl<'a> BufferedTxn for PrimoTxn<'a> {
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        let i = self.reads.find(key)?;
        let e = &mut self.reads[i];
        e.used = true;
        Some(e.value.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.wk.node.remote_node(key) {
            None if !self.distributed => {
                let rec = self.local_rec(key);
                self.wk.w.charge_ops(1);
                let (value, lease) = meta::read(rec);
                Step::Ready(Ok(self.read_done(key, value, lease, Some(rec), None)))
            }
            None => Step::Wait(Box::pin(async move {
                let (rec, mode) = (self.local_rec(key), self.wk.cc.read_mode());
                let (value, lease) = self.lock_here(key, rec, mode).await?;
                Ok(self.read_done(key, value, lease, Some(rec), Some(mode)))
            })),
            Some(n) => Step::Wait(Box::pin(async move {
                if !self.distributed {
                    self.turn_distributed().await?;
                }
                let mode = self.wk.cc.read_mode();
                let (value, lease) = self.lock_there(n, vec![key], mode).await?.pop().expect("one asked, one answered");
                Ok(self.read_done(key, value, lease, None, Some(mode)))
            })),
        }
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// A local transaction reads the rows with their leases; a distributed one locks each.
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        let wk = self.wk;
        let n = wk.node.node_of(RowKey::new(s.table, s.lo));
        let mode = wk.cc.read_mode();
        let rows: Vec<(u64, Value, Lease, Option<Mode>)> = if n == wk.node.id && !self.distributed {
            wk.w.charge_ops(1);
            meta::scan(&wk.node.store, s).into_iter().map(|(k, v, l)| (k, v, l, None)).collect()
        } else if n == wk.node.id {
            let mut rows = Vec::new();
            for k in meta::range_keys(&wk.node.store, s) {
                let key = RowKey::new(s.table, k);
                if let (Some(v), lease) = self.lock_here(key, self.local_rec(key), mode).await? {
                    rows.push((k, v, lease, Some(mode)));
                }
            }
            rows
        } else {
            if !self.distributed {
                self.turn_distributed().await?;
            }
            wk.coord.touch(self.id, &mut self.locked_at, n);
            let scan = Request::Scan { txn: self.id, era: self.era, prio: self.prio, mode, scan: s };
            match wk.ask(n, &scan).await? {
                Reply::Rows(rows) => rows.into_iter().map(|(k, v, l)| (k, v, l, Some(mode))).collect(),
                Reply::Aborted(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        for (k, v, lease, lock) in rows {
            let key = RowKey::new(s.table, k);
            let rec = (n == wk.node.id).then(|| self.local_rec(key));
            self.note_read(ReadEntry { key, value: Some(v.clone()), lease, rec, used: true, lock });
            out.push((k, v));
        }
        Ok(out)
    }
}

impl<'a> CoordTxn for PrimoTxn<'a> {
    /// One-shot: a transaction whose declared keys all live here stays local (its records are
    /// resolved now, read as the procedure asks); one that declares another partition's key is
    /// distributed from the start and locks every declared key now, remote ones first (one
    /// `Lock` per partition, in parallel) so that local records are not held across that trip.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let wk = self.wk;
        let declared = keys.reads.len() + keys.writes.len();
        self.reads.reserve(declared);
        self.writes.reserve(keys.writes.len());
        let mut by_node: FxHashMap<NodeId, Vec<RowKey>> = FxHashMap::default();
        self.local_recs.reserve(declared);
        for &k in keys.reads.iter().chain(&keys.writes) {
            match wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().push(k),
                None => {
                    let r = wk.node.store.get_or_create(k);
                    r.prefetch();
                    self.local_recs.insert(k, r);
                }
            }
        }
        for r in self.local_recs.values() {
            r.prefetch_value();
        }
        if by_node.is_empty() && !self.distributed {
            return Ok(());
        }
        self.distributed = true;
        if !wk.cc.dummies_first_round {
            // A partition written only blindly has no read for its dummy reads to ride with
            // (§4.2): they are taken at commit, `lock_writes`' round trip.
            by_node.retain(|_, ks| !ks.iter().all(|k| keys.is_blind(*k)));
        }
        // Locked here in key order, once each (a key may be declared both read and written).
        let mut here: Vec<RowKey> = self.local_recs.keys().copied().collect();
        here.sort_unstable();
        let asked: Vec<(NodeId, Vec<RowKey>)> = by_node
            .into_iter()
            .map(|(n, mut ks)| {
                ks.sort_unstable();
                ks.dedup();
                (n, ks)
            })
            .collect();
        for (n, _) in &asked {
            wk.coord.touch(self.id, &mut self.locked_at, *n);
        }
        let (txn, era, prio, mode) = (self.id, self.era, self.prio, wk.cc.read_mode());
        let calls = asked.iter().map(|(n, ks)| (*n, Request::Lock { txn, era, prio, mode, keys: ks.clone() }));
        let replies = wk.ask_all(calls).await;
        for ((_, ks), reply) in asked.iter().zip(replies) {
            let vals = match reply? {
                Reply::Locked(vals) if vals.len() == ks.len() => vals,
                Reply::Aborted(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            };
            for (k, (value, lease)) in ks.iter().zip(vals) {
                self.reads.push(ReadEntry { key: *k, value, lease, rec: None, used: false, lock: Some(mode) });
            }
        }
        for key in here {
            let rec = self.local_rec(key);
            let (value, lease) = self.lock_here(key, rec, mode).await?;
            self.reads.push(ReadEntry { key, value, lease, rec: Some(rec), used: false, lock: Some(mode) });
        }
        Ok(())
    }

    async fn commit(&mut self) -> TxnResult<AckAfter> {
        match self.distributed {
            true => self.commit_distributed().await,
            false => self.commit_local(),
        }
    }

    /// A distributed attempt holds locks from its first read: release them everywhere.
    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
