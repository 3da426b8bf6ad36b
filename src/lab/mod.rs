//! `braid lab`: a packet-level link emulator. Network namespaces (`left` and `right`, or the
//! hosts `--host` names), each with a TUN device; a relay in this process carries every packet
//! between them through a model of the link (rate, queue, delay, loss, corruption). This
//! kernel has no netem, so the lab brings its own, in the style of mahimahi.

pub mod firewall;
pub mod hosts;
pub mod model;
pub mod packet;
pub mod relay;
pub mod scenario;
pub mod units;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use model::{Loss, Params, QueueLimit};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum LabCmd {
    /// Bring up two hosts, `left` (198.18.0.1) and `right` (198.18.0.2), joined by an
    /// emulated link (or the hosts --host names, each behind its own link to one switch), and
    /// keep it up until Ctrl-C (or --duration). Prints the links' counters at the end.
    Link {
        #[command(flatten)]
        link: LinkArgs,
        /// Stop by itself after this many seconds.
        #[arg(long)]
        duration: Option<f64>,
    },
    /// Run a command in a host of a running lab: braid lab exec left -- ping 198.18.0.2
    Exec {
        /// Which lab (see `link --name`).
        #[arg(long, default_value = "braid")]
        name: String,
        /// left or right (or a name --host gave)
        host: String,
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// One shot: bring the link up, start SERVER in `right`, run CLIENT in `left`, stop the
    /// server, print both outputs and the link's counters, tear everything down.
    Run {
        #[command(flatten)]
        link: LinkArgs,
        /// Shell command for the right host, started first (e.g. "iperf3 -s -1").
        #[arg(long)]
        server: String,
        /// Shell command for the left host; the run ends when it does.
        #[arg(long)]
        client: String,
        /// Give up on the client after this many seconds.
        #[arg(long, default_value_t = 600.0)]
        timeout: f64,
    },
    /// List the named scenarios and their parameters.
    Scenarios,
    /// Remove the namespaces of labs whose braid process is gone (after a crash or kill -9).
    Clean,
}

/// The link: a named scenario, then overrides for both directions, then per direction
/// (`up` is left → right, `down` is right → left).
#[derive(Args, Debug, Clone)]
pub struct LinkArgs {
    /// Start from a named scenario (see `braid lab scenarios`).
    #[arg(long)]
    scenario: Option<String>,
    /// Lab name: its namespaces are NAME-left and NAME-right (NAME-HOST with --host).
    #[arg(long, default_value = "braid")]
    name: String,
    /// A lab of more hosts than two: each --host is one, behind its own access link to a
    /// switch; a packet crosses its sender's link up and its receiver's link down. Hosts get
    /// 198.18.0.1, .2, ... in the order given, and know each other by name. LINK is
    /// KEY=VALUE,... with the keys of the two-host link: rate, delay, queue, loss, ber, corrupt
    /// (both ways), or up-rate, down-delay, ... (up is host → switch); none: an open link.
    /// E.g. --host client --host dn1:rate=100mbit,delay=10ms --host dn2:rate=100mbit,delay=10ms
    #[arg(
        long = "host",
        value_name = "NAME[:LINK]",
        conflicts_with_all = ["scenario", "rate", "delay", "queue", "loss", "ber", "corrupt",
            "up_rate", "down_rate", "up_delay", "down_delay", "up_queue", "down_queue",
            "up_loss", "down_loss", "up_ber", "down_ber", "up_corrupt", "down_corrupt",
            "right_accepts", "left_accepts"]
    )]
    hosts: Vec<String>,
    /// Link rate, e.g. 1.536mbit, 50mbit, 14.4kbit, or unlimited [default: unlimited]
    #[arg(long)]
    rate: Option<String>,
    /// One-way propagation delay, e.g. 295ms [default: 0]
    #[arg(long)]
    delay: Option<String>,
    /// Drop-tail queue: packets (64pkt) or bytes (60kB) [default: 1000pkt]
    #[arg(long)]
    queue: Option<String>,
    /// Random loss probability per packet, e.g. 1e-4
    #[arg(long, conflicts_with = "ber")]
    loss: Option<String>,
    /// Bit error rate: a packet is lost if any of its bits is hit, e.g. 1e-6
    #[arg(long)]
    ber: Option<String>,
    /// Per-bit probability of a flipped payload bit that arrives with fixed checksums
    #[arg(long)]
    corrupt: Option<String>,
    /// --rate, for left → right only.
    #[arg(long, hide_short_help = true)]
    up_rate: Option<String>,
    /// --rate, for right → left only.
    #[arg(long, hide_short_help = true)]
    down_rate: Option<String>,
    /// --delay, for left → right only.
    #[arg(long, hide_short_help = true)]
    up_delay: Option<String>,
    /// --delay, for right → left only.
    #[arg(long, hide_short_help = true)]
    down_delay: Option<String>,
    /// --queue, for left → right only.
    #[arg(long, hide_short_help = true)]
    up_queue: Option<String>,
    /// --queue, for right → left only.
    #[arg(long, hide_short_help = true)]
    down_queue: Option<String>,
    /// --loss, for left → right only.
    #[arg(long, hide_short_help = true, conflicts_with = "up_ber")]
    up_loss: Option<String>,
    /// --loss, for right → left only.
    #[arg(long, hide_short_help = true, conflicts_with = "down_ber")]
    down_loss: Option<String>,
    /// --ber, for left → right only.
    #[arg(long, hide_short_help = true)]
    up_ber: Option<String>,
    /// --ber, for right → left only.
    #[arg(long, hide_short_help = true)]
    down_ber: Option<String>,
    /// --corrupt, for left → right only.
    #[arg(long, hide_short_help = true)]
    up_corrupt: Option<String>,
    /// --corrupt, for right → left only.
    #[arg(long, hide_short_help = true)]
    down_corrupt: Option<String>,
    /// MTU of the hosts' devices [default: the scenario's, else 1500]
    #[arg(long)]
    mtu: Option<u16>,
    /// Ports right takes new TCP connections on, as behind a firewall: openings to any other
    /// port are dropped without an answer (e.g. 22,2222, or none) [default: every port]
    #[arg(long, value_name = "PORTS", value_parser = firewall::Accepts::parse)]
    right_accepts: Option<firewall::Accepts>,
    /// --right-accepts, for left (connections from right).
    #[arg(long, value_name = "PORTS", value_parser = firewall::Accepts::parse)]
    left_accepts: Option<firewall::Accepts>,
    /// Seed for loss and corruption, to repeat a run exactly.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write one line per packet (direction, arrival, size, fate, sent, delivered; µs) here.
    #[arg(long)]
    log: Option<std::path::PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Overrides for one direction, in the order they apply.
