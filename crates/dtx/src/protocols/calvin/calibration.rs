//! Measurements, not tests: what the simulator charges the deterministic family for the work
//! only it does (`rt::CpuCost::decode_ns_per_kib`, `rt::CpuCost::graph_key_ns`), measured on
//! this machine. Run with
//! `cargo test --release -p dtx --lib calvin::calibration -- --ignored --nocapture`.

use super::messages::{Entry, Msg};
use crate::net::{decode, encode, Addr};
use crate::protocols::depgraph::{DependencyGraph, Use};
use crate::util::Rng;
use rand::Rng as _;
use std::time::Instant;

/// A sequencer's batch of `entries` requests of `req_bytes` each (YCSB's ten keys encode to
/// about 90 bytes, TPC-C's new-order to about 200).
fn batch(entries: u64, req_bytes: usize) -> Msg {
    let entry = |id| Entry {
        client: Addr::new(1, 2),
        id,
        req: (0..req_bytes).map(|i| (i * 7 + id as usize) as u8).collect(),
        keys: None,
        piece: None,
        placed: None,
        homes: Vec::new(),
        movement: None,
    };
    Msg::Batch { epoch: 7, sequencer: 1, entries: (0..entries).map(entry).collect() }
}

/// The least time over seven tries of `rounds` runs of `work`, which returns the bytes (or
/// keys) it handled: ns per unit.
fn least_ns_per(rounds: usize, mut work: impl FnMut() -> usize) -> f64 {
    (0..7)
        .map(|_| {
            let (mut units, t0) = (0, Instant::now());
            for _ in 0..rounds {
                units += std::hint::black_box(work());
            }
            t0.elapsed().as_nanos() as f64 / units as f64
        })
        .fold(f64::MAX, f64::min)
}

#[test]
#[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per KiB decoded"]
fn decode_cost_per_kib() {
    for (entries, req_bytes) in [(100, 90), (100, 200), (1000, 90), (10, 90)] {
        let bytes = encode(&batch(entries, req_bytes));
        let rounds = 20_000 / entries as usize + 5;
        let per_byte = least_ns_per(rounds, || {
            let msg: Msg = decode(&bytes).expect("decodes");
            std::hint::black_box(msg);
            bytes.len()
        });
        println!("a batch of {entries} requests of {req_bytes} B: decode {:.0} ns per KiB", per_byte * 1024.0);
    }
}

#[test]
#[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per key added to a graph"]
fn graph_insertion_cost_per_key() {
    for (keys_per_txn, key_space) in [(10u64, 10_000u64), (10, 100), (20, 100_000)] {
        let mut rng: Rng = crate::util::rng_from_seed(7);
        let mut graph: DependencyGraph<u64, u64> = DependencyGraph::default();
        let (mut txn, mut emitted) = (0u64, Vec::new());
        let per_key = least_ns_per(20_000, || {
            txn += 1;
            let keys = (0..keys_per_txn).map(|_| {
                let k = rng.gen_range(0..key_space);
                (k, if k % 2 == 0 { Use::Write } else { Use::Read })
            });
            let mut keys: Vec<(u64, Use)> = keys.collect();
            keys.sort_unstable_by_key(|(k, _)| *k);
            keys.dedup_by_key(|(k, _)| *k);
            let n = keys.len();
            emitted.clear();
            graph.add_piece(txn, 1, keys, &mut emitted);
            n
        });
        println!("{keys_per_txn} keys of {key_space}: {per_key:.0} ns per key added, {} vertices left", graph.len());
    }
}
