//! Hand-made histories: one per anomaly kind (asserting the exact kind and transactions), valid
//! histories, and malformed input.

use dtx_check::{check_file, check_reader, AnomalyKind, CheckReport};
use std::io::Cursor;

fn check(lines: &[&str]) -> CheckReport {
    let text = lines.join("\n");
    match check_reader(Cursor::new(text)) {
        Ok(r) => r,
        Err(e) => panic!("history should parse: {e:#}"),
    }
}

/// Asserts that the report has exactly one anomaly, of `kind`, involving `txns` in that order.
fn assert_only(r: &CheckReport, kind: AnomalyKind, txns: &[u64]) {
    assert!(!r.valid, "expected {kind}, got a valid report");
    assert_eq!(r.anomalies.len(), 1, "expected exactly one {kind}, got {:#?}", r.anomalies);
    let a = &r.anomalies[0];
    assert_eq!(a.kind, kind, "{a:#?}");
    assert_eq!(a.txns, txns, "{a:#?}");
    assert!(!a.explanation.is_empty());
    assert_eq!(r.counts.get(kind.as_str()), Some(&1));
}

fn assert_valid(r: &CheckReport) {
    assert!(r.valid, "expected valid, got {:#?}", r.anomalies);
    assert!(r.anomalies.is_empty());
    assert!(r.counts.is_empty());
    assert!(r.summary().starts_with("valid: "), "{}", r.summary());
}

// ------------------------------------------------------------------ cycles

#[test]
fn g0_write_cycle() {
    // T1 and T2 append to keys 1 and 2 in opposite orders.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2], ["append", 2, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1, 2]], ["r", 2, [2, 1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G0, &[1, 2]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T1 -ww-> T2") && e.contains("T2 -ww-> T1"), "{e}");
    assert_eq!(r.summary(), "INVALID: 1 anomaly (G0: 1)");
}

#[test]
fn g1c_circular_information_flow() {
    // Each transaction reads the other's append.
    let r = check(&[
        r#"{"id": 10, "status": "committed", "ops": [["append", 1, 1], ["r", 2, [2]]]}"#,
        r#"{"id": 20, "status": "committed", "ops": [["append", 2, 2], ["r", 1, [1]]]}"#,
        r#"{"id": 30, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [2]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G1c, &[10, 20]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T20 read key 1 ending with 1, which T10 appended"), "{e}");
}

#[test]
fn g_single_read_skew() {
    // T2 sees T1's append to key 2 but not its append to key 1.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []], ["r", 2, [1]]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::GSingle, &[1, 2]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T2 read key 1 as empty"), "{e}");
}

#[test]
fn g2_write_skew() {
    // Both read both keys empty, then each appends to a different key.
    let r = check(&[
        r#"{"id": 5, "status": "committed", "ops": [["r", 1, []], ["r", 2, []], ["append", 1, 1]]}"#,
        r#"{"id": 6, "status": "committed", "ops": [["r", 1, []], ["r", 2, []], ["append", 2, 1]]}"#,
        r#"{"id": 7, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G2, &[5, 6]);
}

#[test]
fn g2_long_cycle_through_three_transactions() {
    // A three-way write skew: each Ti reads key i empty, Ti+1 appends to key i.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["r", 1, []], ["append", 3, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 2, []], ["append", 1, 1]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 3, []], ["append", 2, 1]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]], ["r", 3, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G2, &[1, 2, 3]);
}

#[test]
fn cycles_in_separate_components_are_reported_separately() {
    let r = check(&[
        // G0 between 1 and 2
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2], ["append", 2, 2]]}"#,
        // G-single between 3 and 4
        r#"{"id": 3, "status": "committed", "ops": [["append", 3, 1], ["append", 4, 1]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 3, []], ["r", 4, [1]]]}"#,
        r#"{"id": 9, "status": "committed", "ops": [["r", 1, [1, 2]], ["r", 2, [2, 1]], ["r", 3, [1]], ["r", 4, [1]]]}"#,
    ]);
    assert!(!r.valid);
    assert_eq!(r.anomalies.len(), 2, "{:#?}", r.anomalies);
    assert_eq!(r.anomalies[0].kind, AnomalyKind::G0);
    assert_eq!(r.anomalies[0].txns, vec![1, 2]);
    assert_eq!(r.anomalies[1].kind, AnomalyKind::GSingle);
    assert_eq!(r.anomalies[1].txns, vec![3, 4]);
    assert_eq!(r.summary(), "INVALID: 2 anomalies (G-single: 1, G0: 1)");
}

#[test]
fn one_component_reports_each_kind_it_contains() {
    // T2 sees T1's append to key 1 but not to key 2 (G-single between T1 and T2), and T2/T3
    // write-skew on keys 3 and 4 (G2 between T2 and T3): all three form one SCC.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, []], ["r", 3, []], ["append", 4, 1]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 4, []], ["append", 3, 1]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]], ["r", 3, [1]], ["r", 4, [1]]]}"#,
    ]);
    let kinds: Vec<(AnomalyKind, Vec<u64>)> = r.anomalies.iter().map(|a| (a.kind, a.txns.clone())).collect();
    assert_eq!(kinds, vec![(AnomalyKind::GSingle, vec![1, 2]), (AnomalyKind::G2, vec![2, 3]),], "{:#?}", r.anomalies);
}

