//! The command line: parse, validate, dispatch, map failures to exit codes.

use crate::client::error::{ClientError, exit};
use crate::client::{self, Options, url};
use crate::server::settings::{LogFormat, ServeArgs};
use crate::server::{self, Config, Shutdown};
use crate::units::parse_size;
use crate::users;
use anyhow::{Context, bail};
use braid_proto::session::Perm;
use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  other error
  2  usage error (bad arguments or URL)
  3  cannot connect to the server
  4  login refused
  5  the server refused the request (no such file, permission denied, ...)
  6  local file error (cannot read or write, disk full)
  7  transfer interrupted (partial download kept as DEST.part: rerun with --resume)
  8  integrity check failed (size or checksum mismatch)
  9  protocol error (not an FTP server, or a reply that makes no sense)
  10 TLS failed (handshake refused, certificate not trusted)
  11 some files of a recursive transfer (-r) failed; the others were moved, and the
     summary lists each failure with its cause

Credentials: ftp://user:password@host/path, or the password from BRAID_PASSWORD, or a
~/.netrc entry for the host (login and password). Without a user, braid logs in anonymously.";

#[derive(Parser, Debug)]
#[command(
    name = "braid",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("BRAID_COMMIT"), ")"),
    about = "Move large files fast over long, fat, slow or lossy networks",
    long_about = "braid is an FTP-compatible server and client built to move large files fast.\n\
                  Start with `braid demo` to see a verified transfer on loopback.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve a directory over FTP (anonymous and read-only unless told otherwise).
    Serve(ServeArgs),
    /// Download files: braid get ftp://host[:port]/path [DEST], or many: braid get URL... DIR
    #[command(after_help = EXIT_CODES)]
    Get {
        /// ftp://[user[:password]@]host[:port]/path, and last where to save: a file, a
        /// directory, `-` for standard output, or /dev/null to measure (the data is still
        /// checked) [default: the remote file's name in the current directory]. Several URLs
        /// (all on one server) share one session: one login, and in MODE E one file's data
        /// connections carry the next; the destination is then a directory.
        #[arg(value_name = "URL", required_unless_present = "input")]
        args: Vec<String>,
        /// Read more URLs from this file, one per line (blank lines and # comments skipped).
        #[arg(short = 'i', long, value_name = "FILE")]
        input: Option<PathBuf>,
        /// Continue a partial download (DEST.part) from where it stopped.
        #[arg(long)]
        resume: bool,
        /// The file is still being written on the server: take what comes past the size the
        /// server announced instead of stopping there with an error (exit 8).
        #[arg(long)]
        growing: bool,
        #[command(flatten)]
        tree: TreeArgs,
        #[command(flatten)]
        transfer: TransferArgs,
        #[command(flatten)]
        out: OutputArgs,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Upload files: braid put FILE ftp://host[:port]/path (a path ending in / keeps the name),
    /// or many: braid put FILE... ftp://host/dir/
    #[command(after_help = EXIT_CODES)]
    Put {
        /// The files to upload. Several share one session: one login, and in MODE E one
        /// file's data connections carry the next; the URL then names a directory (ends in /).
        /// `-` uploads standard input (alone, over one connection; the URL names the file).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// ftp://[user[:password]@]host[:port]/path
        url: String,
        /// Continue an interrupted upload from the size the server already holds.
        #[arg(long)]
        resume: bool,
        #[command(flatten)]
        tree: TreeArgs,
        #[command(flatten)]
        transfer: TransferArgs,
        #[command(flatten)]
        out: OutputArgs,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// List a remote directory.
    #[command(after_help = EXIT_CODES)]
    Ls {
        url: String,
        #[command(flatten)]
        out: OutputArgs,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Add or replace an account in a users file for `braid serve --users`. The password is
    /// read from the terminal (twice) or, when not on a terminal, from the first line of stdin.
    Passwd {
        user: String,
        /// The users file to update (created if missing).
        #[arg(long)]
        file: PathBuf,
        /// The user's root directory (relative paths are relative to the users file).
        #[arg(long)]
        root: PathBuf,
        /// Let the user upload, delete, rename and create directories.
        #[arg(long)]
        rw: bool,
    },
    /// Throughput, retransmissions, RTT and windows per TCP connection from a pcap/pcapng file.
    Trace(crate::trace::TraceArgs),
    /// The link emulator: two network namespaces joined by an emulated link (needs root).
    #[command(subcommand)]
    Lab(Box<crate::lab::LabCmd>),
    /// Predict throughput and transfer time on a path from the published models (window,
    /// slow start with N connections, loss, N-stream sharing, echo) and say which limit binds.
    Model(Box<crate::model::ModelArgs>),
    /// Measure transfers on the lab's emulated links: a sweep over scenarios, streams,
    /// buffers, block sizes, directions and tools, each cell repeated in shuffled rounds, with
    /// ping across the link during every run, statistics, the model's prediction beside each
    /// cell, and JSON, CSV, Markdown and SVG results (root for the lab; --loopback and --url
    /// need none).
    Bench(Box<crate::bench::BenchArgs>),
    /// Print a shell completion script, e.g. `braid completions bash >
    /// /etc/bash_completion.d/braid` (zsh: into a directory on $fpath as `_braid`).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), e.g. `braid man > /usr/local/share/man/man1/braid.1`;
    /// with a directory, write a page for braid and one for each subcommand there.
    Man {
        /// Where to write braid.1, braid-get.1, ...
        dir: Option<PathBuf>,
    },
    /// Run a loopback server, download a generated file from it, verify it and print the rate.
    Demo {
        /// Size of the generated file, e.g. 256MiB, 1GiB, 1000000.
        #[arg(long, default_value = "256MiB", value_parser = parse_size)]
        size: u64,
    },
}

/// Whole directories.
#[derive(Args, Debug)]
struct TreeArgs {
    /// Copy directories with everything in them: each source (a directory or a file) lands
    /// under its own name in the destination directory, DEST/NAME (get) or URL/NAME (put),
    /// which is created if missing, so running the same command again finds the same files
    /// (the server's top directory has no name: its contents go into DEST). Directories are walked with MLSD (LIST on servers without it),
    /// created on the other side, and keep their modification times on download. Symbolic
    /// links are skipped and listed, never followed; names that are unsafe here (.., /,
    /// control characters, or equal but for case on a filesystem that ignores case) are
    /// refused. A file that fails does not stop the others: the summary lists it and the exit
    /// code is 11.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// With -r: skip files whose destination has the same size and is not older, and continue
    /// partial downloads and uploads broken off in MODE E (braid and GridFTP servers), so a
    /// re-run after an interruption moves only what is missing.
    #[arg(long, requires = "recursive")]
    update: bool,
    /// With -r: files in flight at once, each on a session (login) of its own; large files
    /// still get their -n connections each. Lower it for servers that limit sessions per
    /// client (a refused session leaves its files to the others).
    #[arg(short = 'j', long, default_value_t = 4, value_name = "N", requires = "recursive",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    concurrency: u16,
}

/// How a transfer uses the network. These apply when the server offers MODE E (a braid or
/// GridFTP server); against a plain FTP server only -n does, for downloads.
#[derive(Args, Debug)]
struct TransferArgs {
    /// Parallel data connections, used when the server offers MODE E (braid, GridFTP servers).
    /// Against a plain FTP server, `get -n N` (a number) downloads N ranges of the file at once,
    /// each on a session of its own with REST (as lftp's pget -n), for files of 2 MiB or more;
    /// "auto" and uploads use one connection there. More help on long or lossy paths, where one
    /// TCP connection cannot fill the link. "auto": against a braid server, braid starts with 4
    /// and adds or removes connections while the data moves, keeping a count only while it
    /// adds goodput without adding loss or queueing delay (-v shows each decision, --json
    /// lists them); against a GridFTP server, whose count is fixed per transfer, it uses 4.
    /// A number pins the count (1-64).
    #[arg(short = 'n', long, default_value = "auto", value_name = "N|auto", value_parser = parse_streams)]
    streams: Streams,
    /// Block size: each connection takes the next block of this size when it is ready. A
    /// multiple of 64KiB [default: 1MiB, less for a file too small to give every connection
    /// a few blocks].
    #[arg(long, value_parser = parse_block_size)]
    block_size: Option<u64>,
    /// Socket buffer size for each data connection (SO_SNDBUF/SO_RCVBUF), e.g. 16MiB, from
    /// 16KiB to 1GiB; the kernel caps it at net.core.rmem_max/wmem_max (braid warns when it
    /// will). Without it the kernel tunes buffers itself, which is usually better.
    #[arg(long, value_parser = parse_buffer)]
    buffer: Option<u64>,
    /// Cap the transfer's sending rate, in bytes per second over all its connections, e.g.
    /// 50MB or 4MiB (also --max-rate). The kernel paces each connection
    /// (SO_MAX_PACING_RATE). For `get` the server is the sender: braid servers honour it,
    /// other servers ignore it, except with --background, where it is the most background
    /// mode may use.
    #[arg(long, alias = "max-rate", value_name = "BYTES_PER_SECOND", value_parser = parse_size)]
    rate_limit: Option<u64>,
    /// Yield to other traffic: the transfer measures the queueing delay on the path (probes on
    /// the control connection, which wait in the same queue as everybody's pings) and paces
    /// itself so that it adds little (--background-target), still filling a link nobody else
    /// uses. Its data packets are marked lower effort (DSCP 1, RFC 8622) and sent with bbr
    /// (one segment at a time on a slow link) where the round trip is under 100 ms, cubic
    /// beyond. With -n auto it starts on one data connection and opens more (up to 8) only
    /// while a window, not the path, holds back the rate it may use. Against a server that is
    /// not braid it steers its one stream-mode connection by the round trip the kernel
    /// measures on it: a download by the receive window it advertises (as rLEDBAT, RFC 9840),
    /// an upload by pacing. -v shows what it sees each second; --json has it under
    /// "background".
    #[arg(long)]
    background: bool,
    /// The queueing delay --background may add, e.g. 10ms or 40ms. A lower target leaves
    /// more of the link unused.
    #[arg(long, value_name = "DELAY", default_value = "10ms", value_parser = parse_delay)]
    background_target: std::time::Duration,
    /// Change the number of connections during the transfer (braid servers only; replaces
    /// -n): "1,8@20%,2@60%" starts with one connection, uses eight once 20% of the bytes have
    /// moved and two from 60%; "4,8@2s" goes from four to eight two seconds in. For
    /// experiments: it shows what a count costs on a path while the rest stays the same.
    #[arg(long, value_name = "SPEC", value_parser = crate::engine::hooks::Schedule::parse,
          conflicts_with = "streams")]
    schedule: Option<crate::engine::hooks::Schedule>,
    /// TCP congestion control for the sending side's data connections, e.g. cubic or bbr
    /// (see /proc/sys/net/ipv4/tcp_available_congestion_control). For `get` the braid server
    /// is the sender and is told with OPTS RETR; other servers keep theirs. Default: the
    /// system's, which `-n auto` may trade for the other of bbr and cubic after measuring
    /// both on the path (--json reports which was used).
    #[arg(long, value_name = "NAME", value_parser = parse_congestion)]
    congestion: Option<braid_proto::retr_opts::CcName>,
}

