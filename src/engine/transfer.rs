//! One MODE E transfer's set of data connections, as the sender and the receiver both see it.
//!
//! A [`Transfer`] is shared by the connection threads, the thread that lets new connections
//! join ([`join_loop`]) and the supervisor that samples statistics and applies the policy and
//! the pacer (see [`super::hooks`]). Connections can join while data flows and leave before
//! the end; each is a [`Link`] with its own byte counter, so statistics cost the data path one
//! relaxed atomic add per piece.
//!
//! *Elastic* transfers (braid to braid, negotiated with `OPTS BRAID ELASTIC`) also survive a
//! connection that breaks: the sender sends that connection's blocks again on the others and
//! leaves it out of the EOF count; the receiver drops it and ignores blocks it already holds.
//! Other transfers keep GridFTP's rules: a fixed set, and one broken connection fails the lot.

use super::sockets::{RESTART_ABOVE, congestion_of, restart_bbr, set_congestion, set_dscp};
use super::tls::{DataConn, DataTls, SecureError};
use super::{Abort, EngineError, set_buffer};
use braid_proto::retr_opts::CcName;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Wakes a transfer's join loop at once: when a connection ends (the transfer may be
/// complete) or one this side opened is ready to join. Cheap to clone, usable from any thread.
#[derive(Debug, Clone)]
pub struct Waker(Arc<std::os::fd::OwnedFd>);

impl Waker {
    fn new() -> std::io::Result<Waker> {
        use rustix::event::{EventfdFlags, eventfd};
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Waker(Arc::new(fd)))
    }

    pub fn wake(&self) {
        let _ = rustix::io::write(&*self.0, &1u64.to_ne_bytes());
    }

    /// Clears pending wakes.
    fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&*self.0, &mut buf);
    }
}

/// How one data connection ended (or that it has not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkState {
    Open,
    /// Its EOD was sent or received: everything it carried counts.
    Finished,
    /// It broke; what it carried that did not arrive whole is sent again on the others.
    Lost,
    /// It closed without carrying anything: it joined after the sender had finished, or a
    /// cached connection the sender chose not to use.
    Unused,
}

impl LinkState {
    fn from_u8(v: u8) -> LinkState {
        match v {
            1 => LinkState::Finished,
            2 => LinkState::Lost,
            3 => LinkState::Unused,
            _ => LinkState::Open,
        }
    }
}

/// One data connection of a transfer.
#[derive(Debug)]
pub struct Link {
    /// Position in the order the connections joined, from 0.
    pub id: usize,
    /// A second handle on the socket, for statistics, pacing and shutdown (shared with the
    /// transfer's [`Abort`]); the connection's thread owns the first.
    sock: Arc<TcpStream>,
    /// Payload bytes carried (sent or received) on this connection.
    bytes: AtomicU64,
    /// The policy asked the sender to stop using it after the current block.
    retire: AtomicBool,
    /// Its EOD arrived (receiving side): the sender counted it in the EOF block.
    counted: AtomicBool,
    state: AtomicU8,
    /// When it joined and when it ended, since the transfer started.
    pub joined: Duration,
    ended_ns: AtomicU64,
    /// The far end's address when it joined (which data node, in a striped transfer).
    pub peer: Option<IpAddr>,
}

