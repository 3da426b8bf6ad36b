//! The control connection's bytes: a TCP connection (in clear or TLS), or one end of a socket
//! pair whose other end is a child's standard input and output: ssh running `braid serve
//! --stdio` on the far side. A socket pair rather than two pipes (as rsync does with ssh): it
//! takes read timeouts and non-blocking reads as a TCP connection does. Or, under GSI
//! (`gsiftp://`), a TCP connection whose commands and replies are wrapped one line at a time.

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
    Gsi(Box<Wrapped>),
}

/// A control connection under GSI: each command line goes as `ENC <token>`, each protected
/// reply line (63x) is unwrapped into the plain reply it carries.
pub struct Wrapped {
    sock: TcpStream,
    gsi: super::gsi::Gsi,
    /// Bytes read that do not yet make a whole line.
    raw: Vec<u8>,
    /// Plain reply bytes not yet handed out, from `at`.
    plain: Vec<u8>,
    at: usize,
    /// Command bytes written that do not yet make a whole line.
    out: Vec<u8>,
}

impl Wrapped {
    pub fn new(sock: TcpStream, gsi: super::gsi::Gsi) -> Wrapped {
        Wrapped {
            sock,
            gsi,
            raw: Vec::new(),
            plain: Vec::new(),
            at: 0,
            out: Vec::new(),
        }
    }
}

/// The longest protected reply line taken: a whole reply is held to 1 MiB in clear (the
/// reply parser's bound), which base64 makes 4/3 as long, with TLS's framing besides.
const MAX_WRAPPED_LINE: usize = 2 << 20;

/// Takes the first line (without its LF, and its CR if any) off `buf`.
fn take_line(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let end = buf.iter().position(|&b| b == b'\n')?;
    let mut line: Vec<u8> = buf.drain(..=end).collect();
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Some(line)
}

/// A GSI failure as the I/O error the reply reader reports.
fn gsi_broken(e: super::error::ClientError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

impl Read for Wrapped {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.at < self.plain.len() {
                let n = buf.len().min(self.plain.len() - self.at);
                buf[..n].copy_from_slice(&self.plain[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            self.plain.clear();
            self.at = 0;
            if let Some(line) = take_line(&mut self.raw) {
                self.plain = self.gsi.unwrap(&line).map_err(gsi_broken)?;
                continue;
            }
            if self.raw.len() > MAX_WRAPPED_LINE {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a protected reply line longer than {MAX_WRAPPED_LINE} bytes"),
                ));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.sock.read(&mut chunk)?;
            if n == 0 {
                return Ok(0);
            }
            self.raw.extend_from_slice(&chunk[..n]);
        }
    }
}

impl Write for Wrapped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(buf);
        while let Some(mut line) = take_line(&mut self.out) {
            line.extend_from_slice(b"\r\n");
            let wrapped = self.gsi.wrap(&line).map_err(gsi_broken)?;
            self.sock.write_all(&wrapped)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
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

    /// TLS on the dialogue (after AUTH TLS) with `conn`, checking the server against `host`:
    /// the handshake runs now, from the server's bytes already read (`ahead`); the session's
    /// binding for the data connections.
    pub fn start_tls(
        &mut self,
        conn: rustls::ClientConnection,
        host: &str,
        ahead: &[u8],
    ) -> super::error::Result<crate::engine::tls::Binding> {
        use super::error::ClientError;
        let PipedIo::Clear(sock) = &self.io else {
            return Err(ClientError::Protocol("TLS is already on".into()));
        };
        let sock = sock
            .try_clone()
            .map_err(|e| ClientError::Tls(format!("TLS setup: {e}")))?;
        let s = super::wire::finish_tls(sock, conn, host, ahead)?;
        let binding = crate::engine::tls::Binding::of(&s.conn)
            .map_err(|e| ClientError::Tls(format!("TLS exporter: {e}")))?;
        self.io = PipedIo::Tls(Box::new(s));
        Ok(binding)
    }
}

/// Both directions of a byte stream, whichever kind.
trait Duplex: Read + Write {}
impl<T: Read + Write> Duplex for T {}

impl Channel {
    /// The TCP connection under it, when there is one (for `TCP_INFO`).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Channel::Net(w) => Some(w.tcp()),
            Channel::Gsi(g) => Some(&g.sock),
            Channel::Child(_) => None,
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.socket().set_nonblocking(on)
    }

    pub fn set_read_timeout(&self, limit: Option<Duration>) -> std::io::Result<()> {
        self.socket().set_read_timeout(limit)
    }

    /// The socket under it, whichever kind.
    fn socket(&self) -> socket2::SockRef<'_> {
        match self {
            Channel::Net(w) => socket2::SockRef::from(w.tcp()),
            Channel::Gsi(g) => socket2::SockRef::from(&g.sock),
            Channel::Child(p) => socket2::SockRef::from(p.sock()),
        }
    }

    /// The bytes, in clear or through TLS.
    fn duplex(&mut self) -> &mut dyn Duplex {
        match self {
            Channel::Net(w) => w,
            Channel::Gsi(g) => g.as_mut(),
            Channel::Child(p) => match &mut p.io {
                PipedIo::Clear(s) => s,
                PipedIo::Tls(s) => s.as_mut(),
            },
        }
    }
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.duplex().read(buf)
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.duplex().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.duplex().flush()
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

