use super::*;
use crate::RunReport;
use std::collections::BTreeMap;

const FILE: &str = r#"
name = "toy"
title = "A toy sweep"
paper = "Toy (2026)"
figure = "Figure 1"
measures = "throughput of a and b"
protocols = ["a", "b"]
takes = { full_s = 10, quick_s = 1 }
[bench]
workload = "ycsb"
[sweep]
param = "theta"
values = [0.0, 0.5, 0.9]
[[claim]]
text = "a beats b at 0.9"
kind = "value"
metric = "throughput"
of = "a"
over = "b"
at = 0.9
paper = 2.0
band = [1.5, 2.5]
[[claim]]
text = "a over b rises"
kind = "rising"
metric = "throughput"
of = "a"
over = "b"
band = [1.5, 10]
[[claim]]
text = "a crosses b"
kind = "crossing"
metric = "throughput"
of = "a"
over = "b"
paper = 0.3
band = [0.2, 0.4]
"#;

fn run(protocol: &str, point: f64, repeat: u32, tps: f64) -> RunReport {
    let mut r = RunReport { protocol: protocol.into(), throughput_tps: tps, committed: 100, ..Default::default() };
    r.params.insert(POINT_KEY.into(), serde_json::json!(point));
    r.params.insert(REPEAT_KEY.into(), serde_json::json!(repeat));
    r
}

/// a/b at theta 0, 0.5, 0.9 is 0.5, 1.5, `last` (b is 100 everywhere).
fn report(last: &[f64]) -> ExperimentReport {
    let def = Experiment::parse(FILE).unwrap();
    let mut runs = Vec::new();
    for (rep, l) in last.iter().enumerate() {
        for (x, ratio) in [(0.0, 0.5), (0.5, 1.5), (0.9, *l)] {
            runs.push(run("a", x, rep as u32, 100.0 * ratio));
            runs.push(run("b", x, rep as u32, 100.0));
        }
    }
    ExperimentReport {
        experiment: def.name.clone(),
        paper: def.paper.clone(),
        figure: def.figure.clone(),
        claims: Vec::new(),
        runs,
        title: def.title.clone(),
        measures: def.measures.clone(),
        notes: String::new(),
        quick: false,
        repeat: last.len() as u32,
        points: def.points(false),
        run_wall_s: vec![0.1; last.len() * 6],
        failures: Vec::new(),
        provenance: Provenance::default(),
        definition: def,
        rejudged: None,
    }
}

/// The report of `last` (as [`report`]) judged by `FILE` with `from` replaced by `to`.
fn report_with(last: &[f64], from: &str, to: &str) -> ExperimentReport {
    let mut r = report(last);
    assert!(FILE.contains(from), "{from}");
    r.definition = Experiment::parse(&FILE.replacen(from, to, 1)).unwrap();
    r
}

#[test]
fn ratio_verdicts_and_repeats_take_the_median() {
    let c = report(&[2.0]).evaluate();
    assert_eq!((c[0].measured, c[0].verdict), (Some(2.0), Verdict::Reproduced));
    let c = report(&[1.2]).evaluate();
    assert_eq!(c[0].verdict, Verdict::SameDirection, "above 1 like the paper's 2.0, outside the band");
    let c = report(&[0.8]).evaluate();
    assert_eq!(c[0].verdict, Verdict::NotReproduced);
    let c = report(&[1.0, 3.0, 2.2]).evaluate();
    assert_eq!((c[0].measured, c[0].min, c[0].max), (Some(2.2), Some(1.0), Some(3.0)));
    assert_eq!(c[0].verdict, Verdict::Reproduced);
}

#[test]
fn a_trend_is_last_over_first() {
    // 0.5 -> 2.0: rises 4x.
    let c = report(&[2.0]).evaluate();
    assert_eq!((c[1].measured, c[1].verdict), (Some(4.0), Verdict::Reproduced));
    // 0.5 -> 0.6: rises, but less than the band asks.
    let c = report(&[0.6]).evaluate();
    assert_eq!(c[1].verdict, Verdict::SameDirection);
    let c = report(&[0.25]).evaluate();
    assert_eq!(c[1].verdict, Verdict::NotReproduced);
}

