//! MaaT's time table and its rules (Mahmoud et al., PVLDB 7(5), 2014, as the Sundial paper's
//! improved version runs it): every transaction has, at every node it touched, a range of
//! commit timestamps `[lower, upper]`, at first `[1, ∞)`. Validating a transaction at a node
//! narrows its range by the committed timestamps of what it accessed and by every transaction
//! it conflicts with there: a conflicting transaction already validated is frozen, so the
//! validating one moves its own bounds around it; a conflicting one still running is moved
//! instead, to the other side of the validated range. Once validated, a range is frozen here.
//!
//! The rule that costs MaaT its aborts (Sundial paper, Sec. 5.2 and Fig. 12): a validated
//! reader whose range is still `[x, ∞)` forces every running writer of what it read to start
//! after ∞, which empties the writer's range.

use crate::protocols::twopc::{TxnId, MAX_TABLE_ENTRIES};
use crate::txn::Reason;
use rustc_hash::FxHashMap;

/// The upper end of an open range.
pub const OPEN: u64 = u64::MAX;

/// The range was emptied by a validated transaction whose range was `[x, ∞)`.
pub const FROZEN: Reason = Reason::new("maat-frozen");
/// The range came out empty for another reason (committed timestamps, or closed ranges of
/// validated transactions on both sides), here or across the participants.
pub const EMPTY: Reason = Reason::new("maat-empty-range");
/// A read that must see every acknowledged write met a validated writer's soft lock.
pub const FRESH: Reason = Reason::new("fresh-read-locked");

/// A transaction's range at one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub lower: u64,
    pub upper: u64,
    /// Validated here: the range is frozen.
    pub validated: bool,
    /// A validated transaction with an open range pushed the lower bound to ∞ (the reason it
    /// will abort for).
    pub frozen_hit: bool,
}

impl Default for Entry {
    fn default() -> Self {
        Entry { lower: 1, upper: OPEN, validated: false, frozen_hit: false }
    }
}

impl Entry {
    /// `lower` must pass `ts` (an access that must come after a commit at `ts`).
    fn start_after(&mut self, ts: u64) {
        self.lower = self.lower.max(ts.saturating_add(1));
    }

    /// `upper` must stay before `ts`.
    fn end_before(&mut self, ts: u64) {
        self.upper = self.upper.min(ts.saturating_sub(1));
    }

    /// Start after a validated range ending at `upper`: after ∞ is nowhere.
    fn start_after_range(&mut self, upper: u64) {
        if upper == OPEN {
            self.lower = OPEN;
            self.frozen_hit = true;
        } else {
            self.start_after(upper);
        }
    }

    /// Nothing is left to commit at (∞ is not a timestamp).
    pub fn is_empty(&self) -> bool {
        self.lower > self.upper || self.lower == OPEN
    }

    /// Why an empty range is empty.
    pub fn reason(&self) -> Reason {
        if self.frozen_hit {
            FROZEN
        } else {
            EMPTY
        }
    }
}

/// Whether the transaction being checked must come before or after the other one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// It read what the other will write: it must commit first.
    Before,
    /// The other read or will write what it writes: it must commit after.
    After,
}

/// The ranges of the transactions that touched one node and have not ended there. Bounded by
/// the transactions in flight ([`MAX_TABLE_ENTRIES`] asserts it).
#[derive(Debug, Default)]
pub struct TimeTable {
    entries: FxHashMap<TxnId, Entry>,
}

impl TimeTable {
    /// `txn`'s entry, made at its first access here.
    pub fn entry(&mut self, txn: TxnId) -> &mut Entry {
        debug_assert!(self.entries.len() <= MAX_TABLE_ENTRIES, "MaaT's time table outgrew the transactions in flight");
        self.entries.entry(txn).or_default()
    }

    pub fn get(&self, txn: TxnId) -> Option<Entry> {
        self.entries.get(&txn).copied()
    }

