//! Every protocol dtx knows, and how a user names one with its options (`NAME[:KEY=VALUE]...`).

use super::options::{self, OptionSpec, Options};
use super::{calvin, detock, maat, mvcc, occ, primo, rolis, silo, slog, sundial, tictoc, twopc, twopl, Protocol};
use std::sync::Arc;

pub struct ProtocolInfo {
    pub name: &'static str,
    pub status: &'static str,
    /// What it promises, and what `--verify` checks.
    pub guarantee: Guarantee,
    pub description: &'static str,
    /// The options a variant of it may set (`dtx protocols --options NAME` lists them).
    pub options: &'static [OptionSpec],
    /// The abort reasons it defines beyond the shared ones in [`crate::txn::Abort`]: name, meaning.
    pub aborts: &'static [(&'static str, &'static str)],
    /// The protocol with its options set.
    pub make: fn(&Options) -> Arc<dyn Protocol>,
    /// Where each of its mechanisms lives: what it is, and the file or folder under
    /// `crates/dtx/src/` that holds it (`dtx protocols --options NAME` prints them; a test
    /// checks that each exists and that a protocol's own folder names them in its header).
    pub lives: &'static [(&'static str, &'static str)],
}

/// What a protocol promises about the order its transactions take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarantee {
    /// Some serial order explains every committed transaction.
    Serializable,
    /// ... and that order agrees with real time: a transaction that ended before another
    /// started comes first (2PL over 2PC, OCC validating under its write locks, Calvin, SLOG,
    /// Detock).
    StrictSerializable,
}

impl Guarantee {
    pub fn as_str(self) -> &'static str {
        match self {
            Guarantee::Serializable => "serializable",
            Guarantee::StrictSerializable => "strict-serializable",
        }
    }
}

