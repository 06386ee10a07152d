//! Where each partition's copies live, which copy leads, and which hosts vote in a node's
//! replicated log. The 2PC protocols keep one copy of a partition on one data node (`single`,
//! the default); the deterministic multi-region systems keep a full copy in every region
//! (`per-region`: Calvin, SLOG, Detock, SunStorm's remote copies), and the replicated-shard
//! designs a group of nodes per partition (`groups=N`: Hackwrench's storage replicas,
//! Janus's and TAPIR's replicas per shard, Rolis's followers).
//!
//! Placement is computed once per run from the topology (data nodes, their regions) and
//! checked: a placement that leaves a partition without a copy, or a region without a data
//! node, is refused naming the partition or the region.

use crate::net::NodeId;
use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::PartitionId;

/// How copies are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Placement {
    /// One copy per partition, dealt round-robin over the data nodes.
    #[default]
    Single,
    /// A full copy in every region: partition `p`'s copies are dealt round-robin over each
    /// region's data nodes, and its home region (`p` mod regions) leads.
    PerRegion,
    /// Consecutive data nodes form groups of `size` that hold the same partitions; a group's
    /// first node leads.
    Groups { size: u16 },
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Single => write!(f, "single"),
            Placement::PerRegion => write!(f, "per-region"),
            Placement::Groups { size } => write!(f, "groups={size}"),
        }
    }
}

impl Placement {
    /// `single`, `per-region` or `groups=N`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "single" => Ok(Placement::Single),
            "per-region" => Ok(Placement::PerRegion),
            _ => match s.strip_prefix("groups=").map(str::parse::<u16>) {
                Some(Ok(size)) if (1..=64).contains(&size) => Ok(Placement::Groups { size }),
                Some(_) => bail!("placement `{s}`: a group size is 1 to 64 nodes"),
                None => bail!("unknown placement `{s}`: give single, per-region or groups=N"),
            },
        }
    }
}

/// Every partition's copies, leader first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Copies {
    by_partition: Vec<Vec<NodeId>>,
}

impl Copies {
    /// Place `partitions` partitions on `data_nodes` (in node order) whose regions are
    /// `region_of`.
    pub fn place(
        placement: Placement,
        partitions: u32,
        data_nodes: &[NodeId],
        region_of: impl Fn(NodeId) -> u16,
    ) -> anyhow::Result<Self> {
        if data_nodes.is_empty() {
            bail!("no data node to place partitions on");
        }
        let by_partition = match placement {
            Placement::Single => (0..partitions).map(|p| vec![data_nodes[(p as usize) % data_nodes.len()]]).collect(),
            Placement::PerRegion => per_region(partitions, data_nodes, &region_of)?,
            Placement::Groups { size } => groups(partitions, data_nodes, size)?,
        };
        let copies = Copies { by_partition };
        if let Some(p) = (0..partitions).find(|&p| copies.of(p).is_empty()) {
            bail!("placement {placement:?} leaves partition {p} without a copy");
        }
        Ok(copies)
    }

    /// Partition `p`'s copies, leader first.
    pub fn of(&self, p: PartitionId) -> &[NodeId] {
        self.by_partition.get(p as usize).map_or(&[], Vec::as_slice)
    }

    /// The copy of `p` that leads.
    pub fn leader(&self, p: PartitionId) -> NodeId {
        self.of(p)[0]
    }
}

fn per_region(
    partitions: u32,
    data_nodes: &[NodeId],
    region_of: &dyn Fn(NodeId) -> u16,
) -> anyhow::Result<Vec<Vec<NodeId>>> {
    let regions = data_nodes.iter().map(|&n| region_of(n)).max().unwrap_or(0) + 1;
    let in_region: Vec<Vec<NodeId>> =
        (0..regions).map(|r| data_nodes.iter().copied().filter(|&n| region_of(n) == r).collect()).collect();
    if let Some(r) = in_region.iter().position(Vec::is_empty) {
        bail!("placement per-region: region {r} has no data node to hold a copy");
    }
    Ok((0..partitions)
        .map(|p| {
            let home = (p % regions as u32) as usize;
            // The home region's copy first, then the others in region order.
            (0..regions as usize)
                .map(|i| (home + i) % regions as usize)
                .map(|r| in_region[r][(p as usize / regions as usize) % in_region[r].len()])
                .collect()
        })
        .collect())
}

