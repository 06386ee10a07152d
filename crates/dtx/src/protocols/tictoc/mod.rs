//! TicToc (Yu, Pavlo, Sanchez, Devadas; SIGMOD 2016): optimistic concurrency control whose
//! timestamps come from the data. Every record carries `[wts, rts]` (the version written at `wts`
//! may be read up to `rts`); a transaction reads versions with their leases, locks its write set
//! at commit, computes its commit timestamp from what it saw (at least every read's `wts`, past
//! every locked write's `rts`), and validates each read whose lease ends before it: still the
//! same version and not locked by another writer, its `rts` is extended to the commit timestamp;
//! otherwise it aborts. Writes install at `[commit_ts, commit_ts]`. The lease rules are shared
//! with Sundial ([`crate::protocols::twopc::lease`]); Sundial is TicToc made distributed plus
//! 2PL writes and a cache, and this is TicToc made distributed the plain way.
//!
//! On the 2PC skeleton: execution buffers writes and keeps reads with their leases (remote ones
//! fetched from the record's node, one message per node in one-shot mode); commit is two rounds,
//! `Lock` (the write set locked there, NO_WAIT, answering each lease) then `Prepare` (the commit
//! timestamp, the reads to extend there, the writes to keep: a yes vote logs the writes with the
//! commit timestamp), then the skeleton's `Commit` where it wrote. A node where it only read and
//! every lease already covers the commit timestamp is not asked at all; one where it only read
//! and some lease must be extended gets one `Prepare` and skips the commit phase. A transaction
//! that touches no other node commits with early lock release, as OCC's and Sundial's do.
//!
//! Simplified, and why:
//! - Write locks are NO_WAIT at `Lock` (a conflict aborts with `tictoc-write-locked`): deadlock
//!   free with no wait-for graph, as OCC's; the paper's single-node TicToc also uses no-wait
//!   locking in its default configuration.
//! - Commit is always two rounds (OCC's one-remote-participant shortcut is not built: the commit
//!   timestamp depends on the remote `rts`, so merging lock and validation means the participant
//!   computes it; left for later).
//! - No lock-free record words: a record's `[wts, rts]` and lock sit under its latch (the paper
//!   packs them in one 64-bit word with delta-encoded `rts`; in `sim` a latch costs nothing).
//! - A range scan protects the rows it returns, not the gaps between them (as OCC and Sundial).
//! - A run's final read and checks (`Attempt::fresh`) do not read around a record a writer
//!   holds (`tictoc-fresh-read-locked`, retried): TicToc is serializable, not strictly, and a
//!   read placed before a commit that is acknowledged but not yet installed at its node would
//!   be a legal serial order that the final read must not take.
//!
//! Durability: 2PC's records, votes carrying their commit timestamp ([`crate::protocols::twopc::lease_log`]). Leases are not
//! logged (reads extend them), so, as in Sundial (Sec. 3.5), a node logs a bound past every
//! lease end and commit timestamp it grants before granting it; after recovery every version
//! written before the bound reads as `[bound, bound]` (lazily, [`RecordLease::current`](crate::protocols::twopc::lease::RecordLease::current)),
//! except one locked by a recovered prepared transaction `T`, whose version reads `[T.ts - 1,
//! T.ts - 1]` until `T` installs at `T.ts` or aborts. No lease a reader relied on before the
//! crash reaches the bound, so no commit after it can be placed inside a lost extension.
//!
//! Where `tictoc` lives (paths under `crates/dtx/src/`; `dtx protocols --options tictoc` prints this map):
//! - `protocols/tictoc/coordinator.rs`: execution and the commit timestamp;
//! - `protocols/tictoc/participant.rs`: validation and extension of remote reads;
//! - `protocols/twopc/lease.rs`: logical leases;
//! - `protocols/twopc/lease_log.rs`: what it logs beside 2PC;
//! - `protocols/twopc/skeleton.rs`: 2PC.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::durable::TxnLog;
use crate::protocols::twopc::lease::RenewFailure;
use crate::protocols::twopc::lease::UpperBound;
use crate::protocols::twopc::lease_log::{LeaseLog, LeaseRecord};
use crate::protocols::twopc::{Cc, CcWorker, FromNode, NodeShared};
use crate::protocols::OptionSpec;
use crate::txn::{Abort, Reason, TxnResult};
use meta::TicTocMeta;

