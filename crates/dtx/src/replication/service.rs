//! Log replication for `--durability replicated`: every node's log is a Raft group whose voters
//! are the node itself and the next `replicas - 1` nodes (mod the cluster size), so each node
//! leads its own log and follows `replicas - 1` others. A record is durable once a majority of
//! the group holds it; the protocol's commit waits for exactly that, as it waits for an fsync
//! with `--durability wal`.
//!
//! The replicator runs on worker 0 of each node, over `Kind::Service` messages and the worker's
//! timers, so the simulator drives it in virtual time and replays it from the seed.
//!
//! What is not built yet, and why it matters: the followers hold the log only (they neither apply
//! it nor serve reads), and only the owner of a log ever campaigns for it (followers do not tick
//! their election timers), so a failed node's partition is not taken over: failover and recovery
//! of a node from its replicas are the next step. The log lives in memory (`MemStorage`): a
//! majority of replicas, not a disk, makes a record durable.

use super::raft_log::{RaftConfig, RaftGroup, RaftGroups, RaftLogError, ReplicaId};
use crate::net::{Addr, NodeId};
use crate::rt::log::NodeLog;
use crate::rt::{log_warn, Worker};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;

/// How often the replicator ticks its own group (heartbeats every 2 ticks, elections after 10).
pub const TICK_US: u64 = 10_000;

/// Committed entries a group keeps before it compacts its log.
const COMPACT_EVERY: u64 = 4096;

/// The nodes that hold node `owner`'s log: itself first, then the next ones.
pub fn replicas_of(owner: NodeId, nodes: u16, replicas: u16) -> Vec<NodeId> {
    (0..replicas).map(|i| (owner + i) % nodes).collect()
}

fn replica_id(n: NodeId) -> ReplicaId {
    n as ReplicaId + 1
}

fn node_of_replica(r: ReplicaId) -> NodeId {
    (r - 1) as NodeId
}

struct Replicator {
    w: Rc<Worker>,
    node: NodeId,
    groups: RaftGroups,
    log: Arc<NodeLog>,
    /// Records taken from the log and not yet accepted by Raft (it refused: not leader yet,
    /// or back-pressure), oldest first.
    backlog: Vec<Vec<u8>>,
    /// The node's own records that a majority holds (its log's durable LSN).
    committed_own: u64,
    /// Per group, the last committed index and the index the log was last compacted to.
    compacted: rustc_hash::FxHashMap<u32, (u64, u64)>,
}

/// Start the replicator on worker 0 of `node`: one group per log this node holds.
pub fn start(
    w: &Rc<Worker>,
    node: NodeId,
    nodes: u16,
    replicas: u16,
    log: Arc<NodeLog>,
    seed: u64,
) -> Result<(), RaftLogError> {
    // Only a log's owner ever leads it (followers do not tick, so they never campaign), so the
    // leader must not step down when it loses touch with a majority (check-quorum): nobody else
    // would take over, and followers that do not tick would refuse its votes forever.
    let cfg = RaftConfig { check_quorum: false, ..RaftConfig::default() };
    let mut groups = RaftGroups::new();
    for owner in (0..nodes).filter(|&g| replicas_of(g, nodes, replicas).contains(&node)) {
        let voters: Vec<ReplicaId> = replicas_of(owner, nodes, replicas).into_iter().map(replica_id).collect();
        let group = RaftGroup::new(owner as u32, replica_id(node), &voters, &cfg, seed ^ ((owner as u64) << 17))?;
        groups.add(group)?;
    }
    let r = Rc::new(RefCell::new(Replicator {
        w: w.clone(),
        node,
        groups,
        log,
        backlog: Vec::new(),
        committed_own: 0,
        compacted: Default::default(),
    }));
    if let Some(own) = r.borrow_mut().groups.get_mut(node as u32) {
        own.campaign()?;
    }
    r.borrow_mut().pump();
    let handler_r = r.clone();
    w.set_service_handler(Rc::new(move |from: Addr, frame: &[u8]| {
        let mut me = handler_r.borrow_mut();
        if let Err(e) = me.groups.step(replica_id(from.node), frame) {
            log_warn(&format!("replication: a frame from {from} was refused: {e}"));
        }
        me.pump();
    }));
    w.spawn(run(r));
    Ok(())
}

/// The replicator's loop: propose what the log appended, tick on time, send what Raft says.
async fn run(r: Rc<RefCell<Replicator>>) {
    let (w, log) = {
        let me = r.borrow();
        (me.w.clone(), me.log.clone())
    };
    let mut next_tick_ns = w.now_ns() + TICK_US * 1000;
    loop {
        // A deadline, not a duration: rounding a duration down could wake the loop just before
        // the tick is due, again and again, without virtual time moving on.
        let mut sleep = w.sleep_until_ns(next_tick_ns);
        let appended = std::future::poll_fn(|cx| {
            let taken = log.take_for_replication(cx.waker());
            if !taken.is_empty() {
                return Poll::Ready(taken);
            }
            match Pin::new(&mut sleep).poll(cx) {
                Poll::Ready(()) => Poll::Ready(Vec::new()),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        let mut me = r.borrow_mut();
        me.backlog.extend(appended);
        if w.now_ns() >= next_tick_ns {
            let own = me.node as u32;
            if let Some(g) = me.groups.get_mut(own) {
                g.tick();
            }
            next_tick_ns = w.now_ns() + TICK_US * 1000;
        }
        me.propose_backlog();
        me.pump();
    }
}

impl Replicator {
    /// Hand the backlog to the own group, in order, until it refuses one.
    fn propose_backlog(&mut self) {
        let Some(own) = self.groups.get_mut(self.node as u32) else { return };
        let mut accepted = 0;
        for rec in &self.backlog {
            match own.propose(rec.clone()) {
                Ok(()) => accepted += 1,
                Err(RaftLogError::NotLeader { .. } | RaftLogError::Backpressure { .. }) => break,
                Err(e) => {
                    log_warn(&format!("replication: node {} cannot propose: {e}", self.node));
                    break;
                }
            }
        }
        self.backlog.drain(..accepted);
    }

    /// Send what every group has to send; report the own log's progress; keep logs bounded.
    fn pump(&mut self) {
        let mut outputs = Vec::new();
        self.groups.poll_all(&mut outputs);
        for (group, out) in outputs {
            for (to, frame) in out.messages {
                self.w.send_service(Addr::new(node_of_replica(to), 0), &frame);
            }
            if let Some(last) = out.committed.last() {
                let e = self.compacted.entry(group).or_default();
                e.0 = last.index;
            }
            if group == self.node as u32 && !out.committed.is_empty() {
                // Only the owner proposes to its group, in log order, so the k-th committed
                // entry is the record of LSN k.
                self.committed_own += out.committed.len() as u64;
                self.log.replicated_upto(self.committed_own);
            }
        }
        self.compact();
    }

    fn compact(&mut self) {
        for (&group, (committed, done)) in self.compacted.iter_mut() {
            if *committed >= *done + COMPACT_EVERY {
                if let Some(g) = self.groups.get_mut(group) {
                    g.compact(*committed);
                }
                *done = *committed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_leads_its_log_and_follows_the_next_ones() {
        assert_eq!(replicas_of(0, 4, 3), vec![0, 1, 2]);
        assert_eq!(replicas_of(3, 4, 3), vec![3, 0, 1]);
        let hosted = |n: NodeId| (0..4).filter(|&g| replicas_of(g, 4, 3).contains(&n)).count();
        assert!((0..4).all(|n| hosted(n) == 3), "each node holds three logs");
    }
}
