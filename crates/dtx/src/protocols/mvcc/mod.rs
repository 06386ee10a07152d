//! Static-timestamp MVCC: the baseline of the Sundial paper's Sec. 6.6 ("Dynamic vs. Static
//! Timestamps", Fig. 13). A transaction takes its timestamp from its coordinator's wall clock
//! when it starts and keeps it: a read returns the newest version not after that timestamp
//! (waiting while a write with a smaller timestamp is pending on the record) and raises the
//! record's read timestamp; a write is held at its node (a prewrite) and comes too late once a
//! read or a version with a larger timestamp exists there. Nodes whose clocks lag write at
//! timestamps that other nodes' readers have already passed: what Sundial's logical,
//! dynamically chosen commit timestamps avoid. `--clock-skew` sets how far the nodes' clocks
//! are apart.
//!
//! Roles, as every protocol over the 2PC skeleton: [`meta`] what a record carries (its
//! versions, read timestamp and pending write), [`coordinator`] execution and commit,
//! [`participant`] what a node does for a transaction, [`messages`] the wire types.
//!
//! Where it departs from the paper's, and why:
//! - the paper's MVCC is "idealized": it keeps no versions and collects none, an upper bound
//!   on MVCC that the serializability checker cannot run (a reader must get the version of its
//!   timestamp). Here a record keeps its last [`meta::KEEP_VERSIONS`] versions and a read older
//!   than all of them aborts (`mvcc-version-gone`), reported apart so that a run shows what
//!   the bound costs;
//! - reads and writes wait on a pending write with a smaller timestamp by polling the record
//!   every [`WAIT_POLL_US`] (at most [`WAIT_MAX_US`], then `lock-timeout`), where DBx1000
//!   queues the request on the record: a wait costs a timer here, not a message;
//! - a read-only transaction commits without any message after its reads, and a node that was
//!   only read from hears nothing (its reads were final when served): MVCC's advantage over
//!   the protocols that validate;
//! - durability: a vote logs its writes with the timestamp ([`log`]) and the decision
//!   logs it; reads are not logged, so a node restarted from its log refuses writes
//!   below its wall clock plus the clock skew (every read served before the crash was below
//!   that), the assumption of bounded skew that any protocol ordering by wall clocks makes.
//!
//! Where `mvcc` lives (paths under `crates/dtx/src/`; `dtx protocols --options mvcc` prints this map):
//! - `protocols/mvcc/coordinator.rs`: execution at a start timestamp;
//! - `protocols/mvcc/participant.rs`: versions, reads and late writes at a participant;
//! - `protocols/mvcc/log.rs`: what it logs beside 2PC;
//! - `protocols/twopc/skeleton.rs`: 2PC.

pub mod coordinator;
pub mod log;
pub mod messages;
pub mod meta;
pub mod participant;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::FromNode;
use crate::protocols::twopc::{Cc, CcWorker, NodeShared};
use crate::rt::Worker;
use crate::txn::Reason;
use meta::MvccMeta;
use std::sync::atomic::{AtomicU64, Ordering};

/// Static-timestamp MVCC's configuration: none beyond the 2PC skeleton's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mvcc;

pub type MvccWorker = CcWorker<Mvcc>;

pub const LATE_WRITE: Reason = Reason::new("mvcc-late-write");
pub const WRITE_CONFLICT: Reason = Reason::new("mvcc-write-conflict");
pub const GONE: Reason = Reason::new("mvcc-version-gone");

/// The abort reasons it defines.
pub const ABORTS: &[(&str, &str)] = &[
    (LATE_WRITE.name(), "a write arrived after a read or a version with a larger timestamp (a lagging clock)"),
    (WRITE_CONFLICT.name(), "a write with a larger timestamp was pending on the record"),
    (GONE.name(), "the version a read's timestamp needs is older than every version the record keeps"),
];

/// Counter: accesses that waited for a pending write with a smaller timestamp.
pub const WAITS: &str = "mvcc-waits";

/// How often a waiting access looks at the record again, and how long it waits at most.
pub const WAIT_POLL_US: u64 = 5;
pub const WAIT_MAX_US: u64 = 20_000;

/// A timestamp is a wall-clock tick (µs) above the coordinating worker's id, unique per worker.
const ID_BITS: u32 = 14;
/// Past the clock skew, how far ahead a restarted node's floor and a fresh read are placed.
const MARGIN_US: u64 = 1_000;

/// What one node keeps beside its storage.
pub struct MvccNode {
    /// A node with a log refuses writes below this timestamp (0: not set yet): reads served
    /// before a crash are not logged.
    floor: AtomicU64,
    durable: bool,
    /// Each worker's last tick, so that its timestamps grow even if the clock stands still.
    last_tick: Vec<AtomicU64>,
}

impl FromNode<Mvcc> for MvccNode {
    fn from_node(_cc: &Mvcc, node: &NodeShared<MvccMeta>, _recovered: &log::MvccLog) -> Self {
        let workers = usize::from(node.topo.workers_per_node).max(1);
        MvccNode {
            floor: AtomicU64::new(0),
            durable: node.log.enabled(),
            last_tick: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl MvccNode {
    /// A timestamp for an attempt that `w` coordinates: its node's wall clock now, or for a
    /// `fresh` attempt (one that must see every acknowledged write) past every node's clock.
    pub fn next_ts(&self, w: &Worker, fresh: bool) -> u64 {
        let ahead = if fresh { w.clock_skew_us() + MARGIN_US } else { 0 };
        let slot = &self.last_tick[usize::from(w.addr.worker)];
        let tick = (w.wall_us() + ahead).max(slot.load(Ordering::Relaxed) + 1);
        slot.store(tick, Ordering::Relaxed);
        let id = (u64::from(w.addr.node) << 6) | u64::from(w.addr.worker);
        debug_assert!(id < 1 << ID_BITS && tick < 1 << (64 - ID_BITS));
        (tick << ID_BITS) | id
    }

    /// The timestamp below which this node refuses writes: none without a log; with one, past
    /// every read it may have served before it (re)started.
    pub fn floor(&self, w: &Worker) -> u64 {
        if !self.durable {
            return 0;
        }
        let set = self.floor.load(Ordering::Acquire);
        if set != 0 {
            return set;
        }
        let new = (w.wall_us() + w.clock_skew_us() + MARGIN_US) << ID_BITS;
        match self.floor.compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => new,
            Err(current) => current,
        }
    }
}

impl Cc for Mvcc {
    const NAME: &'static str = "mvcc";
    type Meta = MvccMeta;
    type NodeState = MvccNode;
    type Log = log::MvccLog;
}
