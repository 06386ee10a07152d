//! TPC-C unit tests: population, generation, declarations, and the procedures run directly
//! against storage (no concurrency control) followed by the consistency check.

use super::*;
use crate::storage::Storage;
use crate::testkit::{loaded, now, run_direct, Direct};

fn tpcc(warehouses: u32, nodes: u16, mix: &str) -> (Tpcc, Topology) {
    let topo = Topology::new(nodes, 1, 1);
    let p = WorkloadParams { name: "tpcc".into(), warehouses, mix: mix.into(), ..Default::default() };
    (Tpcc::new(&p, &topo).unwrap(), topo)
}

/// Run the final checks directly; returns (condition, passed, detail).
fn checks(wl: &Tpcc, store: &Storage<()>) -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    for req in wl.final_checks() {
        let o = run_direct(wl, store, &req).expect("check transactions commit");
        out.extend(wl.check_output(&req, &o));
    }
    out
}

#[test]
fn population_of_one_warehouse() {
    let (wl, _) = tpcc(1, 1, "standard");
    let store = loaded(&wl, &[0]);
    let count = |t| store.table(t).len();
    assert_eq!(count(WAREHOUSE), 2, "static row + W_YTD row");
    assert_eq!(count(DISTRICT), 30, "10 districts x 3 parts");
    assert_eq!(count(CUSTOMER), 60_000, "30,000 customers x 2 parts");
    assert_eq!(count(HISTORY), 30_000);
    assert_eq!(count(ORDER), 30_000);
    assert_eq!(count(NEW_ORDER), 9_000);
    assert_eq!(count(ITEM), 100_000);
    assert_eq!(count(STOCK), 100_000);
    assert_eq!(count(CUST_BY_NAME), 30_000);
    assert_eq!(count(CUST_ORDER), 30_000);
    assert_eq!(count(DELIVERY_CURSOR), 10);
    let ol = count(ORDER_LINE);
    assert!((30_000 * 5..=30_000 * 15).contains(&ol), "{ol} order lines");
    // Every district: D_NEXT_O_ID 3001, NEW-ORDER = orders 2101..=3000, all 1000 last names.
    for d in 1..=DISTRICTS {
        let next = store.get(district_key(1, d, D_NEXT_PART)).unwrap().lock().value.clone().unwrap();
        assert_eq!(u32_at(&next, next_o::O_ID), 3001);
        let no =
            store.table(NEW_ORDER).range(new_order_key(1, d, 0).key, new_order_key(1, d, u32::MAX).key, 10_000, false);
        assert_eq!(no.len(), 900);
        assert_eq!(order_of(no[0].0), 2101);
        for last in [0, 1, 500, 999] {
            let lo = cust_by_name_key(1, d, last, 0).key;
            let rows = store.table(CUST_BY_NAME).range(lo, lo + 0xffff, 100, false);
            assert!(!rows.is_empty(), "no customer named {last} in district {d}");
        }
    }
    let c = store.get(customer_key(1, 3, 17, C_STATIC)).unwrap().lock().value.clone().unwrap();
    assert_eq!((u32_at(&c, cust::ID), u32_at(&c, cust::D_ID), u32_at(&c, cust::W_ID)), (17, 3, 1));
    let mut name = [0u8; 16];
    let n = last_name(16, &mut name);
    assert_eq!(str_at(&c, cust::LAST), &name[..n], "customer c <= 1000 has last name number c - 1");
    assert_eq!(fixed_at(&c, cust::MIDDLE, 2), b"OE");
    let m = store.get(customer_key(1, 3, 17, C_MUTABLE)).unwrap().lock().value.clone().unwrap();
    assert_eq!(i64_at(&m, cust_mut::BALANCE), -1000);
    assert!((300..=500).contains(&(u16_at(&m, cust_mut::DATA_LEN) as usize)));
    // The loaded database passes its own consistency check.
    for (cond, ok, detail) in checks(&wl, &store) {
        assert!(ok, "{cond}: {detail}");
    }
}

