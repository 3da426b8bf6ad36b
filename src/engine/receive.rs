//! Receiving side of MODE E: one thread per data connection, each block written at its offset
//! and folded into the checksum; done when the EOF block's count of EODs has arrived.
//! Connections may join until then (the sender connects, or this side opens more).

use super::compress::Unpacker;
use super::sink::Sink;
use super::tls::{DataConn, DataTls, refused};
use super::transfer::{Joined, Joins, Link, LinkState, Transfer, join_loop};
use super::{EngineError, FirstError, PIECE};
use braid_proto::block::{BlockError, Completion, Connection, HEADER_LEN, Header, Next, desc};
use braid_proto::checksum::ChunkSum;
use braid_proto::compress;
use braid_proto::ranges::RangeSet;
use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What a finished transfer leaves for the next one: the connections whose sender ended
/// without CLOSE, and the listener it may connect to again.
#[derive(Debug, Default)]
pub struct Kept {
    pub socks: Vec<DataConn>,
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
}

/// Most separate ranges a transfer may leave: a sender's connections leave a gap or two
/// each, a resumed transfer a few more. Beyond it the bookkeeping (and every range marker that
/// spells it out) would grow with each tiny block a hostile client sends.
pub const MAX_PIECES: usize = 4096;

/// What the connection threads share, behind one lock taken twice per block.
#[derive(Default)]
struct State {
    /// One per stripe: each data node of a striped server sends its own EOF block.
    completions: Vec<Completion>,
    progress: Progress,
    /// Blocks being written now, with their connection: no other block may overlap one.
    writing: Vec<(usize, u64, u64)>,
    /// No block may reach past this (what the disk can hold, for an upload of unknown size).
    room: Option<u64>,
    /// Told of every block's end before it is written; an error (a quota) refuses it.
    charge: Option<Charge>,
}

/// See [`Shared::charge_with`].
pub type Charge = Box<dyn FnMut(u64) -> std::io::Result<()> + Send>;

impl State {
    /// Every stripe's EOF block came, with all the EODs it counts.
    fn complete(&self) -> bool {
        !self.completions.is_empty() && self.completions.iter().all(Completion::complete)
    }

    /// Admits the block `[offset, end)` on connection `conn`: refused if it overlaps a block
    /// still arriving elsewhere. Returns the parts of it already stored, whose bytes it must
    /// repeat (a block sent again after a connection broke).
    fn admit(&mut self, conn: usize, offset: u64, end: u64) -> Result<Vec<(u64, u64)>, BlockError> {
        if let Some(room) = self.room.filter(|&r| end > r) {
            return Err(BlockError::PastRoom {
                offset,
                count: end - offset,
                room,
            });
        }
        if self
            .writing
            .iter()
            .any(|&(c, s, e)| c != conn && s < end && offset < e)
        {
            return Err(BlockError::Overlapping {
                offset,
                count: end - offset,
            });
        }
        self.writing.push((conn, offset, end));
        Ok(self.progress.ranges.within(offset, end).collect())
    }

    /// The connections writing blocks that overlap `[offset, end)`, other than `conn`.
    fn writing_over(&self, conn: usize, offset: u64, end: u64) -> Vec<usize> {
        self.writing
            .iter()
            .filter(|&&(c, s, e)| c != conn && s < end && offset < e)
            .map(|&(c, ..)| c)
            .collect()
    }

    /// The block `conn` was writing has ended (stored, or its connection failed).
    fn release(&mut self, conn: usize) {
        self.writing.retain(|&(c, ..)| c != conn);
    }
}

/// The state all connection threads share, locked once per block.
pub struct Shared {
    state: Mutex<State>,
    /// Bytes received, for progress bars and STAT; updated per piece without a lock.
    bytes: Arc<AtomicU64>,
}