struct Overrides<'a> {
    rate: [&'a Option<String>; 2],
    delay: [&'a Option<String>; 2],
    queue: [&'a Option<String>; 2],
    loss: [&'a Option<String>; 2],
    ber: [&'a Option<String>; 2],
    corrupt: [&'a Option<String>; 2],
}

fn apply(mut p: Params, o: Overrides) -> Result<Params, String> {
    for v in o.rate.into_iter().flatten() {
        p.rate = if v == "unlimited" {
            None
        } else {
            Some(units::rate(v)?)
        };
    }
    for v in o.delay.into_iter().flatten() {
        p.delay = units::delay(v)?;
    }
    for v in o.queue.into_iter().flatten() {
        p.queue = units::queue(v)?;
    }
    for (loss, ber) in o.loss.into_iter().zip(o.ber) {
        if let Some(v) = loss {
            p.loss = Loss::Random(units::probability(v)?);
        }
        if let Some(v) = ber {
            p.loss = Loss::Ber(units::probability(v)?);
        }
    }
    for v in o.corrupt.into_iter().flatten() {
        p.corrupt = units::probability(v)?;
    }
    Ok(p)
}

/// A link with no rate limit, delay or loss.
fn open_params() -> Params {
    Params {
        rate: None,
        delay: 0,
        queue: QueueLimit::Packets(1000),
        loss: Loss::None,
        corrupt: 0.0,
    }
}

/// The keys a `--host` link takes, in the order of [`Overrides`].
const LINK_KEYS: [&str; 6] = ["rate", "delay", "queue", "loss", "ber", "corrupt"];

/// `NAME[:KEY=VALUE,...]` of `--host`.
pub fn parse_host(arg: &str) -> Result<HostSpec> {
    let (name, link) = arg.split_once(':').unwrap_or((arg, ""));
    hosts::check_host_name(name).with_context(|| format!("--host {arg}"))?;
    // [both ways, up, down] × LINK_KEYS
    let mut given: [[Option<String>; 6]; 3] = Default::default();
    for pair in link.split(',').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--host {arg}: {pair:?} is not KEY=VALUE (e.g. rate=100mbit)");
        };
        let (way, bare) = match key.split_once('-') {
            Some(("up", k)) => (1, k),
            Some(("down", k)) => (2, k),
            _ => (0, key),
        };
        let Some(k) = LINK_KEYS.iter().position(|&k| k == bare) else {
            bail!(
                "--host {arg}: unknown key {key:?}; the keys are {} (both ways) and up-KEY, \
                 down-KEY (one way; up is host → switch)",
                LINK_KEYS.join(", ")
            );
        };
        if given[way][k].replace(value.to_string()).is_some() {
            bail!("--host {arg}: {key} is given twice");
        }
    }
    for way in &given {
        if way[3].is_some() && way[4].is_some() {
            bail!("--host {arg}: give loss or ber, not both");
        }
    }
    let way = |w: usize| {
        apply(
            open_params(),
            Overrides {
                rate: [&given[0][0], &given[w][0]],
                delay: [&given[0][1], &given[w][1]],
                queue: [&given[0][2], &given[w][2]],
                loss: [&given[0][3], &given[w][3]],
                ber: [&given[0][4], &given[w][4]],
                corrupt: [&given[0][5], &given[w][5]],
            },
        )
        .map_err(|e| anyhow::anyhow!("--host {arg}: {e}"))
    };
    let down = way(2)?;
    Ok(HostSpec {
        name: name.to_string(),
        up: way(1)?,
        down: (down != open_params()).then_some(down),
        accepts: None,
    })
}

/// One host of a lab, and its access link to the lab's switch.
#[derive(Debug, Clone)]
pub struct HostSpec {
    pub name: String,
    /// Host → switch.
    pub up: Params,
    /// Switch → host; None: open.
    pub down: Option<Params>,
    /// What it takes new connections on (None: everything).
    pub accepts: Option<firewall::Accepts>,
}

/// The hosts of a lab and their links.
#[derive(Debug, Clone)]
pub struct Topology {
    pub scenario: Option<String>,
    pub mtu: u16,
    pub hosts: Vec<HostSpec>,
    /// Two hosts joined by one link (`left` and `right`): its report speaks of up and down.
    pub pair: bool,
}

impl Topology {
    /// `left` and `right`, each uplink the whole of its direction.
    pub fn pair(spec: &LinkSpec) -> Topology {
        let host = |name: &str, up: &Params, accepts: &Option<firewall::Accepts>| HostSpec {
            name: name.to_string(),
            up: up.clone(),
            down: None,
            accepts: accepts.clone(),
        };
        Topology {
            scenario: spec.scenario.clone(),
            mtu: spec.mtu,
            hosts: vec![
                host("left", &spec.up, &spec.firewall.left),
                host("right", &spec.down, &spec.firewall.right),
            ],
            pair: true,
        }
    }

    fn names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.clone()).collect()
    }
}

/// Overrides that apply to both directions of a scenario (`braid bench`).
#[derive(Debug, Clone, Default)]
pub struct BothWays {
    pub mtu: Option<u16>,
    pub rate: Option<String>,
    pub delay: Option<String>,
    pub queue: Option<String>,
    pub loss: Option<String>,
}

/// The resolved link.
#[derive(Clone)]
pub struct LinkSpec {
    pub scenario: Option<String>,
    pub mtu: u16,
    pub up: Params,
    pub down: Params,
    pub firewall: Firewall,
}

/// What each host takes new connections on (None: everything).
#[derive(Debug, Clone, Default)]
pub struct Firewall {
    pub left: Option<firewall::Accepts>,
    pub right: Option<firewall::Accepts>,
}

impl LinkSpec {
    /// Scenario `name` with `o` applied to both directions.
    pub fn scenario_with(name: &str, o: &BothWays) -> Result<LinkSpec> {
        let s = scenario::find(name).map_err(anyhow::Error::msg)?;
        let none = &None;
        let both = |p: Params| {
            apply(
                p,
                Overrides {
                    rate: [&o.rate, none],
                    delay: [&o.delay, none],
                    queue: [&o.queue, none],
                    loss: [&o.loss, none],
                    ber: [none, none],
                    corrupt: [none, none],
                },
            )
            .map_err(anyhow::Error::msg)
        };
        if let Some(m) = o.mtu
            && !(576..=65535).contains(&m)
        {
            bail!("--mtu {m}: use 576 to 65535");
        }
        Ok(LinkSpec {
            scenario: Some(name.to_string()),
            mtu: o.mtu.unwrap_or(s.mtu),
            up: both(s.up)?,
            down: both(s.down)?,
            firewall: Firewall::default(),
        })
    }
}

impl LinkArgs {
    /// The lab these arguments describe: two hosts and a link, or the hosts of `--host`.
    pub fn topology(&self) -> Result<Topology> {
        if self.hosts.is_empty() {
            return Ok(Topology::pair(&self.spec()?));
        }
        let hosts = self
            .hosts
            .iter()
            .map(|h| parse_host(h))
            .collect::<Result<Vec<_>>>()?;
        if hosts.len() < 2 {
            bail!("--host: a lab has at least two hosts (give --host once per host)");
        }
        let mtu = self.mtu.unwrap_or(1500);
        if !(576..=65535).contains(&mtu) {
            bail!("--mtu {mtu}: use 576 to 65535");
        }
        Ok(Topology {
            scenario: None,
            mtu,
            hosts,
            pair: false,
        })
    }

    pub fn spec(&self) -> Result<LinkSpec> {
        let (mut mtu, up, down) = match &self.scenario {
            Some(name) => {
                let s = scenario::find(name).map_err(anyhow::Error::msg)?;
                (s.mtu, s.up, s.down)
            }
            None => (1500, open_params(), open_params()),
        };
        if let Some(m) = self.mtu {
            if !(576..=65535).contains(&m) {
                bail!("--mtu {m}: use 576 to 65535");
            }
            mtu = m;
        }
        let up = apply(
            up,
            Overrides {
                rate: [&self.rate, &self.up_rate],
                delay: [&self.delay, &self.up_delay],
                queue: [&self.queue, &self.up_queue],
                loss: [&self.loss, &self.up_loss],
                ber: [&self.ber, &self.up_ber],
                corrupt: [&self.corrupt, &self.up_corrupt],
            },
        )
        .map_err(anyhow::Error::msg)?;
        let down = apply(
            down,
            Overrides {
                rate: [&self.rate, &self.down_rate],
                delay: [&self.delay, &self.down_delay],
                queue: [&self.queue, &self.down_queue],
                loss: [&self.loss, &self.down_loss],
                ber: [&self.ber, &self.down_ber],
                corrupt: [&self.corrupt, &self.down_corrupt],
            },
        )
        .map_err(anyhow::Error::msg)?;
        Ok(LinkSpec {
            scenario: self.scenario.clone(),
            mtu,
            up,
            down,
            firewall: Firewall {
                left: self.left_accepts.clone(),
                right: self.right_accepts.clone(),
            },
        })
    }
}

/// The report at the end of a run (`--json`).
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub scenario: Option<String>,
    pub mtu: u16,
    pub seconds: f64,
    #[serde(flatten)]
    pub links: Links,
}

