//! In-memory storage shared by the workers of one node: tables of records, a sharded hash index
//! on every table and an ordered index on the tables that need range scans.
//!
//! A record is a value plus the protocol's own metadata `M` (a lock word, a TID, leases...), both
//! behind one short per-record mutex. The mutex is held only while a protocol inspects or changes
//! the record, never across an `await`, so waiting (for a lock, a reply) is always done by a task
//! that gave the mutex back. Records are never removed from the index: a delete leaves a
//! tombstone (`value == None`) so that concurrent readers and validators see a version change.

pub mod cache;

use parking_lot::{Mutex, MutexGuard, RwLock};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

pub type TableId = u16;

/// An immutable record value. Cloning shares it; the reference count sits in the same
/// allocation as the bytes, so prefetching the value brings its count in too.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Value(std::sync::Arc<[u8]>);

impl Value {
    pub fn copy_from(b: &[u8]) -> Self {
        Value(b.into())
    }

    /// Start loading the value's bytes (its first [`Value::PREFETCH_MAX`] bytes), every cache
    /// line of them: a procedure that copies a 319-byte stock row to patch it otherwise stalls
    /// on each of its five lines in turn.
    #[inline]
    pub fn prefetch(&self) {
        let p = self.0.as_ptr();
        for off in (0..self.0.len().min(Self::PREFETCH_MAX)).step_by(64) {
            prefetch_line(p.wrapping_add(off));
        }
    }

    /// Bytes of a value that [`Value::prefetch`] loads.
    const PREFETCH_MAX: usize = 512;

    /// A copy of `old`, zero padded to `len` bytes if it is shorter, patched by `f`: one copy,
    /// into a spare buffer of that length if this thread has one ([`Value::recycle`]), else into
    /// one new allocation (no staging buffer).
    #[inline]
    pub fn patched(old: &[u8], len: usize, f: impl FnOnce(&mut [u8])) -> Value {
        static ZEROS: [u8; 1024] = [0; 1024];
        use std::sync::Arc;
        let len = len.max(old.len());
        let mut bytes: Arc<[u8]> = match spare::take(len) {
            Some(mut b) => {
                let buf = Arc::get_mut(&mut b).expect("a spare buffer has no other owner");
                buf[..old.len()].copy_from_slice(old);
                buf[old.len()..].fill(0);
                b
            }
            None if len == old.len() => old.into(),
            None if len <= ZEROS.len() => {
                let mut b: Arc<[u8]> = ZEROS[..len].into();
                Arc::get_mut(&mut b).expect("a new value has no other owner")[..old.len()].copy_from_slice(old);
                b
            }
            None => {
                let mut v = vec![0; len];
                v[..old.len()].copy_from_slice(old);
                v.into()
            }
        };
        f(Arc::get_mut(&mut bytes).expect("a new value has no other owner"));
        Value(bytes)
    }

    /// A value that was just replaced in its record: if nobody else holds it any more, keep its
    /// buffer for this thread's next [`Value::patched`] of the same length, so that updating a
    /// row in place (a TPC-C stock, district or year-to-date row) costs neither `malloc` nor
    /// `free` (nor, with several workers, a `free` into another thread's arena, which takes
    /// that arena's lock). Call it after releasing the record's lock.
    #[inline]
    pub fn recycle(old: Option<Value>) {
        if let Some(Value(mut b)) = old {
            if std::sync::Arc::get_mut(&mut b).is_some() {
                spare::put(b);
            }
        }
    }
}

/// Spare value buffers of this thread, by length (see [`Value::recycle`]). Bounded: a few
/// lengths, and bytes in all; what does not fit is freed. The byte bound is what a watermark's
/// forgetting gives back at once: Primo keeps every replaced value for an interval (20 ms) in
/// case an agreement rolls it back, then hands thousands back together; with 64 buffers a
/// length, all but 64 were freed and as many allocated again (11% of a one-node Primo run).
mod spare {
    use std::cell::RefCell;
    use std::sync::Arc;

    /// Longest buffer kept, distinct lengths kept, bytes kept in all (per thread).
    const MAX_LEN: usize = 1024;
    const LENGTHS: usize = 16;
    const MAX_BYTES: usize = 4 << 20;

    /// Spare buffers of one length.
    type SameLength = (usize, Vec<Arc<[u8]>>);

    struct Spare {
        by_length: Vec<SameLength>,
        bytes: usize,
    }

