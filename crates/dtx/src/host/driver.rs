//! The driver that runs on every worker: `inflight` client tasks, each issuing a transaction,
//! retrying it after an abort (with randomized exponential backoff) until it commits, then
//! issuing the next. Closed loop by default: the next transaction starts when the last one
//! ended. Open loop with `--rate` ([`Arrivals`]): transactions arrive as a Poisson process, a
//! free client takes the oldest arrival, and its latency runs from the arrival, so the time an
//! arrival queued for a client counts (no coordinated omission). A commit that waits only for the log is handed to the
//! worker's ack queue ([`super::acks`], at most `max_unacked`) and acknowledged from there, so
//! its client goes on at once. Metrics count what is acknowledged inside the measured window.

use super::acks::{Acknowledge, Acks, Pending};
use super::metrics::{HistLine, Metrics};
use crate::protocols::{Attempt, WorkerProtocol};
use crate::rt::Worker;
use crate::txn::{Abort, TxnOutput, TxnRequest};
use crate::workloads::Workload;
use parking_lot::Mutex;
use rand::Rng as _;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub use super::metrics::Window;

/// What the workers of one process report into, read by whoever orchestrates the run.
#[derive(Default)]
pub struct RunShared {
    /// Workers whose clients are still running.
    pub running: AtomicUsize,
    pub reports: Mutex<Vec<Metrics>>,
    /// The final read-all transaction's history line, once it committed (or gave up).
    pub final_read: Mutex<Option<Result<HistLine, String>>>,
    pub history_ids: AtomicU64,
    /// What the final checks found, once they ran.
    pub checks: Mutex<Option<Vec<(String, bool, String)>>>,
    /// With a data folder (tcp servers with `--data-dir`): every attempt is also written here, as
    /// of unknown outcome when it starts and with its outcome when it ends, so that a server killed
    /// mid-run leaves a complete history behind ([`read_history_file`] keeps the last line per id).
    pub history_file: Option<Mutex<std::fs::File>>,
    /// Records that restarted nodes found durable in one lane of their log after a record
    /// another lane lost, and voided (see `rt::lanes`).
    pub orphans_voided: AtomicU64,
    /// Restarts (in the simulator) whose log held records in more than one lane: only those can
    /// have been torn across lanes (a protocol whose log one worker writes never is).
    pub recovered_over_lanes: AtomicU64,
    /// Restarts (in the simulator) that recovered from a checkpoint and the records after it.
    pub recovered_from_checkpoint: AtomicU64,
    /// Commits committed in memory and waiting in the workers' ack queues for the log, now.
    pub held_for_log: AtomicU64,
    /// Clients that have not finished their last transaction yet, now (not kept up to date
    /// across a simulated crash, whose clients never finish: read by the real-time runtimes).
    pub clients_live: AtomicU64,
    /// The run gave up waiting for its log (a full disk, `local`): clients of a driver started
    /// with [`DriverConfig::abandonable`] stop waiting, report what they hold as of unknown
    /// outcome, and their worker reports its metrics.
    pub abandon: std::sync::atomic::AtomicBool,
    /// Each worker's replay-only run after the window ([`replay_only`]), `None` from a
    /// protocol that measures none.
    pub replays: Mutex<Vec<Option<crate::protocols::ReplayRun>>>,
    /// As the window closed (`local`): each replica's applied watermark and each node's
    /// released one (µs on the protocol's clock), for the replay lag.
    pub replay_points_us: Mutex<Vec<u64>>,
    /// What the log machines of every host's replicas counted, summed by name (`local`).
    pub replica_counters: Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

/// Write one history line to the run's history file, if it keeps one. A write that fails is
/// reported once per process and the run goes on (the in-memory history is still complete).
fn persist(shared: &RunShared, line: &HistLine) {
    let Some(f) = &shared.history_file else { return };
    let mut bytes = serde_json::to_vec(line).unwrap_or_default();
    bytes.push(b'\n');
    // One write per line: with O_APPEND, lines of several threads never interleave.
    if let Err(e) = std::io::Write::write_all(&mut *f.lock(), &bytes) {
        crate::rt::log_warn(&format!("cannot write the history file: {e}"));
    }
}

/// The history a server kept in its file: the last line of each id (an attempt's outcome
/// replaces the line written when it started), in file order. Unreadable lines are skipped.
pub fn read_history_file(path: &std::path::Path) -> std::io::Result<Vec<HistLine>> {
    let text = std::fs::read_to_string(path)?;
    let mut pos: rustc_hash::FxHashMap<u64, usize> = Default::default();
    let mut lines: Vec<HistLine> = Vec::new();
    for l in text.lines() {
        let Ok(h) = serde_json::from_str::<HistLine>(l) else { continue };
        match pos.get(&h.id) {
            Some(&i) => lines[i] = h,
            None => {
                pos.insert(h.id, lines.len());
                lines.push(h);
            }
        }
    }
    Ok(lines)
}

pub struct DriverConfig {
    /// Clients on this worker: in a closed loop, the transactions in flight; in an open loop,
    /// the most that run at once (arrivals beyond wait for one).
    pub inflight: u32,
    /// Open-loop arrivals at this worker per second (`--rate` split over the node's client
    /// workers); 0: closed loop.
    pub arrivals_per_s: f64,
    /// Commits that may wait for the log while their clients go on ([`super::acks`]).
    pub max_unacked: u32,
    pub max_retries: u32,
    pub record_history: bool,
    pub window: Window,
    /// Clients still waiting after the window stop when the run sets [`RunShared::abandon`]
    /// (they look every [`ABANDON_POLL_US`]; the real-time runtimes only, so that a simulation
    /// schedules nothing more).
    pub abandonable: bool,
}

/// How often, past the window, a client of an abandonable run looks whether the run gave up.
const ABANDON_POLL_US: u64 = 20_000;

/// One worker's open-loop arrivals: a Poisson process (exponential gaps) drawn lazily, one
/// arrival ahead, from a generator of its own, so that a closed-loop run's draws stay as they
/// were. A client takes the next arrival and waits for its time, or, when the arrival is past
/// (every client was busy), starts at once with its latency counted from the arrival.
pub struct Arrivals {
    next_ns: u64,
    mean_gap_ns: f64,
    rng: crate::util::Rng,
    window: Window,
    /// Arrivals in the window that a client took.
    taken_in_window: u64,
}

impl Arrivals {
    pub fn new(per_s: f64, seed: u64, start_ns: u64, window: Window) -> Self {
        assert!(per_s > 0.0 && per_s.is_finite(), "an arrival rate is positive");
        let mut a = Arrivals {
            next_ns: start_ns,
            mean_gap_ns: 1e9 / per_s,
            rng: crate::util::rng_from_seed(seed),
            window,
            taken_in_window: 0,
        };
        a.next_ns += a.gap_ns();
        a
    }

