//! The record lock that the locking protocols share (2PL's whole metadata; Sundial's write
//! lock beside its lease; TicToc's and Hackwrench's later): holders and a FIFO of waiters, the
//! rules of NO_WAIT and WAIT_DIE, and taking, waiting for and releasing a lock on a record.
//! Waiting is a future: a waiter parks its waker in a slot that the releasing transaction
//! fills, on whatever worker thread it runs.

use super::TxnId;
use crate::protocols::{OptionKind, OptionSpec};
use crate::rt::Worker;
use crate::storage::{Record, Value};
use crate::txn::{Abort, TxnResult};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// The option of a protocol whose transactions wait for record locks (`2pl-waitdie`, Sundial).
pub const LOCK_WAIT_OPTION: OptionSpec = OptionSpec {
    name: "lock_wait_us",
    kind: OptionKind::U64 { min: 1, max: 60_000_000 },
    default: "500000",
    help: "longest an older transaction waits for a lock before it aborts (lock-timeout)",
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// A transaction's age for WAIT_DIE: its first attempt's start time, then its id (unique).
/// Smaller is older.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Prio(pub u64, pub TxnId);

const NONE: TxnId = 0;

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
    prio: Prio,
    mode: Mode,
    slot: Arc<WaitSlot>,
}

/// The lock word of a record, small enough that a record (value, lock, mutex) fits one cache
/// line. Most records have at most one holder, so the first holder sits inline with its mode
/// (txn id 0 = free; ids start at 1); further shared holders and the waiters live in boxes
/// allocated on first use.
// The boxes are deliberate: an empty `Option<Box<_>>` is one word where a `Vec` is three, and
// that is what keeps a locked record inside one cache line.
#[allow(clippy::box_collection)]
#[derive(Default)]
pub struct LockMeta {
    first: Prio,
    first_exclusive: bool,
    more_shared: Option<Box<Vec<Prio>>>,
    waiters: Option<Box<VecDeque<Waiter>>>,
}

pub enum Acquire {
    Granted,
    Wait(Arc<WaitSlot>),
    Abort(Abort),
}

