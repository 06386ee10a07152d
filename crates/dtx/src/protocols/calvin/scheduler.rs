//! A data node's scheduler: it takes the sequencers' batches in the global order (epoch by
//! epoch, and within an epoch the sequencers round-robin in node order), requests each
//! transaction's local locks in that order ([`OrderedLocks`]), and runs every transaction that
//! holds its locks, many side by side. A transaction that touches several nodes runs at each of
//! them: each reads its own keys, sends them to the others, waits for theirs, runs the procedure
//! over the whole read set (the same inputs give the same result everywhere, so no vote is
//! needed), installs its own keys' writes and releases its locks. The first participant tells
//! the client.
//!
//! Conflicting transactions run in log order at every node and the others commute, so every
//! node's execution is equivalent to running the log one transaction at a time.
//!
//! A transaction's keys are the workload's declaration, or what its client's reconnaissance
//! found (OLLP: the entry carries them). Its scans lock their ranges at the node that holds the
//! range (the node of its first key, as every protocol here places a scan), which reads the rows
//! and sends them with its reads. A run that strays from its keys (a reconnaissance that the
//! log's earlier transactions made stale) or scans what it did not declare aborts alike at
//! every participant, and its client tries again.

use super::homes::{self, StoredHomes, HOME_MOVED};
use super::input_log::{Record, Recovered};
use super::locks::{KeyRange, LockKey, Mode, OrderedLocks};
use super::messages::{Entry, Msg, ReadSet};
use super::{CalvinWorker, LogOrder, SCAN_UNDECLARED, UNDECODABLE};
use crate::net::{decode, encode};
use crate::net::{Addr, NodeId};
use crate::protocols::calvin::NodeState;
use crate::protocols::depgraph::{DependencyGraph, Use};
use crate::rt::log::NodeLog;
use crate::rt::CpuKind;
use crate::storage::TableId;
use crate::storage::{RowKey, Storage, Value};
use crate::txn::{Abort, Access, Ctx, KeySet, Procedures, Scan, Step, TxnOutput, TxnRequest, TxnResult};
use crate::wal::Lsn;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Reads received from other participants before their transaction was admitted here, at most
/// this many transactions' worth (a peer this far ahead is a bug: they all follow one order).
const MAX_EARLY_READS: usize = 1 << 20;
/// Batches received ahead of the next one to admit.
const MAX_EARLY_BATCHES: usize = 1 << 16;
/// Transactions admitted and not finished: the scheduler admits no further batch past this many.
const MAX_ACTIVE: usize = 1 << 16;

/// A transaction's place in the order: (epoch, its sequencer, index in that batch); a SLOG
/// multi-home transaction's is its place in the orderer's log, (epoch, [`GLOBAL_ORDER`], index).
pub type Slot = (u64, NodeId, u32);
/// The sequencer a multi-home transaction's [`Slot`] names: the orderer's log.
pub const GLOBAL_ORDER: NodeId = NodeId::MAX;
/// Multi-home transactions finished here that a resent copy of their reads is still
/// recognised for (their reads cannot be told from early ones by the logs' positions).
const FINISHED_MULTI_KEPT: usize = 1 << 16;
/// A batch's place in the global order: (epoch, its sequencer).
type BatchId = (u64, NodeId);

/// What Detock's dependency graph orders by, each with the home its user expects it in (the
/// thesis's (key, home) pairs, Def. 4.2.1): a key, or a partition of a table as a whole (what
/// a scan of it conflicts with: every write in the partition takes it shared, a scan
/// exclusive; coarser than the range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
enum GraphKey {
    Row(LockKey),
    Partition(TableId, crate::cluster::PartitionId, u16),
}

/// An admitted transaction waiting for its locks.
struct Admitted {
    entry: Entry,
    /// The procedure it runs; `None` for a home movement.
    req: Option<TxnRequest>,
    keys: KeySet,
    /// The keys came from the client's reconnaissance, not the workload's declaration.
    reconnoitred: bool,
    participants: Vec<NodeId>,
}

pub struct Scheduler {
    /// The logs it runs, each as its sequencers in the order an epoch's batches are taken.
    streams: Vec<Vec<NodeId>>,
    /// Batches not admitted yet.
    batches: RefCell<BTreeMap<BatchId, Vec<Entry>>>,
    /// Per log, the next batch to admit: every slot of the log before it is admitted (running,
    /// done, or not here).
    next: RefCell<Vec<BatchId>>,
    /// Multi-home transactions finished here, the last [`FINISHED_MULTI_KEPT`] of them.
    finished_multi: RefCell<(rustc_hash::FxHashSet<Slot>, std::collections::VecDeque<Slot>)>,
    locks: RefCell<OrderedLocks<Slot>>,
    /// Detock: what is admitted goes through the dependency graph before it requests locks.
    graph: RefCell<DependencyGraph<Slot, GraphKey>>,
    /// Detock: transactions in the graph, with what running them here needs (`None` where
    /// this node holds none of their keys: the graph still orders them, for the cycles they
    /// close).
    in_graph: RefCell<FxHashMap<Slot, Option<Admitted>>>,
    /// Admitted transactions that do not hold all their locks yet.
    waiting: RefCell<FxHashMap<Slot, Admitted>>,
    /// Other participants' reads, by transaction and by the node that sent them (a resent copy
    /// replaces the first). A running transaction's entry stays until it releases, so that a
    /// late copy lands in it and goes with it.
    reads: RefCell<FxHashMap<Slot, FxHashMap<NodeId, ReadSet>>>,
    /// Running transactions waiting for others' reads.
    read_wakers: RefCell<FxHashMap<Slot, Waker>>,
    /// The admitting task, asleep until a batch arrives or room is made.
    waker: RefCell<Option<Waker>>,
    /// Transactions running now (holding their locks).
    running: Cell<usize>,
    /// The homes of the keys this node holds that moved ([`homes`]).
    stored_homes: RefCell<StoredHomes>,
    /// The node checkpoints (see [`super::input_log`]): what a checkpoint needs is kept.
    checkpoints: bool,
    /// Rows written since the last checkpoint.
    dirty: RefCell<FxHashSet<RowKey>>,
    /// Transactions running now, for a checkpoint (a restart runs them again: none has written).
    running_txns: RefCell<FxHashMap<Slot, Rc<Admitted>>>,
    /// Transactions a checkpoint had running, run again once the worker starts.
    restart: RefCell<Vec<(Slot, Admitted)>>,
    /// Batches and reads its log took and has not made durable yet (see [`NotDurable`]).
    batches_not_durable: RefCell<NotDurable<BatchId>>,
    reads_not_durable: RefCell<NotDurable<(Slot, NodeId)>>,
}