    fn gap_ns(&mut self) -> u64 {
        // Inverse transform: -ln(U) of U in (0, 1] is exponential with mean 1.
        let u: f64 = 1.0 - self.rng.gen::<f64>();
        (-u.ln() * self.mean_gap_ns) as u64
    }

    /// The next arrival's time (ns); the one after it is drawn.
    pub fn take(&mut self) -> u64 {
        let t = self.next_ns;
        if (self.window.start_ns..self.window.end_ns).contains(&t) {
            self.taken_in_window += 1;
        }
        self.next_ns += self.gap_ns();
        t
    }

    /// Arrivals due by `now_ns` inside the window that no client has taken yet (drawn on a
    /// copy of the generator: the arrivals themselves are not consumed).
    pub fn backlog_at(&self, now_ns: u64) -> u64 {
        let mut probe = Arrivals { rng: self.rng.clone(), taken_in_window: 0, ..*self };
        let until = now_ns.min(self.window.end_ns);
        let mut waiting = 0;
        while probe.next_ns < until {
            waiting += u64::from(probe.next_ns >= self.window.start_ns);
            probe.next_ns += probe.gap_ns();
        }
        waiting
    }

    /// Arrivals in the window by its end: taken, and waiting for a client.
    pub fn offered_in_window(&self) -> u64 {
        self.taken_in_window + self.backlog_at(self.window.end_ns)
    }
}

/// At the window's end, what the open loop offered and what was left waiting, as the worker's
/// counters `arrivals-offered` and `arrivals-backlog`.
fn count_arrivals_at_window_end(w: &Rc<Worker>, m: &Rc<RefCell<Metrics>>, arrivals: &Rc<RefCell<Arrivals>>) {
    let (w2, m, arrivals) = (w.clone(), m.clone(), arrivals.clone());
    w.spawn(async move {
        let end_ns = arrivals.borrow().window.end_ns;
        w2.sleep_us(end_ns.saturating_sub(w2.now_ns()) / 1000).await;
        let a = arrivals.borrow();
        let mut m = m.borrow_mut();
        m.counters.insert("arrivals-offered", a.offered_in_window());
        m.counters.insert("arrivals-backlog", a.backlog_at(end_ns));
    });
}

/// Polls `a`, and `b` while `a` is not done: `Some` of `a`'s output, or `None` once `b` is ready.
struct Race<A, B> {
    a: std::pin::Pin<Box<A>>,
    b: std::pin::Pin<Box<B>>,
}

impl<A: std::future::Future, B: std::future::Future<Output = ()>> std::future::Future for Race<A, B> {
    type Output = Option<A::Output>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        if let std::task::Poll::Ready(v) = self.a.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(v));
        }
        self.b.as_mut().poll(cx).map(|()| None)
    }
}

