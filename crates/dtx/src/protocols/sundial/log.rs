//! What Sundial logs beside 2PC's records (Sec. 3.5): its votes carry their commit timestamps,
//! and a node logs a bound `UT` past every lease end and commit timestamp it grants, so that
//! after a crash every version written before it reads as `[UT, UT]`.

use crate::protocols::twopc::durable::CcLog;
use serde::{Deserialize, Serialize};

/// Sundial's own records.
#[derive(Debug, Serialize, Deserialize)]
pub enum SundialRecord {
    /// Every lease end and commit timestamp granted here stays below `ts`.
    Bound { ts: u64 },
}

/// What replaying Sundial's records rebuilds: the largest bound logged (0: none).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SundialLog {
    pub bound: u64,
}

impl CcLog for SundialLog {
    /// A yes vote's commit timestamp: a recovered prepared transaction keeps its tuples' leases
    /// below it until it installs there.
    type Vote = u64;
    type Record = SundialRecord;

    fn apply(&mut self, record: SundialRecord) {
        match record {
            SundialRecord::Bound { ts } => self.bound = self.bound.max(ts),
        }
    }
}