/// `-n`: a pinned count, or None for self-tuning.
#[derive(Debug, Clone, Copy)]
struct Streams(Option<u32>);

fn parse_streams(s: &str) -> Result<Streams, String> {
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
fn parse_buffer(s: &str) -> Result<u64, String> {
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
fn parse_congestion(s: &str) -> Result<braid_proto::retr_opts::CcName, String> {
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

fn parse_block_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    let chunk = braid_proto::checksum::CHUNK;
    if n < chunk || !n.is_multiple_of(chunk) || n > 1 << 30 {
        return Err(format!(
            "{s}: the block size must be a multiple of 64KiB (65536 bytes), at most 1GiB"
        ));
    }
    Ok(n)
}

/// Explicit FTPS (RFC 4217).
#[derive(Args, Debug)]
struct TlsArgs {
    /// Encrypt the session: AUTH TLS before login (so the password never travels in clear) and
    /// TLS on every data connection (PROT P). With a braid server, each of the parallel
    /// connections is TLS, resumes the control connection's session and proves it belongs to
    /// it; other servers get one stream-mode TLS connection. Fails if the server has no TLS.
    #[arg(long)]
    tls: bool,
    /// Trust the certificates in this PEM file (e.g. a self-signed server's) instead of the
    /// system's. Implies --tls.
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct OutputArgs {
    /// Print one line of JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
    /// Show the control-connection dialogue on stderr.
    #[arg(short, long, conflicts_with = "quiet")]
    verbose: bool,
}

/// A delay such as `10ms` or `0.5s` (a plain number is milliseconds), above zero.
fn parse_delay(s: &str) -> Result<std::time::Duration, String> {
    match crate::lab::units::delay(s)? {
        0 => Err(format!("{s:?}: give a delay above zero, e.g. 10ms")),
        ns => Ok(std::time::Duration::from_nanos(ns)),
    }
}

pub fn main() -> ExitCode {
    // A write past the file size limit (`ulimit -f`) then fails with EFBIG, which fails that
    // file alone with a message, instead of SIGXFSZ killing the process and every other
    // transfer with it (a client's tree, a server's sessions).
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = e
                .downcast_ref::<ClientError>()
                .map_or(exit::OTHER, ClientError::exit_code);
            eprintln!("braid: error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// Standard error for log lines, where a line that cannot be written is dropped. Whoever
/// read the log may have gone (a closed pipe); tracing-subscriber reports a failed write with
/// `eprintln!`, which panics on a closed stderr, and the panic took each new session of the
/// server with it.
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Log lines on stderr up to `level`, or as `RUST_LOG` says when it is set. The server's
/// carry time and source, for its log, as text or JSON; the client's (`terse`) only the level
/// and the message, for the person at the terminal.
fn init_logging(level: tracing::Level, terse: bool, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(level.as_str().to_ascii_lowercase()));
    let fmt = tracing_subscriber::fmt()
        .with_writer(|| LogWriter)
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && format == LogFormat::Text);
    let _ = match (terse, format) {
        (true, _) => fmt.without_time().with_target(false).try_init(),
        (false, LogFormat::Json) => fmt.json().flatten_event(true).try_init(),
        (false, LogFormat::Text) => fmt.try_init(),
    };
}

/// The client's own messages: warnings, and with -v what it decided and why (the
/// self-tuning's steps, fallbacks); -q keeps only errors.
fn client_logging(out: &OutputArgs) {
    let level = match (out.verbose, out.quiet) {
        (true, _) => tracing::Level::INFO,
        (_, true) => tracing::Level::ERROR,
        _ => tracing::Level::WARN,
    };
    init_logging(level, true, LogFormat::Text);
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Cmd::Serve(args) => serve(args).map(|()| exit::OK),
        Cmd::Get {
            args,
            input,
            resume,
            growing,
            tree,
            transfer,
            out,
            tls,
        } => {
            let (urls, dest) = get_args(args, input.as_deref())?;
            let opts = Options {
                growing,
                ..options(&out, resume, Some(&transfer), &tls)?
            };
            let sources = url::CredentialSources::from_env();
            if tree.recursive {
                let targets = urls
                    .iter()
                    .map(|u| url::parse(u, &sources))
                    .collect::<Result<Vec<_>, _>>()?;
                let pairs = get_tree_tops(targets, dest.as_deref())?;
                let s =
                    client::tree::get_tree(&pairs, &opts, tree.options(), |s| per_file(s, &out))?;
                return report_tree(&s, &out);
            }
            if let [url] = urls.as_slice() {
                let target = url::parse(url, &sources)?;
                let dest = client::resolve_dest(dest.as_deref(), &target.path)?;
                let summary = client::get(&target, &dest, &opts)?;
                return report(&summary, &out, matches!(dest, client::Dest::Stdout));
            }
            let dir = dest.unwrap_or_else(|| ".".into());
            if !Path::new(&dir).is_dir() {
                return Err(client::error::ClientError::Usage(format!(
                    "{dir} is not a directory: with several URLs the destination is a directory"
                ))
                .into());
            }
            let mut jobs = Vec::new();
            for u in &urls {
                let target = url::parse(u, &sources)?;
                let dest = client::resolve_dest(Some(&dir), &target.path)?;
                jobs.push((target, dest));
            }
            let batch = client::get_batch(&jobs, &opts, |s| per_file(s, &out))?;
            report_batch(&batch, &out)
        }
        Cmd::Put {
            files,
            url,
            resume,
            tree,
            transfer,
            out,
            tls,
        } => {
            let target = url::parse(&url, &url::CredentialSources::from_env())?;
            let opts = options(&out, resume, Some(&transfer), &tls)?;
            if tree.recursive {
                let pairs = put_tree_tops(&files, &target)?;
                let s =
                    client::tree::put_tree(&pairs, &opts, tree.options(), |s| per_file(s, &out))?;
                return report_tree(&s, &out);
            }
            if let [file] = files.as_slice() {
                let summary = client::put(file, &target, &opts)?;
                return report(&summary, &out, false);
            }
            let batch = client::put_batch(&files, &target, &opts, |s| per_file(s, &out))?;
            report_batch(&batch, &out)
        }
        Cmd::Ls { url, out, tls } => {
            let target = url::parse(&url, &url::CredentialSources::from_env())?;
            let entries = client::ls(&target, &options(&out, false, None, &tls)?)?;
            if out.json {
                println!("{}", serde_json::to_string(&entries)?);
            } else {
                for e in entries {
                    match e.raw {
                        Some(raw) => println!("{raw}"),
                        None => {
                            let when = e.modify.map(braid_proto::time::Civil::from_unix).map(|c| {
                                format!(
                                    "{:04}-{:02}-{:02} {:02}:{:02}",
                                    c.year, c.month, c.day, c.hour, c.minute
                                )
                            });
                            let kind = if e.kind.as_deref() == Some("dir") {
                                "d"
                            } else {
                                "-"
                            };
                            println!(
                                "{kind} {:>14} {:16} {}",
                                e.size.map(|s| s.to_string()).unwrap_or_default(),
                                when.unwrap_or_default(),
                                e.name
                            );
                        }
                    }
                }
            }
            Ok(exit::OK)
        }
        Cmd::Passwd {
            user,
            file,
            root,
            rw,
        } => {
            let password = read_new_password()?;
            let perm = if rw { Perm::ReadWrite } else { Perm::ReadOnly };
            users::write_entry(&file, &user, &password, perm, &root)?;
            eprintln!(
                "braid: {} user {user} in {} (root {})",
                if rw { "read-write" } else { "read-only" },
                file.display(),
                root.display()
            );
            let resolved = users::base_of(&file).join(&root);
            if !resolved.is_dir() {
                eprintln!(
                    "braid: warning: {} is not a directory; {user} cannot log in until it is created",
                    resolved.display()
                );
            }
            Ok(exit::OK)
        }
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "braid", &mut script);
            print_all(&script)
        }
        Cmd::Man { dir: None } => {
            let mut page = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut page)?;
            print_all(&page)
        }
        Cmd::Man { dir: Some(dir) } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write manual pages into {}", dir.display()))?;
            eprintln!("braid: manual pages written to {}", dir.display());
            Ok(exit::OK)
        }
        Cmd::Demo { size } => crate::demo::run(size).map(|()| exit::OK),
        Cmd::Lab(cmd) => crate::lab::main(*cmd),
        Cmd::Trace(args) => crate::trace::main(args),
        Cmd::Model(args) => crate::model::main(*args),
        Cmd::Bench(args) => crate::bench::main(*args),
    }
}

