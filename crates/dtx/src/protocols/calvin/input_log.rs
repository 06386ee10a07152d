//! Calvin's input log, one per node: its sequencer logs every batch before any scheduler sees
//! it (Calvin replicates its input before it executes it), and its scheduler logs what it takes
//! from other nodes before it acknowledges it: their sequencers' batches and the reads their
//! participants send. So a node's log holds every input its scheduler ran, and a node that lost
//! its memory runs them again from the start, in the same order, to the same state (the
//! others' copies of what it acknowledged are never sent again; what it had not acknowledged
//! they send until it does).
//!
//! With one sequencer (`sequencers=one`) a replica of node 0's log executes its batches
//! ([`InputMachine`]): a full copy of the data that runs each sequenced request in log order,
//! under the schedulers' rules, so that it ends each as they do. Its snapshot is that copy's
//! (the rows the log changed), so a replica's log compacts behind it.
//!
//! Checkpoints: every `checkpoint_us` worker 0 of a node logs what the inputs before it amount
//! to ([`Checkpoint`]): the rows its scheduler wrote since its last checkpoint (as
//! [`Record::Rows`] chunks before it, logged in slices as they are written, a row again each
//! time it changed: see [`super::checkpoint`]), its scheduler's state (batches not admitted, reads,
//! the lock manager and Detock's dependency graph as they are, the transactions admitted and
//! not finished), its sequencer's (its last epoch, the pieces its batches placed, the
//! coordinated transactions not yet placed, the submissions it logged lately) and the messages
//! it sent that must arrive and were not acknowledged. Taken between two tasks of the worker,
//! it is consistent with the log before it: every input there is in the state, every
//! transaction finished has written and one not finished has not (a run writes and releases in
//! one step). A restarted node starts from its last checkpoint (the rows over its loaded data)
//! and runs only the inputs after it, so a log machine keeps the rows written since the load,
//! the last checkpoint and the inputs after it: bounded by the data, not by the run.
//!
//! SLOG's orderer (another worker of its node) checkpoints apart ([`OrdererCheckpoint`]): its
//! numbering, the batch it logged and has not sent, what it sent that no sequencer answered
//! yet and the submissions it took lately. Its batches before it are then no longer needed.

use super::messages::{Entry, ReadSet};
use super::piece_seqs::{CoordinatorSeqs, HomeSeqs, PlacedSeqs};
use super::resubmits::Submission;
use super::scheduler::Slot;
use super::SCAN_UNDECLARED;
use crate::net::{decode, encode};
use crate::net::{Addr, NodeId};
use crate::protocols::MachineEnv;
use crate::rt::log::LogMachine;
use crate::rt::log_warn;
use crate::storage::{RowKey, Value};
use crate::txn::replay::{ReplayRules, ReplayedCopy};
use crate::txn::Abort;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A checkpoint's rows travel in records of at most this many rows each (a WAL record holds at
/// most 16 MiB).
pub const ROWS_PER_RECORD: usize = 4096;

/// What a node's inputs before it amount to (see the module's comment). Its rows come before
/// it as [`Record::Rows`]: rows that no checkpoint follows are dropped.
#[derive(Serialize, Deserialize, Default)]
pub struct Checkpoint {
    /// The scheduler's state, encoded by the scheduler (empty: the node has none).
    #[serde(with = "serde_bytes")]
    pub scheduler: Vec<u8>,
    pub sequencer: Option<SequencerCheckpoint>,
    /// Messages worker 0 sent that must arrive, not acknowledged yet: (destination, body).
    pub outbox: Vec<(Addr, Vec<u8>)>,
}

/// A sequencer's state at a checkpoint: what its log before it held, in short.
#[derive(Serialize, Deserialize, Default, Clone)]
pub struct SequencerCheckpoint {
    pub last_epoch: u64,
    /// Detock: the pieces its logged batches hold, by their coordinators' numbers.
    pub placed: PlacedSeqs,
    /// SLOG: the last orderer batch whose pieces its logged batches hold.
    pub region_batch: u64,
    /// Detock: its numbering as a coordinator, and the coordinated transactions some home may
    /// not hold yet, with their pieces' numbers.
    pub seqs: CoordinatorSeqs,
    pub unplaced: Vec<(Entry, HomeSeqs)>,
    /// Submissions its log holds that a copy may still come of.
    pub submitted: Vec<Submission>,
    /// Its batches logged and not yet sent (they are sent once durable): a restart sends them.
    pub unsent: Vec<(u64, Vec<Entry>)>,
}

