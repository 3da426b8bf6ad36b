//! `--plot out.svg`: the time-sequence graph (data, acks, retransmissions marked), throughput
//! over time and RTT over time, for every direction that carried data. Points are thinned as
//! they come (every other one dropped when a series fills), so memory stays bounded however
//! long the capture.

use super::tcp::Seen;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Points kept per series, at most twice this.
const KEEP: usize = 4000;

/// A series thinned as it grows: keeps every `stride`-th point.
#[derive(Default)]
struct Thinned {
    stride: u64,
    seen: u64,
    points: Vec<(f64, f64)>,
}

impl Thinned {
    fn push(&mut self, x: f64, y: f64) {
        if self.stride == 0 {
            self.stride = 1;
        }
        if self.seen.is_multiple_of(self.stride) {
            self.points.push((x, y));
            if self.points.len() >= 2 * KEEP {
                let kept: Vec<_> = self.points.iter().copied().step_by(2).collect();
                self.points = kept;
                self.stride *= 2;
            }
        }
        self.seen += 1;
    }
}

#[derive(Default)]
struct Flow {
    /// (time s, end of the data sent, MB from the first byte)
    data: Thinned,
    /// Retransmissions, all kept up to a bound.
    rexmt: Thinned,
    /// (time s, MB acknowledged by the other side)
    acks: Thinned,
    /// (time s, RTT ms)
    rtt: Thinned,
    /// (time s, cumulative data bytes)
    bytes: Thinned,
    total: u64,
}

/// Collects what the plot needs while the capture is read.
#[derive(Default)]
pub struct Collector {
    flows: BTreeMap<(usize, usize), Flow>,
}

impl Collector {
    pub fn add(&mut self, t_s: f64, seen: &Seen) {
        let mb = |b: u64| b as f64 / 1e6;
        if seen.data_len > 0 {
            let f = self
                .flows
                .entry((seen.connection, seen.direction))
                .or_default();
            let end = seen.offset + u64::from(seen.data_len);
            f.data.push(t_s, mb(end));
            if seen.retransmission {
                f.rexmt.push(t_s, mb(end));
            }
            f.total += u64::from(seen.data_len);
            f.bytes.push(t_s, f.total as f64);
        }
        // An ACK (or RTT sample) describes the other direction's data.
        let other = (seen.connection, 1 - seen.direction);
        if let Some(f) = self.flows.get_mut(&other) {
            if seen.acked > 0 {
                f.acks.push(t_s, mb(seen.acked));
            }
            if let Some(rtt) = seen.rtt {
                f.rtt.push(t_s, rtt as f64 / 1e6);
            }
        }
    }

    /// Draws the three graphs into an SVG file.
    pub fn draw(&self, path: &Path, title: &str) -> Result<(), String> {
        let root = SVGBackend::new(path, (1100, 1300)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| format!("cannot draw {}: {e}", path.display());
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
        let panels = root.split_evenly((3, 1));
        let t_max = self
            .flows
            .values()
            .flat_map(|f| f.data.points.last().map(|p| p.0))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let name =
            |(c, d): (usize, usize)| format!("#{c} {}", if d == 0 { "a->b" } else { "b->a" });

        // Time-sequence graph.
        let y_max = self
            .flows
            .values()
            .flat_map(|f| f.data.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let mut chart = ChartBuilder::on(&panels[0])
            .caption(
                "time-sequence: data sent (lines), acked (thin), retransmissions (red)",
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..t_max * 1.02, 0.0..y_max * 1.05)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("sequence offset (MB)")
            .draw()
            .map_err(err)?;
        for (i, (key, f)) in self.flows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    f.data.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(name(*key))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
            chart
                .draw_series(LineSeries::new(
                    f.acks.points.iter().copied(),
                    color.mix(0.5),
                ))
                .map_err(err)?;
            chart
                .draw_series(
                    f.rexmt
                        .points
                        .iter()
                        .map(|&p| Circle::new(p, 3, RED.filled())),
                )
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;

        // Throughput in 200 equal time bins, from the cumulative byte count at each edge.
        const BINS: usize = 200;
        let width = t_max / BINS as f64;
        let rates: Vec<Vec<(f64, f64)>> = self
            .flows
            .values()
            .map(|f| {
                let at = |t: f64| {
                    let i = f.bytes.points.partition_point(|p| p.0 <= t);
                    if i == 0 { 0.0 } else { f.bytes.points[i - 1].1 }
                };
                (1..=BINS)
                    .map(|k| {
                        let (a, b) = ((k - 1) as f64 * width, k as f64 * width);
                        (b, (at(b) - at(a)) * 8.0 / width / 1e6)
                    })
                    .collect()
            })
            .collect();
        let r_max = rates
            .iter()
            .flatten()
            .map(|p| p.1)
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let mut chart = ChartBuilder::on(&panels[1])
            .caption("throughput (200 time bins)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..t_max * 1.02, 0.0..r_max * 1.05)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("Mbit/s")
            .draw()
            .map_err(err)?;
        for (i, series) in rates.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(series.iter().copied(), color))
                .map_err(err)?;
        }

        // RTT samples.
        let rtt_max = self
            .flows
            .values()
            .flat_map(|f| f.rtt.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let mut chart = ChartBuilder::on(&panels[2])
            .caption("RTT samples (Karn's rule)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..t_max * 1.02, 0.0..rtt_max * 1.1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("ms")
            .draw()
            .map_err(err)?;
        for (i, f) in self.flows.values().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(
                    f.rtt
                        .points
                        .iter()
                        .map(|&p| Circle::new(p, 2, color.filled())),
                )
                .map_err(err)?;
        }
        root.present().map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_shape_and_bounds_memory() {
        let mut s = Thinned::default();
        for i in 0..100_000 {
            s.push(i as f64, 2.0 * i as f64);
        }
        assert!(s.points.len() < 2 * KEEP, "{}", s.points.len());
        assert!(s.points.len() >= KEEP / 2);
        assert_eq!(s.points[0], (0.0, 0.0));
        assert!(s.points.iter().all(|&(x, y)| y == 2.0 * x));
        // Evenly spaced: the stride is a power of two.
        let step = s.points[1].0 - s.points[0].0;
        assert!(s.points.windows(2).all(|w| w[1].0 - w[0].0 == step));
    }
}
