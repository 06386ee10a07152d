//! What a worker's stream holds, how a replica replays it, and how a new incarnation of the node
//! rebuilds its data from all of its streams (Rolis §3.5 and §4.1).
//!
//! A stream is one of the node's logs: a WAL of its own (`--durability wal`) or a Raft group of
//! its own (`--durability replicated`, Rolis's Paxos stream). Within an epoch its entries'
//! TIDs grow, so an entry at or below a stream's latest durable TID is durable; an entry at or
//! below the minimum of that over every stream, the watermark, is durable along with every
//! transaction it depends on (their TIDs are smaller: [`super::meta`]).
//!
//! A replica keeps one state over all of a node's streams ([`NodeReplica`]) and replays a
//! transaction once it holds everything below it: at or below its own watermark, the minimum
//! over the streams it holds of their tips. Replay is order-free: a write is applied only over
//! an older TID, so the streams' replays, in any interleaving and any number of times, end in
//! the leader's state, and at every moment the replica's rows are a prefix of the leader's
//! serial order.

use super::meta::{clock_us_of, epoch_of, epoch_start};
use crate::protocols::twopc::durable::Writes;
use crate::storage::{RowKey, Value};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// One transaction as logged: its TID and its writes.
pub type Logged = (u64, Writes);

/// A stream's entries.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Entry {
    /// One worker's transactions in TID order (Rolis's log of a batch), and the leader's
    /// watermark when it was cut (every TID up to `released` was durable in every stream; a
    /// replica replays below its own watermark, which holds that and more: nothing below it is
    /// still to arrive).
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

/// A replayed row and the stream whose write it holds (that stream's snapshot carries it).
type Owned = (u64, u16, Option<Value>);

/// Apply `write` at TID `tid` from stream `stream` unless the row holds a later write.
fn apply_write(rows: &mut Rows, tid: u64, stream: u16, key: RowKey, value: Option<Value>) {
    let shard = rows.shard_mut(&key);
    match shard.get(&key) {
        Some((at, _, _)) if *at > tid => {}
        _ => {
            shard.insert(key, (tid, stream, value));
        }
    }
}

/// Hash maps a replica's rows are spread over.
const ROW_SHARDS: usize = 1024;
const _: () = assert!(ROW_SHARDS.is_power_of_two(), "a shard is picked by the top bits of a hash");

/// A replica's replayed rows, spread by key over [`ROW_SHARDS`] hash maps. One map rehashed every
/// row at once as it grew: a follower replaying TPC-C in `local` spent tens of milliseconds in
/// one insert, its Raft acknowledgements held behind it, and both followers did so together
/// (they replay the same rows), holding the leader's commits back meanwhile. Small maps cross
/// their thresholds at scattered moments, a few per batch.
#[derive(Debug, Clone)]
struct Rows(Box<[FxHashMap<RowKey, Owned>]>);

impl Rows {
    fn new() -> Self {
        Rows((0..ROW_SHARDS).map(|_| FxHashMap::default()).collect())
    }

    /// The shard of `key`, by a hash of its own: the maps hash with Fx, and a shard whose keys
    /// shared the bits Fx's buckets or tags use would crowd them.
    fn shard_mut(&mut self, key: &RowKey) -> &mut FxHashMap<RowKey, Owned> {
        let mixed = (key.key ^ (key.table as u64) << 48).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &mut self.0[(mixed >> (64 - ROW_SHARDS.trailing_zeros())) as usize]
    }

    fn iter(&self) -> impl Iterator<Item = (&RowKey, &Owned)> {
        self.0.iter().flat_map(|m| m.iter())
    }
}

/// What one stream holds on a replica: its transactions not yet replayed, and per epoch the
/// largest TID it logged in it (its tip).
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct StreamPart {
    pending: VecDeque<Logged>,
    tips: BTreeMap<u64, u64>,
    /// Transactions replayed and dropped (for the report).
    replayed: u64,
    dropped: u64,
    /// Records that did not decode as a stream entry: refused, counted, never applied (a
    /// corrupt or foreign record must not take the replica down; the stream's next entries
    /// still replay, each with the TIDs it carries).
    #[serde(default)]
    undecodable: u64,
}

