//! Charts drawn with plotters on `<canvas>` elements. Drawing only: every
//! number comes ready-made from the report (downsampling happens in `report`).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters_canvas::CanvasBackend;
use web_sys::HtmlCanvasElement;

use crate::report::Report;
use crate::Bytes;

const RESERVED: RGBColor = RGBColor(59, 111, 214);
const ALLOCATED: RGBColor = RGBColor(230, 126, 34);
const PEAK: RGBColor = RGBColor(192, 57, 43);
const FITS: RGBColor = RGBColor(46, 139, 87);
const OOM: RGBColor = RGBColor(192, 57, 43);
const GRID: RGBColor = RGBColor(200, 205, 215);
const FONT: &str = "sans-serif";

/// One shaded time band on the timeline (an iteration's phase).
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub start_ns: i64,
    pub end_ns: i64,
    pub label: String,
    /// Index into the band palette.
    pub shade: usize,
}

/// Band colours, one per phase kind.
pub const BAND_COLORS: [RGBColor; 6] = [
    RGBColor(120, 180, 120),
    RGBColor(180, 180, 180),
    RGBColor(120, 160, 230),
    RGBColor(230, 160, 110),
    RGBColor(190, 130, 210),
    RGBColor(220, 220, 220),
];

/// The colours of the breakdown categories, in the report's order.
pub const CATEGORY_COLORS: [RGBColor; 11] = [
    RGBColor(59, 111, 214),
    RGBColor(100, 150, 230),
    RGBColor(142, 68, 173),
    RGBColor(211, 84, 0),
    RGBColor(243, 156, 18),
    RGBColor(39, 174, 96),
    RGBColor(127, 140, 141),
    RGBColor(189, 195, 199),
    RGBColor(52, 73, 94),
    // the KV cache of a generation, listed last when there is one
    RGBColor(22, 160, 133),
    // quantisation state, after the parameters when there is some
    RGBColor(26, 82, 160),
];

/// One row of the breakdown: its label, bytes and colour (an index into
/// [`CATEGORY_COLORS`]).
pub type Part = (&'static str, Bytes, usize);

/// The label of a horizontal-bar chart's tick at `y`: the name of the row
/// whose bar is centred there, empty between rows. Rows are drawn top to
/// bottom in `names` order, so row 0 of the chart (bottom) is the last name.
fn row_label(names: &[String], y: f64) -> String {
    let n = names.len();
    let row = y.floor() as usize;
    if (y - row as f64 - 0.5).abs() < 0.26 && row < n {
        names.get(n - 1 - row).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

fn gib(bytes: Bytes) -> f64 {
    bytes.get() as f64 / Bytes::GIB as f64
}

/// An axis from zero: its end, rounded up to a whole number of "nice" steps
/// (1, 2 or 5 times a power of ten) with about `ticks` of them, and the step.
fn nice_axis(max: f64, ticks: usize) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / ticks.max(1) as f64;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|step| *step >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * power);
    ((max / step - 1e-9).ceil().max(1.0) * step, step)
}

/// A tick label with as many decimals as the axis's step needs: `80`, not
/// `80.0`; `0.05` and `0.10`, not `0.05` and `0.1`.
fn tick(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    };
    // No "-0".
    let value = if value.abs() < step * 1e-6 {
        0.0
    } else {
        value
    };
    format!("{value:.decimals$}")
}

/// The number of labels plotters needs to put one at every `step` over `0..end`.
fn label_count(end: f64, step: f64) -> usize {
    (end / step).round() as usize + 1
}

