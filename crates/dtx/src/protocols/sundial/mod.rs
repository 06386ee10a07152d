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
//! Not built yet, so `sundial` stays `planned` in `dtx protocols`: the read-only table
//! optimizations (table leases, speculative extension), leases that survive a crash, MaaT
//! beside it, and the paper's experiments. A node that recovers prepared Sundial transactions
//! refuses to (`adopt_in_doubt`). The design for crashes, for whoever builds it:
//! - log a bound `UT` past every lease end and commit timestamp the node grants
//!   (`lease::UpperBound`, a record in the node's log before the grant), and the commit
//!   timestamp in the prepare record;
//! - after recovery every version written before `UT` reads as `[UT, UT]` (lazily, when a
//!   record is next touched), except a tuple locked by a recovered prepared transaction `T`,
//!   whose old version keeps `[T.ts - 1, T.ts - 1]` until `T` installs at `T.ts` or aborts;
//! - a lease handed out before its bound is durable must not be relied on: a `Fetch` reply
//!   waits for the bound's record (the prepare and commit paths already wait for later records
//!   of the same log), else a cached copy could outlive a crash that forgot its lease.

pub mod coordinator;
pub mod lease;
pub mod messages;
pub mod meta;
pub mod participant;
pub mod policy;

#[cfg(test)]
mod tests;

use crate::net::Addr;
use crate::protocols::twopc::durable::InDoubt;
use crate::protocols::twopc::{Cc, CcWorker, NodeShared, TxnId};
use crate::protocols::{Attempt, OptionKind, OptionSpec};
use crate::storage::cache::RecordCache;
use crate::txn::Reason;
use coordinator::SundialTxn;
use lease::Lease;
use meta::SundialMeta;
use participant::PartTxn;
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
}

impl Sundial {
    /// Sundial with the options of a variant.
    pub fn new(o: &crate::protocols::Options) -> Self {
        let cache = CachePolicy::parse(o.choice(CACHE_OPTION.name)).expect("the option's choices are the policies");
        Sundial {
            lock_wait_us: o.u64(crate::protocols::twopl::LOCK_WAIT_OPTION.name),
            cache,
            cache_bytes: (o.u64(CACHE_MB_OPTION.name) as usize) << 20,
        }
    }
}

/// What a node keeps beside its storage: its cache of remote tuples (each with the lease it was
/// read or last renewed with), and the hybrid policy's votes.
pub struct SundialNode {
    pub policy: CachePolicy,
    pub cache: RecordCache<Lease>,
    pub votes: Votes,
}

/// Banks of the cache (the authors' code uses 64).
const CACHE_BANKS: usize = 64;

pub const CACHE_OPTION: OptionSpec = OptionSpec {
    name: "cache",
    kind: OptionKind::Choice(&["none", "reuse", "request", "hybrid"]),
    default: "hybrid",
    help: "when a cached copy of a remote tuple is used: never, always, after asking its home, or as recent evidence votes",
};

pub const CACHE_MB_OPTION: OptionSpec = OptionSpec {
    name: "cache_mb",
    kind: OptionKind::U64 { min: 1, max: 1 << 20 },
    default: "1024",
    help: "the cache's bound per node, in MiB (the paper's default: 1 GB)",
};

pub type SundialWorker = CcWorker<Sundial>;

/// Its options beside the 2PC skeleton's.
pub const OPTIONS: &[OptionSpec] =
    &[CACHE_OPTION, CACHE_MB_OPTION, crate::protocols::twopl::LOCK_WAIT_OPTION, crate::protocols::twopc::ORPHAN_OPTION];

pub const READ_THEN_WRITE_CHANGED: Reason = Reason::new("read-then-write-changed");

/// The abort reasons it defines (the paper's cases, Sec. 5.1); WAIT_DIE's are the shared ones.
pub const ABORTS: &[(&str, &str)] = &[
    ("lease-newer-version-after", "a read's tuple has a newer version written after the commit timestamp (case a)"),
    ("lease-newer-version-before", "a read's tuple has a newer version at or before the commit timestamp (case b)"),
    ("lease-locked", "a read's lease must be extended but a writer holds the tuple (case c)"),
    ("read-then-write-changed", "a tuple read and then locked to be written had changed in between"),
];

/// Counters: lease extensions tried at prepare, and those that failed; remote reads answered
/// by the cache without a message, reads that asked whether a cached copy is current, and those
/// it was.
pub const RENEWALS: &str = "lease-renewals";
pub const RENEWALS_FAILED: &str = "lease-renewals-failed";
pub const CACHE_REUSED: &str = "cache-reused";
pub const CACHE_CHECKS: &str = "cache-checks";
pub const CACHE_CURRENT: &str = "cache-current";

impl Cc for Sundial {
    const NAME: &'static str = "sundial";
    type Request = messages::Request;
    type Reply = messages::Reply;
    type Meta = SundialMeta;
    type Part = PartTxn;
    type Txn<'a> = SundialTxn<'a>;
    type NodeState = SundialNode;

    fn node_state(&self, _node: &NodeShared<SundialMeta>) -> SundialNode {
        SundialNode {
            policy: self.cache,
            cache: RecordCache::new(self.cache_bytes, CACHE_BANKS),
            votes: Votes::default(),
        }
    }

    fn begin<'a>(wk: &'a SundialWorker, id: TxnId, attempt: Attempt) -> SundialTxn<'a> {
        SundialTxn::new(wk, id, attempt)
    }

    fn serve(wk: &SundialWorker, from: Addr, rpc_id: u64, req: messages::Request) {
        wk.serve(from, rpc_id, req)
    }

    fn commit_here(wk: &SundialWorker, txn: TxnId) {
        wk.commit_here(txn)
    }

    fn abort_here(wk: &SundialWorker, txn: TxnId) {
        wk.abort_here(txn)
    }

    /// Prepared transactions survive a crash only with their commit timestamp, which the
    /// prepare record does not carry yet: `sundial` is not run with a log until it does.
    fn adopt_in_doubt(_wk: &SundialWorker, in_doubt: InDoubt) {
        assert!(in_doubt.is_empty(), "sundial does not recover prepared transactions yet (planned)");
    }
}
