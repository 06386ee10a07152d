//! The runtime core every protocol runs on: a single-threaded executor per worker, the worker
//! context (clock, timers, RPC, per-destination batching, seeded RNG), and three runtimes that
//! drive workers: [`sim`] (one thread, virtual time), [`local`] (threads and channels) and
//! [`tcp`] (one process per node). Protocol code sees only [`Worker`]: never a socket, a thread
//! or the wall clock.

pub mod lanes;
pub mod local;
pub mod log;
pub mod release;
pub mod sim;
pub mod tcp;

use crate::net::{self, Addr, Batch, Kind, NetStats, Packet};
use crate::util::Rng;
use async_task::Runnable;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Tasks a worker runs before it flushes its batches and looks for packets again: a scheduler
/// quantum. Larger amortizes more; smaller keeps remote replies from waiting behind a long run
/// of local transactions. Every runtime uses the same quantum.
pub const STEP_TASKS: usize = 64;

pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Something that wakes the thread an executor runs on (a no-op in the simulator).
pub type Unpark = Arc<dyn Fn() + Send + Sync>;

/// More ready tasks than a worker's closed loop can produce (`--inflight` at most 100,000, a few
/// tasks each): more means a task leak.
pub const MAX_READY_TASKS: usize = 1 << 22;

/// A single-threaded executor. Tasks are `!Send` and always run on the thread that spawned them;
/// wakers may be called from other threads (a lock released by another worker of the same node),
/// which is why the ready queue is behind a mutex and waking calls `unpark`.
///
/// The executor keeps a handle on every task it spawned (pruned of finished ones as they pile
/// up), so that [`Executor::shutdown`] can drop the futures still pending. Without it a run's
/// tasks would outlive it: a pending task is owned by the wakers it left in the worker's timers,
/// lock queues and logs, and its future owns those in turn (a cycle of `Rc`s), so every
/// simulated world of an experiment stayed in memory until the process ended.
pub struct Executor {
    ready: Arc<Mutex<VecDeque<Runnable>>>,
    unpark: Unpark,
    tasks: RefCell<Vec<async_task::Task<()>>>,
    /// Whether it keeps those handles (`sim` and `local`, which run many runs in one process).
    /// A `tcp` server's workers end with their run and the process soon after: their tasks are
    /// detached, never dropped, so that no future's destructor runs as a worker thread exits
    /// while the server answers its `stop`.
    keeps_tasks: bool,
    /// Prune the finished tasks' handles once this many are kept (twice the live ones after
    /// the last prune): amortized, a spawn costs one push.
    prune_at: Cell<usize>,
}

/// Fewest task handles an executor keeps before it prunes the finished ones.
const PRUNE_TASKS_AT_LEAST: usize = 1024;

impl Executor {
    pub fn new(unpark: Unpark) -> Self {
        Executor {
            ready: Arc::new(Mutex::new(VecDeque::new())),
            unpark,
            tasks: RefCell::new(Vec::new()),
            keeps_tasks: true,
            prune_at: Cell::new(PRUNE_TASKS_AT_LEAST),
        }
    }

    /// An executor whose tasks are detached: [`Executor::shutdown`] cannot drop them.
    pub fn detached(unpark: Unpark) -> Self {
        Executor { keeps_tasks: false, ..Executor::new(unpark) }
    }

    /// Cancel every task this executor spawned and drop their futures: the runtime never runs
    /// this worker again (its run or its incarnation ended). A future dropped here may wake
    /// other tasks of this executor; they are cancelled too, so draining the ready queue until
    /// it stays empty drops them all.
    pub fn shutdown(&self) {
        let tasks = std::mem::take(&mut *self.tasks.borrow_mut());
        // Dropping a pending task's handle cancels it and schedules it once, so that its
        // future is dropped where its runnable is.
        drop(tasks);
        loop {
            let next = self.ready.lock().pop_front();
            match next {
                Some(r) => drop(r),
                None => break,
            }
        }
    }

    pub fn spawn(&self, fut: impl Future<Output = ()> + 'static) {
        let ready = self.ready.clone();
        let unpark = self.unpark.clone();
        let schedule = move |r: Runnable| {
            let was_empty = {
                let mut q = ready.lock();
                q.push_back(r);
                // A task is queued at most once until it runs, and tasks are bounded by the
                // transactions in flight and the messages they wait for (a closed loop).
                debug_assert!(q.len() <= MAX_READY_TASKS, "the ready queue outgrew the tasks a worker can have");
                q.len() == 1
            };
            // Only the push that makes the queue non-empty must wake the thread: the worker
            // drains the whole queue before it parks again. (A log flush wakes thousands of
            // tasks at once; one wake-up each would be a system call each.)
            if was_empty {
                unpark();
            }
        };
        let (runnable, task) = async_task::spawn_local(fut, schedule);
        self.keep(task);
        runnable.schedule();
    }

    fn keep(&self, task: async_task::Task<()>) {
        if !self.keeps_tasks {
            return task.detach();
        }
        let mut tasks = self.tasks.borrow_mut();
        tasks.push(task);
        if tasks.len() >= self.prune_at.get() {
            // A finished task's handle only holds its (empty) output: dropping it is free.
            tasks.retain(|t| !t.is_finished());
            self.prune_at.set((2 * tasks.len()).max(PRUNE_TASKS_AT_LEAST));
        }
    }