/// Sizes canvases to the width each is shown at (its container's, at most
/// the width it was designed for), its height scaled with it but never under
/// 60 % of the design's, so that a chart on a phone is drawn at the phone's
/// size with readable labels instead of a shrunk desktop picture. The design
/// size is kept in `data-width`/`data-height` the first time.
///
/// All the canvases a view draws are sized at once: every one is set to its
/// design width, then every shown width is read, then every final size is
/// set. Reading a width after a canvas was resized forces the browser to lay
/// the page out again, so sizing them one by one laid it out once per chart.
pub fn fit_all(canvases: &[&HtmlCanvasElement]) {
    let design = |canvas: &HtmlCanvasElement, name: &str, now: u32| -> u32 {
        match canvas.get_attribute(name).and_then(|v| v.parse().ok()) {
            Some(v) => v,
            None => {
                let _ = canvas.set_attribute(name, &now.to_string());
                now
            }
        }
    };
    let designs: Vec<(u32, u32)> = canvases
        .iter()
        .map(|canvas| {
            let width = design(canvas, "data-width", canvas.width());
            let height = design(canvas, "data-height", canvas.height());
            // At its design width the canvas is shown at most as wide as its
            // box (CSS max-width: 100%): that is the width to draw at.
            if width != 0 && canvas.width() != width {
                canvas.set_width(width);
            }
            (width, height)
        })
        .collect();
    let shown: Vec<u32> = canvases
        .iter()
        .zip(&designs)
        .map(|(canvas, (width, _))| {
            if *width == 0 {
                0
            } else {
                u32::try_from(canvas.client_width()).unwrap_or(0)
            }
        })
        .collect();
    for ((canvas, (width, height)), shown) in canvases.iter().zip(designs).zip(shown) {
        if width == 0 || shown == 0 {
            continue;
        }
        let w = shown.clamp(280.min(width), width);
        let h =
            (u64::from(height) * u64::from(w) / u64::from(width)).max(u64::from(height) * 6 / 10);
        let h = u32::try_from(h).unwrap_or(height);
        if canvas.width() != w {
            canvas.set_width(w);
        }
        if canvas.height() != h {
            canvas.set_height(h);
        }
    }
}

/// Runs `draw` once the browser has painted what the current task changed:
/// the verdict and the tables of a new estimate show first, and its charts
/// (the slowest part of showing it, a few hundred ms the first time, while
/// the browser compiles the drawing code) a frame later. A frame callback
/// runs before the paint, so it sets a zero-delay timer, whose turn comes
/// after it.
pub fn after_paint(draw: impl FnOnce() + 'static) {
    use std::cell::Cell;
    use std::rc::Rc;
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;
    let Some(window) = web_sys::window() else {
        return draw();
    };
    let pending = Rc::new(Cell::new(Some(draw)));
    let timer_window = window.clone();
    let in_frame = Rc::clone(&pending);
    let frame = Closure::once_into_js(move || {
        let timer = Closure::once_into_js(move || {
            if let Some(draw) = in_frame.take() {
                draw();
            }
        });
        let _ = timer_window
            .set_timeout_with_callback_and_timeout_and_arguments_0(timer.unchecked_ref(), 0);
    });
    if window
        .request_animation_frame(frame.unchecked_ref())
        .is_err()
    {
        // No frame to wait for: draw now.
        if let Some(draw) = pending.take() {
            draw();
        }
    }
}

/// The canvas as a white drawing area, at the size [`fit_all`] gave it.
fn area(canvas: &HtmlCanvasElement) -> Result<DrawingArea<CanvasBackend, Shift>, String> {
    let backend = CanvasBackend::with_canvas_object(canvas.clone())
        .ok_or_else(|| "this browser gave no 2D canvas to draw on".to_string())?;
    let root = backend.into_drawing_area();
    root.fill(&WHITE).map_err(|err| err.to_string())?;
    Ok(root)
}

