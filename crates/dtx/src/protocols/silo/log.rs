//! What a worker's stream holds, how a replica replays it, and how a new incarnation of the node
//! rebuilds its data from all of its streams (Rolis §3.5 and §4.1).
//!
//! A stream is one of the node's logs: a WAL of its own (`--durability wal`) or a Raft group of
//! its own (`--durability replicated`, Rolis's Paxos stream). Within an epoch its entries'
//! TIDs grow, so an entry at or below a stream's latest durable TID is durable; an entry at or
//! below the minimum of that over every stream, the watermark, is durable along with every
//! transaction it depends on (their TIDs are smaller: [`super::meta`]).
//!
//! Replay is per stream and order-free: a write is applied only over an older TID, so the
//! streams' replays, in any interleaving and any number of times, end in the leader's state.

use super::meta::{clock_us_of, epoch_of, epoch_start};
use crate::protocols::twopc::durable::Writes;
use crate::storage::{RowKey, Value};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One transaction as logged: its TID and its writes.
pub type Logged = (u64, Writes);

/// A stream's entries.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Entry {
    /// One worker's transactions in TID order (Rolis's log of a batch), and the node's
    /// watermark when it was cut: every TID up to `released` is durable in every stream, so a
    /// replica may replay up to it.
    Batch { released: u64, txns: Vec<Logged> },
    /// The worker had nothing to log: nothing it logs later in this epoch lies at or below
    /// `tid` (Rolis's empty transaction in the heartbeat, which moves an idle stream's tip).
    Heartbeat { released: u64, tid: u64 },
    /// A new incarnation closed epoch `epoch` (Rolis's no-op that ends it): its transactions
    /// up to TID `last`, the epoch's final watermark, are kept, the ones above are dropped.
    Closed { epoch: u64, last: u64 },
}

/// A row as replay leaves it: the TID of its latest write, and the value (`None`: deleted).
pub type Replayed = (u64, Option<Value>);

/// Apply `write` at TID `tid` unless the row holds a later write.
fn apply_write(rows: &mut FxHashMap<RowKey, Replayed>, tid: u64, key: RowKey, value: Option<Value>) {
    match rows.get(&key) {
        Some((at, _)) if *at > tid => {}
        _ => {
            rows.insert(key, (tid, value));
        }
    }
}

/// One stream's state machine on a replica (and in the checkpointer): the rows its replayed
/// transactions wrote, its transactions not yet known safe, and what it knows of epochs.
#[derive(Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct StreamMachine {
    /// Every worker logs into one stream in commit order (`streams=shared`): everything
    /// durable is safe, and replays at once.
    ordered: bool,
    rows: FxHashMap<RowKey, Replayed>,
    pending: VecDeque<Logged>,
    /// Per epoch, the largest TID this stream logged in it (its tip).
    tips: BTreeMap<u64, u64>,
    /// Epochs closed, with their final watermark.
    closed: BTreeMap<u64, u64>,
    /// The largest watermark an entry carried.
    released: u64,
    /// Transactions replayed and dropped (for the report).
    replayed: u64,
    dropped: u64,
}

impl StreamMachine {
    pub fn new(ordered: bool) -> Self {
        StreamMachine { ordered, ..Default::default() }
    }

    pub fn from_checkpoint(ordered: bool, checkpoint: Option<&[u8]>) -> anyhow::Result<Self> {
        match checkpoint {
            None => Ok(StreamMachine::new(ordered)),
            Some(bytes) => {
                let m: StreamMachine =
                    crate::net::decode(bytes).map_err(|e| anyhow::anyhow!("not a silo stream checkpoint: {e}"))?;
                anyhow::ensure!(
                    m.ordered == ordered,
                    "the checkpoint is of a stream with streams={}",
                    if m.ordered { "shared" } else { "per-worker" }
                );
                Ok(m)
            }
        }
    }

    fn note_tip(&mut self, tid: u64) {
        let tip = self.tips.entry(epoch_of(tid)).or_default();
        *tip = (*tip).max(tid);
    }

