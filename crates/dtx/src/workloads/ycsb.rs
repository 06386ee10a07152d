//! YCSB: one table of `keys` records per partition, transactions of `ops` operations, each a read
//! or a write (read-modify-write, or blind for a fraction `blind_write_ratio`), keys drawn from a Zipf
//! distribution inside a partition. A fraction `distributed` of transactions also touches
//! partitions on other nodes: each of its operations picks a random partition, and at least one
//! is on another node. With `hot_keys` (the Detock thesis's microbenchmark) each partition's
//! first `hot_keys` keys are hot: a transaction's first `hot_ops` operations draw one of them and
//! the others a cold key, uniformly, so that contention is set by the hot set's size.
//!
//! With `multi_home` (the thesis's regions) a partition's home region is its leading copy's: a
//! fraction `multi_home` of transactions touches exactly two home regions, alternating
//! operations between its client's region (whose first is the hot one) and a second region
//! drawn by closeness (the nearest twice as likely as the next, and so on: the thesis's Zipfian
//! weighting, ranked by `--latency-matrix`, else by region number); `distributed` is then the
//! fraction whose operations spread over the partitions of their region (multi-partition).

use super::{remote_partition, Procedures, Workload, WorkloadParams};
use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{decode_args, encode_args, Args, Ctx, KeySet, ProcFuture, RequestError, TxnOutput, TxnRequest};
use crate::util::Rng;
use anyhow::bail;
use rand::Rng as _;

const TABLE: u16 = 0;

pub struct Ycsb {
    p: WorkloadParams,
    topo: Topology,
    zipf: super::zipf::Zipf,
    /// With `multi_home`: each data region's partitions, and the other regions nearest first.
    regions: Vec<HomeRegion>,
}

struct HomeRegion {
    region: u16,
    partitions: Vec<PartitionId>,
    nearest: Vec<u16>,
}

const CLASSES: &[&str] = &["single-node", "distributed"];
const HOME_CLASSES: &[&str] = &["single-home", "multi-home"];

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct YcsbArgs {
    pub ops: Vec<(u64, YcsbOp)>,
}

/// One operation of a YCSB transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum YcsbOp {
    Read,
    /// Read the record, then write it (read-modify-write).
    Update,
    /// Write the record without reading it.
    BlindWrite,
}

impl YcsbOp {
    pub fn writes(self) -> bool {
        self != YcsbOp::Read
    }
}

impl Ycsb {
    pub fn new(p: &WorkloadParams, topo: &Topology) -> anyhow::Result<Self> {
        if p.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if p.ops == 0 || p.ops as u64 > p.keys * topo.partitions() as u64 || p.ops > 1000 {
            bail!("--ops {} must be between 1 and min(1000, total keys)", p.ops);
        }
        if !(0.0..=1.0).contains(&p.read_ratio) {
            bail!("--read-ratio {} must be within 0..1", p.read_ratio);
        }
        if !(0.0..=1.0).contains(&p.distributed) {
            bail!("--distributed {} must be within 0..1", p.distributed);
        }
        if !(0.0..=1.0).contains(&p.read_only_txns) {
            bail!("--read-only-txns {} must be within 0..1", p.read_only_txns);
        }
        if !(0.0..=1.0).contains(&p.blind_write_ratio) {
            bail!("--blind-write-ratio {} must be within 0..1", p.blind_write_ratio);
        }
        if p.value_bytes < 8 || p.value_bytes > 1 << 20 {
            bail!("--value-bytes {} must be between 8 and 1 MiB", p.value_bytes);
        }
        if p.hot_keys > 0 {
            if p.hot_keys >= p.keys {
                bail!("--hot-keys {} must leave cold keys: it must be below --keys {}", p.hot_keys, p.keys);
            }
            if p.hot_ops > p.ops || p.hot_ops as u64 > p.hot_keys {
                bail!("--hot-ops {} must be at most --ops {} and --hot-keys {}", p.hot_ops, p.ops, p.hot_keys);
            }
            if p.theta != 0.0 {
                bail!("--hot-keys draws keys uniformly from a hot and a cold set: drop --theta {}", p.theta);
            }
        }
        let zipf = super::zipf::Zipf::new(p.keys, p.theta)?;
        let regions = match p.multi_home {
            None => Vec::new(),
            Some(f) => home_regions(f, topo)?,
        };
        Ok(Ycsb { p: p.clone(), topo: topo.clone(), zipf, regions })
    }