#[test]
fn warehouses_spread_over_partitions_and_items_replicate() {
    let (wl, topo) = tpcc(5, 2, "standard");
    assert_eq!(topo.partitions(), 2);
    assert_eq!(wl.warehouses_of(0).collect::<Vec<_>>(), vec![1, 3, 5]);
    assert_eq!(wl.warehouses_of(1).collect::<Vec<_>>(), vec![2, 4]);
    let mut rng = crate::util::rng_from_seed(4);
    for _ in 0..1000 {
        let w = wl.home_warehouse(&mut rng, 1);
        assert!(w == 2 || w == 4);
    }
    // Fewer warehouses than partitions: the empty partitions' clients use another's.
    let (one, _) = tpcc(1, 3, "standard");
    assert_eq!(one.home_warehouse(&mut rng, 2), 1);
    let defs = wl.tables(&[1]);
    assert_eq!(defs.len(), 12);
    assert_eq!(defs[STOCK as usize].dense, vec![100_000..200_000, 300_000..400_000]);
    assert_eq!(defs[ITEM as usize].dense, vec![item_key(1, 1).key..item_key(1, ITEMS).key + 1]);
    assert!(defs.iter().all(|d| !d.ordered || d.dense.is_empty()), "dense ranges only on unordered tables");
    // Item copies are identical, in the partition's own key range.
    let mut a = Vec::new();
    let mut b = Vec::new();
    load::load_items(0, 2, true, &mut |k, v| a.push((k, v)));
    load::load_items(1, 2, true, &mut |k, v| b.push((k, v)));
    assert_eq!(a.len(), ITEMS as usize);
    assert!(a
        .iter()
        .zip(&b)
        .all(|((ka, va), (kb, vb))| va == vb && wl.partition_of(*ka) == 0 && wl.partition_of(*kb) == 1));
    // Not replicated: each item once, in partition i % partitions.
    let mut c = Vec::new();
    load::load_items(1, 2, false, &mut |k, v| c.push((k, v)));
    assert_eq!(c.len(), ITEMS as usize / 2);
    assert!(c.iter().all(|(k, _)| wl.partition_of(*k) == 1 && (k.key as u32) % 2 == 1));
}

#[test]
fn generated_mix_and_remote_ratios() {
    let (wl, _) = tpcc(4, 2, "standard");
    let mut rng = crate::util::rng_from_seed(11);
    let n = 100_000;
    let mut kinds = std::collections::BTreeMap::<&str, u32>::new();
    let (mut no, mut no_remote, mut no_rollback, mut pay, mut pay_remote, mut by_name) = (0, 0, 0, 0, 0, 0);
    for _ in 0..n {
        let req = wl.next(&mut rng, 1);
        *kinds.entry(wl.txn_kind(&req)).or_default() += 1;
        match req.proc {
            NEW_ORDER_PROC => {
                let a = req.args::<NewOrderArgs>();
                assert!(a.w == 2 || a.w == 4);
                assert!((5..=15).contains(&a.n));
                let lines = &a.lines[..a.n];
                assert!(lines.windows(2).all(|p| (p[0].supply_w, p[0].i) < (p[1].supply_w, p[1].i)));
                let remote = lines.iter().filter(|l| l.supply_w != a.w).count();
                assert!(remote <= 1);
                assert_eq!(a.all_local, remote == 0);
                no += 1;
                no_remote += (remote > 0) as u32;
                no_rollback += lines.iter().any(|l| l.i == UNUSED_ITEM) as u32;
            }
            PAYMENT_PROC => {
                let a = req.args::<PaymentArgs>();
                pay += 1;
                pay_remote += (a.c_w != a.w) as u32;
                by_name += matches!(a.cust, CustomerSel::Last(_)) as u32;
                assert!((100..=500_000).contains(&a.amount));
                assert_eq!(wl.partition_of(a.h_key), 1);
            }
            _ => {}
        }
    }
    let frac = |a: u32, b: u32| a as f64 / b as f64;
    assert!((0.44..0.46).contains(&frac(kinds["new-order"], n)), "{kinds:?}");
    assert!((0.42..0.44).contains(&frac(kinds["payment"], n)), "{kinds:?}");
    for k in ["order-status", "delivery", "stock-level"] {
        assert!((0.035..0.045).contains(&frac(kinds[k], n)), "{kinds:?}");
    }
    assert!((0.09..0.11).contains(&frac(no_remote, no)), "new-order remote {}", frac(no_remote, no));
    assert!((0.007..0.013).contains(&frac(no_rollback, no)), "rollback {}", frac(no_rollback, no));
    assert!((0.14..0.16).contains(&frac(pay_remote, pay)), "payment remote {}", frac(pay_remote, pay));
    assert!((0.58..0.62).contains(&frac(by_name, pay)), "by name {}", frac(by_name, pay));
    // neworder-payment: only those two.
    let (np, _) = tpcc(1, 1, "neworder-payment");
    for _ in 0..1000 {
        let r = np.next(&mut rng, 0);
        assert!(r.proc == NEW_ORDER_PROC || r.proc == PAYMENT_PROC);
        if let Some(a) = r.args.downcast_ref::<NewOrderArgs>() {
            assert!(a.all_local, "one warehouse: everything local");
        }
    }
}

