//! A full disk under the write-ahead log and under the Raft journal, on a small filesystem this
//! test makes itself (a tmpfs of 1 or 3 MiB, mounted as root, unmounted at the end; where it
//! cannot be mounted the tests say so and skip): nothing more becomes durable (so no commit
//! waiting for it is acknowledged), it is said naming the file, and the log goes on once space
//! is freed; everything then recovers whole and in order. A bench run whose disk fills up ends
//! all the same, naming the file and the commits it held, and fails.

use dtx::replication::journal::{Journal, JournalEntry, JournalOp};
use dtx::wal::{Lsn, Wal, WalConfig};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmpfs of `size` mounted on a fresh directory; unmounted when dropped.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    /// None (said on stderr) where no tmpfs can be mounted: not root, or no `mount`.
    fn new(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs on {} (this test needs root)", dir.path().display());
            return None;
        }
        Some(SmallFs(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

fn record(i: u64) -> Vec<u8> {
    let mut r = format!("record {i:08} ").into_bytes();
    r.resize(1024, b'a' + (i % 26) as u8);
    r
}

fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while !done() {
        if t0.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_full_disk_holds_commits_back_and_the_log_goes_on_once_space_is_freed() {
    let Some(fs) = SmallFs::new("1m") else { return };
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![7u8; 640 << 10]).unwrap();
    let cfg = || WalConfig::new(fs.path().join("log"), 0xd15c, 0);
    let (wal, _) = Wal::open(cfg()).unwrap();

    // About 1 MiB of records where about 380 KiB are free.
    const RECORDS: Lsn = 1000;
    for i in 1..=RECORDS {
        assert_eq!(wal.append(&record(i)).unwrap(), i);
    }
    assert!(wait_until(Duration::from_secs(10), || wal.stats().disk_full_waits > 0), "the disk never filled up");
    let stuck_at = wal.durable_lsn();
    assert!(stuck_at < RECORDS, "{stuck_at} of {RECORDS} records durable on a full disk");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(wal.durable_lsn(), stuck_at, "nothing may become durable while the disk is full");

    std::fs::remove_file(&filler).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || wal.durable_lsn() == RECORDS),
        "the log did not go on once space was freed (durable {} of {RECORDS})",
        wal.durable_lsn()
    );
    wal.wait_durable(RECORDS).unwrap();
    wal.close();
    drop(wal);

    let (_, recovered) = Wal::open(cfg()).unwrap();
    let lsns: Vec<Lsn> = recovered.records.iter().map(|(lsn, _)| *lsn).collect();
    assert_eq!(lsns, (1..=RECORDS).collect::<Vec<_>>(), "every record, once, in order");
    for (lsn, bytes) in &recovered.records {
        assert_eq!(bytes, &record(*lsn), "record {lsn} whole");
    }
}

fn append_op(i: u64) -> JournalOp {
    JournalOp::Append { group: 0, entries: vec![JournalEntry { index: i, term: 1, data: record(i) }] }
}

#[test]
fn a_full_disk_under_the_raft_journal_keeps_its_ops_until_space_is_freed() {
    let Some(fs) = SmallFs::new("1m") else { return };
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![7u8; 640 << 10]).unwrap();
    let path = fs.path().join("raft.journal");
    let mut journal = Journal::create_file(&path, 0xd15c, 1).unwrap();
    let mut synced = 0;
    let full = loop {
        synced += 1;
        journal.write(&append_op(synced));
        match journal.sync() {
            Ok(()) => assert!(synced < 2000, "1 MiB never filled up"),
            Err(e) => break e,
        }
    };
    assert!(full.disk_full, "{full}");
    assert!(full.to_string().contains("raft.journal"), "names the file: {full}");
    let durable = synced - 1;
    let (_, ops) = Journal::open_file(&path, 0xd15c, 1).unwrap();
    assert_eq!(ops.len() as u64, durable, "the refused sync left nothing behind");
    // More ops arrive while the disk is full; they wait with the refused one.
    journal.write(&append_op(synced + 1));
    assert!(journal.sync().is_err_and(|e| e.disk_full));

    std::fs::remove_file(&filler).unwrap();
    journal.sync().expect("the journal goes on once space is freed");
    let (_, ops) = Journal::open_file(&path, 0xd15c, 1).unwrap();
    assert_eq!(ops, (1..=synced + 1).map(append_op).collect::<Vec<_>>(), "every op, once, in order");
}

/// `dtx bench --durability wal --data-dir` on a 3 MiB tmpfs that fills up mid-run: the log holds
/// its commits back (none is acknowledged without its record on disk), but the run still ends
/// at its deadline plus a bounded wait for room (`DISK_FULL_PATIENCE`), says which file could
/// not be written and how many commits were held, and the command fails.
#[test]
fn a_bench_run_whose_disk_fills_up_ends_naming_the_file_and_the_held_commits() {
    let Some(fs) = SmallFs::new("3m") else { return };
    let out_dir = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out_dir.path().join("stdout"), out_dir.path().join("stderr"));
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dtx"))
        .args(["bench", "--workload", "append", "--protocol", "occ", "--durability", "wal", "--duration", "4"])
        .args(["--warmup", "0", "--data-dir"])
        .arg(fs.path())
        .arg("--out")
        .arg(out_dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    // 4 s of run, 5 s of patience, and time to start and stop on a busy machine.
    let limit = Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t0.elapsed();
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let Some(status) = status else {
        panic!("the run had not ended {limit:?} after it started (killed)\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };
    let said = format!("exit {:?} after {took:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", status.code());
    assert!(!status.success(), "a run whose disk filled up succeeded: {said}");
    let fs_path = fs.path().display().to_string();
    let failure = stderr.lines().find(|l| l.contains("the run failed: the disk is full")).unwrap_or_else(|| {
        panic!("no line says the run failed on a full disk: {said}");
    });
    assert!(failure.contains(&fs_path) && failure.contains("commits were held"), "{failure}");
    assert_eq!(stderr.matches("the run failed").count(), 1, "said once: {said}");
}
