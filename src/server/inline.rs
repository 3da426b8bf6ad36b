//! The work of a tree's small files that the control task does itself instead of handing it to
//! a blocking thread.
//!
//! Each hand-off wakes a sleeping thread, and then the control task again: for a 4 KiB file
//! that costs more than moving it. With three per file (opening it, moving it, its CKSM) they
//! took over half the server's CPU in a tree of 10,000 such files (futex waits and wake-ups
//! in `perf record`), and with the hand-offs gone the server's CPU for the tree went from
//! about 0.9 s to 0.3 s.
//!
//! Only what cannot wait is done here, so that a slow disk or a slow client still holds up
//! no other session:
//! - opening a file, and answering its CKSM from the checksum cache (metadata, as nginx and
//!   vsftpd do inline), for MODE E transfers on kept connections, that is for a tree's files;
//! - a download whose bytes are in memory (read with `RWF_NOWAIT`, or from a file system in
//!   memory) and fit in the socket's free send buffer;
//! - an upload whose blocks, through its EOD, are all waiting in the socket;
//! - an upload's commit where syncing its data has nothing to wait for (a file system in
//!   memory).
//!
//! Anything else goes to a blocking thread as before: a file that must be read from disk, a
//! socket whose peer is not keeping up, an upload still on its way, TLS.

use super::ChecksumCache;
use super::data::{BlockConns, Job, WholeFile};
use crate::engine::tls::DataConn;
use crate::engine::transfer::Joins;
use crate::fsroot::Root;
use braid_proto::block::{HEADER_LEN, Waiting};
use braid_proto::ranges::RangeSet;
use braid_proto::session::{ChecksumAlg, DataEndpoint, FsOp, FsOutcome, Transfer, TransferKind};
use std::fs::File;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;

/// The largest file moved on the control task: a few of these in a row keep it busy well under
/// a millisecond.
pub const MOST: u64 = 64 << 10;

/// The socket's room must exceed what is written by this much and twice over: the kernel
/// counts each packet's overhead against the send buffer too.
const SLACK: u64 = 16 << 10;

/// Whether the file of `t` is opened on the control task: one of a tree's files, moved in MODE
/// E on the connections the last one left open.
pub fn opens(t: &Transfer) -> bool {
    t.block.is_some()
        && t.endpoint == DataEndpoint::Cached
        && matches!(t.kind, TransferKind::Retr(_) | TransferKind::Stor(_))
}

/// The answer to a CKSM whose checksum is known already (the file was hashed as it was sent):
/// None if it must be computed, on a thread.
pub fn known_checksum(root: &Root, sums: &ChecksumCache, op: &FsOp) -> Option<FsOutcome> {
    let FsOp::Checksum {
        path,
        alg: ChecksumAlg::Xxh3,
        offset: 0,
        length,
    } = op
    else {
        return None;
    };
    let (file, entry) = root.open_read(path).ok()?;
    if length.is_some_and(|l| l != entry.size) {
        return None;
    }
    let sum = sums.known(ChecksumCache::version(&file).ok()?, entry.size)?;
    Some(FsOutcome::Checksum(braid_proto::checksum::hex(sum)))
}

/// Whether the data of `job` moves on the control task, without waiting for disk or peer. A
/// download that does has its bytes read into `job` here.
pub fn moves(job: &mut Job, conns: &BlockConns, have: &RangeSet) -> bool {
    match (job, conns) {
        (
            Job::Retr {
                file,
                whole,
                stripe: None,
                ..
            },
            BlockConns::Send(joins),
        ) if have.is_empty() => {
            let Some(sock) = lone_clear(joins) else {
                return false;
            };
            // Its version holds its size, and is what the checksum taken on the way is filed
            // under.
            let Ok(version) = ChecksumCache::version(file) else {
                return false;
            };
            let size = version.2;
            if size > MOST || !takes(sock, size + 2 * HEADER_LEN as u64) {
                return false;
            }
            *whole = read_now(file, version);
            whole.is_some()
        }
        (Job::Stor { .. }, BlockConns::Receive(joins, ..)) => {
            lone_clear(joins).is_some_and(all_waiting)
        }
        _ => false,
    }
}