impl Progress {
    /// Records a block that arrived whole; `sum` is its checksum, None when it does not sit
    /// on checksum chunks. A block sent again after a connection broke may already be here:
    /// it counts once, since each chunk may enter the checksum (an XOR) only once.
    pub fn record(&mut self, offset: u64, end: u64, sum: Option<ChunkSum>) {
        if self.ranges.covers(offset, end) {
            return;
        }
        let fresh = self.ranges.overlap(offset, end) == 0;
        self.ranges.insert(offset, end);
        self.sum = match (self.sum, sum) {
            (Some(mut s), Some(block)) if fresh => {
                s.merge(block);
                Some(s)
            }
            _ => None,
        };
    }

    /// The start of a transfer whose receiver already holds `have`. Data stored by an earlier
    /// run was not hashed here, so its checksum is unknown unless a record carries it.
    pub fn holding(have: RangeSet) -> Progress {
        Progress {
            sum: have.is_empty().then(ChunkSum::new),
            ranges: have,
        }
    }
}

impl Shared {
    /// Starts from what an earlier, interrupted run already stored.
    pub fn new(resume: Progress, bytes: Arc<AtomicU64>) -> Shared {
        Shared {
            state: Mutex::new(State {
                progress: resume,
                completions: vec![Completion::default()],
                ..State::default()
            }),
            bytes,
        }
    }

    /// Refuses blocks that reach past `room` bytes: a file of unknown size must still fit on
    /// the disk, or a block far out would leave a huge sparse file behind.
    pub fn limit_to(&self, room: u64) {
        self.lock().room = Some(room);
    }

