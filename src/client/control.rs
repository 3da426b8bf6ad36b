//! The client's control connection: send commands, read replies, open data connections.

use super::error::{ClientError, Result};
use super::url::Target;
use super::wire::Wire;
use braid_proto::ranges::RangeSet;
use braid_proto::{Command, Reply, ReplyParser, addr};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait for a reply before calling the server unresponsive.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Control {
    stream: Wire,
    parser: ReplyParser,
    peer: SocketAddr,
    /// Whether EPSV failed once, so later transfers go straight to PASV.
    no_epsv: bool,
    pub verbose: bool,
    /// FEAT lines, upper-cased and trimmed (empty until [`Control::probe_features`]).
    features: Vec<String>,
    /// Replies read ahead by [`Control::poll`], not yet handed out.
    pending: VecDeque<Reply>,
    /// What the server's `111 Range Marker` replies say it has stored (uploads).
    stored: RangeSet,
    /// After AUTH TLS: how data connections are protected too.
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
    /// `OPTS BRAID ELASTIC` was accepted on this session.
    pub elastic: bool,
}

impl Control {
    /// Connects and reads the greeting.
    pub fn connect(target: &Target) -> Result<Control> {
        let name = format!("{}:{}", target.host, target.port);
        let fail = |e| ClientError::Connect {
            addr: name.clone(),
            cause: e,
        };
        let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port)
            .to_socket_addrs()
            .map_err(fail)?
            .collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "host has no address");
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(fail)?;
                    let _ = stream.set_nodelay(true);
                    let mut c = Control {
                        stream: Wire::Clear(stream),
                        parser: ReplyParser::new(),
                        peer: a,
                        no_epsv: false,
                        verbose: false,
                        features: Vec::new(),
                        pending: VecDeque::new(),
                        stored: RangeSet::new(),
                        tls: None,
                        elastic: false,
                    };
                    let mut greeting = c.reply()?;
                    while greeting.is_preliminary() {
                        greeting = c.reply()?;
                    }
                    if greeting.code != 220 {
                        return Err(ClientError::Remote {
                            what: "the connection".into(),
                            reply: greeting,
                        });
                    }
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(fail(last))
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn set_verbose(&mut self, v: bool) {
        self.verbose = v;
    }

    /// Reads the next reply, whatever its code.
    pub fn reply(&mut self) -> Result<Reply> {
        if let Some(r) = self.pending.pop_front() {
            return Ok(r);
        }
        loop {
            if let Some(r) = self.parsed()? {
                return Ok(r);
            }
            self.read_some()?;
        }
    }

    /// Reads the replies that have arrived without waiting for more (during a data phase, so
    /// that range markers are seen as they come). They are handed out later by `reply`.
    pub fn poll(&mut self) -> Result<()> {
        let mut buf = [0u8; 4096];
        self.stream
            .tcp()
            .set_nonblocking(true)
            .map_err(|e| ClientError::Protocol(format!("polling replies: {e}")))?;
        let read = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => self.parser.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(ClientError::Protocol(format!("reading reply: {e}"))),
            }
        };
        let _ = self.stream.tcp().set_nonblocking(false);
        read?;
        while let Some(r) = self.parsed()? {
            self.pending.push_back(r);
        }
        Ok(())
    }

    /// The next complete reply in the parser, noting range markers on the way.
    fn parsed(&mut self) -> Result<Option<Reply>> {
        let r = self
            .parser
            .next_reply()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if let Some(r) = &r {
            if self.verbose {
                eprintln!("< {r}");
            }
            if let Some(ranges) = braid_proto::session::parse_range_marker(r) {
                for (a, b) in ranges.iter() {
                    self.stored.insert(a, b);
                }
            }
        }
        Ok(r)
    }

    fn read_some(&mut self) -> std::result::Result<(), ReadError> {
        let mut buf = [0u8; 4096];
        let n = loop {
            match self.stream.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        };
        if n == 0 {
            return Err(ReadError::Closed);
        }
        self.parser.feed(&buf[..n]);
        Ok(())
    }

    /// Starts counting range markers afresh from what the server is known to hold.
    pub fn reset_stored(&mut self, have: RangeSet) {
        self.stored = have;
    }

    /// What the server's range markers say it has stored.
    pub fn stored(&self) -> &RangeSet {
        &self.stored
    }

    pub fn send(&mut self, cmd: &Command) -> Result<()> {
        if self.verbose {
            match cmd {
                Command::Pass(_) => eprintln!("> PASS ****"),
                c => eprintln!("> {}", c.to_line()),
            }
        }
        let mut out = Vec::new();
        cmd.encode(&mut out);
        self.stream
            .write_all(&out)
            .map_err(|e| ClientError::Protocol(format!("sending {}: {e}", cmd.verb())))
    }

    /// Sends a command and returns its final reply (skipping 1xx ones).
    pub fn cmd(&mut self, cmd: &Command) -> Result<Reply> {
        self.send(cmd)?;
        loop {
            let r = self.reply()?;
            if !r.is_preliminary() {
                return Ok(r);
            }
        }
    }

    /// Sends a command that must succeed with one of `ok`.
    pub fn expect(&mut self, cmd: &Command, ok: &[u16]) -> Result<Reply> {
        let r = self.cmd(cmd)?;
        if ok.contains(&r.code) {
            Ok(r)
        } else {
            Err(ClientError::Remote {
                what: cmd_for_error(cmd),
                reply: r,
            })
        }
    }

    pub fn login(&mut self, target: &Target) -> Result<()> {
        let login_err = |reply| ClientError::Login {
            user: target.user.clone(),
            reply,
        };
        let r = self.cmd(&Command::User(target.user.clone()))?;
        let r = match r.code {
            230 => return Ok(()),
            331 | 332 => self.cmd(&Command::Pass(target.password.clone()))?,
            _ => return Err(login_err(r)),
        };
        match r.code {
            230 | 202 => Ok(()),
            _ => Err(login_err(r)),
        }
    }

    /// Asks FEAT once; servers without it just have no features.
    pub fn probe_features(&mut self) -> Result<()> {
        let r = self.cmd(&Command::Feat)?;
        if r.code == 211 {
            self.features = r
                .lines
                .iter()
                .skip(1)
                .map(|l| l.trim().to_ascii_uppercase())
                .filter(|l| !l.is_empty() && l != "END")
                .collect();
        }
        Ok(())
    }

    /// Whether FEAT listed a feature whose first word is `name`.
    pub fn has_feature(&self, name: &str) -> bool {
        self.features
            .iter()
            .any(|f| f.split_whitespace().next() == Some(name))
    }

    /// The number after a feature's name (`BRAID 2` gives 2), if FEAT listed it with one.
    pub fn feature_version(&self, name: &str) -> Option<u32> {
        self.features.iter().find_map(|f| {
            let mut words = f.split_whitespace();
            (words.next() == Some(name))
                .then(|| words.next()?.parse().ok())
                .flatten()
        })
    }

    /// Opens a passive data connection: EPSV first (it works through NAT and over IPv6), PASV
    /// if the server lacks it. Connects to the control connection's peer whatever address a 227
    /// names, which defeats both private-address replies and bounce tricks.
    pub fn open_data(&mut self) -> Result<TcpStream> {
        let addr = self.passive_addr()?;
        connect_data(addr)
    }

    /// Listens on the control connection's local address and tells the server to connect
    /// there (EPRT, or PORT if the server lacks EPRT): for MODE E downloads from GridFTP
    /// servers, where the sender must open the connections.
    pub fn active_listener(&mut self) -> Result<std::net::TcpListener> {
        let local = self
            .stream
            .tcp()
            .local_addr()
            .map_err(|e| ClientError::Local {
                what: "control connection address".into(),
                cause: e,
            })?;
        let listener =
            std::net::TcpListener::bind(SocketAddr::new(local.ip(), 0)).map_err(|e| {
                ClientError::Local {
                    what: "cannot listen for data connections".into(),
                    cause: e,
                }
            })?;
        let addr = listener.local_addr().map_err(|e| ClientError::Local {
            what: "data listener address".into(),
            cause: e,
        })?;
        let r = self.cmd(&Command::Eprt(addr))?;
        if r.code != 200 {
            let SocketAddr::V4(v4) = addr else {
                return Err(ClientError::Remote {
                    what: "EPRT".into(),
                    reply: r,
                });
            };
            self.expect(&Command::Port(v4), &[200])?;
        }
        Ok(listener)
    }

    /// EPSV (or PASV): the address at which the server listens for data connections.
    pub fn passive_addr(&mut self) -> Result<SocketAddr> {
        let port = if self.no_epsv {
            None
        } else {
            let r = self.cmd(&Command::Epsv(braid_proto::command::EpsvArg::Default))?;
            match r.code {
                229 => Some(
                    addr::parse_229(&r.text())
                        .map_err(|e| ClientError::Protocol(format!("bad 229 reply {r}: {e}")))?,
                ),
                500 | 501 | 502 | 504 | 522 => {
                    self.no_epsv = true;
                    None
                }
                _ => {
                    return Err(ClientError::Remote {
                        what: "EPSV".into(),
                        reply: r,
                    });
                }
            }
        };
        let port = match port {
            Some(p) => p,
            None => {
                let r = self.expect(&Command::Pasv, &[227])?;
                addr::parse_227(&r.text())
                    .map_err(|e| ClientError::Protocol(format!("bad 227 reply {r}: {e}")))?
                    .port()
            }
        };
        Ok(SocketAddr::new(self.peer.ip(), port))
    }

    /// REST, sent right before the transfer command as RFC 3659 asks.
    pub fn restart_at(&mut self, offset: u64) -> Result<()> {
        let r = self.cmd(&Command::Rest(offset))?;
        if r.code == 350 {
            Ok(())
        } else {
            Err(ClientError::Remote {
                what: format!("REST {offset} (the server cannot resume)"),
                reply: r,
            })
        }
    }

    /// Sends a transfer command after the data connection is open and waits for 125/150.
    pub fn start_transfer(&mut self, cmd: &Command) -> Result<Reply> {
        self.send(cmd)?;
        self.transfer_started(cmd)
    }

    /// Waits for 125/150 after a transfer command that was already sent.
    pub fn transfer_started(&mut self, cmd: &Command) -> Result<Reply> {
        let r = self.reply()?;
        match r.code {
            125 | 150 => Ok(r),
            _ => Err(ClientError::Remote {
                what: cmd_for_error(cmd),
                reply: r,
            }),
        }
    }

    /// The final reply of a transfer (226 or 250 on success).
    pub fn finish_transfer(&mut self, cmd: &Command) -> Result<Reply> {
        let r = self.final_reply()?;
        if r.code == 226 || r.code == 250 {
            Ok(r)
        } else {
            Err(ClientError::Remote {
                what: cmd_for_error(cmd),
                reply: r,
            })
        }
    }

    /// The next reply that is not a mark (1xx): GridFTP servers send 111/112 markers meanwhile.
    pub fn final_reply(&mut self) -> Result<Reply> {
        loop {
            let r = self.reply()?;
            if !r.is_preliminary() {
                return Ok(r);
            }
        }
    }

    /// Like `final_reply`, but gives up (None) when `stop` turns true, checked every 100 ms:
    /// a user's Ctrl-C while the server finishes an upload must not be swallowed.
    pub fn final_reply_unless(&mut self, stop: impl Fn() -> bool) -> Result<Option<Reply>> {
        let mut heard = std::time::Instant::now();
        loop {
            while let Some(r) = match self.pending.pop_front() {
                Some(r) => Some(r),
                None => self.parsed()?,
            } {
                if !r.is_preliminary() {
                    return Ok(Some(r));
                }
            }
            if stop() {
                return Ok(None);
            }
            let tcp = self.stream.tcp();
            let _ = tcp.set_read_timeout(Some(Duration::from_millis(100)));
            let read = self.read_some();
            let _ = self.stream.tcp().set_read_timeout(Some(REPLY_TIMEOUT));
            match read {
                Err(ReadError::Io(e)) if is_timeout(&e) && heard.elapsed() < REPLY_TIMEOUT => {}
                Err(ReadError::Io(e)) if is_timeout(&e) => {
                    return Err(ClientError::Protocol(format!(
                        "no reply from the server for {} s",
                        REPLY_TIMEOUT.as_secs()
                    )));
                }
                r => {
                    r?;
                    heard = std::time::Instant::now();
                }
            }
        }
    }

    /// AUTH TLS, then PBSZ 0 and PROT P (RFC 4217): the control connection and every data
    /// connection are TLS from here on.
    pub fn start_tls(&mut self, config: &Arc<rustls::ClientConfig>, host: &str) -> Result<()> {
        let r = self.cmd(&Command::Auth("TLS".into()))?;
        if r.code != 234 {
            return Err(ClientError::Remote {
                what: "AUTH TLS (the server offers no TLS; drop --tls to go on in clear)".into(),
                reply: r,
            });
        }
        let Wire::Clear(sock) = &self.stream else {
            return Err(ClientError::Protocol("TLS is already on".into()));
        };
        let sock = sock
            .try_clone()
            .map_err(|e| ClientError::Protocol(format!("TLS setup: {e}")))?;
        self.stream = Wire::tls(sock, config, host)?;
        self.tls = Some((config.clone(), host.to_string()));
        self.expect(&Command::Pbsz(0), &[200])?;
        self.expect(&Command::Prot('P'), &[200])?;
        Ok(())
    }

    /// A data connection as this session protects it: TLS after `start_tls`.
    pub fn protect(&self, sock: TcpStream) -> Result<Wire> {
        match &self.tls {
            Some((config, host)) => Wire::tls(sock, config, host),
            None => Ok(Wire::Clear(sock)),
        }
    }

    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn quit(mut self) {
        let _ = self.cmd(&Command::Quit);
    }
}

