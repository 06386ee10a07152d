//! List-append (Elle's workload): a small key space, each key a list of integers; transactions
//! of reads (the whole list) and appends (a value unique to that key across the run). The
//! history of such a run lets the checker infer each key's version order from the reads
//! themselves and prove the run serializable, or name the anomaly.
//!
//! Keys rotate, as Elle's generator retires a key after a few writes: `--keys` is how many
//! keys are in use at a time, and once a process has made [`APPENDS_PER_KEY`] appends per key
//! it moves on to its next *generation*, the next `--keys` fresh keys. Without it a read
//! returns every append the key ever took: a one-second tcp run of 100,000 appends over 32 keys
//! wrote a 3 GB history, its reads 3,000 values long, and a server that built its reply grew to
//! 16 GB and was killed.
//!
//! Generations never come round to an old key, since a list that took appends every time round
//! grows at the process's rate for as long as the run lasts (a 0.5 s Silo run in `sim` wrote
//! reads 1,000 values long, a 5.7 GB history). The rows are bounded instead: generation `g`
//! uses the rows (*slots*) of set `g % GENERATIONS`, and a slot holds the list of one key at a
//! time, tagged with its *round* (`g / GENERATIONS`). The history's key is the slot and the round
//! together ([`Append::key_of`]), so every round's list is a key of its own, never longer than
//! the appends a process makes in one generation. An append for a newer round *retires* the
//! slot's old key: it reads the old list whole, records that read as a `retire` (the checker
//! holds every committed append to that key to it, as to the final read) and starts the new
//! list. An append for an older round than the slot's finds its key retired and aborts
//! (`stale-request`); its retry moves to the process's current generation. The final read reads
//! every slot, so every key is either retired (and its retire read checked) or read at the end.

use super::{Procedures, Workload, WorkloadParams};
use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{
    decode_args, encode_args, Abort, Args, Ctx, HistOp, KeySet, ProcFuture, RequestError, TxnOutput, TxnRequest,
};
use crate::util::Rng;
use anyhow::bail;
use rand::Rng as _;
use std::sync::atomic::{AtomicU64, Ordering};

const TABLE: u16 = 0;

/// Appends a process makes per key in use before it moves on to its next generation.
pub const APPENDS_PER_KEY: u64 = 64;
/// Sets of slots (rows) a run's generations go through before they use the first set again,
/// for the next round (fewer when `--keys` is large: the slots stay within [`ROTATED_KEYS_MAX`]).
pub const GENERATIONS: u64 = 64;
/// The most slots rotation loads (`--keys` times the generations), all of which the final read
/// reads: a read-all transaction of 6,144 keys never committed interactively under COCO's
/// epochs in `sim` (3,072 did), and reading fewer would miss the keys a run before a restart,
/// or another process, appended to.
pub const ROTATED_KEYS_MAX: u64 = 2_048;