    thread_local! {
        static SPARE: RefCell<Spare> = const { RefCell::new(Spare { by_length: Vec::new(), bytes: 0 }) };
    }

    #[inline]
    pub(super) fn take(len: usize) -> Option<Arc<[u8]>> {
        if len > MAX_LEN {
            return None;
        }
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            let b = s.by_length.iter_mut().find(|(l, _)| *l == len)?.1.pop()?;
            s.bytes -= len;
            Some(b)
        })
    }

    #[inline]
    pub(super) fn put(b: Arc<[u8]>) {
        let len = b.len();
        if len > MAX_LEN || len == 0 {
            return;
        }
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            if s.bytes + len > MAX_BYTES {
                return;
            }
            match s.by_length.iter().position(|(l, _)| *l == len) {
                Some(i) => s.by_length[i].1.push(b),
                None if s.by_length.len() < LENGTHS => s.by_length.push((len, vec![b])),
                None => return,
            }
            s.bytes += len;
        });
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value(v.into())
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Value({} bytes)", self.0.len())
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
                Ok(Value::copy_from(v))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Value, E> {
                Ok(Value::from(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = a.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(Value::from(out))
            }
        }
        d.deserialize_bytes(V)
    }
}

/// Ask the CPU to start loading the cache line at `p`: a hint that never faults.
#[inline]
pub fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, even on an invalid address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
}

/// A key in a table: tables use `u64` keys; workloads pack composite keys so order is preserved.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct RowKey {
    pub table: TableId,
    pub key: u64,
}

impl RowKey {
    pub const fn new(table: TableId, key: u64) -> Self {
        RowKey { table, key }
    }
}

/// What a workload declares about one of its tables, on one node.
#[derive(Debug, Clone, Default)]
pub struct TableDef {
    pub name: &'static str,
    /// Keep an ordered index (for range scans) as well as the hash index.
    pub ordered: bool,
    /// Rows expected per node, to size the hash index up front (rehashing costs ~40% at load).
    pub expected_rows: usize,
    /// Key ranges this node holds densely (every key present, e.g. YCSB's per-partition range):
    /// their records live in one array indexed by key, with no hash probe and no index lock.
    /// Only for tables without an ordered index.
    pub dense: Vec<std::ops::Range<u64>>,
    /// How an ordered table indexes its keys.
    pub layout: Layout,
}

/// The index of an ordered table. A B-tree costs a descent of cache misses per insert into a
/// large table; the others find a key with one hash probe when the keys' shape allows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    #[default]
    Tree,
    /// Keys arrive in dense ascending runs (TPC-C's order ids, which have no gaps): records live
    /// in chunks of [`CHUNK_KEYS`] consecutive keys, found through a hash of `key / CHUNK_KEYS`.
    /// Wasteful for sparse keys.
    Chunks,
    /// Keys fall into many small groups of equal `key >> bits` (a customer's orders), each a
    /// sorted vector found through a hash of the group; a new key is usually its group's largest.
    Groups(u32),
}

pub struct Row<M> {
    /// The committed value; `None` = absent (never written, or deleted).
    pub value: Option<Value>,
    pub meta: M,
}

/// Aligned to a cache line so that two records never share one (workers on different cores
/// lock neighbouring records without false sharing).
#[repr(align(64))]
pub struct Record<M> {
    row: Mutex<Row<M>>,
}

impl<M: Default> Default for Record<M> {
    fn default() -> Self {
        Record { row: Mutex::new(Row { value: None, meta: M::default() }) }
    }
}

impl<M> Record<M> {
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Row<M>> {
        self.row.lock()
    }

    /// Ask the CPU to start loading this record's cache lines (its first two: a protocol whose
    /// metadata spills past the first line, as Sundial's lease and lock do, needs the second one
    /// too). A transaction that knows its keys issues these for all of them first, so their cache
    /// misses overlap instead of queueing.
    #[inline]
    pub fn prefetch(&self) {
        prefetch_line(self);
        if std::mem::size_of::<Self>() > 64 {
            prefetch_line((self as *const Self as *const u8).wrapping_add(64));
        }
    }

    /// Second pass of a prefetch: once the record's line is (nearly) here, start loading its value.
    #[inline]
    pub fn prefetch_value(&self) {
        if let Some(v) = &self.lock().value {
            v.prefetch();
        }
    }
}

const SHARDS: usize = 64;

/// Records per arena chunk: 16 KiB of records, allocated at once instead of one by one.
const ARENA_CHUNK: usize = 256;