    /// Run ready tasks until none is left or `budget` tasks ran; returns how many ran.
    pub fn run_ready(&self, budget: usize) -> usize {
        let mut ran = 0;
        while ran < budget {
            let next = self.ready.lock().pop_front();
            match next {
                Some(r) => {
                    r.run();
                    ran += 1;
                }
                None => break,
            }
        }
        ran
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.lock().is_empty()
    }
}

/// Where time comes from: virtual nanoseconds in the simulator, a monotonic clock otherwise.
#[derive(Clone)]
pub enum Clock {
    Virtual(Rc<Cell<u64>>),
    Real(Instant),
}

/// Simulated CPU cost of work, charged to the worker that does it (only the simulator turns it
/// into time). Calibrated on this project's 2-core machine (docs/architecture.md): one node with
/// one worker in `local` costs 2.2-2.7 µs a YCSB transaction for the 2PL, OCC, TicToc, Sundial,
/// Primo and Silo family, which 100 ns a record-level step and 600 ns an attempt match (2026-12-07);
/// a batch costs a system call at each end (~5.5 µs per `write()`, docs/machine.md) and each
/// message its encoding and dispatch.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct CpuCost {
    /// Per record-level step: a read, a lock, a validation (a record checked again, or a lease
    /// extended, at commit) and an install each count one, so a transaction charges this about
    /// 2.4 times per operation. An install releases its record's lock in the same step; a lock
    /// released without one counts one. Every protocol counts by these rules, so that none is
    /// charged for a step another does for free.
    pub op_ns: u64,
    /// Per message sent or received.
    pub msg_ns: u64,
    /// Per packet (one batch to one destination: a system call in the real runtimes).
    pub packet_ns: u64,
    /// Fixed cost per transaction attempt (procedure dispatch, bookkeeping).
    pub txn_ns: u64,
    /// Per KiB of log records a worker appends: encoding them and copying them into the log
    /// (`silo::stream::calibration`: 70-260 ns a KiB with postcard on this machine, by batch
    /// size and buffer; every protocol's records pay it alike).
    #[serde(default = "default_log_ns_per_kib")]
    pub log_ns_per_kib: u64,
    /// Per KiB a worker decodes: every message body it receives (a sequencer's batch of a
    /// hundred requests costs its bytes, not one message's), and what a protocol decodes
    /// again inside one. Every protocol's messages pay it alike.
    #[serde(default = "default_decode_ns_per_kib")]
    pub decode_ns_per_kib: u64,
    /// Per key a transaction adds to a dependency graph (Detock, at every node of every
    /// region).
    #[serde(default = "default_graph_key_ns")]
    pub graph_key_ns: u64,
    /// Per step of a search over a wait-for graph (2PL DETECT's detector and the search at a
    /// wait's start: an edge offered or followed, a node visited or scanned;
    /// [`crate::protocols::graph::Graph::steps`]).
    #[serde(default = "default_graph_step_ns")]
    pub graph_step_ns: u64,
    /// Per wake of an idle worker by a timer of its own (nothing arrived, nothing was ready):
    /// a real worker parked and the kernel woke it. A protocol that polls (MVCC's waiting
    /// access looks again every 5 µs) pays it at each look, as it does on threads.
    #[serde(default = "default_wake_ns")]
    pub wake_ns: u64,
}

fn default_log_ns_per_kib() -> u64 {
    150
}

fn default_decode_ns_per_kib() -> u64 {
    DECODE_NS_PER_KIB
}

fn default_graph_key_ns() -> u64 {
    GRAPH_KEY_NS
}

fn default_wake_ns() -> u64 {
    WAKE_NS
}

fn default_graph_step_ns() -> u64 {
    GRAPH_STEP_NS
}

/// Per step of a wait-for graph's search (`protocols::graph::calibration`, 2026-12-07: 13-25 ns a step, by the graph's size, from 176 steps to 36,000 a round).
const GRAPH_STEP_NS: u64 = 20;

/// Per wake of an idle worker by its own timer: what `local`'s worker pays to park with a
/// timeout and run again (`rt::local::calibration`, 2026-12-07: a 5 µs `park_timeout` costs
/// 14 µs of CPU on this virtual machine, and 78 µs of wall time).
pub const WAKE_NS: u64 = 14_000;

/// Per KiB decoded: postcard decoding a sequencer's batch of requests on this machine
/// (`protocols::calvin::calibration`, 2026-12-07: 860-900 ns a KiB for YCSB-sized requests of
/// 90 bytes, 415 for 200-byte ones; small entries cost more per byte).
pub const DECODE_NS_PER_KIB: u64 = 850;

/// Per key a transaction adds to a dependency graph (`protocols::calvin::calibration`,
/// 2026-12-07: 165-290 ns a key into Detock's graph, by how often keys repeat).
const GRAPH_KEY_NS: u64 = 250;

impl CpuCost {
    /// What appending `bytes` of log records costs.
    pub fn log_ns(&self, bytes: u64) -> u64 {
        bytes * self.log_ns_per_kib / 1024
    }

    /// What decoding `bytes` costs.
    pub fn decode_ns(&self, bytes: u64) -> u64 {
        bytes * self.decode_ns_per_kib / 1024
    }
}

impl Default for CpuCost {
    fn default() -> Self {
        CpuCost {
            op_ns: 100,
            msg_ns: 800,
            packet_ns: 8_000,
            txn_ns: 600,
            log_ns_per_kib: default_log_ns_per_kib(),
            decode_ns_per_kib: default_decode_ns_per_kib(),
            graph_key_ns: default_graph_key_ns(),
            graph_step_ns: default_graph_step_ns(),
            wake_ns: default_wake_ns(),
        }
    }
}