/// Allocated and reserved bytes over time, phases shaded, the peak marked.
pub fn timeline(canvas: &HtmlCanvasElement, report: &Report, bands: &[Band]) -> Result<(), String> {
    let root = area(canvas)?;
    let points = &report.timeline;
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Ok(());
    };
    let t0 = first.time_ns.get();
    let secs = |t: i64| (t - t0) as f64 / 1e9;
    let x_max = secs(last.time_ns.get()).max(1e-9);
    let (x_end, x_step) = nice_axis(x_max, 8);
    let (y_max, y_step) = nice_axis(
        points
            .iter()
            .map(|p| gib(p.reserved_bytes).max(gib(p.allocated_bytes)))
            .fold(0.0, f64::max)
            * 1.08,
        5,
    );
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_right(24)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_end, 0.0..y_max)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(GRID.mix(0.15))
        .x_desc("CPU trace time (s) — event order, not GPU step time")
        .y_desc("GiB")
        .x_labels(label_count(x_end, x_step))
        .y_labels(label_count(y_max, y_step))
        .x_label_formatter(&|x| tick(*x, x_step))
        .y_label_formatter(&|y| tick(*y, y_step))
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    for band in bands {
        let color = BAND_COLORS.get(band.shade).copied().unwrap_or(GRID);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(secs(band.start_ns), 0.0), (secs(band.end_ns), y_max)],
                color.mix(0.18).filled(),
            )))
            .map_err(|err| err.to_string())?;
    }
    chart
        .draw_series(AreaSeries::new(
            points
                .iter()
                .map(|p| (secs(p.time_ns.get()), gib(p.reserved_bytes))),
            0.0,
            RESERVED.mix(0.25),
        ))
        .map_err(|err| err.to_string())?
        .label("reserved")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], RESERVED.mix(0.5).filled()));
    chart
        .draw_series(LineSeries::new(
            points
                .iter()
                .map(|p| (secs(p.time_ns.get()), gib(p.allocated_bytes))),
            ALLOCATED.stroke_width(2),
        ))
        .map_err(|err| err.to_string())?
        .label("allocated")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], ALLOCATED.stroke_width(2)));
    let peak_x = secs(report.peak.at.time_ns.get());
    let peak_y = gib(report.peak.reserved_bytes);
    chart
        .draw_series(std::iter::once(Circle::new(
            (peak_x, peak_y),
            5,
            PEAK.filled(),
        )))
        .map_err(|err| err.to_string())?
        .label(format!("peak reserved {peak_y:.2} GiB"))
        .legend(|(x, y)| Circle::new((x + 7, y), 4, PEAK.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(GRID)
        .label_font((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    root.present().map_err(|err| err.to_string())
}

/// The estimate against each selected GPU: capacity bars, the peak total as
/// a bar coloured by the verdict.
pub fn gpus(canvas: &HtmlCanvasElement, report: &Report) -> Result<(), String> {
    let root = area(canvas)?;
    let n = report.gpus.len().max(1);
    let (x_max, x_step) = nice_axis(
        report
            .gpus
            .iter()
            .map(|g| gib(g.capacity_bytes).max(gib(g.peak_total_bytes)))
            .fold(gib(report.peak.total_bytes), f64::max),
        6,
    );
    let names: Vec<String> = report.gpus.iter().map(|g| g.preset.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(130)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(GRID.mix(0.15))
        .x_desc("GiB (bar: peak needed; grey: capacity)")
        .x_labels(label_count(x_max, x_step))
        .x_label_formatter(&|x| tick(*x, x_step))
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| row_label(&names, *y))
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    for (idx, gpu) in report.gpus.iter().enumerate() {
        let y = (n - 1 - idx) as f64;
        let color = if gpu.fits { FITS } else { OOM };
        let needed = gpu.shortfall_bytes.map_or(gpu.peak_total_bytes, |short| {
            gpu.capacity_bytes.saturating_add(short)
        });
        chart
            .draw_series([
                Rectangle::new(
                    [(0.0, y + 0.15), (gib(gpu.capacity_bytes), y + 0.85)],
                    GRID.mix(0.6).filled(),
                ),
                Rectangle::new([(0.0, y + 0.3), (gib(needed), y + 0.7)], color.filled()),
            ])
            .map_err(|err| err.to_string())?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                [
                    (gib(gpu.capacity_bytes), y + 0.1),
                    (gib(gpu.capacity_bytes), y + 0.9),
                ],
                BLACK.stroke_width(2),
            )))
            .map_err(|err| err.to_string())?;
    }
    root.present().map_err(|err| err.to_string())
}

/// One stacked bar: the breakdown at the peak by category.
pub fn breakdown(canvas: &HtmlCanvasElement, parts: &[Part]) -> Result<(), String> {
    let root = area(canvas)?;
    let total: f64 = parts.iter().map(|(_, b, _)| gib(*b)).sum::<f64>();
    let (x_max, x_step) = nice_axis(total, 5);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .light_line_style(GRID.mix(0.15))
        .x_desc("GiB at the peak")
        .x_labels(label_count(x_max, x_step))
        .x_label_formatter(&|x| tick(*x, x_step))
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    let mut start = 0.0;
    for &(_, bytes, idx) in parts {
        let width = gib(bytes);
        if width <= 0.0 {
            continue;
        }
        let color = CATEGORY_COLORS.get(idx).copied().unwrap_or(GRID);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(start, 0.35), (start + width, 0.95)],
                color.filled(),
            )))
            .map_err(|err| err.to_string())?;
        start += width;
    }
    root.present().map_err(|err| err.to_string())
}

