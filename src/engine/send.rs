//! Sending side of MODE E: one thread per data connection, one atomic cursor over the blocks,
//! EOD on every connection and EOF, with the count of EODs, on the one that finishes last.
//! Connections may join while blocks remain; in an elastic transfer they may also be retired
//! or break (their blocks are sent again on the others), so the EOF count is settled only
//! when the last connection leaves.

use super::compress::Packer;
use super::compress_level::{Choice, Governor, LEVELS, PROBE, Sent as Cost};
use super::file_send::{FileSender, send_more};
use super::roster::{Leave, Roster};
use super::tls::{DataConn, refused};
use super::transfer::{Joins, Link, LinkState, Transfer, join_loop};
use super::{EngineError, FirstError, PIECE};
use braid_proto::block::Header;
use braid_proto::checksum::ChunkSum;
use braid_proto::compress::Policy;
use braid_proto::ranges::RangeSet;
use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the bytes come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    File {
        file: &'a File,
        size: u64,
    },
    Memory(&'a [u8]),
    /// Many files end to end (RBND).
    Bundle(&'a super::bundle::Files<'a>),
}

impl Source<'_> {
    pub fn size(&self) -> u64 {
        match self {
            Source::File { size, .. } => *size,
            Source::Memory(m) => m.len() as u64,
            Source::Bundle(b) => b.layout.total(),
        }
    }
}

/// What each connection carried, the checksum of what was sent when asked for, and the
/// connections themselves when they were kept.
#[derive(Debug, Default)]
pub struct Sent {
    pub per_conn: Vec<u64>,
    pub sum: Option<ChunkSum>,
    pub kept: Vec<DataConn>,
    /// The bytes these connections took from the shared [`Blocks`] (and sent, some again on
    /// another of them after a break): a striped upload's share for one data node.
    pub taken: RangeSet,
}

/// How to send.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Largest block; smaller ones go out where [`block_len`] says.
    pub block: u64,
    /// Read the data through memory and fold it into the checksum (the sender of an upload
    /// needs it); otherwise file data goes by [`FileSender`] (`sendfile` to another host).
    pub hash: bool,
    /// End with EOD but without CLOSE and leave the connections open for the next transfer
    /// (GridFTP data-channel caching); otherwise set CLOSE and shut them down.
    pub keep: bool,
}

/// The bytes to send, cut into blocks as connections take them: one atomic cursor (the offset
/// of the next byte nobody has taken), so taking a block costs one compare-and-swap. Blocks
/// start and end at multiples of `align` (the checksum chunk) except where a range or the file
/// starts or ends, so that they line up with checksum chunks whatever was sent before a restart.
pub struct Blocks {
    ranges: Vec<(u64, u64)>,
    /// Bytes in `ranges[i..]`, for what is left.
    from: Vec<u64>,
    next: AtomicU64,
    align: u64,
}

impl Blocks {
    pub fn new(todo: &RangeSet, align: u64) -> Blocks {
        let ranges: Vec<(u64, u64)> = todo.iter().filter(|(s, e)| e > s).collect();
        let mut from = vec![0; ranges.len() + 1];
        for (i, (s, e)) in ranges.iter().enumerate().rev() {
            from[i] = from[i + 1] + (e - s);
        }
        Blocks {
            next: AtomicU64::new(ranges.first().map_or(0, |r| r.0)),
            ranges,
            from,
            align: align.max(1),
        }
    }

    /// Takes the next block of about `want` bytes (at least up to the next multiple of the
    /// alignment), as (offset, length); None when everything was taken.
    pub fn take(&self, want: u64) -> Option<(u64, u64)> {
        let mut at = self.next.load(Ordering::Acquire);
        loop {
            let (r, start) = self.untaken(at)?;
            let e = self.ranges[r].1;
            let aligned = start.saturating_add(want) / self.align * self.align;
            let end = if aligned > start {
                aligned
            } else {
                (start / self.align + 1).saturating_mul(self.align)
            };
            let end = end.min(e);
            match self
                .next
                .compare_exchange_weak(at, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some((start, end - start)),
                Err(now) => at = now,
            }
        }
    }

    /// Bytes nobody has taken yet.
    pub fn left(&self) -> u64 {
        let at = self.next.load(Ordering::Acquire);
        self.untaken(at)
            .map_or(0, |(r, start)| self.ranges[r].1 - start + self.from[r + 1])
    }

    /// With the cursor at `at`: the range the next block comes from, and where it starts.
    fn untaken(&self, at: u64) -> Option<(usize, u64)> {
        let r = self.ranges.partition_point(|&(_, e)| e <= at);
        self.ranges.get(r).map(|&(s, _)| (r, at.max(s)))
    }
}

/// How long a block should take on its connection. Short enough that a connection the policy
/// retires leaves soon, and that the last blocks of a transfer end together, even on a T1
/// shared by many connections; long enough that on fast paths the largest block is used.
const BLOCK_TIME: f64 = 0.5;

/// How long a compressed block should take on its connection once the level has settled: a
/// zstd frame shrinks logs 5.2 times in 256 KiB, 5.8 in 4 MiB, and only paths slower than
/// the compressor compress at all, where a longer block costs little.
const PACKED_BLOCK_TIME: f64 = 4.0;

