//! `braid bench`: sweeps over the lab's links, stream counts, buffers, block sizes,
//! directions and tools, with ping across the link during every run, statistics per cell, the
//! model's prediction beside each measurement, and JSON, CSV, Markdown and SVG results.

pub mod attack;
pub mod contest;
pub mod experiments;
pub mod grid;
pub mod hosts;
pub mod measure;
pub mod parse;
pub mod plot;
pub mod report;
pub mod servers;
pub mod stats;

use crate::lab::{BothWays, LinkSpec, Running};
use crate::model::limits::{self, Congestion, Load, Path as ModelPath, Prediction, Window};
use anyhow::{Context, Result, bail};
use braid_proto::compress::Policy;
use clap::Args;
use grid::{Cell, Direction, Grid, Streams, Tool};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Round trips a tool's measured time holds besides the data. braid times itself from RETR
/// or STOR to the checked end: the command and its reply, the data connections' handshakes,
/// the checksum exchange. curl from the transfer command to its end: the command and the
/// final reply. lftp and globus-url-copy are timed by the clock less their time for a 1-byte
/// file, and iperf3 times its data alone.
pub fn overhead_rtts(tool: Tool) -> f64 {
    match tool {
        Tool::Braid | Tool::BraidGlobus | Tool::BraidCp => 2.0,
        Tool::Curl | Tool::BraidVsftpd => 1.0,
        Tool::Iperf3
        | Tool::Lftp
        | Tool::LftpBraid
        | Tool::GlobusUrlCopy
        | Tool::Kermit
        | Tool::Scp
        | Tool::Rsync => 0.0,
    }
}

/// The experiments `--experiment` runs: the seeds' and background mode's.
const EXPERIMENTS: [&str; 7] = [
    experiments::NAMES[0],
    experiments::NAMES[1],
    experiments::NAMES[2],
    experiments::NAMES[3],
    contest::NAME,
    hosts::NAMES[0],
    hosts::NAMES[1],
];