/// What a child writes to its standard error: passed on to ours as it comes (ssh's warnings,
/// the far side's errors), and its last words kept for an error message that explains them.
#[derive(Clone, Default)]
pub struct Said(std::sync::Arc<(std::sync::Mutex<Words>, std::sync::Condvar)>);

#[derive(Default)]
struct Words {
    tail: Vec<u8>,
    ended: bool,
}

/// The most of a child's last words kept.
const WORDS_KEPT: usize = 4096;

impl Said {
    /// Passes `from` on to this process's standard error until it ends, keeping its tail.
    pub fn tee(&self, from: impl Read + Send + 'static) {
        self.read(from, true);
    }

    /// Keeps the tail of `from` without passing it on: words that matter only if something
    /// fails, and then go into the error.
    pub fn keep(&self, from: impl Read + Send + 'static) {
        self.read(from, false);
    }

    fn read(&self, mut from: impl Read + Send + 'static, pass_on: bool) {
        let said = self.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if pass_on {
                    let _ = std::io::stderr().write_all(&buf[..n]);
                }
                let mut words = said.words();
                words.tail.extend_from_slice(&buf[..n]);
                let over = words.tail.len().saturating_sub(WORDS_KEPT);
                words.tail.drain(..over);
            }
            said.words().ended = true;
            said.0.1.notify_all();
        });
    }

    fn words(&self) -> std::sync::MutexGuard<'_, Words> {
        self.0.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last words, once the child has closed its standard error or `limit` has passed
    /// (a process it left behind may hold it open).
    pub fn last(&self, limit: Duration) -> String {
        let words = self.words();
        let (words, _) = self
            .0
            .1
            .wait_timeout_while(words, limit, |w| !w.ended)
            .unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&words.tail).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that sends an endless line under GSI gets an error, not all of this side's
    /// memory.
    #[test]
    fn an_endless_protected_reply_line_is_an_error() {
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let gsi =
            super::super::gsi::Gsi::new(&std::sync::Arc::new(config), "localhost", None).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let sender = std::thread::spawn(move || {
            let chunk = vec![b'A'; 64 * 1024];
            for _ in 0..64 {
                if server.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let mut wrapped = Wrapped::new(sock, gsi);
        let mut buf = [0u8; 100];
        let e = wrapped.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        drop(wrapped);
        sender.join().unwrap();
    }

    #[test]
    fn a_childs_last_words_are_kept_once_it_ends_and_only_the_last_of_them() {
        let said = Said::default();
        let mut long = vec![b'x'; 10_000];
        long.extend_from_slice(b"error: unexpected argument '--stdio' found\n");
        said.tee(std::io::Cursor::new(long));
        let words = said.last(Duration::from_secs(10));
        assert!(words.ends_with("'--stdio' found\n"), "{words}");
        assert_eq!(words.len(), WORDS_KEPT);
    }
}
