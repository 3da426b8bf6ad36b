//! One transfer, supervised from the control connection: the data moves on a blocking thread
//! while ABOR, STAT, QUIT and SCKS are still answered, MODE E uploads report markers, and an
//! upload takes its final name only once it is known whole and its checksum matches.

use super::Shutdown;
use super::conn::{Conn, Input, MAX_QUEUED};
use super::data::{self, BlockConns, DataError, Finished};
use super::inline;
use super::io::Io;
use super::pacing;
use super::reached;
use crate::engine;
use braid_proto::checksum;
use braid_proto::ranges::RangeSet;
use braid_proto::retr_opts::RetrOpts;
use braid_proto::session::{
    DataEndpoint, Expected, FsError, Session, Transfer, TransferKind, TransferOutcome,
};
use braid_proto::{Command, Reply};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};

/// How often the tuning of a copy this server sends looks at its connections (as a client's).
const TUNE_EVERY: Duration = Duration::from_millis(100);

/// How often a running transfer's bytes and connections reach the metrics.
const COUNT_INTERVAL: Duration = Duration::from_secs(1);

/// Data connections a transfer has open now: a stream-mode one never joins `moving`.
fn open_connections(t: &Transfer, moving: &engine::transfer::Transfer) -> usize {
    match t.block {
        None => 1,
        Some(_) => moving.open(),
    }
}

