//! A host's log machines (failover mode; owner-led, its followers'): what each replicated
//! log's committed records amount to, applied in log order, snapshotted for compaction and for
//! a node's adoption, and replaced by a leader's snapshot.
//!
//! The [`Applier`] runs them in one of two ways, through one [`Machines`]:
//! - **inline** (the simulator, whose protocol code runs in virtual time on the replica's
//!   worker, and `local`): every command runs as it is given, and its result is there at once;
//! - **on a thread of its own** (`tcp`): the replication thread, which also sends and steps
//!   Raft's heartbeats, hands each command to an applier thread and goes on. A replica of a
//!   TPC-C log replays every transaction in it; on the replication thread, that replay and the
//!   snapshots of a 12-14 MB state left a leader silent for 150-190 ms at a time, longer than
//!   its followers' election timeout, and they took its logs over in runs without a fault.
//!   etcd and TiKV apply off the Raft thread alike. The thread's results (snapshots, how far
//!   each machine applied, its watermark and counters) are published for the replication thread
//!   to pick up at its next pump; what waits for the thread is bounded by
//!   [`MAX_APPLY_BACKLOG_BYTES`], over which the leader proposes nothing more.

use super::raft_log::Entry;
use super::service::{apply_records, is_framed_entry, LogId, MachineFactory};
use crate::rt::log::LogMachine;
use crate::rt::log_warn;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

/// Bytes of committed entries an applier thread may have yet to apply before the replication
/// thread stops proposing its served logs' records (clients then wait for durability, as they
/// would behind a slow disk): replay that cannot keep up slows the writers instead of growing
/// without bound.
pub const MAX_APPLY_BACKLOG_BYTES: u64 = 64 << 20;

/// Why a snapshot was asked for: its result goes back to the one who asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// To compact the log below it.
    Compact,
    /// To rebuild the node from it on this host.
    Adopt,
}

/// A machine's snapshot, taken once it had applied every entry handed to it before the
/// request: up to `index`.
pub struct Taken {
    pub group: u32,
    pub index: u64,
    pub purpose: Purpose,
    pub data: Vec<u8>,
}

enum Command {
    /// Apply a group's committed entries, in order.
    Apply { group: u32, entries: Vec<Entry> },
    /// Snapshot a group's machine as of the last entry handed to it.
    Snapshot { group: u32, purpose: Purpose },
    /// The leader's snapshot at `index`: the group's machine starts over from it.
    Install { group: u32, index: u64, data: Vec<u8> },
    /// A machine rebuilt from the journal as the replicas reopened.
    Restore { group: u32, index: u64, machine: Box<dyn LogMachine>, pieces: Vec<u8> },
}

/// The machines themselves, and what they applied: the part that runs wherever the applier
/// does.
struct Machines {
    new_machine: MachineFactory,
    machines: FxHashMap<u32, Box<dyn LogMachine>>,
    /// Per group, the pieces of a record whose last piece has not been applied yet.
    pieces: FxHashMap<u32, Vec<u8>>,
    /// Per group, the index of the last entry applied (or the snapshot installed).
    applied_index: FxHashMap<u32, u64>,
}

/// What running one command produced.
#[derive(Default)]
struct Outcome {
    records: usize,
    taken: Option<Taken>,
    /// The host can no longer trust its replicas (a leader's snapshot it cannot restore).
    failure: Option<String>,
}

impl Machines {
    fn new(new_machine: MachineFactory) -> Machines {
        Machines {
            new_machine,
            machines: Default::default(),
            pieces: Default::default(),
            applied_index: Default::default(),
        }
    }

    fn run(&mut self, command: Command) -> Outcome {
        match command {
            Command::Apply { group, entries } => Outcome { records: self.apply(group, &entries), ..Default::default() },
            Command::Snapshot { group, purpose } => {
                let index = self.applied_index.get(&group).copied().unwrap_or(0);
                Outcome {
                    taken: Some(Taken { group, index, purpose, data: self.snapshot(group) }),
                    ..Default::default()
                }
            }
            Command::Install { group, index, data } => match (self.new_machine)(LogId::of_group(group), Some(&data)) {
                Ok(m) => {
                    self.restore(group, index, m, Vec::new());
                    Outcome::default()
                }
                Err(e) => Outcome {
                    failure: Some(format!("cannot restore log {group}'s snapshot at index {index}: {e:#}")),
                    ..Default::default()
                },
            },
            Command::Restore { group, index, machine, pieces } => {
                self.restore(group, index, machine, pieces);
                Outcome::default()
            }
        }
    }

