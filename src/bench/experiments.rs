//! The seeds' experiments on the lab, each as one command (`braid bench --experiment NAME`):
//! the grid that reproduces a document's table or figure, and that document's numbers printed
//! beside braid's.

use super::grid::{Direction, Streams, Tool};
use super::report::{CellReport, Record, Report};
use super::stats::{Summary, pearson};
use crate::model::limits::Congestion;
use std::fmt::Write as _;

pub const NAMES: [&str; 4] = ["xftp", "bbftp", "kermit", "nice"];

/// The sweep an experiment runs.
pub struct Plan {
    pub scenario: &'static str,
    pub rate: Option<&'static str>,
    pub delay: Option<&'static str>,
    pub loss: Option<&'static str>,
    pub streams: Vec<Streams>,
    pub buffers: Vec<Option<u64>>,
    pub directions: Vec<Direction>,
    pub tools: Vec<Tool>,
    pub nice: Vec<bool>,
    /// braid without and with --background.
    pub background: Vec<bool>,
    pub size: u64,
    pub congestion: Option<Congestion>,
    pub kermit: Option<KermitSweep>,
}

/// Kermit's window and packet lengths, each with streaming on and off.
pub struct KermitSweep {
    pub windows: Vec<u32>,
    pub packets: Vec<u32>,
}

pub fn plan(name: &str) -> Option<Plan> {
    let n = |v: &[u32]| v.iter().map(|&n| Streams::Fixed(n)).collect();
    let both = vec![Direction::Get, Direction::Put];
    Some(match name {
        // XFTP (seed 002): the NASA ACTS T1, 590 ms, 24 KB windows (a 20 kB buffer: Linux
        // advertises 1.2 times it), 5 MB files, throughput against connections.
        "xftp" => Plan {
            scenario: "satellite-t1",
            rate: None,
            delay: None,
            loss: None,
            streams: n(&[1, 2, 4, 8, 16]),
            buffers: vec![Some(20_000)],
            directions: both,
            tools: vec![Tool::Braid, Tool::Iperf3],
            nice: vec![false],
            background: vec![false],
            size: 5_000_000,
            congestion: None,
            kermit: None,
        },
        // bbftp at SLAC (seed 004): 1, 10 and 20 streams × 64 KB and 256 KB windows, both
        // directions, on a transatlantic path: 160 ms, with loss that holds one Reno stream
        // near the paper's 3.2 Mbit/s.
        "bbftp" => Plan {
            scenario: "lan-100m",
            rate: None,
            delay: Some("80ms"),
            loss: Some("1e-3"),
            streams: n(&[1, 10, 20]),
            buffers: vec![Some(64 << 10), Some(256 << 10)],
            directions: both,
            tools: vec![Tool::Braid, Tool::Iperf3],
            nice: vec![false],
            background: vec![false],
            size: 10_000_000,
            congestion: Some(Congestion::Reno),
            kermit: None,
        },
        // "Why the nice solution may not be so nice" (seed 000): ping during a download and an
        // upload on a slow link with a deep queue, with the client at nice 0 and 19; plain
        // transfers with cubic (the seed's ftp was a loss-driven TCP), curl against vsftpd as
        // today's ftp, and braid's answer, --background.
        "nice" => Plan {
            scenario: "dsl-1m-bloat",
            rate: None,
            delay: None,
            loss: None,
            streams: n(&[1, 4]),
            buffers: vec![None],
            directions: both,
            tools: vec![Tool::Braid, Tool::Iperf3, Tool::Curl],
            nice: vec![false, true],
            background: vec![false, true],
            size: 2_000_000,
            congestion: Some(Congestion::Cubic),
            kermit: None,
        },
        // Kermit streaming (seed 003), its trial 2: a long-distance path of 69 ms and about
        // 2 Mbit/s, a 1 MB file, window × packet length × streaming, with FTP beside it.
        "kermit" => Plan {
            scenario: "lan-100m",
            rate: Some("2.5mbit"),
            delay: Some("35ms"),
            loss: None,
            streams: n(&[1]),
            buffers: vec![None],
            directions: vec![Direction::Get],
            tools: vec![Tool::Kermit, Tool::Curl, Tool::Braid],
            nice: vec![false],
            background: vec![false],
            size: 1_000_000,
            congestion: None,
            kermit: Some(KermitSweep {
                windows: vec![1, 4, 15, 31],
                packets: vec![1450, 4350, 8700],
            }),
        },
        _ => return None,
    })
}

