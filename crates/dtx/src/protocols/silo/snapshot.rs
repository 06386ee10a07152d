//! Silo's snapshot transactions (Tu et al. §4.9, `silo:snapshots=true`): a transaction its
//! workload declares read-only reads a recent consistent snapshot of the database, without
//! validation and without ever aborting; writers keep the old versions that a snapshot may
//! still read, and drop them once no snapshot can.
//!
//! Every version carries the clock its writer read at its serialization point (after locking
//! its writes, before validating its reads: where Silo reads the epoch), one clock for all
//! workers (`Worker::history_now_us`: in the simulator the step's time, without the CPU the
//! step charged, so that it follows causality across workers). If T1 precedes T2 in the serial
//! order, T1's serialization point comes first in real time (T2 read or overwrote what T1
//! installed, or T1 validated a read before T2 locked its key), so its clock is no later: the
//! versions at or below a clock reading are a prefix of the serial order. (A TID is not: the
//! TIDs it read can push it past a later transaction's.)
//!
//! Snapshot points are clock readings `snapshot_us` apart (Silo's snapshot epoch of k = 25
//! epochs of 40 ms: one a second by default). A snapshot at point `P` sees, of each record, its
//! latest version serialized at or before `P`. A point is published once no version at or
//! before it can still be installed: the clock has passed it and no worker is between its
//! serialization point and its install at or before it (each worker announces that window in
//! its `installing` slot, as Silo's workers announce their epoch). A reader announces the point
//! it reads in its `reading` slot, and old versions are dropped only below every announced
//! point (Silo's epoch-based reclamation, done with the points themselves).
//!
//! Where this departs from Silo: an epoch is a span of the clock rather than a counter every
//! commit reads, and the old versions hang off the record itself (one per snapshot point
//! crossed, so a record holds at most a few), not in a separate version chain per table.

use super::meta::SiloMeta;
use crate::rt::Worker;
use crate::storage::{Record, RowKey, Storage, Value};
use crate::txn::{Abort, Access, Reason, Scan, Step};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// An older version of a record, kept while a snapshot may read it.
#[derive(Debug)]
pub struct Version {
    pub tid: u64,
    /// Its writer's serialization clock (µs, plus one: 0 is nothing's).
    pub ser_us: u64,
    pub value: Option<Value>,
    pub older: Option<Box<Version>>,
}

/// A worker's slot: `IDLE`, or in `installing` the serialization clock of the transaction it
/// is about to install (`UNKNOWN` while it reads the clock), in `reading` the point it reads. Each holds
/// the smallest value so that the minimum over the slots is the bound.
const IDLE: u64 = u64::MAX;
const UNKNOWN: u64 = 0;

/// One cache line per slot, so that workers announcing do not contend.
#[repr(align(64))]
struct Slot(AtomicU64);

/// The node's snapshot points and what each worker announces.
pub struct Snapshots {
    /// The spacing of the points (`snapshot_us`); the first is 0, where every loaded or
    /// recovered row lies.
    step: u64,
    /// The latest published point.
    published: AtomicU64,
    /// Versions that only points below this could read are dropped.
    reclaim_below: AtomicU64,
    installing: Vec<Slot>,
    reading: Vec<Slot>,
}

impl Snapshots {
    pub fn new(snapshot_us: u64, workers: usize) -> Self {
        assert!(snapshot_us > 0, "the option's bounds keep snapshot_us positive");
        let slots = || (0..workers).map(|_| Slot(AtomicU64::new(IDLE))).collect();
        Snapshots {
            step: snapshot_us,
            published: AtomicU64::new(0),
            reclaim_below: AtomicU64::new(0),
            installing: slots(),
            reading: slots(),
        }
    }

    /// The spacing of the points in the clock, µs.
    pub fn step_us(&self) -> u64 {
        self.step
    }

    /// The first snapshot point at or after `ser_us` (points are `m * step`).
    fn point_at_or_after(&self, ser_us: u64) -> u64 {
        ser_us.div_ceil(self.step) * self.step
    }

