//! Primo (Lai, Lo, Fan, Zhou, Ma, Peng, Li; "Knock Out 2PC with Practicality Intact", its
//! technical report): distributed transactions that commit with one message per partition, no
//! prepare and no vote, made durable together by watermark group commit. dtx's is its first
//! open implementation (the paper has no public code), so what the paper leaves open is said
//! here where it is decided.
//!
//! **Write-conflict-free concurrency control (WCF, §4).** A transaction starts local and runs
//! TicToc: it reads without locks, keeping each version's lease, buffers its writes, and at
//! commit locks its writes (NO_WAIT), takes its timestamp from the leases and validates its reads
//! at it. At its first access to another partition it turns distributed: it locks (exclusive,
//! WAIT_DIE) every record it has read here and checks that none changed since (a changed one
//! aborts it, `primo-switch-changed`, and its retry starts distributed), then locks everything it
//! reads from then on, wherever it lives. Its writes are a subset of its reads (a write to a key
//! it did not read first takes a dummy read, which only locks). Holding every lock it needs, its
//! commit cannot conflict: it computes its timestamp from the leases (at least every `wts` it
//! read, past every `rts` it overwrites), extends what it read and installs what it wrote here,
//! releases, and sends each partition it touched one `Install` that does the same there.
//! - A local transaction reads records a distributed one holds (TicToc's reads ignore locks) and
//!   commits if its timestamp lies in their leases; only an extension conflicts with the lock.
//!   The aborts that costs are counted (`primo-wcf-local-aborts`; the paper: under 2%).
//! - In one-shot mode the declared keys tell at once whether a transaction is distributed: one
//!   that is locks its declared keys from the start (remote ones one `Lock` per partition, in
//!   parallel), which is the switch made before the first read rather than at the first remote
//!   one; interactive mode switches as the paper describes.
//! - A blind write's dummy read (§4.2) rides with a read to the same partition: in one-shot mode
//!   in the first round (`KeySet::is_blind`), and a partition written
//!   only blindly costs a round trip of its own at commit (`primo-dummy-read-rounds`), the
//!   paper's "extra roundtrip"; `dummy_reads=first-round` locks those in the first round too, an
//!   extension the declared keys allow. Interactive mode takes every dummy read at commit, one
//!   `Lock` per partition in parallel.
//! - Aborted attempts retry after the driver's backoff (dtx's, shared by every protocol), not the
//!   paper's own 0.5 ms doubling, so that the comparison is of the protocols.
//!
//! **Watermark group commit (§5).** `twopc::commit::watermark`: a client hears of its commit once the
//! global watermark passes its timestamp; a participant holds a transaction active (and its
//! watermark below it) from its first lock there until its install is logged. `commit=epoch`
//! runs the same concurrency control under COCO's epoch group commit instead, the paper's
//! comparison of the two ([`group_commit`] says how each is used).
//!
//! Simplified, and why:
//! - Read-only transactions lock as the others do: the paper's snapshot reads for them (as Silo's)
//!   are not built.
//! - A scan locks the rows it returns, not the gaps (as every concurrency control in dtx); the
//!   paper's predicate locks and its 2PC fallback for large scans are not built.
//!
//! **`wcf=off`, the ablation (§6.2, Fig. 4b: "we replace it with classic 2PL and add back 2PC
//! for atomicity, but still use TicToc for local transactions").** A distributed transaction
//! takes shared locks on what it reads, and at commit a prepare round upgrades (or takes) the
//! exclusive lock on each record it writes: the same `Lock` message, in exclusive mode, to each
//! partition it writes, answered with a vote (the leases, or an abort: WAIT_DIE dies here when
//! two readers both upgrade); then the decision is the `Install`. So its commit costs the round
//! trip WCF saves, with every lock held across it. Watermark group commit stays unless asked
//! otherwise: the paper's bar without WCF ran with COCO's epochs, `primo:wcf=off:commit=epoch`
//! (its prepare logs no vote either way: a crash rolls the watermark or the epoch back).
//!
//! Where `primo` lives (paths under `crates/dtx/src/`; `dtx protocols --options primo` prints this map):
//! - `protocols/primo/mod.rs`: its options, and what it departs from;
//! - `protocols/primo/coordinator.rs`: WCF: local TicToc, the switch to distributed, an install per partition;
//! - `protocols/primo/participant.rs`: a partition's locks, dummy reads and installs;
//! - `protocols/primo/meta.rs`: leases and the lock word;
//! - `protocols/primo/group_commit.rs`: how its commits become durable (commit=wm or epoch);
//! - `protocols/twopc/commit/watermark.rs`: watermark group commit: W_p, W_g, records, recovery;
//! - `replication/wm_recovery.rs`: the agreement after a failure.

