//! Workloads: schema, population, transaction generation and the stored procedures themselves.
//! Every protocol runs the same procedures through [`crate::txn::Ctx`].

pub mod append;
pub mod ycsb;
pub mod zipf;

use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{Ctx, KeySet, ProcFuture, TxnRequest};
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
}

/// Workload parameters from the command line, for every workload.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
        }
    }
}

pub const WORKLOADS: &[&str] = &["ycsb", "append"];

pub fn build(params: &WorkloadParams, topo: &Topology) -> anyhow::Result<Arc<dyn Workload>> {
    match params.name.as_str() {
        "ycsb" => Ok(Arc::new(ycsb::Ycsb::new(params, topo)?)),
        "append" => Ok(Arc::new(append::Append::new(params, topo)?)),
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