#[test]
fn remote_scope_region_draws_remote_warehouses_from_other_regions_and_by_id_only_selects_no_name() {
    // Four nodes in two regions: partitions 0 and 1 are homed in region 0, 2 and 3 in region 1.
    let mut topo = Topology::new(4, 1, 1);
    topo.node_region = vec![0, 0, 1, 1];
    let p = WorkloadParams {
        name: "tpcc".into(),
        warehouses: 8,
        mix: "neworder-payment".into(),
        neworder_remote: 0.5,
        payment_remote: 0.5,
        remote_in_other_region: true,
        by_last_name: 0.0,
        ..Default::default()
    };
    let wl = Tpcc::new(&p, &topo).unwrap();
    let region = |w: u32| topo.home_region((w - 1) % 4);
    let mut rng = crate::util::rng_from_seed(3);
    let (mut remote, mut seen) = (0, std::collections::BTreeSet::new());
    for i in 0..4000u32 {
        let req = wl.next(&mut rng, i % 4);
        let (w, others): (u32, Vec<u32>) = match req.proc {
            NEW_ORDER_PROC => {
                let a = req.args::<NewOrderArgs>();
                (a.w, a.lines[..a.n].iter().map(|l| l.supply_w).filter(|&s| s != a.w).collect())
            }
            _ => {
                let a = req.args::<PaymentArgs>();
                assert!(matches!(a.cust, CustomerSel::Id(_)), "by id only");
                (a.w, if a.c_w != a.w { vec![a.c_w] } else { vec![] })
            }
        };
        for o in others {
            assert_ne!(region(o), region(w), "warehouse {w}'s remote {o} lies in its own region");
            remote += 1;
            seen.insert(o);
        }
    }
    assert!(remote > 1000, "{remote} remote accesses");
    assert_eq!(seen.len(), 8, "every warehouse is some other region's remote: {seen:?}");
    // One region of data: nothing is homed elsewhere.
    let err = Tpcc::new(&p, &Topology::new(2, 1, 1)).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("--remote-scope region") && err.contains("another region"), "{err}");
}

