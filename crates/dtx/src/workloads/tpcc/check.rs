//! TPC-C consistency conditions 1-4 (clause 3.3.2.1 - 3.3.2.4), checked after a run by
//! read-only "tpcc-check" transactions, per warehouse:
//! 1. W_YTD = sum(D_YTD);
//! 2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID), per district;
//! 3. max(NO_O_ID) - min(NO_O_ID) + 1 = the number of NEW-ORDER rows, per district;
//! 4. sum(O_OL_CNT) = the number of ORDER-LINE rows, per district.
//!
//! A warehouse holds tens of thousands of orders and ten times as many order lines; a
//! transaction's cost grows faster than linearly with the rows it has seen (protocols keep read
//! sets as vectors), so the check is many small transactions: one header per warehouse (the
//! year-to-date balances, D_NEXT_O_ID, and any ORDER or NEW-ORDER row at or above D_NEXT_O_ID),
//! then per district `chunks` transactions, each scanning ORDER, NEW-ORDER and ORDER-LINE over
//! one range of order ids (the ranges split [1, D_NEXT_O_ID) evenly, at least [`MIN_SPAN`]
//! orders each; chunks past the end do nothing and cost no message).
//!
//! Each attempt of a check transaction leaves its findings in its request; `check_output`,
//! called once the request committed, folds them into the warehouse's totals, and once every
//! request of a warehouse is folded (or the last request of all is) gives the verdicts.

use super::schema::*;
use super::Tpcc;
use crate::storage::RowKey;
use crate::txn::{Ctx, KeySet, Scan, TxnOutput, TxnRequest, TxnResult};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

pub const CHECK_PROC: &str = "tpcc-check";
/// Fewest orders a chunk covers (about 12 rows each: the order, its lines, its NEW-ORDER row).
pub const MIN_SPAN: u32 = 64;

/// (condition, warehouse, passed, detail).
pub type CheckResult = (String, u32, bool, String);

