//! `braid get`, `put` and `ls`: a blocking FTP client. One thread per data connection is plenty
//! for a client and keeps the data path a plain read/write loop.

mod control;
pub mod error;
mod interrupt;
pub mod names;
mod parallel;
mod pipeline;
mod probe;
mod records;
mod segments;
mod stream_yield;
mod tickets;
pub mod tree;
mod trust;
pub mod url;
mod wire;

use crate::engine::stream::{self, CopyError};
use braid_proto::Command;
pub use control::Control;
use error::{ClientError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Instant;
use url::Target;
use wire::Wire;
pub use wire::client_config as tls_config;

/// Data-path buffer size: big reads and writes, few syscalls.
const BUF: usize = 1 << 20;

/// Options shared by the client commands.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub resume: bool,
    /// Show a progress bar (only ever on a terminal).
    pub progress: bool,
    /// Print the control dialogue on stderr.
    pub verbose: bool,
    /// Data connections for MODE E transfers (1 still uses MODE E's checksummed framing);
    /// None: braid chooses, and changes the count while the data moves (`-n auto`).
    pub streams: Option<u32>,
    /// Block size for MODE E (None: the default).
    pub block_size: Option<u64>,
    /// Fixed socket buffer size (None: kernel autotuning).
    pub buffer: Option<u64>,
    /// `--tls`: AUTH TLS before login, and PROT P data connections.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// `--schedule`: connection counts over the transfer (braid servers only).
    pub schedule: Option<crate::engine::hooks::Schedule>,
    /// `--rate-limit`: cap on the sending rate, bytes/s (the server's, for a download).
    pub rate_limit: Option<u64>,
    /// `--background`: yield to other traffic, adding at most this much queueing delay.
    pub background: Option<std::time::Duration>,
    /// `--congestion`: the TCP congestion control of the sending side's data connections
    /// (a braid server's, for a download).
    pub congestion: Option<braid_proto::retr_opts::CcName>,
    /// MODE E uploads end with EOD but without CLOSE, so the next upload of the session can
    /// use the same data connections (set for batches).
    pub keep_connections: bool,
    /// `--growing`: a download may go past the size the server announced (a file still being
    /// written); otherwise more than announced is an error.
    pub growing: bool,
}

/// What a braid server said of its sending during a download (`113 Sender`, the last one).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SenderSeen {
    pub sent: u64,
    pub resent: u64,
    /// Its data connections' time with data in flight, summed, ms.
    pub busy_ms: u64,
    /// Of that, held back by this side's receive window.
    pub rwnd_limited_ms: u64,
    /// Of that, held back by its own send buffer.
    pub sndbuf_limited_ms: u64,
}

/// What a finished transfer reports (`--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub op: &'static str,
    pub url: String,
    pub local: String,
    /// Bytes moved in this run.
    pub bytes: u64,
    /// Size of the whole file, when known.
    pub size: Option<u64>,
    /// Where this run started (non-zero when resumed).
    pub resumed_from: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Transfer mode used: `stream` is plain FTP over one data connection,
    /// `stream-segmented` is plain FTP with a range of the file on each of `streams`
    /// sessions, `extended-block` is MODE E over `streams` connections.
    pub mode: &'static str,
    /// Most data connections open at the same time (a small file may finish before all the
    /// asked-for connections have joined).
    pub streams: u32,
    /// Bytes each data connection carried (MODE E).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_connection_bytes: Vec<u64>,
    /// The whole-file checksum that was compared with the server's, `ALG hex`.
    pub checksum: Option<String>,
    /// MODE E: each data connection's life (when it joined and ended, bytes, how it ended).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<crate::engine::stats::LinkRecord>,
    /// MODE E: open data connections over time, `[seconds, count]` at each change.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connection_count: Vec<crate::engine::stats::Count>,
    /// MODE E: one row per open connection per second: bytes, rate and the kernel's TCP_INFO.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<crate::engine::stats::Sample>,
    /// MODE E: how the connection count was chosen, `auto` (self-tuning) or `fixed` (`-n N`,
    /// `--schedule`, or a GridFTP server, whose count is fixed per transfer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<&'static str>,
    /// MODE E: the block size used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// MODE E: the congestion control of the sending side's data connections (this side's
    /// for an upload, the braid server's report for a download).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// MODE E download from a braid server: its last report on its data connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<SenderSeen>,
    /// MODE E, `-n auto`: each decision of the self-tuning, with what it measured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<crate::engine::hooks::Note>,
    /// MODE E, `--background`: the queueing delay the controller saw, its rate each second,
    /// and the time it spent yielding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<crate::engine::background::Report>,
    /// Data connections this transfer opened (0 when it reused those of the one before).
    pub new_data_connections: u32,
    /// MODE E under TLS: the data connections' handshakes, full and resumed (a resumed one
    /// skips the certificate exchange).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_handshakes: Option<crate::engine::transfer::Handshakes>,
}

