//! Transactions as stored procedures.
//!
//! A workload registers procedures by name; a [`TxnRequest`] names one and carries its arguments.
//! A procedure is `async` code written against [`Ctx`]: `read`, `read_for_update`, `write`,
//! `insert`, `delete`, `scan`. Each protocol implements [`Access`] for its execution phase, so the
//! same procedure runs under 2PL, OCC or anything else. A local access completes at once
//! ([`Step::Ready`], no allocation); a remote one returns a future that waits for the reply.
//!
//! One-shot execution: a procedure may declare its read and write sets up front
//! ([`KeySet`], `Workload::declare`). Protocols use the declaration to fetch and lock per
//! participant in one message, and deterministic protocols need it. When some keys depend on
//! reads, `declare` says so and [`recon`] discovers them with a reconnaissance run (OLLP, as in
//! Calvin); the real run then aborts with [`Abort::ReconMismatch`] if it strays from the set.

pub mod recon;
pub mod replay;

use crate::cluster::PartitionId;
use crate::rt::LocalBoxFuture;
use crate::storage::{RowKey, TableDef, TableId, Value};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::sync::Arc;

/// Why an attempt aborted. Each reason is counted separately in every report.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Abort {
    /// NO_WAIT: a lock was held in a conflicting mode.
    LockConflict,
    /// WAIT_DIE: a younger transaction met an older holder and died.
    WaitDie,
    /// Waited too long for a lock.
    LockTimeout,
    /// OCC: a read's version changed (or was locked) before commit.
    ReadValidation,
    /// OCC: a written record was locked by another committing transaction.
    WriteLocked,
    /// A participant did not answer in time.
    Timeout,
    /// A one-shot run touched a key the (reconnaissance) declaration did not include.
    ReconMismatch,
    /// The procedure itself rolled back (e.g. TPC-C's invalid item); never retried.
    User,
    /// A participant had lost the transaction's state (it was cleaned up after a timeout).
    ParticipantLost,
    /// The log refused the transaction's record (larger than its record limit).
    LogRefused,
    /// Committed in memory and queued for its acknowledgement, then undone by a failure before
    /// its release point (an epoch that failed, a watermark agreed below it): reported to its
    /// client as aborted, never as committed; the client has moved on, so it is not retried.
    RolledBack,
    /// Epoch group commit: the transaction's epoch closed (or failed) before it could take part
    /// in it; retried in the next.
    EpochClosed,
    /// A participant's reply did not decode as an answer to what was asked (a bug, or a peer
    /// of another build): retried, and counted apart from timeouts.
    BadReply,
    /// The transaction was handed on (Calvin: to a sequencer) and its outcome did not reach its
    /// client in time: it may have committed or not. Its history line says `unknown`, and it is
    /// not retried (a retry could apply it twice).
    OutcomeUnknown,
    /// A reason a protocol defines for itself (its registry entry lists it with its meaning);
    /// retried like the shared ones.
    Protocol(Reason),
    /// The procedure found that its request names what the workload has since moved past
    /// (list-append: a key whose slot a newer round took, so the key is retired); retried once
    /// `Workload::before_retry` has moved the request on. The workload's doing, not the
    /// protocol's. (Last, so that the reasons before it keep their numbers on the wire.)
    Stale,
}

/// An abort reason a protocol defines: its name as reports show it (kebab-case). Names cross
/// the network as strings and are interned on arrival, so a protocol adds a reason without
/// touching this enum.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reason(&'static str);

/// The most distinct protocol-defined reasons a process interns from the network; beyond it
/// (a peer sending garbage names), names read as [`Reason::UNKNOWN`].
const MAX_REASONS: usize = 256;

impl Reason {
    pub const UNKNOWN: Reason = Reason("unknown-protocol-reason");

    pub const fn new(name: &'static str) -> Self {
        Reason(name)
    }

    /// Its name; `const` so that a protocol's table of reasons (`ProtocolInfo::aborts`) can
    /// name each reason through its constant and spell it once.
    pub const fn name(&self) -> &'static str {
        self.0
    }

    /// The reason named `name`, as a `'static` name: known names are found, new ones leaked
    /// once (bounded by [`MAX_REASONS`]).
    fn intern(name: &str) -> Reason {
        static NAMES: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
        let mut names = NAMES.lock();
        if let Some(n) = names.iter().find(|n| **n == name) {
            return Reason(n);
        }
        if names.len() >= MAX_REASONS {
            return Reason::UNKNOWN;
        }
        let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
        names.push(leaked);
        Reason(leaked)
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Reason::intern(&name))
    }
}

