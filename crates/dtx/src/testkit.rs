//! The test kit every workload's and protocol's unit tests share (test builds only):
//! - direct runs: a procedure run straight against one storage, no concurrency control, the way
//!   a one-shot protocol runs it (declared keys, or reconnaissance first), to test workloads;
//! - simulated runs: any protocol on any workload in the simulator with closed-loop clients
//!   (the driver's loop, with its `on_commit` and `before_retry` calls), then the workload's
//!   `final_checks` executed on node 0's first worker, each until it commits, with
//!   `check_output` called after each, then `process_findings`. One workload instance serves
//!   every node, as in the bench runtimes.
//!
//! Built also with the `test-protocols` feature, for the test-only protocols' direct runs;
//! the rest is then unused.
#![cfg_attr(not(test), allow(dead_code))]

use crate::cluster::PartitionId;
use crate::host::BenchSpec;
use crate::net::Addr;
use crate::protocols::{Attempt, NodeEnv, WorkerProtocol};
use crate::rt::{sim::SimWorld, Worker};
use crate::storage::{RowKey, Storage, Value};
use crate::txn::Abort;
use crate::txn::{Access, Ctx, KeySet, Scan, Step, TxnOutput, TxnRequest, TxnResult};
use crate::workloads::Workload;
use rand::Rng as _;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct SimRun {
    /// Commits per transaction kind.
    pub committed: BTreeMap<&'static str, u64>,
    pub user_aborts: u64,
    pub aborts: u64,
    /// (node that ran the check, condition, passed, detail).
    pub checks: Vec<(u16, String, bool, String)>,
    pub notes: Vec<String>,
}

impl SimRun {
    /// Panic with every failed check, if any.
    pub fn assert_checks_pass(&self, what: &str) {
        let failed: Vec<_> = self.checks.iter().filter(|c| !c.2).collect();
        assert!(failed.is_empty(), "{what}: failed checks {failed:#?}");
        assert!(self.notes.is_empty(), "{what}: {:?}", self.notes);
    }
}

#[allow(clippy::too_many_arguments)]
fn client(
    w: Rc<Worker>,
    proto: Rc<dyn WorkerProtocol>,
    wl: Arc<dyn Workload>,
    home: u32,
    end_ns: u64,
    max_retries: u32,
    stats: Rc<RefCell<SimRun>>,
    live: Rc<Cell<usize>>,
) {
    let w2 = w.clone();
    w.spawn(async move {
        while w2.now_ns() < end_ns {
            let mut req = wl.next(&mut w2.rng.borrow_mut(), home);
            let first_start_us = w2.now_us();
            let mut number = 0;
            loop {
                match proto.execute(&req, Attempt { first_start_us, number, fresh: false, defer_ack: false }).await {
                    Ok(out) => {
                        wl.on_commit(&req, &out);
                        *stats.borrow_mut().committed.entry(wl.txn_kind(&req)).or_default() += 1;
                        crate::rt::yield_now().await;
                        break;
                    }
                    Err(Abort::User) => {
                        stats.borrow_mut().user_aborts += 1;
                        break;
                    }
                    Err(_) => {
                        stats.borrow_mut().aborts += 1;
                        number += 1;
                        if number > max_retries || w2.now_ns() >= end_ns {
                            break;
                        }
                        let cap = (20u64 << number.min(8)).min(5_000);
                        let us = w2.rng.borrow_mut().gen_range(0..=cap);
                        if us > 0 {
                            w2.sleep_us(us).await;
                        }
                        wl.before_retry(&mut req, &mut w2.rng.borrow_mut());
                    }
                }
            }
        }
        live.set(live.get() - 1);
    });
}

