//! The checker proper: version-order inference, non-cycle anomalies, dependency graph and
//! cycle classification. See the crate documentation for the semantics.

use crate::graph::{tarjan, Bfs, Csr, Search, ALL, RT, RW, WR, WW};
use crate::{Anomaly, AnomalyKind, CheckReport, Op, Status, Txn};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};

/// A small fast hasher for integer keys (FxHash-style multiply, with the well-mixed high half
/// folded into the low bits so that hashbrown's bucket index is not just the low input bits).
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.hash ^ (self.hash >> 32)
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
type FxSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// "No transaction" / "no position".
const NONE: u32 = u32::MAX;

/// Search budget (edges inspected) for the optional G-single / G2 reachability searches over
/// the whole history; beyond it a cycle is still reported but may be classified coarsely.
const SEARCH_BUDGET: u64 = 50_000_000;

/// Longest cycle edges spelled out in an explanation.
const EXPLAIN_EDGES: usize = 24;

/// What we know about one (key, value) pair.
#[derive(Clone, Copy)]
struct ValInfo {
    /// The (first) transaction that appended it, or `NONE` (garbage).
    writer: u32,
    /// Position in the key's version order, or `NONE` if no committed read contains it.
    pos: u32,
    /// Whether this was the writer's last append to the key.
    last_in_txn: bool,
    /// Whether the final read-only transaction (if any) read it.
    in_final: bool,
}

/// Writer of the value at one position of a version order (`NONE` for garbage), and whether
/// it was the writer's last append to the key.
#[derive(Clone, Copy)]
struct Slot {
    writer: u32,
    last_in_txn: bool,
}

/// Values of the version orders that are reported only after all of them are positioned.
struct OrderFaults {
    /// (key, position) of values that are garbage or were appended by aborted transactions.
    bad: Vec<(u32, u32)>,
    /// (key, value) of values that appear more than once in their key's version order.
    repeated: Vec<(u32, u64)>,
}

/// A non-null read by a committed transaction.
#[derive(Clone, Copy)]
struct ReadRef {
    kid: u32,
    txn: u32,
    op: u32,
}

/// The external view of a key by a committed transaction: its first read of the key, minus
/// the transaction's own appends that preceded that read (`len` leading values).
#[derive(Clone, Copy)]
struct ExtRead {
    kid: u32,
    txn: u32,
    op: u32,
    len: u32,
}

/// The longest committed read of a key: defines the key's version order.
#[derive(Clone, Copy)]
struct Longest {
    txn: u32,
    op: u32,
    len: usize,
}

/// A dependency edge. `x` is, for ww and rw edges, the position in the key's version order of
/// the value appended by `to`; for wr edges, the value read by `to`.
#[derive(Clone, Copy)]
struct Edge {
    from: u32,
    to: u32,
    kind: u8,
    kid: u32,
    x: u64,
}

impl Edge {
    /// `from` ended before `to` started (either may be a point of real time).
    fn realtime(from: u32, to: u32) -> Edge {
        Edge { from, to, kind: RT, kid: 0, x: 0 }
    }
}

/// Per-key state while walking one transaction.
#[derive(Default)]
struct KeyState {
    /// Op index of the last completed read of the key (committed transactions only).
    last_read: Option<u32>,
    /// Own appends since that read (or since the start; committed transactions only).
    appends: Vec<u64>,
    /// Last value this transaction appended to the key (and registered as its writer).
    last_own: Option<u64>,
}

/// The per-key states of the transaction being indexed, with O(1) lookup: `slot[kid]` holds
/// (transaction, index into `states`) and is valid only if it names the current transaction,
/// so a transaction touching 100k keys costs 100k, not 100k².
#[derive(Default)]
struct TxnKeys {
    txn: u32,
    slot: Vec<(u32, u32)>,
    states: Vec<KeyState>,
}

impl TxnKeys {
    fn begin(&mut self, txn: u32) {
        self.txn = txn;
        self.states.clear();
    }

    fn get(&mut self, kid: u32) -> &mut KeyState {
        let k = kid as usize;
        if self.slot.len() <= k {
            self.slot.resize(k + 1, (NONE, 0));
        }
        let (t, i) = self.slot[k];
        let i = if t == self.txn && (i as usize) < self.states.len() {
            i as usize
        } else {
            self.slot[k] = (self.txn, self.states.len() as u32);
            self.states.push(KeyState::default());
            self.states.len() - 1
        };
        &mut self.states[i]
    }
}

/// The list of read `op` of transaction `txn` (empty if it is not a completed read).
fn read_list(txns: &[Txn], txn: u32, op: u32) -> &[u64] {
    match txns.get(txn as usize).and_then(|t| t.ops.get(op as usize)) {
        Some(Op::Read { list: Some(list), .. }) => list,
        _ => &[],
    }
}

/// Formats a list, eliding the middle of long ones.
fn fmt_list(l: &[u64]) -> String {
    let join = |s: &[u64]| s.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
    if l.len() <= 12 {
        format!("[{}]", join(l))
    } else {
        format!("[{}, ... {}] ({} values)", join(&l[..5]), join(&l[l.len() - 5..]), l.len())
    }
}

struct Ctx<'a> {
    txns: &'a [Txn],
    keys: FxMap<u64, u32>,
    key_names: Vec<u64>,
    vals: FxMap<(u32, u64), ValInfo>,
    longest: Vec<Option<Longest>>,
    reads: Vec<ReadRef>,
    ext: Vec<ExtRead>,
    /// Per key, per version-order position: who appended the value.
    order_info: Vec<Vec<Slot>>,
    /// Status of every transaction, compactly (avoids touching the big `Txn` records).
    status: Vec<Status>,
    /// The last transaction, if it is a committed read-only one (lost-append check).
    final_txn: Option<u32>,
    /// Committed reads (txn, op) that are not prefixes of their key's version order.
    incompatible: FxSet<(u32, u32)>,
    in_graph: Vec<bool>,
    anomalies: Vec<Anomaly>,
}

pub(crate) fn check(txns: &[Txn], realtime: bool) -> CheckReport {
    // Size the big tables up front: growing them by doubling costs rehashing and page faults.
    let (mut appends, mut reads) = (0usize, 0usize);
    for t in txns {
        for op in &t.ops {
            match op {
                Op::Append { .. } => appends += 1,
                Op::Read { .. } => reads += 1,
            }
        }
    }
    let mut cx = Ctx::new(txns, appends, reads);
    cx.index();
    cx.version_orders();
    let edges = cx.dependencies();
    cx.cycles(&edges);
    if realtime {
        cx.realtime_cycles(edges);
    }
    cx.lost_appends();
    cx.finish()
}

