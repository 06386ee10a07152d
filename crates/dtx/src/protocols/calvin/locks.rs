//! Calvin's deterministic lock manager: a scheduler requests all the local locks of each
//! transaction at once, in log order, and a transaction runs when it holds them all. Every
//! request on a key queues behind the requests made before it, so two transactions that conflict
//! run in log order at every node, and transactions that do not conflict run side by side.
//! Because every node requests in the same order, no transaction ever waits for a later one:
//! there are no deadlocks to detect and nothing aborts for a lock (Calvin §3.2.1). SLOG and
//! Detock's lock-only pieces queue the same way.
//!
//! A key's queue grants its head: the first request, and with it every shared request up to the
//! first exclusive one. A transaction's count of locks not yet granted reaches zero exactly once;
//! that is when it is handed back as ready.

use crate::storage::RowKey;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::hash::Hash;

/// A lock's mode: shared for a key only read, exclusive for a key written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

struct Request<T> {
    txn: T,
    mode: Mode,
    granted: bool,
}

/// The locks of one node, for transactions named by `T` (their place in the log).
pub struct OrderedLocks<T> {
    queues: FxHashMap<RowKey, VecDeque<Request<T>>>,
    /// Per transaction: its keys, and how many of their locks it still waits for.
    txns: FxHashMap<T, (Vec<RowKey>, usize)>,
    /// The last transaction that requested: requests come in log order (asserted).
    last: Option<T>,
}

impl<T: Copy + Ord + Hash + std::fmt::Debug> Default for OrderedLocks<T> {
    fn default() -> Self {
        OrderedLocks { queues: FxHashMap::default(), txns: FxHashMap::default(), last: None }
    }
}

impl<T: Copy + Ord + Hash + std::fmt::Debug> OrderedLocks<T> {
    /// Queue `txn`'s locks on `keys` (a key listed twice, or read and written, is locked once, in
    /// its strongest mode). Returns whether it holds them all now.
    pub fn request(&mut self, txn: T, keys: impl IntoIterator<Item = (RowKey, Mode)>) -> bool {
        assert!(
            self.last.is_none_or(|last| last < txn),
            "locks are requested in log order: {txn:?} after {:?}",
            self.last
        );
        self.last = Some(txn);
        let mut wanted: Vec<(RowKey, Mode)> = keys.into_iter().collect();
        wanted.sort_unstable_by_key(|(k, m)| (*k, *m == Mode::Shared));
        wanted.dedup_by_key(|(k, _)| *k); // Exclusive sorts first, so it is the one kept.
        let mut waiting = 0;
        for &(key, mode) in &wanted {
            let queue = self.queues.entry(key).or_default();
            let granted = queue.iter().all(|r| r.granted && r.mode == Mode::Shared && mode == Mode::Shared);
            waiting += usize::from(!granted);
            queue.push_back(Request { txn, mode, granted });
        }
        self.txns.insert(txn, (wanted.into_iter().map(|(k, _)| k).collect(), waiting));
        waiting == 0
    }

    /// Release every lock `txn` holds; the transactions that now hold all theirs are pushed to
    /// `ready`, in log order.
    pub fn release(&mut self, txn: T, ready: &mut Vec<T>) {
        let (keys, waiting) = self.txns.remove(&txn).expect("a transaction releases the locks it requested");
        assert_eq!(waiting, 0, "{txn:?} releases before it held all its locks");
        let first = ready.len();
        for key in keys {
            let queue = self.queues.get_mut(&key).expect("a requested key has a queue");
            let at = queue.iter().position(|r| r.txn == txn).expect("the request is queued");
            debug_assert!(queue[at].granted, "a running transaction holds its locks");
            queue.remove(at);
            self.grant_head(key, ready);
        }
        ready[first..].sort_unstable();
    }

    /// Grant what now heads `key`'s queue, and count it off its transactions' waits.
    fn grant_head(&mut self, key: RowKey, ready: &mut Vec<T>) {
        let Some(queue) = self.queues.get_mut(&key) else { return };
        if queue.is_empty() {
            self.queues.remove(&key);
            return;
        }
        let head_exclusive = queue[0].mode == Mode::Exclusive;
        for (i, r) in queue.iter_mut().enumerate() {
            if i > 0 && (head_exclusive || r.mode == Mode::Exclusive) {
                break;
            }
            if r.granted {
                continue;
            }
            r.granted = true;
            let waiting = &mut self.txns.get_mut(&r.txn).expect("a queued request has its transaction").1;
            *waiting -= 1;
            if *waiting == 0 {
                ready.push(r.txn);
            }
        }
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

    fn key(k: u64) -> RowKey {
        RowKey::new(0, k)
    }

    fn released(l: &mut OrderedLocks<u32>, t: u32) -> Vec<u32> {
        let mut ready = Vec::new();
        l.release(t, &mut ready);
        ready
    }

    #[test]
    fn transactions_that_do_not_conflict_hold_their_locks_at_once() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive)]));
        assert!(l.request(2, [(key(2), Mode::Exclusive)]));
        assert!(l.request(3, [(key(3), Mode::Shared), (key(4), Mode::Shared)]));
        assert!(l.request(4, [(key(3), Mode::Shared)]), "shared locks are held together");
        assert_eq!(l.len(), 4);
    }

    #[test]
    fn a_conflicting_transaction_runs_after_the_earlier_one_releases() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive), (key(2), Mode::Shared)]));
        assert!(!l.request(2, [(key(2), Mode::Exclusive)]), "waits behind 1's shared lock");
        assert!(!l.request(3, [(key(2), Mode::Shared), (key(5), Mode::Exclusive)]), "queues behind 2");
        assert!(!l.request(4, [(key(1), Mode::Shared)]));
        assert_eq!(released(&mut l, 1), vec![2, 4]);
        assert_eq!(released(&mut l, 2), vec![3]);
        assert_eq!(released(&mut l, 3), Vec::<u32>::new());
        assert_eq!(released(&mut l, 4), Vec::<u32>::new());
        assert!(l.is_empty() && l.queues.is_empty(), "nothing is left behind");
    }

    #[test]
    fn shared_requests_after_an_exclusive_one_are_granted_together() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Exclusive)]));
        for t in 2..=4 {
            assert!(!l.request(t, [(key(1), Mode::Shared)]));
        }
        assert!(!l.request(5, [(key(1), Mode::Exclusive)]));
        assert_eq!(released(&mut l, 1), vec![2, 3, 4]);
        assert_eq!(released(&mut l, 3), Vec::<u32>::new());
        assert_eq!(released(&mut l, 2), Vec::<u32>::new());
        assert_eq!(released(&mut l, 4), vec![5], "the writer waits for every reader");
    }

    #[test]
    fn a_key_read_and_written_is_locked_once_exclusively() {
        let mut l = OrderedLocks::default();
        assert!(l.request(1, [(key(1), Mode::Shared), (key(1), Mode::Exclusive), (key(1), Mode::Shared)]));
        assert!(!l.request(2, [(key(1), Mode::Shared)]));
        assert_eq!(released(&mut l, 1), vec![2]);
    }

    #[test]
    #[should_panic(expected = "log order")]
    fn requests_out_of_log_order_are_a_bug() {
        let mut l = OrderedLocks::default();
        l.request(2, [(key(1), Mode::Shared)]);
        l.request(1, [(key(1), Mode::Shared)]);
    }
}