/// Where a table's records live when they are not in a dense range: chunks that are never freed
/// or moved while the table lives, so a pointer to a record stays valid.
struct Arena<M> {
    chunks: Vec<Box<[Record<M>]>>,
    used_in_last: usize,
}

impl<M: Default> Arena<M> {
    fn new() -> Self {
        Arena { chunks: Vec::new(), used_in_last: ARENA_CHUNK }
    }

    fn alloc(&mut self) -> NonNull<Record<M>> {
        if self.used_in_last == ARENA_CHUNK {
            self.chunks.push((0..ARENA_CHUNK).map(|_| Record::default()).collect());
            self.used_in_last = 0;
        }
        let chunk = self.chunks.last_mut().expect("a chunk was just pushed");
        let rec = NonNull::from(&mut chunk[self.used_in_last]);
        self.used_in_last += 1;
        rec
    }
}

/// A pointer to a record owned by its table's arena.
struct RecPtr<M>(NonNull<Record<M>>);

// SAFETY: a RecPtr is only dereferenced as `&Record<M>`, which is Sync when M is Send
// (the row sits behind a mutex); the record it points to is owned by the same table.
unsafe impl<M: Send> Send for RecPtr<M> {}
unsafe impl<M: Send> Sync for RecPtr<M> {}

/// One shard of a hash-indexed table: its index and the arena its records come from.
struct HashShard<M> {
    map: FxHashMap<u64, RecPtr<M>>,
    arena: Arena<M>,
}

/// An ordered table: one B-tree. Its keys are typically inserted in ascending runs (order ids),
/// so the path to the newest keys stays in cache, where a hash index would miss on every insert.
struct OrderedIndex<M> {
    map: BTreeMap<u64, RecPtr<M>>,
    arena: Arena<M>,
}

/// Keys per chunk of a chunked table (a power of two): 16 KiB of records.
pub const CHUNK_KEYS: u64 = 256;
const CHUNK_WORDS: usize = CHUNK_KEYS as usize / 64;

/// `CHUNK_KEYS` consecutive keys' records, allocated together; a key has a record once its
/// bit in `created` is set (until then it is not in the table, as a B-tree would not hold it).
struct Chunk<M> {
    recs: Box<[Record<M>]>,
    created: [AtomicU64; CHUNK_WORDS],
}

impl<M: Default> Chunk<M> {
    fn new() -> Box<Self> {
        Box::new(Chunk {
            recs: (0..CHUNK_KEYS).map(|_| Record::default()).collect(),
            created: std::array::from_fn(|_| AtomicU64::new(0)),
        })
    }
}

impl<M> Chunk<M> {
    #[inline]
    fn created(&self, slot: usize) -> bool {
        self.created[slot / 64].load(Ordering::Acquire) & (1 << (slot % 64)) != 0
    }
}

/// Visit the chunk or group numbers `nos` in key order (or its reverse) until `visit` says the
/// scan is full.
fn visit_in_order<'a>(nos: impl DoubleEndedIterator<Item = &'a u64>, descending: bool, visit: impl FnMut(u64) -> bool) {
    let mut nos = nos.copied();
    // `all` stops at the first `false`: the scan is full.
    if descending {
        let _ = nos.rev().all(visit);
    } else {
        let _ = nos.all(visit);
    }
}

/// A chunked ordered table: chunks by number (`key / CHUNK_KEYS`) for point access, in
/// [`SHARDS`] shards by chunk number (`shard_of`), and the chunk numbers in order for range scans (written only when a chunk is
/// created). A chunk is never freed or moved while the table lives. Every New-Order inserts into
/// these tables from every worker: with one lock per table, the workers' cores passed its line
/// back and forth on each access and parked on each other's inserts; shards keep two workers on
/// different districts (or, for groups, customers) on different lock words.
struct ChunkIndex<M> {
    shards: Box<[RwLock<ChunkShard<M>>]>,
    order: RwLock<BTreeSet<u64>>,
}

/// The chunks of one shard, by number.
type ChunkShard<M> = FxHashMap<u64, Box<Chunk<M>>>;

impl<M: Default> ChunkIndex<M> {
    fn new() -> Self {
        ChunkIndex {
            shards: (0..SHARDS).map(|_| RwLock::new(FxHashMap::default())).collect(),
            order: RwLock::new(BTreeSet::new()),
        }
    }

