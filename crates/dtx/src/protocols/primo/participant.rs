//! What a partition does for Primo's distributed transactions coordinated elsewhere (digest 004,
//! 3.5; the paper omits this side's pseudo-code): lock what they read, each record raised past
//! the partition's floor (R2), the transaction held active in the watermark from its first lock
//! here until its install is logged; install on the one commit message; release on an abort.

use super::group_commit::Replaced;
use super::messages::{Reply, Request};
use super::meta::{self, Rec};
use super::{Primo, PrimoWorker};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::{InDoubt, Writes};
use crate::protocols::twopc::lease::Lease;
use crate::protocols::twopc::record_lock::{wait_lock, Acquire, Mode, Policy, Prio};
use crate::protocols::twopc::{Participant, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan, TxnResult};
use std::cell::Cell;

/// What a lock request is for: the transaction, its era, its age and the mode.
type LockOf = (TxnId, u64, Prio, Mode);

/// Each record's value and lease, as locked.
type LockedReads = TxnResult<Vec<(Option<Value>, Lease)>>;

/// A remote transaction's state here: the records it holds, and the era it runs in (its
/// agreement term or its epoch).
#[derive(Default)]
pub struct PartTxn {
    pub held: Vec<RowKey>,
    pub era: u64,
}

impl PrimoWorker {
    /// Take `rec`'s lock in `mode` for the distributed transaction `txn` (waiting, WAIT_DIE).
    pub async fn lock_distributed(&self, rec: &Rec, txn: TxnId, prio: Prio, mode: Mode) -> TxnResult<()> {
        match meta::acquire(rec, txn, prio, mode, Policy::WaitDie, true) {
            Acquire::Granted => Ok(()),
            Acquire::Abort(a) => Err(a),
            Acquire::Wait(slot) => wait_lock(&self.w, rec, slot, self.cc.lock_wait_us).await.map(|_| ()),
        }
    }

    /// Lock `keys` in `mode` for a remote `txn` of `era`, each read after its
    /// raise past the floor; the transaction is active here from the first.
    ///
    /// It enters the watermark only while it is a transaction of this partition: the request's
    /// task runs after the frames that came with it, and an `Abort` among them (the coordinator
    /// timed out on this request while the connection was down, then both arrived at once) has
    /// already taken it out. Entered after that, nothing would ever take it out again, and this
    /// partition's W_p, and so every commit's acknowledgement, would stop for good.
    async fn lock_keys(&self, txn: TxnId, era: u64, prio: Prio, mode: Mode, keys: &[RowKey]) -> LockedReads {
        if !self.parts.contains(txn) {
            return Err(Abort::ParticipantLost);
        }
        let locked = self.lock_each(txn, era, prio, mode, keys).await;
        if locked.is_err() && !self.parts.contains(txn) {
            // Aborted here meanwhile: its abort left already; make sure (twice is harmless).
            self.leave(txn, None);
        }
        locked
    }

    async fn lock_each(&self, txn: TxnId, era: u64, prio: Prio, mode: Mode, keys: &[RowKey]) -> LockedReads {
        self.enter(txn, era)?;
        let mut out = Vec::with_capacity(keys.len());
        for &key in keys {
            self.w.charge_ops(1);
            let rec = self.node.store.get_or_create(key);
            self.lock_distributed(rec, txn, prio, mode).await?;
            if !self.note_held(txn, key, rec) {
                return Err(Abort::ParticipantLost);
            }
            let floor_ts = self.enter(txn, era)?;
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

    fn serve_lock(&self, from: Addr, rpc_id: u64, (txn, era, prio, mode): LockOf, keys: Vec<RowKey>) {
        self.parts.remember(txn, self.w.now_ns(), |p| p.era = era);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let reply = match me.lock_keys(txn, era, prio, mode, &keys).await {
                Ok(values) => Reply::Locked(values),
                Err(a) => Reply::Aborted(a),
            };
            me.w.reply(from, rpc_id, &encode(&reply));
        });
    }

