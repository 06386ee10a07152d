//! What one `dtx server` process hosts during a run: the nodes it serves (its own, and in a
//! replicated run any node it took over) and, in a replicated run, its replicas of the nodes'
//! logs on a thread of their own.
//!
//! Failover (`--durability replicated`, [`service::Mode::Failover`]): the replication thread runs this
//! host's replicas of every log it is a voter of. When a node's server dies, the followers of its
//! log elect a new leader; once that leader's log is settled (see `replication::service`), its
//! host rebuilds the node from the state its replica applied, binds the node's worker ports
//! (free again once the old process is gone) and serves it, clients included. A host that loses
//! the leadership of a log it served stops that node's threads at once ([`Deposed`]), which
//! frees the ports for the new leader's host: a process whose node was taken over while it
//! still ran (a spurious election) gives the node up instead of serving two incarnations.
//!
//! Where a moved node listens: on one machine it binds the node's own ports, so its peers reach it
//! where they always did. On another machine the node's IP is not local: the new host binds its
//! own IP on ports the system picks and announces the node's new addresses to every other host
//! ([`RouteAnnouncement`], over the replication threads, repeated every half second while the
//! run lasts); a host that hears it sends to the node there from then on (the announcement with
//! the highest Raft term wins).

use super::driver::{RunShared, Window};
use super::{attach_worker, start_clients, NodeSetup, Run, THREAD_WORKER};
use crate::cluster::ClusterConfig;
use crate::net::{Addr, NodeId};
use crate::replication::service::{self, AdoptRequests, Deposed, ReplicatorHandle};
use crate::rt::log::NodeLog;
use crate::rt::tcp::{TcpHandle, TcpNet};
use crate::rt::Worker;
use crate::workloads::Workload;
use anyhow::Context;
use parking_lot::Mutex;
use rand::Rng;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a server answers an after-run job once another server took over every node it served
/// (the bench then asks another server).
pub const SERVES_NO_NODE: &str = "this server serves no node now (it was taken over by another)";
/// A server that serves nodes, but none that runs clients, where an after-run job must run.
pub const SERVES_NO_CLIENT_NODE: &str = "this server serves no node that runs clients";

/// How long a host that takes a node over waits for the node's ports to be free (the old
/// process dying, or stopping the node's threads after it lost the node's log).
const PORT_PATIENCE: Duration = Duration::from_secs(10);

/// How often the replication thread looks for nodes to take over or give up.
const WATCH_EVERY_US: u64 = service::TICK_US;

/// One node served by this process: its protocol state and its worker threads.
struct HostedNode {
    id: NodeId,
    setup: Arc<NodeSetup>,
    handles: Vec<Arc<TcpHandle>>,
    threads: Vec<JoinHandle<()>>,
    /// Set before the threads are stopped when the node was lost (not at the end of a run):
    /// its clients then report their attempts in flight as of unknown outcome.
    lost: Arc<AtomicBool>,
}

impl HostedNode {
    fn stop(self) {
        for h in &self.handles {
            h.stop();
        }
        for t in self.threads {
            let _ = t.join();
        }
        self.setup.shutdown();
    }
}

/// A node this host took over, for the report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Takeover {
    pub node: NodeId,
    /// When its workers were serving again (milliseconds since the Unix epoch: comparable
    /// across the processes of one machine, where the bench saw the old server die).
    pub serving_unix_ms: u64,
    /// How long rebuilding it from the replica's state took.
    pub rebuild_ms: u64,
}

/// Where node `node`'s workers listen since a host took it over in Raft term `term`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RouteAnnouncement {
    pub node: NodeId,
    pub term: u64,
    pub workers: Vec<SocketAddr>,
}

/// Nodes that moved away from their configured address: node -> (term, worker addresses).
type Routes = Arc<parking_lot::RwLock<rustc_hash::FxHashMap<NodeId, (u64, Vec<SocketAddr>)>>>;

/// Every how many watches a host announces the routes of the nodes it moved again (the first
/// announcement may meet a cut link or a peer not yet listening).
const REANNOUNCE_EVERY_WATCHES: u64 = 50;

