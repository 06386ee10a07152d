//! Append lanes: one buffer per appending thread in one log file (`WalConfig::lanes`), as
//! Silo's per-worker log buffers that one logger writes into one file per disk.
//!
//! An appender copies its record into its own lane under the lane's own lock: appenders of
//! different lanes share no lock and no cache line. A lane record has no LSN yet; it gets one
//! at the **cut**, when the flusher moves every lane's records into the log's buffer, numbers
//! them, writes their LSNs and checksums into their headers, and places them in segments. The
//! flusher then writes and syncs the group as it does any other: one file, one `write`, one
//! `fdatasync` per group, whatever the number of lanes.
//!
//! The cut takes every lane's lock at once, so it is a consistent cut: whatever an appender
//! decides under its lane's lock (`append_to_lane`'s `head`, which is where `rt::log` takes its
//! node-wide sequence number) is either wholly in the cut or wholly after it. Each lane numbers
//! its own records from 1; the on-durable callback reports, per lane, the number of its last
//! record now durable.

use super::writer::{Shared, State};
use super::*;

/// One lane's records not yet cut.
#[derive(Default)]
pub(super) struct AppendLane {
    /// Encoded records whose LSN and checksum the cut writes.
    bytes: Vec<u8>,
    /// Per record: where it starts in `bytes`, and the checksum of its payload.
    records: Vec<(usize, Hasher)>,
    /// The number of the last record appended to this lane (its first is 1).
    appended: u64,
}

impl Wal {
    /// Append one record to lane `lane`, `head` then `body`: `head` is called under the lane's
    /// lock with the record's number in its lane, so that what it decides is in the same cut as
    /// the record. Returns that number. Never waits for I/O (only for the memory bound, as
    /// [`Wal::append`], before it takes the lane's lock). A caller must not hold, across this
    /// call, a lock the on-durable callback takes: the flusher frees the memory of a group only
    /// after the callback has run for it, so an appender waiting for that memory with such a
    /// lock held would stop the flusher, and the flusher the appender, for good.
    pub fn append_to_lane<const H: usize>(
        &self,
        lane: usize,
        body: &[u8],
        head: impl FnOnce(u64) -> [u8; H],
    ) -> Result<u64, WalError> {
        let payload_bytes = H + body.len();
        if payload_bytes > MAX_RECORD_BYTES {
            return Err(WalError::RecordTooLarge { payload_bytes });
        }
        let shared = &*self.shared;
        assert!(lane < shared.lanes.len(), "lane {lane} of a log with {} lanes", shared.lanes.len());
        shared.wait_for_lane_space()?;
        let mut l = shared.lanes[lane].lock();
        if shared.refusing.load(Ordering::Acquire) {
            drop(l);
            // `refusing` is set only after the log closed or failed, so this always says which.
            let refused = shared.state.lock().check_accepting(&shared.cfg.dir).err();
            return Err(refused.unwrap_or_else(|| WalError::Closed { dir: shared.cfg.dir.clone() }));
        }
        let number = l.appended + 1;
        let head = head(number);
        // The payload's checksum, head first: under the lock, which only a cut's swap contends.
        let mut payload_crc = Hasher::new();
        payload_crc.update(&head);
        payload_crc.update(body);
        let start = l.bytes.len();
        format::put_record(0, 0, &[&head, body], &mut l.bytes);
        l.records.push((start, payload_crc));
        l.appended = number;
        let record_bytes = RECORD_HEADER_BYTES + payload_bytes;
        // Counted under the lane's lock, so that a close's barrier (`refuse_lane_appends`) sees it.
        let buffered = shared.lane_bytes.fetch_add(record_bytes, Ordering::AcqRel) + record_bytes;
        drop(l);
        let crossed = buffered >= shared.flush_at_bytes && buffered - record_bytes < shared.flush_at_bytes;
        if start == 0 || crossed {
            shared.lane_appended();
        }
        Ok(number)
    }
}