impl Summary {
    pub fn human(&self) -> String {
        format!(
            "{} {} bytes in {:.2} s ({}/s), {} mode, {} stream(s){}{}",
            self.op,
            self.bytes,
            self.seconds,
            human_bytes(self.bytes_per_second),
            self.mode,
            self.streams,
            if self.resumed_from > 0 {
                format!(", resumed at byte {}", self.resumed_from)
            } else {
                String::new()
            },
            self.background.as_ref().map_or(String::new(), |b| {
                format!(
                    ", background: queue {} ms median over a {} ms base, {:.1} s yielding",
                    b.queue_p50_ms.map_or("?".into(), |q| format!("{q:.1}")),
                    b.base_ms.map_or("?".into(), |q| format!("{q:.1}")),
                    b.yielded_s
                )
            })
        )
    }
}

pub fn human_bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The URL without its password, for summaries and logs.
pub fn display_url(t: &Target) -> String {
    let host = if t.host.contains(':') {
        format!("[{}]", t.host)
    } else {
        t.host.clone()
    };
    format!("ftp://{}@{}:{}/{}", t.user, host, t.port, t.path)
}

/// Connects, logs in, reads FEAT, sets TYPE I. `size_of`: a file whose SIZE is asked in the
/// same flight where the server pipelines (a braid server).
fn session(target: &Target, opts: &Options, size_of: Option<&str>) -> Result<Control> {
    let mut c = Control::connect(target)?;
    c.set_verbose(opts.verbose);
    if let Some(tls) = &opts.tls {
        c.start_tls(tls, &target.host)?;
    }
    c.start(target, size_of)?;
    Ok(c)
}