#[test]
fn unknown_txn_observed_joins_the_graph() {
    // T1's outcome is unknown, but T2 saw its append to key 2, so it committed; T2 missed its
    // append to key 1: read skew.
    let r = check(&[
        r#"{"id": 1, "status": "unknown", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []], ["r", 2, [1]]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::GSingle, &[1, 2]);
}

// ------------------------------------------------------------------ non-cycle anomalies

#[test]
fn g1a_aborted_read() {
    let r = check(&[
        r#"{"id": 1, "status": "aborted", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G1a, &[1, 2]);
}

#[test]
fn g1a_reports_the_earliest_reader_once() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "aborted", "ops": [["append", 1, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["append", 1, 3]]}"#,
        r#"{"id": 5, "status": "committed", "ops": [["r", 1, [1, 2]]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1, 2, 3]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G1a, &[2, 5]);
}

#[test]
fn g1b_intermediate_read() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 1, 2]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1, 2]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::G1b, &[1, 2]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("later appended 2"), "{e}");
}

#[test]
fn duplicate_append() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 5]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 5]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [5]], ["append", 2, 1]]}"#,
    ]);
    assert_only(&r, AnomalyKind::DuplicateAppend, &[1, 2]);
}

#[test]
fn duplicate_value_in_a_read() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 5]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [5, 5]], ["append", 2, 1]]}"#,
    ]);
    assert_only(&r, AnomalyKind::DuplicateAppend, &[2]);
}

#[test]
fn garbage_read() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1, 99]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::GarbageRead, &[2]);
    assert!(r.anomalies[0].explanation.contains("99"));
}

#[test]
fn incompatible_order() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1, 2]]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [2, 1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::IncompatibleOrder, &[3, 4]);
}

#[test]
fn incompatible_order_is_reported_once_per_key() {
    // The longest read (T9) is corrupt and conflicts with three other reads of key 1; key 2's
    // reads conflict separately.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2], ["append", 2, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["append", 1, 3]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]]]}"#,
        r#"{"id": 5, "status": "committed", "ops": [["r", 1, [1, 2]], ["r", 2, [1, 2]]]}"#,
        r#"{"id": 6, "status": "committed", "ops": [["r", 1, [1, 2]], ["r", 2, [2, 1]]]}"#,
        r#"{"id": 9, "status": "committed", "ops": [["r", 1, [3, 1, 2]], ["append", 3, 1]]}"#,
    ]);
    let kinds: Vec<(AnomalyKind, Vec<u64>)> = r.anomalies.iter().map(|a| (a.kind, a.txns.clone())).collect();
    assert_eq!(
        kinds,
        vec![(AnomalyKind::IncompatibleOrder, vec![9, 4, 5, 6]), (AnomalyKind::IncompatibleOrder, vec![5, 6]),],
        "{:#?}",
        r.anomalies
    );
    assert!(r.anomalies[0].explanation.contains("3 committed reads of key 1"));
}