/// A run as one server process hosts it.
pub struct Hosting {
    pub run: Arc<Run>,
    pub host: NodeId,
    cfg: Arc<ClusterConfig>,
    workload: Arc<dyn Workload>,
    pub shared: Arc<RunShared>,
    pub epoch: Instant,
    window: Mutex<Option<Window>>,
    nodes: Mutex<Vec<HostedNode>>,
    replication: Mutex<Option<(Arc<TcpHandle>, JoinHandle<()>)>>,
    takeovers: Mutex<Vec<Takeover>>,
    /// A file every takeover is appended to, so that the takeovers of a process killed later
    /// are still reported (the run's folder, under `--data-dir`).
    takeover_file: Mutex<Option<PathBuf>>,
    routes: Routes,
    /// The routes this host announces (nodes it took over onto addresses of its own).
    announced: Mutex<Vec<RouteAnnouncement>>,
    stopped: AtomicBool,
    /// What each worker thread that panicked said (its node's clients will not finish).
    panics: Arc<Mutex<Vec<String>>>,
}

thread_local! {
    /// The replicator on this process's replication thread (commands reach it through this).
    static THREAD_REPLICATOR: std::cell::RefCell<Option<ReplicatorHandle>> = const { std::cell::RefCell::new(None) };
}

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Hosting {
    pub fn new(
        run: Arc<Run>,
        host: NodeId,
        cfg: ClusterConfig,
        workload: Arc<dyn Workload>,
        shared: RunShared,
    ) -> Arc<Hosting> {
        Arc::new(Hosting {
            run,
            host,
            cfg: Arc::new(cfg),
            workload,
            shared: Arc::new(shared),
            epoch: Instant::now(),
            window: Mutex::new(None),
            nodes: Mutex::new(Vec::new()),
            replication: Mutex::new(None),
            takeovers: Mutex::new(Vec::new()),
            takeover_file: Mutex::new(None),
            routes: Default::default(),
            announced: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            panics: Default::default(),
        })
    }

    fn peers(&self) -> Arc<dyn Fn(Addr) -> SocketAddr + Send + Sync> {
        let (cfg, routes) = (self.cfg.clone(), self.routes.clone());
        Arc::new(move |a: Addr| {
            let moved = routes.read().get(&a.node).and_then(|(_, w)| w.get(a.worker as usize).copied());
            moved.unwrap_or_else(|| cfg.worker_addr(a.node, a.worker))
        })
    }

    /// A route another host announced: newer terms replace older ones.
    fn learn_route(&self, r: RouteAnnouncement) {
        let mut routes = self.routes.write();
        let newer = routes.get(&r.node).is_none_or(|(term, _)| *term < r.term);
        if newer {
            eprintln!(
                "dtx server: host {}: node {} now listens at {:?} (term {})",
                self.host, r.node, r.workers, r.term
            );
            routes.insert(r.node, (r.term, r.workers));
        }
    }

    /// Bind the worker ports of `addr`, waiting up to `patience` for them to be free. A node
    /// whose configured IP is not on this machine (taken over from another machine) listens on
    /// this host's IP, on a port the system picks.
    fn bind(&self, addr: Addr, patience: Duration) -> anyhow::Result<TcpNet> {
        let t0 = Instant::now();
        let mut listen = self.cfg.worker_addr(addr.node, addr.worker);
        loop {
            match TcpNet::bind(addr, listen, self.peers(), self.run.latency.clone()) {
                Ok(net) => return Ok(net),
                Err(e) if is_foreign_address(&e) && listen.port() != 0 => {
                    listen = SocketAddr::new(self.cfg.nodes[self.host as usize].addr.ip(), 0);
                }
                Err(e) if t0.elapsed() < patience && !self.stopped.load(Ordering::Acquire) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether every worker of the nodes configured on this host's IP (the servers of this machine,
    /// as far as the cluster file tells) can have a core of its own: then an idle worker polls
    /// before it sleeps ([`TcpNet::set_spin_poll`]); where they share cores it would take the core
    /// from the worker that is to answer.
    fn workers_have_own_cores(&self) -> bool {
        // Every loopback address is this machine (servers of one bench on 127.0.0.x each).
        let same_machine = |a: std::net::IpAddr, b: std::net::IpAddr| a == b || (a.is_loopback() && b.is_loopback());
        let ip = self.cfg.nodes[self.host as usize].addr.ip();
        let nodes_here = self.cfg.nodes.iter().filter(|n| same_machine(n.addr.ip(), ip)).count();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        nodes_here * self.cfg.workers as usize <= cores
    }

    /// Serve node `id` from `setup` on fresh worker threads (its ports bound first, waiting up
    /// to `patience`); start their clients if the run's window is set. Returns where its
    /// workers listen.
    pub fn serve_node(&self, id: NodeId, setup: NodeSetup, patience: Duration) -> anyhow::Result<Vec<SocketAddr>> {
        let setup = Arc::new(setup);
        let mut nets: Vec<TcpNet> =
            (0..self.cfg.workers).map(|wi| self.bind(Addr::new(id, wi), patience)).collect::<anyhow::Result<_>>()?;
        if self.workers_have_own_cores() {
            nets.iter_mut().for_each(|n| n.set_spin_poll(crate::rt::tcp::SPIN_POLL));
        }
        let listening = nets.iter().map(|n| n.local_addr()).collect::<std::io::Result<Vec<_>>>()?;
        let lost = Arc::new(AtomicBool::new(false));
        let mut node = HostedNode { id, setup: setup.clone(), handles: Vec::new(), threads: Vec::new(), lost };
        for (wi, net) in nets.into_iter().enumerate() {
            node.handles.push(net.handle());
            let (setup, lost, epoch, spec) = (setup.clone(), node.lost.clone(), self.epoch, self.run.clone());
            let (panics, host) = (self.panics.clone(), self.host);
            let thread = std::thread::Builder::new().name(format!("n{id}w{wi}@{}", self.host)).spawn(move || {
                if let Err(e) = crate::util::lower_this_threads_priority(crate::util::WORKER_NICE) {
                    crate::rt::log_warn(&format!("a worker runs at normal priority (setpriority: {e})"));
                }
                let w = net.make_worker(epoch, spec.workers, &spec.worker_config());
                // Serve peers from the moment the port is open: a peer may start first.
                let proto = attach_worker(&setup, &w);
                THREAD_WORKER.with(|t| *t.borrow_mut() = Some((w.clone(), proto)));
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| net.run(&w)));
                if let Err(payload) = ran {
                    // Its clients and the transactions it served stop here: say so to the
                    // run's waits instead of leaving them waiting for clients that never end.
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_string());
                    panics.lock().push(format!("node {id}'s worker {wi} on host {host} panicked: {what}"));
                }
                if lost.load(Ordering::Acquire) {
                    w.crash();
                }
                THREAD_WORKER.with(|t| t.borrow_mut().take());
            });
            node.threads.push(thread.context("cannot start a worker thread")?);
        }
        let mut nodes = self.nodes.lock();
        if self.stopped.load(Ordering::Acquire) {
            // The run ended while the node was being built: it must not outlive the run.
            drop(nodes);
            node.stop();
            anyhow::bail!("the run ended");
        }
        if let Some(window) = *self.window.lock() {
            self.start_node_clients(&node, window);
        }
        nodes.push(node);
        Ok(listening)
    }

    /// Start the clients of every node served now, measuring over `window`.
    pub fn start_clients(&self, window: Window) {
        let nodes = self.nodes.lock();
        *self.window.lock() = Some(window);
        for n in nodes.iter() {
            self.start_node_clients(n, window);
        }
    }

    fn start_node_clients(&self, n: &HostedNode, window: Window) {
        for h in &n.handles {
            let (spec, node, shared) = (self.run.clone(), n.setup.clone(), self.shared.clone());
            // Counted where the clients start: a node given up before its worker ran this
            // command never starts them, and must not leave the run waiting for them.
            h.push_command(Box::new(move || {
                THREAD_WORKER.with(|t| {
                    if let Some((w, proto)) = t.borrow().as_ref() {
                        shared.running.fetch_add(1, Ordering::AcqRel);
                        start_clients(&spec, &node, w, proto, window, &shared);
                    }
                });
            }));
        }
    }

    /// Run `cmd` on worker 0 of a node this process serves that runs clients (after-run jobs),
    /// and say where (see [`Hosting::still_runs`]); fails with [`SERVES_NO_CLIENT_NODE`] when
    /// it serves no such node (its nodes all taken over, or none of them runs clients).
    pub fn on_a_worker0(&self, cmd: crate::rt::local::Command) -> anyhow::Result<(NodeId, Arc<TcpHandle>)> {
        let topo = &self.run.topo;
        let nodes = self.nodes.lock();
        // The after-run jobs are transactions: they run where the protocol runs clients.
        let n = nodes.iter().find(|n| topo.runs_clients(n.id)).context(SERVES_NO_CLIENT_NODE)?;
        n.handles[0].push_command(cmd);
        Ok((n.id, n.handles[0].clone()))
    }

    /// Whether `worker` (of a node this process served) still runs: false once its node was
    /// given up, even if this process took the node over again since (on new workers).
    pub fn still_runs(&self, worker: &Arc<TcpHandle>) -> bool {
        self.nodes.lock().iter().any(|n| n.handles.iter().any(|h| Arc::ptr_eq(h, worker)))
    }

    /// The workload instance of this process.
    pub fn workload(&self) -> &Arc<dyn Workload> {
        &self.workload
    }

    /// The first worker thread of this process that panicked, if any, as an error.
    pub fn check_workers(&self) -> anyhow::Result<()> {
        match self.panics.lock().first() {
            Some(p) => anyhow::bail!("{p}"),
            None => Ok(()),
        }
    }

    /// Whether this process serves a node now.
    pub fn serves_a_node(&self) -> bool {
        !self.nodes.lock().is_empty()
    }

    pub fn takeovers(&self) -> Vec<Takeover> {
        self.takeovers.lock().clone()
    }

    /// What this process's log replicas did (snapshots, journal rewrites and replays), as the
    /// report's counters; empty without replication, or if the replication thread does not
    /// answer within a second. A killed earlier process's counts died with it.
    pub fn replica_counters(&self) -> Vec<(&'static str, u64)> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.push_to_replicator(Box::new(move |r| {
            let r = r.borrow();
            let _ = tx.send((r.stats(), r.machine_counters()));
        }));
        let (stats, machines) = rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap_or_default();
        stats.counters().into_iter().chain(machines).filter(|c| c.1 > 0).collect()
    }

    /// Where this process's replicas have applied their logs to, and where the nodes it serves
    /// release results (µs on the protocols' clocks, [`crate::protocols::NodeProtocol::released_watermark_us`]):
    /// the run's replay lag is how far the lowest trails the highest over every server.
    pub fn replay_points_us(&self) -> Vec<u64> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.push_to_replicator(Box::new(move |r| {
            let _ = tx.send(r.borrow().applied_watermarks_us());
        }));
        let mut points = rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap_or_default();
        points.extend(self.nodes.lock().iter().filter_map(|n| n.setup.proto.released_watermark_us()));
        points
    }

    /// Append every takeover to `path` as well (one JSON line each).
    pub fn record_takeovers_in(&self, path: PathBuf) {
        *self.takeover_file.lock() = Some(path);
    }

    fn record_takeover(&self, t: Takeover) {
        if let Some(path) = self.takeover_file.lock().as_ref() {
            let line = serde_json::to_string(&t).unwrap_or_default() + "\n";
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(e) = written {
                crate::rt::log_warn(&format!("cannot record a takeover in {}: {e}", path.display()));
            }
        }
        self.takeovers.lock().push(t);
    }

    /// End the run: stop every node's threads and the replication thread.
    pub fn stop(&self) {
        let nodes = {
            let mut nodes = self.nodes.lock();
            self.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *nodes)
        };
        for n in nodes {
            n.stop();
        }
        let replication = self.replication.lock().take();
        if let Some((h, t)) = replication {
            h.stop();
            let _ = t.join();
        }
    }

    /// Start this host's replicas of the logs it is a voter of, on their own thread (port
    /// `worker_addr(host, workers)`), journaled to `journal` (a file in the run's folder):
    /// fresh, proposing `own_logs`' records to its own node's logs, or (`own_logs` empty, after
    /// a restart) reopened from the journal, rejoining every group as a follower. Returns once
    /// the replicas run, or why they could not start.
    pub fn start_replication(self: &Arc<Self>, own_logs: Vec<Arc<NodeLog>>, journal: PathBuf) -> anyhow::Result<()> {
        let addr = Addr::new(self.host, self.cfg.workers);
        let net = self.bind(addr, PORT_PATIENCE)?;
        let handle = net.handle();
        let me = Arc::downgrade(self);
        let (epoch, spec, host, workload) = (self.epoch, self.run.clone(), self.host, self.workload.clone());
        let (started_tx, started_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new().name(format!("replication@{host}")).spawn(move || {
            let w = net.make_worker(epoch, spec.workers, &spec.worker_config());
            let seed = w.rng.borrow_mut().gen::<u64>();
            let (adopt, deposed) = (AdoptRequests::default(), Deposed::default());
            let rejoin = own_logs.is_empty();
            let started = open_replicas(&spec, host, seed, &journal, rejoin, &workload).and_then(|state| {
                let lanes = std::slice::from_ref(&w);
                Ok(service::start(lanes, Rc::new(std::cell::RefCell::new(state)), own_logs, Some(adopt.clone()))?)
            });
            let _ = started_tx.send(started.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")));
            match started {
                Ok(r) => {
                    r.borrow_mut().report_deposed(deposed.clone());
                    THREAD_REPLICATOR.with(|t| *t.borrow_mut() = Some(r.clone()));
                    let hosting = me.clone();
                    r.borrow_mut().set_route_handler(Rc::new(move |payload: &[u8]| {
                        match (hosting.upgrade(), crate::net::decode::<RouteAnnouncement>(payload)) {
                            (Some(h), Ok(route)) => h.learn_route(route),
                            (_, Err(e)) => crate::rt::log_warn(&format!("host {host}: a bad route announcement: {e}")),
                            _ => {}
                        }
                    }));
                    w.spawn(watch_leadership(w.clone(), r, adopt, deposed, me));
                }
                Err(_) => return,
            }
            net.run(&w);
            THREAD_REPLICATOR.with(|t| t.borrow_mut().take());
        });
        let thread = thread.context("cannot start the replication thread")?;
        match started_rx.recv() {
            Ok(Ok(())) => {
                *self.replication.lock() = Some((handle, thread));
                Ok(())
            }
            Ok(Err(e)) => {
                let _ = thread.join();
                anyhow::bail!("host {}: the log replicas did not start: {e}", self.host)
            }
            Err(_) => anyhow::bail!("host {}: the replication thread died while starting", self.host),
        }
    }

    /// Where a node this host took over listens (another machine's IP, or its own configured
    /// address): use that route here and announce it to every other host at the takeover's
    /// term. Announced even at the configured address: a host that takes its own node back
    /// after an earlier takeover moved it must replace the others' route to the address that
    /// died (a CI run's final read waited 60 s on node 0 for want of it).
    fn announce_address(&self, id: NodeId, term: u64, listening: Vec<SocketAddr>) {
        let configured: Vec<SocketAddr> = (0..self.cfg.workers).map(|wi| self.cfg.worker_addr(id, wi)).collect();
        let route = RouteAnnouncement { node: id, term, workers: listening };
        self.routes.write().insert(id, (term, route.workers.clone()));
        match route.workers == configured {
            true => eprintln!("dtx server: host {}: node {id} listens at its own address (term {term})", self.host),
            false => eprintln!(
                "dtx server: host {}: node {id} listens at {:?} now (its address is another machine's)",
                self.host, route.workers
            ),
        }
        let (payload, nodes) = (crate::net::encode(&route), self.run.nodes);
        {
            let mut announced = self.announced.lock();
            announced.retain(|r| r.node != id);
            announced.push(route);
        }
        self.push_to_replicator(Box::new(move |r| r.borrow().announce_route(&payload, nodes)));
    }

    /// The term this host's replica leads `node`'s log in, asked on the replication thread
    /// (None: it does not lead it, has no replicas, or did not answer within `limit`).
    pub fn leading_term_of(&self, node: NodeId, limit: Duration) -> Option<u64> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.push_to_replicator(Box::new(move |r| {
            let _ = tx.send(r.borrow().leading_term_of(node));
        }));
        rx.recv_timeout(limit).ok().flatten()
    }

    /// Run `f` with the replicator, on the replication thread.
    fn push_to_replicator(&self, f: Box<dyn FnOnce(&ReplicatorHandle) + Send>) {
        if let Some((handle, _)) = self.replication.lock().as_ref() {
            handle.push_command(Box::new(move || {
                THREAD_REPLICATOR.with(|r| {
                    if let Some(r) = r.borrow().as_ref() {
                        f(r);
                    }
                })
            }));
        }
    }

    /// This host lost node `id`'s log: stop its incarnation here (its clients report what they
    /// had in flight as of unknown outcome), which frees its ports for the new leader's host.
    /// Taken off the list at once, so that a takeover started after this serves a new entry.
    fn give_up(&self, id: NodeId) {
        let gone: Vec<HostedNode> = {
            let mut nodes = self.nodes.lock();
            let (gone, kept) = std::mem::take(&mut *nodes).into_iter().partition(|n| n.id == id);
            *nodes = kept;
            gone
        };
        for n in gone {
            eprintln!("dtx server: host {}: gave node {id} up (another replica leads its log now)", self.host);
            n.lost.store(true, Ordering::Release);
            std::thread::spawn(move || n.stop());
        }
    }

    /// Take node `id` over from `state` (what this host's replica of its log applied): rebuild
    /// it, serve it, and tell the replicator to propose its records. Runs on its own thread
    /// (binding may wait for the old incarnation's ports).
    fn take_over(&self, id: NodeId, adoption: service::Adoption) {
        let t0 = Instant::now();
        let service::Adoption { snapshots, terms } = adoption;
        let term = terms[0];
        let served = super::adopt_node(&self.run, id, &self.workload, snapshots)
            .and_then(|(setup, log)| Ok((self.serve_node(id, setup, PORT_PATIENCE)?, log)))
            .map_err(|e| format!("{e:#}"));
        match served {
            Ok((listening, logs)) => {
                self.announce_address(id, term, listening);
                let t = Takeover { node: id, serving_unix_ms: unix_ms(), rebuild_ms: t0.elapsed().as_millis() as u64 };
                eprintln!(
                    "dtx server: host {}: took node {id} over (this host leads its log now): serving it after {} ms",
                    self.host, t.rebuild_ms
                );
                self.record_takeover(t);
                self.push_to_replicator(Box::new(move |r| {
                    r.borrow_mut().serve(id, logs, &terms);
                }));
            }
            Err(e) => {
                crate::rt::log_warn(&format!("host {}: cannot take node {id} over: {e}", self.host));
                self.push_to_replicator(Box::new(move |r| r.borrow_mut().adoption_refused(id)));
            }
        }
    }
}

