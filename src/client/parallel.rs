//! MODE E downloads and uploads: N data connections, blocks at offsets, the whole-file
//! checksum confirmed on the control connection, and a sidecar so `--resume` fetches only what
//! is missing.

use super::control::{Control, connect_data};
use super::error::{ClientError, Result};
use super::interrupt::{Interrupt, TICK, send_abort, stopped, supervise_every};
use super::probe::Prober;
use super::records::{UploadRecord, load_sidecar, remove_sidecar, save_sidecar, sidecar_path};
use super::url::Target;
use super::{Dest, Options, PartFile, Summary, cannot_write, local_err, part_path, progress_bar};
use crate::engine::background;
use crate::engine::hooks::{Cap, Fixed, Pacer, Policy, Steering, Tell};
use crate::engine::receive::{Progress, Shared};
use crate::engine::send::Source;
use crate::engine::sink::{Reorder, Sink};
use crate::engine::stats::View;
use crate::engine::transfer::{Accept, Joins, Transfer, Waker};
use crate::engine::tune::{self, Tuning};
use crate::engine::widen::Widen;
use crate::engine::{self, EngineError};
use braid_proto::checksum;
use braid_proto::client::{BlockPeer, BlockSetup, Direction, Failure, Op};
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::{CcName, RetrOpts};
use braid_proto::{Command, Reply};
use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The kind of MODE E server, from its FEAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// braid: the client opens the data connections both ways, XXH3 checksums.
    Braid,
    /// A GridFTP server: it connects to us when it sends; ADLER32 or MD5 through CKSM.
    GridFtp,
}

impl Peer {
    /// The CKSM algorithm a whole file is checked with: braid's own with a braid server; with
    /// a GridFTP server ADLER32 where it offers it (as grid data management checks files),
    /// else MD5. MD5 costs both ends several times as much CPU: a tree of 1,000 files of
    /// 1 MiB to and from globus-gridftp-server on loopback took 2.4 s with it, and
    /// globus-url-copy, which checks nothing, 0.6 s.
    pub fn checksum(self, c: &Control) -> &'static str {
        match self {
            Peer::Braid => checksum::NAME,
            Peer::GridFtp if c.checksum_offered("ADLER32") => "ADLER32",
            Peer::GridFtp => "MD5",
        }
    }

    /// None also under TLS: MODE E data connections are not encrypted yet, so a TLS session
    /// moves its data over one stream-mode connection, which is.
    pub fn of(c: &Control) -> Option<Peer> {
        match c.block_peer()? {
            // Under TLS only a braid server that protects MODE E connections too; others get
            // one TLS stream-mode connection (GridFTP servers protect data with GSI).
            _ if c.uses_tls() && !c.private_blocks() => None,
            BlockPeer::Braid { .. } => Some(Peer::Braid),
            BlockPeer::GridFtp => Some(Peer::GridFtp),
        }
    }
}

/// How long a reorder buffer may wait for a missing block, and how long a receiver waits for
/// a data connection.
pub(super) const STALL: Duration = Duration::from_secs(120);

