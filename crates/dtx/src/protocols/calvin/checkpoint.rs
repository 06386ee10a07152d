//! A node's checkpoint, taken by its worker 0 (scheduler and sequencer) every `checkpoint_us`:
//! the rows its scheduler wrote since the last one, then the state of its scheduler and its
//! sequencer and the messages it is still sending (see [`super::input_log`] for what it holds
//! and why it is consistent with the log before it). A log machine keeps only the last one and
//! the inputs after it, so a node's log, its replicas' snapshots and a restart's replay are
//! bounded by the data and the work in flight, not by the run.
//!
//! The rows do not wait for the checkpoint: every [`ROWS_SLICE_US`] worker 0 logs the rows
//! written since it last logged them, as they are then, and the checkpoint logs only the rest
//! before its record (as Calvin's checkpoints never stall execution). Logged at once, a
//! checkpoint's rows (some 240,000 rows, 25 MB, per node in a 4-region Detock run) held up every
//! batch behind them in the log while its replicas took them in, on every node at once: the
//! throughput halved for 200 ms at each checkpoint. The record still follows every row it needs:
//! a row written after its slice is logged again, in a later slice or with the checkpoint, and a
//! later row overrides an earlier one, so the rows before the record are the data as it stands
//! there (slices with no record after them are dropped, as a checkpoint's rows were).
//!
//! SLOG's orderer (the first ordering thread, worker 1 of its node) checkpoints apart, as often
//! ([`super::orderer`]).
//!
//! Only a log that compacts gets checkpoints: a replicated one (its replicas snapshot it) or a
//! WAL with `--checkpoint-every`; elsewhere they would only lengthen the log.

use super::input_log::{Checkpoint, Record, ROWS_PER_RECORD};
use super::orderer::Orderer;
use super::CalvinWorker;
use crate::net::Addr;
use crate::protocols::{OptionKind, OptionSpec};
use crate::rt::log::NodeLog;
use crate::rt::log_warn;
use crate::storage::{RowKey, Value};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub const CHECKPOINT_US: OptionSpec = OptionSpec {
    name: "checkpoint_us",
    kind: OptionKind::U64 { min: 0, max: 3_600_000_000 },
    default: "1000000",
    help: "worker 0 of every node checkpoints its scheduler and sequencer this often, so that its log compacts behind \
           it (with --durability replicated, or wal with --checkpoint-every); 0: never, the log keeps every input",
};

pub const CHECKPOINT_LOG_MIB: OptionSpec = OptionSpec {
    name: "checkpoint_log_mib",
    kind: OptionKind::U64 { min: 0, max: 1 << 20 },
    default: "32",
    help: "a node also checkpoints once its log took this many MiB since its last checkpoint, so that a fast run's \
           logs stay this short however long checkpoint_us is; 0: by time alone",
};

/// How often worker 0 logs the rows its scheduler wrote since it last logged them, and a
/// checkpointer looks at its log's growth (µs): a few hundred KB of rows at a time in a fast run.
pub const ROWS_SLICE_US: u64 = 10_000;

/// The messages a worker sent that must arrive and were not acknowledged yet: a checkpoint
/// holds them, since the inputs that made them are no longer run again after a restart.
/// Kept by the workers that checkpoint: worker 0 and SLOG's orderer.
#[derive(Default)]
pub struct Outbox {
    next: Cell<u64>,
    unacked: RefCell<FxHashMap<u64, Unacked>>,
}

/// A message's destination and its encoded body, shared with the send that retries it.
type Unacked = (Addr, Rc<Vec<u8>>);

impl Outbox {
    /// Note a message on its way; returns its number, to [`acked`](Self::acked) when it arrives.
    pub fn sent(&self, dst: Addr, body: Rc<Vec<u8>>) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        self.unacked.borrow_mut().insert(id, (dst, body));
        id
    }

    pub fn acked(&self, id: u64) {
        self.unacked.borrow_mut().remove(&id);
    }

    /// In the order they were sent.
    pub(super) fn unacked(&self) -> Vec<(Addr, Vec<u8>)> {
        let mut out: Vec<(u64, Addr, Vec<u8>)> =
            self.unacked.borrow().iter().map(|(id, (dst, body))| (*id, *dst, body.to_vec())).collect();
        out.sort_unstable_by_key(|m| m.0);
        out.into_iter().map(|(_, dst, body)| (dst, body)).collect()
    }
}

