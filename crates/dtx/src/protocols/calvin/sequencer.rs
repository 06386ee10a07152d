//! A sequencer: its node's clients' submissions queue up (at most `max_pending`) and every
//! `batch_us` the queue becomes the sequencer's batch of the next epoch, sent to every data
//! node's scheduler. With a sequencer per data node (Calvin's), the global order is every
//! epoch's batches taken round-robin in node order, and a batch's transactions in their order
//! in it: every node sees one serial order. A sequencer sends a batch every epoch, empty or not,
//! since the schedulers take each sequencer's batch of an epoch in turn; one that falls behind
//! the others (it restarted, or stalled) fills the epochs it missed with empty batches, so that
//! the others' transactions wait for it at most one batch.

use super::input_log::{Record, SequencerCheckpoint};
use super::messages::{Entry, Msg, Placed};
use super::piece_seqs::{CoordinatorSeqs, HomeSeqs, PlacedSeqs};
use super::resubmits::RecentSubmissions;
use super::{orderer, CalvinWorker, LogOrder, SEQUENCER_FULL};
use crate::cluster::Role;
use crate::net::{decode, encode, Addr};
use crate::rt::log_warn;
use crate::txn::Abort;
use rustc_hash::FxHashSet;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

/// Detock: how often a sequencer probes each other region's delay, µs (the repository's
/// `fs_latency_interval`, 200 ms).
const PROBE_US: u64 = 200_000;
/// Detock: the probes a delay estimate averages (the repository's `avg_latency_window_size`).
const PROBE_WINDOW: usize = 10;

/// Detock's side of a sequencer: the pieces it holds until their timestamps, the ones it has
/// placed (a coordinator sends a piece until it hears it arrived, so copies come), and, as a
/// coordinator, its estimates of the one-way delay to each other region.
#[derive(Default)]
struct Placement {
    held: Vec<Entry>,
    /// As a home: the pieces placed, by their coordinators' numbers (a copy is dropped).
    placed: PlacedSeqs,
    /// As a coordinator: the last number given each home's pieces.
    seqs: CoordinatorSeqs,
    /// Pieces taken and not yet in a durable batch, and the coordinators owed an answer
    /// when they are (a piece is acknowledged only once durable, so a crash loses none its
    /// coordinator stops sending).
    unlogged: FxHashSet<(Addr, u64)>,
    replies: Vec<((Addr, u64), Reply)>,
    /// As a coordinator with a log: per transaction, the homes (its own included) that do
    /// not hold its piece durably yet; at none, the log notes it placed.
    coordinating: rustc_hash::FxHashMap<(Addr, u64), usize>,
    /// Coordinated transactions the log held at start whose pieces some home may lack.
    recoordinate: Vec<(Entry, HomeSeqs)>,
    /// As a coordinator with a log: the coordinated transactions logged whose pieces some home
    /// may lack, with their numbers (a checkpoint holds them: a restart sends them again).
    unplaced: rustc_hash::FxHashMap<(Addr, u64), (Entry, HomeSeqs)>,
    /// Per region, the last [`PROBE_WINDOW`] probes' offsets (delay plus clock offset), µs.
    oneway_us: BTreeMap<u16, VecDeque<i64>>,
}

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

impl Placement {
    /// Note a piece as placed; false if it was already.
    fn remember(&mut self, placed: &Placed) -> bool {
        self.placed.first(placed.coordinator, placed.seq)
    }
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
    placement: RefCell<Placement>,
    /// Submissions taken lately, its log's included after a restart: a copy is dropped.
    recent: RefCell<RecentSubmissions>,
    /// What its logged batches hold (for a checkpoint): Detock's pieces, and SLOG's last
    /// orderer batch.
    logged_placed: RefCell<PlacedSeqs>,
    logged_region_batch: Cell<u64>,
    /// Batches logged and waiting to be durable before they are sent.
    unsent: RefCell<Vec<(u64, Vec<Entry>)>>,
}

