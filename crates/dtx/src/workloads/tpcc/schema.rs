//! TPC-C schema: table ids, how composite keys pack into a `u64`, and the fixed little-endian
//! row layouts (no serde per row: a field is an offset, a read is a `from_le_bytes`, an update
//! copies the row into its new allocation and patches the field there).
//!
//! # Vertical partitioning
//! The specification allows a table to be split vertically (clause 1.6) as long as every column
//! is there. Three tables keep their mutable columns in a second row of the same table, so that
//! transactions that only read the static columns do not conflict with the ones that update the
//! others (New-Order reads W_TAX, Payment updates W_YTD in the same warehouse):
//! - WAREHOUSE: part 0 = static columns (W_TAX...), part 1 = W_YTD;
//! - DISTRICT: part 0 = static (D_TAX, name, address), part 1 = D_YTD (Payment), part 2 =
//!   D_NEXT_O_ID (New-Order, Stock-Level);
//! - CUSTOMER: part 0 = static (name, credit, discount...), part 1 = C_BALANCE, C_YTD_PAYMENT,
//!   C_PAYMENT_CNT, C_DELIVERY_CNT, C_DATA (Payment, Delivery).
//!
//! # Keys
//! Warehouse ids are 1-based and at most [`MAX_WAREHOUSES`]. Tables a node holds densely (no
//! ordered index) use compact keys, contiguous per warehouse, so each local warehouse is one
//! dense range: WAREHOUSE `(w-1)*2+part`, DISTRICT `((w-1)*10+d-1)*3+part`, CUSTOMER
//! `(((w-1)*10+d-1)*3000+c-1)*2+part`, STOCK `(w-1)*100000+i-1`, DELIVERY cursor `(w-1)*10+d-1`.
//! Ordered tables put the fields in the key's high-to-low bits in the order they sort by, so a
//! range scan over a prefix finds exactly that prefix's rows in order:
//! - ORDER and NEW-ORDER: `w<<40 | d<<32 | o_id` (o_id < 2^32);
//! - ORDER-LINE: `w<<40 | d<<36 | o_id<<4 | ol_number` (ol_number 1..=15);
//! - CUSTOMER-BY-NAME index: `w<<32 | d<<28 | last<<16 | c_id`, where `last` is the number
//!   0..=999 whose three digits pick the last name's syllables (clause 4.3.2.3). That mapping is
//!   a bijection between numbers and generated names, so equal names are equal numbers and a scan
//!   over `(w, d, last, *)` finds every customer with that name. The row's value is C_FIRST, so
//!   Payment and Order-Status sort the matches by first name without reading the customers.
//! - CUSTOMER-ORDER index (newest order of a customer): `w<<48 | d<<44 | c_id<<32 | o_id`;
//!   a descending scan over `(w, d, c, *)` meets the newest order first.
//! - HISTORY (unordered; it has no primary key in the specification, this one only has to be
//!   unique): `w<<48 | tag<<32 | seq`, tag 0 for loaded rows (seq = customer index), else the
//!   issuing client's home partition + 1 with a per-process sequence number.
//! - ITEM (read-only): `partition<<32 | i_id`. With replication every partition holds a copy
//!   under its own key range, and procedures read the copy of their home partition, which is
//!   on their own node; without, item i lives in partition i % partitions.

use crate::cluster::PartitionId;
use crate::storage::{RowKey, TableId, Value};

pub const WAREHOUSE: TableId = 0;
pub const DISTRICT: TableId = 1;
pub const CUSTOMER: TableId = 2;
pub const HISTORY: TableId = 3;
pub const NEW_ORDER: TableId = 4;
pub const ORDER: TableId = 5;
pub const ORDER_LINE: TableId = 6;
pub const ITEM: TableId = 7;
pub const STOCK: TableId = 8;
/// Secondary index: customers by (w, d, last name).
pub const CUST_BY_NAME: TableId = 9;
/// Secondary index: orders by (w, d, customer), for "the newest order of a customer".
pub const CUST_ORDER: TableId = 10;
/// Per district: the oldest undelivered order id (see `procs::delivery`).
pub const DELIVERY_CURSOR: TableId = 11;

