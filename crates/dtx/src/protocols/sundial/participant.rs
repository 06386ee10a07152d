//! What a node does for Sundial transactions coordinated elsewhere: lock and read (`Fetch`),
//! extend leases and keep writes (`Prepare`), install at the commit timestamp or roll back.

use super::messages::{Fetched, Reply, Request, Vote};
use super::meta;
use super::{Sundial, SundialWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::lease::{self, RenewFailure};
use crate::protocols::twopc::record_lock::{self as locks, LockStep, Mode, Policy, Prio};
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{RowKey, TableId, Value};
use crate::txn::{Abort, Scan, TxnResult};

pub type Writes = Vec<(RowKey, Option<Value>)>;

/// A remote transaction's state here: the write locks it holds, and once prepared its writes
/// and commit timestamp.
#[derive(Default)]
pub struct PartTxn {
    pub held: Vec<RowKey>,
    pub writes: Option<(Writes, u64)>,
}

impl SundialWorker {
    /// Answer with leases once the bound they may reach is durable: a coordinator may rely on
    /// them without asking this node again (a cached copy), and a crash must not forget them.
    /// A transaction that only reads here (`fenced`) may commit within the leases without this
    /// node's vote, so the reply also waits for the read fence: a version installed by a commit
    /// whose record is not durable yet (early lock release) must not be relied on before it is,
    /// and a deposed incarnation of this node must not hand out leases on what it holds.
    fn reply_lease(&self, to: Addr, rpc_id: u64, body: Vec<u8>, fenced: bool) {
        let bound = self.state.bound_lsn();
        let lsn = if fenced { bound.max(self.node.log.read_fence()) } else { bound };
        self.reply_when_durable(to, rpc_id, lsn, body)
    }

    /// Each record's value and lease, or only its lease when the coordinator's cached version
    /// is the committed one.
    fn read_all(&self, reads: &[(RowKey, Option<u64>)]) -> Vec<Fetched> {
        self.w.charge_ops(reads.len());
        reads
            .iter()
            .map(|(k, known)| {
                let (value, lease) = self.state.read(self.node.store.get_or_create(*k), *k);
                match known {
                    Some(wts) if *wts == lease.wts => Fetched::Current(lease),
                    _ => Fetched::Data(value, lease),
                }
            })
            .collect()
    }

    fn serve_fetch(
        &self,
        from: Addr,
        rpc_id: u64,
        txn: TxnId,
        prio: Prio,
        reads: Vec<(RowKey, Option<u64>)>,
        keys: Vec<RowKey>,
    ) {
        let now = self.w.now_ns();
        self.parts.txns.borrow_mut().entry(txn).or_insert_with(|| (PartTxn::default(), now)).1 = now;
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let reply = match me.lock_all(txn, prio, &keys).await {
                Ok(locked) => {
                    let mut vals = me.read_all(&reads);
                    vals.extend(locked);
                    Reply::Fetched(vals)
                }
                Err(a) => Reply::Aborted(a),
            };
            // It holds locks here: it votes here, after a record that covers what it read.
            me.reply_lease(from, rpc_id, encode(&reply), false);
        });
    }

    /// Lock each key for `txn` (waiting as WAIT_DIE lets it), then read its value and lease.
    /// Under `commit=wm` the transaction is active here from its first lock, and each lease
    /// answered ends below the bound its timestamp must reach (R2).
    async fn lock_all(&self, txn: TxnId, prio: Prio, keys: &[RowKey]) -> TxnResult<Vec<Fetched>> {
        if !self.parts.contains(txn) {
            // Aborted before this ran: nothing to enter or lock.
            return Err(Abort::ParticipantLost);
        }
        let bound = self.wm_enter(txn)?;
        let mut out = Vec::with_capacity(keys.len());
        for &key in keys {
            self.w.charge_ops(1);
            let rec = self.node.store.get_or_create(key);
            match locks::try_lock_rec(rec, txn, prio, Mode::Exclusive, Policy::WaitDie)? {
                LockStep::Done(_) => {}
                LockStep::Wait(rec, slot) => {
                    locks::wait_lock(&self.w, rec, slot, self.cc.lock_wait_us).await?;
                }
            }
            // Aborted meanwhile (a decision overtook us): give the lock back.
            match self.parts.txns.borrow_mut().get_mut(&txn) {
                Some((p, _)) => p.held.push(key),
                None => {
                    locks::release_recs(txn, std::iter::once(rec));
                    self.wm_leave(txn);
                    return Err(Abort::ParticipantLost);
                }
            }
            let (value, mut lease) = self.state.locked_lease(rec, txn, key);
            lease.rts = lease.rts.max(bound.saturating_sub(1));
            out.push(Fetched::Data(value, lease));
        }
        Ok(out)
    }

    fn serve_prepare(
        &self,
        from: Addr,
        rpc_id: u64,
        txn: TxnId,
        commit_ts: u64,
        renew: &[(RowKey, u64)],
        writes: Writes,
    ) {
        // Leases extended to the commit timestamp, and writes installed at it, are granted here:
        // the bound goes to the log first (the vote waits for a later record of the same log).
        // A read-only table's lease may reach past it by up to the largest speculative `δ`.
        if let Err(a) = self.state.grant(&self.node.log, commit_ts + super::tables::MAX_DELTA) {
            Sundial::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::Aborted(a)));
        }
        let tables = match self.renew_all(txn, commit_ts, renew) {
            Ok(tables) => tables,
            Err((f, key)) => {
                Sundial::abort_here(self, txn);
                return self.w.reply(from, rpc_id, &encode(&Reply::Vote(Vote::Renewal(f, key), Vec::new())));
            }
        };
        let mut parts = self.parts.txns.borrow_mut();
        if writes.is_empty() {
            let held = parts.remove(&txn).map(|(p, _)| p.held).unwrap_or_default();
            drop(parts);
            self.release(txn, &held);
            // It may have read a local commit whose record is not durable yet (early release).
            let tail = self.node.log.read_fence();
            return self.reply_when_durable(from, rpc_id, tail, encode(&Reply::Vote(Vote::ReadOnly, tables)));
        }
        let Some((p, t)) = parts.get_mut(&txn) else {
            drop(parts);
            return self.w.reply(from, rpc_id, &encode(&Reply::Vote(Vote::Lost, Vec::new())));
        };
        if !writes.iter().all(|(k, _)| p.held.contains(k)) {
            // Locks taken for it here were lost (a crash forgot them; a later request made the
            // state anew): it cannot commit here.
            drop(parts);
            Sundial::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::Vote(Vote::Lost, Vec::new())));
        }
        *t = self.w.now_ns();
        // A yes vote is a promise that survives a crash: log the writes first.
        let lsn = self.append_prepared(txn, &writes, &commit_ts);
        p.writes = Some((writes, commit_ts));
        drop(parts);
        match lsn {
            Ok(lsn) => self.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Vote(Vote::Yes, tables))),
            Err(a) => {
                Sundial::abort_here(self, txn);
                self.w.reply(from, rpc_id, &encode(&Reply::Aborted(a)));
            }
        }
    }

    /// Extend every read's lease to `commit_ts` here (Alg. 2): the table leases extended on the
    /// way, for the coordinator's cache, or the first key whose lease could not be.
    fn renew_all(
        &self,
        txn: TxnId,
        commit_ts: u64,
        renew: &[(RowKey, u64)],
    ) -> Result<Vec<(TableId, u64)>, (RenewFailure, RowKey)> {
        self.w.charge_ops(renew.len());
        let mut tables: Vec<(TableId, u64)> = Vec::new();
        for &(key, wts) in renew {
            let rec = self.node.store.get_or_create(key);
            match self.state.renew(&self.w, rec, key, txn, wts, commit_ts) {
                Ok(Some(end)) => match tables.iter_mut().find(|t| t.0 == key.table) {
                    Some(t) => t.1 = t.1.max(end),
                    None => tables.push((key.table, end)),
                },
                Ok(None) => {}
                Err(f) => return Err((f, key)),
            }
        }
        Ok(tables)
    }

    fn release(&self, txn: TxnId, keys: &[RowKey]) {
        self.w.charge_ops(keys.len());
        let store = &self.node.store;
        locks::release_recs(txn, keys.iter().filter_map(|k| store.get(*k)));
    }
}

