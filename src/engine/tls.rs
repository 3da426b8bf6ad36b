//! TLS on MODE E data connections (PROT P between braid peers, FEAT `BRAID 3`).
//!
//! Each data connection is a TLS session of its own; the FTP client is always the TLS client
//! (RFC 4217), whichever side connected. Two things make many of them cheap and safe:
//! - **Resumption.** The server hands out stateless tickets and the client asks for enough of
//!   them on the control connection (RFC 9149) that N data connections resume instead of
//!   each doing a full handshake with certificate checks.
//! - **Binding.** A stranger who reaches the data port (even from the client's address) must
//!   not join the transfer. The client's first bytes on a data connection are a value derived
//!   from both the control session's keys and this connection's (two TLS exporters), which
//!   only the two ends of that control connection can compute. The server drops a connection
//!   that does not prove it, and the transfer goes on without it.
//! - **No round trip for the binding.** A connection that resumed a ticket its own control
//!   connection issued (the server seals the session's mark in those tickets) is already
//!   bound: only that control connection's client holds the ticket's key, and a replayed
//!   ClientHello cannot read what comes back (rustls resumes only with a fresh key exchange).
//!   The server then sends from its first flight (TLS 1.3's 0.5-RTT data) instead of waiting
//!   a round trip for the proof, which it still reads and checks before it closes or reads
//!   the connection: a download's first byte comes one round trip sooner.
//! - **No round trip for an upload either**, where the tickets allow 0-RTT data (a one-shot
//!   server's, kept by the session and each good once): the client sends from its ClientHello
//!   and proves nothing, and the server reads that data only once the handshake has ended,
//!   which a replayer of it cannot make happen.
//!
//! Once set up, the block protocol runs inside TLS unchanged. Its EOD/EOF blocks say where the
//! data ends, authenticated like the rest, so no close_notify is needed (and a connection kept
//! for the next transfer must not send one).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of the control session's binding value and of a data connection's proof.
pub const BINDING_LEN: usize = 32;

/// RFC 5705 exporter labels; unregistered ones must begin with "EXPERIMENTAL".
const CONTROL_LABEL: &[u8] = b"EXPERIMENTAL braid control session";
const PROOF_LABEL: &[u8] = b"EXPERIMENTAL braid data connection";

/// How long a data connection's handshake and proof may take: a stranger that connects and
/// says nothing holds a thread only this long.
const HANDSHAKE_TIME: Duration = Duration::from_secs(20);

/// The most 0-RTT data a data connection sends before its handshake ends: about what TCP's
/// first windows carry before the server's first flight comes back with their
/// acknowledgements; the rest goes after the client's Finished.
pub const EARLY_DATA: u32 = 64 * 1024;

/// Tickets the client asks for on the control connection (RFC 9149): one per data connection
/// it is likely to open at once; more open with full handshakes.
pub const TICKETS: u8 = 16;

/// The control session's secret that data connections prove they know.
#[derive(Clone, Copy)]
pub struct Binding([u8; BINDING_LEN]);

/// What a server's control connection seals in the tickets it issues (rustls's resumption
/// data): unique among the sessions of one server process.
pub type TicketMark = [u8; 8];

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Binding(..)")
    }
}

impl Binding {
    /// A binding another party passed on: in a third-party transfer the client tells the
    /// sending server the binding of its session with the receiving one.
    pub fn from_bytes(bytes: [u8; BINDING_LEN]) -> Binding {
        Binding(bytes)
    }

    /// The secret itself, for the client to pass on to the server it trusts with it.
    pub fn to_bytes(self) -> [u8; BINDING_LEN] {
        self.0
    }

    /// The binding of a control connection whose handshake is complete.
    pub fn of<D>(control: &rustls::ConnectionCommon<D>) -> Result<Binding, rustls::Error> {
        control
            .export_keying_material([0u8; BINDING_LEN], CONTROL_LABEL, None)
            .map(Binding)
    }

    /// What the client sends on a data connection: this binding, mixed with the connection's
    /// own keys so the value is worth nothing anywhere else.
    fn proof<D>(
        &self,
        data: &rustls::ConnectionCommon<D>,
    ) -> Result<[u8; BINDING_LEN], rustls::Error> {
        data.export_keying_material([0u8; BINDING_LEN], PROOF_LABEL, Some(&self.0))
    }
}

