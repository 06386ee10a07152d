//! Write-ahead log with group commit.
//!
//! Appenders copy an encoded record into a shared buffer under a short lock and get its LSN at
//! once; one flusher thread per log takes the whole buffer, writes it with one write, fdatasyncs,
//! advances [`Wal::durable_lsn`] and calls the on-durable callback. A flush starts when
//! `group_commit_bytes` are buffered or `group_commit_delay_us` after the first unflushed append,
//! so one fsync covers every record appended meanwhile.
//!
//! On disk, one directory per node holds:
//! - segments `wal-<first lsn, 20 digits>.log`: a [`SEGMENT_HEADER_BYTES`]-byte header
//!   (magic `DTXWAL01`, format version u32, node u16, 0u16, cluster_id u64, first lsn u64, CRC-32
//!   of the preceding 32 bytes; all little endian), then records. A record is payload length u32,
//!   CRC-32 of (lsn, payload) u32, lsn u64, payload. Records never span segments; LSNs are
//!   contiguous within and across segments.
//! - checkpoints `checkpoint-<lsn, 20 digits>.ckpt`: a [`CHECKPOINT_HEADER_BYTES`]-byte header
//!   (magic `DTXCKP01`, version u32, node u16, 0u16, cluster_id u64, lsn u64, snapshot length u64,
//!   CRC-32 of the preceding 40 bytes and the snapshot), then the snapshot.
//!
//! Both kinds of file are created as `<name>.tmp`, fsynced and renamed, so a crash leaves either
//! the whole file or a `.tmp` that recovery deletes. The encoding functions are pure over bytes so
//! that a simulated in-memory disk can reuse the exact format.

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crc32fast::Hasher;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

/// A log sequence number: the first record is LSN 1; 0 means "nothing".
pub type Lsn = u64;

/// The largest payload one record may carry (16 MiB).
pub const MAX_RECORD_BYTES: usize = 16 << 20;
/// Appenders block once this much is buffered and not yet written (64 MiB), so a log whose disk
/// cannot keep up bounds its memory instead of growing without limit.
pub const MAX_UNWRITTEN_BYTES: usize = 64 << 20;
/// length u32 + crc u32 + lsn u64.
pub const RECORD_HEADER_BYTES: usize = 16;
pub const SEGMENT_HEADER_BYTES: usize = 36;
pub const CHECKPOINT_HEADER_BYTES: usize = 44;

const SEGMENT_MAGIC: &[u8; 8] = b"DTXWAL01";
const CHECKPOINT_MAGIC: &[u8; 8] = b"DTXCKP01";
const FORMAT_VERSION: u32 = 1;
const SEGMENT_PREFIX: &str = "wal-";
const SEGMENT_SUFFIX: &str = ".log";
const CHECKPOINT_PREFIX: &str = "checkpoint-";
const CHECKPOINT_SUFFIX: &str = ".ckpt";
const TEMP_SUFFIX: &str = ".tmp";
const SET_ASIDE_SUFFIX: &str = ".corrupt";
const WHAT_TO_DO_FOREIGN: &str = "this directory belongs to another cluster; point --data-dir elsewhere or remove it";

#[derive(Debug, Clone)]
pub struct WalConfig {
    pub dir: PathBuf,
    /// Written in every segment and checkpoint header; `open` refuses a directory of another cluster.
    pub cluster_id: u64,
    /// Also in every header, also checked.
    pub node: u16,
    /// Roll to a new segment file once the current one would grow past this.
    pub segment_bytes: u64,
    /// Flush as soon as this much is buffered.
    pub group_commit_bytes: usize,
    /// Or this long after the first unflushed append.
    pub group_commit_delay_us: u64,
    /// fdatasync after each group write; false only for tests of speed (nothing is then synced).
    pub fsync: bool,
}

impl WalConfig {
    pub fn new(dir: impl Into<PathBuf>, cluster_id: u64, node: u16) -> Self {
        WalConfig {
            dir: dir.into(),
            cluster_id,
            node,
            segment_bytes: 64 << 20,
            group_commit_bytes: 256 << 10,
            group_commit_delay_us: 200,
            fsync: true,
        }
    }

    fn owner(&self) -> WalOwner {
        WalOwner { cluster_id: self.cluster_id, node: self.node }
    }
}

/// What `open` found on disk.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The newest valid checkpoint: the LSN it covers up to (inclusive) and its bytes.
    pub checkpoint: Option<(Lsn, Vec<u8>)>,
    /// Every record after the checkpoint, in LSN order, no gaps.
    pub records: Vec<(Lsn, Vec<u8>)>,
    /// Where a torn last record was cut off (file, byte offset), if any.
    pub torn_tail: Option<(PathBuf, u64)>,
}

/// The cluster and node a log belongs to, as written in its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalOwner {
    pub cluster_id: u64,
    pub node: u16,
}

impl fmt::Display for WalOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster {}, node {}", self.cluster_id, self.node)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("Could not {action} {}: {source}.", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "The write-ahead log file {} is corrupt at byte offset {offset}: {reason}. Recovery stopped \
         rather than silently lose records; restore the directory from a replica or a backup.",
        path.display()
    )]
    Corrupt { path: PathBuf, offset: u64, reason: String },
    #[error(
        "The write-ahead log file {} belongs to {found}, but this node is {expected}: {WHAT_TO_DO_FOREIGN}.",
        path.display()
    )]
    ForeignCluster { path: PathBuf, found: WalOwner, expected: WalOwner },
    #[error(
        "A write-ahead log record of {payload_bytes} bytes was refused: a record carries at most \
         {MAX_RECORD_BYTES} bytes (16 MiB); split the payload."
    )]
    RecordTooLarge { payload_bytes: usize },
    #[error("A checkpoint at LSN {lsn} was refused: {reason}.")]
    BadCheckpoint { lsn: Lsn, reason: String },
    #[error("The write-ahead log in {} is closed and accepts no more records.", dir.display())]
    Closed { dir: PathBuf },
    #[error(
        "The write-ahead log in {} is in use by process {pid} (see {}): two processes must never write \
         one log. Stop that process, or point --data-dir elsewhere.",
        dir.display(),
        lock.display()
    )]
    Locked { dir: PathBuf, lock: PathBuf, pid: u32 },
    #[error("The write-ahead log stopped after its flusher failed, so nothing more can become durable: {0}")]
    Stopped(#[source] Arc<WalError>),
}