/// Downloads in MODE E. `size` is what SIZE said.
pub fn get(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    dest: &Dest,
    size: Option<u64>,
    opts: &Options,
) -> Result<Summary> {
    let remote = target.path.as_str();
    let hint = || PathHint::of(c, Direction::Download, opts.buffer);
    let plan = Plan::new(opts, peer, offers_elastic(c), size, hint);
    let n = plan.start;
    // Only braid servers pace (GridFTP servers ignore options they do not know, but there is
    // no need to find out). The pacer's rate goes with OPTS RETR now and again whenever the
    // pacer changes it.
    let congestion = sending_congestion(c, opts, &plan);
    let mut pacer = pacer(c, opts, congestion, plan.elastic, plan.elastic)?;
    let background = opts.background.is_some();
    let retr = RetrOpts {
        parallelism: Some((plan.start, plan.start.min(1), plan.max)),
        block_size: (opts.block_size.is_some() || peer == Peer::Braid).then_some(plan.block),
        congestion: congestion.filter(|_| peer == Peer::Braid),
        max_rate: pacer.rate(&View::at_start(None)),
        dscp: background.then_some(background::LOWER_EFFORT),
    };
    let elastic = block_mode(c, Direction::Download, retr, opts.buffer)?;
    // A file of one block has nothing to resume from mid-way: no record of it (a tree of many
    // small files would otherwise write, rename and delete one per file).
    let recorded = size.is_none_or(|s| s > plan.block);
    let (sink, part, start) = match dest {
        Dest::Null => (Sink::Discard, None, Progress::holding(RangeSet::new())),
        Dest::Stdout => {
            // Room for a couple of blocks per connection, within bounds.
            let block = plan.block as usize;
            let cap = (block * plan.max as usize * 2).clamp(8 << 20, 256 << 20);
            let out = Box::new(std::io::stdout());
            let start = Progress::holding(RangeSet::new());
            (
                Sink::Ordered(Reorder::new(out, cap, STALL, elastic)),
                None,
                start,
            )
        }
        Dest::File(path) => {
            let part = part_path(path);
            let sidecar = sidecar_path(&part);
            // Blocks land at their offsets, so a partial may have holes: only its sidecar says
            // what it holds. Without one (or for another file) it starts over.
            let resume = if opts.resume {
                let found = load_sidecar(&sidecar, remote, size);
                if found.is_none() && part.exists() && recorded {
                    eprintln!(
                        "braid: {} has no matching record of what it holds ({}); downloading again",
                        part.display(),
                        sidecar.display()
                    );
                }
                found
            } else {
                None
            };
            let mut oo = OpenOptions::new();
            oo.write(true).read(true).create(true);
            let file = if resume.is_some() {
                oo.open(&part)
            } else {
                oo.truncate(true).open(&part)
            }
            .map_err(local_err(format!("cannot write {}", part.display())))?;
            let start = resume.unwrap_or_else(|| {
                remove_sidecar(&sidecar);
                Progress::holding(RangeSet::new())
            });
            let writer = file
                .try_clone()
                .map_err(local_err("cannot duplicate file handle"))?;
            let part = PartFile {
                final_path: path.clone(),
                part,
                file,
            };
            (Sink::File(writer), Some(part), start)
        }
    };
    let resumed_from = start.ranges.len();
    let have = start.ranges.clone();
    let started = Instant::now();
    let bytes = Arc::new(AtomicU64::new(0));
    let shared = Shared::new(start, bytes.clone());
    let transfer = Transfer::new(elastic);
    if background {
        // Only acknowledgements go this way, but they too should not compete.
        transfer.set_dscp(background::LOWER_EFFORT);
    }
    let complete_already = size.is_some_and(|s| have.covers(0, s)) && resumed_from > 0;
    let retr = Command::Retr(target.path.clone());
    let partial_name = part.as_ref().map(|p| p.part.display().to_string());
    let save = |p: &Progress| {
        if let (Some(part), Some(s), true) = (&part, size, recorded) {
            save_sidecar(&sidecar_path(&part.part), remote, s, p);
        }
    };
    let todo = size.map(|s| s - have.overlap(0, s));
    let mut reused = false;
    // A download is paced by the server, told the pacer's rate (above, and in the tick).
    let mut steering = Steering::new(plan.policy(), pacer, false, todo);
    steering.prime(&transfer);
    let mut prober = background.then(Prober::default);
    if !complete_already {
        // Written now, so the space for the next version is reserved before data arrives.
        save(&shared.snapshot());
        let conns = match peer {
            // The last download left its data connections open: no PASV, no connecting. A
            // GridFTP server keeps those it opened to us while neither PORT nor the
            // parallelism changed (OPTS RETR, sent above only when it did, and then the count
            // differs).
            _ if c.session().can_reuse(Direction::Download)
                && (peer == Peer::Braid || c.kept_connections() == n) =>
            {
                c.restart_ranges(&have)?;
                let socks = c.take_data_connections();
                if !c.start_transfer(&retr)? && peer == Peer::GridFtp {
                    return Err(ClientError::Integrity(format!(
                        "the server answered RETR {} with 150, not 125: it did not keep the data \
                         connections it left open, and braid no longer listens for new ones; run \
                         again",
                        target.path
                    )));
                }
                reused = true;
                Joins::cached(socks, STALL).protected(c.data_tls())
            }
            Peer::Braid => {
                let addr = c.passive_addr()?;
                c.restart_ranges(&have)?;
                let socks = open_and_start(c, &retr, addr, n, opts.buffer, elastic)?;
                plan.joins(socks, addr, opts.buffer, &mut steering, transfer.waker())
                    .protected(c.data_tls())
            }
            Peer::GridFtp => {
                let listener = c.active_listener()?;
                c.restart_ranges(&have)?;
                c.start_transfer(&retr)?;
                Joins::accept(
                    Accept {
                        listener,
                        peer: braid_proto::session::canonical_ip(c.peer().ip()),
                        max: 4 * n as usize + 4,
                        buffer: opts.buffer,
                        timeout: Some(STALL),
                    },
                    STALL,
                )
            }
        };
        let alg = peer.checksum(c);
        c.checksum_after_transfer(alg, &target.path)?;
        let bar = progress_bar(opts, size, resumed_from);
        let interrupt = Interrupt::install();
        let mut last_save = Instant::now();
        let receive = || engine::receive::receive(&transfer, conns, &sink, size, &shared);
        // A one-block file is in before a watcher thread (Ctrl-C, progress, tuning) would
        // have looked once: a tree of small files would start one per file for nothing.
        let result = if recorded {
            supervise_every(
                tick_every(opts),
                transfer.abort(),
                &interrupt,
                receive,
                || {
                    bar.set_position(resumed_from + bytes.load(Ordering::Relaxed));
                    // A braid server reports its sending (113): loss and RTT for the tuning.
                    if elastic
                        && c.poll().is_ok()
                        && let Some(report) = c.session().take_sender_report()
                    {
                        steering.sender_reported(report);
                    }
                    if let Some(p) = &mut prober {
                        p.show(c, &mut steering);
                    }
                    let tell = steering.tick(&transfer);
                    let told = match &mut prober {
                        Some(p) => p.send(c, tell),
                        None => c.tell(tell),
                    };
                    if let Err(e) = told {
                        tracing::warn!("could not tell the server of a change: {e}");
                    }
                    if last_save.elapsed() > Duration::from_secs(1) {
                        save(&shared.snapshot());
                        last_save = Instant::now();
                    }
                },
            )
        } else {
            receive()
        };
        bar.finish_and_clear();
        let received = bytes.load(Ordering::Relaxed);
        if interrupt.hit() {
            save(&shared.snapshot());
            return Err(stopped(c, received, "", partial_name));
        }
        let result = result.map(|kept| c.keep_data_connections(Direction::Download, kept.socks));
        if let Err(e) = result {
            save(&shared.snapshot());
            let what = cannot_write(partial_name.as_deref());
            return Err(data_phase_failed(
                c,
                &retr,
                e,
                &what,
                received,
                partial_name,
            ));
        }
        let finished = c.finish_transfer(&retr);
        // The server's last report came before its final reply.
        if let Some(report) = c.session().take_sender_report() {
            steering.sender_reported(report);
        }
        if let Err(e) = finished {
            save(&shared.snapshot());
            return Err(ClientError::Interrupted {
                bytes: received,
                why: e.to_string(),
                partial: partial_name,
            });
        }
    }
    let got = shared.snapshot();
    let total = size.unwrap_or_else(|| got.ranges.iter().last().map_or(0, |(_, e)| e));
    let missing = got.ranges.missing(total);
    if !missing.is_empty() {
        save(&got);
        return Err(ClientError::Integrity(format!(
            "the server ended the transfer but bytes {missing} of {total} never arrived; run again with --resume"
        )));
    }
    let verified = verify(c, peer, target, total, &got, part.as_ref().map(|p| &p.file))?;
    let local = match part {
        Some(p) => {
            let sidecar = sidecar_path(&p.part);
            let local = p.commit(Some(total))?;
            remove_sidecar(&sidecar);
            local
        }
        None => "-".into(),
    };
    let per_conn = transfer.per_link_bytes();
    let s = super::summary(
        "get",
        target,
        local,
        per_conn.iter().sum(),
        Some(total),
        resumed_from,
        started,
    );
    if opts.congestion.is_some() && peer == Peer::GridFtp {
        eprintln!("braid: --congestion: a GridFTP server sends with its own congestion control");
    }
    Ok(extended(s, &plan, &transfer, steering, verified, reused))
}

