//! A full copy of the data that runs requests as data, one after another, in the order given:
//! what a replica of an input log executes (Calvin's sequenced batches; SLOG's, Detock's and
//! Aria's logs later), so that it holds the state its log amounts to, can snapshot that state,
//! and lets the log be compacted behind the snapshot.
//!
//! Deterministic by construction: every access is answered from the copy at once, so a
//! procedure runs to its end in one poll, and the same requests in the same order leave the same
//! state wherever they run. The copy starts from the workload's own population (loaded on the
//! first use, so that making a copy that is never used costs nothing) and a snapshot holds only
//! the rows written since, which keeps it as small as what the log changed.

use super::{Abort, Access, Ctx, Procedures, Scan, Step, TxnOutput, TxnResult};
use crate::storage::{RowKey, Value};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a copy ran, since the log began (a snapshot carries it, so a copy rebuilt from one
/// counts on from where the snapshot was taken).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayStats {
    /// Requests whose procedure committed; their writes are in the copy.
    pub committed: u64,
    /// Requests whose procedure rolled itself back (TPC-C's invalid item): nothing written.
    pub rolled_back: u64,
    /// Requests that did not decode (another build of the workload): skipped, everywhere alike.
    pub undecodable: u64,
}

/// A snapshot: the counts, and every row written since the population (`None`: deleted).
#[derive(Serialize, Deserialize)]
struct Snapshot {
    stats: ReplayStats,
    written: Vec<(RowKey, Option<Value>)>,
}

/// What a copy must refuse so that it ends every request as the protocol's own execution does:
/// a replica that commits what the data nodes aborted would diverge from them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayRules {
    /// Run under the request's declared keys ([`Ctx::with_declared`]): a stray access aborts
    /// with `ReconMismatch`, as at a deterministic scheduler.
    pub declared_keys_only: bool,
    /// With `declared_keys_only`: abort a scan that is not one of the declared scans
    /// (`KeySet::scans`) with this, as a scheduler that locked the declared ranges does.
    pub undeclared_scans: Option<Abort>,
}

/// The whole database, as a replica of an input log holds it.
pub struct ReplayedCopy {
    workload: Arc<dyn Procedures>,
    partitions: u32,
    rules: ReplayRules,
    /// Every row (present ones only), once loaded.
    rows: Option<BTreeMap<RowKey, Value>>,
    /// Rows written since the population, as written: what a snapshot carries.
    written: BTreeMap<RowKey, Option<Value>>,
    stats: ReplayStats,
}

impl ReplayedCopy {
    /// A copy of the `partitions` partitions of `workload` as populated.
    pub fn new(workload: Arc<dyn Procedures>, partitions: u32, rules: ReplayRules) -> Self {
        ReplayedCopy {
            workload,
            partitions,
            rules,
            rows: None,
            written: BTreeMap::new(),
            stats: ReplayStats::default(),
        }
    }

    /// A copy as [`ReplayedCopy::snapshot`] left it.
    pub fn from_snapshot(
        workload: Arc<dyn Procedures>,
        partitions: u32,
        rules: ReplayRules,
        bytes: &[u8],
    ) -> anyhow::Result<Self> {
        let s: Snapshot = crate::net::decode(bytes)
            .map_err(|e| anyhow::anyhow!("a replayed copy's snapshot ({} bytes) does not decode: {e}", bytes.len()))?;
        let mut copy = ReplayedCopy::new(workload, partitions, rules);
        copy.stats = s.stats;
        copy.written = s.written.into_iter().collect();
        Ok(copy)
    }

    pub fn snapshot(&self) -> Vec<u8> {
        let written = self.written.iter().map(|(k, v)| (*k, v.clone())).collect();
        crate::net::encode(&Snapshot { stats: self.stats, written })
    }

    pub fn stats(&self) -> ReplayStats {
        self.stats
    }

    /// A row's value now.
    pub fn get(&mut self, key: RowKey) -> Option<Value> {
        self.rows().get(&key).cloned()
    }

    /// Run the encoded request `request` against the copy and keep its writes if it commits.
    pub fn execute(&mut self, request: &[u8]) -> TxnResult<TxnOutput> {
        self.execute_with(request, None)
    }

