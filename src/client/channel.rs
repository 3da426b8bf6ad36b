//! The control connection's bytes: a TCP connection (in clear or TLS), or one end of a socket
//! pair whose other end is a child's standard input and output: ssh running `braid serve
//! --stdio` on the far side. A socket pair rather than two pipes (as rsync does with ssh): it
//! takes read timeouts and non-blocking reads as a TCP connection does.

use super::wire::Wire;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::{Duration, Instant};

/// How long a finished child gets to exit on its own before it is killed.
const CHILD_GRACE: Duration = Duration::from_secs(5);

pub enum Channel {
    Net(Wire),
    Child(Piped),
}

/// A child's standard input and output, and the child.
pub struct Piped {
    io: PipedIo,
    child: Child,
}

/// The dialogue with the child: in clear inside ssh's channel, or TLS inside it (which the
/// data connections' TLS is bound to).
enum PipedIo {
    Clear(UnixStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, UnixStream>>),
}

impl Piped {
    pub fn new(sock: UnixStream, child: Child) -> Piped {
        Piped {
            io: PipedIo::Clear(sock),
            child,
        }
    }

    fn sock(&self) -> &UnixStream {
        match &self.io {
            PipedIo::Clear(s) => s,
            PipedIo::Tls(s) => &s.sock,
        }
    }

    /// TLS on the dialogue (after AUTH TLS): the handshake runs now; the session's binding
    /// for the data connections.
    pub fn start_tls(
        &mut self,
        config: &std::sync::Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> std::io::Result<crate::engine::tls::Binding> {
        let PipedIo::Clear(sock) = &self.io else {
            return Err(std::io::Error::other("TLS is already on"));
        };
        let sock = sock.try_clone()?;
        let conn =
            rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        crate::engine::tls::handshake(&mut s.conn, &mut s.sock)?;
        let binding = crate::engine::tls::Binding::of(&s.conn).map_err(std::io::Error::other)?;
        self.io = PipedIo::Tls(Box::new(s));
        Ok(binding)
    }
}

impl Channel {
    /// The TCP connection under it, when there is one (for `TCP_INFO`).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Channel::Net(w) => Some(w.tcp()),
            Channel::Child(_) => None,
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Channel::Net(w) => w.tcp().set_nonblocking(on),
            Channel::Child(p) => p.sock().set_nonblocking(on),
        }
    }

    pub fn set_read_timeout(&self, limit: Option<Duration>) -> std::io::Result<()> {
        match self {
            Channel::Net(w) => w.tcp().set_read_timeout(limit),
            Channel::Child(p) => p.sock().set_read_timeout(limit),
        }
    }
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Channel::Net(w) => w.read(buf),
            Channel::Child(p) => match &mut p.io {
                PipedIo::Clear(s) => s.read(buf),
                PipedIo::Tls(s) => s.read(buf),
            },
        }
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Channel::Net(w) => w.write(buf),
            Channel::Child(p) => match &mut p.io {
                PipedIo::Clear(s) => s.write(buf),
                PipedIo::Tls(s) => s.write(buf),
            },
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Channel::Net(w) => w.flush(),
            Channel::Child(p) => match &mut p.io {
                PipedIo::Clear(s) => s.flush(),
                PipedIo::Tls(s) => s.flush(),
            },
        }
    }
}

impl Drop for Piped {
    /// Closing its input ends the far side's session; the child (ssh) then exits. One that
    /// does not within [`CHILD_GRACE`] is killed, so no process outlives the transfer.
    fn drop(&mut self) {
        let _ = self.sock().shutdown(std::net::Shutdown::Both);
        let until = Instant::now() + CHILD_GRACE;
        while Instant::now() < until {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
