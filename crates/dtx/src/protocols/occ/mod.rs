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
use crate::protocols::common::{spawn_sweeper, CoordTable, NodeShared, PartTable};
use crate::protocols::{Attempt, NodeEnv, NodeProtocol, Protocol, WorkerProtocol};
use crate::rt::{Handler, LocalBoxFuture, Worker};
use crate::txn::{recon, Ctx, KeySet, TxnOutput, TxnRequest, TxnResult};
use coordinator::OccTxn;
use meta::OccMeta;
use participant::Writes;
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
        let wk = Rc::new_cyclic(|me| OccWorker {
            me: me.clone(),
            w: w.clone(),
            node,
            coord: CoordTable::default(),
            parts: PartTable::default(),
        });
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
}

impl OccWorker {
    async fn run(&self, req: &TxnRequest) -> TxnResult<TxnOutput> {
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

crate::impl_two_pc_worker!(OccWorker);