/// Runs one transfer while still answering the control connection. Returns whether the
/// session goes on.
pub(super) async fn transfer(
    conn: &mut Conn,
    io: &mut Io,
    session: &mut Session,
    t: Transfer,
    shutdown: &mut watch::Receiver<Shutdown>,
) -> bool {
    // Whatever answers were held back go with this transfer's start (or refusal), before
    // the data: the client may wait for them to go on. So does all that goes meanwhile.
    conn.cork = false;
    // An upload sent ahead: its data is on its way even if it is refused here.
    let drains = t.block.as_ref().is_some_and(|b| b.fixed);
    let most = io.config.max_tree_entries;
    let prepared = match io.root() {
        Ok(root) if inline::opens(&t) => super::files::prepare(&root, &t, io.quota.as_ref(), most)
            .map(|(job, size)| (root, job, size)),
        Ok(root) => {
            let (t, at, quota) = (t.clone(), root.clone(), io.quota.clone());
            tokio::task::spawn_blocking(move || {
                super::files::prepare(&at, &t, quota.as_ref(), most)
            })
            .await
            .unwrap_or_else(|e| Err(FsError::Other(e.to_string())))
            .map(|(job, size)| (root, job, size))
        }
        Err(e) => Err(e),
    };
    let (root, mut job, size) = match prepared {
        Ok(x) => x,
        Err(e) => {
            io.passive = None;
            if drains {
                io.drain_refused_upload().await;
            }
            return conn.send(&t.refusal(&e)).await.is_ok();
        }
    };
    if conn.send(&t.opening(size)).await.is_err() {
        return false;
    }
    let started = std::time::Instant::now();
    let progress = Arc::new(AtomicU64::new(0));
    let elastic = t.block.as_ref().is_some_and(|b| b.elastic);
    let compression = t.block.as_ref().and_then(|b| b.compression);
    let moving = Arc::new(engine::transfer::Transfer::new(elastic).with_compression(compression));
    let is_upload = matches!(
        t.kind,
        TransferKind::Stor(_) | TransferKind::Appe(_) | TransferKind::StoreBundle(_)
    );
    // What the server sends goes at the pace of the user's class, its share of the uplink and
    // background mode (listings are small and go as they are).
    let mut sending = match t.kind {
        TransferKind::List(..) => None,
        _ if is_upload => None,
        _ => {
            let account = session.user().filter(|_| io.anonymous_id.is_none());
            let class = account
                .map(|u| io.config.users.class(u))
                .unwrap_or_default();
            // Background mode starts at four segments per this round trip, until the data
            // connections' own show the path's. Unknown under TLS, and in a copy between
            // servers the control connection's is not the path's anyway: a long WAN's round
            // trip then (a guess of a second started at 6 kB/s, which large blocks at that
            // pace kept from ever being measured).
            let rtt = conn.min_rtt().unwrap_or(Duration::from_millis(100));
            let c = &io.config;
            // The client may ask for it (a copy between servers, whose path only this end sees).
            let asked = t.block.as_ref().and_then(|b| b.background);
            Some(pacing::Sending::new(
                class,
                asked.map(|ms| Duration::from_millis(ms.into())),
                c.background,
                c.uplink,
                &c.shares,
                rtt,
            ))
        }
    };
    let yields = sending.as_ref().is_some_and(|s| s.yields());
    if let Some(s) = &mut sending {
        s.client_asks(t.block.as_ref().and_then(|b| b.max_rate), &moving);
    }
    let congestion = t.block.as_ref().and_then(|b| b.congestion);
    if let Some(cc) = congestion.or(sending.as_ref().and_then(pacing::Sending::congestion)) {
        moving.set_congestion(Some(cc));
    }
    let dscp = t.block.as_ref().and_then(|b| b.dscp);
    if let Some(d) = dscp.or(yields.then_some(engine::background::LOWER_EFFORT)) {
        moving.set_dscp(d);
    }
    // A copy between servers this server sends and may tune: its steering, and where the
    // connections it opens later join.
    let (mut steering, mut opened) = match &t.block {
        Some(b) => {
            let left = size.map(|s| s.saturating_sub(b.have.len()));
            let paced = sending.as_ref().is_some_and(pacing::Sending::steers);
            let idle = io.config.idle_timeout;
            super::tuning::tuned(&t, b, left, paced, io.local.ip(), &moving, idle).unzip()
        }
        None => (None, None),
    };
    // A MODE E upload's receiving state, for the 111 Range Markers; a striped upload's, what
    // its nodes' markers say they stored and what of it went on to the client.
    let mut received = None;
    let mut striped: Option<(Arc<std::sync::Mutex<RangeSet>>, RangeSet)> = None;
    let connected = match &t.block {
        // A striped front end: the data nodes move it.
        Some(b) if matches!(t.endpoint, DataEndpoint::Striped(_)) => {
            striped_order(io, &root, &t, b, size).map(|order| {
                if is_upload {
                    striped = Some((order.stored.clone(), b.have.clone()));
                }
                let (progress, moving) = (progress.clone(), moving.clone());
                let (links, sums) = (io.nodes.clone(), io.config.checksums.clone());
                Worker::Thread(tokio::task::spawn_blocking(move || {
                    super::stripes::run(links, &order, job, &moving, &progress, &sums)
                }))
            })
        }
        None => io.stream_connection(&t).await.map(|sock| {
            moving.abort().register(&sock);
            // For its pacing, marking and statistics.
            moving.watch(&sock);
            let progress = progress.clone();
            let tls = io.tls.clone().filter(|_| t.private);
            let deflate = t.deflate;
            Worker::Thread(tokio::task::spawn_blocking(move || {
                data::run(job, sock, tls, deflate, progress)
            }))
        }),
        Some(b) => io
            .block_connections(&t, b, &progress)
            .await
            .map(|mut conns| {
                match &mut conns {
                    BlockConns::Receive(_, state, _) => received = Some(state.clone()),
                    BlockConns::Send(joins) => joins.incoming = opened.take(),
                }
                let (progress, moving) = (progress.clone(), moving.clone());
                let have = b.have.clone();
                let block = b.block_size.unwrap_or(engine::DEFAULT_BLOCK);
                let sums = io.config.checksums.clone();
                let here = inline::moves(&mut job, &conns, &have);
                let run =
                    move || data::run_blocks(job, conns, &have, block, progress, &moving, &sums);
                if here {
                    Worker::Done(run())
                } else {
                    Worker::Thread(tokio::task::spawn_blocking(run))
                }
            }),
    };
    let worker = match connected {
        Ok(w) => w,
        Err(e) => {
            for r in session.transfer_done(&t, TransferOutcome::NoConnection(e)) {
                if conn.send(&r).await.is_err() {
                    return false;
                }
            }
            return true;
        }
    };
    // Files, not listings, count for the metrics and the xferlog (as in vsftpd's). An
    // anonymous session is one whose password was kept as its id.
    let user = session.user().filter(|_| io.anonymous_id.is_none());
    let mut live = match t.kind {
        TransferKind::List(..) => None,
        _ => Some(io.config.metrics.transfer(is_upload, user)),
    };
    let mut counts = tokio::time::interval(COUNT_INTERVAL);
    let aborted = AtomicBool::new(false);
    let shut = AtomicBool::new(false);
    let kill = |why: &AtomicBool| {
        why.store(true, Ordering::SeqCst);
        moving.abort().abort();
    };
    let mut quit = false;
    let mut client_gone = false;
    let mut stopped_by_shutdown = false;
    // SCKS sent while the data moves (braid clients announce the checksum once sent).
    let mut announced: Option<String> = None;
    let deferred = is_upload && matches!(t.expect, Some(Expected::Deferred));
    // A client that sends the next upload before this one's answers (bundles on kept
    // connections) may have sent its checksum already: read with the commands ahead of it, it
    // waits first in the queue, where the loop below (which reads only new lines) would never
    // look.
    if deferred
        && let Some(Ok(Command::Scks { value: Some(v), .. })) =
            conn.queued.front().map(|l| Command::parse(l))
    {
        conn.queued.pop_front();
        announced = Some(v);
        let _ = conn
            .send(&Reply::new(200, "SCKS Command Successful."))
            .await;
    }
    // Markers of an upload's progress; for a braid client's download, what this side's kernel
    // says of the sending, for its tuning. Each: (when last sent, bytes then: received, or
    // sent by the kernel's count, since the payload counter moves a block at a time, seconds
    // on a slow path).
    let report_sender = elastic && !is_upload;
    let mut markers = tokio::time::interval(MARKER_CHECK);
    let mut pace = tokio::time::interval(pacing::EVERY);
    let mut tune = tokio::time::interval(TUNE_EVERY);
    let steers = sending.as_ref().is_some_and(|s| s.steers());
    let mut last_marker = (Instant::now(), 0);
    let result = match worker {
        Worker::Done(r) => Ok(r),
        Worker::Thread(mut thread) => loop {
            tokio::select! {
                r = &mut thread => break r.map_err(|e| e.to_string()),
                _ = tune.tick(), if steering.is_some() => {
                    if let Some(s) = &mut steering {
                        s.tick(&moving);
                    }
                }
                _ = pace.tick(), if steers => {
                    if let Some(s) = &mut sending {
                        s.tick(&moving);
                    }
                }
                _ = counts.tick(), if live.is_some() => {
                    if let Some(live) = &mut live {
                        live.update(progress.load(Ordering::Relaxed), open_connections(&t, &moving));
                    }
                }
                _ = markers.tick(), if received.is_some() || report_sender || striped.is_some() => {
                    let (at, then) = last_marker;
                    if let Some((stored, forwarded)) = &mut striped {
                        // The nodes pace their markers: each news of theirs goes on at once.
                        let ranges = stored.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        if ranges != *forwarded {
                            let _ = conn.send(&braid_proto::markers::range_marker(&ranges)).await;
                            *forwarded = ranges;
                        }
                    } else if let Some(state) = &received {
                        let bytes = progress.load(Ordering::Relaxed);
                        if at.elapsed() >= MARKER_INTERVAL || bytes - then >= MARKER_BYTES {
                            send_markers(conn, &progress, state).await;
                            last_marker = (Instant::now(), bytes);
                        }
                    } else if at.elapsed() >= REPORT_INTERVAL
                        && let Some(r) = sender_report(&moving)
                        && r.sent.saturating_sub(then) >= REPORT_BYTES
                    {
                        let _ = conn.send(&braid_proto::markers::sender_marker(&r)).await;
                        last_marker = (Instant::now(), r.sent);
                    }
                }
                input = conn.read_input(), if !client_gone && conn.queued.len() < MAX_QUEUED => match input {
                    Input::Line(l) => match Command::parse(&l) {
                        Ok(Command::Abor) => kill(&aborted),
                        Ok(Command::Stat(None)) => {
                            let r = Reply::new(213, format!("Status: {} bytes transferred so far.", progress.load(Ordering::Relaxed)));
                            let _ = conn.send(&r).await;
                        }
                        // The checksum of this upload, when its client said it would come after
                        // the data (`SCKS XXH3 *`); any other is a pipelined command for a later
                        // file, and waits its turn.
                        Ok(Command::Scks { value: Some(v), .. }) if deferred && announced.is_none() => {
                            announced = Some(v);
                            let _ = conn.send(&Reply::new(200, "SCKS Command Successful.")).await;
                        }
                        Ok(Command::Quit) => quit = true,
                        // A braid client changing how a running download is sent (its cap, its
                        // congestion control; the other options apply to the next transfer).
                        Ok(Command::Opts(o)) if elastic && !is_upload && o.to_ascii_uppercase().starts_with("RETR ") => {
                            let r = match RetrOpts::parse(&o[5..]) {
                                Ok(RetrOpts { parallelism: None, block_size: None, max_rate, congestion, dscp: None, background: None })
                                    if max_rate.is_some() || congestion.is_some() =>
                                {
                                    if let (Some(rate), Some(s)) = (max_rate, &mut sending) {
                                        s.client_asks((rate > 0).then_some(rate), &moving);
                                    }
                                    if congestion.is_some() {
                                        moving.set_congestion(congestion);
                                    }
                                    Reply::new(200, "OPTS Command Successful.")
                                }
                                Ok(_) => Reply::new(501, "Only MaxRate and Congestion can change while a transfer runs."),
                                Err(e) => Reply::new(501, format!("OPTS RETR: {e}.")),
                            };
                            let _ = conn.send(&r).await;
                        }
                        _ => conn.queued.push_back(l),
                    },
                    // The client vanished. A download stops now; an upload keeps reading what is
                    // already in flight (bounded by the socket timeout) but is never committed.
                    // A MODE E upload with no data connection open has nothing in flight: it
                    // stops too, rather than hold its names' partials and locks until its idle
                    // timeout (the client, or the server it had send, will never connect).
                    Input::Closed | Input::TooLong => {
                        client_gone = true;
                        if !is_upload || (t.block.is_some() && moving.open() == 0) {
                            kill(&aborted);
                        }
                    }
                },
                _ = reached(shutdown, Shutdown::Abort), if !stopped_by_shutdown => {
                    stopped_by_shutdown = true;
                    kill(&shut);
                }
            }
        },
    };
    // The data has moved: from here the answers may wait for those to the commands behind
    // (see `Conn::cork`).
    conn.cork = conn.input_waiting();
    // The last report, so the client knows how the whole transfer was sent.
    if report_sender
        && !client_gone
        && let Some(r) = sender_report(&moving)
    {
        let _ = conn.send(&braid_proto::markers::sender_marker(&r)).await;
    }
    let outcome = match result {
        _ if aborted.load(Ordering::SeqCst) => TransferOutcome::Aborted,
        _ if shut.load(Ordering::SeqCst) => TransferOutcome::Shutdown,
        Err(e) => TransferOutcome::Local(FsError::Other(format!("transfer thread failed: {e}"))),
        Ok(Err(DataError::Net(e))) => TransferOutcome::ConnectionLost(e.to_string()),
        Ok(Err(DataError::Local(e))) => TransferOutcome::Local(e),
        Ok(Err(DataError::NotSecured(e))) => TransferOutcome::NotSecured(e),
        Ok(Ok(Finished {
            bytes,
            upload: _,
            received,
            kept,
            checksum,
            stored: Some(partials),
        })) => {
            // A bundle's files take their names only once the client's checksum of all it
            // sent agrees; otherwise (or if it went) none of them does.
            let sum = received.and_then(|(_, s)| s);
            match verify_upload(conn, io, t.expect.as_ref(), announced, sum).await {
                Err(outcome) => outcome,
                Ok(()) if t.expect.is_none() => TransferOutcome::Local(FsError::Other(
                    "a bundle is stored only with the checksum of all it holds: send SCKS XXH3 * before SBND".into(),
                )),
                Ok(()) => match tokio::task::spawn_blocking(move || (*partials).commit()).await {
                    Ok(Ok(())) => complete(io, bytes, kept, checksum),
                    Ok(Err(e)) => TransferOutcome::Local(e),
                    Err(e) => TransferOutcome::Local(FsError::Other(e.to_string())),
                },
            }
        }
        Ok(Ok(Finished {
            bytes,
            upload,
            received,
            kept,
            checksum,
            stored: None,
        })) => match upload {
            None => complete(io, bytes, kept, checksum),
            Some(_) if client_gone => {
                TransferOutcome::ConnectionLost("client closed the control connection".into())
            }
            Some((upload, file)) => {
                let verdict = match (&t.block, received) {
                    // MODE E ends with an explicit EOF, so the data is known to be whole; what
                    // remains is the checksum the client announced, if any.
                    (Some(_), Some((_, actual))) => {
                        verify_upload(conn, io, t.expect.as_ref(), announced, actual).await
                    }
                    // Stream mode ends an upload by closing the data connection, which a
                    // killed client also does. If the control connection closed as well, the
                    // upload is not known to be complete: keep it as a partial.
                    _ if control_closed(conn).await => {
                        client_gone = true;
                        Err(TransferOutcome::ConnectionLost(
                            "client closed the control connection".into(),
                        ))
                    }
                    // A stream upload whose client announced the whole file's checksum (a
                    // resumed one), hashed on the data thread: checked before it takes its name.
                    (None, Some((_, actual))) => {
                        verify_upload(conn, io, t.expect.as_ref(), announced, actual).await
                    }
                    _ => Ok(()),
                };
                match verdict {
                    Err(outcome) => outcome,
                    Ok(()) => {
                        // With a quota: a new name must fit the file count, and a file the
                        // upload replaces gives its bytes back.
                        let replaced = io.quota.as_ref().map(|_| root.stat(t.path()).ok());
                        let counted = match (&io.quota, &replaced) {
                            (Some(q), Some(None)) => q.new_file(),
                            _ => Ok(()),
                        };
                        let committed = match counted {
                            Err(e) => Err(e),
                            Ok(()) if inline::in_memory(&file) => upload.commit(file),
                            Ok(()) => tokio::task::spawn_blocking(move || upload.commit(file))
                                .await
                                .unwrap_or_else(|e| Err(FsError::Other(e.to_string()))),
                        };
                        match (&io.quota, replaced, &committed) {
                            (Some(q), Some(Some(old)), Ok(())) => q.replaced(old.size),
                            (Some(q), Some(None), Err(e)) if !matches!(e, FsError::Quota(_)) => {
                                q.no_new_file()
                            }
                            _ => {}
                        }
                        match committed {
                            Ok(()) => complete(io, bytes, kept, None),
                            Err(e) => TransferOutcome::Local(e),
                        }
                    }
                }
            }
        },
    };
    let secs = started.elapsed().as_secs_f64();
    let bytes = progress.load(Ordering::Relaxed);
    tracing::info!(
        peer = %io.peer,
        user = session.user().unwrap_or("-"),
        path = %t.path(),
        direction = if is_upload { "upload" } else { "download" },
        mode = match (&t.block, t.deflate) {
            (Some(_), _) => "E",
            (None, Some(_)) => "Z",
            (None, None) => "S",
        },
        // MODE E between braid peers: payload bytes on the wire, less than `bytes` when
        // blocks went compressed.
        wire_bytes = moving
            .compression()
            .agreed()
            .then(|| moving.compression().report().wire_bytes),
        // Data connections this transfer used, and whether the last transfer left them open.
        data_connections = if t.block.is_some() { moving.links().len() } else { 1 },
        reused = t.endpoint == DataEndpoint::Cached,
        // Sent in background mode: yielding to other traffic.
        background = yields,
        bytes,
        seconds = (secs * 1e3).round() / 1e3,
        megabytes_per_second = (bytes as f64 / secs.max(1e-9) / 1e5).round() / 10.0,
        outcome = outcome.word(),
        why = outcome.detail().unwrap_or_default(),
        "transfer"
    );
    if let Some(live) = live {
        live.end(bytes, outcome.word());
        if let Some(log) = &io.config.xferlog {
            // A line per file, as for files sent one by one: a bundle's each at its size.
            let files = match &t.kind {
                TransferKind::Bundle(files) => files.clone(),
                TransferKind::StoreBundle(files) => {
                    files.iter().map(|(p, n, _)| (p.clone(), *n)).collect()
                }
                _ => vec![(t.path().clone(), bytes)],
            };
            for (path, bytes) in files {
                let path = path.to_string();
                log.write(&super::xferlog::Entry {
                    at: SystemTime::now(),
                    took: started.elapsed(),
                    host: braid_proto::session::canonical_ip(io.peer.ip()),
                    bytes,
                    path: &root.path().join(path.trim_start_matches('/')),
                    ascii: t.ascii,
                    upload: is_upload,
                    user: match user {
                        Some(name) => super::xferlog::User::Account(name),
                        None => super::xferlog::User::Anonymous(io.anonymous_id.as_deref()),
                    },
                    complete: matches!(outcome, TransferOutcome::Complete { .. }),
                });
            }
        }
    }
    if client_gone {
        return false;
    }
    // Whatever the outcome, the client learns what is stored: after ABOR or a lost data
    // connection, that is what a resumed upload need not send again.
    if let Some(state) = &received {
        send_markers(conn, &progress, state).await;
    }
    // The transfer's line above reports how it ended; a 426 after ABOR is no refusal.
    for r in session.transfer_done(&t, outcome) {
        if conn.send_unlogged(&r).await.is_err() {
            return false;
        }
    }
    if quit {
        let _ = conn.send(&Reply::new(221, "Goodbye.")).await;
        return false;
    }
    true
}