    fn restore(&mut self, group: u32, index: u64, machine: Box<dyn LogMachine>, pieces: Vec<u8>) {
        self.machines.insert(group, machine);
        self.pieces.insert(group, pieces);
        self.applied_index.insert(group, index);
    }

    /// Apply `entries` of `group` to its machine (made on first use). Returns the record-level
    /// steps that took (the writes it replayed where the machine counts them
    /// ([`LogMachine::take_steps`]), else one per record applied); none without a machine (the protocol's factory failed, which is logged).
    fn apply(&mut self, group: u32, entries: &[Entry]) -> usize {
        let Some(last) = entries.last() else { return 0 };
        self.applied_index.insert(group, last.index);
        let machine = match self.machines.entry(group) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match (self.new_machine)(LogId::of_group(group), None) {
                Ok(m) => v.insert(m),
                Err(e) => {
                    log_warn(&format!("replication: log {group}: no state machine: {e:#}"));
                    return 0;
                }
            },
        };
        let pieces = self.pieces.entry(group).or_default();
        let mut records = 0;
        for e in entries {
            debug_assert!(is_framed_entry(&e.data), "an entry of group {group} with an unknown tag");
            records += apply_records(&e.data, pieces, |record| machine.apply(record));
        }
        records.max(machine.take_steps())
    }

    /// What `group`'s applied records amount to (a fresh machine's state if none applied yet;
    /// empty if the protocol cannot make a machine).
    fn snapshot(&self, group: u32) -> Vec<u8> {
        match self.machines.get(&group) {
            Some(m) => m.snapshot(),
            None => (self.new_machine)(LogId::of_group(group), None).map(|m| m.snapshot()).unwrap_or_default(),
        }
    }

    fn watermarks_us(&self) -> FxHashMap<u32, u64> {
        self.machines.iter().filter_map(|(&g, m)| Some((g, m.applied_watermark_us()?))).collect()
    }

    fn counters(&self) -> FxHashMap<u32, Vec<(&'static str, u64)>> {
        self.machines.iter().map(|(&g, m)| (g, m.counters())).collect()
    }
}

/// What an applier thread last made known.
#[derive(Default)]
struct Published {
    applied_index: FxHashMap<u32, u64>,
    taken: Vec<Taken>,
    failure: Option<String>,
    watermarks_us: FxHashMap<u32, u64>,
    counters: FxHashMap<u32, Vec<(&'static str, u64)>>,
}

/// The replication thread's side of an applier thread.
struct Remote {
    commands: mpsc::Sender<Command>,
    published: Arc<Mutex<Published>>,
    /// Bytes of entries sent and not yet applied.
    backlog_bytes: Arc<AtomicU64>,
}

/// A host's log machines, run inline or on a thread of their own (see the module's header).
pub struct Applier {
    inline: Option<Machines>,
    remote: Option<Remote>,
    /// Inline: results not yet picked up.
    taken: Vec<Taken>,
    failure: Option<String>,
}

impl Applier {
    pub fn inline(new_machine: MachineFactory) -> Applier {
        Applier { inline: Some(Machines::new(new_machine)), remote: None, taken: Vec::new(), failure: None }
    }

    /// An applier whose machines run on a thread named `applier@{host}`; the thread ends when
    /// the applier is dropped (after the command it is running).
    pub fn on_thread(new_machine: MachineFactory, host: crate::net::NodeId) -> std::io::Result<Applier> {
        let mut machines = Machines::new(new_machine);
        let (commands, received) = mpsc::channel::<Command>();
        let published: Arc<Mutex<Published>> = Default::default();
        let backlog_bytes = Arc::new(AtomicU64::new(0));
        let (out, backlog) = (published.clone(), backlog_bytes.clone());
        std::thread::Builder::new().name(format!("applier@{host}")).spawn(move || {
            if let Err(e) = crate::util::lower_this_threads_priority(crate::util::WORKER_NICE) {
                crate::rt::log_warn(&format!("an applier runs at normal priority (setpriority: {e})"));
            }
            while let Ok(first) = received.recv() {
                let mut outcomes = Vec::new();
                for command in std::iter::once(first).chain(received.try_iter()) {
                    let bytes = command_bytes(&command);
                    outcomes.push(machines.run(command));
                    backlog.fetch_sub(bytes, Ordering::Release);
                }
                publish(&machines, outcomes, &mut out.lock());
            }
        })?;
        Ok(Applier {
            inline: None,
            remote: Some(Remote { commands, published, backlog_bytes }),
            taken: Vec::new(),
            failure: None,
        })
    }

