//! A sequencer: its node's clients' submissions queue up (at most `max_pending`) and every
//! `batch_us` the queue becomes the sequencer's batch of the next epoch, sent to every data
//! node's scheduler. With a sequencer per data node (Calvin's), the global order is every
//! epoch's batches taken round-robin in node order, and a batch's transactions in their order
//! in it: every node sees one serial order. A sequencer sends a batch every epoch, empty or not,
//! since the schedulers take each sequencer's batch of an epoch in turn; one that falls behind
//! the others (it restarted, or stalled) fills the epochs it missed with empty batches, so that
//! the others' transactions wait for it at most one batch.

use super::input_log::Record;
use super::messages::{Entry, Msg};
use super::{CalvinWorker, SEQUENCER_FULL};
use crate::cluster::Role;
use crate::net::Addr;
use crate::rt::log_warn;
use crate::txn::Abort;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// SLOG's orderer batches held ahead of the next one a region's sequencer takes.
const MAX_EARLY_ORDERED: usize = 1 << 12;

/// An RPC to answer later: who asked, and its id.
pub type Reply = (Addr, u64);

/// What the first sequencer of a SLOG region's log takes from the orderer: the region's pieces
/// of multi-home transactions, batch after batch in the orderer's numbering, placed in its
/// next batches in that order (so every home's log holds them in the global order). The
/// orderer hears that a batch was taken once the log batch holding its pieces is durable: a
/// sequencer that crashes before loses nothing the orderer does not send again.
#[derive(Default)]
struct FromOrderer {
    /// The next orderer batch to take (batches are numbered from 1).
    next: u64,
    /// The last orderer batch whose pieces a durable batch of this sequencer holds.
    durable: u64,
    early: BTreeMap<u64, Vec<Entry>>,
    /// Answers owed to the orderer, by the batch they acknowledge.
    replies: Vec<(u64, Reply)>,
}

/// Epochs a sequencer fills at once when it catches up; the rest wait for its next batch.
const MAX_FILL: u64 = 1 << 12;

pub struct Sequencer {
    pending: RefCell<Vec<Entry>>,
    max_pending: usize,
    /// The last epoch sent (epochs start at 1).
    epoch: Cell<u64>,
    /// The highest epoch heard from another sequencer (its batch reached this node's scheduler).
    heard: Cell<u64>,
    /// Batches the log held when the node started: sent again first, since the crash may have
    /// cut their sending short (schedulers drop copies they have).
    resend: RefCell<Vec<(u64, Vec<Entry>)>>,
    from_orderer: RefCell<FromOrderer>,
}

impl Sequencer {
    /// A sequencer whose last batch was `last_epoch` (0: none; after a restart, the last one
    /// its input log holds, so that epochs never repeat), with the batches its log still holds.
    pub fn new(max_pending: usize, last_epoch: u64, recovered: Vec<(u64, Vec<Entry>)>) -> Self {
        assert!(max_pending > 0, "the option's bounds keep max_pending positive");
        assert!(recovered.iter().all(|(e, _)| *e <= last_epoch), "the last epoch covers what was logged");
        let pieces = recovered.iter().flat_map(|(_, entries)| entries.iter().filter_map(|e| e.piece));
        let durable = pieces.map(|p| p.region_batch).max().unwrap_or(0);
        Sequencer {
            from_orderer: RefCell::new(FromOrderer { next: durable + 1, durable, ..Default::default() }),
            pending: RefCell::new(Vec::new()),
            max_pending,
            epoch: Cell::new(last_epoch),
            heard: Cell::new(0),
            resend: RefCell::new(recovered),
        }
    }

    /// Another sequencer's batch of `epoch` arrived here.
    pub fn heard(&self, epoch: u64) {
        self.heard.set(self.heard.get().max(epoch));
    }

