//! SLOG's global ordering service: clients send it their multi-home transactions; every
//! `batch_us` it closes a batch (only when it has one: nothing waits for its empty batches),
//! logs it when the run is durable, and sends each home region's first sequencer the pieces of
//! the batch for that region, in batch order. A region's sequencer places its pieces in its own
//! log's next batch, so every home's log holds the multi-home transactions in the orderer's
//! order, and no two of them wait for each other's pieces in a cycle (SLOG §3.3).
//!
//! The service runs on `orderer_threads` workers of its node (workers 1 to N; the Detock
//! thesis's SLOG uses 8 threads for deserializing and batching, its "SLOG (slow)" 1): each
//! client sends to one of them ([`NodeState::ordering_thread`]), which takes the submission
//! ([`Intake`]: drops a copy, decodes the request and finds its homes, answers one that does
//! not decode) and hands what it took in one step to the first of them, which holds the
//! [`Orderer`] and closes the batches. Which thread took a submission changes only where in a
//! batch it lands: any order the closer gives is a global order.
//!
//! The orderer numbers the batches it sends a region ([`Piece::region_batch`], from 1, only
//! those with pieces for the region), so that the region's sequencer can tell a gap from a
//! batch with nothing for it, and sends each until the sequencer answers, which it does once
//! its pieces are durable. A restarted orderer sends every batch its log holds again, numbered
//! the same way, and sequencers answer the copies they already hold.
//!
//! With checkpoints on, the closer checkpoints every `checkpoint_us` ([`OrdererCheckpoint`]):
//! its numbering, the batch it logged and has not sent yet (it sends one batch at a time, once
//! durable), the pieces it sent that no sequencer answered and the submissions it took within
//! the horizon of a client's copies. A restarted orderer sends those again, then the batches
//! after the checkpoint, so its log is bounded by the batches in flight, not by the run.
//!
//! The paper runs its ordering service as a Paxos group across regions; here it is one node's
//! log, replicated as every log is with `--durability replicated`.

use super::input_log::{OrdererCheckpoint, Record};
use super::messages::{Entry, Msg, Piece};
use super::resubmits::{RecentSubmissions, Submission};
use super::{CalvinWorker, NodeState, ORDERER_FULL, UNDECODABLE};
use crate::net::Addr;
use crate::rt::log_warn;
use crate::txn::{Abort, KeySet};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// Entries and, for each, its home regions (in order): what an ordering thread hands the
/// closer, and what a batch holds until it is sent.
#[derive(Default)]
pub struct HomedEntries {
    pub entries: Vec<Entry>,
    pub homes: Vec<Vec<u16>>,
}

impl HomedEntries {
    fn push(&mut self, entry: Entry, homes: Vec<u16>) {
        self.entries.push(entry);
        self.homes.push(homes);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries as a log holds them, each with its homes found again (after a restart).
    fn found(wk: &CalvinWorker, entries: Vec<Entry>) -> Self {
        let homes = entries.iter().map(|e| homes_of(wk, e)).collect();
        HomedEntries { entries, homes }
    }
}

/// One ordering thread's intake: the submissions it took in the step being run, handed to the
/// closer once the step's messages are all taken (one message for all of them).
pub struct Intake {
    /// Submissions taken lately, its node's log's included after a restart: a copy is dropped.
    /// A client always sends to the same thread, so each thread remembers its own clients'.
    recent: RefCell<RecentSubmissions>,
    taken: RefCell<HomedEntries>,
}

impl Intake {
    pub fn new(logged: impl IntoIterator<Item = Submission>, horizon_us: u64, now_us: u64) -> Self {
        Intake { recent: RefCell::new(RecentSubmissions::new(horizon_us, now_us, logged)), taken: RefCell::default() }
    }

