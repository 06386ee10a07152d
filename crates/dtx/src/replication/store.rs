//! The store under a host's replicas ([`ReplicaStore`]): raft-rs's in-memory log, the snapshot
//! the log starts after (with the applied state it stands for, which raft-rs's `MemStorage`
//! does not keep), and every change as a [`JournalOp`] for the host's journal.
//!
//! raft reads the log from memory; what makes it durable is the journal, which the replicator
//! syncs before anything a change implies leaves the process (see `journal`). Reopening
//! replays the journal's ops through the same methods, so a reopened store is the store that
//! was written.

use super::journal::{JournalEntry, JournalOp};
use super::raft_log::{LogStore, RaftLogError, ReplicaId};
use raft::eraftpb::{ConfState, Entry as RaftEntry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// A group's log in memory, its latest snapshot, and the changes not yet journaled.
pub struct ReplicaStore {
    group: u32,
    voters: Vec<ReplicaId>,
    mem: MemStorage,
    /// The latest snapshot (index 0: none yet): what a follower that lacks compacted entries
    /// is sent, data included.
    snapshot: Snapshot,
    /// Changes made since the journal last took them.
    unjournaled: Vec<JournalOp>,
    /// Whether a journal takes them: a store kept only in memory (the `local` runtime's
    /// owner-led replicas) records none, rather than copying every entry into a list nothing
    /// drains.
    journaled: bool,
}

fn storage_err(e: raft::Error) -> RaftLogError {
    RaftLogError::Storage(e.to_string())
}

impl ReplicaStore {
    /// An empty log of group `group` with membership `voters`.
    pub fn new(group: u32, voters: &[ReplicaId]) -> ReplicaStore {
        ReplicaStore {
            group,
            voters: voters.to_vec(),
            mem: super::raft_log::new_mem_store(voters),
            snapshot: Snapshot::default(),
            unjournaled: Vec::new(),
            journaled: true,
        }
    }

    /// The same store, kept in memory only: it records no changes for a journal.
    pub fn unjournaled(mut self) -> ReplicaStore {
        self.journaled = false;
        self.unjournaled.clear();
        self
    }

    /// Record a change for the journal (made only when a journal takes it).
    fn journal(&mut self, op: impl FnOnce(&Self) -> JournalOp) {
        if self.journaled {
            let op = op(self);
            self.unjournaled.push(op);
        }
    }

    /// The changes made since the last call, oldest first.
    pub fn take_unjournaled(&mut self) -> Vec<JournalOp> {
        std::mem::take(&mut self.unjournaled)
    }

    /// The index of the latest snapshot (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// Records `data` as the applied state of the log up to `index` (term `term`), to be sent to
    /// followers that need the entries a compaction at `index` drops.
    ///
    /// Neither this nor the compaction after it is journaled: the journal keeps the entries
    /// the snapshot covers until its next rewrite writes the store as it then is
    /// ([`ReplicaStore::live_ops`]), and a reopen before that rebuilds the same state from the
    /// older snapshot and those entries. Journaling each snapshot as it was taken wrote a 10-14
    /// MB state per TPC-C log, inline on the replication thread, every 16 MiB of log; that
    /// write and its fsync silenced a leader for 70-230 ms, and its followers took over in runs
    /// without a fault. (Journals written before keep such snapshots and compactions;
    /// [`ReplicaStore::replay`] still reads them.)
    pub fn set_snapshot(&mut self, index: u64, term: u64, data: Vec<u8>) {
        self.snapshot = self.make_snapshot(index, term, data);
    }

    fn make_snapshot(&self, index: u64, term: u64, data: Vec<u8>) -> Snapshot {
        let mut s = Snapshot::default();
        s.set_data(data.into());
        let meta = s.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(ConfState::from((self.voters.clone(), Vec::new())));
        s
    }

    /// Applies one journaled op (reopening).
    pub fn replay(&mut self, op: JournalOp) -> Result<(), RaftLogError> {
        match op {
            JournalOp::Append { entries, .. } => {
                let entries: Vec<RaftEntry> = entries.into_iter().map(to_raft_entry).collect();
                self.mem.wl().append(&entries).map_err(storage_err)
            }
            JournalOp::HardState { term, vote, commit, .. } => {
                let mut hs = HardState::default();
                (hs.term, hs.vote, hs.commit) = (term, vote, commit);
                self.mem.wl().set_hardstate(hs);
                Ok(())
            }
            JournalOp::Snapshot { index, term, installed, data, .. } => {
                self.snapshot = self.make_snapshot(index, term, data);
                if installed {
                    self.mem.wl().apply_snapshot(self.snapshot.clone()).map_err(storage_err)?;
                }
                Ok(())
            }
            JournalOp::Compact { first_index_to_keep, .. } => {
                self.mem.wl().compact(first_index_to_keep).map_err(storage_err)
            }
            // Reading the journal joins parts into their snapshot.
            JournalOp::SnapshotPart { index, .. } => {
                Err(RaftLogError::Storage(format!("a part of snapshot {index} without the snapshot")))
            }
        }
    }

    /// The ops that rebuild this store as it is now: its snapshot (as installed), its entries
    /// after it, its hard state.
    pub fn live_ops(&self) -> Result<Vec<JournalOp>, RaftLogError> {
        let mut ops = Vec::new();
        let meta = self.snapshot.get_metadata();
        if meta.index > 0 {
            ops.push(JournalOp::Snapshot {
                group: self.group,
                index: meta.index,
                term: meta.term,
                installed: true,
                data: self.snapshot.get_data().to_vec(),
            });
        }
        let (first, last) = (self.mem.first_index().map_err(storage_err)?, self.mem.last_index().map_err(storage_err)?);
        let from = first.max(meta.index + 1);
        if from <= last {
            let entries =
                self.mem.entries(from, last + 1, None, GetEntriesContext::empty(false)).map_err(storage_err)?;
            ops.push(JournalOp::Append { group: self.group, entries: entries.iter().map(to_journal_entry).collect() });
        }
        ops.push(self.hard_state_op(self.mem.rl().hard_state()));
        Ok(ops)
    }

    /// The entries this store still holds up to `commit` (those before its first index were
    /// compacted into its snapshot).
    pub fn entries_up_to(&self, commit: u64) -> Result<Vec<JournalEntry>, RaftLogError> {
        let (first, last) = (self.mem.first_index().map_err(storage_err)?, self.mem.last_index().map_err(storage_err)?);
        let to = commit.min(last);
        if first > to {
            return Ok(Vec::new());
        }
        let entries = self.mem.entries(first, to + 1, None, GetEntriesContext::empty(false)).map_err(storage_err)?;
        Ok(entries.iter().map(to_journal_entry).collect())
    }

    /// The bytes of the entries this store still holds up to `commit`, and of its snapshot's
    /// data: what a compaction would free, and what it would keep instead.
    pub fn held_bytes_up_to(&self, commit: u64) -> Result<(u64, u64), RaftLogError> {
        let (first, last) = (self.mem.first_index().map_err(storage_err)?, self.mem.last_index().map_err(storage_err)?);
        let to = commit.min(last);
        let entries = match first > to {
            true => 0,
            false => self
                .mem
                .entries(first, to + 1, None, GetEntriesContext::empty(false))
                .map_err(storage_err)?
                .iter()
                .map(|e| e.get_data().len() as u64)
                .sum(),
        };
        Ok((entries, self.snapshot.get_data().len() as u64))
    }

    fn hard_state_op(&self, hs: &HardState) -> JournalOp {
        JournalOp::HardState { group: self.group, term: hs.term, vote: hs.vote, commit: hs.commit }
    }
}

fn to_raft_entry(e: JournalEntry) -> RaftEntry {
    let mut r = RaftEntry::default();
    (r.index, r.term) = (e.index, e.term);
    r.set_data(e.data.into());
    r
}

fn to_journal_entry(e: &RaftEntry) -> JournalEntry {
    JournalEntry { index: e.index, term: e.term, data: e.data.to_vec() }
}

impl Storage for ReplicaStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<RaftEntry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The latest snapshot, with its data. Raft asks only for a follower that needs compacted
    /// entries, which exist only once a snapshot was taken.
    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index() == 0 {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

impl LogStore for ReplicaStore {
    fn append(&mut self, entries: &[RaftEntry]) -> Result<(), RaftLogError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.mem.wl().append(entries).map_err(storage_err)?;
        self.journal(|me| JournalOp::Append {
            group: me.group,
            entries: entries.iter().map(to_journal_entry).collect(),
        });
        Ok(())
    }

    fn set_hard_state(&mut self, hard_state: &HardState) -> Result<(), RaftLogError> {
        self.mem.wl().set_hardstate(hard_state.clone());
        self.journal(|me| me.hard_state_op(hard_state));
        Ok(())
    }

    fn set_commit(&mut self, commit_index: u64) -> Result<(), RaftLogError> {
        let hs = {
            let mut core = self.mem.wl();
            core.mut_hard_state().set_commit(commit_index);
            core.hard_state().clone()
        };
        self.journal(|me| me.hard_state_op(&hs));
        Ok(())
    }

    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), RaftLogError> {
        self.mem.wl().apply_snapshot(snapshot.clone()).map_err(storage_err)?;
        let meta = snapshot.get_metadata();
        self.journal(|me| JournalOp::Snapshot {
            group: me.group,
            index: meta.index,
            term: meta.term,
            installed: true,
            data: snapshot.get_data().to_vec(),
        });
        self.snapshot = snapshot.clone();
        Ok(())
    }

    /// Not journaled (see [`ReplicaStore::set_snapshot`]).
    fn compact(&mut self, first_index_to_keep: u64) -> Result<(), RaftLogError> {
        self.mem.wl().compact(first_index_to_keep).map_err(storage_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(from: u64, n: u64) -> Vec<RaftEntry> {
        (from..from + n)
            .map(|index| {
                let mut e = RaftEntry::default();
                (e.index, e.term) = (index, 1);
                e.set_data(vec![7u8; 1024].into());
                e
            })
            .collect()
    }

    /// A store no journal drains must not keep a copy of every entry for one: the `local`
    /// runtime's replicated logs once grew by every record they carried (3.6 GB in a 3 s run).
    #[test]
    fn a_store_kept_in_memory_only_records_nothing_for_a_journal() {
        let mut journaled = ReplicaStore::new(0, &[1, 2, 3]);
        let mut in_memory = ReplicaStore::new(0, &[1, 2, 3]).unjournaled();
        for s in [&mut journaled, &mut in_memory] {
            s.append(&entries(1, 10)).expect("an append");
            s.set_commit(10).expect("a commit");
            s.compact(5).expect("a compaction");
        }
        assert_eq!(journaled.take_unjournaled().len(), 2, "an append and a hard state (a compaction is not journaled)");
        assert!(in_memory.take_unjournaled().is_empty());
        assert_eq!(in_memory.entries_up_to(10).expect("entries").len(), 6, "it still holds its log");
    }

    /// A store rebuilt from what it journaled, as a reopen does.
    fn replayed(ops: Vec<JournalOp>) -> ReplicaStore {
        let mut store = ReplicaStore::new(0, &[1, 2, 3]);
        for op in ops {
            store.replay(op).expect("a journaled op replays");
        }
        store
    }

    #[test]
    fn a_snapshot_taken_here_reaches_the_journal_with_its_next_rewrite() {
        let mut s = ReplicaStore::new(0, &[1, 2, 3]);
        s.append(&entries(1, 10)).expect("an append");
        s.set_commit(10).expect("a commit");
        s.set_snapshot(6, 1, vec![4, 2]);
        s.compact(7).expect("a compaction");
        // Before a rewrite: the journal still holds every entry the snapshot covers.
        let before = replayed(s.take_unjournaled());
        assert_eq!((before.snapshot_index(), before.entries_up_to(10).expect("entries").len()), (0, 10));
        // The rewrite writes the store as it is: the snapshot, then the entries after it.
        let after = replayed(s.live_ops().expect("the live state"));
        assert_eq!(after.snapshot_index(), 6);
        assert_eq!(after.snapshot.get_data(), &[4, 2]);
        let kept: Vec<u64> = after.entries_up_to(10).expect("entries").iter().map(|e| e.index).collect();
        assert_eq!(kept, [7, 8, 9, 10]);
    }
}