/// How a transfer's data connections are protected: which side of TLS this is, and the
/// control session they belong to.
#[derive(Debug, Clone)]
pub enum DataTls {
    /// This side is the FTP server: it expects each connection to prove its binding.
    Server {
        config: Arc<rustls::ServerConfig>,
        binding: Binding,
        /// The mark this session's control connection sealed in its tickets
        /// (`set_resumption_data`): a connection resuming one of them is bound at once.
        /// None where the tickets are another server's (a data node's connections).
        tickets: Option<TicketMark>,
    },
    /// This side is the FTP client: it checks the server (as on the control connection)
    /// and proves the binding.
    Client {
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        binding: Binding,
    },
    /// GridFTP's data channel authentication (DCAU A) under GSI, on a connection a GridFTP
    /// server opened to send: its handshake, then the data in clear. (The client runs it on
    /// connections it opens itself while it reads the answer to their command.)
    GsiAccept(Arc<super::gsi_data::GsiData>),
    /// DCAU A on a connection this side opened (a GSI server sending to a PORT: to its
    /// client, or to another server in a copy between two).
    GsiInitiate(Arc<super::gsi_data::GsiData>),
}

/// Why a data connection could not be secured.
#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
    #[error("it did not prove that it belongs to this session")]
    NotBound,
}

impl DataTls {
    /// Runs the handshake and the binding proof on a fresh connection (under GSI, the
    /// handshake and the flag).
    pub fn secure(&self, sock: TcpStream) -> Result<DataConn, SecureError> {
        // Each write is a whole record (or many), never a byte at a time, and Nagle would
        // hold a small record (a block's header, a small file's only block) behind the
        // peer's delayed ACK of the one before: 40 ms per transfer.
        let _ = sock.set_nodelay(true);
        let before = sock.read_timeout().ok().flatten();
        let limit = before.map_or(HANDSHAKE_TIME, |b| b.min(HANDSHAKE_TIME));
        let _ = sock.set_read_timeout(Some(limit));
        let restore = |s: &TcpStream| {
            let _ = s.set_read_timeout(before);
        };
        match self {
            DataTls::Client {
                config,
                name,
                binding,
            } => {
                let mut conn = rustls::ClientConnection::new(config.clone(), name.clone())
                    .map_err(SecureError::Setup)?;
                let mut sock = sock;
                let zero_rtt = conn.early_data().is_some();
                send_tls(&mut conn, &mut sock).map_err(SecureError::Handshake)?;
                let pending = Pending {
                    sent: Vec::new(),
                    binding: *binding,
                };
                let s = rustls::StreamOwned::new(conn, sock);
                let mut c = DataConn::Client(Box::new(s), Some(Box::new(pending)));
                // Resuming a ticket that allows 0-RTT data, what the transfer writes next
                // goes with the ClientHello; else the handshake and the proof run now.
                if !zero_rtt {
                    c.settle().map_err(SecureError::Handshake)?;
                }
                restore(c.tcp());
                Ok(c)
            }
            DataTls::GsiAccept(gsi) => {
                let mut sock = sock;
                gsi.accept(&mut sock).map_err(SecureError::Handshake)?;
                restore(&sock);
                Ok(DataConn::Clear(sock))
            }
            DataTls::GsiInitiate(gsi) => {
                let mut sock = sock;
                gsi.initiate(&mut sock).map_err(SecureError::Handshake)?;
                restore(&sock);
                Ok(DataConn::Clear(sock))
            }
            DataTls::Server {
                config,
                binding,
                tickets,
            } => {
                let mut conn =
                    rustls::ServerConnection::new(config.clone()).map_err(SecureError::Setup)?;
                let mut sock = sock;
                let bound = serve_handshake(&mut conn, &mut sock, tickets.as_ref())
                    .map_err(SecureError::Handshake)?;
                let mut s = rustls::StreamOwned::new(conn, sock);
                let mut owed = Owed::Proof(*binding);
                if !bound {
                    settle(&mut s, &mut owed).map_err(|_| SecureError::NotBound)?;
                } else if s.conn.early_data().is_some() {
                    // Its client sent 0-RTT data, and no proof: resuming its own session's
                    // ticket (single-use) and finishing the handshake proves it.
                    owed = Owed::Finished;
                }
                restore(&s.sock);
                Ok(DataConn::Server(s.into(), owed))
            }
        }
    }
}

/// The server's side of a data connection's handshake, up to where it may send: to the end,
/// or, for a connection that resumed one of `tickets`, just past the server's first flight
/// (the handshake then ends when the connection is next read). Whether it resumed so.
fn serve_handshake(
    conn: &mut rustls::ServerConnection,
    sock: &mut TcpStream,
    tickets: Option<&TicketMark>,
) -> std::io::Result<bool> {
    let ours = |conn: &rustls::ServerConnection| {
        conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            && conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3)
            && tickets.is_some_and(|t| conn.received_resumption_data() == Some(&t[..]))
    };
    loop {
        send_tls(conn, sock)?;
        if ours(conn) {
            // The tickets it issues once the client's Finished is read (the client asks for
            // one per resumption) are this session's too, as the one it resumed.
            if let Some(t) = tickets {
                conn.set_resumption_data(t);
            }
            return Ok(true);
        }
        if !conn.is_handshaking() {
            return Ok(false);
        }
        if conn.read_tls(sock)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Err(e) = conn.process_new_packets() {
            // The alert saying why, if it can still go.
            let _ = conn.write_tls(sock);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
    }
}