/// Ready once the run gave up on its log ([`RunShared::abandon`]), looked at from the window's
/// end on.
async fn abandoned(w: &Rc<Worker>, shared: &RunShared, window: Window) {
    w.sleep_us(window.end_ns.saturating_sub(w.now_ns()) / 1000).await;
    while !shared.abandon.load(Ordering::Acquire) {
        w.sleep_us(ABANDON_POLL_US).await;
    }
}

/// Start the clients of one worker. When all of them finished, the worker's metrics land in
/// `shared.reports` and `shared.running` drops by one.
pub fn start(
    w: &Rc<Worker>,
    proto: Rc<dyn WorkerProtocol>,
    wl: Arc<dyn Workload>,
    homes: Vec<u32>,
    cfg: DriverConfig,
    shared: Arc<RunShared>,
) {
    assert!(!homes.is_empty(), "a worker needs at least one home partition");
    let metrics = Rc::new(RefCell::new(Metrics::new(cfg.window)));
    metrics.borrow_mut().node = w.addr.node;
    metrics.borrow_mut().classes = wl.txn_classes();
    let live = Rc::new(std::cell::Cell::new(cfg.inflight as usize));
    shared.clients_live.fetch_add(cfg.inflight as u64, Ordering::Relaxed);
    {
        let (w2, m2, win) = (w.clone(), metrics.clone(), cfg.window);
        w.spawn(async move { measure_window(&w2, &m2, win).await });
    }
    let arrivals = (cfg.arrivals_per_s > 0.0).then(|| {
        let seed = w.rng.borrow_mut().gen::<u64>();
        Rc::new(RefCell::new(Arrivals::new(cfg.arrivals_per_s, seed, w.now_ns(), cfg.window)))
    });
    if let Some(a) = &arrivals {
        count_arrivals_at_window_end(w, &metrics, a);
    }
    let cfg = Rc::new(cfg);
    let attempts: Attempts = Rc::new(RefCell::new(vec![None; cfg.inflight as usize]));
    let acks = proto.ack_source().filter(|_| cfg.max_unacked > 0).map(|source| {
        let ack = acknowledge(w.clone(), metrics.clone(), wl.clone(), shared.clone());
        Acks::new(source, cfg.max_unacked as usize, ack)
    });
    on_crash_report(w, &metrics, &live, &attempts, (&acks, &wl), &shared, cfg.window);
    for i in 0..cfg.inflight as usize {
        let home = homes[i % homes.len()];
        let (w2, p2, wl2, m2, live2, sh2, cfg2) =
            (w.clone(), proto.clone(), wl.clone(), metrics.clone(), live.clone(), shared.clone(), cfg.clone());
        let (at2, acks2, arrivals2) = (attempts.clone(), acks.clone(), arrivals.clone());
        w.spawn(async move {
            let acks = acks2.as_ref();
            let arrivals = arrivals2.as_deref();
            let me = Client { w: &w2, proto: &*p2, wl: &*wl2, m: &m2, home, cfg: &cfg2, shared: &sh2, acks, arrivals };
            if cfg2.abandonable {
                // A client stuck on the log when the run gives up leaves its attempt in
                // `attempts`, reported below as of unknown outcome.
                Race { a: Box::pin(me.run(&at2, i)), b: Box::pin(abandoned(&w2, &sh2, cfg2.window)) }.await;
            } else {
                me.run(&at2, i).await;
            }
            sh2.clients_live.fetch_sub(1, Ordering::Relaxed);
            // Every commit is acknowledged (or, at a crash or when the run gives up on its log,
            // reported unknown) before the worker reports: a history must hold every
            // transaction the final read may see.
            while acks.is_some_and(|a| !a.is_empty()) && !(cfg2.abandonable && sh2.abandon.load(Ordering::Acquire)) {
                w2.sleep_us(ACK_DRAIN_POLL_US).await;
            }
            live2.set(live2.get() - 1);
            if live2.get() == 0 {
                let mut m = std::mem::replace(&mut *m2.borrow_mut(), Metrics::new(cfg2.window));
                if cfg2.abandonable && sh2.abandon.load(Ordering::Acquire) {
                    report_unknown(&mut m, &at2, acks, &*wl2, &sh2, w2.history_now_us());
                }
                sh2.reports.lock().push(m);
                sh2.running.fetch_sub(1, Ordering::AcqRel);
            }
        });
    }
}

