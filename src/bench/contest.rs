//! `braid bench --experiment background`: background mode while other traffic comes and goes,
//! on dsl-1m-bloat (1 Mbit/s, a second of drop-tail queue), in each direction `--direction`
//! names (downloads and uploads by default):
//! - **competitor**: a `--background` transfer runs alone, a cubic iperf3 flow the same way
//!   joins for 15 s and leaves. How soon iperf3 gets 90 % of what it gets alone, what braid
//!   keeps meanwhile, and how soon braid is back at 90 % of its rate before;
//! - **pair**: two `--background` transfers, the second 15 s after the first: their shares
//!   while both run (Jain's fairness index);
//! - **server** (downloads): curl downloads from `braid serve --background` (the server
//!   yields by itself, in stream mode);
//! - ping all along: its rise over the idle link while braid runs alone.
//!
//! Rates come from each program's own report: braid's `--json` timeline (the kernel's
//! received bytes each second) and iperf3's half-second intervals.

use super::BenchArgs;
use super::grid::{Direction, Tool};
use super::parse::parse_ping_line;
use super::report::Latency;
use super::servers::{self, Place, Ports, SERVER};
use crate::lab::{BothWays, LinkSpec, Running};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NAME: &str = "background";
const SCENARIO: &str = "dsl-1m-bloat";
/// When the second flow starts, and how long iperf3 runs.
const JOIN: f64 = 15.0;
const COMPETE: f64 = 15.0;
/// Each braid download: about 35 s alone on the link.
const FILE: u64 = 4_000_000;
/// Where `braid serve --background` listens in the lab.
const BACKGROUND_PORT: u16 = 2123;

/// One repeat's numbers in one direction.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// Which repeat, from 1.
    pub round: u32,
    pub direction: Direction,
    /// Ping's rise over the idle link while braid ran alone, ms.
    pub ping_up_p50_ms: Option<f64>,
    pub ping_up_p95_ms: Option<f64>,
    /// braid --background alone, bytes/s, and against the payload rate of the link.
    pub alone: Option<f64>,
    /// iperf3 alone, bytes/s.
    pub iperf3_alone: Option<f64>,
    /// Seconds from iperf3's start to its first half second at 90 % of its rate alone, with
    /// braid running and alone.
    pub iperf3_to_90: Option<f64>,
    pub iperf3_to_90_alone: Option<f64>,
    /// iperf3's mean rate from 2 s after it joined, against its rate alone.
    pub iperf3_share: Option<f64>,
    /// braid's rate while iperf3 ran, against its rate alone.
    pub braid_kept: Option<f64>,
    /// Seconds from iperf3's end to braid's first second at 90 % of its rate alone.
    pub braid_back_90: Option<f64>,
    /// Seconds from iperf3's end to the first ping after it within 50 ms of the idle link's
    /// median: iperf3's sender goes on emptying its socket into the queue for seconds after
    /// its report ends, and until that queue drains nobody's packets get through faster.
    pub iperf3_drained: Option<f64>,
    /// Seconds from then to braid's first second at 90 % of its rate alone.
    pub braid_back_90_drained: Option<f64>,
    /// The pair's mean rates while both ran (bytes/s, first and second) and Jain's index.
    pub pair: Option<(f64, f64)>,
    pub jain: Option<f64>,
    /// curl from `serve --background` (downloads only): ping's rise (ms) and curl's rate
    /// (bytes/s).
    pub server_ping_up_p50_ms: Option<f64>,
    pub server_ping_up_p95_ms: Option<f64>,
    pub server_rate: Option<f64>,
    /// The competitor run's rates over time, seconds since braid started: braid's each
    /// second, iperf3's each half second.
    pub braid_series: Vec<(f64, f64)>,
    pub iperf3_series: Vec<(f64, f64)>,
    /// The controller's trace in that run (braid's `--json` `background`): what it saw and
    /// the rate it set each second, to tell a slow comeback's cause.
    pub braid_controller: serde_json::Value,
    /// Every ping of that run, (seconds since braid started, ms): what the queue really was.
    pub ping_series: Vec<(f64, f64)>,
}

