//! What MVCC logs beside 2PC's records: a yes vote carries the transaction's timestamp, at
//! which a recovered prepared transaction holds its writes again. Decisions carry it too (2PC's
//! `ts`); MVCC has no records of its own.

use crate::protocols::twopc::durable::{CcLog, NoRecord};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MvccLog;

impl CcLog for MvccLog {
    /// The transaction's timestamp.
    type Vote = u64;
    type Record = NoRecord;

    fn apply(&mut self, record: NoRecord) {
        match record {}
    }
}