/// How often a client that finished looks whether its worker's deferred commits are all
/// acknowledged.
const ACK_DRAIN_POLL_US: u64 = 500;

/// Per client: the attempt in flight (its operations and start time as histories record it,
/// µs), when histories are kept.
type Attempts = Rc<RefCell<Vec<Option<(Vec<crate::txn::HistOp>, u64)>>>>;

/// If the worker's node crashes, its clients die mid-transaction: report what they committed so
/// far, and each attempt in flight as of unknown outcome (it may have committed before the
/// crash), so that the history stays complete.
/// Take the worker's message and protocol counters at the window's edges, and its gauges'
/// largest values within it, into `m`.
async fn measure_window(w: &Rc<Worker>, m: &RefCell<Metrics>, win: Window) {
    let now = w.now_ns();
    w.sleep_us(win.start_ns.saturating_sub(now) / 1000).await;
    let (s0, c0) = (*w.stats.borrow(), w.counters());
    w.take_gauges(); // What the warm-up reached is not the window's.
    let now = w.now_ns();
    w.sleep_us(win.end_ns.saturating_sub(now) / 1000).await;
    let s1 = *w.stats.borrow();
    let mut m = m.borrow_mut();
    m.gauges.extend(w.take_gauges());
    for (name, n1) in w.counters() {
        let n0 = c0.iter().find(|c| c.0 == name).map_or(0, |c| c.1);
        m.counters.insert(name, n1 - n0);
    }
    m.msgs = s1.msgs_sent - s0.msgs_sent;
    m.bytes = s1.bytes_sent - s0.bytes_sent;
    m.log_waits = s1.log_waits - s0.log_waits;
    m.log_wait_ns = s1.log_wait_ns - s0.log_wait_ns;
}

/// A worker that runs no clients (a protocol's own: a sequencer, a scheduler) still reports
/// what it sent and counted over the window, so messages per transaction and the protocol's
/// counters include its work. Like a worker's clients, it reports once, at the window's end or
/// at a crash of its node, and `shared.running` drops by one then.
pub fn observe(w: &Rc<Worker>, window: Window, shared: Arc<RunShared>) {
    let metrics = Rc::new(RefCell::new(Metrics::new(window)));
    metrics.borrow_mut().node = w.addr.node;
    let reported = Rc::new(std::cell::Cell::new(false));
    let report = {
        let (m, reported, shared) = (metrics.clone(), reported.clone(), shared.clone());
        move || {
            if !reported.replace(true) {
                shared.reports.lock().push(std::mem::replace(&mut *m.borrow_mut(), Metrics::new(window)));
                shared.running.fetch_sub(1, Ordering::AcqRel);
            }
        }
    };
    w.on_crash(Box::new(report.clone()));
    let w2 = w.clone();
    w.spawn(async move {
        measure_window(&w2, &metrics, window).await;
        report();
    });
}