/// Inputs a node's log took and has not made durable yet, each with its position, so that a
/// copy of one is acknowledged only once the first is durable. A scheduler runs an input as
/// soon as its log takes it, and its sender stops sending once answered: a copy answered at
/// once (the input already taken) while the first was not durable, then a crash, left the
/// restarted node without the input and no sender to send it again (a SLOG run with failovers
/// stalled so: a node's log made nothing durable for 280 ms, a sequencer's new incarnation
/// resent its batches, the node answered them as taken, then crashed).
struct NotDurable<K> {
    /// Oldest first (a log's positions grow as it takes records).
    order: VecDeque<(Lsn, K)>,
    at: FxHashMap<K, Lsn>,
}

impl<K: Copy + Eq + std::hash::Hash> Default for NotDurable<K> {
    fn default() -> Self {
        NotDurable { order: VecDeque::new(), at: FxHashMap::default() }
    }
}

impl<K: Copy + Eq + std::hash::Hash> NotDurable<K> {
    /// `key`'s record was taken at `lsn`.
    fn taken(&mut self, key: K, lsn: Lsn, durable: Lsn) {
        self.forget_durable(durable);
        debug_assert!(self.order.back().is_none_or(|(last, _)| *last <= lsn), "positions grow");
        self.order.push_back((lsn, key));
        self.at.insert(key, lsn);
    }

    /// The answer to a copy of `key`, an input already taken: once its first is durable.
    fn answer_copy(&mut self, key: &K, durable: Lsn) -> Ack {
        self.forget_durable(durable);
        self.at.get(key).map_or(Ack::Now, |lsn| Ack::AfterDurable(*lsn))
    }

    fn forget_durable(&mut self, durable: Lsn) {
        while let Some(&(lsn, key)) = self.order.front().filter(|(lsn, _)| *lsn <= durable) {
            self.order.pop_front();
            if self.at.get(&key) == Some(&lsn) {
                self.at.remove(&key);
            }
        }
    }
}

/// A scheduler's state in its checkpoint, by reference (its wire form is [`State`]'s).
#[derive(Serialize)]
struct StateRef<'a> {
    next: &'a [BatchId],
    early: &'a BTreeMap<BatchId, Vec<Entry>>,
    reads: &'a FxHashMap<Slot, FxHashMap<NodeId, ReadSet>>,
    finished_multi: &'a VecDeque<Slot>,
    locks: &'a OrderedLocks<Slot>,
    graph: &'a DependencyGraph<Slot, GraphKey>,
    /// Admitted transactions as their entries (their keys put back where a reconnaissance found
    /// them): what admitting them again derives the rest from.
    in_graph: Vec<(Slot, Option<Entry>)>,
    waiting: Vec<(Slot, Entry)>,
    running: Vec<(Slot, Entry)>,
    stored_homes: &'a StoredHomes,
}

#[derive(Deserialize)]
struct State {
    next: Vec<BatchId>,
    early: BTreeMap<BatchId, Vec<Entry>>,
    reads: FxHashMap<Slot, FxHashMap<NodeId, ReadSet>>,
    finished_multi: VecDeque<Slot>,
    locks: OrderedLocks<Slot>,
    graph: DependencyGraph<Slot, GraphKey>,
    in_graph: Vec<(Slot, Option<Entry>)>,
    waiting: Vec<(Slot, Entry)>,
    running: Vec<(Slot, Entry)>,
    stored_homes: StoredHomes,
}

/// An admitted transaction as a checkpoint holds it.
fn entry_of(a: &Admitted) -> Entry {
    let mut entry = a.entry.clone();
    if a.reconnoitred {
        entry.keys = Some(a.keys.clone());
    }
    entry
}

