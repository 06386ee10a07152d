//! Workloads: schema, population, transaction generation and the stored procedures themselves.
//! Every protocol runs the same procedures through [`crate::txn::Ctx`].

pub mod append;
pub mod bank;
pub mod tpcc;
pub mod ycsb;
pub mod zipf;

use crate::cluster::{PartitionId, Topology};
pub use crate::txn::Procedures;
use crate::txn::{TxnOutput, TxnRequest};
use crate::util::Rng;
use std::sync::Arc;

/// A workload: its procedures and data ([`Procedures`], what the nodes run), and what the
/// bench does with it above the protocols: generate transactions, refresh them for a retry,
/// and check the run's invariants.
pub trait Workload: Procedures {
    fn name(&self) -> &'static str;
    /// The next transaction a client homed at partition `home` issues.
    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest;
    /// Called before a retry: workloads whose values must be unique per attempt (list-append)
    /// refresh them here.
    fn before_retry(&self, _req: &mut TxnRequest, _rng: &mut Rng) {}
    /// A read-only transaction over the whole key space, run once after the measured period
    /// (list-append ends with one, so the checker can see every acknowledged append).
    fn final_read(&self) -> Option<TxnRequest> {
        None
    }
    /// The history operations an attempt of `req` performs as far as the request says, for the
    /// history line of an attempt that aborted or whose outcome is unknown (list-append: its
    /// appends, and its reads without values). Empty for workloads without a history.
    fn attempted_ops(&self, _req: &TxnRequest) -> Vec<crate::txn::HistOp> {
        Vec::new()
    }
    /// What kind of transaction a request is, for per-kind commit counts (TPC-C reports
    /// New-Order throughput beside the total). Every workload's procedure names are distinct.
    fn txn_kind(&self, req: &TxnRequest) -> &'static str {
        req.proc
    }
    /// The classes of transaction whose latency the run reports apart (TPC-C: its five
    /// transactions; YCSB: single-node and distributed), named for `latency_us_by_class`;
    /// empty when the workload reports none.
    fn txn_classes(&self) -> &'static [&'static str] {
        &[]
    }
    /// The class of a request: its index in [`Workload::txn_classes`]. Called once per
    /// committed transaction, so it must be cheap.
    fn txn_class(&self, _req: &TxnRequest) -> u8 {
        0
    }
    /// Read-only requests that check the workload's invariants after the measured period (TPC-C:
    /// consistency conditions 1-4 per warehouse; bank: a final audit of the total). Run each on
    /// node 0, in order, until it commits, then pass it to [`Workload::check_output`].
    fn final_checks(&self) -> Vec<TxnRequest> {
        Vec::new()
    }
    /// The findings of a committed check request from [`Workload::final_checks`]:
    /// `(condition, passed, detail)`. TPC-C gives a warehouse's verdicts with its last request.
    fn check_output(&self, _req: &TxnRequest, _out: &TxnOutput) -> Vec<(String, bool, String)> {
        Vec::new()
    }
    /// Called by the driver after a request committed (not after an aborted attempt). The bank
    /// workload records the total its read-only audits saw only then: an attempt that fails
    /// validation may have seen an inconsistent state, and only the driver knows which one did.
    fn on_commit(&self, _req: &TxnRequest, _out: &TxnOutput) {}
    /// Does [`Workload::on_commit`] read what it is given? A commit whose acknowledgement waits
    /// (group commit) then keeps its request and output until then; otherwise they are dropped
    /// at once, while still in cache, rather than thousands of commits later.
    fn watches_commits(&self) -> bool {
        false
    }
    /// What this process recorded during the run that must be checked (bank: the totals its
    /// audits saw), drained once after the run on every node's process: `(condition, passed, detail)`.
    fn process_findings(&self) -> Vec<(String, bool, String)> {
        Vec::new()
    }
}