#[test]
fn a_crossing_is_interpolated() {
    // 0.5 at 0, 1.5 at 0.5: crosses 1 at 0.25.
    let c = report(&[2.0]).evaluate();
    let x = c[2].measured.unwrap();
    assert!((x - 0.25).abs() < 1e-9, "{x}");
    assert_eq!(c[2].verdict, Verdict::Reproduced);
    assert_eq!(verdict::crossing_x(&[(0.0, 0.5), (1.0, 0.9)]), None);
    assert_eq!(verdict::crossing_x(&[(0.0, 2.0), (1.0, 1.5), (2.0, 0.5)]), Some(1.5));
}

#[test]
fn a_crossing_that_never_happens_is_not_reproduced_and_says_why() {
    let mut r = report(&[2.0]);
    for run in &mut r.runs {
        if run.protocol == "a" {
            run.throughput_tps = 50.0;
        }
    }
    let c = r.evaluate();
    assert_eq!((c[2].measured, c[2].verdict), (None, Verdict::NotReproduced));
    assert!(c[2].note.as_deref().unwrap().contains("does not cross"));
}

#[test]
fn agreement_between_two_points() {
    let text = FILE.replace(
        "[[claim]]\ntext = \"a beats b at 0.9\"",
        "[[claim]]\ntext = \"agree\"\nkind = \"between\"\nmetric = \"throughput\"\nof = \"a\"\nover = \"b\"\nat = [0.9, 0.5]\nband = [0.8, 1.25]\n[[claim]]\ntext = \"a beats b at 0.9\"",
    );
    let mut r = report(&[1.6]);
    r.definition = Experiment::parse(&text).unwrap();
    let c = r.evaluate();
    // 1.6 / 1.5
    assert!((c[0].measured.unwrap() - 1.6 / 1.5).abs() < 1e-9);
    assert_eq!(c[0].verdict, Verdict::Reproduced);
    let mut r = report(&[3.0]);
    r.definition = Experiment::parse(&text).unwrap();
    assert_eq!(r.evaluate()[0].verdict, Verdict::SameDirection, "both above 1, 2x apart");
    let mut r = report(&[0.5]);
    r.definition = Experiment::parse(&text).unwrap();
    assert_eq!(r.evaluate()[0].verdict, Verdict::NotReproduced, "0.5 against 1.5: opposite sides of 1");
}

#[test]
fn malformed_files_name_the_field() {
    let err = |from: &str, to: &str| format!("{:#}", Experiment::parse(&FILE.replacen(from, to, 1)).unwrap_err());
    assert!(err("kind = \"value\"", "kind = \"ratoi\"").contains("kind: unknown `ratoi`"));
    assert!(err("metric = \"throughput\"", "metric = \"speed\"").contains("unknown metric `speed`"));
    assert!(err("of = \"a\"", "of = \"c\"").contains("`c` is not among protocols"));
    assert!(err("at = 0.9", "at = 0.7").contains("at: 0.7 is not among the sweep's values"));
    assert!(err("band = [1.5, 2.5]", "band = [2.5, 1.5]").contains("band"));
    assert!(err("title = ", "titel = ").contains("titel"));
    assert!(err("[bench]", "[bench]\nprotocol = \"occ\"").contains("[bench] protocol"));
}

#[test]
fn claims_table_plot_and_page_render() {
    let mut r = report(&[2.0, 2.2]);
    r.claims = r.evaluate();
    let table = render_claims("toy", &r.claims);
    assert!(table.contains("a beats b at 0.9") && table.contains("reproduced"), "{table}");
    let svg = svg::render(&r).unwrap();
    assert!(svg.contains("<svg") && svg.contains("theta"));
    let page = html::render(std::slice::from_ref(&r), &[], "today");
    assert!(page.contains("viewBox=") && page.contains("a beats b at 0.9") && page.contains("v-reproduced"));
    assert!(!page.contains("<?xml"), "an inlined plot has no prologue");
    // Round trip through the JSON the run writes, an unbounded band included.
    r.definition.claims[0].band[1] = f64::INFINITY;
    r.claims = r.evaluate();
    let back: ExperimentReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.evaluate(), r.claims);
}