impl Scheduler {
    /// A scheduler of node `here` that runs `streams` (each its sequencers), with the inputs its
    /// node's log held when it started: it starts from their last checkpoint and runs those
    /// after it again (see [`super::input_log`]). `checkpoints`: it keeps what checkpoints need.
    pub fn new(
        mut streams: Vec<Vec<NodeId>>,
        recovered: Recovered,
        node: &NodeState,
        here: NodeId,
        checkpoints: bool,
    ) -> Self {
        for sequencers in &mut streams {
            sequencers.sort_unstable();
            sequencers.dedup();
            assert!(!sequencers.is_empty(), "a log has at least one sequencer");
        }
        assert!(!streams.is_empty(), "a scheduler runs at least one log");
        let all: Vec<NodeId> = streams.iter().flatten().copied().collect();
        assert!(all.len() == all.iter().collect::<std::collections::BTreeSet<_>>().len(), "a sequencer feeds one log");
        let mut state = match recovered.scheduler.is_empty() {
            true => State {
                next: streams.iter().map(|s| (1, s[0])).collect(),
                early: BTreeMap::new(),
                reads: FxHashMap::default(),
                finished_multi: VecDeque::new(),
                locks: OrderedLocks::default(),
                graph: DependencyGraph::default(),
                in_graph: Vec::new(),
                waiting: Vec::new(),
                running: Vec::new(),
                stored_homes: StoredHomes::default(),
            },
            // Its own encoding of its own state: one that does not decode cannot be run on.
            false => decode(&recovered.scheduler)
                .unwrap_or_else(|e| panic!("calvin: node {here}: the scheduler's checkpoint does not decode: {e}")),
        };
        assert_eq!(state.next.len(), streams.len(), "a checkpoint of the same logs");
        state.early.extend(recovered.batches.into_iter().map(|(e, s, entries)| ((e, s), entries)));
        for (slot, from, values) in recovered.reads {
            state.reads.entry(slot).or_default().insert(from, values);
        }
        let admitted = |entry: Entry| admission(node, here, entry).unwrap_or_else(|_| unreachable!("admitted before"));
        let in_graph = state.in_graph.into_iter().map(|(slot, e)| (slot, e.map(admitted))).collect();
        let waiting = state.waiting.into_iter().map(|(slot, e)| (slot, admitted(e))).collect();
        let restart = state.running.into_iter().map(|(slot, e)| (slot, admitted(e))).collect();
        let finished: FxHashSet<Slot> = state.finished_multi.iter().copied().collect();
        Scheduler {
            next: RefCell::new(state.next),
            streams,
            finished_multi: RefCell::new((finished, state.finished_multi)),
            batches: RefCell::new(state.early),
            locks: RefCell::new(state.locks),
            graph: RefCell::new(state.graph),
            in_graph: RefCell::new(in_graph),
            waiting: RefCell::new(waiting),
            reads: RefCell::new(state.reads),
            read_wakers: RefCell::default(),
            waker: RefCell::default(),
            running: Cell::new(0),
            stored_homes: RefCell::new(state.stored_homes),
            checkpoints,
            dirty: RefCell::default(),
            running_txns: RefCell::default(),
            restart: RefCell::new(restart),
            batches_not_durable: RefCell::default(),
            reads_not_durable: RefCell::default(),
        }
    }

    /// Its state for a checkpoint (see [`super::input_log`]), taken between two of its tasks.
    pub fn state(&self) -> Vec<u8> {
        assert!(self.checkpoints, "a scheduler that checkpoints keeps its running transactions");
        let in_graph = self.in_graph.borrow().iter().map(|(slot, a)| (*slot, a.as_ref().map(entry_of))).collect();
        let waiting = self.waiting.borrow().iter().map(|(slot, a)| (*slot, entry_of(a))).collect();
        let running = self.running_txns.borrow().iter().map(|(slot, a)| (*slot, entry_of(a))).collect();
        encode(&StateRef {
            next: &self.next.borrow(),
            early: &self.batches.borrow(),
            reads: &self.reads.borrow(),
            finished_multi: &self.finished_multi.borrow().1,
            locks: &self.locks.borrow(),
            graph: &self.graph.borrow(),
            in_graph,
            waiting,
            running,
            stored_homes: &self.stored_homes.borrow(),
        })
    }

    /// The rows written since the last checkpoint (given back if the checkpoint was not logged).
    pub fn take_dirty(&self) -> FxHashSet<RowKey> {
        std::mem::take(&mut *self.dirty.borrow_mut())
    }

    pub fn give_back_dirty(&self, rows: FxHashSet<RowKey>) {
        self.dirty.borrow_mut().extend(rows);
    }

    /// Transactions admitted and not finished (for a checkpoint's cost).
    pub fn active(&self) -> usize {
        self.locks.borrow().len() + self.in_graph.borrow().len()
    }

    /// The homes of this node's keys that moved.
    pub fn moved_homes(&self) -> Vec<(RowKey, u16)> {
        self.stored_homes.borrow().iter().collect()
    }

    /// Take a sequencer's batch. Another node's is logged first (its own sequencer logged its
    /// own), and acknowledged once durable.
    pub fn batch(
        &self,
        log: Option<&NodeLog>,
        here: NodeId,
        epoch: u64,
        sequencer: NodeId,
        entries: Vec<Entry>,
    ) -> Ack {
        let id = (epoch, sequencer);
        let Some(stream) = self.stream_of(sequencer) else { return Ack::Now }; // From no sequencer of ours.
        let log = log.filter(|_| sequencer != here);
        if id < self.next.borrow()[stream] || self.batches.borrow().contains_key(&id) {
            // A resent copy of a batch taken before.
            return log
                .map_or(Ack::Now, |log| self.batches_not_durable.borrow_mut().answer_copy(&id, log.durable_lsn()));
        }
        let ack = match log {
            Some(log) => match append(log, &Record::batch(epoch, sequencer, &entries)) {
                Ack::Withheld => return Ack::Withheld,
                Ack::AfterDurable(lsn) => {
                    self.batches_not_durable.borrow_mut().taken(id, lsn, log.durable_lsn());
                    Ack::AfterDurable(lsn)
                }
                Ack::Now => Ack::Now,
            },
            None => Ack::Now,
        };
        let mut batches = self.batches.borrow_mut();
        assert!(batches.len() < MAX_EARLY_BATCHES, "batches pile up ahead of {:?}", self.next.borrow());
        batches.insert(id, entries);
        drop(batches);
        wake(&self.waker);
        ack
    }

