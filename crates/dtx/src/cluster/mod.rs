//! Cluster topology (regions → nodes → partitions → their copies), the partition → node map,
//! and the TOML config `dtx server` reads. Where copies live is [`placement`]'s.
//!
//! Keys map to partitions through the workload (it knows how its keys encode a warehouse or a
//! key range); partitions map to nodes here.

pub mod placement;
pub mod roles;

use crate::net::NodeId;
use anyhow::{bail, Context};
pub use placement::Placement;
pub use roles::{Role, Roles};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

pub type PartitionId = u32;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Control address: `dtx bench` and clients connect here. Worker `w` listens for peers on
    /// the next ports (`port + 1 + w`), and the node's log replicas on the one after them
    /// (`port + 1 + workers`, used with `--durability replicated`).
    pub addr: SocketAddr,
    #[serde(default)]
    pub region: u16,
    /// What the node does (`["data", "client"]` unless given): see [`roles::Role`].
    #[serde(default)]
    pub roles: Roles,
}

/// The cluster file `dtx server --config` reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Worker threads per node.
    #[serde(default = "one")]
    pub workers: u16,
    /// Data partitions each node owns.
    #[serde(default = "one_u32")]
    pub partitions_per_node: u32,
    /// Region names, for reports (index = region id); optional.
    #[serde(default)]
    pub regions: Vec<String>,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeSpec>,
}

fn one() -> u16 {
    1
}
fn one_u32() -> u32 {
    1
}

impl ClusterConfig {
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<Self> {
        let cfg: ClusterConfig = toml::from_str(text).map_err(|e| {
            // One line: where, then what (toml's own message spans several lines).
            let at = e.span().map(|s| {
                let before = &text[..s.start.min(text.len())];
                format!(
                    " line {}, column {}:",
                    before.lines().count().max(1),
                    before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1
                )
            });
            anyhow::anyhow!("{origin}:{} {}", at.unwrap_or_default(), e.message().trim())
        })?;
        cfg.validate().with_context(|| format!("{origin}: invalid cluster config"))?;
        Ok(cfg)
    }

    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read cluster config {}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nodes.is_empty() {
            bail!("no [[node]] entries: a cluster needs at least one node");
        }
        if self.nodes.len() > 1024 {
            bail!("{} nodes is more than the limit of 1024", self.nodes.len());
        }
        if self.workers == 0 || self.workers > 64 {
            bail!("workers = {} must be between 1 and 64", self.workers);
        }
        if self.partitions_per_node == 0 || self.partitions_per_node > 4096 {
            bail!("partitions_per_node = {} must be between 1 and 4096", self.partitions_per_node);
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.addr.port() as u32 + 1 + self.workers as u32 > u16::MAX as u32 {
                bail!(
                    "node {i}: port {} leaves no room for its {} worker ports and its replication port after it",
                    n.addr.port(),
                    self.workers
                );
            }
            if !self.regions.is_empty() && n.region as usize >= self.regions.len() {
                bail!("node {i}: region {} but only {} regions are named", n.region, self.regions.len());
            }
            for (j, m) in self.nodes.iter().enumerate().take(i) {
                let (a, b) = (n.addr.port() as i32, m.addr.port() as i32);
                if n.addr.ip() == m.addr.ip() && (a - b).abs() <= self.workers as i32 + 1 {
                    bail!("nodes {j} and {i} use overlapping ports on {} ({} and {})", n.addr.ip(), b, a);
                }
            }
        }
        Topology::new(self.nodes.len() as u16, self.workers, self.partitions_per_node)
            .with_roles(self.nodes.iter().map(|n| n.roles).collect())?;
        Ok(())
    }

    /// The nodes' roles, in node order.
    pub fn node_roles(&self) -> Vec<Roles> {
        self.nodes.iter().map(|n| n.roles).collect()
    }

    /// A loopback cluster of `nodes` nodes starting at `base_port`.
    pub fn loopback(nodes: u16, workers: u16, base_port: u16) -> Self {
        let stride = workers + 2;
        ClusterConfig {
            workers,
            partitions_per_node: 1,
            regions: vec![],
            nodes: (0..nodes)
                .map(|i| NodeSpec {
                    addr: SocketAddr::from(([127, 0, 0, 1], base_port + i * stride)),
                    region: 0,
                    roles: Roles::DEFAULT,
                })
                .collect(),
        }
    }

    pub fn worker_addr(&self, node: NodeId, worker: u16) -> SocketAddr {
        let mut a = self.nodes[node as usize].addr;
        a.set_port(a.port() + 1 + worker);
        a
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// The shape of the cluster every component agrees on during a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: u16,
    pub workers_per_node: u16,
    /// Partitions each data node owns.
    pub partitions_per_node: u32,
    pub node_region: Vec<u16>,
    /// One-way delays between regions (µs; `--latency-matrix`), empty when none was given:
    /// what a workload that picks regions by closeness ranks them by.
    #[serde(default)]
    pub region_delay_us: Vec<Vec<u64>>,
    /// What each node does (see [`Role`]); set through [`Topology::with_roles`].
    node_roles: Vec<Roles>,
    /// The nodes with the `data` role, in order: partitions are dealt to them alone.
    data_nodes: Vec<NodeId>,
    /// How partitions' copies are placed, and where they are (leader first).
    placement: Placement,
    copies: placement::Copies,
}

