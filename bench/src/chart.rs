//! The report's charts, as SVG, from the same figures as its tables: sections per
//! second against the number of tasks on one hot key, and the waits' percentiles.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::peers::PeerKind;
use crate::report::Report;
use crate::scenarios::Contention;

/// Where the charts go, beside the report, and how the report links them.
pub(crate) const FOLDER: &str = "bench/charts";
pub(crate) const THROUGHPUT: &str = "hot-key-throughput.svg";
pub(crate) const WAITS: &str = "hot-key-waits.svg";

/// One implementation's line: (tasks, value) points.
struct Line {
    kind: PeerKind,
    label: String,
    points: Vec<(f64, f64)>,
}

/// Writes both charts into `FOLDER` under `root` (the report's folder); returns
/// their paths. Draws nothing when no hot-key scenario in one process ran.
pub(crate) fn write(report: &Report, root: &Path) -> Result<Vec<PathBuf>, String> {
    let throughput = lines(report, |result, kind| result.peer(kind).median());
    if throughput.is_empty() {
        return Ok(Vec::new());
    }
    let folder = root.join(FOLDER);
    std::fs::create_dir_all(&folder)
        .map_err(|error| format!("could not create {}: {error}", folder.display()))?;
    let throughput_file = folder.join(THROUGHPUT);
    draw(&throughput_file, (900, 560), |area| {
        plot(
            area,
            "Hot key: critical sections per second (median of the rounds)",
            "sections / s",
            &throughput,
        )
    })?;
    let millis = |pick: fn(&crate::stats::Waits) -> std::time::Duration| {
        move |result: &crate::report::ScenarioResult, kind| {
            let waits = result.peer(kind).waits()?;
            Some(pick(&waits).as_secs_f64() * 1000.0)
        }
    };
    // The serial limit never waits: it has no line here.
    let waiting = |mut lines: Vec<Line>| {
        lines.retain(|line| line.kind != PeerKind::SerialLimit);
        lines
    };
    let p50 = waiting(lines(report, millis(|waits| waits.p50)));
    let p99 = waiting(lines(report, millis(|waits| waits.p99)));
    let waits_file = folder.join(WAITS);
    draw(&waits_file, (1200, 520), |area| {
        let halves = area.split_evenly((1, 2));
        plot(&halves[0], "Wait for the lock, p50", "ms", &p50)?;
        plot(&halves[1], "Wait for the lock, p99", "ms", &p99)
    })?;
    Ok(vec![throughput_file, waits_file])
}

/// Each implementation's `value` in each hot-key burst of one process (`hot-…`, not
/// the steady rounds), by its number of tasks. Values that are missing or not
/// positive (a log scale cannot show them) are left out.
fn lines(
    report: &Report,
    value: impl Fn(&crate::report::ScenarioResult, PeerKind) -> Option<f64>,
) -> Vec<Line> {
    let hot: Vec<_> = report
        .results
        .iter()
        .filter(|result| {
            result.scenario.contention == Contention::HotKey
                && result.scenario.processes == 1
                && result.scenario.slug.starts_with("hot-")
        })
        .collect();
    PeerKind::ALL
        .into_iter()
        .map(|kind| Line {
            kind,
            label: report.label(kind),
            points: hot
                .iter()
                .filter(|result| result.peers.iter().any(|measured| measured.kind == kind))
                .filter_map(|result| {
                    let value = value(result, kind).filter(|v| v.is_finite() && *v > 0.0)?;
                    Some((result.scenario.tasks as f64, value))
                })
                .collect(),
        })
        .filter(|line| !line.points.is_empty())
        .collect()
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), Box<dyn std::error::Error + 'static>>;

fn draw(
    file: &Path,
    size: (u32, u32),
    body: impl FnOnce(&Area<'_>) -> Drawn,
) -> Result<(), String> {
    let failed =
        |error: &dyn std::fmt::Display| format!("could not draw {}: {error}", file.display());
    let area = SVGBackend::new(file, size).into_drawing_area();
    area.fill(&WHITE).map_err(|error| failed(&error))?;
    body(&area).map_err(|error| failed(&error))?;
    area.present().map_err(|error| failed(&error))
}

/// One log-log panel: a line and its points per implementation.
fn plot(area: &Area<'_>, title: &str, unit: &str, lines: &[Line]) -> Drawn {
    // No point to scale the axes to (a run of the serial limit alone has no waits):
    // a log axis from infinity to zero would ask for ticks without end.
    if lines.is_empty() {
        return Ok(());
    }
    let values = lines
        .iter()
        .flat_map(|line| &line.points)
        .map(|point| point.1);
    let low = values.clone().fold(f64::INFINITY, f64::min);
    let high = values.fold(0.0_f64, f64::max);
    let tasks = lines
        .iter()
        .flat_map(|line| &line.points)
        .map(|point| point.0);
    let first = tasks.clone().fold(f64::INFINITY, f64::min);
    let last = tasks.fold(0.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        // Room above the lines for the legend.
        .build_cartesian_2d(
            (first.min(10.0)..last * 1.5).log_scale(),
            (low / 2.0..high * 40.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("tasks on the hot key, in one process")
        .y_desc(unit)
        .x_label_formatter(&|tasks| format!("{tasks:.0}"))
        .y_label_formatter(&|value| short(*value))
        .draw()?;
    for line in lines {
        let color = color(line.kind);
        let width = if line.kind == PeerKind::Library { 3 } else { 2 };
        let style = color.stroke_width(width);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))?
            .label(&line.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart.draw_series(
            line.points
                .iter()
                .map(|point| Circle::new(*point, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn color(kind: PeerKind) -> RGBColor {
    match kind {
        PeerKind::Library => RGBColor(200, 30, 45),
        PeerKind::LibraryFixed => RGBColor(240, 110, 120),
        PeerKind::Raw => RGBColor(40, 90, 200),
        PeerKind::RawCareful => RGBColor(110, 160, 240),
        PeerKind::RslockDefault => RGBColor(30, 140, 70),
        PeerKind::RslockFast => RGBColor(230, 140, 20),
        PeerKind::SerialLimit => RGBColor(90, 90, 90),
    }
}

/// `0.05`, `3`, `250`, `12k`.
fn short(value: f64) -> String {
    match value {
        v if v >= 1000.0 => format!("{:.0}k", v / 1000.0),
        v if v >= 1.0 => format!("{v:.0}"),
        v => format!("{v:.2}"),
    }
}
