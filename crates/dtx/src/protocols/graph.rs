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
    /// The work done on it so far, in steps: an edge offered, an edge or node visited by a
    /// search, a node's successors scanned by a removal ([`Graph::steps`]).
    steps: std::cell::Cell<usize>,
}

impl<T: Copy + Ord + Hash> Graph<T> {
    /// An empty graph that takes at most `max_edges` edges.
    pub fn bounded(max_edges: usize) -> Self {
        Graph { succ: BTreeMap::new(), edges: 0, max_edges, refused: 0, steps: Default::default() }
    }

    /// Add the edge `from -> to`; false if it was there already, is a self-edge (ignored), or
    /// the graph is full (refused, counted in [`Graph::refused`]).
    pub fn add_edge(&mut self, from: T, to: T) -> bool {
        self.step(1);
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

    /// The work done on this graph so far, in steps (an edge offered, an edge or node a search
    /// visited, a node a removal scanned; a sub-graph's work counts in the graph it came from),
    /// each a map lookup or two: what the simulator charges for it
    /// ([`crate::rt::CpuCost::graph_step_ns`]), since the work of one search grows with the
    /// whole graph's edges, not with the transaction that started it.
    pub fn steps(&self) -> usize {
        self.steps.get()
    }

    fn step(&self, n: usize) {
        self.steps.set(self.steps.get() + n);
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
        self.step(self.succ.len());
        if let Some(out) = self.succ.remove(&v) {
            self.edges -= out.len();
        }
        for s in self.succ.values_mut() {
            if s.remove(&v) {
                self.edges -= 1;
            }
        }
    }

    /// The nodes in order, each one's index, and each index's successors as indices: what the
    /// searches walk instead of the maps.
    #[allow(clippy::type_complexity)]
    fn indexed(&self) -> (Vec<T>, FxHashMap<T, usize>, Vec<Vec<usize>>) {
        let nodes: Vec<T> = self.succ.keys().copied().collect();
        let index_of: FxHashMap<T, usize> = nodes.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        let succ = self.succ.values().map(|s| s.iter().map(|t| index_of[t]).collect()).collect();
        (nodes, index_of, succ)
    }

    /// The strongly connected components of two nodes or more (the ones that hold a cycle),
    /// each sorted, in the order of their smallest member. Tarjan's algorithm, with an explicit
    /// stack (a long chain of waits must not overflow the thread's).
    pub fn components(&self) -> Vec<Vec<T>> {
        let (nodes, _, succ) = self.indexed();
        self.step(nodes.len() + self.edges);
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
            self.step(1);
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
    /// (it must return a member of the cycle it is given), remove the victim, and go on until
    /// no cycle remains. Returns each victim with the cycle it broke, in the order found. The
    /// graph keeps no victim.
    ///
    /// One depth-first search, nodes and successors in ascending order: an edge back to a node
    /// on the search's path closes a cycle (the path from that node on); its victim leaves the
    /// graph, and the nodes above it on the path are searched again later (they may lie on
    /// other cycles without it). A node the search has finished leads only to finished or
    /// removed nodes, so what is left when every node is finished is acyclic. Searching the
    /// strongly connected components again after each victim, as this did, cost the square of
    /// a component's size per round: under contention on threads a component holds hundreds of
    /// waits, and the detector's rounds took the worker that runs them.
    pub fn break_cycles(&mut self, mut pick: impl FnMut(&[T]) -> T) -> Vec<(T, Vec<T>)> {
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum Mark {
            Unseen,
            OnPath,
            Finished,
            Removed,
        }
        let (nodes, index_of, succ) = self.indexed();
        self.step(nodes.len() + self.edges);
        let mut mark = vec![Mark::Unseen; nodes.len()];
        // Each node's place on the path while it is on it.
        let mut depth = vec![0; nodes.len()];
        // The path: each node with its next successor to follow.
        let mut path: Vec<(usize, usize)> = Vec::new();
        let mut broken = Vec::new();
        for root in 0..nodes.len() {
            if mark[root] != Mark::Unseen {
                continue;
            }
            mark[root] = Mark::OnPath;
            depth[root] = 0;
            path.push((root, 0));
            while let Some((v, next)) = path.last_mut() {
                let Some(&w) = succ[*v].get(*next) else {
                    mark[*v] = Mark::Finished;
                    path.pop();
                    continue;
                };
                *next += 1;
                self.step(1);
                match mark[w] {
                    Mark::Unseen => {
                        mark[w] = Mark::OnPath;
                        depth[w] = path.len();
                        path.push((w, 0));
                    }
                    Mark::OnPath => {
                        let cycle: Vec<T> = path[depth[w]..].iter().map(|(u, _)| nodes[*u]).collect();
                        let victim = pick(&cycle);
                        let offset = cycle.iter().position(|v| *v == victim);
                        let offset = offset.expect("the victim must be one of the cycle's nodes");
                        for (u, _) in path.drain(depth[w] + offset..) {
                            mark[u] = Mark::Unseen;
                        }
                        mark[index_of[&victim]] = Mark::Removed;
                        broken.push((victim, cycle));
                    }
                    Mark::Finished | Mark::Removed => {}
                }
            }
        }
        debug_assert!(mark.iter().all(|m| matches!(m, Mark::Finished | Mark::Removed)));
        self.remove_nodes(&broken.iter().map(|(v, _)| *v).collect::<Vec<_>>());
        broken
    }

    /// Take every node of `gone` out with its edges, in one pass.
    fn remove_nodes(&mut self, gone: &[T]) {
        if gone.is_empty() {
            return;
        }
        let gone: rustc_hash::FxHashSet<T> = gone.iter().copied().collect();
        self.step(self.succ.len() + self.edges);
        self.succ.retain(|v, _| !gone.contains(v));
        for s in self.succ.values_mut() {
            s.retain(|t| !gone.contains(t));
        }
        self.edges = self.succ.values().map(BTreeSet::len).sum();
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
    fn breaking_cycles_leaves_random_graphs_acyclic_with_each_victim_on_a_real_cycle() {
        use rand::Rng as _;
        let mut rng = crate::util::rng_from_seed(11);
        for round in 0..200 {
            let txns = rng.gen_range(2..60u64);
            let edges: Vec<(u64, u64)> =
                (0..rng.gen_range(1..3 * txns)).map(|_| (rng.gen_range(0..txns), rng.gen_range(0..txns))).collect();
            let original = graph(&edges);
            let mut g = original.clone();
            let broken = g.break_cycles(|c| c[(c[0] as usize + round) % c.len()]);
            assert!(g.components().is_empty(), "round {round}: a cycle is left after {broken:?}");
            for (victim, cycle) in &broken {
                assert!(cycle.contains(victim) && !g.contains(*victim));
                for (i, v) in cycle.iter().enumerate() {
                    let next = cycle[(i + 1) % cycle.len()];
                    assert!(original.succ[v].contains(&next), "round {round}: {v} -> {next} is no edge");
                }
            }
        }
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

/// A measurement, not a test: what a step of a wait-for graph's search costs on this machine
/// (`rt::CpuCost::graph_step_ns`). Run with
/// `cargo test --release -p dtx --lib graph::calibration -- --ignored --nocapture`.
#[cfg(test)]
mod calibration {
    use super::Graph;
    use rand::Rng as _;
    use std::time::Instant;

    /// A detector's graph: `waiters` transactions out of `txns`, each waiting for `blockers`
    /// others (a queue's holders and those ahead), which under contention joins most of them in
    /// one large strongly connected component.
    fn waits(txns: u64, waiters: u64, blockers: usize, seed: u64) -> Vec<(u64, u64)> {
        let mut rng = crate::util::rng_from_seed(seed);
        let mut edges = Vec::new();
        for w in 0..waiters {
            for _ in 0..blockers {
                edges.push((w, rng.gen_range(0..txns)));
            }
        }
        edges
    }

    #[test]
    #[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per step of a wait-for graph's search"]
    fn graph_search_cost_per_step() {
        for (txns, waiters, blockers) in [(128, 40, 1), (128, 100, 2), (512, 400, 2), (2048, 1500, 3)] {
            let edges = waits(txns, waiters, blockers, 7);
            let (mut best, mut steps) = (f64::MAX, 0);
            for _ in 0..7 {
                let t0 = Instant::now();
                let mut g = Graph::bounded(1 << 16);
                for &(a, b) in &edges {
                    g.add_edge(a, b);
                }
                let broken = g.break_cycles(|c| c[0]);
                std::hint::black_box(broken);
                steps = g.steps();
                best = best.min(t0.elapsed().as_nanos() as f64 / steps as f64);
            }
            println!("{waiters} waiters of {txns}, {blockers} blockers each: {steps} steps, {best:.0} ns a step");
        }
    }
}