pub struct Append {
    /// Keys in use at a time.
    keys: u64,
    /// Sets of `keys` slots the run rotates through: the loaded slots are `keys * generations`.
    generations: u64,
    max_ops: u32,
    read_ratio: f64,
    partitions: u32,
    /// Unique append values: the home partition in the high bits, a counter below, starting
    /// in the process's own range (a node taken over by another process appends from there).
    counter: AtomicU64,
    /// The process's way through its generations: one per append it drew, and moved on at once
    /// to a newer generation a procedure it ran found written ([`Append::observe`]), so that a
    /// process that fell behind (or restarted) catches up rather than meeting retired keys.
    progress: AtomicU64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum AppendOp {
    /// Read a key (a slot and round, [`Append::key_of`]): the slot's list, whatever its round.
    Read(u64),
    /// Append a value to a key (a slot and round).
    Append(u64, u64),
}

impl AppendOp {
    /// The key it reads or appends to.
    pub fn key(&self) -> u64 {
        match *self {
            AppendOp::Read(k) | AppendOp::Append(k, _) => k,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AppendArgs {
    pub ops: Vec<AppendOp>,
}

/// A slot's stored value: its round, then its list (8 bytes each, little-endian). An empty
/// value, as loaded, is round 0's empty list.
pub fn decode_slot(v: &[u8]) -> (u64, Vec<u64>) {
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    match v.split_first_chunk::<8>() {
        Some((round, list)) => (u64::from_le_bytes(*round), list.chunks_exact(8).map(word).collect()),
        None => (0, Vec::new()),
    }
}

fn encode_slot(round: u64, list: &[u64]) -> Value {
    let mut out = Vec::with_capacity((list.len() + 1) * 8);
    out.extend_from_slice(&round.to_le_bytes());
    for v in list {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Value::from(out)
}

impl Append {
    pub fn new(p: &WorkloadParams, topo: &Topology) -> anyhow::Result<Self> {
        if p.keys == 0 || p.keys > 1_000_000 {
            bail!("--keys {} must be between 1 and 1,000,000 for list-append", p.keys);
        }
        if p.ops == 0 || p.ops > 64 {
            bail!("--ops {} must be between 1 and 64 for list-append", p.ops);
        }
        if !(0.0..=1.0).contains(&p.read_ratio) {
            bail!("--read-ratio {} must be within 0..1", p.read_ratio);
        }
        Ok(Append {
            keys: p.keys,
            generations: (ROTATED_KEYS_MAX / p.keys).clamp(1, GENERATIONS),
            max_ops: p.ops,
            read_ratio: p.read_ratio,
            partitions: topo.partitions(),
            counter: AtomicU64::new(((p.process as u64) << 28) | 1),
            progress: AtomicU64::new(0),
        })
    }

    /// Every slot the run may touch (the loaded rows, and what the final read reads).
    fn slots(&self) -> u64 {
        self.keys * self.generations
    }

    /// Appends a process draws in one generation.
    fn appends_per_generation(&self) -> u64 {
        self.keys * APPENDS_PER_KEY
    }

    /// The history's key of a slot's list in a round.
    pub fn key_of(&self, slot: u64, round: u64) -> u64 {
        round * self.slots() + slot
    }

    /// A key's slot and round.
    fn slot_and_round(&self, key: u64) -> (u64, u64) {
        (key % self.slots(), key / self.slots())
    }

    fn row(&self, key: u64) -> RowKey {
        RowKey::new(TABLE, key % self.slots())
    }

    /// The generation that writes a slot's list of a round.
    fn generation_of(&self, slot: u64, round: u64) -> u64 {
        round * self.generations + slot / self.keys
    }

    /// The generation that draws a key.
    fn generation_of_key(&self, key: u64) -> u64 {
        let (slot, round) = self.slot_and_round(key);
        self.generation_of(slot, round)
    }

    /// The generation this process is in.
    fn generation(&self) -> u64 {
        self.progress.load(Ordering::Relaxed) / self.appends_per_generation()
    }

    /// The first key of the generation this process is in.
    fn first_key_in_use(&self) -> u64 {
        let g = self.generation();
        self.key_of(g % self.generations * self.keys, g / self.generations)
    }

    /// A procedure found `slot` at `round`: a process behind the generation that wrote it moves
    /// on to it (no-op in a single process, whose own generation wrote it).
    fn observe(&self, slot: u64, round: u64) {
        let start = self.generation_of(slot, round) * self.appends_per_generation();
        self.progress.fetch_max(start, Ordering::Relaxed);
    }

    /// Append `val` to `key`: to its slot's list when the slot holds the key's round; over a
    /// list of an older round, which the append retires (recorded as a `retire` read of it);
    /// never over a newer round's (`stale-request`: the key was retired).
    async fn append(&self, ctx: &mut Ctx<'_>, key: u64, val: u64, history: &mut Vec<HistOp>) -> Result<(), Abort> {
        let (slot, round) = self.slot_and_round(key);
        let row = self.row(key);
        let (stored, mut list) = ctx.read_for_update(row).await?.as_deref().map(decode_slot).unwrap_or_default();
        self.observe(slot, stored);
        if stored > round {
            return Err(Abort::Stale);
        }
        if stored < round {
            history.push(HistOp::Retire(self.key_of(slot, stored), std::mem::take(&mut list)));
        }
        list.push(val);
        ctx.write(row, encode_slot(round, &list)).await?;
        history.push(HistOp::Append(key, val));
        Ok(())
    }

    fn fresh_value(&self, home: PartitionId) -> u64 {
        self.progress.fetch_add(1, Ordering::Relaxed);
        ((home as u64 + 1) << 40) | self.counter.fetch_add(1, Ordering::Relaxed)
    }
}

impl Procedures for Append {
    fn encode_args(&self, req: &TxnRequest) -> Vec<u8> {
        encode_args::<AppendArgs>(req)
    }

    fn decode_args(&self, proc: &'static str, bytes: &[u8]) -> Result<Args, RequestError> {
        decode_args::<AppendArgs>(proc, bytes)
    }

    fn tables(&self, _partitions: &[PartitionId]) -> Vec<TableDef> {
        vec![TableDef {
            name: "lists",
            ordered: false,
            expected_rows: self.slots() as usize,
            dense: vec![],
            ..Default::default()
        }]
    }

    fn scans(&self) -> bool {
        false
    }

    /// Not the final read: it must see every append acknowledged before it (a snapshot is older).
    fn read_only(&self, req: &TxnRequest) -> bool {
        req.proc != "read-all" && req.args::<AppendArgs>().ops.iter().all(|op| matches!(op, AppendOp::Read(_)))
    }

    fn procedures(&self) -> &'static [&'static str] {
        &["append-txn", "read-all"]
    }

    fn partition_of(&self, key: RowKey) -> PartitionId {
        (key.key % self.partitions as u64) as PartitionId
    }

    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value)) {
        for k in (0..self.slots()).filter(|k| k % self.partitions as u64 == p as u64) {
            sink(RowKey::new(TABLE, k), Value::default());
        }
    }

    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool {
        for op in &req.args::<AppendArgs>().ops {
            match op {
                AppendOp::Read(k) => keys.read(self.row(*k)),
                AppendOp::Append(k, _) => keys.write(self.row(*k)),
            }
        }
        true
    }

    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a> {
        Box::pin(async move {
            let args = req.args::<AppendArgs>();
            let mut history = Vec::with_capacity(args.ops.len());
            for op in &args.ops {
                match *op {
                    AppendOp::Read(k) => {
                        let (slot, _) = self.slot_and_round(k);
                        let (round, list) =
                            ctx.read(self.row(k)).await?.as_deref().map(decode_slot).unwrap_or_default();
                        self.observe(slot, round);
                        history.push(HistOp::Read(self.key_of(slot, round), Some(list)));
                    }
                    AppendOp::Append(k, val) => self.append(ctx, k, val, &mut history).await?,
                }
            }
            Ok(TxnOutput { history, ..Default::default() })
        })
    }
}

impl Workload for Append {
    fn name(&self) -> &'static str {
        "append"
    }

    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest {
        let n = rng.gen_range(1..=self.max_ops);
        let first = self.first_key_in_use();
        let ops = (0..n)
            .map(|_| {
                let k = first + rng.gen_range(0..self.keys);
                if rng.gen_bool(self.read_ratio) {
                    AppendOp::Read(k)
                } else {
                    AppendOp::Append(k, self.fresh_value(home))
                }
            })
            .collect();
        TxnRequest::new("append-txn", home, AppendArgs { ops })
    }