    /// The chunk numbered `no`, if it exists.
    #[inline]
    fn chunk(&self, no: u64) -> Option<NonNull<Chunk<M>>> {
        self.shards[shard_of(no)].read().get(&no).map(|c| NonNull::from(&**c))
    }

    /// The chunk numbered `no`, created if need be.
    fn chunk_or_create(&self, no: u64) -> NonNull<Chunk<M>> {
        if let Some(c) = self.chunk(no) {
            return c;
        }
        // Built before the shard's write lock is taken: allocating and initializing a chunk's
        // records (page faults included) under it parked every reader of the shard's other
        // chunks. If another thread creates the chunk meanwhile, this one is dropped.
        let fresh = Chunk::new();
        let mut shard = self.shards[shard_of(no)].write();
        let chunk = shard.entry(no).or_insert_with(|| {
            // Lock order: a shard, then `order`.
            self.order.write().insert(no);
            fresh
        });
        NonNull::from(&**chunk)
    }
}

/// A grouped ordered table: each group's keys sorted, the groups by number for point access
/// (sharded by group number, each shard with the arena its records come from), and the group
/// numbers in order for scans over several groups (written only when a group is created).
struct GroupIndex<M> {
    bits: u32,
    shards: Box<[RwLock<GroupShard<M>>]>,
    order: RwLock<BTreeSet<u64>>,
}

struct GroupShard<M> {
    groups: FxHashMap<u64, Vec<(u64, RecPtr<M>)>>,
    arena: Arena<M>,
}

impl<M: Default> GroupIndex<M> {
    fn new(bits: u32) -> Self {
        let shard = || RwLock::new(GroupShard { groups: FxHashMap::default(), arena: Arena::new() });
        GroupIndex { bits, shards: (0..SHARDS).map(|_| shard()).collect(), order: RwLock::new(BTreeSet::new()) }
    }

    #[inline]
    fn shard(&self, group: u64) -> &RwLock<GroupShard<M>> {
        &self.shards[shard_of(group)]
    }

    #[inline]
    fn find(&self, key: u64) -> Option<NonNull<Record<M>>> {
        let shard = self.shard(key >> self.bits).read();
        let g = shard.groups.get(&(key >> self.bits))?;
        g.binary_search_by_key(&key, |e| e.0).ok().map(|i| g[i].1 .0)
    }

    fn get_or_create(&self, key: u64) -> NonNull<Record<M>> {
        if let Some(p) = self.find(key) {
            return p;
        }
        let group = key >> self.bits;
        let mut shard = self.shard(group).write();
        let GroupShard { groups, arena } = &mut *shard;
        let g = groups.entry(group).or_insert_with(|| {
            // Lock order: a shard, then `order`.
            self.order.write().insert(group);
            Vec::new()
        });
        // Usually past the group's last key; another thread may have created it.
        let at = g.partition_point(|e| e.0 < key);
        match g.get(at) {
            Some(e) if e.0 == key => e.1 .0,
            _ => {
                let p = arena.alloc();
                g.insert(at, (key, RecPtr(p)));
                p
            }
        }
    }
}

enum Index<M> {
    Hash(Box<[RwLock<HashShard<M>>]>),
    Ordered(RwLock<OrderedIndex<M>>),
    Chunked(ChunkIndex<M>),
    Grouped(GroupIndex<M>),
}

/// Records are allocated from arenas and never removed or moved while the table lives, so a
/// reference to a record stays valid for as long as the table is borrowed, after the index lock
/// is released. That lets a read touch the index lock and the record, and nothing else: no
/// reference count.
pub struct Table<M> {
    pub def: TableDef,
    dense: Vec<(u64, Box<[Record<M>]>)>,
    index: Index<M>,
}

#[inline]
fn shard_of(key: u64) -> usize {
    // Multiplicative hash so that sequential keys spread across shards.
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS
}

