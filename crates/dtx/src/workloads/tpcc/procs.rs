//! The five TPC-C transactions (clause 2) as stored procedures, and their arguments.
//!
//! Lookups that are not by primary key:
//! - customer by last name (Payment, Order-Status, 60%): a scan of the by-name index over
//!   `(w, d, last, *)`; the index rows carry C_FIRST, the matches are sorted by it and the one
//!   at position ⌈n/2⌉ is taken (clause 2.5.2.2). Index rows never change, so the scan needs no
//!   protection; the chosen customer is then read by key.
//! - the newest order of a customer (Order-Status): a descending scan of the customer-order
//!   index over `(w, d, c, *)`, limit 8 (a range scan counts records that hold no committed
//!   value, left by aborted inserts, against the limit; if all 8 are such, the whole range is
//!   scanned). The ORDER row is then read by key, its lines by a scan of `(w, d, o, *)`.
//! - the oldest undelivered order (Delivery): the per-district delivery cursor holds it. Storage
//!   never removes a record (a delete leaves a tombstone that an ascending `limit 1` scan would
//!   return and the protocol would then drop), so a scan for the oldest NEW-ORDER row would walk
//!   every order delivered so far. New-Orders take order ids without gaps (D_NEXT_O_ID is read and
//!   written in the same transaction, and a rolled-back order does not consume its id), and
//!   Delivery removes them oldest first, so the NEW-ORDER rows of a district are exactly
//!   `[cursor, D_NEXT_O_ID)`: Delivery reads the cursor, reads (for update) the NEW-ORDER row
//!   at the cursor, and if it exists deletes it and advances the cursor. Consistency condition 3
//!   checks that this contiguity holds.
//!
//! In one-shot protocols these lookups go through reconnaissance (`declare` returns false and
//! the engine runs the procedure once against a snapshot); in interactive ones they run as is.

use super::load::RUN_DATE;
use super::schema::*;
use crate::cluster::PartitionId;
use crate::storage::{RowKey, Value};
use crate::txn::{Abort, Ctx, Scan, TxnOutput, TxnResult};
use serde::{Deserialize, Serialize};
use std::io::Write as _;

pub const NEW_ORDER_PROC: &str = "new-order";
pub const PAYMENT_PROC: &str = "payment";
pub const ORDER_STATUS_PROC: &str = "order-status";
pub const DELIVERY_PROC: &str = "delivery";
pub const STOCK_LEVEL_PROC: &str = "stock-level";

/// One line of a New-Order: item, supplying warehouse, quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub i: u32,
    pub supply_w: u32,
    pub qty: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewOrderArgs {
    pub w: u32,
    pub d: u32,
    pub c: u32,
    /// Lines in use (5..=15).
    pub n: usize,
    /// Sorted by (supply warehouse, item) so that lock-based protocols take stock locks in one
    /// global order; an unused item id (the 1% rollback) sorts last in its warehouse.
    pub lines: [Line; 15],
    pub all_local: bool,
    /// The order id this New-Order expects D_NEXT_O_ID to hold (see `Tpcc::declare`).
    pub o_hint: u32,
}