    /// Tells `charge` of every block's end before the block is written: the server's quota
    /// counts the furthest byte of a file, and refuses a block it has no room for.
    pub fn charge_with(&self, charge: Charge) {
        self.lock().charge = Some(charge);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of what has been stored so far (for the resume sidecar).
    pub fn snapshot(&self) -> Progress {
        self.lock().progress.clone()
    }

    fn complete(&self) -> bool {
        self.lock().complete()
    }
}

/// Receives one transfer into `sink` over the connections `joins` brings. `limit`: the file's
/// size when known; no block may reach past it. On failure, [`Shared::snapshot`] still tells
/// what was stored.
pub fn receive(
    transfer: &Transfer,
    joins: Joins,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
) -> Result<Kept, EngineError> {
    receive_stripes(transfer, vec![joins], sink, limit, shared)
}

/// Receives one transfer from the data nodes of a striped server, one [`Joins`] each: every
/// node sends its own EOF block, counting only its own connections, and the transfer is
/// complete when all of them are (GridFTP: one EOF per stripe).
pub fn receive_stripes(
    transfer: &Transfer,
    stripes: Vec<Joins>,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
) -> Result<Kept, EngineError> {
    shared.lock().completions = vec![Completion::default(); stripes.len().max(1)];
    let first_error = FirstError::default();
    let fail = |e: EngineError| first_error.fail(e, transfer.abort());
    let kept = Mutex::new(Vec::new());
    // One connection and none to come (a kept one carrying a small file, say): received on
    // this thread, as starting one would cost more than the file.
    let alone = matches!(stripes.as_slice(), [j] if j.open.len() == 1 && j.accept.is_none() && j.incoming.is_none());
    let mut listener = None;
    std::thread::scope(|scope| {
        let spawn = |stripe: usize, sock: DataConn, reused: bool, tls: Option<Arc<DataTls>>| {
            let link = match transfer.join(sock.tcp()) {
                Ok(l) => l,
                Err(e) => return fail(EngineError::Setup(format!("data connection: {e}"))),
            };
            let (fail, kept) = (&fail, &kept);
            let run = move || {
                let from = sock.tcp().peer_addr().ok();
                let sock = match transfer.secure(tls.as_deref(), sock) {
                    Ok(s) => s,
                    Err(e) => {
                        transfer.end(&link, LinkState::Unused);
                        if let Some(tls) = tls.as_deref() {
                            refused(tls, e, from, transfer.elastic(), fail);
                        }
                        return;
                    }
                };
                let got = receive_conn(transfer, &link, stripe, sock, reused, sink, limit, shared);
                shared.lock().release(link.id);
                match got {
                    Ok(Ended::Kept(sock)) => {
                        transfer.end(&link, LinkState::Finished);
                        kept.lock().unwrap_or_else(|p| p.into_inner()).push(sock)
                    }
                    Ok(Ended::Closed) => transfer.end(&link, LinkState::Finished),
                    Ok(Ended::Unused) => transfer.end(&link, LinkState::Unused),
                    // The sender sends what it carried again on the others (an ordered sink
                    // then lets blocks wait on disk, so no connection stops reading).
                    Err(e) if transfer.elastic() && e.is_connection_loss() => {
                        // Ctrl-C closes every connection: that is no news worth a line each.
                        if !transfer.abort().is_aborted() {
                            tracing::warn!(conn = link.id, "data connection lost: {e}");
                        }
                        transfer.end(&link, LinkState::Lost);
                        if transfer.open() == 0 && !shared.complete() {
                            fail(EngineError::AllLost);
                        }
                    }
                    Err(e) => {
                        transfer.end(&link, LinkState::Lost);
                        fail(e)
                    }
                }
            };
            if alone {
                run();
            } else {
                scope.spawn(run);
            }
        };
        // Connections join a stripe while it runs: at its own listener (a striped download
        // that has the nodes connect, one listener per stripe), or opened by this side (one
        // stripe only: a striped download that connects opens all before it starts).
        // The listeners, and the stripe each is for.
        let (mut accepts, mut accepting) = (Vec::new(), Vec::new());
        let mut incoming = None;
        let mut stall = None;
        let mut tls_of = Vec::new();
        for (stripe, joins) in stripes.into_iter().enumerate() {
            let secure_open = joins.open_tls();
            let Joins {
                open,
                reused,
                accept,
                incoming: opened,
                stall: its_stall,
                tls,
            } = joins;
            for s in open {
                spawn(stripe, s, reused, secure_open.clone());
            }
            stall.get_or_insert(its_stall);
            if let Some(a) = accept {
                accepts.push(a);
                accepting.push(stripe);
            }
            if let Some(rx) = opened {
                if incoming.is_some() {
                    fail(EngineError::Setup(
                        "only one stripe may open connections while it runs".into(),
                    ));
                }
                incoming = Some((stripe, rx));
            }
            tls_of.push(tls);
        }
        // Run even when nothing joins: it waits for the end, or for a stall.
        let stall = stall.unwrap_or(std::time::Duration::from_secs(120));
        {
            // With nothing to join, the transfer also ends when no connection is left (a
            // striped one whose node died: the others' stripes are in, its own never come).
            let closed = accepts.is_empty() && incoming.is_none();
            let joined = join_loop(
                &accepts,
                incoming.as_ref().map(|(_, rx)| rx),
                stall,
                transfer,
                || shared.complete() || (closed && transfer.open() == 0),
                |from, s| {
                    let stripe = match from {
                        Joined::Accepted(i) => accepting[i],
                        Joined::Opened => incoming.as_ref().map_or(0, |(stripe, _)| *stripe),
                    };
                    spawn(stripe, DataConn::Clear(s), false, tls_of[stripe].clone())
                },
            );
            if let Err(e) = joined {
                fail(e);
            }
        }
        // The listener a later transfer may be connected to again (one stripe's only).
        if accepts.len() == 1 {
            listener = accepts.pop().map(|a| a.listener);
        }
        // Complete: every connection the sender counted has sent its EOD. Any other still
        // open is one the sender does not use: joined too late, or given up on (it broke on
        // the sender's side, and its close was lost on the way, so a block on it never
        // ends). Close it so its thread ends. (One whose EOD was counted may still be on its
        // way out: it stays.)
        if shared.complete() {
            for l in transfer.links() {
                if l.state() == LinkState::Open && !l.counted() {
                    l.shutdown();
                }
            }
        }
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    if transfer.abort().is_aborted() {
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
        listener,
    })
}

/// How a receiving connection's part ended.
enum Ended {
    /// EOD without CLOSE: the connection may carry the session's next transfer.
    Kept(DataConn),
    /// EOD with CLOSE.
    Closed,
    /// Closed before its first header: a cached connection the sender let go, or one that
    /// joined an elastic transfer after the sender had finished.
    Unused,
}

/// Receives one connection's blocks until its EOD.
#[allow(clippy::too_many_arguments)]
fn receive_conn(
    transfer: &Transfer,
    link: &Link,
    stripe: usize,
    mut sock: DataConn,
    reused: bool,
    sink: &Sink,
    limit: Option<u64>,
    shared: &Shared,
) -> Result<Ended, EngineError> {
    let conn = link.id;
    let net = |source| EngineError::Net { conn, source };
    let proto = |source| EngineError::Protocol { conn, source };
    let mut checks = Connection::new(limit);
    let mut raw = [0u8; HEADER_LEN];
    // Grown to the largest piece that came, up to PIECE: a small file's buffer costs more to
    // zero than to fill (an upload's size is not known here, and a 4 KiB file's zeroed 256 KiB
    // were 8 % of the server's time).
    let mut buf = Vec::new();
    // For bytes that arrive a second time: what is stored there, to compare.
    let mut check = Vec::new();
    // Compressed blocks: the payload as it came, and their zstd context and output.
    let mut packed = Vec::new();
    let mut unpacker = Unpacker::default();
    // The connection ended inside a block's payload.
    let cut_short = |e: std::io::Error, into: u64, count: u64, offset: u64| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            proto(BlockError::ClosedBeforeEod(format!(
                "the sender closed it {into} bytes into a {count}-byte block at offset {offset}"
            )))
        } else {
            net(e)
        }
    };
    let mut first = true;
    let ended = |checks: &Connection, sock| {
        if checks.reusable() {
            Ended::Kept(sock)
        } else {
            Ended::Closed
        }
    };
    loop {
        let header_read = match read_header(&mut sock, &mut raw) {
            // Reset before carrying anything (a latecomer the sender's listener dropped).
            Err(_) if first && transfer.elastic() => return Ok(Ended::Unused),
            r => r.map_err(net)?,
        };
        if !header_read {
            if first && (reused || transfer.elastic()) {
                return Ok(Ended::Unused);
            }
            return Err(proto(BlockError::ClosedBeforeEod(
                "the sender closed it between blocks".into(),
            )));
        }
        first = false;
        let header = Header::decode(&raw).map_err(proto)?;
        // A compressed block is read whole and inflated first; the checks then see the
        // header of the bytes it stands for.
        let (header, inflated) = if header.descriptor & desc::COMPRESSED != 0 {
            if !transfer.compression().agreed() {
                return Err(proto(BlockError::UnknownDescriptor(desc::COMPRESSED)));
            }
            compress::check_header(&header).map_err(proto)?;
            packed.resize(header.count as usize, 0);
            sock.read_exact(&mut packed)
                .map_err(|e| cut_short(e, 0, header.count, header.offset))?;
            let (prefix, plain) = compress::unwrap(&header, &packed).map_err(proto)?;
            let bytes = unpacker
                .unpack(prefix, &packed[compress::PREFIX_LEN..])
                .map_err(|why| {
                    proto(BlockError::Compressed(format!(
                        "the block at offset {}: {why}",
                        header.offset
                    )))
                })?;
            transfer
                .compression()
                .packed(plain.count, header.count, prefix.level.into());
            (plain, Some(bytes))
        } else {
            transfer.compression().plain(header.payload());
            (header, None)
        };
        let (offset, count, first_try) = {
            let mut state = shared.lock();
            let completion = state
                .completions
                .get_mut(stripe)
                .ok_or_else(|| EngineError::Setup("a connection of no stripe".into()))?;
            let next = checks.header(&header, completion).map_err(proto)?;
            // Counted under the same lock as the EOD it read: whoever sees the transfer
            // complete sees which connections the sender counted.
            if checks.finished() {
                link.set_counted();
            }
            let (offset, count) = match next {
                Next::Done => return Ok(ended(&checks, sock)),
                Next::Payload { offset, count } => (offset, count),
            };
            if let Some(charge) = state.charge.as_mut() {
                charge(offset + count).map_err(EngineError::Local)?;
            }
            // Admitted under the same lock, as nearly every block is; only one that meets
            // another still arriving tries again, outside it.
            (offset, count, state.admit(conn, offset, offset + count))
        };
        let stored = match first_try {
            Ok(stored) => stored,
            Err(_) => admit(transfer, shared, conn, offset, offset + count)?,
        };
        let mut sum = ChunkSum::new();
        let mut aligned = true;
        let mut at = offset;
        let end = offset + count;
        while at < end {
            let n = (end - at).min(PIECE as u64) as usize;
            let piece: &[u8] = match inflated {
                Some(bytes) => &bytes[(at - offset) as usize..][..n],
                None => {
                    if buf.len() < n {
                        buf.resize(n, 0);
                    }
                    sock.read_exact(&mut buf[..n])
                        .map_err(|e| cut_short(e, at - offset, count, offset))?;
                    &buf[..n]
                }
            };
            // A short piece can only be the file's last chunk.
            let ends_file = limit.map_or(
                !n.is_multiple_of(braid_proto::checksum::CHUNK as usize),
                |l| at + n as u64 == l,
            );
            if aligned && sum.add(at, piece, ends_file).is_err() {
                aligned = false;
            }
            same_as_stored(sink, &stored, at, piece, &mut check).map_err(|r| match r {
                Repeat::Differs(offset) => proto(BlockError::Conflicting { offset }),
                Repeat::Unreadable(e) => EngineError::Local(e),
            })?;
            sink.write(at, piece).map_err(EngineError::Local)?;
            at += n as u64;
            shared.bytes.fetch_add(n as u64, Ordering::Relaxed);
            link.add_bytes(n as u64);
        }
        {
            let mut state = shared.lock();
            state.release(conn);
            state.progress.record(offset, end, aligned.then_some(sum));
            if state.progress.ranges.pieces() > MAX_PIECES {
                return Err(proto(BlockError::TooFragmented(MAX_PIECES)));
            }
        }
        if checks.finished() {
            return Ok(ended(&checks, sock));
        }
    }
}

