//! The record lock that the locking protocols share (2PL's whole metadata; Sundial's write
//! lock beside its lease; TicToc's and Hackwrench's later): holders and a FIFO of waiters, the
//! rules of NO_WAIT, WAIT_DIE and DETECT (wait, and let a deadlock detector end the wait), and
//! taking, waiting for and releasing a lock on a record. Waiting is a future: a waiter parks its
//! waker in a slot that the releasing transaction (or the detector, choosing it as a deadlock's
//! victim) fills, on whatever worker thread it runs.

use super::TxnId;
use crate::protocols::{OptionKind, OptionSpec};
use crate::rt::Worker;
use crate::storage::{Record, Value};
use crate::txn::{Abort, Reason, TxnResult};
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
    /// Every conflicting request waits (deadlocks can form); a detector finds the cycles of the
    /// wait-for graph and ends one wait per cycle ([`LockMeta::kill`]), and `lock_wait_us`
    /// bounds a wait the detector missed.
    Detect,
}

impl Policy {
    /// The abort of a wait that reached its bound: DETECT names its own, so that a report tells
    /// waits the detector ended from those the bound did.
    pub fn timeout_abort(self) -> Abort {
        match self {
            Policy::Detect => Abort::Protocol(DETECT_TIMEOUT),
            Policy::NoWait | Policy::WaitDie => Abort::LockTimeout,
        }
    }
}

/// DETECT: the detector chose this wait's transaction as the victim of a deadlock.
pub const DEADLOCK_VICTIM: Reason = Reason::new("deadlock-victim");
/// DETECT: a wait reached `lock_wait_us` before it was granted or chosen as a victim.
pub const DETECT_TIMEOUT: Reason = Reason::new("detect-timeout");