/// A node's replica over all of its streams (Rolis's replica state, §4.1): every stream's part
/// and the rows their replay left. A transaction is replayed once the replica holds every
/// transaction below it: its TID is at or below the minimum, over the node's streams, of their
/// tips in its epoch (the replica's own watermark: streams log in TID order, and a replica
/// holds only committed entries), or at or below the final watermark of a closed epoch. So the
/// rows are always a prefix of the leader's serial order, and replay, which applies a write
/// only over an older TID, ends in the same state in any interleaving and any number of times.
#[derive(Debug, Clone)]
pub struct NodeReplica {
    /// Every worker logs into one stream in commit order (`streams=shared`): everything
    /// durable is safe, and replays at once.
    ordered: bool,
    streams: Vec<StreamPart>,
    rows: Rows,
    /// Epochs closed, with their final watermark.
    closed: BTreeMap<u64, u64>,
    /// Writes replayed since [`crate::rt::log::LogMachine::take_steps`] last took them (the simulator charges
    /// each as a record-level step).
    steps: usize,
}

impl NodeReplica {
    pub fn new(ordered: bool, streams: usize) -> Self {
        assert!(streams >= 1, "a node has at least one stream");
        NodeReplica {
            ordered,
            streams: vec![StreamPart::default(); streams],
            rows: Rows::new(),
            closed: BTreeMap::new(),
            steps: 0,
        }
    }

    /// The newest epoch any stream logged in, and the replica's watermark in it.
    fn newest(&self) -> (u64, u64) {
        let epoch = self.streams.iter().filter_map(|p| p.tips.keys().next_back()).copied().max().unwrap_or(0);
        (epoch, self.watermark_in(epoch))
    }

    /// The replica's watermark in `epoch`: the smallest of the streams' tips in it (a stream
    /// that logged nothing in it yet holds it at the epoch's start).
    fn watermark_in(&self, epoch: u64) -> u64 {
        self.streams.iter().map(|p| p.tips.get(&epoch).copied().unwrap_or(epoch_start(epoch))).min().unwrap_or(0)
    }

    fn apply(&mut self, stream: u16, entry: Entry) {
        let part = &mut self.streams[stream as usize];
        let note_tip = |part: &mut StreamPart, tid: u64| {
            let tip = part.tips.entry(epoch_of(tid)).or_default();
            *tip = (*tip).max(tid);
        };
        match entry {
            Entry::Batch { txns, .. } => {
                for (tid, writes) in txns {
                    note_tip(part, tid);
                    part.pending.push_back((tid, writes));
                }
            }
            Entry::Heartbeat { tid, .. } => note_tip(part, tid),
            Entry::Closed { epoch, last } => {
                self.closed.insert(epoch, last);
            }
        }
        self.replay();
    }

    /// Whether transaction `tid` is known safe (kept), known dropped, or not known yet, given
    /// the newest epoch and the watermark in it ([`Self::newest`]).
    fn fate(&self, tid: u64, (newest, watermark): (u64, u64)) -> Option<bool> {
        let epoch = epoch_of(tid);
        match self.closed.get(&epoch) {
            _ if self.ordered => Some(true),
            Some(&last) => Some(tid <= last),
            None if epoch < newest => (tid <= self.watermark_in(epoch)).then_some(true),
            None => (tid <= watermark).then_some(true),
        }
    }

    /// Replay every stream's pending transactions known safe, in stream order; drop those a
    /// closed epoch left out. Each stream stops at its first one not known yet.
    fn replay(&mut self) {
        let newest = self.newest();
        for s in 0..self.streams.len() {
            while let Some(&(tid, _)) = self.streams[s].pending.front() {
                let Some(keep) = self.fate(tid, newest) else { break };
                let part = &mut self.streams[s];
                let (tid, writes) = part.pending.pop_front().expect("a front entry");
                if keep {
                    part.replayed += 1;
                    self.steps += writes.len();
                    writes.into_iter().for_each(|(k, v)| apply_write(&mut self.rows, tid, s as u16, k, v));
                } else {
                    part.dropped += 1;
                }
            }
        }
    }

