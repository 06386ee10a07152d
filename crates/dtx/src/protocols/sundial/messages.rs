//! Sundial's messages. Per remote participant of a distributed transaction: one `Fetch` round
//! trip (in one-shot mode: every read and every write lock there at once; interactively one per
//! access), one `Prepare` round trip carrying the commit timestamp and the reads whose leases
//! must be extended there, and the 2PC skeleton's `Commit` + ack only where it wrote: a
//! participant where the transaction only read leaves at `Prepare` (Sec. 3.3). A range scan is
//! one `Scan` round trip.

use super::Sundial;
use crate::protocols::twopc::lease::{Lease, RenewFailure};
use crate::protocols::twopc::record_lock::Prio;
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, TableId, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Lock `locks` for writing (WAIT_DIE), then read each of `locks` and `reads`: committed
    /// value and lease. Reads take no lock; a read that names the version of a copy the
    /// coordinator's node has cached (`always request`) gets the lease alone when it is current.
    /// `fresh`: the transaction must see every acknowledged write (`Attempt::fresh`): a read of
    /// a tuple a writer holds is refused, since that writer's commit may be acknowledged
    /// already and not installed yet.
    Fetch { txn: TxnId, prio: Prio, reads: Vec<(RowKey, Option<u64>)>, locks: Vec<RowKey>, fresh: bool },
    /// The existing rows of a range, with their leases (no lock); `fresh` as for `Fetch`.
    Scan { scan: Scan, fresh: bool },
    /// Phase one: extend these reads (key, the `wts` read) to `commit_ts`, then keep the writes
    /// until the decision; with no writes here, release and leave.
    Prepare { txn: TxnId, commit_ts: u64, renew: Vec<(RowKey, u64)>, writes: Vec<(RowKey, Option<Value>)> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    Yes,
    /// Nothing written here: nothing held any more, no commit phase.
    ReadOnly,
    /// The lease of this key could not be extended: nothing held any more.
    Renewal(RenewFailure, RowKey),
    /// This participant no longer knows the transaction.
    Lost,
}

/// One record of a `Fetch` reply.
#[derive(Debug, Serialize, Deserialize)]
pub enum Fetched {
    /// The committed value and its lease.
    Data(Option<Value>, Lease),
    /// The cached version named in the request is the committed one: its lease at home.
    Current(Lease),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// The `reads`, then the `locks`, of a `Fetch`, in order.
    Fetched(Vec<Fetched>),
    Rows(Vec<(u64, Value, Lease)>),
    Aborted(Abort),
    /// A participant's vote, with the read-only tables whose leases it extended (and their
    /// new ends) for the coordinator's cache.
    Vote(Vote, Vec<(TableId, u64)>),
}

/// The requests and replies of Sundial, as the 2PC skeleton carries them.
impl Messages for Sundial {
    type Request = Request;
    type Reply = Reply;
}