/// A two-host lab's link (up is left → right), or each host's link to the switch.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum Links {
    Pair { up: Box<Side>, down: Box<Side> },
    Star { hosts: Vec<HostSide> },
}

/// One host's access link (up is host → switch).
#[derive(Debug, serde::Serialize)]
pub struct HostSide {
    pub name: String,
    pub address: std::net::Ipv4Addr,
    pub up: Side,
    pub down: Side,
}

#[derive(Debug, serde::Serialize)]
pub struct Side {
    pub link: String,
    #[serde(flatten)]
    pub relay: relay::DirectionReport,
    /// Packets the sending host's TUN device dropped before the relay read them: drops
    /// outside the model, which make a run untrustworthy.
    pub device_drops: u64,
}

impl Report {
    /// Packets the TUN devices dropped before the relay read them.
    pub fn device_drops(&self) -> u64 {
        self.sides().iter().map(|(_, s)| s.device_drops).sum()
    }

    fn sides(&self) -> Vec<(String, &Side)> {
        match &self.links {
            Links::Pair { up, down } => vec![
                ("up (left → right)".into(), &**up),
                ("down (right → left)".into(), &**down),
            ],
            Links::Star { hosts } => hosts
                .iter()
                .flat_map(|h| {
                    [
                        (format!("{} ({}) up", h.name, h.address), &h.up),
                        (format!("{} down", h.name), &h.down),
                    ]
                })
                .collect(),
        }
    }