    /// Every transaction at or below this TID is replayed (the newest epoch's watermark; the
    /// shared stream: its newest TID).
    fn applied_up_to(&self) -> u64 {
        match self.ordered {
            true => self.streams[0].tips.values().copied().max().unwrap_or(0),
            false => self.newest().1,
        }
    }
}

/// A stream's snapshot: its part, the rows whose latest write is its own, and the epochs known
/// closed. The streams' snapshots, taken at any times, together hold every row's latest
/// replayed write (a write another stream overwrote is in that stream's snapshot or log).
#[derive(serde::Serialize, serde::Deserialize)]
struct StreamSnapshot {
    ordered: bool,
    streams: u16,
    part: StreamPart,
    rows: Vec<(RowKey, u64, Option<Value>)>,
    closed: BTreeMap<u64, u64>,
}

/// One stream's state machine on a replica (and in the checkpointer): a handle on the node's
/// replica that its stream's entries go into. The handles of one node's streams on one host
/// share one [`NodeReplica`].
#[derive(Clone)]
pub struct StreamMachine {
    node: Arc<Mutex<NodeReplica>>,
    stream: u16,
}

impl StreamMachine {
    /// A handle per stream on a fresh replica of a node with `streams` streams.
    pub fn fresh(ordered: bool, streams: usize) -> Vec<StreamMachine> {
        handles(Arc::new(Mutex::new(NodeReplica::new(ordered, streams))), streams)
    }

    /// Stream `stream`'s handle on `node`, with its checkpoint (if any) merged in.
    pub fn joining(node: &Arc<Mutex<NodeReplica>>, stream: u16, checkpoint: Option<&[u8]>) -> anyhow::Result<Self> {
        let m = StreamMachine { node: node.clone(), stream };
        if let Some(bytes) = checkpoint {
            let snap: StreamSnapshot =
                crate::net::decode(bytes).map_err(|e| anyhow::anyhow!("not a silo stream checkpoint: {e}"))?;
            let mut r = node.lock();
            anyhow::ensure!(
                snap.ordered == r.ordered && snap.streams as usize == r.streams.len(),
                "the checkpoint is of a node with streams={} and {} streams, not {} and {}",
                if snap.ordered { "shared" } else { "per-worker" },
                snap.streams,
                if r.ordered { "shared" } else { "per-worker" },
                r.streams.len()
            );
            r.streams[stream as usize] = snap.part;
            r.closed.extend(snap.closed);
            for (k, tid, v) in snap.rows {
                apply_write(&mut r.rows, tid, stream, k, v);
            }
            r.replay();
        }
        Ok(m)
    }

    /// A copy of these handles' replica (one node's, all of its streams) that they share.
    pub fn deep_copy(machines: &[StreamMachine]) -> Vec<StreamMachine> {
        let Some(first) = machines.first() else { return Vec::new() };
        let copy = first.node.lock().clone();
        let streams = copy.streams.len();
        handles(Arc::new(Mutex::new(copy)), streams)
    }
}

fn handles(node: Arc<Mutex<NodeReplica>>, streams: usize) -> Vec<StreamMachine> {
    (0..streams as u16).map(|stream| StreamMachine { node: node.clone(), stream }).collect()
}

impl crate::rt::log::LogMachine for StreamMachine {
    fn apply(&mut self, record: &[u8]) {
        match crate::net::decode(record) {
            Ok(entry) => self.node.lock().apply(self.stream, entry),
            Err(e) => {
                self.node.lock().streams[self.stream as usize].undecodable += 1;
                crate::rt::log_warn(&format!(
                    "silo: stream {}: refused a log record of {} bytes that is no stream entry: {e}",
                    self.stream,
                    record.len()
                ));
            }
        }
    }

