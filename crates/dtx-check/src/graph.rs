//! Dependency-graph algorithms: compressed adjacency, iterative Tarjan SCC, and BFS path search.
//! Nothing here recurses, so graphs with millions of nodes cannot overflow the stack.

/// Edge kind bit: write-write dependency.
pub(crate) const WW: u8 = 1;
/// Edge kind bit: write-read dependency.
pub(crate) const WR: u8 = 2;
/// Edge kind bit: read-write anti-dependency.
pub(crate) const RW: u8 = 4;
/// Edge kind bit: real-time order (the first transaction ended before the second started).
pub(crate) const RT: u8 = 8;
/// All dependency edge kinds (real-time order is not a dependency).
pub(crate) const ALL: u8 = WW | WR | RW;

/// A directed multigraph in compressed sparse row form. Edge `e` goes `from[e] -> to[e]`, has
/// kind bits `kind[e]` and refers to an external label `eid[e]`.
pub(crate) struct Csr {
    offs: Vec<usize>,
    pub from: Vec<u32>,
    pub to: Vec<u32>,
    pub kind: Vec<u8>,
    pub eid: Vec<u32>,
}

impl Csr {
    /// Builds the graph over nodes `0..n` from `(from, to, kind, eid)` tuples (counting sort;
    /// the iterator is walked twice).
    pub fn build<I>(n: usize, edges: I) -> Csr
    where
        I: Iterator<Item = (u32, u32, u8, u32)> + Clone,
    {
        let mut offs = vec![0usize; n + 1];
        let mut m = 0;
        for (f, ..) in edges.clone() {
            offs[f as usize + 1] += 1;
            m += 1;
        }
        for i in 0..n {
            offs[i + 1] += offs[i];
        }
        let mut fill = offs.clone();
        let (mut from, mut to, mut kind, mut eid) = (vec![0u32; m], vec![0u32; m], vec![0u8; m], vec![0u32; m]);
        for (f, t, k, id) in edges {
            let slot = &mut fill[f as usize];
            from[*slot] = f;
            to[*slot] = t;
            kind[*slot] = k;
            eid[*slot] = id;
            *slot += 1;
        }
        Csr { offs, from, to, kind, eid }
    }

    pub fn nodes(&self) -> usize {
        self.offs.len() - 1
    }

    pub fn edges(&self) -> usize {
        self.to.len()
    }

    pub fn out(&self, v: u32) -> std::ops::Range<usize> {
        self.offs[v as usize]..self.offs[v as usize + 1]
    }
}

const UNVISITED: u32 = u32::MAX;

