//! What a node does for MVCC transactions, whether the coordinator is local (called inline) or
//! remote (through [`Participant::serve`]): reads as of a timestamp, prewrites, installs. An
//! access that meets a pending write with a smaller timestamp waits for its outcome by looking
//! again every [`WAIT_POLL_US`]; every access is idempotent, so a retried one holds nothing twice.

use super::messages::{Reply, Request};
use super::meta::{Found, MvccMeta};
use super::{Mvcc, MvccNode, MvccWorker, LATE_WRITE, WAITS, WAIT_MAX_US, WAIT_POLL_US};
use crate::net::{encode, Addr};
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::{Participant, TxnId};
use crate::rt::Worker;
use crate::storage::{RowKey, Storage, Value};
use crate::txn::{Abort, Scan, TxnResult};
use std::rc::Rc;

pub type Writes = Vec<(RowKey, Option<Value>)>;
type Store = Storage<MvccMeta>;

/// A remote transaction's state at a participant: the records it holds prewrites on, and the
/// writes it installs if it commits.
#[derive(Debug, Default)]
pub struct PartTxn {
    pub held: Vec<RowKey>,
    pub writes: Writes,
}

/// Prewrite every key of `writes` for `txn` at `ts`, then read every key of `reads` as of
/// `ts`: their values, or `Wait` when a pending write with a smaller timestamp stands in the way
/// (the prewrites taken stay held: the caller knows them). Below `floor`, a write is too late.
pub fn access(
    store: &Store,
    txn: TxnId,
    ts: u64,
    floor: u64,
    reads: &[RowKey],
    writes: &[RowKey],
) -> TxnResult<Found<Vec<Option<Value>>>> {
    if !writes.is_empty() && ts < floor {
        return Err(Abort::Protocol(LATE_WRITE));
    }
    for &key in writes {
        if let Found::Wait = store.get_or_create(key).lock().meta.prewrite(txn, ts)? {
            return Ok(Found::Wait);
        }
    }
    let mut values = Vec::with_capacity(reads.len());
    for &key in reads {
        let Some(rec) = store.get(key) else {
            values.push(None);
            continue;
        };
        let mut row = rec.lock();
        let row = &mut *row;
        match row.meta.read_at(&row.value, txn, ts)? {
            Found::Now(v) => values.push(v),
            Found::Wait => return Ok(Found::Wait),
        }
    }
    Ok(Found::Now(values))
}

/// The rows of a range as of `ts` (a row written after `ts`, or deleted by then, is left out
/// or shown as it was). Gaps are not protected (no phantom protection, as for the other
/// protocols' scans).
pub fn scan(store: &Store, txn: TxnId, ts: u64, s: Scan) -> TxnResult<Found<Vec<(u64, Value)>>> {
    let mut out = Vec::new();
    for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
        let mut row = rec.lock();
        let row = &mut *row;
        match row.meta.read_at(&row.value, txn, ts)? {
            Found::Now(Some(v)) => out.push((k, v)),
            Found::Now(None) => {}
            Found::Wait => return Ok(Found::Wait),
        }
    }
    Ok(Found::Now(out))
}

/// Run `op` until it no longer waits, looking again every [`WAIT_POLL_US`]; after
/// [`WAIT_MAX_US`], a lock timeout.
pub async fn waiting<T>(w: &Rc<Worker>, mut op: impl FnMut() -> TxnResult<Found<T>>) -> TxnResult<T> {
    let mut waited_us = 0;
    loop {
        match op()? {
            Found::Now(v) => return Ok(v),
            Found::Wait if waited_us >= WAIT_MAX_US => return Err(Abort::LockTimeout),
            Found::Wait => {
                if waited_us == 0 {
                    w.count(WAITS, 1);
                }
                w.sleep_us(WAIT_POLL_US).await;
                waited_us += WAIT_POLL_US;
                // Each look at the record again is a record-level step, as a validation is:
                // a wait of a millisecond looks 200 times, which a real core pays for.
                w.charge_ops(1);
            }
        }
    }
}

/// `txn` committed at `ts`: install its writes and drop the prewrites it did not use.
pub fn install(store: &Store, txn: TxnId, ts: u64, held: &[RowKey], writes: Writes) {
    for (key, value) in writes {
        let mut row = store.get_or_create(key).lock();
        let row = &mut *row;
        row.meta.install(&mut row.value, txn, ts, value);
    }
    release(store, txn, held);
}

/// Drop `txn`'s prewrites on `keys`.
pub fn release(store: &Store, txn: TxnId, keys: &[RowKey]) {
    for key in keys {
        if let Some(rec) = store.get(*key) {
            rec.lock().meta.release(txn);
        }
    }
}

impl MvccNode {
    /// Hold again, after a restart, the writes of a transaction prepared here at `ts`.
    fn adopt(store: &Store, txn: TxnId, ts: u64, writes: &Writes) {
        for (key, _) in writes {
            let mut row = store.get_or_create(*key).lock();
            assert_eq!(row.meta.pending, 0, "a recovered node has no other pending writes");
            (row.meta.pending, row.meta.pending_ts) = (txn, ts);
        }
    }
}