    fn send(&mut self, command: Command) -> Outcome {
        match (&mut self.inline, &self.remote) {
            (Some(m), _) => {
                let outcome = m.run(command);
                self.taken.extend(outcome.taken);
                self.failure = self.failure.take().or(outcome.failure);
                Outcome { records: outcome.records, ..Default::default() }
            }
            (None, Some(r)) => {
                r.backlog_bytes.fetch_add(command_bytes(&command), Ordering::AcqRel);
                if r.commands.send(command).is_err() {
                    self.failure.get_or_insert_with(|| "the applier thread died".to_string());
                }
                Outcome::default()
            }
            (None, None) => unreachable!("an applier runs inline or on a thread"),
        }
    }

    /// Apply `group`'s committed `entries`. Returns the record-level steps applying took inline
    /// (0 on a thread).
    pub fn apply(&mut self, group: u32, entries: Vec<Entry>) -> usize {
        if entries.is_empty() {
            return 0;
        }
        self.send(Command::Apply { group, entries }).records
    }

    /// Ask for `group`'s state as of the last entry handed to it; it comes back through
    /// [`Applier::take_snapshots`] (inline: at once).
    pub fn snapshot(&mut self, group: u32, purpose: Purpose) {
        self.send(Command::Snapshot { group, purpose });
    }

    /// The group's machine starts over from the leader's snapshot at `index`.
    pub fn install(&mut self, group: u32, index: u64, data: Vec<u8>) {
        self.send(Command::Install { group, index, data });
    }

    /// A machine rebuilt as the replicas reopened, having applied up to `index`.
    pub fn restore(&mut self, group: u32, index: u64, machine: Box<dyn LogMachine>, pieces: Vec<u8>) {
        self.send(Command::Restore { group, index, machine, pieces });
    }

    /// The snapshots taken since the last call.
    pub fn take_snapshots(&mut self) -> Vec<Taken> {
        let mut taken = std::mem::take(&mut self.taken);
        if let Some(r) = &self.remote {
            taken.append(&mut r.published.lock().taken);
        }
        taken
    }

    /// Why the machines can no longer be trusted, once.
    pub fn take_failure(&mut self) -> Option<String> {
        let published = self.remote.as_ref().and_then(|r| r.published.lock().failure.take());
        self.failure.take().or(published)
    }

    /// The index of the last entry `group`'s machine applied.
    pub fn applied_index(&self, group: u32) -> u64 {
        match (&self.inline, &self.remote) {
            (Some(m), _) => m.applied_index.get(&group).copied().unwrap_or(0),
            (None, Some(r)) => r.published.lock().applied_index.get(&group).copied().unwrap_or(0),
            (None, None) => 0,
        }
    }

    /// Bytes handed to the thread and not applied yet (0 inline).
    pub fn backlog_bytes(&self) -> u64 {
        self.remote.as_ref().map_or(0, |r| r.backlog_bytes.load(Ordering::Acquire))
    }

    /// Each machine's applied watermark, where it keeps one ([`LogMachine::applied_watermark_us`]).
    pub fn watermarks_us(&self) -> Vec<u64> {
        match (&self.inline, &self.remote) {
            (Some(m), _) => m.watermarks_us().into_values().collect(),
            (None, Some(r)) => r.published.lock().watermarks_us.values().copied().collect(),
            (None, None) => Vec::new(),
        }
    }

