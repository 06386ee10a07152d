//! MVCC's coordinator: the transaction's timestamp is fixed when the attempt starts; reads go to
//! where the records live and are final when answered; declared writes are held (prewritten)
//! with the reads in one-shot mode, the others at prepare, which only nodes it writes to see.
//! A read-only transaction commits with no message after its reads.

use super::messages::{Reply, Request};
use super::participant::{self as part, waiting, Writes};
use super::{Mvcc, MvccWorker};
use crate::net::NodeId;
use crate::protocols::twopc::buffered::BufferedTxn;
use crate::protocols::twopc::durable::AckAfter;
use crate::protocols::twopc::Coordinator;
use crate::protocols::twopc::{CoordTxn, TxnId};
use crate::protocols::Attempt;
use crate::rt::join_all;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, KeySet, Scan, Step, TxnResult};
use rustc_hash::FxHashMap;

pub struct MvccTxn<'a> {
    wk: &'a MvccWorker,
    pub id: TxnId,
    /// The timestamp every access of the attempt is made at, and it commits at.
    pub ts: u64,
    /// What it read (a second read of a key returns the same value without a message).
    read: Vec<(RowKey, Option<Value>)>,
    writes: Writes,
    /// Local records it holds prewrites on.
    held_here: Vec<RowKey>,
    /// Remote nodes that hold prewrites of this attempt: each hears the outcome.
    touched: Vec<NodeId>,
}

/// How an MVCC attempt starts, as the 2PC skeleton calls it.
impl Coordinator for Mvcc {
    type Txn<'a> = MvccTxn<'a>;

    fn begin<'a>(wk: &'a MvccWorker, id: TxnId, attempt: Attempt) -> MvccTxn<'a> {
        MvccTxn {
            wk,
            id,
            ts: wk.state.next_ts(&wk.w, attempt.fresh),
            read: Vec::new(),
            writes: Vec::new(),
            held_here: Vec::new(),
            touched: Vec::new(),
        }
    }
}

impl<'a> MvccTxn<'a> {
    /// Note that `n` will hold prewrites of this attempt (before the message that makes it
    /// hold any): the decision table answers its questions from then on.
    fn touch(&mut self, n: NodeId) {
        self.wk.coord.touch(self.id, &mut self.touched, n)
    }

    /// Read `reads` and prewrite `writes` on this node, waiting while a write with a smaller
    /// timestamp is pending on any of them.
    async fn access_here(&mut self, reads: &[RowKey], writes: &[RowKey]) -> TxnResult<()> {
        let wk = self.wk;
        wk.w.charge_ops(reads.len() + writes.len());
        self.held_here.extend_from_slice(writes);
        let floor = wk.state.floor(&wk.w);
        let (id, ts) = (self.id, self.ts);
        let values = waiting(&wk.w, || part::access(&wk.node.store, id, ts, floor, reads, writes)).await?;
        self.read.extend(reads.iter().copied().zip(values));
        Ok(())
    }

    /// Read `reads` and prewrite `writes` at each remote node, one message per node.
    async fn access_remote(&mut self, by_node: Vec<(NodeId, Vec<RowKey>, Vec<RowKey>)>) -> TxnResult<()> {
        let wk = self.wk;
        for (n, _, writes) in &by_node {
            if !writes.is_empty() {
                self.touch(*n);
            }
        }
        let calls: Vec<_> = by_node
            .iter()
            .map(|(n, reads, writes)| {
                let req = Request::Access { txn: self.id, ts: self.ts, reads: reads.clone(), writes: writes.clone() };
                let n = *n;
                async move { wk.ask(n, &req).await }
            })
            .collect();
        for ((_, keys, _), reply) in by_node.iter().zip(join_all(calls).await) {
            match reply? {
                Reply::Values(vals) if vals.len() == keys.len() => self.read.extend(keys.iter().copied().zip(vals)),
                Reply::No(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            }
        }
        Ok(())
    }

    /// `Prepare` at every remote node the transaction writes to, in parallel: all must vote yes.
    async fn prepare_remote(&mut self, remote: Vec<(NodeId, Writes)>) -> TxnResult<()> {
        let wk = self.wk;
        for (n, _) in &remote {
            self.touch(*n);
        }
        let (txn, ts) = (self.id, self.ts);
        let prepares = remote.into_iter().map(|(n, writes)| (n, Request::Prepare { txn, ts, writes }));
        for reply in wk.ask_all(prepares).await {
            match reply? {
                Reply::Yes => {}
                Reply::No(a) => return Err(a),
                _ => return Err(Abort::BadReply),
            }
        }
        Ok(())
    }

    /// Drop what this attempt holds here, and tell every node holding prewrites.
    fn abort(&mut self, reason: Abort) -> Abort {
        let wk = self.wk;
        part::release(&wk.node.store, self.id, &self.held_here);
        self.held_here.clear();
        wk.abort_remote(self.id, &mut self.touched);
        reason
    }
}

impl<'a> BufferedTxn for MvccTxn<'a> {
    /// The version it read.
    fn read_before(&mut self, key: RowKey) -> Option<Option<Value>> {
        self.read.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
    }

