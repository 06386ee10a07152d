//! Calvin's wire types: a client submits a request to its node's sequencer, a sequencer sends each
//! batch to every data node's scheduler, participants exchange their local reads, and one of them
//! tells the client the outcome. Requests travel as bytes (`Procedures::encode_request`): they
//! are data, decoded and re-run at every participant.

use crate::net::{Addr, NodeId};
use crate::storage::{RowKey, Value};
use crate::txn::Abort;
use serde::{Deserialize, Serialize};

/// Keys with the values a participant read.
pub type ReadSet = Vec<(RowKey, Option<Value>)>;

/// One sequenced transaction: who waits for it and what it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub client: Addr,
    /// The client's number for it (a worker numbers its submissions).
    pub id: u64,
    /// The request, encoded by the workload.
    pub req: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Msg {
    /// Client -> sequencer.
    Submit(Entry),
    /// A sequencer -> every data node's scheduler: its batch of `epoch` (one every epoch, empty
    /// or not, since schedulers take every sequencer's batch of an epoch in turn).
    Batch { epoch: u64, sequencer: NodeId, entries: Vec<Entry> },
    /// Participant -> the other participants of the transaction at `slot` (epoch, sequencer,
    /// index in its batch): its local reads.
    Reads { slot: (u64, NodeId, u32), from: NodeId, values: ReadSet },
    /// One participant -> the client: the outcome, the output as JSON (what the driver records).
    Done { id: u64, outcome: Result<Vec<u8>, Abort> },
}
