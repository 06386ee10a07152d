//! Sundial (Yu, Xia, Pavlo, Sanchez, Rudolph, Devadas; PVLDB 11(10), 2018): per-tuple logical
//! leases, a commit timestamp computed from them, write-write conflicts under 2PL WAIT_DIE and
//! read-write conflicts resolved optimistically in logical time, and a cache of remote reads
//! kept coherent by the same leases.
//!
//! Roles, as every protocol over the 2PC skeleton: [`meta`] what a record carries (its lease
//! and its write lock); [`coordinator`] execution and commit (Alg. 1-3); [`participant`] what a
//! node does for remote transactions; [`messages`] the wire types; and Sundial's own:
//! [`lease`] the lease rules with the paper's worked examples as tests, [`policy`] the cache
//! policies. The bounded cache is a storage piece ([`crate::storage::cache`]).
//!
//! The cache of remote reads (Sec. 4) is per node (`SundialNode`): bounded (`cache_mb`),
//! banked and LRU (`storage::cache`), under the policy `cache=none|reuse|request|hybrid`
//! (default hybrid, 1 GB, as the paper's); a copy is a genuine past observation of a version
//! with its lease, so a stale one is caught when its lease cannot be extended at prepare, and
//! leaves the cache. A transaction that must see the current state (the run's final read and
//! checks: `Attempt::fresh`) reads from homes, not the cache: a cached read may legally
//! serialize before writes that committed earlier in real time (Sundial is serializable, not
//! strictly serializable).
//!
//! A range scan reads the rows it returns with their leases, not the gaps between them (no
//! phantom protection, as for OCC and 2PL; the paper's leases on index nodes are not built).
//!
//! Leases survive a crash (Sec. 3.5): a node logs a bound `UT` past every lease end and commit
//! timestamp it grants (`lease::UpperBound`, a `Bound` record of its own ([`crate::protocols::twopc::lease_log`]) before the grant; a `Fetch` reply
//! waits until the bound's record is durable, since its leases may be relied on without asking
//! again), and its votes log their commit timestamps ([`crate::protocols::twopc::lease_log`]). After recovery every
//! version written before the bound reads as `[UT, UT]` (lazily, `SundialMeta::current`), except
//! a tuple locked by a recovered prepared transaction `T`, whose version keeps `[T.ts - 1,
//! T.ts - 1]` until `T` installs at `T.ts` or aborts.
//!
//! The read-only table optimizations (Sec. 4.3, option `table_leases`, on by default) are in
//! [`tables`]: a home extends every tuple of a table never written at once, and further than
//! asked (a growing `δ`), and reports the table's lease to the requester's cache.
//!
//! Where `sundial` lives (paths under `crates/dtx/src/`; `dtx protocols --options sundial` prints this map):
//! - `protocols/sundial/coordinator.rs`: execution, the cache of remote reads, commit;
//! - `protocols/sundial/participant.rs`: leases renewed, WAIT_DIE writes, votes;
//! - `protocols/twopc/lease.rs`: logical leases;
//! - `protocols/twopc/lease_log.rs`: what it logs beside 2PC;
//! - `protocols/twopc/record_lock.rs`: the write lock (WAIT_DIE);
//! - `protocols/twopc/skeleton.rs`: 2PC.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;
pub mod policy;
pub mod tables;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::lease::{self, Lease, UpperBound};
use crate::protocols::twopc::lease_log::{LeaseLog, LeaseRecord};
use crate::protocols::twopc::FromNode;
use crate::protocols::twopc::{Cc, CcWorker, NodeShared, TxnId};
use crate::protocols::{OptionKind, OptionSpec};
use crate::storage::cache::RecordCache;
use crate::storage::{RowKey, Value};
use crate::txn::{Reason, Scan};
use meta::SundialMeta;
use policy::{CachePolicy, Votes};

/// Sundial's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Sundial {
    /// Longest a writer waits for a tuple's lock (WAIT_DIE) before aborting.
    pub lock_wait_us: u64,
    /// When a cached copy of a remote tuple is used.
    pub cache: CachePolicy,
    /// The cache's bound per node.
    pub cache_bytes: usize,
    /// The read-only table optimizations (Sec. 4.3).
    pub table_leases: bool,
}

