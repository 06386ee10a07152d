//! Test harness for workloads with final checks (TPC-C, bank): a simulated run with its own
//! closed-loop clients (the driver's loop, with its `on_commit` and `before_retry` calls), then
//! the workload's `final_checks` executed on node 0's first worker, each until it commits, with
//! `check_output` called after each, then `process_findings`. One workload instance serves every
//! node, as in the bench runtimes.

use crate::bench::BenchSpec;
use crate::net::Addr;
use crate::protocols::{self, Attempt, NodeEnv, WorkerProtocol};
use crate::rt::{sim::SimWorld, Worker, WorkerConfig};
use crate::txn::Abort;
use crate::workloads::Workload;
use rand::Rng as _;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
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
                match proto.execute(&req, Attempt { first_start_us, number }).await {
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
    let mut world = SimWorld::new(spec.nodes, spec.workers, spec.latency.clone(), spec.faults.clone(), spec.seed);
    let cfg = WorkerConfig { seed: spec.seed, cost: spec.cost, rpc: spec.rpc };
    let end_ns = (spec.warmup_us + spec.duration_us) * 1000;
    let stats = Rc::new(RefCell::new(SimRun::default()));
    let live = Rc::new(Cell::new(0usize));
    // One workload instance per process, shared by its nodes, as the bench runtimes do.
    let topo = Arc::new(spec.topology());
    let wl = crate::workloads::build(&spec.workload, &topo).expect("the workload builds");
    let variant = protocols::Variant::parse_including_planned(&spec.protocol).expect("a known protocol");
    // Workers hold their protocol only weakly: keep every instance alive to the end.
    let mut protos = Vec::new();
    let mut first = None;
    for n in 0..spec.nodes {
        let env = NodeEnv::volatile(n, topo.clone(), wl.clone(), spec.proto.clone());
        let node = variant.make().build_node(env);
        for wi in 0..spec.workers {
            let addr = Addr::new(n, wi);
            let w = Rc::new(Worker::new(addr, spec.workers, world.clock(), world.executor_for(addr), &cfg));
            world.add_worker(w.clone());
            let proto = node.worker(w.clone());
            proto.start();
            // Clients homed at the node's partitions, rotated by worker (as `bench::homes`).
            let mut homes = topo.partitions_of(n);
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
                    match proto.execute(&req, Attempt { first_start_us, number }).await {
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