pub const DISTRICTS: u32 = 10;
pub const CUSTOMERS: u32 = 3000;
pub const ITEMS: u32 = 100_000;
/// Orders loaded per district; the last 900 of them are undelivered (in NEW-ORDER).
pub const ORDERS_LOADED: u32 = 3000;
pub const FIRST_UNDELIVERED: u32 = 2101;
pub const MAX_WAREHOUSES: u32 = 10_000;
/// An item id that does not exist (New-Order's 1% rollback).
pub const UNUSED_ITEM: u32 = ITEMS + 1;
/// Warehouse and district parts (see the module doc).
pub const W_STATIC: u64 = 0;
pub const W_YTD_PART: u64 = 1;
pub const D_STATIC: u64 = 0;
pub const D_YTD_PART: u64 = 1;
pub const D_NEXT_PART: u64 = 2;
pub const C_STATIC: u64 = 0;
pub const C_MUTABLE: u64 = 1;

// ---- keys -------------------------------------------------------------------------------------

#[inline]
pub fn warehouse_key(w: u32, part: u64) -> RowKey {
    RowKey::new(WAREHOUSE, (w as u64 - 1) * 2 + part)
}

#[inline]
pub fn district_key(w: u32, d: u32, part: u64) -> RowKey {
    RowKey::new(DISTRICT, ((w as u64 - 1) * 10 + d as u64 - 1) * 3 + part)
}

#[inline]
pub fn customer_key(w: u32, d: u32, c: u32, part: u64) -> RowKey {
    RowKey::new(CUSTOMER, (((w as u64 - 1) * 10 + d as u64 - 1) * CUSTOMERS as u64 + c as u64 - 1) * 2 + part)
}

#[inline]
pub fn stock_key(w: u32, i: u32) -> RowKey {
    RowKey::new(STOCK, (w as u64 - 1) * ITEMS as u64 + i as u64 - 1)
}

#[inline]
pub fn item_key(partition: PartitionId, i: u32) -> RowKey {
    RowKey::new(ITEM, (partition as u64) << 32 | i as u64)
}

#[inline]
pub fn history_key(w: u32, tag: u32, seq: u32) -> RowKey {
    RowKey::new(HISTORY, (w as u64) << 48 | ((tag & 0xffff) as u64) << 32 | seq as u64)
}

#[inline]
pub fn order_key(w: u32, d: u32, o: u32) -> RowKey {
    RowKey::new(ORDER, (w as u64) << 40 | (d as u64) << 32 | o as u64)
}

#[inline]
pub fn new_order_key(w: u32, d: u32, o: u32) -> RowKey {
    RowKey::new(NEW_ORDER, (w as u64) << 40 | (d as u64) << 32 | o as u64)
}

#[inline]
pub fn order_line_key(w: u32, d: u32, o: u32, ol: u32) -> RowKey {
    RowKey::new(ORDER_LINE, (w as u64) << 40 | (d as u64) << 36 | (o as u64) << 4 | ol as u64)
}

#[inline]
pub fn cust_by_name_key(w: u32, d: u32, last: u32, c: u32) -> RowKey {
    RowKey::new(CUST_BY_NAME, (w as u64) << 32 | (d as u64) << 28 | (last as u64) << 16 | c as u64)
}

#[inline]
pub fn cust_order_key(w: u32, d: u32, c: u32, o: u32) -> RowKey {
    RowKey::new(CUST_ORDER, (w as u64) << 48 | (d as u64) << 44 | (c as u64) << 32 | o as u64)
}

#[inline]
pub fn delivery_cursor_key(w: u32, d: u32) -> RowKey {
    RowKey::new(DELIVERY_CURSOR, (w as u64 - 1) * 10 + d as u64 - 1)
}