/// Counters since `open`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended.
    pub records: u64,
    /// Bytes appended, record headers included.
    pub bytes: u64,
    /// write calls on segment files (one per group, one more per segment roll inside a group).
    pub group_writes: u64,
    /// fdatasyncs of segment data (segment creation and checkpoints not counted).
    pub fsyncs: u64,
    pub fsync_total_ns: u64,
    pub fsync_max_ns: u64,
    /// Flushes started because `group_commit_bytes` (or the memory bound) were buffered.
    pub flushes_by_size: u64,
    /// Flushes started because `group_commit_delay_us` passed since the first unflushed append.
    pub flushes_by_time: u64,
    /// Flushes started by `close`.
    pub flushes_by_close: u64,
    /// Appends that blocked because [`MAX_UNWRITTEN_BYTES`] were buffered and not yet written.
    pub append_waits: u64,
    pub durable_lsn: Lsn,
}

// ---------------------------------------------------------------------------------------------
// Pure format functions.

/// Why decoding stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Every byte decoded into records.
    Clean,
    /// A bad record at `offset` with no valid record after it: a write cut short by a crash.
    Torn { offset: usize },
    /// A bad record at `offset` followed by valid data, or a record out of LSN order.
    Corrupt { offset: usize, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Each record's LSN and the byte range of its payload.
    pub records: Vec<(Lsn, Range<usize>)>,
    pub end: Tail,
}

/// A header that does not decode: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    pub offset: usize,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub cluster_id: u64,
    pub node: u16,
    pub first_lsn: Lsn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub cluster_id: u64,
    pub node: u16,
    /// The checkpoint covers every record up to this LSN, inclusive.
    pub lsn: Lsn,
}

pub fn encode_record(lsn: Lsn, payload: &[u8], out: &mut Vec<u8>) {
    put_record(lsn, record_crc(lsn, payload), payload, out);
}

/// Decodes the records in `bytes[first_offset..]`; the first record may carry any LSN, each next
/// one must carry the LSN after it.
pub fn decode_records(bytes: &[u8], first_offset: usize) -> Decoded {
    decode_records_from(bytes, first_offset, None)
}

/// As [`decode_records`], but the first record must carry `first_lsn` when given (a segment's
/// header names it), which also sharpens the torn-or-corrupt decision for a bad first record.
pub fn decode_records_from(bytes: &[u8], first_offset: usize, first_lsn: Option<Lsn>) -> Decoded {
    let mut records = Vec::new();
    let mut expected = first_lsn;
    let mut at = first_offset;
    if at > bytes.len() {
        let reason = format!("decoding was asked to start past the end ({} bytes)", bytes.len());
        return Decoded { records, end: Tail::Corrupt { offset: at, reason } };
    }
    while at < bytes.len() {
        let record = match parse_record_at(bytes, at) {
            Ok(record) => record,
            Err(bad) => return Decoded { records, end: classify_bad_record(bytes, at, expected, bad) },
        };
        if let Some(want) = expected.filter(|&want| want != record.lsn) {
            let reason = format!("the record there carries LSN {} where LSN {want} was expected", record.lsn);
            return Decoded { records, end: Tail::Corrupt { offset: at, reason } };
        }
        records.push((record.lsn, record.payload));
        expected = Some(record.lsn + 1);
        at = record.end;
    }
    Decoded { records, end: Tail::Clean }
}

pub fn encode_segment_header(header: &SegmentHeader, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(SEGMENT_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.node.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&header.cluster_id.to_le_bytes());
    out.extend_from_slice(&header.first_lsn.to_le_bytes());
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

pub fn decode_segment_header(bytes: &[u8]) -> Result<SegmentHeader, FormatError> {
    check_magic_and_version(bytes, SEGMENT_MAGIC, SEGMENT_HEADER_BYTES, "segment header")?;
    let (stored, computed) = (le_u32(bytes, 32), crc32fast::hash(&bytes[..32]));
    if stored != computed {
        return Err(FormatError { offset: 32, reason: checksum_reason("segment header", stored, computed) });
    }
    Ok(SegmentHeader { node: le_u16(bytes, 12), cluster_id: le_u64(bytes, 16), first_lsn: le_u64(bytes, 24) })
}

pub fn encode_checkpoint(header: &CheckpointHeader, snapshot: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&checkpoint_header_bytes(header, snapshot));
    out.extend_from_slice(snapshot);
}

/// The header and the byte range of the snapshot.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<(CheckpointHeader, Range<usize>), FormatError> {
    check_magic_and_version(bytes, CHECKPOINT_MAGIC, CHECKPOINT_HEADER_BYTES, "checkpoint header")?;
    let snapshot_bytes = le_u64(bytes, 32);
    let body_bytes = (bytes.len() - CHECKPOINT_HEADER_BYTES) as u64;
    if snapshot_bytes != body_bytes {
        let reason = format!("the header announces a snapshot of {snapshot_bytes} bytes but {body_bytes} follow");
        return Err(FormatError { offset: 32, reason });
    }
    let snapshot = CHECKPOINT_HEADER_BYTES..bytes.len();
    let mut crc = Hasher::new();
    crc.update(&bytes[..40]);
    crc.update(&bytes[snapshot.clone()]);
    let (stored, computed) = (le_u32(bytes, 40), crc.finalize());
    if stored != computed {
        return Err(FormatError { offset: 40, reason: checksum_reason("checkpoint", stored, computed) });
    }
    let header = CheckpointHeader { node: le_u16(bytes, 12), cluster_id: le_u64(bytes, 16), lsn: le_u64(bytes, 24) };
    Ok((header, snapshot))
}

fn checkpoint_header_bytes(header: &CheckpointHeader, snapshot: &[u8]) -> [u8; CHECKPOINT_HEADER_BYTES] {
    let mut out = [0u8; CHECKPOINT_HEADER_BYTES];
    out[..8].copy_from_slice(CHECKPOINT_MAGIC);
    out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[12..14].copy_from_slice(&header.node.to_le_bytes());
    out[16..24].copy_from_slice(&header.cluster_id.to_le_bytes());
    out[24..32].copy_from_slice(&header.lsn.to_le_bytes());
    out[32..40].copy_from_slice(&(snapshot.len() as u64).to_le_bytes());
    let mut crc = Hasher::new();
    crc.update(&out[..40]);
    crc.update(snapshot);
    out[40..].copy_from_slice(&crc.finalize().to_le_bytes());
    out
}

fn check_magic_and_version(bytes: &[u8], magic: &[u8; 8], header_bytes: usize, what: &str) -> Result<(), FormatError> {
    if bytes.len() < header_bytes {
        let reason = format!("the file has {} bytes, fewer than a {what} of {header_bytes}", bytes.len());
        return Err(FormatError { offset: bytes.len(), reason });
    }
    if &bytes[..8] != magic {
        let reason = format!("the {what} does not start with the magic {:?}", String::from_utf8_lossy(magic));
        return Err(FormatError { offset: 0, reason });
    }
    let version = le_u32(bytes, 8);
    if version != FORMAT_VERSION {
        let reason = format!("the {what} has format version {version}, this build reads version {FORMAT_VERSION}");
        return Err(FormatError { offset: 8, reason });
    }
    Ok(())
}