pub const COND_1: &str = "3.3.2.1 W_YTD = sum(D_YTD)";
pub const COND_2: &str = "3.3.2.2 D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)";
pub const COND_3: &str = "3.3.2.3 max(NO_O_ID) - min(NO_O_ID) + 1 = rows in NEW-ORDER";
pub const COND_4: &str = "3.3.2.4 sum(O_OL_CNT) = rows in ORDER-LINE";

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub enum What {
    Header,
    Chunk { d: u32, k: u32, of: u32 },
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct CheckArgs {
    pub w: u32,
    pub what: What,
    /// The last check request of the run: verdicts for every warehouse seen are given then.
    pub last: bool,
    /// What the committed attempt found, for `output` in the process that ran it. Not part of
    /// the request as data: a check runs where its client is (`final_checks` run on node 0).
    #[serde(skip)]
    found: Mutex<Option<Found>>,
}

#[derive(Debug, Clone)]
enum Found {
    Header(Box<HeaderFound>),
    Chunk(u32, ChunkFound),
}

#[derive(Debug, Clone, Default)]
struct HeaderFound {
    w_ytd: i64,
    d_ytd: [i64; 10],
    next: [u32; 10],
    /// ORDER and NEW-ORDER rows with o_id ≥ D_NEXT_O_ID (there must be none).
    orders_from_next: [u64; 10],
    no_from_next: [u64; 10],
}

#[derive(Debug, Clone, Copy, Default)]
struct ChunkFound {
    next: u32,
    orders: u64,
    max_o: u32,
    sum_ol_cnt: u64,
    ol_rows: u64,
    no_rows: u64,
    no_min: u32,
    no_max: u32,
}

impl ChunkFound {
    fn fold(&mut self, o: &ChunkFound) {
        if o.no_rows > 0 {
            self.no_min = if self.no_rows > 0 { self.no_min.min(o.no_min) } else { o.no_min };
            self.no_max = self.no_max.max(o.no_max);
        }
        self.orders += o.orders;
        self.max_o = self.max_o.max(o.max_o);
        self.sum_ol_cnt += o.sum_ol_cnt;
        self.ol_rows += o.ol_rows;
        self.no_rows += o.no_rows;
    }
}

#[derive(Default)]
struct WhAcc {
    header: Option<HeaderFound>,
    d: [ChunkFound; 10],
    /// D_NEXT_O_ID as the chunks saw it (min, max), to notice a database that changed.
    chunk_next: [(u32, u32); 10],
    folded: u32,
    expected: u32,
    done: bool,
}

#[derive(Default)]
pub struct CheckState {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    acc: FxHashMap<u32, WhAcc>,
    /// D_NEXT_O_ID per (w, d) as the header saw it: lets a chunk past the end skip everything.
    next_hint: FxHashMap<(u32, u32), u32>,
    results: Vec<CheckResult>,
}

/// Chunks per district: about 2048 per warehouse in total, at least 32.
pub fn chunks_per_district(warehouses: u32) -> u32 {
    (2048 / warehouses.max(1)).max(32)
}

/// The check requests: per warehouse a header, then the chunks of each district.
pub fn requests(t: &Tpcc) -> Vec<TxnRequest> {
    // A new round of checks: forget what an earlier one found.
    *t.check.inner.lock() = Inner::default();
    let of = chunks_per_district(t.warehouses);
    let mut out = Vec::with_capacity(t.warehouses as usize * (1 + 10 * of as usize));
    for w in 1..=t.warehouses {
        let home = (w - 1) % t.partitions;
        let mk = |what| TxnRequest::new(CHECK_PROC, home, CheckArgs { w, what, last: false, found: Mutex::new(None) });
        out.push(mk(What::Header));
        for d in 1..=DISTRICTS {
            for k in 0..of {
                out.push(mk(What::Chunk { d, k, of }));
            }
        }
    }
    if let Some(last) = out.last_mut() {
        let a = last.args::<CheckArgs>();
        // Just built, so not shared: replaced rather than changed in place.
        let args = CheckArgs { w: a.w, what: a.what, last: true, found: Mutex::new(None) };
        *last = TxnRequest::new(CHECK_PROC, last.home, args);
    }
    out
}

/// The order ids chunk k of `of` covers when the district's D_NEXT_O_ID is `next` (empty
/// when lo > hi).
fn chunk_range(next: u32, k: u32, of: u32) -> (u32, u32) {
    let orders = next.saturating_sub(1);
    let span = orders.div_ceil(of).max(MIN_SPAN);
    let lo = (k as u64 * span as u64 + 1).min(u32::MAX as u64) as u32;
    let hi = if k + 1 == of { orders } else { ((k as u64 + 1) * span as u64).min(orders as u64) as u32 };
    (lo, hi)
}

fn chunk_is_empty(next: u32, k: u32, of: u32) -> bool {
    let (lo, hi) = chunk_range(next, k, of);
    lo > hi
}

impl CheckState {
    fn hint(&self, w: u32, d: u32) -> Option<u32> {
        self.inner.lock().next_hint.get(&(w, d)).copied()
    }
}

pub fn declare(t: &Tpcc, a: &CheckArgs, keys: &mut KeySet) -> bool {
    match a.what {
        What::Header => {
            keys.reads.push(warehouse_key(a.w, W_YTD_PART));
            for d in 1..=DISTRICTS {
                keys.reads.push(district_key(a.w, d, D_YTD_PART));
                keys.reads.push(district_key(a.w, d, D_NEXT_PART));
            }
        }
        // Scans are not part of a declaration: a chunk that has work declares the district's
        // D_NEXT_O_ID (which it reads), so the declaration names the partition it scans; one the
        // header's hint shows to be past the end declares and touches nothing.
        What::Chunk { d, k, of } => {
            if !t.check.hint(a.w, d).is_some_and(|next| chunk_is_empty(next, k, of)) {
                keys.reads.push(district_key(a.w, d, D_NEXT_PART));
            }
        }
    }
    true
}

async fn scan_all(
    ctx: &mut Ctx<'_>,
    table: u16,
    lo: RowKey,
    hi: RowKey,
) -> TxnResult<Vec<(u64, crate::storage::Value)>> {
    ctx.scan(Scan { table, lo: lo.key, hi: hi.key, limit: u32::MAX, descending: false }).await
}

pub async fn run(t: &Tpcc, a: &CheckArgs, ctx: &mut Ctx<'_>) -> TxnResult<TxnOutput> {
    let w = a.w;
    let found = match a.what {
        What::Header => {
            let mut h = HeaderFound {
                w_ytd: i64_at(&ctx.read(warehouse_key(w, W_YTD_PART)).await?.unwrap_or_default(), ytd::YTD),
                ..Default::default()
            };
            for d in 1..=DISTRICTS {
                let i = d as usize - 1;
                h.d_ytd[i] = i64_at(&ctx.read(district_key(w, d, D_YTD_PART)).await?.unwrap_or_default(), ytd::YTD);
                let next = u32_at(&ctx.read(district_key(w, d, D_NEXT_PART)).await?.unwrap_or_default(), next_o::O_ID);
                h.next[i] = next;
                h.orders_from_next[i] =
                    scan_all(ctx, ORDER, order_key(w, d, next), order_key(w, d, u32::MAX)).await?.len() as u64;
                h.no_from_next[i] = scan_all(ctx, NEW_ORDER, new_order_key(w, d, next), new_order_key(w, d, u32::MAX))
                    .await?
                    .len() as u64;
                t.check.inner.lock().next_hint.insert((w, d), next);
            }
            Found::Header(Box::new(h))
        }
        What::Chunk { d, k, of } => {
            let next = match t.check.hint(w, d) {
                Some(n) if chunk_is_empty(n, k, of) => n,
                _ => u32_at(&ctx.read(district_key(w, d, D_NEXT_PART)).await?.unwrap_or_default(), next_o::O_ID),
            };
            let mut c = ChunkFound { next, ..Default::default() };
            let (lo, hi) = chunk_range(next, k, of);
            if lo <= hi {
                for (key, v) in scan_all(ctx, ORDER, order_key(w, d, lo), order_key(w, d, hi)).await? {
                    c.orders += 1;
                    c.max_o = c.max_o.max(order_of(key));
                    c.sum_ol_cnt += u32_at(&v, order::OL_CNT) as u64;
                }
                let no = scan_all(ctx, NEW_ORDER, new_order_key(w, d, lo), new_order_key(w, d, hi)).await?;
                c.no_rows = no.len() as u64;
                c.no_min = no.first().map_or(0, |r| order_of(r.0));
                c.no_max = no.last().map_or(0, |r| order_of(r.0));
                c.ol_rows = scan_all(ctx, ORDER_LINE, order_line_key(w, d, lo, 0), order_line_key(w, d, hi, 15))
                    .await?
                    .len() as u64;
            }
            Found::Chunk(d, c)
        }
    };
    *a.found.lock() = Some(found);
    Ok(TxnOutput::default())
}

/// Fold a committed check request's findings; verdicts when a warehouse is complete.
pub fn output(t: &Tpcc, req: &TxnRequest) -> Vec<(String, bool, String)> {
    let Some(a) = req.args.downcast_ref::<CheckArgs>() else {
        return Vec::new();
    };
    let expected = 1 + DISTRICTS * chunks_per_district(t.warehouses);
    let mut g = t.check.inner.lock();
    let inner = &mut *g;
    if let Some(found) = a.found.lock().take() {
        let acc = inner.acc.entry(a.w).or_insert_with(|| WhAcc { expected, ..Default::default() });
        acc.folded += 1;
        match found {
            Found::Header(h) => acc.header = Some(*h),
            Found::Chunk(d, c) => {
                let i = d as usize - 1;
                let seen = &mut acc.chunk_next[i];
                *seen = if seen.1 == 0 { (c.next, c.next) } else { (seen.0.min(c.next), seen.1.max(c.next)) };
                acc.d[i].fold(&c);
            }
        }
        if acc.folded == acc.expected && !acc.done {
            acc.done = true;
            verdicts(a.w, acc, &mut inner.results);
        }
    }
    if a.last {
        let mut pending: Vec<u32> = inner.acc.iter().filter(|(_, acc)| !acc.done).map(|(w, _)| *w).collect();
        pending.sort_unstable();
        for w in pending {
            if let Some(acc) = inner.acc.get_mut(&w) {
                acc.done = true;
                verdicts(w, acc, &mut inner.results);
            }
        }
    }
    inner.results.drain(..).map(|(cond, w, ok, detail)| (format!("{cond} [w={w}]"), ok, detail)).collect()
}

fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.unsigned_abs() / 100, cents.unsigned_abs() % 100)
}