pub mod coordinator;
pub mod group_commit;
pub mod messages;
pub mod meta;
pub mod participant;

#[cfg(test)]
mod tests;

use crate::protocols::twopc::durable::PlainLog;
use crate::protocols::twopc::record_lock::Mode;
use crate::protocols::twopc::{Cc, CcWorker};
use crate::protocols::{OptionKind, OptionSpec, Options};
use crate::txn::Reason;
use meta::PrimoMeta;

/// Primo's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Primo {
    /// Longest an older transaction waits for a lock (WAIT_DIE) before it aborts.
    pub lock_wait_us: u64,
    /// Write-conflict-free: distributed transactions lock what they read exclusively and commit
    /// without a prepare round (`wcf=off`: shared read locks and a prepare that upgrades them).
    pub wcf: bool,
    /// One-shot mode: a blind write's dummy read goes in the first round only with a normal
    /// read to its partition (§4.2); `dummy_reads=first-round`: always.
    pub dummies_first_round: bool,
}

impl Primo {
    pub fn new(o: &Options) -> Primo {
        Primo {
            lock_wait_us: o.u64(crate::protocols::twopc::record_lock::LOCK_WAIT_OPTION.name),
            wcf: o.choice(WCF_OPTION.name) == "on",
            dummies_first_round: o.choice(DUMMY_READS_OPTION.name) == "first-round",
        }
    }

    /// The lock a distributed transaction takes on what it reads.
    pub fn read_mode(&self) -> Mode {
        match self.wcf {
            true => Mode::Exclusive,
            false => Mode::Shared,
        }
    }
}

/// The ablation of §6.2: `wcf=off` runs distributed transactions under 2PL with a prepare round.
pub const WCF_OPTION: OptionSpec = OptionSpec {
    name: "wcf",
    kind: OptionKind::Choice(&["on", "off"]),
    default: "on",
    help: "on: distributed reads locked exclusively, no prepare (WCF); off: shared read locks and a prepare round that upgrades the writes (the paper's 2PL+2PC ablation)",
};

/// Where a blind write's dummy read goes in one-shot mode. The paper's (§4.2): "batched with a
/// normal remote read" to the same partition, and "when there is no normal remote read to batch
/// with, an extra roundtrip is required", taken at commit here as the write's lock. A one-shot
/// procedure declares its writes before it runs, so dtx could lock them all in its first round:
/// `first-round`, an extension the paper's engine, which learns of a write as it is made, has
/// not. Interactive mode takes every dummy read at commit (one `Lock` per partition).
pub const DUMMY_READS_OPTION: OptionSpec = OptionSpec {
    name: "dummy_reads",
    kind: OptionKind::Choice(&["with-reads", "first-round"]),
    default: "with-reads",
    help: "one-shot mode: with-reads: a blind write's dummy read (its lock) rides with a read to its partition, and a \
           partition only written blindly costs a round trip at commit (the paper's §4.2); first-round: every declared \
           blind write is locked in the first round (dtx's extension)",
};

/// How commits become durable ([`group_commit`]): the paper's watermark, or COCO's epochs for
/// the paper's comparison of the two under the same concurrency control (Fig. 11-13).
pub const COMMIT_OPTION: OptionSpec = OptionSpec {
    name: "commit",
    kind: OptionKind::Choice(&["wm", "epoch"]),
    default: "wm",
    help: "wm: watermark group commit (the paper's); epoch: COCO's epoch group commit (the paper's comparison, Fig. 11-13)",
};