/// Marks a summary as a MODE E transfer over these connections, with their timeline.
fn extended(
    mut s: Summary,
    plan: &Plan,
    transfer: &Transfer,
    steering: Steering,
    checksum: Option<String>,
    reused: bool,
) -> Summary {
    let h = transfer.handshakes();
    s.tls_handshakes = (h.full + h.resumed > 0).then_some(h);
    s.new_data_connections = if reused {
        0
    } else {
        transfer.links().len() as u32
    };
    let record = steering.finish(transfer);
    s.mode = "extended-block";
    s.tuning = Some(plan.tuning());
    s.block_size = Some(plan.block);
    s.congestion = record.congestion.map(|c| c.to_string());
    s.sender = record.sender.map(|r| crate::client::SenderSeen {
        sent: r.sent,
        resent: r.resent,
        busy_ms: r.busy_ms,
        rwnd_limited_ms: r.rwnd_limited_ms,
        sndbuf_limited_ms: r.sndbuf_limited_ms,
    });
    s.decisions = record.decisions;
    s.background = record.background;
    s.per_connection_bytes = transfer.per_link_bytes();
    s.streams = transfer.most_open() as u32;
    s.checksum = checksum;
    s.connections = record.links;
    s.connection_count = record.counts;
    s.timeline = record.timeline;
    s
}

/// The sending side's congestion control: the user's, else background mode's for the path,
/// else the self-tuning's first choice (None: the system's).
fn sending_congestion(c: &Control, opts: &Options, plan: &Plan) -> Option<CcName> {
    opts.congestion
        .or_else(|| {
            opts.background
                .and_then(|_| background::congestion(c.path_rtt()))
        })
        .or(plan.start_congestion())
}

/// The transfer's pacer: background mode's controller (with the rate limit as its ceiling),
/// or the rate limit alone where `limits` (a download's sender may not take the limit).
/// Background mode needs the sender to be told rates (`elastic`: a braid server that also
/// answers probes while data moves). `congestion`: the sender's.
fn pacer(
    c: &Control,
    opts: &Options,
    congestion: Option<CcName>,
    elastic: bool,
    limits: bool,
) -> Result<Box<dyn Pacer>> {
    let Some(target) = opts.background else {
        return Ok(Box::new(Cap(opts.rate_limit.filter(|_| limits))));
    };
    if !elastic {
        return Err(background_needs_braid());
    }
    let info = braid_sockopt::tcp_info(c.socket());
    let rtt = c.path_rtt();
    let settings = background::Settings {
        target,
        limit: opts.rate_limit,
        mss: info
            .map(|i| u64::from(i.snd_mss))
            .filter(|&m| m >= 500)
            .unwrap_or(1448),
        // Small probes carry no serialization of their own, but may wait behind the
        // smallest burst the sender's congestion control makes.
        segments: background::burst_segments(congestion),
    };
    Ok(Box::new(background::Yielding::new(settings, rtt)))
}

/// How often the steering runs: background mode's probes and rate changes twice as often as
/// the self-tuning needs (its reaction time is what bounds the queue it leaves).
fn tick_every(opts: &Options) -> Duration {
    if opts.background.is_some() {
        TICK / 2
    } else {
        TICK
    }
}

pub fn background_needs_braid() -> ClientError {
    ClientError::Usage(
        "--background needs a braid server at the other end (FEAT BRAID 2): it tells the sender its rate and times probes by the server's answers; use --rate-limit for a fixed cap".into(),
    )
}

