//! Calvin's deterministic lock manager: a scheduler requests all the local locks of each
//! transaction at once, in log order, and a transaction runs when it holds them all. Every
//! request on a key queues behind the requests made before it, so two transactions that conflict
//! run in log order at every node, and transactions that do not conflict run side by side.
//! Because every node requests in the same order, no transaction ever waits for a later one:
//! there are no deadlocks to detect and nothing aborts for a lock (Calvin §3.2.1).
//!
//! SLOG's multi-home transactions request in pieces ([`OrderedLocks::request_piece`]): one per
//! home region, each in that region's log, and a transaction runs when every piece it makes
//! here holds its locks. A key's requests all come from its home's log, so every node queues
//! them in one order; SLOG's global order of multi-home transactions keeps the pieces from
//! waiting for each other in a cycle.
//!
//! Each request waits for the earlier requests it conflicts with that are still held or
//! waiting: on a key, a shared request waits for the last exclusive one before it, an exclusive
//! request for the group at the queue's tail (the shared requests after the last exclusive one,
//! or that one); each of those waits for the ones before it, so a transaction runs when the
//! transactions it waits for directly have all released. A transaction's count of those reaches
//! zero exactly once; that is when it is handed back as ready.
//!
//! Scans lock ranges ([`KeyRange`], shared, over every key in the range whether present or
//! not): a range waits for the last exclusive request of every key in it, and a later exclusive
//! request in the range waits for the range. So a scan sees every insert and delete made before
//! it in the log and none made after.
//!
//! A lock names a key together with the home its requester expects ([`LockKey`]): once homes
//! move ([`super::homes`]), a key's requests come from two logs (its old home's and its new
//! one's), which regions interleave differently, so only requests expecting the same home may
//! queue on one another; the home movement itself holds both and orders the two sides.

use crate::storage::{RowKey, TableId};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::hash::Hash;

/// A lock's mode: shared for a key only read, exclusive for a key written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// What a lock names: a key, and the home region its requester expects it in (Calvin's one
/// log: 0). Ordered by key first, so a table's keys lie together whatever their homes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockKey {
    pub row: RowKey,
    pub home: u16,
}

/// The keys `lo..=hi` of one table, present or not, expected in `home`: what a scan locks
/// (shared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRange {
    pub table: TableId,
    pub lo: u64,
    pub hi: u64,
    pub home: u16,
}

impl KeyRange {
    fn contains(&self, key: LockKey) -> bool {
        key.row.table == self.table && (self.lo..=self.hi).contains(&key.row.key) && key.home == self.home
    }
}

#[derive(Serialize, Deserialize)]
struct Request<T> {
    txn: T,
    mode: Mode,
}

/// A transaction that requested and has not released.
#[derive(Serialize, Deserialize)]
struct Txn<T> {
    keys: Vec<(LockKey, Mode)>,
    ranges: Vec<KeyRange>,
    /// Earlier transactions it waits for that have not released.
    waits: usize,
    /// Later transactions that wait for it.
    blocks: Vec<T>,
    /// Pieces it will still request (SLOG's lock-only pieces): it runs only once none is left.
    pieces_left: u32,
}

/// The locks of one node, for transactions named by `T` (their place in the log). A scheduler's
/// checkpoint holds them as they are (`Serialize`).
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "T: Serialize + Eq + Hash", deserialize = "T: Deserialize<'de> + Eq + Hash"))]
pub struct OrderedLocks<T> {
    /// Each key's requests in log order (most keys have one or two queued: held inline).
    queues: FxHashMap<LockKey, SmallVec<[Request<T>; 2]>>,
    /// Keys with exclusive requests queued, and how many: what a range waits behind. Kept only
    /// for the tables in `scanned` (an ordered map costs a cache miss per level on every
    /// request and release, which workloads that never scan need not pay).
    written: BTreeMap<LockKey, u32>,
    /// Tables a range was ever requested in: `written` holds their keys from then on.
    scanned: Vec<TableId>,
    /// The transactions a request waits for, reused from one request to the next.
    #[serde(skip)]
    before: Vec<T>,
    /// Ranges requested and not released, per table.
    ranges: FxHashMap<TableId, Vec<(T, KeyRange)>>,
    txns: FxHashMap<T, Txn<T>>,
}

impl<T: Copy + Ord + Hash + std::fmt::Debug> Default for OrderedLocks<T> {
    fn default() -> Self {
        OrderedLocks {
            queues: FxHashMap::default(),
            written: BTreeMap::new(),
            scanned: Vec::new(),
            before: Vec::new(),
            ranges: FxHashMap::default(),
            txns: FxHashMap::default(),
        }
    }
}

