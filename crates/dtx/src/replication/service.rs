//! Log replication for `--durability replicated`: every node's log is a Raft group whose voters
//! are the node's host and the next `replicas - 1` hosts (mod the cluster size), so each host
//! leads its own node's log and follows `replicas - 1` others. A record is durable once a
//! majority of the group holds it; the protocol's commit waits for exactly that, as it waits for
//! an fsync with `--durability wal`.
//!
//! A host's replicator runs on one of its workers, over `Kind::Service` messages and the
//! worker's timers, so the simulator drives it in virtual time and replays it from the seed. It
//! runs in one of two modes:
//! - [`Mode::OwnerLeads`] (the `local` runtime, where nothing can crash): only a log's owner
//!   ticks and leads its group; the followers hold the log. Nothing fails over.
//! - [`Mode::Failover`] (the simulator and `tcp`): every replica ticks every group it holds and applies
//!   its committed records to the protocol's log state machine ([`LogMachine`], made by the
//!   factory the replicator is given: replication never looks inside a record). When a node's host
//!   fails, the followers elect a new leader; once the new leader's log is settled (an entry of
//!   its own term committed, so every record a former leader committed is in it), it asks for
//!   the node to be rebuilt from that state and served by its host ([`AdoptRequests`]): the
//!   node's partitions, its in-doubt transactions and its coordinator decisions move with the
//!   log. A replica that loses the leadership stops proposing for the node at once; its
//!   incarnation of the node can no longer make anything durable and is replaced by the
//!   next leader's.
//!
//! Entries are framed by this layer: a tag byte, then either one of the node's records (given
//! to the machine) or a replication marker of its own (the `Takeover` that proves a new
//! leader's term, which no machine sees).

use super::raft_log::{RaftConfig, RaftGroup, RaftGroups, RaftLogError, ReplicaId};
use crate::net::{Addr, NodeId};
use crate::rt::log::{LogMachine, NodeLog};
use crate::rt::{log_warn, Worker};
use crate::wal::Lsn;
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

/// The group id that marks a frame as a route announcement rather than a Raft message: where
/// a node that moved to another host now listens (`bench::tcp_host`). No log has this id.
pub const ROUTE_FRAME_GROUP: u32 = u32::MAX;

/// Handles a route announcement's payload.
pub type RouteHandler = Rc<dyn Fn(&[u8])>;

/// How often the replicator ticks (heartbeats every 2 ticks, elections after 10 to 20).
pub const TICK_US: u64 = 10_000;

/// Committed entries a group keeps before it compacts its log (owner-led mode only: in failover
/// mode a follower that fell behind a compaction would get a snapshot without the applied
/// state it needs to take a node over, so the simulator's short runs keep the whole log).
const COMPACT_EVERY: u64 = 4096;

/// How the replicas of a host behave; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    OwnerLeads,
    Failover,
}

/// The nodes that hold node `owner`'s log: its own host first, then the next ones.
pub fn replicas_of(owner: NodeId, nodes: u16, replicas: u16) -> Vec<NodeId> {
    (0..replicas).map(|i| (owner + i) % nodes).collect()
}

fn replica_id(n: NodeId) -> ReplicaId {
    n as ReplicaId + 1
}

fn node_of_replica(r: ReplicaId) -> NodeId {
    (r - 1) as NodeId
}

/// Requests from replicators to rebuild a node on their host: `(node, host)`, where `host`
/// leads the node's log with a settled log. The runtime drains them and answers with
/// [`Replicator::serve`].
pub type AdoptRequests = Rc<RefCell<Vec<(NodeId, NodeId)>>>;

/// Nodes this host served and stopped serving because another replica leads their log now: the
/// runtime stops this host's incarnation of each.
pub type Deposed = Rc<RefCell<Vec<NodeId>>>;

/// Makes a protocol's log state machine, fresh.
pub type MachineFactory = std::sync::Arc<dyn Fn() -> Box<dyn LogMachine> + Send + Sync>;

/// An entry that carries one of the node's records.
const TAG_RECORD: u8 = 0;
/// An entry that carries a new leader's `Takeover` marker (its host id): committing it proves
/// the leadership current. No protocol sees it.
const TAG_TAKEOVER: u8 = 1;

fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + payload.len());
    out.push(tag);
    out.extend_from_slice(payload);
    out
}

