//! Cycles in a directed graph whose nodes are transaction ids (or any `Copy + Ord + Hash` id):
//! the search that 2PL's deadlock detector runs over its wait-for graph, kept apart from 2PL
//! because it is no part of two-phase commit: Detock's and Janus's dependency graphs, whose
//! strongly connected components they order deterministically, are the next users.
//!
//! Everything is deterministic: nodes and their successors are visited in ascending order, so
//! the same edges give the same components and cycles in the same order whatever order they
//! were added in, and a simulation that picks victims from a seeded generator replays exactly.
//! A graph holds at most the edges it was made for ([`Graph::bounded`]); an edge beyond that is
//! refused and counted, and a self-edge (a transaction waiting for itself, as an upgrade can
//! look) is ignored.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;

/// A directed graph of ids, successors kept in order.
#[derive(Debug, Clone)]
pub struct Graph<T> {
    succ: BTreeMap<T, BTreeSet<T>>,
    edges: usize,
    max_edges: usize,
    refused: usize,
}

impl<T: Copy + Ord + Hash> Graph<T> {
    /// An empty graph that takes at most `max_edges` edges.
    pub fn bounded(max_edges: usize) -> Self {
        Graph { succ: BTreeMap::new(), edges: 0, max_edges, refused: 0 }
    }

    /// Add the edge `from -> to`; false if it was there already, is a self-edge (ignored), or
    /// the graph is full (refused, counted in [`Graph::refused`]).
    pub fn add_edge(&mut self, from: T, to: T) -> bool {
        if from == to {
            return false;
        }
        if self.succ.get(&from).is_some_and(|s| s.contains(&to)) {
            return false;
        }
        if self.edges >= self.max_edges {
            self.refused += 1;
            return false;
        }
        self.succ.entry(to).or_default();
        self.succ.entry(from).or_default().insert(to);
        self.edges += 1;
        true
    }

    pub fn edges(&self) -> usize {
        self.edges
    }

    /// Edges refused because the graph was full.
    pub fn refused(&self) -> usize {
        self.refused
    }

    pub fn contains(&self, v: T) -> bool {
        self.succ.contains_key(&v)
    }

    /// Take `v` out with every edge into and out of it.
    pub fn remove_node(&mut self, v: T) {
        if let Some(out) = self.succ.remove(&v) {
            self.edges -= out.len();
        }
        for s in self.succ.values_mut() {
            if s.remove(&v) {
                self.edges -= 1;
            }
        }
    }

    /// The graph restricted to `members` (sorted).
    fn restricted(&self, members: &[T]) -> Graph<T> {
        let mut g = Graph::bounded(self.max_edges);
        for &v in members {
            for &s in self.succ.get(&v).into_iter().flatten() {
                if members.binary_search(&s).is_ok() {
                    g.add_edge(v, s);
                }
            }
        }
        g
    }