impl<M: Default + Send> Table<M> {
    fn new(def: TableDef) -> Self {
        assert!(def.dense.is_empty() || !def.ordered, "table {}: dense ranges need an unordered table", def.name);
        assert!(def.ordered || def.layout == Layout::Tree, "table {}: only ordered tables have a layout", def.name);
        let dense = def
            .dense
            .iter()
            .map(|r| (r.start, (r.start..r.end).map(|_| Record::default()).collect::<Box<[_]>>()))
            .collect();
        let dense_rows: usize = def.dense.iter().map(|r| (r.end - r.start) as usize).sum();
        let index = if def.ordered && def.layout == Layout::Chunks {
            Index::Chunked(ChunkIndex::new())
        } else if let (true, Layout::Groups(bits)) = (def.ordered, def.layout) {
            Index::Grouped(GroupIndex::new(bits))
        } else if def.ordered {
            Index::Ordered(RwLock::new(OrderedIndex { map: BTreeMap::new(), arena: Arena::new() }))
        } else {
            let per_shard = def.expected_rows.saturating_sub(dense_rows) / SHARDS + 1;
            let shard = || {
                let map = FxHashMap::with_capacity_and_hasher(per_shard, Default::default());
                RwLock::new(HashShard { map, arena: Arena::new() })
            };
            Index::Hash((0..SHARDS).map(|_| shard()).collect())
        };
        Table { def, dense, index }
    }

