//! Detock's dependency graph (thesis §4.2, Algorithm 3) and its deterministic deadlock
//! resolution, as an order in which to hand transactions on: a vertex per transaction, an edge
//! from each earlier transaction to a later one that conflicts with it on a key, and a
//! transaction *emitted* (handed to the lock manager, which runs conflicting transactions in
//! the order it was handed them) once all its pieces are in and every transaction it depends
//! on was emitted. Two replicas that add the same pieces, each key's in the same order but the
//! keys' streams interleaved differently, emit every two conflicting transactions in the same
//! order: that is what lets every region run the same transactions on its own copy with no
//! protocol between them.
//!
//! Keys are `(key, home)` in the thesis; here a key names its home (`K` is whatever the caller
//! makes it), and all of one key's requests must come from one stream, in that stream's
//! order. A read depends on the key's last writer; a write on the readers since the last writer,
//! or on that writer when none read since (the repository's queue tails; Definition 4.2.1 read
//! with shared reads). Only transactions not yet emitted are kept: an emitted one is before
//! every later arrival at every replica already, so it needs no edge.
//!
//! Pieces from different streams can cross (T1 before T2 on a key homed in one region, T2
//! before T1 on one homed in another), and then the graph has a cycle that no waiting ends.
//! [`DependencyGraph::resolve`], run every `ddr_us`, resolves the cycles of the *stable* part
//! of the graph: the complete vertices that no incomplete vertex reaches. A stable vertex can
//! gain no edge into it (edges only enter the transaction whose piece arrives), so its strongly
//! connected component is final, and every replica finds the same one whenever it looks
//! (Lemmas 4.2.3 and 4.2.4). Each such component drops its internal edges and is emitted as one
//! block, its members in ascending id, once its edges from outside are all satisfied: a block
//! rather than the thesis's chain, so that a later transaction that depends on one member is
//! emitted after all of them (with a chain, it could be emitted between two members it
//! conflicts with, in a different place at each replica). Nothing aborts for a deadlock.

use crate::protocols::graph::Graph;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::hash::Hash;

/// How a transaction uses a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Use {
    Write,
    Read,
}

/// A key's conflicts still pending: its last writer (not emitted) and the readers since. A
/// long list of readers (a partition's, which every write in it reads) may still name some
/// that were emitted: forgetting each at once would cost a pass over the list per emission,
/// so the list is swept once as many as half of it were emitted (`stale`, an upper bound), and
/// a writer that takes the list skips them.
#[derive(Serialize, Deserialize)]
struct Tail<T> {
    writer: Option<T>,
    readers: Vec<T>,
    /// Readers emitted since the last sweep (at least those of them still in the list).
    stale: usize,
}

/// Readers a tail forgets at once, as each is emitted; a longer list is swept lazily.
const EAGER_READERS: usize = 8;

/// A transaction not yet emitted.
#[derive(Serialize, Deserialize)]
struct Vertex<T, K> {
    /// Pieces still to arrive.
    pieces_left: u32,
    /// Transactions it depends on that were not emitted yet.
    waits: usize,
    /// Transactions that depend on it.
    succs: Vec<T>,
    keys: Vec<K>,
    /// The resolved component it is emitted with (named by its smallest member).
    group: Option<T>,
}

/// A resolved strongly connected component: emitted as a block once none of its members
/// waits.
#[derive(Serialize, Deserialize)]
struct Group<T> {
    members: Vec<T>,
    waiting: usize,
}

/// What deadlock resolution has found so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    /// Components of two transactions or more, each one deadlock.
    pub deadlocks: u64,
    /// Transactions in them (over `deadlocks`: the mean cycle size).
    pub transactions: u64,
    /// The largest component.
    pub largest: usize,
}