impl MvccWorker {
    /// Run `op` now; if it must wait, in a task of its own until it need not (see
    /// [`waiting`]); then `done` with its result. Most accesses wait for nothing and cost no task.
    fn now_or_later<T: 'static>(
        &self,
        mut op: impl FnMut(&MvccWorker) -> TxnResult<Found<T>> + 'static,
        done: impl FnOnce(&MvccWorker, TxnResult<T>) + 'static,
    ) {
        match op(self) {
            Ok(Found::Now(v)) => done(self, Ok(v)),
            Err(a) => done(self, Err(a)),
            Ok(Found::Wait) => {
                let Some(me) = self.me.upgrade() else { return };
                self.w.spawn(async move {
                    let w = me.w.clone();
                    let got = waiting(&w, || op(&me)).await;
                    done(&me, got);
                });
            }
        }
    }

    fn serve_access(&self, from: Addr, rpc_id: u64, txn: TxnId, ts: u64, reads: Vec<RowKey>, writes: Vec<RowKey>) {
        self.w.charge_ops(reads.len() + writes.len());
        if !writes.is_empty() {
            // Remembered before any is taken, so that an abort here drops them.
            self.parts.remember(txn, self.w.now_ns(), |p| p.held.extend_from_slice(&writes));
        }
        let floor = self.state.floor(&self.w);
        let reads_only = writes.is_empty();
        self.now_or_later(
            move |me| {
                // An abort (or the orphan sweeper) may have come while it waited: take nothing again.
                if !writes.is_empty() && !me.parts.contains(txn) {
                    return Err(Abort::ParticipantLost);
                }
                access(&me.node.store, txn, ts, floor, &reads, &writes)
            },
            move |me, got| {
                let reply = got.map_or_else(
                    |a| {
                        Mvcc::abort_here(me, txn);
                        Reply::No(a)
                    },
                    Reply::Values,
                );
                // Reads here are final (this node hears nothing more of a node only read from):
                // fenced, so that a deposed incarnation cannot serve them. A node written to
                // votes later, after a record that proves the same.
                let fence =
                    if reads_only && matches!(reply, Reply::Values(_)) { me.node.log.read_fence() } else { None };
                me.reply_when_durable(from, rpc_id, fence, encode(&reply));
            },
        );
    }

    /// Prewrite what `txn` writes here (waiting as an access waits), log the writes with the
    /// timestamp, and vote yes once that is durable.
    fn prepare(&self, from: Addr, rpc_id: u64, txn: TxnId, ts: u64, writes: Writes) {
        self.w.charge_ops(writes.len());
        let prepared_before = self.parts.txns.borrow().get(&txn).is_some_and(|p| !p.0.writes.is_empty());
        if prepared_before {
            // A request resent to a node that recovered the vote: the same answer again.
            let tail = self.node.log.read_fence();
            return self.reply_when_durable(from, rpc_id, tail, encode(&Reply::Yes));
        }
        let keys: Vec<RowKey> = writes.iter().map(|w| w.0).collect();
        self.parts.remember(txn, self.w.now_ns(), |p| p.held.extend_from_slice(&keys));
        let floor = self.state.floor(&self.w);
        self.now_or_later(
            move |me| {
                if !me.parts.contains(txn) {
                    return Err(Abort::ParticipantLost);
                }
                access(&me.node.store, txn, ts, floor, &[], &keys)
            },
            move |me, held| match held.and_then(|_| me.append_prepared(txn, &writes, &ts)) {
                Ok(lsn) => {
                    me.parts.remember(txn, me.w.now_ns(), |p| p.writes = writes);
                    me.reply_when_durable(from, rpc_id, lsn, encode(&Reply::Yes));
                }
                Err(a) => {
                    Mvcc::abort_here(me, txn);
                    me.w.reply(from, rpc_id, &encode(&Reply::No(a)));
                }
            },
        );
    }
}

/// What a node does for MVCC transactions, as the 2PC skeleton calls it.
impl Participant for Mvcc {
    type Part = PartTxn;

    fn serve(wk: &MvccWorker, from: Addr, rpc_id: u64, req: Request) {
        match req {
            Request::Access { txn, ts, reads, writes } => wk.serve_access(from, rpc_id, txn, ts, reads, writes),
            Request::Scan { txn, ts, scan: s } => wk.now_or_later(
                move |me| scan(&me.node.store, txn, ts, s),
                move |me, rows| {
                    me.w.charge_ops(rows.as_ref().map_or(1, |r| r.len() + 1));
                    let fence = if rows.is_ok() { me.node.log.read_fence() } else { None };
                    let reply = encode(&rows.map_or_else(Reply::No, Reply::Rows));
                    me.reply_when_durable(from, rpc_id, fence, reply);
                },
            ),
            Request::Prepare { txn, ts, writes } => wk.prepare(from, rpc_id, txn, ts, writes),
        }
    }

    fn commit_here(wk: &MvccWorker, txn: TxnId, ts: u64) {
        let Some(p) = wk.parts.remove(txn) else { return };
        wk.w.charge_ops(p.held.len());
        if !p.writes.is_empty() {
            wk.log_commit_here(txn, ts);
        }
        install(&wk.node.store, txn, ts, &p.held, p.writes);
    }

    fn abort_here(wk: &MvccWorker, txn: TxnId) {
        let Some(p) = wk.parts.remove(txn) else { return };
        if !p.writes.is_empty() {
            wk.log_abort_here(txn);
        }
        release(&wk.node.store, txn, &p.held);
    }

    /// Transactions prepared here before a crash hold their writes again, at the timestamp
    /// their vote logged; the orphan sweeper asks their coordinators.
    fn adopt_in_doubt(wk: &MvccWorker, in_doubt: InDoubt<u64>) {
        for (txn, writes, ts) in in_doubt {
            MvccNode::adopt(&wk.node.store, txn, ts, &writes);
            let held = writes.iter().map(|w| w.0).collect();
            // Last heard of "never": the sweeper asks about them on its first round.
            wk.parts.txns.borrow_mut().insert(txn, (PartTxn { held, writes }, 0));
        }
    }
}