fn on_crash_report(
    w: &Rc<Worker>,
    metrics: &Rc<RefCell<Metrics>>,
    live: &Rc<std::cell::Cell<usize>>,
    attempts: &Attempts,
    (acks, wl): (&Option<Rc<Acks>>, &Arc<dyn Workload>),
    shared: &Arc<RunShared>,
    window: Window,
) {
    let (m, live, attempts, shared, w2) = (metrics.clone(), live.clone(), attempts.clone(), shared.clone(), w.clone());
    let (acks, wl) = (acks.clone(), wl.clone());
    w.on_crash(Box::new(move || {
        if live.get() == 0 {
            return;
        }
        live.set(0);
        let mut m = std::mem::replace(&mut *m.borrow_mut(), Metrics::new(window));
        report_unknown(&mut m, &attempts, acks.as_ref(), &*wl, &shared, w2.history_now_us());
        shared.reports.lock().push(m);
        shared.running.fetch_sub(1, Ordering::AcqRel);
    }));
}

/// The attempts in flight and the commits held for the log (committed in memory, not known to
/// be durable) when a worker's clients die (a crash) or stop waiting (the run gave up on its
/// log): each a history line of unknown outcome in `m`, since it may or may not have committed.
fn report_unknown(
    m: &mut Metrics,
    attempts: &Attempts,
    acks: Option<&Rc<Acks>>,
    wl: &dyn Workload,
    shared: &RunShared,
    now_us: u64,
) {
    for (ops, start_us) in attempts.borrow_mut().iter_mut().filter_map(Option::take) {
        let id = ((m.node as u64) << 40) | shared.history_ids.fetch_add(1, Ordering::Relaxed);
        m.record_history(HistLine { id, status: "unknown".into(), ops, start_us, end_us: now_us.max(start_us) });
    }
    let held = acks.map(|a| a.take_all()).unwrap_or_default();
    shared.held_for_log.fetch_sub(held.len() as u64, Ordering::Relaxed);
    for p in held {
        if let (Some((id, start_us)), Some((req, _))) = (p.history, &p.txn) {
            let ops = wl.attempted_ops(req);
            m.record_history(HistLine { id, status: "unknown".into(), ops, start_us, end_us: now_us.max(start_us) });
        }
    }
}

/// One client: closed loop, or open loop taking [`Arrivals`].
struct Client<'a> {
    w: &'a Rc<Worker>,
    proto: &'a dyn WorkerProtocol,
    wl: &'a dyn Workload,
    m: &'a RefCell<Metrics>,
    home: u32,
    cfg: &'a DriverConfig,
    shared: &'a RunShared,
    /// Where commits wait for the disk, when the protocol defers acknowledgements.
    acks: Option<&'a Rc<Acks>>,
    /// The worker's open-loop arrivals (`--rate`); none in a closed loop.
    arrivals: Option<&'a RefCell<Arrivals>>,
}