impl Sequencer {
    /// A sequencer whose last batch was `last_epoch` (0: none; after a restart, the last one
    /// its input log holds, so that epochs never repeat), with the batches its log holds after
    /// its last checkpoint and what that checkpoint says its batches before held (`logged`: the
    /// pieces placed, and the last orderer batch).
    pub fn new(
        max_pending: usize,
        last_epoch: u64,
        recovered: Vec<(u64, Vec<Entry>)>,
        coordinated: (Vec<(Entry, HomeSeqs)>, CoordinatorSeqs),
        recent: RecentSubmissions,
        logged: (PlacedSeqs, u64),
    ) -> Self {
        assert!(max_pending > 0, "the option's bounds keep max_pending positive");
        assert!(recovered.iter().all(|(e, _)| *e <= last_epoch), "the last epoch covers what was logged");
        let pieces = recovered.iter().flat_map(|(_, entries)| entries.iter().filter_map(|e| e.piece));
        let durable = pieces.map(|p| p.region_batch).max().unwrap_or(0).max(logged.1);
        let (recoordinate, seqs) = coordinated;
        let unplaced = recoordinate.iter().map(|(e, s)| ((e.client, e.id), (e.clone(), s.clone()))).collect();
        let mut placement = Placement { recoordinate, seqs, unplaced, placed: logged.0, ..Default::default() };
        // The checkpoint and the batches after it hold every piece this sequencer placed.
        for placed in recovered.iter().flat_map(|(_, entries)| entries.iter().filter_map(|e| e.placed)) {
            placement.remember(&placed);
        }
        let logged_placed = RefCell::new(placement.placed.clone());
        Sequencer {
            logged_placed,
            logged_region_batch: Cell::new(durable),
            unsent: RefCell::default(),
            placement: RefCell::new(placement),
            from_orderer: RefCell::new(FromOrderer { next: durable + 1, durable, ..Default::default() }),
            pending: RefCell::new(Vec::new()),
            max_pending,
            epoch: Cell::new(last_epoch),
            heard: Cell::new(0),
            resend: RefCell::new(recovered),
            recent: RefCell::new(recent),
        }
    }

    /// Its state for a checkpoint, taken between two of its worker's tasks: everything it
    /// closed is logged by then (a batch is logged in the step that closes it).
    pub fn state(&self) -> SequencerCheckpoint {
        let p = self.placement.borrow();
        let queued: FxHashSet<(Addr, u64)> = self.pending.borrow().iter().map(|e| (e.client, e.id)).collect();
        let mut unplaced: Vec<(Entry, HomeSeqs)> = p.unplaced.values().cloned().collect();
        unplaced.sort_by_key(|(e, _)| (e.client, e.id));
        SequencerCheckpoint {
            last_epoch: self.epoch.get(),
            placed: self.logged_placed.borrow().clone(),
            region_batch: self.logged_region_batch.get(),
            seqs: p.seqs.clone(),
            unplaced,
            submitted: self.recent.borrow().iter().filter(|s| !queued.contains(s)).collect(),
            unsent: self.unsent.borrow().clone(),
        }
    }

    /// A batch was logged: note what it holds for the next checkpoint.
    fn note_logged(&self, entries: &[Entry]) {
        let mut placed = self.logged_placed.borrow_mut();
        for e in entries {
            if let Some(p) = e.placed {
                placed.first(p.coordinator, p.seq);
            }
            if let Some(p) = e.piece {
                self.logged_region_batch.set(self.logged_region_batch.get().max(p.region_batch));
            }
        }
    }

    /// Another sequencer's batch of `epoch` arrived here.
    pub fn heard(&self, epoch: u64) {
        self.heard.set(self.heard.get().max(epoch));
    }

    /// Queue a submission, or refuse it at the bound (the client retries later). Detock's
    /// multi-home one is coordinated here instead.
    pub fn submit(&self, wk: &CalvinWorker, entry: Entry) {
        if !self.recent.borrow_mut().first(wk.w.now_us(), (entry.client, entry.id)) {
            return wk.w.count("resubmissions-dropped", 1);
        }
        if wk.node.cfg.order == LogOrder::Graph && entry.placed.is_none() {
            let homes = orderer::homes_of(wk, &entry);
            if homes.len() > 1 {
                return self.coordinate(wk, entry, &homes);
            }
        }
        wk.queue_or_refuse(&self.pending, self.max_pending, entry, SEQUENCER_FULL, "sequencer-refusals");
    }