/// One file of a batch done: a JSON line, or a line of text with -v.
fn per_file(s: &client::Summary, out: &OutputArgs) {
    if out.json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
    } else if out.verbose {
        eprintln!("braid: {}", s.human());
    }
}

/// The end of a batch: a last JSON line, or one line of text.
fn report_batch(batch: &client::Batch, out: &OutputArgs) -> anyhow::Result<u8> {
    if out.json {
        println!("{}", serde_json::to_string(batch)?);
    } else if !out.quiet {
        eprintln!(
            "braid: {} files, {} in {:.2} s ({}/s), one session, {} data connection(s)",
            batch.files,
            client::human_bytes(batch.bytes as f64),
            batch.seconds,
            client::human_bytes(batch.bytes_per_second),
            batch.data_connections
        );
    }
    Ok(exit::OK)
}

impl TreeArgs {
    fn options(&self) -> client::tree::TreeOptions {
        client::tree::TreeOptions {
            concurrency: self.concurrency.into(),
            update: self.update,
        }
    }
}

/// Where each source of `get -r` goes: DEST/NAME (default: NAME here); the server's top
/// directory, which has no name, into DEST itself.
fn get_tree_tops(
    targets: Vec<url::Target>,
    dest: Option<&str>,
) -> anyhow::Result<Vec<(url::Target, PathBuf)>> {
    use client::error::ClientError::Usage;
    if matches!(dest, Some("-" | "/dev/null")) {
        return Err(Usage(
            "-r needs a directory to write into, not standard output or /dev/null".into(),
        )
        .into());
    }
    let dest = PathBuf::from(dest.unwrap_or("."));
    targets
        .into_iter()
        .map(|t| {
            let name = t
                .path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("");
            if name.is_empty() {
                return Ok((t, dest.clone()));
            }
            if let Some(why) = client::names::unsafe_name(name) {
                let url = client::display_url(&t);
                return Err(Usage(format!("{url}: the source's name is {why}")).into());
            }
            let top = dest.join(name);
            Ok((t, top))
        })
        .collect()
}

