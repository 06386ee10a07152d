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

use super::messages::{Entry, ReadSet};
use super::piece_seqs::{CoordinatorSeqs, HomeSeqs};
use super::scheduler::Slot;
use super::SCAN_UNDECLARED;
use crate::net::{decode, encode};
use crate::net::{Addr, NodeId};
use crate::protocols::MachineEnv;
use crate::rt::log::LogMachine;
use crate::rt::log_warn;
use crate::txn::replay::{ReplayRules, ReplayedCopy};
use crate::txn::Abort;
use serde::{Deserialize, Serialize};

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
}

/// [`Record`] by reference, to encode without copying (the same wire form).
#[derive(Serialize)]
enum RecordRef<'a> {
    Batch { epoch: u64, sequencer: NodeId, entries: &'a [Entry] },
    Reads { slot: Slot, from: NodeId, values: &'a ReadSet },
    Ordered { epoch: u64, entries: &'a [Entry] },
    Coordinated { entry: &'a Entry, seqs: &'a HomeSeqs },
    Placed { client: Addr, id: u64 },
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
    /// SLOG: every batch its orderer closed, in order.
    pub ordered: Vec<(u64, Vec<Entry>)>,
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
    /// Every record the log held, in order: a restarted scheduler runs them all again.
    inputs: Vec<Vec<u8>>,
}

/// A replica of a node's input log. It keeps every input (a restarted scheduler runs them all
/// again, so a snapshot must hold them: until the calvin issue checkpoints the scheduler's
/// data, the log's snapshot grows with it) and its sequencer's last epoch. The one sequencer's
/// replica (`sequencers=one`, node 0) also executes its batches on a full copy of the data.
pub struct InputMachine {
    node: NodeId,
    last_epoch: u64,
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
        Ok(InputMachine { node: env.node, last_epoch: s.last_epoch, inputs: s.inputs, copy, malformed: 0 })
    }
}

impl LogMachine for InputMachine {
    fn apply(&mut self, record: &[u8]) {
        let (epoch, entries) = match decode::<Record>(record) {
            Ok(Record::Batch { epoch, sequencer, entries }) if sequencer == self.node => (epoch, entries),
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
        encode(&MachineSnapshot { last_epoch: self.last_epoch, copy, inputs: self.inputs.clone() })
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let Some(copy) = &self.copy else { return vec![("input-replayed-undecodable", self.malformed)] };
        let s = copy.stats();
        vec![
            ("input-replayed-committed", s.committed),
            ("input-replayed-rolled-back", s.rolled_back),
            ("input-replayed-undecodable", s.undecodable + self.malformed),
        ]
    }
}
