//! The SVG plot written by `dtx bench --plot`: throughput and abort rate per protocol, p50/p99
//! latency per protocol, and (when per-second samples exist) committed/s over time.
//!
//! Only the SVG backend is used. Text is emitted as SVG `<text>` elements with
//! `font-family="sans-serif"`, so no fonts are needed at build or render time; text extents are
//! estimated (about 0.6 em per character) to keep labels from overlapping.

use crate::table::Context;
use crate::{human, RunReport};
use anyhow::{bail, Context as _};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;
use std::path::Path;

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

pub(crate) const WIDTH: u32 = 1200;
const TITLE_H: u32 = 46;
const BARS_H: u32 = 470;
const TIMELINE_H: u32 = 400;
pub(crate) const FONT: &str = "sans-serif";

pub(crate) const TEXT: RGBColor = RGBColor(0x22, 0x22, 0x22);
pub(crate) const MUTED: RGBColor = RGBColor(0x66, 0x66, 0x66);
pub(crate) const GRID: RGBColor = RGBColor(0xe3, 0xe3, 0xe3);
pub(crate) const ALERT: RGBColor = RGBColor(0xb0, 0x2a, 0x2a);
pub(crate) const AXIS: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// Tableau 10: distinct, colour-blind-friendly, readable on white.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// Writes the SVG plot of `runs` to `path`, creating parent directories. Bitmap extensions
/// (`.png`, `.jpg`, ...) are rejected: only SVG is supported.
pub fn write_plot(runs: &[RunReport], path: &Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if let Some(ext @ ("png" | "jpg" | "jpeg" | "gif" | "bmp" | "webp" | "tif" | "tiff")) = ext.as_deref() {
        bail!("cannot write plot {}: only SVG is supported, not .{ext} (use a .svg path)", path.display());
    }
    let svg = render_svg(runs)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating directory {}", parent.display()))?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing plot {}", path.display()))
}

/// The SVG document [`write_plot`] writes, as a string.
pub fn render_svg(runs: &[RunReport]) -> anyhow::Result<String> {
    if runs.is_empty() {
        bail!("no runs to plot");
    }
    let has_timeline = runs.iter().any(|r| !r.throughput_per_s.is_empty());
    let height = TITLE_H + BARS_H + if has_timeline { TIMELINE_H } else { 0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (title, body) = root.split_vertically(TITLE_H);
        let c = Context::of(runs);
        let title_text = format!(
            "dtx bench: workload {}  |  runtime {}  |  nodes {}  |  {}",
            c.workload, c.runtime, c.nodes, c.duration
        );
        title.draw_text(
            &title_text,
            &bold(20.0).pos(Pos::new(HPos::Center, VPos::Center)),
            (WIDTH as i32 / 2, TITLE_H as i32 / 2 + 2),
        )?;
        let (bars, timeline) = body.split_vertically(BARS_H);
        let (left, right) = bars.split_horizontally(WIDTH / 2);
        draw_throughput(&left, runs)?;
        draw_latency(&right, runs)?;
        if has_timeline {
            draw_timeline(&timeline, runs)?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// A text style whose rendered SVG font size is `px` pixels (plotters divides sizes by 1.24
/// when writing SVG, and estimates extents from the same scaled size).
pub(crate) fn font(px: f64) -> TextStyle<'static> {
    (FONT, px * 1.24).into_font().color(&TEXT)
}

pub(crate) fn bold(px: f64) -> TextStyle<'static> {
    (FONT, px * 1.24, FontStyle::Bold).into_font().color(&TEXT)
}

/// Estimated rendered width of `text` at `px` pixels in a sans-serif font.
pub(crate) fn text_width(text: &str, px: f64) -> f64 {
    text.chars().count() as f64 * px * 0.6
}

/// The largest font size in `min..=max` at which every text fits in `width` pixels.
fn fit_font(texts: &[String], width: f64, min: f64, max: f64) -> f64 {
    let longest = texts.iter().map(|t| t.chars().count()).max().unwrap_or(1).max(1);
    (width / (longest as f64 * 0.6)).clamp(min, max)
}

/// Shortens `text` with an ellipsis so that it fits in `width` pixels at `px`.
fn ellipsize(text: &str, width: f64, px: f64) -> String {
    let max_chars = (width / (px * 0.6)).floor().max(2.0) as usize;
    if text.chars().count() <= max_chars {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(max_chars - 1).collect();
        s.push('…');
        s
    }
}

pub(crate) fn color_of(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn lighten(c: RGBColor, amount: f64) -> RGBColor {
    let l = |v: u8| (v as f64 + (255.0 - v as f64) * amount).round() as u8;
    RGBColor(l(c.0), l(c.1), l(c.2))
}

pub(crate) fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v.max(0.0)
    } else {
        0.0
    }
}