impl<T: Copy + Ord + Hash + std::fmt::Debug> OrderedLocks<T> {
    /// Queue `txn`'s locks on `keys` (a key listed twice, or read and written, is locked once, in
    /// its strongest mode) and on `ranges`. Returns whether it holds them all now.
    pub fn request(
        &mut self,
        txn: T,
        keys: impl IntoIterator<Item = (LockKey, Mode)>,
        ranges: impl IntoIterator<Item = KeyRange>,
    ) -> bool {
        assert!(!self.txns.contains_key(&txn), "{txn:?} requests its locks once");
        self.request_piece(txn, 1, keys, ranges)
    }

    /// Queue one of the `pieces` requests `txn` makes (the first creates it; no two pieces name
    /// one key). Returns whether it holds all its locks now, which it can only once it has made
    /// them all.
    pub fn request_piece(
        &mut self,
        txn: T,
        pieces: u32,
        keys: impl IntoIterator<Item = (LockKey, Mode)>,
        ranges: impl IntoIterator<Item = KeyRange>,
    ) -> bool {
        assert!(pieces > 0, "a transaction makes at least one request");
        let mut keys: Vec<(LockKey, Mode)> = keys.into_iter().collect();
        keys.sort_unstable_by_key(|(k, m)| (*k, *m == Mode::Shared));
        keys.dedup_by_key(|(k, _)| *k); // Exclusive sorts first, so it is the one kept.
        let ranges: Vec<KeyRange> = ranges.into_iter().collect();
        for range in &ranges {
            self.track_writes_in(range.table);
        }
        let mut before = std::mem::take(&mut self.before);
        before.clear();
        for &(key, mode) in &keys {
            self.key_waits(key, mode, &mut before);
        }
        for range in &ranges {
            self.range_waits(range, &mut before);
        }
        before.retain(|t| *t != txn);
        before.sort_unstable();
        before.dedup();
        for earlier in &before {
            self.txns.get_mut(earlier).expect("a queued request has its transaction").blocks.push(txn);
        }
        let waits = before.len();
        self.before = before;
        for &(key, mode) in &keys {
            self.queues.entry(key).or_default().push(Request { txn, mode });
            if mode == Mode::Exclusive && self.scanned.contains(&key.row.table) {
                *self.written.entry(key).or_default() += 1;
            }
        }
        for range in &ranges {
            self.ranges.entry(range.table).or_default().push((txn, *range));
        }
        let t = self.txns.entry(txn).or_insert_with(|| Txn {
            keys: Vec::new(),
            ranges: Vec::new(),
            waits: 0,
            blocks: Vec::new(),
            pieces_left: pieces,
        });
        assert!(t.pieces_left > 0, "{txn:?} requests more pieces than it said");
        debug_assert!(keys.iter().all(|(k, _)| !t.keys.iter().any(|(held, _)| held == k)), "pieces share a key");
        t.pieces_left -= 1;
        t.waits += waits;
        match t.keys.is_empty() {
            true => t.keys = keys,
            false => t.keys.extend(keys),
        }
        t.ranges.extend(ranges);
        t.waits == 0 && t.pieces_left == 0
    }

    /// Count the exclusive requests on `table`'s keys in `written` from now on (a range there
    /// waits behind them), starting with those already queued.
    fn track_writes_in(&mut self, table: TableId) {
        if self.scanned.contains(&table) {
            return;
        }
        self.scanned.push(table);
        for (key, queue) in self.queues.iter().filter(|(k, _)| k.row.table == table) {
            let exclusive = queue.iter().filter(|r| r.mode == Mode::Exclusive).count() as u32;
            if exclusive > 0 {
                self.written.insert(*key, exclusive);
            }
        }
    }

    /// The transactions a new request on `key` in `mode` waits for directly.
    fn key_waits(&self, key: LockKey, mode: Mode, before: &mut Vec<T>) {
        if let Some(queue) = self.queues.get(&key) {
            match mode {
                Mode::Shared => before.extend(queue.iter().rev().find(|r| r.mode == Mode::Exclusive).map(|r| r.txn)),
                Mode::Exclusive => {
                    for (i, r) in queue.iter().rev().enumerate() {
                        if r.mode == Mode::Exclusive {
                            if i == 0 {
                                before.push(r.txn);
                            }
                            break;
                        }
                        before.push(r.txn);
                    }
                }
            }
        }
        if mode == Mode::Exclusive {
            let ranges = self.ranges.get(&key.row.table).into_iter().flatten();
            before.extend(ranges.filter(|(_, r)| r.contains(key)).map(|(t, _)| *t));
        }
    }

