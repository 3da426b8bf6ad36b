//! `braid model`: what throughput a path allows, from the published models (see [`limits`]),
//! and which limit binds. The path comes from a lab scenario, from options, or from a
//! packet trace of a real transfer.

pub mod limits;

use crate::lab::{model::Loss, model::Params, model::QueueLimit, scenario, units};
use anyhow::{Context, Result, bail};
use clap::Args;
use limits::{Congestion, Load, Path, Prediction, Window};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Take rate, delay, MTU, loss and queue from a lab scenario (`braid lab scenarios`);
    /// the options below override them.
    #[arg(long)]
    pub scenario: Option<String>,
    /// Which way the data goes on the scenario's link: get (right → left, the lab's "down")
    /// or put (left → right, "up").
    #[arg(long, default_value = "get", value_parser = ["get", "put"])]
    pub direction: String,
    /// Link rate, e.g. 1.536mbit, 500mbit.
    #[arg(long)]
    pub rate: Option<String>,
    /// Round-trip time of the empty path, e.g. 590ms.
    #[arg(long)]
    pub rtt: Option<String>,
    /// MTU of the path [default: the scenario's, else 1500].
    #[arg(long)]
    pub mtu: Option<u16>,
    /// Probability that a packet is lost, e.g. 1e-5.
    #[arg(long, conflicts_with = "ber")]
    pub loss: Option<String>,
    /// Bit error rate; a packet of the MTU is lost when any bit is hit.
    #[arg(long)]
    pub ber: Option<String>,
    /// The bottleneck's drop-tail queue in bytes, e.g. 96kB (packets count as MTU-sized).
    #[arg(long)]
    pub queue: Option<String>,
    /// Parallel streams.
    #[arg(short = 'n', long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub streams: u32,
    /// Socket buffer each end sets (braid's --buffer, iperf3's -w), e.g. 24KiB. Linux doubles
    /// it and advertises about 1.2 times the request as the window [default: the kernel tunes
    /// its buffers, up to tcp_rmem's and tcp_wmem's maximums].
    #[arg(long, conflicts_with = "window")]
    pub buffer: Option<String>,
    /// The TCP window itself, as the papers quote it, e.g. 24KB.
    #[arg(long)]
    pub window: Option<String>,
    /// Bytes to move, e.g. 4MB.
    #[arg(long, default_value = "100MB")]
    pub size: String,
    /// Congestion control of the sender: reno, cubic or bbr [default: the system's].
    #[arg(long, value_parser = Congestion::parse)]
    pub congestion: Option<Congestion>,
    /// Segments each stream sends before its first acknowledgement (Linux: 10; the stacks
    /// of the XFTP paper's time: 1).
    #[arg(long, default_value_t = limits::INITIAL_WINDOW)]
    pub initial_window: f64,
    /// Round trips the measured time includes besides the data (commands, handshakes).
    #[arg(long, default_value_t = 0.0)]
    pub overhead_rtts: f64,
    /// Data and acknowledgements share a half-duplex channel (Van Jacobson's echo test).
    #[arg(long)]
    pub echo: bool,
    /// Take streams, RTT, loss and window from a capture of a transfer (`braid trace`);
    /// --rate is still needed, as a trace cannot tell the link's rate.
    #[arg(long, value_name = "PCAP")]
    pub from_trace: Option<PathBuf>,
    /// Print the prediction as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The model's input, resolved, and what a trace measured.
pub struct Resolved {
    pub path: Path,
    pub load: Load,
    pub measured_bytes_per_second: Option<f64>,
}

/// tcp_rmem's and tcp_wmem's maximums, or Linux's defaults where /proc cannot be read.
pub fn autotuned() -> Window {
    let max = |file: &str, default: f64| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{file}"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(default)
    };
    Window::Auto {
        rmem_max: max("tcp_rmem", 6_291_456.0),
        wmem_max: max("tcp_wmem", 4_194_304.0),
    }
}

/// The system's congestion control, or cubic where /proc cannot be read.
pub fn system_congestion() -> Congestion {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .and_then(|s| Congestion::parse(s.trim()).ok())
        .unwrap_or(Congestion::Cubic)
}

/// A bad or missing option: exit code 2.
fn usage(msg: impl Into<String>) -> anyhow::Error {
    crate::client::error::ClientError::Usage(msg.into()).into()
}

fn size(s: &str) -> Result<f64> {
    crate::units::parse_size(s).map(|v| v as f64).map_err(usage)
}

/// One direction of a lab link as the model sees it.
pub struct LabWay {
    /// None: unlimited.
    pub rate_bps: Option<f64>,
    /// This direction's delay and the way back's.
    pub rtt: f64,
    /// Per packet of the MTU (a bit error rate converted).
    pub loss: f64,
    /// The drop-tail queue in bytes (packets of the MTU).
    pub queue: f64,
}

