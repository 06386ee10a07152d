//! Bank: accounts spread over every partition, transfers between two random accounts, and
//! read-only audits that sum every balance. Transfers move money, never create it, so every
//! audit that commits must see `accounts × 1000`: the invariant of Rolis's correctness argument.
//!
//! - `--accounts` in total (0 = 1000 per partition), each starting with a balance of 1000.
//!   Account a lives in partition a % partitions; its key is `partition * stride + a / partitions`
//!   (stride = ⌈accounts / partitions⌉), so each partition's accounts are one dense key range.
//! - A transfer moves 1..=10 from one account to another. Both are in the client's home
//!   partition, except for a fraction `--distributed` where the second one is in a partition of
//!   another node. Inside a partition accounts are drawn from a Zipf distribution (`--theta`).
//!   A transfer that would take a balance below zero rolls back (`Abort::User`: counted, not
//!   retried).
//! - A fraction `--audit-ratio` of transactions are audits: they read every account. Each attempt
//!   leaves the total it saw in its request; the driver's `on_commit` records it (an attempt that
//!   aborts may have seen an inconsistent state, so only committed ones count), and
//!   `process_findings` reports, on every node's process, whether every audit saw the invariant
//!   total. The final audit of `final_checks` checks the state the run left (`check_output`).

use super::{remote_partition, zipf::Zipf, Procedures, Workload, WorkloadParams};
use crate::cluster::{PartitionId, Topology};
use crate::storage::{RowKey, TableDef, Value};
use crate::txn::{decode_args, encode_args, Abort, Args, Ctx, KeySet, ProcFuture, RequestError, TxnOutput, TxnRequest};
use crate::util::Rng;
use anyhow::bail;
use parking_lot::Mutex;
use rand::Rng as _;
use std::sync::atomic::{AtomicU64, Ordering};

const TABLE: u16 = 0;
pub const INITIAL_BALANCE: i64 = 1000;
pub const TRANSFER_PROC: &str = "transfer";
pub const AUDIT_PROC: &str = "audit";