/// SLOG's orderer's state at its checkpoint: what its batches before it amount to.
#[derive(Serialize, Deserialize, Default, Clone)]
pub struct OrdererCheckpoint {
    /// The last batch it closed.
    pub epoch: u64,
    /// Per home region, the last batch of pieces numbered for it.
    pub region_batches: BTreeMap<u16, u64>,
    /// Its batch logged and not yet sent (it sends a batch once durable): a restart sends it.
    pub unsent: Vec<(u64, Vec<Entry>)>,
    /// Pieces it sent that no sequencer acknowledged yet: (destination, body).
    pub outbox: Vec<(Addr, Vec<u8>)>,
    /// Submissions its batches took lately, that a copy may still come of.
    pub submitted: Vec<Submission>,
}

/// One record of a node's input log.
#[derive(Serialize, Deserialize)]
pub enum Record {
    /// A sequencer's batch: this node's own, or another's as this node's scheduler took it.
    Batch { epoch: u64, sequencer: NodeId, entries: Vec<Entry> },
    /// The reads another participant sent this node's scheduler for the transaction at `slot`.
    Reads { slot: Slot, from: NodeId, values: ReadSet },
    /// SLOG's orderer's batch of multi-home transactions (on the orderer's node).
    Ordered { epoch: u64, entries: Vec<Entry> },
    /// Detock: a multi-home transaction this node's sequencer coordinates, logged before any
    /// home hears of it (a restarted coordinator sends its pieces again until [`Record::Placed`]).
    /// With its pieces' numbers, one per home.
    Coordinated { entry: Entry, seqs: HomeSeqs },
    /// Detock: every home holds the coordinated transaction's piece durably.
    Placed { client: Addr, id: u64 },
    /// Rows of the checkpoint that follows.
    Rows(Vec<(RowKey, Option<Value>)>),
    /// Worker 0's checkpoint: the inputs before it are no longer needed.
    Checkpoint(Box<Checkpoint>),
    /// SLOG's orderer's checkpoint: its batches before it are no longer needed.
    OrdererCheckpoint(Box<OrdererCheckpoint>),
}

impl Record {
    pub fn batch(epoch: u64, sequencer: NodeId, entries: &[Entry]) -> Vec<u8> {
        encode(&RecordRef::Batch { epoch, sequencer, entries })
    }

    pub fn reads(slot: Slot, from: NodeId, values: &ReadSet) -> Vec<u8> {
        encode(&RecordRef::Reads { slot, from, values })
    }

    pub fn ordered(epoch: u64, entries: &[Entry]) -> Vec<u8> {
        encode(&RecordRef::Ordered { epoch, entries })
    }

    pub fn coordinated(entry: &Entry, seqs: &HomeSeqs) -> Vec<u8> {
        encode(&RecordRef::Coordinated { entry, seqs })
    }

    pub fn placed(client: Addr, id: u64) -> Vec<u8> {
        encode(&RecordRef::Placed { client, id })
    }

    pub fn rows(rows: &[(RowKey, Option<Value>)]) -> Vec<u8> {
        encode(&RecordRef::Rows(rows))
    }

    pub fn checkpoint(c: &Checkpoint) -> Vec<u8> {
        encode(&RecordRef::Checkpoint(c))
    }

    pub fn orderer_checkpoint(c: &OrdererCheckpoint) -> Vec<u8> {
        encode(&RecordRef::OrdererCheckpoint(c))
    }
}