#[test]
fn three_significant_digits() {
    assert_eq!(sig3(1.5678), "1.57");
    assert_eq!(sig3(0.031234), "0.0312");
    assert_eq!(sig3(14.0), "14.0");
    assert_eq!(sig3(231_000.0), "231.0k");
    assert_eq!(sig3(0.0), "0");
}

#[test]
fn per_protocol_flags_go_over_the_shared_ones() {
    let text = FILE.replace(
        "[bench]\nworkload = \"ycsb\"",
        "[bench]\nworkload = \"ycsb\"\nnodes = 2\n[bench.protocol.b]\nnodes = 3\nread_ratio = 0.5\n\
         [quick]\nduration = \"0.3\"\n[quick.protocol.\"b\"]\nduration = \"0.2\"",
    );
    let e = Experiment::parse(&text).unwrap();
    let get = |p: &str, quick: bool, k: &str| {
        e.flags_of(p, quick).into_iter().find(|(f, _)| f == k).map(|(_, v)| v).unwrap_or_default()
    };
    assert_eq!((get("a", false, "nodes"), get("b", false, "nodes")), ("2".into(), "3".into()));
    assert_eq!((get("a", true, "duration"), get("b", true, "duration")), ("0.3".into(), "0.2".into()));
    assert_eq!(get("a", false, "read_ratio"), "");
    let bad = text.replace("[bench.protocol.b]", "[bench.protocol.c]");
    let err = format!("{:#}", Experiment::parse(&bad).unwrap_err());
    assert!(err.contains("[bench.protocol.\"c\"]") && err.contains("not among protocols"), "{err}");
    let swept = text.replace("read_ratio = 0.5", "theta = 0.5");
    let err = format!("{:#}", Experiment::parse(&swept).unwrap_err());
    assert!(err.contains("theta: the sweep sets it"), "{err}");
}

#[test]
fn an_option_sweep_runs_variants_of_its_protocols() {
    let text = FILE.replace("[sweep]\nparam = \"theta\"", "[sweep]\noption = \"lock_wait_us\"\nprotocols = [\"a\"]");
    let e = Experiment::parse(&text).unwrap();
    let s = e.sweep.as_ref().unwrap();
    assert!(s.option && s.param == "lock_wait_us");
    let v = serde_json::json!(0.5);
    assert_eq!(e.variant_at("a", Some(&v)), "a:lock_wait_us=0.5");
    assert_eq!(e.variant_at("b", Some(&v)), "b", "b is not swept");
    let all = Experiment::parse(&FILE.replace("[sweep]\nparam = \"theta\"", "sweep.option = \"x\"\n[sweep]"));
    assert!(all.is_err(), "a table is given once");
    let e = Experiment::parse(&FILE.replace("[sweep]\nparam = \"theta\"", "[sweep]\noption = \"x\"")).unwrap();
    assert_eq!(e.sweep.as_ref().unwrap().protocols, ["a", "b"], "by default every protocol");
    let both = FILE.replace("param = \"theta\"", "param = \"theta\"\noption = \"x\"");
    assert!(format!("{:#}", Experiment::parse(&both).unwrap_err()).contains("one of them"));
}

