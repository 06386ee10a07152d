//! What a protocol with logical leases (Sundial, TicToc) logs beside 2PC's records (Sundial's
//! Sec. 3.5): its votes carry their commit timestamps, and a node logs a bound past every lease
//! end and commit timestamp it grants, so that after a crash every version written before it
//! reads as `[bound, bound]`. One record type for both, since leases are one arithmetic
//! ([`super::lease`]); a checkpoint still names its protocol (`Cc::NAME`).

use super::durable::CcLog;
use serde::{Deserialize, Serialize};

/// A lease protocol's own records.
#[derive(Debug, Serialize, Deserialize)]
pub enum LeaseRecord {
    /// Every lease end and commit timestamp granted here stays below `ts`.
    Bound { ts: u64 },
}

/// What replaying the records rebuilds: the largest bound logged (0: none).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LeaseLog {
    pub bound: u64,
}

impl CcLog for LeaseLog {
    /// A yes vote's commit timestamp: a recovered prepared transaction keeps its records' leases
    /// below it until it installs there.
    type Vote = u64;
    type Record = LeaseRecord;

    fn apply(&mut self, record: LeaseRecord) {
        match record {
            LeaseRecord::Bound { ts } => self.bound = self.bound.max(ts),
        }
    }
}
