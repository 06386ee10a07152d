//! Deterministic simulation: every worker of every node on one thread, in virtual time.
//!
//! Each worker is a sequential CPU: when it runs, the work it does is charged (per record
//! access, per message, per packet, per transaction: [`super::CpuCost`]) and the worker stays
//! busy for that long, so throughput is finite and queues form under load. A packet leaves when
//! the work that produced it is done and arrives after the link's sampled one-way delay; links
//! are FIFO (as TCP is). Loss, partitions and crashes are drawn from the seed, so one seed
//! replays one run exactly. A 50 ms WAN delay costs no wall time.
//!
//! A crash stops a node: it loses every in-flight packet and timer. Without a log (the run is
//! not durable) its running tasks are frozen until it restarts and its memory survives (a
//! stop-and-resume). With a log, the crash loses the node's memory and the unflushed tail of its
//! log; the node restarts on fresh workers, rebuilt from what its simulated disk kept.

use super::log::{NodeLog, SimImage};
use super::{Clock, CpuKind, CpuSplit, Executor, Worker, STEP_TASKS};
use crate::net::{Addr, FaultPlan, FaultTarget, LatencyModel, Packet, TargetedKind};
use crate::util::Rng;
use parking_lot::Mutex;
use rand::Rng as _;
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::sync::Arc;

enum Ev {
    Deliver(Packet),
    Wake(usize),
    Fault,
    Heal(FaultKind),
    /// Targeted fault `i` of the plan (`--fault-at`) starts (true) or ends (false).
    Targeted(usize, bool),
    /// A node's group-commit timer fired: start a flush of what its log (node, log, generation)
    /// buffered.
    FlushStart(u16, usize, u64),
    /// The flush (its fsync) finished: what it covered is durable.
    FlushDone(u16, usize, u64),
}

/// One of a node's logs on a simulated disk, with its group commit: one file whose lanes are
/// cut together, as the real WAL writes them; or (`--sim-lane-disks`) one lane of it, a disk
/// of its own flushed on its own, as per-worker log files would be.
struct SimLog {
    log: Arc<NodeLog>,
    /// The lane this disk holds, or `None`: every lane of the log, in one file.
    lane: Option<usize>,
    group_commit_ns: u64,
    fsync_ns: u64,
    /// A flush is scheduled or running.
    busy: bool,
}

/// Rebuilds a crashed node: given the records each of its logs' disks kept and fresh workers
/// (same addresses), recover the node's state on them, start its clients, and return its new
/// logs (in the same order).
pub type Restart = Box<dyn FnMut(u16, Vec<SimImage>, &[Rc<Worker>]) -> Vec<Arc<NodeLog>>>;

/// Failover of replicated nodes (`--durability replicated`), the runtime's side of
/// `replication::service`'s failover mode. Hosts and nodes come apart: host h runs its log
/// replicator on an extra worker `(h, workers)`, and node g (its partitions, its coordinator
/// identity, its workers `(g, 0..workers)`) is served by whichever host leads g's log. A crash
/// takes a host down with its replicator and the nodes it serves; the followers elect a new
/// leader, which asks for the node; the simulator then rebuilds the node on fresh workers
/// through [`Failover::adopt`] (and fences its previous incarnation by replacing it).
pub trait Failover {
    /// Host `host` crashed: its replicator stops (its Raft state is kept, as on disk).
    fn host_crashed(&mut self, host: u16);
    /// Host `host` is back: start its replicator on `lanes`, its fresh replication workers.
    fn host_restarted(&mut self, host: u16, lanes: &[Rc<Worker>]);
    /// Adoptions the replicators asked for since the last call: `(node, host)`.
    fn take_requests(&mut self) -> Vec<(u16, u16)>;
    /// Rebuild `node` on fresh `workers`, served by `host`; false (and nothing started) if
    /// `host` can no longer take it over.
    fn adopt(&mut self, node: u16, host: u16, workers: &[Rc<Worker>]) -> bool;
    /// The live host whose replica leads `node`'s log in the highest term, if any does (none
    /// while an election is under way). For `--fault-at ...:leader=N`.
    fn leader_of(&self, node: u16) -> Option<u16>;
}

enum FaultKind {
    Partition,
    Restart(u16),
}

/// A fault the simulator injected on one node (random crashes and every `--fault-at` fault),
/// for the run's `fault_events`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimFaultEvent {
    /// `crash`, `pause`, `partition`, `delay`, `cpu` or `logfail`.
    pub kind: &'static str,
    pub node: u16,
    /// Virtual time it took effect, and how long it lasted (`None`: until the faults healed at
    /// the window's end).
    pub at_ns: u64,
    pub for_ns: Option<u64>,
    /// Asked for by `--fault-at` (not drawn from the seed).
    pub targeted: bool,
}

struct Slot {
    w: Rc<Worker>,
    busy_until: u64,
    wake_at: Option<u64>,
    inbox: Vec<Packet>,
}