/// A further session for a transfer that has one already (a segment's, a tree's worker's):
/// tried at once, then again after 0.1, 0.4 and 1.6 s, since a server that limits sessions
/// per client (421) still counts one that has just closed. The last failure when every try
/// failed; `give_up` (Ctrl-C, an aborted download) stops the tries.
fn another_session(target: &Target, opts: &Options, give_up: impl Fn() -> bool) -> Result<Control> {
    let mut last = ClientError::Interrupted {
        bytes: 0,
        why: "stopped before a new session started".into(),
        partial: None,
    };
    for wait in [0, 100, 400, 1600] {
        std::thread::sleep(std::time::Duration::from_millis(wait));
        if give_up() {
            break;
        }
        match session(target, opts, None) {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn progress_bar(opts: &Options, total: Option<u64>, start: u64) -> ProgressBar {
    if !opts.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(
        "{bytes:>10}/{total_bytes:10} [{wide_bar}] {binary_bytes_per_sec:>12} ETA {eta:>4}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.set_position(start);
    bar
}

/// Where a download goes.
#[derive(Debug, Clone)]
pub enum Dest {
    Stdout,
    /// `/dev/null`: the data is received and checked, then dropped (for measurements).
    Null,
    File(PathBuf),
}

/// The file a download lands in: DEST itself, DEST/NAME if DEST is a directory, or NAME in the
/// current directory when no DEST is given.
pub fn resolve_dest(dest: Option<&str>, remote_path: &str) -> Result<Dest> {
    let name = remote_path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..");
    match dest {
        Some("-") => Ok(Dest::Stdout),
        Some("/dev/null") => Ok(Dest::Null),
        Some(d) if Path::new(d).is_dir() => match name {
            Some(n) => Ok(Dest::File(Path::new(d).join(n))),
            None => Err(ClientError::Usage(format!(
                "the URL names no file to save into directory {d}"
            ))),
        },
        Some(d) => Ok(Dest::File(PathBuf::from(d))),
        None => name
            .map(|n| Dest::File(PathBuf::from(n)))
            .ok_or_else(|| ClientError::Usage("the URL names no file; give a destination".into())),
    }
}

/// `DEST.part`: where a download is written until it is complete and checked.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

fn local_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClientError {
    let what = what.into();
    move |cause| ClientError::Local { what, cause }
}

/// A download in progress: `part` is renamed to `final_path` once complete.
struct PartFile {
    final_path: PathBuf,
    part: PathBuf,
    file: File,
}

impl PartFile {
    /// Cuts the partial to `len` when given (blocks may have landed past the end of an older,
    /// longer partial), flushes it to disk and gives it its final name, which it returns.
    fn commit(self, len: Option<u64>) -> Result<String> {
        let part = &self.part;
        len.map_or(Ok(()), |l| self.file.set_len(l))
            .and_then(|_| self.file.sync_all())
            .map_err(local_err(format!("cannot flush {}", part.display())))?;
        std::fs::rename(part, &self.final_path).map_err(local_err(format!(
            "cannot rename {} to {}",
            part.display(),
            self.final_path.display()
        )))?;
        Ok(self.final_path.display().to_string())
    }
}

/// A download replaces an existing DEST the way `curl -o` and `cp` do, once it is complete
/// and checked, but not a file without any write permission: someone protected it.
fn refuse_read_only(dest: &Dest) -> Result<()> {
    match dest {
        Dest::File(p) if std::fs::metadata(p).is_ok_and(|m| m.permissions().readonly()) => {
            Err(ClientError::Local {
                what: format!("{} exists and is read-only", p.display()),
                cause: std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "braid does not replace a write-protected file: make it writable, remove it, or choose another destination",
                ),
            })
        }
        _ => Ok(()),
    }
}

/// Downloads one file.
pub fn get(target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    refuse_read_only(dest)?;
    let mut c = session(target, opts, Some(&target.path))?;
    let s = get_on(&mut c, target, dest, opts)?;
    c.quit();
    Ok(s)
}

/// Downloads many files from one server in one session: one login, the settings sent once,
/// and in MODE E the data connections of one file carry the next (reply 125). Stops at the
/// first failure; what was done is reported through `done` as it completes.
pub fn get_batch(
    targets: &[(Target, Dest)],
    opts: &Options,
    mut done: impl FnMut(&Summary),
) -> Result<Batch> {
    let Some((first, _)) = targets.first() else {
        return Err(ClientError::Usage("no files to download".into()));
    };
    for (_, dest) in targets {
        refuse_read_only(dest)?;
    }
    let mut batch = Batch::start("get-batch");
    let mut c = session(first, opts, Some(&first.path))?;
    for (target, dest) in targets {
        if (&target.host, target.port, &target.user) != (&first.host, first.port, &first.user) {
            return Err(ClientError::Usage(format!(
                "{} is on another server than {}: one batch is one session",
                display_url(target),
                display_url(first)
            )));
        }
        let s = get_on(&mut c, target, dest, opts)?;
        batch.add(&s);
        done(&s);
    }
    c.quit();
    Ok(batch.finish())
}

/// What a batch did, for `--json` (after the per-file summaries).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Batch {
    pub op: &'static str,
    pub files: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Always 1: the point of a batch.
    pub logins: u32,
    /// Data connections opened for the whole batch (reused ones are not counted again).
    pub data_connections: u32,
    #[serde(skip)]
    started: Instant,
}

impl Batch {
    fn start(op: &'static str) -> Batch {
        Batch {
            op,
            files: 0,
            bytes: 0,
            seconds: 0.0,
            bytes_per_second: 0.0,
            logins: 1,
            data_connections: 0,
            started: Instant::now(),
        }
    }

    fn add(&mut self, s: &Summary) {
        self.files += 1;
        self.bytes += s.bytes;
        self.data_connections += s.new_data_connections;
    }

    fn finish(mut self) -> Batch {
        self.seconds = self.started.elapsed().as_secs_f64();
        self.bytes_per_second = self.bytes as f64 / self.seconds.max(1e-9);
        self
    }
}

/// Downloads one file on an open session. A failure that leaves a new, empty `DEST.part`
/// removes it again.
fn get_on(c: &mut Control, target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    let part = match dest {
        Dest::File(p) => Some(part_path(p)),
        Dest::Stdout | Dest::Null => None,
    };
    let existed = part.as_ref().is_some_and(|p| p.exists());
    let result = get_inner(c, target, dest, opts);
    if result.is_err()
        && !existed
        && let Some(p) = part
        && std::fs::metadata(&p).is_ok_and(|m| m.len() == 0)
    {
        let _ = std::fs::remove_file(&p);
    }
    result
}

fn get_inner(c: &mut Control, target: &Target, dest: &Dest, opts: &Options) -> Result<Summary> {
    if target.path.is_empty() || target.path.ends_with('/') {
        return Err(ClientError::Usage(format!(
            "{} names a directory; use braid ls to list it",
            display_url(target)
        )));
    }
    let size = match c.size(&target.path)? {
        r if r.code == 213 => r.text().trim().parse::<u64>().ok(),
        _ => None,
    };
    match parallel::Peer::of(c) {
        Some(peer) => return parallel::get(c, peer, target, dest, size, opts),
        None => stream_mode(opts),
    }
    // `-n N` against a server without MODE E: N ranges, each on a session of its own. A
    // partial with a record of its ranges (it may have holes) resumes the same way.
    if let (Dest::File(path), Some(size)) = (dest, size) {
        let n = opts.streams.unwrap_or(1) as usize;
        let holes = opts.resume && records::sidecar_path(&part_path(path)).exists();
        let worth = n > 1 && size >= 2 * segments::MIN_SEGMENT && c.has_feature("REST");
        if worth || holes {
            if opts.background.is_some() {
                return Err(ClientError::Usage(format!(
                    "--background against a server without MODE E steers one connection: {}",
                    if holes {
                        "this partial was fetched in ranges and resumes that way; run again without --background"
                    } else {
                        "drop -n"
                    }
                )));
            }
            return segments::get(c, target, path, size, n, opts);
        }
    }
    let (mut out, part, offset): (Box<dyn Write>, Option<PartFile>, u64) = match dest {
        Dest::Stdout => (Box::new(std::io::stdout().lock()), None, 0),
        Dest::Null => (Box::new(std::io::sink()), None, 0),
        Dest::File(path) => {
            let part = part_path(path);
            let mut oo = OpenOptions::new();
            oo.write(true).create(true);
            let file = if opts.resume {
                oo.open(&part)
            } else {
                oo.truncate(true).open(&part)
            }
            .map_err(local_err(format!("cannot write {}", part.display())))?;
            let have = file
                .metadata()
                .map_err(local_err(format!("cannot stat {}", part.display())))?
                .len();
            if let Some(s) = size
                && have > s
            {
                return Err(not_a_partial(&part, have, s));
            }
            let writer = file
                .try_clone()
                .map_err(local_err("cannot duplicate file handle"))?;
            let mut w = std::io::BufWriter::with_capacity(BUF, writer);
            use std::io::Seek;
            w.seek(std::io::SeekFrom::Start(have))
                .map_err(local_err("seek"))?;
            (
                Box::new(w),
                Some(PartFile {
                    final_path: path.clone(),
                    part,
                    file,
                }),
                have,
            )
        }
    };
    let started = Instant::now();
    let mut received = 0u64;
    let mut background = None;
    // A resumed download whose partial is already whole needs no data connection.
    let already_complete = offset > 0 && size == Some(offset);
    if !already_complete {
        let retr = Command::Retr(target.path.clone());
        let mut data = c.stream_transfer(&retr, offset)?;
        let tcp = data
            .tcp()
            .try_clone()
            .map_err(local_err("data connection"))?;
        let bar = progress_bar(opts, size, offset);
        let partial_name = part.as_ref().map(|p| p.part.display().to_string());
        background = stream_yield::start(c, &tcp, opts, false);
        // Never more than SIZE announced: a server that does not stop (or a file that grows
        // while it is sent) would otherwise fill the disk.
        let limit = size.filter(|_| !opts.growing);
        let mut capped = Capped::new(&mut data, limit.map(|s| s.saturating_sub(offset)));
        let (copied, stopped) = interrupt::on_one_connection(&tcp, background.as_mut(), || {
            stream::read_to_end(&mut capped, &mut out, false, |n| {
                bar.set_position(offset + n)
            })
        });
        let overran = capped.overran;
        bar.finish_and_clear();
        if stopped {
            out.flush()
                .map_err(local_err("cannot write the download"))?;
            let n = copied.unwrap_or_else(|e| e.moved());
            return Err(interrupt::stopped(c, n, "", partial_name));
        }
        close_data(data);
        received = match copied {
            Ok(n) => n,
            Err(CopyError::Read(n, _)) if overran => {
                out.flush()
                    .map_err(local_err(cannot_write(partial_name.as_deref())))?;
                return Err(ClientError::Integrity(format!(
                    "{}: the server sent more than the {} bytes its SIZE announced: the file \
                     is growing on the server (take what comes with --growing), or the server \
                     is broken; the first {} bytes are kept{}",
                    display_url(target),
                    size.unwrap_or(0),
                    offset + n,
                    partial_name.map(|p| format!(" in {p}")).unwrap_or_default()
                )));
            }
            Err(CopyError::Read(n, e)) => {
                return Err(ClientError::Interrupted {
                    bytes: n,
                    why: format!("data connection: {e}"),
                    partial: partial_name,
                });
            }
            Err(CopyError::Write(_, e)) => {
                return Err(ClientError::Local {
                    what: cannot_write(partial_name.as_deref()),
                    cause: e,
                });
            }
        };
        out.flush()
            .map_err(local_err(cannot_write(partial_name.as_deref())))?;
        // Stream mode cannot tell a finished download from a server that died: only the
        // 226 (and the size check below) can.
        if let Err(e) = c.finish_transfer(&retr) {
            let why = match e {
                ClientError::Remote { reply, .. } => format!("server reported {reply}"),
                e => e.to_string(),
            };
            return Err(ClientError::Interrupted {
                bytes: received,
                why,
                partial: partial_name,
            });
        }
    }
    drop(out);
    let total = offset + received;
    if let Some(s) = size
        && (total < s || (total > s && !opts.growing))
    {
        return Err(ClientError::Integrity(format!(
            "received {total} bytes but the server announced {s}; the partial data is kept, run again with --resume"
        )));
    }
    let local = match part {
        Some(p) => p.commit(None)?,
        None => "-".into(),
    };
    let mut s = summary(
        "get",
        target,
        local,
        received,
        size.or(Some(total)),
        offset,
        started,
    );
    s.background = background.and_then(|b| b.report());
    Ok(s)
}

/// A partial download longer than the remote file cannot be part of it.
fn not_a_partial(part: &Path, have: u64, size: u64) -> ClientError {
    ClientError::Integrity(format!(
        "{} holds {have} bytes but the remote file has only {size}; it is not a partial copy of it. Remove it to start over",
        part.display()
    ))
}

/// What a failed write of a download says: where what arrived is kept.
fn cannot_write(partial: Option<&str>) -> String {
    match partial {
        Some(p) => format!(
            "cannot write {p} (what arrived is kept there: once the cause is fixed, e.g. space freed, run again with --resume)"
        ),
        None => "cannot write the download".into(),
    }
}

/// Says, in verbose mode, why this transfer uses one stream-mode connection, and how
/// background mode steers it.
fn stream_mode(opts: &Options) {
    if !opts.verbose {
        return;
    }
    if opts.background.is_some() {
        eprintln!(
            "braid: --background on one stream-mode connection: paced by the data connection's own round trip when sending, by the window it advertises when receiving (RFC 9840)"
        );
    }
    if opts.tls.is_some() {
        eprintln!(
            "braid: TLS: using one stream-mode connection (the server does not protect MODE E data connections: FEAT has no BRAID 3)"
        );
    } else {
        eprintln!(
            "braid: the server offers no MODE E (no PARALLEL in FEAT): using one stream-mode connection"
        );
    }
}

fn summary(
    op: &'static str,
    target: &Target,
    local: String,
    bytes: u64,
    size: Option<u64>,
    offset: u64,
    started: Instant,
) -> Summary {
    let seconds = started.elapsed().as_secs_f64();
    Summary {
        op,
        url: display_url(target),
        local,
        bytes,
        size,
        resumed_from: offset,
        seconds,
        bytes_per_second: bytes as f64 / seconds.max(1e-9),
        mode: "stream",
        streams: 1,
        per_connection_bytes: Vec::new(),
        checksum: None,
        connections: Vec::new(),
        connection_count: Vec::new(),
        timeline: Vec::new(),
        tuning: None,
        block_size: None,
        congestion: None,
        sender: None,
        decisions: Vec::new(),
        background: None,
        new_data_connections: 1,
        tls_handshakes: None,
    }
}

/// Uploads one file. A URL ending in `/` names a directory: the file keeps its name.
pub fn put(local: &Path, target: &Target, opts: &Options) -> Result<Summary> {
    if local == Path::new("-") {
        if target.path.is_empty() || target.path.ends_with('/') {
            return Err(ClientError::Usage(format!(
                "standard input has no name: give the remote file's, e.g. {}data.bin",
                display_url(target)
            )));
        }
        if opts.resume {
            return Err(ClientError::Usage(
                "--resume cannot continue standard input (what was sent is gone from it)".into(),
            ));
        }
    }
    let mut c = session(target, opts, None)?;
    let s = if local == Path::new("-") {
        put_stdin(&mut c, target, opts)?
    } else {
        put_on(&mut c, local, target, opts, Held::asked(opts))?
    };
    c.quit();
    Ok(s)
}

/// `braid put - URL`: standard input, of a length nobody knows beforehand, over one
/// stream-mode connection; a braid server's checksum of what it stored is compared with the
/// one of what was read.
fn put_stdin(c: &mut Control, target: &Target, opts: &Options) -> Result<Summary> {
    let started = Instant::now();
    let stor = Command::Stor(target.path.clone());
    let mut data = c.stream_transfer(&stor, 0)?;
    let tcp = data
        .tcp()
        .try_clone()
        .map_err(local_err("data connection"))?;
    let bar = progress_bar(opts, None, 0);
    let mut sum = braid_proto::checksum::ChunkSum::new();
    let mut background = stream_yield::start(c, &tcp, opts, true);
    let (r, stopped) = interrupt::on_one_connection(&tcp, background.as_mut(), || {
        copy_hashing(&mut std::io::stdin().lock(), &mut data, &mut sum, &bar)
    });
    bar.finish_and_clear();
    if stopped {
        drop(data);
        let n = r.unwrap_or_else(|(n, _)| n);
        return Err(interrupt::stopped(c, n, "", None));
    }
    let sent = r.map_err(|(n, e)| ClientError::Interrupted {
        bytes: n,
        why: e.to_string(),
        partial: None,
    })?;
    end_upload(data);
    c.finish_transfer(&stor)?;
    let mut s = summary("put", target, "-".into(), sent, Some(sent), 0, started);
    s.background = background.and_then(|b| b.report());
    if c.has_feature("BRAID") {
        let local = braid_proto::checksum::hex(sum.finish(sent));
        let ours = "standard input hashes to";
        s.checksum = parallel::compare_with_server(
            c,
            braid_proto::checksum::NAME,
            &target.path,
            &local,
            ours,
            "",
        )?;
    }
    Ok(s)
}

/// Copies `input` to `out` to its end in whole buffers (so the checksum's chunks line up),
/// folding it into `sum`; the bytes copied, or how far it got and why it stopped.
fn copy_hashing(
    input: &mut impl Read,
    out: &mut impl Write,
    sum: &mut braid_proto::checksum::ChunkSum,
    bar: &ProgressBar,
) -> std::result::Result<u64, (u64, std::io::Error)> {
    let mut buf = vec![0u8; BUF];
    let mut at = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let e = std::io::Error::new(e.kind(), format!("standard input: {e}"));
                    return Err((at, e));
                }
            }
        }
        let last = filled < buf.len();
        // Whole buffers are whole chunks; only the last may be short.
        let _ = sum.add(at, &buf[..filled], last);
        out.write_all(&buf[..filled]).map_err(|e| {
            (
                at,
                std::io::Error::new(e.kind(), format!("data connection: {e}")),
            )
        })?;
        at += filled as u64;
        bar.set_position(at);
        if last {
            return Ok(at);
        }
    }
}