/// Whether the server can let connections join, leave and break mid-transfer (FEAT
/// `BRAID 2`).
fn offers_elastic(c: &Control) -> bool {
    matches!(c.block_peer(), Some(BlockPeer::Braid { elastic: true }))
}

/// MODE E and its settings, each sent once per session; whether transfers are elastic.
/// Pipelined (a braid server), the replies are read with the transfer's start, so the
/// settings cost no round trip of their own; the server said in FEAT what it offers, and a
/// refusal still fails the transfer there.
fn block_mode(
    c: &mut Control,
    direction: Direction,
    retr: RetrOpts,
    buffer: Option<u64>,
) -> Result<bool> {
    let op = Op::BlockMode(BlockSetup {
        direction,
        retr,
        buffer,
    });
    c.later(op, None)?;
    let pipelined = c.session().pipelining();
    Ok(c.session().elastic() || (pipelined && offers_elastic(c)))
}

/// The connection plan of one transfer: how many to start with, how many at most, the
/// policy that moves between them, and the block size.
struct Plan {
    start: u32,
    max: u32,
    policy: Choice,
    elastic: bool,
    block: u64,
}

/// What the control connection and this host say of the path, for a count fixed at the start.
struct PathHint {
    /// The control connection's lowest RTT.
    rtt: Option<Duration>,
    /// The most a data connection's window reaches here: half the kernel's buffer cap (the
    /// other half is overhead), or half of twice `--buffer`.
    window: Option<u64>,
}

impl PathHint {
    fn of(c: &Control, direction: Direction, buffer: Option<u64>) -> PathHint {
        let rtt = c.min_rtt();
        let cap = match direction {
            Direction::Download => kernel_cap(RMEM),
            Direction::Upload => kernel_cap(WMEM),
        };
        let window = buffer.or(cap.map(|c| c / 2));
        PathHint { rtt, window }
    }
}

const RMEM: &str = "/proc/sys/net/ipv4/tcp_rmem";
const WMEM: &str = "/proc/sys/net/ipv4/tcp_wmem";

/// The most the kernel lets a socket's buffer grow to, from `tcp_rmem` or `tcp_wmem`.
fn kernel_cap(file: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.split_whitespace().nth(2)?.parse::<u64>().ok()
}

/// Who chooses the connection count during the transfer.
enum Choice {
    /// `-n N`, or a server whose count is fixed per transfer.
    Fixed,
    /// `--schedule`.
    Schedule(crate::engine::hooks::Schedule),
    /// `-n auto` (the default) against a braid server.
    Auto(Tuning),
    /// `-n auto` with `--background` against a braid server: what one connection carries
    /// at most (its window over the round trip).
    Widen { window: u64, rtt: Duration },
}

/// The most connections background mode opens by itself.
const BACKGROUND_MOST: usize = 8;

/// A connection's window where the kernel's caps are unknown: Linux's default `tcp_wmem` cap
/// (4 MiB), half of it for data.
const DEFAULT_WINDOW: u64 = 2 << 20;

impl Plan {
    /// `size`: the bytes to move, when known (they bound the useful connections and the
    /// block size).
    /// `path`: what the control connection and this host say of the path, asked only for a
    /// count fixed at the start.
    fn new(
        opts: &Options,
        peer: Peer,
        elastic: bool,
        size: Option<u64>,
        path: impl FnOnce() -> PathHint,
    ) -> Plan {
        // Without a block size given, a small file still makes a few blocks per connection
        // (a braid server takes the size it is told; GridFTP peers keep the default).
        let fixed_block = |n: u32| match (opts.block_size, peer) {
            (Some(b), _) => b,
            (None, Peer::Braid) => tune::block_for(size, n as usize),
            (None, Peer::GridFtp) => engine::DEFAULT_BLOCK,
        };
        if opts.schedule.is_some() && !elastic {
            eprintln!(
                "braid: --schedule needs a braid server that lets connections join mid-transfer (FEAT BRAID 2); the count stays fixed"
            );
        }
        match (&opts.schedule, opts.streams, elastic) {
            // Background mode's limit is its rate: one connection, more only where a window
            // holds them back (`engine::widen`).
            (None, None, true) if opts.background.is_some() => {
                // Either end's buffer may bind: the sender's cap is not known here, this
                // host's smaller one stands for it.
                let least = kernel_cap(RMEM).into_iter().chain(kernel_cap(WMEM)).min();
                let window = opts.buffer.or(least.map(|c| c / 2));
                Plan {
                    start: 1,
                    max: BACKGROUND_MOST as u32,
                    policy: Choice::Widen {
                        window: window.unwrap_or(DEFAULT_WINDOW),
                        rtt: path().rtt.unwrap_or(super::control::ASSUMED_RTT),
                    },
                    elastic,
                    block: fixed_block(BACKGROUND_MOST as u32),
                }
            }
            (Some(s), _, true) => {
                let max = s.steps.iter().map(|&(_, n)| n).chain([s.start]).max();
                let max = max.unwrap_or(s.start) as u32;
                Plan {
                    start: s.start as u32,
                    max,
                    policy: Choice::Schedule(s.clone()),
                    elastic,
                    block: fixed_block(max),
                }
            }
            (None, None, true) => {
                let mut tuning = Tuning::new(engine::DEFAULT_BLOCK);
                // A congestion control the user chose stays.
                tuning.try_congestion = opts.congestion.is_none();
                tuning.start_on(path().rtt);
                let block = opts
                    .block_size
                    .unwrap_or_else(|| tune::block_for(size, tuning.max.min(2 * tuning.start)));
                tuning.block = block;
                let start = tune::Auto::new(tuning.clone()).first_count(size) as u32;
                Plan {
                    start,
                    max: tuning.max as u32,
                    policy: Choice::Auto(tuning),
                    elastic,
                    block,
                }
            }
            (_, n, _) => {
                let n = match n.or(opts.background.map(|_| 1)) {
                    Some(n) => n.max(1),
                    None => {
                        let path = path();
                        let (n, why) = tune::fixed_count(path.rtt, path.window);
                        tracing::info!("the server fixes the connection count per transfer: {why}");
                        n as u32
                    }
                };
                Plan {
                    start: n,
                    max: n,
                    policy: Choice::Fixed,
                    elastic,
                    block: fixed_block(n),
                }
            }
        }
    }