/// What a host's replicas keep across a crash of the host: Raft's hard state and log (which a
/// deployment keeps on disk; the simulator keeps them in memory and charges no fsync for them,
/// see docs/architecture.md) and, in failover mode, what each group's committed records amount
/// to (derived from that log, so it survives with it).
pub struct ReplicaState {
    host: NodeId,
    /// Every frame carries it (as its service tag); a frame of another cluster is refused (a
    /// replica started over another cluster's configuration, or a stray process on a reused
    /// port).
    cluster_id: u64,
    mode: Mode,
    groups: RaftGroups,
    /// Per group, the protocol's state machine over its committed records (failover mode).
    applied: FxHashMap<u32, Box<dyn LogMachine>>,
    /// Makes a fresh machine for a group (the protocol's `log_machine(None)`).
    new_machine: MachineFactory,
    /// Per group, the index its log was last compacted to (owner-led mode).
    compacted: FxHashMap<u32, u64>,
    /// Whether a replicator ran over this state before (the first one campaigns at once).
    started: bool,
}

impl ReplicaState {
    /// The replicas host `host` holds: one per node whose log it is a voter of.
    pub fn new(
        host: NodeId,
        cluster_id: u64,
        nodes: u16,
        replicas: u16,
        mode: Mode,
        seed: u64,
        new_machine: MachineFactory,
    ) -> Result<Self, RaftLogError> {
        // Owner-led: only the owner ticks, so it must not step down when it loses touch with a
        // majority (check-quorum): nobody else would take over, and followers that do not tick
        // would refuse its votes forever. In failover mode everyone ticks, and a leader cut off
        // from its followers must step down so that they can elect one they reach.
        let cfg = RaftConfig { check_quorum: mode == Mode::Failover, ..RaftConfig::default() };
        let mut groups = RaftGroups::new();
        for owner in (0..nodes).filter(|&g| replicas_of(g, nodes, replicas).contains(&host)) {
            let voters: Vec<ReplicaId> = replicas_of(owner, nodes, replicas).into_iter().map(replica_id).collect();
            let group = RaftGroup::new(owner as u32, replica_id(host), &voters, &cfg, seed ^ ((owner as u64) << 17))?;
            groups.add(group)?;
        }
        Ok(ReplicaState {
            host,
            cluster_id,
            mode,
            groups,
            applied: Default::default(),
            new_machine,
            compacted: Default::default(),
            started: false,
        })
    }
}

/// A log this host leads and proposes for: the records one incarnation of a node appends.
struct Served {
    log: Arc<NodeLog>,
    /// The term this host first led the log in while serving it (None: not leading yet).
    led_term: Option<u64>,
    /// Taken from the log and not yet accepted by Raft (not leader yet, or back-pressure).
    backlog: VecDeque<Vec<u8>>,
    /// The LSN of the last record taken from the log.
    taken: Lsn,
    /// Proposed, not yet committed: `(raft index, raft term, LSN)`.
    inflight: VecDeque<(u64, u64, Lsn)>,
}

impl Served {
    fn new(log: Arc<NodeLog>) -> Self {
        Served { log, led_term: None, backlog: VecDeque::new(), taken: 0, inflight: VecDeque::new() }
    }
}

/// A host's replicator: the volatile side (what it proposes for whom); its Raft state lives in
/// a [`ReplicaState`] that outlives it.
pub struct Replicator {
    w: Rc<Worker>,
    state: Rc<RefCell<ReplicaState>>,
    served: FxHashMap<u32, Served>,
    /// Adoptions asked for and not yet answered.
    requested: FxHashSet<u32>,
    /// Per log led but not served: the term of the `Takeover` record proposed in it.
    takeover_term: FxHashMap<u32, u64>,
    adopt: Option<AdoptRequests>,
    deposed: Option<Deposed>,
    /// False once the host crashed: the replicator does nothing more.
    alive: bool,
    /// The replicator loop's waker, to pick up a log served from now on.
    loop_waker: Option<Waker>,
    /// Senders whose frames were refused (reported once each).
    refused_from: FxHashSet<Addr>,
    on_route: Option<RouteHandler>,
}

pub type ReplicatorHandle = Rc<RefCell<Replicator>>;