impl Abort {
    pub fn name(&self) -> &'static str {
        match self {
            Abort::LockConflict => "lock-conflict",
            Abort::WaitDie => "wait-die",
            Abort::LockTimeout => "lock-timeout",
            Abort::ReadValidation => "read-validation",
            Abort::WriteLocked => "write-locked",
            Abort::Timeout => "timeout",
            Abort::ReconMismatch => "recon-mismatch",
            Abort::User => "user",
            Abort::ParticipantLost => "participant-lost",
            Abort::LogRefused => "log-refused",
            Abort::BadReply => "bad-reply",
            Abort::RolledBack => "rolled-back",
            Abort::OutcomeUnknown => "outcome-unknown",
            Abort::EpochClosed => "epoch-closed",
            Abort::Stale => "stale-request",
            Abort::Protocol(r) => r.name(),
        }
    }

    /// Whether the driver should run the same transaction again.
    pub fn retryable(&self) -> bool {
        !matches!(self, Abort::User | Abort::LogRefused | Abort::RolledBack | Abort::OutcomeUnknown)
    }
}

pub type TxnResult<T> = Result<T, Abort>;

/// A step of execution: done now, or waiting for a remote participant. A step is itself the
/// future a procedure awaits, so a local access costs no async state machine of its own.
pub enum Step<'a, T> {
    Ready(TxnResult<T>),
    Wait(LocalBoxFuture<'a, TxnResult<T>>),
    /// A `Ready` step whose result was taken by polling it.
    Taken,
}

impl<'a, T: Unpin> Step<'a, T> {
    #[inline]
    pub async fn get(self) -> TxnResult<T> {
        self.await
    }
}

impl<'a, T: Unpin> std::future::Future for Step<'a, T> {
    type Output = TxnResult<T>;

    #[inline]
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<TxnResult<T>> {
        // Nothing is pinned in place: `Ready` holds a plain result, which is moved out, and
        // `Wait` a boxed future, pinned by its box.
        let this = self.get_mut();
        if let Step::Wait(f) = this {
            return f.as_mut().poll(cx);
        }
        match std::mem::replace(this, Step::Taken) {
            Step::Ready(r) => std::task::Poll::Ready(r),
            _ => panic!("a step was polled after it completed"),
        }
    }
}

/// A range scan over a table's ordered index, inclusive bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    pub table: TableId,
    pub lo: u64,
    pub hi: u64,
    pub limit: u32,
    pub descending: bool,
}

impl Scan {
    /// Whether `key` lies in the scanned range.
    pub fn contains(&self, key: RowKey) -> bool {
        key.table == self.table && (self.lo..=self.hi).contains(&key.key)
    }

    /// The scan's answer under a transaction's own `writes` (in the order made, `None` a delete,
    /// the last write of a key the one that counts), over `stored`: the rows present before
    /// the transaction, in the order asked, at least `limit` plus the writes in the range of
    /// them when there are that many (a write may delete a stored row or put one before it).
    /// The rows present afterwards, in the order asked, at most `limit`.
    pub fn over_writes(&self, mut stored: Vec<(u64, Value)>, writes: &[(RowKey, Option<Value>)]) -> Vec<(u64, Value)> {
        if !writes.iter().any(|(k, _)| self.contains(*k)) {
            stored.truncate(self.limit as usize);
            return stored;
        }
        let mut rows: std::collections::BTreeMap<u64, Option<Value>> =
            stored.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for (k, v) in writes.iter().filter(|(k, _)| self.contains(*k)) {
            rows.insert(k.key, v.clone());
        }
        let present = |(k, v): (u64, Option<Value>)| Some((k, v?));
        match self.descending {
            true => rows.into_iter().rev().filter_map(present).take(self.limit as usize).collect(),
            false => rows.into_iter().filter_map(present).take(self.limit as usize).collect(),
        }
    }
}

