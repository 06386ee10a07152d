//! 2PL's record metadata: the record lock alone ([`crate::protocols::twopc::record_lock`],
//! shared with the other locking protocols).

use crate::protocols::twopc::record_lock::LockMeta;
use crate::storage::{Record, Row};

pub type LockRecord = Record<LockMeta>;
pub type LockRow = Row<LockMeta>;