#[test]
fn internal_read_must_see_own_appends() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["r", 1, []]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]], ["append", 2, 1]]}"#,
    ]);
    assert_only(&r, AnomalyKind::IncompatibleOrder, &[1]);
    assert!(r.anomalies[0].explanation.contains("internal"));
}

#[test]
fn internal_non_repeatable_read() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []], ["r", 1, [1]], ["append", 2, 1]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::IncompatibleOrder, &[2]);
}

#[test]
fn internal_future_read() {
    // T1 reads its own append before making it.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["r", 1, [7]], ["append", 1, 7]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [7]], ["append", 2, 1]]}"#,
    ]);
    assert_only(&r, AnomalyKind::IncompatibleOrder, &[1]);
}

#[test]
fn lost_append() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]]]}"#,
    ]);
    assert_only(&r, AnomalyKind::LostAppend, &[2, 3]);
}

#[test]
fn lost_append_respects_real_time() {
    // T2 was still running when the final read started: it may serialize after it.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 5}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]], "start_us": 6, "end_us": 30}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]]], "start_us": 20, "end_us": 25}"#,
    ]);
    assert_valid(&r);
    // Same history, T2 finished before the final read started: lost.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 5}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]], "start_us": 6, "end_us": 10}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]]], "start_us": 20, "end_us": 25}"#,
    ]);
    assert_only(&r, AnomalyKind::LostAppend, &[2, 3]);
}

/// A key retired during the run is checked at its retire read, as a key the final read reads
/// is at the end, even where the final read does not read it and whatever the times.
#[test]
fn an_append_missing_from_the_read_that_retired_its_key_is_lost() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 5}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]], "start_us": 6, "end_us": 30}"#,
        r#"{"id": 3, "status": "committed", "ops": [["retire", 1, [1]], ["append", 2, 7]], "start_us": 10, "end_us": 20}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 2, [7]]], "start_us": 40, "end_us": 41}"#,
    ]);
    assert_only(&r, AnomalyKind::LostAppend, &[2, 3]);
    // Retired with both: valid, and the retire read is a read like any other (T3 after T2).
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 1, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["retire", 1, [1, 2]], ["append", 2, 7]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 2, [7]]]}"#,
    ]);
    assert_valid(&r);
    // An aborted retire proves nothing and checks nothing.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "aborted", "ops": [["retire", 1, []], ["append", 2, 7]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 2, []]]}"#,
    ]);
    assert_valid(&r);
}

/// No append may follow a retire: one that committed after its key was retired (here after it
/// in real time too, and read by nobody) is missing from the retire read and flagged as lost,
/// though no final read reads the key.
#[test]
fn an_append_committed_after_its_key_was_retired_is_flagged() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 5}"#,
        r#"{"id": 2, "status": "committed", "ops": [["retire", 1, [1]], ["append", 2, 7]], "start_us": 10, "end_us": 20}"#,
        r#"{"id": 3, "status": "committed", "ops": [["append", 1, 3]], "start_us": 30, "end_us": 40}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 2, [7]]], "start_us": 50, "end_us": 51}"#,
    ]);
    assert_only(&r, AnomalyKind::LostAppend, &[3, 2]);
    // The same append aborted, or of unknown outcome: nothing to flag.
    for status in ["aborted", "unknown"] {
        let late =
            format!(r#"{{"id": 3, "status": "{status}", "ops": [["append", 1, 3]], "start_us": 30, "end_us": 40}}"#);
        let r = check(&[
            r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 5}"#,
            r#"{"id": 2, "status": "committed", "ops": [["retire", 1, [1]], ["append", 2, 7]], "start_us": 10, "end_us": 20}"#,
            &late,
            r#"{"id": 4, "status": "committed", "ops": [["r", 2, [7]]], "start_us": 50, "end_us": 51}"#,
        ]);
        assert_valid(&r);
    }
}

