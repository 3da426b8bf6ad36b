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
pub enum Conns {
    /// Already connected (the receiver opened them).
    Fixed(Vec<TcpStream>),
    /// The sender connects here, as many times as it likes, until its EOF block's count of
    /// connections has sent EOD. Connections from any host but `peer` are dropped.
    Accept {
        listener: TcpListener,
        peer: IpAddr,
        /// How long to wait for a connection while data is still owed.
        wait: Duration,
        /// Most connections accepted for one transfer.
        max: usize,
        buffer: Option<u64>,
    },
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
) -> Result<(), EngineError> {
    let first_error = FirstError::default();
    let fail = |e: EngineError| first_error.fail(e, abort);
    std::thread::scope(|scope| {
        let spawn = |conn: usize, sock: TcpStream| {
            abort.register(&sock);
            shared.lock().1.per_conn.push(0);
            let fail = &fail;
            scope.spawn(move || {
                if let Err(e) = receive_conn(conn, sock, sink, limit, shared) {
                    fail(e);
                }
            });
        };
        match conns {
            Conns::Fixed(socks) => {
                for (i, s) in socks.into_iter().enumerate() {
                    spawn(i, s);
                }
            }
            Conns::Accept {
                listener,
                peer,
                wait,
                max,
                buffer,
            } => {
                if let Err(e) =
                    accept_loop(&listener, peer, wait, max, buffer, shared, abort, |i, s| {
                        spawn(i, s)
                    })
                {
                    fail(e);
                }
            }
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
    sink.finish().map_err(EngineError::Local)
}

#[allow(clippy::too_many_arguments)]
fn accept_loop(
    listener: &TcpListener,
    peer: IpAddr,
    wait: Duration,
    max: usize,
    buffer: Option<u64>,
    shared: &Shared,
    abort: &Abort,
    mut spawn: impl FnMut(usize, TcpStream),
) -> Result<(), EngineError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| EngineError::Setup(e.to_string()))?;
    let mut accepted = 0usize;
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

fn receive_conn(
    conn: usize,
    mut sock: TcpStream,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
) -> Result<(), EngineError> {
    let net = |source| EngineError::Net { conn, source };
    let proto = |source| EngineError::Protocol { conn, source };
    let mut checks = Connection::new(limit);
    let mut raw = [0u8; HEADER_LEN];
    let mut buf = vec![0u8; PIECE];
    loop {
        if !read_header(&mut sock, &mut raw).map_err(net)? {
            return Err(proto(BlockError::ClosedBeforeEod(
                "the sender closed it between blocks".into(),
            )));
        }
        let header = Header::decode(&raw).map_err(proto)?;
        let next = checks
            .header(&header, &mut shared.lock().0)
            .map_err(proto)?;
        let (offset, count) = match next {
            Next::Done => return Ok(()),
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
            return Ok(());
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