pub fn run(spec: &BenchSpec) -> SimRun {
    assert_eq!(spec.durability.mode, crate::replication::Durability::None, "testkit::run keeps no log");
    let mut world = SimWorld::new(spec.nodes, spec.workers, spec.latency.clone(), spec.faults.clone(), spec.seed);
    let cfg = spec.worker_config();
    let end_ns = (spec.warmup_us + spec.duration_us) * 1000;
    let stats = Rc::new(RefCell::new(SimRun::default()));
    let live = Rc::new(Cell::new(0usize));
    // One workload instance per process, shared by its nodes, as the bench runtimes do.
    let run = crate::host::Run::build(spec).expect("a known protocol on a topology it takes");
    let topo = run.topo.clone();
    let wl = crate::host::build_workload(&run).expect("the workload builds");
    // Workers hold their protocol only weakly: keep every instance alive to the end.
    let mut protos = Vec::new();
    let mut first = None;
    for n in 0..spec.nodes {
        let env = NodeEnv::volatile(n, topo.clone(), wl.clone(), spec.proto.clone());
        let node = run.variant.make().build_node(env);
        for wi in 0..spec.workers {
            let addr = Addr::new(n, wi);
            let w = Rc::new(Worker::new(addr, spec.workers, world.clock(), world.executor_for(addr), &cfg));
            world.add_worker(w.clone());
            let proto = node.worker(w.clone());
            proto.start();
            // Clients homed at the node's partitions, rotated by worker (as `host::homes`); a
            // node that holds no data runs none here (Silo's replica-only hosts).
            let mut homes = topo.partitions_of(n);
            if homes.is_empty() || !topo.roles_of(n).contains(crate::cluster::Role::Client) {
                protos.push(proto);
                continue;
            }
            let r = wi as usize % homes.len();
            homes.rotate_left(r);
            for i in 0..spec.inflight as usize {
                live.set(live.get() + 1);
                let home = homes[i % homes.len()];
                client(
                    w.clone(),
                    proto.clone(),
                    wl.clone(),
                    home,
                    end_ns,
                    spec.max_retries,
                    stats.clone(),
                    live.clone(),
                );
            }
            if first.is_none() {
                first = Some((w, proto.clone()));
            }
            protos.push(proto);
        }
    }
    world.run_until(end_ns, || false);
    world.heal_all();
    if !world.run_until(end_ns + 120_000_000_000, || live.get() == 0) {
        stats.borrow_mut().notes.push("clients still running 120 s (virtual) after the window".into());
    }
    // The final checks, on node 0's first worker, one after another.
    let (w, proto) = first.expect("at least one worker");
    let done = Rc::new(Cell::new(false));
    {
        let (w2, st, done, wl) = (w.clone(), stats.clone(), done.clone(), wl.clone());
        w.spawn(async move {
            for req in wl.final_checks() {
                let first_start_us = w2.now_us();
                let mut committed = None;
                for number in 0..200 {
                    match proto.execute(&req, Attempt { first_start_us, number, fresh: true, defer_ack: false }).await {
                        Ok(out) => {
                            committed = Some(out);
                            break;
                        }
                        Err(_) => w2.sleep_us(200).await,
                    }
                }
                let mut st = st.borrow_mut();
                match committed {
                    Some(out) => {
                        st.checks.extend(wl.check_output(&req, &out).into_iter().map(|(c, ok, d)| (0, c, ok, d)))
                    }
                    None => {
                        st.checks.push((0, format!("{} did not commit in 200 attempts", req.proc), false, "".into()))
                    }
                }
            }
            done.set(true);
        });
    }
    let limit = world.now_ns() + 600_000_000_000;
    if !world.run_until(limit, || done.get()) {
        stats.borrow_mut().notes.push("the final checks did not finish".into());
    }
    // What the process recorded during the run.
    let found = wl.process_findings();
    stats.borrow_mut().checks.extend(found.into_iter().map(|(c, ok, d)| (0, c, ok, d)));
    drop(protos);
    let out = std::mem::take(&mut *stats.borrow_mut());
    out
}

// ---- direct runs ----