/// How long a server's replicas of other servers' logs leave a log's first election to its
/// owner (`ReplicaSetup::first_election_grace_us`): ten of the owner's campaigns, one every
/// 100 ms until its log has a leader, whatever the election timeout.
const FIRST_ELECTION_GRACE_US: u64 = 1_000_000;

/// This host's replicas: fresh over a new journal at `path`, or (`rejoin`) reopened from it.
fn open_replicas(
    run: &Run,
    host: NodeId,
    seed: u64,
    path: &std::path::Path,
    rejoin: bool,
    workload: &Arc<dyn Workload>,
) -> anyhow::Result<service::ReplicaState> {
    use crate::replication::journal::Journal;
    let mut setup = super::failover_replica_setup(run, host, seed, workload)?;
    setup.first_election_grace_us = FIRST_ELECTION_GRACE_US;
    setup.apply_on_thread = true;
    let cluster_id = setup.cluster_id;
    if !rejoin {
        return Ok(service::ReplicaState::new(setup, Some(Journal::create_file(path, cluster_id, host)?))?);
    }
    let started = std::time::Instant::now();
    let (journal, ops) = Journal::open_file(path, cluster_id, host)?;
    let (count, read_ms, mb) = (ops.len(), started.elapsed().as_millis(), journal.len_bytes() as f64 / 1e6);
    let state = service::ReplicaState::reopen(setup, journal, ops)?;
    eprintln!(
        "dtx server: host {host}: its log replicas reopened from {} ({count} journal records, {mb:.1} MB, read in \
         {read_ms} ms, replayed in {} ms)",
        path.display(),
        started.elapsed().as_millis() - read_ms
    );
    Ok(state)
}