/// `--size` unless given.
const DEFAULT_SIZE: &str = "4MB";

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Run a seed's experiment and print its numbers beside braid's: xftp (satellite-t1,
    /// 24 KB windows, 1-16 streams, 5 MB, as the XFTP paper's figure), bbftp (1/10/20 streams
    /// × 64/256 KB × both directions on a 160 ms path with loss, mean ± std, as SLAC's
    /// table), kermit (C-Kermit's window × packet length × streaming on a 70 ms path, with FTP
    /// and braid beside it, as Kermit's trial 2 with its statistics and correlations), nice
    /// (ping during transfers on dsl-1m-bloat with the client at nice 0 and 19, beside
    /// braid --background), background (--background transfers on dsl-1m-bloat against a
    /// cubic iperf3 that comes and goes, and against each other: yield and recovery times,
    /// shares, Jain's index; downloads and uploads). It sets the grid; --direction narrows it
    /// to one direction; --repeat, --out, --name, --seed and --timeout still apply.
    /// On labs of more hosts: striping (braid serve --data-nodes over 4 data nodes, each
    /// behind a 100 Mbit/s link 20 ms from the client, sharing one directory; braid get and
    /// put of 512 MiB against the 4 links' payload rate) and third-party (braid cp between two
    /// TLS servers on a 200 Mbit/s path, the client behind 1 Mbit/s; 256 MiB against the
    /// path's payload rate, and the bytes that crossed the client's link; with --files and
    /// --size, a tree copied with braid cp -r).
    #[arg(long, value_parser = EXPERIMENTS,
          conflicts_with_all = ["scenario", "mtu", "rate", "delay", "queue", "loss", "streams", "buffer",
                                "block_size", "tool", "congestion"])]
    pub experiment: Option<String>,
    /// Measure a real path instead of the lab: get cells download this file, put cells upload
    /// the generated --size file as braid-bench-upload.bin into its directory (left there).
    /// Tools: braid, curl and lftp; no model (the path is unknown); ping goes to its host. No
    /// root needed.
    #[arg(long, value_name = "URL", conflicts_with_all = ["experiment", "mtu", "rate", "delay", "queue", "loss"])]
    pub url: Option<String>,
    /// Attack a braid server started on loopback with --attack-config (your serve config)
    /// instead of measuring transfers, while an honest user logs in every half second; each
    /// scenario runs --duration seconds (default 20). Comma-separated: guessing (8 guessers
    /// at the honest user's account, a fresh /24 per guess, the password planted as guess
    /// 150), queue (200 guesses at once for unknown accounts: the check queue overflows),
    /// startups (256 connections that never log in, from 8 /24s), startups-v6 (the same from 8
    /// /64s of one /48; needs 2001:2::/48 on loopback, as in a network namespace), neighbour
    /// (31 failures from the honest user's own /24). Prints what each side got, writes
    /// attack.json into --out; exit code 1 if a target was missed (honest logins within 2 s
    /// in 95% of tries, server peak ≤ 100 MiB, the planted password not found, no thread
    /// left behind).
    #[arg(long, value_delimiter = ',', value_parser = attack::SCENARIOS,
          conflicts_with_all = ["experiment", "url", "loopback", "scenario", "tool"])]
    pub attack: Vec<String>,
    /// With --attack: the serve config file (TOML, as `braid serve --config`) whose limits
    /// to attack; its users, root and listen address are replaced by the bench's own.
    #[arg(long, value_name = "FILE", requires = "attack")]
    pub attack_config: Option<PathBuf>,
    /// Kermit's window slots, comma-separated (1-32; streaming ignores them).
    #[arg(long, value_delimiter = ',', default_value = "15",
          value_parser = clap::value_parser!(u32).range(1..=32))]
    pub kermit_window: Vec<u32>,
    /// Kermit's packet lengths, comma-separated (bytes, up to 9024).
    #[arg(long, value_delimiter = ',', default_value = "4350",
          value_parser = clap::value_parser!(u32).range(40..=9024))]
    pub kermit_packet: Vec<u32>,
    /// Kermit's streaming, comma-separated: on, off.
    #[arg(long, value_delimiter = ',', default_value = "on,off", value_parser = on_off)]
    pub kermit_streaming: Vec<bool>,
    /// braid's background mode, comma-separated: off, on (braid get/put --background; other
    /// tools have no such mode and run once).
    #[arg(long, value_delimiter = ',', default_value = "off", value_parser = on_off)]
    pub background: Vec<bool>,
    /// braid's --compress, comma-separated: auto, on, off (braid get/put and braid cp; the
    /// other tools run once, as they are). With --data text, auto against off is what
    /// compression gains; with random data, what its probing costs. lftp-braid runs with
    /// MODE Z for on (against braid serve --compress on; braid's cells in that run then
    /// compress downloads as on), without it for auto or off.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = braid_proto::compress::Policy::parse)]
    pub compress: Vec<braid_proto::compress::Policy>,
    /// What the files hold: random (incompressible), or text (web-server log lines, made
    /// from the seed: zstd shrinks them five- to sixfold, gzip -6 4.6-fold).
    #[arg(long, value_enum, default_value_t = Data::Random)]
    pub data: Data,
    /// Measure on this machine's loopback instead of the lab: the same servers, on free ports
    /// of 127.0.0.1, no link between them (what the CPUs and the programs manage), no root.
    #[arg(long, conflicts_with_all = ["url", "experiment", "scenario", "mtu", "rate", "delay",
                                      "queue", "loss", "duration"])]
    pub loopback: bool,
    /// Congestion control of braid's and iperf3's sending side (reno, cubic, bbr) [default:
    /// the system's; the other tools always use it, and braid --background its own choice].
    #[arg(long, value_parser = Congestion::parse)]
    pub congestion: Option<Congestion>,
    /// Lab scenarios to measure on (`braid lab scenarios`), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "lan-100m")]
    pub scenario: Vec<String>,
    /// Override every scenario's MTU.
    #[arg(long)]
    pub mtu: Option<u16>,
    /// Override every scenario's link rate (both directions), e.g. 20mbit or unlimited.
    #[arg(long)]
    pub rate: Option<String>,
    /// Override every scenario's one-way delay (both directions), e.g. 10ms.
    #[arg(long)]
    pub delay: Option<String>,
    /// Override every scenario's queue (both directions), e.g. 100pkt or 96kB.
    #[arg(long)]
    pub queue: Option<String>,
    /// Override every scenario's random loss (both directions), e.g. 1e-4.
    #[arg(long)]
    pub loss: Option<String>,
    /// Stream counts, comma-separated: numbers (1-64) and auto (braid's self-tuning).
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "1,4",
          value_parser = Streams::parse)]
    pub streams: Vec<Streams>,
    /// Socket buffers per data connection, comma-separated: sizes (24KiB) and default (the
    /// kernel tunes them).
    #[arg(long, value_delimiter = ',', default_value = "default", value_parser = size_or_default)]
    pub buffer: Vec<Option<u64>>,
    /// braid's block sizes, comma-separated: multiples of 64KiB, and default.
    #[arg(long, value_delimiter = ',', default_value = "default", value_parser = size_or_default)]
    pub block_size: Vec<Option<u64>>,
    /// Directions, comma-separated: get (the client in `left` downloads) and put.
    #[arg(long, value_delimiter = ',', default_value = "get,put", value_parser = Direction::parse)]
    pub direction: Vec<Direction>,
    /// Tools, comma-separated: braid (against braid serve); braid-vsftpd (braid's client
    /// against vsftpd: stream mode, ranges with -n N down; with --background on it holds the
    /// server back by its receive window, RFC 9840); iperf3 (plain TCP with the same
    /// streams and buffers: the ceiling); globus-url-copy -p N (against globus-gridftp-server);
    /// lftp (pget -n N down, one stream up) and curl (one stream), both against vsftpd; kermit
    /// (C-Kermit client and server, see --kermit-*). Across: braid-globus (braid's client
    /// against globus-gridftp-server) and lftp-braid (lftp against braid serve). Over ssh,
    /// against a private OpenSSH server the bench starts (its own keys): braid-cp (braid cp,
    /// -n N), scp and rsync (one stream in ssh's channel, rsync copying whole files). Each runs
    /// the cells it can; a tool that is not installed is skipped with a note.
    #[arg(long, value_delimiter = ',', default_value = "braid", value_parser = Tool::parse)]
    pub tool: Vec<Tool>,
    /// braid's client against braid serve over TLS: AUTH TLS and PROT P on every data
    /// connection, with a certificate made for the server's address. What encryption costs,
    /// set against a run without; the other tools stay in clear.
    #[arg(long, conflicts_with_all = ["url", "attack"])]
    pub tls: bool,
    /// Cap the kernel's TCP buffers (tcp_rmem and tcp_wmem) at SIZE in both lab hosts, as an
    /// older host's would be: 48KiB gives the ~24 KB windows of the XFTP paper's 1998 hosts.
    /// No program in the hosts can raise its buffers past it, braid's tuning included.
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size,
          conflicts_with_all = ["url", "loopback", "attack"])]
    pub host_buffers: Option<u64>,
    /// Runs of each cell.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Bytes each run moves, e.g. 4MB.
    #[arg(long, default_value = DEFAULT_SIZE, value_parser = crate::units::parse_size)]
    pub size: u64,
    /// Move a tree instead of one file: FILES files of --size bytes each in 10 directories,
    /// with braid get -r / put -r -j 8 (braid, braid-vsftpd, braid-globus), lftp mirror -P 8
    /// (lftp, lftp-braid) and globus-url-copy -r -cc 8; curl, iperf3 and kermit move single
    /// files and are left out. Each run's files are counted where they land (a tool that
    /// misses one fails the run); the report gives files per second and each tool's time
    /// against braid's. With `--experiment third-party`: the tree braid cp -r copies between
    /// the servers.
    #[arg(long, value_name = "FILES", conflicts_with_all = ["url", "duration", "attack"],
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub files: Option<u64>,
    /// Instead of --size: give each scenario a payload that takes about this many seconds at
    /// its link's payload rate (the slower direction), so that one sweep fits links from
    /// 14.4 kbit/s to 500 Mbit/s.
    #[arg(long, value_name = "SECONDS", conflicts_with_all = ["size", "url", "experiment"])]
    pub duration: Option<f64>,
    /// Where results go (created if missing): results.jsonl as runs finish, then report.json,
    /// results.csv, report.md and SVG plots.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Lab name, so that benchmarks can run side by side.
    #[arg(long, default_value = "bench")]
    pub name: String,
    /// Seed for the order of the runs and the link's random loss.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Longest a run may take, seconds; a run stopped there counts as failed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Seconds of ping on each idle link before its runs.
    #[arg(long, default_value_t = 3.0)]
    pub idle_ping: f64,
}

