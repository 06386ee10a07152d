//! OCC (Silo-style validation) with two-phase commit: the "F1" baseline of the Sundial paper
//! and the OCC that COCO and Primo compare against.
//!
//! Roles: [`meta`] what a record carries; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types. The 2PC skeleton
//! ([`crate::protocols::twopc`]) runs the rest: the decision table, the orphan sweeper, recovery.

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

#[cfg(test)]
mod tests;

use crate::net::Addr;
use crate::protocols::twopc::durable::{InDoubt, PlainLog};
use crate::protocols::twopc::{Cc, CcWorker, NodeShared, TxnId};
use crate::protocols::Attempt;
use crate::storage::RowKey;
use crate::storage::Value;
use crate::txn::Scan;
use coordinator::OccTxn;
use meta::OccMeta;
use participant::Writes;

/// OCC's configuration: none beyond the 2PC skeleton's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Occ;

/// A worker running OCC over the 2PC skeleton.
pub type OccWorker = CcWorker<Occ>;

impl Cc for Occ {
    type Meta = OccMeta;
    /// A remote transaction's locked writes, installed at commit.
    type Part = Writes;
    const NAME: &'static str = "occ";
    type Request = messages::Request;
    type Reply = messages::Reply;
    type NodeState = ();
    type Log = PlainLog;
    type Txn<'a> = OccTxn<'a>;

    fn node_state(&self, _node: &NodeShared<OccMeta>, _recovered: &PlainLog) {}

    fn begin<'a>(wk: &'a OccWorker, id: TxnId, _attempt: Attempt) -> OccTxn<'a> {
        OccTxn::new(wk, id)
    }

    fn serve(wk: &OccWorker, from: Addr, rpc_id: u64, req: messages::Request) {
        wk.serve(from, rpc_id, req)
    }

    /// OCC and 2PL decisions carry no timestamp.
    fn commit_here(wk: &OccWorker, txn: TxnId, _ts: u64) {
        wk.commit_here(txn)
    }

    fn abort_here(wk: &OccWorker, txn: TxnId) {
        wk.abort_here(txn)
    }

    /// Transactions prepared here before a crash: their records are locked again and the
    /// orphan sweeper asks their coordinators what became of them.
    fn adopt_in_doubt(wk: &OccWorker, in_doubt: InDoubt<()>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes, ()) in in_doubt {
            let locked = participant::lock_writes(&wk.node.store, txn, &writes);
            assert!(locked, "a recovered node has no other lock holders");
            wk.parts.txns.borrow_mut().insert(txn, (writes, now));
        }
    }

    fn peek(wk: &OccWorker, key: RowKey) -> Option<Value> {
        participant::read(&wk.node.store, key).0
    }

    fn peek_scan(wk: &OccWorker, scan: Scan) -> Vec<(u64, Value)> {
        participant::scan(&wk.node.store, scan).into_iter().map(|(k, v, _)| (k, v)).collect()
    }
}
