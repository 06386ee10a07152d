//! An experiment's plot: one panel per metric the file names, each the metric (or its ratio to
//! one protocol's) against the swept parameter, a line per protocol or variant, the median over
//! repeats with the minimum and maximum as error bars; without a sweep, one bar per protocol;
//! for a timeline, committed/s per 100 ms over the run.

use super::def::{point_text, Panel, PlotKind, PointValue};
use super::verdict::{median_min_max, metric_value};
use super::{sig3, ExperimentReport, Observation};
use crate::plot::{bold, color_of, finite, font, panel, tick, Area, Swatch, AXIS, GRID, MUTED, WIDTH};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const TITLE_H: u32 = 56;
const PANEL_H: u32 = 420;

/// A point of a series: x, then the median, minimum and maximum over repeats.
type Sample = (f64, f64, f64, f64);

/// The SVG of an experiment's plot.
pub fn render(report: &ExperimentReport) -> anyhow::Result<String> {
    let def = &report.definition;
    let panels: Vec<Panel> = match def.plot.kind {
        PlotKind::Timeline => vec![Panel { metric: super::Metric::Throughput, over: None }],
        PlotKind::Sweep => def.plot.panels.clone(),
    };
    let columns = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(columns) as u32;
    let height = TITLE_H + PANEL_H * rows;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (title, body) = root.split_vertically(TITLE_H);
        let heading = format!("{}: {}", report.experiment, def.title);
        title.draw_text(&heading, &bold(19.0).pos(Pos::new(HPos::Center, VPos::Center)), (WIDTH as i32 / 2, 18))?;
        let sub = format!(
            "{} {}  |  {}{}",
            report.paper,
            report.figure,
            report.runs.first().map(|r| format!("{}, {} nodes", r.runtime, r.nodes)).unwrap_or_default(),
            if report.repeat > 1 {
                format!("  |  median of {} repeats, bars min..max", report.repeat)
            } else {
                String::new()
            }
        );
        title.draw_text(
            &sub,
            &font(13.0).color(&MUTED).pos(Pos::new(HPos::Center, VPos::Center)),
            (WIDTH as i32 / 2, 42),
        )?;
        let areas = body.split_evenly((rows as usize, columns));
        let obs = report.observations();
        for (area, p) in areas.iter().zip(&panels) {
            match def.plot.kind {
                PlotKind::Timeline => draw_timeline(area, report)?,
                PlotKind::Sweep if def.sweep.is_some() => draw_sweep_panel(area, report, &obs, p)?,
                PlotKind::Sweep => draw_bars_panel(area, report, &obs, p)?,
            }
        }
        root.present()?;
    }
    Ok(svg)
}

fn panel_title(p: &Panel) -> String {
    match &p.over {
        Some(o) => format!("{} relative to {o}", p.metric.label()),
        None => p.metric.label(),
    }
}

/// The panel's value for `protocol` at `point` in `repeat`.
fn value(obs: &[Observation], p: &Panel, protocol: &str, point: Option<&PointValue>, repeat: u32) -> Option<f64> {
    let find =
        |proto: &str| obs.iter().find(|o| o.is(proto, point, repeat)).and_then(|o| metric_value(&p.metric, o.run));
    let v = find(protocol)?;
    match &p.over {
        None => Some(v),
        Some(o) => find(o).filter(|d| *d != 0.0).map(|d| v / d),
    }
}

fn repeats(obs: &[Observation]) -> Vec<u32> {
    let mut r: Vec<u32> = obs.iter().map(|o| o.repeat).collect();
    r.sort_unstable();
    r.dedup();
    r
}

/// Each protocol's samples over the points; x is the point's value, or its index for words.
fn series(report: &ExperimentReport, obs: &[Observation], p: &Panel) -> (Vec<(String, Vec<Sample>)>, bool) {
    let numeric = report.points.iter().all(|v| v.as_ref().and_then(|v| v.as_f64()).is_some());
    let reps = repeats(obs);
    let out = report
        .definition
        .protocols
        .iter()
        .map(|proto| {
            let samples = report
                .points
                .iter()
                .enumerate()
                .filter_map(|(i, point)| {
                    let vals: Vec<f64> = reps.iter().filter_map(|&r| value(obs, p, proto, point.as_ref(), r)).collect();
                    let (m, lo, hi) = median_min_max(&vals)?;
                    let x =
                        if numeric { point.as_ref().and_then(|v| v.as_f64()).unwrap_or(i as f64) } else { i as f64 };
                    Some((x, m, lo, hi))
                })
                .collect();
            (proto.clone(), samples)
        })
        .collect();
    (out, numeric)
}

fn legend(report: &ExperimentReport) -> Vec<(String, Swatch)> {
    report.definition.protocols.iter().enumerate().map(|(i, p)| (p.clone(), Swatch::Line(color_of(i)))).collect()
}

