//! SLOG's global ordering service: clients send it their multi-home transactions; every
//! `batch_us` it closes a batch (only when it has one: nothing waits for its empty batches),
//! logs it when the run is durable, and sends each home region's first sequencer the pieces of
//! the batch for that region, in batch order. A region's sequencer places its pieces in its own
//! log's next batch, so every home's log holds the multi-home transactions in the orderer's
//! order, and no two of them wait for each other's pieces in a cycle (SLOG §3.3).
//!
//! The orderer numbers the batches it sends a region ([`Piece::region_batch`], from 1, only
//! those with pieces for the region), so that the region's sequencer can tell a gap from a
//! batch with nothing for it, and sends each until the sequencer answers, which it does once
//! its pieces are durable. A restarted orderer sends every batch its log holds again, numbered
//! the same way, and sequencers answer the copies they already hold.
//!
//! The paper runs its ordering service as a Paxos group across regions; here it is one node's
//! log, replicated as every log is with `--durability replicated`.

use super::input_log::Record;
use super::messages::{Entry, Msg, Piece};
use super::resubmits::RecentSubmissions;
use super::{CalvinWorker, ORDERER_FULL};
use crate::rt::log_warn;
use crate::txn::{Abort, KeySet};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

pub struct Orderer {
    pending: RefCell<Vec<Entry>>,
    max_pending: usize,
    /// The last batch closed (batches are numbered from 1).
    epoch: Cell<u64>,
    /// Per home region, the last batch of pieces sent it.
    region_batches: RefCell<BTreeMap<u16, u64>>,
    /// The batches its log held when the node started, sent again first.
    resend: RefCell<Vec<(u64, Vec<Entry>)>>,
    /// Submissions taken lately, its log's included after a restart: a copy is dropped.
    recent: RefCell<RecentSubmissions>,
}

impl Orderer {
    /// An orderer whose log held `recovered` (its batches, in order), remembering the
    /// submissions in them for `horizon_us` from `now_us`.
    pub fn new(max_pending: usize, recovered: Vec<(u64, Vec<Entry>)>, horizon_us: u64, now_us: u64) -> Self {
        let logged = recovered.iter().flat_map(|(_, entries)| entries.iter().map(|e| (e.client, e.id)));
        let recent = RecentSubmissions::new(horizon_us, now_us, logged);
        assert!(recovered.windows(2).all(|w| w[0].0 < w[1].0), "the orderer's log runs forward");
        Orderer {
            pending: RefCell::default(),
            max_pending,
            epoch: Cell::new(recovered.last().map_or(0, |b| b.0)),
            region_batches: RefCell::default(),
            resend: RefCell::new(recovered),
            recent: RefCell::new(recent),
        }
    }

    /// Queue a multi-home submission, or refuse it at the bound (the client retries later).
    pub fn submit(&self, wk: &CalvinWorker, entry: Entry) {
        if !self.recent.borrow_mut().first(wk.w.now_us(), (entry.client, entry.id)) {
            return wk.w.count("resubmissions-dropped", 1);
        }
        wk.queue_or_refuse(&self.pending, self.max_pending, entry, ORDERER_FULL, "orderer-refusals");
    }

    /// Close the next batch, if anything is queued.
    fn close(&self) -> Option<(u64, Vec<Entry>)> {
        let entries = std::mem::take(&mut *self.pending.borrow_mut());
        if entries.is_empty() {
            return None;
        }
        self.epoch.set(self.epoch.get() + 1);
        Some((self.epoch.get(), entries))
    }

    /// Split batch `epoch` into each home region's pieces, numbered per region.
    fn pieces(&self, wk: &CalvinWorker, epoch: u64, entries: &[Entry]) -> BTreeMap<u16, (u64, Vec<Entry>)> {
        let mut by_home: BTreeMap<u16, (u64, Vec<Entry>)> = BTreeMap::new();
        for (index, entry) in entries.iter().enumerate() {
            for home in homes_of(wk, entry) {
                let txn = (epoch, index as u32);
                let piece = Entry { piece: Some(Piece { txn, region_batch: 0 }), ..entry.clone() };
                by_home.entry(home).or_default().1.push(piece);
            }
        }
        let mut numbers = self.region_batches.borrow_mut();
        for (home, (number, pieces)) in &mut by_home {
            let n = numbers.entry(*home).or_default();
            *n += 1;
            *number = *n;
            pieces.iter_mut().for_each(|p| p.piece.as_mut().expect("a piece").region_batch = *n);
        }
        by_home
    }
}

