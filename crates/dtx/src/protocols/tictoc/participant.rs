//! What a node does for TicToc transactions coordinated elsewhere: read with leases (`Read`,
//! `Scan`), lock a write set without waiting (`Lock`), validate reads and keep writes
//! (`Prepare`), install at the commit timestamp or roll back.

use super::messages::{Reply, Request, Vote};
use super::meta::{self, Rec};
use super::{TicToc, TicTocWorker, FRESH_READ_LOCKED};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::lease::{self, Lease, RenewFailure};
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};

pub type Writes = Vec<(RowKey, Option<Value>)>;

/// A remote transaction's state here: the write locks it holds with the leases it locked them
/// with, and once prepared its writes and commit timestamp.
#[derive(Default)]
pub struct PartTxn {
    pub held: Vec<(RowKey, Lease)>,
    pub writes: Option<(Writes, u64)>,
}

impl TicTocWorker {
    /// Answer with leases once what they rest on is durable: the bound past them (a reader may
    /// commit within a lease without asking this node again, so a crash must not forget an
    /// extension) and the log's tail (a version installed by a commit whose record is not
    /// durable yet, early lock release, must not be relied on before it is).
    fn reply_with_leases(&self, to: Addr, rpc_id: u64, body: Vec<u8>) {
        let lsn = self.state.bound_lsn().max(self.node.log.read_fence());
        self.reply_when_durable(to, rpc_id, lsn, body)
    }

    /// Each record's committed value and lease; for a fresh read, refused if a writer holds one.
    pub fn read_keys(&self, keys: &[RowKey], fresh: bool) -> Result<Vec<(Option<Value>, Lease)>, Abort> {
        self.w.charge_ops(keys.len());
        let floor = self.state.floor;
        let recs: Vec<&Rec> = keys.iter().map(|k| self.node.store.get_or_create(*k)).collect();
        if fresh && recs.iter().any(|r| meta::written_by_other(r, 0)) {
            return Err(Abort::Protocol(FRESH_READ_LOCKED));
        }
        Ok(recs.into_iter().map(|r| meta::read(r, floor)).collect())
    }

    /// Lock a remote transaction's write set here, all or none, and answer the leases. Under
    /// `commit=wm` the transaction is active here from now on, and each lease answered ends
    /// below the bound its timestamp must reach (R2), so that the coordinator's lands past it.
    fn serve_lock(&self, from: Addr, rpc_id: u64, txn: TxnId, keys: Vec<RowKey>) {
        self.w.charge_ops(keys.len());
        let bound = match self.wm_enter(txn) {
            Ok(bound) => bound,
            Err(a) => return self.w.reply(from, rpc_id, &encode(&Reply::Aborted(a))),
        };
        let recs: Vec<&Rec> = keys.iter().map(|k| self.node.store.get_or_create(*k)).collect();
        let Some(mut leases) = meta::lock_all(&recs, txn, self.state.floor) else {
            if !self.parts.contains(txn) {
                self.wm_leave(txn);
            }
            return self.w.reply(from, rpc_id, &encode(&Reply::Locked(None)));
        };
        for lease in &mut leases {
            lease.rts = lease.rts.max(bound.saturating_sub(1));
        }
        let now = self.w.now_ns();
        // Remembered with its locks, so that the orphan sweeper asks about it if the decision
        // never comes (a lost `Prepare` or `Abort`).
        self.parts.remember(txn, now, |p| p.held.extend(keys.iter().copied().zip(leases.iter().copied())));
        self.w.reply(from, rpc_id, &encode(&Reply::Locked(Some(leases))));
    }

    /// Validate the reads at `commit_ts`, then keep the writes (a yes vote, logged) or, with
    /// none here, leave.
    fn serve_prepare(
        &self,
        from: Addr,
        rpc_id: u64,
        txn: TxnId,
        commit_ts: u64,
        reads: &[(RowKey, u64)],
        writes: Writes,
    ) {
        // Leases extended to the commit timestamp, and writes installed at it, are granted here:
        // the bound goes to the log first (the vote waits for a later record of the same log).
        if let Err(a) = self.state.grant(&self.node.log, commit_ts) {
            TicToc::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::Aborted(a)));
        }
        let held = self.parts.txns.borrow().get(&txn).map(|(p, _)| p.held.clone()).unwrap_or_default();
        if let Err(f) = self.validate_all(txn, commit_ts, reads, &held) {
            TicToc::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::Vote(Vote::Invalid(f))));
        }
        if writes.is_empty() {
            // Nothing locked here (locks are taken only where it writes). It may have read a
            // local commit whose record is not durable yet (early release).
            debug_assert!(held.is_empty(), "locked without writing");
            let tail = self.state.bound_lsn().max(self.node.log.read_fence());
            return self.reply_when_durable(from, rpc_id, tail, encode(&Reply::Vote(Vote::ReadOnly)));
        }
        if !writes.iter().all(|(k, _)| held.iter().any(|h| h.0 == *k)) {
            // Its locks here were lost (a crash forgot them; a decision overtook the `Lock`).
            TicToc::abort_here(self, txn);
            return self.w.reply(from, rpc_id, &encode(&Reply::Vote(Vote::Lost)));
        }
        // A yes vote is a promise that survives a crash: log the writes first.
        match self.append_prepared(txn, &writes, &commit_ts) {
            Ok(lsn) => {
                let now = self.w.now_ns();
                self.parts.remember(txn, now, |p| p.writes = Some((writes, commit_ts)));
                self.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Vote(Vote::Yes)));
            }
            Err(a) => {
                TicToc::abort_here(self, txn);
                self.w.reply(from, rpc_id, &encode(&Reply::Aborted(a)));
            }
        }
    }

    /// TicToc's validation of the reads made here: a record this transaction locked to write
    /// must still be the version read; any other is extended to `commit_ts` if need be.
    fn validate_all(
        &self,
        txn: TxnId,
        commit_ts: u64,
        reads: &[(RowKey, u64)],
        held: &[(RowKey, Lease)],
    ) -> Result<(), RenewFailure> {
        self.w.charge_ops(reads.len());
        for &(key, wts) in reads {
            match held.iter().find(|h| h.0 == key) {
                Some(&(_, locked)) => lease::validate_own_write(locked, wts, commit_ts)?,
                None => meta::validate(self.node.store.get_or_create(key), txn, wts, commit_ts, self.state.floor)?,
            }
        }
        Ok(())
    }

    fn release(&self, txn: TxnId, held: &[(RowKey, Lease)]) {
        self.w.charge_ops(held.len());
        let recs: Vec<&Rec> = held.iter().filter_map(|(k, _)| self.node.store.get(*k)).collect();
        meta::unlock_all(&recs, txn);
    }
}