pub struct Bank {
    accounts: u64,
    partitions: u32,
    stride: u64,
    topo: Topology,
    zipf: Zipf,
    distributed: f64,
    audit_ratio: f64,
    /// Totals seen by committed audits in this process.
    audits: Mutex<Vec<i64>>,
    /// Audits this process issued (committed or not).
    audits_issued: AtomicU64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TransferArgs {
    pub from: u64,
    pub to: u64,
    pub amount: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AuditArgs {
    /// The final audit of `final_checks` (reported on its own).
    pub last: bool,
}

impl Bank {
    pub fn new(p: &WorkloadParams, topo: &Topology) -> anyhow::Result<Self> {
        let partitions = topo.partitions();
        let accounts = if p.accounts == 0 { 1000 * partitions as u64 } else { p.accounts };
        if !(2..=50_000_000).contains(&accounts) {
            bail!("--accounts {accounts} must be between 2 and 50,000,000");
        }
        if !(0.0..=1.0).contains(&p.distributed) {
            bail!("--distributed {} must be within 0..1", p.distributed);
        }
        if !(0.0..=1.0).contains(&p.audit_ratio) {
            bail!("--audit-ratio {} must be within 0..1", p.audit_ratio);
        }
        let stride = accounts.div_ceil(partitions as u64);
        let zipf = Zipf::new(stride, p.theta).map_err(|e| anyhow::anyhow!("--theta {}: {e}", p.theta))?;
        Ok(Bank {
            accounts,
            partitions,
            stride,
            topo: topo.clone(),
            zipf,
            distributed: p.distributed,
            audit_ratio: p.audit_ratio,
            audits: Mutex::new(Vec::new()),
            audits_issued: AtomicU64::new(0),
        })
    }

    pub fn expected_total(&self) -> i64 {
        self.accounts as i64 * INITIAL_BALANCE
    }

    /// Accounts in partition p: those a with a % partitions == p.
    fn count(&self, p: PartitionId) -> u64 {
        (self.accounts + self.partitions as u64 - 1 - p as u64) / self.partitions as u64
    }

    /// The key of account a.
    pub fn key(&self, a: u64) -> RowKey {
        RowKey::new(TABLE, (a % self.partitions as u64) * self.stride + a / self.partitions as u64)
    }

    /// A Zipf-distributed account key of partition p (any account if p holds none).
    fn pick(&self, rng: &mut Rng, p: PartitionId) -> u64 {
        let n = self.count(p);
        if n == 0 {
            return self.key(rng.gen_range(0..self.accounts)).key;
        }
        loop {
            let r = self.zipf.sample(rng);
            if r < n {
                return p as u64 * self.stride + r;
            }
        }
    }

    fn all_keys(&self) -> impl Iterator<Item = RowKey> + '_ {
        (0..self.partitions)
            .flat_map(move |p| (0..self.count(p)).map(move |r| RowKey::new(TABLE, p as u64 * self.stride + r)))
    }

    fn audit_request(&self, home: PartitionId, last: bool) -> TxnRequest {
        TxnRequest::new(AUDIT_PROC, home, AuditArgs { last })
    }
}

fn balance(v: &[u8]) -> i64 {
    v.get(..8).map_or(0, |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
}

fn value(b: i64) -> Value {
    Value::copy_from(&b.to_le_bytes())
}

impl Procedures for Bank {
    fn encode_args(&self, req: &TxnRequest) -> Vec<u8> {
        match req.proc {
            TRANSFER_PROC => encode_args::<TransferArgs>(req),
            _ => encode_args::<AuditArgs>(req),
        }
    }

    fn decode_args(&self, proc: &'static str, bytes: &[u8]) -> Result<Args, RequestError> {
        match proc {
            TRANSFER_PROC => decode_args::<TransferArgs>(proc, bytes),
            _ => decode_args::<AuditArgs>(proc, bytes),
        }
    }

    fn tables(&self, partitions: &[PartitionId]) -> Vec<TableDef> {
        let dense = partitions
            .iter()
            .map(|&p| p as u64 * self.stride..p as u64 * self.stride + self.count(p))
            .filter(|r| !r.is_empty())
            .collect();
        vec![TableDef { name: "accounts", ordered: false, expected_rows: 0, dense, ..Default::default() }]
    }

    fn scans(&self) -> bool {
        false
    }

    fn read_only(&self, req: &TxnRequest) -> bool {
        req.proc == AUDIT_PROC
    }

    fn procedures(&self) -> &'static [&'static str] {
        &[TRANSFER_PROC, AUDIT_PROC]
    }

    fn partition_of(&self, key: RowKey) -> PartitionId {
        ((key.key / self.stride) as u32).min(self.partitions - 1)
    }

    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value)) {
        let v = value(INITIAL_BALANCE);
        for r in 0..self.count(p) {
            sink(RowKey::new(TABLE, p as u64 * self.stride + r), v.clone());
        }
    }

    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool {
        match req.args.downcast_ref::<TransferArgs>() {
            Some(t) => {
                keys.writes.push(RowKey::new(TABLE, t.from));
                keys.writes.push(RowKey::new(TABLE, t.to));
            }
            // Every key, distinct: pushed without the de-duplicating `KeySet::read`.
            None => keys.reads.extend(self.all_keys()),
        }
        true
    }

    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a> {
        Box::pin(async move {
            if let Some(t) = req.args.downcast_ref::<TransferArgs>() {
                let (from, to) = (RowKey::new(TABLE, t.from), RowKey::new(TABLE, t.to));
                let a = balance(&ctx.read_for_update(from).await?.ok_or(Abort::User)?);
                let b = balance(&ctx.read_for_update(to).await?.ok_or(Abort::User)?);
                if a < t.amount {
                    return Err(Abort::User);
                }
                ctx.write(from, value(a - t.amount)).await?;
                ctx.write(to, value(b + t.amount)).await?;
                return Ok(TxnOutput::default());
            }
            let mut total = 0i64;
            for k in self.all_keys() {
                total += ctx.read(k).await?.as_deref().map_or(0, balance);
            }
            // The total this attempt saw: the workload counts it only once the audit committed.
            Ok(TxnOutput { reported: vec![total], ..Default::default() })
        })
    }
}