pub struct SimWorld {
    now: Rc<Cell<u64>>,
    slots: Vec<Slot>,
    /// Protocol workers per node.
    workers_per_node: u16,
    /// Slots per node: the protocol workers, and with failover the host's replication worker.
    slots_per_node: u16,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    payloads: Vec<Option<Ev>>,
    free: Vec<usize>,
    seq: u64,
    latency: LatencyModel,
    faults: FaultPlan,
    rng: Rng,
    woken: Arc<Mutex<Vec<usize>>>,
    /// Last arrival time per (src, dst) link, to keep links FIFO; control packets held by a
    /// control-only delay keep their own (the `bool`).
    link_last: rustc_hash::FxHashMap<(Addr, Addr, bool), u64>,
    /// `side[i]` = which side of the current partition node `i` is on (None = no partition).
    side: Option<Vec<bool>>,
    /// Per node: its workers are down (crashed, not yet restarted or taken over).
    node_down: Vec<bool>,
    /// Per host: the machine is down. Without failover host n serves node n and both go
    /// down together; with it, `hosted_by[g]` serves node g.
    host_down: Vec<bool>,
    hosted_by: Vec<u16>,
    failover: Option<Box<dyn Failover>>,
    /// Nodes rebuilt from a replica of their log by the host that leads it (failovers).
    pub failovers: u64,
    /// For each node that crashed and was taken over: how long it was down (virtual ns).
    pub failover_ns: Vec<u64>,
    /// Takeovers by another host while the node's previous host was down.
    pub moved: u64,
    down_since: Vec<u64>,
    logs: Vec<Vec<SimLog>>,
    /// Each lane of a log is a disk of its own (`SimLog::lane`).
    lane_disks: bool,
    /// Bumped at each crash of a node, so that a flush of the lost incarnation's log that
    /// completes later is ignored.
    log_generation: Vec<u64>,
    /// With a restart hook, a crash loses the node's memory and the node restarts from its log.
    restart: Option<Restart>,
    /// What each crashed node's disk kept, until it restarts.
    survived: Vec<Option<Vec<SimImage>>>,
    worker_cfg: super::WorkerConfig,
    /// Crashes that lost a node's memory (each followed by a recovery).
    pub restarts: u64,
    /// Incarnations of workers created so far (their RPC ids start past the previous ones).
    incarnations: u64,
    pub packets_dropped: u64,
    pub packets_delivered: u64,
    /// CPU time charged to all workers so far (virtual ns).
    pub busy_ns: u64,
    /// `busy_ns` split by what it paid for.
    pub busy_by_kind: CpuSplit,
    /// Payload bytes that left a host for another so far (every kind of message).
    pub wire_bytes: u64,
    /// Per host, with `--bandwidth`: when its link is free of what it sent (virtual ns), and
    /// how long it has been busy so far.
    link_free_ns: Vec<u64>,
    pub link_busy_ns: Vec<u64>,
    /// Per host: stopped by a `pause` fault (runs nothing; what reaches it waits in its inbox).
    paused: Vec<bool>,
    /// Per host: cut off from every other host by a `partition` fault.
    isolated: Vec<bool>,
    /// Per host: its workers' charged CPU is multiplied by this (`cpu` faults; 1.0 otherwise).
    cpu_factor: Vec<f64>,
    /// Per host: extra delay of the packets it sends (`delay` faults), ns, the worker whose
    /// packets alone are held (None: every worker's), and whether only control packets are.
    send_delay: Vec<(u64, Option<u16>, bool)>,
    /// Targeted faults no longer start (the run's faults were healed).
    targeted_off: bool,
    /// Per targeted fault: the host it started on (none: not started, or it found its host
    /// down already, and is not undone). A leader's is chosen when it starts.
    targeted_on: Vec<Option<usize>>,
    /// Every fault injected on one node, in order.
    pub fault_events: Vec<SimFaultEvent>,
    /// Workers of ended incarnations, never run again, their tasks dropped when the next
    /// incarnation took their place ([`SimWorld::retire`]).
    retired: Vec<Rc<Worker>>,
}

impl Drop for SimWorld {
    /// Free every incarnation's tasks and what they hold (see [`Executor::shutdown`]).
    fn drop(&mut self) {
        for w in self.slots.iter().map(|s| &s.w).chain(self.retired.iter()) {
            w.shutdown();
        }
    }
}

