//! A node's log as protocol code sees it: append a record (its LSN comes back at once), then
//! await its durability. Which device is underneath is the runtime's choice:
//! - `local` and `tcp`: a real write-ahead log on disk ([`crate::wal::Wal`]), whose
//!   flusher thread group-commits with fsync and wakes the waiters;
//! - `sim`: a simulated disk whose flushes the simulator schedules in virtual time (group-commit
//!   delay plus an fsync cost), and whose unflushed tail a crash loses.
//!
//! The log is shared by the workers of a node (one log per node, as the papers' 2PC baselines
//! keep), so it is `Send + Sync`; waiting is a future woken through the task's waker, which
//! works across threads, so protocol code never blocks a worker on I/O.

use crate::wal::{Lsn, Wal};
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// How the simulator models a disk: records buffered in memory, made durable by flushes.
#[derive(Default)]
pub struct SimDisk {
    /// Records that survived every crash so far (LSN i+1 at index i).
    durable: Vec<Vec<u8>>,
    /// Appended, not yet durable.
    pending: Vec<Vec<u8>>,
    /// How many of `pending` the flush in progress covers (0 = no flush in progress).
    flushing: usize,
}

/// Records waiting to be proposed to the node's replicated log, and the task that proposes them.
#[derive(Default)]
pub struct ReplQueue {
    pending: Vec<Vec<u8>>,
    appended: Lsn,
    replicator: Option<Waker>,
}

