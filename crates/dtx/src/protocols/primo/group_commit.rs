//! How Primo's commits become durable, one of two ways (`commit=`):
//!
//! - **`wm`, watermark group commit (§5, the paper's).** `twopc::commit::watermark`: a transaction is
//!   active in a partition's watermark from its first lock there (or from when its coordinator
//!   fixes its timestamp) until its install is logged; its client hears of it once the global
//!   watermark passes its timestamp. A recovery agreement starts a new term, and a request or an
//!   install of an older term is refused.
//! - **`epoch`, COCO's epoch group commit (the paper's comparison, Fig. 11-13: the same
//!   concurrency control under each scheme).** `twopc::commit::epoch`: a transaction runs in its
//!   node's open epoch and its client hears of it when the epoch commits on every node. Its
//!   requests carry the epoch (a participant in another refuses them). Its `Install`s carry it
//!   too and are not refused: a participant installs one under its gate's lock if it still
//!   serves that epoch, and releases the transaction's locks if the epoch failed there. The
//!   coordinator waits for every `Install` to be answered before it leaves the epoch, so that
//!   what a partition logs for the epoch precedes its seal (under `wm` they go in the
//!   background, since nothing waits for them). Timestamps are TicToc's alone: no floor.
//!
//! Coordinator and participant call these, never the gates themselves. A transaction's *era*
//! is the agreement term under `wm` and the epoch under `epoch`.

use super::PrimoWorker;
use crate::protocols::twopc::commit::Gate;
use crate::protocols::twopc::durable::Writes;
use crate::protocols::twopc::TxnId;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, TxnResult};

/// The values an install replaced, one for each write.
pub type Replaced = Vec<(RowKey, Option<Value>)>;

impl PrimoWorker {
    /// The era the transactions this worker starts now run in.
    pub fn era(&self) -> u64 {
        match &self.gate {
            Gate::Watermark(wm) => wm.term(),
            Gate::Epoch(_) => self.coord.epoch.get(),
            Gate::TwoPc => unreachable!("Primo commits by watermark or by epoch"),
        }
    }

    /// A remote transaction of `era` takes its first lock here, or another: under `wm` it is
    /// active here from now, and the floor its records are raised past is returned (0 under
    /// `epoch`, whose requests the skeleton refuses outside their epoch).
    pub fn enter(&self, txn: TxnId, era: u64) -> TxnResult<u64> {
        match self.gate.watermark() {
            Some(wm) => wm.enter(txn, era, 0),
            None => Ok(0),
        }
    }

    /// The commit timestamp of a transaction of `era` whose leases allow `candidate`: under
    /// `wm` raised past the node's floor (R2) and active here until it leaves.
    pub fn fix_ts(&self, txn: TxnId, era: u64, candidate: u64) -> TxnResult<u64> {
        self.wm_commit_ts(txn, era, candidate)
    }

    /// An `Install` of `era` arrived: may it install? (Under `epoch`, [`Self::install_logged`]
    /// decides, under the gate's lock.)
    pub fn begin_install(&self, txn: TxnId, era: u64) -> TxnResult<()> {
        match self.gate.watermark() {
            Some(wm) => wm.begin_install(txn, era),
            None => Ok(()),
        }
    }

    /// `txn` is no longer active here (under `wm`), its record at `logged_ts` if it has one.
    pub fn leave(&self, txn: TxnId, logged_ts: Option<u64>) {
        if let Some(wm) = self.gate.watermark() {
            wm.leave(txn, logged_ts);
        }
    }

    /// Commit `txn` of `era` at `ts` here: `append` logs `writes`, then `install` installs them
    /// (and extends and releases what it holds), returning the values replaced. Under `wm` the
    /// replaced values are kept until the watermark passes `ts` and the transaction leaves the
    /// active set at `ts`; under `epoch` all of it happens under the gate's lock, which saves the values
    /// first, and is refused (`epoch-closed`, nothing done) once the epoch failed here.
    pub fn install_logged(
        &self,
        txn: TxnId,
        era: u64,
        ts: u64,
        writes: Writes,
        append: impl FnOnce(&Writes) -> TxnResult<()>,
        install: impl FnOnce(Writes) -> Replaced,
    ) -> TxnResult<()> {
        match &self.gate {
            Gate::Watermark(wm) => {
                append(&writes)?;
                wm.keep_undo(ts, install(writes));
                // Installed here at `ts` (its writes logged, or its leases extended): the node's
                // clock and its idle watermark move past it.
                wm.leave(txn, Some(ts));
                Ok(())
            }
            Gate::Epoch(gate) => gate.install_in(self, era, writes, |writes| {
                append(&writes)?;
                install(writes);
                Ok(())
            }),
            Gate::TwoPc => unreachable!("Primo commits by watermark or by epoch"),
        }
    }

    /// Log the writes `txn` installs here at `ts` (nothing for none).
    pub fn log_install(&self, txn: TxnId, writes: &Writes, ts: u64) -> TxnResult<()> {
        match writes.is_empty() {
            true => Ok(()),
            false => self.node.log.append_commit(txn, writes, &[], ts).map(|_| ()),
        }
    }

    /// The writes `txn` had to install here could not be logged (`why`), and were not
    /// installed. Under `wm` the node stops (fail-stop): a watermark it published from now on
    /// could pass a commit that is in no log. Under `epoch` the epoch failed here already (its
    /// vote is no, [`crate::protocols::twopc::commit::epoch::EpochGate::install_in`]). Returns
    /// whether the node still answers requests.
    pub fn not_logged(&self, txn: TxnId, why: Abort) -> bool {
        match self.gate.watermark() {
            Some(wm) => {
                wm.fail_stop(&self.w, &format!("primo txn {txn:x}: its install could not be logged ({why:?})"));
                false
            }
            None => {
                self.w.count("primo-installs-not-logged", 1);
                true
            }
        }
    }

    /// Has this node stopped for a write it could not log ([`Self::not_logged`])?
    pub fn stopped(&self) -> bool {
        self.gate.watermark().is_some_and(|wm| wm.stopped())
    }

    /// Under `epoch`: has the epoch `era` failed here (an install still unanswered need not be
    /// resent: its participant releases on its own)?
    pub fn era_rolled_back(&self, era: u64) -> bool {
        matches!(&self.gate, Gate::Epoch(g) if g.rolled_back(era))
    }

    /// Under `epoch`: the coordinator waits for its `Install`s inside its epoch.
    pub fn installs_wait(&self) -> bool {
        self.gate.watermark().is_none()
    }
}