#[test]
fn an_option_sweep_may_name_each_protocols_option() {
    let sweep = "[sweep]\noption = \"interval_us\"\noption_of = { a = \"wm_us\", b = \"epoch_us\" }";
    let e = Experiment::parse(&FILE.replace("[sweep]\nparam = \"theta\"", sweep)).unwrap();
    let v = serde_json::json!(20000);
    assert_eq!(e.variant_at("a", Some(&v)), "a:wm_us=20000");
    assert_eq!(e.variant_at("b", Some(&v)), "b:epoch_us=20000");
    assert_eq!(e.sweep.as_ref().unwrap().protocols, ["a", "b"], "the protocols named");
    let stray = sweep.replace("b = ", "c = ");
    let err = format!("{:#}", Experiment::parse(&FILE.replace("[sweep]\nparam = \"theta\"", &stray)).unwrap_err());
    assert!(err.contains("`c` is not among protocols"), "{err}");
    let by_flag = FILE.replace("[sweep]\nparam = \"theta\"", "[sweep]\nparam = \"theta\"\noption_of = { a = \"x\" }");
    assert!(format!("{:#}", Experiment::parse(&by_flag).unwrap_err()).contains("only an option sweep"));
}

#[test]
fn class_region_and_ratio_metrics() {
    for m in [
        "latency.class.new-order.p50",
        "latency.region.1.p99",
        "latency.region.1.multi-home.p50",
        "counter.a / counter.b",
        "p99 / p50",
    ] {
        assert_eq!(Metric::parse(m).unwrap().key(), m);
    }
    assert!(Metric::parse("latency.class.new-order.p42").is_err());
    assert!(Metric::parse("latency.zone.1.p50").is_err());
    assert!(Metric::parse("counter.a / speed").is_err());
    let mut r = RunReport { committed: 10, ..Default::default() };
    r.counters.insert("a".into(), 30);
    r.counters.insert("b".into(), 10);
    let l = |p50| crate::LatencyUs { p50, p95: 0.0, p99: 0.0, max: 0.0 };
    r.latency_us_by_class.insert("distributed".into(), l(400.0));
    r.latency_us_by_class.insert("single-node".into(), l(100.0));
    r.latency_us_by_region.insert("1".into(), l(7.0));
    r.latency_us_by_region_class.entry("1".into()).or_default().insert("multi-home".into(), l(70.0));
    let v = |m: &str| metric_value(&Metric::parse(m).unwrap(), &r);
    assert_eq!(v("counter.a / counter.b"), Some(3.0));
    assert_eq!(v("latency.class.distributed.p50 / latency.class.single-node.p50"), Some(4.0));
    assert_eq!(v("latency.region.1.p50"), Some(7.0));
    assert_eq!(v("latency.region.1.multi-home.p50"), Some(70.0));
    assert_eq!(v("latency.region.1.single-home.p50"), None, "no such class in the region");
    assert_eq!(v("latency.region.2.multi-home.p50"), None, "no clients in the region");
    assert_eq!(v("latency.class.payment.p50"), None, "no such class in the run");
    assert_eq!(v("counter.a / counter.c"), None, "a denominator of 0");
    // A panel of a ratio of metrics, beside one over a protocol.
    let text =
        FILE.replacen("[[claim]]", "[plot]\npanels = [\"counter.a / counter.b\", \"throughput/b\"]\n[[claim]]", 1);
    let e = Experiment::parse(&text).unwrap();
    assert_eq!(e.plot.panels[0].over, None);
    assert_eq!(e.plot.panels[1].over.as_deref(), Some("b"));
}

#[test]
fn a_peak_climbs_rising_loads_of_inflight_or_rate() {
    let with = |peak: &str| Experiment::parse(&FILE.replace("[sweep]", &format!("{peak}\n[sweep]")));
    let e =
        with("[peak]\nparam = \"inflight\"\nvalues = [64, 256, 1024]\nquick = [64, 256]\nlatency_at = 0.5").unwrap();
    let p = e.peak.as_ref().unwrap();
    assert_eq!(
        (p.loads(false), p.loads(true), p.latency_at),
        (&[64.0, 256.0, 1024.0][..], &[64.0, 256.0][..], Some(0.5))
    );
    let err = |peak: &str| format!("{:#}", with(peak).unwrap_err());
    assert!(err("[peak]\nparam = \"theta\"\nvalues = [1, 2]").contains("give inflight"));
    assert!(err("[peak]\nparam = \"rate\"\nvalues = [2, 1]").contains("positive and rising"));
    assert!(err("[peak]\nparam = \"rate\"\nvalues = [1]").contains("at least two loads"));
    assert!(err("[peak]\nparam = \"rate\"\nvalues = [1, 2]\nlatency_at = 1.5").contains("latency_at 1.5"));
    let set_too = FILE.replace("workload = \"ycsb\"", "workload = \"ycsb\"\ninflight = 8");
    let set_too = set_too.replace("[sweep]", "[peak]\nparam = \"inflight\"\nvalues = [1, 2]\n[sweep]");
    let e = format!("{:#}", Experiment::parse(&set_too).unwrap_err());
    assert!(e.contains("the climb sets it"), "{e}");
}

