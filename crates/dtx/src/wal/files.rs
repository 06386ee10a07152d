//! The log's directory: paths, atomic writes, the segment files, and recovery (checkpoint,
//! segments in order, a torn tail cut off, corruption reported with its file and offset).

use super::*;

// ---------------------------------------------------------------------------------------------
// Files and directories.

pub(super) fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WalError + 'a {
    move |source| WalError::Io { action, path: path.to_path_buf(), source }
}

pub(super) fn corrupt(path: &Path, offset: usize, reason: impl Into<String>) -> WalError {
    WalError::Corrupt { path: path.to_path_buf(), offset: offset as u64, reason: reason.into() }
}

pub(super) fn segment_path(dir: &Path, first_lsn: Lsn) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}{first_lsn:020}{SEGMENT_SUFFIX}"))
}

pub(super) fn checkpoint_path(dir: &Path, lsn: Lsn) -> PathBuf {
    dir.join(format!("{CHECKPOINT_PREFIX}{lsn:020}{CHECKPOINT_SUFFIX}"))
}

pub(super) fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(TEMP_SUFFIX);
    PathBuf::from(name)
}

/// The LSN in a `<prefix><20 digits><suffix>` file name.
pub(super) fn numbered_name(name: &str, prefix: &str, suffix: &str) -> Option<Lsn> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let well_formed = digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit());
    well_formed.then(|| digits.parse().ok()).flatten()
}

/// Segments and checkpoints of a directory, oldest first, and unfinished temporary files.
#[derive(Default)]
pub(super) struct DirListing {
    pub(super) segments: Vec<(Lsn, PathBuf)>,
    pub(super) checkpoints: Vec<(Lsn, PathBuf)>,
    pub(super) temps: Vec<PathBuf>,
}