/// What a server's data connection owes before it may be read, closed or kept.
#[derive(Debug, Clone, Copy)]
pub enum Owed {
    Nothing,
    /// The binding's proof (its handshake ends on the way).
    Proof(Binding),
    /// The end of its handshake: it sent 0-RTT data, which is read only once the client's
    /// Finished shows a live client (a replayed ClientHello never gets that far), and comes
    /// before what follows.
    Finished,
}

/// Pays what a server's data connection owes, if anything: its proof, read and checked, or
/// the end of its handshake. A proof is owed until it is read whole and right: a read that
/// timed out part-way leaves the rest to a mismatch, never to data taken as proved.
fn settle(
    s: &mut rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
    owed: &mut Owed,
) -> std::io::Result<()> {
    let binding = match *owed {
        Owed::Nothing => return Ok(()),
        Owed::Finished => return handshake(&mut s.conn, &mut s.sock),
        Owed::Proof(binding) => binding,
    };
    let mut got = [0u8; BINDING_LEN];
    s.read_exact(&mut got)?;
    let want = binding
        .proof(&s.conn)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // Compared in constant time: the value is a secret.
    let differ = want.iter().zip(&got).fold(0u8, |d, (a, b)| d | (a ^ b));
    if differ != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the data connection did not prove that it belongs to this session",
        ));
    }
    *owed = Owed::Nothing;
    Ok(())
}

/// A client's connection whose handshake goes on: what it wrote as 0-RTT data, kept until
/// the server accepts it (or else sent again, after the proof), and the binding that proof
/// shows.
pub struct Pending {
    sent: Vec<u8>,
    binding: Binding,
}

/// Ends a client's handshake and sends the binding's proof, unless the server took 0-RTT
/// data (resuming its own session's single-use ticket is then the proof). A server that
/// turned the data down (a ticket of another session, a server that takes none) gets the
/// proof and the same bytes again, as a connection without 0-RTT data sends them.
fn conclude(
    s: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    pending: &mut Option<Box<Pending>>,
) -> std::io::Result<()> {
    let Some(e) = pending.take() else {
        return Ok(());
    };
    handshake(&mut s.conn, &mut s.sock)?;
    if !s.conn.is_early_data_accepted() {
        let proof = e
            .binding
            .proof(&s.conn)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        s.write_all(&proof)?;
        s.write_all(&e.sent)?;
    }
    Ok(())
}

impl SecureError {
    /// The connection closed or was reset during the handshake, as opposed to TLS failing
    /// (a certificate, a protocol error) or the peer not answering.
    pub fn is_connection_loss(&self) -> bool {
        use std::io::ErrorKind::*;
        matches!(self, SecureError::Handshake(e) if matches!(
            e.kind(),
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
        ))
    }
}

/// A connection that joined and could not be secured. On the server it is a stranger (or a
/// client's connection that broke): it is dropped and the transfer goes on, to fail by its
/// stall timer if nothing else comes. On the client, a connection of an elastic transfer
/// that closed during its handshake is one the transfer no longer needed (a small file all
/// sent on another, or one this side shut once all had arrived), as a clear one closed
/// before its first block is; any other failure is the server failing TLS, which fails the
/// transfer.
pub fn refused(
    tls: &DataTls,
    e: SecureError,
    from: Option<std::net::SocketAddr>,
    elastic: bool,
    fail: impl Fn(super::EngineError),
) {
    match tls {
        DataTls::Server { .. } | DataTls::GsiAccept(_) => match from {
            Some(from) => crate::warnings::warn(
                "refused-data-tls",
                from.ip(),
                format_args!("refused a data connection from {from}: {e}"),
            ),
            None => tracing::warn!("refused a data connection: {e}"),
        },
        DataTls::Client { .. } if elastic && e.is_connection_loss() => {
            tracing::debug!("a data connection closed during its TLS handshake: {e}");
        }
        DataTls::Client { .. } | DataTls::GsiInitiate(_) => fail(super::EngineError::Tls(e)),
    }
}

/// Runs a TLS handshake to its end (the client's control connection uses it too).
pub fn handshake<D>(
    conn: &mut rustls::ConnectionCommon<D>,
    sock: &mut (impl std::io::Read + std::io::Write),
) -> std::io::Result<()> {
    while conn.is_handshaking() {
        conn.complete_io(sock)?;
    }
    Ok(())
}

