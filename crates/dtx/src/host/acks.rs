//! Commits waiting for the disk, so that their clients do not ([`Attempt::defer_ack`]).
//!
//! A protocol with early lock release commits in memory and names the LSN its acknowledgement
//! waits for. The driver's client hands such a commit here and starts its next transaction at
//! once, as Silo's workers go on while their epoch is persisted; the commit is acknowledged
//! (counted, its history line written, its latency taken from the client's first attempt to
//! now) once the log is durable up to that LSN. One task per worker waits for the oldest
//! pending LSN, so a flush wakes one task per worker rather than one per commit. A crash leaves
//! the pending commits of unknown outcome, as it leaves the attempts in flight.
//!
//! [`Attempt::defer_ack`]: crate::protocols::Attempt

use crate::rt::log::NodeLog;
use crate::rt::Worker;
use crate::txn::{TxnOutput, TxnRequest};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

/// How often a client waiting for room looks again.
const ROOM_POLL_US: u64 = 200;

/// A commit waiting for the log.
pub struct Pending {
    /// Acknowledged once the log is durable up to here.
    pub lsn: u64,
    pub req: TxnRequest,
    pub out: TxnOutput,
    /// When the client's first attempt of this transaction started, ns.
    pub first_ns: u64,
    /// When it committed in memory, ns.
    pub committed_ns: u64,
    /// Its history id and start time (µs), when histories are kept.
    pub history: Option<(u64, u64)>,
}

/// What acknowledging a commit does (the driver's bookkeeping), given the time it happens (ns).
pub type Acknowledge = Box<dyn Fn(Pending, u64)>;

/// One worker's commits waiting for its node's log, oldest first.
pub struct Acks {
    log: Arc<NodeLog>,
    queue: RefCell<VecDeque<Pending>>,
    /// While more than this many wait, a client that queued one more waits for room (the disk
    /// cannot keep up, and acknowledging later than committing must stay bounded).
    capacity: usize,
    /// The task that waits for the oldest commit runs (it ends whenever the queue empties).
    pumping: Cell<bool>,
    acknowledge: Acknowledge,
}

impl Acks {
    pub fn new(log: Arc<NodeLog>, capacity: usize, acknowledge: Acknowledge) -> Rc<Acks> {
        assert!(capacity > 0, "an ack queue with no room");
        let queue = RefCell::new(VecDeque::new());
        Rc::new(Acks { log, queue, capacity, pumping: Cell::new(false), acknowledge })
    }

    /// Wait while more commits wait than the capacity (a client pushes first, then waits here:
    /// so the queue exceeds its capacity by at most the worker's clients).
    pub async fn room(&self, w: &Rc<Worker>) {
        while self.queue.borrow().len() > self.capacity {
            w.sleep_us(ROOM_POLL_US).await;
        }
    }

    /// Hand a commit over; it is acknowledged once its LSN is durable.
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
        self.queue.borrow_mut().drain(..).collect()
    }

    /// Wait for the oldest commit's LSN, acknowledge every commit durable by then, again until
    /// none waits. A commit queued behind one with a later LSN waits for it: acknowledged late,
    /// never early.
    async fn pump(&self, w: &Rc<Worker>) {
        loop {
            let oldest = self.queue.borrow().front().map(|p| p.lsn);
            let Some(lsn) = oldest else {
                self.pumping.set(false);
                return;
            };
            self.log.wait(lsn).await;
            let durable = self.log.durable_lsn();
            let now_ns = w.now_ns();
            loop {
                let next = {
                    let mut q = self.queue.borrow_mut();
                    if q.front().is_some_and(|p| p.lsn <= durable) {
                        q.pop_front()
                    } else {
                        None
                    }
                };
                match next {
                    Some(p) => (self.acknowledge)(p, now_ns),
                    None => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Addr, FaultPlan, LatencyModel};
    use crate::rt::log::SimImage;
    use crate::rt::sim::SimWorld;
    use crate::rt::WorkerConfig;

    fn pending(lsn: u64) -> Pending {
        let req = TxnRequest::new("test", 0, ());
        Pending { lsn, req, out: TxnOutput::default(), first_ns: 0, committed_ns: 0, history: None }
    }

    /// Flush everything appended to the simulated log's only lane.
    fn flush(log: &NodeLog) {
        assert!(log.sim_begin_flush(0).is_some(), "something to flush");
        log.sim_finish_flush(0);
    }

    #[test]
    fn a_commit_is_acknowledged_once_its_lsn_is_durable_and_never_before_one_queued_ahead() {
        let mut world = SimWorld::new(1, 1, LatencyModel::default(), FaultPlan::default(), 1);
        let addr = Addr::new(0, 0);
        let w = Rc::new(Worker::new(addr, 1, world.clock(), world.executor_for(addr), &WorkerConfig::default()));
        world.add_worker(w.clone());
        let log = NodeLog::simulated(SimImage::default(), 1).expect("an empty image").log;
        let acked = Rc::new(RefCell::new(Vec::new()));
        let seen = acked.clone();
        let acks = Acks::new(log.clone(), 4, Box::new(move |p: Pending, _now_ns| seen.borrow_mut().push(p.lsn)));

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
        let acks = Acks::new(log.clone(), 1, Box::new(|_, _| panic!("nothing is durable")));
        let mut world = SimWorld::new(1, 1, LatencyModel::default(), FaultPlan::default(), 1);
        let addr = Addr::new(0, 0);
        let w = Rc::new(Worker::new(addr, 1, world.clock(), world.executor_for(addr), &WorkerConfig::default()));
        world.add_worker(w.clone());
        for record in [b"a", b"b"] {
            acks.push(&w, pending(log.append(record).expect("appended")));
        }
        world.run_until(1_000_000, || false);
        let taken: Vec<u64> = acks.take_all().iter().map(|p| p.lsn).collect();
        assert_eq!(taken, vec![1, 2]);
        assert!(acks.is_empty());
    }
}