#[test]
fn a_retire_op_round_trips_and_is_not_a_final_read() {
    let line = r#"{"id":3,"status":"committed","ops":[["retire",1,[1,2]]]}"#;
    let t = dtx_check::parse_line(line, 1).expect("parses");
    assert_eq!(t.ops, vec![dtx_check::Op::Read { key: 1, list: Some(vec![1, 2]), retires: true }]);
    assert_eq!(serde_json::to_string(&t).expect("encodes"), line);
    // A last line of retires is no final read: the append it lacks is not looked for there.
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["append", 5, 2]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["retire", 1, [1]]]}"#,
    ]);
    assert_valid(&r);
}

#[test]
fn lost_append_ignores_unknown_and_aborted() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        r#"{"id": 2, "status": "unknown", "ops": [["append", 1, 2]]}"#,
        r#"{"id": 3, "status": "aborted", "ops": [["append", 1, 3]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]], ["r", 9, []]]}"#,
    ]);
    assert_valid(&r);
}

// ------------------------------------------------------------------ valid histories

#[test]
fn valid_serial_history() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["r", 1, []], ["append", 1, 1], ["r", 1, [1]]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]], ["append", 1, 2], ["append", 2, 1]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["append", 2, 2], ["r", 2, [1, 2]], ["append", 2, 3], ["r", 2, [1, 2, 3]]]}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1, 2]], ["r", 2, [1, 2, 3]]]}"#,
    ]);
    assert_valid(&r);
    assert_eq!(r.txns, 4);
    assert_eq!(r.committed, 4);
    assert_eq!(r.summary(), "valid: 4 txns (4 committed), no anomalies");
}

#[test]
fn valid_concurrent_history_out_of_line_order() {
    // Serializable in the order 3, 1, 2, 4 (ids and line order differ from it).
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["r", 2, [5]], ["append", 1, 1]], "start_us": 0, "end_us": 50}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, [1]], ["append", 2, 6]], "start_us": 10, "end_us": 60}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, []], ["append", 2, 5]], "start_us": 5, "end_us": 20}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [5, 6]]], "start_us": 70, "end_us": 80}"#,
    ]);
    assert_valid(&r);
}

#[test]
fn valid_with_aborted_and_unknown() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#,
        // aborted: appends invisible, a read that never returned
        r#"{"id": 2, "status": "aborted", "ops": [["append", 1, 2], ["r", 2, null]]}"#,
        // unknown and observed: it committed
        r#"{"id": 3, "status": "unknown", "ops": [["append", 1, 3], ["r", 1, null]]}"#,
        // unknown and never observed; its (junk) reads carry no information
        r#"{"id": 4, "status": "unknown", "ops": [["r", 1, [77, 78]], ["append", 2, 4]]}"#,
        // aborted with a junk read: ignored too
        r#"{"id": 5, "status": "aborted", "ops": [["r", 1, [3, 1]]]}"#,
        r#"{"id": 6, "status": "committed", "ops": [["r", 1, [1, 3]], ["append", 2, 6]]}"#,
        r#"{"id": 7, "status": "committed", "ops": [["r", 1, [1, 3]], ["r", 2, [6]]]}"#,
    ]);
    assert_valid(&r);
    assert_eq!(r.txns, 7);
    assert_eq!(r.committed, 3);
}

#[test]
fn empty_history_is_valid() {
    assert_valid(&check(&[]));
    assert_valid(&check(&["", "   "]));
}

// ------------------------------------------------------------------ input handling

