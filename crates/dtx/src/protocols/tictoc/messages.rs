//! TicToc's messages. Per remote participant of a distributed transaction: its reads (one `Read`
//! round trip per participant in one-shot mode, one per read otherwise), then at commit `Lock`
//! where it writes (answering each locked record's lease, from which the coordinator computes the
//! commit timestamp), `Prepare` where it writes or has a read whose lease must be extended, and
//! the 2PC skeleton's `Commit` + ack only where it wrote (`Abort` + ack where it locked and then
//! aborted). A range scan is one `Scan` round trip.

use super::TicToc;
use crate::protocols::twopc::lease::{Lease, RenewFailure};
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// The committed value and lease of each record (no lock). `fresh`: the transaction must see
    /// every acknowledged write, so a record another writer holds is refused.
    Read { keys: Vec<RowKey>, fresh: bool },
    /// The existing rows of a range with their leases; `fresh` as for `Read`.
    Scan { scan: Scan, fresh: bool },
    /// Lock these records for writing, all or none, without waiting; answer their leases.
    Lock { txn: TxnId, keys: Vec<RowKey> },
    /// Validate these reads (key, the `wts` read) at `commit_ts`, extending leases as needed,
    /// then keep the writes (locked by `Lock`) until the decision; with no writes, leave.
    Prepare { txn: TxnId, commit_ts: u64, reads: Vec<(RowKey, u64)>, writes: Vec<(RowKey, Option<Value>)> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    /// Valid, and the writes are logged: it installs them if the transaction commits.
    Yes,
    /// Valid, nothing written here: nothing held any more, no commit phase.
    ReadOnly,
    /// This read failed validation: nothing held any more.
    Invalid(RenewFailure),
    /// This participant no longer holds the transaction's locks.
    Lost,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// `Read`: each record's committed value and lease, in order.
    Values(Vec<(Option<Value>, Lease)>),
    Rows(Vec<(u64, Value, Lease)>),
    /// `Lock`: every record locked, with its lease, in order; `None`: one was held by another
    /// writer, and nothing is held here.
    Locked(Option<Vec<Lease>>),
    Vote(Vote),
    Aborted(Abort),
}

/// The requests and replies of TicToc, as the 2PC skeleton carries them.
impl Messages for TicToc {
    type Request = Request;
    type Reply = Reply;
}
