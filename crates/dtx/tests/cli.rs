//! The `dtx` command as a user runs it: bad input gives a one-line error and a non-zero exit;
//! `dtx protocols` follows its interface contract; `dtx check` flags a broken history.

use std::process::Command;

fn dtx(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dtx")).args(args).output().expect("dtx runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn bad_flags_are_rejected_with_a_reason() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--nodes", "0"], "--nodes 0"),
        (&["bench", "--delay", "fast"], "--delay"),
        (&["bench", "--protocol", "nope"], "unknown protocol `nope`"),
        (&["bench", "--protocol", "aria"], "planned"),
        (&["bench", "--theta", "-1"], "theta"),
        (&["bench", "--read-ratio", "2"], "--read-ratio"),
        (&["bench", "--distributed", "1.5"], "--distributed"),
        (&["bench", "--multi-partition", "1.5"], "--distributed 1.5"),
        (&["bench", "--hot-keys", "100", "--theta", "0.9"], "drop --theta 0.9"),
        (&["bench", "--keys", "0"], "--keys"),
        (&["bench", "--rate=-5"], "--rate -5 must be between 0"),
        (&["bench", "--rate", "NaN"], "--rate NaN must be between 0"),
        (&["bench", "--sim-cost-ns", "1,2,3"], "--sim-cost-ns: give four costs"),
        (&["bench", "--sim-cost-ns", "1,2,3,4,5,6,7,8,9,10"], "GRAPH-STEP per step of a wait-for graph's search"),
        (&["bench", "--workload", "tpcx"], "unknown workload `tpcx`"),
        (&["bench", "--runtime", "cloud"], "unknown runtime `cloud`: use sim, local or tcp"),
        (&["bench", "--faults", "meteor", "--runtime", "sim"], "unknown fault `meteor`"),
        (&["bench", "--faults", "crash"], "--runtime sim"),
        (&["bench", "--faults", "loss", "--runtime", "tcp"], "only --faults crash, pause and partition"),
        (&["bench", "--faults", "crash", "--runtime", "tcp"], "add --durability wal or replicated"),
        (&["bench", "--latency-matrix", "/nonexistent/m.txt"], "latency matrix"),
        (&["bench", "--workload", "tpcc", "--warehouses", "0"], "--warehouses 0"),
        (&["bench", "--workload", "tpcc", "--mix", "50,40,5,5,1"], "sums to 101"),
        (&["bench", "--workload", "tpcc", "--mix", "bogus"], "--mix `bogus`"),
        (&["bench", "--workload", "tpcc", "--neworder-remote", "1.5"], "--neworder-remote 1.5"),
        (&["bench", "--workload", "tpcc", "--payment-remote", "-0.1"], "--payment-remote -0.1"),
        (&["bench", "--workload", "ycsb", "--verify"], "no checker for ycsb"),
        (
            &["bench", "--protocol", "occ:lock_wait_us=5"],
            "protocol `occ` has no option `lock_wait_us` (its options: orphan_after_us, commit, epoch_us)",
        ),
        (
            &["bench", "--protocol", "maat:commit=epoch"],
            "commit=epoch is accepted by 2pl-nowait, 2pl-waitdie, occ, coco, sundial, tictoc, primo",
        ),
        (&["bench", "--protocol", "coco:epoch_us=0"], "epoch_us"),
        (&["bench", "--protocol", "occ:commit=wm"], "which only primo, tictoc, sundial have"),
        (&["bench", "--protocol", "maat:commit=wm"], "protocol `maat` does not take commit=wm"),
        (&["bench", "--protocol", "tictoc:commit=wm:wm_us=0"], "option `wm_us`: 0 is out of range"),
        (&["bench", "--protocol", "primo:wm_us=0"], "wm_us"),
        (&["bench", "--protocol", "primo:wcf=maybe"], "maybe"),
        (&["bench", "--protocol", "occ:commit=sometimes"], "sometimes"),
        (&["bench", "--protocol", "2pl-waitdie:lock_wait_us=soon"], "not a whole number"),
        (&["bench", "--protocol", "2pl-waitdie:lock_wait_us"], "not KEY=VALUE"),
        (&["protocols", "--options", "nope"], "unknown protocol `nope`"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=5@1s"], "`crash:node=5@1s`: there is no node 5"),
        (&["bench", "--placement", "everywhere"], "unknown placement `everywhere`"),
        (&["bench", "--placement", "per-region", "--protocol", "occ"], "protocol `occ` keeps one copy"),
        (&["bench", "--placement", "groups=2", "--nodes", "3", "--protocol", "occ"], "whole groups of 2"),
        (
            &["bench", "--placement", "per-region", "--nodes", "3", "--regions", "0,2,2", "--protocol", "occ"],
            "region 1 has no data node",
        ),
        (&["bench", "--regions", "0,1", "--nodes", "3"], "--regions names 2 nodes but --nodes is 3"),
        (&["bench", "--runtime", "sim", "--fault-at", "meteor:node=1@1s"], "unknown kind `meteor`"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1@soon"], "time: `soon` is not a time"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1@2"], "`2` has no unit"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1@1s+fast"], "duration: `fast` is not a time"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1"], "no time"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash@1s"], "which node?"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=x@1s"], "node `x` is not a node number"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1,by=2ms@1s"], "a crash takes no `by`"),
        (&["bench", "--runtime", "sim", "--fault-at", "delay:node=1@1s"], "add by=DURATION"),
        (&["bench", "--runtime", "sim", "--fault-at", "delay:node=1,by=1ms,messages=some@1s"], "use control"),
        (&["bench", "--protocol", "primo:commit=2pc"], "2pc"),
        (&["bench", "--runtime", "sim", "--fault-at", "delay:node=1,by=1ms,worker=5@1s"], "there is no worker 5"),
        (&["bench", "--runtime", "sim", "--fault-at", "cpu:node=1,factor=-2@0s"], "factor -2 must be above 0"),
        (&["bench", "--runtime", "sim", "--fault-at", "pause:node=0@9s"], "after the run's end"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:leader=0@1s"], "add --durability replicated"),
        (
            &["bench", "--runtime", "sim", "--durability", "replicated", "--fault-at", "crash:leader=4@1s"],
            "`crash:leader=4@1s`: there is no node 4",
        ),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:leader=x@1s"], "leader `x` is not a node number"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:role=wizard@1s"], "unknown role `wizard`"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:role=sequencer@1s"], "no node has role `sequencer`"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:role=data#2@1s"], "only 2 nodes have role `data`"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:role=data#x@1s"], "`x` is not a number"),
        (&["bench", "--runtime", "sim", "--fault-at", "crash:node=1,role=data@1s"], "name one target"),
        (&["bench", "--fault-at", "crash:node=1@1s"], "add --runtime sim or tcp"),
        (&["bench", "--runtime", "tcp", "--fault-at", "cpu:node=1,factor=3@0s"], "needs --runtime sim"),
        (&["bench", "--runtime", "tcp", "--fault-at", "crash:node=1@1s"], "add --durability wal or replicated"),
        (&["bench", "--election-timeout", "20ms"], "--election-timeout 20ms: give 30ms to 60s"),
        (&["bench", "--election-timeout", "155ms"], "a multiple of the replicator's 10ms tick"),
        (&["bench", "--election-timeout", "soon"], "--election-timeout"),
        (&["bench", "--bandwidth", "16"], "--bandwidth: `16` is not a link rate"),
        (&["bench", "--bandwidth", "1gbps", "--runtime", "local"], "add --runtime sim"),
    ];
    for (args, want) in cases {
        let (code, _out, err) = dtx(args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: stderr `{err}` lacks `{want}`");
        assert!(err.trim().lines().count() <= 2, "{args:?}: error should be short: {err}");
    }
}