/// The one clear connection a transfer runs on, when none can join it.
fn lone_clear(joins: &Joins) -> Option<&TcpStream> {
    match joins.open.as_slice() {
        [DataConn::Clear(sock)]
            if joins.accept.is_none() && joins.incoming.is_none() && joins.tls.is_none() =>
        {
            Some(sock)
        }
        _ => None,
    }
}

/// Whether `bytes` written to `sock` now go without waiting: the send buffer has room for
/// them, and the unsent bytes stay under the socket's `TCP_NOTSENT_LOWAT` (set on slow paths,
/// where a write past it would wait for the peer).
fn takes(sock: &TcpStream, bytes: u64) -> bool {
    let Ok(room) = braid_sockopt::send_room(sock) else {
        return false;
    };
    let Some(info) = braid_sockopt::tcp_info(sock) else {
        return false;
    };
    let lowat = match socket2::SockRef::from(sock).tcp_notsent_lowat() {
        Ok(0) => system_notsent_lowat(),
        Ok(n) => u64::from(n),
        Err(_) => return false,
    };
    room >= 2 * bytes + SLACK && u64::from(info.notsent_bytes) + bytes < lowat
}

/// `net.ipv4.tcp_notsent_lowat`, which holds where a socket sets none (by default no limit).
fn system_notsent_lowat() -> u64 {
    static LOWAT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LOWAT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_notsent_lowat")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(u64::from(u32::MAX))
    })
}

/// The whole of a file at `version` if it can be read without waiting for a disk: its pages
/// are cached (`RWF_NOWAIT`), or it lives in memory (tmpfs does not take `RWF_NOWAIT`).
fn read_now(file: &File, version: super::FileVersion) -> Option<WholeFile> {
    let mut bytes = vec![0u8; usize::try_from(version.2).ok()?];
    let read = rustix::io::preadv2(
        file,
        &mut [std::io::IoSliceMut::new(&mut bytes)],
        0,
        rustix::io::ReadWriteFlags::NOWAIT,
    );
    let whole = match read {
        Ok(n) => n == bytes.len(),
        Err(rustix::io::Errno::OPNOTSUPP) if in_memory(file) => {
            file.read_exact_at(&mut bytes, 0).is_ok()
        }
        Err(_) => false,
    };
    whole.then_some(WholeFile { bytes, version })
}

