//! A test-only protocol that keeps several logs per node (registered only in test builds as
//! `multilog:logs=N`), to check what the runtimes do with a protocol's logs end to end.

use crate::net::Addr;
use crate::protocols::{Attempt, OptionKind, OptionSpec, ProtocolInfo, WorkerProtocol};
use crate::rt::Worker;
use crate::storage::{RowKey, Storage, Value};
use crate::testkit::{now, Direct};
use crate::txn::{Abort, Ctx, TxnRequest, TxnResult};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

pub const INFO: ProtocolInfo = ProtocolInfo {
    name: "multilog",
    status: "test",
    guarantee: super::Guarantee::StrictSerializable,
    description: "test only: one node, serial, several logs",
    options: &[OptionSpec {
        name: "logs",
        kind: OptionKind::U64 { min: 1, max: 16 },
        default: "3",
        help: "logs per node",
    }],
    aborts: &[],
    make: |o| Arc::new(MultiLog { logs: o.u64("logs") as u16 }),
};

/// A one-node, one-worker protocol that keeps several logs, to test what the runtimes do with
/// them (open each, give each its simulated disk, keep what each flushed at a crash, hand them
/// all back at recovery). It runs each transaction serially against storage, logs it as
/// `(boot, seq, writes)` in log `seq % logs`, and acknowledges it once every log is durable up
/// to where it was appended, so an acknowledged transaction's predecessors are durable too.
/// Recovery applies, boot by boot, the unbroken run of sequence numbers from 1: a record after
/// a gap was never acknowledged, and nothing acknowledged read it.
pub struct MultiLog {
    pub logs: u16,
}

type MultiRecord = (u32, u64, Vec<(RowKey, Option<Value>)>);

impl crate::protocols::Protocol for MultiLog {
    fn build_node(&self, env: crate::protocols::NodeEnv) -> Arc<dyn crate::protocols::NodeProtocol> {
        assert_eq!(env.topo.nodes, 1, "MultiLog runs one node");
        let store: Storage<()> = crate::protocols::load_storage(&env);
        let mut all: Vec<MultiRecord> = Vec::new();
        let recovered = std::iter::once(&env.recovered).chain(env.more_logs.iter().map(|l| &l.records));
        for bytes in recovered.flatten() {
            all.push(crate::net::decode(bytes).expect("a MultiLog record"));
        }
        all.sort_by_key(|r| (r.0, r.1));
        let boot = all.last().map_or(0, |r| r.0 + 1);
        let mut expected = (u32::MAX, 0);
        for (b, seq, writes) in all {
            if b != expected.0 {
                expected = (b, 1);
            }
            if seq == expected.1 {
                for (k, v) in writes {
                    store.get_or_create(k).lock().value = v;
                }
                expected.1 += 1;
            }
        }
        let logs: Vec<Arc<crate::rt::log::NodeLog>> =
            env.log.iter().cloned().chain(env.more_logs.iter().map(|l| l.log.clone())).collect();
        Arc::new(MultiNode(Arc::new(MultiState { store, env, logs, boot, next_seq: Cell::new(1).into() })))
    }

    fn logs(&self, _topo: &crate::cluster::Topology) -> u16 {
        self.logs
    }
}

struct MultiState {
    store: Storage<()>,
    env: crate::protocols::NodeEnv,
    logs: Vec<Arc<crate::rt::log::NodeLog>>,
    boot: u32,
    /// One worker: only it takes sequence numbers.
    next_seq: parking_lot::Mutex<Cell<u64>>,
}

struct MultiNode(Arc<MultiState>);

impl crate::protocols::NodeProtocol for MultiNode {
    fn worker(&self, w: Rc<Worker>) -> Rc<dyn WorkerProtocol> {
        Rc::new(MultiWorker { w, s: self.0.clone() })
    }
}

struct MultiWorker {
    w: Rc<Worker>,
    s: Arc<MultiState>,
}

impl crate::rt::Handler for MultiWorker {
    fn on_request(&self, _from: Addr, _rpc_id: u64, _body: &[u8]) {}
    fn on_oneway(&self, _from: Addr, _body: &[u8]) {}
}

impl WorkerProtocol for MultiWorker {
    fn execute<'a>(
        &'a self,
        req: &'a TxnRequest,
        _attempt: Attempt,
    ) -> crate::rt::LocalBoxFuture<'a, TxnResult<crate::txn::TxnOutput>> {
        Box::pin(async move {
            self.w.charge(self.w.cost.txn_ns);
            let mut run = Direct::new(&self.s.store);
            let out = now(self.s.env.workload.run(req, &mut Ctx::new(&mut run)))?;
            let seq = {
                let c = self.s.next_seq.lock();
                let seq = c.get();
                c.set(seq + 1);
                seq
            };
            let logs = &self.s.logs;
            let record: MultiRecord = (self.s.boot, seq, run.writes.clone());
            let log = &logs[(seq % logs.len() as u64) as usize];
            log.append(&crate::net::encode(&record)).map_err(|_| Abort::LogRefused)?;
            // Installed before it is durable: serial execution, and acknowledged only after.
            run.commit();
            let tails: Vec<u64> = logs.iter().map(|l| l.appended_lsn()).collect();
            for (l, tail) in logs.iter().zip(tails) {
                l.wait(tail).await;
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::bench;
    use crate::host::{self, BenchSpec};
    use crate::replication::Durability;
    use crate::workloads::WorkloadParams;

    fn spec(runtime: crate::host::Runtime, seed: u64) -> BenchSpec {
        let wl = WorkloadParams { name: "append".into(), keys: 16, ops: 4, read_ratio: 0.5, ..Default::default() };
        let mut s = BenchSpec::new("multilog:logs=3", wl, runtime);
        s.nodes = 1;
        s.workers = 1;
        s.inflight = 8;
        s.duration_us = 400_000;
        s.warmup_us = 0;
        s.seed = seed;
        s.durability.mode = Durability::Wal;
        s
    }

    #[test]
    fn crashes_keep_what_each_log_flushed_and_lose_nothing_acknowledged() {
        for seed in 1..=6 {
            let s = spec(crate::host::Runtime::Sim, seed).with_faults(true, false, 0.0);
            let out = host::run_sim(&s).expect("the simulation runs");
            assert!(out.restarts > 0, "seed {seed}: no crash lost memory");
            assert!(out.totals.committed > 50, "seed {seed}: {} committed", out.totals.committed);
            let path = std::env::temp_dir().join(format!("dtx-multilog-{}-{seed}.jsonl", std::process::id()));
            let (report, problem) =
                bench::verify(&out, &path, crate::protocols::guarantee_of(&s.protocol)).expect("the history checks");
            assert!(
                problem.is_none(),
                "seed {seed}: {problem:?} {:?} (history {})",
                report.anomalies.first(),
                path.display()
            );
            let _ = std::fs::remove_file(&path);
        }
    }

    #[test]
    fn each_log_is_a_write_ahead_log_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(crate::host::Runtime::Local, 1);
        s.durability.data_dir = Some(dir.path().to_path_buf());
        let out = host::run_local(&s).expect("the run");
        assert!(out.totals.committed > 0);
        for name in ["node-0", "node-0-log-1", "node-0-log-2"] {
            let cluster = dir.path().join(format!("{:016x}", s.durability.cluster_id));
            let bytes: u64 = std::fs::read_dir(cluster.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("wal-"))
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum();
            assert!(bytes > 36, "{name} holds records ({bytes} bytes)");
        }
    }
}
