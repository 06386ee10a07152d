//! Commits waiting for their release, so that their clients do not ([`Attempt::defer_ack`]).
//!
//! A protocol with early lock release (or epochs, or watermarks) commits in memory and names
//! the point its acknowledgement waits for in its acknowledgement source
//! ([`crate::rt::release`]: an LSN of the node's log, an epoch, a watermark timestamp). The
//! driver's client hands such a commit here and starts its next transaction at once, as Silo's
//! workers go on while their epoch is persisted; the commit is acknowledged (counted, its
//! history line written, its latency taken from the client's first attempt to now) once its
//! point is released, or reported aborted (`rolled-back`) once the source rolls it back. One
//! task per worker waits for the oldest pending point, so a flush wakes one task per worker
//! rather than one per commit. A crash leaves the pending commits of unknown outcome, as it
//! leaves the attempts in flight.
//!
//! [`Attempt::defer_ack`]: crate::protocols::Attempt

use crate::rt::release::{AckSource, Release};
use crate::rt::Worker;
use crate::txn::{TxnOutput, TxnRequest};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

/// A commit waiting for its release.
pub struct Pending {
    /// Acknowledged once the source releases this point.
    pub point: u64,
    /// Its kind and class, taken at commit (the metrics count them at the acknowledgement).
    pub kind: &'static str,
    pub class: u8,
    /// Its request and output, kept only when histories are kept or the workload watches
    /// commits ([`crate::workloads::Workload::watches_commits`]).
    pub txn: Option<(TxnRequest, TxnOutput)>,
    /// When the client's first attempt of this transaction started, ns.
    pub first_ns: u64,
    /// When it committed in memory, ns.
    pub committed_ns: u64,
    /// Its history id and start time (µs), when histories are kept.
    pub history: Option<(u64, u64)>,
}

/// What deciding a commit does (the driver's bookkeeping): released (true) or rolled back,
/// and the time it happens (ns).
pub type Acknowledge = Box<dyn Fn(Pending, bool, u64)>;

/// One worker's commits waiting for their release, oldest first.
pub struct Acks {
    source: Arc<dyn AckSource>,
    queue: RefCell<VecDeque<Pending>>,
    /// While more than this many wait, a client that queued one more waits for room (the disk
    /// cannot keep up, and acknowledging later than committing must stay bounded).
    capacity: usize,
    /// The task that waits for the oldest commit runs (it ends whenever the queue empties).
    pumping: Cell<bool>,
    /// Clients waiting for room: a client polled again before a wake (its race against the
    /// run's end) adds its waker again; every pass of the pump takes them all.
    room_waiters: RefCell<Vec<Waker>>,
    acknowledge: Acknowledge,
}

impl Acks {
    pub fn new(source: Arc<dyn AckSource>, capacity: usize, acknowledge: Acknowledge) -> Rc<Acks> {
        assert!(capacity > 0, "an ack queue with no room");
        let queue = RefCell::new(VecDeque::new());
        let (pumping, room_waiters) = (Cell::new(false), RefCell::new(Vec::new()));
        Rc::new(Acks { source, queue, capacity, pumping, room_waiters, acknowledge })
    }

