//! The WAL's tests: format round trips, recovery of torn and corrupt logs, group commit,
//! checkpoints, the directory lock, bounds.

use super::writer::*;
use super::*;
use std::sync::atomic::AtomicUsize;

#[test]
fn one_log_is_open_in_one_place_at_a_time_and_a_stale_lock_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || WalConfig { fsync: false, ..WalConfig::new(dir.path(), 7, 1) };
    let (a, _) = Wal::open(cfg()).unwrap();
    let err = Wal::open(cfg()).err().expect("a second open of a live log is refused");
    assert!(matches!(err, WalError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("--data-dir"), "{err}");
    a.close();
    drop(a);
    let (b, _) = Wal::open(cfg()).expect("closed: free again");
    drop(b);
    // A lock left by a process that is gone (kill -9): u32::MAX is never a live pid.
    fs::write(dir.path().join(LOCK_FILE), u32::MAX.to_string()).unwrap();
    Wal::open(cfg()).expect("a stale lock is taken over");
}

fn config(dir: &Path) -> WalConfig {
    let mut cfg = WalConfig::new(dir, 42, 3);
    cfg.fsync = false;
    cfg.group_commit_delay_us = 100;
    cfg
}

fn payload(i: u64) -> Vec<u8> {
    format!("record number {i} {}", "x".repeat((i % 37) as usize)).into_bytes()
}

fn append_all(wal: &Wal, range: Range<u64>) {
    for i in range {
        let lsn = wal.append(&payload(i)).unwrap();
        assert_eq!(lsn, i);
    }
}

fn assert_records(recovered: &Recovered, range: Range<u64>) {
    let lsns: Vec<Lsn> = recovered.records.iter().map(|(lsn, _)| *lsn).collect();
    assert_eq!(lsns, range.clone().collect::<Vec<_>>());
    for (lsn, bytes) in &recovered.records {
        assert_eq!(bytes, &payload(*lsn), "payload of LSN {lsn}");
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    list_dir(dir).unwrap().segments.into_iter().map(|(_, p)| p).collect()
}

/// The offset of the last record in a segment file.
fn last_record_offset(path: &Path) -> usize {
    let bytes = fs::read(path).unwrap();
    let decoded = decode_records(&bytes, SEGMENT_HEADER_BYTES);
    assert_eq!(decoded.end, Tail::Clean);
    decoded.records.last().unwrap().1.start - RECORD_HEADER_BYTES
}

fn flip_byte(path: &Path, offset: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset] ^= 0x5a;
    fs::write(path, bytes).unwrap();
}

#[test]
fn wal_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Wal>();
}

#[test]
fn format_round_trips_and_classifies_tails() {
    let mut bytes = Vec::new();
    for lsn in 7..10 {
        encode_record(lsn, &payload(lsn), &mut bytes);
    }
    let decoded = decode_records(&bytes, 0);
    assert_eq!(decoded.end, Tail::Clean);
    assert_eq!(decoded.records.iter().map(|r| r.0).collect::<Vec<_>>(), vec![7, 8, 9]);
    assert_eq!(&bytes[decoded.records[1].1.clone()], &payload(8)[..]);
    let last_at = decoded.records[2].1.start - RECORD_HEADER_BYTES;
    let mut zero_padded = bytes[..last_at + 5].to_vec();
    zero_padded.extend_from_slice(&[0; 100]);
    assert_eq!(decode_records(&zero_padded, 0).end, Tail::Torn { offset: last_at });
    let mut header = Vec::new();
    let segment = SegmentHeader { cluster_id: 1, node: 2, first_lsn: 3 };
    encode_segment_header(&segment, &mut header);
    assert_eq!(header.len(), SEGMENT_HEADER_BYTES);
    assert_eq!(decode_segment_header(&header), Ok(segment));
    let mut checkpoint = Vec::new();
    let ckpt = CheckpointHeader { cluster_id: 1, node: 2, lsn: 3 };
    encode_checkpoint(&ckpt, b"snap", &mut checkpoint);
    assert_eq!(decode_checkpoint(&checkpoint), Ok((ckpt, CHECKPOINT_HEADER_BYTES..CHECKPOINT_HEADER_BYTES + 4)));
}