/// Horizontal bars, one per labelled value, the highlighted ones in green.
pub fn bars(canvas: &HtmlCanvasElement, rows: &[(String, Bytes, bool)]) -> Result<(), String> {
    let root = area(canvas)?;
    let n = rows.len().max(1);
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let (x_max, x_step) = nice_axis(rows.iter().map(|(_, b, _)| gib(*b)).fold(0.0, f64::max), 6);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(230)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(GRID.mix(0.15))
        .x_desc("peak total, GiB")
        .x_labels(label_count(x_max, x_step))
        .x_label_formatter(&|x| tick(*x, x_step))
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| row_label(&names, *y))
        .label_style((FONT, 12))
        .draw()
        .map_err(|err| err.to_string())?;
    for (idx, (_, bytes, highlight)) in rows.iter().enumerate() {
        let y = (n - 1 - idx) as f64;
        let color = if *highlight { FITS } else { RESERVED };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.2), (gib(*bytes), y + 0.8)],
                color.filled(),
            )))
            .map_err(|err| err.to_string())?;
    }
    root.present().map_err(|err| err.to_string())
}

/// Peak total against batch size (whole batches on the x axis), with a
/// capacity line per GPU and a mark at the largest batch that fits it. GPUs
/// whose lines would overlap share one label.
pub fn batch(
    canvas: &HtmlCanvasElement,
    points: &[(u32, Bytes)],
    capacities: &[(String, Bytes, u32)],
) -> Result<(), String> {
    let root = area(canvas)?;
    let largest = points
        .iter()
        .map(|p| p.0)
        .chain(capacities.iter().map(|c| c.2))
        .max()
        .unwrap_or(1)
        .max(1);
    let (x_end, x_step) = nice_axis(f64::from(largest) * 1.04, 8);
    // Whole batches: the step is at least 1.
    let x_step = x_step.max(1.0);
    let x_end = x_end.max(x_step) as u32;
    let (y_max, y_step) = nice_axis(
        points
            .iter()
            .map(|p| gib(p.1))
            .chain(capacities.iter().map(|c| gib(c.1)))
            .fold(0.0, f64::max)
            * 1.05,
        6,
    );
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .margin_right(32)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0..x_end, 0.0..y_max)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(GRID.mix(0.15))
        .x_desc("batch size (red dot: the largest batch that fits)")
        .y_desc("peak total, GiB")
        .x_labels(label_count(f64::from(x_end), x_step))
        .y_labels(label_count(y_max, y_step))
        .x_label_formatter(&|x| x.to_string())
        .y_label_formatter(&|y| tick(*y, y_step))
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    for (_, capacity, max_batch) in capacities {
        let y = gib(*capacity);
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(0, y), (x_end, y)],
                OOM.mix(0.5).stroke_width(1),
            )))
            .map_err(|err| err.to_string())?;
        chart
            .draw_series(std::iter::once(Circle::new(
                (*max_batch, y),
                4,
                OOM.filled(),
            )))
            .map_err(|err| err.to_string())?;
    }
    for (label, y) in capacity_labels(capacities, y_max) {
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x_end / 50, y),
                (FONT, 12),
            )))
            .map_err(|err| err.to_string())?;
    }
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.0, gib(p.1))),
            RESERVED.stroke_width(2),
        ))
        .map_err(|err| err.to_string())?;
    chart
        .draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, gib(p.1)), 3, RESERVED.filled())),
        )
        .map_err(|err| err.to_string())?;
    root.present().map_err(|err| err.to_string())
}

/// One label per group of capacity lines closer than 6 % of the axis, with
/// the group's names, at its highest line (text hangs below its anchor).
fn capacity_labels(capacities: &[(String, Bytes, u32)], y_max: f64) -> Vec<(String, f64)> {
    let mut sorted: Vec<(&str, f64)> = capacities
        .iter()
        .map(|(name, capacity, _)| (name.as_str(), gib(*capacity)))
        .collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut labels: Vec<(Vec<&str>, f64, f64)> = Vec::new();
    for (name, y) in sorted {
        match labels.last_mut() {
            Some((names, _, lowest)) if *lowest - y < y_max * 0.06 => {
                names.push(name);
                *lowest = y;
            }
            _ => labels.push((vec![name], y, y)),
        }
    }
    labels
        .into_iter()
        .map(|(names, top, _)| (names.join(", "), top))
        .collect()
}
