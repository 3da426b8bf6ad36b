//! Sending side of MODE E: one thread per data connection, one atomic cursor over the blocks,
//! EOD on every connection and EOF, with the count of EODs, on the one that finishes last.
//! Connections may join while blocks remain; in an elastic transfer they may also be retired
//! or break (their blocks are sent again on the others), so the EOF count is settled only
//! when the last connection leaves.

use super::file_send::FileSender;
use super::roster::{Leave, Roster};
use super::transfer::{Joins, Link, LinkState, Transfer, join_loop};
use super::{EngineError, FirstError, PIECE};
use braid_proto::block::Header;
use braid_proto::checksum::ChunkSum;
use braid_proto::ranges::RangeSet;
use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Where the bytes come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    File { file: &'a File, size: u64 },
    Memory(&'a [u8]),
}

impl Source<'_> {
    fn size(&self) -> u64 {
        match self {
            Source::File { size, .. } => *size,
            Source::Memory(m) => m.len() as u64,
        }
    }
}

/// What each connection carried, the checksum of what was sent when asked for, and the
/// connections themselves when they were kept.
#[derive(Debug, Default)]
pub struct Sent {
    pub per_conn: Vec<u64>,
    pub sum: Option<ChunkSum>,
    pub kept: Vec<TcpStream>,
}

/// How to send.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Block size; blocks start at its multiples.
    pub block: u64,
    /// Read the data through memory and fold it into the checksum (the sender of an upload
    /// needs it); otherwise file data goes by [`FileSender`] (`sendfile` to another host).
    pub hash: bool,
    /// End with EOD but without CLOSE and leave the connections open for the next transfer
    /// (GridFTP data-channel caching); otherwise set CLOSE and shut them down.
    pub keep: bool,
}

/// The blocks to send: `todo` cut at multiples of `block` from offset 0, so that blocks line
/// up with checksum chunks whatever was already sent before a restart.
pub struct BlockList {
    ranges: Vec<(u64, u64)>,
    /// Index of the first block of each range.
    first: Vec<u64>,
    total: u64,
    block: u64,
}