#[test]
fn bad_parameters_are_rejected_with_the_flag_named() {
    let topo = Topology::new(1, 1, 1);
    let cases = [
        (WorkloadParams { warehouses: 0, ..Default::default() }, "--warehouses 0"),
        (WorkloadParams { mix: "45,43,4,4,5".into(), ..Default::default() }, "sums to 101"),
        (WorkloadParams { mix: "bogus".into(), ..Default::default() }, "--mix `bogus`"),
        (WorkloadParams { neworder_remote: 1.5, ..Default::default() }, "--neworder-remote 1.5"),
        (WorkloadParams { payment_remote: -0.1, ..Default::default() }, "--payment-remote -0.1"),
        (WorkloadParams { payment_remote: f64::NAN, ..Default::default() }, "--payment-remote NaN"),
        (WorkloadParams { by_last_name: 1.5, ..Default::default() }, "--by-last-name 1.5"),
    ];
    for (p, want) in cases {
        let err = Tpcc::new(&p, &topo).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(want), "{p:?}: `{err}` lacks `{want}`");
        assert!(!err.contains('\n'));
    }
    assert_eq!(parse_mix("10,20,30,20,20").unwrap(), [10, 20, 30, 20, 20]);
    let p = WorkloadParams { name: "tpcc".into(), ..Default::default() };
    assert!(crate::workloads::build(&p, &topo).is_ok());
}

#[test]
fn declared_keys_cover_every_access_and_reconnaissance_finds_them() {
    // Two warehouses in two partitions held by one storage, so remote lines and payments run.
    let (wl, _) = tpcc(2, 2, "standard");
    let store = loaded(&wl, &[0, 1]);
    let mut rng = crate::util::rng_from_seed(5);
    let mut committed = std::collections::BTreeMap::<&str, u32>::new();
    let mut rolled_back = 0;
    for i in 0..3000u32 {
        let req = wl.next(&mut rng, i % 2);
        match run_direct(&wl, &store, &req) {
            Ok(_) => *committed.entry(req.proc).or_default() += 1,
            Err(Abort::User) => {
                assert_eq!(req.proc, NEW_ORDER_PROC);
                assert!(req.args::<NewOrderArgs>().lines.iter().any(|l| l.i == UNUSED_ITEM));
                rolled_back += 1;
            }
            Err(a) => panic!("{}: {a:?}", req.proc),
        }
    }
    assert!(rolled_back > 0 && committed.len() == 5, "{committed:?}, {rolled_back} rolled back");
    // The database is still consistent, and deliveries moved the cursors.
    for (cond, ok, detail) in checks(&wl, &store) {
        assert!(ok, "{cond}: {detail}");
    }
    let cursor = store.get(delivery_cursor_key(1, 1)).unwrap().lock().value.clone().unwrap();
    assert!(u32_at(&cursor, next_o::O_ID) > FIRST_UNDELIVERED);
}