fn verdicts(w: u32, acc: &WhAcc, out: &mut Vec<CheckResult>) {
    let conds = [COND_1, COND_2, COND_3, COND_4];
    let Some(h) = &acc.header else {
        for c in conds {
            out.push((c.to_string(), w, false, "the check's header transaction did not run".into()));
        }
        return;
    };
    let incomplete = (acc.folded < acc.expected)
        .then(|| format!("; incomplete: {} of {} check transactions ran", acc.folded, acc.expected));
    let sum: i64 = h.d_ytd.iter().sum();
    out.push((
        COND_1.into(),
        w,
        h.w_ytd == sum,
        format!("W_YTD {} {} sum(D_YTD) {}", money(h.w_ytd), if h.w_ytd == sum { "=" } else { "≠" }, money(sum)),
    ));
    let mut bad = [Vec::new(), Vec::new(), Vec::new()];
    let (mut orders, mut no_rows, mut ol_rows) = (0u64, 0u64, 0u64);
    for i in 0..10 {
        let (c, d, next) = (&acc.d[i], i + 1, h.next[i].max(1));
        orders += c.orders;
        no_rows += c.no_rows;
        ol_rows += c.ol_rows;
        let (lo, hi) = acc.chunk_next[i];
        if lo != hi || (hi != 0 && hi != next) {
            let msg = format!("d={d}: D_NEXT_O_ID changed during the check ({next}, then {lo}..{hi})");
            for b in &mut bad {
                b.push(msg.clone());
            }
        }
        if c.max_o != next - 1 || h.orders_from_next[i] > 0 {
            bad[0].push(format!(
                "d={d}: D_NEXT_O_ID - 1 = {}, max(O_ID) = {}{}",
                next - 1,
                if h.orders_from_next[i] > 0 { next } else { c.max_o },
                if h.orders_from_next[i] > 0 { "+" } else { "" }
            ));
        }
        if h.no_from_next[i] > 0 || (c.no_rows > 0 && c.no_max != next - 1) {
            bad[0].push(format!(
                "d={d}: D_NEXT_O_ID - 1 = {}, max(NO_O_ID) = {}{}",
                next - 1,
                if h.no_from_next[i] > 0 { next } else { c.no_max },
                if h.no_from_next[i] > 0 { "+" } else { "" }
            ));
        }
        if c.no_rows > 0 && (c.no_max.saturating_sub(c.no_min) + 1) as u64 != c.no_rows {
            bad[1]
                .push(format!("d={d}: max(NO_O_ID) {} - min(NO_O_ID) {} + 1 ≠ {} rows", c.no_max, c.no_min, c.no_rows));
        }
        if c.sum_ol_cnt != c.ol_rows {
            bad[2].push(format!("d={d}: sum(O_OL_CNT) {} ≠ {} ORDER-LINE rows", c.sum_ol_cnt, c.ol_rows));
        }
    }
    let summaries = [
        format!("10 districts, {orders} orders"),
        format!("10 districts, {no_rows} NEW-ORDER rows"),
        format!("10 districts, {ol_rows} ORDER-LINE rows"),
    ];
    for ((cond, b), summary) in [COND_2, COND_3, COND_4].into_iter().zip(bad).zip(summaries) {
        let ok = b.is_empty() && incomplete.is_none();
        let mut detail = if b.is_empty() { summary } else { b.join("; ") };
        if let Some(inc) = &incomplete {
            detail.push_str(inc);
        }
        out.push((cond.into(), w, ok, detail));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_order_once() {
        for next in [1u32, 2, 65, 3001, 3002, 50_000, 1_000_001] {
            for of in [1u32, 7, 32, 1024] {
                let mut covered = 0u64;
                let mut expect_lo = 1u32;
                for k in 0..of {
                    let (lo, hi) = chunk_range(next, k, of);
                    if lo > hi {
                        continue;
                    }
                    assert_eq!(lo, expect_lo, "next {next} of {of} k {k}");
                    covered += (hi - lo + 1) as u64;
                    expect_lo = hi + 1;
                }
                assert_eq!(covered, next as u64 - 1, "next {next} of {of}");
            }
        }
    }
}