/// Strongly connected components of the subgraph made of the edges whose kind intersects
/// `mask`. Returns the component of every node and the number of components. Components are
/// numbered in reverse topological order: if some node of component `a` reaches some node of
/// component `b != a`, then `a > b`.
pub(crate) fn tarjan(g: &Csr, mask: u8) -> (Vec<u32>, usize) {
    let n = g.nodes();
    let mut index = vec![UNVISITED; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut comp = vec![UNVISITED; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut call: Vec<(u32, usize)> = Vec::new();
    let mut next_index = 0u32;
    let mut ncomp = 0usize;
    for root in 0..n as u32 {
        if index[root as usize] != UNVISITED {
            continue;
        }
        index[root as usize] = next_index;
        low[root as usize] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root as usize] = true;
        call.push((root, g.out(root).start));
        while let Some(&(v, cursor)) = call.last() {
            let end = g.out(v).end;
            let mut e = cursor;
            let mut descended = false;
            while e < end {
                let edge = e;
                e += 1;
                if g.kind[edge] & mask == 0 {
                    continue;
                }
                let w = g.to[edge];
                let wi = w as usize;
                if index[wi] == UNVISITED {
                    index[wi] = next_index;
                    low[wi] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[wi] = true;
                    if let Some(top) = call.last_mut() {
                        top.1 = e;
                    }
                    call.push((w, g.out(w).start));
                    descended = true;
                    break;
                } else if on_stack[wi] {
                    let vi = v as usize;
                    low[vi] = low[vi].min(index[wi]);
                }
            }
            if descended {
                continue;
            }
            call.pop();
            let vi = v as usize;
            if let Some(&(parent, _)) = call.last() {
                let pi = parent as usize;
                low[pi] = low[pi].min(low[vi]);
            }
            if low[vi] == index[vi] {
                while let Some(w) = stack.pop() {
                    on_stack[w as usize] = false;
                    comp[w as usize] = ncomp as u32;
                    if w == v {
                        break;
                    }
                }
                ncomp += 1;
            }
        }
    }
    (comp, ncomp)
}

/// Outcome of a bounded path search.
pub(crate) enum Search {
    /// Edge indices of a shortest path, in order.
    Found(Vec<usize>),
    /// No path exists (within the allowed nodes and edge kinds).
    Unreachable,
    /// The step budget ran out first.
    GaveUp,
}

/// Reusable breadth-first search state over one graph (visit marks are generation-stamped, so
/// repeated searches cost only what they visit).
pub(crate) struct Bfs {
    stamp: Vec<u32>,
    generation: u32,
    parent: Vec<usize>,
    queue: Vec<u32>,
}

impl Bfs {
    pub fn new(n: usize) -> Bfs {
        Bfs { stamp: vec![0; n], generation: 0, parent: vec![0; n], queue: Vec::new() }
    }

    /// Shortest path `src ->* dst` over edges whose kind intersects `mask`, visiting only nodes
    /// for which `allow` holds. Every edge inspected costs one unit of `budget`.
    pub fn search(
        &mut self,
        g: &Csr,
        src: u32,
        dst: u32,
        mask: u8,
        allow: impl Fn(u32) -> bool,
        budget: &mut u64,
    ) -> Search {
        if self.generation == u32::MAX {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.generation = 0;
        }
        self.generation += 1;
        let gen = self.generation;
        if src == dst {
            return Search::Found(Vec::new());
        }
        self.queue.clear();
        self.queue.push(src);
        self.stamp[src as usize] = gen;
        let mut head = 0;
        while head < self.queue.len() {
            let x = self.queue[head];
            head += 1;
            for e in g.out(x) {
                if *budget == 0 {
                    return Search::GaveUp;
                }
                *budget -= 1;
                if g.kind[e] & mask == 0 {
                    continue;
                }
                let y = g.to[e];
                if self.stamp[y as usize] == gen || !allow(y) {
                    continue;
                }
                self.stamp[y as usize] = gen;
                self.parent[y as usize] = e;
                if y == dst {
                    let mut path = Vec::new();
                    let mut cur = y;
                    while cur != src {
                        let pe = self.parent[cur as usize];
                        path.push(pe);
                        cur = g.from[pe];
                    }
                    path.reverse();
                    return Search::Found(path);
                }
                self.queue.push(y);
            }
        }
        Search::Unreachable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarjan_reverse_topological_and_deep() {
        // A chain 0 -> 1 -> ... -> n-1 -> 0 (one big SCC) plus a tail n-1 -> n.
        let n = 300_000u32;
        let mut edges: Vec<(u32, u32, u8, u32)> = (0..n - 1).map(|i| (i, i + 1, WW, i)).collect();
        edges.push((n - 2, 0, WR, n));
        edges.push((n - 2, n - 1, RW, n + 1));
        let g = Csr::build(n as usize, edges.iter().copied());
        let (comp, ncomp) = tarjan(&g, ALL);
        assert_eq!(ncomp, 2);
        assert_eq!(comp[0], comp[n as usize - 2]);
        assert!(comp[0] > comp[n as usize - 1]);
        let (_, ncomp_ww) = tarjan(&g, WW);
        assert_eq!(ncomp_ww, n as usize);
        let mut bfs = Bfs::new(n as usize);
        let mut budget = u64::MAX;
        match bfs.search(&g, 5, 3, ALL, |_| true, &mut budget) {
            Search::Found(p) => assert_eq!(p.len(), n as usize - 3),
            _ => panic!("path expected"),
        }
        match bfs.search(&g, 5, 3, WW, |_| true, &mut budget) {
            Search::Unreachable => {}
            _ => panic!("no ww path expected"),
        }
        let mut small = 10;
        assert!(matches!(bfs.search(&g, 5, 3, ALL, |_| true, &mut small), Search::GaveUp));
    }
}