/// What each protocol implements for the execution phase of one transaction attempt.
pub trait Access {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>>;
    /// Read with the intent to write (2PL takes the exclusive lock at once).
    fn read_for_update(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        self.read(key)
    }
    /// Write (`Some`) or delete (`None`) a record; inserts are writes of absent keys.
    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()>;
    /// Rows with keys in the scan's range that exist, in key order (or reverse).
    fn scan(&mut self, scan: Scan) -> Step<'_, Vec<(u64, Value)>>;
}

/// The handle a procedure uses. It forwards to the protocol's [`Access`] and, for one-shot runs,
/// enforces the declared key set.
pub struct Ctx<'a> {
    access: &'a mut dyn Access,
    declared: Option<&'a KeySet>,
}

impl<'a> Ctx<'a> {
    pub fn new(access: &'a mut dyn Access) -> Self {
        Ctx { access, declared: None }
    }

    /// A context that aborts with `ReconMismatch` on any key outside `keys`.
    pub fn with_declared(access: &'a mut dyn Access, keys: &'a KeySet) -> Self {
        Ctx { access, declared: Some(keys) }
    }

    #[inline]
    fn check(&self, key: RowKey, write: bool) -> TxnResult<()> {
        match self.declared {
            Some(ks) if !ks.covers(key, write) => Err(Abort::ReconMismatch),
            _ => Ok(()),
        }
    }

    // Plain functions returning the protocol's step (a future): a local access completes
    // when first polled, with no state machine per call.

    pub fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.check(key, false) {
            Ok(()) => self.access.read(key),
            Err(a) => Step::Ready(Err(a)),
        }
    }

    pub fn read_for_update(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        match self.check(key, true) {
            Ok(()) => self.access.read_for_update(key),
            Err(a) => Step::Ready(Err(a)),
        }
    }

    pub fn write(&mut self, key: RowKey, value: Value) -> Step<'_, ()> {
        match self.check(key, true) {
            Ok(()) => self.access.write(key, Some(value)),
            Err(a) => Step::Ready(Err(a)),
        }
    }

    pub fn insert(&mut self, key: RowKey, value: Value) -> Step<'_, ()> {
        self.write(key, value)
    }

    pub fn delete(&mut self, key: RowKey) -> Step<'_, ()> {
        match self.check(key, true) {
            Ok(()) => self.access.write(key, None),
            Err(a) => Step::Ready(Err(a)),
        }
    }

    pub fn scan(&mut self, scan: Scan) -> Step<'_, Vec<(u64, Value)>> {
        self.access.scan(scan)
    }
}

/// The keys a one-shot transaction will read and write. Workloads fill `reads` and `writes`
/// before execution (directly, or through [`KeySet::read`]/[`KeySet::write`] which skip
/// duplicates); during execution the set is only read, and `covers` answers from a hash index
/// built on first use when the set is large, so a transaction over thousands of keys (an audit)
/// does not check each access against every declared key. (An open-addressing table of
/// positions: for the 30-50 keys of a New-Order, building it costs less than sorting them.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySet {
    pub reads: Vec<RowKey>,
    pub writes: Vec<RowKey>,
    /// The scans the run makes, as reconnaissance recorded them or a workload's declaration
    /// names them where it can (TPC-C's Payment by last name). `Ctx` does not check scans
    /// against it; a protocol that locks ranges ahead of the run (Calvin) does.
    #[serde(default)]
    pub scans: Vec<Scan>,
    /// Which of the first 64 `writes` the procedure writes without reading them first (bit i:
    /// `writes[i]`; YCSB's blind writes): a hint, never checked, for a protocol that would
    /// otherwise fetch them (Primo's dummy reads, §4.2). A key marked here and read anyway is
    /// fetched when it is read. A mask, not a list: a key set rides in every Calvin-family log
    /// entry, and only the executing coordinator uses it (it is not sent).
    #[serde(skip)]
    blind_mask: u64,
    /// Built by `covers` for sets larger than [`KeySet::LINEAR_MAX`]: slots of 1 + a position in
    /// `writes` (positive) or in `reads` (negative), 0 = empty; a power of two, at most half full.
    #[serde(skip)]
    index: std::cell::OnceCell<Vec<i32>>,
}

