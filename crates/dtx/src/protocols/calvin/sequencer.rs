//! The sequencer: submissions queue up (at most `max_pending`) and every `batch_us` the queue
//! becomes the next batch, sent to every data node's scheduler. The batch's epoch number is the
//! global order: every scheduler runs batches in epoch order and a batch's transactions in their
//! order in it, so every node sees one serial order.

use super::messages::{Entry, Msg};
use super::{CalvinWorker, SEQUENCER_FULL};
use crate::cluster::Role;
use crate::net::Addr;
use crate::txn::Abort;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub struct Sequencer {
    pending: RefCell<Vec<Entry>>,
    max_pending: usize,
    /// The last epoch sent (epochs start at 1).
    epoch: Cell<u64>,
}

impl Sequencer {
    pub fn new(max_pending: usize) -> Self {
        assert!(max_pending > 0, "the option's bounds keep max_pending positive");
        Sequencer { pending: RefCell::new(Vec::new()), max_pending, epoch: Cell::new(0) }
    }

    /// Queue a submission, or refuse it at the bound (the client retries later).
    pub fn submit(&self, wk: &CalvinWorker, entry: Entry) {
        let mut pending = self.pending.borrow_mut();
        if pending.len() >= self.max_pending {
            drop(pending);
            wk.w.count("sequencer-refusals", 1);
            return wk.deliver(entry.client, Msg::Done { id: entry.id, outcome: Err(Abort::Protocol(SEQUENCER_FULL)) });
        }
        pending.push(entry);
    }

    /// Close the batch: the next epoch with everything queued, or `None` when nothing is.
    fn close(&self) -> Option<(u64, Vec<Entry>)> {
        let entries = std::mem::take(&mut *self.pending.borrow_mut());
        if entries.is_empty() {
            return None;
        }
        let epoch = self.epoch.get() + 1;
        self.epoch.set(epoch);
        Some((epoch, entries))
    }
}

/// Every `batch_us`, send the closed batch to the scheduler (worker 0) of every data node.
pub fn spawn_batcher(me: &Rc<CalvinWorker>) {
    let weak = Rc::downgrade(me);
    let w = me.w.clone();
    let batch_us = me.node.cfg.batch_us;
    w.clone().spawn(async move {
        loop {
            w.sleep_us(batch_us).await;
            let Some(me) = weak.upgrade() else { return };
            let seq = me.sequencer.as_ref().expect("the batcher runs on the sequencer");
            let Some((epoch, entries)) = seq.close() else { continue };
            me.w.count("batches", 1);
            let topo = &me.node.env.topo;
            for node in (0..topo.nodes).filter(|n| topo.roles_of(*n).contains(Role::Data)) {
                me.deliver(Addr::new(node, 0), Msg::Batch { epoch, entries: entries.clone() });
            }
        }
    });
}