    fn print(&self) {
        eprintln!(
            "braid lab: {:.1} s, MTU {}{}",
            self.seconds,
            self.mtu,
            self.scenario
                .as_ref()
                .map_or(String::new(), |s| format!(", scenario {s}"))
        );
        for (dir, side) in self.sides() {
            let c = &side.relay.counters;
            eprintln!("  {dir}: {}", side.link);
            eprintln!(
                "    arrived {} pkts / {} B; queue drops {}; lost {}; corrupted {}; delivered {} pkts / {} B; max queueing delay {:.1} ms; device drops {}",
                c.arrived_packets,
                c.arrived_bytes,
                c.queue_drops,
                c.lost,
                c.corrupted,
                c.delivered_packets,
                c.delivered_bytes,
                c.max_queue_delay_us as f64 / 1000.0,
                side.device_drops
            );
            if side.relay.firewall_drops > 0 {
                eprintln!(
                    "    connection openings dropped by the firewall: {}",
                    side.relay.firewall_drops
                );
            }
            if side.relay.unroutable > 0 {
                eprintln!(
                    "    packets for addresses no host has: {}",
                    side.relay.unroutable
                );
            }
        }
    }
}

/// A lab with its relay running.
pub struct Running {
    lab: hosts::Lab,
    relay: relay::Relay,
    pub topology: Topology,
    started: Instant,
}