/// The size of the next block a connection takes: at most `max`, no more than the connection
/// moves in `time` seconds at `rate` (bytes/s, None before it has a rate), and no more than
/// half of an equal share of what is `left` among the `open` connections, so that near the
/// end blocks shrink and the connections finish together (guided self-scheduling, as parallel
/// loops hand out their last iterations).
pub fn block_len(max: u64, left: u64, open: usize, rate: Option<f64>, time: f64) -> u64 {
    let share = left / (2 * open.max(1) as u64);
    let timed = rate.map_or(u64::MAX, |r| (r * time) as u64);
    max.min(share).min(timed)
}

/// Sends `todo` from `source` over the connections `joins` brings, for as long as they come.
pub fn send(
    transfer: &Transfer,
    source: Source<'_>,
    todo: &RangeSet,
    joins: Joins,
    options: Options,
    progress: &AtomicU64,
) -> Result<Sent, EngineError> {
    let blocks = Blocks::new(todo, braid_proto::checksum::CHUNK);
    send_from(transfer, source, &blocks, joins, options, progress)
}

/// Sends what is left of `blocks`, which other transfers may take from too: a striped upload
/// runs one per data node (each node counts its own connections' EODs), all drawing on one
/// file's blocks, so a faster node simply takes more of them.
pub fn send_from(
    transfer: &Transfer,
    source: Source<'_>,
    blocks: &Blocks,
    joins: Joins,
    options: Options,
    progress: &AtomicU64,
) -> Result<Sent, EngineError> {
    let state = State {
        source,
        blocks,
        redo: Mutex::new(Vec::new()),
        redo_waiting: AtomicBool::new(false),
        end: Mutex::new(Roster::default()),
        wake: Condvar::new(),
        progress,
        options,
        transfer,
    };
    let first_error = FirstError::default();
    let fail = |e: EngineError| first_error.fail(e, transfer.abort());
    let results: Mutex<Vec<Leaving>> = Mutex::new(Vec::new());
    let secure_open = joins.open_tls();
    let Joins {
        open,
        reused,
        accept,
        incoming,
        stall,
        tls,
    } = joins;
    let tls = tls.as_deref();
    std::thread::scope(|scope| {
        let (state, results, fail) = (&state, &results, &fail);
        let finish = move |r: Result<Leaving, EngineError>| match r {
            Ok(r) => results.lock().unwrap_or_else(|p| p.into_inner()).push(r),
            Err(e) => fail(e),
        };
        // Every connection open at the start is counted before any thread can finish, so the
        // EOF count of a fixed set is its size, as GridFTP receivers expect. Under TLS each
        // is secured on its own thread: a handshake costs a round trip or two.
        let mut admitted = Vec::new();
        for conn in open {
            match state.admit(conn.tcp()) {
                Some(link) => admitted.push((conn, link)),
                None => fail(EngineError::Setup("cannot track a data connection".into())),
            }
        }
        // One connection and none to come (a kept one carrying a small file, say): sent on
        // this thread, as starting one would cost more than the file.
        let alone = admitted.len() == 1 && accept.is_none() && incoming.is_none();
        let secure_open = secure_open.as_deref();
        for (conn, link) in admitted {
            let go = move || {
                finish(
                    transfer
                        .secure(secure_open, conn)
                        .map_err(EngineError::Tls)
                        .and_then(|conn| state.run(&link, conn, reused)),
                )
            };
            if alone {
                go();
            } else {
                scope.spawn(go);
            }
        }
        let run = move |conn: DataConn, link: Arc<Link>| finish(state.run(&link, conn, false));
        // Under TLS, one that joins later is secured on its own thread (one that stalls its
        // handshake holds up nobody) and counted in only then: a stranger that fails to prove
        // it belongs to the session leaves no trace in the EOF count.
        let join = |sock: TcpStream| match tls {
            None => {
                if let Some(link) = state.admit(&sock) {
                    scope.spawn(move || run(DataConn::Clear(sock), link));
                }
            }
            Some(tls) => {
                let from = sock.peer_addr().ok();
                // Counted from now, so the listener's limit holds while it handshakes.
                let pending = transfer.handshaking();
                scope.spawn(move || {
                    let secured = transfer.secure(Some(tls), DataConn::Clear(sock));
                    drop(pending);
                    match secured {
                        Ok(conn) => {
                            if let Some(link) = state.admit(conn.tcp()) {
                                run(conn, link)
                            }
                        }
                        Err(e) => refused(tls, e, from, transfer.elastic(), fail),
                    }
                });
            }
        };
        if accept.is_some() || incoming.is_some() {
            let joined = join_loop(
                accept.as_slice(),
                incoming.as_ref(),
                stall,
                transfer,
                || state.finished(),
                |_, sock| join(sock),
            );
            if let Err(e) = joined {
                fail(e);
            }
        }
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    if transfer.abort().is_aborted() {
        return Err(EngineError::Aborted);
    }
    let end = state.end.into_inner().unwrap_or_else(|p| p.into_inner());
    if !end.eof_sent() {
        return Err(EngineError::AllLost);
    }
    let mut sent = Sent {
        per_conn: transfer.per_link_bytes(),
        ..Sent::default()
    };
    let mut sum = ChunkSum::new();
    for (s, sock, taken) in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        sum.merge(s);
        if let Some(sock) = sock {
            sent.kept.push(sock);
        }
        for (start, end) in taken.iter() {
            sent.taken.insert(start, end);
        }
    }
    sent.sum = options.hash.then_some(sum);
    Ok(sent)
}

/// The sending state all connection threads share.
struct State<'a> {
    source: Source<'a>,
    blocks: &'a Blocks,
    /// Blocks that went out on connections that broke, to be sent again (elastic only).
    redo: Mutex<Vec<(u64, u64)>>,
    redo_waiting: AtomicBool,
    end: Mutex<Roster>,
    /// Wakes idle connections when blocks need sending again or the last one left.
    wake: Condvar,
    progress: &'a AtomicU64,
    options: Options,
    transfer: &'a Transfer,
}