fn checksum_reason(what: &str, stored: u32, computed: u32) -> String {
    format!("the {what} checksum does not match (stored {stored:#010x}, computed {computed:#010x})")
}

fn record_crc(lsn: Lsn, payload: &[u8]) -> u32 {
    let mut crc = Hasher::new();
    crc.update(&lsn.to_le_bytes());
    crc.update(payload);
    crc.finalize()
}

fn put_record(lsn: Lsn, crc: u32, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() <= MAX_RECORD_BYTES, "record of {} bytes over the limit", payload.len());
    out.reserve(RECORD_HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(payload);
}

struct RawRecord {
    lsn: Lsn,
    payload: Range<usize>,
    end: usize,
}

/// Why the bytes at an offset are not a record; kept cheap because the torn-tail scan tries
/// every offset.
enum BadRecord {
    Short { remaining: usize },
    TooLong { len: usize },
    PastEnd { len: usize, end: usize, available: usize },
    Checksum { stored: u32, computed: u32 },
    ZeroLsn,
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BadRecord::Short { remaining } => {
                write!(f, "only {remaining} bytes remain where a {RECORD_HEADER_BYTES}-byte record header should be")
            }
            BadRecord::TooLong { len } => {
                write!(f, "the record's length field says {len} bytes, over the limit of {MAX_RECORD_BYTES}")
            }
            BadRecord::PastEnd { len, end, available } => write!(
                f,
                "the record of {len} bytes would end at offset {end}, past the end of the data at {available}"
            ),
            BadRecord::Checksum { stored, computed } => f.write_str(&checksum_reason("record", stored, computed)),
            BadRecord::ZeroLsn => f.write_str("the record carries LSN 0, which no record has"),
        }
    }
}

fn parse_record_at(bytes: &[u8], at: usize) -> Result<RawRecord, BadRecord> {
    let available = bytes.len();
    let remaining = available.saturating_sub(at);
    if remaining < RECORD_HEADER_BYTES {
        return Err(BadRecord::Short { remaining });
    }
    let len = le_u32(bytes, at) as usize;
    if len > MAX_RECORD_BYTES {
        return Err(BadRecord::TooLong { len });
    }
    let end = at + RECORD_HEADER_BYTES + len;
    if end > available {
        return Err(BadRecord::PastEnd { len, end, available });
    }
    let lsn = le_u64(bytes, at + 8);
    let payload = at + RECORD_HEADER_BYTES..end;
    let (stored, computed) = (le_u32(bytes, at + 4), record_crc(lsn, &bytes[payload.clone()]));
    if stored != computed {
        return Err(BadRecord::Checksum { stored, computed });
    }
    if lsn == 0 {
        return Err(BadRecord::ZeroLsn);
    }
    Ok(RawRecord { lsn, payload, end })
}

/// A bad record is a torn write only if nothing valid follows it; otherwise records after it
/// would be silently lost, so it is corruption.
fn classify_bad_record(bytes: &[u8], at: usize, expected: Option<Lsn>, bad: BadRecord) -> Tail {
    match find_valid_record_after(bytes, at, expected) {
        None => Tail::Torn { offset: at },
        Some((later_at, lsn)) => Tail::Corrupt {
            offset: at,
            reason: format!("{bad}, yet a valid record with LSN {lsn} follows at offset {later_at}"),
        },
    }
}

/// The first offset after `bad_at` from which a valid record with an LSN at or after `expected`
/// decodes. With `expected` known, the LSN is also bounded above: each of the records lost in
/// between took at least a record header, so at most `(offset - bad_at) / 16` are missing.
fn find_valid_record_after(bytes: &[u8], bad_at: usize, expected: Option<Lsn>) -> Option<(usize, Lsn)> {
    let last_start = bytes.len().checked_sub(RECORD_HEADER_BYTES)?;
    let min_lsn = expected.unwrap_or(1);
    (bad_at + 1..=last_start).find_map(|at| {
        let lsn = le_u64(bytes, at + 8);
        let max_lsn = expected.map_or(Lsn::MAX, |e| e.saturating_add(((at - bad_at) / RECORD_HEADER_BYTES) as u64));
        if lsn < min_lsn || lsn > max_lsn {
            return None;
        }
        parse_record_at(bytes, at).ok().map(|record| (at, record.lsn))
    })
}

// Callers check lengths first; these only read fixed-size little-endian fields.
fn le_u16(bytes: &[u8], at: usize) -> u16 {
    let mut field = [0u8; 2];
    field.copy_from_slice(&bytes[at..at + 2]);
    u16::from_le_bytes(field)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}

// ---------------------------------------------------------------------------------------------
// Files and directories.

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WalError + 'a {
    move |source| WalError::Io { action, path: path.to_path_buf(), source }
}

fn corrupt(path: &Path, offset: usize, reason: impl Into<String>) -> WalError {
    WalError::Corrupt { path: path.to_path_buf(), offset: offset as u64, reason: reason.into() }
}

fn segment_path(dir: &Path, first_lsn: Lsn) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}{first_lsn:020}{SEGMENT_SUFFIX}"))
}

fn checkpoint_path(dir: &Path, lsn: Lsn) -> PathBuf {
    dir.join(format!("{CHECKPOINT_PREFIX}{lsn:020}{CHECKPOINT_SUFFIX}"))
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(TEMP_SUFFIX);
    PathBuf::from(name)
}

/// The LSN in a `<prefix><20 digits><suffix>` file name.
fn numbered_name(name: &str, prefix: &str, suffix: &str) -> Option<Lsn> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let well_formed = digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit());
    well_formed.then(|| digits.parse().ok()).flatten()
}

/// Segments and checkpoints of a directory, oldest first, and unfinished temporary files.
#[derive(Default)]
struct DirListing {
    segments: Vec<(Lsn, PathBuf)>,
    checkpoints: Vec<(Lsn, PathBuf)>,
    temps: Vec<PathBuf>,
}