impl SimWorld {
    pub fn new(nodes: u16, workers_per_node: u16, latency: LatencyModel, faults: FaultPlan, seed: u64) -> Self {
        let targeted_faults = faults.targeted.len();
        let mut w = SimWorld {
            now: Rc::new(Cell::new(0)),
            slots: Vec::new(),
            workers_per_node,
            slots_per_node: workers_per_node,
            events: BinaryHeap::new(),
            payloads: Vec::new(),
            free: Vec::new(),
            seq: 0,
            latency,
            faults,
            rng: crate::util::rng_from_seed(seed ^ 0x5151_5151),
            woken: Arc::new(Mutex::new(Vec::new())),
            link_last: Default::default(),
            side: None,
            node_down: vec![false; nodes as usize],
            host_down: vec![false; nodes as usize],
            hosted_by: (0..nodes).collect(),
            failover: None,
            failovers: 0,
            failover_ns: Vec::new(),
            moved: 0,
            down_since: vec![0; nodes as usize],
            logs: (0..nodes).map(|_| Vec::new()).collect(),
            lane_disks: false,
            log_generation: vec![0; nodes as usize],
            restart: None,
            survived: vec![None; nodes as usize],
            worker_cfg: super::WorkerConfig::default(),
            restarts: 0,
            incarnations: 0,
            packets_dropped: 0,
            packets_delivered: 0,
            busy_ns: 0,
            busy_by_kind: CpuSplit::default(),
            wire_bytes: 0,
            link_free_ns: vec![0; nodes as usize],
            link_busy_ns: vec![0; nodes as usize],
            paused: vec![false; nodes as usize],
            isolated: vec![false; nodes as usize],
            cpu_factor: vec![1.0; nodes as usize],
            send_delay: vec![(0, None, false); nodes as usize],
            targeted_off: false,
            targeted_on: vec![None; targeted_faults],
            retired: Vec::new(),
            fault_events: Vec::new(),
        };
        if w.faults.partitions || w.faults.crashes {
            let first = w.fault_gap();
            w.push(first, Ev::Fault);
        }
        // A fault without a duration lasts until `heal_all` (the window's end).
        let targeted: Vec<(u64, Option<u64>)> = w.faults.targeted.iter().map(|f| (f.at_us, f.for_us)).collect();
        for (i, (at_us, for_us)) in targeted.into_iter().enumerate() {
            w.push(at_us * 1000, Ev::Targeted(i, true));
            if let Some(d) = for_us {
                w.push((at_us + d) * 1000, Ev::Targeted(i, false));
            }
        }
        w
    }

    pub fn clock(&self) -> Clock {
        Clock::Virtual(self.now.clone())
    }

    pub fn now_ns(&self) -> u64 {
        self.now.get()
    }

    fn index(&self, a: Addr) -> usize {
        a.node as usize * self.slots_per_node as usize + a.worker as usize
    }

    /// Fail replicated nodes over (see [`Failover`]): every node gets `lanes` replication
    /// workers `(n, workers + l)`, created with [`SimWorld::add_worker`] after its protocol
    /// workers: each a virtual core of the host.
    pub fn set_failover(&mut self, failover: Box<dyn Failover>, cfg: super::WorkerConfig, lanes: u16) {
        assert!(self.slots.is_empty(), "set failover before adding workers");
        assert!(lanes >= 1, "a host replicates on one lane at least");
        self.worker_cfg = cfg;
        self.slots_per_node = self.workers_per_node + lanes;
        self.failover = Some(failover);
    }

    /// The addresses of host `h`'s replication workers (with failover), lane 0 first.
    pub fn replication_addrs(&self, h: u16) -> Vec<Addr> {
        (self.workers_per_node..self.slots_per_node).map(|w| Addr::new(h, w)).collect()
    }

    /// The machine an address runs on: a replication worker on its own host, a node's worker
    /// on the host that serves the node.
    fn host_of(&self, a: Addr) -> usize {
        if a.worker >= self.workers_per_node {
            a.node as usize
        } else {
            self.hosted_by[a.node as usize] as usize
        }
    }

    fn slot_down(&self, a: Addr) -> bool {
        if a.worker >= self.workers_per_node {
            self.host_down[a.node as usize]
        } else {
            self.node_down[a.node as usize]
        }
    }

    /// Whether every node is up (served by a live host).
    pub fn all_nodes_up(&self) -> bool {
        !self.node_down.iter().any(|d| *d)
    }

    /// An executor for the worker at `addr`; create workers in address order.
    pub fn executor_for(&self, addr: Addr) -> Executor {
        let idx = self.index(addr);
        let woken = self.woken.clone();
        Executor::new(Arc::new(move || woken.lock().push(idx)))
    }

    /// Put each lane of a log on a disk of its own (before [`SimWorld::set_logs`]).
    pub fn set_lane_disks(&mut self, on: bool) {
        self.lane_disks = on;
    }

    /// Give node `n` its logs, each on a simulated disk of its own (or, with `lane_disks`, each
    /// lane of each): the simulator flushes a disk `group_commit_us` after it first holds
    /// unflushed records, and each flush takes `fsync_us`.
    pub fn set_logs(&mut self, n: u16, logs: &[Arc<NodeLog>], group_commit_us: u64, fsync_us: u64) {
        let lane_disks = self.lane_disks;
        self.logs[n as usize] = logs
            .iter()
            .flat_map(|log| {
                let lanes: Vec<Option<usize>> =
                    if lane_disks { (0..log.lanes()).map(Some).collect() } else { vec![None] };
                lanes.into_iter().map(move |lane| (log, lane))
            })
            .map(|(log, lane)| SimLog {
                log: log.clone(),
                lane,
                group_commit_ns: group_commit_us * 1000,
                fsync_ns: fsync_us * 1000,
                busy: false,
            })
            .collect();
    }

    /// Schedule a flush of each of node `n`'s logs that holds unflushed records and has none
    /// under way.
    fn maybe_flush(&mut self, n: u16) {
        let now = self.now.get();
        let generation = self.log_generation[n as usize];
        let mut due = Vec::new();
        for (i, l) in self.logs[n as usize].iter_mut().enumerate() {
            let unflushed = match l.lane {
                Some(lane) => l.log.sim_has_unflushed(lane),
                None => l.log.sim_has_unflushed_any(),
            };
            if !l.busy && unflushed {
                l.busy = true;
                due.push((now + l.group_commit_ns, i));
            }
        }
        for (at, i) in due {
            self.push(at, Ev::FlushStart(n, i, generation));
        }
    }