    /// Wait while more commits wait than the capacity (a client pushes first, then waits here:
    /// so the queue exceeds its capacity by at most the worker's clients). Woken when the queue
    /// drains: a full queue is the steady state of a fast protocol under group commit, and 64
    /// clients polling it on timers cost more than its transactions.
    pub async fn room(&self) {
        std::future::poll_fn(|cx| {
            if self.queue.borrow().len() <= self.capacity {
                return Poll::Ready(());
            }
            self.room_waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// The queue shrank: every client waiting for room looks again.
    fn wake_room(&self) {
        let waiters = std::mem::take(&mut *self.room_waiters.borrow_mut());
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Hand a commit over; it is decided once its point is.
    pub fn push(self: &Rc<Self>, w: &Rc<Worker>, pending: Pending) {
        self.queue.borrow_mut().push_back(pending);
        if !self.pumping.replace(true) {
            let (me, w2) = (self.clone(), w.clone());
            w.spawn(async move { me.pump(&w2).await });
        }
    }

    /// Commits still waiting.
    pub fn len(&self) -> usize {
        self.queue.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take every waiting commit (a crash: none of them will be acknowledged).
    pub fn take_all(&self) -> Vec<Pending> {
        let all = self.queue.borrow_mut().drain(..).collect();
        self.wake_room();
        all
    }

    /// Wait for the oldest commit's point, decide every commit decided by then, again until
    /// none waits. A commit queued behind one with a later point waits for it: acknowledged
    /// late, never early.
    async fn pump(&self, w: &Rc<Worker>) {
        loop {
            let oldest = self.queue.borrow().front().map(|p| p.point);
            let Some(point) = oldest else {
                self.pumping.set(false);
                return;
            };
            self.source.decided(point).await;
            let now_ns = w.now_ns();
            loop {
                let next = {
                    let mut q = self.queue.borrow_mut();
                    match q.front().map(|p| self.source.outcome(p.point)) {
                        Some(Release::Released) => q.pop_front().map(|p| (p, true)),
                        Some(Release::RolledBack) => q.pop_front().map(|p| (p, false)),
                        Some(Release::Pending) | None => None,
                    }
                };
                match next {
                    Some((p, released)) => (self.acknowledge)(p, released, now_ns),
                    None => break,
                }
            }
            self.wake_room();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Addr, FaultPlan, LatencyModel};
    use crate::rt::log::{NodeLog, SimImage};
    use crate::rt::release::ReleasePoints;
    use crate::rt::sim::SimWorld;
    use crate::rt::WorkerConfig;

    fn pending(point: u64) -> Pending {
        let req = TxnRequest::new("test", 0, ());
        let txn = Some((req, TxnOutput::default()));
        Pending { point, kind: "test", class: 0, txn, first_ns: 0, committed_ns: 0, history: None }
    }

    fn world_with_worker() -> (SimWorld, Rc<Worker>) {
        let mut world = SimWorld::new(1, 1, LatencyModel::default(), FaultPlan::default(), 1);
        let addr = Addr::new(0, 0);
        let w = Rc::new(Worker::new(addr, 1, world.clock(), world.executor_for(addr), &WorkerConfig::default()));
        world.add_worker(w.clone());
        (world, w)
    }

    /// Flush everything appended to the simulated log's only lane.
    fn flush(log: &NodeLog) {
        assert!(log.sim_begin_flush(0).is_some(), "something to flush");
        log.sim_finish_flush(0);
    }

    #[test]
    fn a_commit_is_acknowledged_once_its_lsn_is_durable_and_never_before_one_queued_ahead() {
        let (mut world, w) = world_with_worker();
        let log = NodeLog::simulated(SimImage::default(), 1).expect("an empty image").log;
        let acked = Rc::new(RefCell::new(Vec::new()));
        let seen = acked.clone();
        let acks = Acks::new(
            log.clone(),
            4,
            Box::new(move |p: Pending, released, _now_ns| {
                assert!(released, "a log never rolls back");
                seen.borrow_mut().push(p.point)
            }),
        );

        let first = log.append(b"first").expect("appended");
        acks.push(&w, pending(first));
        world.run_until(1_000_000, || false);
        assert!(acked.borrow().is_empty(), "acknowledged before its record is durable");
        flush(&log);
        let second = log.append(b"second").expect("appended");
        // Queued behind a later LSN: it waits for that one, acknowledged late rather than early.
        let later = log.append(b"later").expect("appended");
        acks.push(&w, pending(later));
        acks.push(&w, pending(first));
        world.run_until(2_000_000, || false);
        assert_eq!(*acked.borrow(), vec![first], "only the durable commit at the front");
        assert_eq!(acks.len(), 2);
        flush(&log);
        world.run_until(3_000_000, || false);
        assert_eq!(*acked.borrow(), vec![first, later, first]);
        assert!(acks.is_empty() && second < later);
    }

    #[test]
    fn a_crash_takes_every_waiting_commit() {
        let log = NodeLog::simulated(SimImage::default(), 1).expect("an empty image").log;
        let acks = Acks::new(log.clone(), 1, Box::new(|_, _, _| panic!("nothing is durable")));
        let (mut world, w) = world_with_worker();
        for record in [b"a", b"b"] {
            acks.push(&w, pending(log.append(record).expect("appended")));
        }
        world.run_until(1_000_000, || false);
        let taken: Vec<u64> = acks.take_all().iter().map(|p| p.point).collect();
        assert_eq!(taken, vec![1, 2]);
        assert!(acks.is_empty());
    }

    /// Commits released by epoch: acknowledged in order once their epoch is released, and
    /// those of an epoch rolled back after a failure reported as such, never acknowledged.
    #[test]
    fn commits_of_a_rolled_back_epoch_are_reported_rolled_back_in_order() {
        let (mut world, w) = world_with_worker();
        let epochs = ReleasePoints::new();
        let decided = Rc::new(RefCell::new(Vec::new()));
        let seen = decided.clone();
        let acks = Acks::new(
            epochs.clone(),
            8,
            Box::new(move |p: Pending, released, _| seen.borrow_mut().push((p.point, released))),
        );
        for epoch in [1, 1, 2, 3, 3, 4] {
            acks.push(&w, pending(epoch));
        }
        world.run_until(1_000_000, || false);
        assert!(decided.borrow().is_empty(), "no epoch is decided yet");
        epochs.release_through(1);
        world.run_until(2_000_000, || false);
        assert_eq!(*decided.borrow(), vec![(1, true), (1, true)]);
        // Epoch 3 failed: its commits are undone; 2 and 4 commit.
        epochs.roll_back(3, 3);
        world.run_until(3_000_000, || false);
        assert_eq!(decided.borrow().len(), 2, "epoch 2 still undecided holds back what follows it");
        epochs.release_through(4);
        world.run_until(4_000_000, || false);
        let expected = vec![(1, true), (1, true), (2, true), (3, false), (3, false), (4, true)];
        assert_eq!(*decided.borrow(), expected);
        assert!(acks.is_empty());
    }

    /// A client past the capacity waits for room without a timer, and is woken when the pump
    /// has acknowledged enough, or when a crash takes every waiting commit.
    #[test]
    fn a_client_waits_for_room_until_the_queue_drains_or_a_crash_empties_it() {
        let (mut world, w) = world_with_worker();
        let epochs = ReleasePoints::new();
        let acks = Acks::new(epochs.clone(), 1, Box::new(|_, _, _| {}));
        for epoch in [1, 2, 3] {
            acks.push(&w, pending(epoch));
        }
        let roomed = Rc::new(Cell::new(0));
        for _ in 0..2 {
            let (acks, roomed) = (acks.clone(), roomed.clone());
            w.spawn(async move {
                acks.room().await;
                roomed.set(roomed.get() + 1);
            });
        }
        world.run_until(1_000_000, || false);
        assert_eq!(roomed.get(), 0, "three waiting, room for one");
        epochs.release_through(1);
        world.run_until(2_000_000, || false);
        assert_eq!(roomed.get(), 0, "two still waiting");
        epochs.release_through(2);
        world.run_until(3_000_000, || false);
        assert_eq!(roomed.get(), 2, "both woken once one is left");
        let more = acks.clone();
        acks.push(&w, pending(9));
        w.spawn(async move { more.room().await });
        world.run_until(4_000_000, || false);
        assert_eq!(acks.take_all().len(), 2);
        world.run_until(5_000_000, || false);
        assert!(acks.room_waiters.borrow().is_empty(), "the crash woke the waiting client");
    }
}
