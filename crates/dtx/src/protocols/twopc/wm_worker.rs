//! What a concurrency control over the skeleton calls so that `commit=wm` works for it, as
//! Primo's does (`twopc::commit::watermark` is the node's gate): every call is a no-op, or hands back
//! what it was given, under the other commit policies, so a protocol's code reads the same
//! under all three.
//!
//! A concurrency control with a logical commit timestamp (TicToc, Sundial) uses them so:
//! - **a participant** enters the gate where a transaction first locks there
//!   ([`CcWorker::wm_enter`]) and raises what it answers so that the timestamp lands at or past
//!   the bound returned (R2); its yes vote logs nothing ([`CcWorker::append_prepared`]); at the
//!   decision it appends the writes as a `Commit` at the transaction's timestamp
//!   ([`CcWorker::log_install_here`]), keeping what they replace, installs, and the skeleton
//!   takes it out of the gate; an abort takes it out too ([`CcWorker::wm_leave`]);
//! - **a coordinator** notes the term when the attempt starts ([`CcWorker::wm_term`]), fixes its
//!   timestamp past the node's floor before it validates ([`CcWorker::wm_commit_ts`]; a
//!   transaction with no writes keeps the one its reads give), and passes the [`Stamp`] to the
//!   skeleton's commit calls, which append its writes here the same way and acknowledge it at
//!   `(term, ts)` ([`CcWorker::ack_after`]).
//!
//! Nothing waits for a vote or a decision to be durable: a crash rolls every partition back to
//! the agreed W_g, below which every record is durable, and a transaction that had not left
//! every partition's gate lies at or above it.

use super::commit::watermark::point;
use super::durable::AckAfter;
use super::{Cc, CcWorker, Stamp, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::TxnResult;

impl<C: Cc> CcWorker<C> {
    /// The term a transaction starting now runs in (0 without `commit=wm`).
    pub fn wm_term(&self) -> u64 {
        self.gate.watermark().map_or(0, |wm| wm.term())
    }

    /// The commit timestamp of `txn`, which started in `era`, whose reads and locks allow
    /// `candidate`: under `commit=wm` raised past the node's floor (R2) and active in its gate
    /// until [`CcWorker::wm_leave`]; refused if an agreement came between. Else `candidate`.
    pub fn wm_commit_ts(&self, txn: TxnId, era: u64, candidate: u64) -> TxnResult<u64> {
        match self.gate.watermark() {
            Some(wm) => wm.commit_ts(txn, era, candidate),
            None => Ok(candidate),
        }
    }

    /// A remote transaction takes its first lock here: under `commit=wm` it is active here from
    /// now until [`CcWorker::wm_leave`], and its timestamp must be at least the bound returned
    /// (0 otherwise). Refused while the node recovers.
    pub fn wm_enter(&self, txn: TxnId) -> TxnResult<u64> {
        match self.gate.watermark() {
            Some(wm) => wm.enter(txn, wm.term(), 0),
            None => Ok(0),
        }
    }

    /// `txn` holds nothing here any more (its record appended, or aborted).
    pub fn wm_leave(&self, txn: TxnId) {
        if let Some(wm) = self.gate.watermark() {
            wm.leave(txn, None);
        }
    }

    /// What a commit waits for before its client hears of it: under `commit=wm` the global
    /// watermark passing `(era, ts)`, else `lsn` (a log position, or the epoch's under
    /// `commit=epoch`).
    pub fn ack_after(&self, stamp: Stamp, lsn: AckAfter) -> AckAfter {
        match self.gate.watermark() {
            Some(wm) => {
                wm.awaited(stamp.ts);
                Some(point(stamp.era, stamp.ts))
            }
            None => lsn,
        }
    }

    /// A participant logs that `txn`, prepared here, commits at `ts`, before its writes install
    /// (log order is install order): under `commit=wm` its writes, as a `Commit` the watermark
    /// settles, since its vote logged nothing; else the outcome record (a decision without a
    /// timestamp of its own). Under `commit=wm` a record the log refuses stops the node
    /// ([`super::commit::watermark::WatermarkGate::fail_stop`]): the transaction leaves the gate once installed, and a
    /// watermark published after that could pass a commit whose writes here are in no log.
    pub fn log_install_here(&self, txn: TxnId, writes: &[(RowKey, Option<Value>)], ts: u64) {
        let Some(wm) = self.gate.watermark() else { return self.log_commit_here(txn, 0) };
        if let Err(a) = wm.append_install(self, txn, writes, ts) {
            wm.fail_stop(&self.w, &format!("txn {txn:x}: its writes could not be logged ({a:?})"));
        }
    }
}