/// A scheduler's checkpoint holds it as it is (`Serialize`).
#[derive(Serialize, Deserialize)]
#[serde(bound(
    serialize = "T: Serialize + Eq + Hash, K: Serialize + Eq + Hash",
    deserialize = "T: Deserialize<'de> + Eq + Hash, K: Deserialize<'de> + Eq + Hash"
))]
pub struct DependencyGraph<T, K> {
    tails: FxHashMap<K, Tail<T>>,
    vertices: FxHashMap<T, Vertex<T, K>>,
    groups: FxHashMap<T, Group<T>>,
    resolved: Resolved,
}

impl<T: Copy + Ord + Hash + std::fmt::Debug, K: Copy + Ord + Hash> Default for DependencyGraph<T, K> {
    fn default() -> Self {
        DependencyGraph {
            tails: FxHashMap::default(),
            vertices: FxHashMap::default(),
            groups: FxHashMap::default(),
            resolved: Resolved::default(),
        }
    }
}

impl<T: Copy + Ord + Hash + std::fmt::Debug, K: Copy + Ord + Hash> DependencyGraph<T, K> {
    /// Transactions added and not emitted.
    pub fn len(&self) -> usize {
        self.vertices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vertices.is_empty()
    }

    pub fn contains(&self, txn: T) -> bool {
        self.vertices.contains_key(&txn)
    }

    pub fn resolved(&self) -> Resolved {
        self.resolved
    }

    /// Add one of the `pieces` pieces of `txn` (the first creates its vertex; no two pieces
    /// name one key), with the keys it uses; push what can be emitted now to `emitted`, in
    /// order.
    pub fn add_piece(&mut self, txn: T, pieces: u32, keys: impl IntoIterator<Item = (K, Use)>, emitted: &mut Vec<T>) {
        assert!(pieces > 0, "a transaction has at least one piece");
        let mut keys: Vec<(K, Use)> = keys.into_iter().collect();
        keys.sort_unstable(); // A key both written and read is written: Write sorts first.
        keys.dedup_by_key(|(k, _)| *k);
        let mut preds = Vec::new();
        let vertices = &self.vertices;
        for &(key, used) in &keys {
            let tail = self.tails.entry(key).or_insert_with(|| Tail { writer: None, readers: Vec::new(), stale: 0 });
            match used {
                Use::Read => {
                    preds.extend(tail.writer);
                    tail.readers.push(txn);
                }
                Use::Write => {
                    match tail.readers.is_empty() {
                        true => preds.extend(tail.writer),
                        false => preds.append(&mut tail.readers),
                    }
                    tail.stale = 0;
                    tail.writer = Some(txn);
                }
            }
        }
        // Readers swept lazily may have been emitted (and `txn`'s own earlier piece is no edge).
        preds.retain(|p| *p != txn && vertices.contains_key(p));
        preds.sort_unstable();
        preds.dedup();
        for p in &preds {
            self.vertices.get_mut(p).expect("a tail names only transactions not emitted").succs.push(txn);
        }
        let v = self.vertices.entry(txn).or_insert_with(|| Vertex {
            pieces_left: pieces,
            waits: 0,
            succs: Vec::new(),
            keys: Vec::new(),
            group: None,
        });
        assert!(v.pieces_left > 0, "{txn:?} adds more pieces than it has");
        v.pieces_left -= 1;
        v.waits += preds.len();
        v.keys.extend(keys.iter().map(|(k, _)| *k));
        if v.pieces_left == 0 && v.waits == 0 {
            self.emit_from(vec![vec![txn]], emitted);
        }
    }