/// What a striped front end tells its nodes for transfer `t`.
fn striped_order(
    io: &Io,
    root: &crate::fsroot::Root,
    t: &Transfer,
    b: &braid_proto::session::BlockMode,
    size: Option<u64>,
) -> Result<super::stripes::Order, String> {
    let super::Striping::FrontEnd(front) = &io.config.striping else {
        return Err("this server has no data nodes".into());
    };
    let nodes = io
        .nodes
        .as_ref()
        .map_or(1, |l| l.lock().unwrap_or_else(|p| p.into_inner()).stripes());
    let client = super::stripes::Client {
        ip: braid_proto::session::canonical_ip(io.peer.ip()),
        binding: io.binding.as_ref().map(|b| b.to_bytes()),
    };
    super::stripes::order(front, root.path(), t, b, size, client, nodes as u32)
}

/// Where a transfer's data moves: on a blocking thread, or already moved on the control task
/// (see [`inline`]).
enum Worker {
    Thread(tokio::task::JoinHandle<Result<Finished, DataError>>),
    Done(Result<Finished, DataError>),
}

/// A finished transfer; what it leaves open waits for the next transfer the same way.
fn complete(
    io: &mut Io,
    bytes: u64,
    kept: engine::receive::Kept,
    checksum: Option<String>,
) -> TransferOutcome {
    let reusable = !kept.socks.is_empty();
    io.cached = reusable.then_some(kept);
    TransferOutcome::Complete {
        bytes,
        kept: reusable,
        checksum,
    }
}