/// Start a replicator on worker `w` over `state`; `own_log` is the log of the node this host
/// starts out serving (its own), if any; `adopt` receives failover requests (failover mode).
pub fn start(
    w: &Rc<Worker>,
    state: Rc<RefCell<ReplicaState>>,
    own_log: Option<Arc<NodeLog>>,
    adopt: Option<AdoptRequests>,
) -> Result<ReplicatorHandle, RaftLogError> {
    let host = state.borrow().host;
    let mut served = FxHashMap::default();
    if let Some(log) = own_log {
        served.insert(host as u32, Served::new(log));
    }
    let first = !std::mem::replace(&mut state.borrow_mut().started, true);
    if first {
        if let Some(own) = state.borrow_mut().groups.get_mut(host as u32) {
            own.campaign()?;
        }
    }
    let r = Rc::new(RefCell::new(Replicator {
        w: w.clone(),
        state,
        served,
        requested: Default::default(),
        takeover_term: Default::default(),
        adopt,
        deposed: None,
        alive: true,
        loop_waker: None,
        refused_from: Default::default(),
        on_route: None,
    }));
    r.borrow_mut().pump();
    let handler_r = Rc::downgrade(&r);
    w.set_service_handler(Rc::new(move |from: Addr, tag: u64, frame: &[u8]| {
        let Some(r) = handler_r.upgrade() else { return };
        let mut me = r.borrow_mut();
        if !me.alive {
            return;
        }
        let cluster_id = me.state.borrow().cluster_id;
        if check_cluster(tag, cluster_id).is_ok()
            && super::raft_log::frame_group_id(frame).is_ok_and(|g| g == ROUTE_FRAME_GROUP)
        {
            if let Some(f) = me.on_route.clone() {
                drop(me);
                f(&frame[super::raft_log::FRAME_HEADER_BYTES.min(frame.len())..]);
            }
            return;
        }
        let stepped = check_cluster(tag, cluster_id)
            .and_then(|()| me.state.borrow_mut().groups.step(replica_id(from.node), frame).map_err(|e| e.to_string()));
        if let Err(e) = stepped {
            if me.refused_from.insert(from) {
                log_warn(&format!("replication: a frame from {from} was refused (further ones are not reported): {e}"));
            }
            return;
        }
        me.pump();
    }));
    w.spawn(run(r.clone()));
    Ok(r)
}

/// The replicator's loop: propose what the served logs appended, tick on time, send what Raft
/// says.
async fn run(r: ReplicatorHandle) {
    let w = r.borrow().w.clone();
    let mut next_tick_ns = w.now_ns() + TICK_US * 1000;
    loop {
        // A deadline, not a duration: rounding a duration down could wake the loop just before
        // the tick is due, again and again, without virtual time moving on.
        let mut sleep = w.sleep_until_ns(next_tick_ns);
        let alive = std::future::poll_fn(|cx| {
            let mut me = r.borrow_mut();
            if !me.alive {
                return Poll::Ready(false);
            }
            me.loop_waker = Some(cx.waker().clone());
            if me.take_appended(cx.waker()) {
                return Poll::Ready(true);
            }
            drop(me);
            Pin::new(&mut sleep).poll(cx).map(|()| true)
        })
        .await;
        if !alive {
            return;
        }
        let mut me = r.borrow_mut();
        if w.now_ns() >= next_tick_ns {
            me.tick();
            next_tick_ns = w.now_ns() + TICK_US * 1000;
        }
        me.propose_backlogs();
        me.pump();
    }
}

impl Replicator {
    /// The host crashed: this replicator does nothing more (its state stays for the next).
    pub fn stop(&mut self) {
        self.alive = false;
        self.served.clear();
    }

    /// Serve `node` from now on: propose the records `log` appends to its group.
    pub fn serve(&mut self, node: NodeId, log: Arc<NodeLog>) {
        self.requested.remove(&(node as u32));
        self.served.insert(node as u32, Served::new(log));
        if let Some(w) = self.loop_waker.take() {
            w.wake();
        }
    }

    /// Route announcements from other hosts go to `f` (their payload, past the frame header).
    pub fn set_route_handler(&mut self, f: RouteHandler) {
        self.on_route = Some(f);
    }