    /// Take a multi-home submission: drop a copy, answer one that does not decode, and queue
    /// the rest for the closer.
    pub fn submit(&self, wk: &CalvinWorker, entry: Entry) {
        let submission: Submission = (entry.client, entry.id);
        if !self.recent.borrow_mut().first(wk.w.now_us(), submission) {
            return wk.w.count("resubmissions-dropped", 1);
        }
        let homes = homes_of(wk, &entry);
        if homes.is_empty() {
            return wk.tell_aborted(&entry, Abort::Protocol(UNDECODABLE));
        }
        let first = self.taken.borrow().len() == 0;
        self.taken.borrow_mut().push(entry, homes);
        if first {
            // Hand over once this step's other messages are taken too.
            let Some(me) = wk.me.upgrade() else { return };
            wk.w.spawn(async move {
                crate::rt::yield_now().await;
                let intake = me.intake.as_ref().expect("an ordering thread");
                let taken = std::mem::take(&mut *intake.taken.borrow_mut());
                let closer = me.node.ordering_closer();
                match (closer == me.w.addr, &me.orderer) {
                    (true, Some(orderer)) => orderer.take(&me, taken),
                    _ => {
                        me.w.count("orderer-handovers", 1);
                        me.deliver(closer, Msg::Intake { entries: taken.entries, homes: taken.homes })
                    }
                }
            });
        }
    }
}

/// The ordering thread that closes the batches: what the threads took, in the order handed
/// over, and the batches' numbering.
pub struct Orderer {
    pending: RefCell<HomedEntries>,
    max_pending: usize,
    /// The last batch closed (batches are numbered from 1).
    epoch: Cell<u64>,
    /// Per home region, the last batch of pieces sent it.
    region_batches: RefCell<BTreeMap<u16, u64>>,
    /// The batches its log held when the node started, sent again first (the pieces its
    /// checkpoint held on their way are its worker's to send again, as worker 0's are).
    resend: RefCell<Vec<(u64, Vec<Entry>)>>,
    /// The batch logged and waiting to be durable before it is sent.
    unsent: RefCell<Option<(u64, Vec<Entry>)>>,
    /// Submissions its logged batches took lately, for its checkpoints.
    recent: RefCell<RecentSubmissions>,
}

/// The submissions a node's log holds of the orderer's: its checkpoint's, then its batches'.
pub fn logged_submissions(checkpoint: Option<&OrdererCheckpoint>, batches: &[(u64, Vec<Entry>)]) -> Vec<Submission> {
    let checkpointed = checkpoint.into_iter().flat_map(|c| c.submitted.iter().copied());
    let unsent = checkpoint.into_iter().flat_map(|c| c.unsent.iter().flat_map(|b| &b.1));
    let batched = batches.iter().flat_map(|b| &b.1);
    checkpointed.chain(unsent.chain(batched).map(|e| (e.client, e.id))).collect()
}

impl Orderer {
    /// An orderer whose log held `checkpoint` and `recovered` after it (its batches, in order);
    /// it remembers their submissions for `horizon_us`.
    pub fn new(
        max_pending: usize,
        checkpoint: Option<OrdererCheckpoint>,
        recovered: Vec<(u64, Vec<Entry>)>,
        (horizon_us, now_us): (u64, u64),
    ) -> Self {
        let logged = logged_submissions(checkpoint.as_ref(), &recovered);
        let c = checkpoint.unwrap_or_default();
        let mut resend = c.unsent;
        resend.extend(recovered);
        assert!(resend.windows(2).all(|w| w[0].0 < w[1].0), "the orderer's log runs forward");
        Orderer {
            pending: RefCell::default(),
            max_pending,
            epoch: Cell::new(resend.last().map_or(c.epoch, |b| b.0.max(c.epoch))),
            region_batches: RefCell::new(c.region_batches),
            resend: RefCell::new(resend),
            unsent: RefCell::default(),
            recent: RefCell::new(RecentSubmissions::new(horizon_us, now_us, logged)),
        }
    }

    /// What its batches so far amount to, with `outbox`, the pieces not yet acknowledged.
    pub fn checkpoint(&self, outbox: Vec<(Addr, Vec<u8>)>) -> OrdererCheckpoint {
        OrdererCheckpoint {
            epoch: self.epoch.get(),
            region_batches: self.region_batches.borrow().clone(),
            unsent: self.unsent.borrow().iter().cloned().collect(),
            outbox,
            submitted: self.recent.borrow().iter().collect(),
        }
    }

    /// Queue what an ordering thread took, refusing what lies past the bound (its clients
    /// retry later).
    pub fn take(&self, wk: &CalvinWorker, taken: HomedEntries) {
        let mut pending = self.pending.borrow_mut();
        for (entry, homes) in taken.entries.into_iter().zip(taken.homes) {
            if pending.len() < self.max_pending {
                pending.push(entry, homes);
                continue;
            }
            wk.w.count("orderer-refusals", 1);
            wk.tell_aborted(&entry, Abort::Protocol(ORDERER_FULL));
        }
    }

    /// Close the next batch, if anything is queued.
    fn close(&self) -> Option<(u64, HomedEntries)> {
        let batch = std::mem::take(&mut *self.pending.borrow_mut());
        if batch.len() == 0 {
            return None;
        }
        self.epoch.set(self.epoch.get() + 1);
        Some((self.epoch.get(), batch))
    }