/// What a connection thread leaves behind: its share of the checksum, the socket when it is
/// kept for the next transfer, and the bytes it took first.
type Leaving = (ChunkSum, Option<DataConn>, RangeSet);

/// How a connection's part in the transfer ends.
enum Exit {
    /// Send EOD (with EOF, the count of EODs, if this is the last one).
    Eod(Leave),
    /// The connection broke and the transfer goes on without it.
    Lost,
}

impl State<'_> {
    fn lock(&self) -> MutexGuard<'_, Roster> {
        self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finished(&self) -> bool {
        self.lock().finished()
    }

    /// Counts a connection in, unless the EOF block was already decided on (a late
    /// connection is closed unused: its receiver expects nothing on it).
    fn admit(&self, sock: &TcpStream) -> Option<Arc<Link>> {
        let mut end = self.lock();
        if !end.admit() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
            return None;
        }
        match self.transfer.join(sock) {
            Ok(link) => Some(link),
            Err(_) => {
                // Counted in but cannot be tracked: it leaves at once, without EOD.
                let _ = end.lose();
                None
            }
        }
    }

    /// The next block to send on a connection moving `rate`, and whether it goes out for the
    /// first time: one a broken connection left first, else the next bytes, as many as
    /// [`block_len`] says.
    fn next_block(&self, rate: Option<f64>, sizing: Sizing) -> Option<(u64, u64, bool)> {
        if self.redo_waiting.load(Ordering::Acquire) {
            let mut redo = self.redo.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((offset, len)) = redo.pop() {
                self.redo_waiting.store(!redo.is_empty(), Ordering::Release);
                return Some((offset, len, false));
            }
        }
        let (left, open) = (self.blocks.left(), self.transfer.open());
        let plain = |most| block_len(most, left, open, rate, BLOCK_TIME);
        let want = match sizing {
            Sizing::Plain => plain(self.options.block),
            Sizing::Probing => plain(self.options.block.min(PROBE as u64)),
            // Never smaller than a plain block, so that a connection whose kernel queue ran
            // dry grows its blocks again.
            Sizing::Packed { most } => {
                block_len(most, left, open, rate, PACKED_BLOCK_TIME).max(plain(self.options.block))
            }
        };
        let (offset, len) = self.blocks.take(want)?;
        Some((offset, len, true))
    }

    /// A connection that found nothing to send: leaves now (fixed sets), or waits in case a
    /// broken connection's blocks need sending again, and leaves once every connection is
    /// idle. Returns None if blocks came back to send.
    fn idle(&self) -> Option<Exit> {
        let mut end = self.lock();
        if !self.transfer.elastic() {
            return Some(Exit::Eod(end.leave()));
        }
        end.go_idle();
        loop {
            if self.redo_waiting.load(Ordering::Acquire) {
                end.wake();
                return None;
            }
            if end.all_idle() || self.transfer.abort().is_aborted() {
                let leave = end.leave_idle();
                self.wake.notify_all();
                return Some(Exit::Eod(leave));
            }
            end = self
                .wake
                .wait_timeout(end, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The policy retired this connection, or the receiver half-closed it: it leaves after
    /// the block it sent, unless it is the only one left.
    fn retire(&self) -> Option<Exit> {
        let leave = self.lock().retire()?;
        self.wake.notify_all();
        Some(Exit::Eod(leave))
    }

    /// A broken connection: its blocks go back to be sent again on the others, except those the
    /// receiver confirmed it stored.
    fn lose(&self, link: &Link, blocks: Vec<(u64, u64)>) -> Result<(), EngineError> {
        let blocks = self.transfer.unconfirmed(blocks);
        let mut end = self.lock();
        let all_lost = end.lose().is_err();
        let resend: u64 = blocks.iter().map(|b| b.1).sum();
        if !blocks.is_empty() {
            let mut redo = self.redo.lock().unwrap_or_else(|p| p.into_inner());
            redo.extend(blocks);
            self.redo_waiting.store(true, Ordering::Release);
        }
        self.transfer.end(link, LinkState::Lost);
        self.wake.notify_all();
        if !self.transfer.abort().is_aborted() {
            tracing::warn!(
                conn = link.id,
                resend,
                "data connection lost; its blocks go out again on the others"
            );
        }
        if all_lost {
            return Err(EngineError::AllLost);
        }
        Ok(())
    }

    fn run(&self, link: &Link, mut sock: DataConn, reused: bool) -> Result<Leaving, EngineError> {
        let conn = link.id;
        let net = |source| EngineError::Net { conn, source };
        let elastic = self.transfer.elastic();
        let mut squeeze = Squeeze::new(
            FileSender::for_socket(sock.tcp()),
            self.transfer.compression().sending(),
            self.source.size(),
        );
        let mut sum = ChunkSum::new();
        let mut taken = RangeSet::new();
        let mut unsent = UnsentCap::default();
        // Elastic: every block this connection carried, to send again if it breaks.
        let mut carried: Vec<(u64, u64)> = Vec::new();
        let exit = loop {
            if elastic
                && (link.retiring() || peer_half_closed(sock.tcp()))
                && let Some(exit) = self.retire()
            {
                break exit;
            }
            let rate = self.transfer.rate(link);
            let sizing = squeeze.sizing(sock.tcp());
            // The socket's queue is in bytes on the wire; the rate, in bytes of the file.
            let wire_rate = rate.map(|r| r * squeeze.governor.wire_share());
            unsent.follow(sock.tcp(), wire_rate, sizing);
            let Some((offset, len, fresh)) = self.next_block(rate, sizing) else {
                match self.idle() {
                    Some(exit) => break exit,
                    None => continue,
                }
            };
            // Each chunk enters the checksum exactly once (it is an XOR): when its block is
            // first taken, never when it is sent again.
            let hash = self.options.hash && fresh;
            if fresh {
                taken.insert(offset, offset + len);
            }
            // The last block on the only connection: its EOD follows at once, in the same
            // segment (a small file moved ahead is then one segment, one wake-up for the peer).
            let eod_next = self.blocks.left() == 0
                && self.transfer.open() == 1
                && !self.redo_waiting.load(Ordering::Acquire);
            match self.send_block(
                link,
                &mut sock,
                &mut squeeze,
                hash.then_some(&mut sum),
                (offset, len),
                eod_next,
            ) {
                Ok(()) => {
                    if elastic {
                        carried.push((offset, len));
                        // What the receiver confirmed need not be kept for a resend: this
                        // keeps the list short on long uploads.
                        if carried.len().is_multiple_of(256) {
                            carried = self.transfer.unconfirmed(carried);
                        }
                    }
                }
                Err(EngineError::Net { source, .. }) if elastic => {
                    tracing::debug!(conn, "data connection broke: {source}");
                    carried.push((offset, len));
                    break Exit::Lost;
                }
                Err(e) => return Err(e),
            }
        };
        let eof = match exit {
            Exit::Lost => {
                self.lose(link, carried)?;
                return Ok((sum, None, taken));
            }
            Exit::Eod(Leave { eof }) => eof,
        };
        // EOF rides on the last connection to finish, together with its EOD, never after it.
        let end = match eof {
            Some(n) => Header::eof(n),
            None => Header::eod(),
        };
        // Nagle would hold the small EOD behind the ACK of the data before it: the receiver,
        // which waits for every EOD, would see the transfer end a round trip late. (TLS
        // connections have no Nagle at all; a kept connection stays so, which costs a later
        // transfer at most a short segment at a block's end.)
        if let DataConn::Clear(tcp) = &sock {
            let _ = tcp.set_nodelay(true);
        }
        // A retired connection closes; the others stay open for the next transfer if asked.
        let keep = self.options.keep && !link.retiring();
        // A TLS connection that was sent to before it proved its binding reads the proof
        // now: a kept one must be in step for the next transfer, and one closed with it
        // unread would be reset, losing the tail of the data in flight.
        let wrote = if keep {
            sock.write_all(&end.keeping_connection().encode())
                .and_then(|()| sock.settle())
        } else {
            sock.write_all(&end.encode())
                .and_then(|()| sock.settle())
                .and_then(|()| sock.tcp().shutdown(std::net::Shutdown::Write))
        };
        if let Err(e) = wrote {
            // A cached connection the receiver dropped while idle carried nothing: no loss.
            if reused && link.bytes() == 0 {
                self.transfer.end(link, LinkState::Unused);
                return Ok((sum, None, taken));
            }
            return Err(net(e));
        }
        self.transfer.end(link, LinkState::Finished);
        Ok((sum, keep.then_some(sock), taken))
    }

    /// Sends one block, compressed or as it is as `squeeze` chooses, and tells it what that
    /// cost. When `sum` is given the block is hashed into it whole, even if the connection
    /// breaks halfway (the block is then sent again, unhashed, elsewhere). `more`: the caller
    /// writes more at once.
    fn send_block(
        &self,
        link: &Link,
        sock: &mut DataConn,
        squeeze: &mut Squeeze,
        sum: Option<&mut ChunkSum>,
        (offset, len): (u64, u64),
        more: bool,
    ) -> Result<(), EngineError> {
        match squeeze.governor.choose() {
            Choice::Compress(level) => {
                return self.send_packed(link, sock, squeeze, sum, (offset, len), more, level);
            }
            Choice::Probe(level) => self.probe(squeeze, offset, len, level)?,
            Choice::Plain => {}
        }
        self.send_plain(link, sock, &mut squeeze.out, sum, (offset, len), more)?;
        squeeze.governor.sent(Cost::Plain);
        self.transfer.compression().plain(len);
        Ok(())
    }

    /// Compresses a sample from the start of the block to learn what compressing would cost
    /// and save; the block itself then goes plain.
    fn probe(
        &self,
        squeeze: &mut Squeeze,
        offset: u64,
        len: u64,
        level: i32,
    ) -> Result<(), EngineError> {
        let n = (len as usize).min(PROBE);
        let sample = read_block(self.source, &mut squeeze.raw, offset, n)?;
        let started = Instant::now();
        let wire = squeeze.packer.sample(sample, level);
        squeeze.governor.sent(Cost::Probed {
            level,
            raw: n as u64,
            wire: wire as u64,
            compress: started.elapsed().as_secs_f64(),
        });
        Ok(())
    }

    /// Sends one block compressed at `level`, or plain from memory when it does not shrink.
    #[allow(clippy::too_many_arguments)]
    fn send_packed(
        &self,
        link: &Link,
        sock: &mut DataConn,
        squeeze: &mut Squeeze,
        sum: Option<&mut ChunkSum>,
        (offset, len): (u64, u64),
        more: bool,
        level: i32,
    ) -> Result<(), EngineError> {
        let net = |source| EngineError::Net {
            conn: link.id,
            source,
        };
        let Squeeze {
            governor,
            packer,
            raw,
            ..
        } = squeeze;
        let raw = read_block(self.source, raw, offset, len as usize)?;
        if let Some(sum) = sum {
            let ends_file = offset + len == self.source.size();
            // Blocks are cut at multiples of the chunk, so this cannot fail.
            let _ = sum.add(offset, raw, ends_file);
        }
        let started = Instant::now();
        let packed = packer.pack(raw, level);
        let compress = started.elapsed().as_secs_f64();
        let (header, payload) = match packed {
            Some(p) => (braid_proto::compress::header(offset, p.len() as u64), p),
            None => (Header::data(offset, len), raw),
        };
        let wrote = match &mut *sock {
            DataConn::Clear(tcp) => send_more(tcp, &header.encode()).and_then(|()| {
                if more {
                    send_more(tcp, payload)
                } else {
                    (&*tcp).write_all(payload)
                }
            }),
            tls => tls
                .write_all(&header.encode())
                .and_then(|()| tls.write_all(payload)),
        };
        wrote.map_err(net)?;
        let wire = payload.len() as u64;
        // The time the write waited is read only when the line is logged.
        tracing::debug!(
            conn = link.id,
            offset,
            len,
            wire,
            level,
            compress,
            waited = started.elapsed().as_secs_f64() - compress,
            "compressed block"
        );
        governor.sent(Cost::Compressed {
            level,
            raw: len,
            wire,
            compress,
        });
        match packed {
            Some(_) => self.transfer.compression().packed(len, wire, level),
            None => self.transfer.compression().plain(len),
        }
        self.progress.fetch_add(len, Ordering::Relaxed);
        link.add_bytes(len);
        Ok(())
    }

    /// Sends one block as it is.
    fn send_plain(
        &self,
        link: &Link,
        sock: &mut DataConn,
        out: &mut FileSender,
        mut sum: Option<&mut ChunkSum>,
        (offset, len): (u64, u64),
        more: bool,
    ) -> Result<(), EngineError> {
        let conn = link.id;
        let net = |source| EngineError::Net { conn, source };
        let header = Header::data(offset, len).encode();
        let header = match &mut *sock {
            DataConn::Clear(tcp) => send_more(tcp, &header),
            tls => tls.write_all(&header),
        };
        match (self.source, &*sock) {
            // In clear, file data goes without passing through here; TLS must encrypt it.
            (Source::File { file, .. }, DataConn::Clear(tcp)) if sum.is_none() => {
                header.map_err(net)?;
                let reached = out
                    .send(tcp, file, offset, offset + len, more, |_| {})
                    .map_err(net)?;
                if reached < offset + len {
                    return Err(EngineError::Local(std::io::Error::other(
                        "the file shrank while it was being sent",
                    )));
                }
                self.progress.fetch_add(len, Ordering::Relaxed);
                link.add_bytes(len);
                Ok(())
            }
            _ => {
                let mut broken = header.err();
                let mut at = offset;
                let end = offset + len;
                while at < end && (broken.is_none() || sum.is_some()) {
                    let n = (end - at).min(PIECE as u64) as usize;
                    // Memory goes as it is: a buffer of a whole piece, zeroed for each small
                    // file sent from memory, was 11 % of a server's CPU.
                    let piece: &[u8] = match self.source {
                        Source::File { file, .. } => {
                            let piece = &mut out.buffer()[..n];
                            file.read_exact_at(piece, at).map_err(EngineError::Local)?;
                            piece
                        }
                        Source::Bundle(files) => {
                            let piece = &mut out.buffer()[..n];
                            files.read_exact_at(piece, at).map_err(EngineError::Local)?;
                            piece
                        }
                        Source::Memory(m) => &m[at as usize..][..n],
                    };
                    if let Some(sum) = sum.as_deref_mut() {
                        let ends_file = at + n as u64 == self.source.size();
                        // Blocks are cut at multiples of the chunk, so this cannot fail; if
                        // it did the receiver's check would say so.
                        let _ = sum.add(at, piece, ends_file);
                    }
                    if broken.is_none() {
                        let wrote = match &mut *sock {
                            DataConn::Clear(tcp) if more && at + n as u64 == end => {
                                send_more(tcp, piece)
                            }
                            conn => conn.write_all(piece),
                        };
                        match wrote {
                            Ok(()) => {
                                self.progress.fetch_add(n as u64, Ordering::Relaxed);
                                link.add_bytes(n as u64);
                            }
                            Err(e) => broken = Some(e),
                        }
                    }
                    at += n as u64;
                }
                broken.map_or(Ok(()), |e| Err(net(e)))
            }
        }
    }
}

/// See [`Squeeze::new`]: small files moved ahead in a row go plain in `auto`.
const LEAST_AUTO: u64 = 1 << 20;

/// How a connection's thread sends: `sendfile` or copies for plain blocks, and for
/// compression its choice, its zstd context and a buffer for a block's bytes (grown to the
/// largest block compressed, never past `MAX_RAW`).
struct Squeeze {
    out: FileSender,
    governor: Governor,
    packer: Packer,
    raw: Vec<u8>,
    /// Too little data to measure the path with (a listing `on` compresses): its blocks go
    /// compressed at the first level at once, never waiting a round trip for the path.
    small: bool,
}

impl Squeeze {
    /// `auto` leaves a file smaller than [`LEAST_AUTO`] plain: its few blocks could not tell
    /// whether compressing pays before it is gone (`on` compresses it).
    fn new(out: FileSender, policy: Policy, size: u64) -> Squeeze {
        let policy = match policy {
            Policy::Auto if size < LEAST_AUTO => Policy::Off,
            p => p,
        };
        Squeeze {
            out,
            governor: Governor::new(policy),
            packer: Packer::default(),
            raw: Vec::new(),
            small: size < LEAST_AUTO,
        }
    }

    /// How large the next block may be (see [`Sizing`]), from what the kernel says of the
    /// path before a block about to be compressed or probed: one getsockopt for it, none for
    /// the plain blocks between probes. What it says may send the block plain after all.
    fn sizing(&mut self, sock: &TcpStream) -> Sizing {
        if self.governor.choose() == Choice::Plain {
            return Sizing::Plain;
        }
        if self.small {
            return Sizing::Packed { most: 0 };
        }
        // The memory for a level, like the path, matters only to a block about to be
        // compressed or probed.
        self.governor.fits(self.packer.highest_fitting(&LEVELS));
        let mut info = self.measure(sock);
        if !self.governor.measured() && info.as_ref().is_some_and(|i| i.notsent_bytes > 0) {
            // Before the first acknowledgement, a block compressed now would be made at the
            // level chosen without the path: wait for the queue to go out (the cap is 1 byte
            // then, see [`UnsentCap::follow`]), which is when the path has been measured.
            wait_writable(sock, Duration::from_secs(2));
            info = self.measure(sock);
        }
        match self.governor.choose() {
            Choice::Plain => Sizing::Plain,
            _ if !self.governor.measured() => Sizing::Probing,
            Choice::Compress(_) if self.governor.settled() => {
                let (queued, pace) = info.map_or((0, 0.0), |i| {
                    (u64::from(i.notsent_bytes), i.pacing_rate as f64)
                });
                Sizing::Packed {
                    most: self
                        .governor
                        .compressible_while(queued, pace)
                        .unwrap_or(0)
                        .min(braid_proto::compress::MAX_RAW),
                }
            }
            _ => Sizing::Plain,
        }
    }

    /// The kernel's view of the connection, its delivery rate handed to the governor.
    fn measure(&mut self, sock: &TcpStream) -> Option<braid_sockopt::TcpInfo> {
        let info = braid_sockopt::tcp_info(sock);
        self.governor
            .path(info.as_ref().map_or(0, |i| i.delivery_rate) as f64);
        info
    }
}

/// What bounds a connection's next block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sizing {
    /// The transfer's block size and [`BLOCK_TIME`]; also while the level is still moving,
    /// so that each level is judged soon.
    Plain,
    /// Before the path is measured, a [`PROBE`]: enough to learn how the data shrinks,
    /// little to compress where the path turns out to be faster than zstd, little to send
    /// plain if it does not shrink, and little to wait for on a slow path.
    Probing,
    /// Compressing at a settled level: up to [`PACKED_BLOCK_TIME`], and no more than zstd
    /// compresses while the kernel sends what it holds (`most`), so that the path never
    /// waits for the compressor: blocks grow by the compressor's lead over the path each
    /// time (1.5 times at level 16 on a T1).
    Packed { most: u64 },
}

/// `len` bytes of the source at `offset`: read into `buf`, or where they are in memory.
fn read_block<'a>(
    source: Source<'a>,
    buf: &'a mut Vec<u8>,
    offset: u64,
    len: usize,
) -> Result<&'a [u8], EngineError> {
    match source {
        Source::File { file, .. } => {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            file.read_exact_at(&mut buf[..len], offset)
                .map_err(EngineError::Local)?;
            Ok(&buf[..len])
        }
        Source::Bundle(files) => {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            files
                .read_exact_at(&mut buf[..len], offset)
                .map_err(EngineError::Local)?;
            Ok(&buf[..len])
        }
        Source::Memory(m) => Ok(&m[offset as usize..][..len]),
    }
}