    /// Fresh values for the appends. The keys stay, as they did before keys were retired,
    /// unless the process has gone a whole round of its slots since the request was drawn: its
    /// keys' slots are then taken by the next round, or about to be (an append there aborts
    /// `stale-request`, and [`Append::observe`] has then moved the process at least that far),
    /// and it takes the same places among the keys of the generation the process is in. Moved
    /// on at every retry, retries met the fresh transactions' contention on the keys in use: a
    /// contended Primo run (3 nodes, 8 keys, replicated logs, loss; 2 s in `sim`) committed
    /// 2.0k/s, against 18.0k/s with the keys kept. A
    /// retry that keeps its keys adds no append to them (one attempt of a request commits), so
    /// a key still takes at most the appends drawn for it in its generation.
    fn before_retry(&self, req: &mut TxnRequest, _rng: &mut Rng) {
        let home = req.home;
        let now = self.generation();
        let Some(a) = req.args_mut::<AppendArgs>() else {
            return;
        };
        let drawn_in = a.ops.first().map_or(now, |op| self.generation_of_key(op.key()));
        let first = (now >= drawn_in + self.generations).then(|| self.first_key_in_use());
        for op in &mut a.ops {
            if let Some(first) = first {
                match op {
                    AppendOp::Read(k) | AppendOp::Append(k, _) => *k = first + *k % self.keys,
                }
            }
            if let AppendOp::Append(_, v) = op {
                *v = self.fresh_value(home);
            }
        }
    }

    fn attempted_ops(&self, req: &TxnRequest) -> Vec<HistOp> {
        aborted_ops(req)
    }

