//! Randomized tests: serial executions of random transactions (serializable by construction)
//! must check valid in any line order; corrupting one read must make them invalid.

use dtx_check::{check_history, check_reader, AnomalyKind, CheckReport, Op, Status, Txn};
use std::collections::HashMap;
use std::io::Cursor;

/// SplitMix64: small, deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Runs `n` random transactions one at a time against an in-memory list store, then a final
/// committed transaction reading every key. Aborted transactions (10%) leave no effects;
/// unknown ones (10%) take effect half of the time and sometimes carry junk reads.
fn serial_history(
    rng: &mut Rng,
    n: usize,
    mut key_of: impl FnMut(&mut Rng, usize) -> u64,
    with_time: bool,
) -> Vec<Txn> {
    let mut state: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut next_value = 1u64;
    let mut txns = Vec::with_capacity(n + 1);
    for i in 0..n {
        let status = match rng.below(10) {
            0 => Status::Aborted,
            1 => Status::Unknown,
            _ => Status::Committed,
        };
        let nops = 1 + rng.below(5);
        let mut ops = Vec::new();
        let mut pushed = Vec::new();
        for _ in 0..nops {
            let key = key_of(rng, i);
            let list = state.entry(key).or_default();
            if rng.percent(50) {
                ops.push(Op::Read { key, list: Some(list.clone()), retires: false });
            } else {
                let value = next_value;
                next_value += 1;
                list.push(value);
                pushed.push(key);
                ops.push(Op::Append { key, value });
            }
        }
        let applied = match status {
            Status::Committed => true,
            Status::Aborted => false,
            Status::Unknown => rng.percent(50),
        };
        if !applied {
            for key in pushed.iter().rev() {
                if let Some(l) = state.get_mut(key) {
                    l.pop();
                }
            }
        }
        if status != Status::Committed {
            // The attempt may have died before its last read returned, or (unknown) its reads
            // may be meaningless.
            let junk = status == Status::Unknown && rng.percent(20);
            let cut = rng.percent(30);
            if let Some(Op::Read { list, .. }) = ops.iter_mut().rev().find(|o| matches!(o, Op::Read { .. })) {
                if junk {
                    *list = Some(vec![u64::MAX - i as u64, 3]);
                } else if cut {
                    *list = None;
                }
            }
        }
        let t = 10 * i as u64;
        txns.push(Txn {
            id: 1000 + i as u64,
            status,
            ops,
            start_us: with_time.then_some(t),
            end_us: with_time.then_some(t + 5),
        });
    }
    let mut keys: Vec<u64> = state.keys().copied().collect();
    keys.sort_unstable();
    let t = 10 * n as u64;
    txns.push(Txn {
        id: 1000 + n as u64,
        status: Status::Committed,
        ops: keys.iter().map(|&key| Op::Read { key, list: Some(state[&key].clone()), retires: false }).collect(),
        start_us: with_time.then_some(t),
        end_us: with_time.then_some(t + 5),
    });
    txns
}

/// Serializes the history to JSON lines in a shuffled order (keeping the final read last
/// unless `shuffle_final`) and checks it through the text interface.
fn shuffle_and_check(rng: &mut Rng, txns: &[Txn], shuffle_final: bool) -> CheckReport {
    let mut lines: Vec<String> = txns.iter().map(|t| serde_json::to_string(t).expect("serialize txn")).collect();
    let end = if shuffle_final { lines.len() } else { lines.len() - 1 };
    rng.shuffle(&mut lines[..end]);
    let text = lines.join("\n") + "\n";
    check_reader(Cursor::new(text)).expect("generated history parses")
}

fn small_keys(nkeys: u64) -> impl FnMut(&mut Rng, usize) -> u64 {
    move |rng, _| rng.below(nkeys)
}