/// Where each source of `put -r` goes: URL/NAME, the URL naming a directory (with or without
/// its final /).
fn put_tree_tops(
    files: &[PathBuf],
    target: &url::Target,
) -> anyhow::Result<Vec<(PathBuf, url::Target)>> {
    use client::error::ClientError::Usage;
    files
        .iter()
        .map(|f| {
            if f == Path::new("-") {
                return Err(Usage(
                    "-r cannot read standard input (-): put it alone, without -r".into(),
                )
                .into());
            }
            let full =
                std::fs::canonicalize(f).with_context(|| format!("cannot read {}", f.display()))?;
            let name = full.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                Usage(format!(
                    "{} has no name to give it on the server",
                    f.display()
                ))
            })?;
            let mut top = target.clone();
            if !(top.path.is_empty() || top.path.ends_with('/')) {
                top.path.push('/');
            }
            top.path.push_str(name);
            Ok((f.clone(), top))
        })
        .collect()
}

/// The end of a tree transfer: its summary (a JSON line, or text with every failure), and the
/// exit code that says whether every file made it.
fn report_tree(s: &client::tree::TreeSummary, out: &OutputArgs) -> anyhow::Result<u8> {
    if out.json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(s.exit_code());
    }
    if !out.quiet {
        eprintln!(
            "braid: {} files, {} in {:.2} s ({}/s){}, {} director{}, {} session(s){}",
            s.files,
            client::human_bytes(s.bytes as f64),
            s.seconds,
            client::human_bytes(s.bytes_per_second),
            if s.up_to_date > 0 {
                format!(", {} already up to date", s.up_to_date)
            } else {
                String::new()
            },
            s.directories,
            if s.directories == 1 { "y" } else { "ies" },
            s.sessions,
            if s.interrupted {
                "; stopped by Ctrl-C: run again with --update to move the rest"
            } else {
                ""
            },
        );
        for k in &s.skipped {
            eprintln!("braid: skipped {}: {}", k.path, k.why);
        }
    }
    for f in &s.failed {
        eprintln!("braid: failed {}: {}", f.path, f.error);
    }
    if !s.failed.is_empty() {
        eprintln!(
            "braid: {} of {} failed",
            s.failed.len(),
            s.failed.len() as u64 + s.files + s.up_to_date
        );
    }
    Ok(s.exit_code())
}

