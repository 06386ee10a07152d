//! The `local` runtime: every worker of every node is a thread of this process; packets travel
//! through in-memory inboxes. Injected delay is applied where a packet is received: it is held
//! until its sampled arrival time. A worker thread never spins: with nothing to do it parks until
//! a packet, a wake from another thread, or its next timer.

use super::{Clock, Executor, Worker, WorkerConfig};
use crate::net::{Addr, LatencyModel, Packet};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Work handed to a worker thread from outside (start clients, run the final read...).
pub type Command = Box<dyn FnOnce() + Send>;

/// One worker's mailbox: packets from other workers and commands from the orchestrator.
pub struct Inbox {
    packets: Mutex<Vec<Packet>>,
    commands: Mutex<Vec<Command>>,
    thread: Mutex<Option<Thread>>,
}

impl Inbox {
    fn new() -> Self {
        Inbox { packets: Mutex::new(Vec::new()), commands: Mutex::new(Vec::new()), thread: Mutex::new(None) }
    }

    fn unpark(&self) {
        if let Some(t) = &*self.thread.lock() {
            t.unpark();
        }
    }

    pub fn push_command(&self, c: Command) {
        self.commands.lock().push(c);
        self.unpark();
    }
}

/// The in-process network: one inbox per worker.
pub struct LocalNet {
    pub workers_per_node: u16,
    pub inboxes: Vec<Arc<Inbox>>,
    pub stop: AtomicBool,
    pub epoch: Instant,
    pub latency: LatencyModel,
}

impl LocalNet {
    pub fn new(nodes: u16, workers_per_node: u16, latency: LatencyModel) -> Arc<Self> {
        Arc::new(LocalNet {
            workers_per_node,
            inboxes: (0..nodes as usize * workers_per_node as usize).map(|_| Arc::new(Inbox::new())).collect(),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            latency,
        })
    }

    pub fn inbox(&self, a: Addr) -> &Arc<Inbox> {
        &self.inboxes[a.node as usize * self.workers_per_node as usize + a.worker as usize]
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for i in &self.inboxes {
            i.unpark();
        }
    }
}

/// Delayed packets held by a receiver until their arrival time. Each link stays FIFO, as a TCP
/// connection is: a packet never overtakes an earlier one from the same sender.
#[derive(Default)]
pub struct DelayQueue {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    held: rustc_hash::FxHashMap<u64, Packet>,
    last_due: rustc_hash::FxHashMap<Addr, u64>,
    seq: u64,
}

impl DelayQueue {
    pub fn hold(&mut self, due_ns: u64, p: Packet) {
        let last = self.last_due.entry(p.src).or_insert(0);
        let due_ns = due_ns.max(*last);
        *last = due_ns;
        self.seq += 1;
        self.heap.push(Reverse((due_ns, self.seq)));
        self.held.insert(self.seq, p);
    }

    pub fn pop_due(&mut self, now_ns: u64) -> Option<Packet> {
        match self.heap.peek() {
            Some(Reverse((due, _))) if *due <= now_ns => {
                let Reverse((_, s)) = self.heap.pop()?;
                self.held.remove(&s)
            }
            _ => None,
        }
    }

    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|r| r.0 .0)
    }
}

/// Longest a real-time worker sleeps with nothing due (so it notices `stop` promptly).
const MAX_IDLE: Duration = Duration::from_millis(50);

/// One quantum of a real-time worker loop (`local` and `tcp`): deliver the held packets that
/// are due, fire due timers, run up to [`super::STEP_TASKS`] tasks, and collect the batches to
/// send into `out`. Returns how long the worker may sleep before something is due: zero when
/// it has work already, at most [`MAX_IDLE`].
pub fn run_quantum(w: &Worker, delayed: &mut DelayQueue, out: &mut Vec<Packet>) -> Duration {
    while let Some(p) = delayed.pop_due(w.now_ns()) {
        let _ = w.deliver(p.src, &p.bytes);
    }
    w.fire_timers();
    w.executor().run_ready(super::STEP_TASKS);
    w.take_outbox(out);
    if w.executor().has_ready() {
        return Duration::ZERO;
    }
    let now = w.now_ns();
    match [w.fire_timers(), delayed.next_due()].into_iter().flatten().min() {
        Some(t) => Duration::from_nanos(t.saturating_sub(now)).min(MAX_IDLE),
        None => MAX_IDLE,
    }
}