/// Uploads many files into one directory on one server in one session: one login, the
/// settings sent once, and in MODE E the data connections of one file carry the next. Stops
/// at the first failure; what was done is reported through `done` as it completes.
pub fn put_batch(
    locals: &[PathBuf],
    dir: &Target,
    opts: &Options,
    mut done: impl FnMut(&Summary),
) -> Result<Batch> {
    if !(dir.path.is_empty() || dir.path.ends_with('/')) {
        return Err(ClientError::Usage(format!(
            "{}: with several files the URL names a directory and ends with /",
            display_url(dir)
        )));
    }
    if locals.iter().any(|l| l == Path::new("-")) {
        return Err(ClientError::Usage(
            "standard input (-) is uploaded alone: braid put - ftp://host/path/name".into(),
        ));
    }
    let mut batch = Batch::start("put-batch");
    let mut c = session(dir, opts, None)?;
    let opts = Options {
        keep_connections: true,
        ..opts.clone()
    };
    for local in locals {
        let s = put_on(&mut c, local, dir, &opts, Held::asked(&opts))?;
        batch.add(&s);
        done(&s);
    }
    c.quit();
    Ok(batch.finish())
}

/// What an upload takes the server to hold of its file already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Nothing: the whole file goes.
    Nothing,
    /// What the record of an earlier MODE E upload of it says, else nothing (`put -r
    /// --update`: a shorter file on the server may be another version, not a beginning).
    Recorded,
    /// What that record says, else the size the server reports, continued in stream mode
    /// (`--resume`).
    RecordedOrSize,
}