/// Splits `get`'s arguments into URLs and a destination: the last argument is the
/// destination when there are several and it is not a URL. `--input` adds URLs from a file.
fn get_args(
    mut args: Vec<String>,
    input: Option<&Path>,
) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let is_url = |a: &str| a.to_ascii_lowercase().starts_with("ftp://");
    let dest = match args.last() {
        Some(last) if !is_url(last) && (args.len() > 1 || input.is_some()) => args.pop(),
        _ => None,
    };
    if let Some(bad) = args.iter().find(|a| !is_url(a)) {
        return Err(client::error::ClientError::Usage(format!(
            "{bad:?} is not an ftp:// URL (only the last argument may be a destination)"
        ))
        .into());
    }
    if let Some(file) = input {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read the URL list {}: {e}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !is_url(line) {
                return Err(client::error::ClientError::Usage(format!(
                    "{}:{}: {line:?} is not an ftp:// URL",
                    file.display(),
                    n + 1
                ))
                .into());
            }
            args.push(line.to_string());
        }
    }
    if args.is_empty() {
        return Err(client::error::ClientError::Usage("no URL to download".into()).into());
    }
    Ok((args, dest))
}

fn options(
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
    client_logging(out);
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
        keep_connections: false,
        growing: false,
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

fn report(summary: &client::Summary, out: &OutputArgs, data_on_stdout: bool) -> anyhow::Result<u8> {
    if out.json {
        let line = serde_json::to_string(summary)?;
        if data_on_stdout {
            eprintln!("{line}")
        } else {
            println!("{line}")
        }
    } else if !out.quiet && std::io::stderr().is_terminal() {
        eprintln!("braid: {}", summary.human());
    }
    Ok(exit::OK)
}

/// Writes generated text to stdout; a reader that stops early (`| head`) is not an error.
fn print_all(bytes: &[u8]) -> anyhow::Result<u8> {
    use std::io::Write;
    match std::io::stdout().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(exit::OK),
    }
}

