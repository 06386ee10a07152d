//! Calvin's wire types: a client submits a request to its node's sequencer, a sequencer sends each
//! batch to every data node's scheduler, participants exchange their local reads, and one of them
//! tells the client the outcome. Requests travel as bytes (`Procedures::encode_request`): they
//! are data, decoded and re-run at every participant.

use super::homes::{Expected, Movement};
use crate::net::{Addr, NodeId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan};
use serde::{Deserialize, Serialize};

/// What a participant read locally for a transaction: its keys' values, and the rows of the
/// scans whose range it holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadSet {
    pub values: Vec<(RowKey, Option<Value>)>,
    /// Each scan with the rows present in its range before the transaction, in the order it
    /// asks, at least its limit plus the transaction's writes in the range when there are that
    /// many (see `Scan::over_writes`).
    pub scans: Vec<(Scan, Vec<(u64, Value)>)>,
    /// The keys it holds whose stored home is not the one the transaction expected, with the
    /// stored home ([`super::homes`]): any at any participant aborts the run everywhere.
    pub moved: Vec<(RowKey, u16)>,
}

/// One sequenced transaction: who waits for it and what it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub client: Addr,
    /// The client's number for it (a worker numbers its submissions).
    pub id: u64,
    /// The request, encoded by the workload.
    #[serde(with = "serde_bytes")]
    pub req: Vec<u8>,
    /// Its keys and scans as the client's reconnaissance found them (OLLP), when the workload
    /// does not declare them or the procedure scans; `None`: the workload's declaration.
    pub keys: Option<KeySet>,
    /// SLOG: this entry is a lock-only piece of a multi-home transaction, placed in the log of
    /// one of its home regions; `None`: a whole transaction.
    pub piece: Option<Piece>,
    /// Detock: this entry is a multi-home transaction's piece (a GraphPlacementTxn), to be
    /// placed in a home's log no earlier than its timestamp; `None`: a whole transaction, or
    /// one its coordinator has not split yet.
    pub placed: Option<Placed>,
    /// The homes its client expects of the keys it knows moved ([`super::homes`]).
    pub homes: Expected,
    /// A home movement: the entry moves this key's home and runs no procedure (`req` is empty).
    pub movement: Option<Movement>,
}

/// A Detock piece's timestamp (opportunistic ordering, thesis §4.2.4): every home places the
/// transaction's piece once its own clock reaches it, so pieces sent early enough land at about
/// the same moment everywhere and rarely cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// The coordinator's clock when it sent the pieces, plus the farthest home's estimated
    /// one-way delay, plus the overshoot; 0 without opportunistic ordering.
    pub not_before_us: u64,
    /// The coordinator (its node) and its number for this piece among those it sends this
    /// home, from 1: how the home tells a copy (`piece_seqs`).
    pub coordinator: NodeId,
    pub seq: u64,
}

/// Where a multi-home transaction's piece comes from (SLOG).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// The transaction's place in the global order: the orderer's (epoch, index in its batch).
    pub txn: (u64, u32),
    /// The orderer's batch number for this region (it numbers only the batches with pieces for
    /// the region, so that a region's sequencer sees an unbroken run and can tell a gap).
    pub region_batch: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Msg {
    /// Client -> sequencer.
    Submit(Entry),
    /// Client -> one of SLOG's ordering threads: a multi-home transaction.
    Order(Entry),
    /// An ordering thread -> the one that closes the batches: the submissions it took in one
    /// step, each with its home regions (`homes[i]` are `entries[i]`'s).
    Intake { entries: Vec<Entry>, homes: Vec<Vec<u16>> },
    /// Detock's coordinator (the client's region's sequencer) -> a sequencer of each home
    /// region: the transaction's piece for that home, sent until acknowledged.
    Place(Entry),
    /// A sequencer -> another region's first sequencer: its clock, answered with the receiver's
    /// clock minus it (the one-way delay plus the clocks' offset, as an `i64`).
    Probe { sent_us: u64 },
    /// SLOG's orderer -> the first sequencer of one home region: the region's next batch of
    /// pieces (`region_batch` numbers them, from 1), in the global order.
    Ordered { region_batch: u64, entries: Vec<Entry> },
    /// A sequencer -> every data node's scheduler: its batch of `epoch` (one every epoch, empty
    /// or not, since schedulers take every sequencer's batch of an epoch in turn).
    Batch { epoch: u64, sequencer: NodeId, entries: Vec<Entry> },
    /// Participant -> the other participants of the transaction at `slot` (epoch, sequencer,
    /// index in its batch): its local reads.
    Reads { slot: (u64, NodeId, u32), from: NodeId, values: ReadSet },
    /// One participant -> the client: the outcome, the output as JSON (what the driver records),
    /// and the stored homes of the keys whose home it expected wrongly (a `home-moved` abort).
    Done { id: u64, outcome: Result<Vec<u8>, Abort>, moved: Vec<(RowKey, u16)> },
    /// A client's reconnaissance -> any worker of the node that holds what it asks: the
    /// committed state, read without locks (answered with a [`Peeked`]).
    Peek(Peek),
}

/// What a reconnaissance asks.
#[derive(Debug, Serialize, Deserialize)]
pub enum Peek {
    Read(RowKey),
    Scan(Scan),
}

/// The answer to a [`Peek`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Peeked {
    Value(Option<Value>),
    Rows(Vec<(u64, Value)>),
}