    /// Take another participant's reads, logged first and acknowledged once durable.
    pub fn reads(&self, log: Option<&NodeLog>, slot: Slot, from: NodeId, values: ReadSet) -> Ack {
        let finished = match self.stream_of(slot.1) {
            Some(stream) => {
                (slot.0, slot.1) < self.next.borrow()[stream]
                    && !self.locks.borrow().contains(&slot)
                    && !self.in_graph.borrow().contains_key(&slot)
            }
            None => self.finished_multi.borrow().0.contains(&slot),
        };
        let answer_copy = || {
            log.map_or(Ack::Now, |log| {
                self.reads_not_durable.borrow_mut().answer_copy(&(slot, from), log.durable_lsn())
            })
        };
        if finished {
            return answer_copy(); // A resent copy for a transaction that has finished.
        }
        let mut reads = self.reads.borrow_mut();
        if reads.get(&slot).is_some_and(|r| r.contains_key(&from)) {
            return answer_copy(); // A resent copy (or one taken before a restart).
        }
        let ack = match log.map(|log| (log, append(log, &Record::reads(slot, from, &values)))) {
            Some((_, Ack::Withheld)) => return Ack::Withheld,
            Some((log, Ack::AfterDurable(lsn))) => {
                self.reads_not_durable.borrow_mut().taken((slot, from), lsn, log.durable_lsn());
                Ack::AfterDurable(lsn)
            }
            Some((_, Ack::Now)) | None => Ack::Now,
        };
        assert!(reads.len() < MAX_EARLY_READS, "reads pile up ahead of {:?}", self.next.borrow());
        reads.entry(slot).or_default().insert(from, values);
        drop(reads);
        if let Some(w) = self.read_wakers.borrow_mut().remove(&slot) {
            w.wake();
        }
        ack
    }

    /// The log `sequencer` feeds, if any.
    fn stream_of(&self, sequencer: NodeId) -> Option<usize> {
        self.streams.iter().position(|s| s.contains(&sequencer))
    }

    /// The batch after `stream`'s next: the next sequencer's, or the first one's of the next
    /// epoch.
    fn advance(&self, stream: usize) {
        let (sequencers, mut next) = (&self.streams[stream], self.next.borrow_mut());
        let (epoch, sequencer) = next[stream];
        let at = sequencers.iter().position(|s| *s == sequencer).expect("next names a sequencer");
        next[stream] = match sequencers.get(at + 1) {
            Some(s) => (epoch, *s),
            None => (epoch + 1, sequencers[0]),
        };
    }