    /// The strongly connected components of two nodes or more (the ones that hold a cycle),
    /// each sorted, in the order of their smallest member. Tarjan's algorithm, with an explicit
    /// stack (a long chain of waits must not overflow the thread's).
    pub fn components(&self) -> Vec<Vec<T>> {
        let nodes: Vec<T> = self.succ.keys().copied().collect();
        let index_of: FxHashMap<T, usize> = nodes.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        let succ: Vec<Vec<usize>> = self.succ.values().map(|s| s.iter().map(|t| index_of[t]).collect()).collect();
        const UNSEEN: usize = usize::MAX;
        let n = nodes.len();
        let (mut index, mut low, mut on_stack) = (vec![UNSEEN; n], vec![0; n], vec![false; n]);
        let (mut stack, mut call, mut out) = (Vec::new(), Vec::<(usize, usize)>::new(), Vec::new());
        let mut next = 0;
        for root in 0..n {
            if index[root] != UNSEEN {
                continue;
            }
            let mut enter = Some(root);
            loop {
                if let Some(v) = enter.take() {
                    index[v] = next;
                    low[v] = next;
                    next += 1;
                    stack.push(v);
                    on_stack[v] = true;
                    call.push((v, 0));
                }
                let Some(&(v, i)) = call.last() else { break };
                if let Some(&w) = succ[v].get(i) {
                    call.last_mut().expect("not empty").1 += 1;
                    if index[w] == UNSEEN {
                        enter = Some(w);
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                call.pop();
                if let Some(&(u, _)) = call.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut comp = Vec::new();
                    loop {
                        let w = stack.pop().expect("a component's root is on the stack");
                        on_stack[w] = false;
                        comp.push(nodes[w]);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() >= 2 {
                        comp.sort_unstable();
                        out.push(comp);
                    }
                }
            }
        }
        debug_assert!(stack.is_empty(), "every node ends in a component");
        // Disjoint and each sorted: ordering by the first member orders by the smallest.
        out.sort_unstable();
        out
    }

    /// One elementary cycle through a strongly connected component `members` (sorted, two
    /// nodes or more): from the smallest member, follow the smallest successor inside the
    /// component until a node repeats; the cycle is the path from that node on.
    pub fn cycle_in(&self, members: &[T]) -> Vec<T> {
        assert!(members.len() >= 2, "a cycle needs a component of two nodes or more");
        let mut path: Vec<T> = Vec::new();
        let mut at: FxHashMap<T, usize> = FxHashMap::default();
        let mut v = members[0];
        loop {
            if let Some(&i) = at.get(&v) {
                return path.split_off(i);
            }
            at.insert(v, path.len());
            path.push(v);
            v = *self
                .succ
                .get(&v)
                .into_iter()
                .flatten()
                .find(|s| members.binary_search(s).is_ok())
                .expect("every node of a strongly connected component has a successor in it");
        }
    }

    /// One cycle per component that holds one, in the order of [`Graph::components`].
    pub fn cycles(&self) -> Vec<Vec<T>> {
        self.components().iter().map(|c| self.cycle_in(c)).collect()
    }

    /// Break every cycle: take a cycle, let `pick` choose one of its nodes as the victim
    /// (it must return a member of the cycle it is given), remove the victim, and go on in what
    /// is left of the component until no cycle remains. Returns each victim with the cycle it
    /// broke, components in order and, inside one, in the order the victims were taken. The
    /// graph keeps no victim. Each step removes a node, so it ends.
    pub fn break_cycles(&mut self, mut pick: impl FnMut(&[T]) -> T) -> Vec<(T, Vec<T>)> {
        let mut broken = Vec::new();
        let mut work: Vec<Graph<T>> = self.components().iter().rev().map(|c| self.restricted(c)).collect();
        while let Some(mut g) = work.pop() {
            let comp: Vec<T> = g.succ.keys().copied().collect();
            let cycle = g.cycle_in(&comp);
            let victim = pick(&cycle);
            assert!(cycle.contains(&victim), "the victim must be one of the cycle's nodes");
            g.remove_node(victim);
            self.remove_node(victim);
            broken.push((victim, cycle));
            // What is left of the component may still hold cycles: search them before the
            // next component, smallest first.
            work.extend(g.components().iter().rev().map(|c| g.restricted(c)));
        }
        broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(u64, u64)]) -> Graph<u64> {
        let mut g = Graph::bounded(1000);
        for &(a, b) in edges {
            g.add_edge(a, b);
        }
        g
    }

    #[test]
    fn a_chain_of_waits_has_no_cycle() {
        let g = graph(&[(1, 2), (2, 3), (3, 4), (1, 4)]);
        assert!(g.components().is_empty());
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn two_transactions_waiting_for_each_other_are_a_cycle() {
        let g = graph(&[(7, 3), (3, 7), (3, 9)]);
        assert_eq!(g.components(), vec![vec![3, 7]]);
        assert_eq!(g.cycles(), vec![vec![3, 7]]);
    }

    #[test]
    fn a_three_cycle_gathered_from_three_nodes_is_found_whatever_the_order() {
        // Each "node" reports the one edge it knows; the detector adds them as they arrive.
        let node_edges = [(10, 20), (20, 30), (30, 10)];
        let mut orders = vec![node_edges.to_vec()];
        orders.push(node_edges.iter().rev().copied().collect());
        for edges in orders {
            let g = graph(&edges);
            assert_eq!(g.components(), vec![vec![10, 20, 30]]);
            assert_eq!(g.cycles(), vec![vec![10, 20, 30]], "from the smallest, along the smallest successors");
        }
    }

    #[test]
    fn two_disjoint_cycles_come_in_the_order_of_their_smallest_member() {
        let g = graph(&[(50, 60), (60, 50), (5, 8), (8, 6), (6, 5), (60, 5)]);
        assert_eq!(g.components(), vec![vec![5, 6, 8], vec![50, 60]]);
        assert_eq!(g.cycles(), vec![vec![5, 8, 6], vec![50, 60]]);
    }

    #[test]
    fn a_transaction_waiting_for_itself_is_ignored() {
        let mut g = graph(&[(4, 4), (4, 5)]);
        assert_eq!(g.edges(), 1);
        assert!(g.components().is_empty());
        assert!(!g.add_edge(5, 5));
    }

    #[test]
    fn breaking_cycles_removes_a_victim_until_none_is_left() {
        // A figure eight through 2 (1 -> 2 -> 1 and 2 -> 3 -> 2) and a disjoint 2-cycle.
        let mut g = graph(&[(1, 2), (2, 1), (2, 3), (3, 2), (8, 9), (9, 8)]);
        // A victim outside the shared node: both loops of the eight need one.
        let broken = g.break_cycles(|c| *c.iter().find(|v| **v != 2).unwrap_or(&c[0]));
        assert_eq!(broken, vec![(1, vec![1, 2]), (3, vec![2, 3]), (8, vec![8, 9])]);
        assert!(g.components().is_empty());
        // The shared node as the victim breaks the eight at once.
        let mut g = graph(&[(1, 2), (2, 1), (2, 3), (3, 2)]);
        assert_eq!(g.break_cycles(|c| c[1]), vec![(2, vec![1, 2])]);
        assert!(g.contains(1) && g.contains(3) && !g.contains(2));
    }

    #[test]
    fn a_full_graph_refuses_edges() {
        let mut g: Graph<u64> = Graph::bounded(2);
        assert!(g.add_edge(1, 2) && g.add_edge(2, 1));
        assert!(!g.add_edge(2, 3));
        assert_eq!((g.edges(), g.refused()), (2, 1));
        g.remove_node(2);
        assert_eq!(g.edges(), 0);
    }

    #[test]
    fn any_ordered_id_will_do() {
        // Detock's graph, say, of (region, sequence) ids.
        let mut g: Graph<(u16, u64)> = Graph::bounded(16);
        g.add_edge((1, 7), (0, 3));
        g.add_edge((0, 3), (1, 7));
        assert_eq!(g.cycles(), vec![vec![(0, 3), (1, 7)]]);
    }

    #[test]
    fn a_long_chain_does_not_overflow_the_stack() {
        let n = 200_000u64;
        let mut g = Graph::bounded(n as usize + 1);
        for v in 0..n {
            g.add_edge(v, v + 1);
        }
        g.add_edge(n, 0);
        let comps = g.components();
        assert_eq!(comps.len(), 1);
        assert_eq!(comps[0].len(), n as usize + 1);
    }
}