    /// The transactions a new shared lock on `range` waits for: each key's last writer.
    fn range_waits(&self, range: &KeyRange, before: &mut Vec<T>) {
        let (lo, hi) = (RowKey::new(range.table, range.lo), RowKey::new(range.table, range.hi));
        let keys = LockKey { row: lo, home: 0 }..=LockKey { row: hi, home: u16::MAX };
        for key in self.written.range(keys).map(|(k, _)| k).filter(|k| k.home == range.home) {
            let queue = &self.queues[key];
            before.extend(queue.iter().rev().find(|r| r.mode == Mode::Exclusive).map(|r| r.txn));
        }
    }

    /// Release every lock `txn` holds; the transactions that now hold all theirs are pushed to
    /// `ready`, in log order. Returns how many locks (keys and ranges) it released.
    pub fn release(&mut self, txn: T, ready: &mut Vec<T>) -> usize {
        let done = self.txns.remove(&txn).expect("a transaction releases the locks it requested");
        assert!(done.waits == 0 && done.pieces_left == 0, "{txn:?} releases before it held all its locks");
        let released = done.keys.len() + done.ranges.len();
        for (key, mode) in done.keys {
            let queue = self.queues.get_mut(&key).expect("a requested key has a queue");
            let at = queue.iter().position(|r| r.txn == txn).expect("the request is queued");
            queue.remove(at);
            if queue.is_empty() {
                self.queues.remove(&key);
            }
            if mode == Mode::Exclusive && self.scanned.contains(&key.row.table) {
                let n = self.written.get_mut(&key).expect("an exclusive request is counted");
                *n -= 1;
                if *n == 0 {
                    self.written.remove(&key);
                }
            }
        }
        let mut tables: Vec<TableId> = done.ranges.iter().map(|r| r.table).collect();
        tables.sort_unstable();
        tables.dedup();
        for table in tables {
            let held = self.ranges.get_mut(&table).expect("a requested range is listed");
            held.retain(|(t, _)| *t != txn);
            if held.is_empty() {
                self.ranges.remove(&table);
            }
        }
        let first = ready.len();
        for later in done.blocks {
            let t = self.txns.get_mut(&later).expect("a waiting transaction has not released");
            t.waits -= 1;
            if t.waits == 0 && t.pieces_left == 0 {
                ready.push(later);
            }
        }
        ready[first..].sort_unstable();
        released
    }

    /// Whether `txn` requested and has not released.
    pub fn contains(&self, txn: &T) -> bool {
        self.txns.contains_key(txn)
    }

    /// Transactions that requested and have not released.
    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> LockKey {
        LockKey { row: RowKey::new(0, k), home: 0 }
    }

    fn released(l: &mut OrderedLocks<u32>, t: u32) -> Vec<u32> {
        let mut ready = Vec::new();
        l.release(t, &mut ready);
        ready
    }