fn cell(
    r: &Report,
    tool: Tool,
    dir: Direction,
    streams: u32,
    buffer: Option<u64>,
    nice: bool,
) -> Option<&CellReport> {
    r.cells.iter().find(|c| {
        c.cell.tool == tool
            && c.cell.direction == dir
            && c.cell.streams == Streams::Fixed(streams)
            && c.cell.buffer == buffer
            && c.cell.nice == nice
            && !c.cell.background
    })
}

fn mean_std(c: Option<&CellReport>) -> String {
    c.and_then(|c| c.mbit_s.as_ref())
        .map_or("-".into(), |s| format!("{:.2} ± {:.2}", s.mean, s.std))
}

/// The seed's numbers beside braid's, as Markdown.
pub fn compare(name: &str, r: &Report, records: &[Record]) -> String {
    let mut s = String::new();
    match name {
        "xftp" => {
            s.push_str("## XFTP (seed 002) beside braid\n\nThe paper: NASA ACTS T1 (1.536 Mbit/s), 590 ms RTT, 24 KB windows, 5 MB files. Throughput grew nearly linearly up to 4 connections (\"the effective window\": connections × window), and 8 connections reached 91 % of the T1.\n\n");
            s.push_str("| streams | braid get | braid put | iperf3 get | iperf3 put | model (braid) | XFTP paper |\n|---|---|---|---|---|---|---|\n");
            for n in [1, 2, 4, 8, 16] {
                let pct = |tool, dir| {
                    cell(r, tool, dir, n, Some(20_000), false)
                        .and_then(|c| c.mbit_s.as_ref())
                        .map_or("-".into(), |m| format!("{:.0} %", m.median / 1.536 * 100.0))
                };
                let model = cell(r, Tool::Braid, Direction::Get, n, Some(20_000), false)
                    .and_then(|c| c.model.as_ref())
                    .map_or("-".into(), |m| {
                        format!("{:.0} %", m.predicted_mbit_s / 1.536 * 100.0)
                    });
                let _ = writeln!(
                    s,
                    "| {n} | {} | {} | {} | {} | {model} | {} |",
                    pct(Tool::Braid, Direction::Get),
                    pct(Tool::Braid, Direction::Put),
                    pct(Tool::Iperf3, Direction::Get),
                    pct(Tool::Iperf3, Direction::Put),
                    if n == 8 { "91 %" } else { "-" }
                );
            }
            s.push_str("\nPercent of the T1's 1.536 Mbit/s (median payload rate).\n");
        }
        "bbftp" => {
            s.push_str("## bbftp at SLAC (seed 004) beside braid\n\nThe paper: Stanford ↔ Daresbury (UK) over Internet2, bbftp, mean ± std in Mbit/s. Here: a 100 Mbit/s lab path with 160 ms RTT and 1e-3 loss, Reno, braid get (from the far side, as UK to Stanford) and put.\n\n");
            s.push_str("| streams | braid put 256 KB | braid put 64 KB | braid get 256 KB | braid get 64 KB | paper Stanford→UK 256 KB | 64 KB | paper UK→Stanford 256 KB | 64 KB |\n|---|---|---|---|---|---|---|---|---|\n");
            let paper = [
                (
                    1,
                    ["3.23 ± 0.08", "3.23 ± 0.07", "3.29 ± 0.006", "3.31 ± 0.16"],
                ),
                (
                    10,
                    [
                        "17.11 ± 4.21",
                        "15.23 ± 5.24",
                        "20.92 ± 5.14",
                        "19.46 ± 5.7",
                    ],
                ),
                (
                    20,
                    [
                        "19.57 ± 1.46",
                        "16.54 ± 2.57",
                        "22.58 ± 2.39",
                        "18.93 ± 4.16",
                    ],
                ),
            ];
            for (n, p) in paper {
                let b =
                    |dir, kb: u64| mean_std(cell(r, Tool::Braid, dir, n, Some(kb << 10), false));
                let _ = writeln!(
                    s,
                    "| {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    b(Direction::Put, 256),
                    b(Direction::Put, 64),
                    b(Direction::Get, 256),
                    b(Direction::Get, 64),
                    p[0],
                    p[1],
                    p[2],
                    p[3]
                );
            }
        }
        "kermit" => kermit(&mut s, records),
        "nice" => {
            s.push_str("## The nice study (seed 000) beside braid\n\nThe paper: over a 14.4 kbit/s modem, ping rose from about 210 ms to about 12 s during an ftp or http download, and `nice` on the client or the server changed nothing. Here: dsl-1m-bloat (1 Mbit/s, 1 s of drop-tail queue), ping every 200 ms during each run, the client at nice 0 and at nice 19. braid and iperf3 send with cubic; curl and vsftpd with the system's congestion control; braid --background with its own choice (bbr on this path). The last rows are braid --background, which yields by protocol instead.\n\n");
            let idle = r.idle.get("dsl-1m-bloat");
            if let Some(i) = idle {
                let _ = writeln!(
                    s,
                    "Idle: ping p50 {:.1} ms, p95 {:.1} ms.\n",
                    i.p50_ms, i.p95_ms
                );
            }
            s.push_str("| tool | direction | streams | ping p50 / p95 ms, nice 0 | nice 19 | Mbit/s nice 0 | nice 19 |\n|---|---|---|---|---|---|---|\n");
            let ping = |c: Option<&CellReport>| {
                c.and_then(|c| c.ping.as_ref())
                    .map_or("-".into(), |p| format!("{:.0} / {:.0}", p.p50_ms, p.p95_ms))
            };
            let rate = |c: Option<&CellReport>| {
                c.and_then(|c| c.mbit_s.as_ref())
                    .map_or("-".into(), |m| format!("{:.3}", m.median))
            };
            for tool in [Tool::Braid, Tool::Iperf3, Tool::Curl] {
                for dir in [Direction::Get, Direction::Put] {
                    for n in [1, 4] {
                        let pick = |nice| cell(r, tool, dir, n, None, nice);
                        if pick(false).is_none() && pick(true).is_none() {
                            continue;
                        }
                        let _ = writeln!(
                            s,
                            "| {} | {} | {n} | {} | {} | {} | {} |",
                            tool.name(),
                            dir.name(),
                            ping(pick(false)),
                            ping(pick(true)),
                            rate(pick(false)),
                            rate(pick(true))
                        );
                    }
                }
            }
            // What braid offers instead of nice: the protocol yields (issue 15).
            for dir in [Direction::Get, Direction::Put] {
                for n in [1, 4] {
                    let pick = |nice| {
                        r.cells.iter().find(|c| {
                            c.cell.tool == Tool::Braid
                                && c.cell.background
                                && c.cell.direction == dir
                                && c.cell.streams == Streams::Fixed(n)
                                && c.cell.nice == nice
                        })
                    };
                    let _ = writeln!(
                        s,
                        "| braid --background | {} | {n} | {} | {} | {} | {} |",
                        dir.name(),
                        ping(pick(false)),
                        ping(pick(true)),
                        rate(pick(false)),
                        rate(pick(true))
                    );
                }
            }
        }
        _ => {}
    }
    s
}