/// A worker running Primo.
pub type PrimoWorker = CcWorker<Primo>;

/// Its options.
pub const OPTIONS: &[OptionSpec] = &[
    WCF_OPTION,
    DUMMY_READS_OPTION,
    COMMIT_OPTION,
    crate::protocols::twopc::commit::watermark::WM_OPTION,
    crate::protocols::twopc::commit::watermark::FLOOR_OPTION,
    crate::protocols::twopc::commit::epoch::EPOCH_OPTION,
    crate::protocols::twopc::record_lock::LOCK_WAIT_OPTION,
    crate::protocols::twopc::ORPHAN_OPTION,
];

pub const LOCAL_VERSION_CHANGED: Reason = Reason::new("primo-local-version-changed");
pub const LOCAL_READ_LOCKED: Reason = Reason::new("primo-local-read-locked");
pub const LOCAL_WRITE_LOCKED: Reason = Reason::new("primo-local-write-locked");
pub const SWITCH_CHANGED: Reason = Reason::new("primo-switch-changed");

/// The abort reasons it defines (distributed transactions abort only on a lock, with the shared
/// `wait-die` and `lock-timeout`).
pub const ABORTS: &[(&str, &str)] = &[
    (LOCAL_VERSION_CHANGED.name(), "a local transaction's read has a newer version than the one read (TicToc)"),
    (
        LOCAL_READ_LOCKED.name(),
        "a local transaction's read must be extended to its timestamp but another transaction holds the record",
    ),
    (LOCAL_WRITE_LOCKED.name(), "a local transaction's write was locked by another transaction (NO_WAIT)"),
    (
        SWITCH_CHANGED.name(),
        "turning distributed, a record read locally had changed when it was locked; the retry starts distributed",
    ),
];

/// The counter of local aborts caused by a distributed transaction's read lock (WCF's cost): a
/// validation whose extension it refused, or a write it held.
pub const WCF_LOCAL_ABORTS: &str = "primo-wcf-local-aborts";

/// The counter of commits that took a round trip for dummy reads alone (blind writes to a
/// partition the transaction did not otherwise read), the cost §4.2 names.
pub const DUMMY_READ_ROUNDS: &str = "primo-dummy-read-rounds";

/// The most transactions a node remembers to start distributed: each is one a client of it is
/// retrying after `primo-switch-changed`; past this many, the memory starts over (a transaction
/// forgotten only starts local once more).
const MAX_START_DISTRIBUTED: usize = 1 << 16;

/// What a node keeps beside its storage: which retried transactions start distributed.
#[derive(Default)]
pub struct PrimoNode {
    /// (coordinator worker, first attempt's start) of each.
    start_distributed: parking_lot::Mutex<rustc_hash::FxHashSet<(u16, u64)>>,
}

impl PrimoNode {
    /// The transaction whose first attempt started at `first_start_us` on `worker` failed to turn
    /// distributed: its retry starts distributed.
    pub fn start_distributed(&self, worker: u16, first_start_us: u64) {
        let mut set = self.start_distributed.lock();
        if set.len() >= MAX_START_DISTRIBUTED {
            set.clear();
        }
        set.insert((worker, first_start_us));
    }

    /// Whether this attempt starts distributed (forgotten once asked).
    pub fn take_distributed(&self, worker: u16, first_start_us: u64) -> bool {
        let mut set = self.start_distributed.lock();
        !set.is_empty() && set.remove(&(worker, first_start_us))
    }
}

impl crate::protocols::twopc::FromNode<Primo> for PrimoNode {
    fn from_node(_cc: &Primo, _node: &crate::protocols::twopc::NodeShared<PrimoMeta>, _recovered: &PlainLog) -> Self {
        PrimoNode::default()
    }
}

impl Cc for Primo {
    const NAME: &'static str = "primo";
    type Meta = PrimoMeta;
    type NodeState = PrimoNode;
    type Log = PlainLog;
}