    fn take_steps(&mut self) -> usize {
        std::mem::take(&mut self.node.lock().steps)
    }

    fn snapshot(&self) -> Vec<u8> {
        let r = self.node.lock();
        let rows = r.rows.iter().filter(|(_, (_, by, _))| *by == self.stream);
        crate::net::encode(&StreamSnapshot {
            ordered: r.ordered,
            streams: r.streams.len() as u16,
            part: r.streams[self.stream as usize].clone(),
            rows: rows.map(|(k, (tid, _, v))| (*k, *tid, v.clone())).collect(),
            closed: r.closed.clone(),
        })
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let r = self.node.lock();
        let part = &r.streams[self.stream as usize];
        vec![("replayed", part.replayed), ("replay-dropped", part.dropped), ("replay-undecodable", part.undecodable)]
    }

    /// None for a replica of a node that logged nothing (a replica-only host's own logs).
    fn applied_watermark_us(&self) -> Option<u64> {
        let r = self.node.lock();
        let logged = r.streams.iter().any(|p| !p.tips.is_empty());
        logged.then(|| clock_us_of(r.applied_up_to()))
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

/// Rebuild the node from its replica (fed every stream's checkpoint and the records after
/// it). An epoch a stream's `Closed` entry names keeps its watermark; any other ended epoch is
/// closed now at its final watermark, the minimum over the streams of their tips in it
/// (Rolis's W_old), and only its transactions at or below that are kept: the ones above may
/// depend on one that was lost, and no client heard of them.
pub fn recover(machines: &[StreamMachine]) -> Recovered {
    let Some(first) = machines.first() else {
        return Recovered { epoch: 1, rows: FxHashMap::default(), closes: Vec::new() };
    };
    let mut r = first.node.lock();
    let epochs: BTreeSet<u64> = r.streams.iter().flat_map(|p| p.tips.keys()).chain(r.closed.keys()).copied().collect();
    let epoch = epochs.last().map_or(1, |e| e + 1);
    let mut closes = Vec::new();
    let open: Vec<u64> = epochs.into_iter().filter(|e| !r.closed.contains_key(e)).collect();
    for e in open {
        let last = match r.ordered {
            true => epoch_start(e + 1) - 1,
            false => r.watermark_in(e),
        };
        r.closed.insert(e, last);
        closes.push((e, last));
    }
    r.replay();
    assert!(
        r.streams.iter().all(|p| p.pending.is_empty()),
        "every epoch a stream holds is closed: nothing stays pending"
    );
    let rows = r.rows.iter().map(|(k, (tid, _, v))| (*k, (*tid, v.clone()))).collect();
    Recovered { epoch, rows, closes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::log::LogMachine;
    use rand::{Rng, SeedableRng};

    fn key(k: u64) -> RowKey {
        RowKey::new(0, k)
    }

    fn entry(e: &Entry) -> Vec<u8> {
        crate::net::encode(e)
    }

    fn batch(m: &mut StreamMachine, txns: &[(u64, u64)]) {
        let txns = txns.iter().map(|&(tid, k)| (tid, vec![(key(k), Some(Value::copy_from(&tid.to_le_bytes())))]));
        m.apply(&entry(&Entry::Batch { released: 0, txns: txns.collect() }));
    }

    fn at(e: u64, ts: u64) -> u64 {
        epoch_start(e) + ts
    }

    fn rows(m: &StreamMachine) -> BTreeMap<u64, u64> {
        m.node.lock().rows.iter().map(|(k, (tid, _, _))| (k.key, *tid)).collect()
    }

    /// A record that is no stream entry is refused and counted; the replica keeps replaying
    /// the entries after it.
    #[test]
    fn an_undecodable_record_is_counted_and_refused_and_replay_goes_on() {
        let mut machines = StreamMachine::fresh(true, 1);
        let m = &mut machines[0];
        batch(m, &[(at(1, 1), 1)]);
        m.apply(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        m.apply(&[]);
        batch(m, &[(at(1, 2), 2)]);
        let counters: BTreeMap<_, _> = m.counters().into_iter().collect();
        assert_eq!(counters["replay-undecodable"], 2);
        assert_eq!(counters["replayed"], 2, "{counters:?}");
        assert_eq!(rows(m), BTreeMap::from([(1, at(1, 1)), (2, at(1, 2))]));
    }

    /// Rolis's Fig. 8: five streams whose last durable entries of the old epoch are 34, 27, 41,
    /// 21 and 23. W_old = 21: the new leader keeps exactly what is at or below it.
    #[test]
    fn a_failover_keeps_what_lies_at_or_below_the_old_epochs_final_watermark() {
        let streams: [&[u64]; 5] = [&[1, 12, 24, 34], &[3, 7, 27], &[4, 8, 26, 41], &[2, 9, 21], &[5, 11, 23]];
        let mut machines = StreamMachine::fresh(false, 5);
        for (m, tids) in machines.iter_mut().zip(streams) {
            // Each entry writes its own row, keyed by its timestamp.
            batch(m, &tids.iter().map(|&t| (at(1, t), t)).collect::<Vec<_>>());
        }
        let r = recover(&machines);
        assert_eq!(r.epoch, 2);
        assert_eq!(r.closes, vec![(1, at(1, 21))]);
        let kept: BTreeSet<u64> = r.rows.keys().map(|k| k.key).collect();
        assert_eq!(kept, [1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 21].into_iter().collect());
    }

    #[test]
    fn replay_waits_for_every_stream_and_an_older_write_changes_nothing() {
        let mut m = StreamMachine::fresh(false, 2);
        batch(&mut m[0], &[(at(1, 5), 1), (at(1, 9), 1)]);
        assert!(rows(&m[0]).is_empty(), "stream 1 has not said how far it got");
        m[1].apply(&entry(&Entry::Heartbeat { released: 0, tid: at(1, 7) }));
        assert_eq!(rows(&m[0])[&1], at(1, 5), "replayed up to the replica's watermark, and no further");
        batch(&mut m[1], &[(at(1, 8), 1)]);
        m[1].apply(&entry(&Entry::Heartbeat { released: 0, tid: at(1, 12) }));
        assert_eq!(rows(&m[0])[&1], at(1, 9), "the newest write wins, whichever stream replays last");
    }

    /// The replay lag is taken from this: per-worker streams have applied everything up to the
    /// replica's watermark, the shared stream everything it holds.
    #[test]
    fn a_replica_reports_the_clock_it_has_applied_up_to() {
        let clock = |us: u64| at(2, us << 8);
        let mut m = StreamMachine::fresh(false, 2);
        assert_eq!(m[0].applied_watermark_us(), None, "a node that logged nothing has no lag to report");
        batch(&mut m[0], &[(clock(650), 1), (clock(900), 2)]);
        batch(&mut m[1], &[(clock(700), 3)]);
        assert_eq!(m[0].applied_watermark_us(), Some(700), "the smaller tip, not the newest entry");
        let mut shared = StreamMachine::fresh(true, 1);
        batch(&mut shared[0], &[(clock(650), 1), (clock(900), 2)]);
        assert_eq!(shared[0].applied_watermark_us(), Some(900));
    }

    #[test]
    fn an_epoch_closed_in_the_log_keeps_its_watermark_at_every_later_recovery() {
        let mut m = StreamMachine::fresh(false, 2);
        batch(&mut m[0], &[(at(1, 3), 1), (at(1, 8), 2)]);
        m[0].apply(&entry(&Entry::Closed { epoch: 1, last: at(1, 3) }));
        batch(&mut m[1], &[(at(1, 9), 3)]);
        let r = recover(&m);
        assert!(r.closes.is_empty(), "epoch 1 was closed before");
        let kept: BTreeSet<u64> = r.rows.keys().map(|k| k.key).collect();
        assert_eq!(kept, [1].into_iter().collect(), "the watermark logged wins over the tips found now");
    }

    /// A leader's run: transactions in TID order (its serial order), each logged in its
    /// worker's stream, cut into batches and heartbeats at random.
    fn leader_streams(rng: &mut rand::rngs::StdRng, streams: usize, txns: u64) -> (Vec<Vec<Entry>>, Vec<(u64, u64)>) {
        let mut logged: Vec<Vec<Entry>> = (0..streams).map(|_| Vec::new()).collect();
        let mut buffered: Vec<Vec<Logged>> = (0..streams).map(|_| Vec::new()).collect();
        let mut serial = Vec::new();
        for t in 1..=txns {
            let w = rng.gen_range(0..streams);
            let (tid, k) = (at(1, t << 8 | w as u64), rng.gen_range(0..12u64));
            serial.push((tid, k));
            buffered[w].push((tid, vec![(key(k), Some(Value::copy_from(&tid.to_le_bytes())))]));
            let s = rng.gen_range(0..streams);
            if rng.gen_bool(0.3) {
                let entry = match std::mem::take(&mut buffered[s]) {
                    b if b.is_empty() => Entry::Heartbeat { released: 0, tid: at(1, t << 8 | 0xff) },
                    txns => Entry::Batch { released: 0, txns },
                };
                logged[s].push(entry);
            }
        }
        (logged, serial)
    }

    /// Rolis's replica guarantee, over random runs and random arrival orders of the streams'
    /// entries: after every entry a replica's rows are exactly the leader's serial order up to
    /// the replica's watermark (a prefix: nothing below it missing, nothing above it shown);
    /// applying a stream's entries again changes nothing; and a replica rebuilt from its
    /// streams' snapshots, taken at different times, ends in the same rows.
    #[test]
    fn a_replica_is_always_a_prefix_of_the_leaders_serial_order() {
        for seed in 0..40 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let streams = rng.gen_range(1..5);
            let (logged, serial) = leader_streams(&mut rng, streams, 300);
            let mut replica = StreamMachine::fresh(false, streams);
            let mut next = vec![0; streams];
            let mut snapshots: Vec<Option<(usize, Vec<u8>)>> = vec![None; streams];
            while let Some(s) = {
                let left: Vec<usize> = (0..streams).filter(|&s| next[s] < logged[s].len()).collect();
                (!left.is_empty()).then(|| left[rng.gen_range(0..left.len())])
            } {
                let bytes = entry(&logged[s][next[s]]);
                replica[s].apply(&bytes);
                next[s] += 1;
                if rng.gen_bool(0.1) {
                    snapshots[s] = Some((next[s], replica[s].snapshot()));
                }
                let upto = replica[0].node.lock().applied_up_to();
                let mut expected = BTreeMap::new();
                for &(tid, k) in serial.iter().filter(|(tid, _)| *tid <= upto) {
                    expected.insert(k, tid);
                }
                assert_eq!(rows(&replica[0]), expected, "seed {seed}: the rows up to the watermark {upto:#x}");
            }
            let before = rows(&replica[0]);
            for (s, entries) in logged.iter().enumerate() {
                entries.iter().for_each(|e| replica[s].apply(&entry(e)));
            }
            assert_eq!(rows(&replica[0]), before, "seed {seed}: a stream applied twice changes nothing");
            let rebuilt = Arc::new(Mutex::new(NodeReplica::new(false, streams)));
            for (s, entries) in logged.iter().enumerate() {
                let (from, snap) = snapshots[s].clone().map_or((0, None), |(i, b)| (i, Some(b)));
                let mut m = StreamMachine::joining(&rebuilt, s as u16, snap.as_deref()).expect("a snapshot");
                entries[from..].iter().for_each(|e| m.apply(&entry(e)));
            }
            let rebuilt = StreamMachine { node: rebuilt, stream: 0 };
            assert_eq!(rows(&rebuilt), before, "seed {seed}: rebuilt from snapshots and the entries after them");
        }
    }
}