/// A compact axis tick: `0`, `2.5`, `0.25`, `20k`.
pub(crate) fn tick(v: f64) -> String {
    if v.abs() >= 1e3 {
        human::axis_count(v)
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

pub(crate) enum Swatch {
    Bar(RGBColor),
    Line(RGBColor),
}

/// Draws a panel's heading and its legend below it (centred rows, wrapped to the panel width),
/// returning the area left for the chart. Panels with at most one legend row have the same
/// heading height, so side-by-side charts line up.
pub(crate) fn panel<'a>(area: &Area<'a>, heading: &str, legend: &[(String, Swatch)]) -> anyhow::Result<Area<'a>> {
    const PX: f64 = 12.5;
    const ROW_H: i32 = 20;
    let (w, _) = area.dim_in_pixel();
    let max_row_w = w as f64 - 40.0;
    let item_w = |label: &str| 16.0 + 6.0 + text_width(label, PX) + 18.0;
    let mut rows: Vec<Vec<&(String, Swatch)>> = vec![Vec::new()];
    let mut row_w = 0.0;
    for item in legend {
        let iw = item_w(&item.0);
        if row_w + iw > max_row_w && !rows.last().is_some_and(|r| r.is_empty()) {
            rows.push(Vec::new());
            row_w = 0.0;
        }
        row_w += iw;
        if let Some(r) = rows.last_mut() {
            r.push(item);
        }
    }
    let head_h = 32 + ROW_H * rows.len() as i32;
    let (head, rest) = area.split_vertically(head_h);
    head.draw_text(heading, &bold(16.0).pos(Pos::new(HPos::Center, VPos::Center)), (w as i32 / 2, 14))?;
    for (k, row) in rows.iter().enumerate() {
        let total: f64 = row.iter().map(|(l, _)| item_w(l)).sum::<f64>() - 18.0;
        let mut x = ((w as f64 - total) / 2.0).max(4.0);
        let y = 38 + ROW_H * k as i32;
        for (label, swatch) in row {
            let x0 = x.round() as i32;
            match swatch {
                Swatch::Bar(c) => {
                    head.draw(&Rectangle::new([(x0, y - 6), (x0 + 16, y + 6)], c.filled()))?;
                }
                Swatch::Line(c) => {
                    head.draw(&PathElement::new(vec![(x0, y), (x0 + 16, y)], c.stroke_width(3)))?;
                }
            }
            head.draw_text(label, &font(PX).color(&MUTED).pos(Pos::new(HPos::Left, VPos::Center)), (x0 + 22, y))?;
            x += item_w(label);
        }
    }
    Ok(rest)
}

/// A category x axis: protocol `i` occupies `[i, i + 1)`, with its tick (and label) at
/// `i + 0.5`. (plotters' `with_key_points` on an `f64` range loses the label formatter.)
struct Slots(usize);

impl Ranged for Slots {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let frac = value / self.0.max(1) as f64;
        limit.0 + ((limit.1 - limit.0) as f64 * frac).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            (0..self.0).map(|i| i as f64 + 0.5).collect()
        }
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0 as f64
    }
}

/// Protocol names fitted (font size, ellipsis) to one category slot of `slot_px` pixels.
fn category_labels(runs: &[RunReport], slot_px: f64) -> (Vec<String>, f64) {
    let names: Vec<String> = runs.iter().map(|r| r.protocol.clone()).collect();
    let px = fit_font(&names, slot_px * 0.92, 9.0, 14.0);
    let names = names.iter().map(|n| ellipsize(n, slot_px * 0.92, px)).collect();
    (names, px)
}