#[inline]
fn key_hash(k: RowKey, mask: usize) -> usize {
    let h = (k.key ^ ((k.table as u64) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 32) as usize & mask
}

impl KeySet {
    /// Up to this many keys a linear scan is faster than hashing.
    const LINEAR_MAX: usize = 32;

    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
        self.scans.clear();
        self.blind_mask = 0;
        self.index = Default::default();
    }

    pub fn read(&mut self, k: RowKey) {
        if !self.reads.contains(&k) {
            self.reads.push(k);
        }
    }

    pub fn write(&mut self, k: RowKey) {
        if !self.writes.contains(&k) {
            self.writes.push(k);
        }
    }

    /// A write the procedure makes without reading the key first (marked blind among the first
    /// 64 writes; later ones are declared as plain writes).
    pub fn blind_write(&mut self, k: RowKey) {
        if !self.writes.contains(&k) {
            if self.writes.len() < u64::BITS as usize {
                self.blind_mask |= 1 << self.writes.len();
            }
            self.writes.push(k);
        }
    }

    /// Whether `k` was declared a blind write.
    pub fn is_blind(&self, k: RowKey) -> bool {
        self.blind_mask != 0
            && self
                .writes
                .iter()
                .take(u64::BITS as usize)
                .position(|w| *w == k)
                .is_some_and(|i| self.blind_mask >> i & 1 == 1)
    }

    fn build_index(&self) -> Vec<i32> {
        let n = self.reads.len() + self.writes.len();
        let mut slots = vec![0i32; (2 * n).next_power_of_two()];
        let mask = slots.len() - 1;
        // Writes first: a key both written and read keeps its written entry.
        let entries = self.writes.iter().enumerate().map(|(i, k)| (*k, i as i32 + 1));
        for (k, e) in entries.chain(self.reads.iter().enumerate().map(|(i, k)| (*k, -(i as i32) - 1))) {
            let mut h = key_hash(k, mask);
            loop {
                match slots[h] {
                    0 => {
                        slots[h] = e;
                        break;
                    }
                    o if self.entry_key(o) == k => break,
                    _ => h = (h + 1) & mask,
                }
            }
        }
        slots
    }

    #[inline]
    fn entry_key(&self, e: i32) -> RowKey {
        if e > 0 {
            self.writes[e as usize - 1]
        } else {
            self.reads[(-e) as usize - 1]
        }
    }

    pub fn covers(&self, k: RowKey, write: bool) -> bool {
        if self.reads.len() + self.writes.len() <= Self::LINEAR_MAX {
            return self.writes.contains(&k) || (!write && self.reads.contains(&k));
        }
        let slots = self.index.get_or_init(|| self.build_index());
        let mask = slots.len() - 1;
        let mut h = key_hash(k, mask);
        loop {
            match slots[h] {
                0 => return false,
                e if self.entry_key(e) == k => return e > 0 || !write,
                _ => h = (h + 1) & mask,
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_small_and_large_sets_alike() {
        for n in [4u64, 500] {
            let mut ks = KeySet::default();
            ks.reads.extend((0..n).map(|k| RowKey::new(0, k)));
            ks.writes.extend((0..n).map(|k| RowKey::new(1, k)));
            ks.reads.push(RowKey::new(1, 0));
            assert!(ks.covers(RowKey::new(0, n - 1), false));
            assert!(!ks.covers(RowKey::new(0, n - 1), true), "a read key is not declared for writing");
            assert!(ks.covers(RowKey::new(1, n - 1), true));
            assert!(ks.covers(RowKey::new(1, 0), true), "read and written");
            assert!(!ks.covers(RowKey::new(2, 0), false));
        }
    }

    #[test]
    fn blind_writes_are_marked_among_the_writes() {
        let mut ks = KeySet::default();
        ks.write(RowKey::new(0, 1));
        ks.blind_write(RowKey::new(0, 2));
        ks.blind_write(RowKey::new(0, 1));
        assert_eq!(ks.writes, vec![RowKey::new(0, 1), RowKey::new(0, 2)], "declared once each");
        assert!(!ks.is_blind(RowKey::new(0, 1)), "a read-modify-write stays one");
        assert!(ks.is_blind(RowKey::new(0, 2)));
        assert!(ks.covers(RowKey::new(0, 2), true));
        ks.clear();
        ks.write(RowKey::new(0, 2));
        assert!(!ks.is_blind(RowKey::new(0, 2)), "cleared");
    }
}

/// A request to run one stored procedure: the procedure's name, the partition whose client
/// issued it, and its arguments. Requests are data: a clone shares the arguments, and
/// [`Procedures::encode_request`] turns one into bytes (a procedure id and the arguments) that can
/// be logged, shipped to another node and decoded there to run again.
#[derive(Clone)]
pub struct TxnRequest {
    /// The registered procedure name.
    pub proc: &'static str,
    /// The partition whose client issued it.
    pub home: u32,
    pub args: Args,
}

/// A request's arguments, typed by its workload and shared by its clones.
pub type Args = Arc<dyn Any + Send + Sync>;

impl TxnRequest {
    pub fn new<T: Any + Send + Sync>(proc: &'static str, home: u32, args: T) -> Self {
        TxnRequest { proc, home, args: Arc::new(args) }
    }

    pub fn args<T: 'static>(&self) -> &T {
        self.args.downcast_ref::<T>().unwrap_or_else(|| panic!("procedure {} got arguments of another type", self.proc))
    }

    /// The arguments to change before a retry, copied first if a clone shares them (so a
    /// protocol that kept the request never sees them change under it); `None` if they are
    /// of another type.
    pub fn args_mut<T: Any + Send + Sync + Clone>(&mut self) -> Option<&mut T> {
        let own = self.args.downcast_ref::<T>()?;
        if Arc::strong_count(&self.args) > 1 {
            self.args = Arc::new(own.clone());
        }
        Arc::get_mut(&mut self.args).and_then(|a| a.downcast_mut::<T>())
    }
}

impl std::fmt::Debug for TxnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnRequest").field("proc", &self.proc).field("home", &self.home).finish_non_exhaustive()
    }
}

