//! Two-phase locking with two-phase commit, in the two classic deadlock-free variants:
//! NO_WAIT (abort on any conflict) and WAIT_DIE (an older transaction waits for a younger
//! holder, a younger one dies). Strict: every lock is held until commit or abort.
//!
//! Roles: [`meta`] the record's lock; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

use crate::protocols::twopc::durable::PlainLog;
use crate::protocols::twopc::record_lock::LockMeta;
/// The record lock's policy and option, as the registry names them (`twopl::Policy`).
pub use crate::protocols::twopc::record_lock::{Policy, LOCK_WAIT_OPTION};
use crate::protocols::twopc::{Cc, CcWorker};

/// 2PL's configuration.
#[derive(Debug, Clone, Copy)]
pub struct TwoPl {
    pub policy: Policy,
    /// Longest a transaction waits for a lock (WAIT_DIE) before aborting.
    pub lock_wait_us: u64,
}

/// A worker running 2PL over the 2PC skeleton.
pub type TwoPlWorker = CcWorker<TwoPl>;

impl Cc for TwoPl {
    type Meta = LockMeta;
    const NAME: &'static str = "2pl";
    type NodeState = ();
    type Log = PlainLog;
}
