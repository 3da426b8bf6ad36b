//! One run of one cell in the lab: the tool's client in `left` against its server in
//! `right`, with ping across the link the whole time. Reads the tools' own JSON reports.

use super::grid::{Cell, Direction, Kermit, Streams, Tool};
use crate::lab::Running;
use serde::Serialize;
use std::io::{Read, Seek};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The lab's server host.
pub const SERVER: &str = "198.18.0.2";

/// The servers' ports.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ports {
    pub ftp: u16,
    pub vsftpd: u16,
    pub gridftp: u16,
    pub iperf: u16,
    pub kermit: u16,
}

impl Ports {
    /// In the lab's own host nothing else listens: the usual ports (Kermit's is 1649).
    pub const LAB: Ports = Ports {
        ftp: 2121,
        vsftpd: 2122,
        gridftp: 2811,
        iperf: 5201,
        kermit: 1649,
    };

    /// Ports free on loopback now: five listeners bound at once, then closed.
    pub fn free() -> std::io::Result<Ports> {
        let ls: Vec<std::net::TcpListener> = (0..5)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<_>>()?;
        let p: Vec<u16> = ls
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<_>>()?;
        Ok(Ports {
            ftp: p[0],
            vsftpd: p[1],
            gridftp: p[2],
            iperf: p[3],
            kermit: p[4],
        })
    }
}
/// Pings every 200 ms: five samples a second, 84 bytes each, too little to load even the
/// 14.4 kbit/s link much.
const PING_INTERVAL: &str = "0.2";

/// What the sending side's kernel said about why it could not send faster (`TCP_INFO`, all
/// data connections together), for braid uploads.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SenderLimits {
    pub busy_ms: f64,
    /// Waiting for the receiver's window.
    pub rwnd_limited_ms: f64,
    /// Waiting for room in its own send buffer.
    pub sndbuf_limited_ms: f64,
}