fn y_range(all: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let max = all.map(finite).fold(0.0, f64::max);
    0.0..if max > 0.0 { max * 1.12 } else { 1.0 }
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart on `area` with the house style: light grid, muted labels, values with three digits.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    x_labels: usize,
    fmt_x: &dyn Fn(&f64) -> String,
    x_desc: &str,
) -> anyhow::Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .margin_left(10)
        .margin_right(28)
        .margin_bottom(8)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .x_labels(x_labels)
        .y_labels(7)
        .x_label_formatter(fmt_x)
        .y_label_formatter(&|v| sig3(*v))
        .x_label_style(font(12.0).color(&MUTED))
        .y_label_style(font(12.0).color(&MUTED))
        .x_desc(x_desc)
        .axis_desc_style(font(13.0).color(&MUTED))
        .draw()?;
    Ok(chart)
}

fn draw_sweep_panel(area: &Area, report: &ExperimentReport, obs: &[Observation], p: &Panel) -> anyhow::Result<()> {
    let area = panel(area, &panel_title(p), &legend(report))?;
    let (lines, numeric) = series(report, obs, p);
    let xs: Vec<f64> = lines.iter().flat_map(|(_, s)| s.iter().map(|v| v.0)).collect();
    let (x0, x1) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    let (x0, x1) = if x0 < x1 { (x0, x1) } else { (x0 - 1.0, x0 + 1.0) };
    let pad = (x1 - x0) * 0.04;
    let labels: Vec<String> = report.points.iter().map(|v| v.as_ref().map(point_text).unwrap_or_default()).collect();
    let param = report.definition.sweep.as_ref().map(|s| s.param.clone()).unwrap_or_default();
    let y = y_range(lines.iter().flat_map(|(_, s)| s.iter().map(|v| v.3)));
    let fmt_x = |v: &f64| {
        if numeric {
            tick(*v)
        } else {
            labels
                .get(v.round().max(0.0) as usize)
                .cloned()
                .filter(|_| (v - v.round()).abs() < 1e-6)
                .unwrap_or_default()
        }
    };
    let x_labels = if numeric { 10 } else { labels.len() * 4 + 1 };
    let mut chart = chart(&area, (x0 - pad)..(x1 + pad), y, x_labels, &fmt_x, &param)?;
    if p.over.is_some() {
        chart.draw_series(LineSeries::new(vec![(x0 - pad, 1.0), (x1 + pad, 1.0)], AXIS.stroke_width(1)))?;
    }
    for (i, (_, samples)) in lines.iter().enumerate() {
        let c = color_of(i);
        chart.draw_series(LineSeries::new(samples.iter().map(|s| (s.0, s.1)), c.stroke_width(2)))?;
        chart.draw_series(samples.iter().map(|s| Circle::new((s.0, s.1), 3, c.filled())))?;
        chart.draw_series(
            samples
                .iter()
                .filter(|s| s.2 < s.3)
                .map(|s| ErrorBar::new_vertical(s.0, s.2, s.1, s.3, c.stroke_width(1), 8)),
        )?;
    }
    Ok(())
}

fn draw_bars_panel(area: &Area, report: &ExperimentReport, obs: &[Observation], p: &Panel) -> anyhow::Result<()> {
    let area = panel(area, &panel_title(p), &[])?;
    let (lines, _) = series(report, obs, p);
    let n = lines.len().max(1);
    let y = y_range(lines.iter().flat_map(|(_, s)| s.iter().map(|v| v.3)));
    let names: Vec<String> = lines.iter().map(|(n, _)| n.clone()).collect();
    let fmt_x = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            names.get(v.round().max(0.0) as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut chart = chart(&area, -0.5..(n as f64 - 0.5), y, n * 4 + 1, &fmt_x, "")?;
    for (i, (_, samples)) in lines.iter().enumerate() {
        let c = color_of(i);
        if let Some(s) = samples.first() {
            let x = i as f64;
            chart.draw_series(std::iter::once(Rectangle::new([(x - 0.3, 0.0), (x + 0.3, s.1)], c.filled())))?;
            if s.2 < s.3 {
                chart.draw_series(std::iter::once(ErrorBar::new_vertical(
                    x,
                    s.2,
                    s.1,
                    s.3,
                    BLACK.stroke_width(1),
                    10,
                )))?;
            }
        }
    }
    Ok(())
}

fn draw_timeline(area: &Area, report: &ExperimentReport) -> anyhow::Result<()> {
    let area = panel(area, "committed/s, per 100 ms (first point, first repeat)", &legend(report))?;
    let first_point = report.points.first().cloned().flatten();
    let obs = report.observations();
    let runs: Vec<(usize, &crate::RunReport)> = report
        .definition
        .protocols
        .iter()
        .enumerate()
        .filter_map(|(i, proto)| obs.iter().find(|o| o.is(proto, first_point.as_ref(), 0)).map(|o| (i, o.run)))
        .collect();
    let len = runs.iter().map(|(_, r)| r.throughput_per_100ms.len()).max().unwrap_or(0).max(1);
    let y = y_range(runs.iter().flat_map(|(_, r)| r.throughput_per_100ms.iter().copied()));
    let mut chart = chart(&area, 0f64..len as f64 / 10.0, y, 12, &|v| tick(*v), "time in the measured period (s)")?;
    for (i, r) in runs {
        let pts = r.throughput_per_100ms.iter().enumerate().map(|(k, v)| (k as f64 / 10.0 + 0.05, finite(*v)));
        chart.draw_series(LineSeries::new(pts, color_of(i).stroke_width(2)))?;
    }
    Ok(())
}
