//! OCC's messages. Textbook count for a distributed transaction, per remote participant:
//! reads (one round trip per participant in one-shot mode, per read otherwise), `Lock` (only
//! where it writes), `Validate` (only where it read), then the 2PC skeleton's `Commit` + ack (only
//! where it wrote) or `Abort` + ack where it locked and then aborted ([`Termination`](crate::protocols::twopc::skeleton::Termination)).
//! A transaction with a single remote participant sends it one `LockValidate` instead of `Lock`
//! and `Validate`: once the coordinator's local locks are held, that participant's locks are the
//! last ones, so it may validate right after taking them.

use super::Occ;
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::Scan;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Read records: value and version of each.
    Read { keys: Vec<RowKey> },
    /// Range scan: existing rows with their versions.
    Scan { scan: Scan },
    /// Lock the write set (no wait) and keep the new values until the decision.
    Lock { txn: TxnId, writes: Vec<(RowKey, Option<Value>)> },
    /// Check that what the transaction read is unchanged and unlocked by others.
    Validate { txn: TxnId, reads: Vec<(RowKey, u64)> },
    /// `Lock`, then `Validate` once the locks are held: for the last participant to lock, every
    /// other lock of the transaction being held already. A no vote (or `Stale`) leaves nothing
    /// held here.
    LockValidate { txn: TxnId, writes: Vec<(RowKey, Option<Value>)>, reads: Vec<(RowKey, u64)> },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Values(Vec<(Option<Value>, u64)>),
    Rows(Vec<(u64, Value, u64)>),
    Vote(bool),
    /// `LockValidate`: the locks were free but a read is stale; the locks were released.
    Stale,
}

/// The requests and replies of OCC, as the 2PC skeleton carries them.
impl Messages for Occ {
    type Request = Request;
    type Reply = Reply;
}