impl Workload for Bank {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn txn_classes(&self) -> &'static [&'static str] {
        &[TRANSFER_PROC, AUDIT_PROC]
    }

    fn txn_class(&self, req: &TxnRequest) -> u8 {
        u8::from(req.proc != TRANSFER_PROC)
    }

    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest {
        if rng.gen_bool(self.audit_ratio) {
            self.audits_issued.fetch_add(1, Ordering::Relaxed);
            return self.audit_request(home, false);
        }
        let from = self.pick(rng, home);
        let other = if self.topo.nodes > 1 && rng.gen_bool(self.distributed) {
            remote_partition(rng, &self.topo, home)
        } else {
            home
        };
        let mut to = self.pick(rng, other);
        while to == from {
            to = self.key(rng.gen_range(0..self.accounts)).key;
        }
        let args = TransferArgs { from, to, amount: rng.gen_range(1..=10) };
        TxnRequest::new(TRANSFER_PROC, home, args)
    }

    fn watches_commits(&self) -> bool {
        true
    }

    fn on_commit(&self, req: &TxnRequest, out: &TxnOutput) {
        if let (Some(a), Some(&seen)) = (req.args.downcast_ref::<AuditArgs>(), out.reported.first()) {
            if !a.last {
                self.audits.lock().push(seen);
            }
        }
    }

    fn final_checks(&self) -> Vec<TxnRequest> {
        vec![self.audit_request(0, true)]
    }

    /// The final audit (once it committed): whether it saw the invariant total.
    fn check_output(&self, req: &TxnRequest, out: &TxnOutput) -> Vec<(String, bool, String)> {
        let want = self.expected_total();
        match (req.args.downcast_ref::<AuditArgs>(), out.reported.first()) {
            (Some(a), Some(&seen)) if a.last => {
                let rel = if seen == want { "=" } else { "≠" };
                let detail = format!("{seen} {rel} {} accounts x {INITIAL_BALANCE}", self.accounts);
                vec![("bank total (final audit)".to_string(), seen == want, detail)]
            }
            _ => Vec::new(),
        }
    }

    /// The audits this process saw commit during the run: whether every one saw the invariant
    /// total (drained: a second call reports only audits since the first). When audits were
    /// issued but none committed (long read-only transactions can starve under OCC), says so.
    fn process_findings(&self) -> Vec<(String, bool, String)> {
        let want = self.expected_total();
        let audits = std::mem::take(&mut *self.audits.lock());
        let issued = self.audits_issued.swap(0, Ordering::Relaxed);
        let cond = "bank total (audits during the run)".to_string();
        if audits.is_empty() {
            if issued == 0 {
                return Vec::new();
            }
            return vec![(cond, true, format!("none of the {issued} audits issued committed: nothing to check"))];
        }
        let bad: Vec<i64> = audits.iter().copied().filter(|&s| s != want).collect();
        let detail = if bad.is_empty() {
            format!("{} audits (of {issued} issued) committed, each saw {want}", audits.len())
        } else {
            let shown: Vec<String> = bad.iter().take(10).map(|b| b.to_string()).collect();
            format!("{} of {} audits saw another total than {want}: {}", bad.len(), audits.len(), shown.join(", "))
        };
        vec![(cond, bad.is_empty(), detail)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, loaded, run_direct};

    fn bank(accounts: u64, nodes: u16, parts: u32) -> Bank {
        let p = WorkloadParams { name: "bank".into(), accounts, distributed: 0.3, ..Default::default() };
        Bank::new(&p, &Topology::new(nodes, 1, parts)).unwrap()
    }

    #[test]
    fn accounts_spread_over_partitions_densely() {
        let b = bank(10, 2, 2); // 4 partitions: 3, 3, 2, 2 accounts
        assert_eq!((0..4).map(|p| b.count(p)).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
        let mut keys: Vec<u64> = (0..10).map(|a| b.key(a).key).collect();
        for a in 0..10u64 {
            assert_eq!(b.partition_of(b.key(a)), (a % 4) as u32);
        }
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 10);
        assert_eq!(b.all_keys().count(), 10);
        let mut loaded = 0;
        for p in 0..4 {
            let def = &b.tables(&[p])[0];
            b.load_partition(p, &mut |k, v| {
                assert!(def.dense.iter().any(|r| r.contains(&k.key)));
                assert_eq!(balance(&v), INITIAL_BALANCE);
                loaded += 1;
            });
        }
        assert_eq!(loaded, 10);
        assert_eq!(bank(0, 2, 1).accounts, 2000, "default: 1000 per partition");
    }

    #[test]
    fn transfers_are_local_or_cross_node_as_asked() {
        let b = bank(0, 2, 1);
        let mut rng = crate::util::rng_from_seed(7);
        let (mut transfers, mut remote, mut audits) = (0, 0, 0);
        for _ in 0..20_000 {
            let req = b.next(&mut rng, 1);
            match req.args.downcast_ref::<TransferArgs>() {
                Some(t) => {
                    transfers += 1;
                    assert_ne!(t.from, t.to);
                    assert!((1..=10).contains(&t.amount));
                    assert_eq!(b.partition_of(RowKey::new(TABLE, t.from)), 1);
                    remote += (b.partition_of(RowKey::new(TABLE, t.to)) != 1) as u32;
                }
                None => audits += 1,
            }
        }
        let frac = remote as f64 / transfers as f64;
        assert!((0.27..0.33).contains(&frac), "cross-node fraction {frac}");
        let a = audits as f64 / 20_000.0;
        assert!((0.04..0.06).contains(&a), "audit fraction {a}");
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let topo = Topology::new(1, 1, 1);
        for (p, want) in [
            (WorkloadParams { accounts: 1, ..Default::default() }, "--accounts 1"),
            (WorkloadParams { audit_ratio: 2.0, ..Default::default() }, "--audit-ratio 2"),
            (WorkloadParams { distributed: -1.0, ..Default::default() }, "--distributed -1"),
            (WorkloadParams { theta: -1.0, ..Default::default() }, "--theta -1"),
        ] {
            let err = Bank::new(&p, &topo).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(want), "`{err}` lacks `{want}`");
        }
    }

    #[test]
    fn direct_transfers_keep_the_total_and_refuse_overdrafts() {
        let b = bank(20, 1, 2);
        let store = loaded(&b, &[0, 1]);
        let mut rng = crate::util::rng_from_seed(3);
        for _ in 0..2000 {
            let req = b.next(&mut rng, 0);
            let _ = run_direct(&b, &store, &req).map(|out| b.on_commit(&req, &out));
        }
        // An overdraft rolls back.
        let (from, to) = (b.key(0).key, b.key(1).key);
        let req = TxnRequest {
            proc: TRANSFER_PROC,
            home: 0,
            args: std::sync::Arc::new(TransferArgs { from, to, amount: 1 << 40 }),
        };
        assert_eq!(run_direct(&b, &store, &req).err(), Some(Abort::User));
        let fin = b.final_checks().pop().unwrap();
        let out = run_direct(&b, &store, &fin).unwrap();
        let mut results = b.check_output(&fin, &out);
        results.extend(b.process_findings());
        assert_eq!(results.len(), 2, "{results:?}");
        assert!(b.process_findings().is_empty(), "drained");
        assert!(results.iter().all(|r| r.1), "{results:?}");
    }

    #[test]
    fn every_protocol_keeps_the_bank_total_in_simulation() {
        // Without a log (`testkit::run` keeps none): `rolis` runs the bank in tests/sim_tpcc_bank.rs.
        for p in crate::protocols::ready_with(crate::replication::Durability::None, 3) {
            for (one_shot, seed) in [(true, 1), (false, 2)] {
                let wl = WorkloadParams {
                    name: "bank".into(),
                    accounts: 200,
                    theta: 0.8,
                    distributed: 0.3,
                    audit_ratio: 0.05,
                    ..Default::default()
                };
                let mut spec = crate::host::BenchSpec::new(p.name, wl, crate::host::Runtime::Sim);
                spec.nodes = 2;
                spec.inflight = 16;
                // Audits must commit during the run: under epochs a client's every transaction
                // waits for its epoch (about 45 ms here, where long interactive audits stretch
                // each epoch's close), so the run is longer.
                spec.duration_us = if crate::protocols::acknowledges_by_epoch(p) { 1_000_000 } else { 200_000 };
                spec.warmup_us = 0;
                spec.latency.delay_us = 100;
                spec.latency.jitter_us = 50;
                spec.seed = seed;
                spec.proto.one_shot = one_shot;
                let run = testkit::run(&spec);
                let what = format!("{} one_shot={one_shot}", p.name);
                run.assert_checks_pass(&what);
                assert!(run.committed.get(TRANSFER_PROC).copied().unwrap_or(0) > 100, "{what}: {run:?}");
                let audits: Vec<_> = run.checks.iter().filter(|c| c.1.contains("during the run")).collect();
                assert!(
                    audits.len() == 1 && audits[0].3.contains("each saw"),
                    "{what}: no audit committed during the run: {run:?}"
                );
                assert!(run.checks.iter().any(|c| c.1.contains("final audit")), "{what}: {:?}", run.checks);
            }
        }
    }
}