/// How often a MODE E upload reports progress and stored ranges: every 5 s (the Globus server's
/// default), and sooner once 32 MiB more have arrived, so that a client cut off resends little.
const MARKER_INTERVAL: Duration = Duration::from_secs(5);
/// `113 Sender` reports: at most every half second, and only after 64 KiB more (so that on a
/// dial-up link they take well under 1 % of it).
const REPORT_INTERVAL: Duration = Duration::from_millis(500);
const REPORT_BYTES: u64 = 64 << 10;
const MARKER_BYTES: u64 = 32 << 20;
const MARKER_CHECK: Duration = Duration::from_millis(100);

/// The sending side's data connections, summed from `TCP_INFO`; None before any is open.
fn sender_report(
    moving: &engine::transfer::Transfer,
) -> Option<braid_proto::markers::SenderReport> {
    let infos: Vec<_> = moving.links().iter().filter_map(|l| l.tcp_info()).collect();
    if infos.is_empty() {
        return None;
    }
    let n = infos.len() as u64;
    Some(braid_proto::markers::SenderReport {
        sent: infos.iter().map(|i| i.bytes_sent).sum(),
        resent: infos.iter().map(|i| i.bytes_retrans).sum(),
        rtt_us: (infos.iter().map(|i| u64::from(i.rtt_us)).sum::<u64>() / n) as u32,
        min_rtt_us: infos
            .iter()
            .map(|i| i.min_rtt_us)
            .filter(|&r| r > 0)
            .min()
            .unwrap_or(0),
        cc: moving.congestion(),
        busy_ms: infos.iter().map(|i| i.busy_us).sum::<u64>() / 1000,
        rwnd_limited_ms: infos.iter().map(|i| i.rwnd_limited_us).sum::<u64>() / 1000,
        sndbuf_limited_ms: infos.iter().map(|i| i.sndbuf_limited_us).sum::<u64>() / 1000,
        open: u32::try_from(moving.open()).unwrap_or(u32::MAX),
    })
}

