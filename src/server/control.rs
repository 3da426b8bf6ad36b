//! One control connection: reads commands, drives the protocol session, does the I/O it asks
//! for, and keeps listening (for ABOR, STAT, QUIT) while a transfer runs.

use super::data::{self, BlockConns, DataError, Finished, Job};
use super::{ChecksumCache, Config, Shutdown};
use crate::engine::transfer::{Accept, Joins};
use crate::engine::{self};
use crate::fsroot::{Root, Upload, UploadStart};
use braid_proto::line::{LineBuffer, LineError};
use braid_proto::listing::{self, EntryKind};
use braid_proto::retr_opts::RetrOpts;
use braid_proto::session::{
    Action, BlockMode, ChecksumAlg, DataEndpoint, Direction, Expected, FsError, FsOp, FsOutcome,
    ListStyle, Perm, Session, SessionConfig, Transfer, TransferKind, TransferOutcome, canonical_ip,
    select_facts,
};
use braid_proto::{Command, MAX_LINE, Reply};
use braid_proto::{checksum, session};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_rustls::server::TlsStream;

/// Commands a client may pipeline behind a running transfer before the server stops reading.
const MAX_QUEUED: usize = 32;

/// The control connection, in clear or, after AUTH TLS, encrypted.
enum Channel {
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

struct Conn {
    channel: Channel,
    lines: LineBuffer,
    buf: Box<[u8]>,
    /// Lines read while a transfer ran, handled after it.
    queued: VecDeque<Vec<u8>>,
}

/// What reading the next command gave.
enum Input {
    Line(Vec<u8>),
    TooLong,
    Closed,
}

impl Conn {
    /// Cancel-safe: bytes are only moved into `lines` once a read completes.
    async fn next_input(&mut self) -> Input {
        if let Some(l) = self.queued.pop_front() {
            return Input::Line(l);
        }
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

    async fn send(&mut self, r: &Reply) -> std::io::Result<()> {
        tracing::debug!("> {r}");
        match &mut self.channel {
            Channel::Clear { wr, .. } => wr.write_all(&r.to_bytes()).await,
            Channel::Tls { wr, .. } => {
                wr.write_all(&r.to_bytes()).await?;
                wr.flush().await
            }
            Channel::Closed => Err(std::io::ErrorKind::NotConnected.into()),
        }
    }

    /// AUTH TLS: the handshake, within `limit`. Anything the client sent after AUTH in clear
    /// is dropped unread: it must not count as sent under TLS (command injection).
    async fn start_tls(
        &mut self,
        config: Arc<rustls::ServerConfig>,
        limit: Duration,
    ) -> Result<(), String> {
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
        let (rd, wr) = tokio::io::split(tls);
        self.channel = Channel::Tls { rd, wr };
        Ok(())
    }
}

/// State the I/O side keeps next to the protocol session.
struct Io {
    config: Arc<Config>,
    peer: SocketAddr,
    local: SocketAddr,
    root: Option<Arc<Root>>,
    passive: Option<TcpListener>,
    /// MODE E data connections the last transfer left open, and which way they carry data.
    cached: Option<(Direction, engine::receive::Kept)>,
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
    };
    let mut io = Io {
        config: config.clone(),
        peer,
        local,
        root: None,
        passive: None,
        cached: None,
    };
    let mut session = Session::new(
        SessionConfig {
            anonymous: config.anonymous,
            max_login_failures: 3,
            max_streams: config.max_streams,
            tls: config.tls.is_some(),
        },
        peer.ip(),
    );
    tracing::info!(%peer, "connected");
    if conn.send(&Session::greeting()).await.is_err() {
        return;
    }
    let login_deadline = Instant::now() + config.login_timeout;
    loop {
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
        let mut action = session.handle(cmd);
        // Login and passive results may themselves close the session.
        if let Action::Login { user, password } = action {
            action = login(&mut io, &mut session, user, password).await;
        }
        let keep_going = match action {
            Action::Reply(r) => conn.send(&r).await.is_ok(),
            Action::Close(r) => {
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
                transfer(&mut conn, &mut io, &mut session, t, &mut shutdown).await
            }
            Action::StartTls(r) => match (&config.tls, conn.send(&r).await) {
                (Some(tls), Ok(())) => {
                    match conn.start_tls(tls.clone(), config.login_timeout).await {
                        Ok(()) => {
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
    tracing::info!(%peer, "disconnected");
}

async fn login(io: &mut Io, session: &mut Session, user: String, password: String) -> Action {
    let config = io.config.clone();
    let anonymous = braid_proto::session::ANONYMOUS_NAMES
        .iter()
        .any(|a| a.eq_ignore_ascii_case(&user));
    let name = user.clone();
    let checked = tokio::task::spawn_blocking(move || -> Option<(Perm, std::path::PathBuf)> {
        if anonymous {
            return config.anonymous.map(|p| (p, config.root.clone()));
        }
        config
            .users
            .verify(&name, &password)
            .map(|a| (a.perm, a.root.clone()))
    })
    .await
    .ok()
    .flatten();
    let granted = match checked {
        Some((perm, root_path)) => match Root::open(&root_path) {
            Ok(root) => {
                io.root = Some(Arc::new(root));
                tracing::info!(peer = %io.peer, user, "logged in");
                Some(perm)
            }
            Err(e) => {
                tracing::error!(user, "root directory {} unusable: {e}", root_path.display());
                None
            }
        },
        None => {
            tracing::warn!(peer = %io.peer, user, "failed login");
            tokio::time::sleep(io.config.login_fail_delay).await;
            None
        }
    };
    session.login_done(granted)
}

impl Io {
    fn root(&self) -> Result<Arc<Root>, FsError> {
        self.root.clone().ok_or(FsError::PermissionDenied)
    }

    async fn open_passive(&mut self) -> Result<SocketAddr, String> {
        self.passive = None;
        let ip = self.local.ip();
        let listener = match self.config.passive_ports {
            None => TcpListener::bind(SocketAddr::new(ip, 0))
                .await
                .map_err(|e| e.to_string())?,
            Some((lo, hi)) => {
                // Random ports from the range, so the next one cannot be guessed (RFC 2577).
                let mut found = None;
                for _ in 0..64 {
                    let port = rand::random_range(lo..=hi);
                    if let Ok(l) = TcpListener::bind(SocketAddr::new(ip, port)).await {
                        found = Some(l);
                        break;
                    }
                }
                found.ok_or_else(|| format!("no free port in {lo}-{hi}"))?
            }
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
        tokio::task::spawn_blocking(move || fs_blocking(&root, &sums, op))
            .await
            .unwrap_or_else(|e| Err(FsError::Other(e.to_string())))
    }

    /// The one data connection of a stream-mode transfer, as a blocking socket.
    async fn stream_connection(
        &mut self,
        endpoint: &DataEndpoint,
    ) -> Result<std::net::TcpStream, String> {
        let deadline = Instant::now() + self.config.data_timeout;
        let sock = match endpoint {
            DataEndpoint::Passive(_) => {
                let listener = self.passive.take().ok_or("no passive listener")?;
                accept_from(&listener, canonical_ip(self.peer.ip()), deadline).await?
            }
            DataEndpoint::Active(addr) => connect_to(*addr, self.local.ip(), deadline).await?,
            DataEndpoint::ActivePorts(addrs) => {
                let addr = addrs.first().ok_or("MPRT gave no ports")?;
                connect_to(*addr, self.local.ip(), deadline).await?
            }
            DataEndpoint::Cached => return Err("stream mode keeps no data connections".into()),
        };
        self.blocking(sock, None)
    }

    /// The data connections of a MODE E transfer. The sender opens them (GFD.20), except that a
    /// passive braid server also sends over connections the client opens.
    async fn block_connections(
        &mut self,
        t: &Transfer,
        b: &BlockMode,
        progress: &Arc<AtomicU64>,
    ) -> Result<BlockConns, String> {
        let deadline = Instant::now() + self.config.data_timeout;
        let cached = match t.endpoint {
            DataEndpoint::Cached => match self.cached.take() {
                Some((direction, kept)) if direction == t.direction() => Some(kept),
                _ => return Err("no open data connections to reuse".into()),
            },
            _ => None,
        };
        if t.direction() == Direction::FromClient {
            let (open, listener) = match cached {
                Some(kept) => (kept.socks, kept.listener),
                None => {
                    let listener = self.passive.take().ok_or("no passive listener")?;
                    let listener = listener.into_std().map_err(|e| e.to_string())?;
                    if let Some(bytes) = t.buffer {
                        let _ = socket2::SockRef::from(&listener)
                            .set_recv_buffer_size(usize::try_from(bytes).unwrap_or(usize::MAX));
                    }
                    (Vec::new(), Some(listener))
                }
            };
            let accept = listener.map(|listener| self.accept(listener, t.buffer));
            let conns = Joins {
                reused: !open.is_empty(),
                open,
                accept,
                incoming: None,
                stall: self.config.data_timeout,
            };
            return Ok(BlockConns::Receive(
                conns,
                data::upload_state(&b.have, progress.clone()),
            ));
        }
        if let Some(kept) = cached {
            let mut joins = Joins::fixed(kept.socks, self.config.data_timeout);
            joins.reused = true;
            return Ok(BlockConns::Send(joins));
        }
        let n = b.parallelism.max(1) as usize;
        let want = canonical_ip(self.peer.ip());
        let socks = match &t.endpoint {
            // Elastic: start on the first connection and take the others as they come, for as
            // long as there are blocks to send.
            DataEndpoint::Passive(_) if b.elastic => {
                let listener = self.passive.take().ok_or("no passive listener")?;
                let first = accept_from(&listener, want, deadline).await?;
                let first = self.blocking(first, t.buffer)?;
                let listener = listener.into_std().map_err(|e| e.to_string())?;
                let mut joins =
                    Joins::accept(self.accept(listener, t.buffer), self.config.data_timeout);
                joins.open.push(first);
                return Ok(BlockConns::Send(joins));
            }
            DataEndpoint::Passive(_) => {
                let listener = self.passive.take().ok_or("no passive listener")?;
                let mut socks = Vec::with_capacity(n);
                for _ in 0..n {
                    socks.push(accept_from(&listener, want, deadline).await?);
                }
                socks
            }
            DataEndpoint::Active(addr) => {
                connect_all(vec![*addr; n], self.local.ip(), deadline).await?
            }
            DataEndpoint::ActivePorts(addrs) => {
                connect_all(addrs.clone(), self.local.ip(), deadline).await?
            }
            DataEndpoint::Cached => return Err("no open data connections to reuse".into()),
        };
        let socks = socks
            .into_iter()
            .map(|s| self.blocking(s, t.buffer))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BlockConns::Send(Joins::fixed(
            socks,
            self.config.data_timeout,
        )))
    }

    /// Where the client opens (more) data connections of a MODE E transfer.
    fn accept(&self, listener: std::net::TcpListener, buffer: Option<u64>) -> Accept {
        Accept {
            listener,
            peer: canonical_ip(self.peer.ip()),
            max: self.config.max_streams as usize,
            buffer,
            timeout: Some(self.config.data_timeout),
        }
    }

    /// A blocking socket for a data thread, with the idle timeout as its read/write limit.
    fn blocking(
        &self,
        sock: TcpStream,
        buffer: Option<u64>,
    ) -> Result<std::net::TcpStream, String> {
        let s = sock.into_std().map_err(|e| e.to_string())?;
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(self.config.idle_timeout))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(self.config.idle_timeout))
            .map_err(|e| e.to_string())?;
        engine::set_buffer(&s, buffer);
        Ok(s)
    }
}

/// Accepts one data connection from the client's address; strangers are dropped (port
/// stealing, RFC 2577) and the wait goes on.
async fn accept_from(
    listener: &TcpListener,
    want: IpAddr,
    deadline: Instant,
) -> Result<TcpStream, String> {
    loop {
        let (s, from) = timeout_at(deadline, listener.accept())
            .await
            .map_err(|_| "no connection arrived in time".to_string())?
            .map_err(|e| e.to_string())?;
        if canonical_ip(from.ip()) == want {
            return Ok(s);
        }
        tracing::warn!(%from, "refused data connection from a host other than the client");
    }
}

/// Opens a data connection to the client, from the control connection's local address as
/// clients expect.
async fn connect_to(
    addr: SocketAddr,
    local: IpAddr,
    deadline: Instant,
) -> Result<TcpStream, String> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| e.to_string())?;
    let _ = socket.bind(SocketAddr::new(local, 0));
    timeout_at(deadline, socket.connect(addr))
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// Opens all connections at once: over a long path, one after another would cost a round trip
/// each.
async fn connect_all(
    addrs: Vec<SocketAddr>,
    local: IpAddr,
    deadline: Instant,
) -> Result<Vec<TcpStream>, String> {
    let mut set = tokio::task::JoinSet::new();
    for (i, addr) in addrs.into_iter().enumerate() {
        set.spawn(async move { (i, connect_to(addr, local, deadline).await) });
    }
    let mut socks = Vec::new();
    while let Some(r) = set.join_next().await {
        let (i, s) = r.map_err(|e| e.to_string())?;
        socks.push((i, s?));
    }
    socks.sort_by_key(|(i, _)| *i);
    Ok(socks.into_iter().map(|(_, s)| s).collect())
}

fn fs_blocking(root: &Root, sums: &ChecksumCache, op: FsOp) -> Result<FsOutcome, FsError> {
    Ok(match op {
        FsOp::ChangeDir(p) => {
            root.is_dir(&p)?;
            FsOutcome::Done
        }
        FsOp::Size { path, ascii: false } => FsOutcome::Size(root.size(&path)?),
        FsOp::Size { path, ascii: true } => FsOutcome::Size(ascii_size(root, &path)?),
        FsOp::Mdtm(p) => {
            let e = root.stat(&p)?;
            if e.kind != EntryKind::File {
                return Err(FsError::NotAFile);
            }
            FsOutcome::Mtime(e.mtime)
        }
        FsOp::Mkd(p) => {
            root.mkdir(&p)?;
            FsOutcome::Done
        }
        FsOp::Rmd(p) => {
            root.rmdir(&p)?;
            FsOutcome::Done
        }
        FsOp::Dele(p) => {
            root.delete(&p)?;
            FsOutcome::Done
        }
        FsOp::RenameFrom(p) => {
            root.exists_nofollow(&p)?;
            FsOutcome::Done
        }
        FsOp::Rename { from, to } => {
            root.rename(&from, &to)?;
            FsOutcome::Done
        }
        FsOp::Mlst(p) => FsOutcome::Entry(root.stat(&p)?),
        FsOp::Checksum {
            path,
            alg,
            offset,
            length,
        } => {
            let (file, entry) = root.open_read(&path)?;
            let end = match length {
                None => entry.size,
                Some(l) => offset.saturating_add(l),
            };
            if offset > entry.size || end > entry.size {
                return Err(FsError::Other(format!(
                    "range {offset}+{} is past the end of the {}-byte file",
                    end - offset.min(end),
                    entry.size
                )));
            }
            let io = |e: std::io::Error| crate::fsroot::io_to_fs(&e);
            FsOutcome::Checksum(match alg {
                ChecksumAlg::Xxh3 => checksum::hex(sums.xxh3(&file, entry.size).map_err(io)?),
                ChecksumAlg::Md5 => crate::sums::md5(&file, offset, end).map_err(io)?,
                ChecksumAlg::Adler32 => crate::sums::adler32(&file, offset, end).map_err(io)?,
            })
        }
        FsOp::StatList(p) => {
            let now = unix_now();
            let lines = match root.stat(&p)? {
                e if e.kind == EntryKind::Dir => root
                    .list(&p)?
                    .iter()
                    .map(|e| listing::list_line(e, now))
                    .collect(),
                e => vec![listing::list_line(&e, now)],
            };
            FsOutcome::Lines(lines)
        }
    })
}

/// SIZE in TYPE A counts the CRs that conversion adds, which means reading the file; refuse
/// for large files rather than stall the session.
fn ascii_size(root: &Root, p: &braid_proto::VPath) -> Result<u64, FsError> {
    const LIMIT: u64 = 64 << 20;
    let (mut file, entry) = root.open_read(p)?;
    if entry.size > LIMIT {
        return Err(FsError::Other(format!(
            "SIZE in ASCII mode is only offered for files up to {} MiB; use TYPE I",
            LIMIT >> 20
        )));
    }
    let mut buf = vec![0u8; 1 << 16];
    let mut last_cr = false;
    let mut total = 0;
    loop {
        let n =
            std::io::Read::read(&mut file, &mut buf).map_err(|e| crate::fsroot::io_to_fs(&e))?;
        if n == 0 {
            return Ok(total);
        }
        total += braid_proto::ascii::wire_len(&buf[..n], &mut last_cr);
    }
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Opens the local side of a transfer, before anything is promised to the client.
fn prepare(root: &Root, t: &Transfer) -> Result<(Job, Option<u64>), FsError> {
    Ok(match &t.kind {
        TransferKind::Retr(p) => {
            let (file, entry) = root.open_read(p)?;
            if t.offset > entry.size {
                return Err(FsError::BadRestart {
                    offset: t.offset,
                    size: entry.size,
                });
            }
            (
                Job::Retr {
                    file,
                    offset: t.offset,
                    ascii: t.ascii,
                },
                Some(entry.size - t.offset),
            )
        }
        TransferKind::Stor(p) | TransferKind::Appe(p) => {
            let have = t.block.as_ref().map(|b| &b.have).filter(|h| !h.is_empty());
            let start = match (&t.kind, have) {
                (TransferKind::Appe(_), _) => UploadStart::Append,
                (_, Some(_)) => UploadStart::Keep,
                _ => UploadStart::At(t.offset),
            };
            let (upload, file, offset) = Upload::begin(root, p, start).map_err(|e| match e {
                FsError::NotFound if have.is_some() => FsError::NothingToResume,
                e => e,
            })?;
            // REST ranges claim data the partial must hold.
            if let Some(end) = have.and_then(|h| h.iter().last()).map(|(_, end)| end) {
                let size = file
                    .metadata()
                    .map_err(|e| crate::fsroot::io_to_fs(&e))?
                    .len();
                if size < end {
                    return Err(FsError::BadRestart { offset: end, size });
                }
            }
            (
                Job::Stor {
                    upload,
                    file,
                    offset,
                    ascii: t.ascii,
                },
                None,
            )
        }
        TransferKind::List(p, style) => {
            let now = unix_now();
            let dir = root.stat(p)?;
            let mut text = String::new();
            let entries = if dir.kind == EntryKind::Dir {
                root.list(p)?
            } else {
                vec![dir.clone()]
            };
            if *style == ListStyle::Machine {
                if dir.kind != EntryKind::Dir {
                    return Err(FsError::NotADirectory);
                }
                let mut cdir = dir.clone();
                cdir.name = ".".into();
                let facts = listing::mlsx_facts(&cdir, Some("cdir"), t.writable);
                text.push_str(&format!("{} .\r\n", select_facts(&facts, &t.facts)));
            }
            for e in &entries {
                let line = match style {
                    ListStyle::Long => listing::list_line(e, now),
                    ListStyle::Names => e.name.clone(),
                    ListStyle::Machine => {
                        let facts = listing::mlsx_facts(e, None, t.writable);
                        format!("{} {}", select_facts(&facts, &t.facts), e.name)
                    }
                };
                text.push_str(&line);
                text.push_str("\r\n");
            }
            (
                Job::List {
                    text: text.into_bytes(),
                },
                None,
            )
        }
    })
}

/// Runs one transfer while still answering the control connection. Returns whether the
/// session goes on.
async fn transfer(
    conn: &mut Conn,
    io: &mut Io,
    session: &mut Session,
    t: Transfer,
    shutdown: &mut watch::Receiver<Shutdown>,
) -> bool {
    let root = match io.root() {
        Ok(r) => r,
        Err(e) => return conn.send(&e.reply(t.path())).await.is_ok(),
    };
    let prepared = {
        let t = t.clone();
        let root = root.clone();
        tokio::task::spawn_blocking(move || prepare(&root, &t))
            .await
            .unwrap_or_else(|e| Err(FsError::Other(e.to_string())))
    };
    let (job, size) = match prepared {
        Ok(x) => x,
        Err(e) => {
            io.passive = None;
            return conn.send(&e.reply(t.path())).await.is_ok();
        }
    };
    if conn.send(&t.opening(size)).await.is_err() {
        return false;
    }
    let started = std::time::Instant::now();
    let progress = Arc::new(AtomicU64::new(0));
    let elastic = t.block.as_ref().is_some_and(|b| b.elastic);
    let moving = Arc::new(engine::transfer::Transfer::new(elastic));
    if let Some(rate) = t.block.as_ref().and_then(|b| b.max_rate) {
        moving.set_pacing(Some(rate));
    }
    // A MODE E upload's receiving state, for the 111 Range Markers.
    let mut received = None;
    let connected = match &t.block {
        None => io.stream_connection(&t.endpoint).await.map(|sock| {
            moving.abort().register(&sock);
            let progress = progress.clone();
            let tls = io.config.tls.clone().filter(|_| t.private);
            tokio::task::spawn_blocking(move || data::run(job, sock, tls, progress))
        }),
        Some(b) => io.block_connections(&t, b, &progress).await.map(|conns| {
            if let BlockConns::Receive(_, state) = &conns {
                received = Some(state.clone());
            }
            let (progress, moving) = (progress.clone(), moving.clone());
            let have = b.have.clone();
            let block = b.block_size.unwrap_or(engine::DEFAULT_BLOCK);
            tokio::task::spawn_blocking(move || {
                data::run_blocks(job, conns, &have, block, progress, &moving)
            })
        }),
    };
    let mut worker = match connected {
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
    let is_upload = matches!(t.kind, TransferKind::Stor(_) | TransferKind::Appe(_));
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
    let mut markers = tokio::time::interval(MARKER_CHECK);
    let (mut marker_at, mut marker_bytes) = (Instant::now(), 0);
    let result = loop {
        tokio::select! {
            r = &mut worker => break r,
            _ = markers.tick(), if received.is_some() => {
                let bytes = progress.load(Ordering::Relaxed);
                if let Some(state) = &received
                    && (marker_at.elapsed() >= MARKER_INTERVAL || bytes - marker_bytes >= MARKER_BYTES)
                {
                    send_markers(conn, &progress, state).await;
                    (marker_at, marker_bytes) = (Instant::now(), bytes);
                }
            }
            input = conn.next_input(), if !client_gone && conn.queued.len() < MAX_QUEUED => match input {
                Input::Line(l) => match Command::parse(&l) {
                    Ok(Command::Abor) => kill(&aborted),
                    Ok(Command::Stat(None)) => {
                        let r = Reply::new(213, format!("Status: {} bytes transferred so far.", progress.load(Ordering::Relaxed)));
                        let _ = conn.send(&r).await;
                    }
                    Ok(Command::Scks { value: Some(v), .. }) if is_upload => {
                        announced = Some(v);
                        let _ = conn.send(&Reply::new(200, "SCKS Command Successful.")).await;
                    }
                    Ok(Command::Quit) => quit = true,
                    // A braid client changing the cap on a running download (MaxRate only:
                    // the other options apply to the next transfer).
                    Ok(Command::Opts(o)) if elastic && !is_upload && o.to_ascii_uppercase().starts_with("RETR ") => {
                        let r = match RetrOpts::parse(&o[5..]) {
                            Ok(RetrOpts { max_rate: Some(rate), .. }) => {
                                moving.set_pacing((rate > 0).then_some(rate));
                                Reply::new(200, "OPTS Command Successful.")
                            }
                            Ok(_) => Reply::new(501, "Only MaxRate can change while a transfer runs."),
                            Err(e) => Reply::new(501, format!("OPTS RETR: {e}.")),
                        };
                        let _ = conn.send(&r).await;
                    }
                    _ => conn.queued.push_back(l),
                },
                // The client vanished. A download stops now; an upload keeps reading what is
                // already in flight (bounded by the socket timeout) but is never committed.
                Input::Closed | Input::TooLong => {
                    client_gone = true;
                    if !is_upload {
                        kill(&aborted);
                    }
                }
            },
            _ = reached(shutdown, Shutdown::Abort), if !stopped_by_shutdown => {
                stopped_by_shutdown = true;
                kill(&shut);
            }
        }
    };
    let outcome = match result {
        _ if aborted.load(Ordering::SeqCst) => TransferOutcome::Aborted,
        _ if shut.load(Ordering::SeqCst) => TransferOutcome::Shutdown,
        Err(e) => TransferOutcome::Local(FsError::Other(format!("transfer thread failed: {e}"))),
        Ok(Err(DataError::Net(e))) => TransferOutcome::ConnectionLost(e.to_string()),
        Ok(Err(DataError::Local(e))) => TransferOutcome::Local(e),
        Ok(Ok(Finished {
            bytes,
            upload,
            received,
            kept,
        })) => match upload {
            None => complete(io, &t, bytes, kept),
            Some(_) if client_gone => {
                TransferOutcome::ConnectionLost("client closed the control connection".into())
            }
            Some((upload, file)) => {
                let verdict = match (&t.block, received) {
                    // MODE E ends with an explicit EOF, so the data is known to be whole; what
                    // remains is the checksum the client announced, if any.
                    (Some(b), Some((_, actual))) => {
                        verify_upload(conn, io, b.expect.as_ref(), announced, actual).await
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
                    _ => Ok(()),
                };
                match verdict {
                    Err(outcome) => outcome,
                    Ok(()) => {
                        match tokio::task::spawn_blocking(move || upload.commit(file)).await {
                            Ok(Ok(())) => complete(io, &t, bytes, kept),
                            Ok(Err(e)) => TransferOutcome::Local(e),
                            Err(e) => TransferOutcome::Local(FsError::Other(e.to_string())),
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
        mode = if t.block.is_some() { "E" } else { "S" },
        // Data connections this transfer used, and whether the last transfer left them open.
        data_connections = if t.block.is_some() { moving.links().len() } else { 1 },
        reused = t.endpoint == DataEndpoint::Cached,
        bytes,
        seconds = format!("{secs:.3}"),
        mbps = format!("{:.1}", bytes as f64 / secs.max(1e-9) / 1e6),
        outcome = ?outcome,
        "transfer"
    );
    if client_gone {
        return false;
    }
    // Whatever the outcome, the client learns what is stored: after ABOR or a lost data
    // connection, that is what a resumed upload need not send again.
    if let Some(state) = &received {
        send_markers(conn, &progress, state).await;
    }
    for r in session.transfer_done(&t, outcome) {
        if conn.send(&r).await.is_err() {
            return false;
        }
    }
    if quit {
        let _ = conn.send(&Reply::new(221, "Goodbye.")).await;
        return false;
    }
    true
}

/// A finished transfer; what it leaves open waits for the next transfer the same way.
fn complete(io: &mut Io, t: &Transfer, bytes: u64, kept: engine::receive::Kept) -> TransferOutcome {
    let reusable = !kept.socks.is_empty();
    io.cached = reusable.then(|| (t.direction(), kept));
    TransferOutcome::Complete {
        bytes,
        kept: reusable,
    }
}

/// How often a MODE E upload reports progress and stored ranges: every 5 s (the Globus server's
/// default), and sooner once 32 MiB more have arrived, so that a client cut off resends little.
const MARKER_INTERVAL: Duration = Duration::from_secs(5);
const MARKER_BYTES: u64 = 32 << 20;
const MARKER_CHECK: Duration = Duration::from_millis(100);

/// `112-Perf Marker` and `111 Range Marker` for a MODE E upload: GridFTP clients show progress
/// from the first and restart from the second.
async fn send_markers(conn: &mut Conn, progress: &AtomicU64, state: &engine::receive::Shared) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let _ = conn
        .send(&session::perf_marker(now, progress.load(Ordering::Relaxed)))
        .await;
    let ranges = state.snapshot().ranges;
    if !ranges.is_empty() {
        let _ = conn.send(&session::range_marker(&ranges)).await;
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
        let input = timeout_at(deadline, conn.next_input()).await.ok()?;
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

/// Whether the client closed the control connection (within a moment of the data ending).
/// A command that arrives meanwhile is kept for later.
async fn control_closed(conn: &mut Conn) -> bool {
    match timeout(Duration::from_millis(30), conn.next_input()).await {
        Ok(Input::Line(l)) => {
            conn.queued.push_front(l);
            false
        }
        Ok(Input::Closed | Input::TooLong) => true,
        Err(_) => false,
    }
}

/// Resolves once the server's shutdown has reached `level` (never, if the sender is gone).
async fn reached(rx: &mut watch::Receiver<Shutdown>, level: Shutdown) {
    if rx.wait_for(|s| *s >= level).await.is_err() {
        std::future::pending::<()>().await;
    }
}
