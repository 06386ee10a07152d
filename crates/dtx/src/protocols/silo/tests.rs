//! Silo and Rolis runs end to end: they commit, verify, and keep what they acknowledged across
//! failovers (rolis's replicated streams); each refuses the other's durability in one line.

use crate::replication::Durability;
use crate::testkit::{checked_run, contended_append, protocol_spec, replicated_failover_spec};

#[test]
fn silo_commits_and_verifies_without_a_log() {
    let mut s = protocol_spec("silo", contended_append(), 1);
    // Nothing waits without a log: a short run commits thousands.
    s.duration_us = 20_000;
    let out = checked_run(&s);
    assert!(out.totals.committed > 100, "{} committed", out.totals.committed);
}

/// Rolis's replay-only measurement: every worker's kept batches, replayed after the run in
/// any interleaving, end in exactly the rows the run executed (`checked_run` fails on a
/// finding that says otherwise), and the report gives the rate.
#[test]
fn a_replay_of_silos_kept_batches_ends_in_the_executed_rows() {
    let mut s = protocol_spec("silo:replay_only=true:batch=7", contended_append(), 5);
    (s.nodes, s.workers, s.duration_us) = (1, 3, 5_000);
    let out = checked_run(&s);
    let replay = out.totals.replay.expect("a replay-only run reports its replay");
    assert_eq!(replay.rows_match, Some(true));
    // Read-only transactions log nothing.
    assert!(replay.txns > out.totals.committed / 4, "{} replayed, {} committed", replay.txns, out.totals.committed);
    assert!(replay.per_s().is_some_and(|r| r > 0.0));
}

/// The leader's host crashes, links are cut and lose packets: every failover closes the old
/// epoch at its final watermark, and nothing acknowledged is lost (`checked_run` verifies).
#[test]
fn rolis_fails_over_and_loses_nothing_it_released() {
    let (mut committed, mut failovers, mut dropped) = (0, 0, 0);
    for seed in 1..=3 {
        let out = checked_run(&replicated_failover_spec("rolis", seed));
        committed += out.totals.committed;
        failovers += out.totals.failovers;
        dropped += out.totals.counters.get("replay-dropped").copied().unwrap_or(0);
    }
    assert!(committed > 1000, "{committed} committed over the sweep");
    assert!(failovers > 0, "no failover over the sweep");
    assert!(dropped > 0, "no failover dropped what lay above an old epoch's watermark");
}

#[test]
fn each_refuses_the_durability_of_the_other() {
    let refusal = |protocol: &str, mode: Durability, replicas: u16| {
        let mut s = protocol_spec(protocol, contended_append(), 1);
        (s.durability.mode, s.durability.replicas) = (mode, replicas);
        s.validate().unwrap_err().to_string()
    };
    assert!(refusal("silo", Durability::Replicated, 3).contains("rolis"));
    assert!(refusal("rolis", Durability::None, 3).contains("--durability replicated"));
    assert!(refusal("rolis", Durability::Wal, 3).contains("--durability replicated"));
    assert!(refusal("rolis", Durability::Replicated, 1).contains("2 replicas"));
    assert!(refusal("silo:replay_only=true", Durability::Wal, 1).contains("--durability none"));
}