/// What a charge of simulated CPU paid for: `dtx bench --runtime sim` shows each protocol's
/// CPU per committed transaction split by these, so a reader sees where it spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKind {
    /// Record-level steps ([`CpuCost::op_ns`]): reads, locks (a deterministic scheduler's
    /// too), validations, installs, writes replayed at a replica.
    Op,
    /// Messages sent or received ([`CpuCost::msg_ns`]).
    Message,
    /// Packets, a system call each ([`CpuCost::packet_ns`]).
    Packet,
    /// Running a transaction's procedure ([`CpuCost::txn_ns`]): once per attempt where one
    /// node runs it, at every participant of every copy where each runs it (the
    /// deterministic family).
    Txn,
    /// Log records appended ([`CpuCost::log_ns_per_kib`]).
    Log,
    /// Bytes decoded ([`CpuCost::decode_ns_per_kib`]): every message body received, and what a
    /// protocol decodes again inside one (a request from a sequencer's batch).
    Decode,
    /// Keys added to a dependency graph ([`CpuCost::graph_key_ns`]) and steps of a search
    /// over a wait-for graph ([`CpuCost::graph_step_ns`]).
    Graph,
    /// Raft's work per replicated entry, beyond its messages (`replication::service`).
    Raft,
    /// An idle worker woken by its own timer ([`CpuCost::wake_ns`]).
    Wake,
}

impl CpuKind {
    pub const ALL: [CpuKind; 9] = [
        CpuKind::Op,
        CpuKind::Message,
        CpuKind::Packet,
        CpuKind::Txn,
        CpuKind::Log,
        CpuKind::Decode,
        CpuKind::Graph,
        CpuKind::Raft,
        CpuKind::Wake,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CpuKind::Op => "op",
            CpuKind::Message => "message",
            CpuKind::Packet => "packet",
            CpuKind::Txn => "txn",
            CpuKind::Log => "log",
            CpuKind::Decode => "decode",
            CpuKind::Graph => "graph",
            CpuKind::Raft => "raft",
            CpuKind::Wake => "wake",
        }
    }
}

/// Simulated CPU (ns) by [`CpuKind`], indexed by the kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSplit(pub [u64; CpuKind::ALL.len()]);

impl CpuSplit {
    /// Add `other`, scaled by `factor` (a `cpu` fault's).
    pub fn add_scaled(&mut self, other: &CpuSplit, factor: f64) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += if factor == 1.0 { theirs } else { (theirs as f64 * factor) as u64 };
        }
    }

    /// What was charged since `start`.
    pub fn since(&self, start: &CpuSplit) -> CpuSplit {
        let mut out = *self;
        out.0.iter_mut().zip(start.0).for_each(|(end, at)| *end -= at);
        out
    }

    /// Each kind's name and ns, the kinds charged nothing left out.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        CpuKind::ALL.iter().map(|k| (k.name(), self.0[*k as usize])).filter(|(_, ns)| *ns > 0)
    }
}

/// RPC policy shared by every protocol in a run.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct RpcConfig {
    /// Give up on a request after this long (the caller then aborts or retries).
    pub timeout_us: u64,
    /// Resend an unanswered request this often; 0 = never (TCP is reliable). Turned on when the
    /// network may lose messages; receivers then de-duplicate requests.
    pub retransmit_us: u64,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig { timeout_us: 2_000_000, retransmit_us: 0 }
    }
}

/// How a worker is set up: the run's seed, CPU cost model and RPC policy, and the skew
/// injected into the nodes' wall clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerConfig {
    pub seed: u64,
    pub cost: CpuCost,
    pub rpc: RpcConfig,
    pub clocks: ClockSkew,
}

/// Skew and drift injected into the nodes' wall clocks (`--clock-skew`, `--clock-drift`): node
/// `n` of `nodes` starts `n * skew_us / (nodes - 1)` ahead of node 0 and runs faster by
/// `n * drift_ppm / (nodes - 1)` millionths, so the two farthest apart differ by `skew_us` at
/// the start and drift apart by `drift_ppm` µs a second. Only a protocol that reads wall-clock
/// time feels it (static-timestamp MVCC's timestamps, Detock's stamps and probes); timers and
/// the run's measurements use the runtime's own clock.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ClockSkew {
    pub skew_us: u64,
    #[serde(default)]
    pub drift_ppm: u64,
    pub nodes: u16,
}

impl ClockSkew {
    /// How far node `node`'s wall clock runs ahead of node 0's, `elapsed_us` into the run.
    pub fn offset_us(&self, node: u16, elapsed_us: u64) -> u64 {
        if self.nodes <= 1 {
            return 0;
        }
        let (n, last) = (u64::from(node.min(self.nodes - 1)), u64::from(self.nodes - 1));
        let drifted_us = (u128::from(elapsed_us) * u128::from(self.drift_ppm) / 1_000_000) as u64;
        (self.skew_us + drifted_us) * n / last
    }
}

/// Wall-clock time is counted from 2025-01-01 (µs), so that it fits timestamps with low bits
/// to spare.
const WALL_EPOCH_UNIX_US: u64 = 1_735_689_600_000_000;

/// The system clock, µs from 2025-01-01 (the base of wall clocks, histories and RPC ids).
pub(crate) fn system_us() -> u64 {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (unix.as_micros() as u64).saturating_sub(WALL_EPOCH_UNIX_US)
}

