//! OCC (Silo-style validation) with two-phase commit: the "F1" baseline of the Sundial paper
//! and the OCC that COCO and Primo compare against.
//!
//! Roles: [`meta`] what a record carries; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types; background: the orphan
//! sweeper (2PC termination) started in [`WorkerProtocol::start`].

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

use crate::net::Addr;
use crate::net::NodeId;
use crate::protocols::common::{resend_unended, spawn_sweeper, CoordTable, NodeShared, PartTable, TxnId};
use crate::protocols::{Attempt, NodeEnv, NodeProtocol, Protocol, WorkerProtocol};
use crate::rt::{Handler, LocalBoxFuture, Worker};
use crate::txn::{recon, Ctx, KeySet, TxnOutput, TxnRequest, TxnResult};
use coordinator::OccTxn;
use meta::OccMeta;
use participant::Writes;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;

pub struct Occ;

impl Protocol for Occ {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol> {
        Arc::new(OccNode(Arc::new(NodeShared::load(env))))
    }
}

struct OccNode(Arc<NodeShared<OccMeta>>);

impl NodeProtocol for OccNode {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let node = self.0.clone();
        let (in_doubt, unended) = node.claim_recovered(w.addr);
        let wk = Rc::new_cyclic(|me| OccWorker {
            me: me.clone(),
            w: w.clone(),
            coord: CoordTable::new(node.boot),
            node,
            parts: PartTable::default(),
            last_outcome_lsn: Cell::new(0),
            unended: RefCell::new(unended),
        });
        wk.adopt_in_doubt(in_doubt);
        let handler: Weak<dyn Handler> = Rc::downgrade(&(wk.clone() as Rc<dyn Handler>));
        w.set_handler(handler);
        wk
    }
}

pub struct OccWorker {
    me: Weak<OccWorker>,
    w: Rc<Worker>,
    node: Arc<NodeShared<OccMeta>>,
    coord: CoordTable,
    parts: PartTable<Writes>,
    /// The last `Outcome` record this worker logged: a commit is acknowledged after it.
    last_outcome_lsn: Cell<u64>,
    /// Commits this worker coordinated before a crash that not every participant acknowledged.
    unended: RefCell<Vec<(TxnId, Vec<NodeId>)>>,
}

impl OccWorker {
    /// Take over transactions prepared here before a crash: their records are locked again
    /// and the orphan sweeper asks their coordinators what became of them.
    fn adopt_in_doubt(&self, in_doubt: Vec<(TxnId, Writes)>) {
        // Last heard of "never": the sweeper asks about them on its first round.
        let now = 0;
        for (txn, writes) in in_doubt {
            let locked = participant::lock_writes(&self.node.store, txn, &writes);
            assert!(locked, "a recovered node has no other lock holders");
            self.parts.txns.borrow_mut().insert(txn, (writes, now));
        }
    }
}

impl OccWorker {
    async fn run(&self, req: &TxnRequest) -> TxnResult<TxnOutput> {
        self.node.log.booted().await;
        self.w.charge(self.w.cost.txn_ns);
        let wl = self.node.workload.clone();
        let mut txn = OccTxn::new(self, self.coord.new_txn(self.w.addr));
        let out = if self.node.opts.one_shot {
            let mut keys = KeySet::default();
            if !wl.declare(req, &mut keys) {
                keys = recon::discover(&*wl, req, self).await?;
            }
            txn.prefetch(&keys).await?;
            let mut ctx = Ctx::with_declared(&mut txn, &keys);
            wl.run(req, &mut ctx).await?
        } else {
            let mut ctx = Ctx::new(&mut txn);
            wl.run(req, &mut ctx).await?
        };
        txn.commit().await?;
        Ok(out)
    }
}

impl WorkerProtocol for OccWorker {
    fn execute<'a>(&'a self, req: &'a TxnRequest, _attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>> {
        Box::pin(self.run(req))
    }

    fn start(&self) {
        if let Some(me) = self.me.upgrade() {
            spawn_sweeper(&me, self.node.opts.orphan_after_us);
            resend_unended(&me, self.unended.take(), encode_commit);
        }
    }
}

impl Handler for OccWorker {
    fn on_request(&self, from: Addr, rpc_id: u64, body: &[u8]) {
        self.serve(from, rpc_id, body)
    }
    fn on_oneway(&self, from: Addr, body: &[u8]) {
        self.serve_oneway(from, body)
    }
}

fn encode_commit(txn: TxnId) -> Vec<u8> {
    crate::net::encode(&messages::Request::Commit { txn })
}

crate::impl_two_pc_worker!(OccWorker);
