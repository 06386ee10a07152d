//! TPC-C population (clause 4.3.3.1) and the random functions of clause 2.1.6 / 4.3.2.
//!
//! Every row is generated from an RNG seeded by what it belongs to (ITEM by a constant, the rest
//! by the warehouse), so every node and every run builds the same database, and every copy of
//! the replicated ITEM table is identical.

use super::schema::*;
use crate::cluster::PartitionId;
use crate::storage::{RowKey, Value};
use crate::util::{rng_from_seed, Rng};
use rand::Rng as _;

/// The constant C of NURand for C_LAST at load time and at run time: clause 2.1.6.1 wants
/// 65 ≤ |C_run - C_load| ≤ 119, not 96 nor 112. Fixed, so that every node agrees.
pub const C_LAST_LOAD: u32 = 86;
pub const C_LAST_RUN: u32 = 153;
/// C for C_ID and OL_I_ID (the same at load and run time; the specification allows it).
pub const C_ID: u32 = 259;
pub const C_OL_I_ID: u32 = 7911;
/// The date the database was loaded (seconds); transactions use [`RUN_DATE`] as "now": dates are
/// data only, and a constant keeps simulated runs byte-for-byte deterministic.
pub const LOAD_DATE: u64 = 1_700_000_000;
pub const RUN_DATE: u64 = LOAD_DATE + 86_400;

/// NURand(A, x, y) = (((random(0, A) | random(x, y)) + C) % (y - x + 1)) + x.
#[inline]
pub fn nurand(rng: &mut Rng, a: u32, x: u32, y: u32, c: u32) -> u32 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

const ALNUM: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Fill `out` with random alphanumeric characters (ten per 64-bit draw).
pub fn fill_alnum(rng: &mut Rng, out: &mut [u8]) {
    for chunk in out.chunks_mut(10) {
        let mut r: u64 = rng.gen();
        for b in chunk {
            *b = ALNUM[(r % 62) as usize];
            r /= 62;
        }
    }
}

/// A random a-string of length min..=max into `buf`; returns the length.
pub fn astring(rng: &mut Rng, min: usize, max: usize, buf: &mut [u8]) -> usize {
    let n = rng.gen_range(min..=max);
    fill_alnum(rng, &mut buf[..n]);
    n
}

/// A random n-string (digits) into `out`.
pub fn nstring(rng: &mut Rng, out: &mut [u8]) {
    for b in out {
        *b = b'0' + rng.gen_range(0..10u8);
    }
}

