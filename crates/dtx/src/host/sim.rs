//! The simulator's runtime: every node of the cluster on one thread in virtual time, crashes
//! that lose memory rebuilt from the node's disk, and failover of replicated nodes.

use super::*;

/// Run in deterministic simulation: build the cluster, run the measured window, let what is in
/// flight finish, then the after-run jobs (the final read, the final checks).
pub fn run_sim(spec: &BenchSpec) -> anyhow::Result<Outcome> {
    run_sim_built(&Run::build(spec)?)
}

/// [`run_sim`] of a run already built.
pub fn run_sim_built(run: &Arc<Run>) -> anyhow::Result<Outcome> {
    let spec = &**run;
    let mut world = SimWorld::new(spec.nodes, spec.workers, spec.latency.clone(), spec.faults.clone(), spec.seed);
    world.set_lane_disks(spec.durability.sim_lane_disks);
    let shared = Arc::new(RunShared::default());
    let window = Window { start_ns: spec.warmup_us * 1000, end_ns: (spec.warmup_us + spec.duration_us) * 1000 };
    let protos: Protos = Default::default();
    let workload = build_workload(spec)?;
    let rebuild = SimRebuild::new(run, &workload, &shared, window, &protos);
    if spec.durability.mode == Durability::Wal && spec.faults.may_crash() {
        world.set_restart(sim_restart(rebuild.clone()), spec.worker_config());
    }
    let failover = (spec.durability.mode == Durability::Replicated).then(|| SimFailover::new(rebuild.clone()));
    if let Some(f) = &failover {
        // A lane, a virtual core of its own, per log of a node (Rolis's Paxos thread per stream).
        world.set_failover(Box::new(f.clone()), spec.worker_config(), spec.logs_per_node.max(1));
    }
    for n in 0..spec.nodes {
        build_sim_node(&mut world, spec, n, &workload, failover.as_ref(), &rebuild)?;
    }
    let used = run_window(&mut world, spec, window);
    let resident_mib = crate::util::resident_bytes().map(|b| b >> 20);
    // Taken as the window closes: once the clients stop, the drain lets every replica catch up.
    let replay_lag_us = failover.as_ref().and_then(|f| f.replay_lag_us());
    let mut notes = drain(&mut world, spec, &shared, window, failover.is_some());
    notes.extend(used.link_note(spec, window));
    let mut totals = Totals::default();
    let mut history = Vec::new();
    collect(&shared, &mut totals, &mut history);
    let mut final_read = None;
    // The final read and checks run on worker 0 of the first node that runs clients.
    let after_node = spec.topo.first_client_node();
    if spec.record_history {
        let done = || shared.final_read.lock().is_some();
        run_after(&mut world, &protos, spec, after_node, 120_000_000_000, &done, &|w, p, wl| {
            driver::final_read(w, p, wl, shared.clone())
        });
        final_read = shared.final_read.lock().take();
    }
    if spec.run_checks {
        let done = || shared.checks.lock().is_some();
        run_after(&mut world, &protos, spec, after_node, 600_000_000_000, &done, &|w, p, wl| {
            driver::final_checks(w, p, wl, shared.clone())
        });
        totals.findings = finish_checks(&shared, &*workload);
    }
    if spec.record_history || spec.run_checks {
        totals.findings.extend(copies_agree(&mut world, &protos, spec.workers));
    }
    totals.replay = replay_only(&mut world, &protos, spec, after_node, &shared);
    totals.findings.extend(replay_finding(totals.replay.as_ref()));
    // Simulated CPU: the work charged to all workers during the window.
    totals.cpu_us = used.cpu_ns / 1000;
    totals.cpu_by_kind_ns = used.cpu_by_kind.named().map(|(k, ns)| (k.to_string(), ns)).collect();
    totals.resident_mib = resident_mib;
    // Every message between hosts, replication's included (`bytes/txn` counts the protocol's).
    if used.wire_bytes > 0 {
        totals.counters.insert("wire-bytes".to_string(), used.wire_bytes);
    }
    totals.failovers = world.failovers;
    totals.failover_ms = world.failover_ns.iter().map(|ns| *ns as f64 / 1e6).collect();
    let orphans = shared.orphans_voided.load(Ordering::Relaxed);
    if orphans > 0 {
        totals.counters.insert("log-orphans-voided".to_string(), orphans);
    }
    let over_lanes = shared.recovered_over_lanes.load(Ordering::Relaxed);
    if over_lanes > 0 {
        totals.counters.insert("log-recoveries-over-lanes".to_string(), over_lanes);
    }
    let from_checkpoint = shared.recovered_from_checkpoint.load(Ordering::Relaxed);
    if from_checkpoint > 0 {
        totals.counters.insert("log-recoveries-from-checkpoint".to_string(), from_checkpoint);
    }
    if let Some(f) = &failover {
        for (name, n) in f.stats().counters().into_iter().chain(f.machine_counters()) {
            totals.counters.insert(name.to_string(), n);
        }
        totals.findings.push(f.replicas_agree());
        totals.replay_lag_us = replay_lag_us;
    }
    Ok(Outcome {
        totals,
        history,
        final_read,
        notes,
        restarts: world.restarts,
        moved: world.moved,
        fault_events: world.fault_events.iter().map(fault_event).collect(),
        failed: None,
    })
}