/// The o_id of an ORDER or NEW-ORDER key, the (o_id, ol_number) of an ORDER-LINE key, the c_id
/// of a by-name index key, the o_id of a customer-order index key.
#[inline]
pub fn order_of(key: u64) -> u32 {
    key as u32
}
#[inline]
pub fn order_line_of(key: u64) -> (u32, u32) {
    ((key >> 4) as u32, (key & 15) as u32)
}
#[inline]
pub fn customer_of_name_key(key: u64) -> u32 {
    (key & 0xffff) as u32
}

/// The warehouse a key belongs to (None for ITEM, whose key names a partition).
#[inline]
pub fn warehouse_of(key: RowKey) -> Option<u32> {
    let k = key.key;
    let w = match key.table {
        WAREHOUSE => k / 2 + 1,
        DISTRICT => k / 30 + 1,
        CUSTOMER => k / (2 * DISTRICTS as u64 * CUSTOMERS as u64) + 1,
        STOCK => k / ITEMS as u64 + 1,
        DELIVERY_CURSOR => k / 10 + 1,
        HISTORY | CUST_ORDER => k >> 48,
        NEW_ORDER | ORDER | ORDER_LINE => k >> 40,
        CUST_BY_NAME => k >> 32,
        _ => return None,
    };
    Some(w as u32)
}

/// Warehouse w lives in partition (w-1) % partitions; ITEM keys name their partition.
#[inline]
pub fn partition_of(key: RowKey, partitions: u32) -> PartitionId {
    match warehouse_of(key) {
        Some(w) => w.saturating_sub(1) % partitions,
        None => ((key.key >> 32) as u32) % partitions,
    }
}

// ---- field access -----------------------------------------------------------------------------

#[inline]
pub fn u16_at(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2).map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

#[inline]
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4).map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

#[inline]
pub fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}

#[inline]
pub fn i64_at(b: &[u8], off: usize) -> i64 {
    u64_at(b, off) as i64
}

#[inline]
pub fn set_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn set_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn set_i64(b: &mut [u8], off: usize, v: i64) {
    set_u64(b, off, v as u64)
}

/// A variable-length string field of capacity `cap` takes `1 + cap` bytes: its length, then
/// the bytes, zero padded.
#[inline]
pub fn str_at(b: &[u8], off: usize) -> &[u8] {
    let Some(&len) = b.get(off) else { return &[] };
    b.get(off + 1..off + 1 + len as usize).unwrap_or(&[])
}

#[inline]
pub fn set_str(b: &mut [u8], off: usize, cap: usize, s: &[u8]) {
    let n = s.len().min(cap);
    b[off] = n as u8;
    b[off + 1..off + 1 + n].copy_from_slice(&s[..n]);
}

/// A fixed-length string field of `n` bytes.
#[inline]
pub fn fixed_at(b: &[u8], off: usize, n: usize) -> &[u8] {
    b.get(off..off + n).unwrap_or(&[])
}

#[inline]
pub fn set_fixed(b: &mut [u8], off: usize, s: &[u8]) {
    b[off..off + s.len()].copy_from_slice(s);
}

/// A copy of `old` (at least `len` bytes long, zero padded) patched by `f`: one allocation.
#[inline]
pub fn patched(old: &[u8], len: usize, f: impl FnOnce(&mut [u8])) -> Value {
    Value::patched(old, len, f)
}

/// A fresh row of `len` zero bytes filled by `f`: one allocation.
#[inline]
pub fn build(len: usize, f: impl FnOnce(&mut [u8])) -> Value {
    patched(&[], len, f)
}

// ---- layouts (byte offsets) -------------------------------------------------------------------
// Money is in cents (i64), rates in 1/10000 (u32), dates in seconds (u64, 0 = null),
// `sN` a variable string of capacity N (1 + N bytes), `fN` a fixed string of N bytes.

/// WAREHOUSE part 0.
pub mod wh {
    pub const ID: usize = 0;
    pub const TAX: usize = 4;
    pub const NAME: usize = 8; // s10
    pub const STREET_1: usize = 19; // s20
    pub const STREET_2: usize = 40; // s20
    pub const CITY: usize = 61; // s20
    pub const STATE: usize = 82; // f2
    pub const ZIP: usize = 84; // f9
    pub const LEN: usize = 93;
}