#[test]
fn round_trip_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 1024;
    let (wal, recovered) = Wal::open(cfg.clone()).unwrap();
    assert!(recovered.records.is_empty() && recovered.checkpoint.is_none());
    append_all(&wal, 1..301);
    wal.wait_durable(300).unwrap();
    wal.close();
    drop(wal);
    let segments = segment_files(dir.path());
    assert!(segments.len() > 5, "only {} segments", segments.len());
    for path in &segments {
        assert!(fs::metadata(path).unwrap().len() <= 1024 || last_record_offset(path) == SEGMENT_HEADER_BYTES);
    }
    let (wal, recovered) = Wal::open(cfg.clone()).unwrap();
    assert_records(&recovered, 1..301);
    assert_eq!(recovered.torn_tail, None);
    append_all(&wal, 301..351);
    drop(wal);
    let (_wal, recovered) = Wal::open(cfg).unwrap();
    assert_records(&recovered, 1..351);
}

#[test]
fn group_commit_shares_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = WalConfig::new(dir.path(), 42, 3);
    cfg.group_commit_delay_us = 1000;
    let (wal, _) = Wal::open(cfg).unwrap();
    let callbacks = Arc::new(AtomicUsize::new(0));
    let seen = callbacks.clone();
    wal.set_on_durable(Box::new(move |_, _| {
        seen.fetch_add(1, Ordering::Relaxed);
    }));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for _round in 0..10 {
                    let last = (0..100).map(|i| wal.append(&payload(i)).unwrap()).max().unwrap();
                    wal.wait_durable(last).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(wal.durable_lsn(), 4000);
    wal.close(); // joins the flusher, so every callback has run
    let stats = wal.stats();
    assert_eq!(stats.records, 4000);
    assert!(stats.fsyncs >= 1 && stats.fsyncs * 10 <= stats.records, "{stats:?}");
    assert!(stats.flushes_by_time >= 1, "{stats:?}");
    assert!(stats.fsync_max_ns > 0 && stats.fsync_total_ns >= stats.fsync_max_ns);
    assert_eq!(callbacks.load(Ordering::Relaxed) as u64, stats.flushes_by_size + stats.flushes_by_time);
}

#[test]
fn flush_by_size_and_memory_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.group_commit_delay_us = 1_000_000;
    cfg.group_commit_bytes = 1 << 20;
    let (wal, _) = Wal::open_bounded(cfg.clone(), 2048).unwrap();
    // 100 KB through a 2 KiB bound: with 10 KB, a flusher that kept up on a busy machine left
    // the appender no wait to count (seen once, with every flush by size).
    append_all(&wal, 1..2001);
    wal.close();
    let stats = wal.stats();
    assert!(stats.append_waits > 0 && stats.flushes_by_size > 0, "{stats:?}");
    drop(wal);
    let (_wal, recovered) = Wal::open(cfg).unwrap();
    assert_records(&recovered, 1..2001);
}

fn torn_tail_case(damage: impl Fn(&Path, usize)) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..21);
    drop(wal);
    let segment = segment_files(dir.path()).pop().unwrap();
    let last_at = last_record_offset(&segment);
    damage(&segment, last_at);
    let (wal, recovered) = Wal::open(cfg.clone()).unwrap();
    assert_records(&recovered, 1..20);
    assert_eq!(recovered.torn_tail, Some((segment.clone(), last_at as u64)));
    assert_eq!(fs::metadata(&segment).unwrap().len(), last_at as u64);
    append_all(&wal, 20..31);
    drop(wal);
    let (_wal, recovered) = Wal::open(cfg).unwrap();
    assert_records(&recovered, 1..31);
    assert_eq!(recovered.torn_tail, None);
}

#[test]
fn torn_tail_cut_in_half_is_cut_off() {
    torn_tail_case(|path, last_at| {
        let len = fs::metadata(path).unwrap().len();
        let half = (len - last_at as u64) / 2;
        OpenOptions::new().write(true).open(path).unwrap().set_len(last_at as u64 + half).unwrap();
    });
}

#[test]
fn torn_tail_with_bad_checksum_is_cut_off() {
    torn_tail_case(|path, last_at| flip_byte(path, last_at + RECORD_HEADER_BYTES + 3));
}

#[test]
fn torn_tail_followed_by_zeros_is_cut_off() {
    torn_tail_case(|path, last_at| {
        let mut bytes = fs::read(path).unwrap();
        bytes.truncate(last_at + 9);
        bytes.extend_from_slice(&[0; 4096]);
        fs::write(path, bytes).unwrap();
    });
}