/// Every protocol dtx knows. `status`: `ready` (implemented and checked), or `planned`.
pub const REGISTRY: &[ProtocolInfo] = &[
    ProtocolInfo {
        name: "2pl-nowait",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "two-phase locking, NO_WAIT (abort on conflict), with 2PC",
        options: &[twopc::ORPHAN_OPTION, COMMIT, EPOCH],
        aborts: &[],
        lives: &[
            ("locking and 2PC, coordinator side", "protocols/twopl/coordinator.rs"),
            ("locks for remote transactions, votes, installs", "protocols/twopl/participant.rs"),
            ("the record lock (NO_WAIT)", "protocols/twopc/record_lock.rs"),
            ("2PC and its commit policies", "protocols/twopc/skeleton.rs"),
            ("the log and recovery", "protocols/twopc/durable.rs"),
        ],
        make: |o| two_pc(twopl::TwoPl { policy: twopl::Policy::NoWait, lock_wait_us: 0, detect_us: 0 }, o),
    },
    ProtocolInfo {
        name: "2pl-waitdie",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "two-phase locking, WAIT_DIE (older waits, younger dies), with 2PC",
        options: &[twopl::LOCK_WAIT_OPTION, twopc::ORPHAN_OPTION, COMMIT, EPOCH],
        aborts: &[],
        lives: &[
            ("locking and 2PC, coordinator side", "protocols/twopl/coordinator.rs"),
            ("locks for remote transactions, votes, installs", "protocols/twopl/participant.rs"),
            ("the record lock (WAIT_DIE)", "protocols/twopc/record_lock.rs"),
            ("2PC and its commit policies", "protocols/twopc/skeleton.rs"),
            ("the log and recovery", "protocols/twopc/durable.rs"),
        ],
        make: |o| {
            two_pc(
                twopl::TwoPl {
                    policy: twopl::Policy::WaitDie,
                    lock_wait_us: o.u64(twopl::LOCK_WAIT_OPTION.name),
                    detect_us: 0,
                },
                o,
            )
        },
    },
    ProtocolInfo {
        name: "2pl-detect",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "two-phase locking, every conflict waits; a node breaks a cycle of its own waits as it forms, node 0 gathers the wait-for graph across nodes when a node tells it of a new wait (or every detect_us) and aborts a random transaction of each cycle (the Detock thesis's CockroachDB-like baseline), with 2PC",
        options: &[twopl::DETECT_OPTION, twopl::DETECTION_OPTION, twopl::DETECT_LOCK_WAIT_OPTION, twopc::ORPHAN_OPTION],
        aborts: twopl::DETECT_ABORTS,
        lives: &[
            ("locking and 2PC, coordinator side", "protocols/twopl/coordinator.rs"),
            ("locks for remote transactions, waits, local cycles", "protocols/twopl/participant.rs"),
            ("the wait-for graph and node 0's detector", "protocols/twopl/deadlock.rs"),
            ("breaking cycles", "protocols/graph.rs"),
            ("the record lock (waits queued)", "protocols/twopc/record_lock.rs"),
            ("2PC", "protocols/twopc/skeleton.rs"),
        ],
        make: |o| {
            two_pc(
                twopl::TwoPl {
                    policy: twopl::Policy::Detect,
                    lock_wait_us: o.u64(twopl::DETECT_LOCK_WAIT_OPTION.name),
                    // 0: no detection (`TwoPl::detects`).
                    detect_us: if o.bool(twopl::DETECTION_OPTION.name) { o.u64(twopl::DETECT_OPTION.name) } else { 0 },
                },
                o,
            )
        },
    },
    ProtocolInfo {
        name: "calvin",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "deterministic: sequenced input log, ordered locks in log order, reconnaissance (Calvin)",
        options: calvin::OPTIONS,
        aborts: calvin::ABORTS,
        lives: &[
            ("the client side: submit, wait for the outcome", "protocols/calvin/mod.rs"),
            ("sequencers and their batches", "protocols/calvin/sequencer.rs"),
            ("schedulers: batches in the global order", "protocols/calvin/scheduler.rs"),
            ("deterministic ordered locking", "protocols/calvin/locks.rs"),
            ("reconnaissance (OLLP)", "txn/recon.rs"),
            ("the input log and recovery by running it again", "protocols/calvin/input_log.rs"),
            ("checkpoints", "protocols/calvin/checkpoint.rs"),
        ],
        make: |o| Arc::new(calvin::Calvin::new(o)),
    },
    ProtocolInfo {
        name: "slog",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "deterministic multi-region: a log per home region, multi-home transactions ordered globally and locked in pieces (SLOG)",
        options: slog::OPTIONS,
        aborts: slog::ABORTS,
        lives: &[
            ("its options, regions and layout", "protocols/slog/mod.rs"),
            ("the global orderer of multi-home transactions", "protocols/calvin/orderer.rs"),
            ("a log per home region: sequencers", "protocols/calvin/sequencer.rs"),
            ("schedulers interleaving the regions' logs", "protocols/calvin/scheduler.rs"),
            ("locks in pieces, in log order", "protocols/calvin/locks.rs"),
            ("remastering (homes that move)", "protocols/calvin/homes.rs"),
            ("checkpoints (the orderer's: orderer.rs)", "protocols/calvin/checkpoint.rs"),
        ],
        make: |o| Arc::new(slog::new(o)),
    },
    ProtocolInfo {
        name: "detock",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "deterministic multi-region: logs per home region, multi-home pieces stamped to land together, a dependency graph with deterministic deadlock resolution (Detock)",
        options: detock::OPTIONS,
        aborts: detock::ABORTS,
        lives: &[
            ("its options, regions and layout", "protocols/detock/mod.rs"),
            ("opportunistic ordering: stamps, delay probes, pieces sent to each home", "protocols/calvin/sequencer.rs"),
            ("a home's copies of a piece told apart", "protocols/calvin/piece_seqs.rs"),
            ("the dependency graph and deterministic deadlock resolution", "protocols/depgraph.rs"),
            ("the schedulers that feed it and run what it hands on", "protocols/calvin/scheduler.rs"),
            ("home movement", "protocols/calvin/homes.rs"),
            ("checkpoints", "protocols/calvin/checkpoint.rs"),
        ],
        make: |o| Arc::new(detock::new(o)),
    },
    ProtocolInfo {
        name: "sundial",
        status: "ready",
        guarantee: Guarantee::Serializable,
        description: "logical leases, WAIT_DIE writes, optimistic reads, a cache of remote reads (Sundial)",
        options: sundial::OPTIONS,
        aborts: sundial::ABORTS,
        lives: &[
            ("execution, the cache of remote reads, commit", "protocols/sundial/coordinator.rs"),
            ("leases renewed, WAIT_DIE writes, votes", "protocols/sundial/participant.rs"),
            ("logical leases", "protocols/twopc/lease.rs"),
            ("what it logs beside 2PC", "protocols/twopc/lease_log.rs"),
            ("the write lock (WAIT_DIE)", "protocols/twopc/record_lock.rs"),
            ("2PC", "protocols/twopc/skeleton.rs"),
        ],
        make: |o| two_pc(sundial::Sundial::new(o), o),
    },
    ProtocolInfo {
        name: "tictoc",
        status: "ready",
        guarantee: Guarantee::Serializable,
        description: "data-driven timestamps: leases per record, NO_WAIT write locks at commit, reads validated and extended (TicToc); serializable, not strict: a logical timestamp may order a later transaction first",
        options: tictoc::OPTIONS,
        aborts: tictoc::ABORTS,
        lives: &[
            ("execution and the commit timestamp", "protocols/tictoc/coordinator.rs"),
            ("validation and extension of remote reads", "protocols/tictoc/participant.rs"),
            ("logical leases", "protocols/twopc/lease.rs"),
            ("what it logs beside 2PC", "protocols/twopc/lease_log.rs"),
            ("2PC", "protocols/twopc/skeleton.rs"),
        ],
        make: |o| two_pc(tictoc::TicToc, o),
    },
    ProtocolInfo {
        name: "maat",
        status: "ready",
        guarantee: Guarantee::Serializable,
        description: "timestamp-range OCC with soft locks (MaaT, as improved by the Sundial authors)",
        options: &[twopc::ORPHAN_OPTION],
        aborts: maat::ABORTS,
        lives: &[
            ("execution and the commit timestamp", "protocols/maat/coordinator.rs"),
            ("soft locks and ranges at a participant", "protocols/maat/participant.rs"),
            ("timestamp ranges", "protocols/maat/range.rs"),
            ("what it logs beside 2PC", "protocols/maat/log.rs"),
            ("2PC", "protocols/twopc/skeleton.rs"),
        ],
        make: |o| two_pc(maat::Maat, o),
    },
    ProtocolInfo {
        name: "mvcc",
        status: "ready",
        guarantee: Guarantee::Serializable,
        description:
            "static-timestamp MVCC: wall-clock timestamps fixed at start (the Sundial paper's Sec. 6.6 baseline)",
        options: &[twopc::ORPHAN_OPTION],
        aborts: mvcc::ABORTS,
        lives: &[
            ("execution at a start timestamp", "protocols/mvcc/coordinator.rs"),
            ("versions, reads and late writes at a participant", "protocols/mvcc/participant.rs"),
            ("what it logs beside 2PC", "protocols/mvcc/log.rs"),
            ("2PC", "protocols/twopc/skeleton.rs"),
        ],
        make: |o| two_pc(mvcc::Mvcc, o),
    },
    ProtocolInfo {
        name: "occ",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "Silo-style OCC (lock writes, validate reads) with 2PC; the F1-like baseline",
        options: &[twopc::ORPHAN_OPTION, COMMIT, EPOCH],
        aborts: &[],
        lives: &[
            ("execution, locking writes, validating reads", "protocols/occ/coordinator.rs"),
            ("validation and installs at a participant", "protocols/occ/participant.rs"),
            ("buffered writes", "protocols/twopc/buffered.rs"),
            ("2PC and its commit policies", "protocols/twopc/skeleton.rs"),
            ("the log and recovery", "protocols/twopc/durable.rs"),
        ],
        make: |o| two_pc(occ::Occ, o),
    },
    ProtocolInfo {
        name: "coco",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "OCC with COCO's epoch group commit: acknowledged when the epoch commits, rolled back with it",
        options: &[twopc::ORPHAN_OPTION, EPOCH],
        aborts: &[],
        lives: &[
            ("its concurrency control: OCC", "protocols/occ/coordinator.rs"),
            ("validation and installs at a participant", "protocols/occ/participant.rs"),
            ("epoch group commit: epochs, their agreement, records, recovery", "protocols/twopc/commit/epoch.rs"),
            ("the commit policy seam", "protocols/twopc/commit/mod.rs"),
            ("2PC, asking the gate", "protocols/twopc/skeleton.rs"),
            ("its registry entry (OCC under commit=epoch)", "protocols/registry.rs"),
        ],
        make: |o| {
            let commit = twopc::commit::CommitPolicy::Epoch { epoch_us: o.u64(EPOCH.name) };
            two_pc_committing(occ::Occ, o, commit)
        },
    },
    ProtocolInfo {
        name: "primo",
        status: "ready",
        guarantee: Guarantee::Serializable,
        description: "write-conflict-free CC (local TicToc, distributed reads X-locked, one install message per partition, no 2PC) with watermark group commit (Primo); serializable, not strict: a logical timestamp may order a later transaction first",
        options: primo::OPTIONS,
        aborts: primo::ABORTS,
        lives: &[
            ("its options, and what it departs from", "protocols/primo/mod.rs"),
            ("WCF: local TicToc, the switch to distributed, an install per partition", "protocols/primo/coordinator.rs"),
            ("a partition's locks, dummy reads and installs", "protocols/primo/participant.rs"),
            ("leases and the lock word", "protocols/primo/meta.rs"),
            ("how its commits become durable (commit=wm or epoch)", "protocols/primo/group_commit.rs"),
            ("watermark group commit: W_p, W_g, records, recovery", "protocols/twopc/commit/watermark.rs"),
            ("the agreement after a failure", "replication/wm_recovery.rs"),
        ],
        make: |o| two_pc(primo::Primo::new(o), o),
    },
    ProtocolInfo {
        name: "silo",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "Silo: one multi-core node, OCC with TID words chosen without a shared counter; unreplicated (with --durability wal, a log per worker, released once every log is durable past it)",
        options: silo::OPTIONS,
        aborts: &[],
        lives: &[
            ("its options", "protocols/silo/mod.rs"),
            ("an attempt's execution and commit", "protocols/silo/txn.rs"),
            ("the TID word and TID choice", "protocols/silo/meta.rs"),
            ("logs, release once every log is durable past a TID", "protocols/silo/stream.rs"),
            ("log entries, replay and recovery", "protocols/silo/log.rs"),
            ("snapshot transactions", "protocols/silo/snapshot.rs"),
        ],
        make: |o| Arc::new(silo::Silo::new(silo::SiloConfig::from_options(o, false))),
    },
    ProtocolInfo {
        name: "rolis",
        status: "ready",
        guarantee: Guarantee::StrictSerializable,
        description: "Rolis: Silo on one leader, each worker's log replicated on its own Raft group, released below the watermark over the streams, replayed by replicas (--durability replicated)",
        options: rolis::OPTIONS,
        aborts: &[],
        lives: &[
            ("its registry entry and options, and what it departs from", "protocols/rolis/mod.rs"),
            ("execution on the leader (Silo)", "protocols/silo/txn.rs"),
            ("streams, batches, the watermark and release", "protocols/silo/stream.rs"),
            ("replay on replicas, failover and recovery", "protocols/silo/log.rs"),
            ("a Raft group per worker's log", "replication/raft_log.rs"),
            ("the replay-only measurement", "protocols/silo/replay.rs"),
        ],
        make: rolis::new,
    },
];