    pub fn remove(&mut self, txn: TxnId) -> Option<Entry> {
        self.entries.remove(&txn)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// At an access: a validated `other` is frozen, so `txn` moves around it at once (it may
    /// commit and leave before `txn` validates). A running one is dealt with at whichever of
    /// the two validates first.
    pub fn respect_validated(&mut self, txn: TxnId, other: TxnId, order: Order) {
        if other == txn {
            return;
        }
        let Some(o) = self.get(other).filter(|o| o.validated) else { return };
        let e = self.entry(txn);
        match order {
            Order::Before => e.end_before(o.lower),
            Order::After => e.start_after_range(o.upper),
        }
    }
}

/// A validation in progress at one node: `txn`'s range narrowed step by step, and the running
/// transactions it will move once its own range is known.
#[derive(Debug)]
pub struct Validation {
    txn: TxnId,
    range: Entry,
    /// Running transactions that must end before it, and after it.
    before: Vec<TxnId>,
    after: Vec<TxnId>,
}

impl Validation {
    pub fn start(table: &mut TimeTable, txn: TxnId) -> Self {
        let range = *table.entry(txn);
        assert!(!range.validated, "txn {txn:x} validated twice at one node");
        Validation { txn, range, before: Vec::new(), after: Vec::new() }
    }

    /// It must commit after a version or read committed at `ts`.
    pub fn after_ts(&mut self, ts: u64) {
        self.range.start_after(ts);
    }

    /// It conflicts with `other` (a soft lock on something it accessed).
    pub fn conflict(&mut self, table: &TimeTable, other: TxnId, order: Order) {
        if other == self.txn {
            return;
        }
        match (table.get(other), order) {
            // Ended here: its timestamps are in the records.
            (None, _) => {}
            (Some(o), Order::Before) if o.validated => self.range.end_before(o.lower),
            (Some(o), Order::After) if o.validated => self.range.start_after_range(o.upper),
            (Some(_), Order::Before) => self.after.push(other),
            (Some(_), Order::After) => self.before.push(other),
        }
    }

    /// Freeze the range, or fail with the reason it is empty. Running conflicting transactions
    /// are moved to either side of it.
    pub fn finish(self, table: &mut TimeTable) -> Result<(u64, u64), Reason> {
        if self.range.is_empty() {
            return Err(self.range.reason());
        }
        let (lower, upper) = (self.range.lower, self.range.upper);
        *table.entry(self.txn) = Entry { lower, upper, validated: true, frozen_hit: false };
        for b in self.before {
            table.entry(b).end_before(lower);
        }
        for a in self.after {
            table.entry(a).start_after_range(upper);
        }
        Ok((lower, upper))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validated_open_reader_freezes_out_a_running_writer() {
        // T1 read x, T2 will write x; T1 validates first with [1, ∞): T2 must start after ∞.
        let mut t = TimeTable::default();
        t.entry(1);
        t.entry(2);
        let mut v = Validation::start(&mut t, 1);
        v.conflict(&t, 2, Order::Before);
        assert_eq!(v.finish(&mut t), Ok((1, OPEN)));
        let mut v = Validation::start(&mut t, 2);
        v.conflict(&t, 1, Order::After);
        assert_eq!(v.finish(&mut t), Err(FROZEN));
    }

    #[test]
    fn a_writer_validated_first_pushes_the_reader_before_it() {
        // T2 (writer of x, which rts 4 makes start at 5) validates first; T1, which read x,
        // must end before 5 and commits in [1, 4].
        let mut t = TimeTable::default();
        t.entry(1);
        let mut v = Validation::start(&mut t, 2);
        v.after_ts(4);
        v.conflict(&t, 1, Order::After);
        assert_eq!(v.finish(&mut t), Ok((5, OPEN)));
        assert_eq!(t.get(1).unwrap().upper, 4);
        let mut v = Validation::start(&mut t, 1);
        v.conflict(&t, 2, Order::Before);
        assert_eq!(v.finish(&mut t), Ok((1, 4)));
    }

    #[test]
    fn closed_ranges_on_both_sides_leave_nothing() {
        let mut t = TimeTable::default();
        *t.entry(1) = Entry { lower: 5, upper: 9, validated: true, frozen_hit: false };
        *t.entry(2) = Entry { lower: 3, upper: 6, validated: true, frozen_hit: false };
        // T3 must come after T1 (ends at 9) and before T2 (starts at 3).
        let mut v = Validation::start(&mut t, 3);
        v.conflict(&t, 1, Order::After);
        v.conflict(&t, 2, Order::Before);
        assert_eq!(v.finish(&mut t), Err(EMPTY));
    }

    #[test]
    fn an_access_moves_around_a_validated_transaction_at_once() {
        let mut t = TimeTable::default();
        *t.entry(1) = Entry { lower: 7, upper: OPEN, validated: true, frozen_hit: false };
        t.respect_validated(2, 1, Order::Before);
        assert_eq!(t.get(2).unwrap().upper, 6);
        t.respect_validated(3, 1, Order::After);
        assert!(t.get(3).unwrap().is_empty() && t.get(3).unwrap().reason() == FROZEN);
    }
}