fn read_new_password() -> anyhow::Result<String> {
    let pw = if std::io::stdin().is_terminal() {
        let a = rpassword::prompt_password("New password: ")?;
        let b = rpassword::prompt_password("Again: ")?;
        if a != b {
            bail!("the passwords differ");
        }
        a
    } else {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("cannot read the password from stdin")?;
        line.trim_end_matches(['\r', '\n']).to_string()
    };
    if pw.is_empty() {
        bail!("empty password");
    }
    Ok(pw)
}

fn serve(cli: ServeArgs) -> anyhow::Result<()> {
    let args = cli.resolve()?;
    let level = if args.verbose {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    init_logging(level, false, args.log_format.unwrap_or_default());
    let config = args.config(None)?;
    let root = config.root.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listen = args.listen();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} (is another server using it? pick another with --listen)"))?;
        let addr = listener.local_addr()?;
        let metrics = match args.metrics {
            Some(at) => Some(tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot serve metrics on {at} (is the port taken? pick another with --metrics)"))?),
            None => None,
        };
        let who = args.who(&config);
        let tls = if config.tls.is_some() { "; AUTH TLS offered" } else { "" };
        // Written, not printed: a closed stdout must not stop the server.
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "braid serve: serving {} ({who}{tls}) at {}", root.display(), server::url_for(addr));
        if let Some(listener) = metrics {
            let _ = writeln!(out, "braid serve: metrics at http://{}/metrics", listener.local_addr()?);
            tokio::spawn(server::metrics::serve(listener, config.metrics.clone()));
        }
        let _ = out.flush();
        let (configs_tx, configs) = tokio::sync::watch::channel(Arc::new(config));
        tokio::spawn(reload_on_hangup(cli, args.clone(), configs_tx));
        let (stop, stop_rx) = tokio::sync::watch::channel(Shutdown::Running);
        let grace = args.shutdown_grace();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received: no new sessions; running transfers get {}s to finish (signal again to cut them)", grace.as_secs());
            let _ = stop.send(Shutdown::Graceful);
            tokio::select! {
                _ = wait_for_signal() => {}
                _ = tokio::time::sleep(grace) => {}
            }
            let _ = stop.send(Shutdown::Abort);
        });
        server::run(listener, configs, stop_rx).await?;
        tracing::info!("server stopped");
        anyhow::Ok(())
    })
}