    #[inline]
    fn dense(&self, key: u64) -> Option<&Record<M>> {
        self.dense.iter().find_map(|(lo, recs)| recs.get(key.wrapping_sub(*lo) as usize))
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<&Record<M>> {
        if let Some(r) = self.dense(key) {
            return Some(r);
        }
        let ptr = match &self.index {
            Index::Hash(shards) => shards[shard_of(key)].read().map.get(&key)?.0,
            Index::Ordered(ord) => ord.read().map.get(&key)?.0,
            Index::Chunked(ch) => {
                let slot = (key % CHUNK_KEYS) as usize;
                // SAFETY: chunks are never freed or moved while the table lives.
                let chunk: &Chunk<M> = unsafe { ch.chunk(key / CHUNK_KEYS)?.as_ref() };
                if !chunk.created(slot) {
                    return None;
                }
                NonNull::from(&chunk.recs[slot])
            }
            Index::Grouped(gr) => gr.find(key)?,
        };
        // SAFETY: arena records and chunks are never freed or moved while `self` lives (see the
        // type's doc).
        Some(unsafe { ptr.as_ref() })
    }

    /// The record for `key`, creating an absent one if there is none (inserts lock it first).
    pub fn get_or_create(&self, key: u64) -> &Record<M> {
        if let Some(r) = self.dense(key) {
            return r;
        }
        let ptr = match &self.index {
            Index::Hash(shards) => {
                if let Some(r) = shards[shard_of(key)].read().map.get(&key) {
                    // SAFETY: as in `get`.
                    return unsafe { r.0.as_ref() };
                }
                let mut shard = shards[shard_of(key)].write();
                let HashShard { map, arena } = &mut *shard;
                map.entry(key).or_insert_with(|| RecPtr(arena.alloc())).0
            }
            Index::Ordered(ord) => {
                // One descent of the tree whether the key exists or not (most callers insert).
                let mut ord = ord.write();
                let OrderedIndex { map, arena } = &mut *ord;
                map.entry(key).or_insert_with(|| RecPtr(arena.alloc())).0
            }
            Index::Chunked(ch) => {
                let slot = (key % CHUNK_KEYS) as usize;
                // SAFETY: chunks are never freed or moved while the table lives.
                let chunk: &Chunk<M> = unsafe { ch.chunk_or_create(key / CHUNK_KEYS).as_ref() };
                // Test before setting: the chunk's first line is shared by every worker inserting
                // into it, and most calls find the key created already.
                if !chunk.created(slot) {
                    chunk.created[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
                }
                NonNull::from(&chunk.recs[slot])
            }
            Index::Grouped(gr) => gr.get_or_create(key),
        };
        // SAFETY: as in `get`.
        unsafe { ptr.as_ref() }
    }

    /// Load a committed row (population before a run).
    pub fn load(&self, key: u64, value: Value) {
        let rec = self.get_or_create(key);
        rec.lock().value = Some(value);
    }

    /// Records with keys in `[lo, hi]`, ascending (or descending), at most `limit`.
    /// Absent records (tombstones, uncommitted inserts) are included: the protocol decides.
    pub fn range(&self, lo: u64, hi: u64, limit: usize, descending: bool) -> Vec<(u64, &Record<M>)> {
        if lo > hi {
            return Vec::new();
        }
        if let Index::Chunked(ch) = &self.index {
            return self.chunk_range(ch, lo, hi, limit, descending);
        }
        if let Index::Grouped(gr) = &self.index {
            return self.group_range(gr, lo, hi, limit, descending);
        }
        let Index::Ordered(ord) = &self.index else {
            return Vec::new();
        };
        let ord = ord.read();
        let it = ord.map.range((Bound::Included(lo), Bound::Included(hi)));
        // SAFETY: as in `get`.
        let pick = |(k, r): (&u64, &RecPtr<M>)| (*k, unsafe { r.0.as_ref() });
        if descending {
            it.rev().take(limit).map(pick).collect()
        } else {
            it.take(limit).map(pick).collect()
        }
    }

    /// `range` over a chunked index: the records live as long as the table, not its locks.
    fn chunk_range(
        &self,
        ch: &ChunkIndex<M>,
        lo: u64,
        hi: u64,
        limit: usize,
        descending: bool,
    ) -> Vec<(u64, &Record<M>)> {
        let mut out = Vec::new();
        let visit = |no: u64| {
            // SAFETY: chunks are never freed or moved while the table lives; `order` names only
            // chunks that exist.
            let chunk: &Chunk<M> = unsafe { ch.chunk(no).expect("an ordered chunk exists").as_ref() };
            let first = no * CHUNK_KEYS;
            let (a, b) = (lo.max(first) - first, hi.min(first + CHUNK_KEYS - 1) - first);
            let mut take = |slot: u64| {
                if out.len() >= limit {
                    return false;
                }
                if chunk.created(slot as usize) {
                    // SAFETY: chunks are never freed or moved while the table lives.
                    let rec: &Record<M> = unsafe { NonNull::from(&chunk.recs[slot as usize]).as_ref() };
                    out.push((first + slot, rec));
                }
                true
            };
            if descending {
                (a..=b).rev().all(&mut take)
            } else {
                (a..=b).all(&mut take)
            }
        };
        let nos: Vec<u64> = ch.order.read().range(lo / CHUNK_KEYS..=hi / CHUNK_KEYS).copied().collect();
        visit_in_order(nos.iter(), descending, visit);
        out
    }

    /// `range` over a grouped index.
    fn group_range(
        &self,
        gr: &GroupIndex<M>,
        lo: u64,
        hi: u64,
        limit: usize,
        descending: bool,
    ) -> Vec<(u64, &Record<M>)> {
        let mut out = Vec::new();
        let mut visit = |no: u64| {
            let shard = gr.shard(no).read();
            let Some(g) = shard.groups.get(&no) else { return true };
            let (a, b) = (g.partition_point(|e| e.0 < lo), g.partition_point(|e| e.0 <= hi));
            // SAFETY: arena records are never freed or moved while the table lives.
            let pick = |e: &(u64, RecPtr<M>)| (e.0, unsafe { e.1 .0.as_ref() });
            let room = limit - out.len();
            if descending {
                out.extend(g[a..b].iter().rev().take(room).map(pick));
            } else {
                out.extend(g[a..b].iter().take(room).map(pick));
            }
            out.len() < limit
        };
        let (first, last) = (lo >> gr.bits, hi >> gr.bits);
        if first == last {
            visit(first);
        } else {
            let nos: Vec<u64> = gr.order.read().range(first..=last).copied().collect();
            visit_in_order(nos.iter(), descending, visit);
        }
        out
    }

    /// Records that hold a value.
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.for_each_present(|_, _| n += 1);
        n
    }

    /// Visit every record that holds a value, with its key, in no particular order.
    pub fn for_each_present(&self, mut f: impl FnMut(u64, &Value)) {
        let mut visit = |key: u64, rec: &Record<M>| {
            if let Some(v) = &rec.lock().value {
                f(key, v);
            }
        };
        for (start, recs) in &self.dense {
            recs.iter().enumerate().for_each(|(i, r)| visit(start + i as u64, r));
        }
        // SAFETY (every `as_ref` below): as in `get`.
        match &self.index {
            Index::Hash(shards) => {
                for shard in shards.iter() {
                    shard.read().map.iter().for_each(|(k, r)| visit(*k, unsafe { r.0.as_ref() }));
                }
            }
            Index::Ordered(ord) => ord.read().map.iter().for_each(|(k, r)| visit(*k, unsafe { r.0.as_ref() })),
            Index::Chunked(ch) => {
                for shard in ch.shards.iter() {
                    for (no, c) in shard.read().iter() {
                        (0..CHUNK_KEYS).filter(|&s| c.created(s as usize)).for_each(|s| {
                            visit(no * CHUNK_KEYS + s, &c.recs[s as usize]);
                        });
                    }
                }
            }
            Index::Grouped(gr) => {
                for shard in gr.shards.iter() {
                    for g in shard.read().groups.values() {
                        g.iter().for_each(|(k, r)| visit(*k, unsafe { r.0.as_ref() }));
                    }
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// All tables of one node.
pub struct Storage<M> {
    tables: Vec<Table<M>>,
}

impl<M: Default + Send> Storage<M> {
    pub fn new(defs: &[TableDef]) -> Self {
        Storage { tables: defs.iter().cloned().map(Table::new).collect() }
    }

    #[inline]
    pub fn table(&self, t: TableId) -> &Table<M> {
        &self.tables[t as usize]
    }

    pub fn tables(&self) -> usize {
        self.tables.len()
    }

    #[inline]
    pub fn get(&self, k: RowKey) -> Option<&Record<M>> {
        self.table(k.table).get(k.key)
    }

    pub fn get_or_create(&self, k: RowKey) -> &Record<M> {
        self.table(k.table).get_or_create(k.key)
    }

    pub fn load(&self, k: RowKey, v: Value) {
        self.table(k.table).load(k.key, v)
    }

    /// A digest of the committed rows of each group `group_of` puts them in (a partition): two
    /// copies that hold the same rows, in whatever order they were written, have the same
    /// digest. For checks at the end of a run, not for the hot path: it locks every record.
    pub fn digests_by(&self, group_of: impl Fn(RowKey) -> u32) -> std::collections::BTreeMap<u32, RowsDigest> {
        use std::hash::{Hash, Hasher};
        let mut out = std::collections::BTreeMap::<u32, RowsDigest>::new();
        for (t, table) in self.tables.iter().enumerate() {
            table.for_each_present(|key, value| {
                let row = RowKey { table: t as TableId, key };
                // SipHash with fixed keys: the same row hashes alike in every process.
                let mut h = std::hash::DefaultHasher::new();
                (t, key, &value[..]).hash(&mut h);
                let d = out.entry(group_of(row)).or_default();
                d.rows += 1;
                d.sum = d.sum.wrapping_add(h.finish());
            });
        }
        out
    }
}

/// What [`Storage::digests_by`] gives a group: its row count and a sum of its rows' hashes
/// (order-independent, so hash maps may be visited in any order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowsDigest {
    pub rows: u64,
    pub sum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs() -> Vec<TableDef> {
        vec![
            TableDef {
                name: "a",
                ordered: false,
                expected_rows: 10,
                dense: std::iter::once(1_000_000..1_000_100).collect(),
                layout: Layout::Tree,
            },
            TableDef { name: "b", ordered: true, expected_rows: 10, dense: vec![], layout: Layout::Tree },
            TableDef { name: "c", ordered: true, expected_rows: 10, dense: vec![], layout: Layout::Chunks },
            TableDef { name: "d", ordered: true, expected_rows: 10, dense: vec![], layout: Layout::Groups(8) },
        ]
    }

    #[test]
    fn a_recycled_buffer_is_reused_only_when_unshared_and_comes_back_clean() {
        let v = Value::patched(&[], 40, |b| b.fill(7));
        let shared = v.clone();
        Value::recycle(Some(v));
        // Still held elsewhere: not kept, so later patches cannot overwrite what `shared` sees.
        for _ in 0..3 {
            let _ = Value::patched(&[1, 2], 40, |b| b.fill(1));
        }
        assert!(shared.iter().all(|&b| b == 7));
        let v = Value::patched(&[9; 50], 10, |_| {});
        assert_eq!(v.len(), 50, "never shorter than the old value");
        let addr = shared.as_ptr();
        Value::recycle(Some(shared));
        let y = Value::patched(&[3; 4], 40, |b| b[39] = 1);
        assert_eq!(y.as_ptr(), addr, "an unshared buffer of the same length is reused");
        assert_eq!(&y[..5], &[3, 3, 3, 3, 0], "padding past the old bytes is zeroed");
        assert_eq!(y[39], 1);
        assert!(y[5..39].iter().all(|&b| b == 0));
    }

    #[test]
    fn load_get_and_scan() {
        let s: Storage<u64> = Storage::new(&defs());
        for k in 0..100u64 {
            s.load(RowKey::new(1, k * 2), Value::from(k.to_le_bytes().to_vec()));
        }
        assert!(s.get(RowKey::new(0, 4)).is_none());
        let r = s.get(RowKey::new(1, 4)).unwrap();
        assert_eq!(r.lock().value.as_ref().unwrap()[0], 2);
        let asc: Vec<u64> = s.table(1).range(10, 20, 100, false).iter().map(|x| x.0).collect();
        assert_eq!(asc, vec![10, 12, 14, 16, 18, 20]);
        let desc: Vec<u64> = s.table(1).range(10, 20, 2, true).iter().map(|x| x.0).collect();
        assert_eq!(desc, vec![20, 18]);
        assert_eq!(s.table(1).len(), 100);
        // Dense range: every key has a record, absent until loaded.
        assert!(s.get(RowKey::new(0, 1_000_050)).unwrap().lock().value.is_none());
        s.load(RowKey::new(0, 1_000_050), Value::copy_from(b"v"));
        assert_eq!(s.get(RowKey::new(0, 1_000_050)).unwrap().lock().value.as_deref(), Some(&b"v"[..]));
        assert!(s.get(RowKey::new(0, 1_000_100)).is_none(), "just past the dense range");
        assert_eq!(s.table(0).len(), 1);
    }

    #[test]
    fn chunked_and_grouped_tables_act_like_b_trees() {
        let s: Storage<u64> = Storage::new(&defs());
        // Dense runs in two "districts" far apart, with a hole, across chunk boundaries.
        let keys: Vec<u64> = (1..600).chain(1 << 32..(1 << 32) + 300).filter(|k| k % 100 != 7).collect();
        for &k in &keys {
            for t in [1, 2, 3] {
                s.load(RowKey::new(t, k), Value::from(k.to_le_bytes().to_vec()));
            }
        }
        assert!(s.get(RowKey::new(2, 7)).is_none(), "never created");
        assert!(s.get(RowKey::new(2, 700)).is_none(), "past the last key of its chunk");
        assert!(s.get(RowKey::new(2, 1 << 40)).is_none(), "no chunk");
        assert_eq!(s.get(RowKey::new(2, 255)).unwrap().lock().value.as_deref().unwrap()[0], 255);
        for t in [1, 2, 3] {
            s.table(t).get_or_create(5000); // created absent: scans return it, as a B-tree's do
        }
        let keys_of = |v: Vec<(u64, &Record<u64>)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
        let cases =
            [(0, u64::MAX, usize::MAX), (3, 520, 1000), (250, 260, 3), (4000, 6000, 9), (9, 3, 5), (590, 1 << 32, 4)];
        for (lo, hi, limit) in cases {
            for desc in [false, true] {
                let b = keys_of(s.table(1).range(lo, hi, limit, desc));
                assert_eq!(keys_of(s.table(2).range(lo, hi, limit, desc)), b, "{lo}..={hi} limit {limit} desc {desc}");
                assert_eq!(keys_of(s.table(3).range(lo, hi, limit, desc)), b, "{lo}..={hi} limit {limit} desc {desc}");
            }
        }
        assert_eq!(keys_of(s.table(2).range(250, 260, 3, true)), vec![260, 259, 258]);
        assert_eq!(keys_of(s.table(2).range(590, 1 << 32, 4, false)), vec![590, 591, 592, 593]);
        assert_eq!(keys_of(s.table(2).range(4000, 6000, 9, false)), vec![5000]);
        assert_eq!(keys_of(s.table(2).range(0, 8, 9, false)), vec![1, 2, 3, 4, 5, 6, 8]);
        assert_eq!(s.table(2).len(), keys.len());
        assert_eq!(s.table(3).len(), keys.len());
        assert!(s.get(RowKey::new(3, 7)).is_none() && s.get(RowKey::new(3, 255)).is_some());
        // Out of order within a group: still sorted.
        s.table(3).get_or_create(7);
        assert_eq!(keys_of(s.table(3).range(5, 9, 10, false)), vec![5, 6, 7, 8, 9]);
    }

    #[test]
    fn concurrent_access_from_threads() {
        let s: std::sync::Arc<Storage<u64>> = std::sync::Arc::new(Storage::new(&defs()));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        let rec = s.get_or_create(RowKey::new(1, i % 100));
                        rec.lock().meta += 1;
                        s.load(RowKey::new(0, t * 100_000 + i), Value::default());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let total: u64 = (0..100).map(|k| s.get(RowKey::new(1, k)).unwrap().lock().meta).sum();
        assert_eq!(total, 40_000);
        assert_eq!(s.table(0).len(), 40_000);
    }
}