#[test]
fn a_bad_latency_matrix_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.txt");
    std::fs::write(&m, "0 50ms\n50ms\n").unwrap();
    let (code, _, err) = dtx(&["bench", "--latency-matrix", m.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("square"), "{err}");
}

#[test]
fn a_bad_cluster_config_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c.toml");
    std::fs::write(&c, "workers = 1\n[[node]]\nadr = \"127.0.0.1:1\"\n").unwrap();
    let (code, _, err) = dtx(&["server", "--config", c.to_str().unwrap(), "--node", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("adr"), "{err}");
    let (code, _, err) = dtx(&["server", "--config", "/nonexistent.toml", "--node", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read cluster config"), "{err}");
}

#[test]
fn protocols_lists_name_status_description() {
    let (code, out, _) = dtx(&["protocols"]);
    assert_eq!(code, 0);
    for name in ["2pl-nowait", "2pl-waitdie", "occ", "sundial", "calvin", "primo"] {
        let line =
            out.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("{name} missing"));
        let status = line.split_whitespace().nth(1).unwrap();
        assert!(["ready", "planned"].contains(&status), "{line}");
    }
    // Ready protocols state what they promise: what --verify checks.
    for (name, guarantee) in
        [("2pl-waitdie", "strict-serializable"), ("occ", "strict-serializable"), ("sundial", "serializable")]
    {
        let line = out.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap();
        assert_eq!(line.split_whitespace().nth(2), Some(guarantee), "{line}");
    }
}

#[test]
fn check_realtime_flags_a_read_that_misses_a_finished_write() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("stale.jsonl");
    std::fs::write(
        &h,
        concat!(
            "{\"id\":1,\"status\":\"committed\",\"ops\":[[\"append\",1,7]],\"start_us\":0,\"end_us\":10}\n",
            "{\"id\":2,\"status\":\"committed\",\"ops\":[[\"r\",1,[]]],\"start_us\":20,\"end_us\":30}\n",
            "{\"id\":3,\"status\":\"committed\",\"ops\":[[\"r\",1,[7]]],\"start_us\":40,\"end_us\":50}\n",
        ),
    )
    .unwrap();
    let (code, out, _) = dtx(&["check", "--history", h.to_str().unwrap()]);
    assert_eq!(code, 0, "serializable: {out}");
    let (code, out, _) = dtx(&["check", "--realtime", "--history", h.to_str().unwrap()]);
    assert_eq!(code, 1, "not strictly serializable: {out}");
    assert!(out.contains("realtime: 1"), "{out}");
}

