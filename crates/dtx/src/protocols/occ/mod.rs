//! OCC (Silo-style validation) with two-phase commit: the "F1" baseline of the Sundial paper
//! and the OCC that COCO and Primo compare against.
//!
//! Roles: [`meta`] what a record carries; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::durable::PlainLog;
use crate::protocols::twopc::{Cc, CcWorker};
use meta::OccMeta;

/// OCC's configuration: none beyond the 2PC skeleton's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Occ;

/// A worker running OCC over the 2PC skeleton.
pub type OccWorker = CcWorker<Occ>;

impl Cc for Occ {
    type Meta = OccMeta;
    const NAME: &'static str = "occ";
    type NodeState = ();
    type Log = PlainLog;
}