/// The concurrency controls that take `commit=epoch`, as variants, beside `coco` (which is
/// OCC with it): the sweeps that test epoch group commit run each of them.
pub const EPOCH_VARIANTS: &[&str] = &[
    "2pl-nowait:commit=epoch",
    "2pl-waitdie:commit=epoch",
    "sundial:commit=epoch",
    "tictoc:commit=epoch",
    "primo:commit=epoch",
];

/// The concurrency controls over the skeleton that take `commit=wm` besides Primo (whose
/// default it is): the sweeps that test watermark group commit run each of them.
pub const WM_VARIANTS: &[&str] = &["tictoc:commit=wm", "sundial:commit=wm"];

/// Variants that change how a protocol works, beside its default: the ablations, and the paths
/// off by default (homes that move). The shared sweeps check them as they do the ready
/// protocols.
pub const OPTION_VARIANTS: &[&str] = &[
    "primo:wcf=off",
    "primo:wcf=off:commit=epoch",
    "slog:rehome=0.2",
    "slog:orderer_threads=1",
    "detock:rehome=0.2",
    "silo:snapshots=true:snapshot_us=2000",
    "rolis:snapshots=true:snapshot_us=2000",
];

/// Does `p` acknowledge its commits by epoch unless told otherwise (`coco`)? Nothing it commits
/// is acknowledged sooner than an epoch, and a crash fails the epoch it interrupts: tests size
/// their runs and fault intervals by it.
pub fn acknowledges_by_epoch(p: &ProtocolInfo) -> bool {
    let commit = p.options.iter().find(|o| o.name == COMMIT.name).map_or("epoch", |o| o.default);
    commit == "epoch" && p.options.iter().any(|o| o.name == EPOCH.name)
}

