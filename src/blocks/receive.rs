//! Receiving side of MODE E: one thread per data connection, each block written at its offset
//! and folded into the checksum; done when the EOF block's count of EODs has arrived.

use super::sink::Sink;
use super::{Abort, EngineError, FirstError, PIECE, set_buffer};
use braid_proto::block::{BlockError, Completion, Connection, HEADER_LEN, Header, Next};
use braid_proto::checksum::ChunkSum;
use braid_proto::ranges::RangeSet;
use std::io::Read;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the data connections come from.
pub struct Conns {
    /// Already connected: the receiver opened them, or an earlier transfer left them open.
    pub open: Vec<TcpStream>,
    /// `open` carried an earlier transfer: one that closes before its first header has just
    /// left the cache, which is no error.
    pub reused: bool,
    /// Where the sender may open (more) connections.
    pub accept: Option<Accept>,
}

/// The sender connects here, as many times as it likes, until its EOF block's count of
/// connections has sent EOD. Connections from any host but `peer` are dropped.
pub struct Accept {
    pub listener: TcpListener,
    pub peer: IpAddr,
    /// How long to wait for a connection while data is still owed.
    pub wait: Duration,
    /// Most connections for one transfer, counting the open ones.
    pub max: usize,
    pub buffer: Option<u64>,
}

impl Conns {
    pub fn fixed(open: Vec<TcpStream>) -> Conns {
        Conns {
            open,
            reused: false,
            accept: None,
        }
    }

    pub fn accept(accept: Accept) -> Conns {
        Conns {
            open: Vec::new(),
            reused: false,
            accept: Some(accept),
        }
    }
}

/// What a finished transfer leaves for the next one: the connections whose sender ended
/// without CLOSE, and the listener it may connect to again.
#[derive(Debug, Default)]
pub struct Kept {
    pub socks: Vec<TcpStream>,
    pub listener: Option<TcpListener>,
}

/// What has arrived so far: survives a failure, so a partial download can be resumed.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Byte ranges written (whole blocks only).
    pub ranges: RangeSet,
    /// Checksum accumulator over `ranges`; None once a block that does not sit on checksum
    /// chunks arrived (a non-braid sender).
    pub sum: Option<ChunkSum>,
    /// Bytes per data connection, in the order the connections came.
    pub per_conn: Vec<u64>,
}

/// The state all connection threads share, locked once per block.
pub struct Shared {
    state: Mutex<(Completion, Progress)>,
    /// Bytes received, for progress bars and STAT; updated per piece without a lock.
    bytes: Arc<AtomicU64>,
}

impl Progress {
    /// The start of a transfer whose receiver already holds `have`. Data stored by an earlier
    /// run was not hashed here, so its checksum is unknown unless a record carries it.
    pub fn holding(have: RangeSet) -> Progress {
        Progress {
            sum: have.is_empty().then(ChunkSum::new),
            ranges: have,
            per_conn: Vec::new(),
        }
    }
}