    /// Wait until some log's next batch is here and there is room to admit it; which log, and
    /// the batch. Logs are taken as their batches come: a key's requests all come from one
    /// log (its home's), so how logs interleave changes no outcome.
    async fn next_batch(&self) -> (usize, Vec<Entry>) {
        std::future::poll_fn(|cx| {
            if self.locks.borrow().len() + self.graph.borrow().len() < MAX_ACTIVE {
                let mut batches = self.batches.borrow_mut();
                let next = self.next.borrow();
                if let Some((stream, entries)) =
                    next.iter().enumerate().find_map(|(i, id)| Some((i, batches.remove(id)?)))
                {
                    return Poll::Ready((stream, entries));
                }
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Wait until `want` other participants' reads for `slot` are here, and take them.
    async fn others_reads(&self, slot: Slot, want: usize) -> Vec<ReadSet> {
        std::future::poll_fn(|cx| {
            let mut reads = self.reads.borrow_mut();
            match reads.get_mut(&slot) {
                Some(r) if r.len() >= want => Poll::Ready(std::mem::take(r).into_values().collect()),
                _ => {
                    self.read_wakers.borrow_mut().insert(slot, cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// When a scheduler acknowledges an input it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    Now,
    /// Once the log holds it durably.
    AfterDurable(Lsn),
    /// Not at all: the log refused it (full, or failing), so it was not taken, and its sender
    /// sends it again until the log takes it.
    Withheld,
}

/// Log an input the scheduler takes: the node runs it again from its log after a restart.
fn append(log: &NodeLog, record: &[u8]) -> Ack {
    match log.append(record) {
        Ok(lsn) => Ack::AfterDurable(lsn),
        Err(e) => {
            crate::rt::log_warn(&format!("calvin: an input of {} bytes was refused by the log: {e}", record.len()));
            Ack::Withheld
        }
    }
}

fn wake(slot: &RefCell<Option<Waker>>) {
    if let Some(w) = slot.borrow_mut().take() {
        w.wake();
    }
}

/// Admit batches in the global order for as long as the worker lives.
pub fn spawn_admitter(me: &Rc<CalvinWorker>) {
    let s = me.scheduler.as_ref().expect("the admitter runs on a scheduler");
    // What its checkpoint had running runs again: it holds its locks, and has written nothing.
    for (slot, txn) in std::mem::take(&mut *s.restart.borrow_mut()) {
        spawn_run(me, slot, txn);
    }
    let weak = Rc::downgrade(me);
    me.w.clone().spawn(async move {
        loop {
            let Some(me) = weak.upgrade() else { return };
            let s = me.scheduler.as_ref().expect("the admitter runs on a scheduler");
            let (stream, entries) = s.next_batch().await;
            let (epoch, sequencer) = s.next.borrow()[stream];
            for (index, entry) in entries.into_iter().enumerate() {
                admit(&me, (epoch, sequencer, index as u32), entry);
            }
            s.advance(stream);
        }
    });
}

/// Request the locks of one sequenced transaction (or of a SLOG piece: its keys homed in the
/// region of the log it came in), if it touches this node, and start it if it holds them all.
fn admit(me: &Rc<CalvinWorker>, at: Slot, entry: Entry) {
    let node = &me.node;
    let here = me.w.addr.node;
    // Every scheduler of every region decodes every request of every batch, to learn its keys
    // (the batch's envelope was charged as its message arrived).
    me.w.charge_decode(entry.req.len());
    let admitted = match admission(node, here, entry) {
        Ok(admitted) => admitted,
        Err(entry) => {
            // Every participant fails alike; the lowest data node answers (a piece is never
            // undecodable: SLOG's orderer decoded it to find its homes).
            if here == first_data_node(me) && entry.piece.is_none() {
                let outcome = Err(Abort::Protocol(UNDECODABLE));
                me.deliver(entry.client, Msg::Done { id: entry.id, outcome, moved: Vec::new() });
            }
            return;
        }
    };
    if node.cfg.order == LogOrder::Graph {
        return admit_to_graph(me, at, admitted);
    }
    if !admitted.participants.contains(&here) {
        return;
    }
    // This node's copy of the data: its region's, or the only one.
    let copy = node.copy_of(here);
    let (entry, keys) = (&admitted.entry, &admitted.keys);
    // A piece locks the keys homed in its log's region; a whole transaction all of its own.
    let (slot, home, pieces) = match entry.piece {
        None => (at, None, 1),
        Some(piece) => {
            let here_homes = local_homes(node, entry, keys, copy, here);
            let home = node.env.topo.region_of(at.1);
            if !here_homes.contains(&home) {
                return; // None of this piece's keys is here.
            }
            ((piece.txn.0, GLOBAL_ORDER, piece.txn.1), Some(home), here_homes.len() as u32)
        }
    };
    let (wanted, ranges) = local_requests(node, entry, keys, copy, here, home);
    let s = me.scheduler.as_ref().expect("a scheduler admits");
    let first = !s.locks.borrow().contains(&slot);
    let requests = std::cell::Cell::new(0);
    let (wanted, ranges) = (counted(wanted, &requests), counted(ranges, &requests));
    let holds_all = s.locks.borrow_mut().request_piece(slot, pieces, wanted, ranges);
    me.w.charge_ops(requests.get());
    me.w.gauge_max("calvin-locked-txns-max", s.locks.borrow().len() as u64);
    let admitted = match first {
        true => admitted,
        false => s.waiting.borrow_mut().remove(&slot).expect("an earlier piece waits"),
    };
    if holds_all {
        spawn_run(me, slot, admitted);
    } else {
        if first {
            me.w.count("calvin-lock-waits", 1);
        }
        s.waiting.borrow_mut().insert(slot, admitted);
    }
}

/// `items`, adding one to `count` for each taken: a lock request is a record-level step, as a
/// lock is in every protocol.
fn counted<'a, I: Iterator + 'a>(items: I, count: &'a std::cell::Cell<usize>) -> impl Iterator<Item = I::Item> + 'a {
    items.inspect(move |_| count.set(count.get() + 1))
}

/// What running `entry` at node `here` needs: its procedure, its keys (its client's
/// reconnaissance's, or the workload's declaration) and its participants in the node's copy;
/// the entry back if its request does not decode.
fn admission(node: &NodeState, here: NodeId, mut entry: Entry) -> Result<Admitted, Box<Entry>> {
    let procs = &node.env.workload;
    let req = match entry.movement {
        Some(_) => None,
        None => match procs.decode_request(&entry.req) {
            Ok(req) => Some(req),
            Err(_) => return Err(Box::new(entry)),
        },
    };
    let reconnoitred = entry.keys.is_some();
    let keys = entry.keys.take().unwrap_or_else(|| {
        let mut keys = KeySet::default();
        match (&req, entry.movement) {
            (Some(req), _) => _ = procs.declare(req, &mut keys),
            (None, Some(m)) => keys.write(m.key),
            (None, None) => unreachable!("an entry without a procedure is a movement"),
        }
        keys
    });
    let participants = node.participants(&keys, node.copy_of(here));
    Ok(Admitted { entry, req, keys, reconnoitred, participants })
}

/// Detock: add a transaction, or one of a multi-home transaction's pieces (its keys homed in
/// the region of the log it came in), to the dependency graph, at every node whether it holds
/// its keys or not (every node orders alike only if it sees every conflict), and request the
/// locks of what the graph emits.
fn admit_to_graph(me: &Rc<CalvinWorker>, at: Slot, admitted: Admitted) {
    let (node, here) = (&me.node, me.w.addr.node);
    let s = me.scheduler.as_ref().expect("a scheduler admits");
    let (txn, home, pieces) = match admitted.entry.placed {
        None => (at, None, 1),
        Some(_) => {
            let client = admitted.entry.client;
            let txn = (admitted.entry.id, GLOBAL_ORDER, (client.node as u32) << 16 | client.worker as u32);
            let homes = super::orderer::homes_of_keys(node, &admitted.entry, &admitted.keys);
            (txn, Some(node.env.topo.region_of(at.1)), homes.len() as u32)
        }
    };
    let keys = graph_keys(node, &admitted.entry, &admitted.keys, home);
    // At every node of every region, whether it holds the keys or not.
    me.w.charge(CpuKind::Graph, me.w.cost.graph_key_ns * keys.len() as u64);
    let runs_here = admitted.participants.contains(&here);
    s.in_graph.borrow_mut().entry(txn).or_insert_with(|| runs_here.then_some(admitted));
    let mut emitted = Vec::new();
    s.graph.borrow_mut().add_piece(txn, pieces, keys, &mut emitted);
    lock_emitted(me, emitted);
}

/// What a transaction (or its piece homed in `home`) uses in the dependency graph.
fn graph_keys(node: &super::NodeState, entry: &Entry, keys: &KeySet, home: Option<u16>) -> Vec<(GraphKey, Use)> {
    let ours = |h: u16| home.is_none_or(|piece| piece == h);
    let partition = |k: LockKey| GraphKey::Partition(k.row.table, node.env.workload.partition_of(k.row), k.home);
    let mut out = Vec::with_capacity(keys.reads.len() + 2 * keys.writes.len() + keys.scans.len());
    for (k, mode) in homed_keys(node, entry, keys).filter(|(k, _)| ours(k.home)) {
        match mode {
            Mode::Shared => out.push((GraphKey::Row(k), Use::Read)),
            Mode::Exclusive => out.extend([(GraphKey::Row(k), Use::Write), (partition(k), Use::Read)]),
        }
    }
    for s in keys.scans.iter().filter(|s| ours(node.scan_home(s))) {
        out.push((partition(LockKey { row: RowKey::new(s.table, s.lo), home: node.scan_home(s) }), Use::Write));
    }
    out
}

/// Every key a transaction uses with the home it expects it in, and how: a movement writes its
/// key in both homes, any other transaction reads and writes its keys in the homes its entry
/// expects (the partitions' homes, but for the keys its client knew moved).
fn homed_keys<'a>(
    node: &'a super::NodeState,
    entry: &'a Entry,
    keys: &'a KeySet,
) -> impl Iterator<Item = (LockKey, Mode)> + 'a {
    let moved = entry
        .movement
        .into_iter()
        .flat_map(|m| [m.from, m.to].map(|home| (LockKey { row: m.key, home }, Mode::Exclusive)));
    let expected = |k: &RowKey| LockKey { row: *k, home: homes::expected_home(node, &entry.homes, *k) };
    let used = (keys.reads.iter().map(move |k| (expected(k), Mode::Shared)))
        .chain(keys.writes.iter().map(move |k| (expected(k), Mode::Exclusive)));
    moved.chain(used.filter(move |_| entry.movement.is_none()))
}

/// Request the local locks of what the dependency graph emitted, in its order (so two
/// conflicting transactions take their locks in the same order at every node), and run what
/// holds them.
fn lock_emitted(me: &Rc<CalvinWorker>, emitted: Vec<Slot>) {
    let (node, here) = (&me.node, me.w.addr.node);
    let s = me.scheduler.as_ref().expect("a scheduler locks");
    let copy = node.copy_of(here);
    for txn in emitted {
        let Some(Some(admitted)) = s.in_graph.borrow_mut().remove(&txn) else { continue };
        let (wanted, ranges) = local_requests(node, &admitted.entry, &admitted.keys, copy, here, None);
        let requests = std::cell::Cell::new(0);
        let (wanted, ranges) = (counted(wanted, &requests), counted(ranges, &requests));
        let holds_all = s.locks.borrow_mut().request(txn, wanted, ranges);
        me.w.charge_ops(requests.get());
        me.w.gauge_max("calvin-locked-txns-max", s.locks.borrow().len() as u64);
        if holds_all {
            spawn_run(me, txn, admitted);
        } else {
            me.w.count("calvin-lock-waits", 1);
            s.waiting.borrow_mut().insert(txn, admitted);
        }
    }
}

/// Detock's deadlock resolver: every `ddr_us`, resolve the stable cycles of the dependency
/// graph (thesis §4.2.2) and lock what that emits. It runs in the scheduler's worker on the
/// graph itself, not on a copy in a thread of its own as the thesis's does: a simulated node's
/// worker is one core, and the pass is short next to a 40 ms interval.
pub fn spawn_resolver(me: &Rc<CalvinWorker>) {
    let (weak, w, ddr_us) = (Rc::downgrade(me), me.w.clone(), me.node.cfg.ddr_us);
    w.clone().spawn(async move {
        loop {
            w.sleep_us(ddr_us).await;
            let Some(me) = weak.upgrade() else { return };
            let s = me.scheduler.as_ref().expect("the resolver runs on a scheduler");
            let mut emitted = Vec::new();
            let before = s.graph.borrow().resolved();
            let found = s.graph.borrow_mut().resolve(&mut emitted);
            if found > 0 {
                let after = s.graph.borrow().resolved();
                me.w.count("detock-deadlocks", found);
                me.w.count("detock-deadlocked-txns", after.transactions - before.transactions);
            }
            // The graph's size where the resolver looks (its mean: the two counters' ratio).
            let vertices = s.graph.borrow().len();
            me.w.count("detock-resolutions", 1);
            me.w.count("detock-graph-vertices", vertices as u64);
            me.w.gauge_max("detock-graph-vertices-max", vertices as u64);
            me.w.charge_ops(vertices.max(1));
            lock_emitted(&me, emitted);
        }
    });
}

/// The lock requests node `here` makes for a transaction over `keys` in `copy`: its keys and
/// scan ranges there, only those homed in `home` for a SLOG piece.
fn local_requests<'a>(
    node: &'a super::NodeState,
    entry: &'a Entry,
    keys: &'a KeySet,
    copy: u16,
    here: NodeId,
    home: Option<u16>,
) -> (impl Iterator<Item = (LockKey, Mode)> + 'a, impl Iterator<Item = KeyRange> + 'a) {
    let mine = move |(k, _): &(LockKey, Mode)| node.holder(k.row, copy) == here && home.is_none_or(|h| k.home == h);
    let wanted = homed_keys(node, entry, keys).filter(mine);
    let scans = keys.scans.iter().filter(move |s| node.scan_holder(s, copy) == here);
    let ranges = (scans.filter(move |s| home.is_none_or(|h| node.scan_home(s) == h))).map(|s| KeyRange {
        table: s.table,
        lo: s.lo,
        hi: s.hi,
        home: node.scan_home(s),
    });
    (wanted, ranges)
}

/// The home regions of the keys and scans of a transaction that node `here` holds in `copy`
/// (SLOG: the pieces it locks a multi-home transaction in).
fn local_homes(node: &super::NodeState, entry: &Entry, keys: &KeySet, copy: u16, here: NodeId) -> Vec<u16> {
    let keyed = homed_keys(node, entry, keys).filter(|(k, _)| node.holder(k.row, copy) == here);
    let scans = keys.scans.iter().filter(|s| node.scan_holder(s, copy) == here);
    let mut homes: Vec<u16> = keyed.map(|(k, _)| k.home).chain(scans.map(|s| node.scan_home(s))).collect();
    homes.sort_unstable();
    homes.dedup();
    homes
}

fn spawn_run(me: &Rc<CalvinWorker>, slot: Slot, txn: Admitted) {
    let txn = Rc::new(txn);
    let s = me.scheduler.as_ref().expect("a scheduler runs");
    if s.checkpoints {
        s.running_txns.borrow_mut().insert(slot, txn.clone());
    }
    let me = me.clone();
    me.w.clone().spawn(async move { run(&me, slot, &txn).await });
}

/// Run one transaction that holds its local locks, then release them and start whoever they
/// were the last for.
async fn run(me: &Rc<CalvinWorker>, slot: Slot, txn: &Admitted) {
    let (node, here) = (&me.node, me.w.addr.node);
    let s = me.scheduler.as_ref().expect("a scheduler runs");
    let copy = node.copy_of(here);
    let Admitted { entry, req, keys, reconnoitred, participants } = txn;
    if s.running.get() > 0 {
        me.w.count("calvin-overlapped", 1); // Started while another still ran: ordered locking at work.
    }
    s.running.set(s.running.get() + 1);
    let local = read_local(me, entry, keys, copy);
    let others: Vec<NodeId> = participants.iter().copied().filter(|n| *n != here).collect();
    let local = match others.is_empty() {
        true => local,
        false => send_reads(me, &others, slot, local),
    };
    let mut moved = local.moved;
    let mut access = Deterministic {
        values: local.values,
        scans: local.scans,
        writes: Vec::new(),
        stray_scan: stray_scan(*reconnoitred),
    };
    if !others.is_empty() {
        me.w.count("multi-node-txns", 1);
        for theirs in s.others_reads(slot, others.len()).await {
            access.values.extend(theirs.values);
            access.scans.extend(theirs.scans);
            moved.extend(theirs.moved);
        }
    }
    access.values.sort_unstable_by_key(|(k, _)| *k);
    // Every participant gathered the same homes, so all decide alike.
    let result = match (req, entry.movement) {
        _ if !moved.is_empty() => {
            me.w.count("calvin-home-moved-aborts", 1);
            Err(Abort::Protocol(HOME_MOVED))
        }
        (Some(req), _) => {
            // Every participant of every copy runs the procedure (its client only sent it).
            me.w.charge(CpuKind::Txn, me.w.cost.txn_ns);
            node.env.workload.run(req, &mut Ctx::with_declared(&mut access, keys)).await
        }
        (None, Some(m)) => {
            move_home(me, m, copy);
            Ok(TxnOutput::default())
        }
        (None, None) => unreachable!("an entry without a procedure is a movement"),
    };
    let mut installed = 0;
    if result.is_ok() {
        for (k, v) in access.writes.into_iter().filter(|(k, _)| node.holder(*k, copy) == here) {
            installed += 1;
            node.store.get_or_create(k).lock().value = v;
            if s.checkpoints {
                s.dirty.borrow_mut().insert(k);
            }
        }
    }
    me.w.charge_ops(installed);
    release(me, s, slot, installed);
    // Every copy runs it; the client hears from its own copy's first participant.
    if here == participants[0] && node.copy_of(entry.client.node) == copy {
        let outcome = result.map(|out| serde_json::to_vec(&out).expect("an output encodes as JSON"));
        me.deliver(entry.client, Msg::Done { id: entry.id, outcome, moved });
    }
}

/// Send this participant's reads to the `others`, encoded once for all of them, and hand them back.
fn send_reads(me: &CalvinWorker, others: &[NodeId], slot: Slot, local: ReadSet) -> ReadSet {
    let msg = Msg::Reads { slot, from: me.w.addr.node, values: local };
    let body = Rc::new(encode(&msg));
    for &n in others {
        me.send(Addr::new(n, 0), body.clone(), true);
    }
    let Msg::Reads { values, .. } = msg else { unreachable!("built above") };
    values
}

/// Run a home movement whose stored home was the one it expected: the key's home is its new
/// one here from now on, and this node's clients know it.
fn move_home(me: &CalvinWorker, m: homes::Movement, copy: u16) {
    let (node, here) = (&me.node, me.w.addr.node);
    if node.holder(m.key, copy) != here {
        return;
    }
    let s = me.scheduler.as_ref().expect("a scheduler runs");
    s.stored_homes.borrow_mut().set(node, m.key, m.to);
    node.directory.learn(node, m.key, m.to);
    me.w.count("calvin-homes-moved", 1);
    me.w.charge_ops(1);
}

/// What this participant holds of a transaction's keys and scans, read now that it holds their
/// locks, and the keys whose stored home is not the one it expected.
fn read_local(me: &CalvinWorker, entry: &Entry, keys: &KeySet, copy: u16) -> ReadSet {
    let (node, here) = (&me.node, me.w.addr.node);
    let values: Vec<(RowKey, Option<Value>)> = (keys.reads.iter().chain(&keys.writes))
        .filter(|k| node.holder(**k, copy) == here && entry.movement.is_none())
        .map(|k| (*k, node.store.get(*k).and_then(|r| r.lock().value.clone())))
        .collect();
    let scans: Vec<_> = (keys.scans.iter().filter(|s| node.scan_holder(s, copy) == here))
        .map(|s| {
            // The transaction's own writes in the range may delete rows: read as many more.
            let writes = keys.writes.iter().filter(|k| s.contains(**k)).count();
            (*s, present_rows(&node.store, *s, (s.limit as usize).saturating_add(writes)))
        })
        .collect();
    me.w.charge_ops(values.len() + scans.iter().map(|(_, rows)| rows.len()).sum::<usize>());
    ReadSet { values, scans, moved: stale_homes(me, entry, keys, copy) }
}

/// The keys of a transaction held here whose stored home is not the one it expects (a
/// movement's: its old home), with their stored homes.
fn stale_homes(me: &CalvinWorker, entry: &Entry, keys: &KeySet, copy: u16) -> Vec<(RowKey, u16)> {
    let (node, here) = (&me.node, me.w.addr.node);
    let stored = me.scheduler.as_ref().expect("a scheduler runs").stored_homes.borrow();
    if stored.is_empty() && entry.homes.is_empty() && entry.movement.is_none() {
        return Vec::new(); // Nothing moved, and the entry expects nothing moved.
    }
    let expected = |k: RowKey| match entry.movement {
        Some(m) => m.from,
        None => homes::expected_home(node, &entry.homes, k),
    };
    let mut moved: Vec<(RowKey, u16)> = (keys.reads.iter().chain(&keys.writes))
        .filter(|k| node.holder(**k, copy) == here)
        .map(|k| (*k, stored.home(node, *k)))
        .filter(|(k, home)| *home != expected(*k))
        .collect();
    moved.sort_unstable();
    moved.dedup();
    moved
}

/// The first `want` rows of `s`'s range that are present, in the order it asks (the store's
/// ranges include absent records: tombstones and rows never written).
pub fn present_rows(store: &Storage<()>, s: Scan, want: usize) -> Vec<(u64, Value)> {
    let table = store.table(s.table);
    let mut fetch = want.max(1);
    loop {
        let records = table.range(s.lo, s.hi, fetch, s.descending);
        let exhausted = records.len() < fetch;
        let rows: Vec<(u64, Value)> =
            records.into_iter().filter_map(|(k, r)| Some((k, r.lock().value.clone()?))).take(want).collect();
        if rows.len() >= want || exhausted {
            return rows;
        }
        fetch = fetch.saturating_mul(2);
    }
}

/// Run a transaction whose keys and scans are empty where its client is: it reads and writes
/// nothing, so it needs no place in the order (and a stray access aborts as at a scheduler).
pub async fn run_untouched(
    procs: &dyn Procedures,
    req: &TxnRequest,
    keys: &KeySet,
    reconnoitred: bool,
) -> TxnResult<TxnOutput> {
    debug_assert!(keys.is_empty() && keys.scans.is_empty());
    let mut access = Deterministic {
        values: Vec::new(),
        scans: Vec::new(),
        writes: Vec::new(),
        stray_scan: stray_scan(reconnoitred),
    };
    procs.run(req, &mut Ctx::with_declared(&mut access, keys)).await
}

/// Release `slot`'s locks: an install released its record's lock in its own step
/// (`installed` of them), any other lock released is a step of its own.
fn release(me: &Rc<CalvinWorker>, s: &Scheduler, slot: Slot, installed: usize) {
    s.running.set(s.running.get() - 1);
    if s.checkpoints {
        s.running_txns.borrow_mut().remove(&slot);
    }
    s.reads.borrow_mut().remove(&slot);
    if slot.1 == GLOBAL_ORDER {
        let (set, order) = &mut *s.finished_multi.borrow_mut();
        set.insert(slot);
        order.push_back(slot);
        if order.len() > FINISHED_MULTI_KEPT {
            set.remove(&order.pop_front().expect("kept ones"));
        }
    }
    let mut ready = Vec::new();
    let released = s.locks.borrow_mut().release(slot, &mut ready);
    me.w.charge_ops(released.saturating_sub(installed));
    for next in ready {
        let txn = s.waiting.borrow_mut().remove(&next).expect("a transaction granted its locks was waiting");
        spawn_run(me, next, txn);
    }
    wake(&s.waker); // Room to admit.
}

fn first_data_node(me: &CalvinWorker) -> NodeId {
    let topo = &me.node.env.topo;
    (0..topo.nodes).find(|n| topo.roles_of(*n).contains(crate::cluster::Role::Data)).unwrap_or(0)
}

/// The execution of one transaction at one participant: every read and scan answered from what
/// all participants gathered (the same everywhere), writes buffered until it commits.
struct Deterministic {
    /// The gathered values, sorted by key (a transaction's few keys: a binary search costs
    /// less than building a hash map for them).
    values: Vec<(RowKey, Option<Value>)>,
    scans: Vec<(Scan, Vec<(u64, Value)>)>,
    writes: Vec<(RowKey, Option<Value>)>,
    /// The abort for a scan not among the gathered ones.
    stray_scan: Abort,
}

/// What a scan outside the transaction's scans aborts with: a reconnaissance gone stale, or a
/// declared procedure that scans (its client reconnoiters it from then on).
fn stray_scan(reconnoitred: bool) -> Abort {
    match reconnoitred {
        true => Abort::ReconMismatch,
        false => Abort::Protocol(SCAN_UNDECLARED),
    }
}

impl Access for Deterministic {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        // A transaction reads its own writes.
        if let Some((_, v)) = self.writes.iter().rev().find(|(k, _)| *k == key) {
            return Step::Ready(Ok(v.clone()));
        }
        // `Ctx` refused undeclared keys, and every declared key's value was gathered.
        let at = self.values.binary_search_by_key(&key, |(k, _)| *k);
        debug_assert!(at.is_ok(), "declared key {key:?} was gathered");
        Step::Ready(Ok(at.ok().and_then(|i| self.values[i].1.clone())))
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        self.writes.push((key, value));
        Step::Ready(Ok(()))
    }

    fn scan(&mut self, scan: Scan) -> Step<'_, Vec<(u64, Value)>> {
        match self.scans.iter().find(|(s, _)| *s == scan) {
            Some((_, stored)) => Step::Ready(Ok(scan.over_writes(stored.clone(), &self.writes))),
            None => Step::Ready(Err(self.stray_scan)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Ack, NotDurable};

    #[test]
    fn a_copy_waits_for_its_first_to_be_durable_and_is_answered_at_once_after() {
        let mut not_durable = NotDurable::default();
        not_durable.taken((7, 1), 40, 30);
        not_durable.taken((8, 1), 41, 30);
        assert!(matches!(not_durable.answer_copy(&(7, 1), 39), Ack::AfterDurable(40)), "not durable yet");
        assert!(matches!(not_durable.answer_copy(&(8, 1), 40), Ack::AfterDurable(41)));
        assert!(matches!(not_durable.answer_copy(&(7, 1), 40), Ack::Now), "durable at 40");
        assert!(matches!(not_durable.answer_copy(&(9, 1), 40), Ack::Now), "taken durably long ago");
        not_durable.taken((9, 1), 50, 41);
        assert_eq!(not_durable.order.len(), 1, "what is durable is forgotten");
        assert_eq!(not_durable.at.len(), 1);
    }
}