/// Receives the messages of a node service (log replication) on one worker: the sender, the
/// 64-bit tag the sender put in the envelope header, and the body.
pub type ServiceHandler = Rc<dyn Fn(Addr, u64, &[u8])>;

/// What a protocol implements to receive messages addressed to a worker.
pub trait Handler {
    fn on_request(&self, from: Addr, rpc_id: u64, body: &[u8]);
    fn on_oneway(&self, from: Addr, body: &[u8]);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    #[error("request timed out")]
    Timeout,
}

struct RpcSlot {
    reply: Option<Vec<u8>>,
    waker: Option<Waker>,
}

enum Dedup {
    InProgress,
    Done(Vec<u8>),
}

/// The context a worker's tasks share: one per worker, on that worker's thread.
pub struct Worker {
    pub addr: Addr,
    pub workers_per_node: u16,
    clock: Clock,
    exec: Executor,
    outbox: RefCell<Vec<(Addr, Batch)>>,
    rpcs: RefCell<FxHashMap<u64, RpcSlot>>,
    next_rpc: Cell<u64>,
    timers: RefCell<BinaryHeap<std::cmp::Reverse<(u64, u64)>>>,
    timer_wakers: RefCell<FxHashMap<u64, Waker>>,
    next_timer: Cell<u64>,
    dedup: RefCell<FxHashMap<(Addr, u64), Dedup>>,
    dedup_fifo: RefCell<VecDeque<(u64, Addr, u64)>>,
    handler: RefCell<Option<Weak<dyn Handler>>>,
    /// Receives `Kind::Service` messages (log replication), apart from the protocol.
    service: RefCell<Option<ServiceHandler>>,
    pub rng: RefCell<Rng>,
    pub stats: RefCell<NetStats>,
    /// Counters a protocol reports (`count`): the driver takes their change over the measured
    /// window into the run's report, so a protocol's own numbers (lease renewals, repairs,
    /// deadlocks found) need no plumbing of their own.
    counters: RefCell<Vec<(&'static str, u64)>>,
    /// Gauges a protocol reports (`gauge_max`): the largest value each reached, over the window.
    gauges: RefCell<Vec<(&'static str, u64)>>,
    charged_ns: Cell<u64>,
    /// What `charged_ns` holds, split by what it paid for ([`CpuKind`]).
    charged_by_kind: Cell<CpuSplit>,
    pub cost: CpuCost,
    pub rpc: RpcConfig,
    clocks: ClockSkew,
    /// The latest time [`Worker::history_now_us`] gave on real clocks: it never goes back,
    /// however the system clock is stepped.
    history_last_us: Cell<u64>,
    /// Run when the simulator crashes this worker's node (its memory is about to be lost).
    crash_hooks: RefCell<Vec<Box<dyn FnOnce()>>>,
}

/// The most counters a worker keeps (a protocol has a handful; more is a bug in it).
pub const MAX_COUNTERS: usize = 64;

impl Worker {
    pub fn new(addr: Addr, workers_per_node: u16, clock: Clock, exec: Executor, cfg: &WorkerConfig) -> Self {
        let seed = cfg.seed;
        let seed = seed ^ ((addr.node as u64) << 32 | addr.worker as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Worker {
            addr,
            workers_per_node,
            clock,
            exec,
            outbox: RefCell::new(Vec::new()),
            rpcs: RefCell::new(FxHashMap::default()),
            next_rpc: Cell::new(1),
            timers: RefCell::new(BinaryHeap::new()),
            timer_wakers: RefCell::new(FxHashMap::default()),
            next_timer: Cell::new(1),
            dedup: RefCell::new(FxHashMap::default()),
            dedup_fifo: RefCell::new(VecDeque::new()),
            handler: RefCell::new(None),
            service: RefCell::new(None),
            rng: RefCell::new(crate::util::rng_from_seed(seed)),
            stats: RefCell::new(NetStats::default()),
            counters: RefCell::new(Vec::new()),
            gauges: RefCell::new(Vec::new()),
            charged_ns: Cell::new(0),
            charged_by_kind: Cell::new(CpuSplit::default()),
            cost: cfg.cost,
            rpc: cfg.rpc,
            clocks: cfg.clocks,
            history_last_us: Cell::new(0),
            crash_hooks: RefCell::new(Vec::new()),
        }
    }

    /// Number this worker's RPCs from `base` on: a worker of a restarted node must not reuse
    /// the ids of its previous incarnation, whose late replies may still arrive.
    pub fn start_rpc_ids_at(&self, base: u64) {
        self.next_rpc.set(base.max(1));
    }

    /// Run `f` if this worker's node crashes (the simulator's crash with memory loss): what
    /// must outlive the worker (the driver's metrics and history) is handed over there.
    pub fn on_crash(&self, f: Box<dyn FnOnce()>) {
        self.crash_hooks.borrow_mut().push(f);
    }

    /// The runtime is done with this worker: drop its tasks' futures and whatever else holds
    /// them (timers, RPC slots, handlers), so that the worker and what its tasks held are freed.
    pub fn shutdown(&self) {
        self.exec.shutdown();
        self.timer_wakers.borrow_mut().clear();
        self.timers.borrow_mut().clear();
        self.rpcs.borrow_mut().clear();
        self.outbox.borrow_mut().clear();
        // The replies kept for resent requests: two RPC timeouts' worth (a node serving 50k
        // requests a second keeps ~10 MB), which a crashed incarnation's worker held for the
        // rest of the run.
        self.dedup.borrow_mut().clear();
        self.dedup_fifo.borrow_mut().clear();
        self.crash_hooks.borrow_mut().clear();
        *self.service.borrow_mut() = None;
        *self.handler.borrow_mut() = None;
    }

    /// The node crashed: run the crash hooks. The worker is never run again.
    pub fn crash(&self) {
        let hooks = std::mem::take(&mut *self.crash_hooks.borrow_mut());
        for h in hooks {
            h();
        }
    }

    pub fn set_handler(&self, h: Weak<dyn Handler>) {
        *self.handler.borrow_mut() = Some(h);
    }

    /// Attach the node's service (log replication) to this worker.
    pub fn set_service_handler(&self, h: ServiceHandler) {
        *self.service.borrow_mut() = Some(h);
    }

    /// Send a message to the service on another worker (no reply, batched like any message).
    /// A service message has no RPC id; its header carries the service's `tag` there instead.
    pub fn send_service(&self, dst: Addr, tag: u64, body: &[u8]) {
        self.push_envelope(dst, Kind::Service, tag, body);
    }

    // ---- time ----

    pub fn now_ns(&self) -> u64 {
        match &self.clock {
            Clock::Virtual(t) => t.get() + self.charged_ns.get(),
            Clock::Real(epoch) => epoch.elapsed().as_nanos() as u64,
        }
    }

    pub fn now_us(&self) -> u64 {
        self.now_ns() / 1000
    }

    /// This node's wall clock, µs: the virtual time in the simulator, the system's clock
    /// otherwise (the same base in every process of a `tcp` run), plus the skew injected for
    /// this node ([`ClockSkew`]). It may stand still or step back: it is for protocols that
    /// order transactions by real time, never for timers.
    pub fn wall_us(&self) -> u64 {
        let (base, elapsed_us) = match &self.clock {
            Clock::Virtual(_) => (self.now_us(), self.now_us()),
            Clock::Real(epoch) => (system_us(), epoch.elapsed().as_micros() as u64),
        };
        base + self.clocks.offset_us(self.addr.node, elapsed_us)
    }

    /// Now, as histories record it, µs: in the simulator the virtual time of the step being
    /// run, without the CPU time this worker charged in it (a worker's own clock runs ahead of
    /// the others' by what it charged, while what it wrote is already visible to them: real-time
    /// order must come from the one clock the steps run in); otherwise the system's clock (from
    /// 2025, without injected skew), read at every call, so that the histories of a run's
    /// processes share one clock and real-time order can be checked across them (on one
    /// machine exactly; across machines as far as their clocks agree: NTP or PTP).
    ///
    /// Read at every call, not as a base taken once plus the monotonic clock: two processes'
    /// bases, each two readings of two clocks that a busy core may preempt between, were tens
    /// of microseconds apart, and a `tcp` run's check found "realtime" cycles that were the
    /// bases' difference (always one process's commits before the other's starts).
    pub fn history_now_us(&self) -> u64 {
        match &self.clock {
            Clock::Virtual(t) => t.get() / 1000,
            Clock::Real(_) => {
                let us = system_us().max(self.history_last_us.get());
                self.history_last_us.set(us);
                us
            }
        }
    }

    /// The most two nodes' wall clocks differ by now, as far as the run knows: the injected
    /// skew and what the injected drift has added to it.
    pub fn clock_skew_us(&self) -> u64 {
        let elapsed_us = match &self.clock {
            Clock::Virtual(_) => self.now_us(),
            Clock::Real(epoch) => epoch.elapsed().as_micros() as u64,
        };
        self.clocks.offset_us(self.clocks.nodes.saturating_sub(1), elapsed_us)
    }

    /// Charge simulated CPU time for work of `kind` just done.
    #[inline]
    pub fn charge(&self, kind: CpuKind, ns: u64) {
        self.charged_ns.set(self.charged_ns.get() + ns);
        let mut split = self.charged_by_kind.get();
        split.0[kind as usize] += ns;
        self.charged_by_kind.set(split);
    }

    /// Charge `n` record-level steps ([`CpuCost::op_ns`]).
    #[inline]
    pub fn charge_ops(&self, n: usize) {
        self.charge(CpuKind::Op, self.cost.op_ns * n as u64);
    }

    /// Charge decoding `bytes` a protocol decodes beyond its messages' envelopes (a request a
    /// scheduler decodes from its batch, a record replayed; [`CpuCost::decode_ns`]).
    #[inline]
    pub fn charge_decode(&self, bytes: usize) {
        self.charge(CpuKind::Decode, self.cost.decode_ns(bytes as u64));
    }

    /// Add `n` to the protocol counter `name` (kebab-case, reported per committed transaction).
    /// A protocol has a handful of counters, so a short list searched linearly is cheapest.
    pub fn count(&self, name: &'static str, n: u64) {
        let mut cs = self.counters.borrow_mut();
        match cs.iter_mut().find(|c| c.0 == name) {
            Some(c) => c.1 += n,
            None => {
                debug_assert!(cs.len() < MAX_COUNTERS, "a protocol reports at most {MAX_COUNTERS} counters");
                cs.push((name, n))
            }
        }
    }

    /// Note that the gauge `name` (kebab-case, ending `-max`) stands at `value`: the report
    /// gives the largest value it reached over the measured window, over every worker (the
    /// largest dependency graph, the longest queue).
    pub fn gauge_max(&self, name: &'static str, value: u64) {
        let mut gs = self.gauges.borrow_mut();
        match gs.iter_mut().find(|g| g.0 == name) {
            Some(g) => g.1 = g.1.max(value),
            None => {
                debug_assert!(gs.len() < MAX_COUNTERS, "a protocol reports at most {MAX_COUNTERS} gauges");
                gs.push((name, value))
            }
        }
    }

    /// The gauges' largest values since the last take, and forget them.
    pub fn take_gauges(&self) -> Vec<(&'static str, u64)> {
        std::mem::take(&mut *self.gauges.borrow_mut())
    }

    /// Every protocol counter's value so far.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        self.counters.borrow().clone()
    }

    /// A commit waited `ns` for its log record to become durable.
    pub fn note_log_wait(&self, ns: u64) {
        let mut st = self.stats.borrow_mut();
        st.log_waits += 1;
        st.log_wait_ns += ns;
    }

    /// Take the CPU time charged since the last call (the simulator turns it into busy time),
    /// and its split by kind.
    pub fn take_charged_ns(&self) -> (u64, CpuSplit) {
        (self.charged_ns.replace(0), self.charged_by_kind.take())
    }

    /// A future that completes `delay_us` from now.
    pub fn sleep_us(self: &Rc<Self>, delay_us: u64) -> Sleep {
        self.sleep_until_ns(self.now_ns() + delay_us * 1000)
    }

    /// A future that completes when the clock reaches `deadline_ns`.
    pub fn sleep_until_ns(self: &Rc<Self>, deadline_ns: u64) -> Sleep {
        Sleep { w: self.clone(), deadline_ns, id: 0 }
    }

    fn add_timer(&self, deadline_ns: u64, waker: &Waker) -> u64 {
        let id = self.next_timer.get();
        self.next_timer.set(id + 1);
        self.timers.borrow_mut().push(std::cmp::Reverse((deadline_ns, id)));
        self.timer_wakers.borrow_mut().insert(id, waker.clone());
        id
    }

    /// Wake every timer that is due; returns the next deadline, if any.
    pub fn fire_timers(&self) -> Option<u64> {
        let now = self.now_ns();
        loop {
            let top = self.timers.borrow().peek().map(|r| r.0);
            match top {
                Some((deadline, id)) if deadline <= now => {
                    self.timers.borrow_mut().pop();
                    let w = self.timer_wakers.borrow_mut().remove(&id);
                    if let Some(w) = w {
                        w.wake();
                    }
                }
                Some((deadline, id)) => {
                    // Skip cancelled timers so the deadline we report is a live one.
                    if !self.timer_wakers.borrow().contains_key(&id) {
                        self.timers.borrow_mut().pop();
                        continue;
                    }
                    return Some(deadline);
                }
                None => return None,
            }
        }
    }

    // ---- tasks ----

    pub fn spawn(&self, fut: impl Future<Output = ()> + 'static) {
        self.exec.spawn(fut);
    }

    pub fn executor(&self) -> &Executor {
        &self.exec
    }

    // ---- messages ----

    fn push_envelope(&self, dst: Addr, kind: Kind, rpc_id: u64, body: &[u8]) {
        self.push_envelope_of(dst, kind, rpc_id, body, false)
    }

    fn push_envelope_of(&self, dst: Addr, kind: Kind, rpc_id: u64, body: &[u8], control: bool) {
        debug_assert_ne!(dst, self.addr, "a worker never messages itself");
        let mut out = self.outbox.borrow_mut();
        // The destination's latest batch of this class, while it has room (`net::MAX_BATCH_BYTES`).
        let open = out
            .iter()
            .rposition(|(a, b)| *a == dst && b.control == control)
            .filter(|&i| out[i].1.buf.len() < net::MAX_BATCH_BYTES);
        let idx = match open {
            Some(i) => i,
            None => {
                out.push((dst, Batch { control, ..Batch::default() }));
                out.len() - 1
            }
        };
        let before = out[idx].1.buf.len();
        out[idx].1.push(kind, rpc_id, body);
        let mut st = self.stats.borrow_mut();
        st.msgs_sent += 1;
        st.bytes_sent += (out[idx].1.buf.len() - before) as u64;
        drop(st);
        self.charge(CpuKind::Message, self.cost.msg_ns);
    }

    /// Send a message that expects no reply.
    pub fn send(&self, dst: Addr, body: &[u8]) {
        self.push_envelope(dst, Kind::OneWay, 0, body);
    }

    /// Send a control message (a group commit gate's watermark or epoch message) that expects
    /// no reply, in a packet of control messages only.
    pub fn send_control(&self, dst: Addr, body: &[u8]) {
        self.push_envelope_of(dst, Kind::OneWay, 0, body, true);
    }

    /// Send a request; the returned future resolves with the reply body or a timeout.
    pub fn call(self: &Rc<Self>, dst: Addr, body: Vec<u8>) -> RpcCall {
        let id = self.next_rpc.get();
        self.next_rpc.set(id + 1);
        self.rpcs.borrow_mut().insert(id, RpcSlot { reply: None, waker: None });
        self.push_envelope(dst, Kind::Request, id, &body);
        let now = self.now_ns();
        let resend = if self.rpc.retransmit_us > 0 { Some(body) } else { None };
        RpcCall {
            w: self.clone(),
            id,
            dst,
            deadline_ns: now + self.rpc.timeout_us * 1000,
            next_resend_ns: now + self.rpc.retransmit_us * 1000,
            resend,
            timer: 0,
        }
    }

    /// Answer a request.
    pub fn reply(&self, to: Addr, rpc_id: u64, body: &[u8]) {
        if self.rpc.retransmit_us > 0 {
            if let Some(d) = self.dedup.borrow_mut().get_mut(&(to, rpc_id)) {
                *d = Dedup::Done(body.to_vec());
            }
        }
        self.push_envelope(to, Kind::Reply, rpc_id, body);
    }

    /// Take the batches built since the last flush, one packet per destination.
    pub fn take_outbox(&self, out: &mut Vec<Packet>) {
        let mut ob = self.outbox.borrow_mut();
        let n = ob.len();
        for (dst, batch) in ob.drain(..) {
            out.push(Packet { src: self.addr, dst, bytes: batch.buf, control: batch.control });
        }
        if n > 0 {
            let mut st = self.stats.borrow_mut();
            st.packets_sent += n as u64;
            drop(st);
            self.charge(CpuKind::Packet, self.cost.packet_ns * n as u64);
        }
    }

    /// Deliver a received packet: replies complete pending calls, requests go to the protocol.
    /// A malformed batch is counted and logged; what preceded the damage was delivered.
    pub fn deliver(&self, src: Addr, bytes: &[u8]) -> Result<(), net::DecodeError> {
        let handler = self.handler.borrow().as_ref().and_then(|h| h.upgrade());
        let res = net::for_each_envelope(bytes, |env| {
            self.charge(CpuKind::Message, self.cost.msg_ns);
            // A handler decodes the body whole: per byte, a 100 KB batch of a sequencer costs
            // what its bytes do, not what one vote does.
            self.charge(CpuKind::Decode, self.cost.decode_ns(env.body.len() as u64));
            match env.kind {
                Kind::Reply => {
                    let mut rpcs = self.rpcs.borrow_mut();
                    if let Some(slot) = rpcs.get_mut(&env.rpc_id) {
                        if slot.reply.is_none() {
                            slot.reply = Some(env.body.to_vec());
                            if let Some(w) = slot.waker.take() {
                                w.wake();
                            }
                        }
                    }
                }
                Kind::Request => {
                    if self.rpc.retransmit_us > 0 && !self.first_delivery(src, env.rpc_id) {
                        return;
                    }
                    match &handler {
                        Some(h) => h.on_request(src, env.rpc_id, env.body),
                        None => log_warn(&format!("{}: request from {src} before a protocol was attached", self.addr)),
                    }
                }
                Kind::OneWay => match &handler {
                    Some(h) => h.on_oneway(src, env.body),
                    None => log_warn(&format!("{}: message from {src} before a protocol was attached", self.addr)),
                },
                Kind::Service => {
                    let service = self.service.borrow().clone();
                    match service {
                        Some(s) => s(src, env.rpc_id, env.body),
                        None => {
                            log_warn(&format!("{}: service message from {src}, but no service runs here", self.addr))
                        }
                    }
                }
            }
        });
        if let Err(e) = &res {
            self.stats.borrow_mut().malformed += 1;
            log_warn(&format!("{}: malformed packet from {src}: {e}", self.addr));
        }
        res
    }

    /// Request de-duplication when requests may be resent: true if this is the first copy.
    fn first_delivery(&self, src: Addr, rpc_id: u64) -> bool {
        let mut dedup = self.dedup.borrow_mut();
        match dedup.get(&(src, rpc_id)) {
            Some(Dedup::InProgress) => false,
            Some(Dedup::Done(reply)) => {
                let reply = reply.clone();
                drop(dedup);
                self.push_envelope(src, Kind::Reply, rpc_id, &reply);
                false
            }
            None => {
                dedup.insert((src, rpc_id), Dedup::InProgress);
                let now = self.now_ns();
                let mut fifo = self.dedup_fifo.borrow_mut();
                fifo.push_back((now, src, rpc_id));
                // Forget entries older than twice the RPC timeout: no copy can arrive after that.
                let horizon = 2 * self.rpc.timeout_us * 1000;
                while let Some(&(t, a, id)) = fifo.front() {
                    if now.saturating_sub(t) <= horizon && fifo.len() <= 1 << 20 {
                        break;
                    }
                    fifo.pop_front();
                    dedup.remove(&(a, id));
                }
                true
            }
        }
    }

    /// Anything to do right now (ready tasks or unsent batches)?
    pub fn has_work(&self) -> bool {
        self.exec.has_ready() || !self.outbox.borrow().is_empty()
    }
}

/// Future returned by [`Worker::sleep_us`].
pub struct Sleep {
    w: Rc<Worker>,
    deadline_ns: u64,
    id: u64,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.w.now_ns() >= self.deadline_ns {
            return Poll::Ready(());
        }
        if self.id != 0 {
            // Registered already (a sleep raced against other work is polled with it, once per
            // step of that work): keep the timer, so that the heap does not fill with cancelled
            // ones, and only take the newest waker.
            if let Some(waker) = self.w.timer_wakers.borrow_mut().get_mut(&self.id) {
                if !waker.will_wake(cx.waker()) {
                    waker.clone_from(cx.waker());
                }
                return Poll::Pending;
            }
        }
        let id = self.w.add_timer(self.deadline_ns, cx.waker());
        self.id = id;
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if self.id != 0 {
            self.w.timer_wakers.borrow_mut().remove(&self.id);
        }
    }
}

/// Future returned by [`Worker::call`].
pub struct RpcCall {
    w: Rc<Worker>,
    id: u64,
    dst: Addr,
    deadline_ns: u64,
    next_resend_ns: u64,
    resend: Option<Vec<u8>>,
    timer: u64,
}

impl Future for RpcCall {
    type Output = Result<Vec<u8>, RpcError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let w = self.w.clone();
        {
            let mut rpcs = w.rpcs.borrow_mut();
            let Some(slot) = rpcs.get_mut(&self.id) else {
                return Poll::Ready(Err(RpcError::Timeout));
            };
            if let Some(reply) = slot.reply.take() {
                rpcs.remove(&self.id);
                return Poll::Ready(Ok(reply));
            }
            slot.waker = Some(cx.waker().clone());
        }
        let now = w.now_ns();
        if now >= self.deadline_ns {
            w.rpcs.borrow_mut().remove(&self.id);
            return Poll::Ready(Err(RpcError::Timeout));
        }
        if self.resend.is_some() && now >= self.next_resend_ns {
            let body = self.resend.take().unwrap_or_default();
            w.push_envelope(self.dst, Kind::Request, self.id, &body);
            self.resend = Some(body);
            self.next_resend_ns = now + w.rpc.retransmit_us * 1000;
        }
        let wake_at = if self.resend.is_some() { self.next_resend_ns.min(self.deadline_ns) } else { self.deadline_ns };
        if self.timer != 0 {
            w.timer_wakers.borrow_mut().remove(&self.timer);
        }
        self.timer = w.add_timer(wake_at, cx.waker());
        Poll::Pending
    }
}