impl<'a> Ctx<'a> {
    /// A context over `txns`, its tables sized for `appends` appends and `reads` reads.
    fn new(txns: &'a [Txn], appends: usize, reads: usize) -> Self {
        Ctx {
            txns,
            keys: FxMap::default(),
            key_names: Vec::new(),
            vals: FxMap::with_capacity_and_hasher(appends, Default::default()),
            longest: Vec::new(),
            reads: Vec::with_capacity(reads),
            ext: Vec::with_capacity(reads),
            order_info: Vec::new(),
            status: txns.iter().map(|t| t.status).collect(),
            final_txn: txns.last().and_then(|t| {
                let read_only = !t.ops.is_empty()
                    && t.ops.iter().all(|op| matches!(op, Op::Read { list: Some(_), retires: false, .. }));
                (t.status == Status::Committed && read_only).then_some(txns.len() as u32 - 1)
            }),
            incompatible: FxSet::default(),
            in_graph: txns.iter().map(|t| t.status == Status::Committed).collect(),
            anomalies: Vec::new(),
        }
    }

    fn id(&self, t: u32) -> u64 {
        self.txns.get(t as usize).map_or(0, |t| t.id)
    }

    fn key(&self, kid: u32) -> u64 {
        self.key_names.get(kid as usize).copied().unwrap_or(0)
    }

    fn status(&self, t: u32) -> Option<Status> {
        self.status.get(t as usize).copied()
    }

