//! Two-phase locking with two-phase commit, in the two classic deadlock-free variants:
//! NO_WAIT (abort on any conflict) and WAIT_DIE (an older transaction waits for a younger
//! holder, a younger one dies). Strict: every lock is held until commit or abort.
//!
//! Roles: [`meta`] the record's lock; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

use crate::net::Addr;
use crate::protocols::twopc::durable::{InDoubt, PlainLog};
use crate::protocols::twopc::{committed_rows, committed_value};
use crate::protocols::twopc::{Cc, CcWorker, NodeShared, TxnId};
use crate::protocols::{Attempt, OptionKind, OptionSpec};
use crate::storage::RowKey;
use crate::storage::Value;
use crate::txn::Scan;
use coordinator::TplTxn;
use meta::LockMeta;
pub use meta::Policy;
use participant::PartTxn;

/// 2PL's configuration.
#[derive(Debug, Clone, Copy)]
pub struct TwoPl {
    pub policy: Policy,
    /// Longest a transaction waits for a lock (WAIT_DIE) before aborting.
    pub lock_wait_us: u64,
}

/// The option of `2pl-waitdie` beside the 2PC skeleton's.
pub const LOCK_WAIT_OPTION: OptionSpec = OptionSpec {
    name: "lock_wait_us",
    kind: OptionKind::U64 { min: 1, max: 60_000_000 },
    default: "500000",
    help: "longest an older transaction waits for a lock before it aborts (lock-timeout)",
};

/// A worker running 2PL over the 2PC skeleton.
pub type TwoPlWorker = CcWorker<TwoPl>;

impl Cc for TwoPl {
    type Meta = LockMeta;
    type Part = PartTxn;
    const NAME: &'static str = "2pl";
    type Request = messages::Request;
    type Reply = messages::Reply;
    type NodeState = ();
    type Log = PlainLog;
    type Txn<'a> = TplTxn<'a>;

    fn node_state(&self, _node: &NodeShared<LockMeta>, _recovered: &PlainLog) {}

    fn begin<'a>(wk: &'a TwoPlWorker, id: TxnId, attempt: Attempt) -> TplTxn<'a> {
        TplTxn::new(wk, id, attempt.first_start_us)
    }

    fn serve(wk: &TwoPlWorker, from: Addr, rpc_id: u64, req: messages::Request) {
        wk.serve(from, rpc_id, req)
    }

    /// OCC and 2PL decisions carry no timestamp.
    fn commit_here(wk: &TwoPlWorker, txn: TxnId, _ts: u64) {
        wk.commit_here(txn)
    }

    fn abort_here(wk: &TwoPlWorker, txn: TxnId) {
        wk.abort_here(txn)
    }

    fn adopt_in_doubt(wk: &TwoPlWorker, in_doubt: InDoubt<()>) {
        wk.adopt_in_doubt(in_doubt)
    }

    fn peek(wk: &TwoPlWorker, key: RowKey) -> Option<Value> {
        committed_value(&wk.node.store, key)
    }

    fn peek_scan(wk: &TwoPlWorker, scan: Scan) -> Vec<(u64, Value)> {
        committed_rows(&wk.node.store, scan)
    }
}