    fn flush_start(&mut self, n: u16, i: usize, generation: u64) {
        let now = self.now.get();
        if generation != self.log_generation[n as usize] {
            return;
        }
        let Some(l) = self.logs[n as usize].get_mut(i) else { return };
        let started = match l.lane {
            Some(lane) => l.log.sim_begin_flush(lane).is_some(),
            None => l.log.sim_begin_cut(),
        };
        match started {
            true => {
                let at = now + l.fsync_ns;
                self.push(at, Ev::FlushDone(n, i, generation));
            }
            false => l.busy = false,
        }
    }

    fn flush_done(&mut self, n: u16, i: usize, generation: u64) {
        if generation != self.log_generation[n as usize] {
            return;
        }
        let Some(l) = self.logs[n as usize].get_mut(i) else { return };
        match l.lane {
            Some(lane) => l.log.sim_finish_flush(lane),
            None => l.log.sim_finish_cut(),
        }
        l.busy = false;
        self.maybe_flush(n);
    }

    pub fn add_worker(&mut self, w: Rc<Worker>) {
        assert_eq!(self.index(w.addr), self.slots.len(), "workers must be added in address order");
        self.slots.push(Slot { w, busy_until: 0, wake_at: None, inbox: Vec::new() });
    }

    pub fn worker(&self, a: Addr) -> &Rc<Worker> {
        &self.slots[self.index(a)].w
    }