    fn region(&self, r: u16) -> &HomeRegion {
        self.regions.iter().find(|h| h.region == r).expect("a home region holds data")
    }

    /// A region other than `r`, the nearer the likelier (weights 1, 1/2, 1/3... by rank).
    fn near_region(&self, rng: &mut Rng, r: u16) -> u16 {
        let nearest = &self.region(r).nearest;
        let total: f64 = (1..=nearest.len()).map(|k| 1.0 / k as f64).sum();
        let mut x = rng.gen_range(0.0..total);
        for (k, other) in nearest.iter().enumerate() {
            x -= 1.0 / (k + 1) as f64;
            if x < 0.0 {
                return *other;
            }
        }
        *nearest.last().expect("two regions or more")
    }

    /// The partitions of a transaction's operations by home region (`multi_home`): its
    /// client's region's `home`, and with probability `multi_home` a second region's partition
    /// on every other operation; spread over each region's partitions with probability
    /// `distributed`.
    fn regional_partitions(&self, rng: &mut Rng, home: PartitionId, multi_home: f64) -> Vec<PartitionId> {
        let first = self.topo.home_region(home);
        let second = rng.gen_bool(multi_home).then(|| self.near_region(rng, first));
        let spread = rng.gen_bool(self.p.distributed);
        let second_home = second.map(|r| {
            let parts = &self.region(r).partitions;
            parts[rng.gen_range(0..parts.len())]
        });
        (0..self.p.ops as usize)
            .map(|i| {
                let (region, base) = match second_home {
                    Some(p) if i % 2 == 1 => (self.topo.home_region(p), p),
                    _ => (first, home),
                };
                let parts = &self.region(region).partitions;
                match spread && i >= 2 {
                    true => parts[rng.gen_range(0..parts.len())],
                    false => base,
                }
            })
            .collect()
    }

    /// A key of partition `part` for operation `op` of a transaction.
    fn key_in(&self, rng: &mut Rng, part: PartitionId, op: usize) -> u64 {
        let offset = match self.p.hot_keys {
            0 => self.zipf.sample(rng),
            hot if op < self.p.hot_ops as usize => rng.gen_range(0..hot),
            hot => rng.gen_range(hot..self.p.keys),
        };
        part as u64 * self.p.keys + offset
    }
}

impl Procedures for Ycsb {
    fn encode_args(&self, req: &TxnRequest) -> Vec<u8> {
        encode_args::<YcsbArgs>(req)
    }

    fn decode_args(&self, proc: &'static str, bytes: &[u8]) -> Result<Args, RequestError> {
        decode_args::<YcsbArgs>(proc, bytes)
    }

    fn tables(&self, partitions: &[PartitionId]) -> Vec<TableDef> {
        let dense = partitions.iter().map(|&p| p as u64 * self.p.keys..(p as u64 + 1) * self.p.keys).collect();
        vec![TableDef { name: "usertable", ordered: false, expected_rows: 0, dense, ..Default::default() }]
    }

    fn scans(&self) -> bool {
        false
    }

    fn read_only(&self, req: &TxnRequest) -> bool {
        req.args::<YcsbArgs>().ops.iter().all(|(_, op)| !op.writes())
    }

    fn procedures(&self) -> &'static [&'static str] {
        &["ycsb"]
    }

    fn partition_of(&self, key: RowKey) -> PartitionId {
        (key.key / self.p.keys) as PartitionId
    }

    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value)) {
        let value = Value::from(vec![b'x'; self.p.value_bytes as usize]);
        for i in 0..self.p.keys {
            sink(RowKey::new(TABLE, p as u64 * self.p.keys + i), value.clone());
        }
    }

    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool {
        for &(k, op) in &req.args::<YcsbArgs>().ops {
            match op {
                YcsbOp::Read => keys.read(RowKey::new(TABLE, k)),
                YcsbOp::Update => keys.write(RowKey::new(TABLE, k)),
                YcsbOp::BlindWrite => keys.blind_write(RowKey::new(TABLE, k)),
            }
        }
        true
    }

    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a> {
        Box::pin(async move {
            let args = req.args::<YcsbArgs>();
            for &(k, op) in &args.ops {
                let key = RowKey::new(TABLE, k);
                match op {
                    YcsbOp::Read => drop(ctx.read(key).await?),
                    YcsbOp::Update => {
                        let old = ctx.read_for_update(key).await?.unwrap_or_default();
                        ctx.write(key, bump(&old, self.p.value_bytes as usize)).await?;
                    }
                    YcsbOp::BlindWrite => {
                        ctx.write(key, Value::patched(&[], self.p.value_bytes as usize, |v| v.fill(b'y'))).await?
                    }
                }
            }
            Ok(TxnOutput::default())
        })
    }
}

