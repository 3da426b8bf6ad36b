//! One control connection: reads commands, drives the protocol session and does the I/O it
//! asks for. Beside it: `connections.rs` opens data connections, `files.rs` does file
//! operations and listings, `supervise.rs` runs a transfer while the control connection
//! stays live (ABOR, STAT, markers, upload checks).

use super::{Config, Shutdown};
use crate::engine;
use crate::engine::tls::Binding;
use crate::fsroot::Root;
use braid_proto::line::{LineBuffer, LineError};
use braid_proto::session::{
    Action, FsError, FsOp, FsOutcome, Session, SessionConfig, canonical_ip,
};
use braid_proto::{Command, MAX_LINE, Reply};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tokio_rustls::server::TlsStream;

/// Commands a client may pipeline behind a running transfer before the server stops reading.
pub(super) const MAX_QUEUED: usize = 32;

/// The control connection, in clear or, after AUTH TLS, encrypted.
pub(super) enum Channel {
    Clear {
        rd: OwnedReadHalf,
        wr: OwnedWriteHalf,
    },
    Tls {
        rd: ReadHalf<TlsStream<TcpStream>>,
        wr: WriteHalf<TlsStream<TcpStream>>,
    },
    /// Only while the TLS handshake runs, or after it failed.
    Closed,
}

pub(super) struct Conn {
    pub(super) channel: Channel,
    pub(super) lines: LineBuffer,
    pub(super) buf: Box<[u8]>,
    /// Lines read while a transfer ran, handled after it.
    pub(super) queued: VecDeque<Vec<u8>>,
    /// Replies held back while `cork` is on, sent together with the next one that goes.
    corked: Vec<u8>,
    /// Hold replies back: the client has sent more commands (it pipelines), so the answers to
    /// several go in one write, one segment, one read at its end (a file moved ahead costs
    /// three: its end, its checksum and the next one's start).
    pub(super) cork: bool,
    /// Who sent the command being answered, for the log line of a refusal.
    pub(super) peer: SocketAddr,
    pub(super) user: Option<String>,
    pub(super) command: String,
}

/// What reading the next command gave.
pub(super) enum Input {
    Line(Vec<u8>),
    TooLong,
    Closed,
}

impl Conn {
    /// The lowest round trip the control connection has seen (in clear only: the TLS
    /// stream's halves do not lend their socket).
    pub(super) fn min_rtt(&self) -> Option<std::time::Duration> {
        let Channel::Clear { wr, .. } = &self.channel else {
            return None;
        };
        let tcp: &tokio::net::TcpStream = wr.as_ref();
        let us = braid_sockopt::tcp_info(tcp)?.min_rtt_us;
        (us > 0).then(|| std::time::Duration::from_micros(us.into()))
    }

    /// Whether the client has closed the control connection, from what its socket holds at
    /// this moment (an end of stream, or a reset), without waiting; None under TLS, where the
    /// socket's bytes are records, not commands.
    pub(super) fn closed_now(&self) -> Option<bool> {
        let Channel::Clear { rd, .. } = &self.channel else {
            return None;
        };
        if !self.queued.is_empty() || self.lines.pending() > 0 {
            return Some(false);
        }
        let tcp: &tokio::net::TcpStream = rd.as_ref();
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        Some(match rustix::net::recv(tcp, &mut [0u8; 1], flags) {
            // (bytes read, length of the message): a peek at an ended stream reads nothing.
            Ok((n, _)) => n == 0,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => false,
            Err(_) => true,
        })
    }

    /// Whether a whole command is waiting, queued or read: the client pipelines.
    pub(super) fn input_waiting(&self) -> bool {
        !self.queued.is_empty() || self.lines.has_line()
    }