fn cmd_for_error(cmd: &Command) -> String {
    match cmd {
        Command::Pass(_) => "PASS".into(),
        c => c.to_line(),
    }
}

/// Opens one data connection to `addr`, with the reply timeout as its read/write limit.
pub fn connect_data(addr: SocketAddr) -> Result<TcpStream> {
    let s =
        TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| ClientError::Connect {
            addr: format!("data connection {addr}"),
            cause: e,
        })?;
    s.set_read_timeout(Some(REPLY_TIMEOUT)).ok();
    s.set_write_timeout(Some(REPLY_TIMEOUT)).ok();
    Ok(s)
}

/// Why reading the control connection stopped.
enum ReadError {
    Io(std::io::Error),
    Closed,
}

impl From<ReadError> for ClientError {
    fn from(e: ReadError) -> ClientError {
        ClientError::Protocol(match e {
            ReadError::Io(e) => format!("reading reply: {e}"),
            ReadError::Closed => "server closed the control connection".into(),
        })
    }
}

/// A read timeout shows as WouldBlock or TimedOut depending on the platform.
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A control connection to a scripted server that sends `script` after its greeting.
    fn scripted(script: &'static [u8]) -> (Control, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"220 hi\r\n").unwrap();
            s.write_all(script).unwrap();
            // Hold the connection open until the client is done.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        });
        let target = Target {
            host: "127.0.0.1".into(),
            port,
            user: "anonymous".into(),
            password: String::new(),
            path: String::new(),
        };
        (Control::connect(&target).unwrap(), server)
    }

    #[test]
    fn the_wait_for_a_final_reply_skips_marks_and_stops_on_request() {
        let (mut c, server) = scripted(b"111 Range Marker 0-10\r\n226 Done.\r\n");
        let r = c.final_reply_unless(|| false).unwrap().unwrap();
        assert_eq!(r.code, 226);
        assert!(c.stored().covers(0, 10));
        // The usual reply timeout is back for the next reads.
        assert_eq!(c.stream.tcp().read_timeout().unwrap(), Some(REPLY_TIMEOUT));

        // A server that says nothing: the wait ends when asked to, not on its own.
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
        });
        let r = c
            .final_reply_unless(|| stop.load(Ordering::SeqCst))
            .unwrap();
        assert!(r.is_none(), "{r:?}");
        setter.join().unwrap();
        drop(c);
        server.join().unwrap();
    }
}