#[test]
fn check_flags_a_broken_history_and_passes_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "{\"id\":1,\"status\":\"committed\",\"ops\":[[\"append\",1,7]]}\n{\"id\":2,\"status\":\"committed\",\"ops\":[[\"r\",1,[7]]]}\n").unwrap();
    let (code, out, _) = dtx(&["check", "--history", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let bad = dir.path().join("bad.jsonl");
    // T1 and T2 each read the other's key before the other's append, then append: G2-style.
    std::fs::write(
        &bad,
        "{\"id\":1,\"status\":\"committed\",\"ops\":[[\"r\",2,[]],[\"append\",1,1]]}\n{\"id\":2,\"status\":\"committed\",\"ops\":[[\"r\",1,[]],[\"append\",2,2]]}\n{\"id\":3,\"status\":\"committed\",\"ops\":[[\"r\",1,[1]],[\"r\",2,[2]]]}\n",
    )
    .unwrap();
    let (code, out, _) = dtx(&["check", "--history", bad.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("G2"), "{out}");
}

#[test]
fn a_short_sim_bench_writes_json_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = dtx(&[
        "bench",
        "--runtime",
        "sim",
        "--workload",
        "append",
        "--verify",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--nodes",
        "2",
        "--inflight",
        "4",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let json = std::fs::read_to_string(dir.path().join("bench.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), dtx::protocols::ready_with(dtx::replication::Durability::None, 3).count());
    for r in runs {
        for field in [
            "protocol",
            "workload",
            "runtime",
            "nodes",
            "duration_s",
            "committed",
            "aborted",
            "throughput_tps",
            "abort_rate",
            "latency_us",
            "msgs_per_txn",
            "bytes_per_txn",
            "aborts_by_reason",
            "params",
        ] {
            assert!(!r[field].is_null(), "run lacks {field}: {r}");
        }
        assert_eq!(r["verified"], serde_json::Value::Bool(true));
    }
    let svg = std::fs::read_to_string(dir.path().join("bench.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));
}

/// Issue 75: keys came round after 64 generations, so a fast process's lists grew at its rate
/// for as long as the run lasted: this command at 0.5 s (after the default 0.5 s warm-up) wrote
/// a 5.7 GB history, reads about 1,000 values long. Each round is now a key of its own: the
/// longest list and the longest line stay where a short run leaves them however long the run,
/// and the history still checks (a retired key's appends all in the read that retired it, the
/// others in the final read).
#[test]
fn a_fast_append_run_s_history_lines_do_not_grow_with_its_length() {
    use dtx::workloads::append::APPENDS_PER_KEY;
    let dir = tempfile::tempdir().unwrap();
    // (Longest list of any read, longest line but the final read's, committed lines, retires.)
    let measure = |duration: &str| {
        let history = dir.path().join(format!("h-{duration}.jsonl"));
        let out_dir = dir.path().join(format!("out-{duration}"));
        let (code, out, err) = dtx(&[
            "bench",
            "--protocol",
            "silo",
            "--workload",
            "append",
            "--runtime",
            "sim",
            "--nodes",
            "3",
            "--keys",
            "8",
            "--delay",
            "200us",
            "--jitter",
            "100us",
            "--warmup",
            "0",
            "--duration",
            duration,
            "--history",
            history.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "--duration {duration}: the run or its check failed:\n{out}\n{err}");
        let text = std::fs::read_to_string(&history).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let (mut longest_list, mut committed, mut retires) = (0, 0, 0);
        for line in &lines {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            committed += (v["status"] == "committed") as u64;
            for op in v["ops"].as_array().unwrap() {
                retires += (op[0] == "retire") as u64;
                longest_list = longest_list.max(op[2].as_array().map_or(0, Vec::len));
            }
        }
        let longest_line = lines[..lines.len() - 1].iter().map(|l| l.len()).max().unwrap_or(0);
        eprintln!(
            "--duration {duration}: {} bytes, {committed} committed lines, {retires} retires, longest list \
             {longest_list}, longest line {longest_line} bytes",
            text.len()
        );
        (longest_list, longest_line, committed, retires)
    };
    let (short_list, short_line, short_committed, _) = measure("0.05");
    let (long_list, long_line, long_committed, retires) = measure("0.15");
    assert!(
        long_committed > 2 * short_committed,
        "the longer run committed {long_committed}, not thrice {short_committed}"
    );
    assert!(retires > 0, "the 0.15 s run never came round to a slot: it tests nothing");
    // A key takes a generation's appends, 8 keys' worth shared among 8: about APPENDS_PER_KEY
    // each (a binomial spread, and a straddling transaction's few beyond).
    let bound = 2 * APPENDS_PER_KEY as usize;
    assert!(long_list <= bound, "a read of {long_list} values, past {bound}");
    assert!(
        long_list <= short_list + short_list / 2,
        "lists grew with the run: {short_list} at 0.05 s, {long_list} at 0.15 s"
    );
    assert!(
        long_line <= 2 * short_line,
        "lines grew with the run: {short_line} bytes at 0.05 s, {long_line} at 0.15 s"
    );
}

/// Issue 75's Primo command: its replicated logs were never compacted. A host that crashed
/// (every second or so) reopened its replicas with the bytes applied since their snapshot
/// counted from 0, so no log reached `--snapshot-log-bytes`, and the logs and their journals
/// grew with the commits: no snapshot in 5 s at a 1 MiB threshold. A reopened log now counts
/// what it holds.
#[test]
fn logs_whose_hosts_keep_crashing_are_compacted_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let (code, out, err) = dtx(&[
        "bench",
        "--protocol",
        "primo",
        "--workload",
        "append",
        "--runtime",
        "sim",
        "--nodes",
        "3",
        "--replicas",
        "3",
        "--durability",
        "replicated",
        "--faults",
        "crash,loss",
        "--keys",
        "8",
        "--delay",
        "200us",
        "--jitter",
        "100us",
        "--duration",
        "5",
        "--seed",
        "24",
        "--snapshot-log-bytes",
        "1048576",
        "--out",
        out_dir,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let json = std::fs::read_to_string(dir.path().join("bench.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let run = &v["runs"][0];
    let failovers = run["extra"]["failovers"].as_f64().unwrap_or(0.0);
    assert!(failovers >= 10.0, "only {failovers} hosts crashed: the run tests nothing");
    let taken = run["counters"]["raft-snapshots-taken"].as_u64().unwrap_or(0);
    assert!(taken >= 9, "{taken} snapshots, fewer than one a replica: {}", run["counters"]);
}

/// Run a short simulated bench (0.2 s, no warm-up) with `args`; assert it succeeded and return
/// its stdout and JSON report.
fn short_sim_bench(args: &[&str]) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let mut argv = vec!["bench", "--runtime", "sim", "--duration", "0.2", "--warmup", "0", "--out", out_dir];
    argv.extend_from_slice(args);
    let (code, out, err) = dtx(&argv);
    assert_eq!(code, 0, "{out}\n{err}");
    let json = std::fs::read_to_string(dir.path().join("bench.json")).unwrap();
    (out, serde_json::from_str(&json).unwrap())
}

/// `--fault-at` by role: `role=R` is the first node with role R, `role=R#I` the I-th; the
/// faults land on those nodes (the JSON's `fault_events`), at the times named.
#[test]
fn a_fault_aimed_at_a_role_hits_the_node_that_has_it() {
    let (_, v) = short_sim_bench(&[
        "--protocol",
        "occ",
        "--workload",
        "append",
        "--nodes",
        "3",
        "--roles",
        "data+client,client,data+client+timestamp-server",
        "--fault-at",
        "pause:role=client#1@50ms+20ms;delay:role=timestamp-server,by=1ms@80ms+20ms",
    ]);
    let events: Vec<(&str, u64, f64)> = v["runs"][0]["fault_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["node"].as_u64().unwrap(), e["at_ms"].as_f64().unwrap()))
        .collect();
    assert_eq!(events, [("pause", 1, 50.0), ("delay", 2, 80.0)]);
}

#[test]
fn a_protocols_options_are_listed_with_type_default_and_help() {
    let (code, out, err) = dtx(&["protocols", "--options", "2pl-waitdie"]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.trim_start().starts_with("lock_wait_us")).expect("lock_wait_us listed");
    assert!(line.contains("default 500000") && line.contains("1..=60000000") && line.contains("lock"), "{line}");
    assert!(out.contains("orphan_after_us"), "{out}");
    let (code, out, err) = dtx(&["protocols", "--options", "detock"]);
    assert_eq!(code, 0, "{err}");
    let map = out.split("where it lives").nth(1).unwrap_or_else(|| panic!("a map of where it lives: {out}"));
    assert!(map.contains("protocols/depgraph.rs") && map.contains("protocols/calvin/sequencer.rs"), "{map}");
}

#[test]
fn a_variant_runs_beside_its_base_under_its_full_name() {
    let (out, v) = short_sim_bench(&[
        "--protocol",
        "2pl-waitdie,2pl-waitdie:lock_wait_us=50",
        "--theta",
        "0.99",
        "--keys",
        "1000",
    ]);
    let names: Vec<&str> = v["runs"].as_array().unwrap().iter().map(|r| r["protocol"].as_str().unwrap()).collect();
    assert_eq!(names, ["2pl-waitdie", "2pl-waitdie:lock_wait_us=50"]);
    assert!(out.lines().any(|l| l.starts_with("2pl-waitdie:lock_wait_us=50 ")), "the table names the variant: {out}");
    // The variant's short wait shows as lock timeouts, which the base (0.5 s) does not have.
    let timeouts = |i: usize| v["runs"][i]["aborts_by_reason"]["lock-timeout"].as_u64().unwrap_or(0);
    assert!(timeouts(1) > 0 && timeouts(0) == 0, "{}", v["runs"]);
    assert!(v["runs"][0]["counters"]["lock-waits"].as_u64().unwrap_or(0) > 0, "2PL counts its lock waits");
}

#[test]
fn experiments_list_and_bad_experiments_name_what_is_wrong() {
    let (code, out, _) = dtx(&["experiment", "list"]);
    assert_eq!(code, 0);
    for name in ["contention-sweep", "message-counts", "sim-calibration", "failover-timeline"] {
        assert!(out.contains(name), "{name} listed: {out}");
    }
    let (code, _, err) = dtx(&["experiment", "run", "no-such-figure"]);
    assert_eq!(code, 2);
    assert!(err.contains("no experiment `no-such-figure`") && err.contains("contention-sweep"), "{err}");
    // A malformed file names the file and the field.
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/contention-sweep.toml"))
        .unwrap();
    let cases = [
        (good.replace("kind = \"falling\"", "kind = \"downhill\""), "kind: unknown `downhill`"),
        (good.replace("workload = ", "wrkload = "), "[bench] wrkload"),
        (good.replace("param = \"theta\"", "param = \"thetta\""), "[sweep] param thetta"),
        (good.replace("of = \"occ\"", "of = \"occc\""), "`occc` is not among protocols"),
        (good.replace("duration = \"2\"", "duration = [2]"), "duration"),
    ];
    for (text, want) in cases {
        std::fs::write(dir.path().join("contention-sweep.toml"), &text).unwrap();
        let d = dir.path().to_str().unwrap();
        let (code, _, err) = dtx(&["experiment", "list", "--dir", d]);
        assert_eq!(code, 2, "{want}: {err}");
        assert!(err.contains("contention-sweep.toml") && err.contains(want), "wanted `{want}` in: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// `--election-timeout` reaches the replicas: a crashed node's log fails over after one to two
/// timeouts without its leader (plus the takeover), never before one.
#[test]
fn a_longer_election_timeout_holds_a_failover_back_as_long() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let args = [
        "bench",
        "--runtime",
        "sim",
        "--protocol",
        "occ",
        "--nodes",
        "3",
        "--workers",
        "1",
        "--keys",
        "1000",
        "--durability",
        "replicated",
        "--duration",
        "1.2",
        "--warmup",
        "0.1",
        "--fault-at",
        "crash:node=1@0.2s",
        "--election-timeout",
        "400ms",
        "--json",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_dtx"))
        .args(args)
        .arg(&json)
        .current_dir(dir.path())
        .output()
        .expect("dtx runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let extra = &report["runs"][0]["extra"];
    assert_eq!(extra["failovers"].as_f64(), Some(1.0), "{extra}");
    let failover_ms = extra["failover_ms_p50"].as_f64().expect("a failover time");
    assert!((400.0..1_000.0).contains(&failover_ms), "failed over in {failover_ms} ms with a 400 ms election timeout");
}