    /// The congestion control the self-tuning starts with, if it chose one before the transfer.
    fn start_congestion(&self) -> Option<CcName> {
        match &self.policy {
            Choice::Auto(t) => t.start_congestion.map(|(cc, _)| cc),
            _ => None,
        }
    }

    fn policy(&self) -> Box<dyn Policy> {
        match &self.policy {
            Choice::Fixed => Box::new(Fixed),
            Choice::Schedule(s) => Box::new(s.clone()),
            Choice::Auto(t) => Box::new(tune::Auto::new(t.clone())),
            Choice::Widen { window, rtt } => Box::new(Widen::new(BACKGROUND_MOST, *window, *rtt)),
        }
    }

    fn tuning(&self) -> &'static str {
        match self.policy {
            Choice::Auto(_) | Choice::Widen { .. } => "auto",
            _ => "fixed",
        }
    }

    /// The connections of a transfer to a braid server's passive address: those opened at
    /// the start, and (elastic) any the policy opens later.
    fn joins(
        &self,
        socks: Vec<TcpStream>,
        addr: SocketAddr,
        buffer: Option<u64>,
        steering: &mut Steering,
        waker: Option<Waker>,
    ) -> Joins {
        let initial = socks.len();
        let mut joins = Joins::fixed(socks, STALL);
        if self.elastic {
            let (tx, rx) = mpsc::channel();
            joins.incoming = Some(rx);
            steering.set_opener(initial, move |failed: Arc<AtomicUsize>| {
                let (tx, waker) = (tx.clone(), waker.clone());
                std::thread::spawn(move || match connect_data(addr) {
                    Ok(s) => {
                        engine::set_buffer(&s, buffer);
                        if tx.send(s).is_err() {
                            // The transfer ended meanwhile.
                            failed.fetch_add(1, Ordering::AcqRel);
                        }
                        if let Some(w) = waker {
                            w.wake();
                        }
                    }
                    Err(e) => {
                        tracing::warn!("could not open another data connection: {e}");
                        failed.fetch_add(1, Ordering::AcqRel);
                    }
                });
            });
        }
        joins
    }
}

/// Compares the whole-file checksum with the server's. braid peers: XXH3 from the blocks as
/// they arrived. GridFTP peers: ADLER32 or MD5 (see [`Peer::checksum`]), which needs one read
/// of the file. Returns what was checked; a mismatch is an error that says so.
fn verify(
    c: &mut Control,
    peer: Peer,
    target: &Target,
    total: u64,
    got: &Progress,
    file: Option<&File>,
) -> Result<Option<String>> {
    let (alg, local) = match (peer, got.sum, file) {
        (Peer::Braid, Some(sum), _) => (checksum::NAME, checksum::hex(sum.finish(total))),
        (Peer::Braid, None, Some(f)) => (
            checksum::NAME,
            checksum::hex(
                crate::sums::xxh3(f, total)
                    .map_err(local_err("cannot read the download back to check it"))?,
            ),
        ),
        (Peer::GridFtp, _, Some(f)) => {
            let alg = peer.checksum(c);
            let sum = crate::sums::named(alg, f, 0, total)
                .map_err(local_err("cannot read the download back to check it"))?;
            (alg, sum)
        }
        // Standard output from a GridFTP server: nothing to read back.
        _ => return Ok(None),
    };
    let ours = "the data received hashes to";
    let advice = "; the data is kept, rerun without --resume to fetch it again";
    compare_with_server(c, alg, &target.path, &local, ours, advice)
}

/// Compares `local` with the server's CKSM of the whole file: `ALG hex` when they agree,
/// None when the server offers no such checksum, an integrity error (saying what `ours` is)
/// when they differ.
pub(super) fn compare_with_server(
    c: &mut Control,
    alg: &str,
    path: &str,
    local: &str,
    ours: &str,
    advice: &str,
) -> Result<Option<String>> {
    let remote = c.checksum(alg, path)?;
    agree_with(remote, alg, path, local, ours, advice)
}

/// [`compare_with_server`] with the server's answer to CKSM in hand.
pub(super) fn agree_with(
    remote: Option<String>,
    alg: &str,
    path: &str,
    local: &str,
    ours: &str,
    advice: &str,
) -> Result<Option<String>> {
    let Some(remote) = remote else {
        tracing::info!("the server offers no {alg} checksum; size check only");
        return Ok(None);
    };
    if remote != local {
        return Err(ClientError::Integrity(format!(
            "checksum mismatch: the server's {alg} of {path} is {remote}, {ours} {local}{advice}"
        )));
    }
    Ok(Some(format!("{alg} {local}")))
}

