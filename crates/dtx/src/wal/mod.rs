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
//!
//! The module is split by concern: [`format`](mod@format) the bytes of records, segment headers and
//! checkpoints (pure, shared with the simulated disk); [`files`] the directory: atomic writes,
//! the lock, recovery of segments and checkpoints; [`writer`] the log itself: the append buffer,
//! the flusher thread, group commit and the durable LSN; [`lanes`] the append lanes (one buffer
//! per appending thread, numbered at the flusher's cut).

mod files;
pub use files::{append_whole_or_nothing, FailedAppend};
pub mod format;
mod lanes;
mod writer;

use lanes::AppendLane;

use files::*;
pub use format::*;
pub use writer::Wal;

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
/// 2: a record's checksum covers its payload, then its LSN (1 had the LSN first). 3: the 2PC
/// protocols' records changed layout (a protocol's own records and votes, a checkpoint that
/// names its protocol): read by version 2 they would not decode and be skipped. 4: a commit
/// policy's records are one variant of the 2PC protocols' records (`Policy`), and a checkpoint
/// names the policy after the protocol.
const FORMAT_VERSION: u32 = 4;
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
    /// Append lanes ([`Wal::append_to_lane`]): one buffer per appending thread, cut together
    /// into the one file.
    pub lanes: usize,
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
            lanes: 1,
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
        "The write-ahead log file {} has format version {found}, and this build of dtx reads version \
         {expected}: open it with the dtx that wrote it, or give this one an empty --data-dir.",
        path.display()
    )]
    OtherVersion { path: PathBuf, found: u32, expected: u32 },
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
    /// Times the flusher found the disk full and waited for space (each episode once).
    pub disk_full_waits: u64,
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

#[cfg(test)]
mod tests;