/// Runs procedures straight against one storage: reads see committed values and this
/// transaction's own writes, writes are applied at the end. Records the keys it touched.
pub(crate) struct Direct<'s> {
    pub store: &'s Storage<()>,
    pub keys: KeySet,
    pub writes: Vec<(RowKey, Option<Value>)>,
}

impl<'s> Direct<'s> {
    pub fn new(store: &'s Storage<()>) -> Self {
        Direct { store, keys: KeySet::default(), writes: Vec::new() }
    }

    fn value(&self, key: RowKey) -> Option<Value> {
        if let Some((_, v)) = self.writes.iter().rev().find(|(k, _)| *k == key) {
            return v.clone();
        }
        self.store.get(key).and_then(|r| r.lock().value.clone())
    }

    pub fn commit(self) {
        for (k, v) in self.writes {
            self.store.get_or_create(k).lock().value = v;
        }
    }
}

impl Access for Direct<'_> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.keys.read(key);
        Step::Ready(Ok(self.value(key)))
    }

    fn read_for_update(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.keys.write(key);
        Step::Ready(Ok(self.value(key)))
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        self.keys.write(key);
        self.writes.push((key, value));
        Step::Ready(Ok(()))
    }

    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        let rows = self.store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending);
        let keys: Vec<u64> = rows.into_iter().map(|(k, _)| k).collect();
        Step::Ready(Ok(keys.into_iter().filter_map(|k| self.value(RowKey::new(s.table, k)).map(|v| (k, v))).collect()))
    }
}

/// Poll a future that never waits (every access above is ready at once).
pub(crate) fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("a direct run waited"),
    }
}

/// Run one request the way a one-shot protocol does: the declared key set, or one found by a
/// reconnaissance run, then the real run confined to it (it must not stray), then commit.
pub(crate) fn run_direct(wl: &dyn Workload, store: &Storage<()>, req: &TxnRequest) -> TxnResult<TxnOutput> {
    let mut keys = KeySet::default();
    if !wl.declare(req, &mut keys) {
        let mut recon = Direct::new(store);
        now(wl.run(req, &mut Ctx::new(&mut recon)))?;
        keys = recon.keys;
    }
    let mut real = Direct::new(store);
    let out = now(wl.run(req, &mut Ctx::with_declared(&mut real, &keys)));
    assert_ne!(out.as_ref().err(), Some(&Abort::ReconMismatch), "{} strayed from its key set", req.proc);
    let out = out?;
    real.commit();
    Ok(out)
}

pub(crate) fn loaded(wl: &dyn Workload, partitions: &[PartitionId]) -> Storage<()> {
    let store = Storage::new(&wl.tables(partitions));
    for &p in partitions {
        wl.load_partition(p, &mut |k, v| store.load(k, v));
    }
    store
}

/// A protocol's own end-to-end test run: `variant` on `workload` in the simulator, 3 nodes with 8
/// clients per worker and 200 µs one-way delays, for 0.3 virtual seconds.
pub fn protocol_spec(variant: &str, workload: crate::workloads::WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = BenchSpec::new(variant, workload, crate::host::Runtime::Sim);
    s.nodes = 3;
    s.inflight = 8;
    s.duration_us = 300_000;
    s.warmup_us = 0;
    s.latency.delay_us = 200;
    s.seed = seed;
    s
}

/// The shared sweeps' replicated-failover run (`tests/sim_durability.rs`), as `dtx bench
/// --runtime sim --workload append --keys 24 --ops 4 --read-ratio 0.5 --nodes 3 --inflight 6
/// --max-unacked 6 --duration 400ms --warmup 0 --delay 150us --jitter 100us --durability
/// replicated --replicas 3 --faults crash,partition,loss --loss 0.02 --fault-every 100ms` runs
/// it: a seed that fails there is a regression test here.
pub fn replicated_failover_spec(variant: &str, seed: u64) -> BenchSpec {
    let mut s = BenchSpec::new(variant, contended_append(), crate::host::Runtime::Sim);
    (s.nodes, s.inflight, s.max_unacked) = (3, 6, 6);
    s.workers = 2 + crate::host::service_workers(variant); // `--workers 2` beside its service workers
    (s.duration_us, s.warmup_us, s.seed) = (400_000, 0, seed);
    (s.latency.delay_us, s.latency.jitter_us) = (150, 100);
    s.durability.mode = crate::replication::Durability::Replicated;
    s.durability.replicas = 3;
    let mut s = s.with_faults(true, true, 0.02);
    (s.faults.fault_interval_us, s.faults.fault_duration_us) = (100_000, 100_000);
    s
}