/// I_DATA / S_DATA: 26..50 characters, 10% with "ORIGINAL" at a random position.
fn data_with_original(rng: &mut Rng, buf: &mut [u8; 64]) -> usize {
    let n = astring(rng, 26, 50, buf);
    if rng.gen_ratio(1, 10) {
        let at = rng.gen_range(0..=n - 8);
        buf[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
    n
}

/// A zip code: four random digits then "11111".
fn zip(rng: &mut Rng) -> [u8; 9] {
    let mut z = *b"000011111";
    nstring(rng, &mut z[..4]);
    z
}

/// Street 1, street 2, city (each a-string 10..20), state (2 letters), zip: written at the
/// offsets of a row's address block (they are consecutive in every layout).
fn address(rng: &mut Rng, b: &mut [u8], street_1: usize) {
    let mut s = [0u8; 20];
    for i in 0..3 {
        let n = astring(rng, 10, 20, &mut s);
        set_str(b, street_1 + 21 * i, 20, &s[..n]);
    }
    let state_at = street_1 + 63;
    let mut st = [0u8; 2];
    for c in &mut st {
        *c = b'A' + rng.gen_range(0..26u8);
    }
    set_fixed(b, state_at, &st);
    set_fixed(b, state_at + 2, &zip(rng));
}

/// ITEM: every partition's copy (replicated) or the items of partition `p` (i % partitions == p).
pub fn load_items(p: PartitionId, partitions: u32, replicated: bool, sink: &mut dyn FnMut(RowKey, Value)) {
    let mut rng = rng_from_seed(0x17E4_0001);
    let mut name = [0u8; 24];
    let mut data = [0u8; 64];
    for i in 1..=ITEMS {
        let im = rng.gen_range(1..=10_000u32);
        let price = rng.gen_range(100..=10_000i64);
        let nn = astring(&mut rng, 14, 24, &mut name);
        let dn = data_with_original(&mut rng, &mut data);
        if !replicated && i % partitions != p {
            continue;
        }
        let v = build(item::LEN, |b| {
            set_u32(b, item::ID, i);
            set_u32(b, item::IM_ID, im);
            set_i64(b, item::PRICE, price);
            set_str(b, item::NAME, 24, &name[..nn]);
            set_str(b, item::DATA, 50, &data[..dn]);
        });
        sink(item_key(p, i), v);
    }
}

/// Everything that belongs to warehouse `w`: WAREHOUSE, STOCK, DISTRICT, CUSTOMER, HISTORY,
/// ORDER, NEW-ORDER, ORDER-LINE, and the two indexes and the delivery cursors.
pub fn load_warehouse(w: u32, sink: &mut dyn FnMut(RowKey, Value)) {
    let mut rng = rng_from_seed(0x7CC0_0000_0000 ^ w as u64);
    let rng = &mut rng;
    let mut s = [0u8; 24];
    // WAREHOUSE.
    let v = build(wh::LEN, |b| {
        set_u32(b, wh::ID, w);
        set_u32(b, wh::TAX, rng.gen_range(0..=2000));
        let n = astring(rng, 6, 10, &mut s);
        set_str(b, wh::NAME, 10, &s[..n]);
        address(rng, b, wh::STREET_1);
    });
    sink(warehouse_key(w, W_STATIC), v);
    sink(warehouse_key(w, W_YTD_PART), build(ytd::LEN, |b| set_i64(b, ytd::YTD, 30_000_000)));
    // STOCK.
    let mut data = [0u8; 64];
    for i in 1..=ITEMS {
        let v = build(stock::LEN, |b| {
            set_u32(b, stock::I_ID, i);
            set_u32(b, stock::W_ID, w);
            set_u32(b, stock::QUANTITY, rng.gen_range(10..=100));
            fill_alnum(rng, &mut b[stock::DIST..stock::DIST + 240]);
            let n = data_with_original(rng, &mut data);
            set_str(b, stock::DATA, 50, &data[..n]);
        });
        sink(stock_key(w, i), v);
    }
    for d in 1..=DISTRICTS {
        load_district(rng, w, d, sink);
    }
}

fn load_district(rng: &mut Rng, w: u32, d: u32, sink: &mut dyn FnMut(RowKey, Value)) {
    let mut s = [0u8; 24];
    let v = build(dist::LEN, |b| {
        set_u32(b, dist::ID, d);
        set_u32(b, dist::W_ID, w);
        set_u32(b, dist::TAX, rng.gen_range(0..=2000));
        let n = astring(rng, 6, 10, &mut s);
        set_str(b, dist::NAME, 10, &s[..n]);
        address(rng, b, dist::STREET_1);
    });
    sink(district_key(w, d, D_STATIC), v);
    sink(district_key(w, d, D_YTD_PART), build(ytd::LEN, |b| set_i64(b, ytd::YTD, 3_000_000)));
    sink(district_key(w, d, D_NEXT_PART), build(next_o::LEN, |b| set_u32(b, next_o::O_ID, ORDERS_LOADED + 1)));
    sink(delivery_cursor_key(w, d), build(next_o::LEN, |b| set_u32(b, next_o::O_ID, FIRST_UNDELIVERED)));
    load_customers(rng, w, d, sink);
    load_orders(rng, w, d, sink);
}

/// District `d`'s CUSTOMER rows, each with its by-name index entry and one HISTORY row.
fn load_customers(rng: &mut Rng, w: u32, d: u32, sink: &mut dyn FnMut(RowKey, Value)) {
    let mut s = [0u8; 24];
    let mut first = [0u8; 16];
    let mut last = [0u8; 16];
    let mut cdata = [0u8; 500];
    for c in 1..=CUSTOMERS {
        let last_num = if c <= 1000 { c - 1 } else { nurand(rng, 255, 0, 999, C_LAST_LOAD) };
        let ln = last_name(last_num, &mut last);
        let fln = astring(rng, 8, 16, &mut first);
        let v = build(cust::LEN, |b| {
            set_u32(b, cust::ID, c);
            set_u32(b, cust::D_ID, d);
            set_u32(b, cust::W_ID, w);
            set_u32(b, cust::DISCOUNT, rng.gen_range(0..=5000));
            set_i64(b, cust::CREDIT_LIM, 5_000_000);
            set_u64(b, cust::SINCE, LOAD_DATE);
            set_fixed(b, cust::CREDIT, if rng.gen_ratio(1, 10) { b"BC" } else { b"GC" });
            set_fixed(b, cust::MIDDLE, b"OE");
            set_str(b, cust::FIRST, 16, &first[..fln]);
            set_str(b, cust::LAST, 16, &last[..ln]);
            address(rng, b, cust::STREET_1);
            nstring(rng, &mut b[cust::PHONE..cust::PHONE + 16]);
        });
        sink(customer_key(w, d, c, C_STATIC), v);
        let dn = astring(rng, 300, 500, &mut cdata);
        let v = build(cust_mut::DATA + dn, |b| {
            set_i64(b, cust_mut::BALANCE, -1000);
            set_i64(b, cust_mut::YTD_PAYMENT, 1000);
            set_u32(b, cust_mut::PAYMENT_CNT, 1);
            b[cust_mut::DATA_LEN..cust_mut::DATA_LEN + 2].copy_from_slice(&(dn as u16).to_le_bytes());
            b[cust_mut::DATA..].copy_from_slice(&cdata[..dn]);
        });
        sink(customer_key(w, d, c, C_MUTABLE), v);
        sink(
            cust_by_name_key(w, d, last_num, c),
            build(by_name::LEN, |b| set_str(b, by_name::FIRST, 16, &first[..fln])),
        );
        let v = build(history::LEN, |b| {
            set_u32(b, history::C_ID, c);
            set_u32(b, history::C_D_ID, d);
            set_u32(b, history::C_W_ID, w);
            set_u32(b, history::D_ID, d);
            set_u32(b, history::W_ID, w);
            set_u64(b, history::DATE, LOAD_DATE);
            set_i64(b, history::AMOUNT, 1000);
            let n = astring(rng, 12, 24, &mut s);
            set_str(b, history::DATA, 24, &s[..n]);
        });
        sink(history_key(w, 0, (d - 1) * CUSTOMERS + c - 1), v);
    }
}

/// District `d`'s ORDER rows (customers in a random permutation), their ORDER-LINEs, the
/// NEW-ORDER rows of the undelivered ones and the customer-order index.
fn load_orders(rng: &mut Rng, w: u32, d: u32, sink: &mut dyn FnMut(RowKey, Value)) {
    let mut perm: Vec<u32> = (1..=CUSTOMERS).collect();
    for i in (1..perm.len()).rev() {
        let j = rng.gen_range(0..=i);
        perm.swap(i, j);
    }
    for o in 1..=ORDERS_LOADED {
        let c = perm[o as usize - 1];
        let delivered = o < FIRST_UNDELIVERED;
        let ol_cnt = rng.gen_range(5..=15u32);
        let v = build(order::LEN, |b| {
            set_u32(b, order::ID, o);
            set_u32(b, order::D_ID, d);
            set_u32(b, order::W_ID, w);
            set_u32(b, order::C_ID, c);
            set_u64(b, order::ENTRY_D, LOAD_DATE);
            set_u32(b, order::CARRIER_ID, if delivered { rng.gen_range(1..=10) } else { 0 });
            set_u32(b, order::OL_CNT, ol_cnt);
            set_u32(b, order::ALL_LOCAL, 1);
        });
        sink(order_key(w, d, o), v);
        sink(cust_order_key(w, d, c, o), build(cust_order::LEN, |b| set_u32(b, cust_order::O_ID, o)));
        if !delivered {
            let v = build(new_order::LEN, |b| {
                set_u32(b, new_order::O_ID, o);
                set_u32(b, new_order::D_ID, d);
                set_u32(b, new_order::W_ID, w);
            });
            sink(new_order_key(w, d, o), v);
        }
        for ol in 1..=ol_cnt {
            let v = build(order_line::LEN, |b| {
                set_u32(b, order_line::O_ID, o);
                set_u32(b, order_line::D_ID, d);
                set_u32(b, order_line::W_ID, w);
                set_u32(b, order_line::NUMBER, ol);
                set_u32(b, order_line::I_ID, rng.gen_range(1..=ITEMS));
                set_u32(b, order_line::SUPPLY_W_ID, w);
                set_u64(b, order_line::DELIVERY_D, if delivered { LOAD_DATE } else { 0 });
                set_u32(b, order_line::QUANTITY, 5);
                set_i64(b, order_line::AMOUNT, if delivered { 0 } else { rng.gen_range(1..=999_999) });
                fill_alnum(rng, &mut b[order_line::DIST_INFO..order_line::DIST_INFO + 24]);
            });
            sink(order_line_key(w, d, o, ol), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nurand_stays_in_range_and_is_skewed() {
        let mut rng = rng_from_seed(1);
        let mut hits = vec![0u32; 3001];
        for _ in 0..300_000 {
            let c = nurand(&mut rng, 1023, 1, 3000, C_ID);
            assert!((1..=3000).contains(&c));
            hits[c as usize] += 1;
        }
        let max = *hits.iter().max().unwrap();
        assert!(max > 300, "NURand(1023) should make some customers hot: max {max} of a uniform 100");
        for _ in 0..100_000 {
            assert!(nurand(&mut rng, 255, 0, 999, C_LAST_RUN) <= 999);
            assert!((1..=ITEMS).contains(&nurand(&mut rng, 8191, 1, ITEMS, C_OL_I_ID)));
        }
        let delta = C_LAST_RUN.abs_diff(C_LAST_LOAD);
        assert!((65..=119).contains(&delta) && delta != 96 && delta != 112);
    }

    #[test]
    fn strings_have_the_asked_lengths() {
        let mut rng = rng_from_seed(2);
        let mut buf = [0u8; 64];
        for _ in 0..1000 {
            let n = astring(&mut rng, 26, 50, &mut buf);
            assert!((26..=50).contains(&n));
            assert!(buf[..n].iter().all(|b| b.is_ascii_alphanumeric()));
        }
        let originals = (0..10_000).filter(|_| {
            let n = data_with_original(&mut rng, &mut buf);
            buf[..n].windows(8).any(|w| w == b"ORIGINAL")
        });
        let k = originals.count();
        assert!((800..1200).contains(&k), "{k} of 10000 rows with ORIGINAL");
    }
}