impl LockMeta {
    /// Every holder with its mode.
    fn holders(&self) -> impl Iterator<Item = (Prio, Mode)> + '_ {
        let first = (self.first.1 != NONE)
            .then_some((self.first, if self.first_exclusive { Mode::Exclusive } else { Mode::Shared }));
        first.into_iter().chain(self.more_shared.iter().flat_map(|v| v.iter().map(|p| (*p, Mode::Shared))))
    }

    fn waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.waiters.iter().flat_map(|w| w.iter())
    }

    /// The lock's rule: an exclusive holder holds alone, the inline slot is filled before the
    /// overflow list, and no transaction holds twice.
    fn well_formed(&self) -> bool {
        let more = self.more_shared.as_ref().map_or(0, |m| m.len());
        let alone = !self.first_exclusive || more == 0;
        let inline_first = self.first.1 != NONE || more == 0;
        let mut ids: Vec<TxnId> = self.holders().map(|(p, _)| p.1).collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        alone && inline_first && ids.len() == n
    }

    pub fn holds(&self, txn: TxnId, mode: Mode) -> bool {
        self.holders().any(|(p, m)| p.1 == txn && (mode == Mode::Shared || m == Mode::Exclusive))
    }

    /// Another transaction holds the lock exclusively (shared holders let a lease be extended).
    pub fn held_exclusive_by_other(&self, txn: TxnId) -> bool {
        self.holders().any(|(p, m)| p.1 != txn && m == Mode::Exclusive)
    }

    fn compatible(&self, txn: TxnId, mode: Mode) -> bool {
        self.holders().all(|(p, m)| p.1 == txn || (m == Mode::Shared && mode == Mode::Shared))
    }

    fn remove_holder(&mut self, txn: TxnId) {
        if let Some(more) = &mut self.more_shared {
            more.retain(|p| p.1 != txn);
        }
        if self.first.1 == txn {
            // Promote another shared holder into the inline slot.
            match self.more_shared.as_mut().and_then(|m| m.pop()) {
                Some(p) => {
                    self.first = p;
                    self.first_exclusive = false;
                }
                None => {
                    self.first = Prio::default();
                    self.first_exclusive = false;
                }
            }
        }
    }

    fn grant(&mut self, prio: Prio, mode: Mode) {
        let txn = prio.1;
        if mode == Mode::Exclusive {
            // An upgrade drops the shared hold; the caller checked no one else holds.
            self.remove_holder(txn);
            debug_assert!(self.holders().next().is_none(), "exclusive grant over other holders");
            self.first = prio;
            self.first_exclusive = true;
        } else if !self.holds(txn, Mode::Shared) {
            if self.first.1 == NONE {
                self.first = prio;
                self.first_exclusive = false;
            } else {
                self.more_shared.get_or_insert_with(Default::default).push(prio);
            }
        }
    }

    /// Try to take the lock. The request is blocked by every holder and every queued waiter it
    /// conflicts with (waiters count, so a stream of readers cannot starve a queued writer).
    /// NO_WAIT aborts when blocked; WAIT_DIE queues only if the requester is older than all its
    /// blockers, and dies otherwise: every wait is older-for-younger, so no deadlock can form.
    pub fn acquire(&mut self, txn: TxnId, prio: Prio, mode: Mode, policy: Policy) -> Acquire {
        debug_assert_eq!(prio.1, txn, "a priority carries its transaction id");
        debug_assert_ne!(txn, NONE, "transaction id 0 means `no holder`");
        if self.holds(txn, mode) {
            return Acquire::Granted;
        }
        let conflicts = |m: Mode| m == Mode::Exclusive || mode == Mode::Exclusive;
        let holders = self.holders();
        let waiting =
            self.waiters().filter(|w| w.slot.state.load(Ordering::Acquire) == WAITING).map(|w| (w.prio, w.mode));
        let mut blocked = false;
        let mut older_than_blockers = true;
        for (p, m) in holders.chain(waiting) {
            if p.1 != txn && conflicts(m) {
                blocked = true;
                older_than_blockers &= prio < p;
            }
        }
        if !blocked {
            self.grant(prio, mode);
            debug_assert!(self.well_formed(), "a grant broke the lock's rule");
            return Acquire::Granted;
        }
        match policy {
            Policy::NoWait => Acquire::Abort(Abort::LockConflict),
            Policy::WaitDie if !older_than_blockers => Acquire::Abort(Abort::WaitDie),
            Policy::WaitDie => {
                let slot = Arc::new(WaitSlot { state: AtomicU8::new(WAITING), waker: Mutex::new(None) });
                self.waiters.get_or_insert_with(Default::default).push_back(Waiter { prio, mode, slot: slot.clone() });
                Acquire::Wait(slot)
            }
        }
    }

    /// Release whatever `txn` holds and grant waiters in FIFO order while they fit.
    ///
    /// An emptied queue is kept, not freed: it was allocated by the thread of the transaction
    /// that first waited here, and the releasing transaction often runs on another worker. A
    /// `free` into another thread's malloc arena takes that arena's lock, and under WAIT_DIE those
    /// frees had the workers sleeping on each other's arena locks (84% of their context switches,
    /// 12,000 a second at one node).
    pub fn release(&mut self, txn: TxnId) {
        self.remove_holder(txn);
        // Taken out while `grant` and `compatible` borrow the rest, and always put back.
        let Some(mut waiters) = self.waiters.take() else { return };
        waiters.retain(|w| w.prio.1 != txn || w.slot.state.load(Ordering::Acquire) != WAITING);
        while let Some(w) = waiters.front() {
            if w.slot.state.load(Ordering::Acquire) == CANCELLED {
                waiters.pop_front();
                continue;
            }
            if !self.compatible(w.prio.1, w.mode) {
                break;
            }
            let w = waiters.pop_front().expect("front exists");
            self.grant(w.prio, w.mode);
            w.slot.state.store(GRANTED, Ordering::Release);
            let waker = w.slot.waker.lock().take();
            if let Some(wk) = waker {
                wk.wake();
            }
        }
        self.waiters = Some(waiters);
        debug_assert!(self.well_formed(), "a release broke the lock's rule");
        debug_assert!(!self.holds(txn, Mode::Shared), "a released transaction still holds");
    }

    /// Give up waiting: true if the lock was granted meanwhile (the caller then holds it).
    pub fn cancel(&mut self, slot: &Arc<WaitSlot>) -> bool {
        if slot.state.load(Ordering::Acquire) == GRANTED {
            return true;
        }
        slot.state.store(CANCELLED, Ordering::Release);
        if let Some(w) = &mut self.waiters {
            w.retain(|w| !Arc::ptr_eq(&w.slot, slot));
        }
        false
    }

    /// Some transaction holds the lock (waiters aside).
    pub fn is_held(&self) -> bool {
        self.holders().next().is_some()
    }

    pub fn is_free(&self) -> bool {
        self.holders().next().is_none() && self.waiters().next().is_none()
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

/// Record metadata that carries a record lock: 2PL's own, and Sundial's beside its lease (its
/// write-write conflicts are 2PL WAIT_DIE), so that both take, wait for and release locks through
/// the same code ([`try_lock_rec`], [`wait_lock`], [`release_recs`]).
pub trait Locked: Send {
    fn lock_word(&mut self) -> &mut LockMeta;
}

impl Locked for LockMeta {
    fn lock_word(&mut self) -> &mut LockMeta {
        self
    }
}

impl super::TxnMeta for LockMeta {}

/// The outcome of asking for a lock without waiting.
pub enum LockStep<'s, M = LockMeta> {
    Done(Option<Value>),
    Wait(&'s Record<M>, Arc<WaitSlot>),
}

/// Ask for `rec`'s lock without waiting: granted (with the value), queued, or refused.
pub fn try_lock_rec<M: Locked>(
    rec: &Record<M>,
    txn: TxnId,
    prio: Prio,
    mode: Mode,
    policy: Policy,
) -> TxnResult<LockStep<'_, M>> {
    let mut row = rec.lock();
    match row.meta.lock_word().acquire(txn, prio, mode, policy) {
        Acquire::Granted => Ok(LockStep::Done(row.value.clone())),
        Acquire::Abort(a) => Err(a),
        Acquire::Wait(slot) => {
            drop(row);
            Ok(LockStep::Wait(rec, slot))
        }
    }
}

