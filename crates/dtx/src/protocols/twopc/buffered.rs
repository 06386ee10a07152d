//! The execution phase of a concurrency control that buffers its writes until commit and keeps
//! what it read (OCC, MaaT, MVCC): the skeleton answers a read from the attempt's own write,
//! buffers its writes (one per key: [`buffer_write`]) and shows it its own writes over the rows
//! it scans; the concurrency control answers from what it read before, or reads what the
//! attempt has not seen yet, its own way.

use super::{buffer_write, durable::Writes, own_view};
use crate::storage::{RowKey, Value};
use crate::txn::{Access, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

/// An attempt whose writes wait in a buffer until commit. Implementing it gives the attempt
/// its [`Access`].
#[allow(async_fn_in_trait)] // Used only through generics on one thread: no `Send` bound wanted.
pub trait BufferedTxn {
    /// The value this attempt read of `key` before, if it did (a concurrency control that
    /// tracks use marks the read used).
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>>;
    /// Read `key`, which this attempt has neither read nor written, here or where it lives.
    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>>;
    /// The writes buffered so far.
    fn writes(&mut self) -> &mut Writes;
    /// The committed rows of a range, wherever it lives, each noted as read.
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>>;
}

impl<T: BufferedTxn> Access for T {
    /// Its own write first, then what it read before.
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        if let Some((_, mine)) = self.writes().iter().find(|(k, _)| *k == key) {
            return Step::Ready(Ok(mine.clone()));
        }
        match self.read_before(key) {
            Some(v) => Step::Ready(Ok(v)),
            None => self.read_new(key),
        }
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        buffer_write(self.writes(), key, value);
        Step::Ready(Ok(()))
    }

    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        Step::Wait(Box::pin(async move {
            let rows = self.scan_stored(s).await?;
            Ok(own_rows(self.writes(), s, rows))
        }))
    }
}

/// The rows of scan `s` as the transaction itself sees them ([`own_view`] of each).
pub fn own_rows(writes: &[(RowKey, Option<Value>)], s: Scan, rows: Vec<(u64, Value)>) -> Vec<(u64, Value)> {
    rows.into_iter().filter_map(|(k, v)| own_view(writes, RowKey::new(s.table, k), v).map(|v| (k, v))).collect()
}

/// Read sets up to this size are searched linearly (cheaper than hashing for the few keys most
/// transactions read); larger ones through an index.
const LINEAR_MAX: usize = 32;

/// An entry of a [`ReadSet`]: what it read of which key.
pub trait ReadOf {
    fn key(&self) -> RowKey;
}

/// An attempt's reads in the order it made them, found by key (OCC's and MaaT's read sets). It
/// reads as a slice of its entries.
pub struct ReadSet<E> {
    entries: Vec<E>,
    /// key -> position in `entries`, kept once the set outgrows a linear search.
    index: FxHashMap<RowKey, usize>,
}

impl<E> Default for ReadSet<E> {
    fn default() -> Self {
        ReadSet { entries: Vec::new(), index: FxHashMap::default() }
    }
}

impl<E: ReadOf> ReadSet<E> {
    /// Where the read of `key` is, if the attempt read it.
    pub fn find(&self, key: RowKey) -> Option<usize> {
        if self.entries.len() <= LINEAR_MAX {
            self.entries.iter().position(|e| e.key() == key)
        } else {
            self.index.get(&key).copied()
        }
    }

    /// Add a read (of a key the attempt has not read before: callers look first).
    pub fn push(&mut self, e: E) {
        self.entries.push(e);
        let n = self.entries.len();
        if n > LINEAR_MAX {
            if self.index.is_empty() {
                self.index = self.entries.iter().enumerate().map(|(i, e)| (e.key(), i)).collect();
            } else {
                self.index.insert(self.entries[n - 1].key(), n - 1);
            }
        }
    }

    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.index.clear();
    }
}

impl<E> std::ops::Deref for ReadSet<E> {
    type Target = [E];
    fn deref(&self) -> &[E] {
        &self.entries
    }
}

impl<E> std::ops::DerefMut for ReadSet<E> {
    fn deref_mut(&mut self) -> &mut [E] {
        &mut self.entries
    }
}
