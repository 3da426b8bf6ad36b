//! File data onto a clear socket, by `sendfile` or through a buffer, whichever costs less for
//! where the peer is.
//!
//! `sendfile` spares the sender its copy: the socket carries page-cache pages. Across a network
//! interface that is pure gain. When both ends are on this host, though, the receiver's copy
//! out of the socket then reads those pages straight from memory, and that costs it more than
//! the sender saves: 1 GiB, `braid get -n 4` to /dev/null, client plus server CPU 0.93-1.08 s
//! with `sendfile` against 0.68-0.78 s through a buffer, and 0.48 against 0.38 s of wall
//! time (`-n 1`: 0.85 against 0.43 s). Through a buffer, the bytes the receiver copies were
//! just written into fresh socket memory and are still in the shared cache.

use super::PIECE;
use braid_proto::session::canonical_ip;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::os::unix::fs::FileExt;

/// Sends file ranges on one connection, and lends its buffer to callers that need the bytes.
pub struct FileSender {
    /// Copy through `buf` (the peer is on this host) rather than `sendfile`.
    copy: bool,
    /// Allocated when first needed.
    buf: Vec<u8>,
}

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
        }
    }

    /// A buffer of [`PIECE`] bytes, for callers that read the data themselves.
    pub fn buffer(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0u8; PIECE];
        }
        &mut self.buf
    }

    /// Sends `[offset, end)` of `file` on `sock`. `sent` is told the offset reached after each
    /// write. Returns the offset reached, short of `end` when the file is shorter than that.
    pub fn send(
        &mut self,
        sock: &TcpStream,
        file: &File,
        offset: u64,
        end: u64,
        sent: impl FnMut(u64),
    ) -> std::io::Result<u64> {
        if self.copy {
            copy(sock, file, offset, end, self.buffer(), sent)
        } else {
            sendfile(sock, file, offset, end, sent)
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

fn copy(
    mut sock: &TcpStream,
    file: &File,
    mut offset: u64,
    end: u64,
    buf: &mut [u8],
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
        sock.write_all(&buf[..n])?;
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

    /// Both ways of sending give the same bytes, and a file shorter than the range ends early.
    #[test]
    fn copy_and_sendfile_send_the_same_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(PIECE * 2 + 1234))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for copying in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut peer, _) = listener.accept().unwrap();
            let mut sender = FileSender::for_socket(&sock);
            assert!(sender.copy, "loopback is this host");
            sender.copy = copying;
            let mut reached = Vec::new();
            let end = sender
                .send(&sock, &file, 100, data.len() as u64 + 50, |at| {
                    reached.push(at)
                })
                .unwrap();
            drop(sock);
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            assert_eq!(end, data.len() as u64, "ends at the file's end");
            assert_eq!(got, data[100..], "copying={copying}");
            assert_eq!(reached.last(), Some(&end));
        }
    }
}