/// Wait (at most `wait_us`) for a queued request, then read the value.
pub async fn wait_lock<M: Locked>(
    w: &Rc<Worker>,
    rec: &Record<M>,
    slot: Arc<WaitSlot>,
    wait_us: u64,
) -> TxnResult<Option<Value>> {
    w.count("lock-waits", 1);
    let mut sleep = w.sleep_us(wait_us);
    let mut granted = Granted { slot: &slot };
    let got = std::future::poll_fn(|cx| {
        if Pin::new(&mut granted).poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        if Pin::new(&mut sleep).poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await;
    let mut row = rec.lock();
    if got || row.meta.lock_word().cancel(&slot) {
        Ok(row.value.clone())
    } else {
        Err(Abort::LockTimeout)
    }
}

/// Release what `txn` holds on these records.
pub fn release_recs<'s, M: Locked + 's>(txn: TxnId, recs: impl Iterator<Item = &'s Record<M>>) {
    for rec in recs {
        rec.lock().meta.lock_word().release(txn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: u64) -> Prio {
        Prio(t, t)
    }

    /// A lock that `t` was just granted in `mode` (asserted) under WAIT_DIE.
    fn held_by(t: TxnId, mode: Mode) -> LockMeta {
        let mut l = LockMeta::default();
        assert!(matches!(l.acquire(t, p(t), mode, Policy::WaitDie), Acquire::Granted));
        l
    }

    #[test]
    fn a_locked_record_fits_one_cache_line() {
        assert!(std::mem::size_of::<crate::storage::Record<LockMeta>>() <= 64);
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
        let mut l = held_by(5, Mode::Exclusive);
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
        let mut l = held_by(5, Mode::Shared);
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
    fn many_shared_holders_then_an_upgrade() {
        let mut l = LockMeta::default();
        for t in 1..=4 {
            assert!(matches!(l.acquire(t, p(t), Mode::Shared, Policy::NoWait), Acquire::Granted));
        }
        assert!(matches!(l.acquire(2, p(2), Mode::Exclusive, Policy::NoWait), Acquire::Abort(Abort::LockConflict)));
        for t in [1, 3, 4] {
            l.release(t);
        }
        assert!(l.holds(2, Mode::Shared) && !l.holds(2, Mode::Exclusive));
        assert!(matches!(l.acquire(2, p(2), Mode::Exclusive, Policy::NoWait), Acquire::Granted));
        assert!(l.holds(2, Mode::Exclusive));
        assert!(matches!(l.acquire(5, p(5), Mode::Shared, Policy::NoWait), Acquire::Abort(Abort::LockConflict)));
        l.release(2);
        assert!(l.is_free());
    }

    #[test]
    fn cancelled_waiter_is_skipped() {
        let mut l = held_by(5, Mode::Exclusive);
        let Acquire::Wait(a) = l.acquire(2, p(2), Mode::Exclusive, Policy::WaitDie) else { panic!() };
        assert!(!l.cancel(&a));
        l.release(5);
        assert!(l.is_free());
    }
}