#[test]
fn procedures_do_what_the_spec_says() {
    let (wl, _) = tpcc(1, 1, "standard");
    let store = loaded(&wl, &[0]);
    let get = |k: RowKey| store.get(k).unwrap().lock().value.clone().unwrap();
    // New-Order: D_NEXT_O_ID advances, rows inserted, stock updated.
    let mut lines = [Line::default(); 15];
    for (k, l) in lines.iter_mut().enumerate().take(5) {
        *l = Line { i: 100 + k as u32, supply_w: 1, qty: 3 };
    }
    let stock_before = u32_at(&get(stock_key(1, 100)), stock::QUANTITY);
    let no = NewOrderArgs { w: 1, d: 4, c: 77, n: 5, lines, all_local: true, o_hint: 3001 };
    let req = TxnRequest { proc: NEW_ORDER_PROC, home: 0, args: std::sync::Arc::new(no.clone()) };
    run_direct(&wl, &store, &req).unwrap();
    assert_eq!(u32_at(&get(district_key(1, 4, D_NEXT_PART)), next_o::O_ID), 3002);
    let o = get(order_key(1, 4, 3001));
    assert_eq!((u32_at(&o, order::C_ID), u32_at(&o, order::OL_CNT), u32_at(&o, order::CARRIER_ID)), (77, 5, 0));
    assert!(store.get(new_order_key(1, 4, 3001)).unwrap().lock().value.is_some());
    let ol = get(order_line_key(1, 4, 3001, 5));
    assert_eq!(u32_at(&ol, order_line::I_ID), 104);
    let price = i64_at(&get(item_key(0, 104)), item::PRICE);
    assert_eq!(i64_at(&ol, order_line::AMOUNT), 3 * price);
    let s = get(stock_key(1, 100));
    let q = u32_at(&s, stock::QUANTITY);
    assert!(q == stock_before - 3 || q == stock_before + 88);
    assert_eq!((u64_at(&s, stock::YTD), u32_at(&s, stock::ORDER_CNT)), (3, 1));
    // Rolled back: nothing changes.
    let mut bad = no.clone();
    bad.lines[4].i = UNUSED_ITEM;
    let req = TxnRequest { proc: NEW_ORDER_PROC, home: 0, args: std::sync::Arc::new(bad) };
    assert_eq!(run_direct(&wl, &store, &req).err(), Some(Abort::User));
    assert_eq!(u32_at(&get(district_key(1, 4, D_NEXT_PART)), next_o::O_ID), 3002);
    // Order-Status finds that order as customer 77's newest.
    let req = TxnRequest {
        proc: ORDER_STATUS_PROC,
        home: 0,
        args: std::sync::Arc::new(OrderStatusArgs { w: 1, d: 4, cust: CustomerSel::Id(77) }),
    };
    let mut keys = KeySet::default();
    assert!(!wl.declare(&req, &mut keys));
    let mut probe = Direct::new(&store);
    now(wl.run(&req, &mut Ctx::new(&mut probe))).unwrap();
    assert!(probe.keys.reads.contains(&order_key(1, 4, 3001)), "newest order of customer 77 is 3001");
    // Payment by last name picks the middle customer by first name.
    let last = 5;
    let lo = cust_by_name_key(1, 2, last, 0).key;
    let mut matches: Vec<(Vec<u8>, u32)> = store
        .table(CUST_BY_NAME)
        .range(lo, lo + 0xffff, 1000, false)
        .into_iter()
        .map(|(k, r)| (str_at(r.lock().value.as_ref().unwrap(), by_name::FIRST).to_vec(), customer_of_name_key(k)))
        .collect();
    matches.sort();
    let want = matches[matches.len().div_ceil(2) - 1].1;
    let before = get(customer_key(1, 2, want, C_MUTABLE));
    let pay = PaymentArgs {
        w: 1,
        d: 9,
        c_w: 1,
        c_d: 2,
        cust: CustomerSel::Last(last),
        amount: 12_345,
        h_key: history_key(1, 1, 0),
        c_hint: 0,
    };
    let req = TxnRequest { proc: PAYMENT_PROC, home: 0, args: std::sync::Arc::new(pay) };
    run_direct(&wl, &store, &req).unwrap();
    let after = get(customer_key(1, 2, want, C_MUTABLE));
    assert_eq!(i64_at(&after, cust_mut::BALANCE), i64_at(&before, cust_mut::BALANCE) - 12_345);
    assert_eq!(u32_at(&after, cust_mut::PAYMENT_CNT), 2);
    assert_eq!(i64_at(&get(warehouse_key(1, W_YTD_PART)), ytd::YTD), 30_000_000 + 12_345);
    assert_eq!(i64_at(&get(district_key(1, 9, D_YTD_PART)), ytd::YTD), 3_000_000 + 12_345);
    let h = get(history_key(1, 1, 0));
    assert_eq!((u32_at(&h, history::C_ID), i64_at(&h, history::AMOUNT)), (want, 12_345));
    // Delivery: the oldest undelivered order of each district, 2101 (and 3001 stays in d=4).
    let c2101 = u32_at(&get(order_key(1, 1, 2101)), order::C_ID);
    let bal = i64_at(&get(customer_key(1, 1, c2101, C_MUTABLE)), cust_mut::BALANCE);
    let req = TxnRequest { proc: DELIVERY_PROC, home: 0, args: std::sync::Arc::new(DeliveryArgs { w: 1, carrier: 7 }) };
    run_direct(&wl, &store, &req).unwrap();
    assert!(store.get(new_order_key(1, 1, 2101)).unwrap().lock().value.is_none());
    assert!(store.get(new_order_key(1, 1, 2102)).unwrap().lock().value.is_some());
    assert_eq!(u32_at(&get(order_key(1, 1, 2101)), order::CARRIER_ID), 7);
    let cnt = u32_at(&get(order_key(1, 1, 2101)), order::OL_CNT);
    let sum: i64 = (1..=cnt).map(|ol| i64_at(&get(order_line_key(1, 1, 2101, ol)), order_line::AMOUNT)).sum();
    assert!((1..=cnt).all(|ol| u64_at(&get(order_line_key(1, 1, 2101, ol)), order_line::DELIVERY_D) > 0));
    let cm = get(customer_key(1, 1, c2101, C_MUTABLE));
    assert_eq!(i64_at(&cm, cust_mut::BALANCE), bal + sum);
    assert_eq!(u32_at(&cm, cust_mut::DELIVERY_CNT), 1);
    for (cond, ok, detail) in checks(&wl, &store) {
        assert!(ok, "{cond}: {detail}");
    }
}