impl Drop for RpcCall {
    fn drop(&mut self) {
        self.w.rpcs.borrow_mut().remove(&self.id);
        if self.timer != 0 {
            self.w.timer_wakers.borrow_mut().remove(&self.timer);
        }
    }
}

/// Wait for every call and return the replies in order (errors stay per call).
pub async fn join_all<T, F: Future<Output = T>>(futs: Vec<F>) -> Vec<T> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<T>> = (0..futs.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future completed")).collect()
}

/// Yield to other tasks once.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Warnings from the runtime (malformed frames, lost peers): stderr, rate-limited per process.
pub fn log_warn(msg: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    if n < 100 || n.is_power_of_two() {
        eprintln!("dtx: warning: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Rc<Worker> {
        let exec = Executor::new(Arc::new(|| {}));
        let clock = Clock::Virtual(Rc::new(Cell::new(0)));
        Rc::new(Worker::new(Addr::new(0, 0), 1, clock, exec, &WorkerConfig::default()))
    }

    /// Histories of real-clock workers share the system's clock whatever their epochs (two
    /// processes of a `tcp` run have different ones), and a worker's history clock never goes back.
    #[test]
    fn real_clock_histories_read_the_system_clock_whatever_their_epoch() {
        let on = |epoch| {
            let exec = Executor::new(Arc::new(|| {}));
            Worker::new(Addr::new(0, 0), 1, Clock::Real(epoch), exec, &WorkerConfig::default())
        };
        let early = on(std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let late = on(std::time::Instant::now());
        for _ in 0..1000 {
            let before = system_us();
            let (a, b) = (early.history_now_us(), late.history_now_us());
            let after = system_us();
            assert!(before <= a && a <= b && b <= after, "{before} <= {a} <= {b} <= {after}");
        }
        late.history_last_us.set(u64::MAX - 1);
        assert_eq!(late.history_now_us(), u64::MAX - 1, "a clock stepped back does not take a history back");
    }

    /// A task asleep on its worker's timer holds the worker, and the worker holds the task's
    /// waker: only a shutdown frees them.
    #[test]
    fn a_shutdown_frees_the_tasks_that_hold_their_own_worker() {
        let w = worker();
        let held = Rc::new(());
        let (w2, held2) = (w.clone(), held.clone());
        w.spawn(async move {
            w2.sleep_us(1_000_000).await;
            drop(held2);
        });
        w.executor().run_ready(STEP_TASKS);
        let (weak_w, weak_held) = (Rc::downgrade(&w), Rc::downgrade(&held));
        drop(held);
        assert!(weak_held.upgrade().is_some(), "the sleeping task holds its capture");
        w.shutdown();
        drop(w);
        assert!(weak_held.upgrade().is_none(), "the task's future was dropped");
        assert!(weak_w.upgrade().is_none(), "nothing holds the worker any more");
    }

    /// Finished tasks' handles are pruned, so a long run keeps only the live ones.
    #[test]
    fn finished_tasks_are_pruned_and_live_ones_kept() {
        let w = worker();
        let live = Rc::new(());
        for i in 0..10 * PRUNE_TASKS_AT_LEAST {
            let (w2, live2) = (w.clone(), live.clone());
            w.spawn(async move {
                if i % 100 == 0 {
                    w2.sleep_us(1_000_000).await;
                }
                drop(live2);
            });
            w.executor().run_ready(STEP_TASKS);
        }
        let kept = w.executor().tasks.borrow().len();
        assert!(kept < 3 * PRUNE_TASKS_AT_LEAST, "finished tasks' handles pile up: {kept}");
        let sleepers = (0..10 * PRUNE_TASKS_AT_LEAST).filter(|i| i % 100 == 0).count();
        assert_eq!(Rc::strong_count(&live), 1 + sleepers, "the sleepers are still pending");
        w.shutdown();
        assert_eq!(Rc::strong_count(&live), 1);
    }
}