/// Caps the bytes a connection's socket holds unsent (`TCP_NOTSENT_LOWAT`) at what it moves
/// in [`BLOCK_TIME`]: on a slow path the kernel would otherwise queue megabytes, so that a
/// retired connection, a new congestion control or a new pace would take effect only once
/// they drained (seconds to minutes at T1 rates). Bytes in flight do not count, so the pipe
/// stays full; on fast paths the cap is above what the socket buffer holds anyway. While
/// large compressed blocks go out the cap holds at least a whole block: the connection's thread
/// compresses the next block while the kernel sends the last, and compressing takes less
/// than sending (the level is chosen so), so the path never waits for zstd.
#[derive(Default)]
struct UnsentCap {
    now: Option<u32>,
    /// The kernel refused it: the connection works as before, without asking again.
    refused: bool,
}

impl UnsentCap {
    const LEAST: f64 = 16.0 * 1024.0;
    const MOST: f64 = 16.0 * 1024.0 * 1024.0;

    /// Follows the connection's rate (bytes/s on the wire), in steps of at least a factor of
    /// two, with room for the blocks `sizing` makes. Until the path is measured a connection
    /// that compresses queues nothing unsent beside what its window lets out: what it queues
    /// before the first acknowledgement is compressed at the level chosen without the path
    /// (on a T1 its sockets took 1.5 MB of level-1 blocks at once, 2.6 % more on the wire
    /// than level 16 would have sent).
    fn follow(&mut self, sock: &TcpStream, rate: Option<f64>, sizing: Sizing) {
        if self.refused {
            return;
        }
        // Two blocks' time, so that the cap, which moves only in steps of two, holds one.
        let want = match (sizing, rate) {
            (Sizing::Probing, _) => 1,
            // Probing is over before the rate is known (a fast path, within its first 100
            // ms): no cap until it is, rather than a byte, which makes each write wait for
            // the queue to empty.
            (_, None) if self.now == Some(1) => u32::MAX,
            (_, None) => return,
            (Sizing::Packed { .. }, Some(rate)) => Self::bytes(rate, 2.0 * PACKED_BLOCK_TIME),
            (Sizing::Plain, Some(rate)) => Self::bytes(rate, BLOCK_TIME),
        };
        if self
            .now
            .is_some_and(|now| want > now / 2 && want < now.saturating_mul(2))
        {
            return;
        }
        match socket2::SockRef::from(sock).set_tcp_notsent_lowat(want) {
            Ok(()) => self.now = Some(want),
            Err(_) => self.refused = true,
        }
    }

