//! File data onto a clear socket by `sendfile`, or, when the peer is on this host, by `write`
//! from a mapping of the file (through a buffer for files of up to [`COPIED`] bytes and where
//! the file cannot be mapped), whichever costs less for where the peer is.
//!
//! `sendfile` spares the sender its copy: the socket carries page-cache pages. Across a network
//! interface that is pure gain. When both ends are on this host, though, the receiver's copy
//! out of the socket then reads those pages straight from memory, and that costs it more than
//! the sender saves: 1 GiB, `braid get -n 4` to /dev/null, client plus server CPU 0.93-1.08 s
//! with `sendfile` against 0.68-0.78 s through a buffer, and 0.48 against 0.38 s of wall
//! time (`-n 1`: 0.85 against 0.43 s). Through socket memory, the bytes the receiver copies
//! were just written there and are still in the shared cache. Writing from a mapping puts them
//! there with one copy instead of a `read` and a `write` (0.41 against 0.50 CPU s/GiB, see
//! `braid_mapsend`).

use super::PIECE;
use braid_mapsend::Window;
use braid_proto::session::canonical_ip;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::os::unix::fs::FileExt;

/// Sends ranges of one file on one connection, and lends its buffer to callers that need the
/// bytes. One file: the mapping it keeps is of the file it was first given.
pub struct FileSender {
    /// Copy (the peer is on this host) rather than `sendfile`.
    copy: bool,
    /// Allocated when first needed.
    buf: Vec<u8>,
    /// The part of the file mapped for copying; Unmappable once mapping failed (a file
    /// system without mmap), which copies through `buf` instead.
    window: Mapped,
    /// Files up to this size are copied through `buf` rather than mapped.
    copied: u64,
}

enum Mapped {
    None,
    Window(Window),
    Unmappable,
}

/// How much of a file one mapping covers: a connection's blocks are spread over the file,
/// so a window serves many of them, for little address space.
const WINDOW: u64 = 64 << 20;

/// Files up to this size are read and written through a buffer, not mapped. Mapping and
/// unmapping each of many files costs more than the copy it saves, the more so on several
/// connections at once: the mappings contend for the process's address-space lock and each
/// unmapping interrupts the other threads. 1,000 files of 1 MiB, `put -r -j 8` on loopback:
/// client CPU 2.1-2.3 s mapped, 1.6 s copied, wall 2.3-2.6 s against 1.9-2.1 s.
const COPIED: u64 = 4 << 20;

impl FileSender {
    /// Chooses for `sock` by its two addresses.
    pub fn for_socket(sock: &TcpStream) -> FileSender {
        let local = match (sock.local_addr(), sock.peer_addr()) {
            (Ok(me), Ok(peer)) => same_host(me.ip(), peer.ip()),
            _ => false,
        };
        FileSender {
            copy: local,
            buf: Vec::new(),
            window: Mapped::None,
            copied: COPIED,
        }
    }

    /// `sendfile` wherever the peer is: for a stream-mode download, whose receiver is another
    /// program than braid (curl, lftp, a browser). 500 curl clients on this host, each a
    /// download and an upload (`bench/server_cost.py`): the server's CPU 2.35-2.37 s with
    /// `sendfile` against 2.84-3.00 s copying, the clients' 12.8 s against 12.2-12.3 s, the
    /// same 15.2 s together, and 25 MiB of peak memory against 97-115 (a copy buffer per
    /// transfer). What a braid receiver gains from a copy (above) is not there to have.
    pub fn kernel() -> FileSender {
        FileSender {
            copy: false,
            buf: Vec::new(),
            window: Mapped::None,
            copied: COPIED,
        }
    }

    /// A buffer of [`PIECE`] bytes, for callers that read the data themselves.
    pub fn buffer(&mut self) -> &mut [u8] {
        if self.buf.len() < PIECE {
            self.buf.resize(PIECE, 0);
        }
        &mut self.buf
    }