#[test]
fn shuffled_serial_histories_are_valid() {
    for seed in 0..60u64 {
        let mut rng = Rng(seed);
        let with_time = seed % 2 == 0;
        let nkeys = 1 + seed % 6;
        let txns = serial_history(&mut rng, 300, small_keys(nkeys), with_time);
        let r = shuffle_and_check(&mut rng, &txns, with_time);
        assert!(r.valid, "seed {seed}: {}\n{:#?}", r.summary(), &r.anomalies[..r.anomalies.len().min(5)]);
        assert_eq!(r.txns, 301);
        // Checking is independent of line order.
        let direct = check_history(&txns);
        assert!(direct.valid);
        assert_eq!(direct.committed, r.committed);
    }
}

/// Which read to corrupt, and how.
#[derive(Clone, Copy, Debug)]
enum Corruption {
    /// Swap the last two values of a committed read.
    Swap,
    /// Add a value nobody appended.
    Garbage,
    /// Add a value appended by an aborted transaction.
    AbortedValue,
    /// Drop a committed append from the final read.
    DropFromFinal,
    /// Make a read that precedes the reader's own append to the key miss the last value.
    Stale,
}

/// Committed non-final reads `(txn index, op index)` with at least `min_len` values.
fn committed_reads(txns: &[Txn], min_len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (ti, t) in txns[..txns.len() - 1].iter().enumerate() {
        if t.status != Status::Committed {
            continue;
        }
        for (oi, op) in t.ops.iter().enumerate() {
            if let Op::Read { list: Some(l), .. } = op {
                if l.len() >= min_len {
                    out.push((ti, oi));
                }
            }
        }
    }
    out
}

fn read_mut(txns: &mut [Txn], (ti, oi): (usize, usize)) -> &mut Vec<u64> {
    match &mut txns[ti].ops[oi] {
        Op::Read { list: Some(l), .. } => l,
        _ => panic!("not a completed read"),
    }
}

/// Applies the corruption; returns the anomaly kinds that may legitimately result, or None if
/// this history offers no place to apply it.
fn corrupt(rng: &mut Rng, txns: &mut [Txn], c: Corruption) -> Option<Vec<AnomalyKind>> {
    let pick = |rng: &mut Rng, v: &[(usize, usize)]| (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize]);
    match c {
        Corruption::Swap => {
            let at = pick(rng, &committed_reads(txns, 2))?;
            let l = read_mut(txns, at);
            let n = l.len();
            l.swap(n - 1, n - 2);
            Some(vec![AnomalyKind::IncompatibleOrder])
        }
        Corruption::Garbage => {
            let at = pick(rng, &committed_reads(txns, 0))?;
            read_mut(txns, at).push(u64::MAX / 3);
            Some(vec![AnomalyKind::GarbageRead])
        }
        Corruption::AbortedValue => {
            let mut aborted = Vec::new();
            for t in txns.iter().filter(|t| t.status == Status::Aborted) {
                for op in &t.ops {
                    if let Op::Append { key, value } = op {
                        aborted.push((*key, *value));
                    }
                }
            }
            let reads: Vec<(usize, usize)> = committed_reads(txns, 0);
            let mut options = Vec::new();
            for &(key, value) in &aborted {
                for &(ti, oi) in &reads {
                    if txns[ti].ops[oi].key() == key {
                        options.push((ti, oi, value));
                    }
                }
            }
            if options.is_empty() {
                return None;
            }
            let (ti, oi, value) = options[rng.below(options.len() as u64) as usize];
            read_mut(txns, (ti, oi)).push(value);
            Some(vec![AnomalyKind::G1a])
        }
        Corruption::DropFromFinal => {
            let writers: HashMap<(u64, u64), Status> = txns
                .iter()
                .flat_map(|t| {
                    t.ops.iter().filter_map(move |op| match op {
                        Op::Append { key, value } => Some(((*key, *value), t.status)),
                        _ => None,
                    })
                })
                .collect();
            let last = txns.len() - 1;
            let mut options = Vec::new();
            for (oi, op) in txns[last].ops.iter().enumerate() {
                if let Op::Read { key, list: Some(l), .. } = op {
                    for (p, v) in l.iter().enumerate() {
                        if writers.get(&(*key, *v)) == Some(&Status::Committed) {
                            options.push((oi, p));
                        }
                    }
                }
            }
            if options.is_empty() {
                return None;
            }
            let (oi, p) = options[rng.below(options.len() as u64) as usize];
            read_mut(txns, (last, oi)).remove(p);
            Some(vec![AnomalyKind::LostAppend])
        }
        Corruption::Stale => {
            // A committed txn's first access to a key is a non-empty read, later followed by
            // its own append to that key: dropping the read's last value v creates T -rw->
            // writer(v) -ww-> T (G-single), or a G1b if v's writer appended twice in a row.
            let mut options = Vec::new();
            for (ti, t) in txns[..txns.len() - 1].iter().enumerate() {
                if t.status != Status::Committed {
                    continue;
                }
                for (oi, op) in t.ops.iter().enumerate() {
                    let Op::Read { key, list: Some(l), .. } = op else {
                        continue;
                    };
                    let first = t.ops[..oi].iter().all(|o| o.key() != *key);
                    let appends_later =
                        t.ops[oi + 1..].iter().any(|o| matches!(o, Op::Append { key: k, .. } if k == key));
                    if first && appends_later && !l.is_empty() {
                        options.push((ti, oi));
                    }
                }
            }
            let at = pick(rng, &options)?;
            read_mut(txns, at).pop();
            Some(vec![AnomalyKind::GSingle, AnomalyKind::G1b])
        }
    }
}

