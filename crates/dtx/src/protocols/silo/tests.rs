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
    // A few dozen commits will do: the suite runs tests side by side on two cores.
    assert!(out.totals.committed > 20, "{} committed", out.totals.committed);
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

/// On threads (`local`, where logs are owner-led and nothing fails over), the followers replay
/// the streams they hold as the run goes, and the report says how far they trailed the leader's
/// release as the window closed.
#[test]
fn rolis_followers_replay_on_threads() {
    let mut s = protocol_spec("rolis:batch=8", contended_append(), 1);
    s.runtime = crate::host::Runtime::Local;
    // 0.6 s, not 0.3: on threads the window is real time, and under a loaded test run (CI
    // runs the binaries' tests side by side) the logs' first fsyncs once took most of 0.3 s.
    (s.workers, s.duration_us, s.latency.delay_us) = (2, 600_000, 0);
    (s.durability.mode, s.durability.replicas) = (Durability::Replicated, 3);
    let out = checked_run(&s);
    let replayed = out.totals.counters.get("replayed").copied().unwrap_or(0);
    assert!(out.totals.committed > 100, "{} committed", out.totals.committed);
    // Each of two followers replays what the leader logged (read-only transactions log
    // nothing); the last batches may still be on their way when the run stops.
    assert!(
        replayed > out.totals.committed / 2,
        "{replayed} replayed by two followers, {} committed",
        out.totals.committed
    );
    assert!(out.totals.replay_lag_us.is_some(), "the replay lag is measured");
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