    /// Replay the pending transactions known safe, in stream order; drop those a closed epoch
    /// left out. Stops at the first one not known safe yet.
    fn replay(&mut self) {
        while let Some((tid, _)) = self.pending.front() {
            let tid = *tid;
            let keep = match self.closed.get(&epoch_of(tid)) {
                _ if self.ordered => true,
                Some(&last) => tid <= last,
                None if tid <= self.released => true,
                None => return,
            };
            let (tid, writes) = self.pending.pop_front().expect("a front entry");
            if keep {
                self.replayed += 1;
                writes.into_iter().for_each(|(k, v)| apply_write(&mut self.rows, tid, k, v));
            } else {
                self.dropped += 1;
            }
        }
    }
}

impl crate::rt::log::LogMachine for StreamMachine {
    fn apply(&mut self, record: &[u8]) {
        match crate::net::decode(record).expect("a silo stream entry") {
            Entry::Batch { released, txns } => {
                for (tid, writes) in txns {
                    self.note_tip(tid);
                    self.pending.push_back((tid, writes));
                }
                self.released = self.released.max(released);
            }
            Entry::Heartbeat { released, tid } => {
                self.note_tip(tid);
                self.released = self.released.max(released);
            }
            Entry::Closed { epoch, last } => {
                self.closed.insert(epoch, last);
            }
        }
        self.replay();
    }

    fn snapshot(&self) -> Vec<u8> {
        crate::net::encode(self)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![("replayed", self.replayed), ("replay-dropped", self.dropped)]
    }

    /// Per-worker streams replay everything up to the watermark the leader carried (each stream
    /// logs in TID order, so nothing of it at or below that point is still to come); the shared
    /// stream replays everything it holds, up to its newest TID.
    fn applied_watermark_us(&self) -> Option<u64> {
        let tid = match self.ordered {
            true => self.tips.values().copied().max().unwrap_or(0),
            false => self.released,
        };
        Some(clock_us_of(tid))
    }
}

/// What a new incarnation of the node starts from.
pub struct Recovered {
    /// Its epoch: one past every epoch its streams name (1 for a fresh node).
    pub epoch: u64,
    /// Per row, its latest kept write.
    pub rows: FxHashMap<RowKey, Replayed>,
    /// Epochs it closed, with their final watermark, to log in every stream before anything of
    /// its own.
    pub closes: Vec<(u64, u64)>,
}