    /// Sends `[offset, end)` of `file` on `sock`. `sent` is told the offset reached after each
    /// write. Returns the offset reached, short of `end` when the file is shorter than that.
    /// `more`: the caller writes more at once (an EOD), so a copied range's last write
    /// leaves with it, in one segment (see [`send_more`]).
    pub fn send(
        &mut self,
        sock: &TcpStream,
        file: &File,
        offset: u64,
        end: u64,
        more: bool,
        sent: impl FnMut(u64),
    ) -> std::io::Result<u64> {
        if !self.copy {
            return sendfile(sock, file, offset, end, sent);
        }
        // A mapping reads zeros past the file's end up to the end of its last page: never
        // send beyond the size the file has now.
        let len = file.metadata()?.len();
        let end = end.min(len);
        if len <= self.copied && !matches!(self.window, Mapped::Window(_)) {
            // No bigger than the range: a small file's buffer costs little to zero.
            let want = usize::try_from(end.saturating_sub(offset)).map_or(PIECE, |n| n.min(PIECE));
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            return copy(sock, file, offset, end, &mut self.buf, more, sent);
        }
        self.send_mapped(sock, file, offset, end, sent)
    }

    /// Sends `[offset, end)` from mappings of `file`, or through the buffer if it cannot be
    /// mapped; `end` was within the file when the caller looked.
    fn send_mapped(
        &mut self,
        sock: &TcpStream,
        file: &File,
        mut at: u64,
        mut end: u64,
        mut sent: impl FnMut(u64),
    ) -> std::io::Result<u64> {
        // A fault with nothing sent, twice in a row: the file keeps shrinking under us.
        let mut faulted = false;
        while at < end {
            let Some(window) = self.window_at(file, at) else {
                return copy(sock, file, at, end, self.buffer(), false, sent);
            };
            // One write per piece, so `sent` hears of progress as often as through a buffer.
            let want = usize::try_from(end - at)
                .unwrap_or(usize::MAX)
                .min(4 * PIECE);
            match window.write_to(sock, at, want)? {
                0 => {
                    // The kernel's copy hit a page past the file's end: it shrank since. Go
                    // on to where it ends now (the part of the write before the fault was
                    // dropped).
                    let now = file.metadata()?.len();
                    if now <= at || faulted {
                        return Ok(at);
                    }
                    faulted = true;
                    end = end.min(now);
                }
                n => {
                    faulted = false;
                    at += n as u64;
                    sent(at);
                }
            }
        }
        Ok(at)
    }

    /// The mapped window holding `offset`, mapped now if need be; None if the file cannot be
    /// mapped.
    fn window_at(&mut self, file: &File, offset: u64) -> Option<&Window> {
        let current = matches!(&self.window, Mapped::Window(w) if w.covers(offset));
        if !current && !matches!(self.window, Mapped::Unmappable) {
            // The old window goes first, so a connection holds one at a time.
            self.window = Mapped::None;
            let start = offset / WINDOW * WINDOW;
            self.window = match Window::map(file, start, WINDOW as usize) {
                Ok(w) => Mapped::Window(w),
                Err(e) => {
                    tracing::debug!("cannot map the file ({e}): copying through a buffer");
                    Mapped::Unmappable
                }
            };
        }
        match &self.window {
            Mapped::Window(w) => Some(w),
            _ => None,
        }
    }
}

/// Whether a connection between these addresses stays inside this host: loopback, or a
/// connection to one of this host's own addresses (the kernel routes that through loopback).
fn same_host(me: IpAddr, peer: IpAddr) -> bool {
    let peer = canonical_ip(peer);
    peer.is_loopback() || canonical_ip(me) == peer
}

