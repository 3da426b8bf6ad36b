//! One run of one cell: the tool's client against its server, with ping across the link the
//! whole time.

use super::grid::{Cell, Direction, Kermit, Streams, Tool};
use super::parse::{Measured, parse_braid, parse_curl, parse_iperf3, parse_ping_line};
use super::servers::{Place, Ports, wait_listening};
use braid_proto::compress::Policy;
use std::io::{Read, Seek};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Pings every 200 ms: five samples a second, 84 bytes each, too little to load even the
/// 14.4 kbit/s link much.
const PING_INTERVAL: &str = "0.2";

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

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
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

/// CPU seconds a process has used, with those of its children it has waited for (a forking
/// server's sessions, the Kermit server's restarts): `/proc/PID/stat` fields 14-17.
fn process_cpu(pid: u32) -> Option<f64> {
    let fields = crate::lab::hosts::stat_fields(pid)?;
    let ticks: u64 = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    Some(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// What a benchmark run needs to know.
pub struct Context<'a> {
    pub place: Place<'a>,
    pub ports: Ports,
    /// The servers' processes, whose CPU time each run adds to its client's.
    pub server_pids: Vec<u32>,
    pub braid: &'a std::path::Path,
    /// The served directory; `bench.bin` (the payload) and `tiny.bin` (1 byte) are in it.
    pub root: &'a std::path::Path,
    /// Scratch space for downloads that cannot go to /dev/null.
    pub work: &'a std::path::Path,
    pub size: u64,
    /// `--files`: the payload is a tree of this many files of `size` bytes ([`TREE`]).
    pub files: Option<u64>,
    /// Runs so far, for the names of upload destinations (each tree goes somewhere new, so
    /// no tool finds it there already).
    pub serial: std::sync::atomic::AtomicU64,
    /// The benchmark's start, Unix seconds.
    pub epoch: f64,
    pub timeout: Duration,
    pub stop: &'a AtomicBool,
    /// Congestion control for braid's and iperf3's sending side.
    pub congestion: Option<&'a str>,
    /// `--tls`: braid's client reaches braid serve over TLS, trusting this certificate.
    pub tls_ca: Option<&'a std::path::Path>,
}

/// The tree payload's directory in the served one (`--files`).
pub const TREE: &str = "tree";

/// The payload's name in the served directory.
const PAYLOAD: &str = "bench.bin";

impl Context<'_> {
    /// The bytes a run moves: the file, or the whole tree.
    fn payload_bytes(&self) -> u64 {
        self.files.map_or(self.size, |n| n * self.size)
    }

    /// Where a tree download lands, emptied before each run.
    fn tree_dest(&self) -> std::path::PathBuf {
        self.work.join("tree-copy")
    }

    /// The client command that moves the tree for a cell (`--files`), and where the tree
    /// lands (a directory of its own each run).
    fn tree_client(&self, cell: &Cell) -> (Command, std::path::PathBuf) {
        let server = self.place.server_addr();
        let ports = self.ports;
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        let up = format!("put-tree-{n}");
        let landing = match cell.direction {
            Direction::Get => self.tree_dest(),
            Direction::Put => self.root.join(&up),
        };
        let dest = self.tree_dest().display().to_string();
        let local = self.root.join(TREE).display().to_string();
        let url = |port: u16, path: &str| format!("ftp://{server}:{port}/{path}");
        let streams = cell.streams.label();
        let port = ports.of(cell.tool.server());
        let command = match cell.tool {
            Tool::Braid | Tool::BraidVsftpd | Tool::BraidGlobus => {
                let mut c = self.place.command(&self.braid.to_string_lossy());
                match cell.direction {
                    Direction::Get => c.args(["get", "-r", &url(port, &format!("{TREE}/")), &dest]),
                    Direction::Put => c.args(["put", "-r", &local, &url(port, &format!("{up}/"))]),
                };
                c.args(["-q", "--json", "-n", &streams]);
                // Against braid serve, braid's own choice of sessions (one where all goes in
                // bundles); servers that take files one by one get eight, as lftp -P 8.
                if cell.tool != Tool::Braid {
                    c.args(["-j", "8"]);
                }
                self.add_tls(&mut c, cell);
                c
            }
            Tool::Lftp | Tool::LftpBraid => {
                let script = match cell.direction {
                    Direction::Get => format!("mirror -P 8 {} {dest}; quit", url(port, TREE)),
                    Direction::Put => format!("mirror -R -P 8 {local} {}; quit", url(port, &up)),
                };
                let mut c = self.place.command("lftp");
                c.args(["-e", &format!("set net:max-retries 1; {script}")]);
                c
            }
            Tool::GlobusUrlCopy => {
                let remote = |path: &str| format!("ftp://{server}:{port}{path}");
                let root = self.root.display().to_string();
                let mut c = self.place.command("globus-url-copy");
                c.args([
                    "-r",
                    "-cc",
                    "8",
                    "-pp",
                    "-fast",
                    "-p",
                    &streams.replace("auto", "1"),
                ]);
                match cell.direction {
                    Direction::Get => {
                        c.args([remote(&format!("{local}/")), format!("file://{dest}/")])
                    }
                    Direction::Put => c.args([
                        "-cd".to_string(),
                        format!("file://{local}/"),
                        remote(&format!("{root}/{up}/")),
                    ]),
                };
                c
            }
            Tool::BraidCp | Tool::Scp | Tool::Rsync => {
                let far = |p: &str| format!("{server}:{}", self.root.join(p).display());
                let (from, to) = match cell.direction {
                    Direction::Get => (far(TREE), format!("{dest}/")),
                    // scp copies into a directory that exists, or makes one of that name.
                    Direction::Put if cell.tool == Tool::Scp => (local.clone(), far(&up)),
                    Direction::Put => (local.clone(), format!("{}/", far(&up))),
                };
                let mut c = self.over_ssh(cell, port);
                match cell.tool {
                    // Its default sessions: each more starts another far side over ssh.
                    Tool::BraidCp => c.args(["-r", &from, &to]),
                    Tool::Scp => c.args(["-r", &from, &to]),
                    // A trailing / copies what is in it, as the others copy the directory.
                    _ => c.args(["-a", &format!("{from}/"), &to]),
                };
                c
            }
            // Left out of a tree benchmark up front (`Tool::moves_trees`).
            _ => self.place.command("false"),
        };
        (command, landing)
    }

    /// The client of a tool that goes through the bench's sshd, before its sources and
    /// destination: braid cp with its streams, buffer and JSON summary, scp quiet, rsync
    /// copying whole files every time (an earlier run's file would otherwise let it skip).
    fn over_ssh(&self, cell: &Cell, port: u16) -> Command {
        let options = super::servers::ssh_options(self.work);
        let ssh = format!("ssh {} -p {port}", options.join(" "));
        match cell.tool {
            Tool::BraidCp => {
                let braid = self.braid.to_string_lossy();
                let mut c = self.place.command(&braid);
                // Each run finds its own way round a firewall, as a first copy to the host
                // does (a way kept from an earlier run would spare it the straight wait).
                static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.env("XDG_STATE_HOME", self.work.join(format!("cp-state-{run}")));
                c.args(["cp", "-q", "--json", "-e", &ssh, "--remote-braid", &braid]);
                c.args(["-n", &cell.streams.label()]);
                if let Some(p) = cell.compress {
                    c.args(["--compress", p.name()]);
                }
                if let Some(b) = cell.buffer {
                    c.args(["--buffer", &b.to_string()]);
                }
                c
            }
            Tool::Scp => {
                let mut c = self.place.command("scp");
                c.args(&options).args(["-q", "-P", &port.to_string()]);
                c
            }
            _ => {
                let mut c = self.place.command("rsync");
                c.args(["-W", "-I", "-e", &ssh]);
                c
            }
        }
    }

    /// `--tls`: braid's client against braid serve encrypts, trusting the bench's certificate.
    fn add_tls(&self, c: &mut Command, cell: &Cell) {
        if let (Some(ca), Tool::Braid) = (self.tls_ca, cell.tool) {
            c.arg("--tls").arg("--tls-ca").arg(ca);
        }
    }

    /// The client command for a cell, moving `name` (a file in the served directory), and
    /// where a tree lands.
    fn client(&self, cell: &Cell, name: &str) -> (Command, Option<std::path::PathBuf>) {
        if self.files.is_some() && name == PAYLOAD {
            let (c, landing) = self.tree_client(cell);
            return (c, Some(landing));
        }
        let place = &self.place;
        let program = |p: &str| {
            if cell.nice {
                let mut c = place.command("nice");
                c.args(["-n", "19", p]);
                c
            } else {
                place.command(p)
            }
        };
        let remote = match place {
            Place::Remote(r) => Some((r.get_url.as_str(), r.put_url.as_str())),
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
        let port = ports.of(cell.tool.server());
        let command = match cell.tool {
            Tool::Braid | Tool::BraidVsftpd | Tool::BraidGlobus => {
                let mut c = program(&self.braid.to_string_lossy());
                let get = url(port, name, Direction::Get);
                let put = url(port, "put-braid.bin", Direction::Put);
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
                // Background mode chooses its own (bbr on short paths, for its single
                // segments): part of what its cells measure.
                if let Some(cc) = self.congestion.filter(|_| !cell.background) {
                    c.args(["--congestion", cc]);
                }
                if cell.background {
                    c.arg("--background");
                }
                if let Some(p) = cell.compress {
                    c.args(["--compress", p.name()]);
                }
                self.add_tls(&mut c, cell);
                c
            }
            Tool::Iperf3 => {
                let mut c = program("iperf3");
                c.args(["-c", server, "-p", &port.to_string(), "-J"]);
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
                c
            }
            Tool::Curl => {
                let mut c = program("curl");
                c.args([
                    "-sS",
                    "-w",
                    "%{size_download} %{size_upload} %{time_pretransfer} %{time_total}",
                ]);
                let get = url(port, name, Direction::Get);
                let put = url(port, "put-curl.bin", Direction::Put);
                match cell.direction {
                    Direction::Get => c.args(["-o", "/dev/null", &get]),
                    Direction::Put => c.args(["-T", &local, &put]),
                };
                c
            }
            Tool::Lftp | Tool::LftpBraid => {
                let mut script = String::from("set net:max-retries 1; set xfer:clobber on; ");
                if let Some(b) = cell.buffer {
                    script += &format!("set net:socket-buffer {b}; ");
                }
                // lftp's compression is MODE Z, which it uses wherever the server lists it
                // unless told not to.
                let mode_z = cell.compress == Some(Policy::On);
                script += &format!("set ftp:use-mode-z {mode_z}; ");
                let out = self.work.join("lftp.bin").display().to_string();
                // Whole URLs, so the same script reaches the lab's vsftpd or a remote server.
                let get = url(port, name, Direction::Get);
                let put = url(port, "put-lftp.bin", Direction::Put);
                script += &match (cell.direction, streams) {
                    (Direction::Get, 1) => format!("get {get} -o {out}; quit"),
                    (Direction::Get, n) => format!("pget -n {n} {get} -o {out}; quit"),
                    (Direction::Put, _) => format!("put {local} -o {put}; quit"),
                };
                let mut c = program("lftp");
                c.args(["-e", &script]);
                c
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
                    port,
                    k.window,
                    if k.streaming { "on" } else { "off" },
                    p = k.packet,
                );
                let mut c = program("kermit");
                c.args(["-Y", "-q", "-C", &script]);
                c
            }
            Tool::BraidCp | Tool::Scp | Tool::Rsync => {
                let far = |p: &str| format!("{server}:{}", self.root.join(p).display());
                let out = self.work.join(format!("{}.bin", cell.tool.name()));
                let (from, to) = match cell.direction {
                    Direction::Get if cell.tool == Tool::BraidCp => (far(name), "/dev/null".into()),
                    Direction::Get => (far(name), out.display().to_string()),
                    Direction::Put => (local, far(&format!("put-{}.bin", cell.tool.name()))),
                };
                let mut c = self.over_ssh(cell, port);
                c.args([from, to]);
                c
            }
            Tool::GlobusUrlCopy => {
                let mut c = program("globus-url-copy");
                c.args(["-p", &streams.to_string()]);
                if let Some(b) = cell.buffer {
                    c.args(["-tcp-bs", &b.to_string()]);
                }
                let remote = |path: &str| format!("ftp://{server}:{port}{path}");
                match cell.direction {
                    Direction::Get => c.args([remote(&local), "file:///dev/null".into()]),
                    Direction::Put => c.args([
                        format!("file://{local}"),
                        remote(&self.root.join("put-globus.bin").display().to_string()),
                    ]),
                };
                c
            }
        };
        (command, None)
    }

    /// What a wall-timed tool spends on a 1-byte file in this direction (login, commands,
    /// connections): the least of two tries. None for tools that time themselves.
    pub fn setup_seconds(&self, cell: &Cell) -> Option<f64> {
        // A remote server has no 1-byte file to fetch.
        if matches!(self.place, Place::Remote(_)) || !cell.tool.timed_by_clock() {
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
        let (mut m, _) = self.execute(cell, PAYLOAD, setup);
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
            && !matches!(self.place, Place::Remote(_))
            && let Err(e) = wait_listening(&self.place, self.ports.kermit)
        {
            let m = Measured {
                error: Some(e.to_string()),
                ..Measured::default()
            };
            return (m, 0.0);
        }
        if self.files.is_some() && name == PAYLOAD {
            let dest = self.tree_dest();
            let _ = std::fs::remove_dir_all(&dest);
            if let Err(e) = std::fs::create_dir_all(&dest) {
                let m = Measured {
                    error: Some(format!("cannot make {}: {e}", dest.display())),
                    ..Measured::default()
                };
                return (m, 0.0);
            }
        }
        let (cmd, landing) = self.client(cell, name);
        let servers_cpu = || {
            self.server_pids
                .iter()
                .filter_map(|&p| process_cpu(p))
                .sum::<f64>()
        };
        let servers_before = servers_cpu();
        let mut client_cpu = None;
        let started = Instant::now();
        let child = match Captured::spawn(cmd) {
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
        let pid = rustix::process::Pid::from_child(&child.child);
        loop {
            // Seen ended but not yet reaped, the client's /proc entry still holds its CPU time.
            use rustix::process::{WaitId, WaitIdOptions, waitid};
            let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            match waitid(WaitId::Pid(pid), opts) {
                Ok(Some(_)) => {
                    client_cpu = process_cpu(child.child.id());
                    break;
                }
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
            None => match cell.tool {
                Tool::Braid | Tool::BraidVsftpd | Tool::BraidGlobus | Tool::BraidCp => {
                    parse_braid(&out)
                }
                Tool::Iperf3 => parse_iperf3(&out),
                Tool::Curl => parse_curl(&out),
                Tool::Lftp
                | Tool::LftpBraid
                | Tool::GlobusUrlCopy
                | Tool::Kermit
                | Tool::Scp
                | Tool::Rsync => {
                    let seconds = (wall - setup.unwrap_or(0.0)).max(1e-6);
                    let bytes = match (&self.place, cell.direction) {
                        (Place::Remote(r), Direction::Get) => r.get_size.unwrap_or(0),
                        _ if name == PAYLOAD => self.payload_bytes(),
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
        m.cpu_seconds = client_cpu.map(|c| c + (servers_cpu() - servers_before).max(0.0));
        if let (Some(landing), Some(files), None) = (landing, self.files, &m.error) {
            // A tool that says it succeeded has moved the whole tree, or the run failed.
            let landed = files_under(&landing);
            if landed != files {
                m.error = Some(format!(
                    "{} moved {landed} of {files} files into {}",
                    cell.tool.name(),
                    landing.display()
                ));
            }
            if cell.direction == Direction::Put {
                let _ = std::fs::remove_dir_all(&landing);
            }
        }
        (m, wall)
    }
}

/// Regular files in `dir` and below.
fn files_under(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => files_under(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}