/// How a customer is selected: by id, or by the number (0..=999) of its last name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CustomerSel {
    Id(u32),
    Last(u32),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentArgs {
    pub w: u32,
    pub d: u32,
    pub c_w: u32,
    pub c_d: u32,
    pub cust: CustomerSel,
    /// H_AMOUNT in cents (1.00 ..= 5,000.00).
    pub amount: i64,
    /// The HISTORY row this payment inserts (unique per payment, see `schema`).
    pub h_key: RowKey,
    /// By last name: the customer this process found last time for that name (0 = unknown),
    /// the estimate `Tpcc::declare` uses.
    pub c_hint: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderStatusArgs {
    pub w: u32,
    pub d: u32,
    pub cust: CustomerSel,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryArgs {
    pub w: u32,
    pub carrier: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StockLevelArgs {
    pub w: u32,
    pub d: u32,
    pub threshold: u32,
}

/// A row every consistent database has; its absence means the procedure was given a key that
/// does not exist (a bug), which rolls the transaction back rather than panicking a worker.
#[inline]
fn must(v: Option<Value>) -> TxnResult<Value> {
    v.ok_or(Abort::User)
}

#[inline]
fn contains_original(s: &[u8]) -> bool {
    s.windows(8).any(|w| w == b"ORIGINAL")
}

#[inline]
fn o_id_value(o: u32) -> Value {
    Value::copy_from(&o.to_le_bytes())
}

/// Clause 2.4.2: New-Order.
pub async fn new_order(
    a: &NewOrderArgs,
    item_part: impl Fn(u32) -> PartitionId,
    seen_next: impl FnOnce(u32),
    ctx: &mut Ctx<'_>,
) -> TxnResult<TxnOutput> {
    let lines = &a.lines[..a.n];
    // Items first: an unused item id rolls the whole transaction back (clause 2.4.2.3).
    let mut price = [0i64; 15];
    let mut original = [false; 15];
    for (k, l) in lines.iter().enumerate() {
        let Some(v) = ctx.read(item_key(item_part(l.i), l.i)).await? else {
            return Err(Abort::User);
        };
        price[k] = i64_at(&v, item::PRICE);
        original[k] = contains_original(str_at(&v, item::DATA));
    }
    let wv = must(ctx.read(warehouse_key(a.w, W_STATIC)).await?)?;
    let w_tax = u32_at(&wv, wh::TAX);
    let dv = must(ctx.read(district_key(a.w, a.d, D_STATIC)).await?)?;
    let d_tax = u32_at(&dv, dist::TAX);
    let next_key = district_key(a.w, a.d, D_NEXT_PART);
    let o = u32_at(&must(ctx.read_for_update(next_key).await?)?, next_o::O_ID);
    seen_next(o);
    ctx.write(next_key, o_id_value(o + 1)).await?;
    let cv = must(ctx.read(customer_key(a.w, a.d, a.c, C_STATIC)).await?)?;
    let discount = u32_at(&cv, cust::DISCOUNT);
    let order_row = build(order::LEN, |b| {
        set_u32(b, order::ID, o);
        set_u32(b, order::D_ID, a.d);
        set_u32(b, order::W_ID, a.w);
        set_u32(b, order::C_ID, a.c);
        set_u64(b, order::ENTRY_D, RUN_DATE);
        set_u32(b, order::OL_CNT, a.n as u32);
        set_u32(b, order::ALL_LOCAL, a.all_local as u32);
    });
    ctx.insert(order_key(a.w, a.d, o), order_row).await?;
    let no_row = build(new_order::LEN, |b| {
        set_u32(b, new_order::O_ID, o);
        set_u32(b, new_order::D_ID, a.d);
        set_u32(b, new_order::W_ID, a.w);
    });
    ctx.insert(new_order_key(a.w, a.d, o), no_row).await?;
    ctx.insert(cust_order_key(a.w, a.d, a.c, o), o_id_value(o)).await?;
    let mut total = 0i64;
    let mut brand_generic = [b'G'; 15];
    for (k, l) in lines.iter().enumerate() {
        let sk = stock_key(l.supply_w, l.i);
        let sv = must(ctx.read_for_update(sk).await?)?;
        let q = u32_at(&sv, stock::QUANTITY);
        let new_q = if q >= l.qty + 10 { q - l.qty } else { q + 91 - l.qty };
        let remote = l.supply_w != a.w;
        let updated = patched(&sv, stock::LEN, |b| {
            set_u32(b, stock::QUANTITY, new_q);
            set_u64(b, stock::YTD, u64_at(&sv, stock::YTD) + l.qty as u64);
            set_u32(b, stock::ORDER_CNT, u32_at(&sv, stock::ORDER_CNT) + 1);
            if remote {
                set_u32(b, stock::REMOTE_CNT, u32_at(&sv, stock::REMOTE_CNT) + 1);
            }
        });
        ctx.write(sk, updated).await?;
        if original[k] && contains_original(str_at(&sv, stock::DATA)) {
            brand_generic[k] = b'B';
        }
        let amount = l.qty as i64 * price[k];
        total += amount;
        let dist_info = fixed_at(&sv, stock::DIST + 24 * (a.d as usize - 1), 24);
        let ol_row = build(order_line::LEN, |b| {
            set_u32(b, order_line::O_ID, o);
            set_u32(b, order_line::D_ID, a.d);
            set_u32(b, order_line::W_ID, a.w);
            set_u32(b, order_line::NUMBER, k as u32 + 1);
            set_u32(b, order_line::I_ID, l.i);
            set_u32(b, order_line::SUPPLY_W_ID, l.supply_w);
            set_u32(b, order_line::QUANTITY, l.qty);
            set_i64(b, order_line::AMOUNT, amount);
            set_fixed(b, order_line::DIST_INFO, dist_info);
        });
        ctx.insert(order_line_key(a.w, a.d, o, k as u32 + 1), ol_row).await?;
    }
    // The terminal's output: total = sum(OL_AMOUNT) * (1 - C_DISCOUNT) * (1 + W_TAX + D_TAX).
    let total = total as i128 * (10_000 - discount as i128) * (10_000 + w_tax as i128 + d_tax as i128) / 100_000_000;
    std::hint::black_box((total, brand_generic));
    Ok(TxnOutput::default())
}

/// The scan of the customer-name index that finds the customers with last name number `last`
/// in (w, d): what Payment and Order-Status by last name read (and Payment's declaration names).
pub fn by_last_name_scan(w: u32, d: u32, last: u32) -> Scan {
    let lo = cust_by_name_key(w, d, last, 0).key;
    let hi = cust_by_name_key(w, d, last, 0xffff).key;
    Scan { table: CUST_BY_NAME, lo, hi, limit: u32::MAX, descending: false }
}

/// The customer with last name number `last` in (w, d): the one at position ⌈n/2⌉ of the
/// matches sorted by C_FIRST (clause 2.5.2.2).
async fn customer_by_last(ctx: &mut Ctx<'_>, w: u32, d: u32, last: u32) -> TxnResult<u32> {
    let rows = ctx.scan(by_last_name_scan(w, d, last)).await?;
    let mut matches: Vec<(&[u8], u32)> =
        rows.iter().map(|(k, v)| (str_at(v, by_name::FIRST), customer_of_name_key(*k))).collect();
    if matches.is_empty() {
        // Customers 1..=1000 of every district carry the 1000 names: unreachable when loaded.
        return Err(Abort::User);
    }
    matches.sort_unstable();
    Ok(matches[matches.len().div_ceil(2) - 1].1)
}

/// Clause 2.5.2: Payment. `found(c)` learns the customer a last name led to.
pub async fn payment(a: &PaymentArgs, found: impl FnOnce(u32), ctx: &mut Ctx<'_>) -> TxnResult<TxnOutput> {
    let wy = warehouse_key(a.w, W_YTD_PART);
    let v = must(ctx.read_for_update(wy).await?)?;
    ctx.write(wy, patched(&v, ytd::LEN, |b| set_i64(b, ytd::YTD, i64_at(&v, ytd::YTD) + a.amount))).await?;
    let wv = must(ctx.read(warehouse_key(a.w, W_STATIC)).await?)?;
    let dy = district_key(a.w, a.d, D_YTD_PART);
    let v = must(ctx.read_for_update(dy).await?)?;
    ctx.write(dy, patched(&v, ytd::LEN, |b| set_i64(b, ytd::YTD, i64_at(&v, ytd::YTD) + a.amount))).await?;
    let dv = must(ctx.read(district_key(a.w, a.d, D_STATIC)).await?)?;
    let c = match a.cust {
        CustomerSel::Id(c) => c,
        CustomerSel::Last(last) => {
            let c = customer_by_last(ctx, a.c_w, a.c_d, last).await?;
            found(c);
            c
        }
    };
    let cs = must(ctx.read(customer_key(a.c_w, a.c_d, c, C_STATIC)).await?)?;
    let bad_credit = fixed_at(&cs, cust::CREDIT, 2) == b"BC";
    let ck = customer_key(a.c_w, a.c_d, c, C_MUTABLE);
    let cm = must(ctx.read_for_update(ck).await?)?;
    let fields = |b: &mut [u8]| {
        set_i64(b, cust_mut::BALANCE, i64_at(&cm, cust_mut::BALANCE) - a.amount);
        set_i64(b, cust_mut::YTD_PAYMENT, i64_at(&cm, cust_mut::YTD_PAYMENT) + a.amount);
        set_u32(b, cust_mut::PAYMENT_CNT, u32_at(&cm, cust_mut::PAYMENT_CNT) + 1);
        set_u32(b, cust_mut::DELIVERY_CNT, u32_at(&cm, cust_mut::DELIVERY_CNT));
    };
    let updated = if bad_credit {
        // C_DATA = "C_ID C_D_ID C_W_ID D_ID W_ID H_AMOUNT|" + old C_DATA, at most 500 characters.
        let mut data = [0u8; cust_mut::DATA_CAP];
        let mut cur = std::io::Cursor::new(&mut data[..]);
        let _ = write!(cur, "{} {} {} {} {} {}.{:02}|", c, a.c_d, a.c_w, a.d, a.w, a.amount / 100, a.amount % 100);
        let head = cur.position() as usize;
        let old_len = u16_at(&cm, cust_mut::DATA_LEN) as usize;
        let old = cm.get(cust_mut::DATA..cust_mut::DATA + old_len).unwrap_or(&[]);
        let keep = old.len().min(cust_mut::DATA_CAP - head);
        data[head..head + keep].copy_from_slice(&old[..keep]);
        let n = head + keep;
        build(cust_mut::DATA + n, |b| {
            fields(b);
            b[cust_mut::DATA_LEN..cust_mut::DATA_LEN + 2].copy_from_slice(&(n as u16).to_le_bytes());
            b[cust_mut::DATA..].copy_from_slice(&data[..n]);
        })
    } else {
        patched(&cm, cm.len(), fields)
    };
    ctx.write(ck, updated).await?;
    // H_DATA = W_NAME + 4 spaces + D_NAME.
    let mut h_data = [b' '; 24];
    let wn = str_at(&wv, wh::NAME);
    let dn = str_at(&dv, dist::NAME);
    h_data[..wn.len()].copy_from_slice(wn);
    h_data[wn.len() + 4..wn.len() + 4 + dn.len()].copy_from_slice(dn);
    let h_len = wn.len() + 4 + dn.len();
    let h = build(history::LEN, |b| {
        set_u32(b, history::C_ID, c);
        set_u32(b, history::C_D_ID, a.c_d);
        set_u32(b, history::C_W_ID, a.c_w);
        set_u32(b, history::D_ID, a.d);
        set_u32(b, history::W_ID, a.w);
        set_u64(b, history::DATE, RUN_DATE);
        set_i64(b, history::AMOUNT, a.amount);
        set_str(b, history::DATA, 24, &h_data[..h_len]);
    });
    ctx.insert(a.h_key, h).await?;
    Ok(TxnOutput::default())
}

/// The id of the newest order of customer (w, d, c), if it has one.
async fn newest_order(ctx: &mut Ctx<'_>, w: u32, d: u32, c: u32) -> TxnResult<Option<u32>> {
    let lo = cust_order_key(w, d, c, 0).key;
    let hi = cust_order_key(w, d, c, u32::MAX).key;
    for limit in [8, u32::MAX] {
        let rows = ctx.scan(Scan { table: CUST_ORDER, lo, hi, limit, descending: true }).await?;
        if let Some((k, _)) = rows.first() {
            return Ok(Some(order_of(*k)));
        }
    }
    Ok(None)
}

/// Clause 2.6.2: Order-Status (read-only).
pub async fn order_status(a: &OrderStatusArgs, ctx: &mut Ctx<'_>) -> TxnResult<TxnOutput> {
    let c = match a.cust {
        CustomerSel::Id(c) => c,
        CustomerSel::Last(last) => customer_by_last(ctx, a.w, a.d, last).await?,
    };
    let cs = must(ctx.read(customer_key(a.w, a.d, c, C_STATIC)).await?)?;
    let cm = must(ctx.read(customer_key(a.w, a.d, c, C_MUTABLE)).await?)?;
    let balance = i64_at(&cm, cust_mut::BALANCE);
    let mut out = (balance, 0u32, 0u64, 0u32, 0i64);
    if let Some(o) = newest_order(ctx, a.w, a.d, c).await? {
        let ov = must(ctx.read(order_key(a.w, a.d, o)).await?)?;
        out.1 = u32_at(&ov, order::CARRIER_ID);
        out.2 = u64_at(&ov, order::ENTRY_D);
        let lo = order_line_key(a.w, a.d, o, 0).key;
        let hi = order_line_key(a.w, a.d, o, 15).key;
        let lines = ctx.scan(Scan { table: ORDER_LINE, lo, hi, limit: u32::MAX, descending: false }).await?;
        out.3 = lines.len() as u32;
        out.4 = lines.iter().map(|(_, v)| i64_at(v, order_line::AMOUNT)).sum();
    }
    std::hint::black_box((str_at(&cs, cust::FIRST).len(), out));
    Ok(TxnOutput::default())
}

/// Clause 2.7.4: Delivery, all ten districts in one transaction.
pub async fn delivery(a: &DeliveryArgs, ctx: &mut Ctx<'_>) -> TxnResult<TxnOutput> {
    for d in 1..=DISTRICTS {
        let cursor_key = delivery_cursor_key(a.w, d);
        let o = u32_at(&must(ctx.read_for_update(cursor_key).await?)?, next_o::O_ID);
        let nk = new_order_key(a.w, d, o);
        if ctx.read_for_update(nk).await?.is_none() {
            // No undelivered order in this district: skipped (clause 2.7.4.2).
            continue;
        }
        ctx.delete(nk).await?;
        ctx.write(cursor_key, o_id_value(o + 1)).await?;
        let ok = order_key(a.w, d, o);
        let ov = must(ctx.read_for_update(ok).await?)?;
        let c = u32_at(&ov, order::C_ID);
        let ol_cnt = u32_at(&ov, order::OL_CNT);
        ctx.write(ok, patched(&ov, order::LEN, |b| set_u32(b, order::CARRIER_ID, a.carrier))).await?;
        let mut sum = 0i64;
        for ol in 1..=ol_cnt {
            let lk = order_line_key(a.w, d, o, ol);
            let lv = must(ctx.read_for_update(lk).await?)?;
            sum += i64_at(&lv, order_line::AMOUNT);
            ctx.write(lk, patched(&lv, order_line::LEN, |b| set_u64(b, order_line::DELIVERY_D, RUN_DATE))).await?;
        }
        let ck = customer_key(a.w, d, c, C_MUTABLE);
        let cm = must(ctx.read_for_update(ck).await?)?;
        let updated = patched(&cm, cm.len(), |b| {
            set_i64(b, cust_mut::BALANCE, i64_at(&cm, cust_mut::BALANCE) + sum);
            set_u32(b, cust_mut::DELIVERY_CNT, u32_at(&cm, cust_mut::DELIVERY_CNT) + 1);
        });
        ctx.write(ck, updated).await?;
    }
    Ok(TxnOutput::default())
}

/// Clause 2.8.2: Stock-Level (read-only): distinct items of the district's last 20 orders whose
/// stock is below the threshold.
pub async fn stock_level(a: &StockLevelArgs, ctx: &mut Ctx<'_>) -> TxnResult<TxnOutput> {
    let next = u32_at(&must(ctx.read(district_key(a.w, a.d, D_NEXT_PART)).await?)?, next_o::O_ID);
    let lo = order_line_key(a.w, a.d, next.saturating_sub(20).max(1), 0).key;
    let hi = order_line_key(a.w, a.d, next.saturating_sub(1), 15).key;
    let rows = ctx.scan(Scan { table: ORDER_LINE, lo, hi, limit: u32::MAX, descending: false }).await?;
    let mut items: Vec<u32> = rows.iter().map(|(_, v)| u32_at(v, order_line::I_ID)).collect();
    items.sort_unstable();
    items.dedup();
    let mut low = 0u32;
    for i in items {
        if i == 0 || i > ITEMS {
            continue;
        }
        let sv = must(ctx.read(stock_key(a.w, i)).await?)?;
        low += (u32_at(&sv, stock::QUANTITY) < a.threshold) as u32;
    }
    std::hint::black_box(low);
    Ok(TxnOutput::default())
}
