//! A node's bounded cache of records it does not own: Sundial's cache of remote reads, and
//! the piece Hackwrench's database-node cache will reuse.
//!
//! The cache is split into banks (a key's bank is a hash of it), each under its own lock, so that
//! workers touching different keys rarely meet; each bank keeps its entries in least-recently-used
//! order and holds at most its share of the byte bound. At the bound, inserting evicts the least
//! recently used entries of that bank until the new one fits; an entry larger than a whole bank is
//! not cached at all. What an entry carries beside its value (`M`: Sundial's lease) is the
//! caller's; the cache only stores, finds, refreshes and evicts.

use super::{RowKey, Value};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// What one entry costs beside its value's bytes: its key, metadata, links and index slot.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;

/// A cached record: its value (`None`: known absent) and the caller's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached<M> {
    pub value: Option<Value>,
    pub meta: M,
}

/// Hits, misses, insertions and evictions since the cache was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
}

const NIL: u32 = u32::MAX;

struct Node<M> {
    key: RowKey,
    entry: Cached<M>,
    bytes: usize,
    /// Towards the most recently used end, and towards the least.
    newer: u32,
    older: u32,
}

/// One bank: a slab of entries linked from most to least recently used, and an index.
struct Bank<M> {
    index: FxHashMap<RowKey, u32>,
    nodes: Vec<Node<M>>,
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
    bytes: usize,
}

impl<M> Bank<M> {
    fn new() -> Self {
        Bank { index: FxHashMap::default(), nodes: Vec::new(), free: Vec::new(), newest: NIL, oldest: NIL, bytes: 0 }
    }

    fn unlink(&mut self, i: u32) {
        let (newer, older) = (self.nodes[i as usize].newer, self.nodes[i as usize].older);
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        self.nodes[i as usize].newer = NIL;
        self.nodes[i as usize].older = self.newest;
        if self.newest != NIL {
            self.nodes[self.newest as usize].newer = i;
        }
        self.newest = i;
        if self.oldest == NIL {
            self.oldest = i;
        }
    }

    fn touch(&mut self, i: u32) {
        if self.newest != i {
            self.unlink(i);
            self.push_newest(i);
        }
    }

    /// Removes entry `i`; its slot is reused by a later insert.
    fn remove_at(&mut self, i: u32) {
        self.unlink(i);
        let n = &mut self.nodes[i as usize];
        self.bytes -= n.bytes;
        n.bytes = 0;
        n.entry.value = None;
        let key = n.key;
        self.index.remove(&key);
        self.free.push(i);
    }

    fn insert(&mut self, key: RowKey, entry: Cached<M>, bytes: usize) {
        let node = Node { key, entry, bytes, newer: NIL, older: NIL };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(key, i);
        self.bytes += bytes;
        self.push_newest(i);
    }

    /// The bank's invariants: the list holds exactly the indexed entries, and the byte count is
    /// their sum.
    fn well_formed(&self) -> bool {
        let (mut n, mut bytes, mut at) = (0, 0, self.newest);
        while at != NIL {
            let node = &self.nodes[at as usize];
            if self.index.get(&node.key) != Some(&at) {
                return false;
            }
            n += 1;
            bytes += node.bytes;
            at = node.older;
        }
        n == self.index.len() && bytes == self.bytes
    }
}

/// A bounded, banked, least-recently-used cache of records.
pub struct RecordCache<M> {
    banks: Box<[Mutex<Bank<M>>]>,
    bank_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
}

