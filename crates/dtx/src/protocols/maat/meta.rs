//! MaaT's record metadata: the timestamps of the last committed write and of the latest
//! committed read, and the soft locks of the transactions that accessed the record and have not
//! committed or aborted yet (MaaT's soft locks never block: they only tell a validating
//! transaction whom it conflicts with).

use crate::protocols::twopc::{TxnId, TxnMeta};

#[derive(Debug, Default, Clone)]
pub struct MaatMeta {
    /// Commit timestamp of the version the record holds (0: loaded).
    pub wts: u64,
    /// Largest commit timestamp of a transaction that read it.
    pub rts: u64,
    /// Soft read locks: transactions that read the record, not yet ended here.
    pub readers: Vec<TxnId>,
    /// Soft write locks: transactions that will write the record if they commit.
    pub writers: Vec<TxnId>,
}

impl MaatMeta {
    /// Add `txn` to a soft-lock list once.
    pub fn hold(list: &mut Vec<TxnId>, txn: TxnId) {
        if !list.contains(&txn) {
            list.push(txn);
        }
    }

    /// Drop `txn`'s soft locks on the record.
    pub fn release(&mut self, txn: TxnId) {
        self.readers.retain(|t| *t != txn);
        self.writers.retain(|t| *t != txn);
    }
}

impl TxnMeta for MaatMeta {
    /// A replayed write carries its decision's timestamp: the version's write timestamp.
    fn on_replayed_at(&mut self, ts: u64) {
        self.wts = ts;
    }
}
