//! What MaaT logs beside 2PC's records: a yes vote carries the range of commit timestamps it
//! allows (a recovered vote answers a resent request with the range it sent, never a wider
//! one), decisions carry their timestamps (2PC's `ts`), and a node logs a bound that every
//! commit timestamp it takes part in stays below, since reads are not logged.

use crate::protocols::twopc::durable::CcLog;
use serde::{Deserialize, Serialize};

/// MaaT's own records.
#[derive(Debug, Serialize, Deserialize)]
pub enum MaatRecord {
    /// Every commit timestamp this node takes part in stays below `ts`.
    Bound { ts: u64 },
}

/// What replaying MaaT's records rebuilds: the largest bound logged or timestamp decided
/// (0: none), which every record's read timestamp starts from after a crash.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MaatLog {
    pub bound: u64,
}

impl CcLog for MaatLog {
    /// A yes vote's range `[lower, upper]`.
    type Vote = (u64, u64);
    type Record = MaatRecord;

    fn apply(&mut self, record: MaatRecord) {
        match record {
            MaatRecord::Bound { ts } => self.bound = self.bound.max(ts),
        }
    }

    fn on_commit_at(&mut self, ts: u64) {
        self.bound = self.bound.max(ts);
    }
}