impl<M: Clone> RecordCache<M> {
    /// A cache of at most `capacity_bytes` (values and [`ENTRY_OVERHEAD_BYTES`] per entry) in
    /// `banks` banks (at least one), each holding at most its share.
    pub fn new(capacity_bytes: usize, banks: usize) -> Self {
        let banks = banks.max(1);
        RecordCache {
            banks: (0..banks).map(|_| Mutex::new(Bank::new())).collect(),
            bank_bytes: capacity_bytes / banks,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn bank(&self, key: RowKey) -> &Mutex<Bank<M>> {
        let mut h = rustc_hash::FxHasher::default();
        key.hash(&mut h);
        // The high bits of Fx's product are the well-mixed ones.
        let i = (h.finish() >> 32) as usize % self.banks.len();
        &self.banks[i]
    }

    fn bytes_of(entry: &Cached<M>) -> usize {
        ENTRY_OVERHEAD_BYTES + entry.value.as_ref().map_or(0, |v| v.len())
    }

    /// Drop every entry (what they were read from was rolled back).
    pub fn clear(&self) {
        for bank in self.banks.iter() {
            *bank.lock() = Bank::new();
        }
    }

    /// The cached entry of `key`, made the most recently used of its bank.
    pub fn get(&self, key: RowKey) -> Option<Cached<M>> {
        let mut bank = self.bank(key).lock();
        match bank.index.get(&key).copied() {
            Some(i) => {
                bank.touch(i);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(bank.nodes[i as usize].entry.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Caches `entry` for `key` (replacing what was there) as the most recently used, evicting
    /// the least recently used entries of its bank until it fits. An entry larger than a bank
    /// is not cached, and an older entry of the key is dropped.
    pub fn insert(&self, key: RowKey, entry: Cached<M>) {
        let bytes = Self::bytes_of(&entry);
        let mut bank = self.bank(key).lock();
        if let Some(i) = bank.index.get(&key).copied() {
            bank.remove_at(i);
        }
        if bytes > self.bank_bytes {
            return;
        }
        while bank.bytes + bytes > self.bank_bytes {
            let oldest = bank.oldest;
            debug_assert!(oldest != NIL, "a bank over its bound has entries");
            bank.remove_at(oldest);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        bank.insert(key, entry, bytes);
        self.inserts.fetch_add(1, Ordering::Relaxed);
        debug_assert!(bank.bytes <= self.bank_bytes && bank.well_formed());
    }

    /// Changes the entry of `key` in place if it is cached (not its place in the LRU order);
    /// returns whether it was. A change of the value's size may evict others.
    pub fn update(&self, key: RowKey, f: impl FnOnce(&mut Cached<M>)) -> bool {
        let mut bank = self.bank(key).lock();
        let Some(i) = bank.index.get(&key).copied() else { return false };
        let mut entry = bank.nodes[i as usize].entry.clone();
        f(&mut entry);
        if Self::bytes_of(&entry) == bank.nodes[i as usize].bytes {
            bank.nodes[i as usize].entry = entry;
            return true;
        }
        drop(bank);
        self.insert(key, entry);
        true
    }

    /// Drops the entry of `key`, if any.
    pub fn remove(&self, key: RowKey) {
        let mut bank = self.bank(key).lock();
        if let Some(i) = bank.index.get(&key).copied() {
            bank.remove_at(i);
        }
    }

    /// Entries and bytes held, over every bank.
    pub fn usage(&self) -> (usize, usize) {
        self.banks.iter().fold((0, 0), |(n, b), bank| {
            let bank = bank.lock();
            (n + bank.index.len(), b + bank.bytes)
        })
    }

    pub fn capacity_bytes(&self) -> usize {
        self.bank_bytes * self.banks.len()
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> RowKey {
        RowKey::new(0, k)
    }

    fn entry(bytes: usize, meta: u32) -> Cached<u32> {
        Cached { value: Some(Value::copy_from(&vec![7; bytes])), meta }
    }

    #[test]
    fn evicts_the_least_recently_used_at_the_bound() {
        // One bank of three 100-byte entries (164 bytes each with the overhead).
        let c = RecordCache::new(3 * 164, 1);
        for k in 0..3 {
            c.insert(key(k), entry(100, k as u32));
        }
        assert_eq!(c.usage(), (3, 492));
        // Reading 0 makes 1 the least recently used.
        assert_eq!(c.get(key(0)).unwrap().meta, 0);
        c.insert(key(3), entry(100, 3));
        assert!(c.get(key(1)).is_none(), "the least recently used went");
        for k in [0, 2, 3] {
            assert!(c.get(key(k)).is_some(), "{k} stays");
        }
        let s = c.stats();
        assert_eq!((s.evictions, s.inserts, s.misses), (1, 4, 1));
    }

    #[test]
    fn a_bigger_entry_evicts_several_and_a_too_big_one_is_not_cached() {
        let c = RecordCache::new(1000, 1);
        for k in 0..5 {
            c.insert(key(k), entry(100, 0));
        }
        c.insert(key(9), entry(600, 0));
        let (n, bytes) = c.usage();
        assert!(bytes <= 1000 && c.get(key(9)).is_some(), "{n} entries, {bytes} bytes");
        assert!(c.get(key(0)).is_none() && c.get(key(1)).is_none());
        c.insert(key(9), entry(2000, 0));
        assert!(c.get(key(9)).is_none(), "larger than the bank: not cached, and the old copy is gone");
    }

    #[test]
    fn update_and_remove() {
        let c = RecordCache::new(10_000, 4);
        c.insert(key(1), entry(10, 1));
        assert!(c.update(key(1), |e| e.meta = 5));
        assert_eq!(c.get(key(1)).unwrap().meta, 5);
        assert!(c.update(key(1), |e| e.value = Some(Value::copy_from(&[1; 50]))));
        assert_eq!(c.usage().1, 64 + 50);
        assert!(!c.update(key(2), |e| e.meta = 9), "absent keys are not inserted");
        c.remove(key(1));
        assert_eq!(c.usage(), (0, 0));
        // A known-absent record is cached too.
        c.insert(key(3), Cached { value: None, meta: 0 });
        assert_eq!(c.get(key(3)).unwrap().value, None);
    }

    #[test]
    fn banks_share_the_bound_and_each_keeps_its_own() {
        let c = RecordCache::new(16 * 1024, 8);
        for k in 0..10_000 {
            c.insert(key(k), entry(36, 0));
            if k % 1000 == 0 {
                assert!(c.banks.iter().all(|b| b.lock().well_formed()));
            }
        }
        let (n, bytes) = c.usage();
        assert!(bytes <= c.capacity_bytes(), "{bytes}");
        // Every bank is (nearly) full: the hash spreads the keys.
        assert!(n >= 8 * (2048 / 100 - 1), "{n} entries");
        assert!(c.banks.iter().all(|b| b.lock().bytes > 2048 - 200));
    }
}