    /// [`ReplayedCopy::execute`] under `keys` when the request came with them (reconnaissance
    /// found them), else under the workload's declaration.
    pub fn execute_with(&mut self, request: &[u8], keys: Option<&super::KeySet>) -> TxnResult<TxnOutput> {
        let req = match self.workload.decode_request(request) {
            Ok(r) => r,
            Err(_) => {
                self.stats.undecodable += 1;
                return Err(Abort::User);
            }
        };
        let workload = self.workload.clone();
        let mut declared = super::KeySet::default();
        let keys = match keys {
            Some(keys) => keys,
            None => {
                if self.rules.declared_keys_only {
                    workload.declare(&req, &mut declared);
                }
                &declared
            }
        };
        let (rules, rows) = (self.rules, self.rows());
        let scans = match (rules.declared_keys_only, rules.undeclared_scans) {
            (true, Some(refusal)) => Some((keys.scans.as_slice(), refusal)),
            _ => None,
        };
        let mut access = Overlay { rows, writes: Vec::new(), scans };
        let result = {
            let mut ctx = match rules.declared_keys_only {
                true => Ctx::with_declared(&mut access, keys),
                false => Ctx::new(&mut access),
            };
            let mut run = workload.run(&req, &mut ctx);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match run.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(r) => r,
                // Every access is ready at once: a procedure that still waits awaits something
                // other than its context, which would make replicas diverge.
                std::task::Poll::Pending => panic!("procedure `{}` waited on a replayed copy", req.proc),
            }
        };
        let writes = access.writes;
        match &result {
            Ok(_) => {
                self.stats.committed += 1;
                let rows = self.rows.as_mut().expect("loaded by the run");
                for (k, v) in writes {
                    match &v {
                        Some(v) => rows.insert(k, v.clone()),
                        None => rows.remove(&k),
                    };
                    self.written.insert(k, v);
                }
            }
            Err(_) => self.stats.rolled_back += 1,
        }
        result
    }

    /// The rows, populated (and the snapshot's writes laid over them) on the first use.
    fn rows(&mut self) -> &BTreeMap<RowKey, Value> {
        if self.rows.is_none() {
            let mut rows = BTreeMap::new();
            for p in 0..self.partitions {
                self.workload.load_partition(p, &mut |k, v| {
                    rows.insert(k, v);
                });
            }
            for (k, v) in &self.written {
                match v {
                    Some(v) => rows.insert(*k, v.clone()),
                    None => rows.remove(k),
                };
            }
            self.rows = Some(rows);
        }
        self.rows.as_ref().expect("loaded above")
    }
}

/// One request's run: reads from the copy under its own writes, writes buffered until it ends.
struct Overlay<'a> {
    rows: &'a BTreeMap<RowKey, Value>,
    writes: Vec<(RowKey, Option<Value>)>,
    /// The only scans allowed, and the abort for any other (`ReplayRules::undeclared_scans`).
    scans: Option<(&'a [Scan], Abort)>,
}

impl Overlay<'_> {
    fn current(&self, key: RowKey) -> Option<Value> {
        match self.writes.iter().rev().find(|(k, _)| *k == key) {
            Some((_, v)) => v.clone(),
            None => self.rows.get(&key).cloned(),
        }
    }
}