/// Four nodes in two regions 20 ms apart ({0, 2} and {1, 3}), a copy of the data per region,
/// for 1 s: the region-homed protocols' (slog, detock) latency tests.
pub fn in_two_regions_20ms_apart(s: &mut BenchSpec) {
    s.nodes = 4;
    s.latency.node_region = vec![0, 1, 0, 1];
    s.latency.delay_us = 100;
    s.latency.region_delay_us = vec![vec![100, 20_000], vec![20_000, 100]];
    s.placement = crate::cluster::Placement::PerRegion;
    s.duration_us = 1_000_000;
}

/// A contended list-append workload: 24 keys, up to 4 operations, half of them reads.
pub fn contended_append() -> crate::workloads::WorkloadParams {
    crate::workloads::WorkloadParams { name: "append".into(), keys: 24, ops: 4, read_ratio: 0.5, ..Default::default() }
}

/// Run `spec` through the bench (in the simulator, or the `local` runtime if it names it) and
/// check its history (panics naming the protocol and seed on an anomaly).
pub fn checked_run(spec: &BenchSpec) -> crate::host::Outcome {
    let out = match spec.runtime {
        crate::host::Runtime::Local => crate::host::run_local(spec).expect("the local run"),
        _ => crate::host::run_sim(spec).expect("the simulation runs"),
    };
    let path = std::env::temp_dir().join(format!("dtx-{}-{}-{}.jsonl", spec.protocol, std::process::id(), spec.seed));
    let (report, problem) =
        crate::bench::verify(&out, &path, crate::protocols::guarantee_of(&spec.protocol)).expect("the history checks");
    assert!(problem.is_none(), "{} seed {}: {problem:?} {:?}", spec.protocol, spec.seed, report.anomalies.first());
    let _ = std::fs::remove_file(&path);
    out
}

// The runs the protocols over the 2PC skeleton compare each other on (their own tests).

/// Read-only YCSB transactions that each read on several nodes: what tells apart how many
/// messages a protocol's commit phase costs.
pub fn read_only_distributed_ycsb() -> crate::workloads::WorkloadParams {
    crate::workloads::WorkloadParams {
        name: "ycsb".into(),
        keys: 10_000,
        ops: 8,
        read_ratio: 1.0,
        distributed: 1.0,
        ..Default::default()
    }
}

/// Messages per committed transaction of `variant` running `wl` in the simulator (more than 100
/// must commit for the figure to mean anything).
pub fn messages_per_commit(variant: &str, wl: &crate::workloads::WorkloadParams, seed: u64) -> f64 {
    let out = crate::host::run_sim(&protocol_spec(variant, wl.clone(), seed)).expect("the simulation runs");
    assert!(out.totals.committed > 100, "{variant}");
    out.totals.msgs as f64 / out.totals.committed as f64
}

/// A run of `variant` with a write-ahead log, crashes and partitions (a fault every 100 ms),
/// its cluster named by its seed so that runs do not share logs.
pub fn durable_run_with_crashes(variant: &str, wl: crate::workloads::WorkloadParams, seed: u64) -> BenchSpec {
    let mut s = protocol_spec(variant, wl, seed).with_faults(true, true, 0.0);
    s.durability.mode = crate::replication::Durability::Wal;
    s.durability.cluster_id = seed;
    s.faults.fault_interval_us = 100_000;
    s
}