#[test]
fn a_value_beyond_the_band_overshoots_and_is_not_reproduced() {
    // a/b at 0.9: band [1.5, 2.5] above the baseline 1.
    let c = report(&[1.2]).evaluate();
    assert_eq!(c[0].verdict, Verdict::SameDirection, "between the baseline and the near edge");
    let c = report(&[3.0]).evaluate();
    assert_eq!(c[0].verdict, Verdict::NotReproduced, "beyond the far edge: overshoot");
    assert!(c[0].note.as_deref().unwrap().contains("far edge"), "{:?}", c[0].note);
    // A band below the baseline: the near edge is its top.
    let r = report_with(&[0.3], "paper = 2.0\nband = [1.5, 2.5]", "paper = 0.5\nband = [0.4, 0.6]");
    assert_eq!(r.evaluate()[0].verdict, Verdict::NotReproduced, "0.3 is past the far edge 0.4");
    let r = report_with(&[0.8], "paper = 2.0\nband = [1.5, 2.5]", "paper = 0.5\nband = [0.4, 0.6]");
    assert_eq!(r.evaluate()[0].verdict, Verdict::SameDirection, "0.8 is short of 0.6, below 1");
}

#[test]
fn a_trend_beyond_its_band_overshoots() {
    // 0.5 -> 5.5: rises 11x where the band stops at 10.
    let c = report(&[5.5]).evaluate();
    assert_eq!((c[1].measured, c[1].verdict), (Some(11.0), Verdict::NotReproduced));
    // A falling claim: 0.5 -> 0.1 falls to 0.2, short of a band [0, 0.1]; to 0.02, in it.
    let falling = |last: f64| {
        let claim = "kind = \"rising\"\nmetric = \"throughput\"\nof = \"a\"\nover = \"b\"\nband = [1.5, 10]";
        let fall = "kind = \"falling\"\nmetric = \"throughput\"\nof = \"a\"\nover = \"b\"\nband = [0.05, 0.1]";
        report_with(&[last], claim, fall).evaluate()[1].verdict
    };
    assert_eq!(falling(0.1), Verdict::SameDirection, "0.2: falls, short of 0.1");
    assert_eq!(falling(0.04), Verdict::Reproduced);
    assert_eq!(falling(0.01), Verdict::NotReproduced, "0.02: beyond the far edge 0.05");
    assert_eq!(falling(0.6), Verdict::NotReproduced, "rises");
}

#[test]
fn a_band_holding_the_baseline_has_no_side_to_fall_short_on() {
    // "about 1.07", band [0.95, 1.3]: 1.5 was `same direction` (above 1, like 1.07); it overshoots.
    let r = report_with(&[1.5], "paper = 2.0\nband = [1.5, 2.5]", "paper = 1.07\nband = [0.95, 1.3]");
    assert_eq!(r.evaluate()[0].verdict, Verdict::NotReproduced);
    let r = report_with(&[1.1], "paper = 2.0\nband = [1.5, 2.5]", "paper = 1.07\nband = [0.95, 1.3]");
    assert_eq!(r.evaluate()[0].verdict, Verdict::Reproduced);
}