    /// Sends the replies held back (see `cork`), and holds none from now on.
    pub(super) async fn flush(&mut self) -> std::io::Result<()> {
        self.cork = false;
        if self.corked.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.corked);
        let sent = match &mut self.channel {
            Channel::Clear { wr, .. } => wr.write_all(&out).await,
            Channel::Tls { wr, .. } => match wr.write_all(&out).await {
                Ok(()) => wr.flush().await,
                Err(e) => Err(e),
            },
            Channel::Closed => Err(std::io::ErrorKind::NotConnected.into()),
        };
        // The buffer serves the next replies.
        self.corked = out;
        self.corked.clear();
        sent
    }

    /// The next command: one queued during a transfer first, else one read from the client.
    /// Cancel-safe: bytes are only moved into `lines` once a read completes.
    pub(super) async fn next_input(&mut self) -> Input {
        if let Some(l) = self.queued.pop_front() {
            return Input::Line(l);
        }
        self.read_input().await
    }

    /// The next line the client sends, never one already queued: while a transfer runs, a
    /// command queued for later must not come back at once, or the loop watching the
    /// transfer spins on it and never reads ABOR or STAT (nor sends its reports).
    pub(super) async fn read_input(&mut self) -> Input {
        loop {
            match self.lines.next_line() {
                Ok(Some(l)) => return Input::Line(l),
                Ok(None) => {}
                Err(LineError::TooLong(_)) => return Input::TooLong,
            }
            let read = match &mut self.channel {
                Channel::Clear { rd, .. } => {
                    // Take what the kernel already holds first. A read stops at a TCP urgent
                    // mark (ABOR from ftplib, lftp), and tokio then treats the socket as drained
                    // although the rest of the line is waiting, so awaiting readiness alone
                    // could wait forever.
                    match rustix::net::recv(
                        rd.as_ref(),
                        &mut self.buf[..],
                        rustix::net::RecvFlags::DONTWAIT,
                    ) {
                        Ok((0, _)) => return Input::Closed,
                        Ok((n, _)) => {
                            self.lines.extend(&self.buf[..n]);
                            continue;
                        }
                        Err(rustix::io::Errno::AGAIN) => {}
                        Err(_) => return Input::Closed,
                    }
                    rd.read(&mut self.buf).await
                }
                Channel::Tls { rd, .. } => rd.read(&mut self.buf).await,
                Channel::Closed => return Input::Closed,
            };
            match read {
                Ok(0) | Err(_) => return Input::Closed,
                Ok(n) => self.lines.extend(&self.buf[..n]),
            }
        }
    }

    /// Sends a reply; one that refuses the command is logged.
    pub(super) async fn send(&mut self, r: &Reply) -> std::io::Result<()> {
        if r.code >= 400 {
            tracing::info!(
                peer = %self.peer,
                user = self.user.as_deref().unwrap_or("-"),
                command = self.command,
                code = r.code,
                reply = r.text(),
                "refused"
            );
        }
        self.send_unlogged(r).await
    }

    /// Sends a reply that needs no line of its own in the log: the end of a transfer, which
    /// the transfer's line already reports with its outcome.
    pub(super) async fn send_unlogged(&mut self, r: &Reply) -> std::io::Result<()> {
        tracing::debug!("> {r}");
        r.encode(&mut self.corked);
        if self.cork {
            return Ok(());
        }
        self.flush().await
    }

    /// AUTH TLS: the handshake, within `limit`. Anything the client sent after AUTH in clear
    /// is dropped unread: it must not count as sent under TLS (command injection).
    async fn start_tls(
        &mut self,
        config: Arc<rustls::ServerConfig>,
        limit: Duration,
    ) -> Result<Binding, String> {
        let Channel::Clear { rd, wr } = std::mem::replace(&mut self.channel, Channel::Closed)
        else {
            return Err("the control connection is not in clear".into());
        };
        let stream = rd.reunite(wr).map_err(|e| e.to_string())?;
        self.lines = LineBuffer::new(MAX_LINE);
        self.queued.clear();
        let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
        let tls = timeout(limit, accept)
            .await
            .map_err(|_| "TLS handshake timed out".to_string())?
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        let binding = Binding::of(tls.get_ref().1).map_err(|e| format!("TLS exporter: {e}"))?;
        let (rd, wr) = tokio::io::split(tls);
        self.channel = Channel::Tls { rd, wr };
        Ok(binding)
    }
}

/// State the I/O side keeps next to the protocol session.
pub(super) struct Io {
    pub(super) config: Arc<Config>,
    pub(super) peer: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) root: Option<Arc<Root>>,
    pub(super) passive: Option<TcpListener>,
    /// MODE E data connections the last transfer left open. The session records which way
    /// they carry data and when they must go (PASV, PORT, MODE); this holds only the sockets.
    pub(super) cached: Option<engine::receive::Kept>,
    /// What an anonymous user gave as password (by custom an e-mail address), which the
    /// xferlog records as the user.
    pub(super) anonymous_id: Option<String>,
    /// After AUTH TLS: what this session's TLS data connections must prove.
    pub(super) binding: Option<Binding>,
    /// After AUTH TLS: this session's TLS, for its data connections.
    pub(super) tls: Option<super::tls::SessionTls>,
    /// The account's quota, if it has one.
    pub(super) quota: Option<super::quota::Quota>,
}

pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    config: Arc<Config>,
    mut shutdown: watch::Receiver<Shutdown>,
) {
    // Clients send ABOR with TCP urgent data; keep that byte in the stream.
    let _ = socket2::SockRef::from(&stream).set_out_of_band_inline(true);
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let (rd, wr) = stream.into_split();
    let mut conn = Conn {
        channel: Channel::Clear { rd, wr },
        lines: LineBuffer::new(MAX_LINE),
        buf: vec![0u8; 4096].into_boxed_slice(),
        queued: VecDeque::new(),
        corked: Vec::new(),
        cork: false,
        peer,
        user: None,
        command: String::new(),
    };
    let mut io = Io {
        config: config.clone(),
        peer,
        local,
        root: None,
        passive: None,
        cached: None,
        anonymous_id: None,
        binding: None,
        tls: None,
        quota: None,
    };
    let mut session = Session::new(
        SessionConfig {
            anonymous: config.anonymous,
            max_login_failures: 3,
            max_streams: config.max_streams,
            tls: config.tls.is_some(),
            private_data_required: config.tls.as_ref().is_some_and(|t| t.data_required),
        },
        peer.ip(),
    );
    let _counted = config.metrics.session();
    tracing::info!(%peer, "connected");
    let connected = Instant::now();
    let ip = canonical_ip(peer.ip());
    let mut place = match config
        .guard
        .enter(config.ranges.of(ip), config.max_startups)
    {
        Ok(place) => Some(place),
        Err(why) => {
            crate::warnings::warn("prelogin-full", ip, format_args!("refused: {why}"));
            let _ = conn.send_unlogged(&Reply::new(421, why)).await;
            return;
        }
    };
    let login_timeout = config
        .guard
        .login_timeout(config.login_timeout, config.max_startups);
    if conn.send(&Session::greeting()).await.is_err() {
        return;
    }
    let login_deadline = Instant::now() + login_timeout;
    loop {
        // Nothing more to answer at once: what was held back goes before the wait.
        if !conn.input_waiting() && conn.flush().await.is_err() {
            break;
        }
        let deadline = if session.user().is_none() {
            login_deadline
        } else {
            Instant::now() + config.idle_timeout
        };
        let input = tokio::select! {
            i = conn.next_input() => i,
            _ = tokio::time::sleep_until(deadline) => {
                let why = if session.user().is_none() { "Login timeout" } else { "Idle timeout" };
                let _ = conn.send(&Reply::new(421, format!("{why}; closing control connection."))).await;
                tracing::info!(%peer, "{why}");
                break;
            }
            () = super::login::pushed_out(place.as_mut()), if place.is_some() => {
                let _ = conn.send_unlogged(&Reply::new(421, super::login::PUSHED_OUT)).await;
                tracing::debug!(%peer, "pushed out by a newer connection before logging in");
                break;
            }
            _ = reached(&mut shutdown, Shutdown::Graceful) => {
                let _ = conn.send(&Reply::new(421, "Server is shutting down; closing control connection.")).await;
                break;
            }
        };
        let line = match input {
            Input::Line(l) => l,
            Input::Closed => break,
            Input::TooLong => {
                let r = Reply::new(
                    500,
                    format!("Command line too long (limit {MAX_LINE} bytes); closing connection."),
                );
                let _ = conn.send(&r).await;
                tracing::warn!(%peer, "overlong command line");
                break;
            }
        };
        let cmd = match Command::parse(&line) {
            Ok(c) => c,
            Err(e) => {
                if conn
                    .send(&Reply::new(e.reply_code(), format!("{e}.")))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
        };
        match &cmd {
            Command::Pass(_) => tracing::debug!(%peer, "< PASS ****"),
            c => tracing::debug!(%peer, "< {}", c.to_line()),
        }
        conn.command = cmd.verb().to_string();
        conn.cork = conn.input_waiting();
        let mut action = session.handle(cmd);
        // Login and passive results may themselves close the session.
        if let Action::Login { user, password } = action {
            let answered = super::login::login(
                &mut conn,
                &mut io,
                &mut session,
                place.as_mut(),
                user,
                password,
            )
            .await;
            let Some(answered) = answered else {
                tracing::info!(%peer, "gone before the login was answered");
                break;
            };
            action = answered;
            if let Some(p) = &place {
                p.checking(false, false);
            }
            // Logged in: the pre-login place goes before the reply says so.
            if session.user().is_some() {
                place = None;
                conn.user = session.user().map(str::to_string);
            }
        }
        let keep_going = match action {
            Action::Reply(r) => {
                let upload = matches!(conn.command.as_str(), "STOR" | "APPE");
                if upload && r.code >= 400 && session.drains_refused_upload() {
                    io.drain_refused_upload().await;
                }
                conn.send(&r).await.is_ok()
            }
            Action::Close(r) => {
                conn.cork = false;
                let _ = conn.send(&r).await;
                false
            }
            Action::Login { .. } => true,
            Action::Passive { extended } => {
                let result = io.open_passive().await;
                let r = session.passive_done(extended, result);
                conn.send(&r).await.is_ok()
            }
            Action::Fs(op) => {
                let result = io.fs(op).await;
                let r = session.fs_done(result);
                conn.send(&r).await.is_ok()
            }
            Action::Transfer(t) => {
                super::supervise::transfer(&mut conn, &mut io, &mut session, t, &mut shutdown).await
            }
            // The client waits for this answer before its handshake.
            Action::StartTls(r) => match (&config.tls, {
                conn.cork = false;
                conn.send(&r).await
            }) {
                (Some(tls), Ok(())) => {
                    let session_tls = tls.session(canonical_ip(peer.ip()));
                    let started = conn
                        .start_tls(session_tls.control.clone(), config.login_timeout)
                        .await
                        .map(|binding| (binding, session_tls));
                    match started {
                        Ok((binding, session_tls)) => {
                            io.binding = Some(binding);
                            io.tls = Some(session_tls);
                            tracing::info!(%peer, "control connection now uses TLS");
                            true
                        }
                        Err(e) => {
                            tracing::warn!(%peer, "{e}");
                            false
                        }
                    }
                }
                _ => false,
            },
        };
        if !keep_going {
            break;
        }
        if !session.keeps_data_connections() {
            io.cached = None;
        }
    }
    let _ = conn.flush().await;
    tracing::info!(
        %peer,
        user = conn.user.as_deref().unwrap_or("-"),
        seconds = (connected.elapsed().as_secs_f64() * 1e3).round() / 1e3,
        "disconnected"
    );
}

impl Io {
    pub(super) fn root(&self) -> Result<Arc<Root>, FsError> {
        self.root.clone().ok_or(FsError::PermissionDenied)
    }

    async fn open_passive(&mut self) -> Result<SocketAddr, String> {
        self.passive = None;
        let ip = self.local.ip();
        // Random ports, so the next one cannot be guessed (RFC 2577), bound with SO_REUSEADDR
        // (tokio's default), which a port whose earlier connections linger in TIME_WAIT
        // accepts. Without a range, from all unprivileged ports as vsftpd does: the kernel's
        // own choice (port 0) searches an ephemeral range that thousands of small transfers
        // fill with TIME_WAIT, and grew slower with every file (10,000 files from lftp: 7 s,
        // then 14 s, then 25 s, then failures).
        let (lo, hi) = self.config.passive_ports.unwrap_or((1024, u16::MAX));
        let mut found = None;
        for _ in 0..64 {
            let port = rand::random_range(lo..=hi);
            if let Ok(l) = TcpListener::bind(SocketAddr::new(ip, port)).await {
                found = Some(l);
                break;
            }
        }
        let listener = match (found, self.config.passive_ports) {
            (Some(l), _) => l,
            (None, None) => TcpListener::bind(SocketAddr::new(ip, 0))
                .await
                .map_err(|e| e.to_string())?,
            (None, Some(_)) => return Err(format!("no free port in {lo}-{hi}")),
        };
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        self.passive = Some(listener);
        // A v4-mapped local address is reported as plain IPv4 for the 227 reply.
        let ip = match (canonical_ip(addr.ip()), self.config.public_address) {
            (IpAddr::V4(_), Some(public)) => IpAddr::V4(public),
            (ip, _) => ip,
        };
        Ok(SocketAddr::new(ip, addr.port()))
    }

    async fn fs(&self, op: FsOp) -> Result<FsOutcome, FsError> {
        let root = self.root()?;
        let sums = self.config.checksums.clone();
        // A tree's file just sent (on connections it left open) was hashed on its way.
        if self.cached.is_some()
            && let Some(known) = super::inline::known_checksum(&root, &sums, &op)
        {
            return Ok(known);
        }
        // So is its MFMT: the file was just written, so opening it and setting its time wait
        // for nothing, and a thread per MFMT made a tree of 10,000 small files take 50 % longer
        // to upload (0.61 s against 0.40 s on loopback).
        if self.cached.is_some() && matches!(op, FsOp::SetMtime(..)) {
            return super::files::fs_blocking(&root, &sums, op);
        }
        let quota = self.quota.clone();
        tokio::task::spawn_blocking(move || {
            // A deleted file gives its bytes back to the account's quota.
            let size = match (&quota, &op) {
                (Some(_), FsOp::Dele(p)) => root.stat(p).ok().map(|e| e.size),
                _ => None,
            };
            let done = super::files::fs_blocking(&root, &sums, op);
            if let (Some(q), Some(size), Ok(_)) = (&quota, size, &done) {
                q.deleted(size);
            }
            done
        })
        .await
        .unwrap_or_else(|e| Err(FsError::Other(e.to_string())))
    }
}

/// Resolves once the server's shutdown has reached `level` (never, if the sender is gone).
pub(super) async fn reached(rx: &mut watch::Receiver<Shutdown>, level: Shutdown) {
    if rx.wait_for(|s| *s >= level).await.is_err() {
        std::future::pending::<()>().await;
    }
}