fn sendfile(
    sock: &TcpStream,
    file: &File,
    mut offset: u64,
    end: u64,
    mut sent: impl FnMut(u64),
) -> std::io::Result<u64> {
    while offset < end {
        let want = usize::try_from(end - offset)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        match rustix::fs::sendfile(sock, file, Some(&mut offset), want) {
            Ok(0) => break,
            Ok(_) => sent(offset),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(offset)
}

/// Writes `bytes` with MSG_MORE: the kernel holds a partial segment for what the caller
/// writes next at once (a block's data after its header, an EOD after the data), so they
/// leave as one segment and the receiver wakes once for them.
pub(super) fn send_more(sock: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(sock, bytes, rustix::net::SendFlags::MORE) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn copy(
    mut sock: &TcpStream,
    file: &File,
    mut offset: u64,
    end: u64,
    buf: &mut [u8],
    more: bool,
    mut sent: impl FnMut(u64),
) -> std::io::Result<u64> {
    while offset < end {
        let want = usize::try_from(end - offset)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match file.read_at(&mut buf[..want], offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if more && offset + n as u64 == end {
            send_more(sock, &buf[..n])?;
        } else {
            sock.write_all(&buf[..n])?;
        }
        offset += n as u64;
        sent(offset);
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn same_host_is_loopback_or_our_own_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(same_host(ip("127.0.0.1"), ip("127.0.0.1")));
        assert!(same_host(ip("::1"), ip("::1")));
        assert!(same_host(ip("::ffff:127.0.0.1"), ip("::ffff:127.0.0.1")));
        assert!(same_host(ip("198.18.0.1"), ip("198.18.0.1")));
        assert!(!same_host(ip("198.18.0.1"), ip("198.18.0.2")));
        assert!(!same_host(ip("2001:db8::1"), ip("2001:db8::2")));
    }

    /// Sends `[from, to)` of `file` with each way of sending (sendfile, mapped, buffered) and
    /// returns, per way, the offset reached and the bytes the peer got.
    fn each_way(file: &File, from: u64, to: u64) -> Vec<(&'static str, u64, Vec<u8>)> {
        let mut out = Vec::new();
        for way in ["sendfile", "mapped", "buffered"] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            let mut sender = FileSender::for_socket(&sock);
            assert!(sender.copy, "loopback is this host");
            match way {
                "sendfile" => sender.copy = false,
                "mapped" => sender.copied = 0,
                "buffered" => sender.window = Mapped::Unmappable,
                _ => {}
            }
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                peer.read_to_end(&mut got).unwrap();
                got
            });
            let mut reached = Vec::new();
            let end = sender
                .send(&sock, file, from, to, false, |at| reached.push(at))
                .unwrap();
            drop(sock);
            assert_eq!(reached.last().copied().unwrap_or(from), end, "{way}");
            assert!(reached.windows(2).all(|w| w[0] < w[1]), "{way}");
            out.push((way, end, reader.join().unwrap()));
        }
        out
    }

    /// Every way gives the same bytes, and a file shorter than the range ends early.
    #[test]
    fn every_way_sends_the_same_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(PIECE * 2 + 1234))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for (way, end, got) in each_way(&file, 100, data.len() as u64 + 50) {
            assert_eq!(end, data.len() as u64, "{way} ends at the file's end");
            assert_eq!(got, data[100..], "{way}");
        }
    }

    /// A range across the boundary of two mapped windows arrives whole (a sparse file, so the
    /// test writes only the bytes around the boundary).
    #[test]
    fn a_range_across_mapped_windows_arrives_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        file.set_len(WINDOW + 8192).unwrap();
        let around: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8 + 1).collect();
        file.write_all_at(&around, WINDOW - 4096).unwrap();
        for (way, end, got) in each_way(&file, WINDOW - 4000, WINDOW + 4000) {
            assert_eq!(end, WINDOW + 4000, "{way}");
            assert_eq!(got, around[96..8096], "{way}");
        }
    }

    /// A file that shrinks after its window was mapped ends the send where it now ends, with
    /// no signal (the kernel's copy fails on the pages past the end).
    #[test]
    fn a_file_that_shrank_under_its_mapping_ends_early() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![5u8; 64 << 10]).unwrap();
        let file = File::options().read(true).write(true).open(&path).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let mut sender = FileSender::for_socket(&sock);
        sender.copied = 0;
        let first = 32 << 10;
        assert_eq!(
            sender.send(&sock, &file, 0, first, false, |_| {}).unwrap(),
            first
        );
        assert!(
            matches!(sender.window, Mapped::Window(_)),
            "sent from a mapping"
        );
        // Shrunk to 40,000 bytes: the send asked for after that stops there, and one that
        // looked before the cut (send_mapped, with its old end) stops there too, by the
        // kernel's fault on the pages past it, without the zeros the last page reads as.
        file.set_len(40_000).unwrap();
        let next = first + 4096;
        assert_eq!(
            sender
                .send(&sock, &file, first, next, false, |_| {})
                .unwrap(),
            next
        );
        let reached = sender.send_mapped(&sock, &file, next, 64 << 10, |_| {});
        assert_eq!(reached.unwrap(), 40_000);
        drop(sock);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got, vec![5u8; 40_000]);
    }
}
