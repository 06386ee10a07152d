//! List-append (Elle's workload): a small key space, each key a list of integers; transactions
//! of reads (the whole list) and appends (a value unique to that key across the run). The
//! history of such a run lets the checker infer each key's version order from the reads
//! themselves and prove the run serializable, or name the anomaly.
//!
//! Keys rotate, as Elle's generator retires a key after a few writes: `--keys` is how many
//! keys are in use at a time, and once a process has made [`APPENDS_PER_KEY`] appends per key
//! it moves on to the next `--keys` fresh keys (one of up to [`GENERATIONS`] such sets, then
//! round again), and the final read reads every loaded key. Without it a read returns every
//! append the key ever took: a one-second tcp run of 100,000 appends over 32 keys wrote a 3 GB
//! history, its reads 3,000 values long, and a server that built its reply grew to 16 GB and
//! was killed.

use super::{Procedures, Workload, WorkloadParams};
use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{
    decode_args, encode_args, Args, Ctx, HistOp, KeySet, ProcFuture, RequestError, TxnOutput, TxnRequest,
};
use crate::util::Rng;
use anyhow::bail;
use rand::Rng as _;
use std::sync::atomic::{AtomicU64, Ordering};

const TABLE: u16 = 0;

/// Appends a process makes per key in use before it moves on to fresh keys.
pub const APPENDS_PER_KEY: u64 = 64;
/// Sets of keys a run goes through before it comes round to the first again (fewer when
/// `--keys` is large: the loaded keys stay within [`ROTATED_KEYS_MAX`]).
pub const GENERATIONS: u64 = 64;
/// The most keys rotation loads (`--keys` times the generations), all of which the final read
/// reads: a read-all transaction of 6,144 keys never committed interactively under COCO's
/// epochs in `sim` (3,072 did), and reading fewer would miss the keys a run before a restart,
/// or another process, appended to.
pub const ROTATED_KEYS_MAX: u64 = 2_048;