impl Link {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(super) fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn state(&self) -> LinkState {
        LinkState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn ended(&self) -> Option<Duration> {
        match self.ended_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub(super) fn retiring(&self) -> bool {
        self.retire.load(Ordering::Relaxed)
    }

    pub(super) fn set_counted(&self) {
        self.counted.store(true, Ordering::Release);
    }

    pub(super) fn counted(&self) -> bool {
        self.counted.load(Ordering::Acquire)
    }

    /// Shuts the connection down both ways, which wakes its thread from a blocking call.
    pub(super) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// The kernel's view of this connection (None once it is closed).
    pub fn tcp_info(&self) -> Option<braid_sockopt::TcpInfo> {
        braid_sockopt::tcp_info(&self.sock)
    }

    /// Its socket buffers now (send, receive), bytes as the kernel counts them (twice what
    /// was set, or what autotuning reached).
    pub fn buffers(&self) -> Option<(usize, usize)> {
        let s = socket2::SockRef::from(&*self.sock);
        Some((s.send_buffer_size().ok()?, s.recv_buffer_size().ok()?))
    }
}

/// The set of data connections of one transfer, and the controls the hooks act through.
#[derive(Debug)]
pub struct Transfer {
    elastic: bool,
    started: Instant,
    links: Mutex<Vec<Arc<Link>>>,
    /// Cap on the sending rate of all connections together, bytes/s (0: none).
    pacing: AtomicU64,
    /// The congestion control every connection gets (None: the system's default).
    congestion: Mutex<Option<CcName>>,
    /// The DSCP every connection's packets carry (None: left as it is).
    dscp: Mutex<Option<u8>>,
    /// Connections open now, and the most open at the same time so far.
    open: AtomicUsize,
    most_open: AtomicUsize,
    /// What the receiver says it has stored (an upload's range markers): blocks in it need
    /// not be sent again if their connection breaks.
    confirmed: Mutex<braid_proto::ranges::RangeSet>,
    abort: Abort,
    /// None only if the system refused an eventfd: the join loop then polls.
    waker: Option<Waker>,
    /// TLS handshakes on data connections: full, and resumed from a ticket.
    handshakes: [AtomicUsize; 2],
    /// Connections in their TLS handshake, not yet counted in: they count towards the most
    /// connections a listener takes, so that a peer cannot pile up handshaking threads.
    handshaking: AtomicUsize,
    /// Compressed blocks: whether the ends agreed on them, and what they saved.
    compression: super::compress::Compression,
}

/// A connection in its handshake, counted until dropped.
pub(super) struct Handshaking<'a>(&'a Transfer);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.handshaking.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A transfer's TLS handshakes on its data connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Handshakes {
    pub full: usize,
    pub resumed: usize,
}

impl Handshakes {
    /// Them, where there were any (a summary says nothing of TLS for a transfer in clear).
    pub fn any(self) -> Option<Handshakes> {
        (self.full + self.resumed > 0).then_some(self)
    }
}

/// Several transfers' (a striped one's, one per node), together.
impl std::iter::Sum for Handshakes {
    fn sum<I: Iterator<Item = Handshakes>>(iter: I) -> Handshakes {
        iter.fold(Handshakes::default(), |a, h| Handshakes {
            full: a.full + h.full,
            resumed: a.resumed + h.resumed,
        })
    }
}

impl Transfer {
    pub fn new(elastic: bool) -> Transfer {
        Transfer {
            elastic,
            started: Instant::now(),
            links: Mutex::new(Vec::new()),
            pacing: AtomicU64::new(0),
            congestion: Mutex::new(None),
            dscp: Mutex::new(None),
            open: AtomicUsize::new(0),
            most_open: AtomicUsize::new(0),
            confirmed: Mutex::new(braid_proto::ranges::RangeSet::new()),
            abort: Abort::new(),
            waker: Waker::new().ok(),
            handshakes: Default::default(),
            handshaking: AtomicUsize::new(0),
            compression: super::compress::Compression::default(),
        }
    }

    /// A transfer whose ends agreed on compressed blocks (`policy`: what this side does as
    /// the sender); without it a compressed block is a protocol error.
    pub fn with_compression(mut self, policy: Option<braid_proto::compress::Policy>) -> Transfer {
        self.compression = super::compress::Compression::new(policy);
        self
    }

    pub fn compression(&self) -> &super::compress::Compression {
        &self.compression
    }

