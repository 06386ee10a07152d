//! Sundial's read-only table optimizations (Sec. 4.3): a lease per table, `tab_rts`, that every
//! tuple of a read-only table is extended to at once, and speculative extension past the
//! commit timestamp asked for, by a `δ` that grows while the table stays read-only.
//!
//! Which tables are read-only: a table is until a writer locks one of its tuples on this node,
//! and never again after (the paper counts reads against writes and does not say how; a table
//! that was written once is not presumed read-only again, which keeps the rule simple and safe).
//! Safety (the paper leaves it open, the digest's \[inferred\] rule): a writer's commit timestamp
//! passes `tab_rts` (its tuple's lease reads as `[wts, max(rts, tab_rts)]` when it locks), and
//! `tab_rts` never advances once a writer holds a tuple of the table: the writer clears the
//! table's read-only mark under the table's latch before it reads `tab_rts`, and an extension
//! checks the mark under that latch.

use crate::net::NodeId;
use crate::storage::TableId;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The most a lease is extended past the commit timestamp asked for.
pub const MAX_DELTA: u64 = 1 << 12;

struct TableLease {
    read_only: AtomicBool,
    /// Every tuple of the table is extended to here.
    tab_rts: AtomicU64,
    /// The speculative extension's current `δ`.
    delta: AtomicU64,
    latch: parking_lot::Mutex<()>,
}

/// The table leases of the tables a node holds (a home's side).
pub struct TableLeases {
    tables: Vec<TableLease>,
}

impl TableLeases {
    /// `count` tables, each read-only until written; none when the optimization is off.
    pub fn new(count: usize, enabled: bool) -> Self {
        let tables = (0..if enabled { count } else { 0 })
            .map(|_| TableLease {
                read_only: AtomicBool::new(true),
                tab_rts: AtomicU64::new(0),
                delta: AtomicU64::new(0),
                latch: parking_lot::Mutex::new(()),
            })
            .collect();
        TableLeases { tables }
    }

    fn get(&self, table: TableId) -> Option<&TableLease> {
        self.tables.get(table as usize)
    }

    /// The end every tuple of `table` is extended to (0: none).
    pub fn rts(&self, table: TableId) -> u64 {
        self.get(table).map_or(0, |t| t.tab_rts.load(Ordering::Acquire))
    }

    /// A writer holds a tuple of `table`: the table is no longer read-only, and the writer's
    /// commit timestamp must pass the returned end.
    pub fn writer_floor(&self, table: TableId) -> u64 {
        let Some(t) = self.get(table) else { return 0 };
        if t.read_only.load(Ordering::Acquire) {
            let _g = t.latch.lock();
            t.read_only.store(false, Ordering::Release);
        }
        t.tab_rts.load(Ordering::Acquire)
    }

    /// Extend every tuple of a read-only `table` to `ts` plus `δ`, which then grows (doubling,
    /// up to [`MAX_DELTA`]): the new end, or `None` when the table is not read-only.
    pub fn extend(&self, table: TableId, ts: u64) -> Option<u64> {
        let t = self.get(table)?;
        if !t.read_only.load(Ordering::Acquire) {
            return None;
        }
        let _g = t.latch.lock();
        if !t.read_only.load(Ordering::Acquire) {
            return None;
        }
        let delta = t.delta.load(Ordering::Relaxed);
        t.delta.store((delta * 2).clamp(1, MAX_DELTA), Ordering::Relaxed);
        Some(t.tab_rts.fetch_max(ts + delta, Ordering::AcqRel).max(ts + delta))
    }
}

/// The table leases other nodes reported to this one's cache (a coordinator's side): a cached
/// copy of a tuple of such a table reads as `[wts, max(rts, tab_rts)]`.
#[derive(Default)]
pub struct RemoteTableLeases {
    ends: parking_lot::Mutex<FxHashMap<(NodeId, TableId), u64>>,
}

impl RemoteTableLeases {
    pub fn note(&self, node: NodeId, table: TableId, end: u64) {
        let mut ends = self.ends.lock();
        let e = ends.entry((node, table)).or_insert(0);
        *e = (*e).max(end);
    }

    pub fn rts(&self, node: NodeId, table: TableId) -> u64 {
        self.ends.lock().get(&(node, table)).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_table_extends_every_tuple_at_once_and_speculates_further_each_time() {
        let t = TableLeases::new(2, true);
        assert_eq!(t.extend(1, 10), Some(10), "δ starts at 0");
        assert_eq!(t.rts(1), 10);
        assert_eq!(t.extend(1, 20), Some(21));
        assert_eq!(t.extend(1, 20), Some(22), "δ doubles");
        assert_eq!(t.rts(0), 0, "another table keeps its own");
    }

    #[test]
    fn a_writer_ends_extensions_and_commits_past_the_table_lease() {
        let t = TableLeases::new(1, true);
        t.extend(0, 50);
        assert_eq!(t.writer_floor(0), 50, "the writer's commit timestamp must pass 50");
        assert_eq!(t.extend(0, 80), None, "never extended past a writer");
        assert_eq!(t.rts(0), 50);
    }

    #[test]
    fn off_means_no_table_leases() {
        let t = TableLeases::new(3, false);
        assert_eq!((t.extend(0, 5), t.rts(0), t.writer_floor(0)), (None, 0, 0));
    }
}
