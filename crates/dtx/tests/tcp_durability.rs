//! Durability of real `dtx server` processes: kill -9 the servers after a run (`--durability
//! wal`), restart them over the same data folders, and find every acknowledged commit still
//! there; kill one mid-run and find it back (`wal`: it recovers from its log; `replicated`: a
//! follower of its log takes its node over); cut the link between two servers mid-run, inside a
//! network namespace the test makes (`ip netns`, iptables), and find the run serializable and
//! whole once it heals; and a log corrupted in the middle is refused with a message naming the
//! file and the offset.

mod reap;
use reap::Reap;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Failovers at raft-rs's default, 100 ms, as in the simulator, not at tcp's 1 s: these tests
/// are about takeovers, and a pause of a few hundred ms must still cause one.
const FAST_ELECTIONS: [&str; 2] = ["--election-timeout", "100ms"];

fn dtx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dtx"))
}

/// Ports each server uses: control, one worker, replication.
const PORTS_PER_SERVER: u16 = 3;

/// A base port with room for `servers` servers' ports (one worker each), as the bench picks
/// its own: below the kernel's ephemeral range.
fn free_port(servers: u16) -> u16 {
    dtx::host::tcp::free_base_port(servers, PORTS_PER_SERVER - 2).expect("free ports on 127.0.0.1")
}

/// Hand-started `dtx server` processes (1 worker each) with `--data-dir`, killed and waited
/// for when dropped, whatever the test did.
struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    data: PathBuf,
    controls: Vec<u16>,
    servers: Vec<Option<Child>>,
}

impl Cluster {
    fn start() -> Cluster {
        Self::start_n(2)
    }