pub fn run(args: &BenchArgs) -> Result<u8> {
    let spec = LinkSpec::scenario_with(SCENARIO, &BothWays::default())?;
    let payload =
        crate::model::limits::payload_rate(spec.down.rate.unwrap_or(0) as f64, f64::from(spec.mtu));
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let tmp = super::work_dir()?;
    let root = tmp.path().join("root");
    std::fs::create_dir(&root)?;
    super::make_file(&root.join("bg.bin"), FILE)?;
    let braid = super::runnable_copy(tmp.path())?;
    let lab = Running::up(&args.name, spec, args.seed, None)?;
    let place = Place::Lab(&lab);
    let mut servers = servers::start_servers(
        &place,
        Ports::LAB,
        &braid,
        tmp.path(),
        &root,
        &[Tool::Braid, Tool::Iperf3],
        &[],
    )?;
    let mut background = place.server_command(&braid.to_string_lossy());
    background
        .args(["serve", "--background", "--anonymous", "--listen"])
        .arg(format!("{SERVER}:{BACKGROUND_PORT}"))
        .arg("--root")
        .arg(&root);
    servers.start(&place, background, BACKGROUND_PORT)?;
    let mut rounds = Vec::new();
    for repeat in 0..args.repeat {
        for &direction in &args.direction {
            eprintln!("round {} of {}, {direction:?}", repeat + 1, args.repeat);
            let at = Setup {
                place: &place,
                braid: &braid,
                root: &root,
                round: repeat + 1,
                direction,
            };
            rounds.push(round(&at)?);
        }
    }
    drop(lab);
    let json =
        serde_json::json!({ "scenario": SCENARIO, "payload_rate": payload, "rounds": rounds });
    super::results(&args.out, &markdown(&rounds, payload), &json)?;
    Ok(0)
}

/// Started programs, on one clock.
struct Clock(Instant);

impl Clock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
    fn sleep_until(&self, t: f64) {
        let left = t - self.now();
        if left > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(left));
        }
    }
}

fn spawn(mut c: Command) -> Result<Child> {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().context("cannot start a client")
}

/// Where a round runs, and which way the data goes.
struct Setup<'a> {
    place: &'a Place<'a>,
    braid: &'a Path,
    /// The served directory, which holds `bg.bin` (the lab's hosts share the file system).
    root: &'a Path,
    round: u32,
    direction: Direction,
}

impl Setup<'_> {
    /// A `--background` transfer of `bg.bin`; an upload goes to `put-{tag}.bin`.
    fn braid(&self, tag: &str) -> Result<Child> {
        let mut c = self.place.command(&self.braid.to_string_lossy());
        let port = Ports::LAB.ftp;
        let (op, from, to): (_, std::ffi::OsString, std::ffi::OsString) = match self.direction {
            Direction::Get => (
                "get",
                format!("ftp://{SERVER}:{port}/bg.bin").into(),
                "/dev/null".into(),
            ),
            Direction::Put => (
                "put",
                self.root.join("bg.bin").into_os_string(),
                format!("ftp://{SERVER}:{port}/put-{tag}.bin").into(),
            ),
        };
        c.args([op, "-q", "--json", "--background"]);
        c.arg(from).arg(to);
        spawn(c)
    }

    /// A cubic iperf3 flow the same way as braid's.
    fn iperf3(&self, seconds: f64) -> Result<Child> {
        let mut c = self.place.command("iperf3");
        c.args(["-c", SERVER, "-p", &Ports::LAB.iperf.to_string(), "-J"]);
        c.arg(match self.direction {
            Direction::Get => "-R",
            Direction::Put => "--get-server-output",
        });
        c.args(["-C", "cubic", "-i", "0.5", "-t", &format!("{seconds}")]);
        spawn(c)
    }
}

/// Its stdout, once it has ended well.
fn finish(child: Child, what: &str) -> Result<String> {
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// braid's rate each second, from its `--json` timeline: (seconds since its start, bytes/s)
/// from the kernel's count of bytes received.
fn braid_rates(summary: &str) -> Vec<(f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(summary.trim()).unwrap_or_default();
    let rows = v["timeline"].as_array().cloned().unwrap_or_default();
    let mut by_t: Vec<(f64, u64)> = Vec::new();
    for r in rows {
        let (Some(t), Some(m)) = (r["t"].as_f64(), r["moved"].as_u64()) else {
            continue;
        };
        match by_t.last_mut() {
            Some((lt, lm)) if (t - *lt).abs() < 0.2 => *lm += m,
            _ => by_t.push((t, m)),
        }
    }
    by_t.windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| {
            let rate = w[1].1.saturating_sub(w[0].1) as f64 / (w[1].0 - w[0].0);
            (w[1].0, rate)
        })
        .collect()
}