impl Client<'_> {
    /// Issue transactions until the window ends, each retried after an abort (with randomized
    /// exponential backoff) until it commits or gives up. `attempts[i]` holds the attempt in
    /// flight (histories only), for a crash to report.
    async fn run(&self, attempts: &Attempts, i: usize) {
        let (w, wl, m, cfg, shared) = (self.w, self.wl, self.m, self.cfg, self.shared);
        let track = |req: &TxnRequest, start: Option<u64>| {
            attempts.borrow_mut()[i] = start.map(|us| (wl.attempted_ops(req), us));
        };
        while w.now_ns() < cfg.window.end_ns {
            let Some(first_ns) = self.next_start_ns().await else { break };
            let mut req = wl.next(&mut w.rng.borrow_mut(), self.home);
            let mut number = 0;
            loop {
                let defer_ack = self.acks.is_some();
                let attempt = Attempt { first_start_us: first_ns / 1000, number, fresh: false, defer_ack };
                let start_us = w.history_now_us();
                let mut id = 0;
                if cfg.record_history {
                    track(&req, Some(start_us));
                    id = history_id(m, shared);
                    if shared.history_file.is_some() {
                        let ops = wl.attempted_ops(&req);
                        let us = start_us;
                        persist(shared, &HistLine { id, status: "unknown".into(), ops, start_us: us, end_us: us });
                    }
                }
                let result = self.proto.execute(&req, attempt).await;
                let end_ns = w.now_ns();
                if cfg.record_history {
                    track(&req, None);
                }
                let history = cfg.record_history.then_some((id, start_us));
                match result {
                    Ok(mut out) => {
                        match out.ack_after.take() {
                            Some(point) => {
                                let acks =
                                    self.acks.expect("a protocol deferred an acknowledgement it was not asked to");
                                // Queued before any wait: a crash must find it (its record may be durable).
                                shared.held_for_log.fetch_add(1, Ordering::Relaxed);
                                let (kind, class) = (wl.txn_kind(&req), wl.txn_class(&req));
                                let txn = (history.is_some() || wl.watches_commits()).then_some((req, out));
                                let pending =
                                    Pending { point, kind, class, txn, first_ns, committed_ns: end_ns, history };
                                acks.push(w, pending);
                                acks.room().await;
                            }
                            None => {
                                let kind = (wl.txn_kind(&req), wl.txn_class(&req));
                                acknowledged(
                                    (w, m, shared),
                                    (wl, Some((&req, &out)), kind),
                                    history,
                                    (first_ns, end_ns),
                                )
                            }
                        }
                        // Give message handlers and other clients a turn: a run of local
                        // transactions must not starve the replies other nodes wait for.
                        crate::rt::yield_now().await;
                        break;
                    }
                    Err(reason) => {
                        if let Some((id, start_us)) = history {
                            let status = if reason == Abort::OutcomeUnknown { "unknown" } else { "aborted" };
                            let line = HistLine {
                                id,
                                status: status.into(),
                                ops: wl.attempted_ops(&req),
                                start_us,
                                end_us: w.history_now_us(),
                            };
                            record(m, shared, line);
                        }
                        m.borrow_mut().abort(end_ns, reason);
                        number += 1;
                        if !reason.retryable() || number > cfg.max_retries || w.now_ns() >= cfg.window.end_ns {
                            if reason.retryable() && number > cfg.max_retries {
                                m.borrow_mut().gave_up += 1;
                            }
                            break;
                        }
                        backoff(w, number).await;
                        wl.before_retry(&mut req, &mut w.rng.borrow_mut());
                    }
                }
            }
        }
    }
}

impl Client<'_> {
    /// When the next transaction starts, as its latency counts it: now in a closed loop; in an
    /// open loop, the next arrival's time, waited for if it is still ahead (none once arrivals
    /// pass the window).
    async fn next_start_ns(&self) -> Option<u64> {
        let Some(arrivals) = self.arrivals else { return Some(self.w.now_ns()) };
        let t = arrivals.borrow_mut().take();
        // Past the window, the client still waits for its end, as a closed-loop client runs
        // to it: the worker reports once its clients end, and the window's counters come first.
        let wake_ns = t.min(self.cfg.window.end_ns);
        let now = self.w.now_ns();
        if wake_ns > now {
            self.w.sleep_us((wake_ns - now).div_ceil(1000)).await;
        }
        (t < self.cfg.window.end_ns).then_some(t)
    }
}