    #[test]
    fn transactions_that_do_not_conflict_hold_their_locks_at_once() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive)], []));
        assert!(l.request(2, [(key(2), Mode::Exclusive)], []));
        assert!(l.request(3, [(key(3), Mode::Shared), (key(4), Mode::Shared)], []));
        assert!(l.request(4, [(key(3), Mode::Shared)], []), "shared locks are held together");
        assert_eq!(l.len(), 4);
    }

    #[test]
    fn a_conflicting_transaction_runs_after_the_earlier_one_releases() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive), (key(2), Mode::Shared)], []));
        assert!(!l.request(2, [(key(2), Mode::Exclusive)], []), "waits behind 1's shared lock");
        assert!(!l.request(3, [(key(2), Mode::Shared), (key(5), Mode::Exclusive)], []), "queues behind 2");
        assert!(!l.request(4, [(key(1), Mode::Shared)], []));
        assert_eq!(released(&mut l, 1), vec![2, 4]);
        assert_eq!(released(&mut l, 2), vec![3]);
        assert_eq!(released(&mut l, 3), Vec::<u32>::new());
        assert_eq!(released(&mut l, 4), Vec::<u32>::new());
        assert!(l.is_empty() && l.queues.is_empty() && l.written.is_empty(), "nothing is left behind");
    }

    #[test]
    fn shared_requests_after_an_exclusive_one_are_granted_together() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive)], []));
        for t in 2..=4 {
            assert!(!l.request(t, [(key(1), Mode::Shared)], []));
        }
        assert!(!l.request(5, [(key(1), Mode::Exclusive)], []));
        assert_eq!(released(&mut l, 1), vec![2, 3, 4]);
        assert_eq!(released(&mut l, 3), Vec::<u32>::new());
        assert_eq!(released(&mut l, 2), Vec::<u32>::new());
        assert_eq!(released(&mut l, 4), vec![5], "the writer waits for every reader");
    }

    #[test]
    fn a_key_read_and_written_is_locked_once_exclusively() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Shared), (key(1), Mode::Exclusive), (key(1), Mode::Shared)], []));
        assert!(!l.request(2, [(key(1), Mode::Shared)], []));
        assert_eq!(released(&mut l, 1), vec![2]);
    }

    fn range(lo: u64, hi: u64) -> KeyRange {
        KeyRange { table: 0, lo, hi, home: 0 }
    }

    /// Homes that moved: requests expecting different homes of one key queue apart (each side
    /// comes from its own home's log), and a request holding both orders them.
    #[test]
    fn requests_expecting_other_homes_of_a_key_queue_apart() {
        let mut l = OrderedLocks::default();
        let at = |home| LockKey { row: RowKey::new(0, 1), home };
        assert!(l.request(1, [(at(0), Mode::Exclusive)], []));
        assert!(l.request(2, [(at(1), Mode::Exclusive)], []), "expects the other home: no wait");
        assert!(!l.request(3, [(at(0), Mode::Exclusive), (at(1), Mode::Exclusive)], []), "the move waits for both");
        assert!(!l.request(4, [(at(1), Mode::Shared)], []), "the new home's next waits for the move");
        assert!(!l.request(5, [], [KeyRange { table: 0, lo: 0, hi: 9, home: 1 }]), "a range waits in its home");
        assert!(l.request(6, [], [KeyRange { table: 0, lo: 0, hi: 9, home: 2 }]), "and not in another");
        assert_eq!(released(&mut l, 1), Vec::<u32>::new());
        assert_eq!(released(&mut l, 2), vec![3]);
        assert_eq!(released(&mut l, 3), vec![4, 5]);
    }

    #[test]
    fn a_range_waits_for_earlier_writers_in_it_and_later_writers_wait_for_it() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(5), Mode::Exclusive)], []), "an insert");
        assert!(l.request(2, [(key(50), Mode::Exclusive)], []), "outside the range");
        assert!(!l.request(3, [], [range(0, 10)]), "the scan waits for the insert before it");
        assert!(l.request(4, [(key(7), Mode::Shared)], [range(6, 8), range(20, 30)]), "readers share with the scan");
        assert!(!l.request(5, [(key(9), Mode::Exclusive)], []), "a later insert waits for the scan");
        assert!(l.request(6, [(key(11), Mode::Exclusive)], []), "just past the range");
        assert_eq!(released(&mut l, 2), Vec::<u32>::new());
        assert_eq!(released(&mut l, 1), vec![3]);
        assert_eq!(released(&mut l, 4), Vec::<u32>::new(), "5 still waits for the first scan");
        assert_eq!(released(&mut l, 3), vec![5]);
        assert_eq!(released(&mut l, 5), Vec::<u32>::new());
        assert_eq!(released(&mut l, 6), Vec::<u32>::new());
        assert!(l.is_empty() && l.queues.is_empty() && l.written.is_empty() && l.ranges.is_empty());
    }

    /// SLOG's pieces: a transaction holds nothing until its every piece is granted, and one
    /// piece granted early already holds its keys against later requests.
    #[test]
    fn a_transaction_in_pieces_runs_once_every_piece_holds_its_locks() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(2), Mode::Exclusive)], []));
        assert!(!l.request_piece(10, 2, [(key(1), Mode::Exclusive)], []), "one piece of two");
        assert!(!l.request(2, [(key(1), Mode::Shared)], []), "queues behind the first piece");
        assert!(!l.request_piece(10, 2, [(key(2), Mode::Shared)], []), "the second waits for 1");
        assert_eq!(released(&mut l, 1), vec![10]);
        assert_eq!(released(&mut l, 10), vec![2]);
        assert!(!l.request_piece(11, 2, [(key(3), Mode::Shared)], []));
        assert!(l.request_piece(11, 2, [(key(4), Mode::Shared)], []), "its last piece finds nothing in the way");
    }

    #[test]
    #[should_panic(expected = "requests its locks once")]
    fn a_transaction_that_requests_twice_is_a_bug() {
        let mut l = OrderedLocks::default();
        l.request(2, [(key(1), Mode::Shared)], []);
        l.request(2, [(key(1), Mode::Shared)], []);
    }
}