impl SenderLimits {
    /// Which limit held the sender for most of its busy time, when one held it for at
    /// least a fifth.
    pub fn dominant(&self) -> Option<&'static str> {
        if self.busy_ms <= 0.0 {
            return None;
        }
        let (name, ms) = if self.rwnd_limited_ms >= self.sndbuf_limited_ms {
            ("receive window", self.rwnd_limited_ms)
        } else {
            ("send buffer", self.sndbuf_limited_ms)
        };
        (ms / self.busy_ms >= 0.2).then_some(name)
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Measured {
    /// Why the run gave no number.
    pub error: Option<String>,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Data connections the tool used (braid's -n auto decides for itself).
    pub streams: Option<u32>,
    pub retransmits: Option<u64>,
    pub sender: Option<SenderLimits>,
    /// Ping RTTs during the run: (seconds since the benchmark started, ms).
    pub ping: Vec<(f64, f64)>,
    /// The whole command by the clock (login and all).
    pub wall_seconds: f64,
}

/// A child whose output goes to unnamed temporary files (a pipe nobody reads would stall it).
struct Captured {
    child: Child,
    out: std::fs::File,
    err: std::fs::File,
}

impl Captured {
    fn spawn(mut cmd: Command) -> std::io::Result<Captured> {
        let (out, err) = (tempfile::tempfile()?, tempfile::tempfile()?);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(err.try_clone()?)
            .spawn()?;
        Ok(Captured { child, out, err })
    }

    /// Stops the child if it still runs; its exit status and output.
    fn finish(mut self) -> (Option<std::process::ExitStatus>, String, String) {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let read = |f: &mut std::fs::File| {
            let mut s = String::new();
            let _ = f.rewind().and_then(|_| f.read_to_string(&mut s));
            s
        };
        (status, read(&mut self.out), read(&mut self.err))
    }
}

/// Servers running in `right` for a scenario; stopped when dropped.
pub struct Servers {
    children: Vec<Child>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        // Each server leads its own process group: its children (a forking server, the
        // Kermit server's restart loop) go with it.
        for c in &mut self.children {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (at most 10 s) until something on the servers' host listens on `port`.
fn wait_listening(place: &Place, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = place
            .server_command("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!(
        "nothing listens on {}:{port} after 10 s: the server did not start",
        place.server_addr()
    )
}

/// A program by name: on PATH, or in /usr/sbin and /sbin (servers live there and root's
/// PATH under sudo may lack them).
pub fn find_program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The servers the `tools` need, in the lab's `right` or on loopback: braid serve always,
/// iperf3 -s, vsftpd (anonymous, uploads allowed, `root` as its directory), a Kermit server
/// and globus-gridftp-server.
pub fn start_servers(
    place: &Place,
    ports: Ports,
    braid: &std::path::Path,
    work: &std::path::Path,
    root: &std::path::Path,
    tools: &[Tool],
) -> anyhow::Result<Servers> {
    let mut servers = Servers {
        children: Vec::new(),
    };
    let mut start = |mut cmd: Command, port: u16| -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        servers.children.push(cmd.spawn()?);
        wait_listening(place, port)
    };
    let addr = place.server_addr().to_string();
    let mut serve = place.server_command(&braid.to_string_lossy());
    serve
        .args(["serve", "--anonymous-write", "--root"])
        .arg(root)
        .args(["--listen", &format!("{addr}:{}", ports.ftp)]);
    start(serve, ports.ftp)?;
    let program = |name: &str| {
        find_program(name).map_or_else(|| name.to_string(), |p| p.display().to_string())
    };
    if tools.contains(&Tool::Iperf3) {
        let mut c = place.server_command(&program("iperf3"));
        c.args(["-s", "-B", &addr, "-p", &ports.iperf.to_string()]);
        start(c, ports.iperf)?;
    }
    if tools.contains(&Tool::Lftp) || tools.contains(&Tool::Curl) {
        // Run as its launching user, vsftpd does not chroot: anon_root is where paths start.
        let empty = work.join("vsftpd-empty");
        std::fs::create_dir_all(&empty)?;
        let conf = work.join("vsftpd.conf");
        std::fs::write(
            &conf,
            format!(
                "listen=YES\nlisten_ipv6=NO\nlisten_address={addr}\nlisten_port={}\n\
                 background=NO\nanonymous_enable=YES\nlocal_enable=NO\nanon_root={}\n\
                 no_anon_password=YES\nseccomp_sandbox=NO\nrun_as_launching_user=YES\n\
                 write_enable=YES\nanon_upload_enable=YES\nanon_other_write_enable=YES\n\
                 anon_umask=022\nmax_clients=0\nmax_per_ip=0\npasv_enable=YES\n\
                 pasv_address={addr}\nsecure_chroot_dir={}\n",
                ports.vsftpd,
                root.display(),
                empty.display()
            ),
        )?;
        let mut c = place.server_command(&program("vsftpd"));
        c.arg(&conf);
        start(c, ports.vsftpd)?;
    }
    if tools.contains(&Tool::Kermit) {
        // A Kermit server takes one connection and ends with the client's FINISH: start it
        // again after each, accepting packets up to 9024 bytes and 32 window slots (the
        // client's settings then decide).
        let mut c = place.server_command("sh");
        c.current_dir(root).args([
            "-c",
            &format!(
                "while :; do {} -Y -q -C 'set host * {} /raw-socket, set file type binary, \
                 set window 32, set receive packet-length 9024, server' </dev/null; done",
                program("kermit"),
                ports.kermit
            ),
        ]);
        start(c, ports.kermit)?;
    }
    if tools.contains(&Tool::GlobusUrlCopy) {
        // Anonymous users act as the user running the benchmark.
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let mut c = place.server_command(&program("globus-gridftp-server"));
        c.args(["-aa", "-anonymous-user", &user, "-auth-level", "0"])
            .args(["-p", &ports.gridftp.to_string()])
            .args(["-control-interface", &addr, "-data-interface", &addr])
            .arg("-home-dir")
            .arg(root)
            .args(["-allow-root", "-log-level", "ERROR"]);
        start(c, ports.gridftp)?;
    }
    Ok(servers)
}

/// `[epoch] 64 bytes from ...: icmp_seq=1 ttl=64 time=21.6 ms` (ping -D) → (epoch, ms).
pub fn parse_ping_line(line: &str) -> Option<(f64, f64)> {
    let stamp = line.strip_prefix('[')?.split(']').next()?.parse().ok()?;
    let ms = line.split("time=").nth(1)?.split_whitespace().next()?;
    Some((stamp, ms.parse().ok()?))
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Where the clients run and what they reach.
pub enum Place<'a> {
    /// In the lab's `left`, against the servers in `right`.
    Lab(&'a Running),
    /// Clients and servers on this machine, over loopback.
    Loopback,
    /// On this machine, against a server somewhere else: `get` downloads `get_url`, `put`
    /// uploads to `put_url`.
    Remote {
        host: String,
        get_url: String,
        put_url: String,
        /// The size of the file at `get_url`, when a listing gave it.
        get_size: Option<u64>,
    },
}

impl Place<'_> {
    /// A client program.
    fn command(&self, program: &str) -> Command {
        match self {
            Place::Lab(lab) => lab.command("left", program),
            Place::Loopback | Place::Remote { .. } => Command::new(program),
        }
    }

    /// A program on the servers' host.
    fn server_command(&self, program: &str) -> Command {
        match self {
            Place::Lab(lab) => lab.command("right", program),
            Place::Loopback | Place::Remote { .. } => Command::new(program),
        }
    }

    /// Where clients reach the servers.
    pub fn server_addr(&self) -> &str {
        match self {
            Place::Lab(_) => SERVER,
            Place::Loopback => "127.0.0.1",
            Place::Remote { host, .. } => host,
        }
    }

    fn ping_target(&self) -> &str {
        self.server_addr()
    }
}

fn ping(place: &Place) -> std::io::Result<Captured> {
    let mut c = place.command("ping");
    c.args([
        "-n",
        "-D",
        "-i",
        PING_INTERVAL,
        "-W",
        "30",
        place.ping_target(),
    ]);
    Captured::spawn(c)
}

/// Ping RTTs in `text`, on the benchmark's clock (`epoch` is its start, Unix seconds).
fn ping_samples(text: &str, epoch: f64) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(parse_ping_line)
        .map(|(t, ms)| (t - epoch, ms))
        .collect()
}

/// Ping alone for `seconds`: the idle link's RTT.
pub fn idle_ping(place: &Place, seconds: f64, epoch: f64) -> anyhow::Result<Vec<(f64, f64)>> {
    let p = ping(place)?;
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (_, out, _) = p.finish();
    Ok(ping_samples(&out, epoch))
}

/// Where a run's time comes from.
enum Timing {
    /// The tool's own report on stdout, of its data phase.
    Own,
    /// The whole command by the clock, less the tool's setup time on this link.
    Wall,
}

/// What a benchmark run needs to know.
pub struct Context<'a> {
    pub place: Place<'a>,
    pub ports: Ports,
    pub braid: &'a std::path::Path,
    /// The served directory; `bench.bin` (the payload) and `tiny.bin` (1 byte) are in it.
    pub root: &'a std::path::Path,
    /// Scratch space for downloads that cannot go to /dev/null.
    pub work: &'a std::path::Path,
    pub size: u64,
    /// The benchmark's start, Unix seconds.
    pub epoch: f64,
    pub timeout: Duration,
    pub stop: &'a AtomicBool,
    /// Congestion control for braid's and iperf3's sending side.
    pub congestion: Option<&'a str>,
}

impl Context<'_> {
    /// The client command for a cell, moving `name` (a file in the served directory).
    fn client(&self, cell: &Cell, name: &str) -> (Command, Timing) {
        let (mut cmd, timing) = self.bare_client(cell, name);
        if !cell.nice {
            return (cmd, timing);
        }
        // ip netns exec NS nice -n 19 PROGRAM ARGS...
        let mut args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_owned()).collect();
        args.splice(3..3, ["nice".into(), "-n".into(), "19".into()]);
        let mut niced = Command::new(cmd.get_program());
        niced.args(args);
        cmd = niced;
        (cmd, timing)
    }

    fn bare_client(&self, cell: &Cell, name: &str) -> (Command, Timing) {
        let place = &self.place;
        let remote = match place {
            Place::Remote {
                get_url, put_url, ..
            } => Some((get_url.as_str(), put_url.as_str())),
            Place::Lab(_) | Place::Loopback => None,
        };
        let server = place.server_addr();
        let ports = self.ports;
        // The URL a tool's client uses: the remote one, or its server's in the lab.
        let url = |port: u16, name: &str, dir: Direction| match (remote, dir) {
            (Some((get, _)), Direction::Get) => get.to_string(),
            (Some((_, put)), Direction::Put) => put.to_string(),
            (None, _) => format!("ftp://{server}:{port}/{name}"),
        };
        let local = self.root.join(name).display().to_string();
        let streams = match cell.streams {
            Streams::Fixed(n) => n,
            Streams::Auto => 1,
        };
        match cell.tool {
            Tool::Braid => {
                let mut c = place.command(&self.braid.to_string_lossy());
                let get = url(ports.ftp, name, Direction::Get);
                let put = url(ports.ftp, "put-braid.bin", Direction::Put);
                match cell.direction {
                    Direction::Get => c.args(["get", "-q", "--json", &get, "/dev/null"]),
                    Direction::Put => c.args(["put", "-q", "--json", &local, &put]),
                };
                c.args(["-n", &cell.streams.label()]);
                if let Some(b) = cell.buffer {
                    c.args(["--buffer", &b.to_string()]);
                }
                if let Some(b) = cell.block {
                    c.args(["--block-size", &b.to_string()]);
                }
                if let Some(cc) = self.congestion {
                    c.args(["--congestion", cc]);
                }
                (c, Timing::Own)
            }
            Tool::Iperf3 => {
                let mut c = place.command("iperf3");
                c.args(["-c", server, "-p", &ports.iperf.to_string(), "-J"]);
                c.args(["-n", &self.size.to_string(), "-P", &streams.to_string()]);
                if let Some(b) = cell.buffer {
                    c.args(["-w", &b.to_string()]);
                }
                if cell.direction == Direction::Get {
                    c.arg("-R");
                }
                if let Some(cc) = self.congestion {
                    c.args(["-C", cc]);
                }
                (c, Timing::Own)
            }
            Tool::Curl => {
                let mut c = place.command("curl");
                c.args([
                    "-sS",
                    "-w",
                    "%{size_download} %{size_upload} %{time_pretransfer} %{time_total}",
                ]);
                let get = url(ports.vsftpd, name, Direction::Get);
                let put = url(ports.vsftpd, "put-curl.bin", Direction::Put);
                match cell.direction {
                    Direction::Get => c.args(["-o", "/dev/null", &get]),
                    Direction::Put => c.args(["-T", &local, &put]),
                };
                (c, Timing::Own)
            }
            Tool::Lftp => {
                let mut script = String::from("set net:max-retries 1; set xfer:clobber on; ");
                if let Some(b) = cell.buffer {
                    script += &format!("set net:socket-buffer {b}; ");
                }
                let out = self.work.join("lftp.bin").display().to_string();
                // Whole URLs, so the same script reaches the lab's vsftpd or a remote server.
                let get = url(ports.vsftpd, name, Direction::Get);
                let put = url(ports.vsftpd, "put-lftp.bin", Direction::Put);
                script += &match (cell.direction, streams) {
                    (Direction::Get, 1) => format!("get {get} -o {out}; quit"),
                    (Direction::Get, n) => format!("pget -n {n} {get} -o {out}; quit"),
                    (Direction::Put, _) => format!("put {local} -o {put}; quit"),
                };
                let mut c = place.command("lftp");
                c.args(["-e", &script]);
                (c, Timing::Wall)
            }
            Tool::Kermit => {
                let k = cell.kermit.unwrap_or(Kermit {
                    window: 1,
                    packet: 9024,
                    streaming: true,
                });
                let out = self.work.join("kermit.bin").display().to_string();
                let transfer = match cell.direction {
                    Direction::Get => format!("get {name} {out}"),
                    Direction::Put => format!("send {local} put-kermit.bin"),
                };
                let script = format!(
                    "set host {server} {} /raw-socket, set file type binary, \
                     set file collision overwrite, set window {}, set receive packet-length {p}, \
                     set send packet-length {p}, set streaming {}, {transfer}, if fail exit 1, \
                     finish, exit 0",
                    ports.kermit,
                    k.window,
                    if k.streaming { "on" } else { "off" },
                    p = k.packet,
                );
                let mut c = place.command("kermit");
                c.args(["-Y", "-q", "-C", &script]);
                (c, Timing::Wall)
            }
            Tool::GlobusUrlCopy => {
                let mut c = place.command("globus-url-copy");
                c.args(["-p", &streams.to_string()]);
                if let Some(b) = cell.buffer {
                    c.args(["-tcp-bs", &b.to_string()]);
                }
                let remote = |path: &str| format!("ftp://{server}:{}{path}", ports.gridftp);
                match cell.direction {
                    Direction::Get => c.args([remote(&local), "file:///dev/null".into()]),
                    Direction::Put => c.args([
                        format!("file://{local}"),
                        remote(&self.root.join("put-globus.bin").display().to_string()),
                    ]),
                };
                (c, Timing::Wall)
            }
        }
    }

    /// What a wall-timed tool spends on a 1-byte file in this direction (login, commands,
    /// connections): the least of two tries. None for tools that time themselves.
    pub fn setup_seconds(&self, cell: &Cell) -> Option<f64> {
        // A remote server has no 1-byte file to fetch.
        if matches!(self.place, Place::Remote { .. })
            || !matches!(self.client(cell, "tiny.bin").1, Timing::Wall)
        {
            return None;
        }
        let once = || {
            let (m, secs) = self.execute(cell, "tiny.bin", None);
            m.error.is_none().then_some(secs)
        };
        let tries: Vec<f64> = (0..2).filter_map(|_| once()).collect();
        tries.into_iter().reduce(f64::min)
    }

    /// Runs `cell` once with ping across the link, moving the payload; `setup` is what a
    /// wall-timed tool spends besides the data. Stops early when `stop` is set or after the
    /// timeout.
    pub fn run(&self, cell: &Cell, setup: Option<f64>) -> Measured {
        let pinger = ping(&self.place);
        let (mut m, _) = self.execute(cell, "bench.bin", setup);
        if let Ok(p) = pinger {
            let (_, out, _) = p.finish();
            m.ping = ping_samples(&out, self.epoch);
        }
        m
    }

    /// Runs the client for `name`; the measurement and the command's wall time.
    fn execute(&self, cell: &Cell, name: &str, setup: Option<f64>) -> (Measured, f64) {
        // The Kermit server restarts after each client: wait until it listens again.
        if cell.tool == Tool::Kermit
            && !matches!(self.place, Place::Remote { .. })
            && let Err(e) = wait_listening(&self.place, self.ports.kermit)
        {
            let m = Measured {
                error: Some(e.to_string()),
                ..Measured::default()
            };
            return (m, 0.0);
        }
        let (cmd, timing) = self.client(cell, name);
        let started = Instant::now();
        let mut child = match Captured::spawn(cmd) {
            Ok(c) => c,
            Err(e) => {
                let m = Measured {
                    error: Some(format!("cannot start {}: {e}", cell.tool.name())),
                    ..Measured::default()
                };
                return (m, 0.0);
            }
        };
        let mut why = None;
        loop {
            match child.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => {
                    why = Some(format!("cannot wait for the client: {e}"));
                    break;
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if started.elapsed() > self.timeout {
                why = Some(format!("ran longer than {} s", self.timeout.as_secs()));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let wall = started.elapsed().as_secs_f64();
        let (status, out, err) = child.finish();
        // Ctrl-C at a terminal reaches the client too, which then fails on its own.
        if self.stop.load(Ordering::Relaxed) {
            why = Some("interrupted".into());
        }
        let mut m = match why {
            Some(e) => Measured {
                error: Some(e),
                ..Measured::default()
            },
            None if !status.is_some_and(|s| s.success()) => Measured {
                error: Some(format!(
                    "{} failed ({}): {}",
                    cell.tool.name(),
                    status.map_or("killed".into(), |s| s.to_string()),
                    err.trim().lines().last().unwrap_or("no message")
                )),
                ..Measured::default()
            },
            None => match (cell.tool, timing) {
                (Tool::Braid, _) => parse_braid(&out),
                (Tool::Iperf3, _) => parse_iperf3(&out),
                (Tool::Curl, _) => parse_curl(&out),
                (_, _) => {
                    let seconds = (wall - setup.unwrap_or(0.0)).max(1e-6);
                    let bytes = match (&self.place, cell.direction) {
                        (Place::Remote { get_size, .. }, Direction::Get) => get_size.unwrap_or(0),
                        _ => self.size,
                    };
                    Measured {
                        error: (bytes == 0).then(|| "the remote file's size is unknown".into()),
                        bytes,
                        seconds,
                        bytes_per_second: bytes as f64 / seconds,
                        streams: None,
                        ..Measured::default()
                    }
                }
            },
        };
        m.wall_seconds = wall;
        (m, wall)
    }
}

/// curl's `-w "%{size_download} %{size_upload} %{time_pretransfer} %{time_total}"`: the time
/// from the transfer command to the end, as braid times itself.
pub fn parse_curl(stdout: &str) -> Measured {
    let v: Vec<f64> = stdout
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [down, up, pre, total] = v[..] else {
        return Measured {
            error: Some(format!("curl printed {stdout:?}, not its four numbers")),
            ..Measured::default()
        };
    };
    let bytes = down.max(up);
    let seconds = (total - pre).max(1e-6);
    Measured {
        bytes: bytes as u64,
        seconds,
        bytes_per_second: bytes / seconds,
        streams: Some(1),
        ..Measured::default()
    }
}

/// The last JSON line of `braid get|put --json`: bytes, seconds, connections, and for
/// uploads the kernel's sender-side limits from each connection's last timeline row.
pub fn parse_braid(stdout: &str) -> Measured {
    let Some(v) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        return Measured {
            error: Some("braid printed no JSON summary".into()),
            ..Measured::default()
        };
    };
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let mut m = Measured {
        bytes: f("bytes").unwrap_or(0.0) as u64,
        seconds: f("seconds").unwrap_or(0.0),
        bytes_per_second: f("bytes_per_second").unwrap_or(0.0),
        streams: f("streams").map(|s| s as u32),
        ..Measured::default()
    };
    if let Some(rows) = v.get("timeline").and_then(|t| t.as_array()) {
        // Each connection's last row holds its totals.
        let mut last = std::collections::BTreeMap::new();
        for r in rows {
            if let Some(c) = r.get("conn").and_then(|c| c.as_u64()) {
                last.insert(c, r);
            }
        }
        let sum = |k: &str| -> Option<f64> {
            let vals: Vec<f64> = last
                .values()
                .filter_map(|r| r.get(k).and_then(|x| x.as_f64()))
                .collect();
            (!vals.is_empty()).then(|| vals.iter().sum())
        };
        m.retransmits = sum("retransmits").map(|r| r as u64);
        // A receiver's TCP_INFO has no sending time: only an upload says anything here.
        if let Some(busy) = sum("busy_ms").filter(|b| *b > 0.0) {
            m.sender = Some(SenderLimits {
                busy_ms: busy,
                rwnd_limited_ms: sum("rwnd_limited_ms").unwrap_or(0.0),
                sndbuf_limited_ms: sum("sndbuf_limited_ms").unwrap_or(0.0),
            });
        }
    }
    // A download: the braid server's own report of its sending.
    let sender = &v["sender"];
    if let Some(busy) = sender["busy_ms"].as_f64().filter(|b| *b > 0.0) {
        m.sender = Some(SenderLimits {
            busy_ms: busy,
            rwnd_limited_ms: sender["rwnd_limited_ms"].as_f64().unwrap_or(0.0),
            sndbuf_limited_ms: sender["sndbuf_limited_ms"].as_f64().unwrap_or(0.0),
        });
    }
    if m.seconds <= 0.0 {
        m.error = Some("braid's summary has no duration".into());
    }
    m
}

/// iperf3 -J: what the receiver got, and the sender's retransmissions.
pub fn parse_iperf3(stdout: &str) -> Measured {
    let v: serde_json::Value = match serde_json::from_str(stdout) {
        Ok(v) => v,
        Err(e) => {
            return Measured {
                error: Some(format!("iperf3 printed no JSON: {e}")),
                ..Measured::default()
            };
        }
    };
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Measured {
            error: Some(format!("iperf3: {e}")),
            ..Measured::default()
        };
    }
    let end = &v["end"];
    let got = &end["sum_received"];
    let seconds = got["seconds"].as_f64().unwrap_or(0.0);
    Measured {
        error: (seconds <= 0.0).then(|| "iperf3 reported no transfer".to_string()),
        bytes: got["bytes"].as_u64().unwrap_or(0),
        seconds,
        bytes_per_second: got["bits_per_second"].as_f64().unwrap_or(0.0) / 8.0,
        streams: end["streams"].as_array().map(|s| s.len() as u32),
        retransmits: end["sum_sent"]["retransmits"].as_u64(),
        ..Measured::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_lines() {
        assert_eq!(
            parse_ping_line(
                "[1732464000.250000] 64 bytes from 198.18.0.2: icmp_seq=3 ttl=64 time=21.6 ms"
            ),
            Some((1732464000.25, 21.6))
        );
        assert_eq!(
            parse_ping_line("PING 198.18.0.2 (198.18.0.2) 56(84) bytes of data."),
            None
        );
        assert_eq!(
            parse_ping_line(
                "[1732464000.250000] From 198.18.0.1 icmp_seq=3 Destination Host Unreachable"
            ),
            None
        );
    }

    #[test]
    fn braid_summary_and_sender_limits() {
        let out = r#"{"op":"put","bytes":4000000,"seconds":2.0,"bytes_per_second":2000000.0,"streams":2,"timeline":[
            {"t":1.0,"conn":0,"busy_ms":500.0,"rwnd_limited_ms":100.0,"sndbuf_limited_ms":0.0,"retransmits":1},
            {"t":2.0,"conn":0,"busy_ms":1000.0,"rwnd_limited_ms":600.0,"sndbuf_limited_ms":0.0,"retransmits":2},
            {"t":2.0,"conn":1,"busy_ms":900.0,"rwnd_limited_ms":500.0,"sndbuf_limited_ms":100.0,"retransmits":0}]}"#
            .replace('\n', "");
        let m = parse_braid(&format!("noise\n{out}\n"));
        assert_eq!(m.error, None);
        assert_eq!((m.bytes, m.seconds, m.streams), (4_000_000, 2.0, Some(2)));
        assert_eq!(m.retransmits, Some(2));
        let s = m.sender.unwrap();
        assert_eq!(
            (s.busy_ms, s.rwnd_limited_ms, s.sndbuf_limited_ms),
            (1900.0, 1100.0, 100.0)
        );
        assert_eq!(s.dominant(), Some("receive window"));
        assert!(parse_braid("not json").error.is_some());
        // A download carries the server's report instead.
        let get = r#"{"op":"get","bytes":10,"seconds":1.0,"bytes_per_second":10.0,"streams":1,
            "sender":{"sent":10,"resent":0,"busy_ms":900,"rwnd_limited_ms":0,"sndbuf_limited_ms":600}}"#
            .replace('\n', "");
        let s = parse_braid(&get).sender.unwrap();
        assert_eq!((s.busy_ms, s.sndbuf_limited_ms), (900.0, 600.0));
        assert_eq!(s.dominant(), Some("send buffer"));
    }

    #[test]
    fn curl_times_from_the_transfer_command() {
        let m = parse_curl("0 2000000 1.5 3.5");
        assert_eq!(m.error, None);
        assert_eq!(
            (m.bytes, m.seconds, m.bytes_per_second),
            (2_000_000, 2.0, 1_000_000.0)
        );
        assert!(parse_curl("oops").error.is_some());
    }

    #[test]
    fn iperf3_report() {
        let out = r#"{"start":{},"end":{"streams":[{},{}],"sum_sent":{"retransmits":7},
            "sum_received":{"bytes":1000000,"seconds":4.0,"bits_per_second":2000000.0}}}"#;
        let m = parse_iperf3(out);
        assert_eq!(m.error, None);
        assert_eq!(
            (m.bytes, m.seconds, m.bytes_per_second),
            (1_000_000, 4.0, 250_000.0)
        );
        assert_eq!((m.streams, m.retransmits), (Some(2), Some(7)));
        assert!(
            parse_iperf3(r#"{"error":"unable to connect"}"#)
                .error
                .is_some()
        );
    }
}