#[test]
fn a_wrong_estimate_strays_then_the_retry_carries_the_right_one() {
    let (wl, _) = tpcc(1, 1, "neworder-payment");
    let store = loaded(&wl, &[0]);
    let one_shot = |req: &TxnRequest| {
        let mut keys = KeySet::default();
        assert!(wl.declare(req, &mut keys));
        let mut d = Direct::new(&store);
        let r = now(wl.run(req, &mut Ctx::with_declared(&mut d, &keys)));
        if r.is_ok() {
            d.commit();
        }
        r
    };
    let mut lines = [Line::default(); 15];
    for (k, l) in lines.iter_mut().enumerate().take(5) {
        *l = Line { i: 1 + k as u32, supply_w: 1, qty: 1 };
    }
    // Another process committed order 3001 behind this one's back: the estimate is stale.
    let mut req = TxnRequest {
        proc: NEW_ORDER_PROC,
        home: 0,
        args: std::sync::Arc::new(NewOrderArgs { w: 1, d: 1, c: 1, n: 5, lines, all_local: true, o_hint: 3000 }),
    };
    assert_eq!(one_shot(&req).err(), Some(Abort::ReconMismatch));
    let mut rng = crate::util::rng_from_seed(1);
    wl.before_retry(&mut req, &mut rng);
    assert_eq!(req.args::<NewOrderArgs>().o_hint, 3001);
    one_shot(&req).unwrap();
    // The next New-Order of that district expects 3002.
    assert_eq!(wl.o_hint(1, 1).load(Ordering::Relaxed), 3002);
    // Payment by last name: reconnaissance the first time, then the learned customer.
    let pay = |c_hint| PaymentArgs {
        w: 1,
        d: 1,
        c_w: 1,
        c_d: 1,
        cust: CustomerSel::Last(42),
        amount: 100,
        h_key: history_key(1, 1, 9),
        c_hint,
    };
    let mut req = TxnRequest { proc: PAYMENT_PROC, home: 0, args: std::sync::Arc::new(pay(0)) };
    assert!(!wl.declare(&req, &mut KeySet::default()));
    run_direct(&wl, &store, &req).unwrap();
    wl.before_retry(&mut req, &mut rng);
    let learned = req.args::<PaymentArgs>().c_hint;
    assert_ne!(learned, 0);
    let wrong = if learned == 1 { 2 } else { 1 };
    let req = TxnRequest { proc: PAYMENT_PROC, home: 0, args: std::sync::Arc::new(pay(wrong)) };
    assert_eq!(one_shot(&req).err(), Some(Abort::ReconMismatch));
    let req = TxnRequest { proc: PAYMENT_PROC, home: 0, args: std::sync::Arc::new(pay(learned)) };
    one_shot(&req).unwrap();
}