/// The home regions of a submitted multi-home transaction: a movement's two, or those its keys
/// are expected in, by its reconnaissance's keys or its workload's declaration (its client found
/// it multi-home the same way). An entry that does not decode has none (its client hears so).
pub(super) fn homes_of(wk: &CalvinWorker, entry: &Entry) -> Vec<u16> {
    if let Some(keys) = &entry.keys {
        return homes_of_keys(&wk.node, entry, keys);
    }
    let mut keys = KeySet::default();
    if entry.movement.is_none() {
        let procs = &wk.node.env.workload;
        let Ok(req) = procs.decode_request(&entry.req) else { return Vec::new() };
        procs.declare(&req, &mut keys);
    }
    homes_of_keys(&wk.node, entry, &keys)
}

/// The home regions of an entry over `keys`: a movement's two, or those its keys are expected in.
pub(super) fn homes_of_keys(node: &super::NodeState, entry: &Entry, keys: &KeySet) -> Vec<u16> {
    match entry.movement {
        Some(m) if m.from == m.to => vec![m.from],
        Some(m) => vec![m.from.min(m.to), m.from.max(m.to)],
        None => node.homes(keys, &entry.homes),
    }
}

/// Every `batch_us`, close a batch, log it, and send each home region its pieces.
pub fn spawn_orderer(me: &Rc<CalvinWorker>) {
    let weak = Rc::downgrade(me);
    let w = me.w.clone();
    let batch_us = me.node.cfg.batch_us;
    w.clone().spawn(async move {
        if let Some(me) = weak.upgrade() {
            let orderer = me.orderer.as_ref().expect("an orderer");
            let resend = std::mem::take(&mut *orderer.resend.borrow_mut());
            resend.into_iter().for_each(|(epoch, entries)| send(&me, epoch, &entries));
        }
        loop {
            w.sleep_us(batch_us).await;
            let Some(me) = weak.upgrade() else { return };
            let Some((epoch, entries)) = me.orderer.as_ref().expect("an orderer").close() else { continue };
            me.w.count("orderer-batches", 1);
            if let Some(log) = &me.node.env.log {
                match log.append(&Record::ordered(epoch, &entries)) {
                    Ok(lsn) => log.wait(lsn).await,
                    Err(e) => {
                        // Nothing of the batch was sent: its clients retry, and the number is
                        // used again.
                        log_warn(&format!("slog: the orderer's batch {epoch} was refused by the log: {e}"));
                        let orderer = me.orderer.as_ref().expect("an orderer");
                        orderer.epoch.set(epoch - 1);
                        for entry in entries {
                            me.deliver(
                                entry.client,
                                Msg::Done { id: entry.id, outcome: Err(Abort::LogRefused), moved: Vec::new() },
                            );
                        }
                        continue;
                    }
                }
            }
            send(&me, epoch, &entries);
        }
    });
}

/// Send batch `epoch`'s pieces to the first sequencer of each home region's log; tell the
/// clients of entries with no home (they do not decode).
fn send(me: &CalvinWorker, epoch: u64, entries: &[Entry]) {
    let orderer = me.orderer.as_ref().expect("an orderer");
    for entry in entries.iter().filter(|e| homes_of(me, e).is_empty()) {
        me.deliver(
            entry.client,
            Msg::Done { id: entry.id, outcome: Err(Abort::Protocol(super::UNDECODABLE)), moved: Vec::new() },
        );
    }
    for (home, (region_batch, pieces)) in orderer.pieces(me, epoch, entries) {
        let first = me.node.sequencer_in(home, crate::net::NodeId::MAX);
        match (first == me.w.addr, &me.sequencer) {
            (true, Some(seq)) => seq.ordered(me, region_batch, pieces, None),
            _ => me.deliver(first, Msg::Ordered { region_batch, entries: pieces }),
        }
    }
}
