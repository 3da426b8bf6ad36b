//! The client's control connection: send commands, read replies, open data connections.

use super::channel::{Channel, Piped};
use super::detour::{DataAddr, Detour};
use super::error::{ClientError, Result};
use super::summary::Summary;
use super::url::Target;
use super::wire::Wire;
use crate::engine::hooks::Tell;
use crate::engine::tls::{Binding, DataConn, DataTls, SecureError};
use braid_proto::client::{BlockPeer, ClientSession, Direction, Failure, Op, Outcome};
use braid_proto::ranges::RangeSet;
use braid_proto::{Command, Reply, ReplyParser};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait for a reply before calling the server unresponsive.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The round trip assumed where the kernel has not measured one yet.
pub const ASSUMED_RTT: Duration = Duration::from_millis(100);

pub struct Control {
    stream: Channel,
    parser: ReplyParser,
    peer: SocketAddr,
    pub verbose: bool,
    /// `--compress on`: stream transfers and listings in MODE Z where the server offers it.
    pub deflate: bool,
    /// The protocol: which command to send next, what each reply means, what the server has
    /// in effect. This type only moves bytes for it.
    session: ClientSession,
    /// Replies read ahead by [`Control::poll`], not yet handed out.
    pending: VecDeque<Reply>,
    /// After AUTH TLS: how data connections are protected too.
    tls: Option<Protection>,
    /// Under GSI (`gsiftp://`): how data connections are authenticated (DCAU A).
    gsi_data: Option<Arc<crate::engine::gsi_data::GsiData>>,
    /// Who logged in, for error messages.
    user: String,
    /// MODE E data connections the last transfer left open (the session knows which way).
    data: Vec<DataConn>,
    /// Pipelined ops begun ahead whose outcomes are read as they come up, before the next
    /// op's (each by its id, with what to call it in an error).
    deferred: VecDeque<(u64, Option<String>)>,
    /// Read with the login (pipelined): SIZE of a path, and a passive port.
    early_size: Option<(String, Reply)>,
    early_passive: Option<u16>,
    /// EPSV sent ahead ([`Control::passive_ahead`]), its answer not yet read.
    passive_asked: bool,
    /// CKSM asked for behind the running transfer (algorithm, path), and its answer once
    /// read with the transfer's end.
    checksum_after: Option<(String, String)>,
    early_checksum: Option<(String, String, Option<String>)>,
    /// TREV RESTART 1 was sent: a GridFTP server keeps it for the session.
    range_markers_asked: bool,
    /// The greeting was a braid server's, whose passive listener outlives a change of MODE:
    /// EPSV can go with the login. (The Globus server drops it at MODE E: a STOR there found
    /// nothing listening.)
    braid_greeting: bool,
    /// The certificate a one-shot server's greeting named (`braid serve --stdio`).
    pinned: Option<[u8; 32]>,
    /// The one-shot server takes the ClientHello right behind AUTH TLS.
    tls_ahead: bool,
    /// Where data connections go when they cannot reach the server (`braid cp`: through
    /// ssh's channel).
    detour: Option<Arc<Detour>>,
    /// The address a one-shot server's data connections listen on, as its greeting named it:
    /// where ssh connects to from the far side when the data goes round.
    far_data_ip: Option<std::net::IpAddr>,
}