    fn final_read(&self) -> Option<TxnRequest> {
        let ops = (0..self.slots()).map(AppendOp::Read).collect();
        Some(TxnRequest::new("read-all", 0, AppendArgs { ops }))
    }
}

/// The history line ops for a request whose attempt aborted: reads unknown, appends as intended.
pub fn aborted_ops(req: &TxnRequest) -> Vec<HistOp> {
    match req.args.downcast_ref::<AppendArgs>() {
        Some(a) => a
            .ops
            .iter()
            .map(|op| match *op {
                AppendOp::Read(k) => HistOp::Read(k, None),
                AppendOp::Append(k, v) => HistOp::Append(k, v),
            })
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{loaded, run_direct};

    fn keys_of(req: &TxnRequest) -> Vec<u64> {
        let key = |op: &AppendOp| match op {
            AppendOp::Append(k, _) | AppendOp::Read(k) => *k,
        };
        req.args::<AppendArgs>().ops.iter().map(key).collect()
    }

    /// A process moves on to its next generation after `APPENDS_PER_KEY` appends per key in
    /// use, and its generations go through every set of slots and round again, each round's
    /// keys fresh: no key takes more than a generation's appends however long the run.
    #[test]
    fn generations_move_on_after_their_appends_and_never_come_round_to_an_old_key() {
        let topo = Topology::new(2, 1, 1);
        let p = WorkloadParams { keys: 8, ops: 4, read_ratio: 0.0, ..Default::default() };
        let a = Append::new(&p, &topo).unwrap();
        assert_eq!(a.slots(), 8 * GENERATIONS);
        let mut rng = crate::util::rng_from_seed(5);
        let mut appends_per_key = std::collections::BTreeMap::<u64, u64>::new();
        let mut slot_sets_seen = std::collections::BTreeSet::new();
        while a.progress.load(Ordering::Relaxed) < 8 * APPENDS_PER_KEY * (3 * GENERATIONS + 1) {
            let keys = keys_of(&a.next(&mut rng, 0));
            let generation = keys[0] / 8;
            assert!(keys.iter().all(|k| k / 8 == generation), "one transaction, one generation: {keys:?}");
            slot_sets_seen.insert(generation % GENERATIONS);
            keys.iter().for_each(|&k| *appends_per_key.entry(k).or_default() += 1);
        }
        assert_eq!(slot_sets_seen.len() as u64, GENERATIONS, "every set of slots in turn");
        assert!(appends_per_key.keys().any(|&k| k >= 3 * a.slots()), "a fourth round began");
        let longest = appends_per_key.values().max().copied().unwrap_or(0);
        // A generation's appends (a transaction's last may run past its share).
        assert!(longest <= APPENDS_PER_KEY * 8 + 4, "a key took {longest} appends");
        let final_read = a.final_read().unwrap();
        assert_eq!(final_read.args::<AppendArgs>().ops.len() as u64, a.slots(), "every slot");
        let mut loaded = 0;
        (0..2).for_each(|part| a.load_partition(part, &mut |_, _| loaded += 1));
        assert_eq!(loaded, a.slots());
    }

    /// Many keys are loaded once: rotation stays within `ROTATED_KEYS_MAX` slots.
    #[test]
    fn many_keys_do_not_rotate_past_the_limit() {
        let topo = Topology::new(1, 1, 1);
        let p = WorkloadParams { keys: 100_000, ops: 4, ..Default::default() };
        assert_eq!(Append::new(&p, &topo).unwrap().slots(), 100_000);
        let p = WorkloadParams { keys: 100, ops: 4, ..Default::default() };
        assert_eq!(Append::new(&p, &topo).unwrap().slots(), 2_000);
    }

    fn append(key: u64, value: u64) -> TxnRequest {
        TxnRequest::new("append-txn", 0, AppendArgs { ops: vec![AppendOp::Append(key, value)] })
    }

    /// An append for a newer round retires the slot's list (a `retire` read of it whole) and
    /// starts the new key's; an append for the retired key aborts `stale-request`, and its
    /// retry goes to the generation the process has reached; a read reads whatever key the
    /// slot holds.
    #[test]
    fn an_append_for_a_newer_round_retires_the_old_key_and_the_old_key_takes_no_more() {
        let topo = Topology::new(1, 1, 1);
        let p = WorkloadParams { keys: 1, ops: 1, ..Default::default() };
        let a = Append::new(&p, &topo).unwrap();
        let store = loaded(&a, &[0]);
        let slots = a.slots();
        let out = |req: &TxnRequest| run_direct(&a, &store, req).map(|o| o.history);
        assert_eq!(out(&append(0, 10)).unwrap(), vec![HistOp::Append(0, 10)]);
        assert_eq!(out(&append(0, 11)).unwrap(), vec![HistOp::Append(0, 11)]);
        let next_round = a.key_of(0, 1);
        assert_eq!(next_round, slots);
        assert_eq!(
            out(&append(next_round, 12)).unwrap(),
            vec![HistOp::Retire(0, vec![10, 11]), HistOp::Append(next_round, 12)]
        );
        let mut stale = append(0, 13);
        assert_eq!(out(&stale).err(), Some(Abort::Stale));
        let read = TxnRequest::new("append-txn", 0, AppendArgs { ops: vec![AppendOp::Read(0)] });
        assert_eq!(out(&read).unwrap(), vec![HistOp::Read(next_round, Some(vec![12]))]);
        // The procedure that met round 1 moved this process on to the generation that wrote it.
        assert_eq!(a.generation(), GENERATIONS);
        a.before_retry(&mut stale, &mut crate::util::rng_from_seed(1));
        assert_eq!(keys_of(&stale), vec![next_round]);
        assert!(matches!(out(&stale).unwrap()[..], [HistOp::Append(k, _)] if k == next_round));
    }

    /// A retry keeps its keys, with fresh values, while the process has not gone a whole round
    /// of its slots since the request was drawn; after that, it takes the same places among the
    /// keys in use.
    #[test]
    fn a_retry_keeps_its_keys_until_the_process_went_round_its_slots() {
        let topo = Topology::new(1, 1, 1);
        let p = WorkloadParams { keys: 8, ops: 4, read_ratio: 0.0, ..Default::default() };
        let a = Append::new(&p, &topo).unwrap();
        let mut rng = crate::util::rng_from_seed(3);
        let mut req = a.next(&mut rng, 0);
        let drawn = keys_of(&req);
        let values = |r: &TxnRequest| format!("{:?}", r.args::<AppendArgs>().ops);
        let before = values(&req);
        a.progress.fetch_add(a.appends_per_generation() * (a.generations - 1), Ordering::Relaxed);
        a.before_retry(&mut req, &mut rng);
        assert_eq!(keys_of(&req), drawn, "a generation short of a round: the same keys");
        assert_ne!(values(&req), before, "fresh values");
        a.progress.fetch_add(a.appends_per_generation(), Ordering::Relaxed);
        a.before_retry(&mut req, &mut rng);
        let moved = keys_of(&req);
        let places = |ks: &[u64]| ks.iter().map(|k| k % 8).collect::<Vec<_>>();
        assert_eq!(places(&moved), places(&drawn), "the same places");
        assert!(moved.iter().all(|&k| k / 8 == a.generation()), "the keys in use: {moved:?}");
    }

    /// A fast process (Silo on one node, 2 keys in use) goes round its slots several times in
    /// a short run: every read, the final one's included, stays within a generation's appends,
    /// and the history checks (every key retired during the run is checked at its retire).
    /// Before keys were retired, each round added to the same lists: reads grew with the run.
    #[test]
    fn a_fast_run_keeps_every_read_within_a_generation_s_appends() {
        let keys = 2;
        let wl = WorkloadParams { name: "append".into(), keys, ops: 4, read_ratio: 0.5, ..Default::default() };
        let mut spec = crate::testkit::protocol_spec("silo", wl, 3);
        spec.duration_us = 100_000;
        let out = crate::testkit::checked_run(&spec);
        let final_read = out.final_read.as_ref().and_then(|r| r.as_ref().ok()).expect("the final read committed");
        let ops = out.history.iter().chain([final_read]).flat_map(|l| &l.ops);
        let (mut longest, mut retires, mut newest_key) = (0, 0, 0);
        for op in ops {
            match op {
                HistOp::Read(k, Some(l)) => (longest, newest_key) = (longest.max(l.len()), newest_key.max(*k)),
                HistOp::Retire(_, l) => (longest, retires) = (longest.max(l.len()), retires + 1),
                HistOp::Append(k, _) | HistOp::Read(k, None) => newest_key = newest_key.max(*k),
            }
        }
        let slots = keys * GENERATIONS;
        assert!(newest_key >= 3 * slots, "the run went round its slots only {} times", newest_key / slots);
        assert!(retires > 0, "no key was retired");
        let bound = (keys * APPENDS_PER_KEY + 4) as usize;
        assert!(longest <= bound, "a read of {longest} values, more than a generation's {bound} appends");
    }
}