/// iperf3's intervals at the receiving end: (end, seconds since its start; bytes/s). An
/// upload's come from the server's report: the sender's count what entered its socket, and the
/// first seconds of that fill a second of queue (1.24 Mbit/s "alone" on a 1 Mbit/s link).
fn iperf3_rates(json: &str) -> Vec<(f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let v = match &v["server_output_json"] {
        serde_json::Value::Null => &v,
        server => server,
    };
    v["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| {
                    let s = &i["sum"];
                    Some((s["end"].as_f64()?, s["bits_per_second"].as_f64()? / 8.0))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The mean rate of `rates` (times shifted by `offset`) over `[from, to)`.
fn mean(rates: &[(f64, f64)], offset: f64, from: f64, to: f64) -> Option<f64> {
    let v: Vec<f64> = rates
        .iter()
        .filter(|(t, _)| (from..to).contains(&(t + offset)))
        .map(|&(_, r)| r)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub fn jain(rates: &[f64]) -> f64 {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    sum * sum / (rates.len() as f64 * squares)
}

fn round(at: &Setup) -> Result<Round> {
    let place = at.place;
    let mut r = Round {
        round: at.round,
        direction: at.direction,
        ping_up_p50_ms: None,
        ping_up_p95_ms: None,
        alone: None,
        iperf3_alone: None,
        iperf3_to_90: None,
        iperf3_to_90_alone: None,
        iperf3_share: None,
        braid_kept: None,
        braid_back_90: None,
        iperf3_drained: None,
        braid_back_90_drained: None,
        pair: None,
        jain: None,
        server_ping_up_p50_ms: None,
        server_ping_up_p95_ms: None,
        server_rate: None,
        braid_series: Vec::new(),
        iperf3_series: Vec::new(),
        braid_controller: serde_json::Value::Null,
        ping_series: Vec::new(),
    };
    // iperf3 alone, without its first two seconds.
    let solo = iperf3_rates(&finish(at.iperf3(8.0)?, "iperf3 alone")?);
    r.iperf3_alone = mean(&solo, 0.0, 2.0, 100.0);
    r.iperf3_to_90_alone = r
        .iperf3_alone
        .and_then(|a| solo.iter().find(|(_, v)| *v >= 0.9 * a).map(|(t, _)| *t));
    std::thread::sleep(Duration::from_secs(2));

    // The competitor: braid alone, iperf3 from JOIN for COMPETE seconds, braid alone again.
    let (clock, ping) = Pinging::start(place)?;
    clock.sleep_until(5.0);
    let b = at.braid("alone")?;
    let b_start = clock.now();
    clock.sleep_until(b_start + JOIN);
    let i = at.iperf3(COMPETE)?;
    let i_start = clock.now();
    let during = iperf3_rates(&finish(i, "iperf3 against braid")?);
    let i_end = i_start + COMPETE;
    let summary = finish(b, "braid --background")?;
    let braid_run = braid_rates(&summary);
    r.braid_controller = serde_json::from_str::<serde_json::Value>(summary.trim())
        .map(|v| v["background"].clone())
        .unwrap_or_default();
    let ((p50, p95), pings) = ping.rise(4.5, b_start + 5.0, b_start + JOIN);
    (r.ping_up_p50_ms, r.ping_up_p95_ms) = (p50, p95);
    r.ping_series = pings.iter().map(|&(t, ms)| (t - b_start, ms)).collect();
    // braid's times are since its start, iperf3's since its own.
    r.alone = mean(&braid_run, b_start, b_start + 5.0, b_start + JOIN);
    if let (Some(solo), Some(alone)) = (r.iperf3_alone, r.alone) {
        r.iperf3_to_90 = during
            .iter()
            .find(|(_, v)| *v >= 0.9 * solo)
            .map(|(t, _)| *t);
        r.iperf3_share = mean(&during, 0.0, 2.0, COMPETE).map(|m| m / solo);
        r.braid_kept = mean(&braid_run, b_start, i_start + 3.0, i_end).map(|m| m / alone);
        let back_after = |from: f64| {
            braid_run
                .iter()
                .map(|&(t, v)| (t + b_start, v))
                .find(|&(t, v)| t > from && v >= 0.9 * alone)
                .map(|(t, _)| t - from)
        };
        r.braid_back_90 = back_after(i_end);
        r.iperf3_drained = drained(&pings, 4.5, i_end).map(|t| t - i_end);
        r.braid_back_90_drained = r.iperf3_drained.and_then(|d| back_after(i_end + d));
    }
    r.braid_series = braid_run.clone();
    r.iperf3_series = during
        .iter()
        .map(|&(t, v)| (t + i_start - b_start, v))
        .collect();
    std::thread::sleep(Duration::from_secs(3));

    // The pair.
    let clock = Clock(Instant::now());
    let first = at.braid("first")?;
    clock.sleep_until(JOIN);
    let second = at.braid("second")?;
    let second_start = clock.now();
    let first_rates = braid_rates(&finish(first, "the first braid --background")?);
    let first_end = clock.now();
    let second_rates = braid_rates(&finish(second, "the second braid --background")?);
    let (from, to) = (second_start + 3.0, first_end - 1.0);
    if let (Some(a), Some(b)) = (
        mean(&first_rates, 0.0, from, to),
        mean(&second_rates, second_start, from, to),
    ) {
        r.pair = Some((a, b));
        r.jain = Some(jain(&[a, b]));
    }
    std::thread::sleep(Duration::from_secs(3));
    if at.direction == Direction::Put {
        return Ok(r);
    }

    // curl from the background server: 2 MB, about 20 s.
    let (clock, ping) = Pinging::start(place)?;
    clock.sleep_until(4.0);
    let mut curl = place.command("curl");
    curl.args([
        "-sS",
        "-r",
        "0-1999999",
        "-o",
        "/dev/null",
        "-w",
        "%{speed_download}",
    ])
    .arg(format!("ftp://{SERVER}:{BACKGROUND_PORT}/bg.bin"));
    let c_start = clock.now();
    let out = finish(spawn(curl)?, "curl from serve --background")?;
    let c_end = clock.now();
    r.server_rate = out.trim().parse().ok();
    (r.server_ping_up_p50_ms, r.server_ping_up_p95_ms) = ping.rise(3.5, c_start + 3.0, c_end).0;
    std::thread::sleep(Duration::from_secs(2));
    Ok(r)
}

/// The time of the first ping sent after `after` whose round trip is back within 50 ms of
/// the median of those before `idle_until` (pings: seconds on the clock, ms).
fn drained(pings: &[(f64, f64)], idle_until: f64, after: f64) -> Option<f64> {
    let idle: Vec<f64> = pings
        .iter()
        .filter(|(t, _)| *t < idle_until)
        .map(|p| p.1)
        .collect();
    let idle = Latency::of(&idle)?.p50_ms;
    pings
        .iter()
        .find(|&&(t, ms)| t > after && ms <= idle + 50.0)
        .map(|p| p.0)
}

/// A rise of ping's median and 95th percentile, ms.
type Rise = (Option<f64>, Option<f64>);

/// ping every 200 ms from the client's host, on a clock that starts with it.
struct Pinging {
    child: Child,
    /// The clock's zero, Unix seconds (ping -D stamps its lines so).
    unix0: f64,
}

impl Pinging {
    fn start(place: &Place) -> Result<(Clock, Pinging)> {
        let clock = Clock(Instant::now());
        let unix0 = super::measure::unix_now();
        let mut ping = place.command("ping");
        ping.args(["-n", "-D", "-i", "0.2", SERVER]);
        Ok((
            clock,
            Pinging {
                child: spawn(ping)?,
                unix0,
            },
        ))
    }

    /// Stops ping (`ip netns exec` became ping itself) and gives the rise of its median and
    /// 95th percentile over `[from, to)` above its median before `idle_until`, ms, and every
    /// ping (seconds on the clock, ms).
    fn rise(self, idle_until: f64, from: f64, to: f64) -> (Rise, Vec<(f64, f64)>) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let out = self
            .child
            .wait_with_output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let pings: Vec<(f64, f64)> = out
            .lines()
            .filter_map(parse_ping_line)
            .map(|(t, ms)| (t - self.unix0, ms))
            .collect();
        let during = |a: f64, b: f64| -> Vec<f64> {
            pings
                .iter()
                .filter(|(t, _)| (a..b).contains(t))
                .map(|p| p.1)
                .collect()
        };
        let rise = match (
            Latency::of(&during(0.0, idle_until)),
            Latency::of(&during(from, to)),
        ) {
            (Some(i), Some(b)) => (Some(b.p50_ms - i.p50_ms), Some(b.p95_ms - i.p50_ms)),
            _ => (None, None),
        };
        (rise, pings)
    }
}

fn markdown(rounds: &[Round], payload: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Background mode against other traffic ({SCENARIO}, {} rounds)\n",
        rounds.len()
    );
    let f = |v: Option<f64>, scale: f64, digits: usize| {
        v.map_or("-".into(), |x| format!("{:.*}", digits, x * scale))
    };
    s.push_str("| round | direction | ping rise p50 / p95 ms | braid alone Mbit/s (of the payload rate) | iperf3 alone Mbit/s | iperf3 at 90 % after s (alone) | iperf3's share | braid kept | braid back at 90 % after s: from iperf3's end / from its queue drained (drained after s) | pair Mbit/s | Jain | curl from serve --background: ping rise ms, Mbit/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rounds {
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {} ({}) | {} | {} ({}) | {} | {} | {} / {} ({}) | {} | {} | {} / {}, {} |",
            r.round,
            r.direction.name(),
            f(r.ping_up_p50_ms, 1.0, 1),
            f(r.ping_up_p95_ms, 1.0, 1),
            f(r.alone, 8e-6, 3),
            r.alone
                .map_or("-".into(), |a| format!("{:.0} %", 100.0 * a / payload)),
            f(r.iperf3_alone, 8e-6, 3),
            f(r.iperf3_to_90, 1.0, 1),
            f(r.iperf3_to_90_alone, 1.0, 1),
            r.iperf3_share
                .map_or("-".into(), |x| format!("{:.0} %", 100.0 * x)),
            r.braid_kept
                .map_or("-".into(), |x| format!("{:.0} %", 100.0 * x)),
            f(r.braid_back_90, 1.0, 0),
            f(r.braid_back_90_drained, 1.0, 0),
            f(r.iperf3_drained, 1.0, 1),
            r.pair.map_or("-".into(), |(a, b)| format!(
                "{:.3} + {:.3}",
                a * 8e-6,
                b * 8e-6
            )),
            f(r.jain, 1.0, 2),
            f(r.server_ping_up_p50_ms, 1.0, 1),
            f(r.server_ping_up_p95_ms, 1.0, 1),
            f(r.server_rate, 8e-6, 3),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_from_braids_timeline_and_iperf3s_intervals() {
        let summary = r#"{"timeline":[
            {"t":0.1,"conn":0,"moved":0},{"t":1.1,"conn":0,"moved":100000},
            {"t":2.1,"conn":0,"moved":150000},{"t":2.1,"conn":1,"moved":50000}]}"#;
        assert_eq!(braid_rates(summary), vec![(1.1, 100000.0), (2.1, 100000.0)]);
        let iperf = r#"{"intervals":[{"sum":{"end":0.5,"bits_per_second":800000}},
            {"sum":{"end":1.0,"bits_per_second":400000}}]}"#;
        let rates = iperf3_rates(iperf);
        assert_eq!(rates, vec![(0.5, 100000.0), (1.0, 50000.0)]);
        // An upload's: the receiving server's intervals, not the sender's.
        let upload = r#"{"intervals":[{"sum":{"end":0.5,"bits_per_second":9000000}}],
            "server_output_json":{"intervals":[{"sum":{"end":0.5,"bits_per_second":800000}}]}}"#;
        assert_eq!(iperf3_rates(upload), vec![(0.5, 100000.0)]);
        assert_eq!(mean(&rates, 10.0, 10.6, 20.0), Some(50000.0));
        assert_eq!(mean(&rates, 0.0, 5.0, 6.0), None);
        assert!((jain(&[1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[2.0, 1.0]) - 0.9).abs() < 1e-12);
    }

    /// The competitor's queue has drained at the first ping after its end that is back near
    /// the idle round trip; one that rose before its end does not count.
    #[test]
    fn the_queue_drained_at_the_first_ping_back_near_idle_after_the_end() {
        let pings = [
            (1.0, 21.0),
            (2.0, 22.0),
            (3.0, 20.0),
            (10.0, 900.0),
            (12.0, 30.0),
            (20.0, 950.0),
            (21.0, 72.0),
            (21.5, 400.0),
            (22.0, 69.0),
        ];
        assert_eq!(drained(&pings, 4.5, 15.0), Some(22.0));
        assert_eq!(drained(&pings, 4.5, 30.0), None);
        assert_eq!(drained(&[], 4.5, 15.0), None);
    }
}
