//! What TicToc logs beside 2PC's records: its votes carry their commit timestamps, and a node
//! logs a bound past every lease end and commit timestamp it grants, so that after a crash every
//! version written before it reads as `[bound, bound]` (as Sundial, Sec. 3.5).

use crate::protocols::twopc::durable::CcLog;
use serde::{Deserialize, Serialize};

/// TicToc's own records.
#[derive(Debug, Serialize, Deserialize)]
pub enum TicTocRecord {
    /// Every lease end and commit timestamp granted here stays below `ts`.
    Bound { ts: u64 },
}

/// What replaying TicToc's records rebuilds: the largest bound logged (0: none).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TicTocLog {
    pub bound: u64,
}

impl CcLog for TicTocLog {
    /// A yes vote's commit timestamp: a recovered prepared transaction keeps its records' leases
    /// below it until it installs there.
    type Vote = u64;
    type Record = TicTocRecord;

    fn apply(&mut self, record: TicTocRecord) {
        match record {
            TicTocRecord::Bound { ts } => self.bound = self.bound.max(ts),
        }
    }
}