impl Topology {
    /// `nodes` nodes that each hold data and run clients.
    pub fn new(nodes: u16, workers_per_node: u16, partitions_per_node: u32) -> Self {
        Topology {
            nodes,
            workers_per_node,
            partitions_per_node,
            node_region: vec![0; nodes as usize],
            region_delay_us: Vec::new(),
            node_roles: vec![Roles::DEFAULT; nodes as usize],
            data_nodes: (0..nodes).collect(),
            placement: Placement::Single,
            copies: placement::Copies::default(),
        }
    }

    /// Place every partition's copies (after the roles and regions are set): a placement that
    /// leaves a partition without a copy or a region without a data node is refused.
    pub fn with_placement(mut self, placement: Placement) -> anyhow::Result<Self> {
        let regions = self.node_region.clone();
        let region_of = |n: NodeId| regions.get(n as usize).copied().unwrap_or(0);
        self.copies = placement::Copies::place(placement, self.partitions(), &self.data_nodes, region_of)?;
        self.placement = placement;
        Ok(self)
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The region of `node` (0 unless regions are given).
    pub fn region_of(&self, node: NodeId) -> u16 {
        self.node_region.get(node as usize).copied().unwrap_or(0)
    }

    /// The home region of partition `p`: its leading copy's region.
    pub fn home_region(&self, p: PartitionId) -> u16 {
        self.region_of(self.node_of(p))
    }

    /// The regions that hold data, in order.
    pub fn data_regions(&self) -> Vec<u16> {
        let mut regions: Vec<u16> = self.data_nodes.iter().map(|n| self.region_of(*n)).collect();
        regions.sort_unstable();
        regions.dedup();
        regions
    }

    /// Partition `p`'s copies, leader first (one, the leader, with the single placement).
    pub fn copies_of(&self, p: PartitionId) -> Vec<NodeId> {
        match self.placement {
            Placement::Single => vec![self.node_of(p)],
            _ => self.copies.of(p).to_vec(),
        }
    }

    /// The copy of `p` a client in `region` reads from: its region's, or the leader.
    /// (Calvin's schedulers ask this for every key of every transaction: it allocates nothing.)
    pub fn copy_in_region(&self, p: PartitionId, region: u16) -> NodeId {
        let in_region = match self.placement {
            Placement::Single => None,
            _ => self.copies.of(p).iter().copied().find(|&n| self.region_of(n) == region),
        };
        in_region.unwrap_or_else(|| self.node_of(p))
    }

    /// The hosts that vote in node `owner`'s replicated log (`count` of them, `owner` first,
    /// its region's hosts before others: [`placement::log_voters`]).
    pub fn log_voters(&self, owner: NodeId, count: u16) -> Vec<NodeId> {
        placement::log_voters(owner, count, self.nodes, |n| self.region_of(n))
    }

    /// Give every node its roles (one set per node): at least one node must hold data and one
    /// must run clients.
    pub fn with_roles(mut self, roles: Vec<Roles>) -> anyhow::Result<Self> {
        if roles.len() != self.nodes as usize {
            bail!("roles are given for {} nodes, but the cluster has {}", roles.len(), self.nodes);
        }
        let data: Vec<NodeId> = (0..self.nodes).filter(|n| roles[*n as usize].contains(Role::Data)).collect();
        if data.is_empty() {
            bail!("no node has the `data` role: the data must live somewhere");
        }
        if !roles.iter().any(|r| r.contains(Role::Client)) {
            bail!("no node has the `client` role: nothing would run transactions");
        }
        self.node_roles = roles;
        self.data_nodes = data;
        // Copies follow the data nodes.
        match self.placement {
            Placement::Single => Ok(self),
            p => self.with_placement(p),
        }
    }

    /// Whether `node` runs clients: the run's final read and checks are transactions, and run
    /// on such a node (a protocol may keep its clients on some nodes only).
    pub fn runs_clients(&self, node: NodeId) -> bool {
        self.roles_of(node).contains(Role::Client)
    }

    /// The first node that runs clients (`with_roles` makes sure there is one).
    pub fn first_client_node(&self) -> NodeId {
        (0..self.nodes).find(|&n| self.runs_clients(n)).unwrap_or(0)
    }

    pub fn roles_of(&self, node: NodeId) -> Roles {
        self.node_roles.get(node as usize).copied().unwrap_or(Roles::DEFAULT)
    }

    /// The nodes with the `data` role, in order.
    pub fn data_nodes(&self) -> &[NodeId] {
        &self.data_nodes
    }

    pub fn partitions(&self) -> u32 {
        self.data_nodes.len() as u32 * self.partitions_per_node
    }

    /// The node that leads partition `p`. With the single placement partitions are dealt
    /// round-robin over the data nodes: with every node holding data, partition p lives on node
    /// p % nodes.
    #[inline]
    pub fn node_of(&self, p: PartitionId) -> NodeId {
        match self.placement {
            Placement::Single => self.data_nodes[(p % self.data_nodes.len() as u32) as usize],
            _ => self.copies.leader(p),
        }
    }

    /// The partitions `node` leads.
    pub fn partitions_of(&self, node: NodeId) -> Vec<PartitionId> {
        (0..self.partitions()).filter(|p| self.node_of(*p) == node).collect()
    }

    /// The partitions `node` holds a copy of, leading or not (those it leads with the single
    /// placement).
    pub fn partitions_held_by(&self, node: NodeId) -> Vec<PartitionId> {
        (0..self.partitions()).filter(|p| self.copies_of(*p).contains(&node)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let ok = "workers = 2\n[[node]]\naddr = \"127.0.0.1:7000\"\n[[node]]\naddr = \"127.0.0.1:7010\"\n";
        let c = ClusterConfig::parse(ok, "t.toml").unwrap();
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.worker_addr(1, 1).port(), 7012);
        let round = ClusterConfig::parse(&c.to_toml(), "again").unwrap();
        assert_eq!(round, c);
    }

    #[test]
    fn rejects_bad_configs_with_a_reason() {
        let cases = [
            ("workers = 1\n", "missing field `node`"),
            ("[[node]]\naddr = \"nonsense\"\n", "invalid socket address"),
            ("wrkers = 1\n[[node]]\naddr = \"127.0.0.1:1\"\n", "unknown field `wrkers`"),
            ("workers = 0\n[[node]]\naddr = \"127.0.0.1:7000\"\n", "between 1 and 64"),
            ("[[node]]\naddr = \"127.0.0.1:7000\"\n[[node]]\naddr = \"127.0.0.1:7001\"\n", "overlapping ports"),
            ("regions = [\"eu\"]\n[[node]]\naddr = \"127.0.0.1:7000\"\nregion = 3\n", "region 3"),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", ClusterConfig::parse(text, "c.toml").unwrap_err());
            assert!(err.contains(want), "{text:?}: error `{err}` lacks `{want}`");
        }
    }

    #[test]
    fn partitions_go_to_data_nodes_only() {
        let roles = vec![Roles::of(&[Role::Client, Role::TimestampServer]), Roles::DEFAULT, Roles::of(&[Role::Data])];
        let t = Topology::new(3, 1, 2).with_roles(roles).unwrap();
        assert_eq!(t.partitions(), 4);
        assert_eq!(t.partitions_of(0), Vec::<u32>::new());
        assert_eq!(t.partitions_of(1), vec![0, 2]);
        assert_eq!(t.partitions_of(2), vec![1, 3]);
        let no_data = vec![Roles::of(&[Role::Client]); 2];
        assert!(Topology::new(2, 1, 1).with_roles(no_data).unwrap_err().to_string().contains("`data` role"));
    }

    #[test]
    fn a_cluster_file_gives_roles() {
        let text = "[[node]]\naddr = \"127.0.0.1:7000\"\nroles = [\"client\", \"sequencer\"]\n\
                    [[node]]\naddr = \"127.0.0.1:7010\"\n";
        let c = ClusterConfig::parse(text, "c.toml").unwrap();
        assert_eq!(c.node_roles(), vec![Roles::of(&[Role::Client, Role::Sequencer]), Roles::DEFAULT]);
        let bad = "[[node]]\naddr = \"127.0.0.1:7000\"\nroles = [\"sequenser\"]\n";
        let e = format!("{:#}", ClusterConfig::parse(bad, "c.toml").unwrap_err());
        assert!(e.contains("unknown role `sequenser`"), "{e}");
    }

    #[test]
    fn partitions_round_robin() {
        let t = Topology::new(3, 1, 2);
        assert_eq!(t.partitions(), 6);
        assert_eq!(t.partitions_of(1), vec![1, 4]);
    }

    #[test]
    fn a_placement_per_region_gives_every_region_a_copy_and_clients_their_region_s() {
        let mut t = Topology::new(4, 1, 1);
        t.node_region = vec![0, 0, 1, 1];
        let t = t.with_placement(Placement::PerRegion).unwrap();
        for p in 0..t.partitions() {
            let copies = t.copies_of(p);
            assert_eq!(copies.len(), 2, "partition {p}: a copy per region");
            assert_eq!(t.node_of(p), copies[0], "the leader routes");
            for region in 0..2 {
                assert_eq!(t.region_of(t.copy_in_region(p, region)), region, "partition {p}: region {region}'s copy");
            }
        }
        // Roles given after the placement: the copies follow the data nodes.
        let roles = vec![Roles::of(&[Role::Client]), Roles::DEFAULT, Roles::DEFAULT, Roles::DEFAULT];
        let t = t.with_roles(roles).unwrap();
        assert!((0..t.partitions()).all(|p| !t.copies_of(p).contains(&0)), "node 0 holds no data");
        assert_eq!(t.log_voters(3, 2), vec![3, 2], "a log's voters stay in its region");
    }
}