    fn start_n(n: u16) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let base = free_port(n);
        let controls: Vec<u16> = (0..n).map(|i| base + i * PORTS_PER_SERVER).collect();
        let config = dir.path().join("cluster.toml");
        let nodes: String = controls.iter().map(|p| format!("[[node]]\naddr = \"127.0.0.1:{p}\"\n")).collect();
        std::fs::write(&config, format!("workers = 1\n{nodes}")).unwrap();
        let data = dir.path().join("data");
        let servers = (0..n).map(|_| None).collect();
        let mut c = Cluster { dir, config, data, controls, servers };
        c.start_servers();
        c
    }

    /// Where server `n` writes its stdout and stderr (appended over restarts).
    fn server_log(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("server-{n}.log"))
    }

    fn spawn(&mut self, n: usize) {
        let log = OpenOptions::new().create(true).append(true).open(self.server_log(n)).unwrap();
        let child = dtx()
            .args(["server", "--config", self.config.to_str().unwrap(), "--node", &n.to_string()])
            .arg("--data-dir")
            .arg(&self.data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.servers[n] = Some(child);
    }

    /// Start both servers and wait until each answers a ping on its control port. A server that
    /// exits at once (its ports not yet reusable after a kill) is started again, until a deadline.
    fn start_servers(&mut self) {
        let all: Vec<usize> = (0..self.servers.len()).collect();
        self.start_some(&all);
    }

    fn start_some(&mut self, nodes: &[usize]) {
        for &n in nodes {
            self.spawn(n);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for &n in nodes {
            loop {
                if let Some(status) = self.servers[n].as_mut().unwrap().try_wait().unwrap() {
                    assert!(
                        Instant::now() < deadline,
                        "server {n} keeps exiting ({status}); its log:\n{}",
                        read(&self.server_log(n))
                    );
                    std::thread::sleep(Duration::from_millis(100));
                    self.spawn(n);
                    continue;
                }
                if ping(self.controls[n]) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "server {n} does not answer on 127.0.0.1:{} within 15 s; its log:\n{}",
                    self.controls[n],
                    read(&self.server_log(n))
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `kill -9` both servers (`Child::kill` is SIGKILL on Unix) and reap them.
    fn kill_servers(&mut self) {
        for s in self.servers.iter_mut() {
            if let Some(mut c) = s.take() {
                c.kill().unwrap();
                c.wait().unwrap();
            }
        }
    }

    /// `kill -9` one server and reap it.
    fn kill_server(&mut self, n: usize) {
        if let Some(mut c) = self.servers[n].take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Wait (up to 60 s) until the run of cluster id `id` started on server 0: its clients
    /// wrote their first attempt to the server's history file. A test that acts mid-run counts
    /// from here, not from spawning the bench, whose start-up takes longer on a busy machine.
    fn wait_run_started(&self, id: &str) {
        let path = self.data.join(id).join("history-node-0.jsonl");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::metadata(&path).map_or(true, |m| m.len() == 0) {
            assert!(Instant::now() < deadline, "the run never started: {} stayed empty", path.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `dtx bench` against this cluster with durable logs under the cluster id `id`.
    fn bench(&self, protocol: &str, id: &str, duration: &str, history: &Path, verify: bool) -> Output {
        self.bench_command(protocol, id, duration, history, verify).output().unwrap()
    }

    fn bench_command(&self, protocol: &str, id: &str, duration: &str, history: &Path, verify: bool) -> Command {
        self.bench_durable(protocol, "wal", id, duration, history, verify)
    }

    /// Where the bench of `history` writes its results (`bench.json`).
    fn results(&self, history: &Path) -> PathBuf {
        self.dir.path().join(format!("results-{}", history.file_stem().unwrap().to_str().unwrap()))
    }

    fn bench_durable(
        &self,
        protocol: &str,
        durability: &str,
        id: &str,
        duration: &str,
        history: &Path,
        verify: bool,
    ) -> Command {
        let out = self.results(history);
        let mut cmd = dtx();
        cmd.args(["bench", "--runtime", "tcp", "--cluster", self.config.to_str().unwrap()])
            .args(["--workload", "append", "--protocol", protocol, "--durability", durability, "--cluster-id", id])
            .args(["--duration", duration, "--warmup", "0.2", "--inflight", "16"])
            .args(FAST_ELECTIONS)
            .arg("--history")
            .arg(history)
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null());
        if verify {
            cmd.arg("--verify");
        }
        cmd
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("({}: {e})", p.display()))
}

/// True when 127.0.0.1:`port` answers `{"cmd":"ping"}` with ok.
fn ping(port: u16) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let Ok(mut w) = s.try_clone() else { return false };
    if w.write_all(b"{\"cmd\":\"ping\"}\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    if BufReader::new(s).read_line(&mut reply).is_err() {
        return false;
    }
    serde_json::from_str::<Value>(&reply).is_ok_and(|v| v["ok"] == true)
}

fn describe(o: &Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr);
    format!(
        "exit {}\n--- what failed\n{}\n--- stdout\n{}\n--- stderr\n{stderr}",
        o.status,
        failure_lines(&stderr),
        String::from_utf8_lossy(&o.stdout),
    )
}

/// The lines of a bench's stderr that say what failed (a failed check with the anomalies
/// after it, a run that could not end, a panic), first: a long log shown cut in the middle
/// must not hide them.
fn failure_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let failing = |l: &str| ["CHECK FAILED", "the run failed", " FAIL ", "panicked"].iter().any(|m| l.contains(m));
    let mut picked = Vec::new();
    for (i, l) in lines.iter().enumerate().filter(|(_, l)| failing(l)) {
        picked.push(*l);
        if l.contains("CHECK FAILED") {
            picked.extend(lines[i + 1..].iter().take(10).take_while(|a| a.starts_with("  ")));
        }
    }
    picked.join("\n")
}

/// The last line of a history file (the final read-all transaction): its status, and key -> list
/// as the run left it: as the final read read it, or, for a key the run retired (list-append
/// moves a slot on to a fresh key, and no append to the old one may follow), as the committed
/// transaction that retired it read it; and the keys the run retired.
fn final_read(history: &Path) -> (String, BTreeMap<u64, Vec<u64>>, BTreeSet<u64>) {
    let text = read(history);
    let last =
        text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_else(|| panic!("{} is empty", history.display()));
    let v: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{}: last line: {e}: {last}", history.display()));
    let list_of = |op: &Value| -> Vec<u64> {
        op[2].as_array().map(|l| l.iter().map(|x| x.as_u64().unwrap()).collect()).unwrap_or_default()
    };
    let (mut lists, mut retired) = (BTreeMap::new(), BTreeSet::new());
    for line in text.lines().filter(|l| l.contains("\"retire\"")) {
        let t: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", history.display()));
        if t["status"] != "committed" {
            continue;
        }
        for op in t["ops"].as_array().into_iter().flatten().filter(|op| op[0] == "retire") {
            lists.insert(op[1].as_u64().unwrap(), list_of(op));
            retired.insert(op[1].as_u64().unwrap());
        }
    }
    for op in v["ops"].as_array().unwrap_or_else(|| panic!("no ops in the final read: {last}")) {
        assert_eq!(op[0], "r", "the final read has a non-read op: {last}");
        lists.insert(op[1].as_u64().unwrap(), list_of(op));
    }
    (v["status"].as_str().unwrap_or("").to_string(), lists, retired)
}

#[test]
fn kill_9_servers_lose_no_acknowledged_commit() {
    let mut cluster = Cluster::start();
    for (protocol, id) in [("2pl-nowait", "d7a0000000000001"), ("occ", "d7a0000000000002")] {
        // Run 1: the history must be valid, so its final read holds every acknowledged append.
        let h1 = cluster.dir.path().join(format!("h1-{protocol}.jsonl"));
        let out = cluster.bench(protocol, id, "1", &h1, true);
        assert!(out.status.success(), "{protocol}: first run failed: {}", describe(&out));
        let (status, before, retired_before) = final_read(&h1);
        assert_eq!(status, "committed", "{protocol}: the first final read did not commit");
        let appended: usize = before.values().map(Vec::len).sum();
        assert!(appended > 0, "{protocol}: the first run appended nothing");

        cluster.kill_servers();
        cluster.start_servers();

        // Run 2 over the recovered logs. Not --verify'd: the values of run 1 have no writer in
        // its history; only its final read is compared with run 1's. (The bench still checks a
        // history it writes and exits 1 on the anomalies that follow from this, so only an error,
        // exit 2, fails here.)
        let h2 = cluster.dir.path().join(format!("h2-{protocol}.jsonl"));
        let out = cluster.bench(protocol, id, "0.3", &h2, false);
        assert!(
            out.status.code() != Some(2) && h2.exists(),
            "{protocol}: the run after the restart failed: {}",
            describe(&out)
        );
        let (status, after, _) = final_read(&h2);
        assert_eq!(
            status,
            "committed",
            "{protocol}: the final read after the restart did not commit: {}",
            describe(&out)
        );
        for (key, list) in &before {
            // A key run 1 retired is final: run 2 neither reads it (its slot holds a newer
            // round) nor appends to it.
            let kept = retired_before.contains(key).then_some(list.as_slice());
            let now = after.get(key).map(Vec::as_slice).or(kept).unwrap_or(&[]);
            assert!(
                now.starts_with(list),
                "{protocol}: key {key} lost acknowledged appends across kill -9 and restart:\n  \
                 before: {list:?}\n  after:  {now:?}\nhistories: {} {}\nserver logs:\n{}\n{}",
                h1.display(),
                h2.display(),
                read(&cluster.server_log(0)),
                read(&cluster.server_log(1)),
            );
        }
        let grown: usize = after.values().map(Vec::len).sum();
        eprintln!("{protocol}: {appended} appends acknowledged before kill -9, all recovered; {grown} after run 2");
    }
}

/// Node `n`'s WAL segments of cluster `id` under a server data folder, oldest first.
fn segments(data: &Path, id: &str, n: usize) -> Vec<PathBuf> {
    let dir = data.join(id).join(format!("node-{n}"));
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("wal-") && name.ends_with(".log")
        })
        .collect();
    segs.sort();
    segs
}

#[test]
fn a_corrupt_record_in_the_middle_of_a_log_is_refused_naming_file_and_offset() {
    let mut cluster = Cluster::start();
    let id = "d7a0000000000003";
    // Runs of 0.5 s, each over the logs of the last (the servers killed and started again in
    // between), until node 1's first segment holds more than 64 KiB: how much one run logs
    // depends on the machine's load.
    // The first run is verified; the later ones are not (the values of the earlier runs have no
    // writer in their histories), so only an error (exit 2) fails them.
    let t0 = Instant::now();
    let mut runs = 0;
    let (seg, len) = loop {
        runs += 1;
        let h1 = cluster.dir.path().join(format!("h1-{runs}.jsonl"));
        let out = cluster.bench("occ", id, "0.5", &h1, runs == 1);
        let ok = if runs == 1 { out.status.success() } else { out.status.code() != Some(2) };
        assert!(ok, "run {runs} before the corruption failed: {}", describe(&out));
        cluster.kill_servers();
        let segs = segments(&cluster.data, id, 1);
        let seg = segs.first().unwrap_or_else(|| panic!("no wal-*.log under {}", cluster.data.display())).clone();
        let len = std::fs::metadata(&seg).unwrap().len();
        if len > 64 << 10 {
            break (seg, len);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{}: only {len} bytes after {:?} of runs, too few records to corrupt one in the middle: the machine \
             is too busy",
            seg.display(),
            t0.elapsed()
        );
        cluster.start_servers();
    };

    // Flip a byte in the middle of node 1's first segment: far from its last record.
    let mut f = OpenOptions::new().read(true).write(true).open(&seg).unwrap();
    let at = len / 2;
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut byte).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[byte[0] ^ 0xff]).unwrap();
    f.sync_all().unwrap();
    drop(f);

    cluster.start_servers();
    let h2 = cluster.dir.path().join("h2.jsonl");
    let out = cluster.bench("occ", id, "0.3", &h2, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a run over a corrupt log succeeded: {}", describe(&out));
    let seg_name = seg.display().to_string();
    assert!(
        stderr.contains(&seg_name) && stderr.contains("offset"),
        "the error does not name {seg_name} and the offset: {}",
        describe(&out)
    );
    // The server refused the run but stays up.
    assert!(ping(cluster.controls[1]), "server 1 died on the corrupt log:\n{}", read(&cluster.server_log(1)));
}

#[test]
fn a_cluster_id_that_is_not_hex_is_refused() {
    let out = dtx()
        .args(["bench", "--runtime", "local", "--workload", "append", "--protocol", "occ"])
        .args(["--cluster-id", "xyz", "--duration", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--cluster-id: `xyz` is not a hexadecimal number"), "{e}");
    // One cluster id names one cluster's logs: several protocols would replay each other's.
    let out = dtx()
        .args(["bench", "--runtime", "local", "--workload", "append", "--cluster-id", "ab", "--duration", "0.1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("give one --protocol"), "{e}");
}

#[test]
fn a_server_killed_during_a_run_comes_back_and_loses_no_acknowledged_commit() {
    let mut cluster = Cluster::start();
    for (protocol, id) in [("2pl-nowait", "d7a1000000000001"), ("occ", "d7a1000000000002")] {
        let h = cluster.dir.path().join(format!("mid-{protocol}.jsonl"));
        let bench = cluster
            .bench_command(protocol, id, "3", &h, true)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Mid-run: kill -9 node 1, then start it again over its data folder. It resumes the run
        // from its log (its clients died with it; new ones run to the window's end) and the
        // bench reconnects.
        cluster.wait_run_started(id);
        std::thread::sleep(Duration::from_millis(1200));
        cluster.kill_server(1);
        cluster.start_some(&[1]);
        let out = bench.wait_with_output().unwrap();
        // --verify: the merged history (node 1's clients' attempts in flight at the kill are of
        // unknown outcome) is serializable and every acknowledged append is in the final read.
        assert!(
            out.status.success(),
            "{protocol}: the run with a server killed mid-way failed: {}\nserver logs:\n{}\n{}",
            describe(&out),
            read(&cluster.server_log(0)),
            read(&cluster.server_log(1))
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("waiting up to"), "{protocol}: the bench never lost node 1: {}", describe(&out));
        let (status, lists, _) = final_read(&h);
        assert_eq!(status, "committed");
        assert!(lists.values().any(|l| !l.is_empty()), "{protocol}: nothing was appended");
        assert!(read(&cluster.server_log(1)).contains("resuming the unfinished run"));
    }
}

/// The nemesis of `--faults crash,pause,partition` on tcp, for every ready protocol: the bench
/// kills (kill -9), stops (SIGSTOP) or cuts off (firewall rules in a network namespace of its
/// own) a random server of its own cluster every 700 ms and brings it back 200 ms later
/// (restarted over its data folder, SIGCONT, or the rules removed), for the whole run. Each
/// history is serializable with every acknowledged append in the final read, and the JSON lists
/// every fault with the time until its server answered again.
#[test]
fn random_servers_crashed_paused_and_cut_off_again_and_again_lose_nothing() {
    let runs = nemesis_runs("wal");
    assert!(
        runs.iter().all(|r| r["extra"]["served_again_ms_p50"].as_f64().is_some()),
        "the median time to serve again"
    );
}

/// The same nemesis with `--durability replicated --replicas 3`: a killed (or stopped, or cut
/// off) server's nodes are taken over by the replicas of their logs, and the server, restarted,
/// reopens its replicas from its Raft journal and rejoins every log it is a voter of (to be
/// hit again later).
#[test]
fn replicated_servers_crashed_paused_and_cut_off_again_and_again_rejoin_and_lose_nothing() {
    let runs = nemesis_runs("replicated");
    let failovers: f64 = runs.iter().map(|r| r["extra"]["failovers"].as_f64().unwrap_or(0.0)).sum();
    assert!(failovers >= 1.0, "no node was taken over in {} nemesis runs", runs.len());
    // The servers report their replicas' counters: a restarted one replayed its journal.
    let replayed: u64 = runs.iter().map(|r| r["counters"]["raft-journal-records-replayed"].as_u64().unwrap_or(0)).sum();
    assert!(replayed > 0, "no server reported reopening its Raft journal in {} nemesis runs", runs.len());
}

/// The nemesis on TPC-C with `--check`: servers killed and stopped with replicated logs, and
/// after the run TPC-C's consistency conditions checked on whichever server serves a node then
/// (a node given up after the run's end is served elsewhere). The two protocols whose runs
/// failed so (issue 34): Sundial's final checks met a server that had just given its node up
/// ("this server serves no node now"); a 2PL WAIT_DIE participant taken over between two
/// lock requests of a transaction committed writes whose locks died with the earlier
/// incarnation, and its worker's panic left the run waiting for its clients.
#[test]
fn replicated_tpcc_under_the_nemesis_passes_its_consistency_checks() {
    let tpcc = ["--workload", "tpcc", "--warehouses", "3", "--check", "--protocol", "sundial,2pl-waitdie"];
    let (runs, stderr) = nemesis_workload_runs(&tpcc);
    assert_eq!(runs.len(), 2);
    let checked = stderr.lines().filter(|l| l.contains(" checks, 0 failed") && !l.starts_with("dtx:")).count();
    assert_eq!(checked, 2, "every run's checks passed: {stderr}");
}

/// The same on the bank with `--verify`: the final audit and every audit that committed saw
/// the invariant total, on whichever servers serve the nodes at the end.
#[test]
fn replicated_bank_under_the_nemesis_keeps_its_total() {
    let bank = ["--workload", "bank", "--distributed", "0.5", "--verify", "--protocol", "2pl-waitdie"];
    let (runs, stderr) = nemesis_workload_runs(&bank);
    assert_eq!(runs.len(), 1);
    assert!(stderr.contains("pass bank total (final audit)"), "the final audit: {stderr}");
}

/// A 2.7 s replicated nemesis run (crashes and pauses every 700 ms, no partitions: no network
/// namespace needed) of `workload` (its own flags and protocols); asserts it ended within two
/// minutes with every run verified and faults injected; returns the runs' JSON and stderr.
fn nemesis_workload_runs(workload: &[&str]) -> (Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("nemesis.json");
    let mut bench = dtx();
    bench
        .args(["bench", "--runtime", "tcp", "--nodes", "3", "--durability", "replicated", "--replicas", "3"])
        .args(["--faults", "crash,pause", "--fault-every", "700ms", "--fault-duration", "200ms"])
        .args(["--duration", "2.5", "--warmup", "0.2"])
        .args(FAST_ELECTIONS)
        .args(workload);
    let (report, out) = bench_report(bench, dir.path(), &json, Duration::from_secs(120), "the nemesis run");
    let runs = report["runs"].as_array().unwrap().clone();
    for r in &runs {
        let protocol = r["protocol"].as_str().unwrap();
        assert_eq!(r["verified"], Value::Bool(true), "{protocol}: {}", describe(&out));
        let events = r["fault_events"].as_array().unwrap_or_else(|| panic!("{protocol}: no fault_events"));
        assert!(events.len() >= 2, "{protocol}: {} faults in a 2.7 s run, one every 700 ms", events.len());
    }
    (runs, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Runs the nemesis over every ready protocol with `--durability durability`; checks every run
/// verified, with its faults listed, and returns the runs' JSON.
fn nemesis_runs(durability: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("nemesis.json");
    let args = [
        "bench",
        "--runtime",
        "tcp",
        "--nodes",
        "3",
        "--durability",
        durability,
        "--faults",
        "crash,pause,partition",
        "--fault-every",
        "700ms",
        "--fault-duration",
        "200ms",
        "--duration",
        "2.5",
        "--warmup",
        "0.2",
        "--workload",
        "append",
        "--inflight",
        "4",
        "--verify",
        "--protocol",
        "all",
    ];
    let mut bench = dtx();
    bench.args(args).args(FAST_ELECTIONS).arg("--history").arg(dir.path().join("h.jsonl"));
    let what = format!("the {durability} nemesis run");
    let (report, out) = bench_report(bench, dir.path(), &json, Duration::from_secs(600), &what);
    let runs = report["runs"].as_array().unwrap().clone();
    let mode: dtx::replication::Durability = durability.parse().expect("a durability");
    let expected = dtx::protocols::ready_with(mode, 3).count();
    assert_eq!(runs.len(), expected, "a run per ready protocol that runs with --durability {durability}");
    let mut kinds = std::collections::BTreeSet::new();
    for r in &runs {
        let protocol = r["protocol"].as_str().unwrap();
        assert_eq!(r["verified"], Value::Bool(true), "{durability} {protocol}: {}", describe(&out));
        let events = r["fault_events"].as_array().unwrap_or_else(|| panic!("{protocol}: no fault_events"));
        assert!(events.len() >= 2, "{protocol}: {} faults in a 2.7 s run, one every 700 ms", events.len());
        for e in events {
            kinds.insert(e["kind"].as_str().unwrap().to_string());
            assert!(e["served_again_ms"].as_f64().is_some_and(|ms| ms >= 200.0), "{protocol}: {e}");
        }
    }
    assert_eq!(kinds.len(), 3, "crashes, pauses and partitions: {kinds:?}");
    // The firewall rules did cut: some partition dropped packets between the servers.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dropped =
        stderr.lines().filter_map(|l| l.split("the cut dropped ").nth(1)?.split(' ').next()?.parse::<u64>().ok());
    assert!(dropped.sum::<u64>() > 0, "no partition dropped a packet: {}", describe(&out));
    runs
}

/// `--fault-at` on tcp: the servers named, at the times named, and no others: node 1's
/// stopped (SIGSTOP) at 0.6 s for 200 ms, node 2's killed (kill -9) at 1.1 s and started again
/// 300 ms later, node 0's messages held 2 ms longer from 1.7 s for 300 ms. The JSON's
/// `fault_events` lists exactly these, in order, none before its time; the history is
/// serializable with every acknowledged append in the final read.
#[test]
fn targeted_faults_hit_the_named_servers_at_their_times() {
    let (events, out) = targeted_faults_run(&[
        "--durability",
        "wal",
        "--fault-at",
        "pause:node=1@600ms+200ms; crash:node=2@1100ms+300ms",
        "--fault-at",
        "delay:node=0,by=2ms@1700ms+300ms",
        "--duration",
        "2",
    ]);
    let got: Vec<(&str, u64)> =
        events.iter().map(|e| (e["kind"].as_str().unwrap(), e["node"].as_u64().unwrap())).collect();
    assert_eq!(got, [("pause", 1), ("crash", 2), ("delay", 0)], "{}", describe(&out));
    for (e, (at, down)) in events.iter().zip([(600.0, 200.0), (1100.0, 300.0), (1700.0, 300.0)]) {
        assert!(e["at_ms"].as_f64().unwrap() >= at, "{e}: before its time");
        assert_eq!(e["down_ms"].as_f64(), Some(down), "{e}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed node 2's server"), "{}", describe(&out));
}

/// `--fault-at crash:leader=0` on tcp: node 0's server is killed at 0.6 s and a follower of its
/// log takes node 0 over; at 3 s the nemesis asks the servers which leads node 0's log (the
/// `leads` control request) and kills that one, server 1 or 2, not server 0 (back as a
/// follower since 2.1 s). The history stays serializable.
#[test]
fn a_crash_aimed_at_a_logs_leader_kills_the_server_that_leads_it() {
    let (events, out) = targeted_faults_run(&[
        "--durability",
        "replicated",
        "--replicas",
        "3",
        "--fault-at",
        "crash:node=0@600ms+1500ms;crash:leader=0@3s+300ms",
        "--duration",
        "4",
    ]);
    let got: Vec<u64> = events.iter().map(|e| e["node"].as_u64().unwrap()).collect();
    assert!(got.len() == 2 && got[0] == 0 && (got[1] == 1 || got[1] == 2), "{got:?}: {}", describe(&out));
}

/// Several replicated logs per node on tcp, with the test protocol `multilog` (its data and
/// clients on node 0, two logs per node): node 0's server is killed at 1.5 s for 2 s, and
/// another server comes to lead both of its logs and serves it. With epochs (2 ms), what the
/// crash left unacknowledged ends as rolled back or with its killed clients. Both runs verified,
/// final read included.
#[test]
fn a_node_s_two_replicated_logs_fail_over_together_on_tcp() {
    for protocol in ["multilog:logs=2", "multilog:logs=2:epoch_us=2000"] {
        let (run, out) = targeted_faults_run_of(
            protocol,
            &["--durability", "replicated", "--replicas", "3", "--max-unacked", "2"],
            &["--fault-at", "crash:node=0@1500ms+2s", "--duration", "4"],
        );
        assert_eq!(run["fault_events"].as_array().map(Vec::len), Some(1), "{protocol}: {}", describe(&out));
        assert!(run["extra"]["failovers"].as_f64() > Some(0.0), "{protocol}: node 0 was not taken over: {run}");
        // What was not acknowledged ended as rolled back (an epoch the crash failed, whose
        // clients lived) or with its killed clients, never otherwise. Whether an epoch fails
        // with clients alive depends on the kill's timing; the simulator's sweep asserts it.
        let reasons = run["aborts_by_reason"].as_object().map(|m| m.keys().cloned().collect::<Vec<_>>());
        let known = ["rolled-back", "in-killed-incarnations"];
        assert!(
            reasons.unwrap_or_default().iter().all(|r| known.contains(&r.as_str())),
            "{protocol}: an abort of another kind: {run}"
        );
    }
}

/// A verified 3-node tcp bench of occ over list-append with `args` (its durability, faults and
/// duration): the run's `fault_events`, and what it printed.
fn targeted_faults_run(args: &[&str]) -> (Vec<Value>, Output) {
    let (run, out) = targeted_faults_run_of("occ", &[], args);
    let events = run["fault_events"].as_array().unwrap_or_else(|| panic!("no fault_events: {run}"));
    (events.clone(), out)
}

/// A verified 3-node tcp bench of `protocol` over list-append with `more` and `args` flags: its
/// run's JSON, and what it printed.
fn targeted_faults_run_of(protocol: &str, more: &[&str], args: &[&str]) -> (Value, Output) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("targeted.json");
    let mut bench = dtx();
    bench.args(["bench", "--runtime", "tcp", "--nodes", "3", "--protocol", protocol]).args(more).args(args);
    bench.args(FAST_ELECTIONS);
    bench.args(["--warmup", "0.2", "--workload", "append", "--inflight", "4", "--verify"]);
    let what = "the run with targeted faults";
    let (report, out) = bench_report(bench, dir.path(), &json, Duration::from_secs(180), what);
    let run = &report["runs"][0];
    assert_eq!(run["verified"], Value::Bool(true), "{}", describe(&out));
    (run.clone(), out)
}

/// Start a 3 s `--durability replicated --replicas 3 --verify` bench of `protocol` in the
/// background.
fn replicated_bench(cluster: &Cluster, protocol: &str, id: &str, history: &Path) -> Child {
    cluster
        .bench_durable(protocol, "replicated", id, "3", history, true)
        .args(["--replicas", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The bench `bench` succeeded (its history checked, every acknowledged append in its final
/// read), node 1 was taken over, and every server log says `expect`.
fn assert_node_1_moved(cluster: &Cluster, bench: Child, history: &Path, protocol: &str, expect: &[&str]) {
    let out = bench.wait_with_output().unwrap();
    let logs = (0..cluster.servers.len()).map(|n| read(&cluster.server_log(n))).collect::<Vec<_>>().join("\n");
    assert!(out.status.success(), "{protocol}: the run failed: {}\nserver logs:\n{logs}", describe(&out));
    for e in expect.iter().chain(&["took node 1 over"]) {
        assert!(logs.contains(e), "{protocol}: no server log says `{e}`:\n{logs}");
    }
    let (status, lists, _) = final_read(history);
    assert_eq!(status, "committed");
    assert!(lists.values().any(|l| !l.is_empty()), "{protocol}: nothing was appended");
}

#[test]
fn a_replicated_node_whose_server_is_killed_is_taken_over_and_loses_no_acknowledged_commit() {
    let mut cluster = Cluster::start_n(3);
    for (protocol, id) in [("2pl-nowait", "d7a2000000000001"), ("occ", "d7a2000000000002")] {
        let h = cluster.dir.path().join(format!("failover-{protocol}.jsonl"));
        let bench = replicated_bench(&cluster, protocol, id, &h);
        // Mid-run: kill -9 node 1, the leader of its log. Its followers (nodes 2 and 0) elect a
        // new leader, whose server rebuilds node 1 from its replica and serves it. Node 1's
        // server is started again: it reopens its replicas from its Raft journal and rejoins
        // every log it is a voter of.
        cluster.wait_run_started(id);
        std::thread::sleep(Duration::from_millis(1200));
        cluster.kill_server(1);
        std::thread::sleep(Duration::from_millis(500));
        cluster.start_some(&[1]);
        assert_node_1_moved(
            &cluster,
            bench,
            &h,
            protocol,
            &["its log replicas reopened from", "rejoined their groups"],
        );
        let report: Value = serde_json::from_str(&read(&cluster.results(&h).join("bench.json"))).unwrap();
        let extra = &report["runs"][0]["extra"];
        assert!(extra["failovers"].as_f64().unwrap_or(0.0) >= 1.0, "{protocol}: no failover reported: {report}");
        let ms = extra["failover_ms_max"].as_f64().unwrap_or(f64::NAN);
        assert!(ms > 0.0 && ms < 10_000.0, "{protocol}: failover took {ms} ms: {report}");
        eprintln!("{protocol}: node 1 served again {ms} ms after its server was killed");
    }
}

/// Send `signal` (e.g. `-STOP`) to a server process.
fn signal(child: &Child, signal: &str) {
    let ok = Command::new("kill").arg(signal).arg(child.id().to_string()).status().unwrap().success();
    assert!(ok, "kill {signal} {} failed", child.id());
}

#[test]
fn a_replicated_server_that_stalls_gives_its_node_up_to_the_new_leader() {
    let cluster = Cluster::start_n(3);
    let h = cluster.dir.path().join("stall.jsonl");
    let id = "d7a3000000000001";
    let bench = replicated_bench(&cluster, "occ", id, &h);
    // Mid-run: stop node 1's server for longer than an election takes (a stalled VM, a long
    // pause), then let it go on. A follower of node 1's log leads it meanwhile and waits for
    // node 1's ports; the old server, told of the new term when it runs again, gives the node
    // up (its incarnation can make nothing durable any more), and the new leader serves it.
    cluster.wait_run_started(id);
    std::thread::sleep(Duration::from_millis(900));
    let server = cluster.servers[1].as_ref().unwrap();
    signal(server, "-STOP");
    std::thread::sleep(Duration::from_millis(700));
    signal(server, "-CONT");
    assert_node_1_moved(&cluster, bench, &h, "occ", &["gave node 1 up"]);
}

/// A network namespace of this test's own (its own loopback, ports and firewall), deleted when
/// dropped with everything in it.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        // Unique per namespace made, not only per process: tests run in parallel threads.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("dtx-{tag}-{}-{seq}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let made = Command::new("ip").args(["netns", "add", &name]).status().is_ok_and(|s| s.success());
        assert!(made, "`ip netns add {name}` failed: this test needs root and iproute2 to make a network namespace");
        let ns = Netns(name);
        assert!(ns.run(&["ip", "link", "set", "lo", "up"]), "cannot bring up lo in {}", ns.0);
        ns
    }

    /// `cmd` inside the namespace.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, program]);
        c
    }

    fn run(&self, args: &[&str]) -> bool {
        self.command(args[0]).args(&args[1..]).status().is_ok_and(|s| s.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The output of `child`, killed (and the test failed) if it runs longer than `limit`: a hung
/// run must not hang the suite.
/// Run `bench` (a `dtx bench` command) in `dir` with `--json json`; asserts it ended
/// successfully within `limit` (naming it `what`); returns its report and output.
fn bench_report(mut bench: Command, dir: &Path, json: &Path, limit: Duration, what: &str) -> (Value, Output) {
    let child =
        bench.current_dir(dir).arg("--json").arg(json).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let out = output_within(child, limit);
    assert!(out.status.success(), "{what} failed: {}", describe(&out));
    (serde_json::from_str(&read(json)).unwrap(), out)
}

fn output_within(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}, killed: {}", describe(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Wait until `log` says its server listens (the servers live in a namespace the test's own
/// sockets cannot reach, so the log, not a ping, tells).
fn wait_listening(log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !read(log).contains("control on") {
        assert!(Instant::now() < deadline, "{} never said it listens:\n{}", log.display(), read(log));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_link_cut_between_two_servers_heals_and_loses_no_acknowledged_commit() {
    let ns = Netns::new("cut");
    let dir = tempfile::tempdir().unwrap();
    // A private loopback: fixed ports cannot collide with anything outside the namespace.
    let (control, worker) = ([21_000u16, 21_003], [21_001u16, 21_004]);
    let config = dir.path().join("cluster.toml");
    let nodes: String = control.iter().map(|p| format!("[[node]]\naddr = \"127.0.0.1:{p}\"\n")).collect();
    std::fs::write(&config, format!("workers = 1\n{nodes}")).unwrap();
    let dtx_path = env!("CARGO_BIN_EXE_dtx");
    // Reaped (killed) before the namespace goes, whatever the test did.
    let mut servers = Reap(Vec::new());
    for n in 0..2 {
        let log = dir.path().join(format!("server-{n}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = ns
            .command(dtx_path)
            .args(["server", "--config", config.to_str().unwrap(), "--node", &n.to_string()])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        servers.0.push(child);
        wait_listening(&log);
    }
    for protocol in ["2pl-nowait", "occ"] {
        cut_link_mid_run(&ns, &config, dir.path(), protocol, worker);
    }
}

/// One bench run over the two servers of `config` in `ns`, with the link between their worker
/// ports cut for 800 ms mid-run; it must pass `--verify` and show the dip.
fn cut_link_mid_run(ns: &Netns, config: &Path, dir: &Path, protocol: &str, worker: [u16; 2]) {
    let dtx_path = env!("CARGO_BIN_EXE_dtx");
    let h = dir.join(format!("cut-{protocol}.jsonl"));
    let results = dir.join(format!("results-{protocol}"));
    let bench = ns
        .command(dtx_path)
        .args(["bench", "--runtime", "tcp", "--cluster", config.to_str().unwrap(), "--workload", "append"])
        .args(["--protocol", protocol, "--durability", "wal", "--duration", "3", "--warmup", "0.2", "--inflight", "16"])
        .args(["--verify", "--history", h.to_str().unwrap(), "--out", results.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-run: drop every packet to or from either worker port for 800 ms (both directions of
    // the link between the two nodes; the bench's control connections stay up). Transactions
    // across the cut time out and abort; decisions and votes caught in it are resent once it
    // heals (TCP retransmits what the cut dropped).
    let ports = format!("{},{}", worker[0], worker[1]);
    let rule = ["INPUT", "-p", "tcp", "-m", "multiport", "--ports", &ports, "-j", "DROP"];
    std::thread::sleep(Duration::from_millis(1200));
    assert!(ns.run(&[&["iptables", "-A"][..], &rule[..]].concat()), "cannot add the firewall rule that cuts the link");
    std::thread::sleep(Duration::from_millis(800));
    assert!(ns.run(&[&["iptables", "-D"][..], &rule[..]].concat()), "cannot remove the firewall rule");
    let out = output_within(bench, Duration::from_secs(90));
    let logs = (0..2).map(|n| read(&dir.join(format!("server-{n}.log")))).collect::<Vec<_>>().join("\n");
    assert!(
        out.status.success(),
        "{protocol}: the run with a cut link failed: {}\nserver logs:\n{logs}",
        describe(&out)
    );
    let (status, lists, _) = final_read(&h);
    assert_eq!(status, "committed");
    assert!(lists.values().any(|l| !l.is_empty()), "nothing was appended");
    // The cut did bite: some second of the run committed far less than the best one.
    let report: Value = serde_json::from_str(&read(&results.join("bench.json"))).unwrap();
    let per_s: Vec<f64> = report["runs"][0]["throughput_per_s"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let best = per_s.iter().cloned().fold(0.0, f64::max);
    let worst = per_s.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(worst < best * 0.8, "no dip in the per-second throughput {per_s:?}: did the cut happen?");
    eprintln!("{protocol}: cut link: per-second commits {per_s:?}, aborts {}", report["runs"][0]["aborts_by_reason"]);
}

/// Machines of their own on one box: a namespace per host, each with its own IP (10.231.0.i+1)
/// on a bridge in a switch namespace. Deleted (with everything in them) when dropped.
struct Lan {
    _switch: Netns,
    hosts: Vec<Netns>,
}

impl Lan {
    fn new(n: usize) -> Lan {
        let switch = Netns::new("sw");
        assert!(
            switch.run(&["ip", "link", "add", "br0", "type", "bridge"])
                && switch.run(&["ip", "link", "set", "br0", "up"])
        );
        let mut hosts = Vec::new();
        for i in 0..n {
            let h = Netns::new(&format!("h{i}"));
            let (inside, outside) = (format!("vh{i}"), format!("vs{i}"));
            let ok = switch.run(&["ip", "link", "add", &inside, "type", "veth", "peer", "name", &outside])
                && switch.run(&["ip", "link", "set", &inside, "netns", &h.0])
                && switch.run(&["ip", "link", "set", &outside, "master", "br0"])
                && switch.run(&["ip", "link", "set", &outside, "up"])
                && h.run(&["ip", "addr", "add", &format!("{}/24", Lan::ip(i)), "dev", &inside])
                && h.run(&["ip", "link", "set", &inside, "up"]);
            assert!(ok, "cannot wire host {i} of the test network");
            hosts.push(h);
        }
        Lan { _switch: switch, hosts }
    }

    fn ip(i: usize) -> String {
        format!("10.231.0.{}", i + 1)
    }
}

#[test]
fn a_replicated_node_taken_over_on_another_machine_is_found_at_its_new_address() {
    take_node_1_over_on_a_lan(false);
}

#[test]
fn a_machine_that_vanishes_is_taken_over_and_its_old_connections_are_dropped() {
    take_node_1_over_on_a_lan(true);
}

/// Three machines on a LAN; node 1's server dies mid-run and another host takes node 1 over at
/// its own IP. With `vanish`, host 1 first drops off the network (its link goes down, so nothing
/// it had open is reset: a power loss), and comes back only after the takeover: the others must
/// drop their connections to its old address by themselves, when they learn the new one.
fn take_node_1_over_on_a_lan(vanish: bool) {
    let lan = Lan::new(3);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    let nodes: String = (0..3).map(|i| format!("[[node]]\naddr = \"{}:21000\"\n", Lan::ip(i))).collect();
    std::fs::write(&config, format!("workers = 1\n{nodes}")).unwrap();
    let dtx_path = env!("CARGO_BIN_EXE_dtx");
    let log = |n: usize| dir.path().join(format!("server-{n}.log"));
    let start = |n: usize| {
        let out = OpenOptions::new().create(true).append(true).open(log(n)).unwrap();
        let child = lan.hosts[n]
            .command(dtx_path)
            .args(["server", "--config", config.to_str().unwrap(), "--node", &n.to_string(), "--data-dir"])
            .arg(dir.path().join(format!("data-{n}")))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        wait_listening(&log(n));
        child
    };
    let mut servers = Reap(Vec::new());
    for n in 0..3 {
        servers.0.push(start(n));
    }
    let h = dir.path().join("moved.jsonl");
    let bench = lan.hosts[0]
        .command(dtx_path)
        .args(["bench", "--runtime", "tcp", "--cluster", config.to_str().unwrap(), "--workload", "append"])
        .args(["--protocol", "occ", "--durability", "replicated", "--replicas", "3", "--duration", "3"])
        .args(FAST_ELECTIONS)
        .args(["--warmup", "0.2", "--inflight", "16", "--verify", "--history", h.to_str().unwrap(), "--out"])
        .arg(dir.path().join("results"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-run: kill node 1's server. Its IP stays on host 1, so whichever host takes node 1 over
    // must listen on its own IP and tell the others where.
    std::thread::sleep(Duration::from_millis(1500));
    if vanish {
        assert!(lan.hosts[1].run(&["ip", "link", "set", "vh1", "down"]), "cannot take host 1 off the network");
    }
    let _ = servers.0[1].kill();
    let _ = servers.0[1].wait();
    std::thread::sleep(Duration::from_millis(if vanish { 1500 } else { 500 }));
    if vanish {
        assert!(lan.hosts[1].run(&["ip", "link", "set", "vh1", "up"]), "cannot bring host 1 back");
    }
    servers.0[1] = start(1);
    let out = output_within(bench, Duration::from_secs(90));
    let logs = (0..3).map(|n| read(&log(n))).collect::<Vec<_>>().join("\n");
    assert!(out.status.success(), "the run failed: {}\nserver logs:\n{logs}", describe(&out));
    let moved = if vanish { &["moved from"][..] } else { &[][..] };
    for e in ["took node 1 over", "node 1 listens at", "node 1 now listens at"].iter().chain(moved) {
        assert!(logs.contains(e), "no server log says `{e}`:\n{logs}");
    }
    let (status, lists, _) = final_read(&h);
    assert_eq!(status, "committed");
    assert!(lists.values().any(|l| !l.is_empty()), "nothing was appended");
}
