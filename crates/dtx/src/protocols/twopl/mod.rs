//! Two-phase locking with two-phase commit, in the two classic deadlock-free variants:
//! NO_WAIT (abort on any conflict) and WAIT_DIE (an older transaction waits for a younger
//! holder, a younger one dies). Strict: every lock is held until commit or abort.
//!
//! Roles: [`meta`] the record's lock; [`coordinator`] execution and commit; [`participant`]
//! what a node does for remote transactions; [`messages`] the wire types; background: the
//! orphan sweeper (2PC termination) started in [`WorkerProtocol::start`].

pub mod coordinator;
pub mod messages;
pub mod meta;
pub mod participant;

use crate::net::{Addr, NodeId};
use crate::protocols::common::{resend_unended, spawn_sweeper, CoordTable, NodeShared, PartTable, TxnId};
use crate::protocols::{Attempt, NodeEnv, NodeProtocol, Protocol, WorkerProtocol};
use crate::rt::{Handler, LocalBoxFuture, Worker};
use crate::txn::{recon, Ctx, KeySet, TxnOutput, TxnRequest, TxnResult};
use coordinator::TplTxn;
use meta::LockMeta;
pub use meta::Policy;
use participant::PartTxn;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;

pub struct TwoPl {
    pub policy: Policy,
}

impl Protocol for TwoPl {
    fn build_node(&self, env: NodeEnv) -> Arc<dyn NodeProtocol> {
        Arc::new(TwoPlNode { shared: Arc::new(NodeShared::load(env)), policy: self.policy })
    }
}

struct TwoPlNode {
    shared: Arc<NodeShared<LockMeta>>,
    policy: Policy,
}

impl NodeProtocol for TwoPlNode {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        let (in_doubt, unended) = self.shared.claim_recovered(w.addr);
        let wk = Rc::new_cyclic(|me| TwoPlWorker {
            me: me.clone(),
            w: w.clone(),
            node: self.shared.clone(),
            policy: self.policy,
            coord: CoordTable::new(self.shared.boot),
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

pub struct TwoPlWorker {
    me: Weak<TwoPlWorker>,
    w: Rc<Worker>,
    node: Arc<NodeShared<LockMeta>>,
    policy: Policy,
    coord: CoordTable,
    parts: PartTable<PartTxn>,
    /// The last `Outcome` record this worker logged: a commit is acknowledged after it.
    last_outcome_lsn: Cell<u64>,
    /// Commits this worker coordinated before a crash that not every participant acknowledged.
    unended: RefCell<Vec<(TxnId, Vec<NodeId>)>>,
}

impl TwoPlWorker {
    async fn run(&self, req: &TxnRequest, attempt: Attempt) -> TxnResult<TxnOutput> {
        self.node.log.booted().await;
        self.w.charge(self.w.cost.txn_ns);
        let wl = self.node.workload.clone();
        let mut txn = TplTxn::new(self, self.coord.new_txn(self.w.addr), attempt.first_start_us);
        let result = if self.node.opts.one_shot {
            let mut keys = KeySet::default();
            if !wl.declare(req, &mut keys) {
                keys = recon::discover(&*wl, req, self).await?;
            }
            match txn.prefetch(&keys).await {
                Ok(()) => {
                    let mut ctx = Ctx::with_declared(&mut txn, &keys);
                    wl.run(req, &mut ctx).await
                }
                Err(a) => Err(a),
            }
        } else {
            let mut ctx = Ctx::new(&mut txn);
            wl.run(req, &mut ctx).await
        };
        match result {
            Ok(out) => {
                txn.commit().await?;
                Ok(out)
            }
            Err(a) => Err(txn.abort(a)),
        }
    }
}

impl WorkerProtocol for TwoPlWorker {
    fn execute<'a>(&'a self, req: &'a TxnRequest, attempt: Attempt) -> LocalBoxFuture<'a, TxnResult<TxnOutput>> {
        Box::pin(self.run(req, attempt))
    }

    fn start(&self) {
        if let Some(me) = self.me.upgrade() {
            spawn_sweeper(&me, self.node.opts.orphan_after_us);
            resend_unended(&me, self.unended.take(), encode_commit);
        }
    }
}

impl Handler for TwoPlWorker {
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

crate::impl_two_pc_worker!(TwoPlWorker);