/// On SIGHUP: reads the config file and the users file again and gives new sessions the
/// result (running sessions keep theirs). A file with a mistake changes nothing: the error
/// is logged and the server goes on as it was.
async fn reload_on_hangup(
    cli: ServeArgs,
    mut running: ServeArgs,
    configs: tokio::sync::watch::Sender<Arc<Config>>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot catch SIGHUP: reloading is off");
        return;
    };
    while hangup.recv().await.is_some() {
        let old = configs.borrow().clone();
        let cli = cli.clone();
        let built = tokio::task::spawn_blocking(move || {
            let args = cli.resolve()?;
            let config = args.config(Some(&old))?;
            anyhow::Ok((args, config))
        })
        .await;
        match built {
            Ok(Ok((args, config))) => {
                if let Some(fixed) = running.fixed_changes(&args) {
                    tracing::warn!("reload: {fixed} change only with a restart; kept as they were");
                }
                tracing::info!(
                    accounts = config.users.len(),
                    anonymous = args.who(&config),
                    "configuration reloaded"
                );
                configs.send_replace(Arc::new(config));
                running = args;
            }
            Ok(Err(e)) => tracing::error!("reload failed, nothing changed: {e:#}"),
            Err(e) => tracing::error!("reload failed, nothing changed: {e}"),
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges() {
        assert_eq!(
            server::settings::parse_range("50000-50100"),
            Ok((50000, 50100))
        );
        assert!(server::settings::parse_range("5-1").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
