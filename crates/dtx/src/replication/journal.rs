//! The Raft journal: what a host's replicas of replicated logs write before they answer anyone.
//!
//! Raft is safe across a restart only if a replica remembers its term, its vote and every entry
//! it acknowledged (Raft's "persistent state on all servers"): a voter that forgot its vote
//! could vote twice in one term, and one that forgot an acknowledged entry could let a leader
//! without it be elected. So every change a group makes to its store (entries appended, hard
//! state, a snapshot taken or installed, a compaction) becomes one [`JournalOp`] in one
//! append-only file per host, shared by all the groups the host is a voter of, and the
//! replicator makes the journal durable (one `fdatasync` for everything the groups did since the
//! last) before it sends any message, hands out any committed entry or tells a node its records
//! are durable. A crash therefore loses only changes nobody outside the process has seen.
//!
//! Format: a header (magic, cluster id, host, checksum), then records in the write-ahead log's
//! format (`wal::format`: length, CRC-32, sequence number, payload), each payload one op in
//! postcard. A torn last record (a write cut short by a crash) is cut off at open; a bad record
//! with valid ones after it is corruption and refuses to open, naming the file and offset.
//! Compaction keeps the file bounded: once it outgrows the groups' live state, it is rewritten
//! as that state (a temporary file, fsynced, renamed over the old one). A file journal writes
//! the temporary file on a thread of its own ([`Journal::rewrite`]): tens of megabytes written
//! and fsynced on the replication thread held a leader's heartbeats for 170-600 ms, past the
//! election timeout, and its followers elected another leader in runs without any fault.
//!
//! The simulator keeps a host's journal in memory ([`MemoryDisk`]) across its crashes, and its
//! restarted host reopens the replicas from it through the same code a restarted server runs.

use crate::wal::format::{decode_records_from, encode_record};
use crate::wal::Tail;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// 2: records carry the write-ahead log's format 2 (a checksum over the payload, then the LSN).
/// 3: the entries carry the 2PC protocols' records of WAL format 3.
const MAGIC: &[u8; 8] = b"DTXRAFT3";
/// Journals of earlier formats: refused by name, never read (format 1's records would fail the
/// checksum and read as a torn tail, forgetting votes and entries; format 2's entries would not
/// decode).
const OLDER_MAGICS: [&[u8; 8]; 2] = [b"DTXRAFT1", b"DTXRAFT2"];
const HEADER_BYTES: usize = 24;
/// An `Append` op encoding to more than this is split (half the WAL's record limit, so that
/// each half of one just over it is well under the limit).
const MAX_OP_BYTES: usize = crate::wal::MAX_RECORD_BYTES / 2;
/// The write buffer's capacity kept after a sync (a larger one is freed).
const KEPT_BUFFER_BYTES: usize = 4 << 20;