    /// Queue a submission, or refuse it at the bound (the client retries later).
    pub fn submit(&self, wk: &CalvinWorker, entry: Entry) {
        wk.queue_or_refuse(&self.pending, self.max_pending, entry, SEQUENCER_FULL, "sequencer-refusals");
    }

    /// Take the orderer's batch `region_batch` of pieces (SLOG), answering `reply` once a
    /// durable batch of this sequencer holds them (at once for a copy of one that does; no
    /// answer is owed when the orderer is this worker: its log sends the batch again).
    pub fn ordered(&self, wk: &CalvinWorker, region_batch: u64, entries: Vec<Entry>, reply: Option<Reply>) {
        let mut o = self.from_orderer.borrow_mut();
        if region_batch <= o.durable {
            if let Some((from, rpc_id)) = reply {
                wk.w.reply(from, rpc_id, &[]);
            }
            return;
        }
        o.replies.extend(reply.map(|r| (region_batch, r)));
        if region_batch < o.next || o.early.contains_key(&region_batch) {
            return; // A copy of one taken, not yet durable: answered with the first.
        }
        assert!(o.early.len() < MAX_EARLY_ORDERED, "orderer batches pile up ahead of {}", o.next);
        o.early.insert(region_batch, entries);
        while let Some(entries) = {
            let next = o.next;
            o.early.remove(&next)
        } {
            // Pieces are never refused: the orderer has ordered them, and every home must
            // place them (max_pending bounds only clients' submissions).
            self.pending.borrow_mut().extend(entries);
            o.next += 1;
        }
    }

    /// `batches` are durable: answer the orderer for the batches of pieces they hold.
    fn logged(&self, wk: &CalvinWorker, batches: &[(u64, Vec<Entry>)]) {
        let pieces = batches.iter().flat_map(|(_, entries)| entries.iter().filter_map(|e| e.piece));
        let Some(last) = pieces.map(|p| p.region_batch).max() else { return };
        let mut o = self.from_orderer.borrow_mut();
        o.durable = o.durable.max(last);
        let durable = o.durable;
        o.replies.retain(|(batch, (from, rpc_id))| {
            let done = *batch <= durable;
            if done {
                wk.w.reply(*from, *rpc_id, &[]);
            }
            !done
        });
    }

    /// Close the batch: the next epoch with everything queued, after empty batches for the
    /// epochs the other sequencers have gone past (at most [`MAX_FILL`] of them).
    fn close(&self) -> Vec<(u64, Vec<Entry>)> {
        let last = self.epoch.get();
        let epoch = (last + 1).max(self.heard.get()).min(last + MAX_FILL);
        let mut batches: Vec<(u64, Vec<Entry>)> = (last + 1..epoch).map(|e| (e, Vec::new())).collect();
        batches.push((epoch, std::mem::take(&mut *self.pending.borrow_mut())));
        self.epoch.set(epoch);
        batches
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
        if let Some(me) = weak.upgrade() {
            let resend = std::mem::take(&mut *me.sequencer.as_ref().expect("a sequencer").resend.borrow_mut());
            resend.into_iter().for_each(|(epoch, entries)| send(&me, epoch, entries));
        }
        loop {
            w.sleep_us(batch_us).await;
            let Some(me) = weak.upgrade() else { return };
            let seq = me.sequencer.as_ref().expect("the batcher runs on the sequencer");
            let batches = seq.close();
            me.w.count("batches", 1);
            me.w.count("empty-batches-filled", batches.len() as u64 - 1);
            let batches = log_batches(&me, batches).await;
            seq.logged(&me, &batches);
            for (epoch, entries) in batches {
                send(&me, epoch, entries);
            }
        }
    });
}

fn send(me: &CalvinWorker, epoch: u64, entries: Vec<Entry>) {
    let topo = &me.node.env.topo;
    let sequencer = me.w.addr.node;
    for node in (0..topo.nodes).filter(|n| topo.roles_of(*n).contains(Role::Data)) {
        me.deliver(Addr::new(node, 0), Msg::Batch { epoch, sequencer, entries: entries.clone() });
    }
}