    /// Detock's coordinator (thesis Algorithm 1): log the multi-home transaction (when the run
    /// is durable), then stamp it with the time its pieces should reach the farthest home
    /// (opportunistic ordering) and send each home its piece. Refused, as any submission, when
    /// `max_pending` wait here.
    fn coordinate(&self, wk: &CalvinWorker, entry: Entry, homes: &[u16]) {
        let waiting = self.pending.borrow().len() + self.placement.borrow().held.len();
        if waiting >= self.max_pending {
            wk.w.count("sequencer-refusals", 1);
            return wk.tell_aborted(&entry, Abort::Protocol(SEQUENCER_FULL));
        }
        let seqs = self.placement.borrow_mut().seqs.take(homes);
        let Some(log) = wk.node.env.log.clone() else { return self.send_pieces(wk, entry, &seqs, false) };
        let lsn = match log.append(&Record::coordinated(&entry, &seqs)) {
            Ok(lsn) => {
                let unplaced = (entry.clone(), seqs.clone());
                self.placement.borrow_mut().unplaced.insert((entry.client, entry.id), unplaced);
                lsn
            }
            Err(e) => {
                self.placement.borrow_mut().seqs.give_back(&seqs);
                log_warn(&format!("detock: a multi-home transaction was refused by the log: {e}"));
                return wk.tell_aborted(&entry, Abort::LogRefused);
            }
        };
        let me = wk.me.upgrade().expect("a live worker coordinates");
        wk.w.spawn(async move {
            log.wait(lsn).await;
            me.sequencer.as_ref().expect("a sequencer coordinates").send_pieces(&me, entry, &seqs, true);
        });
    }

    /// Stamp a coordinated transaction and send each home its piece, numbered as `seqs` says
    /// (this sequencer's own directly), each until the home holds it durably; `tracked`: the
    /// log notes when all do.
    fn send_pieces(&self, wk: &CalvinWorker, mut entry: Entry, seqs: &HomeSeqs, tracked: bool) {
        let here = wk.node.env.topo.region_of(wk.w.addr.node);
        let not_before_us = match wk.node.cfg.overshoot_us {
            Some(overshoot_us) => {
                let farthest = seqs.iter().map(|&(h, _)| if h == here { 0 } else { self.oneway_us(h) }).max();
                (wk.w.wall_us() as i64 + farthest.unwrap_or(0).max(0)) as u64 + overshoot_us
            }
            None => 0,
        };
        let txn = (entry.client, entry.id);
        if tracked {
            self.placement.borrow_mut().coordinating.insert(txn, seqs.len());
        }
        let me = wk.me.upgrade().expect("a live worker coordinates");
        for &(home, seq) in seqs {
            entry.placed = Some(Placed { not_before_us, coordinator: wk.w.addr.node, seq });
            let dst = wk.node.sequencer_in(home, wk.w.addr.node);
            if dst == wk.w.addr {
                if self.place(wk, entry.clone(), None) && tracked {
                    self.home_holds(wk, txn); // Its own log held it before a restart.
                }
                continue;
            }
            let (me, body) = (me.clone(), encode(&Msg::Place(entry.clone())));
            wk.w.spawn(async move {
                while me.w.call(dst, body.clone()).await.is_err() {
                    me.w.count("resends", 1);
                }
                if tracked {
                    me.sequencer.as_ref().expect("a coordinator").home_holds(&me, txn);
                }
            });
        }
    }

    /// One more home holds coordinated transaction `txn`'s piece durably; at the last, the log
    /// notes it (not waited for: a restart without the note sends the pieces again, and homes
    /// drop the copies).
    fn home_holds(&self, wk: &CalvinWorker, txn: (Addr, u64)) {
        let mut p = self.placement.borrow_mut();
        let Some(left) = p.coordinating.get_mut(&txn) else { return };
        *left -= 1;
        if *left == 0 {
            p.coordinating.remove(&txn);
            p.unplaced.remove(&txn);
            if let Some(log) = &wk.node.env.log {
                // Refused: the restarted coordinator sends the pieces again, and homes drop them.
                let _ = log.append(&Record::placed(txn.0, txn.1));
            }
        }
    }