/// How long a block sent again waits for the connection the sender gave up on to let go of
/// the same range.
const GIVEN_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Admits the block `[offset, end)` on connection `conn`: the parts of it already stored, or
/// why not. Past the room there is, the disk is full for this file, as a write there would
/// find: the sender is told so (no space), not of a fault. In an elastic transfer a block
/// that overlaps one still arriving on another connection is one the sender sent again after
/// giving that connection up (it broke on the sender's side, and the close never arrived):
/// that connection is closed, and the block goes in once its thread lets go.
fn admit(
    transfer: &Transfer,
    shared: &Shared,
    conn: usize,
    offset: u64,
    end: u64,
) -> Result<Vec<(u64, u64)>, EngineError> {
    let proto = |source| EngineError::Protocol { conn, source };
    let deadline = std::time::Instant::now() + GIVEN_UP_WAIT;
    loop {
        let (got, over) = {
            let mut state = shared.lock();
            let got = state.admit(conn, offset, end);
            let over = match &got {
                Err(BlockError::Overlapping { .. }) => state.writing_over(conn, offset, end),
                _ => Vec::new(),
            };
            (got, over)
        };
        match got {
            Ok(stored) => return Ok(stored),
            Err(BlockError::PastRoom { .. }) => {
                return Err(EngineError::Local(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::NOSPC.raw_os_error(),
                )));
            }
            Err(BlockError::Overlapping { .. })
                if transfer.elastic() && std::time::Instant::now() < deadline =>
            {
                for l in transfer.links() {
                    if over.contains(&l.id) && l.state() == LinkState::Open {
                        tracing::debug!(
                            conn = l.id,
                            "closing a data connection the sender sent a block of again"
                        );
                        l.shutdown();
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return Err(proto(e)),
        }
    }
}

/// Checks that `piece`, to be written at `at`, repeats what is already stored where it meets
/// `stored`: a block may arrive twice (sent again after a connection broke), but never with
/// other bytes, which would commit a mix of two files. Only a file can be read back; other
/// sinks rely on the whole-file checksum.
fn same_as_stored(
    sink: &Sink,
    stored: &[(u64, u64)],
    at: u64,
    piece: &[u8],
    check: &mut Vec<u8>,
) -> Result<(), Repeat> {
    let end = at + piece.len() as u64;
    for &(s, e) in stored {
        let (s, e) = (s.max(at), e.min(end));
        if s >= e {
            continue;
        }
        check.resize((e - s) as usize, 0);
        match sink.read_at(s, check) {
            None => return Ok(()),
            Some(r) => r.map_err(Repeat::Unreadable)?,
        }
        let mine = &piece[(s - at) as usize..(e - at) as usize];
        if let Some(i) = mine.iter().zip(check.iter()).position(|(a, b)| a != b) {
            return Err(Repeat::Differs(s + i as u64));
        }
    }
    Ok(())
}

/// Why bytes that arrived a second time were refused.
enum Repeat {
    /// They differ from the stored ones, from this offset on.
    Differs(u64),
    /// The stored ones could not be read back.
    Unreadable(std::io::Error),
}

/// Reads one header; false if the connection ended cleanly before its first byte.
fn read_header(sock: &mut impl Read, raw: &mut [u8; HEADER_LEN]) -> std::io::Result<bool> {
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

/// Entry point for `fuzz/` (cargo-fuzz): what a hostile sender's block streams do to the
/// receiver's bookkeeping, without sockets. Compiled always, so the unit tests run it too.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// `data`: a file size byte (0: unknown), then records of a connection number byte, a
    /// block header and as many payload bytes as it announces (as many as are left). Each
    /// connection keeps its own checks; all share one [`State`], as the threads do.
    pub fn mode_e_receiver(data: &[u8]) {
        let Some((&size, mut rest)) = data.split_first() else {
            return;
        };
        let limit = (size > 0).then_some(u64::from(size) * 1000);
        let mut state = State {
            room: Some(1 << 40),
            ..State::default()
        };
        let mut conns: Vec<Connection> = (0..4).map(|_| Connection::new(limit)).collect();
        let mut completion = Completion::default();
        while let Some((&which, after)) = rest.split_first() {
            let Some((raw, after)) = after.split_first_chunk::<HEADER_LEN>() else {
                return;
            };
            rest = after;
            let conn = usize::from(which % 4);
            let Ok(header) = Header::decode(raw) else {
                continue;
            };
            let Ok(Next::Payload { offset, count }) = conns[conn].header(&header, &mut completion)
            else {
                continue;
            };
            let Ok(_stored) = state.admit(conn, offset, offset + count) else {
                continue;
            };
            let carried = (count as usize).min(rest.len());
            rest = &rest[carried..];
            state.release(conn);
            if carried as u64 == count {
                state.progress.record(offset, offset + count, None);
            }
            assert!(state.writing.iter().all(|&(c, ..)| c != conn));
            if let Some(l) = limit {
                assert!(state.progress.ranges.iter().all(|(_, e)| e <= l));
            }
            if state.progress.ranges.pieces() > MAX_PIECES {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_entry_takes_streams_of_blocks() {
        let mut data = vec![5u8];
        for (conn, offset, count) in [(0u8, 0u64, 10u64), (1, 5, 10), (2, 4000, 10), (1, 20, 0)] {
            data.push(conn);
            data.extend_from_slice(&Header::data(offset, count).encode());
            data.extend(std::iter::repeat_n(7u8, count as usize));
        }
        data.push(3);
        data.extend_from_slice(&Header::eof(1).encode());
        fuzzing::mode_e_receiver(&data);
        fuzzing::mode_e_receiver(&[]);
        fuzzing::mode_e_receiver(&[0, 1, 2, 3]);
    }

    #[test]
    fn a_block_may_not_overlap_one_still_arriving_elsewhere_nor_pass_the_room() {
        let mut s = State {
            room: Some(10_000),
            ..State::default()
        };
        s.progress.ranges.insert(0, 1000);
        // Partly stored already: admitted, with the part to compare.
        assert_eq!(s.admit(1, 500, 2000), Ok(vec![(500, 1000)]));
        // Another connection may not write into it meanwhile; the same one moves on.
        assert!(matches!(
            s.admit(2, 1500, 2500),
            Err(BlockError::Overlapping { offset: 1500, .. })
        ));
        assert_eq!(s.admit(2, 2000, 3000), Ok(vec![]));
        s.release(1);
        assert_eq!(s.admit(3, 1500, 2000), Ok(vec![]));
        assert!(matches!(
            s.admit(4, 9_999, 10_001),
            Err(BlockError::PastRoom { room: 10_000, .. })
        ));
    }

    /// Receives `len` bytes (a transfer `elastic` or not, with `stall` as its stall time)
    /// over two loopback connections while `send` writes the sender's side of them; `send`
    /// also gets the receiving state, to wait on it. Returns the outcome, what was stored and
    /// how long it took. The sending sockets stay open until the receiver is done.
    fn receive_two(
        len: u64,
        elastic: bool,
        stall: std::time::Duration,
        send: impl FnOnce(&mut std::net::TcpStream, &mut std::net::TcpStream, &Shared) + Send,
    ) -> (Result<Kept, EngineError>, Progress, std::time::Duration) {
        use std::net::TcpStream;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut a = TcpStream::connect(addr).unwrap();
        let mut b = TcpStream::connect(addr).unwrap();
        let receivers: Vec<TcpStream> = (0..2).map(|_| listener.accept().unwrap().0).collect();
        let transfer = Transfer::new(elastic);
        let shared = Shared::new(Progress::default(), Default::default());
        let started = std::time::Instant::now();
        let got = std::thread::scope(|s| {
            s.spawn(|| send(&mut a, &mut b, &shared));
            receive(
                &transfer,
                Joins::fixed(receivers, stall),
                &Sink::Discard,
                Some(len),
                &shared,
            )
        });
        (got, shared.snapshot(), started.elapsed())
    }

    /// A connection the sender gave up on whose close never arrived (lost on a full modem
    /// queue): its block never ends. The same block sent again on another connection goes in
    /// (the silent one is closed), and once the EOF block's count of EODs is in, the transfer
    /// ends at once, not when the silent connection's stall timer runs out.
    #[test]
    fn a_block_sent_again_after_its_connection_was_given_up_goes_in_and_the_transfer_ends() {
        use std::io::Write;
        use std::time::Duration;
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
        let block = Header::data(0, data.len() as u64).encode();
        let (got, stored, took) = receive_two(
            4000,
            true,
            Duration::from_secs(20),
            |given_up, other, shared| {
                given_up.write_all(&block).unwrap();
                given_up.write_all(&data[..1000]).unwrap();
                // The receiver is writing that block before the same one comes again.
                while shared.lock().writing.is_empty() {
                    std::thread::sleep(Duration::from_millis(2));
                }
                other.write_all(&block).unwrap();
                other.write_all(&data).unwrap();
                other.write_all(&Header::eof(1).encode()).unwrap();
            },
        );
        assert!(got.is_ok(), "{:?}", got.err());
        assert_eq!(stored.ranges.len(), 4000);
        // Well before the 20 s stall time would have ended it.
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    /// A connection whose blocks all arrived but which the sender then gave up on (its EOD,
    /// and its close, never came): the EOF block does not count it, and the transfer ends as
    /// soon as the counted EODs are in, without waiting for it to time out.
    #[test]
    fn a_connection_the_sender_does_not_count_does_not_hold_up_the_end() {
        use std::io::Write;
        use std::time::Duration;
        let data: Vec<u8> = (0..8000u32).map(|i| (i * 3) as u8).collect();
        let (got, stored, took) =
            receive_two(8000, true, Duration::from_secs(20), |given_up, other, _| {
                given_up.write_all(&Header::data(0, 4000).encode()).unwrap();
                given_up.write_all(&data[..4000]).unwrap();
                other.write_all(&Header::data(4000, 4000).encode()).unwrap();
                other.write_all(&data[4000..]).unwrap();
                other.write_all(&Header::eof(1).encode()).unwrap();
            });
        assert!(got.is_ok(), "{:?}", got.err());
        assert_eq!(stored.ranges.len(), 8000);
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    /// A block that takes longer to arrive than the stall time (a modem, several
    /// connections sharing it) is not a stalled peer while its bytes keep coming.
    #[test]
    fn a_block_slower_than_the_stall_time_is_not_a_stall_while_its_bytes_come() {
        use std::io::Write;
        use std::time::Duration;
        let data: Vec<u8> = (0..4000u32).map(|i| i as u8).collect();
        let (got, stored, _) = receive_two(4000, false, Duration::from_millis(300), |a, b, _| {
            a.write_all(&Header::data(0, data.len() as u64).encode())
                .unwrap();
            // 4000 bytes over about a second, against a stall time of 300 ms.
            for piece in data.chunks(100) {
                a.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(25));
            }
            a.write_all(&Header::eod().encode()).unwrap();
            b.write_all(&Header::eof(2).encode()).unwrap();
        });
        assert!(got.is_ok(), "{:?}", got.err());
        assert_eq!(stored.ranges.len(), data.len() as u64);
    }

    /// A striped download where the nodes connect: one listener per stripe, each stripe's
    /// EOF counting only its own connections. The transfer is complete only when both
    /// stripes are, and a stripe's connections may arrive after the other stripe ended.
    #[test]
    fn stripes_that_connect_each_to_its_own_listener_end_with_their_own_eof() {
        use super::super::transfer::{Accept, Admits};
        use std::io::Write;
        use std::net::{TcpListener, TcpStream};
        use std::time::Duration;
        let data: Vec<u8> = (0..12_000u32).map(|i| (i * 5) as u8).collect();
        let listeners: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let stripes = listeners
            .into_iter()
            .map(|listener| {
                let accept = Accept {
                    listener,
                    peer: Admits::client("127.0.0.1".parse().unwrap()),
                    max: 8,
                    buffer: None,
                    timeout: Some(Duration::from_secs(20)),
                };
                Joins::accept(accept, Duration::from_secs(20))
            })
            .collect();
        let transfer = Transfer::new(false);
        let shared = Shared::new(Progress::default(), Default::default());
        let block = |sock: &mut TcpStream, at: usize, len: usize| {
            sock.write_all(&Header::data(at as u64, len as u64).encode())
                .unwrap();
            sock.write_all(&data[at..at + len]).unwrap();
        };
        let got = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                // Stripe 0: two connections, its EOF counts two.
                let mut a = TcpStream::connect(addrs[0]).unwrap();
                let mut b = TcpStream::connect(addrs[0]).unwrap();
                block(&mut a, 0, 4000);
                block(&mut b, 8000, 4000);
                a.write_all(&Header::eod().encode()).unwrap();
                b.write_all(&Header::eof(2).encode()).unwrap();
                while !shared.lock().completions[0].complete() {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let first_alone = shared.complete();
                // Stripe 1 connects only now, once.
                let mut c = TcpStream::connect(addrs[1]).unwrap();
                block(&mut c, 4000, 4000);
                c.write_all(&Header::eof(1).encode()).unwrap();
                (first_alone, [a, b, c])
            });
            let got = receive_stripes(&transfer, stripes, &Sink::Discard, Some(12_000), &shared);
            (got, sender.join().unwrap().0)
        });
        let (received, first_alone) = got;
        assert!(!first_alone, "one stripe's EOF ended the whole transfer");
        assert!(received.is_ok(), "{:?}", received.err());
        assert_eq!(shared.snapshot().ranges.len(), 12_000);
        assert_eq!(transfer.links().len(), 3);
    }
}
