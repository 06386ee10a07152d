//! 2PL record metadata: the record's lock (holders and a FIFO of waiters), and the rules of
//! NO_WAIT and WAIT_DIE. Waiting is a future: a waiter parks its waker in a slot that the
//! releasing transaction fills, on whatever worker thread it runs.

use crate::protocols::common::TxnId;
use crate::storage::{Record, Row};
use crate::txn::Abort;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// A transaction's age for WAIT_DIE: its first attempt's start time, then its id (unique).
/// Smaller is older.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Prio(pub u64, pub TxnId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    NoWait,
    WaitDie,
}

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const CANCELLED: u8 = 2;

/// Where a waiter learns it was granted.
pub struct WaitSlot {
    state: AtomicU8,
    waker: Mutex<Option<Waker>>,
}

struct Waiter {
    txn: TxnId,
    prio: Prio,
    mode: Mode,
    slot: Arc<WaitSlot>,
}

#[derive(Default)]
pub struct LockMeta {
    exclusive: Option<(TxnId, Prio)>,
    shared: Vec<(TxnId, Prio)>,
    waiters: VecDeque<Waiter>,
}

pub enum Acquire {
    Granted,
    Wait(Arc<WaitSlot>),
    Abort(Abort),
}

impl LockMeta {
    pub fn holds(&self, txn: TxnId, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.exclusive.is_some_and(|(t, _)| t == txn),
            Mode::Shared => self.exclusive.is_some_and(|(t, _)| t == txn) || self.shared.iter().any(|(t, _)| *t == txn),
        }
    }

    fn compatible(&self, txn: TxnId, mode: Mode) -> bool {
        match mode {
            Mode::Shared => self.exclusive.is_none_or(|(t, _)| t == txn),
            Mode::Exclusive => {
                self.exclusive.is_none_or(|(t, _)| t == txn) && self.shared.iter().all(|(t, _)| *t == txn)
            }
        }
    }

    fn grant(&mut self, txn: TxnId, prio: Prio, mode: Mode) {
        match mode {
            Mode::Shared => {
                if !self.holds(txn, Mode::Shared) {
                    self.shared.push((txn, prio));
                }
            }
            Mode::Exclusive => {
                self.shared.retain(|(t, _)| *t != txn);
                self.exclusive = Some((txn, prio));
            }
        }
    }

    /// Try to take the lock. The request is blocked by every holder and every queued waiter it
    /// conflicts with (waiters count, so a stream of readers cannot starve a queued writer).
    /// NO_WAIT aborts when blocked; WAIT_DIE queues only if the requester is older than all its
    /// blockers, and dies otherwise: every wait is older-for-younger, so no deadlock can form.
    pub fn acquire(&mut self, txn: TxnId, prio: Prio, mode: Mode, policy: Policy) -> Acquire {
        if self.holds(txn, mode) {
            return Acquire::Granted;
        }
        let conflicts = |m: Mode| m == Mode::Exclusive || mode == Mode::Exclusive;
        let holders = self
            .exclusive
            .iter()
            .map(|h| (h.0, h.1, Mode::Exclusive))
            .chain(self.shared.iter().map(|h| (h.0, h.1, Mode::Shared)));
        let waiting = self
            .waiters
            .iter()
            .filter(|w| w.slot.state.load(Ordering::Acquire) == WAITING)
            .map(|w| (w.txn, w.prio, w.mode));
        let mut blocked = false;
        let mut older_than_blockers = true;
        for (t, p, m) in holders.chain(waiting) {
            if t != txn && conflicts(m) {
                blocked = true;
                older_than_blockers &= prio < p;
            }
        }
        if !blocked {
            self.grant(txn, prio, mode);
            return Acquire::Granted;
        }
        match policy {
            Policy::NoWait => Acquire::Abort(Abort::LockConflict),
            Policy::WaitDie if !older_than_blockers => Acquire::Abort(Abort::WaitDie),
            Policy::WaitDie => {
                let slot = Arc::new(WaitSlot { state: AtomicU8::new(WAITING), waker: Mutex::new(None) });
                self.waiters.push_back(Waiter { txn, prio, mode, slot: slot.clone() });
                Acquire::Wait(slot)
            }
        }
    }

    /// Release whatever `txn` holds and grant waiters in FIFO order while they fit.
    pub fn release(&mut self, txn: TxnId) {
        if self.exclusive.is_some_and(|(t, _)| t == txn) {
            self.exclusive = None;
        }
        self.shared.retain(|(t, _)| *t != txn);
        self.waiters.retain(|w| w.txn != txn || w.slot.state.load(Ordering::Acquire) != WAITING);
        while let Some(w) = self.waiters.front() {
            if w.slot.state.load(Ordering::Acquire) == CANCELLED {
                self.waiters.pop_front();
                continue;
            }
            if !self.compatible(w.txn, w.mode) {
                break;
            }
            let w = self.waiters.pop_front().expect("front exists");
            self.grant(w.txn, w.prio, w.mode);
            w.slot.state.store(GRANTED, Ordering::Release);
            let waker = w.slot.waker.lock().take();
            if let Some(wk) = waker {
                wk.wake();
            }
        }
    }

    /// Give up waiting: true if the lock was granted meanwhile (the caller then holds it).
    pub fn cancel(&mut self, slot: &Arc<WaitSlot>) -> bool {
        if slot.state.load(Ordering::Acquire) == GRANTED {
            return true;
        }
        slot.state.store(CANCELLED, Ordering::Release);
        self.waiters.retain(|w| !Arc::ptr_eq(&w.slot, slot));
        false
    }

    pub fn is_free(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty() && self.waiters.is_empty()
    }
}