/// Every combination of Kermit's window, packet length and streaming.
fn kermit_cells(args: &BenchArgs) -> Vec<grid::Kermit> {
    let mut out = Vec::new();
    for &window in &args.kermit_window {
        for &packet in &args.kermit_packet {
            for &streaming in &args.kermit_streaming {
                out.push(grid::Kermit {
                    window,
                    packet,
                    streaming,
                });
            }
        }
    }
    out
}

/// What a scenario's link should show: a ping's RTT (84-byte packets, serialized each way)
/// and the payload rate each way.
fn path_info(spec: &LinkSpec) -> report::PathInfo {
    let serialize = |p: &crate::lab::model::Params| p.rate.map_or(0.0, |r| 84.0 * 8.0 / r as f64);
    let payload = |p: &crate::lab::model::Params| {
        p.rate
            .map(|r| limits::payload_rate(r as f64, f64::from(spec.mtu)) * 8.0)
    };
    report::PathInfo {
        mtu: spec.mtu,
        ping_rtt_ms: ((spec.up.delay + spec.down.delay) as f64 / 1e9
            + serialize(&spec.up)
            + serialize(&spec.down))
            * 1e3,
        up_payload_bps: payload(&spec.up),
        down_payload_bps: payload(&spec.down),
    }
}

/// The bytes each run moves on a link: --size, or --duration seconds at its payload rate.
fn payload_size(args: &BenchArgs, spec: &LinkSpec) -> u64 {
    let Some(secs) = args.duration else {
        return args.size;
    };
    let rate = |p: &crate::lab::model::Params| {
        p.rate.map_or(f64::INFINITY, |r| {
            limits::payload_rate(r as f64, f64::from(spec.mtu))
        })
    };
    let slower = rate(&spec.up).min(rate(&spec.down));
    if slower.is_finite() {
        (slower * secs).max(1.0) as u64
    } else {
        args.size
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: on or off")),
    }
}

