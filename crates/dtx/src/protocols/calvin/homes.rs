//! Homes that move: Detock's home movement (thesis §4.3), which SLOG's remastering runs as too.
//!
//! Every key has a home region, its partition's region ([`NodeState::home_of`]), until a home
//! movement moves it:
//! - **Stored homes.** Each data node keeps, beside the keys it holds, the homes of those that
//!   moved ([`StoredHomes`]). Only a movement's run changes them, and it runs at the same point
//!   of every region's order, so every copy agrees.
//! - **Expected homes.** A client routes by its node's [`HomeDirectory`], a cache that may be
//!   stale, and its entry lists the homes it expects of the keys it knows moved. Locks and the
//!   dependency graph order a key by the pair (key, expected home): a key's requests for one home
//!   all come from that home's log, so every region orders them alike. A run that finds some
//!   key's stored home other than the one it expected aborts, at every participant and in every
//!   region alike ([`HOME_MOVED`]); its client learns the stored homes with the abort, and the
//!   driver runs it again.
//! - **A movement** of `key` from `from` to `to` is a multi-home transaction. It has a piece in
//!   each home's log, holding (key, from) and (key, to). A transaction placed before the old
//!   piece runs before the movement and sees `from`; one placed after it aborts. A transaction
//!   expecting `to` runs after the movement, or before it and aborts.
//!
//! Who moves a home: the client of a multi-home transaction, with probability `rehome`, first
//! moves one of its keys homed in another region to its own region, as the thesis's "a user
//! moves to a new continent" does. The thesis measures no workload that moves homes; 0, the
//! default, moves none.
//!
//! Where this departs from the papers:
//! - SLOG's own remastering is a single-home transaction in the old home's log, with a counter
//!   in every record's header. dtx's SLOG moves homes as Detock does, through SLOG's orderer like
//!   any multi-home transaction. It needs no counter, and it pays the orderer's trip for a rare
//!   event.
//! - A scan locks its range in its partition's home only, so a workload that scans cannot move
//!   homes: `rehome` with one is refused before the run.
//! - One key per movement, as the thesis describes (it calls several "straightforward").

use super::NodeState;
use crate::protocols::{OptionKind, OptionSpec};
use crate::storage::RowKey;
use crate::txn::{KeySet, Reason};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// A run expected some key's home to be other than the stored one: a home moved since its client
/// looked. Its client has learned the stored homes; the driver runs it again.
pub const HOME_MOVED: Reason = Reason::new("home-moved");

/// SLOG's and Detock's option: how often a multi-home transaction's client first moves a key.
pub const REHOME: OptionSpec = OptionSpec {
    name: "rehome",
    kind: OptionKind::F64 { min: 0.0, max: 1.0 },
    default: "0",
    help: "how often a multi-home transaction's client first moves one of its keys' homes to its own region (0: never)",
};

/// [`HOME_MOVED`]'s line in SLOG's and Detock's abort tables.
pub const HOME_MOVED_ABORT: (&str, &str) =
    ("home-moved", "a key's home moved since its client looked; the client learns where to and retries");

/// A home movement: `key`'s home goes from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Movement {
    pub key: RowKey,
    pub from: u16,
    pub to: u16,
}

/// The homes a transaction expects of the keys its client knows moved, sorted by key; a key not
/// listed is expected at its partition's home.
pub type Expected = Vec<(RowKey, u16)>;

/// The home `expected` gives `key`.
pub fn expected_home(node: &NodeState, expected: &[(RowKey, u16)], key: RowKey) -> u16 {
    match expected.binary_search_by_key(&key, |(k, _)| *k) {
        Ok(i) => expected[i].1,
        Err(_) => node.home_of(key),
    }
}

/// A node's cache of the homes that moved, shared by its workers (clients route by it, its
/// scheduler and the outcomes it hears update it). Bounded by the keys.
#[derive(Default)]
pub struct HomeDirectory {
    moved: parking_lot::RwLock<FxHashMap<RowKey, u16>>,
    /// Whether any home ever moved: until then a client looks nothing up.
    any: AtomicBool,
}

impl HomeDirectory {
    /// What a transaction over `keys` expects, as its client knows now.
    pub fn expected(&self, keys: &KeySet) -> Expected {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let moved = self.moved.read();
        let mut out: Expected =
            keys.reads.iter().chain(&keys.writes).filter_map(|k| Some((*k, *moved.get(k)?))).collect();
        out.sort_unstable();
        out.dedup_by_key(|(k, _)| *k);
        out
    }

    /// The home this node knows of `key`.
    pub fn home(&self, node: &NodeState, key: RowKey) -> u16 {
        let moved = self.any.load(Ordering::Acquire).then(|| self.moved.read().get(&key).copied());
        moved.flatten().unwrap_or_else(|| node.home_of(key))
    }

    /// Learn that `key`'s home is `home`.
    pub fn learn(&self, node: &NodeState, key: RowKey, home: u16) {
        let mut moved = self.moved.write();
        if home == node.home_of(key) {
            moved.remove(&key);
        } else {
            moved.insert(key, home);
            self.any.store(true, Ordering::Release);
        }
    }
}

/// The homes of the keys a data node holds that moved, kept by its scheduler: the state a
/// movement changes, and what a run checks its expected homes against.
#[derive(Default, Serialize, Deserialize)]
pub struct StoredHomes(FxHashMap<RowKey, u16>);

impl StoredHomes {
    pub fn home(&self, node: &NodeState, key: RowKey) -> u16 {
        self.0.get(&key).copied().unwrap_or_else(|| node.home_of(key))
    }

    pub fn set(&mut self, node: &NodeState, key: RowKey, home: u16) {
        if home == node.home_of(key) {
            self.0.remove(&key);
        } else {
            self.0.insert(key, home);
        }
    }

    /// Keys that moved and where to.
    pub fn iter(&self) -> impl Iterator<Item = (RowKey, u16)> + '_ {
        self.0.iter().map(|(k, h)| (*k, *h))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