impl Running {
    fn start(args: &LinkArgs) -> Result<Running> {
        let topology = args.topology()?;
        let log = match &args.log {
            Some(path) => {
                let f = std::fs::File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                Some(Arc::new(std::sync::Mutex::new(std::io::BufWriter::new(f))))
            }
            None => None,
        };
        Running::with_hosts(&args.name, topology, args.seed, log)
    }

    /// Brings up two-host lab `name` with the link `spec`; everything is removed when the
    /// result is stopped or dropped.
    pub fn up(
        name: &str,
        spec: LinkSpec,
        seed: u64,
        log: Option<relay::PacketLog>,
    ) -> Result<Running> {
        Running::with_hosts(name, Topology::pair(&spec), seed, log)
    }

    /// Brings up lab `name` with the hosts and links of `topology`.
    pub fn with_hosts(
        name: &str,
        topology: Topology,
        seed: u64,
        log: Option<relay::PacketLog>,
    ) -> Result<Running> {
        let lab = hosts::Lab::up(name, &topology.names(), topology.mtu)?;
        // In a two-host lab the packet log names the directions up and down.
        let labels = |h: &HostSpec| match (topology.pair, h.name.as_str()) {
            (true, "left") => ("up".to_string(), "-".to_string()),
            (true, _) => ("down".to_string(), "-".to_string()),
            (false, name) => (format!("{name}-up"), format!("{name}-down")),
        };
        let ports = topology
            .hosts
            .iter()
            .zip(&lab.devices)
            .enumerate()
            .map(|(i, (h, device))| relay::Port {
                device: device.clone(),
                address: hosts::address(i),
                labels: labels(h),
                up: h.up.clone(),
                down: h.down.clone(),
                accepts: h.accepts.clone(),
            })
            .collect();
        let relay = relay::Relay::start(ports, seed, log).context("cannot start the relay")?;
        Ok(Running {
            lab,
            relay,
            topology,
            started: Instant::now(),
        })
    }

