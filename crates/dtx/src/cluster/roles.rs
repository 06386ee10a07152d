//! Roles: what a node (in the topology and the cluster file) and a worker (as its protocol
//! declares it) do. Every node holds data and runs clients unless told otherwise, which is the
//! shape of every 2PC protocol; the papers' other systems give nodes and workers other jobs
//! (Hackwrench's timestamp server and storage nodes, Calvin's sequencer, SLOG's ordering
//! service), and the runtimes start clients only where a protocol's roles say so.

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// One job a node or worker can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Role {
    /// Holds partitions of the data (they are dealt to data nodes only).
    Data = 1 << 0,
    /// Runs the driver's clients, whose transactions it coordinates.
    Client = 1 << 1,
    /// Orders transaction inputs into a log (Calvin, SLOG's regions, Detock).
    Sequencer = 1 << 2,
    /// Executes or locks in log order (Calvin's scheduler, Detock's dependency graph).
    Scheduler = 1 << 3,
    /// Orders multi-home transactions (SLOG's global ordering service).
    Orderer = 1 << 4,
    /// Replicates logs it does not own.
    Replicator = 1 << 5,
    /// Hands out commit timestamps (Hackwrench's TS, a FoundationDB-like sequencer).
    TimestampServer = 1 << 6,
    /// Stores and validates for compute nodes (Hackwrench's SNs, SunStorm's page store).
    Storage = 1 << 7,
}

pub const ALL_ROLES: [(Role, &str); 8] = [
    (Role::Data, "data"),
    (Role::Client, "client"),
    (Role::Sequencer, "sequencer"),
    (Role::Scheduler, "scheduler"),
    (Role::Orderer, "orderer"),
    (Role::Replicator, "replicator"),
    (Role::TimestampServer, "timestamp-server"),
    (Role::Storage, "storage"),
];

impl Role {
    /// A role by its name (`sequencer`), or an error listing the known ones.
    pub fn parse(name: &str) -> anyhow::Result<Role> {
        let name = name.trim();
        match ALL_ROLES.iter().find(|(_, n)| *n == name) {
            Some((r, _)) => Ok(*r),
            None => bail!(
                "unknown role `{name}` (known: {})",
                ALL_ROLES.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// A set of roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct Roles(u16);

impl Roles {
    pub const NONE: Roles = Roles(0);
    /// What a node is unless the topology says otherwise: it holds data and runs clients.
    pub const DEFAULT: Roles = Roles(Role::Data as u16 | Role::Client as u16);

    pub fn of(roles: &[Role]) -> Roles {
        Roles(roles.iter().fold(0, |acc, r| acc | *r as u16))
    }

    pub fn contains(self, r: Role) -> bool {
        self.0 & r as u16 != 0
    }

    pub fn with(self, r: Role) -> Roles {
        Roles(self.0 | r as u16)
    }

    pub fn without(self, r: Role) -> Roles {
        Roles(self.0 & !(r as u16))
    }

    pub fn names(self) -> Vec<String> {
        ALL_ROLES.iter().filter(|(r, _)| self.contains(*r)).map(|(_, n)| n.to_string()).collect()
    }

    /// `data+client`, or a list of names.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> anyhow::Result<Roles> {
        let mut set = Roles::NONE;
        for name in names {
            set = set.with(Role::parse(name.as_ref())?);
        }
        if set == Roles::NONE {
            bail!("a node needs at least one role");
        }
        Ok(set)
    }
}

impl Default for Roles {
    fn default() -> Self {
        Roles::DEFAULT
    }
}

impl TryFrom<Vec<String>> for Roles {
    type Error = anyhow::Error;
    fn try_from(names: Vec<String>) -> anyhow::Result<Roles> {
        Roles::parse(&names)
    }
}

impl From<Roles> for Vec<String> {
    fn from(r: Roles) -> Vec<String> {
        r.names()
    }
}

/// `--roles data+client,data,timestamp-server`: one `+`-joined set per node, in node order.
pub fn parse_node_roles(text: &str, nodes: u16) -> anyhow::Result<Vec<Roles>> {
    let sets: Vec<Roles> = text
        .split(',')
        .enumerate()
        .map(|(i, set)| {
            let names: Vec<&str> = set.split('+').collect();
            Roles::parse(&names).map_err(|e| anyhow::anyhow!("--roles, node {i}: {e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if sets.len() != nodes as usize {
        bail!("--roles gives {} nodes' roles, but the cluster has {nodes} nodes", sets.len());
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_print() {
        let r = Roles::parse(&["data", "timestamp-server"]).unwrap();
        assert!(r.contains(Role::Data) && r.contains(Role::TimestampServer) && !r.contains(Role::Client));
        assert_eq!(r.names(), ["data", "timestamp-server"]);
        assert_eq!(parse_node_roles("data+client,storage", 2).unwrap()[1], Roles::of(&[Role::Storage]));
    }

    #[test]
    fn bad_roles_name_the_problem() {
        let e = Roles::parse(&["dta"]).unwrap_err().to_string();
        assert!(e.contains("unknown role `dta`") && e.contains("timestamp-server"), "{e}");
        let e = parse_node_roles("data,data", 3).unwrap_err().to_string();
        assert!(e.contains("2 nodes' roles") && e.contains("3 nodes"), "{e}");
    }
}