/// [`Record`] by reference, to encode without copying (the same wire form).
#[derive(Serialize)]
enum RecordRef<'a> {
    Batch { epoch: u64, sequencer: NodeId, entries: &'a [Entry] },
    Reads { slot: Slot, from: NodeId, values: &'a ReadSet },
    Ordered { epoch: u64, entries: &'a [Entry] },
    Coordinated { entry: &'a Entry, seqs: &'a HomeSeqs },
    Placed { client: Addr, id: u64 },
    Rows(&'a [(RowKey, Option<Value>)]),
    Checkpoint(&'a Checkpoint),
    OrdererCheckpoint(&'a OrdererCheckpoint),
}

/// What a node's log held at start.
#[derive(Default)]
pub struct Recovered {
    /// The last epoch its sequencer logged (0: none).
    pub last_epoch: u64,
    /// Every batch it holds (its own sequencer's and those its scheduler took), in log order.
    pub batches: Vec<(u64, NodeId, Vec<Entry>)>,
    /// Every read its scheduler took.
    pub reads: Vec<(Slot, NodeId, ReadSet)>,
    /// SLOG: every batch its orderer closed since its last checkpoint (`orderer`), in order.
    pub ordered: Vec<(u64, Vec<Entry>)>,
    pub orderer: Option<OrdererCheckpoint>,
    /// Detock: the multi-home transactions its sequencer coordinated whose pieces some home
    /// may not hold yet, in order, with their pieces' numbers.
    pub coordinated: Vec<(Entry, HomeSeqs)>,
    /// Detock: its sequencer's pieces numbered so far, per home (numbering goes on after them).
    pub coordinator_seqs: CoordinatorSeqs,
    /// Every submission the node's sequencer or orderer took that its log holds (its own
    /// batches' entries, its coordinated and ordered transactions): copies still on their way
    /// from clients are dropped.
    pub submitted: Vec<(Addr, u64)>,
    /// The log's checkpoint does not decode: the inputs behind it are gone.
    pub lost_inputs: bool,
    /// From the last scheduler checkpoint: every row written since the load, its scheduler's
    /// state, its sequencer's pieces placed and last orderer batch, and what it was sending.
    pub rows: FxHashMap<RowKey, Option<Value>>,
    pub scheduler: Vec<u8>,
    pub placed: PlacedSeqs,
    pub region_batch: u64,
    pub outbox: Vec<(Addr, Vec<u8>)>,
}

impl Recovered {
    /// Start over from checkpoint `c` (its rows, in `pending`, over the ones before): the
    /// inputs before it amount to it. SLOG's orderer's (another worker's) stay.
    fn checkpointed(&mut self, node: NodeId, c: Checkpoint, pending: &mut Vec<(RowKey, Option<Value>)>) {
        self.rows.extend(pending.drain(..));
        self.batches.clear();
        self.reads.clear();
        self.scheduler = c.scheduler;
        self.outbox = c.outbox;
        let s = c.sequencer.unwrap_or_default();
        self.last_epoch = self.last_epoch.max(s.last_epoch);
        self.placed = s.placed;
        self.region_batch = s.region_batch;
        self.coordinator_seqs = s.seqs;
        self.coordinated = s.unplaced;
        self.submitted = s.submitted;
        // Sent again by its sequencer, and taken by its scheduler as if just sent.
        self.batches = s.unsent.into_iter().map(|(epoch, entries)| (epoch, node, entries)).collect();
    }
}

/// Read what node `node`'s log held at start (records behind a checkpoint are gone).
pub fn recover(node: NodeId, records: &[Vec<u8>], checkpoint: Option<&[u8]>) -> Recovered {
    let snapshot = checkpoint.and_then(|c| decode::<MachineSnapshot>(c).ok());
    let mut r = Recovered {
        last_epoch: snapshot.as_ref().map_or(0, |s| s.last_epoch),
        lost_inputs: checkpoint.is_some() && snapshot.is_none(),
        ..Default::default()
    };
    let kept = snapshot.map(|s| s.inputs).unwrap_or_default();
    let mut pending_rows = Vec::new();
    for record in kept.iter().chain(records) {
        match decode::<Record>(record) {
            Ok(Record::Batch { epoch, sequencer, entries }) => {
                if sequencer == node {
                    r.last_epoch = r.last_epoch.max(epoch);
                    r.submitted.extend(entries.iter().map(|e| (e.client, e.id)));
                }
                r.batches.push((epoch, sequencer, entries));
            }
            Ok(Record::Reads { slot, from, values }) => r.reads.push((slot, from, values)),
            Ok(Record::Ordered { epoch, entries }) => {
                r.submitted.extend(entries.iter().map(|e| (e.client, e.id)));
                r.ordered.push((epoch, entries));
            }
            Ok(Record::Coordinated { entry, seqs }) => {
                r.submitted.push((entry.client, entry.id));
                r.coordinator_seqs.note(&seqs);
                r.coordinated.push((entry, seqs));
            }
            Ok(Record::Placed { client, id }) => r.coordinated.retain(|(e, _)| (e.client, e.id) != (client, id)),
            Ok(Record::Rows(rows)) => pending_rows.extend(rows),
            Ok(Record::Checkpoint(c)) => r.checkpointed(node, *c, &mut pending_rows),
            Ok(Record::OrdererCheckpoint(c)) => {
                r.ordered.clear();
                r.orderer = Some(*c);
            }
            Err(e) => {
                log_warn(&format!("calvin: node {node}: a log record of {} bytes does not decode: {e}", record.len()))
            }
        }
    }
    r
}

/// What a scheduler refuses, the copy refuses alike (see [`ReplayRules`]).
const RULES: ReplayRules =
    ReplayRules { declared_keys_only: true, undeclared_scans: Some(Abort::Protocol(SCAN_UNDECLARED)) };

#[derive(Serialize, Deserialize)]
struct MachineSnapshot {
    last_epoch: u64,
    /// The executed copy (one sequencer's log only), as `ReplayedCopy::snapshot` has it.
    copy: Vec<u8>,
    /// The records a restarted node runs again, in order: SLOG's orderer's last checkpoint and
    /// its batches after it, the last checkpoint (its rows first: every row written since the
    /// load) and the inputs after it.
    inputs: Vec<Vec<u8>>,
}

/// A replica of a node's input log. It keeps what a restarted node starts from: the rows written
/// since the load, the last checkpoint and the inputs after it (see the module's comment), and
/// its sequencer's last epoch. The one sequencer's replica (`sequencers=one`, node 0) also
/// executes its batches on a full copy of the data.
pub struct InputMachine {
    node: NodeId,
    last_epoch: u64,
    /// SLOG's orderer's last checkpoint and its batches after it.
    ordered: Vec<Vec<u8>>,
    /// Every row a checkpoint wrote since the load, and the rows of a checkpoint on its way, by
    /// key: its slices log a row again each time it was written since (the last one counts).
    rows: FxHashMap<RowKey, Option<Value>>,
    pending_rows: FxHashMap<RowKey, Option<Value>>,
    checkpoint: Option<Checkpoint>,
    /// The inputs since the last checkpoint.
    inputs: Vec<Vec<u8>>,
    copy: Option<ReplayedCopy>,
    /// Records that were no input (a bug or another build): skipped, and counted.
    malformed: u64,
}

impl InputMachine {
    pub fn open(env: &MachineEnv, executes: bool, checkpoint: Option<&[u8]>) -> anyhow::Result<Self> {
        let (workload, partitions) = (env.workload.clone(), env.topo.partitions());
        let s: MachineSnapshot = match checkpoint {
            Some(bytes) => {
                decode(bytes).map_err(|e| anyhow::anyhow!("calvin's input log checkpoint does not decode: {e}"))?
            }
            None => MachineSnapshot { last_epoch: 0, copy: Vec::new(), inputs: Vec::new() },
        };
        let copy = match (executes, checkpoint.is_some()) {
            (false, _) => None,
            (true, false) => Some(ReplayedCopy::new(workload, partitions, RULES)),
            (true, true) => Some(ReplayedCopy::from_snapshot(workload, partitions, RULES, &s.copy)?),
        };
        let mut m = InputMachine {
            node: env.node,
            last_epoch: 0,
            ordered: Vec::new(),
            rows: FxHashMap::default(),
            pending_rows: FxHashMap::default(),
            checkpoint: None,
            inputs: Vec::new(),
            copy: None,
            malformed: 0,
        };
        // The snapshot's records are taken as the log's were, without executing them again.
        s.inputs.iter().for_each(|r| m.apply(r));
        m.copy = copy;
        m.last_epoch = s.last_epoch;
        Ok(m)
    }

    /// Records it keeps (for the report: bounded by checkpoints, not by the run).
    fn kept(&self) -> usize {
        self.ordered.len() + self.inputs.len() + self.checkpoint.is_some() as usize
    }
}

impl LogMachine for InputMachine {
    fn apply(&mut self, record: &[u8]) {
        let (epoch, entries) = match decode::<Record>(record) {
            Ok(Record::Batch { epoch, sequencer, entries }) if sequencer == self.node => (epoch, entries),
            Ok(Record::Ordered { .. }) => return self.ordered.push(record.to_vec()),
            Ok(Record::OrdererCheckpoint(_)) => {
                self.ordered.clear();
                return self.ordered.push(record.to_vec());
            }
            Ok(Record::Rows(rows)) => return self.pending_rows.extend(rows),
            Ok(Record::Checkpoint(c)) => {
                self.rows.extend(self.pending_rows.drain());
                self.checkpoint = Some(*c);
                return self.inputs.clear();
            }
            Ok(_) => return self.inputs.push(record.to_vec()), // The scheduler's, taken from others.
            Err(_) => {
                self.malformed += 1;
                return log_warn(&format!("calvin: an input log record of {} bytes does not decode", record.len()));
            }
        };
        assert!(epoch > self.last_epoch, "the input log runs forward: epoch {epoch} after {}", self.last_epoch);
        self.inputs.push(record.to_vec());
        if let Some(copy) = &mut self.copy {
            for entry in &entries {
                // The outcome is the schedulers' to tell the client; the copy only keeps the writes.
                let _ = copy.execute_with(&entry.req, entry.keys.as_ref());
            }
        }
        self.last_epoch = epoch;
    }

    fn snapshot(&self) -> Vec<u8> {
        let copy = self.copy.as_ref().map(|c| c.snapshot()).unwrap_or_default();
        let mut inputs = self.ordered.clone();
        if let Some(c) = &self.checkpoint {
            let rows: Vec<(RowKey, Option<Value>)> = self.rows.iter().map(|(k, v)| (*k, v.clone())).collect();
            inputs.extend(rows.chunks(ROWS_PER_RECORD).map(Record::rows));
            inputs.push(Record::checkpoint(c));
        }
        inputs.extend(self.inputs.iter().cloned());
        // Rows of a checkpoint whose record is still to come: the records after this snapshot
        // hold only the rest of them.
        let pending: Vec<(RowKey, Option<Value>)> = self.pending_rows.iter().map(|(k, v)| (*k, v.clone())).collect();
        inputs.extend(pending.chunks(ROWS_PER_RECORD).map(Record::rows));
        encode(&MachineSnapshot { last_epoch: self.last_epoch, copy, inputs })
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let kept = ("input-records-kept", self.kept() as u64);
        let Some(copy) = &self.copy else { return vec![("input-replayed-undecodable", self.malformed), kept] };
        let s = copy.stats();
        vec![
            ("input-replayed-committed", s.committed),
            ("input-replayed-rolled-back", s.rolled_back),
            ("input-replayed-undecodable", s.undecodable + self.malformed),
            kept,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::super::orderer::logged_submissions;
    use super::super::resubmits::RecentSubmissions;
    use super::*;

    fn entry(client: Addr, id: u64) -> Entry {
        Entry { client, id, req: Vec::new(), keys: None, piece: None, placed: None, homes: Vec::new(), movement: None }
    }

    /// The case `calvin::tests::a_submission_resent_to_a_failed_over_sequencer_runs_once` meets
    /// only on a seed that happens to cross it, built here record by record: a node restarted
    /// (or taken over) from its log drops a copy of every submission its sequencer or orderer
    /// logged, before its last checkpoint or after it, and takes every other one.
    #[test]
    fn a_restarted_node_drops_a_copy_of_every_submission_its_log_holds() {
        let (node, other) = (2, 3);
        let (a, b) = (Addr::new(7, 1), Addr::new(8, 1));
        let checkpoint =
            SequencerCheckpoint { last_epoch: 1, submitted: vec![(a, 1)], unsent: Vec::new(), ..Default::default() };
        let records = vec![
            Record::batch(1, node, &[entry(a, 1)]),
            Record::checkpoint(&Checkpoint { sequencer: Some(checkpoint), ..Default::default() }),
            Record::batch(2, node, &[entry(a, 2)]),
            Record::batch(9, other, &[entry(b, 3)]),
            Record::coordinated(&entry(a, 4), &vec![(0, 1), (1, 1)]),
            Record::ordered(1, &[entry(b, 5)]),
        ];
        let recovered = recover(node, &records, None);
        assert_eq!(recovered.last_epoch, 2);
        let mut recent = RecentSubmissions::new(1_000, 0, recovered.submitted.iter().copied());
        for logged in [(a, 1), (a, 2), (a, 4), (b, 5)] {
            assert!(!recent.first(10, logged), "{logged:?} is in the log: its copy is dropped");
        }
        assert!(recent.first(10, (b, 3)), "another sequencer's batch holds its own clients' submissions");
        assert!(recent.first(10, (a, 6)), "a submission never logged (queued when the node crashed) is taken");

        let orderer =
            OrdererCheckpoint { submitted: vec![(b, 10)], unsent: vec![(4, vec![entry(b, 11)])], ..Default::default() };
        let logged = logged_submissions(Some(&orderer), &[(5, vec![entry(b, 12)])]);
        let mut intake = RecentSubmissions::new(1_000, 0, logged);
        for logged in [(b, 10), (b, 11), (b, 12)] {
            assert!(!intake.first(10, logged), "{logged:?} is in the orderer's log: its copy is dropped");
        }
        assert!(intake.first(10, (b, 13)));
    }
}
