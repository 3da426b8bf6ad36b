//! A one-shot session's standard input and output as streams the runtime waits on itself.
//! tokio's own `stdin()` and `stdout()` hand every read and write to a blocking thread: a
//! thread switch per command and per burst of replies, which on a tree of small files cost
//! more than the files (10,000 of 4 KiB over ssh: CPU mostly in waking threads). ssh gives
//! the far side pipes or sockets, which the runtime's poller watches like any connection;
//! anything else (a file, a terminal) falls back to tokio's.

use super::conn::{Reader, Writer};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tokio::net::unix::pipe;

/// Standard input and output, watched by the runtime where they can be.
pub(super) fn halves() -> (Reader, Writer) {
    let rd = reader(io::stdin().as_fd()).unwrap_or_else(|| Box::new(tokio::io::stdin()));
    let wr = writer(io::stdout().as_fd()).unwrap_or_else(|| Box::new(tokio::io::stdout()));
    (rd, wr)
}

/// A copy of `fd` (the standard handle stays), if it is a pipe or a socket.
fn watched(fd: BorrowedFd) -> Option<(OwnedFd, rustix::fs::FileType)> {
    let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(fd).ok()?.st_mode);
    Some((fd.try_clone_to_owned().ok()?, kind))
}

fn socket(fd: OwnedFd) -> Option<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true).ok()?;
    tokio::net::UnixStream::from_std(socket).ok()
}

fn reader(fd: BorrowedFd) -> Option<Reader> {
    match watched(fd)? {
        (fd, rustix::fs::FileType::Fifo) => Some(Box::new(pipe::Receiver::from_owned_fd(fd).ok()?)),
        (fd, rustix::fs::FileType::Socket) => Some(Box::new(socket(fd)?)),
        _ => None,
    }
}

fn writer(fd: BorrowedFd) -> Option<Writer> {
    match watched(fd)? {
        (fd, rustix::fs::FileType::Fifo) => Some(Box::new(pipe::Sender::from_owned_fd(fd).ok()?)),
        (fd, rustix::fs::FileType::Socket) => Some(Box::new(socket(fd)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes written through one end of a socket pair and of a pipe come out of the other,
    /// both watched by the runtime, and the end of the stream is seen as one.
    #[tokio::test]
    async fn sockets_and_pipes_are_watched_and_carry_bytes_and_their_end() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut ours = writer(a.as_fd()).expect("a socket is watched");
        let mut theirs = reader(b.as_fd()).expect("a socket is watched");
        ours.write_all(b"RETR f\r\n").await.unwrap();
        let mut got = [0u8; 8];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"RETR f\r\n");
        drop((ours, a));
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());

        let (rx, tx) = std::io::pipe().unwrap();
        let mut ours = writer(tx.as_fd()).expect("a pipe is watched");
        let mut theirs = reader(rx.as_fd()).expect("a pipe is watched");
        ours.write_all(b"226 done\r\n").await.unwrap();
        drop((ours, tx));
        let mut all = Vec::new();
        theirs.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"226 done\r\n");
    }

    /// A regular file is left to tokio's own handles.
    #[test]
    fn a_regular_file_is_not_watched() {
        let file = tempfile::tempfile().unwrap();
        assert!(reader(file.as_fd()).is_none());
        assert!(writer(file.as_fd()).is_none());
    }
}