/// WAREHOUSE part 1, DISTRICT part 1: the year-to-date balance alone.
pub mod ytd {
    pub const YTD: usize = 0;
    pub const LEN: usize = 8;
}

/// DISTRICT part 0.
pub mod dist {
    pub const ID: usize = 0;
    pub const W_ID: usize = 4;
    pub const TAX: usize = 8;
    pub const NAME: usize = 12; // s10
    pub const STREET_1: usize = 23; // s20
    pub const STREET_2: usize = 44; // s20
    pub const CITY: usize = 65; // s20
    pub const STATE: usize = 86; // f2
    pub const ZIP: usize = 88; // f9
    pub const LEN: usize = 97;
}

/// DISTRICT part 2, and the delivery cursor: one order id.
pub mod next_o {
    pub const O_ID: usize = 0;
    pub const LEN: usize = 4;
}

/// CUSTOMER part 0.
pub mod cust {
    pub const ID: usize = 0;
    pub const D_ID: usize = 4;
    pub const W_ID: usize = 8;
    pub const DISCOUNT: usize = 12;
    pub const CREDIT_LIM: usize = 16;
    pub const SINCE: usize = 24;
    pub const CREDIT: usize = 32; // f2: "GC" or "BC"
    pub const MIDDLE: usize = 34; // f2
    pub const FIRST: usize = 36; // s16
    pub const LAST: usize = 53; // s16
    pub const STREET_1: usize = 70; // s20
    pub const STREET_2: usize = 91; // s20
    pub const CITY: usize = 112; // s20
    pub const STATE: usize = 133; // f2
    pub const ZIP: usize = 135; // f9
    pub const PHONE: usize = 144; // f16
    pub const LEN: usize = 160;
}

/// CUSTOMER part 1. C_DATA is variable: a u16 length, then the bytes (the row is as long as
/// the data it holds, at most 500 bytes of it).
pub mod cust_mut {
    pub const BALANCE: usize = 0;
    pub const YTD_PAYMENT: usize = 8;
    pub const PAYMENT_CNT: usize = 16;
    pub const DELIVERY_CNT: usize = 20;
    pub const DATA_LEN: usize = 24;
    pub const DATA: usize = 26;
    pub const DATA_CAP: usize = 500;
}

pub mod history {
    pub const C_ID: usize = 0;
    pub const C_D_ID: usize = 4;
    pub const C_W_ID: usize = 8;
    pub const D_ID: usize = 12;
    pub const W_ID: usize = 16;
    pub const DATE: usize = 20;
    pub const AMOUNT: usize = 28;
    pub const DATA: usize = 36; // s24
    pub const LEN: usize = 61;
}

pub mod new_order {
    pub const O_ID: usize = 0;
    pub const D_ID: usize = 4;
    pub const W_ID: usize = 8;
    pub const LEN: usize = 12;
}

pub mod order {
    pub const ID: usize = 0;
    pub const D_ID: usize = 4;
    pub const W_ID: usize = 8;
    pub const C_ID: usize = 12;
    pub const ENTRY_D: usize = 16;
    pub const CARRIER_ID: usize = 24; // 0 = null
    pub const OL_CNT: usize = 28;
    pub const ALL_LOCAL: usize = 32;
    pub const LEN: usize = 36;
}

pub mod order_line {
    pub const O_ID: usize = 0;
    pub const D_ID: usize = 4;
    pub const W_ID: usize = 8;
    pub const NUMBER: usize = 12;
    pub const I_ID: usize = 16;
    pub const SUPPLY_W_ID: usize = 20;
    pub const DELIVERY_D: usize = 24; // 0 = null
    pub const QUANTITY: usize = 32;
    pub const AMOUNT: usize = 36;
    pub const DIST_INFO: usize = 44; // f24
    pub const LEN: usize = 68;
}