    /// What the machines count, per machine.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        match (&self.inline, &self.remote) {
            (Some(m), _) => m.counters().into_values().flatten().collect(),
            (None, Some(r)) => r.published.lock().counters.values().flatten().copied().collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// The bytes a command holds back from the replication thread's proposals.
fn command_bytes(command: &Command) -> u64 {
    match command {
        Command::Apply { entries, .. } => entries.iter().map(|e| e.data.len() as u64).sum(),
        _ => 0,
    }
}

/// Make what the thread's machines did since the last time known.
fn publish(machines: &Machines, outcomes: Vec<Outcome>, out: &mut Published) {
    for o in outcomes {
        out.taken.extend(o.taken);
        if out.failure.is_none() {
            out.failure = o.failure;
        }
    }
    out.applied_index.clone_from(&machines.applied_index);
    out.watermarks_us = machines.watermarks_us();
    out.counters = machines.counters();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine that keeps the sum of the bytes of every record it applied.
    struct Sum(u64);
    impl LogMachine for Sum {
        fn apply(&mut self, record: &[u8]) {
            self.0 += record.iter().map(|&b| b as u64).sum::<u64>();
        }
        fn snapshot(&self) -> Vec<u8> {
            self.0.to_le_bytes().to_vec()
        }
        fn counters(&self) -> Vec<(&'static str, u64)> {
            vec![("sum", self.0)]
        }
    }

    fn factory() -> MachineFactory {
        Arc::new(|_, snapshot: Option<&[u8]>| {
            let sum = match snapshot {
                None => 0,
                Some(s) => u64::from_le_bytes(s.try_into().map_err(|_| anyhow::anyhow!("{} bytes, not 8", s.len()))?),
            };
            Ok(Box::new(Sum(sum)) as Box<dyn LogMachine>)
        })
    }

    fn entry(index: u64, record: &[u8]) -> Entry {
        Entry { index, term: 1, data: super::super::service::frame(super::super::service::TAG_RECORD, record) }
    }

    /// Waits until the thread has applied `group` up to `index`.
    fn wait_applied(a: &Applier, group: u32, index: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while a.applied_index(group) < index {
            assert!(std::time::Instant::now() < deadline, "the applier thread applied {group} up to {index} in 10 s");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The first `n` snapshots `a` takes (waiting up to 10 s for a thread's).
    fn snapshots(a: &mut Applier, n: usize) -> Vec<(u32, u64, Purpose, Vec<u8>)> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut taken = Vec::new();
        while taken.len() < n {
            assert!(std::time::Instant::now() < deadline, "{n} snapshots taken in 10 s");
            taken.extend(a.take_snapshots().into_iter().map(|t| (t.group, t.index, t.purpose, t.data)));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        taken
    }

    #[test]
    fn a_thread_applies_snapshots_and_installs_as_inline_does() {
        let mut inline = Applier::inline(factory());
        let mut threaded = Applier::on_thread(factory(), 0).expect("a thread");
        for a in [&mut inline, &mut threaded] {
            assert_eq!(a.apply(7, vec![entry(1, &[1, 2]), entry(2, &[3])]), if a.inline.is_some() { 2 } else { 0 });
            a.snapshot(7, Purpose::Compact);
            a.install(8, 5, 40u64.to_le_bytes().to_vec());
            a.apply(8, vec![entry(6, &[2])]);
            a.snapshot(8, Purpose::Adopt);
        }
        for a in [&mut inline, &mut threaded] {
            // Published with the last snapshot, after every apply.
            assert_eq!(
                snapshots(a, 2),
                [
                    (7, 2, Purpose::Compact, 6u64.to_le_bytes().to_vec()),
                    (8, 6, Purpose::Adopt, 42u64.to_le_bytes().to_vec())
                ]
            );
            assert_eq!((a.applied_index(7), a.applied_index(8)), (2, 6));
            let mut counters = a.counters();
            counters.sort();
            assert_eq!(counters, [("sum", 6), ("sum", 42)]);
            assert_eq!(a.backlog_bytes(), 0);
            assert!(a.take_failure().is_none());
        }
    }

    #[test]
    fn a_snapshot_that_cannot_be_restored_is_a_failure_reported_once() {
        let mut a = Applier::on_thread(factory(), 0).expect("a thread");
        a.install(3, 9, vec![1, 2, 3]);
        a.apply(4, vec![entry(1, &[1])]);
        wait_applied(&a, 4, 1);
        let failure = a.take_failure().expect("the failed install is reported");
        assert!(failure.contains("log 3's snapshot at index 9"), "{failure}");
        assert!(a.take_failure().is_none());
    }
}
