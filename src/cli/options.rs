//! The options the client commands share, grouped as `--help` shows them, and the client
//! [`Options`] they make.

use super::logging::client_logging;
use crate::client::{self, Options};
use crate::units::parse_size;
use clap::Args;

/// What `get` and `put` share.
#[derive(Args, Debug)]
pub struct Shared {
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub transfer: TransferArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl Shared {
    /// The client's options from these arguments, for get, put and cp.
    pub fn options(&self, resume: bool) -> anyhow::Result<Options> {
        options(&self.out, resume, Some(&self.transfer), &self.tls)
    }
}

/// Whole directories.
#[derive(Args, Debug)]
#[command(next_help_heading = "Whole directories")]
pub struct TreeArgs {
    /// Copy directories with everything in them.
    ///
    /// Each source (a directory or a file) lands under its own name in the destination
    /// directory, DEST/NAME (get) or URL/NAME (put), which is created if missing, so running
    /// the same command again finds the same files (the server's top directory has no name:
    /// its contents go into DEST). Directories are walked with MLSD (LIST on servers without
    /// it), created on the other side, and keep their modification times on download.
    /// Symbolic links are skipped and listed, never followed; names that are unsafe here
    /// (.., /, control characters, or equal but for case on a filesystem that ignores case)
    /// are refused. A file that fails does not stop the others: the summary lists it and the
    /// exit code is 11.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// With -r: move only what is missing or changed.
    ///
    /// Skips files whose destination has the same size and is not older, and continues
    /// partial downloads and uploads broken off in MODE E (braid and GridFTP servers), so a
    /// re-run after an interruption moves only what is missing.
    #[arg(long, requires = "recursive")]
    pub update: bool,
    /// With -r: sessions at once, each moving its own files [default: 4; 1 where every file
    /// goes in bundles].
    ///
    /// Small files go many at a time on each session, as many as the path holds (to and from
    /// a braid server, as bundles: many files in one transfer on parallel connections); large
    /// ones one at a time, with their -n connections each. Lower it for servers that limit
    /// sessions per client (a refused session leaves its files to the others).
    #[arg(short = 'j', long, value_name = "N", requires = "recursive",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: Option<u16>,
}

impl TreeArgs {
    pub fn options(&self) -> client::tree::TreeOptions {
        client::tree::TreeOptions {
            concurrency: self.concurrency.map(usize::from),
            update: self.update,
        }
    }
}

/// How a transfer uses the network. These apply when the server offers MODE E (a braid or
/// GridFTP server); against a plain FTP server only -n does, for downloads.
#[derive(Args, Debug)]
#[command(next_help_heading = "Network")]
pub struct TransferArgs {
    /// Parallel data connections: a number (1-64), or auto.
    ///
    /// Used when the server offers MODE E (braid, GridFTP servers). More help on long or lossy
    /// paths, where one TCP connection cannot fill the link. "auto": against a braid server,
    /// braid starts with 4 and adds or removes connections while the data moves, keeping a
    /// count only while it adds goodput without adding loss or queueing delay (-v shows each
    /// decision, --json lists them); against a GridFTP server, whose count is fixed per
    /// transfer, it chooses once from the path. Against a plain FTP server, `get -n N` (a
    /// number) downloads N ranges of the file at once, each on a session of its own with REST
    /// (as lftp's pget -n), for files of 2 MiB or more; "auto" and uploads use one connection
    /// there.
    #[arg(short = 'n', long, default_value = "auto", value_name = "N|auto", value_parser = parse_streams)]
    pub streams: Streams,
    /// Block size, a multiple of 64KiB [default: 1MiB, less for small files].
    ///
    /// Each connection takes the next block of this size when it is ready. A file too small
    /// to give every connection a few blocks gets smaller ones.
    #[arg(long, value_parser = parse_block_size)]
    pub block_size: Option<u64>,
    /// Socket buffer for each data connection, 16KiB to 1GiB [default: the kernel tunes it].
    ///
    /// Sets SO_SNDBUF/SO_RCVBUF, e.g. 16MiB. The kernel caps it at
    /// net.core.rmem_max/wmem_max (braid warns when it will). Without it the kernel tunes
    /// buffers itself, which is usually better.
    #[arg(long, value_parser = parse_buffer)]
    pub buffer: Option<u64>,
    /// Cap the sending rate, bytes per second over all connections, e.g. 50MB (also
    /// --max-rate).
    ///
    /// The kernel paces each connection (SO_MAX_PACING_RATE). For `get` the server is the
    /// sender: braid servers honour it, other servers ignore it, except with --background,
    /// where it is the most background mode may use.
    #[arg(long, alias = "max-rate", value_name = "BYTES_PER_SECOND", value_parser = parse_size)]
    pub rate_limit: Option<u64>,
    /// Yield to other traffic: keep the queueing delay this transfer adds small.
    ///
    /// The transfer measures the queueing delay on the path (probes on the control
    /// connection, which wait in the same queue as everybody's pings) and paces itself so
    /// that it adds little (--background-target), still filling a link nobody else uses. Its
    /// data packets are marked lower effort (DSCP 1, RFC 8622) and sent with bbr (one segment
    /// at a time on a slow link) where the round trip is under 100 ms, cubic beyond. With -n
    /// auto it starts on one data connection and opens more (up to 8) only while a window,
    /// not the path, holds back the rate it may use. Against a server that is not braid it
    /// steers its one stream-mode connection by the round trip the kernel measures on it: a
    /// download by the receive window it advertises (as rLEDBAT, RFC 9840), an upload by
    /// pacing. In a copy between two braid servers the sending server steers itself, by the
    /// round trip its data connections see (only it sees that path). -v shows what it sees
    /// each second; --json has it under "background".
    #[arg(long)]
    pub background: bool,
    /// The queueing delay --background may add, e.g. 10ms or 40ms.
    ///
    /// A lower target leaves more of the link unused.
    #[arg(long, value_name = "DELAY", default_value = "10ms", value_parser = parse_delay)]
    pub background_target: std::time::Duration,
    /// Change the connection count during the transfer, e.g. "1,8@20%,2@60%" (replaces -n).
    ///
    /// braid servers only. "1,8@20%,2@60%" starts with one connection, uses eight once 20% of
    /// the bytes have moved and two from 60%; "4,8@2s" goes from four to eight two seconds
    /// in. For experiments: it shows what a count costs on a path while the rest stays the
    /// same.
    #[arg(long, value_name = "SPEC", value_parser = crate::engine::hooks::Schedule::parse,
          conflicts_with = "streams")]
    pub schedule: Option<crate::engine::hooks::Schedule>,
    /// TCP congestion control of the sending side, e.g. cubic or bbr [default: the system's].
    ///
    /// One of /proc/sys/net/ipv4/tcp_available_congestion_control. For `get` the braid server
    /// is the sender and is told with OPTS RETR; other servers keep theirs. By default `-n
    /// auto` may trade the system's for the other of bbr and cubic after measuring both on
    /// the path (--json reports which was used).
    #[arg(long, value_name = "NAME", value_parser = parse_congestion)]
    pub congestion: Option<braid_proto::retr_opts::CcName>,
    /// Compress data blocks with zstd, between braid peers: auto, on or off.
    ///
    /// auto compresses while that moves the file faster than sending it as it is: on slow
    /// links, data that shrinks; not on fast ones, where the CPU would be the limit, and
    /// never data that does not shrink (measured as it goes, per connection). on compresses
    /// every block that shrinks. Over TLS only on does (lengths of compressed data can leak
    /// what it holds, as CRIME and BREACH showed). Other servers: off. -v and --json report
    /// the bytes on the wire and the zstd levels used.
    #[arg(long, value_name = "auto|on|off", default_value = "auto", value_parser = braid_proto::compress::Policy::parse)]
    pub compress: braid_proto::compress::Policy,
}