/// Wait for a queued lock request to be granted (the caller bounds the wait with a deadline).
pub struct Granted<'a> {
    pub slot: &'a Arc<WaitSlot>,
}

impl Future for Granted<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.slot.state.load(Ordering::Acquire) == GRANTED {
            return Poll::Ready(());
        }
        *self.slot.waker.lock() = Some(cx.waker().clone());
        // Re-check: the grant may have landed between the load and storing the waker.
        if self.slot.state.load(Ordering::Acquire) == GRANTED {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

pub type LockRecord = Record<LockMeta>;
pub type LockRow = Row<LockMeta>;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: u64) -> Prio {
        Prio(t, t)
    }

    #[test]
    fn no_wait_aborts_on_conflict_and_shares_reads() {
        let mut l = LockMeta::default();
        assert!(matches!(l.acquire(1, p(1), Mode::Shared, Policy::NoWait), Acquire::Granted));
        assert!(matches!(l.acquire(2, p(2), Mode::Shared, Policy::NoWait), Acquire::Granted));
        assert!(matches!(l.acquire(3, p(3), Mode::Exclusive, Policy::NoWait), Acquire::Abort(Abort::LockConflict)));
        l.release(1);
        l.release(2);
        assert!(matches!(l.acquire(3, p(3), Mode::Exclusive, Policy::NoWait), Acquire::Granted));
        assert!(l.holds(3, Mode::Shared));
        l.release(3);
        assert!(l.is_free());
    }

    #[test]
    fn wait_die_older_waits_younger_dies() {
        let mut l = LockMeta::default();
        assert!(matches!(l.acquire(5, p(5), Mode::Exclusive, Policy::WaitDie), Acquire::Granted));
        // Younger than the holder: dies.
        assert!(matches!(l.acquire(9, p(9), Mode::Shared, Policy::WaitDie), Acquire::Abort(Abort::WaitDie)));
        // Older: waits, and is granted when the holder releases.
        let Acquire::Wait(slot) = l.acquire(2, p(2), Mode::Exclusive, Policy::WaitDie) else {
            panic!("older must wait")
        };
        l.release(5);
        assert_eq!(slot.state.load(Ordering::Acquire), GRANTED);
        assert!(l.holds(2, Mode::Exclusive));
    }

    #[test]
    fn queued_writer_is_not_starved_by_readers() {
        let mut l = LockMeta::default();
        assert!(matches!(l.acquire(5, p(5), Mode::Shared, Policy::WaitDie), Acquire::Granted));
        let Acquire::Wait(w) = l.acquire(3, p(3), Mode::Exclusive, Policy::WaitDie) else { panic!() };
        // A younger reader may not overtake the queued older writer: it dies.
        assert!(matches!(l.acquire(7, p(7), Mode::Shared, Policy::WaitDie), Acquire::Abort(Abort::WaitDie)));
        // An even older reader queues behind the writer.
        let Acquire::Wait(r) = l.acquire(1, p(1), Mode::Shared, Policy::WaitDie) else { panic!() };
        l.release(5);
        assert_eq!(w.state.load(Ordering::Acquire), GRANTED);
        assert_eq!(r.state.load(Ordering::Acquire), WAITING);
        l.release(3);
        assert_eq!(r.state.load(Ordering::Acquire), GRANTED);
    }

    #[test]
    fn cancelled_waiter_is_skipped() {
        let mut l = LockMeta::default();
        assert!(matches!(l.acquire(5, p(5), Mode::Exclusive, Policy::WaitDie), Acquire::Granted));
        let Acquire::Wait(a) = l.acquire(2, p(2), Mode::Exclusive, Policy::WaitDie) else { panic!() };
        assert!(!l.cancel(&a));
        l.release(5);
        assert!(l.is_free());
    }
}