pub(super) fn list_dir(dir: &Path) -> Result<DirListing, WalError> {
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
pub(super) fn remove_temps(listing: &DirListing) -> Result<(), WalError> {
    for path in &listing.temps {
        fs::remove_file(path).map_err(io_error("remove the unfinished temporary file", path))?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path, fsync: bool) -> Result<(), WalError> {
    if !fsync {
        return Ok(());
    }
    let handle = File::open(dir).map_err(io_error("open the directory to fsync it", dir))?;
    handle.sync_all().map_err(io_error("fsync the directory", dir))
}

/// Writes `parts` to `path` atomically: a temporary file, fsync, rename, fsync of the directory.
/// Returns the file, still open for writing at its end.
/// A write that failed: its error, and whether what part of it reached the file was cut off
/// again (if not, the file ends in a partial write that only recovery, cutting a torn tail, may
/// remove).
pub struct FailedAppend {
    pub error: io::Error,
    pub undone: bool,
}

/// Appends `bytes` to `file` whole, or, when the write fails, cuts off what part of it was
/// written and goes back there, so that a later attempt appends where this one started (the
/// WAL and the Raft journal retry so on a full disk).
pub fn append_whole_or_nothing(file: &mut File, bytes: &[u8]) -> Result<(), FailedAppend> {
    use std::io::{Seek, SeekFrom};
    // The file's length, not its position: a file opened for appending reports position 0
    // until its first write.
    let before = file.metadata().map_err(|error| FailedAppend { error, undone: true })?.len();
    file.write_all(bytes).map_err(|error| {
        let undone = file.set_len(before).and_then(|()| file.seek(SeekFrom::Start(before))).is_ok();
        FailedAppend { error, undone }
    })
}

pub(super) fn write_atomically(path: &Path, parts: &[&[u8]], fsync: bool) -> Result<File, WalError> {
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

pub(super) fn create_segment(cfg: &WalConfig, first_lsn: Lsn) -> Result<(File, PathBuf), WalError> {
    let path = segment_path(&cfg.dir, first_lsn);
    let mut header = Vec::with_capacity(SEGMENT_HEADER_BYTES);
    encode_segment_header(&SegmentHeader { cluster_id: cfg.cluster_id, node: cfg.node, first_lsn }, &mut header);
    let file = write_atomically(&path, &[&header], cfg.fsync)?;
    Ok((file, path))
}

pub(super) fn check_owner(cfg: &WalConfig, path: &Path, found: WalOwner) -> Result<(), WalError> {
    if found == cfg.owner() {
        return Ok(());
    }
    Err(WalError::ForeignCluster { path: path.to_path_buf(), found, expected: cfg.owner() })
}

// ---------------------------------------------------------------------------------------------
// Recovery.

pub(super) struct LoadedCheckpoint {
    pub(super) lsn: Lsn,
    pub(super) snapshot: Vec<u8>,
    /// Newer checkpoints that failed to decode: renamed aside once recovery succeeds.
    pub(super) corrupt_newer: Vec<PathBuf>,
}

/// The newest valid checkpoint; a corrupt newer one is passed over only when an older valid one
/// exists, else its error stops recovery.
pub(super) fn load_checkpoint(cfg: &WalConfig, found: &[(Lsn, PathBuf)]) -> Result<Option<LoadedCheckpoint>, WalError> {
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

pub(super) fn read_checkpoint(cfg: &WalConfig, path: &Path, name_lsn: Lsn) -> Result<Vec<u8>, WalError> {
    let mut bytes = fs::read(path).map_err(io_error("read the checkpoint", path))?;
    format::check_version(path, &bytes, CHECKPOINT_MAGIC)?;
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
pub(super) fn set_aside(paths: &[PathBuf]) -> Result<(), WalError> {
    for path in paths {
        let mut aside = path.as_os_str().to_owned();
        aside.push(SET_ASIDE_SUFFIX);
        fs::rename(path, PathBuf::from(aside)).map_err(io_error("rename aside the corrupt checkpoint", path))?;
    }
    Ok(())
}

#[derive(Default)]
pub(super) struct Replay {
    pub(super) records: Vec<(Lsn, Vec<u8>)>,
    /// LSN of the last record in the segments (0 if none).
    pub(super) last_lsn: Lsn,
    pub(super) torn_tail: Option<(PathBuf, u64)>,
    /// (first LSN, path), oldest first.
    pub(super) segments: VecDeque<(Lsn, PathBuf)>,
    /// Size of the last segment after any torn tail was cut off.
    pub(super) last_segment_bytes: u64,
}

pub(super) fn replay_segments(
    cfg: &WalConfig,
    found: &[(Lsn, PathBuf)],
    checkpoint_lsn: Lsn,
) -> Result<Replay, WalError> {
    let mut replay = Replay::default();
    for (index, (name_lsn, path)) in found.iter().enumerate() {
        let is_last = index + 1 == found.len();
        replay_segment(cfg, path, *name_lsn, is_last, checkpoint_lsn, &mut replay)?;
    }
    Ok(replay)
}

pub(super) fn replay_segment(
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

pub(super) fn read_segment_header(
    cfg: &WalConfig,
    path: &Path,
    bytes: &[u8],
    name_lsn: Lsn,
) -> Result<SegmentHeader, WalError> {
    format::check_version(path, bytes, SEGMENT_MAGIC)?;
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
pub(super) fn check_segment_start(
    path: &Path,
    first_lsn: Lsn,
    previous_lsn: Lsn,
    checkpoint_lsn: Lsn,
) -> Result<(), WalError> {
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
pub(super) fn settle_tail(
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

pub(super) fn truncate(path: &Path, len: u64, fsync: bool) -> Result<(), WalError> {
    let file = OpenOptions::new().write(true).open(path).map_err(io_error("open to cut off its torn tail", path))?;
    file.set_len(len).map_err(io_error("cut off the torn tail of", path))?;
    if fsync {
        file.sync_all().map_err(io_error("fsync after cutting off the torn tail", path))?;
    }
    Ok(())
}
