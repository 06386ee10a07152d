//! OCC (Silo-style validation) with two-phase commit: the "F1" baseline of the Sundial paper
//! and the OCC that COCO and Primo compare against.
//!
//! Roles: [`meta`] what a record carries; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.
//!
//! Where `occ` lives (paths under `crates/dtx/src/`; `dtx protocols --options occ` prints this map):
//! - `protocols/occ/coordinator.rs`: execution, locking writes, validating reads;
//! - `protocols/occ/participant.rs`: validation and installs at a participant;
//! - `protocols/twopc/buffered.rs`: buffered writes;
//! - `protocols/twopc/skeleton.rs`: 2PC and its commit policies;
//! - `protocols/twopc/durable.rs`: the log and recovery.
//!
//! COCO is this concurrency control under COCO's epoch group commit (`commit=epoch`).
//! Where `coco` lives (paths under `crates/dtx/src/`; `dtx protocols --options coco` prints this map):
//! - `protocols/occ/coordinator.rs`: its concurrency control: OCC;
//! - `protocols/occ/participant.rs`: validation and installs at a participant;
//! - `protocols/twopc/commit/epoch.rs`: epoch group commit: epochs, their agreement, records, recovery;
//! - `protocols/twopc/commit/mod.rs`: the commit policy seam;
//! - `protocols/twopc/skeleton.rs`: 2PC, asking the gate;
//! - `protocols/registry.rs`: its registry entry (OCC under commit=epoch).

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