#[test]
fn mid_log_corruption_stops_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..21);
    drop(wal);
    let segment = segment_files(dir.path()).pop().unwrap();
    let bytes = fs::read(&segment).unwrap();
    let decoded = decode_records(&bytes, SEGMENT_HEADER_BYTES);
    let middle_at = decoded.records[9].1.start - RECORD_HEADER_BYTES;
    flip_byte(&segment, middle_at + RECORD_HEADER_BYTES + 2);
    let error = Wal::open(cfg).err().expect("corruption must stop recovery");
    let message = error.to_string();
    assert!(matches!(error, WalError::Corrupt { offset, .. } if offset == middle_at as u64), "{message}");
    let name = segment.file_name().unwrap().to_str().unwrap();
    assert!(message.contains(name) && message.contains(&format!("offset {middle_at}")), "{message}");
    assert_eq!(fs::read(&segment).unwrap().len(), bytes.len(), "a corrupt log must not be truncated");
}

#[test]
fn bad_record_in_an_earlier_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 512;
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..101);
    drop(wal);
    let first = segment_files(dir.path()).remove(0);
    let last_at = last_record_offset(&first);
    flip_byte(&first, last_at + RECORD_HEADER_BYTES);
    let message = Wal::open(cfg).err().expect("must fail").to_string();
    assert!(message.contains(first.to_str().unwrap()) && message.contains(&format!("offset {last_at}")), "{message}");
}

#[test]
fn missing_segment_is_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 512;
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..101);
    drop(wal);
    let segments = segment_files(dir.path());
    fs::remove_file(&segments[1]).unwrap();
    let message = Wal::open(cfg).err().expect("must fail").to_string();
    assert!(message.contains(segments[2].to_str().unwrap()) && message.contains("missing"), "{message}");
}

/// A log written by a build of another format version is refused as such (not as a corrupt
/// log, and never read: format 1's checksums would fail and read as a torn tail).
#[test]
fn a_log_of_another_format_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..4);
    drop(wal);
    let segment = &segment_files(dir.path())[0];
    let mut bytes = fs::read(segment).unwrap();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    fs::write(segment, &bytes).unwrap();
    let error = Wal::open(cfg).err().expect("another version must be refused");
    assert!(matches!(error, WalError::OtherVersion { found: 1, .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(segment.to_str().unwrap()) && message.contains("--data-dir"), "{message}");
}

#[test]
fn checkpoint_replaces_old_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.segment_bytes = 512;
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..101);
    wal.wait_durable(100).unwrap(); // segments are created as the flusher writes
    let before = segment_files(dir.path()).len();
    wal.checkpoint(60, b"state at 60").unwrap();
    let after = segment_files(dir.path());
    assert!(after.len() < before && after.len() >= 2, "{before} -> {}", after.len());
    let oldest_first_lsn = list_dir(dir.path()).unwrap().segments[0].0;
    assert!(oldest_first_lsn <= 61, "records 61.. must survive");
    assert!(wal.checkpoint(50, b"older").is_err());
    assert!(matches!(wal.checkpoint(1000, b"future"), Err(WalError::BadCheckpoint { .. })));
    drop(wal);
    fs::write(temp_path(&checkpoint_path(dir.path(), 90)), b"half a checkpo").unwrap();
    let (wal, recovered) = Wal::open(cfg.clone()).unwrap();
    assert_eq!(recovered.checkpoint, Some((60, b"state at 60".to_vec())));
    assert_records(&recovered, 61..101);
    assert!(!temp_path(&checkpoint_path(dir.path(), 90)).exists(), "temp checkpoint removed");
    append_all(&wal, 101..121);
    wal.checkpoint(120, b"state at 120").unwrap();
    assert!(!checkpoint_path(dir.path(), 60).exists(), "superseded checkpoint removed");
    drop(wal);
    let (_wal, recovered) = Wal::open(cfg).unwrap();
    assert_eq!(recovered.checkpoint, Some((120, b"state at 120".to_vec())));
    assert!(recovered.records.is_empty());
}