/// What AUTH TLS set up: the settings and name the server's certificate was checked with,
/// and the session's binding for MODE E data connections.
struct Protection {
    config: Arc<rustls::ClientConfig>,
    host: String,
    binding: Option<Binding>,
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
                    return Control::greeted(Channel::Net(Wire::Clear(stream)), a, &name);
                }
                Err(e) => last = e,
            }
        }
        Err(fail(last))
    }

    /// A session with the far side `command` starts and speaks to on its standard input and
    /// output (ssh running `braid serve --stdio`); its data connections go to `data_host`,
    /// the machine ssh reached. `name` says what was run, for errors; what it writes to its
    /// standard error goes on to ours, its last words kept in `said`.
    pub fn over_child(
        mut command: std::process::Command,
        data_host: std::net::IpAddr,
        name: &str,
        said: &super::channel::Said,
    ) -> Result<Control> {
        let local = |what: &str, e: std::io::Error| ClientError::Local {
            what: format!("{what} for {name}"),
            cause: e,
        };
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| local("a socket pair", e))?;
        let input: std::os::fd::OwnedFd = theirs
            .try_clone()
            .map_err(|e| local("a socket pair", e))?
            .into();
        let mut child = command
            .stdin(std::process::Stdio::from(input))
            .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                theirs,
            )))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| ClientError::Connect {
                addr: name.to_string(),
                cause: e,
            })?;
        if let Some(words) = child.stderr.take() {
            said.tee(words);
        }
        // The command holds the child's ends of the pair: while they are open here, a child
        // that exits would never be seen to close.
        drop(command);
        ours.set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| local("a socket pair", e))?;
        let piped = Piped::new(ours, child);
        Control::greeted(Channel::Child(piped), SocketAddr::new(data_host, 0), name)
    }

    /// The session on `stream`, once the server (`name`, at `peer`) has greeted it.
    fn greeted(stream: Channel, peer: SocketAddr, name: &str) -> Result<Control> {
        let mut c = Control {
            stream,
            parser: ReplyParser::new(),
            peer,
            verbose: false,
            deflate: false,
            session: ClientSession::new(),
            pending: VecDeque::new(),
            tls: None,
            gsi_data: None,
            user: String::new(),
            data: Vec::new(),
            deferred: VecDeque::new(),
            early_size: None,
            early_passive: None,
            passive_asked: false,
            checksum_after: None,
            early_checksum: None,
            range_markers_asked: false,
            braid_greeting: false,
            pinned: None,
            tls_ahead: false,
            detour: None,
            far_data_ip: None,
        };
        let greeting = c.greeting(name)?;
        if greeting.code != 220 {
            return Err(ClientError::Remote {
                what: "the connection".into(),
                reply: greeting,
            });
        }
        // A braid server says so in its greeting, and reads pipelined commands in order, as
        // the Globus GridFTP server does: the dialogue then costs a round trip per phase, not
        // per command.
        c.session
            .set_pipeline(braid_proto::session::reads_pipelined(&greeting));
        c.braid_greeting = braid_proto::session::is_braid_greeting(&greeting);
        c.pinned = braid_proto::session::pinned_certificate(&greeting);
        c.tls_ahead = braid_proto::session::takes_tls_ahead(&greeting);
        c.far_data_ip = braid_proto::session::data_address(&greeting);
        Ok(c)
    }

    /// The SHA-256 of the certificate a one-shot server's greeting named: over ssh's channel,
    /// the one to trust for this session's TLS.
    pub fn pinned_certificate(&self) -> Option<[u8; 32]> {
        self.pinned
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The SHA-256 of the certificate the server showed on the control connection (after
    /// `start_tls`): what a third party is told to expect of it.
    pub fn server_certificate(&self) -> Option<[u8; 32]> {
        match &self.stream {
            Channel::Net(Wire::Client(s, _)) => {
                let der = s.conn.peer_certificates()?.first()?;
                Some(crate::engine::tls::fingerprint(der))
            }
            _ => None,
        }
    }

    /// The secret MODE E data connections of this session prove (after `start_tls`).
    pub fn binding(&self) -> Option<Binding> {
        self.tls.as_ref()?.binding
    }

    /// The control connection's TCP socket (for `TCP_INFO`); None over a child's pipe.
    pub fn socket(&self) -> Option<&TcpStream> {
        self.stream.tcp()
    }

    /// The control connection's lowest round trip, when the kernel has one.
    pub fn min_rtt(&self) -> Option<Duration> {
        braid_sockopt::tcp_info(self.socket()?)
            .map(|i| i.min_rtt_us)
            .filter(|&us| us > 0)
            .map(|us| Duration::from_micros(us.into()))
    }

    /// The path's round trip where one must be assumed (a background transfer's first base
    /// delay, the choice of its congestion control): the measured one, else [`ASSUMED_RTT`].
    pub fn path_rtt(&self) -> Duration {
        self.min_rtt().unwrap_or(ASSUMED_RTT)
    }

    pub fn set_verbose(&mut self, v: bool) {
        self.verbose = v;
    }

    /// The server's first final reply. Nothing, or something other than an FTP reply, means
    /// the port is not an FTP server's (or the server turned the connection away unsaid).
    fn greeting(&mut self, name: &str) -> Result<Reply> {
        let not_ftp = |why: String| {
            ClientError::Protocol(format!(
                "{name} {why}: is it an FTP server, and the right port? (a server at its connection limit may also close at once)"
            ))
        };
        loop {
            let r = self.reply_or_end().map_err(|e| match e {
                ReadError::Closed => not_ftp("closed the connection before greeting".into()),
                ReadError::Io(e) if is_timeout(&e) => {
                    not_ftp(format!("sent no greeting in {} s", REPLY_TIMEOUT.as_secs()))
                }
                ReadError::Io(e) => not_ftp(format!("broke the connection before greeting ({e})")),
                ReadError::Other(e) => not_ftp(format!("did not greet as FTP servers do ({e})")),
            })?;
            if !r.is_preliminary() {
                return Ok(r);
            }
        }
    }

    /// Reads the next reply, whatever its code.
    pub fn reply(&mut self) -> Result<Reply> {
        self.reply_or_end().map_err(ClientError::from)
    }

    /// The next reply, or why there is none.
    fn reply_or_end(&mut self) -> std::result::Result<Reply, ReadError> {
        if let Some(r) = self.pending.pop_front() {
            return Ok(r);
        }
        loop {
            if let Some(r) = self.parsed().map_err(ReadError::Other)? {
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
            .set_nonblocking(true)
            .map_err(|e| ClientError::ControlLost(format!("polling replies: {e}")))?;
        let read = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => self.parser.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(ClientError::ControlLost(format!("reading reply: {e}"))),
            }
        };
        let _ = self.stream.set_nonblocking(false);
        read?;
        while let Some(r) = self.parsed()? {
            self.pending.push_back(r);
        }
        Ok(())
    }

    /// Whether a refusal (4xx, 5xx) came in among the replies [`Control::poll`] read: during
    /// an upload it means the server stopped taking data (its disk is full, say), so sending
    /// on is pointless, and may block for good on connections it no longer reads.
    pub fn refused_meanwhile(&self) -> bool {
        self.pending.iter().any(|r| r.code >= 400)
    }

    /// The next complete reply in the parser, noting range markers on the way.
    /// Answers to background mode's probes are taken here, so that no reader mistakes one
    /// for the reply it waits for.
    fn parsed(&mut self) -> Result<Option<Reply>> {
        loop {
            let r = self
                .parser
                .next_reply()
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            if let Some(r) = &r {
                if self.verbose {
                    eprintln!("< {r}");
                }
                self.session.note(r);
                if self.session.answers_probe(r) {
                    continue;
                }
            }
            return Ok(r);
        }
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
        self.session.reset_stored(have);
    }

    /// What the server's range markers say it has stored.
    pub fn stored(&self) -> &RangeSet {
        self.session.stored()
    }

    /// The protocol state of this control connection.
    pub fn session(&mut self) -> &mut ClientSession {
        &mut self.session
    }

    /// Starts an op of the client session: sends its first command (pipelined: all of them).
    pub fn begin(&mut self, op: Op) -> Result<()> {
        self.session.begin(op);
        self.send_queued()
    }

    /// Sends what the session has queued, in one write (one segment for a pipelined batch).
    fn send_queued(&mut self) -> Result<()> {
        let cmds: Vec<Command> = std::iter::from_fn(|| self.session.poll_command()).collect();
        self.write_commands(&cmds)
    }

    /// Writes commands to the server in one write, showing them with `-v`.
    fn write_commands(&mut self, cmds: &[Command]) -> Result<()> {
        let Some(last) = cmds.last() else {
            return Ok(());
        };
        let mut out = Vec::new();
        for cmd in cmds {
            self.show(cmd);
            cmd.encode(&mut out);
        }
        match self
            .stream
            .write_all(&out)
            .and_then(|()| self.stream.flush())
        {
            Ok(()) => Ok(()),
            // The server closed the connection, most likely right after saying why (vsftpd's
            // 530 to a login in clear that it requires over TLS, a 421): that reply is what
            // the user needs, and it is read next, in turn, before the close is noticed.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                if self.verbose {
                    eprintln!("! sending {}: {e}", last.verb());
                }
                Ok(())
            }
            Err(e) => Err(ClientError::ControlLost(format!(
                "sending {}: {e}",
                last.verb()
            ))),
        }
    }

    /// Whether every request sent has been answered and read: a session left otherwise by a
    /// failure in the middle of a transfer (a local file that could not be written) would
    /// take the replies still coming for the next file's.
    pub fn in_step(&self) -> bool {
        self.session.oldest().is_none()
    }

    /// Starts an op whose outcome can wait: pipelined, it is read when its turn comes, just
    /// before the next outcome anyone asks for (its commands go out with the next ones);
    /// otherwise it runs now.
    pub fn later(&mut self, op: Op, what: Option<String>) -> Result<()> {
        let id = self.session.begin(op);
        self.send_queued()?;
        if self.session.pipelining() {
            self.deferred.push_back((id, what));
            Ok(())
        } else {
            self.finished(what).map(drop)
        }
    }

    /// Starts ops whose outcomes can wait, their commands in one write: pipelined, each is
    /// read when its turn comes, as with [`Control::later`]; otherwise they run now, in turn.
    pub fn later_all(&mut self, ops: impl IntoIterator<Item = Op>) -> Result<()> {
        let ids: Vec<u64> = ops.into_iter().map(|op| self.session.begin(op)).collect();
        self.send_queued()?;
        if self.session.pipelining() {
            self.deferred.extend(ids.into_iter().map(|id| (id, None)));
            return Ok(());
        }
        for _ in ids {
            self.finished(None)?;
        }
        Ok(())
    }

    /// Carries the running op to its end: reads replies, sends what the session asks next.
    fn finish(&mut self) -> std::result::Result<Outcome, Failure> {
        loop {
            if let Some(o) = self.session.poll_outcome() {
                return o;
            }
            let r = match self.reply_or_end() {
                Ok(r) => r,
                Err(ReadError::Closed) => {
                    self.session.handle_closed();
                    continue;
                }
                Err(e) => return Err(Failure::Protocol(ClientError::from(e).to_string())),
            };
            self.session.handle_reply(r);
            self.send_queued()
                .map_err(|e| Failure::Protocol(e.to_string()))?;
        }
    }

    /// Tells the server what changed for the running download: a new cap (`MaxRate=`), a
    /// congestion control (`Congestion=`); its answer is read with the transfer's end.
    pub fn tell(&mut self, tell: Tell) -> Result<()> {
        if tell == Tell::default() {
            return Ok(());
        }
        let cmd = self.session.change_sending(tell.rate, tell.congestion);
        self.send(&cmd)
    }

    /// Begins ops together, where the server reads pipelined commands in order (a braid
    /// server queues those that come during a transfer): their commands go out in one write.
    /// [`Control::outcome`] then reads how each ended, in turn.
    pub fn begin_all(&mut self, ops: impl IntoIterator<Item = Op>) -> Result<()> {
        for op in ops {
            self.session.begin(op);
        }
        self.send_queued()
    }

    /// How the oldest op begun and not yet read ended; `what` names it in errors.
    pub fn outcome(&mut self, what: Option<String>) -> Result<Outcome> {
        self.finished(what)
    }

    /// Runs one op of the client session to its end.
    pub fn run(&mut self, op: Op) -> Result<Outcome> {
        self.begin(op)?;
        self.finished(None)
    }

    /// The end of the oldest op not yet read; `what` names the request in errors better than
    /// its verb. Ops begun with [`Control::later`] are read where they stand among the
    /// others, so one begun behind ops still running waits for them.
    fn finished(&mut self, what: Option<String>) -> Result<Outcome> {
        if self.session.oldest().is_none() {
            // Nothing asked: no reply can end the wait.
            return Err(ClientError::Protocol(
                "waited for the answer to nothing (a bug in braid)".into(),
            ));
        }
        self.read_deferred()?;
        self.finish().map_err(|f| self.error(f, what))
    }

    /// Reads the outcomes of ops begun with [`Control::later`] that are the oldest still
    /// running: before a reply read past the session (a transfer's end), they must be taken
    /// first.
    pub fn read_deferred(&mut self) -> Result<()> {
        while let Some(&(id, _)) = self.deferred.front()
            && self.session.oldest() == Some(id)
        {
            let before = self.deferred.pop_front().and_then(|(_, w)| w);
            self.finish().map_err(|f| self.error(f, before))?;
        }
        Ok(())
    }

    /// The client error for a failed op; `what` names the request better than its verb.
    fn error(&self, f: Failure, what: Option<String>) -> ClientError {
        match f {
            Failure::Login(reply) => ClientError::Login {
                user: self.user.clone(),
                reply,
            },
            Failure::Refused { what: verb, reply } | Failure::Transient { what: verb, reply } => {
                ClientError::Remote {
                    what: what.unwrap_or(verb),
                    reply,
                }
            }
            Failure::NoSpace(reply) => ClientError::Remote {
                what: what.unwrap_or_else(|| "the request (no space)".into()),
                reply,
            },
            Failure::Integrity(reply) => {
                ClientError::Integrity(format!("the server's integrity check failed: {reply}"))
            }
            Failure::Protocol(why) => ClientError::Protocol(why),
            f @ Failure::Closed { .. } => ClientError::ControlLost(f.to_string()),
        }
    }

    fn show(&self, cmd: &Command) {
        if self.verbose {
            match cmd {
                Command::Pass(_) => eprintln!("> PASS ****"),
                c => eprintln!("> {}", c.to_line()),
            }
        }
    }

    pub fn send(&mut self, cmd: &Command) -> Result<()> {
        self.write_commands(std::slice::from_ref(cmd))
    }

    /// Sends a command and returns its final reply (skipping 1xx ones), whatever its code.
    pub fn cmd(&mut self, cmd: &Command) -> Result<Reply> {
        self.run(Op::Ask(cmd.clone())).and_then(done)
    }

    /// Sends a command that must succeed with one of `ok`.
    pub fn expect(&mut self, cmd: &Command, ok: &[u16]) -> Result<Reply> {
        self.begin(Op::Simple {
            cmd: cmd.clone(),
            ok: ok.to_vec(),
        })?;
        self.finished(Some(cmd_for_error(cmd))).and_then(done)
    }

    /// Logs in, reads FEAT and sets TYPE I. Pipelined (a braid or Globus server), these go in
    /// one flight with SIZE of `size_of` (and EPSV to a braid server), whose answers are kept
    /// for [`Control::size`] and [`Control::passive_addr`]: one round trip for all of it.
    pub fn start(&mut self, target: &Target, size_of: Option<&str>) -> Result<()> {
        self.user = target.user.clone();
        let login = Op::Login {
            user: target.user.clone(),
            password: target.password.clone(),
        };
        if !self.session.pipelining() {
            // FEAT once; servers without it just have no features.
            for op in [login, Op::Features, Op::Binary] {
                self.run(op)?;
            }
            return Ok(());
        }
        self.begin(login)?;
        self.begin(Op::Features)?;
        self.begin(Op::Binary)?;
        if let Some(path) = size_of {
            self.begin(Op::Ask(Command::Size(path.into())))?;
        }
        if self.braid_greeting {
            self.begin(Op::Passive)?;
        }
        // Outcomes come in the order the ops began.
        for _ in 0..3 {
            self.finished(None)?;
        }
        if let Some(path) = size_of {
            let r = self.finished(None).and_then(done)?;
            self.early_size = Some((path.into(), r));
        }
        if self.braid_greeting {
            match self.finished(None)? {
                Outcome::Passive(port) => self.early_passive = Some(port),
                o => return Err(unexpected(o)),
            }
        }
        Ok(())
    }

    /// SIZE of a file: the reply (whatever its code).
    pub fn size(&mut self, path: &str) -> Result<Reply> {
        match self.early_size.take() {
            Some((p, r)) if p == path => Ok(r),
            _ => self.cmd(&Command::Size(path.into())),
        }
    }

    /// Takes a file's size from a listing (MLSD's exact `size` fact), so that [`Control::size`]
    /// need not ask: a tree transfer saves a round trip per file. A file that changed since
    /// is caught by the transfer's own checks (the checksum, the length).
    pub fn know_size(&mut self, path: &str, size: u64) {
        self.early_size = Some((path.into(), Reply::new(213, size.to_string())));
    }

    /// Whether FEAT listed a feature whose first word is `name`.
    pub fn has_feature(&self, name: &str) -> bool {
        self.session.features().has(name)
    }

    /// A braid front end whose data nodes take private data (FEAT `BRAID-STRIPED P`).
    pub fn striped_private(&self) -> bool {
        self.session.features().striped_private()
    }

    /// A Globus front end with remote data nodes (FEAT `DSI remote-…`).
    pub fn gridftp_striped(&self) -> bool {
        self.session.features().gridftp_striped()
    }

    /// MODE Z for the next stream transfer or listing, when `--compress on` asked for it and
    /// FEAT lists it; whether it is in effect. Undone after it ([`Control::plain_again`]), so
    /// that the session's other transfers stay as they are. `auto` leaves it off: a zlib
    /// stream cannot change its mind midway, and deflate is slower than most paths worth
    /// compressing for. Never with a MODE E server (braid, GridFTP): its files go compressed
    /// in blocks, and a MODE change would end the MODE E the session keeps in effect.
    pub fn deflate_next(&mut self) -> Result<bool> {
        let features = self.session.features();
        if !self.deflate || !features.mode_z() || features.block_peer().is_some() {
            return Ok(false);
        }
        let r = self.cmd(&Command::Mode(braid_proto::command::Mode::Deflate))?;
        Ok(r.code == 200)
    }

    /// MODE S again after a transfer in MODE Z.
    pub fn plain_again(&mut self) -> Result<()> {
        self.expect(&Command::Mode(braid_proto::command::Mode::Stream), &[200])
            .map(drop)
    }

    /// The kind of MODE E server this is, from its FEAT.
    pub fn block_peer(&self) -> Option<BlockPeer> {
        self.session.features().block_peer()
    }

    /// Whether the server's FEAT lists `alg` for CKSM.
    pub fn checksum_offered(&self, alg: &str) -> bool {
        self.session.features().checksum_offered(alg)
    }

    /// Opens a passive data connection: EPSV first (it works through NAT and over IPv6), PASV
    /// if the server lacks it. Connects to the control connection's peer whatever address a 227
    /// names, which defeats both private-address replies and bounce tricks.
    ///
    /// A striped Globus front end is the exception: its PASV names the data node that will
    /// serve the connection, another host than the front end, so its address is taken as
    /// given (the server chose where its own data comes from; the client only reads).
    pub fn open_data(&mut self) -> Result<TcpStream> {
        let addr = match self.gridftp_striped() {
            true => self.node_passive()?,
            false => self.passive_addr()?,
        };
        connect_data(&addr)
    }

    /// Starts `cmd`, whose data goes on `data` (from [`Control::open_data`]): its 125/150,
    /// then the connection as this session protects it.
    pub fn start_on(&mut self, data: TcpStream, cmd: &Command) -> Result<Wire> {
        self.send_transfer(cmd)?;
        self.started_authenticating(cmd, &[&data])?;
        self.protect(data)
    }

    /// Waits for the 125/150 of `cmd` (sent), whose data goes on `socks`; true if on the
    /// connections the last transfer left open (125). Under GSI each of `socks` runs GSI's
    /// handshake meanwhile, as the server answers only once they are done; a refusal instead
    /// shuts them, which ends their handshakes, and is the error.
    pub fn started_authenticating(&mut self, cmd: &Command, socks: &[&TcpStream]) -> Result<bool> {
        let Some(gsi) = self.gsi_data.clone() else {
            return self.transfer_started(cmd);
        };
        let shaking = socks
            .iter()
            .map(|s| s.try_clone())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| ClientError::Tls(format!("GSI setup: {e}")))?;
        let (started, shaken) = std::thread::scope(|s| {
            let handshakes: Vec<_> = shaking
                .into_iter()
                .map(|mut sock| {
                    let gsi = gsi.clone();
                    s.spawn(move || gsi.initiate(&mut sock))
                })
                .collect();
            let started = self.transfer_started(cmd);
            if started.is_err() {
                for sock in socks {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            }
            let shaken: Vec<_> = handshakes.into_iter().map(|h| h.join()).collect();
            (started, shaken)
        });
        let reused = started?;
        for r in shaken {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(ClientError::Tls(format!(
                        "data connection: GSI authentication (DCAU A) failed: {e}"
                    )));
                }
                Err(_) => return Err(ClientError::Tls("a GSI handshake's thread failed".into())),
            }
        }
        Ok(reused)
    }

    /// PASV to a striped Globus front end: the data node its reply names.
    fn node_passive(&mut self) -> Result<DataAddr> {
        self.data.clear();
        self.early_passive = None;
        let r = self.expect(&Command::Pasv, &[227])?;
        let target = braid_proto::addr::parse_227(&r.text())
            .map(SocketAddr::V4)
            .map_err(|e| ClientError::Protocol(format!("bad 227 reply {r}: {e}")))?;
        Ok(DataAddr {
            target,
            round: target,
            detour: None,
        })
    }

    /// Whether MLST says `path` is a directory (false when it cannot tell).
    pub fn is_directory(&mut self, path: &str) -> bool {
        self.cmd(&Command::Mlst(Some(path.to_string())))
            .is_ok_and(|r| r.code == 250 && r.text().to_ascii_lowercase().contains("type=dir;"))
    }

    /// Listens on the control connection's local address and tells the server to connect
    /// there (EPRT, or PORT if the server lacks EPRT): for MODE E downloads from GridFTP
    /// servers, where the sender must open the connections.
    pub fn active_listener(&mut self) -> Result<std::net::TcpListener> {
        let listener = self.data_listener()?;
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

    /// SPOR to a striped server: `stripes` listeners, one per stripe, which the server's data
    /// nodes connect to (GridFTP has a striped server send only to SPOR, never over SPAS).
    pub fn striped_active(&mut self, stripes: usize) -> Result<Vec<std::net::TcpListener>> {
        let listeners = (0..stripes)
            .map(|_| self.data_listener())
            .collect::<Result<Vec<_>>>()?;
        let addrs = listeners
            .iter()
            .map(|l| match l.local_addr() {
                Ok(SocketAddr::V4(a)) => Ok(a),
                Ok(_) => Err(ClientError::Protocol(
                    "SPOR takes IPv4 addresses only; connect to the server over IPv4".into(),
                )),
                Err(e) => Err(ClientError::Local {
                    what: "data listener address".into(),
                    cause: e,
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        self.expect(&Command::Spor(addrs), &[200])?;
        Ok(listeners)
    }

    /// A listener for data connections beside the control connection's own address.
    fn data_listener(&mut self) -> Result<std::net::TcpListener> {
        self.data.clear();
        self.session.set_cached(None);
        let Some(tcp) = self.stream.tcp() else {
            return Err(ClientError::Protocol(
                "active data connections need a TCP control connection to listen beside".into(),
            ));
        };
        let local = tcp.local_addr().map_err(|e| ClientError::Local {
            what: "control connection address".into(),
            cause: e,
        })?;
        std::net::TcpListener::bind(SocketAddr::new(local.ip(), 0)).map_err(|e| {
            ClientError::Local {
                what: "cannot listen for data connections".into(),
                cause: e,
            }
        })
    }

    /// Keeps the data connections a MODE E transfer left open (EOD without CLOSE) for the
    /// next transfer this way.
    pub fn keep_data_connections(&mut self, direction: Direction, socks: Vec<DataConn>) {
        self.session
            .set_cached((!socks.is_empty()).then_some(direction));
        self.data = socks;
    }

    /// Asks a GridFTP server for range markers every second instead of every 5 (less to resend
    /// after a break), once a session: the Globus server keeps it for the session. Others may
    /// refuse TREV, which changes nothing.
    pub fn range_markers_every_second(&mut self) {
        if self.range_markers_asked {
            return;
        }
        let trev = Command::Unknown {
            verb: "TREV".into(),
            arg: Some("RESTART 1".into()),
        };
        let _ = self.cmd(&trev);
        self.range_markers_asked = true;
    }

    /// How many data connections the last transfer left open.
    pub fn kept_connections(&self) -> u32 {
        self.data.len() as u32
    }

    /// The data connections kept by [`Control::keep_data_connections`].
    pub fn take_data_connections(&mut self) -> Vec<DataConn> {
        self.session.set_cached(None);
        std::mem::take(&mut self.data)
    }

    /// EPSV (or PASV): the address at which the server listens for data connections. The
    /// control connection's peer, whatever address a 227 names, which defeats both
    /// private-address replies and bounce tricks.
    pub fn passive_addr(&mut self) -> Result<DataAddr> {
        // The server drops the connections it kept open: so do we.
        self.data.clear();
        if let Some(port) = self.early_passive.take() {
            return Ok(self.data_addr(port));
        }
        if !std::mem::take(&mut self.passive_asked) {
            self.begin(Op::Passive)?;
        }
        self.passive_answer()
    }

    /// Reads the answer to an EPSV sent ahead that no transfer will use (its bundle was
    /// refused), so that the session stays in step.
    pub fn settle_passive_ahead(&mut self) -> Result<()> {
        if std::mem::take(&mut self.passive_asked) {
            self.passive_answer()?;
        }
        Ok(())
    }

    /// Sends EPSV (or PASV) now, behind what is out, for the next [`Control::passive_addr`]
    /// to read: its answer then comes with theirs, not a round trip later.
    pub fn passive_ahead(&mut self) -> Result<()> {
        if self.early_passive.is_some() || self.passive_asked {
            return Ok(());
        }
        self.data.clear();
        self.begin(Op::Passive)?;
        self.passive_asked = true;
        Ok(())
    }

    /// SPAS to a striped server: one address per data node, in stripe order. The nodes are
    /// other hosts than the control connection's peer, named by the server.
    pub fn striped_passive(&mut self) -> Result<Vec<DataAddr>> {
        self.data.clear();
        // The EPSV sent ahead at login (its listener on the front end goes unused).
        if self.early_passive.take().is_some() {
            tracing::debug!("SPAS replaces the passive address asked for at login");
        }
        let r = self.cmd(&Command::Spas)?;
        let addrs = braid_proto::stripes::parse_spas(&r).map_err(ClientError::Protocol)?;
        Ok(addrs
            .into_iter()
            .map(|a| {
                let target = SocketAddr::V4(a);
                DataAddr {
                    target,
                    round: target,
                    detour: None,
                }
            })
            .collect())
    }

    /// The address the answer to EPSV or PASV (the oldest op not yet read) gives.
    fn passive_answer(&mut self) -> Result<DataAddr> {
        match self.finished(None)? {
            Outcome::Passive(port) => Ok(self.data_addr(port)),
            o => Err(unexpected(o)),
        }
    }

    /// The server's `port`, on the control connection's peer, with the way round to it.
    fn data_addr(&self, port: u16) -> DataAddr {
        let target = SocketAddr::new(self.peer.ip(), port);
        DataAddr {
            target,
            round: SocketAddr::new(self.far_data_ip.unwrap_or(target.ip()), port),
            detour: self.detour.clone(),
        }
    }

    /// `summary` with how the data connections reached the far side, for a session that has a
    /// way round (`braid cp`).
    pub fn with_data_route(&self, mut summary: Summary) -> Summary {
        summary.data_route = self.detour.as_ref().map(|d| d.way().name());
        summary
    }

    /// Where a data connection that cannot reach the server goes instead (`braid cp`).
    pub fn set_detour(&mut self, detour: Option<Arc<Detour>>) {
        self.detour = detour;
    }

    /// REST, sent right before the transfer command as RFC 3659 asks.
    pub fn restart_at(&mut self, offset: u64) -> Result<()> {
        self.begin(Op::Rest(offset))?;
        self.restarted(offset)
    }

    /// The answer to REST `offset` (the oldest op not yet read).
    fn restarted(&mut self, offset: u64) -> Result<()> {
        self.finished(Some(format!("REST {offset} (the server cannot resume)")))
            .map(drop)
    }

    /// REST with byte ranges (MODE E), when there are any.
    pub fn restart_ranges(&mut self, have: &RangeSet) -> Result<()> {
        if have.is_empty() {
            return Ok(());
        }
        self.later(
            Op::RestRanges(have.clone()),
            Some(format!("REST {have} (the server cannot resume)")),
        )
    }

    /// The server's checksum of a whole file (CKSM), lower-case hex; None if it offers none.
    pub fn checksum(&mut self, alg: &str, path: &str) -> Result<Option<String>> {
        if let Some((a, p, sum)) = self.early_checksum.take()
            && a == alg
            && p == path
        {
            return Ok(sum);
        }
        self.ask_checksum(alg, path)?;
        self.checksum_answer()
    }

    /// Asks for a whole file's checksum (CKSM) without waiting: [`Control::checksum_answer`]
    /// reads it, so that another server can be asked meanwhile.
    pub fn ask_checksum(&mut self, alg: &str, path: &str) -> Result<()> {
        self.begin(Op::Checksum {
            alg: alg.into(),
            path: path.into(),
        })
    }

    /// The answer to [`Control::ask_checksum`].
    pub fn checksum_answer(&mut self) -> Result<Option<String>> {
        match self.finished(Some("CKSM".into()))? {
            Outcome::Checksum(sum) => Ok(sum),
            o => Err(unexpected(o)),
        }
    }

    /// Sends a transfer command after the data connection is open and waits for 125/150.
    pub fn start_transfer(&mut self, cmd: &Command) -> Result<bool> {
        self.send_transfer(cmd)?;
        self.transfer_started(cmd)
    }

    /// Starts `cmd`, whose data connections the server opens to this side. Under GSI (DCAU A)
    /// the server answers only once their handshakes are done, and those run when the
    /// transfer takes the connections: the answer is then read with the transfer's end (true:
    /// it is pending; a refusal shows in [`Control::refused_meanwhile`] meanwhile).
    pub fn start_incoming(&mut self, cmd: &Command) -> Result<bool> {
        if self.authenticates_data() {
            self.later(Op::StartTransfer(cmd.clone()), Some(cmd.to_line()))?;
            return Ok(true);
        }
        self.start_transfer(cmd)?;
        Ok(false)
    }

    /// Sends a transfer command without waiting for its reply (the data connections can open
    /// meanwhile); [`Control::transfer_started`] waits.
    pub fn send_transfer(&mut self, cmd: &Command) -> Result<()> {
        self.begin(Op::StartTransfer(cmd.clone()))
    }

    /// Waits for 125/150 after [`Control::send_transfer`]; true if the server reuses the
    /// data connections the last transfer left open (125).
    pub fn transfer_started(&mut self, cmd: &Command) -> Result<bool> {
        match self.finished(Some(cmd_for_error(cmd)))? {
            Outcome::Started { reused } => Ok(reused),
            o => Err(unexpected(o)),
        }
    }

    /// The final reply of a transfer (226 or 250 on success), and the answer to CKSM asked for
    /// behind it, if it was.
    pub fn finish_transfer(&mut self, cmd: &Command) -> Result<Reply> {
        let checksum = self.checksum_after.take();
        if checksum.is_none() {
            self.begin(Op::FinishTransfer)?;
        }
        let finished = self.finished(Some(cmd_for_error(cmd))).and_then(done);
        // The server answered (226, or a refusal): its answer to CKSM follows. Otherwise the
        // connection is gone and nothing more will come.
        if let Some((alg, path)) = checksum
            && matches!(finished, Ok(_) | Err(ClientError::Remote { .. }))
            && let (Ok(_), Ok(Outcome::Checksum(sum))) = (&finished, self.finished(None))
        {
            self.early_checksum = Some((alg, path, sum));
        }
        finished
    }

    /// Where the server reads pipelined commands (a braid server), asks now, while the data
    /// moves, for the transfer's end and for CKSM of `path` behind it: the server answers CKSM
    /// right after its 226, where asking once the data is in costs a round trip more (0.6 s on
    /// a satellite hop). [`Control::finish_transfer`] reads both; [`Control::checksum`] then
    /// hands out the answer.
    pub fn checksum_after_transfer(&mut self, alg: &str, path: &str) -> Result<()> {
        if !self.session.pipelining() {
            return Ok(());
        }
        self.begin(Op::FinishTransfer)?;
        self.begin(Op::Checksum {
            alg: alg.into(),
            path: path.into(),
        })?;
        self.checksum_after = Some((alg.into(), path.into()));
        Ok(())
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
            let _ = self
                .stream
                .set_read_timeout(Some(Duration::from_millis(100)));
            let read = self.read_some();
            let _ = self.stream.set_read_timeout(Some(REPLY_TIMEOUT));
            match read {
                Err(ReadError::Io(e)) if is_timeout(&e) && heard.elapsed() < REPLY_TIMEOUT => {}
                Err(ReadError::Io(e)) if is_timeout(&e) => {
                    return Err(ClientError::ControlLost(format!(
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
        // The handshake sits between commands: nothing goes ahead of it, and pipelining
        // resumes after it.
        let pipelining = self.session.pipelining();
        self.session.set_pipeline(false);
        let sent = self.auth_tls(config, host);
        self.session.set_pipeline(pipelining);
        let sent = sent?;
        let binding = match &mut self.stream {
            Channel::Net(Wire::Clear(sock)) => {
                let sock = sock
                    .try_clone()
                    .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))?;
                self.stream = Channel::Net(super::wire::tls(sock, config, host)?);
                match &self.stream {
                    Channel::Net(Wire::Client(s, _)) => Binding::of(&s.conn).ok(),
                    _ => None,
                }
            }
            Channel::Child(piped) => {
                let conn = match sent {
                    Some(conn) => conn,
                    None => super::wire::client_conn(config, host)?,
                };
                Some(piped.start_tls(conn, host, &self.parser.take_pending())?)
            }
            Channel::Net(_) | Channel::Gsi(_) => {
                return Err(ClientError::Protocol("TLS is already on".into()));
            }
        };
        self.tls = Some(Protection {
            config: config.clone(),
            host: host.to_string(),
            binding,
        });
        // A braid server reads what follows the handshake in order: PBSZ and PROT go with
        // the login that comes next, not a round trip ahead of it.
        match self.braid_greeting {
            true => self.later(Op::Protect, None),
            false => self.run(Op::Protect).map(drop),
        }
    }

    /// AUTH GSSAPI and the ADAT exchange (RFC 2228, the Globus GSS mechanism): the security
    /// context with the server `host`, under which every later command and reply goes. The
    /// server gets a proxy of `credential` (delegation), with which it shows itself as the
    /// user on data connections: to this side, and to another server in a copy between two.
    pub fn start_gsi(
        &mut self,
        credential: &Arc<super::gsi_creds::GsiCredential>,
        host: &str,
    ) -> Result<()> {
        let pipelining = self.session.pipelining();
        self.session.set_pipeline(false);
        let made = self.gsi_context(credential, host);
        self.session.set_pipeline(pipelining);
        let gsi = made?;
        let sock = match &self.stream {
            Channel::Net(Wire::Clear(sock)) => sock
                .try_clone()
                .map_err(|e| ClientError::Tls(format!("GSI setup: {e}")))?,
            _ => {
                return Err(ClientError::Protocol(
                    "GSI on a protected connection".into(),
                ));
            }
        };
        self.stream = Channel::Gsi(Box::new(super::channel::Wrapped::new(sock, gsi)));
        self.gsi_data = Some(credential.data.clone());
        Ok(())
    }

    /// The handshake's round trips: each ADAT carries TLS records (then the delegation byte),
    /// each 335 the server's answer, 235 the end.
    fn gsi_context(
        &mut self,
        credential: &Arc<super::gsi_creds::GsiCredential>,
        host: &str,
    ) -> Result<super::gsi::Gsi> {
        let refused = |reply: Reply, what: &str| {
            ClientError::Tls(format!(
                "{host} refused {what} ({reply}): check that it is a GridFTP server taking GSI \
             on this port, and that it trusts your credential's CA (and maps you in its \
             grid-mapfile)"
            ))
        };
        let auth = self.cmd(&Command::Auth("GSSAPI".into()))?;
        if auth.code != 334 {
            return Err(refused(auth, "AUTH GSSAPI"));
        }
        let mut gsi =
            super::gsi::Gsi::new(&credential.config, host, Some(credential.certified.clone()))?;
        // A handshake takes three round trips (four with a delegation); a server still
        // asking after ten is not one.
        for _ in 0..10 {
            let token = gsi.next_token()?;
            let reply = self.cmd(&Command::Unknown {
                verb: "ADAT".into(),
                arg: Some(token),
            })?;
            match reply.code {
                335 | 235 => gsi.take(&reply.text())?,
                _ => return Err(refused(reply, "the GSI handshake")),
            }
            if reply.code == 235 {
                if !gsi.complete() {
                    return Err(ClientError::Tls(format!(
                        "{host} ended the GSI handshake before it was complete"
                    )));
                }
                return Ok(gsi);
            }
        }
        Err(ClientError::Tls(format!(
            "{host} did not end the GSI handshake"
        )))
    }

    /// AUTH TLS and its 234. Inside ssh's channel to a one-shot server that says it may, the
    /// ClientHello goes right behind the command instead of a round trip later: the TLS
    /// client it came from (what the server sent behind its 234 then starts its handshake).
    fn auth_tls(
        &mut self,
        config: &Arc<rustls::ClientConfig>,
        host: &str,
    ) -> Result<Option<rustls::ClientConnection>> {
        if !(self.tls_ahead && matches!(self.stream, Channel::Child(_))) {
            return self.run(Op::AuthTls).map(|_| None);
        }
        let mut conn = super::wire::client_conn(config, host)?;
        let mut hello = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut hello)
                .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))?;
        }
        self.begin(Op::AuthTls)?;
        self.stream
            .write_all(&hello)
            .and_then(|()| self.stream.flush())
            .map_err(|e| ClientError::ControlLost(format!("sending the ClientHello: {e}")))?;
        self.finished(None)?;
        Ok(Some(conn))
    }

    /// Starts a stream-mode transfer: a passive data connection, REST `offset` when it is
    /// not 0, `cmd` (RETR, STOR) and its 125/150, then TLS on the connection under PROT P.
    /// To a server that reads pipelined commands, EPSV, REST and `cmd` go in one flight: one
    /// round trip, not three, before the data (a REST refused there fails the transfer before
    /// a byte of it is written).
    pub fn stream_transfer(&mut self, cmd: &Command, offset: u64) -> Result<Wire> {
        if self.session.pipelining() && self.early_passive.is_none() {
            // EPSV, REST and the command in one flight; the connection opens once the 229
            // says where, before the server waits for it.
            self.data.clear();
            self.begin(Op::Passive)?;
            if offset > 0 {
                self.begin(Op::Rest(offset))?;
            }
            self.send_transfer(cmd)?;
            let data = connect_data(&self.passive_answer()?)?;
            if offset > 0 {
                self.restarted(offset)?;
            }
            self.started_authenticating(cmd, &[&data])?;
            return self.protect(data);
        }
        let data = self.open_data()?;
        if offset > 0 {
            self.restart_at(offset)?;
        }
        self.start_on(data, cmd)
    }

    /// A data connection as this session protects it: TLS after `start_tls`.
    pub fn protect(&self, sock: TcpStream) -> Result<Wire> {
        match &self.tls {
            Some(p) => super::wire::tls(sock, &p.config, &p.host),
            None => Ok(Wire::Clear(sock)),
        }
    }

    /// How MODE E data connections are protected: TLS bound to this control session, after
    /// `start_tls` and with a server that does it (`BRAID 3`).
    pub fn data_tls(&self) -> Option<DataTls> {
        let p = self.tls.as_ref()?;
        Some(DataTls::Client {
            config: p.config.clone(),
            name: rustls::pki_types::ServerName::try_from(p.host.clone()).ok()?,
            binding: p.binding?,
        })
    }

    /// A data connection's failed TLS set-up as a sentence with the fix.
    pub fn data_tls_failed(&self, e: &SecureError) -> String {
        let host = self.tls.as_ref().map_or("the server", |p| p.host.as_str());
        match e {
            SecureError::Handshake(io) => {
                format!(
                    "data connection: {}",
                    super::wire::handshake_failed(host, io)
                )
            }
            e => format!("data connection to {host}: {e}"),
        }
    }

    /// Whether the server runs TLS on MODE E data connections under PROT P.
    pub fn private_blocks(&self) -> bool {
        self.session.features().private_blocks()
    }

    /// Under GSI: data connections run GSI's handshake (DCAU A) before their data.
    pub fn authenticates_data(&self) -> bool {
        self.gsi_data.is_some()
    }

    /// How connections a GridFTP server opens to this side are authenticated: under GSI,
    /// its handshake (connections this side opens run it in [`Control::started_authenticating`]).
    pub fn gsi_accepting(&self) -> Option<DataTls> {
        self.gsi_data.clone().map(DataTls::GsiAccept)
    }

    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn quit(mut self) {
        if self.session.pipelining() {
            // What was begun to be read later is read now: a server that finds its client gone
            // stops carrying out the requests still queued (an MFMT would be lost).
            if self.read_deferred().is_err() {
                return;
            }
            // A braid server closes after QUIT; its 221 is not worth a round trip.
            let _ = self.send(&Command::Quit);
            return;
        }
        let _ = self.run(Op::Quit);
    }
}

/// The reply of an op that ends with one.
fn done(o: Outcome) -> Result<Reply> {
    match o {
        Outcome::Done(r) => Ok(r),
        o => Err(unexpected(o)),
    }
}

/// An op ended in a way its caller did not ask for: a bug, said as such.
fn unexpected(o: Outcome) -> ClientError {
    ClientError::Protocol(format!("internal error: unexpected outcome {o:?}"))
}

fn cmd_for_error(cmd: &Command) -> String {
    match cmd {
        Command::Pass(_) => "PASS".into(),
        c => c.to_line(),
    }
}

/// Opens one data connection to `addr` (or round it, see [`DataAddr`]), with the reply
/// timeout as its read/write limit.
pub fn connect_data(addr: &DataAddr) -> Result<TcpStream> {
    super::detour::connect(addr, REPLY_TIMEOUT, CONNECT_TIMEOUT)
}

/// Why reading the control connection stopped.
enum ReadError {
    Io(std::io::Error),
    Closed,
    Other(ClientError),
}

impl From<ReadError> for ClientError {
    fn from(e: ReadError) -> ClientError {
        ClientError::ControlLost(match e {
            ReadError::Io(e) => format!("reading reply: {e}"),
            ReadError::Closed => "server closed the control connection".into(),
            ReadError::Other(e) => return e,
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

    use super::super::testing::{done, greeted, scripted};

    #[test]
    fn a_port_that_does_not_greet_as_ftp_is_named_as_such() {
        let (c, server) = greeted(b"SSH-2.0-OpenSSH_9.6\r\n", b"");
        match c {
            Err(ClientError::Protocol(m)) => assert!(m.contains("is it an FTP server"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("an SSH server taken for FTP"),
        }
        server.join().unwrap();
        // A server at its limit greets with 421: refused, with the server's words.
        let (c, server) = greeted(b"421 Too many connections\r\n", b"");
        match c {
            Err(ClientError::Remote { reply, .. }) => assert_eq!(reply.code, 421),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a 421 greeting taken for a welcome"),
        }
        server.join().unwrap();
    }

    #[test]
    fn a_passive_address_is_the_control_connections_peer_whatever_227_names() {
        // EPSV: the port only.
        let (mut c, server) = scripted(b"229 Entering Extended Passive Mode (|||4242|)\r\n");
        assert_eq!(
            c.passive_addr().unwrap().target,
            "127.0.0.1:4242".parse().unwrap()
        );
        done(c, server);
        // No EPSV: PASV, whose private address (or a bounce target) is not followed.
        let (mut c, server) =
            scripted(b"500 EPSV not understood\r\n227 Entering Passive Mode (10,9,8,7,16,147)\r\n");
        assert_eq!(
            c.passive_addr().unwrap().target,
            "127.0.0.1:4243".parse().unwrap()
        );
        done(c, server);
        let (mut c, server) = scripted(b"229 Entering Extended Passive Mode (|||garbage|)\r\n");
        assert!(matches!(c.passive_addr(), Err(ClientError::Protocol(_))));
        done(c, server);
    }

    #[test]
    fn a_transfer_starts_on_125_or_150_and_a_refusal_says_what_was_refused() {
        let retr = Command::Retr("f".into());
        let (mut c, server) = scripted(b"125 Reusing\r\n150 Opening\r\n550 f: no such file\r\n");
        assert!(
            c.start_transfer(&retr).unwrap(),
            "125: the kept connections"
        );
        assert!(!c.start_transfer(&retr).unwrap(), "150: new ones");
        match c.start_transfer(&retr) {
            Err(ClientError::Remote { what, reply }) => {
                assert_eq!(reply.code, 550);
                assert!(what.contains("RETR"), "{what}");
            }
            other => panic!("{other:?}"),
        }
        done(c, server);
    }

    #[test]
    fn a_transfer_ends_on_226_and_a_451_is_the_servers_refusal() {
        let stor = Command::Stor("f".into());
        let (mut c, server) = scripted(b"226 Done\r\n451 Disk error\r\n");
        assert_eq!(c.finish_transfer(&stor).unwrap().code, 226);
        match c.finish_transfer(&stor) {
            Err(ClientError::Remote { reply, .. }) => assert_eq!(reply.code, 451),
            other => panic!("{other:?}"),
        }
        done(c, server);
    }

    #[test]
    fn rest_is_answered_350_or_the_server_cannot_resume() {
        let (mut c, server) = scripted(b"350 Restarting at 100\r\n502 REST not implemented\r\n");
        c.restart_at(100).unwrap();
        let e = c.restart_at(200).unwrap_err();
        assert!(e.to_string().contains("cannot resume"), "{e}");
        done(c, server);
    }

    #[test]
    fn a_checksum_is_the_213_answer_and_a_refusal_means_none_offered() {
        let (mut c, server) = scripted(b"213 1A2B3C4D\r\n504 Unknown algorithm\r\n");
        assert_eq!(
            c.checksum("ADLER32", "f").unwrap().as_deref(),
            Some("1a2b3c4d")
        );
        assert_eq!(c.checksum("MD5", "f").unwrap(), None);
        done(c, server);
    }

    #[test]
    fn the_wait_for_a_final_reply_skips_marks_and_stops_on_request() {
        let (mut c, server) = scripted(b"111 Range Marker 0-10\r\n226 Done.\r\n");
        let r = c.final_reply_unless(|| false).unwrap().unwrap();
        assert_eq!(r.code, 226);
        assert!(c.stored().covers(0, 10));
        // The usual reply timeout is back for the next reads.
        assert_eq!(
            c.stream.tcp().unwrap().read_timeout().unwrap(),
            Some(REPLY_TIMEOUT)
        );

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

    fn anonymous() -> Target {
        Target {
            gsi: false,
            host: "127.0.0.1".into(),
            port: 21,
            user: "anonymous".into(),
            password: "x".into(),
            path: String::new(),
        }
    }

    #[test]
    fn a_login_reads_the_features_and_a_refused_password_is_a_login_error() {
        let (mut c, server) = scripted(
            b"331 Password\r\n230 Logged in\r\n211-Features:\r\n PARALLEL\r\n REST STREAM\r\n \
              MLST type*;size*;modify*;\r\n211 End\r\n200 Binary\r\n",
        );
        c.start(&anonymous(), None).unwrap();
        assert!(c.has_feature("PARALLEL") && c.has_feature("REST") && c.has_feature("MLST"));
        assert!(!c.has_feature("BRAID"));
        done(c, server);
        let (mut c, server) = scripted(b"331 Password\r\n530 Login incorrect\r\n");
        match c.start(&anonymous(), None) {
            Err(ClientError::Login { user, reply }) => {
                assert_eq!((user.as_str(), reply.code), ("anonymous", 530));
            }
            other => panic!("{other:?}"),
        }
        done(c, server);
    }

    #[test]
    fn a_size_known_from_a_listing_is_not_asked_again() {
        let (mut c, server) = scripted(b"213 77\r\n");
        c.know_size("a", 12);
        assert_eq!(c.size("a").unwrap().text(), "12");
        // Another file is asked (the script's answer).
        assert_eq!(c.size("b").unwrap().text().trim(), "77");
        done(c, server);
    }

    #[test]
    fn an_abort_reads_everything_up_to_the_noops_answer() {
        // 426 for the transfer, 226 for ABOR, then NOOP's 200; the next command gets its own.
        let (mut c, server) = scripted(b"426 Aborted\r\n226 ABOR ok\r\n200 NOOP\r\n213 5\r\n");
        super::super::interrupt::send_abort(&mut c);
        assert_eq!(c.size("f").unwrap().code, 213, "out of step after ABOR");
        done(c, server);
    }

    #[test]
    fn nothing_is_sent_for_an_empty_restart_or_a_checksum_a_server_cannot_pipeline() {
        let (mut c, server) = scripted(b"221 Bye\r\n");
        c.restart_ranges(&RangeSet::new()).unwrap();
        c.checksum_after_transfer("XXH3", "f").unwrap();
        c.quit();
        assert_eq!(server.join().unwrap(), "QUIT\r\n");
    }

    #[test]
    fn an_unexpected_answer_names_the_command_and_a_rate_change_is_sent_only_when_there_is_one() {
        use crate::engine::hooks::Tell;
        let (mut c, server) = scripted(b"200 ok\r\n550 Permission denied\r\n");
        assert_eq!(
            c.expect(&Command::Mkd("a".into()), &[200, 257])
                .unwrap()
                .code,
            200
        );
        match c.expect(&Command::Mkd("b".into()), &[257]) {
            Err(ClientError::Remote { what, reply }) => {
                assert!(what.contains("MKD"), "{what}");
                assert_eq!(reply.code, 550);
            }
            other => panic!("{other:?}"),
        }
        c.tell(Tell::default()).unwrap();
        c.tell(Tell {
            rate: Some(Some(1_000_000)),
            ..Tell::default()
        })
        .unwrap();
        let sent = done(c, server);
        assert!(sent.starts_with("MKD a\r\nMKD b\r\nOPTS RETR "), "{sent}");
        assert!(sent.contains("1000000"), "{sent}");
    }
}
