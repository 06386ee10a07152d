//! MaaT (Mahmoud, Arora, Agrawal, El Abbadi, PVLDB 7(5), 2014) as the Sundial paper runs it
//! beside Sundial: optimistic concurrency control by timestamp ranges. A transaction's range of
//! possible commit timestamps starts as `[1, ∞)` at every node it touches; reads and writes
//! leave soft locks that never block; validation at each node narrows the range around the
//! committed timestamps and the conflicting transactions there and freezes it; the coordinator
//! commits at the lowest timestamp every node's range allows, and every node it touched hears
//! the decision (a read-only one too: it clears the soft locks and records the read timestamp).
//!
//! Roles, as every protocol over the 2PC skeleton: [`meta`] what a record carries (its
//! timestamps and soft locks); [`coordinator`] execution and commit; [`participant`] what a node
//! does for a transaction, local or remote; [`messages`] the wire types; and MaaT's own:
//! [`range`] the time table and its rules, with their worked cases as tests.
//!
//! Where it departs from the original and from the Sundial authors' version:
//! - one latch per node covers its time table and soft locks (the original runs one thread per
//!   partition; the Sundial authors' multi-threaded version latches finer); in `sim` a node's
//!   workers never contend for it, in `local` they do;
//! - writes outside a one-shot declaration take their soft write locks at validation;
//! - a write installs only over an older version (the Thomas write rule), since decisions reach
//!   a node out of timestamp order; replay applies the same rule (2PC's decisions at a timestamp);
//! - durability (the original assumes 2PC's logging): a yes vote logs the writes with its range
//!   ([`log`]: a recovered vote answers a resent request as the lost reply did), a
//!   decision logs its timestamp, and since reads are not logged, a node logs a bound (MaaT's own `Bound` record) that every commit timestamp it takes part in stays below, so that
//!   after a crash every record's read timestamp can start from it: a vote reports the node's
//!   bound, and a commit past it first raises it there (`Raise`, one more round trip, only in
//!   durable runs and only where the bound lags).
//!
//! Where `maat` lives (paths under `crates/dtx/src/`; `dtx protocols --options maat` prints this map):
//! - `protocols/maat/coordinator.rs`: execution and the commit timestamp;
//! - `protocols/maat/participant.rs`: soft locks and ranges at a participant;
//! - `protocols/maat/range.rs`: timestamp ranges;
//! - `protocols/maat/log.rs`: what it logs beside 2PC;
//! - `protocols/twopc/skeleton.rs`: 2PC.

pub mod coordinator;
pub mod log;
pub mod messages;
pub mod meta;
pub mod participant;
pub mod range;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::durable::TxnLog;
use crate::protocols::twopc::FromNode;
use crate::protocols::twopc::{Cc, CcWorker, NodeShared, TxnId};
use crate::txn::{Abort, TxnResult};
use meta::MaatMeta;
use range::TimeTable;

/// MaaT's configuration: none beyond the 2PC skeleton's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Maat;

pub type MaatWorker = CcWorker<Maat>;

/// The abort reasons it defines (the Sundial paper's Fig. 12 breakdown).
pub const ABORTS: &[(&str, &str)] = &[
    (range::FROZEN.name(), "a validated transaction with an open range [x, ∞) left no timestamp after it"),
    (range::EMPTY.name(), "no timestamp fits the committed accesses and validated neighbours, here or across nodes"),
    (
        range::FRESH.name(),
        "a read that must see every acknowledged write (a run's final read) met a validated writer; it retries",
    ),
];

/// Counter: commits that raised a node's logged bound first (durable runs).
pub const BOUND_RAISES: &str = "maat-bound-raises";

/// What one node keeps beside its storage.
pub struct MaatNode {
    pub latch: parking_lot::Mutex<Latched>,
    /// The bound recovered from the node's log: every record's read timestamp starts there.
    pub floor: u64,
}

/// What the node's latch covers (with the soft locks in its records).
pub struct Latched {
    pub table: TimeTable,
    /// The bound the log holds past every range reported, and its record's position.
    pub bound: u64,
    pub bound_lsn: Option<u64>,
}

/// How far past a reported lower bound a new bound is logged.
const BOUND_STEP: u64 = 1 << 16;

/// A node's state starts from what its log recovered.
impl FromNode<Maat> for MaatNode {
    fn from_node(_cc: &Maat, _node: &NodeShared<MaatMeta>, recovered: &log::MaatLog) -> Self {
        let floor = recovered.bound;
        MaatNode {
            latch: parking_lot::Mutex::new(Latched { table: TimeTable::default(), bound: floor, bound_lsn: None }),
            floor,
        }
    }
}

impl MaatNode {
    /// In a durable run, the bound the log holds past a range validated here at `lower`
    /// (logged first when `lower` comes near it), with the position to wait for before the
    /// vote goes out; `u64::MAX` without a log.
    pub fn grant(&self, txn_log: &TxnLog, lower: u64) -> TxnResult<(u64, Option<u64>)> {
        if !txn_log.enabled() {
            return Ok((u64::MAX, None));
        }
        let mut l = self.latch.lock();
        if lower.saturating_add(BOUND_STEP / 2) > l.bound {
            let new = lower.saturating_add(BOUND_STEP);
            l.bound_lsn = txn_log.append_own(&log::MaatRecord::Bound { ts: new })?;
            l.bound = new;
        }
        Ok((l.bound, l.bound_lsn))
    }
}

impl MaatWorker {
    /// Validate the local part of a transaction this worker coordinates: its range and the
    /// bound the log holds, once durable.
    pub async fn validate_here(
        &self,
        txn: TxnId,
        reads: &[(crate::storage::RowKey, u64)],
        writes: &[crate::storage::RowKey],
    ) -> TxnResult<(u64, u64, u64)> {
        let (lower, upper) = self.state.validate(&self.node.store, txn, reads, writes)?;
        let (bound, lsn) = self.state.grant(&self.node.log, lower).map_err(|_| Abort::LogRefused)?;
        self.node.log.durable(lsn).await;
        Ok((lower, upper, bound))
    }

    /// Raise this node's logged bound past `ts` and wait until it is durable.
    pub async fn raise_here(&self, ts: u64) -> TxnResult<()> {
        let (_, lsn) = self.state.grant(&self.node.log, ts).map_err(|_| Abort::LogRefused)?;
        self.node.log.durable(lsn).await;
        Ok(())
    }
}

impl Cc for Maat {
    const NAME: &'static str = "maat";
    type Meta = MaatMeta;
    type NodeState = MaatNode;
    type Log = log::MaatLog;
}
