//! TPC-C (revision 5.11), clauses 1-3: the nine tables, their population, the five
//! transactions and the consistency conditions 1-4.
//!
//! - [`schema`]: table ids, key packing, row layouts (and the vertical split of WAREHOUSE,
//!   DISTRICT and CUSTOMER into a static and a mutable row).
//! - [`load`]: population, NURand, last names, random strings.
//! - [`procs`]: New-Order, Payment, Order-Status, Delivery, Stock-Level; how each lookup that
//!   is not by key is done.
//! - [`check`]: consistency conditions 1-4 as read-only check transactions.
//!
//! Placement: `--warehouses` in total, warehouse w in partition (w-1) % partitions, so they
//! spread over every node. A client homed at partition p works for a warehouse of p, chosen
//! uniformly (the home warehouse of clause 2.1.x's terminal); when there are fewer warehouses
//! than partitions, a client homed at a partition without one uses warehouse p % W + 1 (remote).
//! ITEM is replicated to every partition by default (see `schema`).
//!
//! Remote transactions: `--payment-remote` is the spec's 15% of Payments for a customer of
//! another warehouse (chosen uniformly, any district). `--neworder-remote` is the fraction of
//! New-Orders with a remote supply warehouse: such an order has exactly one line (chosen
//! uniformly) supplied by another warehouse (chosen uniformly), the others by the home one.
//! With one warehouse every transaction is local.

pub mod check;
pub mod load;
pub mod procs;
pub mod schema;

use super::{Procedures, Workload, WorkloadParams};
use crate::cluster::{PartitionId, Topology};
use crate::storage::{Layout, RowKey, TableDef, Value};
use crate::txn::{decode_args, encode_args, Abort, Args, Ctx, KeySet, ProcFuture, RequestError, TxnOutput, TxnRequest};
use crate::util::Rng;
use anyhow::bail;
use load::{nurand, C_ID, C_LAST_RUN, C_OL_I_ID};
use procs::*;
use rand::Rng as _;
use schema::*;
use std::ops::Range;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;

/// The standard mix (clause 5.2.3): New-Order, Payment, Order-Status, Delivery, Stock-Level.
pub const STANDARD_MIX: [u32; 5] = [45, 43, 4, 4, 4];
pub const NEWORDER_PAYMENT_MIX: [u32; 5] = [50, 50, 0, 0, 0];

pub struct Tpcc {
    pub(crate) warehouses: u32,
    pub(crate) partitions: u32,
    /// Cumulative percentages of the five transactions.
    mix_cum: [u32; 5],
    neworder_remote: f64,
    payment_remote: f64,
    item_replicated: bool,
    /// Fraction of customer selections by last name.
    by_last_name: f64,
    /// With `--remote-scope region`, per warehouse (index w - 1) the warehouses homed in
    /// another region, from which its remote warehouses are drawn; empty: any other warehouse.
    remote_choices: Vec<Vec<u32>>,
    history_seq: AtomicU32,
    /// Per district, what D_NEXT_O_ID probably holds, as this process last saw it (see `declare`).
    next_o_hint: Box<[AtomicU32]>,
    /// Per (w, d, last name), the customer a by-name lookup found (0 = not looked up yet). The
    /// by-name index never changes, so once learned the estimate is always right.
    by_name_hint: Box<[AtomicU16]>,
    pub(crate) check: check::CheckState,
}

/// `standard`, `neworder-payment`, or five percentages `NO,P,OS,D,SL` that sum to 100.
pub fn parse_mix(s: &str) -> anyhow::Result<[u32; 5]> {
    match s.trim() {
        "standard" => return Ok(STANDARD_MIX),
        "neworder-payment" => return Ok(NEWORDER_PAYMENT_MIX),
        _ => {}
    }
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let nums: Option<Vec<u32>> = parts.iter().map(|p| p.parse::<u32>().ok()).collect();
    match nums {
        Some(n) if n.len() == 5 => {
            let sum: u32 = n.iter().sum();
            if sum != 100 {
                bail!("--mix {s} sums to {sum}, not 100 (New-Order, Payment, Order-Status, Delivery, Stock-Level)");
            }
            Ok([n[0], n[1], n[2], n[3], n[4]])
        }
        _ => bail!(
            "--mix `{s}` is not a mix: use standard (45/43/4/4/4), neworder-payment (50/50), or five \
             percentages NO,P,OS,D,SL that sum to 100"
        ),
    }
}

