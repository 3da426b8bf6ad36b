//! One run of one cell in the lab: the tool's client in `left` against its server in
//! `right`, with ping across the link the whole time. Reads the tools' own JSON reports.

use super::grid::{Cell, Direction, Streams, Tool};
use crate::lab::Running;
use serde::Serialize;
use std::io::{Read, Seek};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const SERVER: &str = "198.18.0.2";
pub const FTP_PORT: u16 = 2121;
pub const IPERF_PORT: u16 = 5201;
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
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (at most 10 s) until something in `right` listens on `port`.
fn wait_listening(lab: &Running, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = lab
            .command("right", "ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("nothing listens on {SERVER}:{port} after 10 s: the server did not start")
}

/// braid serve (and iperf3 -s when wanted) in `right`, serving `root` with uploads allowed.
pub fn start_servers(
    lab: &Running,
    braid: &std::path::Path,
    root: &std::path::Path,
    iperf3: bool,
) -> anyhow::Result<Servers> {
    let mut servers = Servers {
        children: Vec::new(),
    };
    let mut serve = lab.command("right", &braid.to_string_lossy());
    serve
        .args(["serve", "--anonymous-write", "--root"])
        .arg(root)
        .args(["--listen", &format!("{SERVER}:{FTP_PORT}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    servers.children.push(serve.spawn()?);
    wait_listening(lab, FTP_PORT)?;
    if iperf3 {
        let mut s = lab.command("right", "iperf3");
        s.args(["-s", "-B", SERVER, "-p", &IPERF_PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        servers.children.push(s.spawn()?);
        wait_listening(lab, IPERF_PORT)?;
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

fn ping(lab: &Running) -> std::io::Result<Captured> {
    let mut c = lab.command("left", "ping");
    c.args(["-n", "-D", "-i", PING_INTERVAL, "-W", "30", SERVER]);
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
pub fn idle_ping(lab: &Running, seconds: f64, epoch: f64) -> anyhow::Result<Vec<(f64, f64)>> {
    let p = ping(lab)?;
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (_, out, _) = p.finish();
    Ok(ping_samples(&out, epoch))
}

/// The client command for a cell.
fn client(lab: &Running, braid: &std::path::Path, cell: &Cell, file: &str, size: u64) -> Command {
    match cell.tool {
        Tool::Braid => {
            let mut c = lab.command("left", &braid.to_string_lossy());
            let url = |name: &str| format!("ftp://{SERVER}:{FTP_PORT}/{name}");
            match cell.direction {
                Direction::Get => c.args(["get", "-q", "--json", &url(file), "/dev/null"]),
                Direction::Put => c.args(["put", "-q", "--json", file, &url("put.bin")]),
            };
            c.args(["-n", &cell.streams.label()]);
            if let Some(b) = cell.buffer {
                c.args(["--buffer", &b.to_string()]);
            }
            if let Some(b) = cell.block {
                c.args(["--block-size", &b.to_string()]);
            }
            c
        }
        Tool::Iperf3 => {
            let mut c = lab.command("left", "iperf3");
            let n = match cell.streams {
                Streams::Fixed(n) => n,
                Streams::Auto => 1,
            };
            c.args(["-c", SERVER, "-p", &IPERF_PORT.to_string(), "-J"]);
            c.args(["-n", &size.to_string(), "-P", &n.to_string()]);
            if let Some(b) = cell.buffer {
                c.args(["-w", &b.to_string()]);
            }
            if cell.direction == Direction::Get {
                c.arg("-R");
            }
            c
        }
    }
}

/// Runs `cell` once, moving `size` bytes (`file`: the served file's name for get, the local
/// path for put). Stops early when `stop` is set or after `timeout`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    lab: &Running,
    braid: &std::path::Path,
    cell: &Cell,
    file: &str,
    size: u64,
    epoch: f64,
    timeout: Duration,
    stop: &AtomicBool,
) -> Measured {
    let pinger = ping(lab);
    let started = Instant::now();
    let mut m = match Captured::spawn(client(lab, braid, cell, file, size)) {
        Err(e) => Measured {
            error: Some(format!("cannot start the client: {e}")),
            ..Measured::default()
        },
        Ok(mut child) => {
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
                if stop.load(Ordering::Relaxed) {
                    why = Some("interrupted".into());
                    break;
                }
                if started.elapsed() > timeout {
                    why = Some(format!("ran longer than {} s", timeout.as_secs()));
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let (status, out, err) = child.finish();
            // Ctrl-C at a terminal reaches the client too, which then fails on its own.
            if stop.load(Ordering::Relaxed) {
                why = Some("interrupted".into());
            }
            match why {
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
                    Tool::Braid => parse_braid(&out),
                    Tool::Iperf3 => parse_iperf3(&out),
                },
            }
        }
    };
    if let Ok(p) = pinger {
        let (_, out, _) = p.finish();
        m.ping = ping_samples(&out, epoch);
    }
    m
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