impl Shared {
    /// A lane went from empty to holding records, or the lanes crossed the group size: start
    /// the group timer if it is not running, and wake the flusher.
    fn lane_appended(&self) {
        let mut state = self.state.lock();
        if state.first_unflushed_at.is_none() {
            state.first_unflushed_at = Some(Instant::now());
        }
        drop(state);
        self.work_cv.notify_one();
    }

    /// Bounded memory for lanes: past half the bound, wait as [`Wal::append`] waits.
    fn wait_for_lane_space(&self) -> Result<(), WalError> {
        if self.lane_bytes.load(Ordering::Acquire) < self.max_unwritten_bytes / 2 {
            return Ok(());
        }
        let mut state = self.state.lock();
        self.wait_for_space(&mut state);
        state.check_accepting(&self.cfg.dir)
    }

    /// Bytes buffered in lanes, not yet cut.
    pub(super) fn lane_bytes(&self) -> usize {
        self.lane_bytes.load(Ordering::Acquire)
    }

    /// No lane append starts after this returns, and every one that started is counted in
    /// `lane_bytes` (each lane's lock is taken once, after `refusing` is set).
    pub(super) fn refuse_lane_appends(&self) {
        self.refusing.store(true, Ordering::Release);
        for lane in &self.lanes {
            drop(lane.lock());
        }
    }

    /// The cut, under the log's state lock: every lane's records are taken at once (each lane's
    /// lock is held only to swap its buffers with the emptied ones in `taken`), numbered from
    /// the next LSN and placed in segments as if they followed the `base` bytes the log's own
    /// buffer held. Their LSNs and checksums are written by [`fill_cut`] once the state lock is
    /// released, so neither lock is held while records are copied. Returns, per lane, the
    /// number of its last record in the cut; the LSN of the cut's first record; and its bytes.
    pub(super) fn cut_lanes(&self, state: &mut State, base: usize, taken: &mut [AppendLane]) -> (Vec<u64>, Lsn, usize) {
        assert_eq!(taken.len(), self.lanes.len(), "one spare buffer per lane");
        let mut marks = Vec::with_capacity(taken.len());
        {
            let mut lanes: Vec<_> = self.lanes.iter().map(|l| l.lock()).collect();
            for (l, t) in lanes.iter_mut().zip(taken.iter_mut()) {
                debug_assert!(t.bytes.is_empty() && t.records.is_empty(), "a spare lane buffer holds records");
                std::mem::swap(&mut l.bytes, &mut t.bytes);
                std::mem::swap(&mut l.records, &mut t.records);
                marks.push(l.appended);
            }
        }
        let first_lsn = state.next_lsn;
        let mut at = base;
        for t in taken.iter() {
            for (i, (start, _)) in t.records.iter().enumerate() {
                let end = t.records.get(i + 1).map_or(t.bytes.len(), |next| next.0);
                state.place_in_segment_at(at, state.next_lsn, (end - start) as u64, self.cfg.segment_bytes);
                state.next_lsn += 1;
                at += end - start;
            }
            state.records += t.records.len() as u64;
        }
        let moved = at - base;
        state.bytes += moved as u64;
        self.lane_bytes.fetch_sub(moved, Ordering::AcqRel);
        (marks, first_lsn, moved)
    }
}

/// Writes the LSNs (from `first_lsn` on, in lane order) and checksums of the records a cut took
/// ([`Shared::cut_lanes`]) and appends them to `out`, leaving `taken` empty for the next cut.
pub(super) fn fill_cut(taken: &mut [AppendLane], first_lsn: Lsn, out: &mut Vec<u8>) {
    let mut lsn = first_lsn;
    for t in taken.iter_mut() {
        let AppendLane { bytes, records, .. } = t;
        for (start, payload_crc) in records.iter() {
            let crc = format::record_crc_of(lsn, payload_crc.clone());
            bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
            bytes[start + 8..start + 16].copy_from_slice(&lsn.to_le_bytes());
            lsn += 1;
        }
        out.extend_from_slice(bytes);
        bytes.clear();
        records.clear();
    }
}