/// Whether binding failed because the address is not on this machine.
fn is_foreign_address(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::AddrNotAvailable)
}

/// The replication thread's watch: give up the nodes whose log this host lost, and take over
/// the ones whose log it now leads with a settled log.
async fn watch_leadership(
    w: Rc<Worker>,
    r: ReplicatorHandle,
    adopt: AdoptRequests,
    deposed: Deposed,
    hosting: Weak<Hosting>,
) {
    for watch in 1u64.. {
        w.sleep_us(WATCH_EVERY_US).await;
        let Some(hosting) = hosting.upgrade() else { return };
        if hosting.stopped.load(Ordering::Acquire) {
            return;
        }
        if watch % REANNOUNCE_EVERY_WATCHES == 0 {
            announce_routes(&r, &hosting);
        }
        let lost: Vec<NodeId> = std::mem::take(&mut *deposed.borrow_mut());
        for id in lost {
            hosting.give_up(id);
        }
        let requests: Vec<(NodeId, NodeId)> = std::mem::take(&mut *adopt.borrow_mut());
        for (id, _host) in requests {
            let state = r.borrow_mut().adoptable_state(id);
            match state {
                Some(adoption) => {
                    let h = hosting.clone();
                    std::thread::spawn(move || h.take_over(id, adoption));
                }
                None => r.borrow_mut().adoption_refused(id),
            }
        }
    }
}

/// Announce every route this host's hosting announces (on the replication thread).
fn announce_routes(r: &ReplicatorHandle, hosting: &Hosting) {
    let routes = hosting.announced.lock().clone();
    for route in routes {
        r.borrow().announce_route(&crate::net::encode(&route), hosting.run.nodes);
    }
}