/// `p` as a test names it when crashes come every `interval_us` or so: a protocol that
/// acknowledges by epoch gets epochs a tenth of that, and one that closes its batches on a timer
/// (`batch_us`: calvin, slog, detock) batches as often (at least 1 ms each), so that some commit
/// between crashes and each of its logs' writers appends several records; any other keeps its
/// name.
pub fn paced_for_crashes_every(p: &ProtocolInfo, interval_us: u64) -> String {
    let tenth_us = (interval_us / 10).max(1_000);
    let mut name = p.name.to_string();
    if acknowledges_by_epoch(p) {
        name += &format!(":{}={tenth_us}", EPOCH.name);
    }
    if p.options.iter().any(|o| o.name == "batch_us") {
        name += &format!(":batch_us={tenth_us}");
    }
    name
}

/// Variant `name` with its node checkpoints every `every_us` where the protocol takes
/// `checkpoint_us` (calvin, slog, detock: see `calvin::checkpoint`) and the name does not set
/// it: the durability sweeps run so, so that crashes and failovers meet checkpoints; any other
/// keeps its name.
pub fn checkpointing_every(name: &str, every_us: u64) -> String {
    let takes = Variant::parse(name).is_ok_and(|v| v.info.options.iter().any(|o| o.name == "checkpoint_us"));
    match takes && !name.contains("checkpoint_us=") {
        true => format!("{name}:checkpoint_us={every_us}"),
        false => name.to_string(),
    }
}