fn size_or_default(s: &str) -> Result<Option<u64>, String> {
    if s == "default" {
        return Ok(None);
    }
    crate::units::parse_size(s).map(Some)
}

/// Writes report.json, results.csv, report.md and the plots into `dir`.
fn write_results(
    dir: &std::path::Path,
    report: &report::Report,
    records: &[report::Record],
    comparison: &str,
) -> Result<Vec<String>> {
    let plots = plot::plots(report, records, dir)?;
    let put = |name: &str, text: String| {
        std::fs::write(dir.join(name), text)
            .with_context(|| format!("cannot write {}", dir.join(name).display()))
    };
    put("report.json", serde_json::to_string_pretty(report)?)?;
    put("results.csv", report::csv(records))?;
    put("report.md", report::markdown(report, &plots, comparison))?;
    Ok(plots)
}

/// A line above the progress bar, or on stderr when there is no bar (not a terminal).
fn note(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// What the model predicts for a cell; None for self-tuned counts (no fixed N to model).
fn predict(
    cell: &Cell,
    spec: &LinkSpec,
    size: u64,
    congestion: Congestion,
    autotuned: Window,
) -> Option<Prediction> {
    let Streams::Fixed(n) = cell.streams else {
        return None;
    };
    // get: data flows right → left, the lab's "down".
    let (there, back) = match cell.direction {
        Direction::Get => (&spec.down, &spec.up),
        Direction::Put => (&spec.up, &spec.down),
    };
    let way = crate::model::lab_way(there, back, spec.mtu);
    let path = ModelPath {
        rate_bps: way.rate_bps?,
        rtt: way.rtt,
        mtu: f64::from(spec.mtu),
        loss: way.loss,
        queue: Some(way.queue),
    };
    let load = Load {
        streams: n,
        window: cell.buffer.map_or(autotuned, |b| Window::Buffer(b as f64)),
        size: size as f64,
        congestion,
        initial_window: limits::INITIAL_WINDOW,
        overhead_rtts: overhead_rtts(cell.tool),
        echo: false,
    };
    Some(limits::predict(&path, &load))
}

/// `--host-buffers`: both hosts' TCP buffers capped at `cap` bytes, default and maximum
/// (the sysctls are the namespace's own).
fn cap_host_buffers(lab: &Running, cap: u64) -> Result<()> {
    let limits = format!("4096 {cap} {cap}");
    for host in ["left", "right"] {
        let out = lab
            .command(host, "sysctl")
            .arg("-qw")
            .arg(format!("net.ipv4.tcp_rmem={limits}"))
            .arg(format!("net.ipv4.tcp_wmem={limits}"))
            .output()
            .context("cannot run sysctl in the lab")?;
        if !out.status.success() {
            bail!(
                "cannot cap the TCP buffers in {host}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// An experiment's results: its Markdown printed and in `report.md`, its JSON in
/// `report.json`, both in `out`.
fn results(out: &std::path::Path, md: &str, json: &serde_json::Value) -> Result<()> {
    println!("{md}");
    std::fs::write(out.join("report.md"), md)?;
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(json)?)?;
    eprintln!("braid bench: results in {}", out.display());
    Ok(())
}

/// The benchmark's files: in memory where there is a /dev/shm, so that the disk is not
/// measured.
fn work_dir() -> Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let b = tempfile::Builder::new().prefix("braid-bench").clone();
    Ok(if shm.is_dir() {
        b.tempdir_in(shm)?
    } else {
        b.tempdir()?
    })
}

/// Clients and servers run from a copy of this executable in `dir`: a rebuild during a long
/// benchmark replaces the file, and later runs would then fail to start. (Where the copy
/// cannot run, a file system mounted noexec, the original serves.)
fn runnable_copy(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let braid = std::env::current_exe().context("cannot find this program")?;
    let copy = dir.join("braid");
    let runs = std::fs::copy(&braid, &copy).is_ok()
        && std::process::Command::new(&copy)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    Ok(if runs { copy } else { braid })
}

/// What the bench's files hold (`--data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Data {
    Random,
    Text,
}

/// The tree payload: `files` files of `size` bytes in 10 directories under `top`.
fn make_tree(top: &std::path::Path, files: u64, size: u64, data: Data) -> Result<()> {
    for i in 0..files {
        let dir = top.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        make_data(&dir.join(format!("f{i}")), size, data, i)?;
    }
    Ok(())
}

/// A file of `size` random bytes: a xorshift stream that never repeats, so that nothing in
/// it compresses, whatever the block size.
fn make_file(path: &std::path::Path, size: u64) -> Result<()> {
    make_data(path, size, Data::Random, 0)
}

/// A file of `size` bytes of `data`, the same for the same `seed`. Text is web-server log
/// lines whose fields vary as real ones do (addresses, paths, sizes, times).
fn make_data(path: &std::path::Path, size: u64, data: Data, seed: u64) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut block = Vec::with_capacity((1 << 20) + 256);
    let mut left = size;
    while left > 0 {
        block.clear();
        match data {
            Data::Random => {
                while block.len() < 1 << 20 {
                    block.extend_from_slice(&next().to_le_bytes());
                }
            }
            Data::Text => {
                const PATHS: [&str; 8] = [
                    "/index.html",
                    "/api/v1/items",
                    "/static/app.js",
                    "/static/style.css",
                    "/api/v1/users",
                    "/images/logo.png",
                    "/search",
                    "/api/v1/orders",
                ];
                const CODES: [u16; 6] = [200, 200, 200, 304, 404, 500];
                while block.len() < 1 << 20 {
                    let r = next();
                    let line = format!(
                        "10.{}.{}.{} - - [28/Nov/2026:{:02}:{:02}:{:02} +0000] \"GET {}?id={} HTTP/1.1\" {} {} {:.3}\n",
                        r % 4,
                        (r >> 8) % 256,
                        (r >> 16) % 256,
                        (r >> 24) % 24,
                        (r >> 29) % 60,
                        (r >> 35) % 60,
                        PATHS[((r >> 41) % 8) as usize],
                        (r >> 44) % 100_000,
                        CODES[((r >> 61) % 6) as usize],
                        (r >> 20) % 50_000,
                        ((r >> 50) % 2000) as f64 / 1000.0,
                    );
                    block.extend_from_slice(line.as_bytes());
                }
            }
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// A remote server to measure (`--url`).
/// The URL's host, the upload's URL beside it, and the file's size from a listing of its
/// directory (for tools timed by the clock).
fn remote_target(u: &str) -> Result<servers::Remote> {
    let parsed = url::Url::parse(u).with_context(|| format!("--url {u}: not a URL"))?;
    let Some(host) = parsed.host_str().map(str::to_string) else {
        bail!("--url {u}: no host");
    };
    let name = parsed
        .path_segments()
        .and_then(|mut s| s.next_back())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .with_context(|| format!("--url {u}: name a file to download, not a directory"))?;
    let mut dir = parsed.clone();
    if let Ok(mut segs) = dir.path_segments_mut() {
        segs.pop().push("");
    }
    let mut put = dir.clone();
    if let Ok(mut segs) = put.path_segments_mut() {
        segs.pop().push("braid-bench-upload.bin");
    }
    let sources = crate::client::url::CredentialSources::from_env();
    let listed = crate::client::url::parse(dir.as_str(), &sources)
        .ok()
        .and_then(|t| crate::client::ls(&t, &crate::client::Options::default()).ok());
    let get_size = listed.and_then(|entries| entries.into_iter().find(|e| e.name == name)?.size);
    Ok(servers::Remote {
        host,
        get_url: u.to_string(),
        put_url: put.to_string(),
        get_size,
    })
}

pub fn main(mut args: BenchArgs) -> Result<u8> {
    if !args.attack.is_empty() {
        return attack::main(
            &args.attack,
            args.attack_config.as_deref(),
            args.duration.unwrap_or(20.0),
            &args.out,
        );
    }
    let (nice, background) = match args.experiment.as_deref().and_then(experiments::plan) {
        Some(p) => {
            args.scenario = vec![p.scenario.to_string()];
            args.delay = p.delay.map(str::to_string);
            args.loss = p.loss.map(str::to_string);
            args.streams = p.streams;
            args.buffer = p.buffers;
            args.block_size = vec![None];
            // --direction narrows an experiment to some of its directions.
            let asked = std::mem::take(&mut args.direction);
            args.direction = p
                .directions
                .into_iter()
                .filter(|d| asked.contains(d))
                .collect();
            if args.direction.is_empty() {
                bail!(
                    "--experiment {} runs no transfer in the direction asked (--direction {})",
                    args.experiment.as_deref().unwrap_or_default(),
                    asked.iter().map(|d| d.name()).collect::<Vec<_>>().join(",")
                );
            }
            args.tool = p.tools;
            args.size = p.size;
            args.congestion = p.congestion;
            args.rate = p.rate.map(str::to_string);
            if let Some(k) = p.kermit {
                args.kermit_window = k.windows;
                args.kermit_packet = k.packets;
                args.kermit_streaming = vec![true, false];
            }
            (p.nice, p.background)
        }
        None => (vec![false], args.background.clone()),
    };
    let remote = match &args.url {
        Some(u) => Some(remote_target(u)?),
        None => None,
    };
    if let Some(r) = &remote {
        args.scenario = vec![format!("remote {}", r.host)];
        args.tool.retain(|t| {
            let ok = matches!(t, Tool::Braid | Tool::Curl | Tool::Lftp);
            if !ok {
                eprintln!(
                    "braid bench: {} is skipped: against --url only braid, curl and lftp run",
                    t.name()
                );
            }
            ok
        });
    } else if args.loopback {
        args.scenario = vec!["loopback".into()];
    } else if !rustix::process::geteuid().is_root() {
        bail!(
            "braid bench runs on the lab's emulated links, which need root (network namespaces and TUN devices): run it with sudo"
        );
    }
    if args.experiment.as_deref() == Some(contest::NAME) {
        return contest::run(&args);
    }
    if let Some(name) = args.experiment.as_deref()
        && name != hosts::THIRD_PARTY
        && (args.files.is_some() || Ok(args.size) != crate::units::parse_size(DEFAULT_SIZE))
    {
        bail!(
            "--files and --size go with --experiment {} only (a tree copied between servers); the other experiments move what their seeds did",
            hosts::THIRD_PARTY
        );
    }
    if let Some(name) = args
        .experiment
        .as_deref()
        .filter(|n| hosts::NAMES.contains(n))
    {
        if args.loopback {
            bail!("--experiment {name} runs on a lab of more hosts; leave out --loopback");
        }
        return hosts::run(name, &args);
    }
    let mut tools = args.tool.clone();
    tools.sort();
    tools.dedup();
    if args.files.is_some() {
        tools.retain(|t| {
            let ok = t.moves_trees();
            if !ok {
                eprintln!(
                    "braid bench: {} is skipped: it moves single files, not trees",
                    t.name()
                );
            }
            ok
        });
    }
    tools.retain(|t| {
        let missing: Vec<&str> = t
            .programs()
            .iter()
            .copied()
            .filter(|p| servers::find_program(p).is_none())
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "braid bench: {} is skipped: {} not installed",
                t.name(),
                missing.join(" and ")
            );
        }
        missing.is_empty()
    });
    let mut specs = BTreeMap::new();
    let overrides = BothWays {
        mtu: args.mtu,
        rate: args.rate.clone(),
        delay: args.delay.clone(),
        queue: args.queue.clone(),
        loss: args.loss.clone(),
    };
    if remote.is_none() && !args.loopback {
        for s in &args.scenario {
            specs.insert(s.clone(), LinkSpec::scenario_with(s, &overrides)?);
        }
    }
    let grid = Grid {
        scenarios: args.scenario.clone(),
        tools,
        directions: args.direction.clone(),
        streams: args.streams.clone(),
        buffers: args.buffer.clone(),
        blocks: args.block_size.clone(),
        nice,
        background,
        compress: args.compress.clone(),
        kermit: kermit_cells(&args),
    };
    let cells = grid.cells();
    if cells.is_empty() {
        bail!("nothing to measure: the grid has no cells");
    }
    let runs = grid::schedule(&cells, args.repeat, args.seed);
    let congestion = args
        .congestion
        .unwrap_or_else(crate::model::system_congestion);
    // The hosts' caps, when set, are what the kernel tunes up to.
    let autotuned = match args.host_buffers {
        Some(cap) => crate::model::limits::Window::Auto {
            rmem_max: cap as f64,
            wmem_max: cap as f64,
        },
        None => crate::model::autotuned(),
    };
    let predictions: Vec<Option<Prediction>> = cells
        .iter()
        .map(|c| {
            // The model predicts one file's transfer, not a tree's many.
            let spec = specs.get(&c.scenario).filter(|_| args.files.is_none())?;
            predict(c, spec, payload_size(&args, spec), congestion, autotuned)
        })
        .collect();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let jsonl_path = args.out.join("results.jsonl");
    let mut jsonl = std::fs::File::create(&jsonl_path)
        .with_context(|| format!("cannot create {}", jsonl_path.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let tmp = work_dir()?;
    let root = tmp.path().join("root");
    std::fs::create_dir(&root)?;
    let data = args.data;
    let mut made = args.size;
    make_data(&root.join("bench.bin"), made, data, args.seed)?;
    make_file(&root.join("tiny.bin"), 1)?;
    if let Some(files) = args.files {
        make_tree(&root.join(measure::TREE), files, args.size, data)?;
    }
    let braid = runnable_copy(tmp.path())?;
    let tls = match (args.tls, args.loopback) {
        (false, _) => None,
        (true, true) => Some(servers::Tls::make(tmp.path(), "127.0.0.1")?),
        (true, false) => Some(servers::Tls::make(tmp.path(), servers::SERVER)?),
    };

    let bar = ProgressBar::new(runs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} runs, {elapsed} spent, about {eta} left  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let epoch = measure::unix_now();
    let mut records = Vec::new();
    let mut idle = BTreeMap::new();
    let mut setup = BTreeMap::new();
    let mut links = BTreeMap::new();
    let mut loopback_ports = None;
    let mut i = 0;
    while i < runs.len() && !stop.load(Ordering::Relaxed) {
        let scenario = cells[runs[i].cell].scenario.clone();
        let end = i + runs[i..]
            .iter()
            .take_while(|r| cells[r.cell].scenario == scenario)
            .count();
        let mut used: Vec<Tool> = runs[i..end].iter().map(|r| cells[r.cell].tool).collect();
        used.sort();
        used.dedup();
        let size = specs
            .get(&scenario)
            .map_or(args.size, |spec| payload_size(&args, spec));
        if size != made {
            make_data(&root.join("bench.bin"), size, data, args.seed)?;
            made = size;
        }
        let lab = match (&remote, args.loopback) {
            (None, false) => {
                let spec = specs[&scenario].clone();
                bar.set_message(format!("{scenario}: bringing the link up"));
                let lab = Running::up(&args.name, spec, args.seed, None)?;
                if let Some(cap) = args.host_buffers {
                    cap_host_buffers(&lab, cap)?;
                }
                Some(lab)
            }
            _ => None,
        };
        let place = match (&lab, &remote) {
            (Some(lab), _) => servers::Place::Lab(lab),
            (None, Some(r)) => servers::Place::Remote(r),
            (None, None) => servers::Place::Loopback,
        };
        // lftp's MODE Z needs a braid server that lists it (`serve --compress on`); braid's own
        // cells in the same run then compress as `on` would.
        let mode_z = cells
            .iter()
            .any(|c| c.tool == Tool::LftpBraid && c.compress == Some(Policy::On));
        let mut serve_args = tls
            .as_ref()
            .map(servers::Tls::serve_args)
            .unwrap_or_default();
        if mode_z {
            serve_args.extend(["--compress".into(), "on".into()]);
        }
        let (ports, servers) = match place {
            servers::Place::Loopback => {
                let (ports, servers) =
                    servers::start_on_loopback(&braid, tmp.path(), &root, &used, &serve_args)?;
                loopback_ports = Some(ports);
                (ports, Some(servers))
            }
            servers::Place::Remote(_) => (servers::Ports::LAB, None),
            servers::Place::Lab(_) => (
                servers::Ports::LAB,
                Some(servers::start_servers(
                    &place,
                    servers::Ports::LAB,
                    &braid,
                    tmp.path(),
                    &root,
                    &used,
                    &serve_args,
                )?),
            ),
        };
        let ctx = measure::Context {
            server_pids: servers.as_ref().map_or_else(Vec::new, |s| s.pids()),
            place,
            ports,
            braid: &braid,
            root: &root,
            work: tmp.path(),
            size,
            files: args.files,
            serial: std::sync::atomic::AtomicU64::new(0),
            epoch,
            timeout: Duration::from_secs(args.timeout),
            stop: &stop,
            congestion: args.congestion.map(Congestion::name),
            tls_ca: tls.as_ref().map(|t| t.cert.as_path()),
        };
        bar.set_message(format!("{scenario}: ping on the idle link"));
        let quiet = measure::idle_ping(&ctx.place, args.idle_ping, epoch)?;
        if let Some(l) = report::Latency::of(&quiet.iter().map(|p| p.1).collect::<Vec<_>>()) {
            note(
                &bar,
                format!(
                    "{scenario}: idle ping p50 {:.1} ms, p95 {:.1} ms",
                    l.p50_ms, l.p95_ms
                ),
            );
            idle.insert(scenario.clone(), l);
        }
        // Tools timed by the clock: what a 1-byte file costs them, per direction.
        let mut setups: BTreeMap<(Tool, Direction), Option<f64>> = BTreeMap::new();
        for run in &runs[i..end] {
            let c = &cells[run.cell];
            if setups.contains_key(&(c.tool, c.direction)) || stop.load(Ordering::Relaxed) {
                continue;
            }
            let one = Cell {
                streams: Streams::Fixed(1),
                buffer: None,
                block: None,
                ..c.clone()
            };
            let s = ctx.setup_seconds(&one);
            if let Some(s) = s {
                note(
                    &bar,
                    format!(
                        "{scenario}: {} {} spends {s:.2} s on a 1-byte file: taken off its times",
                        c.tool.name(),
                        c.direction.name()
                    ),
                );
                setup.insert(
                    format!("{scenario} {} {}", c.tool.name(), c.direction.name()),
                    s,
                );
            }
            setups.insert((c.tool, c.direction), s);
        }
        for run in &runs[i..end] {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let cell = &cells[run.cell];
            let label = format!(
                "{scenario} {} {} -n {} buffer {} block {}",
                cell.tool_label(),
                cell.direction.name(),
                cell.streams.label(),
                cell.buffer.map_or("default".into(), |b| b.to_string()),
                cell.block.map_or("default".into(), |b| b.to_string()),
            );
            bar.set_message(label.clone());
            let started = measure::unix_now() - epoch;
            let setup_s = setups.get(&(cell.tool, cell.direction)).copied().flatten();
            let measured = ctx.run(cell, setup_s);
            if measured.error.as_deref() == Some("interrupted") {
                break;
            }
            note(
                &bar,
                match &measured.error {
                    None => format!(
                        "{label}: {:.3} Mbit/s in {:.2} s",
                        measured.bytes_per_second * 8.0 / 1e6,
                        measured.seconds
                    ),
                    Some(e) => format!("{label}: FAILED: {e}"),
                },
            );
            let record = report::Record {
                run: *run,
                cell: cell.clone(),
                started,
                measured,
            };
            writeln!(jsonl, "{}", serde_json::to_string(&record)?)
                .context("cannot write results.jsonl")?;
            records.push(record);
            bar.inc(1);
        }
        drop(ctx);
        drop(servers);
        let Some(lab) = lab else {
            i = end;
            continue;
        };
        let link = lab.stop();
        links.insert(scenario.clone(), serde_json::to_value(&link)?);
        if link.device_drops() > 0 {
            note(
                &bar,
                format!(
                    "{scenario}: WARNING: the TUN devices dropped {} packets the emulator never saw (the relay fell behind): this scenario's numbers are not trustworthy",
                    link.device_drops()
                ),
            );
        }
        i = end;
    }
    bar.finish_and_clear();
    let interrupted = stop.load(Ordering::Relaxed);
    let head = report::Head {
        command,
        size: args.size,
        repeats: args.repeat,
        interrupted,
        experiment: args.experiment.clone(),
        duration: args.duration,
        files: args.files,
    };
    let mut rep = report::build(head, &cells, &predictions, idle, setup, &records);
    rep.links = links;
    rep.loopback_ports = loopback_ports;
    rep.paths = specs
        .iter()
        .map(|(name, spec)| (name.clone(), path_info(spec)))
        .collect();
    let comparison = rep
        .experiment
        .as_deref()
        .map(|name| experiments::compare(name, &rep, &records))
        .unwrap_or_default();
    let plots = write_results(&args.out, &rep, &records, &comparison)?;
    print!("{}", report::markdown(&rep, &[], &comparison));
    eprintln!(
        "braid bench: {} runs; results in {} (report.md, report.json, results.csv, results.jsonl{})",
        records.len(),
        args.out.display(),
        if plots.is_empty() {
            String::new()
        } else {
            format!(", {}", plots.join(", "))
        }
    );
    let failed = records.iter().any(|r| r.measured.error.is_some());
    Ok(if interrupted {
        crate::client::error::exit::INTERRUPTED
    } else if failed {
        1
    } else {
        0
    })
}