impl Access for Overlay<'_> {
    fn read(&mut self, key: RowKey) -> Step<'_, Option<Value>> {
        Step::Ready(Ok(self.current(key)))
    }

    fn write(&mut self, key: RowKey, value: Option<Value>) -> Step<'_, ()> {
        self.writes.push((key, value));
        Step::Ready(Ok(()))
    }

    /// Keys in `[lo, hi]` of the table that are present under the run's own writes, in the
    /// order asked, at most `limit`.
    fn scan(&mut self, s: Scan) -> Step<'_, Vec<(u64, Value)>> {
        if let Some((_, refusal)) = self.scans.filter(|(allowed, _)| !allowed.contains(&s)) {
            return Step::Ready(Err(refusal));
        }
        let range = self.rows.range(RowKey::new(s.table, s.lo)..=RowKey::new(s.table, s.hi));
        // The run's own writes in the range may delete stored rows: take as many more.
        let want = (s.limit as usize).saturating_add(self.writes.iter().filter(|(k, _)| s.contains(*k)).count());
        let stored: Vec<(u64, Value)> = match s.descending {
            true => range.rev().take(want).map(|(k, v)| (k.key, v.clone())).collect(),
            false => range.take(want).map(|(k, v)| (k.key, v.clone())).collect(),
        };
        Step::Ready(Ok(s.over_writes(stored, &self.writes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{build, WorkloadParams};

    fn bank() -> (Arc<dyn Procedures>, Vec<Vec<u8>>, u32) {
        let topo = crate::cluster::Topology::new(2, 1, 2);
        let params = WorkloadParams { name: "bank".into(), accounts: 64, distributed: 0.5, ..Default::default() };
        let wl = build(&params, &topo).expect("the bank builds");
        let mut rng = crate::util::rng_from_seed(7);
        let requests = (0..400).map(|i| wl.encode_request(&wl.next(&mut rng, i % topo.partitions()))).collect();
        (wl, requests, topo.partitions())
    }

    /// The sum of every account's balance (its first 8 bytes).
    fn total(copy: &mut ReplayedCopy) -> i64 {
        copy.rows().values().map(|v| i64::from_le_bytes(v[..8].try_into().expect("a balance"))).sum()
    }

    #[test]
    fn a_copy_runs_requests_and_a_snapshot_resumes_where_it_was_taken() {
        let (procs, requests, partitions) = bank();
        let mut whole = ReplayedCopy::new(procs.clone(), partitions, ReplayRules::default());
        let before = total(&mut whole);
        requests.iter().for_each(|r| drop(whole.execute(r)));
        assert!(whole.stats().committed > 300, "{:?}", whole.stats());
        assert_eq!(total(&mut whole), before, "transfers keep the bank's total");

        let mut first = ReplayedCopy::new(procs.clone(), partitions, ReplayRules::default());
        requests[..150].iter().for_each(|r| drop(first.execute(r)));
        let mut resumed =
            ReplayedCopy::from_snapshot(procs, partitions, ReplayRules::default(), &first.snapshot()).unwrap();
        requests[150..].iter().for_each(|r| drop(resumed.execute(r)));
        assert_eq!(resumed.snapshot(), whole.snapshot(), "snapshot + the rest = the whole log");
        assert_eq!(resumed.stats(), whole.stats());
        assert!(whole.snapshot().len() < 64 * 64, "a snapshot holds the rows written, not the population");
    }

    #[test]
    fn garbage_is_counted_not_run_and_a_bad_snapshot_is_refused() {
        let (procs, _, partitions) = bank();
        let mut copy = ReplayedCopy::new(procs.clone(), partitions, ReplayRules::default());
        assert!(copy.execute(&[0xff; 3]).is_err());
        assert_eq!(copy.stats().undecodable, 1);
        let e = ReplayedCopy::from_snapshot(procs, partitions, ReplayRules::default(), &[0xff; 3]).err().unwrap();
        assert!(e.to_string().contains("does not decode"), "{e}");
    }

    #[test]
    fn a_scan_sees_the_run_s_own_writes_in_order_and_within_its_limit() {
        let rows: BTreeMap<RowKey, Value> =
            (1..=5).map(|k| (RowKey::new(1, k * 10), Value::copy_from(&[k as u8]))).collect();
        let writes = vec![(RowKey::new(1, 25), Some(Value::copy_from(&[9]))), (RowKey::new(1, 30), None)];
        let mut o = Overlay { rows: &rows, writes, scans: None };
        let Step::Ready(Ok(up)) = o.scan(Scan { table: 1, lo: 10, hi: 50, limit: 3, descending: false }) else {
            panic!()
        };
        assert_eq!(up.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [10, 20, 25]);
        let Step::Ready(Ok(down)) = o.scan(Scan { table: 1, lo: 0, hi: 35, limit: 10, descending: true }) else {
            panic!()
        };
        assert_eq!(down.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [25, 20, 10], "30 was deleted by the run");
    }
}