/// A MODE E upload: the local file, and what the server already holds of it (REST ranges,
/// from the record a broken earlier run left).
pub struct Upload<'a> {
    pub file: &'a File,
    pub len: u64,
    pub record: UploadRecord,
    pub have: RangeSet,
}

/// Uploads in MODE E, sending only what the server does not hold yet. While the data moves,
/// the server's `111 Range Marker` replies are written to the upload record, so a broken
/// upload (Ctrl-C, either side killed) can continue with `--resume`.
pub fn put(
    c: &mut Control,
    peer: Peer,
    up: Upload,
    target: &Target,
    opts: &Options,
) -> Result<Summary> {
    let Upload {
        file,
        len,
        record,
        mut have,
    } = up;
    if peer == Peer::GridFtp && !have.is_empty() {
        have = held_for_sure(c, file, &have, &target.path)?;
    }
    let hint = || PathHint::of(c, Direction::Upload, opts.buffer);
    let plan = Plan::new(
        opts,
        peer,
        offers_elastic(c),
        Some(have.missing(len).len()),
        hint,
    );
    let n = plan.start;
    let elastic = block_mode(c, Direction::Upload, RetrOpts::default(), opts.buffer)?;
    // A fresh upload hashes the blocks as they go out and announces the checksum at the end;
    // a resumed one sends only some blocks, so it reads the file once up front.
    let hash_while_sending = peer == Peer::Braid && have.is_empty();
    match peer {
        Peer::Braid => {
            let scks = if have.is_empty() {
                Command::Scks {
                    alg: checksum::NAME.into(),
                    value: None,
                }
            } else {
                whole_file_checksum(file, len)?
            };
            c.later(
                Op::Simple {
                    cmd: scks,
                    ok: vec![200],
                },
                None,
            )?;
        }
        Peer::GridFtp => {
            // Its answer is read before STOR's (with STOR, where the server pipelines).
            c.later(
                Op::Simple {
                    cmd: Command::Allo(len.to_string()),
                    ok: vec![200, 202],
                },
                Some(format!("ALLO {len}")),
            )?;
            c.range_markers_every_second();
        }
    }
    // The record exists from the start: a later --resume then knows this upload was in MODE E.
    if let Err(e) = record.save(&have) {
        eprintln!(
            "braid: cannot keep a record of this upload in {} ({e}); if it breaks, it starts over",
            record.location()
        );
    }
    let stor = Command::Stor(target.path.clone());
    // The last upload of this session left its data connections open: no PASV, no connecting.
    let reused = c.session().can_reuse(Direction::Upload);
    let (kept, addr) = if reused {
        c.restart_ranges(&have)?;
        c.reset_stored(have.clone());
        let kept = c.take_data_connections();
        c.start_transfer(&stor)?;
        (kept, None)
    } else {
        let addr = c.passive_addr()?;
        c.restart_ranges(&have)?;
        c.reset_stored(have.clone());
        (Vec::new(), Some(addr))
    };
    // Connect before waiting for 150: the Globus server sends it only once data connections
    // have arrived; a braid server accepts them from its backlog after sending it.
    let fresh = match addr.map(|addr| open_and_start(c, &stor, addr, n, opts.buffer, elastic)) {
        None => Ok(Vec::new()),
        Some(r) => r,
    };
    let fresh = match fresh {
        Err(ClientError::Remote { reply, .. }) if !have.is_empty() => {
            eprintln!(
                "braid: the server cannot continue the earlier upload ({reply}); sending the whole file"
            );
            let again = Upload {
                file,
                len,
                record,
                have: RangeSet::new(),
            };
            return put(c, peer, again, target, opts);
        }
        // Refused before anything moved: nothing of it is on the server, and no record of it
        // may stay behind.
        Err(e) => {
            record.remove();
            return Err(e);
        }
        Ok(fresh) => fresh,
    };
    let resumed_from = have.len();
    let started = Instant::now();
    let todo = have.missing(len);
    let block = plan.block;
    let progress = AtomicU64::new(0);
    let transfer = Transfer::new(elastic);
    let background = opts.background.is_some();
    let congestion = sending_congestion(c, opts, &plan);
    transfer.set_congestion(congestion);
    if background {
        transfer.set_dscp(background::LOWER_EFFORT);
    }
    let pacer = pacer(c, opts, congestion, elastic, true)?;
    let mut steering = Steering::new(plan.policy(), pacer, true, Some(todo.len()));
    steering.prime(&transfer);
    let mut prober = background.then(Prober::default);
    let joins = match addr {
        Some(addr) => plan.joins(fresh, addr, opts.buffer, &mut steering, transfer.waker()),
        None => Joins::cached(kept, STALL),
    }
    .protected(c.data_tls());
    // In a batch the connections stay open for the next upload (EOD without CLOSE), which a
    // braid and a GridFTP server both take up (125).
    let keep = opts.keep_connections;
    let bar = progress_bar(opts, Some(len), resumed_from);
    let interrupt = Interrupt::install();
    let mut recorded = have.clone();
    let mut keep_record = |c: &Control| {
        if *c.stored() != recorded {
            recorded = c.stored().clone();
            let _ = record.save(&recorded);
        }
    };
    let result = supervise_every(
        tick_every(opts),
        transfer.abort(),
        &interrupt,
        || {
            let source = Source::File { file, size: len };
            let options = engine::send::Options {
                block,
                hash: hash_while_sending,
                keep,
            };
            engine::send::send(&transfer, source, &todo, joins, options, &progress)
        },
        || {
            bar.set_position(resumed_from + progress.load(Ordering::Relaxed));
            if let Some(p) = &mut prober {
                p.show(c, &mut steering);
                if let Err(e) = p.send(c, Tell::default()) {
                    tracing::warn!("could not probe the path: {e}");
                }
            }
            steering.tick(&transfer);
            if c.poll().is_ok() {
                keep_record(c);
                transfer.confirm(c.stored());
                if c.refused_meanwhile() {
                    transfer.abort().abort();
                }
            }
        },
    );
    bar.finish_and_clear();
    let keeps = match peer {
        Peer::Braid => {
            "the server keeps what arrived (not under the final name): run again with --resume to send the rest"
        }
        Peer::GridFtp => "the server keeps what arrived: run again with --resume to send the rest",
    };
    let stop_upload = |c: &mut Control| {
        let advice = format!("; {keeps}");
        let e = stopped(c, progress.load(Ordering::Relaxed), &advice, None);
        let _ = record.save(c.stored());
        e
    };
    if interrupt.hit() {
        return Err(stop_upload(c));
    }
    let mut sent = result.map_err(|e| {
        let what = "cannot read the file being uploaded";
        let e = data_phase_failed(c, &stor, e, what, progress.load(Ordering::Relaxed), None);
        keep_record(c);
        match e {
            ClientError::Interrupted { bytes, why, .. } => ClientError::Interrupted {
                bytes,
                why: format!("{why}; {keeps}"),
                partial: None,
            },
            e => e,
        }
    })?;
    let kept = std::mem::take(&mut sent.kept);
    let mut verified = None;
    if let Some(sum) = sent.sum {
        let hex = checksum::hex(sum.finish(len));
        let scks = Command::Scks {
            alg: checksum::NAME.into(),
            value: Some(hex.clone()),
        };
        c.send(&scks)?;
        let Some(r) = c.final_reply_unless(|| interrupt.hit())? else {
            return Err(stop_upload(c));
        };
        if r.code != 200 {
            return Err(upload_failed(r, &record, c));
        }
        verified = Some(format!("{} {hex}", checksum::NAME));
    }
    // A GridFTP server that reads pipelined commands answers CKSM right after its 226: asked
    // now, its answer costs no round trip of its own (a file of a tree costs two, not three).
    let cksm_ahead = peer == Peer::GridFtp && c.session().pipelining();
    if cksm_ahead {
        c.send(&Command::Cksm {
            alg: peer.checksum(c).into(),
            offset: 0,
            length: None,
            path: target.path.clone(),
        })?;
    }
    let Some(r) = c.final_reply_unless(|| interrupt.hit())? else {
        return Err(stop_upload(c));
    };
    if r.code != 226 && r.code != 250 {
        if cksm_ahead {
            // Its answer is read too, so the session's next command meets its own reply.
            c.final_reply_unless(|| false)?;
        }
        return Err(upload_failed(r, &record, c));
    }
    record.remove();
    // The server keeps them too once the upload is complete (GridFTP data-channel caching).
    c.keep_data_connections(Direction::Upload, kept);
    // Done: from here (reading the file back to check it) Ctrl-C exits at once.
    drop(interrupt);
    if peer == Peer::Braid && verified.is_none() {
        // Announced before the data (resumed upload); the server checked it before the 226.
        let sum = crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
        verified = Some(format!("{} {}", checksum::NAME, checksum::hex(sum)));
    }
    if peer == Peer::GridFtp {
        let alg = peer.checksum(c);
        let theirs = if cksm_ahead {
            c.final_reply_unless(|| false)?
                .and_then(|r| braid_proto::client::checksum_in(&r))
        } else {
            c.checksum(alg, &target.path)?
        };
        let local =
            crate::sums::named(alg, file, 0, len).map_err(local_err("cannot read the file"))?;
        let ours = "the file sent hashes to";
        verified = agree_with(theirs, alg, &target.path, &local, ours, "")?;
    }
    let s = super::summary(
        "put",
        target,
        String::new(),
        sent.per_conn.iter().sum(),
        Some(len),
        resumed_from,
        started,
    );
    Ok(extended(s, &plan, &transfer, steering, verified, reused))
}