    fn push(&mut self, t: u64, ev: Ev) {
        let idx = match self.free.pop() {
            Some(i) => {
                self.payloads[i] = Some(ev);
                i
            }
            None => {
                self.payloads.push(Some(ev));
                self.payloads.len() - 1
            }
        };
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, idx)));
    }

    fn wake(&mut self, idx: usize, at: u64) {
        let at = at.max(self.slots[idx].busy_until).max(self.now.get());
        if self.slots[idx].wake_at.is_some_and(|t| t <= at) {
            return;
        }
        self.slots[idx].wake_at = Some(at);
        self.push(at, Ev::Wake(idx));
    }

    fn fault_gap(&mut self) -> u64 {
        let mean = self.faults.fault_interval_us.max(1000) * 1000;
        self.now.get() + self.rng.gen_range(mean / 2..=mean * 3 / 2)
    }

    /// Run events until `done()` holds or virtual time passes `limit_ns`. Returns whether `done`.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut() -> bool) -> bool {
        self.collect_woken();
        loop {
            if done() {
                return true;
            }
            let Some(&Reverse((t, _, _))) = self.events.peek() else {
                return done();
            };
            if t > limit_ns {
                self.now.set(limit_ns);
                return done();
            }
            let Reverse((t, _, idx)) = self.events.pop().expect("peeked");
            let ev = self.payloads[idx].take().expect("event payload present");
            self.free.push(idx);
            self.now.set(t);
            match ev {
                Ev::Deliver(p) => {
                    let i = self.index(p.dst);
                    if self.slot_down(p.dst) {
                        self.packets_dropped += 1;
                    } else {
                        self.packets_delivered += 1;
                        self.slots[i].inbox.push(p);
                        self.wake(i, t);
                    }
                }
                Ev::Wake(i) => {
                    if self.slots[i].wake_at == Some(t) {
                        self.slots[i].wake_at = None;
                    }
                    self.step(i);
                }
                Ev::Fault => self.inject_fault(),
                Ev::Heal(k) => self.heal(k),
                Ev::Targeted(i, start) => self.targeted(i, start),
                Ev::FlushStart(n, i, g) => self.flush_start(n, i, g),
                Ev::FlushDone(n, i, g) => self.flush_done(n, i, g),
            }
            self.collect_woken();
            self.run_adoptions();
        }
    }

    fn collect_woken(&mut self) {
        let woken: Vec<usize> = std::mem::take(&mut *self.woken.lock());
        let now = self.now.get();
        for i in woken {
            self.wake(i, now);
        }
    }

    /// Let one worker run everything it can, charging the work as busy time.
    fn step(&mut self, i: usize) {
        let now = self.now.get();
        let addr = self.slots[i].w.addr;
        // A paused host's workers run nothing; `resume` wakes them.
        if self.slot_down(addr) || self.paused[self.host_of(addr)] {
            return;
        }
        let factor = self.cpu_factor[self.host_of(addr)];
        let slot = &mut self.slots[i];
        if slot.busy_until > now {
            let t = slot.busy_until;
            self.wake(i, t);
            return;
        }
        let w = slot.w.clone();
        let inbox = std::mem::take(&mut slot.inbox);
        super::log::enter_lane(w.addr.worker);
        w.take_charged_ns();
        super::log::take_appended_bytes();
        // Nothing arrived and nothing was ready: a real worker had parked, and only its own
        // timer wakes it, which costs a park and a wake (`CpuCost::wake_ns`).
        let idle = inbox.is_empty() && !w.executor().has_ready();
        for p in inbox {
            let _ = w.deliver(p.src, &p.bytes);
        }
        // A bounded slice of work, like a scheduler quantum: packets that arrive meanwhile are
        // handled at the next step instead of waiting behind an unbounded run of tasks.
        w.fire_timers();
        if idle && w.executor().has_ready() {
            w.charge(CpuKind::Wake, w.cost.wake_ns);
        }
        w.executor().run_ready(STEP_TASKS);
        let mut out = Vec::new();
        w.take_outbox(&mut out);
        w.charge(CpuKind::Log, w.cost.log_ns(super::log::take_appended_bytes()));
        let (mut charged, split) = w.take_charged_ns();
        if factor != 1.0 {
            charged = (charged as f64 * factor) as u64;
        }
        self.busy_ns += charged;
        self.busy_by_kind.add_scaled(&split, factor);
        let busy_until = now + charged;
        self.slots[i].busy_until = busy_until;
        for p in out {
            self.send(p, busy_until);
        }
        if let Some(next) = w.fire_timers() {
            self.wake(i, next);
        }
        self.maybe_flush(w.addr.node);
        // Tasks woken by this step on this worker itself (e.g. by a reply it handled).
        if w.executor().has_ready() {
            self.wake(i, busy_until);
        }
    }

    fn send(&mut self, p: Packet, depart: u64) {
        let (s, d) = (self.host_of(p.src), self.host_of(p.dst));
        let cut = self.side.as_ref().is_some_and(|side| side[s] != side[d])
            || (s != d && (self.isolated[s] || self.isolated[d]));
        let lost = self.faults.loss > 0.0 && self.rng.gen_bool(self.faults.loss.min(1.0));
        if self.slot_down(p.src) {
            self.packets_dropped += 1;
            return;
        }
        let depart = if s == d { depart } else { self.onto_link(s, p.bytes.len(), depart) };
        if cut || lost {
            self.packets_dropped += 1;
            return;
        }
        let held_ns = match self.send_delay[s] {
            (_, Some(worker), _) if worker != p.src.worker => 0,
            (_, _, true) if !p.control => 0,
            (ns, _, _) => ns,
        };
        // While a delay holds a host's control packets alone, they travel FIFO apart from its
        // data (as over a connection of their own), so that they hold nothing else back.
        let apart = p.control && self.send_delay[s].2;
        let mut at = depart + self.latency.sample_ns(s as u16, d as u16, &mut self.rng) + held_ns;
        let last = self.link_last.entry((p.src, p.dst, apart)).or_insert(0);
        at = at.max(*last);
        *last = at;
        self.push(at, Ev::Deliver(p));
    }

    /// A packet of `bytes` that host `host` sends at `ready_ns` leaves its link (its last bit
    /// on the wire) at the returned time: after what the host sent before it, at the link's
    /// rate (`--bandwidth`; at once when unlimited). Lost packets take their time too.
    fn onto_link(&mut self, host: usize, bytes: usize, ready_ns: u64) -> u64 {
        self.wire_bytes += bytes as u64;
        let transmit_ns = self.latency.transmit_ns(bytes);
        if transmit_ns == 0 {
            return ready_ns;
        }
        let done_ns = ready_ns.max(self.link_free_ns[host]) + transmit_ns;
        self.link_free_ns[host] = done_ns;
        self.link_busy_ns[host] += transmit_ns;
        done_ns
    }

    fn inject_fault(&mut self) {
        let nodes = self.node_down.len();
        let dur = self.faults.fault_duration_us.max(1000) * 1000;
        let now = self.now.get();
        let pick_partition = self.faults.partitions && (!self.faults.crashes || self.rng.gen_bool(0.5));
        if nodes > 1 && pick_partition && self.side.is_none() {
            let mut side: Vec<bool> = (0..nodes).map(|_| self.rng.gen_bool(0.5)).collect();
            if side.iter().all(|s| *s) || side.iter().all(|s| !*s) {
                let n = self.rng.gen_range(0..nodes);
                side[n] = !side[n];
            }
            self.side = Some(side);
            self.push(now + dur, Ev::Heal(FaultKind::Partition));
        } else if self.faults.crashes && nodes > 0 {
            let n = self.rng.gen_range(0..nodes);
            if !self.host_down[n] {
                self.crash_host(n);
                self.push(now + dur, Ev::Heal(FaultKind::Restart(n as u16)));
                let event =
                    SimFaultEvent { kind: "crash", node: n as u16, at_ns: now, for_ns: Some(dur), targeted: false };
                self.fault_events.push(event);
            }
        }
        let next = self.fault_gap();
        self.push(next, Ev::Fault);
    }

    fn heal(&mut self, k: FaultKind) {
        match k {
            FaultKind::Partition => self.side = None,
            FaultKind::Restart(n) => self.restart_node(n),
        }
    }

    /// Targeted fault `i` (`--fault-at`) starts or ends. A crash of a host that is down
    /// already, or a pause of one paused already, does nothing (and is not recorded); so does
    /// a fault on the leader of a log that no replica leads at that moment.
    fn targeted(&mut self, i: usize, start: bool) {
        let f = self.faults.targeted[i].clone();
        let host = match (start, f.target) {
            (false, _) => self.targeted_on[i],
            (true, _) if self.targeted_off => None,
            (true, FaultTarget::Node(n)) => Some(n as usize),
            (true, FaultTarget::LeaderOf(n)) => {
                let leader = self.failover.as_ref().and_then(|fo| fo.leader_of(n));
                if leader.is_none() {
                    super::log_warn(&format!(
                        "sim: --fault-at {} of {} at {} µs: no replica leads that log now",
                        f.kind.name(),
                        f.target,
                        f.at_us
                    ));
                }
                leader.map(usize::from)
            }
        };
        let Some(h) = host.filter(|h| *h < self.host_down.len()) else { return };
        let now = self.now.get();
        let applies = match (f.kind, start) {
            (TargetedKind::Crash, true) => !self.host_down[h],
            (TargetedKind::Pause, true) => !self.paused[h],
            _ => true,
        };
        if !applies {
            super::log_warn(&format!(
                "sim: --fault-at {} of node {h} at {} µs: it is down already",
                f.kind.name(),
                f.at_us
            ));
            return;
        }
        match (f.kind, start) {
            (TargetedKind::Crash, true) => self.crash_host(h),
            // Unless the window's end brought it back already.
            (TargetedKind::Crash, false) if self.host_down[h] => self.restart_node(h as u16),
            (TargetedKind::Crash, false) => {}
            (TargetedKind::Pause, true) => self.paused[h] = true,
            (TargetedKind::Pause, false) => self.resume(h),
            (TargetedKind::Delay { by_us, worker, control }, true) => {
                self.send_delay[h] = (by_us * 1000, worker, control)
            }
            (TargetedKind::Delay { .. }, false) => self.send_delay[h] = (0, None, false),
            (TargetedKind::Cpu { factor }, true) => self.cpu_factor[h] = factor,
            (TargetedKind::Cpu { .. }, false) => self.cpu_factor[h] = 1.0,
            (TargetedKind::Partition, on) => self.isolated[h] = on,
            (TargetedKind::LogFail, on) => self.logs[h].iter().for_each(|l| l.log.set_refusing(on)),
        }
        self.targeted_on[i] = start.then_some(h);
        if start {
            let for_ns = f.for_us.map(|d| d * 1000);
            self.fault_events.push(SimFaultEvent {
                kind: f.kind.name(),
                node: h as u16,
                at_ns: now,
                for_ns,
                targeted: true,
            });
        }
    }

    /// A paused host goes on: its workers run what waited for them.
    fn resume(&mut self, h: usize) {
        if !std::mem::replace(&mut self.paused[h], false) {
            return;
        }
        let now = self.now.get();
        for i in 0..self.slots.len() {
            if self.host_of(self.slots[i].w.addr) == h {
                self.wake(i, now);
            }
        }
    }

    /// Stop injecting faults and heal everything (the end of a faulty run, before checking).
    pub fn heal_all(&mut self) {
        self.faults.partitions = false;
        self.faults.crashes = false;
        self.faults.loss = 0.0;
        self.side = None;
        self.isolated.iter_mut().for_each(|i| *i = false);
        self.logs.iter().flatten().for_each(|l| l.log.set_refusing(false));
        self.targeted_off = true;
        self.cpu_factor.iter_mut().for_each(|f| *f = 1.0);
        self.send_delay.iter_mut().for_each(|d| *d = (0, None, false));
        for h in 0..self.paused.len() {
            self.resume(h);
        }
        for n in 0..self.host_down.len() {
            if self.host_down[n] {
                self.restart_node(n as u16);
            }
        }
    }

    /// Host `h` crashes. Without failover, node h goes down with it (losing its memory if the
    /// run has a restart hook). With failover, its replicator stops and every node it serves
    /// loses its memory and stays down until a replica of its log takes it over.
    fn crash_host(&mut self, h: usize) {
        self.host_down[h] = true;
        if self.failover.is_none() {
            self.node_down[h] = true;
            for s in self.slots.iter_mut().filter(|s| s.w.addr.node as usize == h) {
                s.inbox.clear();
            }
            self.lose_memory(h);
            return;
        }
        for a in self.replication_addrs(h as u16) {
            let i = self.index(a);
            self.slots[i].inbox.clear();
        }
        if let Some(f) = self.failover.as_mut() {
            f.host_crashed(h as u16);
        }
        for g in 0..self.node_down.len() {
            if self.hosted_by[g] as usize == h && !self.node_down[g] {
                self.restarts += 1;
                self.kill_node(g);
            }
        }
    }

    /// Node `g`'s incarnation ends: its clients report, its workers never run again.
    fn kill_node(&mut self, g: usize) {
        self.node_down[g] = true;
        self.down_since[g] = self.now.get();
        for s in
            self.slots.iter_mut().filter(|s| s.w.addr.node as usize == g && s.w.addr.worker < self.workers_per_node)
        {
            s.inbox.clear();
            s.w.crash();
        }
    }

    /// Fresh workers at `addrs` for a new incarnation, numbering RPCs past every earlier one.
    fn fresh_workers(&mut self, addrs: impl Iterator<Item = Addr>) -> Vec<Rc<Worker>> {
        self.incarnations += 1;
        let incarnation = self.incarnations;
        addrs
            .map(|addr| {
                let idx = self.index(addr);
                let woken = self.woken.clone();
                let exec = Executor::new(Arc::new(move || woken.lock().push(idx)));
                let w =
                    Worker::new(addr, self.workers_per_node, Clock::Virtual(self.now.clone()), exec, &self.worker_cfg);
                // Late replies to the lost incarnation's requests must not match new ones.
                w.start_rpc_ids_at(incarnation << 40);
                Rc::new(w)
            })
            .collect()
    }

    /// Put `workers` into their slots and run them.
    fn install_workers(&mut self, workers: Vec<Rc<Worker>>) {
        let now = self.now.get();
        for w in workers {
            let i = self.index(w.addr);
            let old = std::mem::replace(&mut self.slots[i].w, w);
            self.retire(old);
            self.slots[i].inbox.clear();
            self.slots[i].busy_until = now;
            self.wake(i, now);
        }
    }

    /// `old`'s incarnation ended and another took its slot: drop its tasks now, and what they
    /// hold with them (the node's storage and what it kept to roll back, its host's replicas and
    /// their logs). Kept until the world ended, every crash added its incarnation's memory to the
    /// run's for the rest of it (issue 75: a 10-virtual-second Primo run with replicated logs and
    /// crashes held 14 GB). The destructors that run only touch what the ended incarnation owned
    /// (its timers, calls, waits, its log), and its tasks are never polled again.
    fn retire(&mut self, old: Rc<Worker>) {
        // A task dropped wakes its executor once, which would mark the slot (now the new
        // incarnation's) woken: a step it did not ask for. Forget those marks.
        let marks_before = self.woken.lock().len();
        old.shutdown();
        self.woken.lock().truncate(marks_before);
        self.retired.push(old);
    }

    /// Carry out the takeovers the replicators asked for: node g, served by host h from now
    /// on, is rebuilt from h's replica of its log on fresh workers; a previous incarnation
    /// still running is fenced off by being replaced.
    fn run_adoptions(&mut self) {
        let Some(f) = self.failover.as_mut() else { return };
        let requests = f.take_requests();
        for (g, h) in requests {
            if self.host_down[h as usize] {
                continue;
            }
            let workers = self.fresh_workers((0..self.workers_per_node).map(|wi| Addr::new(g, wi)));
            let adopted = self.failover.as_mut().is_some_and(|f| f.adopt(g, h, &workers));
            if !adopted {
                continue;
            }
            self.failovers += 1;
            let previous = self.hosted_by[g as usize];
            if previous != h && self.host_down[previous as usize] {
                self.moved += 1;
            }
            if self.node_down[g as usize] {
                self.failover_ns.push(self.now.get() - self.down_since[g as usize]);
            } else {
                self.kill_node(g as usize);
            }
            self.node_down[g as usize] = false;
            self.hosted_by[g as usize] = h;
            self.install_workers(workers);
        }
    }

    /// Make crashes lose memory: a crashed node restarts through `restart` from what its
    /// simulated disk kept. Without it, a crash is a stop-and-resume.
    pub fn set_restart(&mut self, restart: Restart, cfg: super::WorkerConfig) {
        self.restart = Some(restart);
        self.worker_cfg = cfg;
    }

    /// A crash that loses memory: the workers are told (their clients report what they did),
    /// the log keeps only what was flushed.
    fn lose_memory(&mut self, n: usize) {
        if self.restart.is_none() {
            return;
        }
        for s in self.slots.iter().filter(|s| s.w.addr.node as usize == n) {
            s.w.crash();
        }
        // One image per log (its first disk stands for it); a write under way is torn anywhere.
        let mut kept = Vec::new();
        for l in self.logs[n].iter().filter(|l| l.lane.unwrap_or(0) == 0) {
            let flushing = l.log.sim_flushing();
            let torn = if flushing > 0 { self.rng.gen_range(0..=flushing) } else { 0 };
            kept.push(l.log.sim_crash(torn));
        }
        self.log_generation[n] += 1;
        for l in self.logs[n].iter_mut() {
            l.busy = false;
        }
        self.survived[n] = Some(kept);
    }

    /// Bring host `n` back. With failover: a fresh replication worker resumes its replicas (the
    /// nodes it served come back only by a takeover). Without: node n is rebuilt from its disk
    /// if its memory was lost, else resumed.
    fn restart_node(&mut self, n: u16) {
        self.host_down[n as usize] = false;
        if self.failover.is_some() {
            let workers = self.fresh_workers(self.replication_addrs(n).into_iter());
            if let Some(f) = self.failover.as_mut() {
                f.host_restarted(n, &workers);
            }
            self.install_workers(workers);
            return;
        }
        self.node_down[n as usize] = false;
        let now = self.now.get();
        if let (Some(kept), true) = (self.survived[n as usize].take(), self.restart.is_some()) {
            self.restarts += 1;
            let workers = self.fresh_workers((0..self.workers_per_node).map(|wi| Addr::new(n, wi)));
            let restart = self.restart.as_mut().expect("checked");
            let logs = restart(n, kept, &workers);
            let lanes_before = self.logs[n as usize].len();
            let (group_commit_ns, fsync_ns) =
                self.logs[n as usize].first().map_or((0, 0), |l| (l.group_commit_ns, l.fsync_ns));
            self.set_logs(n, &logs, group_commit_ns / 1000, fsync_ns / 1000);
            assert_eq!(self.logs[n as usize].len(), lanes_before, "a restarted node keeps its logs and their lanes");
            self.install_workers(workers);
            return;
        }
        for i in 0..self.slots.len() {
            if self.slots[i].w.addr.node == n {
                self.slots[i].busy_until = now;
                self.wake(i, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::{Handler, WorkerConfig};
    use std::cell::RefCell;

    /// Records when each one-way message reached it.
    struct Arrivals {
        w: Rc<Worker>,
        at_ns: RefCell<Vec<u64>>,
    }

    impl Handler for Arrivals {
        fn on_request(&self, _: Addr, _: u64, _: &[u8]) {}
        fn on_oneway(&self, _: Addr, _: &[u8]) {
            self.at_ns.borrow_mut().push(self.w.now_ns());
        }
    }

    /// Node 0 sends node 1 two packets of 1,000 bytes, one step apart; returns when each
    /// arrived, and the world.
    fn two_packets(egress_mbps: u64) -> (Vec<u64>, SimWorld) {
        let latency = LatencyModel { delay_us: 10, egress_mbps, ..Default::default() };
        let mut world = SimWorld::new(2, 1, latency, FaultPlan::default(), 1);
        let workers: Vec<Rc<Worker>> = (0..2)
            .map(|n| {
                let addr = Addr::new(n, 0);
                let w =
                    Rc::new(Worker::new(addr, 1, world.clock(), world.executor_for(addr), &WorkerConfig::default()));
                world.add_worker(w.clone());
                w
            })
            .collect();
        let receiver = Rc::new(Arrivals { w: workers[1].clone(), at_ns: RefCell::default() });
        let handler: Rc<dyn Handler> = receiver.clone();
        workers[1].set_handler(Rc::downgrade(&handler));
        let sender = workers[0].clone();
        workers[0].spawn(async move {
            sender.send(Addr::new(1, 0), &[7; 1_000]);
            // The next step: a packet of its own.
            sender.sleep_us(1).await;
            sender.send(Addr::new(1, 0), &[8; 1_000]);
        });
        world.run_until(100_000_000, || receiver.at_ns.borrow().len() == 2);
        let at_ns = receiver.at_ns.borrow().clone();
        (at_ns, world)
    }

    /// `--bandwidth`: a packet takes its bytes' time on its sender's link, and waits behind the
    /// packets sent before it; unlimited, both arrive after the delay and the sender's CPU.
    #[test]
    fn a_packet_waits_for_the_link_behind_those_sent_before_it() {
        let (free, world) = two_packets(0);
        assert_eq!(free.len(), 2);
        assert!(free[1] < 50_000, "unlimited: both arrive within the delay and the CPU charged: {free:?}");
        assert!(world.wire_bytes >= 2_000 && world.link_busy_ns == vec![0, 0]);
        // 8 Mbit/s: a byte a µs, so each packet of a little over 1,000 bytes takes over 1 ms.
        let (slow, world) = two_packets(8);
        assert!(slow[0] >= 1_010_000, "the first waits for its own bytes: {slow:?}");
        assert!(slow[1] - slow[0] >= 1_000_000, "the second waits for the first to leave: {slow:?}");
        assert_eq!(world.link_busy_ns[0], world.wire_bytes * 1_000, "a byte a µs");
        assert_eq!(world.link_busy_ns[1], 0, "node 1 sent nothing");
    }

    /// A crashed node's incarnation is freed once the next takes its place, not when the run
    /// ends: the memory of a run with crashes grew with each one (see [`SimWorld::retire`]).
    #[test]
    fn a_crashed_incarnation_s_tasks_are_freed_when_the_next_takes_its_place() {
        let mut world = SimWorld::new(1, 1, LatencyModel::default(), FaultPlan::default(), 1);
        let addr = Addr::new(0, 0);
        let w = Rc::new(Worker::new(addr, 1, world.clock(), world.executor_for(addr), &WorkerConfig::default()));
        world.add_worker(w.clone());
        world.set_restart(Box::new(|_, _, _| Vec::new()), WorkerConfig::default());
        // What a node's task holds: its storage, say, and its worker (a cycle only shutdown breaks).
        let held = Rc::new(vec![7u8; 1 << 20]);
        let weak = Rc::downgrade(&held);
        let w2 = w.clone();
        w.spawn(async move {
            let _storage = held;
            w2.sleep_us(10_000_000).await;
        });
        // A request it served: the reply is kept for a resent copy.
        assert!(w.first_delivery(Addr::new(0, 0), 42));
        let old = w.clone();
        drop(w);
        world.run_until(1_000_000, || false);
        assert!(weak.upgrade().is_some(), "the task runs, holding it");
        world.crash_host(0);
        assert!(weak.upgrade().is_some(), "a crashed node's tasks are not dropped before it is replaced");
        world.restart_node(0);
        assert!(weak.upgrade().is_none(), "the ended incarnation's task still holds its memory");
        assert!(old.dedup.borrow().is_empty(), "the ended incarnation keeps the replies it served");
        assert!(world.woken.lock().is_empty(), "the new incarnation is not woken by the old one's tasks");
    }
}