enum Device {
    Wal(Arc<Wal>),
    Sim(Mutex<SimDisk>),
    /// Durable once a majority of the node's log replicas hold it (`replication::service`).
    Replicated(Mutex<ReplQueue>),
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
    fn snapshot(&self) -> Vec<u8>;
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

/// Feeds a [`LogMachine`] on its own thread and checkpoints the WAL every `every` records.
struct Checkpointer {
    tx: std::sync::mpsc::SyncSender<(Lsn, Vec<u8>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(wal: Arc<Wal>, mut machine: Box<dyn LogMachine>, every: u64) -> Checkpointer {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(Lsn, Vec<u8>)>(CHECKPOINT_QUEUE);
        let spawned = std::thread::Builder::new().name("dtx-checkpointer".into()).spawn(move || {
            let mut since = 0;
            for (lsn, rec) in rx {
                machine.apply(&rec);
                since += 1;
                if since < every {
                    continue;
                }
                since = 0;
                // The checkpoint may only cover durable records; the WAL waits for that.
                if let Err(e) = wal.checkpoint(lsn, &machine.snapshot()) {
                    super::log_warn(&format!("checkpoint at LSN {lsn} failed: {e}"));
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
        Checkpointer { tx, thread }
    }

    /// Stop taking records and wait for the thread (and its hold on the WAL) to end.
    fn stop(self) {
        let Checkpointer { tx, thread } = self;
        drop(tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl NodeLog {
    fn stop_checkpointer(&self) {
        if let Some(c) = self.checkpointer.get().and_then(|c| c.lock().take()) {
            c.stop();
        }
    }

    /// The run is over: stop the checkpointer and close the WAL (flushing what it buffered and
    /// releasing its directory lock), even if tasks that never finished still hold this log.
    pub fn shutdown(&self) {
        self.stop_checkpointer();
        if let Device::Wal(wal) = &self.device {
            wal.close();
        }
    }
}

impl Drop for NodeLog {
    /// The checkpointer holds the WAL open: end it first, so that the WAL closes (and releases
    /// its directory lock) when the log goes.
    fn drop(&mut self) {
        self.stop_checkpointer();
    }
}

pub struct NodeLog {
    device: Device,
    /// Set once, when checkpoints are on: appends then go through its lock, so that records
    /// reach the checkpointer in LSN order. Without checkpoints an append takes no lock here.
    checkpointer: std::sync::OnceLock<Mutex<Option<Checkpointer>>>,
    durable: AtomicU64,
    /// Tasks waiting for an LSN to become durable.
    waiters: Mutex<Vec<(Lsn, Waker)>>,
}

impl NodeLog {
    /// A log over a real WAL; durability advances from the WAL's flusher thread.
    pub fn over_wal(wal: Arc<Wal>) -> Arc<NodeLog> {
        let log = Arc::new(NodeLog::new(Device::Wal(wal.clone())));
        log.durable.store(wal.durable_lsn(), Ordering::Release);
        let weak = Arc::downgrade(&log);
        wal.set_on_durable(Box::new(move |lsn| {
            if let Some(log) = weak.upgrade() {
                log.advance(lsn);
            }
        }));
        log
    }

    /// A log whose records are durable once a majority of its replicas hold them; the node's
    /// replicator (`replication::service`) takes the appended records and reports progress.
    pub fn replicated() -> Arc<NodeLog> {
        Arc::new(NodeLog::new(Device::Replicated(Mutex::new(ReplQueue::default()))))
    }

    /// The replicator takes the records appended since it last looked (oldest first); `waker`
    /// is woken at the next append.
    pub fn take_for_replication(&self, waker: &Waker) -> Vec<Vec<u8>> {
        let Device::Replicated(q) = &self.device else { return Vec::new() };
        let mut q = q.lock();
        q.replicator = Some(waker.clone());
        std::mem::take(&mut q.pending)
    }

    /// A majority of the replicas hold every record up to `lsn`.
    pub fn replicated_upto(&self, lsn: Lsn) {
        self.advance(lsn);
    }

    /// A log over a simulated disk that already holds `durable` (what survived earlier crashes).
    pub fn simulated(durable: Vec<Vec<u8>>) -> Arc<NodeLog> {
        let n = durable.len() as Lsn;
        let log = NodeLog::new(Device::Sim(Mutex::new(SimDisk { durable, ..Default::default() })));
        log.durable.store(n, Ordering::Release);
        Arc::new(log)
    }

    fn new(device: Device) -> Self {
        NodeLog {
            device,
            checkpointer: std::sync::OnceLock::new(),
            durable: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
        }
    }

    /// Checkpoint this log every `every` records from now on (a real WAL only; the simulator's
    /// disk and replicated logs are not checkpointed).
    pub fn set_checkpointer(&self, machine: Box<dyn LogMachine>, every: u64) {
        if let (Device::Wal(wal), true) = (&self.device, every > 0) {
            let started = Mutex::new(Some(Checkpointer::start(wal.clone(), machine, every)));
            if self.checkpointer.set(started).is_err() {
                super::log_warn("a node log's checkpointer was set twice; the second is ignored");
            }
        }
    }

    /// Append one record; returns its LSN. Never waits for I/O (with checkpoints on, it waits
    /// when the checkpointer is far behind). Fails only for a record over the WAL's size limit.
    pub fn append(&self, rec: &[u8]) -> Result<Lsn, String> {
        match &self.device {
            Device::Wal(wal) => match self.checkpointer.get() {
                None => wal.append(rec).map_err(|e| e.to_string()),
                Some(c) => {
                    let ckpt = c.lock();
                    let lsn = wal.append(rec).map_err(|e| e.to_string())?;
                    if let Some(c) = &*ckpt {
                        // A closed channel means the checkpointer failed; the log goes on uncut.
                        let _ = c.tx.send((lsn, rec.to_vec()));
                    }
                    Ok(lsn)
                }
            },
            Device::Sim(disk) => {
                let mut d = disk.lock();
                d.pending.push(rec.to_vec());
                Ok((d.durable.len() + d.pending.len()) as Lsn)
            }
            Device::Replicated(q) => {
                let mut q = q.lock();
                q.pending.push(rec.to_vec());
                q.appended += 1;
                let lsn = q.appended;
                let wake = if q.pending.len() == 1 { q.replicator.take() } else { None };
                drop(q);
                if let Some(w) = wake {
                    w.wake();
                }
                Ok(lsn)
            }
        }
    }

    /// The LSN of the last record appended.
    pub fn appended_lsn(&self) -> Lsn {
        match &self.device {
            Device::Wal(wal) => wal.last_lsn(),
            Device::Sim(disk) => {
                let d = disk.lock();
                (d.durable.len() + d.pending.len()) as Lsn
            }
            Device::Replicated(q) => q.lock().appended,
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

    /// Durability reached `lsn`: wake every task waiting for it or less.
    fn advance(&self, lsn: Lsn) {
        self.durable.fetch_max(lsn, Ordering::AcqRel);
        let ready: Vec<Waker> = {
            let mut ws = self.waiters.lock();
            let mut ready = Vec::new();
            ws.retain(|(l, w)| {
                if *l <= lsn {
                    ready.push(w.clone());
                    false
                } else {
                    true
                }
            });
            ready
        };
        for w in ready {
            w.wake();
        }
    }

    // ---- the simulator's side ----

    /// Start a flush of everything appended so far; returns the LSN it will make durable, or
    /// `None` if nothing is pending or a flush is already in progress.
    pub fn sim_begin_flush(&self) -> Option<Lsn> {
        let Device::Sim(disk) = &self.device else { return None };
        let mut d = disk.lock();
        if d.flushing > 0 || d.pending.is_empty() {
            return None;
        }
        d.flushing = d.pending.len();
        Some((d.durable.len() + d.flushing) as Lsn)
    }

    /// The flush in progress reached the disk.
    pub fn sim_finish_flush(&self) {
        let Device::Sim(disk) = &self.device else { return };
        let lsn = {
            let mut d = disk.lock();
            let n = d.flushing;
            let done: Vec<Vec<u8>> = d.pending.drain(..n).collect();
            d.durable.extend(done);
            d.flushing = 0;
            d.durable.len() as Lsn
        };
        self.advance(lsn);
    }

    /// Whether records wait for a flush that has not started.
    pub fn sim_has_unflushed(&self) -> bool {
        match &self.device {
            Device::Sim(disk) => {
                let d = disk.lock();
                d.pending.len() > d.flushing
            }
            Device::Wal(_) | Device::Replicated(_) => false,
        }
    }

    /// A crash: what was not durable is gone; returns what survived, for the restarted node.
    pub fn sim_crash(&self) -> Vec<Vec<u8>> {
        let Device::Sim(disk) = &self.device else { return Vec::new() };
        let mut d = disk.lock();
        d.pending.clear();
        d.flushing = 0;
        d.durable.clone()
    }
}

/// Future returned by [`NodeLog::wait`].
pub struct DurableWait {
    log: Arc<NodeLog>,
    lsn: Lsn,
}

impl Future for DurableWait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.log.durable_lsn() >= self.lsn {
            return Poll::Ready(());
        }
        let mut ws = self.log.waiters.lock();
        // Check again under the lock: `advance` may have run between the check and the lock.
        if self.log.durable_lsn() >= self.lsn {
            return Poll::Ready(());
        }
        ws.push((self.lsn, cx.waker().clone()));
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_disk_loses_only_the_unflushed_tail() {
        let log = NodeLog::simulated(Vec::new());
        assert_eq!(log.append(b"a"), Ok(1));
        assert_eq!(log.append(b"b"), Ok(2));
        assert_eq!(log.sim_begin_flush(), Some(2));
        assert_eq!(log.append(b"c"), Ok(3), "appends go on during a flush");
        assert_eq!(log.sim_begin_flush(), None, "one flush at a time");
        log.sim_finish_flush();
        assert_eq!(log.durable_lsn(), 2);
        assert!(log.sim_has_unflushed());
        let survived = log.sim_crash();
        assert_eq!(survived, vec![b"a".to_vec(), b"b".to_vec()]);
        let log = NodeLog::simulated(survived);
        assert_eq!(log.durable_lsn(), 2);
        assert_eq!(log.append(b"d"), Ok(3), "LSNs continue after what survived");
    }
}
