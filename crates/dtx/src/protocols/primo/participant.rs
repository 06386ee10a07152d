//! What a partition does for Primo's distributed transactions coordinated elsewhere (digest 004,
//! 3.5; the paper omits this side's pseudo-code): lock what they read, each record raised past
//! the partition's floor (R2), the transaction held active in the watermark from its first lock
//! here until its install is logged; install on the one commit message; release on an abort.

use super::messages::{Reply, Request};
use super::meta::{self, Rec};
use super::{Primo, PrimoWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::{InDoubt, Writes};
use crate::protocols::twopc::lease::Lease;
use crate::protocols::twopc::record_lock::{wait_lock, Acquire, Mode, Policy, Prio};
use crate::protocols::twopc::wm_commit::WatermarkGate;
use crate::protocols::twopc::{Participant, TxnId};
use crate::rt::log_warn;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan, TxnResult};

/// What a lock request is for: the transaction, its agreement term, its age and the mode.
type LockOf = (TxnId, u64, Prio, Mode);

/// Each record's value and lease, as locked.
type LockedReads = TxnResult<Vec<(Option<Value>, Lease)>>;

/// A remote transaction's state here: the records it holds, and the agreement term it runs in.
#[derive(Default)]
pub struct PartTxn {
    pub held: Vec<RowKey>,
    pub term: u64,
}

impl PrimoWorker {
    /// The node's watermark gate: Primo always commits by watermark.
    pub fn gate(&self) -> &WatermarkGate {
        self.wm.as_deref().expect("Primo runs with watermark group commit")
    }

    /// Take `rec`'s lock in `mode` for the distributed transaction `txn` (waiting, WAIT_DIE).
    pub async fn lock_distributed(&self, rec: &Rec, txn: TxnId, prio: Prio, mode: Mode) -> TxnResult<()> {
        match meta::acquire(rec, txn, prio, mode, Policy::WaitDie, true) {
            Acquire::Granted => Ok(()),
            Acquire::Abort(a) => Err(a),
            Acquire::Wait(slot) => wait_lock(&self.w, rec, slot, self.cc.lock_wait_us).await.map(|_| ()),
        }
    }

    /// Lock `keys` in `mode` for a remote `txn` of agreement term `term`, each read after its
    /// raise past the floor; the transaction is active here from the first.
    async fn lock_keys(&self, txn: TxnId, term: u64, prio: Prio, mode: Mode, keys: &[RowKey]) -> LockedReads {
        self.gate().enter(txn, term, 0)?;
        let mut out = Vec::with_capacity(keys.len());
        for &key in keys {
            self.w.charge_ops(1);
            let rec = self.node.store.get_or_create(key);
            self.lock_distributed(rec, txn, prio, mode).await?;
            if !self.note_held(txn, key, rec) {
                return Err(Abort::ParticipantLost);
            }
            let floor_ts = self.gate().enter(txn, term, 0)?;
            out.push(meta::locked_read(rec, txn, floor_ts));
        }
        Ok(out)
    }

    /// Record a lock taken for `txn`; if it was aborted here meanwhile, give the lock back.
    fn note_held(&self, txn: TxnId, key: RowKey, rec: &Rec) -> bool {
        match self.parts.txns.borrow_mut().get_mut(&txn) {
            Some((p, _)) => {
                if !p.held.contains(&key) {
                    p.held.push(key);
                }
                true
            }
            None => {
                meta::release(rec, txn);
                false
            }
        }
    }