/// A fault the simulator injected, as the JSON's `fault_events` lists it (times in virtual ms;
/// `down_ms` 0 for one that lasted until the window's end, when every fault is healed; no
/// `served_again_ms`: a node the simulator brings back serves at once).
fn fault_event(e: &crate::rt::sim::SimFaultEvent) -> dtx_report::FaultEvent {
    dtx_report::FaultEvent {
        kind: e.kind.to_string(),
        node: e.node as u32,
        at_ms: e.at_ns as f64 / 1e6,
        down_ms: e.for_ns.unwrap_or(0) as f64 / 1e6,
        served_again_ms: None,
    }
}

/// Build node `n` with its log, start its workers and their clients, and (with failover) its
/// host's replicator on the host's replication workers (its lanes).
fn build_sim_node(
    world: &mut SimWorld,
    run: &Run,
    n: NodeId,
    workload: &Arc<dyn Workload>,
    failover: Option<&SimFailover>,
    rebuild: &SimRebuild,
) -> anyhow::Result<()> {
    let logs = match run.durability.mode {
        Durability::None => Vec::new(),
        Durability::Replicated => (0..run.logs_per_node).map(|_| fresh_log(NodeLog::replicated())).collect(),
        Durability::Wal => {
            let lanes = run.workers as usize;
            let logs: Vec<Arc<NodeLog>> = (0..run.logs_per_node)
                .map(|_| NodeLog::simulated(Default::default(), lanes).map(|r| r.log).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()?;
            world.set_logs(n, &logs, run.durability.group_commit_us, run.durability.sim_fsync_us);
            logs.into_iter().map(fresh_log).collect()
        }
    };
    let mut node = build_node(run, n, workload, logs)?;
    // With failover the replicator runs on the host's replication worker, not worker 0.
    let own_logs = node.replicated.take().map(|(logs, _)| logs).unwrap_or_default();
    let add_worker = |world: &mut SimWorld, addr: Addr| {
        let w = Rc::new(Worker::new(addr, run.workers, world.clock(), world.executor_for(addr), &run.worker_config()));
        world.add_worker(w.clone());
        w
    };
    for wi in 0..run.workers {
        let w = add_worker(world, Addr::new(n, wi));
        rebuild.shared.running.fetch_add(1, Ordering::AcqRel);
        let proto = start_worker(run, &node, &w, rebuild.window, &rebuild.shared);
        rebuild.protos.borrow_mut().push((proto, node.workload.clone()));
    }
    if let Some(f) = failover {
        let lanes: Vec<Rc<Worker>> = world.replication_addrs(n).into_iter().map(|a| add_worker(world, a)).collect();
        f.start_host(n, &lanes, own_logs)?;
    }
    Ok(())
}

/// What the measured window used of the simulated machines.
#[derive(Default)]
struct WindowUse {
    /// CPU charged to every worker.
    cpu_ns: u64,
    /// `cpu_ns` by what it paid for.
    cpu_by_kind: crate::rt::CpuSplit,
    /// Bytes sent from one host to another.
    wire_bytes: u64,
    /// Per host, how long its link was busy sending (with `--bandwidth`).
    link_busy_ns: Vec<u64>,
}

impl WindowUse {
    fn of(world: &SimWorld) -> Self {
        WindowUse {
            cpu_ns: world.busy_ns,
            cpu_by_kind: world.busy_by_kind,
            wire_bytes: world.wire_bytes,
            link_busy_ns: world.link_busy_ns.clone(),
        }
    }

    fn since(&self, start: &WindowUse) -> WindowUse {
        let link_busy_ns = self.link_busy_ns.iter().zip(&start.link_busy_ns).map(|(end, at)| end - at).collect();
        WindowUse {
            cpu_ns: self.cpu_ns - start.cpu_ns,
            cpu_by_kind: self.cpu_by_kind.since(&start.cpu_by_kind),
            wire_bytes: self.wire_bytes - start.wire_bytes,
            link_busy_ns,
        }
    }

    /// With `--bandwidth`: how busy the busiest host's link was over the window.
    fn link_note(&self, spec: &BenchSpec, window: Window) -> Option<String> {
        let mbps = spec.latency.egress_mbps;
        if mbps == 0 {
            return None;
        }
        let (host, busy_ns) = self.link_busy_ns.iter().enumerate().max_by_key(|(_, ns)| **ns)?;
        let window_ns = window.end_ns.saturating_sub(window.start_ns).max(1);
        let share = *busy_ns as f64 / window_ns as f64;
        Some(match share < 1.0 {
            true => format!("links at {mbps} Mbit/s: the busiest, host {host}'s, sent for {:.0}% of the window", 100.0 * share),
            // Time is counted as a packet is queued, so a backlog at the window's end counts.
            false => format!("links at {mbps} Mbit/s: host {host}'s sent without a pause and had more queued (the link bounds the run)"),
        })
    }
}

/// Run to the window's end with a progress bar; returns what the window used.
fn run_window(world: &mut SimWorld, spec: &BenchSpec, window: Window) -> WindowUse {
    let pb = progress(&format!("{} sim", spec.protocol), window.end_ns / 1_000_000);
    let mut at_start = None;
    while world.now_ns() < window.end_ns {
        // Stop exactly at the window's start once, to read what was used before it.
        let target = if at_start.is_none() { window.start_ns } else { window.end_ns };
        let step = (world.now_ns() + 10_000_000).min(target);
        world.run_until(step, || false);
        if at_start.is_none() && world.now_ns() >= window.start_ns {
            at_start = Some(WindowUse::of(world));
        }
        pb.set_position(world.now_ns() / 1_000_000);
    }
    pb.finish_and_clear();
    WindowUse::of(world).since(&at_start.unwrap_or_default())
}

/// Heal every fault and let in-flight transactions finish (bounded by the RPC timeout and
/// retries), and with failover wait until every node is served again; returns what to note.
fn drain(world: &mut SimWorld, spec: &BenchSpec, shared: &RunShared, window: Window, failover: bool) -> Vec<String> {
    world.heal_all();
    let drain_limit = window.end_ns + 120_000_000_000;
    let mut notes = Vec::new();
    if !world.run_until(drain_limit, || shared.running.load(Ordering::Acquire) == 0) {
        notes.push("some clients were still running 120 s (virtual) after the window closed".into());
    }
    if failover {
        // The final read and checks need every node served again: wait for the takeovers.
        let limit = world.now_ns() + 60_000_000_000;
        while !world.all_nodes_up() && world.now_ns() < limit {
            let step = world.now_ns() + 10_000_000;
            world.run_until(step, || false);
        }
        if !world.all_nodes_up() {
            notes.push("a node was still not served by any host 60 s (virtual) after the faults healed".into());
        }
    }
    if spec.faults.any() {
        notes.push(format!(
            "faults: {} of {} packets dropped (loss, partitions, stopped nodes); {} crashes lost a node's memory; {} \
             nodes were taken over by a replica of their log",
            world.packets_dropped,
            world.packets_dropped + world.packets_delivered,
            world.restarts,
            world.failovers
        ));
    }
    notes
}

/// A job started on a worker after the run, as `driver::final_read` is.
type AfterRunJob<'a> = dyn Fn(&Rc<Worker>, Rc<dyn WorkerProtocol>, Arc<dyn Workload>) + 'a;

/// Run an after-run job (the final read, the final checks) on worker 0 of node 0 until `done`
/// or `limit_ns` more of virtual time. With failover, node 0 may be taken over meanwhile (a
/// leadership change after the faults healed), which ends the job with its incarnation: it is
/// started again on the new one.
fn run_after(
    world: &mut SimWorld,
    protos: &Protos,
    spec: &BenchSpec,
    node: NodeId,
    limit_ns: u64,
    done: &dyn Fn() -> bool,
    job: &AfterRunJob<'_>,
) {
    let limit = world.now_ns() + limit_ns;
    let mut running_on: Option<Rc<Worker>> = None;
    while !done() && world.now_ns() < limit {
        let w0 = world.worker(Addr::new(node, 0)).clone();
        if !running_on.as_ref().is_some_and(|w| Rc::ptr_eq(w, &w0)) {
            let (p, wl) = protos.borrow()[node as usize * spec.workers as usize].clone();
            job(&w0, p, wl);
            running_on = Some(w0);
        }
        let step = (world.now_ns() + 10_000_000).min(limit);
        world.run_until(step, done);
    }
}

/// Run every worker of `node` through its protocol's replay-only measurement at once (Rolis's
/// Fig. 15), and merge what they report: None when the protocol measures none, or when node
/// `node` is not served by its first incarnation's workers any more (a failover).
fn replay_only(
    world: &mut SimWorld,
    protos: &Protos,
    spec: &BenchSpec,
    node: NodeId,
    shared: &Arc<RunShared>,
) -> Option<crate::protocols::ReplayRun> {
    let workers = spec.workers as usize;
    for wi in 0..spec.workers {
        let w = world.worker(Addr::new(node, wi)).clone();
        let (p, wl) = protos.borrow()[node as usize * workers + wi as usize].clone();
        driver::replay_only(&w, p, wl, shared.clone());
    }
    let limit = world.now_ns() + 600_000_000_000;
    world.run_until(limit, || shared.replays.lock().len() >= workers);
    let runs = std::mem::take(&mut *shared.replays.lock());
    crate::protocols::ReplayRun::merge(runs.into_iter().flatten())
}

/// With copies of a partition in several places (`--placement per-region`), whether every copy
/// ends holding the same rows: a finding, or none when no partition has two copies. The copies
/// are compared once they agree or, at the latest, 10 s (virtual) after the final read, so that
/// the last transactions' logs have reached every region, checking every 200 ms.
fn copies_agree(world: &mut SimWorld, protos: &Protos, workers: u16) -> Option<(String, bool, String)> {
    let what = "every copy of a partition ends holding the same rows".to_string();
    let limit = world.now_ns() + 10_000_000_000;
    loop {
        let digests: Vec<(NodeId, _)> = protos
            .borrow()
            .iter()
            .enumerate()
            .filter_map(|(i, (p, _))| p.copy_digests().map(|d| ((i / workers as usize) as NodeId, d)))
            .collect();
        let (compared, difference) = compare_copies(&digests);
        if compared == 0 {
            return None;
        }
        match difference {
            None => return Some((what, true, format!("{compared} copies compared with their partition's first"))),
            Some(d) if world.now_ns() >= limit => return Some((what, false, d)),
            Some(_) => {
                let step = world.now_ns() + 200_000_000;
                world.run_until(step, || false);
            }
        }
    }
}

/// How many copies were compared with their partition's first copy, and the first that differs.
fn compare_copies(
    digests: &[(NodeId, std::collections::BTreeMap<crate::cluster::PartitionId, crate::storage::RowsDigest>)],
) -> (usize, Option<String>) {
    let mut first = std::collections::BTreeMap::new();
    let (mut compared, mut difference) = (0, None);
    for (node, by_partition) in digests {
        for (p, d) in by_partition {
            match first.get(p) {
                None => {
                    first.insert(*p, (*node, *d));
                }
                Some((other, seen)) => {
                    compared += 1;
                    if seen != d && difference.is_none() {
                        difference = Some(format!(
                            "partition {p}: node {other} holds {} rows (digest {:016x}), node {node} {} rows ({:016x})",
                            seen.rows, seen.sum, d.rows, d.sum
                        ));
                    }
                }
            }
        }
    }
    (compared, difference)
}

/// Failover of replicated nodes in the simulator (see `rt::sim::Failover`): the hosts' replica
/// states (kept across crashes), their running replicators, and how a node is rebuilt from the
/// replica of its log that a new leader holds.
#[derive(Clone)]
struct SimFailover(Rc<std::cell::RefCell<FailoverState>>);

struct FailoverState {
    rebuild: SimRebuild,
    states: Vec<Rc<std::cell::RefCell<crate::replication::service::ReplicaState>>>,
    /// Per host, its Raft journal's disk: what survives the host's crash, and all its
    /// replicas reopen from.
    disks: Vec<crate::replication::journal::MemoryDisk>,
    /// Per host, how often it restarted (its replicas' election delays are drawn afresh).
    restarts: Vec<u64>,
    /// What the replicas of crashed incarnations did.
    stats_of_lost: crate::replication::service::ReplicaStats,
    replicators: Vec<Option<crate::replication::service::ReplicatorHandle>>,
    requests: crate::replication::service::AdoptRequests,
}

impl SimFailover {
    fn new(rebuild: SimRebuild) -> Self {
        SimFailover(Rc::new(std::cell::RefCell::new(FailoverState {
            rebuild,
            states: Vec::new(),
            disks: Vec::new(),
            restarts: Vec::new(),
            stats_of_lost: Default::default(),
            replicators: Vec::new(),
            requests: Default::default(),
        })))
    }

    /// What every host's replicas did over the run, crashed incarnations included.
    fn stats(&self) -> crate::replication::service::ReplicaStats {
        let me = self.0.borrow();
        let mut stats = me.stats_of_lost;
        for s in &me.states {
            stats.add(&s.borrow().stats);
        }
        stats
    }

    /// What the state machines of every host's replicas count, summed (a crashed host's
    /// machines are rebuilt from its journal, so its last incarnation counts what it applied).
    fn machine_counters(&self) -> Vec<(&'static str, u64)> {
        let mut sums: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for (name, n) in self.0.borrow().states.iter().flat_map(|s| s.borrow().machine_counters()) {
            *sums.entry(name).or_default() += n;
        }
        sums.into_iter().collect()
    }

    /// How far the slowest replica's applied watermark trails the furthest one's, over the
    /// replicas of every host that is up (a host down at the end trails by its downtime, which
    /// says nothing of replay; None: no machine keeps one).
    fn replay_lag_us(&self) -> Option<u64> {
        let me = self.0.borrow();
        let up = me.states.iter().zip(&me.replicators).filter(|(_, r)| r.is_some());
        let points: Vec<u64> = up.flat_map(|(s, _)| s.borrow().applied_watermarks_us()).collect();
        super::metrics::replay_lag_us(&points)
    }

    /// Whether every replica of every log holds the same committed entries, byte for byte,
    /// wherever two of them hold the same index (Raft's log matching, checked at the end of the
    /// run over every host's replicas, a crashed host's last incarnation included): a finding.
    fn replicas_agree(&self) -> (String, bool, String) {
        use std::collections::BTreeMap;
        let me = self.0.borrow();
        let mut first_seen: BTreeMap<(u32, u64), (usize, crate::replication::journal::JournalEntry)> = BTreeMap::new();
        let (mut compared, mut differ) = (0u64, Vec::new());
        for (host, state) in me.states.iter().enumerate() {
            for (group, entries) in state.borrow().committed_logs() {
                for e in entries {
                    match first_seen.get(&(group, e.index)) {
                        None => {
                            first_seen.insert((group, e.index), (host, e));
                        }
                        Some((other, seen)) => {
                            compared += 1;
                            if *seen != e && differ.len() < 3 {
                                differ.push(format!(
                                    "log {group} index {}: host {other} holds term {} ({} bytes), host {host} term {} ({} bytes)",
                                    e.index,
                                    seen.term,
                                    seen.data.len(),
                                    e.term,
                                    e.data.len()
                                ));
                            }
                        }
                    }
                }
            }
        }
        let what = "every replica of a log holds the same committed entries".to_string();
        match differ.is_empty() {
            // None compared: every replica compacted what it committed (nothing left to differ in).
            true => (what, true, format!("{compared} committed entries compared with another replica's")),
            false => (what, false, differ.join("; ")),
        }
    }

    /// Create host `n`'s replicas and start its replicator on `lanes`, serving its own node.
    fn start_host(&self, n: NodeId, lanes: &[Rc<Worker>], own_logs: Vec<Arc<NodeLog>>) -> anyhow::Result<()> {
        use crate::replication::{journal, service};
        let mut me = self.0.borrow_mut();
        let setup = me.replica_setup(n)?;
        let disk = journal::MemoryDisk::default();
        let journal = journal::Journal::create_memory(disk.clone(), setup.cluster_id, n);
        let state = service::ReplicaState::new(setup, Some(journal))?;
        let state = Rc::new(std::cell::RefCell::new(state));
        me.states.push(state.clone());
        me.disks.push(disk);
        me.restarts.push(0);
        let r = service::start(lanes, state, own_logs, Some(me.requests.clone()))?;
        me.replicators.push(Some(r));
        Ok(())
    }
}

impl crate::rt::sim::Failover for SimFailover {
    fn host_crashed(&mut self, host: u16) {
        if let Some(r) = self.0.borrow_mut().replicators[host as usize].take() {
            r.borrow_mut().stop();
        }
    }

    /// The host's replicas lost their memory: they reopen from the journal on its disk.
    fn host_restarted(&mut self, host: u16, lanes: &[Rc<Worker>]) {
        let mut me = self.0.borrow_mut();
        let state = match me.reopen_host(host) {
            Ok(state) => state,
            Err(e) => panic!("host {host}: its replicas do not reopen from their journal: {e:#}"),
        };
        let lost = me.states[host as usize].borrow().stats;
        me.stats_of_lost.add(&lost);
        me.states[host as usize] = state.clone();
        match crate::replication::service::start(lanes, state, Vec::new(), Some(me.requests.clone())) {
            Ok(r) => me.replicators[host as usize] = Some(r),
            Err(e) => crate::rt::log_warn(&format!("host {host}: the log replicator did not restart: {e}")),
        }
    }

    fn take_requests(&mut self) -> Vec<(u16, u16)> {
        let q = self.0.borrow().requests.clone();
        let taken = std::mem::take(&mut *q.borrow_mut());
        taken
    }

    fn adopt(&mut self, node: u16, host: u16, workers: &[Rc<Worker>]) -> bool {
        let me = self.0.borrow();
        let Some(r) = me.replicators[host as usize].clone() else { return false };
        let Some(adoption) = r.borrow_mut().adoptable_state(node) else {
            r.borrow_mut().adoption_refused(node);
            return false;
        };
        let (setup, logs) = adopt_node(&me.rebuild.run, node, &me.rebuild.workload, adoption.snapshots)
            .expect("a node that built once builds again from its log's replica");
        me.rebuild.start(node, setup, workers);
        for (other, r2) in me.replicators.iter().enumerate() {
            if let (Some(r2), false) = (r2, other == host as usize) {
                r2.borrow_mut().forget(node);
            }
        }
        // The rebuild took no simulated time: the replica still leads in that term.
        let served = r.borrow_mut().serve(node, logs, &adoption.terms);
        assert!(served, "host {host} lost node {node}'s log while adopting it in one step");
        true
    }

    fn leader_of(&self, node: u16) -> Option<u16> {
        let me = self.0.borrow();
        let leaders = me.replicators.iter().enumerate().filter_map(|(host, r)| {
            let term = r.as_ref()?.borrow().leading_term_of(node)?;
            Some((term, host as u16))
        });
        leaders.max().map(|(_, host)| host)
    }
}

impl FailoverState {
    fn replica_setup(&self, host: NodeId) -> anyhow::Result<crate::replication::service::ReplicaSetup> {
        let spec = &self.rebuild.run;
        let restarts = self.restarts.get(host as usize).copied().unwrap_or(0);
        let seed = spec.seed ^ 0x7265_706c ^ ((host as u64) << 24) ^ (restarts << 40);
        let mut setup = super::failover_replica_setup(spec, host, seed, &self.rebuild.workload)?;
        // Small, so that the simulator's short runs rewrite journals too.
        setup.journal_rewrite_bytes = 1 << 20;
        Ok(setup)
    }

    fn reopen_host(
        &mut self,
        host: NodeId,
    ) -> anyhow::Result<Rc<std::cell::RefCell<crate::replication::service::ReplicaState>>> {
        use crate::replication::{journal, service};
        self.restarts[host as usize] += 1;
        let setup = self.replica_setup(host)?;
        let disk = self.disks[host as usize].clone();
        let (journal, ops) = journal::Journal::open_memory(disk, setup.cluster_id, host)?;
        Ok(Rc::new(std::cell::RefCell::new(service::ReplicaState::reopen(setup, journal, ops)?)))
    }
}

/// What the simulator needs to rebuild a node on fresh workers: after a crash that lost its
/// memory (from its disk, `--durability wal`) or at a failover (from a replica of its log).
#[derive(Clone)]
struct SimRebuild {
    run: Arc<Run>,
    workload: Arc<dyn Workload>,
    shared: Arc<RunShared>,
    window: Window,
    protos: Protos,
}

impl SimRebuild {
    fn new(
        run: &Arc<Run>,
        workload: &Arc<dyn Workload>,
        shared: &Arc<RunShared>,
        window: Window,
        protos: &Protos,
    ) -> Self {
        SimRebuild {
            run: run.clone(),
            workload: workload.clone(),
            shared: shared.clone(),
            window,
            protos: protos.clone(),
        }
    }

    /// Recover node `n` from `opened` on `workers`, start their clients, and put their protocol
    /// instances where the after-run jobs find them. In the simulator a log's replicator runs on
    /// its host's replication worker, never on the node's worker 0.
    fn rebuild(&self, n: NodeId, opened: Vec<OpenedLog>, workers: &[Rc<Worker>]) {
        let mut node = build_node(&self.run, n, &self.workload, opened).expect("a node that built once builds again");
        node.replicated = None;
        self.start(n, node, workers);
    }

    /// Start a rebuilt node's workers and their clients.
    fn start(&self, n: NodeId, node: NodeSetup, workers: &[Rc<Worker>]) {
        for w in workers {
            self.shared.running.fetch_add(1, Ordering::AcqRel);
            let proto = start_worker(&self.run, &node, w, self.window, &self.shared);
            let i = n as usize * self.run.workers as usize + w.addr.worker as usize;
            self.protos.borrow_mut()[i] = (proto, node.workload.clone());
        }
    }
}

/// How the simulator rebuilds a node whose crash lost its memory: recover it from what its
/// disk kept, on fresh workers, and start their clients again.
fn sim_restart(rebuild: SimRebuild) -> crate::rt::sim::Restart {
    Box::new(move |n, kept, workers| {
        let lanes = rebuild.run.workers as usize;
        let opened: Vec<OpenedLog> = kept
            .into_iter()
            .map(|image| {
                if image.lanes.iter().filter(|lane| !lane.is_empty()).count() > 1 {
                    rebuild.shared.recovered_over_lanes.fetch_add(1, Ordering::Relaxed);
                }
                let r = NodeLog::simulated(image, lanes).expect("a simulated disk holds what it was given");
                rebuild.shared.orphans_voided.fetch_add(r.orphans, Ordering::Relaxed);
                if r.checkpoint.is_some() {
                    rebuild.shared.recovered_from_checkpoint.fetch_add(1, Ordering::Relaxed);
                }
                let (log, records, checkpoint) = (r.log, r.records, r.checkpoint);
                OpenedLog { log, checkpoint, records }
            })
            .collect();
        let logs = opened.iter().map(|o| o.log.clone()).collect();
        rebuild.rebuild(n, opened, workers);
        logs
    })
}