#[test]
fn corrupt_newest_checkpoint_falls_back_or_fails() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..11);
    wal.checkpoint(5, b"five").unwrap();
    drop(wal);
    // An older checkpoint whose records are all still in the log, as after a crash between
    // writing a new checkpoint and deleting the old one.
    let mut older = Vec::new();
    encode_checkpoint(&CheckpointHeader { cluster_id: 42, node: 3, lsn: 2 }, b"two", &mut older);
    fs::write(checkpoint_path(dir.path(), 2), older).unwrap();
    flip_byte(&checkpoint_path(dir.path(), 5), CHECKPOINT_HEADER_BYTES + 1);
    let (wal, recovered) = Wal::open(cfg.clone()).unwrap();
    assert_eq!(recovered.checkpoint, Some((2, b"two".to_vec())));
    assert_records(&recovered, 3..11);
    drop(wal);
    flip_byte(&checkpoint_path(dir.path(), 2), CHECKPOINT_HEADER_BYTES);
    let message = Wal::open(cfg).err().expect("no valid checkpoint left").to_string();
    assert!(message.contains("checkpoint-00000000000000000002.ckpt"), "{message}");
}

#[test]
fn foreign_cluster_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.cluster_id = 1111;
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    append_all(&wal, 1..3);
    drop(wal);
    cfg.cluster_id = 2222;
    let error = Wal::open(cfg).err().expect("another cluster's directory");
    let message = error.to_string();
    assert!(matches!(error, WalError::ForeignCluster { .. }), "{message}");
    assert!(message.contains("1111") && message.contains("2222") && message.contains("--data-dir"), "{message}");
}

#[test]
fn oversized_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(config(dir.path())).unwrap();
    let error = wal.append(&vec![0u8; MAX_RECORD_BYTES + 1]).unwrap_err();
    assert!(matches!(error, WalError::RecordTooLarge { .. }));
    assert!(error.to_string().contains(&format!("{} bytes", MAX_RECORD_BYTES + 1)), "{error}");
    assert_eq!(wal.append(b"fits").unwrap(), 1, "a refused record takes no LSN");
    wal.close();
    assert!(matches!(wal.append(b"late"), Err(WalError::Closed { .. })));
    assert_eq!(wal.durable_lsn(), 1);
}

/// Records appended to two lanes get their LSNs at the cut, in one file: each lane's records in
/// order, every record once; the on-durable callback reports each lane's last durable record;
/// a lane record's `head` runs under its lane's lock with the record's number in the lane.
#[test]
fn lanes_are_cut_into_one_file_and_report_their_durable_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.lanes = 2;
    cfg.segment_bytes = 4096;
    let (wal, _) = Wal::open(cfg.clone()).unwrap();
    let marks = Arc::new(Mutex::new(vec![0u64, 0]));
    let seen = marks.clone();
    wal.set_on_durable(Box::new(move |_, m| seen.lock().copy_from_slice(m)));
    let threads: Vec<_> = (0..2usize)
        .map(|lane| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 1..=300u64 {
                    let n = wal.append_to_lane(lane, &payload(i), |n| [lane as u8, n as u8]).unwrap();
                    assert_eq!(n, i, "a lane numbers its own records");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    wal.wait_durable(600).unwrap();
    assert_eq!(*marks.lock(), vec![300, 300]);
    assert!(wal.append_to_lane(1, b"x", |_| [0u8; 0]).is_ok());
    wal.close();
    assert!(wal.append_to_lane(0, b"x", |_| [0u8; 0]).is_err(), "a closed log refuses lane appends");
    assert_eq!(wal.stats().records, 601);
    drop(wal);
    let (_wal, recovered) = Wal::open(cfg).unwrap();
    let lsns: Vec<Lsn> = recovered.records.iter().map(|(lsn, _)| *lsn).collect();
    assert_eq!(lsns, (1..=601).collect::<Vec<_>>(), "contiguous LSNs across segments");
    assert!(segment_files(dir.path()).len() > 3);
    for lane in 0..2u8 {
        let numbers: Vec<u8> = recovered.records.iter().filter(|(_, r)| r[0] == lane).map(|(_, r)| r[1]).collect();
        let expected: Vec<u8> = (1..=300u64).map(|n| n as u8).collect();
        if lane == 0 {
            assert_eq!(numbers, expected, "lane 0's records in its order");
        } else {
            assert_eq!(numbers[..300], expected[..], "lane 1's records in its order");
        }
    }
}