/// Of the ranges a GridFTP server reported holding (111 markers), those whose MD5 on the
/// server matches this file's. globus-gridftp-server 13 writes the block it held when an
/// upload broke at offset 0 (strace: `lseek(fd, 0)`, then the block), inside a range it had
/// reported: trusted blindly, that range would never be sent again and the whole-file check
/// would fail after every resume. A range that differs is halved down to [`CHECKED_PIECE`],
/// so only the damaged part goes again.
fn held_for_sure(c: &mut Control, file: &File, have: &RangeSet, path: &str) -> Result<RangeSet> {
    let mut sure = RangeSet::new();
    let mut todo: Vec<(u64, u64)> = have.iter().collect();
    while let Some((start, end)) = todo.pop() {
        let ours = crate::sums::md5(file, start, end).map_err(local_err("cannot read the file"))?;
        let theirs = c.cmd(&Command::Cksm {
            alg: "MD5".into(),
            offset: start,
            length: Some(end - start),
            path: path.into(),
        })?;
        if theirs.code == 213 && theirs.text().trim().eq_ignore_ascii_case(&ours) {
            sure.insert(start, end);
        } else if theirs.code != 213 {
            // No range checksums here: nothing can be vouched for.
            eprintln!(
                "braid: the server cannot check what it holds of {path} ({theirs}); sending the whole file"
            );
            return Ok(RangeSet::new());
        } else if end - start > CHECKED_PIECE {
            let mid = start + (end - start) / 2;
            todo.extend([(start, mid), (mid, end)]);
        } else {
            tracing::info!(
                "the server's copy of {start}-{end} of {path} differs: sending it again"
            );
        }
    }
    if sure.len() < have.len() {
        eprintln!(
            "braid: {} of the {} bytes the server reported holding of {path} differ from this file; sending them again",
            have.len() - sure.len(),
            have.len()
        );
    }
    Ok(sure)
}