/// What a node does for TicToc transactions, as the 2PC skeleton calls it.
impl Participant for TicToc {
    type Part = PartTxn;

    fn serve(wk: &TicTocWorker, from: Addr, rpc_id: u64, req: Request) {
        match req {
            Request::Read { keys, fresh } => match wk.read_keys(&keys, fresh) {
                Ok(vals) => wk.reply_with_leases(from, rpc_id, encode(&Reply::Values(vals))),
                Err(a) => wk.w.reply(from, rpc_id, &encode(&Reply::Aborted(a))),
            },
            Request::Scan { scan, fresh } => {
                wk.w.charge_ops(1);
                if fresh && meta::scan_written(&wk.node.store, scan) {
                    let reply = Reply::Aborted(Abort::Protocol(FRESH_READ_LOCKED));
                    return wk.w.reply(from, rpc_id, &encode(&reply));
                }
                let rows = meta::scan(&wk.node.store, scan, wk.state.floor);
                wk.w.charge_ops(rows.len());
                wk.reply_with_leases(from, rpc_id, encode(&Reply::Rows(rows)));
            }
            Request::Lock { txn, keys } => wk.serve_lock(from, rpc_id, txn, keys),
            Request::Prepare { txn, commit_ts, reads, writes } => {
                wk.serve_prepare(from, rpc_id, txn, commit_ts, &reads, writes)
            }
        }
    }

    /// Install a prepared transaction's writes at its commit timestamp, log the outcome (before
    /// the locks go, so that log order is install order), release.
    ///
    /// The decision carries no timestamp: the commit timestamp went out with the prepare.
    fn commit_here(wk: &TicTocWorker, txn: TxnId, _ts: u64) {
        let Some(p) = wk.parts.remove(txn) else { return };
        let Some((writes, commit_ts)) = p.writes else {
            // Committed without its vote here: impossible, a commit needs every writer's yes.
            return wk.release(txn, &p.held);
        };
        wk.w.charge_ops(writes.len());
        wk.log_install_here(txn, &writes, commit_ts);
        for (key, value) in writes {
            meta::install(wk.node.store.get_or_create(key), txn, value, commit_ts, wk.state.floor);
        }
        // Keys locked and not written (none today) are released; written ones were by install.
        wk.release(txn, &p.held);
    }

    fn abort_here(wk: &TicTocWorker, txn: TxnId) {
        wk.wm_leave(txn);
        let Some(p) = wk.parts.remove(txn) else { return };
        if p.writes.is_some() {
            wk.log_abort_here(txn);
            // A recovered in-doubt writer leaves its records ordinary again.
            lease::release_all_in_doubt(&wk.node.store, p.held.iter().map(|(k, _)| *k));
        }
        wk.release(txn, &p.held);
    }

    /// Lock again the records of transactions prepared here before a crash, each keeping a lease
    /// below its commit timestamp ([`meta::hold_in_doubt`]), and keep their writes for the
    /// decision the orphan sweeper will ask their coordinators for.
    fn adopt_in_doubt(wk: &TicTocWorker, in_doubt: InDoubt<u64>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes, ts) in in_doubt {
            let mut held = Vec::with_capacity(writes.len());
            for (k, _) in &writes {
                let rec = wk.node.store.get_or_create(*k);
                meta::hold_in_doubt(rec, txn, ts);
                held.push((*k, Lease::new(ts - 1, ts - 1)));
            }
            wk.parts.txns.borrow_mut().insert(txn, (PartTxn { held, writes: Some((writes, ts)) }, now));
        }
    }

    fn peek_scan(wk: &TicTocWorker, scan: Scan) -> Vec<(u64, Value)> {
        lease::peek_scan(&wk.node.store, scan, wk.state.floor)
    }
}