    /// Split batch `epoch` into each home region's pieces, numbered per region.
    fn pieces(&self, epoch: u64, batch: &HomedEntries) -> BTreeMap<u16, (u64, Vec<Entry>)> {
        let mut by_home: BTreeMap<u16, (u64, Vec<Entry>)> = BTreeMap::new();
        for (index, (entry, homes)) in batch.entries.iter().zip(&batch.homes).enumerate() {
            for home in homes {
                let txn = (epoch, index as u32);
                let piece = Entry { piece: Some(Piece { txn, region_batch: 0 }), ..entry.clone() };
                by_home.entry(*home).or_default().1.push(piece);
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

impl NodeState {
    /// The ordering thread a client at `client` sends its multi-home transactions to: always
    /// the same one, so that the thread that drops copies of its submissions sees them all.
    pub fn ordering_thread(&self, client: Addr) -> Addr {
        let orderer = self.orderer.expect("SLOG has an orderer");
        let threads = u32::from(self.cfg.orderer_threads.max(1));
        let spread = (u32::from(client.node) * 31 + u32::from(client.worker)) % threads;
        Addr::new(orderer, 1 + spread as u16)
    }

    /// The ordering thread that closes the batches: the first.
    pub fn ordering_closer(&self) -> Addr {
        Addr::new(self.orderer.expect("SLOG has an orderer"), 1)
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
        // The orderer's intake decodes every multi-home request to find its homes.
        wk.w.charge_decode(entry.req.len());
        let Ok(req) = procs.decode_request(&entry.req) else { return Vec::new() };
        procs.declare(&req, &mut keys);
    }
    homes_of_keys(&wk.node, entry, &keys)
}

/// The home regions of an entry over `keys`: a movement's two, or those its keys are expected in.
pub(super) fn homes_of_keys(node: &NodeState, entry: &Entry, keys: &KeySet) -> Vec<u16> {
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
            resend.into_iter().for_each(|(epoch, entries)| send(&me, epoch, &HomedEntries::found(&me, entries)));
        }
        loop {
            w.sleep_us(batch_us).await;
            let Some(me) = weak.upgrade() else { return };
            let Some((epoch, batch)) = me.orderer.as_ref().expect("an orderer").close() else { continue };
            me.w.count("orderer-batches", 1);
            if let Some(log) = &me.node.env.log {
                match log.append(&Record::ordered(epoch, &batch.entries)) {
                    Ok(lsn) => {
                        let orderer = me.orderer.as_ref().expect("an orderer");
                        if me.node.checkpoints {
                            let now_us = me.w.now_us();
                            let mut recent = orderer.recent.borrow_mut();
                            batch.entries.iter().for_each(|e| _ = recent.first(now_us, (e.client, e.id)));
                            *orderer.unsent.borrow_mut() = Some((epoch, batch.entries.clone()));
                        }
                        log.wait(lsn).await;
                        orderer.unsent.borrow_mut().take();
                    }
                    Err(e) => {
                        // Nothing of the batch was sent: its clients retry, and the number is
                        // used again.
                        log_warn(&format!("slog: the orderer's batch {epoch} was refused by the log: {e}"));
                        let orderer = me.orderer.as_ref().expect("an orderer");
                        orderer.epoch.set(epoch - 1);
                        batch.entries.iter().for_each(|entry| me.tell_aborted(entry, Abort::LogRefused));
                        continue;
                    }
                }
            }
            send(&me, epoch, &batch);
        }
    });
}

/// Send batch `epoch`'s pieces to the first sequencer of each home region's log; tell the
/// clients of entries with no home (a batch logged before a restart may hold one that no
/// longer decodes).
fn send(me: &CalvinWorker, epoch: u64, batch: &HomedEntries) {
    let orderer = me.orderer.as_ref().expect("an orderer");
    for (entry, _) in batch.entries.iter().zip(&batch.homes).filter(|(_, homes)| homes.is_empty()) {
        me.tell_aborted(entry, Abort::Protocol(UNDECODABLE));
    }
    for (home, (region_batch, pieces)) in orderer.pieces(epoch, batch) {
        let first = me.node.sequencer_in(home, crate::net::NodeId::MAX);
        match (first == me.w.addr, &me.sequencer) {
            (true, Some(seq)) => seq.ordered(me, region_batch, pieces, None),
            _ => me.deliver(first, Msg::Ordered { region_batch, entries: pieces }),
        }
    }
}