/// A certificate's SHA-256, by which a client pins a certificate it learnt over another
/// channel (`braid cp`: the one-shot server's, told over ssh).
pub fn fingerprint(der: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The name in a one-shot server's certificate, which its client checks it against.
pub const ONE_SHOT_NAME: &str = "braid-one-shot";

/// A connection in clear or through TLS, read and written the same way: MODE E data
/// connections on both sides, and the client's control and stream-mode data connections.
pub enum DataConn {
    Clear(TcpStream),
    /// With what it sent as 0-RTT data while its handshake goes on.
    Client(
        Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
        Option<Box<Pending>>,
    ),
    /// With what it owes before it is read: one that resumed its own session's ticket is
    /// sent to before then.
    Server(
        Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>,
        Owed,
    ),
}

impl std::fmt::Debug for DataConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_clear() { "clear" } else { "TLS" };
        write!(f, "DataConn({kind}, {:?})", self.tcp())
    }
}

impl DataConn {
    /// The TCP connection underneath: socket options, polling, shutdown.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DataConn::Clear(s) => s,
            DataConn::Client(s, _) => &s.sock,
            DataConn::Server(s, _) => &s.sock,
        }
    }

    /// Whether the bytes pass in clear (and may go by `sendfile`).
    pub fn is_clear(&self) -> bool {
        matches!(self, DataConn::Clear(_))
    }

    /// Ends the data written: close_notify under TLS, then FIN. (MODE E connections end
    /// with their EOD block instead; a kept one must not send close_notify.)
    pub fn finish(&mut self) {
        let _ = self.settle();
        match self {
            DataConn::Clear(_) => {}
            DataConn::Client(s, _) => {
                s.conn.send_close_notify();
                let _ = s.flush();
            }
            DataConn::Server(s, _) => {
                s.conn.send_close_notify();
                let _ = s.flush();
            }
        }
        let _ = self.tcp().shutdown(std::net::Shutdown::Write);
    }

    /// Ends a handshake still going on and reads the binding's proof a server's connection
    /// still owes, if it does: before the connection is read, and before it is closed or kept
    /// once its data is written (bytes left unread at close make the kernel answer with RST,
    /// which would throw away the tail of the data still in flight). An error if the proof
    /// is wrong.
    pub fn settle(&mut self) -> std::io::Result<()> {
        match self {
            DataConn::Server(s, owed) => settle(s, owed),
            DataConn::Client(s, pending) => conclude(s, pending),
            DataConn::Clear(_) => Ok(()),
        }
    }

    /// Whether its TLS session was resumed (no certificate exchanged); None in clear. One
    /// still sending 0-RTT data counts as resumed: it offered a ticket that allows it, which
    /// only a server that turns the data down would not resume.
    pub fn resumed(&self) -> Option<bool> {
        let kind = match self {
            DataConn::Clear(_) => return None,
            DataConn::Client(_, Some(_)) => return Some(true),
            DataConn::Client(s, _) => s.conn.handshake_kind(),
            DataConn::Server(s, _) => s.conn.handshake_kind(),
        };
        Some(kind == Some(rustls::HandshakeKind::Resumed))
    }
}

impl Read for DataConn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let r = match self {
            DataConn::Clear(s) => return s.read(buf),
            DataConn::Client(s, pending) => conclude(s, pending).and_then(|()| s.read(buf)),
            DataConn::Server(s, owed) => read_server(s, owed, buf),
        };
        match r {
            // Closed without close_notify: the end of the data, as curl and lftp also take it
            // (the block protocol, or FTP's replies, say whether it was early).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            r => r,
        }
    }
}

impl Write for DataConn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            DataConn::Clear(s) => s.write(buf),
            // As 0-RTT data while rustls takes more (up to the ticket's allowance).
            DataConn::Client(s, pending @ Some(_)) => {
                let n = match s.conn.early_data() {
                    Some(mut w) => w.write(buf)?,
                    None => 0,
                };
                match pending {
                    Some(p) if n > 0 => {
                        p.sent.extend_from_slice(&buf[..n]);
                        send_tls(&mut s.conn, &mut s.sock)?;
                        Ok(n)
                    }
                    _ => {
                        conclude(s, pending)?;
                        s.write(buf)
                    }
                }
            }
            DataConn::Client(s, None) => s.write(buf),
            // Still in its handshake (it resumed its own session's ticket): rustls's stream
            // would first wait for the client's Finished, a round trip this saves.
            DataConn::Server(s, _) if s.conn.is_handshaking() => {
                let n = s.conn.writer().write(buf)?;
                send_tls(&mut s.conn, &mut s.sock)?;
                Ok(n)
            }
            DataConn::Server(s, _) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            DataConn::Clear(s) => s.flush(),
            DataConn::Client(s, Some(_)) => send_tls(&mut s.conn, &mut s.sock),
            DataConn::Client(s, None) => s.flush(),
            DataConn::Server(s, _) if s.conn.is_handshaking() => send_tls(&mut s.conn, &mut s.sock),
            DataConn::Server(s, _) => s.flush(),
        }
    }
}

/// Writes out what TLS has ready to send, without reading.
fn send_tls<D>(
    conn: &mut rustls::ConnectionCommon<D>,
    sock: &mut TcpStream,
) -> std::io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(sock)?;
    }
    Ok(())
}

