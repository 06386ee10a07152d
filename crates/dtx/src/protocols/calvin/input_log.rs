//! Calvin's input log: the sequencer logs every batch before any scheduler sees it (Calvin
//! replicates its input before it executes it), and a replica of that log executes what it
//! applies ([`InputMachine`]): a full copy of the data that runs each sequenced request in log
//! order, under the schedulers' rules, so that it ends each as they do. Its snapshot is that
//! copy's (the rows the log changed), so a replica's log compacts behind it.

use super::messages::Entry;
use super::SCAN_UNSUPPORTED;
use crate::net::{decode, encode};
use crate::protocols::MachineEnv;
use crate::rt::log::LogMachine;
use crate::rt::log_warn;
use crate::txn::replay::{ReplayRules, ReplayedCopy};
use crate::txn::Abort;
use serde::{Deserialize, Serialize};

/// One sequenced batch, as logged.
#[derive(Serialize, Deserialize)]
pub struct BatchRecord {
    pub epoch: u64,
    pub entries: Vec<Entry>,
}

impl BatchRecord {
    pub fn encode(epoch: u64, entries: &[Entry]) -> Vec<u8> {
        encode(&(epoch, entries))
    }
}

/// What a sequencer's log held at start: the last epoch it logged (0: none), and the batches
/// its records still hold (those behind a checkpoint are gone).
pub fn recovered_batches(records: &[Vec<u8>], checkpoint: Option<&[u8]>) -> (u64, Vec<(u64, Vec<Entry>)>) {
    let from_checkpoint = checkpoint.and_then(|c| decode::<MachineSnapshot>(c).ok()).map_or(0, |s| s.last_epoch);
    let batches: Vec<(u64, Vec<Entry>)> =
        records.iter().filter_map(|r| decode::<BatchRecord>(r).ok()).map(|b| (b.epoch, b.entries)).collect();
    (batches.iter().map(|(e, _)| *e).fold(from_checkpoint, u64::max), batches)
}

/// What a scheduler refuses, the copy refuses alike (see [`ReplayRules`]).
const RULES: ReplayRules =
    ReplayRules { declared_keys_only: true, refuse_scans: Some(Abort::Protocol(SCAN_UNSUPPORTED)) };

/// A replica of a sequencer's input log when every data node sequences (`sequencers=per-node`):
/// one log holds one sequencer's share of the order, which no copy can run alone, so the
/// replica keeps only the last epoch, for the sequencer's restart after its log is compacted.
#[derive(Default)]
pub struct EpochMachine {
    last_epoch: u64,
}

impl EpochMachine {
    pub fn open(checkpoint: Option<&[u8]>) -> anyhow::Result<Self> {
        let Some(bytes) = checkpoint else { return Ok(EpochMachine::default()) };
        let s: MachineSnapshot =
            decode(bytes).map_err(|e| anyhow::anyhow!("calvin's input log checkpoint does not decode: {e}"))?;
        Ok(EpochMachine { last_epoch: s.last_epoch })
    }
}

impl LogMachine for EpochMachine {
    fn apply(&mut self, record: &[u8]) {
        match decode::<BatchRecord>(record) {
            Ok(batch) => self.last_epoch = self.last_epoch.max(batch.epoch),
            Err(_) => log_warn(&format!("calvin: an input log record of {} bytes is no batch", record.len())),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        encode(&MachineSnapshot { last_epoch: self.last_epoch, copy: Vec::new() })
    }
}

#[derive(Serialize, Deserialize)]
struct MachineSnapshot {
    last_epoch: u64,
    copy: Vec<u8>,
}

/// A replica of a sequencer's input log that executes it.
pub struct InputMachine {
    copy: ReplayedCopy,
    last_epoch: u64,
    /// Records that were no batch (a bug or another build): skipped, and counted.
    malformed: u64,
}

impl InputMachine {
    pub fn open(env: &MachineEnv, checkpoint: Option<&[u8]>) -> anyhow::Result<Self> {
        let (workload, partitions) = (env.workload.clone(), env.topo.partitions());
        let Some(bytes) = checkpoint else {
            return Ok(InputMachine {
                copy: ReplayedCopy::new(workload, partitions, RULES),
                last_epoch: 0,
                malformed: 0,
            });
        };
        let s: MachineSnapshot =
            decode(bytes).map_err(|e| anyhow::anyhow!("calvin's input log checkpoint does not decode: {e}"))?;
        let copy = ReplayedCopy::from_snapshot(workload, partitions, RULES, &s.copy)?;
        Ok(InputMachine { copy, last_epoch: s.last_epoch, malformed: 0 })
    }
}

impl LogMachine for InputMachine {
    fn apply(&mut self, record: &[u8]) {
        let Ok(batch) = decode::<BatchRecord>(record) else {
            self.malformed += 1;
            return log_warn(&format!("calvin: an input log record of {} bytes is no batch", record.len()));
        };
        assert!(
            batch.epoch > self.last_epoch,
            "the input log runs forward: epoch {} after {}",
            batch.epoch,
            self.last_epoch
        );
        for entry in &batch.entries {
            // The outcome is the schedulers' to tell the client; the copy only keeps the writes.
            let _ = self.copy.execute(&entry.req);
        }
        self.last_epoch = batch.epoch;
    }

    fn snapshot(&self) -> Vec<u8> {
        encode(&MachineSnapshot { last_epoch: self.last_epoch, copy: self.copy.snapshot() })
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.copy.stats();
        vec![
            ("input-replayed-committed", s.committed),
            ("input-replayed-rolled-back", s.rolled_back),
            ("input-replayed-undecodable", s.undecodable + self.malformed),
        ]
    }
}
