//! A node's log as protocol code sees it: append a record (its LSN comes back at once), then
//! await its durability. Which device is underneath is the runtime's choice:
//! - `local` and `tcp`: real write-ahead logs on disk ([`crate::wal::Wal`]), whose flusher
//!   threads group-commit with fsync and wake the waiters;
//! - `sim`: simulated disks whose flushes the simulator schedules in virtual time (group-commit
//!   delay plus an fsync cost), and whose unflushed tail a crash loses;
//! - `replicated`: one stream that a majority of the node's log replicas must hold.
//!
//! On a disk the log is split into lanes, one per worker, so that workers append without sharing
//! a buffer or a lock (Silo's and Rolis's per-worker logs). On a real disk a lane is an append
//! lane of the node's one WAL ([`Wal::append_to_lane`]): the WAL's flusher cuts every lane at
//! once into one group, one write and one fsync. In the simulator each lane is a disk of its own,
//! flushed on its own, which gives recovery more ways to lose a lane's tail than the real log.
//! A node-wide sequence number orders the lanes: it is the LSN protocol code sees, and a record
//! is durable once every record of every lane up to its sequence number is (see
//! [`super::lanes`] for the argument and for recovery). Which lane a record goes to is the
//! runtime's choice too: the lane of the worker running on this thread ([`enter_lane`]).
//!
//! The log is shared by the workers of a node, so it is `Send + Sync`; waiting is a future woken
//! through the task's waker, which works across threads, so protocol code never blocks a
//! worker on I/O.

use super::lanes::{self, KIND_RECORD, KIND_VOID, LANE_HEADER_BYTES};
use crate::wal::{Lsn, Wal, MAX_RECORD_BYTES};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

thread_local! {
    /// The lane this thread appends to: its worker's index (set by the runtime).
    static LANE: Cell<u16> = const { Cell::new(0) };
    /// Bytes of records this thread appended since the simulator last asked
    /// ([`take_appended_bytes`]): what it charges the worker that appended them.
    static APPENDED_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// The bytes of records this thread appended since the last call. The simulator calls it
/// around each step to charge the worker for encoding and copying its records
/// (`CpuCost::log_ns_per_kib`); the real runtimes never call it, and pay in time.
pub fn take_appended_bytes() -> u64 {
    APPENDED_BYTES.with(|b| b.replace(0))
}

/// The runtime runs worker `worker`'s code on this thread from now on: its appends go to that
/// worker's lane. (`local` and `tcp` call it once per worker thread, `sim` before each step.)
pub fn enter_lane(worker: u16) {
    LANE.with(|l| l.set(worker));
}

fn current_lane(lanes: usize) -> usize {
    LANE.with(|l| l.get()) as usize % lanes
}

/// How the simulator models a disk: records buffered in memory, made durable by flushes.
#[derive(Default)]
pub struct SimDisk {
    /// Records that survived every crash so far (lane LSN i+1 at index i).
    durable: Vec<Vec<u8>>,
    /// Appended, not yet durable.
    pending: Vec<Vec<u8>>,
    /// How many of `pending` the flush in progress covers (0 = no flush in progress).
    flushing: usize,
    /// Records a checkpoint made redundant, dropped from the front of `durable` (lane LSNs
    /// go on counting them).
    compacted: usize,
}

impl SimDisk {
    /// The flush in progress reached the disk; returns the lane LSN durable now.
    fn finish_flush(&mut self) -> Lsn {
        let n = self.flushing;
        let done: Vec<Vec<u8>> = self.pending.drain(..n).collect();
        self.durable.extend(done);
        self.flushing = 0;
        self.durable_lane_lsn()
    }

    /// The lane LSN of its last durable record.
    fn durable_lane_lsn(&self) -> Lsn {
        (self.compacted + self.durable.len()) as Lsn
    }

    /// The durable record at lane LSN `lane_lsn`, unless it was compacted away or is not durable.
    fn durable_at(&self, lane_lsn: usize) -> Option<&[u8]> {
        self.durable.get(lane_lsn.checked_sub(self.compacted + 1)?).map(|r| r.as_slice())
    }

    /// Drop the durable records at the front whose sequence number is at most `seq`.
    fn compact_through(&mut self, seq: Lsn) {
        let covered = self.durable.iter().take_while(|r| lanes::decode(r).is_ok_and(|d| d.seq() <= seq)).count();
        self.durable.drain(..covered);
        self.compacted += covered;
    }
}

/// What a simulated log's disk kept at a crash: each lane's durable records, oldest first, and
/// the newest checkpoint (the sequence number it covers, the log machine's snapshot).
#[derive(Debug, Clone, Default)]
pub struct SimImage {
    pub lanes: Vec<Vec<Vec<u8>>>,
    pub checkpoint: Option<(Lsn, Vec<u8>)>,
}

/// The simulator's checkpointer: the log machine applies this boot's records as they become
/// durable, in sequence order, and every `every` records its snapshot becomes the disk's
/// checkpoint and the records it covers are dropped, as the real checkpointer does to whole
/// segments.
struct SimCheckpointer {
    machine: Box<dyn LogMachine>,
    every: u64,
    /// Every record up to this sequence number is in the machine.
    applied_seq: Lsn,
    since: u64,
    /// Per lane, the lane LSN (1-based) of the next durable record to look at.
    next_in_lane: Vec<usize>,
}

/// Records waiting to be proposed to the node's replicated log, and the task that proposes them.
#[derive(Default)]
pub struct ReplQueue {
    pending: Vec<Vec<u8>>,
    appended: Lsn,
    replicator: Option<Waker>,
}

enum Device {
    /// An append lane of the node's WAL (the lane's index in `NodeLog::lanes` is its index in the WAL).
    Wal(Arc<Wal>),
    Sim(Mutex<SimDisk>),
    /// Durable once a majority of the node's log replicas hold it (`replication::service`).
    /// Its one stream is already ordered: its LSNs are the log's, with no lane records.
    Replicated(Mutex<ReplQueue>),
}

/// One lane of a node's log: its device, and the sequence numbers appended to it that are not
/// durable yet (with their LSN in the lane), oldest first.
struct Lane {
    device: Device,
    unflushed: Mutex<VecDeque<(Lsn, Lsn)>>,
    /// Tasks of this lane's worker waiting for an LSN to become durable, lowest LSN first: a
    /// lane's own list, so that workers do not share one, and a heap, so that a flush wakes
    /// the tasks it made durable without visiting the others.
    waiters: Mutex<BinaryHeap<Waiter>>,
}

/// A task waiting for `lsn` to become durable; ordered so that a `BinaryHeap` pops the lowest.
struct Waiter {
    lsn: Lsn,
    waker: Waker,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.lsn == other.lsn
    }
}
impl Eq for Waiter {}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.lsn.cmp(&self.lsn)
    }
}