/// Workload parameters from the command line, for every workload.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct WorkloadParams {
    pub name: String,
    /// YCSB: keys per partition. list-append: keys in use at a time, in total (they rotate).
    pub keys: u64,
    pub theta: f64,
    pub ops: u32,
    pub read_ratio: f64,
    /// YCSB: the fraction of writes that are blind (written without reading the record); the
    /// others read it first (read-modify-write). Primo's blind-write sweep varies it.
    pub blind_write_ratio: f64,
    /// YCSB: the fraction of transactions that only read (every operation a read); the others
    /// follow `read_ratio`. Rolis's YCSB++ is `--read-only-txns 0.5 --read-ratio 0 --ops 4`.
    pub read_only_txns: f64,
    /// Fraction of transactions that touch another node.
    pub distributed: f64,
    /// YCSB: the first `hot_keys` keys of each partition are its hot set, the rest its cold set,
    /// and a transaction's first `hot_ops` operations draw from the hot set, the others from the
    /// cold one, uniformly (the Detock thesis's microbenchmark: 2 hot + 8 cold). 0: off (Zipf).
    #[serde(default)]
    pub hot_keys: u64,
    /// YCSB: operations per transaction on hot keys, when `hot_keys` is set.
    #[serde(default = "two")]
    pub hot_ops: u32,
    /// YCSB by home regions (the Detock thesis's microbenchmark): this fraction of transactions
    /// touches exactly two home regions, its client's and another chosen by closeness; the
    /// others stay in their client's; `distributed` is then the fraction that touches several
    /// partitions of a region. `None`: partitions as `distributed` alone says.
    #[serde(default)]
    pub multi_home: Option<f64>,
    pub value_bytes: u32,
    /// TPC-C: warehouses in total, spread over all partitions (warehouse w in partition
    /// (w-1) % partitions).
    pub warehouses: u32,
    /// TPC-C: `standard` (45/43/4/4/4), `neworder-payment` (50/50), or five percentages
    /// `NO,P,OS,D,SL` that sum to 100.
    pub mix: String,
    /// TPC-C: fraction of New-Orders with a remote supply warehouse.
    pub neworder_remote: f64,
    /// TPC-C: fraction of Payments for a customer of another warehouse.
    pub payment_remote: f64,
    /// TPC-C: a copy of ITEM in every partition (else each item lives in one partition).
    pub item_replicated: bool,
    /// TPC-C: where a remote warehouse is chosen from: any other warehouse (`false`, the
    /// spec), or only warehouses whose home region is not the home warehouse's (`true`, the
    /// Detock thesis's TPC-C: a remote transaction is multi-home).
    #[serde(default)]
    pub remote_in_other_region: bool,
    /// TPC-C: fraction of Payments and Order-Statuses that find their customer by last name
    /// (the spec's 60%); the Detock thesis selects by id only (0), having no dependent reads.
    #[serde(default = "spec_by_last_name")]
    pub by_last_name: f64,
    /// Bank: accounts in total (0 = 1000 per partition).
    pub accounts: u64,
    /// Bank: fraction of transactions that are read-only audits of the total balance.
    pub audit_ratio: f64,
    /// Which process of the run generates with this instance (a `dtx server`'s node id; 0 in
    /// one process): values that must be unique (appended values, TPC-C history keys) come from
    /// per-process ranges, since a node taken over by another server goes on generating there.
    #[serde(default)]
    pub process: u16,
}

fn two() -> u32 {
    2
}

fn spec_by_last_name() -> f64 {
    0.6
}

impl Default for WorkloadParams {
    fn default() -> Self {
        WorkloadParams {
            name: "ycsb".into(),
            keys: 200_000,
            theta: 0.0,
            ops: 10,
            read_ratio: 0.8,
            blind_write_ratio: 0.0,
            read_only_txns: 0.0,
            distributed: 0.1,
            hot_keys: 0,
            hot_ops: 2,
            multi_home: None,
            value_bytes: 100,
            warehouses: 1,
            mix: "standard".into(),
            neworder_remote: 0.1,
            payment_remote: 0.15,
            item_replicated: true,
            remote_in_other_region: false,
            by_last_name: 0.6,
            accounts: 0,
            audit_ratio: 0.05,
            process: 0,
        }
    }
}

pub const WORKLOADS: &[&str] = &["ycsb", "append", "tpcc", "bank"];