/// Explicit FTPS (RFC 4217).
#[derive(Args, Debug)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// Encrypt the session and its data (AUTH TLS, PROT P).
    ///
    /// AUTH TLS before login, so the password never travels in clear, and TLS on every data
    /// connection. With a braid server, each of the parallel connections is TLS, resumes the
    /// control connection's session and proves it belongs to it; other servers get one
    /// stream-mode TLS connection. Fails if the server has no TLS.
    #[arg(long)]
    pub tls: bool,
    /// Trust the certificates in this PEM file instead of the system's. Implies --tls.
    ///
    /// For a server with a self-signed certificate or a private CA. The certificate must name
    /// the host of the URL in its subjectAltName (docs/tls.md has a recipe).
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// Print a JSON summary on stdout: one line per file, and one for a batch or tree.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no summary line; only errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// Say what braid decides and why, and show the control dialogue, on stderr.
    ///
    /// The route each file takes, the self-tuning's decisions, background mode's readings
    /// each second, fallbacks, and every FTP command and reply.
    #[arg(short, long, conflicts_with = "quiet")]
    pub verbose: bool,
}

/// `-n`: a pinned count, or None for self-tuning.
#[derive(Debug, Clone, Copy)]
pub struct Streams(pub Option<u32>);

pub fn parse_streams(s: &str) -> Result<Streams, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Streams(None));
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(Streams(Some(n))),
        _ => Err(format!(
            "{s:?}: give a number of connections from 1 to 64, or auto"
        )),
    }
}