    /// Runs `tls`'s handshake on a connection not yet secured, and counts it. A connection
    /// kept from an earlier transfer is already secured (or in clear, without `tls`).
    pub(super) fn secure(
        &self,
        tls: Option<&DataTls>,
        conn: DataConn,
    ) -> Result<DataConn, SecureError> {
        let conn = match (tls, conn) {
            (Some(tls), DataConn::Clear(sock)) => tls.secure(sock)?,
            (_, conn) => return Ok(conn),
        };
        let resumed = conn.resumed() == Some(true);
        self.handshakes[usize::from(resumed)].fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// Counts a connection that is not yet counted in as handshaking, until the guard goes.
    pub(super) fn handshaking(&self) -> Handshaking<'_> {
        self.handshaking.fetch_add(1, Ordering::AcqRel);
        Handshaking(self)
    }

    /// The TLS handshakes of this transfer's data connections so far.
    pub fn handshakes(&self) -> Handshakes {
        Handshakes {
            full: self.handshakes[0].load(Ordering::Relaxed),
            resumed: self.handshakes[1].load(Ordering::Relaxed),
        }
    }

    /// Connections may join and leave mid-transfer, and a broken one is survived.
    pub fn elastic(&self) -> bool {
        self.elastic
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Wakes the join loop: for a connection this side opened and sent on `Joins::incoming`.
    pub fn waker(&self) -> Option<Waker> {
        self.waker.clone()
    }

    /// Stops the transfer from any thread: every data connection is shut down.
    pub fn abort(&self) -> &Abort {
        &self.abort
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Link>>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a connection. Fails only if the socket cannot be duplicated (out of descriptors).
    pub(super) fn join(&self, sock: &TcpStream) -> std::io::Result<Arc<Link>> {
        let dup = Arc::new(sock.try_clone()?);
        self.abort.register_handle(dup.clone());
        let peer = dup.peer_addr().ok().map(|a| a.ip());
        let link = {
            let mut links = self.lock();
            let link = Arc::new(Link {
                id: links.len(),
                sock: dup,
                bytes: AtomicU64::new(0),
                retire: AtomicBool::new(false),
                counted: AtomicBool::new(false),
                state: AtomicU8::new(0),
                joined: self.started.elapsed(),
                ended_ns: AtomicU64::new(0),
                peer,
            });
            links.push(link.clone());
            let open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
            self.most_open.fetch_max(open, Ordering::Relaxed);
            link
        };
        self.reshare_pacing();
        if let Some(cc) = self.congestion_asked() {
            set_congestion(&link.sock, cc);
        }
        if let Some(d) = *self.dscp.lock().unwrap_or_else(|p| p.into_inner()) {
            set_dscp(&link.sock, d);
        }
        Ok(link)
    }

    /// Marks the packets of every connection, open and to come, with this DSCP (background
    /// mode: 1, lower effort, RFC 8622).
    pub fn set_dscp(&self, dscp: u8) {
        *self.dscp.lock().unwrap_or_else(|p| p.into_inner()) = Some(dscp);
        for l in self.lock().iter() {
            set_dscp(&l.sock, dscp);
        }
    }

    /// Adds a connection that moves data elsewhere (a stream-mode one), for the pacing,
    /// marking and statistics every connection of the transfer gets; it stays open in the
    /// transfer's count until the transfer ends.
    pub fn watch(&self, sock: &TcpStream) {
        if let Err(e) = self.join(sock) {
            tracing::debug!("cannot watch a data connection: {e}");
        }
    }

    /// Gives every connection, open and to come, this congestion control.
    pub fn set_congestion(&self, cc: Option<CcName>) {
        *self.congestion.lock().unwrap_or_else(|p| p.into_inner()) = cc;
        if let Some(cc) = cc {
            for l in self.lock().iter() {
                set_congestion(&l.sock, cc);
            }
        }
    }

    fn congestion_asked(&self) -> Option<CcName> {
        *self.congestion.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The congestion control the connections use (that of the first one that says).
    pub fn congestion(&self) -> Option<CcName> {
        self.lock().iter().find_map(|l| congestion_of(&l.sock))
    }

    /// Marks how a connection ended.
    pub(super) fn end(&self, link: &Link, state: LinkState) {
        let was = link.state.compare_exchange(
            LinkState::Open as u8,
            state as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if was.is_err() {
            return;
        }
        let ns = u64::try_from(self.started.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        link.ended_ns.store(ns, Ordering::Release);
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.reshare_pacing();
        if let Some(w) = &self.waker {
            w.wake();
        }
    }

    /// Every connection that ever joined, in the order they joined.
    pub fn links(&self) -> Vec<Arc<Link>> {
        self.lock().clone()
    }

    /// Connections open now (one atomic load: the sender asks before every block).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// The rate a connection moves payload at, bytes/s: at most its share of the pace, since
    /// the kernel holds it to that; else what it has written since it joined, None in its
    /// first 100 ms, before that means much. Written is not sent: a fresh socket's buffer
    /// takes megabytes at once, so without the pace a paced connection would look fast and
    /// queue seconds of data that a change of pace or a retirement must then wait out.
    pub fn rate(&self, link: &Link) -> Option<f64> {
        let age = self.started.elapsed().saturating_sub(link.joined);
        let written =
            (age >= Duration::from_millis(100)).then(|| link.bytes() as f64 / age.as_secs_f64());
        let share = self
            .pacing()
            .map(|total| total as f64 / self.open().max(1) as f64);
        match (written, share) {
            (Some(w), Some(s)) => Some(w.min(s)),
            (w, s) => w.or(s),
        }
    }

    /// Records what the receiver has stored, from its range markers.
    pub fn confirm(&self, stored: &braid_proto::ranges::RangeSet) {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone_from(stored);
    }

    /// Of these blocks, those the receiver has not confirmed.
    pub(super) fn unconfirmed(&self, mut blocks: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        let c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        if !c.is_empty() {
            blocks.retain(|&(offset, len)| !c.covers(offset, offset + len));
        }
        blocks
    }

    /// Most connections that were open at the same time.
    pub fn most_open(&self) -> usize {
        self.most_open.load(Ordering::Relaxed)
    }

    /// Bytes per connection, in the order they joined.
    pub fn per_link_bytes(&self) -> Vec<u64> {
        self.lock().iter().map(|l| l.bytes()).collect()
    }

    /// Bytes the kernel says the peer acknowledged and sent, over all connections: these
    /// move while a block is still on its way.
    pub fn wire_bytes(&self) -> u64 {
        self.lock()
            .iter()
            .filter_map(|l| l.tcp_info())
            .map(|i| i.bytes_acked + i.bytes_received)
            .sum()
    }

    /// Asks for a connection to be closed after the block it is carrying. A sender stops
    /// taking blocks on it; a receiver half-closes it, which a braid sender takes as the same
    /// request. The last open connection is never retired.
    pub fn retire(&self, id: usize, sending: bool) {
        if !self.elastic {
            return;
        }
        let Some(link) = self.lock().get(id).cloned() else {
            return;
        };
        link.retire.store(true, Ordering::Relaxed);
        if !sending {
            let _ = link.sock.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Caps the sending rate of the whole transfer, bytes/s (None: no cap). The cap is split
    /// evenly over the open connections with `SO_MAX_PACING_RATE`, which the kernel enforces
    /// per packet (no fq qdisc needed), and split again when connections join or leave.
    /// A cap raised more than RESTART_ABOVE times over restarts the connections' bbr (see
    /// [`restart_bbr`]).
    pub fn set_pacing(&self, total: Option<u64>) {
        let new = total.unwrap_or(0);
        let was = self.pacing.swap(new, Ordering::Relaxed);
        let raised = was > 0 && new as f64 > RESTART_ABOVE * was as f64;
        self.apply_pacing();
        if raised {
            for l in self.lock().iter().filter(|l| l.state() == LinkState::Open) {
                restart_bbr(&l.sock);
            }
        }
    }

    pub fn pacing(&self) -> Option<u64> {
        match self.pacing.load(Ordering::Relaxed) {
            0 => None,
            r => Some(r),
        }
    }

    /// A connection joined or left: a cap in force is split again. Without one there is
    /// nothing to do (sockets start unpaced, and lifting a cap already reached every socket).
    fn reshare_pacing(&self) {
        if self.pacing().is_some() {
            self.apply_pacing();
        }
    }

    fn apply_pacing(&self) {
        let total = self.pacing();
        let links = self.lock();
        let open: Vec<_> = links
            .iter()
            .filter(|l| l.state() == LinkState::Open)
            .collect();
        let share = total.map(|t| (t / open.len().max(1) as u64).max(1));
        for l in open {
            if let Err(e) = braid_sockopt::set_max_pacing_rate(&l.sock, share) {
                tracing::debug!(conn = l.id, "SO_MAX_PACING_RATE: {e}");
            }
        }
    }
}

/// Where a transfer's data connections come from.
pub struct Joins {
    /// Already connected: this side opened them, or an earlier transfer left them open.
    pub open: Vec<DataConn>,
    /// `open` carried an earlier transfer: one that closes before its first header has just
    /// left the cache, which is no error.
    pub reused: bool,
    /// The peer connects here, as many times as it likes, while the transfer runs.
    pub accept: Option<Accept>,
    /// Connections this side opens while the transfer runs (the policy's `Open`).
    pub incoming: Option<Receiver<TcpStream>>,
    /// How long the transfer may go without a byte moving or a connection joining.
    pub stall: Duration,
    /// PROT P: TLS on every connection, bound to the control session.
    pub tls: Option<Arc<DataTls>>,
}

impl Joins {
    /// What secures the connections in `open`: none for kept ones, secured when they joined
    /// (under GSI their data is in clear after the handshake, and a second one would wait
    /// for a peer that sends none).
    pub fn open_tls(&self) -> Option<Arc<DataTls>> {
        self.tls.clone().filter(|_| !self.reused)
    }
}

/// A listener the peer opens data connections to. Connections from any host but `peer` are
/// dropped (RFC 2577).
/// Who may open a transfer's data connections: the client's host (RFC 2577: anyone else
/// could steal the port), and for a one-shot session over ssh also this host itself, whose
/// sshd connects from here when the client's own connections cannot reach the port (their
/// TLS still proves they belong to the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admits {
    pub client: IpAddr,
    /// This host's data address, when ssh may forward to it.
    pub forwarded_to: Option<IpAddr>,
    /// A third-party transfer: the other server may come from any address (each connection
    /// proves the session's binding under TLS before it counts).
    pub anyone: bool,
}

impl Admits {
    pub fn client(ip: IpAddr) -> Admits {
        Admits {
            client: braid_proto::session::canonical_ip(ip),
            forwarded_to: None,
            anyone: false,
        }
    }

    /// Whether a connection from `ip` may be a data connection.
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = braid_proto::session::canonical_ip(ip);
        self.anyone
            || ip == self.client
            || self
                .forwarded_to
                .is_some_and(|here| ip == here || ip.is_loopback())
    }
}

pub struct Accept {
    pub listener: TcpListener,
    pub peer: Admits,
    /// Most connections for one transfer, counting the open ones.
    pub max: usize,
    pub buffer: Option<u64>,
    /// Read and write timeout for the accepted sockets.
    pub timeout: Option<Duration>,
}

impl Joins {
    pub fn fixed(open: Vec<TcpStream>, stall: Duration) -> Joins {
        Joins {
            open: open.into_iter().map(DataConn::Clear).collect(),
            reused: false,
            accept: None,
            incoming: None,
            stall,
            tls: None,
        }
    }

    /// The connections an earlier transfer left open (GridFTP data-channel caching).
    pub fn cached(open: Vec<DataConn>, stall: Duration) -> Joins {
        Joins {
            open,
            reused: true,
            ..Joins::fixed(Vec::new(), stall)
        }
    }

    pub fn accept(accept: Accept, stall: Duration) -> Joins {
        Joins {
            accept: Some(accept),
            ..Joins::fixed(Vec::new(), stall)
        }
    }

    /// The same connections, under TLS.
    /// Whether its connections are secured with TLS (their data then passes through memory).
    pub fn is_protected(&self) -> bool {
        self.tls.is_some()
    }

    pub fn protected(self, tls: Option<DataTls>) -> Joins {
        Joins {
            tls: tls.map(Arc::new),
            ..self
        }
    }
}

/// Where a connection [`join_loop`] admits came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Joined {
    /// The peer connected to the listener at this index of `accepts`.
    Accepted(usize),
    /// This side opened it.
    Opened,
}

/// Lets connections join until `done()`: to the listeners, from `incoming`, or both. Fails if
/// nothing moves (no byte, no new connection) for `joins.stall`.
pub(super) fn join_loop(
    accepts: &[Accept],
    incoming: Option<&Receiver<TcpStream>>,
    stall: Duration,
    transfer: &Transfer,
    done: impl Fn() -> bool,
    mut admit: impl FnMut(Joined, TcpStream),
) -> Result<(), EngineError> {
    let setup = |e: std::io::Error| EngineError::Setup(e.to_string());
    for a in accepts {
        a.listener.set_nonblocking(true).map_err(setup)?;
    }
    let mut incoming = incoming;
    let mut last = Instant::now();
    let mut last_bytes = 0;
    let mut last_wire = 0;
    // Woken at once by a connection that ends or one that is ready to join; the timeout is
    // only for the stall check (and for a system without eventfd).
    let tick = if transfer.waker.is_some() { 100 } else { 5 };
    while !done() && !transfer.abort.is_aborted() {
        let mut joined = false;
        {
            use rustix::event::{PollFd, PollFlags, Timespec};
            let mut fds = Vec::with_capacity(accepts.len() + 1);
            for a in accepts {
                fds.push(PollFd::new(&a.listener, PollFlags::IN));
            }
            if let Some(w) = &transfer.waker {
                fds.push(PollFd::new(&*w.0, PollFlags::IN));
            }
            let wait = Timespec {
                tv_sec: 0,
                tv_nsec: tick * 1_000_000,
            };
            let _ = rustix::event::poll(&mut fds, Some(&wait));
        }
        if let Some(w) = &transfer.waker {
            w.drain();
        }
        for (i, a) in accepts.iter().enumerate() {
            match a.listener.accept() {
                Ok((sock, from)) => {
                    if !a.peer.admits(from.ip()) {
                        crate::warnings::warn(
                            "stranger-data",
                            from.ip(),
                            format_args!(
                                "refused data connection from {from}, a host other than the client"
                            ),
                        );
                    } else if transfer.links().len() + transfer.handshaking.load(Ordering::Acquire)
                        >= a.max
                    {
                        crate::warnings::warn(
                            "data-beyond-limit",
                            from.ip(),
                            format_args!(
                                "refused data connection from {from} beyond the limit of {}",
                                a.max
                            ),
                        );
                    } else {
                        let _ = sock.set_nonblocking(false);
                        let _ = sock.set_read_timeout(a.timeout);
                        let _ = sock.set_write_timeout(a.timeout);
                        set_buffer(&sock, a.buffer);
                        admit(Joined::Accepted(i), sock);
                        joined = true;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(EngineError::Setup(format!("accept: {e}"))),
            }
        }
        if let Some(rx) = incoming {
            loop {
                match rx.try_recv() {
                    Ok(sock) => {
                        admit(Joined::Opened, sock);
                        joined = true;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        incoming = None;
                        break;
                    }
                }
            }
        }
        // Data moving on open connections keeps the wait alive; a peer that neither sends nor
        // connects for `stall` has stalled. Blocks count once they are through, which on a
        // modem takes minutes; the kernel's counts of bytes acknowledged and received say
        // sooner that the peer is alive (asked only while no block went through).
        let bytes: u64 = transfer.per_link_bytes().iter().sum();
        let moved = bytes != last_bytes || {
            let wire = transfer.wire_bytes();
            std::mem::replace(&mut last_wire, wire) != wire
        };
        if joined || moved {
            last_bytes = bytes;
            last = Instant::now();
        } else if last.elapsed() > stall {
            let secs = stall.as_secs();
            return Err(if transfer.links().is_empty() {
                EngineError::Setup(format!("no data connection arrived within {secs} s"))
            } else {
                EngineError::Stalled(secs)
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_connections_come_from_the_client_or_for_a_session_over_ssh_from_this_host() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let plain = Admits::client(ip("198.18.0.1"));
        assert!(plain.admits(ip("198.18.0.1")));
        assert!(
            plain.admits(ip("::ffff:198.18.0.1")),
            "v4-mapped is the same host"
        );
        assert!(!plain.admits(ip("198.18.0.2")) && !plain.admits(ip("127.0.0.1")));
        let over_ssh = Admits {
            forwarded_to: Some(ip("198.18.0.2")),
            ..plain
        };
        assert!(over_ssh.admits(ip("198.18.0.1")));
        assert!(over_ssh.admits(ip("198.18.0.2")) && over_ssh.admits(ip("127.0.0.1")));
        assert!(
            !over_ssh.admits(ip("198.18.0.3")),
            "a stranger is still one"
        );
    }

    fn connected() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (near, listener.accept().unwrap().0)
    }

    /// A paced connection's rate is its share of the pace from the start, not the speed at
    /// which its empty socket buffer swallows the first megabytes.
    #[test]
    fn a_paced_connection_moves_at_most_its_share_of_the_pace() {
        let t = Transfer::new(true);
        let (a, _a) = connected();
        let first = t.join(&a).unwrap();
        assert_eq!(
            t.rate(&first),
            None,
            "unpaced, and too young to have a rate"
        );
        t.set_pacing(Some(2_000_000));
        assert_eq!(t.rate(&first), Some(2e6));
        let (b, _b) = connected();
        let second = t.join(&b).unwrap();
        assert_eq!(t.rate(&first), Some(1e6));
        assert_eq!(t.rate(&second), Some(1e6));
        // Written fast into the socket buffer: still no faster than the pace lets it leave.
        second.add_bytes(50_000_000);
        std::thread::sleep(Duration::from_millis(110));
        assert_eq!(t.rate(&second), Some(1e6));
        t.set_pacing(None);
        assert!(
            t.rate(&second).is_some_and(|r| r > 1e8),
            "unpaced: as written"
        );
        assert_eq!(t.rate(&first), Some(0.0));
    }

    /// bbr follows a raised cap only a quarter per eight round trips: a cap raised more than
    /// twofold starts it afresh, which sets its rate from the round trip (on loopback, far
    /// above any cap here), so the kernel then paces at the new cap. With no data moving, bbr
    /// left as it is keeps the rate it had.
    #[test]
    fn a_cap_raised_many_times_over_restarts_bbr() {
        let bbr = CcName::parse("bbr").unwrap();
        let available =
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .unwrap_or_default();
        assert!(
            available.split_whitespace().any(|c| c == "bbr"),
            "this test needs the bbr congestion control (modprobe tcp_bbr); available: {available}"
        );
        let t = Transfer::new(true);
        t.set_congestion(Some(bbr));
        let (a, _a) = connected();
        t.join(&a).unwrap();
        let paced = || braid_sockopt::tcp_info(&a).unwrap().pacing_rate;
        t.set_pacing(Some(1_000_000));
        assert_eq!(paced(), 1_000_000);
        t.set_pacing(Some(1_500_000));
        assert_eq!(paced(), 1_000_000, "raised by half: bbr left to follow");
        t.set_pacing(Some(8_000_000));
        assert_eq!(paced(), 8_000_000, "raised over twofold: bbr restarted");
        assert_eq!(t.congestion(), Some(bbr), "back on bbr after the restart");
    }
}