    fn serve_lock(&self, from: Addr, rpc_id: u64, (txn, term, prio, mode): LockOf, keys: Vec<RowKey>) {
        self.parts.remember(txn, self.w.now_ns(), |p| p.term = term);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let reply = match me.lock_keys(txn, term, prio, mode, &keys).await {
                Ok(values) => Reply::Locked(values),
                Err(a) => Reply::Aborted(a),
            };
            me.w.reply(from, rpc_id, &encode(&reply));
        });
    }

    fn serve_scan(&self, from: Addr, rpc_id: u64, (txn, term, prio, mode): LockOf, scan: Scan) {
        self.parts.remember(txn, self.w.now_ns(), |p| p.term = term);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let keys: Vec<RowKey> =
                meta::range_keys(&me.node.store, scan).into_iter().map(|k| RowKey::new(scan.table, k)).collect();
            let reply = match me.lock_keys(txn, term, prio, mode, &keys).await {
                Ok(values) => Reply::Rows(
                    keys.iter().zip(values).filter_map(|(k, (v, lease))| v.map(|v| (k.key, v, lease))).collect(),
                ),
                Err(a) => Reply::Aborted(a),
            };
            me.w.reply(from, rpc_id, &encode(&reply));
        });
    }

    /// The commit of `txn` at `ts` (Algorithm 1's participant side): extend every lease it holds
    /// here to `ts`, install its writes at `ts`, append them to the log before the locks go (log
    /// order is install order), release, and leave the watermark's active set.
    fn install(&self, txn: TxnId, term: u64, ts: u64, writes: Writes) {
        // Absent: installed already (the commit was resent).
        if !self.parts.contains(txn) {
            return;
        }
        if self.gate().begin_install(txn, term).is_err() {
            // An agreement since rolled it back everywhere: nothing of it may install here.
            return Primo::abort_here(self, txn);
        }
        let p = self.parts.remove(txn).expect("checked");
        self.w.charge_ops(p.held.len());
        if !writes.is_empty() {
            if let Err(a) = self.node.log.append_commit(txn, &writes, &[], ts) {
                log_warn(&format!("node {}: primo txn {txn:x}: its install was not logged: {a:?}", self.node.id));
            }
        }
        let store = &self.node.store;
        let mut writes = writes;
        for key in &p.held {
            let write = writes.iter().position(|w| w.0 == *key).map(|i| writes.swap_remove(i).1);
            if let Some(old) = meta::commit(store.get_or_create(*key), txn, ts, write) {
                self.gate().keep_undo(ts, *key, old);
            }
        }
        assert!(writes.is_empty(), "txn {txn:x} installs writes it did not lock here: {writes:?}");
        self.gate().leave(txn, Some(ts));
    }
}

/// What a partition does for Primo, as the skeleton calls it.
impl Participant for Primo {
    type Part = PartTxn;

    fn serve(wk: &PrimoWorker, from: Addr, rpc_id: u64, req: Request) {
        match req {
            Request::Lock { txn, term, prio, mode, keys } => wk.serve_lock(from, rpc_id, (txn, term, prio, mode), keys),
            Request::Scan { txn, term, prio, mode, scan } => wk.serve_scan(from, rpc_id, (txn, term, prio, mode), scan),
            Request::Install { txn, term, ts, writes } => {
                wk.install(txn, term, ts, writes);
                wk.w.reply(from, rpc_id, &encode(&Reply::Installed));
            }
        }
    }

    /// The coordinator's table says committed: its `Install` is on its way (it is resent until
    /// acknowledged), and only it carries the writes.
    fn commit_here(wk: &PrimoWorker, txn: TxnId, _ts: u64) {
        wk.parts.touch(txn, wk.w.now_ns());
    }

    fn abort_here(wk: &PrimoWorker, txn: TxnId) {
        if let Some(p) = wk.parts.remove(txn) {
            for key in p.held {
                if let Some(rec) = wk.node.store.get(key) {
                    meta::release(rec, txn);
                }
            }
            wk.gate().leave(txn, None);
        }
    }

    /// Transactions of older terms were rolled back by the agreement: release what they hold.
    fn on_new_term(wk: &PrimoWorker, term: u64) {
        let stale: Vec<TxnId> =
            wk.parts.txns.borrow().iter().filter(|(_, (p, _))| p.term < term).map(|(t, _)| *t).collect();
        wk.w.count("wm-stale-released", stale.len() as u64);
        for txn in stale {
            Self::abort_here(wk, txn);
        }
    }

    /// Primo logs no votes: nothing is in doubt after a restart.
    fn adopt_in_doubt(_wk: &PrimoWorker, in_doubt: InDoubt<()>) {
        debug_assert!(in_doubt.is_empty(), "Primo logs no prepared transactions");
    }
}