#[test]
fn corrupting_one_read_is_detected() {
    let kinds =
        [Corruption::Swap, Corruption::Garbage, Corruption::AbortedValue, Corruption::DropFromFinal, Corruption::Stale];
    for c in kinds {
        let mut applied = 0;
        for seed in 0..40u64 {
            let mut rng = Rng(1_000 + seed);
            let nkeys = 1 + seed % 5;
            let mut txns = serial_history(&mut rng, 200, small_keys(nkeys), seed % 2 == 0);
            let Some(expected) = corrupt(&mut rng, &mut txns, c) else {
                continue;
            };
            applied += 1;
            let r = shuffle_and_check(&mut rng, &txns, false);
            assert!(!r.valid, "{c:?}, seed {seed}: corruption not detected");
            assert!(
                r.anomalies.iter().any(|a| expected.contains(&a.kind)),
                "{c:?}, seed {seed}: expected one of {expected:?}, got {}\n{:#?}",
                r.summary(),
                r.anomalies
            );
        }
        assert!(applied >= 20, "{c:?} applied only {applied} times");
    }
}

/// 1e6 transactions, 1..=5 ops each (about 3 on average), over a sliding window of 16 keys.
/// Run with `cargo test -p dtx-check --release -- --ignored --nocapture`.
#[test]
#[ignore]
fn perf_one_million_txns() {
    let mut rng = Rng(42);
    let n = 1_000_000;
    let t0 = std::time::Instant::now();
    let txns = serial_history(&mut rng, n, |rng, i| (i / 6) as u64 + rng.below(16), true);
    let mut text = String::new();
    for t in &txns {
        text.push_str(&serde_json::to_string(t).expect("serialize"));
        text.push('\n');
    }
    drop(txns);
    let ops_per_txn = text.matches("[\"").count() as f64 / (n + 1) as f64;
    eprintln!("generated {} MB ({ops_per_txn:.1} ops/txn) in {:?}", text.len() >> 20, t0.elapsed());
    let t1 = std::time::Instant::now();
    let txns = dtx_check::read_history(Cursor::new(text.as_bytes())).expect("parse");
    let parsed = t1.elapsed();
    let t2 = std::time::Instant::now();
    let r = check_history(&txns);
    let checked = t2.elapsed();
    eprintln!("parse {parsed:?}, check {checked:?}: {}", r.summary());
    assert!(r.valid);
}