/// The skeleton's commit policy options ([`twopc::commit`]).
const COMMIT: OptionSpec = twopc::commit::epoch::COMMIT_OPTION;
const EPOCH: OptionSpec = twopc::commit::epoch::EPOCH_OPTION;

/// A concurrency control over the 2PC skeleton, with the skeleton's options from `o`.
fn two_pc<C: twopc::Cc>(cc: C, o: &Options) -> Arc<dyn Protocol>
where
    twopc::CcWorker<C>: crate::txn::recon::SnapshotReader,
{
    let commit = match o.has(COMMIT.name).then(|| o.choice(COMMIT.name)) {
        Some("epoch") => twopc::commit::CommitPolicy::Epoch { epoch_us: o.u64(EPOCH.name) },
        Some("wm") => {
            let floor = match o.choice(twopc::commit::watermark::FLOOR_OPTION.name) {
                "watermark" => twopc::commit::watermark::Floor::Watermark,
                "time" => twopc::commit::watermark::Floor::Time,
                _ => twopc::commit::watermark::Floor::Clock,
            };
            twopc::commit::CommitPolicy::Watermark { wm_us: o.u64(twopc::commit::watermark::WM_OPTION.name), floor }
        }
        _ => twopc::commit::CommitPolicy::TwoPc,
    };
    two_pc_committing(cc, o, commit)
}

