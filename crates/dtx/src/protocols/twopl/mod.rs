//! Two-phase locking with two-phase commit, in the two classic deadlock-free variants,
//! NO_WAIT (abort on any conflict) and WAIT_DIE (an older transaction waits for a younger
//! holder, a younger one dies), and DETECT (every conflict waits; a distributed deadlock
//! detector breaks the cycles, CockroachDB-style). Strict: every lock is held until commit or
//! abort.
//!
//! Roles: [`meta`] the record's lock; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types; [`deadlock`] the
//! background task of DETECT, with each node's table of waits. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.
//!
//! Where `2pl-nowait`, `2pl-waitdie` and `2pl-detect` live (paths under `crates/dtx/src/`;
//! `dtx protocols --options NAME` prints each one's map):
//! - `protocols/twopl/coordinator.rs`: locking and 2PC, coordinator side;
//! - `protocols/twopl/participant.rs`: locks for remote transactions, votes, installs;
//! - `protocols/twopc/record_lock.rs`: the record lock (NO_WAIT);
//! - `protocols/twopc/skeleton.rs`: 2PC and its commit policies;
//! - `protocols/twopc/durable.rs`: the log and recovery;
//! - `protocols/twopl/deadlock.rs`: the wait-for graph and node 0's detector;
//! - `protocols/graph.rs`: breaking cycles.

pub mod coordinator;
pub mod deadlock;
pub mod messages;
pub mod meta;
pub mod participant;
#[cfg(test)]
mod tests;

use crate::protocols::twopc::durable::PlainLog;
use crate::protocols::twopc::record_lock::LockMeta;
/// The record lock's policy and option, as the registry names them (`twopl::Policy`).
pub use crate::protocols::twopc::record_lock::{Policy, LOCK_WAIT_OPTION};
use crate::protocols::twopc::{Cc, CcWorker};
pub use deadlock::{DETECTION_OPTION, DETECT_ABORTS, DETECT_LOCK_WAIT_OPTION, DETECT_OPTION};
use std::rc::Rc;

/// 2PL's configuration.
#[derive(Debug, Clone, Copy)]
pub struct TwoPl {
    pub policy: Policy,
    /// Longest a transaction waits for a lock (WAIT_DIE, DETECT) before aborting.
    pub lock_wait_us: u64,
    /// DETECT: how often the detector gathers the waits and breaks cycles; 0 under another
    /// policy, or under DETECT with `detect=off` (no detection at all: [`TwoPl::detects`]).
    pub detect_us: u64,
}

impl TwoPl {
    /// Whether deadlocks are detected: under DETECT, unless `detect=off` set `detect_us` to 0.
    /// Otherwise no node searches its waits as one starts, none tells the detector, and there
    /// is no detector: only `lock_wait_us` ends a deadlock.
    pub fn detects(&self) -> bool {
        self.policy == Policy::Detect && self.detect_us > 0
    }
}

/// A worker running 2PL over the 2PC skeleton.
pub type TwoPlWorker = CcWorker<TwoPl>;

impl Cc for TwoPl {
    type Meta = LockMeta;
    const NAME: &'static str = "2pl";
    /// The node's table of waits (kept under DETECT only).
    type NodeState = deadlock::WaitTable;
    type Log = PlainLog;

    fn start_worker(wk: &Rc<TwoPlWorker>) {
        deadlock::spawn_detector(wk);
    }
}