    fn read_new(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        Step::Wait(Box::pin(async move {
            match self.wk.node.remote_node(key) {
                None => self.access_here(&[key], &[]).await?,
                Some(n) => self.access_remote(vec![(n, vec![key], Vec::new())]).await?,
            }
            Ok(self.read_before(key).expect("just read"))
        }))
    }

    fn writes(&mut self) -> &mut Writes {
        &mut self.writes
    }

    /// Reads are final when served: nothing to note.
    async fn scan_stored(&mut self, s: Scan) -> TxnResult<Vec<(u64, Value)>> {
        let wk = self.wk;
        let (id, ts) = (self.id, self.ts);
        let n = wk.node.node_of(RowKey::new(s.table, s.lo));
        if n == wk.node.id {
            wk.w.charge_ops(1);
            return waiting(&wk.w, || part::scan(&wk.node.store, id, ts, s)).await;
        }
        match wk.ask(n, &Request::Scan { txn: id, ts, scan: s }).await? {
            Reply::Rows(rows) => Ok(rows),
            Reply::No(a) => Err(a),
            _ => Err(Abort::BadReply),
        }
    }
}

impl<'a> CoordTxn for MvccTxn<'a> {
    /// One-shot: read every declared key (a declared write too: its procedure reads it first)
    /// and prewrite the declared writes, one message per remote participant.
    async fn prefetch(&mut self, keys: &KeySet) -> TxnResult<()> {
        let mut by_node: FxHashMap<NodeId, (Vec<RowKey>, Vec<RowKey>)> = FxHashMap::default();
        let (mut local_reads, mut local_writes) = (Vec::new(), Vec::new());
        for &k in keys.reads.iter().chain(&keys.writes) {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().0.push(k),
                None => local_reads.push(k),
            }
        }
        for &k in &keys.writes {
            match self.wk.node.remote_node(k) {
                Some(n) => by_node.entry(n).or_default().1.push(k),
                None => local_writes.push(k),
            }
        }
        local_reads.sort_unstable();
        local_reads.dedup();
        local_writes.sort_unstable();
        local_writes.dedup();
        if !local_reads.is_empty() || !local_writes.is_empty() {
            self.access_here(&local_reads, &local_writes).await?;
        }
        if by_node.is_empty() {
            return Ok(());
        }
        let mut nodes: Vec<(NodeId, Vec<RowKey>, Vec<RowKey>)> = by_node
            .into_iter()
            .map(|(n, (mut reads, mut writes))| {
                reads.sort_unstable();
                reads.dedup();
                writes.sort_unstable();
                writes.dedup();
                (n, reads, writes)
            })
            .collect();
        nodes.sort_unstable_by_key(|e| e.0);
        self.access_remote(nodes).await
    }

    /// Prewrite what is not held yet (here, and by a `Prepare` at every node it writes to),
    /// log the decision, install here and tell every node holding prewrites.
    async fn commit(&mut self) -> TxnResult<AckAfter> {
        let wk = self.wk;
        let me = wk.node.id;
        let mut local: Writes = Vec::new();
        let mut remote: Vec<(NodeId, Writes)> = Vec::new();
        for (k, v) in std::mem::take(&mut self.writes) {
            match wk.node.node_of(k) {
                n if n == me => local.push((k, v)),
                n => match remote.iter_mut().find(|r| r.0 == n) {
                    Some(r) => r.1.push((k, v)),
                    None => remote.push((n, vec![(k, v)])),
                },
            }
        }
        if !local.is_empty() {
            let keys: Vec<RowKey> = local.iter().map(|w| w.0).filter(|k| !self.held_here.contains(k)).collect();
            if let Err(a) = self.access_here(&[], &keys).await {
                return Err(self.abort(a));
            }
        }
        if let Err(a) = self.prepare_remote(remote).await {
            return Err(self.abort(a));
        }
        let logs_decision = !self.touched.is_empty() || !local.is_empty();
        let mut ack = None;
        if logs_decision {
            if let Err(a) = wk.node.log.log_decision_at(&wk.w, self.id, &local, &self.touched, self.ts).await {
                return Err(self.abort(a));
            }
        } else {
            // Read-only: what it read here is fenced as a remote node fences its reads.
            ack = wk.node.log.read_fence();
        }
        // One step a record prewritten: the install replaces its prewrite.
        wk.w.charge_ops(self.held_here.len());
        part::install(&wk.node.store, self.id, self.ts, &self.held_here, local);
        self.held_here.clear();
        if !self.touched.is_empty() {
            wk.coord.set_committed_at(self.id, self.ts);
            wk.tell_commit_at(self.id, self.ts, std::mem::take(&mut self.touched));
        }
        Ok(ack)
    }

    /// Execution failed: the prewrites it holds anywhere go.
    fn abandon(&mut self, reason: Abort) -> Abort {
        self.abort(reason)
    }
}