impl Held {
    fn asked(opts: &Options) -> Held {
        if opts.resume {
            Held::RecordedOrSize
        } else {
            Held::Nothing
        }
    }
}

/// Uploads one file on an open session.
fn put_on(
    c: &mut Control,
    local: &Path,
    target: &Target,
    opts: &Options,
    held: Held,
) -> Result<Summary> {
    let file = File::open(local).map_err(local_err(format!("cannot read {}", local.display())))?;
    let meta = file
        .metadata()
        .map_err(local_err(format!("cannot stat {}", local.display())))?;
    if !meta.is_file() {
        return Err(ClientError::Usage(format!(
            "{} is not a regular file",
            local.display()
        )));
    }
    let len = meta.len();
    let mut target = target.clone();
    if target.path.is_empty() || target.path.ends_with('/') {
        let name = local.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            ClientError::Usage(format!("{} has no usable file name", local.display()))
        })?;
        target.path.push_str(name);
    }
    if let Some(peer) = parallel::Peer::of(c) {
        let record = records::UploadRecord::new(local, &meta, &target.host, &target.path);
        let have = match held {
            Held::Nothing => Some(braid_proto::ranges::RangeSet::new()),
            Held::Recorded => Some(record.load().unwrap_or_default()),
            Held::RecordedOrSize => record.load(),
        };
        match have {
            Some(have) => {
                let up = parallel::Upload {
                    file: &file,
                    len,
                    record,
                    have,
                };
                let mut s = parallel::put(c, peer, up, &target, opts)?;
                s.local = local.display().to_string();
                return Ok(s);
            }
            // No record of a MODE E upload: whatever the server holds came in stream mode
            // (another tool, or an older braid), so its length says what it holds.
            None => {
                stream_mode(opts);
                eprintln!(
                    "braid: no record of an earlier MODE E upload of {} ({}); continuing in stream mode from the size the server reports",
                    local.display(),
                    record.location()
                )
            }
        }
    } else {
        stream_mode(opts);
    }
    let mut offset = 0;
    if held == Held::RecordedOrSize {
        let r = c.size(&target.path)?;
        if r.code == 213 {
            offset = r.text().trim().parse::<u64>().unwrap_or(0);
        }
        if offset > len {
            return Err(ClientError::Integrity(format!(
                "the server already holds {offset} bytes of {}, more than the {len} bytes of {}",
                target.path,
                local.display()
            )));
        }
    }
    let started = Instant::now();
    // Even with nothing left to send, STOR is what makes the server's partial take the final
    // name.
    let stor = Command::Stor(target.path.clone());
    // A partial this continues was not ours to vouch for: a braid server is told what the
    // whole file hashes to and checks it before the file takes its name.
    let checked = offset > 0 && c.has_feature("BRAID");
    if checked {
        c.expect(&parallel::whole_file_checksum(&file, len)?, &[200])?;
    }
    let mut data = c.stream_transfer(&stor, offset)?;
    let tcp = data
        .tcp()
        .try_clone()
        .map_err(local_err("data connection"))?;
    let bar = progress_bar(opts, Some(len), offset);
    let mut background = stream_yield::start(c, &tcp, opts, true);
    let (r, stopped) =
        interrupt::on_one_connection(&tcp, background.as_mut(), || match &mut data {
            Wire::Clear(sock) => send_file(&file, offset, len, sock, &bar),
            tls => send_copied(&file, offset, len, tls, &bar),
        });
    bar.finish_and_clear();
    if stopped {
        drop(data);
        let n = r.unwrap_or_else(|(n, _)| n);
        let advice = "; run again with --resume to send the rest";
        return Err(interrupt::stopped(c, n, advice, None));
    }
    let sent = r.map_err(|(n, e)| ClientError::Interrupted {
        bytes: n,
        why: format!("data connection: {e}"),
        partial: None,
    })?;
    end_upload(data);
    c.finish_transfer(&stor).map_err(|e| match e {
        ClientError::Remote { reply, .. } => ClientError::Interrupted {
            bytes: sent,
            why: format!("server reported {reply}; run again with --resume to continue"),
            partial: None,
        },
        ClientError::Integrity(m) if checked => ClientError::Integrity(format!(
            "{m}; the partial on the server was not a prefix of this file: send it again without --resume"
        )),
        e => e,
    })?;
    let mut s = summary(
        "put",
        &target,
        local.display().to_string(),
        sent,
        Some(len),
        offset,
        started,
    );
    s.background = background.and_then(|b| b.report());
    Ok(s)
}