    /// Take a Detock piece, to place in a batch once this node's clock reaches its timestamp,
    /// and answer `reply` once a durable batch holds it (a copy of one taken before is
    /// dropped, and answered alike). Pieces are never refused: the other homes place theirs,
    /// and the transaction runs only once every home has. Returns whether a durable batch
    /// holds it already.
    pub fn place(&self, wk: &CalvinWorker, entry: Entry, reply: Option<Reply>) -> bool {
        let txn = (entry.client, entry.id);
        let placed = entry.placed.expect("a Detock piece is stamped and numbered");
        let mut p = self.placement.borrow_mut();
        if !p.remember(&placed) {
            wk.w.count("detock-piece-copies", 1);
            let durable = !p.unlogged.contains(&txn);
            match (reply, durable) {
                (Some(r), false) => p.replies.push((txn, r)),
                (Some((from, rpc_id)), true) => wk.w.reply(from, rpc_id, &[]),
                (None, _) => {}
            }
            return durable;
        }
        let late = entry.placed.is_some_and(|t| t.not_before_us > 0 && t.not_before_us < wk.w.wall_us());
        if late {
            wk.w.count("detock-pieces-late", 1);
        }
        p.unlogged.insert(txn);
        p.replies.extend(reply.map(|r| (txn, r)));
        p.held.push(entry);
        false
    }

    /// Detock: `batches` are durable: answer the coordinators of the pieces they hold (and,
    /// as a coordinator, count this home as holding its own pieces).
    fn pieces_logged(&self, wk: &CalvinWorker, batches: &[(u64, Vec<Entry>)]) {
        let pieces: Vec<(Addr, u64)> = (batches.iter().flat_map(|(_, entries)| entries))
            .filter(|e| e.placed.is_some())
            .map(|e| (e.client, e.id))
            .collect();
        if pieces.is_empty() {
            return;
        }
        let mut p = self.placement.borrow_mut();
        let mut own = Vec::new();
        for txn in &pieces {
            p.unlogged.remove(txn);
            if p.coordinating.contains_key(txn) {
                own.push(*txn);
            }
        }
        let Placement { unlogged, replies, .. } = &mut *p;
        replies.retain(|(txn, (from, rpc_id))| {
            let durable = !unlogged.contains(txn);
            if durable {
                wk.w.reply(*from, *rpc_id, &[]);
            }
            !durable
        });
        drop(p);
        own.into_iter().for_each(|txn| self.home_holds(wk, txn));
    }

    /// After a restart: send again the pieces of the coordinated transactions some home may
    /// not hold (the homes drop copies).
    fn recoordinate(&self, wk: &CalvinWorker) {
        let entries = std::mem::take(&mut self.placement.borrow_mut().recoordinate);
        for (entry, seqs) in entries {
            wk.w.count("detock-recoordinated", 1);
            self.send_pieces(wk, entry, &seqs, true);
        }
    }

    /// Move the held pieces whose time has come into the next batch, in timestamp order.
    fn release_held(&self, now_us: u64) {
        let mut p = self.placement.borrow_mut();
        let not_before = |e: &Entry| e.placed.map_or(0, |t| t.not_before_us);
        let (mut due, held): (Vec<Entry>, Vec<Entry>) =
            std::mem::take(&mut p.held).into_iter().partition(|e| not_before(e) <= now_us);
        p.held = held;
        due.sort_by_key(|e| (not_before(e), e.client, e.id));
        self.pending.borrow_mut().extend(due);
    }

    /// The estimated one-way delay to `region`'s sequencer plus its clock's offset, µs (0
    /// before a probe has come back).
    fn oneway_us(&self, region: u16) -> i64 {
        let p = self.placement.borrow();
        let Some(window) = p.oneway_us.get(&region).filter(|w| !w.is_empty()) else { return 0 };
        window.iter().sum::<i64>() / window.len() as i64
    }

    fn probed(&self, region: u16, offset_us: i64) {
        let mut p = self.placement.borrow_mut();
        let window = p.oneway_us.entry(region).or_default();
        if window.len() == PROBE_WINDOW {
            window.pop_front();
        }
        window.push_back(offset_us);
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
            me.sequencer.as_ref().expect("a sequencer").recoordinate(&me);
        }
        loop {
            w.sleep_us(batch_us).await;
            let Some(me) = weak.upgrade() else { return };
            let seq = me.sequencer.as_ref().expect("the batcher runs on the sequencer");
            seq.release_held(me.w.wall_us());
            let batches = seq.close();
            me.w.count("batches", 1);
            me.w.count("empty-batches-filled", batches.len() as u64 - 1);
            let batches = log_batches(&me, batches).await;
            seq.logged(&me, &batches);
            seq.pieces_logged(&me, &batches);
            for (epoch, entries) in batches {
                send(&me, epoch, entries);
            }
        }
    });
}