impl Workload for Ycsb {
    fn name(&self) -> &'static str {
        "ycsb"
    }

    fn txn_classes(&self) -> &'static [&'static str] {
        match self.p.multi_home {
            Some(_) => HOME_CLASSES,
            None => CLASSES,
        }
    }

    /// Distributed when an operation's partition lives on another node than the home's; with
    /// `multi_home`, multi-home when an operation's partition is homed in another region.
    fn txn_class(&self, req: &TxnRequest) -> u8 {
        if self.p.multi_home.is_some() {
            let region = self.topo.home_region(req.home);
            let elsewhere = |ops: &YcsbArgs| {
                ops.ops.iter().any(|(k, _)| self.topo.home_region((k / self.p.keys) as PartitionId) != region)
            };
            return u8::from(req.args.downcast_ref::<YcsbArgs>().is_some_and(elsewhere));
        }
        let home = self.topo.node_of(req.home);
        let remote =
            |ops: &YcsbArgs| ops.ops.iter().any(|(k, _)| self.topo.node_of((k / self.p.keys) as PartitionId) != home);
        u8::from(req.args.downcast_ref::<YcsbArgs>().is_some_and(remote))
    }

    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest {
        let regional = self.p.multi_home.map(|f| self.regional_partitions(rng, home, f));
        let distributed = self.topo.nodes > 1 && rng.gen_bool(self.p.distributed);
        let n = self.p.ops as usize;
        let mut ops: Vec<(u64, YcsbOp)> = Vec::with_capacity(n);
        let forced_remote = rng.gen_range(0..n);
        // No draw without read-only transactions, so that a seed's transactions stay what they were.
        let read_only = self.p.read_only_txns > 0.0 && rng.gen_bool(self.p.read_only_txns);
        for i in 0..n {
            let part = if let Some(parts) = &regional {
                parts[i]
            } else if !distributed {
                home
            } else if i == forced_remote {
                remote_partition(rng, &self.topo, home)
            } else {
                rng.gen_range(0..self.topo.partitions())
            };
            let op = match (read_only || rng.gen_bool(self.p.read_ratio), self.p.blind_write_ratio) {
                (true, _) => YcsbOp::Read,
                // No draw at the ends, so that a seed's transactions stay what they were.
                (false, 0.0) => YcsbOp::Update,
                (false, 1.0) => YcsbOp::BlindWrite,
                (false, blind) if rng.gen_bool(blind) => YcsbOp::BlindWrite,
                (false, _) => YcsbOp::Update,
            };
            // Distinct keys within a transaction, as YCSB-style OLTP benchmarks generate them.
            let mut key = self.key_in(rng, part, i);
            let mut tries = 0;
            while ops.iter().any(|(k, _)| *k == key) && tries < 1000 {
                key = self.key_in(rng, part, i);
                tries += 1;
            }
            ops.push((key, op));
        }
        TxnRequest::new("ycsb", home, YcsbArgs { ops })
    }
}

/// Each data region's partitions and the other regions nearest first, for `multi_home`.
fn home_regions(multi_home: f64, topo: &Topology) -> anyhow::Result<Vec<HomeRegion>> {
    if !(0.0..=1.0).contains(&multi_home) {
        bail!("--multi-home {multi_home} must be within 0..1");
    }
    let regions = topo.data_regions();
    if multi_home > 0.0 && regions.len() < 2 {
        bail!("--multi-home {multi_home} needs data nodes in two regions or more: give --regions");
    }
    let one_way = |a: u16, b: u16| {
        let row = topo.region_delay_us.get(a as usize);
        row.and_then(|r| r.get(b as usize)).copied().unwrap_or((a as i64 - b as i64).unsigned_abs())
    };
    // Closeness is by round trip: with asymmetric paths the nearest by one way may be far back.
    let delay = |a: u16, b: u16| one_way(a, b) + one_way(b, a);
    let homed: Vec<HomeRegion> = regions
        .iter()
        .map(|&r| {
            let mut nearest: Vec<u16> = regions.iter().copied().filter(|o| *o != r).collect();
            nearest.sort_by_key(|o| (delay(r, *o), *o));
            let partitions = (0..topo.partitions()).filter(|p| topo.home_region(*p) == r).collect();
            HomeRegion { region: r, partitions, nearest }
        })
        .collect();
    if let Some(empty) = homed.iter().find(|h| h.partitions.is_empty()) {
        bail!(
            "--multi-home: region {} is home to no partition ({} partitions over {} regions): give more \
             partitions (--nodes) or fewer regions",
            empty.region,
            topo.partitions(),
            regions.len()
        );
    }
    Ok(homed)
}

