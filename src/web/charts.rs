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
pub const CATEGORY_COLORS: [RGBColor; 9] = [
    RGBColor(59, 111, 214),
    RGBColor(100, 150, 230),
    RGBColor(142, 68, 173),
    RGBColor(211, 84, 0),
    RGBColor(243, 156, 18),
    RGBColor(39, 174, 96),
    RGBColor(127, 140, 141),
    RGBColor(189, 195, 199),
    RGBColor(52, 73, 94),
];

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
    let y_max = points
        .iter()
        .map(|p| gib(p.reserved_bytes).max(gib(p.allocated_bytes)))
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.12;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(GRID.mix(0.3))
        .x_desc("trace time (s)")
        .y_desc("GiB")
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
        .label(format!("peak reserved {:.2} GiB", peak_y))
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
    let x_max = report
        .gpus
        .iter()
        .map(|g| gib(g.capacity_bytes).max(gib(g.peak_total_bytes)))
        .fold(gib(report.peak.total_bytes), f64::max)
        * 1.05;
    let names: Vec<String> = report.gpus.iter().map(|g| g.preset.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(130)
        .build_cartesian_2d(0.0..x_max.max(1e-6), 0.0..n as f64)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(GRID.mix(0.3))
        .x_desc("GiB")
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
pub fn breakdown(canvas: &HtmlCanvasElement, parts: &[(&str, Bytes)]) -> Result<(), String> {
    let root = area(canvas)?;
    let total: f64 = parts.iter().map(|(_, b)| gib(*b)).sum::<f64>().max(1e-9);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .build_cartesian_2d(0.0..total * 1.02, 0.0..1.0)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .light_line_style(GRID.mix(0.3))
        .x_desc("GiB at the peak")
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    let mut start = 0.0;
    for (idx, (_, bytes)) in parts.iter().enumerate() {
        let width = gib(*bytes);
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
    let x_max = rows
        .iter()
        .map(|(_, b, _)| gib(*b))
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(230)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(GRID.mix(0.3))
        .x_desc("peak total, GiB")
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

/// Peak total against batch size, with a capacity line per GPU and a mark
/// at the largest batch that fits it.
pub fn batch(
    canvas: &HtmlCanvasElement,
    points: &[(u32, Bytes)],
    capacities: &[(String, Bytes, u32)],
) -> Result<(), String> {
    let root = area(canvas)?;
    let x_max = points
        .iter()
        .map(|p| p.0)
        .chain(capacities.iter().map(|c| c.2))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.05;
    let y_max = points
        .iter()
        .map(|p| gib(p.1))
        .chain(capacities.iter().map(|c| gib(c.1)))
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.08;
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|err| err.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(GRID.mix(0.3))
        .x_desc("batch size (red dot: largest batch that fits)")
        .y_desc("peak total, GiB")
        .label_style((FONT, 13))
        .draw()
        .map_err(|err| err.to_string())?;
    for (name, capacity, max_batch) in capacities {
        let y = gib(*capacity);
        chart
            .draw_series(std::iter::once(Circle::new(
                (f64::from(*max_batch), y),
                4,
                OOM.filled(),
            )))
            .map_err(|err| err.to_string())?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(0.0, y), (x_max, y)],
                OOM.mix(0.6).stroke_width(1),
            )))
            .map_err(|err| err.to_string())?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (x_max * 0.02, y),
                (FONT, 12),
            )))
            .map_err(|err| err.to_string())?;
    }
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (f64::from(p.0), gib(p.1))),
            RESERVED.stroke_width(2),
        ))
        .map_err(|err| err.to_string())?;
    chart
        .draw_series(
            points
                .iter()
                .map(|p| Circle::new((f64::from(p.0), gib(p.1)), 3, RESERVED.filled())),
        )
        .map_err(|err| err.to_string())?;
    root.present().map_err(|err| err.to_string())
}