    /// A command to run in host `host` of this lab.
    pub fn command(&self, host: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &hosts::namespace(&self.lab.name, host),
            program,
        ]);
        c
    }

    pub fn stop(self) -> Report {
        let seconds = self.started.elapsed().as_secs_f64();
        let drops = self.lab.device_drops();
        let reports = self.relay.stop();
        drop(self.lab);
        let t = &self.topology;
        let side = |params: Option<&Params>, relay: relay::DirectionReport, device_drops| Side {
            link: params.map_or("open".to_string(), scenario::describe),
            relay,
            device_drops,
        };
        let links = if t.pair {
            let mut r = reports.into_iter().map(|r| r.up);
            Links::Pair {
                up: Box::new(side(
                    Some(&t.hosts[0].up),
                    r.next().unwrap_or_default(),
                    drops.first().copied().unwrap_or(0),
                )),
                down: Box::new(side(
                    Some(&t.hosts[1].up),
                    r.next().unwrap_or_default(),
                    drops.get(1).copied().unwrap_or(0),
                )),
            }
        } else {
            Links::Star {
                hosts: t
                    .hosts
                    .iter()
                    .zip(reports)
                    .enumerate()
                    .map(|(i, (h, r))| HostSide {
                        name: h.name.clone(),
                        address: hosts::address(i),
                        up: side(Some(&h.up), r.up, drops.get(i).copied().unwrap_or(0)),
                        down: side(h.down.as_ref(), r.down, 0),
                    })
                    .collect(),
            }
        };
        Report {
            scenario: t.scenario.clone(),
            mtu: t.mtu,
            seconds,
            links,
        }
    }
}

/// Ctrl-C and SIGTERM set a flag; the lab then stops and removes everything it made.
fn stop_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, flag.clone());
    }
    flag
}

/// Prints the report; a run with drops outside the model fails.
fn finish(report: &Report, json: bool) -> Result<u8> {
    report.print();
    if json {
        println!("{}", serde_json::to_string(report)?);
    }
    if report.device_drops() > 0 {
        eprintln!(
            "braid lab: ERROR: the TUN devices dropped {} packets before the emulator saw them \
             (the relay fell behind): these losses are not part of the model, so this run's \
             numbers cannot be trusted. Use a lower rate or a larger MTU.",
            report.device_drops()
        );
        return Ok(1);
    }
    Ok(0)
}

pub fn main(cmd: LabCmd) -> Result<u8> {
    match cmd {
        LabCmd::Link { link, duration } => {
            let stop = stop_flag();
            let running = Running::start(&link)?;
            let t = &running.topology;
            let names: Vec<String> = t
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| format!("{} {}", h.name, hosts::address(i)))
                .collect();
            eprintln!(
                "braid lab {}: {} are up (MTU {}); run commands with `braid lab exec --name {} {} -- CMD`; Ctrl-C stops",
                link.name,
                names.join(", "),
                t.mtu,
                link.name,
                t.hosts[0].name
            );
            let deadline = duration.map(|d| Instant::now() + Duration::from_secs_f64(d.max(0.0)));
            while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
                std::thread::sleep(Duration::from_millis(50));
            }
            finish(&running.stop(), link.json)
        }
        LabCmd::Exec {
            name,
            host,
            command,
        } => {
            let ns = hosts::namespace(&name, &host);
            if !std::path::Path::new("/run/netns").join(&ns).exists() {
                match hosts::Record::read(&name) {
                    Some(r) if !r.hosts.contains(&host) => bail!(
                        "unknown host {host:?}: lab {name}'s hosts are {}",
                        r.hosts.join(", ")
                    ),
                    _ => bail!(
                        "no lab named {name} is running (start one with `braid lab link --name {name}`)"
                    ),
                }
            }
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(&command)
                .status()
                .context("cannot run ip netns exec")?;
            Ok(status.code().unwrap_or(1).clamp(0, 255) as u8)
        }
        LabCmd::Run {
            link,
            server,
            client,
            timeout,
        } => run_once(&link, &server, &client, timeout),
        LabCmd::Scenarios => {
            for s in scenario::all() {
                println!("{}\n  {}", s.name, s.about);
                println!("  MTU {}", s.mtu);
                println!("  up   (left → right): {}", scenario::describe(&s.up));
                println!("  down (right → left): {}", scenario::describe(&s.down));
            }
            Ok(0)
        }
        LabCmd::Clean => {
            let (removed, running) = hosts::clean()?;
            for name in &removed {
                eprintln!("braid lab: removed lab {name}");
            }
            for name in &running {
                eprintln!("braid lab: {name} is running; stop it with Ctrl-C where it runs");
            }
            if removed.is_empty() && running.is_empty() {
                eprintln!("braid lab: nothing to clean");
            }
            Ok(0)
        }
    }
}

