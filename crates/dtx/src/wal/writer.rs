//! The log itself: appenders copy records into a shared buffer and get their LSN at once; one
//! flusher thread per log writes the whole buffer, fdatasyncs, and advances the durable LSN
//! (group commit). Appenders wait only when the unwritten buffer reaches its bound.

use super::*;

// ---------------------------------------------------------------------------------------------
// The log.

/// Called with the durable LSN and, per append lane, the number of its last record now durable.
pub(super) type DurableCallback = Box<dyn Fn(Lsn, &[u64]) + Send + Sync>;

/// A point in the buffer where the appender decided the next record opens a new segment.
pub(super) struct Roll {
    pub(super) at: usize,
    pub(super) first_lsn: Lsn,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Trigger {
    Size,
    Time,
    Close,
}

/// What appenders and the flusher share under one short lock.
pub(super) struct State {
    /// Encoded records not yet taken by the flusher.
    pub(super) buf: Vec<u8>,
    pub(super) rolls: Vec<Roll>,
    pub(super) next_lsn: Lsn,
    pub(super) first_unflushed_at: Option<Instant>,
    /// Taken by the flusher, not yet written and synced: still counts against the memory bound.
    pub(super) in_flight_bytes: usize,
    /// Size the current segment will have once everything buffered is written.
    pub(super) segment_bytes: u64,
    pub(super) durable_lsn: Lsn,
    pub(super) closing: bool,
    pub(super) flusher_done: bool,
    pub(super) failure: Option<Arc<WalError>>,
    pub(super) records: u64,
    pub(super) bytes: u64,
    pub(super) append_waits: u64,
}

impl State {
    pub(super) fn check_accepting(&self, dir: &Path) -> Result<(), WalError> {
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
    pub(super) fn place_in_segment(&mut self, lsn: Lsn, record_bytes: u64, segment_limit_bytes: u64) {
        self.place_in_segment_at(self.buf.len(), lsn, record_bytes, segment_limit_bytes)
    }

    /// [`State::place_in_segment`] for a record that starts `at` bytes into the next group.
    pub(super) fn place_in_segment_at(&mut self, at: usize, lsn: Lsn, record_bytes: u64, segment_limit_bytes: u64) {
        let has_records = self.segment_bytes > SEGMENT_HEADER_BYTES as u64;
        if has_records && self.segment_bytes + record_bytes > segment_limit_bytes {
            self.rolls.push(Roll { at, first_lsn: lsn });
            self.segment_bytes = SEGMENT_HEADER_BYTES as u64;
        }
        self.segment_bytes += record_bytes;
    }
}

#[derive(Default)]
pub(super) struct IoCounters {
    pub(super) group_writes: AtomicU64,
    pub(super) fsyncs: AtomicU64,
    pub(super) fsync_total_ns: AtomicU64,
    pub(super) fsync_max_ns: AtomicU64,
    pub(super) flushes_by_size: AtomicU64,
    pub(super) flushes_by_time: AtomicU64,
    pub(super) flushes_by_close: AtomicU64,
    pub(super) disk_full_waits: AtomicU64,
    /// The file a write waits for room for, while the disk is full.
    pub(super) full_file: Mutex<Option<PathBuf>>,
}

/// How long the flusher waits before it tries a write again on a full disk.
const DISK_FULL_RETRY: Duration = Duration::from_millis(100);

/// Whether `e` says the disk (or the filesystem) has no room: a write may then succeed later,
/// once space is freed. Any other error leaves the file in an unknown state.
fn is_disk_full(e: &WalError) -> bool {
    matches!(e, WalError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull)
}

pub(super) struct Shared {
    pub(super) cfg: WalConfig,
    pub(super) max_unwritten_bytes: usize,
    /// The flusher starts as soon as this much is buffered: the group size, or less if the
    /// memory bound is lower (so blocked appenders are released without waiting for the timer).
    pub(super) flush_at_bytes: usize,
    pub(super) state: Mutex<State>,
    /// The flusher waits here for work.
    pub(super) work_cv: Condvar,
    /// Appenders blocked by the memory bound wait here.
    pub(super) space_cv: Condvar,
    /// `wait_durable` callers wait here.
    pub(super) durable_cv: Condvar,
    pub(super) durable_lsn: AtomicU64,
    pub(super) on_durable: RwLock<Option<DurableCallback>>,
    /// (first LSN, path) of every segment on disk, oldest first; the last is the one written.
    pub(super) segments: Mutex<VecDeque<(Lsn, PathBuf)>>,
    /// The newest checkpoint's LSN; the lock also serializes `checkpoint` calls.
    pub(super) newest_checkpoint: Mutex<Option<Lsn>>,
    pub(super) io: IoCounters,
    /// The append lanes ([`super::lanes`]), their bytes not yet cut, and whether they refuse
    /// appends (closing or failed).
    pub(super) lanes: Vec<Mutex<AppendLane>>,
    pub(super) lane_bytes: AtomicUsize,
    pub(super) refusing: AtomicBool,
}

/// A write-ahead log with group commit; shared as `Arc<Wal>`.
pub struct Wal {
    pub(super) shared: Arc<Shared>,
    pub(super) flusher: Mutex<Option<JoinHandle<()>>>,
    /// Held while the log is open (removed by `close`).
    pub(super) lock: DirLock,
}

/// `LOCK` in a log's directory names the process that has the log open. A lock left by a process
/// that no longer runs (killed with kill -9) is stale and taken over; a live one refuses the open.
pub(super) struct DirLock {
    pub(super) path: PathBuf,
}

pub(super) const LOCK_FILE: &str = "LOCK";

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
pub(super) fn process_runs(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

impl Wal {
    /// Recovers the directory (see the module comment) and starts the flusher thread.
    pub fn open(cfg: WalConfig) -> Result<(Arc<Wal>, Recovered), WalError> {
        Self::open_bounded(cfg, MAX_UNWRITTEN_BYTES)
    }

    pub(super) fn open_bounded(cfg: WalConfig, max_unwritten_bytes: usize) -> Result<(Arc<Wal>, Recovered), WalError> {
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
        self.append_parts(&[payload])
    }

    /// [`Wal::append`] of one record whose payload is `parts` one after the other (a header
    /// and a body kept apart), without joining them into one buffer first.
    fn append_parts(&self, parts: &[&[u8]]) -> Result<Lsn, WalError> {
        let payload_bytes: usize = parts.iter().map(|p| p.len()).sum();
        if payload_bytes > MAX_RECORD_BYTES {
            return Err(WalError::RecordTooLarge { payload_bytes });
        }
        // The payload's checksum is computed before the lock; under it only the 8 LSN bytes are
        // added to it.
        let mut payload_crc = Hasher::new();
        for p in parts {
            payload_crc.update(p);
        }
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        shared.wait_for_space(&mut state);
        state.check_accepting(&shared.cfg.dir)?;
        let lsn = state.next_lsn;
        state.next_lsn += 1;
        let record_bytes = RECORD_HEADER_BYTES + payload_bytes;
        state.place_in_segment(lsn, record_bytes as u64, shared.cfg.segment_bytes);
        let was_empty = state.buf.is_empty();
        if was_empty {
            state.first_unflushed_at = Some(Instant::now());
        }
        put_record(lsn, format::record_crc_of(lsn, payload_crc), parts, &mut state.buf);
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

    /// How many append lanes the log has ([`Wal::append_to_lane`]).
    pub fn lanes(&self) -> usize {
        self.shared.lanes.len()
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
    pub fn set_on_durable(&self, f: DurableCallback) {
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

    /// While the disk is full: the file a write of this log waits for room for.
    pub fn disk_full_file(&self) -> Option<PathBuf> {
        self.shared.io.full_file.lock().clone()
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
            disk_full_waits: io.disk_full_waits.load(Ordering::Relaxed),
            append_waits: state.append_waits,
            durable_lsn: state.durable_lsn,
        }
    }

    /// Flushes what is buffered and stops the flusher thread; later appends fail with `Closed`.
    /// Idempotent; also done on drop.
    pub fn close(&self) {
        self.shared.state.lock().closing = true;
        self.shared.refuse_lane_appends();
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

pub(super) fn open_active_segment(cfg: &WalConfig, replay: &mut Replay, checkpoint_lsn: Lsn) -> Result<File, WalError> {
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

pub(super) fn remove_checkpoints_before(dir: &Path, lsn: Lsn) -> Result<(), WalError> {
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
        let cfg_lanes = cfg.lanes.max(1);
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
            lanes: (0..cfg_lanes).map(|_| Mutex::new(AppendLane::default())).collect(),
            lane_bytes: AtomicUsize::new(0),
            refusing: AtomicBool::new(false),
        }
    }

    /// Bounded memory: while more than `max_unwritten_bytes` are buffered and not yet written,
    /// the appender blocks here until the flusher has written a group.
    pub(super) fn wait_for_space(&self, state: &mut MutexGuard<'_, State>) {
        while state.buf.len() + self.lane_bytes() + state.in_flight_bytes >= self.max_unwritten_bytes
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
pub(super) struct Batch {
    pub(super) bytes: Vec<u8>,
    pub(super) rolls: Vec<Roll>,
    pub(super) last_lsn: Lsn,
    /// Per append lane, the number of its last record in this group.
    pub(super) lane_marks: Vec<u64>,
    /// The LSN of the first lane record (they follow the records in `bytes`).
    pub(super) first_lane_lsn: Lsn,
}

/// The segment file the flusher appends to.
pub(super) struct ActiveSegment {
    pub(super) file: File,
    pub(super) path: PathBuf,
}

/// Appends `bytes` to the segment whole, or (the write failed) cuts off what part of it was
/// written, so that a later attempt appends where this one started.
fn write_whole_or_nothing(segment: &mut ActiveSegment, bytes: &[u8]) -> Result<(), WalError> {
    super::files::append_whole_or_nothing(&mut segment.file, bytes).map_err(|f| match f.undone {
        true => io_error("write to the write-ahead log segment", &segment.path)(f.error),
        // The partial write stays: only a restart's recovery (which cuts a torn tail) may go on.
        false => io_error("cut a partial write off the write-ahead log segment", &segment.path)(f.error),
    })
}

pub(super) fn spawn_flusher(shared: Arc<Shared>, file: File) -> Result<JoinHandle<()>, WalError> {
    let path = shared.segments.lock().back().map(|(_, p)| p.clone()).unwrap_or_default();
    let dir = shared.cfg.dir.clone();
    std::thread::Builder::new()
        .name("dtx-wal-flusher".into())
        .spawn(move || run_flusher(&shared, ActiveSegment { file, path }))
        .map_err(io_error("start the flusher thread for", &dir))
}

pub(super) fn run_flusher(shared: &Shared, mut segment: ActiveSegment) {
    let mut spare = Vec::new();
    let mut taken: Vec<lanes::AppendLane> = (0..shared.lanes.len()).map(|_| Default::default()).collect();
    while let Some(mut batch) = shared.next_batch(&mut spare, &mut taken) {
        lanes::fill_cut(&mut taken, batch.first_lane_lsn, &mut batch.bytes);
        let written = shared.write_batch(&mut segment, &batch);
        spare = batch.bytes;
        spare.clear();
        match written {
            Ok(()) => shared.mark_durable(batch.last_lsn, &batch.lane_marks),
            Err(error) => return shared.fail(error),
        }
    }
}

impl Shared {
    /// Waits until a flush is due (size, time or close) and takes the whole buffer, leaving
    /// `spare` (an emptied earlier buffer) in its place so appenders rarely reallocate.
    /// None once closing and everything is written.
    fn next_batch(&self, spare: &mut Vec<u8>, taken: &mut [lanes::AppendLane]) -> Option<Batch> {
        let mut state = self.state.lock();
        let trigger = loop {
            if state.buf.is_empty() && self.lane_bytes() == 0 {
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
        let (lane_marks, first_lane_lsn, lane_bytes) = self.cut_lanes(&mut state, bytes.len(), taken);
        state.in_flight_bytes = bytes.len() + lane_bytes;
        state.first_unflushed_at = None;
        let rolls = std::mem::take(&mut state.rolls);
        Some(Batch { bytes, rolls, last_lsn: state.next_lsn - 1, lane_marks, first_lane_lsn })
    }

    fn flush_due(&self, state: &State) -> Option<Trigger> {
        if state.closing {
            return Some(Trigger::Close);
        }
        if state.buf.len() + self.lane_bytes() >= self.flush_at_bytes {
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
        let path = segment.path.clone();
        self.while_disk_full(&path, || write_whole_or_nothing(segment, bytes))?;
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

    /// Runs `attempt` until it succeeds or fails for another reason than a full disk. On a full
    /// disk nothing of the group becomes durable, so no commit in it is acknowledged; appenders
    /// go on buffering until the memory bound, then wait. Said once per episode, on stderr,
    /// naming the file; the log goes on by itself once space is freed. A log being closed
    /// gives up (its records were never durable, so never acknowledged).
    fn while_disk_full<T>(&self, path: &Path, mut attempt: impl FnMut() -> Result<T, WalError>) -> Result<T, WalError> {
        let mut waited = false;
        loop {
            match attempt() {
                Err(e) if is_disk_full(&e) && !self.state.lock().closing => {
                    if !waited {
                        waited = true;
                        self.io.disk_full_waits.fetch_add(1, Ordering::Relaxed);
                        *self.io.full_file.lock() = Some(path.to_path_buf());
                        eprintln!(
                            "dtx: warning: {e} The disk is full: commits wait, unacknowledged, and the log tries \
                             again every {} ms until space is freed.",
                            DISK_FULL_RETRY.as_millis()
                        );
                    }
                    std::thread::sleep(DISK_FULL_RETRY);
                }
                Err(e) => return Err(e),
                Ok(v) => {
                    if waited {
                        *self.io.full_file.lock() = None;
                        eprintln!("dtx: the disk has room again: the write-ahead log {} goes on.", path.display());
                    }
                    return Ok(v);
                }
            }
        }
    }

    fn roll_segment(&self, first_lsn: Lsn) -> Result<ActiveSegment, WalError> {
        let (file, path) = self.while_disk_full(&self.cfg.dir, || create_segment(&self.cfg, first_lsn))?;
        self.segments.lock().push_back((first_lsn, path.clone()));
        Ok(ActiveSegment { file, path })
    }

    fn mark_durable(&self, lsn: Lsn, lane_marks: &[u64]) {
        // The callback first: whoever waits for `lsn` (`wait_durable`) finds its lanes' marks
        // reported too.
        if let Some(on_durable) = &*self.on_durable.read() {
            on_durable(lsn, lane_marks);
        }
        let mut state = self.state.lock();
        state.in_flight_bytes = 0;
        state.durable_lsn = lsn;
        self.durable_lsn.store(lsn, Ordering::Release);
        drop(state);
        self.durable_cv.notify_all();
        self.space_cv.notify_all();
    }

    /// A failed write or fsync leaves the file in an unknown state (after a failed fsync the
    /// kernel may have dropped the dirty pages), so the log stops: nothing later may become durable.
    /// Said on stderr, with the file and the error; commits waiting for it are never
    /// acknowledged, and a restart recovers what was durable.
    fn fail(&self, error: WalError) {
        // A log closed while its disk was full gives up its write on purpose (`while_disk_full`):
        // whoever closed it says so.
        if !(is_disk_full(&error) && self.state.lock().closing) {
            eprintln!(
                "dtx: error: {error} The write-ahead log in {} stopped: nothing more is acknowledged. Replace or \
                 repair the disk, then restart the server: it recovers every acknowledged commit from the log.",
                self.cfg.dir.display()
            );
        }
        let mut state = self.state.lock();
        state.failure = Some(Arc::new(error));
        state.flusher_done = true;
        self.refusing.store(true, Ordering::Release);
        drop(state);
        self.durable_cv.notify_all();
        self.space_cv.notify_all();
    }
}