/// Ends a stream-mode upload's data (close_notify under TLS, then FIN) and waits for the
/// server to close its side, so that the 226 describes the whole file.
fn end_upload(mut data: Wire) {
    data.finish();
    let mut sink = [0u8; 64];
    let _ = data.read(&mut sink);
}

/// Sends `[offset, len)` of a file on a clear connection (`sendfile` to another host).
fn send_file(
    file: &File,
    offset: u64,
    len: u64,
    sock: &TcpStream,
    bar: &ProgressBar,
) -> std::result::Result<u64, (u64, std::io::Error)> {
    let mut at = offset;
    let reached = crate::engine::file_send::FileSender::for_socket(sock)
        .send(sock, file, offset, len, false, |now| {
            at = now;
            bar.set_position(now);
        })
        .map_err(|e| (at - offset, e))?;
    if reached < len {
        return Err((
            reached - offset,
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "local file shrank during upload",
            ),
        ));
    }
    Ok(reached - offset)
}

/// Sends `[offset, len)` of a file through a writer that needs the bytes (TLS).
fn send_copied(
    file: &File,
    offset: u64,
    len: u64,
    out: &mut impl Write,
    bar: &ProgressBar,
) -> std::result::Result<u64, (u64, std::io::Error)> {
    crate::engine::stream::write_from_file(file, offset, Some(len), out, false, |n| {
        bar.set_position(offset + n)
    })
    .map_err(|e| match e {
        CopyError::Read(n, e) | CopyError::Write(n, e) => (n, e),
    })
}

