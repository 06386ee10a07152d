//! Rolis (execute, replicate, replay): Silo on one multi-core leader whose workers each
//! replicate their own log on a Raft group of its own (Rolis's per-thread Paxos streams), with
//! results released below the watermark over the streams, replicas replaying each stream below
//! it, and a failover that closes the old epoch at its final watermark. It is the engine in
//! `protocols/silo` with `replicated` set: what differs from `silo` is only where the logs live
//! (`--durability replicated`, which `rolis` requires, with 2 replicas or more).
//!
//! Where this Rolis departs from the paper (each is in docs/protocols.md's table):
//! - Raft (tikv's raft-rs) stands for the authors' MultiPaxos; an entry is durable once a
//!   majority holds it, and a stream commits in order, as theirs.
//! - A TID follows the worker's clock and passes every TID its transaction saw (Silo's rule) in
//!   place of `rdtscp`; the epoch is the node's incarnation, in the TID's top bits.
//! - A batch is also appended every `flush_us` however full (the paper cuts by count alone and
//!   moves idle streams by heartbeats, which dtx sends on the same tick).
//! - A replica's streams share one state ([`crate::protocols::silo::log::NodeReplica`]), as the
//!   paper's replica does; a stream's snapshot (Raft's log compaction, where the paper's
//!   followers keep their whole log) carries the rows whose latest write is its own.
//! - A new leader is elected per log by Raft (a node's logs fail over together to one host),
//!   not by one election module; the old epoch is closed by the new incarnation's `Closed`
//!   entry in every stream, which carries its final watermark.
//!
//! Where `rolis` lives (paths under `crates/dtx/src/`; `dtx protocols --options rolis` prints this map):
//! - `protocols/rolis/mod.rs`: its registry entry and options, and what it departs from;
//! - `protocols/silo/txn.rs`: execution on the leader (Silo);
//! - `protocols/silo/stream.rs`: streams, batches, the watermark and release;
//! - `protocols/silo/log.rs`: replay on replicas, failover and recovery;
//! - `replication/raft_log.rs`: a Raft group per worker's log;
//! - `protocols/silo/replay.rs`: the replay-only measurement.

use crate::protocols::silo::{Silo, SiloConfig};
use crate::protocols::{Options, Protocol};
use std::sync::Arc;

pub use crate::protocols::silo::OPTIONS;

pub fn new(o: &Options) -> Arc<dyn Protocol> {
    Arc::new(Silo::new(SiloConfig::from_options(o, true)))
}
