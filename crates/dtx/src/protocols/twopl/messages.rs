//! 2PL's messages. Textbook count for a distributed transaction, per remote participant: one
//! `Lock` round trip per remote access (or one per participant in one-shot mode), `Prepare` +
//! vote, then `Commit` + ack only where it wrote (a read-only participant releases its shared
//! locks at `Prepare` and leaves the commit phase). DETECT adds the detector's three: a node's
//! waits, ending a victim's wait, and telling the detector that a wait started.

use super::deadlock::Wait;
use super::TwoPl;
use crate::protocols::twopc::record_lock::{Mode, Prio};
use crate::protocols::twopc::{Messages, TxnId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Scan};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Lock records (waiting or not per the policy) and return their values. `again`: the
    /// transaction asked this node for locks before; a participant that does not know it then
    /// lost those locks (an earlier incarnation of the node held them, and a takeover or a
    /// restart forgot them) and aborts it instead of starting it afresh with only these.
    Lock { txn: TxnId, prio: Prio, keys: Vec<(RowKey, Mode)>, again: bool },
    /// Lock the existing rows of a range in shared mode and return them (`again` as above).
    Scan { txn: TxnId, prio: Prio, scan: Scan, again: bool },
    /// Phase one of 2PC: keep these writes; a participant without writes releases and leaves.
    Prepare { txn: TxnId, writes: Vec<(RowKey, Option<Value>)> },
    /// DETECT: the detector asks a node for the lock requests waiting on it.
    Waits,
    /// DETECT: end `txn`'s wait for `key` here, a deadlock's victim.
    Kill { txn: TxnId, key: RowKey },
    /// DETECT: to the detector, a wait started on the sender's node that may close a cycle
    /// across nodes (run a round soon).
    Poke,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    Yes,
    /// Only read here: locks released, no commit phase for this participant.
    ReadOnly,
    /// This participant no longer knows the transaction (it was cleaned up).
    Lost,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Values(Vec<Option<Value>>),
    Rows(Vec<(u64, Value)>),
    Aborted(Abort),
    Vote(Vote),
    Waits(Vec<Wait>),
    /// Whether the wait was still there to end.
    Killed(bool),
    Poked,
}

/// The requests and replies of 2PL, as the 2PC skeleton carries them.
impl Messages for TwoPl {
    type Request = Request;
    type Reply = Reply;
}