#[test]
fn malformed_input_names_the_line() {
    let good = r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]]}"#;
    let cases = [
        (r#"{"id": 2, "status": "committed"}"#, "ops"),
        (r#"{"id": 2, "status": "maybe", "ops": []}"#, "maybe"),
        (r#"{"id": 2, "status": "committed", "ops": [["w", 1, 1]]}"#, "w"),
        (r#"{"id": 2, "status": "committed", "ops": [["append", 1]]}"#, "length"),
        (r#"{"id": 2, "status": "committed", "ops": [["append", 1, [1]]]}"#, "invalid type"),
        (r#"{"id": 2, "status": "committed", "ops": [["r", 1, 5]]}"#, "invalid type"),
        (r#"{"id": -2, "status": "committed", "ops": []}"#, "-2"),
        (r#"{"id": 2, "status": "committed", "ops": [], "start_us": 9, "end_us": 3}"#, "start_us"),
        (r#"{"id": 2, "status": "committed", "ops": ["#, "EOF"),
        ("not json", "expected"),
    ];
    for (bad, what) in cases {
        let text = format!("{good}\n\n{bad}\n{good}\n");
        let err = match check_reader(Cursor::new(text)) {
            Ok(r) => panic!("{bad} should be rejected, got {r:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.starts_with("line 3"), "{bad}: {err}");
        assert!(err.contains(what), "{bad}: {err} should mention {what}");
    }
}

#[test]
fn check_file_reads_and_reports_path_errors() {
    let dir = std::env::temp_dir().join(format!("dtx-check-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("history.jsonl");
    std::fs::write(
        &path,
        "{\"id\": 1, \"status\": \"committed\", \"ops\": [[\"append\", 1, 1]]}\n\
         {\"id\": 2, \"status\": \"committed\", \"ops\": [[\"r\", 1, [1]]]}\n",
    )
    .expect("write history");
    let r = check_file(&path).expect("check");
    assert!(r.valid);
    assert_eq!(r.txns, 2);
    std::fs::write(&path, "{\"id\": 1}\n").expect("write history");
    let err = format!("{:#}", check_file(&path).expect_err("must fail"));
    assert!(err.contains("line 1") && err.contains("history.jsonl"), "{err}");
    assert!(check_file(&dir.join("missing.jsonl")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_serializes_kind_names() {
    let r = check(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1], ["append", 2, 1]]}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []], ["r", 2, [1]]]}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, [1]]]}"#,
    ]);
    let json = serde_json::to_value(&r).expect("serialize");
    assert_eq!(json["valid"], false);
    assert_eq!(json["anomalies"][0]["kind"], "G-single");
    assert_eq!(json["counts"]["G-single"], 1);
    assert_eq!(json["anomalies"][0]["txns"], serde_json::json!([1, 2]));
}

#[test]
fn huge_cycle_does_not_overflow_the_stack() {
    // T_j appends 1 to key j and 2 to key j-1: key i's version order is [T_i, T_i+1], so the
    // ww edges form one cycle through all n transactions.
    use dtx_check::{check_history, Op, Status, Txn};
    let n = 200_000u64;
    let mut txns: Vec<Txn> = (0..n)
        .map(|j| Txn {
            id: j,
            status: Status::Committed,
            ops: vec![Op::Append { key: j, value: 1 }, Op::Append { key: (j + n - 1) % n, value: 2 }],
            start_us: None,
            end_us: None,
        })
        .collect();
    txns.push(Txn {
        id: n,
        status: Status::Committed,
        ops: (0..n).map(|key| Op::Read { key, list: Some(vec![1, 2]), retires: false }).collect(),
        start_us: None,
        end_us: None,
    });
    let r = check_history(&txns);
    assert_eq!(r.anomalies.len(), 1, "{}", r.summary());
    let a = &r.anomalies[0];
    assert_eq!(a.kind, AnomalyKind::G0);
    assert_eq!(a.txns, (0..n).collect::<Vec<_>>());
    assert!(a.explanation.contains("more edges"), "explanations stay short");
    assert!(a.explanation.len() < 10_000);
}

// ------------------------------------------------------------------ real-time order

fn check_realtime(lines: &[&str]) -> CheckReport {
    let txns = dtx_check::read_history(Cursor::new(lines.join("\n"))).expect("history should parse");
    dtx_check::check_history_realtime(&txns)
}

#[test]
fn a_stale_read_after_a_finished_write_is_serializable_but_not_strictly() {
    // T2 starts after T1's append was acknowledged and does not see it: T2 can be serialized
    // before T1, so the history is serializable, but not in real-time order.
    let lines = [
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 10}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []]], "start_us": 20, "end_us": 30}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]]], "start_us": 40, "end_us": 50}"#,
    ];
    assert_valid(&check(&lines));
    let r = check_realtime(&lines);
    assert_only(&r, AnomalyKind::Realtime, &[1, 2]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T1 -rt-> T2: T1 ended at 10 us, before T2 started at 20 us"), "{e}");
    assert!(e.contains("T2 -rw-> T1"), "{e}");
}