fn list_dir(dir: &Path) -> Result<DirListing, WalError> {
    let mut listing = DirListing::default();
    let entries = fs::read_dir(dir).map_err(io_error("list the write-ahead log directory", dir))?;
    for entry in entries {
        let path = entry.map_err(io_error("list the write-ahead log directory", dir))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name.ends_with(TEMP_SUFFIX) && (name.starts_with(SEGMENT_PREFIX) || name.starts_with(CHECKPOINT_PREFIX)) {
            listing.temps.push(path);
        } else if let Some(lsn) = numbered_name(name, SEGMENT_PREFIX, SEGMENT_SUFFIX) {
            listing.segments.push((lsn, path));
        } else if let Some(lsn) = numbered_name(name, CHECKPOINT_PREFIX, CHECKPOINT_SUFFIX) {
            listing.checkpoints.push((lsn, path));
        }
    }
    listing.segments.sort();
    listing.checkpoints.sort();
    Ok(listing)
}

/// Deletes the `.tmp` files a crash during a checkpoint or a segment roll left behind: they were
/// never renamed into place, so nothing relies on them. Only at `open`: later, the flusher or a
/// checkpoint may be writing one.
fn remove_temps(listing: &DirListing) -> Result<(), WalError> {
    for path in &listing.temps {
        fs::remove_file(path).map_err(io_error("remove the unfinished temporary file", path))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path, fsync: bool) -> Result<(), WalError> {
    if !fsync {
        return Ok(());
    }
    let handle = File::open(dir).map_err(io_error("open the directory to fsync it", dir))?;
    handle.sync_all().map_err(io_error("fsync the directory", dir))
}

/// Writes `parts` to `path` atomically: a temporary file, fsync, rename, fsync of the directory.
/// Returns the file, still open for writing at its end.
fn write_atomically(path: &Path, parts: &[&[u8]], fsync: bool) -> Result<File, WalError> {
    let temp = temp_path(path);
    let mut file =
        OpenOptions::new().write(true).create(true).truncate(true).open(&temp).map_err(io_error("create", &temp))?;
    for part in parts {
        file.write_all(part).map_err(io_error("write", &temp))?;
    }
    if fsync {
        file.sync_all().map_err(io_error("fsync", &temp))?;
    }
    fs::rename(&temp, path).map_err(io_error("rename into place the temporary file", &temp))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")), fsync)?;
    Ok(file)
}

fn create_segment(cfg: &WalConfig, first_lsn: Lsn) -> Result<(File, PathBuf), WalError> {
    let path = segment_path(&cfg.dir, first_lsn);
    let mut header = Vec::with_capacity(SEGMENT_HEADER_BYTES);
    encode_segment_header(&SegmentHeader { cluster_id: cfg.cluster_id, node: cfg.node, first_lsn }, &mut header);
    let file = write_atomically(&path, &[&header], cfg.fsync)?;
    Ok((file, path))
}

fn check_owner(cfg: &WalConfig, path: &Path, found: WalOwner) -> Result<(), WalError> {
    if found == cfg.owner() {
        return Ok(());
    }
    Err(WalError::ForeignCluster { path: path.to_path_buf(), found, expected: cfg.owner() })
}

// ---------------------------------------------------------------------------------------------
// Recovery.

struct LoadedCheckpoint {
    lsn: Lsn,
    snapshot: Vec<u8>,
    /// Newer checkpoints that failed to decode: renamed aside once recovery succeeds.
    corrupt_newer: Vec<PathBuf>,
}

/// The newest valid checkpoint; a corrupt newer one is passed over only when an older valid one
/// exists, else its error stops recovery.
fn load_checkpoint(cfg: &WalConfig, found: &[(Lsn, PathBuf)]) -> Result<Option<LoadedCheckpoint>, WalError> {
    let mut corrupt_newer = Vec::new();
    let mut newest_error = None;
    for (lsn, path) in found.iter().rev() {
        match read_checkpoint(cfg, path, *lsn) {
            Ok(snapshot) => return Ok(Some(LoadedCheckpoint { lsn: *lsn, snapshot, corrupt_newer })),
            Err(error @ WalError::Corrupt { .. }) => {
                corrupt_newer.push(path.clone());
                newest_error.get_or_insert(error);
            }
            Err(error) => return Err(error),
        }
    }
    newest_error.map_or(Ok(None), Err)
}

fn read_checkpoint(cfg: &WalConfig, path: &Path, name_lsn: Lsn) -> Result<Vec<u8>, WalError> {
    let mut bytes = fs::read(path).map_err(io_error("read the checkpoint", path))?;
    let (header, snapshot) = decode_checkpoint(&bytes).map_err(|e| corrupt(path, e.offset, e.reason))?;
    check_owner(cfg, path, WalOwner { cluster_id: header.cluster_id, node: header.node })?;
    if header.lsn != name_lsn {
        let reason = format!("the checkpoint header says LSN {} but the file name says {name_lsn}", header.lsn);
        return Err(corrupt(path, 24, reason));
    }
    bytes.truncate(snapshot.end);
    bytes.drain(..snapshot.start);
    Ok(bytes)
}

/// Renames corrupt checkpoints aside (kept for inspection) so that later opens do not trip on them.
fn set_aside(paths: &[PathBuf]) -> Result<(), WalError> {
    for path in paths {
        let mut aside = path.as_os_str().to_owned();
        aside.push(SET_ASIDE_SUFFIX);
        fs::rename(path, PathBuf::from(aside)).map_err(io_error("rename aside the corrupt checkpoint", path))?;
    }
    Ok(())
}

#[derive(Default)]
struct Replay {
    records: Vec<(Lsn, Vec<u8>)>,
    /// LSN of the last record in the segments (0 if none).
    last_lsn: Lsn,
    torn_tail: Option<(PathBuf, u64)>,
    /// (first LSN, path), oldest first.
    segments: VecDeque<(Lsn, PathBuf)>,
    /// Size of the last segment after any torn tail was cut off.
    last_segment_bytes: u64,
}

fn replay_segments(cfg: &WalConfig, found: &[(Lsn, PathBuf)], checkpoint_lsn: Lsn) -> Result<Replay, WalError> {
    let mut replay = Replay::default();
    for (index, (name_lsn, path)) in found.iter().enumerate() {
        let is_last = index + 1 == found.len();
        replay_segment(cfg, path, *name_lsn, is_last, checkpoint_lsn, &mut replay)?;
    }
    Ok(replay)
}

fn replay_segment(
    cfg: &WalConfig,
    path: &Path,
    name_lsn: Lsn,
    is_last: bool,
    checkpoint_lsn: Lsn,
    replay: &mut Replay,
) -> Result<(), WalError> {
    let bytes = fs::read(path).map_err(io_error("read the write-ahead log segment", path))?;
    let header = read_segment_header(cfg, path, &bytes, name_lsn)?;
    check_segment_start(path, header.first_lsn, replay.last_lsn, checkpoint_lsn)?;
    let decoded = decode_records_from(&bytes, SEGMENT_HEADER_BYTES, Some(header.first_lsn));
    let end = settle_tail(cfg, path, &bytes, decoded.end, is_last, replay)?;
    replay.last_lsn = decoded.records.last().map_or(header.first_lsn - 1, |(lsn, _)| *lsn);
    let after_checkpoint = decoded.records.into_iter().filter(|(lsn, _)| *lsn > checkpoint_lsn);
    replay.records.extend(after_checkpoint.map(|(lsn, range)| (lsn, bytes[range].to_vec())));
    replay.segments.push_back((header.first_lsn, path.to_path_buf()));
    replay.last_segment_bytes = end as u64;
    Ok(())
}

fn read_segment_header(cfg: &WalConfig, path: &Path, bytes: &[u8], name_lsn: Lsn) -> Result<SegmentHeader, WalError> {
    let header = decode_segment_header(bytes).map_err(|e| corrupt(path, e.offset, e.reason))?;
    check_owner(cfg, path, WalOwner { cluster_id: header.cluster_id, node: header.node })?;
    if header.first_lsn != name_lsn || header.first_lsn == 0 {
        let reason =
            format!("the segment header says first LSN {} but the file name says {name_lsn}", header.first_lsn);
        return Err(corrupt(path, 24, reason));
    }
    Ok(header)
}

/// A segment must start right after the records before it, except that LSNs the checkpoint
/// covers may be missing (their segments were deleted after the checkpoint).
fn check_segment_start(path: &Path, first_lsn: Lsn, previous_lsn: Lsn, checkpoint_lsn: Lsn) -> Result<(), WalError> {
    if first_lsn <= previous_lsn {
        let reason =
            format!("the segment starts at LSN {first_lsn}, but the log before it already reaches LSN {previous_lsn}");
        return Err(corrupt(path, 24, reason));
    }
    let latest_allowed = previous_lsn.max(checkpoint_lsn) + 1;
    if first_lsn > latest_allowed {
        let reason = format!(
            "the segment starts at LSN {first_lsn}, but the log before it ends at LSN {previous_lsn} and the \
             checkpoint covers up to LSN {checkpoint_lsn}, so LSNs {latest_allowed} to {} are missing",
            first_lsn - 1
        );
        return Err(corrupt(path, 24, reason));
    }
    Ok(())
}

/// Cuts off a torn last record of the last segment; anything else bad is corruption. Returns the
/// segment's valid length.
fn settle_tail(
    cfg: &WalConfig,
    path: &Path,
    bytes: &[u8],
    tail: Tail,
    is_last: bool,
    replay: &mut Replay,
) -> Result<usize, WalError> {
    match tail {
        Tail::Clean => Ok(bytes.len()),
        Tail::Corrupt { offset, reason } => Err(corrupt(path, offset, reason)),
        Tail::Torn { offset } if !is_last => {
            let why = parse_record_at(bytes, offset).err().map_or_else(String::new, |bad| format!("{bad}; "));
            Err(corrupt(path, offset, format!("{why}a segment other than the last cannot end in a torn write")))
        }
        Tail::Torn { offset } => {
            truncate(path, offset as u64, cfg.fsync)?;
            replay.torn_tail = Some((path.to_path_buf(), offset as u64));
            Ok(offset)
        }
    }
}

fn truncate(path: &Path, len: u64, fsync: bool) -> Result<(), WalError> {
    let file = OpenOptions::new().write(true).open(path).map_err(io_error("open to cut off its torn tail", path))?;
    file.set_len(len).map_err(io_error("cut off the torn tail of", path))?;
    if fsync {
        file.sync_all().map_err(io_error("fsync after cutting off the torn tail", path))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The log.

type DurableCallback = Box<dyn Fn(Lsn) + Send + Sync>;

/// A point in the buffer where the appender decided the next record opens a new segment.
struct Roll {
    at: usize,
    first_lsn: Lsn,
}

#[derive(Debug, Clone, Copy)]
enum Trigger {
    Size,
    Time,
    Close,
}

/// What appenders and the flusher share under one short lock.
struct State {
    /// Encoded records not yet taken by the flusher.
    buf: Vec<u8>,
    rolls: Vec<Roll>,
    next_lsn: Lsn,
    first_unflushed_at: Option<Instant>,
    /// Taken by the flusher, not yet written and synced: still counts against the memory bound.
    in_flight_bytes: usize,
    /// Size the current segment will have once everything buffered is written.
    segment_bytes: u64,
    durable_lsn: Lsn,
    closing: bool,
    flusher_done: bool,
    failure: Option<Arc<WalError>>,
    records: u64,
    bytes: u64,
    append_waits: u64,
}

impl State {
    fn check_accepting(&self, dir: &Path) -> Result<(), WalError> {
        if let Some(failure) = &self.failure {
            return Err(WalError::Stopped(failure.clone()));
        }
        if self.closing {
            return Err(WalError::Closed { dir: dir.to_path_buf() });
        }
        Ok(())
    }

    /// Records never span segments: a record that would push a non-empty segment past its size
    /// opens the next one, which the flusher creates when it reaches this point of the buffer.
    fn place_in_segment(&mut self, lsn: Lsn, record_bytes: u64, segment_limit_bytes: u64) {
        let has_records = self.segment_bytes > SEGMENT_HEADER_BYTES as u64;
        if has_records && self.segment_bytes + record_bytes > segment_limit_bytes {
            self.rolls.push(Roll { at: self.buf.len(), first_lsn: lsn });
            self.segment_bytes = SEGMENT_HEADER_BYTES as u64;
        }
        self.segment_bytes += record_bytes;
    }
}

#[derive(Default)]
struct IoCounters {
    group_writes: AtomicU64,
    fsyncs: AtomicU64,
    fsync_total_ns: AtomicU64,
    fsync_max_ns: AtomicU64,
    flushes_by_size: AtomicU64,
    flushes_by_time: AtomicU64,
    flushes_by_close: AtomicU64,
}

struct Shared {
    cfg: WalConfig,
    max_unwritten_bytes: usize,
    /// The flusher starts as soon as this much is buffered: the group size, or less if the
    /// memory bound is lower (so blocked appenders are released without waiting for the timer).
    flush_at_bytes: usize,
    state: Mutex<State>,
    /// The flusher waits here for work.
    work_cv: Condvar,
    /// Appenders blocked by the memory bound wait here.
    space_cv: Condvar,
    /// `wait_durable` callers wait here.
    durable_cv: Condvar,
    durable_lsn: AtomicU64,
    on_durable: RwLock<Option<DurableCallback>>,
    /// (first LSN, path) of every segment on disk, oldest first; the last is the one written.
    segments: Mutex<VecDeque<(Lsn, PathBuf)>>,
    /// The newest checkpoint's LSN; the lock also serializes `checkpoint` calls.
    newest_checkpoint: Mutex<Option<Lsn>>,
    io: IoCounters,
}

/// A write-ahead log with group commit; shared as `Arc<Wal>`.
pub struct Wal {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Held while the log is open (removed by `close`).
    lock: DirLock,
}

/// `LOCK` in a log's directory names the process that has the log open. A lock left by a process
/// that no longer runs (killed with kill -9) is stale and taken over; a live one refuses the open.
struct DirLock {
    path: PathBuf,
}

const LOCK_FILE: &str = "LOCK";

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, WalError> {
        let path = dir.join(LOCK_FILE);
        let me = std::process::id();
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(me.to_string().as_bytes()).map_err(io_error("write the lock file", &path))?;
                    return Ok(DirLock { path });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let holder = fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if process_runs(pid) => {
                            return Err(WalError::Locked { dir: dir.to_path_buf(), lock: path, pid });
                        }
                        // Stale (its process is gone) or unreadable (a crash while writing it).
                        _ => fs::remove_file(&path).map_err(io_error("remove the stale lock file", &path))?,
                    }
                }
                Err(e) => return Err(io_error("create the lock file", &path)(e)),
            }
        }
        Err(WalError::Locked { dir: dir.to_path_buf(), lock: path, pid: 0 })
    }

    fn release(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Whether process `pid` is alive (Linux: it has a /proc entry). This process counts: one
/// process opening the same log twice is refused too.
fn process_runs(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

impl Wal {
    /// Recovers the directory (see the module comment) and starts the flusher thread.
    pub fn open(cfg: WalConfig) -> Result<(Arc<Wal>, Recovered), WalError> {
        Self::open_bounded(cfg, MAX_UNWRITTEN_BYTES)
    }

    fn open_bounded(cfg: WalConfig, max_unwritten_bytes: usize) -> Result<(Arc<Wal>, Recovered), WalError> {
        fs::create_dir_all(&cfg.dir).map_err(io_error("create the write-ahead log directory", &cfg.dir))?;
        let lock = DirLock::take(&cfg.dir)?;
        Self::open_locked(cfg, max_unwritten_bytes, lock)
    }

    fn open_locked(
        cfg: WalConfig,
        max_unwritten_bytes: usize,
        lock: DirLock,
    ) -> Result<(Arc<Wal>, Recovered), WalError> {
        match Self::recover(cfg, max_unwritten_bytes, &lock) {
            Ok((shared, flusher, recovered)) => {
                Ok((Arc::new(Wal { shared, flusher: Mutex::new(Some(flusher)), lock }), recovered))
            }
            Err(e) => {
                lock.release();
                Err(e)
            }
        }
    }

    fn recover(
        cfg: WalConfig,
        max_unwritten_bytes: usize,
        _lock: &DirLock,
    ) -> Result<(Arc<Shared>, JoinHandle<()>, Recovered), WalError> {
        let listing = list_dir(&cfg.dir)?;
        remove_temps(&listing)?;
        let checkpoint = load_checkpoint(&cfg, &listing.checkpoints)?;
        let checkpoint_lsn = checkpoint.as_ref().map_or(0, |c| c.lsn);
        let mut replay = replay_segments(&cfg, &listing.segments, checkpoint_lsn)?;
        if let Some(loaded) = &checkpoint {
            set_aside(&loaded.corrupt_newer)?;
        }
        let active = open_active_segment(&cfg, &mut replay, checkpoint_lsn)?;
        let next_lsn = replay.last_lsn.max(checkpoint_lsn) + 1;
        let shared =
            Arc::new(Shared::new(cfg, max_unwritten_bytes, next_lsn, checkpoint.as_ref().map(|c| c.lsn), &mut replay));
        let flusher = spawn_flusher(shared.clone(), active)?;
        let recovered = Recovered {
            checkpoint: checkpoint.map(|c| (c.lsn, c.snapshot)),
            records: std::mem::take(&mut replay.records),
            torn_tail: replay.torn_tail,
        };
        Ok((shared, flusher, recovered))
    }

    /// Buffers one record and returns its LSN at once: a checksum of the payload, then a memcpy
    /// under a short lock, no syscall. The only wait: if [`MAX_UNWRITTEN_BYTES`] are buffered and
    /// not yet written (the disk cannot keep up), it blocks until the flusher catches up.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn, WalError> {
        if payload.len() > MAX_RECORD_BYTES {
            return Err(WalError::RecordTooLarge { payload_bytes: payload.len() });
        }
        // The payload's checksum is computed before the lock; under it only the 8 LSN bytes are
        // hashed and combined with it.
        let mut payload_crc = Hasher::new();
        payload_crc.update(payload);
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        shared.wait_for_space(&mut state);
        state.check_accepting(&shared.cfg.dir)?;
        let lsn = state.next_lsn;
        state.next_lsn += 1;
        let record_bytes = RECORD_HEADER_BYTES + payload.len();
        state.place_in_segment(lsn, record_bytes as u64, shared.cfg.segment_bytes);
        let was_empty = state.buf.is_empty();
        if was_empty {
            state.first_unflushed_at = Some(Instant::now());
        }
        let mut crc = Hasher::new();
        crc.update(&lsn.to_le_bytes());
        crc.combine(&payload_crc);
        put_record(lsn, crc.finalize(), payload, &mut state.buf);
        state.records += 1;
        state.bytes += record_bytes as u64;
        let crossed =
            state.buf.len() >= shared.flush_at_bytes && state.buf.len() - record_bytes < shared.flush_at_bytes;
        drop(state);
        // The flusher needs waking only to start its timer (first record) or to flush now (size).
        if was_empty || crossed {
            shared.work_cv.notify_one();
        }
        Ok(lsn)
    }

    /// Every record up to this LSN is on disk (fsynced).
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The LSN of the newest appended record (0 if none).
    pub fn last_lsn(&self) -> Lsn {
        self.shared.state.lock().next_lsn - 1
    }

    /// Blocks until `lsn` is durable. Fails if the log is closed or its flusher failed first.
    pub fn wait_durable(&self, lsn: Lsn) -> Result<(), WalError> {
        if self.durable_lsn() >= lsn {
            return Ok(());
        }
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        while state.durable_lsn < lsn {
            if let Some(failure) = &state.failure {
                return Err(WalError::Stopped(failure.clone()));
            }
            if state.flusher_done {
                return Err(WalError::Closed { dir: shared.cfg.dir.clone() });
            }
            shared.durable_cv.wait(&mut state);
        }
        Ok(())
    }

    /// Called from the flusher thread each time `durable_lsn` advances. Set it before appending.
    pub fn set_on_durable(&self, f: Box<dyn Fn(Lsn) + Send + Sync>) {
        *self.shared.on_durable.write() = Some(f);
    }

    /// Writes a checkpoint covering every record up to `lsn` (the caller guarantees `snapshot`
    /// reflects exactly those), atomically, then deletes older checkpoints and the segments whose
    /// records are all <= `lsn`. Waits until `lsn` is durable first, so that the log never lacks
    /// records the checkpoint claims to follow.
    pub fn checkpoint(&self, lsn: Lsn, snapshot: &[u8]) -> Result<(), WalError> {
        let shared = &*self.shared;
        let mut newest = shared.newest_checkpoint.lock();
        shared.check_checkpoint_lsn(lsn, *newest)?;
        self.wait_durable(lsn)?;
        let cfg = &shared.cfg;
        let path = checkpoint_path(&cfg.dir, lsn);
        let header =
            checkpoint_header_bytes(&CheckpointHeader { cluster_id: cfg.cluster_id, node: cfg.node, lsn }, snapshot);
        write_atomically(&path, &[&header, snapshot], cfg.fsync)?;
        *newest = Some(lsn);
        remove_checkpoints_before(&cfg.dir, lsn)?;
        shared.remove_segments_covered_by(lsn)
    }

    pub fn stats(&self) -> WalStats {
        let shared = &*self.shared;
        let io = &shared.io;
        let state = shared.state.lock();
        WalStats {
            records: state.records,
            bytes: state.bytes,
            group_writes: io.group_writes.load(Ordering::Relaxed),
            fsyncs: io.fsyncs.load(Ordering::Relaxed),
            fsync_total_ns: io.fsync_total_ns.load(Ordering::Relaxed),
            fsync_max_ns: io.fsync_max_ns.load(Ordering::Relaxed),
            flushes_by_size: io.flushes_by_size.load(Ordering::Relaxed),
            flushes_by_time: io.flushes_by_time.load(Ordering::Relaxed),
            flushes_by_close: io.flushes_by_close.load(Ordering::Relaxed),
            append_waits: state.append_waits,
            durable_lsn: state.durable_lsn,
        }
    }

    /// Flushes what is buffered and stops the flusher thread; later appends fail with `Closed`.
    /// Idempotent; also done on drop.
    pub fn close(&self) {
        self.shared.state.lock().closing = true;
        self.shared.work_cv.notify_all();
        self.shared.space_cv.notify_all();
        let handle = self.flusher.lock().take();
        // Joining from the flusher itself (close called from the on-durable callback) would hang.
        if let Some(handle) = handle.filter(|h| h.thread().id() != std::thread::current().id()) {
            let _ = handle.join();
        }
        self.lock.release();
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.close();
    }
}

fn open_active_segment(cfg: &WalConfig, replay: &mut Replay, checkpoint_lsn: Lsn) -> Result<File, WalError> {
    match replay.segments.back() {
        Some((_, path)) if replay.last_lsn >= checkpoint_lsn => {
            OpenOptions::new().append(true).open(path).map_err(io_error("open for appending", path))
        }
        // No segment yet, or (never by this code) a log that ends before the checkpoint: the next
        // segment starts right after the checkpoint.
        _ => {
            let (file, path) = create_segment(cfg, checkpoint_lsn + 1)?;
            replay.segments.push_back((checkpoint_lsn + 1, path));
            replay.last_segment_bytes = SEGMENT_HEADER_BYTES as u64;
            Ok(file)
        }
    }
}

fn remove_checkpoints_before(dir: &Path, lsn: Lsn) -> Result<(), WalError> {
    for (older, path) in list_dir(dir)?.checkpoints {
        if older < lsn {
            fs::remove_file(&path).map_err(io_error("remove the superseded checkpoint", &path))?;
        }
    }
    Ok(())
}

impl Shared {
    fn new(
        cfg: WalConfig,
        max_unwritten_bytes: usize,
        next_lsn: Lsn,
        checkpoint_lsn: Option<Lsn>,
        replay: &mut Replay,
    ) -> Shared {
        let durable = next_lsn - 1;
        let state = State {
            buf: Vec::new(),
            rolls: Vec::new(),
            next_lsn,
            first_unflushed_at: None,
            in_flight_bytes: 0,
            segment_bytes: replay.last_segment_bytes,
            durable_lsn: durable,
            closing: false,
            flusher_done: false,
            failure: None,
            records: 0,
            bytes: 0,
            append_waits: 0,
        };
        Shared {
            flush_at_bytes: cfg.group_commit_bytes.min(max_unwritten_bytes),
            cfg,
            max_unwritten_bytes,
            state: Mutex::new(state),
            work_cv: Condvar::new(),
            space_cv: Condvar::new(),
            durable_cv: Condvar::new(),
            durable_lsn: AtomicU64::new(durable),
            on_durable: RwLock::new(None),
            segments: Mutex::new(std::mem::take(&mut replay.segments)),
            newest_checkpoint: Mutex::new(checkpoint_lsn),
            io: IoCounters::default(),
        }
    }

    /// Bounded memory: while more than `max_unwritten_bytes` are buffered and not yet written,
    /// the appender blocks here until the flusher has written a group.
    fn wait_for_space(&self, state: &mut MutexGuard<'_, State>) {
        while state.buf.len() + state.in_flight_bytes >= self.max_unwritten_bytes
            && state.failure.is_none()
            && !state.closing
        {
            state.append_waits += 1;
            self.work_cv.notify_one();
            self.space_cv.wait(state);
        }
    }

    fn check_checkpoint_lsn(&self, lsn: Lsn, newest: Option<Lsn>) -> Result<(), WalError> {
        let last_lsn = self.state.lock().next_lsn - 1;
        if lsn > last_lsn {
            let reason = format!("the log has records only up to LSN {last_lsn}");
            return Err(WalError::BadCheckpoint { lsn, reason });
        }
        match newest {
            Some(newest) if lsn < newest => {
                let reason = format!("a newer checkpoint at LSN {newest} exists and its segments may be gone");
                Err(WalError::BadCheckpoint { lsn, reason })
            }
            _ => Ok(()),
        }
    }

    /// Deletes every segment but the last whose records are all <= `lsn`, i.e. whose successor
    /// starts at or before `lsn + 1`. The last segment is the one the flusher writes: never deleted.
    fn remove_segments_covered_by(&self, lsn: Lsn) -> Result<(), WalError> {
        let mut segments = self.segments.lock();
        let mut removed_any = false;
        while segments.len() >= 2 && segments[1].0 <= lsn + 1 {
            let path = &segments[0].1;
            fs::remove_file(path).map_err(io_error("remove the segment covered by the checkpoint", path))?;
            segments.pop_front();
            removed_any = true;
        }
        drop(segments);
        if removed_any {
            sync_dir(&self.cfg.dir, self.cfg.fsync)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The flusher thread.

/// One group: everything buffered when the flusher woke.
struct Batch {
    bytes: Vec<u8>,
    rolls: Vec<Roll>,
    last_lsn: Lsn,
}

/// The segment file the flusher appends to.
struct ActiveSegment {
    file: File,
    path: PathBuf,
}

fn spawn_flusher(shared: Arc<Shared>, file: File) -> Result<JoinHandle<()>, WalError> {
    let path = shared.segments.lock().back().map(|(_, p)| p.clone()).unwrap_or_default();
    let dir = shared.cfg.dir.clone();
    std::thread::Builder::new()
        .name("dtx-wal-flusher".into())
        .spawn(move || run_flusher(&shared, ActiveSegment { file, path }))
        .map_err(io_error("start the flusher thread for", &dir))
}

fn run_flusher(shared: &Shared, mut segment: ActiveSegment) {
    let mut spare = Vec::new();
    while let Some(batch) = shared.next_batch(&mut spare) {
        let written = shared.write_batch(&mut segment, &batch);
        spare = batch.bytes;
        spare.clear();
        match written {
            Ok(()) => shared.mark_durable(batch.last_lsn),
            Err(error) => return shared.fail(error),
        }
    }
}

impl Shared {
    /// Waits until a flush is due (size, time or close) and takes the whole buffer, leaving
    /// `spare` (an emptied earlier buffer) in its place so appenders rarely reallocate.
    /// None once closing and everything is written.
    fn next_batch(&self, spare: &mut Vec<u8>) -> Option<Batch> {
        let mut state = self.state.lock();
        let trigger = loop {
            if state.buf.is_empty() {
                if state.closing {
                    state.flusher_done = true;
                    self.durable_cv.notify_all();
                    return None;
                }
                self.work_cv.wait(&mut state);
                continue;
            }
            if let Some(trigger) = self.flush_due(&state) {
                break trigger;
            }
            let started = state.first_unflushed_at.unwrap_or_else(Instant::now);
            self.work_cv.wait_until(&mut state, started + Duration::from_micros(self.cfg.group_commit_delay_us));
        };
        self.count_trigger(trigger);
        let bytes = std::mem::replace(&mut state.buf, std::mem::take(spare));
        state.in_flight_bytes = bytes.len();
        state.first_unflushed_at = None;
        Some(Batch { bytes, rolls: std::mem::take(&mut state.rolls), last_lsn: state.next_lsn - 1 })
    }

    fn flush_due(&self, state: &State) -> Option<Trigger> {
        if state.closing {
            return Some(Trigger::Close);
        }
        if state.buf.len() >= self.flush_at_bytes {
            return Some(Trigger::Size);
        }
        let delay = Duration::from_micros(self.cfg.group_commit_delay_us);
        let started = state.first_unflushed_at?;
        (started.elapsed() >= delay).then_some(Trigger::Time)
    }

    fn count_trigger(&self, trigger: Trigger) {
        let counter = match trigger {
            Trigger::Size => &self.io.flushes_by_size,
            Trigger::Time => &self.io.flushes_by_time,
            Trigger::Close => &self.io.flushes_by_close,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes a group: one write and one fdatasync per segment it touches; at each roll point the
    /// current segment is complete and synced before the next is created.
    fn write_batch(&self, segment: &mut ActiveSegment, batch: &Batch) -> Result<(), WalError> {
        let mut start = 0;
        for roll in &batch.rolls {
            self.write_and_sync(segment, &batch.bytes[start..roll.at])?;
            *segment = self.roll_segment(roll.first_lsn)?;
            start = roll.at;
        }
        self.write_and_sync(segment, &batch.bytes[start..])
    }

    fn write_and_sync(&self, segment: &mut ActiveSegment, bytes: &[u8]) -> Result<(), WalError> {
        if bytes.is_empty() {
            return Ok(());
        }
        segment.file.write_all(bytes).map_err(io_error("write to the write-ahead log segment", &segment.path))?;
        self.io.group_writes.fetch_add(1, Ordering::Relaxed);
        if !self.cfg.fsync {
            return Ok(());
        }
        let started = Instant::now();
        segment.file.sync_data().map_err(io_error("fdatasync the write-ahead log segment", &segment.path))?;
        let fsync_ns = started.elapsed().as_nanos() as u64;
        self.io.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.io.fsync_total_ns.fetch_add(fsync_ns, Ordering::Relaxed);
        self.io.fsync_max_ns.fetch_max(fsync_ns, Ordering::Relaxed);
        Ok(())
    }

    fn roll_segment(&self, first_lsn: Lsn) -> Result<ActiveSegment, WalError> {
        let (file, path) = create_segment(&self.cfg, first_lsn)?;
        self.segments.lock().push_back((first_lsn, path.clone()));
        Ok(ActiveSegment { file, path })
    }

    fn mark_durable(&self, lsn: Lsn) {
        let mut state = self.state.lock();
        state.in_flight_bytes = 0;
        state.durable_lsn = lsn;
        self.durable_lsn.store(lsn, Ordering::Release);
        drop(state);
        self.durable_cv.notify_all();
        self.space_cv.notify_all();
        if let Some(on_durable) = &*self.on_durable.read() {
            on_durable(lsn);
        }
    }

    /// A failed write or fsync leaves the file in an unknown state (after a failed fsync the
    /// kernel may have dropped the dirty pages), so the log stops: nothing later may become durable.
    fn fail(&self, error: WalError) {
        let mut state = self.state.lock();
        state.failure = Some(Arc::new(error));
        state.flusher_done = true;
        drop(state);
        self.durable_cv.notify_all();
        self.space_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {

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
    use super::*;
    use std::sync::atomic::AtomicUsize;

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
        wal.set_on_durable(Box::new(move |_| {
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
        append_all(&wal, 1..201);
        wal.close();
        let stats = wal.stats();
        assert!(stats.append_waits > 0 && stats.flushes_by_size > 0, "{stats:?}");
        drop(wal);
        let (_wal, recovered) = Wal::open(cfg).unwrap();
        assert_records(&recovered, 1..201);
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
        assert!(
            message.contains(first.to_str().unwrap()) && message.contains(&format!("offset {last_at}")),
            "{message}"
        );
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
}