#[test]
fn a_between_of_ratios_on_one_side_of_1_follows_the_baseline() {
    // a/b at 0.9 over a/b at 0.5 (1.5), the band above 1: "the ratio grows between the points".
    let between = "[[claim]]\ntext = \"grows\"\nkind = \"between\"\nmetric = \"throughput\"\nof = \"a\"\n\
                   over = \"b\"\nat = [0.9, 0.5]\nband = [1.15, 1.3]\n[[claim]]\ntext = \"a beats b at 0.9\"";
    let judge =
        |last: f64| report_with(&[last], "[[claim]]\ntext = \"a beats b at 0.9\"", between).evaluate()[0].verdict;
    assert_eq!(judge(1.8), Verdict::Reproduced, "1.2");
    assert_eq!(judge(1.6), Verdict::SameDirection, "1.07: grows, short of 1.15");
    // Both ratios above 1 made this `same direction` before, though the ratio shrank.
    assert_eq!(judge(1.2), Verdict::NotReproduced, "0.8: shrinks");
    assert_eq!(judge(3.0), Verdict::NotReproduced, "2.0: beyond the far edge");
}

#[test]
fn not_tested_and_calibrated_keep_the_value_and_say_why() {
    let band = "band = [1.5, 2.5]";
    let r = report_with(&[2.0], band, &format!("{band}\nnot_tested = \"every run includes the client's region\""));
    let c = &r.evaluate()[0];
    assert_eq!((c.measured, c.verdict), (Some(2.0), Verdict::NotTested));
    let note = c.note.as_deref().unwrap();
    assert!(note.contains("client's region") && note.contains("the band alone says reproduced"), "{note}");
    let r = report_with(&[1.2], band, &format!("{band}\ncalibrated = \"the log cost fitted to the paper's gap\""));
    let c = &r.evaluate()[0];
    assert_eq!((c.measured, c.verdict), (Some(1.2), Verdict::Calibrated));
    assert!(c.note.as_deref().unwrap().contains("says same direction"), "{:?}", c.note);
    // Both at once is refused, by field; so is a reason of no words.
    let both = FILE.replacen(band, &format!("{band}\nnot_tested = \"x\"\ncalibrated = \"y\""), 1);
    let err = format!("{:#}", Experiment::parse(&both).unwrap_err());
    assert!(err.contains("not_tested and calibrated: give one"), "{err}");
    let empty = FILE.replacen(band, &format!("{band}\ncalibrated = \" \""), 1);
    assert!(format!("{:#}", Experiment::parse(&empty).unwrap_err()).contains("calibrated: say why"));
    // Counted, rendered and round-tripped as verdicts of their own.
    let mut r = report_with(&[2.0], band, &format!("{band}\nnot_tested = \"cannot\""));
    r.claims = r.evaluate();
    assert_eq!(count_verdicts(&r.claims), [2, 0, 0, 1, 0], "the trend and the crossing reproduce");
    let text = counts_text(count_verdicts(&r.claims));
    assert_eq!(text, "2 reproduced, 0 same direction, 0 not reproduced, 1 not tested, 0 calibrated");
    assert!(render_claims("toy", &r.claims).contains("not tested"));
    let page = html::render(std::slice::from_ref(&r), &[], "today");
    assert!(
        page.contains("v-untested") && page.contains("<th>not tested</th>") && page.contains("<th>calibrated</th>")
    );
    let back: ExperimentReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.evaluate(), r.claims);
}

#[test]
fn a_band_that_leaves_out_the_papers_value_is_refused() {
    let err = format!("{:#}", Experiment::parse(&FILE.replacen("paper = 2.0", "paper = 3.0", 1)).unwrap_err());
    assert!(err.contains("band: [1.5, 2.5] leaves out the paper's 3"), "{err}");
}