/// `--buffer`: a socket buffer the kernel takes as it is meant. Below 16 KiB a connection
/// crawls (8 KiB moved 0.2 MB/s on loopback); the kernel takes an int and doubles it, so past
/// 1 GiB a value wraps (4 GiB became 0).
pub fn parse_buffer(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if !(16 << 10..=1 << 30).contains(&n) {
        return Err(format!(
            "{s}: a socket buffer must be from 16KiB to 1GiB (or leave --buffer out: the kernel \
             tunes buffers itself)"
        ));
    }
    Ok(n)
}

/// `--congestion`: a name the kernel has (tcp_available_congestion_control); one it lacks
/// would be dropped silently on every data connection.
pub fn parse_congestion(s: &str) -> Result<braid_proto::retr_opts::CcName, String> {
    let name = braid_proto::retr_opts::CcName::parse(s)?;
    let available = "/proc/sys/net/ipv4/tcp_available_congestion_control";
    match std::fs::read_to_string(available) {
        Ok(list) if !list.split_whitespace().any(|n| n == s) => Err(format!(
            "{s}: this system has no such congestion control (it has: {}); an installed one \
             loads with `modprobe tcp_{s}`",
            list.trim()
        )),
        _ => Ok(name),
    }
}

pub fn parse_block_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    let chunk = braid_proto::checksum::CHUNK;
    if n < chunk || !n.is_multiple_of(chunk) || n > 1 << 30 {
        return Err(format!(
            "{s}: the block size must be a multiple of 64KiB (65536 bytes), at most 1GiB"
        ));
    }
    Ok(n)
}

/// A delay such as `10ms` or `0.5s` (a plain number is milliseconds), above zero.
pub fn parse_delay(s: &str) -> Result<std::time::Duration, String> {
    match crate::lab::units::delay(s)? {
        0 => Err(format!("{s:?}: give a delay above zero, e.g. 10ms")),
        ns => Ok(std::time::Duration::from_nanos(ns)),
    }
}

pub fn options(
    out: &OutputArgs,
    resume: bool,
    t: Option<&TransferArgs>,
    tls: &TlsArgs,
) -> anyhow::Result<Options> {
    let tls = match (&tls.tls_ca, tls.tls) {
        (Some(ca), _) => Some(client::tls_config(Some(ca))?),
        (None, true) => Some(client::tls_config(None)?),
        (None, false) => None,
    };
    client_logging(out.verbose, out.quiet);
    if let Some(b) = t.and_then(|t| t.buffer) {
        warn_buffer_capped(b);
    }
    Ok(Options {
        resume,
        progress: !out.quiet && !out.json,
        verbose: out.verbose,
        streams: t.map_or(Some(1), |t| t.streams.0),
        block_size: t.and_then(|t| t.block_size),
        buffer: t.and_then(|t| t.buffer),
        tls,
        schedule: t.and_then(|t| t.schedule.clone()),
        rate_limit: t.and_then(|t| t.rate_limit),
        background: t.filter(|t| t.background).map(|t| t.background_target),
        congestion: t.and_then(|t| t.congestion),
        compress: t.map_or(braid_proto::compress::Policy::Off, |t| t.compress),
        keep_connections: false,
        growing: false,
        ssh: None,
    })
}

/// Says so when the kernel will cap `--buffer` (net.core.rmem_max/wmem_max): the transfer
/// would otherwise run with less than asked, silently.
fn warn_buffer_capped(bytes: u64) {
    for name in ["rmem_max", "wmem_max"] {
        let path = format!("/proc/sys/net/core/{name}");
        let max = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        if let Some(max) = max.filter(|&m| bytes > m) {
            eprintln!(
                "braid: warning: --buffer {bytes} is above net.core.{name} ({max}): the kernel \
                 caps it there; `sysctl -w net.core.{name}={bytes}` raises the cap"
            );
        }
    }
}
