//! What a record carries under static-timestamp MVCC: the timestamp of its newest version and
//! the largest timestamp that read it, the transaction whose write is pending on it (a
//! prewrite, between its vote and the decision), and a few older versions for readers whose
//! timestamps fall before the newest one.

use super::{GONE, LATE_WRITE, WRITE_CONFLICT};
use crate::protocols::twopc::{TxnId, TxnMeta};
use crate::storage::Value;
use crate::txn::Abort;

/// Older versions a record keeps (the newest is the record's value): a read whose timestamp
/// falls before all of them aborts (`mvcc-version-gone`). The Sundial paper's MVCC keeps every
/// version and collects none, an upper bound; a bounded history is what a real one keeps
/// between collections.
pub const KEEP_VERSIONS: usize = 8;

#[derive(Debug, Default, Clone)]
pub struct MvccMeta {
    /// Timestamp of the version the record holds (0: loaded).
    pub wts: u64,
    /// Largest timestamp that read the newest version: a write below it comes too late.
    pub rts: u64,
    /// The transaction with a pending write here (0: none), and its timestamp.
    pub pending: TxnId,
    pub pending_ts: u64,
    /// Older versions, oldest first: (timestamp, value).
    pub older: Vec<(u64, Option<Value>)>,
}

/// What an access finds on a record.
#[derive(Debug)]
pub enum Found<T> {
    Now(T),
    /// A write with a smaller timestamp is pending: its outcome decides what this access sees.
    Wait,
}

impl MvccMeta {
    /// Read the record as of timestamp `ts` (`current` is its newest value): the newest version
    /// not after `ts`. Reading the newest version raises its read timestamp.
    pub fn read_at(&mut self, current: &Option<Value>, txn: TxnId, ts: u64) -> Result<Found<Option<Value>>, Abort> {
        if self.pending != 0 && self.pending != txn && self.pending_ts < ts {
            return Ok(Found::Wait);
        }
        if self.wts <= ts {
            self.rts = self.rts.max(ts);
            return Ok(Found::Now(current.clone()));
        }
        match self.older.iter().rev().find(|(wts, _)| *wts <= ts) {
            Some((_, v)) => Ok(Found::Now(v.clone())),
            None => Err(Abort::Protocol(GONE)),
        }
    }

    /// Hold the record for `txn`'s write at `ts` (a prewrite). Too late once a version or a read
    /// after `ts` exists; a pending write after `ts` wins, one before it is waited for.
    pub fn prewrite(&mut self, txn: TxnId, ts: u64) -> Result<Found<()>, Abort> {
        if self.pending == txn {
            return Ok(Found::Now(()));
        }
        if self.wts > ts || self.rts > ts {
            return Err(Abort::Protocol(LATE_WRITE));
        }
        if self.pending != 0 {
            return if self.pending_ts < ts { Ok(Found::Wait) } else { Err(Abort::Protocol(WRITE_CONFLICT)) };
        }
        (self.pending, self.pending_ts) = (txn, ts);
        Ok(Found::Now(()))
    }

    /// Install `txn`'s write at `ts` over the newest version, which joins the older ones.
    pub fn install(&mut self, slot: &mut Option<Value>, txn: TxnId, ts: u64, value: Option<Value>) {
        assert_eq!(self.pending, txn, "installing a write that is not pending");
        assert!(ts > self.wts && ts >= self.rts, "a prewrite checked {ts} against {} and {}", self.wts, self.rts);
        if self.older.len() == KEEP_VERSIONS {
            let (_, gone) = self.older.remove(0);
            Value::recycle(gone);
        }
        self.older.push((self.wts, std::mem::replace(slot, value)));
        (self.wts, self.rts) = (ts, ts);
        self.release(txn);
    }

    /// Drop `txn`'s pending write, if it has one here.
    pub fn release(&mut self, txn: TxnId) {
        if self.pending == txn {
            (self.pending, self.pending_ts) = (0, 0);
        }
    }
}

impl TxnMeta for MvccMeta {
    /// A replayed write carries its decision's timestamp: the version's timestamp.
    fn on_replayed_at(&mut self, ts: u64) {
        self.wts = ts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u8) -> Option<Value> {
        Some(Value::from(vec![n]))
    }

    fn read(m: &mut MvccMeta, cur: &Option<Value>, ts: u64) -> Option<Value> {
        match m.read_at(cur, 99, ts).expect("readable") {
            Found::Now(v) => v,
            Found::Wait => panic!("waits"),
        }
    }

    #[test]
    fn a_reader_sees_the_version_of_its_timestamp() {
        let (mut m, mut cur) = (MvccMeta::default(), v(0));
        for (txn, ts) in [(1, 10), (2, 20)] {
            assert!(matches!(m.prewrite(txn, ts), Ok(Found::Now(()))));
            m.install(&mut cur, txn, ts, v(txn as u8));
        }
        assert_eq!(read(&mut m, &cur, 5), v(0));
        assert_eq!(read(&mut m, &cur, 15), v(1));
        assert_eq!(read(&mut m, &cur, 25), v(2));
        assert_eq!(m.rts, 25, "only a read of the newest version raises rts");
    }

    #[test]
    fn a_write_after_a_later_read_comes_too_late() {
        // The paper's Sec. 6.6 abort: a write from a server whose clock lags arrives after a
        // read with a larger timestamp; the dynamic timestamps of Sundial would move it later.
        let (mut m, cur) = (MvccMeta::default(), v(0));
        read(&mut m, &cur, 30);
        assert_eq!(m.prewrite(1, 20).unwrap_err(), Abort::Protocol(LATE_WRITE));
        assert!(matches!(m.prewrite(2, 40), Ok(Found::Now(()))));
    }

    #[test]
    fn pending_writes_order_readers_and_writers_by_timestamp() {
        let (mut m, cur) = (MvccMeta::default(), v(0));
        assert!(matches!(m.prewrite(1, 20), Ok(Found::Now(()))));
        assert!(matches!(m.read_at(&cur, 7, 25), Ok(Found::Wait)), "a later reader waits for the outcome");
        assert_eq!(read(&mut m, &cur, 15), v(0), "an earlier reader reads around it");
        assert!(matches!(m.prewrite(2, 30), Ok(Found::Wait)), "a later writer waits");
        assert_eq!(m.prewrite(3, 10).unwrap_err(), Abort::Protocol(LATE_WRITE), "below a read");
        let mut m2 = MvccMeta::default();
        assert!(matches!(m2.prewrite(1, 20), Ok(Found::Now(()))));
        assert_eq!(m2.prewrite(3, 10).unwrap_err(), Abort::Protocol(WRITE_CONFLICT), "an earlier writer loses");
    }

    #[test]
    fn the_history_is_bounded() {
        let (mut m, mut cur) = (MvccMeta::default(), v(0));
        for i in 1..=(KEEP_VERSIONS as u64 + 2) {
            assert!(matches!(m.prewrite(i, i * 10), Ok(Found::Now(()))));
            m.install(&mut cur, i, i * 10, v(i as u8));
        }
        assert_eq!(m.older.len(), KEEP_VERSIONS);
        assert_eq!(m.read_at(&cur, 99, 5).unwrap_err(), Abort::Protocol(GONE));
    }
}
