//! OCC record metadata: a version (TID) that every committed write bumps, and the id of the
//! committing transaction holding the record's write lock (0 = unlocked).

#[derive(Debug, Default, Clone, Copy)]
pub struct OccMeta {
    pub tid: u64,
    pub locked_by: u64,
}

impl OccMeta {
    /// A read of version `tid` is still valid for `txn`: nobody committed over it and nobody
    /// else is about to.
    #[inline]
    pub fn validates(&self, tid: u64, txn: u64) -> bool {
        self.tid == tid && (self.locked_by == 0 || self.locked_by == txn)
    }
}

impl crate::protocols::twopc::TxnMeta for OccMeta {
    /// A replayed write is a committed write: it bumps the version as installing it did.
    fn on_replayed_write(&mut self) {
        self.tid += 1;
    }

    /// An undone write is a new version too: a read of the undone one must fail validation.
    fn on_rolled_back(&mut self) {
        self.tid += 1;
    }
}
