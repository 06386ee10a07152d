//! MaaT's messages. Per remote participant of a distributed transaction: its reads (one `Read`
//! round trip per participant in one-shot mode, holding soft read locks and, for declared
//! writes, soft write locks; one per read interactively), one `Validate` round trip carrying
//! the writes and the versions read, and the skeleton's `Commit` (with the commit timestamp) or
//! `Abort` + ack at every participant, a read-only one too: it must clear the soft locks and
//! record the read timestamp (the commit phase that Sundial and 2PL skip, Fig. 7b). In a
//! durable run, a node whose logged bound is below the chosen timestamp gets one `Raise` round
//! trip before the decision.

use super::Maat;
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Read `keys` (committed value and write timestamp, holding a soft read lock) and hold a
    /// soft write lock on each of `writes`. `fresh`: the transaction must see every
    /// acknowledged write; a validated writer's soft lock refuses the read (`No`).
    Read { txn: TxnId, keys: Vec<RowKey>, writes: Vec<RowKey>, fresh: bool },
    /// The existing rows of a range, each read as `Read` reads.
    Scan { txn: TxnId, scan: Scan, fresh: bool },
    /// Validate here: the versions read here (key, write timestamp) and the writes to keep
    /// until the decision.
    Validate { txn: TxnId, reads: Vec<(RowKey, u64)>, writes: Vec<(RowKey, Option<Value>)> },
    /// In a durable run: log a bound past `ts` before the transaction commits there (its
    /// range allows `ts`, but the bound the node had logged did not reach it).
    Raise { ts: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Values(Vec<(Option<Value>, u64)>),
    Rows(Vec<(u64, Value, u64)>),
    /// A yes vote: the range of commit timestamps the transaction may take here, and the
    /// bound the node's log holds (`u64::MAX` in a run without a log): a commit past it must
    /// `Raise` it first.
    Range {
        lower: u64,
        upper: u64,
        bound: u64,
    },
    /// The bound is raised and durable.
    Raised,
    /// A no vote; nothing is held here any more.
    No(Abort),
}

/// The requests and replies of MaaT, as the 2PC skeleton carries them.
impl Messages for Maat {
    type Request = Request;
    type Reply = Reply;
}