/// Merge sorted, possibly adjacent ranges.
fn merged(mut rs: Vec<Range<u64>>) -> Vec<Range<u64>> {
    rs.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(rs.len());
    for r in rs {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

impl Tpcc {
    pub fn new(p: &WorkloadParams, topo: &Topology) -> anyhow::Result<Self> {
        if p.warehouses == 0 {
            bail!("--warehouses 0: TPC-C needs at least one warehouse");
        }
        if p.warehouses > MAX_WAREHOUSES {
            bail!("--warehouses {} is more than the limit of {MAX_WAREHOUSES}", p.warehouses);
        }
        if !(0.0..=1.0).contains(&p.neworder_remote) {
            bail!("--neworder-remote {} must be within 0..1", p.neworder_remote);
        }
        if !(0.0..=1.0).contains(&p.payment_remote) {
            bail!("--payment-remote {} must be within 0..1", p.payment_remote);
        }
        if !(0.0..=1.0).contains(&p.by_last_name) {
            bail!("--by-last-name {} must be within 0..1", p.by_last_name);
        }
        let remote_choices =
            if p.remote_in_other_region { Self::other_region_warehouses(p.warehouses, topo)? } else { vec![] };
        let mix = parse_mix(&p.mix)?;
        let mut mix_cum = [0; 5];
        let mut acc = 0;
        for (c, m) in mix_cum.iter_mut().zip(mix) {
            acc += m;
            *c = acc;
        }
        Ok(Tpcc {
            warehouses: p.warehouses,
            partitions: topo.partitions(),
            mix_cum,
            neworder_remote: p.neworder_remote,
            payment_remote: p.payment_remote,
            item_replicated: p.item_replicated,
            by_last_name: p.by_last_name,
            remote_choices,
            // Per process: a warehouse's node taken over by another process inserts history
            // rows from that process's range (16M payments each before ranges meet).
            history_seq: AtomicU32::new((p.process as u32) << 24),
            next_o_hint: (0..p.warehouses * DISTRICTS).map(|_| AtomicU32::new(ORDERS_LOADED + 1)).collect(),
            by_name_hint: (0..p.warehouses * DISTRICTS * 1000).map(|_| AtomicU16::new(0)).collect(),
            check: check::CheckState::default(),
        })
    }

    /// The warehouses whose partition is `p`.
    fn warehouses_of(&self, p: PartitionId) -> impl Iterator<Item = u32> {
        (p + 1..=self.warehouses).step_by(self.partitions as usize)
    }

    /// A warehouse for a client homed at `home`: one of the partition's, uniformly.
    pub fn home_warehouse(&self, rng: &mut Rng, home: PartitionId) -> u32 {
        if home >= self.warehouses {
            return home % self.warehouses + 1;
        }
        let count = (self.warehouses - 1 - home) / self.partitions + 1;
        home + 1 + self.partitions * if count > 1 { rng.gen_range(0..count) } else { 0 }
    }

    /// Per warehouse, the warehouses whose partition's home region is another one.
    fn other_region_warehouses(warehouses: u32, topo: &Topology) -> anyhow::Result<Vec<Vec<u32>>> {
        let partitions = topo.partitions();
        let region_of = |w: u32| topo.home_region((w - 1) % partitions);
        let choices: Vec<Vec<u32>> =
            (1..=warehouses).map(|w| (1..=warehouses).filter(|&o| region_of(o) != region_of(w)).collect()).collect();
        if let Some(w) = choices.iter().position(Vec::is_empty) {
            bail!(
                "--remote-scope region: warehouse {} has no warehouse homed in another region; give --regions with \
                 at least two regions of data nodes and enough --warehouses to reach them",
                w + 1
            );
        }
        Ok(choices)
    }

    fn other_warehouse(&self, rng: &mut Rng, w: u32) -> u32 {
        if let Some(choices) = self.remote_choices.get(w as usize - 1) {
            return choices[rng.gen_range(0..choices.len())];
        }
        let o = rng.gen_range(1..self.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }

    /// Which partition's ITEM copy a procedure homed at `home` reads for item `i`.
    #[inline]
    fn item_partition(&self, home: PartitionId, i: u32) -> PartitionId {
        if self.item_replicated {
            home
        } else {
            i % self.partitions
        }
    }

    fn customer_sel(&self, rng: &mut Rng) -> CustomerSel {
        // One draw from 0..100 as before the fraction was an option, so that runs at the spec's
        // 60% repeat their earlier seeds exactly.
        if (rng.gen_range(0..100) as f64) < self.by_last_name * 100.0 {
            CustomerSel::Last(nurand(rng, 255, 0, 999, C_LAST_RUN))
        } else {
            CustomerSel::Id(nurand(rng, 1023, 1, CUSTOMERS, C_ID))
        }
    }

    fn gen_new_order(&self, rng: &mut Rng, w: u32) -> NewOrderArgs {
        let n = rng.gen_range(5..=15usize);
        let mut lines = [Line::default(); 15];
        let remote = self.warehouses > 1 && rng.gen_bool(self.neworder_remote);
        let remote_at = rng.gen_range(0..n);
        for k in 0..n {
            // Distinct items, so that each line has its own STOCK row.
            let i = loop {
                let i = nurand(rng, 8191, 1, ITEMS, C_OL_I_ID);
                if !lines[..k].iter().any(|l| l.i == i) {
                    break i;
                }
            };
            let supply_w = if remote && k == remote_at { self.other_warehouse(rng, w) } else { w };
            lines[k] = Line { i, supply_w, qty: rng.gen_range(1..=10) };
        }
        // 1% roll back: the last item is unused (clause 2.4.1.4).
        if rng.gen_range(0..100) == 0 {
            lines[n - 1].i = UNUSED_ITEM;
        }
        lines[..n].sort_unstable_by_key(|l| (l.supply_w, l.i));
        let d = rng.gen_range(1..=DISTRICTS);
        let c = nurand(rng, 1023, 1, CUSTOMERS, C_ID);
        NewOrderArgs { w, d, c, n, lines, all_local: !remote, o_hint: self.o_hint(w, d).load(Ordering::Relaxed) }
    }

    #[inline]
    fn o_hint(&self, w: u32, d: u32) -> &AtomicU32 {
        &self.next_o_hint[((w - 1) * DISTRICTS + d - 1) as usize]
    }

    /// A New-Order that expected D_NEXT_O_ID = `hint` read `o`: if it was right, the next one
    /// will probably see o + 1 (this one commits); if not, o is what is there now.
    fn saw_next_o(&self, w: u32, d: u32, hint: u32, o: u32) {
        self.o_hint(w, d).store(if o == hint { o + 1 } else { o }, Ordering::Relaxed);
    }

    fn gen_payment(&self, rng: &mut Rng, w: u32, home: PartitionId) -> PaymentArgs {
        let d = rng.gen_range(1..=DISTRICTS);
        let (c_w, c_d) = if self.warehouses > 1 && rng.gen_bool(self.payment_remote) {
            (self.other_warehouse(rng, w), rng.gen_range(1..=DISTRICTS))
        } else {
            (w, d)
        };
        let cust = self.customer_sel(rng);
        let seq = self.history_seq.fetch_add(1, Ordering::Relaxed);
        let amount = rng.gen_range(100..=500_000);
        let mut a = PaymentArgs { w, d, c_w, c_d, cust, amount, h_key: history_key(w, home + 1, seq), c_hint: 0 };
        a.c_hint = self.c_hint(&a);
        a
    }

    fn by_name_slot(&self, w: u32, d: u32, last: u32) -> &AtomicU16 {
        &self.by_name_hint[(((w - 1) * DISTRICTS + d - 1) * 1000 + last.min(999)) as usize]
    }

    fn c_hint(&self, a: &PaymentArgs) -> u32 {
        match a.cust {
            CustomerSel::Id(_) => 0,
            CustomerSel::Last(last) => self.by_name_slot(a.c_w, a.c_d, last).load(Ordering::Relaxed) as u32,
        }
    }
}

impl Procedures for Tpcc {
    fn encode_args(&self, req: &TxnRequest) -> Vec<u8> {
        match req.proc {
            NEW_ORDER_PROC => encode_args::<NewOrderArgs>(req),
            PAYMENT_PROC => encode_args::<PaymentArgs>(req),
            ORDER_STATUS_PROC => encode_args::<OrderStatusArgs>(req),
            DELIVERY_PROC => encode_args::<DeliveryArgs>(req),
            STOCK_LEVEL_PROC => encode_args::<StockLevelArgs>(req),
            _ => encode_args::<check::CheckArgs>(req),
        }
    }

    fn decode_args(&self, proc: &'static str, bytes: &[u8]) -> Result<Args, RequestError> {
        match proc {
            NEW_ORDER_PROC => decode_args::<NewOrderArgs>(proc, bytes),
            PAYMENT_PROC => decode_args::<PaymentArgs>(proc, bytes),
            ORDER_STATUS_PROC => decode_args::<OrderStatusArgs>(proc, bytes),
            DELIVERY_PROC => decode_args::<DeliveryArgs>(proc, bytes),
            STOCK_LEVEL_PROC => decode_args::<StockLevelArgs>(proc, bytes),
            _ => decode_args::<check::CheckArgs>(proc, bytes),
        }
    }

    fn tables(&self, partitions: &[PartitionId]) -> Vec<TableDef> {
        let local: Vec<u32> = partitions.iter().flat_map(|&p| self.warehouses_of(p)).collect();
        let nw = local.len();
        // Dense ranges: `per` keys per warehouse, contiguous (see `schema`).
        let per_wh = |per: u64| merged(local.iter().map(|&w| (w as u64 - 1) * per..w as u64 * per).collect());
        let items: Vec<Range<u64>> = if self.item_replicated {
            partitions.iter().map(|&p| item_key(p, 1).key..item_key(p, ITEMS).key + 1).collect()
        } else {
            Vec::new()
        };
        let item_rows =
            if self.item_replicated { 0 } else { (ITEMS as usize / self.partitions as usize + 1) * partitions.len() };
        let t = |name: &'static str, ordered: bool, expected_rows: usize, dense: Vec<Range<u64>>| TableDef {
            name,
            ordered,
            expected_rows,
            dense,
            layout: Layout::Tree,
        };
        // Order ids have no gaps within a district: NEW-ORDER, ORDER and ORDER-LINE keys come in
        // dense ascending runs, so their records live in chunks (no B-tree insert per row).
        let chunked = |name, expected_rows| TableDef { layout: Layout::Chunks, ..t(name, true, expected_rows, vec![]) };
        let c = CUSTOMERS as usize * DISTRICTS as usize;
        // Indexed by table id.
        vec![
            t("warehouse", false, 0, per_wh(2)),
            t("district", false, 0, per_wh(30)),
            t("customer", false, 0, per_wh(2 * c as u64)),
            t("history", false, nw * c * 2, vec![]),
            chunked("new-order", nw * 9_000 * 3),
            chunked("order", nw * c * 2),
            chunked("order-line", nw * c * 10 * 2),
            t("item", false, item_rows, items),
            t("stock", false, 0, per_wh(ITEMS as u64)),
            // Scanned per (w, d, last name) and per (w, d, customer): one small group each.
            TableDef { layout: Layout::Groups(16), ..t("customer-by-name", true, nw * c, vec![]) },
            TableDef { layout: Layout::Groups(32), ..t("customer-order", true, nw * c * 2, vec![]) },
            t("delivery-cursor", false, 0, per_wh(DISTRICTS as u64)),
        ]
    }

    fn procedures(&self) -> &'static [&'static str] {
        &[NEW_ORDER_PROC, PAYMENT_PROC, ORDER_STATUS_PROC, DELIVERY_PROC, STOCK_LEVEL_PROC, check::CHECK_PROC]
    }

    /// Not the final check: it reads the state the run ended in.
    fn read_only(&self, req: &TxnRequest) -> bool {
        [ORDER_STATUS_PROC, STOCK_LEVEL_PROC].contains(&req.proc)
    }

    fn partition_of(&self, key: RowKey) -> PartitionId {
        schema::partition_of(key, self.partitions)
    }

    fn load_partition(&self, p: PartitionId, sink: &mut dyn FnMut(RowKey, Value)) {
        load::load_items(p, self.partitions, self.item_replicated, sink);
        for w in self.warehouses_of(p) {
            load::load_warehouse(w, sink);
        }
    }

    /// - New-Order: every key but the inserted ones (ORDER, NEW-ORDER, ORDER-LINE, the
    ///   customer-order index) follows from the arguments; those depend on D_NEXT_O_ID. The
    ///   arguments carry an estimate of it (`o_hint`: what this process saw last), and the
    ///   declaration uses it, as OLLP uses a reconnaissance result: if D_NEXT_O_ID turns out to be
    ///   another value, the run touches undeclared keys and aborts with `ReconMismatch`, and the
    ///   retry carries the value it saw. A whole reconnaissance run per New-Order is saved.
    /// - Payment: by customer id, keys follow from the arguments. By last name, the arguments
    ///   carry the customer this process's last lookup of that name found (the index never
    ///   changes, so after the first lookup of a name the estimate is always right); without one,
    ///   reconnaissance. The run still scans the index and picks the customer itself, so the
    ///   declaration names that scan too (Calvin's schedulers lock it as a range).
    /// - The check's header: keys follow from the arguments.
    /// - Everything else has keys that depend on reads (an index scan, the delivery cursor,
    ///   D_NEXT_O_ID for Stock-Level): false, and the engine discovers them by reconnaissance.
    fn declare(&self, req: &TxnRequest, keys: &mut KeySet) -> bool {
        match req.proc {
            NEW_ORDER_PROC => {
                let a = req.args::<NewOrderArgs>();
                let (w, d, o) = (a.w, a.d, a.o_hint);
                let lines = &a.lines[..a.n];
                keys.reads.reserve(lines.len() + 3);
                keys.writes.reserve(2 * lines.len() + 4);
                for l in lines {
                    keys.reads.push(item_key(self.item_partition(req.home, l.i), l.i));
                }
                keys.reads.push(warehouse_key(w, W_STATIC));
                keys.reads.push(district_key(w, d, D_STATIC));
                keys.writes.push(district_key(w, d, D_NEXT_PART));
                keys.reads.push(customer_key(w, d, a.c, C_STATIC));
                keys.writes.push(order_key(w, d, o));
                keys.writes.push(new_order_key(w, d, o));
                keys.writes.push(cust_order_key(w, d, a.c, o));
                for (k, l) in lines.iter().enumerate() {
                    keys.writes.push(stock_key(l.supply_w, l.i));
                    keys.writes.push(order_line_key(w, d, o, k as u32 + 1));
                }
                true
            }
            PAYMENT_PROC => {
                let a = req.args::<PaymentArgs>();
                let c = match a.cust {
                    CustomerSel::Id(c) => c,
                    CustomerSel::Last(last) if a.c_hint != 0 => {
                        keys.scans.push(by_last_name_scan(a.c_w, a.c_d, last));
                        a.c_hint
                    }
                    CustomerSel::Last(_) => return false,
                };
                keys.writes.push(warehouse_key(a.w, W_YTD_PART));
                keys.reads.push(warehouse_key(a.w, W_STATIC));
                keys.writes.push(district_key(a.w, a.d, D_YTD_PART));
                keys.reads.push(district_key(a.w, a.d, D_STATIC));
                keys.reads.push(customer_key(a.c_w, a.c_d, c, C_STATIC));
                keys.writes.push(customer_key(a.c_w, a.c_d, c, C_MUTABLE));
                keys.writes.push(a.h_key);
                true
            }
            check::CHECK_PROC => check::declare(self, req.args::<check::CheckArgs>(), keys),
            _ => false,
        }
    }

    fn run<'a, 'b: 'a>(&'a self, req: &'a TxnRequest, ctx: &'a mut Ctx<'b>) -> ProcFuture<'a> {
        Box::pin(async move {
            match req.proc {
                NEW_ORDER_PROC => {
                    let (home, a) = (req.home, req.args::<NewOrderArgs>());
                    let item_part = |i| self.item_partition(home, i);
                    procs::new_order(a, item_part, |o| self.saw_next_o(a.w, a.d, a.o_hint, o), ctx).await
                }
                PAYMENT_PROC => {
                    let a = req.args::<PaymentArgs>();
                    let found = |c: u32| {
                        if let CustomerSel::Last(last) = a.cust {
                            self.by_name_slot(a.c_w, a.c_d, last).store(c as u16, Ordering::Relaxed);
                        }
                    };
                    procs::payment(a, found, ctx).await
                }
                ORDER_STATUS_PROC => procs::order_status(req.args::<OrderStatusArgs>(), ctx).await,
                DELIVERY_PROC => procs::delivery(req.args::<DeliveryArgs>(), ctx).await,
                STOCK_LEVEL_PROC => procs::stock_level(req.args::<StockLevelArgs>(), ctx).await,
                check::CHECK_PROC => check::run(self, req.args::<check::CheckArgs>(), ctx).await,
                _ => Err(Abort::User),
            }
        })
    }
}

/// TPC-C's five transactions, in their class ids' order (latency per class).
const TXN_CLASSES: [&str; 5] = [NEW_ORDER_PROC, PAYMENT_PROC, ORDER_STATUS_PROC, DELIVERY_PROC, STOCK_LEVEL_PROC];

impl Workload for Tpcc {
    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn txn_classes(&self) -> &'static [&'static str] {
        &TXN_CLASSES
    }

    fn txn_class(&self, req: &TxnRequest) -> u8 {
        TXN_CLASSES.iter().position(|c| *c == req.proc).unwrap_or(TXN_CLASSES.len()) as u8
    }

    fn next(&self, rng: &mut Rng, home: PartitionId) -> TxnRequest {
        let w = self.home_warehouse(rng, home);
        let x = rng.gen_range(0..100);
        let (proc, args): (&'static str, Args) = if x < self.mix_cum[0] {
            (NEW_ORDER_PROC, Arc::new(self.gen_new_order(rng, w)))
        } else if x < self.mix_cum[1] {
            (PAYMENT_PROC, Arc::new(self.gen_payment(rng, w, home)))
        } else if x < self.mix_cum[2] {
            let d = rng.gen_range(1..=DISTRICTS);
            (ORDER_STATUS_PROC, Arc::new(OrderStatusArgs { w, d, cust: self.customer_sel(rng) }))
        } else if x < self.mix_cum[3] {
            (DELIVERY_PROC, Arc::new(DeliveryArgs { w, carrier: rng.gen_range(1..=10) }))
        } else {
            let (d, threshold) = (rng.gen_range(1..=DISTRICTS), rng.gen_range(10..=20));
            (STOCK_LEVEL_PROC, Arc::new(StockLevelArgs { w, d, threshold }))
        };
        TxnRequest { proc, home, args }
    }

    fn before_retry(&self, req: &mut TxnRequest, _rng: &mut Rng) {
        if let Some(a) = req.args_mut::<NewOrderArgs>() {
            a.o_hint = self.o_hint(a.w, a.d).load(Ordering::Relaxed);
        } else if let Some(a) = req.args_mut::<PaymentArgs>() {
            a.c_hint = self.c_hint(a);
        }
    }

    fn final_checks(&self) -> Vec<TxnRequest> {
        check::requests(self)
    }

    fn check_output(&self, req: &TxnRequest, _out: &TxnOutput) -> Vec<(String, bool, String)> {
        if req.proc != check::CHECK_PROC {
            return Vec::new();
        }
        check::output(self, req)
    }
}

#[cfg(test)]
pub(crate) mod tests;
