//! Where a commit made in memory waits before its client hears of it: an acknowledgement
//! source. A protocol that commits before its commit is safe (early lock release, epochs,
//! watermarks) names a point in an ordered stream, and the driver's ack queue
//! (`host::acks`) releases the commit once the source decides that point:
//! - a node's log ([`NodeLog`]): the point is an LSN, released once durable, never rolled back
//!   (a crash makes the commits waiting on it of unknown outcome, not rolled back);
//! - [`ReleasePoints`]: the point is an epoch (COCO's group commit), a watermark timestamp
//!   (Primo's, Rolis's), or any other number that grows with commit order; the protocol
//!   releases every point up to one (`release_through`), or rolls a range back after a failure
//!   (`roll_back`): those commits reach their clients as aborted, never as committed. The
//!   replication layer's `EpochCoordinator`/`EpochParticipant` and `PartitionWatermarks`
//!   decide the points; this is where their decisions reach clients.
//!
//! Points are ordered: a queue waits for its oldest point, so a commit is never acknowledged
//! ahead of one queued before it.

use super::log::NodeLog;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// What became of a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Not decided yet.
    Pending,
    /// Safe: its commits are acknowledged.
    Released,
    /// Undone after a failure: its commits are reported aborted (`rolled-back`).
    RolledBack,
}

/// A stream of points that are released in order or rolled back.
pub trait AckSource: Send + Sync {
    /// Resolves once `point` is decided ([`AckSource::outcome`] is not `Pending`).
    fn decided(&self, point: u64) -> Pin<Box<dyn Future<Output = ()> + '_>>;
    /// What became of `point` so far.
    fn outcome(&self, point: u64) -> Release;
}

impl AckSource for NodeLog {
    fn decided(&self, point: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(self.wait_ref(point))
    }

    fn outcome(&self, point: u64) -> Release {
        if self.durable_lsn() >= point {
            Release::Released
        } else {
            Release::Pending
        }
    }
}

/// The most rolled-back ranges kept: a failure rolls back one range, so this many failures in
/// one run means a leak.
const MAX_ROLLED_BACK_RANGES: usize = 1 << 16;

/// Points released in order up to a mark, with ranges rolled back: the source of a protocol
/// that releases by epoch or watermark. Shared by a node's workers (any thread).
#[derive(Default)]
pub struct ReleasePoints {
    state: Mutex<PointsState>,
}

#[derive(Default)]
struct PointsState {
    /// Every point up to here is decided: released unless rolled back.
    released_through: u64,
    /// Inclusive ranges of points rolled back, oldest first, not overlapping.
    rolled_back: Vec<(u64, u64)>,
    waiters: Vec<(u64, Waker)>,
}

impl PointsState {
    fn outcome(&self, point: u64) -> Release {
        if self.rolled_back.iter().any(|&(from, to)| (from..=to).contains(&point)) {
            Release::RolledBack
        } else if point <= self.released_through {
            Release::Released
        } else {
            Release::Pending
        }
    }

    fn wake_decided(&mut self) -> Vec<Waker> {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            if self.outcome(self.waiters[i].0) != Release::Pending {
                ready.push(self.waiters.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        ready
    }
}

impl ReleasePoints {
    pub fn new() -> Arc<Self> {
        Arc::new(ReleasePoints::default())
    }

    /// Every point up to `point` that was not rolled back is safe. Marks only grow.
    pub fn release_through(&self, point: u64) {
        let ready = {
            let mut s = self.state.lock();
            s.released_through = s.released_through.max(point);
            s.wake_decided()
        };
        ready.into_iter().for_each(Waker::wake);
    }

    /// The points `from..=through` are undone (a failed epoch; the commits at or above an
    /// agreed watermark): decided, and not released, whatever is released later.
    pub fn roll_back(&self, from: u64, through: u64) {
        assert!(from <= through, "an empty range rolled back: {from}..={through}");
        let ready = {
            let mut s = self.state.lock();
            assert!(
                s.rolled_back.len() < MAX_ROLLED_BACK_RANGES,
                "{MAX_ROLLED_BACK_RANGES} ranges rolled back: failures are not that many"
            );
            s.rolled_back.push((from, through));
            s.wake_decided()
        };
        ready.into_iter().for_each(Waker::wake);
    }

    /// The mark: every point up to it is decided.
    pub fn released_through(&self) -> u64 {
        self.state.lock().released_through
    }
}

impl AckSource for ReleasePoints {
    fn decided(&self, point: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(PointWait { points: self, point })
    }

    fn outcome(&self, point: u64) -> Release {
        self.state.lock().outcome(point)
    }
}

struct PointWait<'a> {
    points: &'a ReleasePoints,
    point: u64,
}

impl Future for PointWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.points.state.lock();
        if s.outcome(self.point) != Release::Pending {
            return Poll::Ready(());
        }
        s.waiters.push((self.point, cx.waker().clone()));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_released_in_order_and_rolled_back_ranges_stay_rolled_back() {
        let p = ReleasePoints::default();
        assert_eq!(p.outcome(1), Release::Pending);
        p.release_through(2);
        assert_eq!(
            (p.outcome(1), p.outcome(2), p.outcome(3)),
            (Release::Released, Release::Released, Release::Pending)
        );
        p.roll_back(3, 4);
        assert_eq!(
            (p.outcome(3), p.outcome(4), p.outcome(5)),
            (Release::RolledBack, Release::RolledBack, Release::Pending)
        );
        p.release_through(9);
        assert_eq!(
            (p.outcome(4), p.outcome(5)),
            (Release::RolledBack, Release::Released),
            "released later, still undone"
        );
        p.release_through(7);
        assert_eq!(p.released_through(), 9, "a mark never goes back");
    }

    #[test]
    fn a_wait_ends_when_its_point_is_decided_either_way() {
        let p = ReleasePoints::default();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut released = p.decided(2);
        let mut undone = p.decided(3);
        assert!(released.as_mut().poll(&mut cx).is_pending());
        assert!(undone.as_mut().poll(&mut cx).is_pending());
        p.roll_back(3, 3);
        assert!(undone.as_mut().poll(&mut cx).is_ready());
        assert!(released.as_mut().poll(&mut cx).is_pending());
        p.release_through(2);
        assert!(released.as_mut().poll(&mut cx).is_ready());
    }
}