/// The smallest part of a held range checked on its own before it is given up.
const CHECKED_PIECE: u64 = 4 << 20;

/// `SCKS XXH3 <hex>` for the whole local file: a braid server checks an upload it did not see
/// whole (a resumed one) against it before the file takes its name.
pub(super) fn whole_file_checksum(file: &std::fs::File, len: u64) -> Result<Command> {
    let sum = crate::sums::xxh3(file, len).map_err(local_err("cannot read the file"))?;
    Ok(Command::Scks {
        alg: checksum::NAME.into(),
        value: Some(checksum::hex(sum)),
    })
}

/// The error for an upload the server did not accept at the end. A checksum mismatch means
/// the server's partial is bad: the record goes, so the next run sends everything.
fn upload_failed(r: Reply, record: &UploadRecord, c: &Control) -> ClientError {
    let e = transfer_failed(r);
    if matches!(e, ClientError::Integrity(_)) {
        record.remove();
    } else {
        let _ = record.save(c.stored());
    }
    e
}

/// The error for a data phase that failed: a local file error as such (the server is told with
/// ABOR), anything else as an interrupted transfer, with the server's final reply, which
/// usually says why.
fn data_phase_failed(
    c: &mut Control,
    cmd: &Command,
    e: EngineError,
    local_what: &str,
    bytes: u64,
    partial: Option<String>,
) -> ClientError {
    if let EngineError::Local(cause) = e {
        // Only this side knows it stopped: a sender blocked on connections nobody reads
        // any more gives no final reply until it is told with ABOR.
        send_abort(c);
        return ClientError::Local {
            what: local_what.into(),
            cause,
        };
    }
    if let EngineError::Tls(e) = e {
        send_abort(c);
        return ClientError::Tls(c.data_tls_failed(&e));
    }
    // The server's refusal is the cause (a full disk, say); what this side saw of it, a
    // connection it closed, comes second.
    let why = match c.finish_transfer(cmd) {
        Err(ClientError::Remote { reply, .. }) => {
            format!("server reported {reply} (this side saw: {e})")
        }
        _ => e.to_string(),
    };
    ClientError::Interrupted {
        bytes,
        why,
        partial,
    }
}

/// Sends the transfer command, opens `n` data connections to the server's passive address,
/// then waits for 150. Connecting before the 150 matters: the Globus server sends it only once
/// data connections have arrived (a braid server takes them from its backlog after sending
/// it). If the server refused the command instead, that refusal is the error reported.
fn open_and_start(
    c: &mut Control,
    cmd: &Command,
    addr: std::net::SocketAddr,
    n: u32,
    buffer: Option<u64>,
    elastic: bool,
) -> Result<Vec<std::net::TcpStream>> {
    c.send_transfer(cmd)?;
    // All at once: each connection costs a round trip, and they need not wait for each other.
    let socks: Vec<Result<TcpStream>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                scope.spawn(move || {
                    let s = connect_data(addr)?;
                    engine::set_buffer(&s, buffer);
                    Ok(s)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ClientError::Protocol("a connecting thread failed".into()))
                })
            })
            .collect()
    });
    let started = c.transfer_started(cmd);
    // Elastic: a server that has already sent everything on the first connections closes its
    // listener, so a refused latecomer is no error.
    let (ok, failed): (Vec<_>, Vec<_>) = socks.into_iter().partition(|s| s.is_ok());
    started?;
    let ok: Vec<TcpStream> = ok.into_iter().filter_map(|s| s.ok()).collect();
    match failed.into_iter().find_map(|s| s.err()) {
        Some(e) if !elastic || ok.is_empty() => Err(e),
        Some(e) => {
            tracing::debug!("a data connection was not needed: {e}");
            Ok(ok)
        }
        None => Ok(ok),
    }
}

/// An upload's final reply that is not success, classified by the client session: an
/// integrity failure (535), or an interrupted upload to continue with --resume.
fn transfer_failed(r: Reply) -> ClientError {
    match Failure::from_reply("the upload", r) {
        Failure::Integrity(r) => {
            ClientError::Integrity(format!("the server refused the upload: {r}"))
        }
        Failure::Login(r)
        | Failure::NoSpace(r)
        | Failure::Refused { reply: r, .. }
        | Failure::Transient { reply: r, .. } => ClientError::Interrupted {
            bytes: 0,
            why: format!("server reported {r}"),
            partial: None,
        },
        Failure::Protocol(why) => ClientError::Protocol(why),
        f @ Failure::Closed { .. } => ClientError::Protocol(f.to_string()),
    }
}