/// Why bytes did not decode as a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("a request of {0} bytes is shorter than its 6-byte header")]
    Truncated(usize),
    #[error("procedure id {id} is not one of this workload's {known} procedures")]
    UnknownProcedure { id: u16, known: usize },
    #[error("the arguments of `{proc}` do not decode: {why}")]
    BadArguments { proc: &'static str, why: String },
}

/// What a node needs of a workload to run its transactions: the tables and their population,
/// where a key lives, and the stored procedures (their keys, their code, their arguments'
/// encoding). Protocols see a workload only through this; generating transactions and checking
/// a run's invariants are the workload's other half, above the protocols.
pub trait Procedures: Send + Sync + 'static {
    /// The tables as the node holding `partitions` needs them.
    fn tables(&self, partitions: &[PartitionId]) -> Vec<TableDef>;
    /// The registered stored procedures, by name (a request's procedure id is its index here).
    fn procedures(&self) -> &'static [&'static str];
    /// Which partition a key lives in.
    fn partition_of(&self, key: RowKey) -> PartitionId;
    /// Populate one partition.
    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value));
    /// Declare the read and write sets; false when some keys depend on what is read (OLLP).
    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool;
    /// Whether some procedure may scan (what a protocol that orders single keys apart, such as a
    /// home movement's, cannot run beside). A workload that never scans says so.
    fn scans(&self) -> bool {
        true
    }
    /// Whether the request only reads, declared before it runs (what Silo's snapshot
    /// transactions need to know in advance). A workload that cannot tell says `false`.
    fn read_only(&self, _req: &TxnRequest) -> bool {
        false
    }
    /// Run the procedure the request names.
    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a>;
    /// The arguments of `req` as bytes (postcard, through [`encode_args`]).
    fn encode_args(&self, req: &TxnRequest) -> Vec<u8>;
    /// Arguments of procedure `proc` from [`Procedures::encode_args`]'s bytes.
    fn decode_args(&self, proc: &'static str, bytes: &[u8]) -> Result<Args, RequestError>;

    /// A request as bytes: its procedure id (u16), its home partition (u32), its arguments.
    fn encode_request(&self, req: &TxnRequest) -> Vec<u8> {
        let id = self.procedures().iter().position(|p| *p == req.proc);
        let id = id.unwrap_or_else(|| panic!("procedure `{}` is not registered", req.proc)) as u16;
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&req.home.to_le_bytes());
        out.extend_from_slice(&self.encode_args(req));
        out
    }

    /// A request from [`Procedures::encode_request`]'s bytes; garbage is an error, never a panic.
    fn decode_request(&self, bytes: &[u8]) -> Result<TxnRequest, RequestError> {
        if bytes.len() < 6 {
            return Err(RequestError::Truncated(bytes.len()));
        }
        let id = u16::from_le_bytes([bytes[0], bytes[1]]);
        let home = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
        let procs = self.procedures();
        let proc = *procs.get(id as usize).ok_or(RequestError::UnknownProcedure { id, known: procs.len() })?;
        Ok(TxnRequest { proc, home, args: self.decode_args(proc, &bytes[6..])? })
    }
}