// A slot's states. WAITING moves once, under the record's mutex: to GRANTED (a release), to
// CANCELLED (the waiter gave up) or to VICTIM (the detector ended it).
const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const CANCELLED: u8 = 2;
const VICTIM: u8 = 3;

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
            Policy::WaitDie | Policy::Detect => {
                let slot = Arc::new(WaitSlot { state: AtomicU8::new(WAITING), waker: Mutex::new(None) });
                self.waiters.get_or_insert_with(Default::default).push_back(Waiter { prio, mode, slot: slot.clone() });
                Acquire::Wait(slot)
            }
        }
    }

    /// The transactions the queued request of `slot` waits for: the holders it conflicts with
    /// and the waiters queued ahead of it that it conflicts with (as [`LockMeta::acquire`]
    /// counts blockers), each once, in order; `None` if it no longer waits here.
    pub fn blockers(&self, slot: &Arc<WaitSlot>) -> Option<Vec<TxnId>> {
        let queue = self.waiters.as_ref()?;
        let at = queue.iter().position(|w| Arc::ptr_eq(&w.slot, slot))?;
        let me = &queue[at];
        if me.slot.state.load(Ordering::Acquire) != WAITING {
            return None;
        }
        let (txn, mode) = (me.prio.1, me.mode);
        let conflicts = |m: Mode| m == Mode::Exclusive || mode == Mode::Exclusive;
        let ahead = queue.iter().take(at).filter(|w| w.slot.state.load(Ordering::Acquire) == WAITING);
        let mut out: Vec<TxnId> = self
            .holders()
            .chain(ahead.map(|w| (w.prio, w.mode)))
            .filter(|(p, m)| p.1 != txn && conflicts(*m))
            .map(|(p, _)| p.1)
            .collect();
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// End the queued request of `slot` as a deadlock's victim: its waiter wakes and aborts
    /// with [`DEADLOCK_VICTIM`], and the requests queued behind it that now fit are granted.
    /// False if it no longer waited (granted or given up meanwhile): nothing changes.
    pub fn kill(&mut self, slot: &Arc<WaitSlot>) -> bool {
        if slot.state.load(Ordering::Acquire) != WAITING {
            return false;
        }
        slot.state.store(VICTIM, Ordering::Release);
        if let Some(w) = &mut self.waiters {
            w.retain(|w| !Arc::ptr_eq(&w.slot, slot));
        }
        self.grant_waiters();
        let waker = slot.waker.lock().take();
        if let Some(wk) = waker {
            wk.wake();
        }
        debug_assert!(self.well_formed(), "a kill broke the lock's rule");
        true
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
        if let Some(waiters) = &mut self.waiters {
            waiters.retain(|w| w.prio.1 != txn || w.slot.state.load(Ordering::Acquire) != WAITING);
        }
        self.grant_waiters();
        debug_assert!(self.well_formed(), "a release broke the lock's rule");
        debug_assert!(!self.holds(txn, Mode::Shared), "a released transaction still holds");
    }

    /// Grant the queued requests in FIFO order while they fit.
    fn grant_waiters(&mut self) {
        // Taken out while `grant` and `compatible` borrow the rest, and always put back.
        let Some(mut waiters) = self.waiters.take() else { return };
        while let Some(w) = waiters.front() {
            if w.slot.state.load(Ordering::Acquire) != WAITING {
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
    }

    /// Give up waiting: true if the lock was granted meanwhile (the caller then holds it). The
    /// requests queued behind it that now fit are granted (a reader behind a writer that gave
    /// up must not wait for the next release: under DETECT, that wait would have no edge).
    pub fn cancel(&mut self, slot: &Arc<WaitSlot>) -> bool {
        match slot.state.load(Ordering::Acquire) {
            GRANTED => return true,
            VICTIM => return false,
            _ => {}
        }
        slot.state.store(CANCELLED, Ordering::Release);
        if let Some(w) = &mut self.waiters {
            w.retain(|w| !Arc::ptr_eq(&w.slot, slot));
        }
        self.grant_waiters();
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

/// Ready when the request is granted, or ended as a deadlock's victim.
impl Future for Granted<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let ended = |s: &WaitSlot| matches!(s.state.load(Ordering::Acquire), GRANTED | VICTIM);
        if ended(self.slot) {
            return Poll::Ready(());
        }
        *self.slot.waker.lock() = Some(cx.waker().clone());
        // Re-check: the grant may have landed between the load and storing the waker.
        if ended(self.slot) {
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

/// Wait (at most `wait_us`) for a queued request, then read the value (WAIT_DIE's bound:
/// `lock-timeout`).
pub async fn wait_lock<M: Locked>(
    w: &Rc<Worker>,
    rec: &Record<M>,
    slot: Arc<WaitSlot>,
    wait_us: u64,
) -> TxnResult<Option<Value>> {
    wait_lock_under(w, rec, slot, wait_us, Policy::WaitDie).await
}

/// [`wait_lock`] under `policy`: a wait that reaches its bound aborts with the policy's
/// [`Policy::timeout_abort`], one the detector ended with [`DEADLOCK_VICTIM`].
pub async fn wait_lock_under<M: Locked>(
    w: &Rc<Worker>,
    rec: &Record<M>,
    slot: Arc<WaitSlot>,
    wait_us: u64,
    policy: Policy,
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
    if slot.state.load(Ordering::Acquire) == VICTIM {
        return Err(Abort::Protocol(DEADLOCK_VICTIM));
    }
    if got || row.meta.lock_word().cancel(&slot) {
        Ok(row.value.clone())
    } else {
        Err(policy.timeout_abort())
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
    fn detect_always_waits_and_names_the_blockers() {
        let mut l = held_by(5, Mode::Shared);
        // Younger than the holder: WAIT_DIE would die; DETECT waits.
        let Acquire::Wait(w9) = l.acquire(9, p(9), Mode::Exclusive, Policy::Detect) else { panic!("detect waits") };
        assert_eq!(l.blockers(&w9), Some(vec![5]));
        // A reader behind the queued writer waits for it, not for the compatible holder.
        let Acquire::Wait(r7) = l.acquire(7, p(7), Mode::Shared, Policy::Detect) else { panic!() };
        assert_eq!(l.blockers(&r7), Some(vec![9]));
        // The holder upgrading waits for nobody but the writer queued ahead of it.
        let Acquire::Wait(u5) = l.acquire(5, p(5), Mode::Exclusive, Policy::Detect) else { panic!() };
        assert_eq!(l.blockers(&u5), Some(vec![7, 9]));
        l.release(5);
        assert_eq!(w9.state.load(Ordering::Acquire), GRANTED);
        assert_eq!(l.blockers(&w9), None, "granted: no longer waits");
        assert_eq!(l.blockers(&r7), Some(vec![9]));
    }

    #[test]
    fn a_killed_waiter_wakes_as_a_victim_and_lets_the_queue_move() {
        let mut l = held_by(5, Mode::Shared);
        let Acquire::Wait(w9) = l.acquire(9, p(9), Mode::Exclusive, Policy::Detect) else { panic!() };
        let Acquire::Wait(r7) = l.acquire(7, p(7), Mode::Shared, Policy::Detect) else { panic!() };
        assert!(l.kill(&w9));
        assert_eq!(w9.state.load(Ordering::Acquire), VICTIM);
        // The reader queued behind the victim fits beside the shared holder: granted at once.
        assert_eq!(r7.state.load(Ordering::Acquire), GRANTED);
        assert!(l.holds(7, Mode::Shared));
        assert!(!l.kill(&w9), "a wait ends once");
        assert!(!l.cancel(&w9), "a victim is not granted by giving up");
        assert_eq!(w9.state.load(Ordering::Acquire), VICTIM);
        assert_eq!(Policy::Detect.timeout_abort(), Abort::Protocol(DETECT_TIMEOUT));
        assert_eq!(Policy::WaitDie.timeout_abort(), Abort::LockTimeout);
    }

    #[test]
    fn a_waiter_that_gives_up_lets_the_queue_move() {
        let mut l = held_by(5, Mode::Shared);
        let Acquire::Wait(w9) = l.acquire(9, p(9), Mode::Exclusive, Policy::Detect) else { panic!() };
        let Acquire::Wait(r7) = l.acquire(7, p(7), Mode::Shared, Policy::Detect) else { panic!() };
        assert!(!l.cancel(&w9));
        assert_eq!(r7.state.load(Ordering::Acquire), GRANTED);
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