/// What a node does for Sundial transactions, as the 2PC skeleton calls it.
impl Participant for Sundial {
    type Part = PartTxn;

    /// Copies cached during a failed epoch may hold what it wrote: none is reused after.
    fn on_rolled_back(wk: &SundialWorker) {
        wk.state.cache.clear();
        wk.w.count("cache-cleared-by-rollback", 1);
    }

    fn serve(wk: &SundialWorker, from: Addr, rpc_id: u64, req: Request) {
        match req {
            Request::Fetch { txn, reads, fresh: true, .. }
                if reads.iter().any(|(k, _)| wk.node.store.get(*k).is_some_and(|r| meta::written_by_other(r, txn))) =>
            {
                wk.w.reply(from, rpc_id, &encode(&Reply::Aborted(Abort::Protocol(super::FRESH_READ_LOCKED))));
            }
            Request::Fetch { txn, prio, reads, locks, .. } if locks.is_empty() => {
                // Reads take nothing: no state for the transaction here.
                let _ = (txn, prio);
                let vals = wk.read_all(&reads);
                wk.reply_lease(from, rpc_id, encode(&Reply::Fetched(vals)), true);
            }
            Request::Fetch { txn, prio, reads, locks, .. } => wk.serve_fetch(from, rpc_id, txn, prio, reads, locks),
            Request::Scan { scan, fresh } => {
                wk.w.charge_ops(1);
                if fresh && wk.state.scan_written(&wk.node.store, scan) {
                    let reply = Reply::Aborted(Abort::Protocol(super::FRESH_READ_LOCKED));
                    return wk.w.reply(from, rpc_id, &encode(&reply));
                }
                let rows = wk.state.scan(&wk.node.store, scan);
                wk.reply_lease(from, rpc_id, encode(&Reply::Rows(rows)), true);
            }
            Request::Prepare { txn, commit_ts, renew, writes } => {
                wk.serve_prepare(from, rpc_id, txn, commit_ts, &renew, writes)
            }
        }
    }