fn groups(partitions: u32, data_nodes: &[NodeId], size: u16) -> anyhow::Result<Vec<Vec<NodeId>>> {
    let size = size as usize;
    if data_nodes.len() % size != 0 {
        bail!("placement groups={size}: {} data nodes do not form whole groups of {size}", data_nodes.len());
    }
    let groups: Vec<&[NodeId]> = data_nodes.chunks(size).collect();
    Ok((0..partitions).map(|p| groups[p as usize % groups.len()].to_vec()).collect())
}

/// The hosts that vote in node `owner`'s replicated log (`count` of them, `owner` first): the
/// nodes of its own region before others, each in order after `owner` (mod `nodes`), so that a
/// log replicates within its region when the region has hosts enough (Detock and SLOG keep
/// their local logs in their region), and in one region this is the next `count - 1` hosts.
pub fn log_voters(owner: NodeId, count: u16, nodes: u16, region_of: impl Fn(NodeId) -> u16) -> Vec<NodeId> {
    let mine = region_of(owner);
    let mut hosts: Vec<NodeId> = (0..nodes).map(|i| (owner + i) % nodes).collect();
    // Stable: the distance after `owner` breaks ties.
    hosts.sort_by_key(|&n| region_of(n) != mine);
    hosts.truncate(count as usize);
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_deals_partitions_round_robin() {
        let c = Copies::place(Placement::Single, 4, &[1, 2], |_| 0).unwrap();
        assert_eq!((c.of(0), c.of(1), c.of(2)), (&[1][..], &[2][..], &[1][..]));
    }

    #[test]
    fn per_region_keeps_a_copy_in_every_region_led_by_the_home_region() {
        // Nodes 0, 1 in region 0; 2, 3 in region 1.
        let region = |n: NodeId| n / 2;
        let c = Copies::place(Placement::PerRegion, 4, &[0, 1, 2, 3], region).unwrap();
        for p in 0..4 {
            let regions: Vec<u16> = c.of(p).iter().map(|&n| region(n)).collect();
            assert_eq!(regions.len(), 2, "partition {p}: one copy per region");
            assert_eq!(regions[0], (p % 2) as u16, "partition {p}: its home region leads");
        }
        assert_eq!(c.of(0), &[0, 2]);
        assert_eq!(c.of(1), &[2, 0]);
        assert_eq!(c.of(2), &[1, 3]);
        // Regions 0 and 2 have data nodes, region 1 none.
        let e = Copies::place(Placement::PerRegion, 2, &[0, 3], |n| if n == 0 { 0 } else { 2 }).unwrap_err();
        assert!(e.to_string().contains("region 1 has no data node"), "{e}");
    }

    #[test]
    fn groups_hold_the_same_partitions_and_must_be_whole() {
        let c = Copies::place(Placement::Groups { size: 3 }, 2, &[0, 1, 2, 3, 4, 5], |_| 0).unwrap();
        assert_eq!((c.of(0), c.of(1)), (&[0, 1, 2][..], &[3, 4, 5][..]));
        assert_eq!(c.leader(1), 3);
        let e = Copies::place(Placement::Groups { size: 4 }, 2, &[0, 1, 2, 3, 4, 5], |_| 0).unwrap_err();
        assert!(e.to_string().contains("whole groups of 4"), "{e}");
    }

    #[test]
    fn a_log_votes_in_its_region_first_and_next_hosts_in_one_region() {
        assert_eq!(log_voters(3, 3, 4, |_| 0), vec![3, 0, 1], "one region: the next hosts, as before");
        // Nodes 0-2 in region 0, 3-5 in region 1.
        let region = |n: NodeId| n / 3;
        assert_eq!(log_voters(4, 3, 6, region), vec![4, 5, 3]);
        assert_eq!(log_voters(2, 4, 6, region), vec![2, 0, 1, 3], "past its region when it must");
    }

    #[test]
    fn placements_parse_with_clear_errors() {
        assert_eq!(Placement::parse("groups=3").unwrap(), Placement::Groups { size: 3 });
        assert_eq!(Placement::parse("per-region").unwrap(), Placement::PerRegion);
        assert!(Placement::parse("groups=0").unwrap_err().to_string().contains("1 to 64"));
        assert!(Placement::parse("everywhere").unwrap_err().to_string().contains("single, per-region or groups=N"));
    }
}
