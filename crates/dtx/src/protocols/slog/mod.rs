//! SLOG (Ren, Li, Abadi; VLDB 2019), on Calvin's deterministic engine (`protocols::calvin`):
//! every key has a home region (its partition's leading copy's region); a transaction whose
//! keys are all homed in one region is sequenced by that region's log alone (its sequencers'
//! batches round-robin), and every region runs every region's log on its own copy of the data.
//! A multi-home transaction goes to the global orderer ([`calvin::orderer`]), which orders it
//! among the others and sends each of its home regions a lock-only piece that the region's log
//! places in the global order; a scheduler runs it once every piece it holds keys of has its
//! locks. A key's lock requests all come from its home's log, so every region orders them
//! alike, and logs interleave at each scheduler as their batches arrive: a single-home
//! transaction waits for no other region.
//!
//! Remastering is `calvin::homes`, shared with Detock: a key's home is its partition's until a
//! movement moves it, and `rehome` makes clients move homes. It departs from SLOG's paper: a
//! movement is a multi-home transaction through the orderer (the Detock thesis's form), not a
//! single-home one with a counter in every record.
//!
//! The ordering service runs on `orderer_threads` workers of the orderer's node
//! ([`calvin::orderer`]; the thesis's SLOG uses 8, its "SLOG (slow)" 1).
//!
//! Its nodes checkpoint as Calvin's do (`calvin::checkpoint`), and its orderer checkpoints
//! apart, as often (`calvin::orderer`), so that its log keeps only the batches in flight.
//!
//! Without `--regions`, `slog` splits its nodes into two regions (even and odd nodes), so that a
//! run has multi-home transactions to order; `--regions` and a cluster file's regions replace
//! that. `--placement per-region` keeps a full copy in every region, as the paper does.
//!
//! Where `slog` lives (paths under `crates/dtx/src/`; `dtx protocols --options slog` prints this map):
//! - `protocols/slog/mod.rs`: its options, regions and layout;
//! - `protocols/calvin/orderer.rs`: the global orderer of multi-home transactions;
//! - `protocols/calvin/sequencer.rs`: a log per home region: sequencers;
//! - `protocols/calvin/scheduler.rs`: schedulers interleaving the regions' logs;
//! - `protocols/calvin/locks.rs`: locks in pieces, in log order;
//! - `protocols/calvin/homes.rs`: remastering (homes that move);
//! - `protocols/calvin/checkpoint.rs`: checkpoints (the orderer's: orderer.rs).

use crate::protocols::calvin::{self, homes, Calvin, LogOrder};
use crate::protocols::{OptionKind, OptionSpec, Options};

pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "batch_us",
        kind: OptionKind::U64 { min: 100, max: 1_000_000 },
        default: "5000",
        help:
            "every region's sequencers and the orderer close a batch this often (the Detock thesis runs SLOG at 5 ms)",
    },
    OptionSpec {
        name: "max_pending",
        kind: OptionKind::U64 { min: 1, max: 1_000_000 },
        default: "100000",
        help: "submissions a sequencer or the orderer holds before it refuses more (sequencer-full, orderer-full)",
    },
    OptionSpec {
        name: "orderer_threads",
        kind: OptionKind::U64 { min: 1, max: 64 },
        default: "8",
        help: "workers of the orderer's node that take multi-home submissions (decode them, find their homes) and hand them to the first, which closes the batches (the thesis: 8; its \"SLOG (slow)\" 1)",
    },
    homes::REHOME,
    calvin::checkpoint::CHECKPOINT_US,
    calvin::checkpoint::CHECKPOINT_LOG_MIB,
];

pub const ABORTS: &[(&str, &str)] = &[
    calvin::REGION_SEQUENCER_FULL_ABORT,
    ("orderer-full", "the orderer's queue of multi-home transactions was at max_pending; the client retries"),
    calvin::SCAN_UNDECLARED_ABORT,
    calvin::UNDECODABLE_ABORT,
    homes::HOME_MOVED_ABORT,
];

pub fn new(o: &Options) -> Calvin {
    Calvin {
        rehome: o.f64("rehome"),
        orderer_threads: o.u64("orderer_threads") as u16,
        ..Calvin::ordered(o, LogOrder::HomeRegions)
    }
}

#[cfg(test)]
mod tests;