/// Rebuild the node from its streams' machines (each fed its checkpoint and the records after
/// it). An epoch a stream's `Closed` entry names keeps its watermark; any other ended epoch is
/// closed now at its final watermark, the minimum over the streams of their tips in it
/// (Rolis's W_old), and only its transactions at or below that are kept: the ones above may
/// depend on one that was lost, and no client heard of them.
pub fn recover(machines: Vec<StreamMachine>) -> Recovered {
    let epochs: BTreeSet<u64> = machines.iter().flat_map(|m| m.tips.keys().chain(m.closed.keys()).copied()).collect();
    let epoch = epochs.last().map_or(1, |e| e + 1);
    let mut closed: BTreeMap<u64, u64> = machines.iter().flat_map(|m| m.closed.iter().map(|(e, w)| (*e, *w))).collect();
    let ordered = machines.iter().any(|m| m.ordered);
    let mut closes = Vec::new();
    let open: Vec<u64> = epochs.iter().copied().filter(|e| !closed.contains_key(e)).collect();
    for e in open {
        let last = match ordered {
            true => epoch_start(e + 1) - 1,
            false => machines.iter().map(|m| m.tips.get(&e).copied().unwrap_or(epoch_start(e))).min().unwrap_or(0),
        };
        closed.insert(e, last);
        closes.push((e, last));
    }
    let mut rows: FxHashMap<RowKey, Replayed> = FxHashMap::default();
    for mut m in machines {
        m.closed.extend(closed.iter().map(|(e, w)| (*e, *w)));
        m.replay();
        assert!(m.pending.is_empty(), "every epoch a stream holds is closed: nothing stays pending");
        for (k, (tid, v)) in m.rows {
            apply_write(&mut rows, tid, k, v);
        }
    }
    Recovered { epoch, rows, closes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::log::LogMachine;

    fn key(k: u64) -> RowKey {
        RowKey::new(0, k)
    }

    fn batch(m: &mut StreamMachine, released: u64, txns: &[(u64, u64)]) {
        let txns = txns.iter().map(|&(tid, k)| (tid, vec![(key(k), Some(Value::copy_from(&tid.to_le_bytes())))]));
        m.apply(&crate::net::encode(&Entry::Batch { released, txns: txns.collect() }));
    }

    fn at(e: u64, ts: u64) -> u64 {
        epoch_start(e) + ts
    }

    /// Rolis's Fig. 8: five streams whose last durable entries of the old epoch are 34, 27, 41,
    /// 21 and 23. W_old = 21: the new leader keeps exactly what is at or below it.
    #[test]
    fn a_failover_keeps_what_lies_at_or_below_the_old_epochs_final_watermark() {
        let streams: [&[u64]; 5] = [&[1, 12, 24, 34], &[3, 7, 27], &[4, 8, 26, 41], &[2, 9, 21], &[5, 11, 23]];
        let machines = streams
            .iter()
            .map(|tids| {
                let mut m = StreamMachine::new(false);
                // Each entry writes its own row, keyed by its timestamp.
                batch(&mut m, 0, &tids.iter().map(|&t| (at(1, t), t)).collect::<Vec<_>>());
                m
            })
            .collect();
        let r = recover(machines);
        assert_eq!(r.epoch, 2);
        assert_eq!(r.closes, vec![(1, at(1, 21))]);
        let kept: BTreeSet<u64> = r.rows.keys().map(|k| k.key).collect();
        assert_eq!(kept, [1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 21].into_iter().collect());
    }

    #[test]
    fn replay_waits_for_the_watermark_and_is_idempotent_and_order_free() {
        let mut m = StreamMachine::new(false);
        batch(&mut m, 0, &[(at(1, 5), 1), (at(1, 9), 1)]);
        assert!(m.rows.is_empty(), "nothing is known durable everywhere yet");
        m.apply(&crate::net::encode(&Entry::Heartbeat { released: at(1, 5), tid: at(1, 12) }));
        assert_eq!(m.rows[&key(1)].0, at(1, 5), "replayed up to the watermark, and no further");
        let mut again = StreamMachine::new(false);
        batch(&mut again, at(1, 9), &[(at(1, 9), 1)]);
        batch(&mut again, at(1, 9), &[(at(1, 5), 1)]);
        assert_eq!(again.rows[&key(1)].0, at(1, 9), "an older write replayed later changes nothing");
    }

    /// The replay lag is taken from this: a per-worker stream has applied everything up to the
    /// watermark it was told, the shared stream everything it holds.
    #[test]
    fn a_replica_reports_the_clock_it_has_applied_up_to() {
        let clock = |us: u64| at(2, us << 8);
        let mut m = StreamMachine::new(false);
        batch(&mut m, clock(700), &[(clock(650), 1), (clock(900), 2)]);
        assert_eq!(m.applied_watermark_us(), Some(700), "the watermark carried, not the newest entry");
        let mut shared = StreamMachine::new(true);
        batch(&mut shared, 0, &[(clock(650), 1), (clock(900), 2)]);
        assert_eq!(shared.applied_watermark_us(), Some(900));
    }

    #[test]
    fn an_epoch_closed_in_the_log_keeps_its_watermark_at_every_later_recovery() {
        let mut a = StreamMachine::new(false);
        batch(&mut a, 0, &[(at(1, 3), 1), (at(1, 8), 2)]);
        a.apply(&crate::net::encode(&Entry::Closed { epoch: 1, last: at(1, 3) }));
        let mut b = StreamMachine::new(false);
        batch(&mut b, 0, &[(at(1, 9), 3)]);
        let r = recover(vec![a, b]);
        assert!(r.closes.is_empty(), "epoch 1 was closed before");
        let kept: BTreeSet<u64> = r.rows.keys().map(|k| k.key).collect();
        assert_eq!(kept, [1].into_iter().collect(), "the watermark logged wins over the tips found now");
    }
}