/// Output of one side of a one-shot run.
#[derive(Debug, serde::Serialize)]
struct Ran {
    exit: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run_once(args: &LinkArgs, server: &str, client: &str, timeout: f64) -> Result<u8> {
    if !args.hosts.is_empty() {
        bail!(
            "lab run puts its server in right and its client in left: with --host, start the \
             lab with `braid lab link` and run commands with `braid lab exec`"
        );
    }
    let stop = stop_flag();
    let running = Running::start(args)?;
    // Output goes to unnamed temporary files: a pipe nobody reads would stall a chatty command.
    let in_host = |host: &str, cmd: &str| -> Result<Child> {
        let (out, err) = (tempfile::tempfile()?, tempfile::tempfile()?);
        let child = running
            .command(host, "sh")
            .args(["-c", cmd])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(err.try_clone()?)
            .spawn()?;
        Ok(Child { child, out, err })
    };
    let mut server_child = in_host("right", server).context("cannot start the server command")?;
    // Let the server bind before the client connects.
    std::thread::sleep(Duration::from_millis(300));
    let mut client_child = in_host("left", client).context("cannot start the client command")?;
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
    let mut timed_out = false;
    while client_child.child.try_wait()?.is_none() {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            timed_out = !stop.load(Ordering::Relaxed);
            let _ = client_child.child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client_out = client_child.collect();
    // The server gets a moment to finish on its own (e.g. `iperf3 -s -1` after its one test),
    // then the lab's teardown stops whatever is left.
    let grace = Instant::now() + Duration::from_secs(2);
    while server_child.child.try_wait()?.is_none() && Instant::now() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = running.stop();
    let server_out = server_child.collect();
    if args.json {
        let all = serde_json::json!({
            "client": client_out,
            "server": server_out,
            "link": report,
        });
        println!("{all}");
    } else {
        println!(
            "== client (left) exit {:?}\n{}{}",
            client_out.exit, client_out.stdout, client_out.stderr
        );
        println!(
            "== server (right) exit {:?}\n{}{}",
            server_out.exit, server_out.stdout, server_out.stderr
        );
    }
    let code = finish(&report, false)?;
    if timed_out {
        eprintln!(
            "braid lab: the client command ran longer than --timeout {timeout} s and was stopped"
        );
        return Ok(1);
    }
    if code != 0 {
        return Ok(code);
    }
    Ok(client_out.exit.unwrap_or(1).clamp(0, 255) as u8)
}

/// A command running in a host, its output going to temporary files.
struct Child {
    child: std::process::Child,
    out: std::fs::File,
    err: std::fs::File,
}

impl Child {
    fn collect(mut self) -> Ran {
        use std::io::{Read, Seek};
        let exit = self.child.wait().ok().and_then(|s| s.code());
        let read = |f: &mut std::fs::File| {
            let mut s = String::new();
            let _ = f.rewind().and_then(|_| f.read_to_string(&mut s));
            s
        };
        Ran {
            exit,
            stdout: read(&mut self.out),
            stderr: read(&mut self.err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_link_applies_both_ways_then_one_way_and_open_downlinks_are_none() {
        let h = parse_host("dn1:rate=100mbit,delay=10ms,up-delay=2ms,down-loss=1e-3").unwrap();
        assert_eq!(h.name, "dn1");
        assert_eq!(h.up.rate, Some(100_000_000));
        assert_eq!(h.up.delay, 2_000_000);
        assert_eq!(h.up.loss, Loss::None);
        let down = h.down.unwrap();
        assert_eq!((down.rate, down.delay), (Some(100_000_000), 10_000_000));
        assert_eq!(down.loss, Loss::Random(1e-3));
        // A host with no link, or an open downlink, skips the downlink's model.
        assert!(parse_host("client").unwrap().down.is_none());
        assert!(parse_host("c:up-rate=1mbit").unwrap().down.is_none());
    }

    #[test]
    fn a_bad_host_argument_says_what_is_wrong() {
        for (arg, says) in [
            ("Dn1", "lowercase"),
            ("1dn", "starting with a letter"),
            ("dn1:speed=1mbit", "unknown key \"speed\""),
            ("dn1:rate", "not KEY=VALUE"),
            ("dn1:rate=1mbit,rate=2mbit", "given twice"),
            ("dn1:loss=1e-3,ber=1e-6", "loss or ber"),
            ("dn1:rate=fast", "--host dn1:rate=fast"),
        ] {
            let e = format!("{:#}", parse_host(arg).unwrap_err());
            assert!(e.contains(says), "{arg}: {e}");
        }
    }
}