/// `112-Perf Marker` and `111 Range Marker` for a MODE E upload: GridFTP clients show progress
/// from the first and restart from the second.
async fn send_markers(conn: &mut Conn, progress: &AtomicU64, state: &engine::receive::Shared) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let _ = conn
        .send(&braid_proto::markers::perf_marker(
            now,
            progress.load(Ordering::Relaxed),
        ))
        .await;
    let ranges = state.snapshot().ranges;
    if !ranges.is_empty() {
        let _ = conn
            .send(&braid_proto::markers::range_marker(&ranges))
            .await;
    }
}

/// Checks a complete MODE E upload against the checksum the client gave with SCKS, waiting on
/// the control connection for one announced as following (`SCKS XXH3 *`).
async fn verify_upload(
    conn: &mut Conn,
    io: &Io,
    expect: Option<&Expected>,
    mut announced: Option<String>,
    actual: Option<u128>,
) -> Result<(), TransferOutcome> {
    let expected = match expect {
        None => return Ok(()),
        Some(Expected::Value(v)) => v.clone(),
        Some(Expected::Deferred) => {
            if announced.is_none() {
                announced = await_checksum(conn, io.config.idle_timeout).await;
            }
            announced.ok_or_else(|| {
                TransferOutcome::ConnectionLost(
                    "the client did not send the checksum it announced (SCKS)".into(),
                )
            })?
        }
    };
    let actual = actual.map(checksum::hex).unwrap_or_default();
    if actual == expected.to_ascii_lowercase() {
        Ok(())
    } else {
        Err(TransferOutcome::ChecksumMismatch { expected, actual })
    }
}

