//! Workloads: schema, population, transaction generation and the stored procedures themselves.
//! Every protocol runs the same procedures through [`crate::txn::Ctx`].

pub mod append;
pub mod bank;
pub mod tpcc;
pub mod ycsb;
pub mod zipf;

use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{Ctx, KeySet, ProcFuture, TxnOutput, TxnRequest};
use crate::util::Rng;
use std::sync::Arc;

pub trait Workload: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// The tables as the node holding `partitions` needs them.
    fn tables(&self, partitions: &[PartitionId]) -> Vec<TableDef>;
    /// The registered stored procedures, by name.
    fn procedures(&self) -> &'static [&'static str];
    /// Which partition a key lives in.
    fn partition_of(&self, key: RowKey) -> PartitionId;
    /// Populate one partition.
    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value));
    /// The next transaction a client homed at partition `home` issues.
    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest;
    /// Called before a retry: workloads whose values must be unique per attempt (list-append)
    /// refresh them here.
    fn before_retry(&self, _req: &mut TxnRequest, _rng: &mut Rng) {}
    /// Declare the read and write sets; false when some keys depend on what is read (OLLP).
    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool;
    /// Run the procedure the request names.
    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a>;
    /// A read-only transaction over the whole key space, run once after the measured period
    /// (list-append ends with one, so the checker can see every acknowledged append).
    fn final_read(&self) -> Option<TxnRequest> {
        None
    }
    /// What kind of transaction a request is, for per-kind commit counts (TPC-C reports
    /// New-Order throughput beside the total). Every workload's procedure names are distinct.
    fn txn_kind(&self, req: &TxnRequest) -> &'static str {
        req.proc
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
    /// YCSB: keys per partition. list-append: keys in total.
    pub keys: u64,
    pub theta: f64,
    pub ops: u32,
    pub read_ratio: f64,
    /// YCSB writes read the record first (read-modify-write) rather than writing blind.
    pub rmw: bool,
    /// Fraction of transactions that touch another node.
    pub distributed: f64,
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

impl Default for WorkloadParams {
    fn default() -> Self {
        WorkloadParams {
            name: "ycsb".into(),
            keys: 200_000,
            theta: 0.0,
            ops: 10,
            read_ratio: 0.8,
            rmw: true,
            distributed: 0.1,
            value_bytes: 100,
            warehouses: 1,
            mix: "standard".into(),
            neworder_remote: 0.1,
            payment_remote: 0.15,
            item_replicated: true,
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

/// Pick a partition on another node than `home`'s (or `home` when there is only one node).
pub fn remote_partition(rng: &mut Rng, topo: &Topology, home: PartitionId) -> PartitionId {
    use rand::Rng as _;
    if topo.nodes <= 1 {
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