/// Reads a server's data connection: once it owes nothing, its 0-RTT data first.
fn read_server(
    s: &mut rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
    owed: &mut Owed,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    settle(s, owed)?;
    if let Owed::Finished = owed {
        if let Some(mut early) = s.conn.early_data() {
            let n = early.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
        }
        *owed = Owed::Nothing;
    }
    s.read(buf)
}

#[cfg(test)]
mod tests {
    //! Data connections against real TLS sessions on loopback, with the server's and the
    //! client's own TLS settings (`braid serve --tls-cert`, `braid get --tls-ca`).
    use super::*;
    use crate::engine::receive::{Progress, Shared, receive};
    use crate::engine::send::{Options, Source, send};
    use crate::engine::sink::Sink;
    use crate::engine::transfer::{Accept, Joins, Transfer};
    use braid_proto::ranges::RangeSet;
    use std::net::TcpListener;
    use std::sync::atomic::AtomicU64;

    struct Pki {
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        cert: std::path::PathBuf,
        _dir: tempfile::TempDir,
    }

    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        Pki {
            server: crate::server::tls::server_config(&cert, &key).unwrap(),
            client: crate::client::tls_config(Some(&cert)).unwrap(),
            cert,
            _dir: dir,
        }
    }

    fn name() -> rustls::pki_types::ServerName<'static> {
        rustls::pki_types::ServerName::try_from("localhost").unwrap()
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    /// A control connection's handshake, as AUTH TLS runs it: both ends' bindings. The
    /// client reads a byte after it, as it reads replies, which takes in the tickets.
    fn control(pki: &Pki) -> (Binding, Binding) {
        control_of(pki, &pki.client, MARK)
    }

    /// What the tests' control sessions seal in their tickets, unless they say otherwise.
    const MARK: TicketMark = *b"session1";

    /// A control connection of the client `client`, whose tickets carry `mark`.
    fn control_of(
        pki: &Pki,
        client: &Arc<rustls::ClientConfig>,
        mark: TicketMark,
    ) -> (Binding, Binding) {
        control_with(pki.server.clone(), client, name(), mark)
    }

    /// A control connection's handshake between `server` and `client`.
    fn control_with(
        server: Arc<rustls::ServerConfig>,
        client: &Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        mark: TicketMark,
    ) -> (Binding, Binding) {
        let (c, s) = pair();
        let serving = std::thread::spawn(move || {
            let mut conn = rustls::ServerConnection::new(server).unwrap();
            conn.set_resumption_data(&mark);
            let mut s = rustls::StreamOwned::new(conn, s);
            s.write_all(b"!").unwrap();
            Binding::of(&s.conn).unwrap()
        });
        let conn = rustls::ClientConnection::new(client.clone(), name).unwrap();
        let mut c = rustls::StreamOwned::new(conn, c);
        let mut byte = [0u8];
        c.read_exact(&mut byte).unwrap();
        (Binding::of(&c.conn).unwrap(), serving.join().unwrap())
    }

    /// The server's side of this session's data connections: its tickets carry [`MARK`].
    fn server(pki: &Pki, binding: Binding) -> DataTls {
        DataTls::Server {
            config: pki.server.clone(),
            binding,
            tickets: Some(MARK),
        }
    }

    fn client(pki: &Pki, binding: Binding) -> DataTls {
        DataTls::Client {
            config: pki.client.clone(),
            name: name(),
            binding,
        }
    }

    #[test]
    fn a_data_connection_resumes_its_control_session_and_proves_it_belongs() {
        let pki = pki();
        let (mine, theirs) = control(&pki);
        assert_eq!(mine.0, theirs.0, "the two ends derive the same binding");
        // More connections than rustls's own cache keeps tickets for (8): all resume.
        for _ in 0..12 {
            let (c, s) = pair();
            let tls = DataTls::Server {
                config: pki.server.clone(),
                binding: theirs,
                tickets: None,
            };
            let serving = std::thread::spawn(move || {
                let mut conn = tls.secure(s).unwrap();
                let mut got = [0u8; 5];
                conn.read_exact(&mut got).unwrap();
                (got, conn.resumed())
            });
            let mut conn = client(&pki, mine).secure(c).unwrap();
            conn.write_all(b"hello").unwrap();
            assert_eq!(conn.resumed(), Some(true));
            // Small records (a block header) go out at once, not behind a delayed ACK.
            assert!(conn.tcp().nodelay().unwrap());
            let (got, resumed) = serving.join().unwrap();
            assert_eq!(&got, b"hello");
            assert_eq!(resumed, Some(true));
        }
    }

    /// A download's connection that resumed its own session's ticket is sent to before the
    /// client has even finished its handshake: its first data comes one round trip sooner.
    /// The client below never sends its Finished until it has read the server's first bytes;
    /// a server waiting for the proof would send nothing, and the client's read time out.
    #[test]
    fn a_connection_resuming_its_own_sessions_ticket_is_sent_to_before_its_proof() {
        let pki = pki();
        let (mine, theirs) = control(&pki);
        let (mut c, s) = pair();
        let tls = server(&pki, theirs);
        let serving = std::thread::spawn(move || {
            let mut conn = tls.secure(s).map_err(std::io::Error::other)?;
            conn.write_all(b"early")?;
            conn.flush()?;
            // Reading takes the proof first, and checks it.
            let mut got = [0u8; 5];
            conn.read_exact(&mut got)?;
            Ok::<_, std::io::Error>(got)
        });
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut conn = rustls::ClientConnection::new(pki.client.clone(), name()).unwrap();
        // The ClientHello, with the ticket; then only reading.
        while conn.wants_write() {
            conn.write_tls(&mut c).unwrap();
        }
        let mut early = Vec::new();
        while early.len() < 5 {
            assert!(conn.read_tls(&mut c).unwrap() > 0, "the server closed");
            conn.process_new_packets().unwrap();
            let mut buf = [0u8; 64];
            if let Ok(n) = conn.reader().read(&mut buf) {
                early.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(early, b"early", "sent before the client's Finished");
        assert_eq!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
        // Now the client's Finished, its proof and its data.
        let proof = mine.proof(&conn).unwrap();
        conn.writer().write_all(&proof).unwrap();
        conn.writer().write_all(b"hello").unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut c).unwrap();
        }
        assert_eq!(&serving.join().unwrap().unwrap(), b"hello");
    }

    /// One sent to early that then proves the wrong binding is refused at its first read,
    /// and at every read after: its data is never taken as this session's.
    #[test]
    fn a_connection_sent_to_early_with_a_wrong_proof_is_refused_when_read() {
        let pki = pki();
        let (_, theirs) = control(&pki);
        let (c, s) = pair();
        let tls = server(&pki, theirs);
        let serving = std::thread::spawn(move || {
            let mut conn = tls.secure(s).map_err(std::io::Error::other)?;
            let mut got = [0u8; 5];
            let first = conn.read_exact(&mut got).map_err(|e| e.kind());
            let again = conn.read_exact(&mut got).map_err(|e| e.kind());
            Ok::<_, std::io::Error>((first, again))
        });
        // The client holds this session's ticket but proves a binding of its own making.
        let wrong = Binding::from_bytes([7; BINDING_LEN]);
        let mut conn = client(&pki, wrong).secure(c).unwrap();
        assert_eq!(conn.resumed(), Some(true));
        conn.write_all(b"hello").unwrap();
        // Closed: a second read that waited for more would otherwise wait for ever.
        drop(conn);
        let (first, again) = serving.join().unwrap().unwrap();
        assert_eq!(first, Err(std::io::ErrorKind::PermissionDenied));
        assert!(again.is_err(), "the second read took {again:?}");
    }

    /// A one-shot server's session (`braid serve --stdio`), whose tickets allow 0-RTT data,
    /// after its control connection's handshake with braid cp's client: the server's and
    /// the client's side of its data connections.
    fn one_shot() -> (DataTls, DataTls) {
        let (tls, digest) = crate::server::tls::Tls::made_now().unwrap();
        one_shot_session(&tls, digest)
    }

    /// A session of the one-shot server `tls`, as [`one_shot`].
    fn one_shot_session(tls: &crate::server::tls::Tls, digest: [u8; 32]) -> (DataTls, DataTls) {
        let session = tls.session(std::net::Ipv4Addr::LOCALHOST.into());
        let config = crate::client::wire::pinned_config(digest).unwrap();
        let name = rustls::pki_types::ServerName::try_from(ONE_SHOT_NAME).unwrap();
        let mark = session.ticket_mark();
        let (mine, theirs) = control_with(session.control.clone(), &config, name.clone(), mark);
        let server = DataTls::Server {
            config: session.control.clone(),
            binding: theirs,
            tickets: Some(mark),
        };
        let client = DataTls::Client {
            config,
            name,
            binding: mine,
        };
        (server, client)
    }

    /// An upload's connection sends from its ClientHello (0-RTT), without a proof; the
    /// server knows it at once, and reads the data in order once the handshake has ended.
    #[test]
    fn an_upload_connection_sends_with_its_client_hello() {
        let (server, client) = one_shot();
        let (c, s) = pair();
        let mut conn = client.secure(c).unwrap();
        assert!(
            matches!(conn, DataConn::Client(_, Some(_))),
            "its handshake goes on while it writes"
        );
        conn.write_all(b"early").unwrap();
        conn.flush().unwrap();
        // The client has read nothing yet: the server found 0-RTT data in its first flight.
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut served = server.secure(s).unwrap();
        assert!(
            matches!(served, DataConn::Server(_, Owed::Finished)),
            "the server took 0-RTT data"
        );
        let reading = std::thread::spawn(move || {
            let mut got = [0u8; 10];
            served.read_exact(&mut got).map(|()| got)
        });
        conn.write_all(b"hello").unwrap();
        conn.settle().unwrap();
        assert_eq!(conn.resumed(), Some(true));
        assert_eq!(&reading.join().unwrap().unwrap(), b"earlyhello");
    }

    /// 0-RTT data can be replayed by anyone who saw it; the server never reads it from a
    /// connection whose client does not finish the handshake (as a replayer cannot).
    #[test]
    fn zero_rtt_data_of_a_connection_that_never_finishes_its_handshake_is_never_read() {
        let (server, client) = one_shot();
        let DataTls::Client { config, name, .. } = client else {
            unreachable!()
        };
        let (mut c, s) = pair();
        let mut conn = rustls::ClientConnection::new(config, name).unwrap();
        conn.early_data().unwrap().write_all(b"forged").unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut c).unwrap();
        }
        // The ClientHello and its 0-RTT data, and then no Finished.
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut served = server.secure(s).unwrap();
        let mut got = Vec::new();
        let _ = served.read_to_end(&mut got);
        assert!(got.is_empty(), "read {got:?}");
    }

    /// A ticket resumes once: a recorded ClientHello with its 0-RTT data, played again,
    /// finds its ticket used and the data turned down.
    #[test]
    fn a_replayed_client_hello_gets_no_zero_rtt_data_accepted() {
        let (server, client) = one_shot();
        let (
            DataTls::Server { config, .. },
            DataTls::Client {
                config: cc, name, ..
            },
        ) = (server, client)
        else {
            unreachable!()
        };
        let mut conn = rustls::ClientConnection::new(cc, name).unwrap();
        conn.early_data().unwrap().write_all(b"blocks").unwrap();
        let mut recorded = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut recorded).unwrap();
        }
        let takes_early = || {
            let mut s = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut rest = &recorded[..];
            while !rest.is_empty() {
                s.read_tls(&mut rest).unwrap();
                s.process_new_packets().unwrap();
            }
            s.early_data().is_some()
        };
        assert!(takes_early(), "the first time");
        assert!(!takes_early(), "played again");
    }

    /// A server that turns the 0-RTT data down (here: another session's, which does not
    /// know the ticket) gets the proof and then the same bytes, as without 0-RTT.
    #[test]
    fn zero_rtt_data_turned_down_is_sent_again_after_the_proof() {
        let (tls, digest) = crate::server::tls::Tls::made_now().unwrap();
        let (_, client) = one_shot_session(&tls, digest);
        let (other, _) = one_shot_session(&tls, digest);
        let DataTls::Server { config, .. } = other else {
            unreachable!()
        };
        let DataTls::Client { binding, .. } = &client else {
            unreachable!()
        };
        let server = DataTls::Server {
            config,
            binding: *binding,
            tickets: None,
        };
        let (c, s) = pair();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let serving = std::thread::spawn(move || {
            let mut conn = server.secure(s).map_err(std::io::Error::other)?;
            let mut got = [0u8; 10];
            conn.read_exact(&mut got)?;
            Ok::<_, std::io::Error>((got, conn.resumed()))
        });
        let mut conn = client.secure(c).unwrap();
        assert!(matches!(conn, DataConn::Client(_, Some(_))));
        conn.write_all(b"early").unwrap();
        conn.write_all(b"hello").unwrap();
        conn.settle().unwrap();
        let (got, resumed) = serving.join().unwrap().unwrap();
        assert_eq!(&got, b"earlyhello");
        assert_eq!(resumed, Some(false), "a full handshake");
    }

    #[test]
    fn a_connection_from_another_session_or_in_clear_is_refused() {
        let pki = pki();
        let (_, theirs) = control(&pki);
        // Another client of the same server, with tickets of its own session.
        let config = crate::client::tls_config(Some(&pki.cert)).unwrap();
        let (other, _) = control_of(&pki, &config, *b"session2");
        // It resumes its ticket, proves its own binding and waits for what the server sends:
        // nothing, neither before its proof nor after.
        let (c, s) = pair();
        let stranger = DataTls::Client {
            config,
            name: name(),
            binding: other,
        };
        let joined = std::thread::spawn(move || {
            let mut conn = stranger.secure(c)?;
            let resumed = conn.resumed();
            let mut got = Vec::new();
            let _ = conn.read_to_end(&mut got);
            Ok::<_, SecureError>((resumed, got))
        });
        assert!(matches!(
            server(&pki, theirs).secure(s),
            Err(SecureError::NotBound)
        ));
        let (resumed, got) = joined.join().unwrap().expect("its own side cannot tell");
        assert_eq!(resumed, Some(true));
        assert!(got.is_empty(), "the stranger read {} bytes", got.len());
        // No TLS at all.
        let (mut c, s) = pair();
        c.write_all(b"EOD and some bytes, in clear\r\n").unwrap();
        assert!(matches!(
            server(&pki, theirs).secure(s),
            Err(SecureError::Handshake(_))
        ));
    }

    #[test]
    fn a_stranger_on_the_data_port_is_dropped_and_the_transfer_completes() {
        let pki = pki();
        let (mine, theirs) = control(&pki);
        // A client of its own, with tickets of its own session.
        let config = crate::client::tls_config(Some(&pki.cert)).unwrap();
        let (other, _) = control_of(&pki, &config, *b"session2");
        let data: Vec<u8> = (0..3 << 20)
            .map(|i: u32| (i * 7 + i / 4093) as u8)
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sending = Transfer::new(true);
        let joins = Joins::accept(
            Accept {
                listener,
                peer: crate::engine::transfer::Admits::client(addr.ip()),
                max: 8,
                buffer: None,
                timeout: Some(Duration::from_secs(30)),
            },
            Duration::from_secs(30),
        )
        .protected(Some(server(&pki, theirs)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("got");
        std::thread::scope(|s| {
            let sent = s.spawn(|| send_all(&sending, &data, joins));
            // The stranger comes first, through TLS, and then tries its luck with a block.
            let stranger = DataTls::Client {
                config,
                name: name(),
                binding: other,
            };
            let mut stranger = stranger.secure(TcpStream::connect(addr).unwrap()).unwrap();
            let _ = stranger.write_all(&braid_proto::block::Header::eof(1).encode());
            let receiving = Transfer::new(true);
            let conns = [
                TcpStream::connect(addr).unwrap(),
                TcpStream::connect(addr).unwrap(),
            ];
            let joins = Joins::fixed(conns.into(), Duration::from_secs(30))
                .protected(Some(client(&pki, mine)));
            let got = receive_all(&receiving, joins, &path, data.len());
            assert!(got.is_ok(), "{got:?}");
            // The first may carry all 3 MiB before the second's handshake ends (seen under load).
            let resumed = receiving.handshakes().resumed;
            assert!((1..=2).contains(&resumed), "{resumed} resumed");
            assert!(sent.join().unwrap().is_ok());
        });
        assert!(std::fs::read(&path).unwrap() == data, "the file differs");
        let resumed = sending.handshakes().resumed;
        assert!(
            (1..=2).contains(&resumed),
            "{resumed} counted: only connections that proved count"
        );
        // Never a third.
        assert!(sending.links().len() <= 2, "the stranger joined");
    }

    /// Receives a file of `len` bytes into `path` over what `joins` brings.
    fn receive_all(
        receiving: &Transfer,
        joins: Joins,
        path: &std::path::Path,
        len: usize,
    ) -> Result<crate::engine::receive::Kept, crate::engine::EngineError> {
        let shared = Shared::new(Progress::holding(RangeSet::new()), Default::default());
        let file = std::fs::File::create(path).unwrap();
        receive(
            receiving,
            joins,
            &Sink::File(file),
            Some(len as u64),
            &shared,
        )
    }

    /// Sends all of `data` in 256 KiB blocks over what `joins` brings.
    fn send_all(
        sending: &Transfer,
        data: &[u8],
        joins: Joins,
    ) -> Result<crate::engine::send::Sent, crate::engine::EngineError> {
        let options = Options {
            block: 256 << 10,
            hash: false,
            keep: false,
        };
        let todo: RangeSet = [(0, data.len() as u64)].into_iter().collect();
        send(
            sending,
            Source::Memory(data),
            &todo,
            joins,
            options,
            &AtomicU64::new(0),
        )
    }

    /// A server that needs fewer connections than the client opened (a small file all sent
    /// on one) closes the others, also mid-handshake: the transfer completes.
    #[test]
    fn a_data_connection_the_server_closes_during_its_handshake_is_not_an_error() {
        let pki = pki();
        let (mine, theirs) = control(&pki);
        let data = vec![7u8; 5000];
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = [
            TcpStream::connect(addr).unwrap(),
            TcpStream::connect(addr).unwrap(),
        ];
        let (used, _) = listener.accept().unwrap();
        drop(listener.accept().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("got");
        std::thread::scope(|s| {
            let sent = s.spawn(|| {
                let joins = Joins::fixed(vec![used], Duration::from_secs(30))
                    .protected(Some(server(&pki, theirs)));
                send_all(&Transfer::new(true), &data, joins)
            });
            let receiving = Transfer::new(true);
            let joins = Joins::fixed(conns.into(), Duration::from_secs(30))
                .protected(Some(client(&pki, mine)));
            let got = receive_all(&receiving, joins, &path, data.len());
            assert!(got.is_ok(), "{got:?}");
            assert!(sent.join().unwrap().is_ok());
            assert_eq!(receiving.handshakes().resumed, 1);
        });
        assert!(std::fs::read(&path).unwrap() == data, "the file differs");
    }
}