/// Waits for `SCKS alg value` on the control connection; other commands wait their turn.
async fn await_checksum(conn: &mut Conn, limit: Duration) -> Option<String> {
    let deadline = Instant::now() + limit;
    while conn.queued.len() < MAX_QUEUED {
        let input = timeout_at(deadline, conn.read_input()).await.ok()?;
        let Input::Line(l) = input else {
            return None;
        };
        match Command::parse(&l) {
            Ok(Command::Scks { value: Some(v), .. }) => {
                let _ = conn
                    .send(&Reply::new(200, "SCKS Command Successful."))
                    .await;
                return Some(v);
            }
            Ok(Command::Abor) => return None,
            _ => conn.queued.push_back(l),
        }
    }
    None
}

/// Whether the client closed the control connection when the data ended. A client that dies
/// closes both: the kernel closes its descriptors in ascending order, so the control
/// connection's end (opened first) is here before the data's, and the socket is asked at
/// once. Waiting for it instead cost every upload of a client that waits for the 226 (lftp,
/// curl, ftplib) the whole wait: 5 ms made lftp's uploads of small files 2.5 times slower
/// than to vsftpd. Under TLS the socket cannot tell, so a moment is waited for a close.
async fn control_closed(conn: &mut Conn) -> bool {
    if let Some(closed) = conn.closed_now() {
        return closed;
    }
    if !conn.queued.is_empty() {
        return false;
    }
    match timeout(Duration::from_millis(5), conn.read_input()).await {
        Ok(Input::Line(l)) => {
            conn.queued.push_back(l);
            false
        }
        Ok(Input::Closed | Input::TooLong) => true,
        Err(_) => false,
    }
}