    /// Emit the transactions of `ready` (complete, waiting for none), and every one that then
    /// is. A resolved block goes out whole, its members in ascending id, before anything its
    /// members freed.
    fn emit_from(&mut self, mut ready: Vec<Vec<T>>, emitted: &mut Vec<T>) {
        while let Some(unit) = ready.pop() {
            let mut freed = Vec::new();
            for txn in unit {
                let v = self.vertices.remove(&txn).expect("only a vertex is emitted");
                debug_assert!(v.pieces_left == 0 && v.waits == 0, "{txn:?} is emitted complete and waiting for none");
                emitted.push(txn);
                self.forget_in_tails(txn, &v.keys);
                for s in v.succs {
                    let succ = self.vertices.get_mut(&s).expect("a successor is not emitted before its predecessor");
                    succ.waits -= 1;
                    if succ.waits > 0 || succ.pieces_left > 0 {
                        continue;
                    }
                    let Some(g) = succ.group else {
                        freed.push(vec![s]);
                        continue;
                    };
                    let group = self.groups.get_mut(&g).expect("a member's group");
                    group.waiting -= 1;
                    if group.waiting == 0 {
                        freed.push(self.groups.remove(&g).expect("the group").members);
                    }
                }
            }
            // The smallest first: popped last, so pushed in descending order.
            freed.sort_unstable_by(|a, b| b[0].cmp(&a[0]));
            ready.extend(freed);
        }
    }

    /// `txn` was emitted: its keys' tails forget it (and a tail left empty goes).
    fn forget_in_tails(&mut self, txn: T, keys: &[K]) {
        for key in keys {
            // A later writer's arrival (or a block's earlier member) may have replaced it.
            let Some(tail) = self.tails.get_mut(key) else { continue };
            if tail.readers.len() <= EAGER_READERS {
                tail.readers.retain(|r| *r != txn);
            } else {
                tail.stale += 1;
                if 2 * tail.stale >= tail.readers.len() {
                    let vertices = &self.vertices;
                    tail.readers.retain(|r| vertices.contains_key(r));
                    tail.stale = 0;
                }
            }
            if tail.writer == Some(txn) {
                tail.writer = None;
            }
            if tail.writer.is_none() && tail.readers.is_empty() {
                self.tails.remove(key);
            }
        }
    }

    /// Deterministic deadlock resolution: find the strongly connected components of the
    /// stable subgraph, drop their internal edges, and emit each as a block (see the module's
    /// comment); push what is emitted now to `emitted`. Returns the deadlocks found in this
    /// pass.
    pub fn resolve(&mut self, emitted: &mut Vec<T>) -> u64 {
        let components = self.stable_components();
        for members in &components {
            let group_id = members[0];
            for &m in members {
                let v = self.vertices.get_mut(&m).expect("a member");
                let (inside, outside): (Vec<T>, Vec<T>) =
                    std::mem::take(&mut v.succs).into_iter().partition(|s| members.binary_search(s).is_ok());
                v.succs = outside;
                v.group = Some(group_id);
                for s in inside {
                    self.vertices.get_mut(&s).expect("a member").waits -= 1;
                }
            }
            let waiting = members.iter().filter(|m| self.vertices[m].waits > 0).count();
            self.resolved.deadlocks += 1;
            self.resolved.transactions += members.len() as u64;
            self.resolved.largest = self.resolved.largest.max(members.len());
            match waiting {
                0 => self.emit_from(vec![members.clone()], emitted),
                _ => {
                    self.groups.insert(group_id, Group { members: members.clone(), waiting });
                }
            }
        }
        components.len() as u64
    }