/// One entry of a replicated log, as the journal keeps it (membership never changes, so every
/// entry is an ordinary one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub index: u64,
    pub term: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// One change to one group's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalOp {
    /// Entries appended, replacing the log's suffix from the first one's index.
    Append { group: u32, entries: Vec<JournalEntry> },
    /// Raft's hard state (term, vote, commit index).
    HardState { group: u32, term: u64, vote: u64, commit: u64 },
    /// The applied state of the group's log up to `index` (whose entry has term `term`).
    /// `installed`: received from the leader, and the whole log replaced by it; otherwise
    /// taken here, before a compaction.
    Snapshot {
        group: u32,
        index: u64,
        term: u64,
        installed: bool,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Entries before `first_index_to_keep` were dropped.
    Compact { group: u32, first_index_to_keep: u64 },
    /// The leading bytes of the next `Snapshot` op's data (of the same group and index), for a
    /// snapshot over the record limit: [`Journal::write`] cuts it into parts, and reading the
    /// journal joins them again (parts without their `Snapshot`, cut off by a crash, are dropped).
    SnapshotPart {
        group: u32,
        index: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

/// The simulator's disk for a journal: bytes that survive the host's crash.
pub type MemoryDisk = Rc<RefCell<DiskBytes>>;

/// The bytes on a simulated disk, in chunks of [`DiskBytes::CHUNK_BYTES`]. One `Vec` doubled
/// as a journal grew: up to twice its bytes held, and three times while a doubling copied them,
/// on every host of a simulated cluster at once (a quarter of a 4-region Detock run's peak
/// heap, replicated, was its journals' growth).
#[derive(Default)]
pub struct DiskBytes {
    chunks: Vec<Vec<u8>>,
}

impl DiskBytes {
    const CHUNK_BYTES: usize = 1 << 20;

    /// A disk that holds `bytes` (the tests' crashes cut a journal's bytes short).
    #[cfg(test)]
    fn from_bytes(bytes: &[u8]) -> DiskBytes {
        let mut d = DiskBytes::default();
        d.extend(bytes);
        d
    }

    /// Every byte, in one piece (a restarted host reads its journal whole).
    pub fn to_vec(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    fn extend(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.chunks.last().is_none_or(|c| c.len() == Self::CHUNK_BYTES) {
                self.chunks.push(Vec::with_capacity(Self::CHUNK_BYTES));
            }
            let last = self.chunks.last_mut().expect("a chunk was just made");
            let n = (Self::CHUNK_BYTES - last.len()).min(bytes.len());
            last.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    fn replace(&mut self, bytes: &[u8]) {
        self.chunks.clear();
        self.extend(bytes);
    }

    fn truncate(&mut self, len: usize) {
        if len < self.len() {
            let kept = self.to_vec();
            self.replace(&kept[..len]);
        }
    }
}

enum Sink {
    File { file: File, path: PathBuf },
    Memory(MemoryDisk),
}

/// A host's Raft journal; see the module documentation.
pub struct Journal {
    sink: Sink,
    cluster_id: u64,
    host: u16,
    /// The ops written since the last sync, encoded for the journal's file.
    enc: Encoder,
    /// Bytes the last rewrite left (the header's, before any).
    rewritten_len_bytes: u64,
    /// A rewrite under way on its own thread (file journals only).
    rewriting: Option<Rewrite>,
    /// Set once a write or sync failed: the journal takes nothing more.
    failed: Option<String>,
}

/// Ops encoded as journal records, in the write-ahead log's format.
struct Encoder {
    /// Encoded ops not yet written.
    buf: Vec<u8>,
    /// The sequence number of the next record.
    next_seq: u64,
    /// Bytes in the journal, written or buffered.
    len_bytes: u64,
    /// While a rewrite runs: the payload of every record framed since it began, to be framed
    /// again after the live state in the new journal (postcard's own buffers, kept instead of
    /// dropped: no op is copied or encoded a second time).
    kept: Option<Vec<Vec<u8>>>,
}

/// A rewrite of a file journal under way: a thread writes and fsyncs the live state to a
/// temporary file while the old journal goes on taking every op, its encoder keeping each
/// record's payload ([`Encoder::kept`]); the sync that finds the thread done frames those again
/// after the live state in the new file and renames it over the old one. Until that rename the old journal holds everything, so a crash at any point loses
/// nothing; after it the new one does.
struct Rewrite {
    thread: std::thread::JoinHandle<std::io::Result<(File, Encoder)>>,
    /// The journal's bytes when the rewrite began.
    began_at_bytes: u64,
    /// Set once more than [`MAX_BYTES_DURING_REWRITE`] were written meanwhile: the kept
    /// payloads are dropped and the rewrite's file deleted when its thread ends.
    abandoned: bool,
}

/// Bytes written to a journal during a rewrite beyond which the rewrite is given up (its
/// thread runs at the lowest priority, and on a host whose cores are all busy it may take long;
/// meanwhile the old journal's encoder keeps every record's payload).
const MAX_BYTES_DURING_REWRITE: u64 = 256 << 20;

/// Why a journal cannot be opened or written.
#[derive(Debug, thiserror::Error)]
#[error("Raft journal {path}: {reason}")]
pub struct JournalError {
    pub path: String,
    pub reason: String,
    /// The disk is full: nothing of the sync was kept, the ops stay buffered, and a later sync
    /// may succeed once space is freed.
    pub disk_full: bool,
}

impl Journal {
    /// A new, empty journal file at `path` (any old one is replaced), durable before it returns.
    pub fn create_file(path: &Path, cluster_id: u64, host: u16) -> Result<Journal, JournalError> {
        let err = |e: std::io::Error| journal_err(path, format!("cannot create: {e}"));
        let mut file = File::create(path).map_err(err)?;
        file.write_all(&header(cluster_id, host)).map_err(err)?;
        file.sync_all().map_err(err)?;
        sync_parent(path).map_err(err)?;
        let sink = Sink::File { file, path: path.to_path_buf() };
        Ok(Journal::with_sink(sink, cluster_id, host, Encoder::at(1, HEADER_BYTES as u64)))
    }

    /// Opens the journal at `path`, cutting off a torn last record; returns it with the ops it
    /// holds, oldest first.
    pub fn open_file(path: &Path, cluster_id: u64, host: u16) -> Result<(Journal, Vec<JournalOp>), JournalError> {
        let bytes = std::fs::read(path).map_err(|e| journal_err(path, format!("cannot read: {e}")))?;
        let (ops, valid_len, torn, records) = decode(&bytes, cluster_id, host).map_err(|r| journal_err(path, r))?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| journal_err(path, format!("cannot open for appending: {e}")))?;
        if torn {
            crate::rt::log_warn(&format!(
                "Raft journal {}: a torn last record at offset {valid_len} (a write cut short) was cut off",
                path.display()
            ));
            file.set_len(valid_len as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| journal_err(path, format!("cannot cut off the torn tail: {e}")))?;
        }
        let sink = Sink::File { file, path: path.to_path_buf() };
        Ok((Journal::with_sink(sink, cluster_id, host, Encoder::at(records + 1, valid_len as u64)), ops))
    }

    /// A new journal on a simulated disk (whatever it held is replaced).
    pub fn create_memory(disk: MemoryDisk, cluster_id: u64, host: u16) -> Journal {
        disk.borrow_mut().replace(&header(cluster_id, host));
        Journal::with_sink(Sink::Memory(disk), cluster_id, host, Encoder::at(1, HEADER_BYTES as u64))
    }

    /// Reopens a journal from a simulated disk.
    pub fn open_memory(
        disk: MemoryDisk,
        cluster_id: u64,
        host: u16,
    ) -> Result<(Journal, Vec<JournalOp>), JournalError> {
        let (ops, valid_len, _torn, records) =
            decode(&disk.borrow().to_vec(), cluster_id, host).map_err(|r| journal_err(Path::new("(simulated)"), r))?;
        disk.borrow_mut().truncate(valid_len);
        Ok((Journal::with_sink(Sink::Memory(disk), cluster_id, host, Encoder::at(records + 1, valid_len as u64)), ops))
    }

    fn with_sink(sink: Sink, cluster_id: u64, host: u16, enc: Encoder) -> Journal {
        let rewritten_len_bytes = HEADER_BYTES as u64;
        Journal { sink, cluster_id, host, enc, rewritten_len_bytes, rewriting: None, failed: None }
    }

    /// Where the journal is (for messages).
    pub fn path(&self) -> String {
        match &self.sink {
            Sink::File { path, .. } => path.display().to_string(),
            Sink::Memory(_) => "(simulated)".to_string(),
        }
    }

    /// Buffers one op; [`sync`](Self::sync) makes it durable. An `Append` whose record would
    /// be over the journal's record limit is written as several (see [`Encoder::write`]).
    pub fn write(&mut self, op: &JournalOp) {
        self.enc.write(op);
        if let Some(r) = self.rewriting.as_mut().filter(|r| !r.abandoned) {
            if self.enc.len_bytes - r.began_at_bytes > MAX_BYTES_DURING_REWRITE {
                r.abandoned = true;
                self.enc.kept = None;
            }
        }
    }

    /// Whether ops are buffered and not yet durable.
    pub fn has_unsynced(&self) -> bool {
        !self.enc.buf.is_empty()
    }

    /// Writes and fsyncs what was buffered. On a full disk (`ENOSPC` from the write) what part
    /// was written is cut off again and the ops stay buffered: the error says `disk_full`, and a
    /// later sync tries again. After any other failure every call fails: what was buffered may
    /// be partly on disk, and nothing after it may be acknowledged.
    /// A rewrite whose thread is done is finished here, after the sync (see [`Rewrite`]).
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.sync_buffered()?;
        if self.rewriting.as_ref().is_some_and(|r| r.thread.is_finished()) {
            self.finish_rewrite();
        }
        Ok(())
    }

    fn sync_buffered(&mut self) -> Result<(), JournalError> {
        if let Some(reason) = &self.failed {
            return Err(journal_err(Path::new(&self.path()), reason.clone()));
        }
        if self.enc.buf.is_empty() {
            return Ok(());
        }
        let buf = &mut self.enc.buf;
        let written = match &mut self.sink {
            Sink::File { file, .. } => match crate::wal::append_whole_or_nothing(file, buf) {
                Err(f) if f.undone && f.error.kind() == std::io::ErrorKind::StorageFull => {
                    let e = f.error;
                    let reason = format!("the disk is full ({e}): nothing more is acknowledged until space is freed");
                    return Err(JournalError { path: self.path(), reason, disk_full: true });
                }
                Err(f) => Err(f.error),
                Ok(()) => file.sync_data(),
            },
            Sink::Memory(disk) => {
                disk.borrow_mut().extend(buf);
                Ok(())
            }
        };
        buf.clear();
        if buf.capacity() > KEPT_BUFFER_BYTES {
            *buf = Vec::new(); // A snapshot's op passed through: do not hold its size for good.
        }
        written.map_err(|e| {
            let reason = format!("write or fsync failed ({e}); the replicas of this host stop");
            self.failed = Some(reason.clone());
            journal_err(Path::new(&self.path()), reason)
        })
    }

    /// Bytes the journal holds (written or buffered).
    pub fn len_bytes(&self) -> u64 {
        self.enc.len_bytes
    }

    /// Bytes the last finished rewrite left: the live state then.
    pub fn rewritten_len_bytes(&self) -> u64 {
        self.rewritten_len_bytes
    }

    /// Whether a rewrite is under way.
    pub fn rewriting(&self) -> bool {
        self.rewriting.is_some()
    }

    /// Replaces the journal with `ops` (the groups' live state), atomically: a crash leaves the
    /// old journal or the new one. Ops written from here on follow `ops` in the new journal;
    /// ones written before, even if not yet synced, are in `ops` already.
    /// A simulated journal is replaced at once. A file journal is written by a thread of its
    /// own, and a later [`sync`](Self::sync) puts it in the old one's place ([`Rewrite`]); a
    /// rewrite asked for while one is under way is ignored.
    pub fn rewrite(&mut self, ops: Vec<JournalOp>) {
        if self.rewriting.is_some() || self.failed.is_some() {
            return;
        }
        let (cluster_id, host) = (self.cluster_id, self.host);
        match &mut self.sink {
            Sink::Memory(disk) => {
                let mut enc = Encoder::of_new_journal(cluster_id, host, &ops);
                disk.borrow_mut().replace(&std::mem::take(&mut enc.buf));
                self.enc = enc;
                self.rewritten_len_bytes = self.enc.len_bytes;
            }
            Sink::File { path, .. } => {
                let tmp = path.with_extension("rewrite");
                let thread = std::thread::Builder::new().name("journal-rewrite".to_string()).spawn(move || {
                    // Housekeeping: on a host with fewer cores than busy threads it would otherwise take
                    // turns with the replication thread, whose heartbeats then come late.
                    if let Err(e) = crate::util::lower_this_threads_priority(19) {
                        crate::rt::log_warn(&format!("a journal rewrite runs at normal priority (setpriority: {e})"));
                    }
                    let mut enc = Encoder::of_new_journal(cluster_id, host, &ops);
                    drop(ops);
                    let mut f = File::create(&tmp)?;
                    f.write_all(&std::mem::take(&mut enc.buf))?;
                    f.sync_data()?;
                    Ok((f, enc))
                });
                match thread {
                    Ok(thread) => {
                        let began_at_bytes = self.enc.len_bytes;
                        self.enc.kept = Some(Vec::new());
                        self.rewriting = Some(Rewrite { thread, began_at_bytes, abandoned: false })
                    }
                    Err(e) => self.rewrite_failed(&format!("cannot start its thread: {e}")),
                }
            }
        }
    }

    /// The rewrite's thread is done: append what was written since it began to the new file,
    /// fsync it, rename it over the journal. On failure the old journal stays, whole, and the
    /// next rewrite waits until it has doubled.
    fn finish_rewrite(&mut self) {
        let Some(Rewrite { thread, abandoned, .. }) = self.rewriting.take() else { return };
        let kept = self.enc.kept.take().unwrap_or_default();
        let Sink::File { file, path } = &mut self.sink else {
            unreachable!("only a file journal rewrites on a thread")
        };
        let tmp = path.with_extension("rewrite");
        let written = match thread.join() {
            _ if abandoned => Err(std::io::Error::other(format!(
                "over {} MiB were written to the journal while it ran",
                MAX_BYTES_DURING_REWRITE >> 20
            ))),
            Ok(written) => written,
            Err(_) => Err(std::io::Error::other("its thread panicked")),
        };
        let mut live_bytes = 0;
        let written = written.and_then(|(mut f, mut enc)| {
            live_bytes = enc.len_bytes;
            kept.iter().for_each(|payload| enc.frame(payload));
            f.write_all(&std::mem::take(&mut enc.buf))?;
            f.sync_data()?;
            std::fs::rename(&tmp, &*path)?;
            Ok(enc)
        });
        let enc = match written {
            Ok(enc) => enc,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return self.rewrite_failed(&e.to_string());
            }
        };
        // Renamed: the old file is gone, and only the new one may be written from here on.
        match sync_parent(path).and_then(|()| std::fs::OpenOptions::new().append(true).open(&*path)) {
            Ok(f) => {
                *file = f;
                self.enc = enc;
                self.rewritten_len_bytes = live_bytes;
            }
            Err(e) => {
                self.failed = Some(format!("cannot open the rewritten journal: {e}; the replicas of this host stop"));
            }
        }
    }

    /// Waits for a rewrite under way and finishes it (the tests' sync point).
    #[cfg(test)]
    fn finish_rewrite_now(&mut self) {
        self.sync().expect("a sync");
        if let Some(r) = &self.rewriting {
            while !r.thread.is_finished() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.finish_rewrite();
        }
    }

    fn rewrite_failed(&mut self, reason: &str) {
        crate::rt::log_warn(&format!(
            "Raft journal {}: a rewrite failed ({reason}); the journal goes on as it was",
            self.path()
        ));
        self.rewritten_len_bytes = self.enc.len_bytes;
    }
}

impl Encoder {
    /// An encoder for a journal of `len_bytes` whose next record is `next_seq`.
    fn at(next_seq: u64, len_bytes: u64) -> Encoder {
        Encoder { buf: Vec::new(), next_seq, len_bytes, kept: None }
    }

    /// A new journal of `ops`, whole in the buffer (its header first).
    fn of_new_journal(cluster_id: u64, host: u16, ops: &[JournalOp]) -> Encoder {
        let mut enc = Encoder::at(1, HEADER_BYTES as u64);
        enc.buf.extend_from_slice(&header(cluster_id, host));
        ops.iter().for_each(|op| enc.write(op));
        enc
    }

    /// Encodes one op. An `Append` whose record would
    /// be over the journal's record limit is written as several, each of consecutive entries
    /// (the same change: each replaces the suffix from its first index, which the one before
    /// ended at). A log whose state is not compacted (over the snapshot limit) is rewritten as
    /// one `Append` of everything it holds, which outgrew one record.
    pub fn write(&mut self, op: &JournalOp) {
        if let JournalOp::Snapshot { group, index, term, installed, data } = op {
            if data.len() > MAX_OP_BYTES {
                let last = (data.len() - 1) / MAX_OP_BYTES * MAX_OP_BYTES;
                for part in data[..last].chunks(MAX_OP_BYTES) {
                    self.write(&JournalOp::SnapshotPart { group: *group, index: *index, data: part.to_vec() });
                }
                let rest = data[last..].to_vec();
                let (group, index, term, installed) = (*group, *index, *term, *installed);
                return self.write(&JournalOp::Snapshot { group, index, term, installed, data: rest });
            }
        }
        let payload = postcard::to_allocvec(op).expect("a journal op always encodes");
        if let JournalOp::Append { group, entries } = op {
            if payload.len() > MAX_OP_BYTES && entries.len() > 1 {
                let (first, rest) = entries.split_at(entries.len() / 2);
                self.write(&JournalOp::Append { group: *group, entries: first.to_vec() });
                self.write(&JournalOp::Append { group: *group, entries: rest.to_vec() });
                return;
            }
        }
        assert!(
            payload.len() <= crate::wal::MAX_RECORD_BYTES,
            "a journal op of {} bytes: a snapshot or an entry over the record limit",
            payload.len()
        );
        self.frame(&payload);
        if let Some(kept) = &mut self.kept {
            kept.push(payload);
        }
    }

    /// Frames one encoded op as the next record.
    fn frame(&mut self, payload: &[u8]) {
        let before = self.buf.len();
        encode_record(self.next_seq, payload, &mut self.buf);
        self.len_bytes += (self.buf.len() - before) as u64;
        self.next_seq += 1;
    }
}

fn journal_err(path: &Path, reason: String) -> JournalError {
    JournalError { path: path.display().to_string(), reason, disk_full: false }
}

fn header(cluster_id: u64, host: u16) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&cluster_id.to_le_bytes());
    h[16..18].copy_from_slice(&host.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The ops of a journal's bytes, the length of its valid prefix, whether a torn record followed
/// it, and how many records it holds.
fn decode(bytes: &[u8], cluster_id: u64, host: u16) -> Result<(Vec<JournalOp>, usize, bool, u64), String> {
    if bytes.len() >= 8 && OLDER_MAGICS.iter().any(|m| &bytes[..8] == *m) {
        return Err(format!(
            "it was written by an earlier dtx (journal format {}, this build reads format 2): start it with the dtx \
             that wrote it, or give this one an empty --data-dir",
            bytes[7] as char
        ));
    }
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err("not a Raft journal (no header)".to_string());
    }
    let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    if crc != crc32fast::hash(&bytes[..20]) {
        return Err("the header's checksum does not match".to_string());
    }
    let stored_cluster = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let stored_host = u16::from_le_bytes(bytes[16..18].try_into().expect("2 bytes"));
    if stored_cluster != cluster_id || stored_host != host {
        return Err(format!(
            "it belongs to host {stored_host} of cluster {stored_cluster:016x}, not host {host} of cluster {cluster_id:016x}"
        ));
    }
    let decoded = decode_records_from(bytes, HEADER_BYTES, Some(1));
    let (valid_len, torn) = match decoded.end {
        Tail::Clean => (bytes.len(), false),
        Tail::Torn { offset } => (offset, true),
        Tail::Corrupt { offset, reason } => return Err(format!("corrupt at offset {offset}: {reason}")),
    };
    let ops = decoded
        .records
        .iter()
        .map(|(seq, range)| {
            postcard::from_bytes::<JournalOp>(&bytes[range.clone()])
                .map_err(|e| format!("record {seq} at offset {} is not a journal op: {e}", range.start))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let records = ops.len() as u64;
    Ok((join_snapshot_parts(ops), valid_len, torn, records))
}

/// Joins each `Snapshot` op with the `SnapshotPart`s written just before it (see
/// [`Journal::write`]); parts not followed by their snapshot are dropped.
fn join_snapshot_parts(ops: Vec<JournalOp>) -> Vec<JournalOp> {
    let mut out = Vec::with_capacity(ops.len());
    let mut parts: Option<(u32, u64, Vec<u8>)> = None;
    for op in ops {
        match op {
            JournalOp::SnapshotPart { group, index, data } => match &mut parts {
                Some((g, i, bytes)) if (*g, *i) == (group, index) => bytes.extend_from_slice(&data),
                _ => parts = Some((group, index, data)),
            },
            JournalOp::Snapshot { group, index, term, installed, data } => {
                let data = match parts.take() {
                    Some((g, i, mut bytes)) if (g, i) == (group, index) => {
                        bytes.extend_from_slice(&data);
                        bytes
                    }
                    _ => data,
                };
                out.push(JournalOp::Snapshot { group, index, term, installed, data });
            }
            other => {
                parts = None;
                out.push(other);
            }
        }
    }
    out
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<JournalOp> {
        vec![
            JournalOp::HardState { group: 1, term: 2, vote: 3, commit: 0 },
            JournalOp::Append {
                group: 1,
                entries: vec![
                    JournalEntry { index: 1, term: 2, data: vec![] },
                    JournalEntry { index: 2, term: 2, data: vec![7; 300] },
                ],
            },
            JournalOp::Snapshot { group: 4, index: 9, term: 2, installed: true, data: vec![1, 2, 3] },
            JournalOp::Compact { group: 1, first_index_to_keep: 2 },
        ]
    }

    #[test]
    fn ops_come_back_in_order_from_a_file_and_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.journal");
        let mut j = Journal::create_file(&path, 0xc1, 2).unwrap();
        ops().iter().for_each(|op| j.write(op));
        j.sync().unwrap();
        let (mut j, back) = Journal::open_file(&path, 0xc1, 2).unwrap();
        assert_eq!(back, ops());
        j.write(&ops()[0]);
        j.sync().unwrap();
        assert_eq!(Journal::open_file(&path, 0xc1, 2).unwrap().1.len(), 5, "appends after a reopen");

        let disk = MemoryDisk::default();
        let mut m = Journal::create_memory(disk.clone(), 0xc1, 2);
        ops().iter().for_each(|op| m.write(op));
        assert_eq!(Journal::open_memory(disk.clone(), 0xc1, 2).unwrap().1, vec![], "nothing before a sync");
        m.sync().unwrap();
        assert_eq!(Journal::open_memory(disk, 0xc1, 2).unwrap().1, ops());
    }

    #[test]
    fn a_cut_at_any_byte_keeps_a_prefix_of_the_ops() {
        let disk = MemoryDisk::default();
        let mut j = Journal::create_memory(disk.clone(), 5, 0);
        ops().iter().for_each(|op| j.write(op));
        j.sync().unwrap();
        let whole = disk.borrow().to_vec();
        for cut in HEADER_BYTES..=whole.len() {
            let cut_disk = MemoryDisk::new(RefCell::new(DiskBytes::from_bytes(&whole[..cut])));
            let (_, back) = Journal::open_memory(cut_disk, 5, 0).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(back[..], ops()[..back.len()], "cut at {cut}");
        }
    }

    #[test]
    fn another_hosts_or_clusters_journal_and_corruption_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.journal");
        let mut j = Journal::create_file(&path, 1, 0).unwrap();
        ops().iter().for_each(|op| j.write(op));
        j.sync().unwrap();
        let e = Journal::open_file(&path, 2, 0).err().unwrap().to_string();
        assert!(e.contains("raft.journal") && e.contains("cluster"), "{e}");
        let e = Journal::open_file(&path, 1, 3).err().unwrap().to_string();
        assert!(e.contains("host 0"), "{e}");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + 20] ^= 0xff; // inside the first record, valid ones after it
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open_file(&path, 1, 0).err().unwrap().to_string();
        assert!(e.contains("corrupt at offset"), "{e}");
        // A journal of the earlier format: refused, never read as a torn (empty) one.
        bytes[..8].copy_from_slice(b"DTXRAFT1");
        std::fs::write(&path, &bytes).unwrap();
        let e = Journal::open_file(&path, 1, 0).err().unwrap().to_string();
        assert!(e.contains("earlier dtx") && e.contains("--data-dir"), "{e}");
    }

    /// A log's entries that outgrew one record (a group whose state is over the snapshot limit
    /// is never compacted, and a rewrite journals all of it as one `Append`) are written as
    /// several records, and read back as the same entries. The soak found a journal that did
    /// not reopen: its first record was 22 MB, over the reader's limit.
    #[test]
    fn an_append_over_the_record_limit_is_split_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.journal");
        let entry = |index| JournalEntry { index, term: 1, data: vec![index as u8; 1 << 20] };
        let entries: Vec<JournalEntry> = (1..=40).map(entry).collect();
        let mut j = Journal::create_file(&path, 5, 0).unwrap();
        j.rewrite(vec![JournalOp::Append { group: 0, entries: entries.clone() }]);
        j.finish_rewrite_now();
        drop(j);
        let (_, ops) = Journal::open_file(&path, 5, 0).expect("reopens");
        assert!(ops.len() >= 4, "split into records under the limit: {} ops", ops.len());
        let back: Vec<JournalEntry> = ops
            .into_iter()
            .flat_map(|op| match op {
                JournalOp::Append { entries, .. } => entries,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(back, entries);
    }

    #[test]
    fn a_rewrite_replaces_the_journal_with_the_live_ops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.journal");
        let mut j = Journal::create_file(&path, 1, 0).unwrap();
        for _ in 0..50 {
            ops().iter().for_each(|op| j.write(op));
        }
        j.sync().unwrap();
        let before = j.len_bytes();
        j.rewrite(ops()[..2].to_vec());
        assert!(j.rewriting());
        j.write(&ops()[3]);
        j.finish_rewrite_now();
        assert!(!j.rewriting());
        assert!(j.len_bytes() < before / 10);
        j.write(&ops()[2]);
        j.sync().unwrap();
        let (_, back) = Journal::open_file(&path, 1, 0).unwrap();
        assert_eq!(back, vec![ops()[0].clone(), ops()[1].clone(), ops()[3].clone(), ops()[2].clone()]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), j.len_bytes());
        assert!(!path.with_extension("rewrite").exists(), "the temporary file was renamed");
    }

    #[test]
    fn until_a_rewrite_is_renamed_in_the_old_journal_holds_every_op() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.journal");
        let mut j = Journal::create_file(&path, 1, 0).unwrap();
        let mut written = Vec::new();
        for _ in 0..20 {
            ops().iter().for_each(|op| j.write(op));
            written.extend(ops());
        }
        j.sync().unwrap();
        j.rewrite(ops()[..2].to_vec());
        // Ops written and synced while the rewrite's thread works go to the old journal: a
        // crash now reopens all of them, in order, from it.
        j.write(&ops()[3]);
        written.push(ops()[3].clone());
        j.sync_buffered().unwrap();
        let (_, back) = Journal::open_file(&path, 1, 0).unwrap();
        assert_eq!(back, written);
    }

    #[test]
    fn a_rewrite_that_fails_leaves_the_old_journal_going_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.journal");
        // The temporary file cannot be created where a directory stands.
        std::fs::create_dir(path.with_extension("rewrite")).unwrap();
        let mut j = Journal::create_file(&path, 1, 0).unwrap();
        ops().iter().for_each(|op| j.write(op));
        j.sync().unwrap();
        j.rewrite(ops()[..1].to_vec());
        j.write(&ops()[0]);
        j.finish_rewrite_now();
        assert!(!j.rewriting());
        assert_eq!(j.rewritten_len_bytes(), j.len_bytes(), "the next try waits until the journal doubles");
        j.write(&ops()[1]);
        j.sync().unwrap();
        let (_, back) = Journal::open_file(&path, 1, 0).unwrap();
        let mut expected = ops();
        expected.extend([ops()[0].clone(), ops()[1].clone()]);
        assert_eq!(back, expected);
    }

    #[test]
    fn entries_encode_as_a_sequence_of_bytes_would() {
        // serde_bytes writes a byte vector as postcard writes any sequence of bytes (a length,
        // then the bytes), so journals written before it read back unchanged.
        #[derive(Serialize)]
        struct Plain {
            index: u64,
            term: u64,
            data: Vec<u8>,
        }
        let data: Vec<u8> = (0..=255).cycle().take(1000).collect();
        let entry = JournalEntry { index: 7, term: 3, data: data.clone() };
        let encoded = postcard::to_allocvec(&entry).unwrap();
        assert_eq!(encoded, postcard::to_allocvec(&Plain { index: 7, term: 3, data }).unwrap());
        assert_eq!(postcard::from_bytes::<JournalEntry>(&encoded).unwrap(), entry);
    }

    #[test]
    fn a_simulated_journal_is_rewritten_at_once() {
        let disk = MemoryDisk::default();
        let mut j = Journal::create_memory(disk.clone(), 1, 0);
        ops().iter().for_each(|op| j.write(op));
        j.sync().unwrap();
        j.rewrite(ops()[1..3].to_vec());
        assert!(!j.rewriting());
        assert_eq!(j.rewritten_len_bytes(), j.len_bytes());
        j.write(&ops()[0]);
        j.sync().unwrap();
        let (_, back) = Journal::open_memory(disk, 1, 0).unwrap();
        assert_eq!(back, vec![ops()[1].clone(), ops()[2].clone(), ops()[0].clone()]);
    }

    #[test]
    fn a_snapshot_over_the_record_limit_is_written_in_parts_and_read_back_whole() {
        let big = |seed: u8| (0..2 * MAX_OP_BYTES + 5).map(|i| (i as u8).wrapping_add(seed)).collect::<Vec<u8>>();
        let snapshot = JournalOp::Snapshot { group: 3, index: 40, term: 2, installed: false, data: big(1) };
        let after = JournalOp::Compact { group: 3, first_index_to_keep: 41 };
        let disk = MemoryDisk::default();
        let mut j = Journal::create_memory(disk.clone(), 5, 0);
        j.write(&snapshot);
        j.write(&after);
        j.sync().unwrap();
        let (mut reopened, back) = Journal::open_memory(disk.clone(), 5, 0).unwrap();
        assert_eq!(back, vec![snapshot.clone(), after.clone()]);
        assert_eq!(reopened.enc.next_seq, 5, "three snapshot records and the compaction");
        let later = JournalOp::Snapshot { group: 3, index: 50, term: 2, installed: true, data: big(2) };
        reopened.write(&later);
        reopened.sync().unwrap();
        assert_eq!(Journal::open_memory(disk.clone(), 5, 0).unwrap().1, vec![snapshot, after.clone(), later]);

        // A crash that keeps the parts of the second snapshot but not the snapshot itself.
        let whole = disk.borrow().to_vec();
        let cut = MemoryDisk::new(RefCell::new(DiskBytes::from_bytes(&whole[..whole.len() - 100])));
        let back = Journal::open_memory(cut, 5, 0).unwrap().1;
        assert_eq!(back.len(), 2, "the second snapshot's parts are dropped: {:?}", back.last().map(journal_op_kind));
        assert_eq!(back[1], after);
    }

    fn journal_op_kind(op: &JournalOp) -> &'static str {
        match op {
            JournalOp::Append { .. } => "append",
            JournalOp::HardState { .. } => "hard state",
            JournalOp::Snapshot { .. } => "snapshot",
            JournalOp::Compact { .. } => "compact",
            JournalOp::SnapshotPart { .. } => "snapshot part",
        }
    }
}