    /// Send a route announcement (`payload`) to every other host's replicas.
    pub fn announce_route(&self, payload: &[u8], hosts: u16) {
        let mut frame = Vec::with_capacity(super::raft_log::FRAME_HEADER_BYTES + payload.len());
        frame.extend_from_slice(&ROUTE_FRAME_GROUP.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(payload);
        let (me, cluster_id) = {
            let st = self.state.borrow();
            (st.host, st.cluster_id)
        };
        for h in (0..hosts).filter(|&h| h != me) {
            self.w.send_service(Addr::new(h, self.w.addr.worker), cluster_id, &frame);
        }
    }

    /// The term this host took `node`'s log over in (its `Takeover` record's), if it did.
    pub fn takeover_term(&self, node: NodeId) -> Option<u64> {
        self.takeover_term.get(&(node as u32)).copied()
    }

    /// Tell `queue` of every node this host stops serving because it lost the node's log.
    pub fn report_deposed(&mut self, queue: Deposed) {
        self.deposed = Some(queue);
    }

    /// Stop proposing for `group`'s incarnation on this host: it can make nothing durable any
    /// more (another replica leads, or our proposals were overwritten).
    fn depose(&mut self, group: u32) {
        if self.served.remove(&group).is_some() {
            if let Some(q) = &self.deposed {
                q.borrow_mut().push(group as NodeId);
            }
        }
    }

    /// Another host took `node` over: stop proposing for the incarnation this host served.
    pub fn forget(&mut self, node: NodeId) {
        self.served.remove(&(node as u32));
    }

    /// The runtime could not take `node` over now: ask again when the log is settled.
    pub fn adoption_refused(&mut self, node: NodeId) {
        self.requested.remove(&(node as u32));
    }

    /// What `node` recovers from, if this host may take it over now: it is alive, leads the
    /// node's log with a settled log, and has applied every committed record.
    pub fn adoptable_state(&self, node: NodeId) -> Option<Vec<u8>> {
        let st = self.state.borrow();
        let g = st.groups.get(node as u32)?;
        let ready = self.alive
            && st.mode == Mode::Failover
            && !self.served.contains_key(&(node as u32))
            && self.takeover_term.get(&(node as u32)) == Some(&g.term())
            && g.leads_with_settled_log()
            && g.applied_index() >= g.commit_index();
        ready.then(|| match st.applied.get(&(node as u32)) {
            Some(m) => m.snapshot(),
            None => (st.new_machine)().snapshot(),
        })
    }

    /// Take what the served logs appended since the last look; `waker` hears of the next.
    fn take_appended(&mut self, waker: &Waker) -> bool {
        let mut any = false;
        for s in self.served.values_mut() {
            let taken = s.log.take_for_replication(waker);
            if !taken.is_empty() {
                s.taken += taken.len() as Lsn;
                s.backlog.extend(taken);
                any = true;
            }
        }
        any
    }

    fn tick(&mut self) {
        let mut st = self.state.borrow_mut();
        match st.mode {
            Mode::Failover => st.groups.tick_all(),
            Mode::OwnerLeads => {
                let own = st.host as u32;
                if let Some(g) = st.groups.get_mut(own) {
                    g.tick();
                }
            }
        }
    }

    /// Hand each backlog to its group, in order, until the group refuses one.
    fn propose_backlogs(&mut self) {
        let mut st = self.state.borrow_mut();
        for (&group, s) in self.served.iter_mut() {
            let Some(g) = st.groups.get_mut(group) else { continue };
            let mut lsn = s.taken - s.backlog.len() as Lsn;
            while let Some(rec) = s.backlog.front() {
                match g.propose(frame(TAG_RECORD, rec)) {
                    Ok(()) => {
                        lsn += 1;
                        s.inflight.push_back((g.last_index(), g.term(), lsn));
                        s.backlog.pop_front();
                    }
                    Err(RaftLogError::NotLeader { .. } | RaftLogError::Backpressure { .. }) => break,
                    Err(e) => {
                        log_warn(&format!("replication: host {} cannot propose to log {group}: {e}", st.host));
                        break;
                    }
                }
            }
        }
    }

    /// Send what every group has to send; apply and report what committed; follow leadership.
    fn pump(&mut self) {
        let mut outputs = Vec::new();
        self.state.borrow_mut().groups.poll_all(&mut outputs);
        for (group, out) in outputs {
            let cluster_id = self.state.borrow().cluster_id;
            for (to, frame) in out.messages {
                let dst = Addr::new(node_of_replica(to), self.w.addr.worker);
                self.w.send_service(dst, cluster_id, &frame);
            }
            self.committed(group, &out.committed);
            if out.snapshot_index.is_some() && self.state.borrow().mode == Mode::Failover {
                log_warn(&format!(
                    "replication: host {} got a snapshot of log {group}, which carries no applied state",
                    self.state.borrow().host
                ));
            }
        }
        if self.state.borrow().mode == Mode::Failover {
            self.follow_leadership();
        } else {
            self.compact();
        }
    }

    /// Committed entries of `group`: apply them (failover mode) and tell the served log which
    /// of its records are durable.
    fn committed(&mut self, group: u32, entries: &[super::raft_log::Entry]) {
        if entries.is_empty() {
            return;
        }
        let mut st = self.state.borrow_mut();
        if st.mode == Mode::Failover {
            let st = &mut *st;
            let applied = st.applied.entry(group).or_insert_with(|| (st.new_machine)());
            for e in entries {
                match e.data.split_first() {
                    Some((&TAG_RECORD, record)) => applied.apply(record),
                    Some((&TAG_TAKEOVER, _)) => {}
                    // Raft's own empty entries (a new leader's first), and nothing else.
                    _ => debug_assert!(e.data.is_empty(), "an entry of group {group} with an unknown tag"),
                }
            }
            self.w.charge_ops(entries.len());
        }
        let Some(s) = self.served.get_mut(&group) else { return };
        let mut durable = None;
        let mut lost = false;
        for e in entries {
            match s.inflight.front() {
                Some(&(index, term, lsn)) if index == e.index => {
                    if term == e.term {
                        durable = Some(lsn);
                        s.inflight.pop_front();
                    } else {
                        lost = true;
                    }
                }
                // An entry past our oldest proposal committed without it: it was overwritten.
                Some(&(index, _, _)) if index < e.index => lost = true,
                _ => {}
            }
        }
        if let Some(lsn) = durable {
            s.log.replicated_upto(lsn);
        }
        if lost {
            // Another leader's entries replaced ours: this incarnation of the node can make
            // nothing durable any more; the new leader's incarnation replaces it.
            log_warn(&format!("replication: host {} lost proposals to log {group}", st.host));
            drop(st);
            self.depose(group);
        }
    }

    /// Stop serving the logs this host no longer leads; take over the ones it now leads. A
    /// leader first commits a `Takeover` record in its own term: a host that was cut off (or
    /// restarted) may still believe it leads an old term, and only a commit proves that a
    /// majority follows it; once that record is committed and the whole log with it, the log
    /// is settled and the node can be rebuilt from it.
    fn follow_leadership(&mut self) {
        let mut st = self.state.borrow_mut();
        let host = st.host;
        let me = replica_id(host);
        let mut ask = Vec::new();
        let mut lost = Vec::new();
        let groups: Vec<u32> = st.groups.group_ids().collect();
        for group in groups {
            let Some(g) = st.groups.get_mut(group) else { continue };
            if let Some(s) = self.served.get_mut(&group) {
                if g.is_leader() {
                    let term = *s.led_term.get_or_insert(g.term());
                    if term != g.term() {
                        lost.push(group);
                    }
                } else if s.led_term.is_some() || g.leader().is_some_and(|l| l != me) {
                    // Deposed, or another replica won the first election: this incarnation
                    // can make nothing durable any more.
                    lost.push(group);
                }
                continue;
            }
            if !g.is_leader() {
                self.requested.remove(&group);
                self.takeover_term.remove(&group);
                continue;
            }
            if self.takeover_term.get(&group) != Some(&g.term()) {
                let marker = frame(TAG_TAKEOVER, &host.to_le_bytes());
                if g.propose(marker).is_ok() {
                    self.takeover_term.insert(group, g.term());
                }
            } else if g.leads_with_settled_log() && !self.requested.contains(&group) {
                ask.push(group);
            }
        }
        drop(st);
        for group in lost {
            self.depose(group);
        }
        if let Some(q) = &self.adopt {
            for group in ask {
                self.requested.insert(group);
                q.borrow_mut().push((group as NodeId, host));
            }
        }
    }

    fn compact(&mut self) {
        let mut st = self.state.borrow_mut();
        let ReplicaState { groups, compacted, .. } = &mut *st;
        let ids: Vec<u32> = groups.group_ids().collect();
        for group in ids {
            let Some(g) = groups.get_mut(group) else { continue };
            let applied = g.applied_index();
            let done = compacted.entry(group).or_default();
            if applied >= *done + COMPACT_EVERY {
                g.compact(applied);
                *done = applied;
            }
        }
    }
}

/// Whether a frame tagged with cluster `id` may be stepped by a replica of cluster `cluster_id`.
fn check_cluster(id: u64, cluster_id: u64) -> Result<(), String> {
    if id != cluster_id {
        return Err(format!("it belongs to cluster {id:016x}, not to this cluster ({cluster_id:016x})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_of_another_cluster_is_refused_naming_both() {
        assert_eq!(check_cluster(0xabc, 0xabc), Ok(()));
        let err = check_cluster(0xabc, 0xdef).unwrap_err();
        assert!(err.contains("0000000000000abc") && err.contains("0000000000000def"), "{err}");
    }

    #[test]
    fn every_node_leads_its_log_and_follows_the_next_ones() {
        assert_eq!(replicas_of(0, 4, 3), vec![0, 1, 2]);
        assert_eq!(replicas_of(3, 4, 3), vec![3, 0, 1]);
        let hosted = |n: NodeId| (0..4).filter(|&g| replicas_of(g, 4, 3).contains(&n)).count();
        assert!((0..4).all(|n| hosted(n) == 3), "each node holds three logs");
    }
}