/// Detock: probe every other region's first sequencer every [`PROBE_US`], for as long as the
/// worker lives: a probe carries this clock, the answer the receiver's clock minus it, so the
/// estimate holds the clocks' offset too and they need not agree (thesis §4.2.4).
pub fn spawn_prober(me: &Rc<CalvinWorker>) {
    let here = me.node.env.topo.region_of(me.w.addr.node);
    let others = me.node.streams.iter().map(|s| s[0]).filter(|s| me.node.env.topo.region_of(*s) != here);
    for dst in others.collect::<Vec<_>>() {
        let (weak, w) = (Rc::downgrade(me), me.w.clone());
        let region = me.node.env.topo.region_of(dst);
        w.clone().spawn(async move {
            loop {
                let body = encode(&Msg::Probe { sent_us: w.wall_us() });
                let reply = w.call(Addr::new(dst, 0), body).await;
                let Some(me) = weak.upgrade() else { return };
                if let Some(offset_us) = reply.ok().and_then(|r| decode::<i64>(&r).ok()) {
                    me.sequencer.as_ref().expect("a sequencer probes").probed(region, offset_us);
                }
                drop(me);
                w.sleep_us(PROBE_US).await;
            }
        });
    }
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
            Ok(lsn) => {
                me.sequencer.as_ref().expect("a sequencer logs batches").note_logged(&entries);
                (lsn, entries)
            }
            Err(e) => {
                log_warn(&format!(
                    "calvin: batch {epoch} of {} transactions was refused by the log: {e}",
                    entries.len()
                ));
                let (pieces, whole): (Vec<Entry>, Vec<Entry>) =
                    entries.into_iter().partition(|e| e.piece.is_some() || e.placed.is_some());
                whole.iter().for_each(|entry| me.tell_aborted(entry, Abort::LogRefused));
                // SLOG's and Detock's pieces are sent already and every home must place them: they go
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
    let Some(lsn) = last else { return logged };
    // Logged and not sent: a checkpoint taken meanwhile holds them.
    let seq = me.sequencer.as_ref().expect("a sequencer logs batches");
    assert!(seq.unsent.borrow().is_empty(), "one group of batches is logged at a time");
    *seq.unsent.borrow_mut() = logged;
    let t0 = me.w.now_ns();
    log.wait(lsn).await;
    let logged = std::mem::take(&mut *seq.unsent.borrow_mut());
    // Every transaction in these batches waited for this one write (group commit, Calvin's
    // replicated input): the run reports it as one wait for the log.
    if logged.iter().any(|(_, entries)| !entries.is_empty()) {
        me.w.note_log_wait(me.w.now_ns() - t0);
    }
    logged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Entry {
        Entry {
            client: Addr::new(1, 1),
            id,
            req: Vec::new(),
            keys: None,
            piece: None,
            placed: None,
            homes: Vec::new(),
            movement: None,
        }
    }

    fn none_recent() -> RecentSubmissions {
        RecentSubmissions::new(1_000, 0, [])
    }

    fn epochs(batches: &[(u64, Vec<Entry>)]) -> Vec<(u64, usize)> {
        batches.iter().map(|(e, b)| (*e, b.len())).collect()
    }

    #[test]
    fn a_sequencer_sends_a_batch_every_epoch_and_catches_up_on_the_others_with_empty_ones() {
        let s = Sequencer::new(10, 0, Vec::new(), Default::default(), none_recent(), Default::default());
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
        let logged = vec![(39, vec![entry(1)]), (40, Vec::new())];
        let s = Sequencer::new(10, 40, logged, Default::default(), none_recent(), Default::default());
        assert_eq!(s.resend.borrow().len(), 2, "what its log holds is sent again");
        s.heard(40 + 10 * MAX_FILL);
        let batches = s.close();
        assert_eq!(batches.len() as u64, MAX_FILL);
        assert_eq!((batches[0].0, batches.last().unwrap().0), (41, 40 + MAX_FILL));
    }
}
