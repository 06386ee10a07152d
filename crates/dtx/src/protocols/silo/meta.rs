//! Silo's TID word: what a record carries, and how a worker picks a transaction's TID.
//!
//! A TID orders transactions as Rolis's ⟨epoch, timestamp⟩ does, packed into one `u64`: the
//! epoch (the node's incarnation, which a failover or a restart moves on) in the top
//! [`EPOCH_BITS`] bits, the timestamp below. A worker picks a TID without a shared counter, as
//! Silo does: above every TID the transaction read or overwrote and above its own last one; it
//! also follows the worker's clock (in place of Rolis's `rdtscp`), so that the streams of idle
//! and busy workers advance alike and the watermark over them moves.

/// Bits of a TID that hold the epoch.
pub const EPOCH_BITS: u32 = 16;
const STAMP_BITS: u32 = 64 - EPOCH_BITS;
/// Bits of a stamp below the clock: the worker's index, so that two workers' stamps taken in
/// the same microsecond differ (ties would be harmless: only transactions that conflict need
/// ordered TIDs, and those get them from the TIDs they saw).
const WORKER_BITS: u32 = 8;
/// The most epochs a node goes through (each restart or failover is one).
pub const MAX_EPOCH: u64 = (1 << EPOCH_BITS) - 1;

/// A record's TID word: the TID of the transaction that wrote it (0 for loaded data) and the
/// transaction that holds its write lock while it commits (0 = unlocked), and with
/// `snapshots` the older versions a snapshot may still read ([`super::snapshot`]).
#[derive(Debug, Default)]
pub struct SiloMeta {
    pub tid: u64,
    pub locked_by: u64,
    /// With `snapshots`: the clock its writer read at its serialization point, plus one.
    pub ser_us: u64,
    pub older: Option<Box<super::snapshot::Version>>,
}

impl SiloMeta {
    /// A read of TID `tid` still holds for `txn`: nobody installed over it and nobody else is
    /// committing over it.
    #[inline]
    pub fn validates(&self, tid: u64, txn: u64) -> bool {
        self.tid == tid && (self.locked_by == 0 || self.locked_by == txn)
    }
}

/// The epoch a TID belongs to.
#[inline]
pub fn epoch_of(tid: u64) -> u64 {
    tid >> STAMP_BITS
}

/// The clock reading (µs) a TID was stamped at or above: the timestamp without its worker bits.
#[inline]
pub fn clock_us_of(tid: u64) -> u64 {
    (tid & ((1 << STAMP_BITS) - 1)) >> WORKER_BITS
}

/// The smallest TID of `epoch`: every TID of an earlier epoch lies below it.
#[inline]
pub fn epoch_start(epoch: u64) -> u64 {
    assert!(epoch <= MAX_EPOCH, "epoch {epoch} is past the {MAX_EPOCH} a TID holds");
    epoch << STAMP_BITS
}

/// The TIDs one worker hands out in one epoch: each above the last, above `floor`, and no
/// lower than the clock.
#[derive(Debug, Clone, Copy)]
pub struct Stamper {
    epoch: u64,
    worker: u64,
    last: u64,
}

impl Stamper {
    pub fn new(epoch: u64, worker: u16) -> Self {
        assert!((worker as u64) < (1 << WORKER_BITS), "worker {worker}: a stamp names at most 256 workers");
        Stamper { epoch, worker: worker as u64, last: epoch_start(epoch) }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The last TID handed out (the epoch's start before the first).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// A new TID above `floor` (the largest TID the transaction saw) and above every TID this
    /// worker handed out before, at `now_us` or later.
    pub fn next(&mut self, now_us: u64, floor: u64) -> u64 {
        let clock = epoch_start(self.epoch) | ((now_us << WORKER_BITS) | self.worker);
        let tid = clock.max(self.last + 1).max(floor + 1);
        assert_eq!(epoch_of(tid), self.epoch, "epoch {}'s stamps ran out (clock {now_us} µs)", self.epoch);
        self.last = tid;
        tid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_grow_pass_what_was_seen_and_order_epochs() {
        let mut s = Stamper::new(3, 5);
        let a = s.next(100, 0);
        assert_eq!(epoch_of(a), 3);
        assert!(s.next(100, 0) > a, "the same microsecond still moves on");
        let seen = s.next(1_000_000, 0);
        assert!(s.next(10, seen) > seen, "a stamp passes the TIDs its transaction saw");
        assert!(epoch_start(4) > s.last(), "every TID of epoch 3 orders before epoch 4");
        let other = Stamper::new(3, 6).next(100, 0);
        assert_ne!(other, a, "two workers' stamps in one microsecond differ");
    }
}