pub mod item {
    pub const ID: usize = 0;
    pub const IM_ID: usize = 4;
    pub const PRICE: usize = 8;
    pub const NAME: usize = 16; // s24
    pub const DATA: usize = 41; // s50
    pub const LEN: usize = 92;
}

pub mod stock {
    pub const I_ID: usize = 0;
    pub const W_ID: usize = 4;
    pub const QUANTITY: usize = 8;
    pub const ORDER_CNT: usize = 12;
    pub const REMOTE_CNT: usize = 16;
    pub const YTD: usize = 20;
    /// S_DIST_01..S_DIST_10, f24 each: district d's at `DIST + 24 * (d - 1)`.
    pub const DIST: usize = 28;
    pub const DATA: usize = 268; // s50
    pub const LEN: usize = 319;
}

/// The by-name index row: C_FIRST (s16), for sorting the matches.
pub mod by_name {
    pub const FIRST: usize = 0;
    pub const LEN: usize = 17;
}

/// The customer-order index row: the order id.
pub mod cust_order {
    pub const O_ID: usize = 0;
    pub const LEN: usize = 4;
}

/// The last-name syllables of clause 4.3.2.3.
pub const SYLLABLES: [&str; 10] = ["BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"];

/// The last name whose syllables are the digits of `num` (0..=999), written into `out`;
/// returns its length.
pub fn last_name(num: u32, out: &mut [u8; 16]) -> usize {
    let mut n = 0;
    for digit in [num / 100 % 10, num / 10 % 10, num % 10] {
        let s = SYLLABLES[digit as usize].as_bytes();
        out[n..n + s.len()].copy_from_slice(s);
        n += s.len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_do_not_overlap() {
        assert_eq!(wh::ZIP + 9, wh::LEN);
        assert_eq!(wh::NAME + 11, wh::STREET_1);
        assert_eq!(dist::ZIP + 9, dist::LEN);
        assert_eq!(cust::PHONE + 16, cust::LEN);
        assert_eq!(cust::LAST + 17, cust::STREET_1);
        assert_eq!(history::DATA + 25, history::LEN);
        assert_eq!(order_line::DIST_INFO + 24, order_line::LEN);
        assert_eq!(item::DATA + 51, item::LEN);
        assert_eq!(stock::DIST + 240, stock::DATA);
        assert_eq!(stock::DATA + 51, stock::LEN);
    }

    #[test]
    fn field_round_trips() {
        let v = build(cust::LEN, |b| {
            set_u32(b, cust::ID, 2999);
            set_i64(b, cust::CREDIT_LIM, -5_000_000);
            set_str(b, cust::LAST, 16, b"BARBARBAR");
            set_fixed(b, cust::CREDIT, b"BC");
        });
        assert_eq!(v.len(), cust::LEN);
        assert_eq!(u32_at(&v, cust::ID), 2999);
        assert_eq!(i64_at(&v, cust::CREDIT_LIM), -5_000_000);
        assert_eq!(str_at(&v, cust::LAST), b"BARBARBAR");
        assert_eq!(fixed_at(&v, cust::CREDIT, 2), b"BC");
        let w = patched(&v, cust::LEN, |b| set_u32(b, cust::ID, 7));
        assert_eq!(u32_at(&w, cust::ID), 7);
        assert_eq!(str_at(&w, cust::LAST), b"BARBARBAR");
        // Short or garbage rows read as zero, never panic.
        assert_eq!(u64_at(&[1, 2], 0), 0);
        assert_eq!(str_at(&[200, 1], 0), b"");
        let mut name = [0u8; 16];
        let n = last_name(371, &mut name);
        assert_eq!(&name[..n], b"PRICALLYOUGHT");
    }

    #[test]
    fn keys_round_trip_and_map_to_their_warehouse() {
        let parts = 3;
        for w in [1u32, 2, 3, 7, 1000, MAX_WAREHOUSES] {
            for d in [1u32, 5, 10] {
                let keys = [
                    warehouse_key(w, W_YTD_PART),
                    district_key(w, d, D_NEXT_PART),
                    district_key(w, d, D_STATIC),
                    customer_key(w, d, 1, C_STATIC),
                    customer_key(w, d, CUSTOMERS, C_MUTABLE),
                    stock_key(w, 1),
                    stock_key(w, ITEMS),
                    history_key(w, 0xffff, u32::MAX),
                    order_key(w, d, u32::MAX),
                    new_order_key(w, d, 1),
                    order_line_key(w, d, u32::MAX, 15),
                    cust_by_name_key(w, d, 999, CUSTOMERS),
                    cust_order_key(w, d, CUSTOMERS, u32::MAX),
                    delivery_cursor_key(w, d),
                ];
                for k in keys {
                    assert_eq!(warehouse_of(k), Some(w), "{k:?}");
                    assert_eq!(partition_of(k, parts), (w - 1) % parts, "{k:?}");
                }
                assert_eq!(order_of(order_key(w, d, 12345).key), 12345);
                assert_eq!(order_line_of(order_line_key(w, d, 4242, 9).key), (4242, 9));
                assert_eq!(customer_of_name_key(cust_by_name_key(w, d, 17, 2999).key), 2999);
                assert_eq!(order_of(cust_order_key(w, d, 17, 99).key), 99);
            }
        }
        assert_eq!(item_key(2, 5).key >> 32, 2);
        assert_eq!(partition_of(item_key(2, 5), parts), 2);
        assert_eq!(warehouse_of(item_key(2, 5)), None);
    }

    #[test]
    fn dense_keys_are_contiguous_per_warehouse() {
        // The first and last key of warehouse w+1 follow the last of warehouse w.
        for w in 1..5u32 {
            assert_eq!(warehouse_key(w, 1).key + 1, warehouse_key(w + 1, 0).key);
            assert_eq!(district_key(w, 10, 2).key + 1, district_key(w + 1, 1, 0).key);
            assert_eq!(customer_key(w, 10, CUSTOMERS, 1).key + 1, customer_key(w + 1, 1, 1, 0).key);
            assert_eq!(stock_key(w, ITEMS).key + 1, stock_key(w + 1, 1).key);
            assert_eq!(delivery_cursor_key(w, 10).key + 1, delivery_cursor_key(w + 1, 1).key);
        }
    }

    #[test]
    fn ordered_keys_sort_by_their_fields() {
        // ORDER / NEW-ORDER: (w, d, o).
        let tuples = [(1u32, 1u32, 1u32), (1, 1, 2), (1, 1, u32::MAX), (1, 2, 1), (1, 10, 5), (2, 1, 1), (300, 3, 7)];
        for pair in tuples.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(order_key(a.0, a.1, a.2) < order_key(b.0, b.1, b.2));
            assert!(new_order_key(a.0, a.1, a.2) < new_order_key(b.0, b.1, b.2));
            assert!(order_line_key(a.0, a.1, a.2, 15) < order_line_key(b.0, b.1, b.2, 1));
        }
        assert!(order_line_key(1, 1, 7, 1) < order_line_key(1, 1, 7, 15));
        assert!(order_line_key(1, 1, 7, 15) < order_line_key(1, 1, 8, 1));
        // By-name: (w, d, last, c).
        assert!(cust_by_name_key(1, 1, 5, 3000) < cust_by_name_key(1, 1, 6, 1));
        assert!(cust_by_name_key(1, 1, 999, 3000) < cust_by_name_key(1, 2, 0, 1));
        assert!(cust_by_name_key(1, 10, 999, 3000) < cust_by_name_key(2, 1, 0, 1));
        // Customer-order: (w, d, c, o).
        assert!(cust_order_key(1, 1, 5, u32::MAX) < cust_order_key(1, 1, 6, 1));
        assert!(cust_order_key(1, 1, 3000, u32::MAX) < cust_order_key(1, 2, 1, 1));
        assert!(cust_order_key(1, 10, 3000, u32::MAX) < cust_order_key(2, 1, 1, 1));
    }
}