/// Seed 003's trial 2 table: CPS over all runs with streaming on and off and for FTP, and
/// the correlation of CPS with the window, the packet length and their product.
fn kermit(s: &mut String, records: &[Record]) {
    s.push_str("## Kermit streaming (seed 003, trial 2) beside braid\n\nThe paper: NYC to Utah State, socket to socket, 69 ms RTT, a 1 MB file; window 1-31 × packet length 4350-8700, streaming on and off; FTP in the same hours. Here: a 2.5 Mbit/s lab path with 70 ms RTT. CPS is bytes per second.\n\n");
    let ok = |r: &&Record| r.measured.error.is_none();
    let cps =
        |rs: &[&Record]| -> Vec<f64> { rs.iter().map(|r| r.measured.bytes_per_second).collect() };
    let group = |streaming: bool| -> Vec<&Record> {
        records
            .iter()
            .filter(ok)
            .filter(|r| r.cell.kermit.is_some_and(|k| k.streaming == streaming))
            .collect()
    };
    let (on, off) = (group(true), group(false));
    let ftp: Vec<&Record> = records
        .iter()
        .filter(ok)
        .filter(|r| r.cell.tool == Tool::Curl)
        .collect();
    let braid: Vec<&Record> = records
        .iter()
        .filter(ok)
        .filter(|r| r.cell.tool == Tool::Braid)
        .collect();
    let stats: Vec<Option<Summary>> = [&on, &off, &ftp, &braid]
        .iter()
        .map(|g| Summary::of(&cps(g)))
        .collect();
    s.push_str("| CPS | streaming | nonstreaming | FTP (curl) | braid | paper: streaming | nonstreaming | FTP |\n|---|---|---|---|---|---|---|---|\n");
    let paper = [
        ("Max", ["262144", "262144", "130000"]),
        ("Min", ["52428", "6026", "50000"]),
        ("Mean", ["164585", "124784", "74200"]),
        ("Median", ["149796", "123790", "56000"]),
        ("Std Dev", ["56181", "70618", "29200"]),
    ];
    for (i, (label, p)) in paper.iter().enumerate() {
        let cell = |st: &Option<Summary>| {
            st.as_ref().map_or("-".into(), |st| {
                let v = [st.max, st.min, st.mean, st.median, st.std][i];
                format!("{v:.0}")
            })
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&stats[0]),
            cell(&stats[1]),
            cell(&stats[2]),
            cell(&stats[3]),
            p[0],
            p[1],
            p[2]
        );
    }
    let corr = |g: &[&Record], f: fn(&super::grid::Kermit) -> f64| {
        let (xs, ys): (Vec<f64>, Vec<f64>) = g
            .iter()
            .filter_map(|r| Some((f(&r.cell.kermit?), r.measured.bytes_per_second)))
            .unzip();
        pearson(&xs, &ys).map_or("-".into(), |r| format!("{r:.2}"))
    };
    s.push_str("\n| correlation of CPS with | streaming | nonstreaming | paper: streaming | nonstreaming |\n|---|---|---|---|---|\n");
    type Row = (
        &'static str,
        fn(&super::grid::Kermit) -> f64,
        [&'static str; 2],
    );
    let rows: [Row; 3] = [
        ("window size (W)", |k| f64::from(k.window), ["0.34", "0.57"]),
        (
            "packet length (P)",
            |k| f64::from(k.packet),
            ["-0.05", "0.44"],
        ),
        (
            "W × P",
            |k| f64::from(k.window) * f64::from(k.packet),
            ["0.16", "0.69"],
        ),
    ];
    for (label, f, p) in rows {
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} |",
            corr(&on, f),
            corr(&off, f),
            p[0],
            p[1]
        );
    }
    let both: Vec<&Record> = on.iter().chain(off.iter()).copied().collect();
    let (xs, ys): (Vec<f64>, Vec<f64>) = both
        .iter()
        .filter_map(|r| {
            Some((
                if r.cell.kermit?.streaming { 1.0 } else { 0.0 },
                r.measured.bytes_per_second,
            ))
        })
        .unzip();
    let _ = writeln!(
        s,
        "\nCorrelation of CPS with streaming (0 or 1): {} (the paper: 0.30).",
        pearson(&xs, &ys).map_or("-".into(), |r| format!("{r:.2}"))
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_a_plan_that_its_tools_can_run() {
        for name in NAMES {
            let p = plan(name).unwrap();
            assert!(crate::lab::scenario::find(p.scenario).is_ok(), "{name}");
            // Every tool runs in every direction, with some of the counts and buffers (the
            // grid leaves out what a tool cannot do: curl has one connection).
            for t in &p.tools {
                for d in &p.directions {
                    let runs = p
                        .streams
                        .iter()
                        .any(|s| p.buffers.iter().any(|b| t.supports(*d, *s, *b, None)));
                    assert!(runs, "{name}: {t:?} {d:?}");
                }
            }
        }
        assert!(plan("zmodem").is_none());
    }
}
