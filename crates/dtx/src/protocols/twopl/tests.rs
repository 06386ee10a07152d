//! 2PL's own tests: DETECT on a deadlock built by hand (two transactions locking two keys in
//! opposite order from two nodes), ended by the detector and, with detection off, by
//! the bound; and DETECT through the simulation sweep with every history checked.

use super::deadlock::{CYCLE_LEN, DEADLOCKS_FOUND, ROUNDS};
use crate::net::Addr;
use crate::protocols::twopc::record_lock::{DEADLOCK_VICTIM, DETECT_TIMEOUT};
use crate::protocols::{self, Attempt, NodeEnv};
use crate::rt::{sim::SimWorld, Worker};
use crate::storage::RowKey;
use crate::txn::{Abort, HistOp, TxnRequest};
use crate::workloads::append::{AppendArgs, AppendOp};
use crate::workloads::WorkloadParams;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// What became of the two transactions of [`opposite_order_deadlock`].
struct Deadlock {
    /// Each transaction's aborted attempts, by reason.
    aborts: [Vec<Abort>; 2],
    /// When each committed (virtual µs).
    committed_us: [u64; 2],
    /// The final lists of the two keys, and which transaction's append each value is.
    lists: [Vec<u64>; 2],
    /// Node 0's first worker's counters (the detector's).
    counters: Vec<(&'static str, u64)>,
}

/// Transaction 0, from node 0, appends to `keys[0]` (on node 0) then `keys[1]` (on node 1);
/// transaction 1, from node 1, the other way round; interactive, so that each locks its own
/// node's key before it asks for the other's. Each retries until it commits; then the final
/// read reads both lists.
fn opposite_order_deadlock(variant: &str, seed: u64) -> Deadlock {
    let wl_params = WorkloadParams { name: "append".into(), keys: 8, ops: 2, ..Default::default() };
    let mut spec = crate::testkit::protocol_spec(variant, wl_params, seed);
    spec.nodes = 2;
    spec.workers = 1;
    spec.proto.one_shot = false;
    let topo = Arc::new(spec.topology());
    let wl = crate::workloads::build(&spec.workload, &topo).expect("the workload builds");
    let on =
        |n: u16| (0..8).find(|k| topo.node_of(wl.partition_of(RowKey::new(0, *k))) == n).expect("a key on every node");
    let keys = [on(0), on(1)];
    let variant = protocols::Variant::parse_including_planned(variant).expect("a protocol with code");
    let mut world = SimWorld::new(2, 1, spec.latency.clone(), spec.faults.clone(), seed);
    let cfg = spec.worker_config();
    let mut protos = Vec::new();
    let mut workers = Vec::new();
    for n in 0..2 {
        let node = variant.make().build_node(NodeEnv::volatile(n, topo.clone(), wl.clone(), spec.proto.clone()));
        let w = Rc::new(Worker::new(Addr::new(n, 0), 1, world.clock(), world.executor_for(Addr::new(n, 0)), &cfg));
        world.add_worker(w.clone());
        let proto = node.worker(w.clone());
        proto.start();
        protos.push(proto);
        workers.push(w);
    }
    let done: Rc<RefCell<[Option<u64>; 2]>> = Rc::default();
    let aborts: Rc<RefCell<[Vec<Abort>; 2]>> = Rc::default();
    for t in 0..2usize {
        let (first, second) = (keys[t], keys[1 - t]);
        let ops = vec![AppendOp::Append(first, 100 + t as u64), AppendOp::Append(second, 200 + t as u64)];
        let home = topo.partitions_of(t as u16)[0];
        let req = TxnRequest::new("append-txn", home, AppendArgs { ops });
        let (w, proto, done, aborts) = (workers[t].clone(), protos[t].clone(), done.clone(), aborts.clone());
        workers[t].spawn(async move {
            let first_start_us = w.now_us();
            for number in 0.. {
                let attempt = Attempt { first_start_us, number, fresh: false, defer_ack: false };
                match proto.execute(&req, attempt).await {
                    Ok(_) => break,
                    Err(a) => aborts.borrow_mut()[t].push(a),
                }
                // Apart, so that the two do not meet again in the same order.
                w.sleep_us(1_000 * (1 + t as u64)).await;
            }
            done.borrow_mut()[t] = Some(w.now_us());
        });
    }
    assert!(world.run_until(10_000_000_000, || done.borrow().iter().all(|d| d.is_some())), "both commit");
    let read: Rc<RefCell<Option<Vec<HistOp>>>> = Rc::default();
    {
        let (w, proto, read, wl) = (workers[0].clone(), protos[0].clone(), read.clone(), wl.clone());
        workers[0].spawn(async move {
            let req = wl.final_read().expect("list-append reads every key at the end");
            let first_start_us = w.now_us();
            // A participant may still hold a commit's locks until the decision reaches it.
            for number in 0..200 {
                let attempt = Attempt { first_start_us, number, fresh: true, defer_ack: false };
                if let Ok(out) = proto.execute(&req, attempt).await {
                    *read.borrow_mut() = Some(out.history);
                    return;
                }
                w.sleep_us(200).await;
            }
        });
    }
    let limit = world.now_ns() + 1_000_000_000;
    assert!(world.run_until(limit, || read.borrow().is_some()), "the final read ends");
    let history = read.borrow_mut().take().expect("read");
    let list = |key: u64| {
        history
            .iter()
            .find_map(|op| match op {
                HistOp::Read(k, Some(l)) if *k == key => Some(l.clone()),
                _ => None,
            })
            .expect("every key read")
    };
    let done = *done.borrow();
    let out = Deadlock {
        aborts: aborts.borrow().clone(),
        committed_us: done.map(|d| d.expect("committed")),
        lists: [list(keys[0]), list(keys[1])],
        counters: workers[0].counters(),
    };
    drop(protos);
    out
}

fn counter(d: &Deadlock, name: &str) -> u64 {
    d.counters.iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
}

/// Both lists hold both transactions' appends, in the same order: the history is serial.
fn assert_serial(d: &Deadlock) {
    // keys[0]'s list holds 100 (transaction 0) and 201 (transaction 1); keys[1]'s 200 and 101.
    let mut a = d.lists[0].clone();
    let mut b = d.lists[1].clone();
    assert_eq!((a.len(), b.len()), (2, 2), "each key has both appends: {:?}", d.lists);
    let first_in_a = if a[0] == 100 { 0 } else { 1 };
    let first_in_b = if b[0] == 200 { 0 } else { 1 };
    assert_eq!(first_in_a, first_in_b, "one serial order explains both keys: {:?}", d.lists);
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!((a, b), (vec![100, 201], vec![101, 200]));
}

#[test]
fn the_detector_ends_a_deadlock_across_two_nodes_with_a_victim() {
    for seed in 1..=6 {
        // A bound far beyond the run: only the detector can end the deadlock in time.
        let d = opposite_order_deadlock("2pl-detect:lock_wait_us=5000000", seed);
        let all: Vec<Abort> = d.aborts.iter().flatten().copied().collect();
        assert_eq!(all, vec![Abort::Protocol(DEADLOCK_VICTIM)], "seed {seed}: one victim, nothing else");
        assert_eq!((counter(&d, DEADLOCKS_FOUND), counter(&d, CYCLE_LEN)), (1, 2), "seed {seed}");
        assert!(counter(&d, ROUNDS) >= 1);
        // Found within a few detection intervals (10 ms), long before the bound.
        assert!(d.committed_us.iter().all(|t| *t < 100_000), "seed {seed}: {:?}", d.committed_us);
        assert_serial(&d);
    }
}

#[test]
fn without_the_detector_the_bound_ends_the_deadlock_under_its_own_reason() {
    // Detection off: no node searches its waits as one starts, none tells a detector, and
    // there is none (a long `detect_us` alone no longer holds it off: a wait that closes no
    // cycle of its own node starts a round at once).
    let d = opposite_order_deadlock("2pl-detect:detect=off:lock_wait_us=5000", 3);
    let all: Vec<Abort> = d.aborts.iter().flatten().copied().collect();
    assert!(!all.is_empty() && all.iter().all(|a| *a == Abort::Protocol(DETECT_TIMEOUT)), "{all:?}");
    assert_eq!(counter(&d, DEADLOCKS_FOUND), 0);
    assert_eq!(counter(&d, ROUNDS), 0, "no detector ran");
    assert_serial(&d);
}

#[test]
fn wait_die_never_lets_the_deadlock_form() {
    let d = opposite_order_deadlock("2pl-waitdie:lock_wait_us=5000000", 2);
    let all: Vec<Abort> = d.aborts.iter().flatten().copied().collect();
    assert!(!all.is_empty() && all.iter().all(|a| *a == Abort::WaitDie), "{all:?}");
    assert_serial(&d);
}

/// DETECT under contention, one-shot and interactive: every history serializable (and strictly
/// so), every acknowledged append in the final state, and deadlocks found and ended.
#[test]
fn detect_keeps_contended_histories_serializable_and_finds_deadlocks() {
    let mut found = 0;
    for seed in 1..=4 {
        for one_shot in [true, false] {
            let mut s = crate::testkit::protocol_spec("2pl-detect", crate::testkit::contended_append(), seed);
            s.proto.one_shot = one_shot;
            let out = crate::testkit::checked_run(&s);
            assert!(out.totals.committed > 0, "seed {seed}");
            found += out.totals.counters.get(DEADLOCKS_FOUND).copied().unwrap_or(0);
        }
    }
    assert!(found > 0, "contended list-append deadlocks now and then");
}
