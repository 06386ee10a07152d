//! One Silo transaction on its worker: execution reads records with their TIDs and buffers its
//! writes; commit locks the write set (no waiting: a record another worker is committing over
//! aborts the attempt), validates the read set, and leaves the TID choice, the log and the
//! install to the worker, which holds the locks meanwhile (Silo's commit protocol, §4.4).

use super::meta::SiloMeta;
use super::snapshot::Snapshots;
use crate::protocols::twopc::buffered::{BufferedTxn, ReadOf, ReadSet};
use crate::protocols::twopc::durable::Writes;
use crate::rt::Worker;
use crate::storage::{Record, RowKey, Storage, Value};
use crate::txn::{Abort, Scan, Step, TxnResult};

pub type Rec = Record<SiloMeta>;

struct ReadEntry<'a> {
    key: RowKey,
    value: Option<Value>,
    tid: u64,
    rec: Option<&'a Rec>,
}

impl ReadOf for ReadEntry<'_> {
    fn key(&self) -> RowKey {
        self.key
    }
}

/// An attempt in its execution phase.
pub struct SiloTxn<'a> {
    store: &'a Storage<SiloMeta>,
    w: &'a Worker,
    /// Names the attempt in the write locks it takes (never 0).
    id: u64,
    reads: ReadSet<ReadEntry<'a>>,
    writes: Writes,
}

/// A transaction whose write set is locked and whose reads validated: the worker stamps it,
/// logs it and installs it ([`Locked::install`]), or lets it go ([`Locked::release`]).
pub struct Locked<'a> {
    id: u64,
    /// The written records, in the order of `writes`.
    recs: Vec<&'a Rec>,
    pub writes: Writes,
    /// The largest TID the transaction read or overwrote: its own must lie above.
    pub floor: u64,
    /// The clock at its serialization point (with `snapshots`; 0 otherwise).
    ser_us: u64,
}

impl<'a> SiloTxn<'a> {
    pub fn new(store: &'a Storage<SiloMeta>, w: &'a Worker, id: u64) -> Self {
        assert_ne!(id, 0, "transaction id 0 means unlocked");
        SiloTxn { store, w, id, reads: ReadSet::default(), writes: Vec::new() }
    }

    fn note_read(&mut self, key: RowKey, rec: Option<&'a Rec>) -> Option<Value> {
        let (value, tid) = rec.map_or((None, 0), |r| {
            let row = r.lock();
            (row.value.clone(), row.meta.tid)
        });
        self.reads.push(ReadEntry { key, value: value.clone(), tid, rec });
        value
    }

    /// Lock the write set and validate the read set (Silo's phases 1 and 2), calling
    /// `serialize` between the two (the serialization point: it returns the clock there). A
    /// failure leaves nothing locked.
    pub fn lock_and_validate(mut self, serialize: impl FnOnce() -> u64) -> TxnResult<Locked<'a>> {
        let writes = std::mem::take(&mut self.writes);
        let recs: Vec<&Rec> = writes.iter().map(|(k, _)| self.store.get_or_create(*k)).collect();
        self.w.charge_ops(recs.len() + self.reads.len());
        let mut floor = 0;
        for (i, rec) in recs.iter().enumerate() {
            let mut row = rec.lock();
            if row.meta.locked_by != 0 && row.meta.locked_by != self.id {
                drop(row);
                release(self.id, &recs[..i]);
                return Err(Abort::WriteLocked);
            }
            row.meta.locked_by = self.id;
            floor = floor.max(row.meta.tid);
        }
        let ser_us = serialize();
        for e in self.reads.iter() {
            let valid = match e.rec.or_else(|| self.store.get(e.key)) {
                Some(rec) => rec.lock().meta.validates(e.tid, self.id),
                None => e.tid == 0,
            };
            if !valid {
                release(self.id, &recs);
                return Err(Abort::ReadValidation);
            }
            floor = floor.max(e.tid);
        }
        Ok(Locked { id: self.id, recs, writes, floor, ser_us })
    }
}

impl<'a> Locked<'a> {
    /// Install every write at TID `tid` and unlock (Silo's phase 3); returns the writes (for
    /// the log).
    /// With `snapshots`, the versions a snapshot may still read are kept.
    pub fn install(self, tid: u64, snapshots: Option<&Snapshots>) -> Writes {
        assert!(tid > self.floor, "TID {tid} at or below one its transaction saw ({})", self.floor);
        for (rec, (_, value)) in self.recs.into_iter().zip(&self.writes) {
            let mut row = rec.lock();
            assert_eq!(row.meta.locked_by, self.id, "installing a record without holding its lock");
            row.meta.locked_by = 0;
            if let Some(s) = snapshots {
                s.install(&mut row, tid, self.ser_us, value.clone());
                continue;
            }
            let old = std::mem::replace(&mut row.value, value.clone());
            row.meta.tid = tid;
            drop(row);
            Value::recycle(old);
        }
        self.writes
    }

    /// Let the locks go without installing.
    pub fn release(self) {
        release(self.id, &self.recs);
    }

    pub fn is_read_only(&self) -> bool {
        self.recs.is_empty()
    }
}

fn release(id: u64, recs: &[&Rec]) {
    for rec in recs {
        let mut row = rec.lock();
        if row.meta.locked_by == id {
            row.meta.locked_by = 0;
        }
    }
}

impl<'a> BufferedTxn for SiloTxn<'a> {
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        self.reads.find(key).map(|i| self.reads[i].value.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.w.charge_ops(1);
        let rec = self.store.get(key);
        Step::Ready(Ok(self.note_read(key, rec)))
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// Each row is read with its TID, as a read is; the gaps between rows are not validated
    /// (Silo validates Masstree's node versions for them: see docs/protocols.md's simplifications).
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        self.w.charge_ops(1);
        let store = self.store;
        let mut rows = Vec::new();
        for (k, rec) in store.table(s.table).range(s.lo, s.hi, s.limit as usize, s.descending) {
            let key = RowKey::new(s.table, k);
            let value = match self.reads.find(key) {
                Some(i) => self.reads[i].value.clone(),
                None => self.note_read(key, Some(rec)),
            };
            if let Some(v) = value {
                rows.push((k, v));
            }
        }
        self.w.charge_ops(rows.len());
        Ok(rows)
    }
}