#[test]
fn the_check_finds_violations() {
    let (wl, _) = tpcc(1, 1, "standard");
    let store = loaded(&wl, &[0]);
    let set = |k: RowKey, v: Option<Value>| store.get_or_create(k).lock().value = v;
    // 1: W_YTD off by a cent. 2: an order beyond D_NEXT_O_ID in d=2. 3: a hole in NEW-ORDER of
    // d=3. 4: a missing order line in d=4.
    set(warehouse_key(1, W_YTD_PART), Some(build(ytd::LEN, |b| set_i64(b, ytd::YTD, 30_000_001))));
    set(order_key(1, 2, 3001), store.get(order_key(1, 2, 3000)).unwrap().lock().value.clone());
    set(new_order_key(1, 3, 2500), None);
    set(order_line_key(1, 4, 17, 1), None);
    let results = checks(&wl, &store);
    assert_eq!(results.len(), 4);
    let failed: Vec<&str> = results.iter().filter(|r| !r.1).map(|r| r.0.as_str()).collect();
    assert_eq!(
        failed,
        vec![
            "3.3.2.1 W_YTD = sum(D_YTD) [w=1]",
            "3.3.2.2 D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) [w=1]",
            "3.3.2.3 max(NO_O_ID) - min(NO_O_ID) + 1 = rows in NEW-ORDER [w=1]",
            "3.3.2.4 sum(O_OL_CNT) = rows in ORDER-LINE [w=1]"
        ],
        "{results:#?}"
    );
    assert!(results[1].2.contains("d=2"), "{}", results[1].2);
    assert!(results[2].2.contains("d=3"), "{}", results[2].2);
    assert!(results[3].2.contains("d=4"), "{}", results[3].2);
}

fn sim_spec(protocol: &str, mix: &str, seed: u64) -> crate::host::BenchSpec {
    let wl = WorkloadParams { name: "tpcc".into(), warehouses: 2, mix: mix.into(), ..Default::default() };
    let mut spec = crate::host::BenchSpec::new(protocol, wl, crate::host::Runtime::Sim);
    spec.nodes = 2;
    spec.inflight = 16;
    spec.duration_us = 200_000;
    spec.warmup_us = 0;
    spec.latency.delay_us = 100;
    spec.latency.jitter_us = 50;
    spec.seed = seed;
    spec
}

fn consistent_in_simulation(one_shot: bool, seed: u64) {
    // Without a log (`testkit::run` keeps none): `rolis` runs TPC-C in tests/sim_tpcc_bank.rs.
    for p in crate::protocols::ready_with(crate::replication::Durability::None, 3) {
        let mut spec = sim_spec(p.name, "standard", seed);
        spec.proto.one_shot = one_shot;
        let run = crate::testkit::run(&spec);
        let what = format!("{} one_shot={one_shot}", p.name);
        run.assert_checks_pass(&what);
        assert_eq!(run.checks.len(), 8, "{what}: 4 conditions x 2 warehouses: {:#?}", run.checks);
        for kind in [NEW_ORDER_PROC, PAYMENT_PROC, ORDER_STATUS_PROC, DELIVERY_PROC, STOCK_LEVEL_PROC] {
            assert!(run.committed.get(kind).copied().unwrap_or(0) > 0, "{what}: no {kind} committed: {run:?}");
        }
        assert!(run.user_aborts > 0, "{what}: no New-Order rolled back: {run:?}");
    }
}

/// 2 nodes, 2 warehouses, the standard mix, 0.2 s: conditions 1-4 hold for every protocol.
#[test]
fn every_protocol_keeps_tpcc_consistent_one_shot() {
    consistent_in_simulation(true, 1);
}

#[test]
fn every_protocol_keeps_tpcc_consistent_interactive() {
    consistent_in_simulation(false, 2);
}

#[test]
fn tpcc_runs_under_the_bench_driver() {
    let spec = sim_spec("occ", "neworder-payment", 3);
    let out = crate::host::run_sim(&spec).unwrap();
    assert!(out.notes.is_empty(), "{:?}", out.notes);
    assert!(out.totals.committed > 500, "{} committed", out.totals.committed);
}
