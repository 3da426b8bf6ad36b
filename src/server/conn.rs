//! The control connection as bytes: commands read a line at a time (in clear or through TLS,
//! with pipelined ones queued), replies written, corked while the client pipelines.

use crate::engine::tls::Binding;
use braid_proto::line::{LineBuffer, LineError};
use braid_proto::{MAX_LINE, Reply};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::timeout;

/// One direction of a control connection that is not a plain TCP one (TLS, a pipe).
pub(super) type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Commands a client may pipeline behind a running transfer before the server stops reading.
pub(super) const MAX_QUEUED: usize = 32;

/// The control connection, in clear or, after AUTH TLS, encrypted.
pub(super) enum Channel {
    Clear {
        rd: OwnedReadHalf,
        wr: OwnedWriteHalf,
    },
    /// After AUTH TLS, over TCP or a pipe.
    Tls { rd: Reader, wr: Writer },
    /// A one-shot session's standard input and output (`braid serve --stdio`, started over
    /// ssh, which authenticates and encrypts the channel); after AUTH TLS it is `Tls`, whose
    /// binding the data connections' TLS proves.
    Pipe { rd: Reader, wr: Writer },
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
    /// After a GSI login: every command comes wrapped, every reply goes wrapped.
    pub(super) gsi: Option<Box<super::gsi::Wrapper>>,
}

/// What reading the next command gave.
pub(super) enum Input {
    Line(Vec<u8>),
    TooLong,
    Closed,
}

impl Conn {
    /// A new control connection, in clear.
    pub(super) fn new(stream: TcpStream, peer: SocketAddr) -> Conn {
        let (rd, wr) = stream.into_split();
        Conn::over(Channel::Clear { rd, wr }, peer)
    }

    /// A session over a pipe's two ends, for a client at `peer` (as ssh reports it).
    pub(super) fn piped(rd: Reader, wr: Writer, peer: SocketAddr) -> Conn {
        Conn::over(Channel::Pipe { rd, wr }, peer)
    }

    fn over(channel: Channel, peer: SocketAddr) -> Conn {
        Conn {
            channel,
            lines: LineBuffer::new(MAX_LINE),
            buf: vec![0u8; 4096].into_boxed_slice(),
            queued: VecDeque::new(),
            corked: Vec::new(),
            cork: false,
            peer,
            user: None,
            command: String::new(),
            gsi: None,
        }
    }

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
            Channel::Tls { wr, .. } | Channel::Pipe { wr, .. } => match wr.write_all(&out).await {
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
                Ok(Some(l)) if self.gsi.is_some() => match self.unwrapped(&l).await {
                    Some(input) => return input,
                    None => continue,
                },
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
                Channel::Tls { rd, .. } | Channel::Pipe { rd, .. } => rd.read(&mut self.buf).await,
                Channel::Closed => return Input::Closed,
            };
            match read {
                Ok(0) | Err(_) => return Input::Closed,
                Ok(n) => self.lines.extend(&self.buf[..n]),
            }
        }
    }

    /// Lines up to `max` bytes from now on (what was read and not yet a line is kept).
    pub(super) fn widen_lines(&mut self, max: usize) {
        let pending = self.lines.take_pending();
        self.lines = LineBuffer::new(max);
        self.lines.extend(&pending);
    }

    /// From now on commands come wrapped and replies go wrapped. A wrapped line is base64 of
    /// a TLS record: room for a command of the usual limit, which is checked once unwrapped.
    pub(super) fn start_gsi(&mut self, lines: super::gsi::Wrapper) {
        self.widen_lines(MAX_LINE * 2);
        self.gsi = Some(Box::new(lines));
    }

    /// Under GSI, the command a line carries; None for a line that was not protected, which
    /// is refused (533) as Globus does: anyone on the path could have put it there.
    async fn unwrapped(&mut self, line: &[u8]) -> Option<Input> {
        let unwrapped = self.gsi.as_mut()?.unwrap(line);
        match unwrapped {
            Some(Ok(plain)) if plain.len() > MAX_LINE => Some(Input::TooLong),
            Some(Ok(plain)) => Some(Input::Line(plain)),
            Some(Err(e)) => {
                tracing::warn!(peer = %self.peer, "a protected command: {e}");
                Some(Input::Closed)
            }
            None => {
                let refusal = Reply::new(
                    533,
                    "Commands must be protected (ENC or MIC) after AUTH GSSAPI.",
                );
                match self.send(&refusal).await {
                    Ok(()) => None,
                    Err(_) => Some(Input::Closed),
                }
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
        match &mut self.gsi {
            Some(gsi) => {
                let mut plain = Vec::new();
                r.encode(&mut plain);
                let wrapped = gsi.wrap(&plain).map_err(std::io::Error::other)?;
                self.corked.extend_from_slice(&wrapped);
            }
            None => r.encode(&mut self.corked),
        }
        if self.cork {
            return Ok(());
        }
        self.flush().await
    }

    /// AUTH TLS: the handshake, within `limit`. Anything the client sent after AUTH in clear
    /// over TCP is dropped unread: it must not count as sent under TLS (command injection).
    /// Inside ssh's channel (a one-shot session) no one can slip bytes in: what braid cp sent
    /// behind AUTH (its ClientHello, without waiting for the 234) goes to TLS, which reads it
    /// as the handshake's first bytes.
    pub(super) async fn start_tls(
        &mut self,
        tls: &super::tls::SessionTls,
        limit: Duration,
    ) -> Result<Binding, String> {
        if !matches!(self.channel, Channel::Clear { .. } | Channel::Pipe { .. }) {
            return Err("the control connection is not in clear".into());
        }
        let channel = std::mem::replace(&mut self.channel, Channel::Closed);
        let ahead = std::io::Cursor::new(self.lines.take_pending());
        self.queued.clear();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.control.clone());
        let tickets = tls.ticket_mark();
        let (channel, binding) = match channel {
            Channel::Clear { rd, wr } => {
                let stream = rd.reunite(wr).map_err(|e| e.to_string())?;
                accept(acceptor, stream, tickets, limit).await?
            }
            Channel::Pipe { rd, wr } => {
                let rd = ahead.chain(rd);
                accept(acceptor, tokio::io::join(rd, wr), tickets, limit).await?
            }
            _ => return Err("the control connection is not in clear".into()),
        };
        self.channel = channel;
        Ok(binding)
    }
}

/// The server's side of a TLS handshake on `stream`, within `limit`: the control channel it
/// becomes, and the session's binding for the data connections. Its tickets carry `tickets`.
async fn accept<S>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: S,
    tickets: crate::engine::tls::TicketMark,
    limit: Duration,
) -> Result<(Channel, Binding), String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mark = |c: &mut rustls::ServerConnection| c.set_resumption_data(&tickets);
    let tls = timeout(limit, acceptor.accept_with(stream, mark))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let binding = Binding::of(tls.get_ref().1).map_err(|e| format!("TLS exporter: {e}"))?;
    let (rd, wr) = tokio::io::split(tls);
    Ok((
        Channel::Tls {
            rd: Box::new(rd),
            wr: Box::new(wr),
        },
        binding,
    ))
}