impl Lane {
    fn new(device: Device) -> Lane {
        Lane { device, unflushed: Mutex::new(VecDeque::new()), waiters: Mutex::new(BinaryHeap::new()) }
    }

    /// Append one lane record to lane `index`'s device, its header made by `head` with the
    /// sequence number it takes, given the record's number in the lane; returns that number and
    /// the sequence number. A WAL's lane calls `head` under the lane's lock, so the number is in
    /// the same cut as the record, and only once the record is sure to go in.
    fn put(
        &self,
        index: usize,
        body: &[u8],
        head: impl FnOnce(Lsn) -> (Lsn, [u8; LANE_HEADER_BYTES]),
    ) -> Result<(Lsn, Lsn), String> {
        match &self.device {
            Device::Wal(wal) => {
                let mut seq = 0;
                let number = wal
                    .append_to_lane(index, body, |number| {
                        let (s, h) = head(number);
                        seq = s;
                        h
                    })
                    .map_err(|e| e.to_string())?;
                Ok((number, seq))
            }
            Device::Sim(disk) => {
                let mut d = disk.lock();
                let number = d.durable_lane_lsn() + d.pending.len() as Lsn + 1;
                let (seq, h) = head(number);
                d.pending.push([&h[..], body].concat());
                Ok((number, seq))
            }
            Device::Replicated(_) => unreachable!("a replicated log has no lanes"),
        }
    }
}

/// A protocol's log state machine: what a node's log records amount to. The protocol owns it
/// (`Protocol::log_machine`); the checkpointer, the replicas of a replicated log and failover
/// drive it with the protocol's records as bytes and never look inside them.
///
/// Contract: records are applied in log order, each once; `snapshot` is what recovery starts
/// from (the protocol's `log_machine(Some(snapshot))`), and applying the records after it must
/// give the state that applying every record from the start gives.
pub trait LogMachine: Send {
    fn apply(&mut self, record: &[u8]);
    /// The record-level steps (writes replayed) applying has taken since the last call, for
    /// the simulator's charge: a record of a thousand transactions' writes costs its writes,
    /// not one step. A machine that does not count them is charged one step per record.
    fn take_steps(&mut self) -> usize {
        0
    }
    fn snapshot(&self) -> Vec<u8>;
    /// What the machine counts of what it applied (a replica that executes its log: the
    /// transactions it ran), for the report; summed over every replica of every log.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// For a machine that replays its log only below a watermark the leader carries in it
    /// (Rolis's replicas): the point, in microseconds of the protocol's clock, up to which it
    /// has applied everything. The report's replay lag is how far the slowest replica's point
    /// trails the furthest one's at the end of the run.
    fn applied_watermark_us(&self) -> Option<u64> {
        None
    }
}

/// The log machine of a protocol that logs nothing it recovers from.
pub struct NoLog;

impl LogMachine for NoLog {
    fn apply(&mut self, _record: &[u8]) {}
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
}

/// Records queued for the checkpointer thread; appenders wait when it falls this far behind.
const CHECKPOINT_QUEUE: usize = 1 << 16;
/// Durable cuts kept for the checkpointer (each holds at least one record, so this many cover
/// its whole queue).
const MAX_CUTS_KEPT: usize = CHECKPOINT_QUEUE;

/// A record on its way to the checkpointer: its sequence number and bytes.
type Appended = (Lsn, Vec<u8>);

/// The WAL's cuts made durable, as the checkpointer needs them: (the largest sequence number in
/// the cut, the WAL LSN the cut ends at), oldest first. A cut holds every sequence number up to
/// its largest that no earlier cut holds (the cut is consistent: [`Wal::append_to_lane`]).
#[derive(Default)]
struct Cuts {
    durable: Mutex<CutsState>,
    cv: parking_lot::Condvar,
}

#[derive(Default)]
struct CutsState {
    cuts: VecDeque<(Lsn, Lsn)>,
    stopping: bool,
}

impl Cuts {
    fn push(&self, seq_end: Lsn, wal_lsn: Lsn) {
        let mut d = self.durable.lock();
        // The checkpointer lags its appenders by at most its queue: older cuts are never needed.
        if d.cuts.len() >= MAX_CUTS_KEPT {
            d.cuts.pop_front();
        }
        d.cuts.push_back((seq_end, wal_lsn));
        drop(d);
        self.cv.notify_all();
    }

    /// Once every sequence number up to `seq` is durable: the WAL LSN of the end of the last
    /// cut that holds nothing past `seq` (every record after it in the WAL that is at most `seq`
    /// is skipped at recovery, and every record past `seq` is after it), or 0 when no cut kept
    /// here is that old. None when stopping.
    fn wal_lsn_covering(&self, seq: Lsn) -> Option<Lsn> {
        let mut d = self.durable.lock();
        while d.cuts.back().is_none_or(|&(end, _)| end < seq) {
            if d.stopping {
                return None;
            }
            self.cv.wait_for(&mut d, std::time::Duration::from_millis(100));
        }
        let Some(at) = d.cuts.iter().rposition(|&(end, _)| end <= seq) else { return Some(0) };
        let (_, wal_lsn) = d.cuts[at];
        d.cuts.drain(..at);
        Some(wal_lsn)
    }

    fn stop(&self) {
        self.durable.lock().stopping = true;
        self.cv.notify_all();
    }
}

/// Feeds a [`LogMachine`] on its own thread, in sequence order, and checkpoints the log every
/// `every` records: the snapshot, behind the sequence number it covers, at the WAL LSN where
/// the last cut it covers ends; the WAL then drops the segments it covers.
struct Checkpointer {
    tx: std::sync::mpsc::SyncSender<Appended>,
    thread: Option<std::thread::JoinHandle<()>>,
    cuts: Arc<Cuts>,
}

