//! One flusher for a group of logs: the lanes of a node's log ([`Wal::open_group`]).
//!
//! Each log of a group keeps its own files, buffer, LSNs and appenders, as one opened alone does;
//! what they share is the thread that writes them. When any log's flush is due (its group
//! delay since its first unflushed record, its group size, or a close), the thread cuts every
//! log's buffer at once, writes each, then fdatasyncs each, and only then marks them durable.
//!
//! Why one thread and one cut (as Silo's loggers take every worker's buffer at an epoch
//! boundary): a node's record is durable only once every lane is durable up to it
//! (`rt::log::NodeLog`). Lanes flushed on their own each cut at their own moment, so a record
//! waited for its own lane's flush and then for the other lanes' next ones, up to two cycles;
//! one cut makes everything appended before it durable together, and one thread per node
//! instead of one per worker leaves the cores to the workers.
//!
//! What it does not remove: each lane is a file, and each file's fdatasync costs its own fixed
//! time (measured on ext4 here: two files of 64 KiB synced one after the other take twice one
//! file's time, not the time of one file of 128 KiB). Silo writes every worker's buffer into
//! one file per disk; doing that here means assigning WAL LSNs at the cut rather than at the
//! append (docs/performance-history.md, "Session 13").

use super::writer::{ActiveSegment, Batch, Shared, Trigger};
use super::*;
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How appenders of a group's logs wake its flusher: a count of kicks, so that a kick that lands
/// between the flusher's look at the logs and its wait is not lost.
#[derive(Default)]
pub(super) struct FlushSignal {
    kicks: Mutex<u64>,
    cv: Condvar,
    flusher: OnceLock<std::thread::ThreadId>,
}

impl FlushSignal {
    pub(super) fn kick(&self) {
        *self.kicks.lock() += 1;
        self.cv.notify_one();
    }

    /// Whether the calling thread is this group's flusher.
    pub(super) fn is_flusher_thread(&self) -> bool {
        self.flusher.get() == Some(&std::thread::current().id())
    }
}

/// One log of the group, as its flusher holds it.
struct Member {
    shared: Arc<Shared>,
    segment: ActiveSegment,
    /// An emptied earlier buffer, handed back to the appenders at the next cut.
    spare: Vec<u8>,
}

impl Wal {
    /// Opens the logs of `cfgs` (each recovered as [`Wal::open`] recovers one) with one flusher
    /// thread for all of them; each log is closed on its own, and the thread ends after the last.
    pub fn open_group(cfgs: Vec<WalConfig>) -> Result<Vec<(Arc<Wal>, Recovered)>, WalError> {
        let signal = Arc::new(FlushSignal::default());
        let mut opened: Vec<(Arc<Wal>, ActiveSegment, Recovered)> = Vec::new();
        for cfg in cfgs {
            match Wal::recover_unstarted(cfg, signal.clone()) {
                Ok(log) => opened.push(log),
                Err(e) => {
                    abandon(&opened);
                    return Err(e);
                }
            }
        }
        let mut logs = Vec::with_capacity(opened.len());
        let mut members = Vec::with_capacity(opened.len());
        for (wal, segment, recovered) in opened {
            members.push(Member { shared: wal.shared.clone(), segment, spare: Vec::new() });
            logs.push((wal, recovered));
        }
        let dir = members.first().map(|m| m.shared.cfg.dir.clone()).unwrap_or_default();
        let flusher_signal = signal.clone();
        let spawned = std::thread::Builder::new()
            .name("dtx-wal-flusher".into())
            .spawn(move || run_group(&flusher_signal, members))
            .map_err(io_error("start the flusher thread for", &dir));
        if let Err(e) = spawned {
            let unstarted: Vec<_> = logs.iter().map(|(w, _)| w.shared.clone()).collect();
            unstarted.iter().for_each(|s| s.state.lock().flusher_done = true);
            return Err(e);
        }
        Ok(logs)
    }
}

/// Logs opened for a group that will not start: nothing will flush them, so closing them must
/// not wait for a flusher.
fn abandon(opened: &[(Arc<Wal>, ActiveSegment, Recovered)]) {
    for (wal, _, _) in opened {
        wal.shared.state.lock().flusher_done = true;
    }
}

/// The group's flusher: wait until some log's flush is due, then flush them all; return once
/// every log is closed and written (or failed).
fn run_group(signal: &FlushSignal, mut members: Vec<Member>) {
    let _ = signal.flusher.set(std::thread::current().id());
    loop {
        let seen = *signal.kicks.lock();
        let look = look(&members);
        if look.open == 0 {
            return;
        }
        if look.due {
            flush_all(&mut members);
            continue;
        }
        let mut kicks = signal.kicks.lock();
        if *kicks == seen {
            match look.next_due {
                Some(at) => {
                    signal.cv.wait_until(&mut kicks, at);
                }
                None => signal.cv.wait(&mut kicks),
            }
        }
    }
}

/// What the flusher saw of its logs.
struct Look {
    /// Logs still open or holding records.
    open: usize,
    /// Some log's flush is due now.
    due: bool,
    /// When the earliest group delay ends, if some log holds records.
    next_due: Option<Instant>,
}

/// Look at every log: which are done (closed and written: marked so, and their closers told),
/// whether a flush is due, and when the next will be.
fn look(members: &[Member]) -> Look {
    let mut look = Look { open: 0, due: false, next_due: None };
    for m in members {
        let mut state = m.shared.state.lock();
        if state.flusher_done {
            continue;
        }
        if state.buf.is_empty() && state.closing {
            state.flusher_done = true;
            drop(state);
            m.shared.durable_cv.notify_all();
            continue;
        }
        look.open += 1;
        if m.shared.flush_due(&state).is_some() {
            look.due = true;
        } else if let Some(first) = state.first_unflushed_at {
            let at = first + Duration::from_micros(m.shared.cfg.group_commit_delay_us);
            look.next_due = Some(look.next_due.map_or(at, |t| t.min(at)));
        }
    }
    look
}

/// Cut every log's buffer, write each, sync each, then mark each durable. A log whose write or
/// sync fails stops (as a log alone does); the others go on.
fn flush_all(members: &mut [Member]) {
    let batches: Vec<Option<Batch>> = members.iter_mut().map(cut).collect();
    let mut written = vec![false; members.len()];
    for ((m, batch), ok) in members.iter_mut().zip(&batches).zip(&mut written) {
        if let Some(batch) = batch {
            match m.shared.write_batch(&mut m.segment, batch, false) {
                Ok(()) => *ok = true,
                Err(e) => m.shared.fail(e),
            }
        }
    }
    for (m, ok) in members.iter().zip(&mut written) {
        if *ok {
            if let Err(e) = m.shared.sync(&m.segment) {
                m.shared.fail(e);
                *ok = false;
            }
        }
    }
    for ((m, batch), ok) in members.iter_mut().zip(batches).zip(written) {
        if let Some(mut batch) = batch {
            if ok {
                m.shared.mark_durable(batch.last_lsn);
            }
            batch.bytes.clear();
            m.spare = batch.bytes;
        }
    }
}

/// Take one log's buffer, if it holds records and its log still runs.
fn cut(m: &mut Member) -> Option<Batch> {
    let mut state = m.shared.state.lock();
    if state.flusher_done || state.buf.is_empty() {
        return None;
    }
    // A log cut along with another one's due flush counts as flushed by time.
    let trigger = m.shared.flush_due(&state).unwrap_or(Trigger::Time);
    Some(m.shared.take_batch(&mut state, trigger, &mut m.spare))
}
