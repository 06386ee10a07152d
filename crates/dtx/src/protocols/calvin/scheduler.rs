//! A data node's scheduler: it runs the sequencer's batches in epoch order, one transaction at a
//! time, each to its end before the next (serializable by construction; Calvin's ordered
//! locking, which lets non-conflicting ones overlap, is the calvin issue's). A transaction that
//! touches several nodes runs at each of them: each reads its own keys, sends them to the
//! others, waits for theirs, runs the procedure over the whole read set (the same inputs give the
//! same result everywhere, so no vote is needed) and installs its own keys' writes. The first
//! participant tells the client.

use super::messages::{Entry, Msg};
use super::{CalvinWorker, SCAN_UNSUPPORTED, UNDECODABLE};
use crate::net::{Addr, NodeId};
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Access, Ctx, KeySet, Scan, Step};
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Reads received from other participants before their transaction's turn here, at most this
/// many transactions' worth (a peer this far ahead is a bug: they all follow one order).
const MAX_EARLY_READS: usize = 1 << 20;
/// Batches received ahead of the next epoch to run.
const MAX_EARLY_BATCHES: usize = 1 << 16;

/// A transaction's place in the log: (epoch, index in its batch).
type Slot = (u64, u32);
/// Keys with the values a participant read.
type ReadSet = Vec<(RowKey, Option<Value>)>;

#[derive(Default)]
pub struct Scheduler {
    /// Batches not run yet, by epoch.
    batches: RefCell<BTreeMap<u64, Vec<Entry>>>,
    /// The next epoch to run (epochs start at 1).
    next_epoch: Cell<u64>,
    /// Other participants' reads, by transaction and by the node that sent them (a resent copy
    /// replaces the first).
    reads: RefCell<FxHashMap<Slot, FxHashMap<NodeId, ReadSet>>>,
    /// The transaction running now: reads for earlier ones are late copies.
    running: Cell<Slot>,
    /// The executor task, asleep until a batch or reads arrive.
    waker: RefCell<Option<Waker>>,
}

impl Scheduler {
    pub fn batch(&self, epoch: u64, entries: Vec<Entry>) {
        if epoch < self.next_epoch.get().max(1) {
            return; // A resent copy of a batch already run.
        }
        let mut batches = self.batches.borrow_mut();
        assert!(batches.len() < MAX_EARLY_BATCHES, "batches pile up ahead of epoch {}", self.next_epoch.get());
        batches.insert(epoch, entries);
        drop(batches);
        self.wake();
    }

    pub fn reads(&self, epoch: u64, index: u32, from: NodeId, values: ReadSet) {
        if (epoch, index) < self.running.get() {
            return; // A resent copy for a transaction already run.
        }
        let mut reads = self.reads.borrow_mut();
        assert!(reads.len() < MAX_EARLY_READS, "reads pile up ahead of epoch {}", self.next_epoch.get());
        reads.entry((epoch, index)).or_default().insert(from, values);
        drop(reads);
        self.wake();
    }