impl Checkpointer {
    fn start(wal: Arc<Wal>, mut machine: Box<dyn LogMachine>, every: u64, cuts: Arc<Cuts>) -> Checkpointer {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Appended>(CHECKPOINT_QUEUE);
        let waiting = cuts.clone();
        let spawned = std::thread::Builder::new().name("dtx-checkpointer".into()).spawn(move || {
            let mut since = 0;
            for (seq, rec) in rx {
                machine.apply(&rec);
                since += 1;
                if since < every {
                    continue;
                }
                since = 0;
                let Some(wal_lsn) = waiting.wal_lsn_covering(seq) else { return };
                // No cut kept holds only numbers up to `seq`: nothing to cover yet.
                if wal_lsn == 0 {
                    continue;
                }
                let mut bytes = seq.to_le_bytes().to_vec();
                bytes.extend_from_slice(&machine.snapshot());
                if let Err(e) = wal.checkpoint(wal_lsn, &bytes) {
                    super::log_warn(&format!("checkpoint at sequence number {seq} failed: {e}"));
                }
            }
        });
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                super::log_warn(&format!("cannot start the checkpointer: {e}; the log will not be checkpointed"));
                None
            }
        };
        Checkpointer { tx, thread, cuts }
    }

    /// Stop taking records and wait for the thread (and its hold on the WAL) to end.
    fn stop(self) {
        let Checkpointer { tx, thread, cuts } = self;
        drop(tx);
        cuts.stop();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Split a lane checkpoint's bytes into the sequence number it covers and the snapshot.
pub fn split_checkpoint(bytes: &[u8]) -> Result<(Lsn, &[u8]), String> {
    if bytes.len() < 8 {
        return Err(format!("a checkpoint of {} bytes lacks its sequence number", bytes.len()));
    }
    Ok((u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")), &bytes[8..]))
}

impl NodeLog {
    fn stop_checkpointer(&self) {
        if let Some(c) = self.checkpointer.get().and_then(|c| c.lock().take()) {
            c.stop();
        }
    }

    /// While its disk is full (a WAL's write waits for room): the file it waits for.
    pub fn disk_full_file(&self) -> Option<std::path::PathBuf> {
        match &self.lanes[0].device {
            Device::Wal(wal) => wal.disk_full_file(),
            Device::Sim(_) | Device::Replicated(_) => None,
        }
    }

    /// The run is over: stop the checkpointer and close the WALs (flushing what they buffered
    /// and releasing their directory locks), even if tasks that never finished still hold this log.
    pub fn shutdown(&self) {
        self.stop_checkpointer();
        if let Device::Wal(wal) = &self.lanes[0].device {
            wal.close();
        }
    }
}

impl Drop for NodeLog {
    /// The checkpointer holds the WALs open: end it first, so that they close (and release
    /// their directory locks) when the log goes.
    fn drop(&mut self) {
        self.stop_checkpointer();
    }
}

pub struct NodeLog {
    lanes: Vec<Lane>,
    /// The next sequence number (the LSN protocol code sees). A lane takes it under the lane's
    /// lock and queues it in `unflushed` before releasing it: [`NodeLog::lane_durable`] relies on that.
    next_seq: AtomicU64,
    /// Set once, when checkpoints are on: appends then go through its lock, so that records
    /// reach the checkpointer in sequence order. Without checkpoints an append takes no lock here.
    checkpointer: std::sync::OnceLock<Mutex<Option<Checkpointer>>>,
    /// The WAL's durable cuts, kept only while a checkpointer runs.
    cuts: std::sync::OnceLock<Arc<Cuts>>,
    durable: AtomicU64,
    /// Bytes of records appended since the log opened (what a protocol that checkpoints by the
    /// log's growth watches: [`NodeLog::appended_bytes`]).
    appended_bytes: AtomicU64,
    sim_checkpointer: Mutex<Option<SimCheckpointer>>,
    /// The simulated disk's newest checkpoint (kept across crashes in [`SimImage`]).
    sim_checkpoint: Mutex<Option<(Lsn, Vec<u8>)>>,
    /// Every append is refused while set (`--fault-at logfail`, the simulator's): what a
    /// protocol does with a record its log will not take.
    refusing: std::sync::atomic::AtomicBool,
}

/// A log opened from its lanes: the log, the snapshot of its newest checkpoint (without the
/// lane format's sequence number), and the records recovery replays after it.
pub struct Reopened {
    pub log: Arc<NodeLog>,
    pub checkpoint: Option<Vec<u8>>,
    pub records: Vec<Vec<u8>>,
    /// Records found durable after one another lane lost, voided (never acknowledged).
    pub orphans: u64,
}

impl NodeLog {
    /// A log over a real WAL whose append lanes are its lanes, as it was found at open (its
    /// records in WAL order and its checkpoint, as [`Wal::open`] returned them); durability
    /// advances from the WAL's flusher thread. Recovery merges the lanes' records
    /// ([`lanes::merge`]) and voids the orphans it found.
    pub fn over_wal(wal: Arc<Wal>, records: Vec<Vec<u8>>, checkpoint: Option<Vec<u8>>) -> Result<Reopened, String> {
        let (after, snapshot) = match &checkpoint {
            Some(bytes) => {
                let (seq, snap) = split_checkpoint(bytes)?;
                (seq, Some(snap.to_vec()))
            }
            None => (0, None),
        };
        let merged = lanes::merge(lanes::runs(&records), after)?;
        let lanes = (0..wal.lanes()).map(|_| Lane::new(Device::Wal(wal.clone()))).collect();
        let log = Arc::new(NodeLog::new(lanes, &merged));
        let weak = Arc::downgrade(&log);
        wal.set_on_durable(Box::new(move |wal_lsn, marks| {
            if let Some(log) = weak.upgrade() {
                log.lanes_durable(marks, wal_lsn);
            }
        }));
        log.void_orphans(&merged)?;
        let orphans = merged.orphan_count();
        Ok(Reopened { log, checkpoint: snapshot, records: merged.records, orphans })
    }

    /// A log whose records are durable once a majority of its replicas hold them; the node's
    /// replicator (`replication::service`) takes the appended records and reports progress.
    pub fn replicated() -> Arc<NodeLog> {
        let lane = Lane::new(Device::Replicated(Mutex::new(ReplQueue::default())));
        Arc::new(NodeLog::new(vec![lane], &lanes::Merged::default()))
    }

    /// The replicator takes the records appended since it last looked (oldest first); `waker`
    /// is woken at the next append.
    pub fn take_for_replication(&self, waker: &Waker) -> Vec<Vec<u8>> {
        let Device::Replicated(q) = &self.lanes[0].device else { return Vec::new() };
        let mut q = q.lock();
        q.replicator = Some(waker.clone());
        std::mem::take(&mut q.pending)
    }

    /// A majority of the replicas hold every record up to `lsn`.
    /// Whether a consensus group holds this log (its replicas snapshot and compact it), not a
    /// WAL of this machine.
    pub fn is_replicated(&self) -> bool {
        matches!(self.lanes[0].device, Device::Replicated(_))
    }

    pub fn replicated_upto(&self, lsn: Lsn) {
        self.advance(lsn);
    }

    /// A log over `lanes` simulated disks that already hold `image` (what survived earlier
    /// crashes; an empty image is a fresh log), with the records recovery replays from it.
    pub fn simulated(image: SimImage, lanes: usize) -> Result<Reopened, String> {
        let after = image.checkpoint.as_ref().map_or(0, |c| c.0);
        let merged = lanes::merge(image.lanes.iter().map(|l| l.iter().map(|r| r.as_slice())), after)?;
        let lane_count = lanes.max(image.lanes.len());
        let mut kept = image.lanes.into_iter();
        let lanes = (0..lane_count)
            .map(|_| {
                let durable = kept.next().unwrap_or_default();
                Lane::new(Device::Sim(Mutex::new(SimDisk { durable, ..Default::default() })))
            })
            .collect();
        let log = Arc::new(NodeLog::new(lanes, &merged));
        *log.sim_checkpoint.lock() = image.checkpoint.clone();
        log.void_orphans(&merged)?;
        let orphans = merged.orphan_count();
        let checkpoint = image.checkpoint.map(|c| c.1);
        Ok(Reopened { log, checkpoint, records: merged.records, orphans })
    }

    fn new(lanes: Vec<Lane>, recovered: &lanes::Merged) -> Self {
        // Sequence numbers go on past every one a lane holds, orphans included.
        let last = recovered.max_seq;
        NodeLog {
            lanes,
            next_seq: AtomicU64::new(last + 1),
            checkpointer: std::sync::OnceLock::new(),
            sim_checkpointer: Mutex::new(None),
            sim_checkpoint: Mutex::new(None),
            cuts: std::sync::OnceLock::new(),
            durable: AtomicU64::new(last),
            appended_bytes: AtomicU64::new(0),
            refusing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Refuse every append from now on (`on`), or take them again: a fault the simulator
    /// injects (`--fault-at logfail`).
    pub fn set_refusing(&self, on: bool) {
        self.refusing.store(on, Ordering::Relaxed);
    }

    fn refused(&self) -> Result<(), String> {
        match self.refusing.load(Ordering::Relaxed) {
            true => Err("the log refused the record (an injected failure)".to_string()),
            false => Ok(()),
        }
    }

    /// Append the void record for the orphans recovery found, first of this boot: nothing
    /// after it is durable before it is, so a crash before it leaves the orphans orphans.
    fn void_orphans(&self, merged: &lanes::Merged) -> Result<(), String> {
        if let Some((from, to)) = merged.orphans() {
            self.append_kind(0, KIND_VOID, &lanes::void_body(from, to))?;
        }
        Ok(())
    }

    /// How many lanes the log has (one for a replicated log).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Checkpoint this log every `every` records from now on: a real WAL on the checkpointer's
    /// thread, a simulated disk as its flushes complete ([`SimCheckpointer`]). Replicated logs
    /// are not checkpointed here (their replicas snapshot the applied state).
    pub fn set_checkpointer(&self, machine: Box<dyn LogMachine>, every: u64) {
        if let (Device::Sim(_), true) = (&self.lanes[0].device, every > 0) {
            // Records appended before (a void) are below every number it applies.
            let next_in_lane = (0..self.lanes.len())
                .map(|lane| self.sim_disk(lane).map_or(1, |d| d.lock().durable_lane_lsn() as usize + 1))
                .collect();
            let applied_seq = self.next_seq.load(Ordering::Acquire) - 1;
            *self.sim_checkpointer.lock() =
                Some(SimCheckpointer { machine, every, applied_seq, since: 0, next_in_lane });
            return;
        }
        let Device::Wal(wal) = &self.lanes[0].device else { return };
        if every > 0 {
            // Records appended before are below every sequence number the checkpointer will see,
            // and cut by the time it needs a cut past them.
            let cuts = self.cuts.get_or_init(Default::default).clone();
            let started = Mutex::new(Some(Checkpointer::start(wal.clone(), machine, every, cuts)));
            if self.checkpointer.set(started).is_err() {
                super::log_warn("a node log's checkpointer was set twice; the second is ignored");
            }
        }
    }

    /// Append one record; returns its LSN. Never waits for I/O (with checkpoints on, it waits
    /// when the checkpointer is far behind). Fails for a record over the WAL's size limit, a
    /// WAL that stopped, and while an injected failure lasts.
    pub fn append(&self, rec: &[u8]) -> Result<Lsn, String> {
        self.refused()?;
        match &self.lanes[0].device {
            Device::Replicated(_) => self.append_owned(rec.to_vec()),
            _ => self.append_to_disk(rec),
        }
    }

    /// [`NodeLog::append`] of a record the caller built for it: a replicated log keeps it
    /// without a copy (Rolis's batches are hundreds of KB).
    pub fn append_owned(&self, rec: Vec<u8>) -> Result<Lsn, String> {
        self.refused()?;
        let Device::Replicated(q) = &self.lanes[0].device else { return self.append_to_disk(&rec) };
        debug_assert!(!rec.is_empty(), "an empty record is a read fence, not a record");
        self.count_appended(&rec);
        let mut q = q.lock();
        q.pending.push(rec);
        q.appended += 1;
        let lsn = q.appended;
        let wake = if q.pending.len() == 1 { q.replicator.take() } else { None };
        drop(q);
        if let Some(w) = wake {
            w.wake();
        }
        Ok(lsn)
    }

    fn count_appended(&self, rec: &[u8]) {
        self.appended_bytes.fetch_add(rec.len() as u64, Ordering::Relaxed);
        APPENDED_BYTES.with(|b| b.set(b.get() + rec.len() as u64));
    }

    fn append_to_disk(&self, rec: &[u8]) -> Result<Lsn, String> {
        self.count_appended(rec);
        if rec.len() + LANE_HEADER_BYTES > MAX_RECORD_BYTES {
            return Err(format!(
                "a log record of {} bytes was refused: a record carries at most {} bytes",
                rec.len(),
                MAX_RECORD_BYTES - LANE_HEADER_BYTES
            ));
        }
        let lane = current_lane(self.lanes.len());
        match self.checkpointer.get() {
            None => self.append_kind(lane, KIND_RECORD, rec),
            Some(c) => {
                let ckpt = c.lock();
                let (_, seq) = self.append_to_lane(lane, KIND_RECORD, rec)?;
                if let Some(c) = &*ckpt {
                    // A closed channel means the checkpointer failed; the log goes on uncut.
                    let _ = c.tx.send((seq, rec.to_vec()));
                }
                Ok(seq)
            }
        }
    }

    fn append_kind(&self, lane: usize, kind: u8, body: &[u8]) -> Result<Lsn, String> {
        self.append_to_lane(lane, kind, body).map(|(_, seq)| seq)
    }

    /// Take the next sequence number and queue it under the lane's lock, so that no one sees the
    /// number taken and not yet queued; returns the lane LSN and the number. The lock is taken
    /// in `put`'s `head`, not around the whole append: a WAL's append may first wait for its
    /// memory bound, and the WAL's flusher frees that memory only after it has reported the
    /// group it wrote durable, which takes this lock ([`NodeLog::pop_flushed`]). Held across the
    /// wait, the lock stopped both for good.
    fn append_to_lane(&self, lane: usize, kind: u8, body: &[u8]) -> Result<(Lsn, Lsn), String> {
        let index = lane;
        let lane = &self.lanes[index];
        lane.put(index, body, |lane_lsn| {
            let mut unflushed = lane.unflushed.lock();
            let seq = self.next_seq.fetch_add(1, Ordering::AcqRel);
            unflushed.push_back((lane_lsn, seq));
            (seq, lanes::header(kind, seq))
        })
    }

    /// What an answer that rests on reads alone (a read-only vote or commit, a coordinator's
    /// "never heard of it") waits for before it goes out, so that it cannot come from a stale
    /// incarnation of the node.
    ///
    /// A replicated log: a record proposed after now. Once a majority of the log's replicas
    /// commit it in this incarnation's term, no other replica led the log with a later term
    /// before the reads: such a leader's majority would share a replica with ours, which would
    /// have refused our term's record (terms only grow, and they are on disk). A deposed
    /// incarnation (cut off, paused, or still running after a takeover) never gets its record
    /// committed, so it never answers from what it holds. A record appended and not yet taken by
    /// the replicator serves (it is proposed after now); otherwise an empty record, the fence,
    /// is appended: at most one per batch the replicator takes.
    ///
    /// A log of the node's own (a WAL, a simulated disk): nothing else can serve the node while
    /// this incarnation runs, so only the undurable tail (a read may have seen a commit whose
    /// record is not durable yet, early lock release). `None`: nothing to wait for.
    pub fn read_fence(&self) -> Option<Lsn> {
        match &self.lanes[0].device {
            Device::Replicated(q) => {
                let mut q = q.lock();
                if q.pending.is_empty() {
                    q.pending.push(Vec::new());
                    q.appended += 1;
                    if let Some(w) = q.replicator.take() {
                        w.wake();
                    }
                }
                Some(q.appended)
            }
            Device::Wal(_) | Device::Sim(_) => {
                let tail = self.appended_lsn();
                (tail > self.durable_lsn()).then_some(tail)
            }
        }
    }

    /// Bytes of records appended since the log opened (refused ones included: a count for
    /// pacing, not an account of the log).
    pub fn appended_bytes(&self) -> u64 {
        self.appended_bytes.load(Ordering::Relaxed)
    }

    /// The LSN of the last record appended.
    pub fn appended_lsn(&self) -> Lsn {
        match &self.lanes[0].device {
            Device::Replicated(q) => q.lock().appended,
            Device::Wal(_) | Device::Sim(_) => self.next_seq.load(Ordering::Acquire) - 1,
        }
    }

    /// Every record up to this LSN is durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.durable.load(Ordering::Acquire)
    }

    /// A future that completes once `lsn` is durable.
    pub fn wait(self: &Arc<Self>, lsn: Lsn) -> DurableWait {
        DurableWait { log: self.clone(), lsn }
    }

    /// [`NodeLog::wait`], borrowing the log.
    pub fn wait_ref(&self, lsn: Lsn) -> DurableWait<&NodeLog> {
        DurableWait { log: self, lsn }
    }

    /// Lane `lane` is durable up to its LSN `lane_lsn`: the log is durable up to the sequence
    /// number before the oldest one that some lane has not made durable yet. The next number
    /// is read first: a number taken before that read is queued in its lane before the lane's
    /// lock is released, so the scan below sees it unless it is durable already.
    fn lane_durable(&self, lane: usize, lane_lsn: Lsn) {
        self.pop_flushed(lane, lane_lsn);
        self.advance_to_oldest_unflushed();
    }

    /// The WAL made every lane `k` durable up to its record number `marks[k]`, with everything
    /// up to its LSN `wal_lsn`: the cut that ends there holds every sequence number up to the
    /// largest it made durable, which the checkpointer (if one runs) is told.
    fn lanes_durable(&self, marks: &[u64], wal_lsn: Lsn) {
        let largest = marks.iter().enumerate().map(|(lane, &mark)| self.pop_flushed(lane, mark)).max().flatten();
        if let (Some(cuts), Some(seq_end)) = (self.cuts.get(), largest) {
            cuts.push(seq_end, wal_lsn);
        }
        self.advance_to_oldest_unflushed();
    }

    /// Lane `lane` is durable up to its record `lane_lsn`: drop what it flushed from its queue;
    /// returns the largest sequence number dropped.
    fn pop_flushed(&self, lane: usize, lane_lsn: Lsn) -> Option<Lsn> {
        let mut unflushed = self.lanes[lane].unflushed.lock();
        let mut largest = None;
        while let Some(&(_, seq)) = unflushed.front().filter(|&&(l, _)| l <= lane_lsn) {
            largest = Some(seq);
            unflushed.pop_front();
        }
        largest
    }

    /// The log is durable up to the sequence number before the oldest one some lane has not
    /// made durable yet (see [`NodeLog::lane_durable`] for why the next number is read first).
    fn advance_to_oldest_unflushed(&self) {
        let mut durable = self.next_seq.load(Ordering::Acquire) - 1;
        for l in &self.lanes {
            if let Some(&(_, seq)) = l.unflushed.lock().front() {
                durable = durable.min(seq - 1);
            }
        }
        self.advance(durable);
    }

    /// Durability reached `lsn`: wake every task waiting for it or less.
    fn advance(&self, lsn: Lsn) {
        self.durable.fetch_max(lsn, Ordering::AcqRel);
        let mut ready = Vec::new();
        for lane in &self.lanes {
            let mut waiters = lane.waiters.lock();
            while waiters.peek().is_some_and(|w| w.lsn <= lsn) {
                ready.extend(waiters.pop().map(|w| w.waker));
            }
        }
        for w in ready {
            w.wake();
        }
    }

    // ---- the simulator's side ----

    fn sim_disk(&self, lane: usize) -> Option<&Mutex<SimDisk>> {
        match &self.lanes.get(lane)?.device {
            Device::Sim(disk) => Some(disk),
            Device::Wal(_) | Device::Replicated(_) => None,
        }
    }

    /// Start a flush of everything appended to `lane` so far; returns the lane LSN it will make
    /// durable, or `None` if nothing is pending or a flush is already in progress.
    pub fn sim_begin_flush(&self, lane: usize) -> Option<Lsn> {
        let mut d = self.sim_disk(lane)?.lock();
        if d.flushing > 0 || d.pending.is_empty() {
            return None;
        }
        d.flushing = d.pending.len();
        Some(d.durable_lane_lsn() + d.flushing as Lsn)
    }

    /// The flush of `lane` in progress reached the disk.
    pub fn sim_finish_flush(&self, lane: usize) {
        let Some(disk) = self.sim_disk(lane) else { return };
        let lane_lsn = disk.lock().finish_flush();
        self.lane_durable(lane, lane_lsn);
        self.sim_checkpoint_step();
    }

    /// Whether records of `lane` wait for a flush that has not started.
    pub fn sim_has_unflushed(&self, lane: usize) -> bool {
        self.sim_disk(lane).is_some_and(|disk| {
            let d = disk.lock();
            d.pending.len() > d.flushing
        })
    }

    /// Start one flush of every lane at once, as the real WAL's flusher cuts its lanes into one
    /// write of one file: the cut holds every record appended so far (the simulator appends on
    /// one thread, so every sequence number up to the largest is in it). False if nothing is
    /// pending or a flush is under way.
    pub fn sim_begin_cut(&self) -> bool {
        let disks: Vec<_> = (0..self.lanes.len()).filter_map(|lane| self.sim_disk(lane)).collect();
        if disks.iter().any(|d| d.lock().flushing > 0) {
            return false;
        }
        let mut any = false;
        for disk in disks {
            let mut d = disk.lock();
            d.flushing = d.pending.len();
            any |= d.flushing > 0;
        }
        any
    }

    /// The cut in progress reached the disk: every lane is durable up to where it was cut.
    pub fn sim_finish_cut(&self) {
        let marks: Vec<Lsn> = (0..self.lanes.len())
            .map(|lane| self.sim_disk(lane).map_or(0, |disk| disk.lock().finish_flush()))
            .collect();
        for (lane, mark) in marks.into_iter().enumerate() {
            self.pop_flushed(lane, mark);
        }
        self.advance_to_oldest_unflushed();
        self.sim_checkpoint_step();
    }

    /// Feed the simulator's checkpointer what became durable, in sequence order, and checkpoint
    /// every `every` records: the snapshot becomes the disk's checkpoint, and the records it
    /// covers leave the lanes.
    fn sim_checkpoint_step(&self) {
        let mut guard = self.sim_checkpointer.lock();
        let Some(c) = guard.as_mut() else { return };
        let durable = self.durable_lsn();
        if durable <= c.applied_seq {
            return;
        }
        // Each lane holds its records in sequence order: take what is durable from each.
        let mut newly: std::collections::BTreeMap<Lsn, Vec<u8>> = Default::default();
        for (lane, next) in c.next_in_lane.iter_mut().enumerate() {
            let Some(disk) = self.sim_disk(lane) else { continue };
            let d = disk.lock();
            while let Some(bytes) = d.durable_at(*next) {
                let Ok(r) = lanes::decode(bytes) else { break };
                if r.seq() > durable {
                    break;
                }
                if let (lanes::LaneRecord::Record { seq, body }, true) = (&r, r.seq() > c.applied_seq) {
                    newly.insert(*seq, body.to_vec());
                }
                *next += 1;
            }
        }
        c.since += newly.len() as u64;
        for body in newly.into_values() {
            c.machine.apply(&body);
        }
        // The machine holds every record up to `durable` now (what lies between its last record
        // and `durable` are voids): the checkpoint covers `durable`.
        c.applied_seq = durable;
        if c.since >= c.every {
            c.since = 0;
            let seq = durable;
            *self.sim_checkpoint.lock() = Some((seq, c.machine.snapshot()));
            for lane in 0..self.lanes.len() {
                if let Some(disk) = self.sim_disk(lane) {
                    disk.lock().compact_through(seq);
                }
            }
        }
    }

    /// Whether any lane holds records no flush has started on.
    pub fn sim_has_unflushed_any(&self) -> bool {
        (0..self.lanes.len()).any(|lane| self.sim_has_unflushed(lane))
    }

    /// A crash: what was not durable is gone, except that a write under way reached the disk
    /// up to `torn_records` of the records it carried, taken lane after lane (the order a cut
    /// writes them in; a lane flushed on its own writes only its own). Such records were never
    /// acknowledged; recovery keeps those in its unbroken run and voids the rest. Returns what
    /// survived in each lane, for the restarted node.
    pub fn sim_crash(&self, mut torn_records: usize) -> SimImage {
        let lanes = (0..self.lanes.len())
            .filter_map(|lane| {
                let mut d = self.sim_disk(lane)?.lock();
                let reached = d.flushing.min(torn_records);
                torn_records -= reached;
                let kept: Vec<Vec<u8>> = d.pending.drain(..reached).collect();
                d.durable.extend(kept);
                d.pending.clear();
                d.flushing = 0;
                Some(d.durable.clone())
            })
            .collect();
        SimImage { lanes, checkpoint: self.sim_checkpoint.lock().clone() }
    }

    /// How many records the flushes under way carry (what a crash may tear).
    pub fn sim_flushing(&self) -> usize {
        (0..self.lanes.len()).filter_map(|lane| self.sim_disk(lane)).map(|d| d.lock().flushing).sum()
    }
}

/// Future returned by [`NodeLog::wait`].
pub struct DurableWait<L: std::ops::Deref<Target = NodeLog> = Arc<NodeLog>> {
    log: L,
    lsn: Lsn,
}

impl<L: std::ops::Deref<Target = NodeLog>> Future for DurableWait<L> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let log: &NodeLog = &self.log;
        if log.durable_lsn() >= self.lsn {
            return Poll::Ready(());
        }
        let lane = &log.lanes[current_lane(log.lanes.len())];
        let mut waiters = lane.waiters.lock();
        // Check again under the lock: `advance` may have run between the check and the lock.
        if log.durable_lsn() >= self.lsn {
            return Poll::Ready(());
        }
        waiters.push(Waiter { lsn: self.lsn, waker: cx.waker().clone() });
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(lanes: usize) -> Arc<NodeLog> {
        NodeLog::simulated(SimImage::default(), lanes).expect("an empty image").log
    }

    /// A replicated log fences reads with a record proposed after them: one not yet taken by
    /// the replicator, or an empty record appended for the purpose (one per batch taken). A
    /// log of the node's own fences only with its undurable tail.
    #[test]
    fn a_read_fence_is_a_record_proposed_after_the_reads() {
        let waker = std::task::Waker::noop();
        let log = NodeLog::replicated();
        assert_eq!(log.read_fence(), Some(1), "nothing pending: a fence is appended");
        assert_eq!(log.read_fence(), Some(1), "the fence not yet taken serves the next read too");
        assert_eq!(log.take_for_replication(waker), vec![Vec::<u8>::new()]);
        assert_eq!(log.append(b"rec"), Ok(2));
        assert_eq!(log.read_fence(), Some(2), "a record not yet taken is proposed after the reads");
        assert_eq!(log.take_for_replication(waker), vec![b"rec".to_vec()]);
        log.replicated_upto(2);
        assert_eq!(log.read_fence(), Some(3), "durable already, so proposed before: a new fence");

        let own = fresh(1);
        assert_eq!(own.read_fence(), None, "nothing undurable to wait for");
        assert_eq!(own.append(b"a"), Ok(1));
        assert_eq!(own.read_fence(), Some(1), "the undurable tail");
        own.sim_begin_flush(0);
        own.sim_finish_flush(0);
        assert_eq!(own.read_fence(), None);
    }

    /// A machine whose state is every record it applied, in order.
    struct Concat(Vec<u8>);

    impl LogMachine for Concat {
        fn apply(&mut self, record: &[u8]) {
            self.0.extend_from_slice(record);
        }
        fn snapshot(&self) -> Vec<u8> {
            self.0.clone()
        }
    }

    /// What a thread appended is counted for the simulator's charge (`CpuCost::log_ns`) and
    /// taken once: the records' own bytes, whichever way they were appended.
    #[test]
    fn a_thread_s_appended_bytes_are_counted_once_for_the_simulators_charge() {
        let log = fresh(2);
        take_appended_bytes();
        log.append(b"abc").unwrap();
        log.append_owned(b"defgh".to_vec()).unwrap();
        assert_eq!(take_appended_bytes(), 8);
        assert_eq!(take_appended_bytes(), 0, "taken once");
        let cost = super::super::CpuCost { log_ns_per_kib: 2048, ..Default::default() };
        assert_eq!(cost.log_ns(3 * 1024), 6_144);
    }

    /// The simulator's checkpointer snapshots what is durable every `every` records and drops
    /// what the snapshot covers; new records still get lane LSNs past the dropped ones (so they
    /// are durable only once flushed); a crash recovers from the checkpoint and the records after.
    #[test]
    fn a_simulated_checkpoint_covers_what_is_durable_and_compacts_it() {
        let log = fresh(1);
        log.set_checkpointer(Box::new(Concat(Vec::new())), 2);
        for r in [b"a", b"b", b"c"] {
            log.append(r).unwrap();
        }
        assert!(log.sim_begin_cut());
        log.sim_finish_cut();
        assert_eq!(log.durable_lsn(), 3);
        log.append(b"d").unwrap();
        assert_eq!(log.durable_lsn(), 3, "an append after compaction is not durable before its flush");
        let image = log.sim_crash(0);
        assert_eq!(image.checkpoint, Some((3, b"abc".to_vec())));
        assert!(image.lanes[0].is_empty(), "the checkpoint's records left the disk");
        let Reopened { log, checkpoint, records, .. } = NodeLog::simulated(image, 1).expect("reopens");
        assert_eq!((checkpoint, records), (Some(b"abc".to_vec()), Vec::<Vec<u8>>::new()));
        assert_eq!(log.append(b"e"), Ok(4), "numbers go on after the checkpoint");
        log.sim_begin_cut();
        log.sim_finish_cut();
        let Reopened { records, checkpoint, .. } = NodeLog::simulated(log.sim_crash(0), 1).expect("reopens");
        assert_eq!((checkpoint, records), (Some(b"abc".to_vec()), vec![b"e".to_vec()]));
    }

    #[test]
    fn simulated_disk_loses_only_the_unflushed_tail() {
        let log = fresh(1);
        assert_eq!(log.append(b"a"), Ok(1));
        assert_eq!(log.append(b"b"), Ok(2));
        assert_eq!(log.sim_begin_flush(0), Some(2));
        assert_eq!(log.append(b"c"), Ok(3), "appends go on during a flush");
        assert_eq!(log.sim_begin_flush(0), None, "one flush at a time");
        log.sim_finish_flush(0);
        assert_eq!(log.durable_lsn(), 2);
        assert!(log.sim_has_unflushed(0));
        let survived = log.sim_crash(0);
        let Reopened { log, records, .. } = NodeLog::simulated(survived, 1).expect("reopens");
        assert_eq!(records, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(log.durable_lsn(), 2);
        assert_eq!(log.append(b"d"), Ok(3), "LSNs continue after what survived");
    }

    #[test]
    fn a_record_is_durable_only_once_every_lane_is_durable_up_to_it() {
        let log = fresh(2);
        enter_lane(0);
        assert_eq!(log.append(b"a"), Ok(1));
        enter_lane(1);
        assert_eq!(log.append(b"b"), Ok(2));
        enter_lane(0);
        assert_eq!(log.append(b"c"), Ok(3));
        log.sim_begin_flush(0);
        log.sim_finish_flush(0);
        assert_eq!(log.durable_lsn(), 1, "lane 0 holds 1 and 3, but 2 is still only in lane 1's buffer");
        log.sim_begin_flush(1);
        log.sim_finish_flush(1);
        assert_eq!(log.durable_lsn(), 3);
        enter_lane(1);
        assert_eq!(log.append(b"d"), Ok(4));
        log.sim_begin_flush(1);
        log.sim_finish_flush(1);
        assert_eq!(log.durable_lsn(), 4, "an idle lane holds nothing back");
        enter_lane(0);
    }

    /// A real WAL whose append lanes are the log's lanes: records of both lanes are durable by
    /// sequence number, and a reopened log (with another number of lanes) replays them all in
    /// sequence order and numbers on after them.
    #[test]
    fn a_wal_with_two_lanes_reopens_with_every_record_in_sequence_order() {
        let dir = tempfile::tempdir().unwrap();
        let open = |lanes: usize| {
            let cfg = crate::wal::WalConfig { fsync: false, lanes, ..crate::wal::WalConfig::new(dir.path(), 9, 0) };
            let (wal, recovered) = Wal::open(cfg).expect("opens");
            let records = recovered.records.into_iter().map(|(_, r)| r).collect();
            NodeLog::over_wal(wal, records, recovered.checkpoint.map(|c| c.1)).expect("recovers")
        };
        let Reopened { log, .. } = open(2);
        let mut last = 0;
        for i in 0..200u32 {
            enter_lane((i % 3 % 2) as u16);
            last = log.append(&i.to_le_bytes()).unwrap();
        }
        enter_lane(0);
        let started = std::time::Instant::now();
        while log.durable_lsn() < last {
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "the lanes never became durable");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        log.shutdown();
        drop(log);
        let Reopened { log, records, orphans, .. } = open(3);
        let expected: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_le_bytes().to_vec()).collect();
        assert_eq!(records, expected, "every record, in sequence order");
        assert_eq!(orphans, 0);
        assert_eq!(log.append(b"next"), Ok(201));
        log.shutdown();
    }

    /// An append the WAL holds at its memory bound ([`crate::wal::MAX_UNWRITTEN_BYTES`]) while a
    /// group is written and synced: the flusher reports that group durable through the lanes'
    /// queues before it frees the group's memory, so an appender that waited there with its
    /// lane's queue locked stopped the flusher, and the flusher the appender, for good (a silo
    /// node under the tcp nemesis: its worker thread never ended, and its server's `stop`
    /// never answered).
    #[test]
    fn an_append_held_at_the_wal_memory_bound_lets_the_flusher_report_durability() {
        let dir = tempfile::tempdir().unwrap();
        // fsync on: each group takes long enough for the appender to reach the bound meanwhile.
        let (wal, _) = Wal::open(crate::wal::WalConfig::new(dir.path(), 9, 0)).expect("opens");
        let Reopened { log, .. } = NodeLog::over_wal(wal, Vec::new(), None).expect("recovers");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let appender = log.clone();
        std::thread::spawn(move || {
            enter_lane(0);
            // 4 MiB records, 256 MiB in all: the 64 MiB bound many times over.
            let record = vec![7u8; 4 << 20];
            let mut last = 0;
            for _ in 0..64 {
                last = appender.append(&record).expect("appends");
            }
            let _ = done_tx.send(last);
        });
        let limit = std::time::Duration::from_secs(60);
        let last = done_rx.recv_timeout(limit).expect("the appender and the flusher waited for each other");
        let started = std::time::Instant::now();
        while log.durable_lsn() < last {
            assert!(started.elapsed() < limit, "the records never became durable");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        log.shutdown();
    }

    #[test]
    fn orphans_are_voided_once_and_never_replayed() {
        let log = fresh(2);
        enter_lane(1);
        log.append(b"a").unwrap(); // 1, lane 1, never flushed
        enter_lane(0);
        log.append(b"b").unwrap(); // 2, lane 0, flushed: an orphan
        log.sim_begin_flush(0);
        log.sim_finish_flush(0);
        assert_eq!(log.durable_lsn(), 0);
        let Reopened { log, records, orphans, .. } = NodeLog::simulated(log.sim_crash(0), 2).expect("reopens");
        assert!(records.is_empty(), "2 may depend on the lost 1");
        assert_eq!(orphans, 2, "1 and 2 are voided");
        // The void (seq 3) is this boot's first record; then a new record (4) in lane 1.
        enter_lane(1);
        assert_eq!(log.append(b"c"), Ok(4));
        for lane in 0..2 {
            log.sim_begin_flush(lane);
            log.sim_finish_flush(lane);
        }
        assert_eq!(log.durable_lsn(), 4);
        let Reopened { records, orphans, .. } = NodeLog::simulated(log.sim_crash(0), 2).expect("reopens");
        assert_eq!(records, vec![b"c".to_vec()], "the void steps over the orphan");
        assert_eq!(orphans, 0);
        enter_lane(0);
    }
}
