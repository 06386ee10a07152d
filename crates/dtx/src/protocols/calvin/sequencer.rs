//! The sequencer: submissions queue up (at most `max_pending`) and every `batch_us` the queue
//! becomes the next batch, sent to every data node's scheduler. The batch's epoch number is the
//! global order: every scheduler runs batches in epoch order and a batch's transactions in their
//! order in it, so every node sees one serial order.

use super::input_log::BatchRecord;
use super::messages::{Entry, Msg};
use super::{CalvinWorker, SEQUENCER_FULL};
use crate::cluster::Role;
use crate::net::Addr;
use crate::rt::log_warn;
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
    /// A sequencer whose last batch was `last_epoch` (0: none; after a restart, the last one
    /// its input log holds, so that epochs never repeat).
    pub fn new(max_pending: usize, last_epoch: u64) -> Self {
        assert!(max_pending > 0, "the option's bounds keep max_pending positive");
        Sequencer { pending: RefCell::new(Vec::new()), max_pending, epoch: Cell::new(last_epoch) }
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

/// Every `batch_us`, close a batch, log it (when the run is durable: the batch reaches no
/// scheduler before its node's log, replicated or not, holds it) and send it to the scheduler
/// (worker 0) of every data node.
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
            let entries = log_batch(&me, epoch, entries).await;
            let topo = &me.node.env.topo;
            for node in (0..topo.nodes).filter(|n| topo.roles_of(*n).contains(Role::Data)) {
                me.deliver(Addr::new(node, 0), Msg::Batch { epoch, entries: entries.clone() });
            }
        }
    });
}

/// Log batch `epoch` and wait until it is durable; returns what to send. A batch the log refuses
/// (over its record limit) is logged and sent empty, so that the epochs stay unbroken, and its
/// clients are told.
async fn log_batch(me: &CalvinWorker, epoch: u64, entries: Vec<Entry>) -> Vec<Entry> {
    let Some(log) = &me.node.env.log else { return entries };
    let (lsn, entries) = match log.append(&BatchRecord::encode(epoch, &entries)) {
        Ok(lsn) => (lsn, entries),
        Err(e) => {
            log_warn(&format!("calvin: batch {epoch} of {} transactions was refused by the log: {e}", entries.len()));
            for entry in entries {
                me.deliver(entry.client, Msg::Done { id: entry.id, outcome: Err(Abort::LogRefused) });
            }
            let empty = log.append(&BatchRecord::encode(epoch, &[])).expect("an empty batch fits in a record");
            (empty, Vec::new())
        }
    };
    log.wait(lsn).await;
    entries
}