#[test]
fn a_headline_short_of_its_band_is_said_plainly() {
    let band = "band = [1.5, 2.5]";
    let mut r = report_with(&[1.2], band, &format!("{band}\nheadline = true"));
    r.claims = r.evaluate();
    let c = &r.claims[0];
    assert_eq!((c.verdict, c.short_of.as_deref()), (Verdict::SameDirection, Some("at least 1.50")));
    let said = "headline short of its band: toy's a beats b at 0.9 1.20 against the paper's at least 1.50";
    assert_eq!(c.headline_warning("toy").as_deref(), Some(said));
    assert!(render_claims("toy", &r.claims).contains(said));
    assert!(html::render(std::slice::from_ref(&r), &[], "today").contains(said));
    // In the band, or beyond it, it is not short; a claim that is no headline is never said.
    let mut r = report_with(&[2.0], band, &format!("{band}\nheadline = true"));
    r.claims = r.evaluate();
    assert_eq!(r.claims[0].headline_warning("toy"), None);
    assert_eq!(report(&[1.2]).evaluate()[0].headline_warning("toy"), None);
}

#[test]
fn stored_runs_are_judged_again_by_the_current_file() {
    let mut r = report(&[1.2]);
    r.claims = r.evaluate();
    assert_eq!(r.claims[0].verdict, Verdict::SameDirection);
    let now = Experiment::parse(&FILE.replacen("band = [1.5, 2.5]", "band = [1.5, 2.5]\nnot_tested = \"cannot\"", 1))
        .unwrap();
    r.rejudge(&now);
    assert_eq!(r.claims[0].verdict, Verdict::NotTested);
    assert!(r.rejudged.as_deref().unwrap().contains("same setup"), "{:?}", r.rejudged);
    let moved = Experiment::parse(&FILE.replace("workload = \"ycsb\"", "workload = \"ycsb\"\nnodes = 3")).unwrap();
    r.rejudge(&moved);
    assert!(r.rejudged.as_deref().unwrap().contains("[bench] changed: not re-run"), "{:?}", r.rejudged);
}

#[test]
fn a_ratio_of_two_metrics_is_read_against_1() {
    // A value claim of `a / b` of one run, with no `over`: short of a band above 1 is `same
    // direction` as for a ratio of protocols; without the default it had no side at all.
    let claim = "kind = \"value\"\nmetric = \"throughput\"\nof = \"a\"\nover = \"b\"\nat = 0.9";
    let own = "kind = \"value\"\nmetric = \"throughput / abort_rate\"\nof = \"a\"\nat = 0.9";
    let e = Experiment::parse(&FILE.replacen(claim, own, 1)).unwrap();
    assert_eq!(e.claims[0].baseline, Some(1.0));
    let plain = "kind = \"value\"\nmetric = \"throughput\"\nof = \"a\"\nat = 0.9";
    let e = Experiment::parse(&FILE.replacen(claim, plain, 1)).unwrap();
    assert_eq!(e.claims[0].baseline, None, "a protocol's own value has no side unless the file gives one");
}

#[test]
fn a_headline_claim_gives_the_papers_value() {
    let no_paper = FILE.replacen("paper = 2.0\nband = [1.5, 2.5]", "band = [1.5, 2.5]\nheadline = true", 1);
    let err = format!("{:#}", Experiment::parse(&no_paper).unwrap_err());
    assert!(err.contains("headline: a headline claim gives the paper's value"), "{err}");
}

#[test]
fn only_an_experiment_all_in_sim_can_be_pinned() {
    assert!(!Experiment::parse(FILE).unwrap().runs_only_in_sim(), "no runtime given: local");
    let sim = FILE.replace("workload = \"ycsb\"", "workload = \"ycsb\"\nruntime = \"sim\"");
    assert!(Experiment::parse(&sim).unwrap().runs_only_in_sim());
    let quick_local = format!("{sim}\n[quick]\nruntime = \"local\"\n");
    assert!(!Experiment::parse(&quick_local).unwrap().runs_only_in_sim(), "its quick runs are on threads");
}

/// The toy experiment in sim, judged on runs where a/b at 0.9 is `last`.
fn sim_report(last: f64) -> ExperimentReport {
    let mut r = report(&[last]);
    r.definition =
        Experiment::parse(&FILE.replace("workload = \"ycsb\"", "workload = \"ycsb\"\nruntime = \"sim\"")).unwrap();
    r.claims = r.evaluate();
    r
}