    /// Worker `worker` reaches its serialization point: the clock it reads there (`now_us`,
    /// read after this call) is what its versions carry. Returns that.
    pub fn serialize(&self, worker: usize, now: impl FnOnce() -> u64) -> u64 {
        self.installing[worker].0.store(UNKNOWN, SeqCst);
        let ser_us = now() + 1;
        self.installing[worker].0.store(ser_us, SeqCst);
        ser_us
    }

    /// The worker installed its transaction (or let it go).
    pub fn end_install(&self, worker: usize) {
        self.installing[worker].0.store(IDLE, SeqCst);
    }

    /// Publish the latest point that is complete, given the clock `now_us` (every
    /// serialization from now on is after it), and move the reclamation bound. Returns the
    /// published point.
    pub fn advance(&self, now_us: u64) -> u64 {
        let mut point = self.published.load(SeqCst);
        // Every version still to be installed is serialized after `bound`.
        let installing = self.installing.iter().map(|s| s.0.load(SeqCst)).min().unwrap_or(IDLE);
        let bound = now_us.min(installing.saturating_sub(1));
        {
            let candidate = bound / self.step * self.step;
            if candidate > point {
                point = candidate;
                self.published.store(point, SeqCst);
            }
        }
        let announced = self.reading.iter().map(|s| s.0.load(SeqCst)).min().unwrap_or(IDLE);
        self.reclaim_below.store(announced.min(point), SeqCst);
        point
    }

    /// Worker `worker` starts a snapshot transaction: the point it reads, announced so that
    /// the versions it needs stay.
    pub fn begin_read(&self, worker: usize) -> u64 {
        loop {
            let point = self.published.load(SeqCst);
            self.reading[worker].0.store(point, SeqCst);
            // A reclamation that did not see the announcement reclaimed below the point it
            // published then, at most the one read here unless a newer one came out.
            if self.reclaim_below.load(SeqCst) <= point {
                return point;
            }
        }
    }

    pub fn end_read(&self, worker: usize) {
        self.reading[worker].0.store(IDLE, SeqCst);
    }

    /// Install `value` at `tid`, serialized at `ser_us`, over the row's current version,
    /// keeping that version while some snapshot point, present or future, may read it, and
    /// dropping the ones none can.
    pub fn install(&self, row: &mut crate::storage::Row<SiloMeta>, tid: u64, ser_us: u64, value: Option<Value>) {
        let floor = self.reclaim_below.load(SeqCst);
        let (old_tid, old_ser_us) = (row.meta.tid, row.meta.ser_us);
        let old_value = std::mem::replace(&mut row.value, value);
        // The old version is read by a point in [old_ser_us, ser_us) at or after the floor.
        let needed = self.point_at_or_after(old_ser_us.max(floor)) < ser_us;
        (row.meta.tid, row.meta.ser_us) = (tid, ser_us);
        match needed {
            true => {
                let older = row.meta.older.take();
                let v = Version { tid: old_tid, ser_us: old_ser_us, value: old_value, older };
                row.meta.older = Some(Box::new(v));
            }
            false => Value::recycle(old_value),
        }
        prune(&mut row.meta.older, ser_us, floor);
    }
}

/// Drop the versions that no point at or after `floor` reads: a version whose newer one was
/// serialized at or before `floor` is shadowed for every such point.
fn prune(older: &mut Option<Box<Version>>, newer_ser_us: u64, floor: u64) {
    let mut newer = newer_ser_us;
    let mut cur = older;
    while cur.is_some() {
        if newer <= floor {
            *cur = None; // This version and every older one are shadowed.
            return;
        }
        let v = cur.as_mut().expect("checked above");
        newer = v.ser_us;
        cur = &mut v.older;
    }
}

/// The value of `rec` at snapshot point `point`, and its TID (0: no version serialized by
/// then, read as absent).
pub fn read_at(rec: &Record<SiloMeta>, point: u64) -> (Option<Value>, u64) {
    let row = rec.lock();
    if row.meta.ser_us <= point {
        return (row.value.clone(), row.meta.tid);
    }
    let mut v = row.meta.older.as_deref();
    while let Some(version) = v {
        if version.ser_us <= point {
            return (version.value.clone(), version.tid);
        }
        v = version.older.as_deref();
    }
    (None, 0)
}

/// A snapshot transaction wrote: its workload declared it read-only, and it was not.
pub const SNAPSHOT_WROTE: Reason = Reason::new("snapshot-wrote");