    /// How many other participants' reads arrived for `slot`.
    fn arrived(&self, slot: Slot) -> usize {
        self.reads.borrow().get(&slot).map_or(0, |r| r.len())
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Wait until `ready` holds, woken by every batch and read that arrives.
    async fn until(&self, ready: impl Fn(&Scheduler) -> bool) {
        std::future::poll_fn(|cx| {
            if ready(self) {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Run batches in epoch order for as long as the worker lives.
pub fn spawn_executor(me: &Rc<CalvinWorker>) {
    let weak = Rc::downgrade(me);
    me.w.clone().spawn(async move {
        loop {
            let Some(me) = weak.upgrade() else { return };
            let s = me.scheduler.as_ref().expect("the executor runs on a scheduler");
            if s.next_epoch.get() == 0 {
                s.next_epoch.set(1);
            }
            let epoch = s.next_epoch.get();
            s.until(|s| s.batches.borrow().contains_key(&epoch)).await;
            let entries = s.batches.borrow_mut().remove(&epoch).expect("waited for it");
            for (index, entry) in entries.into_iter().enumerate() {
                run_one(&me, s, epoch, index as u32, entry).await;
            }
            s.next_epoch.set(epoch + 1);
        }
    });
}

/// Run one sequenced transaction here, if it touches this node.
async fn run_one(me: &CalvinWorker, s: &Scheduler, epoch: u64, index: u32, entry: Entry) {
    debug_assert!((epoch, index) >= s.running.get(), "the log runs forward");
    s.running.set((epoch, index));
    let node = &me.node;
    let here = me.w.addr.node;
    let procs = &node.env.workload;
    let Ok(req) = procs.decode_request(&entry.req) else {
        // Every participant fails alike; the lowest data node answers.
        if here == first_data_node(me) {
            me.deliver(entry.client, Msg::Done { id: entry.id, outcome: Err(Abort::Protocol(UNDECODABLE)) });
        }
        return;
    };
    let mut keys = KeySet::default();
    procs.declare(&req, &mut keys);
    // This node's copy of the data: its region's, or the only one.
    let copy = node.copy_of(here);
    let participants = node.participants(&keys, copy);
    if !participants.contains(&here) {
        return;
    }
    let local: Vec<(RowKey, Option<Value>)> = keys
        .reads
        .iter()
        .chain(&keys.writes)
        .filter(|k| node.holder(**k, copy) == here)
        .map(|k| (*k, node.store.get(*k).and_then(|r| r.lock().value.clone())))
        .collect();
    me.w.charge_ops(local.len());
    let others: Vec<NodeId> = participants.iter().copied().filter(|n| *n != here).collect();
    for &n in &others {
        me.deliver(Addr::new(n, 0), Msg::Reads { epoch, index, from: here, values: local.clone() });
    }
    let mut values: FxHashMap<RowKey, Option<Value>> = local.into_iter().collect();
    if !others.is_empty() {
        me.w.count("multi-node-txns", 1);
        let want = others.len();
        s.until(|s| s.arrived((epoch, index)) >= want).await;
        let theirs = s.reads.borrow_mut().remove(&(epoch, index)).unwrap_or_default();
        values.extend(theirs.into_values().flatten());
    }
    let mut access = Deterministic { values, writes: Vec::new() };
    let result = procs.run(&req, &mut Ctx::with_declared(&mut access, &keys)).await;
    if result.is_ok() {
        for (k, v) in access.writes.into_iter().filter(|(k, _)| node.holder(*k, copy) == here) {
            me.w.charge_ops(1);
            node.store.get_or_create(k).lock().value = v;
        }
    }
    // Every copy runs it; the client hears from its own copy's first participant.
    if here == participants[0] && node.copy_of(entry.client.node) == copy {
        let outcome = result.map(|out| serde_json::to_vec(&out).expect("an output encodes as JSON"));
        me.deliver(entry.client, Msg::Done { id: entry.id, outcome });
    }
}

fn first_data_node(me: &CalvinWorker) -> NodeId {
    let topo = &me.node.env.topo;
    (0..topo.nodes).find(|n| topo.roles_of(*n).contains(crate::cluster::Role::Data)).unwrap_or(0)
}

/// The execution of one transaction at one participant: every read answered from the read set
/// all participants gathered (the same set everywhere), writes buffered until it commits.
struct Deterministic {
    values: FxHashMap<RowKey, Option<Value>>,
    writes: Vec<(RowKey, Option<Value>)>,
}

impl Access for Deterministic {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        // A transaction reads its own writes.
        if let Some((_, v)) = self.writes.iter().rev().find(|(k, _)| *k == key) {
            return Step::Ready(Ok(v.clone()));
        }
        // `Ctx` refused undeclared keys, and every declared key's value was gathered.
        let v = self.values.get(&key).cloned();
        debug_assert!(v.is_some(), "declared key {key:?} was gathered");
        Step::Ready(Ok(v.flatten()))
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        self.writes.push((key, value));
        Step::Ready(Ok(()))
    }

    fn scan(&mut self, _scan: Scan) -> Step<'_, Vec<(u64, Value)>> {
        Step::Ready(Err(Abort::Protocol(SCAN_UNSUPPORTED)))
    }
}