impl Shared {
    /// Starts from what an earlier, interrupted run already stored.
    pub fn new(mut resume: Progress, bytes: Arc<AtomicU64>) -> Shared {
        resume.per_conn.clear();
        Shared {
            state: Mutex::new((Completion::default(), resume)),
            bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, (Completion, Progress)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of what has been stored so far (for the resume sidecar).
    pub fn snapshot(&self) -> Progress {
        self.lock().1.clone()
    }

    fn complete(&self) -> bool {
        self.lock().0.complete()
    }
}

/// Receives one transfer into `sink`. `limit`: the file's size when known; no block may reach
/// past it. On failure, [`Shared::snapshot`] still tells what was stored.
pub fn receive(
    conns: Conns,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
    abort: &Abort,
) -> Result<Kept, EngineError> {
    let first_error = FirstError::default();
    let fail = |e: EngineError| first_error.fail(e, abort);
    let kept = Mutex::new(Vec::new());
    let open = conns.open.len();
    std::thread::scope(|scope| {
        let spawn = |conn: usize, sock: TcpStream, reused: bool| {
            abort.register(&sock);
            shared.lock().1.per_conn.push(0);
            let (fail, kept) = (&fail, &kept);
            scope.spawn(
                move || match receive_conn(conn, sock, reused, sink, limit, shared) {
                    Ok(Some(sock)) => kept.lock().unwrap_or_else(|p| p.into_inner()).push(sock),
                    Ok(None) => {}
                    Err(e) => fail(e),
                },
            );
        };
        for (i, s) in conns.open.into_iter().enumerate() {
            spawn(i, s, conns.reused);
        }
        if let Some(a) = &conns.accept
            && let Err(e) = accept_loop(a, open, shared, abort, |i, s| spawn(i, s, false))
        {
            fail(e);
        }
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    if abort.is_aborted() {
        return Err(EngineError::Aborted);
    }
    if !shared.complete() {
        return Err(EngineError::Setup(
            "the data connections ended without the sender's EOF block".into(),
        ));
    }
    sink.finish().map_err(EngineError::Local)?;
    Ok(Kept {
        socks: kept.into_inner().unwrap_or_else(|p| p.into_inner()),
        listener: conns.accept.map(|a| a.listener),
    })
}

/// Accepts the sender's connections until the transfer is complete; `open` connections are
/// already running.
fn accept_loop(
    a: &Accept,
    open: usize,
    shared: &Shared,
    abort: &Abort,
    mut spawn: impl FnMut(usize, TcpStream),
) -> Result<(), EngineError> {
    let Accept {
        listener,
        peer,
        wait,
        max,
        buffer,
    } = a;
    let (peer, wait, max, buffer) = (*peer, *wait, *max, *buffer);
    listener
        .set_nonblocking(true)
        .map_err(|e| EngineError::Setup(e.to_string()))?;
    let mut accepted = open;
    // Last time anything happened: a connection arrived or bytes moved.
    let mut last = Instant::now();
    let mut last_bytes = 0;
    while !shared.complete() && !abort.is_aborted() {
        let fd = rustix::event::PollFd::new(listener, rustix::event::PollFlags::IN);
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        let _ = rustix::event::poll(&mut [fd], Some(&tick));
        match listener.accept() {
            Ok((sock, from)) => {
                if braid_proto::session::canonical_ip(from.ip()) != peer {
                    // A stray (port scan, another host): ignore it rather than fail.
                    tracing::warn!(%from, "refused data connection from a host other than the client");
                    continue;
                }
                if accepted >= max {
                    tracing::warn!(%from, max, "refused data connection beyond the limit");
                    continue;
                }
                let _ = sock.set_nonblocking(false);
                let _ = sock.set_read_timeout(Some(wait));
                set_buffer(&sock, buffer);
                spawn(accepted, sock);
                accepted += 1;
                last = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Data moving on open connections keeps the wait alive; a sender that neither
                // sends nor connects for `wait` has stalled.
                let bytes = shared.bytes.load(Ordering::Relaxed);
                if bytes != last_bytes {
                    last_bytes = bytes;
                    last = Instant::now();
                } else if last.elapsed() > wait {
                    return Err(EngineError::Setup(if accepted == 0 {
                        format!("no data connection arrived within {} s", wait.as_secs())
                    } else {
                        format!(
                            "the sender announced more data connections than arrived within {} s",
                            wait.as_secs()
                        )
                    }));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(EngineError::Setup(format!("accept: {e}"))),
        }
    }
    Ok(())
}

/// Receives one connection's blocks until its EOD. Returns the connection when the sender
/// left it open for the next transfer.
fn receive_conn(
    conn: usize,
    mut sock: TcpStream,
    reused: bool,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
) -> Result<Option<TcpStream>, EngineError> {
    let net = |source| EngineError::Net { conn, source };
    let proto = |source| EngineError::Protocol { conn, source };
    let mut checks = Connection::new(limit);
    let mut raw = [0u8; HEADER_LEN];
    let mut buf = vec![0u8; PIECE];
    let mut first = true;
    loop {
        if !read_header(&mut sock, &mut raw).map_err(net)? {
            if reused && first {
                // The sender closed a cached connection instead of using it again.
                return Ok(None);
            }
            return Err(proto(BlockError::ClosedBeforeEod(
                "the sender closed it between blocks".into(),
            )));
        }
        first = false;
        let header = Header::decode(&raw).map_err(proto)?;
        let next = checks
            .header(&header, &mut shared.lock().0)
            .map_err(proto)?;
        let keep = |checks: &Connection, sock| checks.reusable().then_some(sock);
        let (offset, count) = match next {
            Next::Done => return Ok(keep(&checks, sock)),
            Next::Payload { offset, count } => (offset, count),
        };
        let mut sum = ChunkSum::new();
        let mut aligned = true;
        let mut at = offset;
        let end = offset + count;
        while at < end {
            let n = (end - at).min(PIECE as u64) as usize;
            let piece = &mut buf[..n];
            sock.read_exact(piece).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    proto(BlockError::ClosedBeforeEod(format!(
                        "the sender closed it {} bytes into a {count}-byte block at offset {offset}",
                        at - offset
                    )))
                } else {
                    net(e)
                }
            })?;
            // A short piece can only be the file's last chunk.
            let ends_file = limit.map_or(
                !n.is_multiple_of(braid_proto::checksum::CHUNK as usize),
                |l| at + n as u64 == l,
            );
            if aligned && sum.add(at, piece, ends_file).is_err() {
                aligned = false;
            }
            sink.write(at, piece).map_err(EngineError::Local)?;
            at += n as u64;
            shared.bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        {
            let mut st = shared.lock();
            let p = &mut st.1;
            p.ranges.insert(offset, end);
            p.sum = match (p.sum, aligned) {
                (Some(mut s), true) => {
                    s.merge(sum);
                    Some(s)
                }
                _ => None,
            };
            if let Some(c) = p.per_conn.get_mut(conn) {
                *c += count;
            }
        }
        if checks.finished() {
            return Ok(keep(&checks, sock));
        }
    }
}

/// Reads one header; false if the connection ended cleanly before its first byte.
fn read_header(sock: &mut TcpStream, raw: &mut [u8; HEADER_LEN]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < HEADER_LEN {
        match sock.read(&mut raw[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed inside a block header ({got} of {HEADER_LEN} bytes)"
                    ),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