fn draw_throughput(area: &Area, runs: &[RunReport]) -> anyhow::Result<()> {
    // No legend: the x axis names the bars (colours are keyed in the timeline legend).
    let area = panel(area, "Committed throughput and abort rate", &[])?;
    let n = runs.len();
    let max = runs.iter().map(|r| finite(r.throughput_tps)).fold(0.0, f64::max);
    let y_max = if max > 0.0 { max * 1.22 } else { 1.0 };
    let mut chart = ChartBuilder::on(&area)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(8)
        .x_label_area_size(34)
        .y_label_area_size(78)
        .build_cartesian_2d(Slots(n), 0f64..y_max)?;
    let (xr, _) = chart.plotting_area().get_pixel_range();
    let slot_px = (xr.end - xr.start) as f64 / n as f64;
    let (names, name_px) = category_labels(runs, slot_px);
    let label_of = |v: &f64| names.get(v.floor() as usize).cloned().unwrap_or_default();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .y_labels(8)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|v| tick(*v))
        .x_label_style(font(name_px))
        .y_label_style(font(12.0).color(&MUTED))
        .y_desc("committed transactions / s")
        .axis_desc_style(font(13.0).color(&MUTED))
        .draw()?;

    // Bars fill 60% of their slot, but no wider than 120 px (a lone run would look odd).
    let half = (60.0 / slot_px).min(0.3);
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let x = i as f64 + 0.5;
        Rectangle::new([(x - half, 0.0), (x + half, finite(r.throughput_tps))], color_of(i).filled())
    }))?;

    // Two lines above each bar: the throughput, and the abort rate.
    let values: Vec<String> = runs.iter().map(|r| format!("{}/s", human::count(r.throughput_tps))).collect();
    let aborts: Vec<String> = runs.iter().map(|r| format!("{} aborts", human::percent(r.abort_rate))).collect();
    let value_px = fit_font(&values, slot_px * 0.95, 8.0, 14.0);
    let abort_px = fit_font(&aborts, slot_px * 0.95, 8.0, 12.5);
    chart.draw_series(runs.iter().enumerate().map(|(i, r)| {
        let at = (i as f64 + 0.5, finite(r.throughput_tps));
        let bottom = Pos::new(HPos::Center, VPos::Bottom);
        let abort_color = if r.abort_rate > 0.2 { &ALERT } else { &MUTED };
        EmptyElement::at(at)
            + Text::new(aborts[i].clone(), (0, -5), font(abort_px).color(abort_color).pos(bottom))
            + Text::new(values[i].clone(), (0, -9 - abort_px.round() as i32), bold(value_px).pos(bottom))
    }))?;
    Ok(())
}

fn draw_latency(area: &Area, runs: &[RunReport]) -> anyhow::Result<()> {
    let legend = vec![
        ("p50 (light)".to_string(), Swatch::Bar(lighten(MUTED, 0.55))),
        ("p99 (solid)".to_string(), Swatch::Bar(MUTED)),
    ];
    let area = panel(area, "Commit latency: p50 and p99", &legend)?;
    let n = runs.len();
    let max_us = runs.iter().flat_map(|r| [finite(r.latency_us.p50), finite(r.latency_us.p99)]).fold(0.0, f64::max);
    let (scale, unit) = if max_us >= 1e6 {
        (1e6, "s")
    } else if max_us >= 1e3 {
        (1e3, "ms")
    } else {
        (1.0, "µs")
    };
    let y_max = if max_us > 0.0 { max_us / scale * 1.25 } else { 1.0 };
    let mut chart = ChartBuilder::on(&area)
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(8)
        .x_label_area_size(34)
        .y_label_area_size(78)
        .build_cartesian_2d(Slots(n), 0f64..y_max)?;
    let (xr, _) = chart.plotting_area().get_pixel_range();
    let slot_px = (xr.end - xr.start) as f64 / n as f64;
    let (names, name_px) = category_labels(runs, slot_px);
    let label_of = |v: &f64| names.get(v.floor() as usize).cloned().unwrap_or_default();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .y_labels(10)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|v| tick(*v))
        .x_label_style(font(name_px))
        .y_label_style(font(12.0).color(&MUTED))
        .y_desc(format!("latency ({unit})"))
        .axis_desc_style(font(13.0).color(&MUTED))
        .draw()?;

    let p50 = |r: &RunReport| finite(r.latency_us.p50) / scale;
    let p99 = |r: &RunReport| finite(r.latency_us.p99) / scale;
    // Two bars per slot, side by side around the slot centre: each 35% of the slot but no
    // wider than 56 px, with a small gap between them.
    let bar_w = (56.0 / slot_px).min(0.35);
    let gap = 0.01;
    let c50 = 0.5 - gap - bar_w / 2.0;
    let c99 = 0.5 + gap + bar_w / 2.0;
    chart.draw_series(runs.iter().enumerate().flat_map(|(i, r)| {
        let x = i as f64;
        let c = color_of(i);
        [
            Rectangle::new([(x + 0.5 - gap - bar_w, 0.0), (x + 0.5 - gap, p50(r))], lighten(c, 0.5).filled()),
            Rectangle::new([(x + 0.5 + gap, 0.0), (x + 0.5 + gap + bar_w, p99(r))], c.filled()),
        ]
    }))?;

    // Value labels centred over each bar. Labels may be wider than their bar (up to half a
    // slot), so when the p99 label would sit level with the p50 label it is lifted above it.
    let l50: Vec<String> = runs.iter().map(|r| human::latency_us(r.latency_us.p50)).collect();
    let l99: Vec<String> = runs.iter().map(|r| human::latency_us(r.latency_us.p99)).collect();
    let all: Vec<String> = l50.iter().chain(&l99).cloned().collect();
    let px = fit_font(&all, slot_px * 0.48, 7.0, 12.0);
    let line_h = px.round() as i32 + 3;
    let bottom = Pos::new(HPos::Center, VPos::Bottom);
    for (i, r) in runs.iter().enumerate() {
        let x = i as f64;
        let top50 = chart.backend_coord(&(x + c50, p50(r))).1;
        let top99 = chart.backend_coord(&(x + c99, p99(r))).1;
        let y50 = top50 - 4;
        // Baseline of the p99 label: above its bar, and above the p50 label if they would
        // otherwise overlap vertically.
        let y99 = (top99 - 4).min(y50 - line_h);
        let lift = y99 - top99;
        chart.draw_series(std::iter::once(
            EmptyElement::at((x + c50, p50(r)))
                + Text::new(l50[i].clone(), (0, -4), font(px).color(&MUTED).pos(bottom)),
        ))?;
        chart.draw_series(std::iter::once(
            EmptyElement::at((x + c99, p99(r))) + Text::new(l99[i].clone(), (0, lift), bold(px).pos(bottom)),
        ))?;
    }
    Ok(())
}