    fn serve_scan(&self, from: Addr, rpc_id: u64, (txn, era, prio, mode): LockOf, scan: Scan) {
        self.parts.remember(txn, self.w.now_ns(), |p| p.era = era);
        let Some(me) = self.me.upgrade() else { return };
        self.w.spawn(async move {
            let keys: Vec<RowKey> =
                meta::range_keys(&me.node.store, scan).into_iter().map(|k| RowKey::new(scan.table, k)).collect();
            let reply = match me.lock_keys(txn, era, prio, mode, &keys).await {
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
    /// order is install order), release, and leave the watermark's active set. An `Install` of
    /// an era rolled back here releases instead.
    ///
    /// Writes the log refuses are not installed, and the transaction stays active: under `wm`
    /// the node stops ([`PrimoWorker::not_logged`]), so its watermark never passes a commit
    /// whose writes here are in no log; the agreement that follows its silence, or its restart,
    /// rolls the commit back everywhere. Returns whether to answer (a stopped node does not).
    fn install(&self, txn: TxnId, era: u64, ts: u64, writes: Writes) -> bool {
        if self.stopped() {
            // Fail-stop: not even a resent `Install` is answered (the one whose record the log
            // refused is no longer among the transactions here, and would read as installed).
            return false;
        }
        // Absent: installed already (the commit was resent).
        if !self.parts.contains(txn) {
            return true;
        }
        if self.begin_install(txn, era).is_err() {
            // An agreement since rolled it back everywhere (nothing of it may install here), or
            // the node stopped.
            Primo::abort_here(self, txn);
            return !self.stopped();
        }
        let p = self.parts.remove(txn).expect("checked");
        self.w.charge_ops(p.held.len());
        let unlogged = Cell::new(None);
        // A refusal is noted, and fails the install (nothing of it installs here).
        let append = |w: &Writes| self.log_install(txn, w, ts).inspect_err(|a| unlogged.set(Some(*a)));
        let install = |w: Writes| self.install_held(txn, ts, &p.held, w);
        if self.install_logged(txn, era, ts, writes, append, install).is_ok() {
            return true;
        }
        self.release_all(txn, &p.held);
        match unlogged.get() {
            Some(why) => self.not_logged(txn, why),
            None => {
                // Its epoch failed here (and was, or will be, undone): it releases.
                self.w.count("primo-installs-refused", 1);
                true
            }
        }
    }

    /// Install `writes` at `ts` on the records `txn` holds here; the values they replaced.
    fn install_held(&self, txn: TxnId, ts: u64, held: &[RowKey], mut writes: Writes) -> Replaced {
        let store = &self.node.store;
        let mut replaced = Replaced::with_capacity(writes.len());
        for key in held {
            let write = writes.iter().position(|w| w.0 == *key).map(|i| writes.swap_remove(i).1);
            if let Some(old) = meta::commit(store.get_or_create(*key), txn, ts, write) {
                replaced.push((*key, old));
            }
        }
        assert!(writes.is_empty(), "txn {txn:x} installs writes it did not lock here: {writes:?}");
        replaced
    }

    /// Give back every lock `txn` holds here.
    fn release_all(&self, txn: TxnId, held: &[RowKey]) {
        for key in held {
            if let Some(rec) = self.node.store.get(*key) {
                meta::release(rec, txn);
            }
        }
    }
}

/// What a partition does for Primo, as the skeleton calls it.
impl Participant for Primo {
    type Part = PartTxn;
    const DECISION_INSTALLS: bool = false;

    fn serve(wk: &PrimoWorker, from: Addr, rpc_id: u64, req: Request) {
        match req {
            Request::Lock { txn, era, prio, mode, keys } => wk.serve_lock(from, rpc_id, (txn, era, prio, mode), keys),
            Request::Scan { txn, era, prio, mode, scan } => wk.serve_scan(from, rpc_id, (txn, era, prio, mode), scan),
            Request::Install { txn, era, ts, writes } => {
                if wk.install(txn, era, ts, writes) {
                    wk.w.reply(from, rpc_id, &encode(&Reply::Installed));
                }
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
            wk.release_all(txn, &p.held);
            wk.leave(txn, None);
        }
    }

    /// Transactions of older terms were rolled back by the agreement: release what they hold.
    fn on_new_term(wk: &PrimoWorker, term: u64) {
        let stale: Vec<TxnId> =
            wk.parts.txns.borrow().iter().filter(|(_, (p, _))| p.era < term).map(|(t, _)| *t).collect();
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