/// [`two_pc`] with its commit policy given.
fn two_pc_committing<C: twopc::Cc>(cc: C, o: &Options, commit: twopc::commit::CommitPolicy) -> Arc<dyn Protocol>
where
    twopc::CcWorker<C>: crate::txn::recon::SnapshotReader,
{
    let config = twopc::TwoPcConfig { orphan_after_us: o.u64(twopc::ORPHAN_OPTION.name), commit };
    Arc::new(twopc::TwoPc { cc, config })
}

/// Protocols named in the interface contract that later issues implement.
pub const PLANNED: &[(&str, &str)] = &[
    ("aria", "deterministic batches, reservation-based (Aria)"),
    ("hackwrench", "batched commit with fine-grained repair and caching (Hackwrench)"),
    ("sunstorm", "multi-writer shared storage across regions (SunStorm)"),
    ("janus", "dependency-tracking consensus + CC (Janus)"),
    ("tapir", "inconsistent replication + OCC (TAPIR)"),
];

/// A protocol with its options set: what one run of the bench runs. Its `name` is the full
/// variant as the user wrote it (`2pl-waitdie:lock_wait_us=200`), which the table and the JSON
/// call it.
#[derive(Clone)]
pub struct Variant {
    pub name: String,
    pub info: &'static ProtocolInfo,
    pub options: Options,
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant").field("name", &self.name).field("options", &self.options).finish()
    }
}

impl Variant {
    /// Parse `NAME[:KEY=VALUE]...`, checking the name and every option; a protocol that is
    /// only planned is refused.
    pub fn parse(text: &str) -> anyhow::Result<Variant> {
        let v = Variant::parse_including_planned(text)?;
        // A test build runs the test-only protocols as a user would (the tcp tests start them).
        let runnable = v.info.status == "ready" || (cfg!(feature = "test-protocols") && v.info.status == "test");
        if !runnable {
            anyhow::bail!("protocol `{}` is planned but not implemented yet (see `dtx protocols`)", v.info.name);
        }
        Ok(v)
    }

    /// As [`Variant::parse`], but a planned protocol with code in the registry
    /// is accepted: its own tests run it through the shared simulation sweep.
    pub fn parse_including_planned(text: &str) -> anyhow::Result<Variant> {
        let (name, overrides) = options::split_variant(text);
        let info = match find(name) {
            Some(p) => p,
            None if PLANNED.iter().any(|(n, _)| *n == name) => {
                anyhow::bail!("protocol `{name}` is planned but not implemented yet (see `dtx protocols`)")
            }
            None => anyhow::bail!(
                "unknown protocol `{name}` (known: {}, or `all`)",
                REGISTRY.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            ),
        };
        let options = Options::parse(name, info.options, &overrides).map_err(|e| {
            // `commit=` or `epoch_us=` on a protocol that lacks it: say which ones take it.
            let lacks_commit_option = overrides.iter().any(|o| {
                let key = o.split('=').next().unwrap_or("").trim();
                let commit = [twopc::commit::epoch::COMMIT_OPTION.name, twopc::commit::epoch::EPOCH_OPTION.name];
                commit.contains(&key) && !info.options.iter().any(|spec| spec.name == key)
            });
            let takes_watermark = info.options.iter().any(|spec| {
                spec.name == twopc::commit::watermark::COMMIT_OPTION.name
                    && matches!(spec.kind, options::OptionKind::Choice(choices) if choices.contains(&"wm"))
            });
            let asks_watermark = !takes_watermark && overrides.iter().any(|o| o.replace(' ', "") == "commit=wm");
            match (asks_watermark, lacks_commit_option) {
                (true, _) => anyhow::anyhow!(
                    "protocol `{name}` does not take commit=wm: watermark group commit needs a logical commit \
                     timestamp fixed before validation, which only {} have",
                    twopc::commit::watermark::ACCEPTED_BY
                ),
                (false, true) => {
                    anyhow::anyhow!("{e}; commit=epoch is accepted by {}", twopc::commit::epoch::ACCEPTED_BY)
                }
                (false, false) => e,
            }
        })?;
        let full = std::iter::once(name).chain(overrides.iter().copied()).collect::<Vec<_>>().join(":");
        Ok(Variant { name: full, info, options })
    }