/// Data going over `there`, acknowledgements over `back`, packets of `mtu` bytes.
pub fn lab_way(there: &Params, back: &Params, mtu: u16) -> LabWay {
    LabWay {
        rate_bps: there.rate.map(|r| r as f64),
        rtt: (there.delay + back.delay) as f64 / 1e9,
        loss: match there.loss {
            Loss::None => 0.0,
            Loss::Random(p) => p,
            Loss::Ber(b) => crate::lab::model::per_packet(b, mtu.into()),
        },
        queue: match there.queue {
            QueueLimit::Bytes(b) => b as f64,
            QueueLimit::Packets(p) => p as f64 * f64::from(mtu),
        },
    }
}

impl ModelArgs {
    pub fn resolve(&self) -> Result<Resolved> {
        let mut mtu = f64::from(self.mtu.unwrap_or(1500));
        let (mut rate, mut rtt, mut loss, mut queue) = (None, None, 0.0, None);
        if let Some(name) = &self.scenario {
            let s = scenario::find(name).map_err(usage)?;
            let (there, back) = if self.direction == "put" {
                (&s.up, &s.down)
            } else {
                (&s.down, &s.up)
            };
            let packet = self.mtu.unwrap_or(s.mtu);
            mtu = f64::from(packet);
            let way = lab_way(there, back, packet);
            (rate, rtt, loss, queue) = (way.rate_bps, Some(way.rtt), way.loss, Some(way.queue));
        }
        if let Some(r) = &self.rate {
            rate = Some(units::rate(r).map_err(usage)? as f64);
        }
        if let Some(r) = &self.rtt {
            rtt = Some(units::delay(r).map_err(usage)? as f64 / 1e9);
        }
        if let Some(l) = &self.loss {
            loss = units::probability(l).map_err(usage)?;
        }
        if let Some(b) = &self.ber {
            loss = crate::lab::model::per_packet(units::probability(b).map_err(usage)?, mtu as u64);
        }
        if let Some(q) = &self.queue {
            queue = Some(match units::queue(q).map_err(usage)? {
                QueueLimit::Bytes(b) => b as f64,
                QueueLimit::Packets(p) => p as f64 * mtu,
            });
        }
        let mut streams = self.streams;
        let mut window = match (&self.buffer, &self.window) {
            (Some(b), _) => Window::Buffer(size(b)?),
            (None, Some(w)) => Window::Bytes(size(w)?),
            (None, None) => autotuned(),
        };
        let mut bytes = size(&self.size)?;
        let mut measured = None;
        if let Some(pcap) = &self.from_trace {
            let seen = from_trace(pcap)?;
            streams = seen.streams;
            rtt = Some(seen.rtt);
            loss = seen.loss;
            if self.buffer.is_none() && self.window.is_none() {
                window = Window::Bytes(seen.window);
            }
            bytes = seen.bytes;
            measured = Some(seen.bytes_per_second);
        }
        let Some(rate_bps) = rate else {
            return Err(usage(
                "the model needs the link's rate: give --rate (e.g. --rate 1.536mbit) or --scenario",
            ));
        };
        let Some(rtt) = rtt else {
            return Err(usage(
                "the model needs the path's round-trip time: give --rtt (e.g. --rtt 590ms) or --scenario",
            ));
        };
        if rtt <= 0.0 {
            return Err(usage("--rtt must be more than 0"));
        }
        Ok(Resolved {
            path: Path {
                rate_bps,
                rtt,
                mtu,
                loss,
                queue,
            },
            load: Load {
                streams,
                window,
                size: bytes,
                congestion: self.congestion.unwrap_or_else(system_congestion),
                initial_window: self.initial_window.max(1.0),
                overhead_rtts: self.overhead_rtts.max(0.0),
                echo: self.echo,
            },
            measured_bytes_per_second: measured,
        })
    }
}

/// What a capture says about a transfer's data connections.
struct FromTrace {
    streams: u32,
    rtt: f64,
    loss: f64,
    window: f64,
    bytes: f64,
    bytes_per_second: f64,
}