/// Checkpoint every `checkpoint_us`, and sooner once the node's log took `checkpoint_log_mib`
/// since the last one, for as long as the worker lives: worker 0's scheduler and sequencer, or
/// SLOG's orderer. (A 4-region Detock run logs some 4 GB a virtual second over its 24 log
/// replicas: a second's inputs held in memory until the next checkpoint outgrew 24 GB.)
pub fn spawn_checkpointer(me: &Rc<CalvinWorker>) {
    let (weak, w, every_us) = (Rc::downgrade(me), me.w.clone(), me.node.cfg.checkpoint_us);
    let Some(log) = me.node.env.log.clone() else { return };
    let budget_bytes = me.node.cfg.checkpoint_log_mib << 20;
    assert!(every_us > 0, "checkpoints are on only with an interval");
    w.clone().spawn(async move {
        // The log's growth that counts toward `checkpoint_log_mib` leaves out the rows' slices,
        // as it left out a checkpoint's rows when they were logged with it.
        let (mut last_us, mut last_bytes, mut rows_bytes) = (w.now_us(), log.appended_bytes(), 0);
        loop {
            let due_in_us = (last_us + every_us).saturating_sub(w.now_us());
            w.sleep_us(due_in_us.clamp(1, ROWS_SLICE_US)).await;
            let Some(me) = weak.upgrade() else { return };
            let grown = budget_bytes > 0 && log.appended_bytes() - last_bytes - rows_bytes >= budget_bytes;
            if w.now_us() < last_us + every_us && !grown {
                rows_bytes += log_rows_slice(&me);
                continue;
            }
            if grown {
                me.w.count("calvin-checkpoints-by-log-size", 1);
            }
            match &me.orderer {
                Some(orderer) => checkpoint_orderer(&me, orderer),
                None => checkpoint(&me),
            }
            (last_us, last_bytes, rows_bytes) = (w.now_us(), log.appended_bytes(), 0);
        }
    });
}

/// The rows the scheduler wrote since they were last logged, as they are now (empty: the
/// worker has no scheduler). A log that refuses them gets them again with the next slice.
fn take_rows(me: &CalvinWorker) -> (FxHashSet<RowKey>, Vec<(RowKey, Option<Value>)>) {
    let dirty = me.scheduler.as_ref().map(|s| s.take_dirty()).unwrap_or_default();
    let rows = dirty.iter().map(|k| (*k, me.node.store.get(*k).and_then(|r| r.lock().value.clone()))).collect();
    (dirty, rows)
}

/// Log `rows` in records of [`ROWS_PER_RECORD`]; returns the bytes appended.
fn append_rows(log: &NodeLog, rows: &[(RowKey, Option<Value>)]) -> Result<u64, String> {
    rows.chunks(ROWS_PER_RECORD).try_fold(0, |bytes, chunk| {
        let record = Record::rows(chunk);
        log.append(&record).map(|_| bytes + record.len() as u64)
    })
}

fn give_back(me: &CalvinWorker, dirty: FxHashSet<RowKey>) {
    if let Some(s) = &me.scheduler {
        s.give_back_dirty(dirty);
    }
}

/// Log a slice of the next checkpoint's rows (see the module's comment); returns the bytes
/// appended. Its cost: a step per row.
fn log_rows_slice(me: &CalvinWorker) -> u64 {
    let Some(log) = &me.node.env.log else { return 0 };
    let (dirty, rows) = take_rows(me);
    if rows.is_empty() {
        return 0;
    }
    match append_rows(log, &rows) {
        Ok(bytes) => {
            me.w.count("calvin-checkpoint-row-bytes", bytes);
            me.w.charge_ops(rows.len());
            bytes
        }
        Err(e) => {
            log_warn(&format!("calvin: node {}: a checkpoint's rows were refused by the log: {e}", me.w.addr.node));
            give_back(me, dirty);
            0
        }
    }
}

/// Log a checkpoint: the rows written since the last slice, in records of [`ROWS_PER_RECORD`],
/// then the rest. Taken in one step of the worker, so nothing it holds changes while it is
/// taken. A log that refuses it loses nothing: the rows are written again with the next one.
fn checkpoint(me: &CalvinWorker) {
    let Some(log) = &me.node.env.log else { return };
    let (dirty, rows) = take_rows(me);
    let c = Checkpoint {
        scheduler: me.scheduler.as_ref().map(|s| s.state()).unwrap_or_default(),
        sequencer: me.sequencer.as_ref().map(|s| s.state()),
        outbox: me.outbox.unacked(),
    };
    let record = Record::checkpoint(&c);
    match append_rows(log, &rows).and_then(|rows_bytes| log.append(&record).map(|_| rows_bytes)) {
        Ok(rows_bytes) => {
            me.w.count("calvin-checkpoints", 1);
            me.w.count("calvin-checkpoint-bytes", record.len() as u64);
            me.w.count("calvin-checkpoint-row-bytes", rows_bytes);
            me.w.gauge_max("calvin-checkpoint-bytes-max", record.len() as u64);
            // Its cost: a step per row and per transaction it holds.
            let active = me.scheduler.as_ref().map_or(0, |s| s.active());
            me.w.charge_ops(rows.len() + active + 1);
        }
        Err(e) => {
            log_warn(&format!("calvin: node {}: a checkpoint was refused by the log: {e}", me.w.addr.node));
            give_back(me, dirty);
        }
    }
}

/// Log SLOG's orderer's checkpoint (one record: what it holds is the batches in flight).
fn checkpoint_orderer(me: &CalvinWorker, orderer: &Orderer) {
    let Some(log) = &me.node.env.log else { return };
    let record = Record::orderer_checkpoint(&orderer.checkpoint(me.outbox.unacked()));
    match log.append(&record) {
        Ok(_) => {
            me.w.count("orderer-checkpoints", 1);
            me.w.gauge_max("orderer-checkpoint-bytes-max", record.len() as u64);
            me.w.charge_ops(1);
        }
        Err(e) => log_warn(&format!("slog: the orderer's checkpoint was refused by the log: {e}")),
    }
}
