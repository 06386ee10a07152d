//! OCC's messages. Textbook count for a distributed transaction, per remote participant:
//! reads (one round trip per participant in one-shot mode, per read otherwise), `Lock` (only
//! where it writes), `Validate` (only where it read), then `Commit` + ack (only where it wrote); `Abort` + ack where it locked and then aborted.

use crate::protocols::common::{TxnId, TxnStatus};
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
    /// Install the writes and unlock.
    Commit { txn: TxnId },
    /// Release the locks a transaction took here and drop its writes.
    Abort { txn: TxnId },
    /// A participant asks the coordinator what became of a transaction.
    Status { txn: TxnId },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Values(Vec<(Option<Value>, u64)>),
    Rows(Vec<(u64, Value, u64)>),
    Vote(bool),
    Ack,
    Status(TxnStatus),
}