/// Whether `sock` holds, unread, a whole transfer's blocks through its EOD (peeked, not taken).
fn all_waiting(sock: &TcpStream) -> bool {
    let mut want = HEADER_LEN;
    // A small file comes as one block and its EOD: two looks.
    for _ in 0..4 {
        let mut buf = vec![0u8; want];
        let got = match rustix::net::recv(
            sock,
            &mut buf[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((_, n)) => n,
            Err(_) => return false,
        };
        match braid_proto::block::waiting(&buf[..got]) {
            // Its EOD must also be the transfer's EOF for one connection: otherwise the
            // receiver would wait for others to join.
            Waiting::Whole(n) => return ends_transfer(&buf[n - HEADER_LEN..n]),
            Waiting::Short(n) if got == want && n <= MOST as usize + 2 * HEADER_LEN => want = n,
            _ => return false,
        }
    }
    false
}

/// Whether `raw` is the header that ends a transfer on one connection: EOD, and EOF counting
/// one EOD.
fn ends_transfer(raw: &[u8]) -> bool {
    <&[u8; HEADER_LEN]>::try_from(raw)
        .ok()
        .and_then(|raw| braid_proto::block::Header::decode(raw).ok())
        .is_some_and(|h| h.is_eod() && h.is_eof() && h.offset == 1)
}

/// Whether `file` lives in memory (tmpfs, ramfs): syncing it waits for nothing, and reading it
/// waits for no disk.
pub fn in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|s| matches!(s.f_type as u64, TMPFS_MAGIC | RAMFS_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::block::Header;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn conns(sock: TcpStream) -> Joins {
        Joins::cached(vec![DataConn::Clear(sock)], Duration::from_secs(5))
    }

    #[test]
    fn an_upload_moves_here_only_once_its_blocks_through_eod_are_all_waiting() {
        let (mut client, server) = pair();
        server.set_nonblocking(false).unwrap();
        let joins = conns(server.try_clone().unwrap());
        let mut stream = Header::data(0, 4096).encode().to_vec();
        stream.extend_from_slice(&[5u8; 4096]);
        let end = Header::eof(1).keeping_connection().encode();
        // Nothing yet: the receiver would wait.
        assert_eq!(lone_clear(&joins).map(all_waiting), Some(false));
        client.write_all(&stream).unwrap();
        client.flush().unwrap();
        wait_readable(&server, stream.len());
        assert_eq!(
            lone_clear(&joins).map(all_waiting),
            Some(false),
            "no EOD yet"
        );
        client.write_all(&end).unwrap();
        wait_readable(&server, stream.len() + end.len());
        assert_eq!(lone_clear(&joins).map(all_waiting), Some(true));
        // Peeked, not taken: the receiver still reads it all.
        let mut all = vec![0u8; stream.len() + end.len()];
        std::io::Read::read_exact(&mut &server, &mut all).unwrap();
        assert_eq!(&all[..stream.len()], &stream[..]);
        // An EOF that counts two connections: the receiver would wait for the other one.
        client.write_all(&stream).unwrap();
        client
            .write_all(&Header::eof(2).keeping_connection().encode())
            .unwrap();
        wait_readable(&server, stream.len() + HEADER_LEN);
        assert_eq!(lone_clear(&joins).map(all_waiting), Some(false));
    }

    #[test]
    fn a_download_moves_here_only_while_the_socket_has_room_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [9u8; 4096]).unwrap();
        let (server, _client) = pair();
        let send = || BlockConns::Send(conns(server.try_clone().unwrap()));
        let job = || Job::Retr {
            file: File::open(&path).unwrap(),
            offset: 0,
            ascii: false,
            whole: None,
            stripe: None,
        };
        let mut j = job();
        // Written just now, so its pages are cached (or the directory is in memory).
        assert!(moves(&mut j, &send(), &RangeSet::new()));
        let Job::Retr { whole: Some(w), .. } = j else {
            panic!("the bytes were not read")
        };
        assert_eq!(w.bytes, vec![9u8; 4096]);
        // A resumed download goes by ranges, on a thread.
        let have: RangeSet = [(0, 10)].into_iter().collect();
        assert!(!moves(&mut job(), &send(), &have));
        // The peer reads nothing: once the queue is full, a write would wait.
        server.set_nonblocking(true).unwrap();
        let chunk = [1u8; 65536];
        while (&server).write(&chunk).is_ok() {}
        server.set_nonblocking(false).unwrap();
        assert!(!moves(&mut job(), &send(), &RangeSet::new()));
    }

    #[test]
    fn a_larger_file_goes_to_a_thread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; MOST as usize + 1]).unwrap();
        let (server, _client) = pair();
        let mut j = Job::Retr {
            file: File::open(&path).unwrap(),
            offset: 0,
            ascii: false,
            whole: None,
            stripe: None,
        };
        assert!(!moves(
            &mut j,
            &BlockConns::Send(conns(server)),
            &RangeSet::new()
        ));
    }

    /// Waits until `sock` holds `n` unread bytes (loopback delivers at once, but not within the
    /// write call).
    fn wait_readable(sock: &TcpStream, n: usize) {
        let mut buf = vec![0u8; n];
        for _ in 0..1000 {
            if sock.peek(&mut buf).unwrap() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{n} bytes did not arrive");
    }
}