    /// Install a prepared transaction's writes at its commit timestamp, log the outcome (before
    /// the locks go, so that log order is install order), release.
    ///
    /// The decision carries no timestamp: Sundial's commit timestamp went out with the prepare.
    fn commit_here(wk: &SundialWorker, txn: TxnId, _ts: u64) {
        let Some(p) = wk.parts.remove(txn) else { return };
        let (writes, commit_ts) = p.writes.unwrap_or_default();
        wk.w.charge_ops(writes.len());
        wk.log_install_here(txn, &writes, commit_ts);
        for (key, value) in writes {
            meta::install(wk.node.store.get_or_create(key), txn, value, commit_ts, wk.state.floor);
        }
        wk.release(txn, &p.held);
    }

    fn abort_here(wk: &SundialWorker, txn: TxnId) {
        wk.wm_leave(txn);
        if let Some(p) = wk.parts.remove(txn) {
            if p.writes.is_some() {
                wk.log_abort_here(txn);
                // A recovered in-doubt writer leaves its tuples ordinary again.
                lease::release_all_in_doubt(&wk.node.store, p.held.iter().copied());
            }
            wk.release(txn, &p.held);
        }
    }

    /// Lock again the tuples of transactions prepared here before a crash, each keeping a
    /// lease below its commit timestamp (`meta::hold_in_doubt`), and keep their writes for the
    /// decision the orphan sweeper will ask their coordinators for.
    fn adopt_in_doubt(wk: &SundialWorker, in_doubt: InDoubt<u64>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes, ts) in in_doubt {
            let held: Vec<RowKey> = writes.iter().map(|w| w.0).collect();
            for &k in &held {
                let rec = wk.node.store.get_or_create(k);
                let got = locks::try_lock_rec(rec, txn, Prio(0, txn), Mode::Exclusive, Policy::NoWait);
                assert!(matches!(got, Ok(LockStep::Done(_))), "a recovered node has no other lock holders");
                meta::hold_in_doubt(rec, ts);
                // Its writer holds the tuple: the table is read-only no more.
                wk.state.tables.writer_floor(k.table);
            }
            wk.parts.txns.borrow_mut().insert(txn, (PartTxn { held, writes: Some((writes, ts)) }, now));
        }
    }

    fn peek_scan(wk: &SundialWorker, scan: Scan) -> Vec<(u64, Value)> {
        lease::peek_scan(&wk.node.store, scan, wk.state.floor)
    }
}
