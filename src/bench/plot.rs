//! The benchmark's SVG plots: throughput against streams, and ping against time.

use super::grid::{Direction, Streams};
use super::report::{CellReport, Latency, Record, Report, size_label};
use anyhow::Result;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Throughput against streams, one line per tool, buffer and block size, with mean ± std
/// error bars and the model's prediction dashed; one file per scenario and direction.
/// Latency against time, one file per scenario. Returns the files' names.
pub fn plots(r: &Report, records: &[Record], dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut keys: Vec<(String, Direction)> = r
        .cells
        .iter()
        .map(|c| (c.cell.scenario.clone(), c.cell.direction))
        .collect();
    keys.dedup();
    keys.sort_by(|a, b| (&a.0, a.1.name()).cmp(&(&b.0, b.1.name())));
    keys.dedup();
    for (sc, dir_) in keys {
        let cells: Vec<&CellReport> = r
            .cells
            .iter()
            .filter(|c| c.cell.scenario == sc && c.cell.direction == dir_)
            .filter(|c| matches!(c.cell.streams, Streams::Fixed(_)) && c.mbit_s.is_some())
            .collect();
        if cells.is_empty() {
            continue;
        }
        let name = format!("throughput-{}-{}.svg", file_part(&sc), dir_.name());
        throughput_plot(&cells, &dir.join(&name), &format!("{sc}, {}", dir_.name()))?;
        names.push(name);
    }
    let mut scenarios: Vec<&String> = records.iter().map(|r| &r.cell.scenario).collect();
    scenarios.dedup();
    for sc in scenarios {
        let name = format!("latency-{}.svg", file_part(sc));
        let runs: Vec<&Record> = records.iter().filter(|r| &r.cell.scenario == sc).collect();
        if runs.iter().all(|r| r.measured.ping.is_empty()) {
            continue;
        }
        latency_plot(&runs, r.idle.get(sc), &dir.join(&name), sc)?;
        names.push(name);
    }
    Ok(names)
}

/// A scenario's name as part of a file name ("remote host" → "remote-host").
fn file_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn throughput_plot(cells: &[&CellReport], path: &Path, title: &str) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("cannot draw {}: {e}", path.display());
    let streams = |c: &CellReport| match c.cell.streams {
        Streams::Fixed(n) => f64::from(n),
        Streams::Auto => 0.0,
    };
    let x_max = cells.iter().map(|c| streams(c)).fold(1.0, f64::max);
    let y_max = cells
        .iter()
        .flat_map(|c| {
            let s = c.mbit_s.as_ref().map_or(0.0, |s| s.max.max(s.mean + s.std));
            let m = c.model.as_ref().map_or(0.0, |m| m.predicted_mbit_s);
            [s, m]
        })
        .fold(0.0, f64::max)
        .max(1e-3);
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: throughput against streams (mean ± std; model dashed)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..x_max + 0.5, 0.0..y_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("streams")
        .y_desc("Mbit/s")
        .draw()
        .map_err(err)?;
    let mut lines: BTreeMap<String, Vec<&CellReport>> = BTreeMap::new();
    for c in cells {
        let key = format!(
            "{} buffer {} block {}",
            c.cell.tool_label(),
            size_label(c.cell.buffer),
            size_label(c.cell.block)
        );
        lines.entry(key).or_default().push(c);
    }
    for (i, (label, mut line)) in lines.into_iter().enumerate() {
        line.sort_by(|a, b| streams(a).total_cmp(&streams(b)));
        let color = Palette99::pick(i).to_rgba();
        let means: Vec<(f64, f64)> = line
            .iter()
            .filter_map(|c| Some((streams(c), c.mbit_s.as_ref()?.mean)))
            .collect();
        chart
            .draw_series(LineSeries::new(means.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        chart
            .draw_series(line.iter().filter_map(|c| {
                let s = c.mbit_s.as_ref()?;
                Some(ErrorBar::new_vertical(
                    streams(c),
                    s.mean - s.std,
                    s.mean,
                    s.mean + s.std,
                    color.filled(),
                    8,
                ))
            }))
            .map_err(err)?;
        let model: Vec<(f64, f64)> = line
            .iter()
            .filter_map(|c| Some((streams(c), c.model.as_ref()?.predicted_mbit_s)))
            .collect();
        chart
            .draw_series(DashedLineSeries::new(model, 6, 4, color.stroke_width(1)))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn latency_plot(runs: &[&Record], idle: Option<&Latency>, path: &Path, title: &str) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("cannot draw {}: {e}", path.display());
    let points: Vec<(f64, f64)> = runs
        .iter()
        .flat_map(|r| r.measured.ping.iter().copied())
        .collect();
    let t_max = points.iter().map(|p| p.0).fold(1e-3, f64::max);
    let t_min = points.iter().map(|p| p.0).fold(t_max, f64::min);
    let y_max = points.iter().map(|p| p.1).fold(1e-3, f64::max);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: ping RTT during the runs (idle p50 dashed)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(t_min..t_max, 0.0..y_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the benchmark started")
        .y_desc("RTT (ms)")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            points
                .iter()
                .map(|&(t, ms)| Circle::new((t, ms), 2, BLUE.filled())),
        )
        .map_err(err)?;
    if let Some(l) = idle {
        chart
            .draw_series(DashedLineSeries::new(
                [(t_min, l.p50_ms), (t_max, l.p50_ms)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
