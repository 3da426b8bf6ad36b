//! What a benchmark measured, per cell: statistics, ping inflation, the model's prediction
//! beside the measurement, correlations with each swept parameter; written as JSON, CSV,
//! Markdown and SVG.

use super::grid::{Cell, Direction, Run, Streams, Tool};
use super::parse::Measured;
use super::stats::{Summary, pearson, percentile};
use crate::model::limits::{LimitKind, Prediction};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One measurement, as results.jsonl keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub run: Run,
    pub cell: Cell,
    /// Seconds since the benchmark started.
    pub started: f64,
    pub measured: Measured,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(ms: &[f64]) -> Option<Latency> {
        let mut v: Vec<f64> = ms.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Latency {
            samples: v.len(),
            p50_ms: percentile(&v, 0.5),
            p95_ms: percentile(&v, 0.95),
            max_ms: v[v.len() - 1],
        })
    }
}

/// A scenario's link as configured: what its idle ping and its rate should be.
#[derive(Debug, Clone, Serialize)]
pub struct PathInfo {
    pub mtu: u16,
    /// Both delays plus an 84-byte ping's serialization each way.
    pub ping_rtt_ms: f64,
    /// Link rate less IP and TCP headers, bit/s; None when unlimited.
    pub up_payload_bps: Option<f64>,
    pub down_payload_bps: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCheck {
    pub predicted_mbit_s: f64,
    pub binding: LimitKind,
    /// (measured median − predicted) / predicted, percent.
    pub error_percent: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellReport {
    pub cell: Cell,
    /// Payload throughput, Mbit/s, of the runs that completed.
    pub mbit_s: Option<Summary>,
    pub seconds: Option<Summary>,
    /// The command's wall time, start-up (an ssh login, a far side started) included.
    pub wall_seconds: Option<Summary>,
    pub failures: usize,
    pub errors: Vec<String>,
    /// Ping across the link while this cell ran.
    pub ping: Option<Latency>,
    /// Ping p50 and p95 less the idle link's p50, ms.
    pub inflation_p50_ms: Option<f64>,
    pub inflation_p95_ms: Option<f64>,
    pub model: Option<ModelCheck>,
    /// The limit the sending kernel reported for most of its busy time (uploads).
    pub kernel_limit: Option<String>,
    pub retransmits_median: Option<f64>,
    /// CPU seconds per GiB moved, client and servers together (median of the runs).
    pub cpu_s_per_gib: Option<f64>,
    /// The connection counts the tool ended with, each once (what `-n auto` chose).
    pub streams_used: Vec<u32>,
    /// braid: the median seconds until a run's rate first reached 90 % of where it settled.
    pub ramp_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Correlation {
    pub scenario: String,
    pub tool: Tool,
    /// streams, buffer, block or direction (get 0, put 1).
    pub parameter: &'static str,
    pub runs: usize,
    /// Pearson's r of throughput with the parameter.
    pub r: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub command: String,
    /// The seed experiment this was (`--experiment`).
    pub experiment: Option<String>,
    /// Each scenario's payload was sized to take this long at its link's rate (`--duration`).
    pub duration: Option<f64>,
    pub size: u64,
    /// `--files`: each run moved a tree of this many files of `size` bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    pub repeats: u32,
    pub interrupted: bool,
    /// Ping on each scenario's idle link.
    pub idle: BTreeMap<String, Latency>,
    /// "scenario tool direction": seconds a clock-timed tool spent on a 1-byte file there,
    /// taken off each of its runs.
    pub setup_seconds: BTreeMap<String, f64>,
    /// Each scenario's link counters over all its runs (queue drops, losses, longest queueing
    /// delay per direction), as `braid lab` reports them.
    pub links: BTreeMap<String, serde_json::Value>,
    /// Each scenario's link as configured.
    pub paths: BTreeMap<String, PathInfo>,
    /// `--loopback`: the ports its servers listened on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loopback_ports: Option<super::servers::Ports>,
    pub cells: Vec<CellReport>,
    pub correlations: Vec<Correlation>,
}

fn mbit(bytes_per_second: f64) -> f64 {
    bytes_per_second * 8.0 / 1e6
}

/// What the whole benchmark was.
pub struct Head {
    pub command: String,
    pub size: u64,
    pub repeats: u32,
    pub interrupted: bool,
    pub experiment: Option<String>,
    pub duration: Option<f64>,
    /// `--files`: each run moved a tree of this many files of `size` bytes.
    pub files: Option<u64>,
}

pub fn build(
    head: Head,
    cells: &[Cell],
    predictions: &[Option<Prediction>],
    idle: BTreeMap<String, Latency>,
    setup_seconds: BTreeMap<String, f64>,
    records: &[Record],
) -> Report {
    let mut out = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        let runs: Vec<&Record> = records.iter().filter(|r| r.run.cell == i).collect();
        if runs.is_empty() {
            continue;
        }
        let ok: Vec<&Measured> = runs
            .iter()
            .map(|r| &r.measured)
            .filter(|m| m.error.is_none())
            .collect();
        let mbit_s = Summary::of(
            &ok.iter()
                .map(|m| mbit(m.bytes_per_second))
                .collect::<Vec<_>>(),
        );
        let ping: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.measured.ping.iter().map(|p| p.1))
            .collect();
        let ping = Latency::of(&ping);
        let idle_p50 = idle.get(&cell.scenario).map(|l| l.p50_ms);
        let inflation = |f: fn(&Latency) -> f64| Some(f(ping.as_ref()?) - idle_p50?);
        let model = predictions[i].as_ref().map(|p| {
            let predicted = mbit(p.bytes_per_second);
            ModelCheck {
                predicted_mbit_s: predicted,
                binding: p.binding,
                error_percent: mbit_s
                    .as_ref()
                    .map(|s| (s.median - predicted) / predicted * 100.0),
            }
        });
        let mut sender = ok.iter().filter_map(|m| m.sender.as_ref());
        let kernel_limit = sender.next().map(|first| {
            let mut total = first.clone();
            for s in sender {
                total.busy_ms += s.busy_ms;
                total.rwnd_limited_ms += s.rwnd_limited_ms;
                total.sndbuf_limited_ms += s.sndbuf_limited_ms;
            }
            total
                .dominant()
                .map_or("none (the network)".to_string(), str::to_string)
        });
        out.push(CellReport {
            cell: cell.clone(),
            mbit_s,
            seconds: Summary::of(&ok.iter().map(|m| m.seconds).collect::<Vec<_>>()),
            wall_seconds: Summary::of(&ok.iter().map(|m| m.wall_seconds).collect::<Vec<_>>()),
            failures: runs.len() - ok.len(),
            errors: runs
                .iter()
                .filter_map(|r| r.measured.error.clone())
                .collect(),
            inflation_p50_ms: inflation(|l| l.p50_ms),
            inflation_p95_ms: inflation(|l| l.p95_ms),
            ping,
            model,
            kernel_limit,
            cpu_s_per_gib: Summary::of(
                &ok.iter()
                    .filter(|m| m.bytes > 0)
                    .filter_map(|m| Some(m.cpu_seconds? / (m.bytes as f64 / (1u64 << 30) as f64)))
                    .collect::<Vec<_>>(),
            )
            .map(|s| s.median),
            retransmits_median: Summary::of(
                &ok.iter()
                    .filter_map(|m| m.retransmits.map(|r| r as f64))
                    .collect::<Vec<_>>(),
            )
            .map(|s| s.median),
            streams_used: {
                let mut used: Vec<u32> = ok.iter().filter_map(|m| m.streams).collect();
                used.sort_unstable();
                used.dedup();
                used
            },
            ramp_s: Summary::of(&ok.iter().filter_map(|m| m.ramp_seconds).collect::<Vec<_>>())
                .map(|s| s.median),
        });
    }
    Report {
        command: head.command,
        experiment: head.experiment,
        duration: head.duration,
        size: head.size,
        files: head.files,
        repeats: head.repeats,
        interrupted: head.interrupted,
        idle,
        setup_seconds,
        links: BTreeMap::new(),
        paths: BTreeMap::new(),
        loopback_ports: None,
        correlations: correlations(records),
        cells: out,
    }
}

/// Pearson's r of throughput with each numeric parameter that varies, per scenario and
/// tool (throughputs of different links are not comparable). Runs where the parameter has no
/// number (auto streams, the default buffer or block) are left out of that parameter's r.
pub fn correlations(records: &[Record]) -> Vec<Correlation> {
    type Param = (&'static str, fn(&Cell) -> Option<f64>);
    let params: [Param; 4] = [
        ("streams", |c| match c.streams {
            Streams::Fixed(n) => Some(f64::from(n)),
            Streams::Auto => None,
        }),
        ("buffer", |c| c.buffer.map(|b| b as f64)),
        ("block", |c| c.block.map(|b| b as f64)),
        ("direction", |c| {
            Some(match c.direction {
                Direction::Get => 0.0,
                Direction::Put => 1.0,
            })
        }),
    ];
    let mut groups: BTreeMap<(String, &'static str), Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.measured.error.is_none()) {
        groups
            .entry((r.cell.scenario.clone(), r.cell.tool.name()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((scenario, _), runs) in groups {
        for (name, value) in params {
            let (xs, ys): (Vec<f64>, Vec<f64>) = runs
                .iter()
                .filter_map(|r| Some((value(&r.cell)?, r.measured.bytes_per_second)))
                .unzip();
            // Two points always lie on a line: r needs three runs to say anything.
            if xs.len() < 3 {
                continue;
            }
            if let Some(r) = pearson(&xs, &ys) {
                out.push(Correlation {
                    scenario: scenario.clone(),
                    tool: runs[0].cell.tool,
                    parameter: name,
                    runs: xs.len(),
                    r,
                });
            }
        }
    }
    out
}

pub(super) fn size_label(b: Option<u64>) -> String {
    match b {
        None => "default".into(),
        Some(b) if b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        Some(b) if b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        Some(b) => b.to_string(),
    }
}

/// The reference a run is measured against when the sweep has it: iperf3 with one stream in
/// the same direction (plain TCP, memory to memory), in the same scenario and run.
fn is_reference(c: &CellReport, direction: super::grid::Direction) -> bool {
    c.cell.tool == Tool::Iperf3
        && c.cell.streams == super::grid::Streams::Fixed(1)
        && c.cell.direction == direction
        && c.cell.buffer.is_none()
}

/// Each cell's median rate and CPU per GiB over the reference's (see [`is_reference`]), one
/// table per direction that has one; empty without.
fn against_reference(cells: &[&CellReport]) -> String {
    let mut s = String::new();
    for direction in [super::grid::Direction::Get, super::grid::Direction::Put] {
        let Some(reference) = cells.iter().find(|c| is_reference(c, direction)) else {
            continue;
        };
        let (Some(rate), cpu) = (
            reference.mbit_s.as_ref().map(|m| m.median),
            reference.cpu_s_per_gib,
        ) else {
            continue;
        };
        let _ = writeln!(
            s,
            "\n{} against iperf3 with one stream in the same run ({rate:.0} Mbit/s{}):\n\n\
             | tool | streams | Mbit/s | x iperf3 | CPU s/GiB | x iperf3 |\n|---|---|---|---|---|---|",
            direction.name(),
            cpu.map_or(String::new(), |c| format!(", {c:.3} CPU s/GiB"))
        );
        for c in cells.iter().filter(|c| c.cell.direction == direction) {
            let median = c.mbit_s.as_ref().map(|m| m.median);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                c.cell.tool_label(),
                c.cell.streams.label(),
                opt(median, 0),
                opt(median.map(|m| m / rate), 2),
                opt(c.cpu_s_per_gib, 3),
                opt(c.cpu_s_per_gib.zip(cpu).map(|(a, b)| a / b), 2),
            );
        }
    }
    s
}

/// A tree run's cells against braid's fastest in the same direction: median seconds, files
/// a second, and each tool's time over braid's (above 1: braid is faster); then each one's
/// whole command, start-up included (what `rsync -e ssh` and `braid cp` spend on ssh, which
/// the seconds leave out for the one and not the other); empty without a braid cell.
fn trees_against_braid(cells: &[&CellReport], files: u64) -> String {
    let mut s = String::new();
    let seconds = |c: &CellReport| c.seconds.as_ref().map(|m| m.median);
    let wall = |c: &CellReport| c.wall_seconds.as_ref().map(|m| m.median);
    for direction in [super::grid::Direction::Get, super::grid::Direction::Put] {
        let here: Vec<&&CellReport> = cells
            .iter()
            .filter(|c| c.cell.direction == direction)
            .collect();
        let Some(reference) = here
            .iter()
            .filter(|c| c.cell.tool == Tool::Braid)
            .filter_map(|c| seconds(c))
            .reduce(f64::min)
        else {
            continue;
        };
        let _ = writeln!(
            s,
            "\n{} against braid's fastest in the same run ({reference:.2} s):\n\n\
             | tool | streams | seconds | files/s | x braid's time | whole command s | x braid's |\n\
             |---|---|---|---|---|---|---|",
            direction.name(),
        );
        let whole = here
            .iter()
            .filter(|c| c.cell.tool == Tool::Braid)
            .filter_map(|c| wall(c))
            .reduce(f64::min);
        for c in here {
            let secs = seconds(c);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                c.cell.tool_label(),
                c.cell.streams.label(),
                opt(secs, 2),
                opt(secs.map(|t| files as f64 / t), 0),
                opt(secs.map(|t| t / reference), 2),
                opt(wall(c), 2),
                opt(wall(c).zip(whole).map(|(t, w)| t / w), 2),
            );
        }
    }
    s
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// One run as a CSV row: the field names are the header, and the csv crate quotes what needs
/// it (an error message with commas or line breaks stays whole).
#[derive(Serialize)]
struct CsvRow<'a> {
    scenario: &'a str,
    tool: String,
    direction: &'static str,
    streams: String,
    buffer: Option<u64>,
    block: Option<u64>,
    repeat: u32,
    started_s: String,
    bytes: u64,
    seconds: String,
    mbit_s: String,
    streams_used: Option<u32>,
    retransmits: Option<u64>,
    ping_p50_ms: Option<String>,
    ping_p95_ms: Option<String>,
    cpu_s: Option<String>,
    error: &'a str,
}

/// One row per run.
pub fn csv(records: &[Record]) -> String {
    let mut w = ::csv::Writer::from_writer(Vec::new());
    for r in records {
        let (c, m) = (&r.cell, &r.measured);
        let lat = Latency::of(&m.ping.iter().map(|p| p.1).collect::<Vec<_>>());
        let row = CsvRow {
            scenario: &c.scenario,
            tool: c.tool_label(),
            direction: c.direction.name(),
            streams: c.streams.label(),
            buffer: c.buffer,
            block: c.block,
            repeat: r.run.repeat,
            started_s: format!("{:.3}", r.started),
            bytes: m.bytes,
            seconds: format!("{:.4}", m.seconds),
            mbit_s: format!("{:.4}", mbit(m.bytes_per_second)),
            streams_used: m.streams,
            retransmits: m.retransmits,
            ping_p50_ms: lat.as_ref().map(|l| format!("{:.2}", l.p50_ms)),
            ping_p95_ms: lat.as_ref().map(|l| format!("{:.2}", l.p95_ms)),
            cpu_s: m.cpu_seconds.map(|c| format!("{c:.3}")),
            error: m.error.as_deref().unwrap_or(""),
        };
        if let Err(e) = w.serialize(row) {
            tracing::warn!("a CSV row could not be written: {e}");
        }
    }
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The report as Markdown; `comparison`: the seed's numbers beside braid's, for an experiment
/// (see `experiments::compare`).
pub fn markdown(r: &Report, plots: &[String], comparison: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# braid bench\n\n`{}`\n", r.command);
    let _ = writeln!(
        s,
        "{} per run, {} repeat(s) per cell, cells shuffled within each round.{}\n",
        match (r.duration, r.files) {
            (Some(d), _) => format!("A payload of about {d} s at each link's payload rate"),
            (None, Some(n)) => format!("A tree of {n} files of {} bytes", r.size),
            (None, None) => format!("{} bytes", r.size),
        },
        r.repeats,
        if r.interrupted {
            " **Interrupted: these are the runs made before Ctrl-C.**"
        } else {
            ""
        }
    );
    let scenarios: Vec<&String> = {
        let mut v: Vec<&String> = r.cells.iter().map(|c| &c.cell.scenario).collect();
        v.dedup();
        v
    };
    for sc in scenarios {
        let _ = writeln!(s, "## {sc}\n");
        if let Some(l) = r.idle.get(sc) {
            let _ = writeln!(
                s,
                "Idle link: ping p50 {:.1} ms, p95 {:.1} ms ({} samples).\n",
                l.p50_ms, l.p95_ms, l.samples
            );
        }
        if let Some(p) = r.paths.get(sc) {
            let rate =
                |b: Option<f64>| b.map_or("unlimited".into(), |b| format!("{:.3} Mbit/s", b / 1e6));
            let _ = writeln!(
                s,
                "Configured: MTU {}, a ping's RTT {:.1} ms, payload rate up {}, down {}.\n",
                p.mtu,
                p.ping_rtt_ms,
                rate(p.up_payload_bps),
                rate(p.down_payload_bps)
            );
        }
        if let Some(link) = r.links.get(sc) {
            let side = |d: &str| {
                let c = &link[d];
                format!(
                    "{d}: {} queue drops, {} lost, {} device drops, longest queueing {:.0} ms",
                    c["queue_drops"],
                    c["lost"],
                    c["device_drops"],
                    c["max_queue_delay_us"].as_f64().unwrap_or(0.0) / 1000.0
                )
            };
            let _ = writeln!(
                s,
                "Link over all runs: {}; {} (device drops: packets the relay was too slow to \
                 read, which make a run untrustworthy).\n",
                side("up"),
                side("down")
            );
        }
        let setups: Vec<String> = r
            .setup_seconds
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(sc.as_str())?.trim();
                Some(format!("{rest} {v:.2} s"))
            })
            .collect();
        if !setups.is_empty() {
            let _ = writeln!(
                s,
                "Timed by the clock less their time for a 1-byte file: {}.\n",
                setups.join(", ")
            );
        }
        s.push_str("| tool | dir | streams (used) | buffer | block | n | min | median | mean | max | std | model (binding) | model error | ping p50 / p95 ms (+ over idle) | sender limit | retransmits | CPU s/GiB | to 90 % s |\n");
        s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let here: Vec<&CellReport> = r.cells.iter().filter(|c| &c.cell.scenario == sc).collect();
        for c in &here {
            let st = c.mbit_s.as_ref();
            let _ = writeln!(
                s,
                "| {} | {} | {}{} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.cell.tool_label(),
                c.cell.direction.name(),
                c.cell.streams.label(),
                match &c.streams_used[..] {
                    [] => String::new(),
                    [n] if c.cell.streams == super::grid::Streams::Fixed(*n) => String::new(),
                    used => format!(
                        " ({})",
                        used.iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
                size_label(c.cell.buffer),
                size_label(c.cell.block),
                st.map_or(0, |s| s.count),
                if c.failures > 0 {
                    format!(" ({} failed)", c.failures)
                } else {
                    String::new()
                },
                opt(st.map(|s| s.min), 3),
                opt(st.map(|s| s.median), 3),
                opt(st.map(|s| s.mean), 3),
                opt(st.map(|s| s.max), 3),
                opt(st.map(|s| s.std), 3),
                c.model.as_ref().map_or("-".into(), |m| format!(
                    "{:.3} ({})",
                    m.predicted_mbit_s,
                    m.binding.name()
                )),
                opt(c.model.as_ref().and_then(|m| m.error_percent), 1)
                    + if c.model.as_ref().and_then(|m| m.error_percent).is_some() {
                        "%"
                    } else {
                        ""
                    },
                c.ping.as_ref().map_or("-".into(), |p| format!(
                    "{:.1} / {:.1} ({} / {})",
                    p.p50_ms,
                    p.p95_ms,
                    c.inflation_p50_ms
                        .map_or("-".into(), |v| format!("{v:+.1}")),
                    c.inflation_p95_ms
                        .map_or("-".into(), |v| format!("{v:+.1}"))
                )),
                c.kernel_limit.as_deref().unwrap_or("-"),
                opt(c.retransmits_median, 0),
                opt(c.cpu_s_per_gib, 3),
                opt(c.ramp_s, 0),
            );
        }
        s.push_str(&against_reference(&here));
        if let Some(files) = r.files {
            s.push_str(&trees_against_braid(&here, files));
        }
        let corr: Vec<&Correlation> = r
            .correlations
            .iter()
            .filter(|c| &c.scenario == sc)
            .collect();
        if !corr.is_empty() {
            s.push_str("\nCorrelation of throughput with each parameter (Pearson's r over the runs):\n\n| tool | parameter | runs | r |\n|---|---|---|---|\n");
            for c in corr {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.3} |",
                    c.tool.name(),
                    c.parameter,
                    c.runs,
                    c.r
                );
            }
        }
        s.push('\n');
    }
    let errors: Vec<String> = r
        .cells
        .iter()
        .flat_map(|c| {
            c.errors.iter().map(move |e| {
                format!(
                    "- {} {} -n {}: {e}",
                    c.cell.scenario,
                    c.cell.tool_label(),
                    c.cell.streams.label()
                )
            })
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "## Failed runs\n\n{}\n", errors.join("\n"));
    }
    if !plots.is_empty() {
        s.push_str("## Plots\n\n");
        for p in plots {
            let _ = writeln!(s, "- [{p}]({p})");
        }
    }
    s.push_str(comparison);
    s.push_str("\nThroughput is TCP payload in Mbit/s (10^6 bit/s). The model is `braid model` for the cell's link, streams and buffer; its error is the measured median against the prediction.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(streams: u32, buffer: Option<u64>, rate: f64, repeat: u32) -> Record {
        Record {
            run: Run {
                cell: (streams as usize) * 10 + buffer.map_or(0, |_| 1),
                repeat,
            },
            cell: Cell {
                scenario: "s".into(),
                tool: Tool::Braid,
                direction: Direction::Get,
                streams: Streams::Fixed(streams),
                buffer,
                block: None,
                nice: false,
                background: false,
                compress: None,
                kermit: None,
            },
            started: 0.0,
            measured: Measured {
                bytes: 1000,
                seconds: 1.0,
                bytes_per_second: rate,
                ..Measured::default()
            },
        }
    }

    #[test]
    fn correlation_uses_only_numeric_values_that_vary() {
        let recs = vec![
            record(1, None, 100.0, 0),
            record(2, None, 200.0, 0),
            record(4, None, 390.0, 0),
            record(4, Some(65536), 350.0, 0),
        ];
        let c = correlations(&recs);
        // streams varies (4 runs); buffer has one numeric value (left out); block none;
        // direction does not vary.
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].parameter, c[0].runs), ("streams", 4));
        let xs = [1.0, 2.0, 4.0, 4.0];
        let ys = [100.0, 200.0, 390.0, 350.0];
        assert_eq!(c[0].r, pearson(&xs, &ys).unwrap());
        assert!(c[0].r > 0.9);
    }

    #[test]
    fn csv_has_a_row_per_run_and_keeps_errors_whole() {
        let mut bad = record(1, None, 0.0, 1);
        bad.measured.error = Some("failed, badly\nreally".into());
        let text = csv(&[record(1, None, 125_000.0, 0), bad]);
        let mut r = ::csv::Reader::from_reader(text.as_bytes());
        let header = r.headers().unwrap().clone();
        let rows: Vec<::csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|row| row.len() == header.len()));
        let col = |name: &str| header.iter().position(|h| h == name).unwrap();
        assert_eq!(&rows[0][col("mbit_s")], "1.0000");
        assert_eq!(&rows[1][col("error")], "failed, badly\nreally");
        assert_eq!(&rows[0][col("error")], "");
    }

    /// A cell of `tool` with `streams` and nothing measured.
    fn cell_report(tool: Tool, streams: u32) -> CellReport {
        CellReport {
            cell: Cell {
                tool,
                streams: Streams::Fixed(streams),
                ..record(1, None, 0.0, 0).cell
            },
            mbit_s: None,
            seconds: None,
            wall_seconds: None,
            failures: 0,
            errors: Vec::new(),
            ping: None,
            inflation_p50_ms: None,
            inflation_p95_ms: None,
            model: None,
            kernel_limit: None,
            retransmits_median: None,
            cpu_s_per_gib: None,
            streams_used: Vec::new(),
            ramp_s: None,
        }
    }

    fn summary(v: f64) -> crate::bench::stats::Summary {
        crate::bench::stats::Summary {
            count: 3,
            min: v,
            median: v,
            mean: v,
            max: v,
            std: 0.0,
        }
    }

    #[test]
    fn each_cell_is_set_against_iperf3s_one_stream_where_the_run_has_it() {
        let cell = |tool, streams, mbit: f64, cpu: f64| CellReport {
            mbit_s: Some(summary(mbit)),
            cpu_s_per_gib: Some(cpu),
            ..cell_report(tool, streams)
        };
        let reference = cell(Tool::Iperf3, 1, 1000.0, 0.5);
        let braid = cell(Tool::Braid, 4, 900.0, 0.6);
        let table = against_reference(&[&braid, &reference]);
        assert!(
            table.contains(
                "get against iperf3 with one stream in the same run (1000 Mbit/s, 0.500 CPU s/GiB)"
            ),
            "{table}"
        );
        assert!(
            table.contains("| braid | 4 | 900 | 0.90 | 0.600 | 1.20 |"),
            "{table}"
        );
        // Without the reference there is nothing to set against.
        let wider = cell(Tool::Iperf3, 4, 1000.0, 0.5);
        assert_eq!(against_reference(&[&braid, &wider]), "");
    }

    #[test]
    fn a_tree_run_sets_each_tool_against_braids_fastest_time() {
        let cell = |tool, streams, secs: f64| CellReport {
            seconds: Some(summary(secs)),
            wall_seconds: Some(summary(secs + 0.25)),
            ..cell_report(tool, streams)
        };
        let (slow, fast) = (cell(Tool::Braid, 1, 2.0), cell(Tool::Braid, 4, 0.5));
        let lftp = cell(Tool::Lftp, 1, 1.5);
        let table = trees_against_braid(&[&slow, &lftp, &fast], 1000);
        assert!(
            table.contains("against braid's fastest in the same run (0.50 s)"),
            "{table}"
        );
        assert!(
            table.contains("| lftp | 1 | 1.50 | 667 | 3.00 | 1.75 | 2.33 |"),
            "{table}"
        );
        assert!(
            table.contains("| braid | 4 | 0.50 | 2000 | 1.00 | 0.75 | 1.00 |"),
            "{table}"
        );
        assert_eq!(trees_against_braid(&[&lftp], 1000), "");
    }
}