/// The execution of a snapshot transaction: every read and scan at the point, no read set,
/// nothing to validate.
pub struct SnapshotRead<'a> {
    pub store: &'a Storage<SiloMeta>,
    pub w: &'a Worker,
    pub point: u64,
    /// The largest TID it read: its result is released once that is durable.
    pub newest: u64,
}

impl Access for SnapshotRead<'_> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.w.charge_ops(1);
        let (value, tid) = self.store.get(key).map_or((None, 0), |rec| read_at(rec, self.point));
        self.newest = self.newest.max(tid);
        Step::Ready(Ok(value))
    }

    fn write(&mut self, _key: RowKey, _value: Option<Value>) -> Step<'_, ()> {
        Step::Ready(Err(Abort::Protocol(SNAPSHOT_WROTE)))
    }

    /// The first `limit` rows present at the point (the store's ranges also hold records
    /// absent there: deleted, or inserted since).
    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        let (table, want) = (self.store.table(s.table), s.limit as usize);
        let mut fetch = want.max(1);
        let rows = loop {
            let records = table.range(s.lo, s.hi, fetch, s.descending);
            let exhausted = records.len() < fetch;
            let mut rows = Vec::with_capacity(want);
            for (k, rec) in records {
                let (value, tid) = read_at(rec, self.point);
                self.newest = self.newest.max(tid);
                rows.extend(value.map(|v| (k, v)));
                if rows.len() == want {
                    break;
                }
            }
            if rows.len() >= want || exhausted {
                break rows;
            }
            fetch = fetch.saturating_mul(2);
        };
        self.w.charge_ops(1 + rows.len());
        Step::Ready(Ok(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(b: u8) -> Option<Value> {
        Some(Value::copy_from(&[b]))
    }

    const STEP: u64 = 10;

    #[test]
    fn a_point_is_published_once_the_clock_passed_it_and_no_worker_installs_at_or_before_it() {
        let s = Snapshots::new(STEP, 2);
        assert_eq!(s.advance(5), 0, "the clock has not reached the first point after 0");
        s.installing[1].0.store(UNKNOWN, SeqCst);
        assert_eq!(s.advance(30), 0, "a worker reading its clock may serialize at any time");
        assert_eq!(s.serialize(1, || 14), 15);
        assert_eq!(s.advance(30), 10, "the worker's versions lie after the first point, not the second");
        s.end_install(1);
        assert_eq!(s.advance(30), 30, "no later serialization can be at or before the clock");
    }

    #[test]
    fn a_snapshot_reads_the_version_before_its_point_and_only_shadowed_versions_go() {
        let s = Snapshots::new(STEP, 1);
        let rec = Record::<SiloMeta>::default();
        rec.lock().value = value(0);
        // Two writes between points 0 and 10: the first's old version (loaded, serialized at
        // 0) is point 0's; the second's old version is no point's.
        s.install(&mut rec.lock(), 100, 5, value(1));
        s.install(&mut rec.lock(), 101, 9, value(2));
        assert_eq!(read_at(&rec, 0), (value(0), 0));
        assert_eq!(rec.lock().meta.older.as_ref().map(|v| v.ser_us), Some(0), "the version at 5 was no point's");
        assert!(rec.lock().meta.older.as_ref().unwrap().older.is_none());
        s.advance(10);
        let point = s.begin_read(0);
        assert_eq!(point, 10);
        s.install(&mut rec.lock(), 102, 13, value(3));
        s.advance(50);
        assert_eq!(read_at(&rec, point), (value(2), 101), "the reader's version stays while it reads");
        s.end_read(0);
        s.advance(50);
        s.install(&mut rec.lock(), 103, 51, value(4));
        assert_eq!(read_at(&rec, 50), (value(3), 102));
        let kept = std::iter::successors(rec.lock().meta.older.as_deref(), |v| v.older.as_deref()).count();
        assert_eq!(kept, 1, "only the latest point's version is kept once no reader holds an older one");
    }

    #[test]
    fn a_reader_that_announces_late_takes_a_newer_point() {
        let s = Snapshots::new(STEP, 1);
        s.advance(21);
        assert_eq!(s.begin_read(0), 20);
        s.end_read(0);
    }
}