/// The busiest transfer of the capture; its data connections are those that carried at least
/// a tenth of its largest connection's bytes (the control connection carries almost none).
fn from_trace(pcap: &std::path::Path) -> Result<FromTrace> {
    let file =
        std::fs::File::open(pcap).with_context(|| format!("cannot open {}", pcap.display()))?;
    let name = pcap.display().to_string();
    let report = crate::trace::analyse(std::io::BufReader::new(file), &name, None, None)?;
    // (data direction, the reverse one) of each connection, the busier way first.
    let dirs: Vec<_> = report
        .connections
        .iter()
        .map(|c| {
            if c.a2b.unique_bytes >= c.b2a.unique_bytes {
                (&c.a2b, &c.b2a)
            } else {
                (&c.b2a, &c.a2b)
            }
        })
        .collect();
    let top = dirs.iter().map(|d| d.0.unique_bytes).max().unwrap_or(0);
    if top == 0 {
        bail!("{name} holds no TCP data to model");
    }
    let data: Vec<_> = dirs
        .into_iter()
        .filter(|d| d.0.unique_bytes * 10 >= top)
        .collect();
    let mut rtts: Vec<f64> = data.iter().filter_map(|d| d.0.rtt_min_ms).collect();
    rtts.sort_by(f64::total_cmp);
    let Some(rtt_ms) = rtts.get(rtts.len() / 2) else {
        bail!(
            "{name}: no RTT samples on the data connections (was the capture taken at the sender?)"
        );
    };
    let bytes: u64 = data.iter().map(|d| d.0.unique_bytes).sum();
    let packets: u64 = data.iter().map(|d| d.0.data_packets).sum();
    let rexmt: u64 = data.iter().map(|d| d.0.rexmt_packets).sum();
    let first = data
        .iter()
        .filter_map(|d| d.0.first_s)
        .fold(f64::INFINITY, f64::min);
    let last = data
        .iter()
        .filter_map(|d| d.0.last_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut windows: Vec<f64> = data.iter().map(|d| d.1.window_max as f64).collect();
    windows.sort_by(f64::total_cmp);
    Ok(FromTrace {
        streams: data.len() as u32,
        rtt: rtt_ms / 1e3,
        loss: rexmt as f64 / packets.max(1) as f64,
        window: windows.get(windows.len() / 2).copied().unwrap_or(0.0),
        bytes: bytes as f64,
        bytes_per_second: bytes as f64 / (last - first).max(1e-9),
    })
}

pub fn main(args: ModelArgs) -> Result<u8> {
    let r = args.resolve()?;
    let p = limits::predict(&r.path, &r.load);
    if args.json {
        let out = serde_json::json!({
            "path": r.path,
            "load": r.load,
            "prediction": p,
            "measured_bytes_per_second": r.measured_bytes_per_second,
        });
        println!("{out}");
    } else {
        print(&r, &p);
    }
    Ok(0)
}

fn print(r: &Resolved, p: &Prediction) {
    let (path, load) = (&r.path, &r.load);
    println!(
        "path: {:.3} Mbit/s, RTT {:.1} ms, MTU {}, loss {}, queue {}",
        path.rate_bps / 1e6,
        path.rtt * 1e3,
        path.mtu,
        if path.loss > 0.0 {
            format!("{:.2e}", path.loss)
        } else {
            "none".into()
        },
        path.queue
            .map_or("unknown".into(), |q| format!("{:.1} kB", q / 1e3))
    );
    println!(
        "load: {} stream(s) of {:.1} kB window each, {:.3} MB, {:?}",
        load.streams,
        load.window.bytes() / 1e3,
        load.size / 1e6,
        load.congestion
    );
    println!("limits (payload, all streams together):");
    for l in &p.limits {
        println!(
            "  {:<8} {:>12.1} kB/s  {}",
            l.kind.name(),
            l.bytes_per_second / 1e3,
            l.why
        );
    }
    if p.probe_rtt_share > 0.0 {
        println!(
            "bbr's ProbeRTT: {:.1}% of the time at 4 packets, taken off the steady rate",
            p.probe_rtt_share * 100.0
        );
    }
    if p.before_first_loss.is_finite() {
        println!(
            "first losses: after {:.2} MB on average (Cardwell et al.: (1 − p)/p packets a stream); the loss limit holds from there",
            p.before_first_loss / 1e6
        );
    }
    println!(
        "slow start: {} round(s), {:.2} s",
        p.slow_start_rounds, p.slow_start_seconds
    );
    println!(
        "binding: {}; predicted {:.2} s, {:.1} kB/s ({:.3} Mbit/s, {:.0}% of the link's payload rate)",
        p.binding.name(),
        p.seconds,
        p.bytes_per_second / 1e3,
        p.bytes_per_second * 8.0 / 1e6,
        p.utilization * 100.0
    );
    if let Some(m) = r.measured_bytes_per_second {
        println!(
            "measured in the trace: {:.1} kB/s; the model is {:+.0}% off",
            m / 1e3,
            (p.bytes_per_second / m - 1.0) * 100.0
        );
    }
}