/// TicToc's configuration: none beyond the 2PC skeleton's.
#[derive(Debug, Clone, Copy, Default)]
pub struct TicToc;

/// A worker running TicToc over the 2PC skeleton.
pub type TicTocWorker = CcWorker<TicToc>;

/// What a node keeps beside its storage: the lease bound recovered from its log and the one it
/// logs as it grants timestamps.
pub struct TicTocNode {
    /// Every version written before it reads as `[floor, floor]` (the bound recovered).
    pub floor: u64,
    /// The bound logged past every timestamp this node grants, and the log position of its
    /// last record (a lease handed out is relied on only once that is durable).
    pub bound: parking_lot::Mutex<(UpperBound, Option<u64>)>,
}

/// How far past a granted timestamp a new bound is logged: one bound record every 65,536 units
/// of logical time, as Sundial's.
const BOUND_STEP_TS: u64 = 1 << 16;

impl FromNode<TicToc> for TicTocNode {
    fn from_node(_cc: &TicToc, _node: &NodeShared<TicTocMeta>, recovered: &LeaseLog) -> Self {
        let floor = recovered.bound;
        TicTocNode { floor, bound: parking_lot::Mutex::new((UpperBound { logged: floor, step: BOUND_STEP_TS }, None)) }
    }
}

impl TicTocNode {
    /// Log a new bound first if `ts` (a lease end or a commit timestamp about to be granted
    /// here) passes the logged one. A log that refuses the record aborts the transaction.
    pub fn grant(&self, txn_log: &TxnLog, ts: u64) -> TxnResult<()> {
        if !txn_log.enabled() {
            // Nothing survives a crash to bound (and every commit would take this mutex).
            return Ok(());
        }
        let mut b = self.bound.lock();
        if let Some(new) = b.0.before_granting(ts) {
            if let Some(lsn) = txn_log.append_own(&LeaseRecord::Bound { ts: new })? {
                b.1 = Some(lsn);
            }
        }
        Ok(())
    }

    /// The log position a lease handed out now must wait for: the last bound's record.
    pub fn bound_lsn(&self) -> Option<u64> {
        self.bound.lock().1
    }
}

/// Its options beside the 2PC skeleton's: none.
pub const OPTIONS: &[OptionSpec] = &[
    crate::protocols::twopc::ORPHAN_OPTION,
    crate::protocols::twopc::commit::watermark::COMMIT_OPTION,
    crate::protocols::twopc::commit::epoch::EPOCH_OPTION,
    crate::protocols::twopc::commit::watermark::WM_OPTION,
    crate::protocols::twopc::commit::watermark::FLOOR_OPTION,
];

pub const VERSION_CHANGED: Reason = Reason::new("tictoc-version-changed");
pub const READ_LOCKED: Reason = Reason::new("tictoc-read-locked");
pub const WRITE_LOCKED: Reason = Reason::new("tictoc-write-locked");
pub const FRESH_READ_LOCKED: Reason = Reason::new("tictoc-fresh-read-locked");

/// The abort reasons it defines.
pub const ABORTS: &[(&str, &str)] = &[
    (VERSION_CHANGED.name(), "a read's record has a newer version than the one read (read validation)"),
    (READ_LOCKED.name(), "a read's lease must be extended to the commit timestamp but another writer holds the record"),
    (WRITE_LOCKED.name(), "a record to write was locked by another committing transaction (NO_WAIT)"),
    (
        FRESH_READ_LOCKED.name(),
        "a read that must see every acknowledged write (a run's final read) met a record a writer holds; it retries",
    ),
];

/// The abort of a read that failed validation.
pub fn validation_abort(f: RenewFailure) -> Abort {
    match f {
        RenewFailure::NewerAfter | RenewFailure::NewerBefore => Abort::Protocol(VERSION_CHANGED),
        RenewFailure::Locked => Abort::Protocol(READ_LOCKED),
    }
}

impl Cc for TicToc {
    const NAME: &'static str = "tictoc";
    type Meta = TicTocMeta;
    type NodeState = TicTocNode;
    type Log = LeaseLog;
}