pub fn build(params: &WorkloadParams, topo: &Topology) -> anyhow::Result<Arc<dyn Workload>> {
    match params.name.as_str() {
        "ycsb" => Ok(Arc::new(ycsb::Ycsb::new(params, topo)?)),
        "append" => Ok(Arc::new(append::Append::new(params, topo)?)),
        "tpcc" => Ok(Arc::new(tpcc::Tpcc::new(params, topo)?)),
        "bank" => Ok(Arc::new(bank::Bank::new(params, topo)?)),
        other => anyhow::bail!("unknown workload `{other}` (known: {})", WORKLOADS.join(", ")),
    }
}

/// Pick a partition on another node than `home`'s (or `home` when every partition is on its
/// node: one node, or one data node among replica-only hosts, as Silo's and Rolis's).
pub fn remote_partition(rng: &mut Rng, topo: &Topology, home: PartitionId) -> PartitionId {
    use rand::Rng as _;
    if topo.data_nodes().len() <= 1 {
        return home;
    }
    let home_node = topo.node_of(home);
    loop {
        let p = rng.gen_range(0..topo.partitions());
        if topo.node_of(p) != home_node {
            return p;
        }
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;
    use crate::txn::{KeySet, RequestError};

    fn every_workload() -> Vec<Arc<dyn Workload>> {
        let topo = Topology::new(2, 1, 2);
        let mut out = Vec::new();
        for name in WORKLOADS {
            let p = WorkloadParams { name: name.to_string(), keys: 1000, warehouses: 4, ..Default::default() };
            out.push(build(&p, &topo).expect("the workload builds"));
        }
        out
    }

    fn keys_of(wl: &dyn Workload, req: &TxnRequest) -> (bool, KeySet) {
        let mut keys = KeySet::default();
        let declared = wl.declare(req, &mut keys);
        (declared, keys)
    }

    #[test]
    fn every_request_survives_encoding_and_declares_the_same_keys() {
        for wl in every_workload() {
            let mut rng = crate::util::rng_from_seed(7);
            let mut reqs: Vec<TxnRequest> = (0..300).map(|i| wl.next(&mut rng, i % 4)).collect();
            reqs.extend(wl.final_read());
            reqs.extend(wl.final_checks());
            for req in &reqs {
                let bytes = wl.encode_request(req);
                let back = wl.decode_request(&bytes).unwrap_or_else(|e| panic!("{}: {}: {e}", wl.name(), req.proc));
                assert_eq!((back.proc, back.home), (req.proc, req.home), "{}", wl.name());
                assert_eq!(keys_of(&*wl, &back), keys_of(&*wl, req), "{}: {} declares other keys", wl.name(), req.proc);
                assert_eq!(wl.encode_request(&back), bytes, "{}: {} encodes the same again", wl.name(), req.proc);
            }
        }
    }

    #[test]
    fn garbage_is_an_error_naming_what_is_wrong() {
        for wl in every_workload() {
            assert_eq!(wl.decode_request(&[1, 0]).err(), Some(RequestError::Truncated(2)));
            let unknown = wl.decode_request(&[200, 0, 0, 0, 0, 0]).map(|_| ()).expect_err("an unknown id");
            assert!(unknown.to_string().contains("procedure id 200"), "{unknown}");
            // Every prefix of a real request and random bytes after a valid header: an error or a
            // request, never a panic.
            let req = wl.next(&mut crate::util::rng_from_seed(3), 0);
            let bytes = wl.encode_request(&req);
            for cut in 0..bytes.len() {
                let _ = wl.decode_request(&bytes[..cut]);
            }
            let mut noise = bytes[..6].to_vec();
            noise.extend((0..64u8).map(|i| i.wrapping_mul(37)));
            let _ = wl.decode_request(&noise);
        }
    }

    #[test]
    fn a_retry_does_not_change_a_request_a_protocol_kept() {
        let p = WorkloadParams { name: "append".into(), keys: 8, ..Default::default() };
        let wl = build(&p, &Topology::new(1, 1, 1)).unwrap();
        let mut rng = crate::util::rng_from_seed(1);
        let mut req = wl.next(&mut rng, 0);
        let kept = req.clone();
        wl.before_retry(&mut req, &mut rng);
        assert_ne!(wl.encode_request(&req), wl.encode_request(&kept), "the retry appends fresh values");
        assert_eq!(kept.args::<append::AppendArgs>().ops.len(), req.args::<append::AppendArgs>().ops.len());
    }
}