fn draw_timeline(area: &Area, runs: &[RunReport]) -> anyhow::Result<()> {
    let legend: Vec<(String, Swatch)> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.throughput_per_s.is_empty())
        .map(|(i, r)| (r.protocol.clone(), Swatch::Line(color_of(i))))
        .collect();
    let area = panel(area, "Committed transactions per second over time", &legend)?;
    let len = runs.iter().map(|r| r.throughput_per_s.len()).max().unwrap_or(0).max(1);
    let max = runs.iter().flat_map(|r| r.throughput_per_s.iter().map(|v| finite(*v))).fold(0.0, f64::max);
    let y_max = if max > 0.0 { max * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(&area)
        .margin_left(12)
        .margin_right(36)
        .margin_bottom(10)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..len as f64, 0f64..y_max)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(AXIS)
        .x_labels(len.min(12) + 1)
        .y_labels(8)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .x_label_style(font(12.0).color(&MUTED))
        .y_label_style(font(12.0).color(&MUTED))
        .x_desc("time (s)")
        .y_desc("committed transactions / s")
        .axis_desc_style(font(13.0).color(&MUTED))
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        if r.throughput_per_s.is_empty() {
            continue;
        }
        let c = color_of(i);
        // Sample k covers second [k, k+1): plot it at the middle of that second.
        let points: Vec<(f64, f64)> =
            r.throughput_per_s.iter().enumerate().map(|(k, v)| (k as f64 + 0.5, finite(*v))).collect();
        chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?;
        if points.len() <= 30 {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{fake_runs, temp_path};

    #[test]
    fn plot_is_svg_with_every_protocol() {
        let runs = fake_runs();
        let path = temp_path("plot").join("nested").join("bench.svg");
        write_plot(&runs, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for r in &runs {
            assert!(svg.contains(&r.protocol), "missing {}", r.protocol);
        }
        assert!(svg.contains("over time"));
        assert!(svg.contains("aborts"));
        if std::env::var_os("DTX_REPORT_KEEP_PLOT").is_none() {
            std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap()).unwrap();
        } else {
            eprintln!("plot kept at {}", path.display());
        }
    }

    #[test]
    fn no_timeline_panel_without_samples() {
        let mut runs = fake_runs();
        for r in &mut runs {
            r.throughput_per_s.clear();
        }
        let svg = render_svg(&runs).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(!svg.contains("over time"));
    }

    #[test]
    fn png_is_rejected_and_empty_is_an_error() {
        let err = write_plot(&fake_runs(), Path::new("/nonexistent/x.PNG")).unwrap_err();
        assert!(err.to_string().contains("only SVG is supported"), "{err}");
        assert!(render_svg(&[]).is_err());
    }

    #[test]
    fn degenerate_values_do_not_panic() {
        let mut runs = fake_runs();
        runs[0].throughput_tps = f64::NAN;
        runs[1].latency_us = Default::default();
        runs[2].throughput_per_s = vec![f64::INFINITY];
        runs[2].protocol = "a-very-long-protocol-name-indeed".into();
        let svg = render_svg(&runs).unwrap();
        assert!(svg.starts_with("<svg"));
        let one = render_svg(&runs[..1]).unwrap();
        assert!(one.contains(&runs[0].protocol));
    }
}