/// Encode a request's arguments of type `T` (what a workload's `encode_args` does per procedure).
pub fn encode_args<T: Serialize + 'static>(req: &TxnRequest) -> Vec<u8> {
    postcard::to_allocvec(req.args::<T>()).expect("arguments encode into memory")
}

/// Decode arguments of type `T` for procedure `proc`.
pub fn decode_args<T: serde::de::DeserializeOwned + Any + Send + Sync>(
    proc: &'static str,
    bytes: &[u8],
) -> Result<Args, RequestError> {
    match postcard::from_bytes::<T>(bytes) {
        Ok(a) => Ok(Arc::new(a)),
        Err(e) => Err(RequestError::BadArguments { proc, why: e.to_string() }),
    }
}

/// One operation of a list-append history line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistOp {
    Read(u64, Option<Vec<u64>>),
    Append(u64, u64),
    /// A read of a key's whole list by the transaction that retires the key: no append to it
    /// may follow, so every committed append to it must be in the list (`["retire", k, list]`).
    Retire(u64, Vec<u64>),
}

impl Serialize for HistOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(3)?;
        match self {
            HistOp::Read(k, v) => {
                t.serialize_element("r")?;
                t.serialize_element(k)?;
                t.serialize_element(v)?;
            }
            HistOp::Append(k, v) => {
                t.serialize_element("append")?;
                t.serialize_element(k)?;
                t.serialize_element(v)?;
            }
            HistOp::Retire(k, v) => {
                t.serialize_element("retire")?;
                t.serialize_element(k)?;
                t.serialize_element(v)?;
            }
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for HistOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (op, k, v): (String, u64, serde_json::Value) = Deserialize::deserialize(d)?;
        match op.as_str() {
            "r" => Ok(HistOp::Read(k, serde_json::from_value(v).map_err(serde::de::Error::custom)?)),
            "append" => Ok(HistOp::Append(k, serde_json::from_value(v).map_err(serde::de::Error::custom)?)),
            "retire" => Ok(HistOp::Retire(k, serde_json::from_value(v).map_err(serde::de::Error::custom)?)),
            other => Err(serde::de::Error::custom(format!("unknown history op `{other}`"))),
        }
    }
}

/// What a committed procedure returns to the driver.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TxnOutput {
    /// List-append operations with what was read, for the history.
    pub history: Vec<HistOp>,
    /// Numbers a procedure reports to its workload's checks (the bank audit's total): part of
    /// the output, not of the request, so that a procedure run on another node reports them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reported: Vec<i64>,
    /// Committed in memory, acknowledged only once the worker's log is durable up to this LSN; set only for an attempt with `defer_ack`. Never sent: it names a local log.
    #[serde(skip)]
    pub ack_after: Option<u64>,
}

/// The shape every workload's procedure entry point has.
pub type ProcFuture<'a> = LocalBoxFuture<'a, TxnResult<TxnOutput>>;

#[cfg(test)]
mod reason_tests {
    use super::{Abort, Reason};

    #[test]
    fn a_protocol_reason_crosses_the_wire_by_name() {
        let sent = Abort::Protocol(Reason::new("lease-expired"));
        let got: Abort = crate::net::decode(&crate::net::encode(&sent)).unwrap();
        assert_eq!(got, sent);
        assert_eq!(got.name(), "lease-expired");
        assert!(got.retryable());
        // Interned: the same name decodes to the same `'static` string every time.
        let again: Abort = crate::net::decode(&crate::net::encode(&sent)).unwrap();
        let (Abort::Protocol(a), Abort::Protocol(b)) = (got, again) else { unreachable!() };
        assert!(std::ptr::eq(a.name(), b.name()));
    }
}
