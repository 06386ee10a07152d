//! Static-timestamp MVCC's messages. Per remote participant: its reads and declared writes in
//! one `Access` round trip in one-shot mode (one per read interactively), each read at the
//! transaction's timestamp and each declared write held (a prewrite); then, only where it
//! writes, one `Prepare` round trip with the values and the skeleton's `Commit` or `Abort`.
//! A node it only read from hears nothing more: its reads were final when they were served.

use super::Mvcc;
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Read `reads` as of `ts` and prewrite `writes` at `ts`; the answer waits while a write
    /// with a smaller timestamp is pending on any of them.
    Access { txn: TxnId, ts: u64, reads: Vec<RowKey>, writes: Vec<RowKey> },
    /// The rows of a range as of `ts`.
    Scan { txn: TxnId, ts: u64, scan: Scan },
    /// Prewrite what is not held yet, keep the values until the decision, and vote.
    Prepare { txn: TxnId, ts: u64, writes: Vec<(RowKey, Option<Value>)> },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Values(Vec<Option<Value>>),
    Rows(Vec<(u64, Value)>),
    Yes,
    /// Nothing of the transaction is held here any more.
    No(Abort),
}

/// The requests and replies of MVCC, as the 2PC skeleton carries them.
impl Messages for Mvcc {
    type Request = Request;
    type Reply = Reply;
}
