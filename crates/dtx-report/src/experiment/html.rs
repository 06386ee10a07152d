//! The report page: every experiment's plot, its claims measured beside the paper's with a
//! verdict, its runs, and how to reproduce it, in one HTML file with the plots inline (no
//! network, no scripts), readable in any browser.

use super::verdict::count_verdicts;
use super::{sig3, ExperimentReport, Verdict};
use crate::human;
use std::fmt::Write as _;

/// A table from elsewhere shown on the page (the COCO comparison's rounds).
#[derive(Debug, Clone, Default)]
pub struct ExtraTable {
    pub title: String,
    pub intro: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const STYLE: &str = "
body { font-family: sans-serif; color: #222; max-width: 1240px; margin: 24px auto; padding: 0 16px; line-height: 1.45; }
h1 { font-size: 26px; margin-bottom: 4px; } h2 { font-size: 21px; margin-top: 40px; border-bottom: 1px solid #ddd; }
.meta, .repro { color: #555; font-size: 14px; }
table { border-collapse: collapse; margin: 10px 0; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 4px 9px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td:first-child, th:first-child, th.text { text-align: left; }
td.text { text-align: left; max-width: 520px; }
.v-reproduced { background: #dcefd9; } .v-same { background: #fbeecb; } .v-not { background: #f6d5d5; }
.v-untested { background: #e4e4e4; } .v-calibrated { background: #dde6f4; }
.headline { color: #8a4b00; font-weight: bold; }
.failed { color: #b02a2a; font-weight: bold; }
svg { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 1px 4px; font-size: 13px; }
details { margin: 8px 0; }
";

fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Reproduced => "v-reproduced",
        Verdict::SameDirection => "v-same",
        Verdict::NotReproduced => "v-not",
        Verdict::NotTested => "v-untested",
        Verdict::Calibrated => "v-calibrated",
    }
}

/// An SVG document made fit to be inlined: no XML prologue, and a viewBox so it scales.
fn inline_svg(svg: &str) -> String {
    let body = match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => return String::new(),
    };
    let dim = |name: &str| -> Option<String> {
        let head = &body[..body.find('>')?];
        let at = head.find(&format!("{name}=\""))? + name.len() + 2;
        Some(head[at..].split('"').next()?.to_string())
    };
    match (dim("width"), dim("height")) {
        (Some(w), Some(h)) if !body[..body.find('>').unwrap_or(0)].contains("viewBox") => {
            body.replacen("<svg", &format!("<svg viewBox=\"0 0 {w} {h}\""), 1)
        }
        _ => body.to_string(),
    }
}

/// The whole page for `reports` (in the order given) and `extras`.
pub fn render(reports: &[ExperimentReport], extras: &[ExtraTable], generated: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dtx: experiments</title>\
         <style>{STYLE}</style></head><body>\n<h1>dtx: the papers' figures, measured</h1>\n"
    );
    let _ = writeln!(
        h,
        "<p class=\"meta\">Generated {} from {} experiment result(s). Each experiment prints the measured value beside \
         the paper's and a verdict per claim: <b>reproduced</b> (inside the band drawn around the paper's value), \
         <b>same direction</b> (on the paper's side of the baseline, short of the band), <b>not reproduced</b> \
         (the other side, or beyond the band's far edge), <b>not tested</b> (the run cannot exercise the \
         mechanism the claim names) or <b>calibrated</b> (a cost was fitted to the paper's number, so matching \
         it reproduces nothing); the rules are in docs/experiments.md.</p>",
        esc(generated),
        reports.len()
    );
    summary(&mut h, reports);
    for r in reports {
        section(&mut h, r);
    }
    for t in extras {
        extra_table(&mut h, t);
    }
    h.push_str("</body></html>\n");
    h
}

fn summary(h: &mut String, reports: &[ExperimentReport]) {
    headlines(h, reports);
    h.push_str("<table><tr><th>experiment</th><th class=\"text\">paper</th><th class=\"text\">figure</th>");
    for v in Verdict::ALL {
        let _ = write!(h, "<th>{}</th>", v.text());
    }
    h.push_str("<th>runs</th><th>ran</th></tr>\n");
    for r in reports {
        let counts = count_verdicts(&r.evaluate());
        let _ = write!(
            h,
            "<tr><td><a href=\"#{n}\">{n}</a></td><td class=\"text\">{}</td><td class=\"text\">{}</td>",
            esc(&r.paper),
            esc(&r.figure),
            n = esc(&r.experiment),
        );
        for k in counts {
            let _ = write!(h, "<td>{k}</td>");
        }
        let _ = writeln!(
            h,
            "<td>{}{}</td><td class=\"text\">{}{}</td></tr>",
            r.runs.len(),
            if r.failures.is_empty() {
                String::new()
            } else {
                format!(" <span class=\"failed\">{} failed</span>", r.failures.len())
            },
            esc(&r.provenance.date),
            if r.quick { " (quick)" } else { "" },
        );
    }
    h.push_str("</table>\n");
}

/// Every headline claim short of its band, said plainly above the tables.
fn headlines(h: &mut String, reports: &[ExperimentReport]) {
    let warnings: Vec<String> = reports
        .iter()
        .flat_map(|r| r.evaluate().into_iter().filter_map(|c| c.headline_warning(&r.experiment)))
        .collect();
    for w in warnings {
        let _ = writeln!(h, "<p class=\"headline\">{}</p>", esc(&w));
    }
}

fn section(h: &mut String, r: &ExperimentReport) {
    let _ = writeln!(h, "<h2 id=\"{0}\">{0}: {1}</h2>", esc(&r.experiment), esc(&r.title));
    let _ = writeln!(
        h,
        "<p><b>Reproduces</b> {}, {}. <b>Measures</b> {}.</p>",
        esc(&r.paper),
        esc(&r.figure),
        esc(&r.measures)
    );
    for f in &r.failures {
        let _ = writeln!(h, "<p class=\"failed\">FAILED: {}</p>", esc(f));
    }
    if let Some(j) = &r.rejudged {
        let _ = writeln!(h, "<p class=\"meta\">{}</p>", esc(j));
    }
    for w in r.evaluate().iter().filter_map(|c| c.headline_warning(&r.experiment)) {
        let _ = writeln!(h, "<p class=\"headline\">{}</p>", esc(&w));
    }
    match super::svg::render(r) {
        Ok(svg) => h.push_str(&inline_svg(&svg)),
        Err(e) => {
            let _ = writeln!(h, "<p class=\"failed\">no plot: {}</p>", esc(&e.to_string()));
        }
    }
    h.push_str("\n<table><tr><th>claim</th><th>paper</th><th>measured</th><th>min..max</th><th>reproduced if</th><th>verdict</th></tr>\n");
    for c in r.evaluate() {
        let num = |v: Option<f64>| v.map(sig3).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            h,
            "<tr><td class=\"text\">{}{}<br><small>{} {}</small>{}</td><td>{}</td><td>{}</td><td>{}..{}</td><td>{}..{}</td>\
             <td class=\"{}\">{}</td></tr>",
            esc(&c.text),
            if c.headline { " <b>(headline)</b>" } else { "" },
            esc(&c.kind),
            esc(&c.metric),
            c.note.as_ref().map(|n| format!("<br><small>{}</small>", esc(n))).unwrap_or_default(),
            num(c.paper),
            num(c.measured),
            num(c.min),
            num(c.max),
            sig3(c.band[0]),
            sig3(c.band[1]),
            verdict_class(c.verdict),
            c.verdict.text()
        );
    }
    h.push_str("</table>\n");
    if !r.notes.is_empty() {
        let _ = writeln!(h, "<p><b>Why the figures differ.</b> {}</p>", esc(&r.notes));
    }
    runs_table(h, r);
    let p = &r.provenance;
    let speed = r
        .sim_txn_per_wall_s()
        .map(|s| format!("; simulated {} txn per wall second", human::count(s)))
        .unwrap_or_default();
    let _ = writeln!(
        h,
        "<p class=\"repro\">Reproduce: <code>{}</code><br>commit {}, {}, {} cores ({}), {:.0} s{}</p>",
        esc(&p.command),
        esc(&p.commit),
        esc(&p.date),
        p.cores,
        esc(&p.cpu_model),
        p.wall_s,
        speed
    );
}

fn runs_table(h: &mut String, r: &ExperimentReport) {
    let param = r.definition.sweep.as_ref().map(|s| s.param.as_str()).unwrap_or("point");
    let _ = writeln!(
        h,
        "<details><summary>{} runs</summary><table><tr><th>protocol</th><th>{}</th><th>repeat</th><th>committed/s</th>\
         <th>abort%</th><th>p50</th><th>p99</th><th>msgs/txn</th><th>bytes/txn</th><th>verified</th><th>top aborts</th></tr>",
        r.runs.len(),
        esc(param)
    );
    for o in r.observations() {
        let run = o.run;
        let mut aborts: Vec<(&String, &u64)> = run.aborts_by_reason.iter().collect();
        aborts.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = aborts.iter().take(3).map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td>\
             <td>{}</td><td class=\"text\">{}</td></tr>",
            esc(&run.protocol),
            o.point.map(super::def::point_text).map(|s| esc(&s)).unwrap_or_default(),
            o.repeat,
            human::count(run.throughput_tps),
            human::percent(run.abort_rate),
            human::latency_us(run.latency_us.p50),
            human::latency_us(run.latency_us.p99),
            run.msgs_per_txn,
            human::bytes(run.bytes_per_txn),
            match run.verified {
                Some(true) => "yes",
                Some(false) => "FAILED",
                None => "-",
            },
            esc(&top.join(", "))
        );
    }
    h.push_str("</table></details>\n");
}

fn extra_table(h: &mut String, t: &ExtraTable) {
    let _ = writeln!(h, "<h2>{}</h2>\n<p>{}</p>\n<table><tr>", esc(&t.title), esc(&t.intro));
    for c in &t.header {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("</tr>\n");
    for row in &t.rows {
        h.push_str("<tr>");
        for c in row {
            let _ = write!(h, "<td>{}</td>", esc(c));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}
