//! Detock (Nguyen, Abadi; SIGMOD 2023; thesis chapter 4), on Calvin's deterministic engine
//! (`protocols::calvin`), beside SLOG: every key has a home region (its partition's leading
//! copy's region), each region's sequencers feed a log of their own, and every region runs every
//! region's log on its own copy of the data, taking the logs as their batches arrive. What
//! differs from SLOG is the multi-home transaction:
//!
//! - **No orderer.** The client's region's sequencer coordinates it (Algorithm 1): it stamps it
//!   with now + the farthest home's estimated one-way delay + `overshoot_us` (opportunistic
//!   ordering, §4.2.4; the delay from probes, so clocks need not agree) and sends each home its
//!   piece (a GraphPlacementTxn: the keys homed there), sent until it arrives. Each home's
//!   sequencer places the piece in its next batch once its clock reaches the stamp
//!   (Algorithm 2), so pieces sent early enough land at about the same moment everywhere.
//! - **A dependency graph, not ordered locks in log order.** Every scheduler adds every
//!   transaction and piece to `protocols::depgraph` (Algorithm 3: an edge per conflict on a
//!   key, a key's conflicts all in its home's log), and hands the lock manager a transaction
//!   once all its pieces are in and all it depends on was handed on. Pieces from different
//!   homes can cross and close a cycle; every `ddr_us` the scheduler resolves the cycles of the
//!   graph's stable part deterministically (§4.2.2), so every region runs them in one order
//!   without a message between them. Nothing aborts for a deadlock.
//!
//! Where dtx departs from the thesis, and why:
//! - Every node of a region builds the region's whole graph from the logs it already receives
//!   (it gets every batch), instead of each partition building its part and broadcasting it:
//!   the same graph with no graph messages, at the cost of every node adding every key.
//! - The resolver runs in the scheduler's worker, not a thread of its own with a copy.
//! - A scan conflicts, in the graph, with every write to its table's partition.
//! - Home movement (§4.3) is `calvin::homes`, shared with SLOG: a key's home is its
//!   partition's until a movement moves it, and `rehome` makes clients move homes. A workload
//!   that scans cannot move homes (a scan's range is ordered in its partition's home only).
//!
//! Counters: `detock-deadlocks` and `detock-deadlocked-txns` (cycles resolved, and the
//! transactions in them, counted by every scheduler that resolves them), `detock-pieces-late`
//! (pieces that reached their home after their stamp), `detock-piece-copies`,
//! `detock-recoordinated`, and `detock-resolutions` with `detock-graph-vertices` (the graph's
//! size at each resolution, summed: their ratio is its mean size), and the gauge
//! `detock-graph-vertices-max` (its largest at a resolution). The graph holds only
//! transactions not yet handed to the lock manager, so the clients' transactions in flight
//! bound it.
//!
//! Without `--regions`, `detock` splits its nodes into two regions (even and odd nodes), as
//! `slog` does, so that a run has multi-home transactions.
//!
//! Where `detock` lives (paths under `crates/dtx/src/`; `dtx protocols --options detock` prints this map):
//! - `protocols/detock/mod.rs`: its options, regions and layout;
//! - `protocols/calvin/sequencer.rs`: opportunistic ordering: stamps, delay probes, pieces sent to each home;
//! - `protocols/calvin/piece_seqs.rs`: a home's copies of a piece told apart;
//! - `protocols/depgraph.rs`: the dependency graph and deterministic deadlock resolution;
//! - `protocols/calvin/scheduler.rs`: the schedulers that feed it and run what it hands on;
//! - `protocols/calvin/homes.rs`: home movement;
//! - `protocols/calvin/checkpoint.rs`: checkpoints.

use crate::protocols::calvin::{self, homes, Calvin, LogOrder};
use crate::protocols::{OptionKind, OptionSpec, Options};

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "batch_us",
        kind: OptionKind::U64 { min: 100, max: 1_000_000 },
        default: "5000",
        help: "every region's sequencers close a batch this often (the thesis: 5 ms)",
    },
    OptionSpec {
        name: "max_pending",
        kind: OptionKind::U64 { min: 1, max: 1_000_000 },
        default: "100000",
        help: "submissions a sequencer holds before it refuses more (sequencer-full)",
    },
    OptionSpec {
        name: "ddr_us",
        kind: OptionKind::U64 { min: 100, max: 10_000_000 },
        default: "40000",
        help: "how often every scheduler resolves the deadlocks of its dependency graph (the thesis: 40 ms)",
    },
    OptionSpec {
        name: "opportunistic",
        kind: OptionKind::Choice(&["on", "off"]),
        default: "on",
        help: "stamp multi-home transactions so that their pieces land together (on), or place pieces as they arrive",
    },
    OptionSpec {
        name: "overshoot_us",
        kind: OptionKind::U64 { min: 0, max: 10_000_000 },
        default: "2000",
        help: "the margin opportunistic ordering adds to the farthest home's delay (the thesis: 2 ms)",
    },
    homes::REHOME,
    calvin::checkpoint::CHECKPOINT_US,
    calvin::checkpoint::CHECKPOINT_LOG_MIB,
];

pub const ABORTS: &[(&str, &str)] = &[
    calvin::REGION_SEQUENCER_FULL_ABORT,
    calvin::SCAN_UNDECLARED_ABORT,
    calvin::UNDECODABLE_ABORT,
    homes::HOME_MOVED_ABORT,
];

pub fn new(o: &Options) -> Calvin {
    Calvin {
        ddr_us: o.u64("ddr_us"),
        overshoot_us: (o.choice("opportunistic") == "on").then(|| o.u64("overshoot_us")),
        rehome: o.f64("rehome"),
        ..Calvin::ordered(o, LogOrder::Graph)
    }
}

#[cfg(test)]
mod tests;