/// What the acknowledgement of a commit needs of it: the workload, its request and output when
/// kept, and its kind and class.
type Committed<'a> = (&'a dyn Workload, Option<(&'a TxnRequest, &'a TxnOutput)>, (&'static str, u8));

/// A commit acknowledged at `end_ns`, by its client at once or later by the ack queue: its
/// history line when histories are kept (`history`: its id and start, µs; its output is kept
/// then), the workload's bookkeeping, and the metrics (latency from the first attempt's start).
fn acknowledged(
    (w, m, shared): (&Worker, &RefCell<Metrics>, &RunShared),
    (wl, txn, (kind, class)): Committed<'_>,
    history: Option<(u64, u64)>,
    (first_ns, end_ns): (u64, u64),
) {
    if let Some((req, out)) = txn {
        if let Some((id, start_us)) = history {
            let ops = out.history.clone();
            record(m, shared, HistLine { id, status: "committed".into(), ops, start_us, end_us: w.history_now_us() });
        }
        wl.on_commit(req, out);
    }
    m.borrow_mut().commit(end_ns, end_ns.saturating_sub(first_ns), kind, class);
}

/// What the ack queue does with a commit once its point is decided: acknowledge it once
/// released; report it aborted (`rolled-back`) once rolled back, with the operations it
/// attempted, since none of its effects remain.
fn acknowledge(w: Rc<Worker>, m: Rc<RefCell<Metrics>>, wl: Arc<dyn Workload>, shared: Arc<RunShared>) -> Acknowledge {
    Box::new(move |p: Pending, released: bool, now_ns: u64| {
        shared.held_for_log.fetch_sub(1, Ordering::Relaxed);
        w.note_log_wait(now_ns.saturating_sub(p.committed_ns));
        if released {
            let txn = p.txn.as_ref().map(|(req, out)| (req, out));
            return acknowledged((&w, &m, &shared), (&*wl, txn, (p.kind, p.class)), p.history, (p.first_ns, now_ns));
        }
        if let (Some((id, start_us)), Some((req, _))) = (p.history, &p.txn) {
            let ops = wl.attempted_ops(req);
            record(&m, &shared, HistLine { id, status: "aborted".into(), ops, start_us, end_us: w.history_now_us() });
        }
        m.borrow_mut().abort(now_ns, crate::txn::Abort::RolledBack);
    })
}

/// How often an after-run transaction (final read, final checks) is tried before giving up;
/// with backoff of up to 5 ms, that is about 15 seconds.
const FINAL_ATTEMPTS: u32 = 6000;

/// Randomized exponential backoff: up to 20 µs × 2^attempt, capped at 5 ms.
async fn backoff(w: &Rc<Worker>, attempt: u32) {
    let cap = (20u64 << attempt.min(8)).min(5_000);
    let us = w.rng.borrow_mut().gen_range(0..=cap);
    if us > 0 {
        w.sleep_us(us).await;
    }
}

/// An attempt's final history line, kept in memory and in the run's history file.
fn record(m: &RefCell<Metrics>, shared: &RunShared, line: HistLine) {
    persist(shared, &line);
    m.borrow_mut().record_history(line);
}

/// How many final check transactions run at once. A check commits in a round trip or a few,
/// and with replicated logs each read-only participant waits for a read fence (a Raft round
/// with its fsyncs); TPC-C's check is thousands of small transactions, so one at a time took
/// minutes on a loaded machine where a window of them shares each round.
const CHECKS_IN_FLIGHT: usize = 16;

/// Run the workload's final checks on this worker, each until it commits, and gather what
/// they found (TPC-C consistency conditions, the bank's final audit). The first runs alone
/// (TPC-C's header, whose hints let the chunks past the end skip their reads), then up to
/// [`CHECKS_IN_FLIGHT`] at once; their outputs go to `check_output` in the requests' order.
pub fn final_checks(w: &Rc<Worker>, proto: Rc<dyn WorkerProtocol>, wl: Arc<dyn Workload>, shared: Arc<RunShared>) {
    let w2 = w.clone();
    w.spawn(async move {
        let reqs: Rc<Vec<TxnRequest>> = Rc::new(wl.final_checks());
        let outputs: Rc<RefCell<Vec<Option<TxnOutput>>>> =
            Rc::new(RefCell::new((0..reqs.len()).map(|_| None).collect()));
        let next = Rc::new(std::cell::Cell::new(0usize));
        // A lane runs the next request not yet taken, until the first `until` are taken.
        let lane = |until: usize| {
            let (w, proto, reqs, outputs, next) =
                (w2.clone(), proto.clone(), reqs.clone(), outputs.clone(), next.clone());
            async move {
                while next.get() < until {
                    let i = next.get();
                    next.set(i + 1);
                    let out = run_check(&w, &*proto, &reqs[i]).await;
                    outputs.borrow_mut()[i] = out;
                }
            }
        };
        lane(reqs.len().min(1)).await;
        crate::rt::join_all((0..CHECKS_IN_FLIGHT).map(|_| lane(reqs.len())).collect()).await;
        let mut findings = Vec::new();
        for (req, out) in reqs.iter().zip(outputs.borrow_mut().drain(..)) {
            match out {
                Some(out) => findings.extend(wl.check_output(req, &out)),
                None => findings.push((
                    format!("{} (check transaction)", req.proc),
                    false,
                    format!("aborted {FINAL_ATTEMPTS} times"),
                )),
            }
        }
        *shared.checks.lock() = Some(findings);
    });
}

/// One final check transaction, tried until it commits (at most [`FINAL_ATTEMPTS`] times).
async fn run_check(w: &Rc<Worker>, proto: &dyn WorkerProtocol, req: &TxnRequest) -> Option<TxnOutput> {
    let first = w.now_us();
    for number in 0..FINAL_ATTEMPTS {
        match proto.execute(req, Attempt { first_start_us: first, number, fresh: true, defer_ack: false }).await {
            Ok(out) => return Some(out),
            Err(_) => backoff(w, number.min(9)).await,
        }
    }
    None
}

/// History ids are unique across processes: the node id in the high bits.
fn history_id(m: &RefCell<Metrics>, shared: &RunShared) -> u64 {
    ((m.borrow().node as u64) << 40) | shared.history_ids.fetch_add(1, Ordering::Relaxed)
}

/// A job run on one worker after the clients finished ([`final_read`], [`final_checks`]); it
/// reports into `shared`.
pub type AfterRun = fn(&Rc<Worker>, Rc<dyn WorkerProtocol>, Arc<dyn Workload>, Arc<RunShared>);

/// A command that runs an after-run job on the worker of the thread that executes it.
pub fn after_run_command(job: AfterRun, wl: Arc<dyn Workload>, shared: Arc<RunShared>) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        super::THREAD_WORKER.with(|t| {
            if let Some((w, p)) = t.borrow().as_ref() {
                job(w, p.clone(), wl, shared);
            }
        });
    })
}