#[test]
fn pins_round_trip_and_a_flipped_verdict_names_its_claim_and_values() {
    let mut pins = pins::Pins::default();
    pins.record(&sim_report(2.0));
    let order = BTreeMap::from([("toy".to_string(), sim_report(2.0).claims.iter().map(|c| c.text.clone()).collect())]);
    let text = pins.to_toml(&order);
    assert!(text.contains("[toy]\n\"a beats b at 0.9\" = { verdict = \"reproduced\", measured = 2.0 }"), "{text}");
    assert_eq!(pins::Pins::parse(&text).unwrap(), pins);
    assert!(pins.flips(&sim_report(2.2)).is_empty(), "a value that moves inside its band flips nothing");
    let flips = pins.flips(&sim_report(1.2));
    assert_eq!(flips.len(), 1, "{flips:?}");
    let said = flips[0].to_string();
    assert_eq!(said, "toy: \"a beats b at 0.9\" is same direction at 1.20, pinned reproduced at 2.00");
}

#[test]
fn pins_name_only_existing_sim_experiments_and_every_claim_of_each() {
    let sim =
        Experiment::parse(&FILE.replace("workload = \"ycsb\"", "workload = \"ycsb\"\nruntime = \"sim\"")).unwrap();
    let mut local = Experiment::parse(FILE).unwrap();
    local.name = "on-threads".into();
    let all = [sim, local];
    let mut pins = pins::Pins::default();
    assert_eq!(pins.unpinned(&all), ["toy"], "only the simulated one is waiting for its pins");
    pins.record(&sim_report(2.0));
    assert!(pins.problems(&all).is_empty(), "{:?}", pins.problems(&all));
    assert!(pins.unpinned(&all).is_empty());
    let toy = pins.experiments.get_mut("toy").unwrap();
    let kept = toy.remove("a crosses b").unwrap();
    toy.insert("a crosses b somewhere".into(), kept);
    let mut wrong = pins.clone();
    let mut other = wrong.experiments["toy"].clone();
    other.retain(|k, _| k == "a beats b at 0.9");
    wrong.experiments.insert("on-threads".into(), other);
    wrong.experiments.insert("gone".into(), BTreeMap::new());
    let problems = wrong.problems(&all).join("\n");
    for said in [
        "gone: no such experiment",
        "on-threads: its runs are not all in sim",
        "on-threads: claim \"a over b rises\" has no pin",
        "toy: no claim \"a crosses b somewhere\"",
        "toy: claim \"a crosses b\" has no pin",
    ] {
        assert!(problems.contains(said), "{said}:\n{problems}");
    }
}

#[test]
fn a_band_that_starts_at_the_baseline_keeps_its_side() {
    // "one ratio above the other" (rolis-ratio's YCSB++ ratio over its TPC-C ratio): the band
    // [1, 1.51] starts at 1. Read as an agreement of two ratios (a band holding 1), a quotient
    // below 1 with both ratios on one side of 1 would have been `same direction`, though it is
    // the paper's order reversed.
    let between = "[[claim]]\ntext = \"above\"\nkind = \"between\"\nmetric = \"throughput\"\nof = \"a\"\n\
                   over = \"b\"\nat = [0.9, 0.5]\nband = [1.0, 1.51]\n[[claim]]\ntext = \"a beats b at 0.9\"";
    let judge =
        |last: f64| report_with(&[last], "[[claim]]\ntext = \"a beats b at 0.9\"", between).evaluate()[0].clone();
    assert_eq!(judge(1.8).verdict, Verdict::Reproduced, "1.2");
    let reversed = judge(1.2);
    assert_eq!(reversed.verdict, Verdict::NotReproduced, "0.8: a/b at 0.9 below a/b at 0.5");
    assert_eq!(judge(3.0).verdict, Verdict::NotReproduced, "2.0: beyond the far edge");
}