/// Make the worker for `addr` on the current thread.
pub fn make_worker(net: &Arc<LocalNet>, addr: Addr, cfg: &WorkerConfig) -> Rc<Worker> {
    let inbox = net.inbox(addr).clone();
    *inbox.thread.lock() = Some(std::thread::current());
    super::log::enter_lane(addr.worker);
    let exec = Executor::new(Arc::new(move || inbox.unpark()));
    Rc::new(Worker::new(addr, net.workers_per_node, Clock::Real(net.epoch), exec, cfg))
}

/// Run a worker's event loop on the current thread until the network is stopped.
pub fn run_worker(net: &Arc<LocalNet>, w: &Rc<Worker>) {
    let inbox = net.inbox(w.addr).clone();
    let mut delayed = DelayQueue::default();
    let delay = !net.latency.is_zero();
    let mut batch: Vec<Packet> = Vec::new();
    let mut out: Vec<Packet> = Vec::new();
    while !net.stop.load(Ordering::Acquire) {
        let commands: Vec<Command> = std::mem::take(&mut *inbox.commands.lock());
        for c in commands {
            c();
        }
        std::mem::swap(&mut batch, &mut *inbox.packets.lock());
        let now = w.now_ns();
        for p in batch.drain(..) {
            if delay {
                let d = net.latency.sample_ns(p.src.node, p.dst.node, &mut *w.rng.borrow_mut());
                delayed.hold(now + d, p);
            } else {
                let _ = w.deliver(p.src, &p.bytes);
            }
        }
        let wait = run_quantum(w, &mut delayed, &mut out);
        for p in out.drain(..) {
            let dst = net.inbox(p.dst);
            dst.packets.lock().push(p);
            dst.unpark();
        }
        if wait.is_zero() || !inbox.packets.lock().is_empty() || !inbox.commands.lock().is_empty() {
            continue;
        }
        std::thread::park_timeout(wait);
    }
}

#[cfg(test)]
mod calibration {
    use std::time::{Duration, Instant};

    /// What a worker of `local` pays each time it parks with a short timeout and its timer wakes
    /// it: the simulator's `CpuCost::wake_ns`.
    #[test]
    #[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per wake of an idle worker"]
    fn a_park_and_a_wake_by_timeout() {
        let waits = 20_000;
        for _ in 0..3 {
            let (cpu_us, t0) = (crate::util::process_cpu_us(), Instant::now());
            for _ in 0..waits {
                std::thread::park_timeout(Duration::from_micros(5));
            }
            let cpu_ns = (crate::util::process_cpu_us() - cpu_us) as f64 * 1000.0 / waits as f64;
            let wall_ns = t0.elapsed().as_nanos() as f64 / waits as f64;
            println!("park_timeout(5 µs): {cpu_ns:.0} ns of CPU and {wall_ns:.0} ns of wall time a wake");
        }
    }

    /// What a worker of `local` pays when a packet from another thread finds it parked: two
    /// threads hand a token back and forth, each parking until the other unparks it, so every
    /// hand-off is an unpark (the sender's system call) and a wake (the receiver's).
    #[test]
    #[ignore = "a measurement, not a test: run it to calibrate the simulator's charge per wake of an idle worker by a packet"]
    fn a_park_and_a_wake_by_another_thread() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let hand_offs = 20_000u64;
        for _ in 0..3 {
            let turn = Arc::new(AtomicU64::new(0));
            let (cpu_us, t0) = (crate::util::process_cpu_us(), Instant::now());
            let main = std::thread::current();
            let other = {
                let (turn, main) = (turn.clone(), main.clone());
                std::thread::spawn(move || {
                    for i in (1..hand_offs).step_by(2) {
                        while turn.load(Ordering::Acquire) != i {
                            std::thread::park();
                        }
                        turn.store(i + 1, Ordering::Release);
                        main.unpark();
                    }
                })
            };
            for i in (0..hand_offs).step_by(2) {
                while turn.load(Ordering::Acquire) != i {
                    std::thread::park();
                }
                turn.store(i + 1, Ordering::Release);
                other.thread().unpark();
            }
            other.join().expect("the other thread ends");
            let cpu_ns = (crate::util::process_cpu_us() - cpu_us) as f64 * 1000.0 / hand_offs as f64;
            let wall_ns = t0.elapsed().as_nanos() as f64 / hand_offs as f64;
            println!("a hand-off to a parked thread: {cpu_ns:.0} ns of CPU and {wall_ns:.0} ns of wall time");
        }
    }
}