/// Run this worker's replay-only measurement (Rolis's Fig. 15), if its protocol has one, and
/// report it (or that it has none) into `shared.replays`.
pub fn replay_only(w: &Rc<Worker>, proto: Rc<dyn WorkerProtocol>, _wl: Arc<dyn Workload>, shared: Arc<RunShared>) {
    let Some(run) = proto.replay_only() else {
        shared.replays.lock().push(None);
        return;
    };
    w.spawn(async move {
        let r = run.await;
        shared.replays.lock().push(Some(r));
    });
}

/// Poll (every 5 ms) until `done` holds or `limit` passes; the real-time runtimes' orchestrators
/// wait for their workers this way.
pub fn wait_until(limit: std::time::Duration, done: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() && t0.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Run the workload's final read-all transaction on this worker until it commits.
pub fn final_read(w: &Rc<Worker>, proto: Rc<dyn WorkerProtocol>, wl: Arc<dyn Workload>, shared: Arc<RunShared>) {
    let w2 = w.clone();
    w.spawn(async move {
        let Some(req) = wl.final_read() else {
            *shared.final_read.lock() = Some(Err("workload has no final read".into()));
            return;
        };
        let first = w2.now_us();
        // Patient: after a crash, records of in-doubt transactions stay locked until their
        // coordinators answer (the orphan sweeper's period), which can take a second or two.
        for number in 0..FINAL_ATTEMPTS {
            let start = w2.history_now_us();
            match proto.execute(&req, Attempt { first_start_us: first, number, fresh: true, defer_ack: false }).await {
                Ok(out) => {
                    let id = ((w2.addr.node as u64) << 40) | shared.history_ids.fetch_add(1, Ordering::Relaxed);
                    let line = HistLine {
                        id,
                        status: "committed".into(),
                        ops: out.history,
                        start_us: start,
                        end_us: w2.history_now_us(),
                    };
                    *shared.final_read.lock() = Some(Ok(line));
                    return;
                }
                Err(_) => backoff(&w2, number.min(9)).await,
            }
        }
        *shared.final_read.lock() = Some(Err(format!("the final read-all transaction aborted {FINAL_ATTEMPTS} times")));
    });
}