impl BlockList {
    pub fn new(todo: &RangeSet, block: u64) -> BlockList {
        let block = block.max(1);
        let mut ranges = Vec::new();
        let mut first = Vec::new();
        let mut total = 0;
        for (s, e) in todo.iter() {
            ranges.push((s, e));
            first.push(total);
            total += e.div_ceil(block) - s / block;
        }
        BlockList {
            ranges,
            first,
            total,
            block,
        }
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Block `i` as (offset, length).
    pub fn get(&self, i: u64) -> Option<(u64, u64)> {
        if i >= self.total {
            return None;
        }
        let r = self.first.partition_point(|&f| f <= i) - 1;
        let (s, e) = self.ranges[r];
        let k = s / self.block + (i - self.first[r]);
        let start = (k * self.block).max(s);
        let end = ((k + 1) * self.block).min(e);
        Some((start, end - start))
    }
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
    let state = State {
        source,
        blocks: BlockList::new(todo, options.block),
        cursor: AtomicU64::new(0),
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
    let results: Mutex<Vec<(ChunkSum, Option<TcpStream>)>> = Mutex::new(Vec::new());
    let Joins {
        open,
        reused,
        accept,
        incoming,
        stall,
    } = joins;
    std::thread::scope(|scope| {
        let spawn = |sock: TcpStream, link: Arc<Link>| {
            let (state, results, fail) = (&state, &results, &fail);
            scope.spawn(move || match state.run(&link, sock, reused) {
                Ok(r) => results.lock().unwrap_or_else(|p| p.into_inner()).push(r),
                Err(e) => fail(e),
            });
        };
        // Every connection open at the start is counted before any thread can finish, so the
        // EOF count of a fixed set is its size, as GridFTP receivers expect.
        let mut admitted = Vec::new();
        for sock in open {
            match state.admit(&sock) {
                Some(link) => admitted.push((sock, link)),
                None => fail(EngineError::Setup("cannot track a data connection".into())),
            }
        }
        for (sock, link) in admitted {
            spawn(sock, link);
        }
        if accept.is_some() || incoming.is_some() {
            let joined = join_loop(
                accept.as_ref(),
                incoming.as_ref(),
                stall,
                transfer,
                || state.finished(),
                |sock| match state.admit(&sock) {
                    Some(link) => spawn(sock, link),
                    None => drop(sock),
                },
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
    for (s, sock) in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        sum.merge(s);
        if let Some(sock) = sock {
            sent.kept.push(sock);
        }
    }
    sent.sum = options.hash.then_some(sum);
    Ok(sent)
}

/// The sending state all connection threads share.
struct State<'a> {
    source: Source<'a>,
    blocks: BlockList,
    cursor: AtomicU64,
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

/// What a connection thread leaves behind: its share of the checksum, and the socket when it
/// is kept for the next transfer.
type Leaving = (ChunkSum, Option<TcpStream>);

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

    /// The next block to send, and whether it goes out for the first time: one a broken
    /// connection left first, else the next in order.
    fn next_block(&self) -> Option<(u64, u64, bool)> {
        if self.redo_waiting.load(Ordering::Acquire) {
            let mut redo = self.redo.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((offset, len)) = redo.pop() {
                self.redo_waiting.store(!redo.is_empty(), Ordering::Release);
                return Some((offset, len, false));
            }
        }
        let (offset, len) = self
            .blocks
            .get(self.cursor.fetch_add(1, Ordering::Relaxed))?;
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
        tracing::warn!(
            conn = link.id,
            resend,
            "data connection lost; its blocks go out again on the others"
        );
        if all_lost {
            return Err(EngineError::AllLost);
        }
        Ok(())
    }

    fn run(&self, link: &Link, mut sock: TcpStream, reused: bool) -> Result<Leaving, EngineError> {
        let conn = link.id;
        let net = |source| EngineError::Net { conn, source };
        let elastic = self.transfer.elastic();
        let mut out = FileSender::for_socket(&sock);
        let mut sum = ChunkSum::new();
        // Elastic: every block this connection carried, to send again if it breaks.
        let mut carried: Vec<(u64, u64)> = Vec::new();
        let exit = loop {
            if elastic
                && (link.retiring() || peer_half_closed(&sock))
                && let Some(exit) = self.retire()
            {
                break exit;
            }
            let Some((offset, len, fresh)) = self.next_block() else {
                match self.idle() {
                    Some(exit) => break exit,
                    None => continue,
                }
            };
            // Each chunk enters the checksum exactly once (it is an XOR): when its block is
            // first taken, never when it is sent again.
            let hash = self.options.hash && fresh;
            match self.send_block(
                link,
                &mut sock,
                &mut out,
                hash.then_some(&mut sum),
                offset,
                len,
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
                return Ok((sum, None));
            }
            Exit::Eod(Leave { eof }) => eof,
        };
        // EOF rides on the last connection to finish, together with its EOD, never after it.
        let end = match eof {
            Some(n) => Header::eof(n),
            None => Header::eod(),
        };
        // A retired connection closes; the others stay open for the next transfer if asked.
        let keep = self.options.keep && !link.retiring();
        let wrote = if keep {
            sock.write_all(&end.keeping_connection().encode())
        } else {
            sock.write_all(&end.encode())
                .and_then(|()| sock.shutdown(std::net::Shutdown::Write))
        };
        if let Err(e) = wrote {
            // A cached connection the receiver dropped while idle carried nothing: no loss.
            if reused && link.bytes() == 0 {
                self.transfer.end(link, LinkState::Unused);
                return Ok((sum, None));
            }
            return Err(net(e));
        }
        self.transfer.end(link, LinkState::Finished);
        Ok((sum, keep.then_some(sock)))
    }

    /// Sends one block. When `sum` is given the block is hashed into it whole, even if the
    /// connection breaks halfway (the block is then sent again, unhashed, elsewhere).
    fn send_block(
        &self,
        link: &Link,
        sock: &mut TcpStream,
        out: &mut FileSender,
        mut sum: Option<&mut ChunkSum>,
        offset: u64,
        len: u64,
    ) -> Result<(), EngineError> {
        let conn = link.id;
        let net = |source| EngineError::Net { conn, source };
        let header = send_more(sock, &Header::data(offset, len).encode());
        match self.source {
            Source::File { file, .. } if sum.is_none() => {
                header.map_err(net)?;
                let reached = out
                    .send(sock, file, offset, offset + len, |_| {})
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
                let buf = out.buffer();
                let mut at = offset;
                let end = offset + len;
                while at < end && (broken.is_none() || sum.is_some()) {
                    let n = (end - at).min(PIECE as u64) as usize;
                    let piece = &mut buf[..n];
                    match self.source {
                        Source::File { file, .. } => {
                            file.read_exact_at(piece, at).map_err(EngineError::Local)?
                        }
                        Source::Memory(m) => piece.copy_from_slice(&m[at as usize..][..n]),
                    }
                    if let Some(sum) = sum.as_deref_mut() {
                        let ends_file = at + n as u64 == self.source.size();
                        // Blocks are cut at multiples of the block size, itself a multiple
                        // of the chunk, so this cannot fail; if it did the receiver's
                        // check would say so.
                        let _ = sum.add(at, piece, ends_file);
                    }
                    if broken.is_none() {
                        match sock.write_all(piece) {
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

/// Writes a header with MSG_MORE so it leaves in the same segment as the data after it.
fn send_more(sock: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(sock, bytes, rustix::net::SendFlags::MORE) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_list_covers_ranges_on_block_boundaries() {
        let todo: RangeSet = [(0, 10), (15, 40), (41, 41), (50, 51)]
            .into_iter()
            .collect();
        let b = BlockList::new(&todo, 8);
        let all: Vec<_> = (0..b.len()).filter_map(|i| b.get(i)).collect();
        assert_eq!(
            all,
            vec![(0, 8), (8, 2), (15, 1), (16, 8), (24, 8), (32, 8), (50, 1)]
        );
        assert_eq!(b.get(b.len()), None);
        assert!(BlockList::new(&RangeSet::new(), 8).is_empty());
    }
}