    fn bytes(rate: f64, time: f64) -> u32 {
        (rate * time).clamp(Self::LEAST, Self::MOST) as u32
    }
}

/// Waits until the socket takes more (its unsent bytes under `TCP_NOTSENT_LOWAT`), at most
/// `most`: a blocking write fills the kernel's last buffer whatever the cap says.
fn wait_writable(sock: &TcpStream, most: Duration) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(sock, PollFlags::OUT)];
    let most = Timespec {
        tv_sec: most.as_secs() as i64,
        tv_nsec: i64::from(most.subsec_nanos()),
    };
    let _ = rustix::event::poll(&mut fds, Some(&most));
}

/// Whether the receiver half-closed this connection: a braid receiver's way of asking the
/// sender to stop using it. One poll per block, which costs nothing next to the block.
fn peer_half_closed(sock: &TcpStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(sock, PollFlags::RDHUP)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().contains(PollFlags::RDHUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transfer that keeps its clear connections ends each with an EOD the receiver gets
    /// at once: Nagle is off on them by then, so it does not wait behind the ACK of the data
    /// before it (a round trip at the end of every transfer). The receiver holds the bytes in
    /// memory, as a listing's.
    #[test]
    fn kept_clear_connections_end_with_an_eod_that_leaves_at_once() {
        use crate::engine::receive::{Progress, Shared, receive};
        use crate::engine::sink::Sink;
        use crate::engine::transfer::Joins;
        use std::net::{TcpListener, TcpStream};
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = [
            TcpStream::connect(addr).unwrap(),
            TcpStream::connect(addr).unwrap(),
        ];
        let accepted = [listener.accept().unwrap().0, listener.accept().unwrap().0];
        assert!(accepted.iter().all(|s| !s.nodelay().unwrap()));
        let stall = Duration::from_secs(30);
        let sink = Sink::Memory(Default::default());
        let shared = Shared::new(Progress::holding(RangeSet::new()), Default::default());
        let sent = std::thread::scope(|s| {
            let sending = s.spawn(|| {
                let todo: RangeSet = [(0, data.len() as u64)].into_iter().collect();
                let options = Options {
                    block: 64 << 10,
                    hash: false,
                    keep: true,
                };
                let joins = Joins::fixed(accepted.into(), stall);
                let progress = AtomicU64::new(0);
                send(
                    &Transfer::new(false),
                    Source::Memory(&data),
                    &todo,
                    joins,
                    options,
                    &progress,
                )
            });
            let joins = Joins::fixed(conns.into(), stall);
            let got = receive(&Transfer::new(false), joins, &sink, Some(1 << 20), &shared);
            assert!(got.is_ok_and(|k| k.socks.len() == 2));
            sending.join().unwrap().unwrap()
        });
        assert_eq!(sent.kept.len(), 2);
        assert!(sent.kept.iter().all(|c| c.tcp().nodelay().unwrap()));
        assert_eq!(shared.snapshot().ranges.len(), data.len() as u64);
        assert_eq!(sink.into_memory(), data);
    }

    #[test]
    fn blocks_cover_ranges_on_aligned_boundaries() {
        let todo: RangeSet = [(0, 10), (15, 40), (41, 41), (50, 51)]
            .into_iter()
            .collect();
        let b = Blocks::new(&todo, 8);
        assert_eq!(b.left(), 10 + 25 + 1);
        let mut all = Vec::new();
        // Sizes asked for vary: ends stay on multiples of 8, or where a range ends.
        for want in [8, 3, 20, 8, 1, 100, 8, 8].into_iter().cycle() {
            let Some(block) = b.take(want) else { break };
            all.push(block);
        }
        assert_eq!(all, vec![(0, 8), (8, 2), (15, 17), (32, 8), (50, 1)]);
        assert_eq!(b.left(), 0);
        assert_eq!(b.take(8), None);
        assert_eq!(Blocks::new(&RangeSet::new(), 8).take(8), None);
    }

    #[test]
    fn blocks_taken_concurrently_cover_each_byte_once() {
        let todo: RangeSet = [(0, 1 << 20), (3 << 20, 5 << 20)].into_iter().collect();
        let b = Blocks::new(&todo, 4096);
        let taken = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (b, taken) = (&b, &taken);
                s.spawn(move || {
                    while let Some(block) = b.take(4096 * (t + 1)) {
                        taken.lock().unwrap().push(block);
                    }
                });
            }
        });
        let mut taken = taken.into_inner().unwrap();
        taken.sort();
        let got: RangeSet = taken.iter().map(|&(o, n)| (o, o + n)).collect();
        assert_eq!(got, todo);
        assert_eq!(taken.iter().map(|b| b.1).sum::<u64>(), 3 << 20);
    }

    #[test]
    fn the_unsent_cap_follows_the_rate_in_steps() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let lowat = || socket2::SockRef::from(&sock).tcp_notsent_lowat().unwrap();
        let before = lowat();
        let mut cap = UnsentCap::default();
        let packed = Sizing::Packed { most: 1 << 20 };
        cap.follow(&sock, None, Sizing::Plain);
        assert_eq!(lowat(), before, "no rate yet: left alone");
        cap.follow(&sock, Some(100_000.0), Sizing::Plain);
        assert_eq!(lowat(), 50_000);
        cap.follow(&sock, Some(150_000.0), Sizing::Plain);
        assert_eq!(lowat(), 50_000, "less than twice: unchanged");
        // Large compressed blocks: the kernel holds one while the next is compressed.
        cap.follow(&sock, Some(100_000.0), packed);
        assert_eq!(lowat(), 800_000);
        cap.follow(&sock, Some(1e3), Sizing::Plain);
        assert_eq!(lowat(), 16 << 10);
        cap.follow(&sock, Some(1e12), Sizing::Plain);
        assert_eq!(lowat(), 16 << 20);
        // Compressing before the path is measured, whatever the rate says: nothing queued.
        cap.follow(&sock, Some(1e12), Sizing::Probing);
        assert_eq!(lowat(), 1);
        cap.follow(&sock, Some(1e3), Sizing::Plain);
        assert_eq!(lowat(), 16 << 10);
        // Probing over before the rate is known: no cap, not a byte's.
        cap.follow(&sock, None, Sizing::Probing);
        cap.follow(&sock, None, Sizing::Plain);
        assert_eq!(lowat(), u32::MAX);
    }

    #[test]
    fn blocks_shrink_with_a_slow_connection_and_near_the_end() {
        let max = 1 << 20;
        // A fast path, far from the end: the largest block.
        assert_eq!(block_len(max, 1 << 30, 4, Some(1e9), BLOCK_TIME), max);
        assert_eq!(block_len(max, 1 << 30, 4, None, BLOCK_TIME), max);
        // A T1 shared by 8 connections (23 kB/s each): half a second's worth.
        assert_eq!(block_len(max, 1 << 30, 8, Some(23e3), BLOCK_TIME), 11_500);
        // Compressed blocks at a settled level: four seconds' worth.
        assert_eq!(
            block_len(4 << 20, 1 << 30, 8, Some(23e3), PACKED_BLOCK_TIME),
            92_000
        );
        // 1 MiB left over 4 connections: an eighth of it.
        assert_eq!(block_len(max, 1 << 20, 4, Some(1e9), BLOCK_TIME), 128 << 10);
        assert_eq!(block_len(max, 0, 0, None, BLOCK_TIME), 0);
    }
}
