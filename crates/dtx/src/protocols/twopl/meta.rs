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
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
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
            Mode::Shared => {
                self.exclusive.is_some_and(|(t, _)| t == txn)
                    || self.shared.iter().any(|(t, _)| *t == txn)
            }
        }
    }

    fn compatible(&self, txn: TxnId, mode: Mode) -> bool {
        match mode {
            Mode::Shared => self.exclusive.is_none_or(|(t, _)| t == txn),
            Mode::Exclusive => {
                self.exclusive.is_none_or(|(t, _)| t == txn)
                    && self.shared.iter().all(|(t, _)| *t == txn)
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

    /// Try to take the lock; under WAIT_DIE an older requester queues, a younger one dies.
    pub fn acquire(&mut self, txn: TxnId, prio: Prio, mode: Mode, policy: Policy) -> Acquire {
        if self.holds(txn, mode) {
            return Acquire::Granted;
        }
        if self.compatible(txn, mode) {
            self.grant(txn, prio, mode);
            return Acquire::Granted;
        }
        match policy {
            Policy::NoWait => Acquire::Abort(Abort::LockConflict),
            Policy::WaitDie => {
                let older_than_all = self
                    .exclusive
                    .iter()
                    .chain(self.shared.iter())
                    .all(|(t, p)| *t == txn || prio < *p);
                if !older_than_all {
                    return Acquire::Abort(Abort::WaitDie);
                }
                let slot = Arc::new(WaitSlot {
                    state: AtomicU8::new(WAITING),
                    waker: Mutex::new(None),
                });
                self.waiters.push_back(Waiter {
                    txn,
                    prio,
                    mode,
                    slot: slot.clone(),
                });
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
        self.waiters
            .retain(|w| w.txn != txn || w.slot.state.load(Ordering::Acquire) != WAITING);
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