/// Log `batches` and wait until they are durable; returns what to send. A batch the log refuses
/// (over its record limit) is logged and sent empty, so that the epochs stay unbroken, and its
/// clients are told (its SLOG pieces wait for the next batch).
async fn log_batches(me: &CalvinWorker, batches: Vec<(u64, Vec<Entry>)>) -> Vec<(u64, Vec<Entry>)> {
    let Some(log) = &me.node.env.log else { return batches };
    let mut last = None;
    let mut logged = Vec::with_capacity(batches.len());
    for (epoch, entries) in batches {
        let (lsn, entries) = match log.append(&Record::batch(epoch, me.w.addr.node, &entries)) {
            Ok(lsn) => (lsn, entries),
            Err(e) => {
                log_warn(&format!(
                    "calvin: batch {epoch} of {} transactions was refused by the log: {e}",
                    entries.len()
                ));
                let (pieces, whole): (Vec<Entry>, Vec<Entry>) = entries.into_iter().partition(|e| e.piece.is_some());
                for entry in whole {
                    me.deliver(entry.client, Msg::Done { id: entry.id, outcome: Err(Abort::LogRefused) });
                }
                // SLOG's pieces are ordered already and every home must place them: they go
                // first into the next batch (the orderer hears nothing of them until then).
                let seq = me.sequencer.as_ref().expect("a sequencer logs batches");
                seq.pending.borrow_mut().splice(0..0, pieces);
                let empty =
                    log.append(&Record::batch(epoch, me.w.addr.node, &[])).expect("an empty batch fits in a record");
                (empty, Vec::new())
            }
        };
        last = Some(lsn);
        logged.push((epoch, entries));
    }
    if let Some(lsn) = last {
        let t0 = me.w.now_ns();
        log.wait(lsn).await;
        // Every transaction in these batches waited for this one write (group commit, Calvin's
        // replicated input): the run reports it as one wait for the log.
        if logged.iter().any(|(_, entries)| !entries.is_empty()) {
            me.w.note_log_wait(me.w.now_ns() - t0);
        }
    }
    logged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Entry {
        Entry { client: Addr::new(1, 1), id, req: Vec::new(), keys: None, piece: None }
    }

    fn epochs(batches: &[(u64, Vec<Entry>)]) -> Vec<(u64, usize)> {
        batches.iter().map(|(e, b)| (*e, b.len())).collect()
    }

    #[test]
    fn a_sequencer_sends_a_batch_every_epoch_and_catches_up_on_the_others_with_empty_ones() {
        let s = Sequencer::new(10, 0, Vec::new());
        assert_eq!(epochs(&s.close()), vec![(1, 0)], "an empty epoch is still sent");
        s.pending.borrow_mut().extend([entry(1), entry(2)]);
        assert_eq!(epochs(&s.close()), vec![(2, 2)]);
        s.heard(2);
        assert_eq!(epochs(&s.close()), vec![(3, 0)], "an epoch heard from another is no jump");
        s.heard(7);
        s.pending.borrow_mut().push(entry(3));
        assert_eq!(epochs(&s.close()), vec![(4, 0), (5, 0), (6, 0), (7, 1)], "the missed epochs are filled empty");
        assert_eq!(epochs(&s.close()), vec![(8, 0)]);
    }

    #[test]
    fn a_restarted_sequencer_goes_on_after_its_logged_epochs_and_fills_at_most_max_fill() {
        let s = Sequencer::new(10, 40, vec![(39, vec![entry(1)]), (40, Vec::new())]);
        assert_eq!(s.resend.borrow().len(), 2, "what its log holds is sent again");
        s.heard(40 + 10 * MAX_FILL);
        let batches = s.close();
        assert_eq!(batches.len() as u64, MAX_FILL);
        assert_eq!((batches[0].0, batches.last().unwrap().0), (41, 40 + MAX_FILL));
    }
}