#[test]
fn overlapping_transactions_may_be_ordered_either_way() {
    // The same reads and writes, but T2 starts before T1 ends: no real-time order between them.
    let r = check_realtime(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 25}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 1, []]], "start_us": 20, "end_us": 30}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, [1]]], "start_us": 40, "end_us": 50}"#,
    ]);
    assert_valid(&r);
}

#[test]
fn real_time_order_is_transitive() {
    // T1 ends before T2 starts, T2 ends before T3 starts; T3 misses T1's append. T1 precedes T3
    // in real time though neither overlaps T2: the cycle is T1 -rt-> T3 -rw-> T1.
    let r = check_realtime(&[
        r#"{"id": 1, "status": "committed", "ops": [["append", 1, 1]], "start_us": 0, "end_us": 10}"#,
        r#"{"id": 2, "status": "committed", "ops": [["r", 2, []]], "start_us": 20, "end_us": 30}"#,
        r#"{"id": 3, "status": "committed", "ops": [["r", 1, []]], "start_us": 40, "end_us": 50}"#,
        r#"{"id": 4, "status": "committed", "ops": [["r", 1, [1]], ["r", 2, []]], "start_us": 60, "end_us": 70}"#,
    ]);
    assert_only(&r, AnomalyKind::Realtime, &[1, 3]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T1 -rt-> T3: T1 ended at 10 us, before T3 started at 40 us"), "{e}");
}

#[test]
fn a_stale_read_long_after_a_burst_of_acknowledgements_names_the_two_transactions() {
    // Commits acknowledged together (a watermark passing them), then short transactions one
    // after another, the last of which misses an append of the burst: the real-time order from
    // the burst to it passes every instant in between, and is told as one edge.
    let mut lines: Vec<String> = (1..=50)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "status": "committed", "ops": [["append", {i}, {i}]], "start_us": {i}, "end_us": 100}}"#
            )
        })
        .collect();
    lines.extend((51..=99).map(|i| {
        format!(
            r#"{{"id": {i}, "status": "committed", "ops": [["r", 1000, []]], "start_us": {}, "end_us": {}}}"#,
            2 * i,
            2 * i + 1
        )
    }));
    lines.push(r#"{"id": 100, "status": "committed", "ops": [["r", 7, []]], "start_us": 300, "end_us": 310}"#.into());
    lines.push(r#"{"id": 101, "status": "committed", "ops": [["r", 7, [7]]], "start_us": 400, "end_us": 410}"#.into());
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    assert_valid(&check(&lines));
    let r = check_realtime(&lines);
    assert_only(&r, AnomalyKind::Realtime, &[7, 100]);
    let e = &r.anomalies[0].explanation;
    assert!(e.contains("T7 -rt-> T100: T7 ended at 100 us, before T100 started at 300 us"), "{e}");
    assert!(e.contains("T100 -rw-> T7"), "{e}");
}