impl Sundial {
    /// Sundial with the options of a variant.
    pub fn new(o: &crate::protocols::Options) -> Self {
        let cache = CachePolicy::parse(o.choice(CACHE_OPTION.name)).expect("the option's choices are the policies");
        Sundial {
            lock_wait_us: o.u64(crate::protocols::twopc::record_lock::LOCK_WAIT_OPTION.name),
            cache,
            cache_bytes: (o.u64(CACHE_MB_OPTION.name) as usize) << 20,
            table_leases: o.bool(TABLE_LEASES_OPTION.name),
        }
    }
}

/// What a node keeps beside its storage: its cache of remote tuples (each with the lease it was
/// read or last renewed with), and the hybrid policy's votes.
pub struct SundialNode {
    pub policy: CachePolicy,
    pub cache: RecordCache<Lease>,
    pub votes: Votes,
    /// The bound recovered from the node's log: every older lease reads as `[floor, floor]`.
    pub floor: u64,
    /// The bound logged past every timestamp this node grants, and the log position of its
    /// last record (a lease handed out is relied on only once that is durable).
    pub bound: parking_lot::Mutex<(UpperBound, Option<u64>)>,
    /// The leases of this node's read-only tables (`table_leases`), and those other nodes
    /// reported to its cache.
    pub tables: tables::TableLeases,
    pub remote_tables: tables::RemoteTableLeases,
}

/// How far past a granted timestamp a new bound is logged: a bound record every 65,536 units
/// of logical time (a unit per conflicting commit, roughly).
const BOUND_STEP: u64 = 1 << 16;

/// A node's state starts from what its log recovered.
impl FromNode<Sundial> for SundialNode {
    fn from_node(cc: &Sundial, node: &NodeShared<SundialMeta>, recovered: &LeaseLog) -> Self {
        let floor = recovered.bound;
        SundialNode {
            policy: cc.cache,
            cache: RecordCache::new(cc.cache_bytes, CACHE_BANKS),
            votes: Votes::default(),
            floor,
            bound: parking_lot::Mutex::new((UpperBound { logged: floor, step: BOUND_STEP }, None)),
            tables: tables::TableLeases::new(node.store.tables(), cc.table_leases),
            remote_tables: tables::RemoteTableLeases::default(),
        }
    }
}

