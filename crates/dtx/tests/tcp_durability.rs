//! Durability of real `dtx server` processes (`--durability wal`): kill -9 the servers after a
//! run, restart them over the same data folders, and find every acknowledged commit still there;
//! and a log corrupted in the middle is refused with a message naming the file and the offset.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn dtx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dtx"))
}

/// A base port with room for both nodes' control and worker ports (base..base+5), on 127.0.0.1.
fn free_port() -> u16 {
    for _ in 0..100 {
        let p = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if p < 60_000 && (0..8).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
    panic!("no free ports on 127.0.0.1");
}

/// Two hand-started `dtx server` processes (1 worker each) with `--data-dir`, killed and waited
/// for when dropped, whatever the test did.
struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    data: PathBuf,
    controls: [u16; 2],
    servers: Vec<Option<Child>>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let base = free_port();
        let controls = [base, base + 3];
        let config = dir.path().join("cluster.toml");
        std::fs::write(
            &config,
            format!(
                "workers = 1\n[[node]]\naddr = \"127.0.0.1:{}\"\n[[node]]\naddr = \"127.0.0.1:{}\"\n",
                controls[0], controls[1]
            ),
        )
        .unwrap();
        let data = dir.path().join("data");
        let mut c = Cluster { dir, config, data, controls, servers: vec![None, None] };
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
        self.start_some(&[0, 1]);
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

    /// `dtx bench` against this cluster with durable logs under the cluster id `id`.
    fn bench(&self, protocol: &str, id: &str, duration: &str, history: &Path, verify: bool) -> Output {
        self.bench_command(protocol, id, duration, history, verify).output().unwrap()
    }

    fn bench_command(&self, protocol: &str, id: &str, duration: &str, history: &Path, verify: bool) -> Command {
        let out = self.dir.path().join(format!("results-{}", history.file_stem().unwrap().to_str().unwrap()));
        let mut cmd = dtx();
        cmd.args(["bench", "--runtime", "tcp", "--cluster", self.config.to_str().unwrap()])
            .args(["--workload", "append", "--protocol", protocol, "--durability", "wal", "--cluster-id", id])
            .args(["--duration", duration, "--warmup", "0.2", "--inflight", "16"])
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
    format!(
        "exit {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The last line of a history file (the final read-all transaction): its status and key -> list.
fn final_read(history: &Path) -> (String, BTreeMap<u64, Vec<u64>>) {
    let text = read(history);
    let last =
        text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_else(|| panic!("{} is empty", history.display()));
    let v: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{}: last line: {e}: {last}", history.display()));
    let mut lists = BTreeMap::new();
    for op in v["ops"].as_array().unwrap_or_else(|| panic!("no ops in the final read: {last}")) {
        assert_eq!(op[0], "r", "the final read has a non-read op: {last}");
        let key = op[1].as_u64().unwrap();
        let list = op[2].as_array().map(|l| l.iter().map(|x| x.as_u64().unwrap()).collect()).unwrap_or_default();
        lists.insert(key, list);
    }
    (v["status"].as_str().unwrap_or("").to_string(), lists)
}

#[test]
fn kill_9_servers_lose_no_acknowledged_commit() {
    let mut cluster = Cluster::start();
    for (protocol, id) in [("2pl-nowait", "d7a0000000000001"), ("occ", "d7a0000000000002")] {
        // Run 1: the history must be valid, so its final read holds every acknowledged append.
        let h1 = cluster.dir.path().join(format!("h1-{protocol}.jsonl"));
        let out = cluster.bench(protocol, id, "1", &h1, true);
        assert!(out.status.success(), "{protocol}: first run failed: {}", describe(&out));
        let (status, before) = final_read(&h1);
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
        let (status, after) = final_read(&h2);
        assert_eq!(
            status,
            "committed",
            "{protocol}: the final read after the restart did not commit: {}",
            describe(&out)
        );
        for (key, list) in &before {
            let now = after.get(key).map(Vec::as_slice).unwrap_or(&[]);
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
    let h1 = cluster.dir.path().join("h1.jsonl");
    let out = cluster.bench("occ", id, "0.5", &h1, true);
    assert!(out.status.success(), "first run failed: {}", describe(&out));
    cluster.kill_servers();

    // Flip a byte in the middle of node 1's first segment: far from its last record.
    let segs = segments(&cluster.data, id, 1);
    let seg = segs.first().unwrap_or_else(|| panic!("no wal-*.log under {}", cluster.data.display())).clone();
    let mut f = OpenOptions::new().read(true).write(true).open(&seg).unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len > 64 << 10, "{}: only {len} bytes, too few records to corrupt one in the middle", seg.display());
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
        // from its log (no clients: they died with it) and the bench reconnects.
        std::thread::sleep(Duration::from_millis(1500));
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
        let (status, lists) = final_read(&h);
        assert_eq!(status, "committed");
        assert!(lists.values().any(|l| !l.is_empty()), "{protocol}: nothing was appended");
        assert!(read(&cluster.server_log(1)).contains("resuming the unfinished run"));
    }
}