/// Closes a data connection whose data has all been read. Under TLS this sends close_notify
/// first: vsftpd, for one, waits for it before it sends the 226.
fn close_data(mut data: Wire) {
    data.finish();
}

/// One entry of a remote listing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ListEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub size: Option<u64>,
    /// Modification time, seconds since the Unix epoch (UTC).
    pub modify: Option<i64>,
    /// The raw line, for servers without MLSD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
}

/// Lists a directory: MLSD when the server has it (exact sizes and UTC times), LIST otherwise.
pub fn ls(target: &Target, opts: &Options) -> Result<Vec<ListEntry>> {
    let mut c = session(target, opts, None)?;
    let entries = list_dir(&mut c, &target.path)?;
    c.quit();
    Ok(entries)
}

/// Lists `path` (the login directory when empty) on an open session: MLSD, or LIST on
/// servers without it, whose lines are kept as they came (`raw`) beside what their usual forms
/// say. The directory's own `.` and `..` entries are left out.
/// Every entry beneath `path` in one listing (MLSR, which globus-gridftp-server and braid
/// serve offer), each named by its path relative to `path`.
fn list_tree(c: &mut Control, path: &str) -> Result<Vec<ListEntry>> {
    let mlsr = Command::Mlsr((!path.is_empty()).then(|| path.to_string()));
    let data = c.open_data()?;
    c.start_transfer(&mlsr)?;
    let text = read_all(c.protect(data)?, c, &mlsr)?;
    Ok(machine_entries(&text))
}