/// The read-modify-write: increment the counter in the value's first 8 bytes (one copy, into
/// a buffer a replaced value left, as TPC-C's updates do: [`Value::patched`]).
fn bump(old: &[u8], len: usize) -> Value {
    let old = &old[..old.len().min(len.max(8))];
    Value::patched(old, len.max(8), |v| {
        let c = u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8])).wrapping_add(1);
        v[..8].copy_from_slice(&c.to_le_bytes());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributed_fraction_and_key_ranges() {
        let topo = Topology::new(4, 1, 1);
        let p = WorkloadParams { keys: 1000, distributed: 0.2, ..Default::default() };
        let y = Ycsb::new(&p, &topo).unwrap();
        let mut rng = crate::util::rng_from_seed(9);
        let mut dist = 0;
        for _ in 0..5000 {
            let req = y.next(&mut rng, 2);
            let args = req.args::<YcsbArgs>();
            assert_eq!(args.ops.len(), 10);
            let remote = args.ops.iter().any(|(k, _)| topo.node_of(y.partition_of(RowKey::new(0, *k))) != 2);
            dist += remote as u32;
        }
        let frac = dist as f64 / 5000.0;
        assert!((0.17..0.23).contains(&frac), "distributed fraction {frac}");
    }

    /// `--blind-write-ratio`: that fraction of the writes is blind, the rest read-modify-writes;
    /// the reads stay as `--read-ratio` has them, and the ends draw nothing more (a seed's
    /// transactions under 0 are those of before the option existed).
    #[test]
    fn a_fraction_of_the_writes_is_blind() {
        let topo = Topology::new(2, 1, 1);
        let count = |blind: f64| {
            let p = WorkloadParams { keys: 1000, read_ratio: 0.5, blind_write_ratio: blind, ..Default::default() };
            let y = Ycsb::new(&p, &topo).unwrap();
            let mut rng = crate::util::rng_from_seed(3);
            let ops: Vec<YcsbOp> =
                (0..2000).flat_map(|_| y.next(&mut rng, 0).args::<YcsbArgs>().ops.clone()).map(|o| o.1).collect();
            let n = |op| ops.iter().filter(|o| **o == op).count() as f64;
            (n(YcsbOp::Read) / ops.len() as f64, n(YcsbOp::BlindWrite) / (n(YcsbOp::BlindWrite) + n(YcsbOp::Update)))
        };
        for (ratio, reads_near) in [(0.0, 0.5), (0.8, 0.5), (1.0, 0.5)] {
            let (reads, blind) = count(ratio);
            assert!((reads - reads_near).abs() < 0.02, "ratio {ratio}: {reads} reads");
            assert!((blind - ratio).abs() < 0.02, "ratio {ratio}: {blind} of the writes blind");
        }
        let p = WorkloadParams { blind_write_ratio: 1.5, ..Default::default() };
        let e = Ycsb::new(&p, &topo).err().unwrap().to_string();
        assert!(e.contains("--blind-write-ratio 1.5 must be within 0..1"), "{e}");
    }

    /// YCSB++ (`--read-only-txns 0.5 --read-ratio 0 --ops 4`): half the transactions read their
    /// four keys, the other half write all four.
    #[test]
    fn a_fraction_of_the_transactions_only_reads() {
        let topo = Topology::new(2, 1, 1);
        let p = WorkloadParams { keys: 1000, ops: 4, read_ratio: 0.0, read_only_txns: 0.5, ..Default::default() };
        let y = Ycsb::new(&p, &topo).unwrap();
        let mut rng = crate::util::rng_from_seed(5);
        let (mut read_only, n) = (0, 4000);
        for _ in 0..n {
            let ops = y.next(&mut rng, 1).args::<YcsbArgs>().ops.clone();
            let reads = ops.iter().filter(|o| o.1 == YcsbOp::Read).count();
            assert!(reads == 0 || reads == 4, "a transaction mixes: {ops:?}");
            read_only += usize::from(reads == 4);
        }
        assert!((read_only as f64 / n as f64 - 0.5).abs() < 0.03, "{read_only} of {n} read-only");
        let bad = WorkloadParams { read_only_txns: -0.1, ..Default::default() };
        assert!(Ycsb::new(&bad, &topo).err().unwrap().to_string().contains("--read-only-txns -0.1"));
    }

    /// `--hot-keys 100` (the thesis's high contention, HOT = 0.01): the first two operations of
    /// every transaction hit one of the partition's 100 hot keys, the other eight its cold ones.
    #[test]
    fn two_hot_and_eight_cold_keys() {
        let topo = Topology::new(2, 1, 1);
        let p = WorkloadParams { keys: 10_000, hot_keys: 100, distributed: 0.0, ..Default::default() };
        let y = Ycsb::new(&p, &topo).unwrap();
        let mut rng = crate::util::rng_from_seed(4);
        for _ in 0..1000 {
            let ops = y.next(&mut rng, 1).args::<YcsbArgs>().ops.clone();
            let offsets: Vec<u64> = ops.iter().map(|(k, _)| k - 10_000).collect();
            assert!(offsets[..2].iter().all(|o| *o < 100), "{offsets:?}");
            assert!(offsets[2..].iter().all(|o| (100..10_000).contains(o)), "{offsets:?}");
        }
        for (bad, says) in [
            (WorkloadParams { keys: 100, hot_keys: 100, ..Default::default() }, "--hot-keys 100 must leave cold keys"),
            (WorkloadParams { hot_keys: 10, hot_ops: 11, ..Default::default() }, "--hot-ops 11 must be at most"),
            (WorkloadParams { hot_keys: 10, theta: 0.9, ..Default::default() }, "drop --theta 0.9"),
        ] {
            let e = Ycsb::new(&bad, &topo).err().unwrap().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn rejects_bad_parameters() {
        let topo = Topology::new(1, 1, 1);
        for p in [
            WorkloadParams { keys: 0, ..Default::default() },
            WorkloadParams { read_ratio: 1.5, ..Default::default() },
            WorkloadParams { distributed: -0.1, ..Default::default() },
            WorkloadParams { theta: -1.0, ..Default::default() },
            WorkloadParams { keys: 5, ops: 10, ..Default::default() },
        ] {
            assert!(Ycsb::new(&p, &topo).is_err(), "{p:?} accepted");
        }
    }

    /// The thesis's regions: two of four regions, nearest likeliest, every other operation in
    /// the second, and the class says which.
    #[test]
    fn multi_home_transactions_touch_two_regions_the_nearest_likeliest() {
        let mut topo = Topology::new(4, 1, 2);
        topo.node_region = vec![0, 1, 2, 3];
        topo.region_delay_us = vec![vec![0, 10, 20, 30], vec![10, 0, 5, 40], vec![20, 5, 0, 50], vec![30, 40, 50, 0]];
        let p = WorkloadParams { keys: 1000, multi_home: Some(0.5), distributed: 0.0, ..Default::default() };
        let wl = Ycsb::new(&p, &topo).expect("builds");
        let mut rng = crate::util::rng_from_seed(1);
        let (mut multi, mut second) = (0, [0u32; 4]);
        for _ in 0..4000 {
            let req = wl.next(&mut rng, 0);
            let regions: std::collections::BTreeSet<u16> =
                req.args::<YcsbArgs>().ops.iter().map(|(k, _)| topo.home_region((k / 1000) as u32)).collect();
            assert!(regions.contains(&0) && regions.len() <= 2, "{regions:?}");
            assert_eq!(wl.txn_class(&req), u8::from(regions.len() == 2));
            if let Some(r) = regions.iter().find(|r| **r != 0) {
                multi += 1;
                second[*r as usize] += 1;
            }
        }
        assert!((1800..2200).contains(&multi), "{multi} of 4000 multi-home");
        assert!(second[1] > second[2] && second[2] > second[3], "nearest likeliest: {second:?}");
        let one = WorkloadParams { multi_home: Some(0.1), ..p };
        let err = Ycsb::new(&one, &Topology::new(2, 1, 1)).err().expect("one region refuses").to_string();
        assert!(err.contains("needs data nodes in two regions"), "{err}");
    }
}
