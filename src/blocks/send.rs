//! Sending side of MODE E: N threads, one atomic cursor over the blocks, EOD on every
//! connection and EOF (with the connection count) on the one that finishes last.

use super::{Abort, EngineError, FirstError, PIECE, sendfile_range};
use braid_proto::block::Header;
use braid_proto::checksum::ChunkSum;
use braid_proto::ranges::RangeSet;
use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
    /// needs it); otherwise file data goes by `sendfile` without being copied.
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

/// Sends `todo` from `source` over `conns`.
pub fn send(
    source: Source<'_>,
    todo: &RangeSet,
    conns: Vec<TcpStream>,
    options: Options,
    progress: &AtomicU64,
    abort: &Abort,
) -> Result<Sent, EngineError> {
    let blocks = BlockList::new(todo, options.block);
    let cursor = AtomicU64::new(0);
    let running = AtomicUsize::new(conns.len());
    let total_conns = conns.len() as u64;
    let first_error = FirstError::default();
    for c in &conns {
        abort.register(c);
    }
    let results: Vec<Option<(u64, ChunkSum, TcpStream)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, sock)| {
                let ctx = Ctx {
                    source,
                    blocks: &blocks,
                    cursor: &cursor,
                    running: &running,
                    total_conns,
                    progress,
                    options,
                };
                let first_error = &first_error;
                scope.spawn(move || match ctx.run(i, sock) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        first_error.fail(e, abort);
                        None
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    if abort.is_aborted() || results.iter().any(Option::is_none) {
        return Err(EngineError::Aborted);
    }
    let mut sent = Sent::default();
    let mut sum = ChunkSum::new();
    for (bytes, s, sock) in results.into_iter().flatten() {
        sent.per_conn.push(bytes);
        sum.merge(s);
        if options.keep {
            sent.kept.push(sock);
        }
    }
    sent.sum = options.hash.then_some(sum);
    Ok(sent)
}

struct Ctx<'a> {
    source: Source<'a>,
    blocks: &'a BlockList,
    cursor: &'a AtomicU64,
    running: &'a AtomicUsize,
    total_conns: u64,
    progress: &'a AtomicU64,
    options: Options,
}

impl Ctx<'_> {
    fn run(
        &self,
        conn: usize,
        mut sock: TcpStream,
    ) -> Result<(u64, ChunkSum, TcpStream), EngineError> {
        let net = |source| EngineError::Net { conn, source };
        let mut buf = Vec::new();
        let mut sum = ChunkSum::new();
        let mut bytes = 0u64;
        while let Some((offset, len)) = self.blocks.get(self.cursor.fetch_add(1, Ordering::Relaxed))
        {
            send_more(&sock, &Header::data(offset, len).encode()).map_err(net)?;
            match self.source {
                Source::File { file, .. } if !self.options.hash => {
                    let reached =
                        sendfile_range(&sock, file, offset, offset + len, |_| {}).map_err(net)?;
                    if reached < offset + len {
                        return Err(EngineError::Local(std::io::Error::other(
                            "the file shrank while it was being sent",
                        )));
                    }
                    self.progress.fetch_add(len, Ordering::Relaxed);
                }
                _ => {
                    if buf.is_empty() {
                        buf = vec![0u8; PIECE];
                    }
                    let mut at = offset;
                    let end = offset + len;
                    while at < end {
                        let n = (end - at).min(PIECE as u64) as usize;
                        let piece = &mut buf[..n];
                        match self.source {
                            Source::File { file, .. } => {
                                file.read_exact_at(piece, at).map_err(EngineError::Local)?
                            }
                            Source::Memory(m) => piece.copy_from_slice(&m[at as usize..][..n]),
                        }
                        if self.options.hash {
                            let ends_file = at + n as u64 == self.source.size();
                            // Blocks are cut at multiples of the block size, itself a multiple
                            // of the chunk, so this cannot fail; if it did the receiver's
                            // check would say so.
                            let _ = sum.add(at, piece, ends_file);
                        }
                        sock.write_all(piece).map_err(net)?;
                        at += n as u64;
                        self.progress.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            bytes += len;
        }
        // EOF rides on the last connection to finish, together with its EOD, never after it.
        let last = self.running.fetch_sub(1, Ordering::AcqRel) == 1;
        let end = if last {
            Header::eof(self.total_conns)
        } else {
            Header::eod()
        };
        if self.options.keep {
            sock.write_all(&end.keeping_connection().encode())
                .map_err(net)?;
        } else {
            sock.write_all(&end.encode()).map_err(net)?;
            sock.shutdown(std::net::Shutdown::Write).map_err(net)?;
        }
        Ok((bytes, sum, sock))
    }
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