/// The entries of an MLSD or MLSR listing, the listed directory (and its parent) left out.
fn machine_entries(text: &str) -> Vec<ListEntry> {
    text.lines()
        .filter_map(braid_proto::listing::parse_mlsx)
        .filter(|m| !matches!(m.kind.as_deref(), Some("cdir" | "pdir")))
        .map(|m| ListEntry {
            name: m.name,
            kind: m.kind,
            size: m.size,
            modify: m.modify,
            raw: None,
        })
        .collect()
}

fn list_dir(c: &mut Control, path: &str) -> Result<Vec<ListEntry>> {
    let path = (!path.is_empty()).then(|| path.to_string());
    let mlsd = Command::Mlsd(path.clone());
    let data = c.open_data()?;
    c.send_transfer(&mlsd)?;
    let (text, machine) = match c.transfer_started(&mlsd) {
        Ok(_) => (read_all(c.protect(data)?, c, &mlsd)?, true),
        // No MLSD (RFC 3659).
        Err(ClientError::Remote { reply, .. }) if matches!(reply.code, 500 | 501 | 502 | 504) => {
            drop(data);
            let list = Command::List(path);
            let data = c.open_data()?;
            c.start_transfer(&list)?;
            (read_all(c.protect(data)?, c, &list)?, false)
        }
        Err(e) => return Err(e),
    };
    if machine {
        return Ok(machine_entries(&text));
    }
    let mut entries = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = braid_proto::listing::parse_list(line);
        if parsed.as_ref().is_some_and(|p| {
            p.kind.as_deref() == Some("dir") && matches!(p.name.as_str(), "." | "..")
        }) {
            continue;
        }
        entries.push(ListEntry {
            name: parsed.as_ref().map_or(line, |p| &p.name).to_string(),
            kind: parsed.as_ref().and_then(|p| p.kind.clone()),
            size: parsed.as_ref().and_then(|p| p.size),
            modify: None,
            raw: Some(line.to_string()),
        });
    }
    Ok(entries)
}

/// The longest listing read (a million entries of 256 bytes): a server whose listing never
/// ends must not fill the client's memory.
const MAX_LISTING: u64 = 256 << 20;

fn read_all(mut data: Wire, c: &mut Control, cmd: &Command) -> Result<String> {
    let mut buf = Vec::new();
    (&mut data)
        .take(MAX_LISTING + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ClientError::Interrupted {
            bytes: buf.len() as u64,
            why: e.to_string(),
            partial: None,
        })?;
    if buf.len() as u64 > MAX_LISTING {
        return Err(ClientError::Protocol(format!(
            "the server's answer to {} went past {} MiB: a listing that does not end, or a \
             directory too large to list in one go (list its subdirectories instead)",
            cmd.verb(),
            MAX_LISTING >> 20
        )));
    }
    close_data(data);
    c.finish_transfer(cmd)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A reader that fails once more than `limit` bytes come (none is passed on of the read that
/// goes past it), and says so in `overran`.
struct Capped<R> {
    inner: R,
    left: Option<u64>,
    overran: bool,
}

impl<R> Capped<R> {
    fn new(inner: R, limit: Option<u64>) -> Capped<R> {
        Capped {
            inner,
            left: limit,
            overran: false,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(left) = &mut self.left {
            if n as u64 > *left {
                self.overran = true;
                return Err(std::io::Error::other("more data than announced"));
            }
            *left -= n as u64;
        }
        Ok(n)
    }
}