    /// The strongly connected components (two vertices or more) of the stable subgraph that
    /// are not resolved yet, each sorted.
    fn stable_components(&self) -> Vec<Vec<T>> {
        let mut unstable: FxHashSet<T> = FxHashSet::default();
        let mut stack: Vec<T> = self.vertices.iter().filter(|(_, v)| v.pieces_left > 0).map(|(t, _)| *t).collect();
        unstable.extend(stack.iter().copied());
        while let Some(t) = stack.pop() {
            for s in &self.vertices[&t].succs {
                if unstable.insert(*s) {
                    stack.push(*s);
                }
            }
        }
        let mut g = Graph::bounded(usize::MAX);
        for (t, v) in self.vertices.iter().filter(|(t, v)| v.group.is_none() && !unstable.contains(t)) {
            for s in v.succs.iter().filter(|s| !unstable.contains(s) && self.vertices[s].group.is_none()) {
                g.add_edge(*t, *s);
            }
        }
        g.components()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type G = DependencyGraph<u32, char>;

    fn add(g: &mut G, txn: u32, pieces: u32, keys: &[(char, Use)]) -> Vec<u32> {
        let mut out = Vec::new();
        g.add_piece(txn, pieces, keys.iter().copied(), &mut out);
        out
    }

    use Use::{Read as R, Write as W};

    #[test]
    fn single_home_transactions_form_a_dag_emitted_as_they_come_free() {
        let mut g = G::default();
        assert_eq!(add(&mut g, 1, 1, &[('a', W)]), vec![1], "nothing before it");
        assert_eq!(add(&mut g, 2, 1, &[('a', R)]), vec![2], "its writer was emitted: no edge");
        assert!(g.is_empty());
        // An incomplete transaction holds back what conflicts with it, and only that.
        assert_eq!(add(&mut g, 3, 2, &[('a', W)]), Vec::<u32>::new());
        assert_eq!(add(&mut g, 4, 1, &[('a', R)]), Vec::<u32>::new());
        assert_eq!(add(&mut g, 5, 1, &[('a', R), ('b', W)]), Vec::<u32>::new());
        assert_eq!(add(&mut g, 6, 1, &[('c', W)]), vec![6]);
        assert_eq!(add(&mut g, 7, 1, &[('a', W)]), Vec::<u32>::new(), "a writer waits for both readers");
        assert_eq!(add(&mut g, 3, 2, &[('d', R)]), vec![3, 4, 5, 7]);
        assert!(g.is_empty() && g.tails.is_empty(), "nothing is kept for emitted transactions");
    }

    /// A key read by many (a partition every write reads): its readers are forgotten lazily as
    /// they are emitted, a later writer waits for the live ones only, and nothing is kept once
    /// all are emitted.
    #[test]
    fn a_long_reader_list_forgets_emitted_readers_and_a_writer_waits_for_the_live_ones() {
        let mut g = G::default();
        assert_eq!(add(&mut g, 1, 2, &[('b', W)]), Vec::<u32>::new(), "holds back what reads b");
        for t in 10..40 {
            // Each reads the partition 'p'; the odd ones also wait behind 1 on 'b'.
            let keys: &[(char, Use)] = if t % 2 == 1 { &[('p', R), ('b', R)] } else { &[('p', R)] };
            let out = add(&mut g, t, 1, keys);
            assert_eq!(out, if t % 2 == 1 { vec![] } else { vec![t] }, "reader {t}");
        }
        assert_eq!(g.tails[&'p'].readers.iter().filter(|r| g.contains(**r)).count(), 15, "the odd ones are live");
        assert_eq!(add(&mut g, 50, 1, &[('p', W)]), Vec::<u32>::new(), "the writer waits for the live readers");
        assert_eq!(g.vertices[&50].waits, 15, "and for no emitted one");
        let out = add(&mut g, 1, 2, &[('c', W)]);
        let mut expected: Vec<u32> = vec![1];
        expected.extend((11..40).step_by(2));
        expected.push(50);
        assert_eq!(out, expected);
        assert!(g.is_empty() && g.tails.is_empty(), "nothing is kept for emitted transactions");
    }

    /// Three regions' logs whose pieces cross in a ring (as in Fig. 4.3): T1 before T2 on A
    /// (homed in US), T2 before T3 on B (EU), T3 before T1 on C (AP); all read-modify-writes.
    /// Every region's graph has the cycle, and resolution emits T1, T2, T3 whatever order the
    /// regions' logs interleave in, and whenever it runs.
    #[test]
    fn crossed_pieces_deadlock_and_resolve_to_one_order_at_every_interleaving() {
        // Each home's log, in its order: (txn, key).
        let us = [(1, 'a'), (2, 'a')];
        let eu = [(2, 'b'), (3, 'b')];
        let ap = [(3, 'c'), (1, 'c')];
        let logs = [&us[..], &eu[..], &ap[..]];
        let mut orders = Vec::new();
        // Every interleaving that keeps each log's order, by a seeded choice at each step.
        for seed in 0..64u32 {
            let mut g = G::default();
            let mut at = [0usize; 3];
            let mut out = Vec::new();
            let mut pick = seed;
            while at.iter().zip(&logs).any(|(i, l)| *i < l.len()) {
                let open: Vec<usize> = (0..3).filter(|l| at[*l] < logs[*l].len()).collect();
                let l = open[(pick % open.len() as u32) as usize];
                pick = pick / 2 + 7 * (pick % 3);
                let (txn, key) = logs[l][at[l]];
                at[l] += 1;
                g.add_piece(txn, 2, [(key, W)], &mut out);
                // Resolution may run at any moment: it must never decide early.
                g.resolve(&mut out);
            }
            g.resolve(&mut out);
            assert!(g.is_empty(), "seed {seed}: all emitted");
            assert_eq!(out, vec![1, 2, 3], "seed {seed}");
            orders.push(out);
        }
        let mut g = G::default();
        let mut out = Vec::new();
        for (txn, key) in [(1, 'a'), (2, 'a'), (2, 'b'), (3, 'b'), (3, 'c'), (1, 'c')] {
            g.add_piece(txn, 2, [(key, W)], &mut out);
        }
        assert!(out.is_empty(), "a deadlock: nothing runs before resolution");
        assert_eq!(g.resolve(&mut out), 1);
        assert_eq!(g.resolved(), Resolved { deadlocks: 1, transactions: 3, largest: 3 });
    }

    /// An incomplete transaction that can still join a cycle keeps it unresolved (the thesis's
    /// counter-example: resolving T1 and T2 before T3's pieces arrive would order them
    /// differently from a region that saw everything).
    #[test]
    fn a_cycle_reached_from_an_incomplete_vertex_waits() {
        let mut g = G::default();
        let mut out = Vec::new();
        g.add_piece(1, 2, [('a', W)], &mut out);
        g.add_piece(2, 2, [('a', W)], &mut out);
        g.add_piece(3, 2, [('a', W)], &mut out); // 3's other piece is not in yet.
        g.add_piece(2, 2, [('b', W)], &mut out);
        g.add_piece(1, 2, [('b', W)], &mut out);
        // 1 and 2 form a cycle, and 3 (incomplete) is after both: they are stable.
        assert_eq!(g.resolve(&mut out), 1);
        assert_eq!(out, vec![1, 2]);
        let mut g = G::default();
        out.clear();
        g.add_piece(3, 2, [('c', W)], &mut out); // 3 first on c, then 1 on c: 3 reaches 1.
        g.add_piece(1, 2, [('a', W), ('c', W)], &mut out);
        g.add_piece(2, 2, [('a', W)], &mut out);
        g.add_piece(2, 2, [('b', W)], &mut out);
        g.add_piece(1, 2, [('b', W)], &mut out);
        assert_eq!(g.resolve(&mut out), 0, "3 is incomplete and reaches the cycle");
        g.add_piece(3, 2, [('d', W)], &mut out);
        assert_eq!(out, vec![3], "3 waits for nothing");
        assert_eq!(g.resolve(&mut out), 1, "stable now");
        assert_eq!(out, vec![3, 1, 2]);
    }

    /// A transaction after a resolved block that depends on only one member still follows
    /// every member it conflicts with.
    #[test]
    fn a_block_goes_out_whole_before_its_successors() {
        let mut g = G::default();
        let mut out = Vec::new();
        g.add_piece(9, 1, [('z', W)], &mut out);
        out.clear();
        g.add_piece(2, 2, [('a', W)], &mut out);
        g.add_piece(1, 2, [('a', W), ('z', R)], &mut out);
        g.add_piece(1, 2, [('b', W)], &mut out);
        g.add_piece(2, 2, [('b', W)], &mut out);
        g.add_piece(5, 1, [('a', W)], &mut out); // Depends on 1 (the tail of a), conflicts with 2.
        assert_eq!(g.resolve(&mut out), 1);
        assert_eq!(out, vec![1, 2, 5]);
    }
}
