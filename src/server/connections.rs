//! Opening data connections: the one of a stream-mode transfer, and the set of a MODE E one
//! (accepted, connected concurrently, or cached from the last transfer).

use super::data::{self, BlockConns};
use super::io::Io;

use crate::engine;
use crate::engine::tls::{Binding, DataConn, DataTls};
use crate::engine::transfer::{Accept, Admits, Joins};
use braid_proto::session::{
    BlockMode, DataEndpoint, Direction, ThirdParty, Transfer, canonical_ip,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::{Instant, timeout_at};

impl Io {
    /// Reads and drops the data of an upload refused before it started, which an eager
    /// client sent on the open connections without waiting for the answer: up to the EOD on
    /// each, so the connections stay in step for the next file. Connections that fail it are
    /// closed (the next transfer that wants them is refused, and the client starts afresh).
    pub(super) async fn drain_refused_upload(&mut self) {
        let Some(kept) = self.cached.take() else {
            return;
        };
        let stall = self.config.idle_timeout;
        let listener = kept.listener;
        let socks = kept.socks;
        let drained = tokio::task::spawn_blocking(move || {
            let transfer = engine::transfer::Transfer::new(true);
            let bytes = Arc::new(AtomicU64::new(0));
            let shared = engine::receive::Shared::new(
                engine::receive::Progress::holding(Default::default()),
                bytes,
            );
            let joins = Joins::cached(socks, stall);
            let sink = engine::sink::Sink::Discard;
            engine::receive::receive(&transfer, joins, &sink, None, &shared)
        })
        .await;
        match drained {
            Ok(Ok(kept)) => {
                self.cached = Some(engine::receive::Kept {
                    socks: kept.socks,
                    listener,
                })
            }
            Ok(Err(e)) => {
                tracing::info!(peer = %self.peer, "dropping a refused upload's data: {e}")
            }
            Err(e) => tracing::warn!(peer = %self.peer, "dropping a refused upload's data: {e}"),
        }
    }

    /// The one data connection of a stream-mode transfer, as a blocking socket. Under DCAU A
    /// it has run GSI's handshake; a connection that fails it, on a passive port, is a
    /// stranger's: refused, and the next one waited for.
    pub(super) async fn stream_connection(
        &mut self,
        t: &Transfer,
    ) -> Result<std::net::TcpStream, String> {
        let deadline = Instant::now() + self.config.data_timeout;
        let gsi = self.data_tls(t).filter(|_| t.gsi);
        let sock = match &t.endpoint {
            DataEndpoint::Passive(_) => {
                let listener = self.passive.take().ok_or("no passive listener")?;
                let admits = Admits {
                    anyone: self.gsi_third_party(t),
                    ..self.admits_client()
                };
                loop {
                    let sock = accept_from(&listener, admits, deadline).await?;
                    let sock = self.blocking(sock, None)?;
                    let Some(gsi) = &gsi else {
                        return Ok(sock);
                    };
                    let from = sock.peer_addr().ok();
                    match secured(gsi, sock).await {
                        Ok(sock) => return Ok(sock),
                        Err(e) => engine::tls::refused(gsi, e, from, false, |_| {}),
                    }
                }
            }
            DataEndpoint::Active(addr) => connect_to(*addr, self.local.ip(), deadline).await?,
            DataEndpoint::ActivePorts(addrs) => {
                let addr = addrs.first().ok_or("MPRT gave no ports")?;
                connect_to(*addr, self.local.ip(), deadline).await?
            }
            DataEndpoint::Cached => return Err("stream mode keeps no data connections".into()),
            DataEndpoint::Striped(_) => return Err("striped data moves in MODE E only".into()),
        };
        let sock = self.blocking(sock, None)?;
        match &gsi {
            Some(gsi) => secured(gsi, sock)
                .await
                .map_err(|e| format!("GSI data channel authentication (DCAU A) failed: {e}")),
            None => Ok(sock),
        }
    }

    /// The data connections of a MODE E transfer. The sender opens them (GFD.20), except that a
    /// passive braid server also sends over connections the client opens.
    pub(super) async fn block_connections(
        &mut self,
        t: &Transfer,
        b: &BlockMode,
        progress: &Arc<AtomicU64>,
    ) -> Result<BlockConns, String> {
        let deadline = Instant::now() + self.config.data_timeout;
        // The session asks for cached connections only when the last transfer went the same
        // way and left them open; which way is the session's to know, the sockets are ours.
        let cached = match t.endpoint {
            DataEndpoint::Cached => match self.cached.take() {
                Some(kept) => Some(kept),
                None => return Err("no open data connections to reuse".into()),
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
            // An upload sent ahead comes on the open connections alone: received on the
            // control task's blocking thread, none started to watch the listener.
            let (listener, parked) = if b.fixed && !open.is_empty() {
                (None, listener)
            } else {
                (listener, None)
            };
            let accept = listener.map(|listener| self.accept(t, listener));
            let conns = Joins {
                reused: !open.is_empty(),
                open,
                accept,
                incoming: None,
                stall: self.config.idle_timeout,
                tls: self.data_tls(t).map(Arc::new),
            };
            return Ok(BlockConns::Receive(
                conns,
                data::upload_state(&b.have, progress.clone()),
                parked,
            ));
        }
        if let Some(kept) = cached {
            let joins = Joins::cached(kept.socks, self.config.idle_timeout);
            return Ok(BlockConns::Send(joins.protected(self.data_tls(t))));
        }
        let n = b.parallelism.max(1) as usize;
        let want = self.admits(t);
        let socks = match &t.endpoint {
            // Elastic: start on the first connection and take the others as they come, for as
            // long as there are blocks to send. Under TLS the first comes the same way: it
            // counts only once it proves it belongs to this session.
            DataEndpoint::Passive(_) if b.elastic => {
                let listener = self.passive.take().ok_or("no passive listener")?;
                let tls = self.data_tls(t);
                let first = match tls {
                    Some(_) => None,
                    None => Some(accept_from(&listener, want, deadline).await?),
                };
                let listener = listener.into_std().map_err(|e| e.to_string())?;
                let mut joins = Joins::accept(self.accept(t, listener), self.config.idle_timeout);
                if let Some(first) = first {
                    joins
                        .open
                        .push(DataConn::Clear(self.blocking(first, t.buffer)?));
                }
                return Ok(BlockConns::Send(joins.protected(tls)));
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
            DataEndpoint::Striped(_) => return Err("the data nodes move striped data".into()),
        };
        let socks = socks
            .into_iter()
            .map(|s| self.blocking(s, t.buffer))
            .collect::<Result<Vec<_>, _>>()?;
        let joins = Joins::fixed(socks, self.config.idle_timeout);
        Ok(BlockConns::Send(joins.protected(self.data_tls(t))))
    }

    /// PROT P: how this transfer's MODE E data connections are secured. Only a TLS session
    /// has a binding, and only a braid client asks for MODE E under PROT P (GridFTP clients
    /// protect data with DCAU and GSI, which braid does not speak).
    /// In a third-party transfer this server connects to the other one: it is the TLS client
    /// there, checks that server's certificate against the one the client named, and proves
    /// the binding of the client's session with it.
    pub(super) fn data_tls(&self, t: &Transfer) -> Option<DataTls> {
        if t.gsi {
            let gsi = self.gsi_data()?;
            return Some(match t.endpoint {
                DataEndpoint::Active(_) | DataEndpoint::ActivePorts(_) => DataTls::GsiInitiate(gsi),
                _ => DataTls::GsiAccept(gsi),
            });
        }
        let config = self.tls.as_ref().filter(|_| t.private)?.control.clone();
        if let Some(ThirdParty::Connect(peer)) = &t.third_party {
            let config = match crate::client::wire::pinned_config(peer.certificate) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("third-party transfer: {e:#}");
                    return None;
                }
            };
            return Some(DataTls::Client {
                config,
                name: rustls::pki_types::ServerName::try_from(engine::tls::ONE_SHOT_NAME).ok()?,
                binding: Binding::from_bytes(peer.binding),
            });
        }
        // A data node's connections come from its front end's client, and prove that
        // client's session with the front end, whose binding the order carries (none: the
        // client's data is in clear).
        let (binding, tickets) = match &t.stripe {
            Some(order) => (Binding::from_bytes(order.binding?), None),
            None => (self.binding?, self.tls.as_ref().map(|t| t.ticket_mark())),
        };
        Some(DataTls::Server {
            config,
            binding,
            tickets,
        })
    }

    /// Under DCAU A: the credential data connections are authenticated with.
    pub(super) fn gsi_data(&self) -> Option<Arc<engine::gsi_data::GsiData>> {
        self.gsi_user.as_ref()?.data.clone()
    }

    /// Under DCAU A a data connection shows the user's credential, so it may come from
    /// another server (a copy between two), unless the admin said --no-third-party.
    fn gsi_third_party(&self, t: &Transfer) -> bool {
        t.gsi && self.config.third_party
    }

    /// Who may open a stream-mode data connection: the client.
    fn admits_client(&self) -> Admits {
        Admits {
            forwarded_to: self.forwarded.then(|| canonical_ip(self.local.ip())),
            ..Admits::client(self.peer.ip())
        }
    }

    /// Who may open this session's data connections: the client, or in a third-party
    /// transfer anyone (each must prove the session's binding under TLS to count).
    /// On a data node, the client its front end named, and no one else.
    fn admits(&self, t: &Transfer) -> Admits {
        if let Some(order) = &t.stripe {
            return Admits::client(order.client);
        }
        Admits {
            // Under DCAU A each must show the user's credential, from wherever it comes.
            anyone: t.third_party == Some(ThirdParty::Accept) || self.gsi_third_party(t),
            ..self.admits_client()
        }
    }

    /// Where the client opens (more) data connections of a MODE E transfer.
    fn accept(&self, t: &Transfer, listener: std::net::TcpListener) -> Accept {
        let buffer = t.buffer;
        Accept {
            listener,
            peer: self.admits(t),
            max: self.config.max_streams as usize,
            buffer,
            timeout: Some(self.config.idle_timeout),
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

/// Accepts one data connection from the client's address (or where `want` also admits);
/// strangers are dropped (port stealing, RFC 2577) and the wait goes on.
async fn accept_from(
    listener: &TcpListener,
    want: Admits,
    deadline: Instant,
) -> Result<TcpStream, String> {
    loop {
        let (s, from) = timeout_at(deadline, listener.accept())
            .await
            .map_err(|_| "no connection arrived in time".to_string())?
            .map_err(|e| e.to_string())?;
        if want.admits(from.ip()) {
            return Ok(s);
        }
        crate::warnings::warn(
            "stranger-data",
            from.ip(),
            format_args!("refused data connection from {from}, a host other than the client"),
        );
    }
}

/// GSI's handshake (DCAU A) on a stream-mode connection, off the async threads.
async fn secured(
    gsi: &DataTls,
    sock: std::net::TcpStream,
) -> Result<std::net::TcpStream, engine::tls::SecureError> {
    let gsi = gsi.clone();
    let secured = tokio::task::spawn_blocking(move || gsi.secure(sock))
        .await
        .map_err(|e| engine::tls::SecureError::Handshake(std::io::Error::other(e)))?;
    match secured? {
        DataConn::Clear(sock) => Ok(sock),
        _ => Err(engine::tls::SecureError::NotBound),
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