    /// The version order of a key (empty if no committed transaction read it).
    fn order(&self, kid: u32) -> &'a [u64] {
        match self.longest.get(kid as usize).copied().flatten() {
            Some(l) => read_list(self.txns, l.txn, l.op),
            None => &[],
        }
    }

    fn intern(&mut self, key: u64) -> u32 {
        match self.keys.entry(key) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let kid = self.key_names.len() as u32;
                e.insert(kid);
                self.key_names.push(key);
                self.longest.push(None);
                kid
            }
        }
    }

    fn report(&mut self, kind: AnomalyKind, txns: Vec<u64>, explanation: String) {
        self.anomalies.push(Anomaly { kind, txns, explanation });
    }

    // ---------------------------------------------------------------- pass 1: index

    /// Registers every append (any status), collects committed reads and external views, and
    /// checks the internal consistency of committed transactions.
    fn index(&mut self) {
        let txns = self.txns;
        let mut ks = TxnKeys::default();
        for (ti, t) in txns.iter().enumerate() {
            let ti = ti as u32;
            let committed = t.status == Status::Committed;
            ks.begin(ti);
            for (oi, op) in t.ops.iter().enumerate() {
                let oi = oi as u32;
                match op {
                    Op::Append { key, value } => {
                        let kid = self.intern(*key);
                        let st = ks.get(kid);
                        self.register_append(ti, kid, *value, st);
                        if committed {
                            st.appends.push(*value);
                        }
                    }
                    Op::Read { key, list, .. } => {
                        let kid = self.intern(*key);
                        let Some(list) = list else { continue };
                        if !committed {
                            continue;
                        }
                        self.reads.push(ReadRef { kid, txn: ti, op: oi });
                        let slot = &mut self.longest[kid as usize];
                        if slot.is_none_or(|l| list.len() > l.len) {
                            *slot = Some(Longest { txn: ti, op: oi, len: list.len() });
                        }
                        self.internal_read(ti, kid, oi, list, ks.get(kid));
                    }
                }
            }
        }
    }

    fn register_append(&mut self, ti: u32, kid: u32, value: u64, st: &mut KeyState) {
        let first = match self.vals.entry((kid, value)) {
            Entry::Occupied(e) => Some(e.get().writer),
            Entry::Vacant(e) => {
                e.insert(ValInfo { writer: ti, pos: NONE, last_in_txn: true, in_final: false });
                None
            }
        };
        if let Some(first) = first {
            let (a, b, k) = (self.id(first), self.id(ti), self.key(kid));
            let explanation = if first == ti {
                format!("T{a} appended {value} to key {k} twice; appended values must be unique")
            } else {
                format!(
                    "T{a} and T{b} both appended {value} to key {k}; appended values must be \
                     unique, so reads of it are ambiguous (T{a} is taken as its writer)"
                )
            };
            self.report(AnomalyKind::DuplicateAppend, vec![a, b], explanation);
            return;
        }
        if let Some(prev) = st.last_own.replace(value) {
            if let Some(p) = self.vals.get_mut(&(kid, prev)) {
                p.last_in_txn = false;
            }
        }
    }

    /// A read inside a committed transaction must reflect the transaction's own appends: it
    /// equals the previous read of the key plus the appends since, or (for a first read) ends
    /// with the appends made so far. The first read, minus those appends, is the external view.
    fn internal_read(&mut self, ti: u32, kid: u32, oi: u32, list: &[u64], st: &mut KeyState) {
        let (t, k) = (self.id(ti), self.key(kid));
        match st.last_read {
            Some(prev_op) => {
                let prev = read_list(self.txns, ti, prev_op);
                let ok = list.len() == prev.len() + st.appends.len()
                    && list.starts_with(prev)
                    && list[prev.len()..] == st.appends[..];
                if !ok {
                    let mut expected = prev.to_vec();
                    expected.extend_from_slice(&st.appends);
                    self.report(
                        AnomalyKind::IncompatibleOrder,
                        vec![t],
                        format!(
                            "internal inconsistency: T{t} read key {k} as {}, but it had read it \
                             as {} earlier and appended {} since, so it should have read {}",
                            fmt_list(list),
                            fmt_list(prev),
                            fmt_list(&st.appends),
                            fmt_list(&expected)
                        ),
                    );
                }
            }
            None => {
                if list.ends_with(&st.appends) {
                    self.ext.push(ExtRead { kid, txn: ti, op: oi, len: (list.len() - st.appends.len()) as u32 });
                } else {
                    self.report(
                        AnomalyKind::IncompatibleOrder,
                        vec![t],
                        format!(
                            "internal inconsistency: T{t} appended {} to key {k} and then read \
                             it as {}, which does not end with its own appends",
                            fmt_list(&st.appends),
                            fmt_list(list)
                        ),
                    );
                }
            }
        }
        st.last_read = Some(oi);
        st.appends.clear();
    }

    // ---------------------------------------------------------------- pass 2: version orders

    /// Positions every value of every key's version order, checks that all committed reads are
    /// prefixes of it, and reports garbage, aborted (G1a) and duplicated values. Promotes
    /// unknown transactions whose appends were observed.
    fn version_orders(&mut self) {
        let (final_prefix, final_other) = self.final_reads();
        let faults = self.position_values(&final_prefix);
        self.mark_final_values(&final_other);
        self.report_repeated_values(&faults.repeated);

        let reads = std::mem::take(&mut self.reads);
        let compatible = self.check_read_prefixes(&reads);
        // Each bad value is reported once, though several reads may contain it.
        let mut reported: FxSet<(u32, u64)> = FxSet::default();
        if !faults.bad.is_empty() {
            let readers = self.prefix_reads_by_length(&reads, &compatible, &faults.bad);
            self.report_bad_order_values(&faults.bad, &readers, &mut reported);
        }
        self.check_incompatible_read_values(&reads, &compatible, &mut reported);
        self.reads = reads;
    }

    /// What the final read-only transaction (if any) read of each key, for the lost-append
    /// check. Per key, how many leading values of its version order the final read contains,
    /// if it is a prefix of it (marked for free while positioning walks the order); and the
    /// final reads that are not prefixes, to be marked value by value.
    fn final_reads(&self) -> (Vec<usize>, Vec<(u32, &'a [u64])>) {
        let txns = self.txns;
        let mut prefix = vec![0usize; self.key_names.len()];
        let mut other: Vec<(u32, &'a [u64])> = Vec::new();
        if let Some(fi) = self.final_txn {
            for op in txns.get(fi as usize).map_or(&[][..], |t| &t.ops[..]) {
                if let Op::Read { key, list: Some(list), .. } = op {
                    let Some(&kid) = self.keys.get(key) else {
                        continue;
                    };
                    match prefix.get_mut(kid as usize) {
                        Some(fp) if self.order(kid).starts_with(list) => {
                            *fp = (*fp).max(list.len());
                        }
                        _ => other.push((kid, list)),
                    }
                }
            }
        }
        (prefix, other)
    }

    /// Walks every key's version order once: gives each value its position (a repeated value
    /// keeps its first), records each position's writer in `order_info` so that later passes
    /// need no hash lookup, marks the values inside the final read's prefix (`final_prefix`
    /// values per key), and promotes unknown writers whose appends were observed. Returns the
    /// garbage, aborted and repeated values met, to be reported once the reads are checked.
    fn position_values(&mut self, final_prefix: &[usize]) -> OrderFaults {
        let nk = self.key_names.len();
        self.order_info = vec![Vec::new(); nk];
        let mut faults = OrderFaults { bad: Vec::new(), repeated: Vec::new() };
        for kid in 0..nk as u32 {
            let order = self.order(kid);
            let in_final = final_prefix[kid as usize];
            let mut ws = Vec::with_capacity(order.len());
            for (p, &v) in order.iter().enumerate() {
                let info = self.vals.entry((kid, v)).or_insert(ValInfo {
                    writer: NONE,
                    pos: NONE,
                    last_in_txn: true,
                    in_final: false,
                });
                if info.pos == NONE {
                    info.pos = p as u32;
                } else {
                    faults.repeated.push((kid, v));
                }
                info.in_final |= p < in_final;
                let w = info.writer;
                ws.push(Slot { writer: w, last_in_txn: info.last_in_txn });
                match self.status(w) {
                    None | Some(Status::Aborted) => faults.bad.push((kid, p as u32)),
                    Some(Status::Unknown) => self.in_graph[w as usize] = true,
                    Some(Status::Committed) => {}
                }
            }
            self.order_info[kid as usize] = ws;
        }
        faults
    }

    /// Marks, value by value, the values of the final reads that are not prefixes of their
    /// key's version order (a value no transaction appended has no entry and is skipped).
    fn mark_final_values(&mut self, final_other: &[(u32, &[u64])]) {
        for &(kid, list) in final_other {
            for &v in list {
                if let Some(info) = self.vals.get_mut(&(kid, v)) {
                    info.in_final = true;
                }
            }
        }
    }

    /// Reports each value that appears more than once in its key's version order, attributed
    /// to the key's longest read, the one that defines the order.
    fn report_repeated_values(&mut self, repeated: &[(u32, u64)]) {
        for &(kid, v) in repeated {
            let reader = self.longest[kid as usize].map_or(NONE, |l| l.txn);
            let (r, k) = (self.id(reader), self.key(kid));
            self.report(
                AnomalyKind::DuplicateAppend,
                vec![r],
                format!("T{r} read key {k} with value {v} appearing more than once"),
            );
        }
    }

    /// Prefix check of every committed read against its key's version order. The reads that
    /// fail are recorded in `incompatible` and reported once per key (a single bad long read
    /// can conflict with every other read). Returns, per read, whether it is a prefix.
    fn check_read_prefixes(&mut self, reads: &[ReadRef]) -> Vec<bool> {
        let mut compatible = vec![true; reads.len()];
        let mut conflicts: Vec<(u32, usize)> = Vec::new();
        for (i, r) in reads.iter().enumerate() {
            if !self.order(r.kid).starts_with(read_list(self.txns, r.txn, r.op)) {
                compatible[i] = false;
                self.incompatible.insert((r.txn, r.op));
                conflicts.push((r.kid, i));
            }
        }
        conflicts.sort_by_key(|&(kid, _)| kid);
        for group in conflicts.chunk_by(|a, b| a.0 == b.0) {
            let kid = group[0].0;
            let members: Vec<ReadRef> = group.iter().map(|&(_, i)| reads[i]).collect();
            self.incompatible_order(kid, &members);
        }
        compatible
    }

    /// For each key holding garbage or aborted values (`bad`), the (length, transaction) of its
    /// reads that are prefixes of the version order, shortest first, so that the shortest read
    /// containing a position is found by binary search. Other keys are left out: no reader of
    /// theirs is ever looked for.
    fn prefix_reads_by_length(
        &self,
        reads: &[ReadRef],
        compatible: &[bool],
        bad: &[(u32, u32)],
    ) -> FxMap<u32, Vec<(usize, u32)>> {
        let mut by_key: FxMap<u32, Vec<(usize, u32)>> = FxMap::default();
        for &(kid, _) in bad {
            by_key.entry(kid).or_default();
        }
        for (i, r) in reads.iter().enumerate() {
            if !compatible[i] {
                continue;
            }
            if let Some(v) = by_key.get_mut(&r.kid) {
                v.push((read_list(self.txns, r.txn, r.op).len(), r.txn));
            }
        }
        for v in by_key.values_mut() {
            v.sort_unstable();
        }
        by_key
    }

    /// Reports the garbage / aborted values in the version orders (`bad`, as (key, position)),
    /// each attributed to the committed reader with the shortest read that contains it
    /// (`readers`, from `prefix_reads_by_length`), else to the key's longest read.
    fn report_bad_order_values(
        &mut self,
        bad: &[(u32, u32)],
        readers: &FxMap<u32, Vec<(usize, u32)>>,
        reported: &mut FxSet<(u32, u64)>,
    ) {
        for &(kid, p) in bad {
            let Some(&v) = self.order(kid).get(p as usize) else {
                continue;
            };
            if !reported.insert((kid, v)) {
                continue;
            }
            let reader = readers
                .get(&kid)
                .and_then(|rs| {
                    let i = rs.partition_point(|&(len, _)| len <= p as usize);
                    rs.get(i).map(|&(_, t)| t)
                })
                .or_else(|| self.longest[kid as usize].map(|l| l.txn))
                .unwrap_or(NONE);
            self.bad_value(kid, v, reader);
        }
    }

    /// The values of reads that are not prefixes of the version order, which positioning did
    /// not see: promotes their unknown writers as observed, and reports the garbage and aborted
    /// ones not `reported` already.
    fn check_incompatible_read_values(
        &mut self,
        reads: &[ReadRef],
        compatible: &[bool],
        reported: &mut FxSet<(u32, u64)>,
    ) {
        for (i, r) in reads.iter().enumerate() {
            if compatible[i] {
                continue;
            }
            for &v in read_list(self.txns, r.txn, r.op) {
                let w = self.vals.get(&(r.kid, v)).map_or(NONE, |i| i.writer);
                match self.status(w) {
                    Some(Status::Committed) => {}
                    Some(Status::Unknown) => self.in_graph[w as usize] = true,
                    None | Some(Status::Aborted) => {
                        if reported.insert((r.kid, v)) {
                            self.bad_value(r.kid, v, r.txn);
                        }
                    }
                }
            }
        }
    }

    /// Reports the committed reads of key `kid` that are not prefixes of its longest read.
    fn incompatible_order(&mut self, kid: u32, conflicting: &[ReadRef]) {
        const MAX_IDS: usize = 32;
        let order = self.order(kid);
        let reference = self.longest[kid as usize].map_or(NONE, |l| l.txn);
        let Some(first) = conflicting.first() else {
            return;
        };
        let list = read_list(self.txns, first.txn, first.op);
        let at = list.iter().zip(order).position(|(a, b)| a != b).unwrap_or(order.len().min(list.len()));
        let (a, b, k) = (self.id(reference), self.id(first.txn), self.key(kid));
        let seen = |l: &[u64]| l.get(at).map_or("nothing".to_string(), |v| v.to_string());
        let mut ids = vec![a];
        for r in conflicting {
            let id = self.id(r.txn);
            if ids.len() < MAX_IDS && !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut text = format!(
            "T{a} read key {k} as {} and T{b} read it as {}; neither is a prefix of the other \
             (at index {at} T{a} saw {} but T{b} saw {}), so no single version order of key {k} \
             explains both",
            fmt_list(order),
            fmt_list(list),
            seen(order),
            seen(list)
        );
        if conflicting.len() > 1 {
            let _ = write!(
                text,
                "; {} committed reads of key {k} in all are not prefixes of T{a}'s read{}",
                conflicting.len(),
                if ids.len() == MAX_IDS { " (first ones listed)" } else { "" }
            );
        }
        self.report(AnomalyKind::IncompatibleOrder, ids, text);
    }

    /// Reports a read value that is garbage or was appended by an aborted transaction.
    fn bad_value(&mut self, kid: u32, v: u64, reader: u32) {
        let w = self.vals.get(&(kid, v)).map_or(NONE, |i| i.writer);
        let (r, k) = (self.id(reader), self.key(kid));
        if w == NONE {
            self.report(
                AnomalyKind::GarbageRead,
                vec![r],
                format!("T{r} read value {v} of key {k}, which no transaction appended"),
            );
        } else {
            let a = self.id(w);
            self.report(
                AnomalyKind::G1a,
                vec![a, r],
                format!(
                    "aborted read: T{r} (committed) read value {v} of key {k}, which was \
                     appended by T{a}, an aborted transaction"
                ),
            );
        }
    }

    // ---------------------------------------------------------------- pass 3: dependencies

    /// Builds ww, wr and rw edges; reports intermediate reads (G1b) and reads of a
    /// transaction's own future appends.
    fn dependencies(&mut self) -> Vec<Edge> {
        let txns = self.txns;
        let mut edges = Vec::new();
        for (kid, ws) in self.order_info.iter().enumerate() {
            for p in 1..ws.len() {
                let (a, b) = (ws[p - 1].writer, ws[p].writer);
                if a != b && self.graph_node(a) && self.graph_node(b) {
                    edges.push(Edge { from: a, to: b, kind: WW, kid: kid as u32, x: p as u64 });
                }
            }
        }
        let ext = std::mem::take(&mut self.ext);
        for e in &ext {
            let (t, kid) = (e.txn, e.kid);
            let full = read_list(txns, t, e.op);
            let list = &full[..(e.len as usize).min(full.len())];
            let mut no_rw_to = NONE;
            let compatible = !self.incompatible.contains(&(t, e.op));
            let next = match list.last() {
                None => Some(0usize),
                Some(&last) => {
                    // A read that is a prefix of the version order ends at position len - 1,
                    // whose writer is known without a hash lookup.
                    let slot = if compatible {
                        self.order_info[kid as usize].get(list.len() - 1).copied()
                    } else {
                        self.vals.get(&(kid, last)).map(|i| Slot { writer: i.writer, last_in_txn: i.last_in_txn })
                    };
                    let w = slot.map_or(NONE, |s| s.writer);
                    if w == t {
                        let (ti, k) = (self.id(t), self.key(kid));
                        self.report(
                            AnomalyKind::IncompatibleOrder,
                            vec![ti],
                            format!(
                                "internal inconsistency: T{ti} read key {k} as {}, ending with \
                                 {last}, a value T{ti} itself appended only later",
                                fmt_list(list)
                            ),
                        );
                        continue;
                    }
                    if self.graph_node(w) {
                        edges.push(Edge { from: w, to: t, kind: WR, kid, x: last });
                        if slot.is_some_and(|s| !s.last_in_txn) {
                            self.intermediate_read(w, t, kid, last);
                            no_rw_to = w;
                        }
                    }
                    Some(list.len())
                }
            };
            // The value after the read is only defined when the read is a prefix of the version
            // order; incompatible reads are already reported and yield no rw edge.
            let Some(next) = next.filter(|_| compatible) else {
                continue;
            };
            let x = self.order_info[kid as usize].get(next).map_or(NONE, |s| s.writer);
            if x != t && x != no_rw_to && self.graph_node(x) {
                edges.push(Edge { from: t, to: x, kind: RW, kid, x: next as u64 });
            }
        }
        self.ext = ext;
        edges
    }

    fn graph_node(&self, t: u32) -> bool {
        self.in_graph.get(t as usize).copied().unwrap_or(false)
    }

    fn intermediate_read(&mut self, w: u32, reader: u32, kid: u32, v: u64) {
        let key = self.key(kid);
        // The writer's next append to the key after `v`, for the explanation.
        let later = self.txns.get(w as usize).and_then(|t| {
            t.ops
                .iter()
                .filter_map(|op| match op {
                    Op::Append { key: k, value } if *k == key => Some(*value),
                    _ => None,
                })
                .skip_while(|&x| x != v)
                .nth(1)
        });
        let (a, r) = (self.id(w), self.id(reader));
        let later = later.map_or("another value".to_string(), |x| x.to_string());
        self.report(
            AnomalyKind::G1b,
            vec![a, r],
            format!(
                "intermediate read: T{r} read key {key} ending with {v}, which T{a} appended, \
                 but T{a} later appended {later} to key {key} in the same transaction, so T{r} \
                 observed T{a}'s state mid-transaction"
            ),
        );
    }

    // ---------------------------------------------------------------- pass 4: cycles

    fn cycles(&mut self, edges: &[Edge]) {
        let n = self.txns.len();
        let g = Csr::build(n, edges.iter().enumerate().map(|(i, e)| (e.from, e.to, e.kind, i as u32)));
        let (comp, ncomp) = tarjan(&g, ALL);
        // Group nodes by component (counting sort).
        let mut start = vec![0usize; ncomp + 1];
        for &c in &comp {
            start[c as usize + 1] += 1;
        }
        for c in 0..ncomp {
            start[c + 1] += start[c];
        }
        let mut fill = start.clone();
        let mut members = vec![0u32; n];
        for (v, &c) in comp.iter().enumerate() {
            members[fill[c as usize]] = v as u32;
            fill[c as usize] += 1;
        }
        drop(fill);
        let mut local = vec![NONE; n];
        let mut budget = SEARCH_BUDGET;
        let mut local_edges = Vec::new();
        for c in 0..ncomp {
            let nodes = &members[start[c]..start[c + 1]];
            if nodes.len() < 2 {
                continue;
            }
            for (i, &v) in nodes.iter().enumerate() {
                local[v as usize] = i as u32;
            }
            local_edges.clear();
            for &v in nodes {
                for e in g.out(v) {
                    let to = g.to[e];
                    if comp[to as usize] == c as u32 {
                        local_edges.push((local[v as usize], local[to as usize], g.kind[e], g.eid[e]));
                    }
                }
            }
            let lg = Csr::build(nodes.len(), local_edges.iter().copied());
            for cycle in find_cycles(&lg, &mut budget) {
                let hops: Vec<Edge> = cycle.iter().filter_map(|&e| edges.get(lg.eid[e] as usize).copied()).collect();
                self.cycle_anomaly(&hops);
            }
        }
    }

    /// Strict serializability: the dependency edges plus real-time order. Every strongly
    /// connected component of that graph that holds a real-time edge has a cycle through one,
    /// a transaction serialized before another that had ended before it started; one is
    /// reported per component (cycles of dependencies alone were reported already).
    fn realtime_cycles(&mut self, mut edges: Vec<Edge>) {
        let deps = edges.len();
        let points = self.realtime_edges(&mut edges);
        let n = self.txns.len() + points;
        let g = Csr::build(n, edges.iter().enumerate().map(|(i, e)| (e.from, e.to, e.kind, i as u32)));
        let (comp, _) = tarjan(&g, ALL | RT);
        let mut reported = FxSet::default();
        let mut bfs = Bfs::new(n);
        let mut unlimited = u64::MAX;
        for (i, e) in edges.iter().enumerate().skip(deps) {
            let c = comp[e.from as usize];
            if c != comp[e.to as usize] || !reported.insert(c) {
                continue;
            }
            let allow = |x: u32| comp[x as usize] == c;
            if let Search::Found(path) = bfs.search(&g, e.to, e.from, ALL | RT, allow, &mut unlimited) {
                let mut hops = vec![edges[i]];
                hops.extend(path.iter().map(|&h| edges[g.eid[h] as usize]));
                let hops = self.through_points(&hops);
                self.realtime_anomaly(&hops);
            }
        }
    }

    /// Real-time order between the transactions in the graph, as edges through *points*, nodes
    /// numbered past the transactions: a point stands for an instant between two events, every
    /// transaction that ended before it precedes it, each point precedes the next, and every
    /// transaction that starts after it (before the next) follows it. So `a` reaches `b` through
    /// points exactly when `a` ended before `b` started, in edges linear in the transactions.
    /// (Edges from each transaction of a frontier of ended ones, Elle's transitively reduced
    /// order, to each transaction that started while it stood took their product: a Rolis
    /// leader acknowledges thousands of commits at once as its watermark passes them, thousands
    /// start after them before one of those ends, and a 1 s run's check of its 658k
    /// transactions grew past 23 GB.) Unknown transactions in the graph have no known end: they
    /// follow, never precede. Transactions without times are left out. Returns how many points.
    fn realtime_edges(&self, edges: &mut Vec<Edge>) -> usize {
        // (time, 0 = start / 1 = end, txn): at equal times a start comes first (concurrent).
        let mut events: Vec<(u64, u8, u32)> = Vec::new();
        for (i, t) in self.txns.iter().enumerate().filter(|(i, _)| self.graph_node(*i as u32)) {
            let Some(start) = t.start_us else { continue };
            events.push((start, 0, i as u32));
            if let (Some(end), Status::Committed) = (t.end_us, t.status) {
                events.push((end.max(start), 1, i as u32));
            }
        }
        events.sort_unstable();
        let first_point = self.txns.len() as u32;
        let (mut points, mut last_point, mut ended) = (0u32, None, Vec::new());
        for (_, kind, t) in events {
            if kind == 1 {
                ended.push(t);
                continue;
            }
            // A start after ends the last point does not cover: a new point covers them.
            if !ended.is_empty() {
                let p = first_point + points;
                points += 1;
                edges.extend(last_point.map(|l| Edge::realtime(l, p)));
                edges.extend(ended.drain(..).map(|a| Edge::realtime(a, p)));
                last_point = Some(p);
            }
            edges.extend(last_point.map(|p| Edge::realtime(p, t)));
        }
        points as usize
    }

    /// A cycle's hops with the runs through points made single real-time edges between the
    /// transactions at their ends (a cycle holds a transaction: points only lead forward).
    fn through_points(&self, hops: &[Edge]) -> Vec<Edge> {
        let txns = self.txns.len() as u32;
        let start = hops.iter().position(|e| e.from < txns).unwrap_or(0);
        let mut out = Vec::with_capacity(hops.len());
        let mut entered = None;
        for e in hops[start..].iter().chain(&hops[..start]) {
            match (e.from < txns, e.to < txns) {
                (true, true) => out.push(*e),
                (true, false) => entered = Some(e.from),
                (false, false) => {}
                (false, true) => {
                    let from = entered.take().expect("a run through points is entered from a transaction");
                    out.push(Edge::realtime(from, e.to));
                }
            }
        }
        out
    }

    fn realtime_anomaly(&mut self, hops: &[Edge]) {
        let start = (0..hops.len()).min_by_key(|&i| (self.id(hops[i].from), i)).unwrap_or(0);
        let hops: Vec<Edge> = hops[start..].iter().chain(&hops[..start]).copied().collect();
        let ids: Vec<u64> = hops.iter().map(|e| self.id(e.from)).collect();
        let path: Vec<String> = ids.iter().chain(ids.first()).map(|i| format!("T{i}")).collect();
        let mut text = if hops.len() <= 2 * EXPLAIN_EDGES {
            format!("cycle {}", path.join(" -> "))
        } else {
            format!("cycle of {} transactions starting at {}", ids.len(), path[0])
        };
        text.push_str(", through real-time order: ");
        let described: Vec<String> = hops.iter().take(EXPLAIN_EDGES).map(|e| self.describe(e)).collect();
        text.push_str(&described.join("; "));
        if hops.len() > EXPLAIN_EDGES {
            let _ = write!(text, "; ... and {} more edges", hops.len() - EXPLAIN_EDGES);
        }
        text.push_str(
            ". Serializable, perhaps, but not strictly: a transaction is ordered before one that ended before it started.",
        );
        self.report(AnomalyKind::Realtime, ids, text);
    }

    fn cycle_anomaly(&mut self, hops: &[Edge]) {
        if hops.is_empty() {
            return;
        }
        let rw = hops.iter().filter(|e| e.kind == RW).count();
        let wr = hops.iter().filter(|e| e.kind == WR).count();
        let kind = match (rw, wr) {
            (0, 0) => AnomalyKind::G0,
            (0, _) => AnomalyKind::G1c,
            (1, _) => AnomalyKind::GSingle,
            _ => AnomalyKind::G2,
        };
        // Rotate so that the smallest transaction id comes first (deterministic output).
        let start = (0..hops.len()).min_by_key(|&i| (self.id(hops[i].from), i)).unwrap_or(0);
        let hops: Vec<Edge> = hops[start..].iter().chain(&hops[..start]).copied().collect();
        let ids: Vec<u64> = hops.iter().map(|e| self.id(e.from)).collect();
        let mut text = String::new();
        let path: Vec<String> = ids.iter().chain(ids.first()).map(|i| format!("T{i}")).collect();
        if hops.len() <= 2 * EXPLAIN_EDGES {
            let _ = write!(text, "cycle {}", path.join(" -> "));
        } else {
            let _ = write!(text, "cycle of {} transactions starting at {}", ids.len(), path[0]);
        }
        let what = match kind {
            AnomalyKind::G0 => "write cycle (ww edges only)",
            AnomalyKind::G1c => "circular information flow (ww/wr edges only)",
            AnomalyKind::GSingle => "read skew (exactly one anti-dependency)",
            _ => "anti-dependency cycle (two or more rw edges)",
        };
        let _ = write!(text, ", a {what}: ");
        let described: Vec<String> = hops.iter().take(EXPLAIN_EDGES).map(|e| self.describe(e)).collect();
        text.push_str(&described.join("; "));
        if hops.len() > EXPLAIN_EDGES {
            let _ = write!(text, "; ... and {} more edges", hops.len() - EXPLAIN_EDGES);
        }
        text.push_str(". Each transaction must be serialized after the previous one, which is impossible in a cycle.");
        self.report(kind, ids, text);
    }

    fn describe(&self, e: &Edge) -> String {
        if e.kind == RT {
            let (ta, tb) = (&self.txns[e.from as usize], &self.txns[e.to as usize]);
            let us = |t: Option<u64>| t.map_or("?".to_string(), |t| t.to_string());
            return format!(
                "T{} -rt-> T{}: T{} ended at {} us, before T{} started at {} us",
                ta.id,
                tb.id,
                ta.id,
                us(ta.end_us),
                tb.id,
                us(tb.start_us)
            );
        }
        let (a, b, k) = (self.id(e.from), self.id(e.to), self.key(e.kid));
        let order = self.order(e.kid);
        let at = |p: Option<usize>| p.and_then(|p| order.get(p)).map_or("?".to_string(), |v| v.to_string());
        match e.kind {
            WW => {
                let p = e.x as usize;
                format!(
                    "T{a} -ww-> T{b}: T{a} appended {} to key {k} and T{b} appended {} right after it",
                    at(p.checked_sub(1)),
                    at(Some(p))
                )
            }
            WR => format!("T{a} -wr-> T{b}: T{b} read key {k} ending with {}, which T{a} appended", e.x),
            _ => {
                let p = e.x as usize;
                match p.checked_sub(1) {
                    None => format!(
                        "T{a} -rw-> T{b}: T{a} read key {k} as empty, but T{b} appended {}, its \
                         first value",
                        at(Some(p))
                    ),
                    Some(q) => format!(
                        "T{a} -rw-> T{b}: T{a} read key {k} ending with {}, but T{b} appended {}, \
                         the next value after it",
                        at(Some(q)),
                        at(Some(p))
                    ),
                }
            }
        }
    }

    // ---------------------------------------------------------------- pass 5: durability

    /// If the last line is a committed read-only transaction, every append of a committed
    /// transaction (that finished before it started, when both times are known) to a key it
    /// read must appear in that read.
    fn lost_appends(&mut self) {
        self.appends_missing_from_retires();
        let txns = self.txns;
        let Some(fin) = self.final_txn.and_then(|f| txns.get(f as usize)) else {
            return;
        };
        // Keys the final transaction read, with the length of its (longest) read of each.
        let mut final_len: Vec<Option<usize>> = vec![None; self.key_names.len()];
        for op in &fin.ops {
            if let Op::Read { key, list: Some(list), .. } = op {
                if let Some(l) = self.keys.get(key).and_then(|&k| final_len.get_mut(k as usize)) {
                    *l = Some(l.map_or(list.len(), |n| n.max(list.len())));
                }
            }
        }
        // `in_final` was set while building version orders: one sequential scan of the value
        // table finds the missing committed appends.
        let mut lost: Vec<(u32, u32, u64)> = self
            .vals
            .iter()
            .filter(|(&(kid, _), i)| {
                !i.in_final
                    && self.status(i.writer) == Some(Status::Committed)
                    && final_len.get(kid as usize).copied().flatten().is_some()
            })
            .map(|(&(kid, v), i)| (i.writer, kid, v))
            .collect();
        lost.sort_unstable();
        for (w, kid, value) in lost {
            let Some(t) = txns.get(w as usize) else {
                continue;
            };
            if let (Some(end), Some(start)) = (t.end_us, fin.start_us) {
                if end > start {
                    // Still running when the final read started: it may serialize after it.
                    continue;
                }
            }
            let (w, f, key) = (t.id, fin.id, self.key(kid));
            let len = final_len.get(kid as usize).copied().flatten().unwrap_or(0);
            self.report(
                AnomalyKind::LostAppend,
                vec![w, f],
                format!(
                    "lost append: T{w} committed appending {value} to key {key}, but the final \
                     read of key {key} by T{f} ({len} values) does not contain it"
                ),
            );
        }
    }

    /// Every committed append to a key a committed transaction retired must be in that
    /// transaction's read of it (whatever the times: no append may follow a retire).
    fn appends_missing_from_retires(&mut self) {
        let txns = self.txns;
        let mut retires: Vec<(u32, u32, &[u64])> = Vec::new();
        for (ti, t) in txns.iter().enumerate().filter(|(_, t)| t.status == Status::Committed) {
            for op in &t.ops {
                if let (Op::Read { list: Some(list), retires: true, .. }, Some(&kid)) = (op, self.keys.get(&op.key())) {
                    retires.push((kid, ti as u32, list));
                }
            }
        }
        if retires.is_empty() {
            return;
        }
        let mut by_key: FxMap<u32, Vec<(u32, FxSet<u64>)>> = FxMap::default();
        for (kid, ti, list) in retires {
            by_key.entry(kid).or_default().push((ti, list.iter().copied().collect()));
        }
        let mut lost: Vec<(u32, u32, u64, u32)> = Vec::new();
        for (&(kid, v), i) in &self.vals {
            if self.status(i.writer) != Some(Status::Committed) {
                continue;
            }
            for (reader, held) in by_key.get(&kid).map_or(&[][..], |r| &r[..]) {
                if !held.contains(&v) {
                    lost.push((i.writer, kid, v, *reader));
                }
            }
        }
        lost.sort_unstable();
        for (w, kid, value, r) in lost {
            let (w, r, key) = (self.id(w), self.id(r), self.key(kid));
            self.report(
                AnomalyKind::LostAppend,
                vec![w, r],
                format!(
                    "lost append: T{w} committed appending {value} to key {key}, but T{r}, which \
                     retired key {key}, read it without {value}"
                ),
            );
        }
    }

    fn finish(mut self) -> CheckReport {
        self.anomalies.sort_by_key(|a| a.kind);
        let mut counts = BTreeMap::new();
        for a in &self.anomalies {
            *counts.entry(a.kind.as_str().to_string()).or_insert(0) += 1;
        }
        CheckReport {
            valid: self.anomalies.is_empty(),
            txns: self.txns.len(),
            committed: self.txns.iter().filter(|t| t.status == Status::Committed).count(),
            anomalies: self.anomalies,
            counts,
        }
    }
}

/// Finds representative cycles in one strongly connected component (a local graph in which
/// every node reaches every other): at most one each of G0 (ww only), G1c (ww/wr with a wr),
/// G-single (exactly one rw) and G2 (two or more rw). Returns cycles as local edge lists.
fn find_cycles(g: &Csr, budget: &mut u64) -> Vec<Vec<usize>> {
    let mut bfs = Bfs::new(g.nodes());
    let mut out = Vec::new();
    let mut unlimited = u64::MAX;
    let mut close = |bfs: &mut Bfs, e: usize, mask: u8, allow: &dyn Fn(u32) -> bool| match bfs.search(
        g,
        g.to[e],
        g.from[e],
        mask,
        allow,
        &mut unlimited,
    ) {
        Search::Found(mut path) => {
            path.insert(0, e);
            Some(path)
        }
        _ => None,
    };
    let m = g.edges();

    // G0: a ww edge inside a ww-only SCC.
    let (c_ww, _) = tarjan(g, WW);
    if let Some(e) = (0..m).find(|&e| g.kind[e] == WW && c_ww[g.from[e] as usize] == c_ww[g.to[e] as usize]) {
        out.extend(close(&mut bfs, e, WW, &|_| true));
    }
    // G1c: a wr edge inside a ww+wr SCC.
    let (c2, _) = tarjan(g, WW | WR);
    let same2 = |e: usize| c2[g.from[e] as usize] == c2[g.to[e] as usize];
    if let Some(e) = (0..m).find(|&e| g.kind[e] == WR && same2(e)) {
        out.extend(close(&mut bfs, e, WW | WR, &|_| true));
    }
    // G-single: an rw edge u -> v with a ww/wr path v ->* u. G2: an rw edge without one (then
    // every cycle through it has another rw edge). Tarjan numbers ww/wr components in reverse
    // topological order, so v can only reach u through ww/wr edges if c2[v] >= c2[u].
    let mut single: Option<usize> = None;
    let mut g2: Option<usize> = None;
    let mut ambiguous = Vec::new();
    for e in (0..m).filter(|&e| g.kind[e] == RW) {
        let (u, v) = (c2[g.from[e] as usize], c2[g.to[e] as usize]);
        if u == v {
            single.get_or_insert(e);
        } else if v < u {
            g2.get_or_insert(e);
        } else {
            ambiguous.push(e);
        }
        if single.is_some() && g2.is_some() {
            break;
        }
    }
    let mut single_cycle = single.and_then(|e| {
        let c = c2[g.from[e] as usize];
        close(&mut bfs, e, WW | WR, &|x| c2[x as usize] == c)
    });
    let mut gave_up = false;
    if single_cycle.is_none() || g2.is_none() {
        for &e in &ambiguous {
            if single_cycle.is_some() && g2.is_some() {
                break;
            }
            let (lo, hi) = (c2[g.from[e] as usize], c2[g.to[e] as usize]);
            let allow = |x: u32| (lo..=hi).contains(&c2[x as usize]);
            match bfs.search(g, g.to[e], g.from[e], WW | WR, allow, budget) {
                Search::Found(mut path) => {
                    if single_cycle.is_none() {
                        path.insert(0, e);
                        single_cycle = Some(path);
                    }
                }
                Search::Unreachable => {
                    g2.get_or_insert(e);
                }
                Search::GaveUp => {
                    gave_up = true;
                    break;
                }
            }
        }
    }
    out.extend(single_cycle);
    if let Some(e) = g2 {
        out.extend(close(&mut bfs, e, ALL, &|_| true));
    } else if gave_up && out.is_empty() {
        // Budget exhausted: still report the SCC, classified by whatever cycle we find.
        if let Some(e) = (0..m).find(|&e| g.kind[e] == RW) {
            out.extend(close(&mut bfs, e, ALL, &|_| true));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A committed transaction that appends to its own key, from `start_us` to `end_us`.
    fn txn(id: u64, start_us: u64, end_us: u64) -> Txn {
        let ops = vec![Op::Append { key: id, value: id }];
        Txn { id, status: Status::Committed, ops, start_us: Some(start_us), end_us: Some(end_us) }
    }

    /// Commits acknowledged together (a Rolis leader releases every commit below the watermark
    /// at once, thousands after a failover), then as many transactions started after them: each
    /// of the later ones follows each of the earlier ones in real time, and the graph says so in
    /// edges linear in the transactions. Edges from each acknowledged commit to each later start
    /// (2,000 x 2,000 here) made a 1 s Rolis run's check grow past 23 GB.
    #[test]
    fn real_time_order_takes_edges_linear_in_the_transactions() {
        let burst = 2_000u64;
        let acknowledged = (0..burst).map(|i| txn(i, i, 10_000));
        let after = (0..burst).map(|i| txn(burst + i, 10_001 + i, 30_000 + i));
        let txns: Vec<Txn> = acknowledged.chain(after).collect();
        let cx = Ctx::new(&txns, txns.len(), 0);
        let mut edges = Vec::new();
        cx.realtime_edges(&mut edges);
        assert!(
            edges.len() <= 3 * txns.len(),
            "{} real-time edges for {} transactions: the order takes their product",
            edges.len(),
            txns.len()
        );
    }

    /// Real-time order through points reaches exactly what edges between every pair (`a`
    /// ended before `b` started) reach: over random histories, serial in a random order but
    /// timed at random, the graph with points has as many components with a cycle through
    /// real-time order (one anomaly each) as the graph with every pair's edge.
    #[test]
    fn real_time_order_through_points_finds_what_every_pair_s_edges_find() {
        let mut seed = 0x5eed_u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % n
        };
        let mut found = 0;
        for _ in 0..300 {
            // Transactions run one after another on lists of three keys; then each is given
            // a random interval, so that real time often disagrees with the serial order.
            let (mut lists, mut value) = (vec![Vec::new(); 3], 0u64);
            let txns: Vec<Txn> = (0..2 + next(12))
                .map(|id| {
                    let ops = (0..1 + next(3))
                        .map(|_| {
                            let key = next(3);
                            let list = &mut lists[key as usize];
                            if next(2) == 0 {
                                return Op::Read { key, list: Some(list.clone()), retires: false };
                            }
                            value += 1;
                            list.push(value);
                            Op::Append { key, value }
                        })
                        .collect();
                    let status = if next(8) == 0 { Status::Unknown } else { Status::Committed };
                    let start = next(40);
                    let end = (next(4) > 0).then(|| start + next(20));
                    Txn { id, status, ops, start_us: (next(10) > 0).then_some(start), end_us: end }
                })
                .collect();
            let mut cx = Ctx::new(&txns, txns.len() * 3, txns.len() * 3);
            cx.index();
            cx.version_orders();
            let deps = cx.dependencies();
            let before = cx.anomalies.len();
            cx.realtime_cycles(deps.clone());
            let reported = cx.anomalies[before..].iter().filter(|a| a.kind == AnomalyKind::Realtime).count();

            let mut every_pair = deps.clone();
            for (a, ta) in txns.iter().enumerate().filter(|(a, _)| cx.graph_node(*a as u32)) {
                let (Some(sa), Some(ea), Status::Committed) = (ta.start_us, ta.end_us, ta.status) else { continue };
                for (b, tb) in txns.iter().enumerate().filter(|(b, _)| cx.graph_node(*b as u32)) {
                    if tb.start_us.is_some_and(|sb| ea.max(sa) < sb) {
                        every_pair.push(Edge::realtime(a as u32, b as u32));
                    }
                }
            }
            let g = Csr::build(txns.len(), every_pair.iter().map(|e| (e.from, e.to, e.kind, 0)));
            let (comp, _) = tarjan(&g, ALL | RT);
            let expected: FxSet<u32> = every_pair[deps.len()..]
                .iter()
                .filter(|e| comp[e.from as usize] == comp[e.to as usize])
                .map(|e| comp[e.from as usize])
                .collect();
            assert_eq!(reported, expected.len(), "{txns:?}");
            found += reported;
        }
        assert!(found > 50, "the random histories hold real-time cycles: {found}");
    }
}