    /// The protocol, built with this variant's options.
    pub fn make(&self) -> Arc<dyn Protocol> {
        (self.info.make)(&self.options)
    }
}

/// The protocols that are ready: what `--protocol all` runs and every test sweep checks.
pub fn ready() -> impl Iterator<Item = &'static ProtocolInfo> {
    REGISTRY.iter().filter(|p| p.status == "ready")
}

/// The ready protocols that run with `mode` (and `replicas` copies of each log): what
/// `--protocol all` runs then, and what a sweep at that durability checks. Every one runs with
/// every durability but `silo` (unreplicated) and `rolis` (replicated only).
pub fn ready_with(mode: crate::replication::Durability, replicas: u16) -> impl Iterator<Item = &'static ProtocolInfo> {
    ready().filter(move |p| Variant::parse(p.name).is_ok_and(|v| v.make().check_durability(mode, replicas).is_ok()))
}

/// What the protocol of variant `NAME[:K=V...]` promises (serializable if it is unknown).
pub fn guarantee_of(variant: &str) -> Guarantee {
    if let Ok(v) = Variant::parse(variant.trim()) {
        return v.make().weakened_guarantee().unwrap_or(v.info.guarantee);
    }
    let name = variant.split(':').next().unwrap_or(variant).trim();
    find(name).map_or(Guarantee::Serializable, |p| p.guarantee)
}

pub fn find(name: &str) -> Option<&'static ProtocolInfo> {
    REGISTRY.iter().find(|p| p.name == name).or_else(|| test_only(name))
}

/// Protocols that exist only in test builds (and with the `test-protocols` feature, which
/// the integration tests turn on), to test the engine with; never listed, never `ready`.
#[cfg(any(test, feature = "test-protocols"))]
pub const ENGINE_TEST_PROTOCOLS: &[&ProtocolInfo] = &[&super::multilog::INFO];

#[cfg(not(any(test, feature = "test-protocols")))]
pub const ENGINE_TEST_PROTOCOLS: &[&ProtocolInfo] = &[];

/// The variants of the test-only protocols that the replicated-log sweeps run: two replicated
/// logs per node acknowledged once both are durable, and the same acknowledged by epoch group
/// commit (whose failed epochs are rolled back).
#[cfg(any(test, feature = "test-protocols"))]
pub const ENGINE_TEST_VARIANTS: &[&str] = &["multilog:logs=2", "multilog:logs=2:epoch_us=2000"];

#[cfg(not(any(test, feature = "test-protocols")))]
pub const ENGINE_TEST_VARIANTS: &[&str] = &[];

fn test_only(name: &str) -> Option<&'static ProtocolInfo> {
    ENGINE_TEST_PROTOCOLS.iter().copied().find(|p| p.name == name)
}

/// Resolve `a,b:k=v|all` into variants, with a clear error for unknown or planned names and
/// for options the protocol does not have.
pub fn resolve(list: &str) -> anyhow::Result<Vec<Variant>> {
    if list.trim() == "all" {
        return ready().map(|p| Variant::parse(p.name)).collect();
    }
    let out: Vec<Variant> =
        list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Variant::parse).collect::<anyhow::Result<_>>()?;
    if out.is_empty() {
        anyhow::bail!("--protocol names no protocol");
    }
    Ok(out)
}