impl SundialNode {
    /// Log a new bound first if `ts` (a lease end or a commit timestamp about to be granted
    /// here) passes the logged one. A log that refuses the record aborts the transaction.
    pub fn grant(&self, txn_log: &crate::protocols::twopc::durable::TxnLog, ts: u64) -> crate::txn::TxnResult<()> {
        if !txn_log.enabled() {
            // Nothing survives a crash to bound: and every worker's commit would take this
            // node-wide mutex.
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

    /// A committed version and its lease as a home reports it: a tuple of a read-only table is
    /// extended to its table's lease.
    pub fn read(&self, rec: &meta::Rec, key: RowKey) -> (Option<Value>, Lease) {
        let (value, mut lease) = meta::read(rec, self.floor);
        lease.rts = lease.rts.max(self.tables.rts(key.table));
        (value, lease)
    }

    /// The existing rows of a range with their leases, as [`SundialNode::read`] reports them.
    pub fn scan(&self, store: &crate::storage::Storage<SundialMeta>, s: Scan) -> Vec<(u64, Value, Lease)> {
        let tab = self.tables.rts(s.table);
        let mut rows = meta::scan(store, s, self.floor);
        rows.iter_mut().for_each(|r| r.2.rts = r.2.rts.max(tab));
        rows
    }

    /// A writer holds a tuple of the range (a fresh scan must not read around it).
    pub fn scan_written(&self, store: &crate::storage::Storage<SundialMeta>, s: Scan) -> bool {
        store
            .table(s.table)
            .range(s.lo, s.hi, s.limit as usize, s.descending)
            .into_iter()
            .any(|(_, r)| meta::written_by_other(r, 0))
    }

    /// The lease of a tuple `txn` locked to write: its commit timestamp passes the table's
    /// lease too, and the table is read-only no more.
    pub fn locked_lease(&self, rec: &meta::Rec, txn: TxnId, key: RowKey) -> (Option<Value>, Lease) {
        let (value, mut lease) = meta::locked_lease(rec, txn, self.floor);
        lease.rts = lease.rts.max(self.tables.writer_floor(key.table));
        (value, lease)
    }

    /// Extend a read's lease to `commit_ts` (Alg. 2), through its table's lease where the table
    /// is read-only: `Some(end)` when that was extended (counted), for the requester's cache.
    pub fn renew(
        &self,
        w: &crate::rt::Worker,
        rec: &meta::Rec,
        key: RowKey,
        txn: TxnId,
        read_wts: u64,
        commit_ts: u64,
    ) -> Result<Option<u64>, lease::RenewFailure> {
        w.count(RENEWALS, 1);
        let extend = || self.tables.extend(key.table, commit_ts);
        let renewed = meta::renew(rec, txn, read_wts, commit_ts, self.floor, self.tables.rts(key.table), extend);
        match renewed {
            Ok(Some(_)) => w.count(TABLE_EXTENSIONS, 1),
            Ok(None) => {}
            Err(_) => w.count(RENEWALS_FAILED, 1),
        }
        renewed
    }

    /// The log position a lease handed out now must wait for: the last bound's record.
    pub fn bound_lsn(&self) -> Option<u64> {
        self.bound.lock().1
    }
}

/// Banks of the cache (the authors' code uses 64).
const CACHE_BANKS: usize = 64;

pub const CACHE_OPTION: OptionSpec = OptionSpec {
    name: "cache",
    kind: OptionKind::Choice(&["none", "reuse", "request", "hybrid"]),
    default: "hybrid",
    help: "when a cached copy of a remote tuple is used: never, always, after asking its home, or as recent evidence votes",
};

pub const TABLE_LEASES_OPTION: OptionSpec = OptionSpec {
    name: "table_leases",
    kind: OptionKind::Bool,
    default: "true",
    help: "the read-only table optimizations (Sec. 4.3): one lease per table never written, extended at once and speculatively",
};

pub const CACHE_MB_OPTION: OptionSpec = OptionSpec {
    name: "cache_mb",
    kind: OptionKind::U64 { min: 1, max: 1 << 20 },
    default: "1024",
    help: "the cache's bound per node, in MiB (the paper's default: 1 GB)",
};

pub type SundialWorker = CcWorker<Sundial>;

/// Its options beside the 2PC skeleton's.
pub const OPTIONS: &[OptionSpec] = &[
    CACHE_OPTION,
    CACHE_MB_OPTION,
    TABLE_LEASES_OPTION,
    crate::protocols::twopc::record_lock::LOCK_WAIT_OPTION,
    crate::protocols::twopc::ORPHAN_OPTION,
    crate::protocols::twopc::commit::watermark::COMMIT_OPTION,
    crate::protocols::twopc::commit::epoch::EPOCH_OPTION,
    crate::protocols::twopc::commit::watermark::WM_OPTION,
    crate::protocols::twopc::commit::watermark::FLOOR_OPTION,
];

pub const READ_THEN_WRITE_CHANGED: Reason = Reason::new("read-then-write-changed");
pub const FRESH_READ_LOCKED: Reason = Reason::new("fresh-read-locked");

/// The abort reasons it defines (the paper's cases, Sec. 5.1); WAIT_DIE's are the shared ones.
pub const ABORTS: &[(&str, &str)] = &[
    ("lease-newer-version-after", "a read's tuple has a newer version written after the commit timestamp (case a)"),
    ("lease-newer-version-before", "a read's tuple has a newer version at or before the commit timestamp (case b)"),
    ("lease-locked", "a read's lease must be extended but a writer holds the tuple (case c)"),
    (READ_THEN_WRITE_CHANGED.name(), "a tuple read and then locked to be written had changed in between"),
    (
        FRESH_READ_LOCKED.name(),
        "a read that must see every acknowledged write (a run's final read) met a tuple a writer holds; it retries",
    ),
];

/// Counters: lease extensions tried at prepare, and those that failed; remote reads answered
/// by the cache without a message, reads that asked whether a cached copy is current, and those
/// it was.
pub const RENEWALS: &str = "lease-renewals";
pub const RENEWALS_FAILED: &str = "lease-renewals-failed";
pub const CACHE_REUSED: &str = "cache-reused";
pub const CACHE_CHECKS: &str = "cache-checks";
pub const CACHE_CURRENT: &str = "cache-current";
/// Lease extensions answered by extending a read-only table's lease.
pub const TABLE_EXTENSIONS: &str = "table-lease-extensions";

impl Cc for Sundial {
    const NAME: &'static str = "sundial";
    type Meta = SundialMeta;
    type NodeState = SundialNode;
    type Log = LeaseLog;
}