pub struct Append {
    /// Keys in use at a time.
    keys: u64,
    /// Sets of `keys` keys the run rotates through: the loaded keys are `keys * generations`.
    generations: u64,
    max_ops: u32,
    read_ratio: f64,
    partitions: u32,
    /// Unique append values: the home partition in the high bits, a counter below, starting
    /// in the process's own range (a node taken over by another process appends from there).
    counter: AtomicU64,
    /// The counter's first value: the appends this process made are counted from it.
    counter_start: u64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum AppendOp {
    Read(u64),
    Append(u64, u64),
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AppendArgs {
    pub ops: Vec<AppendOp>,
}

pub fn decode_list(v: &[u8]) -> Vec<u64> {
    v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

fn encode_list(list: &[u64]) -> Value {
    let mut out = Vec::with_capacity(list.len() * 8);
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
        let counter_start = ((p.process as u64) << 28) | 1;
        Ok(Append {
            keys: p.keys,
            generations: (ROTATED_KEYS_MAX / p.keys).clamp(1, GENERATIONS),
            max_ops: p.ops,
            read_ratio: p.read_ratio,
            partitions: topo.partitions(),
            counter: AtomicU64::new(counter_start),
            counter_start,
        })
    }

    /// Every key the run may touch (the loaded rows, and what the final read reads).
    fn all_keys(&self) -> u64 {
        self.keys * self.generations
    }

    /// The first of the keys in use now, by the appends this process has made.
    fn first_key_in_use(&self) -> u64 {
        let appends = self.counter.load(Ordering::Relaxed) - self.counter_start;
        (appends / (self.keys * APPENDS_PER_KEY)) % self.generations * self.keys
    }

    fn fresh_value(&self, home: PartitionId) -> u64 {
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
            expected_rows: self.all_keys() as usize,
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
        for k in (0..self.all_keys()).filter(|k| k % self.partitions as u64 == p as u64) {
            sink(RowKey::new(TABLE, k), Value::default());
        }
    }

    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool {
        for op in &req.args::<AppendArgs>().ops {
            match op {
                AppendOp::Read(k) => keys.read(RowKey::new(TABLE, *k)),
                AppendOp::Append(k, _) => keys.write(RowKey::new(TABLE, *k)),
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
                        let v = ctx.read(RowKey::new(TABLE, k)).await?;
                        history.push(HistOp::Read(k, Some(v.as_deref().map(decode_list).unwrap_or_default())));
                    }
                    AppendOp::Append(k, val) => {
                        let key = RowKey::new(TABLE, k);
                        let mut list = ctx.read_for_update(key).await?.as_deref().map(decode_list).unwrap_or_default();
                        list.push(val);
                        ctx.write(key, encode_list(&list)).await?;
                        history.push(HistOp::Append(k, val));
                    }
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

    fn before_retry(&self, req: &mut TxnRequest, _rng: &mut Rng) {
        let home = req.home;
        if let Some(a) = req.args_mut::<AppendArgs>() {
            for op in &mut a.ops {
                if let AppendOp::Append(_, v) = op {
                    *v = self.fresh_value(home);
                }
            }
        }
    }

    fn attempted_ops(&self, req: &TxnRequest) -> Vec<HistOp> {
        aborted_ops(req)
    }

    fn final_read(&self) -> Option<TxnRequest> {
        let ops = (0..self.all_keys()).map(AppendOp::Read).collect();
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

    /// A process moves on to fresh keys after `APPENDS_PER_KEY` appends per key in use, and
    /// comes round to the first after `GENERATIONS` sets, so a key's list stays short however
    /// long the run; the loaded keys and the final read cover every set.
    #[test]
    fn keys_rotate_after_their_appends_and_come_round() {
        let topo = Topology::new(2, 1, 1);
        let p = WorkloadParams { keys: 8, ops: 4, read_ratio: 0.0, ..Default::default() };
        let a = Append::new(&p, &topo).unwrap();
        assert_eq!(a.all_keys(), 8 * GENERATIONS);
        let mut rng = crate::util::rng_from_seed(5);
        let mut appends_per_key = vec![0u64; a.all_keys() as usize];
        let mut sets_seen = std::collections::BTreeSet::new();
        while a.counter.load(Ordering::Relaxed) - a.counter_start < 8 * APPENDS_PER_KEY * (GENERATIONS + 1) {
            let req = a.next(&mut rng, 0);
            let keys: Vec<u64> = req
                .args::<AppendArgs>()
                .ops
                .iter()
                .map(|op| match op {
                    AppendOp::Append(k, _) | AppendOp::Read(k) => *k,
                })
                .collect();
            let set = keys[0] / 8;
            assert!(keys.iter().all(|k| k / 8 == set), "one transaction, one set of keys: {keys:?}");
            sets_seen.insert(set);
            keys.iter().for_each(|&k| appends_per_key[k as usize] += 1);
        }
        assert_eq!(sets_seen.len() as u64, GENERATIONS, "every set in turn");
        let longest = appends_per_key.iter().max().copied().unwrap_or(0);
        // Round twice through the first set only; the others once (a transaction's last
        // appends may run past its set's share).
        assert!(longest <= 2 * (APPENDS_PER_KEY * 8 + 4), "a key took {longest} appends");
        let final_read = a.final_read().unwrap();
        assert_eq!(final_read.args::<AppendArgs>().ops.len() as u64, a.all_keys(), "round once: every key");
        let mut loaded = 0;
        (0..2).for_each(|part| a.load_partition(part, &mut |_, _| loaded += 1));
        assert_eq!(loaded, a.all_keys());
    }

    /// Many keys are loaded once: rotation stays within `ROTATED_KEYS_MAX` keys.
    #[test]
    fn many_keys_do_not_rotate_past_the_limit() {
        let topo = Topology::new(1, 1, 1);
        let p = WorkloadParams { keys: 100_000, ops: 4, ..Default::default() };
        assert_eq!(Append::new(&p, &topo).unwrap().all_keys(), 100_000);
        let p = WorkloadParams { keys: 100, ops: 4, ..Default::default() };
        assert_eq!(Append::new(&p, &topo).unwrap().all_keys(), 2_000);
    }
}
